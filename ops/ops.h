/*
 * ops/ops.h - Kiln's use cases, each written once. The kiln CLI, the web API
 * and kilnd call these; none of them holds a use case of its own.
 *
 *   submit, retry, cancel            ops_jobs.c
 *   push, promote, rollback          ops_push.c  (queue, then deliver now)
 *   traffic split                    ops_split.c
 *   traffic ramp (push.ramp)         ops_ramp.c
 *   after a run, after an export     ops_push.c  (queue for kilnd)
 *   delivering queued pushes         ops_deliver.c (claim, quality gate,
 *                                    push in parallel, record, back off)
 *   endpoints' stats                 ops_deliver.c
 *   online A/B metrics, promote_when ops_online.c
 *   lineage, both ways               ops_lineage.c
 *
 * A push is queued in SQLite (state/state.h, "the push queue") before any
 * byte goes out, so a crash loses none and, with its idempotency key, sends
 * none twice. docs/operations.md ("After a run") and docs/serving-protocol.md
 * tell the rules.
 */
#ifndef KILN_OPS_OPS_H
#define KILN_OPS_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "jobs.h"
#include "serve.h"
#include "state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- submit, retry, cancel ----------------------------------------------------------- */
typedef struct ops_submit {
    const char *text; /* the spec (not necessarily NUL-terminated) */
    size_t len;
    const char *path; /* the file it came from: its directory is where the spec's relative
                         paths resolve; NULL: no file (kilnd then uses $KILN_HOME/jobs/NAME) */
    const char *source; /* for the submit event when path is NULL ("the web API") */
    bool dry_run;       /* validate and describe; write nothing */
} ops_submit_t;

typedef struct ops_submitted {
    state_submitted_t r; /* zero on a dry run */
    job_spec_t spec;     /* the parsed spec; ops_submitted_fini frees it */
    int64_t next_fire;   /* the schedule's next fire time (Unix s); 0: one-off */
} ops_submitted_t;

/* Validates a spec (every problem in diags, then KILN_ESPEC), records it with
 * its directory and its push endpoints, queues a one-off job's run, all in
 * one transaction, and names the source in a "submit" event. */
int ops_submit(state_t *st, const ops_submit_t *in, job_diags_t *diags /* OUT */,
               ops_submitted_t *out /* OUT */);
void ops_submitted_fini(ops_submitted_t *s);

/* The rule ops_submit applies before storing a job: its checkpoint.dir
 * (resolved against spec_dir, the directory its relative paths resolve
 * against; NULL: none) must not be the checkpoint directory of another
 * stored job, which would resume from this one's model (init_from: latest)
 * and prune its checkpoints. Paths are compared canonical (symlinks
 * resolved as far as they exist). A resubmit of the same job name is not a
 * conflict. Returns 0, KILN_ECONFLICT naming the other job and the
 * directory, or KILN_EDB / KILN_ENOMEM. */
int ops_checkpoint_dir_check(state_t *st, const job_spec_t *spec, const char *spec_dir);

/* Queues a new attempt of an ended run that did not succeed (it resumes from
 * the failed attempt's newest checkpoint). KILN_ESTATE for a run that is not
 * over or succeeded; KILN_ECONFLICT when it was retried already. */
int ops_retry(state_t *st, int64_t run_id, const char *source, int64_t *new_run_id /* OUT */,
              int *attempt /* OUT */);
/* Cancels a queued run at once (*done true) or asks kilnd to stop a running
 * one (*done false). KILN_ESTATE when it ended already. */
int ops_cancel(state_t *st, int64_t run_id, bool *done /* OUT */);

/* ---- job control (kiln pause / resume / delete, the web API and the job page) ----------
 * A job is named by its id here; the CLI looks its name up first. */
/* Pauses (pause true) or resumes a job: kilnd neither runs nor records the
 * fires of a paused job and launches none of its queued runs; on resume the
 * fires missed meanwhile follow the job's catch-up policy. *changed (may be
 * NULL) is false when the job already was so. KILN_ENOENT when there is no
 * such job or it was deleted. */
