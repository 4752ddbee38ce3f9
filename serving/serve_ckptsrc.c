/*
 * serving/serve_ckptsrc.c - the update source over checkpoints
 * (docs/checkpoint-format.md). ckpt_chain_open resolves and verifies the
 * chain (full dump, then incrementals); the ckpt module's scan
 * (ckpt_scan_*) streams its shard files in slices of
 * SERVE_ROWS_PER_CHUNK rows, so a push never holds a whole table:
 *
 *   for each link after the base (all links for a full push), each table,
 *   each rank's shard: the evicted keys (DELETE), then keys + values (ROWS);
 *   finally the dense parameters of the last link (DENSE).
 *
 * The server applies items in order, so replaying the links one after the
 * other gives exactly the state of the last checkpoint.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "serve.h"

typedef struct csrc {
    serve_model_desc_t desc;
    ckpt_scan_t *scan;
    ckpt_array_t *dense;
    int ndense;
    bool dense_done;
} csrc_t;

static int c_next(serve_source_t *s, serve_item_t *item)
{
    csrc_t *c = s->impl;
    ckpt_slice_t sl;
    int got = ckpt_scan_next(c->scan, &sl);
    if (got != 0) {
        if (got > 0)
            *item = (serve_item_t){sl.kind == CKPT_SLICE_ROWS ? SERVE_ITEM_ROWS
                                                                 : SERVE_ITEM_DELETE,
                                   sl.table, sl.n, sl.keys, sl.values};
        return got;
    }
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

static void c_destroy(serve_source_t *s)
{
    csrc_t *c = s->impl;
    if (c != NULL) {
        ckpt_scan_close(c->scan);
        ckpt_arrays_free(c->dense, c->ndense);
        free(c);
    }
    free(s);
}

static const serve_source_ops_t c_ops = {c_next, c_destroy};

int serve_ckptsrc_open(const char *ckpt_dir, const serve_model_desc_t *desc, const char *held,
                       serve_source_t **out)
{
    ckpt_chain_t ch = {0};
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
    KILN_CHECK_GOTO(ckpt_chain_open(ckpt_dir, true, &ch), rc, out);
    const ckpt_info_t *last = ckpt_info(ch.items[ch.n - 1]);
    snprintf(s->uid, sizeof s->uid, "%s", last->uid);
    int from = 0; /* the first link to send */
    for (int i = 0; held != NULL && held[0] && i < ch.n; i++)
        if (strcmp(ckpt_info(ch.items[i])->uid, held) == 0) {
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
    const char *names[SERVE_MAX_TABLES];
    int dims[SERVE_MAX_TABLES];
    for (int t = 0; t < desc->ntables; t++) {
        names[t] = c->desc.tables[t].name;
        dims[t] = desc->tables[t].dim;
    }
    KILN_CHECK_GOTO(ckpt_scan_open(&ch, from, desc->ntables, names, dims, SERVE_ROWS_PER_CHUNK,
                                      &c->scan),
                    rc, out);
    KILN_CHECK_GOTO(ckpt_read_dense(ch.items[ch.n - 1], &c->dense, &c->ndense), rc, out);
    /* The dense parameter count is the checkpoint's own: whoever built the
     * description need not build the model to count them. */
    for (int i = 0; i < c->ndense; i++)
        if (strcmp(c->dense[i].name, "dense.params") == 0)
            c->desc.nparams = (int64_t)c->dense[i].count;
out:
    ckpt_chain_fini(&ch);
    if (rc < 0) {
        c_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

int serve_ckptsrc_opener(void *ctx, const char *held, serve_source_t **out)
{
    const serve_ckptsrc_at_t *at = ctx;
    return serve_ckptsrc_open(at->ckpt_dir, at->desc, held, out);
}
