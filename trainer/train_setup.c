/*
 * trainer/train_setup.c - setting a run up from its spec: the embedding tables and the
 * store and exchange over them, the dense model; the readers of training and
 * eval files; and the small helpers the other trainer files share (say,
 * agree, grow, file lists). It calls no other trainer file.
 */
#include "train_int.h"

#include <strings.h>

/* ---- small helpers ------------------------------------------------------------ */

void train_say(const trainer_t *tr, const char *fmt, ...)
{
    if (tr->rank != 0 || tr->opt.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* Every rank learns the worst (most negative) code and returns it. A rank
 * that did not fail itself leaves the telling to the rank that did. When the
 * agreement itself fails the ranks cannot learn each other's state: KILN_EMPI,
 * and the job is aborted (main). */
int train_agree_on(trainer_t *tr, int rc)
{
    int worst = rc;
    int mrc = MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (mrc != MPI_SUCCESS) {
        tr->abort_needed = true;
        return shard_mpi_fail(mrc, "MPI_Allreduce of the ranks' status");
    }
    if (rc == 0 && worst < 0)
        tr->error_told = true;
    return worst;
}

/* A path from the spec is relative to the spec file's directory. */
char *train_spec_relative(const trainer_t *tr, const char *path)
{
    if (path[0] == '/')
        return kiln_strdup(path);
    return kiln_asprintf("%s/%s", tr->spec_dir, path);
}

/* Expands a glob into a sorted list of files. Returns 0 or KILN_ENOENT. */
int train_expand(const char *pattern, const char *what, char ***out, int *n)
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
int train_read_list(const char *path, char ***out, int *n)
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
        kiln_strv_free(files, (size_t)cnt);
        return rc;
    }
    *out = files;
    *n = cnt;
    return 0;
}

/* ---- the readers ------------------------------------------------------------------ */

int train_open_reader(trainer_t *tr, char **files, int nfiles, data_reader_t **r)
{
    static const data_format_t fmts[] = {[JOB_FMT_CRITEO_TSV] = DATA_FMT_TSV,
                                       [JOB_FMT_KILN_BIN] = DATA_FMT_BIN,
                                       [JOB_FMT_PARQUET] = DATA_FMT_PARQUET};
    static const data_dense_transform_t tfs[] = {[JOB_DENSE_AUTO] = DATA_DENSE_AUTO,
                                               [JOB_DENSE_LOG1P] = DATA_DENSE_LOG1P,
                                               [JOB_DENSE_NONE] = DATA_DENSE_NONE};
    const job_columns_t *m = &tr->spec.data.columns;
    data_columns_t cols = {.label = m->label,
                         .dense = (const char *const *)m->dense,
                         .categorical = (const char *const *)m->categorical,
                         .dense_transform = tfs[m->dense_transform]};
    return data_reader_open_cols((const char *const *)files, nfiles, fmts[tr->spec.data.format],
                               &cols, tr->rank, tr->nranks, tr->spec.train.batch_size, tr->F,
                               tr->S, tr->prefetch, r);
}

bool train_data_fault(int rc)
{
    return rc == KILN_ECORRUPT || rc == KILN_ECHECKSUM || rc == KILN_EVERSION ||
           rc == KILN_EINVAL || rc == KILN_ENOENT;
}

void train_log_malformed(trainer_t *tr, data_reader_t *r, const char *what)
{
    data_reader_stats_t st;
    data_reader_stats(r, &st);
    for (int i = 0; i < st.nmessages; i++)
        KILN_WARN("rank %d: malformed %s line skipped: %s", tr->rank, what, st.messages[i]);
    if (st.malformed > st.nmessages)
        KILN_WARN("rank %d: %" PRId64 " more malformed %s lines skipped", tr->rank,
                  st.malformed - st.nmessages, what);
    tr->malformed += st.malformed;
}

/* ---- set-up ----------------------------------------------------------------------- */

/* RAM rows of one table on this rank under model.embedding.memory: a
 * share of its rows, or bytes over what a row costs in RAM
 * (kern_table_tier_ram_row_bytes; docs/models.md). 0: every row in RAM. */
