/* The memory this process may still take before the machine swaps or the OOM killer steps in:
   the smaller of the kernel's MemAvailable and the room under the cgroup's limit, so that a
   run can add up its buffers and be refused before it allocates them (docs/train.md,
   "Memory"). */
#include "core.h"
#include "file.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- parsing ---------------------------------------------------------------------------------- */

/* The number after `key` at the start of a line of text ("MemAvailable:", "inactive_file "). */
static bool fx__mem_field(const char *text, const char *key, uint64_t *v)
{
    size_t k = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, key, k) != 0)
            continue;
        char *end;
        errno = 0;
        unsigned long long x = strtoull(p + k, &end, 10);
        if (end == p + k || errno == ERANGE)
            return false;
        *v = x;
        return true;
    }
    return false;
}

bool fx__mem_parse_meminfo(const char *text, uint64_t *bytes)
{
    uint64_t kb;
    if (!text || !fx__mem_field(text, "MemAvailable:", &kb) || kb > UINT64_MAX / 1024)
        return false;
    *bytes = kb * 1024;
    return true;
}

/* A whole decimal number (surrounding white space allowed). */
static bool fx__mem_number(const char *s, uint64_t *v)
{
    if (!s)
        return false;
    while (*s == ' ' || *s == '\t')
        s++;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *s == '-' || errno == ERANGE)
        return false;
    while (*end == ' ' || *end == '\t' || *end == '\n')
        end++;
    if (*end)
        return false;
    *v = x;
    return true;
}

bool fx__mem_parse_cgroup(const char *limit, const char *usage, const char *stat, uint64_t *room)
{
    uint64_t lim, used, inactive = 0;
    /* v2 writes "max" for no limit; v1 a page-rounded 2^63 - 1. */
    if (!fx__mem_number(limit, &lim) || lim >= (uint64_t)1 << 62 || !fx__mem_number(usage, &used))
        return false;
    /* Page cache of files not touched lately is counted in the usage but given back on demand
       (a working set, as the kubelet counts it): v1's hierarchical total first. */
    if (stat && !fx__mem_field(stat, "total_inactive_file ", &inactive))
        fx__mem_field(stat, "inactive_file ", &inactive);
    used -= inactive < used ? inactive : used;
    *room = lim > used ? lim - used : 0;
    return true;
}

/* ---- the probe ---------------------------------------------------------------------------------- */

/* The text of a small file (a /proc or cgroup file reports no size): false when it cannot be
   read; a special file never blocks (fx__open_regular). */
static bool fx__mem_read(const char *path, char *buf, size_t cap)
{
    int fd = fx__open_regular(path, NULL);
    if (fd < 0)
        return false;
    size_t got = 0;
    while (got + 1 < cap) {
        ssize_t r = read(fd, buf + got, cap - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    return got > 0;
}

static bool fx__is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The cgroup paths of this process: v2's ("0::/path") and v1's memory controller's. */
static void fx__mem_self_paths(const char *text, char *v2, char *v1, size_t n)
{
    snprintf(v2, n, "/");
    snprintf(v1, n, "/");
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *c1 = strchr(p, ':'), *eol = strchr(p, '\n');
        const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || (eol && c2 > eol))
            continue;
        size_t len = (size_t)((eol ? eol : c2 + strlen(c2)) - (c2 + 1));
        if (c2 == c1 + 1) {
            snprintf(v2, n, "%.*s", (int)len, c2 + 1);
            continue;
        }
        /* The controllers are a comma-separated list: "memory" among them. */
        for (const char *q = c1 + 1; q < c2;) {
            const char *comma = memchr(q, ',', (size_t)(c2 - q));
            const char *e = comma ? comma : c2;
            if (e - q == 6 && !strncmp(q, "memory", 6))
                snprintf(v1, n, "%.*s", (int)len, c2 + 1);
            q = e + 1;
        }
    }
}

/* The room under each limit from the process's cgroup up to the hierarchy's root (a parent's
   limit binds too); the smallest into *out when it is below what *out holds. Under a cgroup
   namespace the process's path is not below the mount, whose root is then its own cgroup. */
static void fx__mem_walk(fx__mem_avail *out, const char *base, const char *path, const char *limit_file,
                         const char *usage_file, const char *source)
{
    char dir[4096], f[4200], lim[64], use[64], stat[8192];
    if (snprintf(dir, sizeof dir, "%s%s", base, path) >= (int)sizeof dir || !fx__is_dir(dir))
        snprintf(dir, sizeof dir, "%s", base);
    size_t blen = strlen(base);
    for (;;) {
        size_t n = strlen(dir);
        while (n > blen && dir[n - 1] == '/')
            dir[--n] = '\0';
        snprintf(f, sizeof f, "%s/%s", dir, limit_file);
        bool have = fx__mem_read(f, lim, sizeof lim);
        snprintf(f, sizeof f, "%s/%s", dir, usage_file);
        have = have && fx__mem_read(f, use, sizeof use);
        snprintf(f, sizeof f, "%s/memory.stat", dir);
        bool have_stat = fx__mem_read(f, stat, sizeof stat);
        uint64_t room;
        if (have && fx__mem_parse_cgroup(lim, use, have_stat ? stat : NULL, &room) && room < out->bytes) {
            out->bytes = room;
            out->source = source;
        }
        char *slash = strrchr(dir, '/');
        if (n <= blen || !slash || (size_t)(slash - dir) < blen)
            return;
        *slash = '\0';
    }
}

