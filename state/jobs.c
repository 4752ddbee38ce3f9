/*
 * state/jobs.c - the jobs table: submitting a spec (insert, or replace with a
 * version bump when its hash changed, keeping every version in job_versions),
 * reading jobs back, pausing them, and the scheduler's high-water mark of
 * scheduled times served.
 */
#include "state_int.h"

#include <stdlib.h>
#include <string.h>

/* A row of STATE_JOB_COLS. */
static const state_col_t job_cols[] = {
    STATE_COL(state_job_t, id),
    STATE_COL(state_job_t, name),
    STATE_COL(state_job_t, spec_yaml),
    STATE_COL(state_job_t, spec_hash),
    STATE_COL(state_job_t, schedule),
    STATE_COL(state_job_t, priority),
    STATE_COL(state_job_t, version),
    STATE_COL(state_job_t, paused),
    STATE_COL(state_job_t, created_at),
    STATE_COL(state_job_t, updated_at),
    STATE_COL(state_job_t, last_scheduled_at),
    STATE_COL(state_job_t, spec_dir),
    STATE_COL(state_job_t, deleted_at),
    STATE_COL(state_job_t, last_checked_at),
    STATE_COL(state_job_t, skipped_fires),
    STATE_COL(state_job_t, last_skip_reason),
    STATE_COL(state_job_t, timezone),
};
static const state_row_t job_row = STATE_ROW(state_job_t, job_cols, NULL);

void state_job_fini(state_job_t *j)
{
    state_row_fini(&job_row, j);
}

void state_jobs_free(state_job_t *js, size_t n)
{
    state_rows_free(&job_row, js, n);
}

/* ---- put ------------------------------------------------------------------------ */

/* Inserts or updates the job of in (name, spec, hash, schedule, priority;
 * a NULL spec_dir leaves it, a NULL timezone is UTC) and fills out's job_id,
 * version and created. */
static int job_put_tx(state_t *st, const state_submit_t *in, state_submitted_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc, version = 0;
    int64_t now = kiln_now_s();
    char *old_hash = NULL;
    const char *what = "submitting a job";

    out->job_id = 0;
    out->created = false;
    KILN_CHECK_GOTO(state_first_row(st, STMT_JOB_FIND, what, &s, "t", in->name), rc, out);
    if (rc == 1) {
        out->job_id = state_col_i64(s, 0);
        KILN_CHECK_GOTO(state_col_str(s, 1, &old_hash), rc, out);
        version = sqlite3_column_int(s, 2);
    }
    state_stmt_done(s);
    s = NULL;

    if (out->job_id != 0) { /* a deleted job submitted again comes back */
        KILN_CHECK_GOTO(state_update(st, STMT_JOB_REVIVE, what, "II", out->job_id, now), rc,
                        out);
        if (rc > 0)
            KILN_CHECK_GOTO(state_event_insert(st, out->job_id, 0, "spec",
                                               "submitted again after a delete"),
                            rc, out);
    }
    if (out->job_id == 0) {
        KILN_CHECK_GOTO(state_insert(st, STMT_JOB_INSERT, what, &out->job_id, "ttttiItt",
                                     in->name, in->spec_yaml, in->spec_hash, in->schedule,
                                     in->priority, now, in->spec_dir, in->timezone),
                        rc, out);
        out->created = true;
        version = 1;
    } else if (old_hash == NULL || strcmp(old_hash, in->spec_hash) != 0) {
        KILN_CHECK_GOTO(state_update(st, STMT_JOB_UPDATE_SPEC, what, "ItttiItt", out->job_id,
                                     in->spec_yaml, in->spec_hash, in->schedule, in->priority, now,
                                     in->spec_dir, in->timezone),
                        rc, out);
        version++;
    } else {
        /* Same spec: nothing to version; keep derived fields in step. */
        KILN_CHECK_GOTO(state_update(st, STMT_JOB_UPDATE_SAME, what, "Ititt", out->job_id,
                                     in->schedule, in->priority, in->spec_dir, in->timezone),
                        rc, out);
        out->version = version;
        rc = 0;
        goto out;
    }
    KILN_CHECK_GOTO(state_update(st, STMT_JOB_VERSION_INSERT, what, "I", out->job_id), rc, out);
    KILN_CHECK_GOTO(state_event_insert(st, out->job_id, 0, "spec", "%s version %d (spec %s)",
                                       out->created ? "submitted" : "updated to", version,
                                       in->spec_hash),
                    rc, out);
    out->version = version;
    rc = 0;
out:
    state_stmt_done(s);
    free(old_hash);
    return rc;
}

