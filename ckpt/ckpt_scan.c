/*
 * ckpt/ckpt_scan.c - the streaming scan of a chain's shard files (ckpt.h,
 * "scanning"): what a reader that must never hold a whole table (kiln-serve's
 * push of a checkpoint) reads instead of ckpt_read_table. At open the scan
 * lists the parts from the links' manifests, in the order that replays the
 * chain:
 *
 *   for each link, each table asked for: every rank's evicted keys (DELETE),
 *   then every rank's keys with their values (ROWS)
 *
 * and then reads one part at a time, max_rows rows per slice.
 */
#include "ckpt_int.h"

#include <stdlib.h>
#include <string.h>

/* One file (DELETE) or file pair (ROWS) of one link. */
typedef struct part {
    char *keys, *values; /* values NULL for a DELETE part */
    int table;
} part_t;

struct ckpt_scan {
    part_t *parts;
    int nparts, cur;
    int *dims; /* (ntables) */
    int64_t max_rows;
    npy_reader_t k, v; /* the current part, open while `open` */
    bool open;
    int64_t at;    /* rows of the current part already returned */
    int64_t *kbuf; /* (max_rows) */
    float *vbuf;   /* (max_rows, max dim) */
};

static int add_part(ckpt_scan_t *s, const ckpt_t *c, const ckpt_file_t *keys,
                    const ckpt_file_t *values, int table)
{
    part_t *np = kiln_reallocarray(s->parts, (size_t)s->nparts + 1, sizeof *np);
    if (np == NULL)
        return KILN_ENOMEM;
    s->parts = np;
    part_t *p = &s->parts[s->nparts];
    *p = (part_t){.table = table};
    p->keys = kiln_asprintf("%s/%s", c->path, keys->name);
    p->values = values ? kiln_asprintf("%s/%s", c->path, values->name) : NULL;
    s->nparts++;
    return p->keys && (values == NULL || p->values) ? 0 : KILN_ENOMEM;
}

/* Lists the parts of one link: per table, evicted files first, then rows. */
static int add_link(ckpt_scan_t *s, const ckpt_t *c, int ntables, const char *const *names)
{
    for (int t = 0; t < ntables; t++)
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < c->nfiles; i++) {
                const ckpt_file_t *f = &c->files[i];
                if (strcmp(f->table, names[t]) != 0)
                    continue;
                if (pass == 0 && strcmp(f->array, "evicted") == 0) {
                    KILN_CHECK(add_part(s, c, f, NULL, t));
                } else if (pass == 1 && strcmp(f->array, "keys") == 0) {
                    const ckpt_file_t *v = NULL;
                    for (int j = 0; j < c->nfiles && v == NULL; j++)
                        if (c->files[j].rank == f->rank &&
                            strcmp(c->files[j].table, f->table) == 0 &&
                            strcmp(c->files[j].array, "values") == 0)
                            v = &c->files[j];
                    if (v == NULL)
                        return kiln_errf(KILN_ECORRUPT,
                                         "%s/%s: table %s rank %d has keys but no values", c->path,
                                         CKPT_MANIFEST, f->table, f->rank);
                    KILN_CHECK(add_part(s, c, f, v, t));
                }
            }
    return 0;
}

int ckpt_scan_open(const ckpt_chain_t *ch, int from, int ntables, const char *const *names,
                      const int *dims, int64_t max_rows, ckpt_scan_t **out)
{
    *out = NULL;
    if (max_rows <= 0 || ntables < 0 || from < 0)
        return kiln_errf(KILN_EINVAL, "ckpt_scan_open: bad arguments");
    ckpt_scan_t *s = kiln_calloc(1, sizeof *s);
    if (s == NULL)
        return KILN_ENOMEM;
    int rc = 0, maxdim = 1;
    s->max_rows = max_rows;
    s->dims = kiln_calloc((size_t)ntables + 1, sizeof *s->dims);
    if (s->dims == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int t = 0; t < ntables; t++) {
        s->dims[t] = dims[t];
        maxdim = dims[t] > maxdim ? dims[t] : maxdim;
    }
    s->kbuf = kiln_calloc((size_t)max_rows, sizeof(int64_t));
    s->vbuf = kiln_calloc((size_t)max_rows * (size_t)maxdim, sizeof(float));
    if (s->kbuf == NULL || s->vbuf == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    for (int i = from; i < ch->n; i++)
        KILN_CHECK_GOTO(add_link(s, ch->items[i], ntables, names), rc, out);
    *out = s;
    s = NULL;
out:
    ckpt_scan_close(s);
    return rc;
}

int ckpt_scan_next(ckpt_scan_t *s, ckpt_slice_t *out)
{
    while (s->cur < s->nparts) {
        const part_t *p = &s->parts[s->cur];
        const int dim = s->dims[p->table];
        if (!s->open) {
            KILN_CHECK(npy_read_open(&s->k, p->keys, NPY_I8, 0));
            s->open = true;
            s->at = 0;
            if (p->values) {
                KILN_CHECK(npy_read_open(&s->v, p->values, NPY_F4, dim));
                if (s->v.rows != s->k.rows)
                    return kiln_errf(KILN_ECORRUPT, "%s has %lld rows; its keys %lld", p->values,
                                     (long long)s->v.rows, (long long)s->k.rows);
            }
        }
        int64_t n = s->k.rows - s->at;
        n = n < s->max_rows ? n : s->max_rows;
        if (n <= 0) {
            npy_read_close(&s->k);
            npy_read_close(&s->v);
            s->open = false;
            s->cur++;
            continue;
        }
        KILN_CHECK(npy_read_rows(&s->k, p->keys, s->at, n, s->kbuf));
        if (p->values)
            KILN_CHECK(npy_read_rows(&s->v, p->values, s->at, n, s->vbuf));
        s->at += n;
        *out = (ckpt_slice_t){p->values ? CKPT_SLICE_ROWS : CKPT_SLICE_DELETE, p->table, n,
                                 s->kbuf, p->values ? s->vbuf : NULL};
        return 1;
    }
    return 0;
}

void ckpt_scan_close(ckpt_scan_t *s)
{
    if (s == NULL)
        return;
    npy_read_close(&s->k);
    npy_read_close(&s->v);
    for (int i = 0; i < s->nparts; i++) {
        free(s->parts[i].keys);
        free(s->parts[i].values);
    }
    KILN_FREE_ALL(s->parts, s->dims, s->kbuf, s->vbuf);
    free(s);
}
