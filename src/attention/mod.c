/* Mods as expressions (docs/attention.md, "Mods as expressions"): a parser into a typed tree,
   constant folding, symbolic derivatives, affine index arithmetic recognised, and a register
   program whose parts run once per tile, once per row and over a tile row (up to CH
   positions) at a time: every instruction is a loop over the row, not a call per element.
   The loops (mod_eval.h) are built for each CPU path (mod_avx2.c, mod_avx512.c). */
#include "attention/mod_internal.h"
#include "attention/internal.h"
#include "attention/mod_eval.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>

enum { CH = FX__MOD_CH, MAX_REGS = FX__MOD_REGS, MAX_NODES = 4096, MAX_DEPTH = 200, MAX_OUT = FX__MOD_MAX_OUT,
       MAX_TENSORS = 16 };
enum { TY_INT, TY_FLOAT, TY_BOOL };

typedef struct node {
    uint8_t op, ty;
    int pos;     /* 1-based column */
    int nk;
    int k[4];
    int t;       /* tensor of O_READ / O_IDX (/ O_IDX_AFF / O_GATHER_AFF) */
    int dim;     /* O_IDX_AFF / O_GATHER_AFF */
    int64_t i;   /* O_ICONST; O_AFF & co: the coefficient of kv_idx */
    float f;     /* O_FCONST */
} node;

typedef fx__mod_ins ins;
typedef fx__mod_slot slot;
typedef fx__mod_env env;
typedef fx__mod_tensor mtensor;

typedef fx__mod_prog prog;

struct fx_mod {
    bool mask;
    bool dscore_one;   /* d result / d score is the constant 1 */
    bool uses_score;
    prog fwd, grad;    /* grad: [none], then (index, d read) per read of a tensor with a grad */
    prog dsc;          /* d result / d score */
    int ngr;           /* those reads */
    int gr_tensor[32];
    int64_t grad_elems;
    int nt;
    mtensor t[MAX_TENSORS];
    bool iv_exact; /* no float in the mask: interval arithmetic decides blocks exactly */
    node *nodes; /* kept for interval arithmetic (block masks) */
    int nn, root;
};

/* ---- the operations (mod_eval.h: the one place their semantics live) ---------------------- */

#define MOD_FN(name) name##_scalar
#include "attention/mod_eval.h"

const fx__mod_kernels fx__mod_kernels_scalar = {"scalar", run_scalar, score_scalar, score_grad_scalar};

/* The kernels of a CPU path (the scalar ones in a build with FLEXC_REFERENCE_KERNELS). */
static const fx__mod_kernels *mod_kernels(void);

const char *fx__mod_kernels_name(void) { return mod_kernels()->name; }

static const fx__mod_kernels *mod_kernels(void)
{
#if !defined(FLEXC_REFERENCE_KERNELS) && defined(__x86_64__)
    return FX__PER_ISA(fx__isa(), &fx__mod_kernels_scalar, &fx__mod_kernels_avx2, &fx__mod_kernels_avx512);
#else
    return &fx__mod_kernels_scalar;
#endif
}

/* A program over a tile: begin once (the per-call part), then row once per row, then body
   over each run of at most CH positions of that row. */
typedef struct runner {
    const prog *p;
    const fx__mod_kernels *k;
    slot *R;
    env e;
} runner;

static void run_begin(runner *r, const fx_mod *m, const prog *p, slot *R, int64_t b, int64_t h)
{
    r->p = p, r->k = mod_kernels(), r->R = R;
    r->e = (env){.s = NULL, .o = NULL, .b = b, .h = h, .q = 0, .kv0 = 0, .t = m->t};
    r->k->run(p->code, p->pre, R, 1, &r->e);
    r->k->run(p->code + p->pre, p->pre_end - p->pre, R, CH, &r->e);
}

static void run_row(runner *r, int64_t q)
{
    const prog *p = r->p;
    r->e.q = q;
    r->k->run(p->code + p->pre_end, p->row - p->pre_end, r->R, 1, &r->e);
    r->k->run(p->code + p->row, p->row_end - p->row, r->R, CH, &r->e);
}

static void run_body(runner *r, const float *s, int64_t kv0, int64_t n)
{
    const prog *p = r->p;
    r->e.s = s, r->e.kv0 = kv0;
    r->k->run(p->code + p->row_end, p->n - p->row_end, r->R, n, &r->e);
}

/* ---- the parser ------------------------------------------------------------------------- */

typedef struct cc {
    const char *src;
    int p; /* byte offset */
    node *nodes;
    int nn;
    fx_mod *m;
    int err; /* set once */
    int depth;
} cc;

