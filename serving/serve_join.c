/*
 * serving/serve_join.c - the loop's life (open, recovery, close) and the
 * join: a sealed segment whose newest impression is older than
 * --feedback-window becomes a training partition, each impression once.
 *
 * The join of segment <id> of model M, in this order, each step safe to
 * repeat after a kill -9 anywhere:
 *   1. read the segment (whole lines only) and, under the lock, each
 *      impression's feedback (1 or 0; 0 when none came: the negative
 *      default). Feedback for it can no longer be accepted: it would be late.
 *   2. unless <join-dir>/M/part=<id> exists: write .part=<id>.tmp/part-0.tsv
 *      (Criteo TSV: the label, then the features as the predict received
 *      them), fsync, an empty _SUCCESS, fsync, and rename the directory to
 *      part=<id>. The partition appears whole or not at all.
 *   3. unless online.json already includes <id> (its joined_through): add
 *      the rows to the online metrics and write online.json (atomically).
 *   4. remove the segment.
 * A kill between 2 and 4 leaves the segment: the next kiln-serve finds the
 * partition (and the metrics) there and only removes it. Segments are
 * joined oldest first, so joined_through is one number.
 *
 * Why in kiln-serve and not a kilnd job kind: docs/design.md ("The loop").
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve_loop_int.h"

/* Writes len bytes of data to path and fsyncs it. Returns 0 or KILN_EIO/ENOSPC. */
static int write_synced(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return kiln_errf(KILN_EIO, "cannot create %s: %s", path, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    ok = fclose(f) == 0 && ok;
    if (!ok)
        return kiln_errf(err == ENOSPC ? KILN_ENOSPC : KILN_EIO, "cannot write %s: %s", path,
                         strerror(err));
    return 0;
}

/* Removes a leftover temporary partition directory (a join killed in step 2). */
static void remove_tmp(const char *tmp)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/part-0.tsv", tmp);
    unlink(p);
    snprintf(p, sizeof p, "%s/_SUCCESS", tmp);
    unlink(p);
    rmdir(tmp);
}

