/* llm.c's token files: 256 int32 of header (magic, version, token count), then the tokens as
   uint16 (magic 20240520, version 1) or uint32 (magic 20240801, version 7). Little-endian. */
#include "tok_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    HEADER_INTS = 256,
    MAGIC16 = 20240520, VERSION16 = 1,
    MAGIC32 = 20240801, VERSION32 = 7,
    WBUF = 1 << 16, /* tokens buffered before a write */
};

struct fx_token_writer {
    FILE *f;
    char *path, *tmp;
    int64_t vocab, count;
    int width; /* 2 or 4 */
    unsigned char buf[WBUF * 4];
    size_t nbuf;
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *d = fx__alloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

static void writer_free(fx_token_writer *w)
{
    if (w->f)
        fclose(w->f);
    fx__free(w->path);
    fx__free(w->tmp);
    fx__free(w);
}

int fx_token_writer_open(fx_token_writer **out, const char *path, int64_t vocab_size)
{
    if (!out || !path)
        return fx__error(FX_EINVAL, "out and path must not be NULL");
    *out = NULL;
    if (vocab_size <= 0 || vocab_size > (int64_t)UINT32_MAX + 1)
        return fx__error(FX_EINVAL, "vocab_size = %lld must be in [1, 2^32]", (long long)vocab_size);
    fx_token_writer *w = fx__calloc(1, sizeof *w);
    if (!w)
        return FX_ENOMEM;
    w->vocab = vocab_size;
    w->width = vocab_size > 65536 ? 4 : 2;
    w->path = dup_str(path);
    size_t n = strlen(path) + 16;
    w->tmp = fx__alloc(n);
    if (!w->path || !w->tmp) {
        writer_free(w);
        return FX_ENOMEM;
    }
    snprintf(w->tmp, n, "%s.tmp%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        int rc = fx__error(FX_EIO, "%s: %s", w->tmp, strerror(errno));
        writer_free(w);
        return rc;
    }
    /* The header is written last; a placeholder keeps its room. */
    int32_t zero[HEADER_INTS] = {0};
    if (fwrite(zero, sizeof zero, 1, w->f) != 1) {
        int rc = fx__error(FX_EIO, "%s: %s", w->tmp, strerror(errno));
        fx_token_writer_abort(w);
        return rc;
    }
    *out = w;
    return FX_OK;
}

static int writer_flush(fx_token_writer *w)
{
    if (w->nbuf && fwrite(w->buf, (size_t)w->width, w->nbuf, w->f) != w->nbuf)
        return fx__error(FX_EIO, "%s: %s", w->tmp, strerror(errno));
    w->nbuf = 0;
    return FX_OK;
}

int fx_token_writer_append(fx_token_writer *w, const int32_t *ids, int64_t n)
{
    if (!w || (!ids && n) || n < 0)
        return fx__error(FX_EINVAL, "writer and ids must not be NULL, n >= 0");
    if (n > INT32_MAX - w->count)
        return fx__error(FX_ERANGE, "a token file holds at most 2^31-1 tokens");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->vocab)
            return fx__error(FX_ERANGE, "id %d at %lld is outside the vocabulary [0, %lld)", (int)ids[i],
                             (long long)i, (long long)w->vocab);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        unsigned char *p = w->buf + w->nbuf * (size_t)w->width;
        p[0] = (unsigned char)v;
        p[1] = (unsigned char)(v >> 8);
        if (w->width == 4) {
            p[2] = (unsigned char)(v >> 16);
            p[3] = (unsigned char)(v >> 24);
        }
        if (++w->nbuf == WBUF) {
            int rc = writer_flush(w);
            if (rc != FX_OK)
                return rc;
        }
    }
    w->count += n;
    return FX_OK;
}

int64_t fx_token_writer_count(const fx_token_writer *w) { return w ? w->count : 0; }

void fx_token_writer_abort(fx_token_writer *w)
{
    if (!w)
        return;
    if (w->f) {
        fclose(w->f);
        w->f = NULL;
    }
    unlink(w->tmp);
    writer_free(w);
}

static void put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