int state_job_put(state_t *st, const char *name, const char *spec_yaml, const char *spec_hash,
                  const char *schedule, int priority, int64_t *job_id, bool *created)
{
    if (name == NULL || name[0] == '\0' || spec_yaml == NULL || spec_hash == NULL)
        return kiln_errf(KILN_EINVAL, "a job needs a name, a spec and its hash");
    const state_submit_t in = {.name = name, .spec_yaml = spec_yaml, .spec_hash = spec_hash,
                               .schedule = schedule, .priority = priority};
    state_submitted_t out = {0};
    int rc;
    STATE_WRITE(st, "submitting a job", rc, job_put_tx(st, &in, &out));
    if (rc < 0)
        return rc;
    *job_id = out.job_id;
    if (created != NULL)
        *created = out.created;
    return 0;
}

/* ---- submit ------------------------------------------------------------------------ */

typedef struct {
    const state_submit_t *in;
    state_submitted_t out;
} submit_t;

static int submit_tx(state_t *st, submit_t *x)
{
    const state_submit_t *in = x->in;
    memset(&x->out, 0, sizeof x->out);
    KILN_CHECK(job_put_tx(st, in, &x->out));
    if (in->queue_run)
        KILN_CHECK(state_run_create_tx(st, x->out.job_id, STATE_TRIGGER_MANUAL, 0, 1, 0,
                                       &x->out.run_id));
    for (int i = 0; i < in->nendpoints; i++) {
        int64_t id;
        KILN_CHECK(state_endpoint_put_tx(st, &in->endpoints[i], &id));
    }
    return state_event_insert(st, x->out.job_id, x->out.run_id, "submit",
                              "submitted from %s (version %d)",
                              in->source != NULL ? in->source : "an unknown source",
                              x->out.version);
}

int state_submit(state_t *st, const state_submit_t *in, state_submitted_t *out)
{
    if (in == NULL || in->name == NULL || in->name[0] == '\0' || in->spec_yaml == NULL ||
        in->spec_hash == NULL)
        return kiln_errf(KILN_EINVAL, "a job needs a name, a spec and its hash");
    if (in->spec_dir != NULL && in->spec_dir[0] != '/')
        return kiln_errf(KILN_EINVAL, "the spec directory must be absolute, not '%s'",
                         in->spec_dir);
    submit_t x = {in, {0}};
    int rc;
    STATE_WRITE(st, "submitting a job", rc, submit_tx(st, &x));
    if (rc == 0)
        *out = x.out;
    return rc;
}

/* ---- get / list -------------------------------------------------------------------- */

int state_job_get(state_t *st, const char *name, state_job_t *out)
{
    memset(out, 0, sizeof *out);
    if (name == NULL)
        return kiln_errf(KILN_EINVAL, "no job name given");
    int rc = state_row_get(st, STMT_JOB_GET_BY_NAME, "reading a job", &job_row, out, "t", name);
    return state_found(rc, "no job named '%s'; see kiln jobs", name);
}

static int version_spec_tx(state_t *st, int64_t job_id, int version, char **yaml)
{
    sqlite3_stmt *s = NULL;
    int rc = state_first_row(st, STMT_JOB_VERSION_SPEC, "reading a job version", &s, "Ii", job_id,
                             version);
    rc = state_found(rc, "job %lld has no version %d", (long long)job_id, version);
    if (rc == 0)
        rc = state_col_str(s, 0, yaml);
    state_stmt_done(s);
    return rc;
}

