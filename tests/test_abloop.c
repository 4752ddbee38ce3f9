/*
 * tests/test_abloop.c - the online A/B metrics as Kiln shows and uses them
 * (issue 28, the kilnd side), with the real programs: kiln-serve logging
 * impressions and joining feedback (--impressions-dir, --join-dir, a 1 s
 * feedback window), kilnd, kiln-train under mpirun and the kiln command, on
 * loopback ports 19540-19559. A simulated population sends predicts with
 * request keys and posts the clicks of its rows (kiln datagen's rows: their
 * labels are drawn from datagen's known click model). Covered:
 *   - `kiln endpoints`, `kiln --json endpoints`, /api/endpoints and the
 *     endpoints page show each label's online figures (rows, logloss, AUC,
 *     the difference from the base label with its interval), and an
 *     endpoint that accepts connections but never answers shows as
 *     unknown within the read's timeout;
 *   - kilnd's /metrics carries the same figures per endpoint, read and
 *     kept apart from the scrape, which the endpoint that hangs never
 *     holds up; promtool reads it;
 *   - push.promote_when: `kiln promote` refuses with the figures while the
 *     labels have too few joined rows, refuses the worse label, and
 *     promotes the better one once the rule holds;
 *   - the loop end to end: joined partitions land, a cron job (`@every 1s`,
 *     data.train on the join directory, ready: marker) retrains on them and
 *     pushes to B (kiln lineage from a partition file reaches B); after
 *     four cycles B's online logloss beats stale A's in kiln endpoints;
 *   - the loop under faults, with the same cron job retraining B on the
 *     join directory: a flood of duplicate clicks (flipped: a duplicate
 *     never changes a label), clicks on keys never served, late clicks, then
 *     the join directory and the impression directory full (each a 2 MiB
 *     tmpfs in a mount namespace of the test's own; skipped, saying so,
 *     where this user cannot mount): predicts answer, the drops and the
 *     failed joins are counted and logged once, and once there is room the
 *     join and the log go on. At the end kiln-serve's counters match what
 *     its answers said, every row logged is in one partition once with its
 *     first click's label, and every partition was trained on by exactly one
 *     succeeded run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "kiln.h"
#include "proc.h"
#include "state.h"

#define SERVE_PORT 19540
#define HANG_PORT 19541 /* listens, never answers */
#define WEB_PORT 19542
#define POP_MAX 4000

static char data_dir[256]; /* data/: day=0.tsv (training), eval.tsv, pop.tsv (the population) */
static char home[256];
static fx_kilnd_t kd;
static fx_serve_t srv; /* kiln-serve, with the loop on */
static const char *serve_url = srv.url;

/* The population: datagen rows, the label split from the features. */
static char *pop_feat[POP_MAX];
static int pop_y[POP_MAX], npop;

static int setup_all(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    proc_mpi_env(true);
    if (fx_train_tmpdir("abloop-data", data_dir, sizeof data_dir, 1200, 300, 7) < 0)
        return -1;
    char p[400];
    snprintf(p, sizeof p, "%s/data/pop.tsv", data_dir);
    int rc = fx_datagen(p, POP_MAX, 7, 2);
    size_t len;
    char *b = rc == 0 ? (char *)proc_read_file(p, &len) : NULL;
    for (char *l = b, *nl; l != NULL && npop < POP_MAX && (nl = strchr(l, '\n')) != NULL;
         l = nl + 1) {
        *nl = '\0';
        char *tab = strchr(l, '\t');
        if (tab == NULL)
            continue;
        pop_y[npop] = l[0] == '1';
        pop_feat[npop++] = strdup(tab + 1);
    }
    free(b);
    return rc == 0 && npop == POP_MAX ? 0 : -1;
}

static int teardown_all(void **state)
{
    (void)state;
    for (int i = 0; i < npop; i++)
        free(pop_feat[i]);
    curl_global_cleanup();
    return proc_tmpdir_done(data_dir);
}

/* Each test: a fresh home (kilnd's database, the specs, kiln-serve's
 * directories), left in *state for proc_tmpdir_teardown. */
static int setup(void **state)
{
    kd = (fx_kilnd_t){0};
    srv = (fx_serve_t){0};
    *state = home;
    return proc_tmpdir("abloop", home, sizeof home);
}

static int teardown(void **state)
{
    fx_stop_all();
    return proc_tmpdir_teardown(state);
}

/* ---- the parts ------------------------------------------------------------------------- */

/* Starts kiln-serve on SERVE_PORT with the loop on (1 s feedback window). */
static void serve_start(void)
{
    char dir[400], imp[400], join[400];
    snprintf(dir, sizeof dir, "%s/serve", home);
    snprintf(imp, sizeof imp, "%s/imp", home);
    snprintf(join, sizeof join, "%s/joined", home);
    const char *extra[] = {"--impressions-dir", imp,  "--join-dir", join,
                           "--feedback-window", "1s", NULL};
    srv.port = SERVE_PORT;
    assert_true(fx_serve_start_with(&srv, dir, extra));
}

