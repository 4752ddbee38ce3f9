/*
 * tests/test_spec.c - jobs/spec.c: the reference spec (tests/specs/good/
 * ctr-hourly.yaml) field by field, the defaults of a minimal spec, a spec
 * that sets every field, shared and overridden embedding tables, a table of
 * bad specs each with the exact diagnostic it must produce, collection of
 * several problems in document order, and every file in examples/ and
 * tests/specs/good/ parsing cleanly; hostile specs (too big, too deep, too
 * many keys, alias bombs) answered with their error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jobs.h"
#include "kiln.h"
#include "proc.h"

/* Parses text as "job.yaml"; returns the code and leaves spec/diags filled. */
static int parse(const char *text, job_spec_t *spec, job_diags_t *d)
{
    job_diags_init(d);
    return job_spec_parse(text, strlen(text), "job.yaml", spec, d);
}

static void print_diags(const job_diags_t *d)
{
    for (size_t i = 0; i < d->n; i++)
        print_message("  diag: %s\n", d->items[i].message);
}

/* Parses text, which must be valid, into spec. */
static void parse_ok(const char *text, job_spec_t *spec)
{
    job_diags_t d;
    int rc = parse(text, spec, &d);
    if (rc != 0)
        print_diags(&d);
    assert_int_equal(rc, 0);
    assert_int_equal(d.n, 0);
    job_diags_fini(&d);
}

static void load_ok(const char *path, job_spec_t *spec)
{
    job_diags_t d;
    job_diags_init(&d);
    int rc = job_spec_load(path, spec, &d);
    if (rc != 0) {
        print_message("%s: %s\n", path, kiln_errmsg());
        print_diags(&d);
    }
    assert_int_equal(rc, 0);
    job_diags_fini(&d);
}

static const job_table_t *table_named(const job_spec_t *s, const char *name)
{
    for (int i = 0; i < s->model.ntables; i++)
        if (strcmp(s->model.tables[i].name, name) == 0)
            return &s->model.tables[i];
    return NULL;
}

/* The settings of a parsed spec that check_spec compares (all but tables,
 * endpoints, MLP sizes and optimizer details): a table of fields of
 * job_spec_t, each a string, a double or an integer of its own size. */
typedef enum { F_STR, F_NUM, F_DBL } field_kind_t;

