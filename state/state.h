/*
 * state/state.h - Kiln's SQLite store: jobs, runs, inputs, metrics,
 * checkpoints, exports, pushes, endpoints, events. Every query the system
 * makes lives behind this header; nothing else includes sqlite3.h.
 *
 * The database runs in WAL mode with a busy timeout and foreign keys on; the
 * schema is migrated on open (PRAGMA user_version). Several processes (the
 * CLI, kilnd, trainer ranks) may open the same file at once; every write is
 * one transaction and none is lost to SQLITE_BUSY.
 *
 * Times are Unix seconds (UTC) unless a name ends in _ms. Strings returned in
 * structs are owned by the struct: free with the matching _fini / _free.
 */
#ifndef KILN_STATE_STATE_H
#define KILN_STATE_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct state state_t;

/* The schema version this build writes. Version 0 is an empty file; each
 * migration in state/schema.c brings version i-1 to i (see docs/state.md). */
#define STATE_SCHEMA_VERSION 9
/* PRAGMA application_id of Kiln's databases ("KILN"): kilnd and kiln open a
 * file that has it, a new one, or an older Kiln database (which gets it),
 * and refuse any other application's SQLite file. */
#define STATE_APPLICATION_ID 0x4B494C4E

/* Opens (creating if needed, with parent directories) and migrates path.
 * Returns 0, KILN_EDB (message names the file and SQLite's reason) or
 * KILN_EVERSION when the file was written by a newer Kiln. */
int state_open(const char *path, state_t **out /* OUT */);
/* A state_t is one SQLite connection: use it from one thread at a time (open
 * one per thread or process; they share the file safely). */
void state_close(state_t *st); /* accepts NULL */
/* The database file's schema version (PRAGMA user_version). */
int state_schema_version(state_t *st, int *out /* OUT */);

/* ---- jobs --------------------------------------------------------------------- */
typedef struct state_job {
    int64_t id;
    char *name;
    char *spec_yaml;   /* the spec text as submitted */
    char *spec_hash;   /* xxh64 hex of spec_yaml */
    char *schedule;    /* NULL for a one-off job */
    int priority;
    int version;       /* 1 on first submit, +1 each time a different spec is submitted */
    bool paused;
    int64_t created_at, updated_at;
    int64_t last_scheduled_at; /* newest scheduled time a run was created for; 0: none */
    char *spec_dir;    /* where the spec's relative paths resolve; NULL: kilnd's default */
    int64_t deleted_at;       /* kiln delete: 0 while the job exists */
    int64_t last_checked_at;  /* the last cron fire that was skipped; 0: none */
    int64_t skipped_fires;    /* cron fires skipped (no new data, missed, forbid): not runs */
    char *last_skip_reason;   /* why the last one was skipped; NULL: none */
    char *timezone;           /* the zone its schedule fires in (the spec's); NULL: UTC */
} state_job_t;

/* A submit, as one transaction: the job is inserted or its spec replaced
 * (version + 1 only when spec_hash differs), the directory its relative
 * paths resolve against is recorded, a one-off job's run is queued (with that
 * directory on the run), and a "submit" event names the source. So kilnd
 * never sees a run whose spec directory is not yet written. */
/* An endpoint as a job's spec names it: a kiln-serve URL, model and label. */
typedef struct state_endpoint_ref {
    const char *url, *model, *label;
} state_endpoint_ref_t;
typedef struct state_submit {
    const char *name, *spec_yaml, *spec_hash;
    const char *schedule; /* NULL: one-off */
    int priority;
    const char *spec_dir; /* absolute; NULL: none (kilnd then uses $KILN_HOME/jobs/NAME) */
    const char *timezone; /* the spec's timezone; NULL: UTC */
    bool queue_run;       /* queue one run (a one-off job) */
    const char *source;   /* for the event: the spec file, or "the web API" */
    const state_endpoint_ref_t *endpoints; /* (nendpoints) the job's push endpoints, recorded
                                              in the same transaction; may be NULL */
    int nendpoints;
} state_submit_t;
typedef struct state_submitted {
    int64_t job_id;
    int64_t run_id; /* 0 when no run was queued */
    int version;
    bool created; /* a new job (else an existing one's spec was replaced) */
} state_submitted_t;
int state_submit(state_t *st, const state_submit_t *in, state_submitted_t *out /* OUT */);

/* Inserts a job or, when name exists, replaces its spec (version+1 only when
 * spec_hash differs). *created says which. Leaves spec_dir as it was (NULL
 * for a new job) and sets no timezone (UTC); state_submit is the submit
 * path. */
