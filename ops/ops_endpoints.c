/*
 * ops/ops_endpoints.c - the serving endpoints as people read them: what
 * each holds and since when, its share of the model's predict traffic (from
 * the stats kilnd reads), its pushes and its ramp (push.ramp). One reading
 * behind `kiln endpoints`, the endpoints page and /api/endpoints.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_json.h"
#include "ops.h"

void ops_endpoint_view(const state_endpoint_info_t *es, size_t n, size_t i,
                       ops_endpoint_view_t *out)
{
    const state_endpoint_info_t *e = &es[i];
    out->age_s = e->checkpoint_id > 0 && e->checkpoint_created_at > 0
                     ? kiln_now_s() - e->checkpoint_created_at
                     : -1;
    double rate_sum = 0, req_sum = 0;
    bool rates = true;
    for (size_t k = 0; k < n; k++) {
        if (strcmp(es[k].url, e->url) != 0 || strcmp(es[k].model, e->model) != 0 ||
            es[k].stats_at <= 0)
            continue;
        rates &= !isnan(es[k].request_rate);
        rate_sum += isnan(es[k].request_rate) ? 0 : es[k].request_rate;
        req_sum += (double)es[k].predict_requests;
    }
    if (e->stats_at <= 0)
        out->share = NAN;
    else if (rates && rate_sum > 0)
        out->share = e->request_rate / rate_sum;
    else
        out->share = req_sum > 0 ? (double)e->predict_requests / req_sum : NAN;
}

int ops_endpoints_json(state_t *st, json_t **out)
{
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    KILN_CHECK(state_endpoint_list(st, &es, &n));
    ops_ramp_t *ramps = NULL;
    size_t nramps = 0;
    if (ops_ramp_list(st, kiln_now_s(), &ramps, &nramps) < 0)
        nramps = 0;
    ops_online_t *on = ops_online_read(es, n, OPS_ONLINE_TIMEOUT_MS);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const state_endpoint_info_t *e = &es[i];
        ops_endpoint_view_t v;
        ops_endpoint_view(es, n, i, &v);
        const ops_ramp_t *ramp = ops_ramp_of(ramps, nramps, e->id);
        json_t *holds =
            e->checkpoint_id > 0
                ? json_pack("{s:I, s:o, s:o, s:o, s:o, s:o}", "checkpoint_id",
                            (json_int_t)e->checkpoint_id, "uid", kiln_json_str(e->checkpoint_uid),
                            "since", kiln_json_time(e->since), "age_s",
                            v.age_s >= 0 ? json_integer(v.age_s) : json_null(), "eval_logloss",
                            kiln_json_num(e->eval_logloss), "eval_auc", kiln_json_num(e->eval_auc))
                : json_null();
        json_t *traffic = json_pack(
            "{s:o, s:I, s:I, s:o, s:o, s:o}", "share", kiln_json_num(v.share), "predict_requests",
            (json_int_t)e->predict_requests, "predict_rows", (json_int_t)e->predict_rows,
            "request_rate", kiln_json_num(e->request_rate), "read_at", kiln_json_time(e->stats_at),
            "error", kiln_json_str(e->stats_error));
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:o, s:o, s:o, s:o, s:{s:I, s:I, s:I, s:I}, s:o, s:o, "
                           "s:o, s:o, s:o}",
                           "id", (json_int_t)e->id, "url", e->url, "model", kiln_json_str(e->model),
                           "label", kiln_json_str(e->label), "holds", holds, "traffic", traffic,
                           "pushes", "succeeded", (json_int_t)e->pushes_succeeded, "failed",
                           (json_int_t)e->pushes_failed, "pending", (json_int_t)e->pushes_pending,
                           "held", (json_int_t)e->pushes_held, "last_push_at",
                           kiln_json_time(e->last_push_at), "last_error",
                           kiln_json_str(e->last_error), "last_http_status",
                           e->last_http_status ? json_integer(e->last_http_status) : json_null(),
                           "ramp", ramp ? ops_ramp_json(ramp) : json_null(), "online",
                           ops_online_json(ops_online_at(on, i))));
    }
    free(on);
    free(ramps);
    state_endpoint_infos_free(es, n);
    *out = json_pack("{s:o}", "endpoints", arr);
    return *out != NULL ? 0 : KILN_ENOMEM;
}

