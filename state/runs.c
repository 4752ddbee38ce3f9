/*
 * state/runs.c - the runs table and the run state machine. Creating a run
 * (where the partial unique index runs_scheduled_once makes a cron time run
 * once), reading runs, and every state change: a compare-and-set inside BEGIN
 * IMMEDIATE that refuses edges the machine lacks and never leaves a terminal
 * state, with an event recorded for each change and each cancel request.
 */
#include "state_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Legal edges of the run state machine: edges[from] has bit `to` set. */
#define BIT(s) (1u << (s))
static const unsigned edges[STATE_RUN_NSTATES] = {
    [STATE_RUN_QUEUED] = BIT(STATE_RUN_LAUNCHING) | BIT(STATE_RUN_CANCELED) |
                         BIT(STATE_RUN_SKIPPED) | BIT(STATE_RUN_FAILED),
    [STATE_RUN_LAUNCHING] = BIT(STATE_RUN_RUNNING) | BIT(STATE_RUN_SUCCEEDED) |
                            BIT(STATE_RUN_FAILED) | BIT(STATE_RUN_CANCELED) |
                            BIT(STATE_RUN_TIMED_OUT),
    [STATE_RUN_RUNNING] = BIT(STATE_RUN_SUCCEEDED) | BIT(STATE_RUN_FAILED) |
                          BIT(STATE_RUN_CANCELED) | BIT(STATE_RUN_TIMED_OUT),
};

static int parse_trigger(const char *s, state_trigger_t *out)
{
    for (int t = STATE_TRIGGER_MANUAL; t <= STATE_TRIGGER_CATCHUP; t++) {
        if (s != NULL && strcmp(s, state_trigger_name((state_trigger_t)t)) == 0) {
            *out = (state_trigger_t)t;
            return 0;
        }
    }
    return kiln_errf(KILN_ECORRUPT, "unknown run trigger '%s' in the database",
                     s != NULL ? s : "(null)");
}

/* The run's state and trigger, stored by name (columns 4 and 5). */
static int read_run_names(sqlite3_stmt *s, void *row)
{
    state_run_t *r = row;
    const char *state = (const char *)sqlite3_column_text(s, 4);
    if (state_run_state_parse(state, &r->state) < 0)
        return kiln_errf(KILN_ECORRUPT, "run %lld has unknown state '%s' in the database",
                         (long long)r->id, state != NULL ? state : "(null)");
    return parse_trigger((const char *)sqlite3_column_text(s, 5), &r->trigger);
}

/* A row of STATE_RUN_COLS. */
static const state_col_t run_cols[] = {
    STATE_COL(state_run_t, id),
    STATE_COL(state_run_t, job_id),
    STATE_COL(state_run_t, job_name),
    STATE_COL(state_run_t, job_version),
    STATE_COL_SKIPPED, /* state */
    STATE_COL_SKIPPED, /* trigger */
    STATE_COL(state_run_t, attempt),
    STATE_COL(state_run_t, retry_of),
    STATE_COL(state_run_t, scheduled_at),
    STATE_COL(state_run_t, queued_at),
    STATE_COL(state_run_t, started_at),
    STATE_COL(state_run_t, ended_at),
    STATE_COL(state_run_t, not_before),
    STATE_COL(state_run_t, exit_code),
    STATE_COL(state_run_t, error),
    STATE_COL(state_run_t, run_dir),
    STATE_COL(state_run_t, pgid),
    STATE_COL(state_run_t, host),
    STATE_COL(state_run_t, cancel_requested),
    STATE_COL(state_run_t, spec_dir),
    STATE_COL(state_run_t, start_checkpoint_id),
};
const state_row_t state_run_row = STATE_ROW(state_run_t, run_cols, read_run_names);

void state_run_fini(state_run_t *r)
{
    state_row_fini(&state_run_row, r);
}

void state_runs_free(state_run_t *rs, size_t n)
{
    state_rows_free(&state_run_row, rs, n);
}

/* ---- create ------------------------------------------------------------------------ */

typedef struct {
    int64_t job_id;
    state_trigger_t trigger;
    int64_t scheduled_at;
    int attempt;
    int64_t retry_of;
    int64_t id;
} run_create_t;