int state_job_put(state_t *st, const char *name, const char *spec_yaml, const char *spec_hash,
                  const char *schedule, int priority, int64_t *job_id /* OUT */,
                  bool *created /* OUT, may be NULL */);
/* KILN_ENOENT when there is no such job. */
int state_job_get(state_t *st, const char *name, state_job_t *out /* OUT */);
int state_job_get_by_id(state_t *st, int64_t id, state_job_t *out /* OUT */);
/* The spec text of version `version` of a job (every version is kept), in
 * *yaml (free it). KILN_ENOENT when the job has no such version. */
int state_job_version_spec(state_t *st, int64_t job_id, int version, char **yaml /* OUT */);
/* All jobs but deleted ones, ordered by name. Free with state_jobs_free.
 * state_job_get still finds a deleted job by name (deleted_at > 0), so its
 * runs and lineage stay readable. */
int state_job_list(state_t *st, state_job_t **out /* OUT */, size_t *n /* OUT */);
/* Pauses or resumes a job (a "pause" / "resume" event says so). A paused
 * job's cron fires are neither run nor recorded; on resume the fires missed
 * meanwhile follow its catch-up policy, as after a kilnd downtime. */
int state_job_set_paused(state_t *st, int64_t job_id, bool paused);
/* Counts a cron fire of job_id that is not run (no new data, missed under
 * catchup, concurrency: forbid) on the job instead of recording a run:
 * skipped_fires + 1, last_checked_at = at, last_skip_reason = why. */
int state_job_skip(state_t *st, int64_t job_id, int64_t at, const char *why);
/* Deletes a job: it leaves the job lists and the scheduler, while its row
 * stays (deleted_at) so its runs, checkpoints and lineage stay readable;
 * submitting the name again brings it back. Refused with KILN_ESTATE (the
 * message names a run) while a run of it is queued, launching or running,
 * unless cancel: then queued runs are canceled and running ones flagged for
 * kilnd to stop, in the same transaction. *nstopped (may be NULL) counts
 * them. KILN_ENOENT when there is no such job or it was deleted already. */
int state_job_delete(state_t *st, int64_t job_id, bool cancel, int *nstopped /* OUT */);
/* Records the newest scheduled time served (monotonic: never moves back). */
int state_job_set_last_scheduled(state_t *st, int64_t job_id, int64_t scheduled_at);
void state_job_fini(state_job_t *j);
void state_jobs_free(state_job_t *js, size_t n);

/* ---- runs ---------------------------------------------------------------------
 * States: queued -> launching -> running -> succeeded | failed | canceled |
 * timed_out; queued -> canceled | skipped. A terminal state never changes. */
#define STATE_RUN_STATES(X)                                                    \
    X(QUEUED, "queued")                                                        \
    X(LAUNCHING, "launching")                                                  \
    X(RUNNING, "running")                                                      \
    X(SUCCEEDED, "succeeded")                                                  \
    X(FAILED, "failed")                                                        \
    X(CANCELED, "canceled")                                                    \
    X(TIMED_OUT, "timed_out")                                                  \
    X(SKIPPED, "skipped")

typedef enum {
#define STATE_RUN_ENUM(name, str) STATE_RUN_##name,
    STATE_RUN_STATES(STATE_RUN_ENUM)
#undef STATE_RUN_ENUM
    STATE_RUN_NSTATES
} state_run_state_t;

const char *state_run_state_name(state_run_state_t s);
/* Returns 0 and sets *out, or KILN_EINVAL for an unknown name. */
int state_run_state_parse(const char *s, state_run_state_t *out /* OUT */);
bool state_run_state_terminal(state_run_state_t s);

typedef enum { STATE_TRIGGER_MANUAL, STATE_TRIGGER_CRON, STATE_TRIGGER_RETRY,
               STATE_TRIGGER_CATCHUP } state_trigger_t;
const char *state_trigger_name(state_trigger_t t);

typedef struct state_run {
    int64_t id;
    int64_t job_id;
    char *job_name;
    int job_version;
    state_run_state_t state;
    state_trigger_t trigger;
    int attempt;          /* 1 for the first try */
    int64_t retry_of;     /* run id this one retries; 0: none */
    int64_t scheduled_at; /* the cron time it serves; 0 for manual */
    int64_t queued_at, started_at, ended_at; /* 0: not yet */
    int64_t not_before;   /* earliest launch time (retry backoff); 0: now */
    int exit_code;        /* -1 until it ended */
    char *error;          /* why it failed; NULL when none */
    char *run_dir;        /* NULL until launched */
    int64_t pgid;         /* process group of the launched run; 0: none */
    char *host;
    bool cancel_requested;
    char *spec_dir;              /* copied from the job when the run was queued; NULL: none */
    int64_t start_checkpoint_id; /* the checkpoint it started from (resume, warm start); 0 */
} state_run_t;

