/*
 * serving/serve_table.c - kiln-serve's per-table store: int64 key -> one
 * float row. Open addressing with linear probing and backward-shift
 * deletion over a power-of-two slot array (load <= 1/2); rows live in one
 * growing arena and a deleted row's place goes on a free list for reuse.
 * serve_table_reserve lets the store grow everything before it applies a
 * verified push, so that applying cannot fail half way (but for the disk,
 * below).
 *
 * Tables larger than memory (kiln-serve --table-memory): with a spill
 * directory set (serve_table_spill), a table keeps at most ram_rows rows in
 * RAM and the rest as records in a disk tier, the trainer's own
 * (kernels/kern_tier.h), in a file of the spill directory. A key lives in
 * one tier: upserts fill RAM first and put the rest on disk (replacing the
 * key's old record there), removals reach both, and lookups read the keys
 * RAM lacks from the file in one batch (under a mutex: lookups run in
 * parallel under the store's read lock, a tier's buffers are its own).
 * Which rows stay in RAM is the order they came in, not their use: lookups
 * do not move rows between the tiers. The tier is sized for the table's
 * rows when a push reserves room and rebuilt twice as big when it runs out.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern_tier.h"
#include "serve_int.h"

/* Set once at start (serve_table_spill), before any table exists. */
static int64_t spill_bytes; /* RAM a table's rows may take; 0: no tier */
static char spill_dir[512];
static int64_t spill_seq;
static pthread_mutex_t spill_mu = PTHREAD_MUTEX_INITIALIZER;

struct serve_table {
    int dim;
    int64_t n;        /* live keys */
    size_t mask;      /* slots - 1 */
    int64_t *skeys;   /* (slots) */
    int64_t *srow;    /* (slots) row of the key, -1: empty */
    float *rows;      /* (rows_cap, dim) */
    int64_t rows_used, rows_cap;
    int64_t *freel;   /* free rows below rows_used */
    int64_t nfree, free_cap;
    /* The disk tier (cold NULL until rows pass ram_rows). */
    int64_t ram_rows;  /* 0: no limit */
    kern_tier_t *cold;
    int64_t cold_rows; /* records the tier's file was sized for */
    pthread_mutex_t cold_mu;
};

void serve_table_spill(int64_t table_bytes, const char *dir)
{
    spill_bytes = table_bytes;
    snprintf(spill_dir, sizeof spill_dir, "%s", dir ? dir : "");
}

static inline size_t hash_key(int64_t k)
{
    uint64_t x = (uint64_t)k;
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return (size_t)x;
}

int serve_table_create(int dim, serve_table_t **out)
{
    serve_table_t *t = kiln_calloc(1, sizeof *t);
    if (t == NULL)
        return KILN_ENOMEM;
    t->dim = dim;
    pthread_mutex_init(&t->cold_mu, NULL);
    if (spill_bytes > 0) {
        /* A row's floats and its share of the index (2 slots of 16 bytes). */
        t->ram_rows = spill_bytes / (int64_t)(sizeof(float) * (size_t)dim + 32);
        t->ram_rows = t->ram_rows > 0 ? t->ram_rows : 1;
    }
    *out = t;
    return serve_table_reserve(t, 16) < 0 ? (serve_table_destroy(t), *out = NULL, KILN_ENOMEM)
                                          : 0;
}

void serve_table_destroy(serve_table_t *t)
{
    if (t == NULL)
        return;
    kern_tier_close(t->cold);
    pthread_mutex_destroy(&t->cold_mu);
    KILN_FREE_ALL(t->skeys, t->srow, t->rows, t->freel);
    free(t);
}

/* Copies the tier's records into next, chunk by chunk. */
static int move_chunk(void *ctx, int64_t n, const void *recs)
{
    return kern_tier_put(ctx, n, recs);
}

/* Makes the tier hold `rows` records (its file sized for twice that): opens
 * it, or rebuilds it bigger with its records. */