#define SF(field, kind)                                                                           \
    {#field, offsetof(job_spec_t, field), sizeof(((job_spec_t *)0)->field), kind}
static const struct {
    const char *name;
    size_t off, size;
    field_kind_t kind;
} spec_fields[] = {
    SF(name, F_STR), SF(description, F_STR), SF(schedule, F_STR), SF(timezone, F_STR),
    SF(concurrency, F_NUM), SF(catchup, F_NUM), SF(priority, F_NUM),
    SF(resources.ranks, F_NUM), SF(resources.launcher, F_NUM), SF(resources.device, F_NUM),
    SF(resources.timeout_ms, F_NUM), SF(resources.threads, F_NUM),
    SF(retries.count, F_NUM), SF(retries.backoff_ms, F_NUM), SF(retries.max_backoff_ms, F_NUM),
    SF(data.format, F_NUM), SF(data.train, F_STR), SF(data.eval, F_STR),
    SF(data.incremental, F_NUM), SF(data.dense_features, F_NUM), SF(data.cat_slots, F_NUM),
    SF(data.max_malformed, F_DBL),
    SF(model.type, F_NUM), SF(model.embedding.dim, F_NUM), SF(model.embedding.combiner, F_NUM),
    SF(model.embedding.capacity, F_NUM), SF(model.embedding.eviction, F_NUM),
    SF(model.embedding.init, F_NUM), SF(model.embedding.init_scale, F_DBL),
    SF(model.nbottom, F_NUM), SF(model.ntop, F_NUM), SF(model.ntables, F_NUM),
    SF(train.mode, F_NUM), SF(train.batch_size, F_NUM), SF(train.epochs, F_NUM),
    SF(train.sparse.type, F_NUM), SF(train.sparse.lr, F_DBL), SF(train.sparse.eps, F_DBL),
    SF(train.dense.type, F_NUM), SF(train.dense.lr, F_DBL), SF(train.seed, F_NUM),
    SF(train.init_from, F_NUM), SF(train.max_steps, F_NUM), SF(train.log_every, F_NUM),
    SF(checkpoint.dir, F_STR), SF(checkpoint.full_every, F_NUM), SF(checkpoint.keep, F_NUM),
    SF(checkpoint.include_optimizer, F_NUM), SF(checkpoint.every_steps, F_NUM),
    SF(export_.on_success, F_NUM), SF(export_.every_ms, F_NUM),
    SF(push.token_env, F_STR), SF(push.retries, F_NUM), SF(push.timeout_ms, F_NUM),
    SF(push.nendpoints, F_NUM),
};
#undef SF

/* The integer of size bytes at p (bool, int or enum, int64_t, uint64_t). */
static int64_t num_at(const char *p, size_t size)
{
    int8_t i8;
    int32_t i32;
    int64_t i64;
    switch (size) {
    case 1:
        memcpy(&i8, p, 1);
        return i8;
    case 4:
        memcpy(&i32, p, 4);
        return i32;
    default:
        assert_int_equal(size, 8);
        memcpy(&i64, p, 8);
        return i64;
    }
}

/* s has every setting of spec_fields that want has (a NULL string wants a
 * NULL field). */
static void check_spec(const job_spec_t *s, const job_spec_t *want)
{
    for (size_t i = 0; i < sizeof spec_fields / sizeof spec_fields[0]; i++) {
        const char *got = (const char *)s + spec_fields[i].off;
        const char *exp = (const char *)want + spec_fields[i].off;
        const char *name = spec_fields[i].name;
        if (spec_fields[i].kind == F_STR) {
            const char *g = *(char *const *)got, *w = *(char *const *)exp;
            if (w == NULL ? g != NULL : g == NULL || strcmp(g, w) != 0)
                fail_msg("%s: \"%s\", want \"%s\"", name, g ? g : "(null)", w ? w : "(null)");
        } else if (spec_fields[i].kind == F_DBL) {
            double g, w;
            memcpy(&g, got, sizeof g);
            memcpy(&w, exp, sizeof w);
            if (!(g == w))
                fail_msg("%s: %.17g, want %.17g", name, g, w);
        } else {
            int64_t g = num_at(got, spec_fields[i].size), w = num_at(exp, spec_fields[i].size);
            if (g != w)
                fail_msg("%s: %lld, want %lld", name, (long long)g, (long long)w);
        }
    }
}

static void test_ctr_hourly(void **state)
{
    (void)state;
    static const job_spec_t want = {
        .name = "ctr-hourly",
        .schedule = "15 * * * *",
        .timezone = "UTC",
        .concurrency = JOB_CONC_FORBID,
        .catchup = JOB_CATCHUP_LATEST,
        .resources = {.ranks = 2, .launcher = JOB_LAUNCH_LOCAL, .device = JOB_DEVICE_AUTO,
                      .timeout_ms = 2 * 3600 * 1000},
        .retries = {.count = 3, .backoff_ms = 30000, .max_backoff_ms = 3600 * 1000},
        .data = {.format = JOB_FMT_CRITEO_TSV, .train = "data/day=*/part-*.tsv",
                 .eval = "data/eval.tsv", .incremental = true, .dense_features = 13,
                 .cat_slots = 26, .max_malformed = 0.01},
        .model = {.type = MODEL_DLRM,
                  .embedding = {16, KERN_COMBINE_SUM, 4000000, KERN_EVICT_LRU, KERN_INIT_UNIFORM, 0.01},
                  .nbottom = 2, .ntop = 3, .ntables = 26},
        .train = {.mode = JOB_MODE_BATCH, .batch_size = 4096, .epochs = 1,
                  .sparse = {.type = KERN_OPT_ADAGRAD, .lr = 0.05, .eps = 1e-10},
                  .dense = {.type = KERN_OPT_ADAGRAD, .lr = 0.05}, .seed = 42,
                  .init_from = JOB_INITFROM_LATEST, .log_every = 100},
        .checkpoint = {.dir = "ckpt/ctr-hourly", .full_every = 24, .keep = 5,
                       .include_optimizer = true},
        .export_ = {.on_success = JOB_EXPORT_INCREMENTAL},
        .push = {.token_env = "KILN_SERVE_TOKEN", .retries = 5, .timeout_ms = 30000,
                 .nendpoints = 1}};
    job_spec_t s;
    load_ok(KILN_SOURCE_DIR "/tests/specs/good/ctr-hourly.yaml", &s);
    check_spec(&s, &want);
    assert_null(s.resources.hostfile);
    assert_int_equal(s.model.bottom_mlp[0], 64);
    assert_int_equal(s.model.bottom_mlp[1], 16);
    assert_int_equal(s.model.top_mlp[0], 256);
    assert_int_equal(s.model.top_mlp[1], 128);
    assert_int_equal(s.model.top_mlp[2], 1);
    for (int i = 0; i < 26; i++) {
        char name[16];
        snprintf(name, sizeof name, "slot%d", i);
        assert_string_equal(s.model.tables[i].name, name);
        assert_int_equal(s.model.tables[i].nslots, 1);
        assert_int_equal(s.model.tables[i].slots[0], i);
        assert_int_equal(s.model.tables[i].emb.dim, 16);
        assert_int_equal(s.model.tables[i].emb.capacity, 4000000);
    }
    assert_true(s.train.sparse.initial_accumulator == 0.0);
    assert_null(s.train.init_from_checkpoint);
    assert_string_equal(s.push.endpoints[0].url, "http://127.0.0.1:8501");
    assert_string_equal(s.push.endpoints[0].model, "ctr");
    assert_string_equal(s.push.endpoints[0].label, "B");
    assert_true(s.push.endpoints[0].auto_push);
    assert_true(isnan(s.push.max_regression)); /* no quality gate unless asked */
    assert_int_equal(s.push.ramp_step, 0);          /* no ramp either */
    assert_true(isnan(s.push.promote_when.online_logloss_better_by)); /* promote unconditioned */
    job_spec_fini(&s);
    assert_null(s.name);
}

static void test_minimal_defaults(void **state)
{
    (void)state;
    /* A one-off lr job: no schedule, and lr has no MLPs. */
    static const job_spec_t want = {
        .name = "tiny",
        .timezone = "UTC",
        .concurrency = JOB_CONC_FORBID,
        .catchup = JOB_CATCHUP_LATEST,
        .resources = {.ranks = 1, .launcher = JOB_LAUNCH_LOCAL, .device = JOB_DEVICE_AUTO},
        .retries = {.backoff_ms = 30000, .max_backoff_ms = 3600000},
        .data = {.format = JOB_FMT_CRITEO_TSV, .train = "data/*.tsv", .dense_features = 13,
                 .cat_slots = 26, .max_malformed = 0.01},
        .model = {.type = MODEL_LR,
                  .embedding = {16, KERN_COMBINE_SUM, 1000000, KERN_EVICT_LRU, KERN_INIT_UNIFORM, 0.01},
                  .ntables = 26},
        .train = {.mode = JOB_MODE_BATCH, .batch_size = 4096, .epochs = 1,
                  .sparse = {.type = KERN_OPT_ADAGRAD, .lr = 0.05, .eps = 1e-10},
                  .dense = {.type = KERN_OPT_ADAGRAD, .lr = 0.05}, .seed = 42,
                  .init_from = JOB_INITFROM_LATEST, .log_every = 100},
        .checkpoint = {.dir = "ckpt/tiny", .full_every = 24, .keep = 5,
                       .include_optimizer = true},
        .export_ = {.on_success = JOB_EXPORT_NONE},
        .push = {.token_env = "KILN_SERVE_TOKEN", .retries = 5, .timeout_ms = 30000}};
    job_spec_t s;
    parse_ok("name: tiny\ndata: {train: \"data/*.tsv\"}\n", &s);
    check_spec(&s, &want);
    assert_true(s.train.sparse.beta1 == 0.9);
    assert_true(s.train.sparse.beta2 == 0.999);
    assert_true(s.train.sparse.initial_accumulator == 0.0);
    assert_true(s.train.sparse.weight_decay == 0.0);
    assert_null(s.push.endpoints);
    job_spec_fini(&s);

    /* dlrm's MLP defaults follow the embedding dim; adam's eps is 1e-8;
     * null values keep defaults. */
    parse_ok(
        "name: d\ndata: {train: t}\ndescription: ~\nmodel: {type: dlrm, embedding: {dim: 32}}\n"
        "train: {optimizer: {sparse: {type: adam}, dense: null}}\n",
        &s);
    assert_null(s.description);
    assert_int_equal(s.model.nbottom, 2);
    assert_int_equal(s.model.bottom_mlp[0], 64);
    assert_int_equal(s.model.bottom_mlp[1], 32);
    assert_int_equal(s.model.ntop, 3);
    assert_int_equal(s.model.top_mlp[2], 1);
    assert_int_equal(s.train.sparse.type, KERN_OPT_ADAM);
    assert_true(s.train.sparse.eps == 1e-8);
    assert_int_equal(s.train.dense.type, KERN_OPT_ADAGRAD);
    assert_true(s.train.dense.eps == 1e-10);
    job_spec_fini(&s);
}

static void test_every_field(void **state)
{
    (void)state;
    static const job_spec_t want = {
        .name = "every_field.v2",
        .description = "sets every field at least once",
        .schedule = "@every 30s",
        .timezone = "UTC+02:00",
        .concurrency = JOB_CONC_REPLACE,
        .catchup = JOB_CATCHUP_ALL,
        .priority = -7,
        .resources = {.ranks = 8, .launcher = JOB_LAUNCH_HOSTFILE, .device = JOB_DEVICE_CPU,
                      .timeout_ms = 5400000, .threads = 4},
        .retries = {.count = 2, .backoff_ms = 10000, .max_backoff_ms = 300000},
        .data = {.format = JOB_FMT_KILN_BIN, .train = "bin/part-*.kb", .eval = "bin/eval.kb",
                 .incremental = true, .dense_features = 4, .cat_slots = 6,
                 .max_malformed = 0.25},
        .model = {.type = MODEL_FM,
                  .embedding = {8, KERN_COMBINE_MEAN, 5000, KERN_EVICT_LFU, KERN_INIT_NORMAL, 0.5},
                  .ntables = 5},
        .train = {.mode = JOB_MODE_ONLINE, .batch_size = 512, .epochs = 3,
                  .sparse = {.type = KERN_OPT_ADAM, .lr = 0.001, .eps = 1e-6},
                  .dense = {.type = KERN_OPT_SGD, .lr = 0.1}, .seed = 7,
                  .init_from = JOB_INITFROM_CHECKPOINT, .max_steps = 100000, .log_every = 50},
        .checkpoint = {.dir = "/var/lib/kiln/ckpt/every", .full_every = 6, .keep = 2,
                       .every_steps = 1000},
        .export_ = {.on_success = JOB_EXPORT_FULL, .every_ms = 30000},
        .push = {.token_env = "MY_TOKEN", .timeout_ms = 500, .nendpoints = 2}};
    job_spec_t s;
    load_ok(KILN_SOURCE_DIR "/tests/specs/good/everything.yaml", &s);
    check_spec(&s, &want);
    assert_string_equal(s.resources.hostfile, "hosts.txt");
    /* users (0, 2), items (4), then defaults for 1, 3, 5 */
    const job_table_t *u = &s.model.tables[0];
    assert_string_equal(u->name, "users");
    assert_int_equal(u->nslots, 2);
    assert_int_equal(u->slots[0], 0);
    assert_int_equal(u->slots[1], 2);
    assert_int_equal(u->emb.dim, 8);
    assert_int_equal(u->emb.capacity, 100000);
    assert_int_equal(u->emb.eviction, KERN_EVICT_NONE);
    assert_int_equal(u->emb.combiner, KERN_COMBINE_SUM);
    assert_int_equal(u->emb.init, KERN_INIT_ZEROS);
    assert_true(u->emb.init_scale == 0.0);
    const job_table_t *it = &s.model.tables[1];
    assert_string_equal(it->name, "items");
    assert_int_equal(it->nslots, 1);
    assert_int_equal(it->slots[0], 4);
    assert_int_equal(it->emb.capacity, 5000);
    assert_int_equal(it->emb.combiner, KERN_COMBINE_MEAN);
    assert_string_equal(s.model.tables[2].name, "slot1");
    assert_string_equal(s.model.tables[3].name, "slot3");
    assert_string_equal(s.model.tables[4].name, "slot5");
    assert_int_equal(s.model.tables[4].slots[0], 5);
    assert_int_equal(s.model.tables[4].emb.eviction, KERN_EVICT_LFU);
    assert_true(s.train.sparse.beta1 == 0.8);
    assert_true(s.train.sparse.beta2 == 0.99);
    assert_true(s.train.sparse.weight_decay == 0.0001);
    assert_true(s.train.dense.initial_accumulator == 0.1);
    assert_string_equal(s.train.init_from_checkpoint, "ckpt-000123");
    assert_true(s.push.max_regression == 0.002);
    assert_int_equal(s.push.ramp_step, 5);
    assert_int_equal(s.push.ramp_max, 25);
    assert_int_equal(s.push.ramp_every_ms, 30 * 60 * 1000);
    assert_string_equal(s.push.endpoints[0].url, "https://serve-a.example.com:8501");
    assert_string_equal(s.push.endpoints[0].label, "A");
    assert_false(s.push.endpoints[0].auto_push);
    assert_string_equal(s.push.endpoints[1].model, "ctr2");
    assert_string_equal(s.push.endpoints[1].label, "canary-1");
    assert_true(s.push.endpoints[1].auto_push); /* the default */
    job_spec_fini(&s);

    /* the remaining enum spellings and init_from: none */
    parse_ok("name: e\ndata: {train: t}\nconcurrency: allow\ncatchup: none\n"
             "resources: {launcher: slurm, device: cuda, timeout: none}\n"
             "train: {init_from: none, optimizer: {sparse: {type: sgd}}}\n"
             "export: {on_success: none}\n",
             &s);
    assert_int_equal(s.concurrency, JOB_CONC_ALLOW);
    assert_int_equal(s.catchup, JOB_CATCHUP_NONE);
    assert_int_equal(s.resources.launcher, JOB_LAUNCH_SLURM);
    assert_int_equal(s.resources.device, JOB_DEVICE_CUDA);
    assert_int_equal(s.resources.timeout_ms, 0);
    assert_int_equal(s.train.init_from, JOB_INITFROM_NONE);
    assert_null(s.train.init_from_checkpoint);
    assert_int_equal(s.train.sparse.type, KERN_OPT_SGD);
    assert_int_equal(s.resources.nodes, 0);
    assert_null(s.resources.partition);
    assert_null(s.resources.sbatch_args);
    assert_int_equal(s.resources.mpi.transport, JOB_MPI_AUTO);
    job_spec_fini(&s);

    /* every Slurm field and the MPI network settings */
    parse_ok("name: e\ndata: {train: t}\n"
             "resources:\n"
             "  ranks: 4\n  launcher: slurm\n  nodes: 2\n  partition: gpu,cpu\n"
             "  account: ml-team\n  gpus_per_node: 2\n  timeout: 90s\n"
             "  sbatch_args: [\"--qos=high\", \"--constraint=a100\", \"-x\"]\n"
             "  mpi: {interfaces: [eth0, 10.1.0.0/16], transport: tcp}\n",
             &s);
    assert_int_equal(s.resources.nodes, 2);
    assert_string_equal(s.resources.partition, "gpu,cpu");
    assert_string_equal(s.resources.account, "ml-team");
    assert_int_equal(s.resources.gpus_per_node, 2);
    assert_int_equal(s.resources.nsbatch_args, 3);
    assert_string_equal(s.resources.sbatch_args[1], "--constraint=a100");
    assert_null(s.resources.sbatch_args[3]);
    assert_string_equal(s.resources.mpi.interfaces, "eth0,10.1.0.0/16");
    assert_int_equal(s.resources.mpi.transport, JOB_MPI_TCP);
    assert_string_equal(job_mpi_transport_name(s.resources.mpi.transport), "tcp");
    job_spec_fini(&s);
    parse_ok("name: e\ndata: {train: t}\n"
             "resources: {launcher: hostfile, hostfile: h, mpi: {interfaces: ib0}}\n",
             &s);
    assert_string_equal(s.resources.mpi.interfaces, "ib0");
    job_spec_fini(&s);
}

static void test_tables(void **state)
{
    (void)state;
    job_spec_t s;
    /* sharing: slots 0 and 1 read one table; override: slot 3 wider */
    parse_ok("name: t\ndata: {train: d, cat_slots: 5}\n"
             "model:\n"
             "  embedding: {dim: 8, capacity: 1000}\n"
             "  tables:\n"
             "    - {name: user, slots: [1, 0]}\n"
             "    - {name: item, slots: 3, capacity: 99, dim: 4, init: normal}\n",
             &s);
    assert_int_equal(s.model.ntables, 4);
    const job_table_t *u = table_named(&s, "user");
    assert_non_null(u);
    assert_int_equal(u->nslots, 2);
    assert_int_equal(u->slots[0], 1);
    assert_int_equal(u->slots[1], 0);
    assert_int_equal(u->emb.dim, 8);
    assert_int_equal(u->emb.capacity, 1000);
    const job_table_t *it = table_named(&s, "item");
    assert_non_null(it);
    assert_int_equal(it->nslots, 1);
    assert_int_equal(it->slots[0], 3);
    assert_int_equal(it->emb.capacity, 99);
    assert_int_equal(it->emb.dim, 4); /* lr: per-table dims are allowed */
    assert_int_equal(it->emb.init, KERN_INIT_NORMAL);
    /* every slot is covered exactly once */
    int covered[5] = {0};
    for (int i = 0; i < s.model.ntables; i++)
        for (int j = 0; j < s.model.tables[i].nslots; j++)
            covered[s.model.tables[i].slots[j]]++;
    for (int i = 0; i < 5; i++)
        assert_int_equal(covered[i], 1);
    assert_non_null(table_named(&s, "slot2"));
    assert_non_null(table_named(&s, "slot4"));
    assert_null(table_named(&s, "slot0"));
    assert_int_equal(table_named(&s, "slot4")->emb.capacity, 1000);
    job_spec_fini(&s);

    /* model.embedding given after tables still seeds them */
    parse_ok("name: t\ndata: {train: d, cat_slots: 2}\n"
             "model:\n  tables: [{name: both, slots: [0, 1]}]\n  embedding: {dim: 24}\n",
             &s);
    assert_int_equal(s.model.ntables, 1);
    assert_int_equal(s.model.tables[0].emb.dim, 24);
    job_spec_fini(&s);
}

/* ---- bad specs ------------------------------------------------------------------- */
#define P "name: j\ndata: {train: d}\n" /* a valid prefix: lines 1-2 */

static const struct bad {
    const char *yaml;
    const char *expect; /* one diagnostic must be exactly this */
} bad_specs[] = {
    /* documents */
    {"name: j\ndata: [1, 2\n", "job.yaml:3:1: YAML syntax error: did not find expected ',' or ']' "
                               "(while parsing a flow sequence at 2:7)"},
    {"name: j\n\tdata: x\n",
     "job.yaml:2:1: YAML syntax error: found a tab character that violates indentation "
     "(while scanning a plain scalar at 1:7)"},
    {"", "job.yaml:1:1: the job spec is empty (it needs at least name: and data: {train: ...})"},
    {"# only a comment\n",
     "job.yaml:1:1: the job spec is empty (it needs at least name: and data: {train: ...})"},
    {"- name: j\n",
     "job.yaml:1:1: the top level must be a mapping of fields (name: ..., data: ...), got a list"},
    {P "---\nname: k\n", "job.yaml:4:1: a job spec is one YAML document; a second one starts here"},
    /* required fields */
    {"data: {train: d}\n", "job.yaml:1:1: name: required field is missing"},
    {"name: j\n", "job.yaml:1:1: data.train: required field is missing"},
    {"name: j\ndata:\n", "job.yaml:1:1: data.train: required field is missing"},
    {"name: j\ndata: {eval: e}\n", "job.yaml:2:7: data.train: required field is missing"},
    {"name: j\ndata: {train: \"\"}\n", "job.yaml:2:15: data.train: must not be empty"},
    /* keys */
    {P "concurency: forbid\n",
     "job.yaml:3:1: concurency: unknown field (did you mean \"concurrency\"?)"},
    {P "model:\n  embeding: {dim: 8}\n",
     "job.yaml:4:3: model.embeding: unknown field (did you mean \"embedding\"?)"},
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\", model: m, labl: A}\n",
     "job.yaml:5:37: push.endpoints[0].labl: unknown field (did you mean \"label\"?)"},
    {P "colour: red\n",
     "job.yaml:3:1: colour: unknown field (expected one of: name, description, schedule, "
     "timezone, concurrency, catchup, priority, resources, retries, data, model, train, "
     "checkpoint, export, push)"},
    {P "name: k\n", "job.yaml:3:1: name: duplicate field (first given at line 1)"},
    {P "[a]: 1\n", "job.yaml:3:1: field names must be plain strings, got a list"},
    /* types */
    {P "model:\n  embedding:\n    dim: sixteen\n",
     "job.yaml:5:10: model.embedding.dim: expected a positive integer, got \"sixteen\""},
    {P "resources: [1, 2]\n", "job.yaml:3:12: resources: expected a mapping of fields, got a list"},
    {"name: {a: 1}\ndata: {train: d}\n", "job.yaml:1:7: name: expected a string, got a mapping"},
    {P "priority: high\n", "job.yaml:3:11: priority: expected an integer, got \"high\""},
    {"name: j\ndata: {train: d, incremental: yes}\n",
     "job.yaml:2:31: data.incremental: expected true or false, got \"yes\""},
    {P "resources: {timeout: forever}\n",
     "job.yaml:3:22: resources.timeout: expected a duration like 30s, 5m, 2h or 1h30m (or none), "
     "got \"forever\""},
    {P "train: {seed: -1}\n", "job.yaml:3:15: train.seed: must be >= 0, got -1"},
    {P "train: {seed: 9223372036854775808}\n",
     "job.yaml:3:15: train.seed: 9223372036854775808 is out of range 0..9223372036854775807"},
    {P "train: {seed: -9223372036854775809}\n",
     "job.yaml:3:15: train.seed: must be >= 0, got -9223372036854775809"},
    {"name: j\ndata: {train: d, max_malformed: 1.5}\n",
     "job.yaml:2:33: data.max_malformed: must be in [0, 1], got 1.5"},
    {P "model: {type: dlrm, bottom_mlp: [64, x]}\n",
     "job.yaml:3:38: model.bottom_mlp[1]: expected a positive integer, got \"x\""},
    {P "model: {type: dlrm, top_mlp: 1}\n",
     "job.yaml:3:30: model.top_mlp: expected a list of layer widths like [64, 16], got \"1\""},
    {P "train: {optimizer: {sparse: {lr: fast}}}\n",
     "job.yaml:3:34: train.optimizer.sparse.lr: expected a number, got \"fast\""},
    /* names and strings */
    {"name: \"ctr hourly\"\ndata: {train: d}\n",
     "job.yaml:1:7: name: \"ctr hourly\" is not a valid name (1 to 64 letters, digits, '_', '.' "
     "or '-', and not . or ..)"},
    {"name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\ndata: {train: d}\n",
     "job.yaml:1:7: name: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\" is "
     "not "
     "a valid name (1 to 64 letters, digits, '_', '.' or '-', and not . or ..)"},
    /* a job's name is a directory (ckpt/<name>): not the directory itself or its parent */
    {"name: .\ndata: {train: d}\n",
     "job.yaml:1:7: name: \".\" is not a valid name (1 to 64 letters, digits, '_', '.' or '-', "
     "and not . or ..)"},
    {"name: \"..\"\ndata: {train: d}\n",
     "job.yaml:1:7: name: \"..\" is not a valid name (1 to 64 letters, digits, '_', '.' or '-', "
     "and not . or ..)"},
    {P "push: {token_env: KILN-TOKEN}\n",
     "job.yaml:3:19: push.token_env: \"KILN-TOKEN\" is not an environment variable name (letters, "
     "digits and '_', not starting with a digit)"},
    {P "train: {init_from: \"\"}\n",
     "job.yaml:3:20: train.init_from: expected latest, none or a checkpoint id, got an empty "
     "string"},
    /* enums */
    {P "concurrency: forbd\n",
     "job.yaml:3:14: concurrency: \"forbd\" is not one of forbid | allow | replace (did you mean "
     "\"forbid\"?)"},
    {P "catchup: sometimes\n",
     "job.yaml:3:10: catchup: \"sometimes\" is not one of none | latest | all"},
    {P "model: {type: [lr]}\n", "job.yaml:3:15: model.type: a list is not one of lr | fm | dlrm"},
    {P "model: {embedding: {combiner: avg}}\n",
     "job.yaml:3:31: model.embedding.combiner: \"avg\" is not one of sum | mean"},
    /* ranges */
    {P "resources: {ranks: 0}\n", "job.yaml:3:20: resources.ranks: 0 is out of range 1..4096"},
    {P "resources: {ranks: 5000}\n",
     "job.yaml:3:20: resources.ranks: 5000 is out of range 1..4096"},
    {P "priority: 2000\n", "job.yaml:3:11: priority: 2000 is out of range -1000..1000"},
    {P "model: {embedding: {dim: 2048}}\n",
     "job.yaml:3:26: model.embedding.dim: 2048 is out of range 1..1024"},
    {P "model: {embedding: {capacity: 0}}\n",
     "job.yaml:3:31: model.embedding.capacity: 0 is out of range 1..1099511627776"},
    {P "train: {batch_size: 0}\n", "job.yaml:3:21: train.batch_size: 0 is out of range 1..1048576"},
    /* a rank's share of a table must fit kiln-train's tables (JOB_MAX_ROWS_PER_RANK) */
    {P "resources: {ranks: 2}\nmodel: {embedding: {capacity: 1099511627776}}\n",
     "job.yaml:4:31: model.embedding.capacity: 1099511627776 rows over 2 ranks is 588788477762 "
     "rows per rank (with device auto or cuda, counting the GPU's host mirror), more than the "
     "2147483632 a rank's table can hold (row ids are 32-bit): lower it or raise "
     "resources.ranks to at least 549"},
    {P "resources: {device: cpu}\nmodel: {embedding: {capacity: 2147483633}}\n",
     "job.yaml:4:31: model.embedding.capacity: 2147483633 rows over 1 rank is 2147483633 rows "
     "per rank, more than the 2147483632 a rank's table can hold (row ids are 32-bit): lower it "
     "or raise resources.ranks to at least 2"},
    {P "resources: {device: cpu, ranks: 2}\nmodel:\n  tables: [{name: a, slots: 0, "
       "capacity: 8589934592}]\n",
     "job.yaml:5:42: model.tables[0].capacity: 8589934592 rows over 2 ranks is 4509715724 "
     "rows per rank, more than the 2147483632 a rank's table can hold (row ids are 32-bit): "
     "lower it or raise resources.ranks to at least 5"},
    {P "resources: {ranks: 4}\nmodel:\n  tables: [{name: a, slots: 0, capacity: 3}]\n",
     "job.yaml:5:42: model.tables[0].capacity: 3 rows over 4 ranks leaves a rank without a row: "
     "raise it to at least 4 or lower resources.ranks"},
    {P "train: {optimizer: {dense: {lr: -0.1}}}\n",
     "job.yaml:3:33: train.optimizer.dense.lr: must be >= 0, got -0.1"},
    {P "train: {optimizer: {sparse: {type: adam, beta1: 1.0}}}\n",
     "job.yaml:3:49: train.optimizer.sparse.beta1: must be in [0, 1), got 1.0"},
    {P "train: {optimizer: {sparse: {eps: 0}}}\n",
     "job.yaml:3:35: train.optimizer.sparse.eps: must be > 0, got 0"},
    {P "checkpoint: {keep: 0}\n", "job.yaml:3:20: checkpoint.keep: 0 is out of range 1..100000"},
    {P "checkpoint: {full_every: 0}\n",
     "job.yaml:3:26: checkpoint.full_every: 0 is out of range 1..100000"},
    {P "push: {timeout: 0s}\n", "job.yaml:3:17: push.timeout: must be at least 1ms, got 0ms"},
    {P "push: {ramp: 10%}\n",
     "job.yaml:3:14: push.ramp: expected STEP%/EVERY or STEP%/EVERY to MAX% (10%/1h: the label's "
     "traffic share grows by 10 points an hour, up to 50% unless a MAX says otherwise; EVERY at "
     "least 1s), got \"10%\""},
    {P "push: {ramp: 60%/1h}\n",
     "job.yaml:3:14: push.ramp: the step 60% is larger than the most the ramp gives, 50%; write a "
     "smaller step or a larger MAX (10%/1h to 80%)"},
    {P "push:\n  ramp: 10%/1h\n  endpoints:\n    - {url: \"http://h:1\", model: m, label: A, "
       "auto: false}\n",
     "job.yaml:4:9: push.ramp: ramps the traffic of the labels kilnd pushes to, and no endpoint "
     "of push.endpoints has auto: true; add one (the challenger) or drop the ramp"},
    {P "push: {promote_when: {min_rows: 500}}\n",
     "job.yaml:3:22: push.promote_when.online_logloss_better_by: required field is missing"},
    {P "push: {promote_when: {online_logloss_better_by: -0.1}}\n",
     "job.yaml:3:49: push.promote_when.online_logloss_better_by: must be >= 0, got -0.1"},
    {P "push: {promote_when: {online_logloss_better_by: 0.01, min_rows: 0}}\n",
     "job.yaml:3:65: push.promote_when.min_rows: must be >= 1, got 0"},
    {P "retries: {backoff: 2m, max_backoff: 1m}\n",
     "job.yaml:3:37: retries.max_backoff: 1m is shorter than retries.backoff (2m)"},
    /* schedule and timezone (messages from jobs/cron.c) */
    {P "schedule: \"\"\n", "job.yaml:3:11: schedule: must not be empty"},
    /* resources */
    {P "resources: {launcher: hostfile}\n",
     "job.yaml:3:23: resources.hostfile: required with launcher: hostfile (a file listing the "
     "hosts to run on)"},
    {P "resources: {hostfile: hosts}\n",
     "job.yaml:3:23: resources.hostfile: only used with launcher: hostfile (launcher is local)"},
    {P "resources: {partition: gpu}\n",
     "job.yaml:3:24: resources.partition: only used with launcher: slurm (launcher is local)"},
    {P "resources: {launcher: hostfile, hostfile: h, sbatch_args: [\"--qos=x\"]}\n",
     "job.yaml:3:59: resources.sbatch_args: only used with launcher: slurm (launcher is hostfile)"},
    {P "resources: {launcher: slurm, ranks: 2, nodes: 3}\n",
     "job.yaml:3:47: resources.nodes: 3 nodes for 2 ranks: every node runs at least one rank "
     "(raise resources.ranks or lower resources.nodes)"},
    {P "resources: {launcher: slurm, device: cpu, gpus_per_node: 1}\n",
     "job.yaml:3:58: resources.gpus_per_node: asks for GPUs but resources.device is cpu (use "
     "auto or cuda)"},
    {P "resources: {launcher: slurm, partition: \"a b\"}\n",
     "job.yaml:3:41: resources.partition: \"a b\" is not a Slurm name (letters, digits, '_', "
     "'.', '-'; partitions may be a comma-separated list)"},
    {P "resources: {launcher: slurm, sbatch_args: [\"--time=5\"]}\n",
     "job.yaml:3:44: resources.sbatch_args[0]: --time is set from resources.timeout; give it "
     "there"},
    {P "resources: {launcher: slurm, sbatch_args: [\"-N2\"]}\n",
     "job.yaml:3:44: resources.sbatch_args[0]: --nodes is set from resources.nodes; give it "
     "there"},
    {P "resources: {launcher: slurm, sbatch_args: [\"--output=x\"]}\n",
     "job.yaml:3:44: resources.sbatch_args[0]: --output is set by Kiln (docs/cluster.md)"},
    {P "resources: {launcher: slurm, sbatch_args: [\"--qos\", high]}\n",
     "job.yaml:3:53: resources.sbatch_args[1]: \"high\" is not an option: give each sbatch "
     "option as one item, --name=value (like --qos=high) or -xVALUE"},
    {P "resources: {mpi: {interfaces: \"eth0,eth1\"}}\n",
     "job.yaml:3:31: resources.mpi.interfaces: \"eth0,eth1\" is neither a network interface "
     "name (like eth0) nor an IPv4 subnet (like 10.1.0.0/16)"},
    {P "resources: {mpi: {transport: shm}}\n",
     "job.yaml:3:30: resources.mpi.transport: \"shm\" is not one of auto | tcp"},
    /* endpoints */
    {P "push:\n  endpoints:\n    - {url: \"ftp://h\", model: m, label: A}\n",
     "job.yaml:5:13: push.endpoints[0].url: \"ftp://h\" must start with http:// or https://"},
    {P "push:\n  endpoints:\n    - {url: \"http://\", model: m, label: A}\n",
     "job.yaml:5:13: push.endpoints[0].url: \"http://\" names no host"},
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\"}\n",
     "job.yaml:5:7: push.endpoints[0].model: required field is missing"},
    {P "push:\n  endpoints:\n    - url: \"http://h:1\"\n      model: m\n",
     "job.yaml:5:7: push.endpoints[0].label: required field is missing"},
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\", model: m, label: \"A B\"}\n",
     "job.yaml:5:44: push.endpoints[0].label: \"A B\" is not a valid label (1 to 32 letters, "
     "digits, '_', '.' or '-', not starting with '.'; kiln-serve refuses others)"},
    /* names kiln-serve refuses (serving/serve_store.c good_name) are refused here */
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\", model: m, label: .B}\n",
     "job.yaml:5:44: push.endpoints[0].label: \".B\" is not a valid label (1 to 32 letters, "
     "digits, '_', '.' or '-', not starting with '.'; kiln-serve refuses others)"},
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\", model: \"ctr v2\", label: A}\n",
     "job.yaml:5:34: push.endpoints[0].model: \"ctr v2\" is not a model name kiln-serve accepts "
     "(1 to 63 letters, digits, '_', '.' or '-', not starting with '.')"},
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\", model: .ctr, label: A}\n",
     "job.yaml:5:34: push.endpoints[0].model: \".ctr\" is not a model name kiln-serve accepts "
     "(1 to 63 letters, digits, '_', '.' or '-', not starting with '.')"},
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\", model: ../x, label: A}\n",
     "job.yaml:5:34: push.endpoints[0].model: \"../x\" is not a model name kiln-serve accepts "
     "(1 to 63 letters, digits, '_', '.' or '-', not starting with '.')"},
    {P "push:\n  endpoints:\n    - {url: \"http://h:1\", model: m, label: A}\n"
       "    - {url: \"http://h:1\", model: m, label: A}\n",
     "job.yaml:6:7: push.endpoints[1]: same url, model and label as push.endpoints[0]; list each "
     "endpoint once"},
    {P "push: {endpoints: {url: x}}\n",
     "job.yaml:3:19: push.endpoints: expected a list of {url, model, label}, got a mapping"},
    /* online / batch */
    {P "export: {every: 30s}\n",
     "job.yaml:3:17: export.every: only online jobs export while training (train.mode is batch; "
     "a batch job exports at its end with export.on_success)"},
    {P "train: {mode: online}\n",
     "job.yaml:3:15: export.every: required with train.mode: online (how often the running "
     "trainer exports, e.g. 30s; 0 or none for never)"},
    /* model shapes */
    {P "model: {type: dlrm, top_mlp: [256, 2]}\n",
     "job.yaml:3:30: model.top_mlp: the last layer must have width 1 (the logit), got 2"},
    {P "model: {type: dlrm, bottom_mlp: [64, 32]}\n",
     "job.yaml:3:33: model.bottom_mlp: the last width (32) must equal model.embedding.dim (16): "
     "DLRM's dot interaction multiplies the dense vector with every embedding"},
    {P "model: {type: lr, top_mlp: [1]}\n",
     "job.yaml:3:28: model.top_mlp: only dlrm has MLPs (model.type is lr)"},
    {P "model: {type: dlrm, fm_dense_factors: true}\n",
     "job.yaml:3:39: model.fm_dense_factors: only fm has dense factors (model.type is dlrm)"},
    {P "model: {type: fm, dense_precision: bf16}\n",
     "job.yaml:3:36: model.dense_precision: bf16 applies to dlrm's MLP layers, and fm has none "
     "(its dense math is a dot product per row): remove it or set fp32"},
    {P "model: {type: dlrm, dense_precision: bf16}\nresources: {device: cuda}\n",
     "job.yaml:3:38: model.dense_precision: bf16 runs the CPU's dense layers, and "
     "resources.device: cuda trains the model on the GPU: set resources.device: cpu, or "
     "model.dense_precision: fp32"},
    {P "model: {type: dlrm, dense_precision: fp16}\n",
     "job.yaml:3:38: model.dense_precision: \"fp16\" is not one of fp32 | bf16"},
    {P "model: {type: dlrm, bottom_mlp: []}\n",
     "job.yaml:3:33: model.bottom_mlp: must list 1 to 16 widths, got 0"},
    {P "model:\n  type: fm\n  tables: [{name: a, slots: 0, dim: 8}]\n",
     "job.yaml:5:37: model.tables[0].dim: fm needs every table to have model.embedding.dim (16), "
     "got 8"},
    /* tables */
    {P "model:\n  tables: [{name: a, slots: [0, 26]}]\n",
     "job.yaml:4:33: model.tables[0].slots[1]: slot 26 is out of range 0..25 (data.cat_slots is "
     "26)"},
    {P "model:\n  tables:\n    - {name: a, slots: [0, 1]}\n    - {name: b, slots: [2, 1]}\n",
     "job.yaml:6:28: model.tables[1].slots[1]: slot 1 is already read by model.tables[0]; each "
     "slot belongs to exactly one table"},
    {P "model:\n  tables: [{name: a, slots: [3, 3]}]\n",
     "job.yaml:4:33: model.tables[0].slots[1]: slot 3 is listed twice in this table"},
    {P "model:\n  tables: [{name: a, slots: []}]\n",
     "job.yaml:4:29: model.tables[0].slots: a table must read at least one slot"},
    {P "model:\n  tables: [{slots: 1}]\n",
     "job.yaml:4:12: model.tables[0].name: required field is missing"},
    {P "model:\n  tables: [{name: a}]\n",
     "job.yaml:4:12: model.tables[0].slots: required field is missing"},
    {P "model:\n  tables: [{name: a, slots: 0}, {name: a, slots: 1}]\n",
     "job.yaml:4:40: model.tables[1].name: \"a\" is also the name of model.tables[0]"},
    {P "model:\n  tables: [{name: slot5, slots: 0}]\n",
     "job.yaml:4:19: model.tables[0].name: \"slot5\" is the name of slot 5's default table (no "
     "table lists slot 5); pick another name or list slot 5"},
    {P "model:\n  tables: [{name: a, slots: 0, dim: 0}]\n",
     "job.yaml:4:37: model.tables[0].dim: 0 is out of range 1..1024"},
    {P "model:\n  tables: [{name: a, slots: 0, capacity: -5}]\n",
     "job.yaml:4:42: model.tables[0].capacity: -5 is out of range 1..1099511627776"},
    {P "model:\n  tables: {name: a}\n",
     "job.yaml:4:11: model.tables: expected a list of tables, got a mapping"},
    /* A NUL inside a string: C would read "ok", after every check passed
     * (issue 27). */
    {"name: \"ok\\u0000/../../etc\"\ndata: {train: d}\n",
     "job.yaml:1:7: the string \"ok\\u0000...\" holds a NUL character (\\u0000) after 2 bytes; a "
     "job spec's strings cannot hold one: remove it"},
    {"name: j\ndata: {train: \"/data/x\\0.tsv\"}\n",
     "job.yaml:2:15: the string \"/data/x\\u0000...\" holds a NUL character (\\u0000) after 7 "
     "bytes; a job spec's strings cannot hold one: remove it"},
    {P "push:\n  endpoints: [{url: \"http://h:1\", model: m, label: \"B\\x00x\"}]\n",
     "job.yaml:4:52: the string \"B\\u0000...\" holds a NUL character (\\u0000) after 1 byte; a "
     "job spec's strings cannot hold one: remove it"},
    /* data.columns (format: parquet) */
