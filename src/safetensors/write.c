/* Writing safetensors files atomically: everything is checked first, then the header is built,
   then a temporary file in the target's directory is written, fsynced and renamed over the
   target, and the directory is fsynced so the rename itself is durable. */
#include "st_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- checks ------------------------------------------------------------------------------------- */

typedef struct named {
    const char *name;
    size_t idx;
} named;

static int cmp_named(const void *a, const void *b)
{
    const named *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->idx < y->idx ? -1 : x->idx > y->idx);
}

/* A string the header can hold: valid UTF-8 (JSON text must be). */
static int check_text(const char *what, size_t i, const char *s)
{
    size_t bad;
    if (!s)
        return fx__error(FX_EINVAL, "%s[%zu] is NULL", what, i);
    if (!fx__st_utf8_valid((const unsigned char *)s, strlen(s), &bad))
        return fx__error(FX_EINVAL, "%s[%zu] is not valid UTF-8 (byte %zu)", what, i, bad);
    return FX_OK;
}

/* Sorts names[0..n) and fails on the first duplicate. */
static int check_unique(named *names, size_t n, const char *what)
{
    qsort(names, n, sizeof *names, cmp_named);
    for (size_t i = 1; i < n; i++) {
        if (!strcmp(names[i - 1].name, names[i].name)) {
            char q[FX__ST_QUOTE_CAP];
            return fx__error(FX_EINVAL, "%s %s appears twice (entries %zu and %zu)", what,
                             fx__st_quote(q, names[i].name), names[i - 1].idx, names[i].idx);
        }
    }
    return FX_OK;
}

int fx__st_save_check(const fx_tensor_view *tensors, size_t n, const char *const *metadata, size_t *order)
{
    if (n > 0 && !tensors)
        return fx__error(FX_EINVAL, "tensors is NULL but n = %zu", n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const fx_tensor_view *t = &tensors[i];
        int rc = check_text("tensors.name", i, t->name);
        if (rc != FX_OK)
            return rc;
        char q[FX__ST_QUOTE_CAP];
        const char *nm = fx__st_quote(q, t->name);
        if (!strcmp(t->name, "__metadata__"))
            return fx__error(FX_EINVAL, "tensor[%zu] is named '__metadata__', which the format reserves", i);
        size_t es = fx_dtype_size(t->dtype);
        if (!es)
            return fx__error(FX_EINVAL, "tensor %s: dtype %d is not a dtype", nm, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > FX_MAX_DIMS)
            return fx__error(FX_EINVAL, "tensor %s: ndim = %d is outside [0, %d]", nm, t->ndim, FX_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0)
                return fx__error(FX_EINVAL, "tensor %s: shape[%d] = %lld is negative", nm, d,
                                 (long long)t->shape[d]);
        int64_t numel = fx_tensor_numel(t);
        uint64_t bytes;
        if (numel < 0 || __builtin_mul_overflow((uint64_t)numel, (uint64_t)es, &bytes) || bytes > SIZE_MAX)
            return fx__error(FX_EINVAL, "tensor %s: the shape's byte size overflows", nm);
        if (t->nbytes != bytes)
            return fx__error(FX_EINVAL, "tensor %s: nbytes = %zu but shape x %s needs %llu", nm, t->nbytes,
                             fx_dtype_name(t->dtype), (unsigned long long)bytes);
        if (bytes > 0 && !t->data)
            return fx__error(FX_EINVAL, "tensor %s: data is NULL", nm);
        if (__builtin_add_overflow(total, bytes, &total) || total > (uint64_t)INT64_MAX)
            return fx__error(FX_EINVAL, "the tensors' total size overflows");
    }
    size_t nmeta = 0;
    if (metadata) {
        for (; metadata[2 * nmeta]; nmeta++) {
            int rc = check_text("metadata key", nmeta, metadata[2 * nmeta]);
            if (rc != FX_OK)
                return rc;
            if (!metadata[2 * nmeta + 1]) {
                char q[FX__ST_QUOTE_CAP];
                return fx__error(FX_EINVAL, "metadata key %s has no value (the list is key, value, ..., NULL)",
                                 fx__st_quote(q, metadata[2 * nmeta]));
            }
            if ((rc = check_text("metadata value", nmeta, metadata[2 * nmeta + 1])) != FX_OK)
                return rc;
        }
    }
    size_t most = n > nmeta ? n : nmeta;
    named *names = fx__alloc((most ? most : 1) * sizeof *names);
    if (!names)
        return FX_ENOMEM;
    for (size_t i = 0; i < n; i++)
        names[i] = (named){tensors[i].name, i};
    int rc = check_unique(names, n, "tensor name");
    if (rc == FX_OK) {
        for (size_t i = 0; i < nmeta; i++)
            names[i] = (named){metadata[2 * i], i};
        rc = check_unique(names, nmeta, "metadata key");
    }
    fx__free(names);
    if (rc != FX_OK)
        return rc;

    /* Widest dtypes first, caller order within a width: with the header padded to 8 and every
       tensor a whole number of elements, each tensor then starts aligned for its dtype. */
    size_t k = 0;
    for (size_t w = 8; w >= 1; w /= 2)
        for (size_t i = 0; i < n; i++)
            if (fx_dtype_size(tensors[i].dtype) == w)
                order[k++] = i;
    return FX_OK;
}