static int fail(cc *c, int pos, const char *fmt, ...) FX__PRINTF(3, 4);
static int fail(cc *c, int pos, const char *fmt, ...)
{
    if (!c->err) {
        char msg[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        fx__error(FX_EINVAL, "expr:%d: %s", pos, msg);
        c->err = 1;
    }
    return -1;
}

static bool is_const(const node *n) { return n->op == O_ICONST || n->op == O_FCONST; }

static int fold(cc *c, int id);

static int mk(cc *c, int op, int ty, int pos, int nk, const int *k)
{
    if (c->err)
        return -1;
    for (int i = 0; i < nk; i++)
        if (k[i] < 0)
            return -1;
    if (c->nn >= MAX_NODES)
        return fail(c, pos, "expression too large (more than %d nodes)", MAX_NODES);
    node *n = &c->nodes[c->nn];
    memset(n, 0, sizeof *n);
    n->op = (uint8_t)op, n->ty = (uint8_t)ty, n->pos = pos, n->nk = nk;
    for (int i = 0; i < nk; i++)
        n->k[i] = k[i];
    return fold(c, c->nn++);
}

static int iconst(cc *c, int64_t v, int pos)
{
    int id = mk(c, O_ICONST, TY_INT, pos, 0, NULL);
    if (id >= 0)
        c->nodes[id].i = v;
    return id;
}
static int fconst(cc *c, float v, int pos)
{
    int id = mk(c, O_FCONST, TY_FLOAT, pos, 0, NULL);
    if (id >= 0)
        c->nodes[id].f = v;
    return id;
}

/* Folds node id when its operands are constants, evaluating it with run_op itself. */
static int fold(cc *c, int id)
{
    node *n = &c->nodes[id];
    if (n->op <= O_IDX || n->op >= O_GATHER || n->nk == 0)
        return id;
    for (int i = 0; i < n->nk; i++)
        if (!is_const(&c->nodes[n->k[i]]))
            return id;
    slot R[4];
    ins I = {.op = n->op, .dst = 0, .a = 1, .b = n->nk > 1 ? 2 : -1, .c = n->nk > 2 ? 3 : -1, .d = -1};
    I.fl = c->nodes[n->k[0]].ty == TY_FLOAT;
    if (n->op == O_WHERE)
        I.fl = n->ty == TY_FLOAT;
    for (int i = 0; i < n->nk; i++) {
        const node *k = &c->nodes[n->k[i]];
        if (k->op == O_ICONST)
            R[i + 1].i[0] = k->i;
        else
            R[i + 1].f[0] = k->f;
    }
    env e = {0};
    run_op_scalar(&I, R, 1, &e);
    if (n->ty == TY_FLOAT) {
        n->op = O_FCONST, n->f = R[0].f[0];
    } else {
        n->op = O_ICONST, n->i = R[0].i[0];
    }
    n->nk = 0;
    return id;
}

static int to_float(cc *c, int x)
{
    if (x < 0 || c->nodes[x].ty == TY_FLOAT)
        return x;
    return mk(c, O_TOF, TY_FLOAT, c->nodes[x].pos, 1, &x);
}

static int promote(const cc *c, int a, int b)
{
    return (c->nodes[a].ty == TY_FLOAT || c->nodes[b].ty == TY_FLOAT) ? TY_FLOAT : TY_INT;
}

static const char *op_name(int op)
{
    static const char *names[] = {[O_ADD] = "+", [O_SUB] = "-", [O_MUL] = "*", [O_DIV] = "/", [O_FLOORDIV] = "//",
                                  [O_MOD] = "%", [O_LT] = "<", [O_LE] = "<=", [O_GT] = ">", [O_GE] = ">=",
                                  [O_EQ] = "==", [O_NE] = "!=", [O_AND] = "&&", [O_OR] = "||", [O_NOT] = "!"};
    return op < (int)(sizeof names / sizeof names[0]) && names[op] ? names[op] : "?";
}

/* A binary operation with PyTorch's promotion: int (bool counts as int) op float -> float;
   / always float; comparisons -> bool. */
static int binop(cc *c, int op, int a, int b, int pos)
{
    if (a < 0 || b < 0)
        return -1;
    if (op == O_AND || op == O_OR) {
        if (c->nodes[a].ty != TY_BOOL || c->nodes[b].ty != TY_BOOL)
            return fail(c, pos, "'%s' needs bool operands (comparisons), got %s", op_name(op),
                        c->nodes[a].ty != TY_BOOL ? "a number on the left" : "a number on the right");
        int k[2] = {a, b};
        return mk(c, op, TY_BOOL, pos, 2, k);
    }
    int ty = (op == O_DIV || op == O_POW) ? TY_FLOAT : promote(c, a, b);
    if (op >= O_LT && op <= O_NE && c->nodes[a].ty == TY_BOOL && c->nodes[b].ty == TY_BOOL)
        ty = TY_INT;
    if (ty == TY_FLOAT)
        a = to_float(c, a), b = to_float(c, b);
    int k[2] = {a, b};
    int rty = (op >= O_LT && op <= O_NE) ? TY_BOOL : ty;
    return mk(c, op, rty, pos, 2, k);
}

static void skip_ws(cc *c)
{
    while (c->src[c->p] == ' ' || c->src[c->p] == '\t' || c->src[c->p] == '\n' || c->src[c->p] == '\r')
        c->p++;
}

static bool accept(cc *c, const char *tok)
{
    skip_ws(c);
    size_t n = strlen(tok);
    if (strncmp(c->src + c->p, tok, n) != 0)
        return false;
    if (isalpha((unsigned char)tok[0]) && (isalnum((unsigned char)c->src[c->p + n]) || c->src[c->p + n] == '_'))
        return false;
    /* '<' is not the start of '<=', '/' not of '//', '*' not of '**', '=' must be '==' */
    char nx = c->src[c->p + n];
    if (n == 1 && ((tok[0] == '<' || tok[0] == '>') && nx == '='))
        return false;
    if (n == 1 && ((tok[0] == '/' && nx == '/') || (tok[0] == '*' && nx == '*')))
        return false;
    c->p += (int)n;
    return true;
}

static int pos(cc *c)
{
    skip_ws(c);
    return c->p + 1;
}

static int expect(cc *c, const char *tok, const char *what)
{
    if (accept(c, tok))
        return 0;
    int at = pos(c);
    if (!c->src[c->p])
        return fail(c, at, "expected '%s' %s, got the end", tok, what);
    return fail(c, at, "expected '%s' %s, got '%c'", tok, what, c->src[c->p]);
}

static int parse_or(cc *c);

static int call1(cc *c, int op, int x, int pos_, bool float_only)
{
    if (x < 0)
        return -1;
    if (float_only)
        x = to_float(c, x);
    int ty = float_only ? TY_FLOAT : (c->nodes[x].ty == TY_FLOAT ? TY_FLOAT : TY_INT);
    return mk(c, op, ty, pos_, 1, &x);
}

static int parse_call(cc *c, const char *name, int at)
{
    static const struct { const char *n; int op, nargs; } fns[] = {
        {"abs", O_ABS, 1},     {"min", O_MIN, 2},     {"max", O_MAX, 2},         {"clamp", O_CLAMP, 3},
        {"exp", O_EXP, 1},     {"log", O_LOG, 1},     {"log1p", O_LOG1P, 1},     {"sqrt", O_SQRT, 1},
        {"tanh", O_TANH, 1},   {"sigmoid", O_SIGMOID, 1}, {"pow", O_POW, 2},     {"floor", O_FLOOR, 1},
        {"where", O_WHERE, 3}, {"float", O_TOF, 1},   {"int", O_TOI, 1},
    };
    int f = -1;
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (!strcmp(fns[i].n, name))
            f = (int)i;
    if (f < 0)
        return fail(c, at, "unknown function '%s'", name);
    int args[3], na = 0;
    if (!accept(c, ")")) {
        do {
            if (na == 3)
                return fail(c, pos(c), "too many arguments to '%s' (it takes %d)", name, fns[f].nargs);
            args[na++] = parse_or(c);
            if (c->err)
                return -1;
        } while (accept(c, ","));
        if (expect(c, ")", "after the arguments") < 0)
            return -1;
    }
    if (na != fns[f].nargs)
        return fail(c, at, "'%s' takes %d argument%s, got %d", name, fns[f].nargs, fns[f].nargs == 1 ? "" : "s",
                    na);
    int op = fns[f].op;
    switch (op) {
    case O_ABS:
    case O_FLOOR:
        return call1(c, op, args[0], at, false);
    case O_EXP:
    case O_LOG:
    case O_LOG1P:
    case O_SQRT:
    case O_TANH:
    case O_SIGMOID:
        return call1(c, op, args[0], at, true);
    case O_TOF:
        return to_float(c, args[0]);
    case O_TOI:
        if (c->nodes[args[0]].ty == TY_INT)
            return args[0];
        if (c->nodes[args[0]].ty == TY_BOOL) /* a bool is stored as 0 / 1 already: retype it */
            return binop(c, O_ADD, args[0], iconst(c, 0, at), at);
        return mk(c, O_TOI, TY_INT, at, 1, args);
    case O_MIN:
    case O_MAX:
    case O_POW:
        return binop(c, op, args[0], args[1], at);
    case O_CLAMP: {
        int ty = promote(c, args[0], args[1]) == TY_FLOAT || c->nodes[args[2]].ty == TY_FLOAT ? TY_FLOAT : TY_INT;
        if (ty == TY_FLOAT)
            for (int i = 0; i < 3; i++)
                args[i] = to_float(c, args[i]);
        return mk(c, O_CLAMP, ty, at, 3, args);
    }
    case O_WHERE: {
        if (c->nodes[args[0]].ty != TY_BOOL)
            return fail(c, c->nodes[args[0]].pos, "where's condition must be bool (a comparison)");
        int ty = promote(c, args[1], args[2]);
        if (c->nodes[args[1]].ty == TY_BOOL && c->nodes[args[2]].ty == TY_BOOL)
            ty = TY_BOOL;
        if (ty == TY_FLOAT)
            args[1] = to_float(c, args[1]), args[2] = to_float(c, args[2]);
        if (is_const(&c->nodes[args[0]]))
            return c->nodes[args[0]].i ? args[1] : args[2];
        return mk(c, O_WHERE, ty, at, 3, args);
    }
    default:
        return fail(c, at, "internal: function '%s'", name);
    }
}

static int parse_primary(cc *c)
{
    if (++c->depth > MAX_DEPTH) {
        c->depth--;
        return fail(c, pos(c), "expression nested deeper than %d", MAX_DEPTH);
    }
    int at = pos(c), r = -1;
    const char *s = c->src + c->p;
    if (accept(c, "(")) {
        r = parse_or(c);
        if (r >= 0 && expect(c, ")", "to close '('") < 0)
            r = -1;
    } else if (isdigit((unsigned char)*s) || (*s == '.' && isdigit((unsigned char)s[1]))) {
        char *end;
        size_t n = strspn(s, "0123456789");
        bool isf = s[n] == '.' || s[n] == 'e' || s[n] == 'E';
        if (isf) {
            double v = strtod(s, &end);
            if (end == s)
                r = fail(c, at, "bad number");
            else if (isalpha((unsigned char)*end) || *end == '_')
                r = fail(c, at, "bad number '%.*s'", (int)(end - s + 1), s);
            else {
                c->p += (int)(end - s);
                r = fconst(c, (float)v, at);
            }
        } else {
            errno = 0;
            long long v = strtoll(s, &end, 10);
            if (errno == ERANGE)
                r = fail(c, at, "integer constant '%.*s' does not fit in int64", (int)(end - s), s);
            else if (isalpha((unsigned char)*end) || *end == '_')
                r = fail(c, at, "bad number '%.*s'", (int)(end - s + 1), s);
            else {
                c->p += (int)(end - s);
                r = iconst(c, v, at);
            }
        }
    } else if (isalpha((unsigned char)*s) || *s == '_') {
        size_t n = 0;
        while (isalnum((unsigned char)s[n]) || s[n] == '_')
            n++;
        char name[64];
        if (n >= sizeof name) {
            r = fail(c, at, "name longer than %zu characters", sizeof name - 1);
        } else {
            memcpy(name, s, n);
            name[n] = 0;
            c->p += (int)n;
            static const struct { const char *n; int op; } leaves[] = {
                {"score", O_SCORE}, {"b", O_B}, {"h", O_H}, {"q_idx", O_Q}, {"kv_idx", O_KV}};
            int leaf = -1, t = -1;
            for (int i = 0; i < 5; i++)
                if (!strcmp(name, leaves[i].n))
                    leaf = leaves[i].op;
            for (int i = 0; i < c->m->nt; i++)
                if (!strcmp(name, c->m->t[i].name))
                    t = i;
            if (!strcmp(name, "True") || !strcmp(name, "true") || !strcmp(name, "False") ||
                !strcmp(name, "false")) {
                r = iconst(c, name[0] == 'T' || name[0] == 't', at);
                if (r >= 0)
                    c->nodes[r].ty = TY_BOOL;
            } else if (leaf >= 0) {
                r = mk(c, leaf, leaf == O_SCORE ? TY_FLOAT : TY_INT, at, 0, NULL);
                if (leaf == O_SCORE)
                    c->m->uses_score = true;
            } else if (t >= 0) {
                const mtensor *T = &c->m->t[t];
                if (expect(c, "[", "after a tensor's name") < 0) {
                    r = -1;
                } else {
                    int idx[4], ni = 0;
                    do {
                        if (ni == T->ndim) {
                            r = fail(c, pos(c), "'%s' has %d dimension%s, got more indices", name, T->ndim,
                                     T->ndim == 1 ? "" : "s");
                            break;
                        }
                        int ipos = pos(c);
                        idx[ni] = parse_or(c);
                        if (c->err)
                            break;
                        if (c->nodes[idx[ni]].ty == TY_FLOAT) {
                            r = fail(c, ipos, "index %d of '%s' is a float (use int(...))", ni + 1, name);
                            break;
                        }
                        ni++;
                    } while (accept(c, ","));
                    if (!c->err && expect(c, "]", "after the indices") == 0) {
                        if (ni != T->ndim)
                            r = fail(c, at, "'%s' has %d dimension%s, got %d ind%s", name, T->ndim,
                                     T->ndim == 1 ? "" : "s", ni, ni == 1 ? "ex" : "ices");
                        else {
                            r = mk(c, O_READ, T->dtype == FX_DT_F32 ? TY_FLOAT : T->dtype == FX_DT_BOOL ? TY_BOOL
                                                                                                          : TY_INT,
                                   at, ni, idx);
                            if (r >= 0)
                                c->nodes[r].t = t;
                        }
                    }
                }
            } else if (accept(c, "(")) {
                r = parse_call(c, name, at);
            } else {
                r = fail(c, at, "unknown name '%s'", name);
            }
        }
    } else if (!*s) {
        r = fail(c, at, "expected a value, got the end");
    } else {
        r = fail(c, at, "unexpected '%c'", *s);
    }
    c->depth--;
    return c->err ? -1 : r;
}

static int parse_unary(cc *c);

static int parse_power(cc *c)
{
    int a = parse_primary(c);
    int at = pos(c);
    if (a >= 0 && accept(c, "**"))
        return binop(c, O_POW, a, parse_unary(c), at);
    return a;
}

static int parse_unary(cc *c)
{
    int at = pos(c);
    if (accept(c, "-")) {
        if (++c->depth > MAX_DEPTH)
            return fail(c, at, "expression nested deeper than %d", MAX_DEPTH);
        int x = parse_unary(c);
        c->depth--;
        if (x < 0)
            return -1;
        if (c->nodes[x].ty == TY_BOOL)
            return fail(c, at, "unary '-' of a bool");
        return mk(c, O_NEG, c->nodes[x].ty, at, 1, &x);
    }
    if (accept(c, "+"))
        return parse_unary(c);
    return parse_power(c);
}

static int parse_mul(cc *c)
{
    int a = parse_unary(c);
    for (;;) {
        int at = pos(c), op;
        if (accept(c, "*"))
            op = O_MUL;
        else if (accept(c, "//"))
            op = O_FLOORDIV;
        else if (accept(c, "/"))
            op = O_DIV;
        else if (accept(c, "%"))
            op = O_MOD;
        else
            return a;
        a = binop(c, op, a, parse_unary(c), at);
    }
}

static int parse_add(cc *c)
{
    int a = parse_mul(c);
    for (;;) {
        int at = pos(c), op;
        if (accept(c, "+"))
            op = O_ADD;
        else if (accept(c, "-"))
            op = O_SUB;
        else
            return a;
        a = binop(c, op, a, parse_mul(c), at);
    }
}

static int cmp_op(cc *c)
{
    static const struct { const char *t; int op; } ops[] = {{"<=", O_LE}, {">=", O_GE}, {"==", O_EQ},
                                                            {"!=", O_NE}, {"<", O_LT},  {">", O_GT}};
    for (int i = 0; i < 6; i++)
        if (accept(c, ops[i].t))
            return ops[i].op;
    return -1;
}

static int parse_cmp(cc *c)
{
    int a = parse_add(c);
    int at = pos(c), op = cmp_op(c);
    if (op < 0)
        return a;
    a = binop(c, op, a, parse_add(c), at);
    at = pos(c);
    if (a >= 0 && cmp_op(c) >= 0)
        return fail(c, at, "chained comparison (write (a < b) && (b < c))");
    return a;
}

static int parse_not(cc *c)
{
    int at = pos(c);
    if (accept(c, "!") || accept(c, "not")) {
        if (++c->depth > MAX_DEPTH)
            return fail(c, at, "expression nested deeper than %d", MAX_DEPTH);
        int x = parse_not(c);
        c->depth--;
        if (x < 0)
            return -1;
        if (c->nodes[x].ty != TY_BOOL)
            return fail(c, at, "'!' needs a bool operand");
        return mk(c, O_NOT, TY_BOOL, at, 1, &x);
    }
    return parse_cmp(c);
}

static int parse_and(cc *c)
{
    int a = parse_not(c);
    for (;;) {
        int at = pos(c);
        if (!accept(c, "&&") && !accept(c, "and"))
            return a;
        a = binop(c, O_AND, a, parse_not(c), at);
    }
}

static int parse_or(cc *c)
{
    if (++c->depth > MAX_DEPTH) {
        c->depth--;
        return fail(c, pos(c), "expression nested deeper than %d", MAX_DEPTH);
    }
    int a = parse_and(c);
    for (;;) {
        int at = pos(c);
        if (!accept(c, "||") && !accept(c, "or"))
            break;
        a = binop(c, O_OR, a, parse_and(c), at);
    }
    c->depth--;
    return a;
}

/* ---- interval arithmetic (compile-time index checks, block classification) --------------- */

typedef struct iv {
    double lo, hi;
} iv;

typedef struct ivenv {
    iv b, h, q, kv;
    const fx_mod *m;
} ivenv;

static const iv IV_ALL = {-INFINITY, INFINITY};

static iv ivp(double a, double b) { return (iv){a < b ? a : b, a < b ? b : a}; }

static iv iv_eval(const node *N, int id, const ivenv *e, int depth)
{
    const node *n = &N[id];
    if (depth > MAX_DEPTH * 2)
        return IV_ALL;
    iv a = {0, 0}, b = {0, 0}, c = {0, 0};
    if (n->op != O_WHERE && n->op != O_READ && n->op != O_IDX) {
        if (n->nk > 0)
            a = iv_eval(N, n->k[0], e, depth + 1);
        if (n->nk > 1)
            b = iv_eval(N, n->k[1], e, depth + 1);
        if (n->nk > 2)
            c = iv_eval(N, n->k[2], e, depth + 1);
    }
    const double BIG = 4503599627370496.0; /* 2^52: beyond it int64 arithmetic may not be exact here */
    iv r = IV_ALL;
    switch (n->op) {
    case O_SCORE: return IV_ALL;
    case O_B: return e->b;
    case O_H: return e->h;
    case O_Q: return e->q;
    case O_KV: return e->kv;
    case O_ICONST: return (iv){(double)n->i, (double)n->i};
    case O_FCONST: return n->f != n->f ? IV_ALL : (iv){n->f, n->f};
    case O_ADD: r = (iv){a.lo + b.lo, a.hi + b.hi}; break;
    case O_SUB: r = (iv){a.lo - b.hi, a.hi - b.lo}; break;
    case O_NEG: r = (iv){-a.hi, -a.lo}; break;
    case O_MUL: {
        if (!isfinite(a.lo) || !isfinite(a.hi) || !isfinite(b.lo) || !isfinite(b.hi))
            return IV_ALL;
        double p[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
        r = (iv){p[0], p[0]};
        for (int i = 1; i < 4; i++)
            r.lo = p[i] < r.lo ? p[i] : r.lo, r.hi = p[i] > r.hi ? p[i] : r.hi;
        break;
    }
    case O_MIN: r = (iv){fmin(a.lo, b.lo), fmin(a.hi, b.hi)}; break;
    case O_MAX: r = (iv){fmax(a.lo, b.lo), fmax(a.hi, b.hi)}; break;
    case O_CLAMP: r = (iv){fmin(fmax(a.lo, b.lo), c.lo), fmin(fmax(a.hi, b.hi), c.hi)};
        r = ivp(r.lo, r.hi);
        break;
    case O_ABS:
        if (a.lo >= 0)
            r = a;
        else if (a.hi <= 0)
            r = (iv){-a.hi, -a.lo};
        else
            r = (iv){0, fmax(-a.lo, a.hi)};
        break;
    case O_FLOOR: r = (iv){floor(a.lo), floor(a.hi)}; break;
    case O_TOF: r = a; break;
    case O_TOI: r = (iv){a.lo < 0 ? ceil(a.lo) : floor(a.lo), a.hi < 0 ? ceil(a.hi) : floor(a.hi)}; break;
    case O_FLOORDIV:
        if (n->ty == TY_INT && b.lo == b.hi && b.lo > 0 && isfinite(a.lo) && isfinite(a.hi))
            r = (iv){floor(a.lo / b.lo), floor(a.hi / b.lo)};
        else
            return IV_ALL;
        break;
    case O_MOD:
        if (n->ty == TY_INT && b.lo == b.hi && b.lo > 0) {
            if (isfinite(a.lo) && isfinite(a.hi) && floor(a.lo / b.lo) == floor(a.hi / b.lo))
                r = (iv){a.lo - b.lo * floor(a.lo / b.lo), a.hi - b.lo * floor(a.hi / b.lo)};
            else
                r = (iv){0, b.lo - 1};
        } else {
            return IV_ALL;
        }
        break;
    case O_EXP: r = (iv){exp(a.lo), exp(a.hi)}; break;
    case O_TANH: r = (iv){tanh(a.lo), tanh(a.hi)}; break;
    case O_SIGMOID: r = (iv){1 / (1 + exp(-a.lo)), 1 / (1 + exp(-a.hi))}; break;
    case O_LT: case O_LE: case O_GT: case O_GE: case O_EQ: case O_NE: {
        bool t = false, f = false; /* provably true / false */
        switch (n->op) {
        case O_LT: t = a.hi < b.lo, f = a.lo >= b.hi; break;
        case O_LE: t = a.hi <= b.lo, f = a.lo > b.hi; break;
        case O_GT: t = a.lo > b.hi, f = a.hi <= b.lo; break;
        case O_GE: t = a.lo >= b.hi, f = a.hi < b.lo; break;
        case O_EQ: t = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo, f = a.hi < b.lo || b.hi < a.lo; break;
        default: f = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo, t = a.hi < b.lo || b.hi < a.lo; break;
        }
        return t ? (iv){1, 1} : f ? (iv){0, 0} : (iv){0, 1};
    }
    case O_AND: return (iv){a.lo * b.lo, a.hi * b.hi};
    case O_OR: return (iv){fmax(a.lo, b.lo), fmax(a.hi, b.hi)};
    case O_NOT: return (iv){1 - a.hi, 1 - a.lo};
    case O_WHERE: {
        iv cc_ = iv_eval(N, n->k[0], e, depth + 1);
        if (cc_.lo == 1)
            return iv_eval(N, n->k[1], e, depth + 1);
        if (cc_.hi == 0)
            return iv_eval(N, n->k[2], e, depth + 1);
        b = iv_eval(N, n->k[1], e, depth + 1), c = iv_eval(N, n->k[2], e, depth + 1);
        return (iv){fmin(b.lo, c.lo), fmax(b.hi, c.hi)};
    }
    case O_READ: {
        if (!e->m)
            return IV_ALL;
        const mtensor *T = &e->m->t[n->t];
        int64_t lo[4] = {0}, hi[4] = {0};
        double count = 1;
        for (int d = 0; d < T->ndim; d++) {
            iv x = iv_eval(N, n->k[d], e, depth + 1);
            double l = fmax(0, fmin(x.lo, (double)T->shape[d] - 1)), h = fmax(0, fmin(x.hi, (double)T->shape[d] - 1));
            if (x.lo != x.lo || x.hi != x.hi)
                l = 0, h = (double)T->shape[d] - 1;
            lo[d] = (int64_t)l, hi[d] = (int64_t)h;
            count *= h - l + 1;
        }
        if (count > 4096)
            return IV_ALL;
        double mn = INFINITY, mx = -INFINITY;
        int64_t ix[4] = {lo[0], lo[1], lo[2], lo[3]};
        for (;;) {
            int64_t off = 0;
            for (int d = 0; d < T->ndim; d++)
                off += ix[d] * T->stride[d];
            double v;
            switch (T->dtype) {
            case FX_DT_F32: v = ((const float *)T->data)[off]; break;
            case FX_DT_I64: v = (double)((const int64_t *)T->data)[off]; break;
            case FX_DT_I32: v = ((const int32_t *)T->data)[off]; break;
            default: v = ((const uint8_t *)T->data)[off] != 0; break;
            }
            if (v != v)
                return IV_ALL;
            mn = fmin(mn, v), mx = fmax(mx, v);
            int d = T->ndim - 1;
            while (d >= 0 && ++ix[d] > hi[d])
                ix[d] = lo[d], d--;
            if (d < 0)
                break;
        }
        return (iv){mn, mx};
    }
    default:
        return IV_ALL;
    }
    if (r.lo != r.lo || r.hi != r.hi)
        return IV_ALL;
    if (n->ty == TY_INT && ((isfinite(r.lo) && r.lo < -BIG) || (isfinite(r.hi) && r.hi > BIG)))
        return IV_ALL;
    return r;
}

/* ---- derivatives -------------------------------------------------------------------------- */

/* -1 stands for the constant 0. */
static int d_add(cc *c, int a, int b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    return binop(c, O_ADD, a, b, c->nodes[a].pos);
}
static int d_mul(cc *c, int a, int b) /* a may be -1 (zero) */
{
    if (a < 0 || b < 0)
        return -1;
    const node *na = &c->nodes[a], *nb = &c->nodes[b];
    if (na->op == O_FCONST && na->f == 1.0f)
        return to_float(c, b);
    if (nb->op == O_FCONST && nb->f == 1.0f)
        return to_float(c, a);
    return binop(c, O_MUL, a, b, na->pos);
}
static int d_where(cc *c, int cond, int a, int b, int at)
{
    if (a < 0 && b < 0)
        return -1;
    int z = fconst(c, 0.0f, at);
    int k[3] = {cond, a < 0 ? z : to_float(c, a), b < 0 ? z : to_float(c, b)};
    return mk(c, O_WHERE, TY_FLOAT, at, 3, k);
}
static int cmp(cc *c, int op, int a, int b) { return binop(c, op, a, b, c->nodes[a].pos); }

/* d node / d wrt, where wrt is -2 for the score, else the id of an O_READ node. */
static int diff(cc *c, int id, int wrt, int depth)
{
    if (c->err || depth > MAX_DEPTH * 2)
        return c->err ? -1 : fail(c, 1, "expression too deep to differentiate");
    node n = c->nodes[id];
    if (n.ty != TY_FLOAT)
        return -1;
    int at = n.pos;
    int a = n.nk > 0 ? n.k[0] : -1, b = n.nk > 1 ? n.k[1] : -1, k2 = n.nk > 2 ? n.k[2] : -1;
#define D(x) diff(c, (x), wrt, depth + 1)
    switch (n.op) {
    case O_SCORE: return wrt == -2 ? fconst(c, 1.0f, at) : -1;
    case O_READ: return wrt == id ? fconst(c, 1.0f, at) : -1;
    case O_FCONST: case O_TOF: case O_FLOOR: case O_FLOORDIV: return -1;
    case O_ADD: return d_add(c, D(a), D(b));
    case O_SUB: {
        int db = D(b);
        return d_add(c, D(a), db < 0 ? -1 : mk(c, O_NEG, TY_FLOAT, at, 1, &db));
    }
    case O_NEG: {
        int da = D(a);
        return da < 0 ? -1 : mk(c, O_NEG, TY_FLOAT, at, 1, &da);
    }
    case O_MUL: return d_add(c, d_mul(c, D(a), b), d_mul(c, a, D(b)));
    case O_DIV: { /* (da - (a / b) db) / b */
        int da = D(a), db = D(b);
        int t = d_add(c, da, db < 0 ? -1 : mk(c, O_NEG, TY_FLOAT, at, 1, (int[]){d_mul(c, id, db)}));
        return t < 0 ? -1 : binop(c, O_DIV, t, b, at);
    }
    case O_MOD: { /* torch.remainder: self: grad, other: -grad * floor_divide(self, other) */
        int da = D(a), db = D(b);
        int fd = db < 0 ? -1 : binop(c, O_FLOORDIV, a, b, at);
        return d_add(c, da, db < 0 ? -1 : mk(c, O_NEG, TY_FLOAT, at, 1, (int[]){d_mul(c, db, fd)}));
    }
    case O_ABS: { /* sign(a), sign(0) = 0 */
        int da = D(a);
        if (da < 0)
            return -1;
        int z = fconst(c, 0.0f, at);
        int s = d_where(c, cmp(c, O_GT, a, z), fconst(c, 1.0f, at),
                        d_where(c, cmp(c, O_LT, a, z), fconst(c, -1.0f, at), -1, at), at);
        return d_mul(c, da, s);
    }
    case O_MIN: case O_MAX: { /* torch.minimum / maximum: the selected input; ties split 0.5 / 0.5 */
        int da = D(a), db = D(b);
        if (da < 0 && db < 0)
            return -1;
        int half = d_mul(c, d_add(c, da, db), fconst(c, 0.5f, at));
        return d_where(c, cmp(c, n.op == O_MAX ? O_GT : O_LT, a, b), da,
                       d_where(c, cmp(c, O_EQ, a, b), half, db, at), at);
    }
    case O_CLAMP: { /* torch.clamp: x inside [lo, hi] inclusive; lo where x < lo, hi where x > hi */
        int dx = D(a), dl = D(b), dh = D(k2);
        int in = binop(c, O_AND, cmp(c, O_GE, a, b), cmp(c, O_LE, a, k2), at);
        return d_add(c, d_add(c, d_where(c, in, dx, -1, at), d_where(c, cmp(c, O_LT, a, b), dl, -1, at)),
                     d_where(c, cmp(c, O_GT, a, k2), dh, -1, at));
    }
    case O_EXP: return d_mul(c, D(a), id);
    case O_LOG: { int da = D(a); return da < 0 ? -1 : binop(c, O_DIV, da, a, at); }
    case O_LOG1P: {
        int da = D(a);
        return da < 0 ? -1 : binop(c, O_DIV, da, binop(c, O_ADD, a, fconst(c, 1.0f, at), at), at);
    }
    case O_SQRT: {
        int da = D(a);
        return da < 0 ? -1 : binop(c, O_DIV, da, binop(c, O_MUL, fconst(c, 2.0f, at), id, at), at);
    }
    case O_TANH: {
        int one = fconst(c, 1.0f, at);
        return d_mul(c, D(a), binop(c, O_SUB, one, binop(c, O_MUL, id, id, at), at));
    }
    case O_SIGMOID: {
        int one = fconst(c, 1.0f, at);
        return d_mul(c, D(a), binop(c, O_MUL, id, binop(c, O_SUB, one, id, at), at));
    }
    case O_POW: { /* torch: self: where(e == 0, 0, e * x^(e-1)); exponent: where(x == 0 & e >= 0, 0, r log x) */
        int da = D(a), db = D(b), z = fconst(c, 0.0f, at), one = fconst(c, 1.0f, at), r = -1;
        if (da >= 0) {
            int t = binop(c, O_MUL, b, binop(c, O_POW, a, binop(c, O_SUB, b, one, at), at), at);
            r = d_mul(c, da, d_where(c, cmp(c, O_EQ, b, z), -1, t, at));
        }
        if (db >= 0) {
            int t = binop(c, O_MUL, id, mk(c, O_LOG, TY_FLOAT, at, 1, &a), at);
            int cond = binop(c, O_AND, cmp(c, O_EQ, a, z), cmp(c, O_GE, b, z), at);
            r = d_add(c, r, d_mul(c, db, d_where(c, cond, -1, t, at)));
        }
        return r;
    }
    case O_WHERE: return d_where(c, a, D(b), D(k2), at);
    default: return -1;
    }
#undef D
}

/* ---- index arithmetic affine in kv_idx ---------------------------------------------------- */

/* Integer nodes that are a + i * kv_idx with `a` free of kv_idx and the score (i a constant)
   become O_AFF nodes in place (the same values: integer arithmetic wraps, a ring), their `a`
   made of new nodes that the lowering hoists; reads whose only per-position index is such a
   node, or one clamped by hoisted bounds, become one fused instruction (O_GATHER_AFF,
   O_IDX_AFF) in place of the index's and the read's loops, and float(such a node) O_FAFF. Nodes [0, nn0) only: the score
   mod's programs, after its derivatives are built. */
static void affine(cc *c, int nn0)
{
    bool *dep = calloc((size_t)MAX_NODES, 1); /* depends on kv_idx or the score */
    if (!dep) {
        fail(c, 1, "out of memory");
        return;
    }
    for (int id = 0; id < nn0 && !c->err; id++) {
        if (c->nn > MAX_NODES - 8) /* left as they are: the room is the expression's */
            break;
        node *n = &c->nodes[id];
        dep[id] = n->op == O_KV || n->op == O_SCORE;
        for (int k = 0; k < n->nk; k++)
            dep[id] = dep[id] || dep[n->k[k]];
        if (!dep[id] || n->ty != TY_INT)
            goto reads;
        int base[2] = {-1, -1};
        int64_t coef[2] = {0, 0};
        bool ok = n->nk >= 1 && n->nk <= 2;
        for (int k = 0; k < n->nk && ok; k++) {
            const node *x = &c->nodes[n->k[k]];
            if (x->op == O_AFF)
                base[k] = x->k[0], coef[k] = x->i;
            else if (!dep[n->k[k]] && x->ty != TY_FLOAT)
                base[k] = n->k[k];
            else
                ok = false;
        }
        int nb = -1;
        int64_t nc = 0;
        switch (n->op) {
        case O_KV:
            nb = iconst(c, 0, n->pos), nc = 1;
            break;
        case O_ADD:
        case O_SUB:
            if (!ok)
                break;
            nb = binop(c, n->op, base[0], base[1], n->pos);
            nc = n->op == O_ADD ? fx__mod_wrap_add(coef[0], coef[1]) : fx__mod_wrap_sub(coef[0], coef[1]);
            break;
        case O_NEG:
            if (!ok)
                break;
            nb = mk(c, O_NEG, TY_INT, n->pos, 1, base);
            nc = fx__mod_wrap_sub(0, coef[0]);
            break;
        case O_MUL:
            if (!ok)
                break;
            for (int k = 0; k < 2 && nb < 0; k++)
                if (c->nodes[base[1 - k]].op == O_ICONST && coef[1 - k] == 0) {
                    nb = binop(c, O_MUL, base[k], base[1 - k], n->pos);
                    nc = fx__mod_wrap_mul(coef[k], c->nodes[base[1 - k]].i);
                }
            break;
        default:
            break;
        }
        if (nb >= 0) {
            n = &c->nodes[id];
            n->op = O_AFF, n->nk = 1, n->k[0] = nb, n->i = nc;
            continue;
        }
    reads:
        if (n->op == O_TOF && c->nodes[n->k[0]].op == O_AFF) {
            const node *x = &c->nodes[n->k[0]];
            n->op = O_FAFF, n->k[0] = x->k[0], n->i = x->i;
            continue;
        }
        if ((n->op != O_READ && n->op != O_IDX) || !dep[id])
            continue;
        int v = -1, nv = 0;
        for (int d = 0; d < n->nk; d++)
            if (dep[n->k[d]])
                v = d, nv++;
        if (nv != 1)
            continue;
        const node *x = &c->nodes[n->k[v]];
        int lo = -1, hi = -1, aff = -1;
        if (x->op == O_AFF) {
            aff = n->k[v];
        } else if (x->op == O_CLAMP && x->ty == TY_INT && c->nodes[x->k[0]].op == O_AFF && !dep[x->k[1]] &&
                   !dep[x->k[2]]) {
            aff = x->k[0], lo = x->k[1], hi = x->k[2];
        }
        if (aff < 0)
            continue;
        if (lo < 0)
            lo = iconst(c, INT64_MIN, n->pos), hi = iconst(c, INT64_MAX, n->pos);
        int k[4] = {n->k[0], n->k[1], n->k[2], n->k[3]};
        k[v] = iconst(c, 0, n->pos);
        int off = mk(c, O_IDX, TY_INT, n->pos, n->nk, k);
        if (off < 0 || lo < 0 || hi < 0)
            break;
        c->nodes[off].t = c->nodes[id].t;
        n = &c->nodes[id];
        n->op = n->op == O_READ ? O_GATHER_AFF : O_IDX_AFF;
        n->nk = 4, n->dim = v, n->i = c->nodes[aff].i;
        n->k[0] = c->nodes[aff].k[0], n->k[1] = lo, n->k[2] = hi, n->k[3] = off;
    }
    free(dep);
}

/* ---- lowering to a register program ------------------------------------------------------ */

typedef struct lw {
    cc *c;
    int *uses, *reg;
    uint8_t *level; /* 0: depends on none of q_idx, kv_idx, score; 1: on q_idx only; 2: per position */
    bool hoist;     /* levels 0 and 1 go to their own parts (else everything is per position) */
    bool full;      /* out of registers */
    ins *code[3];
    int n[3], cap[3];
    bool busy[MAX_REGS];
    int nregs;
} lw;

static void count_uses(lw *L, int id, bool *seen)
{
    const node *n = &L->c->nodes[id];
    L->uses[id]++;
    if (seen[id])
        return;
    seen[id] = true;
    for (int i = 0; i < n->nk; i++)
        count_uses(L, n->k[i], seen);
}

static int alloc_reg(lw *L)
{
    for (int r = 0; r < MAX_REGS; r++)
        if (!L->busy[r]) {
            L->busy[r] = true;
            L->nregs = r + 1 > L->nregs ? r + 1 : L->nregs;
            return r;
        }
    if (L->hoist) { /* tried again without hoisting, which needs fewer */
        L->full = true;
        return -1;
    }
    return fail(L->c, 1, "expression needs more than %d registers", MAX_REGS);
}

static int emit(lw *L, int part, ins I)
{
    if (L->n[part] == L->cap[part]) {
        int cap = L->cap[part] ? 2 * L->cap[part] : 64;
        ins *x = realloc(L->code[part], (size_t)cap * sizeof *x);
        if (!x)
            return fail(L->c, 1, "out of memory");
        L->code[part] = x, L->cap[part] = cap;
    }
    L->code[part][L->n[part]++] = I;
    return 0;
}

static bool hoisted(const lw *L, int id) { return L->hoist && L->level[id] < 2; }

/* A hoisted value keeps its register for the whole program (the per-row and per-position parts
   run after the part that computes it, in a loop); the others free theirs after their last
   use. */
static void release(lw *L, int id)
{
    if (--L->uses[id] == 0 && L->reg[id] >= 0 && !hoisted(L, id))
        L->busy[L->reg[id]] = false;
}

static int lower(lw *L, int id)
{
    if (L->c->err || L->full)
        return -1;
    if (L->reg[id] >= 0)
        return L->reg[id];
    const node *n = &L->c->nodes[id];
    int16_t r[4] = {-1, -1, -1, -1};
    for (int i = 0; i < n->nk; i++)
        if ((r[i] = (int16_t)lower(L, n->k[i])) < 0)
            return -1;
    int dst = alloc_reg(L);
    if (dst < 0)
        return -1;
    const int part = hoisted(L, id) ? L->level[id] : 2;
    bool fl = n->nk > 0 && L->c->nodes[n->k[0]].ty == TY_FLOAT;
    if (n->op == O_WHERE)
        fl = n->ty == TY_FLOAT;
    ins I = {.op = n->op, .fl = fl, .dst = (int16_t)dst, .a = r[0], .b = r[1], .c = r[2], .d = r[3],
             .t = n->t, .i = n->i, .f = n->f, .dim = (uint8_t)n->dim};
    if (n->op == O_READ) {
        I.op = O_IDX;
        int g = alloc_reg(L);
        if (g < 0)
            return -1;
        I.dst = (int16_t)g;
        emit(L, part, I);
        ins G = {.op = O_GATHER, .dst = (int16_t)dst, .a = (int16_t)g, .b = -1, .c = -1, .d = -1, .t = n->t};
        emit(L, part, G);
        if (part == 2) /* a hoisted read's index stays: later hoisted parts may run after it */
            L->busy[g] = false;
    } else {
        emit(L, part, I);
    }
    for (int i = 0; i < n->nk; i++)
        release(L, n->k[i]);
    L->reg[id] = dst;
    return dst;
}

/* Lowers the hoisted nodes under id first, so that no per-position temporary shares their
   registers. */
static void lower_hoisted(lw *L, int id, bool *seen)
{
    if (seen[id] || L->c->err || L->full)
        return;
    seen[id] = true;
    if (L->level[id] < 2) {
        lower(L, id);
        return;
    }
    const node *n = &L->c->nodes[id];
    for (int i = 0; i < n->nk; i++)
        lower_hoisted(L, n->k[i], seen);
}

/* Lowers roots (some may be -1: no output, out = -1) into p: 0, -1 on an error, 1 when hoisting
   ran out of registers. */
static int lower_try(cc *c, prog *p, const int *roots, int nroots, bool hoist)
{
    lw L = {.c = c, .hoist = hoist};
    L.uses = calloc((size_t)c->nn, sizeof(int));
    L.reg = malloc((size_t)c->nn * sizeof(int));
    L.level = calloc((size_t)c->nn, 1);
    bool *seen = calloc((size_t)c->nn, 1), *splat = calloc((size_t)c->nn, 1);
    int rc = 0;
    if (!L.uses || !L.reg || !L.level || !seen || !splat) {
        rc = fail(c, 1, "out of memory");
        goto done;
    }
    /* a node's operands are made before it: their ids are smaller */
    for (int i = 0; i < c->nn; i++) {
        const node *n = &c->nodes[i];
        L.reg[i] = -1;
        uint8_t lv = n->op == O_Q ? 1 : (n->op == O_KV || n->op == O_SCORE || n->op >= O_AFF) ? 2 : 0;
        for (int k = 0; k < n->nk; k++)
            lv = L.level[n->k[k]] > lv ? L.level[n->k[k]] : lv;
        L.level[i] = lv;
    }
    for (int i = 0; i < nroots; i++)
        if (roots[i] >= 0) {
            count_uses(&L, roots[i], seen);
            L.uses[roots[i]] += 1; /* outputs stay live */
        }
    if (hoist) {
        memset(seen, 0, (size_t)c->nn);
        for (int i = 0; i < nroots; i++)
            if (roots[i] >= 0)
                lower_hoisted(&L, roots[i], seen);
    }
    for (int i = 0; i < nroots && !c->err && !L.full; i++)
        p->out[i] = roots[i] >= 0 ? lower(&L, roots[i]) : -1;
    if (c->err) {
        rc = -1;
        goto done;
    }
    if (L.full) {
        rc = 1;
        goto done;
    }
    /* Hoisted values that a per-position instruction reads, or that are outputs, go to every lane. */
    for (int i = 0; i < c->nn; i++) {
        const node *n = &c->nodes[i];
        if (L.reg[i] < 0 || hoisted(&L, i))
            continue;
        if (n->op >= O_AFF) /* these read their operands' lane 0 */
            continue;
        for (int k = 0; k < n->nk; k++)
            splat[n->k[k]] = true;
    }
    for (int i = 0; i < nroots; i++)
        if (roots[i] >= 0)
            splat[roots[i]] = true;
    int nsp[2] = {0, 0};
    ins *code = malloc(((size_t)(L.n[0] + L.n[1] + L.n[2]) + (size_t)c->nn + 1) * sizeof *code);
    if (!code) {
        rc = fail(c, 1, "out of memory");
        goto done;
    }
    int at = 0;
    for (int part = 0; part < 2; part++) {
        if (L.n[part])
            memcpy(code + at, L.code[part], (size_t)L.n[part] * sizeof *code);
        at += L.n[part];
        nsp[part] = 0;
        for (int i = 0; i < c->nn; i++)
            if (splat[i] && L.reg[i] >= 0 && hoisted(&L, i) && L.level[i] == part) {
                ins S = {.op = O_SPLAT, .fl = c->nodes[i].ty == TY_FLOAT, .dst = (int16_t)L.reg[i], .a = -1,
                         .b = -1, .c = -1, .d = -1};
                code[at + nsp[part]++] = S;
            }
        if (part == 0)
            p->pre = L.n[0], p->pre_end = at + nsp[0];
        else
            p->row = at, p->row_end = at + nsp[1];
        at += nsp[part];
    }
    if (L.n[2])
        memcpy(code + at, L.code[2], (size_t)L.n[2] * sizeof *code);
    at += L.n[2];
    free(p->code);
    p->code = code, p->n = at;
    p->nout = nroots;
    p->nregs = L.nregs;
done:
    for (int i = 0; i < 3; i++)
        free(L.code[i]);
    free(L.uses), free(L.reg), free(L.level), free(seen), free(splat);
    return rc;
}

static int lower_prog(cc *c, prog *p, const int *roots, int nroots)
{
    int rc = lower_try(c, p, roots, nroots, true);
    if (rc == 1)
        rc = lower_try(c, p, roots, nroots, false);
    return rc;
}

/* ---- compiling ------------------------------------------------------------------------------ */

static int check_tensor(const fx_mod_tensor *t, int i)
{
    if (!t->name || !t->name[0])
        return fx__error(FX_EINVAL, "tensors[%d]: name is empty", i);
    size_t n = strlen(t->name);
    if (n >= 64)
        return fx__error(FX_EINVAL, "tensors[%d]: name longer than 63 characters", i);
    for (size_t j = 0; j < n; j++)
        if (!(isalnum((unsigned char)t->name[j]) || t->name[j] == '_') || (j == 0 && isdigit((unsigned char)t->name[0])))
            return fx__error(FX_EINVAL, "tensors[%d]: name '%s' is not an identifier", i, t->name);
    static const char *reserved[] = {"score", "b", "h", "q_idx", "kv_idx", "and", "or", "not",
                                     "True", "False", "true", "false"};
    for (size_t j = 0; j < sizeof reserved / sizeof reserved[0]; j++)
        if (!strcmp(t->name, reserved[j]))
            return fx__error(FX_EINVAL, "tensors[%d]: name '%s' is reserved", i, t->name);
    if (t->dtype != FX_DT_F32 && t->dtype != FX_DT_I64 && t->dtype != FX_DT_I32 && t->dtype != FX_DT_BOOL)
        return fx__error(FX_EINVAL, "tensor '%s': dtype %d is not F32, I64, I32 or BOOL", t->name, t->dtype);
    if (t->ndim < 1 || t->ndim > 4)
        return fx__error(FX_EINVAL, "tensor '%s': ndim = %d must be 1 to 4", t->name, t->ndim);
    double numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 1)
            return fx__error(FX_EINVAL, "tensor '%s': shape[%d] = %lld must be >= 1", t->name, d,
                             (long long)t->shape[d]);
        numel *= (double)t->shape[d];
    }
    if (numel > 4e18)
        return fx__error(FX_EINVAL, "tensor '%s': too many elements", t->name);
    if (!t->data)
        return fx__error(FX_EINVAL, "tensor '%s': data is NULL", t->name);
    if (t->grad && t->dtype != FX_DT_F32)
        return fx__error(FX_EINVAL, "tensor '%s': only float32 tensors have a grad", t->name);
    return FX_OK;
}

