/*
 * serving/serve_impress.c - the impression log: what a predict with a
 * request key leaves behind, one line per row, for the join to turn into
 * training data once the feedback window has passed.
 *
 * A predict only copies its rows into records and puts them in a bounded
 * queue (sv_loop_log, under qlock, never waiting for a file); a full queue
 * drops them, counted. The writer thread takes batches off the queue and
 * appends each model's lines to its open segment, one write() per piece
 * that fits the segment, and only then adds them to the model's index,
 * where feedback finds them. A segment rolls (fdatasync, closed: sealed)
 * when the next line would take it past seg_max bytes or it is roll_ms old;
 * lines that would take the segments past --impressions-max are dropped,
 * counted, as are those the disk refuses (the segment is cut back to its
 * last whole line, or sealed when it cannot be). A kill -9 can leave a
 * torn last line, which readers skip; a restarted kiln-serve never appends
 * to an old segment.
 *
 * Segment line (IMP_FIELDS tab-separated fields, then the features):
 *   <unix ms> <label> <checkpoint> <probability %.9g|nan> <request key> <row> <features>
 * where the features are the row's TSV fields as received, less a label
 * column when the row had one.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_loop_int.h"

/* ---- the queue (request threads) --------------------------------------------------- */

void sv_loop_log(sv_loop_t *l, const char *model, const sv_predicted_t *r,
                 const char *request_key, const sv_line_t *lines, const char *const *row_ids)
{
    if (l == NULL || request_key == NULL || r->n == 0)
        return;
    int64_t now = kiln_now_ms(), queued = 0, bad = 0;
    size_t klen = strlen(request_key);
    lp_rec_t **recs = kiln_calloc((size_t)r->n, sizeof *recs);
    for (int64_t i = 0; recs != NULL && i < r->n; i++) {
        char num[24];
        const char *row = row_ids ? row_ids[i] : num;
        if (row_ids == NULL)
            snprintf(num, sizeof num, "%lld", (long long)i);
        /* The features: the line less its label column (as many tabs as fields). */
        const char *fp = lines[i].p;
        size_t fl = lines[i].len, tabs = 0;
        while (fl > 0 && fp[fl - 1] == '\r')
            fl--;
        for (size_t k = 0; k < fl; k++)
            tabs += fp[k] == '\t';
        if ((int)tabs == r->nfields) {
            const char *t = memchr(fp, '\t', fl);
            fl -= (size_t)(t + 1 - fp);
            fp = t + 1;
        }
        if (memchr(fp, '\n', fl) != NULL || memchr(fp, '\r', fl) != NULL) {
            bad++; /* a JSON row with a newline inside: not one line of the log */
            continue;
        }
        lp_rec_t *rec = kiln_calloc(1, sizeof *rec);
        if (rec != NULL)
            rec->text = kiln_asprintf("%s\t%s\t%.*s", request_key, row, (int)fl, fp);
        if (rec == NULL || rec->text == NULL) {
            free(rec);
            bad++;
            continue;
        }
        rec->ts = now;
        snprintf(rec->model, sizeof rec->model, "%s", model);
        snprintf(rec->label, sizeof rec->label, "%s", r->label);
        snprintf(rec->uid, sizeof rec->uid, "%s", r->uid);
        rec->prob = r->probs[i];
        rec->h = lp_hash(request_key, klen, row, strlen(row));
        recs[queued++] = rec;
    }
    if (recs == NULL)
        bad = r->n;
    int64_t full = 0;
    pthread_mutex_lock(&l->qlock);
    for (int64_t i = 0; i < queued; i++) {
        if (l->qn == LOOP_QUEUE) {
            full = queued - i;
            break;
        }
        l->q[(l->qhead + l->qn++) % LOOP_QUEUE] = recs[i];
        recs[i] = NULL;
        l->enqueued++;
    }
    pthread_cond_signal(&l->qcond);
    pthread_mutex_unlock(&l->qlock);
    for (int64_t i = queued - full; i < queued; i++) {
        free(recs[i]->text);
        free(recs[i]);
    }
    free(recs);
    if (full > 0 || bad > 0) {
        pthread_mutex_lock(&l->lock);
        if (full > 0)
            lp_drop(l, DROP_QUEUE, full, "the writer's queue is full (the disk is slower than "
                                         "the predicts)");
        if (bad > 0)
            lp_drop(l, DROP_ROW, bad, "a row holds a newline, or no memory for its record");
        pthread_mutex_unlock(&l->lock);
    }
}

/* ---- the writer thread --------------------------------------------------------------- */

/* Seals m's open segment: fdatasync, close. */
static void seal(lp_model_t *m)
{
    if (m->fd < 0)
        return;
    if (fdatasync(m->fd) < 0)
        KILN_WARN("impression log of %s: fdatasync: %s", m->name, strerror(errno));
    close(m->fd);
    m->fd = -1;
}

