/*
 * bench/tier_bench.c - tables larger than memory (issue 25): the sparse half
 * of a training step (find_or_insert of a batch's unique keys, adagrad on
 * their rows) over one table of K keys, dim 16, with all rows in RAM and
 * with a share of them (--memory 0.25, 0.1), on Zipf-skewed keys.
 *
 *   tier_bench --keys 10000000 --memory 0.1 [--zipf 1.15] [--batch 4096]
 *              [--slots 26] [--steps 200] [--dir /var/tmp]
 *              [--io auto|pread|uring|mmap] [--prefetch 0|1] [--cold 0|1]
 *
 * The table is filled first (every key, as a resumed checkpoint would be),
 * then `steps` steps of `batch` samples x `slots` keys run, and one line
 * says samples/s (median of 5 blocks), the CPU time per step (user +
 * system, which other load on the machine disturbs less), the RAM hit rate, the disk bytes
 * read and written and the I/O calls per step and the process's peak RSS
 * (and its anonymous part: the tier file's pages that --io mmap maps in
 * count in RSS) against the RAM the table was given. Drawing a step's keys
 * (a Zipf sample and a sort: in kiln-train the reader thread's work) is in
 * neither figure; it cost 14 ms a step, several times the all-in-RAM
 * table's work at 1e6 keys. Each step's keys are drawn a step
 * ahead (the reader's lookahead); with --prefetch 1 they go to
 * kern_table_prefetch before the step before them runs (which acts only
 * while the tier's reads are slow, as in kiln-train), with --prefetch 2
 * they are prefetched whatever the reads take. --io picks how the
 * tier moves pages (kern_tier_io_t). --cold 1 drops the tier file from the
 * page cache before every step (fdatasync, fadvise DONTNEED; not timed), as
 * for a file larger than the free RAM: the case prefetch is for.
 * tools/tier_bench.sh runs the grid in separate processes
 * (so each peak RSS is its own), checks free disk first and prints the
 * ratios to all-in-RAM; docs/benchmarks.md has the results.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"
#include "jobs.h"
#include "kern.h"
#include "kern_ops.h"
#include "kiln.h"

static uint64_t rng = 0x7469657262ULL;
static double u01(void)
{
    rng = kern_mix64(rng + 0x9e3779b97f4a7c15ULL);
    return (double)(rng >> 11) / 9007199254740992.0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Draws a step's n Zipf keys over [1, keys] and dedupes them as the
 * trainer does; returns how many are unique (sorted, at the front of k). */
