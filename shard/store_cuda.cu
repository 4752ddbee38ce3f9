/*
 * shard/store_cuda.cu - SHARD_STORE_CUDA's working copy (shard_int.h): this
 * rank's shard of every table in a GPU hash table (kern_cuda_table_t) on the
 * current device. For the host exchange (shard.h, MPI) each op copies its
 * keys, rows or gradients in, runs the kernels of kern_cuda.h on the store's
 * stream, and copies the results out; for the device step's exchange
 * (trainer/train_dev.c) the _dev ops run the same kernels on device arrays
 * on the caller's stream, and two events order the two streams. The row copies in and out are the
 * two small kernels below; the rest is kern_cuda_*.
 *
 * Host transfers go through pinned buffers (cudaHostAlloc, grown as
 * needed), so the copy engine reads and writes them directly instead of
 * through the driver's pageable staging. The update does not wait for the
 * device: it packs the rows and gradients into its own pinned buffer,
 * enqueues the copies and the fused update and returns, so the GPU applies
 * the sparse update while the host goes on with the dense allreduce and
 * the dense step; an event says when that pinned buffer may be written
 * again. Every later call runs on the same stream, so it sees the update
 * done; an error of the update's kernels surfaces at the next call that
 * synchronizes (find, read, sync), named by CUDA's message.
 */
#include <cuda_runtime.h>

#include <new>
#include <stdlib.h>
#include <string.h>

#include "kern_cuda.h"
#include "kiln_cuda.h"
#include "shard_int.h"

namespace {

/* dst (n, width) = src rows rows[i] (row -1: zeros); 32-bit words, so it
 * copies floats and adam counts alike without touching their bits. */
__global__ void read_rows_kernel(const uint32_t *src, int width, const int32_t *rows, int64_t n,
                                 uint32_t *dst)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * width)
        return;
    const int64_t k = i / width, j = i % width;
    const int32_t r = rows[k];
    dst[i] = r >= 0 ? src[(int64_t)r * width + j] : 0u;
}

int read_rows(const void *src, int width, const int32_t *d_rows, int64_t n, void *d_dst,
              cudaStream_t st)
{
    if (n == 0)
        return 0;
    const int64_t total = n * width;
    const unsigned blocks = (unsigned)((total + 255) / 256);
    read_rows_kernel<<<blocks, 256, 0, st>>>((const uint32_t *)src, width, d_rows, n,
                                             (uint32_t *)d_dst);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

/* dst rows rows[i] = src (n, width), 32-bit words. */
__global__ void write_rows_kernel(uint32_t *dst, int width, const int32_t *rows, int64_t n,
                                  const uint32_t *src)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * width)
        return;
    const int64_t k = i / width, j = i % width;
    dst[(int64_t)rows[k] * width + j] = src[i];
}

