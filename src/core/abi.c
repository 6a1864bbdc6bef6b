/* The layouts of the public structs that callers allocate and other languages mirror
   (python/flexc/_lib.py with ctypes): their sizes and their fields' offsets and sizes, as this
   build of the library compiled them (fx_abi_layout, fx_abi_field in flexc.h).
   tests/python/test_abi.py checks every ctypes.Structure of the package against this table.

   A field added to one of these structs is one FIELD line here, in declaration order; a new
   mirrored struct is one field list and one row of `structs`. */
#include <stddef.h>
#include <string.h>

#include <flexc.h>

#include "core/core.h"

typedef struct abi_field {
    const char *name;
    size_t offset, size;
} abi_field;

typedef struct abi_struct {
    const char *name;
    size_t size;
    const abi_field *fields;
    size_t nfields;
} abi_struct;

#define FIELD(T, f) {#f, offsetof(T, f), sizeof(((T *)0)->f)}

static const abi_field attention_fields[] = {
    FIELD(fx_attention, B),         FIELD(fx_attention, Hq),
    FIELD(fx_attention, Hkv),       FIELD(fx_attention, Lq),
    FIELD(fx_attention, Lkv),       FIELD(fx_attention, D),
    FIELD(fx_attention, Dv),        FIELD(fx_attention, scale),
    FIELD(fx_attention, q_offset),  FIELD(fx_attention, mask),
    FIELD(fx_attention, score_mod), FIELD(fx_attention, score_mod_grad),
    FIELD(fx_attention, score_ctx), FIELD(fx_attention, device),
    FIELD(fx_attention, stream),    FIELD(fx_attention, dtype),
};

static const abi_field lce_fields[] = {
    FIELD(fx_lce, N),           FIELD(fx_lce, D),
    FIELD(fx_lce, V),           FIELD(fx_lce, ignore_index),
    FIELD(fx_lce, reduction),   FIELD(fx_lce, label_smoothing),
    FIELD(fx_lce, z_loss),      FIELD(fx_lce, softcap),
    FIELD(fx_lce, chunk),       FIELD(fx_lce, vocab_chunk),
    FIELD(fx_lce, device),      FIELD(fx_lce, stream),
    FIELD(fx_lce, dtype),
};

static const abi_field sliding_window_fields[] = {
    FIELD(fx_mask_sliding_window_ctx, window),
};

static const abi_field prefix_lm_fields[] = {
    FIELD(fx_mask_prefix_lm_ctx, prefix_len),
    FIELD(fx_mask_prefix_lm_ctx, n),
};

static const abi_field document_fields[] = {
    FIELD(fx_mask_document_ctx, doc_ids),
    FIELD(fx_mask_document_ctx, len),
    FIELD(fx_mask_document_ctx, batch_stride),
};

static const abi_field pair_fields[] = {
    FIELD(fx_mask_pair_ctx, a),
    FIELD(fx_mask_pair_ctx, a_ctx),
    FIELD(fx_mask_pair_ctx, b),
    FIELD(fx_mask_pair_ctx, b_ctx),
};

static const abi_field alibi_fields[] = {
    FIELD(fx_score_alibi_ctx, slopes),
};

static const abi_field softcap_fields[] = {
    FIELD(fx_score_softcap_ctx, cap),
};

static const abi_field rel_bias_fields[] = {
    FIELD(fx_score_rel_bias_ctx, table), FIELD(fx_score_rel_bias_ctx, grad_table),
    FIELD(fx_score_rel_bias_ctx, size),  FIELD(fx_score_rel_bias_ctx, zero),
    FIELD(fx_score_rel_bias_ctx, heads),
};

static const abi_field mod_tensor_fields[] = {
    FIELD(fx_mod_tensor, name),  FIELD(fx_mod_tensor, dtype), FIELD(fx_mod_tensor, ndim),
    FIELD(fx_mod_tensor, shape), FIELD(fx_mod_tensor, data),  FIELD(fx_mod_tensor, grad),
};

#undef FIELD

#define STRUCT(T, fields) {#T, sizeof(T), fields, sizeof fields / sizeof fields[0]}

static const abi_struct structs[] = {
    STRUCT(fx_attention, attention_fields),
    STRUCT(fx_lce, lce_fields),
    STRUCT(fx_mask_sliding_window_ctx, sliding_window_fields),
    STRUCT(fx_mask_prefix_lm_ctx, prefix_lm_fields),
    STRUCT(fx_mask_document_ctx, document_fields),
    STRUCT(fx_mask_pair_ctx, pair_fields),
    STRUCT(fx_score_alibi_ctx, alibi_fields),
    STRUCT(fx_score_softcap_ctx, softcap_fields),
    STRUCT(fx_score_rel_bias_ctx, rel_bias_fields),
    STRUCT(fx_mod_tensor, mod_tensor_fields),
};

#undef STRUCT

static const abi_struct *find_struct(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof structs / sizeof structs[0]; i++)
        if (strcmp(structs[i].name, name) == 0)
            return &structs[i];
    return NULL;
}

int fx_abi_layout(const char *struct_name, const char *field, size_t *offset, size_t *size)
{
    const abi_struct *s = find_struct(struct_name);
    if (!s)
        return fx__error(FX_EINVAL, "fx_abi_layout: no public struct named %s in this table",
                         struct_name ? struct_name : "(NULL)");
    if (!field) {
        if (offset)
            *offset = 0;
        if (size)
            *size = s->size;
        return FX_OK;
    }
    for (size_t i = 0; i < s->nfields; i++)
        if (strcmp(s->fields[i].name, field) == 0) {
            if (offset)
                *offset = s->fields[i].offset;
            if (size)
                *size = s->fields[i].size;
            return FX_OK;
        }
    return fx__error(FX_EINVAL, "fx_abi_layout: %s has no field named %s", s->name, field);
}

const char *fx_abi_field(const char *struct_name, size_t i)
{
    const abi_struct *s = find_struct(struct_name);
    return s && i < s->nfields ? s->fields[i].name : NULL;
}

const char *fx_abi_struct(size_t i)
{
    return i < sizeof structs / sizeof structs[0] ? structs[i].name : NULL;
}
