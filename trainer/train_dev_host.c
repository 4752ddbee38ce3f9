/*
 * trainer/train_dev_host.c - the device step's host stand-in (train_dev.h):
 * "device" and pinned memory are host memory, copies are memcpy, the compute
 * calls are the CPU kernels and the CPU model, and every call runs at once.
 * What it adds is a check of the order the device step asks for, so that
 * CI catches a missing event (a race on a GPU) without one:
 *
 *   Each stream and the host keep a vector clock (one counter per party).
 *   A call on party s ticks s's own counter; record copies s's clock into
 *   the event, wait/sync merge the event's clock into the waiter's. Each
 *   buffer remembers the party and tick of its last write and the last tick
 *   each party read it at. A read must come after the last write (the
 *   reader's clock has seen the writer's tick), a write after the last write
 *   and every read by another party, and a release after all of them on the
 *   host's clock. Anything else fails the call with KILN_EINTERNAL naming
 *   the call, the buffer and both parties.
 *
 * Buffers are tracked by allocation (alloc/release), so an access is
 * checked against the whole allocation that holds it.
 */
#include "train_dev.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HOST = DEV_NSTREAMS, NPARTIES = DEV_NSTREAMS + 1 };

static const char *const party_name[NPARTIES] = {"the copy stream", "the compute stream",
                                                 "the host"};

typedef struct {
    uint64_t c[NPARTIES];
} vclock_t;

typedef struct {
    char *p;
    size_t bytes;
    bool host;
    int w_party; /* the last writer, -1 none */
    uint64_t w_tick;
    uint64_t r_tick[NPARTIES]; /* the last read by each party, 0 none */
} hbuf_t;

typedef struct {
    vclock_t vc[NPARTIES];
    vclock_t ev[DEV_NEVENTS];
    hbuf_t *bufs;
    size_t n, cap;
} standin_t;

static void merge(vclock_t *into, const vclock_t *from)
{
    for (int i = 0; i < NPARTIES; i++)
        if (from->c[i] > into->c[i])
            into->c[i] = from->c[i];
}

/* A call by party: the host's own, or one the host enqueues on a stream,
 * which comes after everything the host did before it. */
static uint64_t tick(standin_t *h, int party)
{
    if (party != HOST)
        merge(&h->vc[party], &h->vc[HOST]);
    return ++h->vc[party].c[party];
}

static hbuf_t *find(standin_t *h, const void *p, size_t bytes)
{
    const char *q = p;
    for (size_t i = 0; i < h->n; i++)
        if (q >= h->bufs[i].p && q + bytes <= h->bufs[i].p + h->bufs[i].bytes)
            return &h->bufs[i];
    return NULL;
}

/* Whether party has seen tick t of party who (its own work is in order). */
static bool seen(const standin_t *h, int party, int who, uint64_t t)
{
    return who == party || t == 0 || h->vc[party].c[who] >= t;
}

/* Checks an access by party (at tick now) of [p, p + bytes) and records it. */
static int access_buf(standin_t *h, int party, uint64_t now, const void *p, size_t bytes,
                      bool write, const char *call)
{
    if (bytes == 0)
        return 0;
    hbuf_t *b = find(h, p, bytes);
    if (b == NULL)
        return kiln_errf(KILN_EINTERNAL,
                         "device stand-in: %s on %s touches %zu bytes outside every allocation",
                         call, party_name[party], bytes);
    if (b->w_party >= 0 && !seen(h, party, b->w_party, b->w_tick))
        return kiln_errf(KILN_EINTERNAL,
                         "device stand-in: %s on %s %s a %zu-byte %s buffer that %s wrote with "
                         "no event between (a missing wait)",
                         call, party_name[party], write ? "overwrites" : "reads", b->bytes,
                         b->host ? "pinned" : "device", party_name[b->w_party]);
    if (write) {
        for (int r = 0; r < NPARTIES; r++)
            if (!seen(h, party, r, b->r_tick[r]))
                return kiln_errf(KILN_EINTERNAL,
                                 "device stand-in: %s on %s overwrites a %zu-byte %s buffer "
                                 "that %s may still be reading (a missing wait)",
                                 call, party_name[party], b->bytes, b->host ? "pinned" : "device",
                                 party_name[r]);
        b->w_party = party;
        b->w_tick = now;
        memset(b->r_tick, 0, sizeof b->r_tick);
    } else if (now > b->r_tick[party]) {
        b->r_tick[party] = now;
    }
    return 0;
}