static int64_t ram_rows_of(const job_embedding_t *e, int dim, kern_opt_kind_t opt, int64_t share)
{
    int64_t rows = 0;
    if (e->memory_share > 0)
        rows = (int64_t)ceil(e->memory_share * (double)share);
    else if (e->memory_bytes > 0)
        rows = e->memory_bytes / kern_table_tier_ram_row_bytes(dim, opt);
    else
        return 0;
    return rows < share ? (rows > 1 ? rows : 1) : 0;
}

/* Where table t's disk tier goes on this rank: model.embedding.spill_dir
 * (relative to the spec), or the run's directory, or $TMPDIR; made here. */
static int spill_path(trainer_t *tr, const char *table, char *out, size_t cap)
{
    const char *sd = tr->spec.model.embedding.spill_dir;
    char *dir = NULL;
    if (sd)
        dir = train_spec_relative(tr, sd);
    else if (tr->opt.run_dir)
        dir = kiln_asprintf("%s/spill", tr->opt.run_dir);
    else
        dir = kiln_asprintf("%s/kiln-spill", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!dir)
        return KILN_ENOMEM;
    int rc = kiln_mkdir_p(dir);
    if (rc == 0 && snprintf(out, cap, "%s/%s.r%d.%ld.tier", dir, table, tr->rank,
                            (long)getpid()) >= (int)cap)
        rc = kiln_errf(KILN_EINVAL, "model.embedding.spill_dir %s is too long", dir);
    free(dir);
    return rc;
}

