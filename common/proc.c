/*
 * common/proc.c - what /proc says about a process: its state, session and
 * start time. A pid with its start time names one process for good (kilnd's
 * supervisors, the claimers of pushes), where a pid alone may be reused.
 */
#include "kiln.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int kiln_pid_stat(pid_t pid, char *state, pid_t *sid, uint64_t *start_ticks)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parens */
    if (p == NULL)
        return -1;
    /* After ") ": state(3) ppid(4) pgrp(5) session(6) ... starttime(22). */
    char st = 0;
    int ppid, pgrp, session;
    unsigned long long starttime = 0;
    if (sscanf(p + 2, "%c %d %d %d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
               &st, &ppid, &pgrp, &session, &starttime) != 5)
        return -1;
    if (state)
        *state = st;
    if (sid)
        *sid = session;
    if (start_ticks)
        *start_ticks = starttime;
    return 0;
}

uint64_t kiln_pid_start(pid_t pid)
{
    uint64_t start = 0;
    return kiln_pid_stat(pid, NULL, NULL, &start) == 0 ? start : 0;
}

bool kiln_pid_alive(pid_t pid, uint64_t start_ticks)
{
    char st;
    uint64_t start;
    if (pid <= 0 || kiln_pid_stat(pid, &st, NULL, &start) < 0)
        return false;
    if (st == 'Z' || st == 'X')
        return false;
    return start_ticks == 0 || start == start_ticks;
}
