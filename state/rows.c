/*
 * state/rows.c - reading the rows of a SELECT into structs by a row table
 * (state_row_t: which field each column fills, and as what), freeing what a
 * row owns by the same table, and the queries built on them: the first row of
 * a statement (one int64 answer is a row too) and all its rows as a growing
 * array; and the writes of one statement: an UPDATE that says how many rows
 * it changed, an INSERT that gives back its rowid. Each prepares, binds, steps and resets
 * its cached statement itself, so a caller names only the statement, its
 * parameters and where the rows go.
 */
#include "state_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int state_row_read(const state_row_t *m, sqlite3_stmt *s, void *row)
{
    int rc = 0;
    memset(row, 0, m->size);
    for (size_t i = 0; i < m->ncols && rc == 0; i++) {
        void *field = (char *)row + m->cols[i].off;
        int col = (int)i;
        switch (m->cols[i].kind) {
        case STATE_COL_SKIP:
            break;
        case STATE_COL_I64:
            *(int64_t *)field = state_col_i64(s, col);
            break;
        case STATE_COL_INT:
            *(int *)field = sqlite3_column_int(s, col);
            break;
        case STATE_COL_BOOL:
            *(bool *)field = sqlite3_column_int(s, col) != 0;
            break;
        case STATE_COL_REAL:
            /* SQLite stores NaN as NULL; give it back as NaN. */
            *(double *)field =
                sqlite3_column_type(s, col) == SQLITE_NULL ? NAN : sqlite3_column_double(s, col);
            break;
        case STATE_COL_TEXT:
            rc = state_col_str(s, col, (char **)field);
            break;
        }
    }
    if (rc == 0 && m->finish != NULL)
        rc = m->finish(s, row);
    if (rc < 0)
        state_row_fini(m, row);
    return rc;
}

void state_row_fini(const state_row_t *m, void *row)
{
    if (row == NULL)
        return;
    for (size_t i = 0; i < m->ncols; i++)
        if (m->cols[i].kind == STATE_COL_TEXT)
            free(*(char **)((char *)row + m->cols[i].off));
    memset(row, 0, m->size);
}

void state_rows_free(const state_row_t *m, void *rows, size_t n)
{
    for (size_t i = 0; rows != NULL && i < n; i++)
        state_row_fini(m, (char *)rows + i * m->size);
    free(rows);
}

/* Prepares statement id and binds the values of fmt (state_bind's letters).
 * It reads a copy of ap, so a query rerun on a busy file binds the same. */
static int prepare(state_t *st, state_stmt_id_t id, const char *what, sqlite3_stmt **s,
                   const char *fmt, va_list ap)
{
    KILN_CHECK(state_stmt(st, id, s));
    va_list aq;
    va_copy(aq, ap);
    int rc = state_vbind(st, *s, what, fmt, aq);
    va_end(aq);
    return rc;
}

/* prepare, then steps to the first row: 1 for a row (for the caller to read
 * from *s), 0 when none, or an error. The caller resets *s. */
static int first_row(state_t *st, state_stmt_id_t id, const char *what, sqlite3_stmt **s,
                     const char *fmt, va_list ap)
{
    int rc = prepare(st, id, what, s, fmt, ap);
    return rc < 0 ? rc : state_step(st, *s, what);
}

int state_first_row(state_t *st, state_stmt_id_t id, const char *what, sqlite3_stmt **s,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = first_row(st, id, what, s, fmt, ap);
    va_end(ap);
    return rc;
}

/* state_row_query on a va_list. */
static int row_query(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                     void *row, const char *fmt, va_list ap)
{
    sqlite3_stmt *s = NULL;
    memset(row, 0, m->size);
    int rc = first_row(st, id, what, &s, fmt, ap);
    if (rc == 1 && (rc = state_row_read(m, s, row)) == 0)
        rc = 1;
    state_stmt_done(s);
    return rc;
}

int state_row_query(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                    void *row, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = row_query(st, id, what, m, row, fmt, ap);
    va_end(ap);
    return rc;
}

int state_row_get(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                  void *row, const char *fmt, ...)
{
    int rc;
    va_list ap;
    va_start(ap, fmt);
    STATE_READ(st, what, rc, row_query(st, id, what, m, row, fmt, ap));
    va_end(ap);
    return rc;
}

