/*
 * tests/support/proc.c - processes for the tests: capture a command's
 * output and status, temp directories, Open MPI's settings, ports and raw
 * loopback connections (tests/support/proc.h).
 */
#include "proc.h"

#include "kiln.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void proc_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void proc_slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

unsigned char *proc_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    *len = (size_t)n;
    return b;
}

int proc_tmpdir(const char *name, char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/kiln-test-%s-XXXXXX", name);
    return mkdtemp(dir) != NULL ? 0 : -1;
}

int proc_stat(int pid, char *name, size_t cap, char *state, int *ppid, int *pgid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    proc_slurp(path, buf, sizeof buf);
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (open == NULL || close == NULL || close < open ||
        sscanf(close + 2, "%c %d %d", state, ppid, pgid) != 3)
        return -1;
    close[1] = '\0';
    snprintf(name, cap, "%s", open);
    return 0;
}

int proc_rmtree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The session of process pid, or -1 when it is gone. */
static long proc_session(int pid)
{
    pid_t sid;
    return kiln_pid_stat((pid_t)pid, NULL, &sid, NULL) == 0 ? (long)sid : -1;
}

/* SIGKILL to every session that holds a process working in dir: the runs a
 * test's kilnd started outlive kilnd by design (each leads a session of its
 * own), and one still writing its checkpoint makes the directory's removal
 * fail. Waits up to 5 s for them to go. */
static void kill_sessions_under(const char *dir)
{
    const size_t dl = strlen(dir);
    const long self = proc_session(getpid());
    for (int round = 0; round < 50; round++) {
        long sids[64];
        int ns = 0;
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL && ns < 64) {
            int pid = atoi(e->d_name);
            char link[64], cwd[1024];
            snprintf(link, sizeof link, "/proc/%d/cwd", pid);
            ssize_t n = pid > 0 ? readlink(link, cwd, sizeof cwd - 1) : -1;
            if (n <= 0 || pid == getpid())
                continue;
            cwd[n] = '\0';
            long sid = proc_session(pid);
            if (strncmp(cwd, dir, dl) == 0 && (cwd[dl] == '/' || cwd[dl] == '\0') && sid > 0 &&
                sid != self)
                sids[ns++] = sid;
        }
        if (d != NULL)
            closedir(d);
        if (ns == 0)
            return;
        for (int i = 0; i < ns; i++)
            kill(-(pid_t)sids[i], SIGKILL); /* the session leader's group */
        d = opendir("/proc");
        while (d != NULL && (e = readdir(d)) != NULL) { /* and the rest of each session */
            int pid = atoi(e->d_name);
            long sid = pid > 0 ? proc_session(pid) : -1;
            for (int i = 0; i < ns && sid > 0; i++)
                if (sid == sids[i])
                    kill(pid, SIGKILL);
        }
        if (d != NULL)
            closedir(d);
        usleep(100 * 1000);
    }
}

int proc_tmpdir_done(const char *dir)
{
    if (getenv("KILN_TEST_KEEP") != NULL) {
        fprintf(stderr, "kept %s\n", dir);
        return 0;
    }
    kill_sessions_under(dir);
    return proc_rmtree(dir);
}

int proc_tmpdir_teardown(void **state)
{
    return *state != NULL ? proc_tmpdir_done(*state) : 0;
}

uint64_t proc_xorshift(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

void proc_mpi_env(bool leaks_off)
{
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    if (leaks_off) {
        const char *asan = getenv("ASAN_OPTIONS");
        char opts[1024];
        snprintf(opts, sizeof opts, "%s%sdetect_leaks=0", asan ? asan : "", asan ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
    }
}

/* The child's side of a spawn: stdout to fd out and stderr to fd err (each
 * left as it is when negative), Open MPI's settings (proc_mpi_env), each
 * "NAME=VALUE" of env set, then argv (argv[0] looked up in PATH). Never
 * returns. */
static void exec_child(int out, int err, bool leaks_off, const char *const *env,
                       const char *const *argv)
{
    if (out >= 0)
        dup2(out, 1);
    if (err >= 0)
        dup2(err, 2);
    proc_mpi_env(leaks_off);
    for (size_t i = 0; env != NULL && env[i] != NULL; i++)
        putenv((char *)env[i]);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
}

pid_t proc_spawn(const char *log, const char *const *env, const char *const *argv)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        exec_child(fd, fd, false, env, argv);
    }
    return pid;
}

