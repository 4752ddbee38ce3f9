/*
 * state/state.c - opening Kiln's database and the machinery every query uses:
 * creating the parent directory, the connection settings (WAL, busy timeout,
 * foreign keys), the migration runner, the cached statement table, parameter
 * binding, error reporting (SQL_CHECK and friends), and the transaction runner
 * that reruns a transaction when another process held the lock too long.
 * The queries themselves live in jobs.c, runs.c, events.c, records.c and
 * retain.c; the one migration backfill SQL cannot do (v8) is here.
 */
#include "state_int.h"

#include "jobs.h" /* migration 8 reads each stored spec's time zone */

#include <math.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *const stmt_sql[STMT_COUNT] = {
#define STATE_STMT_SQL(name, sql) [STMT_##name] = sql,
    STATE_STMTS(STATE_STMT_SQL)
#undef STATE_STMT_SQL
};

static const char *const stmt_name[STMT_COUNT] = {
#define STATE_STMT_NAME(name, sql) [STMT_##name] = #name,
    STATE_STMTS(STATE_STMT_NAME)
#undef STATE_STMT_NAME
};

/* ---- names ------------------------------------------------------------------ */

static const char *const run_state_names[STATE_RUN_NSTATES] = {
#define STATE_RUN_NAME(name, str) [STATE_RUN_##name] = str,
    STATE_RUN_STATES(STATE_RUN_NAME)
#undef STATE_RUN_NAME
};

const char *state_run_state_name(state_run_state_t s)
{
    if ((int)s < 0 || s >= STATE_RUN_NSTATES)
        return "unknown";
    return run_state_names[s];
}

int state_run_state_parse(const char *s, state_run_state_t *out)
{
    for (int i = 0; s != NULL && i < STATE_RUN_NSTATES; i++) {
        if (strcmp(s, run_state_names[i]) == 0) {
            *out = (state_run_state_t)i;
            return 0;
        }
    }
    const char *hint =
        s != NULL ? kiln_did_you_mean(s, (const char *const[]){"queued", "launching", "running",
                                                               "succeeded", "failed", "canceled",
                                                               "timed_out", "skipped", NULL})
                  : NULL;
    return kiln_errf(KILN_EINVAL,
                     "unknown run state '%s'%s%s%s; states are queued, launching, "
                     "running, succeeded, failed, canceled, timed_out, skipped",
                     s != NULL ? s : "(null)", hint ? " (did you mean '" : "", hint ? hint : "",
                     hint ? "'?)" : "");
}

bool state_run_state_terminal(state_run_state_t s)
{
    return s == STATE_RUN_SUCCEEDED || s == STATE_RUN_FAILED || s == STATE_RUN_CANCELED ||
           s == STATE_RUN_TIMED_OUT || s == STATE_RUN_SKIPPED;
}

const char *state_trigger_name(state_trigger_t t)
{
    static const char *const names[] = {[STATE_TRIGGER_MANUAL] = "manual",
                                        [STATE_TRIGGER_CRON] = "cron",
                                        [STATE_TRIGGER_RETRY] = "retry",
                                        [STATE_TRIGGER_CATCHUP] = "catchup"};
    if ((int)t < 0 || (size_t)t >= sizeof names / sizeof names[0])
        return "unknown";
    return names[t];
}

/* ---- errors and statements ------------------------------------------------------- */

int state_sql_err(state_t *st, int sqlite_rc, const char *what)
{
    int primary = sqlite_rc & 0xff;
    st->last_sqlite_rc = sqlite_rc;
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
        st->busy = true;
    const char *msg = st->db != NULL ? sqlite3_errmsg(st->db) : sqlite3_errstr(sqlite_rc);
    /* sqlite3_errmsg may describe a later call (e.g. a reset); prefer the
     * code's own text when they disagree in kind. */
    if (st->db != NULL && (sqlite3_extended_errcode(st->db) & 0xff) != primary)
        msg = sqlite3_errstr(sqlite_rc);
    snprintf(st->last_sqlite_msg, sizeof st->last_sqlite_msg, "%s", msg);
    return kiln_errf(KILN_EDB, "database %s: %s: %s", st->path, what, msg);
}

