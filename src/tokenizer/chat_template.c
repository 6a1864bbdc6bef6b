/* The chat-template engine (chat_template.h): a lexer that cuts the source into text and tags
   with Jinja's whitespace control (transformers' trim_blocks and lstrip_blocks), a recursive
   descent parser to a tree, and an evaluator over a small value type. Every allocation of a
   compile or a render comes from one arena released at its end, so errors leave by longjmp. */
#include "tokenizer/chat_template.h"

#include "core/core.h"
#include "tokenizer/tok_internal.h"

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- arena ---------------------------------------------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct arena {
    chunk *head;
    size_t total, limit;
} arena;

typedef struct ctx {
    jmp_buf jb;
    char msg[512];
    arena ar;
} ctx;

_Noreturn static void fail(ctx *c, int line, const char *fmt, ...) FX__PRINTF(3, 4);
_Noreturn static void fail(ctx *c, int line, const char *fmt, ...)
{
    int k = snprintf(c->msg, sizeof c->msg, "chat template line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + k, sizeof c->msg - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(c->jb, 1);
}

static void *ar_alloc(ctx *c, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    chunk *h = c->ar.head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (c->ar.total + cap > c->ar.limit)
            fail(c, 0, "rendering needs more than %d MB", (int)(c->ar.limit >> 20));
        h = malloc(sizeof *h + cap);
        if (!h)
            fail(c, 0, "out of memory");
        h->cap = cap;
        h->used = 0;
        h->next = c->ar.head;
        c->ar.head = h;
        c->ar.total += cap;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    return p;
}

static void ar_free(arena *a)
{
    for (chunk *h = a->head; h;) {
        chunk *nx = h->next;
        free(h);
        h = nx;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- values ------------------------------------------------------------------------------- */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_STR, V_LIST, V_DICT, V_FUNC };
enum { FN_RAISE = 1, FN_STRFTIME, FN_NAMESPACE };

typedef struct val val;
typedef struct list {
    val *v;
    size_t n;
} list;
typedef struct dict {
    val *k, *v;
    size_t n, cap;
    bool ns; /* a namespace(): its attributes can be set */
} dict;
struct val {
    int t;
    union {
        bool b;
        int64_t i;
        struct {
            const char *p;
            size_t n;
        } s;
        list *l;
        dict *d;
        int fn;
    } u;
};

static const char *type_name(int t)
{
    static const char *n[] = {"undefined", "none", "boolean", "integer", "string", "list", "dict", "function"};
    return n[t];
}

static val v_undef(void) { return (val){.t = V_UNDEF}; }
static val v_none(void) { return (val){.t = V_NONE}; }
static val v_bool(bool b) { return (val){.t = V_BOOL, .u.b = b}; }
static val v_int(int64_t i) { return (val){.t = V_INT, .u.i = i}; }
static val v_str(const char *p, size_t n)
{
    val v = {.t = V_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
static val v_cstr(const char *p) { return v_str(p, strlen(p)); }

static val v_strdup(ctx *c, const char *p, size_t n)
{
    char *d = ar_alloc(c, n + 1);
    memcpy(d, p, n);
    d[n] = 0;
    return v_str(d, n);
}

static dict *dict_new(ctx *c, size_t cap)
{
    dict *d = ar_alloc(c, sizeof *d);
    memset(d, 0, sizeof *d);
    d->cap = cap ? cap : 4;
    d->k = ar_alloc(c, d->cap * sizeof *d->k);
    d->v = ar_alloc(c, d->cap * sizeof *d->v);
    return d;
}

static val *dict_find(dict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, k, n) == 0)
            return &d->v[i];
    return NULL;
}

static void dict_set(ctx *c, dict *d, val k, val v)
{
    val *e = dict_find(d, k.u.s.p, k.u.s.n);
    if (e) {
        *e = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        val *nk = ar_alloc(c, cap * sizeof *nk), *nv = ar_alloc(c, cap * sizeof *nv);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

/* ---- lexer: tags and text ----------------------------------------------------------------- */

enum { SEG_TEXT, SEG_VAR, SEG_BLOCK };
typedef struct seg {
    int kind, line;
    const char *p;
    size_t n;
} seg;

enum { TK_END, TK_NAME, TK_STR, TK_INT, TK_OP };
typedef struct tok {
    int kind, line;
    const char *p;
    size_t n;
    int64_t i;     /* TK_INT */
    char *s;       /* TK_STR: decoded (arena), length n */
} tok;

static bool is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }

typedef struct parser {
    ctx *c;
    seg *segs;
    size_t nseg, si;
    tok *toks; /* the current tag's tokens */
    size_t ntok, ti;
    int depth;
} parser;

static int count_lines(const char *a, const char *b)
{
    int n = 0;
    for (; a < b; a++)
        n += *a == '\n';
    return n;
}

/* Cuts src into segments, applying `-`, `+`, trim_blocks and lstrip_blocks. */
static void split(ctx *c, const char *src, size_t len, seg **out, size_t *nout)
{
    size_t cap = 16, n = 0;
    seg *s = ar_alloc(c, cap * sizeof *s);
    const char *p = src, *end = src + len;
    int line = 1;
    bool strip_next = false, trim_next = false;
    while (p < end) {
        const char *q = p;
        while (q + 1 < end && !(q[0] == '{' && (q[1] == '{' || q[1] == '%' || q[1] == '#')))
            q++;
        if (q + 1 >= end)
            q = end;
        /* text p..q */
        const char *tp = p, *tq = q;
        if (strip_next)
            while (tp < tq && is_ws(*tp))
                tp++;
        else if (trim_next) {
            if (tp < tq && *tp == '\n')
                tp++;
            else if (tq - tp >= 2 && tp[0] == '\r' && tp[1] == '\n')
                tp += 2;
        }
        strip_next = trim_next = false;
        int text_line = line + count_lines(p, tp);
        line += count_lines(p, q);
        if (q == end) {
            if (tq > tp) {
                if (n == cap) {
                    seg *ns = ar_alloc(c, 2 * cap * sizeof *ns);
                    memcpy(ns, s, n * sizeof *s);
                    s = ns;
                    cap *= 2;
                }
                s[n++] = (seg){SEG_TEXT, text_line, tp, (size_t)(tq - tp)};
            }
            break;
        }
        char kind = q[1];
        const char *b = q + 2;
        bool lminus = b < end && *b == '-', lplus = b < end && *b == '+';
        if (lminus || lplus)
            b++;
        if (lminus)
            while (tq > tp && is_ws(tq[-1]))
                tq--;
        else if (kind != '{' && !lplus) {
            /* lstrip_blocks: spaces and tabs from the start of the line to the tag */
            const char *r = tq;
            while (r > tp && (r[-1] == ' ' || r[-1] == '\t'))
                r--;
            if (r == src || r[-1] == '\n' || (r > tp && r[-1] == '\n') || (r == tp && (tp == src || tp[-1] == '\n')))
                tq = r;
        }
        if (n + 2 > cap) {
            seg *ns = ar_alloc(c, 2 * cap * sizeof *ns);
            memcpy(ns, s, n * sizeof *s);
            s = ns;
            cap *= 2;
        }
        if (tq > tp)
            s[n++] = (seg){SEG_TEXT, text_line, tp, (size_t)(tq - tp)};
        /* find the closer, skipping quoted strings */
        const char *e = b;
        char close = kind == '{' ? '}' : kind == '%' ? '%' : '#';
        char quote = 0;
        for (; e + 1 < end; e++) {
            if (kind != '#') {
                if (quote) {
                    if (*e == '\\')
                        e++;
                    else if (*e == quote)
                        quote = 0;
                    continue;
                }
                if (*e == '\'' || *e == '"') {
                    quote = *e;
                    continue;
                }
            }
            if (e[0] == close && e[1] == '}')
                break;
        }
        if (e + 1 >= end)
            fail(c, line, "unclosed '%c%c' tag", '{', kind);
        const char *ce = e; /* content end */
        bool rminus = ce > b && ce[-1] == '-', rplus = ce > b && ce[-1] == '+' && kind != '{';
        if (rminus || rplus)
            ce--;
        if (kind != '#')
            s[n++] = (seg){kind == '{' ? SEG_VAR : SEG_BLOCK, line, b, (size_t)(ce - b)};
        line += count_lines(q, e + 2);
        p = e + 2;
        strip_next = rminus;
        trim_next = !rminus && !rplus && kind != '{';
    }
    *out = s;
    *nout = n;
}

static void lex_tag(parser *ps, const seg *g)
{
    ctx *c = ps->c;
    size_t cap = 16, n = 0;
    tok *t = ar_alloc(c, cap * sizeof *t);
    const char *p = g->p, *end = g->p + g->n;
    int line = g->line;
    for (;;) {
        while (p < end && is_ws(*p)) {
            line += *p == '\n';
            p++;
        }
        if (n + 1 >= cap) {
            tok *nt = ar_alloc(c, 2 * cap * sizeof *nt);
            memcpy(nt, t, n * sizeof *t);
            t = nt;
            cap *= 2;
        }
        tok k = {.line = line, .p = p};
        if (p == end) {
            k.kind = TK_END;
            t[n++] = k;
            break;
        }
        char ch = *p;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            while (p < end && ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || (*p >= '0' && *p <= '9')))
                p++;
            k.kind = TK_NAME;
        } else if (ch >= '0' && ch <= '9') {
            int64_t v = 0;
            while (p < end && *p >= '0' && *p <= '9') {
                if (v > (INT64_MAX - 9) / 10)
                    fail(c, line, "integer literal too large");
                v = v * 10 + (*p++ - '0');
            }
            if (p < end && (*p == '.' || *p == 'e' || *p == 'E' || *p == '_'))
                fail(c, line, "unsupported Jinja construct 'float literal'");
            k.kind = TK_INT;
            k.i = v;
        } else if (ch == '\'' || ch == '"') {
            p++;
            char *d = ar_alloc(c, (size_t)(end - p) + 1);
            size_t dn = 0;
            while (p < end && *p != ch) {
                if (*p == '\\' && p + 1 < end) {
                    p++;
                    switch (*p) {
                    case 'n': d[dn++] = '\n'; break;
                    case 't': d[dn++] = '\t'; break;
                    case 'r': d[dn++] = '\r'; break;
                    case '\\': d[dn++] = '\\'; break;
                    case '\'': d[dn++] = '\''; break;
                    case '"': d[dn++] = '"'; break;
                    case '\n': break;
                    default:
                        fail(c, line, "unsupported string escape '\\%c'", *p);
                    }
                    p++;
                } else {
                    line += *p == '\n';
                    d[dn++] = *p++;
                }
            }
            if (p == end)
                fail(c, line, "unterminated string");
            p++;
            d[dn] = 0;
            k.kind = TK_STR;
            k.s = d;
            k.n = dn;
            t[n++] = k;
            continue;
        } else {
            static const char *two[] = {"==", "!=", "<=", ">=", "//", "**"};
            k.kind = TK_OP;
            size_t w = 1;
            for (size_t i = 0; i < sizeof two / sizeof *two; i++)
                if (end - p >= 2 && p[0] == two[i][0] && p[1] == two[i][1])
                    w = 2;
            if (w == 1 && !strchr("()[]{},:.|+-*/%~<>=", ch))
                fail(c, line, "unexpected character '%c'", ch);
            p += w;
        }
        k.n = (size_t)(p - k.p);
        t[n++] = k;
    }
    ps->toks = t;
    ps->ntok = n;
    ps->ti = 0;
}

/* ---- tree ------------------------------------------------------------------------------- */

enum {
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NOT, E_NEG, E_AND, E_OR,
    E_LIST, E_DICT, E_COND,
};
enum { B_ADD, B_SUB, B_MUL, B_DIV, B_FLOORDIV, B_MOD, B_CAT, B_EQ, B_NE, B_LT, B_GT, B_LE, B_GE, B_IN, B_NOTIN };

typedef struct node node;
struct node {
    int kind, line, op;
    bool neg;          /* E_TEST: is not */
    const char *name;  /* E_NAME, E_ATTR, E_FILTER, E_TEST, kwargs names in E_CALL */
    val lit;
    node *a, *b, *cnd; /* operands; E_SLICE: a[b:cnd:d] */
    node *d;
    node **args;       /* E_CALL, E_FILTER, E_TEST args; E_LIST items; E_DICT k0 v0 k1 v1 */
    const char **kw;   /* E_CALL keyword names (NULL for positional) */
    size_t nargs;
};

enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET };
typedef struct stmt stmt;
struct stmt {
    int kind, line;
    const char *text;
    size_t n;
    node *e;              /* S_OUT, S_IF cond, S_FOR iterable, S_SET value */
    stmt *body, *orelse;  /* S_IF, S_FOR body */
    const char *var, *var2, *attr; /* S_FOR vars; S_SET var (and attr for ns.x) */
    stmt *next;
};

