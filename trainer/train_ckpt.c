/*
 * trainer/train_ckpt.c - the checkpoint policy: when to dump (every_steps, on request,
 * every export.every_ms, at the end), full or incremental, recording dumps in
 * the database, retention (checkpoint.keep), and where a run starts from
 * (--resume or train.init_from).
 */
#include "train_int.h"


/* Set by kiln-train's SIGUSR1 handler (train_main.c): write an incremental
 * dump at the next step boundary. */
volatile sig_atomic_t train_export_signal;

/* ---- checkpoints ---------------------------------------------------------------------- */

/* xxh64 hex of a file's bytes (the spec) or "" when unreadable. */
void train_hash_file(const char *path, char out[17])
{
    uint64_t h = 0;
    out[0] = '\0';
    if (kiln_xxh64_file(path, 0, &h, NULL) == 0)
        kiln_hash_hex(h, out, 17);
}

/* xxh64 hex of the training file list: a resumed run continues its data
 * position only on the same inputs. */
void train_hash_inputs(char **files, int nfiles, char out[17])
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
    kiln_strv_free(h->uids, h->n);
}

/* Rank 0: records a checkpoint in the DB: an online export with its export
 * row and, when measured, the eval figures the quality gate compares (kilnd
 * queues an export's pushes as soon as the row appears, so the figures go
 * in with it). An online run's inputs count as consumed once a checkpoint
 * holds them. A failure is a warning: the checkpoint is on disk whatever the
 * DB says. */
