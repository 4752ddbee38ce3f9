/*
 * serving/serve_feedback.c - feedback on impressions: POST
 * /v1/models/{model}/feedback with [{"request_key", "row", "label"}].
 *
 * Each item is judged against the model's index of impressions logged
 * (serve_impress.c): unknown (no such impression in the log, or one already
 * pruned), late (its impression is older than --feedback-window: its
 * segment is joined, or will be without it), duplicate (the (request_key,
 * row) has feedback already: the first one stands, so a retried POST changes
 * nothing) or accepted. The accepted items are appended to the model's
 * feedback file with one write() before the answer and before they count in
 * memory, so what a client was told is stored survives a kill -9; a
 * restarted kiln-serve replays the files onto its index. Before judging, the
 * request waits (at most DRAIN_WAIT_MS) for the writer to drain the
 * impressions queued before it, so feedback posted right after its predict
 * finds it.
 *
 * A feedback file rolls with the segments' age; a sealed one is removed
 * once every impression it could match (logged before its last item) is
 * joined.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "serve_loop_int.h"

static const char *const fb_names[FB_NRESULTS] = {"accepted", "duplicate", "unknown", "late"};

const char *lp_feedback_name(int result)
{
    return fb_names[result];
}

int lp_feedback_load(sv_loop_t *l, lp_model_t *m)
{
    (void)l;
    int64_t *ids = NULL;
    int n = lp_list_ids(m->dir, "fb-", ".log", &ids), rc = n < 0 ? n : 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        char *path = kiln_asprintf("%s/fb-%013lld.log", m->dir, (long long)ids[i]), *buf = NULL;
        size_t len = 0;
        rc = path ? lp_slurp(path, &buf, &len) : KILN_ENOMEM;
        free(path);
        lp_fbfile_t f = {.id = ids[i], .tmax = ids[i]};
        for (char *p = buf, *nl; rc == 0 && (nl = memchr(p, '\n', len - (size_t)(p - buf)));
             p = nl + 1) {
            *nl = '\0';
            char *save = NULL;
            char *ts = strtok_r(p, "\t", &save), *y = strtok_r(NULL, "\t", &save),
                 *key = strtok_r(NULL, "\t", &save), *row = strtok_r(NULL, "\t", &save);
            if (ts == NULL || y == NULL || key == NULL || row == NULL)
                continue;
            int64_t t = strtoll(ts, NULL, 10);
            f.tmax = t > f.tmax ? t : f.tmax;
            lp_entry_t *e = lp_index_find(m, lp_hash(key, strlen(key), row, strlen(row)));
            if (e != NULL && e->y < 0)
                e->y = (int8_t)(y[0] == '1');
        }
        free(buf);
        if (rc == 0)
            rc = kiln_grow((void **)&m->fbs, &m->capfbs, (size_t)m->nfbs + 1,
                           sizeof *m->fbs, 8);
        if (rc == 0)
            m->fbs[m->nfbs++] = f;
    }
    free(ids);
    return rc;
}

void lp_feedback_prune(lp_model_t *m)
{
    int64_t oldest = INT64_MAX; /* the oldest impression not joined */
    for (int i = 0; i < m->nsegs; i++)
        oldest = m->segs[i].tmin < oldest ? m->segs[i].tmin : oldest;
    int keep = 0;
    for (int i = 0; i < m->nfbs; i++) {
        lp_fbfile_t *f = &m->fbs[i];
        bool open = m->fb_fd >= 0 && f->id == m->fb_opened;
        if (!open && f->tmax < oldest) {
            char *path = kiln_asprintf("%s/fb-%013lld.log", m->dir, (long long)f->id);
            if (path != NULL && unlink(path) < 0 && errno != ENOENT)
                KILN_WARN("cannot remove %s: %s", path, strerror(errno));
            free(path);
            continue;
        }
        m->fbs[keep++] = *f;
    }
    m->nfbs = keep;
}

/* One item of a feedback body. */
typedef struct fb_item {
    const char *key;
    char row[SV_ID_MAX];
    int y;
} fb_item_t;

