/*
 * tests/test_sched.c - kilnd end to end: a real kilnd (the built program), a
 * real mpirun with 2 ranks and the real kiln-train on small generated data,
 * each test in its own KILN_HOME. Covered: a one-off run to success (run
 * directory, metrics, an incremental resubmit skipped for lack of new data);
 * a one-off run whose partition is still settling skipped with that said;
 * cancel (SIGTERM to the run, SIGKILL after the grace, nothing left
 * running); a timeout; a rank killed by SIGKILL (the error names the rank,
 * host and signal) and its retry succeeding; `@every 2s` with forbid (fires
 * during a run are counted on the job as skipped, not runs; no time served
 * twice); an idle incremental job's fires counted, not runs, with kiln pause
 * and resume (catchup: none); --keep-runs removing an old run and its
 * directory but one with a checkpoint; catch-up
 * after downtime (catchup: all runs every missed time, once); kill -9 of
 * kilnd during runs (the live one is adopted, the one that ended meanwhile
 * gets its real outcome and end time, nothing duplicated); one kilnd per
 * database through a symlinked --db; refusing to start, with the reason in
 * --log, on a corrupt database or a trainer or mpirun that cannot run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "kiln.h"
#include "proc.h"
#include "sched_int.h"
#include "state.h"
#include "state_int.h"

#ifndef KILN_BIN
#error "KILN_BIN, KILND_BIN and KILN_TRAIN_BIN must name the executables"
#endif

static char data_dir[256]; /* shared generated data */
static char home[256];     /* this test's KILN_HOME */
static char db[320];

/* Runs argv to completion with output to home/cmd.out; returns the exit code. */
static int run_cmd(const char *const *argv)
{
    char out[400];
    snprintf(out, sizeof out, "%s/cmd.out", home[0] ? home : "/tmp");
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool file_exists(const char *dir, const char *name);
static pid_t kilnd_pid; /* the kilnd this test started, 0 when stopped */

/* kilnd with the test's options, and opt (with its value) when not NULL. */
static pid_t start_kilnd_opt(const char *opt, const char *value)
{
    char log[400];
    snprintf(log, sizeof log, "%s/kilnd.log", home);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(KILND_BIN, KILND_BIN, "--db", db, "--home", home, "--trainer", KILN_TRAIN_BIN,
              "--grace", "1s", "--poll", "200ms", "--max-ranks", "4", opt, value, (char *)NULL);
        _exit(127);
    }
    kilnd_pid = pid;
    return pid;
}

static pid_t start_kilnd(void)
{
    return start_kilnd_opt(NULL, NULL);
}

/* SIGTERM (or SIGKILL) and reap; returns the exit status. */
static int stop_kilnd(pid_t pid, int sig)
{
    kilnd_pid = 0;
    kill(pid, sig);
    int st = 0;
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return st;
        proc_sleep_ms(100);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fail_msg("kilnd did not stop within 10 s of signal %d", sig);
    return st;
}

static void write_spec(const char *name, const char *extra, char *path, size_t cap)
{
    char data[400] = "";
    snprintf(path, cap, "%s/%s.yaml", home, name);
    if (strstr(extra, "data:") == NULL)
        snprintf(data, sizeof data, "data: {train: \"%s/*.tsv\"}\n", data_dir);
    bool train = strncmp(extra, "train:", 6) != 0 && strstr(extra, "\ntrain:") == NULL;
    fx_write(path,
             "name: %s\n"
             "resources: {ranks: 2, threads: 1}\n"
             "model: {type: lr, embedding: {dim: 4, capacity: 100000}}\n"
             "%s%s%s",
             name, extra, data, train ? "train: {batch_size: 256, log_every: 2}\n" : "");
}

static void submit(const char *spec)
{
    const char *argv[] = {KILN_BIN, "--db", db, "submit", spec, NULL};
    int rc = run_cmd(argv);
    if (rc != 0)
        fail_msg("kiln submit %s exited %d", spec, rc);
}

static state_t *open_db(void)
{
    state_t *st = NULL;
    assert_int_equal(state_open(db, &st), 0);
    return st;
}

/* Waits until run_id is in state want (or any terminal state when want is
 * STATE_RUN_NSTATES); fails after timeout_s. */
static state_run_state_t wait_run(int64_t run_id, state_run_state_t want, int timeout_s)
{
    state_t *st = open_db();
    state_run_state_t got = fx_wait_run(st, run_id, want, timeout_s);
    state_close(st);
    if (want != STATE_RUN_NSTATES && got != want)
        fail_msg("run %lld is %s, expected %s within %d s (see %s/kilnd.log)", (long long)run_id,
                 got < STATE_RUN_NSTATES ? state_run_state_name(got) : "missing",
                 state_run_state_name(want), timeout_s, home);
    return got;
}

static void get_run(int64_t id, state_run_t *r)
{
    state_t *st = open_db();
    assert_int_equal(state_run_get(st, id, r), 0);
    state_close(st);
}

/* Run id has an error that names `what`. */
static void assert_run_error(int64_t id, const char *what)
{
    state_run_t r;
    get_run(id, &r);
    assert_non_null(r.error);
    assert_non_null(strstr(r.error, what));
    state_run_fini(&r);
}

/* Every run of job (NULL: of all jobs), newest first, into *rs
 * (state_runs_free); returns how many. */
static size_t job_runs(const char *job, state_run_t **rs)
{
    state_t *st = open_db();
    size_t n = 0;
    assert_int_equal(state_run_list(st, job, 0, rs, &n), 0);
    state_close(st);
    return n;
}

