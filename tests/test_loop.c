/*
 * tests/test_loop.c - the loop closed, with the real programs: kilnd, kiln-
 * train under mpirun, kiln-serve endpoints on loopback, the kiln command,
 * one SQLite file per test. Covered:
 *   - five fresh jobs with relative data paths submitted to a running kilnd
 *     all succeed (the submit race: the run and its spec directory commit
 *     together);
 *   - one kiln-serve holding labels A and B keeps both in Kiln's records
 *     through push, promote and rollback;
 *   - a cron job with incremental data: three partitions arrive over time,
 *     each run's delta reaches B with no command typed, and `kiln lineage`
 *     walks from each partition file to B;
 *   - an endpoint down when a run succeeds: the push is pending with the
 *     reason (and shown "full": the endpoint holds nothing a delta could
 *     build on), then lands once the endpoint is back;
 *   - kilnd killed -9 between a run's success and its push (before the push
 *     went out, and after the endpoint applied it but before kilnd recorded
 *     it): after a restart the push lands exactly once;
 *   - the quality gate holds back a worse model;
 *   - push.ramp: B's traffic share on kiln-serve grows in steps from its
 *     first landed push to the cap, a held push sets it back to 0 %, the
 *     next push that lands starts it over and a failed one stops it again
 *     (events of the job, kiln split, kiln endpoints, the endpoints page
 *     and /api/endpoints show it);
 *   - an online job: at least three exports reach the endpoint while it
 *     trains;
 *   - a cron job over Parquet partitions written by DuckDB: a partition
 *     still being written (no trailing PAR1) is left alone, then trained on
 *     once it is whole, exactly once, and its delta reaches B.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "kiln.h"
#include "proc.h"
#include "run.h"
#include "state.h"
#include "state_int.h"

#ifndef KILN_BIN
#error "KILN_BIN, KILND_BIN, KILN_TRAIN_BIN and KILN_SERVE_BIN must name the executables"
#endif

static int setup_all(void **state)
{
    (void)state;
    return fx_loop_suite_setup("loop");
}

/* Writes home/<dir>/job.yaml: an lr job over dir's data/day=*.tsv (relative
 * paths) with `extra` appended. */
static void write_job(const char *dir, const char *name, const char *extra, char *path,
                      size_t cap)
{
    char d[400];
    snprintf(d, sizeof d, "%s/%s", fx_loop.home, dir);
    mkdir(d, 0755);
    snprintf(path, cap, "%s/job.yaml", d);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "name: %s\n"
            "resources: {ranks: 1, threads: 1}\n"
            "model: {type: lr, embedding: {dim: 4, capacity: 100000}}\n"
            "%s",
            name, extra);
    if (strncmp(extra, "train:", 6) != 0 && strstr(extra, "\ntrain:") == NULL)
        fprintf(f, "train: {batch_size: 128, log_every: 2}\n");
    if (strstr(extra, "data:") == NULL)
        fprintf(f, "data: {train: \"data/day=*.tsv\", eval: \"%s/eval.tsv\"}\n", fx_loop.data_dir);
    fclose(f);
}

/* Lands the shared data file `which` as home/<dir>/data/day=<n>.tsv. */
static void land(const char *dir, const char *which, int n)
{
    char src[400], dst[500];
    snprintf(src, sizeof src, "%s/%s", fx_loop.data_dir, which);
    snprintf(dst, sizeof dst, "%s/%s/data/day=%d.tsv", fx_loop.home, dir, n);
    assert_int_equal(fx_land(src, dst), 0);
}

/* Runs sql on the test's database. Returns 0 or a KILN_E* code. */
static int db_exec(const char *sql)
{
    state_t *st = fx_loop_db();
    int rc = state_test_exec(st, sql);
    state_close(st);
    return rc;
}

/* Prints the last cap bytes of path, under a title (a failure's evidence:
 * CI removes the test's home). */
static void print_tail(const char *title, const char *path)
{
    static char buf[16384];
    proc_slurp(path, buf, sizeof buf);
    size_t n = strlen(buf);
    print_message("---- %s (%s), last %zu bytes ----\n%s\n", title, path,
                  n < 4000 ? n : (size_t)4000, n < 4000 ? buf : buf + n - 4000);
}

/* Prints the supervisor (pid sup, which leads the run's process group and
 * session) and every process below it (mpirun and the ranks have process
 * groups of their own): pid, parent, name, state, where it waits in the
 * kernel and its kernel stack, for a run that does not end. */
static void print_group(long long sup)
{
    enum { MAXP = 4096 };
    static int pid[MAXP], ppid[MAXP];
    static char mark[MAXP];
    int n = 0;
    DIR *proc = opendir("/proc");
    struct dirent *e;
    while (proc && (e = readdir(proc)) != NULL && n < MAXP) {
        char name[64], st = 0;
        int pg = 0;
        pid[n] = atoi(e->d_name);
        if (pid[n] > 0 && proc_stat(pid[n], name, sizeof name, &st, &ppid[n], &pg) == 0) {
            mark[n] = pid[n] == sup;
            n++;
        }
    }
    if (proc)
        closedir(proc);
    for (int changed = 1; changed;) { /* every descendant of sup */
        changed = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n && !mark[i]; j++)
                if (mark[j] && ppid[i] == pid[j])
                    mark[i] = changed = 1;
    }
    print_message("---- the run's processes (supervisor %lld and below) ----\n", sup);
    for (int i = 0; i < n; i++) {
        char p[300], name[64], wchan[128] = "", stack[2048] = "", st = 0;
        int pp = 0, pg = 0;
        if (!mark[i] || proc_stat(pid[i], name, sizeof name, &st, &pp, &pg) < 0)
            continue;
        snprintf(p, sizeof p, "/proc/%d/wchan", pid[i]);
        proc_slurp(p, wchan, sizeof wchan);
        snprintf(p, sizeof p, "/proc/%d/stack", pid[i]);
        proc_slurp(p, stack, sizeof stack);
        print_message("  %d (parent %d, group %d) %s %c wchan %s\n%s", pid[i], pp, pg, name, st,
                      wchan, stack);
    }
}

/* Waits until run id ends; returns its state. When it does not, prints the
 * run's state, its processes, kilnd's log and the run's own log before
 * failing. */
static state_run_state_t wait_end(int64_t id, int timeout_s)
{
    state_t *st = fx_loop_db();
    state_run_state_t got = fx_wait_run(st, id, STATE_RUN_NSTATES, timeout_s);
    if (!state_run_state_terminal(got)) {
        char path[600];
        state_run_t r;
        if (state_run_get(st, id, &r) == 0) {
            print_message("run %lld is %s (pgid %lld)\n", (long long)id,
                          state_run_state_name(r.state), (long long)r.pgid);
            if (r.pgid > 0)
                print_group((long long)r.pgid);
            if (r.run_dir != NULL) {
                snprintf(path, sizeof path, "%s/%s", r.run_dir, RUN_FILE_LOG);
                print_tail("the run's log", path);
            }
            state_run_fini(&r);
        }
        snprintf(path, sizeof path, "%s/kilnd.log", fx_loop.home);
        print_tail("kilnd's log", path);
    }
    state_close(st);
    if (!state_run_state_terminal(got))
        fail_msg("run %lld did not end within %d s (see %s/kilnd.log)", (long long)id, timeout_s,
                 fx_loop.home);
    return got;
}

