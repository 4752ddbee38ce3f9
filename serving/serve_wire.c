/*
 * serving/serve_wire.c - the push wire format: the encoder that turns an
 * update source into the chunk stream and the streaming decoder that checks
 * it (checksums, structure, order, totals, finite weights) and hands the
 * content to callbacks. The decoder is the part of kiln-serve that sees
 * untrusted bytes, so it lives alone in this file for a fuzzer to target: it
 * never trusts a length before checking it against the header and max_chunk.
 *
 * Layout of each chunk and payload: docs/serving-protocol.md.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little endian");

#define CHUNK_HDR 8u   /* type u32, len u32 */
#define CHUNK_TRAIL 8u /* xxh64 u64 */

void serve_source_destroy(serve_source_t *s)
{
    if (s != NULL && s->ops != NULL && s->ops->destroy != NULL)
        s->ops->destroy(s);
}

int serve_desc_check(const serve_model_desc_t *d)
{
    if (d->model_type < 0 || d->model_type > 2)
        return kiln_errf(KILN_EINVAL, "model type %d is not lr (0), fm (1) or dlrm (2)",
                         d->model_type);
    if (d->nslots < 0 || d->nslots > SERVE_MAX_SLOTS)
        return kiln_errf(KILN_EINVAL, "nslots %d is out of range 0..%d", d->nslots,
                         SERVE_MAX_SLOTS);
    if (d->ndense < 0 || d->ndense > 65536)
        return kiln_errf(KILN_EINVAL, "ndense %d is out of range", d->ndense);
    if (d->dim < 1 || d->dim > SERVE_MAX_DIM)
        return kiln_errf(KILN_EINVAL, "dim %d is out of range 1..%d", d->dim, SERVE_MAX_DIM);
    if (d->nbottom < 0 || d->nbottom > SERVE_MAX_LAYERS || d->ntop < 0 ||
        d->ntop > SERVE_MAX_LAYERS)
        return kiln_errf(KILN_EINVAL, "layer counts %d/%d are out of range", d->nbottom, d->ntop);
    for (int i = 0; i < d->nbottom; i++)
        if (d->bottom[i] < 1 || d->bottom[i] > 65536)
            return kiln_errf(KILN_EINVAL, "bottom layer %d width %d is out of range", i,
                             d->bottom[i]);
    for (int i = 0; i < d->ntop; i++)
        if (d->top[i] < 1 || d->top[i] > 65536)
            return kiln_errf(KILN_EINVAL, "top layer %d width %d is out of range", i, d->top[i]);
    if (d->ntables < 1 || d->ntables > SERVE_MAX_TABLES)
        return kiln_errf(KILN_EINVAL, "ntables %d is out of range 1..%d", d->ntables,
                         SERVE_MAX_TABLES);
    for (int t = 0; t < d->ntables; t++) {
        const serve_table_desc_t *td = &d->tables[t];
        size_t len = strnlen(td->name, SERVE_NAME_MAX);
        if (len == 0 || len == SERVE_NAME_MAX)
            return kiln_errf(KILN_EINVAL, "table %d has an empty or too long name", t);
        if (td->dim != d->dim)
            return kiln_errf(KILN_EINVAL, "table %s has dim %d but the model's is %d", td->name,
                             td->dim, d->dim);
        for (int u = 0; u < t; u++)
            if (strcmp(d->tables[u].name, td->name) == 0)
                return kiln_errf(KILN_EINVAL, "table name %s appears twice", td->name);
    }
    for (int s = 0; s < d->nslots; s++)
        if (d->slot_table[s] < 0 || d->slot_table[s] >= d->ntables || d->slot_mean[s] > 1)
            return kiln_errf(KILN_EINVAL, "slot %d names table %d of %d", s, d->slot_table[s],
                             d->ntables);
    if (d->nparams < 0 || d->nparams > (int64_t)(SERVE_MAX_CHUNK / 4))
        return kiln_errf(KILN_EINVAL, "nparams %lld is out of range", (long long)d->nparams);
    return 0;
}

/* ---- a growable byte buffer ------------------------------------------------------ */
typedef struct bytes {
    unsigned char *p;
    size_t len, cap;
} bytes_t;

