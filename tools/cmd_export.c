/*
 * tools/cmd_export.c - `kiln export CHECKPOINT --format hugectr|npy --out DIR`:
 * resolves a checkpoint (a uid the database knows, or a directory; full, or
 * full + incremental chain), checks every file against its manifest, and
 * writes the tables in HugeCTR's sparse-model layout, with the dense model
 * file whose layers the job's spec gives, or as .npy arrays
 * (docs/checkpoint-format.md). With --db the export is recorded against the
 * checkpoint in SQLite.
 *
 * `kiln export --job NAME --incremental --push [--label L]` is the line for
 * system cron: it takes the job's newest checkpoint from the database and
 * pushes it to the job's endpoints (push.endpoints), each as a delta on what
 * that endpoint holds per the database (without --incremental: in full).
 * ops/ (ops_push_job) does the work and records it, exactly as `kiln push`
 * does.
 */
#include "cli.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln.h"
#include "kiln_json.h"
#include "ops.h"
#include "ckpt.h"
#include "model.h"
#include "state.h"

const cli_opt_t export_opts[] = {
    {"format", "FORMAT", "hugectr (a folder per table: raw int64 key, float32 emb_vector) or npy"},
    {"out", "DIR", "the directory to write (created)"},
    {"job", "NAME", "instead of a CHECKPOINT: the job's newest checkpoint, with --push"},
    {"push", NULL, "push it to the job's endpoints (push.endpoints) and record the pushes"},
    {"incremental", NULL, "with --push: a delta on what each endpoint holds (else full)"},
    {"label", "LABEL", "with --push: only the endpoints with this label"},
    {NULL, NULL, NULL}};

/* Records the export when --db was given; a checkpoint the DB does not know
 * is reported, not fatal. */
static void record(cli_t *cli, const ckpt_info_t *in, const char *fmt, const char *out,
                   int64_t bytes)
{
    if (cli->db_path == NULL)
        return;
    state_t *st = NULL;
    state_checkpoint_t c = {0};
    int rc = state_open(cli->db_path, &st);
    if (rc == 0)
        rc = state_checkpoint_get(st, in->uid, &c);
    if (rc == 0)
        rc = state_export_add(st, c.id, 0, fmt, out, bytes, NULL);
    if (rc < 0)
        fprintf(stderr, "kiln: export not recorded in %s: %s\n", cli->db_path, kiln_errmsg());
    state_checkpoint_fini(&c);
    state_close(st);
}

/* The database of --job mode: --db, else $KILN_HOME/kiln.db, else
 * ~/.kiln/kiln.db (as the commands that always need one). */
static char *job_db_path(const cli_t *cli)
{
    if (cli->db_path != NULL)
        return kiln_strdup(cli->db_path);
    const char *home = getenv("KILN_HOME");
    if (home != NULL && home[0] != '\0')
        return kiln_asprintf("%s/kiln.db", home);
    home = getenv("HOME");
    return home != NULL ? kiln_asprintf("%s/.kiln/kiln.db", home) : NULL;
}

/* kiln export --job NAME [--incremental] --push [--label L]. */
static int export_job_push(cli_t *cli, const char *job)
{
    if (cli_opt(cli, "push") == NULL)
        return cli_fail(KILN_EUSAGE, "export --job NAME writes no files: add --push to push the "
                                     "job's newest checkpoint to its endpoints, or name a "
                                     "CHECKPOINT directory with --out DIR");
    if (cli_opt(cli, "out") != NULL || cli_opt(cli, "format") != NULL)
        return cli_fail(KILN_EUSAGE, "export --job ... --push takes no --out / --format");
    char *db = job_db_path(cli);
    if (db == NULL)
        return cli_fail(KILN_EUSAGE, "neither KILN_HOME nor HOME is set; pass --db PATH");
    state_t *st = NULL;
    int rc = state_open(db, &st);
    free(db);
    if (rc < 0)
        return cli_fail(rc, NULL);
    bool full = cli_opt(cli, "incremental") == NULL;
    ops_push_report_t r = {0};
    rc = ops_push_job(st, job, cli_opt(cli, "label"), NULL, full, false, &r);
    state_close(st);
    if (cli->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < r.n; i++)
            json_array_append_new(arr, cli_push_json(&r.pushes[i]));
        json_t *j = json_pack("{s:s, s:s, s:b, s:i, s:i, s:o}", "job", job, "checkpoint",
                              r.checkpoint, "ok", rc == 0, "pushes", (int)r.n, "failed",
                              (int)r.n - r.nsucceeded, "results", arr);
        if (rc < 0)
            json_object_set_new(j, "error", kiln_json_str(kiln_errmsg()));
        cli_print_json(j);
    }
    size_t n = r.n;
    char uid[SERVE_UID_MAX];
    snprintf(uid, sizeof uid, "%s", r.checkpoint);
    ops_push_report_fini(&r);
    if (rc < 0)
        return cli_fail(rc, NULL);
    if (!cli->json)
        printf("exported %s of job %s %s to %zu endpoint(s)\n", uid, job,
               full ? "in full" : "as deltas", n);
    return CLI_EXIT_OK;
}

