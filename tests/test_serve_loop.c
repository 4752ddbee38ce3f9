/*
 * tests/test_serve_loop.c - kiln-serve's loop from serving back to training
 * (issue 28), with real kiln-serve processes over loopback (ports
 * 19200-19299) and real files:
 *   - impressions: a predict with a request key logs one line per row
 *     (time, label, checkpoint, probability, key, row id, features less a
 *     label column); ids the log cannot hold are refused before predicting;
 *   - feedback: accepted, duplicate, unknown and late counted, a bad body
 *     refused, the token required;
 *   - the join: partitions in Criteo TSV with the feedback's labels (0 when
 *     none came), renamed into place with _SUCCESS; the online metrics match
 *     a computation here, also after a restart;
 *   - kill -9 of kiln-serve while it appends and inside joins: every row
 *     logged is joined exactly once (partitions and metrics);
 *   - a full disk (a file-size limit) and --impressions-max: predicts keep
 *     answering, the drops are counted in /metrics and logged once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "kiln.h"
#include "proc.h"
#include "serve.h"
#include "serve_fixture.h"

#define PORT0 19200
#define NROWS_MAX 4096

static char tmp[256];

typedef struct srv {
    char dir[400], imp[400], join[400], log[480], url[64];
    int port;
    pid_t pid;
    const char *window, *max, *fsize; /* --feedback-window, --impressions-max, ulimit -f */
    const char *hold_ms;              /* KILN_TEST_JOIN_HOLD_MS */
} srv_t;

static void srv_init(srv_t *s, const char *name, int port)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s/%s/state", tmp, name);
    snprintf(s->imp, sizeof s->imp, "%s/%s/imp", tmp, name);
    snprintf(s->join, sizeof s->join, "%s/%s/join", tmp, name);
    snprintf(s->log, sizeof s->log, "%s/%s/serve.log", tmp, name);
    s->port = port;
    snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", port);
    s->window = "2s";
    s->max = "1073741824";
    char d[480];
    snprintf(d, sizeof d, "%s/%s", tmp, name);
    assert_int_equal(kiln_mkdir_p(d), 0);
}