static int64_t draw(int64_t *k, int64_t n, int64_t keys, double s)
{
    for (int64_t i = 0; i < n; i++)
        k[i] = (int64_t)kern_mix64((uint64_t)bench_zipf(keys, s, u01()));
    qsort(k, (size_t)n, sizeof *k, cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (u == 0 || k[i] != k[u - 1])
            k[u++] = k[i];
    return u;
}

/* The process's anonymous memory now, MB (RssAnon): its peak RSS also
 * counts the tier file's pages that a mapping (--io mmap) has mapped in,
 * which are the kernel's page cache, there whatever reads the file. */
static double anon_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %lf", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb / 1024.0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int64_t keys = 1000000, batch = 4096, slots = 26, steps = 200;
    double memory = 1.0, s = 1.15;
    const char *dir = "/var/tmp";
    kern_tier_io_t io = KERN_TIER_IO_AUTO;
    int prefetch = 1, cold = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--keys")) keys = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--memory")) memory = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--zipf")) s = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--slots")) slots = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--prefetch")) prefetch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cold")) cold = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--io"))
            io = !strcmp(argv[i + 1], "pread")   ? KERN_TIER_IO_PREAD
                 : !strcmp(argv[i + 1], "uring") ? KERN_TIER_IO_URING
                 : !strcmp(argv[i + 1], "mmap")  ? KERN_TIER_IO_MMAP
                                                 : KERN_TIER_IO_AUTO;
    }
    const int dim = 16;
    char path[512];
    snprintf(path, sizeof path, "%s/tier_bench.%ld.tier", dir, (long)getpid());
    int64_t ram = memory < 1.0 ? (int64_t)(memory * (double)keys) : 0;
    kern_table_config_t cfg = {.name = "bench", .dim = dim, .capacity = keys + keys / 50,
                               .opt = KERN_OPT_ADAGRAD, .opt_init = 0.1f,
                               .init = KERN_INIT_UNIFORM, .init_scale = 0.01f, .seed = 1,
                               .evict = KERN_EVICT_LRU, .ram_rows = ram, .spill_path = path,
                               .spill_io = io, .spill_prefetch_always = prefetch == 2};
    kern_table_t *t = NULL;
    if (kern_table_create(&cfg, &t) < 0) {
        fprintf(stderr, "tier_bench: %s\n", kiln_errmsg());
        return 1;
    }
    /* Fill: every key once, in chunks (what a resume does). */
    const int64_t chunk = 65536;
    int64_t *kb = malloc(sizeof *kb * (size_t)chunk);
    float *vb = calloc((size_t)chunk * dim, sizeof *vb);
    for (int64_t at = 0; at < keys; at += chunk) {
        int64_t m = keys - at < chunk ? keys - at : chunk;
        for (int64_t i = 0; i < m; i++)
            kb[i] = (int64_t)kern_mix64((uint64_t)(at + i + 1));
        if (kern_table_insert_rows(t, m, kb, vb, NULL, NULL, 0) < 0) {
            fprintf(stderr, "tier_bench: fill: %s\n", kiln_errmsg());
            return 1;
        }
    }
    free(kb);
    free(vb);
    kern_table_set_base(t, 0);
    int cfd = cold && ram ? open(path, O_RDONLY) : -1;

    const int64_t n = batch * slots;
    int64_t *k = malloc(sizeof *k * (size_t)n), *next = malloc(sizeof *next * (size_t)n), nnext;
    int32_t *rows = malloc(sizeof *rows * (size_t)n);
    float *g = malloc(sizeof *g * (size_t)n * dim);
    for (int64_t i = 0; i < n * dim; i++)
        g[i] = (float)(u01() - 0.5) * 0.01f;
    kern_opt_t opt = {.kind = KERN_OPT_ADAGRAD, .lr = 0.05f, .eps = 1e-8f};
    kern_table_stats_t st0, st1;
    kern_table_stats(t, &st0);
    const int blocks = 5;
    double rate[5];
    int64_t per = steps / blocks > 0 ? steps / blocks : 1;
    nnext = draw(next, n, keys, s);
    struct rusage ru0, ru;
    double drawing = 0; /* seconds spent drawing keys, left out of both figures */
    double anon = anon_mb(); /* its peak, sampled after the fill and each block */
    getrusage(RUSAGE_SELF, &ru0);
    for (int bl = 0; bl < blocks; bl++) {
        double t0 = ((double)kiln_mono_ns() / 1e9), untimed = 0;
        for (int64_t step = 1 + bl * per; step <= (bl + 1) * per; step++) {
            if (cfd >= 0) {
                double d0 = (double)kiln_mono_ns() / 1e9;
                (void)fdatasync(cfd);
                (void)posix_fadvise(cfd, 0, 0, POSIX_FADV_DONTNEED);
                untimed += (double)kiln_mono_ns() / 1e9 - d0;
            }
            int64_t *sw = k, u = nnext;
            k = next;
            next = sw;
            /* The next step's keys are known now (the reader's lookahead).
             * Drawing them (a Zipf sample and a sort a key) is the bench's
             * work, done by kiln-train's reader thread: not timed. */
            double d0 = (double)kiln_mono_ns() / 1e9;
            nnext = draw(next, n, keys, s);
            const double dt = (double)kiln_mono_ns() / 1e9 - d0;
            untimed += dt;
            drawing += dt; /* one thread, all CPU: its CPU time too */
            if (prefetch && kern_table_prefetch(t, nnext, next) < 0) {
                fprintf(stderr, "tier_bench: prefetch: %s\n", kiln_errmsg());
                return 1;
            }
            if (kern_table_find_or_insert(t, u, k, step, rows) < 0) {
                fprintf(stderr, "tier_bench: step %lld: %s\n", (long long)step, kiln_errmsg());
                return 1;
            }
            kern_slab_t sl;
            kern_table_slab(t, &sl);
            kern_row_grads_t rg = {.rows = rows, .grads = g, .n = u};
            kern_cpu_sparse_update(&opt, 1, &sl, &rg, step);
            kern_table_mark_changed(t, u, rows);
        }
        rate[bl] = (double)(per * batch) / (((double)kiln_mono_ns() / 1e9) - t0 - untimed);
        double a = anon_mb();
        anon = a > anon ? a : anon;
    }
    kern_table_stats(t, &st1);
    qsort(rate, blocks, sizeof *rate, cmp_d);
    getrusage(RUSAGE_SELF, &ru);
    /* CPU time (user + system, io_uring's worker threads included) per
     * step: what the step costs whatever else the machine runs. */
    double cpu = ((double)(ru.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
                  (double)(ru.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                  (double)(ru.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
                  (double)(ru.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6 - drawing) /
                 (double)(per * blocks);
    double hits = (double)(st1.ram_hits - st0.ram_hits),
           miss = (double)(st1.disk_hits - st0.disk_hits);
    double step_n = (double)(per * blocks);
    if (cfd >= 0)
        close(cfd);
    printf("keys %lld memory %.0f%% (%lld rows in RAM), io %s, prefetch %d%s: %.0f samples/s, "
           "CPU %.1f ms/step, RAM hit rate %.4f, I/O calls %.0f/step, disk read %.0f KB/step, written %.0f KB/step, "
           "peak RSS %.0f MB (anonymous %.0f MB), table in RAM %.0f MB\n",
           (long long)keys, memory * 100, (long long)(ram ? ram : keys),
           !ram ? "-" : job_spill_io_name(st1.disk_io), prefetch,
           cfd >= 0 ? ", cold file" : "",
           rate[blocks / 2], cpu * 1e3, ram ? hits / (hits + miss) : 1.0,
           (double)(st1.disk_submits - st0.disk_submits) / step_n,
           (double)(st1.disk_read_bytes - st0.disk_read_bytes) / step_n / 1e3,
           (double)(st1.disk_written_bytes - st0.disk_written_bytes) / step_n / 1e3,
           (double)ru.ru_maxrss / 1024.0, anon,
           (double)kern_table_bytes(t) / 1048576.0);
    kern_table_destroy(t);
    free(k);
    free(next);
    free(rows);
    free(g);
    return 0;
}
