/*
 * tests/test_kernels.c - kernels/: the dynamic embedding table (seeded init,
 * find-or-insert, lru/lfu eviction and its log, eviction none, delete, the
 * memory bound (dim 1 with every optimizer and policy among its cases), the
 * 4-byte index of 2^24-row tables, change tracking, scan, bulk load) and the
 * fused CPU ops (gather+combine, backward reduce, sgd/adagrad/adam), each
 * against a naive reference written plainly here, the gather also bit for
 * bit against its documented float order, plus OpenMP-vs-one-thread
 * equality. Floats are compared with atol + rtol*|ref|.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "kern_ops.h"
#include "kiln.h"
#include "proc.h"

static uint64_t rng = 0x1234567;
static uint64_t rnd(void) { return proc_xorshift(&rng); }
static float rndf(void) { return (float)((int)(rnd() % 2001) - 1000) / 1000.0f; }

static void assert_close(const float *got, const float *ref, size_t n, float atol, float rtol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - ref[i]) <= atol + rtol * fabsf(ref[i])))
            fail_msg("element %zu: got %.9g, reference %.9g", i, (double)got[i], (double)ref[i]);
}

static kern_table_t *make_table(const char *name, int dim, int64_t cap, kern_opt_kind_t opt,
                                kern_evict_t ev)
{
    kern_table_config_t cfg = {.name = name, .dim = dim, .capacity = cap, .opt = opt,
                               .init = KERN_INIT_UNIFORM, .init_scale = 0.05f, .seed = 42,
                               .evict = ev};
    kern_table_t *t = NULL;
    assert_int_equal(kern_table_create(&cfg, &t), 0);
    return t;
}

static const float *row_of(kern_table_t *t, int32_t r)
{
    kern_slab_t s;
    kern_table_slab(t, &s);
    return s.values + (size_t)r * (size_t)s.dim;
}

/* ---- the table -------------------------------------------------------------- */

/* Reference for the uniform initializer: splitmix64 as published (Vigna),
 * the top 24 bits as a fraction, scaled to (-s, s). */
static uint64_t ref_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static float ref_uniform(uint64_t seed, int64_t key, int j, float s)
{
    uint64_t h = ref_mix(ref_mix(seed ^ ref_mix((uint64_t)key)) + (uint64_t)j);
    return (2.0f * ((float)(h >> 40) / 16777216.0f) - 1.0f) * s;
}

static void test_init_is_seeded_and_order_free(void **state)
{
    (void)state;
    enum { N = 200, D = 12 };
    kern_table_t *a = make_table("a", D, 1000, KERN_OPT_SGD, KERN_EVICT_NONE);
    kern_table_t *b = make_table("b", D, 1000, KERN_OPT_SGD, KERN_EVICT_NONE);
    int64_t keys[N], rev[N];
    int32_t ra[N], rb[N];
    for (int i = 0; i < N; i++) {
        keys[i] = (int64_t)(rnd() >> 1) - (int64_t)(1LL << 40);
        rev[N - 1 - i] = keys[i];
    }
    /* a: one batch in order; b: reversed, in two batches, with a stranger first. */
    assert_int_equal(kern_table_find_or_insert(a, N, keys, 1, ra), 0);
    int64_t other = 777;
    int32_t ro;
    assert_int_equal(kern_table_find_or_insert(b, 1, &other, 1, &ro), 0);
    assert_int_equal(kern_table_find_or_insert(b, 50, rev, 1, rb), 0);
    assert_int_equal(kern_table_find_or_insert(b, N - 50, rev + 50, 1, rb + 50), 0);
    for (int i = 0; i < N; i++) {
        const float *va = row_of(a, ra[i]), *vb = row_of(b, rb[N - 1 - i]);
        assert_memory_equal(va, vb, sizeof(float) * D);
        for (int j = 0; j < D; j++) {
            assert_true(fabsf(va[j] - ref_uniform(42, keys[i], j, 0.05f)) <= 1e-7f);
            assert_true(va[j] > -0.05f && va[j] < 0.05f);
        }
    }
    /* An existing key keeps its row and its (changed) values. */
    float *v = (float *)row_of(a, ra[3]);
    v[0] = 9.5f;
    int32_t again;
    assert_int_equal(kern_table_find_or_insert(a, 1, &keys[3], 2, &again), 0);
    assert_int_equal(again, ra[3]);
    assert_true(row_of(a, again)[0] == 9.5f);
    assert_int_equal(kern_table_size(a), N);

    /* Duplicates in one batch share a row; normal init has about the right spread. */
    kern_table_config_t cfg = {.name = "n", .dim = 64, .capacity = 4096,
                               .init = KERN_INIT_NORMAL, .init_scale = 2.0f, .seed = 9};
    kern_table_t *n = NULL;
    assert_int_equal(kern_table_create(&cfg, &n), 0);
    int64_t nk[4096];
    int32_t nr[4096];
    for (int i = 0; i < 4096; i++)
        nk[i] = i / 2;
    assert_int_equal(kern_table_find_or_insert(n, 4096, nk, 1, nr), 0);
    assert_int_equal(kern_table_size(n), 2048);
    double sum = 0, sq = 0;
    for (int i = 0; i < 4096; i += 2) {
        assert_int_equal(nr[i], nr[i + 1]);
        for (int j = 0; j < 64; j++) {
            double x = row_of(n, nr[i])[j];
            sum += x;
            sq += x * x;
        }
    }
    double cnt = 2048.0 * 64, mean = sum / cnt, sd = sqrt(sq / cnt - mean * mean);
    assert_true(fabs(mean) < 0.05);
    assert_true(fabs(sd - 2.0) < 0.05);
    kern_table_destroy(a);
    kern_table_destroy(b);
    kern_table_destroy(n);
}

static void test_zero_init_and_bad_config(void **state)
{
    (void)state;
    kern_table_config_t cfg = {.name = "z", .dim = 5, .capacity = 10, .init = KERN_INIT_ZEROS,
                               .init_scale = 1.0f, .seed = 1};
    kern_table_t *t = NULL;
    assert_int_equal(kern_table_create(&cfg, &t), 0);
    int64_t k = 5;
    int32_t r;
    assert_int_equal(kern_table_find_or_insert(t, 1, &k, 0, &r), 0);
    for (int j = 0; j < 5; j++)
        assert_true(row_of(t, r)[j] == 0.0f);
    kern_table_destroy(t);
    cfg.dim = 0;
    assert_int_equal(kern_table_create(&cfg, &t), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "dim 0"));
    assert_null(t);
    cfg.dim = 4;
    cfg.capacity = 0;
    assert_int_equal(kern_table_create(&cfg, &t), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "capacity"));
}