static int put(bytes_t *b, const void *data, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *p = kiln_reallocarray(b->p, cap, 1);
        if (p == NULL)
            return KILN_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

static int put_u32(bytes_t *b, uint32_t v) { return put(b, &v, 4); }
static int put_u64(bytes_t *b, uint64_t v) { return put(b, &v, 8); }
static int put_str(bytes_t *b, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    KILN_CHECK(put_u32(b, n));
    return put(b, s, n);
}

/* ---- encoder ---------------------------------------------------------------------- */
typedef enum { ENC_HEADER, ENC_ITEMS, ENC_END, ENC_DONE } enc_stage_t;

struct serve_enc {
    serve_source_t *src;
    int64_t rows_per_chunk;
    enc_stage_t stage;
    serve_item_t item; /* the item being chunked */
    int64_t item_off;  /* rows of it already sent */
    bool have_item;
    bytes_t buf; /* the current chunk */
    size_t pos;  /* bytes of buf already handed out */
    serve_totals_t totals;
    uint64_t bytes;
};

int serve_enc_create(serve_source_t *src, int64_t rows_per_chunk, serve_enc_t **out)
{
    serve_enc_t *e = kiln_calloc(1, sizeof *e);
    if (e == NULL)
        return KILN_ENOMEM;
    e->src = src;
    e->rows_per_chunk = rows_per_chunk > 0 ? rows_per_chunk : SERVE_ROWS_PER_CHUNK;
    *out = e;
    return 0;
}

void serve_enc_destroy(serve_enc_t *e)
{
    if (e == NULL)
        return;
    serve_source_destroy(e->src);
    free(e->buf.p);
    free(e);
}

uint64_t serve_enc_bytes(const serve_enc_t *e) { return e->bytes; }
const serve_source_t *serve_enc_source(const serve_enc_t *e) { return e->src; }

/* Starts a chunk of type t in buf (payload follows). */
static int chunk_begin(serve_enc_t *e, serve_chunk_type_t t)
{
    e->buf.len = 0;
    e->pos = 0;
    KILN_CHECK(put_u32(&e->buf, (uint32_t)t));
    return put_u32(&e->buf, 0); /* length, patched by chunk_end */
}

static int chunk_end(serve_enc_t *e)
{
    uint32_t len = (uint32_t)(e->buf.len - CHUNK_HDR);
    memcpy(e->buf.p + 4, &len, 4);
    KILN_CHECK(put_u64(&e->buf, kiln_xxh64(e->buf.p + CHUNK_HDR, len, 0)));
    e->totals.chunks++;
    return 0;
}

static int encode_header(serve_enc_t *e)
{
    const serve_model_desc_t *d = e->src->desc;
    bytes_t *b = &e->buf;
    KILN_CHECK(chunk_begin(e, SERVE_CHUNK_HEADER));
    uint32_t head[] = {SERVE_WIRE_MAGIC,      SERVE_WIRE_VERSION, (uint32_t)d->model_type,
                       (uint32_t)d->nslots,   (uint32_t)d->ndense, (uint32_t)d->dim,
                       (uint32_t)d->fm_dense_factors};
    KILN_CHECK(put(b, head, sizeof head));
    KILN_CHECK(put_u32(b, (uint32_t)d->nbottom));
    for (int i = 0; i < d->nbottom; i++)
        KILN_CHECK(put_u32(b, (uint32_t)d->bottom[i]));
    KILN_CHECK(put_u32(b, (uint32_t)d->ntop));
    for (int i = 0; i < d->ntop; i++)
        KILN_CHECK(put_u32(b, (uint32_t)d->top[i]));
    KILN_CHECK(put_u32(b, (uint32_t)d->ntables));
    for (int t = 0; t < d->ntables; t++) {
        KILN_CHECK(put_u32(b, (uint32_t)d->tables[t].dim));
        KILN_CHECK(put_str(b, d->tables[t].name));
    }
    for (int s = 0; s < d->nslots; s++) {
        KILN_CHECK(put_u32(b, (uint32_t)d->slot_table[s]));
        KILN_CHECK(put_u32(b, d->slot_mean[s]));
    }
    KILN_CHECK(put_u64(b, (uint64_t)d->nparams));
    KILN_CHECK(put_str(b, e->src->uid));
    KILN_CHECK(put_str(b, e->src->base));
    return chunk_end(e);
}

/* Fills buf with the next chunk. Returns 0, or the source's error. */
static int encode_next(serve_enc_t *e)
{
    for (;;) {
        switch (e->stage) {
        case ENC_HEADER:
            KILN_CHECK(serve_desc_check(e->src->desc));
            e->stage = ENC_ITEMS;
            return encode_header(e);
        case ENC_ITEMS: {
            if (!e->have_item || e->item_off >= e->item.n) {
                int rc = e->src->ops->next(e->src, &e->item);
                if (rc < 0)
                    return rc;
                if (rc == 0) {
                    e->have_item = false;
                    e->stage = ENC_END;
                    continue;
                }
                e->have_item = true;
                e->item_off = 0;
                if (e->item.n <= 0 && e->item.kind != SERVE_ITEM_DENSE)
                    continue;
            }
            serve_item_t *it = &e->item;
            if (it->kind == SERVE_ITEM_DENSE) {
                if ((uint64_t)it->n * 4 + 8 > SERVE_MAX_CHUNK)
                    return kiln_errf(KILN_ERANGE, "dense array of %lld floats is too large",
                                     (long long)it->n);
                KILN_CHECK(chunk_begin(e, SERVE_CHUNK_DENSE));
                KILN_CHECK(put_u64(&e->buf, (uint64_t)it->n));
                KILN_CHECK(put(&e->buf, it->values, (size_t)it->n * 4));
                e->totals.dense += (uint64_t)it->n;
                e->item_off = it->n;
                return chunk_end(e);
            }
            if (it->table < 0 || it->table >= e->src->desc->ntables)
                return kiln_errf(KILN_EINTERNAL, "source item names table %d of %d", it->table,
                                 e->src->desc->ntables);
            int64_t n = it->n - e->item_off;
            if (n > e->rows_per_chunk)
                n = e->rows_per_chunk;
            bool rows = it->kind == SERVE_ITEM_ROWS;
            int dim = e->src->desc->tables[it->table].dim;
            KILN_CHECK(chunk_begin(e, rows ? SERVE_CHUNK_ROWS : SERVE_CHUNK_DELETE));
            KILN_CHECK(put_u32(&e->buf, (uint32_t)it->table));
            KILN_CHECK(put_u32(&e->buf, (uint32_t)n));
            KILN_CHECK(put(&e->buf, it->keys + e->item_off, (size_t)n * 8));
            if (rows) {
                KILN_CHECK(put(&e->buf, it->values + e->item_off * dim, (size_t)(n * dim) * 4));
                e->totals.rows += (uint64_t)n;
            } else {
                e->totals.deletes += (uint64_t)n;
            }
            e->item_off += n;
            return chunk_end(e);
        }
        case ENC_END: {
            uint64_t chunks = e->totals.chunks;
            KILN_CHECK(chunk_begin(e, SERVE_CHUNK_END));
            KILN_CHECK(put_u64(&e->buf, e->totals.rows));
            KILN_CHECK(put_u64(&e->buf, e->totals.deletes));
            KILN_CHECK(put_u64(&e->buf, e->totals.dense));
            KILN_CHECK(put_u64(&e->buf, chunks));
            e->stage = ENC_DONE;
            return chunk_end(e);
        }
        case ENC_DONE:
            e->buf.len = 0;
            e->pos = 0;
            return 0;
        }
    }
}

int serve_enc_read(serve_enc_t *e, void *buf, size_t cap, size_t *n)
{
    size_t got = 0;
    while (got < cap) {
        if (e->pos == e->buf.len) {
            if (e->stage == ENC_DONE)
                break;
            KILN_CHECK(encode_next(e));
            continue;
        }
        size_t take = e->buf.len - e->pos;
        if (take > cap - got)
            take = cap - got;
        memcpy((unsigned char *)buf + got, e->buf.p + e->pos, take);
        e->pos += take;
        got += take;
    }
    e->bytes += got;
    *n = got;
    return 0;
}

/* ---- decoder ---------------------------------------------------------------------- */
typedef enum { DEC_WANT_HEADER, DEC_BODY, DEC_ENDED } dec_stage_t;

struct serve_dec {
    serve_dec_cb_t cb;
    void *ctx;
    size_t max_chunk;
    dec_stage_t stage;
    int err;
    unsigned char hdr[CHUNK_HDR];
    size_t hdr_have;
    uint32_t type, len;
    unsigned char *payload; /* 8-aligned (malloc); len + CHUNK_TRAIL bytes */
    size_t payload_cap, have;
    uint64_t chunk_index;
    serve_model_desc_t *desc;
    char uid[SERVE_UID_MAX], base[SERVE_UID_MAX];
    bool dense_seen;
    serve_totals_t counted;
};

int serve_dec_create(const serve_dec_cb_t *cb, void *ctx, size_t max_chunk, serve_dec_t **out)
{
    serve_dec_t *d = kiln_calloc(1, sizeof *d);
    if (d == NULL)
        return KILN_ENOMEM;
    if (cb != NULL)
        d->cb = *cb;
    d->ctx = ctx;
    d->max_chunk = max_chunk ? max_chunk : SERVE_MAX_CHUNK;
    *out = d;
    return 0;
}

void serve_dec_destroy(serve_dec_t *d)
{
    if (d == NULL)
        return;
    free(d->payload);
    free(d->desc);
    free(d);
}

const serve_model_desc_t *serve_dec_desc(const serve_dec_t *d) { return d->desc; }
const serve_totals_t *serve_dec_counted(const serve_dec_t *d) { return &d->counted; }

/* A bounds-checked reader over one payload. */
typedef struct rd {
    const unsigned char *p;
    size_t len, off;
    bool bad;
} rd_t;

/* Copies the next n bytes of the payload to v; when fewer are left, sets
 * r->bad and leaves v as it was. */
static void rd_bytes(rd_t *r, void *v, size_t n)
{
    if (r->len - r->off < n) {
        r->bad = true;
        return;
    }
    memcpy(v, r->p + r->off, n);
    r->off += n;
}

static uint32_t rd_u32(rd_t *r)
{
    uint32_t v = 0;
    rd_bytes(r, &v, sizeof v);
    return v;
}

static uint64_t rd_u64(rd_t *r)
{
    uint64_t v = 0;
    rd_bytes(r, &v, sizeof v);
    return v;
}

static void rd_str(rd_t *r, char *out, size_t cap)
{
    uint32_t n = rd_u32(r);
    if (n >= cap)
        r->bad = true;
    if (!r->bad)
        rd_bytes(r, out, n);
    if (r->bad) {
        out[0] = '\0';
        return;
    }
    out[n] = '\0';
    if (strlen(out) != n)
        r->bad = true; /* an embedded NUL */
}

/* A count read from the wire, limited to lim before any use. */
static int rd_count(rd_t *r, uint32_t lim)
{
    uint32_t v = rd_u32(r);
    if (v > lim)
        r->bad = true;
    return r->bad ? 0 : (int)v;
}

static int dec_header(serve_dec_t *d, const unsigned char *p, size_t len)
{
    rd_t r = {p, len, 0, false};
    serve_model_desc_t *m = kiln_calloc(1, sizeof *m);
    if (m == NULL)
        return KILN_ENOMEM;
    d->desc = m;
    uint32_t magic = rd_u32(&r), version = rd_u32(&r);
    if (!r.bad && magic != SERVE_WIRE_MAGIC)
        return kiln_errf(KILN_ECORRUPT, "the stream does not start with a Kiln push header "
                                        "(magic %08x)", magic);
    if (!r.bad && version != SERVE_WIRE_VERSION)
        return kiln_errf(KILN_EVERSION, "push format version %u; this kiln-serve reads %u",
                         version, SERVE_WIRE_VERSION);
    m->model_type = rd_count(&r, 2);
    m->nslots = rd_count(&r, SERVE_MAX_SLOTS);
    m->ndense = rd_count(&r, 65536);
    m->dim = rd_count(&r, SERVE_MAX_DIM);
    m->fm_dense_factors = rd_count(&r, 1);
    m->nbottom = rd_count(&r, SERVE_MAX_LAYERS);
    for (int i = 0; i < m->nbottom; i++)
        m->bottom[i] = rd_count(&r, 65536);
    m->ntop = rd_count(&r, SERVE_MAX_LAYERS);
    for (int i = 0; i < m->ntop; i++)
        m->top[i] = rd_count(&r, 65536);
    m->ntables = rd_count(&r, SERVE_MAX_TABLES);
    for (int t = 0; t < m->ntables && !r.bad; t++) {
        m->tables[t].dim = rd_count(&r, SERVE_MAX_DIM);
        rd_str(&r, m->tables[t].name, SERVE_NAME_MAX);
    }
    for (int s = 0; s < m->nslots && !r.bad; s++) {
        m->slot_table[s] = rd_count(&r, SERVE_MAX_TABLES);
        m->slot_mean[s] = (unsigned char)rd_count(&r, 1);
    }
    m->nparams = (int64_t)rd_u64(&r);
    rd_str(&r, d->uid, sizeof d->uid);
    rd_str(&r, d->base, sizeof d->base);
    if (r.bad || r.off != r.len)
        return kiln_errf(KILN_ECORRUPT, "the header chunk is malformed (%zu bytes)", len);
    int rc = serve_desc_check(m);
    if (rc < 0)
        return kiln_errf(KILN_ECORRUPT, "the header describes a bad model: %s", kiln_errmsg());
    if (d->uid[0] == '\0')
        return kiln_errf(KILN_ECORRUPT, "the header names no checkpoint uid");
    return d->cb.header ? d->cb.header(d->ctx, m, d->uid, d->base) : 0;
}

/* Why a non-finite weight is refused, said after where it is. */
#define NONFINITE_WHY                                                                      \
    "a model with NaN or Inf weights answers wrong for every row that meets them (did "    \
    "training diverge?)"

/* The index of the first NaN or Inf among v (n), or n when all are finite. */
static size_t first_nonfinite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return i;
    return n;
}

