/*
 * jobs/jobs.h - the job spec model and cron expressions.
 *
 * A job spec is YAML (docs/job-spec.md). job_spec_parse() turns it into a
 * validated job_spec_t with every default filled in, or into a list of
 * diagnostics that each name file:line:col and the field path, e.g.
 *   job.yaml:14:7: model.embedding.dim: expected a positive integer, got "sixteen"
 * Only jobs/ includes yaml.h.
 *
 * Cron: 5-field Vixie-cron expressions, @macros and "@every <duration>".
 * job_cron_next() gives the first fire time strictly after an instant.
 */
#ifndef KILN_JOBS_JOBS_H
#define KILN_JOBS_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kern.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- enumerations (each has a _name() that returns the spec spelling) ----
 * The model's fields use the enums of the modules that run them, one home
 * each: model.type and model.dense_precision are model.h's model_type_t and
 * model_dense_precision_t; the embeddings' combiner, eviction and init and
 * both optimizers' type are kern.h's kern_combine_t, kern_evict_t,
 * kern_init_t and kern_opt_kind_t. So the trainer and the push hand them on
 * as they are, with no mapping; jobs/ needs only the headers (no link). */
typedef enum { JOB_CONC_FORBID, JOB_CONC_ALLOW, JOB_CONC_REPLACE } job_concurrency_t;
typedef enum { JOB_CATCHUP_NONE, JOB_CATCHUP_LATEST, JOB_CATCHUP_ALL } job_catchup_t;
typedef enum { JOB_LAUNCH_LOCAL, JOB_LAUNCH_HOSTFILE, JOB_LAUNCH_SLURM } job_launcher_t;
typedef enum { JOB_DEVICE_AUTO, JOB_DEVICE_CPU, JOB_DEVICE_CUDA } job_device_t;
typedef enum { JOB_MPI_AUTO, JOB_MPI_TCP } job_mpi_transport_t;
typedef enum { JOB_FMT_CRITEO_TSV, JOB_FMT_KILN_BIN, JOB_FMT_PARQUET } job_format_t;
typedef enum { JOB_DENSE_AUTO, JOB_DENSE_LOG1P, JOB_DENSE_NONE } job_dense_transform_t;
typedef enum { JOB_INITFROM_LATEST, JOB_INITFROM_NONE, JOB_INITFROM_CHECKPOINT } job_init_from_t;
typedef enum { JOB_EXPORT_NONE, JOB_EXPORT_FULL, JOB_EXPORT_INCREMENTAL } job_export_mode_t;
typedef enum { JOB_MODE_BATCH, JOB_MODE_ONLINE } job_train_mode_t;
/* data.ready: settle: a file is complete once quiet for data.settle; marker:
 * once a _SUCCESS file sits in its directory (Spark/Hadoop). */
typedef enum { JOB_READY_SETTLE, JOB_READY_MARKER } job_ready_t;
/* data.reader: where batches are parsed and decoded: auto picks team (for TSV
 * and Parquet; kiln-bin keeps its thread) when
 * the step's threads take every core of the host, else thread; thread: a
 * reader thread per rank, 4 batches ahead; team: on the step's threads,
 * between steps (docs/trainer.md). */
typedef enum { JOB_READER_AUTO, JOB_READER_THREAD, JOB_READER_TEAM } job_reader_t;

const char *job_concurrency_name(job_concurrency_t v);
const char *job_catchup_name(job_catchup_t v);
const char *job_launcher_name(job_launcher_t v);
const char *job_device_name(job_device_t v);
const char *job_mpi_transport_name(job_mpi_transport_t v);
const char *job_format_name(job_format_t v);
const char *job_dense_transform_name(job_dense_transform_t v);
const char *job_model_type_name(model_type_t v);
const char *job_precision_name(model_dense_precision_t v);
const char *job_combiner_name(kern_combine_t v);
const char *job_eviction_name(kern_evict_t v);
const char *job_init_name(kern_init_t v);
const char *job_optimizer_type_name(kern_opt_kind_t v);
const char *job_spill_io_name(kern_tier_io_t v);
const char *job_export_mode_name(job_export_mode_t v);
const char *job_init_from_name(job_init_from_t v);
const char *job_train_mode_name(job_train_mode_t v);
const char *job_ready_name(job_ready_t v);

/* ---- the spec --------------------------------------------------------------- */

