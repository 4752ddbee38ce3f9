/*
 * trainer/train_int.h - what the files of kiln-train share: the trainer's
 * state, its options, and the functions one file calls in another. Internal
 * to trainer/. kiln-train is one MPI rank of Kiln's trainer.
 *
 *   mpirun -np N kiln-train --spec FILE --run-dir DIR [options]
 *
 * Embedding tables are model parallel (key k of table t lives on rank
 * shard_owner(k)), the dense model is data parallel (replicated, gradients
 * allreduced). One step of one rank:
 *
 *   batch (n rows, S slots, CSR)      from the prefetching reader
 *   keys per table -> dedupe          (a table may serve several slots)
 *   shard_lookup                   one all-to-all of keys, one of rows
 *   kern_cpu_gather_combine           pooled E (n, S, d), all slots at once
 *   model_forward / _backward      loss, dE (n, S, d), dense grads
 *   scatter by the dedupe's inverse   dE -> gradients of each table's unique keys
 *   shard_update                   one all-to-all of gradients, fused update
 *   shard_comm_allreduce_sum_dd          dense grads over the ranks, then the dense
 *                                     optimizer step
 *
 * The owners' side of the two shard/ exchange calls goes through the rank's store
 * (shard_store_*, shard/shard.h): host tables, or GPU hash tables with the host tables as the
 * checkpoints' mirror (resources.device; docs/gpu.md).
 *
 * Global batch = batch_size x ranks, and the reader deals rows so that any
 * rank count sees the same global batches (docs/data-formats.md). Exit codes
 * are in docs/trainer.md.
 *
 * Checkpoints (docs/checkpoint-format.md): a run starts from --resume DIR
 * (same run continued: state and data position) or train.init_from (a warm
 * start: state, not position), dumps every checkpoint.every_steps steps, on
 * request (SIGUSR1 or <run-dir>/export.request, checked at step boundaries,
 * and every export.every_ms), and at the end; then applies checkpoint.keep.
 *
 * Prediction mode (`--predict GLOB --resume DIR --out FILE`): no training;
 * the ranks load the checkpoint, predict every row of the files with the
 * same lookup and forward path as the eval, and rank 0 writes one
 * probability per row, in file order. kiln-serve's consistency test compares
 * its answers with these.
 */
#ifndef KILN_TRAINER_TRAIN_INT_H
#define KILN_TRAINER_TRAIN_INT_H

#include <errno.h>
#include <glob.h>
#include <jansson.h>
#include <inttypes.h>
#include <stdarg.h>
#include <libgen.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jobs.h"
#include "kern.h"
#include "kiln.h"
#include "data.h"
#include "kern_ops.h"
#include "shard.h"
#include "ckpt.h"
#include "model.h"
#include "run.h"
#include "state.h"

typedef struct options {
    const char *spec_path;
    const char *run_dir;
    const char *data;   /* overrides data.train (a glob, relative to the cwd) */
    const char *inputs; /* a file listing the training files, one per line */
    const char *eval;   /* overrides data.eval */
    int64_t max_steps;  /* overrides train.max_steps when > 0 */
    int threads;        /* overrides resources.threads when > 0 */
    bool quiet;
    const char *resume; /* a checkpoint directory to continue from */
    const char *db;     /* record checkpoints in this SQLite file (rank 0) */
    int64_t run_id;     /* the run they belong to (with --db) */
    const char *predict; /* prediction mode: the rows to predict (a glob) */
    const char *out;     /* prediction mode: where rank 0 writes the probabilities */
    const char *store;   /* "twin": the GPU store's protocol on a host working copy (tests) */
    const char *device_step; /* "standin": the device step on the host stand-in (tests) */
    const char *device_exchange; /* "host": the device step exchanges over host buffers (tests) */
} options_t;

typedef struct train_dev train_dev_t;

