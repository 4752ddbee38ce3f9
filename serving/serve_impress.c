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
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve_loop_int.h"

static const char *const drop_names[DROP_NREASONS] = {
    [DROP_QUEUE] = "queue", [DROP_CAP] = "cap", [DROP_DISK] = "disk", [DROP_ROW] = "row",
    [DROP_MODELS] = "models"};

const char *lp_drop_name(int reason)
{
    return drop_names[reason];
}

uint64_t lp_hash(const char *key, size_t klen, const char *row, size_t rlen)
{
    kiln_hasher_t *hs = kiln_hasher_create(28);
    uint64_t h;
    if (hs == NULL) { /* a hash without the streaming state: same value */
        char buf[2 * SV_ID_MAX];
        int n = snprintf(buf, sizeof buf, "%.*s\t%.*s", (int)klen, key, (int)rlen, row);
        h = kiln_xxh64(buf, (size_t)n, 28);
    } else {
        kiln_hasher_update(hs, key, klen);
        kiln_hasher_update(hs, "\t", 1);
        kiln_hasher_update(hs, row, rlen);
        h = kiln_hasher_digest(hs);
        kiln_hasher_destroy(hs);
    }
    return h ? h : 1; /* 0 marks an empty slot */
}

int sv_loop_id_check(const char *what, const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n >= SV_ID_MAX)
        return kiln_errf(KILN_EINVAL, "%s must be 1 to %d bytes to be logged, got %zu", what,
                         SV_ID_MAX - 1, n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return kiln_errf(KILN_EINVAL, "%s \"%.40s\" holds a control character (byte %zu); "
                                          "the impression log keeps ids without tabs, newlines "
                                          "or other control characters",
                             what, id, i);
    return 0;
}

int lp_wait_ms(pthread_cond_t *c, pthread_mutex_t *mu, int64_t ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(ms / 1000);
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    return pthread_cond_timedwait(c, mu, &until);
}

/* ---- drops ------------------------------------------------------------------- */

void lp_drop(sv_loop_t *l, int reason, int64_t n, const char *why)
{
    l->drops[reason] += n;
    if (!l->dropping[reason]) {
        l->dropping[reason] = true;
        KILN_WARN("impression log: dropping impressions (%s): %s; predicts still answer, the "
                  "drops are counted in /metrics (kiln_serve_impressions_dropped_total{reason="
                  "\"%s\"}); logged once until it recovers",
                  drop_names[reason], why, drop_names[reason]);
    }
}

void lp_drop_end(sv_loop_t *l, int reason)
{
    if (l->dropping[reason]) {
        l->dropping[reason] = false;
        KILN_INFO("impression log: logging again after %s drops (%lld dropped so far)",
                  drop_names[reason], (long long)l->drops[reason]);
    }
}

/* ---- the index: (request key, row) -> time, feedback ---------------------------- */

lp_entry_t *lp_index_find(const lp_model_t *m, uint64_t h)
{
    if (m->idx_cap == 0)
        return NULL;
    for (int64_t i = (int64_t)(h & (uint64_t)(m->idx_cap - 1));; i = (i + 1) & (m->idx_cap - 1)) {
        if (m->idx[i].h == h)
            return &m->idx[i];
        if (m->idx[i].h == 0)
            return NULL;
    }
}

static void index_put(lp_entry_t *tab, int64_t cap, const lp_entry_t *e)
{
    int64_t i = (int64_t)(e->h & (uint64_t)(cap - 1));
    while (tab[i].h != 0 && tab[i].h != e->h)
        i = (i + 1) & (cap - 1);
    tab[i] = *e;
}

/* Rebuilds m's index in cap slots with the entries of min_ts or later. Returns
 * 0 or KILN_ENOMEM (the index unchanged). */