struct fx__chat_template {
    ctx c;     /* its arena holds the tree */
    stmt *root;
};

static tok *cur(parser *ps) { return &ps->toks[ps->ti]; }
static bool is_op(const tok *t, const char *op) { return t->kind == TK_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0; }
static bool is_name(const tok *t, const char *nm) { return t->kind == TK_NAME && t->n == strlen(nm) && memcmp(t->p, nm, t->n) == 0; }
static bool accept_op(parser *ps, const char *op)
{
    if (is_op(cur(ps), op)) {
        ps->ti++;
        return true;
    }
    return false;
}
static bool accept_name(parser *ps, const char *nm)
{
    if (is_name(cur(ps), nm)) {
        ps->ti++;
        return true;
    }
    return false;
}
static void expect_op(parser *ps, const char *op)
{
    if (!accept_op(ps, op)) {
        tok *t = cur(ps);
        if (t->kind == TK_END)
            fail(ps->c, t->line, "expected '%s', got the end of the tag", op);
        fail(ps->c, t->line, "expected '%s', got '%.*s'", op, (int)t->n, t->p);
    }
}
static const char *tok_str(parser *ps, const tok *t)
{
    char *s = ar_alloc(ps->c, t->n + 1);
    memcpy(s, t->p, t->n);
    s[t->n] = 0;
    return s;
}
static const char *expect_ident(parser *ps)
{
    tok *t = cur(ps);
    if (t->kind != TK_NAME)
        fail(ps->c, t->line, "expected a name, got '%.*s'", (int)t->n, t->p);
    ps->ti++;
    return tok_str(ps, t);
}

