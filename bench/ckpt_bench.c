/*
 * bench/ckpt_bench.c - checkpoint speed on one table (no MPI, one "rank"):
 * a full dump of N keys x dim (adagrad state included), incremental dumps
 * after changing 0.1 %, 1 % and 10 % of the rows, and a load (verify +
 * insert) of the full dump into an empty table. Prints the median of
 * several runs and the incremental / full ratios; the bar is that
 * the 1 % incremental takes at most 5 % of the full dump.
 *
 *   ckpt_bench [--keys N] [--dim D] [--runs R] [--dir DIR]
 *
 * Results and the command used are in docs/benchmarks.md ("Checkpoints").
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "kern.h"
#include "kiln.h"
#include "ckpt.h"

/* One dump of t (since < 0: full) into root; returns seconds, or -1. */
static double dump(const char *root, kern_table_t *t, int64_t since, int64_t step, char *uid,
                   int64_t *bytes)
{
    ckpt_info_t *in = calloc(1, sizeof *in);
    ckpt_part_t *p = NULL;
    char tmp[1024];
    double secs = -1;
    int64_t t0 = kiln_mono_ns();
    ckpt_new_uid(step, in->uid);
    in->kind = since < 0 ? CKPT_FULL : CKPT_INCREMENTAL;
    in->since = since;
    in->step = step;
    in->world_size = 1;
    in->include_optimizer = true;
    snprintf(in->model, sizeof in->model, "lr");
    snprintf(in->parent, sizeof in->parent, "%s", since < 0 ? "" : "base");
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", root, in->uid);
    float dense[16] = {0};
    ckpt_array_t a = {"dense.params", dense, 16};
    if (mkdir(tmp, 0755) == 0 && ckpt_part_create(&p) == 0 &&
        ckpt_write_tables(tmp, 0, 1, &t, since, true, p) == 0 &&
        ckpt_write_dense(tmp, &a, 1, p) == 0 && ckpt_commit(root, tmp, in, p) == 0) {
        ckpt_mark_dumped(1, &t, step);
        secs = (double)(kiln_mono_ns() - t0) / 1e9;
        snprintf(uid, CKPT_UID_MAX, "%s", in->uid);
        *bytes = in->bytes;
    } else {
        fprintf(stderr, "ckpt_bench: dump failed: %s\n", kiln_errmsg());
    }
    ckpt_part_destroy(p);
    free(in);
    return secs;
}

/* Changes m distinct random rows at `step` (an adagrad update of each). */
static int change_rows(kern_table_t *t, int64_t n, int64_t m, int64_t step)
{
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    int32_t *rows = malloc((size_t)m * sizeof *rows);
    float *g = malloc((size_t)m * (size_t)sl.dim * sizeof *g);
    if (rows == NULL || g == NULL)
        return KILN_ENOMEM;
    /* m evenly spaced rows from a random start: distinct and ascending. */
    int64_t stride = n / m, start = (int64_t)(bench_rnd() % (uint64_t)stride);
    for (int64_t i = 0; i < m; i++)
        rows[i] = (int32_t)(start + i * stride);
    for (int64_t i = 0; i < m * sl.dim; i++)
        g[i] = (float)((double)(bench_rnd() % 1000) / 1000.0 - 0.5);
    kern_row_grads_t rg = {.rows = rows, .grads = g, .n = m};
    kern_opt_t opt = {.kind = KERN_OPT_ADAGRAD, .lr = 0.01f, .eps = 1e-8f};
    int rc = kern_cpu_sparse_update(&opt, 1, &sl, &rg, step);
    kern_table_mark_changed(t, m, rows);
    free(rows);
    free(g);
    return rc;
}