/* A socket on HANG_PORT that takes connections (the kernel's backlog) and
 * never answers: an endpoint that hangs. */
static int hang_open(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(HANG_PORT)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 64), 0);
    return fd;
}

/* Writes home/<name>.yaml: an lr job named name with `body` after it. */
static void write_job(const char *name, const char *body, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s.yaml", home, name);
    fx_write(path,
             "name: %s\n"
             "resources: {ranks: 1, threads: 1}\n"
             "model: {type: lr, embedding: {dim: 4, capacity: 100000}}\n"
             "%s",
             name, body);
}

/* Runs `kiln args...`; its result into r (the caller's). */
static void kiln(proc_result_t *r, const char *const *args)
{
    fx_kiln(&kd, r, args);
}

static void kiln_ok(const char *const *args)
{
    proc_result_t *r = calloc(1, sizeof *r);
    kiln(r, args);
    if (r->code != 0)
        fail_msg("kiln %s exited %d: %s%s", args[0], r->code, r->err, r->out);
    free(r);
}

/* What label of model ctr holds on kiln-serve ("" nothing). */
static void holds(const char *label, char *out, size_t cap)
{
    fx_holds(&srv, "ctr", label, out, cap);
}

/* The newest checkpoint of job (uid into out; false: none yet). */
static bool newest_checkpoint(const char *job, char *out, size_t cap)
{
    state_t *st = NULL;
    if (state_open(kd.db, &st) < 0)
        return false;
    state_job_t j;
    state_checkpoint_t c;
    bool ok = false;
    if (state_job_get(st, job, &j) == 0) {
        if (state_checkpoint_latest(st, j.id, &c) == 0) {
            snprintf(out, cap, "%s", c.uid);
            ok = true;
            state_checkpoint_fini(&c);
        }
        state_job_fini(&j);
    }
    state_close(st);
    return ok;
}

/* Waits until label holds a checkpoint of job newer than `not` (""
 * anything); its uid into out. */
static void wait_label_holds_job(const char *label, const char *job, const char * not, char *out,
                                 size_t cap, int timeout_s)
{
    char h[80] = "", ck[80] = "";
    for (int i = 0; i < timeout_s * 10; i++) {
        if (newest_checkpoint(job, ck, sizeof ck) && strcmp(ck, not ) != 0) {
            holds(label, h, sizeof h);
            if (strcmp(h, ck) == 0) {
                snprintf(out, cap, "%s", ck);
                return;
            }
        }
        proc_sleep_ms(100);
    }
    fail_msg("label %s holds '%s', not a new checkpoint of %s ('%s'), after %d s (see "
             "%s/kilnd.log)",
             label, h, job, ck, timeout_s, home);
}

/* POSTs the predict of rows (taken) with request key to url; it must answer. */
static void predict_keyed(const char *url, const char *key, json_t *rows)
{
    json_t *req = json_pack("{s:o,s:s}", "rows", rows, "request_key", key);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    fx_reply_t r;
    long st = fx_http(&r, "POST", url, NULL, body, strlen(body), 10);
    if (st != 200)
        fail_msg("predict %s: HTTP %ld: %s", key, st, r.body ? r.body : "");
    fx_reply_fini(&r);
    free(body);
}

/* Serves rows [from, from + n) of the population to label with request keys
 * "<label><tag>-<batch>" (50 rows a request), then posts every row's click
 * (its datagen label). */
static void population(const char *label, const char *tag, int from, int n)
{
    char url[160];
    snprintf(url, sizeof url, "%s/v1/models/ctr/predict?label=%s", serve_url, label);
    json_t *fb = json_array();
    for (int b = from; b < from + n; b += 50) {
        char key[64];
        snprintf(key, sizeof key, "%s%s-%d", label, tag, b);
        json_t *rows = json_array();
        for (int i = b; i < b + 50 && i < from + n; i++) {
            json_array_append_new(rows, json_string(pop_feat[i % npop]));
            json_array_append_new(fb, json_pack("{s:s,s:i,s:i}", "request_key", key, "row", i - b,
                                                "label", pop_y[i % npop]));
        }
        predict_keyed(url, key, rows);
    }
    char *body = json_dumps(fb, JSON_COMPACT);
    json_decref(fb);
    snprintf(url, sizeof url, "%s/v1/models/ctr/feedback", serve_url);
    const char *h[] = {"Authorization: Bearer " FX_TOKEN, "Content-Type: application/json", NULL};
    fx_reply_t r;
    long st = fx_http(&r, "POST", url, h, body, strlen(body), 10);
    if (st != 200 || strstr(r.body, "\"unknown\": 0") == NULL)
        if (st != 200 || strstr(r.body, "\"unknown\":0") == NULL)
            fail_msg("feedback: HTTP %ld: %s", st, r.body ? r.body : "");
    fx_reply_fini(&r);
    free(body);
}

/* kiln-serve's online figures of label: joined rows (-1: none yet) and
 * logloss. */
