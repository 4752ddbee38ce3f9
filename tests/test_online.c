/*
 * tests/test_online.c - the incremental and online data path with the real
 * programs (kilnd, kiln-train under mpirun, kiln-serve, kiln): what a job
 * takes from its data directory, once, and what it does with a partition
 * that is bad or late. Covered:
 *   - data.ready: marker: a partition is left alone until _SUCCESS sits
 *     beside it, then trained once; appending to it afterwards is reported
 *     on the run that consumed it and never trained again (issue 26.3);
 *   - an online job meets a malformed partition first, another after a good
 *     one, and one that does not decompress: each is set aside by name (an
 *     event of the run), training goes on (issue 27.4);
 *   - an online run killed after a checkpoint in its second partition: the
 *     retry resumes there and trains no file twice (issue 27.5a);
 *   - a run that fails at its eval (a character device) leaves no
 *     checkpoint behind (issue 27.5b);
 *   - each online export is evaluated before its push, also when the run
 *     started before the job had push.max_regression: once the gate is
 *     added, an export worse than what the endpoint holds is held back,
 *     with the reason on the run's push (issue 26.5).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <dirent.h>
#include <math.h>
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

static int setup_all(void **state)
{
    (void)state;
    char p[400], q[400], cmd[1024];
    int rc = fx_loop_suite_setup("online");
    if (rc < 0)
        return -1;
    /* Every line malformed: three fields, not 40. */
    snprintf(p, sizeof p, "%s/bad.tsv", fx_loop.data_dir);
    FILE *f = fopen(p, "w");
    for (int i = 0; f != NULL && i < 300; i++)
        fprintf(f, "1\tnot\tcriteo\n");
    rc |= f == NULL || fclose(f) != 0;
    /* day0 with every label flipped, four times over: a model that learns it
     * gets worse on eval.tsv. */
    snprintf(p, sizeof p, "%s/day0.tsv", fx_loop.data_dir);
    snprintf(q, sizeof q, "%s/flip.tsv", fx_loop.data_dir);
    snprintf(cmd, sizeof cmd,
             "for i in 1 2 3 4; do awk -F'\\t' 'BEGIN{OFS=\"\\t\"}{$1=1-$1; print}' %s; done > %s",
             p, q);
    rc |= system(cmd) != 0;
    /* day1 gzipped and cut in the middle: it does not decompress. */
    snprintf(p, sizeof p, "%s/day1.tsv", fx_loop.data_dir);
    snprintf(q, sizeof q, "%s/cut.tsv", fx_loop.data_dir);
    snprintf(cmd, sizeof cmd, "gzip -c %s | head -c 20000 > %s", p, q);
    rc |= system(cmd) != 0;
    return rc == 0 ? 0 : -1;
}

/* Writes home/<name>/job.yaml (an lr job over data/day=*.tsv with extra)
 * and makes its data directory; the spec's path goes to path. */
static void write_job(const char *name, const char *extra, char *path, size_t cap)
{
    char d[400];
    snprintf(d, sizeof d, "%s/%s", fx_loop.home, name);
    mkdir(d, 0755);
    snprintf(path, cap, "%s/%s/data", fx_loop.home, name);
    mkdir(path, 0755);
    snprintf(path, cap, "%s/job.yaml", d);
    fx_write(path,
             "name: %s\n"
             "resources: {ranks: 1, threads: 1}\n"
             "model: {type: lr, embedding: {dim: 4, capacity: 100000}}\n"
             "%s",
             name, extra);
}

/* Lands the shared file `which` as home/<name>/data/<as>. */
static void land(const char *name, const char *which, const char *as)
{
    char src[400], dst[600];
    snprintf(src, sizeof src, "%s/%s", fx_loop.data_dir, which);
    snprintf(dst, sizeof dst, "%s/%s/data/%s", fx_loop.home, name, as);
    assert_int_equal(fx_land(src, dst), 0);
}

/* Submits spec; returns the newest run of job (0: none). */
static int64_t submit(const char *spec, const char *job)
{
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    return fx_loop_newest_run(job);
}

/* The events of run id with kind `kind` whose message holds `text`. */
static int count_events(int64_t id, const char *kind, const char *text)
{
    state_t *st = fx_loop_db();
    state_event_t *es = NULL;
    size_t n = 0;
    int got = 0;
    assert_int_equal(state_event_list(st, 0, id, &es, &n), 0);
    for (size_t i = 0; i < n; i++)
        got += strcmp(es[i].kind, kind) == 0 && strstr(es[i].message, text) != NULL;
    state_events_free(es, n);
    state_close(st);
    return got;
}

