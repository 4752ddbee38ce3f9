/*
 * serving/serve_memsrc.c - an update source held in memory: a list of items
 * (rows, deletions, the dense array) added in the order they are to be
 * applied. Tests and the push benchmark build pushes with it; the checkpoint
 * source (serve_ckptsrc.c) is what real pushes use.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "serve.h"

typedef struct mitem {
    serve_item_kind_t kind;
    int table;
    int64_t n;
    int64_t *keys;
    float *values;
} mitem_t;

struct serve_memsrc {
    serve_model_desc_t desc;
    char uid[SERVE_UID_MAX], base[SERVE_UID_MAX];
    mitem_t *items;
    size_t n, cap;
};

int serve_memsrc_create(const serve_model_desc_t *desc, const char *uid, const char *base,
                        serve_memsrc_t **out)
{
    serve_memsrc_t *m = kiln_calloc(1, sizeof *m);
    if (m == NULL)
        return KILN_ENOMEM;
    m->desc = *desc;
    snprintf(m->uid, sizeof m->uid, "%s", uid);
    snprintf(m->base, sizeof m->base, "%s", base ? base : "");
    *out = m;
    return 0;
}

void serve_memsrc_destroy(serve_memsrc_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n; i++)
        KILN_FREE_ALL(m->items[i].keys, m->items[i].values);
    KILN_FREE_ALL(m->items, m);
}

static int add(serve_memsrc_t *m, serve_item_kind_t kind, int table, int64_t n,
               const int64_t *keys, const float *values, int64_t nvalues)
{
    if (kind != SERVE_ITEM_DENSE && (table < 0 || table >= m->desc.ntables))
        return kiln_errf(KILN_EINVAL, "table %d is out of range", table);
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 16;
        mitem_t *p = kiln_reallocarray(m->items, cap, sizeof *p);
        if (p == NULL)
            return KILN_ENOMEM;
        m->items = p;
        m->cap = cap;
    }
    mitem_t it = {kind, table, n, NULL, NULL};
    if (keys != NULL && n > 0) {
        it.keys = kiln_calloc((size_t)n, sizeof(int64_t));
        if (it.keys == NULL)
            return KILN_ENOMEM;
        memcpy(it.keys, keys, (size_t)n * sizeof(int64_t));
    }
    if (values != NULL && nvalues > 0) {
        it.values = kiln_calloc((size_t)nvalues, sizeof(float));
        if (it.values == NULL) {
            free(it.keys);
            return KILN_ENOMEM;
        }
        memcpy(it.values, values, (size_t)nvalues * sizeof(float));
    }
    m->items[m->n++] = it;
    return 0;
}

int serve_memsrc_add_rows(serve_memsrc_t *m, int table, int64_t n, const int64_t *keys,
                          const float *values)
{
    if (table < 0 || table >= m->desc.ntables)
        return kiln_errf(KILN_EINVAL, "table %d is out of range", table);
    return add(m, SERVE_ITEM_ROWS, table, n, keys, values, n * m->desc.tables[table].dim);
}

int serve_memsrc_add_deletes(serve_memsrc_t *m, int table, int64_t n, const int64_t *keys)
{
    return add(m, SERVE_ITEM_DELETE, table, n, keys, NULL, 0);
}

int serve_memsrc_set_dense(serve_memsrc_t *m, int64_t n, const float *values)
{
    return add(m, SERVE_ITEM_DENSE, 0, n, NULL, values, n);
}

typedef struct cursor {
    serve_memsrc_t *m;
    size_t i;
} cursor_t;

static int mem_next(serve_source_t *s, serve_item_t *item)
{
    cursor_t *c = s->impl;
    if (c->i >= c->m->n)
        return 0;
    const mitem_t *it = &c->m->items[c->i++];
    *item = (serve_item_t){it->kind, it->table, it->n, it->keys, it->values};
    return 1;
}

static void mem_destroy(serve_source_t *s)
{
    free(s->impl);
    free(s);
}

static const serve_source_ops_t mem_ops = {mem_next, mem_destroy};

int serve_memsrc_open(serve_memsrc_t *m, serve_source_t **out)
{
    serve_source_t *s = kiln_calloc(1, sizeof *s);
    cursor_t *c = kiln_calloc(1, sizeof *c);
    if (s == NULL || c == NULL) {
        free(s);
        free(c);
        return KILN_ENOMEM;
    }
    c->m = m;
    s->ops = &mem_ops;
    s->impl = c;
    s->desc = &m->desc;
    memcpy(s->uid, m->uid, sizeof s->uid);
    memcpy(s->base, m->base, sizeof s->base);
    *out = s;
    return 0;
}
