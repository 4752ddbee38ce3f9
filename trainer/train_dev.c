/*
 * trainer/train_dev.c - the device step: train_step with the pooling, the
 * dense model (lr, fm, dlrm), the backward reduce and, by default, the
 * exchange between ranks on a device (train_dev.h), the CUDA runtime on a GPU
 * or the host stand-in in CI. One step of a rank:
 *
 *   host         X, y, the bag offsets (rebased to 0), the    (during the step before,
 *                keys table by table -> the pinned slot of    see below; the step two
 *                this step, on the OpenMP threads             back, which read the slot,
 *                                                             is done with it)
 *   copy stream  slot -> device                               event STAGED[slot]
 *   compute      wait STAGED[slot]; dedupe: per table the distinct keys by
 *                owner, the inverse index, the counts (-> host)
 *   host         the counts to the owners (MPI, control)
 *   compute      keys to their owners (one all-to-all, all tables); the
 *                owners find or insert them in all their tables (one call,
 *                one synchronization) and read the rows; rows back (one
 *                all-to-all)
 *   compute      gather -> E; dense forward/backward -> dE; reduce per
 *                slot (sorted; the position counts from the host), event
 *                FREE[slot]; each table's slots added in slot order into
 *                float64 gradients
 *   -- train_dev_front ends; the loop reads the next batch and stages it
 *      (train_dev_stage: host into the other slot, the copy stream to the
 *      device), so its copy overlaps what follows --
 *   compute      gradients to the owners (one all-to-all); each owner sums
 *                a row's gradients in source-rank order (sorted) and rounds
 *                once (all tables, one synchronization); the fused sparse
 *                update
 *   host         the dense allreduce (through the same communicator) and
 *                the dense step (train_dev_back)
 *
 * With the exchange on the device a step waits for the device five times
 * whatever the table count (dedupe's counts, find, the dense sums, the
 * reduce's and the owners' row counts), plus the dense allreduce with
 * several ranks.
 *
 * The all-to-alls go through shard_comm on device buffers: NCCL on GPUs, MPI on
 * the stand-in's host memory; one rank copies. Where NCCL cannot be had
 * (more ranks than GPUs on a host) or with --device-exchange host, the
 * exchange is the host's (shard/'s exchange over MPI, the owners' rows and gradients
 * through the host) and the rest of the step stays on the device.
 *
 * The first step of a reader, and any step whose batch was not staged ahead,
 * stages its own batch at the start, where the copy overlaps the lookup.
 *
 * Gradients differ from the CPU step in their last bits: each slot's rows
 * are summed in float32 on the device before the tables add slots (float64
 * on the device exchange, double-double on the host's), where the CPU adds
 * every position in double-double. So a GPU run's results depend on the rank
 * count (the CPU's do not); the loss curves agree to about 1e-6 (docs/gpu.md).
 */
#include "train_dev.h"
#include "train_int.h"

/* Events: STAGED + slot (the copy stream staged the slot), FREE + slot (the
 * compute stream is done reading it), RESULTS (the step's gradients reached
 * the pinned buffers), and the two that quiesce() records. */
enum { EV_STAGED = 0, EV_FREE = 2, EV_RESULTS = 4, EV_QUIET_COPY = 5, EV_QUIET_COMPUTE = 6 };

/* A buffer on the device, and its pinned host twin where the step has one. */
typedef struct {
    void *h, *d;
    size_t cap;
} dbuf_t;

struct train_dev {
    const dev_ops_t *ops;
    void *ctx;
    int slot;             /* the staging slot of this step: 0, 1, 0, ... */
    int staged_n;         /* rows staged ahead into slot; -1: none */
    dbuf_t X[2], y[2];    /* staging: (max_batch, F), (max_batch) */
    dbuf_t offs[2];       /* staging: the bag offsets rebased to 0, (S, n + 1) */
    int64_t *npos;        /* (S) the positions of slot s in this step */
    dbuf_t vals, rows;    /* the step's lookup: rows of all tables, inverse */
    dbuf_t E;             /* (max_batch, S, d), device only */
    dbuf_t grows, ggrads; /* the reduce's output, per slot at goff[s] */
    int64_t *voff, *roff; /* (T) where table t starts in vals (rows) and rows (keys) */
    int64_t *goff;        /* (S) where slot s's reduce output starts */
    kern_bags_t *dbags;   /* (S) the bags with device pointers */
    kern_row_grads_t *dg; /* (S) */
    uint64_t version;     /* of the host dense params */