int state_job_version_spec(state_t *st, int64_t job_id, int version, char **yaml)
{
    int rc;
    *yaml = NULL;
    STATE_READ(st, "reading a job version", rc, version_spec_tx(st, job_id, version, yaml));
    return rc;
}

int state_job_get_by_id(state_t *st, int64_t id, state_job_t *out)
{
    int rc = state_row_get(st, STMT_JOB_GET_BY_ID, "reading a job", &job_row, out, "I", id);
    return state_found(rc, "no job with id %lld", (long long)id);
}

int state_job_list(state_t *st, state_job_t **out, size_t *n)
{
    return state_rows_list(st, STMT_JOB_LIST, "listing jobs", &job_row, (void **)out, n, "");
}

/* ---- updates ----------------------------------------------------------------------- */

static int job_set_paused_tx(state_t *st, int64_t job_id, bool paused)
{
    int rc = state_update(st, STMT_JOB_SET_PAUSED, paused ? "pausing a job" : "resuming a job",
                          "IbI", job_id, paused, kiln_now_s());
    KILN_CHECK(state_found(rc, "no job with id %lld", (long long)job_id));
    return state_event_insert(st, job_id, 0, paused ? "pause" : "resume", "%s",
                              paused ? "paused" : "resumed");
}

int state_job_set_paused(state_t *st, int64_t job_id, bool paused)
{
    int rc;
    STATE_WRITE(st, "pausing a job", rc, job_set_paused_tx(st, job_id, paused));
    return rc;
}

int state_job_set_last_scheduled(state_t *st, int64_t job_id, int64_t scheduled_at)
{
    const char *what = "recording the last scheduled time";
    int rc;
    STATE_WRITE(
        st, what, rc,
        state_found(state_update(st, STMT_JOB_SET_LAST_SCHEDULED, what, "II", job_id, scheduled_at),
                    "no job with id %lld", (long long)job_id));
    return rc;
}

/* ---- delete -------------------------------------------------------------------------- */

static int job_delete_tx(state_t *st, int64_t job_id, bool cancel, int *nstopped)
{
    const char *what = "deleting a job";
    state_job_t j;
    int64_t *ids = NULL;
    size_t n = 0;
    *nstopped = 0;
    int rc = state_row_query(st, STMT_JOB_GET_BY_ID, what, &job_row, &j, "I", job_id);
    KILN_CHECK(state_found(rc, "no job with id %lld", (long long)job_id));
    if (j.deleted_at > 0) {
        rc = kiln_errf(KILN_ENOENT, "job %s was deleted already", j.name);
        goto out;
    }
    KILN_CHECK_GOTO(state_rows_query(st, STMT_JOB_ACTIVE_RUNS, what, &state_i64_row,
                                     (void **)&ids, &n, "I", job_id),
                    rc, out);
    if (n > 0 && !cancel) {
        rc = kiln_errf(KILN_ESTATE,
                       "job %s has %zu run%s queued or running (run %lld); cancel %s first, or "
                       "delete with --cancel",
                       j.name, n, n == 1 ? "" : "s", (long long)ids[0], n == 1 ? "it" : "them");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        bool done;
        KILN_CHECK_GOTO(state_run_cancel_tx(st, ids[i], &done), rc, out);
        (*nstopped)++;
    }
    KILN_CHECK_GOTO(state_update(st, STMT_JOB_DELETE, what, "II", job_id, kiln_now_s()), rc, out);
    rc = state_event_insert(st, job_id, 0, "delete", "deleted%s; its runs, checkpoints and "
                            "lineage stay", n > 0 ? " (its runs canceled)" : "");
out:
    free(ids);
    state_job_fini(&j);
    return rc;
}

int state_job_delete(state_t *st, int64_t job_id, bool cancel, int *nstopped)
{
    int rc, stopped = 0;
    STATE_WRITE(st, "deleting a job", rc, job_delete_tx(st, job_id, cancel, &stopped));
    if (rc == 0 && nstopped != NULL)
        *nstopped = stopped;
    return rc;
}
