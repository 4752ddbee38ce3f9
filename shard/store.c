/*
 * shard/store.c - shard.h: the host store, the twin working copy (the
 * CPU stand-in for the GPU) and the mirror protocol (sync, upload) that the
 * twin and the CUDA working copy (store_cuda.cu) share.
 */
#include "shard.h"

#include <stdlib.h>
#include <string.h>

#include "shard_int.h"

struct shard_store {
    shard_store_kind_t kind;
    int ntables;
    kern_table_t **mirror;  /* (ntables) borrowed host tables */
    shard_store_work_t *work;  /* TWIN, CUDA: the working copy; NULL for HOST */
    int64_t synced;         /* step of the last sync or upload; -1 before any */
    int64_t *keys_scratch;  /* sync: evicted keys */
    int64_t keys_cap;
};

const char *shard_store_kind_name(shard_store_kind_t kind)
{
    return kind == SHARD_STORE_CUDA ? "cuda" : kind == SHARD_STORE_TWIN ? "twin" : "host";
}

/* ---- the twin: a second set of host tables --------------------------------------------- */

typedef struct {
    shard_store_work_t base;
    int ntables;
    kern_table_t **tables;
    /* changed: scratch for the rows taken out */
    int32_t *rows;
    int64_t *keys;
    float *values, *opt;
    uint32_t *steps;
    int64_t cap;     /* rows the scratch holds */
    int dmax, smax;  /* the largest dim and nstate of the tables (sizes the scratch) */
} twin_t;

static void twin_destroy(shard_store_work_t *w)
{
    twin_t *tw = (twin_t *)w;
    for (int t = 0; tw->tables && t < tw->ntables; t++)
        kern_table_destroy(tw->tables[t]);
    KILN_FREE_ALL(tw->tables, tw->rows, tw->keys, tw->values, tw->opt, tw->steps);
    free(tw);
}

static int64_t twin_rows_bound(const shard_store_work_t *w, int t)
{
    return kern_table_capacity(((const twin_t *)w)->tables[t]);
}

static int64_t twin_size(const shard_store_work_t *w, int t)
{
    return kern_table_size(((const twin_t *)w)->tables[t]);
}

static int host_find(kern_table_t *tb, int64_t n, const int64_t *keys, int64_t step, bool insert,
                     int32_t *rows)
{
    if (insert)
        return kern_table_find_or_insert(tb, n, keys, step, rows);
    return kern_table_fetch(tb, n, keys, step, rows); /* brings rows in from disk */
}

static int host_read(kern_table_t *tb, int64_t n, const int32_t *rows, float *out)
{
    kern_slab_t slab;
    kern_table_slab(tb, &slab);
    const int dim = slab.dim;
    if (dim == 1) {
        for (int64_t i = 0; i < n; i++)
            out[i] = rows[i] >= 0 ? slab.values[rows[i]] : 0.0f;
        return 0;
    }
#pragma omp parallel for schedule(static) if (n > 4096)
    for (int64_t i = 0; i < n; i++) {
        if (rows[i] >= 0)
            memcpy(out + i * dim, slab.values + (int64_t)rows[i] * dim,
                   sizeof(float) * (size_t)dim);
        else
            memset(out + i * dim, 0, sizeof(float) * (size_t)dim);
    }
    return 0;
}

static int host_update(kern_table_t *const *tables, int ntables, const kern_opt_t *opt,
                       const kern_row_grads_t *ug, int64_t step)
{
    kern_slab_t *slabs = kiln_calloc((size_t)ntables, sizeof *slabs);
    if (slabs == NULL)
        return KILN_ENOMEM;
    for (int t = 0; t < ntables; t++)
        kern_table_slab(tables[t], &slabs[t]);
    int rc = kern_cpu_sparse_update(opt, ntables, slabs, ug, step);
    /* Tables are independent: remember their changed rows in parallel. */
    if (rc == 0) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int t = 0; t < ntables; t++)
            kern_table_mark_changed(tables[t], ug[t].n, ug[t].rows);
    }
    free(slabs);
    return rc;
}