/* After a UNIQUE violation: names the run that already serves the time. */
static int scheduled_exists(state_t *st, const run_create_t *c)
{
    int64_t other;
    char iso[KILN_ISO_LEN];
    state_row_query(st, STMT_RUN_FIND_SCHEDULED, "finding a scheduled run", &state_i64_row, &other,
                    "II", c->job_id, c->scheduled_at);
    return kiln_errf(KILN_EEXIST, "job %lld already has run %lld for the scheduled time %s",
                     (long long)c->job_id, (long long)other,
                     kiln_time_iso(c->scheduled_at, iso, sizeof iso));
}

static int run_create_tx(state_t *st, run_create_t *c)
{
    int64_t version;
    const char *what = "queuing a run";
    char iso[KILN_ISO_LEN] = "";

    int rc =
        state_row_query(st, STMT_JOB_VERSION_OF, what, &state_i64_row, &version, "I", c->job_id);
    KILN_CHECK(state_found(rc, "cannot queue a run: no job with id %lld", (long long)c->job_id));
    rc = state_insert(st, STMT_RUN_INSERT, what, &c->id, "IitiJII", c->job_id, (int)version,
                      state_trigger_name(c->trigger), c->attempt, c->retry_of, c->scheduled_at,
                      kiln_now_s());
    if (rc < 0) {
        if (st->last_sqlite_rc == SQLITE_CONSTRAINT_UNIQUE)
            rc = scheduled_exists(st, c);
        else if (st->last_sqlite_rc == SQLITE_CONSTRAINT_FOREIGNKEY)
            rc = kiln_errf(KILN_ENOENT, "cannot queue a retry of run %lld: no such run",
                           (long long)c->retry_of);
        return rc;
    }
    if (c->scheduled_at != 0)
        kiln_time_iso(c->scheduled_at, iso, sizeof iso);
    return state_event_insert(st, c->job_id, c->id, "state", "queued (%s, attempt %d%s%s)",
                              state_trigger_name(c->trigger), c->attempt,
                              iso[0] != '\0' ? ", scheduled " : "", iso);
}

int state_run_create_tx(state_t *st, int64_t job_id, state_trigger_t trigger,
                        int64_t scheduled_at, int attempt, int64_t retry_of, int64_t *run_id)
{
    run_create_t c = {job_id, trigger, scheduled_at, attempt, retry_of, 0};
    KILN_CHECK(run_create_tx(st, &c));
    *run_id = c.id;
    return 0;
}

int state_run_create(state_t *st, int64_t job_id, state_trigger_t trigger, int64_t scheduled_at,
                     int attempt, int64_t retry_of, int64_t *run_id)
{
    if ((int)trigger < STATE_TRIGGER_MANUAL || trigger > STATE_TRIGGER_CATCHUP)
        return kiln_errf(KILN_EINVAL, "unknown run trigger %d", (int)trigger);
    if (attempt < 1)
        return kiln_errf(KILN_EINVAL, "run attempt must be 1 or more, not %d", attempt);
    if (scheduled_at < 0)
        return kiln_errf(KILN_EINVAL, "scheduled time %lld is negative", (long long)scheduled_at);
    run_create_t c = {job_id, trigger, scheduled_at, attempt, retry_of, 0};
    int rc;
    STATE_WRITE(st, "queuing a run", rc, run_create_tx(st, &c));
    if (rc < 0)
        return rc;
    *run_id = c.id;
    return 0;
}

/* ---- read ------------------------------------------------------------------------- */

static int run_get_tx(state_t *st, int64_t run_id, state_run_t *out)
{
    int rc = state_row_query(st, STMT_RUN_GET, "reading a run", &state_run_row, out, "I", run_id);
    return state_found(rc, "no run %lld; see kiln runs", (long long)run_id);
}

int state_run_get(state_t *st, int64_t run_id, state_run_t *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    STATE_READ(st, "reading a run", rc, run_get_tx(st, run_id, out));
    return rc;
}

