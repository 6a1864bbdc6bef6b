#!/usr/bin/env bash
# flexc train over 2 MPI processes. usage: mpi_train.sh MPIRUN FLEXC CASE
#   ddp, fsdp  the loss of 2 ranks equals the 1-process run within float32 reduction error,
#              and bitwise (weights and losses) with --deterministic; only rank 0 prints/writes
#   resume     checkpoints do not depend on the process count: 2 ranks -> 1 and 1 -> 2
#              continue bitwise as an uninterrupted --deterministic run
#   kill       rank 1 killed with SIGKILL (ddp), or stopped with SIGSTOP (fsdp: a hang),
#              mid-training (mpirun --enable-recovery): rank 0 exits non-zero naming rank 1
#              within --comm-timeout + 5 s, dumps the flight recorder, the last checkpoint
#              stays intact and 1 process resumes from it
#   memory     FSDP's per-rank parameter + gradient + optimizer memory (the library's own
#              allocation counter, from bench train --json) is the shards (1/N of the 1-process
#              state) plus at most three whole layers and the whole embedding and final norm,
#              at 2 and 4 ranks
#   interrupt  SIGINT to one rank mid-training (ddp and fsdp): every rank finishes the same
#              step, the checkpoint is written, all exit 130, and it resumes
#   nompi      (a build without MPI) --parallel refuses with a clear error
#   errors     --batch not a multiple of the processes, fsdp --deterministic with more than one
#              sequence per rank, mpirun without --parallel: clear errors, nothing written
#   mods       attention mods (--score-mod, --mask-mod) over 2 ranks: ddp within float32
#              reduction error of 1 process, and bitwise with --deterministic under ddp and
#              fsdp (the checkpoint, mods recorded, and the losses)
#   consistency  ranks launched with different --lr, --batch, --score-mod or --lora-alpha, with different files at the
#              same --data path, or fine-tuning different weights at the same --model path:
#              every rank exits 2 naming the option (or the data, or the weights) and both ranks'
#              values, nothing trained or written; the same options and tokens (at different
#              paths too) train
set -u
mpirun=$1
flexc=$2
case=$3
source "$(dirname "$0")/lib/checks.sh"
source "$(dirname "$0")/lib/mpi.sh"
scratch mpi_train 300
common=(--model tiny --data "$tmp/corpus.txt" --seq 32 --lr 3e-3 --threads 1 --comm-timeout 30)

equal_case() { # ddp | fsdp
    local par=$1
    "$flexc" train "${common[@]}" --quiet --batch 4 --steps 6 --out "$tmp/one" || bad "1-process run"
    run2 "$flexc" train "${common[@]}" --batch 4 --steps 6 --parallel "$par" --out "$tmp/two" >"$tmp/out" 2>"$tmp/err" ||
        bad "2-rank run: $(cat "$tmp/err")"
    close "$par-loss" "$tmp/one/metrics.jsonl" "$tmp/two/metrics.jsonl" 1e-4
    [[ $(grep -c '^flexc train:' "$tmp/out") == 1 ]] && ok || bad "expected one banner (rank 0 only): $(cat "$tmp/out")"
    [[ $(ls "$tmp/two" | tr '\n' ' ') == "checkpoint.safetensors metrics.jsonl model.safetensors " ]] && ok ||
        bad "unexpected files: $(ls -a "$tmp/two")"
    [[ $(wc -l <"$tmp/two/metrics.jsonl") == 6 ]] && ok || bad "metrics written more than once"
    # --deterministic: bitwise. FSDP needs one sequence per rank per micro-batch.
    local det=(--batch 4 --steps 6)
    [[ $par == fsdp ]] && det=(--batch 2 --accum 2 --steps 6)
    "$flexc" train "${common[@]}" --quiet "${det[@]}" --deterministic --out "$tmp/det1" || bad "1-process deterministic"
    local det2=("$flexc" train "${common[@]}" --quiet "${det[@]}" --deterministic --parallel "$par" --out "$tmp/det2")
    if strace -f -qq -o /dev/null true 2>/dev/null; then
        # rank 1 must not open or rename anything in the output directory (rank 0 writes).
        # LeakSanitizer cannot run under ptrace: off for this run in sanitizer builds.
        run2 bash -c 'o=$1; shift; export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
            exec strace -f -qq -e trace=openat,open,creat,rename,renameat,renameat2 -o "$o.$OMPI_COMM_WORLD_RANK" "$@"' \
            _ "$tmp/trace" "${det2[@]}" || bad "2-rank deterministic"
        if grep -q "$tmp/det2" "$tmp/trace.1"; then bad "rank 1 touched --out: $(grep "$tmp/det2" "$tmp/trace.1")"; else ok; fi
        grep -q "$tmp/det2/checkpoint" "$tmp/trace.0" && ok || bad "rank 0's trace shows no checkpoint write"
    else
        run2 "${det2[@]}" || bad "2-rank deterministic"
        echo "note: strace does not work here; rank 1's writes are not checked"
    fi
    same "$par-deterministic-checkpoint" "$tmp/det1/checkpoint.safetensors" "$tmp/det2/checkpoint.safetensors"
    losses "$tmp/det1/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/d1"
    losses "$tmp/det2/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/d2"
    same "$par-deterministic-losses" "$tmp/d1" "$tmp/d2"
    # the same training within rounding (validation batches differ with the batch shape)
    sed 's/,"val_loss":[^}]*//' "$tmp/one/metrics.jsonl" >"$tmp/p1"
    close "$par-deterministic-vs-plain" "$tmp/p1" "$tmp/d1" 1e-4
}