/* The matrices of the dense parameter vector of the model desc describes
 * (model/model.c's layout) into m (cap); returns how many, or -1 when more
 * than cap. */
static int dense_matrices(const serve_model_desc_t *d, ckpt_export_matrix_t *m, int cap)
{
    int n = 0;
#define PUT(r, c)                                                                                  \
    do {                                                                                           \
        if (n == cap)                                                                              \
            return -1;                                                                             \
        m[n++] = (ckpt_export_matrix_t){(r), (c)};                                                   \
    } while (0)
    if (d->model_type != MODEL_DLRM) { /* lr, fm: w (1, F), b (1, 1), fm's vx (k, F) */
        if (d->ndense > 0)
            PUT(1, d->ndense);
        PUT(1, 1);
        if (d->model_type == MODEL_FM && d->fm_dense_factors)
            PUT(d->dim - 1, d->ndense);
        return n;
    }
    int in = d->ndense; /* dlrm: each layer's weight (out, in), bias (out, 1) */
    for (int l = 0; l < d->nbottom; in = d->bottom[l++]) {
        PUT(d->bottom[l], in);
        PUT(d->bottom[l], 1);
    }
    in = d->dim + d->nslots * (d->nslots + 1) / 2; /* the top MLP's input: d + P */
    for (int l = 0; l < d->ntop; in = d->top[l++]) {
        PUT(d->top[l], in);
        PUT(d->top[l], 1);
    }
#undef PUT
    return n;
}

/* The dense model's shape, from the spec of the job that wrote checkpoint
 * uid (as the database records it), into *m (cap) and *n; *n 0 when the
 * database does not know the checkpoint. */
static int spec_dense(state_t *st, const char *uid, ckpt_export_matrix_t *m, int cap, int *n)
{
    state_checkpoint_t c = {0};
    state_run_t run = {0};
    state_job_t job = {0};
    char *yaml = NULL;
    job_spec_t spec;
    bool have_spec = false;
    serve_model_desc_t d;
    *n = 0;
    int rc = state_checkpoint_get(st, uid, &c);
    if (rc == KILN_ENOENT)
        return 0;
    KILN_CHECK_GOTO(rc, rc, out);
    KILN_CHECK_GOTO(state_run_get(st, c.run_id, &run), rc, out);
    KILN_CHECK_GOTO(state_job_get_by_id(st, run.job_id, &job), rc, out);
    KILN_CHECK_GOTO(state_job_version_spec(st, job.id, run.job_version, &yaml), rc, out);
    KILN_CHECK_GOTO(job_spec_parse(yaml, strlen(yaml), job.name, &spec, NULL), rc, out);
    have_spec = true;
    KILN_CHECK_GOTO(ops_model_desc(&spec, &d), rc, out);
    *n = dense_matrices(&d, m, cap);
    if (*n < 0)
        rc = kiln_errf(KILN_ERANGE, "the dense model of job %s has too many layers", job.name);
out:
    if (have_spec)
        job_spec_fini(&spec);
    free(yaml);
    state_job_fini(&job);
    state_run_fini(&run);
    state_checkpoint_fini(&c);
    return rc;
}

/* Resolves what `kiln export` names: a checkpoint directory, or a checkpoint
 * uid looked up in the database. *dir (malloc'd) is the directory; *st the
 * database when there is one (--db, or the default for a uid). */
static int resolve(const cli_t *cli, const char *what, char **dir, state_t **st)
{
    struct stat sb;
    *st = NULL;
    bool is_dir = stat(what, &sb) == 0 && S_ISDIR(sb.st_mode);
    char *db = is_dir ? (cli->db_path ? kiln_strdup(cli->db_path) : NULL) : job_db_path(cli);
    if (db != NULL) {
        struct stat dbs;
        int rc = is_dir || stat(db, &dbs) == 0 ? state_open(db, st) : KILN_ENOENT;
        free(db);
        if (rc < 0 && !is_dir)
            return kiln_errf(KILN_ENOENT, "'%s' is not a checkpoint directory, nor a checkpoint "
                                          "uid of a database (%s)",
                             what, rc == KILN_ENOENT ? "there is none; pass --db PATH" : kiln_errmsg());
        KILN_CHECK(rc);
    }
    if (is_dir) {
        *dir = kiln_strdup(what);
        return *dir ? 0 : KILN_ENOMEM;
    }
    state_checkpoint_t c = {0};
    int rc = *st ? state_checkpoint_get(*st, what, &c) : KILN_ENOENT;
    if (rc == KILN_ENOENT)
        rc = kiln_errf(KILN_ENOENT, "'%s' is not a checkpoint directory, nor a checkpoint uid the "
                                    "database knows (kiln show RUN lists a run's checkpoints)",
                       what);
    if (rc == 0) {
        *dir = kiln_strdup(c.path);
        rc = *dir ? 0 : KILN_ENOMEM;
    }
    state_checkpoint_fini(&c);
    return rc;
}

