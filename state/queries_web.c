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

/* The page statement for each filter: bit 0 job, bit 1 state. */
static const state_stmt_id_t page_stmts[4] = {
    STMT_WEB_RUN_PAGE_ALL, STMT_WEB_RUN_PAGE_JOB, STMT_WEB_RUN_PAGE_STATE,
    STMT_WEB_RUN_PAGE_JOB_STATE};

typedef struct page_q {
    int64_t job_id;
    int state;
    int64_t before_id;
    int limit;
    int64_t *ids;
    size_t n;
} page_q_t;

static int run_page_ids_tx(state_t *st, page_q_t *q)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "paging runs";
    int variant = (q->job_id > 0 ? 1 : 0) | (q->state >= 0 ? 2 : 0);
    int64_t before = q->before_id > 0 ? q->before_id : INT64_MAX;
    q->n = 0;
    KILN_CHECK_GOTO(state_stmt(st, page_stmts[variant], &s), rc, out);
    /* The variants use different parameters of ?1..?4: bind one by one. */
    rc = 0;
    SQL_CHECK(st, sqlite3_bind_int64(s, 1, before), what);
    SQL_CHECK(st, sqlite3_bind_int64(s, 2, q->limit), what);
    if (q->job_id > 0)
        SQL_CHECK(st, sqlite3_bind_int64(s, 3, q->job_id), what);
    if (q->state >= 0)
        SQL_CHECK(st, sqlite3_bind_text(s, 4, state_run_state_name((state_run_state_t)q->state),
                                        -1, SQLITE_STATIC),
                  what);
    for (;;) {
        KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
        if (rc == 0)
            break;
        q->ids[q->n++] = state_col_i64(s, 0);
    }
out:
    state_stmt_done(s);
    return rc;
}

int state_run_page(state_t *st, int64_t job_id, int state, int64_t before_id, int limit,
                   state_run_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "a page holds 1 to %d runs, not %d", STATE_PAGE_MAX, limit);
    if (state >= STATE_RUN_NSTATES)
        return kiln_errf(KILN_EINVAL, "unknown run state %d", state);
    page_q_t q = {job_id, state, before_id, limit, NULL, 0};
    q.ids = kiln_calloc((size_t)limit, sizeof *q.ids);
    if (q.ids == NULL)
        return KILN_ENOMEM;
    STATE_READ(st, "paging runs", rc, run_page_ids_tx(st, &q));
    if (rc < 0)
        goto out;
    state_run_t *rs = kiln_calloc(q.n ? q.n : 1, sizeof *rs);
    if (rs == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    size_t got = 0;
    for (size_t i = 0; i < q.n; i++) {
        rc = state_run_get(st, q.ids[i], &rs[got]);
        if (rc == KILN_ENOENT)
            continue; /* deleted between the two reads */
        if (rc < 0) {
            state_runs_free(rs, got);
            goto out;
        }
        got++;
    }
    *out = rs;
    *n = got;
    rc = 0;
out:
    free(q.ids);
    return rc;
}

static int job_last_tx(state_t *st, int64_t job_id, state_job_last_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "reading a job's last run";
    memset(out, 0, sizeof *out);
    KILN_CHECK_GOTO(state_stmt(st, STMT_WEB_JOB_LAST_RUN, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "I", job_id), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 1) {
        out->last_run_id = state_col_i64(s, 0);
        out->last_queued_at = state_col_i64(s, 2);
        if (state_run_state_parse((const char *)sqlite3_column_text(s, 1), &out->last_state) < 0) {
            rc = kiln_errf(KILN_ECORRUPT, "run %lld has an unknown state in the database",
                           (long long)out->last_run_id);
            goto out;
        }
    }
    state_stmt_done(s);
    KILN_CHECK_GOTO(state_stmt(st, STMT_WEB_JOB_LAST_SUCCESS, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "I", job_id), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 1)
        out->last_success_at = state_col_i64(s, 0);
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
    int rc;
    const char *what = "reading a metric";
    *found = false;
    KILN_CHECK_GOTO(state_stmt(st, STMT_WEB_METRIC_LAST, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "It", run_id, name), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 1 && sqlite3_column_type(s, 0) != SQLITE_NULL) {
        *value = sqlite3_column_double(s, 0);
        *found = true;
    }
    rc = 0;
out:
    state_stmt_done(s);
    return rc;
}