static int twin_find(shard_store_work_t *w, int t, int64_t n, const int64_t *keys, int64_t step,
                     bool insert, int32_t *rows)
{
    return host_find(((twin_t *)w)->tables[t], n, keys, step, insert, rows);
}

static int twin_read(shard_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out)
{
    return host_read(((twin_t *)w)->tables[t], n, rows, out);
}

static int twin_update(shard_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug,
                       int64_t step)
{
    twin_t *tw = (twin_t *)w;
    return host_update(tw->tables, tw->ntables, opt, ug, step);
}

/* host_find for every table, table t's keys at keys[off[t] .. off[t + 1]),
 * up to the first that fails. */
static int host_find_all(kern_table_t *const *tables, int ntables, const int64_t *off,
                         const int64_t *keys, int64_t step, bool insert, int32_t *rows)
{
    for (int t = 0; t < ntables; t++)
        if (off[t + 1] > off[t])
            KILN_CHECK(host_find(tables[t], off[t + 1] - off[t], keys + off[t], step, insert,
                                 rows + off[t]));
    return 0;
}

static int twin_find_dev(shard_store_work_t *w, const int64_t *off, const int64_t *keys,
                         int64_t step, bool insert, int32_t *rows, void *stream)
{
    (void)stream; /* the twin's memory is host memory: the host calls */
    const twin_t *tw = (const twin_t *)w;
    return host_find_all(tw->tables, tw->ntables, off, keys, step, insert, rows);
}

static int twin_read_dev(shard_store_work_t *w, int t, int64_t n, const int32_t *rows, float *out,
                         void *stream)
{
    (void)stream;
    return twin_read(w, t, n, rows, out);
}

static int twin_update_dev(shard_store_work_t *w, const kern_opt_t *opt, const kern_row_grads_t *ug,
                           int64_t step, void *stream)
{
    (void)stream;
    return twin_update(w, opt, ug, step);
}

static int twin_evicted(shard_store_work_t *w, int t, const kern_evicted_t **log, int64_t *n)
{
    *log = kern_table_evicted(((twin_t *)w)->tables[t], n);
    return 0;
}

static void twin_evicted_clear(shard_store_work_t *w, int t)
{
    kern_table_evicted_clear(((twin_t *)w)->tables[t]);
}

static int twin_scratch(twin_t *tw, int64_t n)
{
    if (n <= tw->cap)
        return 0;
    const size_t dim = (size_t)tw->dmax, nstate = (size_t)(tw->smax ? tw->smax : 1);
    free(tw->rows);
    free(tw->keys);
    free(tw->values);
    free(tw->opt);
    free(tw->steps);
    tw->rows = kiln_malloc(sizeof(int32_t) * (size_t)n);
    tw->keys = kiln_malloc(sizeof(int64_t) * (size_t)n);
    tw->values = kiln_malloc(sizeof(float) * (size_t)n * dim);
    tw->opt = kiln_malloc(sizeof(float) * (size_t)n * dim * nstate);
    tw->steps = kiln_malloc(sizeof(uint32_t) * (size_t)n);
    tw->cap = tw->rows && tw->keys && tw->values && tw->opt && tw->steps ? n : 0;
    return tw->cap ? 0 : KILN_ENOMEM;
}

