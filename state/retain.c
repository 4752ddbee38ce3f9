/*
 * state/retain.c - retention (kilnd --keep-runs): old runs are compacted, not
 * kept whole, and what a compacted run kept goes once nothing needs it.
 *
 * A run that ended long ago is worth little but what correctness needs: the
 * inputs it consumed (else the data looks new and is trained twice), the
 * checkpoints a chain, an endpoint or a whole run stands on. Everything else
 * of it (events, loss points, its Slurm record, its log) goes at compaction.
 * What it kept goes later, as the reasons end: a consumed input once its file
 * is gone from disk (rotated away: it cannot come back as new data), a
 * checkpoint once nothing needs it (a newer full ends an incremental chain)
 * and its files are gone (checkpoint.keep removes them; the row stays while
 * they do, so the database never forgets a checkpoint a resume could find on
 * disk). A compacted run with nothing left is removed.
 *
 * An incremental job that pushes every run used to keep every run whole:
 * each consumed data and wrote a chained checkpoint (issue 27's soak: 3.2 KB
 * a run, without end). Each step is a transaction of at most `limit` rows,
 * so kilnd's loop and the CLI never wait long for the file.
 */
#include "state_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t id;
    char *path;
} id_path_t;
static const state_col_t id_path_cols[] = {
    STATE_COL(id_path_t, id),
    STATE_COL(id_path_t, path),
};
static const state_row_t id_path_row = STATE_ROW(id_path_t, id_path_cols, NULL);

/* The statements that compact one run, in order. */
static const state_stmt_id_t compact_stmts[] = {
    STMT_RETAIN_RUN_EVENTS,
    STMT_RETAIN_RUN_METRICS,
    STMT_RETAIN_RUN_SLURM,
    STMT_RETAIN_RUN_UNCONSUMED,
};

void state_retain_fini(state_retain_t *r)
{
    if (r == NULL)
        return;
    kiln_strv_free(r->run_dirs, r->ndirs);
    r->run_dirs = NULL;
    r->ndirs = 0;
    r->compacted = r->events = r->inputs = r->checkpoints = r->removed = 0;
    r->more = false;
}

static bool is_gone(const state_retain_t *r, const char *path)
{
    return r->gone != NULL && path != NULL && r->gone(path, r->ctx);
}

/* Step 1: compacts up to limit old runs and prunes old job events. */
static int compact_tx(state_t *st, state_retain_t *r)
{
    const char *what = "compacting old runs";
    id_path_t *rs = NULL;
    size_t n = 0;
    for (size_t i = 0; i < r->ndirs; i++) /* a rerun after a busy file starts over */
        free(r->run_dirs[i]);
    r->ndirs = 0;
    r->compacted = r->events = 0;
    int rc = state_rows_query(st, STMT_RETAIN_COMPACTABLE, what, &id_path_row, (void **)&rs, &n,
                              "Ii", r->before, r->limit);
    KILN_CHECK(rc);
    char **dirs = realloc(r->run_dirs, (n + 1) * sizeof *dirs);
    if (dirs == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    r->run_dirs = dirs;
    int64_t now = kiln_now_s();
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof compact_stmts / sizeof compact_stmts[0]; k++)
            KILN_CHECK_GOTO(state_update(st, compact_stmts[k], what, "I", rs[i].id), rc, out);
        KILN_CHECK_GOTO(state_update(st, STMT_RETAIN_RUN_MARK, what, "II", rs[i].id, now), rc, out);
        r->compacted++;
        if (rs[i].path != NULL) {
            r->run_dirs[r->ndirs++] = rs[i].path;
            rs[i].path = NULL;
        }
    }
    KILN_CHECK_GOTO(state_update(st, STMT_EVENT_PRUNE, what, "Ii", r->before, r->limit), rc, out);
    r->events = rc;
    r->more |= (int64_t)n == r->limit || rc == r->limit;
    rc = 0;
out:
    state_rows_free(&id_path_row, rs, n);
    return rc;
}

/* Steps 2 and 3 walk what compacted runs kept, newest first from a cursor,
 * and drop each row whose file is gone and that the listing still offers:
 * list gives (id, path) below ?1, at most ?2; drop runs on each such row's
 * id, in order, the last statement's count saying whether it went. */
typedef struct {
    const char *what;
    state_stmt_id_t list;
    const state_stmt_id_t *drop;
    size_t ndrop;
} sweep_t;

/* The statements that remove one checkpoint, in order: what refers to it
 * first, the row last (kept while an incremental still names it). */
