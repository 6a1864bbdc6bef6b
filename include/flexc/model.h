/*
 * Decoder-only language models: flexc's own GPT and the Llama family (Llama, Mistral, Qwen2)
 * are configurations of one model, held in flat float32 buffers. See docs/model.md.
 *
 *     fx_model *m = NULL;
 *     int rc = fx_model_load(&m, "out");            // a training directory, a .safetensors
 *     if (rc != FX_OK)                                // file, or a Hugging Face directory
 *         fprintf(stderr, "%s: %s\n", fx_strerror(rc), fx_last_error());
 *
 *     // Training: loss, then gradients accumulated into the model's gradient buffer.
 *     float loss;
 *     rc = fx_model_forward(m, &loss, NULL, tokens, targets, B, T, FX_MODEL_GRAD);
 *     rc = fx_model_backward(m);
 *     ... update through fx_model_tensor_at(m, i, &t): t.data -= lr * t.grad ...
 *     fx_model_zero_grad(m);
 *
 *     // Generation with a KV cache sized for the longest sequence wanted (not the model's
 *     // context, which may be 131072 positions).
 *     fx_model_cache *c = NULL;
 *     rc = fx_model_cache_create(&c, m, 512);
 *     fx_generate_opts g = fx_generate_defaults();  // temperature 0.8, top_k 40, top_p 1
 *     g.max_tokens = 100, g.on_token = print_token, g.user = stdout;
 *     int32_t out[100]; int64_t n_out;
 *     rc = fx_model_generate(m, c, out, &n_out, prompt, n_prompt, &g);
 *     fx_model_cache_free(c);
 *     fx_model_free(m);
 *
 * The architecture (one transformer block, repeated `layers` times; pre-norm):
 *     x  = embed[tokens]
 *     x += Wo . attn(rope(Wq . rms(x) + bq), rope(Wk . rms(x) + bk), Wv . rms(x) + bv)
 *     x += W2 . (silu(W1 . rms(x)) * (W3 . rms(x)))
 *     logits = head . rms(x)          head = embed when tied_embeddings, else lm_head
 * RoPE rotates consecutive pairs (x[2i], x[2i+1]) by pos * freq[i]; a Hugging Face loader
 * permutes the rows of Wq and Wk (and bq, bk) from the rotate-half layout. Attention is
 * causal; with sliding_window W a query at position i sees the keys j with i - W < j <= i
 * (transformers' Mistral convention).
 *
 * Tensors (names as in checkpoints; [rows, cols], float32):
 *     wte [V, C]; per layer l: layers.l.norm1 [C], layers.l.attn.wq [Hq*hd, C],
 *     layers.l.attn.wk [Hkv*hd, C], layers.l.attn.wv [Hkv*hd, C], layers.l.attn.wo [C, Hq*hd],
 *     layers.l.norm2 [C], layers.l.mlp.w1 [F, C] (gate), layers.l.mlp.w3 [F, C] (up),
 *     layers.l.mlp.w2 [C, F] (down), with qkv_bias layers.l.attn.bq [Hq*hd],
 *     layers.l.attn.bk [Hkv*hd], layers.l.attn.bv [Hkv*hd]; norm [C]; lm_head [V, C] when not
 *     tied.
 *
 * Every call that can fail returns FX_OK or a negative fx_status and sets fx_last_error();
 * arguments are checked before any work, so outputs are untouched when a check fails.
 * Results are bitwise identical for any thread count. A model is not safe to use from two
 * threads at once (its activation buffers are shared); separate models are.
 */
#ifndef FLEXC_MODEL_H
#define FLEXC_MODEL_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration ---------------------------------------------------------------------- */

typedef enum fx_rope_scaling {
    FX_ROPE_SCALING_NONE = 0,
    FX_ROPE_SCALING_LLAMA3 = 1 /* transformers' rope_type "llama3" */
} fx_rope_scaling;

enum { FX_MODEL_MAX_EOS = 8 };