int ops_job_pause(state_t *st, int64_t job_id, bool pause, bool *changed /* OUT */);
/* Deletes a job (state_job_delete): refused with KILN_ESTATE while runs of it
 * are queued or running, unless cancel. Its checkpoints, runs and lineage
 * stay. *nstopped (may be NULL): the runs canceled or asked to stop. */
int ops_job_delete(state_t *st, int64_t job_id, bool cancel, int *nstopped /* OUT */);

/* ---- pushes: deliberate (CLI, web) --------------------------------------------------------
 * Each queues its pushes claimed by this process and delivers them at once;
 * a push that fails in a way a retry may fix goes back to the queue, where
 * kilnd keeps retrying it. */
typedef struct ops_push_report {
    char checkpoint[SERVE_UID_MAX]; /* what was pushed */
    state_push_t *pushes;           /* each push as it stands after delivery */
    size_t n;
    int nsucceeded, nfailed, nheld, npending;
    char note[900]; /* promote: the push.promote_when figures that allowed it ("": none) */
} ops_push_report_t;
void ops_push_report_fini(ops_push_report_t *r);

/* A job's newest checkpoint (or ckpt_uid) to the job's endpoints (of label,
 * or all of them): a delta on what each holds, full with `full`. The quality
 * gate (push.max_regression) applies unless force. Returns 0 when every push
 * succeeded; KILN_EHTTP (some failed or are pending: the message names the
 * endpoint and the HTTP status), KILN_ENOENT, KILN_EAUTH. */
int ops_push_job(state_t *st, const char *job, const char *label, const char *ckpt_uid,
                 bool full, bool force, ops_push_report_t *rep /* OUT */);
/* For the pushes ps (n) that have not sent anything yet (pending or being
 * sent, or ended without a body), marks full the ones asking for a delta
 * that will go out full: their endpoint holds nothing, or a checkpoint
 * outside the pushed one's chain (back to its full dump). So `kiln show`,
 * `kiln runs --json`, the run page and /api/runs/N say "full" before the
 * push goes out, as the deliverer will decide. For display only. */
void ops_push_foresee(state_t *st, state_push_t *ps, size_t n);
/* What the endpoints of model/from hold, to every endpoint of model/to,
 * unless push.promote_when refuses it (ops_promote_check; not with force):
 * then KILN_ESTATE with the figures, and nothing is pushed. */
int ops_promote(state_t *st, const char *model, const char *from, const char *to,
                const char *token_env, bool force, ops_push_report_t *rep /* OUT */);
/* The checkpoint model/label held before its current one, to its endpoints. */
int ops_rollback(state_t *st, const char *model, const char *label, const char *token_env,
                 ops_push_report_t *rep /* OUT */);

/* Sets (split "A=90,B=10") or reads (split NULL) model's traffic split on
 * every kiln-serve that serves one of its endpoints (the distinct URLs of
 * the recorded endpoints of model), with the token of token_env, else of the
 * push.token_env of a job that pushes to model, else $KILN_SERVE_TOKEN.
 * rep->results is (rep->n) in the order of rep->urls (both malloc'd; free
 * with ops_split_report_fini). Returns 0 when every endpoint answered,
 * KILN_ENOENT (no endpoint serves model), KILN_EINVAL (an endpoint refused
 * the split as malformed), KILN_EHTTP (the first failure's message) or
 * KILN_ENOMEM. */
typedef struct ops_split_report {
    char **urls;
    serve_split_result_t *results;
    size_t n;
} ops_split_report_t;
int ops_split(state_t *st, const char *model, const char *split, const char *token_env,
              ops_split_report_t *rep /* OUT */);
void ops_split_report_fini(ops_split_report_t *rep);

/* ---- traffic ramp (push.ramp) -------------------------------------------------------------
 * Where the ramp of one endpoint (an auto endpoint of a job whose spec has
 * push.ramp, recorded in the database) stands: computed from the endpoint's
 * pushes, so every reader agrees and nothing is stored. */