/* Step 2: the partition of segment id from rows (len bytes). */
static int write_partition(const lp_model_t *m, int64_t id, const char *rows, size_t len)
{
    char *dst = kiln_asprintf("%s/part=%013lld", m->join_dir, (long long)id);
    char *tmp = kiln_asprintf("%s/.part=%013lld.tmp", m->join_dir, (long long)id);
    char *file = kiln_asprintf("%s/part-0.tsv", tmp ? tmp : "");
    char *marker = kiln_asprintf("%s/_SUCCESS", tmp ? tmp : "");
    int rc = dst && tmp && file && marker ? 0 : KILN_ENOMEM;
    struct stat sb;
    if (rc == 0 && stat(dst, &sb) == 0) { /* joined before a kill: the partition stands */
        KILN_INFO("join of %s: %s is there already (a join cut short by a stop); not "
                  "written again",
                  m->name, dst);
        goto out;
    }
    if (rc == 0) {
        remove_tmp(tmp);
        if (mkdir(tmp, 0755) < 0)
            rc = kiln_errf(KILN_EIO, "cannot create %s: %s", tmp, strerror(errno));
    }
    if (rc == 0)
        rc = write_synced(file, rows, len);
    if (rc == 0)
        rc = write_synced(marker, "", 0);
    if (rc == 0)
        rc = kiln_fsync_dir(tmp);
    if (rc == 0 && rename(tmp, dst) < 0)
        rc = kiln_errf(KILN_EIO, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
    if (rc == 0)
        rc = kiln_fsync_dir(m->join_dir);
    if (rc < 0 && tmp != NULL)
        remove_tmp(tmp);
out:
    KILN_FREE_ALL(dst, tmp, file, marker);
    return rc;
}

/* KILN_TEST_JOIN_HOLD_MS: a pause after each step of a join, so that a test
 * can kill -9 kiln-serve inside one (0 in production). */
static void hold(void)
{
    kiln_test_pause("KILN_TEST_JOIN_HOLD_MS");
}

/* Joins segment seg (a copy) of m. Returns 0 or a KILN_E* code (the
 * segment stays, to be joined again). */
static int join_segment(sv_loop_t *l, lp_model_t *m, lp_seg_t seg)
{
    char *path = kiln_asprintf("%s/%013lld.imp", m->dir, (long long)seg.id), *buf = NULL,
         *out = NULL;
    size_t len = 0, n = 0, olen = 0;
    int rc = path ? lp_slurp(path, &buf, &len) : KILN_ENOMEM;
    /* Step 1: the rows, and per row its label (y), probability and A/B label. */
    char **lab = NULL, **feat = NULL;
    float *prob = NULL;
    uint64_t *h = NULL;
    int *y = NULL;
    for (size_t i = 0; rc == 0 && i < len; i++)
        n += buf[i] == '\n';
    if (rc == 0) {
        lab = kiln_calloc(n + 1, sizeof *lab);
        feat = kiln_calloc(n + 1, sizeof *feat);
        prob = kiln_calloc(n + 1, sizeof *prob);
        h = kiln_calloc(n + 1, sizeof *h);
        y = kiln_calloc(n + 1, sizeof *y);
        out = kiln_malloc(len + 2 * n + 1);
        rc = lab && feat && prob && h && y && out ? 0 : KILN_ENOMEM;
    }
    size_t k = 0;
    for (char *p = buf, *nl; rc == 0 && (nl = memchr(p, '\n', len - (size_t)(p - buf)));
         p = nl + 1) {
        *nl = '\0';
        char *f[IMP_FIELDS], *features;
        if (lp_line_split(p, f, &features) < 0)
            continue; /* not a line the writer wrote whole */
        lab[k] = f[1];
        feat[k] = features;
        prob[k] = strcmp(f[3], "nan") == 0 ? NAN : strtof(f[3], NULL);
        h[k++] = lp_hash(f[4], strlen(f[4]), f[5], strlen(f[5]));
    }
    if (rc == 0) {
        pthread_mutex_lock(&l->lock);
        for (size_t i = 0; i < k; i++) {
            const lp_entry_t *e = lp_index_find(m, h[i]);
            y[i] = e != NULL && e->y == 1;
        }
        pthread_mutex_unlock(&l->lock);
        for (size_t i = 0; i < k; i++)
            olen += (size_t)sprintf(out + olen, "%d\t%s\n", y[i], feat[i]);
    }
    hold();
    /* Step 2. */
    if (rc == 0 && k > 0)
        rc = write_partition(m, seg.id, out, olen);
    hold();
    /* Step 3. */
    if (rc == 0) {
        pthread_mutex_lock(&l->lock);
        if (m->joined_through >= seg.id)
            KILN_INFO("join of %s: segment %013lld is in the online metrics already; not "
                      "counted again",
                      m->name, (long long)seg.id);
        else {
            for (size_t i = 0; i < k; i++)
                lp_online_add(m, lab[i], prob[i], y[i]);
            m->joined_through = seg.id;
            if (lp_online_save(m) < 0)
                KILN_WARN("online metrics of %s: %s (kept in memory)", m->name, kiln_errmsg());
        }
        m->partitions += k > 0;
        m->joined_rows += (int64_t)k;
        pthread_mutex_unlock(&l->lock);
    }
    hold();
    /* Step 4. */
    if (rc == 0 && unlink(path) < 0 && errno != ENOENT)
        rc = kiln_errf(KILN_EIO, "cannot remove %s: %s", path, strerror(errno));
    if (rc == 0) {
        kiln_fsync_dir(m->dir);
        KILN_DEBUG("joined %s segment %013lld: %zu rows", m->name, (long long)seg.id, k);
    }
    KILN_FREE_ALL(path, buf, out, lab, feat, prob, h, y);
    return rc;
}

/* Joins m's segments that are due, oldest first; prunes the index and the
 * feedback files after one was. */
static void join_model(sv_loop_t *l, lp_model_t *m)
{
    bool joined = false;
    for (;;) {
        pthread_mutex_lock(&l->lock);
        int64_t now = kiln_now_ms();
        bool due = m->nsegs > 0 && !(m->fd >= 0 && m->nsegs == 1) &&
                   now > m->segs[0].tmax + l->o.window_ms;
        lp_seg_t seg = due ? m->segs[0] : (lp_seg_t){0};
        pthread_mutex_unlock(&l->lock);
        if (!due)
            break;
        if (join_segment(l, m, seg) < 0) {
            pthread_mutex_lock(&l->lock);
            m->join_failed++;
            if (m->join_failures++ == 0)
                KILN_WARN("join of %s: %s; the segment stays and is joined again (logged "
                          "once until a join succeeds)",
                          m->name, kiln_errmsg());
            pthread_mutex_unlock(&l->lock);
            break;
        }
        pthread_mutex_lock(&l->lock);
        if (m->join_failures > 0)
            KILN_INFO("join of %s works again", m->name);
        m->join_failures = 0;
        l->bytes -= m->segs[0].bytes;
        memmove(m->segs, m->segs + 1, (size_t)(m->nsegs - 1) * sizeof *m->segs);
        m->nsegs--;
        pthread_mutex_unlock(&l->lock);
        joined = true;
    }
    if (!joined)
        return;
    pthread_mutex_lock(&l->lock);
    int64_t oldest = kiln_now_ms() - 2 * l->o.window_ms;
    for (int i = 0; i < m->nsegs; i++)
        oldest = m->segs[i].tmin < oldest ? m->segs[i].tmin : oldest;
    lp_index_prune(m, oldest);
    lp_feedback_prune(m);
    pthread_mutex_unlock(&l->lock);
}

void *lp_joiner_main(void *arg)
{
    sv_loop_t *l = arg;
    for (;;) {
        pthread_mutex_lock(&l->stop_lock);
        if (!l->stop)
            lp_wait_ms(&l->stop_cond, &l->stop_lock, 100);
        bool stop = l->stop;
        pthread_mutex_unlock(&l->stop_lock);
        if (stop)
            break;
        pthread_mutex_lock(&l->lock);
        int n = l->nmodels;
        lp_model_t *models[LOOP_MODELS];
        memcpy(models, l->models, sizeof models);
        pthread_mutex_unlock(&l->lock);
        for (int i = 0; i < n; i++)
            join_model(l, models[i]);
    }
    return NULL;
}

/* ---- the loop's life ------------------------------------------------------------- */

/* The models an earlier kiln-serve logged: the directories in l->dir. */
static int load_models(sv_loop_t *l)
{
    DIR *d = opendir(l->dir);
    if (d == NULL)
        return kiln_errf(KILN_EIO, "cannot list --impressions-dir %s: %s", l->dir,
                         strerror(errno));
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        char why[128];
        if (serve_name_check(e->d_name, why, sizeof why) < 0)
            continue;
        char *p = kiln_asprintf("%s/%s", l->dir, e->d_name);
        struct stat sb;
        bool dir = p != NULL && stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
        free(p);
        if (dir && lp_model_get(l, e->d_name) == NULL)
            rc = kiln_errf(KILN_EIO, "cannot load the impression log of model %s in %s",
                           e->d_name, l->dir);
    }
    closedir(d);
    return rc;
}

