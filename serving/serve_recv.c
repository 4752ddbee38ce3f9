/*
 * serving/serve_recv.c - receiving a push: a session per PUT, and the
 * idempotency answers that make a repeated push apply once.
 *
 * A push is received in two passes. While the body streams in, every byte
 * goes to a staging file under <state-dir>/staging and through the checking
 * decoder (chunk checksums, structure, totals); memory stays one chunk. When
 * the body has ended and verified, the store takes its write lock and
 *   full:  builds the new version from the staging file, persists, swaps it
 *          in and frees the old one;
 *   delta: grows the tables for the rows the push adds (so that applying
 *          cannot fail half way), persists, and applies the file in place.
 * Readers take the read lock, so they see the old version until the swap.
 * Persisting is renaming the staging file into the label's chain and
 * rewriting chain.json (serve_chain.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve_store_int.h"

struct sv_push {
    sv_store_t *s;
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    char uid[SERVE_UID_MAX], base[SERVE_UID_MAX]; /* base "" for a full push */
    char idem[128];
    char *tmp;
    int fd;
    serve_dec_t *dec;
    int err;
    char errmsg[512];
    int64_t rows[SERVE_MAX_TABLES]; /* rows per table: an upper bound on new keys */
    uint64_t bytes;
    int64_t started_ns;
    int traffic; /* Kiln-Traffic: the label's weight if this push creates it; 0: none */
};

void sv_push_set_traffic(sv_push_t *p, int weight)
{
    p->traffic = weight;
}

/* The answer v gave to key, or NULL. */
static const sv_idem_t *idem_find(const sv_version_t *v, const char *key)
{
    for (int i = 0; v != NULL && key[0] && i < IDEM_PER_LABEL; i++)
        if (strcmp(v->idem[i].key, key) == 0)
            return &v->idem[i];
    return NULL;
}

/* Keeps ans as v's answer to key (none kept for an empty key). */
static void remember(sv_version_t *v, const char *key, const sv_pushed_t *ans)
{
    if (key[0] == '\0')
        return;
    sv_idem_t *d = &v->idem[v->nidem++ % IDEM_PER_LABEL];
    snprintf(d->key, sizeof d->key, "%s", key);
    d->ans = *ans;
}

/* Fills ans for a base conflict with v. Returns KILN_ECONFLICT. */
static int conflict(const sv_version_t *v, sv_pushed_t *ans)
{
    snprintf(ans->holds, sizeof ans->holds, "%s", v ? v->uid : "");
    return kiln_errf(KILN_ECONFLICT, "the push's base is not what this endpoint holds: send a "
                                     "full push");
}

/* Pass 1: the header must match the request. */
static int p1_header(void *ctx, const serve_model_desc_t *desc, const char *uid, const char *base)
{
    sv_push_t *p = ctx;
    if (strcmp(uid, p->uid) != 0 || strcmp(base, p->base) != 0)
        return kiln_errf(KILN_ECORRUPT, "the body is checkpoint %s on base '%s' but the headers "
                                        "say %s on '%s'",
                         uid, base, p->uid, p->base);
    return 0;
}

static int p1_rows(void *ctx, int table, int64_t n, const int64_t *keys, const float *values)
{
    sv_push_t *p = ctx;
    p->rows[table] += n;
    return 0;
}