int train_setup_tables(trainer_t *tr)
{
    const job_spec_t *sp = &tr->spec;
    tr->S = sp->data.cat_slots;
    tr->F = sp->data.dense_features;
    tr->T = sp->model.ntables;
    model_type_t mt = sp->model.type;
    tr->d = model_table_dim(mt, sp->model.embedding.dim);
    if (tr->d < 1)
        return kiln_errf(KILN_EINVAL, "model.embedding.dim %d does not suit model %s",
                         sp->model.embedding.dim, job_model_type_name(sp->model.type));
    tr->slot_table = kiln_calloc((size_t)tr->S, sizeof(int));
    tr->combine = kiln_calloc((size_t)tr->S, sizeof *tr->combine);
    tr->tables = kiln_calloc((size_t)tr->T, sizeof *tr->tables);
    kern_table_config_t *cfgs = kiln_calloc((size_t)tr->T, sizeof *cfgs);
    int *dims = kiln_calloc((size_t)tr->T, sizeof *dims);
    char (*notes)[128] = kiln_calloc((size_t)tr->T, sizeof *notes);
    char (*spills)[1024] = kiln_calloc((size_t)tr->T, sizeof *spills);
    int rc = 0;
    if (!tr->slot_table || !tr->combine || !tr->tables || !cfgs || !dims || !notes || !spills) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int s = 0; s < tr->S; s++)
        tr->slot_table[s] = -1;
    const job_optimizer_t *so = &sp->train.sparse;
    for (int t = 0; t < tr->T; t++) {
        const job_table_t *jt = &sp->model.tables[t];
        int d = model_table_dim(mt, jt->emb.dim);
        if (d != tr->d) {
            rc = kiln_errf(KILN_EINVAL, "table %s has dim %d but the model needs %d for every "
                                        "table",
                           jt->name, jt->emb.dim, tr->d);
            goto out;
        }
        /* Capacity is for the whole job: each rank keeps at most its share,
         * and allocates room beyond it only for loading a checkpoint whose
         * keys hash unevenly over this rank count (shard/shard.h). */
        if (jt->emb.capacity < tr->nranks) {
            rc = kiln_errf(KILN_EINVAL, "table %s: capacity %" PRId64 " is less than the %d "
                           "ranks, and each rank needs a row; raise it to at least %d",
                           jt->name, jt->emb.capacity, tr->nranks, tr->nranks);
            goto out;
        }
        int64_t share = shard_capacity_share(jt->emb.capacity, tr->rank, tr->nranks);
        int64_t per_rank = share + shard_capacity_room(share, tr->nranks);
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
            .opt = so->type,
            .opt_init = (float)so->initial_accumulator,
            .init = jt->emb.init,
            .init_scale = (float)jt->emb.init_scale,
            .seed = sp->train.seed ^ kiln_xxh64(jt->name, strlen(jt->name), 0x6b696c6e),
            .evict = jt->emb.eviction,
            .evict_fraction = 0.0f,
            .ram_rows = ram_rows_of(&jt->emb, d, so->type, share),
            .admit_min = jt->emb.admit.min_count,
            .admit_width = jt->emb.admit.sketch_width,
            .admit_decay = jt->emb.admit.decay_steps,
        };
        if ((cfgs[t].ram_rows > 0 || cfgs[t].admit_min > 1) &&
            (tr->store_kind != SHARD_STORE_HOST || tr->opt.device_step)) {
            rc = kiln_errf(KILN_EINVAL, "table %s: model.embedding.memory and admit run on the "
                           "CPU backend's host tables; this run uses the %s store (set "
                           "resources.device: cpu, or remove them)",
                           jt->name, tr->opt.device_step ? "device step's" :
                           shard_store_kind_name(tr->store_kind));
            goto out;
        }
        if (cfgs[t].ram_rows > 0) {
            KILN_CHECK_GOTO(spill_path(tr, jt->name, spills[t], sizeof spills[t]), rc, out);
            cfgs[t].spill_path = spills[t];
            cfgs[t].spill_io = tr->spec.model.embedding.spill_io;
        }
        dims[t] = d;
        /* The mirror of a GPU table must take every row the GPU holds: its
         * slots come in whole buckets, and a segmented host table can fill
         * a segment a little before the whole (docs/kernels.md). */
        kern_table_config_t mcfg = cfgs[t];
        if (tr->store_kind == SHARD_STORE_CUDA)
            mcfg.capacity = per_rank + per_rank / 50 + 1024; /* as job_rows_per_rank */
        KILN_CHECK_GOTO(kern_table_create(&mcfg, &tr->tables[t]), rc, out);
        for (int i = 0; i < jt->nslots; i++) {
            int s = jt->slots[i];
            if (s >= 0 && s < tr->S) {
                tr->slot_table[s] = t;
                tr->combine[s] = jt->emb.combiner;
            }
        }
    }
    for (int s = 0; s < tr->S; s++) {
        if (tr->slot_table[s] < 0) {
            rc = kiln_errf(KILN_EINVAL, "slot %d has no embedding table", s);
            goto out;
        }
    }
    tr->sparse_opt = (kern_opt_t){.kind = so->type,
                                  .lr = (float)so->lr,
                                  .eps = (float)so->eps,
                                  .beta1 = (float)so->beta1,
                                  .beta2 = (float)so->beta2};
    KILN_CHECK_GOTO(shard_store_create(tr->store_kind, tr->T, tr->tables, cfgs, tr->cuda_device,
                                    &tr->store),
                    rc, out);
    KILN_CHECK_GOTO(shard_create(tr->comm, tr->T, tr->store, dims, &tr->shard), rc, out);
    if ((tr->dedupe = kiln_calloc((size_t)tr->T, sizeof *tr->dedupe)) == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int t = 0; t < tr->T; t++)
        KILN_CHECK_GOTO(shard_dedupe_create(&tr->dedupe[t]), rc, out);
out:
    free(cfgs);
    free(dims);
    free(notes);
    free(spills);
    return rc;
}

/* Says which dense kernels run (a warning when they leave the CPU's vector
 * units unused), and checks every GEMM of the model against a float64
 * reference before the first step: some OpenBLAS kernel sets compute wrong
 * products on some CPUs, and a model trained on them is garbage. */