static int twin_changed(shard_store_work_t *w, int t, int64_t since, int64_t step,
                        shard_store_rows_t *out)
{
    twin_t *tw = (twin_t *)w;
    kern_table_t *tb = tw->tables[t];
    kern_slab_t sl;
    kern_table_slab(tb, &sl);
    int64_t n = 0;
    KILN_CHECK(twin_scratch(tw, kern_table_size(tb)));
    KILN_CHECK(kern_table_changed_since(tb, since, tw->rows, tw->cap, &n));
    const size_t dim = (size_t)sl.dim, sdim = (size_t)sl.nstate * dim;
    const int64_t *keys = kern_table_keys(tb);
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = tw->rows[i];
        tw->keys[i] = keys[r];
        memcpy(tw->values + (size_t)i * dim, sl.values + (size_t)r * dim, sizeof(float) * dim);
        if (sl.opt_state)
            memcpy(tw->opt + (size_t)i * sdim, sl.opt_state + (size_t)r * sdim,
                   sizeof(float) * sdim);
        if (sl.opt_steps)
            tw->steps[i] = sl.opt_steps[r];
    }
    /* The next sync asks for rows changed after step: keep the change
     * list to those (O(changed) per sync, not O(table)). */
    kern_table_set_base(tb, step);
    *out = (shard_store_rows_t){.n = n,
                             .keys = tw->keys,
                             .values = tw->values,
                             .opt = sl.opt_state ? tw->opt : NULL,
                             .steps = sl.opt_steps ? tw->steps : NULL};
    return 0;
}

static int twin_insert(shard_store_work_t *w, int t, const shard_store_rows_t *rows, int64_t step)
{
    return kern_table_insert_rows(((twin_t *)w)->tables[t], rows->n, rows->keys, rows->values,
                                  rows->opt, rows->steps, step);
}

static const shard_store_work_ops_t twin_ops = {
    .destroy = twin_destroy,
    .rows_bound = twin_rows_bound,
    .size = twin_size,
    .find = twin_find,
    .read = twin_read,
    .update = twin_update,
    .find_dev = twin_find_dev,
    .read_dev = twin_read_dev,
    .update_dev = twin_update_dev,
    .evicted = twin_evicted,
    .evicted_clear = twin_evicted_clear,
    .changed = twin_changed,
    .insert = twin_insert,
    .parallel = true,
};

static int twin_create(int ntables, const kern_table_config_t *cfgs, shard_store_work_t **out)
{
    twin_t *tw = kiln_calloc(1, sizeof *tw);
    if (tw == NULL)
        return KILN_ENOMEM;
    tw->base.ops = &twin_ops;
    tw->ntables = ntables;
    tw->tables = kiln_calloc((size_t)ntables, sizeof *tw->tables);
    if (tw->tables == NULL) {
        twin_destroy(&tw->base);
        return KILN_ENOMEM;
    }
    tw->dmax = 1;
    for (int t = 0; t < ntables; t++) {
        int rc = kern_table_create(&cfgs[t], &tw->tables[t]);
        if (rc < 0) {
            twin_destroy(&tw->base);
            return rc;
        }
        int ns = cfgs[t].opt == KERN_OPT_SGD ? 0 : cfgs[t].opt == KERN_OPT_ADAGRAD ? 1 : 2;
        tw->dmax = cfgs[t].dim > tw->dmax ? cfgs[t].dim : tw->dmax;
        tw->smax = ns > tw->smax ? ns : tw->smax;
    }
    *out = &tw->base;
    return 0;
}

/* ---- the store ---------------------------------------------------------------------------- */

