/*
 * tools/cmd_serve.c - `kiln push`, `kiln promote` and `kiln rollback`: thin
 * wrappers over serving/serve_ops.c, which pushes over HTTP (deltas on what
 * each endpoint holds, full pushes when it must) and records exports,
 * pushes, holdings and events in the database. A failed push names the
 * endpoint and the HTTP status, and the command exits 1.
 */
#include <stdio.h>

#include "cli.h"
#include "kiln.h"
#include "serve.h"
#include "state.h"

const cli_opt_t push_opts[] = {
    {"job", "NAME", "the job whose checkpoint to push (required)"},
    {"label", "LABEL", "push to the job's endpoints with this label (default: all of them)"},
    {"checkpoint", "UID", "push this checkpoint instead of the job's latest"},
    {NULL, NULL, NULL},
};

const cli_opt_t promote_opts[] = {
    {"model", "M", "the model name the endpoints serve (required)"},
    {"from", "LABEL", "the label whose checkpoint to promote (required)"},
    {"to", "LABEL", "the label to push it to (required)"},
    {"token-env", "VAR", "variable holding the push token (default: the job spec's)"},
    {NULL, NULL, NULL},
};

const cli_opt_t rollback_opts[] = {
    {"model", "M", "the model name the endpoints serve (required)"},
    {"label", "LABEL", "the label to roll back (required)"},
    {"token-env", "VAR", "variable holding the push token (default: the job spec's)"},
    {NULL, NULL, NULL},
};

static int report(cli_t *cli, int rc, const serve_op_result_t *r, const char *what)
{
    if (cli->json) {
        json_t *j = json_pack("{s:s,s:b,s:i,s:i}", "checkpoint", r->checkpoint, "ok", rc == 0,
                              "pushes", r->npushes, "failed", r->nfailed);
        if (rc < 0)
            json_object_set_new(j, "error", json_string(kiln_errmsg()));
        cli_print_json(j);
    }
    if (rc < 0)
        return cli_fail(rc, NULL);
    if (!cli->json)
        printf("%s %s to %d endpoint(s)\n", what, r->checkpoint, r->npushes);
    return CLI_EXIT_OK;
}

static const char *need(cli_t *cli, const char *name, int *bad)
{
    const char *v = cli_opt(cli, name);
    if (v == NULL || v[0] == '\0') {
        fprintf(stderr, "kiln: --%s is required\n", name);
        *bad = 1;
    }
    return v;
}

int cmd_push(cli_t *cli)
{
    int bad = 0;
    const char *job = need(cli, "job", &bad);
    if (bad)
        return CLI_EXIT_USAGE;
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    serve_op_result_t r = {0};
    rc = serve_op_push_job(st, job, cli_opt(cli, "label"), cli_opt(cli, "checkpoint"), false,
                          &r);
    state_close(st);
    return report(cli, rc, &r, "pushed");
}

int cmd_promote(cli_t *cli)
{
    int bad = 0;
    const char *model = need(cli, "model", &bad), *from = need(cli, "from", &bad),
               *to = need(cli, "to", &bad);
    if (bad)
        return CLI_EXIT_USAGE;
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    serve_op_result_t r = {0};
    rc = serve_op_promote(st, model, from, to, cli_opt(cli, "token-env"), &r);
    state_close(st);
    return report(cli, rc, &r, "promoted");
}

int cmd_rollback(cli_t *cli)
{
    int bad = 0;
    const char *model = need(cli, "model", &bad), *label = need(cli, "label", &bad);
    if (bad)
        return CLI_EXIT_USAGE;
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    serve_op_result_t r = {0};
    rc = serve_op_rollback(st, model, label, cli_opt(cli, "token-env"), &r);
    state_close(st);
    return report(cli, rc, &r, "rolled back to");
}
