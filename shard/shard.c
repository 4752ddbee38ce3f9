/*
 * shard/shard.c - the exchange that makes embedding tables model parallel:
 * keys to their owners, rows back, gradients to the owners, with one
 * all-to-all each for all tables of a step. See shard.h for the contract.
 *
 * Buffers are laid out destination-major, table-minor: the segment of
 * (rank d, table t) follows (d, t-1). Keys travel as int64, rows and
 * gradients as float32 with each table's own width, so a segment of table t
 * holds count x dim_t floats. All buffers grow and are reused across steps.
 */
#include "shard.h"
#include "kern_ops.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

/* ---- dedupe ----------------------------------------------------------------- */

struct shard_dedupe {
    int64_t *slot_keys; /* (cap) */
    int32_t *slot_idx;  /* (cap) -1: empty */
    int64_t cap;        /* power of two */
    int64_t *uniq;
    int64_t uniq_cap;
};

int shard_dedupe_create(shard_dedupe_t **out)
{
    shard_dedupe_t *d = kiln_calloc(1, sizeof *d);
    if (d == NULL)
        return KILN_ENOMEM;
    *out = d;
    return 0;
}

void shard_dedupe_destroy(shard_dedupe_t *d)
{
    if (d == NULL)
        return;
    KILN_FREE_ALL(d->slot_keys, d->slot_idx, d->uniq);
    free(d);
}

/* Makes the compiler treat x as computed: it cannot split a branch on it
 * back into branches on the terms x was made of. */
#if defined(__GNUC__)
#define OPAQUE(x) __asm__("" : "+r"(x))
#else
#define OPAQUE(x) ((void)0)
#endif

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

int shard_dedupe_run(shard_dedupe_t *d, const int64_t *keys, int64_t n, int32_t *inverse,
                  const int64_t **uniq, int64_t *nuniq)
{
    int64_t want = 16;
    while (want < 2 * n)
        want *= 2;
    if (want > d->cap) {
        free(d->slot_keys);
        free(d->slot_idx);
        /* Zeroed once: the loop below reads a slot's key before it knows
         * whether the slot is empty. */
        d->slot_keys = kiln_calloc((size_t)want, sizeof *d->slot_keys);
        d->slot_idx = kiln_malloc((size_t)want * sizeof *d->slot_idx);
        d->cap = d->slot_keys && d->slot_idx ? want : 0;
        if (d->cap == 0)
            return KILN_ENOMEM;
    }
    if (n > d->uniq_cap) {
        int64_t *u = kiln_reallocarray(d->uniq, (size_t)n, sizeof *u);
        if (u == NULL)
            return KILN_ENOMEM;
        d->uniq = u;
        d->uniq_cap = n;
    }
    /* Only the first `want` slots are used this time; clear just those. */
    memset(d->slot_idx, 0xff, (size_t)want * sizeof *d->slot_idx);
    uint64_t mask = (uint64_t)want - 1;
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = keys[i];
        uint64_t h = mix64((uint64_t)k) & mask;
        /* The home slot empty or holding k: no branch on which, since in a
         * skewed batch a key is new about 4 times in 10, in no order a
         * predictor learns. (A stale slot_keys entry under an empty slot is
         * overwritten with k either way.) */
        const int32_t home = d->slot_idx[h];
        const int fresh = home < 0;
        int here = fresh | (d->slot_keys[h] == k);
        OPAQUE(here); /* one branch on here, not one on each half */
        if (here) {
            const int32_t v = fresh ? (int32_t)u : home;
            d->slot_idx[h] = v;
            d->slot_keys[h] = k;
            d->uniq[u] = k;
            inverse[i] = v;
            u += fresh;
            continue;
        }
        /* Another key is home: probe on. */
        for (;;) {
            int32_t idx = d->slot_idx[h];
            if (idx < 0) {
                d->slot_idx[h] = (int32_t)u;
                d->slot_keys[h] = k;
                d->uniq[u] = k;
                inverse[i] = (int32_t)u++;
                break;
            }
            if (d->slot_keys[h] == k) {
                inverse[i] = idx;
                break;
            }
            h = (h + 1) & mask;
        }
    }
    *uniq = d->uniq;
    *nuniq = u;
    return 0;
}

/* ---- the exchange ------------------------------------------------------------ */

/* A growable buffer of bytes. */
typedef struct {
    void *p;
    size_t cap;
} buf_t;

