/*
 * serving/serve_int.h - what kiln-serve's files share and nothing outside
 * serving/ includes: the key -> row table, the version store (versions in
 * memory and on disk, push sessions, idempotency, queries), which answers
 * with Kiln error codes and typed results, and the HTTP front (serve_answer.c
 * turns those into statuses and bodies, serve_http.c routes and serves).
 */
#ifndef KILN_SERVING_SERVE_INT_H
#define KILN_SERVING_SERVE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "serve.h"

/* ---- serve_table.c: int64 key -> float row (dim), open addressing ------------- */
typedef struct serve_table serve_table_t;
int serve_table_create(int dim, serve_table_t **out /* OUT */);
void serve_table_destroy(serve_table_t *t); /* accepts NULL */
/* Makes room for `extra` more keys so that the next upserts of at most that
 * many new keys cannot fail. Returns 0 or KILN_ENOMEM. */
int serve_table_reserve(serve_table_t *t, int64_t extra);
/* Tables created from now on keep at most table_bytes of rows (and index)
 * in RAM and the rest in a disk tier in a file under dir (kiln-serve
 * --table-memory; 0: every row in RAM). Call before any table exists. */
void serve_table_spill(int64_t table_bytes, const char *dir);
/* Sets each key's row (inserting missing keys). Returns 0, KILN_ENOMEM, or
 * with a disk tier KILN_EIO / KILN_ENOSPC (the message names the file). */
int serve_table_upsert(serve_table_t *t, int64_t n, const int64_t *keys,
                       const float *values /* (n, dim) */);
/* Removes keys (missing ones are ignored). Returns 0, or with a disk tier
 * KILN_ENOMEM or KILN_EIO. */
int serve_table_remove(serve_table_t *t, int64_t n, const int64_t *keys);
/* The rows of keys[n] into out (n, dim), found[i] 1 for each key held (the
 * rows of the others are left as they were), from RAM or the disk tier.
 * Safe in parallel with other lookups. Returns 0, KILN_ENOMEM or KILN_EIO. */
int serve_table_lookup(serve_table_t *t, int64_t n, const int64_t *keys, float *out,
                       uint8_t *found /* OUT (n) */);
/* Copies up to cap live rows (cap >= 1024), starting at *pos (0 at first),
 * into keys (cap) and values (cap, dim); *n how many, 0 at the end, and
 * advances *pos. RAM's rows in slot order, then the disk tier's. Returns 0,
 * KILN_ENOMEM or KILN_EIO. */
int serve_table_rows(serve_table_t *t, size_t *pos, int64_t cap, int64_t *keys, float *values,
                     int64_t *n /* OUT */);
/* Rows held, in RAM and on disk; and in RAM alone. */
int64_t serve_table_size(const serve_table_t *t);
int64_t serve_table_ram_rows(const serve_table_t *t);
int serve_table_dim(const serve_table_t *t);

/* ---- the version store: serve_store.c, serve_chain.c, serve_recv.c, serve_query.c ----
 * The store answers in Kiln's terms: 0 and a typed result, or a negative
 * KILN_E* code with a sentence for a person (kiln_errmsg). serve_answer.c
 * turns both into an HTTP status and a body. */
typedef struct sv_store sv_store_t;

/* Opens (creating) state_dir, takes its lock (<state_dir>/lock, held until
 * sv_store_close; the file holds the holder's pid) and loads every version
 * persisted there (replaying each version's chain of pushes). A version that
 * cannot be loaded (a corrupt push file or chain.json) is not served and is
 * reported as broken (log, sv_stats_get) with its files left in place; a full
 * push to its label moves them to <state_dir>/broken/ and replaces it.
 * Returns 0, KILN_EBUSY (another process holds the lock: the message names
 * its pid), KILN_EIO or KILN_ENOMEM. */
int sv_store_open(const char *state_dir, sv_store_t **out /* OUT */);
void sv_store_close(sv_store_t *s); /* accepts NULL */