/* The pushes of run id, oldest first, into ps (state_pushes_free). */
static size_t run_pushes(int64_t id, state_push_t **ps)
{
    state_t *st = fx_loop_db();
    state_push_filter_t f = {.run_id = id};
    size_t n = 0;
    assert_int_equal(state_push_list(st, &f, STATE_PAGE_MAX, ps, &n), 0);
    state_close(st);
    for (size_t i = 0; i < n / 2; i++) { /* newest first -> oldest first */
        state_push_t t = (*ps)[i];
        (*ps)[i] = (*ps)[n - 1 - i];
        (*ps)[n - 1 - i] = t;
    }
    return n;
}

/* Waits until run id has a push in state `want` (or any ended one when want
 * is STATE_PUSH_NSTATES); returns that push's state. */
static state_push_state_t wait_push(int64_t id, state_push_state_t want, int timeout_s)
{
    state_push_state_t got = STATE_PUSH_NSTATES;
    for (int i = 0; i < timeout_s * 10; i++) {
        state_push_t *ps = NULL;
        size_t n = run_pushes(id, &ps);
        for (size_t k = 0; k < n; k++)
            if (ps[k].state == want ||
                (want == STATE_PUSH_NSTATES && state_push_state_ended(ps[k].state)))
                got = ps[k].state;
        state_pushes_free(ps, n);
        if (got != STATE_PUSH_NSTATES)
            return got;
        proc_sleep_ms(100);
    }
    fail_msg("run %lld has no push %s within %d s (see %s/kilnd.log)", (long long)id,
             want < STATE_PUSH_NSTATES ? state_push_state_name(want) : "that ended", timeout_s,
             fx_loop.home);
    return got;
}

/* The uid of the final checkpoint of run id. */
static void run_checkpoint(int64_t id, char *out, size_t cap)
{
    state_t *st = fx_loop_db();
    state_checkpoint_t c;
    assert_int_equal(state_checkpoint_newest_of_run(st, id, false, &c), 0);
    snprintf(out, cap, "%s", c.uid);
    state_checkpoint_fini(&c);
    state_close(st);
}

/* Waits until endpoint s holds uid for model/label. */
static void wait_holds(const fx_serve_t *s, const char *model, const char *label, const char *uid,
                       int timeout_s)
{
    char h[64] = "";
    for (int i = 0; i < timeout_s * 10; i++) {
        fx_holds(s, model, label, h, sizeof h);
        if (strcmp(h, uid) == 0)
            return;
        proc_sleep_ms(100);
    }
    fail_msg("%s %s/%s holds '%s', not %s, after %d s (see %s/kilnd.log)", s->url, model, label, h,
             uid, timeout_s, fx_loop.home);
}

/* Waits until s's label B holds the final checkpoint of run id, whose uid
 * goes to ck. */
static void wait_b_holds_run(const fx_serve_t *s, int64_t id, char *ck, size_t cap, int timeout_s)
{
    run_checkpoint(id, ck, cap);
    wait_holds(s, "ctr", "B", ck, timeout_s);
}

/* Starts a kiln-serve in home/serve, the directory it returns. */
static const char *serve_start(fx_serve_t *s)
{
    static char sdir[400];
    snprintf(sdir, sizeof sdir, "%s/serve", fx_loop.home);
    assert_true(fx_serve_start(s, sdir));
    return sdir;
}

/* A data section over home/<dir>/data/day=*.tsv read one new partition a
 * run; its %s is the shared data directory. */
/* Partitions land by rename (fx_land), complete at once: no quiet period. */
#define INCREMENTAL_DATA                                                                           \
    "data: {train: \"data/day=*.tsv\", eval: \"%s/eval.tsv\", incremental: true, "            \
    "settle: 0s}\n"

/* Job spec lines for write_job: `head`, then a push with the token from
 * KILN_TEST_TOKEN and the options `opts` to label B of model ctr at url. */
static void push_to_b(char *extra, size_t cap, const char *head, const char *opts, const char *url)
{
    snprintf(extra, cap,
             "%s"
             "push:\n  token_env: KILN_TEST_TOKEN\n%s  endpoints:\n"
             "    - {url: \"%s\", model: ctr, label: B}\n",
             head, opts, url);
}

/* Writes job `name` in home/<name>/ with `extra`, lands day0.tsv as its
 * first partition, starts kilnd with env and submits the job; its spec's
 * path goes to spec. Returns the run the submit made. */
static int64_t submit_first(const char *name, const char *extra, const char *const *env, char *spec,
                            size_t cap)
{
    write_job(name, name, extra, spec, cap);
    land(name, "day0.tsv", 0);
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, env);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    return fx_loop_newest_run(name);
}

/* ---- the submit race ------------------------------------------------------------------- */

static void test_five_relative_submits(void **state)
{
    (void)state;
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    char spec[5][500];
    for (int i = 0; i < 5; i++) {
        char dir[32], name[32];
        snprintf(dir, sizeof dir, "j%d", i);
        snprintf(name, sizeof name, "fresh%d", i);
        write_job(dir, name, "", spec[i], sizeof spec[i]);
        land(dir, "day0.tsv", 0);
    }
    /* Submitted back to back while kilnd watches: each run must see its
     * spec's directory at once. */
    for (int i = 0; i < 5; i++) {
        const char *args[] = {"submit", spec[i], NULL};
        fx_loop_kiln_ok(args);
    }
    for (int i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "fresh%d", i);
        int64_t id = fx_loop_newest_run(name);
        assert_true(id > 0);
        if (wait_end(id, 120) != STATE_RUN_SUCCEEDED) {
            state_t *st = fx_loop_db();
            state_run_t r;
            assert_int_equal(state_run_get(st, id, &r), 0);
            fail_msg("run %lld of %s: %s", (long long)id, name, r.error ? r.error : "?");
        }
    }
}

/* ---- one kiln-serve, labels A and B ------------------------------------------------------- */

