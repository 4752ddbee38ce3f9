/*
 * serving/serve_split.c - which label a predict without ?label= goes to:
 * each model's traffic split (LABEL=WEIGHT,...), set at run time through
 * PUT /v1/models/M/split and kept in <state_dir>/splits.json, or else
 * kiln-serve's --split. A request picks a label of the split by weight, by
 * a hash of its request key (sticky), among the labels held.
 *
 * A label that no split names gets no traffic: a challenger pushed to a
 * new label serves nobody until a person (kiln split, the endpoints page)
 * gives it a share, or the push that creates it carries one (Kiln-Traffic,
 * from the job spec's push.endpoints[].traffic); a restart does not change
 * who serves what.
 *
 * splits.json is {"<model>": "A=90,B=10", ...}, replaced atomically (write
 * temp, fsync, rename) under the store's write lock before the new split is
 * in force.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "serve_store_int.h"

int sv_split_parse(const char *text, bool zero_ok, sv_split_t *out)
{
    const char *what = zero_ok ? "split" : "--split";
    memset(out, 0, sizeof *out);
    const char *p = text;
    if (*p == '\0')
        return kiln_errf(KILN_EINVAL, "%s is empty; it wants LABEL=WEIGHT,... (e.g. A=90,B=10)",
                         what);
    char seen[SV_MAX_SPLIT][SERVE_NAME_MAX];
    int nseen = 0;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq == NULL || eq == p)
            return kiln_errf(KILN_EINVAL, "%s wants LABEL=WEIGHT,... (e.g. A=90,B=10); "
                                          "'%.*s' in '%s' is not one",
                             what, (int)len, p, text);
        if (nseen == SV_MAX_SPLIT)
            return kiln_errf(KILN_EINVAL, "%s '%s' names more than %d labels", what, text,
                             SV_MAX_SPLIT);
        char label[SERVE_NAME_MAX + 1], why[256];
        snprintf(label, sizeof label, "%.*s", (int)(eq - p), p);
        if (serve_name_check(label, why, sizeof why) < 0)
            return kiln_errf(KILN_EINVAL, "%s: bad label in '%s': %s", what, text, why);
        for (int i = 0; i < nseen; i++)
            if (strcmp(seen[i], label) == 0)
                return kiln_errf(KILN_EINVAL, "%s: label %s appears twice in '%s'", what, label,
                                 text);
        snprintf(seen[nseen++], SERVE_NAME_MAX, "%.63s", label);
        char *end;
        errno = 0;
        long w = strtol(eq + 1, &end, 10);
        if (end != p + len || end == eq + 1 || errno != 0 || w < (zero_ok ? 0 : 1) ||
            w > SV_MAX_WEIGHT)
            return kiln_errf(KILN_EINVAL, "%s: the weight of %s in '%s' must be a whole "
                                          "number from %d to %d%s",
                             what, label, text, zero_ok ? 0 : 1, SV_MAX_WEIGHT,
                             zero_ok ? " (0: no traffic)"
                                     : " (leave a label out to give it no traffic)");
        if (w > 0) {
            snprintf(out->label[out->n], SERVE_NAME_MAX, "%.63s", label);
            out->weight[out->n++] = (int)w;
        }
        if (comma == NULL)
            return 0;
        p = comma + 1;
    }
}

void sv_split_format(const sv_split_t *split, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < split->n && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s=%d", i ? "," : "", split->label[i],
                              split->weight[i]);
}

void sv_store_set_split(sv_store_t *s, const sv_split_t *split)
{
    s->split = *split;
}

/* model's own split, or NULL. */
static sv_model_split_t *own_split(const sv_store_t *s, const char *model)
{
    for (int i = 0; i < s->nsplits; i++)
        if (strcmp(s->splits[i].model, model) == 0)
            return (sv_model_split_t *)&s->splits[i];
    return NULL;
}

/* The split in force for model: its own, else --split's. */
static const sv_split_t *split_of(const sv_store_t *s, const char *model)
{
    const sv_model_split_t *m = own_split(s, model);
    return m != NULL ? &m->split : &s->split;
}

static char *splits_path(const sv_store_t *s)
{
    return kiln_asprintf("%s/splits.json", s->dir);
}

int sv_split_load(sv_store_t *s)
{
    char *path = splits_path(s);
    if (path == NULL)
        return KILN_ENOMEM;
    json_error_t err;
    json_t *doc = access(path, F_OK) == 0 ? json_load_file(path, 0, &err) : NULL;
    if (doc == NULL) { /* none yet, or unreadable: no model has a split of its own */
        if (access(path, F_OK) == 0)
            KILN_ERROR("%s cannot be read (%s, line %d); every model has --split's split until "
                       "one is set again",
                       path, err.text, err.line);
        free(path);
        return 0;
    }
    const char *model;
    json_t *v;
    json_object_foreach(doc, model, v)
    {
        sv_model_split_t *m = &s->splits[s->nsplits];
        const char *text = json_string_value(v);
        if (s->nsplits == MAX_SPLITS || serve_name_check(model, NULL, 0) < 0 || text == NULL ||
            (text[0] != '\0' && sv_split_parse(text, true, &m->split) < 0)) {
            KILN_ERROR("%s: the split of model '%.63s' is not used: %s", path, model,
                       text == NULL ? "not a string" : kiln_errmsg());
            continue;
        }
        if (text[0] == '\0')
            memset(&m->split, 0, sizeof m->split);
        snprintf(m->model, sizeof m->model, "%s", model);
        s->nsplits++;
    }
    json_decref(doc);
    free(path);
    return 0;
}

