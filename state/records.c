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

int state_insert_one(state_t *st, sqlite3_stmt *s, const char *what, int64_t *id)
{
    int rc = state_exec(st, s, what);
    if (rc < 0 && st->last_sqlite_rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        return kiln_errf(KILN_ENOENT,
                         "cannot %s: it refers to a run, checkpoint, export or "
                         "endpoint that does not exist",
                         what);
    if (rc == 0 && id != NULL)
        *id = sqlite3_last_insert_rowid(st->db);
    return rc;
}

static int insert_one(state_t *st, sqlite3_stmt *s, const char *what, int64_t *id)
{
    return state_insert_one(st, s, what, id);
}

/* ---- inputs ------------------------------------------------------------------------ */

typedef struct {
    int64_t run_id;
    const state_input_t *in;
} input_add_t;

static int input_add_tx(state_t *st, const input_add_t *a)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "record a run input";
    KILN_CHECK_GOTO(state_stmt(st, STMT_INPUT_INSERT, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "ItIIt", a->run_id, a->in->path, a->in->size,
                               a->in->mtime, a->in->checksum),
                    rc, out);
    rc = insert_one(st, s, what, NULL);
out:
    state_stmt_done(s);
    return rc;
}

int state_input_add(state_t *st, int64_t run_id, const state_input_t *in)
{
    if (in == NULL || in->path == NULL)
        return kiln_errf(KILN_EINVAL, "an input needs a path");
    input_add_t a = {run_id, in};
    int rc;
    STATE_WRITE(st, "recording a run input", rc, input_add_tx(st, &a));
    return rc;
}

void state_inputs_free(state_input_t *ins, size_t n)
{
    for (size_t i = 0; ins != NULL && i < n; i++) {
        free(ins[i].path);
        free(ins[i].checksum);
    }
    free(ins);
}

static int read_input(sqlite3_stmt *s, void *item)
{
    state_input_t *in = item;
    in->size = state_col_i64(s, 1);
    in->mtime = state_col_i64(s, 2);
    KILN_CHECK(state_col_str(s, 0, &in->path));
    return state_col_str(s, 3, &in->checksum);
}

static int input_list_tx(state_t *st, int64_t run_id, state_input_t **out, size_t *n)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "listing run inputs";
    KILN_CHECK_GOTO(state_stmt(st, STMT_INPUT_LIST, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "I", run_id), rc, out);
    rc = state_collect(st, s, what, sizeof **out, read_input, (void **)out, n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        state_inputs_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_input_list(state_t *st, int64_t run_id, state_input_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    STATE_READ(st, "listing run inputs", rc, input_list_tx(st, run_id, out, n));
    return rc;
}

static int input_consumed_tx(state_t *st, int64_t job_id, const state_input_t *in, bool *consumed)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "checking whether an input was consumed";
    KILN_CHECK_GOTO(state_stmt(st, STMT_INPUT_CONSUMED, &s), rc, out);
    KILN_CHECK_GOTO(
        state_bind(st, s, what, "ItIIt", job_id, in->path, in->size, in->mtime, in->checksum), rc,
        out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    *consumed = rc == 1;
    rc = 0;
out:
    state_stmt_done(s);
    return rc;
}

int state_input_consumed(state_t *st, int64_t job_id, const state_input_t *in, bool *consumed)
{
    int rc;
    *consumed = false;
    if (in == NULL || in->path == NULL)
        return kiln_errf(KILN_EINVAL, "an input needs a path");
    STATE_READ(st, "checking whether an input was consumed", rc,
               input_consumed_tx(st, job_id, in, consumed));
    return rc;
}

static int inputs_cover_tx(state_t *st, int64_t run_id, int64_t ckpt_id)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "marking an online run's inputs as covered";
    KILN_CHECK_GOTO(state_stmt(st, STMT_INPUT_COVER, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "II", run_id, ckpt_id), rc, out);
    rc = insert_one(st, s, what, NULL);
out:
    state_stmt_done(s);
    return rc;
}

int state_inputs_cover(state_t *st, int64_t run_id, int64_t checkpoint_id)
{
    int rc;
    STATE_WRITE(st, "marking an online run's inputs as covered", rc,
                inputs_cover_tx(st, run_id, checkpoint_id));
    return rc;
}