int write_rows(void *dst, int width, const int32_t *d_rows, int64_t n, const void *d_src,
               cudaStream_t st)
{
    if (n == 0)
        return 0;
    const int64_t total = n * width;
    const unsigned blocks = (unsigned)((total + 255) / 256);
    write_rows_kernel<<<blocks, 256, 0, st>>>((uint32_t *)dst, width, d_rows, n,
                                              (const uint32_t *)d_src);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

/* A buffer that grows: device memory (dbuf) or pinned host memory (pbuf).
 * Growing frees the old one: the caller makes sure no copy or kernel still
 * uses a pinned one (cudaFree waits for the device by itself). */
struct gbuf {
    void *p = nullptr;
    size_t cap = 0;
    bool pinned = false;
};
struct dbuf : gbuf {
};
struct pbuf : gbuf {
    pbuf()
    {
        pinned = true;
    }
};

int need(gbuf *b, size_t bytes)
{
    if (bytes <= b->cap)
        return 0;
    if (b->p)
        CUDA_CHECK(b->pinned ? cudaFreeHost(b->p) : cudaFree(b->p));
    b->p = nullptr;
    b->cap = 0;
    CUDA_CHECK(b->pinned ? cudaHostAlloc(&b->p, bytes ? bytes : 1, cudaHostAllocDefault)
                         : cudaMalloc(&b->p, bytes ? bytes : 1));
    b->cap = bytes ? bytes : 1;
    return 0;
}

int dneed(dbuf *b, size_t bytes)
{
    return need(b, bytes);
}
int pneed(pbuf *b, size_t bytes)
{
    return need(b, bytes);
}

/* A host buffer that grows. */
int hneed(void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return 0;
    free(*p);
    *p = kiln_malloc(bytes ? bytes : 1);
    *cap = *p ? bytes : 0;
    return *p ? 0 : KILN_ENOMEM;
}

struct cuda_work {
    shard_store_work_t base;
    int ntables;
    kern_cuda_table_t **tables;
    int *dims, *nstate;
    cudaStream_t stream;
    dbuf keys, rows, vals, opt, steps; /* staging on the device */
    dbuf *grows, *ggrads;               /* (ntables) the update's rows and gradients */
    pbuf pin;                           /* find and read: keys, rows and values in and out */
    pbuf upd_pin;                       /* the update's rows and gradients, packed */
    cudaEvent_t upd_done = nullptr;     /* the update's copies out of upd_pin are done */
    /* Between the store's stream and a caller's (the _dev calls): the last
     * update on the store's stream, and the last _dev call on the caller's. */
    cudaEvent_t own_done = nullptr, ext_done = nullptr;
    /* host results of changed() */
    void *h_keys = nullptr, *h_vals = nullptr, *h_opt = nullptr, *h_steps = nullptr;
    size_t h_keys_cap = 0, h_vals_cap = 0, h_opt_cap = 0, h_steps_cap = 0;
};

cuda_work *W(shard_store_work_t *w) { return (cuda_work *)w; }
const cuda_work *W(const shard_store_work_t *w) { return (const cuda_work *)w; }

void cw_destroy(shard_store_work_t *w)
{
    cuda_work *c = W(w);
    if (c->stream)
        (void)cudaStreamSynchronize(c->stream); /* an update may be in flight */
    for (int t = 0; c->tables && t < c->ntables; t++)
        kern_cuda_table_destroy(c->tables[t]);
    dbuf *bufs[] = {&c->keys, &c->rows, &c->vals, &c->opt, &c->steps};
    for (dbuf *b : bufs)
        if (b->p)
            cudaFree(b->p);
    for (int t = 0; c->grows && t < c->ntables; t++) {
        if (c->grows[t].p)
            cudaFree(c->grows[t].p);
        if (c->ggrads[t].p)
            cudaFree(c->ggrads[t].p);
    }
    pbuf *pins[] = {&c->pin, &c->upd_pin};
    for (pbuf *b : pins)
        if (b->p)
            cudaFreeHost(b->p);
    cudaEvent_t evs[] = {c->upd_done, c->own_done, c->ext_done};
    for (cudaEvent_t e : evs)
        if (e)
            cudaEventDestroy(e);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c->tables);
    free(c->dims);
    free(c->nstate);
    delete[] c->grows;
    delete[] c->ggrads;
    free(c->h_keys);
    free(c->h_vals);
    free(c->h_opt);
    free(c->h_steps);
    delete c;
}

int64_t cw_rows_bound(const shard_store_work_t *w, int t)
{
    return kern_cuda_table_capacity(W(w)->tables[t]);
}

int64_t cw_size(const shard_store_work_t *w, int t) { return kern_cuda_table_size(W(w)->tables[t]); }

/* The store's stream waits for the last _dev call on a caller's stream. */
int after_ext(cuda_work *c)
{
    CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->ext_done, 0));
    return 0;
}

/* Copies bytes at host src to the device buffer d (grown to fit) through
 * the pinned buffer, on the store's stream. */