static void test_one_serve_two_labels(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], extra[1024];
    serve_start(&s);
    /* A is the champion (auto: false): only deliberate pushes change it. */
    snprintf(extra, sizeof extra,
             "export: {on_success: incremental}\n"
             "push:\n  token_env: KILN_TEST_TOKEN\n  endpoints:\n"
             "    - {url: \"%s\", model: ctr, label: A, auto: false}\n"
             "    - {url: \"%s\", model: ctr, label: B}\n",
             s.url, s.url);
    int64_t r1 = submit_first("ab", extra, NULL, spec, sizeof spec);
    assert_int_equal(wait_end(r1, 120), STATE_RUN_SUCCEEDED);
    assert_int_equal(wait_push(r1, STATE_PUSH_SUCCEEDED, 60), STATE_PUSH_SUCCEEDED);
    char ck1[64], ck2[64], h[64];
    wait_b_holds_run(&s, r1, ck1, sizeof ck1, 30);
    fx_holds(&s, "ctr", "A", h, sizeof h);
    assert_string_equal(h, ""); /* auto: false */

    /* promote B -> A: both labels on one URL stay in the records. */
    const char *promote[] = {"promote", "--model", "ctr", "--from", "B", "--to", "A", NULL};
    fx_loop_kiln_ok(promote);
    wait_holds(&s, "ctr", "A", ck1, 10);

    /* A second run: B gets its delta, A keeps ck1. */
    land("ab", "day1.tsv", 1);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    int64_t r2 = fx_loop_newest_run("ab");
    assert_true(r2 > r1);
    assert_int_equal(wait_end(r2, 120), STATE_RUN_SUCCEEDED);
    wait_b_holds_run(&s, r2, ck2, sizeof ck2, 60);
    /* promote reads what B holds from Kiln's records: wait for kilnd to
     * record the push it made. */
    assert_int_equal(wait_push(r2, STATE_PUSH_SUCCEEDED, 30), STATE_PUSH_SUCCEEDED);
    fx_holds(&s, "ctr", "A", h, sizeof h);
    assert_string_equal(h, ck1);
    const char *promote2[] = {"promote", "--model", "ctr", "--from", "B", "--to", "A", NULL};
    fx_loop_kiln_ok(promote2);
    wait_holds(&s, "ctr", "A", ck2, 10);
    /* rollback of A: back to ck1; B untouched. */
    const char *rollback[] = {"rollback", "--model", "ctr", "--label", "A", NULL};
    fx_loop_kiln_ok(rollback);
    wait_holds(&s, "ctr", "A", ck1, 10);
    fx_holds(&s, "ctr", "B", h, sizeof h);
    assert_string_equal(h, ck2);

    /* The records agree with the endpoint, label by label. */
    state_t *st = fx_loop_db();
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    assert_int_equal(state_endpoint_list(st, &es, &n), 0);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(es[i].url, s.url) != 0)
            continue;
        seen++;
        assert_non_null(es[i].checkpoint_uid);
        assert_string_equal(es[i].checkpoint_uid, strcmp(es[i].label, "A") == 0 ? ck1 : ck2);
    }
    assert_int_equal(seen, 2);
    state_endpoint_infos_free(es, n);
    state_close(st);
}

/* ---- a cron job, three partitions ----------------------------------------------------------- */

/* `kiln --json lineage REF` as JSON (the test fails if the command does). */
static json_t *lineage_json(const char *ref)
{
    proc_result_t *r = calloc(1, sizeof *r);
    const char *args[] = {"--json", "lineage", ref, NULL};
    fx_kiln(&fx_loop.kd, r, args);
    if (r->code != 0)
        fail_msg("kiln lineage %s: exit %d: %s", ref, r->code, r->err);
    json_t *doc = json_loads(r->out, 0, NULL);
    if (doc == NULL)
        fail_msg("kiln lineage %s printed no JSON: %s", ref, r->out);
    free(r);
    return doc;
}

/* Whether a lineage document names endpoint label B as serving its lineage. */
static bool lineage_reaches_b(json_t *doc)
{
    json_t *eps = json_object_get(doc, "endpoints");
    for (size_t i = 0; i < json_array_size(eps); i++) {
        json_t *e = json_array_get(eps, i);
        if (strcmp(json_string_value(json_object_get(e, "label")), "B") == 0 &&
            json_is_true(json_object_get(e, "serves_this_lineage")))
            return true;
    }
    return false;
}

/* Lineage walks forward from the first run, across the later runs that
 * started from its checkpoint, to B; and back from B's URL to every
 * partition file. */
static void check_lineage_from_run_and_endpoint(int64_t first, const fx_serve_t *s)
{
    char ref[32];
    snprintf(ref, sizeof ref, "%lld", (long long)first);
    json_t *doc = lineage_json(ref);
    if (!lineage_reaches_b(doc))
        fail_msg("lineage forward from run %s does not reach B", ref);
    json_decref(doc);
    doc = lineage_json(s->url);
    char *text = json_dumps(doc, 0);
    for (int p = 0; p < 3; p++) {
        char file[64];
        snprintf(file, sizeof file, "/cron/data/day=%d.tsv", p);
        if (strstr(text, file) == NULL)
            fail_msg("lineage back from %s does not name %s: %s", s->url, file, text);
    }
    free(text);
    json_decref(doc);
}

/* `kiln logs` shows the trainer's progress: step, loss and samples/s. */
static void check_logs(int64_t id)
{
    char ref[32];
    snprintf(ref, sizeof ref, "%lld", (long long)id);
    proc_result_t *r = calloc(1, sizeof *r);
    const char *args[] = {"logs", ref, NULL};
    fx_kiln(&fx_loop.kd, r, args);
    assert_int_equal(r->code, 0);
    if (strstr(r->out, "step ") == NULL || strstr(r->out, "loss ") == NULL ||
        strstr(r->out, "samples/s") == NULL)
        fail_msg("kiln logs %s shows no progress line: %s", ref, r->out);
    free(r);
}

/* The numbers of an SVG's <text class="CLS"> labels, in order. */
static int svg_ticks(const char *svg, const char *cls, double *v, int cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "class=\"%s\"", cls);
    int n = 0;
    for (const char *p = strstr(svg, pat); p != NULL && n < cap; p = strstr(p + 1, pat)) {
        const char *gt = strchr(p, '>');
        if (gt != NULL)
            v[n++] = strtod(gt + 1, NULL);
    }
    return n;
}

/* Ticks at round numbers: evenly spaced by 1, 2 or 5 times a power of ten. */
static void assert_round_ticks(const double *v, int n, const char *axis)
{
    if (n < 2)
        fail_msg("%s axis: %d ticks", axis, n);
    double step = v[1] - v[0];
    double e = pow(10.0, floor(log10(fabs(step))));
    double m = fabs(step) / e;
    if (!(fabs(m - 1) < 1e-6 || fabs(m - 2) < 1e-6 || fabs(m - 5) < 1e-6))
        fail_msg("%s axis: tick step %g is not 1, 2 or 5 times a power of ten", axis, step);
    for (int i = 0; i < n; i++) {
        if (fabs(v[i] / step - round(v[i] / step)) > 1e-6)
            fail_msg("%s axis: tick %g is not a multiple of %g", axis, v[i], step);
        if (i > 0 && fabs(v[i] - v[i - 1] - step) > 1e-6 * fabs(step))
            fail_msg("%s axis: ticks %g and %g are not %g apart", axis, v[i - 1], v[i], step);
    }
}

/* kilnd's status page: the run's pushes and loss curve (one point per step
 * of this short run, round ticks, no loss below 0), and the endpoints page
 * with what B holds, its eval figures and its traffic from /v1/stats. */
