/*
 * runtime/rt_staging.h - pinned double buffers that move the next batch's
 * input to the GPU while the current batch computes.
 *
 * Two slots, each a pinned host buffer (cudaHostAlloc) and a device buffer
 * of slot_bytes, a copy stream of its own and three events per slot. The
 * trainer's loop:
 *
 *   rt_staging_stage(s, batch0, bytes, &cur);
 *   for (;;) {
 *       if (more) rt_staging_stage(s, next_batch, bytes, &nxt);  copy starts
 *       rt_staging_wait(s, cur, &d_in);        compute stream waits for cur
 *       ... enqueue this batch's work that reads d_in on the compute stream ...
 *       cur = nxt;
 *   }
 *
 * rt_staging_stage copies buf into the slot's pinned buffer on the host and
 * enqueues its host->device copy on the copy stream, which overlaps the
 * compute already enqueued. Slots alternate. Reuse is safe without further
 * calls: before a slot is refilled, the host waits for that slot's previous
 * copy to have left the pinned buffer, and the copy stream waits (on the
 * device, not the host) for everything enqueued on the compute stream up to
 * this stage call - which includes the work that read the slot's previous
 * batch, as long as that work was enqueued on the compute stream before this
 * stage call (the loop above does that).
 *
 * Not thread-safe: one staging object per rank, driven by one thread.
 */
#ifndef KILN_RUNTIME_RT_STAGING_H
#define KILN_RUNTIME_RT_STAGING_H

#include <stddef.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RT_STAGING_SLOTS 2

typedef struct rt_staging rt_staging_t;

/* Creates two slots of slot_bytes (>= 1) each, pinned on the host and
 * allocated on the current CUDA device, and a copy stream. compute_stream
 * is the cudaStream_t that consumes the slots (NULL: the legacy default
 * stream). Returns 0, KILN_EINVAL or KILN_ECUDA (allocation failed; the
 * message says how much). Free with rt_staging_destroy. */
int rt_staging_create(size_t slot_bytes, void *compute_stream, rt_staging_t **out /* OUT */);
/* Waits for outstanding copies and frees everything. Accepts NULL. */
void rt_staging_destroy(rt_staging_t *s);

size_t rt_staging_slot_bytes(const rt_staging_t *s);

/* Copies bytes (<= slot_bytes) of host memory buf into the next slot's
 * pinned buffer and starts its asynchronous copy to the device. buf may be
 * reused as soon as this returns. Blocks only while the same slot's
 * previous copy is still reading the pinned buffer. Returns 0 and the slot
 * (0 or 1) in *slot, KILN_EINVAL (bytes too large, NULL) or KILN_ECUDA. */
int rt_staging_stage(rt_staging_t *s, const void *buf, size_t bytes, int *slot /* OUT */);

/* Makes the compute stream wait (on the device; the host does not block)
 * for slot's copy, and returns the slot's device buffer, which holds the
 * staged bytes for work enqueued on the compute stream from now on. Returns
 * 0, KILN_EINVAL (slot out of range or never staged) or KILN_ECUDA. */
int rt_staging_wait(rt_staging_t *s, int slot, void **d_buf /* OUT */);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_RT_STAGING_H */
