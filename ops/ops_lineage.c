/*
 * ops/ops_lineage.c - lineage, both ways, from wherever a person starts: an
 * input file, a run, a checkpoint or an endpoint URL. Back: the runs that
 * read the data (their retries, inputs, and the checkpoint each started
 * from, with its own past). Forward: the checkpoints the runs wrote and every
 * checkpoint derived from them (incrementals on top, and the checkpoints of
 * runs that started from them), each with its pushes, and the endpoints
 * that hold one of them now. The result is one JSON document (docs/cli.md,
 * "kiln lineage") that `kiln lineage` prints as text or as it is.
 */
#include "kiln_json.h"
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINEAGE_MAX 1000 /* nodes of each kind, and the depth of a walk back */

/* A set of ids in the order they were found. */
typedef struct ids {
    int64_t *v;
    size_t n, cap;
} ids_t;

static bool ids_has(const ids_t *s, int64_t id)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == id)
            return true;
    return false;
}

/* Adds id unless present or full; true when it was added. */
static bool ids_add(ids_t *s, int64_t id)
{
    if (id <= 0 || ids_has(s, id) || s->n >= LINEAGE_MAX)
        return false;
    if (kiln_grow((void **)&s->v, &s->cap, s->n, sizeof *s->v, 16) < 0)
        return false;
    s->v[s->n++] = id;
    return true;
}

typedef struct walk {
    state_t *st;
    ids_t runs, back_ckpts, fwd_ckpts, endpoints;
    json_t *inputs; /* object: path -> input */
} walk_t;

/* A checkpoint and, walking back, its parents and the run that wrote each. */
static void back_from_checkpoint(walk_t *w, int64_t id, int depth);

/* A run and, walking back, the runs it retries and the checkpoint it started from. */
static void back_from_run(walk_t *w, int64_t run_id, int depth)
{
    if (depth > LINEAGE_MAX || !ids_add(&w->runs, run_id))
        return;
    state_run_t r;
    if (state_run_get(w->st, run_id, &r) < 0)
        return;
    if (r.retry_of > 0)
        back_from_run(w, r.retry_of, depth + 1);
    if (r.start_checkpoint_id > 0)
        back_from_checkpoint(w, r.start_checkpoint_id, depth + 1);
    state_run_fini(&r);
}

static void back_from_checkpoint(walk_t *w, int64_t id, int depth)
{
    if (depth > LINEAGE_MAX || !ids_add(&w->back_ckpts, id))
        return;
    state_checkpoint_t c;
    if (state_checkpoint_get_by_id(w->st, id, &c) < 0)
        return;
    if (c.parent_id > 0)
        back_from_checkpoint(w, c.parent_id, depth + 1);
    if (c.run_id > 0)
        back_from_run(w, c.run_id, depth + 1);
    state_checkpoint_fini(&c);
}

/* A checkpoint and everything derived from it, forward. */
static void forward_from(walk_t *w, int64_t id)
{
    ids_add(&w->fwd_ckpts, id);
    state_checkpoint_t *cs = NULL;
    size_t n = 0;
    if (state_checkpoint_descendants(w->st, id, LINEAGE_MAX, &cs, &n) == 0)
        for (size_t i = 0; i < n; i++)
            ids_add(&w->fwd_ckpts, cs[i].id);
    state_checkpoints_free(cs, n);
}

static json_t *push_json(const state_push_t *p)
{
    return json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:i, s:o, s:s, s:o}", "id", (json_int_t)p->id,
                     "url", p->url, "model", p->model, "label", p->label, "state",
                     state_push_state_name(p->state), "mode", state_push_mode_name(p),
                     "http_status", p->http_status, "error", kiln_json_str(p->error), "reason",
                     p->reason ? p->reason : "", "created_at", kiln_json_time(p->created_at));
}

static json_t *checkpoint_json(walk_t *w, int64_t id, bool forward)
{
    state_checkpoint_t c;
    if (state_checkpoint_get_by_id(w->st, id, &c) < 0)
        return NULL;
    state_checkpoint_t p = {0};
    const char *parent = NULL;
    if (c.parent_id > 0 && state_checkpoint_get_by_id(w->st, c.parent_id, &p) == 0)
        parent = p.uid;
    json_t *o = json_pack(
        "{s:I, s:s, s:s, s:I, s:I, s:o, s:s?, s:s, s:o, s:o, s:b, s:o}", "id", (json_int_t)c.id,
        "uid", c.uid, "kind", c.kind, "step", (json_int_t)c.step, "keys", (json_int_t)c.keys,
        "run_id", c.run_id > 0 ? json_integer(c.run_id) : json_null(), "parent", parent, "path",
        c.path, "eval_logloss", kiln_json_num(c.eval_logloss), "created_at",
        kiln_json_time(c.created_at), "online", c.online, "pushes", json_array());
    if (forward && o != NULL) {
        state_push_filter_t f = {.checkpoint_id = id};
        state_push_t *ps = NULL;
        size_t n = 0;
        if (state_push_list(w->st, &f, STATE_PAGE_MAX, &ps, &n) == 0)
            ops_push_foresee(w->st, ps, n);
        for (size_t i = n; i-- > 0;) { /* oldest first */
            json_array_append_new(json_object_get(o, "pushes"), push_json(&ps[i]));
            ids_add(&w->endpoints, ps[i].endpoint_id);
        }
        state_pushes_free(ps, n);
    }
    state_checkpoint_fini(&p);
    state_checkpoint_fini(&c);
    return o;
}