/* Opens a new segment for m (under lock). Returns 0 or KILN_EIO. */
static int segment_open(sv_loop_t *l, lp_model_t *m)
{
    int64_t id = kiln_now_ms();
    id = id > l->last_id ? id : l->last_id + 1;
    int rc = kiln_grow((void **)&m->segs, &m->capsegs, (size_t)m->nsegs + 1,
                       sizeof *m->segs, 8);
    char *path = rc == 0 ? kiln_asprintf("%s/%013lld.imp", m->dir, (long long)id) : NULL;
    if (path == NULL)
        return KILN_ENOMEM;
    m->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    rc = m->fd < 0 ? kiln_errf(KILN_EIO, "cannot create %s: %s", path, strerror(errno)) : 0;
    free(path);
    if (rc == 0) {
        l->last_id = id;
        m->segs[m->nsegs++] = (lp_seg_t){.id = id, .tmin = INT64_MAX};
        kiln_fsync_dir(m->dir);
    }
    return rc;
}

/* Under lock: how many of the records (k, line ends in ends: line j is
 * ends[j-1]..ends[j] of the batch's text, from byte `from`) fit in m's open
 * segment, rolled first when due (too big, too old) and opened when none
 * is; at least one in a fresh segment. 0 with *reason and *why when none
 * can be written now (the cap, or a segment that cannot be created). */
static int64_t room(sv_loop_t *l, lp_model_t *m, const size_t *ends, int64_t k, size_t from,
                    int64_t now, int *reason, const char **why)
{
    lp_seg_t *open_seg = m->fd >= 0 ? &m->segs[m->nsegs - 1] : NULL;
    if (open_seg != NULL && (open_seg->bytes + (int64_t)(ends[0] - from) > l->seg_max ||
                             now - open_seg->id >= l->roll_ms))
        seal(m), open_seg = NULL;
    if (l->bytes + (int64_t)(ends[0] - from) > l->o.max_bytes) {
        *reason = DROP_CAP;
        *why = "--impressions-max is reached (segments wait for their feedback window to be "
               "joined and removed)";
        return 0;
    }
    if (open_seg == NULL && segment_open(l, m) < 0) {
        *reason = DROP_DISK;
        *why = kiln_errmsg();
        return 0;
    }
    int64_t in_seg = m->segs[m->nsegs - 1].bytes, n = 1;
    while (n < k && in_seg + (int64_t)(ends[n] - from) <= l->seg_max &&
           l->bytes + (int64_t)(ends[n] - from) <= l->o.max_bytes)
        n++;
    return n;
}

/* Appends len bytes to fd at offset at (its size). Returns 0, or -1 with
 * the file cut back to at (or m's segment sealed when it cannot be) and
 * *why saying what failed. */
static int append(sv_loop_t *l, lp_model_t *m, int fd, int64_t at, int64_t seg_id,
                  const char *buf, size_t len, const char **why)
{
    for (size_t done = 0; done < len;) {
        ssize_t w = write(fd, buf + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            static char msg[160]; /* the writer thread's alone */
            snprintf(msg, sizeof msg, "cannot append to segment %013lld of %s: %s",
                     (long long)seg_id, m->name, w < 0 ? strerror(errno) : "no progress");
            *why = msg;
            /* Back to the last whole line; a segment that cannot be cut is
             * sealed (its torn tail is skipped by readers). */
            pthread_mutex_lock(&l->lock);
            if (ftruncate(fd, (off_t)at) < 0 && m->fd == fd)
                seal(m);
            pthread_mutex_unlock(&l->lock);
            return -1;
        }
        done += (size_t)w;
    }
    return 0;
}

/* Under lock: the records written (recs, n) count in m's open segment and index. */
static void written(sv_loop_t *l, lp_model_t *m, lp_rec_t *const *recs, int64_t n, size_t len)
{
    lp_seg_t *s = &m->segs[m->nsegs - 1];
    s->bytes += (int64_t)len;
    l->bytes += (int64_t)len;
    for (int64_t j = 0; j < n; j++) {
        if (lp_index_add(m, recs[j]->h, recs[j]->ts) < 0)
            KILN_WARN("impression index of %s: out of memory; feedback for a row will count "
                      "as unknown",
                      m->name);
        s->rows++;
        s->tmin = recs[j]->ts < s->tmin ? recs[j]->ts : s->tmin;
        s->tmax = recs[j]->ts > s->tmax ? recs[j]->ts : s->tmax;
    }
    m->logged += n;
}

/* Writes the records of batch (n) that belong to the model of the first
 * one left, taking them out of batch (set NULL) into mine (n): formatted
 * into *buf (line j ends at ends[j]), then appended in pieces that fit the
 * open segment and the cap. */
