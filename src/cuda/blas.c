/* Matrix products on a CUDA device by cuBLASLt, opened at run time (blas.h). Built in every
   configuration: the cuBLASLt path with CUDA, a CPU loop in the kernels' emulation
   (FX_CUDA_EMU, tests only), and FX_EUNSUPPORTED without CUDA. */
#include "cuda/blas.h"
#include "cuda/cuda.h"

#include <stdlib.h>
#include <string.h>

/* ---- arguments ---------------------------------------------------------------------------- */

static const char *type_name(int t)
{
    return t == FX_DT_F32 ? "FX_DT_F32" : t == FX_DT_BF16 ? "FX_DT_BF16" : t == FX_DT_F16 ? "FX_DT_F16" : "?";
}

int fx__cu_gemm_check(const fx__cu_gemm *g)
{
    static const char who[] = "fx__cu_gemm_run";
    if (!g)
        return fx__error(FX_EINVAL, "%s: g is NULL", who);
    if (g->m < 0 || g->n < 0 || g->k < 0)
        return fx__error(FX_EINVAL, "%s: m = %lld, n = %lld, k = %lld must be >= 0", who, (long long)g->m,
                         (long long)g->n, (long long)g->k);
    if (g->ab_type != FX_DT_F32 && g->ab_type != FX_DT_BF16 && g->ab_type != FX_DT_F16)
        return fx__error(FX_EUNSUPPORTED, "%s: ab_type = %d is not FX_DT_F32, FX_DT_BF16 or FX_DT_F16", who,
                         g->ab_type);
    const bool c_ok = g->c_type == FX_DT_F32 || (g->ab_type != FX_DT_F32 && g->c_type == g->ab_type);
    if (!c_ok)
        return fx__error(FX_EUNSUPPORTED, "%s: c_type %s with ab_type %s: C takes FX_DT_F32, or the inputs' "
                                          "16-bit type", who, type_name(g->c_type), type_name(g->ab_type));
    const int64_t ra = g->ta ? g->m : g->k, rb = g->tb ? g->k : g->n;
    if (g->lda < (ra > 1 ? ra : 1) || g->ldb < (rb > 1 ? rb : 1) || g->ldc < (g->n > 1 ? g->n : 1))
        return fx__error(FX_EINVAL, "%s: lda = %lld, ldb = %lld, ldc = %lld must be >= %lld, %lld, %lld (the rows "
                                    "as stored, ta = %d, tb = %d)", who, (long long)g->lda, (long long)g->ldb,
                         (long long)g->ldc, (long long)(ra > 1 ? ra : 1), (long long)(rb > 1 ? rb : 1),
                         (long long)(g->n > 1 ? g->n : 1), g->ta != 0, g->tb != 0);
    if (g->m > 0 && g->n > 0) {
        if (!g->c)
            return fx__error(FX_EINVAL, "%s: c is NULL", who);
        if (g->k > 0 && (!g->a || !g->b))
            return fx__error(FX_EINVAL, "%s: %s is NULL", who, g->a ? "b" : "a");
    }
    return FX_OK;
}

#if defined(FX_CUDA_EMU)
/* ---- the emulation: a CPU loop over host memory --------------------------------------------- */

static float emu_load(const void *p, int t, int64_t i)
{
    if (t == FX_DT_F32)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    if (t == FX_DT_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    return fx_f16_to_f32(h);
}

static void emu_store(void *p, int t, int64_t i, float x)
{
    if (t == FX_DT_F32) {
        ((float *)p)[i] = x;
        return;
    }
    uint16_t h;
    if (t == FX_DT_BF16) {
        uint32_t u;
        memcpy(&u, &x, 4);
        h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40)
                                             : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    } else {
        h = fx_f32_to_f16(x);
    }
    ((uint16_t *)p)[i] = h;
}

int fx__cu_gemm_run(const fx__cu_gemm *g)
{
    int rc = fx__cu_gemm_check(g);
    if (rc != FX_OK)
        return rc;
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            float acc = 0.0f;
            for (int64_t kk = 0; kk < g->k; kk++)
                acc += emu_load(g->a, g->ab_type, g->ta ? kk * g->lda + i : i * g->lda + kk) *
                       emu_load(g->b, g->ab_type, g->tb ? j * g->ldb + kk : kk * g->ldb + j);
            float x = g->alpha * acc;
            if (g->beta != 0.0f)
                x += g->beta * emu_load(g->c, g->c_type, i * g->ldc + j);
            emu_store(g->c, g->c_type, i * g->ldc + j, x);
        }
    return FX_OK;
}

#elif defined(FLEXC_HAVE_CUDA)
/* ---- cuBLASLt ----------------------------------------------------------------------------- */

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>