typedef struct ops_ramp {
    int64_t job_id, endpoint_id;
    char job[80], url[512], model[64], label[40], token_env[128];
    int step, max;      /* percent */
    int64_t every_ms;
    int share;          /* the label's traffic share now, percent: 0 before its first landed
                           push and after a stop */
    bool stopped;       /* the newest ended push was held back or failed */
    int64_t since;      /* the landed push the ramp counts from (Unix s); 0: not started */
    int64_t next_at;    /* the next step (Unix s); 0: none (not started, stopped, at max) */
    char why[700];      /* stopped: the push and its reason */
} ops_ramp_t;
/* Every ramped endpoint at now (Unix s), into *out (n; free() it). Returns
 * 0 or a state error. */
int ops_ramp_list(state_t *st, int64_t now, ops_ramp_t **out /* OUT */, size_t *n /* OUT */);
/* One line for people: "ramp 10%/1h to 50%: at 20%, next step in 1800s". */
void ops_ramp_describe(const ops_ramp_t *r, char *buf, size_t cap);
/* Makes r's kiln-serve give r's label r->share percent of the model's
 * traffic (the other labels keep their proportions in the rest), with the
 * token in $r->token_env. Returns 1 when it changed the split (*was: the
 * share before, percent), 0 when the split already agreed, KILN_EHTTP or
 * KILN_EAUTH (message says which endpoint and why). */
int ops_ramp_apply(const ops_ramp_t *r, int *was /* OUT */);
/* r as the JSON object `kiln split --json` and /api/endpoints show: job,
 * url, model, label, step, every_ms, max, share, stopped, since, next_at,
 * why (null unless stopped), text (ops_ramp_describe). */
json_t *ops_ramp_json(const ops_ramp_t *r);
/* The ramp of endpoint_id among ramps (n), or NULL. */
const ops_ramp_t *ops_ramp_of(const ops_ramp_t *ramps, size_t n, int64_t endpoint_id);

/* ---- endpoints, as people read them (ops_endpoints.c) ------------------------------------- */
/* What the endpoints page, /api/endpoints and `kiln endpoints` show of es[i]
 * beyond its row: the age of the checkpoint it holds (s; -1: nothing held)
 * and its share of its kiln-serve's predict traffic for the model (0..1;
 * NAN: not known): by request rate when every label's rate is known, else
 * by the requests counted since kiln-serve started. */
typedef struct ops_endpoint_view {
    int64_t age_s;
    double share;
} ops_endpoint_view_t;
void ops_endpoint_view(const state_endpoint_info_t *es, size_t n, size_t i,
                       ops_endpoint_view_t *out /* OUT */);
/* Every endpoint as /api/endpoints and `kiln --json endpoints` print it,
 * {"endpoints": [...]} (docs/api.md), into *out (the caller's). */
int ops_endpoints_json(state_t *st, json_t **out /* OUT */);

/* ---- online A/B metrics (ops_online.c) -----------------------------------------------------
 * Read from each endpoint's kiln-serve (GET /v1/models/M/online) when asked
 * for, never stored. */
#define OPS_ONLINE_TIMEOUT_MS 1000 /* per kiln-serve: what a down one costs a page */
typedef struct ops_online {
    bool known;                /* the kiln-serve answered; false: error says why */
    bool unlogged;             /* !known because that kiln-serve logs no impressions */
    char error[400];
    serve_online_label_t f;    /* this label's figures (impressions 0: none joined yet) */
    char base[SERVE_NAME_MAX]; /* the label compared with (kiln-serve's first by name); "": none */
    double diff, lo, hi;       /* logloss minus base's and its 95% interval; NAN */
} ops_online_t;
/* The online figures of each of es (n), in a malloc'd array (n; free()):
 * one request per (URL, model), timeout_ms each. An endpoint that does not
 * answer is !known with the reason. NULL when out of memory: read its
 * entries with ops_online_at, which then says so. */
ops_online_t *ops_online_read(const state_endpoint_info_t *es, size_t n, int64_t timeout_ms);
/* Entry i of what ops_online_read returned (on may be NULL: an entry that
 * is !known, "out of memory"). */
const ops_online_t *ops_online_at(const ops_online_t *on, size_t i);
/* o as /api/endpoints shows it ("online", docs/api.md). */
json_t *ops_online_json(const ops_online_t *o);
/* One line for people: "1200 rows, ll 0.4512, auc 0.712, vs A -0.0123 [-0.0201, -0.0045]",
 * "no rows yet" or "unknown". */
