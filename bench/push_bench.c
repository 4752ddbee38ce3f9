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
 * The peer, run in the same process: the same number of body bytes POSTed
 * the same way (libcurl multi, both at once) to two do-nothing
 * libmicrohttpd sinks in child processes on loopback, which read and drop
 * the body. That is the transport bound: what HTTP over loopback costs on
 * this machine before kiln-serve verifies, persists and swaps anything in.
 *
 * The bar: a 100k-row delta live on both endpoints in under 1 s.
 * Results and the command used are in docs/benchmarks.md ("Serving").
 *
 *   push_bench --serve PATH/kiln-serve --mode predict [--requests N] [--rows R]
 *
 * measures instead what the impression log (issue 28) costs a predict: two
 * kiln-serve processes with the same Criteo-shaped fm model (13 dense
 * features, 26 slots, dim 16), one started with --impressions-dir and
 * --join-dir, the other without; N predicts of R Criteo-like rows, each with
 * its own request key, sent one at a time over a kept-alive connection,
 * alternating between the two so that both see the same machine; the
 * latency of each from the client (p50, p99, max), and at the end how many
 * rows the logging one wrote and dropped.
 *
 *   push_bench --serve PATH/kiln-serve --mode tier [--table N] [--requests N] [--rows R]
 *              [--memory-pct P]
 *
 * measures a served table larger than memory (issue 25): two kiln-serve
 * processes get the same full push of one table of N rows (keys 0..N-1,
 * dim 16), one with every row in RAM, the other started with
 * --table-memory at P % of the table's row bytes (default 10: a tenth of
 * the rows in RAM, the rest in its disk tier); then N lookups
 * (POST .../lookup) of the keys of R Criteo rows (26 keys each) drawn
 * Zipf 1.15 over the table, the hot keys scattered over it (rank r is key
 * (r - 1) x 2654435761 mod N, so RAM, which keeps the rows pushed first,
 * holds no more of them than its share), one at a time, alternating, after
 * 200 of each unmeasured; p50, p99 and max from the client, and each
 * server's peak RSS and anonymous RSS at the end.
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
#include <microhttpd.h>

#include "bench.h"
#include "kiln.h"
#include "model.h"
#include "serve.h"

#define DIM 16
#define TOKEN "push-bench-token"

/* One table of dim 16 behind an fm model with one slot and one dense feature. */
static int make_desc(serve_model_desc_t *d)
{
    memset(d, 0, sizeof *d);
    d->model_type = MODEL_FM;
    d->nslots = 1;
    d->ndense = 1;
    d->dim = DIM;
    d->fm_dense_factors = 1;
    d->ntables = 1;
    snprintf(d->tables[0].name, SERVE_NAME_MAX, "items");
    d->tables[0].dim = DIM;
    model_config_t cfg = {.type = MODEL_FM, .nslots = 1, .ndense = 1, .dim = DIM,
                             .fm_dense_factors = 1, .max_batch = 1,
                             .opt = {.type = KERN_OPT_SGD}};
    model_t *m = NULL;
    KILN_CHECK(model_create(&cfg, &m));
    d->nparams = (int64_t)model_nparams(m);
    model_destroy(m);
    return serve_desc_check(d);
}

/* A reply kept (the first 64 KB: /metrics fits). */
typedef struct reply_buf {
    char text[65536];
    size_t len;
} reply_buf_t;

typedef struct server {
    pid_t pid;
    char dir[700], url[64];
} server_t;

/* Starts kiln-serve on a free port with its state in dir and the options
 * extra (NULL-ended, may be NULL); waits for it. */
static int server_start(const char *bin, server_t *s, const char *const *extra)
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
        const char *argv[24] = {bin, "--listen", "127.0.0.1:0", "--state-dir", s->dir,
                                "--token-env", "KILN_BENCH_TOKEN", "--port-file", portfile};
        for (int i = 0, n = 9; extra != NULL && extra[i] != NULL && n < 23; i++)
            argv[n++] = extra[i];
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
        keys[i] = full ? i : (int64_t)(bench_rnd() % (uint64_t)table);
        for (int j = 0; j < DIM; j++)
            vals[i * DIM + j] = (float)(bench_rnd() % 2001) / 1000.0f - 1.0f;
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
    serve_target_t t[2] = {{sv[0].url, "bench", "A", held, open_src, &o, NULL},
                           {sv[1].url, "bench", "A", held, open_src, &o, NULL}};
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

