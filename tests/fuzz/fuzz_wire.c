/*
 * tests/fuzz/fuzz_wire.c - libFuzzer harness for kiln-serve's update
 * decoder (serve_dec_*, serving/serve_wire.c), the code that sees a push's
 * untrusted body. The first input byte picks how the rest is cut into
 * pieces (the decoder must not care), the rest is the stream. Checked
 * besides "no crash": once the decoder fails it keeps returning the same
 * code; callbacks only see counts and tables that the header allows; a
 * stream that finishes cleanly had a header and exactly one END.
 */
#include <stdint.h>
#include <stdlib.h>

#include "kiln.h"
#include "serve.h"

typedef struct seen {
    int headers, ends;
    int ntables;
    int dim;
    double sum;
} seen_t;

static int on_header(void *ctx, const serve_model_desc_t *d, const char *uid, const char *base)
{
    seen_t *s = ctx;
    (void)uid;
    (void)base;
    if (serve_desc_check(d) != 0) /* the decoder passes only a checked header */
        abort();
    s->headers++;
    s->ntables = d->ntables;
    s->dim = d->dim;
    return 0;
}

static int on_rows(void *ctx, int table, int64_t n, const int64_t *keys, const float *values)
{
    seen_t *s = ctx;
    if (s->headers != 1 || table < 0 || table >= s->ntables || n < 0)
        abort();
    for (int64_t i = 0; i < n; i++) /* touch every byte handed out (ASan checks bounds) */
        s->sum += (double)keys[i] + (double)values[i * s->dim + s->dim - 1];
    return 0;
}

static int on_deletes(void *ctx, int table, int64_t n, const int64_t *keys)
{
    seen_t *s = ctx;
    if (s->headers != 1 || table < 0 || table >= s->ntables || n < 0)
        abort();
    for (int64_t i = 0; i < n; i++)
        s->sum += (double)keys[i];
    return 0;
}

static int on_dense(void *ctx, int64_t n, const float *values)
{
    seen_t *s = ctx;
    if (s->headers != 1 || n < 0)
        abort();
    for (int64_t i = 0; i < n; i++)
        s->sum += values[i];
    return 0;
}

static int on_end(void *ctx, const serve_totals_t *t)
{
    seen_t *s = ctx;
    (void)t;
    s->ends++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t piece = (size_t)data[0] * 7 + 1; /* 1..1786 bytes per feed */
    data++;
    size--;
    const serve_dec_cb_t cb = {on_header, on_rows, on_deletes, on_dense, on_end};
    seen_t s = {0};
    serve_dec_t *d = NULL;
    /* A small max_chunk so that the size limit is reachable too. */
    if (serve_dec_create(&cb, &s, 1 << 16, &d) != 0)
        abort();
    int rc = 0;
    for (size_t off = 0; off < size && rc == 0; off += piece)
        rc = serve_dec_feed(d, data + off, size - off < piece ? size - off : piece);
    if (rc < 0) {
        if (serve_dec_feed(d, "x", 1) != rc || serve_dec_finish(d) != rc)
            abort();
    } else if (serve_dec_finish(d) == 0) {
        if (s.headers != 1 || s.ends != 1 || serve_dec_desc(d) == NULL)
            abort();
    }
    kiln_errclear();
    serve_dec_destroy(d);
    return 0;
}