static void check_pages(int64_t id, const fx_serve_t *s, const char *uid)
{
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/api/runs/%lld", fx_loop.kd.web_port,
             (long long)id);
    json_t *doc = fx_get_json(url);
    if (doc == NULL)
        fail_msg("kilnd's page does not answer %s (see %s)", url, fx_loop.kd.log);
    json_t *pushes = json_object_get(doc, "pushes");
    assert_true(json_array_size(pushes) >= 1);
    json_t *last = json_array_get(pushes, json_array_size(pushes) - 1);
    assert_string_equal(json_string_value(json_object_get(last, "state")), "succeeded");
    assert_string_equal(json_string_value(json_object_get(last, "label")), "B");
    assert_int_equal(json_integer_value(json_object_get(last, "http_status")), 200);
    /* This run resumed at some step and trained to result.json's steps. */
    json_t *xs = json_object_get(json_object_get(doc, "loss"), "step");
    size_t points = json_array_size(xs);
    int64_t from = json_integer_value(json_array_get(xs, 0));
    int64_t to = json_integer_value(json_array_get(xs, points - 1));
    const char *rdir = json_string_value(json_object_get(json_object_get(doc, "run"), "run_dir"));
    char path[600], res[4096];
    snprintf(path, sizeof path, "%s/result.json", rdir);
    proc_slurp(path, res, sizeof res);
    json_t *result = json_loads(res, 0, NULL);
    int64_t steps = json_integer_value(json_object_get(result, "steps"));
    json_decref(result);
    if (points < 2 || to != steps || (int64_t)points != to - from + 1)
        fail_msg("run %lld: %zu loss points, steps %lld..%lld, result.json says %lld steps "
                 "(a short run shows every step)",
                 (long long)id, points, (long long)from, (long long)to, (long long)steps);
    json_decref(doc);

    snprintf(url, sizeof url, "http://127.0.0.1:%d/runs/%lld/loss.svg", fx_loop.kd.web_port,
             (long long)id);
    char *svg = fx_get(url);
    assert_non_null(svg);
    double v[64];
    int n = svg_ticks(svg, "ytick", v, 64);
    assert_round_ticks(v, n, "loss");
    for (int i = 0; i < n; i++)
        if (v[i] < 0)
            fail_msg("loss axis has a tick below 0: %g", v[i]);
    assert_round_ticks(v, svg_ticks(svg, "xtick", v, 64), "step");
    free(svg);

    /* One predict request to B; kilnd reads /v1/stats every second. */
    char purl[300], eval[400], cmd[1200];
    snprintf(purl, sizeof purl, "%s/v1/models/ctr/predict?label=B", s->url);
    snprintf(eval, sizeof eval, "%s/eval.tsv", fx_loop.data_dir);
    snprintf(cmd, sizeof cmd, "head -n 5 '%s' | curl -sf --data-binary @- '%s' > /dev/null", eval,
             purl);
    assert_int_equal(system(cmd), 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/api/endpoints", fx_loop.kd.web_port);
    bool seen = false;
    for (int i = 0; i < 100 && !seen; i++) {
        doc = fx_get_json(url);
        json_t *e = json_array_get(json_object_get(doc, "endpoints"), 0);
        json_t *holds = json_object_get(e, "holds");
        json_t *traffic = json_object_get(e, "traffic");
        seen = json_integer_value(json_object_get(traffic, "predict_requests")) >= 1;
        if (seen) {
            assert_string_equal(json_string_value(json_object_get(e, "label")), "B");
            assert_string_equal(json_string_value(json_object_get(holds, "uid")), uid);
            assert_true(json_is_number(json_object_get(holds, "eval_logloss")));
            assert_true(json_is_number(json_object_get(holds, "age_s")));
            assert_true(json_number_value(json_object_get(traffic, "share")) == 1.0);
        }
        json_decref(doc);
        if (!seen)
            proc_sleep_ms(100);
    }
    if (!seen)
        fail_msg("the endpoints API never showed B's predict traffic");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/endpoints", fx_loop.kd.web_port);
    char *html = fx_get(url);
    assert_non_null(html);
    if (strstr(html, uid) == NULL || strstr(html, "100.0%") == NULL)
        fail_msg("the endpoints page does not show %s and B's traffic share: %s", uid, html);
    free(html);
}

static void test_cron_three_partitions(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], head[600], extra[1024];
    serve_start(&s);
    snprintf(head, sizeof head,
             "schedule: \"@every 2s\"\n" INCREMENTAL_DATA "export: {on_success: incremental}\n",
             fx_loop.data_dir);
    push_to_b(extra, sizeof extra, head, "", s.url);
    write_job("cron", "hourly", extra, spec, sizeof spec);
    fx_loop.kd.web_port = proc_free_port();
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    const char *src[] = {"day0.tsv", "day1.tsv", "day0.tsv"};
    char ck[3][64];
    int64_t prev = 0, first = 0;
    for (int p = 0; p < 3; p++) {
        /* Partition p lands; with no command typed, its delta reaches B. */
        land("cron", src[p], p);
        int64_t id = 0;
        for (int i = 0; i < 600 && id == 0; i++) {
            state_t *st = fx_loop_db();
            state_run_t *rs = NULL;
            size_t n = 0;
            assert_int_equal(state_run_list(st, "hourly", 50, &rs, &n), 0);
            for (size_t k = 0; k < n && id == 0; k++)
                if (rs[k].id > prev && rs[k].state == STATE_RUN_SUCCEEDED)
                    id = rs[k].id;
            state_runs_free(rs, n);
            state_close(st);
            if (id == 0)
                proc_sleep_ms(100);
        }
        if (id == 0)
            fail_msg("no run consumed partition %d within 60 s (see %s/kilnd.log)", p,
                     fx_loop.home);
        wait_b_holds_run(&s, id, ck[p], sizeof ck[p], 60);
        assert_int_equal(wait_push(id, STATE_PUSH_SUCCEEDED, 30), STATE_PUSH_SUCCEEDED);
        state_push_t *ps = NULL;
        size_t n = run_pushes(id, &ps);
        assert_true(n >= 1);
        assert_int_equal(ps[n - 1].state, STATE_PUSH_SUCCEEDED);
        /* The first push is full (B held nothing); the others are deltas. */
        assert_int_equal(ps[n - 1].sent_full, p == 0);
        state_pushes_free(ps, n);
        if (first == 0)
            first = id;
        prev = id;
    }
    /* kiln lineage walks from each partition file to B. */
    for (int p = 0; p < 3; p++) {
        char file[500];
        snprintf(file, sizeof file, "%s/cron/data/day=%d.tsv", fx_loop.home, p);
        json_t *doc = lineage_json(file);
        if (!lineage_reaches_b(doc)) {
            char *text = json_dumps(doc, 0);
            fail_msg("lineage of %s does not reach B: %s", file, text);
            free(text);
        }
        json_decref(doc);
    }
    check_lineage_from_run_and_endpoint(first, &s);
    check_logs(prev);
    check_pages(prev, &s, ck[2]);
}

/* ---- an endpoint down, then back ------------------------------------------------------------ */