typedef struct {
    const char *path;
    int limit;
    int64_t *ids;
    size_t n;
} input_runs_t;

static int input_runs_tx(state_t *st, input_runs_t *q)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "finding the runs that read a file";
    q->n = 0;
    KILN_CHECK_GOTO(state_stmt(st, STMT_INPUT_RUNS, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "ti", q->path, q->limit), rc, out);
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

int state_input_runs(state_t *st, const char *path, int limit, int64_t **run_ids, size_t *n)
{
    *run_ids = NULL;
    *n = 0;
    if (path == NULL)
        return kiln_errf(KILN_EINVAL, "no input path given");
    if (limit < 1 || limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "asked for %d runs; 1 to %d", limit, STATE_PAGE_MAX);
    input_runs_t q = {path, limit, kiln_calloc((size_t)limit, sizeof(int64_t)), 0};
    if (q.ids == NULL)
        return KILN_ENOMEM;
    int rc;
    STATE_READ(st, "finding the runs that read a file", rc, input_runs_tx(st, &q));
    if (rc < 0) {
        free(q.ids);
        return rc;
    }
    *run_ids = q.ids;
    *n = q.n;
    return 0;
}

/* ---- metrics ----------------------------------------------------------------------- */

typedef struct {
    int64_t run_id, step;
    const char *name;
    double value;
} metric_add_t;

static int metric_add_tx(state_t *st, const metric_add_t *m)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "record a metric";
    KILN_CHECK_GOTO(state_stmt(st, STMT_METRIC_INSERT, &s), rc, out);
    KILN_CHECK_GOTO(
        state_bind(st, s, what, "IItdI", m->run_id, m->step, m->name, m->value, kiln_now_s()), rc,
        out);
    rc = insert_one(st, s, what, NULL);
out:
    state_stmt_done(s);
    return rc;
}

int state_metric_add(state_t *st, int64_t run_id, int64_t step, const char *name, double value)
{
    if (name == NULL || name[0] == '\0')
        return kiln_errf(KILN_EINVAL, "a metric needs a name");
    metric_add_t m = {run_id, step, name, value};
    int rc;
    STATE_WRITE(st, "recording a metric", rc, metric_add_tx(st, &m));
    return rc;
}

static int read_metric(sqlite3_stmt *s, void *item)
{
    state_metric_t *m = item;
    m->step = state_col_i64(s, 0);
    /* SQLite stores NaN as NULL; give it back as NaN. */
    m->value = sqlite3_column_type(s, 1) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 1);
    m->at = state_col_i64(s, 2);
    return 0;
}

static int metric_series_tx(state_t *st, int64_t run_id, const char *name, state_metric_t **out,
                            size_t *n)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "reading a metric series";
    KILN_CHECK_GOTO(state_stmt(st, STMT_METRIC_SERIES, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "It", run_id, name), rc, out);
    rc = state_collect(st, s, what, sizeof **out, read_metric, (void **)out, n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_metric_series(state_t *st, int64_t run_id, const char *name, state_metric_t **out,
                        size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    if (name == NULL)
        return kiln_errf(KILN_EINVAL, "no metric name given");
    STATE_READ(st, "reading a metric series", rc, metric_series_tx(st, run_id, name, out, n));
    return rc;
}

/* ---- checkpoints ------------------------------------------------------------------- */

static int read_ckpt(sqlite3_stmt *s, state_checkpoint_t *c)
{
    memset(c, 0, sizeof *c);
    c->id = state_col_i64(s, 0);
    c->run_id = state_col_i64(s, 2);
    c->parent_id = state_col_i64(s, 3);
    c->step = state_col_i64(s, 6);
    c->keys = state_col_i64(s, 7);
    c->bytes = state_col_i64(s, 8);
    c->created_at = state_col_i64(s, 10);
    c->has_eval = sqlite3_column_type(s, 11) != SQLITE_NULL;
    c->eval_logloss = sqlite3_column_type(s, 11) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 11);
    c->eval_auc = sqlite3_column_type(s, 12) == SQLITE_NULL ? NAN : sqlite3_column_double(s, 12);
    c->online = sqlite3_column_int(s, 13) != 0;
    if (state_col_str(s, 1, &c->uid) < 0 || state_col_str(s, 4, &c->kind) < 0 ||
        state_col_str(s, 5, &c->path) < 0 || state_col_str(s, 9, &c->checksum) < 0) {
        state_checkpoint_fini(c);
        return KILN_ENOMEM;
    }
    return 0;
}