static void srv_start(srv_t *s)
{
    char listen[64], hold[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
    snprintf(hold, sizeof hold, "KILN_TEST_JOIN_HOLD_MS=%s", s->hold_ms ? s->hold_ms : "0");
    char ulimit[64];
    snprintf(ulimit, sizeof ulimit, "ulimit -f %s; exec \"$0\" \"$@\"",
             s->fsize ? s->fsize : "unlimited");
    const char *argv[] = {"/bin/sh", "-c", ulimit, KILN_SERVE_BIN, "--listen", listen,
                          "--state-dir", s->dir, "--token-env", "KILN_TEST_TOKEN",
                          "--impressions-dir", s->imp, "--join-dir", s->join,
                          "--feedback-window", s->window, "--impressions-max", s->max, NULL};
    const char *env[] = {"KILN_TEST_TOKEN=" FX_TOKEN, hold, NULL};
    s->pid = fx_spawn(s->log, env, argv);
    char url[128];
    snprintf(url, sizeof url, "%s/healthz", s->url);
    for (int i = 0; i < 500; i++) {
        char *b = fx_get(url);
        free(b);
        if (b != NULL)
            return;
        proc_sleep_ms(20);
    }
    fail_msg("kiln-serve on %s did not come up (log %s)", s->url, s->log);
}

static void srv_stop(srv_t *s, int sig)
{
    fx_stop(s->pid, sig);
    s->pid = 0;
}

static int open_memsrc(void *ctx, const char *held, serve_source_t **out)
{
    (void)held;
    return serve_memsrc_open(ctx, out);
}

/* Pushes the fixture's lr model (1 dense feature, 2 slots) to label. */
static void push_lr(const srv_t *s, const char *label, const char *uid)
{
    serve_memsrc_t *m = NULL;
    assert_int_equal(fx_lr_version(uid, 0, NULL, NULL, 0.8f, &m), 0);
    serve_push_opts_t o = {.token = FX_TOKEN, .retries = 3, .timeout_ms = 20000,
                           .backoff_ms = 100, .max_backoff_ms = 400};
    serve_target_t t = {s->url, "ctr", label, "", open_memsrc, m, NULL};
    serve_push_result_t res;
    assert_int_equal(serve_push(&t, 1, &o, &res), 0);
    assert_true(res.ok);
    serve_memsrc_destroy(m);
}

/* Predicts rows (n TSV lines) with request key, label and row ids (NULL:
 * none) into probs; returns the HTTP status. */
static long predict(const srv_t *s, const char *key, const char *label, int n,
                    char lines[][64], const char *const *ids, double *probs)
{
    json_t *rows = json_array(), *jids = ids ? json_array() : NULL;
    for (int i = 0; i < n; i++) {
        json_array_append_new(rows, json_string(lines[i]));
        if (ids)
            json_array_append_new(jids, json_string(ids[i]));
    }
    json_t *req = json_pack("{s:o,s:s}", "rows", rows, "request_key", key);
    if (jids)
        json_object_set_new(req, "row_ids", jids);
    char *body = json_dumps(req, JSON_COMPACT), url[160];
    json_decref(req);
    snprintf(url, sizeof url, "%s/v1/models/ctr/predict?label=%s", s->url, label);
    fx_reply_t r;
    long st = fx_http(&r, "POST", url, NULL, body, strlen(body), 10);
    free(body);
    if (st == 200 && probs != NULL) {
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *p = json_object_get(j, "probabilities");
        assert_int_equal(json_array_size(p), n);
        for (int i = 0; i < n; i++)
            probs[i] = json_real_value(json_array_get(p, (size_t)i));
        json_decref(j);
    }
    fx_reply_fini(&r);
    return st;
}

/* POSTs feedback body; the answer's JSON into *out (may be NULL). */
static long feedback(const srv_t *s, const char *body, bool token, json_t **out)
{
    char url[160];
    snprintf(url, sizeof url, "%s/v1/models/ctr/feedback", s->url);
    const char *h[] = {"Authorization: Bearer " FX_TOKEN, "Content-Type: application/json",
                       NULL};
    fx_reply_t r;
    long st = fx_http(&r, "POST", url, token ? h : h + 1, body, strlen(body), 10);
    if (out != NULL)
        *out = json_loads(r.body, 0, NULL);
    fx_reply_fini(&r);
    return st;
}

/* The value of the /metrics sample that starts with prefix (-1: none). */
static double metric(const srv_t *s, const char *prefix)
{
    char url[128];
    snprintf(url, sizeof url, "%s/metrics", s->url);
    return fx_metric(url, prefix);
}

/* Waits until /metrics sample prefix reaches want (at most timeout_ms). */
static double wait_metric(const srv_t *s, const char *prefix, double want, int timeout_ms)
{
    double v = -1;
    for (int t = 0; t < timeout_ms; t += 50) {
        v = metric(s, prefix);
        if (v >= want)
            return v;
        proc_sleep_ms(50);
    }
    return v;
}

/* A joined row: its id (the second slot, unique per row), label, dense x. */
typedef struct jrow {
    char id[32];
    int y;
} jrow_t;

/* Reads every partition of join/ctr into rows (at most cap); fails on a
 * partition without _SUCCESS, a temporary one left, or a line that is not
 * "y\tx\tc1\tid". Returns how many. */
static int read_partitions(const srv_t *s, jrow_t *rows, int cap, int *parts)
{
    char dir[480];
    snprintf(dir, sizeof dir, "%s/ctr", s->join);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    *parts = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            fail_msg("temporary partition %s left in %s", e->d_name, dir);
        if (strncmp(e->d_name, "part=", 5) != 0)
            continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s/_SUCCESS", dir, e->d_name);
        assert_int_equal(access(p, F_OK), 0);
        snprintf(p, sizeof p, "%s/%s/part-0.tsv", dir, e->d_name);
        size_t len;
        char *b = (char *)proc_read_file(p, &len);
        (*parts)++;
        for (char *l = b, *nl; (nl = strchr(l, '\n')) != NULL; l = nl + 1) {
            *nl = '\0';
            char y[8], x[32], c1[32], id[32];
            if (sscanf(l, "%7[^\t]\t%31[^\t]\t%31[^\t]\t%31s", y, x, c1, id) != 4 ||
                (strcmp(y, "0") && strcmp(y, "1")))
                fail_msg("%s: line '%s' is not Criteo TSV of the model", p, l);
            assert_true(n < cap);
            snprintf(rows[n].id, sizeof rows[n].id, "%s", id);
            rows[n++].y = y[0] == '1';
        }
        free(b);
    }
    closedir(d);
    return n;
}