#define PQ "name: j\ndata:\n  format: parquet\n  train: d\n" /* lines 1-4 */
    {P "data2: 1\n", "job.yaml:3:1: data2: unknown field (did you mean \"data\"?)"},
    {"name: j\ndata:\n  train: d\n  columns: {label: y}\n",
     "job.yaml:4:12: data.columns: names Parquet columns, but data.format is criteo-tsv (set "
     "data.format: parquet, or remove data.columns)"},
    {PQ "  columns: {dense: [a, b]}\n",
     "job.yaml:5:20: data.columns.dense: lists 2 columns but data.dense_features is 13: set "
     "data.dense_features: 2, or list 13 columns"},
    {PQ "  cat_slots: 2\n  columns: {categorical: [c, c]}\n",
     "job.yaml:6:30: data.columns.categorical[1]: \"c\" is listed twice (also "
     "data.columns.categorical[0])"},
    {PQ "  dense_features: 1\n  columns: {label: a, dense: [a]}\n",
     "job.yaml:6:30: data.columns.dense: column \"a\" is also the label (data.columns.label)"},
    {PQ "  dense_features: 1\n  cat_slots: 1\n  columns: {dense: [a], categorical: [a]}\n",
     "job.yaml:7:38: data.columns.categorical: column \"a\" is also dense "
     "(data.columns.dense[0]); a column feeds one input"},
    {PQ "  columns: {dense_transfrom: none}\n",
     "job.yaml:5:13: data.columns.dense_transfrom: unknown field (did you mean "
     "\"dense_transform\"?)"},
    {PQ "  columns: {dense_transform: log}\n",
     "job.yaml:5:30: data.columns.dense_transform: \"log\" is not one of auto | log1p | none"},
    {PQ "  columns: {label: \"\"}\n",
     "job.yaml:5:20: data.columns.label: must not be empty"},
    {PQ "  columns: {categorical: {a: 1}}\n",
     "job.yaml:5:26: data.columns.categorical: expected a list of Parquet column names, got a "
     "mapping"},