static void *buf_need(buf_t *b, size_t bytes)
{
    if (bytes > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < bytes)
            cap *= 2;
        void *p = realloc(b->p, cap);
        if (p == NULL) {
            kiln_errf(KILN_ENOMEM, "out of memory growing an exchange buffer to %zu bytes", cap);
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    return b->p;
}

struct shard {
    shard_comm_t *comm; /* borrowed */
    int rank, nranks, ntables;
    shard_store_t *store;     /* this rank's shards (borrowed) */
    int *dims;             /* (ntables) */

    /* counts of keys, (nranks x ntables): scnt for what this rank asks of
     * each owner, rcnt for what each requester asks of this rank */
    int *scnt, *rcnt;
    int *key_sc, *key_sd, *key_rc, *key_rd; /* (nranks) per-rank key counts and displacements */
    int *flt_sc, *flt_sd, *flt_rc, *flt_rd; /* (nranks) the same in floats */

    /* requester side, per table: where key i went (rank and index in segment) */
    int32_t **loc_rank, **loc_pos;
    int64_t *loc_cap;
    int64_t *nkeys; /* (ntables) of the last lookup */
    float **values; /* (ntables) (nkeys, dim) results */
    int64_t *values_cap;

    /* owner side: rows of the received keys, aligned with rkeys */
    buf_t skeys, rkeys, rrows, sflt, rflt;

    /* owner side, update: per-table unique rows and summed grads */
    int32_t **mark;      /* (ntables) (capacity) row -> unique index, -1 */
    kern_row_grads_t *ug;
    buf_t *ug_rows, *ug_grads; /* the update's unique rows, float32 gradients */
    buf_t *ug_sum;             /* owners' float64 sums before rounding */
    const int64_t **fill_keys; /* shard_lookup_fill: (ntables) each table's keys */
    int64_t *fill_n;
    /* shard_update_fill: per table, the filled sums (several ranks); per
     * thread, one table's sums and their rounding (one rank) */
    buf_t *fill_dd;
    double **fill_ddp;
    struct {
        buf_t dd, f;
    } *thr;
    int nthr;
    int64_t bytes_last;
    size_t *zsc, *zsd, *zrc, *zrd; /* (nranks) one exchange's counts and displacements in bytes */
};

int shard_create(shard_comm_t *comm, int ntables, shard_store_t *store, const int *dims,
                    shard_t **out)
{
    int rc = 0;
    shard_t *s = kiln_calloc(1, sizeof *s);
    if (s == NULL)
        return KILN_ENOMEM;
    s->comm = comm;
    const shard_comm_info_t ci = shard_comm_info(comm);
    s->rank = ci.rank;
    s->nranks = ci.size;
    s->ntables = ntables;
    size_t R = (size_t)s->nranks, T = (size_t)ntables;
    s->store = store;
    s->dims = kiln_calloc(T, sizeof *s->dims);
    s->scnt = kiln_calloc(R * T, sizeof(int));
    s->rcnt = kiln_calloc(R * T, sizeof(int));
    int **ints[] = {&s->key_sc, &s->key_sd, &s->key_rc, &s->key_rd,
                    &s->flt_sc, &s->flt_sd, &s->flt_rc, &s->flt_rd};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        *ints[i] = kiln_calloc(R, sizeof(int));
    size_t **sizes[] = {&s->zsc, &s->zsd, &s->zrc, &s->zrd};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        *sizes[i] = kiln_calloc(R, sizeof(size_t));
    s->loc_rank = kiln_calloc(T, sizeof *s->loc_rank);
    s->loc_pos = kiln_calloc(T, sizeof *s->loc_pos);
    s->loc_cap = kiln_calloc(T, sizeof *s->loc_cap);
    s->nkeys = kiln_calloc(T, sizeof *s->nkeys);
    s->values = kiln_calloc(T, sizeof *s->values);
    s->values_cap = kiln_calloc(T, sizeof *s->values_cap);
    s->mark = kiln_calloc(T, sizeof *s->mark);
    s->ug = kiln_calloc(T, sizeof *s->ug);
    s->ug_rows = kiln_calloc(T, sizeof *s->ug_rows);
    s->ug_grads = kiln_calloc(T, sizeof *s->ug_grads);
    s->ug_sum = kiln_calloc(T, sizeof *s->ug_sum);
    s->fill_keys = kiln_calloc(T, sizeof *s->fill_keys);
    s->fill_n = kiln_calloc(T, sizeof *s->fill_n);
    s->fill_dd = kiln_calloc(T, sizeof *s->fill_dd);
    s->fill_ddp = kiln_calloc(T, sizeof *s->fill_ddp);
    if (!s->dims || !s->scnt || !s->rcnt || !s->flt_rd || !s->zrd || !s->loc_rank ||
        !s->loc_pos || !s->loc_cap || !s->nkeys || !s->values || !s->values_cap || !s->mark ||
        !s->ug || !s->ug_rows || !s->ug_grads || !s->ug_sum || !s->fill_keys || !s->fill_n ||
        !s->fill_dd || !s->fill_ddp) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int t = 0; t < ntables; t++)
        s->dims[t] = dims[t];
    *out = s;
    return 0;
out:
    shard_destroy(s);
    return rc;
}