static void test_lru_eviction(void **state)
{
    (void)state;
    kern_table_t *t = make_table("lru", 4, 4, KERN_OPT_SGD, KERN_EVICT_LRU);
    int32_t r, rows[2];
    for (int64_t k = 1; k <= 4; k++)
        assert_int_equal(kern_table_find_or_insert(t, 1, &k, k, &r), 0); /* key k at step k */
    int64_t k1 = 1;
    assert_int_equal(kern_table_find_or_insert(t, 1, &k1, 5, &r), 0); /* 1 used again */
    int64_t k5 = 5;
    assert_int_equal(kern_table_find_or_insert(t, 1, &k5, 6, &r), 0);
    /* Key 2 (last used at step 2) is the least recently used. */
    int64_t probe[5] = {1, 2, 3, 4, 5};
    int32_t found[5];
    assert_int_equal(kern_table_find(t, 5, probe, found), 4);
    assert_int_equal(found[1], -1);
    int64_t nlog;
    const kern_evicted_t *log = kern_table_evicted(t, &nlog);
    assert_int_equal(nlog, 1);
    assert_int_equal(log[0].key, 2);
    assert_int_equal(log[0].stamp, 2);
    assert_int_equal(log[0].step, 6);
    /* The new key reuses the freed row and gets its own seeded values. */
    assert_int_equal(r, found[4]);
    assert_true(fabsf(row_of(t, r)[1] - ref_uniform(42, 5, 1, 0.05f)) <= 1e-7f);

    /* Rows used in the current step are never evicted: at step 7 use 3 and 4,
     * then insert 6 and 7 -> 1 and 5 go (in that order of age). */
    int64_t use[2] = {3, 4}, ins[2] = {6, 7};
    assert_int_equal(kern_table_find_or_insert(t, 2, use, 7, rows), 0);
    assert_int_equal(kern_table_find_or_insert(t, 2, ins, 7, rows), 0);
    log = kern_table_evicted(t, &nlog);
    assert_int_equal(nlog, 3);
    int64_t gone[2] = {log[1].key, log[2].key};
    assert_true((gone[0] == 1 && gone[1] == 5) || (gone[0] == 5 && gone[1] == 1));
    /* Everything now was used at step 7: one more new key cannot fit. */
    int64_t k8 = 8;
    assert_int_equal(kern_table_find_or_insert(t, 1, &k8, 7, &r), KILN_EFULL);
    assert_non_null(strstr(kiln_errmsg(), "every row was used in the current step"));
    kern_table_evicted_clear(t);
    assert_null(kern_table_evicted(t, &nlog));
    assert_int_equal(nlog, 0);
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_int_equal(st.evictions, 3);
    kern_table_destroy(t);
}

/* A large table evicts a batch (1% of capacity) chosen by sampling: the
 * victims must be among the least recently used few percent. */
static void test_lru_batch_eviction(void **state)
{
    (void)state;
    enum { CAP = 10000 };
    kern_table_t *t = make_table("big", 4, CAP, KERN_OPT_SGD, KERN_EVICT_LRU);
    int64_t *keys = malloc(sizeof(int64_t) * CAP);
    int32_t *rows = malloc(sizeof(int32_t) * CAP);
    int64_t *last = malloc(sizeof(int64_t) * CAP); /* key i -> step of last use */
    for (int i = 0; i < CAP; i++)
        keys[i] = i;
    assert_int_equal(kern_table_find_or_insert(t, CAP, keys, 1, rows), 0);
    /* Touch all keys again in a shuffled order, 100 per step (steps 2..101). */
    for (int i = CAP - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1));
        int64_t x = keys[i];
        keys[i] = keys[j];
        keys[j] = x;
    }
    for (int s = 0; s < 100; s++) {
        assert_int_equal(kern_table_find_or_insert(t, 100, keys + s * 100, 2 + s, rows), 0);
        for (int i = 0; i < 100; i++)
            last[keys[s * 100 + i]] = 2 + s;
    }
    int64_t nk = CAP + 1;
    int32_t r;
    assert_int_equal(kern_table_find_or_insert(t, 1, &nk, 102, &r), 0);
    int64_t nlog;
    const kern_evicted_t *log = kern_table_evicted(t, &nlog);
    assert_int_equal(nlog, 100);
    assert_int_equal(kern_table_size(t), CAP - 100 + 1);
    for (int64_t i = 0; i < nlog; i++) {
        assert_true(last[log[i].key] <= 5);
        assert_int_equal(log[i].step, 102);
        assert_int_equal(log[i].stamp, 1);
    }
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_int_equal(st.eviction_batches, 1);
    free(keys);
    free(rows);
    free(last);
    kern_table_destroy(t);
}

static void test_lfu_eviction(void **state)
{
    (void)state;
    kern_table_t *t = make_table("lfu", 3, 3, KERN_OPT_ADAGRAD, KERN_EVICT_LFU);
    int64_t first[3] = {10, 20, 30};
    int32_t rows[3], r;
    assert_int_equal(kern_table_find_or_insert(t, 3, first, 1, rows), 0);
    int64_t k10 = 10, k30 = 30;
    for (int64_t s = 2; s <= 4; s++)
        assert_int_equal(kern_table_find_or_insert(t, 1, &k10, s, &r), 0);
    assert_int_equal(kern_table_find_or_insert(t, 1, &k30, 5, &r), 0);
    int64_t k40 = 40;
    assert_int_equal(kern_table_find_or_insert(t, 1, &k40, 6, &r), 0);
    int32_t f[4];
    int64_t all[4] = {10, 20, 30, 40};
    kern_table_find(t, 4, all, f);
    assert_int_equal(f[1], -1); /* 20 was used once: least frequent */
    assert_true(f[0] >= 0 && f[2] >= 0 && f[3] >= 0);
    int64_t nlog;
    const kern_evicted_t *log = kern_table_evicted(t, &nlog);
    assert_int_equal(nlog, 1);
    assert_int_equal(log[0].key, 20);
    assert_int_equal(log[0].stamp, 1);
    kern_table_destroy(t);
}

static void test_evict_none_is_full(void **state)
{
    (void)state;
    kern_table_t *t = make_table("slot3", 2, 2, KERN_OPT_SGD, KERN_EVICT_NONE);
    int64_t keys[3] = {1, 2, 3};
    int32_t rows[3];
    assert_int_equal(kern_table_find_or_insert(t, 2, keys, 1, rows), 0);
    assert_int_equal(kern_table_find_or_insert(t, 2, keys + 1, 2, rows), KILN_EFULL);
    assert_string_equal(kiln_errmsg(), "table 'slot3' is full (capacity 2 rows); raise "
                                       "model.embedding.capacity or set eviction: lru");
    assert_int_equal(kern_table_size(t), 2);
    assert_int_equal(kern_table_find(t, 3, keys, rows), 2);
    assert_int_equal(rows[2], -1);
    /* Bulk load refuses as a whole, too. */
    float vals[4] = {0};
    int64_t nk[2] = {1, 9};
    assert_int_equal(kern_table_insert_rows(t, 2, nk, vals, NULL, NULL, 3), KILN_EFULL);
    assert_non_null(strstr(kiln_errmsg(), "slot3"));
    kern_table_destroy(t);
}

/* A limit below the capacity: find_or_insert keeps at most `limit` rows
 * (lru evicts down to it, none refuses with the note in its message), a
 * load may go past it up to the capacity, and the next insert after such a
 * load evicts back under the limit. */