/* The workspace every call may use: what the heuristic is told, so the algorithm does not
   depend on anything but the call's description. */
enum { WORKSPACE = 32 << 20, MAX_DEVICES = 64 };

/* The entry points, resolved by name (the header gives only their types). */
static struct {
    void *lib;
    cublasStatus_t (*create)(cublasLtHandle_t *);
    const char *(*status_string)(cublasStatus_t);
    cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
    cublasStatus_t (*desc_destroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t);
    cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t);
    cublasStatus_t (*layout_destroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*pref_destroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *,
                               size_t);
    cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *);
    cublasStatus_t (*matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                             cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t, const void *,
                             const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                             const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);
} lt;

/* What selects an algorithm; compared bytewise (zeroed before it is filled). */
typedef struct algo_key {
    int64_t m, n, k, lda, ldb, ldc;
    int device, ta, tb, ab_type, c_type;
    int align_a, align_b, align_c;
} algo_key;

typedef struct algo_entry {
    algo_key key;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
} algo_entry;

typedef struct workspace_entry {
    int device;
    void *stream, *mem;
} workspace_entry;

static pthread_mutex_t lt_lock = PTHREAD_MUTEX_INITIALIZER;
static int lt_state;        /* 0: not tried, 1: loaded, -1: failed (lt_why says why) */
static char lt_why[600];
static cublasLtHandle_t handles[MAX_DEVICES];
static algo_entry *algos;
static size_t n_algos, cap_algos;
static workspace_entry *spaces; /* one per (device, stream): concurrent streams never share one */
static size_t n_spaces, cap_spaces;

static int load_locked(void)
{
    if (lt_state == 1)
        return FX_OK;
    if (lt_state == -1)
        return fx__error(FX_EUNSUPPORTED, "%s", lt_why);
    const char *env = getenv("FLEXC_CUBLASLT");
    /* The loader's search first, then the toolkits' usual places (often outside the loader's
       path where a toolkit is installed), the newest directory of each pattern first. */
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
    const char *places[] = {"/usr/local/cuda*/targets/*/lib/libcublasLt.so.13",
                            "/usr/local/cuda*/lib64/libcublasLt.so.13",
                            "/usr/local/cuda*/targets/*/lib/libcublasLt.so.12",
                            "/usr/local/cuda*/lib64/libcublasLt.so.12"};
    if (env && *env) {
        lt.lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!lt.lib)
            snprintf(lt_why, sizeof lt_why, "cuBLASLt: FLEXC_CUBLASLT=%s cannot be opened (%s)", env, dlerror());
    } else {
        for (size_t i = 0; i < sizeof names / sizeof names[0] && !lt.lib; i++)
            lt.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        for (size_t i = 0; i < sizeof places / sizeof places[0] && !lt.lib; i++) {
            glob_t g;
            memset(&g, 0, sizeof g);
            if (glob(places[i], 0, NULL, &g) == 0)
                for (size_t j = g.gl_pathc; j > 0 && !lt.lib; j--)
                    lt.lib = dlopen(g.gl_pathv[j - 1], RTLD_NOW | RTLD_LOCAL);
            globfree(&g);
        }
        if (!lt.lib)
            snprintf(lt_why, sizeof lt_why, "cuBLASLt (libcublasLt.so.13 or .so.12) is not found by the dynamic "
                                            "loader nor under /usr/local/cuda*: add its directory to LD_LIBRARY_PATH "
                                            "or name the file in FLEXC_CUBLASLT");
    }
    const struct {
        const char *name;
        void *slot;
    } syms[] = {
        {"cublasLtCreate", &lt.create},
        {"cublasLtGetStatusString", &lt.status_string},
        {"cublasLtMatmulDescCreate", &lt.desc_create},
        {"cublasLtMatmulDescDestroy", &lt.desc_destroy},
        {"cublasLtMatmulDescSetAttribute", &lt.desc_set},
        {"cublasLtMatrixLayoutCreate", &lt.layout_create},
        {"cublasLtMatrixLayoutDestroy", &lt.layout_destroy},
        {"cublasLtMatmulPreferenceCreate", &lt.pref_create},
        {"cublasLtMatmulPreferenceDestroy", &lt.pref_destroy},
        {"cublasLtMatmulPreferenceSetAttribute", &lt.pref_set},
        {"cublasLtMatmulAlgoGetHeuristic", &lt.heuristic},
        {"cublasLtMatmul", &lt.matmul},
    };
    for (size_t i = 0; lt.lib && i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(lt.lib, syms[i].name);
        if (!f) {
            snprintf(lt_why, sizeof lt_why, "cuBLASLt: the library %s has no %s", env && *env ? env : "found",
                     syms[i].name);
            dlclose(lt.lib);
            lt.lib = NULL;
            break;
        }
        memcpy(syms[i].slot, &f, sizeof f); /* object to function pointer, as POSIX allows */
    }
    lt_state = lt.lib ? 1 : -1;
    return lt.lib ? FX_OK : fx__error(FX_EUNSUPPORTED, "%s", lt_why);
}