/* The lines of every segment in imp/ctr, concatenated (malloc'd). */
static char *segments_text(const srv_t *s)
{
    char dir[480];
    snprintf(dir, sizeof dir, "%s/ctr", s->imp);
    DIR *d = opendir(dir);
    assert_non_null(d);
    char *all = calloc(1, 1);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strstr(e->d_name, ".imp") == NULL)
            continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        size_t len;
        char *b = (char *)proc_read_file(p, &len);
        all = realloc(all, n + len + 1);
        memcpy(all + n, b, len);
        all[n += len] = '\0';
        free(b);
    }
    closedir(d);
    return all;
}

/* Segment files left in imp/ctr. */
static int segments_left(const srv_t *s)
{
    char dir[480];
    snprintf(dir, sizeof dir, "%s/ctr", s->imp);
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        n += strstr(e->d_name, ".imp") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* The row with id among rows (n), or NULL; fails when it is there twice. */
static const jrow_t *find_row(const jrow_t *rows, int n, const char *id)
{
    const jrow_t *hit = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].id, id) == 0) {
            if (hit != NULL)
                fail_msg("row %s joined twice", id);
            hit = &rows[i];
        }
    return hit;
}

/* Lines of the log file at path holding needle. */
static int log_count(const char *path, const char *needle)
{
    size_t len;
    char *b = (char *)proc_read_file(path, &len);
    int n = 0;
    for (char *p = b; (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(b);
    return n;
}

/* ---- impressions, feedback, the join and the metrics ---------------------------- */

#define REQS 12
#define PER 4

static void test_impressions_feedback_join(void **state)
{
    (void)state;
    srv_t s;
    srv_init(&s, "basic", PORT0 + 1);
    s.window = "3s"; /* the segments are read below before any is joined */
    srv_start(&s);
    push_lr(&s, "A", "ck-a");
    push_lr(&s, "B", "ck-b");
    /* 12 requests of 4 rows, alternately on A and B; row r of request q has
     * dense x = 4q + r (distinct probabilities) and the id "q<q>r<r>" in
     * its second slot; request 0 names its rows. */
    double prob[REQS][PER];
    int label_of[REQS][PER];
    for (int q = 0; q < REQS; q++) {
        char lines[PER][64], key[16];
        for (int r = 0; r < PER; r++)
            snprintf(lines[r], sizeof lines[r], "%d\tc%d\tq%dr%d", 4 * q + r, q % 3, q, r);
        const char *ids[PER] = {"a", "b", "c", "d"};
        snprintf(key, sizeof key, "k%d", q);
        assert_int_equal(predict(&s, key, q % 2 ? "B" : "A", PER, lines, q == 0 ? ids : NULL,
                                 prob[q]),
                         200);
        for (int r = 0; r < PER; r++) /* a click on rows with (q + r) % 3 == 0 */
            label_of[q][r] = (q + r) % 3 == 0;
    }
    /* A key the log cannot hold is refused before predicting. */
    char bad[1][64] = {"1\tc\td"};
    assert_int_equal(predict(&s, "tab\there", "A", 1, bad, NULL, NULL), 400);
    assert_true(wait_metric(&s, "kiln_serve_impressions_logged_total{model=\"ctr\"} ",
                            REQS * PER, 5000) == REQS * PER);

    /* The segment's lines: ms, label, checkpoint, probability, key, row, features. */
    char *segs = segments_text(&s);
    int lines_seen = 0;
    for (char *l = segs, *nl; (nl = strchr(l, '\n')) != NULL; l = nl + 1, lines_seen++) {
        *nl = '\0';
        long long ts;
        char lab[8], uid[16], pr[32], key[16], row[8], feat[64];
        assert_int_equal(sscanf(l, "%lld\t%7[^\t]\t%15[^\t]\t%31[^\t]\t%15[^\t]\t%7[^\t]\t%63[^\n]",
                                &ts, lab, uid, pr, key, row, feat),
                         7);
        int q = atoi(key + 1);
        int r = strcmp(key, "k0") == 0 ? row[0] - 'a' : atoi(row);
        char want[64];
        snprintf(want, sizeof want, "%d\tc%d\tq%dr%d", 4 * q + r, q % 3, q, r);
        assert_string_equal(feat, want);
        assert_string_equal(lab, q % 2 ? "B" : "A");
        assert_string_equal(uid, q % 2 ? "ck-b" : "ck-a");
        assert_true(fabs(atof(pr) - prob[q][r]) < 1e-6);
        assert_true(llabs(ts - kiln_now_ms()) < 60000);
    }
    free(segs);
    assert_int_equal(lines_seen, REQS * PER);

    /* Feedback: the token, a bad body, then one of each result. */
    json_t *a = NULL;
    assert_int_equal(feedback(&s, "[]", false, NULL), 401);
    assert_int_equal(feedback(&s, "[{\"request_key\":\"k0\",\"row\":\"a\",\"label\":2}]", true,
                              &a),
                     400);
    assert_non_null(strstr(json_string_value(json_object_get(a, "error")), "item 0"));
    json_decref(a);
    json_t *items = json_array();
    for (int q = 0; q < REQS; q++)
        for (int r = 0; r < PER; r++) {
            if (!label_of[q][r] && r != 1)
                continue; /* no feedback: the negative default; row 1: an explicit 0 */
            char key[16], row[8];
            snprintf(key, sizeof key, "k%d", q);
            snprintf(row, sizeof row, "%d", r);
            json_t *it = json_pack("{s:s,s:i}", "request_key", key, "label", label_of[q][r]);
            json_object_set_new(it, "row", q == 0 ? json_string((char[2]){(char)('a' + r), 0})
                                                  : json_integer(r));
            json_array_append_new(items, it);
        }
    size_t sent = json_array_size(items);
    /* a repeat of the first item (duplicate) and two unknown ones */
    json_array_append(items, json_array_get(items, 0));
    json_array_append_new(items, json_pack("{s:s,s:i,s:i}", "request_key", "nokey", "row", 0,
                                           "label", 1));
    json_array_append_new(items, json_pack("{s:s,s:i,s:i}", "request_key", "k1", "row", 9,
                                           "label", 1));
    char *body = json_dumps(items, JSON_COMPACT);
    json_decref(items);
    assert_int_equal(feedback(&s, body, true, &a), 200);
    assert_int_equal(json_integer_value(json_object_get(a, "accepted")), (json_int_t)sent);
    assert_int_equal(json_integer_value(json_object_get(a, "duplicate")), 1);
    assert_int_equal(json_integer_value(json_object_get(a, "unknown")), 2);
    json_decref(a);
    /* The same POST again (a client's retry) changes nothing. */
    assert_int_equal(feedback(&s, body, true, &a), 200);
    assert_int_equal(json_integer_value(json_object_get(a, "accepted")), 0);
    assert_int_equal(json_integer_value(json_object_get(a, "duplicate")), (json_int_t)sent + 1);
    json_decref(a);
    free(body);

    /* The join: after the window, every row once, with its label. */
    assert_true(wait_metric(&s, "kiln_serve_join_rows_total{model=\"ctr\"} ", REQS * PER,
                            15000) == REQS * PER);
    jrow_t rows[REQS * PER + 8];
    int parts, n = read_partitions(&s, rows, REQS * PER + 8, &parts);
    assert_int_equal(n, REQS * PER);
    assert_true(parts >= 1);
    for (int q = 0; q < REQS; q++)
        for (int r = 0; r < PER; r++) {
            char id[32];
            snprintf(id, sizeof id, "q%dr%d", q, r);
            const jrow_t *j = find_row(rows, n, id);
            assert_non_null(j);
            assert_int_equal(j->y, label_of[q][r]);
        }
    assert_int_equal(segments_left(&s), 0);
    /* Feedback now is late. */
    assert_int_equal(feedback(&s, "[{\"request_key\":\"k3\",\"row\":0,\"label\":1}]", true, &a),
                     200);
    assert_int_equal(json_integer_value(json_object_get(a, "late")), 1);
    json_decref(a);
    assert_true(metric(&s, "kiln_serve_feedback_total{model=\"ctr\",result=\"late\"} ") == 1);
    assert_true(metric(&s, "kiln_serve_feedback_total{model=\"ctr\",result=\"unknown\"} ") ==
                4); /* twice 2: the retry's are counted as well */

    /* The online metrics against a computation here. */
    double want[2][6]; /* per label: n, pos, logloss, auc, calibration, var of the loss */
    for (int b = 0; b < 2; b++) {
        double n_ = 0, pos = 0, ll = 0, ll2 = 0, sp = 0, pairs = 0, wins = 0;
        for (int q = b; q < REQS; q += 2)
            for (int r = 0; r < PER; r++) {
                double p = prob[q][r];
                int y = label_of[q][r];
                double l = y ? -log(p) : -log(1 - p);
                n_++, pos += y, ll += l, ll2 += l * l, sp += p;
                if (!y)
                    continue;
                for (int q2 = b; q2 < REQS; q2 += 2)
                    for (int r2 = 0; r2 < PER; r2++)
                        if (!label_of[q2][r2]) {
                            pairs++;
                            wins += prob[q][r] > prob[q2][r2] ? 1
                                    : prob[q][r] == prob[q2][r2] ? 0.5 : 0;
                        }
            }
        want[b][0] = n_, want[b][1] = pos, want[b][2] = ll / n_, want[b][3] = wins / pairs;
        want[b][4] = (sp / n_) / (pos / n_);
        want[b][5] = (ll2 - ll * ll / n_) / (n_ - 1);
    }
    for (int round = 0; round < 2; round++) { /* before and after a restart */
        char url[128];
        snprintf(url, sizeof url, "%s/v1/models/ctr/online", s.url);
        json_t *j = fx_get_json(url);
        assert_non_null(j);
        json_t *labels = json_object_get(j, "labels");
        assert_int_equal(json_array_size(labels), 2);
        for (int b = 0; b < 2; b++) {
            json_t *o = json_array_get(labels, (size_t)b);
            assert_string_equal(json_string_value(json_object_get(o, "label")), b ? "B" : "A");
            assert_int_equal(json_integer_value(json_object_get(o, "impressions")), want[b][0]);
            assert_int_equal(json_integer_value(json_object_get(o, "positives")), want[b][1]);
            assert_true(fabs(json_real_value(json_object_get(o, "logloss")) - want[b][2]) <
                        1e-5);
            assert_true(fabs(json_real_value(json_object_get(o, "auc")) - want[b][3]) < 0.02);
            assert_true(fabs(json_real_value(json_object_get(o, "calibration")) - want[b][4]) <
                        1e-5);
        }
        json_t *c = json_array_get(json_object_get(j, "comparisons"), 0);
        assert_string_equal(json_string_value(json_object_get(c, "base")), "A");
        double diff = want[1][2] - want[0][2];
        double se = sqrt(want[0][5] / want[0][0] + want[1][5] / want[1][0]);
        assert_true(fabs(json_real_value(json_object_get(c, "logloss_diff")) - diff) < 1e-5);
        json_t *ci = json_object_get(c, "ci95");
        assert_true(fabs(json_real_value(json_array_get(ci, 0)) - (diff - 1.959964 * se)) <
                    1e-4);
        assert_true(fabs(json_real_value(json_array_get(ci, 1)) - (diff + 1.959964 * se)) <
                    1e-4);
        json_decref(j);
        if (round == 0) {
            char murl[128];
            snprintf(murl, sizeof murl, "%s/metrics", s.url);
            char *m = fx_get(murl);
            assert_non_null(m);
            fx_promtool_check(tmp, "loop-metrics", m, strlen(m));
            free(m);
            srv_stop(&s, SIGTERM);
            srv_start(&s);
        }
    }
    srv_stop(&s, SIGTERM);
}

/* A TSV predict keyed by the Kiln-Request-Key header logs its rows by index,
 * less their label column; requests whose ids the log cannot hold are
 * refused whole, before anything is predicted or logged. */
static void test_header_key_and_bad_ids(void **state)
{
    (void)state;
    srv_t s;
    srv_init(&s, "header", PORT0 + 5);
    srv_start(&s);
    push_lr(&s, "A", "ck-h");
    char url[160];
    snprintf(url, sizeof url, "%s/v1/models/ctr/predict?label=A", s.url);
    const char *h[] = {"Kiln-Request-Key: hdr-1", NULL};
    const char *tsv = "1\t3\tca\tcb\n5\tcc\tcd\n"; /* with a label column, then without */
    fx_reply_t r;
    assert_int_equal(fx_http(&r, "POST", url, h, tsv, strlen(tsv), 10), 200);
    fx_reply_fini(&r);
    /* Refused: row_ids of the wrong count, a row id with a newline, a key too long. */
    char lines[2][64] = {"1\tx\ty", "2\tx\ty"};
    const char *ids_short[2] = {"only-one", NULL};
    json_t *req = json_pack("{s:[s,s],s:s,s:[s]}", "rows", lines[0], lines[1], "request_key", "k",
                            "row_ids", ids_short[0]);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    assert_int_equal(fx_http(&r, "POST", url, NULL, body, strlen(body), 10), 400);
    assert_non_null(strstr(r.body, "one id per row"));
    fx_reply_fini(&r);
    free(body);
    const char *ids_nl[2] = {"a", "b\nc"};
    assert_int_equal(predict(&s, "k2", "A", 2, lines, ids_nl, NULL), 400);
    char longkey[200];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    assert_int_equal(predict(&s, longkey, "A", 2, lines, NULL, NULL), 400);
    /* Without a request key nothing is logged. */
    assert_int_equal(fx_http(&r, "POST", url, NULL, tsv, strlen(tsv), 10), 200);
    fx_reply_fini(&r);
    assert_true(wait_metric(&s, "kiln_serve_impressions_logged_total{model=\"ctr\"} ", 2, 5000) ==
                2);
    proc_sleep_ms(200);
    assert_true(metric(&s, "kiln_serve_impressions_logged_total{model=\"ctr\"} ") == 2);
    char got[2][64] = {"", ""};
    char *segs = segments_text(&s);
    for (char *l = segs, *nl; (nl = strchr(l, '\n')) != NULL; l = nl + 1) {
        *nl = '\0';
        char key[16], row[8], feat[64];
        assert_int_equal(sscanf(l, "%*[^\t]\t%*[^\t]\t%*[^\t]\t%*[^\t]\t%15[^\t]\t%7[^\t]\t%63[^\n]",
                                key, row, feat),
                         3);
        assert_string_equal(key, "hdr-1");
        assert_true(atoi(row) == 0 || atoi(row) == 1);
        snprintf(got[atoi(row)], sizeof got[0], "%s", feat);
    }
    free(segs);
    assert_string_equal(got[0], "3\tca\tcb"); /* the label column is not a feature */
    assert_string_equal(got[1], "5\tcc\tcd");
    /* Feedback by the row's index finds it. */
    json_t *a = NULL;
    assert_int_equal(feedback(&s, "[{\"request_key\":\"hdr-1\",\"row\":1,\"label\":true}]",
                              true, &a),
                     200);
    assert_int_equal(json_integer_value(json_object_get(a, "accepted")), 1);
    json_decref(a);
    srv_stop(&s, SIGTERM);
}

/* ---- kill -9 while appending and inside joins -------------------------------------- */

#define ROUNDS 5
#define KREQS 10
#define KPER 5

typedef struct streamer {
    const srv_t *s;
    int round, answered;
} streamer_t;

static void *stream_predicts(void *arg)
{
    streamer_t *st = arg;
    for (int q = 0; q < 400; q++) {
        char lines[KPER][64], key[32];
        for (int r = 0; r < KPER; r++)
            snprintf(lines[r], sizeof lines[r], "%d\tc\tm%dq%dr%d", r, st->round, q, r);
        snprintf(key, sizeof key, "m%dq%d", st->round, q);
        if (predict(st->s, key, "A", KPER, lines, NULL, NULL) != 200)
            break;
        st->answered = q + 1;
    }
    return NULL;
}

/* What the join last finished: the newest partition's name, or (metrics)
 * online.json's joined_through, into buf. */
static void join_mark(const srv_t *s, bool metrics, char *buf, size_t cap)
{
    char p[480];
    buf[0] = '\0';
    if (metrics) {
        snprintf(p, sizeof p, "%s/ctr/online.json", s->imp);
        json_t *j = json_load_file(p, 0, NULL);
        snprintf(buf, cap, "%lld",
                 (long long)json_integer_value(json_object_get(j, "joined_through")));
        json_decref(j);
        return;
    }
    snprintf(p, sizeof p, "%s/ctr", s->join);
    DIR *d = opendir(p);
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, "part=", 5) == 0 && strcmp(e->d_name, buf) > 0)
            snprintf(buf, cap, "%.60s", e->d_name);
    if (d)
        closedir(d);
}