static void test_limit(void **state)
{
    (void)state;
    for (int ev = KERN_EVICT_NONE; ev <= KERN_EVICT_LFU; ev++) {
        kern_table_config_t cfg = {.name = "slot4", .dim = 2, .capacity = 200, .limit = 100,
                                   .opt = KERN_OPT_ADAGRAD, .init = KERN_INIT_UNIFORM,
                                   .init_scale = 0.05f, .seed = 42, .evict = (kern_evict_t)ev,
                                   .capacity_note = "100 rows on this rank, its share of "
                                                    "capacity 200 over 2 ranks"};
        kern_table_t *t = NULL;
        assert_int_equal(kern_table_create(&cfg, &t), 0);
        kern_table_stats_t st;
        kern_table_stats(t, &st);
        assert_int_equal(st.capacity, 200);
        assert_int_equal(st.limit, 100);
        int64_t keys[10];
        int32_t rows[10];
        int64_t next = 1;
        int rc = 0;
        for (int step = 1; step <= 40 && rc == 0; step++) {
            for (int i = 0; i < 10; i++)
                keys[i] = next++;
            rc = kern_table_find_or_insert(t, 10, keys, step, rows);
            assert_true(kern_table_size(t) <= 100);
        }
        if (ev == KERN_EVICT_NONE) {
            assert_int_equal(rc, KILN_EFULL);
            assert_int_equal(kern_table_size(t), 100);
            assert_string_equal(kiln_errmsg(),
                                "table 'slot4' is full (100 rows on this rank, its share of "
                                "capacity 200 over 2 ranks); raise model.embedding.capacity "
                                "or set eviction: lru");
        } else {
            assert_int_equal(rc, 0);
            assert_true(kern_table_size(t) >= 90);
        }
        /* A load fills past the limit, up to the capacity and no further. */
        int64_t lk[150];
        float lv[300] = {0};
        for (int i = 0; i < 150; i++)
            lk[i] = 100000 + i;
        int64_t before = kern_table_size(t);
        assert_int_equal(kern_table_insert_rows(t, 200 - before, lk, lv, NULL, NULL, 50), 0);
        assert_int_equal(kern_table_size(t), 200);
        assert_int_equal(kern_table_insert_rows(t, 1, lk + 149, lv, NULL, NULL, 50), KILN_EFULL);
        /* Training again: lru/lfu evict back under the limit, none refuses new keys
         * but still finds the loaded ones. */
        keys[0] = 999999;
        rc = kern_table_find_or_insert(t, 1, keys, 51, rows);
        if (ev == KERN_EVICT_NONE) {
            assert_int_equal(rc, KILN_EFULL);
            assert_int_equal(kern_table_find_or_insert(t, 1, lk, 52, rows), 0);
        } else {
            assert_int_equal(rc, 0);
            assert_true(kern_table_size(t) <= 100);
        }
        kern_table_destroy(t);
    }
}

/* Random inserts and deletes against a plain array of present keys. */
static void test_delete_against_reference(void **state)
{
    (void)state;
    enum { U = 300, CAP = 200 };
    kern_table_t *t = make_table("del", 3, CAP, KERN_OPT_SGD, KERN_EVICT_NONE);
    int present[U] = {0}, npresent = 0;
    int64_t ndel_log = 0;
    for (int op = 0; op < 4000; op++) {
        int64_t k = (int64_t)(rnd() % U) * 1000003; /* spread keys */
        int idx = (int)(k / 1000003);
        int32_t r;
        if (rnd() % 3 == 0) {
            int64_t nd = -1;
            assert_int_equal(kern_table_delete(t, 1, &k, op, &nd), 0);
            assert_int_equal(nd, present[idx]);
            ndel_log += nd;
            npresent -= present[idx];
            present[idx] = 0;
        } else if (npresent < CAP || present[idx]) {
            assert_int_equal(kern_table_find_or_insert(t, 1, &k, op, &r), 0);
            assert_int_equal(kern_table_keys(t)[r], k);
            npresent += !present[idx];
            present[idx] = 1;
        }
        if (op % 50 == 0 || op == 3999) {
            for (int u = 0; u < U; u++) {
                int64_t q = (int64_t)u * 1000003;
                int32_t qr;
                kern_table_find(t, 1, &q, &qr);
                assert_int_equal(qr >= 0, present[u]);
                if (qr >= 0)
                    assert_int_equal(kern_table_keys(t)[qr], q);
            }
            assert_int_equal(kern_table_size(t), npresent);
        }
    }
    int64_t nlog;
    kern_table_evicted(t, &nlog);
    assert_int_equal(nlog, ndel_log);
    /* scan lists exactly the live rows, ascending. */
    int32_t *rows = malloc(sizeof(int32_t) * CAP);
    int64_t n;
    assert_int_equal(kern_table_scan(t, rows, CAP, &n), 0);
    assert_int_equal(n, npresent);
    for (int64_t i = 0; i < n; i++) {
        assert_true(i == 0 || rows[i] > rows[i - 1]);
        int64_t key = kern_table_keys(t)[rows[i]];
        assert_int_equal(present[key / 1000003], 1);
    }
    if (npresent > 0)
        assert_int_equal(kern_table_scan(t, rows, npresent - 1, &n), KILN_ERANGE);
    free(rows);
    kern_table_destroy(t);
}

static void test_memory_bound(void **state)
{
    (void)state;
    /* 104858 = just over 0.8 * 2^17: the worst case of power-of-two rounding. */
    struct {
        int dim;
        int64_t cap;
        kern_opt_kind_t opt;
        kern_evict_t ev;
    } cases[] = {
        {16, 104858, KERN_OPT_SGD, KERN_EVICT_LFU},
        {16, 100000, KERN_OPT_SGD, KERN_EVICT_LRU},
        {32, 50000, KERN_OPT_ADAGRAD, KERN_EVICT_NONE},
        {64, 30000, KERN_OPT_ADAM, KERN_EVICT_LRU},
        /* dim 1 (lr), where the raw row is only 20 (sgd), 24 (adagrad) or
         * 32 (adam) bytes: every optimizer under every eviction policy. */
        {1, 100000, KERN_OPT_SGD, KERN_EVICT_NONE},
        {1, 100000, KERN_OPT_SGD, KERN_EVICT_LRU},
        {1, 100000, KERN_OPT_SGD, KERN_EVICT_LFU},
        {1, 100000, KERN_OPT_ADAGRAD, KERN_EVICT_NONE},
        {1, 100000, KERN_OPT_ADAGRAD, KERN_EVICT_LRU},
        {1, 104858, KERN_OPT_ADAGRAD, KERN_EVICT_LFU},
        {1, 100000, KERN_OPT_ADAM, KERN_EVICT_NONE},
        {1, 100000, KERN_OPT_ADAM, KERN_EVICT_LRU},
        {1, 100000, KERN_OPT_ADAM, KERN_EVICT_LFU},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kern_table_t *t = make_table("mem", cases[c].dim, cases[c].cap, cases[c].opt, cases[c].ev);
        int64_t cap = cases[c].cap;
        int64_t *keys = malloc(sizeof(int64_t) * (size_t)cap);
        int32_t *rows = malloc(sizeof(int32_t) * (size_t)cap);
        for (int64_t i = 0; i < cap; i++)
            keys[i] = i * 7919 + 13;
        assert_int_equal(kern_table_find_or_insert(t, cap, keys, 1, rows), 0);
        assert_int_equal(kern_table_size(t), cap);
        size_t raw = kern_table_row_bytes(t);
        size_t expect_raw = 8 + (size_t)cases[c].dim * 4 * (1 + (size_t)cases[c].opt) + 8 +
                            (cases[c].opt == KERN_OPT_ADAM ? 4 : 0);
        assert_int_equal(raw, expect_raw);
        double per_key = (double)kern_table_bytes(t) / (double)cap;
        if (!(per_key <= 1.3 * (double)raw))
            fail_msg("case %zu: %.2f bytes per key > 1.3 x %zu", c, per_key, raw);
        /* Every key is still there (the 3-byte index slots hold them all). */
        int32_t *again = malloc(sizeof(int32_t) * (size_t)cap);
        assert_int_equal(kern_table_find(t, cap, keys, again), cap);
        assert_memory_equal(again, rows, sizeof(int32_t) * (size_t)cap);
        free(again);
        free(keys);
        free(rows);
        kern_table_destroy(t);
    }
}

