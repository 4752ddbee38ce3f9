/*
 * state/pushes.c - what serves what: endpoints (url, model, label) with the
 * numbers last read from their /v1/stats, the push queue (a push is the
 * intent to make one endpoint hold one checkpoint: queued, claimed by one
 * deliverer under a lease, ended succeeded, failed, superseded or held, or
 * sent back to pending with a backoff), what each endpoint holds (now and
 * since when) as the result, and the pushes and exports of a checkpoint for
 * lineage. docs/state.md ("The push queue") tells the rules.
 */
#include "state_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names ----------------------------------------------------------------------- */

static const char *const push_state_names[STATE_PUSH_NSTATES] = {
#define STATE_PUSH_NAME(name, str) str,
    STATE_PUSH_STATES(STATE_PUSH_NAME)
#undef STATE_PUSH_NAME
};

const char *state_push_state_name(state_push_state_t s)
{
    return (int)s >= 0 && s < STATE_PUSH_NSTATES ? push_state_names[s] : "?";
}

int state_push_state_parse(const char *s, state_push_state_t *out)
{
    for (int i = 0; i < STATE_PUSH_NSTATES; i++)
        if (s != NULL && strcmp(s, push_state_names[i]) == 0) {
            *out = (state_push_state_t)i;
            return 0;
        }
    return kiln_errf(KILN_EINVAL, "unknown push state '%s' (pending, sending, succeeded, failed, "
                                  "superseded, held)",
                     s != NULL ? s : "(null)");
}

bool state_push_state_ended(state_push_state_t s)
{
    return s == STATE_PUSH_SUCCEEDED || s == STATE_PUSH_FAILED || s == STATE_PUSH_SUPERSEDED ||
           s == STATE_PUSH_HELD;
}

/* ---- endpoints --------------------------------------------------------------------- */

int state_endpoint_put_tx(state_t *st, const state_endpoint_ref_t *e, int64_t *id)
{
    const char *what = "record an endpoint";
    int rc = state_row_query(st, STMT_ENDPOINT_FIND, what, &state_i64_row, id, "ttt", e->url,
                             e->model, e->label);
    if (rc != 0)
        return rc < 0 ? rc : 0; /* an error, or the endpoint is recorded */
    return state_insert(st, STMT_ENDPOINT_INSERT, what, id, "tttI", e->url, e->model, e->label,
                        kiln_now_s());
}

int state_endpoint_put(state_t *st, const char *url, const char *model, const char *label,
                       int64_t *id)
{
    if (url == NULL || url[0] == '\0')
        return kiln_errf(KILN_EINVAL, "an endpoint needs a URL");
    state_endpoint_ref_t e = {url, model != NULL ? model : "", label != NULL ? label : ""};
    int64_t nid = 0;
    int rc;
    STATE_WRITE(st, "recording an endpoint", rc, state_endpoint_put_tx(st, &e, &nid));
    if (rc == 0 && id != NULL)
        *id = nid;
    return rc;
}

static int holding_tx(state_t *st, int64_t endpoint_id, int64_t *ckpt, int64_t *since)
{
    sqlite3_stmt *s = NULL;
    int rc = state_first_row(st, STMT_HOLDING_CURRENT, "reading what an endpoint holds", &s, "I",
                             endpoint_id);
    rc = state_found(rc, "endpoint %lld holds no checkpoint yet (no push to it has succeeded)",
                     (long long)endpoint_id);
    if (rc == 0) {
        *ckpt = state_col_i64(s, 0);
        *since = state_col_i64(s, 1);
    }
    state_stmt_done(s);
    return rc;
}

int state_endpoint_holding(state_t *st, int64_t endpoint_id, int64_t *checkpoint_id, int64_t *since)
{
    int64_t c = 0, t = 0;
    int rc;
    STATE_READ(st, "reading what an endpoint holds", rc, holding_tx(st, endpoint_id, &c, &t));
    *checkpoint_id = c;
    if (since != NULL)
        *since = t;
    return rc;
}

/* The endpoint now holds ckpt (a push of it succeeded): close the current
 * span unless it is the same checkpoint, and open a new one. */