#undef PQ
};

static void test_bad_specs(void **state)
{
    (void)state;
    int failures = 0;
    for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
        job_spec_t s;
        job_diags_t d;
        int rc = parse(bad_specs[i].yaml, &s, &d);
        bool found = false;
        for (size_t j = 0; j < d.n; j++)
            found = found || strcmp(d.items[j].message, bad_specs[i].expect) == 0;
        if (rc != KILN_ESPEC || !found) {
            print_message("case %zu: rc %d, want: %s\n", i, rc, bad_specs[i].expect);
            print_diags(&d);
            failures++;
        }
        /* a failed parse leaves the spec zeroed */
        assert_null(s.name);
        assert_null(s.model.tables);
        job_diags_fini(&d);
    }
    assert_int_equal(failures, 0);
    assert_true(sizeof bad_specs / sizeof bad_specs[0] >= 30);
}

/* Problems from jobs/cron.c keep its message after "schedule: ". */
static void test_bad_schedule_and_timezone(void **state)
{
    (void)state;
    job_spec_t s;
    job_diags_t d;
    job_cron_t cron;
    assert_true(job_cron_parse("61 * * * *", &cron) < 0);
    char want[512];
    snprintf(want, sizeof want, "job.yaml:3:11: schedule: %s", kiln_errmsg());
    assert_int_equal(parse(P "schedule: \"61 * * * *\"\n", &s, &d), KILN_ESPEC);
    assert_int_equal(d.n, 1);
    assert_string_equal(d.items[0].message, want);
    assert_string_equal(d.items[0].path, "schedule");
    assert_int_equal(d.items[0].line, 3);
    assert_int_equal(d.items[0].col, 11);
    job_diags_fini(&d);

    assert_int_equal(parse(P "timezone: Mars/Olympus_Mons\n", &s, &d), KILN_ESPEC);
    assert_int_equal(d.n, 1);
    assert_non_null(strstr(d.items[0].message, "job.yaml:3:11: timezone: "));
    job_diags_fini(&d);
}