/* A capacity of 2^24 rows is past what a 3-byte slot addresses, so the
 * index comes in two segments: insert, delete and find there, with keys in
 * both. The arrays are allocated lazily, so only the rows touched cost
 * memory. */
static void test_wide_index(void **state)
{
    (void)state;
    enum { N = 5000 };
    kern_table_t *t = make_table("wide", 1, (int64_t)1 << 24, KERN_OPT_SGD, KERN_EVICT_LFU);
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_int_equal(st.nsegments, 2);
    int64_t keys[N];
    int32_t rows[N], again[N];
    for (int i = 0; i < N; i++)
        keys[i] = (int64_t)i * 104729 - 7;
    assert_int_equal(kern_table_find_or_insert(t, N, keys, 1, rows), 0);
    assert_int_equal(kern_table_size(t), N);
    int upper = 0; /* rows in the second segment, [2^23, 2^24) */
    for (int i = 0; i < N; i++) {
        assert_int_equal(kern_table_keys(t)[rows[i]], keys[i]);
        upper += rows[i] >= (1 << 23);
    }
    assert_true(upper > N / 4 && upper < 3 * N / 4);
    int64_t nd;
    assert_int_equal(kern_table_delete(t, N / 2, keys, 2, &nd), 0);
    assert_int_equal(nd, N / 2);
    assert_int_equal(kern_table_find(t, N, keys, again), N - N / 2);
    for (int i = 0; i < N; i++)
        assert_int_equal(again[i], i < N / 2 ? -1 : rows[i]);
    kern_table_destroy(t);
}

/* A table in 7 segments (2000 rows, at most 300 per segment) under lru
 * eviction pressure, with deletes, against a reference set: the table
 * holds exactly the keys inserted and not since evicted or deleted, each at
 * a distinct row, and never evicts a key used at the current step. Then the
 * same shape with `none` refuses new keys naming the full segment. */
static void test_segments_against_reference(void **state)
{
    (void)state;
    enum { U = 6000, CAP = 2000, B = 64 };
    kern_table_config_t cfg = {.name = "segs", .dim = 2, .capacity = CAP, .opt = KERN_OPT_SGD,
                               .init = KERN_INIT_UNIFORM, .init_scale = 0.05f, .seed = 7,
                               .evict = KERN_EVICT_LRU, .evict_fraction = 0.05f,
                               .segment_rows = 300};
    kern_table_t *t = NULL;
    assert_int_equal(kern_table_create(&cfg, &t), 0);
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_int_equal(st.nsegments, 7);
    static char present[U];
    memset(present, 0, sizeof present);
    int64_t seen_log = 0, keys[B];
    int32_t rows[B], *scan = malloc(sizeof(int32_t) * CAP);
    for (int64_t step = 1; step <= 400; step++) {
        for (int i = 0; i < B; i++)
            keys[i] = (int64_t)(rnd() % U);
        if (step % 5 == 0) {
            int64_t nd;
            assert_int_equal(kern_table_delete(t, B / 4, keys, step, &nd), 0);
            for (int i = 0; i < B / 4; i++)
                present[keys[i]] = 0;
        } else {
            assert_int_equal(kern_table_find_or_insert(t, B, keys, step, rows), 0);
            for (int i = 0; i < B; i++)
                assert_int_equal(kern_table_keys(t)[rows[i]], keys[i]);
        }
        int64_t nlog;
        const kern_evicted_t *log = kern_table_evicted(t, &nlog);
        for (; seen_log < nlog; seen_log++) {
            if (log[seen_log].step == step && step % 5 != 0)
                for (int i = 0; i < B; i++) /* used now: never a victim */
                    assert_int_not_equal(log[seen_log].key, keys[i]);
            present[log[seen_log].key] = 0;
        }
        if (step % 5 != 0)
            for (int i = 0; i < B; i++)
                present[keys[i]] = 1;
        int64_t npresent = 0;
        for (int u = 0; u < U; u++)
            npresent += present[u];
        assert_int_equal(kern_table_size(t), npresent);
    }
    kern_table_stats(t, &st);
    assert_true(st.evictions > 0);
    int64_t n;
    assert_int_equal(kern_table_scan(t, scan, CAP, &n), 0);
    assert_int_equal(n, kern_table_size(t));
    for (int64_t i = 0; i < n; i++) { /* ascending rows, each holding a present key */
        assert_true(i == 0 || scan[i] > scan[i - 1]);
        assert_int_equal(present[kern_table_keys(t)[scan[i]]], 1);
    }
    for (int64_t u = 0; u < U; u++) {
        int32_t r;
        kern_table_find(t, 1, &u, &r);
        assert_int_equal(r >= 0, present[u]);
    }
    free(scan);
    kern_table_destroy(t);

    cfg.evict = KERN_EVICT_NONE;
    assert_int_equal(kern_table_create(&cfg, &t), 0);
    int rc = 0;
    for (int64_t k = 0; k < CAP && rc == 0; k++) {
        int32_t r;
        rc = kern_table_find_or_insert(t, 1, &k, 1, &r);
    }
    assert_int_equal(rc, KILN_EFULL);
    assert_non_null(strstr(kiln_errmsg(), "while the table holds"));
    printf("%s\n", kiln_errmsg());
    assert_non_null(strstr(kiln_errmsg(), "index segment"));
    assert_true(kern_table_size(t) > CAP * 8 / 10 && kern_table_size(t) < CAP);
    kern_table_destroy(t);
}

/* Fills a table with distinct keys in batches of capacity / 1000 until the first
 * eviction, i.e. until one segment is full; the others are then within a
 * hair of it and every index has grown to its final size. Returns the live
 * rows. */
static int64_t fill_table(kern_table_t *t, int64_t cap)
{
    const int64_t B = cap / 1000 > 0 ? cap / 1000 : 1;
    int64_t *keys = malloc(sizeof(int64_t) * (size_t)B);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)B);
    int64_t next = 0, step = 1;
    kern_table_stats_t st = {0};
    while (st.evictions == 0 && kern_table_size(t) < cap) {
        for (int i = 0; i < B; i++)
            keys[i] = 7919 * next++ + 13;
        assert_int_equal(kern_table_find_or_insert(t, B, keys, step++, rows), 0);
        kern_table_stats(t, &st);
    }
    free(keys);
    free(rows);
    return kern_table_size(t);
}

