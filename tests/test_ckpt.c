/*
 * tests/test_ckpt.c - checkpoints. Unit part (kernels tables, no MPI): .npy
 * files numpy loads, full + incremental chain equal to a full dump bitwise
 * (with evictions and deletions), incremental cost proportional to changed
 * rows, loading any world size into any rank count, integrity refusals that
 * name the file, retention that keeps chains and pinned checkpoints, and a
 * full disk (RLIMIT_FSIZE) failing with KILN_ENOSPC. Integration part
 * (kiln-train under real mpirun): two halves with a checkpoint between equal
 * one straight run (bitwise on 2 ranks; across 2->1, 1->2, 2->3: losses
 * within 1e-6, and with sgd the weights too), online export through the
 * control file, SIGUSR1 (rank 0, every rank, mpirun) and export.every, kill -9
 * during a dump, a full disk during a dump, a corrupt checkpoint refused with
 * exit 2, `kiln export --format hugectr` of a chain, lineage rows in SQLite
 * (checkpoints, online and CLI exports), retention that keeps what an
 * endpoint holds, non-finite values refused by the writer, and init_from:
 * latest falling back past damaged checkpoints (which retention keeps).
 */
/* cmocka.h needs these first. */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "kern.h"
#include "kiln.h"
#include "proc.h"
#include "ckpt.h"
#include "shard.h"
#include "state.h"

#ifndef KILN_BIN
#error "KILN_BIN and KILN_TRAIN_BIN must name the executables"
#endif

static char tmpdir[256];

/* ---- process helpers -------------------------------------------------------------------- */

/* A run to its end goes through proc_run (tests/support/proc.c). */
typedef proc_result_t result_t;

/* Child side of a run started in the background (train_start): output to
 * tmp/stdout and tmp/stderr, MPI-as-root env, optional env var. Leak
 * checking is off for MPI ranks only. */
static void child_exec(const char *const *argv, const char *env)
{
    char outp[512], errp[512];
    snprintf(outp, sizeof outp, "%s/stdout", tmpdir);
    snprintf(errp, sizeof errp, "%s/stderr", tmpdir);
    int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    proc_mpi_env(strcmp(argv[0], "mpirun") == 0);
    if (env != NULL)
        putenv((char *)env);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
}

/* A dlrm spec over tmp/data with this train: section and the rest. */
static void write_spec_train(const char *name, const char *train_and_rest, char *path,
                             size_t cap)
{
    snprintf(path, cap, "%s/%s.yaml", tmpdir, name);
    fx_write(path,
             "name: %s\n"
             "data: {train: \"data/day=*.tsv\", eval: \"data/eval.tsv\"}\n"
             "model:\n  type: dlrm\n  embedding: {dim: 8, capacity: 200000}\n"
             "  bottom_mlp: [16, 8]\n  top_mlp: [16, 1]\n%s",
             name, train_and_rest);
}

/* A dlrm spec over tmp/data: two epochs of batch with this optimizer:
 * section, then extra (NULL: a full checkpoint every 3, 10 kept). */
static void write_spec_with(const char *name, int batch, const char *optimizer, const char *extra,
                            char *path, size_t cap)
{
    char train[1024];
    snprintf(train, sizeof train,
             "train: {batch_size: %d, seed: 7, log_every: 1, epochs: 2, init_from: none,\n"
             "        optimizer: %s}\n"
             "%s",
             batch, optimizer, extra ? extra : "checkpoint: {full_every: 3, keep: 10}\n");
    write_spec_train(name, train, path, cap);
}

/* The optimizer: sections of the specs: adam for the tables, or sgd for
 * the tables and the dense part. */
static const char adam_tables[] = "{sparse: {type: adam, lr: 0.01}}";
static const char sgd_both[] = "{sparse: {type: sgd, lr: 0.01}, dense: {type: sgd, lr: 0.01}}";

/* A dlrm spec over tmp/data with adam for the tables. */
static void write_spec(const char *name, int batch, const char *extra, char *path, size_t cap)
{
    write_spec_with(name, batch, adam_tables, extra, path, cap);
}

/* The command line of a training run, with the strings it points into. */
typedef struct {
    char run_dir[512], nps[16], sh[128];
    const char *argv[40];
} train_cmd_t;

/* mpirun -np N kiln-train --spec SPEC --run-dir tmp/RUN [extra...]; with
 * fsize > 0, each rank's files are capped at fsize bytes. */
static void train_cmd(train_cmd_t *c, int np, const char *spec, const char *run_name,
                      const char *const *extra, long fsize)
{
    snprintf(c->run_dir, sizeof c->run_dir, "%s/%s", tmpdir, run_name);
    snprintf(c->nps, sizeof c->nps, "%d", np);
    const char **argv = c->argv;
    int n = 0;
    argv[n++] = "mpirun";
    argv[n++] = "-np";
    argv[n++] = c->nps;
    argv[n++] = "--oversubscribe";
    if (fsize > 0) {
        /* The cap goes on the ranks only (mpirun's own PMIx files need room):
         * a shell ignores SIGXFSZ, sets the limit and execs kiln-train. */
        snprintf(c->sh, sizeof c->sh, "trap '' XFSZ; ulimit -f %ld; exec \"$0\" \"$@\"",
                 fsize / 512);
        argv[n++] = "/bin/sh";
        argv[n++] = "-c";
        argv[n++] = c->sh;
    }
    const char *rest[] = {KILN_TRAIN_BIN, "--spec",  spec,        "--run-dir",
                          c->run_dir,     "--quiet", "--threads", "1"};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        argv[n++] = rest[i];
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
}

/* Starts the run of train_cmd in a process group of its own (so that
 * kill(-pid) reaches mpirun and its ranks) with env set, and returns at once
 * with mpirun's pid. */
static pid_t train_start(int np, const char *spec, const char *run_name, const char *const *extra,
                         const char *env)
{
    train_cmd_t c;
    train_cmd(&c, np, spec, run_name, extra, 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        child_exec(c.argv, env);
    }
    setpgid(pid, pid);
    return pid;
}

/* Runs the run of train_cmd to its end into r: its result line as JSON, or
 * NULL when it failed. */
static json_t *train_full(int np, const char *spec, const char *run_name, const char *const *extra,
                          long fsize, result_t *r)
{
    train_cmd_t c;
    train_cmd(&c, np, spec, run_name, extra, fsize);
    proc_run(r, tmpdir, c.argv);
    return fx_train_result(r);
}

static json_t *train(int np, const char *spec, const char *run_name, const char *const *extra,
                     result_t *r)
{
    json_t *v = train_full(np, spec, run_name, extra, 0, r);
    if (v == NULL)
        fail_msg("kiln-train -np %d %s failed (%d): %s", np, spec, r->code, r->err);
    return v;
}

/* The directory of checkpoint uid of job. */
static void ckpt_dir(const char *job, const char *uid, char *out, size_t cap)
{
    snprintf(out, cap, "%s/ckpt/%s/%s", tmpdir, job, uid);
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    assert_non_null(s);
    return s;
}

static double jnum(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    assert_non_null(v);
    return json_number_value(v);
}

/* Trains run_name of job for steps steps with no evaluation (the first
 * half of a resume test) and puts the directory of the checkpoint it ends
 * with into dir. Returns its result line. */
static json_t *train_steps(int np, const char *spec, const char *job, const char *run_name,
                           const char *steps, char *dir, size_t cap, result_t *r)
{
    const char *h[] = {"--max-steps", steps, "--eval", "none", NULL};
    json_t *v = train(np, spec, run_name, h, r);
    ckpt_dir(job, jstr(v, "checkpoint"), dir, cap);
    return v;
}

/* Opens a fresh tmp/<job>.db (its path into db) holding job and one manual
 * run of it: the run's id goes to run and, as text, to rid. */
static state_t *open_db_run(const char *job, char *db, size_t cap, int64_t *job_id, int64_t *run,
                            char rid[32])
{
    char text[128];
    snprintf(db, cap, "%s/%s.db", tmpdir, job);
    snprintf(text, sizeof text, "name: %s\n", job);
    state_t *st = NULL;
    assert_int_equal(state_open(db, &st), 0);
    assert_int_equal(state_job_put(st, job, text, "0000000000000000", NULL, 0, job_id, NULL), 0);
    assert_int_equal(state_run_create(st, *job_id, STATE_TRIGGER_MANUAL, 0, 1, 0, run), 0);
    snprintf(rid, 32, "%lld", (long long)*run);
    return st;
}

/* Asks the run that will use tmp/run_name for an export at its first step
 * boundary: the control file, whose path goes to path. */
static void request_export(const char *run_name, char *path, size_t cap)
{
    char run_dir[512];
    snprintf(run_dir, sizeof run_dir, "%s/%s", tmpdir, run_name);
    mkdir(run_dir, 0755);
    snprintf(path, cap, "%s/export.request", run_dir);
    fclose(fopen(path, "w"));
}

/* The newest online export of tmp/run_name, from its export.last. */
static json_t *export_last(const char *run_name)
{
    char p[1024], buf[2048];
    snprintf(p, sizeof p, "%s/%s/export.last", tmpdir, run_name);
    proc_slurp(p, buf, sizeof buf);
    json_t *e = json_loads(buf, 0, NULL);
    assert_non_null(e);
    return e;
}

/* kiln --db DB export DIR --format FORMAT --out OUT into r; the test fails
 * when the command does. */
static void kiln_export(result_t *r, const char *db, const char *dir, const char *format,
                        const char *out)
{
    const char *argv[] = {KILN_BIN,   "--db", db,      "export", dir,
                          "--format", format, "--out", out,      NULL};
    proc_run(r, tmpdir, argv);
    if (r->code != 0)
        fail_msg("kiln export failed (%d): %s", r->code, r->err);
}

/* Overwrites the byte at offset off of the file at path with b. */
static void poke(const char *path, long off, int b)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, off, SEEK_SET);
    fputc(b, f);
    fclose(f);
}

/* How many entries of dir do not start with a dot; -1 when dir cannot be
 * read. */
static int count_files(const char *dir)
{
    DIR *dd = opendir(dir);
    if (dd == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL)
        n += e->d_name[0] != '.';
    closedir(dd);
    return n;
}

/* The training loss of each logged step of a run, from progress.jsonl
 * (checkpoint lines skipped). */
static int losses(const char *run_name, double *out, int cap)
{
    char run_dir[400];
    snprintf(run_dir, sizeof run_dir, "%s/%s", tmpdir, run_name);
    return fx_losses(run_dir, out, cap);
}

/* Opens the checkpoint directories a and b, chains resolved, and walks
 * them side by side with cmp (fx_ckpt_walk). */
