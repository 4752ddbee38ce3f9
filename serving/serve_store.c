/*
 * serving/serve_store.c - kiln-serve's version store: the versions it holds
 * for each (model, label) (tables in serve_table, the dense model as the
 * trainer's own model_t), the state directory they persist in and its
 * lock, loading them at start, and the labels that could not be loaded.
 *
 * The store's other jobs each have a file: a version in memory
 * (serve_version.c), a version's files on disk (serve_chain.c), receiving a
 * push (serve_recv.c), the reads (serve_query.c).
 * A state directory holds models/<model>/<label>/ (a version's chain,
 * serve_chain.c), staging/ (pushes being received) and broken/ (labels a
 * full push replaced while they could not be loaded) and splits.json (the
 * models' traffic splits, serve_split.c); see
 * docs/serving-protocol.md, "On disk".
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "serve_store_int.h"

static bool good_name(const char *s)
{
    return serve_name_check(s, NULL, 0) == 0;
}

/* ---- versions ---------------------------------------------------------------------- */

int sv_version_install(sv_store_t *s, sv_version_t *v)
{
    for (int i = 0; i < s->nv; i++)
        if (strcmp(s->v[i]->model, v->model) == 0 && strcmp(s->v[i]->label, v->label) == 0) {
            sv_version_destroy(s->v[i]);
            s->v[i] = v;
            return 0;
        }
    if (s->nv == s->capv) {
        int cap = s->capv ? 2 * s->capv : 8;
        sv_version_t **p = kiln_reallocarray(s->v, (size_t)cap, sizeof *p);
        if (p == NULL)
            return KILN_ENOMEM;
        s->v = p;
        s->capv = cap;
    }
    s->v[s->nv++] = v;
    return 0;
}

/* Whether name is a temporary file of kiln_atomic_* ("<file>.tmp.<pid>"). */
static bool is_atomic_temp(const char *name)
{
    const char *t = strstr(name, ".tmp.");
    if (t == NULL || t == name)
        return false;
    const char *d = t + 5;
    if (*d == '\0')
        return false;
    while (*d >= '0' && *d <= '9')
        d++;
    return *d == '\0';
}

/* Removes what a kiln-serve stopped mid-write left in a label's directory:
 * the temporary files of atomic writes (chain.json, compaction). The state
 * directory is locked by this process, so no write of them is in flight. */
static void drop_stale_temps(const sv_store_t *s, const char *model, const char *label)
{
    char *dir = kiln_asprintf("%s/models/%s/%s", s->dir, model, label);
    DIR *d = dir != NULL ? opendir(dir) : NULL;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        if (!is_atomic_temp(e->d_name))
            continue;
        char *p = kiln_asprintf("%s/%s", dir, e->d_name);
        if (p != NULL && unlink(p) == 0)
            KILN_INFO("removed %s, left by a write that did not finish", p);
        free(p);
    }
    if (d != NULL)
        closedir(d);
    free(dir);
}

/* Loads model/label's directory and installs its version (a directory
 * without chain.json is skipped). */
static int load_label(sv_store_t *s, const char *model, const char *label)
{
    drop_stale_temps(s, model, label);
    sv_version_t *v = NULL;
    int rc = sv_chain_load(s, model, label, &v);
    if (rc < 0 || v == NULL)
        return rc;
    KILN_INFO("loaded %s/%s: checkpoint %s, %lld rows, %d push file(s)", model, label, v->uid,
              (long long)sv_version_rows(v), v->nfiles);
    rc = sv_version_install(s, v);
    if (rc < 0)
        sv_version_destroy(v);
    return rc;
}

/* Takes <dir>/lock (flock, released when the process ends however it ends)
 * and writes this pid into it; a second kiln-serve on the same directory
 * would delete the first one's staging files and race its chain.json. */
static int lock_state_dir(sv_store_t *s)
{
    char *path = kiln_asprintf("%s/lock", s->dir);
    if (path == NULL)
        return KILN_ENOMEM;
    int rc = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = kiln_errf(KILN_EIO, "cannot open %s: %s", path, strerror(errno));
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char pid[24] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        rc = err == EWOULDBLOCK
                 ? kiln_errf(KILN_EBUSY, "--state-dir %s is in use by another kiln-serve "
                                         "(pid %s); stop that one or give this one its own "
                                         "--state-dir",
                             s->dir, pid[0] ? pid : "unknown")
                 : kiln_errf(KILN_EIO, "cannot lock %s: %s", path, strerror(err));
        close(fd);
    } else {
        char pid[24];
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
            KILN_WARN("cannot write the pid into %s: %s", path, strerror(errno));
        s->lock_fd = fd;
    }
    free(path);
    return rc;
}

/* Records model/label as broken with error (the log says it once). */
static int mark_broken(sv_store_t *s, const char *model, const char *label, const char *error)
{
    sv_broken_t *b = kiln_reallocarray(s->broken, (size_t)s->nbroken + 1, sizeof *b);
    if (b == NULL)
        return KILN_ENOMEM;
    s->broken = b;
    b += s->nbroken;
    snprintf(b->model, sizeof b->model, "%.63s", model); /* good names: < 64 */
    snprintf(b->label, sizeof b->label, "%.63s", label);
    b->error = kiln_strdup(error);
    if (b->error == NULL)
        return KILN_ENOMEM;
    s->nbroken++;
    KILN_ERROR("%s/%s is not served: %s (its files stay as they are for inspection; a full push "
               "to it replaces it)",
               model, label, error);
    return 0;
}