typedef struct trainer {
    options_t opt;
    int rank, nranks;
    job_spec_t spec;
    char *spec_dir;

    int S, F, d, T;   /* slots, dense features, pooled width, tables */
    int *slot_table;  /* (S) */
    kern_table_t **tables;   /* (T) this rank's shards; with a GPU, the checkpoint mirror */
    shard_store_t *store;       /* where the rows of the step live (shard/shard.h) */
    shard_store_kind_t store_kind;
    int cuda_device;         /* SHARD_STORE_CUDA: this rank's GPU */
    shard_comm_t *comm;         /* the step's collectives: the exchange and the dense allreduce */
    shard_comm_t *dcomm;        /* the device step's exchange: NCCL on GPUs (NULL: none made) */
    shard_t *shard;
    model_t *model;
    shard_dedupe_t **dedupe;    /* (T) one per table, so that tables dedupe in parallel */
    kern_opt_t sparse_opt;
    kern_combine_t *combine; /* (S) */

    /* per-step scratch, sized for the largest batch seen */
    int64_t **tkeys, *tkeys_cap, *tn; /* (T) keys of each table's slots, concatenated */
    int32_t **tinv;                   /* (T) inverse index into the table's unique keys */
    int64_t *nuniq;                   /* (T) unique keys of each table */
    double **tgrad;                   /* (T) (nuniq, d, 2) double-double gradients of the unique
                                         keys (kern_ops.h), the device step's */
    int64_t *tgrad_cap;
    double *dense_pairs;              /* (nparams, 2) the dense gradient for the allreduce */
    int64_t *slot_koff;               /* (S) first key of slot s in its table's list */
    int64_t *boff;                    /* (S, max_batch + 1) bag offsets rebased to 0 */
    kern_bags_t *bags;                /* (S) */
    float *const *tvalues;            /* (T) the last lookup's rows of each table's unique keys */
    train_dev_t *dev;                 /* the device step's state; NULL: the CPU step */
    int prefetch;                     /* the readers' batches ahead; 0: made on the step's
                                         threads (set_threads says when) */
    float *E, *probs;                 /* (max_batch, S, d), (max_batch) */
    int max_batch;

    FILE *progress;
    bool error_told; /* this rank's failure was reported elsewhere (another rank, diags) */
    bool abort_needed; /* failed mid-step, where other ranks cannot learn of it */
    int64_t samples, steps;
    int64_t malformed;
    int64_t run_rows, run_malformed; /* good rows and malformed lines trained on in this
                                        run, all ranks (every rank agrees) */

    /* checkpoints */
    char *ckpt_root;                 /* spec checkpoint.dir, resolved */
    char last_uid[CKPT_UID_MAX];  /* the newest checkpoint of this lineage, "" none */
    char base_uid[CKPT_UID_MAX];  /* the full dump last_uid stands on */
    int64_t last_step;               /* step of last_uid (incremental dumps start after it) */
    int chain;                       /* incrementals since base_uid */
    bool chain_elsewhere;            /* last_uid is not in ckpt_root: next dump is full */
    bool resumed;                    /* --resume: continue the data position too */
    int64_t steps0;                  /* steps when this run started */
    int64_t start_epoch, start_k;    /* where the data resumes */
    int64_t pos_epoch, pos_k;        /* where the data stands now */
    char spec_hash[17], inputs_hash[17];
    char *lock;                      /* rank 0's pin on the checkpoint it started from */
    state_t *db;                     /* rank 0, with --db */
    int64_t last_ckpt_id;            /* rank 0: the database id of last_uid; 0 */
    int64_t last_export_ms;          /* mono ms of the last export (export.every_ms) */
    int64_t export_step;             /* tr->steps at the last export (or the start): a timed
                                        export with no step since would push nothing new */
    int64_t rec_every;               /* steps between progress records (the loss curve) */
    int64_t (*marks)[2];             /* (step, unix time) marks for a ttl as a duration */
    size_t nmarks, capmarks;
    int64_t rows_expired;            /* this rank's rows removed by ttl in this run */
    int64_t train_ns;                /* time in the training loop so far */
    char **eval_files;               /* data.eval, expanded (neval); NULL: none */
    int neval;

    /* inputs (incremental and online jobs; docs/checkpoint-format.md, "inputs") */
    json_t *done;                    /* the files the state has learnt from whole, or set aside
                                        as bad: [{path, size, mtime}], inherited from the
                                        checkpoint the run starts from; written in each
                                        checkpoint's manifest */
    char resume_hash[17];            /* --resume, online: the file the checkpoint stood in
                                        (train_hash_inputs of that one file) */
    int64_t resume_k;                /* and the batches of it already trained */
    bool data_verdict;               /* the failure returned judges the data (malformed lines,
                                        no lines, no good row), not the run */
} trainer_t;

/* Set by SIGUSR1 (the handler is train_main.c's, the flag train_ckpt.c's):
 * write an incremental dump at the next step boundary. */
extern volatile sig_atomic_t train_export_signal;

/* train_agree_on with the trainer in scope as tr. */
#define agree(rc) train_agree_on(tr, (rc))

