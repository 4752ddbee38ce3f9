/*
 * ops/ops_ramp.c - push.ramp: the traffic share of a job's challenger label
 * (each endpoint with auto: true) grows in steps, from the push that first
 * lands on it, up to the ramp's most; a held push (the quality gate) or a
 * failed one stops the ramp and sets the label back to 0 %, and the next
 * push that lands after that starts it again from its first step.
 *
 * Where a ramp stands is computed from the push queue's records (the
 * endpoint's pushes, newest first), never stored: kilnd, a restarted kilnd,
 * `kiln split` and the endpoints page all read the same answer. kilnd then
 * makes each kiln-serve's split agree with it (ops_ramp_apply): the label
 * gets its share, the model's other labels keep their proportions in the
 * rest.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_json.h"
#include "ops.h"

#define RAMP_TIMEOUT_MS 5000
/* The label's weight is its share in hundredths of a percent, so that the
 * other labels keep their proportions to 1 part in 10000. */
#define RAMP_SCALE 100

/* Where the ramp of endpoint r->endpoint_id stands at now (Unix s), from
 * its pushes: the newest held or failed push that no landed push follows
 * stops it; else it counts from the first push that landed after the
 * newest stop. */
static int ramp_stand(state_t *st, int64_t now, ops_ramp_t *r)
{
    state_push_filter_t f = {.endpoint_id = r->endpoint_id};
    state_push_t *ps = NULL;
    size_t n = 0;
    KILN_CHECK(state_push_list(st, &f, STATE_PAGE_MAX, &ps, &n));
    for (size_t i = 0; i < n; i++) { /* newest first */
        const state_push_t *p = &ps[i];
        if (p->state == STATE_PUSH_SUCCEEDED) {
            r->since = p->ended_at;
        } else if (p->state == STATE_PUSH_HELD || p->state == STATE_PUSH_FAILED) {
            if (r->since == 0) {
                r->stopped = true;
                snprintf(r->why, sizeof r->why, "push %lld of %s %s: %s", (long long)p->id,
                         p->checkpoint_uid,
                         p->state == STATE_PUSH_HELD ? "was held back" : "failed",
                         p->error ? p->error : "(no reason recorded)");
            }
            break;
        }
    }
    state_pushes_free(ps, n);
    if (r->since > 0 && !r->stopped) {
        int64_t every = r->every_ms / 1000 > 0 ? r->every_ms / 1000 : 1;
        int64_t steps = 1 + (now > r->since ? (now - r->since) / every : 0);
        r->share = steps * r->step >= r->max ? r->max : (int)(steps * r->step);
        r->next_at = r->share < r->max ? r->since + steps * every : 0;
    }
    return 0;
}

int ops_ramp_list(state_t *st, int64_t now, ops_ramp_t **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    state_job_t *js = NULL;
    state_endpoint_info_t *es = NULL;
    size_t nj = 0, ne = 0, n = 0, cap = 0;
    ops_ramp_t *rs = NULL;
    int rc = state_job_list(st, &js, &nj);
    if (rc == 0)
        rc = state_endpoint_list(st, &es, &ne);
    for (size_t i = 0; rc == 0 && i < nj; i++) {
        job_spec_t spec;
        /* kilnd asks every second: a spec that cannot have a ramp is not parsed */
        if (strstr(js[i].spec_yaml, "ramp") == NULL ||
            job_spec_parse(js[i].spec_yaml, strlen(js[i].spec_yaml), js[i].name, &spec, NULL) < 0)
            continue;
        for (int k = 0; rc == 0 && spec.push.ramp_step > 0 && k < spec.push.nendpoints; k++) {
            const job_endpoint_t *e = &spec.push.endpoints[k];
            for (size_t x = 0; rc == 0 && e->auto_push && x < ne; x++) {
                if (strcmp(es[x].url, e->url) != 0 || strcmp(es[x].model, e->model) != 0 ||
                    strcmp(es[x].label, e->label) != 0)
                    continue;
                if (n == cap) {
                    cap = cap ? 2 * cap : 8;
                    ops_ramp_t *g = realloc(rs, cap * sizeof *rs);
                    if (g == NULL) {
                        rc = KILN_ENOMEM;
                        break;
                    }
                    rs = g;
                }
                ops_ramp_t *r = &rs[n++];
                memset(r, 0, sizeof *r);
                r->job_id = js[i].id;
                r->endpoint_id = es[x].id;
                snprintf(r->job, sizeof r->job, "%s", js[i].name);
                snprintf(r->url, sizeof r->url, "%s", e->url);
                snprintf(r->model, sizeof r->model, "%s", e->model);
                snprintf(r->label, sizeof r->label, "%s", e->label);
                snprintf(r->token_env, sizeof r->token_env, "%s",
                         spec.push.token_env ? spec.push.token_env : "KILN_SERVE_TOKEN");
                r->step = spec.push.ramp_step;
                r->max = spec.push.ramp_max;
                r->every_ms = spec.push.ramp_every_ms;
                rc = ramp_stand(st, now, r);
            }
        }
        job_spec_fini(&spec);
    }
    state_jobs_free(js, nj);
    state_endpoint_infos_free(es, ne);
    if (rc < 0) {
        free(rs);
        return rc;
    }
    *out = rs;
    *nout = n;
    return 0;
}