/* Writes the spec of job `name` with `extra`, submits it and starts kilnd;
 * returns kilnd's pid. */
static pid_t submit_and_start(const char *name, const char *extra)
{
    char spec[400];
    write_spec(name, extra, spec, sizeof spec);
    submit(spec);
    return start_kilnd();
}

static int setup_home(void **state)
{
    (void)state;
    if (proc_tmpdir("sched", home, sizeof home) < 0)
        return -1;
    snprintf(db, sizeof db, "%s/kiln.db", home);
    setenv("KILN_HOME", home, 1);
    return 0;
}

/* Stops what a test left behind: its kilnd, and every run still going (a
 * SIGTERM to its supervisor stops the run's whole session). */
static void stop_leftovers(void)
{
    if (kilnd_pid > 0) {
        kill(kilnd_pid, SIGKILL);
        waitpid(kilnd_pid, NULL, 0);
        kilnd_pid = 0;
    }
    for (int id = 1; id < 200; id++) {
        char dir[400], p[600];
        snprintf(dir, sizeof dir, "%s/runs/%d", home, id);
        if (access(dir, F_OK) != 0)
            continue;
        snprintf(p, sizeof p, "%s/supervisor.pid", dir);
        FILE *f = fopen(p, "r");
        int sup = 0;
        if (f == NULL)
            continue;
        if (fscanf(f, "%d", &sup) != 1)
            sup = 0;
        fclose(f);
        if (sup <= 0 || file_exists(dir, "status"))
            continue;
        kill(sup, SIGTERM);
        for (int i = 0; i < 100 && !file_exists(dir, "status"); i++)
            proc_sleep_ms(100);
    }
}

static int teardown_home(void **state)
{
    (void)state;
    stop_leftovers();
    int rc = proc_tmpdir_done(home);
    home[0] = '\0';
    return rc;
}

static int setup_all(void **state)
{
    (void)state;
    if (proc_tmpdir("sched-data", data_dir, sizeof data_dir) < 0)
        return -1;
    /* Open MPI's runtime leaves allocations LeakSanitizer cannot name. */
    proc_mpi_env(true);
    char out[400];
    snprintf(out, sizeof out, "%s/day0.tsv", data_dir);
    return fx_datagen(out, 3000, 5, 0) == 0 ? 0 : -1;
}

static int teardown_all(void **state)
{
    (void)state;
    return proc_rmtree(data_dir);
}

