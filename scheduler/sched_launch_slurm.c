/*
 * scheduler/sched_launch_slurm.c - the `slurm` launcher (docs/cluster.md).
 *
 * kilnd submits a run as a Slurm batch job and a supervisor follows it:
 *
 *   sched_slurm_argv()    writes run_dir/slurm.sh (srun --mpi=pmix kiln-train ...)
 *                         and returns the sbatch command: ranks -> --ntasks,
 *                         resources.nodes/partition/account/gpus_per_node/
 *                         threads/timeout -> their options, sbatch_args as given,
 *                         the job's output appended to run_dir/log.
 *   sched_slurm_follow()  the supervisor's body (instead of exec + wait): runs
 *                         sbatch, records the job id in run_dir/slurm.json at
 *                         once, then asks `scontrol show job` every poll until
 *                         the job ended (scancel on SIGTERM: cancel, replace),
 *                         and hands Slurm's end state to the status file.
 *
 * kilnd's side: sched_slurm_import() copies slurm.json into the database (the
 * run page shows the job id and nodes); sched_slurm_readopt() starts a new
 * supervisor for a job whose supervisor died (kill -9 of kilnd and its
 * supervisors, a rebooted head node): the job id in slurm.json is followed,
 * never resubmitted; sched_slurm_outcome() maps Slurm's end states to Kiln's.
 *
 * Why a supervisor per run rather than kilnd asking Slurm itself: Slurm's
 * commands block for up to MessageTimeout when slurmctld is busy or away, and
 * kilnd's one loop must not; the supervisor already carries a run across a
 * kilnd restart (pid file, pidfd, stop file, status file), so a Slurm run is
 * adopted, canceled and ended by the same code as an mpirun run.
 */
#include "sched_int.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLURM_CMD_TIMEOUT_MS 60000 /* one sbatch/scontrol/scancel call at most */
#define SLURM_JSON RUN_FILE_SLURM
#define SLURM_SCRIPT RUN_FILE_SLURM_SCRIPT

/* ---- the batch script and the sbatch command ---------------------------------------- */

/* Appends s to f as one single-quoted shell word. */
static void put_word(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", f);
        else
            fputc(*s, f);
    }
    fputc('\'', f);
}

/* run_dir/slurm.sh: Open MPI's settings, then srun of kiln-train. */
static int write_script(const sched_launch_ctx_t *c, const char *path)
{
    const job_spec_t *spec = c->spec;
    sched_argv_t t = {0};
    char **trainer = NULL;
    sched_argv_trainer(&t, c);
    KILN_CHECK(sched_argv_finish(&t, &trainer));
    kiln_atomic_t out;
    int rc = kiln_atomic_open(path, &out);
    if (rc < 0) {
        sched_argv_free(trainer);
        return rc;
    }
    FILE *f = out.f;
    fprintf(f, "#!/bin/sh\n"
               "# Kiln run %lld of job %s: written by kilnd, submitted with sbatch.\n",
            (long long)c->run_id, spec->name);
    /* A rank waiting in a collective yields its core (see sched_launch_mpi.c). */
    fprintf(f, "export OMPI_MCA_mpi_yield_when_idle=1\n");
    if (spec->resources.mpi.interfaces != NULL) {
        fprintf(f, "export OMPI_MCA_btl_tcp_if_include=");
        put_word(f, spec->resources.mpi.interfaces);
        fprintf(f, "\n");
    }
    if (spec->resources.mpi.transport == JOB_MPI_TCP)
        fprintf(f, "export OMPI_MCA_btl=tcp,self\n");
    fprintf(f, "echo \"kiln: Slurm job $SLURM_JOB_ID: $SLURM_NTASKS ranks on $SLURM_JOB_NODELIST\"\n");
    /* pmix: Debian's Open MPI has no PMI-1/PMI-2 client; it starts under
     * srun through PMIx only (docs/cluster.md, "MPI under srun"). */
    /* Slurm binds each rank to its --cpus-per-task CPUs: resources.threads. */
    fprintf(f, "exec srun --mpi=pmix --kill-on-bad-exit=1");
    if (spec->resources.threads > 0)
        fprintf(f, " --cpus-per-task=%d", spec->resources.threads);
    for (size_t i = 0; trainer[i] != NULL; i++) {
        fputc(' ', f);
        put_word(f, trainer[i]);
    }
    fputc('\n', f);
    sched_argv_free(trainer);
    if (fchmod(fileno(f), 0755) < 0) {
        rc = kiln_errf(KILN_EIO, "cannot make %s executable: %s", path, strerror(errno));
        kiln_atomic_abort(&out);
        return rc;
    }
    return kiln_atomic_commit(&out);
}