    /* The exchange on the device (dx); layouts in keys (rows): table-major
     * (table t, then rank r within it) and rank-major (rank r, then table t:
     * what an all-to-all sends or receives). */
    bool dx;
    shard_comm_t *comm; /* device buffers; NULL with one rank */
    int R;
    int64_t *koff, *uoff, *ooff; /* (T + 1) table starts: batch keys, distinct keys, owner's keys */
    int64_t *cnt, *rcnt;         /* (R, T) keys this rank asks of owner r; requester r asks of it */
    size_t *sc, *sd, *rc, *rd;   /* (R) one all-to-all's bytes and displacements */
    dev_seg_t *segs;             /* (R * T) */
    kern_row_grads_t *ug;        /* (T) the owner's update */
    dbuf_t K[2];                 /* staging: the batch's keys, table by table (with X and y) */
    int64_t nk[2];               /* keys staged into K[slot] */
    int64_t *kpos;               /* (T + 1) stage()'s scratch */
    int64_t *kdst;               /* (S) stage()'s scratch: where slot s's keys go in K */
    int64_t *tpos;               /* (T) transpose()'s scratch */
    dbuf_t uniq;                 /* the distinct keys */
    dbuf_t xs, xr;               /* rank-major: what an all-to-all sends, receives */
    dbuf_t okeys, orows, ovals;  /* the owner's: keys, rows, values (table-major) */
    dbuf_t tg, ograd;            /* float64 gradients: requester's, owner's (table-major) */
    dbuf_t urows, ugrads;        /* the owner's distinct rows and their float32 sums */
    dbuf_t pairs;                /* the dense gradients' pairs (pinned) */
};

/* Waits for both streams: before a buffer they may use is replaced. */
static int quiesce(train_dev_t *dv)
{
    const dev_ops_t *o = dv->ops;
    KILN_CHECK(o->record(dv->ctx, DEV_COPY, EV_QUIET_COPY));
    KILN_CHECK(o->record(dv->ctx, DEV_COMPUTE, EV_QUIET_COMPUTE));
    KILN_CHECK(o->sync(dv->ctx, EV_QUIET_COPY));
    return o->sync(dv->ctx, EV_QUIET_COMPUTE);
}

/* Makes b hold at least bytes (device, and pinned when pinned), waiting for
 * both streams before it replaces a buffer in use. */
static int need(train_dev_t *dv, dbuf_t *b, size_t bytes, bool pinned)
{
    if (bytes <= b->cap && b->d != NULL) /* never NULL: the bags point into it */
        return 0;
    const dev_ops_t *o = dv->ops;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < bytes)
        cap *= 2;
    KILN_CHECK(quiesce(dv));
    o->release(dv->ctx, b->d, false);
    o->release(dv->ctx, b->h, true);
    *b = (dbuf_t){0};
    KILN_CHECK(o->alloc(dv->ctx, cap, false, &b->d));
    if (pinned)
        KILN_CHECK(o->alloc(dv->ctx, cap, true, &b->h));
    b->cap = cap;
    return 0;
}

/* memcpy on the step's OpenMP threads: the batch's copies into pinned
 * memory are the largest host work of a device step (tens of MB at batch
 * 65,536), and one core copies a few GB/s. */
static void copy_par(void *dst, const void *src, size_t bytes)
{
    const size_t chunk = (size_t)1 << 20;
    const int64_t nchunks = (int64_t)((bytes + chunk - 1) / chunk);
    if (nchunks <= 1) {
        memcpy(dst, src, bytes);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        const size_t at = (size_t)c * chunk, len = bytes - at < chunk ? bytes - at : chunk;
        memcpy((char *)dst + at, (const char *)src + at, len);
    }
}

/* The host writes bytes of src into b's pinned buffer at off (bytes). */
static int put(train_dev_t *dv, dbuf_t *b, size_t off, const void *src, size_t bytes)
{
    if (bytes == 0)
        return 0;
    KILN_CHECK(dv->ops->host_touch(dv->ctx, (char *)b->h + off, bytes, true));
    copy_par((char *)b->h + off, src, bytes);
    return 0;
}

