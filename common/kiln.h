/*
 * common/kiln.h - the small base every Kiln module stands on: error codes and
 * their messages, logging, checked allocation, time helpers, xxh64 hashing,
 * a did-you-mean helper and the Host check both HTTP servers share. Nothing
 * here knows about jobs or tables.
 *
 * Error convention: a function returns 0 on success or a negative KILN_E*
 * code. A function that fails for a reason worth telling the user also
 * records a sentence with kiln_errf(); the caller reads it with kiln_errmsg()
 * (thread-local, overwritten by the next kiln_errf on the same thread).
 *
 * This header is C11 and safe to include from a .cu file.
 */
#ifndef KILN_COMMON_KILN_H
#define KILN_COMMON_KILN_H

#include <stdbool.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors --------------------------------------------------------------
 * One list: name, value, message. kiln_strerror() and kiln_errname() walk it.
 */
#define KILN_ERRORS(X)                                                        \
    X(OK, 0, "success")                                                       \
    X(EINVAL, -1, "invalid argument")                                         \
    X(ENOMEM, -2, "out of memory")                                            \
    X(EIO, -3, "input/output error")                                          \
    X(ENOENT, -4, "not found")                                                \
    X(EEXIST, -5, "already exists")                                           \
    X(ESPEC, -6, "invalid job spec")                                          \
    X(ECRON, -7, "invalid cron expression")                                   \
    X(EDB, -8, "database error")                                              \
    X(EBUSY, -9, "resource busy")                                             \
    X(ECORRUPT, -10, "corrupt data")                                          \
    X(ECHECKSUM, -11, "checksum mismatch")                                    \
    X(ENOSPC, -12, "no space left on device")                                 \
    X(ETIMEDOUT, -13, "timed out")                                            \
    X(ECANCELED, -14, "canceled")                                             \
    X(EFULL, -15, "table full")                                               \
    X(ENET, -16, "network error")                                             \
    X(EHTTP, -17, "HTTP error")                                               \
    X(EMPI, -18, "MPI error")                                                 \
    X(ECUDA, -19, "CUDA error")                                               \
    X(ESTATE, -20, "invalid state transition")                                \
    X(EVERSION, -21, "unsupported version")                                   \
    X(EUSAGE, -22, "bad usage")                                               \
    X(ERANGE, -23, "value out of range")                                      \
    X(ENODEV, -24, "no device")                                               \
    X(EAUTH, -25, "not authorized")                                           \
    X(ECONFLICT, -26, "conflict")                                             \
    X(EINTERNAL, -27, "internal error")

enum {
#define KILN_ERR_ENUM(name, val, msg) KILN_##name = (val),
    KILN_ERRORS(KILN_ERR_ENUM)
#undef KILN_ERR_ENUM
};

/* Returns a static sentence for code (never NULL; unknown codes say so). */
const char *kiln_strerror(int code);
/* Returns the symbolic name, e.g. "KILN_ENOENT" (never NULL). */
const char *kiln_errname(int code);

/* Records a detailed message for the current thread and returns code, so that
 * `return kiln_errf(KILN_ENOENT, "no job named '%s'", name);` reads well. The
 * arguments may include kiln_errmsg() itself, to wrap the last message with
 * context: `kiln_errf(rc, "rank %d: %s", rank, kiln_errmsg())`. */