static int64_t online_rows(const char *label, double *logloss)
{
    char url[160];
    snprintf(url, sizeof url, "%s/v1/models/ctr/online", serve_url);
    json_t *j = fx_get_json(url), *l;
    size_t i;
    int64_t n = -1;
    json_array_foreach(json_object_get(j, "labels"), i,
                       l) if (strcmp(json_string_value(json_object_get(l, "label")), label) == 0)
    {
        n = json_integer_value(json_object_get(l, "impressions"));
        if (logloss != NULL)
            *logloss = json_number_value(json_object_get(l, "logloss"));
    }
    json_decref(j);
    return n;
}

/* Waits until label has at least n joined rows. */
static void wait_joined(const char *label, int64_t n)
{
    int64_t got = -1;
    for (int i = 0; i < 200; i++) {
        if ((got = online_rows(label, NULL)) >= n)
            return;
        proc_sleep_ms(100);
    }
    fail_msg("label %s has %lld joined rows, not %lld, after 20 s", label, (long long)got,
             (long long)n);
}

/* The object of /api/endpoints-shaped doc for label (borrowed). */
static json_t *endpoint_of(json_t *doc, const char *label)
{
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(doc, "endpoints"), i,
                       e) if (strcmp(json_string_value(json_object_get(e, "label")), label) ==
                              0) return e;
    fail_msg("no endpoint with label %s", label);
    return NULL;
}

/* ---- the endpoints' online figures and push.promote_when ----------------------------------- */

/* The job of the promote test: A (auto: false) and B on kiln-serve, C on an
 * endpoint that hangs; `train` and whether A is pushed after a run vary. */
static void write_ab_job(const char *train, bool a_auto, char *path, size_t cap)
{
    char body[2000];
    snprintf(body, sizeof body,
             "data: {train: \"%s/data/day=0.tsv\", eval: \"%s/data/eval.tsv\"}\n"
             "train: %s\n"
             "export: {on_success: full}\n"
             "push:\n  token_env: KILN_TEST_TOKEN\n"
             "  promote_when: {online_logloss_better_by: 0.01, min_rows: 300}\n"
             "  endpoints:\n"
             "    - {url: \"%s\", model: ctr, label: A, auto: %s}\n"
             "    - {url: \"%s\", model: ctr, label: B}\n"
             "    - {url: \"http://127.0.0.1:%d\", model: ctr, label: C, auto: false}\n",
             data_dir, data_dir, train, serve_url, a_auto ? "true" : "false", serve_url, HANG_PORT);
    write_job("ab", body, path, cap);
}

/* `kiln promote --from from --to to` is refused (exit 5) with every text of
 * want (NULL-terminated) in its message, and to still holds `held`. */
static void promote_refused(proc_result_t *r, const char *from, const char *to,
                            const char *const *want, const char *held)
{
    const char *args[] = {"promote", "--model", "ctr", "--from", from, "--to", to, NULL};
    kiln(r, args);
    print_message("refused: %s", r->err);
    assert_int_equal(r->code, 5);
    for (; *want != NULL; want++)
        if (strstr(r->err, *want) == NULL)
            fail_msg("the refusal does not say '%s'", *want);
    char h[80];
    holds(to, h, sizeof h);
    assert_string_equal(h, held); /* nothing was pushed */
}