int main(int argc, char **argv)
{
    int64_t n = 10000000;
    int dim = 16, runs = 3;
    const char *dir = "/tmp";
    const bench_opt_t opts[] = {{"--keys", BENCH_I64, &n},
                                {"--dim", BENCH_INT, &dim},
                                {"--runs", BENCH_INT, &runs},
                                {"--dir", BENCH_STR, &dir}};
    bench_options(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (n < 1000 || dim < 1 || runs < 1 || runs > 64) {
        fprintf(stderr,
                "usage: ckpt_bench [--keys N>=1000] [--dim D] [--runs 1..64] [--dir DIR]\n");
        return 2;
    }
    char root[1024];
    snprintf(root, sizeof root, "%s/kiln-ckpt-bench-%ld", dir, (long)getpid());
    if (mkdir(root, 0755) < 0) {
        perror(root);
        return 1;
    }
    kern_table_config_t cfg = {.name = "emb",
                               .dim = dim,
                               .capacity = n,
                               .opt = KERN_OPT_ADAGRAD,
                               .init = KERN_INIT_ZEROS,
                               .seed = 1,
                               .evict = KERN_EVICT_NONE};
    kern_table_t *t = NULL;
    if (kern_table_create(&cfg, &t) < 0) {
        fprintf(stderr, "ckpt_bench: %s\n", kiln_errmsg());
        return 1;
    }
    /* Fill: n keys with random values and accumulators, in chunks. */
    const int64_t chunk = 1 << 20;
    int64_t *keys = malloc((size_t)chunk * sizeof *keys);
    float *vals = malloc((size_t)chunk * (size_t)dim * sizeof *vals);
    float *acc = malloc((size_t)chunk * (size_t)dim * sizeof *acc);
    int64_t t0 = kiln_mono_ns();
    for (int64_t at = 0; at < n; at += chunk) {
        int64_t m = n - at < chunk ? n - at : chunk;
        for (int64_t i = 0; i < m; i++)
            keys[i] = (int64_t)(bench_rnd() >> 1);
        for (int64_t i = 0; i < m * dim; i++) {
            vals[i] = (float)((double)(bench_rnd() % 2000) / 1000.0 - 1.0);
            acc[i] = (float)((double)(bench_rnd() % 1000) / 1000.0);
        }
        if (kern_table_insert_rows(t, m, keys, vals, acc, NULL, 1) < 0) {
            fprintf(stderr, "ckpt_bench: %s\n", kiln_errmsg());
            return 1;
        }
    }
    free(keys);
    free(vals);
    free(acc);
    n = kern_table_size(t);
    printf("table: %" PRId64 " keys x dim %d, adagrad (%.2f GB of rows), fill %.1f s, dir %s\n", n,
           dim, (double)n * (8 + 8.0 * dim) / 1e9, (double)(kiln_mono_ns() - t0) / 1e9, dir);

    double full[64], inc[3][64];
    char uid[CKPT_UID_MAX], path[1200], base_path[1200] = "";
    int64_t step = 1, bytes = 0, full_bytes = 0, inc_bytes[3] = {0};
    for (int r = 0; r < runs; r++) {
        full[r] = dump(root, t, -1, ++step, uid, &full_bytes);
        if (full[r] < 0)
            return 1;
        snprintf(path, sizeof path, "%s/%s", root, uid);
        if (r + 1 < runs)
            ckpt_remove(path);
        else
            snprintf(base_path, sizeof base_path, "%s", path);
    }
    const double fr[3] = {0.001, 0.01, 0.1};
    for (int k = 0; k < 3; k++) {
        for (int r = 0; r < runs; r++) {
            int64_t since = step;
            if (change_rows(t, n, (int64_t)((double)n * fr[k]), ++step) < 0)
                return 1;
            inc[k][r] = dump(root, t, since, step, uid, &bytes);
            if (inc[k][r] < 0)
                return 1;
            inc_bytes[k] = bytes;
            snprintf(path, sizeof path, "%s/%s", root, uid);
            ckpt_remove(path);
        }
    }
    kern_table_destroy(t);

    /* Load the last full dump into an empty table: verify + read + insert. */
    double load[64];
    int lruns = runs < 2 ? runs : 2;
    for (int r = 0; r < lruns; r++) {
        kern_table_t *l = NULL;
        if (kern_table_create(&cfg, &l) < 0)
            return 1;
        int64_t l0 = kiln_mono_ns();
        ckpt_chain_t ch;
        if (ckpt_chain_open(base_path, true, &ch) < 0 ||
            ckpt_load_tables(&ch, 0, 1, 1, &l) < 0) {
            fprintf(stderr, "ckpt_bench: load: %s\n", kiln_errmsg());
            return 1;
        }
        load[r] = (double)(kiln_mono_ns() - l0) / 1e9;
        if (kern_table_size(l) != n) {
            fprintf(stderr, "ckpt_bench: loaded %" PRId64 " of %" PRId64 " keys\n",
                    kern_table_size(l), n);
            return 1;
        }
        ckpt_chain_fini(&ch);
        kern_table_destroy(l);
    }
    ckpt_remove(base_path);
    rmdir(root);

    double f = bench_median(full, runs);
    printf("full dump:         %8.3f s  %7.1f MB  %6.0f MB/s  (median of %d)\n", f,
           (double)full_bytes / 1e6, (double)full_bytes / 1e6 / f, runs);
    for (int k = 0; k < 3; k++) {
        double x = bench_median(inc[k], runs);
        printf("incremental %5.1f%%: %8.3f s  %7.1f MB  %5.2f%% of the full dump's time\n",
               fr[k] * 100, x, (double)inc_bytes[k] / 1e6, 100 * x / f);
    }
    printf("load (verify+insert): %5.3f s  (median of %d)\n", bench_median(load, lruns), lruns);
    double one = bench_median(inc[1], runs);
    printf("1%% incremental / full = %.2f%% (bar: <= 5%%): %s\n", 100 * one / f,
           one <= 0.05 * f ? "ok" : "MISSED");
    return one <= 0.05 * f ? 0 : 3;
}