void proc_run_env(proc_result_t *r, const char *scratch_dir, const char *const *env,
                  const char *const *argv)
{
    char outp[600], errp[600];
    snprintf(outp, sizeof outp, "%s/.stdout", scratch_dir);
    snprintf(errp, sizeof errp, "%s/.stderr", scratch_dir);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0)
            _exit(126);
        exec_child(o, e, getenv("ASAN_OPTIONS") != NULL, env, argv);
    }
    int status = 0;
    r->code = 127;
    if (pid > 0 && waitpid(pid, &status, 0) == pid)
        r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    proc_slurp(outp, r->out, sizeof r->out);
    proc_slurp(errp, r->err, sizeof r->err);
}

void proc_run(proc_result_t *r, const char *scratch_dir, const char *const *argv)
{
    proc_run_env(r, scratch_dir, NULL, argv);
}

int proc_sh(proc_result_t *r, const char *scratch_dir, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    proc_run(r, scratch_dir, argv);
    return r->code;
}

int proc_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int proc_connect_from(const char *src, int port, const char *first)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {5, 0};
    if (fd < 0 || inet_pton(AF_INET, src, &from.sin_addr) != 1 ||
        inet_pton(AF_INET, "127.0.0.1", &to.sin_addr) != 1 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
        bind(fd, (struct sockaddr *)&from, sizeof from) != 0 ||
        connect(fd, (struct sockaddr *)&to, sizeof to) != 0 ||
        (first != NULL && send(fd, first, strlen(first), MSG_NOSIGNAL) < 0)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

void proc_slow_open(proc_slow_t *s, int port, const char *first)
{
    proc_slow_open_from(s, port, first, "127.0.0.2", "127.0.0.3");
}

void proc_slow_open_from(proc_slow_t *s, int port, const char *first, const char *idle_src,
                         const char *trickle_src)
{
    for (int i = 0; i < PROC_SLOW_ALL; i++)
        s->fds[i] = i < PROC_SLOW_IDLE ? proc_connect_from(idle_src, port, NULL)
                                       : proc_connect_from(trickle_src, port, first);
}

void proc_slow_trickle(const proc_slow_t *s)
{
    for (int i = PROC_SLOW_IDLE; i < PROC_SLOW_ALL; i++)
        if (s->fds[i] >= 0)
            send(s->fds[i], "x", 1, MSG_NOSIGNAL);
}

void proc_slow_close(proc_slow_t *s)
{
    for (int i = 0; i < PROC_SLOW_ALL; i++)
        if (s->fds[i] >= 0)
            close(s->fds[i]);
}

int proc_signal_matching(const char *prog, const char *arg, int sig)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return 0;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (pid <= 0 || *end != '\0')
            continue;
        char path[300], args[8192];
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t len = fread(args, 1, sizeof args - 1, f);
        fclose(f);
        args[len] = '\0';
        const char *base = strrchr(args, '/');
        if (strcmp(base ? base + 1 : args, prog) != 0)
            continue;
        bool match = false;
        for (size_t i = 0; i < len; i += strlen(args + i) + 1)
            match = match || strcmp(args + i, arg) == 0;
        if (match && kill((pid_t)pid, sig) == 0)
            count++;
    }
    closedir(d);
    return count;
}

void proc_test_filter(void)
{
    const char *filter = getenv("KILN_TEST_FILTER");
    if (filter != NULL)
        cmocka_set_test_filter(filter);
}

int proc_test_run(const char *names, const proc_test_fn *fns, size_t n, proc_fixture_fn setup,
                  proc_fixture_fn teardown, proc_fixture_fn each_setup,
                  proc_fixture_fn each_teardown)
{
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    char *list = strdup(names);
    if (tests == NULL || list == NULL) {
        fprintf(stderr, "proc_test_run: out of memory for %zu tests\n", n);
        free(tests);
        free(list);
        return 1;
    }
    /* The stringized list: "test_a, test_b,   test_c" (the preprocessor
     * folds the white space between names). */
    char *save = NULL, *name = strtok_r(list, ", ", &save);
    size_t i = 0;
    for (; i < n && name != NULL; i++, name = strtok_r(NULL, ", ", &save))
        tests[i] = (struct CMUnitTest){name, fns[i], each_setup, each_teardown, NULL};
    int rc = 1;
    if (i == n && name == NULL) {
        proc_test_filter();
        rc = _cmocka_run_group_tests("tests", tests, n, setup, teardown);
    } else {
        fprintf(stderr, "proc_test_run: %zu tests but the names \"%s\"\n", n, names);
    }
    free(tests);
    free(list);
    return rc;
}
