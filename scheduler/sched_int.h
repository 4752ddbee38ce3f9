/*
 * scheduler/sched_int.h - what the files of scheduler/ share: the daemon's
 * state (sched_t), the runs it supervises (sched_active_t), the launcher
 * interface, the supervisor, the run directory helpers. Not included from
 * outside scheduler/.
 */
#ifndef KILN_SCHEDULER_SCHED_INT_H
#define KILN_SCHEDULER_SCHED_INT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "jobs.h"
#include "kiln.h"
#include "run.h"
#include "scheduler.h"
#include "state.h"

/* ---- launchers ------------------------------------------------------------------
 * A launcher turns a run into the command the supervisor execs. `local` and
 * `hostfile` are mpirun (sched_launch_mpi.c); `slurm` is sbatch of a batch
 * script that starts the ranks with srun, and the supervisor follows the
 * Slurm job instead of waiting for a local process (sched_launch_slurm.c). */
typedef struct sched_launch_ctx {
    const char *mpirun, *trainer;
    const job_spec_t *spec;
    const char *hostfile; /* resolved against the spec's directory */
    const char *spec_path, *run_dir, *inputs_path; /* inputs_path NULL: none */
    const char *resume_path; /* a retry: the failed attempt's newest checkpoint, or NULL */
    const char *db_path;
    int64_t run_id;
    const char *spec_dir; /* KILN_SPEC_DIR of the run, or NULL (remote ranks need it passed) */
} sched_launch_ctx_t;

typedef struct sched_follow_opts sched_follow_opts_t;

/* The supervisor's body for a run that is not a local process tree: starts
 * it (argv, or nothing when the run directory already names the job it
 * follows: adoption), follows it until it ended, and fills *out (exit code,
 * the scheduler's end state) for run_dir/status. SIGTERM arrives through
 * sigs (blocked; sigtimedwait) and means: stop the run, reason in run_dir/stop. */
typedef void (*sched_follow_fn)(const char *run_dir, char *const argv[],
                                const sched_follow_opts_t *o, run_status_t *out /* OUT */);
struct sched_follow_opts {
    const void *sigs; /* const sigset_t *: SIGTERM and friends, blocked */
    int64_t poll_ms;  /* how often to ask the scheduler */
};

typedef struct sched_launcher {
    const char *name;
    /* Builds a NULL-terminated argv (free with sched_argv_free). Returns 0,
     * KILN_ENOMEM or KILN_EINVAL (message says what is missing). */
    int (*build_argv)(const sched_launch_ctx_t *ctx, char ***argv /* OUT */);
    /* NULL: the supervisor execs argv and waits for it (mpirun). */
    sched_follow_fn follow;
} sched_launcher_t;

/* The launcher of spec.resources.launcher, or NULL (message set) when this
 * build has none for it (sched_launch.c). */
const sched_launcher_t *sched_launcher_for(job_launcher_t which);
/* The mpirun launchers' argv (sched_launch_mpi.c). */
int sched_mpi_local_argv(const sched_launch_ctx_t *ctx, char ***argv /* OUT */);
int sched_mpi_hostfile_argv(const sched_launch_ctx_t *ctx, char ***argv /* OUT */);

/* Building an argv (sched_argv.c): push copies s, pushf formats one
 * argument; after an allocation failure pushes do nothing and finish
 * returns KILN_ENOMEM (argv freed). */
