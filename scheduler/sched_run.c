/*
 * scheduler/sched_run.c - one run's life as kilnd sees it: picking the new
 * input partitions of an incremental job, making the run directory
 * ($KILN_HOME/runs/<id>/, its files named in run/run.h), launching it under a
 * supervisor, stopping it (cancel, timeout, replace), recording its progress
 * as metrics and queuing the pushes of its online exports while it runs,
 * ending it with its real outcome (a success queues the pushes its job's
 * export.on_success asks for, in the same transaction; a failure the retry
 * its policy asks for), and at start-up adopting or ending the runs that an
 * earlier kilnd left behind.
 */
#include "sched_int.h"

#include "data.h"
#include "ops.h"

#include <errno.h>
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    return kiln_now_ms();
}

/* ---- retries --------------------------------------------------------------------- */

int64_t sched_backoff_ms(sched_t *s, const job_spec_t *spec, int attempt)
{
    /* xorshift: the jitter's noise. */
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return kiln_backoff_ms(spec->retries.backoff_ms, spec->retries.max_backoff_ms, attempt, s->rng);
}

/* sched_fail_run, with the time the run ended (0: now). Returns 0 or the
 * failure to record it (logged). */
static int fail_run_at(sched_t *s, int64_t run_id, state_run_state_t from, int attempt,
                        const job_spec_t *spec, bool retryable, int exit_code, const char *error,
                        int64_t ended_at)
{
    int64_t not_before = -1;
    if (retryable && spec != NULL && attempt <= spec->retries.count) {
        int64_t ms = sched_backoff_ms(s, spec, attempt);
        not_before = (now_ms() + ms + 999) / 1000;
    }
    int64_t retry = 0;
    int rc = state_run_end_at(s->st, run_id, from, STATE_RUN_FAILED, exit_code, error, ended_at,
                              not_before, &retry);
    if (rc < 0)
        KILN_WARN("run %lld: cannot record its failure: %s", (long long)run_id, kiln_errmsg());
    else if (retry)
        KILN_INFO("run %lld failed (%s); retry %lld queued (attempt %d)", (long long)run_id, error,
                  (long long)retry, attempt + 1);
    else
        KILN_INFO("run %lld failed: %s", (long long)run_id, error);
    return rc;
}

void sched_fail_run(sched_t *s, int64_t run_id, state_run_state_t from, int attempt,
                    const job_spec_t *spec, bool retryable, int exit_code, const char *error)
{
    fail_run_at(s, run_id, from, attempt, spec, retryable, exit_code, error, 0);
}

/* ---- the run directory -------------------------------------------------------------- */

/* The directory the run's relative paths resolve against: the directory of
 * the spec file it was submitted from (runs.spec_dir, written with the run),
 * or, for a spec that came from no file (the web API), $KILN_HOME/jobs/NAME,
 * made here. NULL only when out of memory. */
static char *spec_base_dir(sched_t *s, const state_run_t *run, const char *job_name)
{
    if (run->spec_dir != NULL && run->spec_dir[0] == '/')
        return kiln_strdup(run->spec_dir);
    char *dir = kiln_asprintf("%s/jobs/%s", s->home, job_name);
    if (dir != NULL && kiln_mkdir_p(dir) < 0)
        KILN_WARN("job %s: %s", job_name, kiln_errmsg());
    return dir;
}

static char *resolve(const char *base, const char *path)
{
    if (path == NULL)
        return NULL;
    if (path[0] == '/' || base == NULL)
        return kiln_strdup(path);
    return kiln_asprintf("%s/%s", base, path);
}

/* ---- launch -------------------------------------------------------------------------- */

/* The checkpoint a retry resumes from: the newest one written by the run it
 * retries, or by that run's own predecessors when it wrote none. With
 * --resume kiln-train continues the data where the failed attempt's
 * checkpoint stood, so the retry ends with the model a fault-free run would
 * have (docs/chaos.md). NULL: start as the spec says (train.init_from). */