/* Waits until run id has such an event; fails naming kilnd's log. */
static void wait_event(int64_t id, const char *kind, const char *text, int timeout_s)
{
    for (int i = 0; i < timeout_s * 10; i++) {
        if (count_events(id, kind, text) > 0)
            return;
        proc_sleep_ms(100);
    }
    fail_msg("run %lld has no %s event with '%s' after %d s (see %s)", (long long)id, kind, text,
             timeout_s, fx_loop.home);
}

/* The step of the newest checkpoint run id recorded (0: none). */
static int64_t newest_step(int64_t id)
{
    state_t *st = fx_loop_db();
    state_checkpoint_t c = {0};
    int64_t step = state_checkpoint_newest_of_run(st, id, false, &c) == 0 ? c.step : 0;
    state_checkpoint_fini(&c);
    state_close(st);
    return step;
}

/* Waits until run id's newest checkpoint is at step `want` or beyond. */
/* A succeeded run of job (its id), waiting up to timeout_s; 0 when none came. */
static int64_t wait_succeeded(const char *job, int timeout_s)
{
    state_t *st = fx_loop_db();
    int64_t id = 0;
    for (int i = 0; i < timeout_s * 10 && id == 0; i++) {
        state_run_t *rs = NULL;
        size_t n = 0;
        assert_int_equal(state_run_list(st, job, STATE_PAGE_MAX, &rs, &n), 0);
        for (size_t k = 0; k < n && id == 0; k++)
            if (rs[k].state == STATE_RUN_SUCCEEDED)
                id = rs[k].id;
        state_runs_free(rs, n);
        if (id == 0)
            proc_sleep_ms(100);
    }
    state_close(st);
    return id;
}

static int64_t wait_step(int64_t id, int64_t want, int timeout_s)
{
    int64_t step = 0;
    for (int i = 0; i < timeout_s * 10 && (step = newest_step(id)) < want; i++)
        proc_sleep_ms(100);
    return step;
}

static void cancel(int64_t id)
{
    char ids[32];
    snprintf(ids, sizeof ids, "%lld", (long long)id);
    const char *args[] = {"cancel", ids, NULL};
    fx_loop_kiln_ok(args);
    state_t *st = fx_loop_db();
    fx_wait_run(st, id, STATE_RUN_NSTATES, 60);
    state_close(st);
}

/* ---- complete partitions only (issue 26.3) ------------------------------------------- */

static void test_marker_and_changed_partition(void **state)
{
    (void)state;
    char spec[500], part[600], marker[600], cmd[1400];
    write_job("mark",
              "schedule: \"@every 1s\"\n"
              "train: {batch_size: 128}\n"
              "data: {train: \"data/day=*.tsv\", incremental: true, ready: marker}\n",
              spec, sizeof spec);
    land("mark", "day0.tsv", "day=0.tsv");
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    /* No _SUCCESS yet: nothing is trained, however long it waits. */
    proc_sleep_ms(2500);
    state_t *st = fx_loop_db();
    state_run_t *rs = NULL;
    size_t n = 0;
    assert_int_equal(state_run_list(st, "mark", STATE_PAGE_MAX, &rs, &n), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(rs[i].state, STATE_RUN_SUCCEEDED);
    state_runs_free(rs, n);
    snprintf(marker, sizeof marker, "%s/mark/data/_SUCCESS", fx_loop.home);
    fx_write(marker, "%s", "");
    int64_t first = wait_succeeded("mark", 30);
    if (first == 0)
        fail_msg("no run trained day=0.tsv within 30 s of its _SUCCESS (see %s)", fx_loop.home);
    /* The writer appends to the consumed file: reported, not trained again. */
    snprintf(part, sizeof part, "%s/mark/data/day=0.tsv", fx_loop.home);
    snprintf(cmd, sizeof cmd, "cat %s/day1.tsv >> %s", fx_loop.data_dir, part);
    assert_int_equal(system(cmd), 0);
    wait_event(first, "warning", "changed after run", 30);
    proc_sleep_ms(2000);
    assert_int_equal(count_events(first, "warning", "changed after run"), 1); /* once */
    assert_int_equal(state_run_list(st, "mark", STATE_PAGE_MAX, &rs, &n), 0);
    for (size_t k = 0; k < n; k++)
        if (rs[k].id != first && rs[k].state == STATE_RUN_SUCCEEDED)
            fail_msg("run %lld trained the changed file again", (long long)rs[k].id);
    state_runs_free(rs, n);
    state_close(st);
}

/* Bytes kilnd has read through read(2) and friends so far (/proc/PID/io's
 * rchar: page-cache hits count too). */
static int64_t kilnd_rchar(void)
{
    char p[64], line[128];
    snprintf(p, sizeof p, "/proc/%d/io", (int)fx_loop.kd.pid);
    FILE *f = fopen(p, "r");
    long long v = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "rchar: %lld", &v) == 1)
            break;
    if (f != NULL)
        fclose(f);
    if (v < 0)
        fail_msg("cannot read %s", p);
    return v;
}

