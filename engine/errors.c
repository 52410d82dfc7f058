/* Status names and the per-thread message of the last failed call. */
#include <stdarg.h>
#include <stdio.h>

#include "engine.h"

static _Thread_local char last_error[256];

mha_status mha_fail(mha_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *mha_last_error(void) { return last_error; }

const char *mha_status_string(mha_status status)
{
    switch (status) {
    case MHA_OK: return "ok";
    case MHA_ERR_NULL_POINTER: return "null pointer";
    case MHA_ERR_BAD_SHAPE: return "bad shape";
    case MHA_ERR_BAD_STRIDE: return "bad stride";
    case MHA_ERR_BAD_MASK: return "bad mask";
    case MHA_ERR_OVERFLOW: return "overflow";
    case MHA_ERR_OUT_OF_MEMORY: return "out of memory";
    case MHA_ERR_UNSUPPORTED: return "unsupported";
    case MHA_ERR_BAD_ARGUMENT: return "bad argument";
    }
    return "unknown status";
}

const char *mha_version(void) { return "0.1.0"; }