int sched_slurm_argv(const sched_launch_ctx_t *c, char ***out)
{
    const job_spec_t *spec = c->spec;
    char script[4096];
    snprintf(script, sizeof script, "%s/%s", c->run_dir, SLURM_SCRIPT);
    KILN_CHECK(write_script(c, script));

    sched_argv_t a = {0};
    sched_argv_push(&a, "sbatch");
    sched_argv_push(&a, "--parsable");
    sched_argv_pushf(&a, "--job-name=kiln.%s.%lld", spec->name, (long long)c->run_id);
    sched_argv_pushf(&a, "--ntasks=%d", spec->resources.ranks);
    if (spec->resources.nodes > 0)
        sched_argv_pushf(&a, "--nodes=%d", spec->resources.nodes);
    if (spec->resources.threads > 0)
        sched_argv_pushf(&a, "--cpus-per-task=%d", spec->resources.threads);
    if (spec->resources.partition != NULL)
        sched_argv_pushf(&a, "--partition=%s", spec->resources.partition);
    if (spec->resources.account != NULL)
        sched_argv_pushf(&a, "--account=%s", spec->resources.account);
    if (spec->resources.gpus_per_node > 0)
        sched_argv_pushf(&a, "--gpus-per-node=%d", spec->resources.gpus_per_node);
    /* Slurm's limits are whole minutes: round up. */
    if (spec->resources.timeout_ms > 0)
        sched_argv_pushf(&a, "--time=%lld",
                         (long long)((spec->resources.timeout_ms + 59999) / 60000));
    /* A node failure or a preemption ends the job; Kiln retries it from its
     * newest checkpoint (retries.*), so Slurm must not requeue it as well. */
    sched_argv_push(&a, "--no-requeue");
    sched_argv_pushf(&a, "--output=%s/log", c->run_dir);
    sched_argv_push(&a, "--open-mode=append");
    sched_argv_pushf(&a, "--chdir=%s", c->run_dir);
    for (int i = 0; i < spec->resources.nsbatch_args; i++)
        sched_argv_push(&a, spec->resources.sbatch_args[i]);
    sched_argv_push(&a, script);
    return sched_argv_finish(&a, out);
}

/* ---- running Slurm's commands ----------------------------------------------------------- */

/* Runs argv with stdout and stderr into out (NUL-terminated, cut at cap - 1)
 * and stdin from /dev/null, at most SLURM_CMD_TIMEOUT_MS. Returns the exit
 * code, 128 + signal, 127 when it could not be started, 124 on timeout. */
