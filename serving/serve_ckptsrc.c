/*
 * serving/serve_ckptsrc.c - the update source over checkpoints
 * (docs/checkpoint-format.md). rt_ckpt_chain_open resolves and verifies the
 * chain (full dump, then incrementals); this file reads each link's
 * manifest.json for its file list and streams the .npy files in slices of
 * SERVE_ROWS_PER_CHUNK rows, so a push never holds a whole table:
 *
 *   for each link after the base (all links for a full push), each table,
 *   each rank's shard: the evicted keys (DELETE), then keys + values (ROWS);
 *   finally the dense parameters of the last link (DENSE).
 *
 * The server applies items in order, so replaying the links one after the
 * other gives exactly the state of the last checkpoint.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "serve.h"

typedef struct npy {
    FILE *f;
    int64_t rows, cols;
    long offset;
} npy_t;

/* Opens a .npy of dtype descr ("<i8" | "<f4"); cols 0 for 1-D. */
static int npy_open(npy_t *n, const char *path, const char *descr)
{
    memset(n, 0, sizeof *n);
    n->f = fopen(path, "rb");
    if (n->f == NULL)
        return kiln_errf(KILN_ENOENT, "cannot open %s: %s", path, strerror(errno));
    unsigned char pre[12];
    if (fread(pre, 1, 10, n->f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0)
        return kiln_errf(KILN_ECORRUPT, "%s is not a .npy file", path);
    size_t hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    long off = 10;
    if (pre[6] >= 2) {
        if (fread(pre + 10, 1, 2, n->f) != 2)
            return kiln_errf(KILN_ECORRUPT, "%s: short header", path);
        hlen |= ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
        off = 12;
    }
    if (hlen > 65536)
        return kiln_errf(KILN_ECORRUPT, "%s: header too long", path);
    char *h = kiln_calloc(hlen + 1, 1);
    if (h == NULL)
        return KILN_ENOMEM;
    int rc = 0;
    char want[16];
    snprintf(want, sizeof want, "'%s'", descr);
    const char *sh;
    if (fread(h, 1, hlen, n->f) != hlen || strstr(h, want) == NULL ||
        strstr(h, "'fortran_order': False") == NULL || (sh = strstr(h, "'shape': (")) == NULL) {
        rc = kiln_errf(KILN_ECORRUPT, "%s: not a C-order %s array", path, descr);
    } else {
        long long r = 0, c = 0;
        int got = sscanf(sh + 10, "%lld, %lld", &r, &c);
        n->rows = r;
        n->cols = got == 2 ? c : 0;
        if (got < 1 || r < 0 || c < 0)
            rc = kiln_errf(KILN_ECORRUPT, "%s: bad shape", path);
    }
    free(h);
    n->offset = off + (long)hlen;
    return rc;
}

static void npy_close(npy_t *n)
{
    if (n->f != NULL)
        fclose(n->f);
    n->f = NULL;
}

/* One shard file pair of one link, or an evicted-keys file. */
typedef struct part {
    char keys[1024], values[1024]; /* values "" for a DELETE part */
    int table;
} part_t;

typedef struct csrc {
    serve_model_desc_t desc;
    part_t *parts;
    int nparts, cur;
    npy_t k, v;
    bool open;
    int64_t at;
    int64_t *kbuf;
    float *vbuf;
    rt_ckpt_array_t *dense;
    int ndense;
    bool dense_done;
} csrc_t;

static int add_part(csrc_t *c, const part_t *p)
{
    part_t *np = kiln_reallocarray(c->parts, (size_t)c->nparts + 1, sizeof *np);
    if (np == NULL)
        return KILN_ENOMEM;
    c->parts = np;
    c->parts[c->nparts++] = *p;
    return 0;
}

/* Lists the parts of one link from its manifest. */
static int add_link(csrc_t *c, const char *dir)
{
    char mpath[1024];
    snprintf(mpath, sizeof mpath, "%s/%s", dir, RT_CKPT_MANIFEST);
    json_error_t jerr;
    json_t *m = json_load_file(mpath, 0, &jerr);
    if (m == NULL)
        return kiln_errf(KILN_ECORRUPT, "%s: %s", mpath, jerr.text);
    json_t *files = json_object_get(m, "files");
    int rc = 0;
    for (int t = 0; t < c->desc.ntables && rc == 0; t++)
        for (int pass = 0; pass < 2 && rc == 0; pass++) { /* evicted first, then rows */
            size_t i;
            json_t *f;
            json_array_foreach(files, i, f)
            {
                const char *table = json_string_value(json_object_get(f, "table"));
                const char *array = json_string_value(json_object_get(f, "array"));
                const char *name = json_string_value(json_object_get(f, "name"));
                if (table == NULL || array == NULL || name == NULL ||
                    strcmp(table, c->desc.tables[t].name) != 0)
                    continue;
                part_t p = {.table = t};
                if (pass == 0 && strcmp(array, "evicted") == 0) {
                    snprintf(p.keys, sizeof p.keys, "%s/%s", dir, name);
                } else if (pass == 1 && strcmp(array, "keys") == 0) {
                    /* the values file of the same table and rank */
                    json_int_t rank = json_integer_value(json_object_get(f, "rank"));
                    size_t j;
                    json_t *g;
                    json_array_foreach(files, j, g)
                    {
                        const char *ta = json_string_value(json_object_get(g, "table"));
                        const char *ar = json_string_value(json_object_get(g, "array"));
                        if (ta && ar && strcmp(ta, table) == 0 && strcmp(ar, "values") == 0 &&
                            json_integer_value(json_object_get(g, "rank")) == rank)
                            snprintf(p.values, sizeof p.values, "%s/%s", dir,
                                     json_string_value(json_object_get(g, "name")));
                    }
                    if (p.values[0] == '\0') {
                        rc = kiln_errf(KILN_ECORRUPT, "%s: table %s rank %lld has keys but no "
                                                      "values",
                                       mpath, table, (long long)rank);
                        break;
                    }
                    snprintf(p.keys, sizeof p.keys, "%s/%s", dir, name);
                } else {
                    continue;
                }
                if ((rc = add_part(c, &p)) < 0)
                    break;
            }
        }
    json_decref(m);
    return rc;
}

static int c_next(serve_source_t *s, serve_item_t *item)
{
    csrc_t *c = s->impl;
    for (;;) {
        if (c->cur >= c->nparts) {
            if (c->dense_done)
                return 0;
            c->dense_done = true;
            for (int i = 0; i < c->ndense; i++)
                if (strcmp(c->dense[i].name, "dense.params") == 0) {
                    *item = (serve_item_t){SERVE_ITEM_DENSE, 0, (int64_t)c->dense[i].count, NULL,
                                           c->dense[i].data};
                    return 1;
                }
            return kiln_errf(KILN_ECORRUPT, "the checkpoint has no dense.params array");
        }
        part_t *p = &c->parts[c->cur];
        int dim = c->desc.tables[p->table].dim;
        if (!c->open) {
            KILN_CHECK(npy_open(&c->k, p->keys, "<i8"));
            if (p->values[0]) {
                KILN_CHECK(npy_open(&c->v, p->values, "<f4"));
                if (c->v.rows != c->k.rows || c->v.cols != dim)
                    return kiln_errf(KILN_ECORRUPT, "%s is (%lld, %lld); the keys and the model "
                                                    "want (%lld, %d)",
                                     p->values, (long long)c->v.rows, (long long)c->v.cols,
                                     (long long)c->k.rows, dim);
            }
            c->open = true;
            c->at = 0;
        }
        int64_t n = c->k.rows - c->at;
        if (n > SERVE_ROWS_PER_CHUNK)
            n = SERVE_ROWS_PER_CHUNK;
        if (n <= 0) {
            npy_close(&c->k);
            npy_close(&c->v);
            c->open = false;
            c->cur++;
            continue;
        }
        if (fseek(c->k.f, c->k.offset + (long)(c->at * 8), SEEK_SET) != 0 ||
            fread(c->kbuf, 8, (size_t)n, c->k.f) != (size_t)n)
            return kiln_errf(KILN_ECORRUPT, "%s: short read", p->keys);
        if (p->values[0] &&
            (fseek(c->v.f, c->v.offset + (long)(c->at * dim * 4), SEEK_SET) != 0 ||
             fread(c->vbuf, 4, (size_t)(n * dim), c->v.f) != (size_t)(n * dim)))
            return kiln_errf(KILN_ECORRUPT, "%s: short read", p->values);
        c->at += n;
        *item = (serve_item_t){p->values[0] ? SERVE_ITEM_ROWS : SERVE_ITEM_DELETE, p->table, n,
                               c->kbuf, p->values[0] ? c->vbuf : NULL};
        return 1;
    }
}

static void c_destroy(serve_source_t *s)
{
    csrc_t *c = s->impl;
    if (c != NULL) {
        npy_close(&c->k);
        npy_close(&c->v);
        free(c->parts);
        free(c->kbuf);
        free(c->vbuf);
        rt_ckpt_arrays_free(c->dense, c->ndense);
        free(c);
    }
    free(s);
}

static const serve_source_ops_t c_ops = {c_next, c_destroy};

int serve_ckptsrc_open(const char *ckpt_dir, const serve_model_desc_t *desc, const char *held,
                       serve_source_t **out)
{
    rt_ckpt_chain_t ch = {0};
    serve_source_t *s = kiln_calloc(1, sizeof *s);
    csrc_t *c = kiln_calloc(1, sizeof *c);
    int rc = 0;
    if (s == NULL || c == NULL) {
        free(s);
        free(c);
        return KILN_ENOMEM;
    }
    s->ops = &c_ops;
    s->impl = c;
    c->desc = *desc;
    s->desc = &c->desc;
    c->kbuf = kiln_calloc(SERVE_ROWS_PER_CHUNK, sizeof(int64_t));
    c->vbuf = kiln_calloc((size_t)SERVE_ROWS_PER_CHUNK * (size_t)desc->dim, sizeof(float));
    if (c->kbuf == NULL || c->vbuf == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(rt_ckpt_chain_open(ckpt_dir, true, &ch), rc, out);
    const rt_ckpt_info_t *last = rt_ckpt_info(ch.items[ch.n - 1]);
    snprintf(s->uid, sizeof s->uid, "%s", last->uid);
    int from = 0; /* the first link to send */
    for (int i = 0; held != NULL && held[0] && i < ch.n; i++)
        if (strcmp(rt_ckpt_info(ch.items[i])->uid, held) == 0) {
            from = i + 1;
            snprintf(s->base, sizeof s->base, "%s", held);
        }
    for (int i = 0; i < last->ntables; i++) {
        bool known = false;
        for (int t = 0; t < desc->ntables; t++)
            known |= strcmp(desc->tables[t].name, last->tables[i].name) == 0 &&
                     desc->tables[t].dim == last->tables[i].dim;
        if (!known) {
            rc = kiln_errf(KILN_ECONFLICT, "checkpoint %s has table %s (dim %d), which the job "
                                           "spec's model does not",
                           last->uid, last->tables[i].name, last->tables[i].dim);
            goto out;
        }
    }
    for (int i = from; i < ch.n; i++)
        KILN_CHECK_GOTO(add_link(c, rt_ckpt_path(ch.items[i])), rc, out);
    KILN_CHECK_GOTO(rt_ckpt_read_dense(ch.items[ch.n - 1], &c->dense, &c->ndense), rc, out);
    /* The dense parameter count is the checkpoint's own: whoever built the
     * description need not build the model to count them. */
    for (int i = 0; i < c->ndense; i++)
        if (strcmp(c->dense[i].name, "dense.params") == 0)
            c->desc.nparams = (int64_t)c->dense[i].count;
out:
    rt_ckpt_chain_fini(&ch);
    if (rc < 0) {
        c_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}