/* What an applied push answers (and a repeat of its Idempotency-Key again). */
typedef struct sv_pushed {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    char uid[SERVE_UID_MAX];  /* the checkpoint the version holds now */
    char base[SERVE_UID_MAX]; /* "none" for a full push */
    int64_t rows, applied_at; /* the version's rows; unix ms */
    uint64_t bytes;           /* of the push's body */
    bool full;
    char holds[SERVE_UID_MAX]; /* after KILN_ECONFLICT: what the version holds ("": nothing) */
} sv_pushed_t;

/* A push being received. */
typedef struct sv_push sv_push_t;

/* Starts a push of model/label with the request's headers (base "none" for
 * a full push, NULL idem: none). Returns 0 with *out a session; 1 when a
 * push with this idempotency key was applied already (*ans its answer);
 * KILN_EUSAGE (a bad name or header), KILN_ECONFLICT (a delta whose base is
 * not what the version holds: ans->holds), KILN_ENOMEM or KILN_EIO (the
 * push cannot be staged). */
int sv_push_begin(sv_store_t *s, const char *model, const char *label, const char *uid,
                  const char *base, const char *idem, sv_pushed_t *ans /* OUT */,
                  sv_push_t **out /* OUT */);
/* The predict traffic weight (1..SV_MAX_WEIGHT) model/label gets if this
 * push creates the label (the Kiln-Traffic header; the job spec's
 * push.endpoints[].traffic): it joins the model's split with that weight. */
void sv_push_set_traffic(sv_push_t *p, int weight);
/* Streams body bytes to the staging file and the checking decoder. A
 * failure is remembered and returned by sv_push_end. */
void sv_push_feed(sv_push_t *p, const void *data, size_t len);
/* The body ended: verifies it, persists and swaps in the new version; frees
 * p. Returns 0 with *ans filled (also when the same push finished on another
 * connection meanwhile), or the body's fault: KILN_ECORRUPT, KILN_ECHECKSUM,
 * KILN_EVERSION, KILN_ERANGE (a chunk too large), KILN_EINVAL (a model that
 * cannot be built, or a delta for another model), KILN_ECONFLICT
 * (ans->holds); or the server's: KILN_ENOMEM, KILN_EIO, KILN_ENOSPC. */
int sv_push_end(sv_push_t *p, sv_pushed_t *ans /* OUT */);
/* Drops an unfinished push (connection closed early); frees p. */
void sv_push_abort(sv_push_t *p); /* accepts NULL */

/* A version as GET /v1/models/M/versions/L shows it. */
typedef struct sv_version_info {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX], uid[SERVE_UID_MAX];
    int64_t rows, applied_at;
    const char *model_type; /* "lr", "fm", "dlrm" (static) */
    int chain;              /* push files on disk */
    int ntables;
    struct {
        char name[SERVE_NAME_MAX];
        int dim;
        int64_t rows;
    } tables[SERVE_MAX_TABLES];
    char *broken; /* after KILN_ENOENT: why the label could not be loaded (malloc'd), or NULL */
} sv_version_info_t;
/* Fills *out. Returns 0 or KILN_ENOENT (no such version, or a broken one:
 * out->broken, to be freed by the caller). */
int sv_version_get(sv_store_t *s, const char *model, const char *label,
                   sv_version_info_t *out /* OUT */);

/* Rows looked up in one table of a version. */
typedef struct sv_rows {
    char label[SERVE_NAME_MAX], uid[SERVE_UID_MAX];
    int dim;
    int64_t n;
    float *values;        /* (n, dim) */
    unsigned char *found; /* (n) 0: no such key (or none asked) */
} sv_rows_t;
/* Looks up keys (n; valid (n): 0 for a key that was not an integer and is
 * not found) in table of model's version label (NULL: its first). Returns 0
 * or KILN_ENOENT (no such model, label or table) or KILN_ENOMEM. Free
 * with sv_rows_fini. */