static node *mk(parser *ps, int kind, int line)
{
    node *n = ar_alloc(ps->c, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

static node *parse_expr(parser *ps);

static void enter(parser *ps)
{
    if (++ps->depth > FX__CHAT_MAX_DEPTH)
        fail(ps->c, cur(ps)->line, "nesting deeper than %d", FX__CHAT_MAX_DEPTH);
}

/* args of a call/filter/test after '(' has been read: positional and name=value */
static void parse_args(parser *ps, node *n, bool kw_ok)
{
    size_t cap = 4;
    n->args = ar_alloc(ps->c, cap * sizeof *n->args);
    n->kw = ar_alloc(ps->c, cap * sizeof *n->kw);
    while (!accept_op(ps, ")")) {
        if (n->nargs && !accept_op(ps, ","))
            expect_op(ps, ")");
        if (accept_op(ps, ")"))
            break;
        const char *kw = NULL;
        if (cur(ps)->kind == TK_NAME && is_op(&ps->toks[ps->ti + 1], "=")) {
            if (!kw_ok)
                fail(ps->c, cur(ps)->line, "keyword arguments are not supported here");
            kw = expect_ident(ps);
            ps->ti++;
        }
        if (n->nargs == cap) {
            node **na = ar_alloc(ps->c, 2 * cap * sizeof *na);
            const char **nk = ar_alloc(ps->c, 2 * cap * sizeof *nk);
            memcpy(na, n->args, cap * sizeof *na);
            memcpy(nk, n->kw, cap * sizeof *nk);
            n->args = na;
            n->kw = nk;
            cap *= 2;
        }
        n->kw[n->nargs] = kw;
        n->args[n->nargs++] = parse_expr(ps);
    }
}

static node *parse_primary(parser *ps)
{
    tok *t = cur(ps);
    node *n;
    if (t->kind == TK_STR) {
        ps->ti++;
        n = mk(ps, E_LIT, t->line);
        n->lit = v_str(t->s, t->n);
        /* adjacent string literals concatenate */
        while (cur(ps)->kind == TK_STR) {
            tok *u = cur(ps);
            ps->ti++;
            char *s = ar_alloc(ps->c, n->lit.u.s.n + u->n + 1);
            memcpy(s, n->lit.u.s.p, n->lit.u.s.n);
            memcpy(s + n->lit.u.s.n, u->s, u->n + 1);
            n->lit = v_str(s, n->lit.u.s.n + u->n);
        }
        return n;
    }
    if (t->kind == TK_INT) {
        ps->ti++;
        n = mk(ps, E_LIT, t->line);
        n->lit = v_int(t->i);
        return n;
    }
    if (t->kind == TK_NAME) {
        ps->ti++;
        n = mk(ps, E_LIT, t->line);
        if (is_name(t, "true") || is_name(t, "True"))
            n->lit = v_bool(true);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->lit = v_bool(false);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->lit = v_none();
        else {
            n->kind = E_NAME;
            n->name = tok_str(ps, t);
        }
        return n;
    }
    if (accept_op(ps, "(")) {
        n = parse_expr(ps);
        if (is_op(cur(ps), ","))
            fail(ps->c, cur(ps)->line, "unsupported Jinja construct 'tuple'");
        expect_op(ps, ")");
        return n;
    }
    if (accept_op(ps, "[")) {
        n = mk(ps, E_LIST, t->line);
        size_t cap = 4;
        n->args = ar_alloc(ps->c, cap * sizeof *n->args);
        while (!accept_op(ps, "]")) {
            if (n->nargs && !accept_op(ps, ","))
                expect_op(ps, "]");
            if (accept_op(ps, "]"))
                break;
            if (n->nargs == cap) {
                node **na = ar_alloc(ps->c, 2 * cap * sizeof *na);
                memcpy(na, n->args, cap * sizeof *na);
                n->args = na;
                cap *= 2;
            }
            n->args[n->nargs++] = parse_expr(ps);
        }
        return n;
    }
    if (accept_op(ps, "{")) {
        n = mk(ps, E_DICT, t->line);
        size_t cap = 8;
        n->args = ar_alloc(ps->c, cap * sizeof *n->args);
        while (!accept_op(ps, "}")) {
            if (n->nargs && !accept_op(ps, ","))
                expect_op(ps, "}");
            if (accept_op(ps, "}"))
                break;
            if (n->nargs + 2 > cap) {
                node **na = ar_alloc(ps->c, 2 * cap * sizeof *na);
                memcpy(na, n->args, cap * sizeof *na);
                n->args = na;
                cap *= 2;
            }
            n->args[n->nargs++] = parse_expr(ps);
            expect_op(ps, ":");
            n->args[n->nargs++] = parse_expr(ps);
        }
        return n;
    }
    if (t->kind == TK_END)
        fail(ps->c, t->line, "expected an expression, got the end of the tag");
    fail(ps->c, t->line, "unexpected '%.*s'", (int)t->n, t->p);
}

static node *parse_postfix(parser *ps)
{
    node *n = parse_primary(ps);
    for (;;) {
        tok *t = cur(ps);
        if (accept_op(ps, ".")) {
            node *m = mk(ps, E_ATTR, t->line);
            m->a = n;
            m->name = expect_ident(ps);
            n = m;
        } else if (accept_op(ps, "[")) {
            node *lo = NULL, *hi = NULL, *st = NULL;
            if (!is_op(cur(ps), ":"))
                lo = parse_expr(ps);
            if (accept_op(ps, ":")) {
                if (!is_op(cur(ps), "]") && !is_op(cur(ps), ":"))
                    hi = parse_expr(ps);
                if (accept_op(ps, ":") && !is_op(cur(ps), "]"))
                    st = parse_expr(ps);
                node *m = mk(ps, E_SLICE, t->line);
                m->a = n;
                m->b = lo;
                m->cnd = hi;
                m->d = st;
                n = m;
            } else {
                node *m = mk(ps, E_ITEM, t->line);
                m->a = n;
                m->b = lo;
                n = m;
            }
            expect_op(ps, "]");
        } else if (accept_op(ps, "(")) {
            node *m = mk(ps, E_CALL, t->line);
            m->a = n;
            parse_args(ps, m, true);
            n = m;
        } else
            return n;
    }
}

static node *parse_unary(parser *ps);

static node *parse_filters(parser *ps, node *n)
{
    for (;;) {
        tok *t = cur(ps);
        if (accept_op(ps, "|")) {
            node *m = mk(ps, E_FILTER, t->line);
            m->a = n;
            m->name = expect_ident(ps);
            if (accept_op(ps, "("))
                parse_args(ps, m, true);
            n = m;
        } else if (accept_name(ps, "is")) {
            node *m = mk(ps, E_TEST, t->line);
            m->a = n;
            m->neg = accept_name(ps, "not");
            tok *nt = cur(ps);
            if (accept_name(ps, "none") || accept_name(ps, "None"))
                m->name = "none";
            else if (accept_name(ps, "true") || accept_name(ps, "True"))
                m->name = "true";
            else if (accept_name(ps, "false") || accept_name(ps, "False"))
                m->name = "false";
            else
                m->name = expect_ident(ps);
            (void)nt;
            if (accept_op(ps, "("))
                parse_args(ps, m, false);
            n = m;
        } else
            return n;
    }
}

static node *parse_unary(parser *ps)
{
    tok *t = cur(ps);
    enter(ps);
    node *n;
    if (accept_op(ps, "-")) {
        n = mk(ps, E_NEG, t->line);
        n->a = parse_unary(ps);
    } else if (accept_op(ps, "+"))
        n = parse_unary(ps);
    else
        n = parse_filters(ps, parse_postfix(ps));
    ps->depth--;
    return n;
}

static node *bin(parser *ps, int op, int line, node *a, node *b)
{
    node *n = mk(ps, E_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *parse_math2(parser *ps)
{
    node *n = parse_unary(ps);
    for (;;) {
        tok *t = cur(ps);
        if (is_op(t, "**"))
            fail(ps->c, t->line, "unsupported Jinja construct '**'");
        int op = is_op(t, "*") ? B_MUL : is_op(t, "/") ? B_DIV : is_op(t, "//") ? B_FLOORDIV : is_op(t, "%") ? B_MOD : -1;
        if (op < 0)
            return n;
        ps->ti++;
        n = bin(ps, op, t->line, n, parse_unary(ps));
    }
}

static node *parse_concat(parser *ps)
{
    node *n = parse_math2(ps);
    for (;;) {
        tok *t = cur(ps);
        if (!accept_op(ps, "~"))
            return n;
        n = bin(ps, B_CAT, t->line, n, parse_math2(ps));
    }
}

static node *parse_math1(parser *ps)
{
    node *n = parse_concat(ps);
    for (;;) {
        tok *t = cur(ps);
        int op = is_op(t, "+") ? B_ADD : is_op(t, "-") ? B_SUB : -1;
        if (op < 0)
            return n;
        ps->ti++;
        n = bin(ps, op, t->line, n, parse_concat(ps));
    }
}

static node *parse_compare(parser *ps)
{
    node *n = parse_math1(ps);
    for (int k = 0;; k++) {
        tok *t = cur(ps);
        int op = is_op(t, "==") ? B_EQ : is_op(t, "!=") ? B_NE : is_op(t, "<") ? B_LT : is_op(t, ">") ? B_GT
                 : is_op(t, "<=") ? B_LE : is_op(t, ">=") ? B_GE : is_name(t, "in") ? B_IN : -1;
        if (op < 0 && is_name(t, "not") && is_name(&ps->toks[ps->ti + 1], "in")) {
            ps->ti++;
            op = B_NOTIN;
        }
        if (op < 0)
            return n;
        ps->ti++;
        if (k > 0)
            fail(ps->c, t->line, "unsupported Jinja construct 'chained comparison'");
        n = bin(ps, op, t->line, n, parse_math1(ps));
    }
}

static node *parse_not(parser *ps)
{
    tok *t = cur(ps);
    if (accept_name(ps, "not")) {
        enter(ps);
        node *n = mk(ps, E_NOT, t->line);
        n->a = parse_not(ps);
        ps->depth--;
        return n;
    }
    return parse_compare(ps);
}

static node *parse_and(parser *ps)
{
    node *n = parse_not(ps);
    for (;;) {
        tok *t = cur(ps);
        if (!accept_name(ps, "and"))
            return n;
        node *m = mk(ps, E_AND, t->line);
        m->a = n;
        m->b = parse_not(ps);
        n = m;
    }
}

static node *parse_or(parser *ps)
{
    node *n = parse_and(ps);
    for (;;) {
        tok *t = cur(ps);
        if (!accept_name(ps, "or"))
            return n;
        node *m = mk(ps, E_OR, t->line);
        m->a = n;
        m->b = parse_and(ps);
        n = m;
    }
}

static node *parse_expr(parser *ps)
{
    enter(ps);
    node *n = parse_or(ps);
    tok *t = cur(ps);
    if (accept_name(ps, "if")) {
        node *m = mk(ps, E_COND, t->line);
        m->a = n;
        m->cnd = parse_or(ps);
        if (accept_name(ps, "else"))
            m->b = parse_expr(ps);
        n = m;
    }
    ps->depth--;
    return n;
}

static void expect_end(parser *ps)
{
    tok *t = cur(ps);
    if (t->kind != TK_END)
        fail(ps->c, t->line, "unexpected '%.*s' in the tag", (int)t->n, t->p);
}

/* Parses statements until a block tag whose keyword is in `stops` (left current), or the end. */
static stmt *parse_body(parser *ps, const char *const *stops, const char **stopped);

static stmt *mks(parser *ps, int kind, int line)
{
    stmt *s = ar_alloc(ps->c, sizeof *s);
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->line = line;
    return s;
}

static stmt *parse_if(parser *ps, int line)
{
    stmt *s = mks(ps, S_IF, line);
    s->e = parse_expr(ps);
    expect_end(ps);
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    const char *stop = NULL;
    s->body = parse_body(ps, stops, &stop);
    if (!stop)
        fail(ps->c, line, "'if' is never closed by 'endif'");
    if (!strcmp(stop, "elif")) {
        s->orelse = parse_if(ps, cur(ps)->line);
        return s;
    }
    if (!strcmp(stop, "else")) {
        expect_end(ps);
        static const char *const stops2[] = {"endif", NULL};
        s->orelse = parse_body(ps, stops2, &stop);
        if (!stop)
            fail(ps->c, line, "'if' is never closed by 'endif'");
    }
    expect_end(ps);
    return s;
}

static const char *const unsupported_tags[] = {"macro", "call", "filter", "raw", "include", "import", "from",
    "extends", "block", "with", "break", "continue", "do", "autoescape", "trans", "endmacro", "generation",
    "endgeneration", NULL};

static stmt *parse_body(parser *ps, const char *const *stops, const char **stopped)
{
    stmt *head = NULL, **tail = &head;
    *stopped = NULL;
    enter(ps);
    while (ps->si < ps->nseg) {
        seg *g = &ps->segs[ps->si++];
        stmt *s = NULL;
        if (g->kind == SEG_TEXT) {
            s = mks(ps, S_TEXT, g->line);
            s->text = g->p;
            s->n = g->n;
        } else if (g->kind == SEG_VAR) {
            lex_tag(ps, g);
            s = mks(ps, S_OUT, g->line);
            s->e = parse_expr(ps);
            expect_end(ps);
        } else {
            lex_tag(ps, g);
            tok *k = cur(ps);
            if (k->kind != TK_NAME)
                fail(ps->c, k->line, "expected a statement keyword");
            for (const char *const *st = stops; st && *st; st++)
                if (is_name(k, *st)) {
                    ps->ti++;
                    *stopped = *st;
                    ps->depth--;
                    return head;
                }
            ps->ti++;
            if (is_name(k, "if"))
                s = parse_if(ps, k->line);
            else if (is_name(k, "for")) {
                s = mks(ps, S_FOR, k->line);
                s->var = expect_ident(ps);
                if (accept_op(ps, ","))
                    s->var2 = expect_ident(ps);
                if (!accept_name(ps, "in"))
                    fail(ps->c, k->line, "expected 'in' in 'for'");
                s->e = parse_or(ps);
                if (is_name(cur(ps), "if"))
                    fail(ps->c, k->line, "unsupported Jinja construct 'for ... if'");
                if (is_name(cur(ps), "recursive"))
                    fail(ps->c, k->line, "unsupported Jinja construct 'recursive'");
                expect_end(ps);
                static const char *const fstops[] = {"endfor", "else", NULL};
                const char *stop;
                s->body = parse_body(ps, fstops, &stop);
                if (!stop)
                    fail(ps->c, k->line, "'for' is never closed by 'endfor'");
                if (!strcmp(stop, "else"))
                    fail(ps->c, k->line, "unsupported Jinja construct 'for ... else'");
                expect_end(ps);
            } else if (is_name(k, "set")) {
                s = mks(ps, S_SET, k->line);
                s->var = expect_ident(ps);
                if (accept_op(ps, "."))
                    s->attr = expect_ident(ps);
                if (is_op(cur(ps), ","))
                    fail(ps->c, k->line, "unsupported Jinja construct 'set' of several names");
                if (!accept_op(ps, "="))
                    fail(ps->c, k->line, "unsupported Jinja construct 'set' block");
                s->e = parse_expr(ps);
                expect_end(ps);
            } else {
                for (const char *const *u = unsupported_tags; *u; u++)
                    if (is_name(k, *u))
                        fail(ps->c, k->line, "unsupported Jinja construct '%s'", *u);
                fail(ps->c, k->line, "unexpected '%.*s'", (int)k->n, k->p);
            }
        }
        *tail = s;
        tail = &s->next;
    }
    ps->depth--;
    return head;
}

static int compile_in(fx__chat_template *t, const char *src, size_t len)
{
    parser ps = {.c = &t->c};
    if (setjmp(t->c.jb))
        return FX_EFORMAT;
    char *copy = ar_alloc(&t->c, len + 1); /* the tree points into a copy of the source */
    memcpy(copy, src, len);
    copy[len] = 0;
    split(&t->c, copy, len, &ps.segs, &ps.nseg);
    const char *stop;
    t->root = parse_body(&ps, NULL, &stop);
    return FX_OK;
}

int fx__chat_template_compile(fx__chat_template **out, const char *src, size_t len)
{
    *out = NULL;
    if (len > FX__CHAT_MAX_SOURCE)
        return fx__error(FX_EFORMAT, "chat template: %zu bytes, more than the %d allowed", len, FX__CHAT_MAX_SOURCE);
    fx__chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return fx__error(FX_ENOMEM, "chat template: out of memory");
    t->c.ar.limit = FX__CHAT_MAX_MEMORY;
    int rc = compile_in(t, src, len);
    if (rc != FX_OK) {
        fx__error(rc, "%s", t->c.msg);
        fx__chat_template_free(t);
        return rc;
    }
    *out = t;
    return FX_OK;
}

void fx__chat_template_free(fx__chat_template *t)
{
    if (!t)
        return;
    ar_free(&t->c.ar);
    free(t);
}

/* ---- evaluation ------------------------------------------------------------------------ */

typedef struct scope {
    dict *vars;
    struct scope *up;
} scope;

typedef struct rnd {
    ctx *c;
    char *out;
    size_t n, cap;
    long iterations;
    int depth;
    const fx__chat_vars *vars;
} rnd;

static void emit(rnd *r, int line, const char *s, size_t n)
{
    if (r->n + n > FX__CHAT_MAX_OUTPUT)
        fail(r->c, line, "output longer than %d bytes", FX__CHAT_MAX_OUTPUT);
    if (r->n + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->n + n + 1)
            cap *= 2;
        char *o = realloc(r->out, cap);
        if (!o)
            fail(r->c, line, "out of memory");
        r->out = o;
        r->cap = cap;
    }
    memcpy(r->out + r->n, s, n);
    r->n += n;
    r->out[r->n] = 0;
}

static bool truthy(val v)
{
    switch (v.t) {
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0 || v.u.d->ns;
    case V_FUNC: return true;
    default: return false;
    }
}

/* Jinja's str(): strings as they are, numbers, none/booleans as Python prints them. */
static val to_str(rnd *r, int line, val v)
{
    char b[32];
    switch (v.t) {
    case V_STR: return v;
    case V_UNDEF: return v_str("", 0);
    case V_NONE: return v_cstr("None");
    case V_BOOL: return v_cstr(v.u.b ? "True" : "False");
    case V_INT:
        snprintf(b, sizeof b, "%" PRId64, v.u.i);
        return v_strdup(r->c, b, strlen(b));
    default:
        fail(r->c, line, "unsupported Jinja construct 'printing a %s'", type_name(v.t));
    }
}

static val cat(rnd *r, val a, val b)
{
    char *s = ar_alloc(r->c, a.u.s.n + b.u.s.n + 1);
    memcpy(s, a.u.s.p, a.u.s.n);
    memcpy(s + a.u.s.n, b.u.s.p, b.u.s.n);
    s[a.u.s.n + b.u.s.n] = 0;
    return v_str(s, a.u.s.n + b.u.s.n);
}

static bool equal_d(rnd *r, int line, val a, val b, int depth)
{
    if (depth > FX__CHAT_MAX_DEPTH)
        fail(r->c, line, "comparison of values nested deeper than %d", FX__CHAT_MAX_DEPTH);
    if ((a.t == V_INT || a.t == V_BOOL) && (b.t == V_INT || b.t == V_BOOL))
        return (a.t == V_INT ? a.u.i : a.u.b) == (b.t == V_INT ? b.u.i : b.u.b);
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST:
        if (a.u.l->n != b.u.l->n)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal_d(r, line, a.u.l->v[i], b.u.l->v[i], depth + 1))
                return false;
        return true;
    case V_DICT:
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            val *o = dict_find(b.u.d, a.u.d->k[i].u.s.p, a.u.d->k[i].u.s.n);
            if (!o || !equal_d(r, line, a.u.d->v[i], *o, depth + 1))
                return false;
        }
        return true;
    default: return a.u.fn == b.u.fn;
    }
}

