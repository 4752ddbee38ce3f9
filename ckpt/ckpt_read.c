/*
 * ckpt/ckpt_read.c - reading checkpoints: the .npy reader, the manifest
 * parser, integrity checks (every file's size and xxh64 against the
 * manifest), chain resolution through parent links, loading a chain into a
 * rank's tables on any rank count (each rank reads every shard and keeps the
 * keys it owns), sorted per-table views for exports and tests, and the
 * directory-level helpers: newest checkpoint, pins and retention.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "shard.h"

#define LOAD_CHUNK 65536

/* ---- .npy reader ------------------------------------------------------------------------- */

int npy_read_open(npy_reader_t *r, const char *path, npy_dtype_t dt, int64_t cols)
{
    static const char *const descr[] = {"'<i8'", "'<f4'", "'<u4'"};
    *r = (npy_reader_t){0};
    r->f = fopen(path, "rb");
    if (r->f == NULL)
        return kiln_errf(errno == ENOENT ? KILN_ECORRUPT : KILN_EIO,
                         "cannot open checkpoint file %s: %s", path, strerror(errno));
    unsigned char pre[12];
    char hdr[1024];
    size_t hl = 0, pl = 10;
    if (fread(pre, 1, 10, r->f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
        goto bad;
    if (pre[6] == 1) {
        hl = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, r->f) != 2)
            goto bad;
        hl = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        pl = 12;
    } else {
        goto bad;
    }
    if (hl >= sizeof hdr || fread(hdr, 1, hl, r->f) != hl)
        goto bad;
    hdr[hl] = '\0';
    if (strstr(hdr, descr[dt]) == NULL || strstr(hdr, "'fortran_order': False") == NULL)
        goto bad;
    const char *sh = strstr(hdr, "'shape': (");
    if (sh == NULL)
        goto bad;
    char *end;
    r->rows = strtoll(sh + 10, &end, 10);
    r->cols = 0;
    if (*end == ',' && end[1] == ' ' && end[2] >= '0' && end[2] <= '9')
        r->cols = strtoll(end + 2, &end, 10);
    if (r->rows < 0 || (cols >= 0 && r->cols != cols && !(cols == 0 && r->cols == 0)))
        goto bad;
    r->dt = dt;
    r->offset = (long)(pl + hl);
    return 0;
bad:
    fclose(r->f);
    r->f = NULL;
    return kiln_errf(KILN_ECORRUPT, "checkpoint file %s is not the .npy array expected (%s%s)",
                     path, descr[dt], cols > 0 ? ", 2-D" : "");
}

int npy_read_rows(npy_reader_t *r, const char *path, int64_t first, int64_t n, void *out)
{
    int64_t w = r->cols > 0 ? r->cols : 1;
    size_t rowb = (size_t)w * npy_dtype_size(r->dt);
    if (first < 0 || n < 0 || first + n > r->rows)
        return kiln_errf(KILN_ECORRUPT, "checkpoint file %s has %" PRId64 " rows, not %" PRId64,
                         path, r->rows, first + n);
    if (n == 0)
        return 0;
    if (fseeko(r->f, (off_t)r->offset + (off_t)first * (off_t)rowb, SEEK_SET) < 0 ||
        fread(out, rowb, (size_t)n, r->f) != (size_t)n)
        return kiln_errf(KILN_ECORRUPT, "checkpoint file %s is shorter than its header says", path);
    return 0;
}

void npy_read_close(npy_reader_t *r)
{
    if (r->f)
        fclose(r->f);
    r->f = NULL;
}

