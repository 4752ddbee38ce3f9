/*
 * ops/ops_jobs.c - submit, retry and cancel, pause, resume and delete, as the
 * CLI and the web API both do them. A submit is one transaction (state_submit): the job, the
 * directory its relative paths resolve against, its endpoints and a
 * one-off's run appear together, so kilnd never sees a run it cannot place.
 */
#include "ops.h"
#include "model.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ops_submitted_fini(ops_submitted_t *s)
{
    if (s == NULL)
        return;
    job_spec_fini(&s->spec);
    memset(s, 0, sizeof *s);
}

int ops_submit(state_t *st, const ops_submit_t *in, job_diags_t *diags, ops_submitted_t *out)
{
    memset(out, 0, sizeof *out);
    const char *name = in->path != NULL ? in->path : (in->source ? in->source : "spec");
    KILN_CHECK(job_spec_parse(in->text, in->len, name, &out->spec, diags));
    /* bf16 dense layers need the ranks' CPU to multiply bf16. With launcher
     * local they run on kilnd's host, which is this one (the web API runs in
     * kilnd; kiln submit writes kilnd's database); hostfile and slurm ranks
     * are checked by kiln-train when it starts. */
    if (out->spec.model.dense_precision == MODEL_DENSE_BF16 &&
        out->spec.resources.launcher == JOB_LAUNCH_LOCAL) {
        int rc = model_bf16_check_here();
        if (rc < 0) {
            ops_submitted_fini(out);
            return kiln_errf(rc, "%s: %s", name, kiln_errmsg());
        }
    }
    out->next_fire = job_next_fire(out->spec.schedule, out->spec.timezone, kiln_now_s());
    if (in->dry_run)
        return 0;

    /* The spec's directory, absolute: relative data, eval and checkpoint
     * paths resolve against it whoever reads them (kilnd, kiln-train). */
    char *real = NULL, *dir = NULL, *source = NULL;
    int rc = 0;
    if (in->path != NULL) {
        real = realpath(in->path, NULL);
        char *copy = kiln_strdup(real != NULL ? real : in->path);
        if (real == NULL || copy == NULL) {
            free(copy);
            rc = real == NULL ? kiln_errf(KILN_ENOENT, "cannot resolve %s", in->path)
                              : KILN_ENOMEM;
            goto out;
        }
        dir = kiln_strdup(dirname(copy));
        free(copy);
        source = kiln_strdup(real);
    } else {
        source = kiln_strdup(in->source != NULL ? in->source : "an unnamed source");
    }
    if (source == NULL || (in->path != NULL && dir == NULL)) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(ops_checkpoint_dir_check(st, &out->spec, dir), rc, out);
    char hash[17];
    kiln_hash_hex(kiln_xxh64(in->text, in->len, 0), hash, sizeof hash);
    char *text = kiln_strndup(in->text, in->len);
    if (text == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    /* The job's endpoints are known from now on: the endpoints page lists
     * them, and promote / rollback find a label's endpoints before anything
     * was pushed to them. They are part of the submit's transaction. */
    int nep = out->spec.push.nendpoints;
    state_endpoint_ref_t *eps = kiln_calloc(nep > 0 ? (size_t)nep : 1, sizeof *eps);
    for (int i = 0; eps != NULL && i < nep; i++) {
        const job_endpoint_t *e = &out->spec.push.endpoints[i];
        eps[i] = (state_endpoint_ref_t){e->url, e->model ? e->model : "", e->label ? e->label : ""};
    }
    state_submit_t sub = {.name = out->spec.name,
                          .spec_yaml = text,
                          .spec_hash = hash,
                          .schedule = out->spec.schedule,
                          .priority = out->spec.priority,
                          .spec_dir = dir,
                          .timezone = out->spec.timezone,
                          .queue_run = out->spec.schedule == NULL,
                          .source = source,
                          .endpoints = eps,
                          .nendpoints = nep};
    rc = eps == NULL ? KILN_ENOMEM : state_submit(st, &sub, &out->r);
    free(eps);
    free(text);
out:
    KILN_FREE_ALL(real, dir, source);
    if (rc < 0)
        ops_submitted_fini(out);
    return rc;
}

int ops_retry(state_t *st, int64_t run_id, const char *source, int64_t *new_run_id, int *attempt)
{
    state_run_t r;
    int64_t retry = 0;
    int rc = state_run_get(st, run_id, &r);
    if (rc < 0)
        return rc;
    if (!state_run_state_terminal(r.state) || r.state == STATE_RUN_SUCCEEDED) {
        rc = kiln_errf(KILN_ESTATE,
                       "run %lld is %s; only a failed, canceled, timed-out or skipped run can "
                       "be retried",
                       (long long)run_id, state_run_state_name(r.state));
        goto out;
    }
    KILN_CHECK_GOTO(state_run_retry_find(st, run_id, &retry), rc, out);
    if (retry > 0) {
        rc = kiln_errf(KILN_ECONFLICT, "run %lld was already retried by run %lld",
                       (long long)run_id, (long long)retry);
        goto out;
    }
    KILN_CHECK_GOTO(state_run_create(st, r.job_id, STATE_TRIGGER_RETRY, r.scheduled_at,
                                     r.attempt + 1, r.id, new_run_id),
                    rc, out);
    *attempt = r.attempt + 1;
    char msg[160];
    snprintf(msg, sizeof msg, "retry of run %lld queued from %s", (long long)run_id,
             source != NULL ? source : "an unnamed source");
    state_event_add(st, 0, *new_run_id, "retry", msg);
out:
    state_run_fini(&r);
    return rc;
}

int ops_cancel(state_t *st, int64_t run_id, bool *done)
{
    return state_run_request_cancel(st, run_id, done);
}

int ops_job_pause(state_t *st, int64_t job_id, bool pause, bool *changed)
{
    state_job_t j;
    KILN_CHECK(state_job_get_by_id(st, job_id, &j));
    bool gone = j.deleted_at > 0, same = j.paused == pause;
    int rc = gone ? kiln_errf(KILN_ENOENT, "job %s was deleted", j.name) : 0;
    state_job_fini(&j);
    if (changed != NULL)
        *changed = !same;
    if (rc < 0 || same)
        return rc;
    return state_job_set_paused(st, job_id, pause);
}

int ops_job_delete(state_t *st, int64_t job_id, bool cancel, int *nstopped)
{
    return state_job_delete(st, job_id, cancel, nstopped);
}