void sched_argv_free(char **argv);
typedef struct sched_argv {
    char **v;
    size_t n, cap;
    bool oom;
} sched_argv_t;
void sched_argv_push(sched_argv_t *a, const char *s);
void sched_argv_pushf(sched_argv_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int sched_argv_finish(sched_argv_t *a, char ***out /* OUT */);
/* Pushes `kiln-train --spec S --run-dir D [...]` for ctx: the
 * command every launcher ends with. */
void sched_argv_trainer(sched_argv_t *a, const sched_launch_ctx_t *c);

/* ---- launcher: slurm (sched_launch_slurm.c) -------------------------------------- */
int sched_slurm_argv(const sched_launch_ctx_t *ctx, char ***argv /* OUT */);
void sched_slurm_follow(const char *run_dir, char *const argv[], const sched_follow_opts_t *o,
                        run_status_t *out /* OUT */);

/* ---- the supervisor (sched_supervise.c) -----------------------------------------
 * A forked child of kilnd that calls setsid() (so it leads its own session and
 * process group, and kilnd's death does not reach it), starts argv with the
 * run directory's RUN_FILE_LOG as stdout and stderr, waits for it and writes
 * RUN_FILE_STATUS (run/run.h). SIGTERM to the supervisor stops the run:
 * SIGTERM to every process of the session (mpirun and each rank, which Open
 * MPI puts in process groups of their own), SIGKILL after grace_ms. The
 * reason is read from RUN_FILE_STOP (written by kilnd first). */
int sched_supervise_spawn(const char *run_dir, char *const argv[], int64_t grace_ms,
                          pid_t *pid /* OUT */);
/* The same with the launcher's follow (NULL: as above) as the supervisor's
 * body; argv may then be NULL (adopting the job named in run_dir). env
 * (NULL-ended, may be NULL) is the run's environment, applied in the child
 * only, never in kilnd: each "NAME=VALUE" is set, each bare "NAME" unset. */
int sched_supervise_spawn_follow(const char *run_dir, char *const argv[], const char *const *env,
                                 int64_t grace_ms, sched_follow_fn follow, int64_t poll_ms,
                                 pid_t *pid /* OUT */);
/* The signals kilnd and each supervisor block and then read from a signalfd
 * (SIGCHLD, SIGTERM, SIGINT, SIGHUP), into *set. */
void sched_signal_set(sigset_t *set /* OUT */);
/* Writes the stop reason, then SIGTERMs the supervisor. Returns 0 or KILN_EIO. */
int sched_stop_request(const char *run_dir, pid_t sup_pid, const char *reason);
/* Sends sig to every process of session sid except the caller; returns how many. */
int sched_kill_session(pid_t sid, int sig);
/* Why a run failed, from the tail of its log: a dead rank with its host and
 * signal, or kiln-train's own "rank R on HOST: ..." line. Returns a malloc'd
 * sentence. */
char *sched_failure_reason(const char *run_dir, const run_status_t *stat);

/* ---- the daemon ------------------------------------------------------------------ */
typedef enum { STOP_NONE, STOP_CANCELED, STOP_TIMED_OUT, STOP_REPLACED } sched_stop_t;

typedef struct sched_active {
    int64_t run_id, job_id;
    int attempt;
    pid_t pid;   /* the supervisor */
    int pidfd;   /* readable when the supervisor exited */
    bool child;  /* our child (reap it) or adopted from an earlier kilnd */
    int ranks;
    char *run_dir;
    int64_t started_ms;  /* when it was launched (or adopted) */
    int64_t deadline_ms; /* timeout; 0: none */
    int64_t backstop_ms; /* after a stop: SIGKILL the session if still alive; 0: none */
    sched_stop_t stop;
    int64_t replaced_by;
    int64_t progress_off; /* bytes of progress.jsonl already recorded as metrics */
    int64_t export_seen;  /* the newest online export whose pushes are queued (its id) */
    bool followed;        /* its supervisor follows a job elsewhere (slurm): no backstop */
    int follows;          /* followers started for this run (slurm: re-adoptions) */
    bool result_imported; /* result.json's figures are recorded (once) */
    int64_t end_retry_ms; /* it ended, but the record of its end failed: try again then;
                             0: not ended, or not failed */
    int end_tries;        /* records of its end that failed */
} sched_active_t;

/* What a job's fires saw of its data files (sched_inputs.c). */
typedef struct sched_seen sched_seen_t;
sched_seen_t *sched_seen_create(void);
void sched_seen_destroy(sched_seen_t *seen); /* accepts NULL */

typedef struct sched_job {
    state_job_t row;
    bool spec_ok;
    job_spec_t spec;
    bool has_cron;
    job_cron_t cron;
    sched_seen_t *seen; /* kept across reloads; NULL: remember nothing */
} sched_job_t;

/* sched_push.c: the push dispatcher and workers, and the stats reader. */
typedef struct sched_pusher sched_pusher_t;

typedef struct sched {
    sched_options_t o;
    char *db_path, *home, *trainer;
    state_t *st;
    int epfd, sigfd, timerfd, inofd, lockfd;
    char host[256];
    int64_t data_version;
    bool dirty;      /* something changed: rescan jobs, cron and the queue */
    bool stopping;   /* SIGTERM seen */
    bool quit;
    sched_active_t *act;
    size_t nact, capact;
    sched_job_t *jobs;
    size_t njobs;
    int64_t next_progress_ms;
    int64_t next_retain_ms; /* the next retention pass (sched_retain.c) */
    state_retain_t retain;  /* its cursors, kept across passes */
    uint64_t rng;
    sched_pusher_t *pusher;
} sched_t;

/* Starts the threads that deliver queued pushes, drive push.ramp's traffic
 * shares and (stats_every_ms > 0) read endpoints' stats, each with its own
 * connection to db_path. */
int sched_pusher_start(const char *db_path, int64_t stats_every_ms,
                       sched_pusher_t **out /* OUT */);
/* Something was queued: the dispatcher looks now instead of at its next poll. */
void sched_pusher_kick(sched_t *s);
/* Stops the threads (a push in hand gets a few seconds to finish). Accepts NULL. */
void sched_pusher_stop(sched_pusher_t *p);
/* Queues the pushes of a running run's newest online export, once (sched_run.c). */
void sched_scan_exports(sched_t *s, sched_active_t *a);

/* sched_queue.c: jobs cache, cron fires and catch-up, the queue and launch. */
/* sched_jobs.c: the job table. */
int sched_jobs_reload(sched_t *s);
void sched_job_clear(sched_job_t *j);
sched_job_t *sched_job_find(sched_t *s, int64_t job_id);
int sched_cron_tick(sched_t *s, int64_t now_s, int64_t *next_ms /* IN/OUT: earliest wake */);
int sched_dispatch(sched_t *s, int64_t now_ms, int64_t *next_ms /* IN/OUT */);
int sched_ranks_in_use(const sched_t *s);

/* sched_retain.c: with --keep-runs, compacts old runs and removes what
 * nothing needs any more (a pass a tenth of --keep-runs apart, 1 s to an
 * hour). Returns when the next pass is due (0: retention is off). */
int64_t sched_retain(sched_t *s, int64_t now_ms);

/* sched_active.c: the runs supervised now. */
sched_active_t *sched_active_add(sched_t *s);
/* Stops watching a's supervisor and forgets a. */
void sched_active_remove(sched_t *s, sched_active_t *a);
/* Starts watching a supervisor (pidfd into the epoll set). */
int sched_watch(sched_t *s, sched_active_t *a);
/* Stops watching a's supervisor (its pidfd leaves the epoll set). */
void sched_unwatch(sched_t *s, sched_active_t *a);

/* sched_inputs.c: the partitions an incremental fire takes. */
/* The partitions of data.train that are not complete yet: how many, and
 * the first of them (a path malloc'd, or NULL), so that a run left with
 * nothing new can say it is waiting for them rather than that nothing came. */
typedef struct sched_incomplete {
    size_t n;
    char *first;
} sched_incomplete_t;
/* The files pattern matches that no succeeded run of the job consumed, each
 * complete (data.ready: its marker, its Parquet footer or a quiet
 * data.settle), into *out (free with state_inputs_free); one not complete yet
 * is left for a later fire (counted in *wait), and one consumed in an earlier
 * version is reported, not listed. Returns 0 or KILN_EIO / KILN_ENOMEM / a
 * database failure. */
int sched_new_inputs(sched_t *s, const sched_job_t *job, const job_spec_t *spec,
                     const char *pattern, state_input_t **out /* OUT */, size_t *nout /* OUT */,
                     sched_incomplete_t *wait /* OUT */);
/* Why a run with nothing new to train on is skipped, malloc'd. */
char *sched_no_data_reason(const job_spec_t *spec, const sched_incomplete_t *wait, bool manual);

/* sched_run.c: launching one run and ending it. */
int sched_launch(sched_t *s, const state_run_t *run, const sched_job_t *job);
/* The supervisor of a is gone: read its status, record the outcome, queue a
 * retry by policy, forget a. */
void sched_finish(sched_t *s, sched_active_t *a);
/* Records again the end of every run whose record failed and is due (see
 * sched_active_t.end_retry_ms). Returns when the next one is due (0: none). */
int64_t sched_finish_due(sched_t *s, int64_t now);
/* Records the progress lines of a run written since the last call as metrics. */
void sched_import_progress(sched_t *s, sched_active_t *a);
/* Adopts or ends the launching/running runs a previous kilnd left. */
int sched_recover(sched_t *s);
/* Stops a running run (cancel, timeout, replace). */
void sched_stop(sched_t *s, sched_active_t *a, sched_stop_t why, int64_t now_ms);
/* Ends a run that never launched (or was lost) as failed and queues a retry
 * by policy. */
void sched_fail_run(sched_t *s, int64_t run_id, state_run_state_t from, int attempt,
                    const job_spec_t *spec, bool retryable, int exit_code, const char *error);
/* Backoff before attempt+1: backoff * 2^(attempt-1), capped, plus up to 20% jitter. */
int64_t sched_backoff_ms(sched_t *s, const job_spec_t *spec, int attempt);

/* sched_launch_slurm.c, kilnd's side of a Slurm run. */
/* Records run_dir/slurm.json (job id, state, nodes) in the database when it changed. */
void sched_slurm_import(sched_t *s, sched_active_t *a);
/* The supervisor of a Slurm run is gone without a status while its job may
 * still run (kilnd and the supervisor were killed, or the supervisor alone):
 * starts a new supervisor that follows the same job id. True when it did. */
bool sched_slurm_readopt(sched_t *s, sched_active_t *a);
/* The run's outcome from the Slurm end state in stat (no kilnd stop):
 * *to, a malloc'd *error and whether a retry may help. */
void sched_slurm_outcome(const char *run_dir, const run_status_t *stat, const job_spec_t *spec,
                         state_run_state_t *to /* OUT */, char **error /* OUT */,
                         bool *retryable /* OUT */);

#endif /* KILN_SCHEDULER_SCHED_INT_H */
