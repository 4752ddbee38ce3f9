/*
 * bench/push_bench.c - push speed over loopback to two real kiln-serve
 * processes: the throughput of a full push (MB/s of body per endpoint, both
 * endpoints fed in parallel by one serve_push call), and the time until a
 * delta of 100k and of 1M rows (dim 16) is live on both endpoints: from the
 * start of serve_push until both answered 200, which kiln-serve sends only
 * after the delta arrived, was verified, persisted and swapped in. Each
 * measurement is the median of several runs; each delta applies on the
 * previous one (a chain), as a trainer's exports would.
 *
 *   push_bench --serve PATH/kiln-serve [--table N] [--runs R] [--dir DIR]
 *
 * The bar: a 100k-row delta live on both endpoints in under 1 s.
 * Results and the command used are in docs/benchmarks.md ("Serving").
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "kiln.h"
#include "rt_model.h"
#include "serve.h"

#define DIM 16
#define TOKEN "push-bench-token"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* One table of dim 16 behind an fm model with one slot and one dense feature. */
static int make_desc(serve_model_desc_t *d)
{
    memset(d, 0, sizeof *d);
    d->model_type = RT_MODEL_FM;
    d->nslots = 1;
    d->ndense = 1;
    d->dim = DIM;
    d->fm_dense_factors = 1;
    d->ntables = 1;
    snprintf(d->tables[0].name, SERVE_NAME_MAX, "items");
    d->tables[0].dim = DIM;
    rt_model_config_t cfg = {.type = RT_MODEL_FM, .nslots = 1, .ndense = 1, .dim = DIM,
                             .fm_dense_factors = 1, .max_batch = 1,
                             .opt = {.type = RT_DENSE_SGD}};
    rt_model_t *m = NULL;
    KILN_CHECK(rt_model_create(&cfg, &m));
    d->nparams = (int64_t)rt_model_nparams(m);
    rt_model_destroy(m);
    return serve_desc_check(d);
}

typedef struct server {
    pid_t pid;
    char dir[700], url[64];
} server_t;

/* Starts kiln-serve on a free port with its state in dir; waits for it. */
static int server_start(const char *bin, server_t *s)
{
    char portfile[720];
    snprintf(portfile, sizeof portfile, "%s.port", s->dir);
    unlink(portfile);
    s->pid = fork();
    if (s->pid == 0) {
        setenv("KILN_BENCH_TOKEN", TOKEN, 1);
        char logp[720];
        snprintf(logp, sizeof logp, "%s.log", s->dir);
        if (freopen(logp, "a", stderr) == NULL)
            _exit(126);
        const char *argv[] = {bin, "--listen", "127.0.0.1:0", "--state-dir", s->dir,
                              "--token-env", "KILN_BENCH_TOKEN", "--port-file", portfile, NULL};
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(portfile, "r");
        int port = 0;
        if (f != NULL) {
            if (fscanf(f, "%d", &port) != 1)
                port = 0;
            fclose(f);
        }
        if (port > 0) {
            snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", port);
            return 0;
        }
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
    return kiln_errf(KILN_EIO, "kiln-serve (%s) did not start", bin);
}

static void server_stop(server_t *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        waitpid(s->pid, NULL, 0);
    }
}

typedef struct opener {
    serve_memsrc_t *src;
} opener_t;

static int open_src(void *ctx, const char *held, serve_source_t **out)
{
    (void)held;
    return serve_memsrc_open(((opener_t *)ctx)->src, out);
}

/* A source of n rows: keys drawn from [0, table) (full: 0..n-1), values
 * random, dense weights small. */
static int build(const serve_model_desc_t *d, const char *uid, const char *base, int64_t n,
                 int64_t table, bool full, serve_memsrc_t **out)
{
    int64_t *keys = kiln_calloc((size_t)n + 1, sizeof *keys);
    float *vals = kiln_calloc((size_t)n * DIM + 1, sizeof *vals);
    float *dense = kiln_calloc((size_t)d->nparams + 1, sizeof *dense);
    int rc = 0;
    if (keys == NULL || vals == NULL || dense == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int64_t i = 0; i < n; i++) {
        keys[i] = full ? i : (int64_t)(rnd() % (uint64_t)table);
        for (int j = 0; j < DIM; j++)
            vals[i * DIM + j] = (float)(rnd() % 2001) / 1000.0f - 1.0f;
    }
    for (int64_t i = 0; i < d->nparams; i++)
        dense[i] = 0.01f * (float)(i % 5);
    KILN_CHECK_GOTO(serve_memsrc_create(d, uid, base, out), rc, out);
    KILN_CHECK_GOTO(serve_memsrc_add_rows(*out, 0, n, keys, vals), rc, out);
    KILN_CHECK_GOTO(serve_memsrc_set_dense(*out, d->nparams, dense), rc, out);
out:
    free(keys);
    free(vals);
    free(dense);
    return rc;
}