int state_metric_last(state_t *st, int64_t run_id, const char *name, double *value, bool *found)
{
    int rc;
    STATE_READ(st, "reading a metric", rc, metric_last_tx(st, run_id, name, value, found));
    return rc;
}

/* ---- aggregates for /metrics ----------------------------------------------------- */

static int read_run_count(sqlite3_stmt *s, void *item)
{
    state_run_count_t *c = item;
    c->job_id = state_col_i64(s, 0);
    c->n = state_col_i64(s, 2);
    if (state_run_state_parse((const char *)sqlite3_column_text(s, 1), &c->state) < 0)
        return kiln_errf(KILN_ECORRUPT, "run_counts holds an unknown state");
    return 0;
}

static int run_counts_tx(state_t *st, state_run_count_t **out, size_t *n)
{
    sqlite3_stmt *s = NULL;
    int rc;
    KILN_CHECK_GOTO(state_stmt(st, STMT_WEB_RUN_COUNTS, &s), rc, out);
    rc = state_collect(st, s, "counting runs", sizeof **out, read_run_count, (void **)out, n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_run_counts(state_t *st, state_run_count_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    STATE_READ(st, "counting runs", rc, run_counts_tx(st, out, n));
    return rc;
}

static int read_duration(sqlite3_stmt *s, void *item)
{
    state_duration_bucket_t *b = item;
    b->job_id = state_col_i64(s, 0);
    b->le = state_col_i64(s, 1);
    b->n = state_col_i64(s, 2);
    b->sum_s = state_col_i64(s, 3);
    return 0;
}

static int run_durations_tx(state_t *st, state_duration_bucket_t **out, size_t *n)
{
    sqlite3_stmt *s = NULL;
    int rc;
    KILN_CHECK_GOTO(state_stmt(st, STMT_WEB_RUN_DURATIONS, &s), rc, out);
    rc = state_collect(st, s, "reading run durations", sizeof **out, read_duration, (void **)out,
                       n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_run_durations(state_t *st, state_duration_bucket_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    STATE_READ(st, "reading run durations", rc, run_durations_tx(st, out, n));
    return rc;
}

/* ---- endpoints ------------------------------------------------------------------- */

void state_endpoint_info_fini(state_endpoint_info_t *e)
{
    if (e == NULL)
        return;
    free(e->url);
    free(e->model);
    free(e->label);
    free(e->checkpoint_uid);
    free(e->last_error);
    free(e->stats_error);
    memset(e, 0, sizeof *e);
}

void state_endpoint_infos_free(state_endpoint_info_t *es, size_t n)
{
    for (size_t i = 0; es != NULL && i < n; i++)
        state_endpoint_info_fini(&es[i]);
    free(es);
}

static int read_endpoint(sqlite3_stmt *s, void *item)
{
    state_endpoint_info_t *e = item;
    e->id = state_col_i64(s, 0);
    e->created_at = state_col_i64(s, 4);
    e->checkpoint_id = state_col_i64(s, 5);
    e->since = state_col_i64(s, 6);
    e->pushes_failed = state_col_i64(s, 8);
    e->pushes_succeeded = state_col_i64(s, 9);
    e->pushes_pending = state_col_i64(s, 10);
    e->pushes_held = state_col_i64(s, 11);
    e->last_push_at = state_col_i64(s, 12);
    e->checkpoint_created_at = state_col_i64(s, 13);
    e->eval_logloss = sqlite3_column_type(s, 14) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 14);
    e->eval_auc = sqlite3_column_type(s, 15) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 15);
    e->last_http_status = sqlite3_column_int(s, 17);
    e->stats_at = state_col_i64(s, 18);
    e->predict_requests = state_col_i64(s, 19);
    e->predict_rows = state_col_i64(s, 20);
    e->request_rate = sqlite3_column_type(s, 21) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 21);
    KILN_CHECK(state_col_str(s, 16, &e->last_error));
    KILN_CHECK(state_col_str(s, 22, &e->stats_error));
    KILN_CHECK(state_col_str(s, 1, &e->url));
    KILN_CHECK(state_col_str(s, 2, &e->model));
    KILN_CHECK(state_col_str(s, 3, &e->label));
    return state_col_str(s, 7, &e->checkpoint_uid);
}

static int endpoint_list_tx(state_t *st, state_endpoint_info_t **out, size_t *n)
{
    sqlite3_stmt *s = NULL;
    int rc;
    KILN_CHECK_GOTO(state_stmt(st, STMT_WEB_ENDPOINT_LIST, &s), rc, out);
    rc = state_collect(st, s, "listing endpoints", sizeof **out, read_endpoint, (void **)out, n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        state_endpoint_infos_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_endpoint_list(state_t *st, state_endpoint_info_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    STATE_READ(st, "listing endpoints", rc, endpoint_list_tx(st, out, n));
    return rc;
}

typedef struct history_q {
    int64_t endpoint_id;
    int limit;
    state_holding_t *hs;
    size_t n;
} history_q_t;

static int read_holding(sqlite3_stmt *s, void *item)
{
    state_holding_t *h = item;
    h->checkpoint_id = state_col_i64(s, 0);
    h->since = state_col_i64(s, 2);
    h->until_at = state_col_i64(s, 3);
    h->push_id = state_col_i64(s, 4);
    return state_col_str(s, 1, &h->checkpoint_uid);
}

static int endpoint_history_tx(state_t *st, history_q_t *q)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "reading an endpoint's holdings";
    q->hs = NULL;
    q->n = 0;
    KILN_CHECK_GOTO(state_stmt(st, STMT_WEB_HOLDING_HISTORY, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "Ii", q->endpoint_id, q->limit), rc, out);
    rc = state_collect(st, s, what, sizeof *q->hs, read_holding, (void **)&q->hs, &q->n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        state_holdings_free(q->hs, q->n);
        q->hs = NULL;
        q->n = 0;
    }
    return rc;
}

int state_endpoint_history(state_t *st, int64_t endpoint_id, int limit, state_holding_t **out,
                           size_t *n)
{
    int rc;
    history_q_t q = {endpoint_id, limit > 0 ? limit : -1, NULL, 0};
    STATE_READ(st, "reading an endpoint's holdings", rc, endpoint_history_tx(st, &q));
    *out = q.hs;
    *n = q.n;
    return rc;
}

void state_holdings_free(state_holding_t *hs, size_t n)
{
    for (size_t i = 0; hs != NULL && i < n; i++)
        free(hs[i].checkpoint_uid);
    free(hs);
}

/* ---- checkpoints ----------------------------------------------------------------- */

typedef struct children_q {
    state_stmt_id_t stmt;
    int64_t parent_id;
    int limit;
    int64_t *ids;
    size_t n;
} children_q_t;

static int children_tx(state_t *st, children_q_t *q)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "listing a checkpoint's children";
    q->n = 0;
    KILN_CHECK_GOTO(state_stmt(st, q->stmt, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "Ii", q->parent_id, q->limit), rc, out);
    for (;;) {
        KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
        if (rc == 0)
            break;
        q->ids[q->n++] = state_col_i64(s, 0);
    }
out:
    state_stmt_done(s);
    return rc;
}

/* The checkpoints a query of ids (children or descendants) names, in order. */
static int ckpts_of(state_t *st, state_stmt_id_t stmt, int64_t checkpoint_id, int limit,
                    state_checkpoint_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "asked for %d checkpoints; 1 to %d", limit, STATE_PAGE_MAX);
    children_q_t q = {stmt, checkpoint_id, limit, kiln_calloc((size_t)limit, sizeof(int64_t)), 0};
    if (q.ids == NULL)
        return KILN_ENOMEM;
    STATE_READ(st, "listing a checkpoint's children", rc, children_tx(st, &q));
    if (rc < 0)
        goto out;
    state_checkpoint_t *cs = kiln_calloc(q.n ? q.n : 1, sizeof *cs);
    if (cs == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    size_t got = 0;
    for (size_t i = 0; i < q.n; i++) {
        rc = state_checkpoint_get_by_id(st, q.ids[i], &cs[got]);
        if (rc == KILN_ENOENT)
            continue;
        if (rc < 0) {
            state_checkpoints_free(cs, got);
            goto out;
        }
        got++;
    }
    *out = cs;
    *n = got;
    rc = 0;
out:
    free(q.ids);
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

static int retry_of_tx(state_t *st, int64_t run_id, int64_t *retry_id)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "finding a run's retry";
    *retry_id = 0;
    KILN_CHECK_GOTO(state_stmt(st, STMT_RUN_RETRY_OF, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "I", run_id), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 1)
        *retry_id = state_col_i64(s, 0);
    rc = 0;
out:
    state_stmt_done(s);
    return rc;
}

int state_run_retry_find(state_t *st, int64_t run_id, int64_t *retry_id)
{
    int rc;
    STATE_READ(st, "finding a run's retry", rc, retry_of_tx(st, run_id, retry_id));
    return rc;
}