/* The memory bound where it is tightest (dim 1, sgd, lru: a 20-byte raw
 * row) on segmented tables: many small segments, and a real one of 2^24 + 2
 * rows (two segments of 2^23 + 1). The slab is sized for the capacity up
 * front, so bytes / capacity once the indexes are full grown is the cost
 * per key of a full table. */
static void test_memory_bound_segmented(void **state)
{
    (void)state;
    const struct {
        int64_t cap, seg_rows;
    } cases[] = {{100000, 3000}, {((int64_t)1 << 24) + 2, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kern_table_config_t cfg = {.name = "seg", .dim = 1, .capacity = cases[c].cap,
                                   .opt = KERN_OPT_SGD, .init = KERN_INIT_UNIFORM,
                                   .init_scale = 0.05f, .seed = 42, .evict = KERN_EVICT_LRU,
                                   .segment_rows = cases[c].seg_rows};
        kern_table_t *t = NULL;
        assert_int_equal(kern_table_create(&cfg, &t), 0);
        int64_t live = fill_table(t, cases[c].cap);
        kern_table_stats_t st;
        kern_table_stats(t, &st);
        assert_true(st.nsegments > 1);
        assert_true(live >= cases[c].cap * 95 / 100);
        kern_table_evicted_clear(t); /* the removal log is drained by every dump */
        double per_key = (double)kern_table_bytes(t) / (double)cases[c].cap;
        size_t raw = kern_table_row_bytes(t);
        printf("capacity %lld in %d segments, %.2f%% full at the first eviction: %.3f bytes "
               "per row, %.4f x the raw %zu\n",
               (long long)cases[c].cap, st.nsegments, 100.0 * (double)live / (double)cases[c].cap,
               per_key, per_key / (double)raw, raw);
        if (!(per_key <= 1.3 * (double)raw))
            fail_msg("case %zu: %.3f bytes per key > 1.3 x %zu", c, per_key, raw);
        kern_table_destroy(t);
    }
}

static void test_changed_since(void **state)
{
    (void)state;
    enum { CAP = 10000, D = 4 };
    kern_table_t *t = make_table("chg", D, CAP, KERN_OPT_SGD, KERN_EVICT_NONE);
    int64_t *keys = malloc(sizeof(int64_t) * CAP);
    int32_t *rows = malloc(sizeof(int32_t) * CAP), *out = malloc(sizeof(int32_t) * CAP);
    for (int i = 0; i < CAP; i++)
        keys[i] = i;
    assert_int_equal(kern_table_find_or_insert(t, CAP, keys, 1, rows), 0);
    kern_table_set_base(t, 1); /* a full dump at step 1 */
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_int_equal(st.changed_pending, 0);

    kern_slab_t slab;
    kern_table_slab(t, &slab);
    kern_opt_t opt = {.kind = KERN_OPT_SGD, .lr = 0.1f};
    int changed_at[CAP] = {0};
    int32_t urows[40];
    float grads[40 * D];
    for (int i = 0; i < 40 * D; i++)
        grads[i] = 1.0f;
    for (int64_t step = 2; step <= 3; step++) {
        int n = step == 2 ? 37 : 20;
        for (int i = 0; i < n; i++)
            urows[i] = rows[(step == 2 ? 100 : 121) + i * 3]; /* steps overlap on some rows */
        kern_row_grads_t g = {.rows = urows, .grads = grads, .n = n};
        assert_int_equal(kern_cpu_sparse_update(&opt, 1, &slab, &g, step), 0);
        kern_table_mark_changed(t, n, urows);
        for (int i = 0; i < n; i++)
            changed_at[urows[i]] = (int)step;
    }
    for (int64_t since = 1; since <= 3; since++) {
        int64_t n;
        assert_int_equal(kern_table_changed_since(t, since, out, CAP, &n), 0);
        int64_t expect = 0;
        for (int r = 0; r < CAP; r++)
            expect += changed_at[r] > since;
        assert_int_equal(n, expect);
        for (int64_t i = 0; i < n; i++)
            assert_true(changed_at[out[i]] > since);
        kern_table_stats(t, &st);
        assert_true(st.last_visited <= 57); /* the change list, not the 10000 rows */
    }
    /* A deleted row drops out; an older `since` than the base scans it all. */
    int64_t k = kern_table_keys(t)[urows[0]];
    assert_int_equal(kern_table_delete(t, 1, &k, 4, NULL), 0);
    int64_t n1, n0;
    assert_int_equal(kern_table_changed_since(t, 1, out, CAP, &n1), 0);
    assert_int_equal(kern_table_changed_since(t, 0, out, CAP, &n0), 0);
    assert_int_equal(n0, CAP - 1);
    kern_table_stats(t, &st);
    assert_int_equal(st.last_visited, CAP);
    assert_int_equal(kern_table_changed_since(t, 0, out, 10, &n0), KILN_ERANGE);
    /* After a dump at step 3 nothing is pending. */
    kern_table_set_base(t, 3);
    assert_int_equal(kern_table_changed_since(t, 3, out, CAP, &n1), 0);
    assert_int_equal(n1, 0);
    kern_table_stats(t, &st);
    assert_int_equal(st.changed_pending, 0);
    free(keys);
    free(rows);
    free(out);
    kern_table_destroy(t);
}

static void test_insert_rows(void **state)
{
    (void)state;
    kern_table_t *t = make_table("load", 2, 8, KERN_OPT_ADAM, KERN_EVICT_NONE);
    int64_t keys[3] = {5, 6, 5};
    float vals[6] = {1, 2, 3, 4, 5, 6}, st[12];
    uint32_t steps[3] = {7, 8, 9};
    for (int i = 0; i < 12; i++)
        st[i] = (float)i / 10.0f;
    assert_int_equal(kern_table_insert_rows(t, 3, keys, vals, st, steps, 11), 0);
    assert_int_equal(kern_table_size(t), 2);
    int32_t r[2];
    assert_int_equal(kern_table_find(t, 2, keys, r), 2);
    kern_slab_t s;
    kern_table_slab(t, &s);
    /* The later copy of key 5 wins. */
    assert_true(s.values[r[0] * 2] == 5 && s.values[r[0] * 2 + 1] == 6);
    assert_true(s.values[r[1] * 2] == 3 && s.values[r[1] * 2 + 1] == 4);
    assert_memory_equal(s.opt_state + r[0] * 4, st + 8, 4 * sizeof(float));
    assert_int_equal(s.opt_steps[r[0]], 9);
    assert_int_equal(s.stamps[r[1]], 11);
    kern_table_destroy(t);
}

/* ---- fused ops -------------------------------------------------------------------- */

#define NT 3
static const int tdims[NT] = {3, 8, 17};
static const kern_combine_t tcomb[NT] = {KERN_COMBINE_SUM, KERN_COMBINE_MEAN, KERN_COMBINE_MEAN};

typedef struct {
    kern_table_t *tab[NT];
    kern_bags_t bags[NT];
    int64_t *offs[NT];
    int32_t *rows[NT];
    int64_t nbags, stride;
} batch_t;

/* NT tables of 300 rows each; nbags bags of 0..6 rows (bag 0 always empty,
 * bag 1 always holds a repeated row); one spare column at the end. */
static void batch_make(batch_t *B, int64_t nbags, kern_opt_kind_t opt)
{
    int64_t col = 0;
    B->nbags = nbags;
    for (int t = 0; t < NT; t++) {
        B->tab[t] = make_table("op", tdims[t], 300, opt, KERN_EVICT_NONE);
        int64_t keys[300];
        int32_t r[300];
        for (int i = 0; i < 300; i++)
            keys[i] = 1000 * t + i;
        assert_int_equal(kern_table_find_or_insert(B->tab[t], 300, keys, 0, r), 0);
        B->offs[t] = malloc(sizeof(int64_t) * (size_t)(nbags + 1));
        B->rows[t] = malloc(sizeof(int32_t) * (size_t)nbags * 6 + 4);
        B->offs[t][0] = 0;
        for (int64_t b = 0; b < nbags; b++) {
            int len = b == 0 ? 0 : b == 1 ? 3 : (int)(rnd() % 7);
            for (int k = 0; k < len; k++)
                B->rows[t][B->offs[t][b] + k] = b == 1 ? 17 : (int32_t)(rnd() % 300);
            B->offs[t][b + 1] = B->offs[t][b] + len;
        }
        kern_slab_t s;
        kern_table_slab(B->tab[t], &s);
        B->bags[t] = (kern_bags_t){.values = s.values, .capacity = 300, .dim = tdims[t],
                                   .combine = tcomb[t], .offsets = B->offs[t],
                                   .rows = B->rows[t], .out_col = col};
        col += tdims[t];
    }
    B->stride = col + 1;
}

static void batch_free(batch_t *B)
{
    for (int t = 0; t < NT; t++) {
        kern_table_destroy(B->tab[t]);
        free(B->offs[t]);
        free(B->rows[t]);
    }
}

static void ref_gather(const batch_t *B, float *out)
{
    for (int64_t b = 0; b < B->nbags; b++)
        for (int t = 0; t < NT; t++) {
            const kern_bags_t *g = &B->bags[t];
            int64_t len = g->offsets[b + 1] - g->offsets[b];
            for (int j = 0; j < g->dim; j++) {
                double acc = 0;
                for (int64_t p = g->offsets[b]; p < g->offsets[b + 1]; p++)
                    acc += g->values[g->rows[p] * g->dim + j];
                if (g->combine == KERN_COMBINE_MEAN && len > 0)
                    acc /= (double)len;
                out[b * B->stride + g->out_col + j] = (float)acc;
            }
        }
}

static void test_gather_combine(void **state)
{
    (void)state;
    batch_t B;
    batch_make(&B, 101, KERN_OPT_SGD);
    size_t n = (size_t)(B.nbags * B.stride);
    float *out = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        out[i] = ref[i] = -7.0f; /* the spare column must stay -7 */
    assert_int_equal(kern_cpu_gather_combine(NT, B.bags, B.nbags, B.stride, out), 0);
    ref_gather(&B, ref);
    assert_close(out, ref, n, 1e-6f, 1e-5f);
    for (int64_t b = 0; b < B.nbags; b++)
        assert_true(out[b * B.stride + B.stride - 1] == -7.0f);
    for (int j = 0; j < B.stride - 1; j++)
        assert_true(out[j] == 0.0f); /* bag 0 is empty in every table */
    /* Bag 1 of a mean table holds row 17 three times: its mean is the row. */
    assert_close(out + B.stride + B.bags[1].out_col, B.bags[1].values + 17 * 8, 8, 1e-7f, 1e-6f);
    /* A table whose bags are all empty in this batch (a column empty in
     * every row) reads no rows, so it needs no slab: its columns are zeros
     * and its backward reduce has no rows. */
    kern_bags_t saved = B.bags[2];
    int64_t *none = calloc((size_t)B.nbags + 1, sizeof(int64_t));
    B.bags[2].values = NULL;
    B.bags[2].rows = NULL;
    B.bags[2].offsets = none;
    assert_int_equal(kern_cpu_gather_combine(NT, B.bags, B.nbags, B.stride, out), 0);
    for (int64_t b = 0; b < B.nbags; b++)
        for (int j = 0; j < B.bags[2].dim; j++)
            assert_true(out[b * B.stride + B.bags[2].out_col + j] == 0.0f);
    kern_row_grads_t eg = {0};
    assert_int_equal(kern_cpu_backward_reduce(1, &B.bags[2], B.nbags, B.stride, out, &eg), 0);
    assert_int_equal(eg.n, 0);
    /* ... but positions without a slab are refused. */
    none[B.nbags] = 1;
    assert_int_equal(kern_cpu_gather_combine(NT, B.bags, B.nbags, B.stride, out), KILN_EINVAL);
    B.bags[2] = saved;
    free(none);
    /* A row id outside the slab is refused. */
    B.rows[2][B.offs[2][1]] = 300;
    assert_int_equal(kern_cpu_gather_combine(NT, B.bags, B.nbags, B.stride, out), KILN_EINVAL);
    B.bags[2].out_col = B.stride;
    assert_int_equal(kern_cpu_gather_combine(NT, B.bags, B.nbags, B.stride, out), KILN_EINVAL);
    free(out);
    free(ref);
    batch_free(&B);
}

/* The gather's exact float semantics, bit for bit, on the widths it has
 * special paths for (16) and others (1, 5): a one-row bag is a copy of the
 * row (so -0.0 stays -0.0), a longer bag sums its rows in order starting
 * from +0.0, and a mean bag is that sum times 1/len. Slabs hold -0.0 and
 * values of mixed magnitude so that any other order or a fused a*b+c would
 * show. 300 bags: several blocks of the parallel loop and a partial one. */
static void test_gather_bitwise(void **state)
{
    (void)state;
    enum { GT = 4, GCAP = 200, GBAGS = 300 };
    const int dims[GT] = {16, 16, 1, 5};
    const kern_combine_t comb[GT] = {KERN_COMBINE_SUM, KERN_COMBINE_MEAN, KERN_COMBINE_SUM,
                                     KERN_COMBINE_MEAN};
    float *vals[GT];
    int64_t *offs[GT];
    int32_t *rws[GT];
    kern_bags_t bags[GT];
    int64_t col = 0;
    for (int t = 0; t < GT; t++) {
        vals[t] = malloc(sizeof(float) * GCAP * (size_t)dims[t]);
        for (int i = 0; i < GCAP * dims[t]; i++)
            vals[t][i] = i % 11 == 0 ? -0.0f : (float)((int)(rnd() % 2001) - 1000) *
                                                   (i % 3 ? 1e-3f : 7.3f);
        offs[t] = malloc(sizeof(int64_t) * (GBAGS + 1));
        rws[t] = malloc(sizeof(int32_t) * GBAGS * 6 + 4);
        offs[t][0] = 0;
        for (int b = 0; b < GBAGS; b++) {
            int len = (int)(rnd() % 7);
            for (int k = 0; k < len; k++)
                rws[t][offs[t][b] + k] = (int32_t)(rnd() % GCAP);
            offs[t][b + 1] = offs[t][b] + len;
        }
        bags[t] = (kern_bags_t){.values = vals[t], .capacity = GCAP, .dim = dims[t],
                                .combine = comb[t], .offsets = offs[t], .rows = rws[t],
                                .out_col = col};
        col += dims[t];
    }
    const int64_t stride = col;
    float *out = malloc(sizeof(float) * GBAGS * (size_t)stride);
    float *ref = malloc(sizeof(float) * GBAGS * (size_t)stride);
    for (int b = 0; b < GBAGS; b++)
        for (int t = 0; t < GT; t++) {
            float *o = ref + b * stride + bags[t].out_col;
            int64_t s0 = offs[t][b], e0 = offs[t][b + 1];
            for (int j = 0; j < dims[t]; j++) {
                float acc;
                if (e0 - s0 == 1) {
                    acc = vals[t][rws[t][s0] * dims[t] + j];
                } else {
                    acc = 0.0f;
                    for (int64_t p = s0; p < e0; p++)
                        acc += vals[t][rws[t][p] * dims[t] + j];
                    if (comb[t] == KERN_COMBINE_MEAN && e0 > s0)
                        acc *= 1.0f / (float)(e0 - s0);
                }
                o[j] = acc;
            }
        }
    const int saved = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads += 2) {
        omp_set_num_threads(threads);
        memset(out, 0x5a, sizeof(float) * GBAGS * (size_t)stride);
        assert_int_equal(kern_cpu_gather_combine(GT, bags, GBAGS, stride, out), 0);
        assert_memory_equal(out, ref, sizeof(float) * GBAGS * (size_t)stride);
    }
    omp_set_num_threads(saved);
    for (int t = 0; t < GT; t++) {
        free(vals[t]);
        free(offs[t]);
        free(rws[t]);
    }
    free(out);
    free(ref);
}

