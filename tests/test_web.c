/*
 * tests/test_web.c - the web server over real HTTP (libcurl): every page and
 * API route against the fixture database, HTML escaping of hostile values,
 * self-refresh of running runs, keyset pagination over more than a page,
 * the token rule (401 without it, nothing changes on GET), cancel / retry /
 * submit, the limits (413, 404, 405, 400), the Host check, /metrics read
 * back by a real Prometheus parser (promtool; that one test is skipped when
 * it is absent), and a real kilnd under slow clients.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <curl/curl.h>
#include <jansson.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixtures.h"
#include "kiln.h"
#include "proc.h"
#include "state.h"
#include "web.h"
#include "web_fixture.h"


#define TOKEN "s3cret-token"

static web_fixture_t fx;

typedef fx_reply_t reply_t;

/* Sends method path to the server under test (body and extra headers, each
 * may be NULL); fails when no answer came. */
static void http(reply_t *r, const char *method, const char *path, const char *body,
                 const char *const *headers)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", fx.base, path);
    if (fx_http(r, method, url, headers, body, body != NULL ? strlen(body) : 0, 10) == 0)
        fail_msg("%s %s: no answer", method, path);
}

/* Sends method path (body and headers may be NULL); the status must be
 * want. */
static void expect_status(const char *method, const char *path, const char *body,
                          const char *const *headers, long want)
{
    reply_t r;
    http(&r, method, path, body, headers);
    if (r.status != want)
        fail_msg("%s %s: %ld, want %ld: %s", method, path, r.status, want, r.body);
    free(r.body);
}

static void get(reply_t *r, const char *path)
{
    http(r, "GET", path, NULL, NULL);
}

static void reply_free(reply_t *r) { fx_reply_fini(r); }

static json_t *get_json(const char *path, long want_status)
{
    reply_t r;
    get(&r, path);
    if (r.status != want_status)
        fail_msg("GET %s: %ld, want %ld: %s", path, r.status, want_status, r.body);
    assert_string_equal(r.ctype, "application/json");
    json_error_t err;
    json_t *doc = json_loads(r.body, 0, &err);
    if (doc == NULL)
        fail_msg("GET %s: not JSON (%s): %s", path, err.text, r.body);
    reply_free(&r);
    return doc;
}

static const char *run_state(int64_t id)
{
    static char buf[32];
    char path[64];
    snprintf(path, sizeof path, "/api/runs/%lld", (long long)id);
    json_t *doc = get_json(path, 200);
    snprintf(buf, sizeof buf, "%s", json_string_value(json_object_get(json_object_get(doc, "run"), "state")));
    json_decref(doc);
    return buf;
}

static int setup(void **state)
{
    web_config_t cfg;
    web_config_init(&cfg);
    cfg.token = TOKEN;
    cfg.threads = 3;
    cfg.max_body = 64 * 1024;
    if (web_fixture_start(&fx, "web", &cfg) < 0)
        return -1;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return 0;
}

static int teardown(void **state)
{
    web_fixture_stop(&fx);
    curl_global_cleanup();
    return 0;
}

/* ---- pages ------------------------------------------------------------------------------ */

/* GETs path into r: the status must be want and the body must hold each
 * string of has and none of lacks (NULL-ended, each may be NULL). r is
 * left for more checks (reply_free). */
static void expect_page(reply_t *r, const char *path, long want, const char *const *has,
                        const char *const *lacks)
{
    get(r, path);
    if (r->status != want)
        fail_msg("GET %s: %ld, want %ld", path, r->status, want);
    for (size_t i = 0; has != NULL && has[i] != NULL; i++)
        if (strstr(r->body, has[i]) == NULL)
            fail_msg("%s lacks %s", path, has[i]);
    for (size_t i = 0; lacks != NULL && lacks[i] != NULL; i++)
        if (strstr(r->body, lacks[i]) != NULL)
            fail_msg("%s holds %s", path, lacks[i]);
}

static void test_pages(void **state)
{
    char p[6][64];
    snprintf(p[0], 64, "/runs/%lld", (long long)fx.run_ok);
    snprintf(p[1], 64, "/lineage/checkpoint/%lld", (long long)fx.ckpt_incr);
    snprintf(p[2], 64, "/lineage/endpoint/%lld", (long long)fx.ep_a);
    snprintf(p[3], 64, "/runs/%lld/loss.svg", (long long)fx.run_ok);
    reply_t r;
    static const char *fixed[][2] = {
        {"/", "<table id=\"jobs\""},          {"/jobs", "@hourly"},
        {"/runs", "<table id=\"runs\""},      {"/endpoints", "<table id=\"endpoints\""},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        const char *has[] = {fixed[i][1], NULL};
        expect_page(&r, fixed[i][0], 200, has, NULL);
        assert_string_equal(r.ctype, "text/html; charset=utf-8");
        reply_free(&r);
    }
    /* The run page: timeline, loss plot from progress.jsonl, figures from
     * result.json, inputs, checkpoints, pushes (the failed one to B: 503),
     * the log tail (escaped); no refresh, since it ended. */
    static const char *run_has[] = {
        "<table id=\"timeline\"", "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"loss-plot\"",
        "<polyline class=\"series\"", "51234", "0.46125", "/data/day=0/part-0.tsv", "ck-0001",
        "ck-0002", "http://127.0.0.1:9001",
        "done &lt;ok&gt; &amp; &quot;quoted&quot;", "running -&gt; succeeded", "503", NULL};
    static const char *run_lacks[] = {"http-equiv=\"refresh\"", NULL};
    expect_page(&r, p[0], 200, run_has, run_lacks);
    reply_free(&r);
    /* The lineage of a checkpoint, with its base. */
    static const char *ck_has[] = {"<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"lineage\"",
                                   "ck-0001", ">holds<", NULL};
    expect_page(&r, p[1], 200, ck_has, NULL);
    reply_free(&r);
    static const char *ep_has[] = {"<table id=\"holdings\"", "[A] http://127.0.0.1:9001", NULL};
    expect_page(&r, p[2], 200, ep_has, NULL);
    reply_free(&r);
    static const char *svg_has[] = {"<polyline", NULL};
    expect_page(&r, p[3], 200, svg_has, NULL);
    assert_string_equal(r.ctype, "image/svg+xml");
    reply_free(&r);
    /* The endpoints page says what A holds and since when. */
    static const char *eps_has[] = {"ck-0002", NULL};
    expect_page(&r, "/endpoints", 200, eps_has, NULL);
    reply_free(&r);
}