static int h_create(int device, void **ctx)
{
    (void)device;
    *ctx = kiln_calloc(1, sizeof(standin_t));
    return *ctx ? 0 : KILN_ENOMEM;
}

static void h_destroy(void *ctx)
{
    standin_t *h = ctx;
    if (h == NULL)
        return;
    for (size_t i = 0; i < h->n; i++)
        free(h->bufs[i].p);
    KILN_FREE_ALL(h->bufs, h);
}

static int h_alloc(void *ctx, size_t bytes, bool host, void **p)
{
    standin_t *h = ctx;
    *p = NULL;
    KILN_CHECK(kiln_grow((void **)&h->bufs, &h->cap, h->n, sizeof *h->bufs, 16));
    char *q = kiln_calloc(bytes ? bytes : 1, 1);
    if (q == NULL)
        return KILN_ENOMEM;
    h->bufs[h->n++] = (hbuf_t){.p = q, .bytes = bytes ? bytes : 1, .host = host, .w_party = -1};
    *p = q;
    return 0;
}

static void h_release(void *ctx, void *p, bool host)
{
    standin_t *h = ctx;
    (void)host;
    if (p == NULL)
        return;
    for (size_t i = 0; i < h->n; i++) {
        hbuf_t *b = &h->bufs[i];
        if (b->p != p)
            continue;
        /* A release is the host's: every access must be over by now. */
        int late = b->w_party >= 0 && !seen(h, HOST, b->w_party, b->w_tick) ? b->w_party : -1;
        for (int r = 0; r < NPARTIES && late < 0; r++)
            late = seen(h, HOST, r, b->r_tick[r]) ? -1 : r;
        if (late >= 0)
            KILN_WARN("device stand-in: a %zu-byte buffer is released while %s may still use it",
                      b->bytes, party_name[late]);
        free(b->p);
        h->bufs[i] = h->bufs[--h->n];
        return;
    }
}

static int h_copy(void *ctx, int stream, void *dst, const void *src, size_t bytes)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, stream);
    KILN_CHECK(access_buf(h, stream, now, src, bytes, false, "copy"));
    KILN_CHECK(access_buf(h, stream, now, dst, bytes, true, "copy"));
    if (bytes > 0)
        memcpy(dst, src, bytes);
    return 0;
}

static int h_record(void *ctx, int stream, int event)
{
    standin_t *h = ctx;
    tick(h, stream);
    h->ev[event] = h->vc[stream];
    return 0;
}

static int h_wait(void *ctx, int stream, int event)
{
    standin_t *h = ctx;
    merge(&h->vc[stream], &h->ev[event]);
    return 0;
}

static int h_sync(void *ctx, int event)
{
    standin_t *h = ctx;
    merge(&h->vc[HOST], &h->ev[event]);
    return 0;
}

static int h_host_touch(void *ctx, const void *p, size_t bytes, bool write)
{
    standin_t *h = ctx;
    return access_buf(h, HOST, tick(h, HOST), p, bytes, write, "a host access");
}

/* Checks what the bags of a fused op read: their values, rows and offsets. */
static int access_bags(standin_t *h, uint64_t now, int nbags, const kern_bags_t *bags, int64_t n,
                       const char *call)
{
    for (int i = 0; i < nbags; i++) {
        const kern_bags_t *g = &bags[i];
        KILN_CHECK(access_buf(h, DEV_COMPUTE, now, g->offsets, sizeof(int64_t) * (size_t)(n + 1),
                              false, call));
        const int64_t npos = g->offsets[n] - g->offsets[0];
        KILN_CHECK(access_buf(h, DEV_COMPUTE, now, g->rows + g->offsets[0],
                              sizeof(int32_t) * (size_t)npos, false, call));
        KILN_CHECK(access_buf(h, DEV_COMPUTE, now, g->values,
                              sizeof(float) * (size_t)g->capacity * (size_t)g->dim, false, call));
    }
    return 0;
}

static int h_gather(void *ctx, int nbags, const kern_bags_t *bags, int64_t n, int64_t ld, float *E)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    if (n == 0)
        return 0;
    KILN_CHECK(access_bags(h, now, nbags, bags, n, "gather"));
    KILN_CHECK(
        access_buf(h, DEV_COMPUTE, now, E, sizeof(float) * (size_t)(n * ld), true, "gather"));
    return kern_cpu_gather_combine(nbags, bags, n, ld, E);
}