static char *retry_checkpoint(sched_t *s, int64_t run_id)
{
    for (int depth = 0; run_id > 0 && depth < 100; depth++) {
        state_checkpoint_t *cs = NULL;
        size_t n = 0;
        char *path = NULL;
        if (state_checkpoint_list_by_run(s->st, run_id, &cs, &n) == 0 && n > 0)
            path = kiln_strdup(cs[n - 1].path); /* oldest first: the last is newest */
        state_checkpoints_free(cs, n);
        if (path != NULL)
            return path;
        state_run_t r;
        if (state_run_get(s->st, run_id, &r) < 0)
            return NULL;
        run_id = r.retry_of;
        state_run_fini(&r);
    }
    return NULL;
}

/* When kilnd stops a run for resources.timeout; 0: never. Slurm enforces a
 * Slurm run's limit itself (--time, counted from the job's start, not from
 * its submission), and the run ends TIMEOUT from there. */
static int64_t deadline_of(const job_spec_t *spec, int64_t started_ms)
{
    if (spec == NULL || spec->resources.timeout_ms <= 0 ||
        spec->resources.launcher == JOB_LAUNCH_SLURM)
        return 0;
    return started_ms + spec->resources.timeout_ms;
}

/* A run launches with the spec version it was queued under: the job may
 * have been resubmitted since, and the run's lineage names its version.
 * *usable with that version parsed into *spec (its YAML in *yaml); else the
 * run has failed with the reason. Returns 0 or the failure to record that. */
static int queued_version(sched_t *s, const state_run_t *run, const sched_job_t *job,
                          job_spec_t *spec, char **yaml, bool *usable)
{
    int rc = state_job_version_spec(s->st, job->row.id, run->job_version, yaml);
    if (rc == 0)
        rc = job_spec_parse(*yaml, strlen(*yaml), job->row.name, spec, NULL);
    *usable = rc == 0;
    if (rc < 0) {
        char *why = kiln_asprintf("spec version %d of job %s cannot be used: %s",
                                  run->job_version, job->row.name, kiln_errmsg());
        rc = state_run_transition(s->st, run->id, STATE_RUN_QUEUED, STATE_RUN_FAILED, -1, why);
        KILN_WARN("run %lld: %s", (long long)run->id, why ? why : "out of memory");
        free(why);
        return rc == KILN_ESTATE ? 0 : rc;
    }
    KILN_INFO("run %lld launches with spec version %d of job %s (the job is at version %d)",
              (long long)run->id, run->job_version, job->row.name, job->row.version);
    return 0;
}

/* Writes the run's new input files as run_dir/inputs (one path a line; its
 * path into inputs_path) and records them as the run's inputs. */
static int write_inputs(sched_t *s, const state_run_t *run, const char *run_dir,
                        const state_input_t *ins, size_t nins, char *inputs_path, size_t sz)
{
    size_t len = 1;
    for (size_t i = 0; i < nins; i++)
        len += strlen(ins[i].path) + 1;
    char *list = kiln_calloc(1, len);
    if (list == NULL)
        return KILN_ENOMEM;
    for (size_t i = 0; i < nins; i++) {
        strcat(list, ins[i].path);
        strcat(list, "\n");
    }
    int rc = run_write_text(run_dir, RUN_FILE_INPUTS, list);
    free(list);
    KILN_CHECK(rc);
    snprintf(inputs_path, sz, "%s/%s", run_dir, RUN_FILE_INPUTS);
    for (size_t i = 0; i < nins; i++)
        KILN_CHECK(state_input_add(s->st, run->id, &ins[i]));
    return 0;
}