static void walk_ckpts(const char *a, const char *b, fx_floats_fn cmp, void *ud)
{
    ckpt_chain_t ca, cb;
    assert_int_equal(ckpt_chain_open(a, true, &ca), 0);
    assert_int_equal(ckpt_chain_open(b, true, &cb), 0);
    fx_ckpt_walk(&ca, &cb, cmp, ud, NULL, NULL);
    ckpt_chain_fini(&ca);
    ckpt_chain_fini(&cb);
}

/* fx_ckpt_walk's judge for compare_ckpts: byte for byte when *rel is 0,
 * else within rel of each value (optimizer state not compared). */
static void cmp_within(void *ud, fx_array_kind_t kind, const char *what, const float *ref,
                       const float *x, size_t n)
{
    double rel = *(const double *)ud;
    if (rel == 0) {
        assert_memory_equal(ref, x, n * 4);
        return;
    }
    for (size_t i = 0; i < n && kind != FX_ROWS_OPT; i++)
        if (fabs(ref[i] - x[i]) > rel * fmax(fabs(ref[i]), 1e-2))
            fail_msg("%s[%zu]: %.9g vs %.9g", what, i, ref[i], x[i]);
}

/* Compares two checkpoints (chains resolved) table by table and the dense
 * arrays: rel 0 means byte for byte. */
static void compare_ckpts(const char *a, const char *b, double rel)
{
    walk_ckpts(a, b, cmp_within, &rel);
}

/* How far apart two checkpoints' numbers are (chains resolved; same keys
 * asserted): the largest |x - y| / max(|x|, floor) over the rows' values,
 * over their optimizer state and over the dense arrays (params first, then
 * the dense optimizer's state), and the largest |x - y| of each. */
typedef struct {
    double rel_values, rel_opt, rel_dense, rel_dense_opt;
    double abs_values, abs_opt, abs_dense, abs_dense_opt;
} ckpt_diff_t;

static void note_diff(double x, double y, double floor, double *rel, double *absd)
{
    double d = fabs(x - y);
    if (d > *absd)
        *absd = d;
    double r = d / fmax(fabs(x), floor);
    if (r > *rel)
        *rel = r;
}

typedef struct diff_walk {
    double floor;
    ckpt_diff_t *out;
} diff_walk_t;

/* fx_ckpt_walk's judge for ckpt_diff: notes each array's differences. */
static void note_array(void *ud, fx_array_kind_t kind, const char *what, const float *ref,
                       const float *x, size_t n)
{
    diff_walk_t *w = ud;
    ckpt_diff_t *o = w->out;
    bool params = strcmp(what, "dense.params") == 0;
    double *rel = kind == FX_ROWS       ? &o->rel_values
                  : kind == FX_ROWS_OPT ? &o->rel_opt
                  : params              ? &o->rel_dense
                                        : &o->rel_dense_opt;
    double *absd = kind == FX_ROWS       ? &o->abs_values
                   : kind == FX_ROWS_OPT ? &o->abs_opt
                   : params              ? &o->abs_dense
                                         : &o->abs_dense_opt;
    for (size_t i = 0; i < n; i++)
        note_diff(ref[i], x[i], w->floor, rel, absd);
}

static void ckpt_diff(const char *a, const char *b, double floor, ckpt_diff_t *out)
{
    memset(out, 0, sizeof *out);
    diff_walk_t w = {floor, out};
    walk_ckpts(a, b, note_array, &w);
}

/* ---- unit helpers: tables trained by hand ---------------------------------------------- */

static kern_table_t *make_table(const char *name, kern_opt_kind_t opt, int64_t cap, kern_evict_t ev)
{
    kern_table_config_t cfg = {.name = name,
                               .dim = 4,
                               .capacity = cap,
                               .opt = opt,
                               .init = KERN_INIT_UNIFORM,
                               .init_scale = 0.1f,
                               .seed = 11,
                               .evict = ev};
    kern_table_t *t = NULL;
    assert_int_equal(kern_table_create(&cfg, &t), 0);
    return t;
}

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rnd(void) { return proc_xorshift(&rng_state); }

/* One "training step" on a table: n random keys from [0, range), inserted,
 * updated with random gradients and marked changed; sometimes a delete. */
static void sim_step(kern_table_t *t, int64_t step, int64_t range, int n)
{
    int64_t keys[256];
    int32_t rows[256];
    for (int i = 0; i < n; i++)
        keys[i] = (int64_t)(rnd() % (uint64_t)range) * 7919 + 3;
    assert_int_equal(kern_table_find_or_insert(t, n, keys, step, rows), 0);
    /* unique rows, ascending, for the update */
    int32_t u[256];
    int nu = 0;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < nu; j++)
            seen = seen || u[j] == rows[i];
        if (!seen)
            u[nu++] = rows[i];
    }
    for (int i = 1; i < nu; i++)
        for (int j = i; j > 0 && u[j - 1] > u[j]; j--) {
            int32_t x = u[j];
            u[j] = u[j - 1];
            u[j - 1] = x;
        }
    float g[256 * 4];
    for (int i = 0; i < nu * 4; i++)
        g[i] = (float)((double)(rnd() % 2001) / 1000.0 - 1.0);
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    kern_row_grads_t rg = {.rows = u, .grads = g, .n = nu};
    kern_opt_kind_t kind = sl.nstate == 2   ? KERN_OPT_ADAM
                           : sl.nstate == 1 ? KERN_OPT_ADAGRAD
                                            : KERN_OPT_SGD;
    kern_opt_t opt = {.kind = kind, .lr = 0.05f, .eps = 1e-8f, .beta1 = 0.9f, .beta2 = 0.999f};
    assert_int_equal(kern_cpu_sparse_update(&opt, 1, &sl, &rg, step), 0);
    kern_table_mark_changed(t, nu, u);
    if (step % 4 == 0) {
        int64_t del = keys[0];
        assert_int_equal(kern_table_delete(t, 1, &del, step, NULL), 0);
    }
}

/* A single-process dump of `nparts` tables as if each were a rank's shard. */
static void local_dump(const char *root, int nparts, kern_table_t **tables, ckpt_kind_t kind,
                       int64_t since, int64_t step, const char *parent, const char *base,
                       char *uid /* OUT */)
{
    ckpt_info_t *in = calloc(1, sizeof *in);
    assert_non_null(in);
    ckpt_new_uid(step, in->uid);
    in->kind = kind;
    in->since = since;
    in->step = step;
    in->world_size = nparts;
    in->include_optimizer = true;
    snprintf(in->parent, sizeof in->parent, "%s", parent ? parent : "");
    snprintf(in->base, sizeof in->base, "%s", base ? base : "");
    snprintf(in->model, sizeof in->model, "lr");
    assert_int_equal(mkdir(root, 0755) == 0 || errno == EEXIST, 1);
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s", root, in->uid);
    assert_int_equal(mkdir(tmp, 0755), 0);
    ckpt_part_t *all = NULL;
    assert_int_equal(ckpt_part_create(&all), 0);
    for (int r = 0; r < nparts; r++) {
        ckpt_part_t *p = NULL;
        assert_int_equal(ckpt_part_create(&p), 0);
        assert_int_equal(
            ckpt_write_tables(tmp, r, 1, &tables[r], kind == CKPT_FULL ? -1 : since, true, p),
            0);
        if (r == 0) {
            float dense[5] = {1, 2, 3, 4, (float)step};
            ckpt_array_t a = {"dense.params", dense, 5};
            assert_int_equal(ckpt_write_dense(tmp, &a, 1, p), 0);
        }
        char *text = ckpt_part_encode(p);
        assert_non_null(text);
        assert_int_equal(ckpt_part_merge(all, text), 0);
        free(text);
        ckpt_part_destroy(p);
    }
    assert_int_equal(ckpt_commit(root, tmp, in, all), 0);
    ckpt_part_destroy(all);
    for (int r = 0; r < nparts; r++)
        ckpt_mark_dumped(1, &tables[r], step);
    snprintf(uid, CKPT_UID_MAX, "%s", in->uid);
    free(in);
}

static void mkroot(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
    mkdir(out, 0755);
}

/* ---- unit tests --------------------------------------------------------------------------- */

static void test_npy_numpy_loads(void **state)
{
    (void)state;
    char root[512], uid[CKPT_UID_MAX], path[1024];
    mkroot("npy", root, sizeof root);
    kern_table_t *t = make_table("emb", KERN_OPT_ADAM, 1000, KERN_EVICT_NONE);
    for (int s = 1; s <= 5; s++)
        sim_step(t, s, 300, 64);
    int64_t n = kern_table_size(t);
    local_dump(root, 1, &t, CKPT_FULL, -1, 5, NULL, NULL, uid);
    snprintf(path, sizeof path, "%s/%s/emb.r0.values.npy", root, uid);
    unsigned char hdr[10];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(hdr, 1, 10, f), 10);
    fclose(f);
    assert_memory_equal(hdr, "\x93NUMPY\x01\x00", 8);
    assert_int_equal((10 + (hdr[8] | hdr[9] << 8)) % 64, 0);
    if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
        fprintf(stderr, "note: numpy not installed; .npy checked by header only\n");
        kern_table_destroy(t);
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import numpy as np, sys; d='%s/%s/';"
             "k=np.load(d+'emb.r0.keys.npy'); v=np.load(d+'emb.r0.values.npy');"
             "o=np.load(d+'emb.r0.opt.npy'); s=np.load(d+'emb.r0.opt_steps.npy');"
             "p=np.load(d+'dense.params.npy');"
             "ok=k.dtype==np.int64 and k.shape==(%lld,) and v.dtype==np.float32 and "
             "v.shape==(%lld,4) and o.shape==(%lld,8) and s.dtype==np.uint32 and "
             "list(p)==[1,2,3,4,5] and len(set(k.tolist()))==len(k);"
             "sys.exit(0 if ok else 1)\"",
             root, uid, (long long)n, (long long)n, (long long)n);
    assert_int_equal(system(cmd), 0);
    kern_table_destroy(t);
}

/* full(10) <- inc(20) <- inc(30), and full(30): the chain resolves to the
 * full dump byte for byte, with evictions (lru) and deletions on the way. */