void state_checkpoint_fini(state_checkpoint_t *c)
{
    if (c == NULL)
        return;
    free(c->uid);
    free(c->kind);
    free(c->path);
    free(c->checksum);
    memset(c, 0, sizeof *c);
}

static int ckpt_add_tx(state_t *st, const state_checkpoint_t *c, int64_t *id)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "record a checkpoint";
    KILN_CHECK_GOTO(state_stmt(st, STMT_CKPT_INSERT, &s), rc, out);
    /* The eval figures only when measured (SQL NULL otherwise). */
    KILN_CHECK_GOTO(state_bind(st, s, what, "tJJttIIItIbnn", c->uid, c->run_id, c->parent_id,
                               c->kind, c->path, c->step, c->keys, c->bytes, c->checksum,
                               c->created_at != 0 ? c->created_at : kiln_now_s(), c->online,
                               c->has_eval ? c->eval_logloss : NAN,
                               c->has_eval ? c->eval_auc : NAN),
                    rc, out);
    rc = insert_one(st, s, what, id);
    if (rc < 0 && st->last_sqlite_rc == SQLITE_CONSTRAINT_UNIQUE)
        rc = kiln_errf(KILN_EEXIST, "checkpoint %s is already recorded", c->uid);
out:
    state_stmt_done(s);
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

static int ckpt_get_tx(state_t *st, state_stmt_id_t id, const char *uid, int64_t job_id,
                       state_checkpoint_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "reading a checkpoint";
    KILN_CHECK_GOTO(state_stmt(st, id, &s), rc, out);
    if (uid != NULL)
        KILN_CHECK_GOTO(state_bind(st, s, what, "t", uid), rc, out);
    else
        KILN_CHECK_GOTO(state_bind(st, s, what, "I", job_id), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 0) {
        rc = uid != NULL
                 ? kiln_errf(KILN_ENOENT, "no checkpoint %s", uid)
                 : kiln_errf(KILN_ENOENT, "job %lld has no checkpoints yet", (long long)job_id);
        goto out;
    }
    rc = read_ckpt(s, out);
out:
    state_stmt_done(s);
    return rc;
}

int state_checkpoint_get(state_t *st, const char *uid, state_checkpoint_t *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    if (uid == NULL)
        return kiln_errf(KILN_EINVAL, "no checkpoint uid given");
    STATE_READ(st, "reading a checkpoint", rc, ckpt_get_tx(st, STMT_CKPT_GET, uid, 0, out));
    return rc;
}

static int ckpt_newest_tx(state_t *st, int64_t run_id, bool online, state_checkpoint_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "reading a run's newest checkpoint";
    KILN_CHECK_GOTO(state_stmt(st, STMT_CKPT_NEWEST_RUN, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "Ib", run_id, online), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 0) {
        rc = kiln_errf(KILN_ENOENT, "run %lld recorded no %scheckpoint", (long long)run_id,
                       online ? "online " : "");
        goto out;
    }
    rc = read_ckpt(s, out);
out:
    state_stmt_done(s);
    return rc;
}

int state_checkpoint_newest_of_run(state_t *st, int64_t run_id, bool online_only,
                                   state_checkpoint_t *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    STATE_READ(st, "reading a run's newest checkpoint", rc,
               ckpt_newest_tx(st, run_id, online_only, out));
    return rc;
}

int state_checkpoint_latest(state_t *st, int64_t job_id, state_checkpoint_t *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    STATE_READ(st, "reading a checkpoint", rc,
               ckpt_get_tx(st, STMT_CKPT_LATEST, NULL, job_id, out));
    return rc;
}

typedef struct {
    int64_t id;
    double logloss, auc;
} ckpt_eval_t;

static int ckpt_set_eval_tx(state_t *st, const ckpt_eval_t *e)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "recording a checkpoint's eval figures";
    KILN_CHECK_GOTO(state_stmt(st, STMT_CKPT_SET_EVAL, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "Inn", e->id, e->logloss, e->auc), rc, out);
    KILN_CHECK_GOTO(state_exec(st, s, what), rc, out);
    if (sqlite3_changes(st->db) == 0)
        rc = kiln_errf(KILN_ENOENT, "no checkpoint with id %lld", (long long)e->id);
