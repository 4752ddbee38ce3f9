/*
 * run/run.h - the contract between kilnd and kiln-train, in one place: the
 * files of a run directory ($KILN_HOME/runs/<id>/) and who writes each, the
 * records kiln-train leaves there (a progress line per logged step and per
 * checkpoint, the result of the run), the status the supervisor writes when
 * the run's processes are gone, the exit codes and what kilnd does with
 * each, the environment variables of a run, and the name of every figure
 * (the same word in progress.jsonl, result.json, the metrics table, the
 * JSON API and the pages). Each side uses the typed writers and readers
 * below; no record is a string written in one file and parsed in another.
 * docs/operations.md ("The run directory") describes the same contract for
 * people.
 */
#ifndef KILN_RUN_RUN_H
#define KILN_RUN_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the files of a run directory ------------------------------------------------ */
#define RUN_FILE_SPEC "spec.yaml"           /* kilnd: the spec version the run uses */
#define RUN_FILE_INPUTS "inputs.txt"        /* kilnd: incremental jobs' new partitions */
#define RUN_FILE_LOG "log"                  /* supervisor: every rank's stdout + stderr */
#define RUN_FILE_PROGRESS "progress.jsonl"  /* kiln-train rank 0: run_progress_t lines */
#define RUN_FILE_RESULT "result.json"       /* kiln-train rank 0: run_result_t */
#define RUN_FILE_SUPERVISOR "supervisor.pid" /* supervisor: "PID START_TICKS" */
#define RUN_FILE_LAUNCHER "mpirun.pid"      /* supervisor: the launcher's pid */
#define RUN_FILE_STOP "stop"                /* kilnd: why it stopped the run */
#define RUN_FILE_STATUS "status"            /* supervisor: run_status_t, at the end */
#define RUN_FILE_EXPORT_REQUEST "export.request" /* anyone: export at the next step */
#define RUN_FILE_EXPORT_LAST "export.last"  /* kiln-train rank 0: the newest online export */
#define RUN_FILE_SLURM "slurm.json"         /* supervisor (slurm): the job it follows */
#define RUN_FILE_SLURM_SCRIPT "slurm.sh"    /* kilnd (slurm): the batch script */

/* run_dir/name, malloc'd (NULL: out of memory). */
char *run_path(const char *run_dir, const char *name);
/* Writes text to <run_dir>/<name> atomically (kiln_write_atomic). Returns
 * 0, KILN_ENOMEM or KILN_EIO. */
int run_write_text(const char *run_dir, const char *name, const char *text);

/* ---- the environment of a run (set by kilnd, read by kiln-train) ------------------- */
#define RUN_ENV_RUN_ID "KILN_RUN_ID"     /* the run's id in the database */
#define RUN_ENV_ATTEMPT "KILN_ATTEMPT"   /* 1 for the first try */
#define RUN_ENV_SPEC_DIR "KILN_SPEC_DIR" /* where the spec's relative paths resolve */

/* ---- exit codes of kiln-train -------------------------------------------------------- */
typedef enum {
    RUN_EXIT_OK = 0,    /* it worked */
    RUN_EXIT_BUG = 1,   /* an internal error: not retried */
    RUN_EXIT_INPUT = 2, /* bad input (spec, options, data, a full table): not retried */
    RUN_EXIT_RETRY = 3, /* a failure a retry may fix (I/O, MPI, memory, disk full) */
} run_exit_t;

/* Whether kilnd retries a run whose launcher ended so: RUN_EXIT_RETRY, an
 * exit above 128 or a signal (a killed rank or mpirun). */
bool run_exit_retryable(int exit_code, int signal);

/* ---- figures: one name each ---------------------------------------------------------- */
#define RUN_FIG_LOSS "loss"                   /* mean training loss since the last record */
#define RUN_FIG_SAMPLES_PER_S "samples_per_s" /* training rows / training seconds so far */
#define RUN_FIG_EVAL_LOGLOSS "eval_logloss"
#define RUN_FIG_EVAL_AUC "eval_auc"
#define RUN_FIG_TRAIN_SECONDS "train_seconds"

/* ---- progress.jsonl ----------------------------------------------------------------
 * One line per record, appended by kiln-train's rank 0 and imported by kilnd
 * (as metrics) while the run goes. A step record comes every few steps (often
 * enough that a short run's loss is a curve, at most a few hundred per pass);
 * a checkpoint record for each checkpoint written. */
typedef enum { RUN_REC_STEP = 0, RUN_REC_CHECKPOINT = 1 } run_rec_kind_t;

typedef struct run_progress {
    run_rec_kind_t kind;
    int64_t step;         /* optimizer steps so far */
    int64_t time;         /* Unix seconds */
    /* RUN_REC_STEP */
    int64_t samples;      /* training rows so far */
    double loss;          /* RUN_FIG_LOSS */
    double samples_per_s; /* RUN_FIG_SAMPLES_PER_S */
    double seconds;       /* training seconds so far */
    /* RUN_REC_CHECKPOINT */
    char checkpoint[64];  /* its uid */
    char ckpt_kind[16];   /* "full" | "incremental" */
    int64_t keys, bytes;
    double ckpt_seconds;  /* how long writing it took */
    bool online;          /* an online export */
} run_progress_t;

/* Appends one record as a line to f and flushes. Returns 0 or KILN_EIO. */
int run_progress_write(FILE *f, const run_progress_t *p);
/* Parses one line. Returns 0, or KILN_EINVAL for a line that is not a record
 * (the caller skips it). */
