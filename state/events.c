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
    char *msg = NULL;
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

    int rc = 0;
    if (job_id == 0 && run_id != 0)
        rc = state_found(
            state_row_query(st, STMT_RUN_JOB_OF, what, &state_i64_row, &job_id, "I", run_id),
            "cannot record an event for run %lld: no such run", (long long)run_id);
    if (rc == 0) {
        rc = state_insert(st, STMT_EVENT_INSERT, what, NULL, "JJItt", job_id, run_id, kiln_now_s(),
                          kind, msg);
        if (rc < 0 && st->last_sqlite_rc == SQLITE_CONSTRAINT_FOREIGNKEY)
            rc = kiln_errf(KILN_ENOENT,
                           "cannot record an event for job %lld / run %lld: no such "
                           "job or run",
                           (long long)job_id, (long long)run_id);
    }
    free(msg);
    return rc;
}

int state_event_add(state_t *st, int64_t job_id, int64_t run_id, const char *kind,
                    const char *message)
{
    if (kind == NULL || kind[0] == '\0')
        return kiln_errf(KILN_EINVAL, "an event needs a kind");
    int rc;
    STATE_WRITE(st, "recording an event", rc,
                state_event_insert(st, job_id, run_id, kind, "%s", message != NULL ? message : ""));
    return rc;
}

/* A row of STATE_EVENT_COLS. */
static const state_col_t event_cols[] = {
    STATE_COL(state_event_t, id),     STATE_COL(state_event_t, job_id),
    STATE_COL(state_event_t, run_id), STATE_COL(state_event_t, at),
    STATE_COL(state_event_t, kind),   STATE_COL(state_event_t, message),
};
static const state_row_t event_row = STATE_ROW(state_event_t, event_cols, NULL);

void state_events_free(state_event_t *es, size_t n)
{
    state_rows_free(&event_row, es, n);
}

/* Events of a run, of a job, or all of them: one statement each. */
static int event_list_tx(state_t *st, int64_t job_id, int64_t run_id, state_event_t **out,
                         size_t *n)
{
    const char *what = "listing events";
    if (run_id > 0)
        return state_rows_query(st, STMT_EVENT_LIST_RUN, what, &event_row, (void **)out, n, "I",
                                run_id);
    if (job_id > 0)
        return state_rows_query(st, STMT_EVENT_LIST_JOB, what, &event_row, (void **)out, n, "I",
                                job_id);
    return state_rows_query(st, STMT_EVENT_LIST_ALL, what, &event_row, (void **)out, n, "");
}

int state_event_list(state_t *st, int64_t job_id, int64_t run_id, state_event_t **out, size_t *n)
{
    int rc;
    STATE_READ(st, "listing events", rc, event_list_tx(st, job_id, run_id, out, n));
    return rc;
}