static int run_list_tx(state_t *st, const char *job_name, int limit, state_run_t **out, size_t *n)
{
    int64_t lim = limit > 0 ? limit : -1, job_id;
    const char *what = "listing runs";
    if (job_name == NULL)
        return state_rows_query(st, STMT_RUN_LIST_ALL, what, &state_run_row, (void **)out, n, "I",
                                lim);
    int rc = state_row_query(st, STMT_JOB_FIND, what, &state_i64_row, &job_id, "t", job_name);
    KILN_CHECK(state_found(rc, "no job named '%s'; see kiln jobs", job_name));
    return state_rows_query(st, STMT_RUN_LIST_JOB, what, &state_run_row, (void **)out, n, "II",
                            job_id, lim);
}

int state_run_list(state_t *st, const char *job_name, int limit, state_run_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    STATE_READ(st, "listing runs", rc, run_list_tx(st, job_name, limit, out, n));
    return rc;
}

int state_run_list_in_state(state_t *st, state_run_state_t s, state_run_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if ((int)s < 0 || s >= STATE_RUN_NSTATES)
        return kiln_errf(KILN_EINVAL, "unknown run state %d", (int)s);
    return state_rows_list(st, STMT_RUN_LIST_STATE, "listing runs", &state_run_row, (void **)out, n,
                           "t", state_run_state_name(s));
}

/* ---- state changes ---------------------------------------------------------------- */

/* Reads a run's state, its job and its cancel flag (inside a transaction). */
static int run_state_of(state_t *st, int64_t run_id, state_run_state_t *state, int64_t *job_id,
                        bool *cancel_requested)
{
    sqlite3_stmt *s = NULL;
    int rc = state_first_row(st, STMT_RUN_STATE_OF, "reading a run's state", &s, "I", run_id);
    KILN_CHECK_GOTO(state_found(rc, "no run %lld; see kiln runs", (long long)run_id), rc, out);
    const char *name = (const char *)sqlite3_column_text(s, 0);
    if (state_run_state_parse(name, state) < 0) {
        rc = kiln_errf(KILN_ECORRUPT, "run %lld has unknown state '%s' in the database",
                       (long long)run_id, name != NULL ? name : "(null)");
        goto out;
    }
    *job_id = state_col_i64(s, 1);
    *cancel_requested = sqlite3_column_int(s, 2) != 0;
out:
    state_stmt_done(s);
    return rc;
}

/* Sets the state and the times and exit that come with it; the caller has
 * checked the edge. ended_at > 0: when a terminal run really ended (else now). */
static int set_state(state_t *st, int64_t run_id, state_run_state_t from, state_run_state_t to,
                     int exit_code, const char *error, int64_t ended_at)
{
    int64_t now = kiln_now_s();
    const char *what = "changing a run's state";
    int rc = state_update(st, STMT_RUN_SET_STATE, what, "Itt", run_id, state_run_state_name(from),
                          state_run_state_name(to));
    if (rc < 0)
        return rc;
    if (rc != 1)
        return kiln_errf(KILN_EINTERNAL, "run %lld left %s under our write lock", (long long)run_id,
                         state_run_state_name(from));
    if (to == STATE_RUN_RUNNING)
        KILN_CHECK(state_update(st, STMT_RUN_SET_STARTED, what, "II", run_id, now));
    if (state_run_state_terminal(to))
        KILN_CHECK(state_update(st, STMT_RUN_SET_ENDED, what, "IIit", run_id,
                                ended_at > 0 ? ended_at : now, exit_code, error));
    return 0;
}

static int refuse(int64_t run_id, state_run_state_t actual, state_run_state_t from,
                  state_run_state_t to)
{
    if (state_run_state_terminal(actual))
        return kiln_errf(KILN_ESTATE, "run %lld already %s", (long long)run_id,
                         state_run_state_name(actual));
    if (actual != from)
        return kiln_errf(KILN_ESTATE, "run %lld is %s, not %s", (long long)run_id,
                         state_run_state_name(actual), state_run_state_name(from));
    return kiln_errf(KILN_ESTATE, "run %lld cannot go from %s to %s", (long long)run_id,
                     state_run_state_name(from), state_run_state_name(to));
}

typedef struct {
    int64_t run_id;
    state_run_state_t from, to;
    int exit_code;
    const char *error;
    int64_t ended_at; /* 0: now */
} transition_t;

