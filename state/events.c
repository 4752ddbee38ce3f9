/*
 * state/events.c - the events table, an append-only audit log. Other files
 * append inside their own transactions (state_event_insert) so that a state
 * change and its event commit together; callers outside state/ add free-form
 * events with state_event_add and read a run's or a job's log back.
 */
#include "state_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int state_event_insert(state_t *st, int64_t job_id, int64_t run_id, const char *kind,
                       const char *fmt, ...)
{
    sqlite3_stmt *s = NULL;
    char *msg = NULL;
    int rc;
    const char *what = "recording an event";
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len < 0)
        return kiln_errf(KILN_EINVAL, "bad event message format '%s'", fmt);
    msg = kiln_malloc((size_t)len + 1);
    if (msg == NULL)
        return KILN_ENOMEM;
    va_start(ap, fmt);
    vsnprintf(msg, (size_t)len + 1, fmt, ap);
    va_end(ap);

    if (job_id == 0 && run_id != 0) {
        KILN_CHECK_GOTO(state_stmt(st, STMT_RUN_JOB_OF, &s), rc, out);
        KILN_CHECK_GOTO(state_bind(st, s, what, "I", run_id), rc, out);
        KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
        if (rc == 0) {
            rc = kiln_errf(KILN_ENOENT, "cannot record an event for run %lld: no such run",
                           (long long)run_id);
            goto out;
        }
        job_id = state_col_i64(s, 0);
        state_stmt_done(s);
    }
    KILN_CHECK_GOTO(state_stmt(st, STMT_EVENT_INSERT, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "JJItt", job_id, run_id, kiln_now_s(), kind, msg), rc,
                    out);
    rc = state_exec(st, s, what);
    if (rc < 0 && st->last_sqlite_rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        rc = kiln_errf(KILN_ENOENT,
                       "cannot record an event for job %lld / run %lld: no such "
                       "job or run",
                       (long long)job_id, (long long)run_id);
out:
    state_stmt_done(s);
    free(msg);
    return rc;
}

typedef struct {
    int64_t job_id, run_id;
    const char *kind, *message;
} event_add_t;

static int event_add_tx(state_t *st, const event_add_t *e)
{
    return state_event_insert(st, e->job_id, e->run_id, e->kind, "%s", e->message);
}

int state_event_add(state_t *st, int64_t job_id, int64_t run_id, const char *kind,
                    const char *message)
{
    if (kind == NULL || kind[0] == '\0')
        return kiln_errf(KILN_EINVAL, "an event needs a kind");
    event_add_t e = {job_id, run_id, kind, message != NULL ? message : ""};
    int rc;
    STATE_WRITE(st, "recording an event", rc, event_add_tx(st, &e));
    return rc;
}

void state_events_free(state_event_t *es, size_t n)
{
    for (size_t i = 0; es != NULL && i < n; i++) {
        free(es[i].kind);
        free(es[i].message);
    }
    free(es);
}

static int read_event(sqlite3_stmt *s, void *item)
{
    state_event_t *e = item;
    e->id = state_col_i64(s, 0);
    e->job_id = state_col_i64(s, 1);
    e->run_id = state_col_i64(s, 2);
    e->at = state_col_i64(s, 3);
    KILN_CHECK(state_col_str(s, 4, &e->kind));
    return state_col_str(s, 5, &e->message);
}

static int event_list_tx(state_t *st, int64_t job_id, int64_t run_id, state_event_t **out,
                         size_t *n)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "listing events";
    if (run_id > 0) {
        KILN_CHECK_GOTO(state_stmt(st, STMT_EVENT_LIST_RUN, &s), rc, out);
        KILN_CHECK_GOTO(state_bind(st, s, what, "I", run_id), rc, out);
    } else if (job_id > 0) {
        KILN_CHECK_GOTO(state_stmt(st, STMT_EVENT_LIST_JOB, &s), rc, out);
        KILN_CHECK_GOTO(state_bind(st, s, what, "I", job_id), rc, out);
    } else {
        KILN_CHECK_GOTO(state_stmt(st, STMT_EVENT_LIST_ALL, &s), rc, out);
    }
    rc = state_collect(st, s, what, sizeof **out, read_event, (void **)out, n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        state_events_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_event_list(state_t *st, int64_t job_id, int64_t run_id, state_event_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    STATE_READ(st, "listing events", rc, event_list_tx(st, job_id, run_id, out, n));
    return rc;
}