int train_dev_create(trainer_t *tr, const dev_ops_t *ops, int device)
{
    train_dev_t *dv = kiln_calloc(1, sizeof *dv);
    if (dv == NULL)
        return KILN_ENOMEM;
    tr->dev = dv;
    dv->ops = ops;
    dv->version = 1;
    dv->staged_n = -1;
    dv->voff = kiln_calloc((size_t)tr->T, sizeof *dv->voff);
    dv->roff = kiln_calloc((size_t)tr->T, sizeof *dv->roff);
    dv->goff = kiln_calloc((size_t)tr->S + 1, sizeof *dv->goff);
    dv->dbags = kiln_calloc((size_t)tr->S + 1, sizeof *dv->dbags);
    dv->dg = kiln_calloc((size_t)tr->S + 1, sizeof *dv->dg);
    dv->npos = kiln_calloc((size_t)tr->S + 1, sizeof *dv->npos);
    const size_t R = (size_t)tr->nranks, T1 = (size_t)tr->T + 1;
    dv->koff = kiln_calloc(T1, sizeof *dv->koff);
    dv->kpos = kiln_calloc(T1, sizeof *dv->kpos);
    dv->kdst = kiln_calloc((size_t)tr->S + 1, sizeof *dv->kdst);
    dv->tpos = kiln_calloc(T1, sizeof *dv->tpos);
    dv->uoff = kiln_calloc(T1, sizeof *dv->uoff);
    dv->ooff = kiln_calloc(T1, sizeof *dv->ooff);
    dv->cnt = kiln_calloc(R * T1, sizeof *dv->cnt);
    dv->rcnt = kiln_calloc(R * T1, sizeof *dv->rcnt);
    dv->segs = kiln_calloc(R * T1, sizeof *dv->segs);
    dv->ug = kiln_calloc(T1, sizeof *dv->ug);
    size_t **zs[] = {&dv->sc, &dv->sd, &dv->rc, &dv->rd};
    for (size_t i = 0; i < 4; i++)
        *zs[i] = kiln_calloc(R, sizeof(size_t));
    if (!dv->voff || !dv->roff || !dv->goff || !dv->dbags || !dv->dg || !dv->npos || !dv->koff ||
        !dv->kpos || !dv->kdst || !dv->tpos || !dv->uoff || !dv->ooff || !dv->cnt || !dv->rcnt ||
        !dv->segs || !dv->ug || !dv->sc || !dv->sd || !dv->rc || !dv->rd)
        return KILN_ENOMEM;
    KILN_CHECK(ops->create(device, &dv->ctx));
    const size_t mb = (size_t)tr->max_batch;
    for (int k = 0; k < 2; k++) {
        KILN_CHECK(need(dv, &dv->X[k], sizeof(float) * mb * (size_t)(tr->F ? tr->F : 1), true));
        KILN_CHECK(need(dv, &dv->y[k], sizeof(float) * mb, true));
        KILN_CHECK(need(dv, &dv->offs[k], sizeof(int64_t) * (size_t)tr->S * (mb + 1), true));
    }
    return need(dv, &dv->E, sizeof(float) * mb * (size_t)tr->S * (size_t)tr->d, false);
}

void train_dev_destroy(train_dev_t *dv)
{
    if (dv == NULL)
        return;
    if (dv->ctx != NULL) {
        (void)quiesce(dv);
        dbuf_t *bufs[] = {&dv->X[0],   &dv->X[1],    &dv->y[0],    &dv->y[1],  &dv->vals,
                          &dv->rows,   &dv->offs[0], &dv->offs[1], &dv->E,     &dv->grows,
                          &dv->ggrads, &dv->K[0],    &dv->K[1],    &dv->uniq,  &dv->xs,
                          &dv->xr,     &dv->okeys,   &dv->orows,   &dv->ovals, &dv->tg,
                          &dv->ograd,  &dv->urows,   &dv->ugrads,  &dv->pairs};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
            dv->ops->release(dv->ctx, bufs[i]->d, false);
            dv->ops->release(dv->ctx, bufs[i]->h, true);
        }
        dv->ops->destroy(dv->ctx);
    }
    KILN_FREE_ALL(dv->voff, dv->roff, dv->goff, dv->dbags, dv->dg, dv->npos, dv->koff, dv->kpos,
                  dv->kdst, dv->tpos, dv->uoff, dv->ooff, dv->cnt, dv->rcnt, dv->sc, dv->sd, dv->rc,
                  dv->rd, dv->segs, dv->ug, dv);
}

/* With the exchange on the device: the batch's keys into K[k], table by
 * table (each table's slots in order, as train_batch_layout places them),
 * and to the device on the copy stream. */
static int stage_keys(trainer_t *tr, train_dev_t *dv, const data_batch_t *b, int k)
{
    const int n = b->n, T = tr->T, S = tr->S;
    int64_t *at = dv->kpos, *dst = dv->kdst;
    memset(at, 0, sizeof *at * (size_t)(T + 1));
    for (int s = 0; s < S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        at[tr->slot_table[s] + 1] += off[n] - off[0];
    }
    for (int t = 0; t < T; t++)
        at[t + 1] += at[t];
    const int64_t nk = at[T];
    for (int s = 0; s < S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        dst[s] = at[tr->slot_table[s]];
        at[tr->slot_table[s]] += off[n] - off[0];
    }
    KILN_CHECK(need(dv, &dv->K[k], sizeof(int64_t) * (size_t)nk, true));
    KILN_CHECK(dv->ops->host_touch(dv->ctx, dv->K[k].h, sizeof(int64_t) * (size_t)nk, true));
    int64_t *K = dv->K[k].h;
#pragma omp parallel for schedule(dynamic, 1)
    for (int s = 0; s < S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1), cnt = off[n] - off[0];
        if (cnt > 0)
            memcpy(K + dst[s], b->keys + off[0], sizeof(int64_t) * (size_t)cnt);
    }
    dv->nk[k] = nk;
    return dv->ops->copy(dv->ctx, DEV_COPY, dv->K[k].d, dv->K[k].h, sizeof(int64_t) * (size_t)nk);
}