void shard_destroy(shard_t *s)
{
    if (s == NULL)
        return;
    for (int t = 0; s->values && t < s->ntables; t++)
        KILN_FREE_ALL(s->loc_rank[t], s->loc_pos[t], s->values[t], s->mark[t], s->ug_rows[t].p,
                      s->ug_grads[t].p, s->ug_sum[t].p, s->fill_dd[t].p);
    for (int i = 0; i < s->nthr; i++)
        KILN_FREE_ALL(s->thr[i].dd.p, s->thr[i].f.p);
    KILN_FREE_ALL(s->dims, s->scnt, s->rcnt, s->key_sc, s->key_sd, s->key_rc, s->key_rd, s->flt_sc,
                  s->flt_sd, s->flt_rc, s->flt_rd, s->loc_rank, s->loc_pos, s->loc_cap, s->nkeys,
                  s->values, s->values_cap, s->mark, s->ug, s->ug_rows, s->ug_grads, s->ug_sum,
                  s->skeys.p, s->rkeys.p, s->rrows.p, s->sflt.p, s->rflt.p, s->zsc, s->zsd, s->zrc,
                  s->zrd, s->fill_keys, s->fill_n, s->fill_dd, s->fill_ddp, s->thr);
    free(s);
}

/* One all-to-all-v through shard_comm of elements of elem bytes: the int
 * counts and displacements in elements (sc, sd for what this rank sends,
 * rc, rd for what it receives) become bytes. */
static int exchange(shard_t *s, const void *sbuf, const int *sc, const int *sd, void *rbuf,
                    const int *rc, const int *rd, size_t elem)
{
    for (int r = 0; r < s->nranks; r++) {
        s->zsc[r] = (size_t)sc[r] * elem;
        s->zsd[r] = (size_t)sd[r] * elem;
        s->zrc[r] = (size_t)rc[r] * elem;
        s->zrd[r] = (size_t)rd[r] * elem;
    }
    return shard_comm_alltoallv(s->comm, sbuf, s->zsc, s->zsd, rbuf, s->zrc, s->zrd);
}

/* Fills per-rank counts and displacements (in keys and in floats) from a
 * (nranks x ntables) count matrix. Returns the totals. */
static void layout(const shard_t *s, const int *cnt, int *kc, int *kd, int *fc, int *fd,
                   int64_t *keys_total, int64_t *floats_total)
{
    int64_t ko = 0, fo = 0;
    for (int r = 0; r < s->nranks; r++) {
        int64_t k = 0, f = 0;
        for (int t = 0; t < s->ntables; t++) {
            k += cnt[r * s->ntables + t];
            f += (int64_t)cnt[r * s->ntables + t] * s->dims[t];
        }
        kc[r] = (int)k;
        kd[r] = (int)ko;
        fc[r] = (int)f;
        fd[r] = (int)fo;
        ko += k;
        fo += f;
    }
    *keys_total = ko;
    *floats_total = fo;
}

/* Start (in keys, then in floats) of segment (rank r, table t) given the
 * rank's displacements. */
static void segment_start(const shard_t *s, const int *cnt, const int *kd, const int *fd,
                          int r, int t, int64_t *k0, int64_t *f0)
{
    int64_t k = kd[r], f = fd[r];
    for (int u = 0; u < t; u++) {
        k += cnt[r * s->ntables + u];
        f += (int64_t)cnt[r * s->ntables + u] * s->dims[u];
    }
    *k0 = k;
    *f0 = f;
}

/* Where each rank's floats of table t start in the sent buffers (f0[r]):
 * in buf when there are at most 64 ranks, else in a malloc'd array that the
 * caller frees. NULL when out of memory. */
