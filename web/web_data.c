/*
 * web/web_data.c - what the pages and the JSON API both show, read once here
 * so they agree: a run's figures (samples/s, eval logloss/AUC from metric
 * rows or RUN_DIR/result.json), its loss curve (metric rows or
 * RUN_DIR/progress.jsonl), its log tail, a job's next fire, and the lineage
 * graph of a checkpoint or an endpoint.
 */
#include "web_int.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobs.h"
#include "run.h"

/* Each figure: its metric name (run/run.h), and where it sits in the result
 * when the metric rows are missing. */
static const struct {
    size_t off;
    const char *metric;
    size_t result_off;
} figures[] = {
    {offsetof(web_run_figures_t, samples_per_s), RUN_FIG_SAMPLES_PER_S,
     offsetof(run_result_t, samples_per_s)},
    {offsetof(web_run_figures_t, eval_logloss), RUN_FIG_EVAL_LOGLOSS,
     offsetof(run_result_t, eval_logloss)},
    {offsetof(web_run_figures_t, eval_auc), RUN_FIG_EVAL_AUC, offsetof(run_result_t, eval_auc)},
};
#define NFIGURES (sizeof figures / sizeof figures[0])

static char *run_file(const state_run_t *run, const char *name)
{
    if (run->run_dir == NULL || run->run_dir[0] == '\0')
        return NULL;
    return kiln_asprintf("%s/%s", run->run_dir, name);
}

void web_run_figures(state_t *st, const state_run_t *run, web_run_figures_t *out)
{
    bool missing = false;
    for (size_t i = 0; i < NFIGURES; i++) {
        double *v = (double *)((char *)out + figures[i].off);
        bool found = false;
        double x;
        *v = NAN;
        if (state_metric_last(st, run->id, figures[i].metric, &x, &found) == 0 && found)
            *v = x;
        missing |= isnan(*v);
    }
    run_result_t res;
    if (!missing || !state_run_state_terminal(run->state) || run->run_dir == NULL ||
        run_result_read(run->run_dir, &res) < 0)
        return;
    for (size_t i = 0; i < NFIGURES; i++) {
        double *v = (double *)((char *)out + figures[i].off);
        if (isnan(*v))
            *v = *(const double *)((const char *)&res + figures[i].result_off);
    }
}

int64_t web_run_duration(const state_run_t *run)
{
    if (run->started_at <= 0)
        return -1;
    int64_t end = run->ended_at > 0 ? run->ended_at : kiln_now_s();
    return end > run->started_at ? end - run->started_at : 0;
}

/* Keeps at most WEB_PLOT_POINTS of n points, evenly by index, the last kept. */
static size_t thin(double *x, double *y, size_t n)
{
    if (n <= WEB_PLOT_POINTS)
        return n;
    size_t m = 0;
    for (size_t k = 0; k < WEB_PLOT_POINTS; k++) {
        size_t i = (size_t)((double)k * (double)(n - 1) / (double)(WEB_PLOT_POINTS - 1));
        x[m] = x[i];
        y[m] = y[i];
        m++;
    }
    return m;
}

/* Reads progress.jsonl: one {"step", "loss", ...} object per line. */
static int progress_series(const state_run_t *run, double **xs, double **ys, size_t *n)
{
    char *path = run_file(run, RUN_FILE_PROGRESS);
    if (path == NULL)
        return 0;
    FILE *f = fopen(path, "r");
    free(path);
    if (f == NULL)
        return 0;
    size_t cap = 0, len = 0;
    double *x = NULL, *y = NULL;
    char line[1024];
    int rc = 0;
    while (fgets(line, sizeof line, f) != NULL && len < 1000000) {
        run_progress_t p;
        if (run_progress_parse(line, &p) == 0 && p.kind == RUN_REC_STEP && !isnan(p.loss)) {
            if (len == cap) {
                size_t nc = cap ? cap * 2 : 256;
                double *nx = kiln_reallocarray(x, nc, sizeof *x);
                if (nx != NULL)
                    x = nx;
                double *ny = nx ? kiln_reallocarray(y, nc, sizeof *y) : NULL;
                if (ny != NULL)
                    y = ny;
                if (nx == NULL || ny == NULL) {
                    rc = KILN_ENOMEM;
                    break;
                }
                cap = nc;
            }
            x[len] = (double)p.step;
            y[len] = p.loss;
            len++;
        }
    }
    fclose(f);
    if (rc < 0) {
        free(x);
        free(y);
        return rc;
    }
    *xs = x;
    *ys = y;
    *n = len;
    return 0;
}