/* Reads item i of the body into *it. Returns 0 or KILN_EINVAL naming it. */
static int item_parse(json_t *j, size_t i, fb_item_t *it)
{
    json_t *row = json_object_get(j, "row"), *y = json_object_get(j, "label");
    it->key = json_string_value(json_object_get(j, "request_key"));
    if (!json_is_object(j) || it->key == NULL)
        return kiln_errf(KILN_EINVAL, "feedback item %zu: want {\"request_key\": \"...\", "
                                      "\"row\": ..., \"label\": 0 or 1}",
                         i);
    if (json_is_integer(row))
        snprintf(it->row, sizeof it->row, "%lld", (long long)json_integer_value(row));
    else if (json_is_string(row))
        snprintf(it->row, sizeof it->row, "%s", json_string_value(row));
    else
        return kiln_errf(KILN_EINVAL, "feedback item %zu: \"row\" must be the row id the "
                                      "predict logged (a string, or the row's index as an "
                                      "integer)",
                         i);
    double v = json_is_boolean(y) ? (json_is_true(y) ? 1 : 0)
               : json_is_number(y) ? json_number_value(y)
                                   : -1;
    if (v != 0 && v != 1)
        return kiln_errf(KILN_EINVAL, "feedback item %zu: \"label\" must be 0 or 1 (the "
                                      "training partitions are Criteo TSV, whose label is 0 "
                                      "or 1)",
                         i);
    it->y = (int)v;
    char what[64];
    snprintf(what, sizeof what, "feedback item %zu's request_key", i);
    KILN_CHECK(sv_loop_id_check(what, it->key));
    snprintf(what, sizeof what, "feedback item %zu's row", i);
    return sv_loop_id_check(what, it->row);
}

/* Under lock: the open feedback file of m, rolled when due. Returns the fd or -1. */
static int fb_file(sv_loop_t *l, lp_model_t *m, int64_t now)
{
    if (m->fb_fd >= 0 && now - m->fb_opened < l->roll_ms)
        return m->fb_fd;
    if (m->fb_fd >= 0)
        close(m->fb_fd);
    m->fb_fd = -1;
    int64_t id = now;
    for (int i = 0; i < m->nfbs; i++)
        id = m->fbs[i].id >= id ? m->fbs[i].id + 1 : id;
    if (kiln_grow((void **)&m->fbs, &m->capfbs, (size_t)m->nfbs + 1, sizeof *m->fbs,
                  8) < 0)
        return -1;
    char *path = kiln_asprintf("%s/fb-%013lld.log", m->dir, (long long)id);
    if (path != NULL)
        m->fb_fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (path != NULL && m->fb_fd < 0)
        kiln_errf(KILN_EIO, "cannot create %s: %s", path, strerror(errno));
    free(path);
    if (m->fb_fd < 0)
        return -1;
    kiln_fsync_dir(m->dir);
    m->fb_opened = id;
    m->fbs[m->nfbs++] = (lp_fbfile_t){.id = id, .tmax = now};
    return m->fb_fd;
}

/* Waits until the writer drained what was queued before now, at most
 * DRAIN_WAIT_MS: the HTTP thread serves every request, so the wait is short
 * (the writer drains in well under a millisecond unless the disk stalls). */
#define DRAIN_WAIT_MS 200
static void wait_drained(sv_loop_t *l)
{
    pthread_mutex_lock(&l->qlock);
    int64_t want = l->enqueued;
    pthread_mutex_unlock(&l->qlock);
    int64_t until = kiln_now_ms() + DRAIN_WAIT_MS;
    while (l->drained < want && kiln_now_ms() < until)
        lp_wait_ms(&l->drained_cond, &l->lock, until - kiln_now_ms());
}

/* Under lock: judges the n items (result[i]) and stores the accepted ones.
 * Returns 0, or KILN_EIO / KILN_ENOSPC / KILN_ENOMEM (nothing stored). */