static int hold_tx(state_t *st, int64_t endpoint_id, int64_t ckpt, int64_t push_id, int64_t now)
{
    int64_t held = 0, since = 0;
    const char *what = "recording what an endpoint holds";
    int rc = holding_tx(st, endpoint_id, &held, &since);
    if (rc < 0 && rc != KILN_ENOENT)
        return rc;
    if (rc == 0 && held == ckpt)
        return 0;
    KILN_CHECK(state_update(st, STMT_HOLDING_CLOSE, what, "II", endpoint_id, now));
    return state_insert(st, STMT_HOLDING_INSERT, what, NULL, "IIII", endpoint_id, ckpt, push_id,
                        now);
}

int state_endpoint_set_stats(state_t *st, int64_t endpoint_id, const state_endpoint_stats_t *x)
{
    const char *what = "recording an endpoint's stats";
    int rc;
    STATE_WRITE(
        st, what, rc,
        state_found(state_update(st, STMT_ENDPOINT_SET_STATS, what, "IIIInt", endpoint_id, x->at,
                                 x->predict_requests, x->predict_rows, x->request_rate, x->error),
                    "no endpoint %lld", (long long)endpoint_id));
    return rc;
}

int state_endpoint_find(state_t *st, const char *url, const char *model, const char *label,
                        int64_t *id)
{
    if (url == NULL)
        return kiln_errf(KILN_EINVAL, "no endpoint URL given");
    int rc = state_row_get(st, STMT_ENDPOINT_BY_URL, "finding an endpoint", &state_i64_row, id,
                           "ttt", url, model, label);
    return state_found(rc, "no endpoint %s%s%s%s%s is recorded (nothing was pushed to it)", url,
                       model ? " for model " : "", model ? model : "", label ? " label " : "",
                       label ? label : "");
}

/* ---- reading pushes -------------------------------------------------------------- */

const char *state_push_mode_name(const state_push_t *p)
{
    bool full = p->export_id > 0 ? p->sent_full : p->full;
    return full ? "full" : "delta";
}

/* The push's mode, state and the format it sent, stored by name. */
static int read_push_names(sqlite3_stmt *s, void *row)
{
    state_push_t *p = row;
    const char *mode = (const char *)sqlite3_column_text(s, 12);
    p->full = mode != NULL && strcmp(mode, "full") == 0;
    if (state_push_state_parse((const char *)sqlite3_column_text(s, 14), &p->state) < 0)
        return kiln_errf(KILN_ECORRUPT, "push %lld has an unknown state in the database",
                         (long long)p->id);
    const char *sent = (const char *)sqlite3_column_text(s, 27);
    p->sent_full = sent != NULL && strcmp(sent, "push-full") == 0;
    return 0;
}

/* A row of STATE_PUSH_COLS. */
static const state_col_t push_cols[] = {
    STATE_COL(state_push_t, id),
    STATE_COL(state_push_t, job_id),
    STATE_COL(state_push_t, run_id),
    STATE_COL(state_push_t, checkpoint_id),
    STATE_COL(state_push_t, endpoint_id),
    STATE_COL(state_push_t, export_id),
    STATE_COL(state_push_t, job_name),
    STATE_COL(state_push_t, checkpoint_uid),
    STATE_COL(state_push_t, checkpoint_path),
    STATE_COL(state_push_t, url),
    STATE_COL(state_push_t, model),
    STATE_COL(state_push_t, label),
    STATE_COL_SKIPPED, /* mode */
    STATE_COL(state_push_t, reason),
    STATE_COL_SKIPPED, /* state */
    STATE_COL(state_push_t, http_status),
    STATE_COL(state_push_t, error),
    STATE_COL(state_push_t, attempts),
    STATE_COL(state_push_t, rounds),
    STATE_COL(state_push_t, not_before_ms),
    STATE_COL(state_push_t, claimed_by),
    STATE_COL(state_push_t, lease_until_ms),
    STATE_COL(state_push_t, token_env),
    STATE_COL(state_push_t, created_at),
    STATE_COL(state_push_t, started_at),
    STATE_COL(state_push_t, ended_at),
    STATE_COL(state_push_t, gated),
    STATE_COL_SKIPPED, /* the format of the export it sent */
};
static const state_row_t push_row = STATE_ROW(state_push_t, push_cols, read_push_names);

