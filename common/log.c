/*
 * common/log.c - leveled, timestamped log lines to stderr or to a file, as
 * text or as one JSON object per line (kiln_log_set_json: {"time", "level",
 * "msg", and "where" at debug level}). Each line goes out in one write() so
 * that lines from several processes appending to the same run log do not
 * interleave mid-line.
 */
#include "kiln.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int log_fd = -1; /* -1: stderr */
static kiln_log_level_t log_level = KILN_LOG_INFO;
static bool log_json;

void kiln_log_set_json(bool json) { log_json = json; }

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

int kiln_log_open(const char *path, kiln_log_level_t level)
{
    log_level = level;
    if (path == NULL) {
        kiln_log_close();
        return 0;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return kiln_errf(KILN_EIO, "cannot open log file %s: %s", path, strerror(errno));
    kiln_log_close();
    log_fd = fd;
    return 0;
}

void kiln_log_close(void)
{
    if (log_fd >= 0)
        close(log_fd);
    log_fd = -1;
}

void kiln_log_set_level(kiln_log_level_t level) { log_level = level; }

kiln_log_level_t kiln_log_get_level(void) { return log_level; }

int kiln_log_level_parse(const char *s, kiln_log_level_t *out)
{
    for (int i = 0; i <= KILN_LOG_OFF; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (kiln_log_level_t)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = KILN_LOG_WARN;
        return 0;
    }
    return kiln_errf(KILN_EINVAL, "unknown log level '%s' (expected debug, info, warn, error or off)", s);
}

void kiln_log(kiln_log_level_t level, const char *where, const char *fmt, ...)
{
    if (level < log_level || level >= KILN_LOG_OFF)
        return;
    int saved_errno = errno;
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char iso[KILN_ISO_LEN];
    kiln_time_iso((int64_t)ts.tv_sec, iso, sizeof iso);
    iso[strlen(iso) - 1] = '\0'; /* drop the Z, the milliseconds go first */
    if (log_json) {
        char when[KILN_ISO_LEN + 8], msg[2048];
        unsigned ms = (unsigned)(ts.tv_nsec / 1000000L) % 1000u; /* three digits, always */
        snprintf(when, sizeof when, "%s.%03uZ", iso, ms);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        json_t *o = json_pack("{s:s, s:s, s:s}", "time", when, "level", level_names[level], "msg",
                              msg);
        if (o != NULL && level == KILN_LOG_DEBUG && where != NULL)
            json_object_set_new(o, "where", json_string(where));
        char *text = o != NULL ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        if (text != NULL) {
            size_t len = strlen(text);
            text[len] = '\n'; /* json_dumps leaves room for its NUL */
            ssize_t w = write(log_fd >= 0 ? log_fd : STDERR_FILENO, text, len + 1);
            (void)w;
        }
        free(text);
        errno = saved_errno;
        return;
    }
    int n = snprintf(line, sizeof line, "%s.%03ldZ %-5s ", iso, ts.tv_nsec / 1000000L,
                     level_names[level]);
    if (level == KILN_LOG_DEBUG && where != NULL && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, "[%s] ", where);
    if (n < (int)sizeof line) {
        va_list ap;
        va_start(ap, fmt);
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        va_end(ap);
    }
    if (n >= (int)sizeof line)
        n = (int)sizeof line - 1;
    line[n++] = '\n';
    ssize_t w = write(log_fd >= 0 ? log_fd : STDERR_FILENO, line, (size_t)n);
    (void)w;
    errno = saved_errno;
}
