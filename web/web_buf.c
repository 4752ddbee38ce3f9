/*
 * web/web_buf.c - the response buffer, the one HTML escaping function that
 * every value passes through (web_esc), and the small URL decoding the forms
 * need. No knowledge of routes or data here.
 */
#include "web_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(web_buf_t *b, size_t more)
{
    if (b->oom)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void web_buf_put(web_buf_t *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void web_buf_puts(web_buf_t *b, const char *s)
{
    if (s != NULL)
        web_buf_put(b, s, strlen(s));
}

void web_buf_printf(web_buf_t *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        web_buf_put(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* The replacement of each byte that HTML must not see raw. */
static const char *const html_entities[256] = {
    ['&'] = "&amp;", ['<'] = "&lt;", ['>'] = "&gt;", ['"'] = "&quot;", ['\''] = "&#39;",
};

void web_esc(web_buf_t *b, const char *s)
{
    if (s == NULL)
        return;
    const unsigned char *p = (const unsigned char *)s;
    const unsigned char *run = p;
    for (; *p; p++) {
        const char *ent = html_entities[*p];
        bool drop = *p < 0x20 && *p != '\n' && *p != '\t';
        if (ent == NULL && !drop && *p != 0x7f)
            continue;
        web_buf_put(b, (const char *)run, (size_t)(p - run));
        if (ent != NULL)
            web_buf_puts(b, ent);
        run = p + 1;
    }
    web_buf_put(b, (const char *)run, (size_t)(p - run));
}

void web_buf_free(web_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

char *web_url_decode(const char *src, size_t n)
{
    char *out = kiln_malloc(n + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '+') {
            out[o++] = ' ';
        } else if (src[i] == '%' && i + 2 < n && hexval(src[i + 1]) >= 0 &&
                   hexval(src[i + 2]) >= 0) {
            out[o++] = (char)(hexval(src[i + 1]) * 16 + hexval(src[i + 2]));
            i += 2;
        } else {
            out[o++] = src[i];
        }
    }
    out[o] = '\0';
    return out;
}

char *web_form_value(const char *body, size_t len, const char *key)
{
    size_t klen = strlen(key);
    size_t i = 0;
    while (body != NULL && i < len) {
        size_t end = i;
        while (end < len && body[end] != '&')
            end++;
        if (end - i > klen && body[i + klen] == '=' && memcmp(body + i, key, klen) == 0)
            return web_url_decode(body + i + klen + 1, end - i - klen - 1);
        i = end + 1;
    }
    return NULL;
}
