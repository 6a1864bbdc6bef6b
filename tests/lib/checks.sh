# The checks the shell tests share. Source it after making a scratch folder $tmp:
#   check NAME STATUS CMD...   runs CMD, stdout to $tmp/out and stderr to $tmp/err, and
#                              expects exit status STATUS
#   contains NAME FILE REGEX   FILE has a line matching the grep pattern
#   has NAME FILE TEXT         FILE holds TEXT (a fixed string)
#   lacks NAME FILE TEXT       FILE does not hold TEXT
#   same NAME FILE1 FILE2      the files are byte for byte equal
#   ok / bad MESSAGE           count a pass / report and count a failure
#   finish [LABEL]             prints the counts; its status is the test's
fails=0
passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
check() {
    local name=$1 want=$2
    shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [[ $got -ne $want ]]; then
        bad "$name: exit $got, expected $want"
        cat "$tmp/err"
    else
        ok
    fi
}
contains() { if grep -q -- "$3" "$2"; then ok; else bad "$1: no '$3' in $2:"; cat "$2"; fi; }
has() { if grep -qF -- "$3" "$2"; then ok; else bad "$1: no '$3' in $2:"; cat "$2"; fi; }
lacks() { if grep -qF -- "$3" "$2"; then bad "$1: '$3' in $2:"; cat "$2"; else ok; fi; }
same() { if cmp -s "$2" "$3"; then ok; else bad "$1: $2 and $3 differ"; diff "$2" "$3" | head; fi; }
finish() {
    echo "${1:+$1: }$passes passed, $fails failed"
    [[ $fails -eq 0 ]]
}
