/*
 * state/queries_web.c - the read-only queries of the status page, the JSON
 * API and /metrics (web/). Each one costs what it returns, not what the
 * database holds: runs are paged by id along an index (keyset pagination,
 * never OFFSET), and the per-state counts and the duration histogram are read
 * from the small aggregate tables that the triggers of migration 3 keep.
 */
#include "state_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- runs ------------------------------------------------------------------------ */

/* The page statement for each filter (bit 0 job, bit 1 state) and the values
 * it binds: ?1 before, ?2 limit, ?3 job, ?4 state. A filter by state alone
 * binds ?3 too, which its statement does not read. */
static const struct {
    state_stmt_id_t stmt;
    const char *fmt;
} pages[4] = {
    {STMT_WEB_RUN_PAGE_ALL, "II"},
    {STMT_WEB_RUN_PAGE_JOB, "III"},
    {STMT_WEB_RUN_PAGE_STATE, "IIIt"},
    {STMT_WEB_RUN_PAGE_JOB_STATE, "IIIt"},
};

int state_run_page(state_t *st, int64_t job_id, int state, int64_t before_id, int limit,
                   state_run_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "a page holds 1 to %d runs, not %d", STATE_PAGE_MAX, limit);
    if (state >= STATE_RUN_NSTATES)
        return kiln_errf(KILN_EINVAL, "unknown run state %d", state);
    int variant = (job_id > 0 ? 1 : 0) | (state >= 0 ? 2 : 0);
    int64_t before = before_id > 0 ? before_id : INT64_MAX;
    int64_t *ids = NULL;
    size_t nids = 0;
    int rc = state_rows_list(st, pages[variant].stmt, "paging runs", &state_i64_row, (void **)&ids,
                             &nids, pages[variant].fmt, before, (int64_t)limit, job_id,
                             state_run_state_name((state_run_state_t)state));
    if (rc == 0)
        rc = state_rows_of_ids(st, STMT_RUN_GET, "reading a run", &state_run_row, ids, nids,
                               (void **)out, n);
    free(ids);
    return rc;
}

static int job_last_tx(state_t *st, int64_t job_id, state_job_last_t *out)
{
    sqlite3_stmt *s = NULL;
    const char *what = "reading a job's last run";
    memset(out, 0, sizeof *out);
    int rc = state_first_row(st, STMT_WEB_JOB_LAST_RUN, what, &s, "I", job_id);
    if (rc < 0)
        goto out;
    if (rc == 1) {
        out->last_run_id = state_col_i64(s, 0);
        out->last_queued_at = state_col_i64(s, 2);
        if (state_run_state_parse((const char *)sqlite3_column_text(s, 1), &out->last_state) < 0) {
            rc = kiln_errf(KILN_ECORRUPT, "run %lld has an unknown state in the database",
                           (long long)out->last_run_id);
            goto out;
        }
    }
    KILN_CHECK_GOTO(state_row_query(st, STMT_WEB_JOB_LAST_SUCCESS, what, &state_i64_row,
                                    &out->last_success_at, "I", job_id),
                    rc, out);
    rc = 0;
out:
    state_stmt_done(s);
    return rc;
}

int state_job_last(state_t *st, int64_t job_id, state_job_last_t *out)
{
    int rc;
    STATE_READ(st, "reading a job's last run", rc, job_last_tx(st, job_id, out));
    return rc;
}

static int metric_last_tx(state_t *st, int64_t run_id, const char *name, double *value,
                          bool *found)
{
    sqlite3_stmt *s = NULL;
    *found = false;
    int rc = state_first_row(st, STMT_WEB_METRIC_LAST, "reading a metric", &s, "It", run_id, name);
    if (rc == 1 && sqlite3_column_type(s, 0) != SQLITE_NULL) {
        *value = sqlite3_column_double(s, 0);
        *found = true;
    }
    state_stmt_done(s);
    return rc < 0 ? rc : 0;
}

int state_metric_last(state_t *st, int64_t run_id, const char *name, double *value, bool *found)
{
    int rc;
    STATE_READ(st, "reading a metric", rc, metric_last_tx(st, run_id, name, value, found));
    return rc;
}

/* ---- aggregates for /metrics ----------------------------------------------------- */

/* The state, stored by name (column 1). */
static int read_run_count_state(sqlite3_stmt *s, void *row)
{
    state_run_count_t *c = row;
    if (state_run_state_parse((const char *)sqlite3_column_text(s, 1), &c->state) < 0)
        return kiln_errf(KILN_ECORRUPT, "run_counts holds an unknown state");
    return 0;
}

/* A row of WEB_RUN_COUNTS. */
static const state_col_t run_count_cols[] = {
    STATE_COL(state_run_count_t, job_id),
    STATE_COL_SKIPPED, /* state */
    STATE_COL(state_run_count_t, n),
};
static const state_row_t run_count_row =
    STATE_ROW(state_run_count_t, run_count_cols, read_run_count_state);

int state_run_counts(state_t *st, state_run_count_t **out, size_t *n)
{
    return state_rows_list(st, STMT_WEB_RUN_COUNTS, "counting runs", &run_count_row, (void **)out,
                           n, "");
}

/* A row of WEB_RUN_DURATIONS. */
static const state_col_t duration_cols[] = {
    STATE_COL(state_duration_bucket_t, job_id),
    STATE_COL(state_duration_bucket_t, le),
    STATE_COL(state_duration_bucket_t, n),
    STATE_COL(state_duration_bucket_t, sum_s),
};
static const state_row_t duration_row = STATE_ROW(state_duration_bucket_t, duration_cols, NULL);

