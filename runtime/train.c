/*
 * runtime/train.c - kiln-train: one MPI rank of Kiln's trainer.
 *
 *   mpirun -np N kiln-train --spec FILE --run-dir DIR [options]
 *
 * Embedding tables are model parallel (key k of table t lives on rank
 * rt_shard_owner(k)), the dense model is data parallel (replicated, gradients
 * allreduced). One step of one rank:
 *
 *   batch (n rows, S slots, CSR)      from the prefetching reader
 *   keys per table -> dedupe          (a table may serve several slots)
 *   rt_shard_lookup                   one all-to-all of keys, one of rows
 *   kern_cpu_gather_combine           pooled E (n, S, d), all slots at once
 *   rt_model_forward / _backward      loss, dE (n, S, d), dense grads
 *   scatter by the dedupe's inverse   dE -> gradients of each table's unique keys
 *   rt_shard_update                   one all-to-all of gradients, fused update
 *   MPI_Allreduce(dense grads)        then the dense optimizer step
 *
 * The owners' side of the two rt_shard calls goes through the rank's store
 * (rt_store.h): host tables, or GPU hash tables with the host tables as the
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
#include <cblas.h>
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
#include "rt_data.h"
#include "rt_dd.h"
#include "rt_device.h"
#include "rt_ckpt.h"
#include "rt_model.h"
#include "rt_mpi.h"
#include "rt_shard.h"
#include "run.h"
#include "state.h"

_Static_assert(JOB_MAX_ROWS_PER_RANK == KERN_MAX_CAPACITY,
               "the spec's capacity check must use the tables' real limit");

/* The exit code of a failure (run/run.h): kilnd retries only
 * RUN_EXIT_RETRY. */
static int exit_for(int rc)
{
    switch (rc) {
    case 0:
        return RUN_EXIT_OK;
    case KILN_ESPEC:
    case KILN_EINVAL:
    case KILN_ENOENT:
    case KILN_EFULL:
    case KILN_ECORRUPT:
    case KILN_ECHECKSUM:
    case KILN_EVERSION:
    case KILN_EUSAGE:
    case KILN_ECONFLICT:
    case KILN_ERANGE: /* diverged: the same spec and data diverge again */
        return RUN_EXIT_INPUT;
    case KILN_EIO:
    case KILN_EMPI:
    case KILN_ENOMEM:
    case KILN_ENOSPC:
    case KILN_ETIMEDOUT:
        return RUN_EXIT_RETRY;
    default:
        return RUN_EXIT_BUG;
    }
}

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
} options_t;

typedef struct trainer {
    options_t opt;
    int rank, nranks;
    job_spec_t spec;
    char *spec_dir;

    int S, F, d, T;   /* slots, dense features, pooled width, tables */
    int *slot_table;  /* (S) */
    kern_table_t **tables;   /* (T) this rank's shards; with a GPU, the checkpoint mirror */
    rt_store_t *store;       /* where the rows of the step live (rt_store.h) */
    rt_store_kind_t store_kind;
    int cuda_device;         /* RT_STORE_CUDA: this rank's GPU */
    rt_shard_t *shard;
    rt_model_t *model;
    rt_dedupe_t **dedupe;    /* (T) one per table, so that tables dedupe in parallel */
    kern_opt_t sparse_opt;
    kern_combine_t *combine; /* (S) */

    /* per-step scratch, sized for the largest batch seen */
    int64_t **tkeys, *tkeys_cap, *tn; /* (T) keys of each table's slots, concatenated */
    int32_t **tinv;                   /* (T) inverse index into the table's unique keys */
    int64_t **tuniq, *tuniq_cap, *nuniq;
    double **tgrad;                   /* (T) (nuniq, d, 2) double-double gradients of the unique
                                         keys (rt_dd.h) */
    int64_t *tgrad_cap;
    double *dense_pairs;              /* (nparams, 2) the dense gradient for the allreduce */
    MPI_Datatype dd_type;             /* a (hi, lo) pair, and the op that adds pairs */
    MPI_Op dd_op;
    int64_t *slot_koff;               /* (S) first key of slot s in its table's list */
    int64_t *boff;                    /* (S, max_batch + 1) bag offsets rebased to 0 */
    kern_bags_t *bags;                /* (S) */
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
    char last_uid[RT_CKPT_UID_MAX];  /* the newest checkpoint of this lineage, "" none */
    char base_uid[RT_CKPT_UID_MAX];  /* the full dump last_uid stands on */
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
    int64_t train_ns;                /* time in the training loop so far */
    char **eval_files;               /* data.eval, expanded (neval); NULL: none */
    int neval;
} trainer_t;

/* Set by SIGUSR1: write an incremental dump at the next step boundary. */
static volatile sig_atomic_t export_signal;

static void on_sigusr1(int sig)
{
    (void)sig;
    export_signal = 1;
}

/* ---- small helpers ------------------------------------------------------------ */

static void say(const trainer_t *tr, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const trainer_t *tr, const char *fmt, ...)
{
    if (tr->rank != 0 || tr->opt.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* Every rank learns the worst (most negative) code and returns it. A rank
 * that did not fail itself leaves the telling to the rank that did. */
static int agree_on(trainer_t *tr, int rc)
{
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rc == 0 && worst < 0)
        tr->error_told = true;
    return worst;
}
#define agree(rc) agree_on(tr, (rc))

static int grow(void **p, int64_t *cap, int64_t want, size_t elem)
{
    if (want <= *cap)
        return 0;
    int64_t c = *cap ? *cap : 1024;
    while (c < want)
        c *= 2;
    void *q = kiln_reallocarray(*p, (size_t)c, elem);
    if (q == NULL)
        return KILN_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* A path from the spec is relative to the spec file's directory. */
static char *spec_relative(const trainer_t *tr, const char *path)
{
    if (path[0] == '/')
        return kiln_strdup(path);
    return kiln_asprintf("%s/%s", tr->spec_dir, path);
}

/* Expands a glob into a sorted list of files. Returns 0 or KILN_ENOENT. */
static int expand(const char *pattern, const char *what, char ***out, int *n)
{
    glob_t g;
    int grc = glob(pattern, 0, NULL, &g);
    if (grc != 0 || g.gl_pathc == 0) {
        if (grc == 0)
            globfree(&g);
        return kiln_errf(KILN_ENOENT, "%s: no file matches %s; check the path (relative paths "
                                      "are relative to the spec file) or generate data with "
                                      "'kiln datagen'",
                         what, pattern);
    }
    char **files = kiln_calloc(g.gl_pathc, sizeof *files);
    if (files == NULL) {
        globfree(&g);
        return KILN_ENOMEM;
    }
    for (size_t i = 0; i < g.gl_pathc; i++)
        files[i] = kiln_strdup(g.gl_pathv[i]);
    *n = (int)g.gl_pathc;
    *out = files;
    globfree(&g);
    return 0;
}

/* Reads a list of files, one per line (kilnd's --inputs). */
static int read_list(const char *path, char ***out, int *n)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return kiln_errf(KILN_ENOENT, "cannot read input list %s: %s", path, strerror(errno));
    char line[4096];
    char **files = NULL;
    int cnt = 0, cap = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            char **nf = kiln_reallocarray(files, (size_t)cap, sizeof *nf);
            if (nf == NULL) {
                rc = KILN_ENOMEM;
                break;
            }
            files = nf;
        }
        files[cnt++] = kiln_strdup(line);
    }
    fclose(f);
    if (rc == 0 && cnt == 0)
        rc = kiln_errf(KILN_ENOENT, "input list %s names no files", path);
    if (rc < 0) {
        for (int i = 0; i < cnt; i++)
            free(files[i]);
        free(files);
        return rc;
    }
    *out = files;
    *n = cnt;
    return 0;
}

static void free_list(char **files, int n)
{
    for (int i = 0; i < n; i++)
        free(files[i]);
    free(files);
}

/* ---- set-up ----------------------------------------------------------------------- */

static kern_init_t kern_init_of(job_init_t i)
{
    return i == JOB_INIT_NORMAL ? KERN_INIT_NORMAL
                                : i == JOB_INIT_ZEROS ? KERN_INIT_ZEROS : KERN_INIT_UNIFORM;
}

static kern_evict_t kern_evict_of(job_eviction_t e)
{
    return e == JOB_EVICT_LFU ? KERN_EVICT_LFU : e == JOB_EVICT_NONE ? KERN_EVICT_NONE
                                                                    : KERN_EVICT_LRU;
}

static kern_opt_kind_t kern_opt_of(job_optimizer_type_t t)
{
    return t == JOB_OPT_SGD ? KERN_OPT_SGD : t == JOB_OPT_ADAM ? KERN_OPT_ADAM : KERN_OPT_ADAGRAD;
}

static rt_dense_opt_type_t dense_opt_of(job_optimizer_type_t t)
{
    return t == JOB_OPT_SGD ? RT_DENSE_SGD : t == JOB_OPT_ADAM ? RT_DENSE_ADAM : RT_DENSE_ADAGRAD;
}

static rt_model_type_t model_type_of(job_model_type_t t)
{
    return t == JOB_MODEL_FM ? RT_MODEL_FM : t == JOB_MODEL_DLRM ? RT_MODEL_DLRM : RT_MODEL_LR;
}