/* ---- manifest -------------------------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    snprintf(dst, cap, "%s", s ? s : "");
}

static int64_t get_int(json_t *o, const char *key)
{
    return (int64_t)json_integer_value(json_object_get(o, key));
}

int ckpt_open(const char *dir, ckpt_t **out)
{
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return kiln_errf(KILN_ENOENT, "no checkpoint directory %s", dir);
    ckpt_t *c = kiln_calloc(1, sizeof *c);
    char *mpath = kiln_asprintf("%s/%s", dir, CKPT_MANIFEST);
    json_t *m = NULL;
    int rc = 0;
    if (c == NULL || mpath == NULL || (c->path = kiln_strdup(dir)) == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    if (access(mpath, F_OK) < 0) {
        rc = kiln_errf(KILN_ECORRUPT,
                       "%s has no %s: not a complete checkpoint (a dump that did "
                       "not finish?); use another checkpoint",
                       dir, CKPT_MANIFEST);
        goto out;
    }
    json_error_t e;
    m = json_load_file(mpath, 0, &e);
    const char *fmt = json_string_value(json_object_get(m, "format"));
    if (m == NULL || fmt == NULL || strcmp(fmt, "kiln-checkpoint") != 0) {
        rc = kiln_errf(KILN_ECORRUPT, "%s is not a Kiln checkpoint manifest%s%s", mpath,
                       m == NULL ? ": " : "", m == NULL ? e.text : "");
        goto out;
    }
    if (get_int(m, "version") < 1 || get_int(m, "version") > CKPT_FORMAT_VERSION) {
        rc = kiln_errf(KILN_EVERSION,
                       "%s has format version %" PRId64 "; this Kiln reads up to "
                       "%d",
                       mpath, get_int(m, "version"), CKPT_FORMAT_VERSION);
        goto out;
    }
    ckpt_info_t *in = &c->info;
    copy_str(in->uid, sizeof in->uid, m, "uid");
    copy_str(in->parent, sizeof in->parent, m, "parent");
    copy_str(in->base, sizeof in->base, m, "base");
    copy_str(in->job, sizeof in->job, m, "job");
    copy_str(in->model, sizeof in->model, m, "model");
    copy_str(in->optimizer, sizeof in->optimizer, m, "optimizer");
    copy_str(in->spec_hash, sizeof in->spec_hash, m, "spec_hash");
    copy_str(in->inputs_hash, sizeof in->inputs_hash, m, "inputs_hash");
    const char *kind = json_string_value(json_object_get(m, "kind"));
    in->kind = kind && strcmp(kind, "incremental") == 0 ? CKPT_INCREMENTAL : CKPT_FULL;
    in->chain = (int)get_int(m, "chain");
    in->world_size = (int)get_int(m, "world_size");
    in->step = get_int(m, "step");
    in->since = get_int(m, "since");
    in->epoch = get_int(m, "epoch");
    in->epoch_step = get_int(m, "epoch_step");
    in->samples = get_int(m, "samples");
    in->dense_step = get_int(m, "dense_step");
    in->keys = get_int(m, "keys");
    in->evicted = get_int(m, "evicted");
    in->created_at = get_int(m, "created_at");
    in->include_optimizer = json_is_true(json_object_get(m, "include_optimizer"));
    if (kind == NULL || in->uid[0] == '\0' || in->world_size < 1 ||
        (in->kind == CKPT_INCREMENTAL && in->parent[0] == '\0')) {
        rc = kiln_errf(KILN_ECORRUPT, "%s lacks kind, uid, world_size or (incremental) parent",
                       mpath);
        goto out;
    }
    json_t *tables = json_object_get(m, "tables"), *files = json_object_get(m, "files");
    if (!json_is_array(tables) || !json_is_array(files) ||
        json_array_size(tables) > CKPT_MAX_TABLES) {
        rc = kiln_errf(KILN_ECORRUPT, "%s: bad tables or files list", mpath);
        goto out;
    }
    size_t i;
    json_t *v;
    json_array_foreach(tables, i, v)
    {
        ckpt_table_info_t *t = &in->tables[in->ntables++];
        copy_str(t->name, sizeof t->name, v, "name");
        t->dim = (int)get_int(v, "dim");
        t->nstate = (int)get_int(v, "nstate");
        t->opt_steps = json_is_true(json_object_get(v, "opt_steps"));
        t->rows = get_int(v, "rows");
        t->evicted = get_int(v, "evicted");
        if (t->dim < 1 || t->dim > KERN_MAX_DIM || t->nstate < 0 || t->nstate > 2) {
            rc = kiln_errf(KILN_ECORRUPT, "%s: table %s has a bad dim or nstate", mpath, t->name);
            goto out;
        }
    }
    c->files = kiln_calloc(json_array_size(files) + 1, sizeof *c->files);
    if (c->files == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    int64_t bytes = (int64_t)st.st_size;
    json_array_foreach(files, i, v)
    {
        ckpt_file_t *f = &c->files[c->nfiles++];
        copy_str(f->name, sizeof f->name, v, "name");
        copy_str(f->table, sizeof f->table, v, "table");
        copy_str(f->array, sizeof f->array, v, "array");
        f->rank = (int)get_int(v, "rank");
        f->rows = get_int(v, "rows");
        f->size = get_int(v, "size");
        const char *hex = json_string_value(json_object_get(v, "xxh64"));
        if (f->name[0] == '\0' || strchr(f->name, '/') != NULL || hex == NULL ||
            kiln_hash_parse_hex(hex, &f->xxh) < 0) {
            rc = kiln_errf(KILN_ECORRUPT, "%s: bad entry for file '%s'", mpath, f->name);
            goto out;
        }
        bytes += f->size;
    }
    struct stat ms;
    in->bytes = bytes + (stat(mpath, &ms) == 0 ? (int64_t)ms.st_size : 0) - (int64_t)st.st_size;
    uint64_t h = 0;
    if (kiln_xxh64_file(mpath, 0, &h, NULL) == 0)
        kiln_hash_hex(h, in->checksum, sizeof in->checksum);
    *out = c;
    c = NULL;
out:
    json_decref(m);
    free(mpath);
    ckpt_close(c);
    return rc;
}

void ckpt_close(ckpt_t *c)
{
    if (c == NULL)
        return;
    KILN_FREE_ALL(c->path, c->files, c);
}

const ckpt_info_t *ckpt_info(const ckpt_t *c)
{
    return &c->info;
}

const char *ckpt_path(const ckpt_t *c)
{
    return c->path;
}

char *ckpt_inputs(const ckpt_t *c)
{
    char *mpath = kiln_asprintf("%s/%s", c->path, CKPT_MANIFEST);
    json_t *m = mpath != NULL ? json_load_file(mpath, 0, NULL) : NULL;
    json_t *in = json_object_get(m, "inputs");
    char *text = NULL;
    if (m != NULL)
        text = json_is_array(in) ? json_dumps(in, JSON_COMPACT) : kiln_strdup("[]");
    json_decref(m);
    free(mpath);
    return text;
}

int ckpt_verify(const ckpt_t *c)
{
    for (int i = 0; i < c->nfiles; i++) {
        const ckpt_file_t *f = &c->files[i];
        char *p = kiln_asprintf("%s/%s", c->path, f->name);
        if (p == NULL)
            return KILN_ENOMEM;
        uint64_t h = 0, size = 0;
        int rc = kiln_xxh64_file(p, 0, &h, &size);
        if (rc == KILN_ENOENT)
            rc = kiln_errf(KILN_ECORRUPT,
                           "checkpoint file %s is missing (the manifest lists "
                           "it); the checkpoint is damaged: use another one",
                           p);
        else if (rc < 0)
            rc = kiln_errf(KILN_EIO, "cannot read checkpoint file %s: %s", p, kiln_errmsg());
        else if ((int64_t)size != f->size)
            rc = kiln_errf(KILN_ECORRUPT,
                           "checkpoint file %s has %" PRIu64 " bytes but the "
                           "manifest says %" PRId64 "; the checkpoint is damaged",
                           p, size, f->size);
        else if (h != f->xxh) {
            char a[17], b[17];
            rc = kiln_errf(KILN_ECHECKSUM,
                           "checksum mismatch in checkpoint file %s: xxh64 %s, "
                           "manifest says %s; the checkpoint is damaged",
                           p, kiln_hash_hex(h, a, sizeof a), kiln_hash_hex(f->xxh, b, sizeof b));
        }
        free(p);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- chains -------------------------------------------------------------------------------- */