/* data.columns (data.format: parquet): which Parquet columns feed the model.
 * NULL lists mean Criteo's names (I1..I<dense_features>, C1..C<cat_slots>). */
typedef struct job_columns {
    char *label;                           /* "label" */
    char **dense;                          /* [ndense] or NULL */
    int ndense;                            /* == data.dense_features when given */
    char **categorical;                    /* [ncategorical] or NULL */
    int ncategorical;                      /* == data.cat_slots when given */
    job_dense_transform_t dense_transform; /* auto: log1p for integer columns only */
} job_columns_t;

typedef struct job_embedding {
    int dim;                 /* > 0 */
    kern_combine_t combiner; /* sum */
    int64_t capacity;        /* rows per table per job (all ranks together) */
    kern_evict_t eviction; /* lru */
    kern_init_t init;         /* uniform */
    double init_scale;       /* uniform: U(-s, s); normal: N(0, s); default 0.01 */
    /* Tables larger than memory (docs/models.md): RAM each rank gives the
     * table's rows, as bytes or as a share of its rows; neither set (0):
     * every row in RAM. The rest live on disk under spill_dir. */
    int64_t memory_bytes;
    double memory_share;     /* (0, 1] */
    char *spill_dir;         /* model.embedding's only (tables use it); NULL: the run's
                                scratch directory */
    kern_tier_io_t spill_io; /* model.embedding's only: how the tiers read (auto) */
    struct {
        int64_t min_count;   /* 1: every key gets a row at once */
        int64_t sketch_width;
        int64_t decay_steps; /* 0: counts never decay */
    } admit;
    int64_t ttl_steps;       /* rows untouched this many steps are removed; 0: never */
    int64_t ttl_ms;          /* ... or this long (wall clock); 0: never */
} job_embedding_t;

/* One embedding table. Without a `tables:` list there is one table per
 * categorical slot, named "slot<i>", with model.embedding's settings. */
typedef struct job_table {
    char *name;
    int *slots; /* categorical slot indices [0, data.cat_slots) read by this table */
    int nslots;
    job_embedding_t emb;
} job_table_t;

typedef struct job_optimizer {
    kern_opt_kind_t type;
    double lr;
    double beta1, beta2, eps;    /* adam; eps also for adagrad */
    double initial_accumulator;  /* adagrad */
    double weight_decay;
} job_optimizer_t;

/* An endpoint is (url, model, label): one kiln-serve may hold several labels. */
typedef struct job_endpoint {
    char *url;
    char *model;
    char *label;
    bool auto_push; /* `auto`: kilnd pushes to it after a run and for online exports; false:
                       only kiln push --label, promote and rollback do (a champion) */
    int traffic;    /* the predict traffic weight the label gets on its kiln-serve when a
                       push first creates it; 0: none until a split gives it some */
} job_endpoint_t;

/* push.promote_when: what `kiln promote` requires of the online A/B metrics
 * (kiln-serve's GET /v1/models/M/online) before it pushes one label's
 * checkpoint to another's. */
typedef struct job_promote_when {
    double online_logloss_better_by; /* the promoted label's online logloss must be below the
                                        other's by at least this; NAN: no requirement */
    int64_t min_rows;                /* joined rows each label needs first */
} job_promote_when_t;