static void write_model(sv_loop_t *l, lp_rec_t **batch, int n, lp_rec_t **mine, size_t *ends,
                        char **buf, size_t *cap)
{
    int first = 0;
    while (batch[first] == NULL)
        first++;
    char model[SERVE_NAME_MAX];
    snprintf(model, sizeof model, "%s", batch[first]->model);
    size_t len = 0;
    int64_t k = 0, now = kiln_now_ms();
    bool nomem = false;
    for (int i = first; i < n; i++) {
        lp_rec_t *r = batch[i];
        if (r == NULL || strcmp(r->model, model) != 0)
            continue;
        batch[i] = NULL;
        mine[k] = r;
        size_t need = strlen(r->text) + 3 * SERVE_NAME_MAX + 64;
        if (!nomem && len + need > *cap) {
            size_t c = *cap ? *cap : 65536;
            while (c < len + need)
                c *= 2;
            char *nb = kiln_reallocarray(*buf, c, 1);
            if (nb == NULL)
                nomem = true;
            else
                *buf = nb, *cap = c;
        }
        if (!nomem) {
            char prob[32] = "nan";
            if (isfinite(r->prob))
                snprintf(prob, sizeof prob, "%.9g", (double)r->prob);
            len += (size_t)snprintf(*buf + len, *cap - len, "%lld\t%s\t%s\t%s\t%s\n",
                                    (long long)r->ts, r->label, r->uid, prob, r->text);
        }
        ends[k++] = len;
    }
    pthread_mutex_lock(&l->lock);
    lp_model_t *m = nomem ? NULL : lp_model_get(l, model);
    if (m == NULL)
        lp_drop(l, nomem ? DROP_DISK : DROP_MODELS, k,
                nomem ? "out of memory for the batch"
                      : "more models than kiln-serve logs (64), or the model's directory "
                        "cannot be made");
    int64_t done = m == NULL ? k : 0;
    while (done < k) {
        int reason = 0;
        const char *why = "";
        size_t from = done ? ends[done - 1] : 0;
        int64_t fit = room(l, m, ends + done, k - done, from, now, &reason, &why);
        if (fit == 0) { /* the rest waits for nothing: dropped, counted */
            lp_drop(l, reason, k - done, why);
            break;
        }
        int fd = m->fd;
        int64_t at = m->segs[m->nsegs - 1].bytes, seg_id = m->segs[m->nsegs - 1].id;
        size_t piece = ends[done + fit - 1] - from;
        pthread_mutex_unlock(&l->lock);
        int rc = append(l, m, fd, at, seg_id, *buf + from, piece, &why);
        pthread_mutex_lock(&l->lock);
        if (rc < 0) {
            lp_drop(l, DROP_DISK, fit, why);
        } else {
            written(l, m, mine + done, fit, piece);
            if (l->bytes + l->seg_max <= l->o.max_bytes) /* room again, not a row's gap */
                lp_drop_end(l, DROP_CAP);
            lp_drop_end(l, DROP_DISK);
        }
        done += fit;
    }
    l->drained += k;
    pthread_cond_broadcast(&l->drained_cond);
    pthread_mutex_unlock(&l->lock);
    for (int64_t j = 0; j < k; j++) {
        free(mine[j]->text);
        free(mine[j]);
    }
}

/* Seals the open segments that reached their age (when no record comes to
 * roll them), so that the joiner can take them. */
static void roll_idle(sv_loop_t *l)
{
    int64_t now = kiln_now_ms();
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->nmodels; i++) {
        lp_model_t *m = l->models[i];
        if (m->fd >= 0 && now - m->segs[m->nsegs - 1].id >= l->roll_ms)
            seal(m);
    }
    pthread_mutex_unlock(&l->lock);
}

#define BATCH 1024

void *lp_writer_main(void *arg)
{
    sv_loop_t *l = arg;
    lp_rec_t **batch = kiln_calloc(BATCH, sizeof *batch), **mine = kiln_calloc(BATCH,
                                                                               sizeof *mine);
    size_t *ends = kiln_calloc(BATCH, sizeof *ends);
    char *buf = NULL;
    size_t cap = 0;
    for (;;) {
        pthread_mutex_lock(&l->qlock);
        if (l->qn == 0 && !l->stop)
            lp_wait_ms(&l->qcond, &l->qlock, 50);
        int n = 0;
        while (batch != NULL && mine != NULL && ends != NULL && l->qn > 0 && n < BATCH) {
            batch[n++] = l->q[l->qhead];
            l->qhead = (l->qhead + 1) % LOOP_QUEUE;
            l->qn--;
        }
        bool stop = l->stop && l->qn == 0;
        pthread_mutex_unlock(&l->qlock);
        for (int left = n; left > 0;) {
            write_model(l, batch, n, mine, ends, &buf, &cap);
            left = 0;
            for (int i = 0; i < n; i++)
                left += batch[i] != NULL;
        }
        roll_idle(l);
        if (stop || batch == NULL || mine == NULL || ends == NULL)
            break;
    }
    free(batch);
    free(mine);
    free(ends);
    free(buf);
    return NULL;
}
