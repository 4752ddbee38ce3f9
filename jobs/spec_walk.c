/*
 * jobs/spec_walk.c - the generic half of the spec parser: diagnostics
 * ("FILE:LINE:COL: FIELD.PATH: what", collected in document order, at most
 * JOB_SPEC_MAX_PROBLEMS kept), defaults, scalar parsing, and spec_walk_map(),
 * which checks one YAML mapping against a table of field descriptors
 * (spec_schema.c) with did-you-mean for unknown keys, duplicate keys found
 * with a hash set, and a budget of JOB_SPEC_MAX_NODES visits.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln.h"
#include "serve.h"
#include "spec_int.h"

/* ---- diagnostics ------------------------------------------------------------ */
void job_diags_init(job_diags_t *d)
{
    memset(d, 0, sizeof *d);
}

void job_diags_fini(job_diags_t *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->n; i++)
        KILN_FREE_ALL(d->items[i].path, d->items[i].message);
    free(d->items);
    memset(d, 0, sizeof *d);
}

/* True when no more diagnostics are kept (the rest are only counted). */
static bool diags_full(const ctx_t *c)
{
    return c->diags->n - c->first >= JOB_SPEC_MAX_PROBLEMS;
}

/* Makes room for item n of *items (elem bytes each; *cap of them, doubled,
 * first when none). Returns false, with c->nomem set, when out of memory. */
static bool room_for(ctx_t *c, void **items, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (kiln_grow(items, cap, n, elem, first) == 0)
        return true;
    c->nomem = true;
    return false;
}

static void vdiag(ctx_t *c, int line, int col, const char *path, const char *fmt, va_list ap)
{
    if (diags_full(c)) {
        c->dropped++;
        return;
    }
    char what[768];
    vsnprintf(what, sizeof what, fmt, ap);
    job_diags_t *d = c->diags;
    if (!room_for(c, (void **)&d->items, &d->cap, d->n, sizeof *d->items, 8))
        return;
    job_diag_t *it = &d->items[d->n];
    it->line = line;
    it->col = col;
    it->path = kiln_strdup(path);
    if (line > 0)
        it->message =
            kiln_asprintf("%s:%d:%d: %s%s%s", c->file, line, col, path, *path ? ": " : "", what);
    else
        it->message = kiln_asprintf("%s: %s%s%s", c->file, path, *path ? ": " : "", what);
    /* A quote of the spec cut mid-character ("%.80s", the buffer's end) is
     * made whole UTF-8 again: the web API answers these in JSON. */
    if (it->message != NULL)
        kiln_utf8_scrub(it->message);
    if (it->path == NULL || it->message == NULL) {
        free(it->path);
        free(it->message);
        c->nomem = true;
        return;
    }
    d->n++;
}

void spec_diag_at(ctx_t *c, int line, int col, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdiag(c, line, col, path, fmt, ap);
    va_end(ap);
}

/* A diagnostic at node n (libyaml marks are 0-based; messages are 1-based). */
void spec_diag(ctx_t *c, const yaml_node_t *n, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdiag(c, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1, path, fmt, ap);
    va_end(ap);
}

static void note_seen(ctx_t *c, const char *path, const yaml_node_t *n)
{
    if (!room_for(c, (void **)&c->seen, &c->capseen, c->nseen, sizeof *c->seen, 64))
        return;
    char *p = kiln_strdup(path);
    if (p == NULL) {
        c->nomem = true;
        return;
    }
    c->seen[c->nseen++] = (seen_t){p, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
}

/* Returns the record of path when the spec gave it a value, else NULL. */
const seen_t *spec_seen(const ctx_t *c, const char *path)
{
    for (size_t i = 0; i < c->nseen; i++)
        if (strcmp(c->seen[i].path, path) == 0)
            return &c->seen[i];
    return NULL;
}

/* Position of path's value, or of the first of the fallbacks that was
 * given, or 1:1. The variadic list ends with NULL. */
void spec_where(const ctx_t *c, int *line, int *col, const char *path, ...)
{
    const seen_t *s = spec_seen(c, path);
    va_list ap;
    va_start(ap, path);
    const char *p;
    while (s == NULL && (p = va_arg(ap, const char *)) != NULL)
        s = spec_seen(c, p);
    va_end(ap);
    *line = s ? s->line : 1;
    *col = s ? s->col : 1;
}

/* ---- defaults ------------------------------------------------------------------------ */
void spec_apply_defaults(ctx_t *c, const field_t *fields, char *base)
{
    for (const field_t *f = fields; f->key != NULL; f++) {
        char *p = base + f->off;
        switch (f->type) {
        case T_STR:
            if (f->def_s != NULL && (*(char **)p = kiln_strdup(f->def_s)) == NULL)
                c->nomem = true;
            break;
        case T_INT:
        case T_ENUM:
            *(int *)p = (int)f->def_i;
            break;
        case T_I64:
        case T_DUR:
            *(int64_t *)p = f->def_i;
            break;
        case T_U64:
            *(uint64_t *)p = (uint64_t)f->def_i;
            break;
        case T_NUM:
            *(double *)p = f->def_d;
            break;
        case T_BOOL:
            *(bool *)p = f->def_i != 0;
            break;
        case T_MAP:
        case T_INLINE:
            spec_apply_defaults(c, f->sub, p);
            break;
        case T_FN:
            if (f->flags & F_DEFINT)
                *(int *)p = (int)f->def_i;
            break;
        case T_INTLIST:
            break;
        }
    }
}

/* ---- scalar helpers ------------------------------------------------------------------ */
const char *spec_scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

bool spec_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = spec_scalar(n);
    return *s == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
           strcmp(s, "NULL") == 0;
}