static bool file_exists(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* ---- tests ----------------------------------------------------------------------------- */

/* A one-off job to success; then the same incremental job again: no new data. */
static void test_submit_to_success(void **state)
{
    (void)state;
    char spec[400];
    write_spec("ok", "data: {train: \"DATA/*.tsv\", incremental: true, settle: 0s}\n", spec, sizeof spec);
    /* point data.train at the shared data */
    char text[2048];
    proc_slurp(spec, text, sizeof text);
    char *at = strstr(text, "DATA");
    fx_write(spec, "%.*s%s%s", (int)(at - text), text, data_dir, at + 4);

    submit(spec);
    pid_t k = start_kilnd();
    wait_run(1, STATE_RUN_SUCCEEDED, 30);
    state_run_t r;
    get_run(1, &r);
    assert_int_equal(r.exit_code, 0);
    assert_non_null(r.run_dir);
    const char *files[] = {"spec.yaml", "log", "progress.jsonl", "status", "supervisor.pid",
                           "inputs.txt", "result.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (!file_exists(r.run_dir, files[i]))
            fail_msg("run directory %s lacks %s", r.run_dir, files[i]);
    state_t *st = open_db();
    state_metric_t *m = NULL;
    size_t nm = 0;
    assert_int_equal(state_metric_series(st, 1, "loss", &m, &nm), 0);
    assert_true(nm >= 1);
    free(m);
    state_input_t *ins = NULL;
    size_t nin = 0;
    assert_int_equal(state_input_list(st, 1, &ins, &nin), 0);
    assert_int_equal(nin, 1);
    assert_non_null(strstr(ins[0].path, "day0.tsv"));
    state_inputs_free(ins, nin);
    state_close(st);
    state_run_fini(&r);

    submit(spec); /* run 2: every partition was consumed by run 1 */
    wait_run(2, STATE_RUN_SKIPPED, 15);
    assert_run_error(2, "no new data");
    stop_kilnd(k, SIGTERM);
}

/* A one-off run of an incremental job whose partition landed within
 * data.settle has nothing complete to train on: it is skipped, and says
 * that the file is still settling (and which), not that no data came. */
static void test_oneoff_within_settle(void **state)
{
    (void)state;
    char dir[400], part[500], cmd[1000];
    snprintf(dir, sizeof dir, "%s/fresh", home);
    mkdir(dir, 0755);
    snprintf(part, sizeof part, "%s/day=0.tsv", dir);
    snprintf(cmd, sizeof cmd, "cp %s/day0.tsv %s", data_dir, part);
    assert_int_equal(system(cmd), 0); /* landed just now */
    char extra[600];
    snprintf(extra, sizeof extra, "data: {train: \"%s/*.tsv\", incremental: true, settle: 1h}\n",
             dir);
    pid_t k = submit_and_start("fresh", extra);
    wait_run(1, STATE_RUN_SKIPPED, 15);
    assert_run_error(1, "no new data yet: 1 file matching");
    assert_run_error(1, "day=0.tsv");
    assert_run_error(1, "still settling: it changed less than data.settle (1h) ago");
    assert_run_error(1, "submit the job again once it is complete");
    stop_kilnd(k, SIGTERM);
}

/* A run queued under spec version 1 launches with version 1 even though the
 * job was resubmitted (version 2) before kilnd got to it; the run after it
 * gets version 2. */
static void test_queued_run_keeps_its_version(void **state)
{
    (void)state;
    char spec[400], path[600], text[2048];
    write_spec("ver", "train: {batch_size: 256, log_every: 2}\n", spec, sizeof spec);
    submit(spec);
    write_spec("ver", "train: {batch_size: 256, log_every: 3}\n", spec, sizeof spec);
    submit(spec);
    pid_t k = start_kilnd();
    wait_run(1, STATE_RUN_SUCCEEDED, 60);
    wait_run(2, STATE_RUN_SUCCEEDED, 60);
    for (int id = 1; id <= 2; id++) {
        state_run_t r;
        get_run(id, &r);
        assert_int_equal(r.job_version, id);
        snprintf(path, sizeof path, "%s/spec.yaml", r.run_dir);
        assert_int_equal(access(path, R_OK), 0);
        proc_slurp(path, text, sizeof text);
        const char *want = id == 1 ? "log_every: 2" : "log_every: 3";
        if (strstr(text, want) == NULL)
            fail_msg("run %d (version %d) ran with a spec without \"%s\":\n%s", id,
                     r.job_version, want, text);
        state_run_fini(&r);
    }
    stop_kilnd(k, SIGTERM);
}

static void test_cancel(void **state)
{
    (void)state;
    pid_t k = submit_and_start("long", "train: {batch_size: 128, epochs: 100000, log_every: 50}\n");
    wait_run(1, STATE_RUN_RUNNING, 15);
    proc_sleep_ms(1000);
    const char *argv[] = {KILN_BIN, "--db", db, "cancel", "1", NULL};
    assert_int_equal(run_cmd(argv), 0);
    wait_run(1, STATE_RUN_CANCELED, 15);
    state_run_t r;
    get_run(1, &r);
    char p[600];
    snprintf(p, sizeof p, "%s/mpirun.pid", r.run_dir);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    int mpirun = 0;
    assert_int_equal(fscanf(f, "%d", &mpirun), 1);
    fclose(f);
    /* The supervisor wrote the status after mpirun and every rank were gone. */
    assert_true(file_exists(r.run_dir, "status"));
    assert_true(kill(mpirun, 0) < 0 && errno == ESRCH);
    state_run_fini(&r);
    assert_run_error(1, "canceled");
    stop_kilnd(k, SIGTERM);
}

static void test_timeout(void **state)
{
    (void)state;
    char spec[400];
    write_spec("slow",
               "resources: {ranks: 2, threads: 1, timeout: 2s}\n"
               "retries: {count: 0}\n"
               "train: {batch_size: 128, epochs: 100000, log_every: 50}\n",
               spec, sizeof spec);
    /* write_spec adds its own resources line first; the second wins? no: keep one. */
    char text[2048];
    proc_slurp(spec, text, sizeof text);
    char *first = strstr(text, "resources: {ranks: 2, threads: 1}\n");
    if (first != NULL)
        memmove(first, first + strlen("resources: {ranks: 2, threads: 1}\n"),
                strlen(first + strlen("resources: {ranks: 2, threads: 1}\n")) + 1);
    fx_write(spec, "%s", text);
    submit(spec);
    pid_t k = start_kilnd();
    wait_run(1, STATE_RUN_TIMED_OUT, 20);
    state_run_t r;
    get_run(1, &r);
    assert_non_null(r.error);
    assert_non_null(strstr(r.error, "timed out"));
    assert_true(r.ended_at - r.started_at < 10);
    state_run_fini(&r);
    stop_kilnd(k, SIGTERM);
}

static void test_rank_killed_then_retry(void **state)
{
    (void)state;
    char spec[400];
    write_spec("crash", "retries: {count: 2, backoff: 1s, max_backoff: 2s}\n", spec, sizeof spec);
    submit(spec);
    setenv("KILN_TEST_KILL_RANK", "1", 1);
    setenv("KILN_TEST_KILL_STEP", "3", 1);
    pid_t k = start_kilnd();
    unsetenv("KILN_TEST_KILL_RANK");
    unsetenv("KILN_TEST_KILL_STEP");
    wait_run(1, STATE_RUN_FAILED, 30);
    state_run_t r;
    get_run(1, &r);
    assert_non_null(r.error);
    if (strstr(r.error, "rank 1") == NULL || strstr(r.error, "signal 9") == NULL ||
        strstr(r.error, "SIGKILL") == NULL)
        fail_msg("the error does not name the dead rank and signal: %s", r.error);
    state_run_fini(&r);
    wait_run(2, STATE_RUN_SUCCEEDED, 30);
    get_run(2, &r);
    assert_int_equal(r.trigger, STATE_TRIGGER_RETRY);
    assert_int_equal(r.attempt, 2);
    assert_int_equal(r.retry_of, 1);
    state_run_fini(&r);
    stop_kilnd(k, SIGTERM);
}

/* Checks that no (job, scheduled_at) is served twice by a first attempt. */
static void assert_unique_times(state_run_t *rs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (rs[i].attempt == 1 && rs[j].attempt == 1 && rs[i].scheduled_at != 0 &&
                rs[i].scheduled_at == rs[j].scheduled_at)
                fail_msg("runs %lld and %lld both serve %lld", (long long)rs[i].id,
                         (long long)rs[j].id, (long long)rs[i].scheduled_at);
}

static void test_cron_forbid(void **state)
{
    (void)state;
    pid_t k =
        submit_and_start("every2", "schedule: \"@every 2s\"\nconcurrency: forbid\n"
                                   "train: {batch_size: 128, epochs: 1500, log_every: 100}\n");
    proc_sleep_ms(9000);
    stop_kilnd(k, SIGTERM);
    state_run_t *rs = NULL;
    size_t n = job_runs("every2", &rs);
    int ran = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(rs[i].scheduled_at % 2 == 0);
        /* kilnd fires at the scheduled second: the run cannot have been
         * queued before it (time()'s coarse clock lags behind by a tick). */
        if (rs[i].queued_at < rs[i].scheduled_at)
            fail_msg("run %lld queued at %lld, before its scheduled time %lld",
                     (long long)rs[i].id, (long long)rs[i].queued_at,
                     (long long)rs[i].scheduled_at);
        assert_int_not_equal(rs[i].state, STATE_RUN_SKIPPED); /* a skipped fire is no run */
        if (rs[i].state != STATE_RUN_QUEUED)
            ran++;
    }
    assert_unique_times(rs, n);
    state_job_t j;
    state_t *st = open_db();
    assert_int_equal(state_job_get(st, "every2", &j), 0);
    state_close(st);
    if (ran < 1 || j.skipped_fires < 1)
        fail_msg("expected runs and skipped fires, got %d ran of %zu and %lld skipped", ran, n,
                 (long long)j.skipped_fires);
    assert_non_null(strstr(j.last_skip_reason, "forbid"));
    state_job_fini(&j);
    state_runs_free(rs, n);
}

/* The job's count of skipped fires. */
static int64_t skipped_fires(const char *job)
{
    state_job_t j;
    state_t *st = open_db();
    assert_int_equal(state_job_get(st, job, &j), 0);
    state_close(st);
    int64_t n = j.skipped_fires;
    state_job_fini(&j);
    return n;
}

/* Runs `kiln ARGS...` (up to 3) on the test's database; returns its exit code
 * with its output in home/cmd.out. */
static int kiln3(const char *a, const char *b, const char *c)
{
    const char *argv[] = {KILN_BIN, "--db", db, a, b, c, NULL};
    return run_cmd(argv);
}

/* An incremental `@every 1s` job with no data: each fire is counted on the
 * job (skipped, no new data) and none is a run. `kiln pause` stops the fires
 * (none counted, kiln jobs says paused); `kiln resume` brings them back, and
 * the fires missed meanwhile follow catchup: none (counted as missed). */
static void test_skips_pause_resume(void **state)
{
    (void)state;
    char extra[600], out[4096], log[400];
    snprintf(extra, sizeof extra,
             "schedule: \"@every 1s\"\ncatchup: none\n"
             "data: {train: \"%s/none/*.tsv\", incremental: true}\n",
             home);
    pid_t k = submit_and_start("idle", extra);
    for (int i = 0; i < 100 && skipped_fires("idle") < 2; i++)
        proc_sleep_ms(100);
    assert_true(skipped_fires("idle") >= 2);
    state_job_t j;
    state_t *st = open_db();
    assert_int_equal(state_job_get(st, "idle", &j), 0);
    state_close(st);
    assert_true(j.last_checked_at > 0);
    assert_non_null(strstr(j.last_skip_reason, "no new data"));
    state_job_fini(&j);

    assert_int_equal(kiln3("pause", "idle", NULL), 0);
    proc_sleep_ms(600); /* kilnd reads the change within its 200 ms poll */
    int64_t paused = skipped_fires("idle");
    proc_sleep_ms(2500);
    assert_int_equal(skipped_fires("idle"), paused);
    assert_int_equal(kiln3("jobs", NULL, NULL), 0);
    snprintf(out, sizeof out, "%s/cmd.out", home);
    proc_slurp(out, out, sizeof out);
    assert_non_null(strstr(out, "paused"));

    assert_int_equal(kiln3("resume", "idle", NULL), 0);
    for (int i = 0; i < 30 && skipped_fires("idle") < paused + 3; i++)
        proc_sleep_ms(100);
    assert_true(skipped_fires("idle") >= paused + 3); /* two missed, one on time */
    snprintf(log, sizeof log, "%s/kilnd.log", home);
    static char text[1 << 16];
    proc_slurp(log, text, sizeof text);
    assert_non_null(strstr(text, "the job was paused (catchup: none)"));
    state_run_t *rs = NULL;
    assert_int_equal(job_runs("idle", &rs), 0);
    stop_kilnd(k, SIGTERM);
}

/* Polls (100 ms, at most tries times) until retention has removed run id
 * from the database; returns state_run_get's last code (KILN_ENOENT: gone). */
static int wait_run_gone(int64_t id, int tries)
{
    int rc = 0;
    for (int i = 0; i < tries; i++) {
        state_t *st = open_db();
        state_run_t r;
        rc = state_run_get(st, id, &r);
        state_close(st);
        if (rc == KILN_ENOENT)
            break;
        state_run_fini(&r);
        proc_sleep_ms(100);
    }
    return rc;
}

/* kilnd --keep-runs 1 (a bare number: days) removes a failed run that ended
 * 3 days ago with its events and run directory, and keeps an old run with a
 * checkpoint and a recent one; --keep-runs 1s then removes the recent one
 * too (a duration; the newest run of the job stays). */
static void test_keep_runs(void **state)
{
    (void)state;
    state_t *st = open_db();
    int64_t job = 0, ids[4];
    assert_int_equal(state_job_put(st, "old", "name: old\nmodel: {type: lr}\n", "00000000000000aa",
                                   NULL, 0, &job, NULL),
                     0);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/runs/1", home);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(state_run_create(st, job, STATE_TRIGGER_MANUAL, 0, 1, 0, &ids[i]), 0);
        assert_int_equal(state_run_transition(st, ids[i], STATE_RUN_QUEUED, STATE_RUN_FAILED, 1,
                                              "lost"),
                         0);
    }
    assert_int_equal(state_run_set_launch(st, ids[0], dir, 0, "h"), 0);
    char logf[420];
    snprintf(logf, sizeof logf, "%s/log", dir);
    assert_int_equal(kiln_mkdir_p(dir), 0);
    fx_write(logf, "an old log\n");
    state_checkpoint_t c = {0};
    c.uid = (char *)"ck-old";
    c.run_id = ids[1];
    c.kind = (char *)"full";
    c.path = (char *)"/nowhere";
    c.eval_logloss = c.eval_auc = 0.0 / 0.0;
    int64_t ck;
    assert_int_equal(state_checkpoint_add(st, &c, &ck), 0);
    assert_int_equal(state_test_exec(st, "UPDATE runs SET ended_at = ended_at - 3 * 86400 "
                                         "WHERE id IN (1, 2)"),
                     0);
    state_close(st);
    pid_t k = start_kilnd_opt("--keep-runs", "1");
    state_run_t r;
    int rc = wait_run_gone(ids[0], 50);
    stop_kilnd(k, SIGTERM);
    assert_int_equal(rc, KILN_ENOENT);
    assert_false(file_exists(dir, "log"));
    get_run(ids[1], &r); /* it wrote a checkpoint */
    state_run_fini(&r);
    get_run(ids[2], &r); /* it ended now */
    state_run_fini(&r);
    k = start_kilnd_opt("--keep-runs", "1s");
    rc = wait_run_gone(ids[2], 100);
    stop_kilnd(k, SIGTERM);
    assert_int_equal(rc, KILN_ENOENT);
    get_run(ids[3], &r); /* the job's newest */
    state_run_fini(&r);
}