static void test_endpoint_down_then_up(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], extra[1024];
    const char *sdir = serve_start(&s); /* for a port of its own */
    fx_serve_stop(&s, SIGTERM);
    push_to_b(extra, sizeof extra, "export: {on_success: incremental}\n",
              "  retries: 0\n  timeout: 2s\n", s.url);
    int64_t id = submit_first("down", extra, NULL, spec, sizeof spec);
    /* The run succeeds whatever the endpoint does. */
    assert_int_equal(wait_end(id, 120), STATE_RUN_SUCCEEDED);
    /* Its push is pending, with the reason. */
    state_push_t *ps = NULL;
    size_t n = 0;
    for (int i = 0; i < 300; i++) {
        n = run_pushes(id, &ps);
        if (n > 0 && ps[0].state == STATE_PUSH_PENDING && ps[0].rounds > 0)
            break;
        state_pushes_free(ps, n);
        ps = NULL;
        n = 0;
        proc_sleep_ms(100);
    }
    assert_int_equal(n, 1);
    assert_int_equal(ps[0].state, STATE_PUSH_PENDING);
    assert_non_null(ps[0].error);
    assert_int_equal(ps[0].http_status, 0); /* nothing answered */
    state_pushes_free(ps, n);
    /* `kiln show` names it, and says it will go out full: it asks for a
     * delta (on_success: incremental), but B holds nothing to build on. */
    proc_result_t *r = calloc(1, sizeof *r);
    char ids[32];
    snprintf(ids, sizeof ids, "%lld", (long long)id);
    const char *show[] = {"show", ids, NULL};
    fx_kiln(&fx_loop.kd, r, show);
    assert_non_null(strstr(r->out, s.url));
    if (strstr(r->out, ": pending, full") == NULL)
        fail_msg("kiln show %s does not show the pending push as full:\n%s", ids, r->out);
    free(r);
    /* The endpoint comes back on its port: kilnd's retry lands the push. */
    assert_true(fx_serve_start(&s, sdir));
    char ck[64];
    wait_b_holds_run(&s, id, ck, sizeof ck, 60);
    assert_int_equal(wait_push(id, STATE_PUSH_SUCCEEDED, 30), STATE_PUSH_SUCCEEDED);
}

/* ---- kill -9 between success and push -------------------------------------------------------- */

/* kilnd holds a claimed push (KILN_TEST_PUSH_DELAY_MS before sending, or
 * KILN_TEST_PUSH_HOLD_MS after the endpoint answered and before recording)
 * and is killed -9 meanwhile; a new kilnd delivers it, once. */
static void kill9_case(const char *hook)
{
    fx_serve_t s = {0};
    char spec[500], extra[1024];
    serve_start(&s);
    push_to_b(extra, sizeof extra, "export: {on_success: incremental}\n", "", s.url);
    const char *env[] = {hook, NULL};
    int64_t id = submit_first("k9", extra, env, spec, sizeof spec);
    assert_int_equal(wait_end(id, 120), STATE_RUN_SUCCEEDED);
    assert_int_equal(wait_push(id, STATE_PUSH_SENDING, 30), STATE_PUSH_SENDING);
    if (strstr(hook, "HOLD") != NULL) {
        /* Wait for the endpoint to apply it; kilnd has not recorded it. */
        for (int i = 0; i < 300 && fx_pushes_applied(&s) < 1; i++)
            proc_sleep_ms(100);
        assert_int_equal(fx_pushes_applied(&s), 1);
    }
    fx_kilnd_stop(&fx_loop.kd, SIGKILL);
    state_push_t *ps = NULL;
    size_t n = run_pushes(id, &ps);
    assert_int_equal(n, 1);
    assert_int_equal(ps[0].state, STATE_PUSH_SENDING); /* claimed by the dead kilnd */
    state_pushes_free(ps, n);
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    assert_int_equal(wait_push(id, STATE_PUSH_SUCCEEDED, 60), STATE_PUSH_SUCCEEDED);
    char ck[64];
    wait_b_holds_run(&s, id, ck, sizeof ck, 10);
    /* Exactly once: one push recorded, one applied by the endpoint. */
    n = run_pushes(id, &ps);
    assert_int_equal(n, 1);
    state_pushes_free(ps, n);
    proc_sleep_ms(1500);
    assert_int_equal(fx_pushes_applied(&s), 1);
}

static void test_kill9_before_push(void **state)
{
    (void)state;
    kill9_case("KILN_TEST_PUSH_DELAY_MS=4000");
}

static void test_kill9_after_apply(void **state)
{
    (void)state;
    kill9_case("KILN_TEST_PUSH_HOLD_MS=4000");
}

/* ---- the quality gate ---------------------------------------------------------------------------- */

/* day0.tsv with every label flipped: what a model learns from it is worse
 * on the eval data than what it learnt before. */
static void write_flipped(const char *dst)
{
    char src[400], line[65536];
    snprintf(src, sizeof src, "%s/day0.tsv", fx_loop.data_dir);
    FILE *in = fopen(src, "r"), *out = fopen(dst, "w");
    assert_non_null(in);
    assert_non_null(out);
    while (fgets(line, sizeof line, in) != NULL) {
        line[0] = line[0] == '1' ? '0' : '1';
        fputs(line, out);
    }
    fclose(in);
    fclose(out);
}

/* The head of a job that trains each new partition and pushes a delta. */
static void incremental_head(char *head, size_t cap)
{
    snprintf(head, cap, INCREMENTAL_DATA "export: {on_success: incremental}\n", fx_loop.data_dir);
}

static void test_quality_gate(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], extra[1024], bad[500], head[600];
    serve_start(&s);
    incremental_head(head, sizeof head);
    push_to_b(extra, sizeof extra, head, "  max_regression: 0.001\n", s.url);
    int64_t r1 = submit_first("gate", extra, NULL, spec, sizeof spec);
    assert_int_equal(wait_end(r1, 120), STATE_RUN_SUCCEEDED);
    char ck1[64], h[64];
    wait_b_holds_run(&s, r1, ck1, sizeof ck1, 60);
    /* A partition of flipped labels: the next model is worse. */
    snprintf(bad, sizeof bad, "%s/gate/flipped.tsv", fx_loop.home);
    write_flipped(bad);
    char dst[500];
    snprintf(dst, sizeof dst, "%s/gate/data/day=1.tsv", fx_loop.home);
    assert_int_equal(fx_land(bad, dst), 0);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    int64_t r2 = fx_loop_newest_run("gate");
    assert_true(r2 > r1);
    assert_int_equal(wait_end(r2, 120), STATE_RUN_SUCCEEDED);
    assert_int_equal(wait_push(r2, STATE_PUSH_NSTATES, 60), STATE_PUSH_HELD);
    fx_holds(&s, "ctr", "B", h, sizeof h);
    assert_string_equal(h, ck1); /* serving kept the better model */
    /* An event of the run says why: `kiln show RUN` (and /api/runs/N, which
     * lists the same run events) shows it, not only the job. */
    proc_result_t *r = calloc(1, sizeof *r);
    char ids[32];
    snprintf(ids, sizeof ids, "%lld", (long long)r2);
    const char *show[] = {"--json", "show", ids, NULL};
    fx_kiln(&fx_loop.kd, r, show);
    json_t *doc = json_loads(r->out, 0, NULL);
    json_t *evs = json_object_get(doc, "events");
    bool said = false;
    for (size_t i = 0; i < json_array_size(evs); i++) {
        const char *m = json_string_value(json_object_get(json_array_get(evs, i), "message"));
        said |= m != NULL && strstr(m, "held back") && strstr(m, "push.max_regression");
    }
    if (!said)
        fail_msg("kiln show %s has no held-back event:\n%s", ids, r->out);
    json_decref(doc);
    free(r);
    /* kiln push --force overrides the gate. */
    const char *force[] = {"push", "--job", "gate", "--force", NULL};
    fx_loop_kiln_ok(force);
    char ck2[64];
    wait_b_holds_run(&s, r2, ck2, sizeof ck2, 10);
    /* ... as a delta on ck1, which B holds and ck2 descends from, not in full. */
    state_push_t *ps = NULL;
    size_t np = run_pushes(r2, &ps);
    assert_true(np >= 2);
    assert_int_equal(ps[np - 1].state, STATE_PUSH_SUCCEEDED);
    if (ps[np - 1].sent_full)
        fail_msg("kiln push --force sent %s in full; B holds its parent %s", ck2, ck1);
    state_pushes_free(ps, np);
    /* A held model whose eval logloss is 0.0 (what kiln-train recorded over
     * 0 eval rows before issue 27) is not a perfect model to be worse than:
     * the gate is not applied, and ck1 goes back without --force. */
    char sql[300];
    snprintf(sql, sizeof sql, "UPDATE checkpoints SET eval_logloss = 0.0 WHERE uid = '%s'", ck2);
    assert_int_equal(db_exec(sql), 0);
    const char *back[] = {"push", "--job", "gate", "--checkpoint", ck1, NULL};
    fx_loop_kiln_ok(back);
    for (int i = 0; i < 100 && (fx_holds(&s, "ctr", "B", h, sizeof h), strcmp(h, ck1) != 0); i++)
        proc_sleep_ms(100);
    assert_string_equal(h, ck1);
}

