#!/usr/bin/env python3
"""Writes tests/model_fixtures.h: reference values from Hugging Face transformers for
tests/test_model.c, which must not need Python or PyTorch to run.

  - the RoPE inverse frequencies of rope_type "llama3" for a few configurations;
  - three tiny models (Qwen2 with q/k/v biases and an untied head, Llama with llama3 RoPE
    scaling, Mistral with a sliding window; head_dim != hidden_size / heads in all three)
    with random weights, converted to flexc's layout, and their float64 logits.

flexc's RoPE rotates consecutive pairs (2i, 2i+1) where transformers rotates (i, i + hd/2),
so the rows of q_proj and k_proj (and their biases) are permuted per head: flexc row 2i is
transformers row i, flexc row 2i+1 is row i + hd/2. q.k is unchanged.

Usage: python3 scripts/make_model_fixtures.py > tests/model_fixtures.h
"""
import sys

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

out = sys.stdout


def floats(xs, suffix="f"):
    return ", ".join(float(x).hex() + suffix for x in xs)


# ---- llama3 RoPE frequencies ----------------------------------------------------------------

ROPE_CASES = [
    # head_dim, theta, factor, low, high, original
    (128, 500000.0, 8.0, 1.0, 4.0, 8192),   # Llama 3.1 8B
    (64, 500000.0, 32.0, 1.0, 4.0, 8192),   # Llama 3.2 1B
    (6, 10000.0, 8.0, 1.0, 4.0, 8),         # the tests' small model: one frequency per band
]

# ---- tiny models --------------------------------------------------------------------------------

V, C, F, L, HQ, HKV, HD, T, CTX = 16, 8, 16, 2, 2, 1, 6, 10, 32


def perm_rows(w, heads, hd):
    """transformers' rotate-half row order -> flexc's interleaved pairs, per head."""
    idx = []
    for h in range(heads):
        for i in range(hd // 2):
            idx += [h * hd + i, h * hd + hd // 2 + i]
    return w[idx]


def convert(sd, cfg, tied):
    t = {"wte": sd["model.embed_tokens.weight"]}
    for l in range(L):
        p = f"model.layers.{l}."
        q = f"layers.{l}."
        t[q + "norm1"] = sd[p + "input_layernorm.weight"]
        t[q + "attn.wq"] = perm_rows(sd[p + "self_attn.q_proj.weight"], HQ, HD)
        t[q + "attn.wk"] = perm_rows(sd[p + "self_attn.k_proj.weight"], HKV, HD)
        t[q + "attn.wv"] = sd[p + "self_attn.v_proj.weight"]
        t[q + "attn.wo"] = sd[p + "self_attn.o_proj.weight"]
        t[q + "norm2"] = sd[p + "post_attention_layernorm.weight"]
        t[q + "mlp.w1"] = sd[p + "mlp.gate_proj.weight"]
        t[q + "mlp.w3"] = sd[p + "mlp.up_proj.weight"]
        t[q + "mlp.w2"] = sd[p + "mlp.down_proj.weight"]
        if p + "self_attn.q_proj.bias" in sd:
            t[q + "attn.bq"] = perm_rows(sd[p + "self_attn.q_proj.bias"], HQ, HD)
            t[q + "attn.bk"] = perm_rows(sd[p + "self_attn.k_proj.bias"], HKV, HD)
            t[q + "attn.bv"] = sd[p + "self_attn.v_proj.bias"]
    t["norm"] = sd["model.norm.weight"]
    if not tied:
        t["lm_head"] = sd["lm_head.weight"]
    return t


def make(kind, seed):
    common = dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=HQ,
                  num_key_value_heads=HKV, head_dim=HD, max_position_embeddings=CTX, rms_norm_eps=1e-5)
    scaling = None
    window = 0
    if kind == "qwen2":
        tied, bias = False, True
        cfg = Qwen2Config(tie_word_embeddings=False, **common)
        model = Qwen2ForCausalLM(cfg)
    elif kind == "llama3":
        tied, bias = True, False
        scaling = (8.0, 1.0, 4.0, 8)
        cfg = LlamaConfig(tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}, **common)
        model = LlamaForCausalLM(cfg)
    else:
        tied, bias = False, False
        window = 4
        cfg = MistralConfig(tie_word_embeddings=False, sliding_window=window, **common)
        model = (MistralForCausalLM(cfg))
    cfg._attn_implementation = "eager"
    model.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    tokens = torch.randint(0, V, (1, T), generator=g)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model = model.double().eval()
    with torch.no_grad():
        logits = model(tokens).logits[0]
    return dict(kind=kind, tied=tied, bias=bias, scaling=scaling, window=window, tensors=convert(sd, cfg, tied),
                tokens=tokens[0].tolist(), logits=logits.flatten().tolist())


