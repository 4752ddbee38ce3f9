/*
 * serving/serve_loop_int.h - kiln-serve's half of the loop from serving back
 * to training (issue 28): the impression log, feedback, the join into
 * training partitions and the online A/B metrics over joined rows. Nothing
 * outside serving/ includes it.
 *
 * Who owns what: sv_loop_t owns one writer thread (serve_impress.c: the
 * bounded queue that predicts feed, the segment files), one joiner thread
 * (serve_join.c, which also opens and closes the loop: segments whose
 * attribution window has passed become partitions in --join-dir), and per
 * model (serve_logmodel.c) an index of the impressions logged and not yet
 * pruned (serve_index.c), the feedback they got (serve_feedback.c) and the
 * online metrics (serve_online.c). One mutex (lock) guards the models; the
 * queue has its own (qlock), so a predict never waits on a file. The files
 * call downwards only: join -> impress -> logmodel -> feedback, online ->
 * index.
 *
 * On disk, under --impressions-dir/<model>/:
 *   <id>.imp      a segment: one impression per line (IMP_FIELDS), appended
 *                 by the writer; <id> is the unix ms it was opened at, unique
 *                 and increasing; a line without its '\n' is a torn append
 *                 and is not an impression;
 *   fb-<id>.log   feedback accepted: "<unix ms>\t<0|1>\t<request key>\t<row>\n";
 *   online.json   the online metrics and the last segment id they include.
 * Under --join-dir/<model>/: part=<id>/part-0.tsv and part=<id>/_SUCCESS,
 * renamed into place whole.
 */
#ifndef KILN_SERVING_SERVE_LOOP_INT_H
#define KILN_SERVING_SERVE_LOOP_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "serve_int.h"

/* ---- what the HTTP front and main use ------------------------------------------ */

typedef struct sv_loop sv_loop_t;

typedef struct sv_loop_opts {
    const char *impressions_dir; /* --impressions-dir */
    const char *join_dir;        /* --join-dir */
    int64_t max_bytes;           /* --impressions-max: segment bytes on disk, all models */
    int64_t window_ms;           /* --feedback-window */
} sv_loop_opts_t;

/* Opens the loop: creates the directories, loads what an earlier kiln-serve
 * left (segments into the index, feedback replayed onto them, the online
 * metrics) and starts the writer and joiner threads. Returns 0, KILN_EIO or
 * KILN_ENOMEM (the message names the directory or file). */
int sv_loop_open(const sv_loop_opts_t *o, sv_loop_t **out /* OUT */);
/* Stops the threads after the writer drained its queue; frees l. */
void sv_loop_close(sv_loop_t *l); /* accepts NULL */

#define SV_ID_MAX 128 /* request keys and row ids, NUL included */

/* Whether id (a request key or row id: what) can be logged: 1 to
 * SV_ID_MAX - 1 bytes, no control character. Returns 0 or KILN_EINVAL
 * saying what is wrong. */
int sv_loop_id_check(const char *what, const char *id);

/* After a predict answered r for request_key: queues one impression per row
 * (row ids: row_ids[i], or i when row_ids is NULL). Never blocks and never
 * fails the predict: when the queue is full the rows are dropped and
 * counted (/metrics, a log line per streak). */
void sv_loop_log(sv_loop_t *l, const char *model, const sv_predicted_t *r,
                 const char *request_key, const sv_line_t *lines, const char *const *row_ids);

/* POST /v1/models/{model}/feedback: body [{"request_key", "row", "label"}].
 * 200 {"accepted", "duplicate", "unknown", "late"}; 400 a malformed body
 * (nothing stored); 404 without --impressions-dir; 507 when the feedback log
 * cannot be written (nothing stored). */
void sv_answer_feedback(sv_loop_t *l, const char *model, const char *body, size_t len,
                        sv_answer_t *ans /* OUT */);
/* GET /v1/models/{model}/online: the online metrics as JSON. */
void sv_answer_online(sv_loop_t *l, const char *model, sv_answer_t *ans /* OUT */);
/* The loop's families of /metrics, appended after the store's (malloc'd
 * Prometheus text; "" when l is NULL), or NULL when out of memory. */
