/*
 * jobs/spec.c - the job spec parser: YAML text -> validated job_spec_t.
 *
 * libyaml loads the text into a node tree (yaml_parser_load); one loop,
 * walk_map(), then walks each mapping against a table of field descriptors
 * ({key, type, offset, default, range}). The tables below ARE the spec's
 * schema: adding a field is adding a row. The same tables fill in defaults
 * before the walk and supply the did-you-mean candidates for unknown keys.
 * What no single row can check (launcher vs hostfile, DLRM shapes, which
 * table reads which categorical slot, online jobs vs export.every) is done
 * by check_spec() after the walk, using the positions the walk recorded.
 *
 * Every problem becomes one diagnostic "FILE:LINE:COL: FIELD.PATH: what";
 * all of them are collected and reported in document order, except after a
 * YAML syntax error, where libyaml cannot go on.
 *
 * Hostile input costs time linear in its size: a spec is at most
 * JOB_SPEC_MAX_BYTES and nests at most JOB_SPEC_MAX_DEPTH levels (checked on
 * libyaml's event stream before the document is loaded, since libyaml's
 * scanner costs O(depth) per token), duplicate keys are found with a hash set,
 * at most JOB_SPEC_MAX_PROBLEMS diagnostics are kept, and the walk visits at
 * most JOB_SPEC_MAX_NODES nodes (aliases can make a small document walk a
 * large one).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <yaml.h>

#include "jobs.h"
#include "serve.h"
#include "kiln.h"

/* ---- enumeration spellings (index = enum value; NULL-terminated) ------- */
static const char *const concurrency_names[] = {"forbid", "allow", "replace", NULL};
static const char *const catchup_names[] = {"none", "latest", "all", NULL};
static const char *const launcher_names[] = {"local", "hostfile", "slurm", NULL};
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const mpi_transport_names[] = {"auto", "tcp", NULL};
static const char *const format_names[] = {"criteo-tsv", "kiln-bin", NULL};
static const char *const model_type_names[] = {"lr", "fm", "dlrm", NULL};
static const char *const combiner_names[] = {"sum", "mean", NULL};
static const char *const eviction_names[] = {"lru", "lfu", "none", NULL};
static const char *const init_names[] = {"uniform", "normal", "zeros", NULL};
static const char *const optimizer_names[] = {"sgd", "adagrad", "adam", NULL};
static const char *const init_from_names[] = {"latest", "none", "checkpoint", NULL};
static const char *const export_names[] = {"none", "full", "incremental", NULL};
static const char *const mode_names[] = {"batch", "online", NULL};

static const char *enum_name(const char *const *names, size_t n, int v)
{
    return v >= 0 && (size_t)v < n ? names[v] : "?";
}
#define ENUM_NAME_FN(fn, type, names)                                                              \
    const char *fn(type v)                                                                         \
    {                                                                                              \
        return enum_name(names, sizeof names / sizeof names[0] - 1, (int)v);                       \
    }
ENUM_NAME_FN(job_concurrency_name, job_concurrency_t, concurrency_names)
ENUM_NAME_FN(job_catchup_name, job_catchup_t, catchup_names)
ENUM_NAME_FN(job_launcher_name, job_launcher_t, launcher_names)
ENUM_NAME_FN(job_device_name, job_device_t, device_names)
ENUM_NAME_FN(job_mpi_transport_name, job_mpi_transport_t, mpi_transport_names)
ENUM_NAME_FN(job_format_name, job_format_t, format_names)
ENUM_NAME_FN(job_model_type_name, job_model_type_t, model_type_names)
ENUM_NAME_FN(job_combiner_name, job_combiner_t, combiner_names)
ENUM_NAME_FN(job_eviction_name, job_eviction_t, eviction_names)
ENUM_NAME_FN(job_init_name, job_init_t, init_names)
ENUM_NAME_FN(job_optimizer_type_name, job_optimizer_type_t, optimizer_names)
ENUM_NAME_FN(job_init_from_name, job_init_from_t, init_from_names)
ENUM_NAME_FN(job_export_mode_name, job_export_mode_t, export_names)
ENUM_NAME_FN(job_train_mode_name, job_train_mode_t, mode_names)

/* ---- diagnostics ------------------------------------------------------------ */
void job_diags_init(job_diags_t *d)
{
    memset(d, 0, sizeof *d);
}

void job_diags_fini(job_diags_t *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->n; i++) {
        free(d->items[i].path);
        free(d->items[i].message);
    }
    free(d->items);
    memset(d, 0, sizeof *d);
}

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

/* True when no more diagnostics are kept (the rest are only counted). */
static bool diags_full(const ctx_t *c)
{
    return c->diags->n - c->first >= JOB_SPEC_MAX_PROBLEMS;
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
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        job_diag_t *items = kiln_reallocarray(d->items, cap, sizeof *items);
        if (items == NULL) {
            c->nomem = true;
            return;
        }
        d->items = items;
        d->cap = cap;
    }
    job_diag_t *it = &d->items[d->n];
    it->line = line;
    it->col = col;
    it->path = kiln_strdup(path);
    if (line > 0)
        it->message =
            kiln_asprintf("%s:%d:%d: %s%s%s", c->file, line, col, path, *path ? ": " : "", what);
    else
        it->message = kiln_asprintf("%s: %s%s%s", c->file, path, *path ? ": " : "", what);
    if (it->path == NULL || it->message == NULL) {
        free(it->path);
        free(it->message);
        c->nomem = true;
        return;
    }
    d->n++;
}

static void diag_at(ctx_t *c, int line, int col, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void diag_at(ctx_t *c, int line, int col, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdiag(c, line, col, path, fmt, ap);
    va_end(ap);
}

/* A diagnostic at node n (libyaml marks are 0-based; messages are 1-based). */
static void diag(ctx_t *c, const yaml_node_t *n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void diag(ctx_t *c, const yaml_node_t *n, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdiag(c, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1, path, fmt, ap);
    va_end(ap);
}

static void note_seen(ctx_t *c, const char *path, const yaml_node_t *n)
{
    if (c->nseen == c->capseen) {
        size_t cap = c->capseen ? c->capseen * 2 : 64;
        seen_t *s = kiln_reallocarray(c->seen, cap, sizeof *s);
        if (s == NULL) {
            c->nomem = true;
            return;
        }
        c->seen = s;
        c->capseen = cap;
    }
    char *p = kiln_strdup(path);
    if (p == NULL) {
        c->nomem = true;
        return;
    }
    c->seen[c->nseen++] = (seen_t){p, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
}

/* Returns the record of path when the spec gave it a value, else NULL. */
static const seen_t *seen(const ctx_t *c, const char *path)
{
    for (size_t i = 0; i < c->nseen; i++)
        if (strcmp(c->seen[i].path, path) == 0)
            return &c->seen[i];
    return NULL;
}

/* Position of path's value, or of the first of the fallbacks that was
 * given, or 1:1. The variadic list ends with NULL. */
static void where(const ctx_t *c, int *line, int *col, const char *path, ...)
{
    const seen_t *s = seen(c, path);
    va_list ap;
    va_start(ap, path);
    const char *p;
    while (s == NULL && (p = va_arg(ap, const char *)) != NULL)
        s = seen(c, p);
    va_end(ap);
    *line = s ? s->line : 1;
    *col = s ? s->col : 1;
}

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
    F_DEFINT = 1u << 5    /* T_FN: write def_i as an int at off before the walk */
};

typedef struct field field_t;
typedef void (*field_fn)(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                         const char *path);
/* Returns NULL when s is fine, else the complaint (may be written to buf). */
typedef const char *(*check_fn)(const char *s, char *buf, size_t bufsz);

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
    field_fn fn;
    check_fn check;
    int maxlen; /* T_INTLIST */
};

#define FIELD_END                                                                                  \
    {                                                                                              \
        .key = NULL                                                                                \
    }
#define STR(k, T, m, def, fl, chk)                                                                 \
    {                                                                                              \
        .key = k, .type = T_STR, .off = offsetof(T, m), .def_s = def, .flags = fl, .check = chk    \
    }
#define INT(k, T, m, def, lo_, hi_)                                                                \
    {                                                                                              \
        .key = k, .type = T_INT, .off = offsetof(T, m), .def_i = def, .lo = lo_, .hi = hi_         \
    }
#define I64(k, T, m, def, lo_, hi_)                                                                \
    {                                                                                              \
        .key = k, .type = T_I64, .off = offsetof(T, m), .def_i = def, .lo = lo_, .hi = hi_         \
    }
#define U64(k, T, m, def, lo_, hi_)                                                                \
    {                                                                                              \
        .key = k, .type = T_U64, .off = offsetof(T, m), .def_i = def, .lo = lo_, .hi = hi_         \
    }
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

/* ---- value checks used by the tables ---------------------------------------------- */
static bool is_ident(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return false;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '.' && *p != '-')
            return false;
    return true;
}