/* The batch's bag offsets rebased to 0, slot s at s * (n + 1), into offs[k]
 * and to the device on the copy stream (train_batch_layout's boff, without
 * its max_batch stride, so the copy is of this batch's rows only). */
static int stage_offsets(trainer_t *tr, train_dev_t *dv, const data_batch_t *b, int k)
{
    const int n = b->n, S = tr->S;
    const size_t bytes = sizeof(int64_t) * (size_t)S * (size_t)(n + 1);
    KILN_CHECK(dv->ops->host_touch(dv->ctx, dv->offs[k].h, bytes, true));
    int64_t *bo = dv->offs[k].h;
#pragma omp parallel for schedule(static)
    for (int s = 0; s < S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        int64_t *o = bo + (int64_t)s * (n + 1);
        for (int i = 0; i <= n; i++)
            o[i] = off[i] - off[0];
    }
    return dv->ops->copy(dv->ctx, DEV_COPY, dv->offs[k].d, dv->offs[k].h, bytes);
}

/* X, y, the bag offsets (and with the exchange on the device, the keys) of
 * the batch through this step's pinned slot to the device, on the copy
 * stream. */
static int stage(trainer_t *tr, train_dev_t *dv, const data_batch_t *b)
{
    const dev_ops_t *o = dv->ops;
    const int k = dv->slot;
    const size_t xb = sizeof(float) * (size_t)b->n * (size_t)tr->F,
                 yb = sizeof(float) * (size_t)b->n;
    KILN_CHECK(o->sync(dv->ctx, EV_FREE + k)); /* the step two back is done with the slot */
    KILN_CHECK(put(dv, &dv->X[k], 0, b->dense, xb));
    KILN_CHECK(put(dv, &dv->y[k], 0, b->labels, yb));
    KILN_CHECK(o->copy(dv->ctx, DEV_COPY, dv->X[k].d, dv->X[k].h, xb));
    KILN_CHECK(o->copy(dv->ctx, DEV_COPY, dv->y[k].d, dv->y[k].h, yb));
    KILN_CHECK(stage_offsets(tr, dv, b, k));
    if (dv->dx)
        KILN_CHECK(stage_keys(tr, dv, b, k));
    return o->record(dv->ctx, DEV_COPY, EV_STAGED + k);
}

/* The bags with device pointers: the offsets staged into offs[slot], the
 * rows of table t at vals + voff[t], its inverse index at rows + roff[t]. */
static void make_bags(trainer_t *tr, train_dev_t *dv, int n)
{
    for (int s = 0; s < tr->S; s++) {
        const int t = tr->slot_table[s];
        dv->dbags[s] = (kern_bags_t){
            .values = (const float *)dv->vals.d + dv->voff[t],
            .capacity = tr->nuniq[t],
            .dim = tr->d,
            .combine = tr->combine[s],
            .offsets = (const int64_t *)dv->offs[dv->slot].d + (int64_t)s * (n + 1),
            .rows = (const int32_t *)dv->rows.d + dv->roff[t] + tr->slot_koff[s],
            .out_col = (int64_t)s * tr->d,
        };
    }
}

/* Where each slot's keys go in its table's list (tr->tn, tr->slot_koff)
 * and each slot's positions (npos): train_batch_layout without the
 * rebased offsets, which the step stages itself (stage_offsets). */
static void layout(trainer_t *tr, train_dev_t *dv, const data_batch_t *b)
{
    const int n = b->n;
    for (int t = 0; t < tr->T; t++)
        tr->tn[t] = 0;
    for (int s = 0; s < tr->S; s++) {
        const int64_t *off = b->offsets + (int64_t)s * (n + 1);
        const int t = tr->slot_table[s];
        tr->slot_koff[s] = tr->tn[t];
        dv->npos[s] = off[n] - off[0];
        tr->tn[t] += dv->npos[s];
    }
}

/* Where table t's rows start in vals (floats) and its keys in rows. */
static void table_starts(trainer_t *tr, train_dev_t *dv)
{
    int64_t nv = 0, nr = 0;
    for (int t = 0; t < tr->T; t++) {
        dv->voff[t] = nv;
        dv->roff[t] = nr;
        nv += tr->nuniq[t] * tr->d;
        nr += tr->tn[t];
    }
}

/* The host exchange's lookup (tr->tvalues, tr->tinv) to the device, on the
 * compute stream. */
