/*
 * jobs/spec_int.h - internal to the spec parser (spec.c, spec_walk.c,
 * spec_schema.c): the walker's state, the field descriptor type and its row
 * macros, and what the three files call in each other.
 *
 *   spec_schema.c  the schema: enum spellings, value checks, the field
 *                  tables, the custom field parsers
 *   spec_walk.c    the generic part: diagnostics, defaults, scalars, the
 *                  walker that checks a mapping against a table
 *   spec.c         the entry points and the checks across fields
 */
#ifndef KILN_JOBS_SPEC_INT_H
#define KILN_JOBS_SPEC_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <yaml.h>

#include "jobs.h"

/* ---- the walker's state ------------------------------------------------------ */
typedef struct seen {
    char *path; /* field path that was given a (non-null) value */
    int line, col;
} seen_t;

typedef struct ctx {
    const char *file;
    yaml_document_t *doc;
    job_spec_t *spec;
    job_diags_t *diags;
    bool nomem;
    seen_t *seen;
    size_t nseen, capseen;
    const yaml_node_t *tables; /* model.tables, walked after everything else */
    int *slot_owner;           /* [data.cat_slots]: user table reading slot, or -1 */
    size_t first;              /* diags->n when this parse started */
    size_t dropped;            /* problems past JOB_SPEC_MAX_PROBLEMS, counted only */
    size_t visits;             /* nodes walked so far (mapping pairs, list items) */
    bool over_budget;          /* visits passed JOB_SPEC_MAX_NODES: the walk stopped */
} ctx_t;

#define PATH_MAX_LEN 256

/* ---- field descriptors ------------------------------------------------------------ */
typedef enum {
    T_STR,     /* char *, optional check() */
    T_INT,     /* int in [lo, hi] */
    T_I64,     /* int64_t in [lo, hi] */
    T_U64,     /* uint64_t in [lo, hi] */
    T_NUM,     /* double in [dlo, dhi] (F_LO_OPEN / F_HI_OPEN make a bound exclusive) */
    T_BOOL,    /* bool */
    T_DUR,     /* int64_t milliseconds >= lo, via kiln_duration_parse */
    T_ENUM,    /* int, spelled as names[] */
    T_MAP,     /* a nested mapping; sub's offsets are relative to base + off */
    T_INLINE,  /* sub's keys are valid at this level too, at base + off */
    T_INTLIST, /* int * at off, its length (int) at off2; elements in [lo, hi] */
    T_FN       /* custom: fn() parses the node */
} ftype_t;

enum {
    F_REQUIRED = 1u << 0, /* missing is an error */
    F_NONEMPTY = 1u << 1, /* T_STR: "" is an error */
    F_LO_OPEN = 1u << 2,  /* T_NUM: value must be > dlo */
    F_HI_OPEN = 1u << 3,  /* T_NUM: value must be < dhi */
    F_NONE_OK = 1u << 4,  /* T_DUR: "none" means 0; T_NUM: "none" means NAN (unset) */
    F_DEFINT = 1u << 5,   /* T_FN: write def_i as an int at off before the walk */
    F_UNIQUE = 1u << 6,   /* parse_strings: an item listed twice is an error */
    F_JOINED = 1u << 7    /* parse_strings: one char * at off, the items joined by commas */
};

typedef struct field field_t;
/* A T_FN row's parser: reads val, the node of field f, into base (path
 * names it in diagnostics). */
typedef void field_fn_t(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                        const char *path);
/* Returns NULL when s is fine, else the complaint (may be written to buf). */
typedef const char *check_fn_t(const char *s, char *buf, size_t bufsz);

struct field {
    const char *key;
    ftype_t type;
    unsigned flags;
    size_t off, off2;
    int64_t lo, hi;
    double dlo, dhi;
    int64_t def_i;
    double def_d;
    const char *def_s;
    const char *const *names;
    const field_t *sub;
    field_fn_t *fn;
    check_fn_t *check;
    int maxlen;       /* T_INTLIST; parse_strings: the most items */
    const char *what; /* parse_strings: what the list is, for "expected ..." */
};

#define FIELD_END                                                                                  \
    {                                                                                              \
        .key = NULL                                                                                \
    }
#define STR(k, T, m, def, fl, chk)                                                                 \
    {                                                                                              \
        .key = k, .type = T_STR, .off = offsetof(T, m), .def_s = def, .flags = fl, .check = chk    \
    }
/* INT, I64 and U64: an integer field, by the width of its member. */
#define INTEGER(ty, k, T, m, def, lo_, hi_)                                                        \
    {                                                                                              \
        .key = k, .type = ty, .off = offsetof(T, m), .def_i = def, .lo = lo_, .hi = hi_            \
    }