static const state_stmt_id_t ckpt_drop[] = {
    STMT_RETAIN_CKPT_UNHOLD,  STMT_RETAIN_CKPT_HOLDINGS, STMT_RETAIN_CKPT_UNEXPORT,
    STMT_RETAIN_CKPT_PUSHES,  STMT_RETAIN_CKPT_EXPORTS,  STMT_RETAIN_CKPT_UNBASE,
    STMT_RETAIN_CKPT_UNSTART, STMT_RETAIN_CKPT_UNPARENT, STMT_RETAIN_CKPT_DELETE,
};
static const state_stmt_id_t input_drop[] = {STMT_RETAIN_INPUT_DROP};

static const sweep_t sweep_inputs = {"dropping the inputs of files that are gone",
                                     STMT_RETAIN_INPUTS_KEPT, input_drop,
                                     sizeof input_drop / sizeof input_drop[0]};
static const sweep_t sweep_checkpoints = {"dropping checkpoints nothing needs",
                                          STMT_RETAIN_CKPT_UNNEEDED, ckpt_drop,
                                          sizeof ckpt_drop / sizeof ckpt_drop[0]};

/* One batch of a sweep from *cursor (0: the top); *cursor gets where the
 * next batch starts (0 at the end), *dropped how many rows went. */
static int sweep_tx(state_t *st, const state_retain_t *r, const sweep_t *w, int64_t *cursor,
                    int64_t *dropped, bool *more)
{
    id_path_t *rows = NULL;
    size_t n = 0;
    int64_t from = *cursor > 0 ? *cursor : INT64_MAX;
    *dropped = 0;
    int rc = state_rows_query(st, w->list, w->what, &id_path_row, (void **)&rows, &n, "Ii", from,
                              r->limit);
    KILN_CHECK(rc);
    for (size_t i = 0; i < n; i++) {
        from = rows[i].id;
        if (!is_gone(r, rows[i].path))
            continue;
        for (size_t k = 0; k < w->ndrop; k++)
            KILN_CHECK_GOTO(state_update(st, w->drop[k], w->what, "I", rows[i].id), rc, out);
        *dropped += rc;
    }
    /* At the end the next pass starts over; a full batch that dropped
     * nothing does not hurry the next. */
    *cursor = (int64_t)n < r->limit ? 0 : from;
    *more = (int64_t)n == r->limit && *dropped > 0;
    rc = 0;
out:
    state_rows_free(&id_path_row, rows, n);
    return rc;
}

/* Step 4: compacted runs with nothing left. */
static int remove_tx(state_t *st, state_retain_t *r)
{
    const char *what = "removing compacted runs";
    int64_t *ids = NULL;
    size_t n = 0;
    r->removed = 0;
    int rc = state_rows_query(st, STMT_RETAIN_REMOVABLE, what, &state_i64_row, (void **)&ids, &n,
                              "i", r->limit);
    KILN_CHECK(rc);
    for (size_t i = 0; i < n; i++) {
        /* A retry outlives the attempt it retried when it is still needed. */
        KILN_CHECK_GOTO(state_update(st, STMT_RUN_UNLINK_RETRIES, what, "I", ids[i]), rc, out);
        KILN_CHECK_GOTO(state_update(st, STMT_RUN_DELETE, what, "I", ids[i]), rc, out);
        r->removed += rc;
    }
    r->more |= (int64_t)n == r->limit;
    rc = 0;
out:
    free(ids);
    return rc;
}

int state_retain_pass(state_t *st, state_retain_t *r)
{
    int rc;
    state_retain_fini(r);
    if (r->limit < 1 || r->limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "a retention step takes 1 to %d rows, not %d", STATE_PAGE_MAX,
                         r->limit);
    STATE_WRITE(st, "compacting old runs", rc, compact_tx(st, r));
    if (rc < 0)
        return rc;
    const sweep_t *sweeps[] = {&sweep_inputs, &sweep_checkpoints};
    int64_t *cursors[] = {&r->input_below, &r->ckpt_below};
    int64_t *counts[] = {&r->inputs, &r->checkpoints};
    for (size_t k = 0; k < sizeof sweeps / sizeof sweeps[0]; k++) {
        int64_t cursor = *cursors[k];
        bool more = false;
        STATE_WRITE(st, sweeps[k]->what, rc,
                    sweep_tx(st, r, sweeps[k], &cursor, counts[k], &more));
        if (rc < 0)
            return rc;
        *cursors[k] = cursor;
        r->more |= more;
    }
    STATE_WRITE(st, "removing compacted runs", rc, remove_tx(st, r));
    return rc;
}