/* Every problem is reported, in document order, not only the first. */
static void test_collects_all(void **state)
{
    (void)state;
    job_spec_t s;
    job_diags_t d;
    const char *text = "name: bad name\n"                  /* 1 */
                       "data: {train: d}\n"                /* 2 */
                       "resources: {launcher: hostfile}\n" /* 3: found after the walk */
                       "model:\n"                          /* 4 */
                       "  embedding: {dim: sixteen}\n"     /* 5 */
                       "concurency: allow\n"               /* 6 */
                       "push: {retries: -1}\n";            /* 7 */
    assert_int_equal(parse(text, &s, &d), KILN_ESPEC);
    if (d.n != 5)
        print_diags(&d);
    assert_int_equal(d.n, 5);
    int lines[] = {1, 3, 5, 6, 7};
    for (size_t i = 0; i < d.n; i++)
        assert_int_equal(d.items[i].line, lines[i]);
    assert_string_equal(d.items[1].path, "resources.hostfile");
    assert_string_equal(d.items[2].path, "model.embedding.dim");
    /* kiln_errmsg carries the first problem and the count of the others */
    assert_non_null(strstr(kiln_errmsg(), "job.yaml:1:7: name: "));
    assert_non_null(strstr(kiln_errmsg(), "(and 4 more problems)"));
    job_diags_fini(&d);

    /* NULL diags is allowed */
    assert_int_equal(job_spec_parse("name: j\n", 8, "x.yaml", &s, NULL), KILN_ESPEC);
    assert_string_equal(kiln_errmsg(), "x.yaml:1:1: data.train: required field is missing");
}

