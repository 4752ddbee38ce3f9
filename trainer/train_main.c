/*
 * trainer/train_main.c - kiln-train's main(): the command line (a table of options), the
 * backend and thread count, the order of a run (set up, load, train or
 * predict, evaluate, the last checkpoint, the result line) and the exit code.
 */
#include "train_dev.h"
#include "train_int.h"

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

/* SIGUSR1: write an incremental dump at the next step boundary (train_ckpt.c
 * reads the flag). */
static void on_sigusr1(int sig)
{
    (void)sig;
    train_export_signal = 1;
}

/* ---- main ------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(
        f,
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
        "                     mirror in host memory, as a GPU run keeps them on the GPU\n"
        "  --device-step standin  (tests) run the step through the device step on the\n"
        "                     host stand-in, which checks the order of its copies\n"
        "  --device-exchange host  (tests) the device step exchanges over host buffers\n"
        "                     (MPI) instead of on the device\n"
        "  --version          print kiln-train's version and exit\n\n"
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
    {"--device-step", OPT_STR, offsetof(options_t, device_step)},
    {"--device-exchange", OPT_STR, offsetof(options_t, device_exchange)},
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
    if (o->device_step != NULL && strcmp(o->device_step, "standin") != 0)
        return kiln_errf(KILN_EUSAGE, "--device-step: the only value is standin, got '%s'",
                         o->device_step);
    if (o->device_exchange != NULL && strcmp(o->device_exchange, "host") != 0)
        return kiln_errf(KILN_EUSAGE, "--device-exchange: the only value is host, got '%s'",
                         o->device_exchange);
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

/* resources.device (shard/shard.h, shard_device_*) decides where the embedding tables of the
 * step live: cuda puts this rank's shards in GPU hash tables (SHARD_STORE_CUDA;
 * lookups, inserts, evictions and the sparse optimizer run as CUDA
 * kernels), cpu keeps them in host tables. The exchange runs on the CPU
 * either way; with cuda the step also runs on the device
 * (setup_device_step; docs/gpu.md). The ranks agree: auto falls back to the CPU everywhere if one
 * rank sees no GPU. Each rank takes GPU (local rank mod visible GPUs). Not collective before the
 * agreement, so a refusal is every rank's. */
static int pick_device(trainer_t *tr)
{
    shard_device_t dev = SHARD_DEVICE_CPU;
    char why[320];
    const int gpus = shard_device_visible_gpus();
    int rc = shard_device_pick(tr->spec.resources.device, shard_device_built_cuda(), gpus, &dev, why,
                            sizeof why);
    rc = agree(rc);
    if (rc < 0)
        return rc;
    int mine = dev == SHARD_DEVICE_CUDA, all = mine;
    if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Allreduce of the device choice failed");
    if (mine && !all) {
        dev = SHARD_DEVICE_CPU;
        snprintf(why, sizeof why, "device auto: another rank sees no CUDA device; every rank "
                                  "uses the CPU backend");
    }
    tr->store_kind = dev == SHARD_DEVICE_CUDA ? SHARD_STORE_CUDA : SHARD_STORE_HOST;
    if (dev == SHARD_DEVICE_CUDA) {
        int lrank = 0, lsize = 1;
        KILN_CHECK(shard_mpi_local_rank(MPI_COMM_WORLD, &lrank, &lsize));
        tr->cuda_device = lrank % gpus;
        if (tr->rank == 0)
            KILN_INFO("%s: embedding tables on the GPU (%d rank%s on this host, %d GPU%s%s); "
                      "the exchange on the CPU",
                      why, lsize, lsize == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s",
                      lsize > gpus ? ", so ranks share GPUs" : "");
    } else if (tr->rank == 0) {
        KILN_INFO("%s", why);
    }
    if (tr->opt.store != NULL)
        tr->store_kind = SHARD_STORE_TWIN;
    return 0;
}