static int cold_reserve(serve_table_t *t, int64_t rows)
{
    if (t->cold && rows <= t->cold_rows)
        return 0;
    pthread_mutex_lock(&spill_mu);
    char *path = kiln_asprintf("%s/table.%lld.tier", spill_dir, (long long)spill_seq++);
    pthread_mutex_unlock(&spill_mu);
    if (path == NULL)
        return KILN_ENOMEM;
    kern_tier_t *next = NULL;
    int64_t size = 2 * rows > 1024 ? 2 * rows : 1024;
    int rc = kern_tier_open(path, "served", size, t->dim, KERN_TIER_IO_AUTO, &next);
    if (rc == 0 && t->cold)
        rc = kern_tier_each(t->cold, INT64_MIN, move_chunk, next);
    free(path);
    if (rc < 0) {
        kern_tier_close(next);
        return rc;
    }
    kern_tier_close(t->cold);
    t->cold = next;
    t->cold_rows = size;
    return 0;
}

static int rehash(serve_table_t *t, size_t slots)
{
    int64_t *k = kiln_calloc(slots, sizeof *k), *r = kiln_calloc(slots, sizeof *r);
    if (k == NULL || r == NULL) {
        free(k);
        free(r);
        return KILN_ENOMEM;
    }
    memset(r, 0xff, slots * sizeof *r);
    size_t mask = slots - 1;
    if (t->srow != NULL)
        for (size_t i = 0; i <= t->mask; i++) {
            if (t->srow[i] < 0)
                continue;
            size_t j = hash_key(t->skeys[i]) & mask;
            while (r[j] >= 0)
                j = (j + 1) & mask;
            k[j] = t->skeys[i];
            r[j] = t->srow[i];
        }
    free(t->skeys);
    free(t->srow);
    t->skeys = k;
    t->srow = r;
    t->mask = mask;
    return 0;
}

int serve_table_reserve(serve_table_t *t, int64_t extra)
{
    if (t->ram_rows > 0) {
        /* RAM up to ram_rows, the tier for all of them (keys may move). */
        if (t->n + extra > t->ram_rows)
            KILN_CHECK(cold_reserve(t, t->n + (t->cold ? kern_tier_size(t->cold) : 0) + extra));
        extra = t->ram_rows - t->n < extra ? t->ram_rows - t->n : extra;
        extra = extra > 0 ? extra : 0;
    }
    int64_t want = t->n + extra;
    size_t slots = t->srow ? t->mask + 1 : 0;
    if ((int64_t)slots < 2 * want || slots == 0) {
        size_t s = slots ? slots : 32;
        while ((int64_t)s < 2 * want)
            s *= 2;
        if (s != slots)
            KILN_CHECK(rehash(t, s));
    }
    int64_t rows_want = t->rows_used + extra;
    if (rows_want > t->rows_cap) {
        int64_t cap = t->rows_cap ? t->rows_cap : 16;
        while (cap < rows_want)
            cap *= 2;
        float *p = kiln_reallocarray(t->rows, (size_t)cap, (size_t)t->dim * sizeof(float));
        if (p == NULL)
            return KILN_ENOMEM;
        t->rows = p;
        t->rows_cap = cap;
    }
    if (t->free_cap < t->rows_cap) {
        /* Room for every row to be freed, so remove never allocates. */
        int64_t *f = kiln_reallocarray(t->freel, (size_t)t->rows_cap, sizeof *f);
        if (f == NULL)
            return KILN_ENOMEM;
        t->freel = f;
        t->free_cap = t->rows_cap;
    }
    return 0;
}

static size_t probe(const serve_table_t *t, int64_t key)
{
    size_t j = hash_key(key) & t->mask;
    while (t->srow[j] >= 0 && t->skeys[j] != key)
        j = (j + 1) & t->mask;
    return j;
}

static int ram_upsert(serve_table_t *t, int64_t n, const int64_t *keys, const float *values)
{
    size_t rb = (size_t)t->dim * sizeof(float);
    for (int64_t i = 0; i < n; i++) {
        size_t j = probe(t, keys[i]);
        if (t->srow[j] < 0) {
            if ((int64_t)(t->mask + 1) < 2 * (t->n + 1) || t->rows_used >= t->rows_cap)
                KILN_CHECK(serve_table_reserve(t, n - i));
            if (t->free_cap < t->rows_used + 1)
                KILN_CHECK(serve_table_reserve(t, n - i));
            j = probe(t, keys[i]);
            int64_t row = t->nfree > 0 ? t->freel[--t->nfree] : t->rows_used++;
            t->skeys[j] = keys[i];
            t->srow[j] = row;
            t->n++;
        }
        memcpy(t->rows + t->srow[j] * t->dim, values + i * t->dim, rb);
    }
    return 0;
}

