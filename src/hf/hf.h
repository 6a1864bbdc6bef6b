/*
 * Hugging Face models: the Llama family (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM) read from, and written back to, a transformers model directory
 * (internal to the library; see docs/models.md).
 *
 *   config.json (+ generation_config.json)  -> fx__hf_config     every field checked, anything
 *                                                               the model cannot run refused
 *   model.safetensors | *.index.json + shards -> fx__hf_model    every tensor named, shaped
 *                                                               and typed before any is read
 *   fx__hf_tensor_read                        -> float32 in flexc's layout
 *   fx__hf_export                             <- float32 in flexc's layout, written in the
 *                                                               source dtype (bitwise round trip)
 *
 * RoPE. transformers rotates the two halves of each head (x[i] with x[i + hd/2], frequency i);
 * flexc rotates interleaved pairs (x[2i] with x[2i+1], frequency i). The rows of q_proj and
 * k_proj (and their biases) are permuted per head at load, flexc row 2i+s <- HF row i + s*hd/2,
 * and back at export. q.k is a sum over the head dimension, so the attention scores (and
 * everything after them) are unchanged; v and o_proj are not touched. A model loaded for
 * generation only (fx__hf_load_mapped) reads q_proj and k_proj unpermuted from the mapped file
 * and its decoding rotates halves instead.
 *
 *     fx__hf_model *m;
 *     if (fx__hf_open(&m, "path/to/model") != FX_OK) ... fx_last_error() names the problem
 *     for (size_t i = 0; i < m->n; i++)
 *         fx__hf_tensor_read(m, i, params + offset_of(m->t[i].name));
 *     fx__hf_close(m);
 */
#ifndef FX_HF_H
#define FX_HF_H

#include "core/core.h"

#include <flexc/model.h>
#include <flexc/safetensors.h>


/* ---- configuration ------------------------------------------------------------------------- */

typedef enum fx__hf_arch { FX__HF_LLAMA = 0, FX__HF_MISTRAL = 1, FX__HF_QWEN2 = 2 } fx__hf_arch;

/* The model's configuration is flexc's own (fx_model_config: arch the class name, ctx
   max_position_embeddings, floats as the model runs them); a config.json adds only the start
   id and the dtype the weights were saved in. */
typedef struct fx__hf_config {
    fx_model_config m;
    fx__hf_arch arch;            /* m.arch's class */
    int64_t bos;                 /* -1: none (generation_config.json first, then config.json) */
    fx_dtype dtype;              /* "dtype" (or "torch_dtype"): float32, bfloat16, float16; F32
                                    when absent. What export writes by default. */
} fx__hf_config;

/* "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM". */
const char *fx__hf_arch_name(fx__hf_arch a);

/* Parses config.json text (and generation_config.json text, gen may be NULL) into c. Refuses,
   naming the field: an architecture other than the three (FX_EUNSUPPORTED), a rope_scaling /
   rope_parameters type other than default or llama3, quantization_config, a hidden_act other
   than silu, attention_bias or mlp_bias (biases other than Qwen2's q/k/v), partial rotary
   embeddings, a Qwen2 sliding window on some layers only; a missing or malformed field, sizes
   that disagree or that the model cannot be built with (fx_model_config_validate)
   (FX_EFORMAT). c is written only on success. */
int fx__hf_config_parse(fx__hf_config *c, const char *config, size_t config_len, const char *gen,
                        size_t gen_len);
/* The same from dir/config.json and dir/generation_config.json (optional). */
int fx__hf_config_read(fx__hf_config *c, const char *dir);

/* Reads a small text file (at most 64 MiB) whole, NUL-terminated, *out fx__alloc'd: fx__read_regular
   with the path in the message. */
int fx__hf_read_text(char **out, size_t *len, const char *path);

/* config.json text for c in transformers' current spelling (rope_parameters), float32 dtype
   named by `dtype` ("float32", "bfloat16", "float16"). *out is fx__alloc'd, NUL-terminated. */
int fx__hf_config_json(char **out, const fx__hf_config *c, const char *dtype);
/* generation_config.json text: bos and eos (an int when one id, else a list). */
int fx__hf_generation_json(char **out, const fx__hf_config *c);

/* ---- tensors ------------------------------------------------------------------------------- */

typedef struct fx__hf_tensor {
    char name[64];     /* flexc's name: "wte", "layers.3.attn.wq", "layers.3.attn.bq", "norm", "lm_head" */
    char hf_name[96];  /* "model.layers.3.self_attn.q_proj.weight" */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* as in both layouts ([rows, cols] or [n]) */
    int64_t rope_heads;/* > 0: rows are RoPE'd heads of head_dim rows, permuted between layouts */
} fx__hf_tensor;