static void test_escaping(void **state)
{
    char path[64];
    snprintf(path, sizeof path, "/runs/%lld", (long long)fx.run_failed);
    reply_t r;
    static const char *has[] = {
        "&lt;script&gt;alert(1)&lt;/script&gt; died &amp; &quot;quit&quot;",
        "/data/&lt;b&gt;&quot;x&quot;&amp;&#39;y&#39;.tsv", NULL};
    static const char *lacks[] = {"<script", "<b>\"x\"", NULL};
    expect_page(&r, path, 200, has, lacks);
    reply_free(&r);
    /* A hostile query string comes back escaped (in the filter form's value). */
    static const char *no_script[] = {"<script>", NULL};
    expect_page(&r, "/runs?job=%3Cscript%3E", 404, NULL, no_script);
    reply_free(&r);
    /* The API carries the same text as JSON. */
    snprintf(path, sizeof path, "/api/runs/%lld", (long long)fx.run_failed);
    json_t *doc = get_json(path, 200);
    assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "run"), "error")),
                        "rank 1 on <script>alert(1)</script> died & \"quit\"");
    json_decref(doc);
}

static void test_refresh(void **state)
{
    char path[64];
    snprintf(path, sizeof path, "/runs/%lld", (long long)fx.run_running);
    reply_t r;
    /* Its loss curve comes from metric rows (no run directory). */
    static const char *has[] = {"<meta http-equiv=\"refresh\" content=\"5\">",
                                "<polyline class=\"series\"", NULL};
    expect_page(&r, path, 200, has, NULL);
    reply_free(&r);
}

/* ---- API --------------------------------------------------------------------------------- */

static void test_api(void **state)
{
    json_t *doc = get_json("/api/jobs", 200);
    json_t *jobs = json_object_get(doc, "jobs");
    assert_int_equal(json_array_size(jobs), 2);
    json_t *ctr = json_array_get(jobs, 0);
    assert_string_equal(json_string_value(json_object_get(ctr, "name")), "ctr");
    assert_non_null(json_string_value(json_object_get(ctr, "next_fire")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(ctr, "last_run"), "state")),
                        "running");
    assert_non_null(json_string_value(json_object_get(ctr, "last_success_at")));
    json_decref(doc);

    char path[64];
    snprintf(path, sizeof path, "/api/runs/%lld", (long long)fx.run_ok);
    doc = get_json(path, 200);
    json_t *run = json_object_get(doc, "run");
    assert_string_equal(json_string_value(json_object_get(run, "state")), "succeeded");
    assert_true(json_real_value(json_object_get(run, "eval_logloss")) == 0.46125);
    assert_true(json_real_value(json_object_get(run, "samples_per_s")) == 51234.5);
    json_t *loss = json_object_get(json_object_get(doc, "loss"), "loss");
    assert_int_equal(json_array_size(loss), 60);
    json_t *cks = json_object_get(doc, "checkpoints");
    assert_int_equal(json_array_size(cks), 2);
    json_t *ex = json_object_get(json_array_get(cks, 0), "exports");
    assert_int_equal(json_array_size(ex), 2); /* pushed to A and to B */
    assert_true(json_array_size(json_object_get(doc, "events")) >= 3);
    assert_non_null(strstr(json_string_value(json_object_get(doc, "log_tail")), "step 600"));
    json_decref(doc);

    doc = get_json("/api/endpoints", 200);
    json_t *eps = json_object_get(doc, "endpoints");
    assert_int_equal(json_array_size(eps), 2);
    json_t *a = json_array_get(eps, 0);
    assert_string_equal(json_string_value(json_object_get(a, "label")), "A");
    assert_string_equal(json_string_value(json_object_get(json_object_get(a, "holds"), "uid")),
                        "ck-0002");
    json_t *b = json_array_get(eps, 1);
    assert_true(json_is_null(json_object_get(b, "holds")));
    assert_int_equal(json_integer_value(json_object_get(json_object_get(b, "pushes"), "failed")), 1);
    json_decref(doc);

    snprintf(path, sizeof path, "/api/lineage/checkpoint/%lld", (long long)fx.ckpt_full);
    doc = get_json(path, 200);
    /* run, 2 checkpoints, 3 exports (the body each push sent), 2 endpoints */
    assert_int_equal(json_array_size(json_object_get(doc, "nodes")), 8);
    json_decref(doc);
    snprintf(path, sizeof path, "/api/lineage/endpoint/%lld", (long long)fx.ep_a);
    doc = get_json(path, 200);
    assert_int_equal(json_array_size(json_object_get(doc, "holdings")), 2);
    json_decref(doc);

    snprintf(path, sizeof path, "/api/runs/%lld/log", (long long)fx.run_ok);
    reply_t r;
    get(&r, path);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "rank 0: starting"));
    reply_free(&r);
    doc = get_json("/api/runs/999999", 404);
    assert_non_null(strstr(json_string_value(json_object_get(doc, "error")), "no run 999999"));
    json_decref(doc);
}