/* Issue 27 item 9's soak: every fire of an incremental job read and hashed
 * every file data.train matched, consumed or not, so kilnd's work per fire
 * grew with all the data a job had ever had. A consumed file whose stat is
 * unchanged is now passed over unread: three fires after a 24 MB partition
 * was consumed read far less than one pass over it. */
static void test_consumed_files_not_read_again(void **state)
{
    (void)state;
    char spec[500], big[400];
    write_job("quiet",
              "schedule: \"@every 1s\"\n"
              "train: {batch_size: 4096}\n"
              "data: {train: \"data/day=*.tsv\", incremental: true, settle: 0s}\n",
              spec, sizeof spec);
    snprintf(big, sizeof big, "%s/big.tsv", fx_loop.data_dir);
    assert_int_equal(fx_datagen(big, 100000, 7, 0), 0);
    struct stat sb;
    assert_int_equal(stat(big, &sb), 0);
    land("quiet", "big.tsv", "day=0.tsv");
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    const char *sub[] = {"submit", spec, NULL};
    fx_loop_kiln_ok(sub);
    if (wait_succeeded("quiet", 60) == 0)
        fail_msg("no run consumed day=0.tsv within 60 s (see %s)", fx_loop.home);
    proc_sleep_ms(1500); /* the fire after the run: the file is known consumed */
    int64_t before = kilnd_rchar();
    proc_sleep_ms(3500); /* three fires or more, @every 1s */
    int64_t read = kilnd_rchar() - before;
    if (read > (int64_t)sb.st_size / 2)
        fail_msg("kilnd read %lld bytes in 3.5 s of fires with nothing new: the consumed "
                 "%lld-byte partition is read again (see %s)",
                 (long long)read, (long long)sb.st_size, fx_loop.home);
}

/* ---- a bad partition in an online job (issue 27.4) ---------------------------------- */

static void test_online_bad_partition(void **state)
{
    (void)state;
    char spec[500];
    write_job("bad",
              "train: {mode: online, batch_size: 128}\n"
              "export: {every: 200ms}\n"
              "data: {train: \"data/day=*.tsv\", settle: 0s}\n",
              spec, sizeof spec);
    /* The bad partition comes first, before any good line. */
    land("bad", "bad.tsv", "day=0.tsv");
    land("bad", "day0.tsv", "day=1.tsv");
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    int64_t id = submit(spec, "bad");
    wait_event(id, "warning", "day=0.tsv set aside", 60);
    /* Training goes on past it: day=1's 10 steps. */
    if (wait_step(id, 10, 60) < 10)
        fail_msg("run %lld did not train day=1.tsv after setting day=0.tsv aside (see %s)",
                 (long long)id, fx_loop.home);
    /* A bad partition after a large one is judged on its own too. */
    land("bad", "bad.tsv", "day=2.tsv");
    wait_event(id, "warning", "day=2.tsv set aside", 60);
    land("bad", "day1.tsv", "day=3.tsv");
    if (wait_step(id, 20, 60) < 20)
        fail_msg("run %lld stopped after day=2.tsv (see %s)", (long long)id, fx_loop.home);
    /* A partition that does not even decompress is set aside the same way. */
    land("bad", "cut.tsv", "day=4.tsv");
    wait_event(id, "warning", "day=4.tsv set aside", 60);
    land("bad", "day0.tsv", "day=5.tsv");
    if (wait_step(id, 30, 60) < 30)
        fail_msg("run %lld stopped after day=4.tsv (see %s)", (long long)id, fx_loop.home);
    state_t *st = fx_loop_db();
    state_run_t r;
    assert_int_equal(state_run_get(st, id, &r), 0);
    assert_int_equal(r.state, STATE_RUN_RUNNING);
    state_run_fini(&r);
    state_close(st);
    /* kiln show names it. */
    char ids[32];
    snprintf(ids, sizeof ids, "%lld", (long long)id);
    const char *show[] = {"show", ids, NULL};
    proc_result_t *res = calloc(1, sizeof *res);
    fx_kiln(&fx_loop.kd, res, show);
    assert_non_null(strstr(res->out, "day=2.tsv set aside"));
    free(res);
    cancel(id);
}

