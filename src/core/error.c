/* Status strings, the thread-local last-error message, and the logging hook. */
#include "core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

const char *fx_strerror(int code)
{
    switch (code) {
#define FX_STATUS_STR_(name, value, msg) case value: return msg;
        FX_STATUS_LIST(FX_STATUS_STR_)
#undef FX_STATUS_STR_
    }
    return "unknown status";
}

const char *fx_status_name(int code)
{
    switch (code) {
#define FX_STATUS_NAME_(name, value, msg) case value: return #name;
        FX_STATUS_LIST(FX_STATUS_NAME_)
#undef FX_STATUS_NAME_
    }
    return "FX_UNKNOWN";
}

enum { FX__ERRMSG_CAP = 512 };
static _Thread_local char fx__errmsg[FX__ERRMSG_CAP];

const char *fx_last_error(void) { return fx__errmsg; }
void fx_clear_error(void) { fx__errmsg[0] = '\0'; }

int fx__error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fx__errmsg, sizeof fx__errmsg, fmt, ap);
    va_end(ap);
    return code;
}

int fx__error_context(int code, const char *fmt, ...)
{
    char old[FX__ERRMSG_CAP];
    memcpy(old, fx__errmsg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(fx__errmsg, sizeof fx__errmsg, fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : (size_t)n < sizeof fx__errmsg ? (size_t)n : sizeof fx__errmsg - 1;
    snprintf(fx__errmsg + used, sizeof fx__errmsg - used, ": %s", old);
    return code;
}

int fx__check_overlaps(const fx__span *in, size_t nin, const fx__span *out, size_t nout)
{
    for (size_t i = 0; i < nout; i++) {
        const fx__span *o = &out[i];
        for (size_t j = 0; j < nin; j++)
            if (fx__bytes_overlap(o->ptr, o->bytes, in[j].ptr, in[j].bytes))
                return fx__error(FX_EINVAL, "%s overlaps the input %s", o->name, in[j].name);
        for (size_t j = 0; j < i; j++)
            if (fx__bytes_overlap(o->ptr, o->bytes, out[j].ptr, out[j].bytes))
                return fx__error(FX_EINVAL, "%s overlaps %s", o->name, out[j].name);
    }
    return FX_OK;
}

const char *fx_version(void) { return FX_VERSION_STRING; }

/* The hook is set rarely and read from any thread: keep the three fields together. */
typedef struct fx__log_hook {
    fx_log_fn fn;
    void *user;
    fx_log_level min_level;
} fx__log_hook;
static fx__log_hook fx__hook;
static atomic_int fx__hook_lock;

void fx_set_log_callback(fx_log_fn fn, void *user, fx_log_level min_level)
{
    while (atomic_exchange(&fx__hook_lock, 1)) {
    }
    fx__hook = (fx__log_hook){fn, user, min_level};
    atomic_store(&fx__hook_lock, 0);
}

void fx__log(fx_log_level level, const char *fmt, ...)
{
    while (atomic_exchange(&fx__hook_lock, 1)) {
    }
    fx__log_hook hook = fx__hook;
    atomic_store(&fx__hook_lock, 0);
    if (!hook.fn || level < hook.min_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hook.fn(level, msg, hook.user);
}