int web_loss_series(state_t *st, const state_run_t *run, double **xs, double **ys, size_t *n)
{
    state_metric_t *ms = NULL;
    size_t nm = 0;
    *xs = *ys = NULL;
    *n = 0;
    KILN_CHECK(state_metric_series(st, run->id, RUN_FIG_LOSS, &ms, &nm));
    if (nm == 0) {
        free(ms);
        KILN_CHECK(progress_series(run, xs, ys, n));
        *n = thin(*xs, *ys, *n);
        return 0;
    }
    double *x = kiln_calloc(nm, sizeof *x), *y = kiln_calloc(nm, sizeof *y);
    if (x == NULL || y == NULL) {
        free(x);
        free(y);
        free(ms);
        return KILN_ENOMEM;
    }
    size_t m = 0;
    for (size_t i = 0; i < nm; i++) {
        if (isnan(ms[i].value))
            continue;
        x[m] = (double)ms[i].step;
        y[m] = ms[i].value;
        m++;
    }
    free(ms);
    *xs = x;
    *ys = y;
    *n = thin(x, y, m);
    return 0;
}

char *web_log_tail(const state_run_t *run, size_t max)
{
    char *path = run_file(run, RUN_FILE_LOG);
    if (path == NULL)
        return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    if (fd < 0)
        return NULL;
    char *buf = NULL;
    struct stat sb;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode))
        goto out;
    off_t from = sb.st_size > (off_t)max ? sb.st_size - (off_t)max : 0;
    size_t want = (size_t)(sb.st_size - from);
    buf = kiln_malloc(want + 1);
    if (buf == NULL)
        goto out;
    ssize_t got = pread(fd, buf, want, from);
    if (got < 0)
        got = 0;
    buf[got] = '\0';
    if (from > 0) {
        /* Start at a whole line. */
        char *nl = memchr(buf, '\n', (size_t)got);
        if (nl != NULL)
            memmove(buf, nl + 1, (size_t)got - (size_t)(nl + 1 - buf) + 1);
    }
out:
    close(fd);
    return buf;
}

int64_t web_next_fire(const state_job_t *job, int64_t now)
{
    if (job->schedule == NULL || job->paused)
        return 0;
    /* The zone is the job's column (NULL: UTC). */
    return job_next_fire(job->schedule, job->timezone, now);
}

/* ---- lineage graphs ------------------------------------------------------------------ */

/* The index of node (kind, id), adding it in column col when new; -1 when
 * the graph is full. */
static int node(web_graph_t *g, web_node_kind_t kind, int64_t id, int col)
{
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].kind == kind && g->nodes[i].id == id)
            return i;
    if (g->nnodes >= WEB_GRAPH_MAX_NODES) {
        g->truncated = true;
        return -1;
    }
    web_node_t *n = &g->nodes[g->nnodes];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->id = id;
    n->col = col;
    int row = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].col == col)
            row++;
    n->row = row;
    return g->nnodes++;
}

static void edge(web_graph_t *g, int from, int to, const char *label)
{
    if (from < 0 || to < 0)
        return;
    for (int i = 0; i < g->nedges; i++)
        if (g->edges[i].from == from && g->edges[i].to == to)
            return;
    if (g->nedges >= WEB_GRAPH_MAX_EDGES) {
        g->truncated = true;
        return;
    }
    web_edge_t *e = &g->edges[g->nedges++];
    e->from = from;
    e->to = to;
    snprintf(e->label, sizeof e->label, "%s", label);
}