void fx__mem_probe(fx__mem_avail *out, const fx__mem_files *f)
{
    const fx__mem_files sys = {"/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup"};
    if (!f)
        f = &sys;
    *out = (fx__mem_avail){.bytes = UINT64_MAX, .source = "unknown"};
    char text[8192], v2[2048], v1[2048], base[4200];
    uint64_t b;
    if (fx__mem_read(f->meminfo, text, sizeof text) && fx__mem_parse_meminfo(text, &b))
        *out = (fx__mem_avail){.bytes = b, .source = "MemAvailable"};
    fx__mem_self_paths(fx__mem_read(f->self_cgroup, text, sizeof text) ? text : "", v2, v1, sizeof v2);
    /* v2 is mounted at the root, or beside v1 in unified/ (the hybrid layout). */
    const char *v2_at[] = {"", "/unified"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(base, sizeof base, "%s%s/cgroup.controllers", f->cgroup_root, v2_at[i]);
        if (!fx__mem_read(base, text, sizeof text))
            continue;
        snprintf(base, sizeof base, "%s%s", f->cgroup_root, v2_at[i]);
        fx__mem_walk(out, base, v2, "memory.max", "memory.current", "cgroup v2 memory.max - memory.current");
    }
    snprintf(base, sizeof base, "%s/memory", f->cgroup_root);
    if (fx__is_dir(base))
        fx__mem_walk(out, base, v1, "memory.limit_in_bytes", "memory.usage_in_bytes",
                     "cgroup v1 memory.limit_in_bytes - memory.usage_in_bytes");
}

int fx__mem_available(fx__mem_avail *out)
{
    const char *env = getenv("FLEXC_MEM_AVAILABLE");
    if (env && *env) {
        uint64_t v;
        if (!fx__mem_number(env, &v))
            return fx__error(FX_EINVAL, "FLEXC_MEM_AVAILABLE='%s' is not a number of bytes", env);
        *out = (fx__mem_avail){.bytes = v, .source = "FLEXC_MEM_AVAILABLE"};
        return FX_OK;
    }
    fx__mem_probe(out, NULL);
    return FX_OK;
}

uint64_t fx__mem_resident(void)
{
    char text[256];
    unsigned long long size, resident;
    long page = sysconf(_SC_PAGESIZE);
    if (!fx__mem_read("/proc/self/statm", text, sizeof text) || sscanf(text, "%llu %llu", &size, &resident) != 2 ||
        page <= 0)
        return 0;
    return (uint64_t)resident * (uint64_t)page;
}

/* ---- the check ----------------------------------------------------------------------------------- */

static atomic_bool fx__mem_check_off;

void fx__mem_set_check(bool on) { atomic_store(&fx__mem_check_off, !on); }

bool fx__mem_check_on(void)
{
    const char *env = getenv("FLEXC_NO_MEMORY_CHECK");
    return !atomic_load(&fx__mem_check_off) && !(env && *env && strcmp(env, "0") != 0);
}

const char *fx__mem_unit(uint64_t bytes, double *scale)
{
    bool gb = bytes >= 1000000000u;
    *scale = gb ? 1e9 : 1e6;
    return gb ? "GB" : "MB";
}

uint64_t fx__mem_room(const fx__mem_avail *a, uint64_t held)
{
    if (a->bytes == UINT64_MAX)
        return UINT64_MAX;
    /* The rest is the page cache's, other processes' as they grow, and the plan's error: a run
       planned at all of MemAvailable is the one that brings the machine to a halt. */
    uint64_t usable = a->bytes / 100 * FX__MEM_USABLE_PERCENT + a->bytes % 100 * FX__MEM_USABLE_PERCENT / 100;
    return usable > UINT64_MAX - held ? UINT64_MAX : usable + held;
}

int fx__mem_check(uint64_t need, uint64_t held, const char *what, const char *detail, fx__mem_avail *avail)
{
    fx__mem_avail a = {.bytes = UINT64_MAX, .source = "unknown"};
    int rc = fx__mem_available(&a);
    if (avail)
        *avail = a;
    uint64_t room = fx__mem_room(&a, held);
    if (rc || !fx__mem_check_on() || need <= room)
        return rc;
    double sn, sr;
    const char *un = fx__mem_unit(need, &sn), *ur = fx__mem_unit(room, &sr);
    return fx__error(FX_ENOMEM, "%s needs %.2f %s of memory%s%s%s, and %.2f %s is available (%d%% of %s)", what,
                     (double)need / sn, un, detail ? " (" : "", detail ? detail : "", detail ? ")" : "",
                     (double)room / sr, ur, FX__MEM_USABLE_PERCENT, a.source);
}
