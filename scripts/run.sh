#!/usr/bin/env bash
# The main job of `make run`: train the default GPT (`small`, about 10M parameters) on the
# default corpus (the Debian fortunes) for a few minutes on 2 cores, generate samples from
# the trained model, and draw the run's loss curves (RUN_OUT/loss.png). Set RUN_STEPS /
# RUN_OUT / RUN_THREADS to change the defaults.
set -euo pipefail
build=${1:-build}
flexc="$build/flexc"
out=${RUN_OUT:-out/run}
steps=${RUN_STEPS:-500}
threads=${RUN_THREADS:-2}
# Idle OpenMP threads sleep instead of spinning: the cores are the run's only, and a
# thread that spins between parallel regions takes them from the one with work.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

if [[ ! -d /usr/share/games/fortunes ]]; then
    echo "flexc: error: the default corpus /usr/share/games/fortunes is missing;" >&2
    echo "  run scripts/deps.sh (installs the 'fortunes' package) or train with --data FILE" >&2
    exit 1
fi

echo "== training the default model on the fortunes corpus ($steps steps, $threads threads)"
"$flexc" train --model small --batch 4 --seq 256 --steps "$steps" --lr 2e-3 --warmup 15 \
    --eval-every 50 --log-every 25 --threads "$threads" --out "$out" --force
echo
for seed in 1 2 3; do
    echo "== a sample (flexc generate --ckpt $out --prompt 'The ' --temperature 0.7 --seed $seed)"
    "$flexc" generate --ckpt "$out" --prompt "The " --tokens 400 --temperature 0.7 --seed "$seed" --threads "$threads"
done
echo
echo "== the loss curves (flexc plot $out -o $out/loss.png)"
if "$flexc" plot "$out" -o "$out/loss.png"; then
    echo "wrote $out/loss.png"
else
    echo "flexc: no plot of the run (see the error above); the model is in $out" >&2
    exit 1
fi