/* Queues a run. A cron run (scheduled_at != 0) is unique per (job,
 * scheduled_at): a second create for the same time returns KILN_EEXIST, which
 * is how a scheduled time is never run twice. */
int state_run_create(state_t *st, int64_t job_id, state_trigger_t trigger,
                     int64_t scheduled_at, int attempt, int64_t retry_of,
                     int64_t *run_id /* OUT */);
int state_run_get(state_t *st, int64_t run_id, state_run_t *out /* OUT */);
/* Newest first; job_name NULL for all jobs; limit <= 0 for no limit.
 * KILN_ENOENT when job_name names no job. */
int state_run_list(state_t *st, const char *job_name, int limit, state_run_t **out /* OUT */,
                   size_t *n /* OUT */);
/* Runs in a state, oldest first (the daemon's queue and recovery scans). */
int state_run_list_in_state(state_t *st, state_run_state_t s, state_run_t **out /* OUT */,
                            size_t *n /* OUT */);
/* Moves a run from `from` to `to` atomically (compare-and-set): returns
 * KILN_ESTATE, with the actual state in the message, when it was not in
 * `from` or when the state machine has no edge from -> to (legal edges:
 * queued -> launching | canceled | skipped | failed; launching -> running |
 * succeeded | failed | canceled | timed_out; running -> succeeded | failed |
 * canceled | timed_out). Records a "state" event. Entering running sets started_at; a terminal state sets ended_at,
 * exit_code and error (may be NULL). */
/* Puts a run that kilnd moved to launching back in the queue, as if it had
 * never been taken: for a kilnd that died before the run's supervisor
 * started, so nothing of the run ran. One transaction: launching -> queued
 * with a "state" event saying why, and the run's launch record and inputs
 * cleared (the next launch records them again). A run whose cancel was
 * requested is canceled instead. KILN_ESTATE when the run is not
 * launching. */
int state_run_requeue(state_t *st, int64_t run_id, const char *why);
int state_run_transition(state_t *st, int64_t run_id, state_run_state_t from,
                         state_run_state_t to, int exit_code, const char *error);
/* Records where and how a run was launched. */
int state_run_set_launch(state_t *st, int64_t run_id, const char *run_dir, int64_t pgid,
                         const char *host);
int state_run_set_not_before(state_t *st, int64_t run_id, int64_t not_before);
/* A queued cron run that has nothing to do (no new data) is no run: it is
 * deleted with its events and counted on its job (state_job_skip with why),
 * in one transaction. KILN_ESTATE when the run is no longer queued. */
int state_run_drop_skipped(state_t *st, int64_t run_id, const char *why);

/* Retention (kilnd --keep-runs), in batches of r->limit rows, each step its
 * own transaction so that no writer waits long:
 * 1. compacts the runs that ended before r->before: their events, loss
 *    points, Slurm record and the inputs that do not count as consumed go,
 *    and their directories (the logs) are handed to the caller in
 *    r->run_dirs; the run row, its consumed inputs (which stop the data being
 *    trained twice) and its checkpoints stay. Job events older than
 *    r->before go too, but submits and spec versions. The newest run and the
 *    newest success of each job stay whole.
 * 2. drops the consumed inputs of compacted runs whose file r->gone says is
 *    gone for good (nothing can be trained twice), from r->input_below down;
 * 3. drops the checkpoints of compacted runs that nothing needs (no whole
 *    run made or started from it, no endpoint holds it, no open or held push
 *    carries it, it covers no input, it is not its job's newest, no needed
 *    incremental stands on it: a newer full ends a chain) and whose
 *    directory r->gone says is gone (checkpoint.keep removes the files; a row
 *    stays while its files do), with their ended pushes, closed holdings
 *    and exports, from r->ckpt_below down;
 * 4. removes the compacted runs that nothing refers to any more.
 * gone (NULL: no file is gone) is asked inside the transaction of its step.
 * The cursors move on and wrap; r->more says a step filled its batch (call
 * again soon). */
typedef bool (*state_gone_fn)(const char *path, void *ctx);
typedef struct state_retain {
    /* set by the caller */
    int64_t before; /* Unix s */
    int limit;      /* rows a step takes, 1..STATE_PAGE_MAX */
    state_gone_fn gone;
    void *ctx;
    /* kept across passes (start at 0) */
    int64_t input_below, ckpt_below;
    /* what the last pass did */
    int64_t compacted, events, inputs, checkpoints, removed;
    bool more;
    char **run_dirs; /* (ndirs) of the compacted runs, for the caller to delete */
    size_t ndirs;
} state_retain_t;
int state_retain_pass(state_t *st, state_retain_t *r /* IN/OUT */);
/* Frees r->run_dirs and zeroes what the last pass did; accepts NULL. */
void state_retain_fini(state_retain_t *r);
/* Records the checkpoint a run started from (kiln-train's resume or warm
 * start), the edge lineage follows from a run's checkpoints to the runs
 * built on them. */
