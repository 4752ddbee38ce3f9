/*
 * tools/cmd_endpoints.c - `kiln endpoints [--model M]`: every serving
 * endpoint Kiln pushes to, one line each: what it holds and how old that
 * is, its eval logloss, its share of the model's predict traffic (from the
 * stats kilnd reads), its pushes, for a label with push.ramp, where the
 * ramp stands or what stopped it, and its online A/B metrics (read from
 * its kiln-serve now; "unknown" when it does not answer). The same reading as the endpoints page
 * and /api/endpoints (ops_endpoints_json).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kiln.h"
#include "ops.h"
#include "state.h"

const cli_opt_t endpoints_opts[] = {
    {"model", "M", "only the endpoints of model M"},
    {NULL, NULL, NULL},
};

/* The text of one endpoint's row (cells of `cells`, each in bufs). */
static void row(const state_endpoint_info_t *e, const ops_endpoint_view_t *v,
                const ops_ramp_t *ramp, const ops_online_t *on, char bufs[][600],
                const char **cells)
{
    snprintf(bufs[0], 600, "%s", e->checkpoint_uid ? e->checkpoint_uid : "-");
    if (v->age_s >= 0)
        kiln_duration_format(v->age_s * 1000, bufs[1], 600);
    else
        snprintf(bufs[1], 600, "-");
    if (isnan(e->eval_logloss))
        snprintf(bufs[2], 600, "-");
    else
        snprintf(bufs[2], 600, "%.5f", e->eval_logloss);
    if (isnan(v->share))
        snprintf(bufs[3], 600, "-");
    else
        snprintf(bufs[3], 600, "%.1f%%", v->share * 100);
    snprintf(bufs[4], 600, "%lld ok, %lld failed, %lld pending, %lld held",
             (long long)e->pushes_succeeded, (long long)e->pushes_failed,
             (long long)e->pushes_pending, (long long)e->pushes_held);
    if (ramp != NULL)
        ops_ramp_describe(ramp, bufs[5], 600);
    else
        snprintf(bufs[5], 600, "-");
    ops_online_describe(on, bufs[6], 600);
    const char *fixed[] = {e->model, e->label, e->url};
    for (int i = 0; i < 3; i++)
        cells[i] = fixed[i];
    for (int i = 0; i < 7; i++)
        cells[3 + i] = bufs[i];
}

int cmd_endpoints(cli_t *cli)
{
    const char *model = cli_opt(cli, "model");
    state_t *st = NULL;
    int rc = state_open(cli->db_path, &st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    if (cli->json) {
        json_t *doc = NULL;
        rc = ops_endpoints_json(st, &doc);
        state_close(st);
        if (rc < 0)
            return cli_fail(rc, NULL);
        json_t *all = json_object_get(doc, "endpoints"), *e;
        for (size_t i = json_array_size(all); model != NULL && i-- > 0;)
            if ((e = json_array_get(all, i)) != NULL &&
                strcmp(json_string_value(json_object_get(e, "model")), model) != 0)
                json_array_remove(all, i);
        cli_print_json(doc);
        return CLI_EXIT_OK;
    }
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    ops_ramp_t *ramps = NULL;
    size_t nramps = 0;
    rc = state_endpoint_list(st, &es, &n);
    if (rc == 0 && ops_ramp_list(st, kiln_now_s(), &ramps, &nramps) < 0)
        nramps = 0;
    state_close(st);
    if (rc < 0)
        return cli_fail(rc, NULL);
    ops_online_t *on = ops_online_read(es, n, OPS_ONLINE_TIMEOUT_MS);
    static const char *const headers[] = {"MODEL",   "LABEL",   "URL",    "HOLDS", "AGE",
                                          "LOGLOSS", "TRAFFIC", "PUSHES", "RAMP",  "ONLINE"};
    cli_table_t *t = cli_table_create(10, headers);
    for (size_t i = 0; t != NULL && i < n; i++) {
        if (model != NULL && strcmp(es[i].model, model) != 0)
            continue;
        ops_endpoint_view_t v;
        ops_endpoint_view(es, n, i, &v);
        char bufs[7][600];
        const char *cells[10];
        row(&es[i], &v, ops_ramp_of(ramps, nramps, es[i].id), ops_online_at(on, i), bufs, cells);
        cli_table_add(t, cells);
    }
    cli_table_print(t);
    cli_table_destroy(t);
    free(on);
    free(ramps);
    state_endpoint_infos_free(es, n);
    return CLI_EXIT_OK;
}