static void test_join_exactly_once_kill9(void **state)
{
    (void)state;
    srv_t s;
    srv_init(&s, "kill", PORT0 + 2);
    s.window = "1s";
    s.hold_ms = "150"; /* each join step takes 150 ms: kills land inside joins */
    srv_start(&s);
    push_lr(&s, "A", "ck-k");
    int logged_total = 0, streamed[ROUNDS] = {0}, streamed_logged[ROUNDS] = {0};
    /* When each round's kill comes after its predicts were logged (ms): before
     * the window passed, then inside the join's steps. */
    static const int kill_after_ms[ROUNDS] = {100, 1450, 1700, 0, 0};
    for (int round = 0; round < ROUNDS; round++) {
        for (int q = 0; q < KREQS; q++) {
            char lines[KPER][64], key[32];
            for (int r = 0; r < KPER; r++)
                snprintf(lines[r], sizeof lines[r], "%d\tc\tw%dq%dr%d", r, round, q, r);
            snprintf(key, sizeof key, "w%dq%d", round, q);
            assert_int_equal(predict(&s, key, "A", KPER, lines, NULL, NULL), 200);
        }
        logged_total += KREQS * KPER;
        /* Feedback: row 0 of every request clicked. */
        json_t *items = json_array();
        for (int q = 0; q < KREQS; q++) {
            char key[32];
            snprintf(key, sizeof key, "w%dq%d", round, q);
            json_array_append_new(items, json_pack("{s:s,s:i,s:i}", "request_key", key, "row",
                                                   0, "label", 1));
        }
        char *body = json_dumps(items, JSON_COMPACT);
        json_decref(items);
        json_t *a = NULL;
        assert_int_equal(feedback(&s, body, true, &a), 200);
        assert_int_equal(json_integer_value(json_object_get(a, "accepted")), KREQS);
        json_decref(a);
        free(body);
        double logged = wait_metric(&s, "kiln_serve_impressions_logged_total{model=\"ctr\"} ",
                                    KREQS * KPER, 5000);
        assert_true(logged >= KREQS * KPER);
        /* Meanwhile a stream of predicts without feedback: the kill lands
         * while they are being appended. */
        streamer_t st = {.s = &s, .round = round};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, stream_predicts, &st), 0);
        if (round < 3) {
            proc_sleep_ms(kill_after_ms[round]);
        } else {
            /* Deterministic points: just after a partition was renamed into
             * place (round 3) or the metrics saved (round 4), before the
             * segment is removed (the join pauses 150 ms after each step). */
            char was[64] = "", now[64] = "";
            join_mark(&s, round == 4, was, sizeof was);
            for (int t = 0; t < 1000; t++) {
                join_mark(&s, round == 4, now, sizeof now);
                if (strcmp(now, was) != 0)
                    break;
                proc_sleep_ms(5);
            }
            assert_string_not_equal(now, was);
        }
        double before = metric(&s, "kiln_serve_impressions_logged_total{model=\"ctr\"} ");
        srv_stop(&s, SIGKILL);
        pthread_join(th, NULL);
        streamed[round] = st.answered;
        streamed_logged[round] = (int)before - KREQS * KPER; /* logged before the kill: a floor */
        srv_start(&s);
    }
    /* After the last restart: everything joins (the hold off would be
     * faster, but the same process finishes what it found). */
    for (int t = 0; t < 300 && segments_left(&s) > 0; t++)
        proc_sleep_ms(100);
    assert_int_equal(segments_left(&s), 0);
    proc_sleep_ms(600); /* the last join's steps after its segment is gone */
    jrow_t *rows = calloc(NROWS_MAX * 8, sizeof *rows);
    int parts, n = read_partitions(&s, rows, NROWS_MAX * 8, &parts);
    /* Every row of the first predicts of each round: once, row 0 clicked. */
    for (int round = 0; round < ROUNDS; round++)
        for (int q = 0; q < KREQS; q++)
            for (int r = 0; r < KPER; r++) {
                char id[32];
                snprintf(id, sizeof id, "w%dq%dr%d", round, q, r);
                const jrow_t *j = find_row(rows, n, id);
                if (j == NULL)
                    fail_msg("row %s logged before a kill -9 was never joined", id);
                assert_int_equal(j->y, r == 0);
            }
    /* The streamed rows: each at most once, at least as many as were logged
     * before the kill, at most as many as were answered. */
    int joined_streamed = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int got = 0;
        for (int q = 0; q < streamed[round] + 1; q++)
            for (int r = 0; r < KPER; r++) {
                char id[32];
                snprintf(id, sizeof id, "m%dq%dr%d", round, q, r);
                got += find_row(rows, n, id) != NULL;
            }
        assert_true(got >= streamed_logged[round]);
        assert_true(got <= (streamed[round] + 1) * KPER);
        joined_streamed += got;
    }
    assert_int_equal(n, logged_total + joined_streamed);
    /* The kills of rounds 3 and 4 came inside joins, which the restarts finished. */
    assert_true(log_count(s.log, "is there already") >= 2);
    assert_true(log_count(s.log, "in the online metrics already") >= 1);
    /* The online metrics counted each joined row once too. */
    char url[128];
    snprintf(url, sizeof url, "%s/v1/models/ctr/online", s.url);
    json_t *j = fx_get_json(url);
    json_t *o = json_array_get(json_object_get(j, "labels"), 0);
    assert_int_equal(json_integer_value(json_object_get(o, "impressions")), n);
    assert_int_equal(json_integer_value(json_object_get(o, "positives")), ROUNDS * KREQS);
    json_decref(j);
    free(rows);
    srv_stop(&s, SIGTERM);
}