/* ---- the header ------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->failed = true;
                return;
            }
            cap *= 2;
        }
        char *p = fx__alloc(cap);
        if (!p) {
            b->failed = true;
            return;
        }
        if (b->len)
            memcpy(p, b->p, b->len);
        fx__free(b->p);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string: quotes, backslashes and control characters escaped, the rest (valid UTF-8)
   as is. */
static void sb_json(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        sb_put(b, run, (size_t)(s - run));
        char esc[8];
        switch (c) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        }
        run = s + 1;
    }
    sb_put(b, run, (size_t)(s - run));
    sb_put(b, "\"", 1);
}

int fx__st_header_build(char **out, size_t *len, const fx_tensor_view *tensors, const size_t *order,
                        size_t n, const char *const *metadata)
{
    sbuf b = {0};
    sb_put(&b, "{", 1);
    bool first = true;
    if (metadata && metadata[0]) {
        sb_str(&b, "\"__metadata__\":{");
        for (size_t i = 0; metadata[2 * i]; i++) {
            if (i)
                sb_put(&b, ",", 1);
            sb_json(&b, metadata[2 * i]);
            sb_put(&b, ":", 1);
            sb_json(&b, metadata[2 * i + 1]);
        }
        sb_put(&b, "}", 1);
        first = false;
    }
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        const fx_tensor_view *t = &tensors[order[k]];
        if (!first)
            sb_put(&b, ",", 1);
        first = false;
        sb_json(&b, t->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, fx_dtype_name(t->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d)
                sb_put(&b, ",", 1);
            sb_u64(&b, (uint64_t)t->shape[d]);
        }
        sb_str(&b, "],\"data_offsets\":[");
        sb_u64(&b, off);
        sb_put(&b, ",", 1);
        off += t->nbytes;
        sb_u64(&b, off);
        sb_str(&b, "]}");
    }
    sb_put(&b, "}", 1);
    while (!b.failed && b.len % 8)
        sb_put(&b, " ", 1);
    if (b.failed) {
        fx__free(b.p);
        return fx__error(FX_ENOMEM, "cannot build a header of %zu+ bytes", b.len);
    }
    if (b.len > FX__ST_MAX_HEADER) {
        fx__free(b.p);
        return fx__error(FX_EINVAL, "the header would be %zu bytes, more than the format's limit of %llu "
                         "(too many or too long names)", b.len, FX__ST_MAX_HEADER);
    }
    *out = b.p;
    *len = b.len;
    return FX_OK;
}

/* ---- the file ----------------------------------------------------------------------------------- */