int sv_push_begin(sv_store_t *s, const char *model, const char *label, const char *uid,
                  const char *base, const char *idem, sv_pushed_t *ans, sv_push_t **out)
{
    *ans = (sv_pushed_t){0};
    *out = NULL;
    char why[256];
    if (serve_name_check(model, why, sizeof why) < 0 ||
        serve_name_check(label, why, sizeof why) < 0)
        return kiln_errf(KILN_EUSAGE, "%s", why);
    if (uid == NULL || uid[0] == '\0' || strlen(uid) >= SERVE_UID_MAX || base == NULL ||
        strlen(base) >= SERVE_UID_MAX)
        return kiln_errf(KILN_EUSAGE, "a push needs the headers Kiln-Checkpoint: <uid> and "
                                      "Kiln-Base: <uid>|none");
    if (idem != NULL && strlen(idem) >= 128)
        return kiln_errf(KILN_EUSAGE, "Idempotency-Key is longer than 127 characters");
    bool full = strcmp(base, "none") == 0;
    pthread_rwlock_rdlock(&s->lock);
    const sv_version_t *v = sv_version_find(s, model, label);
    const sv_idem_t *seen = idem_find(v, idem ? idem : "");
    int rc = 0;
    if (seen != NULL) {
        *ans = seen->ans;
        rc = 1;
    } else if (!full && (v == NULL || strcmp(v->uid, base) != 0)) {
        rc = conflict(v, ans);
    }
    pthread_rwlock_unlock(&s->lock);
    if (rc != 0)
        return rc;

    sv_push_t *p = kiln_calloc(1, sizeof *p);
    if (p == NULL)
        return KILN_ENOMEM;
    p->s = s;
    p->fd = -1;
    p->started_ns = kiln_mono_ns();
    snprintf(p->model, sizeof p->model, "%s", model);
    snprintf(p->label, sizeof p->label, "%s", label);
    snprintf(p->uid, sizeof p->uid, "%s", uid);
    snprintf(p->base, sizeof p->base, "%s", full ? "" : base);
    snprintf(p->idem, sizeof p->idem, "%s", idem ? idem : "");
    pthread_mutex_lock(&s->stats_lock);
    int64_t seq = ++s->staging_seq;
    pthread_mutex_unlock(&s->stats_lock);
    p->tmp = kiln_asprintf("%s/staging/%lld-%lld.part", s->dir, (long long)getpid(),
                           (long long)seq);
    static const serve_dec_cb_t cb = {p1_header, p1_rows, NULL, NULL, NULL};
    if (p->tmp == NULL || serve_dec_create(&cb, p, 0, &p->dec) < 0) {
        sv_push_abort(p);
        return kiln_errf(KILN_ENOMEM, "out of memory");
    }
    p->fd = open(p->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (p->fd < 0) {
        rc = kiln_errf(KILN_EIO, "cannot stage the push: %s: %s", p->tmp, strerror(errno));
        sv_push_abort(p);
        return rc;
    }
    *out = p;
    return 0;
}

void sv_push_feed(sv_push_t *p, const void *data, size_t len)
{
    if (p->err < 0 || len == 0)
        return;
    p->bytes += len;
    int rc = serve_dec_feed(p->dec, data, len);
    if (rc == 0) {
        const unsigned char *q = data;
        size_t left = len;
        while (left > 0) {
            ssize_t w = write(p->fd, q, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                rc = kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO,
                               "cannot stage the push in %s: %s", p->tmp, strerror(errno));
                break;
            }
            q += w;
            left -= (size_t)w;
        }
    }
    if (rc < 0) {
        p->err = rc;
        snprintf(p->errmsg, sizeof p->errmsg, "%s", kiln_errmsg());
    }
}

void sv_push_abort(sv_push_t *p)
{
    if (p == NULL)
        return;
    if (p->fd >= 0)
        close(p->fd);
    if (p->tmp != NULL)
        unlink(p->tmp);
    free(p->tmp);
    serve_dec_destroy(p->dec);
    free(p);
}

/* Moves the verified staging file into dir as the next file of target's
 * chain and records it there. Returns 0, KILN_EIO or KILN_ENOMEM (the file
 * is not in the chain then). */
static int persist(sv_push_t *p, sv_version_t *target, const char *dir, char **dest /* OUT */)
{
    char *name = kiln_asprintf("%08lld.kpush", (long long)target->next_seq);
    *dest = kiln_asprintf("%s/%s", dir, name ? name : "");
    if (name == NULL || *dest == NULL || rename(p->tmp, *dest) != 0) {
        int rc = kiln_errf(KILN_EIO, "cannot persist the push as %s: %s", *dest ? *dest : name,
                           strerror(errno));
        free(name);
        free(*dest);
        *dest = NULL;
        return rc;
    }
    if (kiln_fsync_dir(dir) < 0) {
        unlink(*dest);
        free(name);
        free(*dest);
        *dest = NULL;
        return kiln_errf(KILN_EIO, "cannot persist the push: %s", kiln_errmsg());
    }
    char **files = kiln_reallocarray(target->files, (size_t)target->nfiles + 1, sizeof *files);
    if (files == NULL) {
        unlink(*dest);
        free(name);
        free(*dest);
        *dest = NULL;
        return kiln_errf(KILN_ENOMEM, "out of memory");
    }
    target->files = files;
    target->files[target->nfiles++] = name;
    target->next_seq++;
    return 0;
}