int state_stmt(state_t *st, state_stmt_id_t id, sqlite3_stmt **out)
{
    *out = NULL;
    if (st->stmts[id] == NULL) {
        int rc = sqlite3_prepare_v3(st->db, stmt_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
                                    &st->stmts[id], NULL);
        if (rc != SQLITE_OK) {
            char what[96];
            snprintf(what, sizeof what, "preparing statement %s", stmt_name[id]);
            sqlite3_finalize(st->stmts[id]);
            st->stmts[id] = NULL;
            return state_sql_err(st, rc, what);
        }
    }
    *out = st->stmts[id];
    return 0;
}

void state_stmt_done(sqlite3_stmt *s)
{
    if (s == NULL)
        return;
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

int state_bind(state_t *st, sqlite3_stmt *s, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = state_vbind(st, s, what, fmt, ap);
    va_end(ap);
    return rc;
}

int state_vbind(state_t *st, sqlite3_stmt *s, const char *what, const char *fmt, va_list ap)
{
    if ((int)strlen(fmt) != sqlite3_bind_parameter_count(s))
        return kiln_errf(KILN_EINTERNAL,
                         "%s: binding %d values to a statement with %d "
                         "parameters",
                         what, (int)strlen(fmt), sqlite3_bind_parameter_count(s));
    for (int i = 0; fmt[i] != '\0'; i++) {
        int idx = i + 1, src;
        switch (fmt[i]) {
        case 'i':
            src = sqlite3_bind_int(s, idx, va_arg(ap, int));
            break;
        case 'b':
            src = sqlite3_bind_int(s, idx, va_arg(ap, int) != 0);
            break;
        case 'I':
            src = sqlite3_bind_int64(s, idx, va_arg(ap, int64_t));
            break;
        case 'J': {
            int64_t v = va_arg(ap, int64_t);
            src = v != 0 ? sqlite3_bind_int64(s, idx, v) : sqlite3_bind_null(s, idx);
            break;
        }
        case 'd':
            src = sqlite3_bind_double(s, idx, va_arg(ap, double));
            break;
        case 'n': { /* a figure that may be unknown: NaN binds NULL */
            double v = va_arg(ap, double);
            src = isnan(v) ? sqlite3_bind_null(s, idx) : sqlite3_bind_double(s, idx, v);
            break;
        }
        case 't': {
            const char *t = va_arg(ap, const char *);
            src = t != NULL ? sqlite3_bind_text(s, idx, t, -1, SQLITE_TRANSIENT)
                            : sqlite3_bind_null(s, idx);
            break;
        }
        default:
            return kiln_errf(KILN_EINTERNAL, "state_bind: bad format character '%c' (%s)", fmt[i],
                             what);
        }
        if (src != SQLITE_OK)
            return state_sql_err(st, src, what);
    }
    return 0;
}

int state_step(state_t *st, sqlite3_stmt *s, const char *what)
{
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        return 1;
    if (rc == SQLITE_DONE)
        return 0;
    return state_sql_err(st, rc, what);
}

int state_exec(state_t *st, sqlite3_stmt *s, const char *what)
{
    int rc = state_step(st, s, what);
    state_stmt_done(s);
    return rc < 0 ? rc : 0;
}

int state_col_str(sqlite3_stmt *s, int col, char **out)
{
    *out = NULL;
    if (sqlite3_column_type(s, col) == SQLITE_NULL)
        return 0;
    const unsigned char *t = sqlite3_column_text(s, col);
    if (t == NULL)
        return kiln_errf(KILN_ENOMEM, "out of memory reading a text column");
    *out = kiln_strndup((const char *)t, (size_t)sqlite3_column_bytes(s, col));
    return *out != NULL ? 0 : KILN_ENOMEM;
}

int64_t state_col_i64(sqlite3_stmt *s, int col)
{
    return sqlite3_column_int64(s, col);
}

/* ---- transactions ------------------------------------------------------------------ */

int state_tx_begin(state_t *st, const char *what)
{
    sqlite3_stmt *s;
    int rc;
    KILN_CHECK(state_stmt(st, STMT_BEGIN, &s));
    rc = state_step(st, s, what);
    state_stmt_done(s);
    return rc < 0 ? rc : 0;
}

int state_tx_end(state_t *st, int rc, const char *what)
{
    sqlite3_stmt *s;
    if (rc == 0) {
        rc = state_stmt(st, STMT_COMMIT, &s);
        if (rc == 0)
            rc = state_exec(st, s, what);
    }
    if (rc != 0 && !sqlite3_get_autocommit(st->db)) {
        /* Keep the first error's message: roll back without reporting. */
        if (state_stmt(st, STMT_ROLLBACK, &s) == 0) {
            sqlite3_step(s);
            state_stmt_done(s);
        }
    }
    return rc;
}

bool state_busy_retry(state_t *st, int *rc, int attempt, const char *what)
{
    if (*rc == 0 || !st->busy)
        return false;
    if (attempt + 1 >= STATE_BUSY_TRIES) {
        *rc = kiln_errf(*rc,
                        "database %s stayed locked by another process: gave up on %s after %d "
                        "tries of %g s each (%s); is another kiln process stuck in a transaction?",
                        st->path, what, STATE_BUSY_TRIES, st->busy_timeout_ms / 1000.0,
                        st->last_sqlite_msg);
        return false;
    }
    /* Sleep a few ms, more each time, before the next try. */
    struct timespec ts = {0, (long)(attempt + 1) * 25 * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    return true;
}

/* ---- opening ---------------------------------------------------------------------- */

static int open_err(const char *path, const char *why)
{
    return kiln_errf(KILN_EDB,
                     "cannot open database %s: %s; check the path and permissions "
                     "or pass --db",
                     path, why);
}

/* mkdir -p of the directory part of path, with the database's context. */
static int make_parent_dirs(const char *path)
{
    if (kiln_mkdir_parent(path) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_errmsg());
        return open_err(path, why);
    }
    return 0;
}

static int journal_cb(void *ctx, int ncol, char **vals, char **names)
{
    char *mode = ctx;
    if (ncol > 0 && vals[0] != NULL)
        snprintf(mode, 16, "%s", vals[0]);
    return 0;
}

/* Runs a fixed script with sqlite3_exec. */
static int exec_script(state_t *st, const char *sql, const char *what,
                       int (*cb)(void *, int, char **, char **), void *ctx)
{
    int rc = sqlite3_exec(st->db, sql, cb, ctx, NULL);
    return rc == SQLITE_OK ? 0 : state_sql_err(st, rc, what);
}

static int set_wal(state_t *st)
{
    char mode[16] = "";
    int rc = exec_script(st, "PRAGMA journal_mode = WAL", "switching to WAL", journal_cb, mode);
    if (rc == 0 && strcmp(mode, "wal") != 0 && strcmp(mode, "memory") != 0)
        KILN_WARN("database %s: WAL mode unavailable (journal_mode is '%s'); concurrent "
                  "readers will wait for writers",
                  st->path, mode);
    return rc;
}

static int fk_violation_cb(void *ctx, int ncol, char **vals, char **names)
{
    (void)ncol;
    (void)vals;
    (void)names;
    (*(int64_t *)ctx)++;
    return 0;
}

static int read_version(state_t *st, int *v)
{
    sqlite3_stmt *s;
    int rc;
    *v = 0;
    KILN_CHECK(state_stmt(st, STMT_USER_VERSION, &s));
    rc = state_step(st, s, "reading the schema version");
    if (rc == 1) {
        *v = sqlite3_column_int(s, 0);
        rc = 0;
    }
    state_stmt_done(s);
    return rc;
}

/* Whether the file is Kiln's to use: marked with Kiln's application_id, or
 * new (no tables, user_version 0), or a Kiln database from before the mark
 * (its jobs, runs and events tables). Anything else is another
 * application's file, which Kiln must not add tables to, switch to WAL or
 * renumber. Returns 0 (*mark: the mark is still to be set), KILN_EDB with
 * *foreign set, saying whose the file looks to be, or a failure to read it. */
static int check_owner(state_t *st, bool *mark /* OUT */, bool *foreign /* OUT */)
{
    sqlite3_stmt *s = NULL;
    int64_t app = 0;
    int v = 0, ntables = 0, nkiln = 0;
    char first[64] = "";
    *mark = *foreign = false;
    KILN_CHECK(state_stmt(st, STMT_APPLICATION_ID, &s));
    int rc = state_step(st, s, "reading the application id");
    if (rc == 1)
        app = sqlite3_column_int64(s, 0);
    state_stmt_done(s);
    if (rc < 0)
        return rc;
    if (app == STATE_APPLICATION_ID)
        return 0;
    KILN_CHECK(read_version(st, &v));
    KILN_CHECK(state_stmt(st, STMT_TABLES, &s));
    while ((rc = state_step(st, s, "listing the tables")) == 1) {
        const char *name = (const char *)sqlite3_column_text(s, 0);
        if (ntables++ == 0)
            snprintf(first, sizeof first, "%s", name ? name : "");
        nkiln += name != NULL && ntables <= 3 &&
                 (strcmp(name, "jobs") == 0 || strcmp(name, "runs") == 0 ||
                  strcmp(name, "events") == 0);
    }
    state_stmt_done(s);
    if (rc < 0)
        return rc;
    if (app == 0 && ((ntables == 0 && v == 0) || nkiln == 3)) {
        *mark = true;
        return 0;
    }
    *foreign = true;
    if (app != 0)
        return kiln_errf(KILN_EDB, "database %s belongs to another application (its "
                                   "application_id is %lld, Kiln's is %d), so Kiln leaves it "
                                   "alone: pass --db with a Kiln database or a new file",
                         st->path, (long long)app, STATE_APPLICATION_ID);
    return kiln_errf(KILN_EDB, "database %s is not a Kiln database (it holds %d table%s, such as "
                               "'%s', and user_version %d, but not Kiln's), so Kiln leaves it "
                               "alone: pass --db with a Kiln database or a new file",
                     st->path, ntables, ntables == 1 ? "" : "s", first, v);
}

static int too_new(state_t *st, int v)
{
    return kiln_errf(KILN_EVERSION,
                     "database %s has schema version %d but this Kiln knows "
                     "versions up to %d: it was written by a newer Kiln; upgrade Kiln or pass "
                     "--db to use another file",
                     st->path, v, STATE_SCHEMA_VERSION);
}

/* Migration 8's backfill: each job's time zone, read from its stored spec by
 * the spec parser kiln submit uses. A spec that no longer parses leaves
 * NULL (UTC, as it fired since it stopped parsing). The zones are collected
 * first, then written: no row changes under the SELECT's cursor. */
typedef struct {
    int64_t id;
    char *tz;
} job_tz_t;

static int backfill_timezones(state_t *st)
{
    const char *what = "filling in the jobs' time zones";
    sqlite3_stmt *s = NULL;
    job_tz_t *js = NULL;
    size_t n = 0, cap = 0;
    int rc = state_stmt(st, STMT_JOB_TZ_MISSING, &s);
    while (rc == 0 && (rc = state_step(st, s, what)) == 1) {
        const char *name = (const char *)sqlite3_column_text(s, 1);
        const char *yaml = (const char *)sqlite3_column_text(s, 2);
        job_spec_t spec;
        rc = 0;
        if (yaml == NULL ||
            job_spec_parse(yaml, strlen(yaml), name ? name : "job", &spec, NULL) < 0) {
            kiln_errclear();
            continue;
        }
        job_tz_t *grown = n < cap ? js : realloc(js, (cap = cap ? 2 * cap : 16) * sizeof *js);
        if (grown == NULL) {
            rc = KILN_ENOMEM;
        } else {
            js = grown;
            js[n].id = sqlite3_column_int64(s, 0);
            js[n].tz = spec.timezone ? kiln_strdup(spec.timezone) : NULL;
            rc = spec.timezone && js[n].tz == NULL ? KILN_ENOMEM : 0;
            n++;
        }
        job_spec_fini(&spec);
    }
    state_stmt_done(s);
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        s = NULL;
        rc = state_stmt(st, STMT_JOB_SET_TZ, &s);
        if (rc == 0)
            rc = state_bind(st, s, what, "It", js[i].id, js[i].tz);
        if (rc == 0)
            rc = state_exec(st, s, what);
        state_stmt_done(s);
    }
    for (size_t i = 0; i < n; i++)
        free(js[i].tz);
    free(js);
    return rc < 0 ? rc : 0;
}