static int64_t *sent_float_starts(const shard_t *s, int t, int64_t buf[64])
{
    const int R = s->nranks;
    int64_t *f0 = R <= 64 ? buf : kiln_malloc(sizeof(int64_t) * (size_t)R);
    for (int r = 0; f0 != NULL && r < R; r++) {
        int64_t k0;
        segment_start(s, s->scnt, s->key_sd, s->flt_sd, r, t, &k0, &f0[r]);
    }
    return f0;
}

/* Grows values[t] to (n, dim) floats. Returns 0 or KILN_ENOMEM. */
static int values_need(shard_t *s, int t, int64_t n)
{
    const int64_t want = n * s->dims[t];
    if (want <= s->values_cap[t])
        return 0;
    free(s->values[t]);
    s->values[t] = kiln_malloc((size_t)(want ? want : 1) * sizeof(float));
    s->values_cap[t] = s->values[t] ? want : 0;
    return s->values[t] ? 0 : KILN_ENOMEM;
}

/* Called from a parallel loop over tables when table t failed with rc:
 * keeps the failure of the lowest table (its code and this thread's
 * message), so the error reported does not depend on the threads. */
static void first_error(int t, int rc, int *first_bad, int *bad_rc, char *msg, size_t cap)
{
#pragma omp critical(shard_find_err)
    if (t < *first_bad) {
        *first_bad = t;
        *bad_rc = rc;
        snprintf(msg, cap, "%s", kiln_errmsg());
    }
}

/* Finds (or inserts) the keys of every table: table t looks up the segments
 * of all requesters, rank 0 first, so each table sees its keys in the same
 * order whatever the thread count. Tables run in parallel. seg(t, r) gives
 * requester r's keys of table t (k0, n) in keys/rows. Returns 0 or the
 * first failing table's code, with its message on this thread. */
typedef struct {
    int64_t k0, n;
} seg_t;

static int find_all(shard_t *s, int nreq, const seg_t *seg /* (T, nreq) */,
                    const int64_t *keys, int32_t *rows, int64_t step, bool insert)
{
    const int T = s->ntables;
    int first_bad = T, bad_rc = 0;
    char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1) if (shard_store_parallel(s->store))
    for (int t = 0; t < T; t++) {
        int rc = 0;
        for (int r = 0; r < nreq && rc == 0; r++) {
            const seg_t *g = &seg[(size_t)t * (size_t)nreq + (size_t)r];
            if (g->n == 0)
                continue;
            rc = shard_store_find(s->store, t, g->n, keys + g->k0, step, insert, rows + g->k0);
        }
        if (rc < 0)
            first_error(t, rc, &first_bad, &bad_rc, msg, sizeof msg);
    }
    if (bad_rc < 0)
        return kiln_errf(bad_rc, "%s", msg);
    return 0;
}

/* Table t's part of lookup_local: its n keys found (or inserted), their
 * rows in loc_pos[t] and the values copied out to values[t]. Returns 0 or
 * the table's failure. */
static int local_table(shard_t *s, int t, const int64_t *keys, int64_t n, int64_t step,
                       bool insert)
{
    if (n > s->loc_cap[t]) {
        free(s->loc_rank[t]);
        free(s->loc_pos[t]);
        s->loc_rank[t] = NULL;
        s->loc_pos[t] = kiln_malloc((size_t)n * sizeof(int32_t));
        s->loc_cap[t] = s->loc_pos[t] ? n : 0;
        if (s->loc_cap[t] == 0)
            return KILN_ENOMEM;
    }
    s->nkeys[t] = n;
    KILN_CHECK(values_need(s, t, n));
    if (n == 0)
        return 0;
    KILN_CHECK(shard_store_find(s->store, t, n, keys, step, insert, s->loc_pos[t]));
    return shard_store_read(s->store, t, n, s->loc_pos[t], s->values[t]);
}

/* The end of a lookup on one rank: the rows read at !insert may move again,
 * and values[t] holds table t's. */
static int local_done(shard_t *s, int64_t step, bool insert, float *const **values)
{
    if (!insert)
        shard_store_unpin(s->store, step);
    s->bytes_last = 0;
    *values = s->values;
    return 0;
}

/* One rank owns every key: no exchange, no packing. The rows of table t's
 * keys land in loc_pos[t]; the values are gathered straight from the slab.
 * The result is bitwise what the general path computes for one rank. */