static size_t cp_count(val s)
{
    size_t n = 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        n += ((unsigned char)s.u.s.p[i] & 0xC0) != 0x80;
    return n;
}

/* byte offset of code point k */
static size_t cp_off(val s, size_t k)
{
    size_t i = 0;
    while (i < s.u.s.n && k) {
        i++;
        while (i < s.u.s.n && ((unsigned char)s.u.s.p[i] & 0xC0) == 0x80)
            i++;
        k--;
    }
    return i;
}

static val lookup(scope *sc, const char *name)
{
    for (; sc; sc = sc->up) {
        val *v = dict_find(sc->vars, name, strlen(name));
        if (v)
            return *v;
    }
    return v_undef();
}

static val eval(rnd *r, scope *sc, node *n);

static val item(rnd *r, int line, val o, val k)
{
    if (o.t == V_DICT) {
        if (k.t != V_STR)
            return v_undef();
        val *v = dict_find(o.u.d, k.u.s.p, k.u.s.n);
        return v ? *v : v_undef();
    }
    if (o.t == V_LIST || o.t == V_STR) {
        if (k.t != V_INT && k.t != V_BOOL)
            return v_undef();
        int64_t i = k.t == V_INT ? k.u.i : k.u.b;
        int64_t len = o.t == V_LIST ? (int64_t)o.u.l->n : (int64_t)cp_count(o);
        if (i < 0)
            i += len;
        if (i < 0 || i >= len)
            return v_undef();
        if (o.t == V_LIST)
            return o.u.l->v[i];
        size_t a = cp_off(o, (size_t)i), b = cp_off(o, (size_t)i + 1);
        return v_str(o.u.s.p + a, b - a);
    }
    if (o.t == V_UNDEF)
        fail(r->c, line, "subscript of an undefined value");
    fail(r->c, line, "a %s cannot be subscripted", type_name(o.t));
}