char *sv_loop_prometheus(sv_loop_t *l);

/* ---- inside the loop: serve_impress.c, serve_feedback.c, serve_join.c, serve_online.c */

#define LOOP_QUEUE 16384   /* impressions waiting for the writer: ~8 MB of rows */
#define LOOP_MODELS 64     /* models with an impression log */
#define LOOP_LABELS 16     /* labels per model with online metrics (SV_MAX_SPLIT) */
#define LOOP_BINS 2048     /* probability bins of the AUC histograms */
#define IMP_FIELDS 6       /* ms, label, checkpoint, probability, request key, row; then features */

/* One impression waiting in the queue. */
typedef struct lp_rec {
    int64_t ts; /* unix ms of the predict */
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX], uid[SERVE_UID_MAX];
    float prob;
    char *text; /* "<key>\t<row>\t<features>" (malloc'd) */
    uint64_t h; /* lp_hash of key and row */
} lp_rec_t;

/* An impression logged: its (request key, row) hash, time and feedback. */
typedef struct lp_entry {
    uint64_t h; /* 0: an empty slot */
    int64_t ts;
    int8_t y; /* -1 none yet; 0 or 1 */
} lp_entry_t;

/* A segment on disk (the model's open one is the last, when fd >= 0). */
typedef struct lp_seg {
    int64_t id, bytes, rows, tmin, tmax;
} lp_seg_t;

/* A feedback file on disk. */
typedef struct lp_fbfile {
    int64_t id, tmax;
} lp_fbfile_t;

/* The online metrics of one label over joined rows. */
typedef struct lp_acc {
    char label[SERVE_NAME_MAX];
    int64_t n, pos, nonfinite;
    double sum_p, sum_ll, sum_ll2;
    int64_t hist[2][LOOP_BINS]; /* [y][bin of the probability] */
} lp_acc_t;

typedef struct lp_model {
    char name[SERVE_NAME_MAX];
    char *dir, *join_dir; /* <impressions-dir>/<model>, <join-dir>/<model> */
    lp_entry_t *idx;      /* open addressing on h (cap a power of 2) */
    int64_t idx_cap, idx_n;
    lp_seg_t *segs; /* oldest first */
    int nsegs;
    size_t capsegs;
    int fd; /* the open segment (the last of segs), -1 none; the writer's */
    int fb_fd;
    int64_t fb_opened; /* id of the open feedback file */
    lp_fbfile_t *fbs;  /* sealed and open feedback files, oldest first */
    int nfbs;
    size_t capfbs;
    lp_acc_t acc[LOOP_LABELS];
    int nacc;
    int64_t joined_through; /* the last segment id in acc */
    int64_t fb[4];          /* feedback by result: FB_ACCEPTED ... FB_LATE */
    int64_t logged, partitions, joined_rows;
    int64_t join_failures; /* joins failed in a row (a warning for the first) */
    int64_t join_failed;   /* joins failed since start (retried: the segment stays) */
} lp_model_t;

enum { DROP_QUEUE, DROP_CAP, DROP_DISK, DROP_ROW, DROP_MODELS, DROP_NREASONS };

struct sv_loop {
    sv_loop_opts_t o;
    char *dir, *join_dir;
    int64_t seg_max, roll_ms; /* a segment rolls at this size or age */
    pthread_mutex_t lock;     /* models, counters below */
    pthread_cond_t drained_cond;
    lp_model_t *models[LOOP_MODELS];
    int nmodels;
    int64_t bytes;   /* of all segments on disk */
    int64_t last_id; /* the newest segment id given (ids increase) */
    int64_t drops[DROP_NREASONS];
    bool dropping[DROP_NREASONS]; /* a streak of drops has been logged */
    int64_t drained; /* records the writer wrote or dropped */
    pthread_mutex_t qlock; /* the queue */
    pthread_cond_t qcond;
    lp_rec_t *q[LOOP_QUEUE];
    int qhead, qn;
    int64_t enqueued; /* records put in the queue (drained counts up to it) */
    bool stop;
    pthread_t writer, joiner;
    bool writer_up, joiner_up;
    pthread_mutex_t stop_lock; /* the joiner's sleep */
    pthread_cond_t stop_cond;
};