/* One migration to version `to`, inside the caller's transaction. Another
 * process may have applied it since we looked: then there is nothing to do. */
static int migrate_one(state_t *st, int to)
{
    int v;
    KILN_CHECK(read_version(st, &v));
    if (v > STATE_SCHEMA_VERSION)
        return too_new(st, v);
    if (v >= to)
        return 0;
    char what[160];
    snprintf(what, sizeof what, "migrating from schema version %d to %d (%s)", v, to,
             state_migrations[to - 1].what);
    KILN_CHECK(exec_script(st, state_migrations[to - 1].sql, what, NULL, NULL));
    if (state_migrations[to - 1].backfill == STATE_BACKFILL_TIMEZONES)
        KILN_CHECK(backfill_timezones(st));
    if (state_migrations[to - 1].rebuilds_tables) {
        int64_t broken = 0;
        KILN_CHECK(exec_script(st, "PRAGMA foreign_key_check", what, fk_violation_cb, &broken));
        if (broken > 0)
            return kiln_errf(KILN_ECORRUPT,
                             "database %s: migration %d would leave %lld rows referring to "
                             "rows that do not exist; the file is left at version %d",
                             st->path, to, (long long)broken, v);
    }
    KILN_CHECK(read_version(st, &v));
    if (v != to)
        return kiln_errf(KILN_EINTERNAL, "database %s: migration %d left schema version %d",
                         st->path, to, v);
    return 0;
}