static int64_t to_int(rnd *r, int line, val v, const char *what)
{
    if (v.t == V_INT)
        return v.u.i;
    if (v.t == V_BOOL)
        return v.u.b;
    fail(r->c, line, "%s must be an integer, not a %s", what, type_name(v.t));
}

static val slice(rnd *r, node *n, val o)
{
    if (o.t != V_LIST && o.t != V_STR)
        fail(r->c, n->line, "a %s cannot be sliced", type_name(o.t));
    int64_t len = o.t == V_LIST ? (int64_t)o.u.l->n : (int64_t)cp_count(o);
    int64_t step = 1;
    if (n->d) {
        val s = eval(r, NULL, n->d);
        if (s.t != V_NONE)
            step = to_int(r, n->line, s, "a slice step");
    }
    if (step == 0)
        fail(r->c, n->line, "slice step cannot be zero");
    val lv = n->b ? eval(r, NULL, n->b) : v_none(), hv = n->cnd ? eval(r, NULL, n->cnd) : v_none();
    int64_t lo, hi;
    if (lv.t == V_NONE)
        lo = step > 0 ? 0 : len - 1;
    else {
        lo = to_int(r, n->line, lv, "a slice bound");
        if (lo < 0)
            lo += len;
        if (step > 0)
            lo = lo < 0 ? 0 : lo > len ? len : lo;
        else
            lo = lo < -1 ? -1 : lo > len - 1 ? len - 1 : lo;
    }
    if (hv.t == V_NONE)
        hi = step > 0 ? len : -1;
    else {
        hi = to_int(r, n->line, hv, "a slice bound");
        if (hi < 0)
            hi += len;
        if (step > 0)
            hi = hi < 0 ? 0 : hi > len ? len : hi;
        else
            hi = hi < -1 ? -1 : hi > len - 1 ? len - 1 : hi;
    }
    size_t cnt = 0;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
        cnt++;
    if (o.t == V_LIST) {
        list *l = ar_alloc(r->c, sizeof *l);
        l->n = cnt;
        l->v = ar_alloc(r->c, (cnt ? cnt : 1) * sizeof *l->v);
        size_t k = 0;
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
            l->v[k++] = o.u.l->v[i];
        return (val){.t = V_LIST, .u.l = l};
    }
    char *s = ar_alloc(r->c, o.u.s.n + 1);
    size_t k = 0;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
        size_t a = cp_off(o, (size_t)i), b = cp_off(o, (size_t)i + 1);
        memcpy(s + k, o.u.s.p + a, b - a);
        k += b - a;
    }
    s[k] = 0;
    return v_str(s, k);
}

static bool is_space_at(val s, size_t i, size_t *w)
{
    size_t n = fx__utf8_len((unsigned char)s.u.s.p[i]);
    if (n == 0 || i + n > s.u.s.n) {
        *w = 1;
        return false;
    }
    *w = n;
    size_t got;
    int32_t cp = fx__utf8_get(s.u.s.p + i, &got);
    /* Python's str.isspace(): Unicode White_Space plus the separators \x1c-\x1f */
    return fx__uni_is_space(cp) || (cp >= 0x1c && cp <= 0x1f);
}

static val strip(val s, bool left, bool right)
{
    size_t a = 0, b = s.u.s.n, w;
    if (left)
        while (a < b && is_space_at(s, a, &w))
            a += w;
    if (right)
        for (;;) {
            size_t i = b;
            if (i == a)
                break;
            do
                i--;
            while (i > a && ((unsigned char)s.u.s.p[i] & 0xC0) == 0x80);
            if (!is_space_at(s, i, &w) || i + w != b)
                break;
            b = i;
        }
    return v_str(s.u.s.p + a, b - a);
}