static void check_chain(kern_opt_kind_t opt)
{
    char root[512], root2[512], u1[CKPT_UID_MAX], u2[CKPT_UID_MAX], u3[CKPT_UID_MAX],
        uf[CKPT_UID_MAX], d3[1024], df[1024];
    char rn[64];
    snprintf(rn, sizeof rn, "chain%d", (int)opt);
    mkroot(rn, root, sizeof root);
    snprintf(rn, sizeof rn, "chainfull%d", (int)opt);
    mkroot(rn, root2, sizeof root2);
    kern_table_t *t = make_table("emb", opt, 600, KERN_EVICT_LRU);
    int64_t s = 0;
    for (; s < 10; s++)
        sim_step(t, s + 1, 2000, 100);
    local_dump(root, 1, &t, CKPT_FULL, -1, s, NULL, NULL, u1);
    for (; s < 20; s++)
        sim_step(t, s + 1, 2000, 100);
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_true(st.evictions > 0);
    local_dump(root, 1, &t, CKPT_INCREMENTAL, 10, s, u1, u1, u2);
    for (; s < 30; s++)
        sim_step(t, s + 1, 2000, 100);
    local_dump(root, 1, &t, CKPT_INCREMENTAL, 20, s, u2, u1, u3);
    local_dump(root2, 1, &t, CKPT_FULL, -1, s, NULL, NULL, uf);
    snprintf(d3, sizeof d3, "%s/%s", root, u3);
    snprintf(df, sizeof df, "%s/%s", root2, uf);
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(d3, true, &ch), 0);
    assert_int_equal(ch.n, 3);
    assert_true(ckpt_info(ch.items[1])->evicted > 0);
    ckpt_chain_fini(&ch);
    compare_ckpts(d3, df, 0);
    /* And the live table is what the chain says. */
    ckpt_rows_t rows;
    assert_int_equal(ckpt_chain_open(d3, false, &ch), 0);
    assert_int_equal(ckpt_read_table(&ch, "emb", &rows), 0);
    assert_int_equal(rows.n, kern_table_size(t));
    int32_t r[1];
    assert_int_equal(kern_table_find(t, 1, &rows.keys[rows.n / 2], r), 1);
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    assert_memory_equal(sl.values + (int64_t)r[0] * 4, rows.values + (rows.n / 2) * 4, 16);
    ckpt_rows_fini(&rows);
    ckpt_chain_fini(&ch);
    kern_table_destroy(t);
}

/* The chain with each optimizer's state (adagrad's one array, adam's two). */
static void test_chain_bitwise(void **state)
{
    (void)state;
    check_chain(KERN_OPT_ADAGRAD);
    check_chain(KERN_OPT_ADAM);
}

/* An incremental dump looks at the changed rows only. */
static void test_incremental_cost(void **state)
{
    (void)state;
    char root[512], u1[CKPT_UID_MAX], u2[CKPT_UID_MAX];
    mkroot("cost", root, sizeof root);
    kern_table_t *t = make_table("big", KERN_OPT_SGD, 300000, KERN_EVICT_NONE);
    int64_t *keys = malloc(200000 * sizeof *keys);
    float *vals = calloc(200000 * 4, sizeof *vals);
    for (int64_t i = 0; i < 200000; i++)
        keys[i] = i * 31 + 1;
    assert_int_equal(kern_table_insert_rows(t, 200000, keys, vals, NULL, NULL, 1), 0);
    local_dump(root, 1, &t, CKPT_FULL, -1, 1, NULL, NULL, u1);
    sim_step(t, 2, 1000, 50);
    local_dump(root, 1, &t, CKPT_INCREMENTAL, 1, 2, u1, u1, u2);
    kern_table_stats_t st;
    kern_table_stats(t, &st);
    assert_true(st.last_visited <= 100);
    char d[1024];
    snprintf(d, sizeof d, "%s/%s", root, u2);
    ckpt_t *c;
    assert_int_equal(ckpt_open(d, &c), 0);
    assert_true(ckpt_info(c)->keys <= 50 && ckpt_info(c)->keys > 0);
    assert_true(ckpt_info(c)->bytes < 10000);
    ckpt_close(c);
    free(keys);
    free(vals);
    kern_table_destroy(t);
}

/* Two shards written as ranks 0 and 1 load into 1 and into 3 ranks: every
 * key lands on its owner, nothing is lost or doubled. */
static void test_load_any_rank_count(void **state)
{
    (void)state;
    char root[512], uid[CKPT_UID_MAX], d[1024];
    mkroot("ranks", root, sizeof root);
    kern_table_t *src = make_table("emb", KERN_OPT_ADAGRAD, 5000, KERN_EVICT_NONE);
    for (int s = 1; s <= 10; s++)
        sim_step(src, s, 1500, 120);
    /* Split src by owner among 2 "ranks". */
    kern_table_t *sh[2] = {make_table("emb", KERN_OPT_ADAGRAD, 5000, KERN_EVICT_NONE),
                           make_table("emb", KERN_OPT_ADAGRAD, 5000, KERN_EVICT_NONE)};
    int64_t n = kern_table_size(src), got = 0;
    int32_t *rows = malloc((size_t)n * sizeof *rows);
    assert_int_equal(kern_table_scan(src, rows, n, &got), 0);
    kern_slab_t sl;
    kern_table_slab(src, &sl);
    const int64_t *keys = kern_table_keys(src);
    for (int64_t i = 0; i < got; i++) {
        int r = shard_owner(keys[rows[i]], 2);
        assert_int_equal(kern_table_insert_rows(sh[r], 1, &keys[rows[i]],
                                                sl.values + (int64_t)rows[i] * 4,
                                                sl.opt_state + (int64_t)rows[i] * 4, NULL, 10),
                         0);
    }
    local_dump(root, 2, sh, CKPT_FULL, -1, 10, NULL, NULL, uid);
    snprintf(d, sizeof d, "%s/%s", root, uid);
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(d, true, &ch), 0);
    assert_int_equal(ckpt_info(ch.items[0])->world_size, 2);
    for (int nr = 1; nr <= 3; nr++) {
        int64_t total = 0;
        for (int r = 0; r < nr; r++) {
            kern_table_t *t = make_table("emb", KERN_OPT_ADAGRAD, 5000, KERN_EVICT_NONE);
            assert_int_equal(ckpt_load_tables(&ch, r, nr, 1, &t), 0);
            int64_t m = kern_table_size(t), g2 = 0;
            int32_t *rr = malloc((size_t)(m + 1) * sizeof *rr);
            assert_int_equal(kern_table_scan(t, rr, m + 1, &g2), 0);
            kern_slab_t ts;
            kern_table_slab(t, &ts);
            for (int64_t i = 0; i < g2; i++) {
                int64_t k = kern_table_keys(t)[rr[i]];
                assert_int_equal(shard_owner(k, nr), r);
                int32_t sr;
                assert_int_equal(kern_table_find(src, 1, &k, &sr), 1);
                assert_memory_equal(ts.values + (int64_t)rr[i] * 4, sl.values + (int64_t)sr * 4,
                                    16);
                assert_memory_equal(ts.opt_state + (int64_t)rr[i] * 4,
                                    sl.opt_state + (int64_t)sr * 4, 16);
            }
            /* Loaded rows are the base: nothing pending for the next dump. */
            int64_t nc = 0;
            assert_int_equal(kern_table_changed_since(t, 10, rr, m + 1, &nc), 0);
            assert_int_equal(nc, 0);
            total += g2;
            free(rr);
            kern_table_destroy(t);
        }
        assert_int_equal(total, got);
    }
    ckpt_chain_fini(&ch);
    free(rows);
    kern_table_destroy(src);
    kern_table_destroy(sh[0]);
    kern_table_destroy(sh[1]);
}

static void expect_refused(const char *dir, int code, const char *names)
{
    ckpt_chain_t ch;
    int rc = ckpt_chain_open(dir, true, &ch);
    if (rc == 0)
        ckpt_chain_fini(&ch);
    if (rc != code)
        fail_msg("expected %s, got %s: %s", kiln_errname(code), kiln_errname(rc), kiln_errmsg());
    if (strstr(kiln_errmsg(), names) == NULL)
        fail_msg("message does not name %s: %s", names, kiln_errmsg());
}

static void test_integrity(void **state)
{
    (void)state;
    char root[512], uid[CKPT_UID_MAX], d[1024], p[1200], cmd[2048];
    mkroot("integrity", root, sizeof root);
    kern_table_t *t = make_table("emb", KERN_OPT_ADAGRAD, 1000, KERN_EVICT_NONE);
    sim_step(t, 1, 500, 100);
    char dirs[4][1024];
    for (int i = 0; i < 4; i++) {
        local_dump(root, 1, &t, CKPT_FULL, -1, 1 + i, NULL, NULL, uid);
        snprintf(dirs[i], sizeof dirs[i], "%s/%s", root, uid);
    }
    snprintf(d, sizeof d, "%s", dirs[0]);
    expect_refused(d, 0, "");
    /* No manifest. */
    snprintf(p, sizeof p, "%s/manifest.json", dirs[0]);
    assert_int_equal(unlink(p), 0);
    expect_refused(dirs[0], KILN_ECORRUPT, "manifest.json");
    /* A missing file. */
    snprintf(p, sizeof p, "%s/emb.r0.opt.npy", dirs[1]);
    assert_int_equal(unlink(p), 0);
    expect_refused(dirs[1], KILN_ECORRUPT, "emb.r0.opt.npy");
    /* One flipped byte. */
    snprintf(p, sizeof p, "%s/emb.r0.values.npy", dirs[2]);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, 200, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    expect_refused(dirs[2], KILN_ECHECKSUM, "emb.r0.values.npy");
    /* A truncated manifest. */
    snprintf(cmd, sizeof cmd, "truncate -s 100 '%s/manifest.json'", dirs[3]);
    assert_int_equal(system(cmd), 0);
    expect_refused(dirs[3], KILN_ECORRUPT, "manifest.json");
    kern_table_destroy(t);
}

static bool pin_uid(const char *uid, void *ctx)
{
    return strcmp(uid, (const char *)ctx) == 0;
}

static void test_retention(void **state)
{
    (void)state;
    char root[512], u[7][CKPT_UID_MAX], d[1024];
    mkroot("retain", root, sizeof root);
    kern_table_t *t = make_table("emb", KERN_OPT_SGD, 1000, KERN_EVICT_NONE);
    /* f0 <- i1 <- i2, f3 <- i4, f5, f6: keep 2 keeps f6 and f5; pin i4 (so f3);
     * a lock on f0 keeps f0; i1, i2 go. */
    const ckpt_kind_t kinds[7] = {CKPT_FULL, CKPT_INCREMENTAL, CKPT_INCREMENTAL,
                                     CKPT_FULL, CKPT_INCREMENTAL, CKPT_FULL,
                                     CKPT_FULL};
    for (int i = 0; i < 7; i++) {
        sim_step(t, i + 1, 500, 10);
        bool inc = kinds[i] == CKPT_INCREMENTAL;
        local_dump(root, 1, &t, kinds[i], inc ? i : -1, i + 1, i > 0 ? u[i - 1] : NULL,
                   inc ? u[i - 1] : NULL, u[i]);
    }
    snprintf(d, sizeof d, "%s/%s", root, u[0]);
    char *lock = NULL;
    assert_int_equal(ckpt_lock(d, &lock), 0);
    int removed = -1;
    assert_int_equal(ckpt_retain(root, 2, pin_uid, u[4], &removed), 0);
    assert_int_equal(removed, 2);
    const bool kept[7] = {true, false, false, true, true, true, true};
    for (int i = 0; i < 7; i++) {
        snprintf(d, sizeof d, "%s/%s", root, u[i]);
        assert_int_equal(access(d, F_OK) == 0, kept[i]);
    }
    /* Unpinned, the chain of i4 still stays as long as i4 is among the newest. */
    ckpt_unlock(lock);
    assert_int_equal(ckpt_retain(root, 3, NULL, NULL, &removed), 0);
    assert_int_equal(removed, 1); /* f0 */
    snprintf(d, sizeof d, "%s/%s", root, u[3]);
    assert_int_equal(access(d, F_OK), 0);
    char latest[CKPT_UID_MAX];
    assert_int_equal(ckpt_latest(root, latest), 0);
    assert_string_equal(latest, u[6]);
    kern_table_destroy(t);
}