int run_progress_parse(const char *line, run_progress_t *out /* OUT */);

/* The embedding tables at the end of a run (result.json "tables"): where
 * their rows live and what the disk tier, expiry and admission did. */
typedef struct run_tables {
    bool tiered;               /* some table kept rows on disk */
    int64_t rows_ram, rows_disk;
    double ram_hit_rate;       /* of the keys looked up, the share found in RAM; NAN: none */
    int64_t disk_read_bytes, disk_written_bytes;
    int64_t disk_reads, disk_writes; /* transfers: a tier's cost goes by these more than by bytes */
    int64_t rows_expired;      /* removed by model.embedding.ttl */
    int64_t admit_rejected;    /* lookups of keys not admitted yet */
    char disk_io[8];           /* how rank 0's tiers read (job_spill_io_name); "": none */
} run_tables_t;

/* ---- result.json ----------------------------------------------------------------------
 * What a run did, written once at the end by rank 0 (also printed as one
 * JSON line on stdout). NAN: not measured (no eval data). */
typedef struct run_result {
    char job[128], model[16];
    int64_t rows;            /* training rows processed, all ranks and epochs */
    int ranks, threads;
    int64_t steps;
    double train_seconds;    /* RUN_FIG_TRAIN_SECONDS: the training loop alone */
    double samples_per_s;    /* RUN_FIG_SAMPLES_PER_S: rows / train_seconds */
    int64_t eval_rows;
    double eval_logloss, eval_auc; /* RUN_FIG_EVAL_* */
    int64_t keys;            /* live keys in all tables at the end */
    int64_t malformed;       /* malformed input lines skipped */
    char checkpoint[64];     /* uid of the checkpoint written at the end; "" none */
    char dense_kernels[64];  /* the BLAS kernel set the dense math ran: "OpenBLAS 0.3.21
                                Cooperlake" (model_kernels_t.name) */
    char dense_precision[8]; /* model.dense_precision as it ran: "fp32" or "bf16" */
    char reader[8];          /* where batches were made: "thread" or "team" (data.reader) */
    char openmp_wait[48];    /* how idle OpenMP workers waited: "GOMP_SPINCOUNT=30000" (Kiln's
                                default), "OMP_WAIT_POLICY=passive", ... */
    run_tables_t tables;
} run_result_t;

/* Writes run_dir/result.json atomically and, when out is not NULL, the same
 * JSON as one line on out. Returns 0, KILN_EIO or KILN_ENOMEM. */
int run_result_write(const char *run_dir, const run_result_t *r, FILE *out);
/* Reads run_dir/result.json. KILN_ENOENT when there is none yet. */
int run_result_read(const char *run_dir, run_result_t *out /* OUT */);

/* ---- status: how the run's processes ended (the supervisor) --------------------------- */
typedef struct run_status {
    int exit_code;    /* the launcher's exit code; -1 when a signal killed it */
    int signal;       /* the signal that killed the launcher; 0: none */
    char stop[32];    /* the reason kilnd gave in RUN_FILE_STOP; "" none */
    int64_t started_at, ended_at; /* Unix seconds */
    /* A run followed elsewhere (launcher: slurm): the scheduler's job and how
     * it ended; job_state "" for a local process tree. */
    int64_t job_id;
    char job_state[32];   /* COMPLETED, FAILED, TIMEOUT, NODE_FAIL, ... */
    char job_nodes[256];  /* Slurm's node list, e.g. kn[1-2] */
    char job_reason[512]; /* what the scheduler (or the follower) said */
} run_status_t;
int run_status_write(const char *run_dir, const run_status_t *s);
/* KILN_ENOENT while the supervisor has not written it; KILN_ECORRUPT. */
int run_status_read(const char *run_dir, run_status_t *out /* OUT */);

/* ---- stop: why kilnd stops a run --------------------------------------------------------- */
#define RUN_STOP_CANCELED "canceled"
#define RUN_STOP_TIMED_OUT "timed_out"
#define RUN_STOP_REPLACED "replaced"
int run_stop_write(const char *run_dir, const char *reason);
/* The reason, or "" when kilnd asked for none. */
void run_stop_read(const char *run_dir, char *out, size_t cap);

/* ---- pid files ("PID START_TICKS": the start time tells a reused pid) -------------------- */
int run_pidfile_write(const char *run_dir, const char *name, pid_t pid, uint64_t start_ticks);
/* KILN_ENOENT when there is none, KILN_ECORRUPT when it does not parse. */
int run_pidfile_read(const char *run_dir, const char *name, pid_t *pid /* OUT */,
                     uint64_t *start_ticks /* OUT */);

/* ---- online exports ----------------------------------------------------------------------- */
/* Asks a running trainer for an export at its next step boundary (the file
 * is removed when seen; SIGUSR1 does the same). */
int run_export_request(const char *run_dir);
/* Whether an export was asked for; removes the request. */
bool run_export_take_request(const char *run_dir);
/* The newest online export, written by rank 0 after each. */
typedef struct run_export {
    char checkpoint[64]; /* its uid */
    char kind[16];       /* "full" | "incremental" */
    char parent[64];     /* the checkpoint it is a delta on; "" for a full one */
    char path[4096];
    int64_t step, keys, bytes, time;
} run_export_t;
int run_export_last_write(const char *run_dir, const run_export_t *e);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUN_RUN_H */