/* A call that hands a result to the host waits for the compute stream. */
static void host_waits_compute(standin_t *h)
{
    merge(&h->vc[HOST], &h->vc[DEV_COMPUTE]);
}

static int h_dense(void *ctx, const dev_dense_t *a, double *loss)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    model_t *m = a->model;
    const model_info_t mi = model_info(m);
    const size_t n = (size_t)a->n, S = (size_t)mi.nslots, d = (size_t)mi.dim, F = (size_t)mi.ndense;
    *loss = 0.0;
    if (n == 0)
        return 0;
    KILN_CHECK(access_buf(h, DEV_COMPUTE, now, a->E, sizeof(float) * n * S * d, false, "dense"));
    KILN_CHECK(access_buf(h, DEV_COMPUTE, now, a->X, sizeof(float) * n * F, false, "dense"));
    KILN_CHECK(access_buf(h, DEV_COMPUTE, now, a->y, sizeof(float) * n, false, "dense"));
    KILN_CHECK(access_buf(h, DEV_COMPUTE, now, a->dE, sizeof(float) * n * S * d, true, "dense"));
    KILN_CHECK(model_forward(m, a->n, a->E, a->X, a->y, NULL, loss));
    KILN_CHECK(model_backward(m, a->scale, a->dE));
    host_waits_compute(h);
    return 0;
}

static int h_reduce(void *ctx, int nbags, const kern_bags_t *bags, int64_t n,
                    const int64_t *npos_of, int64_t ld, const float *dE, kern_row_grads_t *g)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    for (int i = 0; i < nbags; i++)
        g[i].n = 0;
    if (n == 0)
        return 0;
    KILN_CHECK(access_bags(h, now, nbags, bags, n, "reduce"));
    for (int i = 0; i < nbags; i++)
        if (bags[i].offsets[0] != 0 || bags[i].offsets[n] != npos_of[i])
            return kiln_errf(KILN_EINTERNAL,
                             "device stand-in: reduce: bag set %d has offsets %lld..%lld, the "
                             "caller counted %lld positions",
                             i, (long long)bags[i].offsets[0], (long long)bags[i].offsets[n],
                             (long long)npos_of[i]);
    KILN_CHECK(
        access_buf(h, DEV_COMPUTE, now, dE, sizeof(float) * (size_t)(n * ld), false, "reduce"));
    for (int i = 0; i < nbags; i++) {
        const size_t npos = (size_t)(bags[i].offsets[n] - bags[i].offsets[0]);
        KILN_CHECK(
            access_buf(h, DEV_COMPUTE, now, g[i].rows, sizeof(int32_t) * npos, true, "reduce"));
        KILN_CHECK(access_buf(h, DEV_COMPUTE, now, g[i].grads,
                              sizeof(float) * npos * (size_t)bags[i].dim, true, "reduce"));
    }
    KILN_CHECK(kern_cpu_backward_reduce(nbags, bags, n, ld, dE, g));
    host_waits_compute(h);
    return 0;
}

/* ---- the exchange ---- */

/* A compute-stream call's access check, with the call's tick. */
#define CHECK_ACCESS(p, bytes, write, call)                                                        \
    KILN_CHECK(access_buf(h, DEV_COMPUTE, now, (p), (bytes), (write), (call)))

static int h_permute(void *ctx, void *dst, const void *src, int nseg, const dev_seg_t *segs)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    for (int i = 0; i < nseg; i++) {
        const dev_seg_t *g = &segs[i];
        if (g->bytes == 0)
            continue;
        CHECK_ACCESS((const char *)src + g->src, g->bytes, false, "permute");
        CHECK_ACCESS((char *)dst + g->dst, g->bytes, true, "permute");
        memcpy((char *)dst + g->dst, (const char *)src + g->src, g->bytes);
    }
    return 0;
}

static int h_zero(void *ctx, void *p, size_t bytes)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    CHECK_ACCESS(p, bytes, true, "zero");
    if (bytes > 0)
        memset(p, 0, bytes);
    return 0;
}

/* What dedupe and combine sort: by major, then minor; pos rides along. */
typedef struct {
    int64_t major, minor, pos;
} sortrec_t;

