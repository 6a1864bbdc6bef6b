/*
 * The test harness: typed checks that print both values, float64-reference comparisons that
 * print the largest error and the first mismatch, guard zones around outputs, and a runner.
 *
 *     static void test_add(void) {
 *         FXT_EQ_INT(1 + 1, 2);
 *         float *out = fxt_guarded(n);          // guard values on both sides
 *         ...
 *         fxt_close_f32("out", out, ref, n, 1e-6, 1e-5);   // |got-ref| <= atol + rtol*|ref|
 *         fxt_guarded_free(out);                // fails the test if a guard was overwritten
 *     }
 *     int main(int argc, char **argv) {
 *         FXT_RUN(test_add);
 *         return fxt_finish();
 *     }
 *
 * A program run with a test name as argument runs only that test. Exit status: non-zero
 * when any check failed.
 */
#ifndef FLEXC_TEST_HARNESS_H
#define FLEXC_TEST_HARNESS_H

#include <flexc.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fxt_failed_checks;  /* in the current test */
static int fxt_failed_tests;
static int fxt_passed_tests;
static const char *fxt_only;    /* run just this test, if set */

#define FXT_FAIL(...)                                                              \
    do {                                                                           \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                            \
        fprintf(stderr, __VA_ARGS__);                                              \
        fputc('\n', stderr);                                                       \
        fxt_failed_checks++;                                                       \
    } while (0)