static int check_kernels(trainer_t *tr)
{
    model_kernels_t k;
    model_kernels_describe(&k);
    char line[768];
    model_kernels_sentence(&k, line, sizeof line);
    if (tr->rank == 0 && (k.generic || k.fallback[0] != '\0'))
        KILN_WARN("%s", line);
    else if (tr->rank == 0)
        KILN_INFO("%s", line);
    if (tr->rank == 0 && model_info(tr->model).precision == MODEL_DENSE_BF16) {
        char bf[96];
        model_bf16_describe(tr->model, bf, sizeof bf);
        KILN_INFO("dense precision: bf16 (dlrm's MLP GEMMs on %s; weights, gradients and "
                  "optimizer state in float32)",
                  bf);
    } else if (tr->rank == 0) {
        KILN_INFO("dense precision: fp32");
    }
    if (model_selfcheck(tr->model) == 0)
        return 0;
    /* Another kernel set to try: the library's own pick where Kiln changed
     * it, else the generic one (or, where that is what failed, AVX2's). */
    const char *other = k.own[0] != '\0' && strcasecmp(k.own, k.core) != 0 ? k.own
                        : strcasecmp(k.core, "Prescott") != 0                ? "Prescott"
                                                                             : "Haswell";
    return kiln_errf(KILN_ECORRUPT,
                     "%s computes wrong results on this CPU: %s; refusing to train with them. "
                     "Set OPENBLAS_CORETYPE=%s (or another core type) in the environment of kilnd "
                     "or mpirun (the ranks inherit OPENBLAS_*)",
                     k.name, kiln_errmsg(), other);
}

int train_setup_model(trainer_t *tr)
{
    const job_spec_t *sp = &tr->spec;
    const job_optimizer_t *o = &sp->train.dense;
    model_config_t cfg = {
        .type = sp->model.type,
        .nslots = tr->S,
        .ndense = tr->F,
        .dim = tr->d,
        .bottom = sp->model.bottom_mlp,
        .nbottom = sp->model.nbottom,
        .top = sp->model.top_mlp,
        .ntop = sp->model.ntop,
        .fm_dense_factors = sp->model.fm_dense_factors,
        .precision = sp->model.dense_precision,
        .max_batch = sp->train.batch_size,
        .seed = sp->train.seed,
        .opt = {.type = o->type,
                .lr = (float)o->lr,
                .eps = (float)o->eps,
                .beta1 = (float)o->beta1,
                .beta2 = (float)o->beta2,
                .weight_decay = (float)o->weight_decay,
                .initial_accumulator = (float)o->initial_accumulator},
    };
    KILN_CHECK(model_create(&cfg, &tr->model));
    KILN_CHECK(check_kernels(tr));
    if (tr->nranks > 1) {
        tr->dense_pairs = kiln_calloc(2 * model_nparams(tr->model) + 2, sizeof(double));
        if (tr->dense_pairs == NULL)
            return KILN_ENOMEM;
    }
    tr->max_batch = sp->train.batch_size;
    size_t S = (size_t)tr->S, T = (size_t)tr->T, B = (size_t)tr->max_batch;
    tr->tkeys = kiln_calloc(T, sizeof *tr->tkeys);
    tr->tkeys_cap = kiln_calloc(T, sizeof(int64_t));
    tr->tn = kiln_calloc(T, sizeof(int64_t));
    tr->tinv = kiln_calloc(T, sizeof *tr->tinv);
    tr->nuniq = kiln_calloc(T, sizeof(int64_t));
    tr->tgrad = kiln_calloc(T, sizeof *tr->tgrad);
    tr->tgrad_cap = kiln_calloc(T, sizeof(int64_t));
    tr->slot_koff = kiln_calloc(S, sizeof(int64_t));
    tr->boff = kiln_calloc(S * (B + 1), sizeof(int64_t));
    tr->bags = kiln_calloc(S, sizeof *tr->bags);
    tr->E = kiln_calloc(B * S * (size_t)tr->d, sizeof(float));
    tr->probs = kiln_calloc(B, sizeof(float));
    if (!tr->tkeys || !tr->tkeys_cap || !tr->tn || !tr->tinv || !tr->nuniq || !tr->tgrad || !tr->tgrad_cap || !tr->slot_koff || !tr->boff || !tr->bags ||
        !tr->E || !tr->probs)
        return KILN_ENOMEM;
    return 0;
}

/* The tables, the model and the checkpoint root: what training and --predict
 * both start from. */
int train_setup_run(trainer_t *tr)
{
    int rc = train_setup_tables(tr);
    if (rc == 0)
        rc = train_setup_model(tr);
    if (rc == 0 && (tr->ckpt_root = train_spec_relative(tr, tr->spec.checkpoint.dir)) == NULL)
        rc = KILN_ENOMEM;
    return rc;
}
