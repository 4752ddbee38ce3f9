/*
 * tests/test_cluster.c - Kiln on a cluster (CTest label `cluster`): the real
 * kilnd, kiln-train and kiln on the test cluster of tools/testcluster.sh (a
 * head and two nodes in network namespaces; Debian's Slurm with one slurmd
 * per node and munge; sshd on each node for mpirun --hostfile). CTest runs
 * it as `tools/testcluster.sh run --package kiln.deb -- test_cluster`, so it
 * runs on the head, and the programs are the package's (/usr/bin in every
 * host's view); the cluster directory is the shared filesystem (data, Kiln's
 * home, checkpoints). Run by hand without the cluster it reports skipped.
 *
 *   slurm_two_nodes   4 ranks on 2 Slurm nodes from `kiln submit` to success
 *                     train bitwise the same model as 4 local ranks; Slurm
 *                     shows the job on both nodes; the run page and its JSON
 *                     show the job id and nodes; sbatch_args reach sbatch
 *   hostfile          the same with mpirun --hostfile over the nodes' sshd,
 *                     with resources.mpi (a subnet, TCP only)
 *   slurm_refuses     a partition Slurm lacks, GPUs it has not: failed at
 *                     once with sbatch's reason, not retried
 *   slurm_cancel      `kiln cancel` scancels the job: canceled, no rank left
 *   slurm_time_limit  resources.timeout becomes Slurm's --time: timed_out
 *   slurm_node_fail   a node dies mid-run (slurmd killed, the rest frozen):
 *                     NODE_FAIL, the retry resumes the newest checkpoint and
 *                     ends bitwise equal to the fault-free model
 *   slurm_preempted   a job in a higher-priority partition preempts the run:
 *                     PREEMPTED, retried from its checkpoint, same model
 *   installed         the package's files where a node sees them: programs,
 *                     docs, example specs, systemd units that systemd accepts
 *   kilnd_kill9       kill -9 of kilnd during a Slurm run: the next kilnd
 *                     adopts the supervisor; kill -9 of kilnd and the
 *                     supervisor: the next adopts the Slurm job by its id;
 *                     one Slurm job in all, one run, the same model
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "kiln.h"
#include "proc.h"
#include "ckpt.h"
#include "state.h"

#ifndef KILN_BIN
#error "KILN_BIN, KILND_BIN and KILN_TRAIN_BIN must name the executables"
#endif

static char kiln[512], kilnd[512], trainer[512]; /* the package's, else the build's */
static char root[256];                            /* on the shared filesystem */
static char ref_ck[400];  /* the checkpoints of the fault-free local 4-rank run */
static char home[400];    /* this test's KILN_HOME */
static char db[450];
static char testcluster[600];
static pid_t kilnd_pid;
static proc_result_t res;

#define RANKS 4
/* The model every run here trains: 8192 rows, 4 ranks x 256 = 8 steps an
 * epoch, 5 epochs; batch sizes a multiple of 16 make rank counts agree bitwise
 * (docs/models.md), and on one rank count training is deterministic. */
#define MODEL                                                                                      \
    "model: {type: fm, embedding: {dim: 8, capacity: 100000}}\n"                                   \
    "data: {train: \"../data/train.tsv\"}\n"                                                       \
    "train: {batch_size: 256, epochs: 5, log_every: 4}\n"
/* A run that goes on until stopped. */
#define ENDLESS                                                                                    \
    "model: {type: fm, embedding: {dim: 8, capacity: 100000}}\n"                                   \
    "data: {train: \"../data/train.tsv\"}\n"                                                       \
    "train: {batch_size: 256, epochs: 100000, log_every: 50}\n"

/* Runs argv (PATH lookup) into res; returns the exit code. */
static int run(const char *const *argv)
{
    proc_run(&res, root, argv);
    return res.code;
}

/* Runs the shell command made from fmt into res; returns the exit code. */
#define sh(...) proc_sh(&res, root, __VA_ARGS__)

/* ---- kilnd and the database ------------------------------------------------------- */

static void start_kilnd(const char *listen, const char *dump_delay_ms)
{
    char log[900], delay[64];
    snprintf(log, sizeof log, "%s/kilnd.log", home);
    snprintf(delay, sizeof delay, "KILN_TEST_DUMP_DELAY_MS=%s", dump_delay_ms ? dump_delay_ms : "");
    const char *env[] = {dump_delay_ms != NULL ? delay : NULL, NULL};
    const char *argv[] = {kilnd,    "--db",         db,    "--home",      home,  "--trainer",
                          trainer,  "--grace",      "1s",  "--poll",      "200ms",
                          "--slurm-poll", "1s",     "--max-ranks", "8",   "--listen",
                          listen ? listen : "", NULL};
    kilnd_pid = fx_spawn(log, env, argv);
}