static int by_major_minor(const void *a, const void *b)
{
    const sortrec_t *x = a, *y = b;
    if (x->major != y->major)
        return x->major < y->major ? -1 : 1;
    return x->minor < y->minor ? -1 : x->minor > y->minor;
}

static int h_dedupe(void *ctx, int ntables, const int64_t *koff, const int64_t *keys, int nranks,
                    int64_t *uniq, int32_t *inv, int64_t *cnt)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    const int64_t total = koff[ntables];
    memset(cnt, 0, sizeof(int64_t) * (size_t)nranks * (size_t)ntables);
    CHECK_ACCESS(keys, sizeof(int64_t) * (size_t)total, false, "dedupe");
    CHECK_ACCESS(uniq, sizeof(int64_t) * (size_t)total, true, "dedupe");
    CHECK_ACCESS(inv, sizeof(int32_t) * (size_t)total, true, "dedupe");
    sortrec_t *v = kiln_malloc(sizeof *v * (size_t)(total ? total : 1));
    if (v == NULL)
        return KILN_ENOMEM;
    for (int t = 0; t < ntables; t++) {
        const int64_t k0 = koff[t], n = koff[t + 1] - k0;
        for (int64_t i = 0; i < n; i++)
            v[i] = (sortrec_t){shard_owner(keys[k0 + i], nranks), keys[k0 + i], i};
        qsort(v, (size_t)n, sizeof *v, by_major_minor); /* by owner, then key */
        int64_t u = -1;
        for (int64_t i = 0; i < n; i++) {
            if (i == 0 || v[i].minor != v[i - 1].minor) {
                uniq[k0 + ++u] = v[i].minor;
                cnt[v[i].major * ntables + t]++;
            }
            inv[k0 + v[i].pos] = (int32_t)u;
        }
    }
    free(v);
    host_waits_compute(h);
    return 0;
}

/* The bytes a rank's part of an all-to-all-v spans, checked piece by piece. */
static int access_parts(standin_t *h, uint64_t now, const void *p, const size_t *counts,
                        const size_t *displs, int nranks, bool write)
{
    for (int r = 0; r < nranks; r++)
        CHECK_ACCESS((const char *)p + displs[r], counts[r], write, "alltoallv");
    return 0;
}

static int h_alltoallv(void *ctx, shard_comm_t *comm, const void *send, const size_t *sc,
                       const size_t *sd, void *recv, const size_t *rc, const size_t *rd)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    const int R = shard_comm_info(comm).size;
    KILN_CHECK(access_parts(h, now, send, sc, sd, R, false));
    KILN_CHECK(access_parts(h, now, recv, rc, rd, R, true));
    return shard_comm_alltoallv(comm, send, sc, sd, recv, rc, rd);
}

static int h_allreduce_dd(void *ctx, shard_comm_t *comm, double *pairs, size_t npairs)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    CHECK_ACCESS(pairs, 2 * sizeof(double) * npairs, false, "allreduce");
    CHECK_ACCESS(pairs, 2 * sizeof(double) * npairs, true, "allreduce");
    return shard_comm_allreduce_sum_dd(comm, pairs, npairs);
}

static int h_find(void *ctx, shard_store_t *s, int ntables, const int64_t *off, const int64_t *keys,
                  int64_t step, bool insert, int32_t *rows)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    const size_t n = (size_t)(off[ntables] - off[0]);
    CHECK_ACCESS(keys + off[0], sizeof(int64_t) * n, false, "find");
    CHECK_ACCESS(rows + off[0], sizeof(int32_t) * n, true, "find");
    KILN_CHECK(shard_store_find_dev(s, off, keys, step, insert, rows, NULL));
    host_waits_compute(h);
    return 0;
}

static int h_read(void *ctx, shard_store_t *s, int t, int64_t n, const int32_t *rows, int dim,
                  float *out)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    CHECK_ACCESS(rows, sizeof(int32_t) * (size_t)n, false, "read");
    CHECK_ACCESS(out, sizeof(float) * (size_t)n * (size_t)dim, true, "read");
    return shard_store_read_dev(s, t, n, rows, out, NULL);
}

static int h_update(void *ctx, shard_store_t *s, int ntables, const kern_opt_t *opt,
                    const kern_row_grads_t *ug, int dim, int64_t step)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    for (int t = 0; t < ntables; t++) {
        CHECK_ACCESS(ug[t].rows, sizeof(int32_t) * (size_t)ug[t].n, false, "update");
        CHECK_ACCESS(ug[t].grads, sizeof(float) * (size_t)ug[t].n * (size_t)dim, false, "update");
    }
    return shard_store_update_dev(s, opt, ug, step, NULL);
}