static int index_rebuild(lp_model_t *m, int64_t cap, int64_t min_ts)
{
    lp_entry_t *tab = kiln_calloc((size_t)cap, sizeof *tab);
    if (tab == NULL)
        return KILN_ENOMEM;
    int64_t n = 0;
    for (int64_t i = 0; i < m->idx_cap; i++)
        if (m->idx[i].h != 0 && m->idx[i].ts >= min_ts) {
            index_put(tab, cap, &m->idx[i]);
            n++;
        }
    free(m->idx);
    m->idx = tab;
    m->idx_cap = cap;
    m->idx_n = n;
    return 0;
}

int lp_index_add(lp_model_t *m, uint64_t h, int64_t ts)
{
    if ((m->idx_n + 1) * 4 > m->idx_cap * 3) /* at most 3/4 full */
        KILN_CHECK(index_rebuild(m, m->idx_cap ? m->idx_cap * 2 : 4096, INT64_MIN));
    if (lp_index_find(m, h) != NULL)
        return 0;
    index_put(m->idx, m->idx_cap, &(lp_entry_t){.h = h, .ts = ts, .y = -1});
    m->idx_n++;
    return 0;
}

void lp_index_prune(lp_model_t *m, int64_t min_ts)
{
    int64_t live = 0;
    for (int64_t i = 0; i < m->idx_cap; i++)
        live += m->idx[i].h != 0 && m->idx[i].ts >= min_ts;
    if (live == m->idx_n)
        return;
    int64_t cap = 4096;
    while ((live + 1) * 4 > cap * 3)
        cap *= 2;
    if (index_rebuild(m, cap, min_ts) < 0)
        KILN_WARN("impression index of %s: out of memory while pruning; kept as it is", m->name);
}

/* ---- models ----------------------------------------------------------------------- */

int lp_slurp(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kiln_errf(errno == ENOENT ? KILN_ENOENT : KILN_EIO, "cannot open %s: %s", path,
                         strerror(errno));
    struct stat sb;
    char *b = fstat(fileno(f), &sb) == 0 ? kiln_malloc((size_t)sb.st_size + 1) : NULL;
    size_t n = b ? fread(b, 1, (size_t)sb.st_size, f) : 0;
    int bad = b == NULL || ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return kiln_errf(b ? KILN_EIO : KILN_ENOMEM, "cannot read %s", path);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

int lp_line_split(char *line, char *f[IMP_FIELDS], char **features)
{
    char *p = line;
    for (int i = 0; i < IMP_FIELDS; i++) {
        f[i] = p;
        char *tab = strchr(p, '\t');
        if (tab == NULL)
            return -1;
        *tab = '\0';
        p = tab + 1;
    }
    *features = p;
    return f[0][0] != '\0' ? 0 : -1;
}

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

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int lp_list_ids(const char *dir, const char *prefix, const char *suffix, int64_t **ids)
{
    *ids = NULL;
    DIR *d = opendir(dir);
    if (d == NULL)
        return errno == ENOENT ? 0 : kiln_errf(KILN_EIO, "cannot list %s: %s", dir,
                                               strerror(errno));
    size_t cap = 0;
    int n = 0, rc = 0;
    size_t pl = strlen(prefix), sl = strlen(suffix);
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        size_t el = strlen(e->d_name);
        char *end;
        if (el <= pl + sl || strncmp(e->d_name, prefix, pl) != 0 ||
            strcmp(e->d_name + el - sl, suffix) != 0)
            continue;
        long long id = strtoll(e->d_name + pl, &end, 10);
        if (end != e->d_name + el - sl)
            continue;
        rc = kiln_grow((void **)ids, &cap, (size_t)n + 1, sizeof **ids, 16);
        if (rc == 0)
            (*ids)[n++] = id;
    }
    closedir(d);
    if (rc < 0) {
        free(*ids);
        *ids = NULL;
        return rc;
    }
    if (n > 1)
        qsort(*ids, (size_t)n, sizeof **ids, cmp_i64);
    return n;
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

lp_model_t *lp_model_get(sv_loop_t *l, const char *name, bool create)
{
    for (int i = 0; i < l->nmodels; i++)
        if (strcmp(l->models[i]->name, name) == 0)
            return l->models[i];
    if (!create)
        return NULL;
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
    lp_model_t *m = nomem ? NULL : lp_model_get(l, model, true);
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