int ckpt_chain_open(const char *dir, bool verify, ckpt_chain_t *out)
{
    *out = (ckpt_chain_t){0};
    char *root = kiln_strdup(dir);
    if (root == NULL)
        return KILN_ENOMEM;
    size_t L = strlen(root);
    while (L > 1 && root[L - 1] == '/')
        root[--L] = '\0';
    char *slash = strrchr(root, '/');
    if (slash == NULL) {
        free(root);
        root = kiln_strdup(".");
    } else {
        *slash = '\0';
        if (root[0] == '\0')
            strcpy(root, "/");
    }
    int rc = 0, cap = 0;
    ckpt_t *c = NULL;
    KILN_CHECK_GOTO(ckpt_open(dir, &c), rc, out);
    for (;;) {
        if (verify)
            KILN_CHECK_GOTO(ckpt_verify(c), rc, out);
        if (out->n == cap) {
            cap = cap ? cap * 2 : 8;
            ckpt_t **ni = kiln_reallocarray(out->items, (size_t)cap, sizeof *ni);
            if (ni == NULL) {
                rc = KILN_ENOMEM;
                goto out;
            }
            out->items = ni;
        }
        out->items[out->n++] = c;
        if (c->info.kind == CKPT_FULL) {
            c = NULL;
            break;
        }
        if (out->n > 100000) {
            rc = kiln_errf(KILN_ECORRUPT, "checkpoint chain of %s does not end", dir);
            c = NULL;
            goto out;
        }
        char *pdir = kiln_asprintf("%s/%s", root, c->info.parent);
        const char *child = c->info.uid;
        c = NULL;
        if (pdir == NULL) {
            rc = KILN_ENOMEM;
            goto out;
        }
        rc = ckpt_open(pdir, &c);
        if (rc == KILN_ENOENT)
            rc = kiln_errf(KILN_ECORRUPT, "checkpoint %s needs its parent %s, which is missing",
                           child, pdir);
        free(pdir);
        if (rc < 0)
            goto out;
    }
    /* Oldest first. */
    for (int i = 0; i < out->n / 2; i++) {
        ckpt_t *t = out->items[i];
        out->items[i] = out->items[out->n - 1 - i];
        out->items[out->n - 1 - i] = t;
    }
out:
    ckpt_close(c);
    free(root);
    if (rc < 0)
        ckpt_chain_fini(out);
    return rc;
}

void ckpt_chain_fini(ckpt_chain_t *ch)
{
    for (int i = 0; i < ch->n; i++)
        ckpt_close(ch->items[i]);
    free(ch->items);
    *ch = (ckpt_chain_t){0};
}

/* ---- loading -------------------------------------------------------------------------------- */

static const ckpt_file_t *find_file(const ckpt_t *c, const char *table, int rank,
                                    const char *array)
{
    for (int i = 0; i < c->nfiles; i++) {
        const ckpt_file_t *f = &c->files[i];
        if (f->rank == rank && strcmp(f->table, table) == 0 && strcmp(f->array, array) == 0)
            return f;
    }
    return NULL;
}

static const ckpt_table_info_t *find_table(const ckpt_info_t *in, const char *name)
{
    for (int i = 0; i < in->ntables; i++)
        if (strcmp(in->tables[i].name, name) == 0)
            return &in->tables[i];
    return NULL;
}

static int open_array(const ckpt_t *c, const ckpt_file_t *f, npy_dtype_t dt, int64_t cols,
                      npy_reader_t *r, char **path)
{
    *path = kiln_asprintf("%s/%s", c->path, f->name);
    if (*path == NULL)
        return KILN_ENOMEM;
    return npy_read_open(r, *path, dt, cols);
}

