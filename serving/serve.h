/*
 * serving/serve.h - Kiln's serving side: the push wire format (a stream of
 * checksummed chunks, docs/serving-protocol.md), update sources (what a push
 * sends: a model description, embedding rows, deleted keys and the dense
 * weights of one checkpoint, full or as a delta on a base), the push client
 * (libcurl multi: every endpoint of a label in parallel, retries, fallback to
 * a full push on 409), and a reader of an endpoint's stats. What to push
 * where, and the records of it, are the use cases of ops/ (ops.h).
 * kiln-serve (serve_main.c, serve_http.c and the store, serve_store.c and its
 * siblings) is the program that receives pushes; its internals are in
 * serve_int.h.
 *
 * The wire format is little endian; a chunk is
 *   [type u32][len u32][payload: len bytes][xxh64(payload, seed 0) u64]
 * and a push is HEADER, then any number of ROWS / DELETE chunks in the order
 * they are to be applied, at most one DENSE, and END with the totals.
 */
#ifndef KILN_SERVING_SERVE_H
#define KILN_SERVING_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- wire format -------------------------------------------------------------- */

#define SERVE_WIRE_MAGIC 0x3153504bu /* "KPS1" read as little-endian bytes */
#define SERVE_WIRE_VERSION 1u
#define SERVE_NAME_MAX 64
#define SERVE_UID_MAX 64
#define SERVE_MAX_TABLES 256
#define SERVE_MAX_SLOTS 1024
#define SERVE_MAX_LAYERS 16
#define SERVE_MAX_DIM 4096
/* The largest chunk payload a decoder accepts unless told otherwise. */
#define SERVE_MAX_CHUNK (64u << 20)
/* Rows per ROWS chunk an encoder writes unless told otherwise. */
#define SERVE_ROWS_PER_CHUNK 8192

typedef enum {
    SERVE_CHUNK_HEADER = 1,
    SERVE_CHUNK_ROWS = 2,
    SERVE_CHUNK_DELETE = 3,
    SERVE_CHUNK_DENSE = 4,
    SERVE_CHUNK_END = 5,
} serve_chunk_type_t;

/* One embedding table of a model. */
typedef struct serve_table_desc {
    char name[SERVE_NAME_MAX];
    int dim; /* floats per row, 1..SERVE_MAX_DIM */
} serve_table_desc_t;

/* What kiln-serve needs to rebuild the trainer's forward path: the dense
 * model's shape (model_config_t without the optimizer and seed), the
 * tables, and which table and combiner each categorical slot uses. */
typedef struct serve_model_desc {
    int model_type;       /* model_type_t: 0 lr, 1 fm, 2 dlrm */
    int nslots, ndense;   /* S, F */
    int dim;              /* the pooled width d */
    int fm_dense_factors; /* fm: X projected to the factors (model.fm_dense_factors) */
    int nbottom, bottom[SERVE_MAX_LAYERS];
    int ntop, top[SERVE_MAX_LAYERS];
    int ntables;
    serve_table_desc_t tables[SERVE_MAX_TABLES];
    int slot_table[SERVE_MAX_SLOTS];         /* (nslots) table of each slot */
    unsigned char slot_mean[SERVE_MAX_SLOTS]; /* (nslots) 1: mean combiner, 0: sum */
    int64_t nparams; /* dense parameter count (the DENSE chunk's length) */
} serve_model_desc_t;

/* The rule for model names and labels, the same at submit (jobs/spec.c) and
 * in kiln-serve (which makes them directory names): 1 to 63 characters of
 * [A-Za-z0-9_.-], not starting with '.'. Returns 0, or KILN_EINVAL with a
 * sentence saying what is wrong written to why (cap bytes; why may be NULL).
 * Leaves kiln_errmsg() alone. In library kiln_serve_name, which needs only
 * the C library. */
int serve_name_check(const char *name, char *why /* OUT */, size_t cap);

/* Checks a description for internal consistency (ranges, slot -> table,
 * every table dim == dim). Returns 0 or KILN_EINVAL naming the field. */
int serve_desc_check(const serve_model_desc_t *d);