typedef struct fx_model_config {
    char arch[64];        /* "flexc-gpt", "LlamaForCausalLM", ...: a label, carried to files */
    int64_t vocab;        /* V: token ids are int32 in [0, V), V <= 2^31 - 1 */
    int64_t ctx;          /* the longest sequence the model is built for (positions) */
    int64_t layers;       /* L */
    int64_t dim;          /* C: the residual stream */
    int64_t heads;        /* Hq */
    int64_t kv_heads;     /* Hkv: grouped-query attention, Hq % Hkv == 0 */
    int64_t head_dim;     /* hd (even); 0: dim / heads. Hq * hd need not equal dim */
    int64_t ffn;          /* F: the SwiGLU hidden size; 0: 8/3 dim rounded up to 32 */
    float rope_theta;     /* base of the RoPE frequencies, > 1 */
    struct {
        fx_rope_scaling type;
        float factor;            /* llama3: the long-wavelength frequencies are divided by it */
        float low_freq_factor;   /* llama3: wavelengths above original / low_freq_factor are scaled */
        float high_freq_factor;  /* llama3: wavelengths below original / high_freq_factor are kept */
        int64_t original_max_position_embeddings;
    } rope_scaling;
    float norm_eps;       /* RMSNorm epsilon, > 0 */
    bool qkv_bias;        /* biases on the q, k, v projections (Qwen2) */
    bool tied_embeddings; /* the LM head is the embedding (else a separate lm_head [V, C]) */
    int64_t sliding_window; /* 0: none; W: a query at i sees keys j with i - W < j <= i */
    int32_t eos[FX_MODEL_MAX_EOS]; /* generation stops at any of these ids */
    int n_eos;
} fx_model_config;

/* "tiny", "small", "gpt2": flexc's byte-level GPT (vocabulary 257, end-of-text 256, tied
   embeddings). FX_EINVAL for another name. */
FX_API int fx_model_preset(fx_model_config *c, const char *name);
/* Checks every field (FX_EINVAL with a message naming the field) and fills the defaults
   (head_dim, ffn, arch when empty). */
FX_API int fx_model_config_validate(fx_model_config *c);

/* ---- the model --------------------------------------------------------------------------- */

typedef struct fx_model fx_model;

/* A model with parameters drawn from seed: N(0, 0.02) for matrices (the output projections
   scaled by 1/sqrt(2L)), ones for norms, zeros for biases. */
FX_API int fx_model_create(fx_model **out, const fx_model_config *c, uint64_t seed);
/* From a path:
     - a directory holding config.json: a Hugging Face model (Llama, Mistral, Qwen2);
     - a flexc training directory: its model.safetensors, else its checkpoint.safetensors;
     - a flexc .safetensors file (model or checkpoint).
   A file whose metadata format is not flexc's is refused from its header alone (FX_EFORMAT),
   and so are weights holding a NaN or an infinity, naming the tensor and the first bad index.
   Leaves *out untouched on failure. */
FX_API int fx_model_load(fx_model **out, const char *path);
/* For generation: a Hugging Face directory's weights stay in the mapped file, in its dtype
   (F32 used in place, BF16 and F16 widened to float32 tile by tile as each product reads
   them), so the model costs the file's pages and no copy. The first call that needs float32
   parameters (fx_model_forward, fx_model_tensor_at / _find, fx_model_save) reads them into
   memory as fx_model_load would, and closes the file. Other paths load as fx_model_load. */
FX_API int fx_model_load_inference(fx_model **out, const char *path);
FX_API void fx_model_free(fx_model *m);
FX_API const fx_model_config *fx_model_get_config(const fx_model *m);
/* Parameters (and elements of each of the model's gradient buffers). */
FX_API size_t fx_model_num_params(const fx_model *m);

/* Writes the weights in flexc's model format (float32, or bfloat16 rounded to nearest
   even), atomically; fx_model_load reads it back. */
FX_API int fx_model_save(const fx_model *m, const char *path, bool bf16);

/* ---- tensors ------------------------------------------------------------------------------ */

typedef struct fx_model_tensor {
    const char *name;  /* as in the table at the top; valid while the model lives */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];
    size_t numel;
    float *data;       /* the parameters, writable */
    float *grad;       /* the gradients, or NULL before the first forward with FX_MODEL_GRAD */
} fx_model_tensor;

FX_API size_t fx_model_tensor_count(const fx_model *m);
/* The i-th tensor in buffer order; FX_ERANGE when i >= fx_model_tensor_count. */
FX_API int fx_model_tensor_at(const fx_model *m, size_t i, fx_model_tensor *out);
/* FX_EINVAL when the model has no tensor of that name. */
FX_API int fx_model_tensor_find(const fx_model *m, const char *name, fx_model_tensor *out);

/* ---- forward and backward --------------------------------------------------------------- */

enum {
    FX_MODEL_GRAD = 1,        /* keep what fx_model_backward needs (needs targets) */
    FX_MODEL_LOGITS_LAST = 2  /* logits of each sequence's last position only: [B, V] */
};