/* A long run's loss curve is thinned to at most a few hundred points (the
 * last step kept); the loss axis never goes below 0. */
static void test_long_loss_curve(void **state)
{
    (void)state;
    state_t *st = NULL;
    int64_t id;
    assert_int_equal(state_open(fx.db, &st), 0);
    assert_int_equal(state_run_create(st, fx.job_cron, STATE_TRIGGER_MANUAL, 0, 1, 0, &id), 0);
    for (int step = 1; step <= 5000; step++)
        assert_int_equal(state_metric_add(st, id, step, "loss", 0.02 + 0.5 / step), 0);
    state_close(st);
    char path[96];
    snprintf(path, sizeof path, "/api/runs/%lld", (long long)id);
    json_t *doc = get_json(path, 200);
    json_t *xs = json_object_get(json_object_get(doc, "loss"), "step");
    size_t n = json_array_size(xs);
    if (n < 100 || n > 300)
        fail_msg("5000 steps drawn as %zu points (want a curve of at most 300)", n);
    assert_int_equal(json_integer_value(json_array_get(xs, n - 1)), 5000);
    json_decref(doc);
    reply_t r;
    snprintf(path, sizeof path, "/runs/%lld/loss.svg", (long long)id);
    get(&r, path);
    assert_int_equal(r.status, 200);
    for (const char *p = strstr(r.body, "class=\"ytick\""); p != NULL;
         p = strstr(p + 1, "class=\"ytick\"")) {
        const char *gt = strchr(p, '>');
        if (gt != NULL && strtod(gt + 1, NULL) < 0)
            fail_msg("loss axis tick below 0: %.20s", gt + 1);
    }
    reply_free(&r);
}

static void test_pagination(void **state)
{
    /* 130 more runs: three pages of 50, walked by next_before. */
    state_t *st = NULL;
    assert_int_equal(state_open(fx.db, &st), 0);
    for (int i = 0; i < 130; i++) {
        int64_t id;
        assert_int_equal(state_run_create(st, fx.job_oneoff, STATE_TRIGGER_MANUAL, 0, 1, 0, &id), 0);
    }
    state_close(st);
    int64_t before = 0, last = INT64_MAX;
    size_t total = 0, pages = 0;
    for (;;) {
        char path[96];
        snprintf(path, sizeof path, "/api/runs?limit=50&job=oneoff&before=%lld", (long long)before);
        json_t *doc = get_json(path, 200);
        json_t *runs = json_object_get(doc, "runs");
        for (size_t i = 0; i < json_array_size(runs); i++) {
            json_t *run = json_array_get(runs, i);
            int64_t id = json_integer_value(json_object_get(run, "id"));
            assert_true(id < last);
            last = id;
            assert_string_equal(json_string_value(json_object_get(run, "job")), "oneoff");
            total++;
        }
        pages++;
        json_t *next = json_object_get(doc, "next_before");
        before = json_is_integer(next) ? json_integer_value(next) : 0;
        json_decref(doc);
        if (before == 0)
            break;
    }
    assert_int_equal(total, 132); /* 130 + the failed and the queued one */
    assert_int_equal(pages, 3);
    /* The HTML page links the next page, and a state filter works. */
    reply_t r;
    get(&r, "/runs?job=oneoff&limit=50");
    assert_non_null(strstr(r.body, "rel=\"next\""));
    reply_free(&r);
    json_t *doc = get_json("/api/runs?state=succeeded", 200);
    assert_int_equal(json_array_size(json_object_get(doc, "runs")), 1);
    json_decref(doc);
    doc = get_json("/api/runs?limit=abc", 400);
    json_decref(doc);
    doc = get_json("/api/runs?state=bogus", 400);
    json_decref(doc);
}

/* ---- safety and state changes -------------------------------------------------------------- */

static void test_token(void **state)
{
    char path[96];
    snprintf(path, sizeof path, "/api/runs/%lld/cancel", (long long)fx.run_queued);
    expect_status("POST", path, NULL, NULL, 401);
    static const char *const wrong[] = {"Authorization: Bearer s3cret-toke", NULL};
    expect_status("POST", path, NULL, wrong, 401);
    static const char *const longer[] = {"Authorization: Bearer " TOKEN "x", NULL};
    expect_status("POST", path, NULL, longer, 401);
    /* A wrong token in a form, and a GET on the action: nothing changes. */
    snprintf(path, sizeof path, "/runs/%lld/cancel", (long long)fx.run_queued);
    expect_status("POST", path, "token=nope", NULL, 401);
    expect_status("GET", path, NULL, NULL, 405);
    snprintf(path, sizeof path, "/api/runs/%lld/cancel", (long long)fx.run_queued);
    expect_status("GET", path, NULL, NULL, 405);
    expect_status("DELETE", "/api/runs", NULL, NULL, 405);
    assert_string_equal(run_state(fx.run_queued), "queued");
}