/* Refuses reads whose index is provably out of range for any b, h, q_idx, kv_idx >= 0. */
static void check_reads(cc *c)
{
    ivenv e = {.b = {0, INFINITY}, .h = {0, INFINITY}, .q = {0, INFINITY}, .kv = {0, INFINITY}, .m = NULL};
    for (int id = 0; id < c->nn && !c->err; id++) {
        const node *n = &c->nodes[id];
        if (n->op != O_READ)
            continue;
        const mtensor *T = &c->m->t[n->t];
        for (int d = 0; d < n->nk; d++) {
            iv x = iv_eval(c->nodes, n->k[d], &e, 0);
            if (x.hi < 0 || x.lo > (double)T->shape[d] - 1) {
                fail(c, c->nodes[n->k[d]].pos, "index %d of '%s' is always out of range [0, %lld) (it lies in [%.0f, %.0f])",
                     d + 1, T->name, (long long)T->shape[d], x.lo, x.hi);
                return;
            }
        }
    }
}

int fx_mod_compile(fx_mod **out, const char *expr, const fx_mod_tensor *tensors, int ntensors)
{
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL");
    if (!expr)
        return fx__error(FX_EINVAL, "expr is NULL");
    if (ntensors < 0 || ntensors > MAX_TENSORS || (ntensors > 0 && !tensors))
        return fx__error(FX_EINVAL, "ntensors = %d must be 0 to %d (with tensors != NULL)", ntensors, MAX_TENSORS);
    for (int i = 0; i < ntensors; i++) {
        int rc = check_tensor(&tensors[i], i);
        if (rc != FX_OK)
            return rc;
        for (int j = 0; j < i; j++)
            if (!strcmp(tensors[i].name, tensors[j].name))
                return fx__error(FX_EINVAL, "tensors %d and %d are both named '%s'", j, i, tensors[i].name);
    }
    fx_mod *m = calloc(1, sizeof *m);
    node *nodes = malloc(MAX_NODES * sizeof *nodes);
    if (!m || !nodes) {
        free(m), free(nodes);
        return fx__error(FX_ENOMEM, "fx_mod_compile: out of memory");
    }
    m->nt = ntensors;
    for (int i = 0; i < ntensors; i++) {
        mtensor *T = &m->t[i];
        snprintf(T->name, sizeof T->name, "%s", tensors[i].name);
        T->dtype = tensors[i].dtype, T->ndim = tensors[i].ndim;
        T->data = tensors[i].data, T->grad = tensors[i].grad;
        T->numel = 1;
        for (int d = T->ndim - 1; d >= 0; d--) {
            T->shape[d] = tensors[i].shape[d];
            T->stride[d] = T->numel;
            T->numel *= T->shape[d];
        }
    }
    cc c = {.src = expr, .nodes = nodes, .m = m};
    int root = parse_or(&c);
    if (!c.err) {
        skip_ws(&c);
        if (c.src[c.p])
            fail(&c, c.p + 1, "unexpected '%c' after the expression", c.src[c.p]);
    }
    if (!c.err)
        check_reads(&c);
    if (!c.err) {
        m->mask = c.nodes[root].ty == TY_BOOL;
        if (m->mask && m->uses_score) /* a mask is classified before any score exists */
            fail(&c, 1, "a mask (a bool expression) cannot read score");
        else if (!m->mask)
            root = to_float(&c, root);
    }
    if (!c.err && m->mask)
        lower_prog(&c, &m->fwd, &root, 1);
    if (!c.err && !m->mask) {
        /* The derivative program: d/d score, then (flat index, d/d read) of each float read
           of a tensor with a grad. */
        int roots[MAX_OUT], nr = 0;
        int ds = diff(&c, root, -2, 0);
        const node *dn = ds >= 0 ? &c.nodes[ds] : NULL;
        m->dscore_one = dn && dn->op == O_FCONST && dn->f == 1.0f;
        roots[nr++] = ds < 0 ? fconst(&c, 0.0f, 1) : ds;
        int nn0 = c.nn;
        for (int id = 0; id < nn0 && !c.err; id++) {
            const node *n = &c.nodes[id];
            if (n->op != O_READ || !m->t[n->t].grad)
                continue;
            int d = diff(&c, root, id, 0);
            if (d < 0)
                continue;
            if (m->ngr == 32) {
                fail(&c, n->pos, "more than 32 reads of tensors with a grad");
                break;
            }
            int k[4] = {n->k[0], n->k[1], n->k[2], n->k[3]};
            int ix = mk(&c, O_IDX, TY_INT, n->pos, n->nk, k);
            if (ix >= 0)
                c.nodes[ix].t = n->t;
            m->gr_tensor[m->ngr++] = n->t;
            roots[nr++] = ix, roots[nr++] = d;
        }
        if (!c.err)
            affine(&c, c.nn);
        if (!c.err)
            lower_prog(&c, &m->fwd, &root, 1);
        /* the result straight into the score row: the last instruction computes it (not a copy
           of the score row itself, which it would then read as it writes) */
        prog *f = &m->fwd;
        if (!c.err && f->n > f->row_end && f->code[f->n - 1].dst == f->out[0] && f->code[f->n - 1].op != O_SCORE) {
            f->code[f->n - 1].dst = FX__MOD_OUT;
            f->direct = true;
        }
        if (!c.err)
            lower_prog(&c, &m->dsc, roots, 1);
        roots[0] = -1; /* the tensors' part does not need d / d score */
        if (!c.err && m->ngr)
            lower_prog(&c, &m->grad, roots, nr);
        int64_t off = 0;
        for (int i = 0; i < m->nt; i++)
            if (m->t[i].grad) {
                m->t[i].goff = off;
                off += m->t[i].numel;
            }
        m->grad_elems = m->ngr ? off : 0;
    }
    if (c.err) {
        fx_mod_free(m);
        free(nodes);
        return FX_EINVAL;
    }
    m->nodes = nodes, m->nn = c.nn, m->root = root;
    /* Float arithmetic rounds in float32 where the intervals are doubles: only an all-integer
       mask is classified by them. */
    m->iv_exact = m->mask;
    for (int i = 0; i < m->fwd.n; i++)
        if (m->fwd.code[i].fl || m->fwd.code[i].op == O_TOF)
            m->iv_exact = false;
    *out = m;
    return FX_OK;
}

