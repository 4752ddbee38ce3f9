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
#include "kiln_json.h"
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
    {"force", NULL, "promote even where push.promote_when (the online metrics) refuses"},
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
            json_object_set_new(j, "error", kiln_json_str(kiln_errmsg()));
        if (r->note[0] != '\0')
            json_object_set_new(j, "promote_when", json_string(r->note));
        cli_print_json(j);
    } else {
        if (r->note[0] != '\0')
            printf("%s\n", r->note);
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

/* Whether every option of names (NULL-terminated) has a value; says which do
 * not. */
static bool given(const cli_t *cli, const char *const *names)
{
    bool ok = true;
    for (; *names != NULL; names++) {
        const char *v = cli_opt(cli, *names);
        if (v == NULL || v[0] == '\0') {
            cli_fail(KILN_EUSAGE, "--%s is required", *names);
            ok = false;
        }
    }
    return ok;
}

/* One command's call into ops/, its required options present. */
typedef int (*push_op_t)(state_t *st, const cli_t *cli, ops_push_report_t *r);

/* Runs op on the database claimed by this command and reports the pushes it
 * made as `what` ("pushed"); returns the exit code. */
static int deliver(cli_t *cli, push_op_t op, const char *what)
{
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    ops_push_report_t r = {0};
    rc = op(st, cli, &r);
    state_close(st);
    return report(cli, rc, &r, what);
}

static int push_job(state_t *st, const cli_t *cli, ops_push_report_t *r)
{
    return ops_push_job(st, cli_opt(cli, "job"), cli_opt(cli, "label"), cli_opt(cli, "checkpoint"),
                        cli_opt(cli, "full") != NULL, cli_opt(cli, "force") != NULL, r);
}

static int promote(state_t *st, const cli_t *cli, ops_push_report_t *r)
{
    return ops_promote(st, cli_opt(cli, "model"), cli_opt(cli, "from"), cli_opt(cli, "to"),
                       cli_opt(cli, "token-env"), cli_opt(cli, "force") != NULL, r);
}

static int rollback(state_t *st, const cli_t *cli, ops_push_report_t *r)
{
    return ops_rollback(st, cli_opt(cli, "model"), cli_opt(cli, "label"), cli_opt(cli, "token-env"),
                        r);
}

int cmd_push(cli_t *cli)
{
    static const char *const required[] = {"job", NULL};
    return given(cli, required) ? deliver(cli, push_job, "pushed") : CLI_EXIT_USAGE;
}

int cmd_promote(cli_t *cli)
{
    static const char *const required[] = {"model", "from", "to", NULL};
    return given(cli, required) ? deliver(cli, promote, "promoted") : CLI_EXIT_USAGE;
}

int cmd_rollback(cli_t *cli)
{
    static const char *const required[] = {"model", "label", NULL};
    return given(cli, required) ? deliver(cli, rollback, "rolled back to") : CLI_EXIT_USAGE;
}