static void stop_kilnd(int sig)
{
    fx_stop(kilnd_pid, sig);
    kilnd_pid = 0;
}

static void write_spec(const char *name, const char *body, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s.yaml", home, name);
    fx_write(path, "name: %s\n%s", name, body);
}

static void submit(const char *spec)
{
    const char *argv[] = {kiln, "--db", db, "submit", spec, NULL};
    if (run(argv) != 0)
        fail_msg("kiln submit %s: exit %d: %s%s", spec, res.code, res.out, res.err);
}

static state_t *open_db(void)
{
    state_t *st = NULL;
    assert_int_equal(state_open(db, &st), 0);
    return st;
}

static void get_run(int64_t id, state_run_t *r)
{
    state_t *st = open_db();
    assert_int_equal(state_run_get(st, id, r), 0);
    state_close(st);
}

static void show_logs(int64_t id)
{
    state_run_t r;
    char cmd[1600];
    get_run(id, &r);
    snprintf(cmd, sizeof cmd, "tail -n 25 '%s/kilnd.log' '%s/log' >&2", home,
             r.run_dir ? r.run_dir : "/nonexistent");
    state_run_fini(&r);
    if (system(cmd) != 0)
        fprintf(stderr, "(no logs to show)\n");
}

/* Waits until run id is in state want; fails after timeout_s. */
static void wait_run(int64_t id, state_run_state_t want, int timeout_s)
{
    state_t *st = open_db();
    state_run_state_t got = fx_wait_run(st, id, want, timeout_s);
    state_close(st);
    if (got != want) {
        show_logs(id);
        fail_msg("run %lld is %s, expected %s within %d s (%s)", (long long)id,
                 got < STATE_RUN_NSTATES ? state_run_state_name(got) : "missing",
                 state_run_state_name(want), timeout_s, home);
    }
}

/* Waits until run id has ended in state want with an error that names
 * `word` and `also` (NULL: only word); fills *r (state_run_fini it). */
static void wait_ended_saying(int64_t id, state_run_state_t want, int timeout_s, const char *word,
                              const char *also, state_run_t *r /* OUT */)
{
    wait_run(id, want, timeout_s);
    get_run(id, r);
    if (strstr(r->error, word) == NULL || (also != NULL && strstr(r->error, also) == NULL))
        fail_msg("run %lld: %s", (long long)id, r->error);
    printf("  run %lld: %s\n", (long long)id, r->error);
}

static size_t count_runs(void)
{
    state_t *st = open_db();
    state_run_t *rs = NULL;
    size_t n = 0;
    assert_int_equal(state_run_list(st, NULL, 0, &rs, &n), 0);
    state_runs_free(rs, n);
    state_close(st);
    return n;
}

/* The newest run. Each test submits one job (or two, waited for by id), so
 * this is the attempt that counts: an attempt that failed for a reason the
 * test did not cause is followed by its retry (retries.count), and the test
 * goes on with that one, saying so. (Seen: 1 start in about 25 under a load of
 * 12 on 2 cores, Open MPI 4.1.4's shared memory and TCP set-up failing in
 * MPI_Init; kilnd retries it like any retryable failure.) */
static int64_t last_run(void)
{
    state_t *st = open_db();
    state_run_t *rs = NULL;
    size_t n = 0;
    assert_int_equal(state_run_list(st, NULL, 1, &rs, &n), 0);
    int64_t id = n > 0 ? rs[0].id : 0;
    state_runs_free(rs, n);
    state_close(st);
    return id;
}

static void note_retries(int64_t id)
{
    state_run_t r;
    get_run(id, &r);
    for (int64_t prev = r.retry_of; prev > 0;) {
        state_run_t p;
        get_run(prev, &p);
        printf("  run %lld was retried: %s\n", (long long)p.id, p.error ? p.error : "?");
        prev = p.retry_of;
        state_run_fini(&p);
    }
    state_run_fini(&r);
}