static int send_lookup(trainer_t *tr, train_dev_t *dv)
{
    const dev_ops_t *o = dv->ops;
    const int T = tr->T, d = tr->d;
    table_starts(tr, dv);
    const int64_t nv = dv->voff[T - 1] + tr->nuniq[T - 1] * d, nr = dv->roff[T - 1] + tr->tn[T - 1];
    /* The pinned buffers are free: the last step waited for the compute
     * stream's copies out of them (reduce_grads). */
    KILN_CHECK(need(dv, &dv->vals, sizeof(float) * (size_t)nv, true));
    KILN_CHECK(need(dv, &dv->rows, sizeof(int32_t) * (size_t)nr, true));
    for (int t = 0; t < T; t++) {
        KILN_CHECK(put(dv, &dv->vals, sizeof(float) * (size_t)dv->voff[t], tr->tvalues[t],
                       sizeof(float) * (size_t)(tr->nuniq[t] * d)));
        KILN_CHECK(put(dv, &dv->rows, sizeof(int32_t) * (size_t)dv->roff[t], tr->tinv[t],
                       sizeof(int32_t) * (size_t)tr->tn[t]));
    }
    KILN_CHECK(o->copy(dv->ctx, DEV_COMPUTE, dv->vals.d, dv->vals.h, sizeof(float) * (size_t)nv));
    return o->copy(dv->ctx, DEV_COMPUTE, dv->rows.d, dv->rows.h, sizeof(int32_t) * (size_t)nr);
}

/* Reduces dE per slot on the device into grows / ggrads (slot s at goff[s]). */
static int reduce_slots(trainer_t *tr, train_dev_t *dv, int n)
{
    const int S = tr->S, d = tr->d;
    int64_t np = 0;
    for (int s = 0; s < S; s++) {
        dv->goff[s] = np;
        np += dv->npos[s];
    }
    dv->goff[S] = np;
    KILN_CHECK(need(dv, &dv->grows, sizeof(int32_t) * (size_t)np, !dv->dx));
    KILN_CHECK(need(dv, &dv->ggrads, sizeof(float) * (size_t)(np * d), !dv->dx));
    for (int s = 0; s < S; s++)
        dv->dg[s] = (kern_row_grads_t){(int32_t *)dv->grows.d + dv->goff[s],
                                       (float *)dv->ggrads.d + dv->goff[s] * d, 0};
    return dv->ops->reduce(dv->ctx, S, dv->dbags, n, dv->npos, (int64_t)S * d, dv->E.d, dv->dg);
}

/* The host exchange: each slot's row sums to the host, added into its
 * table's double-double gradients (in slot order). */
static int grads_to_host(trainer_t *tr, train_dev_t *dv)
{
    const dev_ops_t *o = dv->ops;
    const int S = tr->S, T = tr->T, d = tr->d;
    const int64_t np = dv->goff[S];
    KILN_CHECK(
        o->copy(dv->ctx, DEV_COMPUTE, dv->grows.h, dv->grows.d, sizeof(int32_t) * (size_t)np));
    KILN_CHECK(o->copy(dv->ctx, DEV_COMPUTE, dv->ggrads.h, dv->ggrads.d,
                       sizeof(float) * (size_t)(np * d)));
    KILN_CHECK(o->record(dv->ctx, DEV_COMPUTE, EV_RESULTS));
    KILN_CHECK(o->sync(dv->ctx, EV_RESULTS));
    KILN_CHECK(o->host_touch(dv->ctx, dv->grows.h, sizeof(int32_t) * (size_t)np, false));
    KILN_CHECK(o->host_touch(dv->ctx, dv->ggrads.h, sizeof(float) * (size_t)(np * d), false));
    for (int t = 0; t < T; t++)
        if (tr->nuniq[t] > 0)
            memset(tr->tgrad[t], 0, sizeof(double) * 2 * (size_t)(tr->nuniq[t] * d));
    for (int s = 0; s < S; s++) {
        double *g = tr->tgrad[tr->slot_table[s]]; /* (nuniq, d, 2) */
        const int32_t *rows = (const int32_t *)dv->grows.h + dv->goff[s];
        const float *sums = (const float *)dv->ggrads.h + dv->goff[s] * d;
        for (int64_t u = 0; u < dv->dg[s].n; u++) {
            double *acc = g + 2 * (int64_t)rows[u] * d;
            for (int j = 0; j < d; j++)
                kern_dd_add(&acc[2 * j], &acc[2 * j + 1], (double)sums[u * d + j]);
        }
    }
    return 0;
}

/* ---- the exchange on the device -------------------------------------------------------- */

/* The pieces that move rows of `row` bytes between a table-major buffer
 * (table t from tstart[t] rows, rank r's part after ranks 0..r-1's) and a
 * rank-major one (rank r's part, then its tables in order) for the count
 * matrix cnt (R, T), into dv->segs: table-major to rank-major when to_rank,
 * else back. Fills the rank-major side's bytes and displacements per rank
 * in counts and displs. Returns the number of pieces. */