case $case in
ddp | fsdp) equal_case "$case" ;;
resume)
    det=(--batch 2 --accum 2 --steps 6 --deterministic --quiet)
    "$flexc" train "${common[@]}" "${det[@]}" --out "$tmp/straight" || bad "straight run"
    # 2 ranks (fsdp) to step 3, then 1 process to the end
    run2 "$flexc" train "${common[@]}" "${det[@]}" --parallel fsdp --until 3 --out "$tmp/a" || bad "2-rank first half"
    "$flexc" train --resume --deterministic --quiet --threads 1 --out "$tmp/a" || bad "1-process second half"
    same resume-2-to-1 "$tmp/straight/checkpoint.safetensors" "$tmp/a/checkpoint.safetensors"
    # 1 process to step 3, then 2 ranks (ddp)
    "$flexc" train "${common[@]}" "${det[@]}" --until 3 --out "$tmp/b" || bad "1-process first half"
    # (--deterministic comes back from the checkpoint)
    run2 "$flexc" train --resume --quiet --threads 1 --parallel ddp --out "$tmp/b" || bad "2-rank second half"
    same resume-1-to-2 "$tmp/straight/checkpoint.safetensors" "$tmp/b/checkpoint.safetensors"
    losses "$tmp/straight/metrics.jsonl" >"$tmp/s.l"
    losses "$tmp/b/metrics.jsonl" >"$tmp/b.l"
    same resume-1-to-2-losses "$tmp/s.l" "$tmp/b.l"
    ;;