static int transition_tx(state_t *st, const transition_t *t)
{
    state_run_state_t actual;
    int64_t job_id;
    bool cancel;
    char detail[64] = "";
    KILN_CHECK(run_state_of(st, t->run_id, &actual, &job_id, &cancel));
    if (actual != t->from || (edges[t->from] & BIT(t->to)) == 0)
        return refuse(t->run_id, actual, t->from, t->to);
    KILN_CHECK(set_state(st, t->run_id, t->from, t->to, t->exit_code, t->error, t->ended_at));
    if (state_run_state_terminal(t->to) && t->exit_code >= 0)
        snprintf(detail, sizeof detail, " (exit %d)", t->exit_code);
    return state_event_insert(st, job_id, t->run_id, "state", "%s -> %s%s%s%s",
                              state_run_state_name(t->from), state_run_state_name(t->to), detail,
                              t->error != NULL ? ": " : "", t->error != NULL ? t->error : "");
}

/* 0 with the run's job and cancel flag when run_id is in `from`; else what
 * refuse says about the move to `to`. */
static int expect_state(state_t *st, int64_t run_id, state_run_state_t from, state_run_state_t to,
                        int64_t *job_id /* OUT */, bool *cancel /* OUT */)
{
    state_run_state_t actual;
    KILN_CHECK(run_state_of(st, run_id, &actual, job_id, cancel));
    return actual == from ? 0 : refuse(run_id, actual, from, to);
}

static int requeue_tx(state_t *st, int64_t run_id, const char *why)
{
    int64_t job_id;
    bool cancel;
    KILN_CHECK(expect_state(st, run_id, STATE_RUN_LAUNCHING, STATE_RUN_QUEUED, &job_id, &cancel));
    if (cancel) { /* asked to stop before it started: it ends here */
        KILN_CHECK(set_state(st, run_id, STATE_RUN_LAUNCHING, STATE_RUN_CANCELED, -1, NULL, 0));
        return state_event_insert(st, job_id, run_id, "state", "launching -> canceled: %s", why);
    }
    const char *what = "putting a run back in the queue";
    KILN_CHECK(state_update(st, STMT_RUN_SET_STATE, what, "Itt", run_id,
                            state_run_state_name(STATE_RUN_LAUNCHING),
                            state_run_state_name(STATE_RUN_QUEUED)));
    KILN_CHECK(state_update(st, STMT_RUN_CLEAR_LAUNCH, what, "I", run_id));
    KILN_CHECK(state_update(st, STMT_INPUT_DELETE_RUN, what, "I", run_id));
    return state_event_insert(st, job_id, run_id, "state", "launching -> queued: %s", why);
}

int state_run_requeue(state_t *st, int64_t run_id, const char *why)
{
    int rc;
    STATE_WRITE(st, "putting a run back in the queue", rc, requeue_tx(st, run_id, why));
    return rc;
}

int state_run_transition(state_t *st, int64_t run_id, state_run_state_t from, state_run_state_t to,
                         int exit_code, const char *error)
{
    if ((int)from < 0 || from >= STATE_RUN_NSTATES || (int)to < 0 || to >= STATE_RUN_NSTATES)
        return kiln_errf(KILN_EINVAL, "unknown run state %d or %d", (int)from, (int)to);
    transition_t t = {run_id, from, to, exit_code, error, 0};
    int rc;
    STATE_WRITE(st, "changing a run's state", rc, transition_tx(st, &t));
    return rc;
}

int state_run_cancel_tx(state_t *st, int64_t run_id, bool *done)
{
    state_run_state_t actual;
    int64_t job_id;
    bool already;
    KILN_CHECK(run_state_of(st, run_id, &actual, &job_id, &already));
    if (state_run_state_terminal(actual))
        return kiln_errf(KILN_ESTATE, "run %lld already %s", (long long)run_id,
                         state_run_state_name(actual));
    if (actual == STATE_RUN_QUEUED) {
        KILN_CHECK(
            state_event_insert(st, job_id, run_id, "cancel", "cancel requested while queued"));
        KILN_CHECK(set_state(st, run_id, actual, STATE_RUN_CANCELED, -1, NULL, 0));
        *done = true;
        return state_event_insert(st, job_id, run_id, "state", "queued -> canceled");
    }
    *done = false;
    if (already)
        return 0;
    KILN_CHECK(state_update(st, STMT_RUN_SET_CANCEL, "requesting cancel", "I", run_id));
    return state_event_insert(st, job_id, run_id, "cancel", "cancel requested while %s",
                              state_run_state_name(actual));
}

