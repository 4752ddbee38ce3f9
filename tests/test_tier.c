/*
 * tests/test_tier.c - kernels/: tables larger than their RAM (the disk tier
 * of kern_tier.c behind kern_table.c), admission and expiry. The reference
 * is the same table with every row in RAM: under the same lookups and
 * updates both must hold the same rows bit for bit, and export the same
 * changed rows, through io_uring (when built in) and through pread, with
 * the next step's keys prefetched; the tier's own paths (the whole table's
 * limit kept on disk, loads, deletes, expiry) are driven directly. A full
 * spill disk is driven in tests/test_train.c (a real tmpfs).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern.h"
#include "kern_tier.h"
#include "kiln.h"
#include "proc.h"

static uint64_t rng = 0x7177;
static uint64_t rnd(void) { return proc_xorshift(&rng); }

static char dir[256];
static kern_tier_io_t io = KERN_TIER_IO_AUTO; /* how make's tables move pages */
static int64_t seg_rows; /* make's tables' index segments (0: as few as fit) */

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-tier-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return rmdir(dir);
}

static kern_table_t *make(const char *name, int dim, int64_t cap, int64_t ram, kern_opt_kind_t opt,
                          kern_evict_t ev, int64_t admit)
{
    char path[320];
    snprintf(path, sizeof path, "%s/%s.tier", dir, name);
    kern_table_config_t cfg = {.name = name, .dim = dim, .capacity = cap, .opt = opt,
                               .opt_init = 0.1f, .init = KERN_INIT_UNIFORM, .init_scale = 0.05f,
                               .seed = 42, .evict = ev, .ram_rows = ram, .spill_path = path,
                               .admit_min = admit, .admit_width = 4096, .spill_io = io,
                               .segment_rows = seg_rows,
                               .spill_prefetch_always = true};
    kern_table_t *t = NULL;
    assert_int_equal(kern_table_create(&cfg, &t), 0);
    assert_int_equal(kern_table_tiered(t), ram > 0 && ram < cap);
    return t;
}

/* Zipf-ish keys over [0, range): a few hot, many cold. */
static int64_t skewed_key(int64_t range)
{
    uint64_t x = rnd();
    int64_t k = (int64_t)((double)range * (double)(x >> 11) / 9007199254740992.0 *
                          (double)((x & 1023) + 1) / 1024.0);
    return k * 7919 + 3;
}

/* One step on t: find_or_insert keys, then an adagrad update of the unique
 * rows with a gradient that depends on (key, step) only. */
static void step_on(kern_table_t *t, int64_t n, const int64_t *keys, int64_t step)
{
    int32_t *rows = malloc(sizeof *rows * (size_t)n);
    assert_int_equal(kern_table_find_or_insert(t, n, keys, step, rows), 0);
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    /* unique rows, in key order, so both tables see the same update order */
    int32_t *u = malloc(sizeof *u * (size_t)n);
    float *g = malloc(sizeof *g * (size_t)n * (size_t)sl.dim);
    int64_t nu = 0;
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] < 0)
            continue;
        int dup = 0;
        for (int64_t j = 0; j < nu && !dup; j++)
            dup = u[j] == rows[i];
        if (dup)
            continue;
        for (int d = 0; d < sl.dim; d++)
            g[nu * sl.dim + d] = (float)((keys[i] * 31 + step * 7 + d) % 17 - 8) / 64.0f;
        u[nu++] = rows[i];
    }
    kern_row_grads_t rg = {.rows = u, .grads = g, .n = nu};
    kern_opt_t opt = {.kind = KERN_OPT_ADAGRAD, .lr = 0.1f, .eps = 1e-8f};
    assert_int_equal(kern_cpu_sparse_update(&opt, 1, &sl, &rg, step), 0);
    kern_table_mark_changed(t, nu, u);
    free(rows);
    free(u);
    free(g);
}

