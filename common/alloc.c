/*
 * common/alloc.c - allocation that records what failed instead of crashing.
 * Library code never exits on OOM; it returns NULL with KILN_ENOMEM recorded
 * and the caller unwinds through its `out:` label.
 */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *kiln_malloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (p == NULL)
        kiln_errf(KILN_ENOMEM, "out of memory allocating %zu bytes", size);
    return p;
}

void *kiln_calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) {
        kiln_errf(KILN_ENOMEM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        kiln_errf(KILN_ENOMEM, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *kiln_reallocarray(void *p, size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) {
        kiln_errf(KILN_ENOMEM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    size_t bytes = n * size;
    void *q = realloc(p, bytes ? bytes : 1);
    if (q == NULL)
        kiln_errf(KILN_ENOMEM, "out of memory growing to %zu bytes", bytes);
    return q;
}

char *kiln_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = kiln_malloc(len + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *kiln_strdup(const char *s) { return kiln_strndup(s, SIZE_MAX); }

int kiln_grow(void **items, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (n < *cap)
        return 0;
    size_t want = *cap ? *cap * 2 : first;
    void *p = kiln_reallocarray(*items, want, elem);
    if (p == NULL)
        return KILN_ENOMEM;
    *items = p;
    *cap = want;
    return 0;
}

int kiln_grow_to(void **items, int64_t *cap, int64_t want, size_t elem, int64_t first)
{
    if (want <= *cap)
        return 0;
    int64_t c = *cap ? *cap : first;
    while (c < want)
        c *= 2;
    void *p = kiln_reallocarray(*items, (size_t)c, elem);
    if (p == NULL)
        return KILN_ENOMEM;
    *items = p;
    *cap = c;
    return 0;
}

void kiln_free_all(void *const *ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}

void kiln_strv_free(char **v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++)
        free(v[i]);
    free(v);
}

char *kiln_vasprintf(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        kiln_errf(KILN_EINVAL, "bad format string");
        return NULL;
    }
    char *s = kiln_malloc((size_t)n + 1);
    if (s == NULL)
        return NULL;
    va_copy(ap2, ap);
    vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

char *kiln_asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = kiln_vasprintf(fmt, ap);
    va_end(ap);
    return s;
}