/* What the END chunk promises: counts over the whole push. */
typedef struct serve_totals {
    uint64_t rows;    /* rows in all ROWS chunks */
    uint64_t deletes; /* keys in all DELETE chunks */
    uint64_t dense;   /* floats in the DENSE chunk (0: none) */
    uint64_t chunks;  /* chunks before END (HEADER included) */
} serve_totals_t;

/* ---- update sources ----------------------------------------------------------------
 * A source yields one push's content item by item. Items are borrowed: valid
 * until the next call of next() or destroy(). A source is read once, from
 * the start; a retry opens a new one. */
typedef enum { SERVE_ITEM_ROWS = 0, SERVE_ITEM_DELETE = 1, SERVE_ITEM_DENSE = 2 } serve_item_kind_t;

typedef struct serve_item {
    serve_item_kind_t kind;
    int table;            /* ROWS, DELETE: index into desc->tables */
    int64_t n;            /* rows, keys, or dense floats */
    const int64_t *keys;  /* (n) ROWS, DELETE */
    const float *values;  /* ROWS: (n, dim); DENSE: (n) */
} serve_item_t;

typedef struct serve_source serve_source_t;
typedef struct serve_source_ops {
    /* Returns 1 with *item set, 0 at the end, or a negative KILN_E* code. */
    int (*next)(serve_source_t *s, serve_item_t *item /* OUT */);
    void (*destroy)(serve_source_t *s);
} serve_source_ops_t;

struct serve_source {
    const serve_source_ops_t *ops;
    void *impl;
    const serve_model_desc_t *desc; /* owned by impl */
    char uid[SERVE_UID_MAX];        /* the checkpoint this push makes the endpoint hold */
    char base[SERVE_UID_MAX];       /* "" for a full push, else the uid it applies on */
};

/* Calls s->ops->destroy. Accepts NULL. */
void serve_source_destroy(serve_source_t *s);

/* Opens a source for an endpoint that holds `held` ("" when nothing or
 * unknown): a delta on held when the opener can build one, else a full push.
 * Returns 0 or a KILN_E* code. */
typedef int (*serve_source_open_fn)(void *ctx, const char *held,
                                     serve_source_t **out /* OUT */);

/* An in-memory source (tests, benchmarks): a description, a full state or a
 * delta built with the add functions, in order. Arrays are copied. */
typedef struct serve_memsrc serve_memsrc_t;
int serve_memsrc_create(const serve_model_desc_t *desc, const char *uid, const char *base,
                        serve_memsrc_t **out /* OUT */);
void serve_memsrc_destroy(serve_memsrc_t *m); /* accepts NULL */
int serve_memsrc_add_rows(serve_memsrc_t *m, int table, int64_t n, const int64_t *keys,
                          const float *values /* (n, dim) */);
int serve_memsrc_add_deletes(serve_memsrc_t *m, int table, int64_t n, const int64_t *keys);
int serve_memsrc_set_dense(serve_memsrc_t *m, int64_t n, const float *values);
/* A source reading m (borrowed: m must outlive it). */
int serve_memsrc_open(serve_memsrc_t *m, serve_source_t **out /* OUT */);

/* A source over a checkpoint directory (docs/checkpoint-format.md) and the
 * job spec's model description (its nparams is taken from the checkpoint's
 * dense.params; kiln-serve checks it against the layers). held in the
 * checkpoint's chain: a delta of
 * the links after held; otherwise a full push of the whole chain (its full
 * dump, then each incremental's deletions and rows in order). Reads the
 * .npy files chunk by chunk; never the whole table. Returns 0, KILN_ENOENT,
 * KILN_ECORRUPT (manifest or file named) or KILN_ENOMEM. */
int serve_ckptsrc_open(const char *ckpt_dir, const serve_model_desc_t *desc, const char *held,
                       serve_source_t **out /* OUT */);
/* serve_ckptsrc_open as a target's opener (serve_target_t.open, with a
 * serve_ckptsrc_at_t as open_ctx): the checkpoint to push and its model. */
typedef struct serve_ckptsrc_at {
    const char *ckpt_dir;
    const serve_model_desc_t *desc;
} serve_ckptsrc_at_t;
int serve_ckptsrc_opener(void *ctx /* serve_ckptsrc_at_t */, const char *held,
                         serve_source_t **out /* OUT */);