static void test_catchup_after_downtime(void **state)
{
    (void)state;
    pid_t k =
        submit_and_start("catchup", "schedule: \"@every 2s\"\nconcurrency: allow\ncatchup: all\n");
    wait_run(1, STATE_RUN_SUCCEEDED, 20);
    stop_kilnd(k, SIGTERM);
    proc_sleep_ms(6000); /* three fire times pass while kilnd is down */
    k = start_kilnd();
    proc_sleep_ms(5000);
    stop_kilnd(k, SIGTERM);
    state_run_t *rs = NULL;
    size_t n = job_runs("catchup", &rs);
    assert_unique_times(rs, n);
    int64_t lo = INT64_MAX, hi = 0;
    int catchup = 0;
    for (size_t i = 0; i < n; i++) {
        if (rs[i].scheduled_at < lo)
            lo = rs[i].scheduled_at;
        if (rs[i].scheduled_at > hi)
            hi = rs[i].scheduled_at;
        catchup += rs[i].trigger == STATE_TRIGGER_CATCHUP;
        assert_int_not_equal(rs[i].state, STATE_RUN_SKIPPED);
    }
    /* Every fire time from the first to the last has its run: none dropped. */
    assert_int_equal((size_t)((hi - lo) / 2 + 1), n);
    if (catchup < 2)
        fail_msg("expected at least 2 catch-up runs after 6 s down, got %d of %zu", catchup, n);
    state_runs_free(rs, n);
}