/* serve_index.c: the bottom of the loop's files (it calls none of them) */
/* pthread_cond_timedwait for at most ms. Returns its result. */
int lp_wait_ms(pthread_cond_t *c, pthread_mutex_t *mu, int64_t ms);
/* The index key of (request key, row): never 0. */
uint64_t lp_hash(const char *key, size_t klen, const char *row, size_t rlen);
/* Under lock: model name's state, or NULL when it has none yet. */
lp_model_t *lp_model_find(const sv_loop_t *l, const char *name);
/* Under lock: the entry of h, or NULL. */
lp_entry_t *lp_index_find(const lp_model_t *m, uint64_t h);
/* Under lock: adds h at ts unless it is there. Returns 0 or KILN_ENOMEM. */
int lp_index_add(lp_model_t *m, uint64_t h, int64_t ts);
/* Under lock: drops the index entries older than min_ts (their segments are
 * joined and feedback for them would be late). */
void lp_index_prune(lp_model_t *m, int64_t min_ts);
/* Counts n records dropped for reason (under lock), logging the first of a streak. */
void lp_drop(sv_loop_t *l, int reason, int64_t n, const char *why);
/* Under lock: the end of a streak of drops of reason (logged when one was). */
void lp_drop_end(sv_loop_t *l, int reason);
/* The name of a drop reason in /metrics ("queue", "cap", "disk", ...). */
const char *lp_drop_name(int reason);
/* Splits one segment line (without its '\n') into its IMP_FIELDS fields and
 * the features after them. Returns 0 or -1 when it is not one. */
int lp_line_split(char *line, char *f[IMP_FIELDS], char **features);
/* Reads the whole file at path (malloc'd, NUL-terminated). Returns 0 or
 * KILN_EIO / KILN_ENOMEM. */
int lp_slurp(const char *path, char **buf /* OUT */, size_t *len /* OUT */);
/* The ids of dir's entries named <prefix><id><suffix>, sorted (malloc'd in
 * *ids). Returns how many, or a KILN_E* code. */
int lp_list_ids(const char *dir, const char *prefix, const char *suffix, int64_t **ids);

/* serve_logmodel.c */
/* Under lock: model name's state, made when missing (its directories made,
 * or what an earlier kiln-serve left loaded); NULL when it cannot be
 * (LOOP_MODELS reached, or its files cannot be read: logged). */
lp_model_t *lp_model_get(sv_loop_t *l, const char *name);
void lp_model_free(lp_model_t *m); /* accepts NULL */

/* serve_impress.c */
void *lp_writer_main(void *arg);

/* serve_feedback.c */
enum { FB_ACCEPTED, FB_DUPLICATE, FB_UNKNOWN, FB_LATE, FB_NRESULTS };
/* The name of a feedback result ("accepted", "duplicate", "unknown", "late"). */
const char *lp_feedback_name(int result);
/* At open: replays model m's feedback files onto its index. */
int lp_feedback_load(sv_loop_t *l, lp_model_t *m);
/* Under lock: removes sealed feedback files that only joined impressions can match. */
void lp_feedback_prune(lp_model_t *m);

/* serve_join.c */
void *lp_joiner_main(void *arg);

/* serve_online.c */
/* Under lock: adds a joined row (label, probability, outcome) to m's metrics. */
void lp_online_add(lp_model_t *m, const char *label, float prob, int y);
/* Under lock: writes m's metrics to <dir>/online.json. Returns 0 or KILN_EIO. */
int lp_online_save(const lp_model_t *m);
/* At open: loads <dir>/online.json into m (missing: nothing joined yet). */
int lp_online_load(lp_model_t *m);

#endif /* KILN_SERVING_SERVE_LOOP_INT_H */