static int write_all(int fd, const void *data, size_t n, const char *tmp)
{
    const unsigned char *p = data;
    while (n > 0) {
        size_t chunk = n < (1u << 30) ? n : (1u << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return fx__error(FX_EIO, "cannot write %s: %s", tmp, strerror(errno));
        }
        if (w == 0)
            return fx__error(FX_EIO, "cannot write %s: the device accepted no bytes", tmp);
        p += w;
        n -= (size_t)w;
    }
    return FX_OK;
}

/* A fresh name next to `path`, created exclusively (O_EXCL), so concurrent savers never share
   a temporary. */
static int open_temp(const char *path, char **tmp_out, int *fd_out)
{
    size_t len = strlen(path) + 64;
    char *tmp = malloc(len);
    if (!tmp)
        return fx__error(FX_ENOMEM, "cannot allocate a temporary file name");
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
    static unsigned counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned c = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        snprintf(tmp, len, "%.*s.%s.tmp-%ld-%u-%lx", (int)dirlen, path, path + dirlen, (long)getpid(), c,
                 (unsigned long)ts.tv_nsec ^ (unsigned long)attempt * 2654435761u);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            *tmp_out = tmp;
            *fd_out = fd;
            return FX_OK;
        }
        if (errno != EEXIST) {
            int e = errno;
            int rc = fx__error(FX_EIO, "cannot create a temporary file in the directory of %s: %s", path,
                               strerror(e));
            free(tmp);
            return rc;
        }
    }
    free(tmp);
    return fx__error(FX_EIO, "cannot find a free temporary file name next to %s", path);
}

static int sync_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = strdup(".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = strndup(path, n);
    }
    if (!dir)
        return fx__error(FX_ENOMEM, "cannot allocate a directory name");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = FX_OK;
    if (fd < 0) {
        rc = fx__error(FX_EIO, "saved %s, but cannot open its directory to sync it: %s", path, strerror(errno));
    } else {
        /* Some file systems cannot sync a directory (EINVAL); nothing more can be done there. */
        if (fsync(fd) != 0 && errno != EINVAL)
            rc = fx__error(FX_EIO, "saved %s, but syncing its directory failed: %s", path, strerror(errno));
        close(fd);
    }
    free(dir);
    return rc;
}

int fx_safetensors_save(const char *path, const fx_tensor_view *tensors, size_t n,
                        const char *const *metadata)
{
    if (!path || !path[0])
        return fx__error(FX_EINVAL, "path is %s", path ? "empty" : "NULL");
    size_t *order = fx__alloc((n ? n : 1) * sizeof *order);
    if (!order)
        return FX_ENOMEM;
    char *hdr = NULL, *tmp = NULL;
    size_t hlen = 0;
    int fd = -1;
    int rc = fx__st_save_check(tensors, n, metadata, order);
    if (rc == FX_OK)
        rc = fx__st_header_build(&hdr, &hlen, tensors, order, n, metadata);
    if (rc == FX_OK)
        rc = open_temp(path, &tmp, &fd);
    if (rc == FX_OK) {
        unsigned char len8[8];
        for (int k = 0; k < 8; k++)
            len8[k] = (unsigned char)((uint64_t)hlen >> 8 * k);
        rc = write_all(fd, len8, 8, tmp);
        if (rc == FX_OK)
            rc = write_all(fd, hdr, hlen, tmp);
        for (size_t k = 0; rc == FX_OK && k < n; k++)
            if (tensors[order[k]].nbytes)
                rc = write_all(fd, tensors[order[k]].data, tensors[order[k]].nbytes, tmp);
        if (rc == FX_OK && fsync(fd) != 0)
            rc = fx__error(FX_EIO, "cannot sync %s: %s", tmp, strerror(errno));
        if (close(fd) != 0 && rc == FX_OK)
            rc = fx__error(FX_EIO, "cannot close %s: %s", tmp, strerror(errno));
        if (rc == FX_OK && rename(tmp, path) != 0)
            rc = fx__error(FX_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (rc != FX_OK)
            unlink(tmp); /* the target was not touched */
        else
            rc = sync_dir(path);
    }
    free(tmp);
    fx__free(hdr);
    fx__free(order);
    return rc;
}