void ops_ramp_describe(const ops_ramp_t *r, char *buf, size_t cap)
{
    char every[32];
    kiln_duration_format(r->every_ms, every, sizeof every);
    if (r->stopped)
        snprintf(buf, cap, "ramp %d%%/%s to %d%% stopped at 0%%: %s", r->step, every, r->max,
                 r->why);
    else if (r->since == 0)
        snprintf(buf, cap, "ramp %d%%/%s to %d%%: starts when a push lands", r->step, every,
                 r->max);
    else if (r->next_at == 0)
        snprintf(buf, cap, "ramp %d%%/%s to %d%%: done, at %d%%", r->step, every, r->max,
                 r->share);
    else
        snprintf(buf, cap, "ramp %d%%/%s to %d%%: at %d%%, next step in %llds", r->step, every,
                 r->max, r->share, (long long)(r->next_at - kiln_now_s()));
}

/* Whether the split entry at p, whose '=' is at eq, is label's. */
static bool entry_is(const char *p, const char *eq, const char *label)
{
    size_t k = (size_t)(eq - p);
    return k == strlen(label) && strncmp(p, label, k) == 0;
}

/* The weight of label in split "A=90,B=10" (into *mine) and the sum of the
 * other labels' weights (returned). */
static long weights(const char *split, const char *label, long *mine)
{
    long others = 0;
    *mine = 0;
    for (const char *p = split; *p;) {
        const char *comma = strchr(p, ','), *eq = strchr(p, '=');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (eq != NULL && eq < p + len) {
            long w = strtol(eq + 1, NULL, 10);
            if (entry_is(p, eq, label))
                *mine = w;
            else
                others += w;
        }
        p += len + (comma != NULL);
    }
    return others;
}

/* Whether a split whose label has weight mine against others gives it
 * share percent (0 and "all" are exact; a share between within half a
 * point). */
static bool split_gives(long mine, long others, int share)
{
    if (share == 0 || others == 0)
        return (mine > 0) == (share > 0);
    return fabs(100.0 * (double)mine / (double)(mine + others) - share) < 0.5;
}

/* The split that gives label share percent and the other labels of split
 * the rest, in their proportions, into buf. */
static void reweigh(const char *split, const char *label, int share, long others, char *buf,
                    size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    if (share > 0)
        n += (size_t)snprintf(buf, cap, "%s=%d", label, share * RAMP_SCALE);
    for (const char *p = split; *p && n < cap;) {
        const char *comma = strchr(p, ','), *eq = strchr(p, '=');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (eq != NULL && eq < p + len && !entry_is(p, eq, label)) {
            long w = strtol(eq + 1, NULL, 10);
            /* share 0: the others keep their weights as they are */
            long nw = share == 0 ? w
                                 : (long)llround((double)w * (100 - share) * RAMP_SCALE /
                                                 (double)others);
            if (w > 0 && share < 100)
                n += (size_t)snprintf(buf + n, cap - n, "%s%.*s=%ld", n ? "," : "",
                                      (int)(eq - p), p, nw > 0 ? nw : 1);
        }
        p += len + (comma != NULL);
    }
}

int ops_ramp_apply(const ops_ramp_t *r, int *was /* OUT */)
{
    *was = -1;
    serve_split_result_t res;
    if (serve_split_call(r->url, NULL, r->model, NULL, RAMP_TIMEOUT_MS, &res) < 0)
        return kiln_errf(KILN_EHTTP, "the ramp of %s/%s cannot read the split: %s", r->model,
                         r->label, res.error);
    long mine = 0, others = weights(res.split, r->label, &mine);
    if (split_gives(mine, others, r->share))
        return 0;
    *was = mine + others > 0 ? (int)lround(100.0 * (double)mine / (double)(mine + others)) : 0;
    const char *token = getenv(r->token_env);
    if (token == NULL)
        return kiln_errf(KILN_EAUTH, "the ramp of %s/%s on %s cannot set its split: $%s (the "
                                     "job's push.token_env) is not set in kilnd's environment",
                         r->model, r->label, r->url, r->token_env);
    char split[sizeof res.split + 32];
    reweigh(res.split, r->label, r->share, others, split, sizeof split);
    if (split[0] == '\0') /* no label left with traffic: the label alone, at 0 */
        snprintf(split, sizeof split, "%s=0", r->label);
    if (serve_split_call(r->url, token, r->model, split, RAMP_TIMEOUT_MS, &res) < 0)
        return kiln_errf(KILN_EHTTP, "the ramp of %s/%s cannot set the split %s: %s", r->model,
                         r->label, split, res.error);
    return 1;
}

const ops_ramp_t *ops_ramp_of(const ops_ramp_t *ramps, size_t n, int64_t endpoint_id)
{
    for (size_t i = 0; i < n; i++)
        if (ramps[i].endpoint_id == endpoint_id)
            return &ramps[i];
    return NULL;
}

json_t *ops_ramp_json(const ops_ramp_t *r)
{
    char what[900];
    ops_ramp_describe(r, what, sizeof what);
    return json_pack("{s:s, s:s, s:s, s:s, s:i, s:I, s:i, s:i, s:b, s:o, s:o, s:o, s:s}", "job",
                     r->job, "url", r->url, "model", r->model, "label", r->label, "step", r->step,
                     "every_ms", (json_int_t)r->every_ms, "max", r->max, "share", r->share,
                     "stopped", r->stopped, "since", kiln_json_time(r->since), "next_at",
                     kiln_json_time(r->next_at), "why",
                     r->stopped ? json_string(r->why) : json_null(), "text", what);
}