/* Retention never deletes a checkpoint directory it cannot read (its
 * manifest gone: the damaged newest one, say), and finishes a removal that
 * was cut short (.rm-*). */
static void test_retention_keeps_unreadable(void **state)
{
    (void)state;
    char root[512], u[3][CKPT_UID_MAX], d[1400], p[1200];
    mkroot("retain-unreadable", root, sizeof root);
    kern_table_t *t = make_table("emb", KERN_OPT_SGD, 1000, KERN_EVICT_NONE);
    for (int i = 0; i < 3; i++) {
        sim_step(t, i + 1, 500, 10);
        local_dump(root, 1, &t, CKPT_FULL, -1, i + 1, NULL, NULL, u[i]);
    }
    /* The oldest and the newest lose their manifests. */
    for (int i = 0; i < 3; i += 2) {
        snprintf(p, sizeof p, "%s/%s/manifest.json", root, u[i]);
        assert_int_equal(unlink(p), 0);
    }
    snprintf(p, sizeof p, "%s/.rm-0000000000001-000000000001", root);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(d, sizeof d, "%s/leftover.npy", p);
    fclose(fopen(d, "w"));
    int removed = -1;
    assert_int_equal(ckpt_retain(root, 1, NULL, NULL, &removed), 0);
    assert_int_equal(removed, 0); /* u[1] is the newest readable one: kept */
    for (int i = 0; i < 3; i++) {
        snprintf(d, sizeof d, "%s/%s", root, u[i]);
        assert_int_equal(access(d, F_OK), 0);
    }
    assert_int_not_equal(access(p, F_OK), 0); /* the cut-short removal is finished */
    /* A newer readable one: u[1] goes (renamed, then removed), u[0] and u[2] stay. */
    sim_step(t, 4, 500, 10);
    char u3[CKPT_UID_MAX];
    local_dump(root, 1, &t, CKPT_FULL, -1, 4, NULL, NULL, u3);
    assert_int_equal(ckpt_retain(root, 1, NULL, NULL, &removed), 0);
    assert_int_equal(removed, 1);
    const bool kept[3] = {true, false, true};
    for (int i = 0; i < 3; i++) {
        snprintf(d, sizeof d, "%s/%s", root, u[i]);
        assert_int_equal(access(d, F_OK) == 0, kept[i]);
    }
    snprintf(d, sizeof d, "%s/.rm-%s", root, u[1]);
    assert_int_not_equal(access(d, F_OK), 0);
    kern_table_destroy(t);
}

/* A write past RLIMIT_FSIZE (a full disk) fails with KILN_ENOSPC naming the
 * file; run in a child so the limit stays there. */
static void test_enospc_unit(void **state)
{
    (void)state;
    char root[512], tmp[1024];
    mkroot("enospc", root, sizeof root);
    snprintf(tmp, sizeof tmp, "%s/.tmp-x", root);
    assert_int_equal(mkdir(tmp, 0755), 0);
    /* The table is trained before the fork: OpenMP does not survive one. */
    kern_table_t *t = make_table("emb", KERN_OPT_ADAGRAD, 5000, KERN_EVICT_NONE);
    for (int s = 1; s <= 20; s++)
        sim_step(t, s, 3000, 200);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {20000, 20000};
        setrlimit(RLIMIT_FSIZE, &rl);
        ckpt_part_t *p = NULL;
        ckpt_part_create(&p);
        int rc = ckpt_write_tables(tmp, 0, 1, &t, -1, true, p);
        int ok = rc == KILN_ENOSPC && strstr(kiln_errmsg(), "emb.r0.") != NULL &&
                 strstr(kiln_errmsg(), "free space") != NULL;
        if (!ok)
            fprintf(stderr, "got %s: %s\n", kiln_errname(rc), kiln_errmsg());
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    kern_table_destroy(t);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(ckpt_remove(tmp), 0);
    assert_int_not_equal(access(tmp, F_OK), 0);
}

/* A value that is not finite never reaches a checkpoint: a NaN row, an
 * infinite optimizer state and an infinite dense weight are each refused
 * with KILN_ERANGE naming the table and key (or the array), and nothing is
 * written. */
static void test_nonfinite_refused(void **state)
{
    (void)state;
    char root[512], tmp[1024];
    mkroot("nonfinite", root, sizeof root);
    kern_table_t *t = make_table("emb", KERN_OPT_ADAGRAD, 1000, KERN_EVICT_NONE);
    sim_step(t, 1, 500, 100);
    int32_t rows[1000];
    int64_t n = 0;
    assert_int_equal(kern_table_scan(t, rows, 1000, &n), 0);
    assert_true(n > 10);
    kern_slab_t sl;
    kern_table_slab(t, &sl);
    const int64_t key = kern_table_keys(t)[rows[7]];
    char want[160];
    for (int k = 0; k < 2; k++) {
        float *slot = k == 0 ? &sl.values[rows[7] * sl.dim + 2] : &sl.opt_state[rows[7] * sl.dim];
        float keep = *slot;
        *slot = k == 0 ? NAN : INFINITY;
        snprintf(tmp, sizeof tmp, "%s/.tmp-%d", root, k);
        assert_int_equal(mkdir(tmp, 0755), 0);
        ckpt_part_t *p = NULL;
        assert_int_equal(ckpt_part_create(&p), 0);
        assert_int_equal(ckpt_write_tables(tmp, 0, 1, &t, -1, true, p), KILN_ERANGE);
        snprintf(want, sizeof want, "table 'emb' (rank 0): the %s of key %lld holds %s",
                 k == 0 ? "row" : "optimizer state", (long long)key,
                 k == 0 ? "NaN" : "an infinite value");
        if (strstr(kiln_errmsg(), want) == NULL)
            fail_msg("got: %s; want: %s", kiln_errmsg(), want);
        assert_non_null(strstr(kiln_errmsg(), "training diverged"));
        ckpt_part_destroy(p);
        /* Nothing of it stays in the temp dir. */
        assert_int_equal(count_files(tmp), 0);
        assert_int_equal(ckpt_remove(tmp), 0);
        *slot = keep;
    }
    float dense[4] = {1, 2, INFINITY, 4};
    ckpt_array_t a = {"dense.params", dense, 4};
    ckpt_part_t *p = NULL;
    assert_int_equal(ckpt_part_create(&p), 0);
    snprintf(tmp, sizeof tmp, "%s/.tmp-dense", root);
    assert_int_equal(mkdir(tmp, 0755), 0);
    assert_int_equal(ckpt_write_dense(tmp, &a, 1, p), KILN_ERANGE);
    assert_non_null(strstr(kiln_errmsg(), "dense array dense.params (element 2) holds an infinite "
                                          "value"));
    ckpt_part_destroy(p);
    kern_table_destroy(t);
}

/* ---- integration: kiln-train ---------------------------------------------------------------- */

/* Two halves (--max-steps, then --resume) equal one straight run, byte for
 * byte on the same rank count. */
static void test_resume_same_ranks_bitwise(void **state)
{
    (void)state;
    char s1[512], s2[512], a[1024], b[1024], half[1024];
    result_t *r = malloc(sizeof *r);
    write_spec("straight", 120, NULL, s1, sizeof s1);
    write_spec("halves", 120, NULL, s2, sizeof s2);
    json_t *v1 = train(2, s1, "straight", NULL, r);
    json_t *v2 = train_steps(2, s2, "halves", "halves1", "17", half, sizeof half, r);
    assert_int_equal((int)jnum(v2, "steps"), 17);
    const char *h2[] = {"--resume", half, NULL};
    json_t *v3 = train(2, s2, "halves2", h2, r);
    assert_int_equal((int)jnum(v3, "steps"), (int)jnum(v1, "steps"));
    assert_true(jnum(v1, "eval_logloss") == jnum(v3, "eval_logloss"));
    ckpt_dir("straight", jstr(v1, "checkpoint"), a, sizeof a);
    ckpt_dir("halves", jstr(v3, "checkpoint"), b, sizeof b);
    /* The second half's checkpoint is an incremental on top of the first. */
    ckpt_t *c;
    assert_int_equal(ckpt_open(b, &c), 0);
    assert_int_equal(ckpt_info(c)->kind, CKPT_INCREMENTAL);
    assert_string_equal(ckpt_info(c)->parent, jstr(v2, "checkpoint"));
    ckpt_close(c);
    compare_ckpts(a, b, 0);
    json_decref(v1);
    json_decref(v2);
    json_decref(v3);
    free(r);
}

/* The two halves of a resume across rank counts, 480 rows a step in all
 * with this optimizer: section: run <name>-a trains 5 steps on n1 ranks,
 * then run <name>-b (its name into name2) resumes from that checkpoint on
 * n2 ranks to the end. Returns the second half's result line; the
 * directory of its checkpoint goes to dir. */
static json_t *resume_across(const char *name, int n1, int n2, const char *optimizer,
                             char name2[80], char *dir, size_t cap, result_t *r)
{
    char sp[512], sp2[512], rn[80], half[1024];
    write_spec_with(name, 480 / n1, optimizer, NULL, sp, sizeof sp);
    snprintf(rn, sizeof rn, "%s-a", name);
    json_decref(train_steps(n1, sp, name, rn, "5", half, sizeof half, r));
    snprintf(name2, 80, "%s-b", name);
    write_spec_with(name2, 480 / n2, optimizer, NULL, sp2, sizeof sp2);
    const char *h2[] = {"--resume", half, NULL};
    json_t *v2 = train(n2, sp2, name2, h2, r);
    ckpt_dir(name2, jstr(v2, "checkpoint"), dir, cap);
    return v2;
}

/* 2->1, 1->2, 2->3 ranks (the same global batch of 480, so every rank's
 * batch is a multiple of MODEL_ROW_BLOCK = 16 rows; model.h): within 1e-6 of
 * a straight run (bitwise on this machine, printed). */