/* Applies one rank's removals of one table to t, keeping owned keys. */
static int load_evicted(const ckpt_t *c, const ckpt_file_t *f, int rank, int nranks,
                        kern_table_t *t, int64_t step)
{
    npy_reader_t r;
    char *path = NULL;
    int64_t *keys = kiln_malloc(LOAD_CHUNK * sizeof *keys);
    int rc = keys ? open_array(c, f, NPY_I8, 0, &r, &path) : KILN_ENOMEM;
    if (rc < 0)
        goto out;
    for (int64_t at = 0; at < r.rows && rc == 0; at += LOAD_CHUNK) {
        int64_t m = r.rows - at < LOAD_CHUNK ? r.rows - at : LOAD_CHUNK, k = 0;
        rc = npy_read_rows(&r, path, at, m, keys);
        for (int64_t i = 0; rc == 0 && i < m; i++)
            if (shard_owner(keys[i], nranks) == rank)
                keys[k++] = keys[i];
        if (rc == 0)
            rc = kern_table_delete(t, k, keys, step, NULL);
    }
    npy_read_close(&r);
out:
    free(path);
    free(keys);
    return rc;
}

/* Loads one rank's rows of one table into t, keeping owned keys. */
static int load_rows(const ckpt_t *c, const ckpt_table_info_t *ti, int src, int rank,
                     int nranks, kern_table_t *t, int64_t step)
{
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    const int dim = ti->dim;
    const bool use_opt = ti->nstate > 0 && ti->nstate == sl.nstate;
    const bool use_steps = ti->opt_steps && sl.opt_steps != NULL;
    const ckpt_file_t *fk = find_file(c, ti->name, src, "keys");
    const ckpt_file_t *fv = find_file(c, ti->name, src, "values");
    const ckpt_file_t *fo = use_opt ? find_file(c, ti->name, src, "opt") : NULL;
    const ckpt_file_t *fs = use_steps ? find_file(c, ti->name, src, "opt_steps") : NULL;
    if (fk == NULL)
        return 0;
    if (fv == NULL || (use_opt && fo == NULL) || (use_steps && fs == NULL))
        return kiln_errf(KILN_ECORRUPT,
                         "checkpoint %s: table %s rank %d has keys but not all "
                         "its arrays",
                         c->path, ti->name, src);
    npy_reader_t rk = {0}, rv = {0}, ro = {0}, rs = {0};
    char *pk = NULL, *pv = NULL, *po = NULL, *ps = NULL;
    int64_t *keys = kiln_malloc(LOAD_CHUNK * sizeof *keys);
    float *vals = kiln_malloc((size_t)LOAD_CHUNK * (size_t)dim * sizeof *vals);
    float *opt =
        use_opt ? kiln_malloc((size_t)LOAD_CHUNK * (size_t)(ti->nstate * dim) * sizeof *opt) : NULL;
    uint32_t *steps = use_steps ? kiln_malloc(LOAD_CHUNK * sizeof *steps) : NULL;
    int rc = 0;
    if (!keys || !vals || (use_opt && !opt) || (use_steps && !steps)) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(open_array(c, fk, NPY_I8, 0, &rk, &pk), rc, out);
    KILN_CHECK_GOTO(open_array(c, fv, NPY_F4, dim, &rv, &pv), rc, out);
    if (use_opt)
        KILN_CHECK_GOTO(open_array(c, fo, NPY_F4, (int64_t)ti->nstate * dim, &ro, &po), rc, out);
    if (use_steps)
        KILN_CHECK_GOTO(open_array(c, fs, NPY_U4, 0, &rs, &ps), rc, out);
    if (rv.rows != rk.rows || (use_opt && ro.rows != rk.rows) ||
        (use_steps && rs.rows != rk.rows)) {
        rc = kiln_errf(KILN_ECORRUPT,
                       "checkpoint %s: the arrays of table %s rank %d differ in "
                       "length",
                       c->path, ti->name, src);
        goto out;
    }
    const int64_t ow = (int64_t)ti->nstate * dim;
    for (int64_t at = 0; at < rk.rows; at += LOAD_CHUNK) {
        int64_t m = rk.rows - at < LOAD_CHUNK ? rk.rows - at : LOAD_CHUNK, k = 0;
        KILN_CHECK_GOTO(npy_read_rows(&rk, pk, at, m, keys), rc, out);
        KILN_CHECK_GOTO(npy_read_rows(&rv, pv, at, m, vals), rc, out);
        if (use_opt)
            KILN_CHECK_GOTO(npy_read_rows(&ro, po, at, m, opt), rc, out);
        if (use_steps)
            KILN_CHECK_GOTO(npy_read_rows(&rs, ps, at, m, steps), rc, out);
        for (int64_t i = 0; i < m; i++) {
            if (nranks > 1 && shard_owner(keys[i], nranks) != rank)
                continue;
            if (k != i) {
                keys[k] = keys[i];
                memmove(vals + k * dim, vals + i * dim, (size_t)dim * sizeof *vals);
                if (use_opt)
                    memmove(opt + k * ow, opt + i * ow, (size_t)ow * sizeof *opt);
                if (use_steps)
                    steps[k] = steps[i];
            }
            k++;
        }
        rc = kern_table_insert_rows(t, k, keys, vals, opt, steps, step);
        if (rc < 0)
            goto out;
    }
out:
    npy_read_close(&rk);
    npy_read_close(&rv);
    npy_read_close(&ro);
    npy_read_close(&rs);
    KILN_FREE_ALL(pk, pv, po, ps, keys, vals, opt, steps);
    return rc;
}