static int lookup_local(shard_t *s, const int64_t *const *keys, const int64_t *nkeys,
                        int64_t step, bool insert, float *const **values)
{
    const int T = s->ntables;
    /* Per table: find_or_insert, then copy its rows out, in one parallel
     * loop over tables. */
    int first_bad = T, bad_rc = 0;
    char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1) if (shard_store_parallel(s->store))
    for (int t = 0; t < T; t++) {
        int trc = local_table(s, t, keys[t], nkeys[t], step, insert);
        if (trc < 0)
            first_error(t, trc, &first_bad, &bad_rc, msg, sizeof msg);
    }
    /* The message is the table's own; kiln-train's report names the rank. */
    if (bad_rc < 0)
        return kiln_errf(bad_rc, "%s", msg);
    return local_done(s, step, insert, values);
}

int shard_lookup_fill(shard_t *s, shard_keys_fn keys_of, void *ctx, int64_t step, bool insert,
                      float *const **values)
{
    const int T = s->ntables;
    const bool local = s->nranks == 1 && shard_store_on_host(s->store);
    int first_bad = T, bad_rc = 0;
    char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < T; t++) {
        int trc = keys_of(ctx, t, &s->fill_keys[t], &s->fill_n[t]);
        if (trc == 0 && local)
            trc = local_table(s, t, s->fill_keys[t], s->fill_n[t], step, insert);
        if (trc < 0)
            first_error(t, trc, &first_bad, &bad_rc, msg, sizeof msg);
    }
    if (bad_rc < 0)
        return kiln_errf(bad_rc, "%s", msg);
    if (!local)
        return shard_lookup(s, s->fill_keys, s->fill_n, step, insert, values);
    return local_done(s, step, insert, values);
}

int shard_lookup(shard_t *s, const int64_t *const *keys, const int64_t *nkeys, int64_t step,
                    bool insert, float *const **values)
{
    const int R = s->nranks, T = s->ntables;
    if (R == 1)
        return lookup_local(s, keys, nkeys, step, insert, values);
    memset(s->scnt, 0, sizeof(int) * (size_t)R * (size_t)T);

    /* 1. Where each key goes. */
    for (int t = 0; t < T; t++) {
        int64_t n = nkeys[t];
        if (n > s->loc_cap[t]) {
            free(s->loc_rank[t]);
            free(s->loc_pos[t]);
            s->loc_rank[t] = kiln_malloc((size_t)n * sizeof(int32_t));
            s->loc_pos[t] = kiln_malloc((size_t)n * sizeof(int32_t));
            s->loc_cap[t] = s->loc_rank[t] && s->loc_pos[t] ? n : 0;
            if (s->loc_cap[t] == 0)
                return KILN_ENOMEM;
        }
        int32_t *lr = s->loc_rank[t], *lp = s->loc_pos[t];
        for (int64_t i = 0; i < n; i++) {
            int r = R == 1 ? 0 : shard_owner(keys[t][i], R);
            lr[i] = r;
            lp[i] = s->scnt[r * T + t]++;
        }
        s->nkeys[t] = n;
    }
    KILN_CHECK(shard_comm_alltoall(s->comm, s->scnt, s->rcnt, (size_t)T * sizeof(int)));

    int64_t sk_total, sf_total, rk_total, rf_total;
    layout(s, s->scnt, s->key_sc, s->key_sd, s->flt_sc, s->flt_sd, &sk_total, &sf_total);
    layout(s, s->rcnt, s->key_rc, s->key_rd, s->flt_rc, s->flt_rd, &rk_total, &rf_total);

    /* 2. Pack keys destination-major and send them to their owners. */
    int64_t *sk = buf_need(&s->skeys, (size_t)(sk_total ? sk_total : 1) * sizeof(int64_t));
    int64_t *rk = buf_need(&s->rkeys, (size_t)(rk_total ? rk_total : 1) * sizeof(int64_t));
    int32_t *rows = buf_need(&s->rrows, (size_t)(rk_total ? rk_total : 1) * sizeof(int32_t));
    if (sk == NULL || rk == NULL || rows == NULL)
        return KILN_ENOMEM;
    for (int t = 0; t < T; t++) {
        for (int r = 0; r < R; r++) {
            int64_t k0, f0;
            segment_start(s, s->scnt, s->key_sd, s->flt_sd, r, t, &k0, &f0);
            (void)f0;
            /* reuse loc_pos to place keys: segment start + position */
            int32_t *lr = s->loc_rank[t], *lp = s->loc_pos[t];
            for (int64_t i = 0; i < nkeys[t]; i++)
                if (lr[i] == r)
                    sk[k0 + lp[i]] = keys[t][i];
        }
    }
    KILN_CHECK(exchange(s, sk, s->key_sc, s->key_sd, rk, s->key_rc, s->key_rd, sizeof(int64_t)));

    /* 3. Owners find (or insert) the keys, all tables, all requesters. */
    seg_t *seg = kiln_malloc(sizeof(seg_t) * (size_t)T * (size_t)R);
    if (seg == NULL)
        return KILN_ENOMEM;
    for (int t = 0; t < T; t++) {
        for (int r = 0; r < R; r++) {
            int64_t k0, f0;
            segment_start(s, s->rcnt, s->key_rd, s->flt_rd, r, t, &k0, &f0);
            seg[(size_t)t * (size_t)R + (size_t)r] = (seg_t){k0, s->rcnt[r * T + t]};
        }
    }
    int rc = find_all(s, R, seg, rk, rows, step, insert);
    free(seg);
    /* Every rank must learn whether any owner failed before going on. */
    int worst = shard_comm_agree(s->comm, rc, "the embedding lookup");
    if (worst < 0)
        return rc < 0 ? rc : worst; /* find_all's message, which kiln-train reports with the rank */

    /* 4. Owners gather the rows and send them back. */
    float *sf = buf_need(&s->sflt, (size_t)(rf_total ? rf_total : 1) * sizeof(float));
    float *rf = buf_need(&s->rflt, (size_t)(sf_total ? sf_total : 1) * sizeof(float));
    if (sf == NULL || rf == NULL)
        return KILN_ENOMEM;
    for (int t = 0; t < T; t++) {
        for (int r = 0; r < R; r++) {
            int64_t k0, f0;
            segment_start(s, s->rcnt, s->key_rd, s->flt_rd, r, t, &k0, &f0);
            KILN_CHECK(shard_store_read(s->store, t, s->rcnt[r * T + t], rows + k0, sf + f0));
        }
    }
    if (!insert)
        shard_store_unpin(s->store, step);
    KILN_CHECK(exchange(s, sf, s->flt_rc, s->flt_rd, rf, s->flt_sc, s->flt_sd, sizeof(float)));

    /* 5. Unpack into per-table arrays in the caller's key order. */
    for (int t = 0; t < T; t++) {
        const int dim = s->dims[t];
        int64_t n = nkeys[t];
        KILN_CHECK(values_need(s, t, n));
        int64_t f0s[64];
        int64_t *f0 = sent_float_starts(s, t, f0s);
        if (f0 == NULL)
            return KILN_ENOMEM;
        float *v = s->values[t];
        const int32_t *lr = s->loc_rank[t], *lp = s->loc_pos[t];
#pragma omp parallel for schedule(static) if (n > 4096)
        for (int64_t i = 0; i < n; i++)
            memcpy(v + i * dim, rf + f0[lr[i]] + (int64_t)lp[i] * dim, sizeof(float) * (size_t)dim);
        if (f0 != f0s)
            free(f0);
    }
    s->bytes_last = (sk_total + rk_total) * (int64_t)sizeof(int64_t) +
                    (sf_total + rf_total) * (int64_t)sizeof(float);
    *values = s->values;
    return 0;
}