static void test_resume_across_rank_counts(void **state)
{
    (void)state;
    const int pairs[3][2] = {{2, 1}, {1, 2}, {2, 3}};
    char s0[512], a[1024], b[1024], name[64], name2[80];
    result_t *r = malloc(sizeof *r);
    write_spec("x1", 480, NULL, s0, sizeof s0);
    json_t *v0 = train(1, s0, "x1", NULL, r);
    ckpt_dir("x1", jstr(v0, "checkpoint"), a, sizeof a);
    for (int i = 0; i < 3; i++) {
        int n1 = pairs[i][0], n2 = pairs[i][1];
        snprintf(name, sizeof name, "x%dto%d", n1, n2);
        json_t *v2 = resume_across(name, n1, n2, adam_tables, name2, b, sizeof b, r);
        assert_int_equal((int)jnum(v2, "ranks"), n2);
        assert_int_equal((int)jnum(v2, "steps"), (int)jnum(v0, "steps"));
        assert_int_equal((int)jnum(v2, "keys"), (int)jnum(v0, "keys"));
        double x = jnum(v0, "eval_logloss"), y = jnum(v2, "eval_logloss");
        if (fabs(x - y) > 1e-6 * fabs(x))
            fail_msg("%s: eval logloss %.9g vs straight %.9g", name, y, x);
        /* The training loss of every step of the second half, too. */
        double la[64], lb[64];
        int na = losses("x1", la, 64), nb = losses(name2, lb, 64);
        assert_true(nb >= 5 && na >= nb);
        for (int j = 0; j < nb; j++)
            if (fabs(la[na - nb + j] - lb[j]) > 1e-6 * fabs(la[na - nb + j]))
                fail_msg("%s: step loss %.9g vs straight %.9g", name, lb[j], la[na - nb + j]);
        /* Rows, their adam state and the dense weights: the same keys, and
         * every value within 1e-6 relative (a floor of 1e-2 for the weights,
         * 1e-12 for the optimizer state, whose values start at 0). */
        ckpt_diff_t d, ds;
        ckpt_diff(a, b, 1e-2, &d);
        ckpt_diff(a, b, 1e-12, &ds);
        print_message("%s: rows %.3g, row state %.3g, dense %.3g, dense state %.3g relative\n",
                      name, d.rel_values, ds.rel_opt, d.rel_dense, ds.rel_dense_opt);
        if (d.rel_values > 1e-6 || ds.rel_opt > 1e-6 || d.rel_dense > 1e-6 ||
            ds.rel_dense_opt > 1e-6)
            fail_msg("%s: rows %.3g, row state %.3g, dense %.3g, dense state %.3g relative", name,
                     d.rel_values, ds.rel_opt, d.rel_dense, ds.rel_dense_opt);
        json_decref(v2);
    }
    json_decref(v0);
    free(r);
}

/* The same with sgd (sparse and dense): |x - y| <= 1e-6 max(|x|, 1e-2). */
static void test_resume_across_rank_counts_sgd(void **state)
{
    (void)state;
    const int pairs[3][2] = {{2, 1}, {1, 2}, {2, 3}};
    char s0[512], a[1024], b[1024], name[64], name2[80];
    result_t *r = malloc(sizeof *r);
    write_spec_with("g1", 480, sgd_both, NULL, s0, sizeof s0);
    json_t *v0 = train(1, s0, "g1", NULL, r);
    ckpt_dir("g1", jstr(v0, "checkpoint"), a, sizeof a);
    for (int i = 0; i < 3; i++) {
        int n1 = pairs[i][0], n2 = pairs[i][1];
        snprintf(name, sizeof name, "g%dto%d", n1, n2);
        json_t *v2 = resume_across(name, n1, n2, sgd_both, name2, b, sizeof b, r);
        ckpt_diff_t d;
        ckpt_diff(a, b, 1e-2, &d);
        if (d.rel_values > 1e-6 || d.rel_dense > 1e-6 || d.rel_dense_opt > 1e-6)
            fail_msg("%s: rows %.3g, dense %.3g, dense state %.3g relative (floor 1e-2)", name,
                     d.rel_values, d.rel_dense, d.rel_dense_opt);
        double x = jnum(v0, "eval_logloss"), y = jnum(v2, "eval_logloss");
        if (fabs(x - y) > 1e-6 * fabs(x))
            fail_msg("%s: eval logloss %.9g vs straight %.9g", name, y, x);
        json_decref(v2);
    }
    json_decref(v0);
    free(r);
}

/* A checkpoint an endpoint holds (per SQLite) survives `keep` retention,
 * with the full dump it stands on; everything else beyond keep goes. */
static void test_retention_keeps_endpoint_holding(void **state)
{
    (void)state;
    char s[512], db[512], rid[32], d[1024];
    result_t *r = malloc(sizeof *r);
    write_spec("pin", 240, "checkpoint: {full_every: 3, keep: 2, every_steps: 2}\n", s, sizeof s);
    int64_t job = 0, run1 = 0, run2 = 0;
    state_t *st = open_db_run("pin", db, sizeof db, &job, &run1, rid);
    assert_int_equal(state_run_create(st, job, STATE_TRIGGER_MANUAL, 0, 1, 0, &run2), 0);
    /* Run 1: full at 2, incrementals at 4 and 6. */
    const char *h1[] = {"--db", db, "--run-id", rid, "--eval", "none", "--max-steps", "6", NULL};
    json_decref(train(1, s, "pin1", h1, r));
    state_checkpoint_t *cs = NULL;
    size_t n = 0;
    assert_int_equal(state_checkpoint_list_by_run(st, run1, &cs, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(cs[1].step, 4);
    assert_string_equal(cs[1].kind, "incremental");
    char held[CKPT_UID_MAX], base[CKPT_UID_MAX], other[CKPT_UID_MAX];
    snprintf(base, sizeof base, "%s", cs[0].uid);
    snprintf(held, sizeof held, "%s", cs[1].uid);
    snprintf(other, sizeof other, "%s", cs[2].uid);
    /* An endpoint now holds the step-4 incremental. */
    int64_t push = 0;
    state_push_req_t req = {"http://127.0.0.1:9/", "pin", "A", cs[1].id, false, "test", NULL, true};
    assert_int_equal(state_push_enqueue(st, job, run1, &req, 1, "test", 60000, &push), 0);
    state_push_outcome_t ok = {.state = STATE_PUSH_SUCCEEDED, .http_status = 200, .attempts = 1};
    assert_int_equal(state_push_end(st, push, "test", &ok), 0);
    state_checkpoints_free(cs, n);
    /* Run 2, a fresh start in the same directory: 6 dumps, keep 2. */
    snprintf(rid, sizeof rid, "%lld", (long long)run2);
    const char *h2[] = {"--db", db, "--run-id", rid, "--eval", "none", "--max-steps", "12", NULL};
    json_decref(train(1, s, "pin2", h2, r));
    assert_int_equal(state_checkpoint_list_by_run(st, run2, &cs, &n), 0);
    assert_int_equal(n, 6);
    /* Kept: the newest two (12, 10) and the full dump at 8 they stand on,
     * and the held one (run 1's 4) with its base (run 1's 2). */
    const bool kept2[6] = {false, false, false, true, true, true};
    for (size_t i = 0; i < n; i++) {
        ckpt_dir("pin", cs[i].uid, d, sizeof d);
        if ((access(d, F_OK) == 0) != kept2[i])
            fail_msg("run 2's checkpoint at step %lld: %s", (long long)cs[i].step,
                     kept2[i] ? "removed" : "kept");
    }
    state_checkpoints_free(cs, n);
    ckpt_dir("pin", other, d, sizeof d);
    assert_int_not_equal(access(d, F_OK), 0);
    ckpt_dir("pin", base, d, sizeof d);
    assert_int_equal(access(d, F_OK), 0);
    ckpt_dir("pin", held, d, sizeof d);
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(d, true, &ch), 0);
    assert_int_equal(ch.n, 2);
    ckpt_chain_fini(&ch);
    char root[512];
    snprintf(root, sizeof root, "%s/ckpt/pin", tmpdir);
    assert_int_equal(count_files(root), 5);
    state_close(st);
    free(r);
}

/* Bytes of the regular files under dir (recursively). */
static int64_t dir_bytes(const char *dir)
{
    int64_t total = 0;
    DIR *dd = opendir(dir);
    struct dirent *e;
    while (dd && (e = readdir(dd)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0)
            total += S_ISDIR(st.st_mode) ? dir_bytes(p) : (int64_t)st.st_size;
    }
    if (dd)
        closedir(dd);
    return total;
}

/* The exports rows of db, "uid|format|path|bytes|base uid" per line, oldest
 * first (the sqlite3 shell: state.h has no listing with bytes). */
static void export_rows(const char *db, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "sqlite3 -readonly '%s' \"SELECT c.uid, e.format, e.path, e.bytes, "
             "COALESCE(b.uid, '') FROM exports e JOIN checkpoints c ON c.id = e.checkpoint_id "
             "LEFT JOIN checkpoints b ON b.id = e.base_checkpoint_id ORDER BY e.id\"",
             db);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
}

/* An online export (control file) and `kiln --db DB export` (hugectr and
 * npy) are rows of the exports table: checkpoint, format, path, bytes. */
static void test_export_lineage_in_db(void **state)
{
    (void)state;
    char s[512], db[512], rid[32], p[1024], buf[4096], d0[1024], d1[1024];
    char out1[512], out2[512], want[4096];
    result_t *r = malloc(sizeof *r);
    write_spec("elin", 120, NULL, s, sizeof s);
    int64_t job = 0, run = 0;
    state_close(open_db_run("elin", db, sizeof db, &job, &run, rid));
    const char *h1[] = {"--db", db, "--run-id", rid, "--eval", "none", "--max-steps", "3", NULL};
    json_t *v1 = train(2, s, "elin1", h1, r);
    ckpt_dir("elin", jstr(v1, "checkpoint"), d0, sizeof d0);
    /* Run 2 resumes and finds an export request at its first step. */
    request_export("elin2", p, sizeof p);
    const char *h2[] = {"--db", db,   "--run-id", rid, "--eval", "none", "--resume",
                        d0,     NULL};
    json_t *v2 = train(2, s, "elin2", h2, r);
    json_t *e = export_last("elin2");
    ckpt_dir("elin", jstr(e, "checkpoint"), d1, sizeof d1);
    ckpt_t *c = NULL;
    assert_int_equal(ckpt_open(d1, &c), 0);
    int64_t online_bytes = ckpt_info(c)->bytes;
    ckpt_close(c);
    /* kiln export of the final checkpoint, both formats. */
    char fin[1024];
    ckpt_dir("elin", jstr(v2, "checkpoint"), fin, sizeof fin);
    snprintf(out1, sizeof out1, "%s/elin-hugectr", tmpdir);
    snprintf(out2, sizeof out2, "%s/elin-npy", tmpdir);
    kiln_export(r, db, fin, "hugectr", out1);
    assert_null(strstr(r->err, "not recorded"));
    kiln_export(r, db, fin, "npy", out2);
    export_rows(db, buf, sizeof buf);
    snprintf(want, sizeof want,
             "%s|kiln|%s|%lld|%s\n%s|hugectr|%s|%lld|\n%s|npy|%s|%lld|\n", jstr(e, "checkpoint"), d1,
             (long long)online_bytes, jstr(v1, "checkpoint"), jstr(v2, "checkpoint"), out1,
             (long long)dir_bytes(out1), jstr(v2, "checkpoint"), out2,
             (long long)dir_bytes(out2));
    assert_string_equal(buf, want);
    json_decref(e);
    json_decref(v1);
    json_decref(v2);
    free(r);
}