/* Adds a checkpoint with the run that wrote it and what was served from it. */
static int add_ckpt(state_t *st, web_graph_t *g, const state_checkpoint_t *c)
{
    int ci = node(g, WEB_NODE_CKPT, c->id, 1);
    if (ci < 0)
        return -1;
    web_node_t *n = &g->nodes[ci];
    snprintf(n->title, sizeof n->title, "%s", c->uid ? c->uid : "?");
    snprintf(n->detail, sizeof n->detail, "%s, step %lld, %lld keys", c->kind ? c->kind : "?",
             (long long)c->step, (long long)c->keys);
    snprintf(n->href, sizeof n->href, "/lineage/checkpoint/%lld", (long long)c->id);
    if (c->run_id > 0) {
        int ri = node(g, WEB_NODE_RUN, c->run_id, 0);
        if (ri >= 0) {
            web_node_t *rn = &g->nodes[ri];
            state_run_t run;
            snprintf(rn->title, sizeof rn->title, "run %lld", (long long)c->run_id);
            if (state_run_get(st, c->run_id, &run) == 0) {
                snprintf(rn->detail, sizeof rn->detail, "%s, %s", run.job_name,
                         state_run_state_name(run.state));
                state_run_fini(&run);
            }
            snprintf(rn->href, sizeof rn->href, "/runs/%lld", (long long)c->run_id);
            edge(g, ri, ci, "wrote");
        }
    }
    state_served_t *sv = NULL;
    size_t ns = 0;
    KILN_CHECK(state_lineage_served(st, c->id, &sv, &ns));
    for (size_t i = 0; i < ns; i++) {
        int ei = node(g, WEB_NODE_EXPORT, sv[i].export_id, 2);
        if (ei < 0)
            break;
        web_node_t *en = &g->nodes[ei];
        snprintf(en->title, sizeof en->title, "export %lld", (long long)sv[i].export_id);
        snprintf(en->detail, sizeof en->detail, "%s", sv[i].format ? sv[i].format : "");
        edge(g, ci, ei, "exported");
        if (sv[i].push_id <= 0)
            continue;
        int pi = node(g, WEB_NODE_ENDPOINT, sv[i].endpoint_id, 3);
        if (pi < 0)
            break;
        web_node_t *pn = &g->nodes[pi];
        snprintf(pn->title, sizeof pn->title, "%s%s%s", sv[i].label ? "[" : "",
                 sv[i].label ? sv[i].label : "", sv[i].label ? "] " : "");
        size_t tl = strlen(pn->title);
        snprintf(pn->title + tl, sizeof pn->title - tl, "%s", sv[i].url ? sv[i].url : "");
        snprintf(pn->detail, sizeof pn->detail, "model %s", sv[i].model ? sv[i].model : "");
        snprintf(pn->href, sizeof pn->href, "/lineage/endpoint/%lld",
                 (long long)sv[i].endpoint_id);
        edge(g, ei, pi,
             sv[i].holding ? "holds" : (sv[i].push_state ? sv[i].push_state : "pushed"));
    }
    state_served_free(sv, ns);
    return ci;
}

#define WEB_CHAIN_MAX 32
#define WEB_CHILDREN_MAX 16