/* Sends sig to the ranks of the run in run_dir; returns how many. */
static int signal_ranks(const char *run_dir, int sig)
{
    return proc_signal_matching("kiln-train", run_dir, sig);
}

/* Waits up to timeout_s for kilnd.log to contain text. */
static bool log_has(const char *text, int timeout_s)
{
    char log[400], buf[65536];
    snprintf(log, sizeof log, "%s/kilnd.log", home);
    for (int i = 0; i <= timeout_s * 10; i++) {
        FILE *f = fopen(log, "r");
        if (f != NULL) {
            size_t len = fread(buf, 1, sizeof buf - 1, f);
            buf[len] = '\0';
            fclose(f);
            if (strstr(buf, text) != NULL)
                return true;
        }
        proc_sleep_ms(100);
    }
    return false;
}

/* A kilnd killed after it took a run but before the run's supervisor
 * started (run 1: run directory recorded, no supervisor.pid; run 2: not even
 * that, but an input recorded) leaves nothing that ran: the next kilnd
 * queues both again as the same attempt, forgets the half-made launch and
 * its inputs, and both succeed with no retry run. */
static void test_kill9_before_supervisor(void **state)
{
    (void)state;
    char a[400], b[400];
    write_spec("never1", "train: {batch_size: 128, epochs: 2}\n", a, sizeof a);
    write_spec("never2", "train: {batch_size: 128, epochs: 2}\n", b, sizeof b);
    submit(a);
    submit(b);
    state_t *st = open_db();
    char dir[600];
    snprintf(dir, sizeof dir, "%s/runs/1", home);
    assert_int_equal(kiln_mkdir_p(dir), 0);
    for (int64_t id = 1; id <= 2; id++)
        assert_int_equal(
            state_run_transition(st, id, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, -1, NULL), 0);
    assert_int_equal(state_run_set_launch(st, 1, dir, 0, NULL), 0);
    const state_input_t in = {.path = "/nowhere/day0.tsv", .size = 1, .mtime = 1};
    assert_int_equal(state_input_add(st, 2, &in), 0);
    state_close(st);

    pid_t k = start_kilnd();
    assert_int_equal(wait_run(1, STATE_RUN_SUCCEEDED, 60), STATE_RUN_SUCCEEDED);
    assert_int_equal(wait_run(2, STATE_RUN_SUCCEEDED, 60), STATE_RUN_SUCCEEDED);
    stop_kilnd(k, SIGTERM);
    state_run_t *rs = NULL;
    assert_int_equal(job_runs(NULL, &rs), 2);
    st = open_db();
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rs[i].attempt, 1);
        state_event_t *es = NULL;
        size_t ne = 0;
        int requeued = 0;
        assert_int_equal(state_event_list(st, 0, rs[i].id, &es, &ne), 0);
        for (size_t e = 0; e < ne; e++)
            requeued += strstr(es[e].message, "launching -> queued") != NULL;
        state_events_free(es, ne);
        assert_int_equal(requeued, 1);
    }
    state_input_t *ins = NULL;
    size_t nin = 0;
    assert_int_equal(state_input_list(st, 2, &ins, &nin), 0);
    for (size_t i = 0; i < nin; i++) /* the relaunch records its own; the aborted one's is gone */
        assert_string_not_equal(ins[i].path, in.path);
    state_inputs_free(ins, nin);
    state_close(st);
    state_runs_free(rs, 2);
}

