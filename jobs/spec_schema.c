/*
 * jobs/spec_schema.c - the job spec's schema: enum spellings (and their
 * job_*_name functions), value checks, the field tables and the parsers of
 * the fields no row type covers (endpoints, model.tables slots, init_from,
 * MPI interfaces, sbatch arguments). Adding a field is adding a row here and
 * a line in docs/job-spec.md.
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

/* ---- enumeration spellings (index = enum value; NULL-terminated) ------- */
static const char *const concurrency_names[] = {"forbid", "allow", "replace", NULL};
static const char *const catchup_names[] = {"none", "latest", "all", NULL};
static const char *const launcher_names[] = {"local", "hostfile", "slurm", NULL};
static const char *const device_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const mpi_transport_names[] = {"auto", "tcp", NULL};
static const char *const format_names[] = {"criteo-tsv", "kiln-bin", "parquet", NULL};
static const char *const dense_transform_names[] = {"auto", "log1p", "none", NULL};
/* The model's enums are model.h's and kern.h's (jobs.h): these spellings are
 * indexed by their values, which is also the order the refusals list them in. */
static const char *const model_type_names[] = {
    [MODEL_LR] = "lr", [MODEL_FM] = "fm", [MODEL_DLRM] = "dlrm", NULL};
static const char *const precision_names[] = {
    [MODEL_DENSE_FP32] = "fp32", [MODEL_DENSE_BF16] = "bf16", NULL};
static const char *const spill_io_names[] = {[KERN_TIER_IO_AUTO] = "auto",
                                             [KERN_TIER_IO_PREAD] = "pread",
                                             [KERN_TIER_IO_URING] = "uring",
                                             [KERN_TIER_IO_MMAP] = "mmap", NULL};
static const char *const combiner_names[] = {
    [KERN_COMBINE_SUM] = "sum", [KERN_COMBINE_MEAN] = "mean", NULL};
static const char *const eviction_names[] = {
    [KERN_EVICT_NONE] = "none", [KERN_EVICT_LRU] = "lru", [KERN_EVICT_LFU] = "lfu", NULL};
static const char *const init_names[] = {
    [KERN_INIT_ZEROS] = "zeros", [KERN_INIT_UNIFORM] = "uniform", [KERN_INIT_NORMAL] = "normal", NULL};
static const char *const optimizer_names[] = {
    [KERN_OPT_SGD] = "sgd", [KERN_OPT_ADAGRAD] = "adagrad", [KERN_OPT_ADAM] = "adam", NULL};
static const char *const init_from_names[] = {"latest", "none", "checkpoint", NULL};
static const char *const export_names[] = {"none", "full", "incremental", NULL};
static const char *const mode_names[] = {"batch", "online", NULL};
static const char *const ready_names[] = {"settle", "marker", NULL};
static const char *const reader_names[] = {"auto", "thread", "team", NULL};

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
ENUM_NAME_FN(job_dense_transform_name, job_dense_transform_t, dense_transform_names)
ENUM_NAME_FN(job_model_type_name, model_type_t, model_type_names)
ENUM_NAME_FN(job_precision_name, model_dense_precision_t, precision_names)
ENUM_NAME_FN(job_combiner_name, kern_combine_t, combiner_names)
ENUM_NAME_FN(job_eviction_name, kern_evict_t, eviction_names)
ENUM_NAME_FN(job_init_name, kern_init_t, init_names)
ENUM_NAME_FN(job_optimizer_type_name, kern_opt_kind_t, optimizer_names)
ENUM_NAME_FN(job_spill_io_name, kern_tier_io_t, spill_io_names)
ENUM_NAME_FN(job_init_from_name, job_init_from_t, init_from_names)
ENUM_NAME_FN(job_export_mode_name, job_export_mode_t, export_names)
ENUM_NAME_FN(job_train_mode_name, job_train_mode_t, mode_names)
ENUM_NAME_FN(job_ready_name, job_ready_t, ready_names)

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

/* A check's complaint: "\"S\" is not WHAT" in buf (s cut to 80 bytes). Returns buf. */
static const char *refuse(const char *s, const char *what, char *buf, size_t bufsz)
{
    snprintf(buf, bufsz, "\"%.80s\" is not %s", s, what);
    return buf;
}

/* Job and table names: a job's name becomes a directory (ckpt/<name>), so
 * "." and ".." (which name the directory itself or its parent) are not
 * names. */