/* Adds to *n the keys of table ti in checkpoint c that rank owns and t does
 * not hold yet (what a load still has to insert). */
static int count_missing(const ckpt_t *c, const ckpt_table_info_t *ti, int rank,
                         int nranks, const kern_table_t *t, int64_t *n)
{
    int64_t *keys = kiln_malloc(LOAD_CHUNK * sizeof *keys);
    int32_t *rows = kiln_malloc(LOAD_CHUNK * sizeof *rows);
    int rc = keys && rows ? 0 : KILN_ENOMEM;
    for (int src = 0; rc == 0 && src < c->info.world_size; src++) {
        const ckpt_file_t *fk = find_file(c, ti->name, src, "keys");
        npy_reader_t r;
        char *path = NULL;
        if (fk == NULL || (rc = open_array(c, fk, NPY_I8, 0, &r, &path)) < 0) {
            free(path);
            continue;
        }
        for (int64_t at = 0; at < r.rows && rc == 0; at += LOAD_CHUNK) {
            int64_t m = r.rows - at < LOAD_CHUNK ? r.rows - at : LOAD_CHUNK, k = 0;
            rc = npy_read_rows(&r, path, at, m, keys);
            for (int64_t i = 0; rc == 0 && i < m; i++)
                if (nranks == 1 || shard_owner(keys[i], nranks) == rank)
                    keys[k++] = keys[i];
            if (rc == 0)
                *n += k - kern_table_find(t, k, keys, rows);
        }
        npy_read_close(&r);
        free(path);
    }
    free(keys);
    free(rows);
    return rc;
}

/* The error for a table whose rows do not fit on this rank: how many it
 * would hold (an upper bound over the rest of the chain) and the job-wide
 * capacity that makes room for them. */
static int load_full_error(const ckpt_chain_t *ch, int level, const ckpt_table_info_t *ti,
                           int rank, int nranks, const kern_table_t *t)
{
    int64_t need = kern_table_size(t);
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    for (int l = level; l < ch->n; l++) {
        const ckpt_table_info_t *tl = find_table(&ch->items[l]->info, ti->name);
        if (tl != NULL)
            KILN_CHECK(count_missing(ch->items[l], tl, rank, nranks, t, &need));
    }
    const ckpt_t *last = ch->items[ch->n - 1];
    int ws = last->info.world_size;
    return kiln_errf(KILN_EFULL,
                     "checkpoint %s: table '%s' does not fit on rank %d of %d: this rank's "
                     "share of its rows is %lld but it holds at most %lld here; raise "
                     "model.embedding.capacity (or the table's capacity in model.tables) to "
                     "at least %lld%s",
                     last->path, ti->name, rank, nranks, (long long)need,
                     (long long)st.capacity,
                     (long long)shard_capacity_for(need, rank, nranks),
                     ws != nranks && ws > 0 ? ", or resume on as many ranks as wrote it" : "");
}

/* Loads table t's admission sketch from checkpoint c: this rank's as it
 * was on as many ranks, else the sum of every rank's (a key's count is
 * then at least what its owner saw). A checkpoint without one (admission
 * turned on since) leaves the counters at zero. */
static int load_admit(const ckpt_t *c, int rank, int nranks, kern_table_t *t, int64_t step)
{
    int64_t n = 0, epoch = 0;
    if (kern_table_admit_sketch(t, &n, &epoch) == NULL)
        return 0;
    int rc = 0;
    bool first = true;
    for (int src = 0; rc == 0 && src < c->info.world_size; src++) {
        if (c->info.world_size == nranks && src != rank)
            continue;
        const ckpt_file_t *f = find_file(c, kern_table_name(t), src, "admit");
        if (f == NULL)
            continue;
        npy_reader_t r;
        char *path = NULL;
        uint32_t *raw = kiln_malloc(sizeof *raw * (size_t)n);
        uint16_t *cnt = kiln_malloc(sizeof *cnt * (size_t)n);
        rc = raw && cnt ? open_array(c, f, NPY_U4, 0, &r, &path) : KILN_ENOMEM;
        if (rc == 0) {
            if (r.rows != n)
                rc = kern_table_admit_load(t, NULL, r.rows, step, false); /* names the sizes */
            else if ((rc = npy_read_rows(&r, path, 0, n, raw)) == 0) {
                for (int64_t i = 0; i < n; i++)
                    cnt[i] = (uint16_t)(raw[i] < 65535 ? raw[i] : 65535);
                rc = kern_table_admit_load(t, cnt, n, step, !first);
                first = false;
            }
            npy_read_close(&r);
        }
        KILN_FREE_ALL(path, raw, cnt);
    }
    return rc;
}

