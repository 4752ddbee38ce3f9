/*
 * jobs/spec.c - the job spec parser: YAML text -> validated job_spec_t.
 * This file: the entry points (job_spec_parse, job_spec_load, job_spec_fini)
 * and the checks across fields; spec_schema.c holds the tables, spec_walk.c
 * the walker (spec_int.h says who calls what).
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

#include "kiln.h"
#include "serve.h"
#include "spec_int.h"

/* ---- cross-field checks ---------------------------------------------------------------- */

/* Fills model.tables: the user's tables (model.tables, in order) and then
 * one default table "slot<i>" for every slot no user table reads. */
static void build_tables(ctx_t *c)
{
    job_spec_t *s = c->spec;
    int cat = s->data.cat_slots, nuser = 0;
    char ip[PATH_MAX_LEN], gb[80];
    if (c->tables != NULL && c->tables->type != YAML_SEQUENCE_NODE) {
        spec_diag(c, c->tables, "model.tables", "expected a list of tables, got %s",
                  spec_got(c->tables, gb, sizeof gb));
    } else if (c->tables != NULL) {
        nuser = (int)(c->tables->data.sequence.items.top - c->tables->data.sequence.items.start);
    }
    if (nuser > cat) {
        spec_diag(c, c->tables, "model.tables",
                  "%d tables for %d slots; a table reads one slot or more", nuser, cat);
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
        t->emb.spill_dir = NULL; /* model.embedding's is the job's */
        spec_index_path(ip, "model.tables", i);
        spec_walk_map(c, spec_table_fields, item, (char *)t, ip);
    }
    for (int i = 0; i < nuser; i++) {
        const job_table_t *t = &s->model.tables[i];
        if (t->name == NULL)
            continue;
        int line, col;
        snprintf(ip, sizeof ip, "model.tables[%d].name", i);
        spec_where(c, &line, &col, ip, NULL);
        for (int j = 0; j < i; j++)
            if (s->model.tables[j].name && strcmp(s->model.tables[j].name, t->name) == 0) {
                spec_diag_at(c, line, col, ip, "\"%s\" is also the name of model.tables[%d]",
                             t->name, j);
                break;
            }
        int slot;
        if (sscanf(t->name, "slot%d", &slot) == 1 && slot >= 0 && slot < cat &&
            c->slot_owner[slot] < 0) {
            char again[32];
            snprintf(again, sizeof again, "slot%d", slot);
            if (strcmp(again, t->name) == 0)
                spec_diag_at(
                    c, line, col, ip,
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
        t->emb.spill_dir = NULL;
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
    if (s->model.type != MODEL_FM && spec_seen(c, "model.fm_dense_factors") != NULL) {
        spec_where(c, &line, &col, "model.fm_dense_factors", NULL);
        spec_diag_at(c, line, col, "model.fm_dense_factors",
                     "only fm has dense factors (model.type is %s)", type);
    }
    if (s->model.dense_precision == MODEL_DENSE_BF16 && s->model.type != MODEL_DLRM) {
        spec_where(c, &line, &col, "model.dense_precision", NULL);
        spec_diag_at(c, line, col, "model.dense_precision",
                     "bf16 applies to dlrm's MLP layers, and %s has none (its dense math is a "
                     "dot product per row): remove it or set fp32",
                     type);
    }
    if (s->model.dense_precision == MODEL_DENSE_BF16 && s->resources.device == JOB_DEVICE_CUDA) {
        spec_where(c, &line, &col, "model.dense_precision", "resources.device", NULL);
        spec_diag_at(c, line, col, "model.dense_precision",
                     "bf16 runs the CPU's dense layers, and resources.device: cuda trains the "
                     "model on the GPU: set resources.device: cpu, or model.dense_precision: fp32");
    }
    if (s->model.type != MODEL_DLRM) {
        static const char *const mlps[] = {"model.bottom_mlp", "model.top_mlp"};
        for (int i = 0; i < 2; i++) {
            if (spec_seen(c, mlps[i]) == NULL)
                continue;
            spec_where(c, &line, &col, mlps[i], NULL);
            spec_diag_at(c, line, col, mlps[i], "only dlrm has MLPs (model.type is %s)", type);
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
            spec_where(c, &line, &col, "model.top_mlp", NULL);
            spec_diag_at(c, line, col, "model.top_mlp",
                         "the last layer must have width 1 (the logit), got %d",
                         s->model.top_mlp[s->model.ntop - 1]);
        }
        int last = s->model.nbottom > 0 ? s->model.bottom_mlp[s->model.nbottom - 1] : 0;
        if (s->model.nbottom > 0 && last != s->model.embedding.dim) {
            spec_where(c, &line, &col, "model.bottom_mlp", NULL);
            spec_diag_at(c, line, col, "model.bottom_mlp",
                         "the last width (%d) must equal model.embedding.dim (%d): DLRM's dot "
                         "interaction multiplies the dense vector with every embedding",
                         last, s->model.embedding.dim);
        }
    }
    /* dlrm and fm multiply embeddings with each other: one dim for all. */
    if (s->model.type == MODEL_LR)
        return;
    for (int i = 0; i < s->model.ntables; i++) {
        snprintf(ip, sizeof ip, "model.tables[%d].dim", i);
        if (spec_seen(c, ip) == NULL || s->model.tables[i].emb.dim == s->model.embedding.dim)
            continue;
        spec_where(c, &line, &col, ip, NULL);
        spec_diag_at(c, line, col, ip,
                     "%s needs every table to have model.embedding.dim (%d), got %d", type,
                     s->model.embedding.dim, s->model.tables[i].emb.dim);
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
        if (i >= 0 && spec_seen(c, path) == NULL)
            continue;
        if (cap < ranks) {
            int line, col;
            spec_where(c, &line, &col, path, "resources.ranks", NULL);
            spec_diag_at(c, line, col, path,
                         "%" PRId64
                         " rows over %d ranks leaves a rank without a row: raise it to at "
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
        spec_where(c, &line, &col, path, "resources.ranks", NULL);
        spec_diag_at(c, line, col, path,
                     "%" PRId64 " rows over %d rank%s is %" PRId64
                     " rows per rank%s, more than the "
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
            if (spec_seen(c, only[i]) == NULL)
                continue;
            spec_where(c, &line, &col, only[i], NULL);
            spec_diag_at(c, line, col, only[i], "only used with launcher: slurm (launcher is %s)",
                         job_launcher_name(s->resources.launcher));
        }
        return;
    }
    if (s->resources.nodes > s->resources.ranks) {
        spec_where(c, &line, &col, "resources.nodes", NULL);
        spec_diag_at(c, line, col, "resources.nodes",
                     "%d nodes for %d ranks: every node runs at least one rank (raise "
                     "resources.ranks or lower resources.nodes)",
                     s->resources.nodes, s->resources.ranks);
    }
    if (s->resources.gpus_per_node > 0 && s->resources.device == JOB_DEVICE_CPU) {
        spec_where(c, &line, &col, "resources.gpus_per_node", NULL);
        spec_diag_at(c, line, col, "resources.gpus_per_node",
                     "asks for GPUs but resources.device is cpu (use auto or cuda)");
    }
}

/* data.columns: Parquet only; its lists as long as data.dense_features and
 * data.cat_slots; a column named once across label, dense and categorical. */
static void check_columns(ctx_t *c)
{
    job_spec_t *s = c->spec;
    const job_columns_t *m = &s->data.columns;
    int line, col;
    if (spec_seen(c, "data.columns") != NULL && s->data.format != JOB_FMT_PARQUET) {
        spec_where(c, &line, &col, "data.columns", NULL);
        spec_diag_at(c, line, col, "data.columns",
                     "names Parquet columns, but data.format is %s (set data.format: parquet, "
                     "or remove data.columns)",
                     job_format_name(s->data.format));
    }
    static const struct {
        const char *path, *count_path;
        size_t list, n, want;
    } lists[] = {
        {"data.columns.dense", "data.dense_features", offsetof(job_spec_t, data.columns.dense),
         offsetof(job_spec_t, data.columns.ndense), offsetof(job_spec_t, data.dense_features)},
        {"data.columns.categorical", "data.cat_slots",
         offsetof(job_spec_t, data.columns.categorical),
         offsetof(job_spec_t, data.columns.ncategorical), offsetof(job_spec_t, data.cat_slots)},
    };
    for (size_t k = 0; k < sizeof lists / sizeof lists[0]; k++) {
        char **names = *(char ***)((char *)s + lists[k].list);
        int n = *(int *)((char *)s + lists[k].n), want = *(int *)((char *)s + lists[k].want);
        if (names == NULL)
            continue;
        if (n != want) {
            spec_where(c, &line, &col, lists[k].path, NULL);
            spec_diag_at(c, line, col, lists[k].path,
                         "lists %d columns but %s is %d: set %s: %d, or list %d columns", n,
                         lists[k].count_path, want, lists[k].count_path, n, want);
        }
        for (int i = 0; m->label != NULL && i < n; i++)
            if (strcmp(names[i], m->label) == 0) {
                spec_where(c, &line, &col, lists[k].path, NULL);
                spec_diag_at(c, line, col, lists[k].path,
                             "column \"%.80s\" is also the label (data.columns.label)",
                             names[i]);
            }
    }
    for (int i = 0; m->dense != NULL && m->categorical != NULL && i < m->ndense; i++)
        for (int j = 0; j < m->ncategorical; j++)
            if (strcmp(m->dense[i], m->categorical[j]) == 0) {
                spec_where(c, &line, &col, "data.columns.categorical", NULL);
                spec_diag_at(c, line, col, "data.columns.categorical",
                             "column \"%.80s\" is also dense (data.columns.dense[%d]); a column "
                             "feeds one input",
                             m->dense[i], i);
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
        if (opts[i]->type == KERN_OPT_ADAM && spec_seen(c, eps_paths[i]) == NULL)
            opts[i]->eps = 1e-8;

    if (s->resources.launcher == JOB_LAUNCH_HOSTFILE && s->resources.hostfile == NULL) {
        spec_where(c, &line, &col, "resources.launcher", NULL);
        spec_diag_at(c, line, col, "resources.hostfile",
                     "required with launcher: hostfile (a file listing the hosts to run on)");
    } else if (s->resources.launcher != JOB_LAUNCH_HOSTFILE && s->resources.hostfile != NULL) {
        spec_where(c, &line, &col, "resources.hostfile", NULL);
        spec_diag_at(c, line, col, "resources.hostfile",
                     "only used with launcher: hostfile (launcher is %s)",
                     job_launcher_name(s->resources.launcher));
    }

    check_slurm_fields(c);

    if (s->retries.max_backoff_ms < s->retries.backoff_ms) {
        char d1[32], d2[32];
        spec_where(c, &line, &col, "retries.max_backoff", "retries.backoff", NULL);
        spec_diag_at(c, line, col, "retries.max_backoff", "%s is shorter than retries.backoff (%s)",
                     kiln_duration_format(s->retries.max_backoff_ms, d1, sizeof d1),
                     kiln_duration_format(s->retries.backoff_ms, d2, sizeof d2));
    }

    check_columns(c);
    build_tables(c);
    check_model(c);
    check_capacity(c);

    if (s->train.mode == JOB_MODE_BATCH && s->export_.every_ms > 0) {
        spec_where(c, &line, &col, "export.every", NULL);
        spec_diag_at(c, line, col, "export.every",
                     "only online jobs export while training (train.mode is batch; a batch job "
                     "exports at its end with export.on_success)");
    } else if (s->train.mode == JOB_MODE_ONLINE && spec_seen(c, "export.every") == NULL) {
        spec_where(c, &line, &col, "train.mode", NULL);
        spec_diag_at(c, line, col, "export.every",
                     "required with train.mode: online (how often the running trainer exports, "
                     "e.g. 30s; 0 or none for never)");
    }

    bool auto_ep = false;
    for (int i = 0; i < s->push.nendpoints; i++)
        auto_ep |= s->push.endpoints[i].auto_push;
    if (s->push.ramp_step > 0 && !auto_ep) {
        spec_where(c, &line, &col, "push.ramp", NULL);
        spec_diag_at(c, line, col, "push.ramp",
                     "ramps the traffic of the labels kilnd pushes to, and no endpoint of "
                     "push.endpoints has auto: true; add one (the challenger) or drop the ramp");
    }
}

/* ---- entry points ------------------------------------------------------------------------ */
void job_spec_fini(job_spec_t *s)
{
    if (s == NULL)
        return;
    KILN_FREE_ALL(s->name, s->description, s->schedule, s->timezone, s->resources.hostfile,
                  s->resources.partition, s->resources.account);
    for (int i = 0; i < s->resources.nsbatch_args; i++)
        free(s->resources.sbatch_args[i]);
    KILN_FREE_ALL(s->resources.sbatch_args, s->resources.mpi.interfaces, s->data.train,
                  s->data.eval, s->model.bottom_mlp, s->model.top_mlp, s->data.columns.label);
    for (int i = 0; i < s->data.columns.ndense; i++)
        free(s->data.columns.dense[i]);
    for (int i = 0; i < s->data.columns.ncategorical; i++)
        free(s->data.columns.categorical[i]);
    KILN_FREE_ALL(s->data.columns.dense, s->data.columns.categorical);
    for (int i = 0; i < s->model.ntables; i++) {
        free(s->model.tables[i].name);
        free(s->model.tables[i].slots);
    }
    KILN_FREE_ALL(s->model.tables, s->train.init_from_checkpoint, s->checkpoint.dir,
                  s->push.token_env, s->model.embedding.spill_dir);
    for (int i = 0; i < s->push.nendpoints; i++)
        KILN_FREE_ALL(s->push.endpoints[i].url, s->push.endpoints[i].model,
                      s->push.endpoints[i].label);
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
        spec_diag_at(c, line, col, "", "YAML syntax error: %s (%s at %d:%d)", problem, p->context,
                     (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
    else
        spec_diag_at(c, line, col, "", "YAML syntax error: %s", problem);
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
    spec_diag_at(&c, 0, 0, "",
                 "the job spec is %" PRIu64
                 " bytes; a job spec may be at most %d bytes (1 MiB): is "
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
                spec_diag_at(c, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1, "",
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

/* Reports every scalar of doc (a key or a value) that holds a NUL character
 * ("\u0000" in a quoted string): C reads the string only up to it, so
 * `name: "ok\u0000/../../etc"` would pass every check as "ok". libyaml gives
 * each scalar's length, which strlen must match. */
static void refuse_nul_strings(ctx_t *c, yaml_document_t *doc)
{
    for (yaml_node_t *n = doc->nodes.start; n < doc->nodes.top; n++) {
        if (n->type != YAML_SCALAR_NODE)
            continue;
        size_t at = strlen(spec_scalar(n));
        if (at != n->data.scalar.length)
            spec_diag(c, n, "",
                      "the string \"%.40s\\u0000...\" holds a NUL character (\\u0000) after "
                      "%zu byte%s; a job spec's strings cannot hold one: remove it",
                      spec_scalar(n), at, at == 1 ? "" : "s");
    }
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
    if (root == NULL || spec_is_null(root)) {
        spec_diag_at(&c, root ? (int)root->start_mark.line + 1 : 1,
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
            spec_diag_at(&c, (int)r2->start_mark.line + 1, (int)r2->start_mark.column + 1, "",
                         "a job spec is one YAML document; a second one starts here");
    }
    if (root->type != YAML_MAPPING_NODE) {
        char gb[80];
        spec_diag(&c, root, "",
                  "the top level must be a mapping of fields (name: ..., data: ...), "
                  "got %s",
                  spec_got(root, gb, sizeof gb));
        goto done;
    }
    refuse_nul_strings(&c, &doc);
    spec_apply_defaults(&c, spec_top_fields, (char *)spec);
    spec_walk_map(&c, spec_top_fields, root, (char *)spec, "");
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
            spec_diag_at(&c, 0, 0, "", "%zu more problem%s not listed (the first %d are above)",
                         dropped, dropped == 1 ? "" : "s", JOB_SPEC_MAX_PROBLEMS);
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