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
 *     four cycles B's online logloss beats stale A's in kiln endpoints.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <glob.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        json_t *req = json_pack("{s:o,s:s}", "rows", rows, "request_key", key);
        char *body = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        fx_reply_t r;
        long st = fx_http(&r, "POST", url, NULL, body, strlen(body), 10);
        if (st != 200)
            fail_msg("predict on %s: HTTP %ld: %s", label, st, r.body ? r.body : "");
        fx_reply_fini(&r);
        free(body);
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
             "kiln_endpoint_online_logloss{endpoint=\"%s\",model=\"ctr\",label=\"B\"} ",
             serve_url);
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

PROC_TEST_MAIN(setup_all, teardown_all,
               cmocka_unit_test_setup_teardown(test_online_figures_and_promote_when, setup,
                                               teardown),
               cmocka_unit_test_setup_teardown(test_loop_end_to_end, setup, teardown))