/* tokens [B, T] (ids in [0, V)), targets [B, T] or NULL (ids in [0, V), or -100: ignored).
   loss: the mean cross-entropy over the targets that are not ignored (NULL: not wanted;
   needs targets). logits: [B, T, V], or [B, V] with FX_MODEL_LOGITS_LAST; NULL: not made
   (the loss never needs them: it is fused). T <= ctx. With FX_MODEL_GRAD the gradient
   buffer is allocated on first use (zeroed), and the loss's gradient with respect to the
   LM head is accumulated during this call; fx_model_backward must follow before the next
   forward with FX_MODEL_GRAD. */
FX_API int fx_model_forward(fx_model *m, float *loss, float *logits, const int32_t *tokens, const int32_t *targets,
                            int64_t B, int64_t T, unsigned flags);
/* Accumulates (+=) the gradients of the last forward's mean loss into the gradient buffer
   (see fx_model_tensor.grad): several forward/backward pairs sum their gradients. */
FX_API int fx_model_backward(fx_model *m);
/* Sets the gradient buffer to zero (no-op before it exists). */
FX_API void fx_model_zero_grad(fx_model *m);

/* ---- generation ----------------------------------------------------------------------------- */

/* The keys and values of one sequence, for up to max_len positions (1 <= max_len <= ctx):
   memory L * 2 * Hkv * hd * max_len floats, plus scratch. */
typedef struct fx_model_cache fx_model_cache;
FX_API int fx_model_cache_create(fx_model_cache **out, fx_model *m, int64_t max_len);
FX_API void fx_model_cache_free(fx_model_cache *c);
FX_API int64_t fx_model_cache_len(const fx_model_cache *c);     /* positions held */
FX_API int64_t fx_model_cache_capacity(const fx_model_cache *c); /* max_len */
FX_API void fx_model_cache_reset(fx_model_cache *c);             /* len = 0 */

/* Starts the sequence over with tokens [n] at positions 0 .. n-1 and writes the logits of
   the last one to logits [V]. FX_ERANGE when n exceeds the capacity (cache untouched). */
FX_API int fx_model_prefill(fx_model *m, fx_model_cache *c, float *logits, const int32_t *tokens, int64_t n);
/* Appends one token at position len; logits [V]. FX_ERANGE when the cache is full. */
FX_API int fx_model_decode_step(fx_model *m, fx_model_cache *c, float *logits, int32_t token);

typedef struct fx_sample_opts {
    float temperature; /* 0: greedy (the lowest id among equal maxima) */
    int64_t top_k;     /* keep the k most likely (0: all) */
    float top_p;       /* then the smallest set of them whose probability reaches p (1: all) */
} fx_sample_opts;

/* One token from logits [V]: softmax(logits / temperature) restricted by top_k, then top_p,
   one uniform number drawn from rng (not at temperature 0). scratch: V int32 and V double
   (fx_sample_scratch_bytes(V)), so sampling allocates nothing. */
FX_API size_t fx_sample_scratch_bytes(int64_t V);
FX_API int fx_sample(int32_t *token, const float *logits, int64_t V, const fx_sample_opts *o, fx_rng *rng,
                     void *scratch);

/* Called with each generated token; a non-zero return stops generation (not an error). */
typedef int (*fx_token_fn)(int32_t token, void *user);

typedef struct fx_generate_opts {
    int64_t max_tokens;   /* at most this many new tokens */
    fx_sample_opts sample;
    uint64_t seed;        /* the sampler's stream: the same seed, the same text */
    bool stop_at_eos;     /* stop after producing any of the config's eos ids (it is kept in out) */
    fx_token_fn on_token; /* may be NULL */
    void *user;
} fx_generate_opts;

/* max_tokens 256, temperature 0.8, top_k 40, top_p 1, seed 1, stop_at_eos. */
FX_API fx_generate_opts fx_generate_defaults(void);
/* Prefills prompt [n_prompt] (n_prompt >= 1), then samples up to max_tokens tokens into
   out [max_tokens], stopping early at an eos id, when on_token says so, or when the cache
   is full; *n_out says how many were written. */
FX_API int fx_model_generate(fx_model *m, fx_model_cache *c, int32_t *out, int64_t *n_out, const int32_t *prompt,
                             int64_t n_prompt, const fx_generate_opts *o);

#ifdef __cplusplus
}
#endif

#endif /* FLEXC_MODEL_H */