/* Job and table names: a job's name becomes a directory (ckpt/<name>), so
 * "." and ".." (which name the directory itself or its parent) are not
 * names. */
static const char *check_name(const char *s, char *buf, size_t bufsz)
{
    if (is_ident(s, 64) && strcmp(s, ".") != 0 && strcmp(s, "..") != 0)
        return NULL;
    snprintf(buf, bufsz,
             "\"%.80s\" is not a valid name (1 to 64 letters, digits, '_', '.' or '-', and not "
             ". or ..)",
             s);
    return buf;
}

/* kiln-serve's own rule for the model and label names a push carries
 * (serve_name_check, serving/serve.h): a name it would refuse at every push
 * is refused at submit. */
static bool serve_accepts_name(const char *s)
{
    return serve_name_check(s, NULL, 0) == 0;
}

static const char *check_label(const char *s, char *buf, size_t bufsz)
{
    if (is_ident(s, 32) && serve_accepts_name(s))
        return NULL;
    snprintf(buf, bufsz,
             "\"%.80s\" is not a valid label (1 to 32 letters, digits, '_', '.' or '-', not "
             "starting with '.'; kiln-serve refuses others)",
             s);
    return buf;
}

static const char *check_model_name(const char *s, char *buf, size_t bufsz)
{
    if (serve_accepts_name(s))
        return NULL;
    snprintf(buf, bufsz,
             "\"%.80s\" is not a model name kiln-serve accepts (1 to 63 letters, digits, '_', "
             "'.' or '-', not starting with '.')",
             s);
    return buf;
}

static const char *check_schedule(const char *s, char *buf, size_t bufsz)
{
    job_cron_t cron;
    if (job_cron_parse(s, &cron) == 0)
        return NULL;
    snprintf(buf, bufsz, "%s", kiln_errmsg());
    return buf;
}

static const char *check_timezone(const char *s, char *buf, size_t bufsz)
{
    job_cron_t cron;
    if (job_cron_parse("@daily", &cron) < 0)
        memset(&cron, 0, sizeof cron);
    if (job_cron_set_timezone(&cron, s) == 0)
        return NULL;
    snprintf(buf, bufsz, "%s", kiln_errmsg());
    return buf;
}

static const char *check_url(const char *s, char *buf, size_t bufsz)
{
    const char *rest = NULL;
    if (strncmp(s, "http://", 7) == 0)
        rest = s + 7;
    else if (strncmp(s, "https://", 8) == 0)
        rest = s + 8;
    if (rest == NULL) {
        snprintf(buf, bufsz, "\"%.120s\" must start with http:// or https://", s);
        return buf;
    }
    if (*rest == '\0' || *rest == '/' || *rest == ':') {
        snprintf(buf, bufsz, "\"%.120s\" names no host", s);
        return buf;
    }
    for (const char *p = s; *p; p++)
        if (isspace((unsigned char)*p)) {
            snprintf(buf, bufsz, "\"%.120s\" contains white space", s);
            return buf;
        }
    return NULL;
}

static const char *check_env_name(const char *s, char *buf, size_t bufsz)
{
    bool ok = (isalpha((unsigned char)s[0]) || s[0] == '_') && strlen(s) <= 128;
    for (const char *p = s; ok && *p; p++)
        ok = isalnum((unsigned char)*p) || *p == '_';
    if (ok)
        return NULL;
    snprintf(buf, bufsz,
             "\"%.80s\" is not an environment variable name (letters, digits and '_', "
             "not starting with a digit)",
             s);
    return buf;
}

/* True when s is made of letters, digits and the characters in extra only. */
static bool made_of(const char *s, const char *extra)
{
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && strchr(extra, *p) == NULL)
            return false;
    return true;
}

/* Slurm names: a partition (or a comma-separated list of them), an account. */
static const char *check_slurm_names(const char *s, char *buf, size_t bufsz)
{
    size_t n = strlen(s);
    if (n > 0 && n <= 256 && s[0] != ',' && s[n - 1] != ',' && made_of(s, "_.-,") &&
        strstr(s, ",,") == NULL)
        return NULL;
    snprintf(buf, bufsz,
             "\"%.80s\" is not a Slurm name (letters, digits, '_', '.', '-'; partitions may be "
             "a comma-separated list)",
             s);
    return buf;
}

/* ---- custom field parsers (defined further down) ---------------------------------- */
static void parse_init_from(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                            const char *path);
static void parse_endpoints(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                            const char *path);
static void defer_tables(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                         const char *path);
static void parse_slots(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                        const char *path);
static void parse_interfaces(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                             const char *path);
static void parse_sbatch_args(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                              const char *path);

/* ---- the schema ------------------------------------------------------------------------
 * Offsets of rows inside a GROUP are relative to job_spec_t (the group is an
 * anonymous struct of it); rows of a MAP are relative to the MAP's member. */
#define MS(ms) ((int64_t)(ms))
#define S_ (MS(1000))

static const field_t mpi_fields[] = {
    {.key = "interfaces",
     .type = T_FN,
     .fn = parse_interfaces,
     .off = offsetof(job_spec_t, resources.mpi.interfaces)},
    ENUM("transport", job_spec_t, resources.mpi.transport, JOB_MPI_AUTO, mpi_transport_names),
    FIELD_END};

static const field_t resources_fields[] = {
    INT("ranks", job_spec_t, resources.ranks, 1, 1, 4096),
    ENUM("launcher", job_spec_t, resources.launcher, JOB_LAUNCH_LOCAL, launcher_names),
    STR("hostfile", job_spec_t, resources.hostfile, NULL, F_NONEMPTY, NULL),
    ENUM("device", job_spec_t, resources.device, JOB_DEVICE_AUTO, device_names),
    DUR("timeout", job_spec_t, resources.timeout_ms, 0, 0, F_NONE_OK),
    INT("threads", job_spec_t, resources.threads, 0, 0, 1024),
    INT("nodes", job_spec_t, resources.nodes, 0, 0, 4096),
    STR("partition", job_spec_t, resources.partition, NULL, F_NONEMPTY, check_slurm_names),
    STR("account", job_spec_t, resources.account, NULL, F_NONEMPTY, check_slurm_names),
    INT("gpus_per_node", job_spec_t, resources.gpus_per_node, 0, 0, 64),
    {.key = "sbatch_args",
     .type = T_FN,
     .fn = parse_sbatch_args,
     .off = offsetof(job_spec_t, resources.sbatch_args),
     .off2 = offsetof(job_spec_t, resources.nsbatch_args)},
    GROUP("mpi", mpi_fields, 0),
    FIELD_END};

static const field_t retries_fields[] = {
    INT("count", job_spec_t, retries.count, 0, 0, 100),
    DUR("backoff", job_spec_t, retries.backoff_ms, 30 * S_, 0, 0),
    DUR("max_backoff", job_spec_t, retries.max_backoff_ms, 3600 * S_, 0, 0), FIELD_END};

static const field_t data_fields[] = {
    ENUM("format", job_spec_t, data.format, JOB_FMT_CRITEO_TSV, format_names),
    STR("train", job_spec_t, data.train, NULL, F_REQUIRED | F_NONEMPTY, NULL),
    STR("eval", job_spec_t, data.eval, NULL, F_NONEMPTY, NULL),
    BOOL("incremental", job_spec_t, data.incremental, false),
    INT("dense_features", job_spec_t, data.dense_features, 13, 0, 4096),
    INT("cat_slots", job_spec_t, data.cat_slots, 26, 1, 1024),
    NUM("max_malformed", job_spec_t, data.max_malformed, 0.01, 0.0, 1.0, 0),
    FIELD_END};