static void alloc_grads(const batch_t *B, kern_row_grads_t *g)
{
    for (int t = 0; t < NT; t++) {
        size_t nnz = (size_t)B->offs[t][B->nbags] + 1;
        g[t] = (kern_row_grads_t){.rows = malloc(sizeof(int32_t) * nnz),
                                  .grads = malloc(sizeof(float) * nnz * (size_t)tdims[t])};
    }
}

static void free_grads(kern_row_grads_t *g)
{
    for (int t = 0; t < NT; t++) {
        free(g[t].rows);
        free(g[t].grads);
    }
}

static void test_backward_reduce(void **state)
{
    (void)state;
    batch_t B;
    batch_make(&B, 203, KERN_OPT_SGD);
    float *gout = malloc(sizeof(float) * (size_t)(B.nbags * B.stride));
    for (int64_t i = 0; i < B.nbags * B.stride; i++)
        gout[i] = rndf();
    kern_row_grads_t g[NT];
    alloc_grads(&B, g);
    assert_int_equal(kern_cpu_backward_reduce(NT, B.bags, B.nbags, B.stride, gout, g), 0);
    for (int t = 0; t < NT; t++) {
        const kern_bags_t *bg = &B.bags[t];
        int d = bg->dim;
        /* Reference: a dense (300, d) accumulator and an occurrence count. */
        double *acc = calloc(300 * (size_t)d, sizeof(double));
        int seen[300] = {0}, nseen = 0;
        for (int64_t b = 0; b < B.nbags; b++) {
            int64_t len = bg->offsets[b + 1] - bg->offsets[b];
            for (int64_t p = bg->offsets[b]; p < bg->offsets[b + 1]; p++) {
                int r = bg->rows[p];
                nseen += !seen[r];
                seen[r] = 1;
                for (int j = 0; j < d; j++) {
                    double x = gout[b * B.stride + bg->out_col + j];
                    acc[r * d + j] += bg->combine == KERN_COMBINE_MEAN ? x / (double)len : x;
                }
            }
        }
        assert_int_equal(g[t].n, nseen);
        for (int64_t u = 0; u < g[t].n; u++) {
            int r = g[t].rows[u];
            assert_true(u == 0 || r > g[t].rows[u - 1]);
            assert_true(seen[r]);
            float ref[32];
            for (int j = 0; j < d; j++)
                ref[j] = (float)acc[r * d + j];
            assert_close(g[t].grads + u * d, ref, (size_t)d, 1e-5f, 1e-4f);
        }
        free(acc);
    }
    free_grads(g);
    free(gout);
    batch_free(&B);
}