/* Foreign keys on or off for a migration that rebuilds tables. The pragma
 * is a no-op inside a transaction, so it is set around one. */
static int set_foreign_keys(state_t *st, bool on)
{
    return exec_script(st, on ? "PRAGMA foreign_keys = ON" : "PRAGMA foreign_keys = OFF",
                       "switching foreign keys", NULL, NULL);
}

static int migrate(state_t *st, int target)
{
    int v, rc;
    STATE_READ(st, "reading the schema version", rc, read_version(st, &v));
    if (rc < 0)
        return rc;
    if (v > STATE_SCHEMA_VERSION)
        return too_new(st, v);
    for (int to = v + 1; to <= target; to++) {
        bool fk_off = state_migrations[to - 1].rebuilds_tables;
        if (fk_off && (rc = set_foreign_keys(st, false)) < 0)
            return rc;
        STATE_WRITE(st, "migrating the schema", rc, migrate_one(st, to));
        if (fk_off) {
            int frc = set_foreign_keys(st, true);
            rc = rc < 0 ? rc : frc;
        }
        if (rc < 0)
            return rc;
        KILN_DEBUG("database %s: at schema version %d", st->path, to);
    }
    return 0;
}

static int open_db(const char *path, int version, state_t **out)
{
    int rc;
    state_t *st = NULL;
    *out = NULL;
    if (path == NULL || path[0] == '\0')
        return kiln_errf(KILN_EINVAL, "no database path given; pass --db");
    if (version < 0 || version > STATE_SCHEMA_VERSION)
        return kiln_errf(KILN_EINVAL, "schema version %d is out of range 0..%d", version,
                         STATE_SCHEMA_VERSION);
    if (strcmp(path, ":memory:") != 0)
        KILN_CHECK(make_parent_dirs(path));

    st = kiln_calloc(1, sizeof *st);
    if (st == NULL)
        return KILN_ENOMEM;
    st->path = kiln_strdup(path);
    if (st->path == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    int src = sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (src != SQLITE_OK) {
        rc = open_err(path, st->db != NULL ? sqlite3_errmsg(st->db) : sqlite3_errstr(src));
        goto out;
    }
    sqlite3_extended_result_codes(st->db, 1);
    st->busy_timeout_ms = STATE_BUSY_TIMEOUT_MS;
    sqlite3_busy_timeout(st->db, st->busy_timeout_ms);

    /* The first statements touch the file: a bad path or a file that is not
     * a database fails here, and says so as an open error. */
    STATE_READ(st, "setting up the connection", rc,
               exec_script(st, "PRAGMA foreign_keys = ON", "enabling foreign keys", NULL, NULL));
    bool mark = false, foreign = false;
    if (rc == 0)
        STATE_READ(st, "checking whose the file is", rc, check_owner(st, &mark, &foreign));
    if (foreign)
        goto out;
    if (rc == 0)
        STATE_READ(st, "switching to WAL", rc, set_wal(st));
    if (rc == 0)
        rc = exec_script(st, "PRAGMA synchronous = NORMAL", "setting synchronous", NULL, NULL);
    if (rc < 0) {
        rc = open_err(path, sqlite3_errmsg(st->db));
        goto out;
    }
    rc = migrate(st, version);
    if (rc == 0 && mark) {
        char sql[64];
        snprintf(sql, sizeof sql, "PRAGMA application_id = %d", STATE_APPLICATION_ID);
        STATE_WRITE(st, "marking the file as Kiln's", rc,
                    exec_script(st, sql, "setting the application id", NULL, NULL));
    }
out:
    if (rc < 0) {
        state_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

int state_open(const char *path, state_t **out)
{
    return open_db(path, STATE_SCHEMA_VERSION, out);
}

int state_open_at_version(const char *path, int version, state_t **out)
{
    return open_db(path, version, out);
}

void state_close(state_t *st)
{
    if (st == NULL)
        return;
    for (int i = 0; i < STMT_COUNT; i++)
        sqlite3_finalize(st->stmts[i]);
    if (st->db != NULL && sqlite3_close(st->db) != SQLITE_OK)
        KILN_WARN("database %s: close: %s", st->path, sqlite3_errmsg(st->db));
    free(st->path);
    free(st);
}

int state_schema_version(state_t *st, int *out)
{
    int rc;
    STATE_READ(st, "reading the schema version", rc, read_version(st, out));
    return rc;
}

/* ---- test hooks ------------------------------------------------------------------ */

int state_test_exec(state_t *st, const char *sql)
{
    return exec_script(st, sql, "running a test script", NULL, NULL);
}

static int scalar_cb(void *ctx, int ncol, char **vals, char **names)
{
    int64_t *out = ctx;
    if (ncol > 0 && vals[0] != NULL)
        *out = strtoll(vals[0], NULL, 10);
    return 1; /* first row only */
}

int state_test_scalar(state_t *st, const char *sql, int64_t *out)
{
    *out = 0;
    int rc = sqlite3_exec(st->db, sql, scalar_cb, out, NULL);
    if (rc == SQLITE_OK || rc == SQLITE_ABORT)
        return 0;
    return state_sql_err(st, rc, "running a test query");
}

void state_test_set_busy_timeout(state_t *st, int ms)
{
    st->busy_timeout_ms = ms;
    sqlite3_busy_timeout(st->db, ms);
}
