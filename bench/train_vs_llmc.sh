#!/usr/bin/env bash
# flexc's trainer against llm.c's CPU trainer (train_gpt2.c) at the GPT-2 124M shape, B=4,
# T=64, on the same threads, run alternately in this script: tokens/s and peak memory
# (maximum resident set of each process). flexc runs with its Adam moments in float32, in
# bfloat16 (--adam-bf16), and in bfloat16 with recomputed activations (--recompute), all
# with OMP_WAIT_POLICY=passive (idle OpenMP threads sleep instead of spinning: on a machine
# shared with other jobs, spinning threads take the cores from the working ones). llm.c runs
# both with its default policy and with passive, and the faster of the two counts (on a busy
# machine the default one can be several times slower). llm.c is not part of flexc: pass the
# path of an llm.c checkout; without one (or without numpy to write its random-weight
# inputs) this skips.
#   bench/train_vs_llmc.sh build/flexc /path/to/llm.c [threads] [rounds]
set -euo pipefail
flexc=${1:?path to flexc}
llmc=${2:-}
threads=${3:-2}
rounds=${4:-2}
if [[ -z "$llmc" || ! -f "$llmc/train_gpt2.c" ]]; then
    echo '{"case":"train_vs_llmc","skipped":"no llm.c checkout given"}'; exit 0
fi
if ! python3 -c 'import numpy' 2>/dev/null; then
    echo '{"case":"train_vs_llmc","skipped":"numpy is missing"}'; exit 0
fi
work=$(mktemp -d /tmp/flexc_llmc.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$llmc/train_gpt2.c" "$llmc/llmc" "$work/"
# Eight timed steps, no sampling: the step time is what is compared.
sed -i 's/for (int step = 0; step <= 40; step++)/for (int step = 0; step <= 8; step++)/' "$work/train_gpt2.c"
gcc -Ofast -march=native -fopenmp -Wno-unused-result "$work/train_gpt2.c" -lm -o "$work/train_gpt2"
# llm.c reads a checkpoint and token files: random weights and tokens of the right format.
(cd "$work" && python3 - <<'PY'
import numpy as np, os
V, Vp, maxT, L, C, NH = 50257, 50304, 1024, 12, 768, 12
h = np.zeros(256, np.int32); h[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
n = Vp*C + maxT*C + L*(C + C + 3*C*C + 3*C + C*C + C + C + C + 4*C*C + 4*C + 4*C*C + C) + 2*C
r = np.random.default_rng(0)
with open("gpt2_124M.bin", "wb") as f:
    f.write(h.tobytes()); f.write((r.standard_normal(n).astype(np.float32) * 0.02).tobytes())
os.makedirs("dev/data/tinyshakespeare", exist_ok=True)
for name, nt in [("train", 300000), ("val", 40000)]:
    hh = np.zeros(256, np.int32); hh[:3] = [20240520, 1, nt]
    with open(f"dev/data/tinyshakespeare/tiny_shakespeare_{name}.bin", "wb") as f:
        f.write(hh.tobytes()); f.write(r.integers(0, V, nt).astype(np.uint16).tobytes())
PY
)
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for r in $(seq 1 "$rounds"); do
    for policy in default passive; do
        env=(OMP_NUM_THREADS="$threads"); [[ $policy == passive ]] && env+=(OMP_WAIT_POLICY=passive)
        (cd "$work" && env -u OMP_WAIT_POLICY "${env[@]}" /usr/bin/time -f "%M" -o llmc.rss ./train_gpt2 > llmc.out)
        # "step N: train loss X (took Y ms)": the steps after the first
        ms=$(grep -o 'step [1-9][0-9]*: .*took [0-9.]* ms' "$work/llmc.out" | sed 's/.*took \([0-9.]*\) ms/\1/' | median)
        echo "$ms $(cat "$work/llmc.rss")" >> "$work/llmc_$policy.all"
    done
    for adam in f32 bf16 bf16+recompute; do
        flag=(); [[ $adam == bf16 ]] && flag=(--adam-bf16); [[ $adam == bf16+recompute ]] && flag=(--adam-bf16 --recompute)
        OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OMP_NUM_THREADS=$threads /usr/bin/time -f "%M" -o "$work/fx.rss" \
            "$flexc" bench train --model gpt2 --vocab 50257 --batch 4 --seq 64 --only flex --steps 3 \
            --threads "$threads" "${flag[@]}" --json > "$work/fx.out"
        tps=$(sed 's/.*"tokens_per_s":\([0-9.]*\).*/\1/' "$work/fx.out")
        echo "$tps $(cat "$work/fx.rss")" >> "$work/fx_$adam.all"
    done
done
# llm.c's faster policy (median step time over the rounds), and its largest resident set.
ms_default=$(cut -d' ' -f1 "$work/llmc_default.all" | median); ms_passive=$(cut -d' ' -f1 "$work/llmc_passive.all" | median)
llmc_ms=$(printf '%s\n%s\n' "$ms_default" "$ms_passive" | sort -n | head -1)
llmc_kb=$(cat "$work"/llmc_*.all | cut -d' ' -f2 | sort -n | tail -1)
for adam in f32 bf16 bf16+recompute; do
    fx_tps=$(cut -d' ' -f1 "$work/fx_$adam.all" | median); fx_kb=$(cut -d' ' -f2 "$work/fx_$adam.all" | sort -n | tail -1)
    awk -v ms="$llmc_ms" -v msd="$ms_default" -v msp="$ms_passive" -v lkb="$llmc_kb" -v tps="$fx_tps" -v fkb="$fx_kb" \
        -v th="$threads" -v rounds="$rounds" -v adam="$adam" 'BEGIN {
        ltps = 256 / (ms / 1000)
        printf("{\"case\":\"train_vs_llmc\",\"shape\":\"gpt2-124M B=4 T=64 V=50257\",\"threads\":%d,\"rounds\":%d,", th, rounds)
        printf("\"llmc_tokens_per_s_default_policy\":%.1f,\"llmc_tokens_per_s_passive_policy\":%.1f,", 256000 / msd, 256000 / msp)
        printf("\"flexc\":\"%s\",\"llmc_tokens_per_s\":%.1f,\"flexc_tokens_per_s\":%.1f,\"speedup\":%.2f,", adam, ltps, tps, tps / ltps)
        printf("\"llmc_max_rss_mb\":%.0f,\"flexc_max_rss_mb\":%.0f,\"memory_ratio\":%.3f}\n", lkb/1024, fkb/1024, fkb/lkb) }'
done
