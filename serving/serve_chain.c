/*
 * serving/serve_chain.c - a version's files on disk:
 * <state-dir>/models/<model>/<label>/ holds the verified push files of its
 * chain (a full push, then deltas) and chain.json naming them, the
 * checkpoint held, when it was applied and the idempotency answers of its
 * recent pushes. chain.json is replaced atomically (kiln_write_atomic), so a
 * kiln-serve killed at any point restarts with the old version or the new
 * one, never a mix; a restart replays the chain (checking checksums again).
 * A chain of more than CHAIN_MAX files is compacted after the delta that
 * made it so: the version as it is in memory is written as one full push
 * file (the same format, encoded by serve_wire), chain.json is switched to
 * name it alone, and the old files are removed; a failure anywhere leaves
 * the old chain in place (docs/serving-protocol.md, "On disk").
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_store_int.h"

#define CHAIN_MAX 8           /* push files in a label's chain before compaction */
#define COMPACT_ROWS 65536    /* rows copied per table per round while compacting */

/* ---- applying a push file ------------------------------------------------------------- */

typedef struct apply {
    sv_version_t *v; /* target (delta), or built here (full) */
    bool full;
    char *uid;       /* (SERVE_UID_MAX) */
} apply_t;

static int ap_header(void *ctx, const serve_model_desc_t *desc, const char *uid, const char *base)
{
    apply_t *a = ctx;
    snprintf(a->uid, SERVE_UID_MAX, "%s", uid);
    if (a->full) {
        if (base[0] != '\0')
            return kiln_errf(KILN_ECORRUPT, "the chain's first push is a delta (base %s)", base);
        return sv_version_create(desc, &a->v);
    }
    if (base[0] == '\0')
        return kiln_errf(KILN_ECORRUPT, "a full push (checkpoint %s) follows the chain's first "
                                        "file, which only a delta may do (chain.json lists the "
                                        "files out of order?)",
                         uid);
    if (strcmp(base, a->v->uid) != 0)
        return kiln_errf(KILN_ECONFLICT, "the delta applies on %s but the chain before it holds "
                                         "%s (chain.json lists the files out of order?)",
                         base, a->v->uid[0] ? a->v->uid : "no checkpoint");
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
    return serve_table_remove(a->v->tables[table], n, keys);
}

static int ap_dense(void *ctx, int64_t n, const float *values)
{
    apply_t *a = ctx;
    memcpy(a->v->dense, values, (size_t)n * sizeof(float));
    model_array_t arr = {"dense.params", a->v->dense, (size_t)n};
    return model_load_arrays(a->v->rtm, &arr, 1, 0);
}

int sv_chain_apply(const char *path, bool full, sv_version_t **v, char *uid)
{
    static const serve_dec_cb_t cb = {ap_header, ap_rows, ap_deletes, ap_dense, NULL};
    apply_t app = {.v = *v, .full = full, .uid = uid}, *a = &app;
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
        sv_version_destroy(a->v);
        a->v = NULL;
    }
    *v = a->v;
    return rc;
}

/* ---- chain.json ------------------------------------------------------------------------- */

/* An idempotency answer as chain.json keeps it. */
static json_t *idem_json(const sv_idem_t *d)
{
    const sv_pushed_t *p = &d->ans;
    return json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:b}", "key", d->key, "checkpoint", p->uid,
                     "base", p->base, "rows", (json_int_t)p->rows, "applied_at",
                     (json_int_t)p->applied_at, "bytes", (json_int_t)p->bytes, "full", p->full);
}

/* Reads an idempotency answer of chain.json into d (v's model and label):
 * the fields of idem_json, or an older kiln-serve's {"key", "status",
 * "body"} with the same fields in the body. Returns false for neither. */
static bool idem_read(json_t *e, const sv_version_t *v, sv_idem_t *d)
{
    json_t *body = NULL, *r = e;
    const char *text = json_string_value(json_object_get(e, "body"));
    if (text != NULL)
        r = body = json_loads(text, 0, NULL);
    const char *key = json_string_value(json_object_get(e, "key"));
    const char *uid = json_string_value(json_object_get(r, "checkpoint"));
    const char *base = json_string_value(json_object_get(r, "base"));
    bool ok = key != NULL && uid != NULL && base != NULL;
    if (ok) {
        *d = (sv_idem_t){0};
        snprintf(d->key, sizeof d->key, "%s", key);
        sv_pushed_t *p = &d->ans;
        snprintf(p->model, sizeof p->model, "%s", v->model);
        snprintf(p->label, sizeof p->label, "%s", v->label);
        snprintf(p->uid, sizeof p->uid, "%s", uid);
        snprintf(p->base, sizeof p->base, "%s", base);
        p->rows = (int64_t)json_integer_value(json_object_get(r, "rows"));
        p->applied_at = (int64_t)json_integer_value(json_object_get(r, "applied_at"));
        p->bytes = (uint64_t)json_integer_value(json_object_get(r, "bytes"));
        p->full = json_is_true(json_object_get(r, "full"));
    }
    json_decref(body);
    return ok;
}