/* Waits until the newest run is in state want; returns its id. */
static int64_t wait_last(state_run_state_t want, int timeout_s)
{
    int64_t id = 0;
    for (int i = 0; i < timeout_s * 10; i++) {
        id = last_run();
        state_run_t r;
        get_run(id, &r);
        bool done = r.state == want;
        state_run_fini(&r);
        if (done) {
            note_retries(id);
            return id;
        }
        proc_sleep_ms(100);
    }
    wait_run(id, want, 1); /* fails, with the state and the logs */
    return id;
}

static bool kilnd_log_has(const char *text, int timeout_s)
{
    char path[900];
    static char buf[1 << 18];
    snprintf(path, sizeof path, "%s/kilnd.log", home);
    for (int i = 0; i <= timeout_s * 10; i++) {
        proc_slurp(path, buf, sizeof buf);
        if (strstr(buf, text) != NULL)
            return true;
        proc_sleep_ms(100);
    }
    return false;
}

/* ---- the Slurm job of a run ------------------------------------------------------------ */

/* The run's Slurm job id from its run directory (0: none yet) and its state. */
static int64_t slurm_job(int64_t id, char *state, size_t cap)
{
    state_run_t r;
    char path[900], text[2048];
    get_run(id, &r);
    snprintf(path, sizeof path, "%s/slurm.json", r.run_dir ? r.run_dir : "/nonexistent");
    state_run_fini(&r);
    proc_slurp(path, text, sizeof text);
    const char *p = strstr(text, "\"job_id\": ");
    const char *s = strstr(text, "\"state\": \"");
    if (state != NULL)
        snprintf(state, cap, "%.*s", s ? (int)strcspn(s + 10, "\"") : 0, s ? s + 10 : "");
    return p ? atoll(p + 10) : 0;
}


/* Waits until the newest run's Slurm job is RUNNING and, when checkpoint,
 * the run recorded a checkpoint; returns its id. */
static int64_t wait_running(bool checkpoint, int timeout_s)
{
    char state[64];
    for (int i = 0; i < timeout_s * 20; i++) {
        int64_t id = last_run();
        if (slurm_job(id, state, sizeof state) > 0 && strcmp(state, "RUNNING") == 0) {
            state_t *st = open_db();
            state_checkpoint_t *cs = NULL;
            size_t n = 0;
            if (checkpoint && state_checkpoint_list_by_run(st, id, &cs, &n) != 0)
                n = 0;
            state_checkpoints_free(cs, n);
            state_close(st);
            if (!checkpoint || n > 0) {
                note_retries(id);
                return id;
            }
        }
        proc_sleep_ms(50);
    }
    show_logs(last_run());
    fail_msg("no run got its Slurm job running%s within %d s",
             checkpoint ? " with a checkpoint" : "", timeout_s);
    return 0;
}

/* `scontrol show job` of a job, one line, into res.out. */
static const char *scontrol_job(int64_t job)
{
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)job);
    const char *argv[] = {"scontrol", "--oneliner", "show", "job", id, NULL};
    if (run(argv) != 0)
        fail_msg("scontrol show job %s: %s%s", id, res.out, res.err);
    return res.out;
}

/* Sends sig to the ranks of the run in run_dir; returns how many. */
static int signal_ranks(const char *run_dir, int sig)
{
    return proc_signal_matching("kiln-train", run_dir, sig);
}

static void run_dir_of(int64_t id, char *out, size_t cap)
{
    state_run_t r;
    get_run(id, &r);
    assert_non_null(r.run_dir);
    snprintf(out, cap, "%s", r.run_dir);
    state_run_fini(&r);
}

/* Stops the ranks of run id on every host (they are frozen, not killed). */
static void freeze_ranks(int64_t id)
{
    char dir[900];
    run_dir_of(id, dir, sizeof dir);
    int n = 0;
    for (int i = 0; i < 100 && n < RANKS; i++) {
        n = signal_ranks(dir, SIGSTOP);
        if (n < RANKS)
            proc_sleep_ms(100);
    }
    if (n < RANKS)
        fail_msg("found %d of the %d ranks of run %lld to stop", n, RANKS, (long long)id);
}

/* ---- comparing models bit for bit ------------------------------------------------------- */

typedef struct same_model {
    const char *a, *b; /* the two checkpoint roots */
    size_t bytes;      /* compared so far */
} same_model_t;

/* fx_ckpt_walk's judge: the same bytes. */
static void cmp_same(void *ud, fx_array_kind_t kind, const char *what, const float *ref,
                     const float *x, size_t n)
{
    same_model_t *m = ud;
    static const char *const kinds[] = {"the rows", "the optimizer state", "the values"};
    if (memcmp(ref, x, sizeof(float) * n) != 0)
        fail_msg("%s: %s differ (%s vs %s)", what, kinds[kind], m->a, m->b);
    m->bytes += sizeof(float) * n;
}