static int dec_chunk(serve_dec_t *d)
{
    const unsigned char *p = d->payload;
    size_t len = d->len;
    uint64_t want;
    memcpy(&want, p + len, 8);
    if (kiln_xxh64(p, len, 0) != want)
        return kiln_errf(KILN_ECHECKSUM, "chunk %llu (type %u, %u bytes) fails its checksum",
                         (unsigned long long)d->chunk_index, d->type, d->len);
    if (d->stage == DEC_WANT_HEADER) {
        if (d->type != SERVE_CHUNK_HEADER)
            return kiln_errf(KILN_ECORRUPT, "chunk 0 has type %u; a push starts with a header",
                             d->type);
        d->stage = DEC_BODY;
        d->counted.chunks++;
        return dec_header(d, p, len);
    }
    const serve_model_desc_t *m = d->desc;
    switch (d->type) {
    case SERVE_CHUNK_ROWS:
    case SERVE_CHUNK_DELETE: {
        if (len < 8)
            return kiln_errf(KILN_ECORRUPT, "chunk %llu is too short",
                             (unsigned long long)d->chunk_index);
        uint32_t table, n;
        memcpy(&table, p, 4);
        memcpy(&n, p + 4, 4);
        if (table >= (uint32_t)m->ntables)
            return kiln_errf(KILN_ECORRUPT, "chunk %llu names table %u; the model has %d",
                             (unsigned long long)d->chunk_index, table, m->ntables);
        uint64_t dim = (uint64_t)m->tables[table].dim;
        uint64_t need = 8 + (uint64_t)n * 8 + (d->type == SERVE_CHUNK_ROWS ? n * dim * 4 : 0);
        if (need != len)
            return kiln_errf(KILN_ECORRUPT, "chunk %llu holds %u rows of table %s in %zu bytes; "
                                            "that needs %llu",
                             (unsigned long long)d->chunk_index, n, m->tables[table].name, len,
                             (unsigned long long)need);
        const int64_t *keys = (const int64_t *)(const void *)(p + 8);
        d->counted.chunks++;
        if (d->type == SERVE_CHUNK_ROWS) {
            d->counted.rows += n;
            const float *vals = (const float *)(const void *)(p + 8 + (size_t)n * 8);
            size_t bad = first_nonfinite(vals, (size_t)n * dim);
            if (bad < (size_t)n * dim)
                return kiln_errf(KILN_ECORRUPT, "chunk %llu (rows of table %s) holds a non-finite "
                                                "value (%g) at key %lld, column %zu: %s",
                                 (unsigned long long)d->chunk_index, m->tables[table].name,
                                 (double)vals[bad], (long long)keys[bad / dim], (size_t)(bad % dim),
                                 NONFINITE_WHY);
            return d->cb.rows ? d->cb.rows(d->ctx, (int)table, n, keys, vals) : 0;
        }
        d->counted.deletes += n;
        return d->cb.deletes ? d->cb.deletes(d->ctx, (int)table, n, keys) : 0;
    }
    case SERVE_CHUNK_DENSE: {
        uint64_t n;
        if (len < 8)
            return kiln_errf(KILN_ECORRUPT, "the dense chunk is too short");
        memcpy(&n, p, 8);
        if (d->dense_seen)
            return kiln_errf(KILN_ECORRUPT, "a second dense chunk");
        if (n != (uint64_t)m->nparams || len != 8 + n * 4)
            return kiln_errf(KILN_ECORRUPT, "the dense chunk holds %llu floats in %zu bytes; "
                                            "the header says %lld",
                             (unsigned long long)n, len, (long long)m->nparams);
        const float *vals = (const float *)(const void *)(p + 8);
        size_t bad = first_nonfinite(vals, (size_t)n);
        if (bad < (size_t)n)
            return kiln_errf(KILN_ECORRUPT, "chunk %llu (the dense weights) holds a non-finite "
                                            "value (%g) at index %zu: %s",
                             (unsigned long long)d->chunk_index, (double)vals[bad], bad,
                             NONFINITE_WHY);
        d->dense_seen = true;
        d->counted.dense = n;
        d->counted.chunks++;
        return d->cb.dense ? d->cb.dense(d->ctx, (int64_t)n, vals) : 0;
    }
    case SERVE_CHUNK_END: {
        if (len != 32)
            return kiln_errf(KILN_ECORRUPT, "the end chunk has %zu bytes, not 32", len);
        serve_totals_t t;
        memcpy(&t.rows, p, 8);
        memcpy(&t.deletes, p + 8, 8);
        memcpy(&t.dense, p + 16, 8);
        memcpy(&t.chunks, p + 24, 8);
        const serve_totals_t *c = &d->counted;
        if (t.rows != c->rows || t.deletes != c->deletes || t.dense != c->dense ||
            t.chunks != c->chunks)
            return kiln_errf(KILN_ECORRUPT, "the end chunk promises %llu rows, %llu deletions, "
                                            "%llu dense floats in %llu chunks; %llu, %llu, %llu "
                                            "in %llu arrived",
                             (unsigned long long)t.rows, (unsigned long long)t.deletes,
                             (unsigned long long)t.dense, (unsigned long long)t.chunks,
                             (unsigned long long)c->rows, (unsigned long long)c->deletes,
                             (unsigned long long)c->dense, (unsigned long long)c->chunks);
        if (m->nparams > 0 && !d->dense_seen)
            return kiln_errf(KILN_ECORRUPT, "the push has no dense chunk");
        d->stage = DEC_ENDED;
        return d->cb.end ? d->cb.end(d->ctx, &t) : 0;
    }
    default:
        return kiln_errf(KILN_ECORRUPT, "chunk %llu has unknown type %u",
                         (unsigned long long)d->chunk_index, d->type);
    }
}

