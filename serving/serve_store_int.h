/*
 * serving/serve_store_int.h - what the version store's files share and
 * nothing else includes: a version (tables, dense model, chain of push
 * files, idempotency answers) and the store holding them. serve_store.c
 * owns the store and its versions, serve_chain.c a version's files on disk,
 * serve_recv.c push sessions and serve_query.c the reads.
 */
#ifndef KILN_SERVING_SERVE_STORE_INT_H
#define KILN_SERVING_SERVE_STORE_INT_H

#include <pthread.h>

#include "model.h"
#include "serve_int.h"

#define IDEM_PER_LABEL 64 /* idempotency answers kept per version */
#define PREDICT_BATCH 256 /* rows per forward pass, the dense model's max_batch */
#define MAX_LABELS 64     /* (model, label) pairs with predict counters */
#define MAX_SPLITS 64     /* models with a split of their own */

typedef struct sv_idem {
    char key[128]; /* "": an empty slot */
    sv_pushed_t ans;
} sv_idem_t;

typedef struct sv_version {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX], uid[SERVE_UID_MAX];
    int64_t applied_at;
    serve_model_desc_t desc;
    serve_table_t **tables; /* (desc.ntables) */
    float *dense;           /* (desc.nparams) */
    model_t *rtm;
    char **files; /* the chain, file names in the label dir */
    int nfiles;
    int64_t next_seq;
    sv_idem_t idem[IDEM_PER_LABEL]; /* ring */
    int nidem;
} sv_version_t;

/* A model's own traffic split (PUT /v1/models/M/split), persisted. */
typedef struct sv_model_split {
    char model[SERVE_NAME_MAX];
    sv_split_t split;
} sv_model_split_t;

typedef struct sv_counter {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    int64_t requests, rows, nonfinite;
} sv_counter_t;

/* A label whose files could not be loaded at start: not served, reported. */
typedef struct sv_broken {
    char model[SERVE_NAME_MAX], label[SERVE_NAME_MAX];
    char *error;
} sv_broken_t;

struct sv_store {
    char *dir;
    int lock_fd; /* <dir>/lock, flock'ed while the store is open */
    pthread_rwlock_t lock; /* versions: readers share, a push's apply and swap excludes */
    pthread_mutex_t stats_lock; /* counters and staging_seq */
    sv_version_t **v;
    int nv, capv;
    sv_broken_t *broken;
    int nbroken;
    sv_split_t split; /* --split: for the models without a split of their own */
    sv_model_split_t splits[MAX_SPLITS]; /* set through the API, kept in splits.json */
    int nsplits;
    sv_counter_t counters[MAX_LABELS];
    int ncounters;
    int64_t staging_seq;
    int64_t pushes_applied, pushes_rejected;
};

/* ---- serve_store.c ---------------------------------------------------------------- */
/* A new empty version for desc: tables, dense weights and the trainer's
 * dense model of that shape. Returns 0, KILN_EINVAL (the model cannot be
 * built, or its parameter count is not desc's) or KILN_ENOMEM. */
int sv_version_create(const serve_model_desc_t *desc, sv_version_t **out /* OUT */);
void sv_version_destroy(sv_version_t *v); /* accepts NULL */
/* Rows in all of v's tables. */
int64_t sv_version_rows(const sv_version_t *v);
/* The version of model/label, or NULL. */
sv_version_t *sv_version_find(const sv_store_t *s, const char *model, const char *label);
/* Puts v in place of the version with its model and label (freeing that
 * one) or adds it. Returns 0 or KILN_ENOMEM (v is not taken then). */
int sv_version_install(sv_store_t *s, sv_version_t *v);
/* The broken label model/label, or NULL. */
const sv_broken_t *sv_broken_find(const sv_store_t *s, const char *model, const char *label);
/* Before a full push replaces a broken version: moves its directory to
 * <dir>/broken/<model>/<label>.<unix ms> (kept for inspection) and forgets
 * it. Returns 0 or KILN_EIO. */
int sv_broken_set_aside(sv_store_t *s, const char *model, const char *label);
/* Under the write lock, after a push changed model/label's version in
 * memory and could not be committed: loads the version its chain.json
 * names again and puts it in place; when that cannot be loaded, the version
 * is forgotten and the label reported broken with the reason. Returns 0 or
 * KILN_ENOMEM. */
int sv_version_reload(sv_store_t *s, const char *model, const char *label);
/* <dir>/models/<model>/<label> (malloc'd), or NULL. */
char *sv_label_dir(const sv_store_t *s, const char *model, const char *label);

/* ---- serve_chain.c: a version's files ----------------------------------------------- */
/* Decodes the push file at path into *v: onto *v (a delta), or into a new
 * version (full: *v is NULL on entry). uid (SERVE_UID_MAX) receives the
 * checkpoint the file makes the version hold. Returns 0 or the decoder's /
 * callbacks' code (a full push's half-built version is freed then). */
int sv_chain_apply(const char *path, bool full, sv_version_t **v, char *uid /* OUT */);
/* Replaces <label dir>/chain.json with v's chain, uid, applied_at and
 * idempotency answers (atomically, durably). Returns 0 or a KILN_E* code. */
int sv_chain_write(const sv_store_t *s, const sv_version_t *v);
/* Loads model/label's directory into a new version (*out NULL when it has
 * no chain.json yet: a first push killed before it committed). Returns 0,
 * KILN_ECORRUPT (the file and what is wrong named), KILN_EIO or KILN_ENOMEM. */
int sv_chain_load(const sv_store_t *s, const char *model, const char *label,
                  sv_version_t **out /* OUT */);
/* Once v's chain (in dir) is longer than CHAIN_MAX files, replaces it by one
 * full push file of v as it is in memory; a failure is logged and leaves
 * the old chain in place. */
void sv_chain_compact(const sv_store_t *s, sv_version_t *v, const char *dir);

/* ---- serve_split.c: which label a request goes to ------------------------------------ */
/* Loads <dir>/splits.json (missing: no model has a split of its own). A file
 * that cannot be read is logged and ignored. Returns 0 or KILN_ENOMEM. */
int sv_split_load(sv_store_t *s);
/* Under the read lock: the version a request without ?label= goes to, by
 * the weights of model's split (its own, else --split), sticky on key (a
 * hash of it), among the labels held. NULL when no held label has traffic:
 * a label no split names gets none. */
const sv_version_t *sv_split_choose(const sv_store_t *s, const char *model, const char *key);
/* Under the write lock, when a push created model/label: unless the split
 * in force for model names label, gives model a split of its own (that one
 * plus label=weight) and persists it; a failure to persist is logged and
 * leaves the split as it was. */
void sv_split_grant_locked(sv_store_t *s, const char *model, const char *label, int weight);
/* Under a lock: whether the store holds any version of model. */
bool sv_model_held(const sv_store_t *s, const char *model);

#endif /* KILN_SERVING_SERVE_STORE_INT_H */
