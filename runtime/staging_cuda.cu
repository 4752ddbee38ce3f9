/*
 * runtime/staging_cuda.cu - pinned double buffers for input copies that
 * overlap compute (rt_staging.h).
 *
 * Per slot: a pinned host buffer, a device buffer and three events.
 *   copied[i]  recorded on the copy stream after slot i's host->device copy;
 *              the compute stream waits on it (rt_staging_wait) and the host
 *              waits on it before overwriting the pinned buffer again.
 *   freed[i]   recorded on the compute stream when slot i is refilled; the
 *              copy stream waits on it, so the new copy cannot overwrite the
 *              device buffer while earlier compute still reads it.
 * The events are made with cudaEventDisableTiming (they only order work).
 */
#include "rt_staging.h"
#include "kiln_cuda.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

struct rt_staging {
    size_t slot_bytes;
    cudaStream_t compute, copy;
    void *host[RT_STAGING_SLOTS];
    void *dev[RT_STAGING_SLOTS];
    cudaEvent_t copied[RT_STAGING_SLOTS], freed[RT_STAGING_SLOTS];
    int staged[RT_STAGING_SLOTS]; /* the slot has been staged at least once */
    int next;
};

static int setup(rt_staging_t *s)
{
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking));
    for (int i = 0; i < RT_STAGING_SLOTS; i++) {
        cudaError_t e = cudaHostAlloc(&s->host[i], s->slot_bytes, cudaHostAllocDefault);
        if (e != cudaSuccess) {
            s->host[i] = NULL;
            return kiln_errf(KILN_ECUDA,
                             "cudaHostAlloc of a %zu-byte pinned input buffer: %s; lower "
                             "batch_size or raise the memlock limit (ulimit -l)",
                             s->slot_bytes, cudaGetErrorString(e));
        }
        e = cudaMalloc(&s->dev[i], s->slot_bytes);
        if (e != cudaSuccess) {
            s->dev[i] = NULL;
            return kiln_errf(KILN_ECUDA,
                             "cudaMalloc of a %zu-byte device input buffer: %s; lower batch_size",
                             s->slot_bytes, cudaGetErrorString(e));
        }
        CUDA_CHECK(cudaEventCreateWithFlags(&s->copied[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&s->freed[i], cudaEventDisableTiming));
    }
    return 0;
}

extern "C" int rt_staging_create(size_t slot_bytes, void *compute_stream, rt_staging_t **out)
{
    if (out == NULL)
        return kiln_errf(KILN_EINVAL, "rt_staging_create: out is NULL");
    *out = NULL;
    if (slot_bytes == 0)
        return kiln_errf(KILN_EINVAL, "rt_staging_create: slot_bytes must be >= 1");
    rt_staging_t *s = (rt_staging_t *)kiln_calloc(1, sizeof *s);
    if (s == NULL)
        return KILN_ENOMEM;
    s->slot_bytes = slot_bytes;
    s->compute = (cudaStream_t)compute_stream;
    int rc = setup(s);
    if (rc < 0) {
        rt_staging_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

extern "C" void rt_staging_destroy(rt_staging_t *s)
{
    if (s == NULL)
        return;
    if (s->copy != NULL)
        (void)cudaStreamSynchronize(s->copy);
    for (int i = 0; i < RT_STAGING_SLOTS; i++) {
        if (s->copied[i] != NULL)
            (void)cudaEventDestroy(s->copied[i]);
        if (s->freed[i] != NULL)
            (void)cudaEventDestroy(s->freed[i]);
        (void)cudaFreeHost(s->host[i]);
        (void)cudaFree(s->dev[i]);
    }
    if (s->copy != NULL)
        (void)cudaStreamDestroy(s->copy);
    free(s);
}

extern "C" size_t rt_staging_slot_bytes(const rt_staging_t *s)
{
    return s->slot_bytes;
}

extern "C" int rt_staging_stage(rt_staging_t *s, const void *buf, size_t bytes, int *slot)
{
    if (s == NULL || slot == NULL || (buf == NULL && bytes > 0))
        return kiln_errf(KILN_EINVAL, "rt_staging_stage: NULL argument");
    if (bytes > s->slot_bytes)
        return kiln_errf(KILN_EINVAL,
                         "rt_staging_stage: %zu bytes do not fit a %zu-byte slot; create the "
                         "staging buffers for the largest batch",
                         bytes, s->slot_bytes);
    const int i = s->next;
    /* The slot's previous copy must have left the pinned buffer. */
    if (s->staged[i])
        CUDA_CHECK(cudaEventSynchronize(s->copied[i]));
    if (bytes > 0)
        memcpy(s->host[i], buf, bytes);
    /* The copy may not start before the compute enqueued so far (which
     * includes the last reader of this slot's device buffer) is done. */
    CUDA_CHECK(cudaEventRecord(s->freed[i], s->compute));
    CUDA_CHECK(cudaStreamWaitEvent(s->copy, s->freed[i], 0));
    if (bytes > 0)
        CUDA_CHECK(cudaMemcpyAsync(s->dev[i], s->host[i], bytes, cudaMemcpyHostToDevice, s->copy));
    CUDA_CHECK(cudaEventRecord(s->copied[i], s->copy));
    s->staged[i] = 1;
    s->next = (i + 1) % RT_STAGING_SLOTS;
    *slot = i;
    return 0;
}

extern "C" int rt_staging_wait(rt_staging_t *s, int slot, void **d_buf)
{
    if (s == NULL || d_buf == NULL || slot < 0 || slot >= RT_STAGING_SLOTS)
        return kiln_errf(KILN_EINVAL, "rt_staging_wait: bad slot %d (0..%d)", slot,
                         RT_STAGING_SLOTS - 1);
    if (!s->staged[slot])
        return kiln_errf(KILN_EINVAL, "rt_staging_wait: slot %d was never staged", slot);
    CUDA_CHECK(cudaStreamWaitEvent(s->compute, s->copied[slot], 0));
    *d_buf = s->dev[slot];
    return 0;
}