static int run_cmd(char *const argv[], char *out, size_t cap)
{
    int p[2];
    out[0] = '\0';
    if (pipe2(p, O_CLOEXEC) < 0) {
        snprintf(out, cap, "pipe: %s", strerror(errno));
        return 127;
    }
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int devnull = open("/dev/null", O_RDONLY);
        dup2(devnull, 0);
        dup2(p[1], 1);
        dup2(p[1], 2);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    int64_t deadline = kiln_mono_ns() / 1000000 + SLURM_CMD_TIMEOUT_MS;
    bool timed_out = false;
    while (pid > 0) {
        int64_t left = deadline - kiln_mono_ns() / 1000000;
        if (left <= 0) {
            timed_out = true;
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd pf = {p[0], POLLIN, 0};
        int r = poll(&pf, 1, (int)(left > 1000 ? 1000 : left));
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        char buf[1024];
        ssize_t n = read(p[0], buf, sizeof buf);
        if (n <= 0)
            break;
        size_t take = len + (size_t)n < cap - 1 ? (size_t)n : cap - 1 - len;
        memcpy(out + len, buf, take);
        len += take;
    }
    out[len] = '\0';
    close(p[0]);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return 127;
    if (timed_out)
        return 124;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The last non-empty line of text, trimmed, into buf. */
static const char *last_line(const char *text, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        if (n > 0)
            snprintf(buf, cap, "%.*s", (int)n, l);
        l = e ? e + 1 : l + n;
    }
    return buf;
}

/* Whether Slurm's complaint is about reaching slurmctld (try again later),
 * not about the request. */
static bool transient(const char *text)
{
    static const char *const words[] = {"Unable to contact slurm controller",
                                        "Socket timed out", "Zero Bytes were transmitted",
                                        "Connection refused", "Slurm backup controller in standby",
                                        "Resource temporarily unavailable"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strstr(text, words[i]) != NULL)
            return true;
    return false;
}

/* ---- run_dir/slurm.json ------------------------------------------------------------------ */

typedef struct {
    int64_t job_id;
    char state[32], nodes[256], partition[128], reason[256];
    int exit_code, signal;
} job_info_t;

static void json_path(const char *run_dir, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", run_dir, SLURM_JSON);
}

static int info_read(const char *run_dir, job_info_t *j)
{
    char path[4096];
    json_path(run_dir, path, sizeof path);
    memset(j, 0, sizeof *j);
    json_t *v = json_load_file(path, 0, NULL);
    if (v == NULL)
        return KILN_ENOENT;
    j->job_id = json_integer_value(json_object_get(v, "job_id"));
    const char *keys[] = {"state", "nodes", "partition", "reason"};
    char *dst[] = {j->state, j->nodes, j->partition, j->reason};
    size_t cap[] = {sizeof j->state, sizeof j->nodes, sizeof j->partition, sizeof j->reason};
    for (size_t i = 0; i < 4; i++) {
        const char *x = json_string_value(json_object_get(v, keys[i]));
        snprintf(dst[i], cap[i], "%s", x ? x : "");
    }
    json_decref(v);
    return j->job_id > 0 ? 0 : KILN_ENOENT;
}

static void info_write(const char *run_dir, const job_info_t *j)
{
    char path[4096];
    json_path(run_dir, path, sizeof path);
    json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:s, s:I}", "job_id", (json_int_t)j->job_id,
                          "state", j->state, "nodes", j->nodes, "partition", j->partition,
                          "reason", j->reason, "updated_at", (json_int_t)kiln_now_s());
    char *text = o ? json_dumps(o, JSON_PRESERVE_ORDER) : NULL;
    if (text != NULL)
        kiln_write_atomic(path, text, strlen(text));
    free(text);
    json_decref(o);
}

/* ---- asking Slurm about a job --------------------------------------------------------------- */

/* The value of " KEY=" in scontrol's one-line output, up to the next space. */
static void field(const char *line, const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    out[0] = '\0';
    const char *p = strncmp(line, pat + 1, strlen(pat + 1)) == 0 ? line : strstr(line, pat);
    if (p == NULL)
        return;
    p = strchr(p, '=') + 1;
    size_t n = strcspn(p, " \n");
    snprintf(out, cap, "%.*s", (int)n, p);
}

typedef enum { ASK_OK, ASK_GONE, ASK_UNREACHABLE } ask_t;

/* scontrol -o show job ID into j (state, nodes, partition, reason, exit code). */
static ask_t ask(int64_t job_id, job_info_t *j, char *err, size_t errcap)
{
    char id[32], out[16384], x[64];
    snprintf(id, sizeof id, "%lld", (long long)job_id);
    char *argv[] = {"scontrol", "--oneliner", "show", "job", id, NULL};
    int rc = run_cmd(argv, out, sizeof out);
    if (rc != 0 || strstr(out, "JobState=") == NULL) {
        last_line(out, err, errcap);
        if (strstr(out, "Invalid job id") != NULL)
            return ASK_GONE;
        return ASK_UNREACHABLE;
    }
    field(out, "JobState", j->state, sizeof j->state);
    field(out, "NodeList", j->nodes, sizeof j->nodes);
    if (strcmp(j->nodes, "(null)") == 0)
        j->nodes[0] = '\0';
    field(out, "Partition", j->partition, sizeof j->partition);
    field(out, "Reason", j->reason, sizeof j->reason);
    field(out, "ExitCode", x, sizeof x);
    j->exit_code = atoi(x);
    const char *colon = strchr(x, ':');
    j->signal = colon ? atoi(colon + 1) : 0;
    return ASK_OK;
}

/* A job slurmctld forgot (it ended more than MinJobAge ago): sacct has it
 * when the cluster keeps accounting. */
