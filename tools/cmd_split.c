/*
 * tools/cmd_split.c - `kiln split MODEL [A=90,B=10]`: sets (or, without a
 * split, shows) which share of a model's predict traffic each label gets on
 * every kiln-serve serving it (ops_split). kiln-serve keeps the split in its
 * state directory, so it outlives restarts; a label no split names gets no
 * traffic. The ramps of the model's labels (push.ramp) are shown after the
 * splits: where each stands, or what stopped it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln.h"
#include "kiln_json.h"
#include "ops.h"
#include "state.h"

const cli_opt_t split_opts[] = {
    {"token-env", "VAR", "variable holding kiln-serve's token (default: the job spec's)"},
    {NULL, NULL, NULL},
};

int cmd_split(cli_t *cli)
{
    const char *model = cli->pos[0], *split = cli->npos > 1 ? cli->pos[1] : NULL;
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    ops_split_report_t rep;
    rc = ops_split(st, model, split, cli_opt(cli, "token-env"), &rep);
    ops_ramp_t *ramps = NULL;
    size_t nramps = 0;
    if (ops_ramp_list(st, kiln_now_s(), &ramps, &nramps) < 0)
        nramps = 0;
    state_close(st);
    if (cli->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < rep.n; i++) {
            const serve_split_result_t *r = &rep.results[i];
            json_array_append_new(
                arr, json_pack("{s:s, s:b, s:i, s:s, s:s, s:s, s:s}", "url", rep.urls[i], "ok",
                               r->error[0] == '\0', "http_status", r->http_status, "split",
                               r->split, "source", r->source, "no_traffic", r->no_traffic,
                               "error", r->error));
        }
        json_t *jr = json_array();
        for (size_t i = 0; i < nramps; i++)
            if (strcmp(ramps[i].model, model) == 0)
                json_array_append_new(jr, ops_ramp_json(&ramps[i]));
        json_t *j = json_pack("{s:s, s:b, s:o, s:o}", "model", model, "ok", rc == 0, "endpoints",
                              arr, "ramps", jr);
        if (rc < 0)
            json_object_set_new(j, "error", kiln_json_str(kiln_errmsg()));
        cli_print_json(j);
    } else {
        for (size_t i = 0; i < rep.n; i++) {
            const serve_split_result_t *r = &rep.results[i];
            if (r->error[0] != '\0')
                continue;
            printf("%s: %s split %s (%s)", rep.urls[i], model, r->split[0] ? r->split : "none",
                   r->source);
            if (r->no_traffic[0] != '\0')
                printf("; no traffic: %s", r->no_traffic);
            printf("\n");
        }
        for (size_t i = 0; i < nramps; i++) {
            char what[900];
            ops_ramp_describe(&ramps[i], what, sizeof what);
            if (strcmp(ramps[i].model, model) == 0)
                printf("%s: %s/%s (job %s) %s\n", ramps[i].url, model, ramps[i].label,
                       ramps[i].job, what);
        }
    }
    free(ramps);
    ops_split_report_fini(&rep);
    return rc < 0 ? cli_fail(rc, NULL) : CLI_EXIT_OK;
}