/* Every table (keys, values, optimizer state) and every dense array of the
 * newest checkpoints under a and b are the same bytes. */
static void assert_same_model(const char *a, const char *b)
{
    ckpt_chain_t ca, cb;
    same_model_t m = {a, b, 0};
    int ntables, narrays;
    fx_open_latest(a, &ca);
    fx_open_latest(b, &cb);
    fx_ckpt_walk(&ca, &cb, cmp_same, &m, &ntables, &narrays);
    assert_true(ntables > 0);
    printf("  same model, bit for bit: %zu bytes of %d tables and %d dense arrays at step %lld\n",
           m.bytes, ntables, narrays, (long long)ckpt_info(ca.items[ca.n - 1])->step);
    ckpt_chain_fini(&ca);
    ckpt_chain_fini(&cb);
}

static void assert_same_as_reference(const char *job)
{
    char ck[1000];
    snprintf(ck, sizeof ck, "%s/ckpt/%s", home, job);
    assert_same_model(ref_ck, ck);
}

/* ---- fixtures ------------------------------------------------------------------------------ */

static int setup_home(void **state)
{
    (void)state;
    snprintf(home, sizeof home, "%s/t-XXXXXX", root);
    if (mkdtemp(home) == NULL)
        return -1;
    snprintf(db, sizeof db, "%s/kiln.db", home);
    return 0;
}

static int teardown_home(void **state)
{
    (void)state;
    stop_kilnd(SIGKILL);
    /* Whatever Slurm still runs of this test's runs, and their supervisors. */
    sh("for p in '%s'/runs/*/supervisor.pid; do [ -f \"$p\" ] && "
       "kill -9 $(cut -d' ' -f1 \"$p\") 2>/dev/null; done; scancel --quiet --user=root; true",
       home);
    for (int i = 0; i < 100; i++) { /* the nodes idle again before the next test */
        const char *argv[] = {"squeue", "-h", NULL};
        if (run(argv) == 0 && res.out[0] == '\0')
            break;
        proc_sleep_ms(100);
    }
    /* A node a failed test left crashed comes back. */
    const char *nodes[] = {"sinfo", "-h", "-N", "-p", "kiln", "-o", "%N %t", NULL};
    if (run(nodes) == 0 && (strstr(res.out, "kn2 idle") == NULL || strstr(res.out, "kn1 idle") == NULL))
        sh("'%s' reboot kn1 && '%s' reboot kn2", testcluster, testcluster);
    proc_tmpdir_done(home);
    return 0;
}

static int setup_all(void **state)
{
    (void)state;
    const char *shared = getenv("KILN_CLUSTER_SHARED");
    if (shared == NULL || getenv("SLURM_CONF") == NULL) {
        fprintf(stderr, "test_cluster: not on the test cluster; run it as "
                        "tools/testcluster.sh run -- %s (CTest does)\n",
                KILN_BINARY_DIR "/tests/test_cluster");
        exit(77);
    }
    const char *prefix = getenv("KILN_CLUSTER_PREFIX"); /* the package's programs */
    if (prefix != NULL) {
        snprintf(kiln, sizeof kiln, "%s/bin/kiln", prefix);
        snprintf(kilnd, sizeof kilnd, "%s/bin/kilnd", prefix);
        snprintf(trainer, sizeof trainer, "%s/bin/kiln-train", prefix);
    } else {
        snprintf(kiln, sizeof kiln, "%s", KILN_BIN);
        snprintf(kilnd, sizeof kilnd, "%s", KILND_BIN);
        snprintf(trainer, sizeof trainer, "%s", KILN_TRAIN_BIN);
    }
    printf("  programs: %s, %s, %s\n", kiln, kilnd, trainer);
    snprintf(testcluster, sizeof testcluster, "%s/tools/testcluster.sh", KILN_SOURCE_DIR);
    snprintf(root, sizeof root, "%s/test-cluster-XXXXXX", shared);
    if (mkdtemp(root) == NULL)
        return -1;
    char out[300];
    snprintf(out, sizeof out, "%s/data", root);
    mkdir(out, 0755);
    snprintf(out, sizeof out, "%s/data/train.tsv", root);
    const char *gen[] = {kiln, "datagen", "--rows", "8192", "--out", out, "--seed", "11", NULL};
    if (run(gen) != 0) {
        fprintf(stderr, "kiln datagen: %s%s\n", res.out, res.err);
        return -1;
    }
    /* The reference: the same model on 4 local ranks, no scheduler. */
    snprintf(out, sizeof out, "%s/ref", root);
    mkdir(out, 0755);
    snprintf(home, sizeof home, "%s", out);
    char spec[512], rundir[320], ranks[16];
    write_spec("ref", MODEL, spec, sizeof spec);
    snprintf(rundir, sizeof rundir, "%s/run", out);
    snprintf(ranks, sizeof ranks, "%d", RANKS);
    const char *mpi[] = {"mpirun", "-np", ranks, "--oversubscribe", "--bind-to", "none",
                         trainer, "--spec", spec, "--run-dir", rundir, "--quiet", NULL};
    if (run(mpi) != 0) {
        fprintf(stderr, "the reference run failed: %s%s\n", res.out, res.err);
        return -1;
    }
    snprintf(ref_ck, sizeof ref_ck, "%s/ckpt/ref", out);
    home[0] = '\0';
    return 0;
}