static void test_cancel_retry(void **state)
{
    char path[96];
    reply_t r;
    /* The scheme is case-insensitive: "bearer" is Bearer (issue 27). */
    static const char *const auth[] = {"Authorization: bearer " TOKEN, NULL};
    /* The HTML form: token in the body, 303 back to the run. */
    snprintf(path, sizeof path, "/runs/%lld/cancel", (long long)fx.run_queued);
    http(&r, "POST", path, "token=" TOKEN, NULL);
    assert_int_equal(r.status, 303);
    char want[64];
    snprintf(want, sizeof want, "/runs/%lld", (long long)fx.run_queued);
    assert_string_equal(r.location, want);
    reply_free(&r);
    assert_string_equal(run_state(fx.run_queued), "canceled");
    /* Cancelling an ended run is a conflict. */
    snprintf(path, sizeof path, "/api/runs/%lld/cancel", (long long)fx.run_ok);
    expect_status("POST", path, NULL, auth, 409);
    /* A running run is flagged for kilnd. */
    snprintf(path, sizeof path, "/api/runs/%lld/cancel", (long long)fx.run_running);
    http(&r, "POST", path, NULL, auth);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"cancel_requested\""));
    reply_free(&r);
    /* Retry the failed run once; a second retry conflicts; a succeeded run is refused. */
    snprintf(path, sizeof path, "/api/runs/%lld/retry", (long long)fx.run_failed);
    http(&r, "POST", path, NULL, auth);
    assert_int_equal(r.status, 200);
    json_t *doc = json_loads(r.body, 0, NULL);
    assert_non_null(doc);
    int64_t rid = json_integer_value(json_object_get(doc, "run_id"));
    assert_int_equal(json_integer_value(json_object_get(doc, "attempt")), 2);
    json_decref(doc);
    reply_free(&r);
    snprintf(want, sizeof want, "/api/runs/%lld", (long long)rid);
    doc = get_json(want, 200);
    json_t *run = json_object_get(doc, "run");
    assert_string_equal(json_string_value(json_object_get(run, "trigger")), "retry");
    assert_int_equal(json_integer_value(json_object_get(run, "retry_of")), fx.run_failed);
    json_decref(doc);
    expect_status("POST", path, NULL, auth, 409);
    snprintf(path, sizeof path, "/api/runs/%lld/retry", (long long)fx.run_ok);
    expect_status("POST", path, NULL, auth, 409);
}

/* Issue 26: the endpoints page's split form and POST /api/split set a
 * model's traffic split on its kiln-serves (a real one here), with the token;
 * a kiln-serve that is not there is a 502 naming it. */
static void test_split(void **state)
{
    (void)state;
    reply_t r;
    static const char *has[] = {"action=\"/endpoints/split\"", "Traffic split of <b>ctr</b>",
                                NULL};
    expect_page(&r, "/endpoints", 200, has, NULL);
    reply_free(&r);
    const char *body = "{\"model\": \"ctr\", \"split\": \"A=100\"}";
    expect_status("POST", "/api/split", body, NULL, 401);
    static const char *const auth[] = {"Authorization: Bearer " TOKEN, NULL};
    unsetenv("KILN_SERVE_TOKEN"); /* kilnd without the kiln-serves' token: it says so */
    http(&r, "POST", "/api/split", body, auth);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "KILN_SERVE_TOKEN"));
    reply_free(&r);
    setenv("KILN_SERVE_TOKEN", FX_TOKEN, 1);
    http(&r, "POST", "/api/split", body, auth);
    assert_int_equal(r.status, 502);
    assert_non_null(strstr(r.body, "127.0.0.1:9001"));
    reply_free(&r);

    fx_serve_t srv = {0};
    char dir[400];
    snprintf(dir, sizeof dir, "%s/serve-split", fx.dir);
    assert_true(fx_serve_start(&srv, dir));
    state_t *st = NULL;
    int64_t ep = 0;
    assert_int_equal(state_open(fx.db, &st), 0);
    assert_int_equal(state_endpoint_put(st, srv.url, "ws", "A", &ep), 0);
    state_close(st);
    http(&r, "POST", "/endpoints/split", "model=ws&split=A%3D100&token=" TOKEN, NULL);
    assert_int_equal(r.status, 303);
    assert_string_equal(r.location, "/endpoints");
    reply_free(&r);
    char url[128];
    snprintf(url, sizeof url, "%s/v1/models/ws/split", srv.url);
    assert_int_not_equal(fx_http(&r, "GET", url, NULL, NULL, 0, 10), 0);
    assert_non_null(strstr(r.body, "\"split\":\"A=100\""));
    reply_free(&r);
    fx_serve_stop(&srv, SIGTERM);
}