int web_graph_checkpoint(state_t *st, int64_t checkpoint_id, web_graph_t *g)
{
    int rc = 0;
    memset(g, 0, sizeof *g);
    state_checkpoint_t chain[WEB_CHAIN_MAX];
    int nchain = 0;
    int64_t id = checkpoint_id;
    /* Walk the base chain up (newest first), then draw it oldest first. */
    while (id > 0 && nchain < WEB_CHAIN_MAX) {
        rc = state_checkpoint_get_by_id(st, id, &chain[nchain]);
        if (rc == KILN_ENOENT && nchain > 0) {
            rc = 0;
            break;
        }
        if (rc < 0) {
            if (rc == KILN_ENOENT)
                kiln_errf(KILN_ENOENT, "no checkpoint with id %lld", (long long)checkpoint_id);
            goto out;
        }
        id = chain[nchain].parent_id;
        nchain++;
    }
    if (id > 0)
        g->truncated = true;
    int prev = -1;
    for (int i = nchain - 1; i >= 0; i--) {
        int ci = add_ckpt(st, g, &chain[i]);
        if (ci < 0)
            break;
        if (i == 0)
            g->nodes[ci].focus = true;
        edge(g, prev, ci, "base of");
        prev = ci;
    }
    state_checkpoint_t *kids = NULL;
    size_t nk = 0;
    KILN_CHECK_GOTO(state_checkpoint_children(st, checkpoint_id, WEB_CHILDREN_MAX + 1, &kids, &nk),
                    rc, out);
    if (nk > WEB_CHILDREN_MAX)
        g->truncated = true;
    for (size_t i = 0; i < nk && i < WEB_CHILDREN_MAX; i++) {
        int ki = add_ckpt(st, g, &kids[i]);
        edge(g, prev, ki, "base of");
    }
    state_checkpoints_free(kids, nk);
    rc = 0;
out:
    for (int i = 0; i < nchain; i++)
        state_checkpoint_fini(&chain[i]);
    return rc;
}

int web_graph_endpoint(state_t *st, int64_t endpoint_id, web_graph_t *g)
{
    state_endpoint_info_t *es = NULL;
    size_t n = 0;
    int rc;
    memset(g, 0, sizeof *g);
    KILN_CHECK(state_endpoint_list(st, &es, &n));
    const state_endpoint_info_t *e = NULL;
    for (size_t i = 0; i < n; i++)
        if (es[i].id == endpoint_id)
            e = &es[i];
    if (e == NULL) {
        rc = kiln_errf(KILN_ENOENT, "no endpoint with id %lld", (long long)endpoint_id);
        goto out;
    }
    if (e->checkpoint_id > 0)
        KILN_CHECK_GOTO(web_graph_checkpoint(st, e->checkpoint_id, g), rc, out);
    for (int i = 0; i < g->nnodes; i++)
        g->nodes[i].focus = false;
    int pi = node(g, WEB_NODE_ENDPOINT, endpoint_id, 3);
    if (pi >= 0) {
        web_node_t *pn = &g->nodes[pi];
        pn->focus = true;
        snprintf(pn->title, sizeof pn->title, "%s%s%s%s", e->label ? "[" : "",
                 e->label ? e->label : "", e->label ? "] " : "", e->url);
        snprintf(pn->detail, sizeof pn->detail, "model %s", e->model ? e->model : "");
        snprintf(pn->href, sizeof pn->href, "/lineage/endpoint/%lld", (long long)endpoint_id);
    }
    rc = 0;
out:
    state_endpoint_infos_free(es, n);
    return rc;
}

static const char *const node_kinds[] = {
    [WEB_NODE_RUN] = "run", [WEB_NODE_CKPT] = "checkpoint", [WEB_NODE_EXPORT] = "export",
    [WEB_NODE_ENDPOINT] = "endpoint"};

json_t *web_graph_json(const web_graph_t *g)
{
    json_t *nodes = json_array(), *edges = json_array();
    for (int i = 0; i < g->nnodes; i++) {
        const web_node_t *n = &g->nodes[i];
        json_array_append_new(nodes, json_pack("{s:s, s:I, s:s, s:s, s:b}", "kind",
                                               node_kinds[n->kind], "id", (json_int_t)n->id,
                                               "title", n->title, "detail", n->detail, "focus",
                                               n->focus));
    }
    for (int i = 0; i < g->nedges; i++) {
        const web_edge_t *e = &g->edges[i];
        const web_node_t *a = &g->nodes[e->from], *b = &g->nodes[e->to];
        json_array_append_new(
            edges, json_pack("{s:{s:s, s:I}, s:{s:s, s:I}, s:s}", "from", "kind",
                             node_kinds[a->kind], "id", (json_int_t)a->id, "to", "kind",
                             node_kinds[b->kind], "id", (json_int_t)b->id, "label", e->label));
    }
    return json_pack("{s:o, s:o, s:b}", "nodes", nodes, "edges", edges, "truncated",
                     g->truncated);
}