static int teardown_all(void **state)
{
    (void)state;
    proc_tmpdir_done(root);
    return 0;
}

/* ---- tests --------------------------------------------------------------------------------- */

/* What the .deb put in /usr, as a node sees it (the overlay of
 * tools/testcluster.sh --package); skipped with the build tree's programs. */
static void test_installed(void **state)
{
    (void)state;
    const char *prefix = getenv("KILN_CLUSTER_PREFIX");
    if (prefix == NULL) {
        printf("  (not the package's programs: nothing to check)\n");
        return;
    }
    const char *files[] = {"bin/kilnd", "bin/kiln", "bin/kiln-train", "bin/kiln-serve",
                           "share/doc/kiln/cluster.md", "share/doc/kiln/job-spec.md",
                           "share/doc/kiln/examples/oneoff.yaml",
                           "share/doc/kiln/examples/kiln.default",
                           "lib/systemd/system/kilnd.service",
                           "lib/systemd/system/kiln-serve.service"};
    char path[600];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", prefix, files[i]);
        if (access(path, strncmp(files[i], "bin/", 4) == 0 ? X_OK : R_OK) != 0)
            fail_msg("the package did not install %s", path);
    }
    const char *help[] = {kilnd, "--help", NULL};
    assert_int_equal(run(help), 0);
    assert_non_null(strstr(res.out, "--slurm-poll"));
    /* systemd parses the units and finds their programs. */
    if (sh("command -v systemd-analyze >/dev/null") == 0) {
        if (sh("systemd-analyze verify %s/lib/systemd/system/kilnd.service "
               "%s/lib/systemd/system/kiln-serve.service",
               prefix, prefix) != 0)
            fail_msg("systemd-analyze verify: %s%s", res.out, res.err);
        printf("  systemd-analyze verify: kilnd.service, kiln-serve.service\n");
    }
}

/* Retried when something the test did not cause fails a start (last_run). */
#define RETRY "retries: {count: 2, backoff: 1s, max_backoff: 2s}\n"