static ask_t ask_sacct(int64_t job_id, job_info_t *j, char *err, size_t errcap)
{
    char id[32], out[4096];
    snprintf(id, sizeof id, "%lld", (long long)job_id);
    char *argv[] = {"sacct", "--noheader", "--parsable2", "--allocations", "--jobs", id,
                    "--format=State,ExitCode,NodeList,Partition", NULL};
    int rc = run_cmd(argv, out, sizeof out);
    char st[32] = "", code[32] = "", nodes[256] = "", part[128] = "";
    if (rc != 0 || sscanf(out, "%31[^|]|%31[^|]|%255[^|]|%127[^|\n]", st, code, nodes, part) < 2) {
        last_line(out, err, errcap);
        return ASK_GONE;
    }
    st[strcspn(st, " ")] = '\0'; /* "CANCELLED by 0" */
    snprintf(j->state, sizeof j->state, "%s", st);
    snprintf(j->nodes, sizeof j->nodes, "%s", nodes);
    snprintf(j->partition, sizeof j->partition, "%s", part);
    j->exit_code = atoi(code);
    j->signal = strchr(code, ':') ? atoi(strchr(code, ':') + 1) : 0;
    return ASK_OK;
}

static bool terminal(const char *state)
{
    static const char *const ends[] = {"COMPLETED", "FAILED",   "TIMEOUT",       "NODE_FAIL",
                                       "PREEMPTED", "CANCELLED", "BOOT_FAIL",    "DEADLINE",
                                       "OUT_OF_MEMORY", "LOST"};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
        if (strcmp(state, ends[i]) == 0)
            return true;
    return false;
}

/* ---- the follower (the supervisor's body) ----------------------------------------------------- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char when[KILN_ISO_LEN];
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kilnd supervisor %s: ", kiln_time_iso(kiln_now_s(), when, sizeof when));
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
}

static bool stop_asked(const char *run_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/stop", run_dir);
    return access(path, F_OK) == 0;
}

/* sbatch argv; the job id into j, or the end of the run into out. */
static bool submit(const char *run_dir, char *const argv[], job_info_t *j, run_status_t *out)
{
    char text[8192], line[512];
    int rc = run_cmd(argv, text, sizeof text);
    /* --parsable: "ID" or "ID;CLUSTER" on a line of its own (warnings may
     * come before it: stderr is in text too). */
    long long id = 0;
    for (const char *l = text; rc == 0 && *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0)) {
        char *end;
        long long v = strtoll(l, &end, 10);
        if (end != l && (*end == '\n' || *end == ';' || *end == '\0') && v > 0)
            id = v;
    }
    if (id > 0) {
        j->job_id = id;
        snprintf(j->state, sizeof j->state, "PENDING");
        info_write(run_dir, j); /* first: a supervisor killed from here on is re-adopted */
        say("submitted Slurm job %lld", id);
        return true;
    }
    last_line(text, line, sizeof line);
    say("sbatch failed (exit %d): %s", rc, line);
    snprintf(out->job_state, sizeof out->job_state, "%s",
             rc == 127      ? "SUBMIT_NOCMD"
             : transient(text) ? "SUBMIT_RETRY"
                               : "SUBMIT_FAILED");
    snprintf(out->job_reason, sizeof out->job_reason, "%s", line[0] ? line : "no output");
    out->exit_code = rc;
    return false;
}

static void cancel(const char *run_dir, int64_t job_id)
{
    char id[32], text[2048], line[512], why[32] = "";
    snprintf(id, sizeof id, "%lld", (long long)job_id);
    FILE *f = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/stop", run_dir);
    if ((f = fopen(path, "r")) != NULL) {
        if (fgets(why, sizeof why, f) == NULL)
            why[0] = '\0';
        fclose(f);
    }
    char *argv[] = {"scancel", id, NULL};
    int rc = run_cmd(argv, text, sizeof text);
    say("stopping the run (%s): scancel %s%s%s", why[0] ? why : "SIGTERM", id,
        rc ? ": " : "", rc ? last_line(text, line, sizeof line) : "");
}