int ckpt_load_tables(const ckpt_chain_t *ch, int rank, int nranks, int ntables,
                        kern_table_t *const *tables)
{
    if (ch->n == 0)
        return kiln_errf(KILN_EINVAL, "empty checkpoint chain");
    int64_t step = ch->items[ch->n - 1]->info.step;
    for (int l = 0; l < ch->n; l++) {
        const ckpt_t *c = ch->items[l];
        for (int t = 0; t < ntables; t++) {
            const ckpt_table_info_t *ti = find_table(&c->info, kern_table_name(tables[t]));
            if (ti == NULL)
                continue;
            if (ti->dim != kern_table_dim(tables[t]))
                return kiln_errf(KILN_ECONFLICT,
                                 "checkpoint %s: table %s has dim %d but the "
                                 "model needs %d; start fresh (init_from: none) "
                                 "or keep the old dim",
                                 c->path, ti->name, ti->dim, kern_table_dim(tables[t]));
            if (c->info.kind == CKPT_INCREMENTAL)
                for (int i = 0; i < c->nfiles; i++)
                    if (strcmp(c->files[i].table, ti->name) == 0 &&
                        strcmp(c->files[i].array, "evicted") == 0)
                        KILN_CHECK(load_evicted(c, &c->files[i], rank, nranks, tables[t], step));
            for (int src = 0; src < c->info.world_size; src++) {
                int rc = load_rows(c, ti, src, rank, nranks, tables[t], step);
                if (rc == KILN_EFULL)
                    return load_full_error(ch, l, ti, rank, nranks, tables[t]);
                if (rc < 0)
                    return rc;
            }
        }
    }
    for (int t = 0; t < ntables; t++)
        KILN_CHECK(load_admit(ch->items[ch->n - 1], rank, nranks, tables[t], step));
    ckpt_mark_dumped(ntables, tables, step);
    return 0;
}

int ckpt_read_dense(const ckpt_t *c, ckpt_array_t **arrays, int *narrays)
{
    *arrays = NULL;
    *narrays = 0;
    ckpt_array_t *a = kiln_calloc((size_t)c->nfiles + 1, sizeof *a);
    if (a == NULL)
        return KILN_ENOMEM;
    int n = 0, rc = 0;
    for (int i = 0; i < c->nfiles && rc == 0; i++) {
        const ckpt_file_t *f = &c->files[i];
        if (f->table[0] != '\0')
            continue;
        npy_reader_t r;
        char *path = NULL;
        rc = open_array(c, f, NPY_F4, 0, &r, &path);
        if (rc == 0) {
            a[n].name = kiln_strdup(f->array);
            a[n].count = (size_t)r.rows;
            a[n].data = kiln_malloc(((size_t)r.rows + 1) * sizeof(float));
            n++;
            rc = a[n - 1].name && a[n - 1].data ? npy_read_rows(&r, path, 0, r.rows, a[n - 1].data)
                                                : KILN_ENOMEM;
            npy_read_close(&r);
        }
        free(path);
    }
    if (rc < 0) {
        ckpt_arrays_free(a, n);
        return rc;
    }
    *arrays = a;
    *narrays = n;
    return 0;
}

void ckpt_arrays_free(ckpt_array_t *arrays, int narrays)
{
    for (int i = 0; arrays && i < narrays; i++) {
        free((char *)arrays[i].name);
        free(arrays[i].data);
    }
    free(arrays);
}

typedef struct {
    int64_t key;
    int32_t row;
} key_row_t;

static int cmp_key_row(const void *a, const void *b)
{
    int64_t x = ((const key_row_t *)a)->key, y = ((const key_row_t *)b)->key;
    return (x > y) - (x < y);
}

int ckpt_read_table(const ckpt_chain_t *ch, const char *name, ckpt_rows_t *out)
{
    *out = (ckpt_rows_t){0};
    const ckpt_table_info_t *ti = NULL;
    int64_t total = 0;
    for (int l = 0; l < ch->n; l++) {
        const ckpt_table_info_t *x = find_table(&ch->items[l]->info, name);
        if (x != NULL) {
            ti = x;
            total += x->rows;
        }
    }
    if (ti == NULL)
        return kiln_errf(KILN_ENOENT, "the checkpoint has no table named '%s'", name);
    kern_table_config_t cfg = {
        .name = name,
        .dim = ti->dim,
        .capacity = total + 1,
        .opt = ti->nstate == 2   ? KERN_OPT_ADAM
               : ti->nstate == 1 ? KERN_OPT_ADAGRAD
                                 : KERN_OPT_SGD,
        .init = KERN_INIT_ZEROS,
        .evict = KERN_EVICT_NONE,
    };
    kern_table_t *t = NULL;
    int32_t *rows = NULL;
    key_row_t *kr = NULL;
    int rc = 0;
    KILN_CHECK_GOTO(kern_table_create(&cfg, &t), rc, out);
    KILN_CHECK_GOTO(ckpt_load_tables(ch, 0, 1, 1, &t), rc, out);
    int64_t n = kern_table_size(t), got = 0;
    rows = kiln_malloc(((size_t)n + 1) * sizeof *rows);
    kr = kiln_malloc(((size_t)n + 1) * sizeof *kr);
    if (rows == NULL || kr == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(kern_table_scan(t, rows, n + 1, &got), rc, out);
    const int64_t *keys = kern_table_keys(t);
    for (int64_t i = 0; i < got; i++)
        kr[i] = (key_row_t){keys[rows[i]], rows[i]};
    qsort(kr, (size_t)got, sizeof *kr, cmp_key_row);
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    const int dim = ti->dim, ns = ti->nstate;
    out->n = got;
    out->dim = dim;
    out->nstate = ns;
    out->keys = kiln_malloc(((size_t)got + 1) * sizeof *out->keys);
    out->values = kiln_malloc(((size_t)got * (size_t)dim + 1) * sizeof *out->values);
    out->opt =
        ns > 0 ? kiln_malloc(((size_t)got * (size_t)(ns * dim) + 1) * sizeof *out->opt) : NULL;
    out->opt_steps = ti->opt_steps ? kiln_malloc(((size_t)got + 1) * sizeof *out->opt_steps) : NULL;
    if (!out->keys || !out->values || (ns > 0 && !out->opt) || (ti->opt_steps && !out->opt_steps)) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int64_t i = 0; i < got; i++) {
        int64_t r = kr[i].row;
        out->keys[i] = kr[i].key;
        memcpy(out->values + i * dim, sl.values + r * dim, (size_t)dim * sizeof(float));
        if (ns > 0)
            memcpy(out->opt + i * ns * dim, sl.opt_state + r * ns * dim,
                   (size_t)(ns * dim) * sizeof(float));
        if (out->opt_steps)
            out->opt_steps[i] = sl.opt_steps[r];
    }
out:
    kern_table_destroy(t);
    KILN_FREE_ALL(rows, kr);
    if (rc < 0)
        ckpt_rows_fini(out);
    return rc;
}