void state_push_fini(state_push_t *p)
{
    state_row_fini(&push_row, p);
}

void state_pushes_free(state_push_t *ps, size_t n)
{
    state_rows_free(&push_row, ps, n);
}

int state_push_get(state_t *st, int64_t push_id, state_push_t *out)
{
    int rc = state_row_get(st, STMT_PUSH_GET, "reading a push", &push_row, out, "I", push_id);
    return state_found(rc, "no push %lld", (long long)push_id);
}

static int push_list_tx(state_t *st, const state_push_filter_t *f, int limit, state_push_t **out,
                        size_t *n)
{
    /* One statement per filter, each along its own index. */
    state_stmt_id_t id = STMT_PUSH_LIST_ALL;
    int64_t key = 0;
    if (f->run_id > 0)
        id = STMT_PUSH_LIST_RUN, key = f->run_id;
    else if (f->checkpoint_id > 0)
        id = STMT_PUSH_LIST_CKPT, key = f->checkpoint_id;
    else if (f->endpoint_id > 0)
        id = STMT_PUSH_LIST_ENDPOINT, key = f->endpoint_id;
    else if (f->job_id > 0)
        id = STMT_PUSH_LIST_JOB, key = f->job_id;
    return state_rows_query(st, id, "listing pushes", &push_row, (void **)out, n, "Iii", key,
                            f->open_only ? 1 : 0, limit);
}

int state_push_list(state_t *st, const state_push_filter_t *f, int limit, state_push_t **out,
                    size_t *n)
{
    *out = NULL;
    *n = 0;
    if (limit < 1 || limit > STATE_PAGE_MAX)
        return kiln_errf(KILN_EINVAL, "asked for %d pushes; 1 to %d", limit, STATE_PAGE_MAX);
    state_push_filter_t none = {0};
    int rc;
    STATE_READ(st, "listing pushes", rc, push_list_tx(st, f != NULL ? f : &none, limit, out, n));
    return rc;
}

/* ---- queuing ----------------------------------------------------------------------- */

/* Supersedes the pending pushes to endpoint_id older than push newest. */
static int supersede_older_tx(state_t *st, int64_t endpoint_id, int64_t newest, int64_t now)
{
    sqlite3_stmt *s = NULL;
    int64_t ids[64];
    size_t n = 0;
    int rc;
    const char *what = "superseding older pushes";
    KILN_CHECK_GOTO(state_stmt(st, STMT_PUSH_PENDING_TO, &s), rc, out);
    KILN_CHECK_GOTO(state_bind(st, s, what, "II", endpoint_id, newest), rc, out);
    KILN_CHECK_GOTO(state_step_ids(st, s, what, ids, sizeof ids / sizeof ids[0], &n), rc, out);
    state_stmt_done(s);
    s = NULL;
    char why[96];
    snprintf(why, sizeof why, "superseded by push %lld before it went out", (long long)newest);
    for (size_t i = 0; i < n; i++)
        KILN_CHECK_GOTO(state_update(st, STMT_PUSH_SUPERSEDE, what, "IIt", ids[i], now, why), rc,
                        out);
    rc = 0;
out:
    state_stmt_done(s);
    return rc;
}