/* Names the job's nodes that are down and why (for NODE_FAIL). */
static void down_nodes(const char *nodes, char *out, size_t cap)
{
    char text[4096];
    out[0] = '\0';
    if (nodes[0] == '\0')
        return;
    char *argv[] = {"sinfo", "--noheader", "--Node", "--nodes", (char *)nodes,
                    "--states=down,drain,fail,no_respond", "--format=%N: %E", NULL};
    if (run_cmd(argv, text, sizeof text) != 0)
        return;
    size_t len = 0;
    for (char *l = strtok(text, "\n"); l != NULL && len + 2 < cap; l = strtok(NULL, "\n")) {
        if (strstr(out, l) != NULL) /* one line per partition: once each */
            continue;
        len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? "; " : "", l);
    }
}

void sched_slurm_follow(const char *run_dir, char *const argv[], const sched_follow_opts_t *o,
                        run_status_t *out)
{
    const sigset_t *sigs = o->sigs;
    job_info_t j, seen;
    char err[512] = "";
    memset(&seen, 0, sizeof seen);
    if (info_read(run_dir, &j) == 0) {
        say("following Slurm job %lld (adopted)", (long long)j.job_id);
    } else {
        memset(&j, 0, sizeof j);
        if (stop_asked(run_dir) || argv == NULL) {
            out->exit_code = -1;
            snprintf(out->job_state, sizeof out->job_state, "SUBMIT_RETRY");
            snprintf(out->job_reason, sizeof out->job_reason, "%s",
                     argv == NULL ? "no Slurm job id in the run directory"
                                  : "stopped before it was submitted");
            return;
        }
        if (!submit(run_dir, argv, &j, out))
            return;
    }
    out->job_id = j.job_id;
    bool stopping = false;
    int64_t cancel_at = 0; /* when scancel last ran */
    int64_t poll_ms = o->poll_ms > 0 ? o->poll_ms : 5000;
    int64_t unreachable_since = 0;
    for (;;) {
        /* Asked before this supervisor started (a re-adoption), or scancel
         * did not take (slurmctld away): ask again every 10 s. */
        if ((!stopping && stop_asked(run_dir)) ||
            (stopping && kiln_now_s() - cancel_at >= 10 && !terminal(j.state) &&
             strcmp(j.state, "COMPLETING") != 0)) {
            cancel(run_dir, j.job_id);
            cancel_at = kiln_now_s();
            stopping = true;
        }
        ask_t r = ask(j.job_id, &j, err, sizeof err);
        if (r == ASK_GONE && ask_sacct(j.job_id, &j, err, sizeof err) != ASK_OK) {
            snprintf(j.state, sizeof j.state, "LOST");
            snprintf(j.reason, sizeof j.reason,
                     "Slurm no longer knows job %lld (it ended more than MinJobAge ago and "
                     "the cluster keeps no accounting for sacct)",
                     (long long)j.job_id);
        }
        if (r == ASK_UNREACHABLE) {
            if (unreachable_since == 0) {
                unreachable_since = kiln_now_s();
                say("cannot ask Slurm about job %lld (%s); asking again every %lld ms",
                    (long long)j.job_id, err, (long long)poll_ms);
            }
        } else {
            if (unreachable_since != 0)
                say("Slurm answers again after %lld s", (long long)(kiln_now_s() - unreachable_since));
            unreachable_since = 0;
            if (strcmp(j.state, seen.state) != 0 || strcmp(j.nodes, seen.nodes) != 0) {
                say("Slurm job %lld %s%s%s (%s)", (long long)j.job_id, j.state,
                    j.nodes[0] ? " on " : "", j.nodes, j.reason);
                info_write(run_dir, &j);
                seen = j;
            }
            if (terminal(j.state))
                break;
        }
        /* Wait one poll, or less after a stop (the end comes soon); a stop
         * ends the wait, the SIGCHLD of a finished scontrol does not. */
        int64_t wait = stopping ? (poll_ms < 1000 ? poll_ms : 1000) : poll_ms;
        int64_t until = kiln_mono_ns() / 1000000 + wait;
        for (int64_t left = wait; left > 0; left = until - kiln_mono_ns() / 1000000) {
            struct timespec ts = {left / 1000, (long)(left % 1000) * 1000000L};
            siginfo_t si;
            int sig = sigtimedwait(sigs, &si, &ts);
            if (sig < 0 && errno != EINTR)
                break; /* the poll is up */
            if (sig == SIGTERM || sig == SIGINT) {
                if (!stopping) {
                    cancel(run_dir, j.job_id);
                    cancel_at = kiln_now_s();
                    stopping = true;
                }
                break;
            }
        }
    }
    out->exit_code = j.exit_code;
    out->signal = j.signal;
    snprintf(out->job_state, sizeof out->job_state, "%s", j.state);
    snprintf(out->job_nodes, sizeof out->job_nodes, "%s", j.nodes);
    if (strcmp(j.state, "NODE_FAIL") == 0)
        down_nodes(j.nodes, out->job_reason, sizeof out->job_reason);
    else
        snprintf(out->job_reason, sizeof out->job_reason, "%s", j.reason);
}

