/*
 * serving/serve_logmodel.c - a model's loop state, made when its first
 * impression is written, or at start from what an earlier kiln-serve left in
 * --impressions-dir/<model>/: every segment read back into the index (its
 * rows, times and size; a torn last line skipped), the feedback files
 * replayed onto it, the online metrics loaded, and the newest id in use
 * (segments, partitions, metrics) so that new segment ids pass them all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_loop_int.h"

/* Reads segment id of m into m->segs and the index. */
static int segment_load(lp_model_t *m, int64_t id)
{
    char *path = kiln_asprintf("%s/%013lld.imp", m->dir, (long long)id), *buf = NULL;
    size_t len = 0;
    int rc = path ? lp_slurp(path, &buf, &len) : KILN_ENOMEM;
    free(path);
    KILN_CHECK(rc);
    lp_seg_t s = {.id = id, .bytes = (int64_t)len, .tmin = INT64_MAX, .tmax = 0};
    for (char *p = buf, *nl; rc == 0 && (nl = memchr(p, '\n', len - (size_t)(p - buf)));
         p = nl + 1) {
        *nl = '\0';
        char *f[IMP_FIELDS], *feat;
        if (lp_line_split(p, f, &feat) < 0)
            continue;
        int64_t ts = strtoll(f[0], NULL, 10);
        rc = lp_index_add(m, lp_hash(f[4], strlen(f[4]), f[5], strlen(f[5])), ts);
        s.rows++;
        s.tmin = ts < s.tmin ? ts : s.tmin;
        s.tmax = ts > s.tmax ? ts : s.tmax;
    }
    free(buf);
    if (s.rows == 0)
        s.tmin = s.tmax = id;
    if (rc == 0)
        rc = kiln_grow((void **)&m->segs, &m->capsegs, (size_t)m->nsegs + 1,
                       sizeof *m->segs, 8);
    if (rc == 0)
        m->segs[m->nsegs++] = s;
    return rc;
}

void lp_model_free(lp_model_t *m)
{
    if (m == NULL)
        return;
    if (m->fd >= 0)
        close(m->fd);
    if (m->fb_fd >= 0)
        close(m->fb_fd);
    KILN_FREE_ALL(m->dir, m->join_dir, m->idx, m->segs, m->fbs);
    free(m);
}

/* A model's state from its directories (what an earlier kiln-serve left). */
static int model_load(sv_loop_t *l, const char *name, lp_model_t **out)
{
    lp_model_t *m = kiln_calloc(1, sizeof *m);
    int64_t *ids = NULL;
    int rc = m ? 0 : KILN_ENOMEM;
    if (rc == 0) {
        snprintf(m->name, sizeof m->name, "%s", name);
        m->fd = m->fb_fd = -1;
        m->dir = kiln_asprintf("%s/%s", l->dir, name);
        m->join_dir = kiln_asprintf("%s/%s", l->join_dir, name);
        rc = m->dir && m->join_dir ? 0 : KILN_ENOMEM;
    }
    if (rc == 0)
        rc = kiln_mkdir_p(m->dir);
    if (rc == 0)
        rc = kiln_mkdir_p(m->join_dir);
    if (rc == 0)
        rc = lp_online_load(m);
    int n = rc == 0 ? lp_list_ids(m->dir, "", ".imp", &ids) : 0;
    rc = n < 0 ? n : rc;
    for (int i = 0; rc == 0 && i < n; i++) {
        rc = segment_load(m, ids[i]);
        l->bytes += rc == 0 ? m->segs[m->nsegs - 1].bytes : 0;
        l->last_id = ids[i] > l->last_id ? ids[i] : l->last_id;
    }
    free(ids);
    /* Partition names are segment ids: new ids pass every partition's and
     * the metrics' (a partition removed since, or a clock set back). */
    if (rc == 0 && m->joined_through > l->last_id)
        l->last_id = m->joined_through;
    n = rc == 0 ? lp_list_ids(m->join_dir, "part=", "", &ids) : 0;
    rc = n < 0 ? n : rc;
    if (n > 0 && ids[n - 1] > l->last_id)
        l->last_id = ids[n - 1];
    free(ids);
    if (rc == 0)
        rc = lp_feedback_load(l, m);
    if (rc < 0) {
        lp_model_free(m);
        return rc;
    }
    if (m->nsegs > 0 || m->nfbs > 0) {
        int64_t rows = 0;
        for (int i = 0; i < m->nsegs; i++)
            rows += m->segs[i].rows;
        KILN_INFO("impression log of %s: %d segment(s) of %lld rows to join, %d feedback "
                  "file(s)",
                  name, m->nsegs, (long long)rows, m->nfbs);
    }
    *out = m;
    return 0;
}

lp_model_t *lp_model_get(sv_loop_t *l, const char *name)
{
    lp_model_t *found = lp_model_find(l, name);
    if (found != NULL)
        return found;
    if (l->nmodels == LOOP_MODELS)
        return NULL;
    lp_model_t *m = NULL;
    if (model_load(l, name, &m) < 0) {
        KILN_WARN("impression log of model %s: %s", name, kiln_errmsg());
        return NULL;
    }
    l->models[l->nmodels++] = m;
    return m;
}
