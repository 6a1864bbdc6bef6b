#!/usr/bin/env bash
# flexc train --score-mod / --mask-mod: attention written as expressions trains, resumes byte
# for byte, is bitwise at 1 and 2 threads, is recorded in the checkpoint (generate runs it,
# export refuses it), and a mask mod equal to the causal mask trains as --attn causal does;
# every refusal names its option (and the column of a syntax error).
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_mods 300
# metrics.jsonl without the timing fields, which differ from run to run
losses() { sed -e 's/"tokens_per_s":[^,]*,//' -e 's/"time_s":[^,}]*//' "$1"; }
common=(--model tiny --data "$tmp/corpus.txt" --batch 4 --seq 48 --lr 3e-3 --quiet)
softcap="30 * tanh(score / 30)"
alibi="score - 0.5 * (q_idx - kv_idx)"
window="q_idx >= kv_idx && q_idx - kv_idx < 16"
prefix="kv_idx < 8 || kv_idx <= q_idx"
meta() { head -c 20000 "$1" | tr -d '\0'; } # the safetensors header (JSON)

# ---- a score mod over the built-in mask, a mask mod, both: they train and are recorded ----
check softcap 0 "$flexc" train "${common[@]}" --steps 12 --score-mod "$softcap" --out "$tmp/sc" --threads 1
meta "$tmp/sc/checkpoint.safetensors" > "$tmp/sc.meta"
has softcap-attn "$tmp/sc.meta" '"attn":"mod:causal"'
has softcap-meta "$tmp/sc.meta" "\"score_mod\":\"$softcap\""
lacks softcap-no-mask "$tmp/sc.meta" '"mask_mod"'
meta "$tmp/sc/model.safetensors" > "$tmp/scm.meta"
has softcap-model-meta "$tmp/scm.meta" "\"score_mod\":\"$softcap\""
check alibi-sliding 0 "$flexc" train "${common[@]}" --steps 12 --attn sliding:24 --score-mod "$alibi" --out "$tmp/al" \
    --threads 1
has alibi-attn <(meta "$tmp/al/checkpoint.safetensors") '"attn":"mod:sliding:24"'
check window 0 "$flexc" train "${common[@]}" --steps 12 --mask-mod "$window" --out "$tmp/w" --threads 1
meta "$tmp/w/checkpoint.safetensors" > "$tmp/w.meta"
has window-attn "$tmp/w.meta" '"attn":"mod"'
has window-meta "$tmp/w.meta" "\"mask_mod\":\"$window\""
lacks window-no-score "$tmp/w.meta" '"score_mod"'
check prefix-softcap 0 "$flexc" train "${common[@]}" --steps 12 --mask-mod "$prefix" --score-mod "$softcap" \
    --out "$tmp/p" --threads 1
# The header names the mods.
check header 0 "$flexc" train --model tiny --data "$tmp/corpus.txt" --batch 4 --seq 48 --steps 1 --mask-mod "$prefix" \
    --score-mod "$softcap" --out "$tmp/hd" --threads 1
has header-text "$tmp/out" "attention mask mod \"$prefix\", score mod \"$softcap\""
# Each mod changes the run (else nothing above says it was applied).
check plain 0 "$flexc" train "${common[@]}" --steps 12 --out "$tmp/plain" --threads 1
for d in sc w p; do
    if cmp -s <(losses "$tmp/$d/metrics.jsonl") <(losses "$tmp/plain/metrics.jsonl"); then
        bad "$d: the same losses as the run without mods"; else ok; fi
done

# ---- --mask-mod "q_idx >= kv_idx" is --attn causal, bit for bit ----
check causal-mod 0 "$flexc" train "${common[@]}" --steps 12 --mask-mod "q_idx >= kv_idx" --out "$tmp/cm" --threads 1
same causal-mod-losses <(losses "$tmp/cm/metrics.jsonl") <(losses "$tmp/plain/metrics.jsonl")
# The tensors (everything after the header) are the same bytes.
body() { python3 -c 'import sys,struct; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; f.seek(8+n); sys.stdout.buffer.write(f.read())' "$1"; }
if command -v python3 >/dev/null; then
    body "$tmp/cm/checkpoint.safetensors" > "$tmp/cm.body"; body "$tmp/plain/checkpoint.safetensors" > "$tmp/plain.body"
    same causal-mod-tensors "$tmp/cm.body" "$tmp/plain.body"
fi

# ---- resume: 12 steps == 6 + 6 resumed, with and without the options given again ----
check p-first 0 "$flexc" train "${common[@]}" --steps 12 --until 6 --mask-mod "$prefix" --score-mod "$softcap" \
    --out "$tmp/pr" --threads 1
check p-second 0 "$flexc" train --resume --out "$tmp/pr" --threads 1 --quiet
same resume-checkpoint "$tmp/p/checkpoint.safetensors" "$tmp/pr/checkpoint.safetensors"
same resume-model "$tmp/p/model.safetensors" "$tmp/pr/model.safetensors"
same resume-losses <(losses "$tmp/p/metrics.jsonl") <(losses "$tmp/pr/metrics.jsonl")
check sc-first 0 "$flexc" train "${common[@]}" --steps 12 --until 5 --score-mod "$softcap" --out "$tmp/scr" --threads 1
check sc-second 0 "$flexc" train --resume --score-mod "$softcap" --out "$tmp/scr" --threads 1 --quiet
same resume-score-checkpoint "$tmp/sc/checkpoint.safetensors" "$tmp/scr/checkpoint.safetensors"

# ---- 1 and 2 threads agree bitwise ----
check p-threads2 0 "$flexc" train "${common[@]}" --steps 12 --mask-mod "$prefix" --score-mod "$softcap" --out "$tmp/p2" \
    --threads 2
