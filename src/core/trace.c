/* The traces of `flexc bench train --gemm` and `--ops` (core.h): where the timed calls go
   while a trace is on. A call is timed only outside parallel regions and only when no other
   timed call is running, so nested ones (an op's own GEMMs, fx__gemm_bf16's float32 route
   calling fx__sgemm) count once, in the outermost. */
#include "core.h"

static struct {
    fx__gemm_shape *shapes; /* the GEMM trace: its entries, or NULL when it is off */
    int cap, n;
    int64_t dropped;
    fx__op_time *ops; /* the op trace: FX__OP_COUNT entries, or NULL when it is off */
    bool inside;      /* a timed call is running */
} fx__trace;

void fx__gemm_trace_start(fx__gemm_shape *shapes, int cap)
{
    fx__trace.shapes = shapes, fx__trace.cap = cap, fx__trace.n = 0, fx__trace.dropped = 0;
}

int fx__gemm_trace_stop(int64_t *dropped)
{
    if (dropped)
        *dropped = fx__trace.dropped;
    fx__trace.shapes = NULL;
    return fx__trace.n;
}

/* The clock at the start of a timed call, or -1 when this call is not timed. */
static double trace_begin(bool on)
{
    if (!on || fx__trace.inside || fx__in_parallel())
        return -1.0;
    fx__trace.inside = true;
    return fx__seconds();
}

double fx__gemm_trace_begin(void) { return trace_begin(fx__trace.shapes != NULL); }

void fx__gemm_trace_end(const fx__gemm_shape *g, double t0)
{
    const double seconds = fx__seconds() - t0;
    fx__trace.inside = false;
    if (!fx__trace.shapes)
        return;
    for (int i = 0; i < fx__trace.n; i++) {
        fx__gemm_shape *e = &fx__trace.shapes[i];
        if (e->ta == g->ta && e->tb == g->tb && e->M == g->M && e->N == g->N && e->K == g->K && e->bf16 == g->bf16 &&
            e->a16 == g->a16 && e->b16 == g->b16) {
            e->calls++, e->seconds += seconds;
            return;
        }
    }
    if (fx__trace.n == fx__trace.cap) {
        fx__trace.dropped++;
        return;
    }
    fx__gemm_shape *e = &fx__trace.shapes[fx__trace.n++];
    *e = *g;
    e->calls = 1, e->seconds = seconds;
}

void fx__op_trace_start(fx__op_time *times)
{
    for (int i = 0; i < FX__OP_COUNT; i++)
        times[i] = (fx__op_time){0};
    fx__trace.ops = times;
}

void fx__op_trace_stop(void) { fx__trace.ops = NULL; }

double fx__op_begin(void) { return trace_begin(fx__trace.ops != NULL); }

void fx__op_end(fx__op op, double t0)
{
    if (t0 < 0.0)
        return;
    const double seconds = fx__seconds() - t0;
    fx__trace.inside = false;
    if (fx__trace.ops)
        fx__trace.ops[op].calls++, fx__trace.ops[op].seconds += seconds;
}

const char *fx__op_name(fx__op op)
{
    static const char *const names[FX__OP_COUNT] = {
        [FX__OP_ATTN_FWD] = "attention forward", [FX__OP_ATTN_BWD] = "attention backward",
        [FX__OP_NORM] = "RMSNorm",           [FX__OP_HEADS] = "RoPE and head layout",
        [FX__OP_SWIGLU] = "SwiGLU",          [FX__OP_LOSS] = "loss",
        [FX__OP_EMBED] = "embedding",
    };
    return op >= 0 && op < FX__OP_COUNT ? names[op] : "?";
}