kill)
    # rank_lost SIGNAL PARALLEL: rank 1 gets SIGNAL mid-training (KILL: dies; STOP: hangs)
    rank_lost() {
        local sig=$1 par=$2 timeout=2 k="$tmp/k-$1"
        mkdir -p "$k"
        # Each rank runs under a small shell that records flexc's pid and exit status (mpirun's
        # own status says nothing about the survivor in recovery mode).
        "$mpirun" --allow-run-as-root --oversubscribe --enable-recovery -np 2 bash -c \
            'd=$1; shift; "$@" & p=$!; echo $p >"$d/pid.$OMPI_COMM_WORLD_RANK"; wait $p; echo $? >"$d/rc.$OMPI_COMM_WORLD_RANK"' \
            _ "$k" "$flexc" train "${common[@]}" --comm-timeout $timeout --batch 4 --steps 100000 --save-every 10 \
            --eval-every 0 --log-every 100000 --parallel "$par" --out "$k/o" >"$k/out" 2>"$k/err" &
        local job=$!
        for _ in $(seq 300); do [[ -f $k/o/checkpoint.safetensors && -f $k/pid.1 ]] && break; sleep 0.1; done
        sleep 0.5
        if [[ ! -f $k/pid.1 ]]; then
            bad "$sig: the job did not start: $(cat "$k/err")"
            kill "$job" 2>/dev/null
            return
        fi
        kill -"$sig" "$(cat "$k/pid.1")"
        local t0 took_ms rc0 step first
        t0=$(date +%s%N)
        for _ in $(seq 300); do [[ -f $k/rc.0 ]] && break; sleep 0.05; done
        took_ms=$((($(date +%s%N) - t0) / 1000000))
        [[ $sig == STOP ]] && kill -KILL "$(cat "$k/pid.1")"
        wait "$job"
        rc0=$(cat "$k/rc.0" 2>/dev/null || echo none)
        [[ $rc0 == 1 ]] && ok || bad "$sig: survivor exit status '$rc0', expected 1"
        ((took_ms <= (timeout + 5) * 1000)) && ok || bad "$sig: survivor took $took_ms ms (timeout $timeout s + 5 s)"
        echo "$sig ($par): survivor exited $took_ms ms after rank 1 was signalled (timeout $timeout s)"
        [[ $(grep -c '^flexc: error: ' "$k/err") == 1 ]] && grep -q '^flexc: error: .*timed out after.*rank 1' "$k/err" &&
            ok || bad "$sig: not one error naming rank 1: $(grep '^flexc' "$k/err")"
        grep -q '"flight_recorder":"world"' "$k/err" && ok || bad "$sig: no flight recorder dump"
        # The last checkpoint is intact: one process resumes from it.
        step=$(ckpt_step "$k/o")
        "$flexc" train --resume --threads 1 --quiet --out "$k/o" --until $((step + 2)) || bad "$sig: resume on 1 process"
        first=$(tail -2 "$k/o/metrics.jsonl" | head -1 | sed 's/{"step":\([0-9]*\).*/\1/')
        [[ $first == $((step + 1)) ]] && ok || bad "$sig: resumed at step $first, checkpoint step $step"
    }
    rank_lost KILL ddp
    rank_lost STOP fsdp
    ;;
errors)
    run2 "$flexc" train "${common[@]}" --batch 3 --steps 2 --parallel ddp --out "$tmp/e1" >"$tmp/out" 2>"$tmp/err"
    grep -q 'flexc: error: --batch 3 is the global batch and must be a multiple of the 2 processes' "$tmp/err" && ok ||
        bad "batch 3 over 2: $(cat "$tmp/err")"
    [[ ! -e $tmp/e1/checkpoint.safetensors ]] && ok || bad "a checkpoint was written"
    run2 "$flexc" train "${common[@]}" --batch 4 --steps 2 --parallel fsdp --deterministic --out "$tmp/e2" >"$tmp/out" 2>"$tmp/err"
    grep -q 'deterministic with fsdp needs one sequence per process' "$tmp/err" && ok || bad "fsdp det: $(cat "$tmp/err")"
    run2 "$flexc" train "${common[@]}" --batch 4 --steps 2 --out "$tmp/e3" >"$tmp/out" 2>"$tmp/err"
    grep -q 'pass --parallel ddp or fsdp' "$tmp/err" && ok || bad "no --parallel: $(cat "$tmp/err")"
    [[ ! -e $tmp/e3/checkpoint.safetensors ]] && ok || bad "a checkpoint was written"
    # Options that do not go together are a usage error (2), not a failure (1).
    run2 "$flexc" train "${common[@]}" --batch 2 --steps 2 --parallel fsdp --adam-bf16 --out "$tmp/e4" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [[ $rc == 2 ]] && grep -q 'drop --adam-bf16' "$tmp/err" && ok || bad "fsdp --adam-bf16: exit $rc: $(cat "$tmp/err")"
    # One lock per --out for a whole job, taken by rank 0: a second job (of 2 ranks or 1) on
    # the same directory is refused at once, once, naming the holder.
    run2 "$flexc" train "${common[@]}" --batch 2 --steps 100000 --eval-every 0 --parallel ddp --quiet \
        --out "$tmp/lk" 2>"$tmp/lk.err" &
    job=$!
    for _ in $(seq 300); do [[ -s $tmp/lk/metrics.jsonl ]] && break; sleep 0.1; done
    holder=$(cat "$tmp/lk/.lock" 2>/dev/null)
    run2 "$flexc" train "${common[@]}" --batch 2 --steps 2 --parallel ddp --force --out "$tmp/lk" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [[ $rc != 0 && $(grep -c "is in use by another flexc train (pid $holder)" "$tmp/err") == 1 ]] && ok ||
        bad "second job on a locked --out: exit $rc: $(cat "$tmp/err")"
    "$flexc" train "${common[@]}" --batch 2 --steps 2 --quiet --out "$tmp/lk" 2>"$tmp/err"
    rc=$?
    [[ $rc == 1 ]] && grep -q "in use by another flexc train (pid $holder)" "$tmp/err" && ok ||
        bad "1 process on a locked --out: exit $rc: $(cat "$tmp/err")"
    kill -INT "$holder" # rank 0: every rank stops after the same step
    wait $job
    # However the job ended, its lock went with it.
    "$flexc" train "${common[@]}" --batch 2 --steps 1 --quiet --force --out "$tmp/lk" 2>"$tmp/err" && ok ||
        bad "after the job: $(cat "$tmp/err")"
    ;;