void ops_online_describe(const ops_online_t *o, char *buf, size_t cap);
/* push.promote_when (of the first job that pushes to model/from or
 * model/to and has one): reads both labels' online figures and returns 0
 * when from's online logloss is below to's by at least
 * online_logloss_better_by over at least min_rows joined rows each, with
 * the figures in note (cap); KILN_ESTATE with the figures (rows of each,
 * both loglosses, the difference and its 95% CI) when not, or when a
 * label's figures cannot be read. 0 with note "" when no job has the rule. */
int ops_promote_check(state_t *st, const char *model, const char *from, const char *to,
                      char *note /* OUT */, size_t cap);

/* ---- after a run (kilnd) ------------------------------------------------------------------- */
/* Records that run_id succeeded (from running, or from launching for a run
 * that ended before kilnd saw it run) and queues, in the same transaction,
 * what spec's export.on_success asks for: the run's final checkpoint
 * (ckpt_uid, from its result) to each `auto` endpoint of push.endpoints, in
 * full or as a delta. spec NULL (the job's spec does not parse): nothing is
 * queued. *npushes (may be NULL) says how many were queued. */
int ops_run_succeeded(state_t *st, int64_t run_id, const job_spec_t *spec, const char *ckpt_uid,
                      int exit_code, int64_t ended_at /* 0: now */, int *npushes /* OUT */);
/* Queues an online export (a checkpoint written while run_id trains) to each
 * `auto` endpoint, superseding older pushes that have not gone out. Nothing
 * when the export was queued before (a kilnd restart sees it again). */
int ops_after_export(state_t *st, int64_t run_id, const job_spec_t *spec, int64_t checkpoint_id,
                     int *npushes /* OUT */);

/* ---- delivering queued pushes ------------------------------------------------------------- */
/* Who delivers: "ROLE@HOST:PID:START" (malloc'd), so that a claim of a
 * process that died can be told (ops_claimer_dead). */
char *ops_claimer(const char *role);
/* True when claimer names a process of this host that is gone. */
bool ops_claimer_dead(const char *claimer, void *ctx);

/* Delivers pushes claimed by claimer (state_push_claim, or queued claimed):
 * the quality gate, then every push in parallel (libcurl multi), each with
 * its job's token, retries and timeout; records how each ended (succeeded,
 * failed, held, or back to pending with a backoff). Returns 0, or an error
 * of the database. */
int ops_deliver(state_t *st, const char *claimer, state_push_t *ps, size_t n);

/* The backoff before delivery round `rounds` + 1 of a push: 2 s doubled per
 * round, at most 5 min, plus up to 20 % jitter. */
int64_t ops_push_backoff_ms(int rounds);

/* Reads every endpoint's /v1/stats (each URL once, timeout_ms) and records
 * the numbers of each (model, label) with the request rate since the last
 * read. Returns 0 or an error of the database; an endpoint that does not
 * answer has the error recorded. */
int ops_poll_stats(state_t *st, int64_t timeout_ms);

/* ---- lineage ---------------------------------------------------------------------------- */
/* Lineage from `what`: a run number, a checkpoint uid, an endpoint URL (every
 * label it holds) or a file some run read. *out (json_decref it):
 *   {"from": {"kind", "ref"}, "inputs": [{path, size, mtime, checksum, runs}],
 *    "runs": [...], "earlier_checkpoints": [...] (back),
 *    "checkpoints": [... with "pushes"] (forward: the runs' own and every
 *    checkpoint derived from them), "endpoints": [{url, model, label, holds,
 *    since, serves_this_lineage}]}
 * KILN_ENOENT when what names nothing Kiln recorded. */
int ops_lineage(state_t *st, const char *what, json_t **out /* OUT */);

/* The push description (tables, slots, layers) of a job spec's model; its
 * nparams is 0 (serve_ckptsrc_open takes it from the checkpoint). */
int ops_model_desc(const job_spec_t *spec, serve_model_desc_t *out /* OUT */);

#ifdef __cplusplus
}
#endif

#endif /* KILN_OPS_OPS_H */
