/*
 * state/records.c - what runs consume and produce: the input partitions a run
 * read (and whether a job already consumed one, the data watermark), training
 * metrics, checkpoints with their parent chain and the eval figures measured
 * on them, and exports. Endpoints, pushes and holdings are in pushes.c.
 */
#include "state_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- inputs ------------------------------------------------------------------------ */

int state_input_add(state_t *st, int64_t run_id, const state_input_t *in)
{
    if (in == NULL || in->path == NULL)
        return kiln_errf(KILN_EINVAL, "an input needs a path");
    int rc;
    STATE_WRITE(st, "recording a run input", rc,
                state_insert(st, STMT_INPUT_INSERT, "record a run input", NULL, "ItIIt", run_id,
                             in->path, in->size, in->mtime, in->checksum));
    return rc;
}

/* A row of INPUT_LIST. */
static const state_col_t input_cols[] = {
    STATE_COL(state_input_t, path),
    STATE_COL(state_input_t, size),
    STATE_COL(state_input_t, mtime),
    STATE_COL(state_input_t, checksum),
};
static const state_row_t input_row = STATE_ROW(state_input_t, input_cols, NULL);

void state_inputs_free(state_input_t *ins, size_t n)
{
    state_rows_free(&input_row, ins, n);
}

int state_input_list(state_t *st, int64_t run_id, state_input_t **out, size_t *n)
{
    return state_rows_list(st, STMT_INPUT_LIST, "listing run inputs", &input_row, (void **)out, n,
                           "I", run_id);
}

int state_input_consumed(state_t *st, int64_t job_id, const state_input_t *in, bool *consumed)
{
    int64_t one;
    *consumed = false;
    if (in == NULL || in->path == NULL)
        return kiln_errf(KILN_EINVAL, "an input needs a path");
    int rc = state_row_get(st, STMT_INPUT_CONSUMED, "checking whether an input was consumed",
                           &state_i64_row, &one, "ItIIt", job_id, in->path, in->size, in->mtime,
                           in->checksum);
    *consumed = rc == 1;
    return rc < 0 ? rc : 0;
}

int state_input_consumed_run(state_t *st, int64_t job_id, const char *path, int64_t *run_id)
{
    *run_id = 0;
    if (path == NULL)
        return kiln_errf(KILN_EINVAL, "an input needs a path");
    int rc = state_row_get(st, STMT_INPUT_CONSUMED_RUN, "finding the run that consumed an input",
                           &state_i64_row, run_id, "It", job_id, path);
    return rc < 0 ? rc : 0;
}

int state_inputs_cover(state_t *st, int64_t run_id, int64_t checkpoint_id)
{
    const char *what = "marking an online run's inputs as covered";
    int rc;
    STATE_WRITE(st, what, rc,
                state_insert(st, STMT_INPUT_COVER, what, NULL, "II", run_id, checkpoint_id));
    return rc;
}

int state_input_runs(state_t *st, const char *path, int limit, int64_t **run_ids, size_t *n)
{
    *run_ids = NULL;
    *n = 0;
    if (path == NULL)
        return kiln_errf(KILN_EINVAL, "no input path given");
    if (limit < 1 || limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "asked for %d runs; 1 to %d", limit, STATE_PAGE_MAX);
    return state_rows_list(st, STMT_INPUT_RUNS, "finding the runs that read a file", &state_i64_row,
                           (void **)run_ids, n, "ti", path, limit);
}

/* ---- metrics ----------------------------------------------------------------------- */

int state_metric_add(state_t *st, int64_t run_id, int64_t step, const char *name, double value)
{
    if (name == NULL || name[0] == '\0')
        return kiln_errf(KILN_EINVAL, "a metric needs a name");
    int rc;
    STATE_WRITE(st, "recording a metric", rc,
                state_insert(st, STMT_METRIC_INSERT, "record a metric", NULL, "IItdI", run_id, step,
                             name, value, kiln_now_s()));
    return rc;
}

/* A row of METRIC_SERIES. */
static const state_col_t metric_cols[] = {
    STATE_COL(state_metric_t, step),
    STATE_COL(state_metric_t, value),
    STATE_COL(state_metric_t, at),
};
static const state_row_t metric_row = STATE_ROW(state_metric_t, metric_cols, NULL);

int state_metric_series(state_t *st, int64_t run_id, const char *name, state_metric_t **out,
                        size_t *n)
{
    *out = NULL;
    *n = 0;
    if (name == NULL)
        return kiln_errf(KILN_EINVAL, "no metric name given");
    return state_rows_list(st, STMT_METRIC_SERIES, "reading a metric series", &metric_row,
                           (void **)out, n, "It", run_id, name);
}

/* ---- checkpoints ------------------------------------------------------------------- */

/* has_eval: the figures were measured (the column is not NULL). */
static int read_ckpt_eval(sqlite3_stmt *s, void *row)
{
    state_checkpoint_t *c = row;
    c->has_eval = sqlite3_column_type(s, 11) != SQLITE_NULL;
    return 0;
}

/* A row of STATE_CKPT_COLS. */
static const state_col_t ckpt_cols[] = {
    STATE_COL(state_checkpoint_t, id),         STATE_COL(state_checkpoint_t, uid),
    STATE_COL(state_checkpoint_t, run_id),     STATE_COL(state_checkpoint_t, parent_id),
    STATE_COL(state_checkpoint_t, kind),       STATE_COL(state_checkpoint_t, path),
    STATE_COL(state_checkpoint_t, step),       STATE_COL(state_checkpoint_t, keys),
    STATE_COL(state_checkpoint_t, bytes),      STATE_COL(state_checkpoint_t, checksum),
    STATE_COL(state_checkpoint_t, created_at), STATE_COL(state_checkpoint_t, eval_logloss),
    STATE_COL(state_checkpoint_t, eval_auc),   STATE_COL(state_checkpoint_t, online),
};
const state_row_t state_ckpt_row = STATE_ROW(state_checkpoint_t, ckpt_cols, read_ckpt_eval);