static void test_slurm_two_nodes(void **state)
{
    (void)state;
    char spec[900];
    write_spec("two",
               "resources:\n  ranks: 4\n  launcher: slurm\n  nodes: 2\n  threads: 1\n"
               "  partition: kiln\n  sbatch_args: [\"--comment=kiln-cluster-test\"]\n" RETRY MODEL,
               spec, sizeof spec);
    submit(spec);
    start_kilnd("127.0.0.1:8480", NULL);
    int64_t id = wait_last(STATE_RUN_SUCCEEDED, 120);
    char st[64];
    int64_t job = slurm_job(id, st, sizeof st);
    assert_true(job > 0);
    assert_string_equal(st, "COMPLETED");
    /* Slurm ran it on both nodes, with the spec's sbatch argument. */
    const char *line = scontrol_job(job);
    if (strstr(line, "NodeList=kn[1-2]") == NULL || strstr(line, "NumTasks=4") == NULL ||
        strstr(line, "Comment=kiln-cluster-test") == NULL || strstr(line, "Partition=kiln") == NULL)
        fail_msg("scontrol show job %lld: %s", (long long)job, line);
    printf("  Slurm job %lld: NodeList=kn[1-2], 4 tasks, partition kiln\n", (long long)job);
    assert_same_as_reference("two");

    /* The run page and its JSON name the job and its nodes. */
    char want[128], url[128];
    snprintf(want, sizeof want, "%lld COMPLETED on kn[1-2] (partition kiln)", (long long)job);
    snprintf(url, sizeof url, "http://127.0.0.1:8480/runs/%lld", (long long)id);
    for (int i = 0; i < 50; i++) { /* kilnd imports slurm.json at the run's end */
        const char *curl[] = {"curl", "-sf", url, NULL};
        if (run(curl) == 0 && strstr(res.out, want) != NULL)
            break;
        proc_sleep_ms(100);
    }
    if (strstr(res.out, want) == NULL)
        fail_msg("the run page lacks \"%s\":\n%.2000s", want, res.out);
    snprintf(url, sizeof url, "http://127.0.0.1:8480/api/runs/%lld", (long long)id);
    const char *api[] = {"curl", "-sf", url, NULL};
    assert_int_equal(run(api), 0);
    snprintf(want, sizeof want, "\"slurm\":{\"job_id\":%lld", (long long)job);
    if (strstr(res.out, want) == NULL || strstr(res.out, "\"nodes\":\"kn[1-2]\"") == NULL)
        fail_msg("%s lacks the Slurm job: %.2000s", url, res.out);
    stop_kilnd(SIGTERM);
}

static void test_hostfile(void **state)
{
    (void)state;
    char spec[900], body[2048];
    const char *hostfile = getenv("KILN_CLUSTER_HOSTFILE");
    const char *subnet = getenv("KILN_CLUSTER_SUBNET");
    assert_non_null(hostfile);
    assert_non_null(subnet);
    snprintf(body, sizeof body,
             "resources:\n  ranks: 4\n  launcher: hostfile\n  hostfile: %s\n  threads: 1\n"
             "  mpi: {interfaces: [\"%s\"], transport: tcp}\n" RETRY MODEL,
             hostfile, subnet);
    write_spec("hosts", body, spec, sizeof spec);
    submit(spec);
    start_kilnd(NULL, NULL);
    wait_last(STATE_RUN_SUCCEEDED, 120);
    assert_same_as_reference("hosts");
    stop_kilnd(SIGTERM);
}

static void test_slurm_refuses(void **state)
{
    (void)state;
    char a[900], b[900];
    write_spec("nopart", "resources: {ranks: 2, launcher: slurm, partition: nosuch}\n" RETRY MODEL,
               a, sizeof a);
    write_spec("gpus", "resources: {ranks: 2, launcher: slurm, gpus_per_node: 1}\n" RETRY MODEL,
               b, sizeof b);
    submit(a);
    submit(b);
    start_kilnd(NULL, NULL);
    wait_run(1, STATE_RUN_FAILED, 60);
    wait_run(2, STATE_RUN_FAILED, 60);
    const char *want[] = {"Invalid partition name", "Invalid generic resource"};
    for (int id = 1; id <= 2; id++) {
        state_run_t r;
        get_run(id, &r);
        assert_non_null(r.error);
        if (strstr(r.error, "Slurm refused the job") == NULL || strstr(r.error, want[id - 1]) == NULL)
            fail_msg("run %d: %s", id, r.error);
        printf("  run %d: %s\n", id, r.error);
        state_run_fini(&r);
    }
    proc_sleep_ms(2500); /* past the retry backoff: nothing was queued */
    assert_int_equal(count_runs(), 2);
    stop_kilnd(SIGTERM);
}

static void test_slurm_cancel(void **state)
{
    (void)state;
    char spec[900];
    write_spec("cancel",
               "resources: {ranks: 4, launcher: slurm, nodes: 2, threads: 1}\n" RETRY ENDLESS,
               spec, sizeof spec);
    submit(spec);
    start_kilnd(NULL, NULL);
    int64_t id = wait_running(false, 60);
    char dir[900], num[32];
    run_dir_of(id, dir, sizeof dir);
    for (int i = 0; i < 100 && signal_ranks(dir, 0) < RANKS; i++)
        proc_sleep_ms(100);
    assert_int_equal(signal_ranks(dir, 0), RANKS);
    snprintf(num, sizeof num, "%lld", (long long)id);
    const char *argv[] = {kiln, "--db", db, "cancel", num, NULL};
    assert_int_equal(run(argv), 0);
    wait_run(id, STATE_RUN_CANCELED, 60);
    char st[64];
    int64_t job = slurm_job(id, st, sizeof st);
    assert_string_equal(st, "CANCELLED");
    assert_non_null(strstr(scontrol_job(job), "JobState=CANCELLED"));
    for (int i = 0; i < 100 && signal_ranks(dir, 0) > 0; i++)
        proc_sleep_ms(100);
    assert_int_equal(signal_ranks(dir, 0), 0);
    state_run_t r;
    get_run(id, &r);
    assert_non_null(strstr(r.error, "canceled on request"));
    state_run_fini(&r);
    assert_int_equal(last_run(), id); /* a cancel is not retried */
    stop_kilnd(SIGTERM);
}

