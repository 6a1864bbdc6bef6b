/*
 * The model's configuration (fx_model_config, include/flexc/model.h), its fields declared
 * once (internal).
 *
 * fx__config_fields lists every field with its key, its kind and, for sizes, its valid
 * range. Checkpoints and model files are written and read from this table (ckpt.c), two
 * configurations are compared with it (export, resume, the fuzz targets), and
 * fx__model_config_check draws its range checks from it. The Hugging Face config.json has
 * its own spellings and rules (src/hf/config.c) but parses into the same struct.
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
    int64_t lo, hi;      /* FX__FIELD_I64: the valid range */
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

/* "tiny", "small", "gpt2": FX_EINVAL for another name. */
int fx__model_preset(fx_model_config *c, const char *name);
/* Checks every field (the message names it); fills head_dim (dim / heads) and ffn (8/3 C
   rounded up to 32) when 0, and arch when empty. */
int fx__model_config_check(fx_model_config *c);

#endif