#define INT(k, T, m, def, lo_, hi_) INTEGER(T_INT, k, T, m, def, lo_, hi_)
#define I64(k, T, m, def, lo_, hi_) INTEGER(T_I64, k, T, m, def, lo_, hi_)
#define U64(k, T, m, def, lo_, hi_) INTEGER(T_U64, k, T, m, def, lo_, hi_)
#define NUM(k, T, m, def, lo_, hi_, fl)                                                            \
    {                                                                                              \
        .key = k, .type = T_NUM, .off = offsetof(T, m), .def_d = def, .dlo = lo_, .dhi = hi_,      \
        .flags = fl                                                                                \
    }
#define BOOL(k, T, m, def)                                                                         \
    {                                                                                              \
        .key = k, .type = T_BOOL, .off = offsetof(T, m), .def_i = def                              \
    }
#define DUR(k, T, m, def, lo_, fl)                                                                 \
    {                                                                                              \
        .key = k, .type = T_DUR, .off = offsetof(T, m), .def_i = def, .lo = lo_, .hi = INT64_MAX,  \
        .flags = fl                                                                                \
    }
#define ENUM(k, T, m, def, nm)                                                                     \
    {                                                                                              \
        .key = k, .type = T_ENUM, .off = offsetof(T, m), .def_i = def, .names = nm                 \
    }
#define MAP(k, T, m, sub_, fl)                                                                     \
    {                                                                                              \
        .key = k, .type = T_MAP, .off = offsetof(T, m), .sub = sub_, .flags = fl                   \
    }
#define GROUP(k, sub_, fl)                                                                         \
    {                                                                                              \
        .key = k, .type = T_MAP, .off = 0, .sub = sub_, .flags = fl                                \
    }
#define INLINE(T, m, sub_)                                                                         \
    {                                                                                              \
        .key = "", .type = T_INLINE, .off = offsetof(T, m), .sub = sub_                            \
    }
#define INTLIST(k, T, m, n, lo_, hi_, max_)                                                        \
    {                                                                                              \
        .key = k, .type = T_INTLIST, .off = offsetof(T, m), .off2 = offsetof(T, n), .lo = lo_,     \
        .hi = hi_, .maxlen = max_                                                                  \
    }
#define FN(k, fn_, fl)                                                                             \
    {                                                                                              \
        .key = k, .type = T_FN, .fn = fn_, .flags = fl                                             \
    }

/* ---- spec_schema.c ---------------------------------------------------------------------- */
extern const field_t spec_top_fields[];   /* the whole document */
extern const field_t spec_table_fields[]; /* one item of model.tables */

/* ---- spec_walk.c ------------------------------------------------------------------------- */
/* A diagnostic at line:col (1-based) about path. */
void spec_diag_at(ctx_t *c, int line, int col, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A diagnostic at node n (libyaml marks are 0-based; messages are 1-based). */
void spec_diag(ctx_t *c, const yaml_node_t *n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Returns the record of path when the spec gave it a value, else NULL. */
const seen_t *spec_seen(const ctx_t *c, const char *path);
/* Position of path's value, or of the first of the fallbacks that was
 * given, or 1:1. The variadic list ends with NULL. */
void spec_where(const ctx_t *c, int *line, int *col, const char *path, ...);
/* Writes every field's default into base (recursing into groups and maps). */
void spec_apply_defaults(ctx_t *c, const field_t *fields, char *base);
/* A scalar node's text ("" for other nodes); whether n is YAML null. */
const char *spec_scalar(const yaml_node_t *n);
bool spec_is_null(const yaml_node_t *n);
/* How a node reads in a message ("a mapping", "\"text\""), in buf. */
const char *spec_got(const yaml_node_t *n, char *buf, size_t bufsz);
/* True when n is of type; otherwise a diagnostic at path, "expected <what>,
 * got <what n is>", and false. */
bool spec_expect(ctx_t *c, const yaml_node_t *n, yaml_node_type_t type, const char *path,
                 const char *what);
/* Parses an integer scalar in [lo, hi]; reports and returns -1 on failure. */
int spec_get_int(ctx_t *c, const yaml_node_t *n, const char *path, int64_t lo, int64_t hi,
                 int64_t *out);
/* kiln_strdup that marks the parse out of memory on failure. */
char *spec_dup_or_flag(ctx_t *c, const char *s);
/* out = "parent[i]" (PATH_MAX_LEN bytes). */
void spec_index_path(char *out, const char *parent, int i);
/* Counts a node against JOB_SPEC_MAX_NODES; false once the budget is spent. */
bool spec_visit(ctx_t *c, const yaml_node_t *n);
/* Walks one mapping against fields: every key must be a known field given
 * once; a null value keeps the default; required fields must be present. */
void spec_walk_map(ctx_t *c, const field_t *fields, const yaml_node_t *map, char *base,
                   const char *path);

#endif /* KILN_JOBS_SPEC_INT_H */
