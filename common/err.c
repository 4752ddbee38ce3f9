/*
 * common/err.c - error codes, their names and messages, and the thread-local
 * "last error" sentence that carries context (which file, which field, which
 * endpoint) from where a failure happens to where it is shown.
 *
 * A caller adds context by wrapping the message it got:
 * `kiln_errf(rc, "rank %d: %s", rank, kiln_errmsg())`. The arguments then
 * point into the buffer being written, so kiln_errf formats into a scratch
 * buffer first and copies the result over: wrapping is safe at any depth.
 */
#include "kiln.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_msg[1024];
static _Thread_local int last_code;

const char *kiln_strerror(int code)
{
    switch (code) {
#define KILN_ERR_MSG(name, val, msg) case (val): return (msg);
        KILN_ERRORS(KILN_ERR_MSG)
#undef KILN_ERR_MSG
    default:
        return "unknown error";
    }
}

const char *kiln_errname(int code)
{
    switch (code) {
#define KILN_ERR_NAME(name, val, msg) case (val): return "KILN_" #name;
        KILN_ERRORS(KILN_ERR_NAME)
#undef KILN_ERR_NAME
    default:
        return "KILN_E?";
    }
}

int kiln_errf(int code, const char *fmt, ...)
{
    char msg[sizeof last_msg]; /* the arguments may point into last_msg */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kiln_utf8_scrub(msg); /* a cut at the buffer's end or a "%.80s" */
    memcpy(last_msg, msg, strlen(msg) + 1);
    last_code = code;
    return code;
}

const char *kiln_errmsg(void)
{
    if (last_msg[0] != '\0')
        return last_msg;
    return last_code != 0 ? kiln_strerror(last_code) : "";
}

int kiln_errcode(void) { return last_code; }

void kiln_errclear(void)
{
    last_msg[0] = '\0';
    last_code = 0;
}