int stage_in(cuda_work *c, dbuf *d, const void *src, size_t bytes)
{
    KILN_CHECK(dneed(d, bytes));
    KILN_CHECK(pneed(&c->pin, bytes));
    memcpy(c->pin.p, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(d->p, c->pin.p, bytes, cudaMemcpyHostToDevice, c->stream));
    return 0;
}

int cw_find(shard_store_work_t *w, int t, int64_t n, const int64_t *keys, int64_t step, bool insert,
            int32_t *rows)
{
    cuda_work *c = W(w);
    if (n == 0)
        return 0;
    KILN_CHECK(after_ext(c));
    KILN_CHECK(dneed(&c->rows, sizeof(int32_t) * (size_t)n));
    /* The pinned buffer takes the keys in, then the (smaller) rows out. */
    KILN_CHECK(stage_in(c, &c->keys, keys, sizeof(int64_t) * (size_t)n));
    int64_t *dk = (int64_t *)c->keys.p;
    int32_t *dr = (int32_t *)c->rows.p;
    if (insert)
        KILN_CHECK(kern_cuda_table_find_or_insert(c->tables[t], n, dk, step, dr, c->stream));
    else
        KILN_CHECK(kern_cuda_table_find(c->tables[t], n, dk, dr, c->stream));
    CUDA_CHECK(cudaMemcpyAsync(c->pin.p, dr, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost,
                               c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    memcpy(rows, c->pin.p, sizeof(int32_t) * (size_t)n);
    return 0;
}

/* host out (n, width words) = the rows of a device array with width words a row. */
int read_to_host(cuda_work *c, const void *d_src, int width, int64_t n, void *out)
{
    const size_t bytes = sizeof(uint32_t) * (size_t)n * (size_t)width;
    KILN_CHECK(dneed(&c->vals, bytes));
    KILN_CHECK(read_rows(d_src, width, (const int32_t *)c->rows.p, n, c->vals.p, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); /* the pinned rows' copy in is done */
    KILN_CHECK(pneed(&c->pin, bytes));
    CUDA_CHECK(cudaMemcpyAsync(c->pin.p, c->vals.p, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    memcpy(out, c->pin.p, bytes);
    return 0;
}

int cw_read(shard_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out)
{
    cuda_work *c = W(w);
    if (n == 0)
        return 0;
    KILN_CHECK(after_ext(c));
    KILN_CHECK(stage_in(c, &c->rows, rows, sizeof(int32_t) * (size_t)n));
    kern_slab_t sl;
    kern_cuda_table_slab(c->tables[t], &sl);
    return read_to_host(c, sl.values, c->dims[t], n, out);
}

/* Where table t's rows and gradients sit in the packed pinned buffer:
 * rows (n) int32, then grads (n, dim) float, each part 16-byte aligned. */
size_t pack_bytes(int64_t n, int dim)
{
    const size_t rows = (sizeof(int32_t) * (size_t)n + 15) / 16 * 16;
    return rows + (sizeof(float) * (size_t)n * (size_t)dim + 15) / 16 * 16;
}

int cw_update(shard_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug, int64_t step)
{
    cuda_work *c = W(w);
    const int T = c->ntables;
    kern_slab_t *slabs = (kern_slab_t *)kiln_calloc((size_t)T, sizeof *slabs);
    kern_row_grads_t *dg = (kern_row_grads_t *)kiln_calloc((size_t)T, sizeof *dg);
    size_t total = 0, off = 0;
    int rc = 0;
    if (slabs == NULL || dg == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    /* The last update's copies may still read upd_pin; its kernels may
     * still use grows/ggrads (dneed's cudaFree waits for the device). */
    CUDA_CHECK_GOTO(cudaEventSynchronize(c->upd_done), rc, out);
    KILN_CHECK_GOTO(after_ext(c), rc, out);
    for (int t = 0; t < T; t++)
        total += pack_bytes(ug[t].n, c->dims[t]);
    KILN_CHECK_GOTO(pneed(&c->upd_pin, total), rc, out);
    for (int t = 0; t < T; t++) {
        const int64_t n = ug[t].n;
        const size_t rbytes = sizeof(int32_t) * (size_t)n,
                     gbytes = sizeof(float) * (size_t)n * (size_t)c->dims[t];
        char *pin = (char *)c->upd_pin.p + off;
        char *pin_grads = pin + (rbytes + 15) / 16 * 16;
        off += pack_bytes(n, c->dims[t]);
        kern_cuda_table_slab(c->tables[t], &slabs[t]);
        KILN_CHECK_GOTO(dneed(&c->grows[t], sizeof(int32_t) * (size_t)(n ? n : 1)), rc, out);
        KILN_CHECK_GOTO(dneed(&c->ggrads[t], sizeof(float) * (size_t)(n ? n : 1) * c->dims[t]),
                        rc, out);
        if (n > 0) {
            memcpy(pin, ug[t].rows, rbytes);
            memcpy(pin_grads, ug[t].grads, gbytes);
            CUDA_CHECK_GOTO(
                cudaMemcpyAsync(c->grows[t].p, pin, rbytes, cudaMemcpyHostToDevice, c->stream), rc,
                out);
            CUDA_CHECK_GOTO(cudaMemcpyAsync(c->ggrads[t].p, pin_grads, gbytes,
                                            cudaMemcpyHostToDevice, c->stream),
                            rc, out);
        }
        dg[t] = (kern_row_grads_t){(int32_t *)c->grows[t].p, (float *)c->ggrads[t].p, n};
    }
    CUDA_CHECK_GOTO(cudaEventRecord(c->upd_done, c->stream), rc, out);
    /* Enqueued, not waited for: the next call on the stream orders after it. */
    KILN_CHECK_GOTO(kern_cuda_sparse_update(opt, T, slabs, dg, step, c->stream), rc, out);
    CUDA_CHECK_GOTO(cudaEventRecord(c->own_done, c->stream), rc, out);
out:
    free(slabs);
    free(dg);
    return rc;
}

int cw_evicted(shard_store_work_t *w, int t, const kern_evicted_t **log, int64_t *n)
{
    *log = kern_cuda_table_evicted(W(w)->tables[t], n);
    return 0;
}

void cw_evicted_clear(shard_store_work_t *w, int t) { kern_cuda_table_evicted_clear(W(w)->tables[t]); }

int cw_changed(shard_store_work_t *w, int t, int64_t since, int64_t step, shard_store_rows_t *out)
{
    (void)step; /* the GPU scan reads stamps, it keeps no change list */
    cuda_work *c = W(w);
    const int dim = c->dims[t], sw = c->nstate[t] * dim;
    /* Changed rows are live rows: room for the live count (exact after the
     * last call, which synchronized), grown and retried if the scan says
     * more (it returns KILN_ERANGE and the count). Not the capacity: that
     * would be 12 bytes of scratch per slot. */
    KILN_CHECK(after_ext(c));
    int64_t cap = kern_cuda_table_size(c->tables[t]) + 1024, n = 0;
    for (int attempt = 0;; attempt++) {
        KILN_CHECK(dneed(&c->rows, sizeof(int32_t) * (size_t)cap));
        KILN_CHECK(dneed(&c->keys, sizeof(int64_t) * (size_t)cap));
        int rc = kern_cuda_table_changed_since(c->tables[t], since, (int32_t *)c->rows.p,
                                               (int64_t *)c->keys.p, cap, &n, c->stream);
        if (rc == KILN_ERANGE && attempt == 0 && n > cap) {
            cap = n;
            continue;
        }
        KILN_CHECK(rc);
        break;
    }
    KILN_CHECK(hneed(&c->h_keys, &c->h_keys_cap, sizeof(int64_t) * (size_t)(n ? n : 1)));
    KILN_CHECK(hneed(&c->h_vals, &c->h_vals_cap, sizeof(float) * (size_t)(n ? n : 1) * dim));
    CUDA_CHECK(cudaMemcpyAsync(c->h_keys, c->keys.p, sizeof(int64_t) * (size_t)n,
                               cudaMemcpyDeviceToHost, c->stream));
    kern_slab_t sl;
    kern_cuda_table_slab(c->tables[t], &sl);
    KILN_CHECK(read_to_host(c, sl.values, dim, n, c->h_vals));
    *out = (shard_store_rows_t){n, (const int64_t *)c->h_keys, (const float *)c->h_vals, nullptr,
                             nullptr};
    if (sw > 0) {
        KILN_CHECK(hneed(&c->h_opt, &c->h_opt_cap, sizeof(float) * (size_t)(n ? n : 1) * sw));
        KILN_CHECK(read_to_host(c, sl.opt_state, sw, n, c->h_opt));
        out->opt = (const float *)c->h_opt;
    }
    if (sl.opt_steps != nullptr) {
        KILN_CHECK(hneed(&c->h_steps, &c->h_steps_cap, sizeof(uint32_t) * (size_t)(n ? n : 1)));
        KILN_CHECK(read_to_host(c, sl.opt_steps, 1, n, c->h_steps));
        out->steps = (const uint32_t *)c->h_steps;
    }
    return 0;
}

/* Copies host rows (n, width words) into a device array at the rows in c->rows. */
int write_from_host(cuda_work *c, void *d_dst, int width, int64_t n, const void *src)
{
    const size_t bytes = sizeof(uint32_t) * (size_t)n * (size_t)width;
    KILN_CHECK(dneed(&c->vals, bytes));
    CUDA_CHECK(cudaMemcpyAsync(c->vals.p, src, bytes, cudaMemcpyHostToDevice, c->stream));
    KILN_CHECK(write_rows(d_dst, width, (const int32_t *)c->rows.p, n, c->vals.p, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return 0;
}

int cw_insert(shard_store_work_t *w, int t, const shard_store_rows_t *r, int64_t step)
{
    cuda_work *c = W(w);
    const int64_t n = r->n;
    if (n == 0)
        return 0;
    KILN_CHECK(after_ext(c));
    KILN_CHECK(dneed(&c->keys, sizeof(int64_t) * (size_t)n));
    KILN_CHECK(dneed(&c->rows, sizeof(int32_t) * (size_t)n));
    CUDA_CHECK(cudaMemcpyAsync(c->keys.p, r->keys, sizeof(int64_t) * (size_t)n,
                               cudaMemcpyHostToDevice, c->stream));
    KILN_CHECK(kern_cuda_table_find_or_insert(c->tables[t], n, (const int64_t *)c->keys.p, step,
                                              (int32_t *)c->rows.p, c->stream));
    kern_slab_t sl;
    kern_cuda_table_slab(c->tables[t], &sl);
    KILN_CHECK(write_from_host(c, sl.values, c->dims[t], n, r->values));
    if (sl.opt_state != nullptr && r->opt != nullptr)
        KILN_CHECK(write_from_host(c, sl.opt_state, c->nstate[t] * c->dims[t], n, r->opt));
    if (sl.opt_steps != nullptr && r->steps != nullptr)
        KILN_CHECK(write_from_host(c, sl.opt_steps, 1, n, r->steps));
    return 0;
}

/* ---- the _dev calls: device arrays, on the caller's stream ---- */

/* The caller's stream (*st) waits for the store's last update. */
int ext_begin(cuda_work *c, void *stream, cudaStream_t *st)
{
    *st = (cudaStream_t)stream;
    CUDA_CHECK(cudaStreamWaitEvent(*st, c->own_done, 0));
    return 0;
}

/* The store's later calls wait for this one. */
int ext_end(cuda_work *c, cudaStream_t st)
{
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(c->ext_done, st));
    return 0;
}

int cw_find_dev(shard_store_work_t *w, const int64_t *off, const int64_t *keys, int64_t step,
                bool insert, int32_t *rows, void *stream)
{
    cuda_work *c = W(w);
    if (off[c->ntables] == off[0])
        return 0;
    cudaStream_t st;
    KILN_CHECK(ext_begin(c, stream, &st));
    if (insert) {
        /* One synchronization for all tables (kern_cuda_tables_find_or_insert). */
        int rc = kern_cuda_tables_find_or_insert(c->ntables, c->tables, off, keys, step, rows, st);
        const int end = ext_end(c, st); /* later calls wait for what was enqueued */
        return rc < 0 ? rc : end;
    }
    for (int t = 0; t < c->ntables; t++)
        if (off[t + 1] > off[t])
            KILN_CHECK(kern_cuda_table_find(c->tables[t], off[t + 1] - off[t], keys + off[t],
                                            rows + off[t], st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return ext_end(c, st);
}

int cw_read_dev(shard_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out, void *stream)
{
    cuda_work *c = W(w);
    if (n == 0)
        return 0;
    cudaStream_t st;
    KILN_CHECK(ext_begin(c, stream, &st));
    kern_slab_t sl;
    kern_cuda_table_slab(c->tables[t], &sl);
    KILN_CHECK(read_rows(sl.values, c->dims[t], rows, n, out, st));
    return ext_end(c, st);
}

int cw_update_dev(shard_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug,
                  int64_t step, void *stream)
{
    cuda_work *c = W(w);
    const int T = c->ntables;
    kern_slab_t *slabs = (kern_slab_t *)kiln_calloc((size_t)(T > 0 ? T : 1), sizeof *slabs);
    if (slabs == NULL)
        return KILN_ENOMEM;
    for (int t = 0; t < T; t++)
        kern_cuda_table_slab(c->tables[t], &slabs[t]);
    cudaStream_t st;
    int rc = ext_begin(c, stream, &st);
    if (rc == 0)
        rc = kern_cuda_sparse_update(opt, T, slabs, ug, step, st);
    free(slabs);
    KILN_CHECK(rc);
    return ext_end(c, st);
}

const shard_store_work_ops_t cuda_ops = {
    cw_destroy,  cw_rows_bound,        cw_size,       cw_find,    cw_read,          cw_update,
    cw_find_dev, cw_read_dev,          cw_update_dev, cw_evicted, cw_evicted_clear, cw_changed,
    cw_insert,   /* parallel */ false,
};

} // namespace

extern "C" int shard_store_cuda_create(int ntables, const kern_table_config_t *cfgs, int device,
                                    shard_store_work_t **out)
{
    *out = nullptr;
    CUDA_CHECK(cudaSetDevice(device));
    cuda_work *c = new (std::nothrow) cuda_work();
    if (c == nullptr)
        return KILN_ENOMEM;
    c->base.ops = &cuda_ops;
    c->ntables = ntables;
    c->tables = (kern_cuda_table_t **)kiln_calloc((size_t)ntables, sizeof *c->tables);
    c->dims = (int *)kiln_calloc((size_t)ntables, sizeof(int));
    c->nstate = (int *)kiln_calloc((size_t)ntables, sizeof(int));
    c->grows = new (std::nothrow) dbuf[ntables > 0 ? ntables : 1];
    c->ggrads = new (std::nothrow) dbuf[ntables > 0 ? ntables : 1];
    int rc = 0;
    if (!c->tables || !c->dims || !c->nstate || !c->grows || !c->ggrads) {
        rc = KILN_ENOMEM;
        goto fail;
    }
    CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), rc, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&c->upd_done, cudaEventDisableTiming), rc, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&c->own_done, cudaEventDisableTiming), rc, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&c->ext_done, cudaEventDisableTiming), rc, fail);
    for (int t = 0; t < ntables; t++) {
        c->dims[t] = cfgs[t].dim;
        c->nstate[t] = cfgs[t].opt == KERN_OPT_SGD ? 0 : cfgs[t].opt == KERN_OPT_ADAGRAD ? 1 : 2;
        KILN_CHECK_GOTO(kern_cuda_table_create(&cfgs[t], &c->tables[t]), rc, fail);
    }
    *out = &c->base;
    return 0;
fail:
    cw_destroy(&c->base);
    return rc;
}