void fx_mod_free(fx_mod *m)
{
    if (!m)
        return;
    free(m->fwd.code);
    free(m->grad.code);
    free(m->dsc.code);
    free(m->nodes);
    free(m);
}

bool fx_mod_is_mask(const fx_mod *m) { return m && m->mask; }
int fx_mod_nregs(const fx_mod *m) { return m ? m->fwd.nregs : 0; }

/* ---- running ------------------------------------------------------------------------------- */

void fx_mod_score(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0, int64_t kv0,
                  const void *ctx)
{
    const fx_mod *m = ctx;
    mod_kernels()->score(&m->fwd, m->t, s, ld, nq, nkv, b, h, q0, kv0);
}

void fx_mod_score_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                       int64_t q0, int64_t kv0, const void *ctx)
{
    const fx_mod *m = ctx;
    if (!m->dscore_one)
        mod_kernels()->score_grad(&m->dsc, m->t, s, g, ld, nq, nkv, b, h, q0, kv0);
}

bool fx_mod_mask(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx)
{
    const fx_mod *m = ctx;
    slot R[MAX_REGS];
    runner r;
    run_begin(&r, m, &m->fwd, R, b, h);
    run_row(&r, q_idx);
    run_body(&r, NULL, kv_idx, 1);
    return R[m->fwd.out[0]].i[0] != 0;
}

