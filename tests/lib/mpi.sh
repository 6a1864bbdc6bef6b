# What the MPI training tests share. Source it after lib/checks.sh, with $mpirun set:
#   run2 CMD...              CMD on 2 processes (as root too, more processes than cores too)
#   losses FILE              a metrics.jsonl without its timing fields
#   close NAME A B RTOL      every number of the metrics files A and B agrees within RTOL
#                            (relative, plus 1e-6)
#   ckpt_step DIR            the step of DIR's checkpoint
run2() { "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$@"; }
losses() { sed -e 's/"tokens_per_s":[^,]*,//' -e 's/"time_s":[^,}]*//' "$1"; }
close() {
    if paste -d'\n' <(losses "$2") <(losses "$3") | awk -v tol="$4" '
        { gsub(/[{}"]/, ""); n = split($0, f, ","); line[NR % 2] = $0; cnt[NR % 2] = n
          for (i = 1; i <= n; i++) { split(f[i], kv, ":"); v[NR % 2, i] = kv[2] } }
        NR % 2 == 0 { if (cnt[0] != cnt[1]) { bad = 1; next }
          for (i = 1; i <= cnt[0]; i++) { a = v[1, i]; b = v[0, i]; d = a - b; if (d < 0) d = -d
            m = a < 0 ? -a : a; if (d > tol * m + 1e-6) { print "  " line[1] "\n  " line[0]; bad = 1 } } }
        END { exit bad }'; then ok; else bad "$1: $2 and $3 differ beyond rtol $4"; fi
}
ckpt_step() { head -c 65536 "$1/checkpoint.safetensors" 2>/dev/null | tr -d '\0' | grep -ao '"step":"[0-9]*"' | tr -dc 0-9; }