#define FXT_CHECK(cond)                                                            \
    do {                                                                           \
        if (!(cond))                                                               \
            FXT_FAIL("check failed: %s", #cond);                                   \
    } while (0)

#define FXT_EQ_INT(a, b)                                                           \
    do {                                                                           \
        long long fxt_a_ = (long long)(a), fxt_b_ = (long long)(b);                \
        if (fxt_a_ != fxt_b_)                                                      \
            FXT_FAIL("%s == %s failed: %lld vs %lld", #a, #b, fxt_a_, fxt_b_);     \
    } while (0)

#define FXT_EQ_STR(a, b)                                                           \
    do {                                                                           \
        const char *fxt_a_ = (a), *fxt_b_ = (b);                                   \
        if (!fxt_a_ || !fxt_b_ || strcmp(fxt_a_, fxt_b_) != 0)                     \
            FXT_FAIL("%s == %s failed: \"%s\" vs \"%s\"", #a, #b,                 \
                     fxt_a_ ? fxt_a_ : "(null)", fxt_b_ ? fxt_b_ : "(null)");      \
    } while (0)

/* The string a contains b. */
#define FXT_HAS_STR(a, b)                                                          \
    do {                                                                           \
        const char *fxt_a_ = (a), *fxt_b_ = (b);                                   \
        if (!fxt_a_ || !strstr(fxt_a_, fxt_b_))                                    \
            FXT_FAIL("\"%s\" does not contain \"%s\"", fxt_a_ ? fxt_a_ : "(null)", fxt_b_); \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define FXT_NEAR(a, b, atol, rtol)                                                 \
    do {                                                                           \
        double fxt_a_ = (double)(a), fxt_b_ = (double)(b);                         \
        double fxt_tol_ = (atol) + (rtol) * fabs(fxt_b_);                          \
        if (!(fabs(fxt_a_ - fxt_b_) <= fxt_tol_))                                  \
            FXT_FAIL("%s ~= %s failed: %.9g vs %.9g (|diff| %.3g > tol %.3g)", #a, #b, \
                     fxt_a_, fxt_b_, fabs(fxt_a_ - fxt_b_), fxt_tol_);             \
    } while (0)

/* A call that must succeed; prints the status and fx_last_error() if not. */
#define FXT_OK(call)                                                               \
    do {                                                                           \
        int fxt_rc_ = (call);                                                      \
        if (fxt_rc_ != FX_OK)                                                      \
            FXT_FAIL("%s returned %s: %s", #call, fx_status_name(fxt_rc_), fx_last_error()); \
    } while (0)

/* A call that must fail with `status`; its message must contain `msg` (may be ""). */
#define FXT_STATUS(call, status, msg)                                              \
    do {                                                                           \
        fx_clear_error();                                                          \
        int fxt_rc_ = (call);                                                      \
        if (fxt_rc_ != (status))                                                   \
            FXT_FAIL("%s returned %s, expected %s (%s)", #call, fx_status_name(fxt_rc_), \
                     fx_status_name(status), fx_last_error());                     \
        else if (!strstr(fx_last_error(), (msg)))                                  \
            FXT_FAIL("%s: message \"%s\" does not contain \"%s\"", #call, fx_last_error(), (msg)); \
        else if ((status) != FX_OK && fx_last_error()[0] == '\0')                  \
            FXT_FAIL("%s failed without a message", #call);                        \
    } while (0)

/* Compares got against a float64 reference: |got-ref| <= atol + rtol*|ref| everywhere, NaN
   matching only NaN and infinities matching exactly. Prints the largest error and the first
   mismatching index. Returns true when all match. */
static inline bool fxt_close_f32(const char *what, const float *got, const double *ref, size_t n,
                                 double atol, double rtol)
{
    size_t bad = 0, first = (size_t)-1, worst = 0;
    double worst_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i], err;
        bool ok;
        if (isnan(r) || isnan(g)) {
            ok = isnan(r) && isnan(g);
            err = ok ? 0.0 : INFINITY;
        } else if (isinf(r) || isinf(g)) {
            ok = g == r;
            err = ok ? 0.0 : INFINITY;
        } else {
            err = fabs(g - r);
            ok = err <= atol + rtol * fabs(r);
        }
        if (err > worst_err) {
            worst_err = err;
            worst = i;
        }
        if (!ok) {
            if (!bad)
                first = i;
            bad++;
        }
    }
    if (bad) {
        FXT_FAIL("%s: %zu of %zu values off (atol %.2g, rtol %.2g); first at [%zu]: %.9g vs ref %.9g; "
                 "largest error %.3g at [%zu]: %.9g vs ref %.9g",
                 what, bad, n, atol, rtol, first, (double)got[first], ref[first], worst_err, worst,
                 (double)got[worst], ref[worst]);
        return false;
    }
    return true;
}

/* Bitwise equality of two float arrays (the determinism checks). */
static inline bool fxt_bitwise_f32(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            FXT_FAIL("%s: not bitwise equal at [%zu] of %zu: %.9g vs %.9g", what, i, n, (double)a[i],
                     (double)b[i]);
            return false;
        }
    }
    return true;
}

/* ---- guard zones -------------------------------------------------------------------------- */

#define FXT_GUARD_FLOATS 64
#define FXT_GUARD_BITS 0x7fc0deadu /* a quiet NaN no kernel produces */

/* n floats with FXT_GUARD_FLOATS guard values on each side; the payload is filled with a
   signalling pattern too, so a kernel that reads an output before writing it shows. */
static inline float *fxt_guarded(size_t n)
{
    size_t total = n + 2 * FXT_GUARD_FLOATS + 2; /* +2: the stored length */
    uint32_t *raw = (uint32_t *)malloc(total * sizeof(uint32_t));
    if (!raw) {
        fprintf(stderr, "fxt_guarded: out of memory (%zu floats)\n", n);
        exit(2);
    }
    uint64_t len = n;
    memcpy(raw, &len, sizeof len);
    for (size_t i = 2; i < total; i++)
        raw[i] = FXT_GUARD_BITS;
    return (float *)(raw + 2 + FXT_GUARD_FLOATS);
}

static inline float *fxt_guarded_copy(const float *src, size_t n)
{
    float *p = fxt_guarded(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* Checks both guard zones; returns false (and fails the test) if any was written. */
static inline bool fxt_guards_ok(const char *what, const float *p)
{
    const uint32_t *raw = (const uint32_t *)p - FXT_GUARD_FLOATS - 2;
    uint64_t n;
    memcpy(&n, raw, sizeof n);
    const uint32_t *lo = raw + 2, *hi = (const uint32_t *)p + n;
    for (size_t i = 0; i < FXT_GUARD_FLOATS; i++) {
        if (lo[i] != FXT_GUARD_BITS || hi[i] != FXT_GUARD_BITS) {
            FXT_FAIL("%s: guard zone overwritten (%s, word %zu)", what, lo[i] != FXT_GUARD_BITS ? "before" : "after", i);
            return false;
        }
    }
    return true;
}

static inline void fxt_guarded_free(const char *what, float *p)
{
    if (!p)
        return;
    fxt_guards_ok(what, p);
    free((uint32_t *)p - FXT_GUARD_FLOATS - 2);
}

/* ---- data ------------------------------------------------------------------------------------ */

/* Deterministic test data in [lo, hi). */
static inline float *fxt_random(size_t n, float lo, float hi, uint64_t seed)
{
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "fxt_random: out of memory\n");
        exit(2);
    }
    fx_rng_fill_uniform(p, (int64_t)n, lo, hi, seed, 0);
    return p;
}

static inline double *fxt_alloc_f64(size_t n)
{
    double *p = (double *)calloc(n ? n : 1, sizeof(double));
    if (!p) {
        fprintf(stderr, "fxt_alloc_f64: out of memory\n");
        exit(2);
    }
    return p;
}

/* ---- runner ---------------------------------------------------------------------------------- */

static inline void fxt_run(const char *name, void (*fn)(void))
{
    if (fxt_only && strcmp(fxt_only, name) != 0)
        return;
    fxt_failed_checks = 0;
    fprintf(stderr, "[ RUN  ] %s\n", name);
    fn();
    if (fxt_failed_checks) {
        fprintf(stderr, "[ FAIL ] %s (%d failed checks)\n", name, fxt_failed_checks);
        fxt_failed_tests++;
    } else {
        fprintf(stderr, "[  OK  ] %s\n", name);
        fxt_passed_tests++;
    }
}

#define FXT_INIT(argc, argv) (fxt_only = (argc) > 1 ? (argv)[1] : NULL)
#define FXT_RUN(fn) fxt_run(#fn, fn)

static inline int fxt_finish(void)
{
    fprintf(stderr, "%d passed, %d failed\n", fxt_passed_tests, fxt_failed_tests);
    if (fxt_passed_tests + fxt_failed_tests == 0) {
        fprintf(stderr, "no test ran%s%s\n", fxt_only ? " matching " : "", fxt_only ? fxt_only : "");
        return 1;
    }
    return fxt_failed_tests ? 1 : 0;
}

#endif