static const field_t embedding_fields[] = {
    INT("dim", job_embedding_t, dim, 16, 1, 1024),
    ENUM("combiner", job_embedding_t, combiner, JOB_COMB_SUM, combiner_names),
    I64("capacity", job_embedding_t, capacity, 1000000, 1, INT64_C(1) << 40),
    ENUM("eviction", job_embedding_t, eviction, JOB_EVICT_LRU, eviction_names),
    ENUM("init", job_embedding_t, init, JOB_INIT_UNIFORM, init_names),
    NUM("init_scale", job_embedding_t, init_scale, 0.01, 0.0, INFINITY, 0),
    FIELD_END};

/* One entry of model.tables: a name, the slots it reads, and any of the
 * embedding settings (they start as model.embedding's). */
static const field_t table_fields[] = {STR("name", job_table_t, name, NULL, F_REQUIRED, check_name),
                                       FN("slots", parse_slots, F_REQUIRED),
                                       INLINE(job_table_t, emb, embedding_fields), FIELD_END};

static const field_t model_fields[] = {
    ENUM("type", job_spec_t, model.type, JOB_MODEL_LR, model_type_names),
    MAP("embedding", job_spec_t, model.embedding, embedding_fields, 0),
    INTLIST("bottom_mlp", job_spec_t, model.bottom_mlp, model.nbottom, 1, 65536, 16),
    INTLIST("top_mlp", job_spec_t, model.top_mlp, model.ntop, 1, 65536, 16),
    FN("tables", defer_tables, 0),
    BOOL("fm_dense_factors", job_spec_t, model.fm_dense_factors, false),
    FIELD_END};

/* adagrad's eps default (1e-10) is in the table; adam's (1e-8) is applied
 * by check_spec() when eps is not given. */
static const field_t optimizer_fields[] = {
    ENUM("type", job_optimizer_t, type, JOB_OPT_ADAGRAD, optimizer_names),
    NUM("lr", job_optimizer_t, lr, 0.05, 0.0, INFINITY, 0),
    NUM("beta1", job_optimizer_t, beta1, 0.9, 0.0, 1.0, F_HI_OPEN),
    NUM("beta2", job_optimizer_t, beta2, 0.999, 0.0, 1.0, F_HI_OPEN),
    NUM("eps", job_optimizer_t, eps, 1e-10, 0.0, INFINITY, F_LO_OPEN),
    NUM("initial_accumulator", job_optimizer_t, initial_accumulator, 0.0, 0.0, INFINITY, 0),
    NUM("weight_decay", job_optimizer_t, weight_decay, 0.0, 0.0, INFINITY, 0),
    FIELD_END};

static const field_t optimizers_fields[] = {
    MAP("sparse", job_spec_t, train.sparse, optimizer_fields, 0),
    MAP("dense", job_spec_t, train.dense, optimizer_fields, 0), FIELD_END};

static const field_t train_fields[] = {
    ENUM("mode", job_spec_t, train.mode, JOB_MODE_BATCH, mode_names),
    INT("batch_size", job_spec_t, train.batch_size, 4096, 1, 1 << 20),
    INT("epochs", job_spec_t, train.epochs, 1, 1, 100000),
    GROUP("optimizer", optimizers_fields, 0),
    U64("seed", job_spec_t, train.seed, 42, 0, INT64_MAX),
    {.key = "init_from",
     .type = T_FN,
     .fn = parse_init_from,
     .flags = F_DEFINT,
     .off = offsetof(job_spec_t, train.init_from),
     .def_i = JOB_INITFROM_LATEST},
    I64("max_steps", job_spec_t, train.max_steps, 0, 0, INT64_MAX),
    I64("log_every", job_spec_t, train.log_every, 100, 1, INT64_MAX),
    FIELD_END};

/* checkpoint.dir's default, "ckpt/<name>", is applied by check_spec(). */
static const field_t checkpoint_fields[] = {
    STR("dir", job_spec_t, checkpoint.dir, NULL, F_NONEMPTY, NULL),
    INT("full_every", job_spec_t, checkpoint.full_every, 24, 1, 100000),
    INT("keep", job_spec_t, checkpoint.keep, 5, 1, 100000),
    BOOL("include_optimizer", job_spec_t, checkpoint.include_optimizer, true),
    I64("every_steps", job_spec_t, checkpoint.every_steps, 0, 0, INT64_MAX),
    FIELD_END};

static const field_t export_fields[] = {
    ENUM("on_success", job_spec_t, export_.on_success, JOB_EXPORT_NONE, export_names),
    DUR("every", job_spec_t, export_.every_ms, 0, 0, F_NONE_OK), FIELD_END};

static const field_t endpoint_fields[] = {
    STR("url", job_endpoint_t, url, NULL, F_REQUIRED, check_url),
    STR("model", job_endpoint_t, model, NULL, F_REQUIRED | F_NONEMPTY, check_model_name),
    STR("label", job_endpoint_t, label, NULL, F_REQUIRED, check_label),
    BOOL("auto", job_endpoint_t, auto_push, true), FIELD_END};

static const field_t push_fields[] = {
    STR("token_env", job_spec_t, push.token_env, "KILN_SERVE_TOKEN", 0, check_env_name),
    INT("retries", job_spec_t, push.retries, 5, 0, 100),
    DUR("timeout", job_spec_t, push.timeout_ms, 30 * S_, 1, 0),
    NUM("max_regression", job_spec_t, push.max_regression, NAN, 0.0, INFINITY, F_NONE_OK),
    FN("endpoints", parse_endpoints, 0), FIELD_END};

static const field_t top_fields[] = {
    STR("name", job_spec_t, name, NULL, F_REQUIRED, check_name),
    STR("description", job_spec_t, description, NULL, 0, NULL),
    STR("schedule", job_spec_t, schedule, NULL, F_NONEMPTY, check_schedule),
    STR("timezone", job_spec_t, timezone, "UTC", F_NONEMPTY, check_timezone),
    ENUM("concurrency", job_spec_t, concurrency, JOB_CONC_FORBID, concurrency_names),
    ENUM("catchup", job_spec_t, catchup, JOB_CATCHUP_LATEST, catchup_names),
    INT("priority", job_spec_t, priority, 0, -1000, 1000),
    GROUP("resources", resources_fields, 0),
    GROUP("retries", retries_fields, 0),
    GROUP("data", data_fields, F_REQUIRED),
    GROUP("model", model_fields, 0),
    GROUP("train", train_fields, 0),
    GROUP("checkpoint", checkpoint_fields, 0),
    GROUP("export", export_fields, 0),
    GROUP("push", push_fields, 0),
    FIELD_END};

/* ---- defaults ------------------------------------------------------------------------ */
static void apply_defaults(ctx_t *c, const field_t *fields, char *base)
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
            apply_defaults(c, f->sub, p);
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
static const char *scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *s = scalar(n);
    return *s == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
           strcmp(s, "NULL") == 0;
}