static void test_load_errors(void **state)
{
    (void)state;
    job_spec_t s;
    job_diags_t d;
    job_diags_init(&d);
    assert_int_equal(job_spec_load("/nonexistent/kiln/job.yaml", &s, &d), KILN_ENOENT);
    assert_non_null(strstr(kiln_errmsg(), "/nonexistent/kiln/job.yaml"));
    assert_int_equal(d.n, 0);

    /* diagnostics name the file as given */
    char dir[] = "/tmp/kiln-spec-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/job.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("name: j\ndata: {train: d}\nresources: {ranks: many}\n", f);
    fclose(f);
    assert_int_equal(job_spec_load(path, &s, &d), KILN_ESPEC);
    assert_int_equal(d.n, 1);
    char want[128];
    snprintf(want, sizeof want,
             "%s:3:20: resources.ranks: expected a positive integer, got \"many\"", path);
    assert_string_equal(d.items[0].message, want);
    job_diags_fini(&d);
    unlink(path);
    rmdir(dir);
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(job_concurrency_name(JOB_CONC_REPLACE), "replace");
    assert_string_equal(job_catchup_name(JOB_CATCHUP_ALL), "all");
    assert_string_equal(job_launcher_name(JOB_LAUNCH_HOSTFILE), "hostfile");
    assert_string_equal(job_device_name(JOB_DEVICE_CUDA), "cuda");
    assert_string_equal(job_format_name(JOB_FMT_KILN_BIN), "kiln-bin");
    assert_string_equal(job_model_type_name(MODEL_DLRM), "dlrm");
    assert_string_equal(job_combiner_name(KERN_COMBINE_MEAN), "mean");
    assert_string_equal(job_eviction_name(KERN_EVICT_LFU), "lfu");
    assert_string_equal(job_init_name(KERN_INIT_ZEROS), "zeros");
    assert_string_equal(job_optimizer_type_name(KERN_OPT_ADAM), "adam");
    assert_string_equal(job_export_mode_name(JOB_EXPORT_INCREMENTAL), "incremental");
    assert_string_equal(job_init_from_name(JOB_INITFROM_CHECKPOINT), "checkpoint");
    assert_string_equal(job_train_mode_name(JOB_MODE_ONLINE), "online");
    assert_string_equal(job_model_type_name((model_type_t)42), "?");
}