int kiln_errf(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Returns the last detailed message of this thread, or kiln_strerror of the
 * last code when none was given. Empty string when nothing failed yet. */
const char *kiln_errmsg(void);
/* Returns the code recorded with the last kiln_errf on this thread. */
int kiln_errcode(void);
/* Forgets the thread's last error. */
void kiln_errclear(void);

/* ---- logging ------------------------------------------------------------- */
typedef enum {
    KILN_LOG_DEBUG = 0,
    KILN_LOG_INFO = 1,
    KILN_LOG_WARN = 2,
    KILN_LOG_ERROR = 3,
    KILN_LOG_OFF = 4
} kiln_log_level_t;

/* Sends log lines to path (appending) or to stderr when path is NULL, and
 * drops lines below level. Returns 0 or KILN_EIO when path cannot be opened. */
int kiln_log_open(const char *path, kiln_log_level_t level);
/* Closes a log file opened by kiln_log_open and returns to stderr. */
void kiln_log_close(void);
void kiln_log_set_level(kiln_log_level_t level);
/* Log lines as JSON objects ({"time", "level", "msg"}), one per line. */
void kiln_log_set_json(bool json);
kiln_log_level_t kiln_log_get_level(void);
/* Parses "debug", "info", "warn", "error" or "off". Returns 0 or KILN_EINVAL. */
int kiln_log_level_parse(const char *s, kiln_log_level_t *out /* OUT */);
/* Writes "2024-05-02T00:00:00.123Z LEVEL [where] message\n" as one write. */
void kiln_log(kiln_log_level_t level, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)
#define KILN_WHERE __FILE__ ":" KILN_STR(__LINE__)
#define KILN_DEBUG(...) kiln_log(KILN_LOG_DEBUG, KILN_WHERE, __VA_ARGS__)
#define KILN_INFO(...) kiln_log(KILN_LOG_INFO, KILN_WHERE, __VA_ARGS__)
#define KILN_WARN(...) kiln_log(KILN_LOG_WARN, KILN_WHERE, __VA_ARGS__)
#define KILN_ERROR(...) kiln_log(KILN_LOG_ERROR, KILN_WHERE, __VA_ARGS__)

/* NCCL-style checks: on failure log file:line at debug level (a trail like a
 * backtrace with KILN_LOG=debug) and return / jump with the code. */
#define KILN_CHECK(call)                                                      \
    do {                                                                      \
        int kiln_rc_ = (call);                                                \
        if (kiln_rc_ < 0) {                                                   \
            KILN_DEBUG("%s -> %s", #call, kiln_errname(kiln_rc_));            \
            return kiln_rc_;                                                  \
        }                                                                     \
    } while (0)

#define KILN_CHECK_GOTO(call, rc, label)                                      \
    do {                                                                      \
        (rc) = (call);                                                        \
        if ((rc) < 0) {                                                       \
            KILN_DEBUG("%s -> %s", #call, kiln_errname(rc));                  \
            goto label;                                                       \
        }                                                                     \
    } while (0)

/* ---- checked allocation ----------------------------------------------------
 * These return NULL on failure after recording KILN_ENOMEM with the size
 * asked for; kiln_calloc and kiln_reallocarray also refuse n*size overflow.
 * Free with free(). */
void *kiln_malloc(size_t size);
void *kiln_calloc(size_t n, size_t size);
void *kiln_reallocarray(void *p, size_t n, size_t size);
char *kiln_strdup(const char *s);
char *kiln_strndup(const char *s, size_t n);
/* Replaces, in place, every byte of s that is not part of a well-formed
 * UTF-8 sequence (a stray continuation byte, a sequence cut short, an
 * overlong form, a surrogate, a code point past U+10FFFF) with '?', and
 * returns s. Messages that quote user text through "%.80s" or a fixed
 * buffer can cut a character in two; JSON (jansson) refuses such a string. */
char *kiln_utf8_scrub(char *s);
/* Returns a malloc'd printf result, or NULL (KILN_ENOMEM). */
char *kiln_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* kiln_asprintf with the arguments in ap (left as it was given). */
char *kiln_vasprintf(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
/* Frees each argument (any may be NULL): the buffers a struct owns, freed by
 * its destructor in one statement. The arguments are evaluated once each. */
#define KILN_FREE_ALL(...)                                                      \
    kiln_free_all((void *[]){__VA_ARGS__}, sizeof((void *[]){__VA_ARGS__}) / sizeof(void *))
void kiln_free_all(void *const *ptrs, size_t n);
/* Frees the n strings of v, then v (NULL frees nothing): a list of names
 * or paths that owns its strings. */
void kiln_strv_free(char **v, size_t n);
/* Makes room in *items, an array of *cap elements of elem bytes with n in
 * use, for one more: doubles *cap (to first when it is 0). Returns 0, or
 * KILN_ENOMEM with *items and *cap unchanged. */
int kiln_grow(void **items, size_t *cap, size_t n, size_t elem, size_t first);
/* Makes *items hold at least want elements of elem bytes: doubles *cap
 * (starting from first when it is 0) until it does. Returns 0, or
 * KILN_ENOMEM with *items and *cap unchanged. */
int kiln_grow_to(void **items, int64_t *cap, int64_t want, size_t elem, int64_t first);

/* ---- time ------------------------------------------------------------------
 * Wall time is Unix seconds (int64, UTC). Durations are milliseconds. */
/* Monotonic clock in nanoseconds, for measuring. */
int64_t kiln_mono_ns(void);
/* Wall clock in Unix seconds / milliseconds, both read from CLOCK_REALTIME:
 * kiln_now_s() is never in an earlier second than a kiln_now_ms() before it. */
int64_t kiln_now_s(void);
int64_t kiln_now_ms(void);
/* A test's pause: sleeps $var milliseconds when the variable is set and
 * positive (never set in production), so that a test can kill -9 a process
 * between two steps of its work. Signals do not cut the pause short. */
void kiln_test_pause(const char *var);
/* The delay before retry `attempt` (1, 2, ...): first_ms doubled for each
 * attempt after the first while below max_ms, capped at max_ms (<= 0: no cap),
 * plus up to 20% more taken from noise (any random bits), so that the retries
 * of many runs or pushes spread out. */
int64_t kiln_backoff_ms(int64_t first_ms, int64_t max_ms, int attempt, uint64_t noise);
/* Writes "2024-05-02T00:00:00Z" into buf (at least 21 bytes). Returns buf. */
char *kiln_time_iso(int64_t unix_s, char *buf, size_t bufsz);
#define KILN_ISO_LEN 32
/* Parses ISO 8601 "YYYY-MM-DDTHH:MM[:SS[.fff]](Z|+HH:MM|-HH:MM)", also with
 * a space instead of 'T' and a bare date "YYYY-MM-DD" (midnight UTC).
 * Returns 0 or KILN_EINVAL (message says what was expected). */
int kiln_time_parse_iso(const char *s, int64_t *unix_s /* OUT */);
/* Parses a duration: a sequence of <number><unit> with units ms, s, m, h, d
 * ("30s", "2h", "1h30m", "500ms"); a bare number means seconds.
 * Returns 0, KILN_EINVAL or KILN_ERANGE. */
int kiln_duration_parse(const char *s, int64_t *ms /* OUT */);
/* Formats ms as the shortest exact form ("2h", "1h30m", "1500ms"). */
char *kiln_duration_format(int64_t ms, char *buf, size_t bufsz);
/* Days from 1970-01-01 to the civil date (proleptic Gregorian). */
int64_t kiln_days_from_civil(int64_t y, unsigned m, unsigned d);
/* Inverse of kiln_days_from_civil. */
void kiln_civil_from_days(int64_t days, int64_t *y /* OUT */,
                          unsigned *m /* OUT */, unsigned *d /* OUT */);

/* ---- hashing (xxh64) ------------------------------------------------------ */
uint64_t kiln_xxh64(const void *data, size_t len, uint64_t seed);
/* Writes 16 lowercase hex digits and a NUL into buf (>= 17 bytes). */
char *kiln_hash_hex(uint64_t h, char *buf, size_t bufsz);
/* Parses 16 hex digits. Returns 0 or KILN_EINVAL. */
int kiln_hash_parse_hex(const char *s, uint64_t *out /* OUT */);

typedef struct kiln_hasher kiln_hasher_t;
/* Streaming xxh64. Returns NULL on allocation failure. */
kiln_hasher_t *kiln_hasher_create(uint64_t seed);
void kiln_hasher_update(kiln_hasher_t *h, const void *data, size_t len);
uint64_t kiln_hasher_digest(const kiln_hasher_t *h);
void kiln_hasher_destroy(kiln_hasher_t *h);
/* Hashes a whole file. Returns 0, KILN_ENOENT or KILN_EIO. */
int kiln_xxh64_file(const char *path, uint64_t seed, uint64_t *out /* OUT */,
                    uint64_t *size /* OUT, may be NULL */);

/* ---- files ------------------------------------------------------------------- */
/* Creates dir and its missing parents (mode 0755), like mkdir -p. Returns 0
 * or KILN_EIO naming the directory that could not be made. */
int kiln_mkdir_p(const char *dir);
/* Creates the missing parent directories of a file path. Returns 0 or KILN_EIO. */
int kiln_mkdir_parent(const char *path);
/* Replaces path with data so that a crash at any moment leaves the old file
 * or the new one, never a mix: writes path.tmp.PID, fsyncs it, renames it
 * over path and fsyncs the directory. Returns 0 or KILN_EIO naming the file
 * (the temporary file is removed then). */
int kiln_write_atomic(const char *path, const void *data, size_t len);
/* The same for a file written as a stream: kiln_atomic_open creates
 * path.tmp.PID beside path and opens a->f on it; the caller writes into a->f;
 * kiln_atomic_commit flushes and fsyncs it, renames it over path and fsyncs
 * the directory; kiln_atomic_abort (or a failed commit) closes and removes
 * it. Open and commit return 0 or KILN_EIO / KILN_ENOSPC / KILN_ENOMEM naming
 * the file; after commit or abort *a holds nothing. */
typedef struct kiln_atomic {
    FILE *f;
    char *tmp, *path;
} kiln_atomic_t;
int kiln_atomic_open(const char *path, kiln_atomic_t *a /* OUT */);
int kiln_atomic_commit(kiln_atomic_t *a);
void kiln_atomic_abort(kiln_atomic_t *a); /* accepts a closed or zeroed a */
/* fsyncs a directory, so that a rename or a new file in it survives a crash.
 * Returns 0 or KILN_EIO. */
int kiln_fsync_dir(const char *dir);

/* ---- processes ---------------------------------------------------------------- */
/* The start time of pid in clock ticks since boot (/proc/PID/stat), 0 when
 * it is gone: with the pid it names a process, where a pid alone may be
 * reused. */
uint64_t kiln_pid_start(pid_t pid);
/* True when pid is alive (not a zombie) and, when start_ticks != 0, started
 * at that time. */
bool kiln_pid_alive(pid_t pid, uint64_t start_ticks);
/* The state letter, session and start time of pid (each out may be NULL).
 * Returns 0, or -1 when pid is gone. */
int kiln_pid_stat(pid_t pid, char *state, pid_t *sid, uint64_t *start_ticks);

/* ---- strings ---------------------------------------------------------------- */
/* Damerau distance (optimal string alignment): insertions, deletions,
 * substitutions and swaps of two neighbouring letters ("trian" -> "train")
 * cost one each. Capped at 255 (and 255 for strings over 64 bytes). */
int kiln_edit_distance(const char *a, const char *b);
/* Returns the candidate closest to word if it is close enough to be a likely
 * typo (distance <= max(1, len/3)), else NULL. candidates ends with NULL. */
const char *kiln_did_you_mean(const char *word, const char *const *candidates);

/* ---- version (version.c) ---------------------------------------------------- */
/* Kiln's version, "MAJOR.MINOR.PATCH": CMake's project version. */
const char *kiln_version(void);
/* Whether argv (before any "--") holds --version; if so, prints
 * "PROG VERSION" on stdout. A main() that sees true exits 0. */
bool kiln_version_flag(int argc, char *const *argv, const char *prog);

/* ---- the Host check (host.c) ------------------------------------------------
 * Against DNS rebinding, kilnd's page and kiln-serve answer only requests
 * sent to one of their own names. */
/* Whether host (a request's Host header: "name", "name:port", "[v6]:port";
 * NULL when absent) names a server bound to bind_addr (numeric IPv4 or IPv6):
 * the bind address itself; "localhost" when that is a loopback or wildcard
 * address; any IP address and this machine's host name when it is a
 * wildcard (0.0.0.0, ::); or a name of allowed (comma-separated,
 * case-insensitive, a trailing dot ignored; "*" allows any; NULL: none).
 * A request without Host passes (HTTP/1.0; browsers always send one). */
bool kiln_host_allowed(const char *host, const char *bind_addr, const char *allowed);
/* Checks a list for kiln_host_allowed: names separated by commas, or "*".
 * Returns 0 or KILN_EINVAL naming `what` (the option) and the bad entry. */
int kiln_host_list_check(const char *list, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* KILN_COMMON_KILN_H */