static const char *check_name(const char *s, char *buf, size_t bufsz)
{
    if (is_ident(s, 64) && strcmp(s, ".") != 0 && strcmp(s, "..") != 0)
        return NULL;
    return refuse(s, "a valid name (1 to 64 letters, digits, '_', '.' or '-', and not "
                     ". or ..)", buf, bufsz);
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
    return refuse(s, "a valid label (1 to 32 letters, digits, '_', '.' or '-', not "
                     "starting with '.'; kiln-serve refuses others)", buf, bufsz);
}

static const char *check_model_name(const char *s, char *buf, size_t bufsz)
{
    if (serve_accepts_name(s))
        return NULL;
    return refuse(s, "a model name kiln-serve accepts (1 to 63 letters, digits, '_', "
                     "'.' or '-', not starting with '.')", buf, bufsz);
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
    return refuse(s, "an environment variable name (letters, digits and '_', "
                     "not starting with a digit)", buf, bufsz);
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
    return refuse(s, "a Slurm name (letters, digits, '_', '.', '-'; partitions may be "
                     "a comma-separated list)", buf, bufsz);
}

/* ---- custom field parsers and checks (defined further down) ----------------------- */
static field_fn_t parse_init_from, parse_endpoints, defer_tables, parse_slots, parse_strings,
    parse_memory, parse_ttl, parse_ramp;
static check_fn_t check_interface, check_sbatch_arg, check_column;

/* ---- the schema ------------------------------------------------------------------------
 * Offsets of rows inside a GROUP are relative to job_spec_t (the group is an
 * anonymous struct of it); rows of a MAP are relative to the MAP's member. */
#define MS(ms) ((int64_t)(ms))
#define S_ (MS(1000))
/* A list of strings (parse_strings) at member m of T, its count at n: at
 * most max_ items, each passing chk; what_ says what the list is. */
#define STRLIST(k, T, m, n, fl, chk, max_, what_)                                                  \
    {                                                                                              \
        .key = k, .type = T_FN, .fn = parse_strings, .flags = fl, .check = chk, .maxlen = max_,    \
        .what = what_, .off = offsetof(T, m), .off2 = offsetof(T, n)                               \
    }