/* ---- no file trained twice (issue 27.5) ---------------------------------------------- */

static void test_online_retry_trains_nothing_twice(void **state)
{
    (void)state;
    char spec[500];
    write_job("again",
              "train: {mode: online, batch_size: 128}\n"
              "export: {every: 300ms}\n"
              "checkpoint: {every_steps: 12}\n"
              "retries: {count: 1, backoff: 0s}\n"
              "data: {train: \"data/day=*.tsv\", settle: 0s}\n",
              spec, sizeof spec);
    land("again", "day0.tsv", "day=0.tsv");
    /* The first attempt dies at step 15, in the second partition, after the
     * checkpoint at step 12. */
    const char *env[] = {"KILN_TEST_KILL_RANK=0", "KILN_TEST_KILL_STEP=15", NULL};
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, env);
    int64_t id = submit(spec, "again");
    if (wait_step(id, 10, 60) < 10)
        fail_msg("run %lld did not train day=0.tsv (see %s)", (long long)id, fx_loop.home);
    land("again", "day1.tsv", "day=1.tsv"); /* found by the running trainer */
    state_t *st = fx_loop_db();
    assert_int_equal(fx_wait_run(st, id, STATE_RUN_FAILED, 60), STATE_RUN_FAILED);
    state_run_t *rs = NULL;
    size_t n = 0;
    int64_t retry = 0;
    for (int i = 0; i < 100 && retry == 0; i++) {
        assert_int_equal(state_run_list(st, "again", 1, &rs, &n), 0);
        if (n > 0 && rs[0].id != id)
            retry = rs[0].id;
        state_runs_free(rs, n);
        proc_sleep_ms(100);
    }
    state_close(st);
    assert_int_not_equal(retry, 0);
    /* A fault-free run ends its two partitions at step 20; the retry must
     * too, whatever it resumed from. */
    wait_step(retry, 20, 60);
    proc_sleep_ms(1500);
    assert_int_equal(newest_step(retry), 20);
    cancel(retry);
}

static void test_failed_eval_leaves_no_checkpoint(void **state)
{
    (void)state;
    char spec[500], dir[600];
    write_job("evalfail",
              "train: {batch_size: 128}\n"
              "checkpoint: {dir: ckpt}\n"
              "data: {train: \"data/day=*.tsv\", eval: /dev/null, incremental: true, "
              "settle: 0s}\n",
              spec, sizeof spec);
    land("evalfail", "day0.tsv", "day=0.tsv");
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, NULL);
    int64_t id = submit(spec, "evalfail");
    state_t *st = fx_loop_db();
    assert_int_equal(fx_wait_run(st, id, STATE_RUN_NSTATES, 60), STATE_RUN_FAILED);
    state_close(st);
    /* Nothing in checkpoint.dir that a later run would start from. */
    snprintf(dir, sizeof dir, "%s/evalfail/ckpt", fx_loop.home);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            fail_msg("the failed run left %s/%s", dir, e->d_name);
    if (d != NULL)
        closedir(d);
}

/* ---- online exports are gated (issue 26.5) ------------------------------------------- */

/* Waits until run id has a push in state want (whose error holds why, when
 * why is given). */
static bool wait_push(int64_t id, state_push_state_t want, const char *why, int timeout_s)
{
    bool got = false;
    state_t *st = fx_loop_db();
    for (int i = 0; i < timeout_s * 10 && !got; i++) {
        state_push_filter_t f = {.run_id = id};
        state_push_t *ps = NULL;
        size_t n = 0;
        assert_int_equal(state_push_list(st, &f, STATE_PAGE_MAX, &ps, &n), 0);
        for (size_t k = 0; k < n; k++)
            got |= ps[k].state == want &&
                   (why == NULL || (ps[k].error != NULL && strstr(ps[k].error, why) != NULL));
        state_pushes_free(ps, n);
        if (!got)
            proc_sleep_ms(100);
    }
    state_close(st);
    return got;
}

