#!/usr/bin/env bash
# A rank killed with SIGKILL must not leave the others hanging: usage mpi_comm_kill.sh MPIRUN MPI_COMM.
#  1. With --enable-recovery Open MPI keeps the survivor running: its collective must return
#     FX_ETIMEDOUT naming rank 1 within timeout (2 s) + 5 s, with the flight recorder dumped.
#  2. The same with rank 1 dying inside an op it already announced: the survivor names it as
#     the rank that no longer answers.
#  3. By default Open MPI ends the whole job when a rank dies: mpirun must then finish, in
#     bounded time, with a non-zero status.
set -u
mpirun=$1
exe=$2
fail=0
say() { echo "mpi_comm_kill: $*" >&2; }

# survivor_reports CASE PATTERN: runs CASE with --enable-recovery; the survivor's line must
# match PATTERN and come between the 2 s timeout and timeout + 5 s.
survivor_reports() {
    local case=$1 pattern=$2 start out rc took_ms line secs
    start=$(date +%s%N)
    out=$(timeout 60 "$mpirun" --allow-run-as-root --oversubscribe --enable-recovery -np 2 "$exe" "$case" 2>&1)
    rc=$?
    took_ms=$((($(date +%s%N) - start) / 1000000))
    echo "$out"
    if [ "$rc" -eq 124 ]; then
        say "$case: with --enable-recovery the job hung (killed after 60 s)"
        fail=1
    fi
    line=$(echo "$out" | grep '^survivor: ' || true)
    # shellcheck disable=SC2053
    if [[ "$line" != $pattern ]]; then
        say "$case: the survivor's report does not match '$pattern' (got: '${line}')"
        fail=1
    fi
    secs=$(echo "$line" | sed -n 's/^survivor: [A-Z_]* after \([0-9.]*\) s.*/\1/p')
    if [ -z "$secs" ] || ! awk -v s="$secs" 'BEGIN { exit !(s >= 1.9 && s <= 7.0) }'; then
        say "$case: the survivor took '${secs}' s to notice; expected between the 2 s timeout and 7 s"
        fail=1
    fi
    echo "$out" | grep -q '"status":"FX_ETIMEDOUT","state":"failed"' ||
        { say "$case: no flight recorder dump with the failed op"; fail=1; }
    say "$case, recovery mode: mpirun status $rc after ${took_ms} ms"
}

survivor_reports kill 'survivor: FX_ETIMEDOUT after *not arrived: rank 1 (last entered seq 0)*'
survivor_reports kill_inside 'survivor: FX_ETIMEDOUT after *every rank arrived, but no answer from: rank 1 *'

start=$(date +%s%N)
out=$(timeout 60 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$exe" kill 2>&1)
rc=$?
took_ms=$((($(date +%s%N) - start) / 1000000))
echo "$out"
if [ "$rc" -eq 124 ]; then
    say "by default the job hung after a rank died (killed after 60 s)"
    fail=1
elif [ "$rc" -eq 0 ]; then
    say "by default mpirun returned 0 after a rank died"
    fail=1
fi
say "default mode: mpirun status $rc after ${took_ms} ms"
exit $fail