int state_push_enqueue_tx(state_t *st, int64_t job_id, int64_t run_id,
                          const state_push_req_t *reqs, size_t n, const char *claimer,
                          int64_t lease_ms, int64_t *ids)
{
    const char *what = "queue a push";
    int64_t now = kiln_now_s(), now_ms = kiln_now_ms();
    for (size_t i = 0; i < n; i++) {
        const state_push_req_t *q = &reqs[i];
        if (q->url == NULL || q->url[0] == '\0' || q->checkpoint_id <= 0)
            return kiln_errf(KILN_EINVAL, "a push needs an endpoint URL and a checkpoint");
        state_endpoint_ref_t e = {q->url, q->model != NULL ? q->model : "",
                            q->label != NULL ? q->label : ""};
        int64_t ep = 0, id = 0;
        KILN_CHECK(state_endpoint_put_tx(st, &e, &ep));
        KILN_CHECK(state_insert(st, STMT_PUSH_INSERT, what, &id, "JJIIttttItIIb", job_id, run_id,
                                q->checkpoint_id, ep, q->full ? "full" : "incremental",
                                q->reason != NULL ? q->reason : "",
                                claimer != NULL ? "sending" : "pending", claimer,
                                claimer != NULL ? now_ms + lease_ms : 0, q->token_env, now,
                                claimer != NULL ? now : 0, !q->no_gate));
        KILN_CHECK(supersede_older_tx(st, ep, id, now));
        if (ids != NULL)
            ids[i] = id;
    }
    return 0;
}

typedef struct {
    int64_t job_id, run_id;
    const state_push_req_t *reqs;
    size_t n;
    const char *claimer;
    int64_t lease_ms;
    int64_t *ids;
} enqueue_t;

static int enqueue_tx(state_t *st, const enqueue_t *e)
{
    return state_push_enqueue_tx(st, e->job_id, e->run_id, e->reqs, e->n, e->claimer,
                                 e->lease_ms, e->ids);
}

int state_push_enqueue(state_t *st, int64_t job_id, int64_t run_id, const state_push_req_t *reqs,
                       size_t n, const char *claimer, int64_t lease_ms, int64_t *ids)
{
    enqueue_t e = {job_id, run_id, reqs, n, claimer, lease_ms, ids};
    int rc;
    STATE_WRITE(st, "queuing pushes", rc, enqueue_tx(st, &e));
    return rc;
}

/* ---- claiming ----------------------------------------------------------------------- */

typedef struct {
    const char *claimer;
    int64_t now_ms, lease_ms;
    int max;
    int64_t *ids; /* (max) claimed */
    size_t n;
} claim_t;

/* A row of PUSH_DUE: a push that is due and its endpoint. */
typedef struct {
    int64_t push, endpoint;
} due_t;
static const state_col_t due_cols[] = {STATE_COL(due_t, push), STATE_COL(due_t, endpoint)};
static const state_row_t due_row = STATE_ROW(due_t, due_cols, NULL);

static int claim_tx(state_t *st, claim_t *c)
{
    const char *what = "claiming pushes";
    int64_t claimed_ep[256];
    due_t *due = NULL;
    size_t nd = 0;
    c->n = 0;
    int rc = state_rows_query(st, STMT_PUSH_DUE, what, &due_row, (void **)&due, &nd, "Ii",
                              c->now_ms, 256);
    if (rc < 0)
        return rc;
    int64_t now = kiln_now_s();
    for (size_t i = 0; i < nd && c->n < (size_t)c->max; i++) {
        int64_t push = due[i].push, ep = due[i].endpoint, newer = 0, busy = 0;
        KILN_CHECK_GOTO(
            state_row_query(st, STMT_PUSH_NEWER, what, &state_i64_row, &newer, "II", ep, push), rc,
            out);
        if (newer > 0) {
            char why[96];
            snprintf(why, sizeof why, "superseded by push %lld before it went out",
                     (long long)newer);
            KILN_CHECK_GOTO(state_update(st, STMT_PUSH_SUPERSEDE, what, "IIt", push, now, why), rc,
                            out);
            continue;
        }
        KILN_CHECK_GOTO(state_row_query(st, STMT_PUSH_ENDPOINT_BUSY, what, &state_i64_row, &busy,
                                        "III", ep, c->now_ms, push),
                        rc, out);
        /* One push per endpoint at a time, in this claim too. */
        bool dup = busy != 0;
        for (size_t k = 0; k < c->n && !dup; k++)
            dup = claimed_ep[k] == ep;
        if (dup)
            continue;
        KILN_CHECK_GOTO(state_update(st, STMT_PUSH_CLAIM, what, "ItII", push, c->claimer,
                                     c->now_ms + c->lease_ms, now),
                        rc, out);
        claimed_ep[c->n] = ep;
        c->ids[c->n++] = push;
    }
    rc = 0;
out:
    free(due);
    return rc;
}