int sv_lookup(sv_store_t *s, const char *model, const char *label, const char *table,
              int64_t n, const int64_t *keys, const unsigned char *valid,
              sv_rows_t *out /* OUT */);
void sv_rows_fini(sv_rows_t *r);

/* One row of a predict request: a TSV line (Criteo format, the label column
 * optional), len bytes without the newline; p NULL: an element that was not
 * a string. */
typedef struct sv_line {
    const char *p;
    size_t len;
} sv_line_t;
typedef struct sv_predicted {
    char label[SERVE_NAME_MAX], uid[SERVE_UID_MAX];
    int64_t n;
    float *probs; /* (n) a probability per line, NaN or inf where the weights overflow */
    int nfields;  /* dense features + slots of the version: a line's fields besides a label */
} sv_predicted_t;
/* Predicts n lines with model's version label (NULL: chosen by the split,
 * sticky on request_key). Returns 0, KILN_ENOENT (no such version, or a
 * broken one), KILN_EINVAL (a line that does not parse: its number and
 * why), KILN_ENOMEM or the model's error. Free out->probs. */
int sv_predict(sv_store_t *s, const char *model, const char *label, const char *request_key,
               int64_t n, const sv_line_t *lines, sv_predicted_t *out /* OUT */);

/* A traffic split between labels: "A=90,B=10". */
#define SV_MAX_SPLIT 16
typedef struct sv_split {
    char label[SV_MAX_SPLIT][SERVE_NAME_MAX];
    int weight[SV_MAX_SPLIT]; /* 1..SV_MAX_WEIGHT */
    int n;
} sv_split_t;
#define SV_MAX_WEIGHT 1000000
/* Parses text: up to SV_MAX_SPLIT entries LABEL=WEIGHT separated by commas,
 * each label valid (serve_name_check) and named once, each weight a whole
 * number from 1 to SV_MAX_WEIGHT (a label without traffic is left out), or
 * 0 too with zero_ok (such a label is validated, then left out). Returns 0
 * or KILN_EINVAL with a message that starts with "--split" ("split" with
 * zero_ok, the API's form). */
int sv_split_parse(const char *text, bool zero_ok, sv_split_t *out /* OUT */);
/* Writes split as text ("A=90,B=10"; "" for no label) into buf (cap). */
void sv_split_format(const sv_split_t *split, char *buf, size_t cap);
/* Sets --split, the split of every model without one of its own (before
 * serving starts). */
void sv_store_set_split(sv_store_t *s, const sv_split_t *split);
/* Gives model a split of its own (in place of --split's) and persists it in
 * <state_dir>/splits.json before it is in force, so that a restart keeps
 * it. Returns 0, KILN_ERANGE (more than MAX_SPLITS models) or KILN_EIO. */
int sv_split_set(sv_store_t *s, const char *model, const sv_split_t *split);
/* The split in force for model, as GET /v1/models/M/split shows it. */
typedef struct sv_split_info {
    sv_split_t split;             /* n 0: no label has traffic */
    const char *source;           /* "api" (its own), "--split" or "none" (static) */
    bool held[SV_MAX_SPLIT];      /* split.label[i] holds a version here */
    char idle[SV_MAX_SPLIT][SERVE_NAME_MAX]; /* labels held that get no traffic */
    int nidle;
} sv_split_info_t;
void sv_split_get(sv_store_t *s, const char *model, sv_split_info_t *out /* OUT */);

/* A snapshot of the store's counters and versions (arrays malloc'd; free
 * with sv_stats_fini). */