/* Pushes src to both servers (model bench, label A) as held -> uid; returns
 * seconds and the body bytes of one endpoint. */
static int push_both(server_t *sv, serve_memsrc_t *src, const char *held, double *secs,
                     uint64_t *bytes)
{
    opener_t o = {src};
    serve_target_t t[2] = {{sv[0].url, "bench", "A", held, open_src, &o},
                           {sv[1].url, "bench", "A", held, open_src, &o}};
    serve_push_result_t r[2];
    serve_push_opts_t opt = {.token = TOKEN, .retries = 0, .timeout_ms = 600000};
    int64_t t0 = kiln_mono_ns();
    int rc = serve_push(t, 2, &opt, r);
    *secs = (double)(kiln_mono_ns() - t0) / 1e9;
    *bytes = r[0].bytes;
    if (rc == 0 && (r[0].full != (held[0] == '\0') || r[1].full != (held[0] == '\0')))
        rc = kiln_errf(KILN_EINTERNAL, "a delta push fell back to a full one");
    return rc;
}

int main(int argc, char **argv)
{
    const char *bin = NULL, *dir = "/tmp";
    int64_t table = 1000000;
    int runs = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--serve") == 0)
            bin = argv[i + 1];
        else if (strcmp(argv[i], "--table") == 0)
            table = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
    }
    if (bin == NULL || table < 1 || runs < 1 || runs > 50) {
        fprintf(stderr, "usage: push_bench --serve PATH/kiln-serve [--table N] [--runs R] "
                        "[--dir DIR]\n");
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    kiln_log_set_level(KILN_LOG_WARN);
    char root[600];
    snprintf(root, sizeof root, "%s/kiln-push-bench-XXXXXX", dir);
    if (mkdtemp(root) == NULL) {
        perror(root);
        return 1;
    }
    server_t sv[2] = {{0}};
    serve_model_desc_t d;
    int rc = make_desc(&d);
    for (int i = 0; i < 2 && rc == 0; i++) {
        snprintf(sv[i].dir, sizeof sv[i].dir, "%s/ep%d", root, i);
        rc = server_start(bin, &sv[i]);
    }
    double full_s[50], d100k[50], d1m[50];
    uint64_t full_bytes = 0, b100k = 0, b1m = 0;
    char held[SERVE_UID_MAX] = "", uid[SERVE_UID_MAX];
    int version = 0;
    /* Full pushes of the whole table: throughput. */
    for (int r = 0; rc == 0 && r < runs; r++) {
        serve_memsrc_t *m = NULL;
        snprintf(uid, sizeof uid, "v%d", ++version);
        rc = build(&d, uid, "", table, table, true, &m);
        if (rc == 0)
            rc = push_both(sv, m, "", &full_s[r], &full_bytes);
        serve_memsrc_destroy(m);
        snprintf(held, sizeof held, "%s", uid);
    }
    /* Deltas of 100k and of 1M rows, each on the one before. */
    const int64_t sizes[2] = {100000, 1000000};
    double *out[2] = {d100k, d1m};
    uint64_t *outb[2] = {&b100k, &b1m};
    for (int k = 0; k < 2; k++)
        for (int r = 0; rc == 0 && r < runs; r++) {
            serve_memsrc_t *m = NULL;
            snprintf(uid, sizeof uid, "v%d", ++version);
            rc = build(&d, uid, held, sizes[k], table, false, &m);
            if (rc == 0)
                rc = push_both(sv, m, held, &out[k][r], outb[k]);
            serve_memsrc_destroy(m);
            snprintf(held, sizeof held, "%s", uid);
        }
    server_stop(&sv[0]);
    server_stop(&sv[1]);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "push_bench: could not remove %s\n", root);
    if (rc < 0) {
        fprintf(stderr, "push_bench: %s\n", kiln_errmsg());
        return 1;
    }
    double fs = median(full_s, runs), s100k = median(d100k, runs), s1m = median(d1m, runs);
    printf("push_bench: 2 kiln-serve endpoints on loopback, one table of %" PRId64
           " rows x dim %d, median of %d runs\n",
           table, DIM, runs);
    printf("  full push    %8" PRId64 " rows  %7.1f MB/endpoint  %7.3f s  %7.1f MB/s per "
           "endpoint (%.1f MB/s both)\n",
           table, (double)full_bytes / 1e6, fs, (double)full_bytes / 1e6 / fs,
           2.0 * (double)full_bytes / 1e6 / fs);
    printf("  delta        %8d rows  %7.1f MB/endpoint  %7.3f s  live on both%s\n", 100000,
           (double)b100k / 1e6, s100k, s100k < 1.0 ? " (goal < 1 s: met)" : " (goal < 1 s: NOT met)");
    printf("  delta        %8d rows  %7.1f MB/endpoint  %7.3f s  live on both\n", 1000000,
           (double)b1m / 1e6, s1m);
    curl_global_cleanup();
    return 0;
}