/* Plain reference of one optimizer step on one element (double math). */
static void ref_opt(const kern_opt_t *o, float *w, float *s0, float *s1, float g, int t)
{
    if (o->kind == KERN_OPT_SGD) {
        *w = (float)(*w - (double)o->lr * g);
    } else if (o->kind == KERN_OPT_ADAGRAD) {
        *s0 = (float)(*s0 + (double)g * g);
        *w = (float)(*w - (double)o->lr * g / (sqrt(*s0) + o->eps));
    } else {
        *s0 = (float)(o->beta1 * (double)*s0 + (1 - (double)o->beta1) * g);
        *s1 = (float)(o->beta2 * (double)*s1 + (1 - (double)o->beta2) * g * g);
        double mh = *s0 / (1 - pow(o->beta1, t)), vh = *s1 / (1 - pow(o->beta2, t));
        *w = (float)(*w - o->lr * mh / (sqrt(vh) + o->eps));
    }
}

/* acc0: the table's opt_init (train.sparse.initial_accumulator), where
 * adagrad's accumulator starts; sgd has no state and adam's starts at 0. */
static void optimizer_case(kern_opt_kind_t kind, float acc0)
{
    enum { CAP = 64, D = 5, N = 10 };
    kern_table_config_t cfg = {.name = "opt", .dim = D, .capacity = CAP + 1, .opt = kind,
                               .opt_init = acc0, .init = KERN_INIT_UNIFORM, .init_scale = 0.05f,
                               .seed = 42, .evict = KERN_EVICT_NONE};
    kern_table_t *t = NULL;
    assert_int_equal(kern_table_create(&cfg, &t), 0);
    int64_t keys[CAP];
    int32_t rows[CAP];
    for (int i = 0; i < CAP; i++)
        keys[i] = i;
    assert_int_equal(kern_table_find_or_insert(t, CAP, keys, 0, rows), 0);
    kern_slab_t s;
    kern_table_slab(t, &s);
    float w[CAP * D], s0[CAP * D] = {0}, s1[CAP * D] = {0};
    int cnt[CAP] = {0};
    memcpy(w, s.values, sizeof w);
    if (kind == KERN_OPT_ADAGRAD)
        for (int i = 0; i < CAP * D; i++)
            s0[i] = acc0;
    if (kind != KERN_OPT_SGD) /* a new row's state, before any update */
        for (int r = 0; r < CAP; r++)
            assert_close(s.opt_state + r * kern_opt_nstate(kind) * D, s0 + r * D, D, 0.0f, 0.0f);
    kern_opt_t opt = {.kind = kind, .lr = 0.05f, .eps = 1e-6f, .beta1 = 0.9f, .beta2 = 0.99f};
    int32_t urows[N];
    float grads[N * D];
    for (int64_t step = 1; step <= 4; step++) {
        /* Each step touches N distinct rows out of CAP: i*7+step spreads them. */
        for (int i = 0; i < N; i++)
            urows[i] = rows[(i * 7 + (int)step * (int)step) % CAP];
        for (int i = 0; i < N * D; i++)
            grads[i] = rndf();
        kern_row_grads_t g = {.rows = urows, .grads = grads, .n = N};
        assert_int_equal(kern_cpu_sparse_update(&opt, 1, &s, &g, step), 0);
        for (int i = 0; i < N; i++) {
            int r = urows[i];
            cnt[r]++;
            for (int j = 0; j < D; j++)
                ref_opt(&opt, &w[r * D + j], &s0[r * D + j], &s1[r * D + j], grads[i * D + j],
                        cnt[r]);
            assert_int_equal(s.stamps[r], step);
        }
        assert_close(s.values, w, CAP * D, 1e-6f, 1e-5f);
        if (kind == KERN_OPT_ADAGRAD)
            for (int r = 0; r < CAP; r++)
                assert_close(s.opt_state + r * D, s0 + r * D, D, 1e-6f, 1e-5f);
        if (kind == KERN_OPT_ADAM)
            for (int r = 0; r < CAP; r++) {
                assert_close(s.opt_state + r * 2 * D, s0 + r * D, D, 1e-6f, 1e-5f);
                assert_close(s.opt_state + r * 2 * D + D, s1 + r * D, D, 1e-6f, 1e-5f);
                assert_int_equal(s.opt_steps[r], cnt[r]);
            }
    }
    for (int r = 0; r < CAP; r++)
        if (cnt[r] == 0)
            assert_int_equal(s.stamps[r], 0); /* untouched rows keep their insert stamp */
    /* The wrong optimizer for the table's state is refused. */
    kern_opt_t other = opt;
    other.kind = kind == KERN_OPT_ADAM ? KERN_OPT_SGD : KERN_OPT_ADAM;
    kern_row_grads_t g = {.rows = urows, .grads = grads, .n = N};
    assert_int_equal(kern_cpu_sparse_update(&other, 1, &s, &g, 9), KILN_EINVAL);
    /* A row loaded without optimizer state (a warm start from a checkpoint
     * that has none) starts as a new row does. */
    int64_t k = 1000;
    float v[D] = {0};
    assert_int_equal(kern_table_insert_rows(t, 1, &k, v, NULL, NULL, 9), 0);
    int32_t kr;
    assert_int_equal(kern_table_find_or_insert(t, 1, &k, 9, &kr), 0);
    kern_table_slab(t, &s);
    if (kind != KERN_OPT_SGD)
        for (int j = 0; j < kern_opt_nstate(kind) * D; j++)
            assert_true(s.opt_state[(size_t)kr * kern_opt_nstate(kind) * D + j] ==
                        (kind == KERN_OPT_ADAGRAD ? acc0 : 0.0f));
    kern_table_destroy(t);
    /* A negative or non-finite initial accumulator is refused. */
    cfg.opt_init = -1.0f;
    assert_int_equal(kern_table_create(&cfg, &t), KILN_EINVAL);
    cfg.opt_init = INFINITY;
    assert_int_equal(kern_table_create(&cfg, &t), KILN_EINVAL);
}