static json_t *run_json(walk_t *w, int64_t id)
{
    state_run_t r;
    if (state_run_get(w->st, id, &r) < 0)
        return NULL;
    json_t *ins = json_array(), *cks = json_array();
    state_input_t *in = NULL;
    size_t nin = 0;
    if (state_input_list(w->st, id, &in, &nin) == 0)
        for (size_t i = 0; i < nin; i++) {
            json_array_append_new(ins, kiln_json_str(in[i].path));
            json_t *known = json_object_get(w->inputs, in[i].path);
            if (known == NULL) {
                known = json_pack("{s:s, s:I, s:o, s:s?, s:[]}", "path", in[i].path, "size",
                                  (json_int_t)in[i].size, "mtime", kiln_json_time(in[i].mtime),
                                  "checksum", in[i].checksum, "runs");
                json_object_set_new(w->inputs, in[i].path, known);
            }
            json_array_append_new(json_object_get(known, "runs"), json_integer(id));
        }
    state_inputs_free(in, nin);
    state_checkpoint_t *cs = NULL;
    size_t nc = 0;
    if (state_checkpoint_list_by_run(w->st, id, &cs, &nc) == 0)
        for (size_t i = 0; i < nc; i++)
            json_array_append_new(cks, json_string(cs[i].uid));
    state_checkpoints_free(cs, nc);
    state_checkpoint_t start = {0};
    const char *started_from = NULL;
    if (r.start_checkpoint_id > 0 &&
        state_checkpoint_get_by_id(w->st, r.start_checkpoint_id, &start) == 0)
        started_from = start.uid;
    json_t *o = json_pack("{s:I, s:s, s:i, s:s, s:s, s:i, s:o, s:o, s:o, s:s?, s:o, s:o}", "id",
                          (json_int_t)r.id, "job", r.job_name, "job_version", r.job_version,
                          "state", state_run_state_name(r.state), "trigger",
                          state_trigger_name(r.trigger), "attempt", r.attempt, "started_at",
                          kiln_json_time(r.started_at), "ended_at", kiln_json_time(r.ended_at),
                          "retry_of", r.retry_of > 0 ? json_integer(r.retry_of) : json_null(),
                          "started_from", started_from, "inputs", ins, "checkpoints", cks);
    state_checkpoint_fini(&start);
    state_run_fini(&r);
    return o;
}

/* Every endpoint that one of the forward checkpoints reached, with what it
 * holds now and whether that is in this lineage. */
static json_t *endpoints_json(walk_t *w)
{
    json_t *arr = json_array();
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    if (state_endpoint_list(w->st, &es, &n) < 0)
        return arr;
    for (size_t i = 0; i < n; i++) {
        if (!ids_has(&w->endpoints, es[i].id))
            continue;
        bool serves = es[i].checkpoint_id > 0 && ids_has(&w->fwd_ckpts, es[i].checkpoint_id);
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:s, s:s, s:s?, s:o, s:b}", "id", (json_int_t)es[i].id,
                           "url", es[i].url, "model", es[i].model, "label", es[i].label, "holds",
                           es[i].checkpoint_uid, "since", kiln_json_time(es[i].since),
                           "serves_this_lineage", serves));
    }
    state_endpoint_infos_free(es, n);
    return arr;
}

static bool all_digits(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return false;
    return true;
}