/* A control file makes the trainer export an incremental checkpoint at the
 * next step boundary and keep training. */
static void test_online_export(void **state)
{
    (void)state;
    char s[512], d[1024], p[1024];
    result_t *r = malloc(sizeof *r);
    write_spec("online", 120, NULL, s, sizeof s);
    json_t *v1 = train_steps(2, s, "online", "online1", "5", d, sizeof d, r);
    request_export("online2", p, sizeof p);
    const char *h2[] = {"--resume", d, "--eval", "none", NULL};
    json_t *v2 = train(2, s, "online2", h2, r);
    assert_int_not_equal(access(p, F_OK), 0); /* consumed */
    json_t *e = export_last("online2");
    assert_string_equal(jstr(e, "kind"), "incremental");
    assert_int_equal((int)jnum(e, "step"), 6);
    assert_string_equal(jstr(e, "parent"), jstr(v1, "checkpoint"));
    /* Training went on to the end, and the final checkpoint stands on it. */
    assert_true(jnum(v2, "steps") > 6);
    ckpt_dir("online", jstr(v2, "checkpoint"), d, sizeof d);
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(d, true, &ch), 0);
    assert_int_equal(ch.n, 3);
    assert_string_equal(ckpt_info(ch.items[1])->uid, jstr(e, "checkpoint"));
    ckpt_chain_fini(&ch);
    json_decref(e);
    json_decref(v1);
    json_decref(v2);
    free(r);
}

/* The online exports progress.jsonl of run_name lists so far. */
/* The steps of run_name's online exports, in the order they were taken
 * (up to cap of them); returns how many there are. */
static int online_export_steps(const char *run_name, int64_t *steps, int cap)
{
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/%s/progress.jsonl", tmpdir, run_name);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strstr(line, "\"online\": true") == NULL)
            continue;
        json_t *o = json_loads(line, 0, NULL);
        if (n < cap)
            steps[n] = o ? (int64_t)json_integer_value(json_object_get(o, "step")) : -1;
        json_decref(o);
        n++;
    }
    if (f)
        fclose(f);
    return n;
}

static int online_exports(const char *run_name)
{
    return online_export_steps(run_name, NULL, 0);
}

/* Polls (10 ms) until run_name has `want` online exports; false after 30 s. */
static bool wait_exports(const char *run_name, int want)
{
    for (int i = 0; i < 3000; i++) {
        if (online_exports(run_name) >= want)
            return true;
        proc_sleep_ms(10);
    }
    return false;
}

/* The kiln-train processes mpirun started, by MPI rank. Open MPI puts each
 * rank in a process group of its own, so they are found by parent. */
static int find_ranks(pid_t mpirun, pid_t *ranks, int cap)
{
    int found = 0;
    DIR *proc = opendir("/proc");
    struct dirent *e;
    while (proc && (e = readdir(proc)) != NULL) {
        char p[512], buf[8192], name[32];
        int pid = atoi(e->d_name);
        int pg = 0, ppid = 0;
        char st = 0;
        if (pid <= 0 || proc_stat(pid, name, sizeof name, &st, &ppid, &pg) < 0 ||
            strcmp(name, "(kiln-train)") != 0 || ppid != mpirun)
            continue;
        snprintf(p, sizeof p, "/proc/%d/environ", pid);
        FILE *f = fopen(p, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
            int rank;
            if (sscanf(buf + i, "OMPI_COMM_WORLD_RANK=%d", &rank) == 1 && rank >= 0 &&
                rank < cap) {
                ranks[rank] = pid;
                found++;
            }
        }
    }
    if (proc)
        closedir(proc);
    return found;
}

/* SIGUSR1 to rank 0 gives one online export; SIGUSR1 to every rank at once
 * gives one more (the ranks' flags are merged at a step boundary), not one
 * per rank; SIGUSR1 to mpirun works too (Open MPI forwards it to every
 * rank). The run keeps training throughout and every export is an
 * incremental on the one before. */
static void test_online_export_sigusr1(void **state)
{
    (void)state;
    char s[512];
    write_spec_train("sig", "train: {batch_size: 80, seed: 7, log_every: 100, epochs: 100000,\n"
                          "        init_from: none}\ncheckpoint: {full_every: 3, keep: 10}\n",
               s, sizeof s);
    const char *h[] = {"--eval", "none", NULL};
    pid_t pid = train_start(3, s, "sig1", h, NULL);
    pid_t ranks[3] = {0, 0, 0};
    /* Deadlines by the clock: on a loaded host a poll of 10 ms can take far
     * longer, and the start itself takes seconds. */
    const int64_t deadline = kiln_mono_ns() + (int64_t)120 * 1000000000;
    int nfound = 0;
    while (kiln_mono_ns() < deadline && (nfound = find_ranks(pid, ranks, 3)) < 3) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            fail_msg("kiln-train ended early: see %s/stderr", tmpdir);
        proc_sleep_ms(10);
    }
    /* Found once is enough: a rank re-executes itself (the CPU's BLAS
     * kernels, the OpenMP spin; same pid, same name), and a look in the
     * middle of that exec can miss it. */
    bool ranks_up = nfound >= 3, training = false;
    /* Training has begun once the first progress line is there. */
    char prog[600];
    snprintf(prog, sizeof prog, "%s/sig1/progress.jsonl", tmpdir);
    while (ranks_up && !training && kiln_mono_ns() < deadline) {
        struct stat st;
        training = stat(prog, &st) == 0 && st.st_size > 0;
        if (!training)
            proc_sleep_ms(10);
    }
    bool ok = ranks_up && training;
    /* A signal that lands while an export is still being finished is served
     * by that export (train.c), so each round waits for the last to settle:
     * its directory appears before the trainer is done with it. */
    ok = ok && kill(ranks[0], SIGUSR1) == 0 && wait_exports("sig1", 1);
    proc_sleep_ms(300);
    int after_rank0 = online_exports("sig1");
    for (int i = 0; ok && i < 3; i++)
        ok = kill(ranks[i], SIGUSR1) == 0;
    ok = ok && wait_exports("sig1", 2);
    /* Give a stray second export time to show up (steps take ~1 ms). */
    proc_sleep_ms(300);
    int after_all = online_exports("sig1");
    ok = ok && kill(pid, SIGUSR1) == 0 && wait_exports("sig1", 3);
    proc_sleep_ms(300);
    int after_mpirun = online_exports("sig1");
    for (int i = 0; i < 3; i++)
        if (ranks[i] > 0)
            kill(ranks[i], SIGKILL);
    kill(-pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    if (!ok) {
        char err[1024], errp[600];
        snprintf(errp, sizeof errp, "%s/stderr", tmpdir);
        proc_slurp(errp, err, sizeof err);
        fail_msg("online exports after rank 0 / all ranks / mpirun: %d %d %d (3 ranks found: "
                 "%d, training: %d); kiln-train's stderr: %s",
                 after_rank0, after_all, after_mpirun, ranks_up, training, err);
    }
    assert_int_equal(after_rank0, 1);
    assert_int_equal(after_all, 2);
    assert_int_equal(after_mpirun, 3);
    /* export.last names the third; its chain holds the other two. */
    char d[1024];
    json_t *e = export_last("sig1");
    assert_string_equal(jstr(e, "kind"), "incremental");
    ckpt_dir("sig", jstr(e, "checkpoint"), d, sizeof d);
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(d, true, &ch), 0);
    assert_int_equal(ch.n, 3);
    assert_true(ckpt_info(ch.items[0])->step < ckpt_info(ch.items[1])->step);
    assert_true(ckpt_info(ch.items[1])->step < ckpt_info(ch.items[2])->step);
    ckpt_chain_fini(&ch);
    json_decref(e);
}

/* An online job (train.mode: online) with export.every: 200ms exports on
 * its own while it trains: at least two, and no more than the time allows. */
/* Lands a copy of src as dir/part-<i>.tsv every every_ms (fx_land), until it is
 * killed or the test that started it is gone. Returns the lander's pid. */
static pid_t lander_start(const char *dir, const char *src, int every_ms)
{
    mkdir(dir, 0755);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    for (int i = 0; i < 2000 && getppid() != 1; i++) {
        char dst[700];
        snprintf(dst, sizeof dst, "%s/part-%d.tsv", dir, i);
        fx_land(src, dst);
        proc_sleep_ms(every_ms);
    }
    _exit(0);
}

static void lander_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* An online run trains on partitions as they land and exports every 200 ms
 * while it does: at least two exports, and never more than the period allows. */
static void test_online_export_every_ms(void **state)
{
    (void)state;
    char s[512], dir[512], src[512];
    result_t *r = malloc(sizeof *r);
    snprintf(s, sizeof s, "%s/every.yaml", tmpdir);
    fx_write(s, "name: every\n"
                "data: {train: \"data/online/part-*.tsv\"}\n"
                "model:\n  type: dlrm\n  embedding: {dim: 8, capacity: 200000}\n"
                "  bottom_mlp: [16, 8]\n  top_mlp: [16, 1]\n"
                "train: {mode: online, batch_size: 80, seed: 7, log_every: 100, init_from: none}\n"
                "export: {every: 200ms}\ncheckpoint: {full_every: 3, keep: 3}\n");
    snprintf(dir, sizeof dir, "%s/data/online", tmpdir);
    snprintf(src, sizeof src, "%s/data/day=0.tsv", tmpdir);
    pid_t lander = lander_start(dir, src, 50);
    int64_t t0 = kiln_now_ms();
    const char *h[] = {"--eval", "none", "--max-steps", "600", NULL};
    json_t *v = train(2, s, "every1", h, r);
    double secs = (double)(kiln_now_ms() - t0) / 1000.0;
    lander_stop(lander);
    int n = online_exports("every1");
    if (n < 2 || n > (int)(secs / 0.2) + 1)
        fail_msg("%d online exports in %.3f s (every 200 ms)", n, secs);
    assert_int_equal((int)jnum(v, "steps"), 600);
    json_decref(v);
    free(r);
}

/* A timed online export needs something learnt since the last one: an
 * online run with no data exports nothing (serving never gets an untrained
 * or unchanged model), and every export of one partition has steps the one
 * before it lacked, however long the run then waits for more. */