static val change_case(rnd *r, int line, val s, bool up)
{
    char *d = ar_alloc(r->c, s.u.s.n + 1);
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char ch = (unsigned char)s.u.s.p[i];
        if (ch >= 0x80)
            fail(r->c, line, "unsupported Jinja construct '%s' of non-ASCII text", up ? "upper" : "lower");
        d[i] = (char)(up && ch >= 'a' && ch <= 'z' ? ch - 32 : !up && ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    d[s.u.s.n] = 0;
    return v_str(d, s.u.s.n);
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_put(rnd *r, sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = ar_alloc(r->c, cap);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* json.dumps(v, ensure_ascii=False) as transformers' tojson does (separators ", " and ": ") */
static void to_json(rnd *r, int line, sbuf *b, val v, int depth)
{
    if (depth > FX__CHAT_MAX_DEPTH)
        fail(r->c, line, "tojson: nesting deeper than %d", FX__CHAT_MAX_DEPTH);
    char tmp[32];
    switch (v.t) {
    case V_NONE:
    case V_UNDEF:
        if (v.t == V_UNDEF)
            fail(r->c, line, "tojson of an undefined value");
        sb_put(r, b, "null", 4);
        return;
    case V_BOOL:
        sb_put(r, b, v.u.b ? "true" : "false", v.u.b ? 4 : 5);
        return;
    case V_INT:
        snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i);
        sb_put(r, b, tmp, strlen(tmp));
        return;
    case V_STR:
        sb_put(r, b, "\"", 1);
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char ch = (unsigned char)v.u.s.p[i];
            const char *e = NULL;
            switch (ch) {
            case '"': e = "\\\""; break;
            case '\\': e = "\\\\"; break;
            case '\n': e = "\\n"; break;
            case '\r': e = "\\r"; break;
            case '\t': e = "\\t"; break;
            case '\b': e = "\\b"; break;
            case '\f': e = "\\f"; break;
            default: break;
            }
            if (e)
                sb_put(r, b, e, 2);
            else if (ch < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", ch);
                sb_put(r, b, tmp, 6);
            } else
                sb_put(r, b, (const char *)&v.u.s.p[i], 1);
        }
        sb_put(r, b, "\"", 1);
        return;
    case V_LIST:
        sb_put(r, b, "[", 1);
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                sb_put(r, b, ", ", 2);
            to_json(r, line, b, v.u.l->v[i], depth + 1);
        }
        sb_put(r, b, "]", 1);
        return;
    case V_DICT:
        sb_put(r, b, "{", 1);
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                sb_put(r, b, ", ", 2);
            to_json(r, line, b, v.u.d->k[i], depth + 1);
            sb_put(r, b, ": ", 2);
            to_json(r, line, b, v.u.d->v[i], depth + 1);
        }
        sb_put(r, b, "}", 1);
        return;
    default:
        fail(r->c, line, "tojson of a function");
    }
}

static val items_of(rnd *r, int line, val d)
{
    if (d.t != V_DICT)
        fail(r->c, line, "items of a %s", type_name(d.t));
    list *l = ar_alloc(r->c, sizeof *l);
    l->n = d.u.d->n;
    l->v = ar_alloc(r->c, (l->n ? l->n : 1) * sizeof *l->v);
    for (size_t i = 0; i < l->n; i++) {
        list *pair = ar_alloc(r->c, sizeof *pair);
        pair->n = 2;
        pair->v = ar_alloc(r->c, 2 * sizeof *pair->v);
        pair->v[0] = d.u.d->k[i];
        pair->v[1] = d.u.d->v[i];
        l->v[i] = (val){.t = V_LIST, .u.l = pair};
    }
    return (val){.t = V_LIST, .u.l = l};
}

static void want_args(rnd *r, node *n, size_t lo, size_t hi, const char *what)
{
    if (n->nargs < lo || n->nargs > hi)
        fail(r->c, n->line, "%s takes %zu to %zu arguments, got %zu", what, lo, hi, n->nargs);
    for (size_t i = 0; i < n->nargs; i++)
        if (n->kw && n->kw[i])
            fail(r->c, n->line, "%s: unsupported keyword argument '%s'", what, n->kw[i]);
}

static val filter(rnd *r, scope *sc, node *n)
{
    val v = eval(r, sc, n->a);
    const char *f = n->name;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        want_args(r, n, 0, 2, "default");
        val dv = n->nargs ? eval(r, sc, n->args[0]) : v_str("", 0);
        bool boolean = n->nargs > 1 && truthy(eval(r, sc, n->args[1]));
        return v.t == V_UNDEF || (boolean && !truthy(v)) ? dv : v;
    }
    if (!strcmp(f, "tojson")) {
        want_args(r, n, 0, 0, "tojson");
        sbuf b = {0};
        to_json(r, n->line, &b, v, 0);
        return v_str(b.p ? b.p : "", b.n);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        want_args(r, n, 0, 0, f);
        if (v.t == V_STR)
            return v_int((int64_t)cp_count(v));
        if (v.t == V_LIST)
            return v_int((int64_t)v.u.l->n);
        if (v.t == V_DICT)
            return v_int((int64_t)v.u.d->n);
        fail(r->c, n->line, "length of a %s", type_name(v.t));
    }
    if (!strcmp(f, "items")) {
        want_args(r, n, 0, 0, "items");
        return items_of(r, n->line, v);
    }
    if (!strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "string")) {
        want_args(r, n, 0, 0, f);
        val s = to_str(r, n->line, v);
        if (!strcmp(f, "trim"))
            return strip(s, true, true);
        if (!strcmp(f, "string"))
            return s;
        return change_case(r, n->line, s, !strcmp(f, "upper"));
    }
    fail(r->c, n->line, "unsupported Jinja construct 'filter %s'", f);
}

static val test(rnd *r, scope *sc, node *n)
{
    val v = eval(r, sc, n->a);
    const char *t = n->name;
    bool res;
    if (!strcmp(t, "defined"))
        res = v.t != V_UNDEF;
    else if (!strcmp(t, "undefined"))
        res = v.t == V_UNDEF;
    else if (!strcmp(t, "none"))
        res = v.t == V_NONE;
    else if (!strcmp(t, "string"))
        res = v.t == V_STR;
    else if (!strcmp(t, "number") || !strcmp(t, "integer"))
        res = v.t == V_INT;
    else if (!strcmp(t, "boolean"))
        res = v.t == V_BOOL;
    else if (!strcmp(t, "true"))
        res = v.t == V_BOOL && v.u.b;
    else if (!strcmp(t, "false"))
        res = v.t == V_BOOL && !v.u.b;
    else if (!strcmp(t, "mapping"))
        res = v.t == V_DICT;
    else if (!strcmp(t, "sequence") || !strcmp(t, "iterable"))
        res = v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
    else if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "sameas")) {
        want_args(r, n, 1, 1, t);
        res = equal_d(r, n->line, v, eval(r, sc, n->args[0]), 0);
    } else
        fail(r->c, n->line, "unsupported Jinja construct 'test %s'", t);
    if (strcmp(t, "equalto") && strcmp(t, "eq") && strcmp(t, "sameas") && n->nargs)
        fail(r->c, n->line, "test %s takes no arguments", t);
    return v_bool(res != n->neg);
}

static val call(rnd *r, scope *sc, node *n)
{
    node *f = n->a;
    if (f->kind == E_ATTR) { /* methods */
        val o = eval(r, sc, f->a);
        const char *m = f->name;
        if (o.t == V_STR) {
            if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
                want_args(r, n, 0, 0, m);
                return strip(o, m[0] != 'r', m[0] != 'l');
            }
            if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
                want_args(r, n, 1, 1, m);
                val a = eval(r, sc, n->args[0]);
                if (a.t != V_STR)
                    fail(r->c, n->line, "%s takes a string", m);
                if (a.u.s.n > o.u.s.n)
                    return v_bool(false);
                const char *at = m[0] == 's' ? o.u.s.p : o.u.s.p + o.u.s.n - a.u.s.n;
                return v_bool(memcmp(at, a.u.s.p, a.u.s.n) == 0);
            }
            if (!strcmp(m, "upper") || !strcmp(m, "lower")) {
                want_args(r, n, 0, 0, m);
                return change_case(r, n->line, o, m[0] == 'u');
            }
        }
        if (o.t == V_DICT && !strcmp(m, "items")) {
            want_args(r, n, 0, 0, m);
            return items_of(r, n->line, o);
        }
        if (o.t == V_DICT && !strcmp(m, "get")) {
            want_args(r, n, 1, 2, m);
            val k = eval(r, sc, n->args[0]);
            val v = item(r, n->line, o, k);
            return v.t == V_UNDEF ? (n->nargs > 1 ? eval(r, sc, n->args[1]) : v_none()) : v;
        }
        fail(r->c, n->line, "unsupported Jinja construct 'method %s' of a %s", m, type_name(o.t));
    }
    val fv = eval(r, sc, f);
    if (fv.t != V_FUNC)
        fail(r->c, n->line, "'%s' is not a function", f->kind == E_NAME ? f->name : "expression");
    if (fv.u.fn == FN_RAISE) {
        want_args(r, n, 1, 1, "raise_exception");
        val m = to_str(r, n->line, eval(r, sc, n->args[0]));
        fail(r->c, n->line, "raise_exception: %.*s", (int)(m.u.s.n > 400 ? 400 : m.u.s.n), m.u.s.p);
    }
    if (fv.u.fn == FN_STRFTIME) {
        want_args(r, n, 1, 1, "strftime_now");
        val fmt = eval(r, sc, n->args[0]);
        if (fmt.t != V_STR || fmt.u.s.n > 64)
            fail(r->c, n->line, "strftime_now takes a format string (at most 64 bytes)");
        struct tm tm;
        memset(&tm, 0, sizeof tm);
        const char *d = r->vars->date;
        int y, mo, dd;
        if (d && sscanf(d, "%4d-%2d-%2d", &y, &mo, &dd) == 3 && mo >= 1 && mo <= 12 && dd >= 1 && dd <= 31) {
            tm.tm_year = y - 1900;
            tm.tm_mon = mo - 1;
            tm.tm_mday = dd;
            time_t tt = timegm(&tm); /* fills tm_wday, tm_yday */
            gmtime_r(&tt, &tm);
        } else {
            time_t now = time(NULL);
            gmtime_r(&now, &tm);
        }
        char f0[80], buf[256];
        memcpy(f0, fmt.u.s.p, fmt.u.s.n);
        f0[fmt.u.s.n] = 0;
        for (char *p = f0; *p; p++)
            if (*p == '%' && p[1] && !strchr("aAbBdHIjmMpSyYZ%e", p[1]))
                fail(r->c, n->line, "strftime_now: unsupported conversion '%%%c'", p[1]);
            else if (*p == '%' && p[1])
                p++;
        size_t k = strftime(buf, sizeof buf, f0, &tm);
        return v_strdup(r->c, buf, k);
    }
    /* namespace(a=1, ...) */
    dict *d = dict_new(r->c, n->nargs);
    d->ns = true;
    for (size_t i = 0; i < n->nargs; i++) {
        if (!n->kw[i])
            fail(r->c, n->line, "namespace() takes keyword arguments only");
        dict_set(r->c, d, v_cstr(n->kw[i]), eval(r, sc, n->args[i]));
    }
    return (val){.t = V_DICT, .u.d = d};
}

