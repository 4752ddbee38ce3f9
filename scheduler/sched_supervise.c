/*
 * scheduler/sched_supervise.c - the per-run supervisor and what kilnd learns
 * from it. The supervisor is a fork of kilnd that execs nothing: it leads a
 * new session (setsid), so the run's processes share one session id and
 * kilnd's death or a terminal's ^C does not reach them; it starts the
 * launcher's command with the run's log as stdout/stderr, waits, and writes
 * the run's status with the exit code or signal (run/run.h; written
 * atomically, so a reader never sees half a file). A kilnd that restarts reads that file to learn how
 * a run ended while it was down. Also here: pid files with start times (a
 * reused pid is not a live supervisor), killing a session, and turning a
 * log tail into one sentence naming the dead rank, its host and signal.
 */
#include "sched_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int sched_kill_session(pid_t sid, int sig)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return 0;
    int n = 0;
    pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == self)
            continue;
        pid_t psid;
        char st;
        if (kiln_pid_stat((pid_t)pid, &st, &psid, NULL) == 0 && psid == sid && st != 'Z' &&
            kill((pid_t)pid, sig) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* ---- the supervisor process ------------------------------------------------------ */

static int64_t mono_ms(void)
{
    return kiln_mono_ns() / 1000000;
}

/* The supervisor's whole life; never returns. */
void sched_signal_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

static void supervise(const char *run_dir, char *const argv[], int64_t grace_ms,
                      sched_follow_fn follow, int64_t poll_ms, int ready_fd)
{
    sigset_t set;
    sched_signal_set(&set);
    sigprocmask(SIG_SETMASK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    run_pidfile_write(run_dir, RUN_FILE_SUPERVISOR, getpid(), kiln_pid_start(getpid()));

    int64_t started = kiln_now_s();
    if (follow != NULL) { /* a run elsewhere (slurm): the launcher's body follows it */
        char ok = 'k';
        if (write(ready_fd, &ok, 1) < 0) {
            /* kilnd is gone already; carry on regardless. */
        }
        close(ready_fd);
        run_status_t st;
        memset(&st, 0, sizeof st);
        sched_follow_opts_t fo = {&set, poll_ms};
        follow(run_dir, argv, &fo, &st);
        run_stop_read(run_dir, st.stop, sizeof st.stop);
        st.started_at = started;
        st.ended_at = kiln_now_s();
        run_status_write(run_dir, &st);
        _exit(0);
    }
    pid_t child = fork();
    if (child == 0) {
        sigset_t none;
        sigemptyset(&none);
        signal(SIGPIPE, SIG_DFL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setpgid(0, 0);
        if (chdir(run_dir) < 0)
            _exit(126);
        execvp(argv[0], argv);
        fprintf(stderr, "kilnd supervisor: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (child < 0) {
        fprintf(stderr, "kilnd supervisor: fork: %s\n", strerror(errno));
    } else {
        run_pidfile_write(run_dir, RUN_FILE_LAUNCHER, child, kiln_pid_start(child));
    }
    /* Tell kilnd we are set up (pid files written), then close the pipe. */
    char ok = child > 0 ? 'k' : 'x';
    if (write(ready_fd, &ok, 1) < 0) {
        /* kilnd is gone already; carry on regardless. */
    }
    close(ready_fd);

    int status = 0;
    bool stopping = false, killed = false;
    int64_t kill_at = 0;
    while (child > 0) {
        pid_t w = waitpid(child, &status, WNOHANG);
        if (w == child)
            break;
        struct timespec ts = {1, 0};
        if (stopping && !killed) {
            int64_t left = kill_at - mono_ms();
            if (left <= 0) {
                fprintf(stderr, "kilnd supervisor: grace period over; SIGKILL to the run\n");
                kill(-child, SIGKILL);
                sched_kill_session(getsid(0), SIGKILL);
                killed = true;
            } else if (left < 1000) {
                ts.tv_sec = 0;
                ts.tv_nsec = (long)left * 1000000L;
            }
        }
        siginfo_t si;
        int sig = sigtimedwait(&set, &si, &ts);
        if (sig == SIGTERM && !stopping) {
            char why[32];
            run_stop_read(run_dir, why, sizeof why);
            fprintf(stderr, "kilnd supervisor: stopping the run (%s): SIGTERM to every rank\n",
                    why[0] ? why : "SIGTERM");
            kill(-child, SIGTERM);
            sched_kill_session(getsid(0), SIGTERM);
            stopping = true;
            kill_at = mono_ms() + grace_ms;
        }
    }
    /* Stragglers (a rank that outlived mpirun) go with the run. */
    sched_kill_session(getsid(0), SIGKILL);

    run_status_t end = {.exit_code = child < 0 ? 126 : WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                        .signal = child > 0 && WIFSIGNALED(status) ? WTERMSIG(status) : 0,
                        .started_at = started,
                        .ended_at = kiln_now_s()};
    run_stop_read(run_dir, end.stop, sizeof end.stop);
    run_status_write(run_dir, &end);
    _exit(0);
}

int sched_supervise_spawn(const char *run_dir, char *const argv[], int64_t grace_ms, pid_t *pid)
{
    return sched_supervise_spawn_follow(run_dir, argv, NULL, grace_ms, NULL, 0, pid);
}

/* In the child after fork: each "NAME=VALUE" of env set, each "NAME" unset. */
static void apply_env(const char *const *env)
{
    for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
        const char *eq = strchr(env[i], '=');
        char name[128];
        size_t n = eq != NULL ? (size_t)(eq - env[i]) : strlen(env[i]);
        if (n == 0 || n >= sizeof name)
            continue;
        memcpy(name, env[i], n);
        name[n] = '\0';
        if (eq != NULL)
            setenv(name, eq + 1, 1);
        else
            unsetenv(name);
    }
}

int sched_supervise_spawn_follow(const char *run_dir, char *const argv[], const char *const *env,
                                 int64_t grace_ms, sched_follow_fn follow, int64_t poll_ms,
                                 pid_t *pid)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return kiln_errf(KILN_EIO, "pipe: %s", strerror(errno));
    char *logp = run_path(run_dir, RUN_FILE_LOG);
    int logfd = logp != NULL ? open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    if (logfd < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        int rc = logp == NULL ? KILN_ENOMEM
                              : kiln_errf(KILN_EIO, "cannot open %s: %s", logp, strerror(e));
        free(logp);
        return rc;
    }
    free(logp);
    fflush(NULL);
    pid_t c = fork();
    if (c < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        close(logfd);
        return kiln_errf(KILN_EIO, "fork: %s", strerror(e));
    }
    if (c == 0) {
        /* The run's environment is set here, in the child: kilnd's threads
         * (the push workers) read the environment while its loop launches. */
        apply_env(env);
        setsid();
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        /* Keep only stdio and the ready pipe: not the database, the epoll
         * set or kilnd's lock (which must die with kilnd). */
        int ready = fcntl(p[1], F_DUPFD, 3);
        if (ready > 3)
            dup2(ready, 3);
        ready = 3;
        close_range(4, ~0U, 0);
        for (int sig = 1; sig < NSIG; sig++)
            if (sig != SIGKILL && sig != SIGSTOP)
                signal(sig, SIG_DFL);
        supervise(run_dir, argv, grace_ms, follow, poll_ms, ready);
    }
    close(p[1]);
    close(logfd);
    char ok = 0;
    ssize_t r;
    do
        r = read(p[0], &ok, 1);
    while (r < 0 && errno == EINTR);
    close(p[0]);
    *pid = c;
    if (r != 1 || ok != 'k')
        KILN_WARN("supervisor %d of %s did not start the run cleanly", (int)c, run_dir);
    return 0;
}

int sched_stop_request(const char *run_dir, pid_t sup_pid, const char *reason)
{
    int rc = run_stop_write(run_dir, reason);
    if (sup_pid > 0 && kill(sup_pid, SIGTERM) < 0 && errno != ESRCH)
        KILN_WARN("SIGTERM to supervisor %d: %s", (int)sup_pid, strerror(errno));
    return rc;
}

/* ---- why a run failed ----------------------------------------------------------- */

static const char *signame(int sig, char *buf, size_t cap)
{
    const char *abbr = sigabbrev_np(sig);
    snprintf(buf, cap, "SIG%s", abbr ? abbr : "?");
    return buf;
}

char *sched_failure_reason(const char *run_dir, const run_status_t *stat)
{
    char sb[32];
    char *path = run_path(run_dir, RUN_FILE_LOG);
    char *tail = NULL;
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    free(path);
    if (f != NULL) {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        long from = size > 65536 ? size - 65536 : 0;
        fseek(f, from, SEEK_SET);
        tail = kiln_calloc(1, (size_t)(size - from) + 1);
        if (tail != NULL && fread(tail, 1, (size_t)(size - from), f) == 0)
            tail[0] = '\0';
        fclose(f);
    }
    char *out = NULL;
    char trainer_line[512] = "", last_line[512] = "";
    int dead_rank = -1, dead_sig = 0, dead_code = -1;
    char dead_host[256] = "?";
    for (char *line = tail, *next; line != NULL && *line; line = next) {
        next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        int r, pid, sig;
        char host[256];
        const char *p;
        if ((p = strstr(line, "noticed that process rank")) != NULL &&
            sscanf(p, "noticed that process rank %d with PID %d on node %255s exited on signal %d",
                   &r, &pid, host, &sig) == 4 &&
            dead_rank < 0) {
            dead_rank = r;
            dead_sig = sig;
            snprintf(dead_host, sizeof dead_host, "%s", host);
        } else if ((p = strstr(line, "kiln-train: rank ")) != NULL && trainer_line[0] == '\0') {
            snprintf(trainer_line, sizeof trainer_line, "%s", p + strlen("kiln-train: "));
        } else if ((p = strstr(line, "Process name: [[")) != NULL) {
            const char *comma = strchr(p, ',');
            if (comma != NULL && dead_rank < 0)
                dead_rank = atoi(comma + 1);
        } else if ((p = strstr(line, "Exit code:")) != NULL && dead_code < 0) {
            dead_code = atoi(p + strlen("Exit code:"));
        }
        if (line[0] != '\0' && line[0] != '-' && strspn(line, " \t") < strlen(line))
            snprintf(last_line, sizeof last_line, "%s", line);
    }
    if (dead_sig > 0)
        out = kiln_asprintf("rank %d on host %s was killed by signal %d (%s)", dead_rank, dead_host,
                            dead_sig, signame(dead_sig, sb, sizeof sb));
    else if (trainer_line[0] != '\0')
        out = kiln_asprintf("%s (exit %d)", trainer_line, stat->exit_code);
    else if (stat->signal > 0)
        out = kiln_asprintf("mpirun was killed by signal %d (%s)", stat->signal,
                            signame(stat->signal, sb, sizeof sb));
    else if (dead_rank >= 0)
        out = kiln_asprintf("rank %d exited with code %d", dead_rank, dead_code);
    else if (stat->exit_code == 127 || stat->exit_code == 126)
        out = kiln_asprintf("the launcher could not be started: %s", last_line);
    else
        out = kiln_asprintf("exit code %d; last log line: %s", stat->exit_code,
                            last_line[0] ? last_line : "(empty log)");
    free(tail);
    return out;
}