static void test_sgd(void **state) { (void)state; optimizer_case(KERN_OPT_SGD, 0.0f); }
static void test_adagrad(void **state) { (void)state; optimizer_case(KERN_OPT_ADAGRAD, 0.0f); }
/* train.sparse.initial_accumulator: adagrad's accumulator starts there. */
static void test_adagrad_initial_accumulator(void **state)
{
    (void)state;
    optimizer_case(KERN_OPT_ADAGRAD, 0.1f);
}
static void test_adam(void **state) { (void)state; optimizer_case(KERN_OPT_ADAM, 0.1f); }

/* One forward + backward + adam step, returning copies of out and values. */
static void run_step(int threads, float **out, float **vals)
{
    rng = 99; /* the same batch for every thread count */
    batch_t B;
    batch_make(&B, 3001, KERN_OPT_ADAM);
    omp_set_num_threads(threads);
    size_t n = (size_t)(B.nbags * B.stride);
    *out = calloc(n, sizeof(float));
    assert_int_equal(kern_cpu_gather_combine(NT, B.bags, B.nbags, B.stride, *out), 0);
    kern_row_grads_t g[NT];
    alloc_grads(&B, g);
    assert_int_equal(kern_cpu_backward_reduce(NT, B.bags, B.nbags, B.stride, *out, g), 0);
    kern_slab_t s[NT];
    size_t total = 0;
    for (int t = 0; t < NT; t++) {
        kern_table_slab(B.tab[t], &s[t]);
        total += 300 * (size_t)tdims[t];
    }
    kern_opt_t opt = {.kind = KERN_OPT_ADAM, .lr = 0.01f, .eps = 1e-8f, .beta1 = 0.9f,
                      .beta2 = 0.999f};
    assert_int_equal(kern_cpu_sparse_update(&opt, NT, s, g, 1), 0);
    *vals = malloc(sizeof(float) * total);
    size_t at = 0;
    for (int t = 0; t < NT; t++) {
        memcpy(*vals + at, s[t].values, sizeof(float) * 300 * (size_t)tdims[t]);
        at += 300 * (size_t)tdims[t];
    }
    free_grads(g);
    batch_free(&B);
}

static void test_openmp_matches_one_thread(void **state)
{
    (void)state;
    float *o1, *v1, *o4, *v4;
    int saved = omp_get_max_threads();
    run_step(1, &o1, &v1);
    run_step(4, &o4, &v4);
    omp_set_num_threads(saved);
    size_t n = (size_t)3001 * (3 + 8 + 17 + 1);
    assert_memory_equal(o1, o4, n * sizeof(float));
    assert_memory_equal(v1, v4, 300 * (3 + 8 + 17) * sizeof(float));
    free(o1);
    free(v1);
    free(o4);
    free(v4);
}

PROC_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_init_is_seeded_and_order_free),
    cmocka_unit_test(test_zero_init_and_bad_config),
    cmocka_unit_test(test_lru_eviction),
    cmocka_unit_test(test_lru_batch_eviction),
    cmocka_unit_test(test_lfu_eviction),
    cmocka_unit_test(test_evict_none_is_full),
    cmocka_unit_test(test_limit),
    cmocka_unit_test(test_delete_against_reference),
    cmocka_unit_test(test_memory_bound),
    cmocka_unit_test(test_wide_index),
    cmocka_unit_test(test_segments_against_reference),
    cmocka_unit_test(test_memory_bound_segmented),
    cmocka_unit_test(test_changed_since),
    cmocka_unit_test(test_insert_rows),
    cmocka_unit_test(test_gather_combine),
    cmocka_unit_test(test_gather_bitwise),
    cmocka_unit_test(test_backward_reduce),
    cmocka_unit_test(test_sgd),
    cmocka_unit_test(test_adagrad),
    cmocka_unit_test(test_adagrad_initial_accumulator),
    cmocka_unit_test(test_adam),
    cmocka_unit_test(test_openmp_matches_one_thread))