/* float32 out (n) = the double-double sums in (n, 2), rounded once. */
static void round_grads(int64_t n, const double *in, float *out)
{
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++)
        out[i] = kern_dd_float(in[2 * i], in[2 * i + 1]);
}

/* One rank: the gradients are already aligned with the unique rows found
 * by lookup_local (loc_pos); round them and update the tables in place.
 * The tables are rounded side by side (a table's few thousand rows are too
 * few to split, 26 of them are not). */
static int update_local(shard_t *s, const double *const *grads, const kern_opt_t *opt,
                        int64_t step)
{
    const int T = s->ntables;
    for (int t = 0; t < T; t++) {
        int64_t nf = s->nkeys[t] * s->dims[t];
        if (buf_need(&s->ug_grads[t], (size_t)(nf ? nf : 1) * sizeof(float)) == NULL)
            return KILN_ENOMEM;
    }
#pragma omp parallel for schedule(dynamic, 1) if (T > 1)
    for (int t = 0; t < T; t++) {
        const int dim = s->dims[t];
        float *g = s->ug_grads[t].p;
        round_grads(s->nkeys[t] * dim, grads[t], g);
        s->ug[t].rows = s->loc_pos[t];
        s->ug[t].grads = g;
        /* Keys not admitted yet (row -1, kern.h) take no update: leave them
         * out, in place (rows and gradients are this step's scratch). */
        int64_t k = 0;
        for (int64_t i = 0; i < s->nkeys[t]; i++) {
            if (s->loc_pos[t][i] < 0)
                continue;
            if (k != i) {
                s->loc_pos[t][k] = s->loc_pos[t][i];
                memmove(g + k * dim, g + i * dim, sizeof(float) * (size_t)dim);
            }
            k++;
        }
        s->ug[t].n = k;
    }
    return shard_store_update(s->store, opt, s->ug, step);
}