static val binop(rnd *r, node *n, val a, val b)
{
    switch (n->op) {
    case B_CAT: return cat(r, to_str(r, n->line, a), to_str(r, n->line, b));
    case B_EQ: return v_bool(equal_d(r, n->line, a, b, 0));
    case B_NE: return v_bool(!equal_d(r, n->line, a, b, 0));
    case B_IN:
    case B_NOTIN: {
        bool in = false;
        if (b.t == V_STR) {
            if (a.t != V_STR)
                fail(r->c, n->line, "'in <string>' requires a string on the left, not a %s", type_name(a.t));
            in = a.u.s.n == 0;
            for (size_t i = 0; !in && i + a.u.s.n <= b.u.s.n; i++)
                in = memcmp(b.u.s.p + i, a.u.s.p, a.u.s.n) == 0;
        } else if (b.t == V_LIST) {
            for (size_t i = 0; !in && i < b.u.l->n; i++)
                in = equal_d(r, n->line, a, b.u.l->v[i], 0);
        } else if (b.t == V_DICT)
            in = a.t == V_STR && dict_find(b.u.d, a.u.s.p, a.u.s.n) != NULL;
        else
            fail(r->c, n->line, "'in' a %s", type_name(b.t));
        return v_bool(in == (n->op == B_IN));
    }
    default: break;
    }
    if (n->op == B_ADD && a.t == V_STR && b.t == V_STR)
        return cat(r, a, b);
    if (n->op == B_ADD && a.t == V_LIST && b.t == V_LIST) {
        list *l = ar_alloc(r->c, sizeof *l);
        l->n = a.u.l->n + b.u.l->n;
        l->v = ar_alloc(r->c, (l->n ? l->n : 1) * sizeof *l->v);
        memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
        memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
        return (val){.t = V_LIST, .u.l = l};
    }
    if (n->op >= B_LT && n->op <= B_GE && a.t == V_STR && b.t == V_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, m);
        if (c == 0)
            c = a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
        return v_bool(n->op == B_LT ? c < 0 : n->op == B_GT ? c > 0 : n->op == B_LE ? c <= 0 : c >= 0);
    }
    if ((a.t != V_INT && a.t != V_BOOL) || (b.t != V_INT && b.t != V_BOOL))
        fail(r->c, n->line, "unsupported operand types %s and %s", type_name(a.t), type_name(b.t));
    int64_t x = a.t == V_INT ? a.u.i : a.u.b, y = b.t == V_INT ? b.u.i : b.u.b;
    const int64_t big = (int64_t)1 << 52;
    if (x > big || x < -big || y > big || y < -big)
        fail(r->c, n->line, "integer out of the supported range");
    switch (n->op) {
    case B_ADD: return v_int(x + y);
    case B_SUB: return v_int(x - y);
    case B_MUL:
        if ((x > 0x7fffffff || x < -0x7fffffff) && y != 0 && y != 1)
            fail(r->c, n->line, "integer out of the supported range");
        if (y > 0x7fffffff || y < -0x7fffffff)
            fail(r->c, n->line, "integer out of the supported range");
        return v_int(x * y);
    case B_DIV: fail(r->c, n->line, "unsupported Jinja construct '/' (true division)");
    case B_FLOORDIV:
    case B_MOD: {
        if (y == 0)
            fail(r->c, n->line, "integer division or modulo by zero");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q--;
            m += y;
        }
        return v_int(n->op == B_MOD ? m : q);
    }
    case B_LT: return v_bool(x < y);
    case B_GT: return v_bool(x > y);
    case B_LE: return v_bool(x <= y);
    default: return v_bool(x >= y);
    }
}

static val eval(rnd *r, scope *sc, node *n)
{
    if (++r->depth > 4 * FX__CHAT_MAX_DEPTH)
        fail(r->c, n->line, "evaluation deeper than %d", 4 * FX__CHAT_MAX_DEPTH);
    val v;
    switch (n->kind) {
    case E_LIT: v = n->lit; break;
    case E_NAME: v = lookup(sc, n->name); break;
    case E_ATTR: {
        val o = eval(r, sc, n->a);
        if (o.t == V_UNDEF)
            fail(r->c, n->line, "'%s' of an undefined value", n->name);
        if (o.t == V_DICT) {
            val *e = dict_find(o.u.d, n->name, strlen(n->name));
            v = e ? *e : v_undef();
        } else if (o.t == V_NONE)
            fail(r->c, n->line, "'%s' of none", n->name);
        else
            v = v_undef();
        break;
    }
    case E_ITEM: v = item(r, n->line, eval(r, sc, n->a), eval(r, sc, n->b)); break;
    case E_SLICE: {
        /* the bounds are evaluated in the same scope: pass it through a temporary */
        val o = eval(r, sc, n->a);
        node tmp = *n;
        /* bounds may read variables: evaluate them here */
        val lv = n->b ? eval(r, sc, n->b) : v_none(), hv = n->cnd ? eval(r, sc, n->cnd) : v_none();
        val sv = n->d ? eval(r, sc, n->d) : v_none();
        node lb = {.kind = E_LIT, .line = n->line, .lit = lv}, hb = {.kind = E_LIT, .line = n->line, .lit = hv},
             sb = {.kind = E_LIT, .line = n->line, .lit = sv};
        tmp.b = &lb;
        tmp.cnd = &hb;
        tmp.d = &sb;
        v = slice(r, &tmp, o);
        break;
    }
    case E_CALL: v = call(r, sc, n); break;
    case E_FILTER: v = filter(r, sc, n); break;
    case E_TEST: v = test(r, sc, n); break;
    case E_BIN: {
        val a = eval(r, sc, n->a);
        v = binop(r, n, a, eval(r, sc, n->b));
        break;
    }
    case E_NOT: v = v_bool(!truthy(eval(r, sc, n->a))); break;
    case E_NEG: {
        val a = eval(r, sc, n->a);
        int64_t x = to_int(r, n->line, a, "the operand of '-'");
        if (x < -((int64_t)1 << 52))
            fail(r->c, n->line, "integer out of the supported range");
        v = v_int(-x);
        break;
    }
    case E_AND: {
        val a = eval(r, sc, n->a);
        v = truthy(a) ? eval(r, sc, n->b) : a;
        break;
    }
    case E_OR: {
        val a = eval(r, sc, n->a);
        v = truthy(a) ? a : eval(r, sc, n->b);
        break;
    }
    case E_LIST: {
        list *l = ar_alloc(r->c, sizeof *l);
        l->n = n->nargs;
        l->v = ar_alloc(r->c, (n->nargs ? n->nargs : 1) * sizeof *l->v);
        for (size_t i = 0; i < n->nargs; i++)
            l->v[i] = eval(r, sc, n->args[i]);
        v = (val){.t = V_LIST, .u.l = l};
        break;
    }
    case E_DICT: {
        dict *d = dict_new(r->c, n->nargs / 2);
        for (size_t i = 0; i + 1 < n->nargs; i += 2) {
            val k = eval(r, sc, n->args[i]);
            if (k.t != V_STR)
                fail(r->c, n->line, "dict keys must be strings");
            dict_set(r->c, d, k, eval(r, sc, n->args[i + 1]));
        }
        v = (val){.t = V_DICT, .u.d = d};
        break;
    }
    default: /* E_COND */
        if (truthy(eval(r, sc, n->cnd)))
            v = eval(r, sc, n->a);
        else
            v = n->b ? eval(r, sc, n->b) : v_undef();
        break;
    }
    r->depth--;
    return v;
}