int state_push_claim(state_t *st, const char *claimer, int64_t now_ms, int64_t lease_ms, int max,
                     state_push_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (claimer == NULL || claimer[0] == '\0' || max < 1)
        return kiln_errf(KILN_EINVAL, "a claim needs a claimer and room for one push");
    if (max > 256)
        max = 256;
    claim_t c = {claimer, now_ms, lease_ms, max, kiln_calloc((size_t)max, sizeof(int64_t)), 0};
    if (c.ids == NULL)
        return KILN_ENOMEM;
    int rc;
    STATE_WRITE(st, "claiming pushes", rc, claim_tx(st, &c));
    state_push_t *ps = NULL;
    if (rc == 0 && c.n > 0 && (ps = kiln_calloc(c.n, sizeof *ps)) == NULL)
        rc = KILN_ENOMEM;
    size_t got = 0;
    for (size_t i = 0; rc == 0 && i < c.n; i++) {
        rc = state_push_get(st, c.ids[i], &ps[got]);
        if (rc == 0)
            got++;
    }
    free(c.ids);
    if (rc < 0) {
        state_pushes_free(ps, got);
        return rc;
    }
    *out = ps;
    *n = got;
    return 0;
}

typedef struct {
    bool (*dead)(const char *claimer, void *ctx);
    void *ctx;
    int n;
} reclaim_t;

/* A row of PUSH_CLAIMED: a push being sent and who claimed it. */
typedef struct {
    int64_t push;
    char *claimer;
} claimed_t;
static const state_col_t claimed_cols[] = {STATE_COL(claimed_t, push),
                                           STATE_COL(claimed_t, claimer)};
static const state_row_t claimed_row = STATE_ROW(claimed_t, claimed_cols, NULL);

/* Takes back at most 256 pushes a call, as many as one claim hands out. */
static int reclaim_tx(state_t *st, reclaim_t *r)
{
    const char *what = "taking back pushes of a deliverer that is gone";
    claimed_t *cs = NULL;
    size_t nc = 0;
    r->n = 0;
    int rc = state_rows_query(st, STMT_PUSH_CLAIMED, what, &claimed_row, (void **)&cs, &nc, "");
    for (size_t i = 0; rc == 0 && i < nc && r->n < 256; i++) {
        if (cs[i].claimer != NULL && !r->dead(cs[i].claimer, r->ctx))
            continue;
        rc = state_update(st, STMT_PUSH_UNCLAIM, what, "I", cs[i].push);
        if (rc >= 0)
            rc = state_event_insert(st, 0, 0, "push",
                                    "push %lld: its deliverer is gone; queued again",
                                    (long long)cs[i].push);
        if (rc == 0)
            r->n++;
    }
    state_rows_free(&claimed_row, cs, nc);
    return rc;
}

int state_push_reclaim(state_t *st, bool (*dead)(const char *claimer, void *ctx), void *ctx,
                       int *n)
{
    reclaim_t r = {dead, ctx, 0};
    int rc;
    STATE_WRITE(st, "taking back pushes of a deliverer that is gone", rc, reclaim_tx(st, &r));
    if (n != NULL)
        *n = rc == 0 ? r.n : 0;
    return rc;
}

int state_push_next_due(state_t *st, int64_t *at_ms)
{
    int rc = state_row_get(st, STMT_PUSH_NEXT_DUE, "reading the next push due", &state_i64_row,
                           at_ms, "");
    return rc < 0 ? rc : 0;
}

/* ---- ending a delivery round ---------------------------------------------------------- */

typedef struct {
    int64_t id;
    const char *claimer;
    const state_push_outcome_t *o;
} push_end_t;