/* Whether every online export of run id that reached an endpoint has an
 * eval logloss recorded; the first that has none goes to `which`. */
static bool exports_evaluated(int64_t id, char *which, size_t cap)
{
    state_t *st = fx_loop_db();
    state_push_filter_t f = {.run_id = id};
    state_push_t *ps = NULL;
    size_t n = 0;
    bool all = true;
    assert_int_equal(state_push_list(st, &f, STATE_PAGE_MAX, &ps, &n), 0);
    for (size_t k = 0; k < n && all; k++) {
        state_checkpoint_t c = {0};
        assert_int_equal(state_checkpoint_get_by_id(st, ps[k].checkpoint_id, &c), 0);
        all = !isnan(c.eval_logloss) && c.eval_logloss > 0;
        if (!all)
            snprintf(which, cap, "%s", c.uid);
        state_checkpoint_fini(&c);
    }
    state_pushes_free(ps, n);
    state_close(st);
    return all;
}

/* Each export is evaluated on data.eval before its push, whatever the
 * running trainer's copy of the spec says about the gate: here the job has
 * no push.max_regression when its run starts, and gets one (a resubmit)
 * while it trains. kilnd gates the run's exports from then on, and judges
 * them on their own figures; before, kiln-train evaluated exports only when
 * its spec had the gate, so every export went out with "the quality gate
 * was not applied ... has no eval logloss recorded (set data.eval)". */
static void test_online_export_gated(void **state)
{
    (void)state;
    fx_serve_t s = {0};
    char spec[500], extra[1500], gated[1600], sdir[400], which[64] = "";
    snprintf(sdir, sizeof sdir, "%s/serve", fx_loop.home);
    assert_true(fx_serve_start(&s, sdir));
    const char *tail = "  endpoints:\n    - {url: \"%s\", model: ctr, label: B}\n";
    snprintf(extra, sizeof extra,
             "train: {mode: online, batch_size: 128}\n"
             "export: {every: 300ms}\n"
             "data: {train: \"data/day=*.tsv\", eval: \"%s/eval.tsv\", settle: 0s}\n"
             "push:\n  token_env: KILN_TEST_TOKEN\n",
             fx_loop.data_dir);
    size_t len = strlen(extra);
    snprintf(extra + len, sizeof extra - len, tail, s.url);
    write_job("gate", extra, spec, sizeof spec);
    land("gate", "day0.tsv", "day=0.tsv");
    const char *env[] = {"KILN_TEST_TOKEN=" FX_TOKEN, NULL};
    fx_kilnd_start(&fx_loop.kd, fx_loop.home, env);
    int64_t id = submit(spec, "gate");
    /* The good partition's export lands on B, with its eval figures. */
    if (!wait_push(id, STATE_PUSH_SUCCEEDED, NULL, 60))
        fail_msg("no export of run %lld reached B (see %s)", (long long)id, fx_loop.home);
    if (!exports_evaluated(id, which, sizeof which))
        fail_msg("export %s of run %lld went to B with no eval logloss (data.eval is set)",
                 which, (long long)id);
    /* The gate is added while the run trains (the run keeps its spec; the
     * resubmit's own run waits behind it: concurrency forbid). */
    snprintf(gated, sizeof gated, "%.*s  max_regression: 0.0\n%s", (int)len, extra, extra + len);
    write_job("gate", gated, spec, sizeof spec);
    assert_int_not_equal(submit(spec, "gate"), id);
    /* The export after the flipped labels is held, with the reason. */
    land("gate", "flip.tsv", "day=1.tsv");
    bool held = wait_push(id, STATE_PUSH_HELD, "worse than", 60);
    if (!held)
        fail_msg("no export of run %lld was held by the quality gate (see %s)", (long long)id,
                 fx_loop.home);
    assert_int_equal(count_events(id, "push", "was not applied"), 0);
    cancel(id);
}

/* KILN_TEST_FILTER=test_online_* runs matching tests (cmocka glob). */
PROC_TEST_MAIN_EACH(setup_all, fx_loop_suite_teardown, fx_loop_test_setup, fx_loop_test_teardown,
                    test_marker_and_changed_partition, test_consumed_files_not_read_again,
                    test_online_bad_partition, test_online_retry_trains_nothing_twice,
                    test_failed_eval_leaves_no_checkpoint, test_online_export_gated)