static void test_kill9_recovery(void **state)
{
    (void)state;
    char quick[400], slow[400];
    write_spec("quick", "train: {batch_size: 128, epochs: 300, log_every: 100}\n", quick,
               sizeof quick);
    write_spec("slow", "train: {batch_size: 128, epochs: 900, log_every: 100}\n", slow,
               sizeof slow);
    submit(quick);
    submit(slow);
    pid_t k = start_kilnd();
    wait_run(1, STATE_RUN_RUNNING, 15);
    wait_run(2, STATE_RUN_RUNNING, 15);
    /* Run 2 must still be alive when kilnd comes back, however fast this
     * host is: its ranks are stopped (SIGSTOP) until kilnd has adopted it. */
    state_run_t r;
    get_run(2, &r);
    char slow_dir[400];
    snprintf(slow_dir, sizeof slow_dir, "%s", r.run_dir);
    state_run_fini(&r);
    int stopped = 0;
    for (int i = 0; i < 150 && stopped < 2; i++) {
        stopped = signal_ranks(slow_dir, SIGSTOP);
        if (stopped < 2)
            proc_sleep_ms(100);
    }
    assert_int_equal(stopped, 2);
    stop_kilnd(k, SIGKILL);
    /* run 1 ends while kilnd is down; its supervisor writes the status. */
    get_run(1, &r);
    char status[600];
    snprintf(status, sizeof status, "%s/status", r.run_dir);
    state_run_fini(&r);
    for (int i = 0; i < 600 && access(status, F_OK) != 0; i++) /* ASan builds are slow */
        proc_sleep_ms(100);
    if (access(status, F_OK) != 0) {
        char cmd[1400];
        signal_ranks(slow_dir, SIGCONT);
        fprintf(stderr, "no %s after 60 s; the run's log and kilnd's:\n", status);
        snprintf(cmd, sizeof cmd, "tail -n 20 \"$(dirname '%.600s')/log\" '%s/kilnd.log' >&2",
                 status, home);
        if (system(cmd) != 0)
            fprintf(stderr, "(could not show the logs)\n");
        fail_msg("the run's supervisor wrote no status while kilnd was down");
    }
    /* kilnd comes back well after run 1 ended: its record must keep the
     * time its supervisor wrote, not take the restart's. */
    char st_text[512];
    proc_slurp(status, st_text, sizeof st_text);
    const char *ea = strstr(st_text, "\"ended_at\": ");
    assert_non_null(ea);
    long long status_ended = atoll(ea + 12);
    while (time(NULL) < status_ended + 3)
        proc_sleep_ms(200);
    k = start_kilnd();
    bool adopted = log_has("run 2 adopted", 30);
    assert_int_equal(signal_ranks(slow_dir, SIGCONT), 2);
    if (!adopted)
        fail_msg("kilnd did not adopt the live run 2 within 30 s; see %s/kilnd.log", home);
    wait_run(1, STATE_RUN_SUCCEEDED, 10);
    get_run(1, &r);
    if (r.ended_at != status_ended)
        fail_msg("run 1 ended at %lld by its status file, but is recorded as ended at %lld "
                 "(kilnd's restart)",
                 status_ended, (long long)r.ended_at);
    state_run_fini(&r);
    wait_run(2, STATE_RUN_SUCCEEDED, 120);
    stop_kilnd(k, SIGTERM);
    state_run_t *rs = NULL;
    size_t n = job_runs(NULL, &rs);
    assert_int_equal(n, 2); /* nothing duplicated, no retry */
    state_runs_free(rs, n);
    assert_true(log_has("run 1 ended while kilnd was away", 0));
    /* The adoption is in run 2's events too (kiln show, the run page), not
     * only in kilnd's log. */
    state_t *st = open_db();
    state_event_t *es = NULL;
    size_t ne = 0;
    assert_int_equal(state_event_list(st, 0, 2, &es, &ne), 0);
    bool told = false;
    for (size_t e = 0; e < ne; e++)
        told |= strcmp(es[e].kind, "adopted") == 0 && strstr(es[e].message, "supervisor") != NULL;
    state_events_free(es, ne);
    state_close(st);
    if (!told)
        fail_msg("run 2 has no 'adopted' event");
}

/* Runs kilnd with argv[1..] (argv[0] is ignored), its stdout and stderr in
 * home/NAME.out, and waits up to timeout_s for it to exit: returns its exit
 * code, or -1 when it was still running (it is then killed). */
