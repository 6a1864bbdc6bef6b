/* A run's hyper-parameters, their ranges declared once (run_params.h). */
#include "run_params.h"

#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define P(key, option, range, lo, hi) \
    {#key, option, FX__RUN_##range, offsetof(fx__model_train_state, key), lo, hi}
const fx__run_param fx__run_params[] = {
    P(step, NULL, I64, 0, INT64_MAX),
    P(data_pos, NULL, I64, 0, INT64_MAX),
    P(steps, "--steps", I64, 1, INT64_MAX),
    P(warmup, "--warmup", I64, 0, INT64_MAX),
    P(batch, "--batch", I64, 1, 65536),
    P(seq, "--seq", SEQ, 1, 0),
    P(accum, "--accum", I64, 1, 65536),
    P(lr, "--lr", POSITIVE, 0, 0),
    P(min_lr, "--min-lr", NONNEG, 0, 0),
    P(weight_decay, "--weight-decay", NONNEG, 0, 0),
    P(clip, "--clip", NONNEG, 0, 0),
    P(beta1, NULL, UNIT, 0, 0),
    P(beta2, NULL, UNIT, 0, 0),
    P(seed, "--seed", U64, 0, INT64_MAX),
};
#undef P
const size_t fx__run_nparams = sizeof fx__run_params / sizeof fx__run_params[0];

#define CAT(type, s, p) ((const type *)((const char *)(s) + (p)->offset))

static bool fx__run_is_float(const fx__run_param *p)
{
    return p->range == FX__RUN_POSITIVE || p->range == FX__RUN_NONNEG || p->range == FX__RUN_UNIT;
}

const fx__run_param *fx__run_param_find(const char *key)
{
    for (size_t i = 0; i < fx__run_nparams; i++)
        if (!strcmp(fx__run_params[i].key, key))
            return &fx__run_params[i];
    return NULL;
}

bool fx__run_param_ok_i64(const fx__run_param *p, int64_t v, int64_t ctx)
{
    switch (p->range) {
    case FX__RUN_I64: return v >= p->lo && v <= p->hi;
    case FX__RUN_SEQ: return v >= 1 && v <= ctx;
    case FX__RUN_U64: return v >= 0;
    default: return false;
    }
}

bool fx__run_param_ok_f32(const fx__run_param *p, float v)
{
    switch (p->range) {
    case FX__RUN_POSITIVE: return v > 0 && isfinite(v);
    case FX__RUN_NONNEG: return v >= 0 && isfinite(v);
    case FX__RUN_UNIT: return v >= 0 && v < 1;
    default: return false;
    }
}

void fx__run_param_rule(const fx__run_param *p, int64_t ctx, char *buf, size_t n)
{
    switch (p->range) {
    case FX__RUN_I64:
        if (p->hi == INT64_MAX)
            snprintf(buf, n, "must be >= %lld", (long long)p->lo);
        else
            snprintf(buf, n, "is outside [%lld, %lld]", (long long)p->lo, (long long)p->hi);
        break;
    case FX__RUN_SEQ: snprintf(buf, n, "is outside [1, %lld]", (long long)ctx); break;
    case FX__RUN_U64: snprintf(buf, n, "must be >= 0"); break;
    case FX__RUN_POSITIVE: snprintf(buf, n, "must be > 0"); break;
    case FX__RUN_NONNEG: snprintf(buf, n, "must be >= 0"); break;
    case FX__RUN_UNIT: snprintf(buf, n, "must be in [0, 1)"); break;
    }
}

void fx__run_param_format(const fx__run_param *p, const fx__model_train_state *s, char *buf, size_t n)
{
    if (fx__run_is_float(p))
        snprintf(buf, n, "%.9g", (double)*CAT(float, s, p));
    else if (p->range == FX__RUN_U64)
        /* As a file keeps it: signed. */
        snprintf(buf, n, "%lld", (long long)*CAT(uint64_t, s, p));
    else
        snprintf(buf, n, "%lld", (long long)*CAT(int64_t, s, p));
}

const fx__run_param *fx__run_params_check(const fx__model_train_state *s, int64_t ctx, bool *order)
{
    *order = false;
    for (size_t i = 0; i < fx__run_nparams; i++) {
        const fx__run_param *p = &fx__run_params[i];
        bool ok = fx__run_is_float(p) ? fx__run_param_ok_f32(p, *CAT(float, s, p))
                  : p->range == FX__RUN_U64 ? fx__run_param_ok_i64(p, (int64_t)*CAT(uint64_t, s, p), ctx)
                                            : fx__run_param_ok_i64(p, *CAT(int64_t, s, p), ctx);
        if (!ok)
            return p;
    }
    if (s->min_lr > s->lr) {
        *order = true;
        return fx__run_param_find("min_lr");
    }
    return NULL;
}