/* ---- encoder: source -> bytes ------------------------------------------------------- */
typedef struct serve_enc serve_enc_t;
/* Takes ownership of src. rows_per_chunk 0: SERVE_ROWS_PER_CHUNK. */
int serve_enc_create(serve_source_t *src, int64_t rows_per_chunk, serve_enc_t **out /* OUT */);
void serve_enc_destroy(serve_enc_t *e); /* accepts NULL; destroys the source */
/* Copies up to cap bytes of the stream into buf; *n == 0 at the end.
 * Returns 0 or the source's error. */
int serve_enc_read(serve_enc_t *e, void *buf, size_t cap, size_t *n /* OUT */);
/* Bytes produced so far. */
uint64_t serve_enc_bytes(const serve_enc_t *e);
const serve_source_t *serve_enc_source(const serve_enc_t *e);

/* ---- decoder: bytes -> callbacks ---------------------------------------------------
 * Fed arbitrary pieces of a stream; buffers at most one chunk; checks each
 * checksum, each chunk's structure against the header, the order of
 * chunks and the END totals. A callback returning < 0 stops decoding with
 * that code. The callbacks are optional (NULL: ignored). */
typedef struct serve_dec_cb {
    int (*header)(void *ctx, const serve_model_desc_t *desc, const char *uid, const char *base);
    int (*rows)(void *ctx, int table, int64_t n, const int64_t *keys, const float *values);
    int (*deletes)(void *ctx, int table, int64_t n, const int64_t *keys);
    int (*dense)(void *ctx, int64_t n, const float *values);
    int (*end)(void *ctx, const serve_totals_t *totals);
} serve_dec_cb_t;

typedef struct serve_dec serve_dec_t;
/* max_chunk 0: SERVE_MAX_CHUNK. */
int serve_dec_create(const serve_dec_cb_t *cb, void *ctx, size_t max_chunk,
                     serve_dec_t **out /* OUT */);
void serve_dec_destroy(serve_dec_t *d); /* accepts NULL */
/* Returns 0, KILN_ECORRUPT (message says which chunk and what), KILN_ECHECKSUM,
 * KILN_ERANGE (a chunk over max_chunk), KILN_ENOMEM or a callback's code.
 * After an error every further call returns the same code. */
int serve_dec_feed(serve_dec_t *d, const void *data, size_t len);
/* The stream ended: KILN_ECORRUPT unless it ended right after END. */
int serve_dec_finish(serve_dec_t *d);
/* The header (NULL before it arrived) and the totals counted so far. */
const serve_model_desc_t *serve_dec_desc(const serve_dec_t *d);
const serve_totals_t *serve_dec_counted(const serve_dec_t *d);

/* ---- push client ------------------------------------------------------------------- */
typedef struct serve_push_opts serve_push_opts_t;

typedef struct serve_target {
    const char *url;   /* http://host:port of a kiln-serve */
    const char *model;
    const char *label;
    const char *held;  /* what the endpoint holds per our records ("" or NULL: unknown) */
    serve_source_open_fn open;
    void *open_ctx;
    const serve_push_opts_t *opts; /* this target's token, retries, ...; NULL: the call's */
} serve_target_t;

struct serve_push_opts {
    const char *token;     /* bearer token; NULL: none */
    int retries;           /* further attempts after the first (5xx, network) */
    int64_t timeout_ms;    /* per attempt; 0: none */
    int64_t backoff_ms;    /* first retry delay (default 200), doubled each retry, +-50% jitter */
    int64_t max_backoff_ms;/* cap (default 10 s) */
    const char *idem_nonce;/* mixed into idempotency keys (default: time and pid); the same
                              nonce, endpoint, uid and base give the same key, so a push
                              re-sent after a crash is applied at most once */
    int traffic;           /* Kiln-Traffic: the predict traffic weight the label gets when
                              this push is its first on the endpoint; 0: none (the spec's
                              push.endpoints[].traffic) */
};

