#!/usr/bin/env bash
# flexc train --model HFDIR over 2 MPI processes, with the Hugging Face fixtures: Llama with a
# tied head, and Qwen2 with q/k/v biases and an untied head (which FSDP shards like every other
# parameter), text read through the model's tokenizer. usage: mpi_hf.sh MPIRUN FLEXC CASE
#   ddp, fsdp  6 steps of 2 ranks equal 1 process within float32 reduction error, and bitwise
#              (checkpoint and losses) with --deterministic; Qwen2 with --attn document (its
#              documents end at its eos id); the run keeps the model's config and tokenizer
#   resume     --until stops a 2-rank run at step 3 with its checkpoint; resumed on 1 process,
#              or on 2 ranks in the other parallel mode, it continues bitwise as an
#              uninterrupted --deterministic run
#   lora       LoRA adapters (--lora, with dropout) trained by 2 ranks (ddp) equal 1 process's
#              within float32 reduction error, also with --dtype bf16; bitwise with
#              --deterministic, and over --until on 2 ranks + --resume on 1; only rank 0 writes
#              the LoRA checkpoint; fsdp is refused with its reason
#   export     a 2-rank run exported (flexc export) is a directory flexc generate --model
#              loads and that generates what the run's checkpoint generates; an llm.c token
#              file (flexc tokenize) trains on 2 ranks as on 1
set -u
mpirun=$1
flexc=$2
case=$3
fix="$(dirname "$0")/fixtures/models"
source "$(dirname "$0")/lib/checks.sh"
source "$(dirname "$0")/lib/mpi.sh"
scratch mpi_hf 300
base=(--data "$tmp/corpus.txt" --seq 32 --lr 3e-3 --threads 1 --comm-timeout 30 --quiet)
# The options of each fixture model.
opts() {
    case $1 in
    llama3_tied) echo --model "$fix/llama3_tied" ;;
    qwen2_bias) echo --model "$fix/qwen2_bias" --attn document ;;
    esac
}

equal_case() { # ddp | fsdp
    local par=$1 m d det
    for m in llama3_tied qwen2_bias; do
        # shellcheck disable=SC2207
        local common=("${base[@]}" $(opts $m))
        d="$tmp/$m-$par"
        "$flexc" train "${common[@]}" --batch 4 --steps 6 --out "$d-one" || bad "$m: 1-process run"
        run2 "$flexc" train "${common[@]}" --batch 4 --steps 6 --parallel "$par" --out "$d-two" 2>"$tmp/err" ||
            bad "$m: 2-rank run: $(cat "$tmp/err")"
        close "$m-$par-loss" "$d-one/metrics.jsonl" "$d-two/metrics.jsonl" 1e-4
        [[ $(wc -l <"$d-two/metrics.jsonl") == 6 ]] && ok || bad "$m: not one metrics line per step"
        same "$m-$par-keeps-config" "$fix/$m/config.json" "$d-two/hf/config.json"
        same "$m-$par-keeps-tokenizer" "$fix/$m/tokenizer.json" "$d-two/hf/tokenizer.json"
        # --deterministic: bitwise. FSDP needs one sequence per rank per micro-batch.
        det=(--batch 4 --steps 6 --deterministic)
        [[ $par == fsdp ]] && det=(--batch 2 --accum 2 --steps 6 --deterministic)
        "$flexc" train "${common[@]}" "${det[@]}" --out "$d-det1" || bad "$m: 1-process deterministic"
        run2 "$flexc" train "${common[@]}" "${det[@]}" --parallel "$par" --out "$d-det2" 2>"$tmp/err" ||
            bad "$m: 2-rank deterministic: $(cat "$tmp/err")"
        same "$m-$par-deterministic-checkpoint" "$d-det1/checkpoint.safetensors" "$d-det2/checkpoint.safetensors"
        losses "$d-det1/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/d1"
        losses "$d-det2/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/d2"
        same "$m-$par-deterministic-losses" "$tmp/d1" "$tmp/d2"
    done
}