/* ---- hostile specs: each answers with its error and returns ---------------------------
 * The old parser took O(n^2) in the keys of a mapping and in the nesting
 * depth (200k brackets: 60 s; 10 MB of unknown keys: did not finish), so
 * these tests would hang there; their timing is in the report, not here. */

/* A growing text buffer. */
typedef struct {
    char *p;
    size_t n, cap;
} text_t;

static void text_add(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(text_t *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        assert_true(k >= 0);
        if (t->p != NULL && t->n + (size_t)k < t->cap) {
            t->n += (size_t)k;
            return;
        }
        t->cap = (t->cap + (size_t)k + 1) * 2;
        t->p = realloc(t->p, t->cap);
        assert_non_null(t->p);
    }
}

/* Parses t and expects KILN_ESPEC with a diagnostic containing want. */
static void parse_fails_with(const text_t *t, const char *want, job_diags_t *d)
{
    job_spec_t s;
    job_diags_init(d);
    int rc = job_spec_parse(t->p, t->n, "job.yaml", &s, d);
    bool found = false;
    for (size_t i = 0; i < d->n; i++)
        found = found || strstr(d->items[i].message, want) != NULL;
    if (rc != KILN_ESPEC || !found) {
        print_message("rc %d, wanted a diagnostic with: %s\n", rc, want);
        for (size_t i = 0; i < d->n && i < 5; i++)
            print_message("  diag: %.300s\n", d->items[i].message);
    }
    assert_int_equal(rc, KILN_ESPEC);
    assert_true(found);
    assert_null(s.name);
}

/* parse_fails_with on t, and with ndiags > 0 exactly that many
 * diagnostics; then t is freed and empty again for the next text. */
static void refused(text_t *t, const char *want, size_t ndiags)
{
    job_diags_t d;
    parse_fails_with(t, want, &d);
    if (ndiags > 0)
        assert_int_equal(d.n, ndiags);
    job_diags_fini(&d);
    free(t->p);
    *t = (text_t){0};
}

/* Adds prefix, levels nested brackets (the innermost empty) and a newline
 * to t. */
static void add_nested(text_t *t, const char *prefix, int levels)
{
    text_add(t, "%s", prefix);
    for (int i = 0; i < levels; i++)
        text_add(t, "[");
    for (int i = 0; i < levels; i++)
        text_add(t, "]");
    text_add(t, "\n");
}