/* Whether $KILN_TEST_APPLY_FAIL names uid: the tests' way to make a delta
 * fail after it was applied to the version in memory (a disk failure while
 * reading the file again, which they cannot cause). */
static bool test_apply_fails(const char *uid)
{
    const char *t = getenv("KILN_TEST_APPLY_FAIL");
    return t != NULL && strcmp(t, uid) == 0;
}

/* Under the write lock: a full push's built version is made to take v's
 * place (v may be NULL), keeping its sequence and idempotency answers; a
 * delta grows v's tables for its rows. Then the push file is persisted and,
 * for a delta, applied to v. *dest receives the persisted file's path (to
 * remove if the push is not committed). Returns 0 or a KILN_E* code; a
 * delta that failed to apply may have changed v (the caller loads it again
 * from disk). */
static int apply_locked(sv_push_t *p, sv_version_t *v, sv_version_t *built, const char *dir,
                        char **dest /* OUT */)
{
    bool full = built != NULL;
    if (full) {
        snprintf(built->model, sizeof built->model, "%s", p->model);
        snprintf(built->label, sizeof built->label, "%s", p->label);
        built->next_seq = v ? v->next_seq : 0;
    } else {
        /* Grow first, so that applying cannot fail half way for memory. */
        for (int t = 0; t < v->desc.ntables; t++)
            if (p->rows[t] > 0 && serve_table_reserve(v->tables[t], p->rows[t]) < 0)
                return kiln_errf(KILN_ENOMEM, "not enough memory for the delta's rows");
    }
    sv_version_t *target = full ? built : v;
    KILN_CHECK(persist(p, target, dir, dest));
    if (full) {
        /* A copy: v keeps its answers until the new version is committed. */
        if (v != NULL) {
            memcpy(built->idem, v->idem, sizeof built->idem);
            built->nidem = v->nidem;
        }
    } else {
        char uid[SERVE_UID_MAX];
        int rc = sv_chain_apply(*dest, false, &v, uid);
        if (rc == 0 && test_apply_fails(p->uid))
            rc = kiln_errf(KILN_EIO, "the test's fault (KILN_TEST_APPLY_FAIL)");
        if (rc < 0) /* verified in pass 1: a disk failure */
            return kiln_errf(rc, "applying %s after it verified failed: %s", *dest,
                             kiln_errmsg());
    }
    snprintf(target->uid, sizeof target->uid, "%s", p->uid);
    target->applied_at = kiln_now_ms();
    return 0;
}

/* After a push that was persisted but not committed: its file goes, and a
 * delta's version, which applying may have changed, is loaded again from
 * the chain on disk (the version before the push). */
static void undo_locked(sv_push_t *p, const char *dest, bool full)
{
    if (dest != NULL)
        unlink(dest);
    if (!full && sv_version_reload(p->s, p->model, p->label) < 0)
        KILN_ERROR("%s/%s: %s", p->model, p->label, kiln_errmsg());
}

