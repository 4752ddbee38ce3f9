/*
 * web/web_int.h - what the files of web/ share and nothing outside includes:
 * the output buffer with the one HTML-escaping function, the request that a
 * route handler fills, the handlers of the route table (web.c walks it), and
 * the data helpers that the HTML pages and the JSON API both read from, so
 * the two always show the same thing.
 */
#ifndef KILN_WEB_WEB_INT_H
#define KILN_WEB_WEB_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"
#include "ops.h"
#include "state.h"
#include "web.h"

/* ---- output buffer (web_buf.c) ------------------------------------------------------
 * A growing byte buffer. After an allocation failure it stops growing and
 * remembers it (oom); the request then answers 500. */
typedef struct web_buf {
    char *p;
    size_t len, cap;
    bool oom;
} web_buf_t;

void web_buf_put(web_buf_t *b, const char *s, size_t n);
void web_buf_puts(web_buf_t *b, const char *s);
void web_buf_printf(web_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* THE escaping function: every value that is not a number or a literal of the
 * page goes through it on its way into HTML or SVG (text and attributes).
 * Escapes & < > " ' and drops control characters but \n and \t. NULL writes
 * nothing. */
void web_esc(web_buf_t *b, const char *s);
void web_buf_free(web_buf_t *b);

/* Percent-decodes src[0..n) into a new string ('+' is a space). NULL on ENOMEM. */
char *web_url_decode(const char *src, size_t n);
/* Finds key in an application/x-www-form-urlencoded body; a malloc'd decoded
 * value or NULL when absent. */
char *web_form_value(const char *body, size_t len, const char *key);

/* ---- requests and routes (web.c) --------------------------------------------------- */
typedef enum { WEB_HTML, WEB_JSON, WEB_TEXT, WEB_SVG, WEB_FORM } web_kind_t;

typedef struct web_online web_online_t; /* web_online.c */

typedef struct web_req {
    web_t *w;
    web_online_t *online;    /* the server's kept online figures (web_online.c) */
    state_t *st;             /* a pooled connection, this request's alone */
    void *conn;              /* the MHD connection (web.c, web_req.c) */
    web_kind_t kind;         /* of the route */
    int64_t id;              /* the number in the path, for routes with one */
    const char *body;        /* POST body (NUL-terminated), NULL for GET */
    size_t body_len;
    /* the answer */
    int status;              /* 200 unless set */
    web_buf_t out;
    char *location;          /* for 303 redirects (malloc'd) */
    const char *content_type; /* NULL: by kind */
    int refresh_s;            /* how often pages of running runs refresh */
} web_req_t;

typedef int (*web_handler_t)(web_req_t *r);

/* web_req.c: a query-string argument, or NULL. */
const char *web_arg(web_req_t *r, const char *name);
/* A query argument as a positive integer; def when absent, KILN_EINVAL when
 * malformed (message names it). */
int web_arg_i64(web_req_t *r, const char *name, int64_t def, int64_t lo, int64_t hi,
                int64_t *out /* OUT */);
/* The outcome rc of a read of or an action on the run the request names
 * (r->id), with KILN_ENOENT said as "no run N" for the 404. */
int web_run_rc(const web_req_t *r, int rc);
/* The run the request names into *run (state_run_fini), or KILN_ENOENT
 * "no run N". */
int web_req_run(web_req_t *r, state_run_t *run /* OUT */);
/* Writes a JSON document as the answer (takes the reference). */
int web_json_reply(web_req_t *r, json_t *doc);

/* ---- HTML pages (web_pages.c) ------------------------------------------------------ */
int web_page_jobs(web_req_t *r);
int web_page_job(web_req_t *r);
int web_page_runs(web_req_t *r);
int web_page_run(web_req_t *r);
int web_page_endpoints(web_req_t *r);
int web_page_lineage_ckpt(web_req_t *r);
int web_page_lineage_endpoint(web_req_t *r);
int web_svg_loss(web_req_t *r);
/* The page skeleton around an error, for the dispatcher. */
void web_page_error(web_req_t *r, int status, const char *msg);

/* ---- JSON API and actions (web_api.c) ---------------------------------------------- */
int web_api_jobs(web_req_t *r);
int web_api_runs(web_req_t *r);
int web_api_run(web_req_t *r);
int web_api_log(web_req_t *r);
int web_api_endpoints(web_req_t *r);
int web_api_lineage_ckpt(web_req_t *r);
int web_api_lineage_endpoint(web_req_t *r);
int web_act_cancel(web_req_t *r);
int web_act_retry(web_req_t *r);
int web_act_submit(web_req_t *r);
/* POST /jobs/#/pause|resume|delete (forms) and /api/jobs/#/... (JSON). */
int web_act_pause(web_req_t *r);
int web_act_resume(web_req_t *r);
int web_act_delete(web_req_t *r);
int web_act_split(web_req_t *r);

/* ---- /metrics (web_metrics.c) ------------------------------------------------------ */
int web_metrics(web_req_t *r);

/* ---- the online figures /metrics shows (web_online.c) ------------------------------
 * Read by a thread of their own and kept, so that a scrape waits at most
 * WEB_ONLINE_WAIT_MS on the kiln-serves. */
#define WEB_ONLINE_TTL_MS 5000 /* a kept reading older than this is read again */
#define WEB_ONLINE_WAIT_MS 300 /* what a scrape waits for a new reading */
int web_online_create(web_online_t **out /* OUT */);
/* Stops the reader (waiting out a read in flight, at most its timeout). NULL is fine. */
void web_online_destroy(web_online_t *o);
/* The figures of es (n) as kept, in a malloc'd array (n; free()), each
 * with its age in age_ms (n, the caller's; -1: never read); asks for a new
 * reading when one is old or missing and waits WEB_ONLINE_WAIT_MS for it.
 * NULL when out of memory. */
ops_online_t *web_online_get(web_online_t *o, const state_endpoint_info_t *es, size_t n,
                             int64_t *age_ms /* OUT */);

/* ---- data shared by pages and API (web_data.c) ------------------------------------- */
#define WEB_PAGE_DEFAULT 50

/* The figures of a run that come from its metrics or, when the trainer wrote
 * no metric rows, from RUN_DIR/result.json. NAN when unknown. */
typedef struct web_run_figures {
    double samples_per_s, eval_logloss, eval_auc;
} web_run_figures_t;
void web_run_figures(state_t *st, const state_run_t *run, web_run_figures_t *out /* OUT */);
/* Duration in seconds (to now for a running run); -1 when not started. */
int64_t web_run_duration(const state_run_t *run);

/* The loss curve: metric rows named "loss", else RUN_DIR/progress.jsonl.
 * Thinned to at most WEB_PLOT_POINTS points (evenly by index, last kept).
 * Free *steps and *loss with free(). */
#define WEB_PLOT_POINTS 300
int web_loss_series(state_t *st, const state_run_t *run, double **steps /* OUT */,
                    double **loss /* OUT */, size_t *n /* OUT */);

/* The last bytes (at most max) of RUN_DIR/log starting at a line, malloc'd;
 * NULL when there is no log. */
char *web_log_tail(const state_run_t *run, size_t max);

/* The job's next cron fire after now, 0 when none (one-off or bad spec). */
int64_t web_next_fire(const state_job_t *job, int64_t now);

/* ---- lineage graphs (web_data.c builds, web_svg.c draws) --------------------------- */
typedef enum { WEB_NODE_RUN, WEB_NODE_CKPT, WEB_NODE_EXPORT, WEB_NODE_ENDPOINT } web_node_kind_t;
typedef struct web_node {
    web_node_kind_t kind;
    int64_t id;
    char title[96];  /* "run 12", "ckpt c-0003 (full)" */
    char detail[96]; /* second line */
    char href[64];   /* "" for none */
    bool focus;      /* the node the graph is about */
    int col, row;
} web_node_t;
typedef struct web_edge {
    int from, to;    /* node indices */
    char label[24];  /* "wrote", "base", "pushed", "holds", "failed" */
} web_edge_t;
#define WEB_GRAPH_MAX_NODES 128
#define WEB_GRAPH_MAX_EDGES 256
typedef struct web_graph {
    web_node_t nodes[WEB_GRAPH_MAX_NODES];
    web_edge_t edges[WEB_GRAPH_MAX_EDGES];
    int nnodes, nedges;
    bool truncated; /* hit a limit: more exists than is drawn */
} web_graph_t;
/* The lineage of a checkpoint: its base chain, the checkpoints built on it,
 * the runs that wrote them, their exports and the endpoints pushed to.
 * KILN_ENOENT when there is no such checkpoint. */
int web_graph_checkpoint(state_t *st, int64_t checkpoint_id, web_graph_t *g /* OUT */);
/* The lineage of what an endpoint holds now, with the endpoint as focus. */
int web_graph_endpoint(state_t *st, int64_t endpoint_id, web_graph_t *g /* OUT */);
/* Draws g as an SVG element (id attribute svg_id). */
void web_svg_graph(web_buf_t *b, const web_graph_t *g, const char *svg_id);
/* Draws a line plot of y over x (n points) as an SVG element. */
void web_svg_plot(web_buf_t *b, const double *x, const double *y, size_t n, const char *svg_id,
                  const char *x_label, const char *y_label);
json_t *web_graph_json(const web_graph_t *g);

#endif /* KILN_WEB_WEB_INT_H */