/* Steps s to its end, appending each row to *out / *n by m. */
static int collect(state_t *st, sqlite3_stmt *s, const char *what, const state_row_t *m,
                   void **out, size_t *n)
{
    size_t cap = 0;
    for (;;) {
        int rc = state_step(st, s, what);
        if (rc <= 0)
            return rc;
        KILN_CHECK(kiln_grow(out, &cap, *n, m->size, 16));
        KILN_CHECK(state_row_read(m, s, (char *)*out + *n * m->size));
        (*n)++;
    }
}

/* state_rows_query on a va_list. */
static int rows_query(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                      void **out, size_t *n, const char *fmt, va_list ap)
{
    sqlite3_stmt *s = NULL;
    *out = NULL;
    *n = 0;
    int rc = prepare(st, id, what, &s, fmt, ap);
    if (rc == 0)
        rc = collect(st, s, what, m, out, n);
    state_stmt_done(s);
    if (rc < 0) {
        state_rows_free(m, *out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int state_rows_query(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                     void **out, size_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = rows_query(st, id, what, m, out, n, fmt, ap);
    va_end(ap);
    return rc;
}

int state_rows_list(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                    void **out, size_t *n, const char *fmt, ...)
{
    int rc;
    va_list ap;
    va_start(ap, fmt);
    STATE_READ(st, what, rc, rows_query(st, id, what, m, out, n, fmt, ap));
    va_end(ap);
    return rc;
}

/* prepare, then steps the write to its end and resets it: 0 or an error. */
static int write_one(state_t *st, state_stmt_id_t id, const char *what, const char *fmt, va_list ap)
{
    sqlite3_stmt *s = NULL;
    int rc = prepare(st, id, what, &s, fmt, ap);
    if (rc == 0)
        rc = state_exec(st, s, what);
    state_stmt_done(s);
    return rc;
}

int state_update(state_t *st, state_stmt_id_t id, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = write_one(st, id, what, fmt, ap);
    va_end(ap);
    return rc < 0 ? rc : sqlite3_changes(st->db);
}

int state_insert(state_t *st, state_stmt_id_t id, const char *what, int64_t *rowid, const char *fmt,
                 ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = write_one(st, id, what, fmt, ap);
    va_end(ap);
    if (rc == KILN_EDB && st->last_sqlite_rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        return kiln_errf(KILN_ENOENT,
                         "cannot %s: it refers to a run, checkpoint, export or "
                         "endpoint that does not exist",
                         what);
    if (rc == 0 && rowid != NULL)
        *rowid = sqlite3_last_insert_rowid(st->db);
    return rc;
}

/* A bare int64_t from column 0: one int64 answer, or a list of ids as an
 * int64_t array. */
static const state_col_t id_cols[] = {{STATE_COL_I64, 0}};
const state_row_t state_i64_row = STATE_ROW(int64_t, id_cols, NULL);

int state_rows_of_ids(state_t *st, state_stmt_id_t id, const char *what, const state_row_t *m,
                      const int64_t *ids, size_t nids, void **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (nids == 0)
        return 0;
    char *rows = kiln_calloc(nids, m->size);
    if (rows == NULL)
        return KILN_ENOMEM;
    for (size_t i = 0; i < nids; i++) {
        int rc = state_row_get(st, id, what, m, rows + *n * m->size, "I", ids[i]);
        if (rc < 0) {
            state_rows_free(m, rows, *n);
            *n = 0;
            return rc;
        }
        *n += (size_t)rc; /* 0: the row went between the two reads */
    }
    *out = rows;
    return 0;
}

int state_found(int rc, const char *fmt, ...)
{
    if (rc != 0)
        return rc < 0 ? rc : 0;
    /* kiln_errf's own buffer is as long, so the message is cut where it would be. */
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_errf(KILN_ENOENT, "%s", msg);
}

int state_step_ids(state_t *st, sqlite3_stmt *s, const char *what, int64_t *ids, size_t max,
                   size_t *n)
{
    *n = 0;
    while (*n < max) {
        int rc = state_step(st, s, what);
        if (rc <= 0)
            return rc;
        ids[(*n)++] = state_col_i64(s, 0);
    }
    return 0;
}