void ckpt_rows_fini(ckpt_rows_t *r)
{
    KILN_FREE_ALL(r->keys, r->values, r->opt, r->opt_steps);
    *r = (ckpt_rows_t){0};
}

/* ---- a directory of checkpoints ------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The checkpoint-like entries of root (not starting with '.'), sorted. */
static int list_dir(const char *root, char ***out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (d == NULL)
        return errno == ENOENT ? 0
                               : kiln_errf(KILN_EIO, "cannot list %s: %s", root, strerror(errno));
    struct dirent *e;
    int cap = 0, rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 32;
            char **nn = kiln_reallocarray(*out, (size_t)cap, sizeof *nn);
            if (nn == NULL) {
                rc = KILN_ENOMEM;
                break;
            }
            *out = nn;
        }
        if (((*out)[*n] = kiln_strdup(e->d_name)) == NULL) {
            rc = KILN_ENOMEM;
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (*n > 0)
        qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return rc;
}


int ckpt_latest(const char *root, char *uid)
{
    char **names = NULL;
    int n = 0;
    KILN_CHECK(list_dir(root, &names, &n));
    int rc = kiln_errf(KILN_ENOENT, "no checkpoint in %s", root);
    for (int i = n - 1; i >= 0; i--) {
        char *p = kiln_asprintf("%s/%s/%s", root, names[i], CKPT_MANIFEST);
        bool ok = p && access(p, F_OK) == 0;
        free(p);
        if (ok) {
            snprintf(uid, CKPT_UID_MAX, "%s", names[i]);
            rc = 0;
            break;
        }
    }
    kiln_strv_free(names, (size_t)n);
    return rc;
}

/* True when name has the shape of a uid: 13 digits, '-', 12 digits. */
static bool uid_like(const char *name)
{
    if (strlen(name) != 26 || name[13] != '-')
        return false;
    for (int i = 0; i < 26; i++)
        if (i != 13 && (name[i] < '0' || name[i] > '9'))
            return false;
    return true;
}

int ckpt_latest_chain(const char *root, bool verify, ckpt_skip_fn skip, void *ctx,
                         ckpt_chain_t *out)
{
    char **names = NULL;
    int n = 0, tried = 0, rc = KILN_ENOENT;
    char newest[CKPT_UID_MAX] = "", why[600] = "";
    *out = (ckpt_chain_t){0};
    KILN_CHECK(list_dir(root, &names, &n));
    for (int i = n - 1; i >= 0; i--) {
        char *dir = kiln_asprintf("%s/%s", root, names[i]);
        char *man = kiln_asprintf("%s/%s/%s", root, names[i], CKPT_MANIFEST);
        if (dir == NULL || man == NULL) {
            free(dir);
            free(man);
            rc = KILN_ENOMEM;
            break;
        }
        /* What looks like a checkpoint: a uid-shaped name or a manifest.
         * Anything else in root is not ours. */
        bool candidate = uid_like(names[i]) || access(man, F_OK) == 0;
        free(man);
        if (!candidate) {
            free(dir);
            continue;
        }
        tried++;
        rc = ckpt_chain_open(dir, verify, out);
        if (rc == 0 || (rc != KILN_ECORRUPT && rc != KILN_ECHECKSUM && rc != KILN_EVERSION &&
                        rc != KILN_ENOENT)) {
            /* Found, or a failure that is not the checkpoint's fault (an I/O
             * error, memory): not a reason to take an older one. */
            free(dir);
            break;
        }
        if (tried == 1) {
            snprintf(newest, sizeof newest, "%s", names[i]);
            snprintf(why, sizeof why, "%s", kiln_errmsg());
        }
        if (skip != NULL)
            skip(dir, kiln_errmsg(), ctx);
        free(dir);
        rc = KILN_ENOENT;
    }
    kiln_strv_free(names, (size_t)n);
    if (rc == KILN_ENOENT && tried == 0)
        return kiln_errf(KILN_ENOENT, "no checkpoint in %s", root);
    if (rc == KILN_ENOENT)
        return kiln_errf(KILN_ECORRUPT,
                         "none of the %d checkpoint%s in %s can be used; the newest, %s: %s", tried,
                         tried == 1 ? "" : "s", root, newest, why);
    return rc;
}