static void test_online_figures_and_promote_when(void **state)
{
    (void)state;
    int hang = hang_open();
    serve_start();
    kd.web_port = WEB_PORT;
    fx_kilnd_start(&kd, home, NULL);
    /* A and B first hold a model trained one step (close to a coin), then
     * B gets one trained four epochs from it. */
    char spec[400], c1[80], c2[80];
    write_ab_job("{batch_size: 64, max_steps: 1}", true, spec, sizeof spec);
    const char *sub[] = {"submit", spec, NULL};
    kiln_ok(sub);
    wait_label_holds_job("B", "ab", "", c1, sizeof c1, 120);
    wait_label_holds_job("A", "ab", "", c1, sizeof c1, 30);
    write_ab_job("{batch_size: 64, epochs: 2}", false, spec, sizeof spec);
    kiln_ok(sub);
    wait_label_holds_job("B", "ab", c1, c2, sizeof c2, 120);

    /* 150 rows each: the rule wants 300. */
    population("A", "x", 0, 150);
    population("B", "x", 0, 150);
    wait_joined("A", 150);
    wait_joined("B", 150);
    proc_result_t *r = calloc(1, sizeof *r);
    const char *why[] = {"too few joined rows", "B 150 rows, online logloss",
                         "A 150 rows, online logloss", "95% CI [", NULL};
    promote_refused(r, "B", "A", why, c1);

    /* 450 rows each: the worse label is refused, the better one promoted. */
    population("A", "y", 150, 300);
    population("B", "y", 150, 300);
    wait_joined("A", 450);
    wait_joined("B", 450);
    double lla = NAN, llb = NAN;
    online_rows("A", &lla);
    online_rows("B", &llb);
    print_message("online logloss A %.5f B %.5f\n", lla, llb);
    const char *worse[] = {"A is not better by 0.01", "A 450 rows", NULL};
    promote_refused(r, "A", "B", worse, c2);
    const char *promote_ba[] = {"promote", "--model", "ctr", "--from", "B", "--to", "A", NULL};
    kiln(r, promote_ba);
    print_message("promoted: %s%s", r->out, r->err);
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, "push.promote_when of job ab"));
    assert_non_null(strstr(r->out, "holds: B 450 rows"));
    char h[80];
    holds("A", h, sizeof h);
    assert_string_equal(h, c2);

    /* The endpoints' online figures: the CLI's table and JSON, the API and
     * the page; C hangs and shows as unknown, within its read's timeout. */
    const char *eps[] = {"endpoints", NULL};
    int64_t t0 = kiln_now_ms();
    kiln(r, eps);
    print_message("%s", r->out);
    assert_int_equal(r->code, 0);
    assert_true(kiln_now_ms() - t0 < 6000);
    assert_non_null(strstr(r->out, "ONLINE"));
    assert_non_null(strstr(r->out, "450 rows, ll "));
    assert_non_null(strstr(r->out, "vs A "));
    assert_non_null(strstr(r->out, "unknown"));
    const char *eps_json[] = {"--json", "endpoints", NULL};
    kiln(r, eps_json);
    assert_int_equal(r->code, 0);
    json_t *doc = json_loads(r->out, 0, NULL);
    assert_non_null(doc);
    json_t *oa = json_object_get(endpoint_of(doc, "A"), "online");
    json_t *ob = json_object_get(endpoint_of(doc, "B"), "online");
    json_t *oc = json_object_get(endpoint_of(doc, "C"), "online");
    assert_true(json_is_true(json_object_get(oa, "known")));
    assert_int_equal(json_integer_value(json_object_get(oa, "impressions")), 450);
    assert_int_equal(json_integer_value(json_object_get(ob, "impressions")), 450);
    assert_true(fabs(json_number_value(json_object_get(ob, "logloss")) - llb) < 1e-9);
    assert_string_equal(json_string_value(json_object_get(ob, "base")), "A");
    assert_true(fabs(json_number_value(json_object_get(ob, "logloss_diff")) - (llb - lla)) < 1e-9);
    assert_int_equal(json_array_size(json_object_get(ob, "ci95")), 2);
    assert_true(json_is_false(json_object_get(oc, "known")));
    assert_non_null(strstr(json_string_value(json_object_get(oc, "error")), "19541"));
    json_decref(doc);

    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/api/endpoints", WEB_PORT);
    t0 = kiln_now_ms();
    doc = fx_get_json(url);
    assert_non_null(doc);
    assert_true(kiln_now_ms() - t0 < 3000);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(endpoint_of(doc, "B"), "online"), "impressions")),
                     450);
    json_decref(doc);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/endpoints", WEB_PORT);
    char *page = fx_get(url);
    assert_non_null(page);
    assert_non_null(strstr(page, "<th>online logloss</th>"));
    assert_non_null(strstr(page, "<td class=\"num online-rows\">450</td>"));
    assert_non_null(strstr(page, "vs A ["));
    assert_non_null(strstr(page, "class=\"online unknown\""));
    free(page);

    /* kilnd's /metrics: the same figures, read by a thread of kilnd's own
     * and kept, so that no scrape waits on the endpoint that hangs. */
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", WEB_PORT);
    char want_b[200], *m = NULL;
    snprintf(want_b, sizeof want_b,
             "kiln_endpoint_online_impressions{endpoint=\"%s\",model=\"ctr\",label=\"B\"} 450\n",
             serve_url);
    for (int i = 0; i < 50 && (m == NULL || strstr(m, want_b) == NULL); i++) {
        free(m);
        t0 = kiln_now_ms();
        m = fx_get(url);
        assert_non_null(m);
        assert_true(kiln_now_ms() - t0 < 2000);
        if (strstr(m, want_b) == NULL)
            proc_sleep_ms(200);
    }
    if (strstr(m, want_b) == NULL)
        fail_msg("kilnd's /metrics lacks %s\n%s", want_b, m);
    char series[300];
    snprintf(series, sizeof series,
             "kiln_endpoint_online_logloss{endpoint=\"%s\",model=\"ctr\",label=\"B\"} ", serve_url);
    assert_non_null(strstr(m, series));
    assert_true(fabs(strtod(strstr(m, series) + strlen(series), NULL) - llb) < 1e-6);
    snprintf(series, sizeof series,
             "kiln_endpoint_online_logloss_diff{endpoint=\"%s\",model=\"ctr\",label=\"B\","
             "base=\"A\"} ",
             serve_url);
    assert_non_null(strstr(m, series));
    assert_true(fabs(strtod(strstr(m, series) + strlen(series), NULL) - (llb - lla)) < 1e-6);
    snprintf(series, sizeof series,
             "kiln_endpoint_online_up{endpoint=\"http://127.0.0.1:%d\",model=\"ctr\",label=\"C\"} "
             "0\n",
             HANG_PORT);
    assert_non_null(strstr(m, series));
    fx_promtool_check(home, "kilnd-metrics", m, strlen(m));
    free(m);

    /* kiln show of the run whose checkpoint B holds: its endpoints' figures. */
    state_t *st = NULL;
    state_run_t *runs = NULL;
    size_t nr = 0;
    assert_int_equal(state_open(kd.db, &st), 0);
    assert_int_equal(state_run_list(st, "ab", 1, &runs, &nr), 0);
    assert_int_equal(nr, 1);
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)runs[0].id);
    state_runs_free(runs, nr);
    state_close(st);
    const char *show[] = {"show", id, NULL};
    kiln(r, show);
    print_message("%s", r->out);
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, "online A/B (read now"));
    assert_non_null(strstr(r->out, "(ctr/B): 450 rows, ll "));
    assert_non_null(strstr(r->out, "(ctr/A): 450 rows, ll "));
    free(r);
    close(hang);
}