static int set_threads(trainer_t *tr)
{
    int lrank = 0, local_ranks = 1;
    if (shard_mpi_local_rank(MPI_COMM_WORLD, &lrank, &local_ranks) < 0)
        local_ranks = 1;
    int threads = tr->opt.threads > 0 ? tr->opt.threads : tr->spec.resources.threads;
    if (threads <= 0) {
        threads = (int)(sysconf(_SC_NPROCESSORS_ONLN) / local_ranks);
        if (threads < 1)
            threads = 1;
    }
    /* OpenBLAS itself stays on one thread: the models split their GEMMs over
     * these OpenMP threads (model_create). */
    omp_set_num_threads(threads);
    /* data.reader: auto. A reader thread that parses TSV or decodes Parquet
     * beside a CPU step whose threads take every core only takes turns with
     * them, and their OpenMP workers spin (briefly by Kiln's default,
     * model_kernels_ensure) on the core it needs: then batches are parsed
     * and decoded on the step's own threads, between steps. Where the
     * workers sleep at once (OMP_WAIT_POLICY=passive) the reader gets the
     * cores they leave, and a thread reading ahead wins (session 12, 2
     * cores, lr under chrt: TSV 1.04 M samples/s on a thread against 0.88 M
     * on the team, Parquet 1.07 M against 0.92 M). kiln-bin's reading (a
     * copy and a checksum per chunk) stays on its thread. A device step
     * leaves the cores to the reader. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    bool team = tr->spec.data.reader == JOB_READER_TEAM ||
                (tr->spec.data.reader == JOB_READER_AUTO && tr->dev == NULL &&
                 model_threads_spin() && tr->spec.data.format != JOB_FMT_KILN_BIN &&
                 (long)threads * local_ranks >= cores);
    tr->prefetch = team ? 0 : 4;
    if (tr->rank == 0)
        KILN_INFO("reader: %s", tr->prefetch == 0 ? "batches made on the step's threads"
                                                  : "a thread reads 4 batches ahead");
    return threads;
}

static void trainer_fini(trainer_t *tr)
{
    for (int t = 0; tr->tables && t < tr->T; t++) {
        kern_table_destroy(tr->tables[t]);
        if (tr->tkeys)
            KILN_FREE_ALL(tr->tkeys[t], tr->tinv[t], tr->tgrad[t]);
    }
    train_dev_destroy(tr->dev);
    shard_comm_destroy(tr->dcomm);
    shard_destroy(tr->shard);
    shard_comm_destroy(tr->comm);
    shard_store_destroy(tr->store);
    for (int t = 0; tr->dedupe && t < tr->T; t++)
        shard_dedupe_destroy(tr->dedupe[t]);
    free(tr->dedupe);
    model_destroy(tr->model);
    KILN_FREE_ALL(tr->tables, tr->slot_table, tr->combine, tr->tkeys, tr->tkeys_cap, tr->tn,
                  tr->tinv, tr->nuniq, tr->tgrad, tr->tgrad_cap,
                  tr->dense_pairs, tr->slot_koff, tr->boff, tr->bags, tr->E, tr->probs,
                  tr->spec_dir, tr->ckpt_root, tr->marks);
    ckpt_unlock(tr->lock);
    json_decref(tr->done);
    state_close(tr->db);
    if (tr->progress)
        fclose(tr->progress);
    job_spec_fini(&tr->spec);
}

/* The device step (train_dev.c) when the tables are on the GPU, or on the
 * host stand-in with --device-step standin; its exchange on the device
 * unless --device-exchange host: over NCCL on GPUs (on the host, with a
 * warning, where NCCL cannot be set up), over MPI on the stand-in's host
 * memory, and none with one rank. */
static int setup_device_step(trainer_t *tr)
{
    const bool host_x = tr->opt.device_exchange != NULL;
    if (tr->opt.device_step != NULL) {
        KILN_CHECK(train_dev_create(tr, &train_dev_host_ops, 0));
        if (!host_x)
            train_dev_exchange_on(tr, tr->nranks > 1 ? tr->comm : NULL);
        return 0;
    }
#ifdef KILN_HAVE_CUDA
    if (tr->store_kind == SHARD_STORE_CUDA) {
        if (model_info(tr->model).precision == MODEL_DENSE_BF16)
            return kiln_errf(KILN_EINVAL,
                             "model.dense_precision: bf16 runs the CPU's dense layers, and this "
                             "run trains the model on the GPU (resources.device: %s found one): "
                             "set resources.device: cpu, or model.dense_precision: fp32",
                             job_device_name(tr->spec.resources.device));
        KILN_CHECK(train_dev_create(tr, &train_dev_cuda_ops, tr->cuda_device));
        const char *where = "the exchange over host buffers (MPI)";
        if (!host_x && tr->nranks == 1) {
            train_dev_exchange_on(tr, NULL);
            where = "the lookup and update on the GPU (one rank)";
        } else if (!host_x && shard_comm_create(SHARD_COMM_NCCL, MPI_COMM_WORLD, &tr->dcomm) == 0) {
            train_dev_exchange_on(tr, tr->dcomm);
            where = "the exchange between the GPUs over NCCL";
        } else if (!host_x) { /* every rank failed alike (shard_comm_create agrees) */
            if (tr->rank == 0)
                KILN_WARN("the device step exchanges over host buffers: %s", kiln_errmsg());
            kiln_errclear();
        }
        if (tr->rank == 0)
            KILN_INFO("the device step: pooling, the %s model and the backward reduce on the "
                      "GPU; %s",
                      model_type_name(model_info(tr->model).type), where);
    }
#endif
    return 0;
}

/* The run's files: training from --inputs, else --data, else data.train (an
 * online run may start with none: it waits for partitions to land); eval
 * from --eval, else data.eval ("none": no eval). */
static int list_files(trainer_t *tr, bool online, char ***files, int *nfiles, char ***eval,
                      int *neval)
{
    int rc;
    if (tr->opt.inputs) {
        rc = train_read_list(tr->opt.inputs, files, nfiles);
    } else {
        char *pattern =
            tr->opt.data ? kiln_strdup(tr->opt.data) : train_spec_relative(tr, tr->spec.data.train);
        rc = pattern ? train_expand(pattern, tr->opt.data ? "--data" : "data.train", files, nfiles)
                     : KILN_ENOMEM;
        free(pattern);
    }
    if (online && rc == KILN_ENOENT) {
        kiln_errclear();
        rc = 0;
    }
    const char *ev = tr->opt.eval ? tr->opt.eval : tr->spec.data.eval;
    if (rc == 0 && ev != NULL && strcmp(ev, "none") != 0) {
        char *pattern = tr->opt.eval ? kiln_strdup(ev) : train_spec_relative(tr, ev);
        rc = pattern ? train_expand(pattern, tr->opt.eval ? "--eval" : "data.eval", eval, neval)
                     : KILN_ENOMEM;
        free(pattern);
    }
    return rc;
}

/* Lineage (rank 0 with --db): the checkpoint this run starts from, and the
 * files it reads (kilnd recorded them already when it named them). */
static void record_start(trainer_t *tr, char **files, int nfiles)
{
    state_checkpoint_t c = {0};
    if (tr->last_uid[0] != '\0' &&
        (state_checkpoint_get(tr->db, tr->last_uid, &c) < 0 ||
         state_run_set_start_checkpoint(tr->db, tr->opt.run_id, c.id) < 0))
        KILN_WARN("the checkpoint this run started from is not recorded: %s", kiln_errmsg());
    state_checkpoint_fini(&c);
    if (tr->opt.inputs == NULL)
        train_record_inputs(tr, files, nfiles);
}

/* The run's figures, summed over the ranks, into result.json (rank 0) and on
 * stdout. Collective. */
static int write_result(trainer_t *tr, int threads, int64_t eval_rows, double logloss,
                        double auc)
{
    int64_t keys = 0, mine_keys = 0, malformed = 0;
    for (int t = 0; t < tr->T; t++)
        mine_keys += shard_store_size(tr->store, t);
    int mrc = MPI_Reduce(&mine_keys, &keys, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (mrc == MPI_SUCCESS)
        mrc = MPI_Reduce(&tr->malformed, &malformed, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (mrc != MPI_SUCCESS)
        return shard_mpi_fail(mrc, "MPI_Reduce of the run's key and malformed-line counts");
    run_tables_t tabs = {0};
    KILN_CHECK(train_tables_report(tr, &tabs));
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
                            .malformed = malformed,
                            .tables = tabs};
        snprintf(res.job, sizeof res.job, "%s", tr->spec.name);
        snprintf(res.model, sizeof res.model, "%s", job_model_type_name(tr->spec.model.type));
        snprintf(res.checkpoint, sizeof res.checkpoint, "%s", tr->last_uid);
        model_kernels_t k;
        model_kernels_describe(&k);
        snprintf(res.dense_kernels, sizeof res.dense_kernels, "%s", k.name);
        snprintf(res.dense_precision, sizeof res.dense_precision, "%s",
                 model_precision_name(model_info(tr->model).precision));
        snprintf(res.reader, sizeof res.reader, "%s", tr->prefetch == 0 ? "team" : "thread");
        model_threads_wait(res.openmp_wait, sizeof res.openmp_wait);
        return run_result_write(tr->opt.run_dir, &res, stdout);
    }
    return 0;
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
    tr->spec_dir = train_spec_base_dir(tr->opt.spec_path);
    /* A spec this CPU cannot run is refused before anything is read (the
     * CPU is the ranks': kiln submit can only check its own). */
    if (tr->spec.model.dense_precision == MODEL_DENSE_BF16 && (rc = model_bf16_check_here()) < 0)
        return rc;

    /* Every rank reaches this point (the spec is the same file for all). */
    KILN_CHECK_GOTO(shard_comm_create(SHARD_COMM_MPI, MPI_COMM_WORLD, &tr->comm), rc, out);
    KILN_CHECK_GOTO(pick_device(tr), rc, out);
    int threads = set_threads(tr);
    if (tr->opt.predict != NULL)
        return train_predict_mode(tr);

    bool online = tr->spec.train.mode == JOB_MODE_ONLINE;
    rc = list_files(tr, online, &files, &nfiles, &eval_files, &neval);
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
        rc = train_setup_run(tr);
    if (rc == 0)
        rc = setup_device_step(tr);
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
    train_hash_file(tr->opt.spec_path, tr->spec_hash);
    train_hash_inputs(files, nfiles, tr->inputs_hash);
    rc = agree(train_load_start(tr));
    if (rc < 0)
        goto out;
    tr->steps0 = tr->steps;
    tr->eval_files = eval_files;
    tr->neval = neval;
    if (tr->rank == 0 && tr->db != NULL)
        record_start(tr, files, nfiles);
    train_say(tr, "kiln-train: job %s, model %s, %d tables, %d ranks x %d threads, batch %d x %d, "
            "%d training file%s\n",
        tr->spec.name, job_model_type_name(tr->spec.model.type), tr->T, tr->nranks, threads,
        tr->spec.train.batch_size, tr->nranks, nfiles, nfiles == 1 ? "" : "s");

    tr->last_export_ms = kiln_mono_ns() / 1000000;
    tr->export_step = tr->steps;
    if (online) {
        rc = train_online(tr, files, nfiles);
    } else {
        /* An incremental run trains no file its start checkpoint covers
         * (one a failed run learnt from whole), and its final checkpoint
         * covers all it read. */
        int ntrain = nfiles;
        if (tr->spec.data.incremental)
            rc = train_keep_files(tr, files, nfiles, false, &ntrain);
        if (rc == 0 && (ntrain > 0 || nfiles == 0))
            rc = train_loop(tr, files, ntrain, tr->spec.train.epochs);
        for (int i = 0; rc == 0 && tr->spec.data.incremental && i < nfiles; i++)
            rc = train_inputs_done(tr, files[i]);
    }
    /* The eval comes before the final checkpoint: a run that fails there
     * leaves no checkpoint that a later run would take as a finished base. */
    int64_t eval_rows = 0;
    double logloss = NAN, auc = NAN;
    if (rc == 0 && neval > 0)
        rc = train_evaluate(tr, eval_files, neval, &eval_rows, &logloss, &auc);
    if (rc == 0)
        rc = train_checkpoint(tr, false);
    if (rc < 0)
        goto out;
    /* The figures of the run's final checkpoint: the quality gate and the
     * endpoints page read them. */
    if (neval > 0 && tr->rank == 0 && tr->db != NULL && tr->last_ckpt_id > 0 &&
        state_checkpoint_set_eval(tr->db, tr->last_ckpt_id, logloss, auc) < 0)
        KILN_WARN("the eval figures of %s are not recorded: %s", tr->last_uid, kiln_errmsg());
    rc = write_result(tr, threads, eval_rows, logloss, auc);
out:
    /* tr borrowed the eval list; nothing may reach it once it is freed. */
    tr->eval_files = NULL;
    tr->neval = 0;
    kiln_strv_free(files, (size_t)nfiles);
    kiln_strv_free(eval_files, (size_t)neval);
    return rc;
}

int main(int argc, char **argv)
{
    trainer_t tr = {0};
    int provided;
    const char *level = getenv("KILN_LOG");
    kiln_log_level_t lv;
    if (level != NULL && kiln_log_level_parse(level, &lv) == 0)
        kiln_log_set_level(lv);

    /* Before anything touches BLAS (and before MPI_Init: it may execute
     * kiln-train again with the CPU's own kernels; model_kernels.c). */
    if (model_kernels_ensure(argv) < 0)
        fprintf(stderr, "kiln-train: %s\n", kiln_errmsg());
    /* SIGUSR1's default action ends the process: a rank asked for an export
     * while it was still loading (a slow start on a loaded host, kilnd or a
     * user signalling early) died with the job. The handler is in place from
     * here (after the re-execution above, which would reset it), and a
     * signal that came early is served at the first step boundary. */
    struct sigaction sa = {0};
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    if (kiln_version_flag(argc, argv, "kiln-train"))
        return RUN_EXIT_OK;
    int prc = parse_options(argc, argv, &tr.opt);
    if (prc == 1)
        return RUN_EXIT_OK;
    if (prc < 0) {
        fprintf(stderr, "kiln-train: %s\n", kiln_errmsg());
        return RUN_EXIT_INPUT;
    }
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "kiln-train: MPI_Init_thread failed (start it with mpirun, or check "
                        "the Open MPI installation)\n");
        return RUN_EXIT_RETRY;
    }
    /* Errors come back as codes so that every rank can report and exit (the
     * default handler aborts the job on a failure, so these cannot fail
     * quietly). */
    if (MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
        MPI_Comm_rank(MPI_COMM_WORLD, &tr.rank) != MPI_SUCCESS ||
        MPI_Comm_size(MPI_COMM_WORLD, &tr.nranks) != MPI_SUCCESS) {
        fprintf(stderr, "kiln-train: cannot query MPI_COMM_WORLD\n");
        MPI_Abort(MPI_COMM_WORLD, RUN_EXIT_RETRY);
        return RUN_EXIT_RETRY;
    }

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
    if (MPI_Finalize() != MPI_SUCCESS)
        fprintf(stderr, "kiln-train: rank %d: MPI_Finalize failed\n", tr.rank);
    return code;
}