int shard_update(shard_t *s, const double *const *grads, const kern_opt_t *opt,
                    int64_t step)
{
    const int R = s->nranks, T = s->ntables;
    if (R == 1)
        return update_local(s, grads, opt, step);
    int64_t sf_total = 0, rf_total = 0;
    for (int r = 0; r < R; r++) {
        sf_total += s->flt_sc[r];
        rf_total += s->flt_rc[r];
    }
    /* 1. Pack the double-double gradients exactly where the rows came from,
     * and send them (the float counts and displacements of the lookup, in
     * pairs). */
    double *sf = buf_need(&s->rflt, (size_t)(sf_total ? sf_total : 1) * 2 * sizeof(double));
    double *rf = buf_need(&s->sflt, (size_t)(rf_total ? rf_total : 1) * 2 * sizeof(double));
    if (sf == NULL || rf == NULL)
        return KILN_ENOMEM;
    for (int t = 0; t < T; t++) {
        const int dim = s->dims[t];
        int64_t f0s[64];
        int64_t *f0 = sent_float_starts(s, t, f0s);
        if (f0 == NULL)
            return KILN_ENOMEM;
        const int32_t *lr = s->loc_rank[t], *lp = s->loc_pos[t];
        int64_t n = s->nkeys[t];
#pragma omp parallel for schedule(static) if (n > 4096)
        for (int64_t i = 0; i < n; i++)
            memcpy(sf + 2 * (f0[lr[i]] + (int64_t)lp[i] * dim), grads[t] + 2 * i * dim,
                   2 * sizeof(double) * (size_t)dim);
        if (f0 != f0s)
            free(f0);
    }
    KILN_CHECK(exchange(s, sf, s->flt_sc, s->flt_sd, rf, s->flt_rc, s->flt_rd, 2 * sizeof(double)));
    s->bytes_last += (sf_total + rf_total) * 2 * (int64_t)sizeof(double);

    /* 2. Owners sum the gradients of a row sent by several requesters as
     * double-double pairs into one entry per unique row, and round each sum
     * to float32 once. */
    const int32_t *rows = s->rrows.p;
    for (int t = 0; t < T; t++) {
        const int dim = s->dims[t];
        int64_t m = 0;
        for (int r = 0; r < R; r++)
            m += s->rcnt[r * T + t];
        int32_t *urows = buf_need(&s->ug_rows[t], (size_t)(m ? m : 1) * sizeof(int32_t));
        double *usum =
            buf_need(&s->ug_sum[t], (size_t)(m ? m : 1) * (size_t)dim * 2 * sizeof(double));
        float *ugrad = buf_need(&s->ug_grads[t], (size_t)(m ? m : 1) * (size_t)dim * sizeof(float));
        if (urows == NULL || usum == NULL || ugrad == NULL)
            return KILN_ENOMEM;
        if (s->mark[t] == NULL) {
            int64_t cap = shard_store_rows_bound(s->store, t);
            s->mark[t] = kiln_malloc((size_t)cap * sizeof(int32_t));
            if (s->mark[t] == NULL)
                return KILN_ENOMEM;
            memset(s->mark[t], 0xff, (size_t)cap * sizeof(int32_t));
        }
        int32_t *mark = s->mark[t];
        int64_t u = 0;
        for (int r = 0; r < R; r++) {
            int64_t k0, f0;
            segment_start(s, s->rcnt, s->key_rd, s->flt_rd, r, t, &k0, &f0);
            int64_t n = s->rcnt[r * T + t];
            for (int64_t i = 0; i < n; i++) {
                int32_t row = rows[k0 + i];
                if (row < 0)
                    continue; /* a key not admitted yet: no row, no update */
                const double *g = rf + 2 * (f0 + i * dim);
                int32_t at = mark[row];
                if (at < 0) {
                    at = (int32_t)u++;
                    mark[row] = at;
                    urows[at] = row;
                    memcpy(usum + 2 * (int64_t)at * dim, g, 2 * sizeof(double) * (size_t)dim);
                } else {
                    double *acc = usum + 2 * (int64_t)at * dim;
                    for (int j = 0; j < dim; j++)
                        kern_dd_add_dd(&acc[2 * j], &acc[2 * j + 1], g[2 * j], g[2 * j + 1]);
                }
            }
        }
        for (int64_t i = 0; i < u; i++)
            mark[urows[i]] = -1;
        round_grads(u * dim, usum, ugrad);
        s->ug[t].rows = urows;
        s->ug[t].grads = ugrad;
        s->ug[t].n = u;
    }
    /* 3. One fused optimizer update over every table. */
    return shard_store_update(s->store, opt, s->ug, step);
}