static int h_accum(void *ctx, int64_t n, const int32_t *rows, const float *sums, int dim,
                   int64_t ntg, double *tg)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    CHECK_ACCESS(rows, sizeof(int32_t) * (size_t)n, false, "accum");
    CHECK_ACCESS(sums, sizeof(float) * (size_t)n * (size_t)dim, false, "accum");
    CHECK_ACCESS(tg, sizeof(double) * (size_t)ntg * (size_t)dim, false, "accum");
    CHECK_ACCESS(tg, sizeof(double) * (size_t)ntg * (size_t)dim, true, "accum");
    for (int64_t u = 0; u < n; u++) {
        if (rows[u] < 0 || rows[u] >= ntg)
            return kiln_errf(KILN_EINTERNAL, "device stand-in: accum row %d outside 0..%lld",
                             rows[u], (long long)ntg - 1);
        for (int j = 0; j < dim; j++)
            tg[(int64_t)rows[u] * dim + j] += (double)sums[u * dim + j];
    }
    return 0;
}

/* One table of h_combine: rows (n), grads (n, dim) -> out. */
static int combine_table(int64_t n, const int32_t *rows, const double *grads, int dim,
                         kern_row_grads_t *out)
{
    sortrec_t *v = kiln_malloc(sizeof *v * (size_t)(n ? n : 1));
    double *acc = kiln_malloc(sizeof *acc * (size_t)dim);
    if (v == NULL || acc == NULL) {
        KILN_FREE_ALL(v, acc);
        return KILN_ENOMEM;
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = (sortrec_t){rows[i], i, i};
    qsort(v, (size_t)n, sizeof *v, by_major_minor); /* by row, then position */
    int64_t u = 0;
    for (int64_t i = 0; i < n;) {
        int64_t e = i;
        memset(acc, 0, sizeof *acc * (size_t)dim);
        for (; e < n && v[e].major == v[i].major; e++)
            for (int j = 0; j < dim; j++)
                acc[j] += grads[v[e].pos * dim + j];
        out->rows[u] = (int32_t)v[i].major;
        for (int j = 0; j < dim; j++)
            out->grads[u * dim + j] = (float)acc[j];
        u++;
        i = e;
    }
    out->n = u;
    KILN_FREE_ALL(v, acc);
    return 0;
}

static int h_combine(void *ctx, int ntables, const int64_t *off, const int32_t *rows,
                     const double *grads, int dim, kern_row_grads_t *out)
{
    standin_t *h = ctx;
    const uint64_t now = tick(h, DEV_COMPUTE);
    for (int t = 0; t < ntables; t++) {
        const int64_t o0 = off[t], n = off[t + 1] - o0;
        out[t].n = 0;
        if (n == 0)
            continue;
        CHECK_ACCESS(rows + o0, sizeof(int32_t) * (size_t)n, false, "combine");
        CHECK_ACCESS(grads + o0 * dim, sizeof(double) * (size_t)n * (size_t)dim, false, "combine");
        CHECK_ACCESS(out[t].rows, sizeof(int32_t) * (size_t)n, true, "combine");
        CHECK_ACCESS(out[t].grads, sizeof(float) * (size_t)n * (size_t)dim, true, "combine");
        KILN_CHECK(combine_table(n, rows + o0, grads + o0 * dim, dim, &out[t]));
    }
    host_waits_compute(h);
    return 0;
}

const dev_ops_t train_dev_host_ops = {
    .name = "stand-in",
    .create = h_create,
    .destroy = h_destroy,
    .alloc = h_alloc,
    .release = h_release,
    .copy = h_copy,
    .record = h_record,
    .wait = h_wait,
    .sync = h_sync,
    .host_touch = h_host_touch,
    .gather = h_gather,
    .dense = h_dense,
    .reduce = h_reduce,
    .permute = h_permute,
    .zero = h_zero,
    .dedupe = h_dedupe,
    .alltoallv = h_alltoallv,
    .allreduce_dd = h_allreduce_dd,
    .find = h_find,
    .read = h_read,
    .update = h_update,
    .accum = h_accum,
    .combine = h_combine,
};