int64_t fx__mod_grad_elems(const fx_mod *m) { return m && !m->mask ? m->grad_elems : 0; }

void fx__mod_grad_accum(const fx_mod *m, double *part, const float *s, const float *g, int64_t ld, int64_t nq,
                        int64_t nkv, int64_t b, int64_t h, int64_t q0, int64_t kv0)
{
    if (!m->ngr)
        return;
    slot R[MAX_REGS];
    runner r;
    run_begin(&r, m, &m->grad, R, b, h);
    for (int64_t i = 0; i < nq; i++) {
        run_row(&r, q0 + i);
        for (int64_t j0 = 0; j0 < nkv; j0 += CH) {
            int64_t n = nkv - j0 < CH ? nkv - j0 : CH;
            const float *gr = g + i * ld + j0;
            run_body(&r, s + i * ld + j0, kv0 + j0, n);
            for (int k = 0; k < m->ngr; k++) {
                const int64_t *ix = R[m->grad.out[1 + 2 * k]].i;
                const float *d = R[m->grad.out[2 + 2 * k]].f;
                double *p = part + m->t[m->gr_tensor[k]].goff;
                /* in order; a run of one index sums in a register (the same additions) */
                for (int64_t j = 0; j < n;) {
                    const int64_t x = ix[j];
                    double acc = p[x];
                    for (; j < n && ix[j] == x; j++)
                        if (gr[j] != 0.0f)
                            acc += (double)gr[j] * (double)d[j];
                    p[x] = acc;
                }
            }
        }
    }
}

