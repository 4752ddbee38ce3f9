/*
 * trainer/train_dev.c - the device step: train_step with the pooling, the
 * dense model (lr, fm, dlrm) and the backward reduce on a device (train_dev.h),
 * the CUDA runtime on a GPU or the host stand-in in CI. One step of a rank:
 *
 *   host         X, y -> the pinned slot of this step        (during the step before,
 *                                                             see below; the step two
 *                                                             back, which read the slot,
 *                                                             is done with it)
 *   copy stream  slot -> device                               event STAGED[slot]
 *   host         keys, dedupe, the lookup exchange
 *   host         rows, inverse index, bag offsets -> pinned
 *   compute      pinned -> device; wait STAGED[slot];
 *                gather -> E; dense forward/backward -> dE     event FREE[slot]
 *                reduce: per slot, unique rows and summed grads; -> host
 *   host         slot sums -> each table's double-double gradients
 *   -- train_dev_front ends; the loop reads the next batch and stages it
 *      (train_dev_stage: host into the other slot, the copy stream to the
 *      device), so its copy overlaps what follows --
 *   host         the update exchange and the dense allreduce and step, as
 *                on the CPU (train_dev_back)
 *
 * The first step of a reader, and any step whose batch was not staged ahead,
 * stages its own batch at the start, where the copy overlaps the lookup.
 *
 * Exchanges stay MPI over host buffers (shard.h) and the owners' tables stay
 * in the rank's store. Gradients differ from the CPU step in their last bits:
 * each slot's rows are summed in float32 on the device before the tables add
 * slots in double-double, where the CPU adds every position in double-double.
 * So a GPU run's results depend on the rank count (the CPU's do not); the
 * loss curves agree to about 1e-6 (docs/gpu.md).
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
    int slot;                /* the staging slot of this step: 0, 1, 0, ... */
    int staged_n;            /* rows staged ahead into slot; -1: none */
    dbuf_t X[2], y[2];       /* staging: (max_batch, F), (max_batch) */
    dbuf_t vals, rows, offs; /* the step's lookup: rows of all tables, inverse, bags */
    dbuf_t E;                /* (max_batch, S, d), device only */
    dbuf_t grows, ggrads;    /* the reduce's output, per slot at goff[s] */
    int64_t *voff, *roff;    /* (T) where table t starts in vals (rows) and rows (keys) */
    int64_t *goff;           /* (S) where slot s's reduce output starts */
    kern_bags_t *dbags;      /* (S) the bags with device pointers */
    kern_row_grads_t *dg;    /* (S) */
    uint64_t version;        /* of the host dense params */
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

/* The host writes bytes of src into b's pinned buffer at off (bytes). */
static int put(train_dev_t *dv, dbuf_t *b, size_t off, const void *src, size_t bytes)
{
    if (bytes == 0)
        return 0;
    KILN_CHECK(dv->ops->host_touch(dv->ctx, (char *)b->h + off, bytes, true));
    memcpy((char *)b->h + off, src, bytes);
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
    if (!dv->voff || !dv->roff || !dv->goff || !dv->dbags || !dv->dg)
        return KILN_ENOMEM;
    KILN_CHECK(ops->create(device, &dv->ctx));
    const size_t mb = (size_t)tr->max_batch;
    for (int k = 0; k < 2; k++) {
        KILN_CHECK(need(dv, &dv->X[k], sizeof(float) * mb * (size_t)(tr->F ? tr->F : 1), true));
        KILN_CHECK(need(dv, &dv->y[k], sizeof(float) * mb, true));
    }
    KILN_CHECK(need(dv, &dv->offs, sizeof(int64_t) * (size_t)tr->S * (mb + 1), true));
    return need(dv, &dv->E, sizeof(float) * mb * (size_t)tr->S * (size_t)tr->d, false);
}

void train_dev_destroy(train_dev_t *dv)
{
    if (dv == NULL)
        return;
    if (dv->ctx != NULL) {
        (void)quiesce(dv);
        dbuf_t *bufs[] = {&dv->X[0], &dv->X[1], &dv->y[0], &dv->y[1],  &dv->vals,
                          &dv->rows, &dv->offs, &dv->E,    &dv->grows, &dv->ggrads};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
            dv->ops->release(dv->ctx, bufs[i]->d, false);
            dv->ops->release(dv->ctx, bufs[i]->h, true);
        }
        dv->ops->destroy(dv->ctx);
    }
    KILN_FREE_ALL(dv->voff, dv->roff, dv->goff, dv->dbags, dv->dg, dv);
}

/* X and y of the batch through this step's pinned slot to the device, on
 * the copy stream. */
static int stage(trainer_t *tr, train_dev_t *dv, const rt_batch_t *b)
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
    return o->record(dv->ctx, DEV_COPY, EV_STAGED + k);
}