/* Grows the per-thread scratch to nth threads. Returns 0 or KILN_ENOMEM. */
static int threads_need(shard_t *s, int nth)
{
    if (nth <= s->nthr)
        return 0;
    void *thr = kiln_reallocarray(s->thr, (size_t)nth, sizeof *s->thr);
    if (thr == NULL)
        return KILN_ENOMEM;
    s->thr = thr;
    memset(s->thr + s->nthr, 0, (size_t)(nth - s->nthr) * sizeof *s->thr);
    s->nthr = nth;
    return 0;
}

/* Rounds the sums dd (n, dim, 2) of the rows rows (n) to out (k, dim),
 * leaving out the rows not admitted yet (-1, kern.h; they take no update)
 * and moving the others' row ids to the front of rows. Returns k. */
static int64_t round_admitted(int64_t n, int dim, const double *dd, int32_t *rows, float *out)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] < 0)
            continue;
        rows[k] = rows[i];
        const double *in = dd + 2 * i * dim;
        float *o = out + k * dim;
#pragma omp simd
        for (int j = 0; j < dim; j++)
            o[j] = kern_dd_float(in[2 * j], in[2 * j + 1]);
        k++;
    }
    return k;
}

/* One rank with its tables on the host: a thread takes a table, has fill
 * write its sums into the thread's scratch, rounds them and updates the
 * table, so the sums are read back from its own cache (a step's sums of
 * all tables, 12 MB for fm on 26 tables, fit no cache) and the step has
 * one parallel region where it had four. The same operations as
 * update_local on every element, so the same bits. */
static int update_fill_local(shard_t *s, shard_fill_fn fill, void *ctx, const kern_opt_t *opt,
                             int64_t step)
{
    const int T = s->ntables;
    KILN_CHECK(threads_need(s, omp_get_max_threads()));
    int first_bad = T, bad_rc = 0;
    char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < T; t++) {
        const int64_t n = s->nkeys[t];
        const int dim = s->dims[t];
        if (n == 0)
            continue;
        const int me = omp_get_thread_num();
        double *dd = buf_need(&s->thr[me].dd, (size_t)(n * dim) * 2 * sizeof(double));
        float *g = buf_need(&s->thr[me].f, (size_t)(n * dim) * sizeof(float));
        int trc = KILN_ENOMEM;
        if (dd != NULL && g != NULL) {
            fill(ctx, t, dd);
            kern_row_grads_t ug = {.rows = s->loc_pos[t], .grads = g};
            ug.n = round_admitted(n, dim, dd, s->loc_pos[t], g);
            trc = shard_store_update_table(s->store, opt, t, &ug, step);
        }
        if (trc < 0)
            first_error(t, trc, &first_bad, &bad_rc, msg, sizeof msg);
    }
    if (bad_rc < 0)
        return kiln_errf(bad_rc, "%s", msg);
    return 0;
}

int shard_update_fill(shard_t *s, shard_fill_fn fill, void *ctx, const kern_opt_t *opt,
                      int64_t step)
{
    /* A table a thread: with fewer tables than threads (slots sharing one
     * table) some threads would idle where shard_update splits a table's
     * rows over all of them. */
    if (s->nranks == 1 && shard_store_on_host(s->store) && s->ntables >= omp_get_max_threads())
        return update_fill_local(s, fill, ctx, opt, step);
    const int T = s->ntables;
    for (int t = 0; t < T; t++) {
        const size_t bytes = (size_t)(s->nkeys[t] * s->dims[t]) * 2 * sizeof(double);
        if ((s->fill_ddp[t] = buf_need(&s->fill_dd[t], bytes ? bytes : 1)) == NULL)
            return KILN_ENOMEM;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < T; t++)
        if (s->nkeys[t] > 0)
            fill(ctx, t, s->fill_ddp[t]);
    return shard_update(s, (const double *const *)s->fill_ddp, opt, step);
}

int64_t shard_bytes_last_step(const shard_t *s) { return s->bytes_last; }