/* Copies what is missing of a part of need bytes (have so far, in dst)
 * from the input (*p, *len), advancing it; true when the part is whole. */
static bool fill(unsigned char *dst, size_t *have, size_t need, const unsigned char **p,
                 size_t *len)
{
    size_t take = need - *have;
    if (take > *len)
        take = *len;
    memcpy(dst + *have, *p, take);
    *have += take;
    *p += take;
    *len -= take;
    return *have == need;
}

int serve_dec_feed(serve_dec_t *d, const void *data, size_t len)
{
    const unsigned char *p = data;
    if (d->err < 0)
        return d->err;
    while (len > 0) {
        if (d->stage == DEC_ENDED)
            return d->err = kiln_errf(KILN_ECORRUPT, "%zu bytes follow the end chunk", len);
        if (d->hdr_have < CHUNK_HDR) {
            if (!fill(d->hdr, &d->hdr_have, CHUNK_HDR, &p, &len))
                break;
            memcpy(&d->type, d->hdr, 4);
            memcpy(&d->len, d->hdr + 4, 4);
            if (d->len > d->max_chunk)
                return d->err = kiln_errf(KILN_ERANGE,
                                          "chunk %llu is %u bytes; this endpoint takes at most %zu",
                                          (unsigned long long)d->chunk_index, d->len,
                                          d->max_chunk);
            size_t need = (size_t)d->len + CHUNK_TRAIL;
            if (need > d->payload_cap) {
                free(d->payload);
                d->payload = kiln_malloc(need);
                d->payload_cap = d->payload ? need : 0;
                if (d->payload == NULL)
                    return d->err = KILN_ENOMEM;
            }
            d->have = 0;
        }
        if (!fill(d->payload, &d->have, (size_t)d->len + CHUNK_TRAIL, &p, &len))
            break;
        int rc = dec_chunk(d);
        if (rc < 0)
            return d->err = rc;
        d->chunk_index++;
        d->hdr_have = 0;
    }
    return 0;
}

int serve_dec_finish(serve_dec_t *d)
{
    if (d->err < 0)
        return d->err;
    if (d->stage != DEC_ENDED)
        return d->err = kiln_errf(KILN_ECORRUPT, "the push ended after %llu chunks without its "
                                                 "end chunk",
                                  (unsigned long long)d->chunk_index);
    return 0;
}