int fx_token_writer_close(fx_token_writer *w)
{
    if (!w)
        return fx__error(FX_EINVAL, "writer must not be NULL");
    unsigned char head[HEADER_INTS * 4] = {0};
    put_le32(head, w->width == 2 ? MAGIC16 : MAGIC32);
    put_le32(head + 4, w->width == 2 ? VERSION16 : VERSION32);
    put_le32(head + 8, (uint32_t)w->count);
    int rc = writer_flush(w);
    if (rc == FX_OK && (fseek(w->f, 0, SEEK_SET) != 0 || fwrite(head, sizeof head, 1, w->f) != 1 ||
                        fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        rc = fx__error(FX_EIO, "%s: %s", w->tmp, strerror(errno));
    if (rc == FX_OK) {
        int c = fclose(w->f);
        w->f = NULL;
        if (c != 0)
            rc = fx__error(FX_EIO, "%s: %s", w->tmp, strerror(errno));
    }
    if (rc == FX_OK && rename(w->tmp, w->path) != 0)
        rc = fx__error(FX_EIO, "%s: %s", w->path, strerror(errno));
    if (rc != FX_OK) {
        fx_token_writer_abort(w);
        return rc;
    }
    writer_free(w);
    return FX_OK;
}

static uint32_t get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int fx_tokens_load(fx_ids *out, const char *path, int64_t vocab_size)
{
    if (!out || !path)
        return fx__error(FX_EINVAL, "out and path must not be NULL");
    FILE *f;
    int rc = fx__tok_fopen(&f, path);
    if (rc != FX_OK)
        return rc;
    struct stat st;
    unsigned char head[HEADER_INTS * 4];
    if (fstat(fileno(f), &st) != 0)
        rc = fx__error(FX_EIO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = fx__error(FX_EIO, "%s: not a regular file", path);
    else if ((size_t)st.st_size < sizeof head || fread(head, sizeof head, 1, f) != 1)
        rc = fx__error(FX_EFORMAT, "%s: shorter than the 1024-byte header", path);
    int width = 0;
    uint32_t count = 0;
    if (rc == FX_OK) {
        uint32_t magic = get_le32(head), version = get_le32(head + 4);
        count = get_le32(head + 8);
        if (magic == MAGIC16 && version == VERSION16)
            width = 2;
        else if (magic == MAGIC32 && version == VERSION32)
            width = 4;
        else if (magic != MAGIC16 && magic != MAGIC32)
            rc = fx__error(FX_EFORMAT, "%s: magic %u is not a token file's (20240520 or 20240801)", path, magic);
        else
            rc = fx__error(FX_EFORMAT, "%s: version %u does not go with magic %u", path, version, magic);
    }
    if (rc == FX_OK && count > INT32_MAX)
        rc = fx__error(FX_EFORMAT, "%s: token count %u is negative as the int32 the format stores", path, count);
    if (rc == FX_OK && (uint64_t)st.st_size != sizeof head + (uint64_t)count * (uint64_t)width)
        rc = fx__error(FX_EFORMAT, "%s: %lld bytes, but the header says %u tokens of %d bytes (%llu bytes)", path,
                       (long long)st.st_size, count, width, (unsigned long long)(sizeof head + (uint64_t)count * width));
    if (rc == FX_OK && out->n + (int64_t)count > out->cap) {
        int64_t cap = out->n + (int64_t)count;
        int32_t *p = fx__alloc((size_t)(cap ? cap : 1) * sizeof *p);
        if (!p) {
            rc = FX_ENOMEM;
        } else {
            if (out->n)
                memcpy(p, out->ids, (size_t)out->n * sizeof *p);
            fx__free(out->ids);
            out->ids = p;
            out->cap = cap;
        }
    }
    int64_t n0 = out->n;
    unsigned char buf[1 << 16];
    uint32_t done = 0;
    while (rc == FX_OK && done < count) {
        size_t want = (size_t)(count - done), room = sizeof buf / (size_t)width;
        if (want > room)
            want = room;
        if (fread(buf, (size_t)width, want, f) != want) {
            rc = fx__error(FX_EIO, "%s: read failed", path);
            break;
        }
        for (size_t i = 0; i < want; i++) {
            uint32_t v = width == 2 ? (uint32_t)buf[2 * i] | (uint32_t)buf[2 * i + 1] << 8 : get_le32(buf + 4 * i);
            if ((vocab_size > 0 && (int64_t)v >= vocab_size) || v > INT32_MAX) {
                rc = fx__error(FX_EFORMAT, "%s: token %u at %u is outside the vocabulary [0, %lld)", path, v,
                               (unsigned)(done + i), (long long)vocab_size);
                break;
            }
            out->ids[out->n++] = (int32_t)v;
        }
        done += (uint32_t)want;
    }
    fclose(f);
    if (rc != FX_OK)
        out->n = n0;
    return rc;
}