static int lt_status(cublasStatus_t s, const char *what)
{
    const char *msg = lt.status_string ? lt.status_string(s) : "?";
    switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
        return fx__error(FX_ENOMEM, "cuBLASLt %s: out of memory (%s)", what, msg);
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return fx__error(FX_EUNSUPPORTED, "cuBLASLt %s: not supported on this device (%s)", what, msg);
    case CUBLAS_STATUS_INVALID_VALUE:
        return fx__error(FX_EINVAL, "cuBLASLt %s: invalid value (%s)", what, msg);
    default:
        return fx__error(FX_EDEVICE, "cuBLASLt %s: %s", what, msg);
    }
}

static cudaDataType lt_type(int t)
{
    return t == FX_DT_BF16 ? CUDA_R_16BF : t == FX_DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The largest power of two up to 256 that divides the address. */
static int alignment(const void *p)
{
    const uintptr_t u = (uintptr_t)p;
    int a = 1;
    while (a < 256 && !(u & (uintptr_t)a))
        a <<= 1;
    return a;
}

/* The device's handle and the stream's workspace, made on first use (lock held). */
static int resources_locked(int dev, void *stream, cublasLtHandle_t *h, void **ws)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return fx__error(FX_EUNSUPPORTED, "cuBLASLt: device %d is past the %d this build handles", dev, MAX_DEVICES);
    if (!handles[dev]) {
        cublasStatus_t s = lt.create(&handles[dev]);
        if (s != CUBLAS_STATUS_SUCCESS) {
            handles[dev] = NULL;
            return lt_status(s, "handle");
        }
    }
    *h = handles[dev];
    for (size_t i = 0; i < n_spaces; i++)
        if (spaces[i].device == dev && spaces[i].stream == stream) {
            *ws = spaces[i].mem;
            return FX_OK;
        }
    if (n_spaces == cap_spaces) {
        const size_t cap = cap_spaces ? 2 * cap_spaces : 8;
        workspace_entry *t = realloc(spaces, cap * sizeof *t);
        if (!t)
            return fx__error(FX_ENOMEM, "cuBLASLt: workspace table");
        spaces = t, cap_spaces = cap;
    }
    void *mem = NULL;
    cudaError_t e = cudaMalloc(&mem, WORKSPACE);
    if (e != cudaSuccess)
        return fx__cuda_status((int)e, "cuBLASLt workspace");
    spaces[n_spaces++] = (workspace_entry){.device = dev, .stream = stream, .mem = mem};
    *ws = mem;
    return FX_OK;
}

/* The key's algorithm: the cached one, or the heuristic's first choice, cached (lock held). */
static int algo_locked(const algo_key *key, cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                       cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const algo_entry **out)
{
    for (size_t i = 0; i < n_algos; i++)
        if (!memcmp(&algos[i].key, key, sizeof *key)) {
            *out = &algos[i];
            return FX_OK;
        }
    if (n_algos == cap_algos) {
        const size_t cap = cap_algos ? 2 * cap_algos : 32;
        algo_entry *t = realloc(algos, cap * sizeof *t);
        if (!t)
            return fx__error(FX_ENOMEM, "cuBLASLt: algorithm cache");
        algos = t, cap_algos = cap;
    }
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s = lt.pref_create(&pref);
    const uint64_t ws = WORKSPACE;
    /* Split-K is allowed: cuBLASLt's reductions (in place with counters that serialise the
       pieces, or through the workspace) give the same bits on every run for one algorithm,
       workspace and GPU, which is what the cache above fixes. Without it a product with a long
       k and a small output (the loss's dh = G W: k = V) ran on 30 thread blocks, 12 ms of a
       200 ms training step on an H200. */
    const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_MASK;
    const uint32_t al[3] = {(uint32_t)key->align_b, (uint32_t)key->align_a, (uint32_t)key->align_c};
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme);
    /* The library's A is our B (row-major products are column-major ones transposed). */
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof al[2]);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.heuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found);
    if (pref)
        lt.pref_destroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_status(s, "algorithm heuristic");
    if (found < 1 || res.state != CUBLAS_STATUS_SUCCESS)
        return fx__error(FX_EUNSUPPORTED, "cuBLASLt: no algorithm for a %lld x %lld x %lld product (%s in, %s out, "
                                          "ta = %d, tb = %d)", (long long)key->m, (long long)key->n,
                         (long long)key->k, type_name(key->ab_type), type_name(key->c_type), key->ta, key->tb);
    algos[n_algos] = (algo_entry){.key = *key, .algo = res.algo, .workspace = res.workspaceSize};
    *out = &algos[n_algos++];
    return FX_OK;
}