static int kilnd_exits(const char *name, const char *const *args, int timeout_s, char *out,
                       size_t cap)
{
    char path[400];
    snprintf(path, sizeof path, "%s/%s.out", home, name);
    const char *argv[32] = {KILND_BIN};
    int n = 1;
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(KILND_BIN, (char *const *)argv);
        _exit(127);
    }
    int st = 0, code = -1;
    for (int i = 0; i < timeout_s * 10; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        proc_sleep_ms(100);
    }
    if (code < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    proc_slurp(path, out, cap);
    return code;
}

/* One kilnd per database, however the database is named: a second kilnd
 * given a symlink to the first one's database refuses to start, naming the
 * first one's pid (it used to start, and both adopted and launched the same
 * runs). */
static void test_lock_through_symlink(void **state)
{
    (void)state;
    char link[400], out[4096], want[600];
    pid_t k = start_kilnd();
    assert_true(log_has("max 4 ranks", 20)); /* the first one is up, holding its lock */
    snprintf(link, sizeof link, "%s/link.db", home);
    assert_int_equal(symlink(db, link), 0);
    const char *args[] = {"--db",         link,       "--home", home, "--trainer",
                          KILN_TRAIN_BIN, "--listen", "",       NULL};
    int code = kilnd_exits("second", args, 10, out, sizeof out);
    if (code != 1)
        fail_msg("a second kilnd on a link to the database: exit %d (want 1): %s", code, out);
    snprintf(want, sizeof want, "another kilnd (pid %d) is running on %s", (int)k, link);
    if (strstr(out, want) == NULL)
        fail_msg("wanted \"%s\" in: %s", want, out);
    stop_kilnd(k, SIGTERM);
}

/* kilnd refuses to start, with the reason on stderr and in --log, on a
 * database that is not one and on a corrupt one, and with a trainer or an
 * mpirun it cannot run (it used to start and fail every run with exit
 * code 132). */
static void test_refuses_to_start(void **state)
{
    (void)state;
    char bad[400], log[400], out[4096], text[8192], cmd[2400];
    snprintf(log, sizeof log, "%s/refuse.log", home);
    /* Not a database: 8 KiB of random bytes. A corrupt one: a real
     * database with its pages after the header overwritten. */
    snprintf(bad, sizeof bad, "%s/random.db", home);
    snprintf(cmd, sizeof cmd, "head -c 8192 /dev/urandom > '%s'", bad);
    assert_int_equal(system(cmd), 0);
    const struct {
        const char *db, *trainer, *mpirun, *want;
    } cases[] = {
        {bad, KILN_TRAIN_BIN, "mpirun", "file is not a database"},
        {"CORRUPT", KILN_TRAIN_BIN, "mpirun", "database disk image is malformed"},
        {"GOOD", "/nonexistent/kiln-train", "mpirun",
         "the trainer /nonexistent/kiln-train is not an executable file, so every run would "
         "fail"},
        {"GOOD", "NOEXEC", "mpirun", "/not-executable is not an executable file"},
        {"GOOD", KILN_TRAIN_BIN, "/nonexistent/mpirun",
         "--mpirun /nonexistent/mpirun is not an executable file"},
    };
    state_close(open_db()); /* GOOD: a real database */
    char corrupt[400];
    snprintf(corrupt, sizeof corrupt, "%s/corrupt.db", home);
    snprintf(cmd, sizeof cmd,
             "cp '%s' '%s' && dd if=/dev/zero bs=1 seek=100 count=3996 conv=notrunc of='%s' "
             "2>/dev/null && head -c 4096 /dev/urandom >> '%s'",
             db, corrupt, corrupt, corrupt);
    assert_int_equal(system(cmd), 0);
    char noexec[400]; /* a file that exists, without execute permission */
    snprintf(noexec, sizeof noexec, "%s/not-executable", home);
    fclose(fopen(noexec, "w"));
    chmod(noexec, 0644);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *trainer = strcmp(cases[i].trainer, "NOEXEC") == 0 ? noexec : cases[i].trainer;
        const char *d = strcmp(cases[i].db, "GOOD") == 0      ? db
                        : strcmp(cases[i].db, "CORRUPT") == 0 ? corrupt
                                                              : cases[i].db;
        unlink(log);
        const char *args[] = {
            "--db",          d,       "--home", home,       "--trainer", trainer, "--mpirun",
            cases[i].mpirun, "--log", log,      "--listen", "",          NULL};
        int code = kilnd_exits("refuse", args, 10, out, sizeof out);
        proc_slurp(log, text, sizeof text);
        if (code != 1 || strstr(out, cases[i].want) == NULL ||
            strstr(text, "kilnd cannot start: ") == NULL || strstr(text, cases[i].want) == NULL)
            fail_msg("case %zu: exit %d (want 1); want \"%s\" on stderr and in --log.\n"
                     "stderr: %s\nlog: %s",
                     i, code, cases[i].want, out, text);
    }
}

/* srun's report of a task that died of a signal names the rank and host in
 * the run's failure, in both of srun's forms: "task 1: Killed" (one task)
 * and "tasks 0-1: Killed" (several); an exit code is not a kill. Issue 27
 * found the one-task form unparsed ("Slurm job 5 FAILED ... exit 143"). */