typedef struct sv_stats {
    struct sv_stats_predict {
        char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
        int64_t requests, rows, nonfinite;
    } *predict;
    int npredict;
    struct sv_stats_version {
        char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX], uid[SERVE_UID_MAX];
        int64_t rows;
    } *versions;
    int nversions;
    struct sv_stats_broken {
        char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
        char *error;
    } *broken;
    int nbroken;
    int64_t pushes_applied, pushes_rejected;
} sv_stats_t;
/* Returns 0 or KILN_ENOMEM. */
int sv_stats_get(sv_store_t *s, sv_stats_t *out /* OUT */);
void sv_stats_fini(sv_stats_t *st);

/* ---- serve_answer.c: the store's results as HTTP answers ------------------------- */
/* An HTTP answer: status and a malloc'd body (JSON, but Prometheus text
 * for sv_answer_stats with prometheus). */
typedef struct sv_answer {
    int status;
    char *body;
} sv_answer_t;

/* PUT of a version, before its body: NULL with *ans filled when the push
 * is answered at once (a repeated idempotency key: its earlier answer; 409
 * on a base conflict; 400 on a bad header); else a session. */
sv_push_t *sv_answer_push_begin(sv_store_t *s, const char *model, const char *label,
                                const char *uid, const char *base, const char *idem,
                                sv_answer_t *ans /* OUT */);
/* PUT of a version, after its body: 200 with what the version holds now,
 * or the status of the failure. Frees p. */
void sv_answer_push_end(sv_push_t *p, sv_answer_t *ans /* OUT */);
/* GET of a version: 200 with its uid, rows, applied_at; 404. */
void sv_answer_version(sv_store_t *s, const char *model, const char *label,
                       sv_answer_t *ans /* OUT */);
/* POST lookup: body {"label": L?, "table": T, "keys": [...]}. */
void sv_answer_lookup(sv_store_t *s, const char *model, const char *body, size_t len,
                      sv_answer_t *ans /* OUT */);
/* POST predict: TSV lines (Criteo format, a label column first) or JSON
 * {"rows": ["tsv line", ...], "row_ids": [...]}. label NULL: chosen by the
 * split, sticky on request_key. With a loop (serve_loop_int.h; NULL: none)
 * and a request_key, each row answered is logged as an impression. */
struct sv_loop;
void sv_answer_predict(sv_store_t *s, struct sv_loop *loop, const char *model,
                       const char *label, const char *request_key, const char *body,
                       size_t len, sv_answer_t *ans /* OUT */);
/* GET (body NULL) or PUT of a model's split: PUT's body {"split": "A=90,B=10"};
 * 200 {"model", "split", "source", "labels": [{"label", "weight", "held"}],
 * "no_traffic": [label held without traffic]}; 400 a bad split, 507 when it
 * cannot be persisted. */
void sv_answer_split(sv_store_t *s, const char *model, const char *body, size_t len,
                     sv_answer_t *ans /* OUT */);
/* GET /v1/stats (JSON) and /metrics (Prometheus text). */
void sv_answer_stats(sv_store_t *s, bool prometheus, sv_answer_t *ans /* OUT */);

/* ---- serve_http.c --------------------------------------------------------------- */
typedef struct sv_http_opts {
    const char *host;   /* the IPv4 address to bind */
    int port;           /* 0: any free port (see sv_http_port) */
    const char *token;  /* NULL: refuse every push */
    int max_connections;
    int max_per_client; /* connections from one client address; 0: a quarter of
                           max_connections */
    int timeout_s;
    size_t max_body;    /* requests other than pushes */
    const char *allow_hosts; /* Host names served besides the bind address's
                                (comma-separated, "*": any; NULL: none), see
                                kiln_host_allowed */
    struct sv_loop *loop;    /* impressions, feedback, join (NULL: off) */
} sv_http_opts_t;

typedef struct sv_http sv_http_t;
int sv_http_start(sv_store_t *store, const sv_http_opts_t *o, sv_http_t **out /* OUT */);
int sv_http_port(const sv_http_t *h);
void sv_http_stop(sv_http_t *h); /* accepts NULL */

#endif /* KILN_SERVING_SERVE_INT_H */