void state_checkpoint_fini(state_checkpoint_t *c)
{
    state_row_fini(&state_ckpt_row, c);
}

void state_checkpoints_free(state_checkpoint_t *cs, size_t n)
{
    state_rows_free(&state_ckpt_row, cs, n);
}

static int ckpt_add_tx(state_t *st, const state_checkpoint_t *c, int64_t *id)
{
    /* The eval figures only when measured (SQL NULL otherwise). */
    int rc = state_insert(st, STMT_CKPT_INSERT, "record a checkpoint", id, "tJJttIIItIbnn", c->uid,
                          c->run_id, c->parent_id, c->kind, c->path, c->step, c->keys, c->bytes,
                          c->checksum, c->created_at != 0 ? c->created_at : kiln_now_s(), c->online,
                          c->has_eval ? c->eval_logloss : NAN, c->has_eval ? c->eval_auc : NAN);
    if (rc < 0 && st->last_sqlite_rc == SQLITE_CONSTRAINT_UNIQUE)
        rc = kiln_errf(KILN_EEXIST, "checkpoint %s is already recorded", c->uid);
    return rc;
}

int state_checkpoint_add(state_t *st, const state_checkpoint_t *c, int64_t *id)
{
    if (c == NULL || c->uid == NULL || c->path == NULL || c->kind == NULL)
        return kiln_errf(KILN_EINVAL, "a checkpoint needs a uid, a kind and a path");
    if (strcmp(c->kind, "full") != 0 && strcmp(c->kind, "incremental") != 0)
        return kiln_errf(KILN_EINVAL, "checkpoint %s: kind must be full or incremental, not '%s'",
                         c->uid, c->kind);
    int64_t nid = 0;
    int rc;
    STATE_WRITE(st, "recording a checkpoint", rc, ckpt_add_tx(st, c, &nid));
    if (rc == 0 && id != NULL)
        *id = nid;
    return rc;
}

int state_checkpoint_get(state_t *st, const char *uid, state_checkpoint_t *out)
{
    memset(out, 0, sizeof *out);
    if (uid == NULL)
        return kiln_errf(KILN_EINVAL, "no checkpoint uid given");
    int rc =
        state_row_get(st, STMT_CKPT_GET, "reading a checkpoint", &state_ckpt_row, out, "t", uid);
    return state_found(rc, "no checkpoint %s", uid);
}

int state_checkpoint_newest_of_run(state_t *st, int64_t run_id, bool online_only,
                                   state_checkpoint_t *out)
{
    int rc = state_row_get(st, STMT_CKPT_NEWEST_RUN, "reading a run's newest checkpoint",
                           &state_ckpt_row, out, "Ib", run_id, online_only);
    return state_found(rc, "run %lld recorded no %scheckpoint", (long long)run_id,
                       online_only ? "online " : "");
}

int state_checkpoint_latest(state_t *st, int64_t job_id, state_checkpoint_t *out)
{
    int rc = state_row_get(st, STMT_CKPT_LATEST, "reading a checkpoint", &state_ckpt_row, out, "I",
                           job_id);
    return state_found(rc, "job %lld has no checkpoints yet", (long long)job_id);
}

int state_checkpoint_set_eval(state_t *st, int64_t checkpoint_id, double logloss, double auc)
{
    const char *what = "recording a checkpoint's eval figures";
    int rc;
    STATE_WRITE(
        st, what, rc,
        state_found(state_update(st, STMT_CKPT_SET_EVAL, what, "Inn", checkpoint_id, logloss, auc),
                    "no checkpoint with id %lld", (long long)checkpoint_id));
    return rc;
}

/* ---- exports ----------------------------------------------------------------------- */

int state_export_add(state_t *st, int64_t checkpoint_id, int64_t base_checkpoint_id,
                     const char *format, const char *path, int64_t bytes, int64_t *id)
{
    if (format == NULL || path == NULL)
        return kiln_errf(KILN_EINVAL, "an export needs a format and a path");
    int64_t nid = 0;
    int rc;
    STATE_WRITE(st, "recording an export", rc,
                state_insert(st, STMT_EXPORT_INSERT, "record an export", &nid, "IJttII",
                             checkpoint_id, base_checkpoint_id, format, path, bytes, kiln_now_s()));
    if (rc == 0 && id != NULL)
        *id = nid;
    return rc;
}

/* ---- the scheduler's change detector and lineage queries ----------------------------- */

int state_data_version(state_t *st, int64_t *out)
{
    int rc =
        state_row_get(st, STMT_DATA_VERSION, "reading the data version", &state_i64_row, out, "");
    return rc < 0 ? rc : 0;
}

int state_checkpoint_get_by_id(state_t *st, int64_t id, state_checkpoint_t *out)
{
    int rc = state_row_get(st, STMT_CKPT_GET_BY_ID, "reading a checkpoint", &state_ckpt_row, out,
                           "I", id);
    return state_found(rc, "no checkpoint with id %lld", (long long)id);
}

int state_checkpoint_list_by_run(state_t *st, int64_t run_id, state_checkpoint_t **out, size_t *n)
{
    return state_rows_list(st, STMT_CKPT_LIST_RUN, "listing checkpoints", &state_ckpt_row,
                           (void **)out, n, "I", run_id);
}