/* Describes what a node is, for "expected X, got Y". */
const char *spec_got(const yaml_node_t *n, char *buf, size_t bufsz)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    size_t len = n->data.scalar.length;
    snprintf(buf, bufsz, "\"%.60s%s\"", spec_scalar(n), len > 60 ? "..." : "");
    return buf;
}

bool spec_expect(ctx_t *c, const yaml_node_t *n, yaml_node_type_t type, const char *path,
                 const char *what)
{
    char gb[80];
    if (n->type == type)
        return true;
    spec_diag(c, n, path, "expected %s, got %s", what, spec_got(n, gb, sizeof gb));
    return false;
}

/* Parses a base-10 integer. Returns 0, -1 (not an integer) or -2 (overflow). */
static int parse_int(const char *s, int64_t *out)
{
    const char *d = (*s == '-' || *s == '+') ? s + 1 : s;
    if (!isdigit((unsigned char)*d))
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0')
        return -1;
    if (errno == ERANGE)
        return -2;
    *out = v;
    return 0;
}

static int parse_num(const char *s, double *out)
{
    if (*s == '\0' || isspace((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end != '\0' || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static const char *int_phrase(int64_t lo)
{
    return lo >= 1 ? "a positive integer" : lo == 0 ? "a non-negative integer" : "an integer";
}

/* Parses an integer scalar in [lo, hi]; reports and returns -1 on failure. */
int spec_get_int(ctx_t *c, const yaml_node_t *n, const char *path, int64_t lo, int64_t hi,
                 int64_t *out)
{
    char gb[80];
    int64_t v = 0;
    int rc = n->type == YAML_SCALAR_NODE ? parse_int(spec_scalar(n), &v) : -1;
    if (rc == -1) {
        spec_diag(c, n, path, "expected %s, got %s", int_phrase(lo), spec_got(n, gb, sizeof gb));
        return -1;
    }
    if (rc == -2 || v < lo || v > hi) {
        /* "must be >= lo" only for a value below lo; one too big for int64
         * (a seed of 2^63) is above the range, which then is named. */
        bool below = rc == -2 ? spec_scalar(n)[0] == '-' : v < lo;
        if (hi == INT64_MAX && below)
            spec_diag(c, n, path, "must be >= %" PRId64 ", got %s", lo, spec_scalar(n));
        else
            spec_diag(c, n, path, "%s is out of range %" PRId64 "..%" PRId64, spec_scalar(n), lo,
                      hi);
        return -1;
    }
    *out = v;
    return 0;
}

static void bad_enum(ctx_t *c, const yaml_node_t *n, const char *path, const char *const *names)
{
    char list[256] = "", gb[80];
    size_t len = 0;
    for (size_t i = 0; names[i] != NULL && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? " | " : "", names[i]);
    const char *guess =
        n->type == YAML_SCALAR_NODE ? kiln_did_you_mean(spec_scalar(n), names) : NULL;
    if (guess != NULL)
        spec_diag(c, n, path, "%s is not one of %s (did you mean \"%s\"?)",
                  spec_got(n, gb, sizeof gb), list, guess);
    else
        spec_diag(c, n, path, "%s is not one of %s", spec_got(n, gb, sizeof gb), list);
}

char *spec_dup_or_flag(ctx_t *c, const char *s)
{
    char *d = kiln_strdup(s);
    if (d == NULL)
        c->nomem = true;
    return d;
}

/* ---- the walker ----------------------------------------------------------------------- */

/* Paths are cut at PATH_MAX_LEN - 1 bytes; no spec nests that deep. */
static void join(char *out, const char *parent, const char *key)
{
    if (snprintf(out, PATH_MAX_LEN, "%s%s%s", parent, *parent ? "." : "", key) >= PATH_MAX_LEN)
        out[PATH_MAX_LEN - 1] = '\0';
}

void spec_index_path(char *out, const char *parent, int i)
{
    if (snprintf(out, PATH_MAX_LEN, "%s[%d]", parent, i) >= PATH_MAX_LEN)
        out[PATH_MAX_LEN - 1] = '\0';
}

/* Finds key among fields (looking into T_INLINE rows); adds the row's extra
 * base offset to *extra. */
static const field_t *find_field(const field_t *fields, const char *key, size_t *extra)
{
    for (const field_t *f = fields; f->key != NULL; f++) {
        if (f->type == T_INLINE) {
            size_t sub_extra = 0;
            const field_t *g = find_field(f->sub, key, &sub_extra);
            if (g != NULL) {
                *extra += f->off + sub_extra;
                return g;
            }
        } else if (strcmp(f->key, key) == 0) {
            return f;
        }
    }
    return NULL;
}

static size_t collect_keys(const field_t *fields, const char **out, size_t n, size_t cap)
{
    for (const field_t *f = fields; f->key != NULL && n + 1 < cap; f++) {
        if (f->type == T_INLINE)
            n = collect_keys(f->sub, out, n, cap);
        else
            out[n++] = f->key;
    }
    out[n] = NULL;
    return n;
}

static void unknown_key(ctx_t *c, const field_t *fields, const yaml_node_t *key, const char *path)
{
    if (diags_full(c)) { /* counted, not described: skip the did-you-mean */
        c->dropped++;
        return;
    }
    const char *keys[64];
    size_t n = collect_keys(fields, keys, 0, sizeof keys / sizeof keys[0]);
    const char *guess = kiln_did_you_mean(spec_scalar(key), keys);
    if (guess != NULL) {
        spec_diag(c, key, path, "unknown field (did you mean \"%s\"?)", guess);
        return;
    }
    char list[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", keys[i]);
    spec_diag(c, key, path, "unknown field (expected one of: %s)", list);
}

/* Reports the required fields under f (a missing row, or a null one). */
static void report_missing(ctx_t *c, const field_t *f, const yaml_node_t *at, const char *path)
{
    char child[PATH_MAX_LEN];
    join(child, path, f->key);
    if (f->type == T_MAP) {
        for (const field_t *g = f->sub; g->key != NULL; g++)
            if (g->flags & F_REQUIRED)
                report_missing(c, g, at, child);
        return;
    }
    spec_diag(c, at, child, "required field is missing");
}

static void set_field(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                      const char *path)
{
    char gb[80], buf[512];
    char *p = base + f->off;
    int64_t iv;
    double dv;

    if (f->type != T_MAP && f->type != T_INTLIST && f->type != T_FN &&
        val->type != YAML_SCALAR_NODE) {
        static const char *const what[] = {
            [T_STR] = "a string",   [T_INT] = "an integer", [T_I64] = "an integer",
            [T_U64] = "an integer", [T_NUM] = "a number",   [T_BOOL] = "true or false",
            [T_DUR] = "a duration", [T_ENUM] = "",          [T_MAP] = "",
            [T_INLINE] = "",        [T_INTLIST] = "",       [T_FN] = ""};
        if (f->type == T_ENUM)
            bad_enum(c, val, path, f->names);
        else if (f->type == T_INT || f->type == T_I64 || f->type == T_U64)
            spec_diag(c, val, path, "expected %s, got %s", int_phrase(f->lo),
                      spec_got(val, gb, sizeof gb));
        else
            spec_diag(c, val, path, "expected %s, got %s", what[f->type],
                      spec_got(val, gb, sizeof gb));
        return;
    }
    switch (f->type) {
    case T_STR: {
        const char *s = spec_scalar(val);
        if ((f->flags & F_NONEMPTY) && *s == '\0') {
            spec_diag(c, val, path, "must not be empty");
            return;
        }
        const char *why = f->check ? f->check(s, buf, sizeof buf) : NULL;
        if (why != NULL) {
            spec_diag(c, val, path, "%s", why);
            return;
        }
        free(*(char **)p);
        *(char **)p = spec_dup_or_flag(c, s);
        break;
    }
    case T_INT:
        if (spec_get_int(c, val, path, f->lo, f->hi, &iv) == 0)
            *(int *)p = (int)iv;
        break;
    case T_I64:
        if (spec_get_int(c, val, path, f->lo, f->hi, &iv) == 0)
            *(int64_t *)p = iv;
        break;
    case T_U64:
        if (spec_get_int(c, val, path, f->lo, f->hi, &iv) == 0)
            *(uint64_t *)p = (uint64_t)iv;
        break;
    case T_NUM: {
        if ((f->flags & F_NONE_OK) && strcmp(spec_scalar(val), "none") == 0) {
            *(double *)p = NAN;
            break;
        }
        if (parse_num(spec_scalar(val), &dv) < 0) {
            spec_diag(c, val, path, "expected a number, got %s", spec_got(val, gb, sizeof gb));
            return;
        }
        bool lo_ok = (f->flags & F_LO_OPEN) ? dv > f->dlo : dv >= f->dlo;
        bool hi_ok = (f->flags & F_HI_OPEN) ? dv < f->dhi : dv <= f->dhi;
        if (!lo_ok || !hi_ok) {
            if (isinf(f->dhi))
                spec_diag(c, val, path, "must be %s %g, got %s",
                          (f->flags & F_LO_OPEN) ? ">" : ">=", f->dlo, spec_scalar(val));
            else
                spec_diag(c, val, path, "must be in %c%g, %g%c, got %s",
                          (f->flags & F_LO_OPEN) ? '(' : '[', f->dlo, f->dhi,
                          (f->flags & F_HI_OPEN) ? ')' : ']', spec_scalar(val));
            return;
        }
        *(double *)p = dv;
        break;
    }
    case T_BOOL: {
        const char *s = spec_scalar(val);
        if (strcmp(s, "true") == 0 || strcmp(s, "True") == 0 || strcmp(s, "TRUE") == 0)
            *(bool *)p = true;
        else if (strcmp(s, "false") == 0 || strcmp(s, "False") == 0 || strcmp(s, "FALSE") == 0)
            *(bool *)p = false;
        else
            spec_diag(c, val, path, "expected true or false, got %s", spec_got(val, gb, sizeof gb));
        break;
    }
    case T_DUR: {
        const char *s = spec_scalar(val);
        if ((f->flags & F_NONE_OK) && strcmp(s, "none") == 0) {
            *(int64_t *)p = 0;
            break;
        }
        int rc = kiln_duration_parse(s, &iv);
        if (rc == KILN_ERANGE) {
            spec_diag(c, val, path, "duration \"%s\" is too long", s);
            return;
        }
        if (rc < 0) {
            spec_diag(c, val, path, "expected a duration like 30s, 5m, 2h or 1h30m%s, got %s",
                      (f->flags & F_NONE_OK) ? " (or none)" : "", spec_got(val, gb, sizeof gb));
            return;
        }
        if (iv < f->lo) {
            char d1[32], d2[32];
            spec_diag(c, val, path, "must be at least %s, got %s",
                      kiln_duration_format(f->lo, d1, sizeof d1),
                      kiln_duration_format(iv, d2, sizeof d2));
            return;
        }
        *(int64_t *)p = iv;
        break;
    }
    case T_ENUM:
        for (int i = 0; f->names[i] != NULL; i++)
            if (strcmp(f->names[i], spec_scalar(val)) == 0) {
                *(int *)p = i;
                return;
            }
        bad_enum(c, val, path, f->names);
        break;
    case T_MAP:
        spec_walk_map(c, f->sub, val, p, path);
        break;
    case T_INTLIST: {
        if (!spec_expect(c, val, YAML_SEQUENCE_NODE, path, "a list of layer widths like [64, 16]"))
            return;
        yaml_node_item_t *items = val->data.sequence.items.start;
        int n = (int)(val->data.sequence.items.top - items);
        if (n < 1 || n > f->maxlen) {
            spec_diag(c, val, path, "must list 1 to %d widths, got %d", f->maxlen, n);
            return;
        }
        int *v = kiln_calloc((size_t)n, sizeof *v);
        if (v == NULL) {
            c->nomem = true;
            return;
        }
        bool ok = true;
        for (int i = 0; i < n; i++) {
            char ip[PATH_MAX_LEN];
            spec_index_path(ip, path, i);
            if (spec_get_int(c, yaml_document_get_node(c->doc, items[i]), ip, f->lo, f->hi, &iv) <
                0)
                ok = false;
            else
                v[i] = (int)iv;
        }
        if (!ok) {
            free(v);
            return;
        }
        free(*(int **)p);
        *(int **)p = v;
        *(int *)(base + f->off2) = n;
        break;
    }
    case T_FN:
        f->fn(c, f, val, base, path);
        break;
    case T_INLINE:
        break;
    }
}

/* Counts one more node walked; false once the budget is spent (reported
 * once, at the node that spent it). */
bool spec_visit(ctx_t *c, const yaml_node_t *n)
{
    if (c->over_budget)
        return false;
    if (++c->visits <= JOB_SPEC_MAX_NODES)
        return true;
    c->over_budget = true;
    size_t first = c->first; /* this one is kept even when the list is full */
    c->first = c->diags->n;
    spec_diag(c, n, "",
              "the job spec expands to more than %d nodes (through aliases?); a job spec needs "
              "a few hundred",
              JOB_SPEC_MAX_NODES);
    c->first = first;
    return false;
}

/* For each pair of a mapping, the index of the earlier pair with the same
 * (scalar) key, or -1: dup[n]. A hash set of the keys seen, so a mapping of
 * many keys costs linear time. Returns 0 or -1 (out of memory). */
static int find_duplicates(ctx_t *c, const yaml_node_pair_t *pairs, size_t n, int64_t *dup)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    size_t *slot = kiln_calloc(cap, sizeof *slot); /* pair index + 1, 0: empty */
    if (slot == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *key = yaml_document_get_node(c->doc, pairs[i].key);
        dup[i] = -1;
        if (key->type != YAML_SCALAR_NODE)
            continue;
        size_t h = (size_t)kiln_xxh64(key->data.scalar.value, key->data.scalar.length, 0);
        for (size_t at = h & (cap - 1);; at = (at + 1) & (cap - 1)) {
            if (slot[at] == 0) {
                slot[at] = i + 1;
                break;
            }
            const yaml_node_t *prev = yaml_document_get_node(c->doc, pairs[slot[at] - 1].key);
            if (strcmp(spec_scalar(prev), spec_scalar(key)) == 0) {
                dup[i] = (int64_t)(slot[at] - 1);
                break;
            }
        }
    }
    free(slot);
    return 0;
}

/* Walks one mapping against fields: every key must be a known field given
 * once; a null value keeps the default; required fields must be present. */
void spec_walk_map(ctx_t *c, const field_t *fields, const yaml_node_t *map, char *base,
                   const char *path)
{
    char gb[80], child[PATH_MAX_LEN];
    if (!spec_expect(c, map, YAML_MAPPING_NODE, path, "a mapping of fields"))
        return;
    yaml_node_pair_t *pairs = map->data.mapping.pairs.start;
    size_t n = (size_t)(map->data.mapping.pairs.top - pairs);
    int64_t *dup = kiln_calloc(n + 1, sizeof *dup);
    if (dup == NULL || find_duplicates(c, pairs, n, dup) < 0) {
        free(dup);
        c->nomem = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *key = yaml_document_get_node(c->doc, pairs[i].key);
        const yaml_node_t *val = yaml_document_get_node(c->doc, pairs[i].value);
        if (!spec_visit(c, key))
            break;
        if (key->type != YAML_SCALAR_NODE) {
            spec_diag(c, key, path, "field names must be plain strings, got %s",
                      spec_got(key, gb, sizeof gb));
            continue;
        }
        const char *k = spec_scalar(key);
        join(child, path, k);
        if (dup[i] >= 0) {
            const yaml_node_t *prev = yaml_document_get_node(c->doc, pairs[dup[i]].key);
            spec_diag(c, key, child, "duplicate field (first given at line %d)",
                      (int)prev->start_mark.line + 1);
            continue;
        }
        size_t extra = 0;
        const field_t *f = find_field(fields, k, &extra);
        if (f == NULL) {
            unknown_key(c, fields, key, child);
            continue;
        }
        if (spec_is_null(val))
            continue; /* keep the default; required fields are reported below */
        note_seen(c, child, val);
        set_field(c, f, val, base + extra, child);
    }
    free(dup);
    for (const field_t *f = fields; f->key != NULL; f++) {
        if (!(f->flags & F_REQUIRED))
            continue;
        join(child, path, f->key);
        if (spec_seen(c, child) == NULL)
            report_missing(c, f, map, path);
    }
}