/* Removes keys from RAM; with out, lists those RAM lacks there. */
static int64_t ram_remove(serve_table_t *t, int64_t n, const int64_t *keys, int64_t *out)
{
    int64_t nout = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t j = probe(t, keys[i]);
        if (t->srow[j] < 0) {
            if (out)
                out[nout++] = keys[i];
            continue;
        }
        if (t->nfree < t->free_cap)
            t->freel[t->nfree++] = t->srow[j];
        t->srow[j] = -1;
        t->n--;
        /* Backward shift: move later entries of the run into the hole when
         * their home slot does not lie cyclically in (hole, their slot]. */
        size_t hole = j, k = (j + 1) & t->mask;
        while (t->srow[k] >= 0) {
            size_t home = hash_key(t->skeys[k]) & t->mask;
            bool stays = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
            if (!stays) {
                t->skeys[hole] = t->skeys[k];
                t->srow[hole] = t->srow[k];
                t->srow[k] = -1;
                hole = k;
            }
            k = (k + 1) & t->mask;
        }
    }
    return nout;
}

/* A tier record's bytes: kern_rec_t, then the row. */
static size_t rec_bytes(const serve_table_t *t)
{
    return (sizeof(kern_rec_t) + sizeof(float) * (size_t)t->dim + 7) & ~(size_t)7;
}

static int cmp_idx_key(const void *a, const void *b, void *ctx)
{
    const int64_t *keys = ctx, x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (keys[x] != keys[y])
        return keys[x] < keys[y] ? -1 : 1;
    return (x > y) - (x < y);
}

int serve_table_upsert(serve_table_t *t, int64_t n, const int64_t *keys, const float *values)
{
    if (t->ram_rows == 0)
        return ram_upsert(t, n, keys, values);
    const size_t vb = sizeof(float) * (size_t)t->dim, rb = rec_bytes(t);
    int64_t *miss = kiln_malloc(sizeof *miss * (size_t)(n + 1)), nm = 0, nd = 0, del;
    int64_t *mkeys = kiln_malloc(sizeof *mkeys * (size_t)(n + 1));
    uint8_t *recs = NULL;
    int rc = 0;
    if (miss == NULL || mkeys == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    /* Keys in RAM are overwritten there; the others leave the disk first. */
    for (int64_t i = 0; i < n; i++) {
        size_t j = probe(t, keys[i]);
        if (t->srow[j] >= 0)
            memcpy(t->rows + t->srow[j] * t->dim, values + i * t->dim, vb);
        else
            mkeys[nm] = keys[i], miss[nm++] = i;
    }
    if (nm > 0 && t->cold)
        KILN_CHECK_GOTO(kern_tier_delete(t->cold, nm, mkeys, NULL, NULL, &del), rc, out);
    /* Then RAM while it has room, the disk for the rest. */
    for (int64_t m = 0; m < nm; m++) {
        int64_t i = miss[m];
        size_t j = probe(t, keys[i]);
        if (t->srow[j] >= 0 || t->n < t->ram_rows)
            KILN_CHECK_GOTO(ram_upsert(t, 1, &keys[i], values + i * t->dim), rc, out);
        else
            miss[nd++] = i;
    }
    if (nd == 0)
        goto out;
    /* A key given twice goes to disk once, with its last row. */
    qsort_r(miss, (size_t)nd, sizeof *miss, cmp_idx_key, (void *)keys);
    int64_t nu = 0;
    for (int64_t m = 0; m < nd; m++) {
        if (m + 1 < nd && keys[miss[m + 1]] == keys[miss[m]])
            continue;
        miss[nu++] = miss[m];
    }
    if (!(recs = kiln_calloc((size_t)nu, rb))) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int64_t m = 0; m < nu; m++) {
        kern_rec_t h = {.key = keys[miss[m]]};
        memcpy(recs + (size_t)m * rb, &h, sizeof h);
        memcpy(recs + (size_t)m * rb + sizeof h, values + miss[m] * t->dim, vb);
    }
    KILN_CHECK_GOTO(cold_reserve(t, (t->cold ? kern_tier_size(t->cold) : 0) + nu), rc, out);
    rc = kern_tier_put(t->cold, nu, recs);
out:
    KILN_FREE_ALL(miss, mkeys, recs);
    return rc;
}