consistency)
    # Each rank's stderr goes to $tmp/err.RANK (mpirun interleaves the ranks' lines).
    # per_rank OPT V0 V1 CMD...: CMD on 2 ranks, with "OPT V0" on rank 0 and "OPT V1" on rank 1.
    per_rank() {
        run2 bash -c 'e=$1 o=$2 v=$3; [[ $OMPI_COMM_WORLD_RANK == 1 ]] && v=$4; shift 4
            exec "$@" "$o" "$v" 2>"$e.$OMPI_COMM_WORLD_RANK"' _ "$tmp/err" "$@"
    }
    # on_nodes DIR CMD...: CMD on 2 ranks, rank r in DIR/node.r, so that one relative path names
    # a different file on each rank, as on two machines.
    on_nodes() {
        run2 bash -c 'e=$1; cd "$2/node.$OMPI_COMM_WORLD_RANK" && shift 2 && exec "$@" 2>"$e.$OMPI_COMM_WORLD_RANK"' \
            _ "$tmp/err" "$@"
    }
    # refused NAME STATUS MESSAGE OUT: the job exited STATUS, each rank with MESSAGE, before
    # training (nothing in OUT)
    refused() {
        local rc=$? r
        [[ $rc == "$2" ]] && ok || bad "$1: exit $rc, expected $2: $(cat "$tmp/err.0")"
        for r in 0 1; do
            [[ $(cat "$tmp/err.$r") == *"$3"* ]] && ok || bad "$1: rank $r did not print '$3': $(cat "$tmp/err.$r")"
        done
        [[ ! -e $4/checkpoint.safetensors && ! -e $4/metrics.jsonl ]] && ok || bad "$1: $4 was written"
    }
    run=(train "${common[@]}" --batch 4 --steps 2 --parallel ddp --quiet)
    per_rank --lr 0.001 0.002 "$flexc" "${run[@]}" --out "$tmp/c1" 2>/dev/null
    refused lr 2 "flexc: error: ranks disagree on --lr: rank 0 has 0.001, rank 1 has 0.002" "$tmp/c1"
    per_rank --batch 2 4 "$flexc" train --model tiny --data "$tmp/corpus.txt" --seq 32 --threads 1 --comm-timeout 30 \
        --steps 2 --parallel fsdp --quiet --out "$tmp/c2" 2>/dev/null
    refused batch 2 "flexc: error: ranks disagree on --batch: rank 0 has 2, rank 1 has 4" "$tmp/c2"
    per_rank --seed 1 2 "$flexc" "${run[@]}" --out "$tmp/c3" 2>/dev/null
    refused seed 2 "flexc: error: ranks disagree on --seed: rank 0 has 1, rank 1 has 2" "$tmp/c3"
    # The same path, other text on rank 1 (one line changed).
    mkdir -p "$tmp/n/node.0" "$tmp/n/node.1"
    cp "$tmp/corpus.txt" "$tmp/n/node.0/corpus.txt"
    sed '5s/fox/cat/' "$tmp/corpus.txt" >"$tmp/n/node.1/corpus.txt"
    data=(--model tiny --seq 32 --lr 3e-3 --threads 1 --comm-timeout 30 --batch 4 --steps 2 --parallel ddp --quiet)
    on_nodes "$tmp/n" "$flexc" train "${data[@]}" --data corpus.txt --out "$tmp/c4" 2>/dev/null
    refused data 2 "flexc: error: ranks disagree on the data: rank 1's --data corpus.txt differs from rank 0's (hash " "$tmp/c4"
    # The same tokens at the same path, and at different paths: trained.
    cp "$tmp/corpus.txt" "$tmp/n/node.1/corpus.txt"
    on_nodes "$tmp/n" "$flexc" train "${data[@]}" --data corpus.txt --out "$tmp/c5" 2>/dev/null && ok ||
        bad "the same data: $(cat "$tmp/err.0" "$tmp/err.1")"
    [[ $(wc -l <"$tmp/c5/metrics.jsonl" 2>/dev/null) == 2 ]] && ok || bad "the same data: not 2 steps trained"
    cp "$tmp/corpus.txt" "$tmp/corpus-copy.txt"
    per_rank --data "$tmp/corpus.txt" "$tmp/corpus-copy.txt" "$flexc" train "${data[@]}" --out "$tmp/c6" 2>/dev/null &&
        ok || bad "the same tokens at two paths: $(cat "$tmp/err.0" "$tmp/err.1")"
    [[ -s $tmp/c6/checkpoint.safetensors ]] && ok || bad "the same tokens at two paths: no checkpoint"
    # Fine-tuning: the same --model path holding other weights on rank 1 (one float's lowest
    # mantissa byte), its configuration the same.
    fix="$(dirname "$0")/fixtures/models/llama3_tied"
    cp -r "$fix" "$tmp/n/node.0/m"
    cp -r "$fix" "$tmp/n/node.1/m"
    f="$tmp/n/node.1/m/model.safetensors"
    size=$(stat -c %s "$f")
    printf "\\x$(printf %02x $((0x$(od -An -tx1 -j $((size - 4)) -N1 "$f" | tr -d ' ') ^ 1)))" |
        dd of="$f" bs=1 seek=$((size - 4)) conv=notrunc status=none
    cmp -s "$fix/model.safetensors" "$f" && bad "rank 1's weights did not change" || ok
    on_nodes "$tmp/n" "$flexc" train --model m --data corpus.txt --seq 32 --threads 1 --comm-timeout 30 --batch 4 \
        --steps 2 --parallel ddp --quiet --out "$tmp/c7" 2>/dev/null
    refused weights 1 "flexc: error: ddp: ranks disagree on the weights they start from (--model or the --resume \
checkpoint): rank 1's differ from rank 0's (hash " "$tmp/c7"
    per_rank --score-mod "score" "score * 0.5" "$flexc" "${run[@]}" --out "$tmp/c8" 2>/dev/null
    refused score-mod 2 'flexc: error: ranks disagree on --score-mod: rank 0 has "score", rank 1 has "score * 0.5"' \
        "$tmp/c8"
    per_rank --lora-alpha 8 16 "$flexc" train --model "$fix" --lora 4 --data "$tmp/corpus.txt" --seq 32 --threads 1 \
        --comm-timeout 30 --batch 4 --steps 2 --parallel ddp --quiet --out "$tmp/c9" 2>/dev/null
    refused lora-alpha 2 "flexc: error: ranks disagree on --lora-alpha: rank 0 has 8, rank 1 has 16" "$tmp/c9"
    ;;