static void test_submit(void **state)
{
    static const char *const auth[] = {"Authorization: Bearer " TOKEN,
                                       "Content-Type: application/yaml", NULL};
    char spec[4096];
    proc_slurp(KILN_SOURCE_DIR "/examples/oneoff.yaml", spec, sizeof spec);
    assert_true(strlen(spec) > 0);
    char *renamed = strstr(spec, "name: oneoff");
    assert_non_null(renamed);
    memcpy(renamed, "name: webjob", 12); /* the same length as "name: oneoff" */
    reply_t r;
    expect_status("POST", "/api/jobs", spec, NULL, 401);
    http(&r, "POST", "/api/jobs", spec, auth);
    if (r.status != 201)
        fail_msg("submit: %ld %s", r.status, r.body);
    json_t *doc = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(doc, "job")), "webjob");
    assert_true(json_is_integer(json_object_get(doc, "run_id")));
    assert_string_equal(run_state(json_integer_value(json_object_get(doc, "run_id"))), "queued");
    json_decref(doc);
    reply_free(&r);
    http(&r, "POST", "/api/jobs", "name: bad\nmodel: {type: nope}\n", auth);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "problems"));
    reply_free(&r);
    /* A name whose quote in the problem ("%.80s") cuts a character in two
     * is still reported: the problem is JSON, with '?' for the cut bytes. */
    char longname[160];
    snprintf(longname, sizeof longname, "name: %079d\xc3\xa9x\ndata: {train: a.tsv}\n", 0);
    http(&r, "POST", "/api/jobs", longname, auth);
    assert_int_equal(r.status, 400);
    doc = json_loads(r.body, 0, NULL);
    assert_non_null(doc);
    json_t *probs = json_object_get(doc, "problems");
    assert_int_equal(json_array_size(probs), 1);
    assert_non_null(strstr(json_string_value(json_array_get(probs, 0)), "0?\" is not a valid name"));
    json_decref(doc);
    reply_free(&r);
}

/* Job control over HTTP: pause and resume need the token; the job page
 * shows the state with pause/resume and delete buttons, and its forms answer
 * 303; a delete is refused (409) while a run is queued, done with ?cancel=1,
 * and the job leaves /api/jobs. */
static void test_job_control(void **state)
{
    static const char *const auth[] = {"Authorization: Bearer " TOKEN, NULL};
    reply_t r;
    http(&r, "POST", "/api/jobs", "name: webctl\ndata: {train: /d.tsv}\n", auth);
    assert_int_equal(r.status, 201); /* a one-off: its run is queued */
    json_t *doc = json_loads(r.body, 0, NULL);
    int64_t id = json_integer_value(json_object_get(doc, "job_id"));
    json_decref(doc);
    reply_free(&r);
    char path[96], want[64];
    snprintf(path, sizeof path, "/api/jobs/%lld/pause", (long long)id);
    expect_status("POST", path, NULL, NULL, 401);
    http(&r, "POST", path, NULL, auth);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"paused\":true"));
    reply_free(&r);
    snprintf(path, sizeof path, "/jobs/%lld", (long long)id);
    static const char *const has_paused[] = {"id=\"job-state\">paused", "/resume\"",
                                             "/delete\"", NULL};
    expect_page(&r, path, 200, has_paused, NULL);
    reply_free(&r);
    snprintf(path, sizeof path, "/jobs/%lld/resume", (long long)id); /* the page's form */
    http(&r, "POST", path, "token=" TOKEN, NULL);
    assert_int_equal(r.status, 303);
    snprintf(want, sizeof want, "/jobs/%lld", (long long)id);
    assert_string_equal(r.location, want);
    reply_free(&r);
    static const char *const has_active[] = {"id=\"job-state\">active", "/pause\"", NULL};
    expect_page(&r, want, 200, has_active, NULL);
    reply_free(&r);

    snprintf(path, sizeof path, "/api/jobs/%lld/delete", (long long)id);
    expect_status("POST", path, NULL, auth, 409);
    snprintf(path, sizeof path, "/api/jobs/%lld/delete?cancel=1", (long long)id);
    http(&r, "POST", path, NULL, auth);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"runs_stopped\":1"));
    reply_free(&r);
    doc = get_json("/api/jobs", 200);
    char *text = json_dumps(doc, 0);
    assert_null(strstr(text, "webctl"));
    free(text);
    json_decref(doc);
    expect_status("POST", path, NULL, auth, 404); /* deleted already */
    expect_status("POST", "/api/jobs/99999/pause", NULL, auth, 404);
}

/* The web API runs the same checkpoint.dir check as kiln submit: a second
 * job naming the first's (absolute) checkpoint directory is refused with
 * 409; a relative one is per run (no spec file), so it never clashes. */
static void test_submit_shared_checkpoint_dir(void **state)
{
    static const char *const auth[] = {"Authorization: Bearer " TOKEN,
                                       "Content-Type: application/yaml", NULL};
    reply_t r;
    http(&r, "POST", "/api/jobs",
         "name: web-ck1\ndata: {train: /d.tsv}\ncheckpoint: {dir: /tmp/kiln-web-shared-ckpt}\n",
         auth);
    if (r.status != 201)
        fail_msg("first: %ld %s", r.status, r.body);
    reply_free(&r);
    http(&r, "POST", "/api/jobs",
         "name: web-ck2\ndata: {train: /d.tsv}\ncheckpoint: {dir: /tmp/./kiln-web-shared-ckpt}\n",
         auth);
    if (r.status != 409 ||
        strstr(r.body, "is already the checkpoint directory of job web-ck1") == NULL)
        fail_msg("second: %ld %s", r.status, r.body);
    reply_free(&r);
    for (int i = 0; i < 2; i++) {
        char spec[128];
        snprintf(spec, sizeof spec,
                 "name: web-rel%d\ndata: {train: /d.tsv}\n"
                 "checkpoint: {dir: ckpt/same}\n",
                 i);
        http(&r, "POST", "/api/jobs", spec, auth);
        if (r.status != 201)
            fail_msg("relative %d: %ld %s", i, r.status, r.body);
        reply_free(&r);
    }
}

