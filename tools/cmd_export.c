/*
 * tools/cmd_export.c - `kiln export CHECKPOINT --format hugectr|npy --out DIR`:
 * resolves a checkpoint (full, or full + incremental chain), checks every
 * file against its manifest, and writes the tables in HugeCTR's sparse-model
 * layout or as .npy arrays (docs/checkpoint-format.md). With --db the export
 * is recorded against the checkpoint in SQLite.
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

#include "kiln.h"
#include "ops.h"
#include "ckpt.h"
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
static void record(cli_t *cli, const rt_ckpt_info_t *in, const char *fmt, const char *out,
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
            json_object_set_new(j, "error", json_string(kiln_errmsg()));
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

int cmd_export(cli_t *cli)
{
    const char *job = cli_opt(cli, "job");
    if (job != NULL) {
        if (cli->npos > 0)
            return cli_fail(KILN_EUSAGE, "export takes a CHECKPOINT or --job NAME, not both");
        return export_job_push(cli, job);
    }
    if (cli->npos != 1)
        return cli_fail(KILN_EUSAGE, "export needs a CHECKPOINT directory (or --job NAME --push)");
    if (cli_opt(cli, "push") != NULL || cli_opt(cli, "incremental") != NULL)
        return cli_fail(KILN_EUSAGE, "--push and --incremental go with --job NAME");
    const char *fmt_s = cli_opt(cli, "format"), *out = cli_opt(cli, "out");
    if (out == NULL)
        return cli_fail(KILN_EUSAGE, "export needs --out DIR");
    rt_export_format_t fmt = RT_EXPORT_HUGECTR;
    /* A format that is not written is a bad option value (exit 3), not a
     * bad command line: the command was well formed (docs/cli.md). */
    if (fmt_s != NULL && rt_export_format_parse(fmt_s, &fmt) < 0)
        return cli_fail(KILN_EINVAL, NULL);
    rt_ckpt_chain_t ch;
    int rc = rt_ckpt_chain_open(cli->pos[0], true, &ch);
    if (rc < 0)
        return cli_fail(rc, NULL);
    int64_t bytes = 0;
    rc = rt_ckpt_export(&ch, fmt, out, &bytes);
    if (rc < 0) {
        rt_ckpt_chain_fini(&ch);
        return cli_fail(rc, NULL);
    }
    const rt_ckpt_info_t *in = rt_ckpt_info(ch.items[ch.n - 1]);
    const char *fname = fmt == RT_EXPORT_HUGECTR ? "hugectr" : "npy";
    record(cli, in, fname, out, bytes);
    if (cli->json)
        cli_print_json(json_pack("{s:s, s:s, s:s, s:I, s:i, s:I}", "checkpoint", in->uid, "format",
                                 fname, "out", out, "step", (json_int_t)in->step, "chain", ch.n,
                                 "bytes", (json_int_t)bytes));
    else
        printf("exported checkpoint %s (step %" PRId64 ", chain of %d) as %s to %s, %" PRId64
               " bytes\n",
               in->uid, in->step, ch.n, fname, out, bytes);
    rt_ckpt_chain_fini(&ch);
    return CLI_EXIT_OK;
}