static void test_online_export_needs_news(void **state)
{
    (void)state;
    char s[512], dir[512], src[512], dst[700];
    snprintf(s, sizeof s, "%s/news.yaml", tmpdir);
    fx_write(s, "name: news\n"
                "data: {train: \"data/news/part-*.tsv\"}\n"
                "model:\n  type: lr\n  embedding: {capacity: 200000}\n"
                "train: {mode: online, batch_size: 80, seed: 7, init_from: none}\n"
                "export: {every: 100ms}\n");
    snprintf(dir, sizeof dir, "%s/data/news", tmpdir);
    mkdir(dir, 0755);
    const char *h[] = {"--eval", "none", NULL};
    pid_t pid = train_start(2, s, "news1", h, NULL);
    proc_sleep_ms(1000); /* ten export periods with no data */
    int before = online_exports("news1");
    snprintf(src, sizeof src, "%s/data/day=0.tsv", tmpdir);
    snprintf(dst, sizeof dst, "%s/part-0.tsv", dir);
    bool landed = fx_land(src, dst) == 0;
    bool got = landed && wait_exports("news1", 1);
    proc_sleep_ms(1000); /* ten more periods with nothing new */
    int64_t steps[64];
    int after = online_export_steps("news1", steps, 64);
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (before != 0 || !got)
        fail_msg("online exports: %d with no data (want 0)%s", before,
                 got ? "" : "; none came within 30 s of a partition landing");
    /* How many exports training the partition takes depends on the
     * machine's speed (one every 100 ms while it trains); what must hold
     * is that each has steps the last one lacked, so none repeats the
     * final state however long the run waits. */
    for (int i = 1; i < after && i < 64; i++)
        if (steps[i] <= steps[i - 1])
            fail_msg("online export %d is at step %lld, the one before it at %lld: an export "
                     "with nothing learnt since the last",
                     i + 1, (long long)steps[i], (long long)steps[i - 1]);
}

/* The .tmp- directory of job's checkpoint dir, or "" when there is none. */
static void find_tmp(const char *job, char *out, size_t cap)
{
    char root[512];
    snprintf(root, sizeof root, "%s/ckpt/%s", tmpdir, job);
    out[0] = '\0';
    DIR *dd = opendir(root);
    struct dirent *e;
    while (dd && (e = readdir(dd)) != NULL)
        if (strncmp(e->d_name, ".tmp-", 5) == 0)
            snprintf(out, cap, "%s/%s", root, e->d_name);
    if (dd)
        closedir(dd);
}

/* A run of job that failed during a dump left its checkpoints as they
 * were: the newest is still the one that v1, the run before, ended with, and
 * its directory dir still opens, chain and all. */
static void assert_still_latest(const char *job, json_t *v1, const char *dir)
{
    char latest[CKPT_UID_MAX], root[512];
    snprintf(root, sizeof root, "%s/ckpt/%s", tmpdir, job);
    assert_int_equal(ckpt_latest(root, latest), 0);
    assert_string_equal(latest, jstr(v1, "checkpoint"));
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(dir, true, &ch), 0);
    ckpt_chain_fini(&ch);
}

/* kill -9 while the shard files are written: no loadable partial checkpoint,
 * the previous one intact, and the next run starts from it. */
static void test_kill9_during_dump(void **state)
{
    (void)state;
    char s[512], prev[1024], tmp[1024];
    result_t *r = malloc(sizeof *r);
    write_spec("kill", 120, "checkpoint: {full_every: 1, keep: 10}\n", s, sizeof s);
    json_t *v1 = train_steps(2, s, "kill", "kill1", "5", prev, sizeof prev, r);
    const char *h2[] = {"--resume", prev, "--eval", "none", NULL};
    pid_t pid = train_start(2, s, "kill2", h2, "KILN_TEST_DUMP_DELAY_MS=30000");
    /* Wait for the temp dir to fill with shard files. */
    int waited = 0;
    for (; waited < 200; waited++) {
        find_tmp("kill", tmp, sizeof tmp);
        if (tmp[0] && count_files(tmp) >= 26 * 2 * 3)
            break;
        proc_sleep_ms(100);
    }
    assert_true(waited < 200);
    proc_sleep_ms(200);
    kill(-pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    /* The partial dump is not a checkpoint; the previous one is whole. */
    ckpt_t *c = NULL;
    assert_int_equal(ckpt_open(tmp, &c), KILN_ECORRUPT);
    assert_still_latest("kill", v1, prev);
    const char *h3[] = {"--resume", prev, "--eval", "none", NULL};
    json_t *v3 = train(2, s, "kill3", h3, r);
    assert_true(jnum(v3, "steps") > 5);
    json_decref(v1);
    json_decref(v3);
    free(r);
}

/* A full disk during the end-of-run dump: exit 3 (retry), the message names
 * the file and asks for space, no temp dir stays, the previous checkpoint
 * still loads. */
static void test_full_disk_during_dump(void **state)
{
    (void)state;
    char s[512], prev[1024], tmp[1024];
    result_t *r = malloc(sizeof *r);
    write_spec("disk", 120, "checkpoint: {full_every: 1, keep: 10}\n", s, sizeof s);
    json_t *v1 = train_steps(2, s, "disk", "disk1", "5", prev, sizeof prev, r);
    const char *h2[] = {"--resume", prev, "--eval", "none", NULL};
    json_t *v2 = train_full(2, s, "disk2", h2, 16384, r);
    assert_null(v2);
    if (r->code != 3)
        fail_msg("expected exit 3, got %d: %s", r->code, r->err);
    assert_non_null(strstr(r->err, "no space left"));
    assert_non_null(strstr(r->err, ".npy"));
    assert_non_null(strstr(r->err, "free space"));
    find_tmp("disk", tmp, sizeof tmp);
    assert_string_equal(tmp, "");
    assert_still_latest("disk", v1, prev);
    json_decref(v1);
    free(r);
}

/* A damaged checkpoint is refused: exit 2 and the file in the message. */
static void test_corrupt_refused(void **state)
{
    (void)state;
    char s[512], prev[1024], p[1200];
    result_t *r = malloc(sizeof *r);
    write_spec("corrupt", 120, NULL, s, sizeof s);
    json_t *v1 = train_steps(1, s, "corrupt", "corrupt1", "3", prev, sizeof prev, r);
    snprintf(p, sizeof p, "%s/slot5.r0.values.npy", prev);
    poke(p, 130, 0x5a);
    const char *h2[] = {"--resume", prev, NULL};
    assert_null(train_full(2, s, "corrupt2", h2, 0, r));
    assert_int_equal(r->code, 2);
    assert_non_null(strstr(r->err, "slot5.r0.values.npy"));
    assert_non_null(strstr(r->err, "checksum"));
    json_decref(v1);
    free(r);
}

/* `kiln export --format hugectr` of an incremental chain: one folder per
 * table, raw keys and vectors, row n matching the resolved chain. */
static void test_export_hugectr(void **state)
{
    (void)state;
    char s[512], d[1024], out[512], p[1024], db[512];
    result_t *r = malloc(sizeof *r);
    write_spec("exp", 120, NULL, s, sizeof s);
    json_t *v1 = train_steps(2, s, "exp", "exp1", "4", d, sizeof d, r);
    const char *h2[] = {"--resume", d, "--eval", "none", NULL};
    json_t *v2 = train(2, s, "exp2", h2, r);
    ckpt_dir("exp", jstr(v2, "checkpoint"), d, sizeof d);
    snprintf(out, sizeof out, "%s/hugectr", tmpdir);
    snprintf(db, sizeof db, "%s/export.db", tmpdir);
    kiln_export(r, db, d, "hugectr", out);
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(d, true, &ch), 0);
    assert_int_equal(ch.n, 2);
    ckpt_rows_t rows;
    assert_int_equal(ckpt_read_table(&ch, "slot7", &rows), 0);
    assert_true(rows.n > 0);
    snprintf(p, sizeof p, "%s/slot7/key", out);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, rows.n * 8);
    int64_t *k = malloc((size_t)st.st_size);
    FILE *f = fopen(p, "rb");
    assert_int_equal(fread(k, 8, (size_t)rows.n, f), (size_t)rows.n);
    fclose(f);
    assert_memory_equal(k, rows.keys, (size_t)rows.n * 8);
    snprintf(p, sizeof p, "%s/slot7/emb_vector", out);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, rows.n * rows.dim * 4);
    float *v = malloc((size_t)st.st_size);
    f = fopen(p, "rb");
    assert_int_equal(fread(v, 4, (size_t)(rows.n * rows.dim), f), (size_t)(rows.n * rows.dim));
    fclose(f);
    assert_memory_equal(v, rows.values, (size_t)st.st_size);
    /* --db given but the checkpoint is not in it: the export still works
     * and says it was not recorded. */
    assert_non_null(strstr(r->err, "not recorded"));
    free(k);
    free(v);
    ckpt_rows_fini(&rows);
    ckpt_chain_fini(&ch);
    json_decref(v1);
    json_decref(v2);
    free(r);
}

/* Reads the raw file path (size bytes exactly) into a new buffer. */
static void *read_raw(const char *path, size_t size)
{
    struct stat st;
    if (stat(path, &st) != 0 || (size_t)st.st_size != size)
        fail_msg("%s: want %zu bytes, has %lld", path, size, (long long)st.st_size);
    void *p = malloc(size + 1);
    FILE *f = fopen(path, "rb");
    assert_int_equal(fread(p, 1, size, f), size);
    fclose(f);
    return p;
}

/* Issue 26: `kiln export UID --format hugectr` of an fm checkpoint: the
 * linear term as its own 1-wide table, the factors k wide, and the dense
 * model file (w, b, then vx transposed to HugeCTR's (in, out)). */