static int transpose(train_dev_t *dv, int T, const int64_t *cnt, const int64_t *tstart, size_t row,
                     bool to_rank, size_t *counts, size_t *displs)
{
    int64_t *tm = dv->tpos; /* table-major: where rank r's part of table t starts, in rows */
    memcpy(tm, tstart, sizeof *tm * (size_t)T);
    int nseg = 0;
    size_t at = 0; /* rank-major, rows */
    for (int r = 0; r < dv->R; r++) {
        displs[r] = at * row;
        for (int t = 0; t < T; t++) {
            const int64_t n = cnt[(int64_t)r * T + t];
            const size_t a = (size_t)tm[t] * row, b = at * row;
            if (n > 0)
                dv->segs[nseg++] = (dev_seg_t){to_rank ? a : b, to_rank ? b : a, (size_t)n * row};
            tm[t] += n;
            at += (size_t)n;
        }
        counts[r] = at * row - displs[r];
    }
    return nseg;
}

/* One all-to-all of the rank-major buffers xs -> xr (dv->sc, sd, rc, rd);
 * with one rank, a copy. */
static int exchange(train_dev_t *dv)
{
    if (dv->comm == NULL)
        return dv->ops->copy(dv->ctx, DEV_COMPUTE, dv->xr.d, dv->xs.d, dv->sc[0]);
    return dv->ops->alltoallv(dv->ctx, dv->comm, dv->xs.d, dv->sc, dv->sd, dv->xr.d, dv->rc,
                              dv->rd);
}

/* Table-major src (this rank's counts cnt, tables at sstart) to the owners,
 * who receive it table-major in dst (their counts rcnt, tables at dstart);
 * or, when back, the owners' table-major src to the requesters. */
static int move(trainer_t *tr, train_dev_t *dv, const void *src, const int64_t *sstart, void *dst,
                const int64_t *dstart, size_t row, bool back)
{
    const dev_ops_t *o = dv->ops;
    const int T = tr->T;
    const int64_t *scnt = back ? dv->rcnt : dv->cnt, *rcnt = back ? dv->cnt : dv->rcnt;
    const int last = dv->R - 1;
    int nseg = transpose(dv, T, scnt, sstart, row, true, dv->sc, dv->sd);
    KILN_CHECK(need(dv, &dv->xs, dv->sd[last] + dv->sc[last], false));
    KILN_CHECK(o->permute(dv->ctx, dv->xs.d, src, nseg, dv->segs));
    nseg = transpose(dv, T, rcnt, dstart, row, false, dv->rc, dv->rd);
    KILN_CHECK(need(dv, &dv->xr, dv->rd[last] + dv->rc[last], false));
    KILN_CHECK(exchange(dv));
    return o->permute(dv->ctx, dst, dv->xr.d, nseg, dv->segs);
}

/* starts (T + 1): where each table's part starts in a table-major buffer
 * holding cnt (R, T), rows, and the total at starts[T]. */
static void table_major_starts(const train_dev_t *dv, int T, const int64_t *cnt, int64_t *starts)
{
    starts[0] = 0;
    for (int t = 0; t < T; t++) {
        starts[t + 1] = starts[t];
        for (int r = 0; r < dv->R; r++)
            starts[t + 1] += cnt[(int64_t)r * T + t];
    }
}

/* The batch's keys, staged into K[k] (train_batch_layout's order),
 * deduped on the device: tr->nuniq, dv->cnt, the distinct keys in uniq and
 * the inverse index in rows. */
static int dedupe_keys(trainer_t *tr, train_dev_t *dv, int n, int k)
{
    const dev_ops_t *o = dv->ops;
    const int T = tr->T;
    dv->koff[0] = 0;
    for (int t = 0; t < T; t++)
        dv->koff[t + 1] = dv->koff[t] + tr->tn[t];
    const int64_t nk = dv->koff[T];
    if (n > 0 && nk != dv->nk[k])
        return kiln_errf(KILN_EINTERNAL, "the device step: %lld keys staged, the step has %lld",
                         (long long)dv->nk[k], (long long)nk);
    KILN_CHECK(need(dv, &dv->uniq, sizeof(int64_t) * (size_t)nk, false));
    KILN_CHECK(need(dv, &dv->rows, sizeof(int32_t) * (size_t)nk, false));
    if (n > 0)
        KILN_CHECK(o->wait(dv->ctx, DEV_COMPUTE, EV_STAGED + k));
    KILN_CHECK(o->dedupe(dv->ctx, T, dv->koff, dv->K[k].d, dv->R, dv->uniq.d, dv->rows.d, dv->cnt));
    table_major_starts(dv, T, dv->cnt, dv->uoff);
    for (int t = 0; t < T; t++)
        tr->nuniq[t] = dv->uoff[t + 1] - dv->uoff[t];
    return 0;
}

/* The lookup: keys to their owners, who find or insert them and read their
 * rows, and the rows back into vals (table t at voff[t]). */