int sv_chain_write(const sv_store_t *s, const sv_version_t *v)
{
    char *dir = sv_label_dir(s, v->model, v->label);
    char *path = kiln_asprintf("%s/chain.json", dir ? dir : "");
    json_t *files = json_array(), *idem = json_array();
    for (int i = 0; i < v->nfiles; i++)
        json_array_append_new(files, json_string(v->files[i]));
    for (int i = 0; i < IDEM_PER_LABEL; i++)
        if (v->idem[i].key[0] != '\0')
            json_array_append_new(idem, idem_json(&v->idem[i]));
    json_t *doc = json_pack("{s:s,s:I,s:I,s:o,s:o}", "checkpoint", v->uid, "applied_at",
                            (json_int_t)v->applied_at, "next_seq", (json_int_t)v->next_seq,
                            "files", files, "idempotency", idem);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    int rc = dir == NULL || path == NULL || text == NULL
                 ? KILN_ENOMEM
                 : kiln_write_atomic(path, text, strlen(text));
    json_decref(doc);
    free(text);
    free(dir);
    free(path);
    return rc;
}

/* A push source over a version as held in memory: every table's rows in
 * rounds of COMPACT_ROWS (copied into one buffer, so compaction needs memory
 * for a round, not for a second copy of the version), then the dense model.
 * Compaction encodes it; the write lock keeps the version still meanwhile. */
typedef struct vsrc {
    const sv_version_t *v;
    int table;
    size_t pos;
    bool dense_done;
    int64_t *keys;
    float *vals;
} vsrc_t;

static int vsrc_next(serve_source_t *s, serve_item_t *item)
{
    vsrc_t *c = s->impl;
    const sv_version_t *v = c->v;
    for (; c->table < v->desc.ntables; c->table++, c->pos = 0) {
        int64_t n = 0;
        int rc = serve_table_rows(v->tables[c->table], &c->pos, COMPACT_ROWS, c->keys, c->vals, &n);
        if (rc < 0)
            return rc;
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

static int vsrc_open(const sv_version_t *v, serve_source_t **out)
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

/* Writes version v (as held in memory) to dir/name as one full push file,
 * atomically. Returns 0 or a KILN_E* code. */
static int write_full_file(const sv_version_t *v, const char *dir, const char *name)
{
    serve_source_t *src = NULL;
    serve_enc_t *e = NULL;
    kiln_atomic_t f = {0};
    char *dest = kiln_asprintf("%s/%s", dir, name);
    int rc = dest == NULL ? KILN_ENOMEM : 0;
    if (rc == 0)
        KILN_CHECK_GOTO(vsrc_open(v, &src), rc, out);
    KILN_CHECK_GOTO(serve_enc_create(src, 0, &e), rc, out);
    src = NULL; /* owned by e */
    KILN_CHECK_GOTO(kiln_atomic_open(dest, &f), rc, out);
    char buf[1 << 16];
    for (;;) {
        size_t got = 0;
        KILN_CHECK_GOTO(serve_enc_read(e, buf, sizeof buf, &got), rc, out);
        if (got == 0)
            break;
        if (fwrite(buf, 1, got, f.f) != got) {
            rc = kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO, "cannot write %s: %s",
                           f.tmp, strerror(errno));
            goto out;
        }
    }
    rc = kiln_atomic_commit(&f);
out:
    kiln_atomic_abort(&f);
    serve_enc_destroy(e);
    serve_source_destroy(src);
    free(dest);
    return rc;
}

/* The switch is chain.json's atomic
 * replace: a crash before it leaves the old chain (and an orphan file that a
 * later compaction overwrites or nobody reads), after it the new one. */
void sv_chain_compact(const sv_store_t *s, sv_version_t *v, const char *dir)
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
    if (sv_chain_write(s, v) < 0) {
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

int sv_chain_load(const sv_store_t *s, const char *model, const char *label,
                  sv_version_t **out)
{
    *out = NULL;
    char *dir = sv_label_dir(s, model, label);
    char *path = kiln_asprintf("%s/chain.json", dir ? dir : "");
    json_t *doc = NULL;
    sv_version_t *v = NULL;
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
        if (name == NULL || serve_name_check(name, NULL, 0) < 0) {
            rc = kiln_errf(KILN_ECORRUPT, "%s: file %zu of the chain is not a push file name",
                           path, i);
            goto out;
        }
        char *fp = kiln_asprintf("%s/%s", dir, name);
        if (fp == NULL) {
            rc = KILN_ENOMEM;
            goto out;
        }
        char uid[SERVE_UID_MAX];
        rc = sv_chain_apply(fp, i == 0, &v, uid);
        free(fp);
        if (rc < 0) {
            rc = kiln_errf(rc, "%s/%s: %s", dir, name, kiln_errmsg());
            goto out;
        }
        snprintf(v->uid, sizeof v->uid, "%s", uid);
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
    for (size_t i = 0; i < json_array_size(idem) && v->nidem < IDEM_PER_LABEL; i++)
        if (idem_read(json_array_get(idem, i), v, &v->idem[v->nidem]))
            v->nidem++;
    *out = v;
    v = NULL;
out:
    sv_version_destroy(v);
    json_decref(doc);
    free(dir);
    free(path);
    return rc;
}
