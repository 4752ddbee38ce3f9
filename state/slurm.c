/*
 * state/slurm.c - the Slurm job of a run of launcher: slurm (slurm_jobs, one
 * row per run): its id, and its state, nodes and partition as kilnd last saw
 * them in the run directory. Each change is also an event of the run, so the
 * timeline shows when the job was submitted, started where, and ended how.
 */
#include "state_int.h"

#include <stdlib.h>
#include <string.h>

/* A row of SLURM_JOB_GET. */
static const state_col_t slurm_job_cols[] = {
    STATE_COL(state_slurm_job_t, run_id),    STATE_COL(state_slurm_job_t, job_id),
    STATE_COL(state_slurm_job_t, state),     STATE_COL(state_slurm_job_t, nodes),
    STATE_COL(state_slurm_job_t, partition), STATE_COL(state_slurm_job_t, updated_at),
};
static const state_row_t slurm_job_row = STATE_ROW(state_slurm_job_t, slurm_job_cols, NULL);

void state_slurm_job_fini(state_slurm_job_t *j)
{
    state_row_fini(&slurm_job_row, j);
}

static int get_tx(state_t *st, int64_t run_id, state_slurm_job_t *out)
{
    int rc = state_row_query(st, STMT_SLURM_JOB_GET, "reading a run's Slurm job", &slurm_job_row,
                             out, "I", run_id);
    return state_found(rc, "run %lld has no Slurm job", (long long)run_id);
}

int state_slurm_job_get(state_t *st, int64_t run_id, state_slurm_job_t *out)
{
    int rc;
    STATE_READ(st, "reading a run's Slurm job", rc, get_tx(st, run_id, out));
    return rc;
}

static bool same(const char *a, const char *b)
{
    return (a == NULL || *a == '\0') ? (b == NULL || *b == '\0') : b != NULL && strcmp(a, b) == 0;
}

/* The events of a change from old (NULL: the run had no Slurm job) to j, with
 * nodes and part as recorded (NULL when empty). */
static int put_events(state_t *st, const state_slurm_job_t *j, const state_slurm_job_t *old,
                      const char *nodes, const char *part)
{
    int rc = 0;
    if (old == NULL || old->job_id != j->job_id)
        rc = state_event_insert(st, 0, j->run_id, "slurm", "Slurm job %lld: %s%s%s",
                                (long long)j->job_id, j->state, part ? " in partition " : "",
                                part ? part : "");
    else if (!same(old->state, j->state) || !same(old->nodes, nodes))
        rc = state_event_insert(st, 0, j->run_id, "slurm", "Slurm job %lld: %s -> %s%s%s",
                                (long long)j->job_id, old->state, j->state, nodes ? " on " : "",
                                nodes ? nodes : "");
    if (rc == 0 && old == NULL && nodes != NULL)
        rc = state_event_insert(st, 0, j->run_id, "slurm", "Slurm job %lld on %s",
                                (long long)j->job_id, nodes);
    return rc;
}

static int put_tx(state_t *st, const state_slurm_job_t *j)
{
    state_slurm_job_t old;
    int got = get_tx(st, j->run_id, &old);
    if (got < 0 && got != KILN_ENOENT)
        return got;
    const char *nodes = j->nodes != NULL && j->nodes[0] ? j->nodes : NULL;
    const char *part = j->partition != NULL && j->partition[0] ? j->partition : NULL;
    int rc = state_update(st, STMT_SLURM_JOB_PUT, "recording a run's Slurm job", "IItttI",
                          j->run_id, j->job_id, j->state, nodes, part,
                          j->updated_at > 0 ? j->updated_at : kiln_now_s());
    if (rc >= 0)
        rc = put_events(st, j, got == 0 ? &old : NULL, nodes, part);
    if (got == 0)
        state_slurm_job_fini(&old);
    return rc;
}

int state_slurm_job_put(state_t *st, const state_slurm_job_t *j)
{
    if (j == NULL || j->run_id <= 0 || j->job_id <= 0 || j->state == NULL)
        return kiln_errf(KILN_EINVAL, "a Slurm job needs a run, a job id and a state");
    int rc;
    STATE_WRITE(st, "recording a run's Slurm job", rc, put_tx(st, j));
    return rc;
}
