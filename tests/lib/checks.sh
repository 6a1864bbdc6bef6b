# The checks the shell tests share. Source it, then make a scratch folder $tmp (or call scratch):
#   scratch NAME [LINES]       makes $tmp (/tmp/flexc_NAME.XXXXXX), removed at exit with any
#                              background job left running; with LINES, $tmp/corpus.txt too
#   check NAME STATUS CMD...   runs CMD, stdout to $tmp/out and stderr to $tmp/err, and
#                              expects exit status STATUS
#   contains NAME FILE REGEX   FILE has a line matching the grep pattern
#   has NAME FILE TEXT         FILE holds TEXT (a fixed string)
#   lacks NAME FILE TEXT       FILE does not hold TEXT
#   same NAME FILE1 FILE2      the files are byte for byte equal
#   ok / bad MESSAGE           count a pass / report and count a failure
#   finish [LABEL]             prints the counts; its status is the test's
#   corpus FILE LINES          writes a small training text: numbered sentences, a "%" line
#                              (the document separator) after every seventh
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
corpus() {
    local i
    for i in $(seq 1 "$2"); do
        echo "the quick brown fox $((i % 10)) jumps over the lazy dog."
        if ((i % 7 == 0)); then echo "%"; fi
    done >"$1"
}
scratch() {
    tmp=$(mktemp -d "/tmp/flexc_$1.XXXXXX")
    trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
    if [[ -n ${2:-} ]]; then corpus "$tmp/corpus.txt" "$2"; fi
}
