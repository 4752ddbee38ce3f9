/*
 * serving/serve_int.h - what kiln-serve's files share and nothing outside
 * serving/ includes: the key -> row table, the version store (versions in
 * memory and on disk, push sessions, idempotency, predict) and the HTTP
 * front (serve_http.c).
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
/* Sets each key's row (inserting missing keys). Returns 0 or KILN_ENOMEM. */
int serve_table_upsert(serve_table_t *t, int64_t n, const int64_t *keys,
                       const float *values /* (n, dim) */);
/* Removes keys (missing ones are ignored). */
void serve_table_remove(serve_table_t *t, int64_t n, const int64_t *keys);
/* The row of key, or NULL. Valid until the next change of t. */
const float *serve_table_find(const serve_table_t *t, int64_t key);
/* Copies up to cap live rows, starting at slot *pos (0 at first), into keys
 * (cap) and values (cap, dim); returns how many, 0 at the end, and advances
 * *pos. The order is the table's slot order. */
int64_t serve_table_rows(const serve_table_t *t, size_t *pos, int64_t cap, int64_t *keys,
                         float *values);
int64_t serve_table_size(const serve_table_t *t);
int serve_table_dim(const serve_table_t *t);

/* ---- serve_store.c: versions ---------------------------------------------------- */
typedef struct sv_store sv_store_t;

/* Opens (creating) state_dir, takes its lock (<state_dir>/lock, held until
 * sv_store_close; the file holds the holder's pid) and loads every version
 * persisted there (replaying each version's chain of pushes). A version that
 * cannot be loaded (a corrupt push file or chain.json) is not served and is
 * reported as broken (log, sv_stats) with its files left in place; a full
 * push to its label moves them to <state_dir>/broken/ and replaces it.
 * Returns 0, KILN_EBUSY (another process holds the lock: the message names
 * its pid), KILN_EIO or KILN_ENOMEM. */
int sv_store_open(const char *state_dir, sv_store_t **out /* OUT */);
void sv_store_close(sv_store_t *s); /* accepts NULL */

/* An HTTP answer: status and a malloc'd JSON body. */
typedef struct sv_answer {
    int status;
    char *body;
} sv_answer_t;

/* A push being received. */
typedef struct sv_push sv_push_t;

/* Starts a push of model/label with the request's headers (base "none" for
 * a full push, NULL idem: none). Returns NULL with *ans filled when the push
 * is answered at once (a repeated idempotency key, a base conflict, a bad
 * header); else a session. */
sv_push_t *sv_push_begin(sv_store_t *s, const char *model, const char *label, const char *uid,
                         const char *base, const char *idem, sv_answer_t *ans /* OUT */);
/* Streams body bytes to the staging file and the checking decoder. A
 * failure is remembered and answered by sv_push_end. */
void sv_push_feed(sv_push_t *p, const void *data, size_t len);
/* The body ended: verifies it, persists and swaps in the new version.
 * Always fills *ans; frees p. */
void sv_push_end(sv_push_t *p, sv_answer_t *ans /* OUT */);
/* Drops an unfinished push (connection closed early); frees p. */
void sv_push_abort(sv_push_t *p);

/* GET of a version: 200 with its uid, rows, applied_at; 404. */
void sv_version_info(sv_store_t *s, const char *model, const char *label,
                     sv_answer_t *ans /* OUT */);
/* POST lookup: body {"label": L?, "table": T, "keys": [...]}. */
void sv_lookup(sv_store_t *s, const char *model, const char *body, size_t len,
               sv_answer_t *ans /* OUT */);
/* POST predict: TSV lines (Criteo format, a label column first) or JSON
 * {"rows": ["tsv line", ...]}. label NULL: chosen by the split, sticky on
 * request_key. */
void sv_predict(sv_store_t *s, const char *model, const char *label, const char *request_key,
                const char *body, size_t len, sv_answer_t *ans /* OUT */);

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
 * number from 1 to SV_MAX_WEIGHT (a label without traffic is left out).
 * Returns 0 or KILN_EINVAL with a message that starts with "--split". */
int sv_split_parse(const char *text, sv_split_t *out /* OUT */);
/* Sets the split predict follows (before serving starts). */
void sv_store_set_split(sv_store_t *s, const sv_split_t *split);
/* GET /v1/stats (JSON) and /metrics (Prometheus text). */
void sv_stats(sv_store_t *s, bool prometheus, sv_answer_t *ans /* OUT */);

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
} sv_http_opts_t;

typedef struct sv_http sv_http_t;
int sv_http_start(sv_store_t *store, const sv_http_opts_t *o, sv_http_t **out /* OUT */);
int sv_http_port(const sv_http_t *h);
void sv_http_stop(sv_http_t *h); /* accepts NULL */

#endif /* KILN_SERVING_SERVE_INT_H */