/* ---- kilnd's side ------------------------------------------------------------------------------ */

void sched_slurm_import(sched_t *s, sched_active_t *a)
{
    job_info_t j;
    if (a->run_dir == NULL || info_read(a->run_dir, &j) < 0)
        return;
    state_slurm_job_t old;
    if (state_slurm_job_get(s->st, a->run_id, &old) == 0) {
        bool same = old.job_id == j.job_id && old.state != NULL && strcmp(old.state, j.state) == 0 &&
                    strcmp(old.nodes ? old.nodes : "", j.nodes) == 0;
        state_slurm_job_fini(&old);
        if (same)
            return;
    }
    state_slurm_job_t now = {a->run_id, j.job_id, j.state, j.nodes, j.partition, 0};
    if (state_slurm_job_put(s->st, &now) < 0)
        KILN_WARN("run %lld: cannot record Slurm job %lld: %s", (long long)a->run_id,
                  (long long)j.job_id, kiln_errmsg());
}

/* Followers started for one run before kilnd gives up on following it (each
 * one died without a status: something is wrong with this host, not the job). */
#define MAX_FOLLOWS 5

bool sched_slurm_readopt(sched_t *s, sched_active_t *a)
{
    run_status_t stat;
    job_info_t j;
    if (a->run_dir == NULL || run_status_read(a->run_dir, &stat) == 0 ||
        info_read(a->run_dir, &j) < 0)
        return false;
    if (a->follows >= MAX_FOLLOWS) {
        KILN_WARN("run %lld: %d supervisors following Slurm job %lld died; giving up on it",
                  (long long)a->run_id, a->follows, (long long)j.job_id);
        return false;
    }
    pid_t pid = 0;
    if (sched_supervise_spawn_follow(a->run_dir, NULL, NULL, s->o.grace_ms, sched_slurm_follow,
                                     s->o.slurm_poll_ms, &pid) < 0) {
        KILN_WARN("run %lld: cannot follow Slurm job %lld again: %s", (long long)a->run_id,
                  (long long)j.job_id, kiln_errmsg());
        return false;
    }
    sched_unwatch(s, a);
    a->pid = pid;
    a->child = true;
    a->followed = true;
    a->backstop_ms = 0;
    a->follows++;
    if (sched_watch(s, a) < 0)
        KILN_WARN("run %lld: %s; its end is noticed on SIGCHLD only", (long long)a->run_id,
                  kiln_errmsg());
    char msg[512];
    snprintf(msg, sizeof msg, "adopted Slurm job %lld by its id (%s%s%s); supervisor %d follows it",
             (long long)j.job_id, j.state, j.nodes[0] ? " on " : "", j.nodes, (int)pid);
    state_event_add(s->st, a->job_id, a->run_id, "adopted", msg);
    KILN_INFO("run %lld: %s", (long long)a->run_id, msg);
    return true;
}

/* "rank N on host H was killed (srun: ...)" from srun's report of a task that
 * died of a signal, or NULL. */