void fx__mod_grad_reduce(const fx_mod *m, const double *parts, int64_t nparts)
{
    for (int i = 0; i < m->nt; i++) {
        const mtensor *T = &m->t[i];
        if (!T->grad)
            continue;
        int64_t n = T->numel;
#pragma omp parallel for schedule(static)
        for (int64_t e = 0; e < n; e++) {
            double acc = 0.0;
            for (int64_t u = 0; u < nparts; u++)
                acc += parts[u * m->grad_elems + T->goff + e];
            T->grad[e] += (float)acc;
        }
    }
}

/* ---- block masks ---------------------------------------------------------------------------- */

typedef struct fill_ctx {
    const fx_mod *m;
    int64_t kv_len, bk;
} fill_ctx;

static void set_bits(uint64_t *row, int64_t k0, int64_t k1)
{
    for (int64_t j = k0; j < k1; j++)
        row[j >> 6] |= (uint64_t)1 << (j & 63);
}

static int fill_rows(uint64_t *bits, int64_t words, int64_t b, int64_t h, int64_t q0, int64_t nq, void *ctx)
{
    const fill_ctx *f = ctx;
    const fx_mod *m = f->m;
    slot R[MAX_REGS];
    runner run;
    run_begin(&run, m, &m->fwd, R, b, h);
    const int64_t *o = R[m->fwd.out[0]].i;
    for (int64_t k0 = 0; k0 < f->kv_len; k0 += f->bk) {
        int64_t k1 = k0 + f->bk < f->kv_len ? k0 + f->bk : f->kv_len;
        ivenv e = {.b = {(double)b, (double)b}, .h = {(double)h, (double)h}, .q = {(double)q0, (double)(q0 + nq - 1)},
                   .kv = {(double)k0, (double)(k1 - 1)}, .m = m};
        iv r = m->iv_exact ? iv_eval(m->nodes, m->root, &e, 0) : (iv){0, 1};
        if (r.hi == 0 && r.lo == 0)
            continue; /* empty */
        if (r.lo == 1) {
            for (int64_t i = 0; i < nq; i++)
                set_bits(bits + i * words, k0, k1);
            continue;
        }
        for (int64_t i = 0; i < nq; i++) {
            run_row(&run, q0 + i);
            for (int64_t j0 = k0; j0 < k1; j0 += CH) {
                int64_t n = k1 - j0 < CH ? k1 - j0 : CH;
                run_body(&run, NULL, j0, n);
                uint64_t *row = bits + i * words;
                for (int64_t j = 0; j < n; j++)
                    row[(j0 + j) >> 6] |= (uint64_t)(o[j] != 0) << ((j0 + j) & 63);
            }
        }
    }
    return FX_OK;
}

int fx_block_mask_create_mod(fx_block_mask **out, const fx_mod *mask, int64_t B, int64_t H, int64_t q_len,
                             int64_t kv_len, int64_t block_q, int64_t block_kv)
{
    if (!mask)
        return fx__error(FX_EINVAL, "mask is NULL");
    if (!mask->mask)
        return fx__error(FX_EINVAL, "the mod is a score mod (its expression is not bool)");
    fill_ctx f = {.m = mask, .kv_len = kv_len, .bk = block_kv > 0 ? block_kv : 128};
    return fx_block_mask_create_rows(out, fill_rows, &f, B, H, q_len, kv_len, block_q, block_kv);
}