int state_run_set_start_checkpoint(state_t *st, int64_t run_id, int64_t checkpoint_id);
/* Asks for a run to stop. A queued run becomes canceled at once (*done =
 * true); a launching/running run is flagged for the daemon (*done = false).
 * KILN_ESTATE when the run already ended. */
int state_run_request_cancel(state_t *st, int64_t run_id, bool *done /* OUT */);
void state_run_fini(state_run_t *r);
void state_runs_free(state_run_t *rs, size_t n);

/* ---- run inputs (the data partitions a run consumed) ---------------------------- */
typedef struct state_input {
    char *path;
    int64_t size, mtime;
    char *checksum; /* xxh64 hex */
} state_input_t;

int state_input_add(state_t *st, int64_t run_id, const state_input_t *in);
int state_input_list(state_t *st, int64_t run_id, state_input_t **out /* OUT */,
                     size_t *n /* OUT */);
/* True when job_id consumed exactly this (path, size, mtime, checksum): a
 * succeeded run read it, or an online run trained on it and wrote a
 * checkpoint since (state_inputs_cover). */
int state_input_consumed(state_t *st, int64_t job_id, const state_input_t *in,
                         bool *consumed /* OUT */);
/* The newest run of job_id that consumed a file at path in any version
 * (size, mtime, checksum), as state_input_consumed counts them; 0 when none.
 * kilnd tells a consumed file that changed since from a new one. */
int state_input_consumed_run(state_t *st, int64_t job_id, const char *path,
                             int64_t *run_id /* OUT */);
void state_inputs_free(state_input_t *ins, size_t n);
/* An online run's inputs that no checkpoint covered yet are covered by
 * checkpoint_id (they count as consumed from now on). */
int state_inputs_cover(state_t *st, int64_t run_id, int64_t checkpoint_id);
/* The runs that read a file at path (any size or mtime), newest first, at
 * most limit (1..STATE_PAGE_MAX). Free with free(). */
int state_input_runs(state_t *st, const char *path, int limit, int64_t **run_ids /* OUT */,
                     size_t *n /* OUT */);

/* ---- metrics -------------------------------------------------------------------- */
int state_metric_add(state_t *st, int64_t run_id, int64_t step, const char *name, double value);
typedef struct state_metric {
    int64_t step;
    double value;
    int64_t at;
} state_metric_t;
/* Points of one metric of a run in step order. Free with free(). */
int state_metric_series(state_t *st, int64_t run_id, const char *name,
                        state_metric_t **out /* OUT */, size_t *n /* OUT */);

/* ---- checkpoints, exports, pushes, endpoints ----------------------------------- */
typedef struct state_checkpoint {
    int64_t id;
    char *uid; /* the checkpoint's own id (its directory name) */
    int64_t run_id, parent_id; /* parent_id 0: a full dump with no base */
    char *kind;                /* "full" | "incremental" */
    char *path;
    int64_t step, keys, bytes;
    char *checksum; /* xxh64 hex of the manifest */
    int64_t created_at;
    bool has_eval;                 /* eval_* were measured (state_checkpoint_add stores them) */
    double eval_logloss, eval_auc; /* measured on this checkpoint; NAN: not measured */
    bool online;                   /* an online export (written while the run trained) */
} state_checkpoint_t;

int state_checkpoint_add(state_t *st, const state_checkpoint_t *c, int64_t *id /* OUT */);
int state_checkpoint_get(state_t *st, const char *uid, state_checkpoint_t *out /* OUT */);
/* Newest checkpoint of a job (any kind); KILN_ENOENT when none. */
int state_checkpoint_latest(state_t *st, int64_t job_id, state_checkpoint_t *out /* OUT */);
void state_checkpoint_fini(state_checkpoint_t *c);
/* The newest checkpoint a run recorded (online_only: its newest online
 * export). KILN_ENOENT when none. */
int state_checkpoint_newest_of_run(state_t *st, int64_t run_id, bool online_only,
                                   state_checkpoint_t *out /* OUT */);
/* Records the eval figures measured on a checkpoint (NAN: not measured). */
int state_checkpoint_set_eval(state_t *st, int64_t checkpoint_id, double logloss, double auc);

int state_export_add(state_t *st, int64_t checkpoint_id, int64_t base_checkpoint_id,
                     const char *format, const char *path, int64_t bytes, int64_t *id /* OUT */);