/* ---- the loop, end to end -------------------------------------------------------------- */

static void test_loop_end_to_end(void **state)
{
    (void)state;
    serve_start();
    fx_kilnd_start(&kd, home, NULL);
    /* A and B start with a model trained one step: A stays so (stale). */
    char spec[400], body[2000], c0[80], ck[80];
    snprintf(body, sizeof body,
             "data: {train: \"%s/data/day=0.tsv\"}\n"
             "train: {batch_size: 64, max_steps: 1}\n"
             "export: {on_success: full}\n"
             "push:\n  token_env: KILN_TEST_TOKEN\n  endpoints:\n"
             "    - {url: \"%s\", model: ctr, label: A}\n"
             "    - {url: \"%s\", model: ctr, label: B}\n",
             data_dir, serve_url, serve_url);
    write_job("seed", body, spec, sizeof spec);
    const char *sub[] = {"submit", spec, NULL};
    kiln_ok(sub);
    wait_label_holds_job("B", "seed", "", c0, sizeof c0, 120);
    wait_label_holds_job("A", "seed", "", c0, sizeof c0, 30);

    /* The retraining job: every second, the joined partitions not trained
     * on yet, to B. */
    snprintf(body, sizeof body,
             "schedule: \"@every 1s\"\n"
             "data: {train: \"%s/joined/ctr/part=*/part-*.tsv\", incremental: true, "
             "ready: marker}\n"
             "train: {batch_size: 64, epochs: 2}\n"
             "export: {on_success: incremental}\n"
             "push:\n  token_env: KILN_TEST_TOKEN\n  endpoints:\n"
             "    - {url: \"%s\", model: ctr, label: A, auto: false}\n"
             "    - {url: \"%s\", model: ctr, label: B}\n",
             home, serve_url, serve_url);
    write_job("retrain", body, spec, sizeof spec);
    kiln_ok(sub);

    /* Cycles: the population is served by A and B and clicks; the joined
     * rows land; B is retrained on them. */
    const int per = 200, cycles = 4;
    ck[0] = '\0';
    for (int c = 0; c < cycles; c++) {
        char tag[16], prev[80];
        snprintf(tag, sizeof tag, "c%d", c);
        population("A", tag, c * per, per);
        population("B", tag, c * per, per);
        wait_joined("B", (int64_t)(c + 1) * per);
        snprintf(prev, sizeof prev, "%s", ck);
        wait_label_holds_job("B", "retrain", prev, ck, sizeof ck, 60);
        double lla = NAN, llb = NAN;
        online_rows("A", &lla);
        online_rows("B", &llb);
        print_message("cycle %d: B holds %s; online logloss A %.5f B %.5f\n", c, ck, lla, llb);
    }
    /* The first joined partition was trained on by the retraining job, and
     * what it trained reaches B (kiln lineage from the file). */
    char pat[400];
    snprintf(pat, sizeof pat, "%s/joined/ctr/part=*/part-0.tsv", home);
    glob_t g;
    assert_int_equal(glob(pat, 0, NULL, &g), 0);
    assert_true(g.gl_pathc >= (size_t)cycles);
    proc_result_t *lr = calloc(1, sizeof *lr);
    const char *lin[] = {"lineage", g.gl_pathv[0], NULL};
    kiln(lr, lin);
    print_message("%s", lr->out);
    assert_int_equal(lr->code, 0);
    assert_non_null(strstr(lr->out, "retrain"));
    assert_non_null(strstr(lr->out, "ctr/B"));
    free(lr);
    globfree(&g);

    /* After the cycles B, trained on what the population did, beats A. */
    population("A", "z", cycles * per, 400);
    population("B", "z", cycles * per, 400);
    wait_joined("A", (int64_t)cycles * per + 400);
    wait_joined("B", (int64_t)cycles * per + 400);
    double lla = NAN, llb = NAN;
    online_rows("A", &lla);
    online_rows("B", &llb);
    print_message("online logloss A %.5f B %.5f\n", lla, llb);
    assert_true(llb < lla);
    proc_result_t *r = calloc(1, sizeof *r);
    const char *eps[] = {"endpoints", NULL};
    kiln(r, eps);
    print_message("%s", r->out);
    assert_int_equal(r->code, 0);
    assert_non_null(strstr(r->out, "ONLINE"));
    char want[64];
    snprintf(want, sizeof want, "%d rows, ll ", cycles * per + 400);
    assert_non_null(strstr(r->out, want));
    assert_non_null(strstr(r->out, "vs A -"));
    free(r);
}

