/*
 * scheduler/scheduler.h - kilnd, Kiln's scheduler daemon, as a library: the
 * `kilnd` program and `kiln daemon` both parse their options with
 * sched_options_parse() and run sched_run(), which returns when the daemon
 * was told to stop (SIGTERM / SIGINT) or could not start.
 *
 * What the daemon does (docs/operations.md): it fires cron schedules, queues
 * and launches runs through a launcher (mpirun on this host or over a
 * hostfile) under a small supervisor process per run, enforces timeouts,
 * cancels, retries with backoff, picks the new input partitions of
 * incremental jobs, and on start adopts the runs a previous kilnd left
 * behind. One event loop (epoll over a signalfd, a timerfd, an inotify on the
 * database's directory and a pidfd per run); idle, it sleeps.
 */
#ifndef KILN_SCHEDULER_SCHEDULER_H
#define KILN_SCHEDULER_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sched_options {
    const char *db_path;  /* default $KILN_HOME/kiln.db */
    const char *home;     /* default $KILN_HOME, else ~/.kiln: runs/ lives here */
    const char *listen;   /* web status page address (served once web/ lands) */
    const char *trainer;  /* kiln-train; default $KILN_TRAIN, else next to kilnd, else PATH */
    const char *mpirun;   /* default "mpirun" */
    const char *log_path; /* NULL: stderr */
    int max_ranks;        /* ranks in use at once; default the number of cores */
    int64_t grace_ms;     /* SIGTERM -> SIGKILL on cancel and timeout; default 10 s */
    int64_t poll_ms;      /* database change poll; default 1 s */
    int64_t stats_every_ms; /* reads of endpoints' /v1/stats; default 10 s; 0: none */
    int64_t slurm_poll_ms; /* how often a Slurm run's supervisor asks about its job; 5 s */
    int64_t keep_runs_ms;  /* compact, then remove, runs that ended this long ago (retention,
                              sched_retain.c); 0: keep every run whole */
    bool drain;           /* on SIGTERM, wait for running runs instead of leaving them */
    bool log_json;        /* log lines as JSON objects */
} sched_options_t;

/* Fills the defaults (which read KILN_HOME, HOME, KILN_TRAIN). */
void sched_options_init(sched_options_t *o);
/* Parses kilnd's options from argv[from..argc). Returns 0, 1 when --help was
 * asked (usage printed on stdout), or KILN_EUSAGE with a message. The strings
 * stay owned by argv. */
int sched_options_parse(int argc, char **argv, int from, sched_options_t *o /* OUT */);
/* Prints kilnd's options to f, for `kilnd --help` and `kiln daemon --help`. */
void sched_usage(FILE *f, const char *prog);

/* Runs the daemon in this process until SIGTERM or SIGINT (with o->drain:
 * until the runs it supervises ended, or a second signal). Returns 0, or a
 * negative KILN_E* code with kiln_errmsg() saying why it could not start
 * (the database cannot be opened, another kilnd holds it). */
int sched_run(const sched_options_t *o);

#ifdef __cplusplus
}
#endif

#endif /* KILN_SCHEDULER_SCHEDULER_H */
