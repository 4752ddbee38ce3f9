/*
 * serving/serve_table.c - kiln-serve's per-table store: int64 key -> one
 * float row. Open addressing with linear probing and backward-shift
 * deletion over a power-of-two slot array (load <= 1/2); rows live in one
 * growing arena and a deleted row's place goes on a free list for reuse.
 * serve_table_reserve lets the store grow everything before it applies a
 * verified push, so that applying cannot fail half way.
 */
#include <stdlib.h>
#include <string.h>

#include "serve_int.h"

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
};

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
    *out = t;
    return serve_table_reserve(t, 16) < 0 ? (serve_table_destroy(t), *out = NULL, KILN_ENOMEM)
                                          : 0;
}

void serve_table_destroy(serve_table_t *t)
{
    if (t == NULL)
        return;
    KILN_FREE_ALL(t->skeys, t->srow, t->rows, t->freel);
    free(t);
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

int serve_table_upsert(serve_table_t *t, int64_t n, const int64_t *keys, const float *values)
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

void serve_table_remove(serve_table_t *t, int64_t n, const int64_t *keys)
{
    for (int64_t i = 0; i < n; i++) {
        size_t j = probe(t, keys[i]);
        if (t->srow[j] < 0)
            continue;
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
}

const float *serve_table_find(const serve_table_t *t, int64_t key)
{
    size_t j = probe(t, key);
    return t->srow[j] < 0 ? NULL : t->rows + t->srow[j] * t->dim;
}

int64_t serve_table_size(const serve_table_t *t) { return t->n; }
int serve_table_dim(const serve_table_t *t) { return t->dim; }

int64_t serve_table_rows(const serve_table_t *t, size_t *pos, int64_t cap, int64_t *keys,
                         float *values)
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
    return n;
}