out:
    state_stmt_done(s);
    return rc;
}

int state_checkpoint_set_eval(state_t *st, int64_t checkpoint_id, double logloss, double auc)
{
    ckpt_eval_t e = {checkpoint_id, logloss, auc};
    int rc;
    STATE_WRITE(st, "recording a checkpoint's eval figures", rc, ckpt_set_eval_tx(st, &e));
    return rc;
}

/* ---- exports ----------------------------------------------------------------------- */

typedef struct {
    int64_t checkpoint_id, base_id;
    const char *format, *path;
    int64_t bytes;
} export_add_t;

static int export_add_tx(state_t *st, const export_add_t *e, int64_t *id)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "record an export";
    KILN_CHECK_GOTO(state_stmt(st, STMT_EXPORT_INSERT, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "IJttII", e->checkpoint_id, e->base_id, e->format,
                               e->path, e->bytes, kiln_now_s()),
                    rc, out);
    rc = insert_one(st, s, what, id);
out:
    state_stmt_done(s);
    return rc;
}

int state_export_add(state_t *st, int64_t checkpoint_id, int64_t base_checkpoint_id,
                     const char *format, const char *path, int64_t bytes, int64_t *id)
{
    if (format == NULL || path == NULL)
        return kiln_errf(KILN_EINVAL, "an export needs a format and a path");
    export_add_t e = {checkpoint_id, base_checkpoint_id, format, path, bytes};
    int64_t nid = 0;
    int rc;
    STATE_WRITE(st, "recording an export", rc, export_add_tx(st, &e, &nid));
    if (rc == 0 && id != NULL)
        *id = nid;
    return rc;
}

/* ---- the scheduler's change detector and lineage queries ----------------------------- */

static int data_version_tx(state_t *st, int64_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc;
    KILN_CHECK_GOTO(state_stmt(st, STMT_DATA_VERSION, &s), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, "reading the data version"), rc, out);
    *out = rc == 1 ? state_col_i64(s, 0) : 0;
    rc = 0;
out:
    state_stmt_done(s);
    return rc;
}

int state_data_version(state_t *st, int64_t *out)
{
    int rc;
    STATE_READ(st, "reading the data version", rc, data_version_tx(st, out));
    return rc;
}

static int ckpt_by_id_tx(state_t *st, int64_t id, state_checkpoint_t *out)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "reading a checkpoint";
    KILN_CHECK_GOTO(state_stmt(st, STMT_CKPT_GET_BY_ID, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "I", id), rc, out);
    KILN_CHECK_GOTO(state_step(st, s, what), rc, out);
    if (rc == 0) {
        rc = kiln_errf(KILN_ENOENT, "no checkpoint with id %lld", (long long)id);
        goto out;
    }
    rc = read_ckpt(s, out);
out:
    state_stmt_done(s);
    return rc;
}

int state_checkpoint_get_by_id(state_t *st, int64_t id, state_checkpoint_t *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    STATE_READ(st, "reading a checkpoint", rc, ckpt_by_id_tx(st, id, out));
    return rc;
}

void state_checkpoints_free(state_checkpoint_t *cs, size_t n)
{
    for (size_t i = 0; cs != NULL && i < n; i++)
        state_checkpoint_fini(&cs[i]);
    free(cs);
}

static int read_ckpt_row(sqlite3_stmt *s, void *item) { return read_ckpt(s, item); }

static int ckpt_list_run_tx(state_t *st, int64_t run_id, state_checkpoint_t **out, size_t *n)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const char *what = "listing checkpoints";
    KILN_CHECK_GOTO(state_stmt(st, STMT_CKPT_LIST_RUN, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "I", run_id), rc, out);
    rc = state_collect(st, s, what, sizeof **out, read_ckpt_row, (void **)out, n);
out:
    state_stmt_done(s);
    if (rc < 0) {
        state_checkpoints_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_checkpoint_list_by_run(state_t *st, int64_t run_id, state_checkpoint_t **out, size_t *n)
{
    int rc;
    *out = NULL;
    *n = 0;
    STATE_READ(st, "listing checkpoints", rc, ckpt_list_run_tx(st, run_id, out, n));
    return rc;
}