static void test_limits(void **state)
{
    reply_t r;
    size_t big = 80 * 1024;
    char *body = malloc(big + 1);
    assert_non_null(body);
    memset(body, 'a', big);
    body[big] = '\0';
    static const char *const auth[] = {"Authorization: Bearer " TOKEN, NULL};
    expect_status("POST", "/api/jobs", body, auth, 413);
    free(body);
    get(&r, "/no/such/page");
    assert_int_equal(r.status, 404);
    reply_free(&r);
    get(&r, "/runs/0");
    assert_int_equal(r.status, 404);
    reply_free(&r);
    get(&r, "/runs/99999999999999999999");
    assert_int_equal(r.status, 404);
    reply_free(&r);
    expect_status("HEAD", "/runs", NULL, NULL, 200);
}

/* Against DNS rebinding: only the names of the bind address (and those
 * configured) are served; another Host gets 403, on pages and API alike. */
static void test_host_check(void **state)
{
    static const struct {
        const char *path, *host;
        long status;
    } cases[] = {
        {"/", "127.0.0.1", 200},           {"/", "localhost", 200},
        {"/api/jobs", "LOCALHOST:1", 200}, {"/", "evil.example", 403},
        {"/api/jobs", "evil.example", 403}, {"/metrics", "127.0.0.1.evil.example", 403},
        {"/api/jobs", "status.example", 403},
    };
    reply_t r;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char hh[128];
        snprintf(hh, sizeof hh, "Host: %s", cases[i].host);
        const char *const hd[] = {hh, NULL};
        http(&r, "GET", cases[i].path, NULL, hd);
        if (r.status != cases[i].status)
            fail_msg("GET %s with Host %s: %ld, want %ld", cases[i].path, cases[i].host, r.status,
                     cases[i].status);
        if (r.status == 403 && strstr(r.body, "KILN_WEB_ALLOWED_HOSTS") == NULL)
            fail_msg("the 403 does not say how to allow a name: %s", r.body);
        reply_free(&r);
    }
    /* A POST with the token too: nothing is submitted. */
    json_t *doc = get_json("/api/jobs", 200);
    size_t njobs = json_array_size(json_object_get(doc, "jobs"));
    json_decref(doc);
    static const char *const evil[] = {"Host: evil.example", "Authorization: Bearer " TOKEN, NULL};
    expect_status("POST", "/api/jobs", "name: rebound\nmodel: {type: lr}\n", evil, 403);
    doc = get_json("/api/jobs", 200);
    assert_int_equal(json_array_size(json_object_get(doc, "jobs")), njobs);
    json_decref(doc);
    /* Names configured (here through $KILN_WEB_ALLOWED_HOSTS, as kilnd does). */
    setenv("KILN_WEB_ALLOWED_HOSTS", "status.example,other.example", 1);
    web_config_t cfg;
    web_config_init(&cfg);
    cfg.db_path = fx.db;
    cfg.listen = "127.0.0.1:0";
    web_t *w = NULL;
    int rc = web_start(&cfg, &w);
    unsetenv("KILN_WEB_ALLOWED_HOSTS");
    assert_int_equal(rc, 0);
    char saved[64];
    snprintf(saved, sizeof saved, "%s", fx.base);
    snprintf(fx.base, sizeof fx.base, "http://127.0.0.1:%u", (unsigned)web_port(w));
    static const char *const ok[] = {"Host: status.example:8480", NULL};
    expect_status("GET", "/", NULL, ok, 200);
    static const char *const bad[] = {"Host: evil.example", NULL};
    expect_status("GET", "/", NULL, bad, 403);
    snprintf(fx.base, sizeof fx.base, "%s", saved);
    web_stop(w);
    /* A malformed list is refused at start, naming the variable. */
    setenv("KILN_WEB_ALLOWED_HOSTS", "a.example,,b", 1);
    rc = web_start(&cfg, &w);
    unsetenv("KILN_WEB_ALLOWED_HOSTS");
    assert_int_equal(rc, KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "KILN_WEB_ALLOWED_HOSTS"));
}

/* ---- /metrics -------------------------------------------------------------------------------- */