/* An endpoint is (url, model, label): one kiln-serve holds several labels of
 * a model, and each is an endpoint of its own here. Inserts it when new. */
int state_endpoint_put(state_t *st, const char *url, const char *model, const char *label,
                       int64_t *id /* OUT */);
/* What an endpoint holds now (the base a delta must be built against), and
 * since when. KILN_ENOENT when no push to it has succeeded yet. Earlier
 * holdings stay in the table as history. */
int state_endpoint_holding(state_t *st, int64_t endpoint_id, int64_t *checkpoint_id /* OUT */,
                           int64_t *since /* OUT, may be NULL */);
/* The numbers last read from an endpoint's /v1/stats (kilnd polls them):
 * predict requests and rows of its label since kiln-serve started, and the
 * request rate between the last two reads. error: why the last read failed
 * (NULL: it worked; the numbers then stay as they were). */
typedef struct state_endpoint_stats {
    int64_t at; /* when they were read */
    int64_t predict_requests, predict_rows;
    double request_rate; /* requests/s; NAN: not known yet */
    const char *error;
} state_endpoint_stats_t;
int state_endpoint_set_stats(state_t *st, int64_t endpoint_id, const state_endpoint_stats_t *s);

/* ---- pushes: the push queue -------------------------------------------------------
 * A push is the intent to make one endpoint hold one checkpoint, in full or
 * as a delta on what the endpoint holds (a full push where it holds nothing
 * or something outside the checkpoint's chain). It is queued (pending),
 * claimed by one deliverer at a time (sending: kilnd, or the CLI command that
 * queued it), and ends succeeded, failed (a refusal no retry can fix),
 * superseded (a newer push to the same endpoint was queued before it went
 * out) or held (the quality gate, push.max_regression). A delivery that fails
 * in a way a retry may fix goes back to pending with a later not_before. */
#define STATE_PUSH_STATES(X)                                                   \
    X(PENDING, "pending")                                                      \
    X(SENDING, "sending")                                                      \
    X(SUCCEEDED, "succeeded")                                                  \
    X(FAILED, "failed")                                                        \
    X(SUPERSEDED, "superseded")                                                \
    X(HELD, "held")

typedef enum {
#define STATE_PUSH_ENUM(name, str) STATE_PUSH_##name,
    STATE_PUSH_STATES(STATE_PUSH_ENUM)
#undef STATE_PUSH_ENUM
    STATE_PUSH_NSTATES
} state_push_state_t;

const char *state_push_state_name(state_push_state_t s);
int state_push_state_parse(const char *s, state_push_state_t *out /* OUT */);
/* succeeded, failed, superseded, held. */
bool state_push_state_ended(state_push_state_t s);

/* What to push where (state_push_enqueue). */
typedef struct state_push_req {
    const char *url, *model, *label; /* the endpoint (recorded when new) */
    int64_t checkpoint_id;
    bool full;              /* a full push even where a delta would do */
    const char *reason;     /* for people: "run 12 succeeded", "online export", "kiln push" */
    const char *token_env;  /* the variable holding the token; NULL: the job's push.token_env */
    bool no_gate;           /* the quality gate does not apply (promote, rollback, --force) */
} state_push_req_t;

/* Queues reqs[0..n) for job_id (0: none) and run_id (0: none) in one
 * transaction. A pending push to the same endpoint that nobody is sending
 * yet is superseded by the new one (an event says so). claimer NULL: the
 * pushes are pending, for kilnd to deliver; else they are created claimed by
 * claimer (sending, lease lease_ms) for the caller to deliver at once. ids
 * (n) gets the new push ids (may be NULL). */
int state_push_enqueue(state_t *st, int64_t job_id, int64_t run_id, const state_push_req_t *reqs,
                       size_t n, const char *claimer, int64_t lease_ms, int64_t *ids /* OUT */);

/* One push with what a deliverer or a page needs to know about it. */
typedef struct state_push {
    int64_t id, job_id, run_id, checkpoint_id, endpoint_id, export_id;
    char *job_name;         /* NULL when the push has no job */
    char *checkpoint_uid, *checkpoint_path;
    char *url, *model, *label;
    bool full;              /* a full push was asked for (else a delta where one will do) */
    bool sent_full;         /* the last body sent was a full push (false: a delta, or none) */
    char *reason;
    state_push_state_t state;
    int http_status;        /* of the last attempt; 0: no answer */
    char *error;            /* of the last attempt; NULL when none */
    int attempts;           /* HTTP attempts over every delivery round */
    int rounds;             /* delivery rounds that ended */
    int64_t not_before_ms;  /* a pending push waits until then */
    char *claimed_by;       /* the deliverer sending it; NULL */
    int64_t lease_until_ms;
    char *token_env;
    int64_t created_at, started_at, ended_at;
    bool gated;             /* the quality gate applies (push.max_regression) */
} state_push_t;
/* "full" or "delta": what the push sent, or, before it sent anything, what it
 * asks for. */