/* A push describes the model from the spec version its run trained with, not
 * from the job's spec of now: delivery parses the job's current spec once and
 * uses it for the model only when the run trained with that version. Here
 * the job becomes fm (version 2) after an lr run; `kiln push` of the lr
 * checkpoint must still send lr's shapes, or kiln-serve (and the checkpoint
 * source) refuse the push. */
static void test_push_after_model_change(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], extra[1024], head[600], ck1[64], h[64];
    serve_start(&s);
    incremental_head(head, sizeof head);
    push_to_b(extra, sizeof extra, head, "", s.url);
    int64_t r1 = submit_first("ver", extra, NULL, spec, sizeof spec);
    assert_int_equal(wait_end(r1, 120), STATE_RUN_SUCCEEDED);
    wait_b_holds_run(&s, r1, ck1, sizeof ck1, 60);
    /* Version 2: fm, which kiln-train cannot start from lr's checkpoint. */
    size_t len = 0;
    char *text = (char *)proc_read_file(spec, &len);
    assert_non_null(text);
    char *lr = strstr(text, "type: lr");
    assert_non_null(lr);
    memcpy(lr, "type: fm", 8);
    fx_write(spec, "%s", text);
    free(text);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    int64_t r2 = fx_loop_newest_run("ver");
    if (r2 > r1)
        (void)wait_end(r2, 120); /* it fails or is skipped: either way it ends */
    const char *push[] = {"push", "--job", "ver", "--checkpoint", ck1, "--full", NULL};
    fx_loop_kiln_ok(push);
    fx_holds(&s, "ctr", "B", h, sizeof h);
    assert_string_equal(h, ck1);
    state_push_t *ps = NULL;
    size_t np = run_pushes(r1, &ps);
    assert_true(np >= 2);
    assert_int_equal(ps[np - 1].state, STATE_PUSH_SUCCEEDED);
    assert_true(ps[np - 1].sent_full);
    state_pushes_free(ps, np);
}

/* ---- push.ramp ------------------------------------------------------------------------------------ */

/* B's share (percent, rounded) of model ctr's split on s: -1 when the
 * split cannot be read. The split's text goes to split. */
static int b_share(const fx_serve_t *s, char *split, size_t cap)
{
    char url[300];
    snprintf(url, sizeof url, "%s/v1/models/ctr/split", s->url);
    json_t *doc = fx_get_json(url);
    const char *text = json_string_value(json_object_get(doc, "split"));
    snprintf(split, cap, "%s", text ? text : "?");
    long b = 0, all = 0;
    json_t *l;
    size_t i;
    json_array_foreach(json_object_get(doc, "labels"), i, l)
    {
        long w = (long)json_integer_value(json_object_get(l, "weight"));
        all += w;
        if (strcmp(json_string_value(json_object_get(l, "label")), "B") == 0)
            b = w;
    }
    json_decref(doc);
    if (text == NULL)
        return -1;
    return all > 0 ? (int)lround(100.0 * (double)b / (double)all) : 0;
}

/* Waits until B's share is want; fails with the split seen otherwise. */
static void wait_b_share(const fx_serve_t *s, int want, int timeout_s)
{
    char split[256] = "";
    int got = -1;
    for (int i = 0; i < timeout_s * 10 && (got = b_share(s, split, sizeof split)) != want; i++)
        proc_sleep_ms(100);
    if (got != want) {
        char log[400];
        snprintf(log, sizeof log, "%s/kilnd.log", fx_loop.home);
        print_tail("kilnd's log", log);
        fail_msg("B's share is %d%% (split '%s'), not %d%%, after %d s", got, split, want,
                 timeout_s);
    }
}

/* The job's events of kind `kind` that contain `text`. */
static int job_events(const char *job, const char *kind, const char *text)
{
    state_t *st = fx_loop_db();
    state_job_t j;
    assert_int_equal(state_job_get(st, job, &j), 0);
    state_event_t *ev = NULL;
    size_t n = 0;
    assert_int_equal(state_event_list(st, j.id, 0, &ev, &n), 0);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found += strcmp(ev[i].kind, kind) == 0 && strstr(ev[i].message, text) != NULL;
    state_events_free(ev, n);
    state_job_fini(&j);
    state_close(st);
    return found;
}

/* job_events once it reaches want, or what it is after secs: the pusher
 * records a ramp's move after it has applied the split, so the endpoint
 * can show the new share a moment before the event is there. */
static int wait_events(const char *job, const char *kind, const char *text, int want, int secs)
{
    int64_t end = kiln_now_ms() + (int64_t)secs * 1000;
    int n;
    while ((n = job_events(job, kind, text)) < want && kiln_now_ms() < end)
        proc_sleep_ms(100);
    return n;
}