same threads-checkpoint "$tmp/p/checkpoint.safetensors" "$tmp/p2/checkpoint.safetensors"
check w-threads2 0 "$flexc" train "${common[@]}" --steps 12 --mask-mod "$window" --out "$tmp/w2" --threads 2
same threads-window "$tmp/w/checkpoint.safetensors" "$tmp/w2/checkpoint.safetensors"

# ---- generate runs the mods (the same text at 1 and 2 threads); export refuses them ----
check gen 0 "$flexc" generate --ckpt "$tmp/p" --prompt "the quick" --tokens 40 --seed 5
cp "$tmp/out" "$tmp/gen1"
check gen-threads 0 "$flexc" generate --ckpt "$tmp/p" --prompt "the quick" --tokens 40 --seed 5 --threads 1
same gen-same "$tmp/gen1" "$tmp/out"
check gen-model-file 0 "$flexc" generate --ckpt "$tmp/w/model.safetensors" --tokens 30 --temperature 0
check gen-score 0 "$flexc" generate --ckpt "$tmp/al" --tokens 30 --seed 2
check export 1 "$flexc" export --ckpt "$tmp/p" --to "$tmp/hf"
has export-msg "$tmp/err" "was trained with attention mods (--mask-mod \"$prefix\", --score-mod \"$softcap\"), which a Hugging Face config cannot express"
[[ ! -e "$tmp/hf" ]] && ok || bad "a refused export left $tmp/hf behind"

# ---- fine-tuning a model with mods keeps them unless told otherwise ----
check finetune 0 "$flexc" train --model "$tmp/p" --data "$tmp/corpus.txt" --batch 4 --seq 48 --steps 1 --out "$tmp/ft" \
    --threads 1
has finetune-keeps "$tmp/out" "attention mask mod \"$prefix\", score mod \"$softcap\""
check finetune-attn 0 "$flexc" train --model "$tmp/p" --data "$tmp/corpus.txt" --batch 4 --seq 48 --steps 1 \
    --attn causal --out "$tmp/ft2" --threads 1
has finetune-attn-text "$tmp/out" "attention causal, score mod \"$softcap\""

# ---- refusals: usage errors that name the option ----
check bad-syntax 2 "$flexc" train "${common[@]}" --steps 2 --score-mod "score * (2 +" --out "$tmp/e"
has bad-syntax-msg "$tmp/err" "--score-mod: expr:13:"
check bad-name 2 "$flexc" train "${common[@]}" --steps 2 --mask-mod "q_idx >= kv_id" --out "$tmp/e"
has bad-name-msg "$tmp/err" "--mask-mod: expr:10: unknown name 'kv_id'"
check mask-as-score 2 "$flexc" train "${common[@]}" --steps 2 --score-mod "q_idx >= kv_idx" --out "$tmp/e"
has mask-as-score-msg "$tmp/err" "--score-mod: 'q_idx >= kv_idx' is a mask (its value is bool), not a score (a mask goes to --mask-mod)"
check score-as-mask 2 "$flexc" train "${common[@]}" --steps 2 --mask-mod "$softcap" --out "$tmp/e"
has score-as-mask-msg "$tmp/err" "--mask-mod: '$softcap' is not a mask"
check attn-and-mask 2 "$flexc" train "${common[@]}" --steps 2 --attn causal --mask-mod "$window" --out "$tmp/e"
has attn-and-mask-msg "$tmp/err" "--attn causal and --mask-mod both give the attention mask: pass one of them"
check dense-score 2 "$flexc" train "${common[@]}" --steps 2 --attn dense --score-mod "$softcap" --out "$tmp/e"
has dense-score-msg "$tmp/err" "--attn dense makes causality a score modifier of its own"
check tensor 2 "$flexc" train "${common[@]}" --steps 2 --score-mod "score + bias[h, 0]" --out "$tmp/e"
has tensor-msg "$tmp/err" "--score-mod: expr:9: unknown name 'bias'"
check mods-cuda 2 "$flexc" train "${common[@]}" --steps 2 --mask-mod "$window" --device cuda --out "$tmp/e"
has mods-cuda-msg "$tmp/err" "--device cuda does not take --mask-mod (attention mods run on the CPU)"
[[ ! -e "$tmp/e" ]] && ok || bad "a refused run left $tmp/e behind"
# A resume with other mods (or none where there were some) is refused, the checkpoint kept.
cp "$tmp/pr/checkpoint.safetensors" "$tmp/pr.ck"
check resume-other-mask 2 "$flexc" train --resume --mask-mod "$window" --out "$tmp/pr" --quiet
has resume-other-mask-msg "$tmp/err" "--resume: the checkpoint was trained with --mask-mod \"$prefix\", not \"$window\""
check resume-other-score 2 "$flexc" train --resume --score-mod "$alibi" --out "$tmp/pr" --quiet
has resume-other-score-msg "$tmp/err" "--resume: the checkpoint was trained with --score-mod \"$softcap\", not \"$alibi\""
check resume-attn 2 "$flexc" train --resume --attn causal --out "$tmp/pr" --quiet
has resume-attn-msg "$tmp/err" "--resume: the checkpoint was trained with --mask-mod \"$prefix\", not --attn causal"
check resume-new-score 2 "$flexc" train --resume --score-mod "$softcap" --out "$tmp/plain" --quiet
has resume-new-score-msg "$tmp/err" "--resume: the checkpoint was trained without --score-mod"
check resume-new-mask 2 "$flexc" train --resume --mask-mod "$window" --out "$tmp/plain" --quiet
has resume-new-mask-msg "$tmp/err" "--resume: the checkpoint was trained with --attn causal, not --mask-mod \"$window\""
same resume-refused-kept "$tmp/pr.ck" "$tmp/pr/checkpoint.safetensors"
finish cli_mods