case $case in
ddp | fsdp) equal_case "$case" ;;
resume)
    det=(--batch 2 --accum 2 --steps 6 --deterministic)
    for m in qwen2_bias llama3_tied; do
        # shellcheck disable=SC2207
        common=("${base[@]}" $(opts $m))
        "$flexc" train "${common[@]}" "${det[@]}" --out "$tmp/$m-straight" || bad "$m: straight run"
    done
    # Qwen2: 2 ranks (fsdp) to step 3, then 1 process to the end.
    m=qwen2_bias
    run2 "$flexc" train "${base[@]}" $(opts $m) "${det[@]}" --parallel fsdp --until 3 --out "$tmp/a" 2>"$tmp/err" ||
        bad "$m: 2-rank first half: $(cat "$tmp/err")"
    [[ $(ckpt_step "$tmp/a") == 3 && $(wc -l <"$tmp/a/metrics.jsonl") == 3 ]] && ok ||
        bad "$m: --until 3 left checkpoint step '$(ckpt_step "$tmp/a")' and $(wc -l <"$tmp/a/metrics.jsonl") metrics lines"
    "$flexc" train --resume --quiet --threads 1 --out "$tmp/a" || bad "$m: 1-process second half"
    same "$m-resume-2-to-1" "$tmp/$m-straight/checkpoint.safetensors" "$tmp/a/checkpoint.safetensors"
    # (the validation loss of 2 ranks averages theirs: equal within rounding only)
    losses "$tmp/$m-straight/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/s.l"
    losses "$tmp/a/metrics.jsonl" | sed 's/,"val_loss":[^}]*//' >"$tmp/a.l"
    same "$m-resume-2-to-1-losses" "$tmp/s.l" "$tmp/a.l"
    # Llama: 2 ranks (ddp) to step 3, then 2 ranks (fsdp) to the end; --deterministic comes
    # back from the checkpoint.
    m=llama3_tied
    run2 "$flexc" train "${base[@]}" $(opts $m) "${det[@]}" --parallel ddp --until 3 --out "$tmp/b" 2>"$tmp/err" ||
        bad "$m: 2-rank ddp first half: $(cat "$tmp/err")"
    run2 "$flexc" train --resume --quiet --threads 1 --parallel fsdp --out "$tmp/b" 2>"$tmp/err" ||
        bad "$m: 2-rank fsdp second half: $(cat "$tmp/err")"
    same "$m-resume-ddp-to-fsdp" "$tmp/$m-straight/checkpoint.safetensors" "$tmp/b/checkpoint.safetensors"
    ;;
export)
    m=qwen2_bias
    run2 "$flexc" train "${base[@]}" $(opts $m) --batch 4 --steps 3 --parallel fsdp --out "$tmp/r" 2>"$tmp/err" ||
        bad "2-rank run: $(cat "$tmp/err")"
    check export 0 "$flexc" export --ckpt "$tmp/r" --to "$tmp/r-hf"
    same export-config "$fix/$m/config.json" "$tmp/r-hf/config.json"
    gen=(--prompt "the quick brown fox" --tokens 8 --temperature 0 --json --threads 1)
    check generate-ckpt 0 "$flexc" generate --ckpt "$tmp/r" "${gen[@]}"
    cp "$tmp/out" "$tmp/from-ckpt.json"
    check generate-export 0 "$flexc" generate --model "$tmp/r-hf" "${gen[@]}"
    contains generate-export-ids "$tmp/out" '"ids": \[[0-9]'
    same generate-export-same "$tmp/from-ckpt.json" "$tmp/out"
    # The fine-tuned model is not the fixture any more.
    check generate-fixture 0 "$flexc" generate --model "$fix/$m" "${gen[@]}"
    cmp -s "$tmp/out" "$tmp/from-ckpt.json" && bad "generate: the trained model generates what the fixture does" || ok
    # --data as an llm.c token file: read as is, on 2 ranks as on 1.
    check tokenize 0 "$flexc" tokenize --model "$fix/$m" "$tmp/corpus.txt" -o "$tmp/corpus.bin"
    tok=("${base[@]/$tmp\/corpus.txt/$tmp/corpus.bin}")
    "$flexc" train "${tok[@]}" $(opts $m) --batch 4 --steps 4 --out "$tmp/t1" || bad "token file: 1 process"
    run2 "$flexc" train "${tok[@]}" $(opts $m) --batch 4 --steps 4 --parallel ddp --out "$tmp/t2" 2>"$tmp/err" ||
        bad "token file: 2 ranks: $(cat "$tmp/err")"
    close tokens-ddp "$tmp/t1/metrics.jsonl" "$tmp/t2/metrics.jsonl" 1e-4
    ;;