typedef struct job_spec {
    char *name;        /* [a-zA-Z0-9_.-]{1,64} */
    char *description; /* may be NULL */
    char *schedule;    /* NULL: a one-off job, run once when submitted */
    char *timezone;    /* "UTC" by default */
    job_concurrency_t concurrency;
    job_catchup_t catchup;
    int priority; /* -1000..1000, higher runs first */

    struct {
        int ranks;
        job_launcher_t launcher;
        char *hostfile; /* required for launcher: hostfile */
        job_device_t device;
        int64_t timeout_ms; /* 0: none */
        int threads;        /* OpenMP threads per rank; 0: automatic */
        /* launcher: slurm only (sbatch's options; docs/cluster.md) */
        int nodes;          /* --nodes; 0: as Slurm places the tasks */
        char *partition;    /* --partition; NULL: the cluster's default */
        char *account;      /* --account; NULL: the user's default */
        int gpus_per_node;  /* --gpus-per-node; 0: none asked for */
        char **sbatch_args; /* [nsbatch_args] more sbatch arguments, one each, verbatim */
        int nsbatch_args;
        /* Open MPI's network, every launcher */
        struct {
            char *interfaces; /* "eth0,10.1.0.0/16": TCP only over these; NULL: any */
            job_mpi_transport_t transport; /* auto: shared memory within a host; tcp: none */
        } mpi;
    } resources;

    struct {
        int count;
        int64_t backoff_ms;     /* first retry delay; doubles each attempt */
        int64_t max_backoff_ms; /* cap */
    } retries;

    struct {
        job_format_t format;
        char *train; /* glob */
        char *eval;  /* path or glob, may be NULL */
        bool incremental;
        job_ready_t ready;  /* when a new file counts as complete (incremental, online) */
        int64_t settle_ms;  /* ready: settle: unchanged this long (size and mtime) */
        job_reader_t reader;
        int dense_features; /* 13 for Criteo */
        int cat_slots;      /* 26 for Criteo */
        double max_malformed; /* fraction of input lines that may be malformed, 0..1 */
        job_columns_t columns; /* format: parquet only */
    } data;

    struct {
        model_type_t type;
        job_embedding_t embedding;
        int *bottom_mlp;
        int nbottom;
        int *top_mlp;
        int ntop;
        job_table_t *tables; /* always filled: defaulted to one per slot */
        int ntables;
        bool fm_dense_factors; /* fm: the dense features also join the interaction */
        model_dense_precision_t dense_precision; /* dlrm: fp32, or bf16 GEMMs on a CPU with bf16 */
    } model;

    struct {
        job_train_mode_t mode;
        int batch_size; /* per rank */
        int epochs;
        job_optimizer_t sparse;
        job_optimizer_t dense;
        uint64_t seed;
        job_init_from_t init_from;
        char *init_from_checkpoint; /* for JOB_INITFROM_CHECKPOINT */
        int64_t max_steps;          /* 0: no limit */
        int64_t log_every;          /* steps between progress lines */
    } train;

    struct {
        char *dir;
        int full_every; /* a full dump every N checkpoints, incremental between */
        int keep;
        bool include_optimizer;
        int64_t every_steps; /* 0: only at the end of a run */
    } checkpoint;

    struct {
        job_export_mode_t on_success;
        int64_t every_ms; /* online jobs: export this often while training; 0: never */
    } export_;

    struct {
        char *token_env;
        int retries;
        int64_t timeout_ms;
        double max_regression; /* the quality gate; NAN: none */
        /* push.ramp "STEP%/EVERY[ to MAX%]": the traffic share of each auto
         * endpoint's label grows by ramp_step percent every ramp_every_ms,
         * from its first landed push up to ramp_max percent; ramp_step 0:
         * no ramp. */
        int ramp_step, ramp_max;
        int64_t ramp_every_ms;
        job_promote_when_t promote_when;
        job_endpoint_t *endpoints;
        int nendpoints;
    } push;
} job_spec_t;

/* One problem found in a spec. line and col are 1-based (0: unknown). */
typedef struct job_diag {
    int line, col;
    char *path;    /* field path, e.g. "model.embedding.dim" ("" for the document) */
    char *message; /* the full line: "file:line:col: path: what" */
} job_diag_t;

typedef struct job_diags {
    job_diag_t *items;
    size_t n, cap;
} job_diags_t;

void job_diags_init(job_diags_t *d);
void job_diags_fini(job_diags_t *d);

/* The most rows one rank's shard of a table can hold: kernels/kern.h's
 * KERN_MAX_CAPACITY (row ids are int32), which kiln-train asserts equal. */
#define JOB_MAX_ROWS_PER_RANK INT64_C(0x7ffffff0)
/* The rows one rank's shard of a table of `capacity` rows holds when the
 * table is split over nranks: ceil(capacity / nranks), plus 5% and 64 rows
 * of slack for the hash's imbalance when nranks > 1, plus 2% and 1024 rows
 * for the host mirror of a GPU table (gpu_mirror). kiln-train sizes its
 * tables with it and the spec check refuses a capacity whose share exceeds
 * JOB_MAX_ROWS_PER_RANK. */
int64_t job_rows_per_rank(int64_t capacity, int nranks, bool gpu_mirror);

/* Limits that keep a hostile spec's cost linear in its size (each is an
 * error naming the limit): bytes of text, levels of nesting, diagnostics
 * kept (the rest are counted in one last line), and nodes walked (aliases
 * can repeat a node). A real spec is a few KB, nests 6 levels and has a
 * few hundred nodes. */