/* ---- a full disk and the cap ------------------------------------------------------------ */

static void test_full_disk_and_cap(void **state)
{
    (void)state;
    for (int which = 0; which < 2; which++) {
        srv_t s;
        srv_init(&s, which ? "cap" : "disk", PORT0 + 3 + which);
        s.window = "1h"; /* nothing is joined: the segments stay */
        if (which == 0)
            s.fsize = "16"; /* 8 KiB per file: the "disk" fills at once */
        else
            s.max = "65536";
        srv_start(&s);
        push_lr(&s, "A", "ck-d");
        for (int q = 0; q < 300; q++) {
            char lines[8][64], key[32];
            for (int r = 0; r < 8; r++)
                snprintf(lines[r], sizeof lines[r], "%d\tcategory-%d\tq%dr%d", r, q, q, r);
            snprintf(key, sizeof key, "request-key-%d", q);
            assert_int_equal(predict(&s, key, "A", 8, lines, NULL, NULL), 200);
        }
        const char *reason = which ? "kiln_serve_impressions_dropped_total{reason=\"cap\"} "
                                   : "kiln_serve_impressions_dropped_total{reason=\"disk\"} ";
        /* Every row is either logged or counted as dropped, once the writer drained. */
        double logged = 0, dropped = 0;
        for (int t = 0; t < 100 && logged + dropped < 2400; t++, proc_sleep_ms(50)) {
            logged = metric(&s, "kiln_serve_impressions_logged_total{model=\"ctr\"} ");
            dropped = metric(&s, reason);
        }
        assert_true(dropped > 0);
        assert_true(logged > 0);
        assert_true(logged + dropped == 2400);
        if (which == 1)
            assert_true(metric(&s, "kiln_serve_impressions_bytes ") <= 65536);
        /* Logged once per streak, not once per row. */
        char needle[64];
        snprintf(needle, sizeof needle, "dropping impressions (%s)", which ? "cap" : "disk");
        int lines = log_count(s.log, needle);
        assert_true(lines >= 1 && lines <= 3);
        srv_stop(&s, SIGTERM);
    }
}

static int setup(void **state)
{
    (void)state;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (proc_tmpdir("serve-loop", tmp, sizeof tmp) < 0)
        return -1;
    *state = tmp;
    return 0;
}

static int teardown(void **state)
{
    fx_stop_all();
    return proc_tmpdir_teardown(state);
}

PROC_TEST_MAIN(setup, teardown, cmocka_unit_test(test_impressions_feedback_join),
               cmocka_unit_test(test_header_key_and_bad_ids),
               cmocka_unit_test(test_join_exactly_once_kill9),
               cmocka_unit_test(test_full_disk_and_cap))
