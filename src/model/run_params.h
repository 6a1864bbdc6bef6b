/*
 * A run's hyper-parameters (the training state's fields, fx__model_train_state in model.h),
 * their valid ranges declared once (internal).
 *
 * fx__run_params lists each checked field with its checkpoint metadata key, the train option
 * that sets it and its range. `flexc train` checks its options with it (the option's name and
 * the value as given in the message) and the checkpoint reader checks what it reads back
 * (ckpt.c: the file, the key and the value), so a checkpoint cannot hand a resume a value the
 * command line would refuse.
 */
#ifndef FX_MODEL_RUN_PARAMS_H
#define FX_MODEL_RUN_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fx__model_train_state;

typedef enum fx__run_range {
    FX__RUN_I64,      /* int64_t in [lo, hi]; hi INT64_MAX: no upper bound */
    FX__RUN_SEQ,      /* int64_t in [1, the model's context] */
    FX__RUN_U64,      /* uint64_t in [0, INT64_MAX] (files keep it as a signed integer) */
    FX__RUN_POSITIVE, /* float > 0 */
    FX__RUN_NONNEG,   /* float >= 0 */
    FX__RUN_UNIT      /* float in [0, 1) */
} fx__run_range;

typedef struct fx__run_param {
    const char *key;    /* the checkpoint's metadata key */
    const char *option; /* the train option that sets it ("--lr"), NULL when none */
    fx__run_range range;
    size_t offset;      /* in fx__model_train_state */
    int64_t lo, hi;     /* FX__RUN_I64 */
} fx__run_param;

extern const fx__run_param fx__run_params[];
extern const size_t fx__run_nparams;

/* The parameter whose key is key, or NULL. */
const fx__run_param *fx__run_param_find(const char *key);
/* Whether integer v / float v is within p's range (ctx: the model's context, for seq). NaN
   is never. */
bool fx__run_param_ok_i64(const fx__run_param *p, int64_t v, int64_t ctx);
bool fx__run_param_ok_f32(const fx__run_param *p, float v);
/* What p's range asks, as the end of a message: "must be > 0", "must be >= 1",
   "is outside [1, 65536]", "must be in [0, 1)". */
void fx__run_param_rule(const fx__run_param *p, int64_t ctx, char *buf, size_t n);
/* The state's value of p as text ("-1", "0.001"). */
void fx__run_param_format(const fx__run_param *p, const struct fx__model_train_state *s, char *buf, size_t n);
/* The first parameter of s outside its range, or NULL when all are within; and the order
   rule min_lr <= lr. *order is set when the fault is min_lr above lr (then the result is
   min_lr's row). */
const fx__run_param *fx__run_params_check(const struct fx__model_train_state *s, int64_t ctx, bool *order);

#endif