int state_run_request_cancel(state_t *st, int64_t run_id, bool *done)
{
    bool d = false;
    int rc;
    STATE_WRITE(st, "canceling a run", rc, state_run_cancel_tx(st, run_id, &d));
    if (rc == 0 && done != NULL)
        *done = d;
    return rc;
}

/* ---- a skipped cron fire, retention -------------------------------------------------- */

/* A fire with nothing new to train on updates its job (last checked, the
 * count of skipped fires) instead of adding a run (issue 26). It lives with
 * the runs it replaces, so that jobs.c (which creates and cancels runs) and
 * runs.c do not call each other. */
int state_job_skip_tx(state_t *st, int64_t job_id, int64_t at, const char *why)
{
    int rc = state_update(st, STMT_JOB_SKIP, "counting a skipped fire", "IIt", job_id, at, why);
    return state_found(rc, "no job with id %lld", (long long)job_id);
}

int state_job_skip(state_t *st, int64_t job_id, int64_t at, const char *why)
{
    int rc;
    STATE_WRITE(st, "counting a skipped fire", rc, state_job_skip_tx(st, job_id, at, why));
    return rc;
}

static int drop_skipped_tx(state_t *st, int64_t run_id, const char *why)
{
    int64_t job_id;
    bool cancel;
    KILN_CHECK(expect_state(st, run_id, STATE_RUN_QUEUED, STATE_RUN_SKIPPED, &job_id, &cancel));
    KILN_CHECK(state_update(st, STMT_RUN_DELETE, "dropping a skipped run", "I", run_id));
    return state_job_skip_tx(st, job_id, kiln_now_s(), why);
}

int state_run_drop_skipped(state_t *st, int64_t run_id, const char *why)
{
    int rc;
    STATE_WRITE(st, "dropping a skipped run", rc, drop_skipped_tx(st, run_id, why));
    return rc;
}

/* ---- launch details ---------------------------------------------------------------- */

typedef struct {
    int64_t run_id;
    const char *run_dir;
    int64_t pgid;
    const char *host;
} launch_t;

static int set_launch_tx(state_t *st, const launch_t *l)
{
    int rc = state_update(st, STMT_RUN_SET_LAUNCH, "recording a launch", "ItIt", l->run_id,
                          l->run_dir, l->pgid, l->host);
    KILN_CHECK(state_found(rc, "no run %lld", (long long)l->run_id));
    /* kilnd records the directory first (pgid 0) and the process group once
     * the supervisor runs: only the second is the launch. */
    if (l->pgid <= 0)
        return 0;
    return state_event_insert(
        st, 0, l->run_id, "launch", "launched on %s, process group %lld, in %s",
        l->host != NULL ? l->host : "?", (long long)l->pgid, l->run_dir != NULL ? l->run_dir : "?");
}

int state_run_set_launch(state_t *st, int64_t run_id, const char *run_dir, int64_t pgid,
                         const char *host)
{
    launch_t l = {run_id, run_dir, pgid, host};
    int rc;
    STATE_WRITE(st, "recording a launch", rc, set_launch_tx(st, &l));
    return rc;
}

/* Sets one column of run run_id to value (stmt binds the two in that order,
 * as fmt says); a value that is no checkpoint's id is KILN_ENOENT. */