int serve_table_remove(serve_table_t *t, int64_t n, const int64_t *keys)
{
    if (t->cold == NULL) {
        ram_remove(t, n, keys, NULL);
        return 0;
    }
    int64_t *rest = kiln_malloc(sizeof *rest * (size_t)(n + 1)), del;
    if (rest == NULL)
        return KILN_ENOMEM;
    int64_t nr = ram_remove(t, n, keys, rest);
    int rc = nr > 0 ? kern_tier_delete(t->cold, nr, rest, NULL, NULL, &del) : 0;
    free(rest);
    return rc;
}

int serve_table_lookup(serve_table_t *t, int64_t n, const int64_t *keys, float *out,
                       uint8_t *found)
{
    const size_t vb = sizeof(float) * (size_t)t->dim;
    int64_t nm = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t j = probe(t, keys[i]);
        found[i] = t->srow[j] >= 0;
        if (found[i])
            memcpy(out + i * t->dim, t->rows + t->srow[j] * t->dim, vb);
        else
            nm++;
    }
    if (nm == 0 || t->cold == NULL)
        return 0;
    const size_t rb = rec_bytes(t);
    int64_t *mk = kiln_malloc(sizeof *mk * (size_t)nm), *mi = kiln_malloc(sizeof *mi * (size_t)nm);
    uint8_t *recs = kiln_malloc(rb * (size_t)nm), *mf = kiln_malloc((size_t)nm);
    int rc = 0;
    if (mk == NULL || mi == NULL || recs == NULL || mf == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    nm = 0;
    for (int64_t i = 0; i < n; i++)
        if (!found[i])
            mk[nm] = keys[i], mi[nm++] = i;
    pthread_mutex_lock(&t->cold_mu);
    rc = kern_tier_get(t->cold, nm, mk, recs, mf);
    pthread_mutex_unlock(&t->cold_mu);
    for (int64_t m = 0; m < nm && rc == 0; m++) {
        if (!mf[m])
            continue;
        found[mi[m]] = 1;
        memcpy(out + mi[m] * t->dim, recs + (size_t)m * rb + sizeof(kern_rec_t), vb);
    }
out:
    KILN_FREE_ALL(mk, mi, recs, mf);
    return rc;
}

int64_t serve_table_size(const serve_table_t *t)
{
    return t->n + (t->cold ? kern_tier_size(t->cold) : 0);
}

int64_t serve_table_ram_rows(const serve_table_t *t) { return t->n; }
int serve_table_dim(const serve_table_t *t) { return t->dim; }

int serve_table_rows(serve_table_t *t, size_t *pos, int64_t cap, int64_t *keys, float *values,
                     int64_t *nout)
{
    int64_t n = 0;
    const size_t slots = t->mask + 1;
    while (*pos < slots && n < cap) {
        size_t i = (*pos)++;
        if (t->srow[i] < 0)
            continue;
        keys[n] = t->skeys[i];
        memcpy(values + (size_t)n * (size_t)t->dim, t->rows + (size_t)t->srow[i] * (size_t)t->dim,
               sizeof(float) * (size_t)t->dim);
        n++;
    }
    *nout = n;
    if (n > 0 || t->cold == NULL)
        return 0;
    /* Past the slots: the tier's pages, *pos - slots the next one. */
    const size_t rb = rec_bytes(t);
    uint8_t *recs = kiln_malloc(rb * (size_t)cap);
    if (recs == NULL)
        return KILN_ENOMEM;
    int64_t page = (int64_t)(*pos - slots);
    pthread_mutex_lock(&t->cold_mu);
    int rc = kern_tier_scan(t->cold, &page, cap, recs, &n);
    pthread_mutex_unlock(&t->cold_mu);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        kern_rec_t h;
        memcpy(&h, recs + (size_t)i * rb, sizeof h);
        keys[i] = h.key;
        memcpy(values + (size_t)i * (size_t)t->dim, recs + (size_t)i * rb + sizeof h,
               sizeof(float) * (size_t)t->dim);
    }
    free(recs);
    *pos = slots + (size_t)page;
    *nout = rc == 0 ? n : 0;
    return rc;
}