static char *srun_killed(const char *run_dir)
{
    char path[4096], line[1024], *out = NULL;
    snprintf(path, sizeof path, "%s/log", run_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    if (fseek(f, -65536, SEEK_END) != 0)
        rewind(f);
    while (out == NULL && fgets(line, sizeof line, f) != NULL) {
        /* "<host>: task <n>: <what>" for one task, "<host>: tasks <n>-<m>: <what>"
         * for several (a scanf "%*[s]" needs at least one s, so the s is
         * skipped by hand). */
        const char *p = strstr(line, "srun: error: ");
        char host[256];
        int task = -1, n = 0;
        if (p == NULL || sscanf(p + 13, "%255[^:]: task%n", host, &n) < 1 || n == 0)
            continue;
        p += 13 + n;
        if (*p == 's')
            p++;
        if (sscanf(p, " %d%n", &task, &n) < 1)
            continue;
        const char *what = strstr(p + n, ": ");
        if (what == NULL || strstr(what, "Exited with exit code") != NULL)
            continue;
        what += 2;
        line[strcspn(line, "\n")] = '\0';
        out = kiln_asprintf("rank %d on host %s was killed (srun: %s)", task, host, what);
    }
    fclose(f);
    return out;
}

void sched_slurm_outcome(const char *run_dir, const run_status_t *st, const job_spec_t *spec,
                         state_run_state_t *to, char **error, bool *retryable)
{
    const char *state = st->job_state;
    long long id = (long long)st->job_id;
    *to = STATE_RUN_FAILED;
    *retryable = false;
    *error = NULL;
    if (strcmp(state, "SUBMIT_FAILED") == 0) {
        *error = kiln_asprintf("Slurm refused the job: %s (check resources.partition, account, "
                               "gpus_per_node and sbatch_args)",
                               st->job_reason);
    } else if (strcmp(state, "SUBMIT_NOCMD") == 0) {
        *error = kiln_asprintf("cannot submit to Slurm from kilnd's host: %s (install "
                               "slurm-client there, or put sbatch on kilnd's PATH)",
                               st->job_reason);
    } else if (strcmp(state, "SUBMIT_RETRY") == 0) {
        *error = kiln_asprintf("could not submit to Slurm: %s", st->job_reason);
        *retryable = true;
    } else if (strcmp(state, "TIMEOUT") == 0 || strcmp(state, "DEADLINE") == 0) {
        char d[32] = "?";
        if (spec != NULL)
            kiln_duration_format(spec->resources.timeout_ms, d, sizeof d);
        *to = STATE_RUN_TIMED_OUT;
        *error = kiln_asprintf("timed out: Slurm job %lld reached its time limit (%s, from "
                               "resources.timeout %s rounded up to whole minutes)",
                               id, state, d);
    } else if (strcmp(state, "NODE_FAIL") == 0) {
        *error = kiln_asprintf("node failure: Slurm job %lld ended NODE_FAIL on %s%s%s%s", id,
                               st->job_nodes[0] ? st->job_nodes : "its nodes",
                               st->job_reason[0] ? " (" : "", st->job_reason,
                               st->job_reason[0] ? ")" : "");
        *retryable = true;
    } else if (strcmp(state, "PREEMPTED") == 0) {
        *error = kiln_asprintf("preempted: Slurm job %lld gave way to a higher-priority job",
                               id);
        *retryable = true;
    } else if (strcmp(state, "BOOT_FAIL") == 0) {
        *error = kiln_asprintf("Slurm job %lld ended BOOT_FAIL: its nodes did not boot", id);
        *retryable = true;
    } else if (strcmp(state, "OUT_OF_MEMORY") == 0) {
        *error = kiln_asprintf("out of memory: Slurm job %lld ended OUT_OF_MEMORY on %s; ask for "
                               "more with resources.sbatch_args: [\"--mem=...\"]",
                               id, st->job_nodes);
    } else if (strcmp(state, "CANCELLED") == 0) {
        *to = STATE_RUN_CANCELED;
        *error = kiln_asprintf("Slurm job %lld was canceled outside Kiln (scancel, or an "
                               "administrator)",
                               id);
    } else if (strcmp(state, "LOST") == 0) {
        *error = kiln_asprintf("lost: %s", st->job_reason);
        *retryable = true;
    } else { /* FAILED, or a state this build does not know */
        char *why = srun_killed(run_dir);
        if (why == NULL)
            why = sched_failure_reason(run_dir, st);
        *error = kiln_asprintf("%s (Slurm job %lld %s, exit %d)", why ? why : "failed", id, state,
                               st->exit_code);
        free(why);
        *retryable = st->exit_code == 3 || st->exit_code > 128 || st->signal != 0;
    }
    /* What the user can do about a run lost to the cluster, when Kiln will not. */
    if (*retryable && *error != NULL && spec != NULL && spec->retries.count == 0) {
        char *more = kiln_asprintf("%s; with retries.count > 0 Kiln retries it from its newest "
                                   "checkpoint",
                                   *error);
        if (more != NULL) {
            free(*error);
            *error = more;
        }
    }
}