/* k = 0: C = beta C. Only beta 0 (zeros) and 1 (nothing) are taken. */
static int empty_k(const fx__cu_gemm *g)
{
    if (g->beta == 1.0f)
        return FX_OK;
    if (g->beta != 0.0f)
        return fx__error(FX_EUNSUPPORTED, "fx__cu_gemm_run: k = 0 takes beta 0 or 1 (beta = %g)", (double)g->beta);
    const size_t es = g->c_type == FX_DT_F32 ? 4 : 2;
    cudaError_t e = cudaMemset2DAsync(g->c, (size_t)g->ldc * es, 0, (size_t)g->n * es, (size_t)g->m,
                                      (cudaStream_t)g->stream);
    return e == cudaSuccess ? FX_OK : fx__cuda_status((int)e, "fx__cu_gemm_run: clearing C");
}

int fx__cu_gemm_run(const fx__cu_gemm *g)
{
    int rc = fx__cu_gemm_check(g);
    if (rc != FX_OK || g->m == 0 || g->n == 0)
        return rc;
    if (g->k == 0)
        return empty_k(g);
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return fx__cuda_status((int)e, "fx__cu_gemm_run");
    pthread_mutex_lock(&lt_lock);
    rc = load_locked();
    pthread_mutex_unlock(&lt_lock);
    if (rc != FX_OK)
        return rc;

    const bool ta = g->ta != 0, tb = g->tb != 0;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    const cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    /* Row-major C [m, n] is column-major C^T [n, m] = op(B)^T op(A)^T: the library's A is B
       as stored ([n, k] column-major, or [k, n] transposed), its B is A. */
    cublasStatus_t s = lt.desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.layout_create(&la, lt_type(g->ab_type), (uint64_t)(tb ? g->k : g->n), (uint64_t)(tb ? g->n : g->k),
                             g->ldb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.layout_create(&lb, lt_type(g->ab_type), (uint64_t)(ta ? g->m : g->k), (uint64_t)(ta ? g->k : g->m),
                             g->lda);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.layout_create(&lc, lt_type(g->c_type), (uint64_t)g->n, (uint64_t)g->m, g->ldc);
    if (s != CUBLAS_STATUS_SUCCESS)
        rc = lt_status(s, "descriptors");

    algo_key key;
    memset(&key, 0, sizeof key);
    key.m = g->m, key.n = g->n, key.k = g->k, key.lda = g->lda, key.ldb = g->ldb, key.ldc = g->ldc;
    key.device = dev, key.ta = ta, key.tb = tb, key.ab_type = g->ab_type, key.c_type = g->c_type;
    key.align_a = alignment(g->a), key.align_b = alignment(g->b), key.align_c = alignment(g->c);
    cublasLtHandle_t h = NULL;
    void *ws = NULL;
    cublasLtMatmulAlgo_t algo;
    size_t ws_bytes = 0;
    if (rc == FX_OK) {
        pthread_mutex_lock(&lt_lock);
        const algo_entry *ae = NULL;
        rc = resources_locked(dev, g->stream, &h, &ws);
        if (rc == FX_OK)
            rc = algo_locked(&key, h, op, la, lb, lc, &ae);
        if (rc == FX_OK)
            algo = ae->algo, ws_bytes = ae->workspace;
        pthread_mutex_unlock(&lt_lock);
    }
    if (rc == FX_OK) {
        s = lt.matmul(h, op, &g->alpha, g->b, la, g->a, lb, &g->beta, g->c, lc, g->c, lc, &algo, ws, ws_bytes,
                      (cudaStream_t)g->stream);
        if (s != CUBLAS_STATUS_SUCCESS)
            rc = lt_status(s, "matmul");
    }
    if (lc)
        lt.layout_destroy(lc);
    if (lb)
        lt.layout_destroy(lb);
    if (la)
        lt.layout_destroy(la);
    if (op)
        lt.desc_destroy(op);
    return rc;
}

#else
/* ---- no CUDA in the build ----------------------------------------------------------------- */

int fx__cu_gemm_run(const fx__cu_gemm *g)
{
    int rc = fx__cu_gemm_check(g);
    if (rc != FX_OK)
        return rc;
    return fx__error(FX_EUNSUPPORTED, "fx__cu_gemm_run: this build of flexc has no CUDA backend (configure with "
                                      "-DFLEXC_CUDA=ON and a CUDA toolkit)");
}
#endif