const char *state_push_mode_name(const state_push_t *p);
void state_push_fini(state_push_t *p);
void state_pushes_free(state_push_t *ps, size_t n);
int state_push_get(state_t *st, int64_t push_id, state_push_t *out /* OUT */);

/* Pushes by what they belong to (each filter 0: any), newest first, at most
 * limit (1..STATE_PAGE_MAX); open_only: pending and sending ones. */
typedef struct state_push_filter {
    int64_t job_id, run_id, checkpoint_id, endpoint_id;
    bool open_only;
} state_push_filter_t;
int state_push_list(state_t *st, const state_push_filter_t *f, int limit,
                    state_push_t **out /* OUT */, size_t *n /* OUT */);

/* Claims for claimer, in one transaction, up to max pushes that are due:
 * pending with not_before_ms <= now_ms, or sending under a lease that ran
 * out. At most one push per endpoint is out at a time (an endpoint with a
 * push being sent is passed over), and a push that a newer push to the same
 * endpoint follows is superseded instead of claimed. The claimed pushes are
 * sending, leased until now_ms + lease_ms. */
int state_push_claim(state_t *st, const char *claimer, int64_t now_ms, int64_t lease_ms, int max,
                     state_push_t **out /* OUT */, size_t *n /* OUT */);
/* Gives back to pending every push claimed by a deliverer that dead() says
 * is gone (kilnd or a CLI killed mid-delivery), so it is sent again;
 * *n (may be NULL) says how many. */
int state_push_reclaim(state_t *st, bool (*dead)(const char *claimer, void *ctx), void *ctx,
                       int *n /* OUT */);
/* The earliest not_before_ms of a pending push (0: none pending). */
int state_push_next_due(state_t *st, int64_t *at_ms /* OUT */);

/* How one delivery round of a push ended (state_push_end). */
typedef struct state_push_outcome {
    state_push_state_t state; /* SUCCEEDED, FAILED, HELD, or PENDING: try again */
    int64_t not_before_ms;    /* PENDING: not before then */
    int http_status;          /* of the last attempt; 0: none */
    int attempts;             /* HTTP attempts in this round */
    const char *error;        /* NULL on success */
    bool sent;                /* a body went out: an exports row records it */
    bool full;                /* it was a full push (else a delta on base) */
    int64_t base_checkpoint_id; /* the delta's base; 0 */
    int64_t bytes;
    const char *event;        /* the "push" event's message; NULL: none */
} state_push_outcome_t;
/* Ends a delivery round of push_id, which claimer must hold (KILN_ESTATE
 * otherwise: the lease ran out and another deliverer took it, or it ended).
 * On success the endpoint's holding moves to the push's checkpoint; the
 * export, the push and the event commit together. */
int state_push_end(state_t *st, int64_t push_id, const char *claimer,
                   const state_push_outcome_t *o);

/* ---- events (an append-only audit log per run or job) --------------------------- */
/* job_id 0 with run_id > 0 files the event under the run's job; run_id 0:
 * a job event. KILN_ENOENT when the job or run does not exist. */
int state_event_add(state_t *st, int64_t job_id, int64_t run_id, const char *kind,
                    const char *message);
typedef struct state_event {
    int64_t id, job_id, run_id, at;
    char *kind, *message;
} state_event_t;
/* Events of a run (run_id > 0) or of a job (run_id == 0; includes the events
 * of its runs), oldest first; both 0 lists every event. */
int state_event_list(state_t *st, int64_t job_id, int64_t run_id, state_event_t **out /* OUT */,
                     size_t *n /* OUT */);
void state_events_free(state_event_t *es, size_t n);

/* ---- the scheduler's queries ---------------------------------------------------- */
/* SQLite's PRAGMA data_version: it changes when another connection commits to
 * the file (not on this connection's own writes), so kilnd polls it cheaply
 * to notice a submit or cancel from the CLI. */
int state_data_version(state_t *st, int64_t *out /* OUT */);
/* Ends a run (the compare-and-set of state_run_transition) and, when
 * retry_not_before >= 0, queues its retry in the same transaction: a new run
 * of the same job and scheduled time, trigger retry, attempt + 1, retry_of
 * run_id, not_before retry_not_before. So a run that failed is never left
 * without the retry its policy promised, and a run is retried at most once
 * (KILN_EEXIST when a retry of it exists). *retry_id is 0 when none was
 * queued; retry_id may be NULL. */