static void test_slurm_time_limit(void **state)
{
    (void)state;
    char spec[900];
    write_spec("limit",
               "resources: {ranks: 4, launcher: slurm, threads: 1, timeout: 20s}\n" RETRY ENDLESS,
               spec, sizeof spec);
    submit(spec);
    start_kilnd(NULL, NULL);
    int64_t id = wait_running(false, 60);
    char st[64];
    const char *line = scontrol_job(slurm_job(id, st, sizeof st));
    if (strstr(line, "TimeLimit=00:01:00") == NULL) /* 20 s rounded up to a minute */
        fail_msg("the job's time limit is not 1 minute: %s", line);
    state_run_t r;
    wait_ended_saying(id, STATE_RUN_TIMED_OUT, 180, "time limit", "TIMEOUT", &r);
    assert_true(r.ended_at - r.started_at >= 60);
    char dir[900];
    snprintf(dir, sizeof dir, "%s", r.run_dir);
    state_run_fini(&r);
    for (int i = 0; i < 100 && signal_ranks(dir, 0) > 0; i++)
        proc_sleep_ms(100);
    assert_int_equal(signal_ranks(dir, 0), 0);
    assert_int_equal(last_run(), id); /* a time-out is not retried */
    stop_kilnd(SIGTERM);
}

/* A run with a checkpoint every 2 steps (each dump slowed down by the test's
 * kilnd, so that it is still running a while after its first checkpoint). */
#define RESUMABLE "checkpoint: {every_steps: 2}\n" RETRY MODEL

/* The newest run is the succeeded retry of run failed, resumed from a
 * checkpoint, and it trained the fault-free model. */
static void assert_resumed_retry(int64_t failed, const char *job)
{
    int64_t id = wait_last(STATE_RUN_SUCCEEDED, 120);
    state_run_t r;
    get_run(id, &r);
    assert_int_equal(r.trigger, STATE_TRIGGER_RETRY);
    int64_t back = r.retry_of; /* failed, or an earlier retry of it (last_run) */
    while (back != failed && back > failed) {
        state_run_t p;
        get_run(back, &p);
        back = p.retry_of;
        state_run_fini(&p);
    }
    assert_int_equal(back, failed);
    char path[1000], script[8192];
    snprintf(path, sizeof path, "%s/slurm.sh", r.run_dir);
    state_run_fini(&r);
    proc_slurp(path, script, sizeof script);
    if (strstr(script, "'--resume'") == NULL)
        fail_msg("the retry did not resume a checkpoint:\n%s", script);
    assert_same_as_reference(job);
}

static void test_slurm_node_fail(void **state)
{
    (void)state;
    char spec[900];
    write_spec("nodefail", "resources: {ranks: 4, launcher: slurm, nodes: 2, threads: 1}\n" RESUMABLE,
               spec, sizeof spec);
    submit(spec);
    start_kilnd(NULL, "400");
    int64_t id = wait_running(true, 90);
    freeze_ranks(id); /* nothing finishes from here on */
    char cmd[800];
    snprintf(cmd, sizeof cmd, "'%s' crash kn2", testcluster);
    assert_int_equal(system(cmd), 0);
    state_run_t r;
    wait_ended_saying(id, STATE_RUN_FAILED, 90, "NODE_FAIL", "kn2", &r);
    state_run_fini(&r);
    snprintf(cmd, sizeof cmd, "'%s' reboot kn2", testcluster);
    assert_int_equal(system(cmd), 0);
    assert_resumed_retry(id, "nodefail");
    stop_kilnd(SIGTERM);
}