int cmd_export(cli_t *cli)
{
    const char *job = cli_opt(cli, "job");
    if (job != NULL) {
        if (cli->npos > 0)
            return cli_fail(KILN_EUSAGE, "export takes a CHECKPOINT or --job NAME, not both");
        return export_job_push(cli, job);
    }
    if (cli->npos != 1)
        return cli_fail(KILN_EUSAGE, "export needs a CHECKPOINT (uid or directory), or --job NAME "
                                     "--push");
    if (cli_opt(cli, "push") != NULL || cli_opt(cli, "incremental") != NULL)
        return cli_fail(KILN_EUSAGE, "--push and --incremental go with --job NAME");
    const char *fmt_s = cli_opt(cli, "format"), *out = cli_opt(cli, "out");
    if (out == NULL)
        return cli_fail(KILN_EUSAGE, "export needs --out DIR");
    ckpt_export_format_t fmt = CKPT_EXPORT_HUGECTR;
    /* A format that is not written is a bad option value (exit 3), not a
     * bad command line: the command was well formed (docs/cli.md). */
    if (fmt_s != NULL && ckpt_export_format_parse(fmt_s, &fmt) < 0)
        return cli_fail(KILN_EINVAL, NULL);
    char *dir = NULL;
    state_t *st = NULL;
    int rc = resolve(cli, cli->pos[0], &dir, &st);
    ckpt_chain_t ch;
    if (rc == 0)
        rc = ckpt_chain_open(dir, true, &ch);
    free(dir);
    if (rc < 0) {
        state_close(st);
        return cli_fail(rc, NULL);
    }
    const ckpt_info_t *in = ckpt_info(ch.items[ch.n - 1]);
    /* HugeCTR's dense model file needs the layers, which the spec has. */
    ckpt_export_matrix_t m[4 * SERVE_MAX_LAYERS + 4];
    char dense_file[160];
    snprintf(dense_file, sizeof dense_file, "%s_dense_%" PRId64 ".model", in->job, in->step);
    ckpt_export_dense_t dense = {m, 0, dense_file};
    if (st != NULL && fmt == CKPT_EXPORT_HUGECTR &&
        spec_dense(st, in->uid, m, (int)(sizeof m / sizeof m[0]), &dense.n) < 0) {
        fprintf(stderr, "kiln: the spec of checkpoint %s's job cannot be read: %s\n", in->uid,
                kiln_errmsg());
        dense.n = 0;
    }
    state_close(st);
    int64_t bytes = 0;
    if (rc == 0)
        rc = ckpt_export(&ch, fmt, out, dense.n > 0 ? &dense : NULL, &bytes);
    if (rc < 0) {
        ckpt_chain_fini(&ch);
        return cli_fail(rc, NULL);
    }
    if (fmt == CKPT_EXPORT_HUGECTR && dense.n == 0)
        fprintf(stderr, "kiln: no dense model file: its layers come from the spec of the job that "
                        "wrote checkpoint %s (name the checkpoint by uid, or pass --db)\n",
                in->uid);
    const char *fname = fmt == CKPT_EXPORT_HUGECTR ? "hugectr" : "npy";
    record(cli, in, fname, out, bytes);
    if (cli->json)
        cli_print_json(json_pack("{s:s, s:s, s:s, s:I, s:i, s:I, s:o}", "checkpoint", in->uid,
                                 "format", fname, "out", out, "step", (json_int_t)in->step, "chain",
                                 ch.n, "bytes", (json_int_t)bytes, "dense_model",
                                 dense.n > 0 ? kiln_json_str(dense_file) : json_null()));
    else
        printf("exported checkpoint %s (step %" PRId64 ", chain of %d) as %s to %s, %" PRId64
               " bytes\n",
               in->uid, in->step, ch.n, fname, out, bytes);
    ckpt_chain_fini(&ch);
    return CLI_EXIT_OK;
}