static int set_col_tx(state_t *st, state_stmt_id_t stmt, const char *what, const char *fmt,
                      int64_t run_id, int64_t value)
{
    int rc = state_update(st, stmt, what, fmt, run_id, value);
    if (rc < 0 && st->last_sqlite_rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        return kiln_errf(KILN_ENOENT, "no checkpoint with id %lld", (long long)value);
    return state_found(rc, "no run %lld", (long long)run_id);
}

static int set_col(state_t *st, state_stmt_id_t stmt, const char *what, const char *fmt,
                   int64_t run_id, int64_t value)
{
    int rc;
    STATE_WRITE(st, what, rc, set_col_tx(st, stmt, what, fmt, run_id, value));
    return rc;
}

int state_run_set_not_before(state_t *st, int64_t run_id, int64_t not_before)
{
    return set_col(st, STMT_RUN_SET_NOT_BEFORE, "setting a run's earliest start", "II", run_id,
                   not_before);
}

int state_run_set_start_checkpoint(state_t *st, int64_t run_id, int64_t checkpoint_id)
{
    return set_col(st, STMT_RUN_SET_START_CKPT, "recording the checkpoint a run started from",
                   "IJ", run_id, checkpoint_id);
}

/* ---- ending a run and queuing its retry (the scheduler) ---------------------------- */

typedef struct {
    transition_t t;
    int64_t not_before; /* < 0: no retry */
    int64_t retry_id;
} run_end_t;

static int run_end_tx(state_t *st, run_end_t *e)
{
    int64_t retry;
    e->retry_id = 0;
    KILN_CHECK(transition_tx(st, &e->t));
    if (e->not_before < 0)
        return 0;
    int rc = state_row_query(st, STMT_RUN_RETRY_OF, "queuing a retry", &state_i64_row, &retry, "I",
                             e->t.run_id);
    if (rc < 0)
        return rc;
    if (rc == 1)
        return kiln_errf(KILN_EEXIST, "run %lld was already retried by run %lld",
                         (long long)e->t.run_id, (long long)retry);
    state_run_t r;
    KILN_CHECK(run_get_tx(st, e->t.run_id, &r));
    run_create_t c = {r.job_id, STATE_TRIGGER_RETRY, r.scheduled_at, r.attempt + 1, r.id, 0};
    state_run_fini(&r);
    KILN_CHECK(run_create_tx(st, &c));
    KILN_CHECK(set_col_tx(st, STMT_RUN_SET_NOT_BEFORE, "setting a run's earliest start", "II", c.id,
                          e->not_before));
    e->retry_id = c.id;
    return 0;
}

typedef struct {
    transition_t t;
    const state_push_req_t *reqs;
    size_t n;
    int64_t *ids;
} run_succeed_t;

static int run_succeed_tx(state_t *st, run_succeed_t *x)
{
    int64_t job_id;
    KILN_CHECK(transition_tx(st, &x->t));
    if (x->n == 0)
        return 0;
    KILN_CHECK(state_row_query(st, STMT_RUN_JOB_OF, "queuing a run's pushes", &state_i64_row,
                               &job_id, "I", x->t.run_id));
    return state_push_enqueue_tx(st, job_id, x->t.run_id, x->reqs, x->n, NULL, 0, x->ids);
}

int state_run_succeed(state_t *st, int64_t run_id, state_run_state_t from, int exit_code,
                      int64_t ended_at, const state_push_req_t *pushes, size_t npushes,
                      int64_t *push_ids)
{
    run_succeed_t x = {{run_id, from, STATE_RUN_SUCCEEDED, exit_code, NULL, ended_at}, pushes,
                       npushes, push_ids};
    int rc;
    STATE_WRITE(st, "recording a run's success", rc, run_succeed_tx(st, &x));
    return rc;
}

int state_run_end_at(state_t *st, int64_t run_id, state_run_state_t from, state_run_state_t to,
                     int exit_code, const char *error, int64_t ended_at, int64_t retry_not_before,
                     int64_t *retry_id)
{
    if ((int)from < 0 || from >= STATE_RUN_NSTATES || (int)to < 0 || to >= STATE_RUN_NSTATES)
        return kiln_errf(KILN_EINVAL, "unknown run state %d or %d", (int)from, (int)to);
    run_end_t e = {{run_id, from, to, exit_code, error, ended_at}, retry_not_before, 0};
    int rc;
    STATE_WRITE(st, "ending a run", rc, run_end_tx(st, &e));
    if (retry_id != NULL)
        *retry_id = rc == 0 ? e.retry_id : 0;
    return rc;
}

int state_run_end(state_t *st, int64_t run_id, state_run_state_t from, state_run_state_t to,
                  int exit_code, const char *error, int64_t retry_not_before, int64_t *retry_id)
{
    return state_run_end_at(st, run_id, from, to, exit_code, error, 0, retry_not_before, retry_id);
}