int sv_loop_open(const sv_loop_opts_t *o, sv_loop_t **out)
{
    sv_loop_t *l = kiln_calloc(1, sizeof *l);
    if (l == NULL)
        return KILN_ENOMEM;
    l->o = *o;
    l->dir = kiln_strdup(o->impressions_dir);
    l->join_dir = kiln_strdup(o->join_dir);
    /* A segment rolls at an eighth of the cap (so the cap is reached in
     * steps the join can free) and at a quarter of the window (so a
     * segment's rows wait at most 1.25 windows to be joined). */
    l->seg_max = o->max_bytes / 8 > 4096 ? o->max_bytes / 8 : 4096;
    l->roll_ms = o->window_ms / 4;
    l->roll_ms = l->roll_ms < 200 ? 200 : l->roll_ms > 60000 ? 60000 : l->roll_ms;
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->qlock, NULL);
    pthread_mutex_init(&l->stop_lock, NULL);
    pthread_cond_init(&l->qcond, NULL);
    pthread_cond_init(&l->drained_cond, NULL);
    pthread_cond_init(&l->stop_cond, NULL);
    int rc = l->dir && l->join_dir ? 0 : KILN_ENOMEM;
    if (rc == 0)
        rc = kiln_mkdir_p(l->dir);
    if (rc == 0)
        rc = kiln_mkdir_p(l->join_dir);
    if (rc == 0) {
        pthread_mutex_lock(&l->lock);
        rc = load_models(l);
        pthread_mutex_unlock(&l->lock);
    }
    if (rc == 0 && pthread_create(&l->writer, NULL, lp_writer_main, l) != 0)
        rc = kiln_errf(KILN_EIO, "cannot start the impression writer thread");
    l->writer_up = rc == 0;
    if (rc == 0 && pthread_create(&l->joiner, NULL, lp_joiner_main, l) != 0)
        rc = kiln_errf(KILN_EIO, "cannot start the join thread");
    l->joiner_up = rc == 0;
    if (rc < 0) {
        sv_loop_close(l);
        return rc;
    }
    KILN_INFO("impression log in %s (cap %lld bytes), joined partitions in %s, feedback "
              "window %lld ms",
              l->dir, (long long)o->max_bytes, l->join_dir, (long long)o->window_ms);
    *out = l;
    return 0;
}

/* Tells the writer and the joiner sv_loop_open started to stop (waking
 * either from its wait) and waits for them to end. */
static void stop_threads(sv_loop_t *l)
{
    pthread_mutex_lock(&l->qlock);
    pthread_mutex_lock(&l->stop_lock);
    l->stop = true;
    pthread_cond_broadcast(&l->stop_cond);
    pthread_mutex_unlock(&l->stop_lock);
    pthread_cond_broadcast(&l->qcond);
    pthread_mutex_unlock(&l->qlock);
    if (l->writer_up)
        pthread_join(l->writer, NULL);
    if (l->joiner_up)
        pthread_join(l->joiner, NULL);
}

void sv_loop_close(sv_loop_t *l)
{
    if (l == NULL)
        return;
    stop_threads(l);
    for (int i = 0; i < l->qn; i++) {
        lp_rec_t *r = l->q[(l->qhead + i) % LOOP_QUEUE];
        free(r->text);
        free(r);
    }
    for (int i = 0; i < l->nmodels; i++) {
        lp_model_t *m = l->models[i];
        if (m->fd >= 0 && fdatasync(m->fd) < 0)
            KILN_WARN("impression log of %s: fdatasync: %s", m->name, strerror(errno));
        lp_model_free(m);
    }
    pthread_mutex_destroy(&l->lock);
    pthread_mutex_destroy(&l->qlock);
    pthread_mutex_destroy(&l->stop_lock);
    pthread_cond_destroy(&l->qcond);
    pthread_cond_destroy(&l->drained_cond);
    pthread_cond_destroy(&l->stop_cond);
    free(l->dir);
    free(l->join_dir);
    free(l);
}