static int lookup_dev(trainer_t *tr, train_dev_t *dv, int64_t step)
{
    const dev_ops_t *o = dv->ops;
    const int T = tr->T, d = tr->d;
    /* How many keys each requester asks of this rank: control, on MPI. */
    KILN_CHECK(shard_comm_alltoall(tr->comm, dv->cnt, dv->rcnt, sizeof(int64_t) * (size_t)T));
    table_major_starts(dv, T, dv->rcnt, dv->ooff);
    const int64_t m = dv->ooff[T];
    KILN_CHECK(need(dv, &dv->okeys, sizeof(int64_t) * (size_t)m, false));
    KILN_CHECK(need(dv, &dv->orows, sizeof(int32_t) * (size_t)m, false));
    KILN_CHECK(need(dv, &dv->ovals, sizeof(float) * (size_t)(m * d), false));
    KILN_CHECK(need(dv, &dv->vals, sizeof(float) * (size_t)(dv->uoff[T] * d), false));
    KILN_CHECK(move(tr, dv, dv->uniq.d, dv->koff, dv->okeys.d, dv->ooff, sizeof(int64_t), false));
    /* Every table in one call: one synchronization. */
    const int rc = m > 0 ? o->find(dv->ctx, tr->store, T, dv->ooff, (const int64_t *)dv->okeys.d,
                                   step, true, (int32_t *)dv->orows.d)
                         : 0;
    /* Every rank must learn whether any owner failed before going on. */
    int worst = shard_comm_agree(tr->comm, rc, "the embedding lookup");
    if (worst < 0)
        return rc < 0 ? rc : worst;
    for (int t = 0; t < T; t++) {
        const int64_t o0 = dv->ooff[t], mt = dv->ooff[t + 1] - o0;
        if (mt > 0)
            KILN_CHECK(o->read(dv->ctx, tr->store, t, mt, (const int32_t *)dv->orows.d + o0, d,
                               (float *)dv->ovals.d + o0 * d));
    }
    KILN_CHECK(move(tr, dv, dv->ovals.d, dv->ooff, dv->vals.d, dv->uoff, sizeof(float) * d, true));
    for (int t = 0; t < T; t++) {
        dv->voff[t] = dv->uoff[t] * d;
        dv->roff[t] = dv->koff[t];
    }
    return 0;
}

/* Each slot's row sums added into its table's float64 gradients tg (table
 * t at uoff[t]), slot by slot in order. */
static int grads_to_tables(trainer_t *tr, train_dev_t *dv)
{
    const dev_ops_t *o = dv->ops;
    const int d = tr->d;
    const int64_t nu = dv->uoff[tr->T];
    KILN_CHECK(need(dv, &dv->tg, sizeof(double) * (size_t)(nu * d), false));
    KILN_CHECK(o->zero(dv->ctx, dv->tg.d, sizeof(double) * (size_t)(nu * d)));
    for (int s = 0; s < tr->S; s++) {
        const int t = tr->slot_table[s];
        if (dv->dg[s].n > 0)
            KILN_CHECK(o->accum(dv->ctx, dv->dg[s].n, dv->dg[s].rows, dv->dg[s].grads, d,
                                tr->nuniq[t], (double *)dv->tg.d + dv->uoff[t] * d));
    }
    return 0;
}

/* The update: gradients to the owners, each owner's sums per row, the
 * fused sparse update. */
static int update_dev(trainer_t *tr, train_dev_t *dv, int64_t step)
{
    const dev_ops_t *o = dv->ops;
    const int T = tr->T, d = tr->d;
    const int64_t m = dv->ooff[T];
    KILN_CHECK(need(dv, &dv->ograd, sizeof(double) * (size_t)(m * d), false));
    KILN_CHECK(need(dv, &dv->urows, sizeof(int32_t) * (size_t)m, false));
    KILN_CHECK(need(dv, &dv->ugrads, sizeof(float) * (size_t)(m * d), false));
    KILN_CHECK(move(tr, dv, dv->tg.d, dv->uoff, dv->ograd.d, dv->ooff, sizeof(double) * d, false));
    for (int t = 0; t < T; t++) {
        const int64_t o0 = dv->ooff[t];
        dv->ug[t] =
            (kern_row_grads_t){(int32_t *)dv->urows.d + o0, (float *)dv->ugrads.d + o0 * d, 0};
    }
    KILN_CHECK(o->combine(dv->ctx, T, dv->ooff, (const int32_t *)dv->orows.d,
                          (const double *)dv->ograd.d, d, dv->ug));
    return o->update(dv->ctx, tr->store, T, &tr->sparse_opt, dv->ug, d, step);
}

void train_dev_exchange_on(trainer_t *tr, shard_comm_t *comm)
{
    train_dev_t *dv = tr->dev;
    dv->dx = true;
    dv->comm = comm;
    dv->R = tr->nranks;
}

/* shard_comm_allreduce_sum_dd of the dense gradients: on the device's
 * communicator when the step exchanges on the device, else on tr->comm. */