/* Every key of ref has the same row (values, state) in t, and t holds no
 * other key. */
static void assert_same_rows(kern_table_t *ref, kern_table_t *t, int64_t step)
{
    assert_int_equal(kern_table_size(ref), kern_table_size(t));
    int64_t n = kern_table_size(ref), got = 0;
    int32_t *rr = malloc(sizeof *rr * (size_t)(n + 1));
    int32_t *tr = malloc(sizeof *tr * (size_t)(n + 1));
    int64_t *keys = malloc(sizeof *keys * (size_t)(n + 1));
    assert_int_equal(kern_table_scan(ref, rr, n + 1, &got), 0);
    assert_int_equal(got, n);
    for (int64_t i = 0; i < n; i++)
        keys[i] = kern_table_keys(ref)[rr[i]];
    kern_slab_t a, b;
    kern_table_slab(ref, &a);
    kern_table_slab(t, &b);
    /* in chunks that fit t's RAM, a step each (rows used at a step stay) */
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0)
            assert_int_equal(kern_table_fetch(t, n - i < 32 ? n - i : 32, keys + i, step + i, tr + i),
                             0);
        assert_true(tr[i] >= 0);
        assert_memory_equal(a.values + (size_t)rr[i] * a.dim, b.values + (size_t)tr[i] * b.dim,
                            sizeof(float) * (size_t)a.dim);
        assert_memory_equal(a.opt_state + (size_t)rr[i] * a.dim,
                            b.opt_state + (size_t)tr[i] * b.dim, sizeof(float) * (size_t)a.dim);
    }
    free(rr);
    free(tr);
    free(keys);
}

/* The rows a dump since `since` would hold: RAM's changed rows plus the
 * disk's, as a sorted key list. */
