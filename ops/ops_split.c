/*
 * ops/ops_split.c - a model's traffic split, for `kiln split` and the
 * endpoints page: the kiln-serves that serve the model's endpoints (one
 * request per distinct URL, since a kiln-serve holds the split of each model
 * once for all its labels), each set or read with serve_split_call. The
 * split itself lives in each kiln-serve (its state directory), not here.
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"

#define SPLIT_TIMEOUT_MS 10000

void ops_split_report_fini(ops_split_report_t *rep)
{
    kiln_strv_free(rep->urls, rep->n);
    free(rep->results);
    memset(rep, 0, sizeof *rep);
}

/* The push.token_env of the first job whose spec pushes to model, into var
 * (cap); var unchanged when none does. */
static void job_token_env(state_t *st, const char *model, char *var, size_t cap)
{
    state_job_t *js = NULL;
    size_t n = 0;
    if (state_job_list(st, &js, &n) < 0)
        return;
    bool found = false;
    for (size_t i = 0; i < n && !found; i++) {
        job_spec_t spec;
        if (job_spec_parse(js[i].spec_yaml, strlen(js[i].spec_yaml), js[i].name, &spec, NULL) < 0)
            continue;
        for (int k = 0; k < spec.push.nendpoints && !found; k++)
            if (strcmp(spec.push.endpoints[k].model, model) == 0 && spec.push.token_env != NULL) {
                snprintf(var, cap, "%s", spec.push.token_env);
                found = true;
            }
        job_spec_fini(&spec);
    }
    state_jobs_free(js, n);
}

/* The distinct URLs of model's endpoints into rep->urls. */
static int model_urls(state_t *st, const char *model, ops_split_report_t *rep)
{
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    KILN_CHECK(state_endpoint_list(st, &es, &n));
    int rc = 0;
    rep->urls = kiln_calloc(n + 1, sizeof *rep->urls);
    for (size_t i = 0; rep->urls != NULL && i < n && rc == 0; i++) {
        bool seen = strcmp(es[i].model, model) != 0;
        for (size_t k = 0; k < rep->n && !seen; k++)
            seen = strcmp(rep->urls[k], es[i].url) == 0;
        if (!seen && (rep->urls[rep->n] = kiln_strdup(es[i].url)) == NULL)
            rc = KILN_ENOMEM;
        else if (!seen)
            rep->n++;
    }
    if (rep->urls == NULL)
        rc = KILN_ENOMEM;
    state_endpoint_infos_free(es, n);
    if (rc == 0 && rep->n == 0)
        rc = kiln_errf(KILN_ENOENT, "no endpoint serves model %s; list it in a job's "
                                    "push.endpoints and submit the job",
                       model);
    return rc;
}

int ops_split(state_t *st, const char *model, const char *split, const char *token_env,
              ops_split_report_t *rep)
{
    memset(rep, 0, sizeof *rep);
    KILN_CHECK(model_urls(st, model, rep));
    rep->results = kiln_calloc(rep->n, sizeof *rep->results);
    if (rep->results == NULL)
        return KILN_ENOMEM;
    char var[128] = "KILN_SERVE_TOKEN";
    if (token_env != NULL)
        snprintf(var, sizeof var, "%s", token_env);
    else
        job_token_env(st, model, var, sizeof var);
    const char *token = getenv(var);
    if (split != NULL && token == NULL)
        return kiln_errf(KILN_EUSAGE, "setting a split needs kiln-serve's token in $%s (the "
                                      "push.token_env of the model's job, or --token-env)",
                         var);
    int rc = 0;
    for (size_t i = 0; i < rep->n; i++) {
        int r = serve_split_call(rep->urls[i], token, model, split, SPLIT_TIMEOUT_MS,
                                 &rep->results[i]);
        if (r < 0 && rc == 0)
            rc = r;
    }
    if (rc < 0) /* the first failure's message, not a later call's */
        for (size_t i = 0; i < rep->n; i++)
            if (rep->results[i].error[0] != '\0')
                return kiln_errf(rc, "%s", rep->results[i].error);
    return rc;
}
