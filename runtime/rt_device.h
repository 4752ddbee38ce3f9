/*
 * runtime/rt_device.h - which backend a kiln-train rank runs on.
 *
 * The job spec's `device:` is auto, cpu or cuda (jobs/jobs.h). rt_device_pick
 * turns it into the backend this rank uses, from two facts the caller
 * passes in: whether this kiln-train was built with CUDA and how many GPUs
 * the rank can see (rt_device_visible_gpus). It is pure logic, so the table
 * of cases is tested on machines without a GPU; it also writes the log line
 * the trainer prints, e.g.
 *   device auto: no CUDA device visible; using the CPU backend
 */
#ifndef KILN_RUNTIME_RT_DEVICE_H
#define KILN_RUNTIME_RT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "jobs.h"
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { RT_DEVICE_CPU = 0, RT_DEVICE_CUDA = 1 } rt_device_t;

/* Returns "cpu" or "cuda" (or "?"). */
const char *rt_device_name(rt_device_t d);

/* Picks the backend for want:
 *   auto -> cuda when built_cuda and visible_gpus > 0, else cpu
 *   cpu  -> cpu
 *   cuda -> cuda when built_cuda and visible_gpus > 0, else KILN_EINVAL
 * Writes one log line into why (cap bytes, NUL-terminated; why may be NULL
 * when cap is 0): on success the choice and its reason ("device auto: no
 * CUDA device visible; using the CPU backend"), on failure the same message
 * kiln_errmsg() then returns, which says what to do. Returns 0 or
 * KILN_EINVAL (cuda impossible, an unknown want, visible_gpus < 0, out NULL). */
int rt_device_pick(job_device_t want, bool built_cuda, int visible_gpus, rt_device_t *out /* OUT */,
                   char *why /* OUT (cap) */, size_t cap);

/* True when this build has the CUDA backend (KILN_HAVE_CUDA). */
bool rt_device_built_cuda(void);

/* The number of CUDA devices this process can see (kern_cuda_device_count,
 * which honours CUDA_VISIBLE_DEVICES); 0 without a driver, without a GPU or
 * in a build without CUDA. */
int rt_device_visible_gpus(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_RT_DEVICE_H */