static int collect(void *ctx, int64_t n, const int64_t *keys, const float *values,
                   const float *opt, const uint32_t *steps)
{
    (void)values;
    (void)opt;
    (void)steps;
    int64_t **out = ctx;
    for (int64_t i = 0; i < n; i++)
        *(*out)++ = keys[i];
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t changed_keys(kern_table_t *t, int64_t since, int64_t *out)
{
    int64_t cap = kern_table_size(t) + 1, n = 0, nd = 0;
    int32_t *rows = malloc(sizeof *rows * (size_t)cap);
    assert_int_equal(kern_table_changed_since(t, since, rows, cap, &n), 0);
    for (int64_t i = 0; i < n; i++)
        out[i] = kern_table_keys(t)[rows[i]];
    int64_t *at = out + n;
    assert_int_equal(kern_table_disk_count(t, since, &nd), 0);
    assert_int_equal(kern_table_disk_each(t, since, collect, &at), 0);
    assert_int_equal(at - out, n + nd);
    qsort(out, (size_t)(n + nd), sizeof *out, cmp_key);
    free(rows);
    return n + nd;
}

/* A table with a tenth of its rows in RAM trains like the all-in-RAM one,
 * and a dump since a base holds the same keys; with `prefetch`, every
 * step's keys are prefetched a step ahead, which changes nothing. */
static void tier_matches_ram(int prefetch)
{
    const int64_t cap = 6000, range = 4000, B = 300;
    kern_table_t *ref = make("ref", 8, cap, 0, KERN_OPT_ADAGRAD, KERN_EVICT_LRU, 0);
    kern_table_t *t = make("tiered", 8, cap, cap / 10, KERN_OPT_ADAGRAD, KERN_EVICT_LRU, 0);
    int64_t keys[2][300];
    for (int64_t i = 0; i < B; i++)
        keys[0][i] = skewed_key(range);
    for (int64_t step = 1; step <= 60; step++) {
        int64_t *now = keys[(step - 1) % 2], *next = keys[step % 2];
        for (int64_t i = 0; i < B; i++)
            next[i] = skewed_key(range);
        if (prefetch)
            assert_int_equal(kern_table_prefetch(t, B, next), 0);
        step_on(ref, B, now, step);
        step_on(t, B, now, step);
        if (step == 30) {
            kern_table_set_base(ref, 30);
            kern_table_set_base(t, 30);
        }
    }
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_true(st.disk_size > st.ram_size); /* most rows live on disk */
    assert_true(st.demoted > 0 && st.disk_hits > 0 && st.disk_writes > 0);
    /* AUTO reads with io_uring (pread where the kernel gives no ring),
     * never through a mapping; a kind asked for is the one used. */
    if (io == KERN_TIER_IO_AUTO)
        assert_true(st.disk_io == KERN_TIER_IO_URING || st.disk_io == KERN_TIER_IO_PREAD);
    else
        assert_int_equal(st.disk_io, io);
    assert_true(prefetch ? st.prefetched > 0 : st.prefetched == 0);
    assert_true(st.ram_size <= cap / 10);
    int64_t *a = malloc(sizeof *a * (size_t)(cap + 1)), *b = malloc(sizeof *b * (size_t)(cap + 1));
    int64_t na = changed_keys(ref, 30, a), nb = changed_keys(t, 30, b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof *a * (size_t)na);
    assert_int_equal(changed_keys(ref, -1, a), changed_keys(t, -1, b));
    assert_same_rows(ref, t, 61);
    free(a);
    free(b);
    kern_table_destroy(ref);
    kern_table_destroy(t);
}

static void test_tier_matches_ram(void **state)
{
    (void)state;
    tier_matches_ram(0);
}

/* The same through pread/pwrite (what a kernel without io_uring gets), and
 * with the next step's keys prefetched; the RAM in index segments of 256
 * rows (each with its own heat lists). */
static void test_tier_pread_prefetch(void **state)
{
    (void)state;
    io = KERN_TIER_IO_PREAD;
    seg_rows = 256;
    tier_matches_ram(1);
    seg_rows = 0;
    io = KERN_TIER_IO_AUTO;
}

/* The same with the tier's reads through a mapping of its file (MMAP,
 * model.embedding.spill_io: mmap); AUTO, above, reads with io_uring where
 * the kernel gives a ring. */
static void test_tier_mmap(void **state)
{
    (void)state;
    io = KERN_TIER_IO_MMAP;
    tier_matches_ram(0);
    io = KERN_TIER_IO_AUTO;
}

/* Bulk loads fill RAM and then disk; deletes and expiry reach both tiers
 * and are logged as removals. */
/* RAM keeps the keys looked up often: 300 hot keys every third step among
 * 700 new keys a step, in 1000 rows of RAM. lru would push the hot keys out
 * between their uses (2100 newer keys) and read them back each time; the
 * heat sketch keeps them, so few of their lookups go to disk. */
static void test_tier_keeps_hot_rows(void **state)
{
    (void)state;
    kern_table_t *t = make("hot", 4, 40000, 1000, KERN_OPT_ADAGRAD, KERN_EVICT_LRU, 0);
    int64_t keys[1000], next_cold = 1000000, disk0 = 0, hot_lookups = 0;
    for (int64_t step = 1; step <= 60; step++) {
        int64_t n = 0;
        if (step % 3 == 0)
            for (int64_t h = 0; h < 300; h++)
                keys[n++] = h * 7919 + 11;
        for (int64_t c = 0; c < 700; c++)
            keys[n++] = next_cold++;
        if (step == 30) {
            kern_table_stats_t st;
            kern_table_stats(t, &st);
            disk0 = st.disk_hits;
        }
        hot_lookups += step > 30 && step % 3 == 0 ? 300 : 0;
        step_on(t, n, keys, step);
    }
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    /* cold keys are new each step: every disk hit is a hot key read back */
    assert_true(st.disk_hits - disk0 < hot_lookups / 4);
    kern_table_destroy(t);
}

static void test_tier_load_delete_expire(void **state)
{
    (void)state;
    const int64_t n = 2000;
    kern_table_t *ref = make("lref", 4, 4000, 0, KERN_OPT_ADAGRAD, KERN_EVICT_NONE, 0);
    kern_table_t *t = make("load", 4, 4000, 100, KERN_OPT_ADAGRAD, KERN_EVICT_NONE, 0);
    int64_t *keys = malloc(sizeof *keys * (size_t)n);
    float *vals = malloc(sizeof *vals * (size_t)n * 4), *opt = malloc(sizeof *opt * (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        keys[i] = i * 13 + 1;
        for (int d = 0; d < 4; d++) {
            vals[i * 4 + d] = (float)(i + d);
            opt[i * 4 + d] = (float)d;
        }
    }
    /* two halves at steps 5 and 9; the second overwrites half the first */
    assert_int_equal(kern_table_insert_rows(ref, n / 2, keys, vals, opt, NULL, 5), 0);
    assert_int_equal(kern_table_insert_rows(t, n / 2, keys, vals, opt, NULL, 5), 0);
    assert_int_equal(kern_table_insert_rows(ref, n / 2, keys + n / 4, vals, opt, NULL, 9), 0);
    assert_int_equal(kern_table_insert_rows(t, n / 2, keys + n / 4, vals, opt, NULL, 9), 0);
    assert_int_equal(kern_table_size(t), 3 * n / 4);
    assert_same_rows(ref, t, 10);
    kern_table_evicted_clear(t);
    int64_t del[3] = {keys[0], keys[n / 2], 999999}, nd = 0;
    assert_int_equal(kern_table_delete(t, 3, del, 11, &nd), 0);
    assert_int_equal(kern_table_delete(ref, 3, del, 11, NULL), 0);
    assert_int_equal(nd, 2);
    int64_t nev = 0;
    kern_table_evicted(t, &nev);
    assert_int_equal(nev, 2);
    /* rows last changed at step 5 (a quarter, less one deleted) expire */
    int64_t nx = 0, nxr = 0;
    assert_int_equal(kern_table_expire(t, 6, 12, &nx), 0);
    assert_int_equal(kern_table_expire(ref, 6, 12, &nxr), 0);
    assert_int_equal(nx, n / 4 - 1);
    assert_int_equal(nx, nxr);
    assert_same_rows(ref, t, 13);
    free(keys);
    free(vals);
    free(opt);
    kern_table_destroy(ref);
    kern_table_destroy(t);
}

/* Puts bigger than a batch of pages and than both of the writer thread's
 * queues (2 MiB each) back to back, without a read between (the later ones
 * wait for the writer to free a queue), then a take of every key: each
 * record comes back as put, whatever the writer's order of work. The
 * writer takes a slow tier's writes only, so the tier is told it is slow;
 * then the same puts written by the calls themselves (a fast tier). */
static void put_queues(bool slow)
{
    char path[320];
    snprintf(path, sizeof path, "%s/queues.tier", dir);
    const int64_t n = 30000, rounds = 4; /* 4 x 2.6 MB of records of 88 bytes */
    kern_tier_t *c = NULL;
    assert_int_equal(kern_tier_open(path, "queues", n * rounds, 16, KERN_TIER_IO_AUTO, &c), 0);
    kern_tier_prefetch_always(c, slow);
    size_t rb = kern_tier_rec_bytes(c);
    uint8_t *recs = calloc((size_t)(n * rounds), rb), *back = calloc((size_t)(n * rounds), rb);
    int64_t *keys = malloc(sizeof *keys * (size_t)(n * rounds));
    uint8_t *found = malloc((size_t)(n * rounds));
    for (int64_t i = 0; i < n * rounds; i++) {
        kern_rec_t h = {.key = (int64_t)rnd(), .stamp = i, .use = (uint32_t)i};
        keys[i] = h.key;
        memcpy(recs + (size_t)i * rb, &h, sizeof h);
        float *f = (float *)(recs + (size_t)i * rb + sizeof h);
        for (int d = 0; d < 16; d++)
            f[d] = (float)i + (float)d / 16.0f;
    }
    for (int64_t r = 0; r < rounds; r++) /* in 1.3 MB puts: each fits a queue */
        for (int64_t half = 0; half < 2; half++)
            assert_int_equal(kern_tier_put(c, n / 2, recs + (size_t)(r * n + half * n / 2) * rb),
                             0);
    assert_int_equal(kern_tier_size(c), n * rounds);
    assert_int_equal(kern_tier_take(c, n * rounds, keys, back, found), 0);
    for (int64_t i = 0; i < n * rounds; i++)
        assert_int_equal(found[i], 1);
    assert_memory_equal(recs, back, (size_t)(n * rounds) * rb);
    assert_int_equal(kern_tier_size(c), 0);
    kern_tier_close(c);
    free(recs);
    free(back);
    free(keys);
    free(found);
}

static void test_tier_put_queues(void **state)
{
    (void)state;
    put_queues(true);
    put_queues(false);
}

static int cmp_tag(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b; /* {tag, key} */
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Keys whose index tags are the same (28 bits of hash) are told apart by
 * the record's key: each take, get, has and delete finds its own record,
 * whichever of the two was put first. */
static void test_tier_shared_tags(void **state)
{
    (void)state;
    /* a pair with one tag: ~20 k random keys give one (the birthday bound) */
    const int64_t n = 200000;
    uint64_t(*tk)[2] = malloc(sizeof *tk * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        tk[i][1] = rnd() >> 1;
        tk[i][0] = kern_tier_tag((int64_t)tk[i][1]);
    }
    qsort(tk, (size_t)n, sizeof *tk, cmp_tag);
    int64_t pair[2] = {0, 0};
    for (int64_t i = 1; i < n && pair[0] == 0; i++)
        if (tk[i][0] == tk[i - 1][0] && tk[i][1] != tk[i - 1][1]) {
            pair[0] = (int64_t)tk[i - 1][1];
            pair[1] = (int64_t)tk[i][1];
        }
    free(tk);
    assert_true(pair[0] != 0);
    for (int first = 0; first < 2; first++) {
        char path[320];
        snprintf(path, sizeof path, "%s/tags%d.tier", dir, first);
        kern_tier_t *c = NULL;
        assert_int_equal(kern_tier_open(path, "tags", 64, 4, KERN_TIER_IO_AUTO, &c), 0);
        const size_t rb = kern_tier_rec_bytes(c);
        uint8_t recs[2][256], back[2][256], found[2];
        for (int k = 0; k < 2; k++) {
            memset(recs[k], 0, rb);
            kern_rec_t h = {.key = pair[k], .stamp = 10 + k};
            memcpy(recs[k], &h, sizeof h);
        }
        /* put in both orders: the walk meets the other key's entry first in one */
        assert_int_equal(kern_tier_put(c, 1, recs[first]), 0);
        assert_int_equal(kern_tier_put(c, 1, recs[!first]), 0);
        const int64_t one[1] = {pair[1]}, other[1] = {pair[0]};
        assert_int_equal(kern_tier_get(c, 1, one, back[1], found), 0);
        assert_int_equal(found[0], 1);
        assert_memory_equal(back[1], recs[1], rb);
        assert_int_equal(kern_tier_take(c, 1, other, back[0], found), 0);
        assert_int_equal(found[0], 1);
        assert_memory_equal(back[0], recs[0], rb);
        assert_int_equal(kern_tier_has(c, 1, other, found), 0);
        assert_int_equal(found[0], 0); /* taken: gone, and the other still there */
        assert_int_equal(kern_tier_has(c, 1, one, found), 0);
        assert_int_equal(found[0], 1);
        int64_t nd = 0;
        assert_int_equal(kern_tier_delete(c, 1, one, NULL, NULL, &nd), 0);
        assert_int_equal(nd, 1);
        assert_int_equal(kern_tier_size(c), 0);
        kern_tier_close(c);
    }
}

/* The whole table's limit holds across both tiers: lru evicts from disk
 * (logged), none refuses. */
static void test_tier_capacity(void **state)
{
    (void)state;
    kern_table_t *t = make("cap", 4, 1000, 250, KERN_OPT_SGD, KERN_EVICT_LRU, 0);
    int64_t keys[200];
    for (int64_t step = 1; step <= 20; step++) {
        for (int i = 0; i < 200; i++)
            keys[i] = step * 1000 + i;
        int32_t rows[200];
        assert_int_equal(kern_table_find_or_insert(t, 200, keys, step, rows), 0);
        assert_true(kern_table_size(t) <= 1000);
    }
    int64_t nev = 0;
    const kern_evicted_t *ev = kern_table_evicted(t, &nev);
    assert_true(nev >= 20 * 200 - 1000);
    assert_true(ev[0].key < 10 * 1000); /* the oldest went first */
    kern_table_destroy(t);

    t = make("capnone", 4, 300, 250, KERN_OPT_SGD, KERN_EVICT_NONE, 0);
    int32_t rows[200];
    for (int i = 0; i < 200; i++)
        keys[i] = i;
    assert_int_equal(kern_table_find_or_insert(t, 200, keys, 1, rows), 0);
    for (int i = 0; i < 200; i++)
        keys[i] = 1000 + i;
    assert_int_equal(kern_table_find_or_insert(t, 200, keys, 2, rows), KILN_EFULL);
    assert_non_null(strstr(kiln_errmsg(), "is full"));
    assert_int_equal(kern_table_size(t), 200); /* nothing lost, nothing added */
    kern_table_destroy(t);
}

/* A key gets a row on its admit_min-th sighting; until then -1. */
static void test_admission(void **state)
{
    (void)state;
    kern_table_t *t = make("adm", 4, 1000, 0, KERN_OPT_SGD, KERN_EVICT_NONE, 3);
    int64_t k[2] = {77, 78};
    int32_t r[2];
    assert_int_equal(kern_table_find_or_insert(t, 1, k, 1, r), 0);
    assert_int_equal(r[0], -1);
    assert_int_equal(kern_table_find_or_insert(t, 1, k, 2, r), 0);
    assert_int_equal(r[0], -1);
    assert_int_equal(kern_table_size(t), 0);
    assert_int_equal(kern_table_find_or_insert(t, 2, k, 3, r), 0);
    assert_true(r[0] >= 0);
    assert_int_equal(r[1], -1);
    /* the counters move to a resumed table */
    int64_t n = 0, epoch = 0;
    const uint16_t *c = kern_table_admit_sketch(t, &n, &epoch);
    kern_table_t *u = make("adm2", 4, 1000, 0, KERN_OPT_SGD, KERN_EVICT_NONE, 3);
    assert_int_equal(kern_table_admit_load(u, c, n, 3, false), 0);
    (void)epoch;
    assert_int_equal(kern_table_find_or_insert(u, 1, k + 1, 4, r), 0);
    assert_int_equal(r[0], -1);
    assert_int_equal(kern_table_find_or_insert(u, 1, k + 1, 5, r), 0);
    assert_true(r[0] >= 0); /* seen twice before, three times now */
    kern_table_destroy(t);
    kern_table_destroy(u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tier_matches_ram),
        cmocka_unit_test(test_tier_pread_prefetch),
        cmocka_unit_test(test_tier_mmap),
        cmocka_unit_test(test_tier_put_queues),
        cmocka_unit_test(test_tier_shared_tags),
        cmocka_unit_test(test_tier_keeps_hot_rows),
        cmocka_unit_test(test_tier_load_delete_expire),
        cmocka_unit_test(test_tier_capacity),
        cmocka_unit_test(test_admission),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
