/*
 * serving/serve_store.c - kiln-serve's versions: for each (model, label) the
 * checkpoint it holds, its tables (serve_table) and dense model (the
 * trainer's own rt_model), in memory and on disk.
 *
 * A push is received in two passes. While the body streams in, every byte
 * goes to a staging file under <state-dir>/staging and through the checking
 * decoder (chunk checksums, structure, totals); memory stays one chunk. When
 * the body has ended and verified, the store takes its write lock and
 *   full:  builds the new version from the staging file, persists, swaps it
 *          in and frees the old one;
 *   delta: grows the tables for the rows the push adds (so that applying
 *          cannot fail half way), persists, and applies the file in place.
 * Readers take the read lock, so they see the old version until the swap.
 *
 * On disk a version is <state-dir>/models/<model>/<label>/: the verified
 * push files of its chain (a full push, then deltas) and chain.json naming
 * them, the checkpoint held, when it was applied and the idempotency answers
 * of its recent pushes. chain.json is replaced by write-temp, fsync, rename,
 * so a kiln-serve killed at any point restarts with the old version or the
 * new one, never a mix; a restart replays the chain (checking checksums
 * again). A chain of more than CHAIN_MAX files is compacted after the delta
 * that made it so: the version as it is in memory is written as one full
 * push file (the same format, encoded by serve_wire), chain.json is switched
 * to name it alone, and the old files are removed; a failure anywhere leaves
 * the old chain in place (docs/serving-protocol.md, "On disk").
 */
#include <stdarg.h>
#include <stdlib.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kern.h"
#include "data.h"
#include "model.h"
#include "serve_int.h"

#define IDEM_PER_LABEL 64
#define PREDICT_BATCH 256
#define MAX_LABELS 64
#define CHAIN_MAX 8           /* push files in a label's chain before compaction */
#define COMPACT_ROWS 65536    /* rows copied per table per round while compacting */

typedef struct idem {
    char key[128];
    int status;
    char *body;
} idem_t;

typedef struct version {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX], uid[SERVE_UID_MAX];
    int64_t applied_at;
    serve_model_desc_t desc;
    serve_table_t **tables; /* (desc.ntables) */
    float *dense;           /* (desc.nparams) */
    rt_model_t *rtm;
    char **files; /* the chain, file names in the label dir */
    int nfiles;
    int64_t next_seq;
    idem_t idem[IDEM_PER_LABEL]; /* ring */
    int nidem;
} version_t;

typedef struct counter {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    int64_t requests, rows, nonfinite;
} counter_t;

/* A label whose files could not be loaded at start: not served, reported. */
typedef struct broken {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    char *error;
} broken_t;

struct sv_store {
    char *dir;
    int lock_fd; /* <dir>/lock, flock'ed while the store is open */
    pthread_rwlock_t lock;
    pthread_mutex_t stats_lock;
    version_t **v;
    int nv, capv;
    broken_t *broken;
    int nbroken;
    sv_split_t split;
    counter_t counters[MAX_LABELS];
    int ncounters;
    int64_t staging_seq;
    int64_t pushes_applied, pushes_rejected;
};

/* ---- small helpers ---------------------------------------------------------------- */

static void answer(sv_answer_t *a, int status, json_t *obj)
{
    a->status = status;
    a->body = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
}

static void answer_error(sv_answer_t *a, int status, const char *msg)
{
    answer(a, status, json_pack("{s:s}", "error", msg));
}

/* The HTTP status for a store or decoder error code. */
static int status_for(int rc)
{
    switch (rc) {
    case KILN_ECORRUPT:
    case KILN_ECHECKSUM:
    case KILN_EVERSION:
        return 400;
    case KILN_ERANGE:
        return 413;
    case KILN_EINVAL:
        return 422;
    case KILN_ECONFLICT:
        return 409;
    case KILN_ENOENT:
        return 404;
    default:
        return 500;
    }
}

static bool good_name(const char *s)
{
    return serve_name_check(s, NULL, 0) == 0;
}