int sv_push_end(sv_push_t *p, sv_pushed_t *ans)
{
    sv_store_t *s = p->s;
    char *dir = NULL, *dest = NULL, **old = NULL;
    int nold = 0;
    bool locked = false;
    sv_version_t *built = NULL;
    *ans = (sv_pushed_t){0};
    int rc = p->err;
    if (rc == 0 && (rc = serve_dec_finish(p->dec)) < 0)
        snprintf(p->errmsg, sizeof p->errmsg, "%s", kiln_errmsg());
    if (rc == 0 && fsync(p->fd) != 0) {
        rc = KILN_EIO;
        snprintf(p->errmsg, sizeof p->errmsg, "fsync %s: %s", p->tmp, strerror(errno));
    }
    if (rc < 0) {
        rc = kiln_errf(rc, "%s", p->errmsg);
        goto out;
    }
    close(p->fd);
    p->fd = -1;

    /* A full push builds its version from the staging file before taking the
     * write lock: readers wait only for the swap (and a delta's apply). */
    bool full = p->base[0] == '\0';
    if (full) {
        char uid[SERVE_UID_MAX];
        KILN_CHECK_GOTO(sv_chain_apply(p->tmp, true, &built, uid), rc, out);
    }

    pthread_rwlock_wrlock(&s->lock);
    locked = true;
    sv_version_t *v = sv_version_find(s, p->model, p->label);
    const sv_idem_t *seen = idem_find(v, p->idem);
    if (seen != NULL) { /* the same push finished on another connection meanwhile */
        *ans = seen->ans;
        goto out;
    }
    if (!full && (v == NULL || strcmp(v->uid, p->base) != 0)) {
        rc = conflict(v, ans);
        goto out;
    }
    dir = sv_label_dir(s, p->model, p->label);
    rc = dir == NULL ? KILN_ENOMEM : 0;
    if (rc == 0 && full)
        rc = sv_broken_set_aside(s, p->model, p->label);
    if (rc == 0)
        rc = kiln_mkdir_p(dir);
    if (rc == 0) {
        rc = apply_locked(p, v, built, dir, &dest);
        if (rc < 0 && dest != NULL)
            undo_locked(p, dest, full);
    }
    if (rc < 0)
        goto out;
    sv_version_t *target = full ? built : v;
    snprintf(ans->model, sizeof ans->model, "%s", p->model);
    snprintf(ans->label, sizeof ans->label, "%s", p->label);
    snprintf(ans->uid, sizeof ans->uid, "%s", p->uid);
    snprintf(ans->base, sizeof ans->base, "%s", full ? "none" : p->base);
    ans->rows = sv_version_rows(target);
    ans->applied_at = target->applied_at;
    ans->bytes = p->bytes;
    ans->full = full;
    remember(target, p->idem, ans);
    /* The commit: until chain.json names the push, it is not applied, and
     * the chain it replaces is what a restart loads. */
    if (sv_chain_write(s, target) < 0) {
        rc = kiln_errf(KILN_EIO, "the push could not be committed, so it is not applied (%s "
                                 "still holds %s): %s; free space or fix the state directory, "
                                 "then push again",
                       dir, v != NULL ? p->base[0] ? p->base : "its version" : "nothing",
                       kiln_errmsg());
        undo_locked(p, dest, full);
        *ans = (sv_pushed_t){0};
        goto out;
    }
    if (!full)
        sv_chain_compact(s, target, dir);
    if (full) {
        /* Committed: the old chain's files go once the new version is in. */
        if (v != NULL) {
            old = v->files;
            nold = v->nfiles;
            v->files = NULL;
            v->nfiles = 0;
        }
        if (sv_version_install(s, built) < 0) {
            if (v != NULL) {
                v->files = old;
                v->nfiles = nold;
                old = NULL;
                nold = 0;
            }
            rc = kiln_errf(KILN_ENOMEM, "out of memory");
            goto out;
        }
        built = NULL;
        for (int i = 0; i < nold; i++) {
            char *op = kiln_asprintf("%s/%s", dir, old[i]);
            if (op != NULL && strcmp(old[i], target->files[0]) != 0)
                unlink(op);
            free(op);
        }
    }
    if (v == NULL && p->traffic > 0) /* the label's first version: the spec's share */
        sv_split_grant_locked(s, p->model, p->label, p->traffic);
    s->pushes_applied++;
    KILN_INFO("applied %s push of %s to %s/%s in %.1f ms (%llu bytes, %lld rows now)",
              full ? "full" : "delta", p->uid, p->model, p->label,
              (double)(kiln_mono_ns() - p->started_ns) / 1e6, (unsigned long long)p->bytes,
              (long long)ans->rows);
out:
    if (rc < 0)
        s->pushes_rejected++;
    if (locked)
        pthread_rwlock_unlock(&s->lock);
    kiln_strv_free(old, (size_t)nold);
    sv_version_destroy(built);
    free(dir);
    free(dest);
    sv_push_abort(p);
    return rc;
}
