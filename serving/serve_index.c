/*
 * serving/serve_index.c - what the loop's files share at the bottom (they
 * call it, it calls none of them): the index of impressions logged per
 * model ((request key, row) -> time and feedback, open addressing), the
 * count of dropped impressions, the model lookup, and small file helpers
 * (reading a file whole, listing a directory's ids, splitting a segment
 * line).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

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

/* ---- files ------------------------------------------------------------------------ */

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

lp_model_t *lp_model_find(const sv_loop_t *l, const char *name)
{
    for (int i = 0; i < l->nmodels; i++)
        if (strcmp(l->models[i]->name, name) == 0)
            return l->models[i];
    return NULL;
}
