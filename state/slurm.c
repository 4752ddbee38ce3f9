/*
 * state/slurm.c - the Slurm job of a run of launcher: slurm (slurm_jobs, one
 * row per run): its id, and its state, nodes and partition as kilnd last saw
 * them in the run directory. Each change is also an event of the run, so the
 * timeline shows when the job was submitted, started where, and ended how.
 */
#include "state_int.h"

#include <stdlib.h>
#include <string.h>

void state_slurm_job_fini(state_slurm_job_t *j)
{
    if (j == NULL)
        return;
    free(j->state);
    free(j->nodes);
    free(j->partition);
    memset(j, 0, sizeof *j);
}

static int get_tx(state_t *st, int64_t run_id, state_slurm_job_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "reading a run's Slurm job";
    memset(out, 0, sizeof *out);
    KILN_CHECK_GOTO(state_stmt(st, STMT_SLURM_JOB_GET, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "I", run_id), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 0) {
        rc = kiln_errf(KILN_ENOENT, "run %lld has no Slurm job", (long long)run_id);
        goto out;
    }
    out->run_id = state_col_i64(s, 0);
    out->job_id = state_col_i64(s, 1);
    out->updated_at = state_col_i64(s, 5);
    KILN_CHECK_GOTO(state_col_str(s, 2, &out->state), rc, out);
    KILN_CHECK_GOTO(state_col_str(s, 3, &out->nodes), rc, out);
    rc = state_col_str(s, 4, &out->partition);
out:
    state_stmt_done(s);
    if (rc < 0)
        state_slurm_job_fini(out);
    return rc;
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

static int put_tx(state_t *st, const state_slurm_job_t *j)
{
    sqlite3_stmt *s = NULL;
    state_slurm_job_t old;
    int rc;
    const char *what = "recording a run's Slurm job";
    int got = get_tx(st, j->run_id, &old);
    if (got < 0 && got != KILN_ENOENT)
        return got;
    const char *nodes = j->nodes != NULL && j->nodes[0] ? j->nodes : NULL;
    const char *part = j->partition != NULL && j->partition[0] ? j->partition : NULL;
    KILN_CHECK_GOTO(state_stmt(st, STMT_SLURM_JOB_PUT, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "IIttt" "I", j->run_id, j->job_id, j->state, nodes,
                               part, j->updated_at > 0 ? j->updated_at : kiln_now_s()),
                    rc, out);
    KILN_CHECK_GOTO(state_exec(st, s, what), rc, out);
    if (got == KILN_ENOENT || old.job_id != j->job_id)
        rc = state_event_insert(st, 0, j->run_id, "slurm", "Slurm job %lld: %s%s%s",
                                (long long)j->job_id, j->state, part ? " in partition " : "",
                                part ? part : "");
    else if (!same(old.state, j->state) || !same(old.nodes, nodes))
        rc = state_event_insert(st, 0, j->run_id, "slurm", "Slurm job %lld: %s -> %s%s%s",
                                (long long)j->job_id, old.state, j->state, nodes ? " on " : "",
                                nodes ? nodes : "");
    if (rc == 0 && got == KILN_ENOENT && nodes != NULL)
        rc = state_event_insert(st, 0, j->run_id, "slurm", "Slurm job %lld on %s",
                                (long long)j->job_id, nodes);
out:
    state_stmt_done(s);
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