static int setup_tables(trainer_t *tr)
{
    const job_spec_t *sp = &tr->spec;
    tr->S = sp->data.cat_slots;
    tr->F = sp->data.dense_features;
    tr->T = sp->model.ntables;
    rt_model_type_t mt = model_type_of(sp->model.type);
    tr->d = rt_model_table_dim(mt, sp->model.embedding.dim);
    if (tr->d < 1)
        return kiln_errf(KILN_EINVAL, "model.embedding.dim %d does not suit model %s",
                         sp->model.embedding.dim, job_model_type_name(sp->model.type));
    tr->slot_table = kiln_calloc((size_t)tr->S, sizeof(int));
    tr->combine = kiln_calloc((size_t)tr->S, sizeof *tr->combine);
    tr->tables = kiln_calloc((size_t)tr->T, sizeof *tr->tables);
    kern_table_config_t *cfgs = kiln_calloc((size_t)tr->T, sizeof *cfgs);
    int *dims = kiln_calloc((size_t)tr->T, sizeof *dims);
    char (*notes)[128] = kiln_calloc((size_t)tr->T, sizeof *notes);
    int rc = 0;
    if (!tr->slot_table || !tr->combine || !tr->tables || !cfgs || !dims || !notes) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int s = 0; s < tr->S; s++)
        tr->slot_table[s] = -1;
    const job_optimizer_t *so = &sp->train.sparse;
    for (int t = 0; t < tr->T; t++) {
        const job_table_t *jt = &sp->model.tables[t];
        int d = rt_model_table_dim(mt, jt->emb.dim);
        if (d != tr->d) {
            rc = kiln_errf(KILN_EINVAL, "table %s has dim %d but the model needs %d for every "
                                        "table",
                           jt->name, jt->emb.dim, tr->d);
            goto out;
        }
        /* Capacity is for the whole job: each rank keeps at most its share,
         * and allocates room beyond it only for loading a checkpoint whose
         * keys hash unevenly over this rank count (rt_shard.h). */
        if (jt->emb.capacity < tr->nranks) {
            rc = kiln_errf(KILN_EINVAL, "table %s: capacity %" PRId64 " is less than the %d "
                           "ranks, and each rank needs a row; raise it to at least %d",
                           jt->name, jt->emb.capacity, tr->nranks, tr->nranks);
            goto out;
        }
        int64_t share = rt_shard_capacity_share(jt->emb.capacity, tr->rank, tr->nranks);
        int64_t per_rank = share + rt_shard_capacity_room(share, tr->nranks);
        if (tr->nranks > 1)
            snprintf(notes[t], sizeof notes[t],
                     "%" PRId64 " rows on this rank, its share of capacity %" PRId64
                     " over %d ranks",
                     share, jt->emb.capacity, tr->nranks);
        else
            snprintf(notes[t], sizeof notes[t], "capacity %" PRId64 " rows", share);
        cfgs[t] = (kern_table_config_t){
            .name = jt->name,
            .dim = d,
            .capacity = per_rank,
            .limit = share,
            .capacity_note = notes[t],
            .opt = kern_opt_of(so->type),
            .init = kern_init_of(jt->emb.init),
            .init_scale = (float)jt->emb.init_scale,
            .seed = sp->train.seed ^ kiln_xxh64(jt->name, strlen(jt->name), 0x6b696c6e),
            .evict = kern_evict_of(jt->emb.eviction),
            .evict_fraction = 0.0f,
        };
        dims[t] = d;
        /* The mirror of a GPU table must take every row the GPU holds: its
         * slots come in whole buckets, and a segmented host table can fill
         * a segment a little before the whole (docs/kernels.md). */
        kern_table_config_t mcfg = cfgs[t];
        if (tr->store_kind == RT_STORE_CUDA)
            mcfg.capacity = per_rank + per_rank / 50 + 1024; /* as job_rows_per_rank */
        KILN_CHECK_GOTO(kern_table_create(&mcfg, &tr->tables[t]), rc, out);
        for (int i = 0; i < jt->nslots; i++) {
            int s = jt->slots[i];
            if (s >= 0 && s < tr->S) {
                tr->slot_table[s] = t;
                tr->combine[s] = jt->emb.combiner == JOB_COMB_MEAN ? KERN_COMBINE_MEAN
                                                                   : KERN_COMBINE_SUM;
            }
        }
    }
    for (int s = 0; s < tr->S; s++) {
        if (tr->slot_table[s] < 0) {
            rc = kiln_errf(KILN_EINVAL, "slot %d has no embedding table", s);
            goto out;
        }
    }
    tr->sparse_opt = (kern_opt_t){.kind = kern_opt_of(so->type),
                                  .lr = (float)so->lr,
                                  .eps = (float)so->eps,
                                  .beta1 = (float)so->beta1,
                                  .beta2 = (float)so->beta2};
    KILN_CHECK_GOTO(rt_store_create(tr->store_kind, tr->T, tr->tables, cfgs, tr->cuda_device,
                                    &tr->store),
                    rc, out);
    KILN_CHECK_GOTO(rt_shard_create(MPI_COMM_WORLD, tr->T, tr->store, dims, &tr->shard), rc, out);
    if ((tr->dedupe = kiln_calloc((size_t)tr->T, sizeof *tr->dedupe)) == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int t = 0; t < tr->T; t++)
        KILN_CHECK_GOTO(rt_dedupe_create(&tr->dedupe[t]), rc, out);
out:
    free(cfgs);
    free(dims);
    free(notes);
    return rc;
}

static int setup_model(trainer_t *tr)
{
    const job_spec_t *sp = &tr->spec;
    const job_optimizer_t *o = &sp->train.dense;
    rt_model_config_t cfg = {
        .type = model_type_of(sp->model.type),
        .nslots = tr->S,
        .ndense = tr->F,
        .dim = tr->d,
        .bottom = sp->model.bottom_mlp,
        .nbottom = sp->model.nbottom,
        .top = sp->model.top_mlp,
        .ntop = sp->model.ntop,
        .fm_dense_factors = sp->model.fm_dense_factors,
        .max_batch = sp->train.batch_size,
        .seed = sp->train.seed,
        .opt = {.type = dense_opt_of(o->type),
                .lr = (float)o->lr,
                .eps = (float)o->eps,
                .beta1 = (float)o->beta1,
                .beta2 = (float)o->beta2,
                .weight_decay = (float)o->weight_decay,
                .initial_accumulator = (float)o->initial_accumulator},
    };
    KILN_CHECK(rt_model_create(&cfg, &tr->model));
    if (tr->nranks > 1) {
        KILN_CHECK(rt_dd_mpi_init(&tr->dd_type, &tr->dd_op));
        tr->dense_pairs = kiln_calloc(2 * rt_model_nparams(tr->model) + 2, sizeof(double));
        if (tr->dense_pairs == NULL)
            return KILN_ENOMEM;
    }
    tr->max_batch = sp->train.batch_size;
    size_t S = (size_t)tr->S, T = (size_t)tr->T, B = (size_t)tr->max_batch;
    tr->tkeys = kiln_calloc(T, sizeof *tr->tkeys);
    tr->tkeys_cap = kiln_calloc(T, sizeof(int64_t));
    tr->tn = kiln_calloc(T, sizeof(int64_t));
    tr->tinv = kiln_calloc(T, sizeof *tr->tinv);
    tr->tuniq = kiln_calloc(T, sizeof *tr->tuniq);
    tr->tuniq_cap = kiln_calloc(T, sizeof(int64_t));
    tr->nuniq = kiln_calloc(T, sizeof(int64_t));
    tr->tgrad = kiln_calloc(T, sizeof *tr->tgrad);
    tr->tgrad_cap = kiln_calloc(T, sizeof(int64_t));
    tr->slot_koff = kiln_calloc(S, sizeof(int64_t));
    tr->boff = kiln_calloc(S * (B + 1), sizeof(int64_t));
    tr->bags = kiln_calloc(S, sizeof *tr->bags);
    tr->E = kiln_calloc(B * S * (size_t)tr->d, sizeof(float));
    tr->probs = kiln_calloc(B, sizeof(float));
    if (!tr->tkeys || !tr->tkeys_cap || !tr->tn || !tr->tinv || !tr->tuniq || !tr->tuniq_cap ||
        !tr->nuniq || !tr->tgrad || !tr->tgrad_cap || !tr->slot_koff || !tr->boff || !tr->bags ||
        !tr->E || !tr->probs)
        return KILN_ENOMEM;
    return 0;
}

/* ---- one step ------------------------------------------------------------------------ */

/* Collects each table's keys from its slots, dedupes them, and looks the
 * unique keys up on their owners. Fills the per-slot bag descriptors. */
static int lookup_batch(trainer_t *tr, const rt_batch_t *b, int64_t step, bool insert)
{
    const int n = b->n, S = tr->S, T = tr->T;
    for (int t = 0; t < T; t++)
        tr->tn[t] = 0;
    for (int s = 0; s < S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        int t = tr->slot_table[s];
        tr->tn[t] += off[n] - off[0];
    }
    for (int t = 0; t < T; t++) {
        int64_t cap = tr->tkeys_cap[t];
        KILN_CHECK(grow((void **)&tr->tkeys[t], &tr->tkeys_cap[t], tr->tn[t], sizeof(int64_t)));
        if (tr->tkeys_cap[t] != cap) {
            int32_t *inv = kiln_reallocarray(tr->tinv[t], (size_t)tr->tkeys_cap[t], sizeof *inv);
            if (inv == NULL)
                return KILN_ENOMEM;
            tr->tinv[t] = inv;
        }
        tr->tn[t] = 0;
    }
    for (int s = 0; s < S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        int t = tr->slot_table[s];
        int64_t cnt = off[n] - off[0];
        tr->slot_koff[s] = tr->tn[t];
        if (cnt > 0) /* an empty column: the table may have no key buffer yet */
            memcpy(tr->tkeys[t] + tr->tn[t], b->keys + off[0], (size_t)cnt * sizeof(int64_t));
        tr->tn[t] += cnt;
        int64_t *bo = tr->boff + (int64_t)s * (tr->max_batch + 1);
        for (int i = 0; i <= n; i++)
            bo[i] = off[i] - off[0];
    }
    /* Tables dedupe in parallel (each has its own hash set). */
    int drc = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(min : drc)
    for (int t = 0; t < T; t++) {
        const int64_t *u;
        int64_t nu = 0;
        int trc = rt_dedupe_run(tr->dedupe[t], tr->tkeys[t], tr->tn[t], tr->tinv[t], &u, &nu);
        if (trc == 0)
            trc = grow((void **)&tr->tuniq[t], &tr->tuniq_cap[t], nu, sizeof(int64_t));
        if (trc == 0 && nu > 0)
            memcpy(tr->tuniq[t], u, (size_t)nu * sizeof(int64_t));
        tr->nuniq[t] = nu;
        drc = trc < drc ? trc : drc;
    }
    if (drc < 0)
        return kiln_errf(drc, "out of memory deduplicating the batch's keys");
    float *const *values;
    KILN_CHECK(rt_shard_lookup(tr->shard, (const int64_t *const *)tr->tuniq, tr->nuniq, step,
                               insert, &values));
    for (int s = 0; s < S; s++) {
        int t = tr->slot_table[s];
        tr->bags[s] = (kern_bags_t){
            .values = values[t],
            .capacity = tr->nuniq[t],
            .dim = tr->d,
            .combine = tr->combine[s],
            .offsets = tr->boff + (int64_t)s * (tr->max_batch + 1),
            .rows = tr->tinv[t] + tr->slot_koff[s],
            .out_col = (int64_t)s * tr->d,
        };
    }
    if (n == 0) /* this rank has no rows in this step; it only served lookups */
        return 0;
    return kern_cpu_gather_combine(S, tr->bags, n, (int64_t)S * tr->d, tr->E);
}