/* The tensors of c in the architecture table's order (src/model/arch.h), with their Hugging
   Face names. *out is fx__alloc'd. */
int fx__hf_layout(fx__hf_tensor **out, size_t *n, const fx_model_config *c);

/* Row permutations of a RoPE'd tensor (rows = heads * head_dim, each row `cols` wide; cols = 1
   for a bias): HF's rotate-half order <-> flexc's interleaved order. Plain copies, dst != src. */
void fx__hf_rows_to_flexc(float *dst, const float *src, int64_t heads, int64_t head_dim, int64_t cols);
void fx__hf_rows_to_hf(float *dst, const float *src, int64_t heads, int64_t head_dim, int64_t cols);

/* ---- a model directory --------------------------------------------------------------------- */

typedef struct fx__hf_model {
    fx__hf_config c;
    fx__hf_tensor *t;              /* [n], flexc order */
    size_t n;
    const fx_tensor_view **views;  /* [n]: each tensor in its (mapped) file */
    fx_dtype dtype;                /* the weights' dtype (F32, BF16 or F16; all tensors share it) */
    int64_t params;                /* parameters in total */
    char *config_text;             /* config.json as read (export writes it back) */
    char *gen_text;                /* generation_config.json as read, NULL when absent */
    fx_safetensors *file;          /* model.safetensors, or ... */
    fx_safetensors_index *index;   /* ... model.safetensors.index.json and its shards */
} fx__hf_model;

/* Opens dir: the configuration, then the weights (model.safetensors, else
   model.safetensors.index.json), and checks every tensor before returning: one expected is
   missing, one is not expected, a shape disagrees with the configuration, a dtype is not F32,
   BF16 or F16, or the tensors mix dtypes -> FX_EFORMAT / FX_EUNSUPPORTED naming the tensor.
   (rotary_emb.inv_freq buffers some checkpoints carry are derived data and skipped; a tied
   model's lm_head.weight is accepted when it equals the embedding.) */
int fx__hf_open(fx__hf_model **out, const char *dir);
void fx__hf_close(fx__hf_model *m);
/* Index of flexc tensor `name` in m->t, or -1. */
int64_t fx__hf_find(const fx__hf_tensor *t, size_t n, const char *name);
/* dst [numel] = tensor i widened to float32 in flexc's row order. dst must not overlap the file. */
int fx__hf_tensor_read(const fx__hf_model *m, size_t i, float *dst);
/* Drops tensor i's pages of the file mapping from memory once it has been read, so a load
   holds the model plus one tensor rather than the model plus its file (the file pages count
   in the resident set). The view stays valid: reading it again faults the pages back in. */
void fx__hf_tensor_release(const fx__hf_model *m, size_t i);

/* ---- export -------------------------------------------------------------------------------- */

typedef struct fx__hf_export_spec {
    const fx__hf_config *c;
    const float *const *data;  /* [n] tensors of fx__hf_layout(c) in flexc's layout, float32 */
    fx_dtype dtype;            /* F32, BF16 or F16: what model.safetensors stores */
    const char *config_text;   /* config.json to write as is; NULL: generated from c */
    const char *gen_text;      /* generation_config.json as is; NULL: generated from c */
    const char *tokenizer_dir; /* tokenizer files copied from here when present; may be NULL */
} fx__hf_export_spec;

/* Writes dir (created if missing; existing files of the same names are replaced):
   config.json, generation_config.json, model.safetensors (rows back in HF order, narrowed to
   dtype with round to nearest even, so a tensor read from that dtype is written back bitwise),
   and tokenizer.json / tokenizer_config.json / special_tokens_map.json / tokenizer.model
   copied from tokenizer_dir. */
int fx__hf_export(const char *dir, const fx__hf_export_spec *s);

/* ---- into an fx_model ------------------------------------------------------------------------ */

/* Loads the Hugging Face model in dir into a new fx_model (what fx_model_load calls for a
   directory that holds config.json; *out untouched on failure): float32 parameters, rows
   of q and k in flexc's interleaved order. */
int fx__hf_load(fx_model **out, const char *dir);
/* The same for generation (fx_model_load_inference): the file stays mapped and the model
   reads its matrices there, in the file's dtype and row order (mapped weights, see
   src/model/model.h); norms and biases are widened to float32. No parameter buffer. */
int fx__hf_load_mapped(fx_model **out, const char *dir);
/* For export: the HF configuration of a model (arch as its label says; flexc's own GPT
   becomes LlamaForCausalLM). bos is -1, dtype F32. FX_EUNSUPPORTED when no architecture here carries the model
   (q/k/v biases outside Qwen2, a window on a Llama). */
int fx__hf_config_from_model(fx__hf_config *c, const fx_model_config *mc);

#endif