int state_run_end(state_t *st, int64_t run_id, state_run_state_t from, state_run_state_t to,
                  int exit_code, const char *error, int64_t retry_not_before,
                  int64_t *retry_id /* OUT, may be NULL */);
/* state_run_end with the time the run really ended (ended_at > 0, Unix
 * seconds; 0: now): kilnd records a run that ended while it was down with
 * the time its supervisor wrote into the run's status file, not the time
 * kilnd came back. retry_not_before < 0 queues no retry, so this also ends
 * a run that did not fail. */
int state_run_end_at(state_t *st, int64_t run_id, state_run_state_t from, state_run_state_t to,
                     int exit_code, const char *error, int64_t ended_at, int64_t retry_not_before,
                     int64_t *retry_id /* OUT, may be NULL */);

/* A run succeeded: the compare-and-set of state_run_transition to
 * succeeded and, in the same transaction, the pushes its job's
 * export.on_success asks for (state_push_enqueue, pending for kilnd), so a
 * kilnd killed right after the run ended loses no push. push_ids (npushes)
 * may be NULL. */
int state_run_succeed(state_t *st, int64_t run_id, state_run_state_t from, int exit_code,
                      int64_t ended_at /* 0: now */, const state_push_req_t *pushes,
                      size_t npushes, int64_t *push_ids /* OUT */);


/* ---- Slurm jobs (runs of launcher: slurm) ---------------------------------------- */
typedef struct state_slurm_job {
    int64_t run_id;
    int64_t job_id;   /* Slurm's job id */
    char *state;      /* Slurm's job state when last seen: PENDING, RUNNING, COMPLETED, ... */
    char *nodes;      /* Slurm's node list, e.g. "kn[1-2]"; NULL before the job ran */
    char *partition;  /* NULL: not known yet */
    int64_t updated_at;
} state_slurm_job_t;

/* Records the Slurm job of a run, or what changed about it; the run's events
 * say so ("slurm": submitted, a new state, its nodes). */
int state_slurm_job_put(state_t *st, const state_slurm_job_t *j);
/* The Slurm job of run_id; KILN_ENOENT when it has none. */
int state_slurm_job_get(state_t *st, int64_t run_id, state_slurm_job_t *out /* OUT */);
void state_slurm_job_fini(state_slurm_job_t *j); /* accepts NULL */

/* ---- lineage queries (kiln lineage, the web page) ------------------------------- */
int state_checkpoint_get_by_id(state_t *st, int64_t id, state_checkpoint_t *out /* OUT */);
/* Checkpoints a run wrote, oldest first. Free with state_checkpoints_free. */
int state_checkpoint_list_by_run(state_t *st, int64_t run_id, state_checkpoint_t **out /* OUT */,
                                 size_t *n /* OUT */);
void state_checkpoints_free(state_checkpoint_t *cs, size_t n);

/* One push of a checkpoint (with the export it sent, if any), or an export
 * of it that was never pushed (a file export: npy, hugectr, an online
 * export's own record). */
typedef struct state_served {
    int64_t export_id; /* 0: the push sent nothing yet (pending, superseded, held) */
    char *format, *export_path;
    int64_t push_id;   /* 0: an export that is not a push */
    char *push_state;  /* a state_push_state_t name; NULL without a push */
    int http_status;
    int64_t endpoint_id;
    char *url, *model, *label;
    bool holding; /* the endpoint holds this checkpoint now */
} state_served_t;
/* The pushes and exports of a checkpoint, oldest first. Free with
 * state_served_free. */
int state_lineage_served(state_t *st, int64_t checkpoint_id, state_served_t **out /* OUT */,
                         size_t *n /* OUT */);
void state_served_free(state_served_t *sv, size_t n);
/* The endpoint with this URL (and model and label, when not NULL; the
 * lowest id when several match). KILN_ENOENT when none. */
int state_endpoint_find(state_t *st, const char *url, const char *model, const char *label,
                        int64_t *id /* OUT */);

/* ---- the web page's queries (state/queries_web.c) ------------------------------
 * Read-only; each costs what it returns, not what the database holds. */
#define STATE_PAGE_MAX 1000

/* One page of runs, newest first: runs with id < before_id (0: from the
 * newest), of job_id (0: any job), in state (a state_run_state_t, -1: any),
 * at most limit (1..STATE_PAGE_MAX). Walks an index (keyset pagination), so
 * a page costs the same at run 10 and at run 100000. The next page starts
 * before the last id returned. Free with state_runs_free. */