static void test_export_hugectr_fm(void **state)
{
    (void)state;
    char s[512], db[512], rid[32], out[512], p[1200], spec[768];
    snprintf(spec, sizeof spec,
             "name: hfm\n"
             "data: {train: \"data/day=*.tsv\", eval: \"data/eval.tsv\"}\n"
             "model:\n  type: fm\n  embedding: {dim: 4, capacity: 200000}\n"
             "  fm_dense_factors: true\n"
             "train: {batch_size: 120, seed: 7, epochs: 1, init_from: none}\n");
    snprintf(s, sizeof s, "%s/hfm.yaml", tmpdir);
    fx_write(s, "%s", spec);
    int64_t job = 0, run = 0;
    snprintf(db, sizeof db, "%s/hfm.db", tmpdir);
    state_t *st = NULL;
    assert_int_equal(state_open(db, &st), 0);
    assert_int_equal(state_job_put(st, "hfm", spec, "0000000000000001", NULL, 0, &job, NULL), 0);
    assert_int_equal(state_run_create(st, job, STATE_TRIGGER_MANUAL, 0, 1, 0, &run), 0);
    snprintf(rid, sizeof rid, "%lld", (long long)run);
    state_close(st);
    result_t *r = malloc(sizeof *r);
    const char *h[] = {"--db", db, "--run-id", rid, "--eval", "none", "--max-steps", "6", NULL};
    json_t *v = train(2, s, "hfm1", h, r);
    const char *uid = jstr(v, "checkpoint");
    snprintf(out, sizeof out, "%s/hfm-hugectr", tmpdir);
    const char *argv[] = {KILN_BIN, "--db", db, "export", uid, "--format", "hugectr", "--out",
                          out, NULL};
    proc_run(r, tmpdir, argv);
    if (r->code != 0)
        fail_msg("kiln export %s failed (%d): %s", uid, r->code, r->err);
    char d[1024];
    ckpt_dir("hfm", uid, d, sizeof d);
    ckpt_chain_t ch;
    assert_int_equal(ckpt_chain_open(d, true, &ch), 0);
    ckpt_rows_t rows;
    assert_int_equal(ckpt_read_table(&ch, "slot3", &rows), 0);
    assert_int_equal(rows.dim, 5);
    const size_t n = (size_t)rows.n;
    snprintf(p, sizeof p, "%s/slot3_linear/key", out);
    int64_t *k = read_raw(p, n * 8);
    assert_memory_equal(k, rows.keys, n * 8);
    snprintf(p, sizeof p, "%s/slot3_linear/emb_vector", out);
    float *lin = read_raw(p, n * 4);
    snprintf(p, sizeof p, "%s/slot3/emb_vector", out);
    float *fac = read_raw(p, n * 4 * 4);
    for (size_t i = 0; i < n; i++) {
        assert_true(lin[i] == rows.values[i * 5]);
        assert_memory_equal(fac + i * 4, rows.values + i * 5 + 1, 4 * sizeof(float));
    }
    /* The dense file: F = 13 dense features, k = 4. */
    ckpt_array_t *a = NULL;
    int na = 0;
    assert_int_equal(ckpt_read_dense(ch.items[ch.n - 1], &a, &na), 0);
    const int F = 13, K = 4;
    assert_int_equal(a[0].count, (size_t)(F + 1 + K * F));
    snprintf(p, sizeof p, "%s/hfm_dense_%lld.model", out,
             (long long)ckpt_info(ch.items[ch.n - 1])->step);
    float *dn = read_raw(p, a[0].count * 4);
    assert_memory_equal(dn, a[0].data, (size_t)(F + 1) * 4); /* w (1, F) and b */
    for (int j = 0; j < K; j++)
        for (int f = 0; f < F; f++)
            assert_true(dn[F + 1 + f * K + j] == a[0].data[F + 1 + j * F + f]);
    ckpt_arrays_free(a, na);
    free(k);
    free(lin);
    free(fac);
    free(dn);
    ckpt_rows_fini(&rows);
    ckpt_chain_fini(&ch);
    json_decref(v);
    free(r);
}

/* With --db and --run-id rank 0 records each checkpoint: run, parent, kind,
 * step, keys, bytes, checksum; kiln export records the export. */
static void test_lineage_in_db(void **state)
{
    (void)state;
    char s[512], db[512], d[1024], rid[32];
    result_t *r = malloc(sizeof *r);
    write_spec("lin", 120, "checkpoint: {full_every: 2, keep: 10, every_steps: 10}\n", s, sizeof s);
    int64_t job = 0, run = 0;
    state_t *st = open_db_run("lin", db, sizeof db, &job, &run, rid);
    const char *h[] = {"--db", db, "--run-id", rid, "--eval", "none", "--max-steps", "25", NULL};
    json_t *v = train(2, s, "lin1", h, r);
    /* Dumps at 10 (full), 20 (incremental), 25 (full: full_every 2). */
    state_checkpoint_t c = {0}, parent = {0};
    assert_int_equal(state_checkpoint_get(st, jstr(v, "checkpoint"), &c), 0);
    assert_int_equal(c.run_id, run);
    assert_string_equal(c.kind, "full");
    assert_int_equal(c.step, 25);
    assert_true(c.keys > 0 && c.bytes > 0);
    assert_non_null(c.checksum);
    assert_int_equal(strlen(c.checksum), 16);
    ckpt_dir("lin", jstr(v, "checkpoint"), d, sizeof d);
    ckpt_t *ck;
    assert_int_equal(ckpt_open(d, &ck), 0);
    assert_string_equal(c.checksum, ckpt_info(ck)->checksum);
    assert_int_equal(c.bytes, ckpt_info(ck)->bytes);
    assert_true(c.parent_id > 0);
    assert_int_equal(state_checkpoint_get(st, ckpt_info(ck)->parent, &parent), 0);
    assert_int_equal(parent.id, c.parent_id);
    assert_string_equal(parent.kind, "incremental");
    assert_int_equal(parent.step, 20);
    ckpt_close(ck);
    state_checkpoint_fini(&c);
    state_checkpoint_fini(&parent);
    state_close(st);
    json_decref(v);
    free(r);
}

/* The uid of the newest checkpoint kiln-train wrote (its result line). */
static void last_uid(json_t *v, char *out)
{
    snprintf(out, CKPT_UID_MAX, "%s", jstr(v, "checkpoint"));
    json_decref(v);
}

/* init_from: latest never silently drops a checkpoint: with the newest
 * one's manifest gone, a run starts from the one before it, says so in its
 * log and as a "warning" event of the run, and retention keeps the damaged
 * directory; a checksum failure falls back the same way; with none usable
 * the run fails (exit 2) instead of starting from step 0. 2 ranks, a real
 * SQLite file. */
static void test_latest_falls_back(void **state)
{
    (void)state;
    char s[512], db[512], rid[32], d[1024], p[1200];
    char u[4][CKPT_UID_MAX];
    result_t *r = malloc(sizeof *r);
    write_spec_train("fb",
                     "train: {batch_size: 120, seed: 7, log_every: 1, init_from: latest}\n"
                     "checkpoint: {full_every: 1, keep: 2}\n",
                     s, sizeof s);
    const char *two[] = {"--max-steps", "2", "--eval", "none", NULL};
    /* Three runs of 2 steps, each warm-starting from the last: steps 2, 4, 6. */
    for (int i = 0; i < 3; i++) {
        char run[16];
        snprintf(run, sizeof run, "fb%d", i);
        json_t *v = train(2, s, run, two, r);
        assert_int_equal((int)jnum(v, "steps"), 2 * (i + 1));
        last_uid(v, u[i]);
    }
    ckpt_dir("fb", u[0], d, sizeof d);
    assert_int_not_equal(access(d, F_OK), 0); /* keep: 2 */
    ckpt_dir("fb", u[2], d, sizeof d);
    snprintf(p, sizeof p, "%s/manifest.json", d);
    assert_int_equal(unlink(p), 0);

    int64_t job = 0, run = 0;
    state_t *st = open_db_run("fb", db, sizeof db, &job, &run, rid);
    const char *withdb[] = {"--max-steps", "2", "--eval", "none", "--db", db,
                            "--run-id",    rid, NULL};
    json_t *v = train(2, s, "fb3", withdb, r);
    /* From u[1] (step 4), not from scratch (2) nor the damaged u[2] (8). */
    assert_int_equal((int)jnum(v, "steps"), 6);
    last_uid(v, u[3]);
    char want[2400];
    snprintf(want, sizeof want,
             "init_from latest: checkpoint %s cannot be used (%s has no "
             "manifest.json",
             d, d);
    if (strstr(r->err, want) == NULL)
        fail_msg("no warning in the log: %s", r->err);
    state_event_t *es = NULL;
    size_t ne = 0;
    assert_int_equal(state_event_list(st, 0, run, &es, &ne), 0);
    bool found = false;
    for (size_t i = 0; i < ne; i++)
        found = found || (strcmp(es[i].kind, "warning") == 0 && strstr(es[i].message, want));
    state_events_free(es, ne);
    assert_true(found);
    /* Retention (keep: 2) kept u[3] and u[1], and did not delete u[2]. */
    assert_int_equal(access(d, F_OK), 0);
    snprintf(p, sizeof p, "%s/slot0.r0.values.npy", d);
    assert_int_equal(access(p, F_OK), 0);

    /* A checksum failure in the newest: back to u[1] again. */
    ckpt_dir("fb", u[3], d, sizeof d);
    snprintf(p, sizeof p, "%s/slot3.r1.values.npy", d);
    poke(p, 140, 0x5a);
    v = train(2, s, "fb4", two, r);
    assert_int_equal((int)jnum(v, "steps"), 6);
    json_decref(v);
    assert_non_null(strstr(r->err, "slot3.r1.values.npy"));
    assert_non_null(strstr(r->err, "trying the next older one"));

    /* None usable: exit 2 with the reason, not a fresh start. */
    char all[CKPT_UID_MAX * 2 + 2048];
    snprintf(all, sizeof all, "rm -f '%s/ckpt/fb'/*/manifest.json", tmpdir);
    assert_int_equal(system(all), 0);
    assert_null(train_full(2, s, "fb5", two, 0, r));
    assert_int_equal(r->code, 2);
    assert_non_null(strstr(r->err, "init_from latest: none of the "));
    assert_non_null(strstr(r->err, "can be used"));
    assert_non_null(strstr(r->err, "set train.init_from: none to start fresh"));
    state_close(st);
    free(r);
}

/* The temp dir with the training data; proc_tmpdir_teardown removes it. */
static int setup(void **state)
{
    if (fx_train_tmpdir("ckpt", tmpdir, sizeof tmpdir, 3600, 600, 5) < 0)
        return -1;
    *state = tmpdir;
    return 0;
}

PROC_TEST_MAIN(setup, proc_tmpdir_teardown,
    cmocka_unit_test(test_npy_numpy_loads),
    cmocka_unit_test(test_chain_bitwise),
    cmocka_unit_test(test_incremental_cost),
    cmocka_unit_test(test_load_any_rank_count),
    cmocka_unit_test(test_integrity),
    cmocka_unit_test(test_retention),
    cmocka_unit_test(test_retention_keeps_unreadable),
    cmocka_unit_test(test_enospc_unit),
    cmocka_unit_test(test_nonfinite_refused),
    cmocka_unit_test(test_resume_same_ranks_bitwise),
    cmocka_unit_test(test_resume_across_rank_counts),
    cmocka_unit_test(test_online_export),
    cmocka_unit_test(test_kill9_during_dump),
    cmocka_unit_test(test_full_disk_during_dump),
    cmocka_unit_test(test_corrupt_refused),
    cmocka_unit_test(test_export_hugectr),
    cmocka_unit_test(test_export_hugectr_fm),
    cmocka_unit_test(test_lineage_in_db),
    cmocka_unit_test(test_resume_across_rank_counts_sgd),
    cmocka_unit_test(test_retention_keeps_endpoint_holding),
    cmocka_unit_test(test_export_lineage_in_db),
    cmocka_unit_test(test_online_export_sigusr1),
    cmocka_unit_test(test_online_export_every_ms),
    cmocka_unit_test(test_online_export_needs_news),
    cmocka_unit_test(test_latest_falls_back))