static int allreduce_dd(trainer_t *tr, double *pairs, size_t npairs)
{
    train_dev_t *dv = tr->dev;
    if (!dv->dx || dv->comm == NULL)
        return shard_comm_allreduce_sum_dd(tr->comm, pairs, npairs);
    const dev_ops_t *o = dv->ops;
    const size_t bytes = 2 * sizeof(double) * npairs;
    KILN_CHECK(need(dv, &dv->pairs, bytes, true));
    KILN_CHECK(put(dv, &dv->pairs, 0, pairs, bytes));
    KILN_CHECK(o->copy(dv->ctx, DEV_COMPUTE, dv->pairs.d, dv->pairs.h, bytes));
    KILN_CHECK(o->allreduce_dd(dv->ctx, dv->comm, dv->pairs.d, npairs));
    KILN_CHECK(o->copy(dv->ctx, DEV_COMPUTE, dv->pairs.h, dv->pairs.d, bytes));
    KILN_CHECK(o->record(dv->ctx, DEV_COMPUTE, EV_RESULTS));
    KILN_CHECK(o->sync(dv->ctx, EV_RESULTS));
    KILN_CHECK(o->host_touch(dv->ctx, dv->pairs.h, bytes, false));
    memcpy(pairs, dv->pairs.h, bytes);
    return 0;
}

int train_dev_stage(trainer_t *tr, const data_batch_t *next)
{
    train_dev_t *dv = tr->dev;
    if (next->n == 0) /* nothing to copy; its step stages nothing either */
        return 0;
    KILN_CHECK(stage(tr, dv, next));
    dv->staged_n = next->n;
    return 0;
}

int train_dev_front(trainer_t *tr, const data_batch_t *b, int64_t step, int64_t global_n,
                    double *loss_sum)
{
    train_dev_t *dv = tr->dev;
    const dev_ops_t *o = dv->ops;
    const int n = b->n, S = tr->S, T = tr->T, d = tr->d, k = dv->slot;
    *loss_sum = 0.0;
    if (dv->staged_n >= 0 && dv->staged_n != n)
        return kiln_errf(KILN_EINTERNAL, "the device step: %d rows staged ahead, the step has %d",
                         dv->staged_n, n);
    if (n > 0 && dv->staged_n < 0)
        KILN_CHECK(stage(tr, dv, b));
    dv->staged_n = -1;
    layout(tr, dv, b);
    if (dv->dx) {
        KILN_CHECK(dedupe_keys(tr, dv, n, k));
        KILN_CHECK(lookup_dev(tr, dv, step));
    } else {
        KILN_CHECK(train_lookup_keys(tr, b, step, true));
        for (int t = 0; t < T; t++)
            KILN_CHECK(kiln_grow_to((void **)&tr->tgrad[t], &tr->tgrad_cap[t], tr->nuniq[t] * d,
                                    2 * sizeof(double), 1024));
        if (n > 0)
            KILN_CHECK(send_lookup(tr, dv));
    }
    if (n == 0) {
        for (int t = 0; t < T && !dv->dx; t++)
            if (tr->nuniq[t] > 0)
                memset(tr->tgrad[t], 0, sizeof(double) * 2 * (size_t)(tr->nuniq[t] * d));
        return 0;
    }
    if (!dv->dx) /* the device exchange waited for the staged batch before its dedupe */
        KILN_CHECK(o->wait(dv->ctx, DEV_COMPUTE, EV_STAGED + k));
    make_bags(tr, dv, n);
    KILN_CHECK(o->gather(dv->ctx, S, dv->dbags, n, (int64_t)S * d, dv->E.d));
    const dev_dense_t a = {
        .model = tr->model,
        .params_version = dv->version,
        .n = n,
        .E = dv->E.d,
        .X = dv->X[k].d,
        .y = dv->y[k].d,
        .scale = 1.0f / (float)global_n,
        .dE = dv->E.d, /* dE replaces E, as on the CPU */
    };
    KILN_CHECK(o->dense(dv->ctx, &a, loss_sum));
    KILN_CHECK(reduce_slots(tr, dv, n));
    /* After the reduce, which still reads the slot's bag offsets. */
    KILN_CHECK(o->record(dv->ctx, DEV_COMPUTE, EV_FREE + k));
    dv->slot ^= 1;
    return dv->dx ? grads_to_tables(tr, dv) : grads_to_host(tr, dv);
}

int train_dev_back(trainer_t *tr, int64_t step)
{
    if (tr->dev->dx)
        KILN_CHECK(update_dev(tr, tr->dev, step));
    else
        KILN_CHECK(
            shard_update(tr->shard, (const double *const *)tr->tgrad, &tr->sparse_opt, step));
    KILN_CHECK(train_dense_update(tr, allreduce_dd));
    tr->dev->version++; /* the dense step changed the host params */
    return 0;
}