static void test_metrics(void **state)
{
    reply_t r;
    get(&r, "/metrics");
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "text/plain; version=0.0.4; charset=utf-8");
    static const char *const has[] = {
        "kiln_runs{job=\"ctr\",state=\"succeeded\"} 1\n",
        "kiln_run_duration_seconds_bucket{job=\"ctr\",le=\"+Inf\"} 1\n",
        "kiln_run_duration_seconds_count{job=\"ctr\"} 1\n",
        "kiln_push_failures_total{endpoint=\"http://127.0.0.1:9002\",model=\"ctr\",label=\"B\"} 1\n",
        "kiln_job_last_success_timestamp_seconds{job=\"ctr\"} ",
        "kiln_queue_depth ",
        "# TYPE kiln_run_duration_seconds histogram\n",
        /* the online figures: nothing answers at the fixture's endpoints */
        "kiln_endpoint_online_up{endpoint=\"http://127.0.0.1:9002\",model=\"ctr\",label=\"B\"} "
        "0\n",
        "# TYPE kiln_endpoint_online_logloss gauge\n",
    };
    for (size_t i = 0; i < sizeof has / sizeof has[0]; i++)
        if (strstr(r.body, has[i]) == NULL)
            fail_msg("/metrics lacks %s\n%s", has[i], r.body);
    bool parsed = fx_promtool_check(fx.dir, "metrics", r.body, r.len);
    reply_free(&r);
    if (!parsed)
        skip();
}

/* ---- a real kilnd holding real runs -------------------------------------------------------- */

/* Starts kilnd with home (its database home/kiln.db, its log home/kilnd.log)
 * and its page on a free port of 127.0.0.1; env ("NAME=VALUE", NULL-ended)
 * is set in it, the page's token (KILN_WEB_TOKEN=TOKEN) among them. Writes
 * the page's URL to url. Returns its pid. */
static pid_t kilnd_start(const char *home, const char *const *env, char *url, size_t cap)
{
    char kdb[500], log[500], listen[32];
    snprintf(kdb, sizeof kdb, "%s/kiln.db", home);
    snprintf(log, sizeof log, "%s/kilnd.log", home);
    assert_int_equal(kiln_mkdir_p(home), 0);
    int port = proc_free_port();
    assert_true(port > 0);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(url, cap, "http://%s", listen);
    const char *argv[] = {KILND_BIN,      "--db",   kdb,     "--home",   home,   "--trainer",
                          KILN_TRAIN_BIN, "--poll", "200ms", "--listen", listen, NULL};
    pid_t pid = proc_spawn(log, env, argv);
    assert_true(pid > 0);
    return pid;
}

/* Stops kilnd with SIGTERM and checks that it exits 0. */
static void kilnd_stop(pid_t pid)
{
    kill(pid, SIGTERM);
    int wst = 0;
    for (int i = 0; i < 100 && waitpid(pid, &wst, WNOHANG) != pid; i++)
        proc_sleep_ms(100);
    if (kill(pid, 0) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &wst, 0);
        fail_msg("kilnd did not stop on SIGTERM");
    }
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
}

/* GET url+path with a 10 s limit (generous: the page only has to answer);
 * the status, 0 when none came. */
static long get_within(const char *url, const char *path)
{
    char u[256];
    reply_t r;
    snprintf(u, sizeof u, "%s%s", url, path);
    long status = fx_http(&r, "GET", u, NULL, NULL, 0, 10);
    fx_reply_fini(&r);
    return status;
}

/* GET url+path as a client of a flooded server does: a connection that is
 * reset while the server is still closing the flood's evicted connections
 * (an instant under ASan, where kilnd is slow) is tried again, for up to 10
 * s. Returns the last status. A server that locks the address out until the
 * flood closes (issue 27) never answers 200 here. */
static long get_settled(const char *url, const char *path)
{
    long st = 0;
    for (int i = 0; i < 50 && (st = get_within(url, path)) == 0; i++)
        proc_sleep_ms(200);
    return st;
}

/* kilnd's page survives slow clients: 300 idle connections from one address
 * and 40 that trickle their headers from another do not keep a third
 * client's page from being answered (the limit per client address, with
 * the thread pool), and the page answers right after they close. No speed
 * is measured; the page has 10 s to answer. Also the Host check of the real
 * kilnd, with a name allowed through $KILN_WEB_ALLOWED_HOSTS. */
static void test_kilnd_slow_clients(void **state)
{
    char home[400], url[64];
    snprintf(home, sizeof home, "%s/kilnd-slow", fx.dir);
    const char *env[] = {"KILN_WEB_TOKEN=" TOKEN, "KILN_WEB_ALLOWED_HOSTS=status.example", NULL};
    pid_t pid = kilnd_start(home, env, url, sizeof url);
    long st = 0;
    for (int i = 0; i < 300 && (st = get_within(url, "/api/jobs")) != 200; i++)
        proc_sleep_ms(50); /* until kilnd's page is up */
    assert_int_equal(st, 200);
    static proc_slow_t slow;
    proc_slow_open(&slow, atoi(strrchr(url, ':') + 1), "GET / HTTP/1.1\r\nHost: x");
    for (int round = 0; round < 3; round++) {
        st = get_within(url, "/");
        if (st != 200) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail_msg("kilnd's page did not answer under slow clients (round %d: %ld)", round, st);
        }
        proc_slow_trickle(&slow);
    }
    proc_slow_close(&slow);
    assert_int_equal(get_within(url, "/api/jobs"), 200);
    /* The same flood from 127.0.0.1, the address of the page's own client
     * (and of every client of a loopback deployment): the oldest connections
     * that are not in a request make room (issue 27: every GET / was reset
     * until the attackers closed). */
    proc_slow_open_from(&slow, atoi(strrchr(url, ':') + 1), "GET / HTTP/1.1\r\nHost: x",
                        "127.0.0.1", "127.0.0.1");
    for (int round = 0; round < 3; round++) {
        st = get_settled(url, "/");
        if (st != 200) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail_msg("kilnd's page did not answer under a flood from its client's own address "
                     "(round %d: %ld)",
                     round, st);
        }
        proc_slow_trickle(&slow);
    }
    proc_slow_close(&slow);
    /* The Host check of the real kilnd. */
    char saved[64];
    snprintf(saved, sizeof saved, "%s", fx.base);
    snprintf(fx.base, sizeof fx.base, "%s", url);
    static const char *const allowed[] = {"Host: status.example", NULL};
    static const char *const evil[] = {"Host: evil.example", NULL};
    expect_status("GET", "/", NULL, allowed, 200);
    expect_status("GET", "/", NULL, evil, 403);
    snprintf(fx.base, sizeof fx.base, "%s", saved);
    kilnd_stop(pid);
}