/* ---- the peer: a sink that reads and drops a POST body ------------------------- */
static enum MHD_Result sink_handler(void *cls, struct MHD_Connection *c, const char *url,
                                    const char *method, const char *version,
                                    const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls, (void)url, (void)method, (void)version, (void)upload;
    if (*con_cls == NULL) {
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        *upload_size = 0; /* dropped */
        return MHD_YES;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(2, (void *)"ok",
                                                             MHD_RESPMEM_PERSISTENT);
    enum MHD_Result q = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return q;
}

/* Starts a sink in a child process; its port comes back through a pipe. */
static pid_t sink_start(int *port)
{
    int fd[2];
    if (pipe(fd) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        struct MHD_Daemon *d =
            MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, sink_handler, NULL,
                             MHD_OPTION_END);
        int p = 0;
        if (d != NULL)
            p = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port;
        if (write(fd[1], &p, sizeof p) != (ssize_t)sizeof p || p == 0)
            _exit(1);
        for (;;)
            pause();
    }
    close(fd[1]);
    *port = 0;
    if (pid < 0 || read(fd[0], port, sizeof *port) != (ssize_t)sizeof *port || *port == 0) {
        if (pid > 0)
            kill(pid, SIGKILL);
        pid = -1;
    }
    close(fd[0]);
    return pid;
}

static size_t drop_reply(char *p, size_t size, size_t n, void *u)
{
    (void)p, (void)u;
    return size * n;
}