static const field_t mpi_fields[] = {
    {.key = "interfaces",
     .type = T_FN,
     .fn = parse_strings,
     .flags = F_JOINED,
     .check = check_interface,
     .maxlen = 16,
     .what = "an interface or a list of them",
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
    STRLIST("sbatch_args", job_spec_t, resources.sbatch_args, resources.nsbatch_args, 0,
            check_sbatch_arg, 64, "a list of sbatch options"),
    GROUP("mpi", mpi_fields, 0),
    FIELD_END};

static const field_t retries_fields[] = {
    INT("count", job_spec_t, retries.count, 0, 0, 100),
    DUR("backoff", job_spec_t, retries.backoff_ms, 30 * S_, 0, 0),
    DUR("max_backoff", job_spec_t, retries.max_backoff_ms, 3600 * S_, 0, 0), FIELD_END};

/* data.columns: a list's maxlen is the most columns it may name. */
static const field_t columns_fields[] = {
    STR("label", job_columns_t, label, "label", F_NONEMPTY, check_column),
    STRLIST("dense", job_columns_t, dense, ndense, F_UNIQUE, check_column, 4096,
            "a list of Parquet column names"),
    STRLIST("categorical", job_columns_t, categorical, ncategorical, F_UNIQUE, check_column, 1024,
            "a list of Parquet column names"),
    ENUM("dense_transform", job_columns_t, dense_transform, JOB_DENSE_AUTO,
         dense_transform_names),
    FIELD_END};

static const field_t data_fields[] = {
    ENUM("format", job_spec_t, data.format, JOB_FMT_CRITEO_TSV, format_names),
    STR("train", job_spec_t, data.train, NULL, F_REQUIRED | F_NONEMPTY, NULL),
    STR("eval", job_spec_t, data.eval, NULL, F_NONEMPTY, NULL),
    BOOL("incremental", job_spec_t, data.incremental, false),
    ENUM("ready", job_spec_t, data.ready, JOB_READY_SETTLE, ready_names),
    DUR("settle", job_spec_t, data.settle_ms, 2 * S_, 0, 0),
    ENUM("reader", job_spec_t, data.reader, JOB_READER_AUTO, reader_names),
    INT("dense_features", job_spec_t, data.dense_features, 13, 0, 4096),
    INT("cat_slots", job_spec_t, data.cat_slots, 26, 1, 1024),
    NUM("max_malformed", job_spec_t, data.max_malformed, 0.01, 0.0, 1.0, 0),
    MAP("columns", job_spec_t, data.columns, columns_fields, 0),
    FIELD_END};

static const field_t admit_fields[] = {
    I64("min_count", job_embedding_t, admit.min_count, 1, 1, 65535),
    I64("sketch_width", job_embedding_t, admit.sketch_width, 65536, 64, INT64_C(1) << 28),
    I64("decay_steps", job_embedding_t, admit.decay_steps, 0, 0, INT64_MAX),
    FIELD_END};

static const field_t embedding_fields[] = {
    INT("dim", job_embedding_t, dim, 16, 1, 1024),
    ENUM("combiner", job_embedding_t, combiner, KERN_COMBINE_SUM, combiner_names),
    I64("capacity", job_embedding_t, capacity, 1000000, 1, INT64_C(1) << 40),
    ENUM("eviction", job_embedding_t, eviction, KERN_EVICT_LRU, eviction_names),
    ENUM("init", job_embedding_t, init, KERN_INIT_UNIFORM, init_names),
    NUM("init_scale", job_embedding_t, init_scale, 0.01, 0.0, INFINITY, 0),
    {.key = "memory", .type = T_FN, .fn = parse_memory},
    GROUP("admit", admit_fields, 0),
    {.key = "ttl", .type = T_FN, .fn = parse_ttl},
    FIELD_END};

/* model.embedding: every table's settings, and the job's spill directory. */
static const field_t model_embedding_fields[] = {
    {.key = "", .type = T_INLINE, .off = 0, .sub = embedding_fields},
    STR("spill_dir", job_embedding_t, spill_dir, NULL, F_NONEMPTY, NULL),
    ENUM("spill_io", job_embedding_t, spill_io, KERN_TIER_IO_AUTO, spill_io_names),
    FIELD_END};

/* One entry of model.tables: a name, the slots it reads, and any of the
 * embedding settings (they start as model.embedding's). */
const field_t spec_table_fields[] = {STR("name", job_table_t, name, NULL, F_REQUIRED, check_name),
                                     FN("slots", parse_slots, F_REQUIRED),
                                     INLINE(job_table_t, emb, embedding_fields), FIELD_END};

static const field_t model_fields[] = {
    ENUM("type", job_spec_t, model.type, MODEL_LR, model_type_names),
    MAP("embedding", job_spec_t, model.embedding, model_embedding_fields, 0),
    INTLIST("bottom_mlp", job_spec_t, model.bottom_mlp, model.nbottom, 1, 65536, 16),
    INTLIST("top_mlp", job_spec_t, model.top_mlp, model.ntop, 1, 65536, 16),
    FN("tables", defer_tables, 0),
    BOOL("fm_dense_factors", job_spec_t, model.fm_dense_factors, false),
    ENUM("dense_precision", job_spec_t, model.dense_precision, MODEL_DENSE_FP32, precision_names),
    FIELD_END};

/* adagrad's eps default (1e-10) is in the table; adam's (1e-8) is applied
 * by check_spec() when eps is not given. */
static const field_t optimizer_fields[] = {
    ENUM("type", job_optimizer_t, type, KERN_OPT_ADAGRAD, optimizer_names),
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
    BOOL("auto", job_endpoint_t, auto_push, true),
    INT("traffic", job_endpoint_t, traffic, 0, 0, 1000000), FIELD_END};

static const field_t promote_when_fields[] = {
    NUM("online_logloss_better_by", job_promote_when_t, online_logloss_better_by, NAN, 0.0,
        INFINITY, F_REQUIRED),
    I64("min_rows", job_promote_when_t, min_rows, 1000, 1, INT64_MAX), FIELD_END};

static const field_t push_fields[] = {
    STR("token_env", job_spec_t, push.token_env, "KILN_SERVE_TOKEN", 0, check_env_name),
    INT("retries", job_spec_t, push.retries, 5, 0, 100),
    DUR("timeout", job_spec_t, push.timeout_ms, 30 * S_, 1, 0),
    NUM("max_regression", job_spec_t, push.max_regression, NAN, 0.0, INFINITY, F_NONE_OK),
    FN("ramp", parse_ramp, 0),
    MAP("promote_when", job_spec_t, push.promote_when, promote_when_fields, 0),
    FN("endpoints", parse_endpoints, 0),
    FIELD_END};

const field_t spec_top_fields[] = {
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

/* ---- custom fields -------------------------------------------------------------------- */
static void parse_init_from(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                            const char *path)
{
    char gb[80];
    job_spec_t *s = c->spec;
    if (val->type != YAML_SCALAR_NODE || spec_scalar(val)[0] == '\0') {
        spec_diag(c, val, path, "expected latest, none or a checkpoint id, got %s",
                  val->type == YAML_SCALAR_NODE ? "an empty string" : spec_got(val, gb, sizeof gb));
        return;
    }
    const char *v = spec_scalar(val);
    free(s->train.init_from_checkpoint);
    s->train.init_from_checkpoint = NULL;
    if (strcmp(v, "latest") == 0) {
        s->train.init_from = JOB_INITFROM_LATEST;
    } else if (strcmp(v, "none") == 0) {
        s->train.init_from = JOB_INITFROM_NONE;
    } else {
        s->train.init_from = JOB_INITFROM_CHECKPOINT;
        s->train.init_from_checkpoint = spec_dup_or_flag(c, v);
    }
}

/* A list of strings (a single string is a list of one), each checked by
 * check(); NULL when the node is not that (reported), *n the count. */
static char **string_items(ctx_t *c, const yaml_node_t *val, const char *path, int max,
                           const char *what, check_fn_t *check, int *n)
{
    char gb[80], buf[512], ip[PATH_MAX_LEN];
    const yaml_node_t *one[1] = {val};
    yaml_node_item_t *items = NULL;
    *n = 1;
    if (val->type == YAML_SEQUENCE_NODE) {
        items = val->data.sequence.items.start;
        *n = (int)(val->data.sequence.items.top - items);
    } else if (val->type != YAML_SCALAR_NODE) {
        spec_diag(c, val, path, "expected %s, got %s", what, spec_got(val, gb, sizeof gb));
        return NULL;
    }
    if (*n < 1 || *n > max) {
        spec_diag(c, val, path, "must list 1 to %d items, got %d", max, *n);
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
            spec_index_path(ip, path, i);
        else
            snprintf(ip, sizeof ip, "%s", path);
        const char *why = it->type != YAML_SCALAR_NODE ? "expected a string"
                                                       : check(spec_scalar(it), buf, sizeof buf);
        if (why != NULL) {
            spec_diag(c, it, ip, "%s", why);
            ok = false;
        } else if ((out[i] = kiln_strdup(spec_scalar(it))) == NULL) {
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
    if (sscanf(s, "%u.%u.%u.%u/%u%c", &a, &b, &cc, &d, &bits, &end) == 5 && a < 256 && b < 256 &&
        cc < 256 && d < 256 && bits <= 32)
        return NULL;
    if (*s != '\0' && strlen(s) <= 15 && made_of(s, "_.:@-"))
        return NULL;
    snprintf(buf, bufsz,
             "\"%.80s\" is neither a network interface name (like eth0) nor an IPv4 subnet "
             "(like 10.1.0.0/16)",
             s);
    return buf;
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
    if (s[0] != '-' || s[1] == '\0' || strpbrk(s, "\n\r") != NULL)
        return refuse(s, "an option: give each sbatch option as one item, "
                         "--name=value (like --qos=high) or -xVALUE", buf, bufsz);
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

/* Replaces the NULL-terminated list at base + f->off (its count at
 * base + f->off2) with v[n], which string_items made. */
static void set_string_list(const field_t *f, char *base, char **v, int n)
{
    char ***p = (char ***)(base + f->off);
    for (int i = 0; *p != NULL && (*p)[i] != NULL; i++)
        free((*p)[i]);
    free(*p);
    *p = v;
    *(int *)(base + f->off2) = n;
}

/* A list of strings (a single string is a list of one) as its row says:
 * at most f->maxlen items, each checked by f->check; with F_UNIQUE none
 * twice; with F_JOINED stored as one comma-joined string at off, else as a
 * list at off with its count at off2. */
static void parse_strings(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                          const char *path)
{
    int n = 0;
    char **v = string_items(c, val, path, f->maxlen, f->what, f->check, &n);
    if (v == NULL)
        return;
    for (int i = 1; (f->flags & F_UNIQUE) && i < n; i++)
        for (int j = 0; j < i; j++)
            if (strcmp(v[i], v[j]) == 0) {
                char ip[PATH_MAX_LEN];
                const yaml_node_t *it =
                    val->type == YAML_SEQUENCE_NODE
                        ? yaml_document_get_node(c->doc, val->data.sequence.items.start[i])
                        : val;
                spec_index_path(ip, path, i);
                spec_diag(c, it, ip, "\"%.80s\" is listed twice (also %s[%d])", v[i], path, j);
                j = i;
            }
    if (!(f->flags & F_JOINED)) {
        set_string_list(f, base, v, n);
        return;
    }
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

/* model.embedding.memory: "25%" (a share of the table's rows on each rank)
 * or bytes per rank, e.g. 2GiB, 512MiB, 1000000 (units KiB..TiB, KB..TB). */
static void parse_memory(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                         const char *path)
{
    (void)f;
    job_embedding_t *e = (job_embedding_t *)base;
    const char *s = spec_scalar(val);
    char gb[64], *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) {
        spec_diag(c, val, path, "expected a share like 25%% or a size like 2GiB, got %s",
                  spec_got(val, gb, sizeof gb));
        return;
    }
    if (strcmp(end, "%") == 0) {
        if (v > 100) {
            spec_diag(c, val, path, "a share must be at most 100%%, got %s", s);
            return;
        }
        e->memory_share = v / 100.0;
        e->memory_bytes = 0;
        return;
    }
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},          {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
                 {"GB", 1e9},      {"TB", 1e12}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) == 0 && v * units[i].mult < 9e18) {
            e->memory_bytes = (int64_t)(v * units[i].mult);
            e->memory_share = 0;
            return;
        }
    }
    spec_diag(c, val, path, "expected a share like 25%% or a size like 2GiB (units B, KiB, MiB, "
              "GiB, TiB, KB, MB, GB, TB), got %s", spec_got(val, gb, sizeof gb));
}

/* A positive number of steps at s, "5000" or "5000 steps": its value, or 0. */
static long long steps_at(const char *s)
{
    char *end = NULL;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    return end != s && !errno && n > 0 && (*end == '\0' || strcmp(end, " steps") == 0) ? n : 0;
}

/* model.embedding.ttl: a number of steps ("5000", or "5000 steps": the same
 * on every rerun) or a duration ("30d", "12h"). */
static void parse_ttl(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                      const char *path)
{
    (void)f;
    job_embedding_t *e = (job_embedding_t *)base;
    const char *s = spec_scalar(val);
    const long long n = steps_at(s);
    if (n > 0) {
        e->ttl_steps = n;
        e->ttl_ms = 0;
        return;
    }
    int64_t ms = 0;
    if (s[0] != '\0' && kiln_duration_parse(s, &ms) == 0 && ms > 0) {
        e->ttl_ms = ms;
        e->ttl_steps = 0;
        return;
    }
    char gb[64];
    spec_diag(c, val, path, "expected a number of steps (5000 or \"5000 steps\") or a duration "
              "like 30d or 12h, got %s", spec_got(val, gb, sizeof gb));
}

/* A whole percentage from 1 to 100 at s, "N%": its value, or 0 (end set
 * past the '%'). */
static int percent_at(const char *s, const char **end)
{
    char *e = NULL;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (e == s || errno != 0 || *e != '%' || v < 1 || v > 100 || !isdigit((unsigned char)*s))
        return 0;
    *end = e + 1;
    return (int)v;
}

/* push.ramp: "STEP%/EVERY" or "STEP%/EVERY to MAX%" (MAX 50 when left out);
 * "none" or "0": no ramp. */
static void parse_ramp(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                       const char *path)
{
    (void)f;
    (void)base;
    job_spec_t *s = c->spec;
    const char *v = spec_scalar(val), *p = v;
    char gb[64], every[64];
    s->push.ramp_step = 0;
    if (val->type == YAML_SCALAR_NODE && (strcmp(v, "none") == 0 || strcmp(v, "0") == 0))
        return;
    int step = val->type == YAML_SCALAR_NODE ? percent_at(p, &p) : 0, max = 50;
    const char *slash = step > 0 && *p == '/' ? p + 1 : NULL;
    const char *to = slash ? strstr(slash, " to ") : NULL;
    size_t n = slash ? (to ? (size_t)(to - slash) : strlen(slash)) : 0;
    int64_t ms = 0;
    bool ok = slash != NULL && n > 0 && n < sizeof every;
    if (ok) {
        memcpy(every, slash, n);
        every[n] = '\0';
        ok = kiln_duration_parse(every, &ms) == 0 && ms >= 1000;
    }
    if (ok && to != NULL) {
        const char *e = to + 4;
        max = percent_at(e, &e);
        ok = max > 0 && *e == '\0';
    }
    if (!ok) {
        spec_diag(c, val, path, "expected STEP%%/EVERY or STEP%%/EVERY to MAX%% (10%%/1h: the "
                  "label's traffic share grows by 10 points an hour, up to 50%% unless a MAX "
                  "says otherwise; EVERY at least 1s), got %s", spec_got(val, gb, sizeof gb));
        return;
    }
    if (step > max) {
        spec_diag(c, val, path, "the step %d%% is larger than the most the ramp gives, %d%%; "
                  "write a smaller step or a larger MAX (10%%/1h to 80%%)", step, max);
        return;
    }
    s->push.ramp_step = step;
    s->push.ramp_max = max;
    s->push.ramp_every_ms = ms;
}

/* A Parquet column name: what a writer may call a top-level field, less
 * what would not survive a message (control characters) or Kiln's footer
 * reader (names over 127 bytes). */
static const char *check_column(const char *s, char *buf, size_t bufsz)
{
    size_t n = strlen(s);
    bool ok = n > 0 && n <= 127;
    for (const char *p = s; ok && *p; p++)
        ok = (unsigned char)*p >= 32 && *p != 127;
    if (ok)
        return NULL;
    return refuse(s, "a Parquet column name Kiln reads (1 to 127 bytes, no control "
                     "characters)", buf, bufsz);
}

static void parse_endpoints(ctx_t *c, const field_t *f, const yaml_node_t *val, char *base,
                            const char *path)
{
    char ip[PATH_MAX_LEN];
    if (!spec_expect(c, val, YAML_SEQUENCE_NODE, path, "a list of {url, model, label}"))
        return;
    yaml_node_item_t *items = val->data.sequence.items.start;
    int n = (int)(val->data.sequence.items.top - items);
    if (n > 64) {
        spec_diag(c, val, path, "at most 64 endpoints are allowed, got %d", n);
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
        spec_index_path(ip, path, i);
        spec_apply_defaults(c, endpoint_fields, (char *)&eps[i]); /* auto: true */
        spec_walk_map(c, endpoint_fields, item, (char *)&eps[i], ip);
        for (int j = 0; j < i; j++) {
            if (eps[i].url && eps[j].url && eps[i].model && eps[j].model && eps[i].label &&
                eps[j].label && strcmp(eps[i].url, eps[j].url) == 0 &&
                strcmp(eps[i].model, eps[j].model) == 0 &&
                strcmp(eps[i].label, eps[j].label) == 0) {
                spec_diag(c, item, ip,
                          "same url, model and label as %s[%d]; list each endpoint once", path, j);
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
            spec_diag(c, val, path, "a table must read at least one slot");
            return;
        }
    } else if (val->type == YAML_MAPPING_NODE) {
        spec_diag(c, val, path, "expected a slot index or a list of them, got a mapping");
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
        if (!spec_visit(c, node))
            break;
        if (items)
            spec_index_path(ip, path, i);
        else
            snprintf(ip, sizeof ip, "%s", path);
        int64_t s;
        if (spec_get_int(c, node, ip, 0, INT64_MAX, &s) < 0)
            continue;
        if (s >= cat) {
            spec_diag(c, node, ip, "slot %" PRId64 " is out of range 0..%d (data.cat_slots is %d)",
                      s, cat - 1, cat);
            continue;
        }
        if (c->slot_owner[s] >= 0) {
            if (c->slot_owner[s] == self)
                spec_diag(c, node, ip, "slot %" PRId64 " is listed twice in this table", s);
            else
                spec_diag(c, node, ip,
                          "slot %" PRId64 " is already read by model.tables[%d]; each "
                          "slot belongs to exactly one table",
                          s, c->slot_owner[s]);
            continue;
        }
        c->slot_owner[s] = self;
        t->slots[t->nslots++] = (int)s;
    }
}