typedef struct serve_push_result {
    bool ok;
    int http_status;   /* of the last attempt; 0: no response */
    int attempts;
    bool full;         /* the push that succeeded (or the last one) was full */
    char uid[SERVE_UID_MAX];  /* what the endpoint holds after an ok push */
    char base[SERVE_UID_MAX]; /* the base of the last attempt ("" full) */
    uint64_t bytes;    /* body bytes of the last attempt */
    int64_t duration_ms;
    char error[512];   /* "http://...: HTTP 503: ..." when !ok */
} serve_push_result_t;

/* Pushes to every target in parallel (one libcurl multi handle): each gets
 * a delta on what it holds (or a full push), retried with exponential
 * backoff and jitter on network errors and 5xx, re-sent in full once on 409.
 * results is (n). Returns 0 when every push succeeded, else KILN_EHTTP with
 * the first failure's error as the message (results say which). */
int serve_push(const serve_target_t *targets, int n, const serve_push_opts_t *opts,
               serve_push_result_t *results /* OUT (n) */);

/* ---- endpoint stats ------------------------------------------------------------------ */
/* What an endpoint's GET /v1/stats says about one (model, label). */
typedef struct serve_label_stats {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    int64_t predict_requests, predict_rows;
} serve_label_stats_t;
/* Reads url's /v1/stats (one request, timeout_ms) into *out (malloc'd, *n
 * labels; free()). Returns 0, KILN_EHTTP (message names the URL and the
 * status or network error) or KILN_ENOMEM. */
int serve_stats_fetch(const char *url, int64_t timeout_ms, serve_label_stats_t **out /* OUT */,
                      size_t *n /* OUT */);

/* ---- online A/B metrics ------------------------------------------------------------- */
/* What an endpoint's GET /v1/models/M/online says about one label, over the
 * rows joined so far (docs/serving-protocol.md, "Online A/B metrics"). */
typedef struct serve_online_label {
    char label[SERVE_NAME_MAX];
    int64_t impressions, positives;
    double ctr, logloss, auc, calibration; /* NAN: not defined yet (no rows, no positives) */
    double logloss_var; /* the sample variance of the per-row loss; NAN: under 2 rows */
} serve_online_label_t;
/* Reads url's /v1/models/model/online (one request, timeout_ms) into *out
 * (malloc'd, *n labels sorted by name; free()). Returns 0, KILN_ENOENT (404:
 * the kiln-serve logs no impressions), KILN_EHTTP (message names the URL and
 * the status or network error) or KILN_ENOMEM. */
int serve_online_fetch(const char *url, const char *model, int64_t timeout_ms,
                       serve_online_label_t **out /* OUT */, size_t *n /* OUT */);
/* The difference of two labels' mean online loglosses (ll - base_ll) and its
 * 95% interval, diff +- 1.96 sqrt(var/n + base_var/base_n) (the labels'
 * rows are independent: a request key sticks to one label); the interval
 * is NAN when a side has fewer than 2 rows (var NAN). The one formula kiln-serve's
 * comparisons and `kiln promote` (push.promote_when) use. */
void serve_logloss_diff(double ll, double var, int64_t n, double base_ll, double base_var,
                        int64_t base_n, double *diff /* OUT */, double *lo /* OUT */,
                        double *hi /* OUT */);

/* ---- traffic split ---------------------------------------------------------------- */
/* What an endpoint's /v1/models/M/split answered. */
typedef struct serve_split_result {
    int http_status;  /* 0: no response */
    char split[1200]; /* the split in force after the call ("A=90,B=10"; "": none) */
    char source[16];  /* "api", "--split" or "none" */
    char no_traffic[1200]; /* labels held there without traffic, comma-separated */
    char error[512];  /* "http://...: HTTP 400: ..." when the call failed */
} serve_split_result_t;
/* Sets model's traffic split on url (split "A=90,B=10" with token: PUT) or
 * reads it (split NULL: GET), in one request of at most timeout_ms.
 * Returns 0, KILN_EINVAL (the endpoint refused the split: 400), KILN_EHTTP
 * (out->error names the URL and the status or network error) or
 * KILN_ENOMEM. */
int serve_split_call(const char *url, const char *token, const char *model, const char *split,
                     int64_t timeout_ms, serve_split_result_t *out /* OUT */);

#ifdef __cplusplus
}
#endif

#endif /* KILN_SERVING_SERVE_H */