#define JOB_SPEC_MAX_BYTES (1 << 20)
#define JOB_SPEC_MAX_DEPTH 64
#define JOB_SPEC_MAX_PROBLEMS 100
#define JOB_SPEC_MAX_NODES (1 << 20)

/* Parses and validates YAML text. filename is used in messages only.
 * On success returns 0 and fills *spec (free with job_spec_fini).
 * On a bad spec returns KILN_ESPEC, fills diags (every problem found, in
 * document order) and leaves *spec zeroed. Other codes: KILN_ENOMEM.
 * diags must have been set up with job_diags_init (or zeroed); problems are
 * appended to it, and the caller frees it with job_diags_fini. It may be
 * NULL when only kiln_errmsg() is wanted (the first problem, and how many
 * more there are). */
int job_spec_parse(const char *text, size_t len, const char *filename,
                   job_spec_t *spec /* OUT */, job_diags_t *diags /* OUT */);
/* Reads path and parses it. KILN_ENOENT / KILN_EIO when it cannot be read. */
int job_spec_load(const char *path, job_spec_t *spec /* OUT */, job_diags_t *diags /* OUT */);
void job_spec_fini(job_spec_t *spec);

/* ---- cron ----------------------------------------------------------------------
 * Vixie-cron semantics (docs/cron.md). Fields: minute hour day-of-month month
 * day-of-week; names (jan..dec, sun..sat, any case), ranges a-b, steps a-b/n,
 * a/n (a to the field's maximum) and the star with /n, lists; 7 is Sunday as
 * well as 0. When both day fields are restricted (neither field's text starts
 * with a star), a day matches if EITHER matches; otherwise both must, so a
 * stepped star ("star-slash-2") still counts as unrestricted.
 * Macros @yearly @annually @monthly @weekly @daily @midnight @hourly, and
 * "@every <duration>" (at least 1s, whole seconds; fires at multiples of the
 * duration since the Unix epoch, so that fire times do not drift across
 * restarts; the timezone does not apply to @every).
 *
 * job_cron_t is a plain value: copy it freely, nothing to free. */
typedef struct job_cron {
    uint64_t minutes; /* bit m: minute m */
    uint32_t hours;
    uint32_t doms;   /* bit d: day d (1..31) */
    uint16_t months; /* bit m: month m (1..12) */
    uint8_t dows;    /* bit w: weekday w (0 = Sunday) */
    bool dom_star, dow_star;
    int64_t every_s; /* > 0 for @every */
    int tz_offset_s; /* fixed offset east of UTC ("UTC+02:00"); 0 for UTC */
    char tz_name[64]; /* IANA zone ("Europe/Berlin"); "" for UTC or a fixed offset */
} job_cron_t;

/* Parses expr. Returns 0, or KILN_ECRON with kiln_errmsg() naming the field
 * ("day-of-month: 32 is out of range 1-31"). Expressions that can never fire
 * (0 0 30 2 *) are rejected too. */
int job_cron_parse(const char *expr, job_cron_t *out /* OUT */);
/* Applies a timezone: NULL, "", "UTC", "Z", "UTC+HH:MM" / "UTC-HH:MM" (at most
 * 14 hours) or an IANA zone name available in the system zoneinfo ($TZDIR or
 * /usr/share/zoneinfo). Fire times then follow that zone's wall clock; a wall
 * time skipped by a DST jump fires once at the jump, a repeated one fires once,
 * at its first occurrence. Returns 0 or KILN_EINVAL (c unchanged). */
int job_cron_set_timezone(job_cron_t *c, const char *tz);
/* First fire time strictly after `after` (Unix seconds, UTC). Returns 0 or
 * KILN_ERANGE (message says why) when there is none within 8 years, or when
 * `after` or the answer falls outside the years 1-9999. For an IANA zone it
 * briefly sets TZ under a mutex and restores it; other threads that read TZ
 * (localtime) at that moment may see the zone. */
int job_cron_next(const job_cron_t *c, int64_t after, int64_t *next /* OUT */);
/* The first fire of schedule (a cron expression) in zone tz (NULL: UTC)
 * strictly after `after`; 0 when there is none or the schedule or zone does
 * not parse (specs were checked when submitted). What kiln jobs, the web
 * page and submit's answer show. */
int64_t job_next_fire(const char *schedule, const char *tz, int64_t after);

#ifdef __cplusplus
}
#endif

#endif /* KILN_JOBS_JOBS_H */
