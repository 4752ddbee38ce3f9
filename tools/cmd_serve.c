/*
 * tools/cmd_serve.c - `kiln push`, `kiln promote` and `kiln rollback`: thin
 * wrappers over ops/ (ops_push_job, ops_promote, ops_rollback), which queue
 * the pushes in the database claimed by this command and deliver them at
 * once: a delta on what each endpoint holds, a full push where it must. A
 * push that does not land names the endpoint and the HTTP status, and the
 * command exits 1; if a retry may help, kilnd keeps retrying it.
 */
#include <stdio.h>

#include "cli.h"
#include "kiln.h"
#include "ops.h"
#include "state.h"

const cli_opt_t push_opts[] = {
    {"job", "NAME", "the job whose checkpoint to push (required)"},
    {"label", "LABEL", "push to the job's endpoints with this label (default: all of them)"},
    {"checkpoint", "UID", "push this checkpoint instead of the job's latest"},
    {"full", NULL, "a full push, even where a delta would do"},
    {"force", NULL, "push even where the quality gate (push.max_regression) would hold it back"},
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

/* Prints what became of each push and returns the exit code. */
static int report(cli_t *cli, int rc, ops_push_report_t *r, const char *what)
{
    if (cli->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < r->n; i++)
            json_array_append_new(arr, cli_push_json(&r->pushes[i]));
        json_t *j = json_pack("{s:s, s:b, s:i, s:i, s:i, s:i, s:o}", "checkpoint", r->checkpoint,
                              "ok", rc == 0, "succeeded", r->nsucceeded, "failed", r->nfailed,
                              "held", r->nheld, "pending", r->npending, "pushes", arr);
        if (rc < 0)
            json_object_set_new(j, "error", json_string(kiln_errmsg()));
        cli_print_json(j);
    } else {
        for (size_t i = 0; i < r->n; i++) {
            const state_push_t *p = &r->pushes[i];
            printf("push %lld: %s (%s/%s): %s, %s", (long long)p->id, p->url, p->model, p->label,
                   state_push_state_name(p->state), state_push_mode_name(p));
            if (p->http_status != 0 && p->state != STATE_PUSH_SUCCEEDED)
                printf(", HTTP %d", p->http_status);
            printf("\n");
        }
        if (rc == 0)
            printf("%s %s to %zu endpoint(s)\n", what, r->checkpoint, r->n);
    }
    ops_push_report_fini(r);
    return rc < 0 ? cli_fail(rc, NULL) : CLI_EXIT_OK;
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
    ops_push_report_t r = {0};
    rc = ops_push_job(st, job, cli_opt(cli, "label"), cli_opt(cli, "checkpoint"),
                      cli_opt(cli, "full") != NULL, cli_opt(cli, "force") != NULL, &r);
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
    ops_push_report_t r = {0};
    rc = ops_promote(st, model, from, to, cli_opt(cli, "token-env"), &r);
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
    ops_push_report_t r = {0};
    rc = ops_rollback(st, model, label, cli_opt(cli, "token-env"), &r);
    state_close(st);
    return report(cli, rc, &r, "rolled back to");
}