/* One training step. global_n is the rows of all ranks in this step. */
static int train_step(trainer_t *tr, const rt_batch_t *b, int64_t step, int64_t global_n,
                      double *loss_sum)
{
    const int n = b->n, S = tr->S, T = tr->T, d = tr->d;
    KILN_CHECK(lookup_batch(tr, b, step, true));
    KILN_CHECK(rt_model_forward(tr->model, n, tr->E, b->dense, b->labels, NULL, loss_sum));
    /* dE replaces E: the pooled vectors are not needed after forward. */
    KILN_CHECK(rt_model_backward(tr->model, 1.0f / (float)global_n, tr->E));

    /* Bag gradients -> gradients of each table's unique keys, scattered by
     * the dedupe's inverse index (bags[s].rows are indices into the table's
     * unique keys, so no sort is needed). Each table sums its slots in slot
     * order and each slot in bag order; tables run in parallel, so the sums
     * do not depend on the thread count. */
    for (int t = 0; t < T; t++)
        KILN_CHECK(grow((void **)&tr->tgrad[t], &tr->tgrad_cap[t], tr->nuniq[t] * d,
                        2 * sizeof(double)));
    const float *dE = tr->E;
    const int64_t ldE = (int64_t)S * d;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < T; t++) {
        double *g = tr->tgrad[t]; /* (nuniq[t], d, 2) */
        if (tr->nuniq[t] == 0) /* a column empty in every row: no key, maybe no buffer */
            continue;
        memset(g, 0, (size_t)(tr->nuniq[t] * d) * 2 * sizeof(double));
        for (int s = 0; s < S; s++) {
            if (tr->slot_table[s] != t)
                continue;
            const kern_bags_t *bg = &tr->bags[s];
            for (int64_t i = 0; i < n; i++) {
                const int64_t p0 = bg->offsets[i], p1 = bg->offsets[i + 1];
                const float sc = /* as kern_ops.h's kern_combine_scale */
                    bg->combine == KERN_COMBINE_MEAN && p1 > p0 ? 1.0f / (float)(p1 - p0) : 1.0f;
                const float *go = dE + i * ldE + (int64_t)s * d; /* (d) */
                for (int64_t p = p0; p < p1; p++) {
                    double *acc = g + 2 * (int64_t)bg->rows[p] * d;
                    for (int j = 0; j < d; j++)
                        rt_dd_add(&acc[2 * j], &acc[2 * j + 1], (double)(go[j] * sc));
                }
            }
        }
    }
    KILN_CHECK(rt_shard_update(tr->shard, (const double *const *)tr->tgrad, &tr->sparse_opt, step));

    /* Double-double sums over the ranks too; rt_model_step rounds them once. */
    double *g = rt_model_grads(tr->model), *gl = rt_model_grads_lo(tr->model);
    size_t np = rt_model_nparams(tr->model);
    if (tr->nranks > 1) {
        double *pair = tr->dense_pairs; /* (np, 2) */
        for (size_t i = 0; i < np; i++) {
            pair[2 * i] = g[i];
            pair[2 * i + 1] = gl[i];
        }
        int mrc = MPI_Allreduce(MPI_IN_PLACE, pair, (int)np, tr->dd_type, tr->dd_op,
                                MPI_COMM_WORLD);
        if (mrc != MPI_SUCCESS)
            return kiln_errf(KILN_EMPI, "MPI_Allreduce of dense gradients failed");
        for (size_t i = 0; i < np; i++) {
            g[i] = pair[2 * i];
            gl[i] = pair[2 * i + 1];
        }
    }
    KILN_CHECK(rt_model_step(tr->model));
    rt_model_zero_grad(tr->model);
    return 0;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

static const char *sparse_opt_name(kern_opt_kind_t k)
{
    return k == KERN_OPT_SGD ? "sgd" : k == KERN_OPT_ADAM ? "adam" : "adagrad";
}

/* xxh64 hex of a file's bytes (the spec) or "" when unreadable. */
static void hash_file(const char *path, char out[17])
{
    uint64_t h = 0;
    out[0] = '\0';
    if (kiln_xxh64_file(path, 0, &h, NULL) == 0)
        kiln_hash_hex(h, out, 17);
}

/* xxh64 hex of the training file list: a resumed run continues its data
 * position only on the same inputs. */
static void hash_inputs(char **files, int nfiles, char out[17])
{
    kiln_hasher_t *h = kiln_hasher_create(0);
    out[0] = '\0';
    if (h == NULL)
        return;
    for (int i = 0; i < nfiles; i++)
        kiln_hasher_update(h, files[i], strlen(files[i]) + 1);
    kiln_hash_hex(kiln_hasher_digest(h), out, 17);
    kiln_hasher_destroy(h);
}

/* Retention pins from the DB: the uids of the checkpoints some endpoint
 * holds now (whatever export or promotion put them there), read once per
 * retention pass. */
typedef struct held {
    char **uids;
    size_t n;
} held_t;

static bool pinned_by_db(const char *uid, void *ctx)
{
    const held_t *h = ctx;
    for (size_t i = 0; h != NULL && i < h->n; i++)
        if (strcmp(h->uids[i], uid) == 0)
            return true;
    return false;
}

/* Fills h from the endpoints' holdings. On failure the caller must not
 * prune: a checkpoint an endpoint needs could go. */
static int held_load(state_t *db, held_t *h)
{
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    h->uids = NULL;
    h->n = 0;
    if (db == NULL)
        return 0;
    int rc = state_endpoint_list(db, &es, &n);
    if (rc < 0)
        return rc;
    h->uids = kiln_calloc(n + 1, sizeof *h->uids);
    if (h->uids == NULL)
        rc = KILN_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (es[i].checkpoint_uid == NULL)
            continue;
        if ((h->uids[h->n] = kiln_strdup(es[i].checkpoint_uid)) == NULL)
            rc = KILN_ENOMEM;
        else
            h->n++;
    }
    state_endpoint_infos_free(es, n);
    return rc;
}

static void held_fini(held_t *h)
{
    for (size_t i = 0; i < h->n; i++)
        free(h->uids[i]);
    free(h->uids);
}

/* Rank 0: records a checkpoint in the DB: an online export with its export
 * row and, when measured, the eval figures the quality gate compares (kilnd
 * queues an export's pushes as soon as the row appears, so the figures go
 * in with it). An online run's inputs count as consumed once a checkpoint
 * holds them. A failure is a warning: the checkpoint is on disk whatever the
 * DB says. */
static void record_checkpoint(trainer_t *tr, const rt_ckpt_info_t *in, const char *path,
                              bool online, double logloss, double auc)
{
    tr->last_ckpt_id = 0;
    if (tr->db == NULL)
        return;
    int64_t parent_id = 0, id = 0;
    state_checkpoint_t p = {0};
    if (in->parent[0] != '\0' && state_checkpoint_get(tr->db, in->parent, &p) == 0)
        parent_id = p.id;
    state_checkpoint_fini(&p);
    state_checkpoint_t c = {
        .uid = (char *)in->uid,
        .run_id = tr->opt.run_id,
        .parent_id = parent_id,
        .kind = (char *)rt_ckpt_kind_name(in->kind),
        .path = (char *)path,
        .step = in->step,
        .keys = in->keys,
        .bytes = in->bytes,
        .checksum = (char *)in->checksum,
        .has_eval = !isnan(logloss),
        .eval_logloss = logloss,
        .eval_auc = auc,
        .online = online,
    };
    int rc = state_checkpoint_add(tr->db, &c, &id);
    if (rc == 0 && online)
        rc = state_export_add(tr->db, id, parent_id, "kiln", path, in->bytes, NULL);
    if (rc == 0 && tr->spec.train.mode == JOB_MODE_ONLINE)
        rc = state_inputs_cover(tr->db, tr->opt.run_id, id);
    if (rc < 0)
        KILN_WARN("checkpoint %s not recorded in %s: %s", in->uid, tr->opt.db, kiln_errmsg());
    else
        tr->last_ckpt_id = id;
}

/* Rank 0, after an online export: RUN_FILE_EXPORT_LAST says which. */
static void note_export(trainer_t *tr, const rt_ckpt_info_t *in, const char *path)
{
    run_export_t e = {.step = in->step, .keys = in->keys, .bytes = in->bytes,
                      .time = kiln_now_s()};
    snprintf(e.checkpoint, sizeof e.checkpoint, "%s", in->uid);
    snprintf(e.kind, sizeof e.kind, "%s", rt_ckpt_kind_name(in->kind));
    snprintf(e.parent, sizeof e.parent, "%s", in->parent);
    snprintf(e.path, sizeof e.path, "%s", path);
    if (run_export_last_write(tr->opt.run_dir, &e) < 0)
        KILN_WARN("%s", kiln_errmsg());
}

static int evaluate(trainer_t *tr, char **files, int nfiles, int64_t *rows, double *logloss,
                    double *auc);

/* Whether each online export is evaluated first: the quality gate
 * (push.max_regression) needs the figures, and there is data to measure. */
static bool eval_exports(const trainer_t *tr)
{
    return !isnan(tr->spec.push.max_regression) && tr->neval > 0 &&
           tr->spec.push.nendpoints > 0;
}

/* Writes a checkpoint of the current state on every rank (collective).
 * online: an export requested while training (incremental when there is a
 * parent). A checkpoint at the step of the last one is skipped. */
static int checkpoint(trainer_t *tr, bool online)
{
    const job_spec_t *sp = &tr->spec;
    if (tr->last_uid[0] != '\0' && tr->last_step == tr->steps)
        return 0;
    rt_ckpt_info_t *in = kiln_calloc(1, sizeof *in);
    if (in == NULL)
        return KILN_ENOMEM;
    bool full = tr->last_uid[0] == '\0' || tr->chain_elsewhere ||
                (!online && tr->chain + 1 >= (sp->checkpoint.full_every > 0
                                                  ? sp->checkpoint.full_every
                                                  : 1));
    in->kind = full ? RT_CKPT_FULL : RT_CKPT_INCREMENTAL;
    snprintf(in->parent, sizeof in->parent, "%s", tr->last_uid);
    snprintf(in->base, sizeof in->base, "%s", full ? "" : tr->base_uid);
    in->chain = full ? 0 : tr->chain + 1;
    in->since = full ? -1 : tr->last_step;
    in->step = tr->steps;
    in->epoch = tr->pos_epoch;
    in->epoch_step = tr->pos_k;
    in->samples = tr->samples;
    in->include_optimizer = sp->checkpoint.include_optimizer;
    snprintf(in->job, sizeof in->job, "%s", sp->name);
    snprintf(in->model, sizeof in->model, "%s", job_model_type_name(sp->model.type));
    snprintf(in->optimizer, sizeof in->optimizer, "%s", sparse_opt_name(tr->sparse_opt.kind));
    snprintf(in->spec_hash, sizeof in->spec_hash, "%s", tr->spec_hash);
    snprintf(in->inputs_hash, sizeof in->inputs_hash, "%s", tr->inputs_hash);
    rt_model_array_t ma[RT_MODEL_MAX_STATE];
    rt_ckpt_array_t ca[RT_MODEL_MAX_STATE];
    int na = 0;
    rt_model_state(tr->model, ma, &na, &in->dense_step);
    if (!in->include_optimizer)
        na = 1; /* "dense.params" only */
    for (int i = 0; i < na; i++)
        ca[i] = (rt_ckpt_array_t){.name = ma[i].name, .data = ma[i].data, .count = ma[i].count};
    int64_t t0 = kiln_mono_ns();
    /* With a GPU store the checkpoint reads the host mirror: bring it up to
     * date first (every rank, or none dumps). */
    int rc = agree(rt_store_sync(tr->store, tr->steps));
    if (rc == 0)
        rc = rt_ckpt_dump(MPI_COMM_WORLD, tr->ckpt_root, tr->T, tr->tables, ca, na, in);
    if (rc < 0) {
        if (kiln_errmsg()[0] && strstr(kiln_errmsg(), "failed to write its part") != NULL)
            tr->error_told = true;
        free(in);
        return rc;
    }
    snprintf(tr->last_uid, sizeof tr->last_uid, "%s", in->uid);
    snprintf(tr->base_uid, sizeof tr->base_uid, "%s", full ? in->uid : in->base);
    tr->last_step = in->step;
    tr->chain = in->chain;
    tr->chain_elsewhere = false;
    double secs = (double)(kiln_mono_ns() - t0) / 1e9;
    /* An online export that the quality gate will judge is measured before
     * kilnd can see it (collective). */
    double logloss = NAN, auc = NAN;
    if (online && eval_exports(tr)) {
        int64_t rows = 0;
        rc = evaluate(tr, tr->eval_files, tr->neval, &rows, &logloss, &auc);
        if (rc < 0) {
            free(in);
            return rc;
        }
    }
    if (tr->rank == 0) {
        char *path = kiln_asprintf("%s/%s", tr->ckpt_root, in->uid);
        say(tr, "checkpoint %s: %s, step %" PRId64 ", %" PRId64 " rows, %" PRId64
                " evicted, %" PRId64 " bytes, %.3f s%s\n",
            in->uid, rt_ckpt_kind_name(in->kind), in->step, in->keys, in->evicted, in->bytes,
            secs, online ? " (online export)" : "");
        if (tr->progress) {
            run_progress_t rec = {.kind = RUN_REC_CHECKPOINT, .step = in->step,
                                  .time = kiln_now_s(), .keys = in->keys, .bytes = in->bytes,
                                  .ckpt_seconds = secs, .online = online};
            snprintf(rec.checkpoint, sizeof rec.checkpoint, "%s", in->uid);
            snprintf(rec.ckpt_kind, sizeof rec.ckpt_kind, "%s", rt_ckpt_kind_name(in->kind));
            if (run_progress_write(tr->progress, &rec) < 0)
                KILN_WARN("%s", kiln_errmsg());
        }
        if (path != NULL) {
            record_checkpoint(tr, in, path, online, logloss, auc);
            if (online)
                note_export(tr, in, path);
        }
        free(path);
        /* Retention: never while the DB cannot say what endpoints hold. */
        int removed = 0;
        held_t held = {0};
        if (held_load(tr->db, &held) < 0)
            KILN_WARN("retention in %s skipped: cannot read what endpoints hold from %s: %s",
                      tr->ckpt_root, tr->opt.db, kiln_errmsg());
        else if (rt_ckpt_retain(tr->ckpt_root, sp->checkpoint.keep, pinned_by_db, &held,
                                &removed) < 0)
            KILN_WARN("retention in %s: %s", tr->ckpt_root, kiln_errmsg());
        else if (removed > 0)
            KILN_INFO("removed %d old checkpoint%s from %s (keep: %d)", removed,
                      removed == 1 ? "" : "s", tr->ckpt_root, sp->checkpoint.keep);
        held_fini(&held);
    }
    /* A SIGUSR1 that reached some rank while this boundary's export was
     * agreed on and written asks for the state this export holds (no rank
     * could step on meanwhile): it is served. Without this, one signal sent
     * to every rank at once could straddle the flag exchange and give two
     * exports a step apart. */
    if (online)
        export_signal = 0;
    free(in);
    return 0;
}