static int push_end_tx(state_t *st, const push_end_t *e)
{
    sqlite3_stmt *s = NULL;
    int rc;
    const state_push_outcome_t *o = e->o;
    const char *what = "ending a push";
    char *state = NULL, *by = NULL;
    int64_t now = kiln_now_s(), endpoint_id, ckpt, job_id, run_id, export_id = 0;

    rc = state_first_row(st, STMT_PUSH_OWNER, what, &s, "I", e->id);
    KILN_CHECK_GOTO(state_found(rc, "no push %lld", (long long)e->id), rc, out);
    KILN_CHECK_GOTO(state_col_str(s, 0, &state), rc, out);
    KILN_CHECK_GOTO(state_col_str(s, 1, &by), rc, out);
    endpoint_id = state_col_i64(s, 2);
    ckpt = state_col_i64(s, 3);
    job_id = state_col_i64(s, 4);
    run_id = state_col_i64(s, 5);
    state_stmt_done(s);
    s = NULL;
    if (state == NULL || strcmp(state, "sending") != 0 || by == NULL ||
        strcmp(by, e->claimer) != 0) {
        rc = kiln_errf(KILN_ESTATE, "push %lld is %s%s%s, not being sent by %s", (long long)e->id,
                       state != NULL ? state : "?", by != NULL ? " by " : "", by ? by : "",
                       e->claimer);
        goto out;
    }
    if (o->sent)
        KILN_CHECK_GOTO(state_insert(st, STMT_EXPORT_INSERT, what, &export_id, "IJttII", ckpt,
                                     o->base_checkpoint_id, o->full ? "push-full" : "push-delta",
                                     "(http)", o->bytes, now),
                        rc, out);
    bool again = o->state == STATE_PUSH_PENDING;
    KILN_CHECK_GOTO(state_update(st, STMT_PUSH_END, what, "ItitiIJI", e->id,
                                 state_push_state_name(o->state), o->http_status, o->error,
                                 o->attempts, again ? o->not_before_ms : 0, export_id,
                                 again ? 0 : now),
                    rc, out);
    if (o->state == STATE_PUSH_SUCCEEDED)
        KILN_CHECK_GOTO(hold_tx(st, endpoint_id, ckpt, e->id, now), rc, out);
    /* The run whose checkpoint it pushes, when it has one, shows the event
     * too (kiln show RUN, /api/runs/N); the job's list includes its runs'. */
    if (o->event != NULL && (job_id > 0 || run_id > 0))
        KILN_CHECK_GOTO(state_event_insert(st, job_id, run_id, "push", "%s", o->event), rc, out);
    rc = 0;
out:
    state_stmt_done(s);
    free(state);
    free(by);
    return rc;
}

int state_push_end(state_t *st, int64_t push_id, const char *claimer,
                   const state_push_outcome_t *o)
{
    if (claimer == NULL || o == NULL)
        return kiln_errf(KILN_EINVAL, "ending a push needs its claimer and outcome");
    if (o->state == STATE_PUSH_SENDING || o->state == STATE_PUSH_SUPERSEDED)
        return kiln_errf(KILN_EINVAL, "a delivery round cannot end %s",
                         state_push_state_name(o->state));
    push_end_t e = {push_id, claimer, o};
    int rc;
    STATE_WRITE(st, "ending a push", rc, push_end_tx(st, &e));
    return rc;
}

/* ---- lineage: the pushes and exports of a checkpoint ------------------------------- */

/* A row of LINEAGE_SERVED. */
static const state_col_t served_cols[] = {
    STATE_COL(state_served_t, export_id),   STATE_COL(state_served_t, format),
    STATE_COL(state_served_t, export_path), STATE_COL(state_served_t, push_id),
    STATE_COL(state_served_t, push_state),  STATE_COL(state_served_t, http_status),
    STATE_COL(state_served_t, endpoint_id), STATE_COL(state_served_t, url),
    STATE_COL(state_served_t, model),       STATE_COL(state_served_t, label),
    STATE_COL(state_served_t, holding),
};
static const state_row_t served_row = STATE_ROW(state_served_t, served_cols, NULL);

void state_served_free(state_served_t *sv, size_t n)
{
    state_rows_free(&served_row, sv, n);
}

int state_lineage_served(state_t *st, int64_t checkpoint_id, state_served_t **out, size_t *n)
{
    return state_rows_list(st, STMT_LINEAGE_SERVED, "reading exports and pushes", &served_row,
                           (void **)out, n, "I", checkpoint_id);
}