/* ---- the loop under faults (issue 28.5, the second test) ------------------------------- */

static char tiny_imp[400], tiny_join[400]; /* mounted tmpfs (""), unmounted at teardown */

/* Mounts a 2 MiB tmpfs on dir, in a mount namespace of the test's own
 * (unshare -m, so nothing outside sees it; the programs the test starts
 * next inherit it). False, having mounted nothing, where this user cannot. */
static bool mount_tiny(const char *dir)
{
    static bool ns;
    assert_int_equal(kiln_mkdir_p(dir), 0);
    if (!ns && (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0))
        return false;
    ns = true;
    return mount("kiln-test-tiny", dir, "tmpfs", 0, "size=2m") == 0;
}

static int teardown_faults(void **state)
{
    fx_stop_all();
    if (tiny_imp[0])
        umount2(tiny_imp, MNT_DETACH);
    if (tiny_join[0])
        umount2(tiny_join, MNT_DETACH);
    tiny_imp[0] = tiny_join[0] = '\0';
    return proc_tmpdir_teardown(state);
}

/* Fills the file system of dir: dir/filler grows until the disk says no. */
static void fill(const char *dir)
{
    char p[480];
    snprintf(p, sizeof p, "%s/filler", dir);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    static char zeros[4096];
    while (fwrite(zeros, 1, sizeof zeros, f) == sizeof zeros)
        ;
    fclose(f); /* its last write fails too: ENOSPC */
}

static void unfill(const char *dir)
{
    char p[480];
    snprintf(p, sizeof p, "%s/filler", dir);
    assert_int_equal(unlink(p), 0);
}

/* The value of kiln-serve's /metrics sample that starts with prefix (-1: none). */
static double serve_metric(const char *prefix)
{
    char url[128];
    snprintf(url, sizeof url, "%s/metrics", serve_url);
    return fx_metric(url, prefix);
}

/* Predicts population rows [from, from + n) on B, keys "<tag>-<batch>", 50
 * rows a request; every predict must answer. */
static void serve_rows(const char *tag, int from, int n)
{
    char url[160];
    snprintf(url, sizeof url, "%s/v1/models/ctr/predict?label=B", serve_url);
    for (int b = from; b < from + n; b += 50) {
        char key[64];
        snprintf(key, sizeof key, "%s-%d", tag, b);
        json_t *rows = json_array();
        for (int i = b; i < b + 50 && i < from + n; i++)
            json_array_append_new(rows, json_string(pop_feat[i]));
        predict_keyed(url, key, rows);
    }
}

/* The feedback tallies the answers gave, by result (and 507: refused,
 * nothing stored). */
typedef struct tally {
    int64_t accepted, duplicate, unknown, late, refused;
} tally_t;

/* Posts the clicks of rows [from, from + n) of tag (their datagen label,
 * flipped when flip) and `unknown` items with keys never served; the
 * answer's counts are added to t and returned in *got (may be NULL). */
static long post_clicks(tally_t *t, const char *tag, int from, int n, bool flip, int unknown,
                        tally_t *got)
{
    json_t *fb = json_array();
    for (int i = from; i < from + n; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s-%d", tag, from + (i - from) / 50 * 50);
        json_array_append_new(fb, json_pack("{s:s,s:i,s:i}", "request_key", key, "row",
                                            (i - from) % 50, "label", pop_y[i] ^ flip));
    }
    for (int i = 0; i < unknown; i++) {
        char key[64];
        snprintf(key, sizeof key, "never-served-%s-%d", tag, i);
        json_array_append_new(fb,
                              json_pack("{s:s,s:i,s:i}", "request_key", key, "row", 0, "label", 1));
    }
    char *body = json_dumps(fb, JSON_COMPACT), url[160];
    json_decref(fb);
    snprintf(url, sizeof url, "%s/v1/models/ctr/feedback", serve_url);
    const char *h[] = {"Authorization: Bearer " FX_TOKEN, "Content-Type: application/json", NULL};
    fx_reply_t r;
    long st = fx_http(&r, "POST", url, h, body, strlen(body), 10);
    free(body);
    tally_t a = {0};
    if (st == 200) {
        json_t *j = json_loads(r.body, 0, NULL);
        a.accepted = json_integer_value(json_object_get(j, "accepted"));
        a.duplicate = json_integer_value(json_object_get(j, "duplicate"));
        a.unknown = json_integer_value(json_object_get(j, "unknown"));
        a.late = json_integer_value(json_object_get(j, "late"));
        json_decref(j);
    } else if (st == 507) {
        a.refused = 1;
    } else {
        fail_msg("feedback %s: HTTP %ld: %s", tag, st, r.body ? r.body : "");
    }
    fx_reply_fini(&r);
    t->accepted += a.accepted, t->duplicate += a.duplicate, t->unknown += a.unknown;
    t->late += a.late, t->refused += a.refused;
    if (got != NULL)
        *got = a;
    return st;
}