static void test_slurm_preempted(void **state)
{
    (void)state;
    char spec[900];
    write_spec("preempt",
               "resources: {ranks: 4, launcher: slurm, nodes: 2, threads: 1, partition: kiln}\n"
               RESUMABLE,
               spec, sizeof spec);
    submit(spec);
    start_kilnd(NULL, "400");
    int64_t id = wait_running(true, 90);
    freeze_ranks(id);
    /* Every CPU is the run's: a job in the higher-priority partition takes one. */
    const char *urgent[] = {"sbatch", "--partition=urgent", "--ntasks=1", "--job-name=urgent",
                            "--output=/dev/null", "--wrap=sleep 2", NULL};
    if (run(urgent) != 0)
        fail_msg("sbatch urgent: %s%s", res.out, res.err);
    state_run_t r;
    wait_ended_saying(id, STATE_RUN_FAILED, 90, "preempted", NULL, &r);
    state_run_fini(&r);
    assert_resumed_retry(id, "preempt");
    stop_kilnd(SIGTERM);
}

static void test_kilnd_kill9(void **state)
{
    (void)state;
    char spec[900];
    write_spec("adopt", "resources: {ranks: 4, launcher: slurm, nodes: 2, threads: 1}\n" RESUMABLE,
               spec, sizeof spec);
    submit(spec);
    start_kilnd(NULL, "400");
    int64_t id = wait_running(true, 90);
    freeze_ranks(id); /* the job is still running whatever the restarts take */
    char st[64], dir[900], want[160];
    int64_t job = slurm_job(id, st, sizeof st);
    run_dir_of(id, dir, sizeof dir);

    /* kill -9 of kilnd: the next one adopts the supervisor. */
    stop_kilnd(SIGKILL);
    start_kilnd(NULL, "400");
    snprintf(want, sizeof want, "run %lld adopted: supervisor", (long long)id);
    if (!kilnd_log_has(want, 30))
        fail_msg("kilnd did not adopt run %lld's supervisor; see %s/kilnd.log", (long long)id,
                 home);

    /* kill -9 of kilnd and of the supervisor (the head node lost both): the
     * next kilnd follows the Slurm job by its id. */
    stop_kilnd(SIGKILL);
    char pidfile[1000], text[128];
    snprintf(pidfile, sizeof pidfile, "%s/supervisor.pid", dir);
    proc_slurp(pidfile, text, sizeof text);
    assert_true(atoi(text) > 0);
    assert_int_equal(kill(atoi(text), SIGKILL), 0);
    proc_sleep_ms(300);
    start_kilnd(NULL, "400");
    snprintf(want, sizeof want, "run %lld: adopted Slurm job %lld by its id", (long long)id,
             (long long)job);
    if (!kilnd_log_has(want, 30))
        fail_msg("kilnd did not adopt Slurm job %lld by its id; see %s/kilnd.log",
                 (long long)job, home);
    assert_int_equal(signal_ranks(dir, SIGCONT), RANKS);
    wait_run(id, STATE_RUN_SUCCEEDED, 120);
    /* No other run, one Slurm job: nothing was submitted twice. */
    assert_int_equal(last_run(), id);
    assert_int_equal(slurm_job(id, st, sizeof st), job);
    char name[64];
    snprintf(name, sizeof name, "--name=kiln.adopt.%lld", (long long)id);
    const char *argv[] = {"squeue", "-h", "--states=all", name, "-o", "%i", NULL};
    assert_int_equal(run(argv), 0);
    char one[32];
    snprintf(one, sizeof one, "%lld\n", (long long)job);
    assert_string_equal(res.out, one);
    assert_same_as_reference("adopt");
    stop_kilnd(SIGTERM);
}

/* KILN_TEST_FILTER=test_slurm_cancel runs one test (cmocka glob). */
PROC_TEST_MAIN(setup_all, teardown_all,
    cmocka_unit_test(test_installed),
    cmocka_unit_test_setup_teardown(test_slurm_two_nodes, setup_home, teardown_home),
    cmocka_unit_test_setup_teardown(test_hostfile, setup_home, teardown_home),
    cmocka_unit_test_setup_teardown(test_slurm_refuses, setup_home, teardown_home),
    cmocka_unit_test_setup_teardown(test_slurm_cancel, setup_home, teardown_home),
    cmocka_unit_test_setup_teardown(test_slurm_node_fail, setup_home, teardown_home),
    cmocka_unit_test_setup_teardown(test_slurm_preempted, setup_home, teardown_home),
    cmocka_unit_test_setup_teardown(test_kilnd_kill9, setup_home, teardown_home),
    cmocka_unit_test_setup_teardown(test_slurm_time_limit, setup_home, teardown_home))