/* Whether an export was asked for: SIGUSR1 on any rank, the control file or
 * the export.every_ms timer on rank 0. Collective when nranks > 1. */
static int export_requested(trainer_t *tr, bool *want)
{
    int mine = export_signal ? 1 : 0;
    export_signal = 0;
    if (tr->rank == 0) {
        if (run_export_take_request(tr->opt.run_dir))
            mine = 1;
        int64_t every = tr->spec.export_.every_ms, now = kiln_mono_ns() / 1000000;
        if (every > 0 && now - tr->last_export_ms >= every) {
            if (tr->steps > tr->export_step)
                mine = 1;
            else
                tr->last_export_ms = now; /* nothing learnt since: the next period */
        }
    }
    int any = mine;
    if (tr->nranks > 1 &&
        MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Allreduce of the export flag failed");
    *want = any != 0;
    return 0;
}

/* Rank 0, for init_from: latest: a checkpoint newer than the one the run
 * starts from cannot be used. Said in the run's log and, with --db, as a
 * "warning" event of the run. */
static void skipped_checkpoint(const char *dir, const char *why, void *ctx)
{
    trainer_t *tr = ctx;
    char *msg = kiln_asprintf("init_from latest: checkpoint %s cannot be used (%s); trying the "
                              "next older one",
                              dir, why);
    if (msg == NULL)
        return;
    KILN_WARN("%s", msg);
    if (tr->db != NULL && state_event_add(tr->db, 0, tr->opt.run_id, "warning", msg) < 0)
        KILN_WARN("the warning was not recorded in %s: %s", tr->opt.db, kiln_errmsg());
    free(msg);
}

/* Loads the checkpoint the run starts from, if any: --resume DIR (state and
 * data position) or train.init_from (state only). Every rank reads every
 * shard file and keeps its own keys. init_from: latest takes the newest
 * checkpoint that can be used, saying which newer ones cannot, and fails
 * when there are some and none can. */
static int load_start(trainer_t *tr)
{
    const job_spec_t *sp = &tr->spec;
    char *dir = NULL;
    int rc = 0;
    rt_ckpt_chain_t ch = {0};
    rt_ckpt_array_t *dense = NULL;
    int nd = 0;
    if (tr->opt.resume != NULL) {
        dir = kiln_strdup(tr->opt.resume);
        tr->resumed = true;
    } else if (sp->train.init_from == JOB_INITFROM_LATEST) {
        rc = rt_ckpt_latest_chain(tr->ckpt_root, true, tr->rank == 0 ? skipped_checkpoint : NULL,
                                  tr, &ch);
        if (rc == KILN_ENOENT) {
            kiln_errclear();
            return 0;
        }
        if (rc == KILN_ECORRUPT) {
            char why[1024];
            snprintf(why, sizeof why, "%s", kiln_errmsg());
            rc = kiln_errf(rc,
                           "init_from latest: %s. Move the damaged checkpoints out of %s, or "
                           "set train.init_from: none to start fresh",
                           why, tr->ckpt_root);
        }
        if (rc < 0)
            goto out;
        dir = kiln_strdup(rt_ckpt_path(ch.items[ch.n - 1]));
    } else if (sp->train.init_from == JOB_INITFROM_CHECKPOINT) {
        const char *id = sp->train.init_from_checkpoint;
        dir = id[0] == '/' ? kiln_strdup(id) : kiln_asprintf("%s/%s", tr->ckpt_root, id);
    } else {
        return 0;
    }
    if (dir == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if (ch.n == 0) {
        rc = rt_ckpt_chain_open(dir, true, &ch);
        if (rc == KILN_ENOENT)
            rc = kiln_errf(KILN_ENOENT,
                           "no checkpoint %s to start from; check --resume or "
                           "train.init_from",
                           dir);
        if (rc < 0)
            goto out;
    }
    const rt_ckpt_info_t *in = rt_ckpt_info(ch.items[ch.n - 1]);
    if (strcmp(in->model, job_model_type_name(sp->model.type)) != 0) {
        rc = kiln_errf(KILN_ECONFLICT, "checkpoint %s holds a %s model but the spec says %s; "
                                       "use init_from: none to start fresh",
                       dir, in->model, job_model_type_name(sp->model.type));
        goto out;
    }
    KILN_CHECK_GOTO(rt_ckpt_load_tables(&ch, tr->rank, tr->nranks, tr->T, tr->tables), rc, out);
    KILN_CHECK_GOTO(rt_store_upload(tr->store, in->step), rc, out);
    KILN_CHECK_GOTO(rt_ckpt_read_dense(ch.items[ch.n - 1], &dense, &nd), rc, out);
    rt_model_array_t ma[8];
    int nm = 0;
    for (int i = 0; i < nd && nm < 8; i++)
        ma[nm++] = (rt_model_array_t){.name = dense[i].name, .data = dense[i].data,
                                      .count = dense[i].count};
    rc = rt_model_load(tr->model, ma, nm, in->dense_step);
    if (rc < 0) {
        char why[512]; /* a copy: kiln_errf must not read the buffer it writes */
        snprintf(why, sizeof why, "%s", kiln_errmsg());
        rc = kiln_errf(rc, "checkpoint %s does not fit this model: %s", dir, why);
        goto out;
    }
    tr->steps = in->step;
    tr->last_step = in->step;
    snprintf(tr->last_uid, sizeof tr->last_uid, "%s", in->uid);
    snprintf(tr->base_uid, sizeof tr->base_uid, "%s",
             in->kind == RT_CKPT_FULL ? in->uid : in->base);
    tr->chain = in->chain;
    /* A chain cannot span directories: after starting from a checkpoint
     * outside checkpoint.dir, the first dump is a full one. */
    char *here = realpath(tr->ckpt_root, NULL), *there = NULL;
    char *cdir = kiln_asprintf("%s/..", rt_ckpt_path(ch.items[ch.n - 1]));
    if (cdir != NULL)
        there = realpath(cdir, NULL);
    tr->chain_elsewhere = here == NULL || there == NULL || strcmp(here, there) != 0;
    free(here);
    free(there);
    free(cdir);
    if (tr->resumed && tr->opt.predict == NULL) {
        tr->samples = in->samples;
        if (strcmp(in->inputs_hash, tr->inputs_hash) == 0) {
            tr->start_epoch = in->epoch;
            tr->start_k = in->epoch_step;
        } else if (tr->rank == 0) {
            KILN_WARN("the training files differ from those of checkpoint %s: reading them "
                      "from the start",
                      in->uid);
        }
    }
    if (tr->rank == 0)
        rc = rt_ckpt_lock(rt_ckpt_path(ch.items[ch.n - 1]), &tr->lock);
    say(tr, "kiln-train: %s checkpoint %s (%s, step %" PRId64 ", chain of %d, written by %d "
            "rank%s)\n",
        tr->resumed ? "resuming from" : "starting from", in->uid, rt_ckpt_kind_name(in->kind),
        in->step, ch.n, in->world_size, in->world_size == 1 ? "" : "s");
out:
    rt_ckpt_arrays_free(dense, nd);
    rt_ckpt_chain_fini(&ch);
    free(dir);
    return rc;
}

/* ---- training and evaluation ------------------------------------------------------- */

static int open_reader(trainer_t *tr, char **files, int nfiles, rt_reader_t **r)
{
    rt_format_t fmt = tr->spec.data.format == JOB_FMT_KILN_BIN ? RT_FMT_BIN : RT_FMT_TSV;
    return rt_reader_open((const char *const *)files, nfiles, fmt, tr->rank, tr->nranks,
                          tr->spec.train.batch_size, tr->F, tr->S, 4, r);
}

static void log_malformed(trainer_t *tr, rt_reader_t *r, const char *what)
{
    rt_reader_stats_t st;
    rt_reader_stats(r, &st);
    for (int i = 0; i < st.nmessages; i++)
        KILN_WARN("rank %d: malformed %s line skipped: %s", tr->rank, what, st.messages[i]);
    if (st.malformed > st.nmessages)
        KILN_WARN("rank %d: %" PRId64 " more malformed %s lines skipped", tr->rank,
                  st.malformed - st.nmessages, what);
    tr->malformed += st.malformed;
}

/* A progress record of the rows since the last one (collective: the loss is
 * summed over the ranks); `human` also prints the line on stderr, which
 * kilnd's run log (and `kiln logs --follow`) shows. */
static void report_progress(trainer_t *tr, int64_t step, int64_t nsteps, double loss_sum,
                            int64_t rows, double seconds, bool human, bool last)
{
    double in[2] = {loss_sum, (double)rows}, out[2];
    MPI_Reduce(in, out, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (tr->rank != 0)
        return;
    double loss = out[1] > 0 ? out[0] / out[1] : NAN;
    double sps = seconds > 0 ? (double)tr->samples / seconds : 0.0;
    if (tr->progress) {
        run_progress_t rec = {.kind = RUN_REC_STEP, .step = step, .time = kiln_now_s(),
                              .samples = tr->samples, .loss = loss, .samples_per_s = sps,
                              .seconds = seconds};
        if (run_progress_write(tr->progress, &rec) < 0)
            KILN_WARN("%s", kiln_errmsg());
    }
    if (human && !tr->opt.quiet) {
        bool tty = isatty(STDERR_FILENO);
        fprintf(stderr, "%sstep %" PRId64 "/%" PRId64 "  samples %" PRId64 "  loss %.4f  "
                        "samples/s %.0f%s",
                tty ? "\r" : "", step, nsteps, tr->samples, loss, sps,
                tty && !last ? "   " : "\n");
        fflush(stderr);
    }
}

/* ---- kilnd hooks (the contract is run/run.h) ------------------------------------------ */

/* The directory a spec's relative paths resolve against. kilnd runs a copy of
 * the spec in the run directory and names the submitted file's directory in
 * RUN_ENV_SPEC_DIR; otherwise it is the directory of the spec file itself, with
 * symlinks resolved: `kiln submit` records the real path too, so a spec
 * reached through a link reads the same data whether kilnd or a person
 * starts the trainer (docs/job-spec.md, "Paths"). */
static char *spec_base_dir(const char *spec_path)
{
    const char *env = getenv(RUN_ENV_SPEC_DIR);
    if (env != NULL && env[0] != '\0')
        return kiln_strdup(env);
    char *real = realpath(spec_path, NULL);
    char *dup = real != NULL ? real : kiln_strdup(spec_path);
    char *dir = kiln_strdup(dup ? dirname(dup) : ".");
    free(dup);
    return dir;
}

/* Test-only fault injection for tests/test_sched.c: KILN_TEST_KILL_RANK=R and
 * KILN_TEST_KILL_STEP=S make rank R kill itself with SIGKILL at step S, on a
 * run's first attempt only (KILN_ATTEMPT unset or 1), so that the retry can
 * succeed. Without those variables it does nothing. */
static void test_kill_hook(int rank, int64_t step)
{
    const char *r = getenv("KILN_TEST_KILL_RANK"), *s = getenv("KILN_TEST_KILL_STEP");
    const char *attempt = getenv(RUN_ENV_ATTEMPT);
    if (r == NULL || s == NULL || (attempt != NULL && atoi(attempt) > 1))
        return;
    if (atoi(r) == rank && atoll(s) == step)
        raise(SIGKILL);
}

/* Before a checkpoint other than the last, data.max_malformed is checked
 * only once this many lines were read: one bad line among the first few
 * (a header) should not fail a run whose data is good. */
#define MALFORMED_MIN_LINES 10000

/* data.max_malformed, and a run that read lines but no good row: every
 * rank agrees on the counts (they come from the per-step allreduce), so
 * every rank returns the same code; rank 0 tells. final: the end of the
 * run. Returns 0, or KILN_ECORRUPT / KILN_EINVAL (exit 2: the same files fail
 * again). */
static int check_data(trainer_t *tr, bool final)
{
    const int64_t bad = tr->run_malformed, lines = tr->run_rows + bad;
    const double max = tr->spec.data.max_malformed;
    if (lines == 0 || (!final && lines < MALFORMED_MIN_LINES))
        return 0;
    if ((double)bad > max * (double)lines) {
        tr->error_told = tr->rank != 0;
        return kiln_errf(KILN_ECORRUPT,
                         "%" PRId64 " of the %" PRId64 " training lines read (%.2f%%) are "
                         "malformed, more than data.max_malformed (%g%%) allows, so no "
                         "checkpoint is written; the first are logged above (FILE:LINE: "
                         "reason). Check data.format, data.dense_features (%d) and "
                         "data.cat_slots (%d) against the files, or raise data.max_malformed",
                         bad, lines, 100.0 * (double)bad / (double)lines, 100.0 * max, tr->F,
                         tr->S);
    }
    if (final && tr->run_rows == 0) {
        tr->error_told = tr->rank != 0;
        return kiln_errf(KILN_EINVAL,
                         "the %" PRId64 " training lines read hold no good row (all "
                         "malformed): nothing was trained and no checkpoint is "
                         "written",
                         lines);
    }
    return 0;
}

/* A run that diverged stops at the step it diverged, before anything of it
 * reaches a checkpoint: a loss that is not finite on any rank, or dense
 * weights that are not (they are the same on every rank). Embedding rows
 * that blew up show in the loss of the step that reads them, and the
 * checkpoint writer refuses any that is not finite. Collective. */
static int check_finite(trainer_t *tr, double loss_sum, int64_t step)
{
    int bad = isfinite(loss_sum) ? 0 : 1;
    if (bad == 0) {
        const float *p = rt_model_params(tr->model);
        const size_t np = rt_model_nparams(tr->model);
        for (size_t i = 0; i < np && bad == 0; i++)
            if (!isfinite(p[i]))
                bad = 2;
    }
    int worst = bad;
    if (tr->nranks > 1 &&
        MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Allreduce of the divergence check failed");
    if (worst == 0)
        return 0;
    tr->error_told = tr->rank != 0;
    const job_optimizer_t *so = &tr->spec.train.sparse, *d = &tr->spec.train.dense;
    return kiln_errf(KILN_ERANGE,
                     "step %" PRId64 ": training diverged: the %s not finite (NaN or "
                     "infinite), so the run stops and writes no checkpoint of it. Lower the "
                     "learning rates (train.optimizer.sparse.lr %g, train.optimizer.dense.lr "
                     "%g) or check the data",
                     step, worst == 1 ? "loss is" : "dense model's weights are", so->lr, d->lr);
}

/* The step at which training stops (0: none): a resumed run counts steps
 * from the start of its lineage; a warm start (init_from) counts its own. */
static int64_t step_limit(const trainer_t *tr)
{
    int64_t max_steps = tr->opt.max_steps > 0 ? tr->opt.max_steps : tr->spec.train.max_steps;
    return max_steps <= 0 ? 0 : tr->resumed ? max_steps : tr->steps0 + max_steps;
}

/* Trains `epochs` passes over files (continuing a resumed run's position
 * within them). The loop's time adds to tr->train_ns. */
static int train(trainer_t *tr, char **files, int nfiles, int64_t epochs)
{
    const job_spec_t *sp = &tr->spec;
    int64_t limit = step_limit(tr);
    int64_t log_every = sp->train.log_every > 0 ? sp->train.log_every : 100;
    int64_t every_steps = sp->checkpoint.every_steps;
    int64_t t0 = kiln_mono_ns();
    int rc = 0;
    for (int64_t epoch = tr->start_epoch; epoch < epochs && rc == 0; epoch++) {
        if (limit > 0 && tr->steps >= limit)
            break;
        rt_reader_t *r = NULL;
        rc = agree(open_reader(tr, files, nfiles, &r));
        if (rc < 0) {
            rt_reader_close(r);
            break;
        }
        if (rt_reader_total_rows(r) == 0) {
            /* Every rank counted the same files. */
            tr->error_told = tr->rank != 0;
            rc = kiln_errf(KILN_EINVAL,
                           "the %d training file%s (%s%s) hold%s no lines: nothing "
                           "to train on; check data.train",
                           nfiles, nfiles == 1 ? "" : "s", files[0], nfiles > 1 ? ", ..." : "",
                           nfiles == 1 ? "s" : "");
            rt_reader_close(r);
            break;
        }
        int64_t nsteps = rt_reader_nsteps(r);
        /* The loss curve: a record every few steps, at most ~256 over the
         * run, every step of a short one. */
        if (tr->rec_every <= 0)
            tr->rec_every = (nsteps * (epochs - tr->start_epoch) + 255) / 256;
        if (tr->rec_every <= 0)
            tr->rec_every = 1;
        int64_t k0 = epoch == tr->start_epoch ? tr->start_k : 0;
        if (k0 > nsteps)
            k0 = nsteps;
        /* Continue a resumed run where it stopped: skip the batches it took. */
        for (int64_t k = 0; k < k0; k++) {
            rt_batch_t *b = NULL;
            int got = rt_reader_next(r, &b);
            rc = agree(got < 0 ? got : got == 0 ? kiln_errf(KILN_EINTERNAL, "rank %d ran out of "
                                                                             "batches skipping "
                                                                             "to step %" PRId64,
                                                             tr->rank, k0)
                                                : 0);
            if (rc < 0)
                break;
        }
        if (limit > 0 && nsteps - k0 > limit - tr->steps)
            nsteps = k0 + (limit - tr->steps);
        tr->pos_epoch = epoch;
        tr->pos_k = k0;
        double loss_acc = 0.0;
        int64_t rows_acc = 0;
        for (int64_t k = k0; k < nsteps && rc == 0; k++) {
            rt_batch_t *b = NULL;
            int got = rt_reader_next(r, &b);
            /* Agree on the rows of this step, whether any rank failed, and
             * the malformed lines it skipped (data.max_malformed). */
            int64_t in[3] = {got == 1 ? b->n : 0, got == 1 ? 0 : 1, got == 1 ? b->nskipped : 0};
            int64_t out[3];
            if (MPI_Allreduce(in, out, 3, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) {
                rc = kiln_errf(KILN_EMPI, "MPI_Allreduce of batch sizes failed");
                break;
            }
            if (out[1] != 0) {
                rc = got < 0 ? got
                             : kiln_errf(KILN_EIO, "another rank could not read its part of "
                                                   "step %" PRId64, k);
                if (got == 0)
                    rc = kiln_errf(KILN_EINTERNAL, "rank %d ran out of batches at step %" PRId64,
                                   tr->rank, k);
                break;
            }
            tr->pos_k = k + 1;
            tr->run_rows += out[0];
            tr->run_malformed += out[2];
            if (out[0] == 0)
                continue;
            double loss_sum = 0.0;
            rc = train_step(tr, b, tr->steps + 1, out[0], &loss_sum);
            if (rc < 0) {
                /* The other ranks may be waiting in a collective of this
                 * step: only MPI_Abort can stop them (see main). */
                tr->abort_needed = true;
                break;
            }
            rc = check_finite(tr, loss_sum, tr->steps + 1);
            if (rc < 0)
                break;
            tr->steps++;
            test_kill_hook(tr->rank, tr->steps);
            tr->samples += out[0];
            loss_acc += loss_sum;
            rows_acc += b->n;
            bool last = k + 1 == nsteps && epoch + 1 == epochs;
            bool human = tr->steps % log_every == 0 || last;
            if (human || tr->steps % tr->rec_every == 0) {
                report_progress(tr, tr->steps, nsteps, loss_acc, rows_acc,
                                (double)(tr->train_ns + kiln_mono_ns() - t0) / 1e9, human, last);
                loss_acc = 0.0;
                rows_acc = 0;
            }
            /* Step boundary: periodic checkpoints and online exports. */
            bool want = false;
            rc = export_requested(tr, &want);
            if (rc == 0 && (want || (every_steps > 0 && tr->steps % every_steps == 0)))
                rc = check_data(tr, false);
            if (rc == 0 && want) {
                rc = checkpoint(tr, true);
                /* export.every_ms counts from the end of an export, so a
                 * slow disk gets training time between exports. */
                tr->last_export_ms = kiln_mono_ns() / 1000000;
                tr->export_step = tr->steps;
            }
            if (rc == 0 && every_steps > 0 && tr->steps % every_steps == 0)
                rc = checkpoint(tr, false);
        }
        log_malformed(tr, r, "training");
        rt_reader_close(r);
        if (limit > 0 && tr->steps >= limit)
            break;
    }
    tr->train_ns += kiln_mono_ns() - t0;
    if (rc == 0)
        rc = check_data(tr, true);
    return rc;
}

/* ---- online training -------------------------------------------------------------------
 * train.mode: online keeps the run training as partitions land: rank 0 looks
 * at data.train's glob twice a second and names the files it has not seen
 * (path, size and mtime: a file is taken once it has landed; write
 * partitions under another name and rename them into place) to every rank;
 * each new set is trained on once, in order, and recorded as an input of
 * the run. Exports (export.every, the control file, SIGUSR1) are written
 * between sets and while waiting; kilnd pushes each as it appears. The run
 * ends when kilnd stops it (cancel, resources.timeout) or at
 * train.max_steps. */

#define ONLINE_POLL_MS 500

typedef struct seen {
    char **path;
    int64_t *size, *mtime;
    int n, cap;
} seen_t;

static bool seen_has(const seen_t *s, const char *path, int64_t size, int64_t mtime)
{
    for (int i = 0; i < s->n; i++)
        if (s->size[i] == size && s->mtime[i] == mtime && strcmp(s->path[i], path) == 0)
            return true;
    return false;
}

static int seen_add(seen_t *s, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) < 0)
        return 0; /* gone again: nothing to remember */
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        char **np = kiln_reallocarray(s->path, (size_t)cap, sizeof *np);
        if (np == NULL)
            return KILN_ENOMEM;
        s->path = np;
        int64_t *ns = kiln_reallocarray(s->size, (size_t)cap, sizeof *ns);
        if (ns == NULL)
            return KILN_ENOMEM;
        s->size = ns;
        int64_t *nm = kiln_reallocarray(s->mtime, (size_t)cap, sizeof *nm);
        if (nm == NULL)
            return KILN_ENOMEM;
        s->mtime = nm;
        s->cap = cap;
    }
    if ((s->path[s->n] = kiln_strdup(path)) == NULL)
        return KILN_ENOMEM;
    s->size[s->n] = (int64_t)sb.st_size;
    s->mtime[s->n] = (int64_t)sb.st_mtime;
    s->n++;
    return 0;
}

static void seen_fini(seen_t *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->path[i]);
    free(s->path);
    free(s->size);
    free(s->mtime);
}

/* Rank 0: new files of pattern (regular, not empty, not seen), marked seen,
 * as one '\n'-joined list (malloc'd; "" when none). */
static int find_new(seen_t *seen, const char *pattern, char **list)
{
    glob_t g;
    size_t len = 0, cap = 256;
    char *out = kiln_calloc(1, cap);
    int rc = 0;
    *list = NULL;
    if (out == NULL)
        return KILN_ENOMEM;
    int grc = glob(pattern, 0, NULL, &g);
    for (size_t i = 0; grc == 0 && rc == 0 && i < g.gl_pathc; i++) {
        struct stat sb;
        const char *p = g.gl_pathv[i];
        if (stat(p, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0 ||
            seen_has(seen, p, (int64_t)sb.st_size, (int64_t)sb.st_mtime))
            continue;
        size_t pl = strlen(p);
        if (len + pl + 2 > cap) {
            while (len + pl + 2 > cap)
                cap *= 2;
            char *n = realloc(out, cap);
            if (n == NULL) {
                rc = KILN_ENOMEM;
                break;
            }
            out = n;
        }
        memcpy(out + len, p, pl);
        out[len + pl] = '\n';
        len += pl + 1;
        out[len] = '\0';
        rc = seen_add(seen, p);
    }
    if (grc == 0)
        globfree(&g);
    if (rc < 0) {
        free(out);
        return rc;
    }
    *list = out;
    return 0;
}

/* Rank 0 with --db: records files as inputs of this run (lineage walks from
 * a file to what was trained on it; an online run's inputs are its data
 * watermark). */
static void record_inputs(trainer_t *tr, char **files, int n)
{
    for (int i = 0; tr->db != NULL && i < n; i++) {
        struct stat sb;
        uint64_t h = 0;
        char hex[17];
        if (stat(files[i], &sb) < 0 || kiln_xxh64_file(files[i], 0, &h, NULL) < 0)
            continue;
        kiln_hash_hex(h, hex, sizeof hex);
        state_input_t in = {files[i], (int64_t)sb.st_size, (int64_t)sb.st_mtime, hex};
        if (state_input_add(tr->db, tr->opt.run_id, &in) < 0)
            KILN_WARN("input %s not recorded: %s", files[i], kiln_errmsg());
    }
}

/* Rank 0's list of new files, to every rank (collective). */
static int share_list(trainer_t *tr, char **list)
{
    int64_t len = tr->rank == 0 ? (int64_t)strlen(*list) : 0;
    if (MPI_Bcast(&len, 1, MPI_INT64_T, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Bcast of the new files failed");
    if (tr->rank != 0) {
        free(*list);
        if ((*list = kiln_calloc(1, (size_t)len + 1)) == NULL)
            return KILN_ENOMEM;
    }
    if (len > 0 && MPI_Bcast(*list, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Bcast of the new files failed");
    return 0;
}

/* Splits a '\n'-joined list into files (malloc'd strings). */
static int split_list(const char *list, char ***files, int *n)
{
    int cnt = 0;
    for (const char *p = list; *p; p++)
        cnt += *p == '\n';
    *files = kiln_calloc((size_t)cnt + 1, sizeof **files);
    *n = 0;
    if (*files == NULL)
        return KILN_ENOMEM;
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, "\n");
        if (((*files)[(*n)++] = kiln_strndup(p, l)) == NULL)
            return KILN_ENOMEM;
        p += l + (p[l] == '\n');
    }
    return 0;
}

static int train_online(trainer_t *tr, char **files, int nfiles)
{
    const job_spec_t *sp = &tr->spec;
    seen_t seen = {0};
    char *pattern = tr->opt.data ? kiln_strdup(tr->opt.data) : spec_relative(tr, sp->data.train);
    char **cur = files, *list = NULL;
    int ncur = nfiles, rc = 0;
    if (pattern == NULL)
        return KILN_ENOMEM;
    if (tr->rank == 0) {
        for (int i = 0; i < nfiles && rc == 0; i++)
            rc = seen_add(&seen, files[i]);
        /* An incremental job's earlier runs consumed what kilnd did not list. */
        if (rc == 0 && tr->opt.inputs != NULL)
            rc = find_new(&seen, pattern, &list);
        free(list);
        list = NULL;
    }
    int64_t limit = step_limit(tr);
    tr->rec_every = sp->train.log_every / 10 > 0 ? sp->train.log_every / 10 : 1;
    say(tr, "kiln-train: online: training as files matching %s land\n", pattern);
    for (bool first = true; (rc = agree(rc)) == 0; first = false) {
        if (ncur > 0) {
            if (!first && tr->rank == 0)
                record_inputs(tr, cur, ncur);
            hash_inputs(cur, ncur, tr->inputs_hash);
            rc = train(tr, cur, ncur, 1);
            tr->start_epoch = tr->start_k = 0; /* a resume's position was in the first set */
            if (rc < 0)
                break;
        }
        if (cur != files)
            free_list(cur, ncur);
        cur = NULL;
        ncur = 0;
        if (limit > 0 && tr->steps >= limit)
            break;
        bool want = false;
        rc = export_requested(tr, &want);
        if (rc == 0 && want) {
            rc = checkpoint(tr, true);
            tr->last_export_ms = kiln_mono_ns() / 1000000;
            tr->export_step = tr->steps;
        }
        if (rc == 0 && tr->rank == 0)
            rc = find_new(&seen, pattern, &list);
        if (agree(rc) < 0 || (rc = share_list(tr, &list)) < 0)
            continue; /* the loop's agree() ends it */
        rc = split_list(list != NULL ? list : "", &cur, &ncur);
        free(list);
        list = NULL;
        if (rc == 0 && ncur == 0) {
            struct timespec ts = {0, ONLINE_POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (cur != files)
        free_list(cur, ncur);
    free(list);
    free(pattern);
    seen_fini(&seen);
    return rc;
}

/* Gathers every rank's row count on rank 0 and lays the rows out one rank
 * after another there: *counts, *displs (freed by the caller) and *total on
 * rank 0, NULL and 0 elsewhere. Collective. */
static void gather_layout(const trainer_t *tr, int mine, int **counts, int **displs,
                          int64_t *total)
{
    *counts = tr->rank == 0 ? kiln_calloc((size_t)tr->nranks, sizeof(int)) : NULL;
    *displs = tr->rank == 0 ? kiln_calloc((size_t)tr->nranks, sizeof(int)) : NULL;
    MPI_Gather(&mine, 1, MPI_INT, *counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    *total = 0;
    if (tr->rank == 0)
        for (int i = 0; i < tr->nranks; i++) {
            (*displs)[i] = (int)*total;
            *total += (*counts)[i];
        }
}

/* Predicts every eval row (lookups insert nothing) and computes logloss and
 * AUC on rank 0 over all ranks' predictions. */
static int evaluate(trainer_t *tr, char **files, int nfiles, int64_t *rows, double *logloss,
                    double *auc)
{
    rt_reader_t *r = NULL;
    int rc = agree(open_reader(tr, files, nfiles, &r));
    float *probs = NULL, *labels = NULL;
    int64_t n = 0, cap = 0, capl = 0;
    if (rc < 0)
        goto out;
    int64_t nsteps = rt_reader_nsteps(r);
    for (int64_t k = 0; k < nsteps; k++) {
        rt_batch_t *b = NULL;
        int got = rt_reader_next(r, &b);
        rc = agree(got < 0 ? got : got == 0 ? KILN_EINTERNAL : 0);
        if (rc < 0)
            goto out;
        rc = agree(lookup_batch(tr, b, tr->steps, false));
        if (rc < 0)
            goto out;
        if ((rc = grow((void **)&probs, &cap, n + b->n, sizeof(float))) < 0 ||
            (rc = grow((void **)&labels, &capl, n + b->n, sizeof(float))) < 0)
            goto out;
        rc = rt_model_predict(tr->model, b->n, tr->E, b->dense, probs + n);
        if (rc < 0)
            goto out;
        memcpy(labels + n, b->labels, (size_t)b->n * sizeof(float));
        n += b->n;
    }
    log_malformed(tr, r, "eval");

    /* Gather every rank's predictions on rank 0. */
    int mine = (int)n;
    int *counts, *displs;
    int64_t total;
    gather_layout(tr, mine, &counts, &displs, &total);
    float *all_p = NULL, *all_l = NULL;
    if (tr->rank == 0) {
        all_p = kiln_calloc((size_t)total + 1, sizeof(float));
        all_l = kiln_calloc((size_t)total + 1, sizeof(float));
    }
    MPI_Gatherv(probs, mine, MPI_FLOAT, all_p, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Gatherv(labels, mine, MPI_FLOAT, all_l, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (tr->rank == 0) {
        *rows = total;
        *logloss = rt_metrics_logloss(all_p, all_l, (size_t)total);
        rc = rt_metrics_auc(all_p, all_l, (size_t)total, auc);
    }
    free(all_p);
    free(all_l);
    free(counts);
    free(displs);
out:
    rt_reader_close(r);
    free(probs);
    free(labels);
    return rc;
}

/* ---- prediction mode ------------------------------------------------------------------- */

/* Predicts every row of files with the loaded state, as evaluate() does, and
 * gathers the probabilities on rank 0 in file order: the reader deals rows
 * block-cyclically, so each rank tags its rows with their global index
 * (batch first_row + i) and rank 0 places them. A malformed line would
 * leave a hole in that order, so it is an error here. probs_out (rank 0):
 * malloc'd (nrows). */
static int predict_rows(trainer_t *tr, char **files, int nfiles, float **probs_out,
                        int64_t *nrows)
{
    rt_reader_t *r = NULL;
    float *probs = NULL, *all_p = NULL;
    int64_t *idx = NULL, *all_i = NULL;
    int *counts = NULL, *displs = NULL;
    int64_t n = 0, capp = 0, capi = 0;
    int rc = agree(open_reader(tr, files, nfiles, &r));
    if (rc < 0)
        goto out;
    int64_t nsteps = rt_reader_nsteps(r);
    for (int64_t k = 0; k < nsteps; k++) {
        rt_batch_t *b = NULL;
        int got = rt_reader_next(r, &b);
        rc = got < 0 ? got : got == 0 ? KILN_EINTERNAL : 0;
        if (rc == 0 && b->nskipped > 0)
            rc = kiln_errf(KILN_ECORRUPT, "--predict: rows near global row %" PRId64
                                          " are malformed; predictions must keep the file's "
                                          "row order, so fix or drop those lines",
                           b->first_row);
        rc = agree(rc);
        if (rc < 0)
            goto out;
        rc = agree(lookup_batch(tr, b, tr->steps, false));
        if (rc < 0)
            goto out;
        if ((rc = grow((void **)&probs, &capp, n + b->n, sizeof(float))) < 0 ||
            (rc = grow((void **)&idx, &capi, n + b->n, sizeof(int64_t))) < 0)
            goto out;
        if ((rc = rt_model_predict(tr->model, b->n, tr->E, b->dense, probs + n)) < 0)
            goto out;
        for (int i = 0; i < b->n; i++)
            idx[n + i] = b->first_row + i;
        n += b->n;
    }
    log_malformed(tr, r, "predict");

    int mine = (int)n;
    int64_t total;
    gather_layout(tr, mine, &counts, &displs, &total);
    if (tr->rank == 0) {
        all_p = kiln_calloc((size_t)total + 1, sizeof(float));
        all_i = kiln_calloc((size_t)total + 1, sizeof(int64_t));
    }
    MPI_Gatherv(probs, mine, MPI_FLOAT, all_p, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Gatherv(idx, mine, MPI_INT64_T, all_i, counts, displs, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (tr->rank == 0) {
        float *ordered = kiln_calloc((size_t)total + 1, sizeof(float));
        if (ordered == NULL || all_p == NULL || all_i == NULL) {
            free(ordered);
            rc = KILN_ENOMEM;
            goto out;
        }
        for (int64_t i = 0; i < total; i++) {
            if (all_i[i] < 0 || all_i[i] >= total) {
                free(ordered);
                rc = kiln_errf(KILN_EINTERNAL, "--predict: row index %" PRId64
                                               " outside the %" PRId64 " rows read",
                               all_i[i], total);
                goto out;
            }
            ordered[all_i[i]] = all_p[i];
        }
        *probs_out = ordered;
        *nrows = total;
    }
out:
    rt_reader_close(r);
    free(probs);
    free(idx);
    free(all_p);
    free(all_i);
    free(counts);
    free(displs);
    return rc;
}

/* kiln-train --predict GLOB --resume DIR --out FILE: loads the checkpoint,
 * predicts the rows, and rank 0 writes one "%.9g" probability per line
 * (write-temp + rename) and a JSON line on stdout. */
static int predict_mode(trainer_t *tr)
{
    char **files = NULL;
    int nfiles = 0;
    float *probs = NULL;
    int64_t nrows = 0;
    char *tmp = NULL;
    int rc = expand(tr->opt.predict, "--predict", &files, &nfiles);
    if (rc == 0)
        rc = setup_tables(tr);
    if (rc == 0)
        rc = setup_model(tr);
    if (rc == 0 && (tr->ckpt_root = spec_relative(tr, tr->spec.checkpoint.dir)) == NULL)
        rc = KILN_ENOMEM;
    rc = agree(rc);
    if (rc == 0)
        rc = agree(load_start(tr));
    if (rc == 0)
        rc = predict_rows(tr, files, nfiles, &probs, &nrows);
    if (rc < 0 || tr->rank != 0)
        goto out;
    tmp = kiln_asprintf("%s.tmp", tr->opt.out);
    FILE *f = tmp ? fopen(tmp, "w") : NULL;
    if (f == NULL) {
        rc = kiln_errf(KILN_EIO, "cannot write %s: %s", tmp ? tmp : tr->opt.out, strerror(errno));
        goto out;
    }
    for (int64_t i = 0; i < nrows; i++)
        fprintf(f, "%.9g\n", (double)probs[i]);
    if (fclose(f) != 0 || rename(tmp, tr->opt.out) != 0) {
        rc = kiln_errf(KILN_EIO, "cannot write %s: %s", tr->opt.out, strerror(errno));
        goto out;
    }
    printf("{\"predict\": \"%s\", \"rows\": %" PRId64 ", \"checkpoint\": \"%s\"}\n",
           tr->opt.out, nrows, tr->last_uid);
    fflush(stdout);
out:
    free(tmp);
    free(probs);
    free_list(files, nfiles);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np N kiln-train --spec FILE --run-dir DIR [options]\n\n"
            "One MPI rank of Kiln's trainer (started by kilnd or mpirun).\n\n"
            "options:\n"
            "  --spec FILE        the job spec (YAML)\n"
            "  --run-dir DIR      where progress.jsonl and result.json go (created)\n"
            "  --data GLOB        train on these files instead of data.train\n"
            "  --inputs FILE      train on the files listed in FILE, one per line\n"
            "  --eval GLOB        evaluate on these files instead of data.eval ('none': skip)\n"
            "  --max-steps N      stop after N steps\n"
            "  --threads N        OpenMP/BLAS threads per rank (default: cores / local ranks)\n"
            "  --resume DIR       continue from this checkpoint (its chain is followed), data\n"
            "                     position included; without it train.init_from decides\n"
            "  --db PATH          record checkpoints and online exports in this database\n"
            "  --run-id N         ... as checkpoints of run N (required with --db)\n"
            "  --quiet            no progress on stderr\n"
            "  --predict GLOB     predict these rows with the --resume checkpoint, no training;\n"
            "  --out FILE         ... rank 0 writes one probability per row, in file order\n"
            "  --store twin       (tests) keep the working tables apart from the checkpoint\n"
            "                     mirror in host memory, as a GPU run keeps them on the GPU\n\n"
            "Online export: SIGUSR1, or a file <run-dir>/export.request, makes the trainer write\n"
            "an incremental checkpoint at the next step boundary (<run-dir>/export.last names it).\n\n"
            "At the end rank 0 prints one JSON line on stdout. Exit codes: 0 ok, 1 internal "
            "error, 2 bad input (do not retry), 3 retryable failure (docs/trainer.md).\n");
}

/* The command line, as data: strings, positive integers (int64 or int) and flags. */
typedef enum { OPT_STR, OPT_I64, OPT_INT, OPT_FLAG } opt_kind_t;

static const struct {
    const char *name;
    opt_kind_t kind;
    size_t offset; /* into options_t */
} option_table[] = {
    {"--spec", OPT_STR, offsetof(options_t, spec_path)},
    {"--run-dir", OPT_STR, offsetof(options_t, run_dir)},
    {"--data", OPT_STR, offsetof(options_t, data)},
    {"--inputs", OPT_STR, offsetof(options_t, inputs)},
    {"--eval", OPT_STR, offsetof(options_t, eval)},
    {"--resume", OPT_STR, offsetof(options_t, resume)},
    {"--db", OPT_STR, offsetof(options_t, db)},
    {"--predict", OPT_STR, offsetof(options_t, predict)},
    {"--out", OPT_STR, offsetof(options_t, out)},
    {"--store", OPT_STR, offsetof(options_t, store)},
    {"--max-steps", OPT_I64, offsetof(options_t, max_steps)},
    {"--run-id", OPT_I64, offsetof(options_t, run_id)},
    {"--threads", OPT_INT, offsetof(options_t, threads)},
    {"--quiet", OPT_FLAG, offsetof(options_t, quiet)},
};

static int parse_options(int argc, char **argv, options_t *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        size_t k = 0, nopts = sizeof option_table / sizeof option_table[0];
        while (k < nopts && strcmp(a, option_table[k].name) != 0)
            k++;
        if (k == nopts)
            return kiln_errf(KILN_EUSAGE, "unknown option '%s' (see kiln-train --help)", a);
        char *field = (char *)o + option_table[k].offset;
        if (option_table[k].kind == OPT_FLAG) {
            *(bool *)field = true;
            continue;
        }
        if (i + 1 >= argc)
            return kiln_errf(KILN_EUSAGE, "%s needs a value", a);
        const char *value = argv[++i];
        if (option_table[k].kind == OPT_STR) {
            *(const char **)field = value;
            continue;
        }
        char *end;
        long long v = strtoll(value, &end, 10);
        if (*end != '\0' || end == value || v < 1 ||
            (option_table[k].kind == OPT_INT && v > INT32_MAX))
            return kiln_errf(KILN_EUSAGE, "%s: expected a positive integer, got '%s'", a, value);
        if (option_table[k].kind == OPT_INT)
            *(int *)field = (int)v;
        else
            *(int64_t *)field = v;
    }
    if (o->store != NULL && strcmp(o->store, "twin") != 0)
        return kiln_errf(KILN_EUSAGE, "--store: the only value is twin, got '%s'", o->store);
    if (o->predict != NULL) {
        if (o->spec_path == NULL || o->resume == NULL || o->out == NULL)
            return kiln_errf(KILN_EUSAGE, "--predict needs --spec FILE, --resume CHECKPOINT_DIR "
                                          "and --out FILE (see kiln-train --help)");
        if (o->db != NULL)
            return kiln_errf(KILN_EUSAGE, "--predict records nothing: drop --db");
        return 0;
    }
    if (o->spec_path == NULL || o->run_dir == NULL)
        return kiln_errf(KILN_EUSAGE, "--spec and --run-dir are required (see kiln-train --help)");
    if (o->db != NULL && o->run_id <= 0)
        return kiln_errf(KILN_EUSAGE, "--db needs --run-id N (the run the checkpoints belong to)");
    return 0;
}

/* resources.device (rt_device.h) decides where the embedding tables of the
 * step live: cuda puts this rank's shards in GPU hash tables (RT_STORE_CUDA;
 * lookups, inserts, evictions and the sparse optimizer run as CUDA
 * kernels), cpu keeps them in host tables. The dense part of every model
 * and the exchange run on the CPU either way (docs/gpu.md, "Training on a
 * GPU"). The ranks agree: auto falls back to the CPU everywhere if one rank
 * sees no GPU. Each rank takes GPU (local rank mod visible GPUs). Not
 * collective before the agreement, so a refusal is every rank's. */
static int pick_device(trainer_t *tr)
{
    rt_device_t dev = RT_DEVICE_CPU;
    char why[320];
    const int gpus = rt_device_visible_gpus();
    int rc = rt_device_pick(tr->spec.resources.device, rt_device_built_cuda(), gpus, &dev, why,
                            sizeof why);
    rc = agree(rc);
    if (rc < 0)
        return rc;
    int mine = dev == RT_DEVICE_CUDA, all = mine;
    if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Allreduce of the device choice failed");
    if (mine && !all) {
        dev = RT_DEVICE_CPU;
        snprintf(why, sizeof why, "device auto: another rank sees no CUDA device; every rank "
                                  "uses the CPU backend");
    }
    tr->store_kind = dev == RT_DEVICE_CUDA ? RT_STORE_CUDA : RT_STORE_HOST;
    if (dev == RT_DEVICE_CUDA) {
        int lrank = 0, lsize = 1;
        KILN_CHECK(rt_mpi_local_rank(MPI_COMM_WORLD, &lrank, &lsize));
        tr->cuda_device = lrank % gpus;
        if (tr->rank == 0)
            KILN_INFO("%s: embedding tables on the GPU (%d rank%s on this host, %d GPU%s%s); "
                      "dense layers and the exchange on the CPU",
                      why, lsize, lsize == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s",
                      lsize > gpus ? ", so ranks share GPUs" : "");
    } else if (tr->rank == 0) {
        KILN_INFO("%s", why);
    }
    if (tr->opt.store != NULL)
        tr->store_kind = RT_STORE_TWIN;
    return 0;
}

static int set_threads(trainer_t *tr)
{
    int lrank = 0, local_ranks = 1;
    if (rt_mpi_local_rank(MPI_COMM_WORLD, &lrank, &local_ranks) < 0)
        local_ranks = 1;
    int threads = tr->opt.threads > 0 ? tr->opt.threads : tr->spec.resources.threads;
    if (threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)(cores / local_ranks);
        if (threads < 1)
            threads = 1;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    return threads;
}

static void trainer_fini(trainer_t *tr)
{
    for (int t = 0; tr->tables && t < tr->T; t++) {
        kern_table_destroy(tr->tables[t]);
        if (tr->tkeys) {
            free(tr->tkeys[t]);
            free(tr->tinv[t]);
            free(tr->tuniq[t]);
            free(tr->tgrad[t]);
        }
    }
    rt_shard_destroy(tr->shard);
    rt_store_destroy(tr->store);
    for (int t = 0; tr->dedupe && t < tr->T; t++)
        rt_dedupe_destroy(tr->dedupe[t]);
    free(tr->dedupe);
    rt_model_destroy(tr->model);
    free(tr->tables);
    free(tr->slot_table);
    free(tr->combine);
    free(tr->tkeys);
    free(tr->tkeys_cap);
    free(tr->tn);
    free(tr->tinv);
    free(tr->tuniq);
    free(tr->tuniq_cap);
    free(tr->nuniq);
    free(tr->tgrad);
    free(tr->tgrad_cap);
    free(tr->dense_pairs);
    rt_dd_mpi_fini(&tr->dd_type, &tr->dd_op);
    free(tr->slot_koff);
    free(tr->boff);
    free(tr->bags);
    free(tr->E);
    free(tr->probs);
    free(tr->spec_dir);
    free(tr->ckpt_root);
    rt_ckpt_unlock(tr->lock);
    state_close(tr->db);
    if (tr->progress)
        fclose(tr->progress);
    job_spec_fini(&tr->spec);
}

static int run(trainer_t *tr)
{
    int rc = 0;
    char **files = NULL, **eval_files = NULL;
    int nfiles = 0, neval = 0;
    job_diags_t diags;
    job_diags_init(&diags);

    rc = job_spec_load(tr->opt.spec_path, &tr->spec, &diags);
    if (rc < 0) {
        /* Every rank read the same file: rank 0 tells. */
        if (tr->rank == 0)
            for (size_t i = 0; i < diags.n; i++)
                fprintf(stderr, "%s\n", diags.items[i].message);
        tr->error_told = diags.n > 0 || tr->rank != 0;
        job_diags_fini(&diags);
        return rc;
    }
    job_diags_fini(&diags);
    tr->spec_dir = spec_base_dir(tr->opt.spec_path);

    KILN_CHECK_GOTO(pick_device(tr), rc, out);
    int threads = set_threads(tr);
    if (tr->opt.predict != NULL)
        return predict_mode(tr);

    /* Training files: --inputs, else --data, else data.train. An online run
     * may start with none: it waits for partitions to land. */
    bool online = tr->spec.train.mode == JOB_MODE_ONLINE;
    if (tr->opt.inputs) {
        rc = read_list(tr->opt.inputs, &files, &nfiles);
    } else {
        char *pattern = tr->opt.data ? kiln_strdup(tr->opt.data)
                                     : spec_relative(tr, tr->spec.data.train);
        rc = pattern ? expand(pattern, tr->opt.data ? "--data" : "data.train", &files, &nfiles)
                     : KILN_ENOMEM;
        free(pattern);
    }
    if (online && rc == KILN_ENOENT) {
        kiln_errclear();
        rc = 0;
    }
    if (rc == 0) {
        const char *ev = tr->opt.eval ? tr->opt.eval : tr->spec.data.eval;
        if (ev != NULL && strcmp(ev, "none") != 0) {
            char *pattern = tr->opt.eval ? kiln_strdup(ev) : spec_relative(tr, ev);
            rc = pattern ? expand(pattern, tr->opt.eval ? "--eval" : "data.eval", &eval_files,
                                  &neval)
                         : KILN_ENOMEM;
            free(pattern);
        }
    }
    if (rc == 0 && tr->rank == 0) {
        rc = kiln_mkdir_p(tr->opt.run_dir);
        if (rc == 0) {
            char *p = run_path(tr->opt.run_dir, RUN_FILE_PROGRESS);
            tr->progress = p ? fopen(p, "a") : NULL;
            if (tr->progress == NULL)
                rc = kiln_errf(KILN_EIO, "cannot write %s: %s", p ? p : RUN_FILE_PROGRESS,
                               strerror(errno));
            free(p);
        }
    }
    if (rc == 0)
        rc = setup_tables(tr);
    if (rc == 0)
        rc = setup_model(tr);
    if (rc == 0 && (tr->ckpt_root = spec_relative(tr, tr->spec.checkpoint.dir)) == NULL)
        rc = KILN_ENOMEM;
    if (rc == 0 && tr->ckpt_root[0] != '/') {
        /* Absolute, so that SQLite and export.last name it from anywhere. */
        char cwd[4096];
        char *abs = getcwd(cwd, sizeof cwd) ? kiln_asprintf("%s/%s", cwd, tr->ckpt_root) : NULL;
        if (abs != NULL) {
            free(tr->ckpt_root);
            tr->ckpt_root = abs;
        }
    }
    if (rc == 0 && tr->rank == 0 && tr->opt.db != NULL)
        rc = state_open(tr->opt.db, &tr->db);
    rc = agree(rc);
    if (rc < 0)
        goto out;
    hash_file(tr->opt.spec_path, tr->spec_hash);
    hash_inputs(files, nfiles, tr->inputs_hash);
    rc = agree(load_start(tr));
    if (rc < 0)
        goto out;
    tr->steps0 = tr->steps;
    tr->eval_files = eval_files;
    tr->neval = neval;
    if (tr->rank == 0 && tr->db != NULL) {
        /* Lineage: the checkpoint this run starts from, and the files it
         * reads (kilnd recorded them already when it named them). */
        state_checkpoint_t c = {0};
        if (tr->last_uid[0] != '\0' && (state_checkpoint_get(tr->db, tr->last_uid, &c) < 0 ||
                                         state_run_set_start_checkpoint(tr->db, tr->opt.run_id,
                                                                        c.id) < 0))
            KILN_WARN("the checkpoint this run started from is not recorded: %s",
                      kiln_errmsg());
        state_checkpoint_fini(&c);
        if (tr->opt.inputs == NULL)
            record_inputs(tr, files, nfiles);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);

    say(tr, "kiln-train: job %s, model %s, %d tables, %d ranks x %d threads, batch %d x %d, "
            "%d training file%s\n",
        tr->spec.name, job_model_type_name(tr->spec.model.type), tr->T, tr->nranks, threads,
        tr->spec.train.batch_size, tr->nranks, nfiles, nfiles == 1 ? "" : "s");

    tr->last_export_ms = kiln_mono_ns() / 1000000;
    tr->export_step = tr->steps;
    rc = online ? train_online(tr, files, nfiles) : train(tr, files, nfiles, tr->spec.train.epochs);
    if (rc == 0)
        rc = checkpoint(tr, false);
    if (rc < 0)
        goto out;
    int64_t eval_rows = 0;
    double logloss = NAN, auc = NAN;
    if (neval > 0) {
        rc = evaluate(tr, eval_files, neval, &eval_rows, &logloss, &auc);
        if (rc < 0)
            goto out;
        /* The figures of the run's final checkpoint: the quality gate and the
         * endpoints page read them. */
        if (tr->rank == 0 && tr->db != NULL && tr->last_ckpt_id > 0 &&
            state_checkpoint_set_eval(tr->db, tr->last_ckpt_id, logloss, auc) < 0)
            KILN_WARN("the eval figures of %s are not recorded: %s", tr->last_uid,
                      kiln_errmsg());
    }
    int64_t keys = 0, mine_keys = 0, malformed = 0;
    for (int t = 0; t < tr->T; t++)
        mine_keys += rt_store_size(tr->store, t);
    MPI_Reduce(&mine_keys, &keys, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&tr->malformed, &malformed, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (tr->rank == 0) {
        double seconds = (double)tr->train_ns / 1e9;
        run_result_t res = {.rows = tr->samples,
                            .ranks = tr->nranks,
                            .threads = threads,
                            .steps = tr->steps,
                            .train_seconds = seconds,
                            .samples_per_s = seconds > 0 ? (double)tr->samples / seconds : 0.0,
                            .eval_rows = eval_rows,
                            .eval_logloss = logloss,
                            .eval_auc = auc,
                            .keys = keys,
                            .malformed = malformed};
        snprintf(res.job, sizeof res.job, "%s", tr->spec.name);
        snprintf(res.model, sizeof res.model, "%s", job_model_type_name(tr->spec.model.type));
        snprintf(res.checkpoint, sizeof res.checkpoint, "%s", tr->last_uid);
        rc = run_result_write(tr->opt.run_dir, &res, stdout);
        if (rc < 0)
            goto out;
    }
out:
    free_list(files, nfiles);
    free_list(eval_files, neval);
    return rc;
}

int main(int argc, char **argv)
{
    trainer_t tr = {0};
    tr.dd_type = MPI_DATATYPE_NULL;
    tr.dd_op = MPI_OP_NULL;
    int provided;
    const char *level = getenv("KILN_LOG");
    kiln_log_level_t lv;
    if (level != NULL && kiln_log_level_parse(level, &lv) == 0)
        kiln_log_set_level(lv);

    int prc = parse_options(argc, argv, &tr.opt);
    if (prc == 1)
        return RUN_EXIT_OK;
    if (prc < 0) {
        fprintf(stderr, "kiln-train: %s\n", kiln_errmsg());
        return RUN_EXIT_INPUT;
    }
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &tr.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &tr.nranks);
    /* Errors come back as codes so that every rank can report and exit. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

    int rc = run(&tr);
    int code = exit_for(rc);
    if (rc < 0 && !tr.error_told) {
        char host[256] = "?";
        gethostname(host, sizeof host);
        const char *msg = kiln_errmsg();
        fprintf(stderr, "kiln-train: rank %d on %s: %s\n", tr.rank, host,
                msg[0] ? msg : kiln_strerror(rc));
    }
    if (tr.abort_needed) {
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    trainer_fini(&tr);
    MPI_Finalize();
    return code;
}