/* ---- train_setup.c ---- */
void train_say(const trainer_t *tr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int train_agree_on(trainer_t *tr, int rc);
char *train_spec_relative(const trainer_t *tr, const char *path);
int train_expand(const char *pattern, const char *what, char ***out, int *n);
int train_read_list(const char *path, char ***out, int *n);
int train_setup_tables(trainer_t *tr);
int train_setup_model(trainer_t *tr);
/* Builds the tables and the model and names the checkpoint root (relative to
 * the spec's folder): what training and --predict both do before loading a
 * checkpoint. Returns 0 or the first failure; the caller agrees on it. */
int train_setup_run(trainer_t *tr);
int train_open_reader(trainer_t *tr, char **files, int nfiles, data_reader_t **r);
/* Whether a reader's failure is its file's own (it does not decode, checksum
 * or parse as the spec says; it is gone), not the machine's: an online run
 * sets such a file aside (data_verdict) and goes on. */
bool train_data_fault(int rc);
void train_log_malformed(trainer_t *tr, data_reader_t *r, const char *what);

/* ---- train_step.c ---- */
/* One training step on the CPU. global_n is the rows of all ranks in it. */
int train_step(trainer_t *tr, const data_batch_t *b, int64_t step, int64_t global_n,
               double *loss_sum);
void train_batch_layout(trainer_t *tr, const data_batch_t *b);
int train_lookup_keys(trainer_t *tr, const data_batch_t *b, int64_t step, bool insert);
int train_lookup_batch(trainer_t *tr, const data_batch_t *b, int64_t step, bool insert);
/* Sums (pairs, npairs) of double-double values over the ranks in place. */
typedef int (*train_sum_dd_fn)(trainer_t *tr, double *pairs, size_t npairs);
/* The dense gradients summed over the ranks with sum (the CPU step's
 * shard_comm, or the device step's own communicator), then the dense
 * optimizer step. */
int train_dense_update(trainer_t *tr, train_sum_dd_fn sum);

/* ---- train_dev.c ---- */
struct dev_ops;
/* Sets up the device step on ops (device: the GPU) in tr->dev, after the
 * tables and the model. Returns 0 or the first failure (tr->dev may then be
 * half made; train_dev_destroy takes it). */
int train_dev_create(trainer_t *tr, const struct dev_ops *ops, int device);
/* Makes the device step exchange on the device over comm (device buffers;
 * NULL with one rank): after train_dev_create. */
void train_dev_exchange_on(trainer_t *tr, shard_comm_t *comm);
void train_dev_destroy(train_dev_t *dv);
/* train_step with the pooling, the dense model and the reduce on the
 * device, in two parts: train_dev_front runs the step up to the gradients
 * (after it, the loop may read the next batch and train_dev_stage it, so
 * that its copy to the device overlaps the rest of this step), and
 * train_dev_back the update exchange and the dense step. */
int train_dev_front(trainer_t *tr, const data_batch_t *b, int64_t step, int64_t global_n,
                    double *loss_sum);
int train_dev_stage(trainer_t *tr, const data_batch_t *next);
int train_dev_back(trainer_t *tr, int64_t step);

/* ---- train_ckpt.c ---- */
void train_hash_file(const char *path, char out[17]);
void train_hash_inputs(char **files, int nfiles, char out[17]);
int train_checkpoint(trainer_t *tr, bool online);
int train_export_requested(trainer_t *tr, bool *want);
int train_load_start(trainer_t *tr);
/* Rank 0: msg (may be NULL: nothing) in the run's log and, with --db, as a
 * "warning" event of the run (its page and `kiln show` list it). */
void train_warning(trainer_t *tr, const char *msg);
/* Adds path (as it is now: size, mtime) to the files tr's state covers. */
int train_inputs_done(trainer_t *tr, const char *path);
/* Whether the state covers path as it is now (same size and mtime). */
bool train_inputs_covered(const trainer_t *tr, const char *path);
/* Drops from files (moved to the front, *nkeep of them) those the state
 * covers, and with `ready` those not complete yet (data.ready); rank 0
 * decides and every rank keeps the same. Collective. */
int train_keep_files(trainer_t *tr, char **files, int nfiles, bool ready, int *nkeep /* OUT */);

/* ---- train_tables.c ---- */
/* Notes that step ran at unix_s (a ttl given as a duration needs it). */
void train_tables_mark_time(trainer_t *tr, int64_t step, int64_t unix_s);
/* Removes the rows past their ttl from this rank's tables (before a dump). */
int train_tables_expire(trainer_t *tr);
/* The run's table figures, summed over the ranks into rank 0's out. Collective. */
int train_tables_report(trainer_t *tr, run_tables_t *out /* OUT */);
/* Asks the disk tiers of this rank's tables to warm the rows of b's keys
 * that this rank owns (kern_table_prefetch: the kernel reads their pages
 * while the step exchanges keys). Does nothing without a disk tier. Not
 * collective; a failure (out of memory) only costs the warm-up. */
void train_tables_prefetch(trainer_t *tr, const data_batch_t *b);

/* ---- train_loop.c ---- */
char *train_spec_base_dir(const char *spec_path);
int64_t train_step_limit(const trainer_t *tr);
int train_loop(trainer_t *tr, char **files, int nfiles, int64_t epochs);

/* ---- train_online.c ---- */
void train_record_inputs(trainer_t *tr, char **files, int n);
int train_online(trainer_t *tr, char **files, int nfiles);

/* ---- train_eval.c ---- */
/* Predicts every row of files with the loaded state (lookups insert
 * nothing): this rank's rows in the order read, *n of them, as *probs, with
 * their labels in *labels and their global row indexes in *rows where those
 * are not NULL. The arrays start NULL, are malloc'd here and are freed by the
 * caller, also on failure. Asking for *rows makes a malformed line an error:
 * it would leave a hole in the file's row order. what names the pass in the
 * log of malformed lines. Collective. */
int train_predict_files(trainer_t *tr, char **files, int nfiles, const char *what, float **probs,
                        float **labels, int64_t **rows, int64_t *n);
int train_evaluate(trainer_t *tr, char **files, int nfiles, int64_t *rows, double *logloss,
                   double *auc);
int train_gather_layout(const trainer_t *tr, int mine, int **counts, int **displs, int64_t *total);

/* ---- train_predict.c ---- */
int train_predict_mode(trainer_t *tr);

#endif /* KILN_TRAINER_TRAIN_INT_H */
