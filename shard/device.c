/*
 * shard/device.c - the choice between the CPU and the CUDA backend
 * (shard.h). shard_device_pick is a table of cases over (want, built with
 * CUDA, GPUs visible) and touches no device; shard_device_visible_gpus asks the
 * kernels' CUDA backend when there is one.
 */
#include "shard.h"

#include <stdio.h>

#ifdef KILN_HAVE_CUDA
#include "kern_cuda.h"
#endif

const char *shard_device_name(shard_device_t d)
{
    static const char *const names[] = {[SHARD_DEVICE_CPU] = "cpu", [SHARD_DEVICE_CUDA] = "cuda"};
    return (unsigned)d < sizeof names / sizeof names[0] ? names[d] : "?";
}

bool shard_device_built_cuda(void)
{
#ifdef KILN_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int shard_device_visible_gpus(void)
{
#ifdef KILN_HAVE_CUDA
    int n = kern_cuda_device_count();
    return n > 0 ? n : 0;
#else
    return 0;
#endif
}

/* Writes the line into why (when there is room) and returns rc; a failure
 * also becomes the thread's error message. */
static int say(int rc, char *why, size_t cap, const char *line)
{
    if (why != NULL && cap > 0)
        snprintf(why, cap, "%s", line);
    if (rc < 0)
        return kiln_errf(rc, "%s", line);
    return rc;
}

int shard_device_pick(job_device_t want, bool built_cuda, int visible_gpus, shard_device_t *out,
                   char *why, size_t cap)
{
    char line[320];
    if (why != NULL && cap > 0)
        why[0] = '\0';
    if (out == NULL)
        return say(KILN_EINVAL, why, cap, "shard_device_pick: out is NULL");
    *out = SHARD_DEVICE_CPU;
    if (visible_gpus < 0) {
        snprintf(line, sizeof line, "shard_device_pick: visible_gpus is %d (must be >= 0)",
                 visible_gpus);
        return say(KILN_EINVAL, why, cap, line);
    }
    const bool can = built_cuda && visible_gpus > 0;
    switch (want) {
    case JOB_DEVICE_CPU:
        return say(0, why, cap, "device cpu: using the CPU backend");
    case JOB_DEVICE_AUTO:
        if (can) {
            *out = SHARD_DEVICE_CUDA;
            snprintf(line, sizeof line,
                     "device auto: %d CUDA device%s visible; using the CUDA backend", visible_gpus,
                     visible_gpus == 1 ? "" : "s");
            return say(0, why, cap, line);
        }
        return say(0, why, cap,
                   built_cuda ? "device auto: no CUDA device visible; using the CPU backend"
                              : "device auto: this kiln-train was built without CUDA; using "
                                "the CPU backend");
    case JOB_DEVICE_CUDA:
        if (can) {
            *out = SHARD_DEVICE_CUDA;
            snprintf(line, sizeof line,
                     "device cuda: %d CUDA device%s visible; using the CUDA "
                     "backend",
                     visible_gpus, visible_gpus == 1 ? "" : "s");
            return say(0, why, cap, line);
        }
        if (!built_cuda)
            return say(KILN_EINVAL, why, cap,
                       "device cuda: this kiln-train was built without CUDA; rebuild with "
                       "-DKILN_CUDA=ON on a host with nvcc and NCCL, or set device: auto or "
                       "cpu in the job spec");
        return say(KILN_EINVAL, why, cap,
                   "device cuda: no CUDA device visible to this rank; run on a GPU host "
                   "(check nvidia-smi and CUDA_VISIBLE_DEVICES), or set device: auto or cpu "
                   "in the job spec");
    }
    snprintf(line, sizeof line, "shard_device_pick: unknown device value %d", (int)want);
    return say(KILN_EINVAL, why, cap, line);
}