/* The looked-up rows of every table, the inverse index of every table's
 * keys and the bag offsets to the device, on the compute stream, and the
 * bags with device pointers. */
static int send_lookup(trainer_t *tr, train_dev_t *dv)
{
    const dev_ops_t *o = dv->ops;
    const int S = tr->S, T = tr->T, d = tr->d;
    int64_t nv = 0, nr = 0;
    for (int t = 0; t < T; t++) {
        dv->voff[t] = nv;
        dv->roff[t] = nr;
        nv += tr->nuniq[t] * d;
        nr += tr->tn[t];
    }
    const size_t ob = sizeof(int64_t) * (size_t)S * (size_t)(tr->max_batch + 1);
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
    KILN_CHECK(put(dv, &dv->offs, 0, tr->boff, ob));
    KILN_CHECK(o->copy(dv->ctx, DEV_COMPUTE, dv->vals.d, dv->vals.h, sizeof(float) * (size_t)nv));
    KILN_CHECK(o->copy(dv->ctx, DEV_COMPUTE, dv->rows.d, dv->rows.h, sizeof(int32_t) * (size_t)nr));
    KILN_CHECK(o->copy(dv->ctx, DEV_COMPUTE, dv->offs.d, dv->offs.h, ob));
    for (int s = 0; s < S; s++) {
        const int t = tr->slot_table[s];
        dv->dbags[s] = tr->bags[s];
        dv->dbags[s].values = (const float *)dv->vals.d + dv->voff[t];
        dv->dbags[s].rows = (const int32_t *)dv->rows.d + dv->roff[t] + tr->slot_koff[s];
        dv->dbags[s].offsets = (const int64_t *)dv->offs.d + (int64_t)s * (tr->max_batch + 1);
    }
    return 0;
}

/* Reduces dE per slot on the device and adds each slot's row sums into its
 * table's double-double gradients (in slot order), on the host. */
static int reduce_grads(trainer_t *tr, train_dev_t *dv, int n)
{
    const dev_ops_t *o = dv->ops;
    const int S = tr->S, T = tr->T, d = tr->d;
    int64_t np = 0;
    for (int s = 0; s < S; s++) {
        dv->goff[s] = np;
        np += tr->bags[s].offsets[n];
    }
    KILN_CHECK(need(dv, &dv->grows, sizeof(int32_t) * (size_t)np, true));
    KILN_CHECK(need(dv, &dv->ggrads, sizeof(float) * (size_t)(np * d), true));
    for (int s = 0; s < S; s++)
        dv->dg[s] = (kern_row_grads_t){(int32_t *)dv->grows.d + dv->goff[s],
                                       (float *)dv->ggrads.d + dv->goff[s] * d, 0};
    const int64_t ld = (int64_t)S * d;
    KILN_CHECK(o->reduce(dv->ctx, S, dv->dbags, n, ld, dv->E.d, dv->dg));
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

int train_dev_stage(trainer_t *tr, const rt_batch_t *next)
{
    train_dev_t *dv = tr->dev;
    if (next->n == 0) /* nothing to copy; its step stages nothing either */
        return 0;
    KILN_CHECK(stage(tr, dv, next));
    dv->staged_n = next->n;
    return 0;
}

int train_dev_front(trainer_t *tr, const rt_batch_t *b, int64_t step, int64_t global_n,
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
    KILN_CHECK(train_lookup_keys(tr, b, step, true));
    for (int t = 0; t < T; t++)
        KILN_CHECK(kiln_grow_to((void **)&tr->tgrad[t], &tr->tgrad_cap[t], tr->nuniq[t] * d,
                                2 * sizeof(double), 1024));
    if (n > 0) {
        KILN_CHECK(send_lookup(tr, dv));
        KILN_CHECK(o->wait(dv->ctx, DEV_COMPUTE, EV_STAGED + k));
        const int64_t ld = (int64_t)S * d;
        KILN_CHECK(o->gather(dv->ctx, S, dv->dbags, n, ld, dv->E.d));
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
        KILN_CHECK(o->record(dv->ctx, DEV_COMPUTE, EV_FREE + k));
        KILN_CHECK(reduce_grads(tr, dv, n));
        dv->slot ^= 1;
    } else {
        for (int t = 0; t < T; t++)
            if (tr->nuniq[t] > 0)
                memset(tr->tgrad[t], 0, sizeof(double) * 2 * (size_t)(tr->nuniq[t] * d));
    }
    return 0;
}

int train_dev_back(trainer_t *tr, int64_t step)
{
    KILN_CHECK(rt_shard_update(tr->shard, (const double *const *)tr->tgrad, &tr->sparse_opt, step));
    KILN_CHECK(train_dense_update(tr));
    tr->dev->version++; /* the dense step changed the host params */
    return 0;
}