static int mkdir_p(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return kiln_errf(KILN_EIO, "cannot create %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return kiln_errf(KILN_EIO, "cannot create %s: %s", buf, strerror(errno));
    return 0;
}

static int fsync_path(const char *path, bool dir)
{
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0)
        return kiln_errf(KILN_EIO, "cannot open %s: %s", path, strerror(errno));
    int rc = fsync(fd) == 0 ? 0 : kiln_errf(KILN_EIO, "fsync %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

static char *label_dir(const sv_store_t *s, const char *model, const char *label)
{
    return kiln_asprintf("%s/models/%s/%s", s->dir, model, label);
}

/* ---- versions ---------------------------------------------------------------------- */

static void version_destroy(version_t *v)
{
    if (v == NULL)
        return;
    for (int t = 0; v->tables && t < v->desc.ntables; t++)
        serve_table_destroy(v->tables[t]);
    free(v->tables);
    free(v->dense);
    rt_model_destroy(v->rtm);
    for (int i = 0; i < v->nfiles; i++)
        free(v->files[i]);
    free(v->files);
    for (int i = 0; i < IDEM_PER_LABEL; i++)
        free(v->idem[i].body);
    free(v);
}

/* A new empty version for desc: tables, dense weights and the trainer's
 * dense model of that shape. */
static int version_create(const serve_model_desc_t *desc, version_t **out)
{
    version_t *v = kiln_calloc(1, sizeof *v);
    if (v == NULL)
        return KILN_ENOMEM;
    v->desc = *desc;
    int rc = 0;
    v->tables = kiln_calloc((size_t)desc->ntables, sizeof *v->tables);
    v->dense = kiln_calloc((size_t)desc->nparams + 1, sizeof(float));
    if (v->tables == NULL || v->dense == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int t = 0; t < desc->ntables; t++)
        KILN_CHECK_GOTO(serve_table_create(desc->tables[t].dim, &v->tables[t]), rc, out);
    rt_model_config_t cfg = {
        .type = (rt_model_type_t)desc->model_type,
        .nslots = desc->nslots,
        .ndense = desc->ndense,
        .dim = desc->dim,
        .bottom = desc->bottom,
        .nbottom = desc->nbottom,
        .top = desc->top,
        .ntop = desc->ntop,
        .fm_dense_factors = desc->fm_dense_factors,
        .max_batch = PREDICT_BATCH,
        .seed = 0,
        .opt = {.type = RT_DENSE_SGD, .lr = 0.0f},
    };
    rc = rt_model_create(&cfg, &v->rtm);
    if (rc < 0) {
        rc = kiln_errf(KILN_EINVAL, "the pushed model cannot be built: %s", kiln_errmsg());
        goto out;
    }
    if ((int64_t)rt_model_nparams(v->rtm) != desc->nparams) {
        rc = kiln_errf(KILN_EINVAL, "the push carries %lld dense parameters; a %s model of this "
                                    "shape has %zu",
                       (long long)desc->nparams, rt_model_type_name(cfg.type),
                       rt_model_nparams(v->rtm));
        goto out;
    }
out:
    if (rc < 0) {
        version_destroy(v);
        return rc;
    }
    *out = v;
    return 0;
}

static int64_t version_rows(const version_t *v)
{
    int64_t n = 0;
    for (int t = 0; t < v->desc.ntables; t++)
        n += serve_table_size(v->tables[t]);
    return n;
}

static version_t *find_version(const sv_store_t *s, const char *model, const char *label)
{
    for (int i = 0; i < s->nv; i++)
        if (strcmp(s->v[i]->model, model) == 0 && strcmp(s->v[i]->label, label) == 0)
            return s->v[i];
    return NULL;
}

/* Puts v in place of the version with its model and label (freeing that
 * one) or adds it. */
static int install_version(sv_store_t *s, version_t *v)
{
    for (int i = 0; i < s->nv; i++)
        if (strcmp(s->v[i]->model, v->model) == 0 && strcmp(s->v[i]->label, v->label) == 0) {
            version_destroy(s->v[i]);
            s->v[i] = v;
            return 0;
        }
    if (s->nv == s->capv) {
        int cap = s->capv ? 2 * s->capv : 8;
        version_t **p = kiln_reallocarray(s->v, (size_t)cap, sizeof *p);
        if (p == NULL)
            return KILN_ENOMEM;
        s->v = p;
        s->capv = cap;
    }
    s->v[s->nv++] = v;
    return 0;
}

/* ---- applying a push file ------------------------------------------------------------- */

typedef struct apply {
    version_t *v;   /* target (delta), or built here (full) */
    bool full;
    char uid[SERVE_UID_MAX];
} apply_t;

static int ap_header(void *ctx, const serve_model_desc_t *desc, const char *uid, const char *base)
{
    apply_t *a = ctx;
    snprintf(a->uid, sizeof a->uid, "%s", uid);
    if (a->full) {
        if (base[0] != '\0')
            return kiln_errf(KILN_ECORRUPT, "the chain's first push is a delta (base %s)", base);
        return version_create(desc, &a->v);
    }
    if (strcmp(base, a->v->uid) != 0)
        return kiln_errf(KILN_ECONFLICT, "the delta applies on %s but the version holds %s",
                         base, a->v->uid);
    if (memcmp(desc, &a->v->desc, sizeof *desc) != 0)
        return kiln_errf(KILN_EINVAL, "the delta describes a different model than the one held "
                                      "(tables, dims or layers changed): push it in full");
    return 0;
}

static int ap_rows(void *ctx, int table, int64_t n, const int64_t *keys, const float *values)
{
    apply_t *a = ctx;
    return serve_table_upsert(a->v->tables[table], n, keys, values);
}

static int ap_deletes(void *ctx, int table, int64_t n, const int64_t *keys)
{
    apply_t *a = ctx;
    serve_table_remove(a->v->tables[table], n, keys);
    return 0;
}

static int ap_dense(void *ctx, int64_t n, const float *values)
{
    apply_t *a = ctx;
    memcpy(a->v->dense, values, (size_t)n * sizeof(float));
    rt_model_array_t arr = {"dense.params", a->v->dense, (size_t)n};
    return rt_model_load(a->v->rtm, &arr, 1, 0);
}

/* Decodes path into a->v (a->full: a new version). Returns 0 or the
 * decoder's / callbacks' code with the file named. */
static int apply_file(apply_t *a, const char *path)
{
    static const serve_dec_cb_t cb = {ap_header, ap_rows, ap_deletes, ap_dense, NULL};
    serve_dec_t *d = NULL;
    int rc = serve_dec_create(&cb, a, 0, &d);
    FILE *f = rc < 0 ? NULL : fopen(path, "rb");
    if (rc == 0 && f == NULL)
        rc = kiln_errf(KILN_EIO, "cannot open %s: %s", path, strerror(errno));
    char *buf = rc < 0 ? NULL : kiln_malloc(1 << 20);
    if (rc == 0 && buf == NULL)
        rc = KILN_ENOMEM;
    while (rc == 0) {
        size_t got = fread(buf, 1, 1 << 20, f);
        if (got == 0) {
            rc = ferror(f) ? kiln_errf(KILN_EIO, "cannot read %s", path) : serve_dec_finish(d);
            break;
        }
        rc = serve_dec_feed(d, buf, got);
    }
    if (f != NULL)
        fclose(f);
    free(buf);
    serve_dec_destroy(d);
    if (rc < 0 && a->full) {
        version_destroy(a->v);
        a->v = NULL;
    }
    return rc;
}

/* ---- chain.json ------------------------------------------------------------------------- */

static int write_chain(const sv_store_t *s, const version_t *v)
{
    char *dir = label_dir(s, v->model, v->label);
    char *tmp = kiln_asprintf("%s/chain.json.tmp", dir ? dir : "");
    char *fin = kiln_asprintf("%s/chain.json", dir ? dir : "");
    json_t *files = json_array(), *idem = json_array();
    for (int i = 0; i < v->nfiles; i++)
        json_array_append_new(files, json_string(v->files[i]));
    for (int i = 0; i < IDEM_PER_LABEL; i++)
        if (v->idem[i].body != NULL)
            json_array_append_new(idem, json_pack("{s:s,s:i,s:s}", "key", v->idem[i].key,
                                                  "status", v->idem[i].status, "body",
                                                  v->idem[i].body));
    json_t *doc = json_pack("{s:s,s:I,s:I,s:o,s:o}", "checkpoint", v->uid, "applied_at",
                            (json_int_t)v->applied_at, "next_seq", (json_int_t)v->next_seq,
                            "files", files, "idempotency", idem);
    int rc = 0;
    if (dir == NULL || tmp == NULL || fin == NULL || doc == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if (json_dump_file(doc, tmp, JSON_COMPACT) != 0) {
        rc = kiln_errf(KILN_EIO, "cannot write %s", tmp);
        goto out;
    }
    KILN_CHECK_GOTO(fsync_path(tmp, false), rc, out);
    if (rename(tmp, fin) != 0) {
        rc = kiln_errf(KILN_EIO, "cannot rename %s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = fsync_path(dir, true);
out:
    json_decref(doc);
    free(dir);
    free(tmp);
    free(fin);
    return rc;
}

/* A push source over a version as held in memory: every table's rows in
 * rounds of COMPACT_ROWS (copied into one buffer, so compaction needs memory
 * for a round, not for a second copy of the version), then the dense model.
 * Compaction encodes it; the write lock keeps the version still meanwhile. */
typedef struct vsrc {
    const version_t *v;
    int table;
    size_t pos;
    bool dense_done;
    int64_t *keys;
    float *vals;
} vsrc_t;

static int vsrc_next(serve_source_t *s, serve_item_t *item)
{
    vsrc_t *c = s->impl;
    const version_t *v = c->v;
    for (; c->table < v->desc.ntables; c->table++, c->pos = 0) {
        int64_t n = serve_table_rows(v->tables[c->table], &c->pos, COMPACT_ROWS, c->keys, c->vals);
        if (n > 0) {
            *item = (serve_item_t){SERVE_ITEM_ROWS, c->table, n, c->keys, c->vals};
            return 1;
        }
    }
    if (!c->dense_done && v->desc.nparams > 0) {
        c->dense_done = true;
        *item = (serve_item_t){SERVE_ITEM_DENSE, 0, v->desc.nparams, NULL, v->dense};
        return 1;
    }
    return 0;
}

static void vsrc_destroy(serve_source_t *s)
{
    vsrc_t *c = s->impl;
    if (c != NULL) {
        free(c->keys);
        free(c->vals);
    }
    free(c);
    free(s);
}

static const serve_source_ops_t vsrc_ops = {vsrc_next, vsrc_destroy};

static int vsrc_open(const version_t *v, serve_source_t **out)
{
    serve_source_t *s = kiln_calloc(1, sizeof *s);
    vsrc_t *c = kiln_calloc(1, sizeof *c);
    int maxdim = 1;
    for (int t = 0; t < v->desc.ntables; t++)
        if (v->desc.tables[t].dim > maxdim)
            maxdim = v->desc.tables[t].dim;
    if (c != NULL) {
        c->v = v;
        c->keys = kiln_malloc(sizeof *c->keys * COMPACT_ROWS);
        c->vals = kiln_malloc(sizeof *c->vals * COMPACT_ROWS * (size_t)maxdim);
    }
    if (s == NULL || c == NULL || c->keys == NULL || c->vals == NULL) {
        free(s);
        if (c != NULL) {
            free(c->keys);
            free(c->vals);
        }
        free(c);
        return KILN_ENOMEM;
    }
    s->ops = &vsrc_ops;
    s->impl = c;
    s->desc = &v->desc;
    snprintf(s->uid, sizeof s->uid, "%s", v->uid);
    *out = s;
    return 0;
}

/* Writes version v (as held in memory) to dir/name as one full push file:
 * temp file, fsync, rename, fsync dir. Returns 0 or a KILN_E* code. */
static int write_full_file(const version_t *v, const char *dir, const char *name)
{
    serve_source_t *src = NULL;
    serve_enc_t *e = NULL;
    int fd = -1, rc = 0;
    char *tmp = kiln_asprintf("%s/%s.tmp", dir, name);
    char *dest = kiln_asprintf("%s/%s", dir, name);
    if (tmp == NULL || dest == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(vsrc_open(v, &src), rc, out);
    KILN_CHECK_GOTO(serve_enc_create(src, 0, &e), rc, out);
    src = NULL; /* owned by e */
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = kiln_errf(KILN_EIO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    char buf[1 << 16];
    for (;;) {
        size_t got = 0;
        KILN_CHECK_GOTO(serve_enc_read(e, buf, sizeof buf, &got), rc, out);
        if (got == 0)
            break;
        for (size_t off = 0; off < got;) {
            ssize_t w = write(fd, buf + off, got - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                rc = kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO, "cannot write %s: %s",
                               tmp, strerror(errno));
                goto out;
            }
            off += (size_t)w;
        }
    }
    if (fsync(fd) != 0) {
        rc = kiln_errf(KILN_EIO, "fsync %s: %s", tmp, strerror(errno));
        goto out;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, dest) != 0) {
        rc = kiln_errf(KILN_EIO, "cannot rename %s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = fsync_path(dir, true);
out:
    if (fd >= 0)
        close(fd);
    if (rc < 0 && tmp != NULL)
        unlink(tmp);
    serve_enc_destroy(e);
    serve_source_destroy(src);
    free(tmp);
    free(dest);
    return rc;
}

/* Replaces v's chain of push files by one full file of its current state,
 * once the chain is longer than CHAIN_MAX. The switch is chain.json's atomic
 * replace: a crash before it leaves the old chain (and an orphan file that a
 * later compaction overwrites or nobody reads), after it the new one. */
static void compact_chain(sv_store_t *s, version_t *v, const char *dir)
{
    if (v->nfiles <= CHAIN_MAX)
        return;
    int64_t t0 = kiln_mono_ns();
    char *name = kiln_asprintf("%08lld.kpush", (long long)v->next_seq);
    char **files = kiln_calloc(1, sizeof *files);
    if (name == NULL || files == NULL || write_full_file(v, dir, name) < 0) {
        KILN_WARN("%s/%s: could not compact its %d push files (they stay as they are): %s",
                  v->model, v->label, v->nfiles, name && files ? kiln_errmsg() : "out of memory");
        free(name);
        free(files);
        return;
    }
    char **old = v->files;
    int nold = v->nfiles;
    files[0] = name;
    v->files = files;
    v->nfiles = 1;
    v->next_seq++;
    if (write_chain(s, v) < 0) {
        KILN_WARN("%s/%s: compaction not committed, the old chain stays: %s", v->model,
                  v->label, kiln_errmsg());
        char *p = kiln_asprintf("%s/%s", dir, name);
        if (p != NULL)
            unlink(p);
        free(p);
        free(name);
        free(files);
        v->files = old;
        v->nfiles = nold;
        return;
    }
    for (int i = 0; i < nold; i++) {
        char *p = kiln_asprintf("%s/%s", dir, old[i]);
        if (p != NULL)
            unlink(p);
        free(p);
        free(old[i]);
    }
    free(old);
    KILN_INFO("%s/%s: compacted %d push files into %s in %.1f ms", v->model, v->label, nold,
              v->files[0], (double)(kiln_mono_ns() - t0) / 1e6);
}

/* Loads one label directory. A directory without chain.json (a first push
 * killed before it committed) is skipped. */
static int load_label(sv_store_t *s, const char *model, const char *label)
{
    char *dir = label_dir(s, model, label);
    char *path = kiln_asprintf("%s/chain.json", dir ? dir : "");
    json_t *doc = NULL;
    version_t *v = NULL;
    int rc = 0;
    if (dir == NULL || path == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    json_error_t jerr;
    doc = json_load_file(path, 0, &jerr);
    if (doc == NULL) {
        if (access(path, F_OK) != 0)
            goto out;
        rc = kiln_errf(KILN_ECORRUPT, "%s: %s", path, jerr.text);
        goto out;
    }
    json_t *files = json_object_get(doc, "files");
    size_t nf = json_array_size(files);
    if (!json_is_array(files)) {
        rc = kiln_errf(KILN_ECORRUPT, "%s: no list of push files (\"files\")", path);
        goto out;
    }
    for (size_t i = 0; i < nf; i++) {
        const char *name = json_string_value(json_array_get(files, i));
        if (name == NULL || !good_name(name)) {
            rc = kiln_errf(KILN_ECORRUPT, "%s: file %zu of the chain is not a push file name",
                           path, i);
            goto out;
        }
        char *fp = kiln_asprintf("%s/%s", dir, name);
        if (fp == NULL) {
            rc = KILN_ENOMEM;
            goto out;
        }
        apply_t a = {.v = v, .full = i == 0};
        rc = apply_file(&a, fp);
        free(fp);
        if (rc < 0) {
            rc = kiln_errf(rc, "%s/%s: %s", dir, name, kiln_errmsg());
            goto out;
        }
        v = a.v;
        snprintf(v->uid, sizeof v->uid, "%s", a.uid);
    }
    if (v == NULL)
        goto out;
    snprintf(v->model, sizeof v->model, "%s", model);
    snprintf(v->label, sizeof v->label, "%s", label);
    v->applied_at = (int64_t)json_integer_value(json_object_get(doc, "applied_at"));
    v->next_seq = (int64_t)json_integer_value(json_object_get(doc, "next_seq"));
    v->files = kiln_calloc(nf, sizeof *v->files);
    if (v->files == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < nf; i++)
        v->files[v->nfiles++] = kiln_strdup(json_string_value(json_array_get(files, i)));
    json_t *idem = json_object_get(doc, "idempotency");
    for (size_t i = 0; i < json_array_size(idem) && i < IDEM_PER_LABEL; i++) {
        json_t *e = json_array_get(idem, i);
        idem_t *d = &v->idem[v->nidem++ % IDEM_PER_LABEL];
        snprintf(d->key, sizeof d->key, "%s", json_string_value(json_object_get(e, "key")));
        d->status = (int)json_integer_value(json_object_get(e, "status"));
        d->body = kiln_strdup(json_string_value(json_object_get(e, "body")));
    }
    KILN_INFO("loaded %s/%s: checkpoint %s, %lld rows, %d push file(s)", model, label, v->uid,
              (long long)version_rows(v), v->nfiles);
    rc = install_version(s, v);
    if (rc == 0)
        v = NULL;
out:
    version_destroy(v);
    json_decref(doc);
    free(dir);
    free(path);
    return rc;
}

/* Takes <dir>/lock (flock, released when the process ends however it ends)
 * and writes this pid into it; a second kiln-serve on the same directory
 * would delete the first one's staging files and race its chain.json. */
static int lock_state_dir(sv_store_t *s)
{
    char *path = kiln_asprintf("%s/lock", s->dir);
    if (path == NULL)
        return KILN_ENOMEM;
    int rc = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = kiln_errf(KILN_EIO, "cannot open %s: %s", path, strerror(errno));
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char pid[24] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        rc = err == EWOULDBLOCK
                 ? kiln_errf(KILN_EBUSY, "--state-dir %s is in use by another kiln-serve "
                                         "(pid %s); stop that one or give this one its own "
                                         "--state-dir",
                             s->dir, pid[0] ? pid : "unknown")
                 : kiln_errf(KILN_EIO, "cannot lock %s: %s", path, strerror(err));
        close(fd);
    } else {
        char pid[24];
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
            KILN_WARN("cannot write the pid into %s: %s", path, strerror(errno));
        s->lock_fd = fd;
    }
    free(path);
    return rc;
}

/* Records model/label as broken with error (the log says it once). */
static int mark_broken(sv_store_t *s, const char *model, const char *label, const char *error)
{
    broken_t *b = kiln_reallocarray(s->broken, (size_t)s->nbroken + 1, sizeof *b);
    if (b == NULL)
        return KILN_ENOMEM;
    s->broken = b;
    b += s->nbroken;
    snprintf(b->model, sizeof b->model, "%.63s", model); /* good names: < 64 */
    snprintf(b->label, sizeof b->label, "%.63s", label);
    b->error = kiln_strdup(error);
    if (b->error == NULL)
        return KILN_ENOMEM;
    s->nbroken++;
    KILN_ERROR("%s/%s is not served: %s (its files stay as they are for inspection; a full push "
               "to it replaces it)",
               model, label, error);
    return 0;
}

static const broken_t *find_broken(const sv_store_t *s, const char *model, const char *label)
{
    for (int i = 0; i < s->nbroken; i++)
        if (strcmp(s->broken[i].model, model) == 0 && strcmp(s->broken[i].label, label) == 0)
            return &s->broken[i];
    return NULL;
}

/* Before a full push replaces a broken version: moves its directory to
 * <dir>/broken/<model>/<label>.<unix ms> (kept for inspection) and forgets
 * it. Returns 0 or KILN_EIO. */
static int set_broken_aside(sv_store_t *s, const char *model, const char *label)
{
    const broken_t *b = find_broken(s, model, label);
    if (b == NULL)
        return 0;
    char *from = label_dir(s, model, label);
    char *parent = kiln_asprintf("%s/broken/%s", s->dir, model);
    char *to = kiln_asprintf("%s/broken/%s/%s.%lld", s->dir, model, label,
                             (long long)kiln_now_ms());
    int rc = 0;
    if (from == NULL || parent == NULL || to == NULL) {
        rc = KILN_ENOMEM;
    } else if ((rc = mkdir_p(parent)) == 0 && rename(from, to) != 0 && errno != ENOENT) {
        rc = kiln_errf(KILN_EIO, "cannot move the broken version %s/%s aside to %s: %s", model,
                       label, to, strerror(errno));
    }
    if (rc == 0) {
        KILN_WARN("%s/%s: a full push replaces the broken version; its files are kept in %s",
                  model, label, to);
        int i = (int)(b - s->broken);
        free(s->broken[i].error);
        s->broken[i] = s->broken[--s->nbroken];
    }
    free(from);
    free(parent);
    free(to);
    return rc;
}

int sv_store_open(const char *state_dir, sv_store_t **out)
{
    sv_store_t *s = kiln_calloc(1, sizeof *s);
    if (s == NULL)
        return KILN_ENOMEM;
    s->lock_fd = -1;
    pthread_rwlock_init(&s->lock, NULL);
    pthread_mutex_init(&s->stats_lock, NULL);
    s->dir = kiln_strdup(state_dir);
    char *staging = kiln_asprintf("%s/staging", state_dir);
    char *models = kiln_asprintf("%s/models", state_dir);
    int rc = 0;
    if (s->dir == NULL || staging == NULL || models == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(mkdir_p(staging), rc, out);
    KILN_CHECK_GOTO(mkdir_p(models), rc, out);
    KILN_CHECK_GOTO(lock_state_dir(s), rc, out);
    /* Staging files are pushes that never finished: drop them. */
    DIR *dd = opendir(staging);
    for (struct dirent *e; dd != NULL && (e = readdir(dd)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char *p = kiln_asprintf("%s/%s", staging, e->d_name);
        if (p != NULL)
            unlink(p);
        free(p);
    }
    if (dd != NULL)
        closedir(dd);
    DIR *md = opendir(models);
    for (struct dirent *m; rc == 0 && md != NULL && (m = readdir(md)) != NULL;) {
        if (!good_name(m->d_name))
            continue;
        char *mp = kiln_asprintf("%s/%s", models, m->d_name);
        DIR *ld = mp ? opendir(mp) : NULL;
        /* A label that cannot be loaded is reported, not fatal: the others
         * are served. */
        for (struct dirent *l; rc == 0 && ld != NULL && (l = readdir(ld)) != NULL;)
            if (good_name(l->d_name) && load_label(s, m->d_name, l->d_name) < 0)
                rc = mark_broken(s, m->d_name, l->d_name, kiln_errmsg());
        if (ld != NULL)
            closedir(ld);
        free(mp);
    }
    if (md != NULL)
        closedir(md);
out:
    free(staging);
    free(models);
    if (rc < 0) {
        sv_store_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sv_store_close(sv_store_t *s)
{
    if (s == NULL)
        return;
    for (int i = 0; i < s->nv; i++)
        version_destroy(s->v[i]);
    free(s->v);
    for (int i = 0; i < s->nbroken; i++)
        free(s->broken[i].error);
    free(s->broken);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    free(s->dir);
    pthread_rwlock_destroy(&s->lock);
    pthread_mutex_destroy(&s->stats_lock);
    free(s);
}

/* ---- push sessions ---------------------------------------------------------------------- */

struct sv_push {
    sv_store_t *s;
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    char uid[SERVE_UID_MAX], base[SERVE_UID_MAX]; /* base "" for a full push */
    char idem[128];
    char *tmp;
    int fd;
    serve_dec_t *dec;
    int err;
    char errmsg[512];
    int64_t rows[SERVE_MAX_TABLES]; /* rows per table: an upper bound on new keys */
    uint64_t bytes;
    int64_t started_ns;
};

static const idem_t *idem_find(const version_t *v, const char *key)
{
    for (int i = 0; v != NULL && key[0] && i < IDEM_PER_LABEL; i++)
        if (v->idem[i].body != NULL && strcmp(v->idem[i].key, key) == 0)
            return &v->idem[i];
    return NULL;
}

static void answer_conflict(sv_answer_t *a, const version_t *v)
{
    answer(a, 409, json_pack("{s:s,s:s}", "error",
                             "the push's base is not what this endpoint holds: send a full push",
                             "holds", v ? v->uid : ""));
}

/* Pass 1: the header must match the request. */
static int p1_header(void *ctx, const serve_model_desc_t *desc, const char *uid, const char *base)
{
    sv_push_t *p = ctx;
    if (strcmp(uid, p->uid) != 0 || strcmp(base, p->base) != 0)
        return kiln_errf(KILN_ECORRUPT, "the body is checkpoint %s on base '%s' but the headers "
                                        "say %s on '%s'",
                         uid, base, p->uid, p->base);
    return 0;
}

static int p1_rows(void *ctx, int table, int64_t n, const int64_t *keys, const float *values)
{
    sv_push_t *p = ctx;
    p->rows[table] += n;
    return 0;
}

sv_push_t *sv_push_begin(sv_store_t *s, const char *model, const char *label, const char *uid,
                         const char *base, const char *idem, sv_answer_t *ans)
{
    char why[256];
    if (serve_name_check(model, why, sizeof why) < 0 ||
        serve_name_check(label, why, sizeof why) < 0) {
        answer_error(ans, 400, why);
        return NULL;
    }
    if (uid == NULL || uid[0] == '\0' || strlen(uid) >= SERVE_UID_MAX || base == NULL ||
        strlen(base) >= SERVE_UID_MAX) {
        answer_error(ans, 400, "a push needs the headers Kiln-Checkpoint: <uid> and "
                               "Kiln-Base: <uid>|none");
        return NULL;
    }
    if (idem != NULL && strlen(idem) >= 128) {
        answer_error(ans, 400, "Idempotency-Key is longer than 127 characters");
        return NULL;
    }
    bool full = strcmp(base, "none") == 0;
    pthread_rwlock_rdlock(&s->lock);
    const version_t *v = find_version(s, model, label);
    const idem_t *seen = idem_find(v, idem ? idem : "");
    if (seen != NULL) {
        ans->status = seen->status;
        ans->body = kiln_strdup(seen->body);
        pthread_rwlock_unlock(&s->lock);
        return NULL;
    }
    if (!full && (v == NULL || strcmp(v->uid, base) != 0)) {
        answer_conflict(ans, v);
        pthread_rwlock_unlock(&s->lock);
        return NULL;
    }
    pthread_rwlock_unlock(&s->lock);

    sv_push_t *p = kiln_calloc(1, sizeof *p);
    if (p == NULL) {
        answer_error(ans, 503, "out of memory");
        return NULL;
    }
    p->s = s;
    p->fd = -1;
    p->started_ns = kiln_mono_ns();
    snprintf(p->model, sizeof p->model, "%s", model);
    snprintf(p->label, sizeof p->label, "%s", label);
    snprintf(p->uid, sizeof p->uid, "%s", uid);
    snprintf(p->base, sizeof p->base, "%s", full ? "" : base);
    snprintf(p->idem, sizeof p->idem, "%s", idem ? idem : "");
    pthread_mutex_lock(&s->stats_lock);
    int64_t seq = ++s->staging_seq;
    pthread_mutex_unlock(&s->stats_lock);
    p->tmp = kiln_asprintf("%s/staging/%lld-%lld.part", s->dir, (long long)getpid(),
                           (long long)seq);
    static const serve_dec_cb_t cb = {p1_header, p1_rows, NULL, NULL, NULL};
    if (p->tmp == NULL || serve_dec_create(&cb, p, 0, &p->dec) < 0) {
        answer_error(ans, 503, "out of memory");
        sv_push_abort(p);
        return NULL;
    }
    p->fd = open(p->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (p->fd < 0) {
        char msg[600];
        snprintf(msg, sizeof msg, "cannot stage the push: %s: %s", p->tmp, strerror(errno));
        answer_error(ans, 503, msg);
        sv_push_abort(p);
        return NULL;
    }
    return p;
}

void sv_push_feed(sv_push_t *p, const void *data, size_t len)
{
    if (p->err < 0 || len == 0)
        return;
    p->bytes += len;
    int rc = serve_dec_feed(p->dec, data, len);
    if (rc == 0) {
        const unsigned char *q = data;
        size_t left = len;
        while (left > 0) {
            ssize_t w = write(p->fd, q, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                rc = kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO,
                               "cannot stage the push in %s: %s", p->tmp, strerror(errno));
                break;
            }
            q += w;
            left -= (size_t)w;
        }
    }
    if (rc < 0) {
        p->err = rc;
        snprintf(p->errmsg, sizeof p->errmsg, "%s", kiln_errmsg());
    }
}

void sv_push_abort(sv_push_t *p)
{
    if (p == NULL)
        return;
    if (p->fd >= 0)
        close(p->fd);
    if (p->tmp != NULL)
        unlink(p->tmp);
    free(p->tmp);
    serve_dec_destroy(p->dec);
    free(p);
}

static void remember(version_t *v, const char *key, const sv_answer_t *a)
{
    if (key[0] == '\0')
        return;
    idem_t *d = &v->idem[v->nidem++ % IDEM_PER_LABEL];
    free(d->body);
    snprintf(d->key, sizeof d->key, "%s", key);
    d->status = a->status;
    d->body = kiln_strdup(a->body);
}

void sv_push_end(sv_push_t *p, sv_answer_t *ans)
{
    sv_store_t *s = p->s;
    char *dir = NULL, *name = NULL, *dest = NULL;
    bool locked = false;
    version_t *built = NULL;
    int rc = p->err;
    if (rc == 0 && (rc = serve_dec_finish(p->dec)) < 0)
        snprintf(p->errmsg, sizeof p->errmsg, "%s", kiln_errmsg());
    if (rc == 0 && fsync(p->fd) != 0) {
        rc = KILN_EIO;
        snprintf(p->errmsg, sizeof p->errmsg, "fsync %s: %s", p->tmp, strerror(errno));
    }
    if (rc < 0) {
        answer_error(ans, status_for(rc), p->errmsg);
        goto out;
    }
    close(p->fd);
    p->fd = -1;

    /* A full push builds its version from the staging file before taking the
     * write lock: readers wait only for the swap (and a delta's apply). */
    bool full = p->base[0] == '\0';
    if (full) {
        apply_t b = {.full = true};
        rc = apply_file(&b, p->tmp);
        if (rc < 0) {
            version_destroy(b.v);
            answer_error(ans, status_for(rc), kiln_errmsg());
            goto out;
        }
        built = b.v;
    }

    pthread_rwlock_wrlock(&s->lock);
    locked = true;
    version_t *v = find_version(s, p->model, p->label);
    const idem_t *seen = idem_find(v, p->idem);
    if (seen != NULL) { /* the same push finished on another connection meanwhile */
        ans->status = seen->status;
        ans->body = kiln_strdup(seen->body);
        goto out;
    }
    if (!full && (v == NULL || strcmp(v->uid, p->base) != 0)) {
        answer_conflict(ans, v);
        goto out;
    }
    dir = label_dir(s, p->model, p->label);
    if (dir == NULL || (full && set_broken_aside(s, p->model, p->label) < 0) || mkdir_p(dir) < 0) {
        answer_error(ans, 500, kiln_errmsg());
        goto out;
    }
    apply_t a = {.v = v, .full = full};
    if (full) {
        snprintf(built->model, sizeof built->model, "%s", p->model);
        snprintf(built->label, sizeof built->label, "%s", p->label);
        built->next_seq = v ? v->next_seq : 0;
        memcpy(built->idem, v ? v->idem : built->idem, sizeof built->idem);
        built->nidem = v ? v->nidem : 0;
        if (v != NULL) /* the idempotency answers moved to built */
            memset(v->idem, 0, sizeof v->idem);
    } else {
        /* Grow first, so that applying cannot fail half way. */
        for (int t = 0; t < v->desc.ntables; t++)
            if (p->rows[t] > 0 && serve_table_reserve(v->tables[t], p->rows[t]) < 0) {
                answer_error(ans, 503, "not enough memory for the delta's rows");
                goto out;
            }
    }
    version_t *target = full ? built : v;
    name = kiln_asprintf("%08lld.kpush", (long long)target->next_seq);
    dest = kiln_asprintf("%s/%s", dir, name ? name : "");
    if (name == NULL || dest == NULL || rename(p->tmp, dest) != 0 || fsync_path(dir, true) < 0) {
        answer_error(ans, 500, "cannot persist the push");
        goto out;
    }
    char **files = kiln_reallocarray(full ? NULL : v->files, (size_t)(full ? 1 : v->nfiles + 1),
                                     sizeof *files);
    if (files == NULL) {
        unlink(dest);
        answer_error(ans, 503, "out of memory");
        goto out;
    }
    /* Remember the old chain's files (a full push removes them once committed). */
    char **old = full && v ? v->files : NULL;
    int nold = full && v ? v->nfiles : 0;
    if (full) {
        built->files = files;
        built->nfiles = 0;
        if (v != NULL) {
            v->files = NULL;
            v->nfiles = 0;
        }
    } else {
        v->files = files;
    }
    target->files[target->nfiles++] = name;
    name = NULL;
    target->next_seq++;
    if (!full) {
        a.v = v;
        rc = apply_file(&a, dest);
        if (rc < 0) /* verified in pass 1: only a disk failure gets here */
            KILN_ERROR("applying %s after it verified failed: %s", dest, kiln_errmsg());
        snprintf(v->uid, sizeof v->uid, "%s", p->uid);
    } else {
        snprintf(built->uid, sizeof built->uid, "%s", p->uid);
    }
    target->applied_at = kiln_now_ms();
    answer(ans, 200,
           json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:b}", "model", p->model, "label", p->label,
                     "checkpoint", p->uid, "base", full ? "none" : p->base, "rows",
                     (json_int_t)version_rows(target), "applied_at",
                     (json_int_t)target->applied_at, "bytes", (json_int_t)p->bytes, "full",
                     full));
    remember(target, p->idem, ans);
    if (write_chain(s, target) < 0)
        KILN_ERROR("%s", kiln_errmsg());
    else if (!full)
        compact_chain(s, target, dir);
    if (full) {
        if (install_version(s, built) < 0) {
            answer_error(ans, 503, "out of memory");
            version_destroy(built);
        }
        built = NULL;
        for (int i = 0; i < nold; i++) {
            char *op = kiln_asprintf("%s/%s", dir, old[i]);
            if (op != NULL && strcmp(old[i], target->files[0]) != 0)
                unlink(op);
            free(op);
            free(old[i]);
        }
        free(old);
    }
    s->pushes_applied++;
    KILN_INFO("applied %s push of %s to %s/%s in %.1f ms (%llu bytes, %lld rows now)",
              full ? "full" : "delta", p->uid, p->model, p->label,
              (double)(kiln_mono_ns() - p->started_ns) / 1e6, (unsigned long long)p->bytes,
              (long long)version_rows(target));
out:
    if (ans->status != 200)
        s->pushes_rejected++;
    if (locked)
        pthread_rwlock_unlock(&s->lock);
    version_destroy(built);
    free(dir);
    free(name);
    free(dest);
    sv_push_abort(p);
}

/* ---- reads -------------------------------------------------------------------------------- */

void sv_version_info(sv_store_t *s, const char *model, const char *label, sv_answer_t *ans)
{
    pthread_rwlock_rdlock(&s->lock);
    const version_t *v = find_version(s, model, label);
    const broken_t *b = v == NULL ? find_broken(s, model, label) : NULL;
    if (b != NULL) {
        char *msg = kiln_asprintf("this version could not be loaded at start (%s); a full push "
                                  "replaces it",
                                  b->error);
        answer(ans, 404, json_pack("{s:s,s:s,s:s}", "error", msg ? msg : "broken", "holds", "",
                                   "broken", b->error));
        free(msg);
    } else if (v == NULL) {
        answer(ans, 404, json_pack("{s:s,s:s}", "error", "this endpoint holds no such version",
                                   "holds", ""));
    } else {
        json_t *tables = json_array();
        for (int t = 0; t < v->desc.ntables; t++)
            json_array_append_new(tables, json_pack("{s:s,s:i,s:I}", "name",
                                                    v->desc.tables[t].name, "dim",
                                                    v->desc.tables[t].dim, "rows",
                                                    (json_int_t)serve_table_size(v->tables[t])));
        answer(ans, 200,
               json_pack("{s:s,s:s,s:s,s:I,s:I,s:s,s:i,s:o}", "model", v->model, "label",
                         v->label, "checkpoint", v->uid, "rows", (json_int_t)version_rows(v),
                         "applied_at", (json_int_t)v->applied_at, "model_type",
                         rt_model_type_name((rt_model_type_t)v->desc.model_type), "chain",
                         v->nfiles, "tables", tables));
    }
    pthread_rwlock_unlock(&s->lock);
}

void sv_lookup(sv_store_t *s, const char *model, const char *body, size_t len, sv_answer_t *ans)
{
    json_error_t jerr;
    json_t *req = json_loadb(body, len, 0, &jerr);
    const char *label = json_string_value(json_object_get(req, "label"));
    const char *table = json_string_value(json_object_get(req, "table"));
    json_t *keys = json_object_get(req, "keys");
    if (req == NULL || !json_is_array(keys) || table == NULL) {
        answer_error(ans, 400, "lookup wants JSON {\"label\": \"A\", \"table\": \"slot0\", "
                               "\"keys\": [1, 2]}");
        json_decref(req);
        return;
    }
    pthread_rwlock_rdlock(&s->lock);
    const version_t *v = NULL;
    for (int i = 0; i < s->nv && v == NULL; i++)
        if (strcmp(s->v[i]->model, model) == 0 && (label == NULL || strcmp(s->v[i]->label,
                                                                           label) == 0))
            v = s->v[i];
    int t = -1;
    for (int i = 0; v != NULL && i < v->desc.ntables; i++)
        if (strcmp(v->desc.tables[i].name, table) == 0)
            t = i;
    if (v == NULL || t < 0) {
        answer_error(ans, 404, v == NULL ? "no such model or label" : "no such table");
    } else {
        json_t *rows = json_array();
        size_t i;
        json_t *k;
        json_array_foreach(keys, i, k) {
            const float *r = json_is_integer(k) ? serve_table_find(v->tables[t],
                                                                   json_integer_value(k))
                                                : NULL;
            json_t *row = json_null();
            if (r != NULL) {
                row = json_array();
                for (int j = 0; j < v->desc.tables[t].dim; j++) /* finite: checked at push */
                    json_array_append_new(row, isfinite(r[j]) ? json_real(r[j]) : json_null());
            }
            json_array_append_new(rows, row);
        }
        answer(ans, 200, json_pack("{s:s,s:s,s:o}", "label", v->label, "checkpoint", v->uid,
                                   "rows", rows));
    }
    pthread_rwlock_unlock(&s->lock);
    json_decref(req);
}

int sv_split_parse(const char *text, sv_split_t *out)
{
    memset(out, 0, sizeof *out);
    const char *p = text;
    if (*p == '\0')
        return kiln_errf(KILN_EINVAL, "--split is empty; it wants LABEL=WEIGHT,... (e.g. "
                                      "A=90,B=10)");
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq == NULL || eq == p)
            return kiln_errf(KILN_EINVAL, "--split wants LABEL=WEIGHT,... (e.g. A=90,B=10); "
                                          "'%.*s' in '%s' is not one",
                             (int)len, p, text);
        if (out->n == SV_MAX_SPLIT)
            return kiln_errf(KILN_EINVAL, "--split '%s' names more than %d labels", text,
                             SV_MAX_SPLIT);
        char label[SERVE_NAME_MAX + 1], why[256];
        snprintf(label, sizeof label, "%.*s", (int)(eq - p), p);
        if (serve_name_check(label, why, sizeof why) < 0)
            return kiln_errf(KILN_EINVAL, "--split: bad label in '%s': %s", text, why);
        for (int i = 0; i < out->n; i++)
            if (strcmp(out->label[i], label) == 0)
                return kiln_errf(KILN_EINVAL, "--split: label %s appears twice in '%s'", label,
                                 text);
        char *end;
        errno = 0;
        long w = strtol(eq + 1, &end, 10);
        if (end != p + len || end == eq + 1 || errno != 0 || w < 1 || w > SV_MAX_WEIGHT)
            return kiln_errf(KILN_EINVAL, "--split: the weight of %s in '%s' must be a whole "
                                          "number from 1 to %d (leave a label out to give it "
                                          "no traffic)",
                             label, text, SV_MAX_WEIGHT);
        snprintf(out->label[out->n], SERVE_NAME_MAX, "%.63s", label);
        out->weight[out->n++] = (int)w;
        if (comma == NULL)
            return 0;
        p = comma + 1;
    }
}

void sv_store_set_split(sv_store_t *s, const sv_split_t *split)
{
    s->split = *split;
}

/* The label a request goes to: by the split's weights, sticky on key (a
 * hash of it), among the labels this model has. NULL when none. */
static const version_t *choose(const sv_store_t *s, const char *model, const char *key)
{
    const version_t *cand[SV_MAX_SPLIT];
    int w[SV_MAX_SPLIT], n = 0, total = 0;
    for (int i = 0; i < s->split.n; i++) {
        const version_t *v = find_version(s, model, s->split.label[i]);
        if (v != NULL && s->split.weight[i] > 0) {
            cand[n] = v;
            w[n] = s->split.weight[i];
            total += w[n++];
        }
    }
    if (n == 0) { /* no split configured (or none of its labels held): the first label */
        for (int i = 0; i < s->nv; i++)
            if (strcmp(s->v[i]->model, model) == 0)
                return s->v[i];
        return NULL;
    }
    static _Thread_local uint64_t anon;
    uint64_t h = key != NULL && key[0] ? kiln_xxh64(key, strlen(key), 0x73706c6974)
                                       : kiln_xxh64(&anon, sizeof anon, (uint64_t)kiln_mono_ns());
    anon++;
    int64_t r = (int64_t)(h % (uint64_t)total);
    for (int i = 0; i < n; i++) {
        if (r < w[i])
            return cand[i];
        r -= w[i];
    }
    return cand[n - 1];
}

static void count(sv_store_t *s, const char *model, const char *label, int64_t rows,
                  int64_t nonfinite)
{
    pthread_mutex_lock(&s->stats_lock);
    int i = 0;
    while (i < s->ncounters && (strcmp(s->counters[i].model, model) != 0 ||
                                strcmp(s->counters[i].label, label) != 0))
        i++;
    if (i == s->ncounters && i < MAX_LABELS) {
        snprintf(s->counters[i].model, SERVE_NAME_MAX, "%s", model);
        snprintf(s->counters[i].label, SERVE_NAME_MAX, "%s", label);
        s->ncounters++;
    }
    if (i < s->ncounters) {
        s->counters[i].requests++;
        s->counters[i].rows += rows;
        s->counters[i].nonfinite += nonfinite;
    }
    pthread_mutex_unlock(&s->stats_lock);
}

/* Predicts n parsed rows with v: the trainer's gather kernel pools the
 * rows of each slot (missing keys and empty fields read as zeros, as in
 * kiln-train's eval) and the trainer's dense model gives probabilities. */
static int predict_rows(const version_t *v, int n, const float *X, const int64_t *keys,
                        const unsigned char *has, float *probs)
{
    const serve_model_desc_t *d = &v->desc;
    const int S = d->nslots, D = d->dim;
    float *V = kiln_calloc((size_t)n * (size_t)S * (size_t)D + 1, sizeof(float));
    float *E = kiln_calloc((size_t)n * (size_t)S * (size_t)D + 1, sizeof(float));
    int64_t *off = kiln_calloc((size_t)S * (size_t)(n + 1), sizeof(int64_t));
    int32_t *rows = kiln_calloc((size_t)S * (size_t)n + 1, sizeof(int32_t));
    kern_bags_t *bags = kiln_calloc((size_t)S + 1, sizeof *bags);
    int rc = 0;
    if (V == NULL || E == NULL || off == NULL || rows == NULL || bags == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    /* V row (i*S + s) holds the looked-up row of row i, slot s. */
    for (int s = 0; s < S; s++) {
        int64_t *o = off + (int64_t)s * (n + 1);
        int32_t *r = rows + (int64_t)s * n;
        for (int i = 0; i < n; i++) {
            o[i + 1] = o[i];
            if (!has[(int64_t)i * S + s])
                continue;
            int64_t vr = (int64_t)i * S + s;
            const float *src = serve_table_find(v->tables[d->slot_table[s]],
                                                keys[(int64_t)i * S + s]);
            if (src != NULL)
                memcpy(V + vr * D, src, (size_t)D * sizeof(float));
            r[o[i + 1]++] = (int32_t)vr;
        }
        bags[s] = (kern_bags_t){.values = V,
                                .capacity = (int64_t)n * S,
                                .dim = D,
                                .combine = d->slot_mean[s] ? KERN_COMBINE_MEAN : KERN_COMBINE_SUM,
                                .offsets = o,
                                .rows = r,
                                .out_col = (int64_t)s * D};
    }
    if (S > 0)
        KILN_CHECK_GOTO(kern_cpu_gather_combine(S, bags, n, (int64_t)S * D, E), rc, out);
    rc = rt_model_predict(v->rtm, n, E, X, probs);
out:
    free(V);
    free(E);
    free(off);
    free(rows);
    free(bags);
    return rc;
}

void sv_predict(sv_store_t *s, const char *model, const char *label, const char *request_key,
                const char *body, size_t len, sv_answer_t *ans)
{
    json_t *jreq = NULL;
    if (len > 0 && body[0] == '{') { /* {"rows": ["tsv line", ...], "request_key": "..."} */
        json_error_t jerr;
        jreq = json_loadb(body, len, 0, &jerr);
        if (jreq == NULL || !json_is_array(json_object_get(jreq, "rows"))) {
            answer_error(ans, 400, "predict wants Criteo TSV lines or JSON {\"rows\": [\"<tsv "
                                   "line>\", ...]}");
            json_decref(jreq);
            return;
        }
        if (request_key == NULL)
            request_key = json_string_value(json_object_get(jreq, "request_key"));
        if (label == NULL)
            label = json_string_value(json_object_get(jreq, "label"));
    }
    pthread_rwlock_rdlock(&s->lock);
    const version_t *v = label ? find_version(s, model, label) : choose(s, model, request_key);
    float *X = NULL, *probs = NULL;
    int64_t *keys = NULL;
    unsigned char *has = NULL;
    char *line = NULL;
    json_t *res = NULL, *bad = NULL;
    if (v == NULL) {
        const broken_t *b = label ? find_broken(s, model, label) : NULL;
        char *msg = b ? kiln_asprintf("this version could not be loaded at start (%s); a full "
                                      "push replaces it",
                                      b->error)
                      : NULL;
        answer_error(ans, 404, msg ? msg : "this endpoint holds no version of that model (and "
                                           "label)");
        free(msg);
        goto out;
    }
    const int S = v->desc.nslots, F = v->desc.ndense;
    X = kiln_calloc((size_t)PREDICT_BATCH * (size_t)F + 1, sizeof(float));
    keys = kiln_calloc((size_t)PREDICT_BATCH * (size_t)S + 1, sizeof(int64_t));
    has = kiln_calloc((size_t)PREDICT_BATCH * (size_t)S + 1, 1);
    probs = kiln_calloc(PREDICT_BATCH, sizeof(float));
    line = kiln_malloc(RT_TSV_MAX_LINE + 3);
    res = json_array();
    bad = json_array();
    if (X == NULL || keys == NULL || has == NULL || probs == NULL || line == NULL ||
        res == NULL || bad == NULL) {
        answer_error(ans, 503, "out of memory");
        goto out;
    }
    size_t pos = 0, jidx = 0;
    int64_t lineno = 0, total = 0;
    for (;;) {
        int n = 0;
        while (n < PREDICT_BATCH) {
            const char *lp;
            size_t ll;
            if (jreq != NULL) {
                json_t *r = json_array_get(json_object_get(jreq, "rows"), jidx);
                if (r == NULL)
                    break;
                jidx++;
                lp = json_string_value(r);
                if (lp == NULL) {
                    answer_error(ans, 400, "predict: every element of rows must be a string");
                    goto out;
                }
                ll = strlen(lp);
            } else {
                if (pos >= len)
                    break;
                lp = body + pos;
                const char *nl = memchr(lp, '\n', len - pos);
                ll = nl ? (size_t)(nl - lp) : len - pos;
                pos += ll + (nl ? 1 : 0);
                if (ll == 0 || (ll == 1 && lp[0] == '\r'))
                    continue;
            }
            lineno++;
            if (ll > RT_TSV_MAX_LINE) {
                char msg[128];
                snprintf(msg, sizeof msg, "predict: line %lld is longer than %d bytes",
                         (long long)lineno, RT_TSV_MAX_LINE);
                answer_error(ans, 400, msg);
                goto out;
            }
            /* A line without the label column gets a dummy one. */
            size_t tabs = 0;
            for (size_t i = 0; i < ll; i++)
                tabs += lp[i] == '\t';
            if ((int)tabs == F + S - 1) {
                line[0] = '0';
                line[1] = '\t';
                memcpy(line + 2, lp, ll);
                lp = line;
                ll += 2;
            }
            float y;
            char why[RT_MESSAGE_LEN];
            if (rt_tsv_parse_line(lp, ll, F, S, &y, X + (size_t)n * F, keys + (size_t)n * S,
                                  has + (size_t)n * S, why, sizeof why) < 0) {
                char msg[RT_MESSAGE_LEN + 64];
                snprintf(msg, sizeof msg, "predict: line %lld: %s", (long long)lineno, why);
                answer_error(ans, 400, msg);
                goto out;
            }
            n++;
        }
        if (n == 0)
            break;
        int rc = predict_rows(v, n, X, keys, has, probs);
        if (rc < 0) {
            answer_error(ans, 500, kiln_errmsg());
            goto out;
        }
        /* One entry per row, always: a probability that is not finite (weights
         * that overflow) is null and its row is listed, so rows never shift. */
        for (int i = 0; i < n; i++) {
            bool finite = isfinite(probs[i]);
            if (json_array_append_new(res, finite ? json_real(probs[i]) : json_null()) < 0 ||
                (!finite && json_array_append_new(bad, json_integer(total + i)) < 0)) {
                answer_error(ans, 503, "out of memory");
                goto out;
            }
        }
        total += n;
    }
    count(s, v->model, v->label, total, (int64_t)json_array_size(bad));
    answer(ans, 200, json_pack("{s:s,s:s,s:O,s:O}", "label", v->label, "checkpoint", v->uid,
                               "probabilities", res, "nonfinite_rows", bad));
out:
    pthread_rwlock_unlock(&s->lock);
    json_decref(res);
    json_decref(bad);
    json_decref(jreq);
    free(X);
    free(keys);
    free(has);
    free(probs);
    free(line);
}

/* Appends to b (cap bytes, *n used) what fits, never past cap. */
static void bput(char *b, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void bput(char *b, size_t cap, size_t *n, const char *fmt, ...)
{
    if (*n >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b + *n, cap - *n, fmt, ap);
    va_end(ap);
    *n = k < 0 ? *n : (*n + (size_t)k < cap ? *n + (size_t)k : cap - 1);
}

void sv_stats(sv_store_t *s, bool prometheus, sv_answer_t *ans)
{
    pthread_rwlock_rdlock(&s->lock);
    pthread_mutex_lock(&s->stats_lock);
    if (prometheus) {
        /* A line is at most ~100 bytes besides a model and a label (63 each). */
        size_t cap = 4096 + (size_t)(3 * s->ncounters + s->nv + s->nbroken) * 256, n = 0;
        char *b = kiln_malloc(cap);
        if (b != NULL) {
            bput(b, cap, &n,
                 "# TYPE kiln_serve_predict_requests_total counter\n"
                 "# TYPE kiln_serve_predict_rows_total counter\n"
                 "# TYPE kiln_serve_predict_nonfinite_total counter\n");
            for (int i = 0; i < s->ncounters; i++) {
                const counter_t *c = &s->counters[i];
                bput(b, cap, &n,
                     "kiln_serve_predict_requests_total{model=\"%s\",label=\"%s\"} %lld\n"
                     "kiln_serve_predict_rows_total{model=\"%s\",label=\"%s\"} %lld\n"
                     "kiln_serve_predict_nonfinite_total{model=\"%s\",label=\"%s\"} %lld\n",
                     c->model, c->label, (long long)c->requests, c->model, c->label,
                     (long long)c->rows, c->model, c->label, (long long)c->nonfinite);
            }
            bput(b, cap, &n, "# TYPE kiln_serve_version_rows gauge\n");
            for (int i = 0; i < s->nv; i++)
                bput(b, cap, &n, "kiln_serve_version_rows{model=\"%s\",label=\"%s\"} %lld\n",
                     s->v[i]->model, s->v[i]->label, (long long)version_rows(s->v[i]));
            bput(b, cap, &n, "# TYPE kiln_serve_version_broken gauge\n");
            for (int i = 0; i < s->nbroken; i++)
                bput(b, cap, &n, "kiln_serve_version_broken{model=\"%s\",label=\"%s\"} 1\n",
                     s->broken[i].model, s->broken[i].label);
            bput(b, cap, &n,
                 "# TYPE kiln_serve_pushes_total counter\n"
                 "kiln_serve_pushes_total{result=\"applied\"} %lld\n"
                 "kiln_serve_pushes_total{result=\"rejected\"} %lld\n",
                 (long long)s->pushes_applied, (long long)s->pushes_rejected);
        }
        ans->status = b ? 200 : 503;
        ans->body = b;
    } else {
        json_t *labels = json_array(), *versions = json_array(), *broken = json_array();
        for (int i = 0; i < s->ncounters; i++)
            json_array_append_new(labels, json_pack("{s:s,s:s,s:I,s:I,s:I}", "model",
                                                    s->counters[i].model, "label",
                                                    s->counters[i].label, "requests",
                                                    (json_int_t)s->counters[i].requests, "rows",
                                                    (json_int_t)s->counters[i].rows, "nonfinite",
                                                    (json_int_t)s->counters[i].nonfinite));
        for (int i = 0; i < s->nv; i++)
            json_array_append_new(versions,
                                  json_pack("{s:s,s:s,s:s,s:I}", "model", s->v[i]->model, "label",
                                            s->v[i]->label, "checkpoint", s->v[i]->uid, "rows",
                                            (json_int_t)version_rows(s->v[i])));
        for (int i = 0; i < s->nbroken; i++)
            json_array_append_new(broken, json_pack("{s:s,s:s,s:s}", "model", s->broken[i].model,
                                                    "label", s->broken[i].label, "error",
                                                    s->broken[i].error));
        answer(ans, 200, json_pack("{s:o,s:o,s:o,s:I,s:I}", "predict", labels, "versions",
                                   versions, "broken", broken, "pushes_applied",
                                   (json_int_t)s->pushes_applied, "pushes_rejected",
                                   (json_int_t)s->pushes_rejected));
    }
    pthread_mutex_unlock(&s->stats_lock);
    pthread_rwlock_unlock(&s->lock);
}
