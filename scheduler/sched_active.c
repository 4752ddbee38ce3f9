/*
 * scheduler/sched_active.c - the active set: the runs kilnd supervises now,
 * each with its supervisor's pid watched through a pidfd in the loop's epoll
 * set. The launchers (a re-adopted Slurm run) and sched_run.c use it; it
 * calls nothing else of the scheduler.
 */
#include "sched_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

sched_active_t *sched_active_add(sched_t *s)
{
    if (kiln_grow((void **)&s->act, &s->capact, s->nact, sizeof *s->act, 16) < 0)
        return NULL;
    sched_active_t *a = &s->act[s->nact++];
    memset(a, 0, sizeof *a);
    a->pidfd = -1;
    return a;
}

void sched_unwatch(sched_t *s, sched_active_t *a)
{
    if (a->pidfd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, a->pidfd, NULL);
        close(a->pidfd);
        a->pidfd = -1;
    }
}

void sched_active_remove(sched_t *s, sched_active_t *a)
{
    sched_unwatch(s, a);
    free(a->run_dir);
    size_t i = (size_t)(a - s->act);
    s->act[i] = s->act[--s->nact];
}

int sched_watch(sched_t *s, sched_active_t *a)
{
    a->pidfd = (int)syscall(SYS_pidfd_open, a->pid, 0);
    if (a->pidfd < 0)
        return kiln_errf(KILN_EIO, "pidfd_open(%d): %s", (int)a->pid, strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)a->run_id};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, a->pidfd, &ev) < 0)
        return kiln_errf(KILN_EIO, "epoll_ctl: %s", strerror(errno));
    return 0;
}