mods)
    mods=(--score-mod "30 * tanh(score / 30)" --mask-mod "q_idx >= kv_idx && q_idx - kv_idx < 16")
    "$flexc" train "${common[@]}" "${mods[@]}" --quiet --batch 4 --steps 4 --out "$tmp/one" || bad "1-process run"
    run2 "$flexc" train "${common[@]}" "${mods[@]}" --batch 4 --steps 4 --parallel ddp --out "$tmp/two" 2>"$tmp/err" ||
        bad "2-rank run: $(cat "$tmp/err")"
    close mods-ddp "$tmp/one/metrics.jsonl" "$tmp/two/metrics.jsonl" 1e-4
    for par in ddp fsdp; do
        det=(--batch 4 --steps 4 --deterministic)
        [[ $par == fsdp ]] && det=(--batch 2 --accum 2 --steps 4 --deterministic)
        "$flexc" train "${common[@]}" "${mods[@]}" --quiet "${det[@]}" --out "$tmp/d1-$par" || bad "$par: 1 process"
        run2 "$flexc" train "${common[@]}" "${mods[@]}" "${det[@]}" --parallel "$par" --out "$tmp/d2-$par" \
            2>"$tmp/err" || bad "$par: 2 ranks: $(cat "$tmp/err")"
        same "mods-$par-deterministic" "$tmp/d1-$par/checkpoint.safetensors" "$tmp/d2-$par/checkpoint.safetensors"
        losses "$tmp/d1-$par/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/l1"
        losses "$tmp/d2-$par/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/l2"
        same "mods-$par-losses" "$tmp/l1" "$tmp/l2"
        head -c 65536 "$tmp/d2-$par/checkpoint.safetensors" | tr -d '\0' | grep -qF '"mask_mod":"q_idx >= kv_idx' &&
            ok || bad "$par: the checkpoint does not record the mask mod"
    done
    ;;