static void exec(rnd *r, scope *sc, stmt *s);

static void exec_for(rnd *r, scope *sc, stmt *s)
{
    val it = eval(r, sc, s->e);
    if (it.t == V_DICT) { /* iterating a dict gives its keys */
        list *l = ar_alloc(r->c, sizeof *l);
        l->n = it.u.d->n;
        l->v = it.u.d->k;
        it = (val){.t = V_LIST, .u.l = l};
    } else if (it.t == V_STR) {
        size_t k = cp_count(it);
        list *l = ar_alloc(r->c, sizeof *l);
        l->n = k;
        l->v = ar_alloc(r->c, (k ? k : 1) * sizeof *l->v);
        for (size_t i = 0; i < k; i++)
            l->v[i] = item(r, s->line, it, v_int((int64_t)i));
        it = (val){.t = V_LIST, .u.l = l};
    } else if (it.t == V_UNDEF || it.t == V_NONE)
        fail(r->c, s->line, "'for' over %s", it.t == V_NONE ? "none" : "an undefined value");
    else if (it.t != V_LIST)
        fail(r->c, s->line, "'for' over a %s", type_name(it.t));
    list *l = it.u.l;
    for (size_t i = 0; i < l->n; i++) {
        if (++r->iterations > FX__CHAT_MAX_ITERATIONS)
            fail(r->c, s->line, "more than %d loop iterations", FX__CHAT_MAX_ITERATIONS);
        scope inner = {.vars = dict_new(r->c, 4), .up = sc};
        dict *loop = dict_new(r->c, 9);
        dict_set(r->c, loop, v_cstr("index0"), v_int((int64_t)i));
        dict_set(r->c, loop, v_cstr("index"), v_int((int64_t)i + 1));
        dict_set(r->c, loop, v_cstr("revindex0"), v_int((int64_t)(l->n - i - 1)));
        dict_set(r->c, loop, v_cstr("revindex"), v_int((int64_t)(l->n - i)));
        dict_set(r->c, loop, v_cstr("first"), v_bool(i == 0));
        dict_set(r->c, loop, v_cstr("last"), v_bool(i + 1 == l->n));
        dict_set(r->c, loop, v_cstr("length"), v_int((int64_t)l->n));
        dict_set(r->c, loop, v_cstr("previtem"), i ? l->v[i - 1] : v_undef());
        dict_set(r->c, loop, v_cstr("nextitem"), i + 1 < l->n ? l->v[i + 1] : v_undef());
        dict_set(r->c, inner.vars, v_cstr("loop"), (val){.t = V_DICT, .u.d = loop});
        val x = l->v[i];
        if (s->var2) {
            if (x.t != V_LIST || x.u.l->n != 2)
                fail(r->c, s->line, "cannot unpack a %s into two names", type_name(x.t));
            dict_set(r->c, inner.vars, v_cstr(s->var), x.u.l->v[0]);
            dict_set(r->c, inner.vars, v_cstr(s->var2), x.u.l->v[1]);
        } else
            dict_set(r->c, inner.vars, v_cstr(s->var), x);
        exec(r, &inner, s->body);
    }
}

static void exec(rnd *r, scope *sc, stmt *s)
{
    if (++r->depth > 4 * FX__CHAT_MAX_DEPTH)
        fail(r->c, s ? s->line : 0, "blocks nested deeper than %d", 4 * FX__CHAT_MAX_DEPTH);
    for (; s; s = s->next) {
        switch (s->kind) {
        case S_TEXT: emit(r, s->line, s->text, s->n); break;
        case S_OUT: {
            val v = to_str(r, s->line, eval(r, sc, s->e));
            emit(r, s->line, v.u.s.p, v.u.s.n);
            break;
        }
        case S_IF:
            if (truthy(eval(r, sc, s->e)))
                exec(r, sc, s->body);
            else
                exec(r, sc, s->orelse);
            break;
        case S_FOR: exec_for(r, sc, s); break;
        default: { /* S_SET */
            val v = eval(r, sc, s->e);
            if (s->attr) {
                val ns = lookup(sc, s->var);
                if (ns.t != V_DICT || !ns.u.d->ns)
                    fail(r->c, s->line, "'set %s.%s': '%s' is not a namespace", s->var, s->attr, s->var);
                dict_set(r->c, ns.u.d, v_cstr(s->attr), v);
            } else
                dict_set(r->c, sc->vars, v_cstr(s->var), v);
            break;
        }
        }
    }
    r->depth--;
}

static int render_in(rnd *r, const fx__chat_template *t, const fx__chat_msg *msgs, size_t n)
{
    ctx *c = r->c;
    if (setjmp(c->jb))
        return FX_EFORMAT;
    const fx__chat_vars *v = r->vars;
    scope g = {.vars = dict_new(c, 16)};
    list *ml = ar_alloc(c, sizeof *ml);
    ml->n = n;
    ml->v = ar_alloc(c, (n ? n : 1) * sizeof *ml->v);
    for (size_t i = 0; i < n; i++) {
        dict *d = dict_new(c, 2);
        dict_set(c, d, v_cstr("role"), msgs[i].role ? v_cstr(msgs[i].role) : v_none());
        dict_set(c, d, v_cstr("content"), msgs[i].content ? v_cstr(msgs[i].content) : v_none());
        ml->v[i] = (val){.t = V_DICT, .u.d = d};
    }
    dict_set(c, g.vars, v_cstr("messages"), (val){.t = V_LIST, .u.l = ml});
    if (v->bos_token)
        dict_set(c, g.vars, v_cstr("bos_token"), v_cstr(v->bos_token));
    if (v->eos_token)
        dict_set(c, g.vars, v_cstr("eos_token"), v_cstr(v->eos_token));
    dict_set(c, g.vars, v_cstr("add_generation_prompt"), v_bool(v->add_generation_prompt));
    dict_set(c, g.vars, v_cstr("tools"), v_none());
    if (v->date_string)
        dict_set(c, g.vars, v_cstr("date_string"), v_cstr(v->date_string));
    dict_set(c, g.vars, v_cstr("raise_exception"), (val){.t = V_FUNC, .u.fn = FN_RAISE});
    dict_set(c, g.vars, v_cstr("strftime_now"), (val){.t = V_FUNC, .u.fn = FN_STRFTIME});
    dict_set(c, g.vars, v_cstr("namespace"), (val){.t = V_FUNC, .u.fn = FN_NAMESPACE});
    /* the top level is a scope of its own, as a template's body is in Jinja */
    scope top = {.vars = dict_new(c, 8), .up = &g};
    emit(r, 1, "", 0);
    exec(r, &top, t->root);
    return FX_OK;
}

int fx__chat_template_render(const fx__chat_template *t, const fx__chat_msg *msgs, size_t n,
                             const fx__chat_vars *vars, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    ctx *c = malloc(sizeof *c);
    if (!c)
        return fx__error(FX_ENOMEM, "chat template: out of memory");
    memset(c, 0, sizeof *c);
    c->ar.limit = FX__CHAT_MAX_MEMORY;
    fx__chat_vars none = {0};
    rnd r = {.c = c, .vars = vars ? vars : &none};
    int rc = render_in(&r, t, msgs, n);
    if (rc != FX_OK) {
        fx__error(rc, "%s", c->msg);
        free(r.out);
    } else {
        *out = r.out;
        *out_len = r.n;
    }
    ar_free(&c->ar);
    free(c);
    return rc;
}