int state_run_durations(state_t *st, state_duration_bucket_t **out, size_t *n)
{
    return state_rows_list(st, STMT_WEB_RUN_DURATIONS, "reading run durations", &duration_row,
                           (void **)out, n, "");
}

/* ---- endpoints ------------------------------------------------------------------- */

/* A row of WEB_ENDPOINT_LIST. */
static const state_col_t endpoint_cols[] = {
    STATE_COL(state_endpoint_info_t, id),
    STATE_COL(state_endpoint_info_t, url),
    STATE_COL(state_endpoint_info_t, model),
    STATE_COL(state_endpoint_info_t, label),
    STATE_COL(state_endpoint_info_t, created_at),
    STATE_COL(state_endpoint_info_t, checkpoint_id),
    STATE_COL(state_endpoint_info_t, since),
    STATE_COL(state_endpoint_info_t, checkpoint_uid),
    STATE_COL(state_endpoint_info_t, pushes_failed),
    STATE_COL(state_endpoint_info_t, pushes_succeeded),
    STATE_COL(state_endpoint_info_t, pushes_pending),
    STATE_COL(state_endpoint_info_t, pushes_held),
    STATE_COL(state_endpoint_info_t, last_push_at),
    STATE_COL(state_endpoint_info_t, checkpoint_created_at),
    STATE_COL(state_endpoint_info_t, eval_logloss),
    STATE_COL(state_endpoint_info_t, eval_auc),
    STATE_COL(state_endpoint_info_t, last_error),
    STATE_COL(state_endpoint_info_t, last_http_status),
    STATE_COL(state_endpoint_info_t, stats_at),
    STATE_COL(state_endpoint_info_t, predict_requests),
    STATE_COL(state_endpoint_info_t, predict_rows),
    STATE_COL(state_endpoint_info_t, request_rate),
    STATE_COL(state_endpoint_info_t, stats_error),
};
static const state_row_t endpoint_row = STATE_ROW(state_endpoint_info_t, endpoint_cols, NULL);

void state_endpoint_info_fini(state_endpoint_info_t *e)
{
    state_row_fini(&endpoint_row, e);
}

void state_endpoint_infos_free(state_endpoint_info_t *es, size_t n)
{
    state_rows_free(&endpoint_row, es, n);
}

int state_endpoint_list(state_t *st, state_endpoint_info_t **out, size_t *n)
{
    return state_rows_list(st, STMT_WEB_ENDPOINT_LIST, "listing endpoints", &endpoint_row,
                           (void **)out, n, "");
}

/* A row of WEB_HOLDING_HISTORY. */
static const state_col_t holding_cols[] = {
    STATE_COL(state_holding_t, checkpoint_id), STATE_COL(state_holding_t, checkpoint_uid),
    STATE_COL(state_holding_t, since),         STATE_COL(state_holding_t, until_at),
    STATE_COL(state_holding_t, push_id),
};
static const state_row_t holding_row = STATE_ROW(state_holding_t, holding_cols, NULL);

int state_endpoint_history(state_t *st, int64_t endpoint_id, int limit, state_holding_t **out,
                           size_t *n)
{
    return state_rows_list(st, STMT_WEB_HOLDING_HISTORY, "reading an endpoint's holdings",
                           &holding_row, (void **)out, n, "Ii", endpoint_id,
                           limit > 0 ? limit : -1);
}

void state_holdings_free(state_holding_t *hs, size_t n)
{
    state_rows_free(&holding_row, hs, n);
}

/* ---- checkpoints ----------------------------------------------------------------- */

/* The checkpoints that a query of ids (children or descendants) names, in
 * its order. */
static int ckpts_of(state_t *st, state_stmt_id_t stmt, int64_t checkpoint_id, int limit,
                    state_checkpoint_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "asked for %d checkpoints; 1 to %d", limit, STATE_PAGE_MAX);
    int64_t *ids = NULL;
    size_t nids = 0;
    int rc = state_rows_list(st, stmt, "listing a checkpoint's children", &state_i64_row,
                             (void **)&ids, &nids, "Ii", checkpoint_id, limit);
    if (rc == 0)
        rc = state_rows_of_ids(st, STMT_CKPT_GET_BY_ID, "reading a checkpoint", &state_ckpt_row,
                               ids, nids, (void **)out, n);
    free(ids);
    return rc;
}

int state_checkpoint_children(state_t *st, int64_t checkpoint_id, int limit,
                              state_checkpoint_t **out, size_t *n)
{
    return ckpts_of(st, STMT_WEB_CKPT_CHILDREN, checkpoint_id, limit, out, n);
}

int state_checkpoint_descendants(state_t *st, int64_t checkpoint_id, int limit,
                                 state_checkpoint_t **out, size_t *n)
{
    return ckpts_of(st, STMT_CKPT_DESCENDANTS, checkpoint_id, limit, out, n);
}

/* ---- retries --------------------------------------------------------------------- */

int state_run_retry_find(state_t *st, int64_t run_id, int64_t *retry_id)
{
    int rc = state_row_get(st, STMT_RUN_RETRY_OF, "finding a run's retry", &state_i64_row, retry_id,
                           "I", run_id);
    return rc < 0 ? rc : 0;
}