/* POSTs len bytes to both sinks at once; the seconds until both answered. */
static double sink_post(const int *ports, const char *body, size_t len)
{
    CURLM *multi = curl_multi_init();
    CURL *e[2];
    char url[2][64];
    for (int i = 0; i < 2; i++) {
        snprintf(url[i], sizeof url[i], "http://127.0.0.1:%d/sink", ports[i]);
        e[i] = curl_easy_init();
        curl_easy_setopt(e[i], CURLOPT_URL, url[i]);
        curl_easy_setopt(e[i], CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e[i], CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(e[i], CURLOPT_WRITEFUNCTION, drop_reply);
        curl_multi_add_handle(multi, e[i]);
    }
    int64_t t0 = kiln_mono_ns();
    int running = 2;
    while (running > 0) {
        curl_multi_perform(multi, &running);
        if (running > 0)
            curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    double secs = (double)(kiln_mono_ns() - t0) / 1e9;
    for (int i = 0; i < 2; i++) {
        long code = 0;
        curl_easy_getinfo(e[i], CURLINFO_RESPONSE_CODE, &code);
        if (code != 200)
            secs = -1.0;
        curl_multi_remove_handle(multi, e[i]);
        curl_easy_cleanup(e[i]);
    }
    curl_multi_cleanup(multi);
    return secs;
}

/* The peer's median seconds for len bytes to both sinks, or -1. */
static double sink_bench(size_t len, int runs)
{
    int ports[2] = {0, 0};
    pid_t pids[2] = {sink_start(&ports[0]), sink_start(&ports[1])};
    double t[50], med = -1.0;
    char *body = malloc(len ? len : 1);
    if (pids[0] > 0 && pids[1] > 0 && body != NULL) {
        for (size_t i = 0; i < len; i++)
            body[i] = (char)bench_rnd();
        int ok = 1;
        for (int r = 0; r < runs && ok; r++)
            ok = (t[r] = sink_post(ports, body, len)) > 0.0;
        if (ok)
            med = bench_median(t, runs);
    }
    free(body);
    for (int i = 0; i < 2; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
    return med;
}

/* ---- predict latency with the impression log on and off ------------------------- */

#define CRITEO_DENSE 13
#define CRITEO_SLOTS 26

/* An fm model of Criteo's shape: 13 dense features, 26 slots on one table. */
static int make_criteo_desc(serve_model_desc_t *d)
{
    memset(d, 0, sizeof *d);
    d->model_type = MODEL_FM;
    d->nslots = CRITEO_SLOTS;
    d->ndense = CRITEO_DENSE;
    d->dim = DIM;
    d->fm_dense_factors = 1;
    d->ntables = 1;
    snprintf(d->tables[0].name, SERVE_NAME_MAX, "items");
    d->tables[0].dim = DIM;
    model_config_t cfg = {.type = MODEL_FM, .nslots = CRITEO_SLOTS,
                             .ndense = CRITEO_DENSE, .dim = DIM, .fm_dense_factors = 1,
                             .max_batch = 1, .opt = {.type = KERN_OPT_SGD}};
    model_t *m = NULL;
    KILN_CHECK(model_create(&cfg, &m));
    d->nparams = (int64_t)model_nparams(m);
    model_destroy(m);
    return serve_desc_check(d);
}

static size_t keep_reply(char *p, size_t size, size_t n, void *u)
{
    reply_buf_t *b = u;
    size_t add = size * n;
    if (b->len + add < sizeof b->text) {
        memcpy(b->text + b->len, p, add);
        b->len += add;
        b->text[b->len] = '\0';
    }
    return add;
}

/* A JSON predict of rows Criteo-like rows with request key q. */
static char *predict_body(int q, int rows)
{
    size_t cap = (size_t)rows * 400 + 64, n = 0;
    char *b = malloc(cap);
    if (b == NULL)
        return NULL;
    n += (size_t)snprintf(b + n, cap - n, "{\"request_key\":\"req-%d\",\"rows\":[", q);
    for (int r = 0; r < rows; r++) {
        n += (size_t)snprintf(b + n, cap - n, "%s\"", r ? "," : "");
        for (int f = 0; f < CRITEO_DENSE; f++)
            n += (size_t)snprintf(b + n, cap - n, "%s%d", f ? "\\t" : "",
                                  (int)(bench_rnd() % 1000));
        for (int s = 0; s < CRITEO_SLOTS; s++)
            n += (size_t)snprintf(b + n, cap - n, "\\t%08x", (unsigned)(bench_rnd() % 5000));
        n += (size_t)snprintf(b + n, cap - n, "\"");
    }
    snprintf(b + n, cap - n, "]}");
    return b;
}

/* p (0-1) of the sorted v (n). */
static double pct(const double *v, int n, double p)
{
    int i = (int)(p * (n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* The value of the /metrics sample of url that starts with prefix (-1: none). */
static double metric_of(CURL *e, const char *url, const char *prefix)
{
    reply_buf_t b = {0};
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, keep_reply);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    if (curl_easy_perform(e) != CURLE_OK)
        return -1;
    const char *p = strstr(b.text, prefix);
    return p ? atof(p + strlen(prefix)) : -1;
}

/* Makes request q's JSON body (malloc'd; NULL: out of memory). */
typedef char *(*body_fn)(void *ctx, int q);

/* A client of the two servers: kept-alive connections to path on each and
 * the latencies of nreq requests to each. */
typedef struct {
    CURL *e[2];
    char url[2][160];
    struct curl_slist *h;
    double *lat[2];
    int nreq;
} client_t;

static int client_open(client_t *c, const server_t sv[2], const char *path, int nreq)
{
    memset(c, 0, sizeof *c);
    c->nreq = nreq;
    c->h = curl_slist_append(NULL, "Content-Type: application/json");
    for (int i = 0; i < 2; i++) {
        snprintf(c->url[i], sizeof c->url[i], "%s%s", sv[i].url, path);
        c->lat[i] = calloc((size_t)nreq, sizeof(double));
        c->e[i] = curl_easy_init();
        if (c->lat[i] == NULL || c->e[i] == NULL || c->h == NULL)
            return kiln_errf(KILN_ENOMEM, "out of memory");
        curl_easy_setopt(c->e[i], CURLOPT_HTTPHEADER, c->h);
    }
    return 0;
}

static void client_close(client_t *c)
{
    for (int i = 0; i < 2; i++) {
        curl_easy_cleanup(c->e[i]);
        free(c->lat[i]);
    }
    curl_slist_free_all(c->h);
}

/* Starts two kiln-serve in root/ep0 and root/ep1 (the second with the
 * options extra), pushes both the same full table of n rows of d and
 * opens client c for nreq requests to path on each (c to be closed
 * whatever this returns). */
static int pair_up(const char *bin, const char *root, const serve_model_desc_t *d,
                   const char *const *extra, int64_t n, const char *path, int nreq,
                   server_t sv[2], client_t *c)
{
    serve_memsrc_t *m = NULL;
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        snprintf(sv[i].dir, sizeof sv[i].dir, "%s/ep%d", root, i);
        rc = server_start(bin, &sv[i], i ? extra : NULL);
    }
    if (rc == 0)
        rc = build(d, "v1", "", n, n, true, &m);
    double secs;
    uint64_t bytes;
    if (rc == 0)
        rc = push_both(sv, m, "", &secs, &bytes);
    serve_memsrc_destroy(m);
    int crc = client_open(c, sv, path, nreq);
    return rc < 0 ? rc : crc;
}

/* POSTs warm + nreq requests to each server, one at a time, alternating;
 * c->lat[i] gets the milliseconds of server i's last nreq, sorted. */
static int alternate(client_t *c, int warm, body_fn make, void *ctx)
{
    int rc = 0;
    for (int q = 0; rc == 0 && q < 2 * (warm + c->nreq); q++) {
        int i = q % 2;
        char *body = make(ctx, q);
        reply_buf_t *b = calloc(1, sizeof *b);
        if (body == NULL || b == NULL) {
            free(body);
            free(b);
            return kiln_errf(KILN_ENOMEM, "out of memory");
        }
        curl_easy_setopt(c->e[i], CURLOPT_URL, c->url[i]);
        curl_easy_setopt(c->e[i], CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c->e[i], CURLOPT_WRITEFUNCTION, keep_reply);
        curl_easy_setopt(c->e[i], CURLOPT_WRITEDATA, b);
        int64_t t0 = kiln_mono_ns();
        CURLcode cc = curl_easy_perform(c->e[i]);
        if (q / 2 >= warm)
            c->lat[i][q / 2 - warm] = (double)(kiln_mono_ns() - t0) / 1e6;
        long code = 0;
        curl_easy_getinfo(c->e[i], CURLINFO_RESPONSE_CODE, &code);
        if (cc != CURLE_OK || code != 200)
            rc = kiln_errf(KILN_EIO, "request %d to %s: HTTP %ld %.200s", q, c->url[i], code,
                           b->text);
        free(body);
        free(b);
    }
    for (int i = 0; rc == 0 && i < 2; i++)
        qsort(c->lat[i], (size_t)c->nreq, sizeof(double), bench_cmp_double);
    return rc;
}

static char *predict_req(void *ctx, int q) { return predict_body(q, *(const int *)ctx); }

static int predict_bench(const char *bin, const char *root, int nreq, int rows)
{
    server_t sv[2] = {{0}};
    char imp[700], join[700];
    snprintf(imp, sizeof imp, "%s/impressions", root);
    snprintf(join, sizeof join, "%s/joined", root);
    const char *logging[] = {"--impressions-dir", imp, "--join-dir", join, NULL};
    serve_model_desc_t d;
    int rc = make_criteo_desc(&d);
    client_t c = {0};
    rc = rc < 0 ? rc
                : pair_up(bin, root, &d, logging, 5000, "/v1/models/bench/predict?label=A", nreq,
                          sv, &c);
    if (rc == 0)
        rc = alternate(&c, 0, predict_req, &rows);
    double **lat = c.lat;
    CURL **e = c.e;
    char murl[128];
    snprintf(murl, sizeof murl, "%s/metrics", sv[1].url);
    struct timespec ts = {0, 300000000L}; /* the writer drains */
    nanosleep(&ts, NULL);
    double logged = rc == 0 ? metric_of(e[1], murl, "kiln_serve_impressions_logged_total{model=\"bench\"} ") : -1;
    double dropped = 0;
    static const char *const reasons[] = {"queue", "cap", "disk", "row", "models"};
    for (size_t r = 0; rc == 0 && r < sizeof reasons / sizeof reasons[0]; r++) {
        char pre[96];
        snprintf(pre, sizeof pre, "kiln_serve_impressions_dropped_total{reason=\"%s\"} ", reasons[r]);
        dropped += metric_of(e[1], murl, pre);
    }
    if (rc == 0) {
        printf("push_bench --mode predict: %d predicts of %d rows (Criteo-shaped fm, dim %d) to "
               "each of 2 kiln-serve on loopback, one at a time, alternating\n",
               nreq, rows, DIM);
        for (int i = 0; i < 2; i++) {
            printf("  impression log %-3s  p50 %6.3f ms  p99 %6.3f ms  max %6.3f ms\n",
                   i ? "on" : "off", pct(lat[i], nreq, 0.5), pct(lat[i], nreq, 0.99),
                   lat[i][nreq - 1]);
        }
        printf("  logged %.0f rows, dropped %.0f (of %d)\n", logged, dropped, nreq * rows);
    }
    client_close(&c);
    server_stop(&sv[0]);
    server_stop(&sv[1]);
    return rc;
}

/* ---- lookup latency of a table a tenth in RAM (issue 25) ------------------------ */

/* Field (e.g. "VmHWM:") of /proc/pid/status, MB; -1 when unreadable. */
static double proc_mb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double kb = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, field, strlen(field)) == 0) {
            kb = atof(line + strlen(field));
            break;
        }
    if (f != NULL)
        fclose(f);
    return kb < 0 ? -1 : kb / 1024.0;
}

/* A lookup of nkeys Zipf 1.15 keys of a table of n rows. */
typedef struct {
    int nkeys;
    int64_t n;
} lookup_req_t;

static char *lookup_body(void *ctx, int q)
{
    (void)q;
    const lookup_req_t *r = ctx;
    size_t cap = (size_t)r->nkeys * 24 + 64, len = 0;
    char *b = malloc(cap);
    if (b == NULL)
        return NULL;
    len += (size_t)snprintf(b, cap, "{\"label\":\"A\",\"table\":\"items\",\"keys\":[");
    for (int i = 0; i < r->nkeys; i++) {
        double u = (double)(bench_rnd() >> 11) / 9007199254740992.0;
        uint64_t rank = (uint64_t)bench_zipf(r->n, 1.15, u);
        uint64_t key = (rank - 1) * UINT64_C(2654435761) % (uint64_t)r->n;
        len += (size_t)snprintf(b + len, cap - len, "%s%" PRIu64, i ? "," : "", key);
    }
    snprintf(b + len, cap - len, "]}");
    return b;
}

static int tier_lookup_bench(const char *bin, const char *root, int64_t table, int pct_ram,
                             int nreq, int rows)
{
    server_t sv[2] = {{0}};
    char mem[32];
    /* kiln-serve counts a row's floats and 32 bytes of index (serve_table.c). */
    snprintf(mem, sizeof mem, "%" PRId64,
             table * (int64_t)(sizeof(float) * DIM + 32) * pct_ram / 100);
    const char *tiered[] = {"--table-memory", mem, NULL};
    serve_model_desc_t d;
    int rc = make_desc(&d);
    client_t c = {0};
    rc = rc < 0 ? rc
                : pair_up(bin, root, &d, tiered, table, "/v1/models/bench/lookup", nreq, sv, &c);
    lookup_req_t req = {rows * CRITEO_SLOTS, table};
    if (rc == 0)
        rc = alternate(&c, 200, lookup_body, &req);
    double **lat = c.lat;
    if (rc == 0) {
        printf("push_bench --mode tier: one table of %" PRId64 " rows x dim %d pushed in full "
               "to 2 kiln-serve on loopback; %d lookups of %d keys (%d Criteo rows) each, "
               "Zipf 1.15, one at a time, alternating\n",
               table, DIM, nreq, req.nkeys, rows);
        for (int i = 0; i < 2; i++)
            printf("  %-16s p50 %7.3f ms  p99 %7.3f ms  max %7.3f ms  peak RSS %.0f MB "
                   "(anonymous now %.0f MB)\n",
                   i ? "--table-memory" : "all rows in RAM", pct(lat[i], nreq, 0.5),
                   pct(lat[i], nreq, 0.99), lat[i][nreq - 1], proc_mb(sv[i].pid, "VmHWM:"),
                   proc_mb(sv[i].pid, "RssAnon:"));
        printf("  --table-memory %s bytes (%d %% of the rows in RAM): p99 %.2fx, p50 %.2fx "
               "all in RAM's\n",
               mem, pct_ram, pct(lat[1], nreq, 0.99) / pct(lat[0], nreq, 0.99),
               pct(lat[1], nreq, 0.5) / pct(lat[0], nreq, 0.5));
    }
    client_close(&c);
    server_stop(&sv[0]);
    server_stop(&sv[1]);
    return rc;
}

int main(int argc, char **argv)
{
    const char *bin = NULL, *dir = "/tmp";
    int64_t table = 1000000;
    int runs = 5, requests = 2000, rows = 32, pct_ram = 10;
    const char *mode = "push";
    const bench_opt_t opts[] = {{"--serve", BENCH_STR, &bin},
                                {"--table", BENCH_I64, &table},
                                {"--runs", BENCH_INT, &runs},
                                {"--dir", BENCH_STR, &dir},
                                {"--mode", BENCH_STR, &mode},
                                {"--requests", BENCH_INT, &requests},
                                {"--rows", BENCH_INT, &rows},
                                {"--memory-pct", BENCH_INT, &pct_ram}};
    bench_options(argc, argv, opts, sizeof opts / sizeof opts[0]);
    bool predict = strcmp(mode, "predict") == 0, tier = strcmp(mode, "tier") == 0;
    if (bin == NULL || table < 1 || runs < 1 || runs > 50 || requests < 1 || rows < 1 ||
        rows > 1000 || pct_ram < 1 || pct_ram > 100 ||
        (!predict && !tier && strcmp(mode, "push") != 0)) {
        fprintf(stderr, "usage: push_bench --serve PATH/kiln-serve [--table N] [--runs R] "
                        "[--dir DIR]\n"
                        "       push_bench --serve PATH/kiln-serve --mode predict "
                        "[--requests N] [--rows R] [--dir DIR]\n"
                        "       push_bench --serve PATH/kiln-serve --mode tier [--table N] "
                        "[--requests N] [--rows R] [--memory-pct P] [--dir DIR]\n");
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
    if (predict || tier) {
        int prc = predict ? predict_bench(bin, root, requests, rows)
                          : tier_lookup_bench(bin, root, table, pct_ram, requests, rows);
        char rm[700];
        snprintf(rm, sizeof rm, "rm -rf '%s'", root);
        if (system(rm) != 0)
            fprintf(stderr, "push_bench: could not remove %s\n", root);
        if (prc < 0)
            fprintf(stderr, "push_bench: %s\n", kiln_errmsg());
        curl_global_cleanup();
        return prc < 0 ? 1 : 0;
    }
    server_t sv[2] = {{0}};
    serve_model_desc_t d;
    int rc = make_desc(&d);
    for (int i = 0; i < 2 && rc == 0; i++) {
        snprintf(sv[i].dir, sizeof sv[i].dir, "%s/ep%d", root, i);
        rc = server_start(bin, &sv[i], NULL);
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
    double fs = bench_median(full_s, runs), s100k = bench_median(d100k, runs), s1m = bench_median(d1m, runs);
    double peer_full = sink_bench((size_t)full_bytes, runs);
    double peer_100k = sink_bench((size_t)b100k, runs);
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
    if (peer_full > 0.0 && peer_100k > 0.0) {
        printf("  peer: the same bytes to 2 do-nothing libmicrohttpd sinks on loopback\n");
        printf("  full push    %7.3f s  %7.1f MB/s per endpoint: kiln-serve at %.2f of the "
               "transport bound\n",
               peer_full, (double)full_bytes / 1e6 / peer_full, peer_full / fs);
        printf("  delta 100k   %7.3f s: kiln-serve live in %.1fx the bare transfer time\n",
               peer_100k, s100k / peer_100k);
    } else {
        printf("  peer: the loopback sinks failed to start or answer\n");
    }
    curl_global_cleanup();
    return 0;
}