/* Bigger than JOB_SPEC_MAX_BYTES, from text and from a file: refused by
 * size, with the size in the message. */
static void test_hostile_size(void **state)
{
    (void)state;
    text_t t = {0};
    text_add(&t, "name: j\ndata: {train: d}\n");
    for (int i = 0; t.n < (size_t)10 << 20; i++)
        text_add(&t, "k%07d: 1\n", i);
    job_diags_t d;
    char want[128];
    snprintf(want, sizeof want,
             "job.yaml: the job spec is %zu bytes; a job spec may be at most "
             "1048576 bytes (1 MiB)",
             t.n);
    parse_fails_with(&t, want, &d);
    assert_int_equal(d.n, 1);
    job_diags_fini(&d);

    char dir[] = "/tmp/kiln-spec-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/big.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(t.p, 1, t.n, f), t.n);
    fclose(f);
    job_spec_t s;
    job_diags_init(&d);
    assert_int_equal(job_spec_load(path, &s, &d), KILN_ESPEC);
    assert_int_equal(d.n, 1);
    snprintf(want, sizeof want, "%s: the job spec is %zu bytes;", path, t.n);
    assert_non_null(strstr(d.items[0].message, want));
    job_diags_fini(&d);
    unlink(path);
    rmdir(dir);
    free(t.p);
}

/* Just under the size limit, all unknown keys: every key is checked (the
 * last one too: it is a duplicate), the first JOB_SPEC_MAX_PROBLEMS are
 * described and one last line counts the rest. */
static void test_hostile_many_keys(void **state)
{
    (void)state;
    text_t t = {0};
    text_add(&t, "name: j\ndata: {train: d}\n");
    int nkeys = 0;
    while (t.n < JOB_SPEC_MAX_BYTES - 100)
        text_add(&t, "k%07d: 1\n", nkeys++);
    text_add(&t, "k0000000: 2\n"); /* a duplicate of line 3, found among ~100k keys */
    job_diags_t d;
    parse_fails_with(&t, "job.yaml:3:1: k0000000: unknown field (expected one of: name,", &d);
    assert_int_equal(d.n, JOB_SPEC_MAX_PROBLEMS + 1);
    char want[128];
    snprintf(want, sizeof want, "job.yaml: %d more problems not listed (the first %d are above)",
             nkeys + 1 - JOB_SPEC_MAX_PROBLEMS, JOB_SPEC_MAX_PROBLEMS);
    assert_string_equal(d.items[d.n - 1].message, want);
    assert_non_null(strstr(kiln_errmsg(), "more problems)"));
    job_diags_fini(&d);
    free(t.p);

    /* The hash-set duplicate finder still names the first occurrence. */
    t = (text_t){0};
    text_add(&t, "name: j\ndata: {train: d}\nmodel:\n");
    for (int i = 0; i < 40; i++)
        text_add(&t, "  x%d: 1\n", i);
    text_add(&t, "  type: fm\n  type: lr\n");
    refused(&t, "job.yaml:45:3: model.type: duplicate field (first given at line 44)", 0);
}

/* 200k nested brackets, and mappings nested in block style: one error at
 * the first level too deep. */
static void test_hostile_depth(void **state)
{
    (void)state;
    text_t t = {0};
    add_nested(&t, "name: j\ndata: {train: d}\nmodel: ", 200000);
    /* model's value opens at column 8: level 2 (the top mapping is 1), so
     * the 64th bracket there is level 65. */
    refused(&t, "job.yaml:3:71: the job spec nests more than 64 levels deep here", 1);

    text_add(&t, "name: j\ndata: {train: d}\n");
    for (int i = 0; i < 70; i++)
        text_add(&t, "%*sk%d:\n", i, "", i);
    /* k0 is a field of the top mapping (level 1); k64's mapping is level 65. */
    refused(&t, "job.yaml:67:65: the job spec nests more than 64 levels deep here", 0);

    /* 64 levels is allowed (as YAML; the fields are then unknown). */
    add_nested(&t, "name: j\ndata: {train: d}\nx: ", 63);
    refused(&t, "job.yaml:3:1: x: unknown field", 1);
}

/* Aliases make a small text walk a large tree: 1024 tables that are each
 * the same mapping of 2000 keys stop at the node budget. */
static void test_hostile_aliases(void **state)
{
    (void)state;
    text_t t = {0};
    text_add(&t, "name: j\ndata: {train: d, cat_slots: 1024}\nmodel:\n  tables: [&t {");
    for (int i = 0; i < 2000; i++)
        text_add(&t, "%sk%d: 1", i ? ", " : "", i);
    text_add(&t, "}");
    for (int i = 1; i < 1024; i++)
        text_add(&t, ", *t");
    text_add(&t, "]\n");
    assert_true(t.n < JOB_SPEC_MAX_BYTES);
    refused(&t, "the job spec expands to more than 1048576 nodes (through aliases?)", 0);
}

static int glob_parse(const char *pattern, size_t min_files)
{
    glob_t g;
    assert_int_equal(glob(pattern, 0, NULL, &g), 0);
    assert_true(g.gl_pathc >= min_files);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        job_spec_t s;
        load_ok(g.gl_pathv[i], &s);
        assert_non_null(s.name);
        assert_non_null(s.data.train);
        job_spec_fini(&s);
    }
    size_t n = g.gl_pathc;
    globfree(&g);
    return (int)n;
}

static void test_examples_parse(void **state)
{
    (void)state;
    glob_parse(KILN_SOURCE_DIR "/examples/*.yaml", 4);
    glob_parse(KILN_SOURCE_DIR "/tests/specs/good/*.yaml", 3);

    /* the examples promised by the docs */
    job_spec_t s;
    load_ok(KILN_SOURCE_DIR "/examples/ctr-hourly.yaml", &s);
    assert_string_equal(s.schedule, "15 * * * *");
    assert_true(s.data.incremental);
    assert_string_equal(s.push.endpoints[0].label, "B");
    job_spec_fini(&s);
    load_ok(KILN_SOURCE_DIR "/examples/oneoff.yaml", &s);
    assert_null(s.schedule);
    assert_int_equal(s.resources.ranks, 2);
    assert_string_equal(s.data.train, "data/day=*/part-*.tsv");
    job_spec_fini(&s);
    load_ok(KILN_SOURCE_DIR "/examples/online.yaml", &s);
    assert_int_equal(s.train.mode, JOB_MODE_ONLINE);
    assert_int_equal(s.export_.every_ms, 30000);
    assert_true(s.push.nendpoints > 0);
    job_spec_fini(&s);
    load_ok(KILN_SOURCE_DIR "/examples/parquet-nvtabular.yaml", &s);
    assert_int_equal(s.data.format, JOB_FMT_PARQUET);
    assert_string_equal(s.data.columns.label, "click");
    assert_int_equal(s.data.columns.ndense, 3);
    assert_string_equal(s.data.columns.categorical[3], "item_tags");
    assert_int_equal(s.data.columns.dense_transform, JOB_DENSE_AUTO);
    job_spec_fini(&s);
    load_ok(KILN_SOURCE_DIR "/examples/cluster-slurm.yaml", &s);
    assert_int_equal(s.resources.launcher, JOB_LAUNCH_SLURM);
    assert_int_equal(s.resources.gpus_per_node, 4);
    assert_string_equal(s.resources.mpi.interfaces, "10.20.0.0/16");
    job_spec_fini(&s);
}

/* KILN_TEST_FILTER='test_hostile*' runs matching tests (cmocka glob). */
PROC_TEST_MAIN_EACH(NULL, NULL, NULL, NULL,
    test_ctr_hourly, test_minimal_defaults, test_every_field, test_tables, test_bad_specs,
    test_bad_schedule_and_timezone, test_collects_all, test_load_errors, test_names,
    test_examples_parse, test_hostile_size, test_hostile_many_keys, test_hostile_depth,
    test_hostile_aliases)
