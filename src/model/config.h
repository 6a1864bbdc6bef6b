/*
 * The model's configuration (fx_model_config, include/flexc/model.h), its fields declared
 * once (internal).
 *
 * fx__config_fields lists every field with its key, its kind and, for sizes, its valid
 * range. Checkpoints and model files are written and read from this table (ckpt.c), two
 * configurations are compared with it (export, resume, the fuzz targets), configurations are
 * printed from it (fx__config_format), and fx__model_config_check draws its range checks from
 * it. A Hugging Face config.json parses into the same struct (src/hf/config.c): a field that
 * config.json spells as one key of its kind, or that a model class implies, says so here and
 * is read and written from the table; the sizes, RoPE, the window and the special ids have
 * rules of their own there.
 */
#ifndef FX_MODEL_CONFIG_H
#define FX_MODEL_CONFIG_H

#include <flexc/model.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum fx__field_kind {
    FX__FIELD_I64,  /* int64_t */
    FX__FIELD_F32,  /* float, finite */
    FX__FIELD_BOOL, /* bool, written 0 or 1 */
    FX__FIELD_STR,  /* char[64]: arch */
    FX__FIELD_ROPE, /* rope_scaling: "none" or "llama3:FACTOR:LOW:HIGH:ORIGINAL" */
    FX__FIELD_EOS   /* eos[n_eos]: "256" or "128001,128009" */
} fx__field_kind;

typedef struct fx__config_field {
    const char *key;     /* the metadata key, and the field's name in messages */
    fx__field_kind kind;
    size_t offset;       /* in fx_model_config */
    bool always;         /* in every file; else written since the model API, and a file without
                            it has the byte-level GPT's value (fx__config_field_default) */
    bool shape;          /* the tensors' names and shapes depend on it (fx__config_diff_shape;
                            the architecture table's rows are present by such bool fields) */
    int64_t lo, hi;      /* FX__FIELD_I64: the valid range */
    const char *hf;      /* FX__FIELD_BOOL or _I64: the Hugging Face config.json key that holds
                            it, as true/false or an integer in [lo, hi] (absent: false, 0),
                            read and written as such; NULL: none, or read by rules of its own */
    const char *hf_classes; /* FX__FIELD_BOOL: the Hugging Face model classes that always have
                            it ("A,B"): true for those, false for the others (and a model with
                            it is exported as one of them); NULL: none */
} fx__config_field;

extern const fx__config_field fx__config_fields[];
extern const size_t fx__config_nfields;

/* Field f of c as text, as files store it: "384", "9.99999975e-06", "none", "256,257". */
void fx__config_field_format(const fx__config_field *f, const fx_model_config *c, char *buf, size_t n);
/* A metadata value as an integer / a finite float32: FX_EFORMAT "'<where>': metadata '<key>'
   = '<text>' is not an integer" (" ... is not a finite number") otherwise. */
int fx__meta_parse_i64(const char *text, const char *where, const char *key, int64_t *out);
int fx__meta_parse_f32(const char *text, const char *where, const char *key, float *out);
/* Text into field f of c. FX_EFORMAT, its message "'<where>': metadata '<key>' = '<text>' is
   not ...", when the text is not a value of the field's kind (ranges are checked by
   fx__model_config_check). */
int fx__config_field_parse(const fx__config_field *f, fx_model_config *c, const char *text, const char *where);
/* Field f's value in files written before it was: head_dim 0 (dim / heads), no biases, a tied
   head, no window, no RoPE scaling, eos the byte vocabulary's end-of-text, arch flexc-gpt. */
void fx__config_field_default(const fx__config_field *f, fx_model_config *c);
/* The first field (in table order) on which a and b differ, or NULL when they agree on all.
   Floats compare by value. */
const fx__config_field *fx__config_diff(const fx_model_config *a, const fx_model_config *b);
/* The first field among the shape fields (vocab, layers, dim, heads, kv_heads, head_dim, ffn,
   qkv_bias, tied_embeddings: what the tensors' names and shapes depend on) on which a and b
   differ, or NULL. */
const fx__config_field *fx__config_diff_shape(const fx_model_config *a, const fx_model_config *b);
/* Whether Hugging Face model class `cls` ("Qwen2ForCausalLM") is one of field f's hf_classes. */
bool fx__config_hf_class(const fx__config_field *f, const char *cls);

/* c (checked by fx__model_config_check) as one line of key=value pairs, space-separated, in
   the table's order: "vocab=257 ctx=256 layers=6 dim=384 heads=6 kv_heads=2 ffn=1024
   rope_theta=10000 norm_eps=1e-05 head_dim=64" for the small preset. The fields every file has
   are always there; a later one is left out where it holds the value a file without it is
   read with (fx__config_field_default: arch flexc-gpt, no biases, a tied head, no window, no
   RoPE scaling, eos 256; head_dim, filled by the check, always shows). Values as files store
   them, but a float that is a whole number as one (rope_theta=10000), another in the fewest
   digits that read back as the same float (norm_eps=1e-05).
   Returns the length of the whole line, as snprintf does: buf gets at most n - 1 bytes of it,
   NUL-terminated when n > 0 (buf may be NULL when n is 0). */
size_t fx__config_format(const fx_model_config *c, char *buf, size_t n);

/* "tiny", "small", "gpt2": FX_EINVAL for another name. */
int fx__model_preset(fx_model_config *c, const char *name);
/* Checks every field (the message names it); fills head_dim (dim / heads) and ffn (8/3 C
   rounded up to 32) when 0, and arch when empty. */
int fx__model_config_check(fx_model_config *c);

#endif