static void test_ramp(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], extra[1400], bad[500], head[600];
    serve_start(&s);
    incremental_head(head, sizeof head);
    snprintf(extra, sizeof extra,
             "%s"
             "push:\n  token_env: KILN_TEST_TOKEN\n  max_regression: 0.001\n"
             "  ramp: 25%%/4s to 50%%\n  endpoints:\n"
             "    - {url: \"%s\", model: ctr, label: A, auto: false}\n"
             "    - {url: \"%s\", model: ctr, label: B}\n",
             head, s.url, s.url);
    write_job("ramp", "ramp", extra, spec, sizeof spec);
    land("ramp", "day0.tsv", 0);
    fx_loop.kd.web_port = proc_free_port();
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    /* The champion A has all the traffic before B first lands. */
    const char *sub[] = {"submit", spec, NULL};
    const char *split[] = {"split", "ctr", "A=100", NULL};
    int64_t r1 = fx_loop_newest_run("ramp");
    assert_int_equal(r1, 0);
    fx_loop_kiln_ok(sub);
    fx_loop_kiln_ok(split);
    r1 = fx_loop_newest_run("ramp");
    assert_int_equal(wait_end(r1, 120), STATE_RUN_SUCCEEDED);
    char ck1[64];
    wait_b_holds_run(&s, r1, ck1, sizeof ck1, 60);
    /* The first step at once, the second one step later, then the cap. */
    int64_t t0 = kiln_now_ms();
    wait_b_share(&s, 25, 10);
    wait_b_share(&s, 50, 10);
    int64_t took = kiln_now_ms() - t0;
    if (took < 1000)
        fail_msg("B went from 25%% to 50%% in %lld ms; the ramp steps every 4 s", (long long)took);
    char text[256];
    assert_int_equal(b_share(&s, text, sizeof text), 50);
    assert_non_null(strstr(text, "A=")); /* A keeps the rest */
    proc_sleep_ms(4500);
    assert_int_equal(b_share(&s, text, sizeof text), 50); /* capped */
    assert_true(job_events("ramp", "ramp", "0% -> 25%") == 1);
    assert_true(job_events("ramp", "ramp", "25% -> 50%") == 1);
    /* A worse model: its push to B is held back, the ramp stops at 0 %. */
    snprintf(bad, sizeof bad, "%s/ramp/flipped.tsv", fx_loop.home);
    write_flipped(bad);
    char dst[500];
    snprintf(dst, sizeof dst, "%s/ramp/data/day=1.tsv", fx_loop.home);
    assert_int_equal(fx_land(bad, dst), 0);
    fx_loop_kiln_ok(sub);
    int64_t r2 = fx_loop_newest_run("ramp");
    assert_true(r2 > r1);
    assert_int_equal(wait_end(r2, 120), STATE_RUN_SUCCEEDED);
    assert_int_equal(wait_push(r2, STATE_PUSH_NSTATES, 60), STATE_PUSH_HELD);
    wait_b_share(&s, 0, 10);
    assert_true(wait_events("ramp", "ramp", "50% -> 0%", 1, 10) == 1);
    assert_true(job_events("ramp", "ramp", "was held back") == 1);
    /* kiln split and /api/endpoints say why. */
    proc_result_t *r = calloc(1, sizeof *r);
    const char *show[] = {"split", "ctr", NULL};
    fx_kiln(&fx_loop.kd, r, show);
    if (strstr(r->out, "ramp 25%/4s to 50% stopped at 0%") == NULL ||
        strstr(r->out, "held back") == NULL)
        fail_msg("kiln split ctr does not say the ramp stopped:\n%s%s", r->out, r->err);
    const char *eps[] = {"endpoints", "--model", "ctr", NULL};
    fx_kiln(&fx_loop.kd, r, eps);
    bool b_told = false; /* the row "ctr B URL ... ramp 25%/4s to 50% stopped at 0%: ..." */
    for (char *line = strtok(r->out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char m[16] = "", l[16] = "";
        b_told |= sscanf(line, "%15s %15s", m, l) == 2 && strcmp(m, "ctr") == 0 &&
                  strcmp(l, "B") == 0 && strstr(line, "stopped at 0%: push") != NULL;
    }
    if (r->code != 0 || !b_told)
        fail_msg("kiln endpoints does not show B's stopped ramp:\n%s%s", r->out, r->err);
    free(r);
    char url[300];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/api/endpoints", fx_loop.kd.web_port);
    json_t *doc = fx_get_json(url);
    bool stopped = false;
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(doc, "endpoints"), i, e)
    {
        json_t *ramp = json_object_get(e, "ramp");
        if (strcmp(json_string_value(json_object_get(e, "label")), "B") == 0)
            stopped = json_is_true(json_object_get(ramp, "stopped")) &&
                      json_integer_value(json_object_get(ramp, "share")) == 0;
        else
            assert_true(json_is_null(ramp)); /* A, auto: false, does not ramp */
    }
    json_decref(doc);
    assert_true(stopped);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/endpoints", fx_loop.kd.web_port);
    char *page = fx_get(url);
    assert_non_null(page);
    if (strstr(page, "<td class=\"ramp stopped\">ramp 25%/4s to 50% stopped at 0%") == NULL)
        fail_msg("the endpoints page does not show the stopped ramp:\n%s", page);
    free(page);
    /* A push that lands again (a person sends B the better model back)
     * starts the ramp over from its first step. */
    const char *again[] = {"push", "--job", "ramp", "--label", "B", "--checkpoint", ck1, NULL};
    fx_loop_kiln_ok(again);
    wait_b_share(&s, 25, 10);
    /* A push that fails (its checkpoint cannot be read: the worse model's
     * files are gone) stops it again. */
    char ck2[64], gone[700];
    run_checkpoint(r2, ck2, sizeof ck2);
    state_t *st = fx_loop_db();
    state_checkpoint_t c;
    assert_int_equal(state_checkpoint_get(st, ck2, &c), 0);
    snprintf(gone, sizeof gone, "%s.gone", c.path);
    assert_int_equal(rename(c.path, gone), 0);
    state_checkpoint_fini(&c);
    state_close(st);
    const char *bad_push[] = {"push", "--job", "ramp", "--label", "B", "--checkpoint", ck2,
                              "--force", NULL};
    r = calloc(1, sizeof *r);
    fx_kiln(&fx_loop.kd, r, bad_push);
    assert_int_not_equal(r->code, 0);
    free(r);
    wait_b_share(&s, 0, 10);
    assert_int_equal(job_events("ramp", "ramp", "stopped at 0%: push"), 2); /* held, failed */
    assert_int_equal(job_events("ramp", "ramp", ck2), 2);
}

/* ---- an online job --------------------------------------------------------------------------------- */

static void test_online_job(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], extra[1024];
    serve_start(&s);
    push_to_b(extra, sizeof extra,
              "train: {mode: online, batch_size: 128, log_every: 2}\n"
              "export: {every: 1s, on_success: incremental}\n"
              "checkpoint: {keep: 3}\n",
              "", s.url);
    int64_t id = submit_first("online", extra, NULL, spec, sizeof spec);
    /* Partitions keep landing; exports reach B while the run trains. */
    int landed = 1, reached = 0;
    char last[64] = "";
    for (int i = 0; i < 900 && reached < 3; i++) {
        if (i % 10 == 0)
            land("online", landed % 2 ? "day1.tsv" : "day0.tsv", landed), landed++;
        state_push_t *ps = NULL;
        size_t n = run_pushes(id, &ps);
        reached = 0;
        for (size_t k = 0; k < n; k++)
            reached += ps[k].state == STATE_PUSH_SUCCEEDED;
        if (n > 0 && ps[n - 1].state == STATE_PUSH_SUCCEEDED)
            snprintf(last, sizeof last, "%s", ps[n - 1].checkpoint_uid);
        state_pushes_free(ps, n);
        proc_sleep_ms(100);
    }
    if (reached < 3)
        fail_msg("%d online exports reached B in 90 s (see %s/kilnd.log)", reached, fx_loop.home);
    state_t *st = fx_loop_db();
    state_run_t r;
    assert_int_equal(state_run_get(st, id, &r), 0);
    assert_int_equal(r.state, STATE_RUN_RUNNING); /* while it trains */
    state_run_fini(&r);
    state_close(st);
    wait_holds(&s, "ctr", "B", last, 10);
    const char *cancel[] = {"cancel", "1", NULL};
    char ids[32];
    snprintf(ids, sizeof ids, "%lld", (long long)id);
    cancel[1] = ids;
    fx_loop_kiln_ok(cancel);
    assert_int_equal(wait_end(id, 60), STATE_RUN_CANCELED);
}