/* The starting points of what: runs and checkpoints to walk from. */
static int seed(walk_t *w, const char *what, ids_t *runs, ids_t *ckpts, const char **kind)
{
    if (all_digits(what)) {
        *kind = "run";
        state_run_t r;
        KILN_CHECK(state_run_get(w->st, strtoll(what, NULL, 10), &r));
        ids_add(runs, r.id);
        state_run_fini(&r);
        return 0;
    }
    if (strncmp(what, "http://", 7) == 0 || strncmp(what, "https://", 8) == 0) {
        *kind = "endpoint";
        state_endpoint_info_t *es = NULL;
        size_t n = 0, found = 0;
        KILN_CHECK(state_endpoint_list(w->st, &es, &n));
        size_t wl = strlen(what);
        while (wl > 0 && what[wl - 1] == '/')
            wl--; /* http://h:p/ is http://h:p */
        for (size_t i = 0; i < n; i++) {
            if (strncmp(es[i].url, what, wl) != 0 || (es[i].url[wl] != '\0' && es[i].url[wl] != '/'))
                continue;
            found++;
            ids_add(&w->endpoints, es[i].id);
            ids_add(ckpts, es[i].checkpoint_id);
        }
        state_endpoint_infos_free(es, n);
        if (found == 0)
            return kiln_errf(KILN_ENOENT, "no endpoint %s is recorded (see kiln lineage's help)",
                             what);
        return 0;
    }
    state_checkpoint_t c;
    if (state_checkpoint_get(w->st, what, &c) == 0) {
        *kind = "checkpoint";
        ids_add(ckpts, c.id);
        state_checkpoint_fini(&c);
        return 0;
    }
    kiln_errclear();
    *kind = "input";
    /* A file: the runs that read it, by its path as recorded (absolute). */
    char *real = realpath(what, NULL);
    int64_t *rs = NULL;
    size_t nr = 0;
    int rc = state_input_runs(w->st, real != NULL ? real : what, STATE_PAGE_MAX, &rs, &nr);
    if (rc == 0 && nr == 0 && real != NULL)
        rc = state_input_runs(w->st, what, STATE_PAGE_MAX, &rs, &nr);
    for (size_t i = 0; rc == 0 && i < nr; i++)
        ids_add(runs, rs[i]);
    free(rs);
    free(real);
    KILN_CHECK(rc);
    if (runs->n == 0)
        return kiln_errf(KILN_ENOENT,
                         "%s is not a run number, a checkpoint uid, an endpoint URL or a file "
                         "any run read",
                         what);
    return 0;
}

int ops_lineage(state_t *st, const char *what, json_t **out)
{
    walk_t w = {.st = st, .inputs = json_object()};
    ids_t runs = {0}, ckpts = {0};
    const char *kind = "";
    int rc = seed(&w, what, &runs, &ckpts, &kind);
    if (rc < 0)
        goto out;
    /* Back, from the seeds. */
    for (size_t i = 0; i < runs.n; i++)
        back_from_run(&w, runs.v[i], 0);
    for (size_t i = 0; i < ckpts.n; i++)
        back_from_checkpoint(&w, ckpts.v[i], 0);
    /* Forward: the seeds' checkpoints (a run's own) and what derives from them. */
    for (size_t i = 0; i < ckpts.n; i++)
        forward_from(&w, ckpts.v[i]);
    for (size_t i = 0; i < runs.n; i++) {
        state_checkpoint_t *cs = NULL;
        size_t n = 0;
        if (state_checkpoint_list_by_run(st, runs.v[i], &cs, &n) == 0)
            for (size_t k = 0; k < n; k++)
                forward_from(&w, cs[k].id);
        state_checkpoints_free(cs, n);
    }
    json_t *jruns = json_array(), *back = json_array(), *fwd = json_array();
    for (size_t i = 0; i < w.runs.n; i++) {
        json_t *r = run_json(&w, w.runs.v[i]);
        if (r != NULL)
            json_array_append_new(jruns, r);
    }
    for (size_t i = 0; i < w.back_ckpts.n; i++) {
        if (ids_has(&w.fwd_ckpts, w.back_ckpts.v[i]))
            continue; /* shown forward, with its pushes */
        json_t *c = checkpoint_json(&w, w.back_ckpts.v[i], false);
        if (c != NULL)
            json_array_append_new(back, c);
    }
    for (size_t i = 0; i < w.fwd_ckpts.n; i++) {
        json_t *c = checkpoint_json(&w, w.fwd_ckpts.v[i], true);
        if (c != NULL)
            json_array_append_new(fwd, c);
    }
    json_t *ins = json_array();
    const char *key;
    json_t *v;
    json_object_foreach(w.inputs, key, v)
        json_array_append(ins, v);
    *out = json_pack("{s:{s:s, s:s}, s:o, s:o, s:o, s:o, s:o}", "from", "kind", kind, "ref", what,
                     "inputs", ins, "runs", jruns, "earlier_checkpoints", back, "checkpoints",
                     fwd, "endpoints", endpoints_json(&w));
    if (*out == NULL)
        rc = KILN_ENOMEM;
out:
    json_decref(w.inputs);
    KILN_FREE_ALL(w.runs.v, w.back_ckpts.v, w.fwd_ckpts.v, w.endpoints.v, runs.v, ckpts.v);
    return rc;
}