static void test_slurm_killed_parsed(void **state)
{
    (void)state;
    static const struct {
        const char *line, *want;
    } cases[] = {
        {"srun: error: stnode2: task 1: Killed\n",
         "rank 1 on host stnode2 was killed (srun: Killed) (Slurm job 5 FAILED, exit 143)"},
        {"srun: error: stnode1: tasks 0-1: Killed\n",
         "rank 0 on host stnode1 was killed (srun: Killed) (Slurm job 5 FAILED, exit 143)"},
        {"srun: error: stnode2: task 1: Exited with exit code 2\n", NULL},
    };
    char dir[400];
    snprintf(dir, sizeof dir, "%s/slurm-killed", home);
    assert_int_equal(kiln_mkdir_p(dir), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char log[480];
        snprintf(log, sizeof log, "%s/log", dir);
        fx_write(log, "step 4 loss 0.5\n%sslurmstepd: error: *** STEP 5.0 ON stnode1 CANCELLED\n",
                 cases[i].line);
        run_status_t st = {.exit_code = 143, .job_id = 5};
        snprintf(st.job_state, sizeof st.job_state, "FAILED");
        state_run_state_t to;
        char *error = NULL;
        bool retryable = false;
        sched_slurm_outcome(dir, &st, NULL, &to, &error, &retryable);
        assert_int_equal(to, STATE_RUN_FAILED);
        assert_non_null(error);
        if (cases[i].want != NULL ? strcmp(error, cases[i].want) != 0
                                  : strstr(error, "was killed") != NULL)
            fail_msg("case %zu (%s): got \"%s\"", i, cases[i].line, error);
        free(error);
    }
}

/* A run's environment (its id, attempt and spec directory) is set in its
 * supervisor after fork, never in kilnd: kilnd's push workers call getenv
 * while the loop launches, and setenv/unsetenv there was a data race (issue
 * 27). The child sees the run's values and an unset KILN_SPEC_DIR; this
 * process's environment stays as it was. */
static void test_run_env_in_child(void **state)
{
    (void)state;
    char dir[400], log[480];
    snprintf(dir, sizeof dir, "%s/env-run", home);
    assert_int_equal(kiln_mkdir_p(dir), 0);
    setenv(RUN_ENV_SPEC_DIR, "/stale/dir", 1);
    unsetenv(RUN_ENV_RUN_ID);
    const char *env[] = {RUN_ENV_RUN_ID "=7", RUN_ENV_ATTEMPT "=2", RUN_ENV_SPEC_DIR, NULL};
    char *const argv[] = {"/bin/sh", "-c",
                          "echo \"id=$" RUN_ENV_RUN_ID " attempt=$" RUN_ENV_ATTEMPT
                          " dir=${" RUN_ENV_SPEC_DIR "-unset}\"",
                          NULL};
    pid_t pid = 0;
    assert_int_equal(sched_supervise_spawn_follow(dir, argv, env, 1000, NULL, 0, &pid), 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char text[4096];
    snprintf(log, sizeof log, "%s/%s", dir, RUN_FILE_LOG);
    proc_slurp(log, text, sizeof text);
    if (strstr(text, "id=7 attempt=2 dir=unset\n") == NULL)
        fail_msg("the run's environment is not what kilnd gave it:\n%s", text);
    assert_null(getenv(RUN_ENV_RUN_ID));
    assert_string_equal(getenv(RUN_ENV_SPEC_DIR), "/stale/dir");
    unsetenv(RUN_ENV_SPEC_DIR);
}

/* A run whose end cannot be recorded (the database's disk is full: a
 * trigger refuses the update as SQLite would) is recorded once space is
 * back, without a kilnd restart. Issue 27: it stayed "running" until kilnd
 * restarted. */
static void test_end_recorded_after_disk_full(void **state)
{
    (void)state;
    state_t *st = open_db();
    assert_int_equal(state_test_exec(st, "CREATE TABLE test_disk_full (x);"
                                         "INSERT INTO test_disk_full VALUES (1);"
                                         "CREATE TRIGGER test_full BEFORE UPDATE OF state ON runs "
                                         "WHEN NEW.state IN ('succeeded', 'failed') AND EXISTS "
                                         "(SELECT 1 FROM test_disk_full) BEGIN SELECT "
                                         "RAISE(ABORT, 'database or disk is full'); END"),
                     0);
    state_close(st);
    pid_t k = submit_and_start("full", "");
    char log[400], text[65536] = "";
    snprintf(log, sizeof log, "%s/kilnd.log", home);
    for (int i = 0; i < 300 && strstr(text, "cannot record its end") == NULL; i++) {
        proc_sleep_ms(100);
        proc_slurp(log, text, sizeof text);
    }
    if (strstr(text, "cannot record its end: ") == NULL)
        fail_msg("kilnd never failed to record the run's end:\n%s", text);
    state_run_t r;
    get_run(1, &r);
    assert_int_equal(r.state, STATE_RUN_RUNNING);
    state_run_fini(&r);
    st = open_db();
    assert_int_equal(state_test_exec(st, "DELETE FROM test_disk_full"), 0); /* space is back */
    state_close(st);
    wait_run(1, STATE_RUN_SUCCEEDED, 10);
    stop_kilnd(k, SIGTERM);
}

/* KILN_TEST_FILTER=test_cancel runs one test (cmocka glob). */
PROC_TEST_MAIN_EACH(setup_all, teardown_all, setup_home, teardown_home,
    test_submit_to_success, test_oneoff_within_settle, test_queued_run_keeps_its_version,
    test_cancel, test_timeout, test_rank_killed_then_retry, test_cron_forbid,
    test_catchup_after_downtime, test_skips_pause_resume, test_keep_runs, test_kill9_recovery,
    test_kill9_before_supervisor, test_lock_through_symlink, test_refuses_to_start,
    test_slurm_killed_parsed, test_run_env_in_child, test_end_recorded_after_disk_full)