static void record_checkpoint(trainer_t *tr, const ckpt_info_t *in, const char *path,
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
        .kind = (char *)ckpt_kind_name(in->kind),
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
static void note_export(trainer_t *tr, const ckpt_info_t *in, const char *path)
{
    run_export_t e = {.step = in->step, .keys = in->keys, .bytes = in->bytes,
                      .time = kiln_now_s()};
    snprintf(e.checkpoint, sizeof e.checkpoint, "%s", in->uid);
    snprintf(e.kind, sizeof e.kind, "%s", ckpt_kind_name(in->kind));
    snprintf(e.parent, sizeof e.parent, "%s", in->parent);
    snprintf(e.path, sizeof e.path, "%s", path);
    if (run_export_last_write(tr->opt.run_dir, &e) < 0)
        KILN_WARN("%s", kiln_errmsg());
}

/* Whether each online export is evaluated first: it goes to endpoints and
 * there is data to measure it on, so the quality gate (push.max_regression)
 * judges it as it judges a batch run's checkpoint, and the endpoints page
 * shows its figures. */
static bool eval_exports(const trainer_t *tr)
{
    return tr->neval > 0 && tr->spec.push.nendpoints > 0;
}

/* Writes a checkpoint of the current state on every rank (collective).
 * online: an export requested while training (incremental when there is a
 * parent). A checkpoint at the step of the last one is skipped. */
int train_checkpoint(trainer_t *tr, bool online)
{
    const job_spec_t *sp = &tr->spec;
    if (tr->last_uid[0] != '\0' && tr->last_step == tr->steps)
        return 0;
    ckpt_info_t *in = kiln_calloc(1, sizeof *in);
    if (in == NULL)
        return KILN_ENOMEM;
    bool full = tr->last_uid[0] == '\0' || tr->chain_elsewhere ||
                (!online && tr->chain + 1 >= (sp->checkpoint.full_every > 0
                                                  ? sp->checkpoint.full_every
                                                  : 1));
    in->kind = full ? CKPT_FULL : CKPT_INCREMENTAL;
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
    snprintf(in->optimizer, sizeof in->optimizer, "%s", job_optimizer_type_name(tr->sparse_opt.kind));
    snprintf(in->spec_hash, sizeof in->spec_hash, "%s", tr->spec_hash);
    snprintf(in->inputs_hash, sizeof in->inputs_hash, "%s", tr->inputs_hash);
    char *inputs = tr->done != NULL ? json_dumps(tr->done, JSON_COMPACT) : NULL;
    in->inputs = inputs;
    model_array_t ma[MODEL_MAX_STATE];
    ckpt_array_t ca[MODEL_MAX_STATE];
    int na = 0;
    model_state(tr->model, ma, &na, &in->dense_step);
    if (!in->include_optimizer)
        na = 1; /* "dense.params" only */
    for (int i = 0; i < na; i++)
        ca[i] = (ckpt_array_t){.name = ma[i].name, .data = ma[i].data, .count = ma[i].count};
    int64_t t0 = kiln_mono_ns();
    /* With a GPU store the checkpoint reads the host mirror: bring it up to
     * date first (every rank, or none dumps). */
    int rc = agree(shard_store_sync(tr->store, tr->steps));
    if (rc == 0) /* expired rows leave before the dump, which carries their removal */
        rc = agree(train_tables_expire(tr));
    if (rc == 0)
        rc = ckpt_dump(MPI_COMM_WORLD, tr->ckpt_root, tr->T, tr->tables, ca, na, in);
    in->inputs = NULL;
    free(inputs);
    if (rc < 0) {
        if (kiln_errmsg()[0] && strstr(kiln_errmsg(), "failed to write its part") != NULL)
            tr->error_told = true;
        free(in);
        return rc;
    }
    snprintf(tr->last_uid, sizeof tr->last_uid, "%s", in->uid);
    snprintf(tr->base_uid, sizeof tr->base_uid, "%s", full ? in->uid : in->base);
    train_tables_mark_time(tr, in->step, kiln_now_s());
    tr->last_step = in->step;
    tr->chain = in->chain;
    tr->chain_elsewhere = false;
    double secs = (double)(kiln_mono_ns() - t0) / 1e9;
    /* An online export that the quality gate will judge is measured before
     * kilnd can see it (collective). */
    double logloss = NAN, auc = NAN;
    if (online && eval_exports(tr)) {
        int64_t rows = 0;
        rc = train_evaluate(tr, tr->eval_files, tr->neval, &rows, &logloss, &auc);
        if (rc < 0) {
            free(in);
            return rc;
        }
    }
    if (tr->rank == 0) {
        char *path = kiln_asprintf("%s/%s", tr->ckpt_root, in->uid);
        train_say(tr, "checkpoint %s: %s, step %" PRId64 ", %" PRId64 " rows, %" PRId64
                " evicted, %" PRId64 " bytes, %.3f s%s\n",
            in->uid, ckpt_kind_name(in->kind), in->step, in->keys, in->evicted, in->bytes,
            secs, online ? " (online export)" : "");
        if (tr->progress) {
            run_progress_t rec = {.kind = RUN_REC_CHECKPOINT, .step = in->step,
                                  .time = kiln_now_s(), .keys = in->keys, .bytes = in->bytes,
                                  .ckpt_seconds = secs, .online = online};
            snprintf(rec.checkpoint, sizeof rec.checkpoint, "%s", in->uid);
            snprintf(rec.ckpt_kind, sizeof rec.ckpt_kind, "%s", ckpt_kind_name(in->kind));
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
        else if (ckpt_retain(tr->ckpt_root, sp->checkpoint.keep, pinned_by_db, &held,
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
        train_export_signal = 0;
    free(in);
    return 0;
}

/* Whether an export was asked for: SIGUSR1 on any rank, the control file or
 * the export.every_ms timer on rank 0. Collective when nranks > 1. */
int train_export_requested(trainer_t *tr, bool *want)
{
    int mine = train_export_signal ? 1 : 0;
    train_export_signal = 0;
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

void train_warning(trainer_t *tr, const char *msg)
{
    if (msg == NULL)
        return;
    KILN_WARN("%s", msg);
    if (tr->db != NULL && state_event_add(tr->db, 0, tr->opt.run_id, "warning", msg) < 0)
        KILN_WARN("the warning was not recorded in %s: %s", tr->opt.db, kiln_errmsg());
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
    train_warning(tr, msg);
    free(msg);
}

/* ---- the inputs a checkpoint covers ------------------------------------------------------
 * An incremental or online job trains each file once. The files the state
 * has learnt from whole (or set aside as bad) travel in each checkpoint's
 * manifest ("inputs"), inherited from the checkpoint the run starts from, so
 * a retry that resumes an export, or a run that starts from a checkpoint a
 * failed run left, does not train them again. A file matches when its path,
 * size and mtime do; entries whose file is gone are dropped when loaded, so
 * the list follows the data's own retention. */

static json_t *input_entry(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) < 0)
        return NULL;
    return json_pack("{s:s, s:I, s:I}", "path", path, "size", (json_int_t)sb.st_size, "mtime",
                     (json_int_t)sb.st_mtime);
}

static bool entry_matches(json_t *e, const char *path, const struct stat *sb)
{
    const char *p = json_string_value(json_object_get(e, "path"));
    return p != NULL && strcmp(p, path) == 0 &&
           json_integer_value(json_object_get(e, "size")) == (json_int_t)sb->st_size &&
           json_integer_value(json_object_get(e, "mtime")) == (json_int_t)sb->st_mtime;
}

int train_inputs_done(trainer_t *tr, const char *path)
{
    if (tr->done == NULL && (tr->done = json_array()) == NULL)
        return KILN_ENOMEM;
    if (train_inputs_covered(tr, path))
        return 0;
    json_t *e = input_entry(path);
    return e == NULL || json_array_append_new(tr->done, e) == 0 ? 0 : KILN_ENOMEM;
}

bool train_inputs_covered(const trainer_t *tr, const char *path)
{
    struct stat sb;
    size_t i;
    json_t *e;
    if (tr->done == NULL || stat(path, &sb) < 0)
        return false;
    json_array_foreach(tr->done, i, e) if (entry_matches(e, path, &sb)) return true;
    return false;
}

/* The inputs c covers, those still on disk, into tr->done. */
static int load_inputs(trainer_t *tr, const ckpt_t *c)
{
    if (!tr->spec.data.incremental && tr->spec.train.mode != JOB_MODE_ONLINE)
        return 0; /* a batch job over all its files trains them again on purpose */
    char *text = ckpt_inputs(c);
    json_t *all = text != NULL ? json_loads(text, 0, NULL) : NULL;
    free(text);
    json_decref(tr->done);
    tr->done = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(all, i, e)
    {
        const char *p = json_string_value(json_object_get(e, "path"));
        if (p != NULL && access(p, F_OK) == 0)
            json_array_append(tr->done, e);
    }
    json_decref(all);
    return tr->done != NULL ? 0 : KILN_ENOMEM;
}

int train_keep_files(trainer_t *tr, char **files, int nfiles, bool ready, int *nkeep)
{
    const job_spec_t *sp = &tr->spec;
    const data_ready_t how = {.parquet = sp->data.format == JOB_FMT_PARQUET,
                              .marker = sp->data.ready == JOB_READY_MARKER,
                              .settle_ms = sp->data.settle_ms};
    *nkeep = nfiles;
    if (nfiles == 0)
        return 0;
    unsigned char *keep = kiln_calloc((size_t)nfiles, 1);
    int rc = agree(keep != NULL ? 0 : KILN_ENOMEM);
    if (rc < 0) {
        free(keep);
        return rc;
    }
    for (int i = 0; tr->rank == 0 && i < nfiles; i++) {
        keep[i] = !train_inputs_covered(tr, files[i]) &&
                  (!ready || data_partition_ready(files[i], &how) == 1);
        if (!keep[i] && train_inputs_covered(tr, files[i]))
            train_say(tr, "kiln-train: %s: covered by the checkpoint the run starts from; not "
                          "trained again\n",
                      files[i]);
    }
    kiln_errclear();
    if (MPI_Bcast(keep, nfiles, MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        rc = kiln_errf(KILN_EMPI, "MPI_Bcast of the files to train failed");
    *nkeep = 0;
    for (int i = 0; rc == 0 && i < nfiles; i++) {
        if (!keep[i])
            continue;
        char *t = files[*nkeep];
        files[(*nkeep)++] = files[i];
        files[i] = t;
    }
    free(keep);
    return rc;
}

/* Loads the checkpoint the run starts from, if any: --resume DIR (state and
 * data position) or train.init_from (state only). Every rank reads every
 * shard file and keeps its own keys. init_from: latest takes the newest
 * checkpoint that can be used, saying which newer ones cannot, and fails
 * when there are some and none can. */
int train_load_start(trainer_t *tr)
{
    const job_spec_t *sp = &tr->spec;
    char *dir = NULL;
    int rc = 0;
    ckpt_chain_t ch = {0};
    ckpt_array_t *dense = NULL;
    int nd = 0;
    if (tr->opt.resume != NULL) {
        dir = kiln_strdup(tr->opt.resume);
        tr->resumed = true;
    } else if (sp->train.init_from == JOB_INITFROM_LATEST) {
        rc = ckpt_latest_chain(tr->ckpt_root, true, tr->rank == 0 ? skipped_checkpoint : NULL,
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
        dir = kiln_strdup(ckpt_path(ch.items[ch.n - 1]));
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
        rc = ckpt_chain_open(dir, true, &ch);
        if (rc == KILN_ENOENT)
            rc = kiln_errf(KILN_ENOENT,
                           "no checkpoint %s to start from; check --resume or "
                           "train.init_from",
                           dir);
        if (rc < 0)
            goto out;
    }
    const ckpt_info_t *in = ckpt_info(ch.items[ch.n - 1]);
    if (strcmp(in->model, job_model_type_name(sp->model.type)) != 0) {
        rc = kiln_errf(KILN_ECONFLICT, "checkpoint %s holds a %s model but the spec says %s; "
                                       "use init_from: none to start fresh",
                       dir, in->model, job_model_type_name(sp->model.type));
        goto out;
    }
    KILN_CHECK_GOTO(ckpt_load_tables(&ch, tr->rank, tr->nranks, tr->T, tr->tables), rc, out);
    for (int l = 0; l < ch.n; l++)
        train_tables_mark_time(tr, ckpt_info(ch.items[l])->step,
                               ckpt_info(ch.items[l])->created_at);
    KILN_CHECK_GOTO(shard_store_upload(tr->store, in->step), rc, out);
    KILN_CHECK_GOTO(ckpt_read_dense(ch.items[ch.n - 1], &dense, &nd), rc, out);
    model_array_t ma[8];
    int nm = 0;
    for (int i = 0; i < nd && nm < 8; i++)
        ma[nm++] = (model_array_t){.name = dense[i].name, .data = dense[i].data,
                                      .count = dense[i].count};
    rc = model_load_arrays(tr->model, ma, nm, in->dense_step);
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
             in->kind == CKPT_FULL ? in->uid : in->base);
    tr->chain = in->chain;
    /* A chain cannot span directories: after starting from a checkpoint
     * outside checkpoint.dir, the first dump is a full one. */
    char *here = realpath(tr->ckpt_root, NULL), *there = NULL;
    char *cdir = kiln_asprintf("%s/..", ckpt_path(ch.items[ch.n - 1]));
    if (cdir != NULL)
        there = realpath(cdir, NULL);
    tr->chain_elsewhere = here == NULL || there == NULL || strcmp(here, there) != 0;
    free(here);
    free(there);
    free(cdir);
    KILN_CHECK_GOTO(load_inputs(tr, ch.items[ch.n - 1]), rc, out);
    if (tr->resumed && tr->opt.predict == NULL && sp->train.mode == JOB_MODE_ONLINE) {
        /* An online run's position is in one file: train_online finds it. */
        tr->samples = in->samples;
        snprintf(tr->resume_hash, sizeof tr->resume_hash, "%s", in->inputs_hash);
        tr->resume_k = in->epoch_step;
    } else if (tr->resumed && tr->opt.predict == NULL) {
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
        rc = ckpt_lock(ckpt_path(ch.items[ch.n - 1]), &tr->lock);
    train_say(tr, "kiln-train: %s checkpoint %s (%s, step %" PRId64 ", chain of %d, written by %d "
            "rank%s)\n",
        tr->resumed ? "resuming from" : "starting from", in->uid, ckpt_kind_name(in->kind),
        in->step, ch.n, in->world_size, in->world_size == 1 ? "" : "s");
out:
    ckpt_arrays_free(dense, nd);
    ckpt_chain_fini(&ch);
    free(dir);
    return rc;
}