/* Writes every model's own split to splits.json. */
static int persist(const sv_store_t *s)
{
    json_t *doc = json_object();
    for (int i = 0; doc != NULL && i < s->nsplits; i++) {
        char text[SV_MAX_SPLIT * (SERVE_NAME_MAX + 12)];
        sv_split_format(&s->splits[i].split, text, sizeof text);
        json_object_set_new(doc, s->splits[i].model, json_string(text));
    }
    char *body = doc ? json_dumps(doc, JSON_INDENT(1)) : NULL;
    char *path = splits_path(s);
    json_decref(doc);
    int rc = body == NULL || path == NULL ? KILN_ENOMEM
                                          : kiln_write_atomic(path, body, strlen(body));
    if (rc < 0 && rc != KILN_ENOMEM)
        rc = kiln_errf(KILN_EIO, "the split cannot be kept, so it is not set: %s", kiln_errmsg());
    free(body);
    free(path);
    return rc;
}

/* Under the write lock: sv_split_set. */
static int set_locked(sv_store_t *s, const char *model, const sv_split_t *split)
{
    int rc = 0;
    sv_model_split_t *m = own_split(s, model);
    sv_model_split_t old;
    memset(&old, 0, sizeof old);
    if (m != NULL)
        old = *m;
    if (m == NULL && s->nsplits == MAX_SPLITS) {
        rc = kiln_errf(KILN_ERANGE, "this kiln-serve keeps the splits of %d models at most",
                       MAX_SPLITS);
        goto out;
    }
    bool added = m == NULL;
    if (added) {
        m = &s->splits[s->nsplits++];
        snprintf(m->model, sizeof m->model, "%s", model);
    }
    m->split = *split;
    rc = persist(s);
    if (rc < 0) { /* not kept: not in force either */
        if (added)
            s->nsplits--;
        else
            *m = old;
        goto out;
    }
    char text[SV_MAX_SPLIT * (SERVE_NAME_MAX + 12)];
    sv_split_format(split, text, sizeof text);
    KILN_INFO("split of %s set to '%s'", model, text);
out:
    return rc;
}

int sv_split_set(sv_store_t *s, const char *model, const sv_split_t *split)
{
    pthread_rwlock_wrlock(&s->lock);
    int rc = set_locked(s, model, split);
    pthread_rwlock_unlock(&s->lock);
    return rc;
}

void sv_split_grant_locked(sv_store_t *s, const char *model, const char *label, int weight)
{
    sv_split_t sp = *split_of(s, model);
    for (int i = 0; i < sp.n; i++)
        if (strcmp(sp.label[i], label) == 0)
            return; /* a split already says what it gets */
    if (sp.n == SV_MAX_SPLIT) {
        KILN_WARN("%s/%s gets no traffic: the split of %s names %d labels already", model, label,
                  model, SV_MAX_SPLIT);
        return;
    }
    snprintf(sp.label[sp.n], SERVE_NAME_MAX, "%s", label);
    sp.weight[sp.n++] = weight;
    if (set_locked(s, model, &sp) < 0)
        KILN_WARN("%s/%s gets no traffic: %s", model, label, kiln_errmsg());
}

bool sv_model_held(const sv_store_t *s, const char *model)
{
    for (int i = 0; i < s->nv; i++)
        if (strcmp(s->v[i]->model, model) == 0)
            return true;
    return false;
}

void sv_split_get(sv_store_t *s, const char *model, sv_split_info_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_rwlock_rdlock(&s->lock);
    out->split = *split_of(s, model);
    out->source = own_split(s, model) ? "api" : s->split.n > 0 ? "--split" : "none";
    for (int i = 0; i < out->split.n; i++)
        out->held[i] = sv_version_find(s, model, out->split.label[i]) != NULL;
    for (int i = 0; i < s->nv && out->nidle < SV_MAX_SPLIT; i++) {
        if (strcmp(s->v[i]->model, model) != 0)
            continue;
        bool named = false;
        for (int k = 0; k < out->split.n && !named; k++)
            named = strcmp(out->split.label[k], s->v[i]->label) == 0;
        if (!named)
            snprintf(out->idle[out->nidle++], SERVE_NAME_MAX, "%s", s->v[i]->label);
    }
    pthread_rwlock_unlock(&s->lock);
}

const sv_version_t *sv_split_choose(const sv_store_t *s, const char *model, const char *key)
{
    const sv_split_t *sp = split_of(s, model);
    const sv_version_t *cand[SV_MAX_SPLIT];
    int w[SV_MAX_SPLIT], n = 0, total = 0;
    for (int i = 0; i < sp->n; i++) {
        const sv_version_t *v = sv_version_find(s, model, sp->label[i]);
        if (v != NULL && sp->weight[i] > 0) {
            cand[n] = v;
            w[n] = sp->weight[i];
            total += w[n++];
        }
    }
    if (n == 0)
        return NULL;
    static _Thread_local uint64_t anon;
    uint64_t h = key != NULL && key[0] ? kiln_xxh64(key, strlen(key), 0x73706c6974)
                                       : kiln_xxh64(&anon, sizeof anon, (uint64_t)kiln_mono_ns());
    anon++;
    int64_t r = (int64_t)(h % (uint64_t)total);
    for (int i = 0; i < n; i++) {
        if (r < w[i])
            return cand[i];
        r -= w[i];
    }
    return cand[n - 1];
}
