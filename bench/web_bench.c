/*
 * bench/web_bench.c - latency of the status page, the JSON API and /metrics
 * with 100k runs in the database (docs/benchmarks.md, "Web").
 *
 * Builds a fresh database in a temp directory: 10 jobs and N runs (default
 * 100000) in every state, with samples/s and eval logloss metric rows, a
 * checkpoint chain and endpoints, written in bulk with one SQL statement
 * through state/'s test hook (the triggers of the schema keep the aggregate
 * tables exactly as live writes would). Then serves it with web_start (4
 * threads) and sends each route R times (default 300) over one keep-alive
 * libcurl connection, measuring each request end to end on the client.
 * Prints a markdown table of median and p99 per route; exits 1 when a p99 is
 * above the 20 ms budget.
 *
 *   build/bench/web_bench [--runs N] [--reps R]
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "state.h"
#include "state_test.h" /* state_test_exec: bulk rows for the benchmark */
#include "web.h"

static size_t sink(char *p, size_t sz, size_t n, void *ud)
{
    *(size_t *)ud += sz * n;
    return sz * n;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long nruns = 100000, reps = 300;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--runs") == 0)
            nruns = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atol(argv[i + 1]);
    }
    char dir[] = "/tmp/kiln-web-bench-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 2;
    char db[128];
    snprintf(db, sizeof db, "%s/kiln.db", dir);
    state_t *st = NULL;
    if (state_open(db, &st) < 0) {
        fprintf(stderr, "%s\n", kiln_errmsg());
        return 2;
    }
    int64_t t0 = kiln_mono_ns();
    char sql[4096];
    snprintf(sql, sizeof sql,
             "BEGIN;"
             "WITH RECURSIVE j(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM j WHERE x < 10)"
             " INSERT INTO jobs (name, spec_yaml, spec_hash, schedule, priority, version, paused,"
             " created_at, updated_at, last_scheduled_at) SELECT 'job' || x, 'name: job' || x,"
             " '00000000000000' || printf('%%02d', x), '@hourly', 0, 1, 0, 1700000000,"
             " 1700000000, 0 FROM j;"
             "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < %ld)"
             " INSERT INTO runs (job_id, job_version, state, trigger, attempt, scheduled_at,"
             " queued_at, started_at, ended_at, exit_code, error, run_dir, host)"
             " SELECT 1 + x %% 10, 1, CASE WHEN x > %ld - 5 THEN 'running'"
             " WHEN x > %ld - 20 THEN 'queued' WHEN x %% 13 = 0 THEN 'failed'"
             " WHEN x %% 31 = 0 THEN 'canceled' ELSE 'succeeded' END,"
             " 'cron', 1, 1700000000 + x * 60, 1700000000 + x * 60,"
             " CASE WHEN x > %ld - 20 AND x <= %ld - 5 THEN 0 ELSE 1700000005 + x * 60 END,"
             " CASE WHEN x > %ld - 20 THEN 0 ELSE 1700000005 + x * 60 + x %% 3600 END,"
             " CASE WHEN x %% 13 = 0 THEN 1 ELSE 0 END,"
             " CASE WHEN x %% 13 = 0 THEN 'rank 1 on host-a: exited with status 1' END,"
             " NULL, 'host-a' FROM c;"
             "INSERT INTO metrics (run_id, step, name, value, at)"
             " SELECT id, 100, 'samples_per_s', 50000 + id %% 1000, ended_at FROM runs;"
             "INSERT INTO metrics (run_id, step, name, value, at)"
             " SELECT id, 100, 'eval_logloss', 0.45 + (id %% 100) / 1000.0, ended_at FROM runs;"
             "INSERT INTO metrics (run_id, step, name, value, at)"
             " SELECT %ld, s.x, 'loss', 0.7 - s.x / 20000.0, 1700000000 FROM"
             " (WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < 2000)"
             " SELECT x FROM s) s;"
             "COMMIT;",
             nruns, nruns, nruns, nruns, nruns, nruns, nruns / 2);
    if (state_test_exec(st, sql) < 0) {
        fprintf(stderr, "bulk insert: %s\n", kiln_errmsg());
        return 2;
    }
    /* A checkpoint chain, exports and A/B endpoints, through the API. */
    int64_t parent = 0, ep[2];
    state_endpoint_put(st, "http://127.0.0.1:9001", "m", "A", &ep[0]);
    state_endpoint_put(st, "http://127.0.0.1:9002", "m", "B", &ep[1]);
    int64_t last_ckpt = 0;
    for (int i = 0; i < 20; i++) {
        char uid[32], path[64];
        snprintf(uid, sizeof uid, "ck-%04d", i);
        snprintf(path, sizeof path, "/ck/%s", uid);
        state_checkpoint_t c = {.uid = uid, .run_id = nruns / 2, .parent_id = parent,
                                .kind = (char *)(parent ? "incremental" : "full"), .path = path,
                                .step = i * 100, .keys = 1000, .bytes = 1 << 20,
                                .created_at = 1700000000 + i};
        int64_t id, push;
        state_checkpoint_add(st, &c, &id);
        state_push_req_t req = {i % 2 ? "http://127.0.0.1:9002" : "http://127.0.0.1:9001", "m",
                                i % 2 ? "B" : "A", id, false, "bench", NULL, false};
        state_push_outcome_t o = {.state = i % 5 != 4 ? STATE_PUSH_SUCCEEDED : STATE_PUSH_FAILED,
                                  .http_status = i % 5 != 4 ? 200 : 503, .attempts = 1,
                                  .sent = true, .bytes = 100};
        state_push_enqueue(st, 0, nruns / 2, &req, 1, "bench", 60000, &push);
        state_push_end(st, push, "bench", &o);
        parent = id;
        last_ckpt = id;
    }
    state_close(st);
    double load_s = (double)(kiln_mono_ns() - t0) / 1e9;

    web_config_t cfg;
    web_config_init(&cfg);
    cfg.db_path = db;
    cfg.listen = "127.0.0.1:0";
    web_t *w = NULL;
    if (web_start(&cfg, &w) < 0) {
        fprintf(stderr, "web_start: %s\n", kiln_errmsg());
        return 2;
    }
    char routes[][96] = {"/jobs",     "/runs",        "/runs?before=%ld",
                         "/runs?job=job3&state=failed", "/runs/%ld", "/endpoints",
                         "/lineage/checkpoint/%ld",     "/api/jobs", "/api/runs",
                         "/api/runs?before=%ld",        "/api/runs/%ld", "/metrics"};
    long args[] = {0, 0, nruns / 3, 0, nruns / 2, 0, last_ckpt, 0, 0, nruns / 3, nruns / 2, 0};
    size_t nroutes = sizeof routes / sizeof routes[0];
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    int64_t *lat = calloc((size_t)reps, sizeof *lat);
    int over = 0;
    printf("web_bench: %ld runs (%ld metric rows), loaded in %.1f s; %ld requests per route, "
           "one keep-alive connection, web threads %d\n\n",
           nruns, 2 * nruns + 2000, load_s, reps, cfg.threads);
    printf("| route | bytes | median ms | p99 ms |\n|---|---:|---:|---:|\n");
    for (size_t i = 0; i < nroutes; i++) {
        char path[128], url[192];
        snprintf(path, sizeof path, routes[i], args[i]);
        snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)web_port(w), path);
        size_t bytes = 0;
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &bytes);
        for (long k = 0; k < reps + 5; k++) { /* 5 warm-up requests */
            bytes = 0;
            int64_t a = kiln_mono_ns();
            CURLcode cc = curl_easy_perform(c);
            int64_t b = kiln_mono_ns();
            long status = 0;
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
            if (cc != CURLE_OK || status != 200) {
                fprintf(stderr, "%s: %s, HTTP %ld\n", path, curl_easy_strerror(cc), status);
                return 2;
            }
            if (k >= 5)
                lat[k - 5] = b - a;
        }
        qsort(lat, (size_t)reps, sizeof *lat, cmp_i64);
        double med = (double)lat[reps / 2] / 1e6;
        double p99 = (double)lat[(size_t)((double)reps * 0.99) < (size_t)reps
                                     ? (size_t)((double)reps * 0.99)
                                     : (size_t)reps - 1] /
                     1e6;
        over += p99 > 20.0;
        printf("| `%s` | %zu | %.2f | %.2f |\n", path, bytes, med, p99);
    }
    curl_easy_cleanup(c);
    curl_global_cleanup();
    web_stop(w);
    free(lat);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("\n%s\n", over ? "FAIL: a p99 is above 20 ms" : "ok: every p99 is under 20 ms");
    return over ? 1 : 0;
}