lora)
    for m in qwen2_bias llama_bf16; do
        common=("${base[@]}" --model "$fix/$m" --lora 4 --lora-dropout 0.1 --batch 4 --steps 6)
        d="$tmp/lora-$m"
        "$flexc" train "${common[@]}" --out "$d-one" || bad "$m: 1-process LoRA run"
        run2 "$flexc" train "${common[@]}" --parallel ddp --out "$d-two" 2>"$tmp/err" ||
            bad "$m: 2-rank LoRA run: $(cat "$tmp/err")"
        close "$m-lora-ddp" "$d-one/metrics.jsonl" "$d-two/metrics.jsonl" 1e-4
        [[ $(ls "$d-two" | tr '\n' ' ') == "checkpoint.safetensors hf metrics.jsonl " ]] && ok ||
            bad "$m: unexpected files: $(ls "$d-two")"
        "$flexc" train "${common[@]}" --deterministic --out "$d-det1" || bad "$m: 1-process deterministic LoRA"
        run2 "$flexc" train "${common[@]}" --deterministic --parallel ddp --out "$d-det2" 2>"$tmp/err" ||
            bad "$m: 2-rank deterministic LoRA: $(cat "$tmp/err")"
        same "$m-lora-deterministic" "$d-det1/checkpoint.safetensors" "$d-det2/checkpoint.safetensors"
        run2 "$flexc" train "${common[@]}" --deterministic --parallel ddp --until 3 --out "$d-r" 2>"$tmp/err" ||
            bad "$m: 2-rank LoRA to step 3: $(cat "$tmp/err")"
        "$flexc" train --resume --quiet --threads 1 --out "$d-r" || bad "$m: LoRA resumed on 1 process"
        same "$m-lora-resume-2-to-1" "$d-det1/checkpoint.safetensors" "$d-r/checkpoint.safetensors"
    done
    # --dtype bf16: the base read as bfloat16 on every rank.
    common=("${base[@]}" --model "$fix/llama_bf16" --lora 4 --batch 4 --steps 4 --dtype bf16)
    "$flexc" train "${common[@]}" --out "$tmp/lb1" || bad "bf16: 1-process LoRA run"
    run2 "$flexc" train "${common[@]}" --parallel ddp --out "$tmp/lb2" 2>"$tmp/err" ||
        bad "bf16: 2-rank LoRA run: $(cat "$tmp/err")"
    close lora-bf16-ddp "$tmp/lb1/metrics.jsonl" "$tmp/lb2/metrics.jsonl" 1e-4
    run2 "$flexc" train "${common[@]}" --parallel fsdp --out "$tmp/lf" >/dev/null 2>"$tmp/err" &&
        bad "fsdp with --lora ran" || ok
    has lora-fsdp-refused "$tmp/err" "--lora does not take --parallel fsdp (it shards the weights that train"
    [[ ! -e $tmp/lf/checkpoint.safetensors ]] && ok || bad "fsdp with --lora wrote a checkpoint"
    ;;
*) bad "unknown case $case" ;;
esac
finish "mpi_hf $case"