/* Waits until kiln-serve's /metrics sample prefix is at least want. */
static double wait_serve_metric(const char *prefix, double want, int timeout_s)
{
    double v = -1;
    for (int i = 0; i < timeout_s * 10 && (v = serve_metric(prefix)) < want; i++)
        proc_sleep_ms(100);
    if (v < want)
        fail_msg("%s is %g, not %g, after %d s", prefix, v, want, timeout_s);
    return v;
}

static void test_loop_faults(void **state)
{
    (void)state;
    char imp[400], join[400];
    snprintf(imp, sizeof imp, "%s/imp", home);
    snprintf(join, sizeof join, "%s/joined", home);
    bool tiny = mount_tiny(imp);
    if (tiny) {
        snprintf(tiny_imp, sizeof tiny_imp, "%s", imp);
        tiny = mount_tiny(join);
        if (tiny)
            snprintf(tiny_join, sizeof tiny_join, "%s", join);
    }
    if (!tiny)
        print_message("cannot mount a small tmpfs here (%s): the full-disk part is skipped\n",
                      strerror(errno));
    /* A seed partition in the join directory, so that the retraining job's
     * first run puts a model on B. */
    char seed[480], src[400], p[520];
    snprintf(seed, sizeof seed, "%s/ctr/part=0000000000000", join);
    assert_int_equal(kiln_mkdir_p(seed), 0);
    snprintf(src, sizeof src, "%s/data/day=0.tsv", data_dir);
    snprintf(p, sizeof p, "%s/part-0.tsv", seed);
    assert_int_equal(fx_land(src, p), 0);
    snprintf(p, sizeof p, "%s/_SUCCESS", seed);
    fx_write(p, "%s", "");

    char dir[400];
    snprintf(dir, sizeof dir, "%s/serve", home);
    const char *extra[] = {"--impressions-dir", imp,  "--join-dir", join,
                           "--feedback-window", "2s", NULL};
    srv.port = SERVE_PORT;
    assert_true(fx_serve_start_with(&srv, dir, extra));
    fx_kilnd_start(&kd, home, NULL);
    char spec[400], body[2000], ck[80] = "", prev[80];
    snprintf(body, sizeof body,
             "schedule: \"@every 1s\"\n"
             "data: {train: \"%s/ctr/part=*/part-*.tsv\", incremental: true, ready: marker}\n"
             "train: {batch_size: 64}\n"
             "export: {on_success: incremental}\n"
             "push:\n  token_env: KILN_TEST_TOKEN\n  endpoints:\n"
             "    - {url: \"%s\", model: ctr, label: B}\n",
             join, serve_url);
    write_job("retrain", body, spec, sizeof spec);
    const char *sub[] = {"submit", spec, NULL};
    kiln_ok(sub);
    wait_label_holds_job("B", "retrain", "", ck, sizeof ck, 120);

    /* Served, clicked, then the same clicks again (flipped: a duplicate must
     * not change a label), a flood of them, and clicks on keys never served. */
    tally_t t = {0}, a;
    const int per = 200;
    int64_t positives = 0, served = 0;
    serve_rows("p1", 0, per);
    served += per;
    post_clicks(&t, "p1", 0, per, false, 50, &a);
    assert_int_equal(a.accepted, per);
    assert_int_equal(a.unknown, 50);
    for (int i = 0; i < per; i++)
        positives += pop_y[i];
    for (int k = 0; k < 20; k++) {
        post_clicks(&t, "p1", 0, per, true, 20, &a);
        assert_int_equal(a.duplicate, per);
        assert_int_equal(a.unknown, 20);
    }
    /* Joined; clicks now are late. */
    wait_joined("B", per);
    post_clicks(&t, "p1", 0, per, true, 0, &a);
    assert_int_equal(a.late, per);

    int64_t dropped = 0;
    if (tiny) {
        /* The join directory fills up: the segment stays, the join fails
         * (counted) and is retried. */
        serve_rows("p2", per, per);
        served += per;
        post_clicks(&t, "p2", per, per, false, 0, &a);
        assert_int_equal(a.accepted, per);
        for (int i = per; i < 2 * per; i++)
            positives += pop_y[i];
        fill(join);
        wait_serve_metric("kiln_serve_join_failures_total{model=\"ctr\"} ", 1, 30);
        assert_int_equal(online_rows("B", NULL), per); /* nothing joined, nothing counted */
        /* The impression disk fills up too: predicts answer, the rows are
         * dropped (counted); clicks on them are unknown, or refused (507)
         * where some were logged and the feedback log cannot grow. */
        fill(imp);
        double logged0 = serve_metric("kiln_serve_impressions_logged_total{model=\"ctr\"} ");
        serve_rows("p3", 2 * per, per);
        const char *dprefix = "kiln_serve_impressions_dropped_total{reason=\"disk\"} ";
        double logged = 0;
        for (int i = 0; i < 100 && logged + dropped < per; i++, proc_sleep_ms(50)) {
            dropped = (int64_t)serve_metric(dprefix);
            logged = serve_metric("kiln_serve_impressions_logged_total{model=\"ctr\"} ") - logged0;
        }
        print_message("disk full: %lld of %d rows dropped, %g logged\n", (long long)dropped, per,
                      logged);
        assert_true(dropped > 0);
        assert_true(logged + (double)dropped == per);
        served += (int64_t)logged;
        tally_t before = t;
        post_clicks(&t, "p3", 2 * per, per, false, 0, &a);
        if (a.refused == 0) {
            assert_int_equal(a.unknown, dropped);
            assert_int_equal(a.accepted, (int64_t)logged);
            for (int i = 2 * per; i < 3 * per && logged > 0; i++)
                positives += pop_y[i]; /* all or none of p3 was logged: one segment */
        } else {
            assert_int_equal(t.accepted, before.accepted);
        }
        /* Room again: the join goes on, logging goes on. */
        unfill(join);
        unfill(imp);
        wait_joined("B", served);
    }
    serve_rows("p4", 3 * per, per);
    served += per;
    post_clicks(&t, "p4", 3 * per, per, false, 0, &a);
    assert_int_equal(a.accepted, per);
    for (int i = 3 * per; i < 4 * per; i++)
        positives += pop_y[i];
    wait_joined("B", served);

    /* kiln-serve counted what it answered. */
    static const char *const res[] = {"accepted", "duplicate", "unknown", "late"};
    const int64_t want[] = {t.accepted, t.duplicate, t.unknown, t.late};
    for (int k = 0; k < 4; k++) {
        char prefix[128];
        snprintf(prefix, sizeof prefix, "kiln_serve_feedback_total{model=\"ctr\",result=\"%s\"} ",
                 res[k]);
        if (serve_metric(prefix) != (double)want[k])
            fail_msg("%s is %g, the answers said %lld", prefix, serve_metric(prefix),
                     (long long)want[k]);
    }
    assert_true(serve_metric("kiln_serve_impressions_logged_total{model=\"ctr\"} ") == served);
    assert_true(serve_metric("kiln_serve_impressions_dropped_total{reason=\"disk\"} ") ==
                (double)dropped);

    /* Every row served and logged is in one partition, once, with its first
     * click's label; every partition is trained on by one run, once. */
    char pat[480];
    snprintf(pat, sizeof pat, "%s/ctr/part=*/part-0.tsv", join);
    int64_t rows = 0, pos = 0;
    glob_t g;
    assert_int_equal(glob(pat, 0, NULL, &g), 0);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        if (strstr(g.gl_pathv[i], "part=0000000000000/") != NULL)
            continue; /* the seed */
        size_t len;
        char *b = (char *)proc_read_file(g.gl_pathv[i], &len);
        for (char *l = b; l < b + len; l = strchr(l, '\n') + 1) {
            rows++;
            pos += l[0] == '1';
        }
        free(b);
    }
    print_message("%zu partitions: %lld rows, %lld positive; served and logged %lld, clicked "
                  "%lld\n",
                  g.gl_pathc - 1, (long long)rows, (long long)pos, (long long)served,
                  (long long)positives);
    assert_int_equal(rows, served);
    assert_int_equal(pos, positives);
    /* The retraining job takes the last partition, then each was read by
     * exactly one succeeded run. */
    snprintf(prev, sizeof prev, "%s", ck);
    state_t *st = fx_kilnd_db(&kd);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        int64_t *ids = NULL;
        size_t n = 0;
        for (int k = 0; k < 600 && n == 0; k++) {
            assert_int_equal(state_input_runs(st, g.gl_pathv[i], 10, &ids, &n), 0);
            if (n == 0) {
                free(ids);
                proc_sleep_ms(100);
            }
        }
        int ok = 0;
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(fx_wait_run(st, ids[k], STATE_RUN_NSTATES, 120), STATE_RUN_SUCCEEDED);
            ok++;
        }
        free(ids);
        if (ok != 1)
            fail_msg("%s was trained on by %d runs, not 1 (see %s)", g.gl_pathv[i], ok, home);
    }
    state_close(st);
    globfree(&g);
    wait_label_holds_job("B", "retrain", prev, ck, sizeof ck, 60);

    /* What kiln-serve logged about it, once each. */
    char log[500];
    snprintf(log, sizeof log, "%s.log", srv.dir);
    size_t len;
    char *text = (char *)proc_read_file(log, &len);
    if (tiny) {
        assert_non_null(strstr(text, "dropping impressions (disk)"));
        assert_null(
            strstr(strstr(text, "dropping impressions (disk)") + 1, "dropping impressions (disk)"));
        assert_non_null(strstr(text, "logging again after disk drops"));
        assert_non_null(strstr(text, "join of ctr works again"));
    }
    free(text);
}

PROC_TEST_MAIN(setup_all, teardown_all,
               cmocka_unit_test_setup_teardown(test_online_figures_and_promote_when, setup,
                                               teardown),
               cmocka_unit_test_setup_teardown(test_loop_end_to_end, setup, teardown),
               cmocka_unit_test_setup_teardown(test_loop_faults, setup, teardown_faults))