static int feedback_apply(sv_loop_t *l, lp_model_t *m, size_t n, const fb_item_t *it,
                          int *result)
{
    int64_t now = kiln_now_ms();
    size_t cap = n * (2 * SV_ID_MAX + 32) + 1, len = 0;
    char *buf = kiln_malloc(cap);
    lp_entry_t **hit = kiln_calloc(n + 1, sizeof *hit);
    int rc = buf && hit ? 0 : KILN_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        lp_entry_t *e = lp_index_find(m, lp_hash(it[i].key, strlen(it[i].key), it[i].row,
                                                 strlen(it[i].row)));
        if (e == NULL) {
            result[i] = FB_UNKNOWN;
        } else if (now > e->ts + l->o.window_ms) {
            result[i] = FB_LATE;
        } else if (e->y >= 0) {
            result[i] = FB_DUPLICATE;
        } else {
            result[i] = FB_ACCEPTED;
            e->y = (int8_t)(2 + it[i].y); /* pending: a repeat within the body is a duplicate */
            hit[i] = e;
            len += (size_t)snprintf(buf + len, cap - len, "%lld\t%d\t%s\t%s\n", (long long)now,
                                    it[i].y, it[i].key, it[i].row);
        }
    }
    int fd = rc == 0 && len > 0 ? fb_file(l, m, now) : -1;
    if (rc == 0 && len > 0 && fd < 0)
        rc = kiln_errcode() ? kiln_errcode() : KILN_EIO;
    if (rc == 0 && len > 0) {
        off_t at = lseek(fd, 0, SEEK_END);
        size_t done = 0;
        while (rc == 0 && done < len) {
            ssize_t w = write(fd, buf + done, len - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                rc = kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO,
                               "cannot append to the feedback log of %s: %s", m->name,
                               w < 0 ? strerror(errno) : "no progress");
                if (at < 0 || ftruncate(fd, at) < 0) { /* a torn line is skipped on replay */
                    close(fd);
                    m->fb_fd = -1;
                }
            }
            done += w > 0 ? (size_t)w : 0;
        }
    }
    for (size_t i = 0; hit != NULL && i < n; i++) {
        if (hit[i] == NULL)
            continue;
        hit[i]->y = rc == 0 ? (int8_t)(hit[i]->y - 2) : -1;
        if (rc < 0)
            result[i] = -1;
    }
    if (rc == 0) {
        for (size_t i = 0; i < n; i++)
            m->fb[result[i]]++;
        if (len > 0)
            m->fbs[m->nfbs - 1].tmax = now;
    }
    free(buf);
    free(hit);
    return rc;
}

void sv_answer_feedback(sv_loop_t *l, const char *model, const char *body, size_t len,
                        sv_answer_t *ans)
{
    json_error_t jerr;
    json_t *doc = NULL;
    fb_item_t *it = NULL;
    int *result = NULL;
    int rc = 0;
    ans->status = 400;
    if (l == NULL) {
        ans->status = 404;
        rc = kiln_errf(KILN_ENOENT, "this kiln-serve logs no impressions, so it takes no "
                                    "feedback: start it with --impressions-dir and --join-dir");
        goto out;
    }
    doc = json_loadb(body, len, 0, &jerr);
    if (!json_is_array(doc)) {
        rc = kiln_errf(KILN_EINVAL, "feedback wants a JSON array [{\"request_key\": \"...\", "
                                    "\"row\": ..., \"label\": 0 or 1}, ...]");
        goto out;
    }
    size_t n = json_array_size(doc);
    it = kiln_calloc(n + 1, sizeof *it);
    result = kiln_calloc(n + 1, sizeof *result);
    if (it == NULL || result == NULL) {
        ans->status = 503;
        rc = KILN_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        KILN_CHECK_GOTO(item_parse(json_array_get(doc, i), i, &it[i]), rc, out);
    pthread_mutex_lock(&l->lock);
    wait_drained(l);
    lp_model_t *m = lp_model_find(l, model);
    if (m == NULL)
        for (size_t i = 0; i < n; i++)
            result[i] = FB_UNKNOWN;
    else
        rc = feedback_apply(l, m, n, it, result);
    pthread_mutex_unlock(&l->lock);
    if (rc < 0) {
        ans->status = rc == KILN_ENOMEM ? 503 : 507;
        goto out;
    }
    int64_t count[FB_NRESULTS] = {0};
    for (size_t i = 0; i < n; i++)
        count[result[i]]++;
    json_t *j = json_object();
    for (int k = 0; k < FB_NRESULTS; k++)
        json_object_set_new(j, fb_names[k], json_integer(count[k]));
    ans->status = 200;
    ans->body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
out:
    if (rc < 0) {
        json_t *e = json_pack("{s:s}", "error", kiln_errmsg());
        ans->body = e ? json_dumps(e, JSON_COMPACT) : NULL;
        json_decref(e);
    }
    json_decref(doc);
    free(it);
    free(result);
}