int state_run_page(state_t *st, int64_t job_id, int state, int64_t before_id, int limit,
                   state_run_t **out /* OUT */, size_t *n /* OUT */);

typedef struct state_job_last {
    int64_t last_run_id; /* 0: the job has no run */
    state_run_state_t last_state;
    int64_t last_queued_at;
    int64_t last_success_at; /* ended_at of the newest succeeded run; 0: none */
} state_job_last_t;
/* The newest run of a job and the time of its last success. */
int state_job_last(state_t *st, int64_t job_id, state_job_last_t *out /* OUT */);

/* The value at the highest step of a run's metric; *found false when none. */
int state_metric_last(state_t *st, int64_t run_id, const char *name, double *value /* OUT */,
                      bool *found /* OUT */);

/* Runs per (job, state), kept up to date by triggers. Free with free(). */
typedef struct state_run_count {
    int64_t job_id;
    state_run_state_t state;
    int64_t n;
} state_run_count_t;
int state_run_counts(state_t *st, state_run_count_t **out /* OUT */, size_t *n /* OUT */);

/* Durations (ended_at - started_at, seconds) of the runs that ended after
 * they started, per job, as a histogram with the upper bounds
 * STATE_DURATION_BOUNDS (and INT64_MAX for +Inf). Rows are per (job_id, le),
 * NOT cumulative; sum_s is the sum of the durations in the bucket. Kept by
 * triggers. Free with free(). */
#define STATE_DURATION_BOUNDS 1, 5, 15, 60, 300, 900, 3600, 10800, 43200, 86400
typedef struct state_duration_bucket {
    int64_t job_id, le, n, sum_s;
} state_duration_bucket_t;
int state_run_durations(state_t *st, state_duration_bucket_t **out /* OUT */,
                        size_t *n /* OUT */);

/* Every endpoint with what it holds now and its push counts, by model, label
 * then URL. */
typedef struct state_endpoint_info {
    int64_t id;
    char *url, *model, *label;
    int64_t created_at;
    int64_t checkpoint_id; /* held now; 0: nothing yet */
    char *checkpoint_uid;  /* NULL when nothing is held */
    int64_t since;         /* held since; 0: nothing */
    int64_t checkpoint_created_at;  /* when the held checkpoint was written; 0 */
    double eval_logloss, eval_auc;  /* measured on the held checkpoint; NAN */
    int64_t pushes_failed, pushes_succeeded, pushes_pending; /* pending: pending + sending */
    int64_t pushes_held;
    int64_t last_push_at;
    char *last_error;      /* of the newest push that did not succeed; NULL */
    int last_http_status;  /* and its HTTP status */
    int64_t stats_at;      /* the last /v1/stats read (state_endpoint_set_stats); 0 */
    int64_t predict_requests, predict_rows;
    double request_rate;   /* NAN: not known */
    char *stats_error;
} state_endpoint_info_t;
int state_endpoint_list(state_t *st, state_endpoint_info_t **out /* OUT */, size_t *n /* OUT */);
void state_endpoint_info_fini(state_endpoint_info_t *e);
void state_endpoint_infos_free(state_endpoint_info_t *es, size_t n);

/* The checkpoints an endpoint held, newest first (until_at 0: held now). */
typedef struct state_holding {
    int64_t checkpoint_id;
    char *checkpoint_uid;
    int64_t since, until_at, push_id;
} state_holding_t;
int state_endpoint_history(state_t *st, int64_t endpoint_id, int limit /* <= 0: all */,
                           state_holding_t **out /* OUT */, size_t *n /* OUT */);
void state_holdings_free(state_holding_t *hs, size_t n);

/* The run that retries run_id (its retry_of), or 0 when none. */
int state_run_retry_find(state_t *st, int64_t run_id, int64_t *retry_id /* OUT */);

/* Checkpoints derived from checkpoint_id, oldest first, at most limit
 * (1..STATE_PAGE_MAX): its incremental children and, recursively, theirs,
 * and every checkpoint of a run that started from one of them (a resume or
 * warm start, whatever kind its dumps are). Free with state_checkpoints_free. */
int state_checkpoint_descendants(state_t *st, int64_t checkpoint_id, int limit,
                                 state_checkpoint_t **out /* OUT */, size_t *n /* OUT */);

/* Checkpoints built on checkpoint_id (incrementals whose parent it is), oldest
 * first, at most limit (1..STATE_PAGE_MAX). Free with state_checkpoints_free. */
int state_checkpoint_children(state_t *st, int64_t checkpoint_id, int limit,
                              state_checkpoint_t **out /* OUT */, size_t *n /* OUT */);

#ifdef __cplusplus
}
#endif

#endif /* KILN_STATE_STATE_H */