int sched_launch(sched_t *s, const state_run_t *run, const sched_job_t *job)
{
    const job_spec_t *spec = &job->spec;
    const char *spec_yaml = job->row.spec_yaml;
    job_spec_t queued_spec;
    char *queued_yaml = NULL;
    bool own_spec = false;
    char *base = NULL;
    state_input_t *ins = NULL;
    size_t nins = 0;
    char *run_dir = NULL, *hostfile = NULL, *resume = NULL, *env_dir = NULL;
    char **argv = NULL;
    int rc = 0;
    bool launching = false;

    if (run->job_version > 0 && run->job_version != job->row.version) {
        rc = queued_version(s, run, job, &queued_spec, &queued_yaml, &own_spec);
        if (!own_spec)
            goto out;
        spec = &queued_spec;
        spec_yaml = queued_yaml;
    }
    base = spec_base_dir(s, run, job->row.name);

    if (spec->data.incremental) {
        sched_incomplete_t wait = {0};
        char *pattern = resolve(base, spec->data.train);
        rc = pattern ? sched_new_inputs(s, job, spec, pattern, &ins, &nins, &wait) : KILN_ENOMEM;
        free(pattern);
        if (rc < 0) {
            KILN_WARN("run %lld: %s; trying again later", (long long)run->id, kiln_errmsg());
            free(wait.first);
            goto out;
        }
        /* An online run waits for partitions to land; a batch run with
         * nothing new has nothing to do. */
        if (nins == 0 && spec->train.mode != JOB_MODE_ONLINE) {
            bool cron = run->trigger == STATE_TRIGGER_CRON ||
                        run->trigger == STATE_TRIGGER_CATCHUP;
            char *why = sched_no_data_reason(spec, &wait, !cron);
            free(wait.first);
            /* A cron fire with nothing to do is no run: the job counts it. */
            if (cron)
                rc = state_run_drop_skipped(s->st, run->id, why);
            else
                rc = state_run_transition(s->st, run->id, STATE_RUN_QUEUED, STATE_RUN_SKIPPED,
                                          -1, why);
            KILN_INFO("run %lld skipped: %s", (long long)run->id, why ? why : "no new data");
            free(why);
            rc = rc == KILN_ESTATE ? 0 : rc;
            goto out;
        }
        free(wait.first);
    }
    rc = state_run_transition(s->st, run->id, STATE_RUN_QUEUED, STATE_RUN_LAUNCHING, -1, NULL);
    if (rc == KILN_ESTATE) { /* canceled meanwhile, or another kilnd took it */
        rc = 0;
        goto out;
    }
    KILN_CHECK_GOTO(rc, rc, out);
    launching = true;

    run_dir = kiln_asprintf("%s/runs/%lld", s->home, (long long)run->id);
    if (run_dir == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(kiln_mkdir_p(run_dir), rc, out);
    KILN_CHECK_GOTO(run_write_text(run_dir, RUN_FILE_SPEC, spec_yaml), rc, out);
    char inputs_path[4096] = "", spec_path[4096];
    snprintf(spec_path, sizeof spec_path, "%s/%s", run_dir, RUN_FILE_SPEC);
    if (spec->data.incremental)
        KILN_CHECK_GOTO(write_inputs(s, run, run_dir, ins, nins, inputs_path, sizeof inputs_path),
                        rc, out);
    const sched_launcher_t *l = sched_launcher_for(spec->resources.launcher);
    if (l == NULL) {
        rc = KILN_EINVAL;
        goto out;
    }
    hostfile = resolve(base, spec->resources.hostfile);
    if (run->trigger == STATE_TRIGGER_RETRY)
        resume = retry_checkpoint(s, run->retry_of);
    sched_launch_ctx_t ctx = {s->o.mpirun, s->trainer, spec, hostfile, spec_path, run_dir,
                              inputs_path[0] ? inputs_path : NULL, resume, s->db_path, run->id,
                              base};
    KILN_CHECK_GOTO(l->build_argv(&ctx, &argv), rc, out);

    /* The run's environment: who it is, and where its spec's relative paths
     * point (kiln-train honours RUN_ENV_SPEC_DIR). It is set in the
     * supervisor after fork, never in kilnd, whose push workers read the
     * environment meanwhile. */
    char env_id[64], env_attempt[64];
    if (base != NULL)
        env_dir = kiln_asprintf("%s=%s", RUN_ENV_SPEC_DIR, base);
    snprintf(env_id, sizeof env_id, "%s=%lld", RUN_ENV_RUN_ID, (long long)run->id);
    snprintf(env_attempt, sizeof env_attempt, "%s=%d", RUN_ENV_ATTEMPT, run->attempt);
    const char *env[] = {env_id, env_attempt, env_dir != NULL ? env_dir : RUN_ENV_SPEC_DIR, NULL};
    if (base != NULL && env_dir == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    /* The run directory is recorded before the supervisor starts: a kilnd
     * killed in between finds no supervisor.pid there and queues the run
     * again (never_started), and one killed later finds the pid file and
     * adopts it. */
    KILN_CHECK_GOTO(state_run_set_launch(s->st, run->id, run_dir, 0, s->host), rc, out);
    pid_t pid = 0;
    rc = sched_supervise_spawn_follow(run_dir, argv, env, s->o.grace_ms, l->follow,
                                      s->o.slurm_poll_ms, &pid);
    KILN_CHECK_GOTO(rc, rc, out);

    sched_active_t *a = sched_active_add(s);
    if (a == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    a->run_id = run->id;
    a->job_id = run->job_id;
    a->attempt = run->attempt;
    a->pid = pid;
    a->child = true;
    a->ranks = spec->resources.ranks;
    a->followed = l->follow != NULL;
    a->run_dir = run_dir;
    run_dir = NULL;
    a->started_ms = now_ms();
    a->deadline_ms = deadline_of(spec, a->started_ms);
    launching = false; /* from here on the supervisor's status decides */
    if (sched_watch(s, a) < 0)
        KILN_WARN("run %lld: %s; its end is noticed on SIGCHLD only", (long long)run->id,
                  kiln_errmsg());
    if (state_run_set_launch(s->st, a->run_id, a->run_dir, pid, s->host) < 0 ||
        state_run_transition(s->st, a->run_id, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, -1,
                             NULL) < 0)
        KILN_WARN("run %lld: %s", (long long)a->run_id, kiln_errmsg());
    KILN_INFO("run %lld of job %s launched: %d rank%s, supervisor %d, %s", (long long)a->run_id,
              job->row.name, a->ranks, a->ranks == 1 ? "" : "s", (int)pid, a->run_dir);
out:
    if (rc < 0 && launching) {
        char *err = kiln_asprintf("launch failed: %s", kiln_errmsg());
        sched_fail_run(s, run->id, STATE_RUN_LAUNCHING, run->attempt, spec, rc != KILN_EINVAL,
                       -1, err ? err : "launch failed");
        free(err);
        rc = 0;
    }
    sched_argv_free(argv);
    state_inputs_free(ins, nins);
    KILN_FREE_ALL(hostfile, resume, run_dir, base, env_dir);
    if (own_spec)
        job_spec_fini(&queued_spec);
    free(queued_yaml);
    return rc;
}

/* ---- stop ------------------------------------------------------------------------------ */

static const char *stop_name(sched_stop_t why)
{
    switch (why) {
    case STOP_CANCELED:
        return RUN_STOP_CANCELED;
    case STOP_TIMED_OUT:
        return RUN_STOP_TIMED_OUT;
    case STOP_REPLACED:
        return RUN_STOP_REPLACED;
    default:
        return "";
    }
}

void sched_stop(sched_t *s, sched_active_t *a, sched_stop_t why, int64_t now)
{
    if (a->stop != STOP_NONE || a->end_retry_ms > 0) /* stopping, or ended */
        return;
    a->stop = why;
    /* A followed run's supervisor waits for the scheduler (scancel, KillWait). */
    a->backstop_ms = a->followed ? 0 : now + s->o.grace_ms + 10000;
    KILN_INFO("run %lld: stopping (%s): SIGTERM, SIGKILL after %lld ms", (long long)a->run_id,
              stop_name(why), (long long)s->o.grace_ms);
    if (sched_stop_request(a->run_dir, a->pid, stop_name(why)) < 0)
        KILN_WARN("run %lld: %s", (long long)a->run_id, kiln_errmsg());
}

/* ---- progress as metrics ----------------------------------------------------------------- */

void sched_import_progress(sched_t *s, sched_active_t *a)
{
    char *path = run_path(a->run_dir, RUN_FILE_PROGRESS);
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    free(path);
    if (f == NULL)
        return;
    if (fseek(f, (long)a->progress_off, SEEK_SET) == 0) {
        char line[2048];
        while (fgets(line, sizeof line, f) != NULL) {
            size_t len = strlen(line);
            if (len == 0 || line[len - 1] != '\n')
                break; /* a line still being written: next time */
            a->progress_off += (int64_t)len;
            run_progress_t p;
            if (run_progress_parse(line, &p) < 0 || p.kind != RUN_REC_STEP)
                continue;
            state_metric_add(s->st, a->run_id, p.step, RUN_FIG_LOSS, p.loss);
            state_metric_add(s->st, a->run_id, p.step, RUN_FIG_SAMPLES_PER_S, p.samples_per_s);
        }
    }
    fclose(f);
    sched_slurm_import(s, a);
}

/* The result of a run that ended, as metrics (the figures of its page). */
static void import_result(sched_t *s, sched_active_t *a, run_result_t *res)
{
    if (run_result_read(a->run_dir, res) < 0)
        return;
    const struct {
        const char *name;
        double v;
    } figs[] = {{RUN_FIG_EVAL_LOGLOSS, res->eval_logloss},
                {RUN_FIG_EVAL_AUC, res->eval_auc},
                {RUN_FIG_SAMPLES_PER_S, res->samples_per_s},
                {RUN_FIG_TRAIN_SECONDS, res->train_seconds}};
    for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++)
        if (!isnan(figs[i].v))
            state_metric_add(s->st, a->run_id, res->steps, figs[i].name, figs[i].v);
}

/* An online export of a running run (kiln-train records it in the database
 * as it writes it): queue its pushes, once, superseding the pushes of an
 * older export that have not gone out. */
void sched_scan_exports(sched_t *s, sched_active_t *a)
{
    sched_job_t *job = sched_job_find(s, a->job_id);
    if (job == NULL || !job->spec_ok || job->spec.push.nendpoints == 0)
        return;
    state_checkpoint_t c = {0};
    if (state_checkpoint_newest_of_run(s->st, a->run_id, true, &c) < 0)
        return;
    if (c.id > a->export_seen) {
        a->export_seen = c.id;
        int n = 0;
        if (ops_after_export(s->st, a->run_id, &job->spec, c.id, &n) < 0)
            KILN_WARN("run %lld: the pushes of export %s were not queued: %s",
                      (long long)a->run_id, c.uid, kiln_errmsg());
        else if (n > 0) {
            KILN_INFO("run %lld: online export %s queued for %d endpoint%s", (long long)a->run_id,
                      c.uid, n, n == 1 ? "" : "s");
            sched_pusher_kick(s);
        }
    }
    state_checkpoint_fini(&c);
}

/* ---- the end of a run -------------------------------------------------------------------- */

void sched_finish(sched_t *s, sched_active_t *a)
{
    if (a->child) {
        int st;
        waitpid(a->pid, &st, WNOHANG);
    }
    if (sched_slurm_readopt(s, a)) /* its Slurm job runs on: follow it again */
        return;
    sched_import_progress(s, a);
    sched_scan_exports(s, a);
    run_result_t res = {0};
    if (!a->result_imported)
        import_result(s, a, &res);
    else if (run_result_read(a->run_dir, &res) < 0)
        kiln_errclear();
    a->result_imported = true;
    sched_job_t *job = sched_job_find(s, a->job_id);
    const job_spec_t *spec = job != NULL && job->spec_ok ? &job->spec : NULL;

    run_status_t stat;
    int src = run_status_read(a->run_dir, &stat);
    state_run_state_t to = STATE_RUN_FAILED;
    char *error = NULL;
    bool retryable = false;
    int code = src == 0 ? stat.exit_code : -1;
    sched_stop_t stop = a->stop;
    if (src == 0 && stop == STOP_NONE) /* a stop asked by a kilnd before a restart */
        stop = strcmp(stat.stop, RUN_STOP_CANCELED) == 0    ? STOP_CANCELED
               : strcmp(stat.stop, RUN_STOP_TIMED_OUT) == 0 ? STOP_TIMED_OUT
               : strcmp(stat.stop, RUN_STOP_REPLACED) == 0  ? STOP_REPLACED
                                                            : STOP_NONE;
    /* A followed run (slurm) succeeded only when its scheduler says so. */
    bool followed = src == 0 && stat.job_state[0] != '\0';
    if (src == 0 && stat.exit_code == 0 && stat.signal == 0 &&
        (!followed || strcmp(stat.job_state, "COMPLETED") == 0)) {
        to = STATE_RUN_SUCCEEDED;
    } else if (followed && stop == STOP_NONE) {
        sched_slurm_outcome(a->run_dir, &stat, spec, &to, &error, &retryable);
    } else if (stop == STOP_CANCELED) {
        to = STATE_RUN_CANCELED;
        error = kiln_strdup("canceled on request");
    } else if (stop == STOP_REPLACED) {
        to = STATE_RUN_CANCELED;
        error = kiln_asprintf("replaced by a newer run (concurrency: replace)");
    } else if (stop == STOP_TIMED_OUT) {
        char d[32] = "?";
        if (spec != NULL)
            kiln_duration_format(spec->resources.timeout_ms, d, sizeof d);
        to = STATE_RUN_TIMED_OUT;
        error = kiln_asprintf("timed out after %s (resources.timeout)", d);
    } else if (src < 0) {
        error = kiln_asprintf("lost: the supervisor (pid %d) ended without writing %s/%s",
                              (int)a->pid, a->run_dir, RUN_FILE_STATUS);
        retryable = true;
    } else {
        error = sched_failure_reason(a->run_dir, &stat);
        /* kiln-train says a retry may help, or a rank or mpirun was killed;
         * bad input and bugs are not retried (run/run.h). */
        retryable = run_exit_retryable(stat.exit_code, stat.signal);
    }
    int rc;
    /* When the run ended, as its supervisor wrote it: for a run that ended
     * while kilnd was down, that is not now. */
    int64_t ended_at = src == 0 && stat.ended_at > 0 ? stat.ended_at : 0;
    if (to == STATE_RUN_FAILED) {
        rc = fail_run_at(s, a->run_id, STATE_RUN_RUNNING, a->attempt, spec, retryable, code,
                         error ? error : "failed", ended_at);
    } else if (to == STATE_RUN_SUCCEEDED) {
        /* The pushes export.on_success asks for commit with the success. */
        int n = 0;
        rc = ops_run_succeeded(s->st, a->run_id, spec, res.checkpoint, code, ended_at, &n);
        if (rc < 0)
            KILN_WARN("run %lld: cannot record its end: %s", (long long)a->run_id, kiln_errmsg());
        else if (n > 0) {
            KILN_INFO("run %lld succeeded; checkpoint %s queued for %d endpoint%s",
                      (long long)a->run_id, res.checkpoint, n, n == 1 ? "" : "s");
            sched_pusher_kick(s);
        } else
            KILN_INFO("run %lld succeeded", (long long)a->run_id);
    } else {
        rc = state_run_end_at(s->st, a->run_id, STATE_RUN_RUNNING, to, code, error, ended_at, -1,
                              NULL);
        if (rc == KILN_ESTATE)
            rc = state_run_end_at(s->st, a->run_id, STATE_RUN_LAUNCHING, to, code, error, ended_at,
                                  -1, NULL);
        if (rc < 0)
            KILN_WARN("run %lld: cannot record its end: %s", (long long)a->run_id, kiln_errmsg());
        else
            KILN_INFO("run %lld %s%s%s", (long long)a->run_id, state_run_state_name(to),
                      error ? ": " : "", error ? error : "");
    }
    free(error);
    if (rc < 0 && rc != KILN_ESTATE) {
        /* The database refused the record (a full disk, say): the run stays
         * active, its supervisor no longer watched, and its end is recorded
         * again at a later tick until it is (sched_finish_due). */
        sched_unwatch(s, a);
        a->child = false; /* reaped above */
        a->end_tries++;
        int64_t wait = a->end_tries < 5 ? 1000LL << (a->end_tries - 1) : 30000;
        a->end_retry_ms = now_ms() + (wait < 30000 ? wait : 30000);
        KILN_WARN("run %lld: its end is recorded again in %lld ms (try %d)", (long long)a->run_id,
                  (long long)(a->end_retry_ms - now_ms()), a->end_tries + 1);
        return;
    }
    if (a->end_tries > 0)
        KILN_INFO("run %lld: its end is recorded (try %d)", (long long)a->run_id,
                  a->end_tries + 1);
    sched_active_remove(s, a);
    s->dirty = true;
}

int64_t sched_finish_due(sched_t *s, int64_t now)
{
    int64_t next = 0;
    for (size_t i = s->nact; i-- > 0;) { /* sched_finish may remove act[i] */
        sched_active_t *a = &s->act[i];
        if (a->end_retry_ms <= 0)
            continue;
        if (now >= a->end_retry_ms)
            sched_finish(s, a);
        else if (next == 0 || a->end_retry_ms < next)
            next = a->end_retry_ms;
    }
    return next;
}

/* ---- recovery ------------------------------------------------------------------------------ */

/* Whether a run kilnd left in launching never got a supervisor: no run
 * directory recorded, or one with no supervisor.pid and no status while no
 * process group was recorded. A supervisor writes its pid file first thing,
 * so one forked just before kilnd died gets a second to show itself. */
static bool never_started(const state_run_t *r)
{
    if (r->state != STATE_RUN_LAUNCHING)
        return false;
    if (r->run_dir == NULL)
        return true;
    if (r->pgid > 0)
        return false;
    for (int i = 0; i < 20; i++) {
        pid_t pid = 0;
        uint64_t start = 0;
        run_status_t stat;
        if (run_pidfile_read(r->run_dir, RUN_FILE_SUPERVISOR, &pid, &start) == 0 ||
            run_status_read(r->run_dir, &stat) == 0)
            return false;
        kiln_errclear();
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return true;
}

static void recover_one(sched_t *s, const state_run_t *r)
{
    sched_job_t *job = sched_job_find(s, r->job_id);
    const job_spec_t *spec = job != NULL && job->spec_ok ? &job->spec : NULL;
    if (r->host != NULL && strcmp(r->host, s->host) != 0) {
        KILN_INFO("run %lld runs on %s, not here; leaving it to that host's kilnd",
                  (long long)r->id, r->host);
        return;
    }
    if (never_started(r)) {
        /* Nothing of it ran: it goes back in the queue as the same attempt. */
        if (state_run_requeue(s->st, r->id, "kilnd stopped before its supervisor started") == 0) {
            KILN_INFO("run %lld: kilnd stopped before it started; queued again", (long long)r->id);
            return;
        }
        KILN_WARN("run %lld: %s", (long long)r->id, kiln_errmsg());
    }
    if (r->run_dir == NULL) {
        sched_fail_run(s, r->id, r->state, r->attempt, spec, true, -1,
                       "lost: kilnd stopped while launching it");
        return;
    }
    sched_active_t *a = sched_active_add(s);
    if (a == NULL)
        return;
    a->run_id = r->id;
    a->job_id = r->job_id;
    a->attempt = r->attempt;
    a->run_dir = kiln_strdup(r->run_dir);
    a->ranks = spec ? spec->resources.ranks : 1;
    a->followed = spec && spec->resources.launcher == JOB_LAUNCH_SLURM;
    a->started_ms = r->started_at > 0 ? r->started_at * 1000 : now_ms();
    a->deadline_ms = deadline_of(spec, a->started_ms);
    run_status_t stat;
    pid_t pid = 0;
    uint64_t start = 0;
    if (run_status_read(a->run_dir, &stat) < 0 &&
        run_pidfile_read(a->run_dir, RUN_FILE_SUPERVISOR, &pid, &start) == 0 &&
        kiln_pid_alive(pid, start)) {
        a->pid = pid;
        a->child = false;
        if (sched_watch(s, a) == 0) {
            /* The run's events say so too (kiln show, the run page), not only
             * kilnd's log. */
            char msg[160];
            snprintf(msg, sizeof msg, "adopted by kilnd %d after its restart: supervisor %d "
                     "still running", (int)getpid(), (int)pid);
            state_event_add(s->st, r->job_id, r->id, "adopted", msg);
            KILN_INFO("run %lld adopted: supervisor %d still running", (long long)r->id,
                      (int)pid);
            return;
        }
    }
    a->pid = pid;
    if (r->state == STATE_RUN_LAUNCHING)
        state_run_transition(s->st, r->id, STATE_RUN_LAUNCHING, STATE_RUN_RUNNING, -1, NULL);
    if (sched_slurm_readopt(s, a)) /* a Slurm job whose supervisor died too */
        return;
    KILN_INFO("run %lld ended while kilnd was away; recording its outcome", (long long)r->id);
    sched_finish(s, a);
}

int sched_recover(sched_t *s)
{
    state_run_state_t states[] = {STATE_RUN_LAUNCHING, STATE_RUN_RUNNING};
    for (size_t k = 0; k < 2; k++) {
        state_run_t *rs = NULL;
        size_t n = 0;
        KILN_CHECK(state_run_list_in_state(s->st, states[k], &rs, &n));
        for (size_t i = 0; i < n; i++)
            recover_one(s, &rs[i]);
        state_runs_free(rs, n);
    }
    return 0;
}