/* Describes what a node is, for "expected X, got Y". */
static const char *got(const yaml_node_t *n, char *buf, size_t bufsz)
{
    if (n->type == YAML_MAPPING_NODE)
        return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE)
        return "a list";
    size_t len = n->data.scalar.length;
    snprintf(buf, bufsz, "\"%.60s%s\"", scalar(n), len > 60 ? "..." : "");
    return buf;
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
static int get_int(ctx_t *c, const yaml_node_t *n, const char *path, int64_t lo, int64_t hi,
                   int64_t *out)
{
    char gb[80];
    int64_t v = 0;
    int rc = n->type == YAML_SCALAR_NODE ? parse_int(scalar(n), &v) : -1;
    if (rc == -1) {
        diag(c, n, path, "expected %s, got %s", int_phrase(lo), got(n, gb, sizeof gb));
        return -1;
    }
    if (rc == -2 || v < lo || v > hi) {
        /* "must be >= lo" only for a value below lo; one too big for int64
         * (a seed of 2^63) is above the range, which then is named. */
        bool below = rc == -2 ? scalar(n)[0] == '-' : v < lo;
        if (hi == INT64_MAX && below)
            diag(c, n, path, "must be >= %" PRId64 ", got %s", lo, scalar(n));
        else
            diag(c, n, path, "%s is out of range %" PRId64 "..%" PRId64, scalar(n), lo, hi);
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
    const char *guess = n->type == YAML_SCALAR_NODE ? kiln_did_you_mean(scalar(n), names) : NULL;
    if (guess != NULL)
        diag(c, n, path, "%s is not one of %s (did you mean \"%s\"?)", got(n, gb, sizeof gb), list,
             guess);
    else
        diag(c, n, path, "%s is not one of %s", got(n, gb, sizeof gb), list);
}

static char *dup_or_flag(ctx_t *c, const char *s)
{
    char *d = kiln_strdup(s);
    if (d == NULL)
        c->nomem = true;
    return d;
}

/* ---- the walker ----------------------------------------------------------------------- */
static void walk_map(ctx_t *c, const field_t *fields, const yaml_node_t *map, char *base,
                     const char *path);

/* Paths are cut at PATH_MAX_LEN - 1 bytes; no spec nests that deep. */
static void join(char *out, const char *parent, const char *key)
{
    if (snprintf(out, PATH_MAX_LEN, "%s%s%s", parent, *parent ? "." : "", key) >= PATH_MAX_LEN)
        out[PATH_MAX_LEN - 1] = '\0';
}

static void index_path(char *out, const char *parent, int i)
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
    const char *guess = kiln_did_you_mean(scalar(key), keys);
    if (guess != NULL) {
        diag(c, key, path, "unknown field (did you mean \"%s\"?)", guess);
        return;
    }
    char list[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", keys[i]);
    diag(c, key, path, "unknown field (expected one of: %s)", list);
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
    diag(c, at, child, "required field is missing");
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
            diag(c, val, path, "expected %s, got %s", int_phrase(f->lo), got(val, gb, sizeof gb));
        else
            diag(c, val, path, "expected %s, got %s", what[f->type], got(val, gb, sizeof gb));
        return;
    }
    switch (f->type) {
    case T_STR: {
        const char *s = scalar(val);
        if ((f->flags & F_NONEMPTY) && *s == '\0') {
            diag(c, val, path, "must not be empty");
            return;
        }
        const char *why = f->check ? f->check(s, buf, sizeof buf) : NULL;
        if (why != NULL) {
            diag(c, val, path, "%s", why);
            return;
        }
        free(*(char **)p);
        *(char **)p = dup_or_flag(c, s);
        break;
    }
    case T_INT:
        if (get_int(c, val, path, f->lo, f->hi, &iv) == 0)
            *(int *)p = (int)iv;
        break;
    case T_I64:
        if (get_int(c, val, path, f->lo, f->hi, &iv) == 0)
            *(int64_t *)p = iv;
        break;
    case T_U64:
        if (get_int(c, val, path, f->lo, f->hi, &iv) == 0)
            *(uint64_t *)p = (uint64_t)iv;
        break;
    case T_NUM: {
        if ((f->flags & F_NONE_OK) && strcmp(scalar(val), "none") == 0) {
            *(double *)p = NAN;
            break;
        }
        if (parse_num(scalar(val), &dv) < 0) {
            diag(c, val, path, "expected a number, got %s", got(val, gb, sizeof gb));
            return;
        }
        bool lo_ok = (f->flags & F_LO_OPEN) ? dv > f->dlo : dv >= f->dlo;
        bool hi_ok = (f->flags & F_HI_OPEN) ? dv < f->dhi : dv <= f->dhi;
        if (!lo_ok || !hi_ok) {
            if (isinf(f->dhi))
                diag(c, val, path, "must be %s %g, got %s",
                     (f->flags & F_LO_OPEN) ? ">" : ">=", f->dlo, scalar(val));
            else
                diag(c, val, path, "must be in %c%g, %g%c, got %s",
                     (f->flags & F_LO_OPEN) ? '(' : '[', f->dlo, f->dhi,
                     (f->flags & F_HI_OPEN) ? ')' : ']', scalar(val));
            return;
        }
        *(double *)p = dv;
        break;
    }
    case T_BOOL: {
        const char *s = scalar(val);
        if (strcmp(s, "true") == 0 || strcmp(s, "True") == 0 || strcmp(s, "TRUE") == 0)
            *(bool *)p = true;
        else if (strcmp(s, "false") == 0 || strcmp(s, "False") == 0 || strcmp(s, "FALSE") == 0)
            *(bool *)p = false;
        else
            diag(c, val, path, "expected true or false, got %s", got(val, gb, sizeof gb));
        break;
    }
    case T_DUR: {
        const char *s = scalar(val);
        if ((f->flags & F_NONE_OK) && strcmp(s, "none") == 0) {
            *(int64_t *)p = 0;
            break;
        }
        int rc = kiln_duration_parse(s, &iv);
        if (rc == KILN_ERANGE) {
            diag(c, val, path, "duration \"%s\" is too long", s);
            return;
        }
        if (rc < 0) {
            diag(c, val, path, "expected a duration like 30s, 5m, 2h or 1h30m%s, got %s",
                 (f->flags & F_NONE_OK) ? " (or none)" : "", got(val, gb, sizeof gb));
            return;
        }
        if (iv < f->lo) {
            char d1[32], d2[32];
            diag(c, val, path, "must be at least %s, got %s",
                 kiln_duration_format(f->lo, d1, sizeof d1),
                 kiln_duration_format(iv, d2, sizeof d2));
            return;
        }
        *(int64_t *)p = iv;
        break;
    }
    case T_ENUM:
        for (int i = 0; f->names[i] != NULL; i++)
            if (strcmp(f->names[i], scalar(val)) == 0) {
                *(int *)p = i;
                return;
            }
        bad_enum(c, val, path, f->names);
        break;
    case T_MAP:
        walk_map(c, f->sub, val, p, path);
        break;
    case T_INTLIST: {
        if (val->type != YAML_SEQUENCE_NODE) {
            diag(c, val, path, "expected a list of layer widths like [64, 16], got %s",
                 got(val, gb, sizeof gb));
            return;
        }
        yaml_node_item_t *items = val->data.sequence.items.start;
        int n = (int)(val->data.sequence.items.top - items);
        if (n < 1 || n > f->maxlen) {
            diag(c, val, path, "must list 1 to %d widths, got %d", f->maxlen, n);
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
            index_path(ip, path, i);
            if (get_int(c, yaml_document_get_node(c->doc, items[i]), ip, f->lo, f->hi, &iv) < 0)
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
static bool visit(ctx_t *c, const yaml_node_t *n)
{
    if (c->over_budget)
        return false;
    if (++c->visits <= JOB_SPEC_MAX_NODES)
        return true;
    c->over_budget = true;
    size_t first = c->first; /* this one is kept even when the list is full */
    c->first = c->diags->n;
    diag(c, n, "",
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
            if (strcmp(scalar(prev), scalar(key)) == 0) {
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
static void walk_map(ctx_t *c, const field_t *fields, const yaml_node_t *map, char *base,
                     const char *path)
{
    char gb[80], child[PATH_MAX_LEN];
    if (map->type != YAML_MAPPING_NODE) {
        diag(c, map, path, "expected a mapping of fields, got %s", got(map, gb, sizeof gb));
        return;
    }
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
        if (!visit(c, key))
            break;
        if (key->type != YAML_SCALAR_NODE) {
            diag(c, key, path, "field names must be plain strings, got %s",
                 got(key, gb, sizeof gb));
            continue;
        }
        const char *k = scalar(key);
        join(child, path, k);
        if (dup[i] >= 0) {
            const yaml_node_t *prev = yaml_document_get_node(c->doc, pairs[dup[i]].key);
            diag(c, key, child, "duplicate field (first given at line %d)",
                 (int)prev->start_mark.line + 1);
            continue;
        }
        size_t extra = 0;
        const field_t *f = find_field(fields, k, &extra);
        if (f == NULL) {
            unknown_key(c, fields, key, child);
            continue;
        }
        if (is_null(val))
            continue; /* keep the default; required fields are reported below */
        note_seen(c, child, val);
        set_field(c, f, val, base + extra, child);
    }
    free(dup);
    for (const field_t *f = fields; f->key != NULL; f++) {
        if (!(f->flags & F_REQUIRED))
            continue;
        join(child, path, f->key);
        if (seen(c, child) == NULL)
            report_missing(c, f, map, path);
    }
}

/* ---- custom fields -------------------------------------------------------------------- */
static void parse_init_from(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                            const char *path)
{
    char gb[80];
    job_spec_t *s = c->spec;
    if (val->type != YAML_SCALAR_NODE || scalar(val)[0] == '\0') {
        diag(c, val, path, "expected latest, none or a checkpoint id, got %s",
             val->type == YAML_SCALAR_NODE ? "an empty string" : got(val, gb, sizeof gb));
        return;
    }
    const char *v = scalar(val);
    free(s->train.init_from_checkpoint);
    s->train.init_from_checkpoint = NULL;
    if (strcmp(v, "latest") == 0) {
        s->train.init_from = JOB_INITFROM_LATEST;
    } else if (strcmp(v, "none") == 0) {
        s->train.init_from = JOB_INITFROM_NONE;
    } else {
        s->train.init_from = JOB_INITFROM_CHECKPOINT;
        s->train.init_from_checkpoint = dup_or_flag(c, v);
    }
}

/* A list of strings (a single string is a list of one), each checked by
 * check(); NULL when the node is not that (reported), *n the count. */
static char **string_items(ctx_t *c, const yaml_node_t *val, const char *path, int max,
                           const char *what, check_fn check, int *n)
{
    char gb[80], buf[512], ip[PATH_MAX_LEN];
    const yaml_node_t *one[1] = {val};
    yaml_node_item_t *items = NULL;
    *n = 1;
    if (val->type == YAML_SEQUENCE_NODE) {
        items = val->data.sequence.items.start;
        *n = (int)(val->data.sequence.items.top - items);
    } else if (val->type != YAML_SCALAR_NODE) {
        diag(c, val, path, "expected %s, got %s", what, got(val, gb, sizeof gb));
        return NULL;
    }
    if (*n < 1 || *n > max) {
        diag(c, val, path, "must list 1 to %d items, got %d", max, *n);
        return NULL;
    }
    char **out = kiln_calloc((size_t)*n + 1, sizeof *out);
    if (out == NULL) {
        c->nomem = true;
        return NULL;
    }
    bool ok = true;
    for (int i = 0; i < *n; i++) {
        const yaml_node_t *it = items ? yaml_document_get_node(c->doc, items[i]) : one[0];
        if (items)
            index_path(ip, path, i);
        else
            snprintf(ip, sizeof ip, "%s", path);
        const char *why = it->type != YAML_SCALAR_NODE ? "expected a string"
                                                        : check(scalar(it), buf, sizeof buf);
        if (why != NULL) {
            diag(c, it, ip, "%s", why);
            ok = false;
        } else if ((out[i] = kiln_strdup(scalar(it))) == NULL) {
            c->nomem = true;
            ok = false;
        }
    }
    if (!ok) {
        for (int i = 0; i < *n; i++)
            free(out[i]);
        free(out);
        return NULL;
    }
    return out;
}

/* An interface name (eth0, ib0, enp1s0f0.100) or an IPv4 subnet (10.1.0.0/16). */
static const char *check_interface(const char *s, char *buf, size_t bufsz)
{
    unsigned a, b, cc, d, bits;
    char end;
    if (sscanf(s, "%u.%u.%u.%u/%u%c", &a, &b, &cc, &d, &bits, &end) == 5 && a < 256 &&
        b < 256 && cc < 256 && d < 256 && bits <= 32)
        return NULL;
    if (*s != '\0' && strlen(s) <= 15 && made_of(s, "_.:@-"))
        return NULL;
    snprintf(buf, bufsz,
             "\"%.80s\" is neither a network interface name (like eth0) nor an IPv4 subnet "
             "(like 10.1.0.0/16)",
             s);
    return buf;
}

static void parse_interfaces(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                             const char *path)
{
    int n = 0;
    char **v = string_items(c, val, path, 16, "an interface or a list of them", check_interface,
                            &n);
    if (v == NULL)
        return;
    size_t len = 1;
    for (int i = 0; i < n; i++)
        len += strlen(v[i]) + 1;
    char *joined = kiln_calloc(1, len);
    for (int i = 0; i < n; i++) {
        if (joined != NULL) {
            strcat(joined, i ? "," : "");
            strcat(joined, v[i]);
        }
        free(v[i]);
    }
    free(v);
    if (joined == NULL)
        c->nomem = true;
    char **p = (char **)(base + f->off);
    free(*p);
    *p = joined;
}

/* sbatch options Kiln sets itself, and the spec field that says each. */
static const struct {
    char shrt; /* 0: no short form */
    const char *lng, *field;
} sbatch_owned[] = {
    {'n', "--ntasks", "resources.ranks"},
    {'N', "--nodes", "resources.nodes"},
    {'p', "--partition", "resources.partition"},
    {'A', "--account", "resources.account"},
    {'t', "--time", "resources.timeout"},
    {'c', "--cpus-per-task", "resources.threads"},
    {0, "--gpus-per-node", "resources.gpus_per_node"},
    {'J', "--job-name", NULL},
    {'o', "--output", NULL},
    {'e', "--error", NULL},
    {'D', "--chdir", NULL},
    {0, "--open-mode", NULL},
    {'W', "--wait", NULL},
    {0, "--parsable", NULL},
    {0, "--requeue", NULL},
    {0, "--no-requeue", NULL},
    {0, "--wrap", NULL},
};

static const char *check_sbatch_arg(const char *s, char *buf, size_t bufsz)
{
    if (s[0] != '-' || s[1] == '\0' || strpbrk(s, "\n\r") != NULL) {
        snprintf(buf, bufsz,
                 "\"%.80s\" is not an option: give each sbatch option as one item, "
                 "--name=value (like --qos=high) or -xVALUE",
                 s);
        return buf;
    }
    for (size_t i = 0; i < sizeof sbatch_owned / sizeof sbatch_owned[0]; i++) {
        size_t l = strlen(sbatch_owned[i].lng);
        bool hit = (strncmp(s, sbatch_owned[i].lng, l) == 0 && (s[l] == '\0' || s[l] == '=')) ||
                   (sbatch_owned[i].shrt != 0 && s[1] == sbatch_owned[i].shrt);
        if (!hit)
            continue;
        if (sbatch_owned[i].field != NULL)
            snprintf(buf, bufsz, "%s is set from %s; give it there", sbatch_owned[i].lng,
                     sbatch_owned[i].field);
        else
            snprintf(buf, bufsz, "%s is set by Kiln (docs/cluster.md)", sbatch_owned[i].lng);
        return buf;
    }
    return NULL;
}

static void parse_sbatch_args(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                              const char *path)
{
    int n = 0;
    char **v = string_items(c, val, path, 64, "a list of sbatch options", check_sbatch_arg, &n);
    if (v == NULL)
        return;
    char ***p = (char ***)(base + f->off);
    for (int i = 0; *p != NULL && (*p)[i] != NULL; i++)
        free((*p)[i]);
    free(*p);
    *p = v;
    *(int *)(base + f->off2) = n;
}

static void parse_endpoints(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                            const char *path)
{
    char gb[80], ip[PATH_MAX_LEN];
    if (val->type != YAML_SEQUENCE_NODE) {
        diag(c, val, path, "expected a list of {url, model, label}, got %s",
             got(val, gb, sizeof gb));
        return;
    }
    yaml_node_item_t *items = val->data.sequence.items.start;
    int n = (int)(val->data.sequence.items.top - items);
    if (n > 64) {
        diag(c, val, path, "at most 64 endpoints are allowed, got %d", n);
        return;
    }
    if (n == 0)
        return;
    job_endpoint_t *eps = kiln_calloc((size_t)n, sizeof *eps);
    if (eps == NULL) {
        c->nomem = true;
        return;
    }
    c->spec->push.endpoints = eps;
    c->spec->push.nendpoints = n;
    for (int i = 0; i < n; i++) {
        const yaml_node_t *item = yaml_document_get_node(c->doc, items[i]);
        index_path(ip, path, i);
        apply_defaults(c, endpoint_fields, (char *)&eps[i]); /* auto: true */
        walk_map(c, endpoint_fields, item, (char *)&eps[i], ip);
        for (int j = 0; j < i; j++) {
            if (eps[i].url && eps[j].url && eps[i].model && eps[j].model && eps[i].label &&
                eps[j].label && strcmp(eps[i].url, eps[j].url) == 0 &&
                strcmp(eps[i].model, eps[j].model) == 0 &&
                strcmp(eps[i].label, eps[j].label) == 0) {
                diag(c, item, ip, "same url, model and label as %s[%d]; list each endpoint once",
                     path, j);
                break;
            }
        }
    }
}

static void defer_tables(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                         const char *path)
{
    c->tables = val; /* walked by build_tables() once data.cat_slots is known */
}

static void parse_slots(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                        const char *path)
{
    char ip[PATH_MAX_LEN];
    job_table_t *t = (job_table_t *)base;
    int self = (int)(t - c->spec->model.tables);
    int cat = c->spec->data.cat_slots;
    const yaml_node_t *one = val;
    int n = 1;
    yaml_node_item_t *items = NULL;
    if (val->type == YAML_SEQUENCE_NODE) {
        items = val->data.sequence.items.start;
        n = (int)(val->data.sequence.items.top - items);
        if (n == 0) {
            diag(c, val, path, "a table must read at least one slot");
            return;
        }
    } else if (val->type == YAML_MAPPING_NODE) {
        diag(c, val, path, "expected a slot index or a list of them, got a mapping");
        return;
    }
    free(t->slots);
    t->nslots = 0;
    if ((t->slots = kiln_calloc((size_t)n, sizeof *t->slots)) == NULL) {
        c->nomem = true;
        return;
    }
    for (int i = 0; i < n; i++) {
        const yaml_node_t *node = items ? yaml_document_get_node(c->doc, items[i]) : one;
        if (!visit(c, node))
            break;
        if (items)
            index_path(ip, path, i);
        else
            snprintf(ip, sizeof ip, "%s", path);
        int64_t s;
        if (get_int(c, node, ip, 0, INT64_MAX, &s) < 0)
            continue;
        if (s >= cat) {
            diag(c, node, ip, "slot %" PRId64 " is out of range 0..%d (data.cat_slots is %d)", s,
                 cat - 1, cat);
            continue;
        }
        if (c->slot_owner[s] >= 0) {
            if (c->slot_owner[s] == self)
                diag(c, node, ip, "slot %" PRId64 " is listed twice in this table", s);
            else
                diag(c, node, ip,
                     "slot %" PRId64 " is already read by model.tables[%d]; each "
                     "slot belongs to exactly one table",
                     s, c->slot_owner[s]);
            continue;
        }
        c->slot_owner[s] = self;
        t->slots[t->nslots++] = (int)s;
    }
}

/* ---- cross-field checks ---------------------------------------------------------------- */

/* Fills model.tables: the user's tables (model.tables, in order) and then
 * one default table "slot<i>" for every slot no user table reads. */
static void build_tables(ctx_t *c)
{
    job_spec_t *s = c->spec;
    int cat = s->data.cat_slots, nuser = 0;
    char ip[PATH_MAX_LEN], gb[80];
    if (c->tables != NULL && c->tables->type != YAML_SEQUENCE_NODE) {
        diag(c, c->tables, "model.tables", "expected a list of tables, got %s",
             got(c->tables, gb, sizeof gb));
    } else if (c->tables != NULL) {
        nuser = (int)(c->tables->data.sequence.items.top - c->tables->data.sequence.items.start);
    }
    if (nuser > cat) {
        diag(c, c->tables, "model.tables", "%d tables for %d slots; a table reads one slot or more",
             nuser, cat);
        nuser = 0;
    }
    s->model.tables = kiln_calloc((size_t)(nuser + cat), sizeof *s->model.tables);
    c->slot_owner = kiln_calloc((size_t)cat, sizeof *c->slot_owner);
    if (s->model.tables == NULL || c->slot_owner == NULL) {
        c->nomem = true;
        return;
    }
    for (int i = 0; i < cat; i++)
        c->slot_owner[i] = -1;
    for (int i = 0; i < nuser; i++) {
        const yaml_node_t *item =
            yaml_document_get_node(c->doc, c->tables->data.sequence.items.start[i]);
        job_table_t *t = &s->model.tables[s->model.ntables++];
        t->emb = s->model.embedding;
        index_path(ip, "model.tables", i);
        walk_map(c, table_fields, item, (char *)t, ip);
    }
    for (int i = 0; i < nuser; i++) {
        const job_table_t *t = &s->model.tables[i];
        if (t->name == NULL)
            continue;
        int line, col;
        snprintf(ip, sizeof ip, "model.tables[%d].name", i);
        where(c, &line, &col, ip, NULL);
        for (int j = 0; j < i; j++)
            if (s->model.tables[j].name && strcmp(s->model.tables[j].name, t->name) == 0) {
                diag_at(c, line, col, ip, "\"%s\" is also the name of model.tables[%d]", t->name,
                        j);
                break;
            }
        int slot;
        if (sscanf(t->name, "slot%d", &slot) == 1 && slot >= 0 && slot < cat &&
            c->slot_owner[slot] < 0) {
            char again[32];
            snprintf(again, sizeof again, "slot%d", slot);
            if (strcmp(again, t->name) == 0)
                diag_at(c, line, col, ip,
                        "\"%s\" is the name of slot %d's default table (no table lists slot %d); "
                        "pick another name or list slot %d",
                        t->name, slot, slot, slot);
        }
    }
    for (int slot = 0; slot < cat; slot++) {
        if (c->slot_owner[slot] >= 0)
            continue;
        job_table_t *t = &s->model.tables[s->model.ntables++];
        t->emb = s->model.embedding;
        t->name = kiln_asprintf("slot%d", slot);
        t->slots = kiln_malloc(sizeof *t->slots);
        if (t->name == NULL || t->slots == NULL) {
            c->nomem = true;
            return;
        }
        t->slots[0] = slot;
        t->nslots = 1;
    }
}

static int *int_list(ctx_t *c, const int *v, int n)
{
    int *out = kiln_calloc((size_t)n, sizeof *out);
    if (out == NULL)
        c->nomem = true;
    else
        memcpy(out, v, (size_t)n * sizeof *out);
    return out;
}

static void check_model(ctx_t *c)
{
    job_spec_t *s = c->spec;
    int line, col;
    char ip[PATH_MAX_LEN];
    const char *type = job_model_type_name(s->model.type);
    if (s->model.type != JOB_MODEL_FM && seen(c, "model.fm_dense_factors") != NULL) {
        where(c, &line, &col, "model.fm_dense_factors", NULL);
        diag_at(c, line, col, "model.fm_dense_factors",
                "only fm has dense factors (model.type is %s)", type);
    }
    if (s->model.type != JOB_MODEL_DLRM) {
        static const char *const mlps[] = {"model.bottom_mlp", "model.top_mlp"};
        for (int i = 0; i < 2; i++) {
            if (seen(c, mlps[i]) == NULL)
                continue;
            where(c, &line, &col, mlps[i], NULL);
            diag_at(c, line, col, mlps[i], "only dlrm has MLPs (model.type is %s)", type);
        }
    } else {
        if (s->model.nbottom == 0) {
            int def[2] = {64, s->model.embedding.dim};
            s->model.bottom_mlp = int_list(c, def, 2);
            s->model.nbottom = s->model.bottom_mlp ? 2 : 0;
        }
        if (s->model.ntop == 0) {
            static const int def[3] = {256, 128, 1};
            s->model.top_mlp = int_list(c, def, 3);
            s->model.ntop = s->model.top_mlp ? 3 : 0;
        }
        if (s->model.ntop > 0 && s->model.top_mlp[s->model.ntop - 1] != 1) {
            where(c, &line, &col, "model.top_mlp", NULL);
            diag_at(c, line, col, "model.top_mlp",
                    "the last layer must have width 1 (the logit), got %d",
                    s->model.top_mlp[s->model.ntop - 1]);
        }
        int last = s->model.nbottom > 0 ? s->model.bottom_mlp[s->model.nbottom - 1] : 0;
        if (s->model.nbottom > 0 && last != s->model.embedding.dim) {
            where(c, &line, &col, "model.bottom_mlp", NULL);
            diag_at(c, line, col, "model.bottom_mlp",
                    "the last width (%d) must equal model.embedding.dim (%d): DLRM's dot "
                    "interaction multiplies the dense vector with every embedding",
                    last, s->model.embedding.dim);
        }
    }
    /* dlrm and fm multiply embeddings with each other: one dim for all. */
    if (s->model.type == JOB_MODEL_LR)
        return;
    for (int i = 0; i < s->model.ntables; i++) {
        snprintf(ip, sizeof ip, "model.tables[%d].dim", i);
        if (seen(c, ip) == NULL || s->model.tables[i].emb.dim == s->model.embedding.dim)
            continue;
        where(c, &line, &col, ip, NULL);
        diag_at(c, line, col, ip, "%s needs every table to have model.embedding.dim (%d), got %d",
                type, s->model.embedding.dim, s->model.tables[i].emb.dim);
    }
}

int64_t job_rows_per_rank(int64_t capacity, int nranks, bool gpu_mirror)
{
    if (nranks < 1)
        nranks = 1;
    int64_t rows = capacity / nranks + (capacity % nranks != 0);
    if (nranks > 1)
        rows += rows / 20 + 64;
    if (gpu_mirror)
        rows += rows / 50 + 1024;
    return rows;
}

/* A table's capacity is split over resources.ranks; each rank's share must
 * fit the trainer's tables (JOB_MAX_ROWS_PER_RANK), or kiln-train refuses
 * the spec the check passed. With device auto or cuda the share is counted
 * with the GPU store's host mirror, which holds a little more. */
static void check_capacity(ctx_t *c)
{
    const job_spec_t *s = c->spec;
    bool gpu = s->resources.device != JOB_DEVICE_CPU;
    int ranks = s->resources.ranks;
    char path[PATH_MAX_LEN];
    for (int i = -1; i < s->model.ntables; i++) {
        int64_t cap = i < 0 ? s->model.embedding.capacity : s->model.tables[i].emb.capacity;
        if (i < 0)
            snprintf(path, sizeof path, "model.embedding.capacity");
        else
            snprintf(path, sizeof path, "model.tables[%d].capacity", i);
        if (i >= 0 && seen(c, path) == NULL)
            continue;
        if (cap < ranks) {
            int line, col;
            where(c, &line, &col, path, "resources.ranks", NULL);
            diag_at(c, line, col, path,
                    "%" PRId64 " rows over %d ranks leaves a rank without a row: raise it to at "
                    "least %d or lower resources.ranks",
                    cap, ranks, ranks);
            continue;
        }
        if (job_rows_per_rank(cap, ranks, gpu) <= JOB_MAX_ROWS_PER_RANK)
            continue;
        int need = ranks;
        while (need <= 4096 && job_rows_per_rank(cap, need, gpu) > JOB_MAX_ROWS_PER_RANK)
            need++;
        char fix[96];
        if (need <= 4096)
            snprintf(fix, sizeof fix, "lower it or raise resources.ranks to at least %d", need);
        else
            snprintf(fix, sizeof fix, "lower it");
        int line, col;
        where(c, &line, &col, path, "resources.ranks", NULL);
        diag_at(c, line, col, path,
                "%" PRId64 " rows over %d rank%s is %" PRId64 " rows per rank%s, more than the "
                "%" PRId64 " a rank's table can hold (row ids are 32-bit): %s",
                cap, ranks, ranks == 1 ? "" : "s", job_rows_per_rank(cap, ranks, gpu),
                gpu ? " (with device auto or cuda, counting the GPU's host mirror)" : "",
                JOB_MAX_ROWS_PER_RANK, fix);
    }
}

/* The resources only launcher: slurm reads, and what they must agree with. */
static void check_slurm_fields(ctx_t *c)
{
    static const char *const only[] = {"resources.nodes", "resources.partition",
                                       "resources.account", "resources.gpus_per_node",
                                       "resources.sbatch_args"};
    job_spec_t *s = c->spec;
    int line, col;
    if (s->resources.launcher != JOB_LAUNCH_SLURM) {
        for (size_t i = 0; i < sizeof only / sizeof only[0]; i++) {
            if (seen(c, only[i]) == NULL)
                continue;
            where(c, &line, &col, only[i], NULL);
            diag_at(c, line, col, only[i], "only used with launcher: slurm (launcher is %s)",
                    job_launcher_name(s->resources.launcher));
        }
        return;
    }
    if (s->resources.nodes > s->resources.ranks) {
        where(c, &line, &col, "resources.nodes", NULL);
        diag_at(c, line, col, "resources.nodes",
                "%d nodes for %d ranks: every node runs at least one rank (raise "
                "resources.ranks or lower resources.nodes)",
                s->resources.nodes, s->resources.ranks);
    }
    if (s->resources.gpus_per_node > 0 && s->resources.device == JOB_DEVICE_CPU) {
        where(c, &line, &col, "resources.gpus_per_node", NULL);
        diag_at(c, line, col, "resources.gpus_per_node",
                "asks for GPUs but resources.device is cpu (use auto or cuda)");
    }
}

/* Checks and defaults that span fields; run after the walk. */
static void check_spec(ctx_t *c)
{
    job_spec_t *s = c->spec;
    int line, col;

    if (s->checkpoint.dir == NULL && s->name != NULL &&
        (s->checkpoint.dir = kiln_asprintf("ckpt/%s", s->name)) == NULL)
        c->nomem = true;

    static const char *const eps_paths[] = {"train.optimizer.sparse.eps",
                                            "train.optimizer.dense.eps"};
    job_optimizer_t *opts[] = {&s->train.sparse, &s->train.dense};
    for (int i = 0; i < 2; i++)
        if (opts[i]->type == JOB_OPT_ADAM && seen(c, eps_paths[i]) == NULL)
            opts[i]->eps = 1e-8;

    if (s->resources.launcher == JOB_LAUNCH_HOSTFILE && s->resources.hostfile == NULL) {
        where(c, &line, &col, "resources.launcher", NULL);
        diag_at(c, line, col, "resources.hostfile",
                "required with launcher: hostfile (a file listing the hosts to run on)");
    } else if (s->resources.launcher != JOB_LAUNCH_HOSTFILE && s->resources.hostfile != NULL) {
        where(c, &line, &col, "resources.hostfile", NULL);
        diag_at(c, line, col, "resources.hostfile",
                "only used with launcher: hostfile (launcher is %s)",
                job_launcher_name(s->resources.launcher));
    }

    check_slurm_fields(c);

    if (s->retries.max_backoff_ms < s->retries.backoff_ms) {
        char d1[32], d2[32];
        where(c, &line, &col, "retries.max_backoff", "retries.backoff", NULL);
        diag_at(c, line, col, "retries.max_backoff", "%s is shorter than retries.backoff (%s)",
                kiln_duration_format(s->retries.max_backoff_ms, d1, sizeof d1),
                kiln_duration_format(s->retries.backoff_ms, d2, sizeof d2));
    }

    build_tables(c);
    check_model(c);
    check_capacity(c);

    if (s->train.mode == JOB_MODE_BATCH && s->export_.every_ms > 0) {
        where(c, &line, &col, "export.every", NULL);
        diag_at(c, line, col, "export.every",
                "only online jobs export while training (train.mode is batch; a batch job "
                "exports at its end with export.on_success)");
    } else if (s->train.mode == JOB_MODE_ONLINE && seen(c, "export.every") == NULL) {
        where(c, &line, &col, "train.mode", NULL);
        diag_at(c, line, col, "export.every",
                "required with train.mode: online (how often the running trainer exports, "
                "e.g. 30s; 0 or none for never)");
    }
}

/* ---- entry points ------------------------------------------------------------------------ */
void job_spec_fini(job_spec_t *s)
{
    if (s == NULL)
        return;
    free(s->name);
    free(s->description);
    free(s->schedule);
    free(s->timezone);
    free(s->resources.hostfile);
    free(s->resources.partition);
    free(s->resources.account);
    for (int i = 0; i < s->resources.nsbatch_args; i++)
        free(s->resources.sbatch_args[i]);
    free(s->resources.sbatch_args);
    free(s->resources.mpi.interfaces);
    free(s->data.train);
    free(s->data.eval);
    free(s->model.bottom_mlp);
    free(s->model.top_mlp);
    for (int i = 0; i < s->model.ntables; i++) {
        free(s->model.tables[i].name);
        free(s->model.tables[i].slots);
    }
    free(s->model.tables);
    free(s->train.init_from_checkpoint);
    free(s->checkpoint.dir);
    free(s->push.token_env);
    for (int i = 0; i < s->push.nendpoints; i++) {
        free(s->push.endpoints[i].url);
        free(s->push.endpoints[i].model);
        free(s->push.endpoints[i].label);
    }
    free(s->push.endpoints);
    memset(s, 0, sizeof *s);
}

/* Line (1-based) of byte offset off in text, for reader errors that carry
 * only an offset. */
static int line_of(const char *text, size_t len, size_t off, int *col)
{
    int line = 1;
    size_t start = 0;
    for (size_t i = 0; i < off && i < len; i++)
        if (text[i] == '\n') {
            line++;
            start = i + 1;
        }
    *col = (int)(off - start) + 1;
    return line;
}

static void syntax_error(ctx_t *c, const yaml_parser_t *p, const char *text, size_t len)
{
    int line, col;
    if (p->error == YAML_READER_ERROR) {
        line = line_of(text, len, p->problem_offset, &col);
    } else {
        line = (int)p->problem_mark.line + 1;
        col = (int)p->problem_mark.column + 1;
    }
    const char *problem = p->problem ? p->problem : "not valid YAML";
    if (p->context != NULL)
        diag_at(c, line, col, "", "YAML syntax error: %s (%s at %d:%d)", problem, p->context,
                (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
    else
        diag_at(c, line, col, "", "YAML syntax error: %s", problem);
}

/* Stable insertion sort into document order (the lists are short). */
static void sort_diags(job_diags_t *d)
{
    for (size_t i = 1; i < d->n; i++) {
        job_diag_t x = d->items[i];
        size_t j = i;
        while (j > 0 && (d->items[j - 1].line > x.line ||
                         (d->items[j - 1].line == x.line && d->items[j - 1].col > x.col))) {
            d->items[j] = d->items[j - 1];
            j--;
        }
        d->items[j] = x;
    }
}

/* Reports a spec over JOB_SPEC_MAX_BYTES (size: its size in bytes). */
static int refuse_size(const char *file, uint64_t size, job_diags_t *diags)
{
    job_diags_t local;
    job_diags_init(&local);
    ctx_t c = {.file = file ? file : "<spec>", .diags = diags ? diags : &local};
    c.first = c.diags->n;
    diag_at(&c, 0, 0, "",
            "the job spec is %" PRIu64 " bytes; a job spec may be at most %d bytes (1 MiB): is "
            "it the right file?",
            size, JOB_SPEC_MAX_BYTES);
    int rc = c.nomem ? kiln_errf(KILN_ENOMEM, "out of memory while checking the job spec")
                     : kiln_errf(KILN_ESPEC, "%s", c.diags->items[c.diags->n - 1].message);
    job_diags_fini(&local);
    return rc;
}

/* Walks libyaml's events (no document is built) and reports the first
 * mapping or list that opens more than JOB_SPEC_MAX_DEPTH levels deep.
 * Returns true when the depth is fine or the text is not valid YAML (the
 * loader then reports the syntax error); false after the diagnostic. Stops
 * at the first level too deep, so the scanner's O(depth) per token never
 * meets a deep document. */
static bool depth_ok(ctx_t *c, const char *text, size_t len)
{
    yaml_parser_t p;
    yaml_event_t ev;
    int depth = 0;
    bool ok = true, more = true;
    if (!yaml_parser_initialize(&p)) {
        c->nomem = true;
        return false;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    while (more && yaml_parser_parse(&p, &ev)) {
        if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) {
            if (++depth > JOB_SPEC_MAX_DEPTH) {
                diag_at(c, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1, "",
                        "the job spec nests more than %d levels deep here; a job spec needs "
                        "at most 6",
                        JOB_SPEC_MAX_DEPTH);
                ok = false;
                more = false;
            }
        } else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (ev.type == YAML_STREAM_END_EVENT) {
            more = false;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return ok;
}

int job_spec_parse(const char *text, size_t len, const char *filename, job_spec_t *spec,
                   job_diags_t *diags)
{
    yaml_parser_t parser;
    yaml_document_t doc, extra;
    bool have_doc = false, have_extra = false;
    job_diags_t local;
    ctx_t c = {.file = filename ? filename : "<spec>",
               .doc = &doc,
               .spec = spec,
               .diags = diags ? diags : &local};
    int rc = 0;

    memset(spec, 0, sizeof *spec);
    if (len > JOB_SPEC_MAX_BYTES)
        return refuse_size(filename, len, diags);
    job_diags_init(&local);
    c.first = c.diags->n;
    if (!yaml_parser_initialize(&parser))
        return kiln_errf(KILN_ENOMEM, "cannot allocate a YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);

    if (!depth_ok(&c, text, len))
        goto done;
    if (!yaml_parser_load(&parser, &doc)) {
        if (parser.error == YAML_MEMORY_ERROR) {
            rc = kiln_errf(KILN_ENOMEM, "out of memory while reading the job spec");
            goto out;
        }
        syntax_error(&c, &parser, text, len);
        goto done;
    }
    have_doc = true;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root == NULL || is_null(root)) {
        diag_at(&c, root ? (int)root->start_mark.line + 1 : 1,
                root ? (int)root->start_mark.column + 1 : 1, "",
                "the job spec is empty (it needs at least name: and data: {train: ...})");
        goto done;
    }
    if (!yaml_parser_load(&parser, &extra)) {
        syntax_error(&c, &parser, text, len);
    } else {
        have_extra = true;
        yaml_node_t *r2 = yaml_document_get_root_node(&extra);
        if (r2 != NULL)
            diag_at(&c, (int)r2->start_mark.line + 1, (int)r2->start_mark.column + 1, "",
                    "a job spec is one YAML document; a second one starts here");
    }
    if (root->type != YAML_MAPPING_NODE) {
        char gb[80];
        diag(&c, root, "",
             "the top level must be a mapping of fields (name: ..., data: ...), "
             "got %s",
             got(root, gb, sizeof gb));
        goto done;
    }
    apply_defaults(&c, top_fields, (char *)spec);
    walk_map(&c, top_fields, root, (char *)spec, "");
    if (!c.over_budget)
        check_spec(&c);

done:
    if (c.nomem) {
        rc = kiln_errf(KILN_ENOMEM, "out of memory while checking the job spec");
        goto out;
    }
    if (c.diags->n > c.first) {
        size_t first = c.first, shown = c.diags->n - first, dropped = c.dropped;
        job_diags_t view = {c.diags->items + first, shown, 0};
        sort_diags(&view);
        if (dropped > 0) {
            /* One last line, after the sorted ones, counts what was left out. */
            c.first = c.diags->n;
            diag_at(&c, 0, 0, "", "%zu more problem%s not listed (the first %d are above)", dropped,
                    dropped == 1 ? "" : "s", JOB_SPEC_MAX_PROBLEMS);
        }
        size_t more = shown - 1 + dropped;
        const char *msg = c.diags->items[first].message;
        if (c.nomem)
            rc = kiln_errf(KILN_ENOMEM, "out of memory while checking the job spec");
        else if (more > 0)
            rc = kiln_errf(KILN_ESPEC, "%s (and %zu more problem%s)", msg, more,
                           more == 1 ? "" : "s");
        else
            rc = kiln_errf(KILN_ESPEC, "%s", msg);
    }
out:
    if (rc < 0)
        job_spec_fini(spec);
    for (size_t i = 0; i < c.nseen; i++)
        free(c.seen[i].path);
    free(c.seen);
    free(c.slot_owner);
    if (have_extra)
        yaml_document_delete(&extra);
    if (have_doc)
        yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    job_diags_fini(&local);
    return rc;
}

int job_spec_load(const char *path, job_spec_t *spec, job_diags_t *diags)
{
    memset(spec, 0, sizeof *spec);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kiln_errf(errno == ENOENT ? KILN_ENOENT : KILN_EIO, "cannot open job spec %s: %s",
                         path, strerror(errno));
    /* One byte more than a spec may hold tells a file that is too big
     * without reading all of it. */
    size_t cap = (size_t)JOB_SPEC_MAX_BYTES + 1, len = 0;
    char *buf = kiln_malloc(cap);
    int rc = 0;
    if (buf == NULL) {
        rc = kiln_errf(KILN_ENOMEM, "cannot read job spec %s: out of memory", path);
        goto out;
    }
    while (len < cap) {
        size_t got_n = fread(buf + len, 1, cap - len, f);
        len += got_n;
        if (got_n == 0)
            break;
    }
    if (ferror(f)) {
        rc = kiln_errf(KILN_EIO, "cannot read job spec %s: %s", path, strerror(errno));
        goto out;
    }
    if (len > JOB_SPEC_MAX_BYTES) {
        struct stat st;
        uint64_t size = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size
                                                                          : (uint64_t)len;
        rc = refuse_size(path, size, diags);
        goto out;
    }
    rc = job_spec_parse(buf, len, path, spec, diags);
out:
    free(buf);
    fclose(f);
    return rc;
}