int shard_store_create(shard_store_kind_t kind, int ntables, kern_table_t *const *mirror,
                    const kern_table_config_t *cfgs, int device, shard_store_t **out)
{
    *out = NULL;
    shard_store_t *s = kiln_calloc(1, sizeof *s);
    if (s == NULL)
        return KILN_ENOMEM;
    s->kind = kind;
    s->ntables = ntables;
    s->synced = -1;
    s->mirror = kiln_calloc((size_t)(ntables > 0 ? ntables : 1), sizeof *s->mirror);
    if (s->mirror == NULL) {
        shard_store_destroy(s);
        return KILN_ENOMEM;
    }
    memcpy(s->mirror, mirror, sizeof *s->mirror * (size_t)ntables);
    int rc = 0;
    if (kind == SHARD_STORE_TWIN) {
        (void)device;
        rc = twin_create(ntables, cfgs, &s->work);
    } else if (kind == SHARD_STORE_CUDA) {
#if KILN_HAVE_CUDA
        rc = shard_store_cuda_create(ntables, cfgs, device, &s->work);
#else
        (void)device;
        rc = kiln_errf(KILN_EINVAL, "this kiln-train was built without CUDA: rebuild with "
                                    "-DKILN_CUDA=ON on a host with nvcc, or set device: cpu");
#endif
    }
    if (rc < 0) {
        shard_store_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void shard_store_destroy(shard_store_t *s)
{
    if (s == NULL)
        return;
    if (s->work)
        s->work->ops->destroy(s->work);
    free(s->mirror);
    free(s->keys_scratch);
    free(s);
}

bool shard_store_parallel(const shard_store_t *s)
{
    return s->work == NULL || s->work->ops->parallel;
}

int64_t shard_store_rows_bound(const shard_store_t *s, int t)
{
    return s->work ? s->work->ops->rows_bound(s->work, t) : kern_table_capacity(s->mirror[t]);
}

int64_t shard_store_size(const shard_store_t *s, int t)
{
    return s->work ? s->work->ops->size(s->work, t) : kern_table_size(s->mirror[t]);
}

int shard_store_find(shard_store_t *s, int t, int64_t n, const int64_t *keys, int64_t step, bool insert,
                  int32_t *rows)
{
    if (s->work)
        return s->work->ops->find(s->work, t, n, keys, step, insert, rows);
    return host_find(s->mirror[t], n, keys, step, insert, rows);
}

void shard_store_unpin(shard_store_t *s, int64_t step)
{
    if (s->work)
        return; /* the twin and the GPU hold every row */
    for (int t = 0; t < s->ntables; t++)
        kern_table_unpin(s->mirror[t], step);
}

int shard_store_read(shard_store_t *s, int t, int64_t n, const int32_t *rows, float *out)
{
    if (s->work)
        return s->work->ops->read(s->work, t, n, rows, out);
    return host_read(s->mirror[t], n, rows, out);
}

int shard_store_update(shard_store_t *s, const kern_opt_t *opt, const kern_row_grads_t *ug,
                    int64_t step)
{
    if (s->work)
        return s->work->ops->update(s->work, opt, ug, step);
    return host_update(s->mirror, s->ntables, opt, ug, step);
}

bool shard_store_on_host(const shard_store_t *s) { return s->work == NULL; }

int shard_store_update_table(shard_store_t *s, const kern_opt_t *opt, int t,
                             const kern_row_grads_t *ug, int64_t step)
{
    kern_slab_t slab;
    kern_table_slab(s->mirror[t], &slab);
    KILN_CHECK(kern_cpu_sparse_update_table(opt, t, &slab, ug, step));
    kern_table_mark_changed(s->mirror[t], ug->n, ug->rows);
    return 0;
}

int shard_store_find_dev(shard_store_t *s, const int64_t *off, const int64_t *keys, int64_t step,
                         bool insert, int32_t *rows, void *stream)
{
    if (s->work)
        return s->work->ops->find_dev(s->work, off, keys, step, insert, rows, stream);
    return host_find_all(s->mirror, s->ntables, off, keys, step, insert, rows);
}

int shard_store_read_dev(shard_store_t *s, int t, int64_t n, const int32_t *rows, float *out,
                      void *stream)
{
    if (s->work)
        return s->work->ops->read_dev(s->work, t, n, rows, out, stream);
    return host_read(s->mirror[t], n, rows, out);
}

int shard_store_update_dev(shard_store_t *s, const kern_opt_t *opt, const kern_row_grads_t *ug,
                        int64_t step, void *stream)
{
    if (s->work)
        return s->work->ops->update_dev(s->work, opt, ug, step, stream);
    return host_update(s->mirror, s->ntables, opt, ug, step);
}

int shard_store_sync(shard_store_t *s, int64_t step)
{
    if (s->work == NULL)
        return 0;
    const shard_store_work_ops_t *ops = s->work->ops;
    for (int t = 0; t < s->ntables; t++) {
        /* Deletions first: a key evicted and inserted again since the last
         * sync is in both lists, and its row must survive. */
        const kern_evicted_t *log;
        int64_t ne = 0;
        KILN_CHECK(ops->evicted(s->work, t, &log, &ne));
        if (ne > s->keys_cap) {
            free(s->keys_scratch);
            s->keys_scratch = kiln_malloc(sizeof(int64_t) * (size_t)ne);
            s->keys_cap = s->keys_scratch ? ne : 0;
            if (s->keys_scratch == NULL)
                return KILN_ENOMEM;
        }
        for (int64_t i = 0; i < ne; i++)
            s->keys_scratch[i] = log[i].key;
        KILN_CHECK(kern_table_delete(s->mirror[t], ne, s->keys_scratch, step, NULL));
        ops->evicted_clear(s->work, t);
        shard_store_rows_t rows;
        KILN_CHECK(ops->changed(s->work, t, s->synced, step, &rows));
        int rc = kern_table_insert_rows(s->mirror[t], rows.n, rows.keys, rows.values, rows.opt,
                                        rows.steps, step);
        if (rc < 0)
            return kiln_errf(rc, "copying table '%s' back from the %s store: %s",
                             kern_table_name(s->mirror[t]), shard_store_kind_name(s->kind),
                             kiln_errmsg());
    }
    s->synced = step;
    return 0;
}

int shard_store_upload(shard_store_t *s, int64_t step)
{
    if (s->work == NULL)
        return 0;
    int rc = 0;
    int32_t *rows = NULL;
    int64_t *keys = NULL;
    float *values = NULL, *opt = NULL;
    uint32_t *steps = NULL;
    for (int t = 0; t < s->ntables && rc == 0; t++) {
        kern_table_t *m = s->mirror[t];
        const int64_t n = kern_table_size(m);
        kern_slab_t sl;
        kern_table_slab(m, &sl);
        const size_t dim = (size_t)sl.dim, sdim = (size_t)sl.nstate * dim;
        rows = kiln_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        keys = kiln_malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        values = kiln_malloc(sizeof(float) * (size_t)(n ? n : 1) * dim);
        opt = sdim ? kiln_malloc(sizeof(float) * (size_t)(n ? n : 1) * sdim) : NULL;
        steps = sl.opt_steps ? kiln_malloc(sizeof(uint32_t) * (size_t)(n ? n : 1)) : NULL;
        if (!rows || !keys || !values || (sdim && !opt) || (sl.opt_steps && !steps)) {
            rc = KILN_ENOMEM;
            break;
        }
        int64_t got = 0;
        KILN_CHECK_GOTO(kern_table_scan(m, rows, n, &got), rc, next);
        const int64_t *mk = kern_table_keys(m);
        for (int64_t i = 0; i < got; i++) {
            const int64_t r = rows[i];
            keys[i] = mk[r];
            memcpy(values + (size_t)i * dim, sl.values + (size_t)r * dim, sizeof(float) * dim);
            if (opt)
                memcpy(opt + (size_t)i * sdim, sl.opt_state + (size_t)r * sdim,
                       sizeof(float) * sdim);
            if (steps)
                steps[i] = sl.opt_steps[r];
        }
        shard_store_rows_t rr = {.n = got, .keys = keys, .values = values, .opt = opt, .steps = steps};
        rc = s->work->ops->insert(s->work, t, &rr, step);
        if (rc < 0)
            rc = kiln_errf(rc, "copying table '%s' into the %s store: %s", kern_table_name(m),
                           shard_store_kind_name(s->kind), kiln_errmsg());
    next:
        KILN_FREE_ALL(rows, keys, values, opt, steps);
        rows = NULL;
        keys = NULL;
        values = opt = NULL;
        steps = NULL;
    }
    /* A GPU table whose bucket overflowed while loading evicted some keys:
     * they stay in its log, and the next sync deletes them from the mirror
     * too. */
    if (rc == 0)
        s->synced = step;
    return rc;
}