/* ---- Parquet partitions from DuckDB ------------------------------------------------------ */

/* The newest run of job with an id above after in one of the states
 * (STATE_RUN_NSTATES-terminated), 0 when none. */
static int64_t run_after(const char *job, int64_t after, const state_run_state_t *states)
{
    int64_t id = 0;
    state_t *st = fx_loop_db();
    state_run_t *rs = NULL;
    size_t n = 0;
    assert_int_equal(state_run_list(st, job, 50, &rs, &n), 0);
    for (size_t k = 0; k < n && id == 0; k++)
        for (int j = 0; states[j] != STATE_RUN_NSTATES; j++)
            if (rs[k].id > after && rs[k].state == states[j])
                id = rs[k].id;
    state_runs_free(rs, n);
    state_close(st);
    return id;
}

/* How many cron fires of job were skipped (counted on the job, not runs). */
static int64_t skipped_fires(const char *job)
{
    state_t *st = fx_loop_db();
    state_job_t j;
    assert_int_equal(state_job_get(st, job, &j), 0);
    int64_t n = j.skipped_fires;
    state_job_fini(&j);
    state_close(st);
    return n;
}

/* The bytes of data_dir/pq/<name>.parquet; *len their count. */
static unsigned char *duck_file(const char *dir, const char *name, size_t *len)
{
    char p[500];
    snprintf(p, sizeof p, "%s/%s/%s.parquet", fx_loop.data_dir, dir, name);
    return proc_read_file(p, len);
}

static void write_bytes(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static void test_cron_parquet_partitions(void **state)
{
    (void)state;
    proc_result_t *r = calloc(1, sizeof *r);
    /* DuckDB writes day0 and day1 (and the eval rows) as Parquet. */
    for (int d = 0; d < 3; d++) {
        static const char *const in[] = {"day0.tsv", "day1.tsv", "eval.tsv"};
        static const char *const out[] = {"pq0", "pq1", "pq-eval"};
        if (proc_sh(r, fx_loop.data_dir,
                    "node '%s/tests/parquet/write.mjs' '%s/%s' '%s/%s' duck-snappy-v1",
                    KILN_SOURCE_DIR, fx_loop.data_dir, in[d], fx_loop.data_dir, out[d]) != 0)
            fail_msg("DuckDB did not write Parquet (run tools/deps.sh): %s", r->err);
    }
    free(r);
    fx_serve_t s = {0};
    char spec[500], head[800], extra[1200], dir[400], part[500];
    serve_start(&s);
    snprintf(head, sizeof head,
             "schedule: \"@every 2s\"\n"
             "data: {format: parquet, train: \"data/part-*.parquet\", incremental: true,\n"
             "       eval: \"%s/pq-eval/duck-snappy-v1.parquet\"}\n"
             "export: {on_success: incremental}\n",
             fx_loop.data_dir);
    push_to_b(extra, sizeof extra, head, "", s.url);
    write_job("pq", "pq-hourly", extra, spec, sizeof spec);
    snprintf(dir, sizeof dir, "%s/pq/data", fx_loop.home);
    assert_int_equal(kiln_mkdir_p(dir), 0);
    char src[500];
    snprintf(src, sizeof src, "%s/pq0/duck-snappy-v1.parquet", fx_loop.data_dir);
    snprintf(part, sizeof part, "%s/part-0.parquet", dir);
    assert_int_equal(fx_land(src, part), 0);
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    static const state_run_state_t ok[] = {STATE_RUN_SUCCEEDED, STATE_RUN_NSTATES};
    static const state_run_state_t started[] = {STATE_RUN_LAUNCHING, STATE_RUN_RUNNING,
                                                STATE_RUN_SUCCEEDED, STATE_RUN_FAILED,
                                                STATE_RUN_NSTATES};
    static const state_run_state_t ended[] = {STATE_RUN_SUCCEEDED, STATE_RUN_FAILED,
                                              STATE_RUN_NSTATES};
    int64_t first = 0;
    for (int i = 0; i < 600 && first == 0; i++, proc_sleep_ms(100))
        first = run_after("pq-hourly", 0, ok);
    if (first == 0)
        fail_msg("no run trained on part-0.parquet within 60 s (see %s/kilnd.log)", fx_loop.home);
    char ck0[64], ck1[64];
    wait_b_holds_run(&s, first, ck0, sizeof ck0, 60);

    /* part-1 is being written: its first half, no footer yet. Fires come
     * and skip it (no new data); none trains on it. */
    size_t len;
    unsigned char *bytes = duck_file("pq1", "duck-snappy-v1", &len);
    snprintf(part, sizeof part, "%s/part-1.parquet", dir);
    write_bytes(part, bytes, len / 2);
    int64_t skips = skipped_fires("pq-hourly");
    for (int i = 0; i < 100 && skipped_fires("pq-hourly") == skips; i++)
        proc_sleep_ms(100);
    if (skipped_fires("pq-hourly") == skips)
        fail_msg("no fire after part-0's run within 10 s (see %s/kilnd.log)", fx_loop.home);
    proc_sleep_ms(2500);
    int64_t early = run_after("pq-hourly", first, started);
    if (early != 0)
        fail_msg("run %lld started on part-1.parquet while it was being written",
                 (long long)early);

    /* The writer finishes: the next fire trains on part-1, once. */
    write_bytes(part, bytes, len);
    free(bytes);
    int64_t second = 0;
    for (int i = 0; i < 600 && second == 0; i++, proc_sleep_ms(100))
        second = run_after("pq-hourly", first, ended);
    if (second == 0 || run_after("pq-hourly", first, ok) != second)
        fail_msg("part-1.parquet was not trained on when complete (run %lld; see %s/kilnd.log)",
                 (long long)second, fx_loop.home);
    wait_b_holds_run(&s, second, ck1, sizeof ck1, 60);
    assert_int_equal(wait_push(second, STATE_PUSH_SUCCEEDED, 30), STATE_PUSH_SUCCEEDED);
    state_push_t *ps = NULL;
    size_t n = run_pushes(second, &ps);
    assert_true(n >= 1);
    assert_false(ps[n - 1].sent_full); /* a delta */
    state_pushes_free(ps, n);
    state_t *st = fx_loop_db();
    state_input_t *ins = NULL;
    assert_int_equal(state_input_list(st, second, &ins, &n), 0);
    assert_int_equal(n, 1);
    assert_non_null(strstr(ins[0].path, "part-1.parquet"));
    assert_int_equal(ins[0].size, (int64_t)len);
    state_inputs_free(ins, n);
    state_close(st);
    /* Later fires find nothing new: each file was trained on once. */
    proc_sleep_ms(4500);
    assert_int_equal(run_after("pq-hourly", second, started), 0);
}

/* KILN_TEST_FILTER=test_cron* runs matching tests (cmocka glob). */
PROC_TEST_MAIN_EACH(setup_all, fx_loop_suite_teardown, fx_loop_test_setup, fx_loop_test_teardown,
                    test_five_relative_submits, test_one_serve_two_labels,
                    test_cron_three_partitions, test_endpoint_down_then_up, test_kill9_before_push,
                    test_kill9_after_apply, test_quality_gate, test_push_after_model_change,
                    test_ramp, test_online_job, test_cron_parquet_partitions)