interrupt)
    for par in ddp fsdp; do
        k="$tmp/i-$par"
        mkdir -p "$k"
        run2 bash -c 'd=$1; shift; "$@" & p=$!; echo $p >"$d/pid.$OMPI_COMM_WORLD_RANK"; wait $p; echo $? >"$d/rc.$OMPI_COMM_WORLD_RANK"' \
            _ "$k" "$flexc" train "${common[@]}" --batch 2 --steps 100000 --eval-every 0 --parallel "$par" --quiet \
            --out "$k/o" 2>"$k/err" &
        job=$!
        for _ in $(seq 300); do [[ -s $k/o/metrics.jsonl && -f $k/pid.1 ]] && break; sleep 0.1; done
        sleep 0.3
        kill -INT "$(cat "$k/pid.1")"
        wait "$job"
        [[ $(cat "$k/rc.0" 2>/dev/null) == 130 && $(cat "$k/rc.1" 2>/dev/null) == 130 ]] && ok ||
            bad "$par: exit statuses $(cat "$k/rc.0" 2>/dev/null) and $(cat "$k/rc.1" 2>/dev/null), expected 130: $(grep '^flexc' "$k/err")"
        step=$(ckpt_step "$k/o")
        last=$(tail -1 "$k/o/metrics.jsonl" | sed 's/{"step":\([0-9]*\).*/\1/')
        [[ -n $step && $step == "$last" ]] && ok || bad "$par: checkpoint step '$step', last metrics step $last"
        "$flexc" train --resume --threads 1 --quiet --out "$k/o" --until $((step + 1)) || bad "$par: resume"
    done
    ;;
memory)
    # small: 6 layers of 1.57M parameters, embedding + final norm 0.1M (whole parameters and
    # gradients: 0.13 of a layer); a fourth layer buffer would exceed the bound
    for np in 2 4; do
        "$mpirun" --allow-run-as-root --oversubscribe -np $np "$flexc" bench train --parallel fsdp --model small \
            --seq 8 --batch $np --steps 1 --threads 1 --json >"$tmp/m$np" 2>"$tmp/err" || bad "bench at $np ranks: $(cat "$tmp/err")"
        if awk -v np=$np '{
                for (i = 1; i <= split($0, f, ","); i++) { split(f[i], kv, ":"); gsub(/[{}"]/, "", kv[1]); v[kv[1]] = kv[2] }
                one = v["one_process_state_bytes"]; sh = v["shard_bytes"]; st = v["state_bytes"]
                al = v["allocated_bytes"]; ly = v["layer_bytes"]
                printf "  %d ranks: %.2f MB = %.2f MB shards + %.2f MB gathered (%.2f layers); allocated %.2f MB; 1 process %.2f MB\n",
                    np, st / 1e6, sh / 1e6, (st - sh) / 1e6, (st - sh) / ly, al / 1e6, one / 1e6
                bad = !(sh <= one / np * 1.001 && sh >= one / np) || !(st - sh <= 3.2 * ly) || !(al >= st && al <= st * 1.01)
                exit bad }' "$tmp/m$np"; then ok; else bad "memory at $np ranks: $(cat "$tmp/m$np")"; fi
    done
    ;;
nompi) # a build without MPI
    "$flexc" train "${common[@]}" --batch 4 --steps 1 --parallel ddp --out "$tmp/n" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [[ $rc == 1 ]] && ok || bad "exit status $rc, expected 1"
    grep -q '^flexc: error: --parallel ddp: flexc was built without MPI' "$tmp/err" && ok || bad "$(cat "$tmp/err")"
    ;;
*) bad "unknown case $case" ;;
esac
finish "mpi_train $case"