int sv_version_reload(sv_store_t *s, const char *model, const char *label)
{
    char m[SERVE_NAME_MAX], l[SERVE_NAME_MAX]; /* model and label may be the version's */
    snprintf(m, sizeof m, "%s", model);
    snprintf(l, sizeof l, "%s", label);
    sv_version_t *v = NULL;
    int rc = sv_chain_load(s, m, l, &v);
    if (rc == 0 && v != NULL) {
        KILN_WARN("%s/%s: back to checkpoint %s, as its chain on disk has it", m, l, v->uid);
        rc = sv_version_install(s, v);
        if (rc < 0)
            sv_version_destroy(v);
        return rc;
    }
    char *why = kiln_strdup(rc < 0 ? kiln_errmsg() : "its directory has no chain.json");
    for (int i = 0; i < s->nv; i++)
        if (strcmp(s->v[i]->model, m) == 0 && strcmp(s->v[i]->label, l) == 0) {
            sv_version_destroy(s->v[i]);
            s->v[i] = s->v[--s->nv];
            break;
        }
    rc = mark_broken(s, m, l, why != NULL ? why : "out of memory");
    free(why);
    return rc;
}

const sv_broken_t *sv_broken_find(const sv_store_t *s, const char *model, const char *label)
{
    for (int i = 0; i < s->nbroken; i++)
        if (strcmp(s->broken[i].model, model) == 0 && strcmp(s->broken[i].label, label) == 0)
            return &s->broken[i];
    return NULL;
}

int sv_broken_set_aside(sv_store_t *s, const char *model, const char *label)
{
    const sv_broken_t *b = sv_broken_find(s, model, label);
    if (b == NULL)
        return 0;
    char *from = sv_label_dir(s, model, label);
    char *parent = kiln_asprintf("%s/broken/%s", s->dir, model);
    char *to = kiln_asprintf("%s/broken/%s/%s.%lld", s->dir, model, label,
                             (long long)kiln_now_ms());
    int rc = 0;
    if (from == NULL || parent == NULL || to == NULL) {
        rc = KILN_ENOMEM;
    } else if ((rc = kiln_mkdir_p(parent)) == 0 && rename(from, to) != 0 && errno != ENOENT) {
        rc = kiln_errf(KILN_EIO, "cannot move the broken version %s/%s aside to %s: %s", model,
                       label, to, strerror(errno));
    }
    if (rc == 0) {
        KILN_WARN("%s/%s: a full push replaces the broken version; its files are kept in %s",
                  model, label, to);
        int i = (int)(b - s->broken);
        free(s->broken[i].error);
        s->broken[i] = s->broken[--s->nbroken];
    }
    KILN_FREE_ALL(from, parent, to);
    return rc;
}

int sv_store_open(const char *state_dir, sv_store_t **out)
{
    sv_store_t *s = kiln_calloc(1, sizeof *s);
    if (s == NULL)
        return KILN_ENOMEM;
    s->lock_fd = -1;
    pthread_rwlock_init(&s->lock, NULL);
    pthread_mutex_init(&s->stats_lock, NULL);
    s->dir = kiln_strdup(state_dir);
    char *staging = kiln_asprintf("%s/staging", state_dir);
    char *models = kiln_asprintf("%s/models", state_dir);
    char *spill = kiln_asprintf("%s/spill", state_dir);
    int rc = 0;
    if (s->dir == NULL || staging == NULL || models == NULL || spill == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(kiln_mkdir_p(staging), rc, out);
    KILN_CHECK_GOTO(kiln_mkdir_p(models), rc, out);
    KILN_CHECK_GOTO(kiln_mkdir_p(spill), rc, out);
    KILN_CHECK_GOTO(lock_state_dir(s), rc, out);
    /* Staging files are pushes that never finished, spill files (the disk
     * tier of tables past --table-memory) scratch of a kiln-serve gone:
     * drop them. */
    for (int k = 0; k < 2; k++) {
        const char *sub = k == 0 ? staging : spill;
        DIR *dd = opendir(sub);
        for (struct dirent *e; dd != NULL && (e = readdir(dd)) != NULL;) {
            if (e->d_name[0] == '.')
                continue;
            char *p = kiln_asprintf("%s/%s", sub, e->d_name);
            if (p != NULL)
                unlink(p);
            free(p);
        }
        if (dd != NULL)
            closedir(dd);
    }
    DIR *md = opendir(models);
    for (struct dirent *m; rc == 0 && md != NULL && (m = readdir(md)) != NULL;) {
        if (!good_name(m->d_name))
            continue;
        char *mp = kiln_asprintf("%s/%s", models, m->d_name);
        DIR *ld = mp ? opendir(mp) : NULL;
        /* A label that cannot be loaded is reported, not fatal: the others
         * are served. */
        for (struct dirent *l; rc == 0 && ld != NULL && (l = readdir(ld)) != NULL;)
            if (good_name(l->d_name) && load_label(s, m->d_name, l->d_name) < 0)
                rc = mark_broken(s, m->d_name, l->d_name, kiln_errmsg());
        if (ld != NULL)
            closedir(ld);
        free(mp);
    }
    if (md != NULL)
        closedir(md);
    if (rc == 0)
        rc = sv_split_load(s);
out:
    free(staging);
    free(models);
    free(spill);
    if (rc < 0) {
        sv_store_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sv_store_close(sv_store_t *s)
{
    if (s == NULL)
        return;
    for (int i = 0; i < s->nv; i++)
        sv_version_destroy(s->v[i]);
    free(s->v);
    for (int i = 0; i < s->nbroken; i++)
        free(s->broken[i].error);
    free(s->broken);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    free(s->dir);
    pthread_rwlock_destroy(&s->lock);
    pthread_mutex_destroy(&s->stats_lock);
    free(s);
}