int ckpt_lock(const char *dir, char **lock)
{
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    *lock = kiln_asprintf("%s/.lock-%s-%ld", dir, host, (long)getpid());
    if (*lock == NULL)
        return KILN_ENOMEM;
    FILE *f = fopen(*lock, "w");
    if (f == NULL) {
        int rc = kiln_errf(KILN_EIO, "cannot pin checkpoint %s: %s", *lock, strerror(errno));
        free(*lock);
        *lock = NULL;
        return rc;
    }
    fclose(f);
    return 0;
}

void ckpt_unlock(char *lock)
{
    if (lock != NULL)
        unlink(lock);
    free(lock);
}

/* True when dir holds a lock of a live process (stale local locks go). */
static bool locked(const char *dir)
{
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    DIR *d = opendir(dir);
    if (d == NULL)
        return false;
    bool live = false;
    struct dirent *e;
    while (!live && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, ".lock-", 6) != 0)
            continue;
        const char *dash = strrchr(e->d_name, '-');
        size_t hl = (size_t)(dash - (e->d_name + 6));
        long pid = strtol(dash + 1, NULL, 10);
        bool here = hl == strlen(host) && strncmp(e->d_name + 6, host, hl) == 0;
        if (here && pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
            char *p = kiln_asprintf("%s/%s", dir, e->d_name);
            if (p)
                unlink(p);
            free(p);
            continue;
        }
        live = true;
    }
    closedir(d);
    return live;
}

int ckpt_retain(const char *root, int keep, ckpt_pin_fn pin, void *ctx, int *removed)
{
    char **names = NULL;
    int n = 0, rc = 0, gone = 0;
    ckpt_t **cks = NULL;
    bool *need = NULL;
    KILN_CHECK(list_dir(root, &names, &n));
    cks = kiln_calloc((size_t)n + 1, sizeof *cks);
    need = kiln_calloc((size_t)n + 1, sizeof *need);
    if (cks == NULL || need == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    int valid = 0;
    for (int i = 0; i < n; i++) {
        char *p = kiln_asprintf("%s/%s", root, names[i]);
        if (p != NULL && ckpt_open(p, &cks[i]) == 0)
            valid++;
        free(p);
    }
    kiln_errclear();
    /* Newest `keep` valid ones, and pinned ones. */
    int kept = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (cks[i] == NULL)
            continue;
        if (kept < keep) {
            need[i] = true;
            kept++;
        }
        if (!need[i] && (locked(ckpt_path(cks[i])) || (pin && pin(names[i], ctx))))
            need[i] = true;
    }
    /* Whatever a needed incremental stands on. */
    for (int i = n - 1; i >= 0; i--) {
        if (!need[i] || cks[i] == NULL)
            continue;
        int j = i;
        while (cks[j] && cks[j]->info.kind == CKPT_INCREMENTAL) {
            int p = -1;
            for (int k = 0; k < n; k++)
                if (strcmp(names[k], cks[j]->info.parent) == 0)
                    p = k;
            if (p < 0)
                break;
            need[p] = true;
            j = p;
        }
    }
    for (int i = 0; i < n; i++) {
        if (need[i] || cks[i] == NULL)
            continue;
        /* Renamed first: a removal cut short leaves a .rm-* directory that
         * the next pass finishes, never a uid-named one without its
         * manifest, which could as well be a damaged checkpoint. */
        char *p = kiln_asprintf("%s/%s", root, names[i]);
        char *gone_p = kiln_asprintf("%s/.rm-%s", root, names[i]);
        if (p == NULL || gone_p == NULL) {
            free(p);
            free(gone_p);
            rc = KILN_ENOMEM;
            goto out;
        }
        if (rename(p, gone_p) < 0)
            rc = kiln_errf(KILN_EIO, "cannot retire checkpoint %s: %s", p, strerror(errno));
        else
            rc = ckpt_remove(gone_p);
        free(p);
        free(gone_p);
        if (rc < 0)
            goto out;
        gone++;
    }
    /* Never delete what cannot be read: it may be the newest checkpoint
     * with a damaged manifest, wanted for inspection or repair. */
    for (int i = 0; i < n; i++)
        if (cks[i] == NULL && uid_like(names[i]))
            KILN_WARN("retention in %s: %s has no readable manifest; kept (inspect it, then "
                      "delete it by hand)",
                      root, names[i]);
    /* Temp dirs of dumps that were killed more than a day ago, and
     * removals that were cut short. */
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        bool rm = strncmp(e->d_name, ".rm-", 4) == 0;
        if (strncmp(e->d_name, ".tmp-", 5) != 0 && !rm)
            continue;
        char *p = kiln_asprintf("%s/%s", root, e->d_name);
        struct stat st;
        if (p && (rm || (stat(p, &st) == 0 && st.st_mtime < time(NULL) - 86400)))
            ckpt_remove(p);
        free(p);
    }
    if (d)
        closedir(d);
    (void)valid;
out:
    for (int i = 0; cks && i < n; i++)
        ckpt_close(cks[i]);
    free(cks);
    free(need);
    kiln_strv_free(names, (size_t)n);
    if (removed)
        *removed = gone;
    return rc;
}
