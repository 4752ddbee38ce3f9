/*
 * bench/sched_bench.c - kilnd's submit-to-launch latency and its idle CPU.
 *
 *   sched_bench KILND [--samples N]
 *
 * For each history size (10k and 100k ended runs, inserted directly into a
 * fresh database), it starts KILND with a stub "mpirun" (/bin/true, so a
 * launch costs only the supervisor's fork and exec), queues N runs one at a
 * time the way `kiln submit` does (state_run_create from another process)
 * and times each from the commit to the run leaving `queued` (median, p99).
 * Then it leaves kilnd idle for 10 s and reads its utime+stime from
 * /proc/PID/stat. Results go to stdout as a Markdown table
 * (docs/benchmarks.md, "Scheduler").
 *
 * The bound, measured in the same run: fork + exec + exit of /bin/true from
 * this process (median of N), the least any launcher that starts a process
 * per run can take.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kiln.h"
#include "state_test.h" /* state_test_exec: bulk history rows */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double cpu_s(pid_t pid)
{
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *q = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (q == NULL || sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
                            &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int bench(const char *kilnd, int history, int samples)
{
    char home[] = "/tmp/kiln-sched-bench-XXXXXX";
    if (mkdtemp(home) == NULL)
        return 1;
    char db[128], spec_path[160], sql[2048];
    snprintf(db, sizeof db, "%s/kiln.db", home);
    snprintf(spec_path, sizeof spec_path, "%s/bench.yaml", home);
    state_t *st = NULL;
    if (state_open(db, &st) < 0) {
        fprintf(stderr, "sched_bench: %s\n", kiln_errmsg());
        return 1;
    }
    const char *spec = "name: bench\nresources: {ranks: 1}\ndata: {train: \"/dev/null\"}\n"
                       "model: {type: lr, embedding: {dim: 1, capacity: 1000}}\n";
    int64_t job = 0;
    state_job_put(st, "bench", spec, "0000000000000000", NULL, 0, &job, NULL);
    state_event_add(st, job, 0, "submit", "submitted from /dev/null (version 1)");
    /* The history: ended runs with a few events each, as a busy year leaves. */
    snprintf(sql, sizeof sql,
             "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %d) "
             "INSERT INTO runs (job_id, job_version, state, trigger, attempt, scheduled_at, "
             "queued_at, started_at, ended_at, exit_code) SELECT %lld, 1, "
             "CASE i %% 10 WHEN 0 THEN 'failed' ELSE 'succeeded' END, 'cron', 1, i * 60, "
             "i * 60, i * 60 + 1, i * 60 + 30, 0 FROM n;"
             "INSERT INTO events (job_id, run_id, at, kind, message) SELECT job_id, id, "
             "queued_at, 'state', 'running -> succeeded (exit 0)' FROM runs;",
             history, (long long)job);
    if (state_test_exec(st, sql) < 0) {
        fprintf(stderr, "sched_bench: %s\n", kiln_errmsg());
        return 1;
    }
    pid_t k = fork();
    if (k == 0) {
        freopen("/dev/null", "w", stderr);
        execl(kilnd, kilnd, "--db", db, "--home", home, "--mpirun", "/bin/true", "--trainer",
              "/bin/true", (char *)NULL);
        _exit(127);
    }
    sleep_ms(1500);
    double *lat = calloc((size_t)samples, sizeof *lat);
    for (int i = 0; i < samples; i++) {
        int64_t id = 0;
        int64_t t0 = kiln_mono_ns();
        if (state_run_create(st, job, STATE_TRIGGER_MANUAL, 0, 1, 0, &id) < 0)
            break;
        for (;;) {
            state_run_t r;
            if (state_run_get(st, id, &r) == 0) {
                bool left = r.state != STATE_RUN_QUEUED;
                state_run_fini(&r);
                if (left)
                    break;
            }
            if (kiln_mono_ns() - t0 > 10000000000LL)
                break;
            sleep_ms(1);
        }
        lat[i] = (double)(kiln_mono_ns() - t0) / 1e6;
        sleep_ms(50);
    }
    qsort(lat, (size_t)samples, sizeof *lat, cmp_d);
    double med = lat[samples / 2], p99 = lat[(samples * 99) / 100 >= samples ? samples - 1
                                                                             : (samples * 99) / 100];
    sleep_ms(2000);
    double c0 = cpu_s(k);
    sleep_ms(10000);
    double c1 = cpu_s(k);
    printf("| %d | %d | %.1f ms | %.1f ms | %.3f s in 10 s (%.2f%%) |\n", history, samples, med,
           p99, c1 - c0, (c1 - c0) * 10.0);
    fflush(stdout);
    kill(k, SIGTERM);
    waitpid(k, NULL, 0);
    free(lat);
    state_close(st);
    snprintf(sql, sizeof sql, "rm -rf '%s'", home);
    return system(sql) == 0 ? 0 : 1;
}

/* Median ms of fork + exec /bin/true + waitpid over n tries, or -1. */
static double spawn_floor(int n)
{
    double *t = malloc(sizeof(double) * (size_t)n), med = -1.0;
    if (t == NULL)
        return -1.0;
    int i = 0;
    for (; i < n; i++) {
        int64_t t0 = kiln_mono_ns();
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            break;
        t[i] = (double)(kiln_mono_ns() - t0) / 1e6;
    }
    if (i == n) {
        qsort(t, (size_t)n, sizeof *t, cmp_d);
        med = t[n / 2];
    }
    free(t);
    return med;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sched_bench KILND [--samples N]\n");
        return 2;
    }
    int samples = argc >= 4 && strcmp(argv[2], "--samples") == 0 ? atoi(argv[3]) : 100;
    if (samples < 2)
        samples = 2;
    printf("| history runs | samples | submit-to-launch median | p99 | kilnd idle CPU |\n"
           "|---|---|---|---|---|\n");
    int rc = bench(argv[1], 10000, samples);
    rc |= bench(argv[1], 100000, samples);
    printf("\nbound: fork + exec + exit of /bin/true, median of %d: %.2f ms\n", samples,
           spawn_floor(samples));
    return rc;
}