/* kilnd with its page on a free port, a real one-off job submitted with the
 * kiln CLI and trained by kiln-train under mpirun; the page, API and metrics
 * are then read from kilnd itself. */
static void test_kilnd(void **state)
{
    char home[400], kdb[500], spec[500], data[500], cmd[2048], log[500];
    snprintf(home, sizeof home, "%s/kilnd", fx.dir);
    snprintf(kdb, sizeof kdb, "%s/kiln.db", home);
    snprintf(data, sizeof data, "%s/day0.tsv", home);
    snprintf(spec, sizeof spec, "%s/webrun.yaml", home);
    snprintf(log, sizeof log, "%s/kilnd.log", home);
    assert_int_equal(kiln_mkdir_p(home), 0);
    /* Open MPI's runtime leaves allocations LeakSanitizer cannot name. */
    proc_mpi_env(true);
    snprintf(cmd, sizeof cmd, "'%s' datagen --rows 3000 --out '%s' --seed 5 > /dev/null", KILN_BIN,
             data);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(spec, "w");
    assert_non_null(f);
    fprintf(f, "name: webrun\nresources: {ranks: 2, threads: 1}\n"
               "model: {type: lr, embedding: {dim: 4, capacity: 100000}}\n"
               "data: {train: \"%s\", eval: \"%s\"}\ntrain: {batch_size: 256, log_every: 2}\n",
            data, data);
    fclose(f);
    char url[64];
    const char *env[] = {"KILN_WEB_TOKEN=" TOKEN, NULL};
    pid_t pid = kilnd_start(home, env, url, sizeof url);
    snprintf(cmd, sizeof cmd, "'%s' --db '%s' submit '%s' > /dev/null", KILN_BIN, kdb, spec);
    assert_int_equal(system(cmd), 0);
    /* Talk to kilnd's own page from here on. */
    char saved[64];
    snprintf(saved, sizeof saved, "%s", fx.base);
    snprintf(fx.base, sizeof fx.base, "%s", url);
    const char *st = "";
    for (int i = 0; i < 600; i++) {
        char u[160];
        snprintf(u, sizeof u, "%s/api/runs/1", url);
        json_t *doc = fx_get_json(u);
        if (doc != NULL) {
            static char buf[32];
            json_t *run = json_object_get(doc, "run");
            const char *now = json_string_value(json_object_get(run, "state"));
            snprintf(buf, sizeof buf, "%s", now != NULL ? now : "");
            st = buf;
            json_decref(doc);
        }
        if (strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 ||
            strcmp(st, "canceled") == 0 || strcmp(st, "timed_out") == 0)
            break;
        proc_sleep_ms(100);
    }
    if (strcmp(st, "succeeded") != 0) {
        char text[8192];
        proc_slurp(log, text, sizeof text);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("the run did not succeed (state '%s'); kilnd log:\n%s", st, text);
    }
    json_t *doc = get_json("/api/runs/1", 200);
    json_t *run = json_object_get(doc, "run");
    assert_true(json_array_size(json_object_get(json_object_get(doc, "loss"), "loss")) > 0);
    assert_true(json_is_real(json_object_get(run, "eval_logloss")));
    assert_true(json_array_size(json_object_get(doc, "events")) >= 3);
    json_decref(doc);
    reply_t r;
    get(&r, "/runs/1");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "<polyline class=\"series\""));
    reply_free(&r);
    get(&r, "/metrics");
    assert_non_null(strstr(r.body, "kiln_runs{job=\"webrun\",state=\"succeeded\"} 1\n"));
    assert_non_null(strstr(r.body, "kiln_run_duration_seconds_count{job=\"webrun\"} 1\n"));
    reply_free(&r);
    expect_status("POST", "/api/runs/1/retry", NULL, NULL, 401);
    snprintf(fx.base, sizeof fx.base, "%s", saved);
    kilnd_stop(pid);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pages),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_refresh),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_long_loss_curve),
        cmocka_unit_test(test_pagination),
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_cancel_retry),
        cmocka_unit_test(test_submit),
        cmocka_unit_test(test_job_control),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_submit_shared_checkpoint_dir),
        cmocka_unit_test(test_host_check),
        cmocka_unit_test(test_kilnd_slow_clients), cmocka_unit_test(test_kilnd),
    };
    /* KILN_TEST_FILTER=test_kilnd* runs matching tests (cmocka glob). */
    if (getenv("KILN_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("KILN_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