def main():
    out.write("/* Generated by scripts/make_model_fixtures.py from transformers %s: do not edit. */\n"
              % __import__("transformers").__version__)
    out.write("#ifndef FXT_MODEL_FIXTURES_H\n#define FXT_MODEL_FIXTURES_H\n\n#include <stdint.h>\n\n")
    out.write("typedef struct fxt_rope_case {\n    int64_t head_dim;\n    float theta, factor, low, high;\n"
              "    int64_t original;\n    const float *inv_freq; /* [head_dim / 2], float32 as transformers computes it */\n"
              "} fxt_rope_case;\n\n")
    for i, (hd, theta, fa, lo, hi, orig) in enumerate(ROPE_CASES):
        cfg = LlamaConfig(hidden_size=hd, num_attention_heads=1, head_dim=hd, max_position_embeddings=131072,
                          rope_parameters={"rope_type": "llama3", "rope_theta": theta, "factor": fa,
                                           "low_freq_factor": lo, "high_freq_factor": hi,
                                           "original_max_position_embeddings": orig})
        inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
        out.write("static const float fxt_rope_inv_freq_%d[] = {%s};\n" % (i, floats(inv.tolist())))
    out.write("static const fxt_rope_case fxt_rope_cases[] = {\n")
    for i, (hd, theta, fa, lo, hi, orig) in enumerate(ROPE_CASES):
        out.write("    {%d, %sf, %sf, %sf, %sf, %d, fxt_rope_inv_freq_%d},\n" % (hd, theta, fa, lo, hi, orig, i))
    out.write("};\n\n")

    out.write("typedef struct fxt_hf_tensor {\n    const char *name;\n    int64_t numel;\n    const float *data;\n"
              "} fxt_hf_tensor;\n\n")
    out.write("typedef struct fxt_hf_case {\n    const char *arch;\n    int64_t vocab, ctx, layers, dim, heads, kv_heads, "
              "head_dim, ffn;\n    float theta, norm_eps;\n    int llama3; /* rope_scaling below applies */\n"
              "    float factor, low, high;\n    int64_t original;\n    int qkv_bias, tied;\n    int64_t window;\n"
              "    int n_tensors;\n    const fxt_hf_tensor *tensors;\n    int64_t T;\n    const int32_t *tokens;\n"
              "    const double *logits; /* [T, vocab], float64 */\n} fxt_hf_case;\n\n")
    cases = [make("qwen2", 1), make("llama3", 2), make("mistral", 3)]
    archs = {"qwen2": "Qwen2ForCausalLM", "llama3": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
    for c in cases:
        k = c["kind"]
        names = list(c["tensors"])
        for j, n in enumerate(names):
            out.write("static const float fxt_%s_t%d[] = {%s};\n" % (k, j, floats(c["tensors"][n].flatten().tolist())))
        out.write("static const fxt_hf_tensor fxt_%s_tensors[] = {\n" % k)
        for j, n in enumerate(names):
            out.write('    {"%s", %d, fxt_%s_t%d},\n' % (n, c["tensors"][n].numel(), k, j))
        out.write("};\n")
        out.write("static const int32_t fxt_%s_tokens[] = {%s};\n" % (k, ", ".join(map(str, c["tokens"]))))
        out.write("static const double fxt_%s_logits[] = {%s};\n\n" % (k, floats(c["logits"], "")))
    out.write("static const fxt_hf_case fxt_hf_cases[] = {\n")
    for c in cases:
        k = c["kind"]
        sc = c["scaling"] or (0.0, 0.0, 0.0, 0)
        out.write('    {"%s", %d, %d, %d, %d, %d, %d, %d, %d, 10000.0f, 1e-5f, %d, %sf, %sf, %sf, %d, %d, %d, %d, %d, '
                  "fxt_%s_tensors, %d, fxt_%s_tokens, fxt_%s_logits},\n"
                  % (archs[k], V, CTX, L, C, HQ, HKV, HD, F, 1 if c["scaling"] else 0, sc[0], sc[1], sc[2], sc[3],
                     1 if c["bias"] else 0, 1 if c["tied"] else 0, c["window"], len(c["tensors"]), k, T, k, k))
    out.write("};\n\n#endif\n")


if __name__ == "__main__":
    main()
