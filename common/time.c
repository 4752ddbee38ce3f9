/*
 * common/time.c - clocks, ISO 8601 instants and human durations.
 * Civil-date arithmetic is done here in plain integers (proleptic Gregorian,
 * UTC) so that cron and the state store never depend on the process's TZ.
 */
#include "kiln.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t kiln_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void kiln_test_pause(const char *var)
{
    const char *v = getenv(var);
    long long ms = v != NULL ? atoll(v) : 0;
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

int64_t kiln_backoff_ms(int64_t first_ms, int64_t max_ms, int attempt, uint64_t noise)
{
    int64_t d = first_ms;
    for (int i = 1; i < attempt && d < max_ms; i++)
        d *= 2;
    if (max_ms > 0 && d > max_ms)
        d = max_ms;
    return d > 0 ? d + (int64_t)(noise % (uint64_t)(d / 5 + 1)) : d;
}

int64_t kiln_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000LL + ts.tv_nsec / 1000000L;
}

/* Not time(NULL): glibc reads it from the kernel's coarse clock, which lags
 * CLOCK_REALTIME by up to a tick, so just after a second begins it still
 * says the one before. kilnd wakes at a fire's second by kiln_now_ms and
 * records the run's queued_at by this: one clock, or a run is queued a
 * second before it was scheduled. */
int64_t kiln_now_s(void)
{
    return kiln_now_ms() / 1000;
}

/* Counts days in 400-year eras starting on March 1st so that the leap day is
 * the last day of a "year" and month lengths follow a fixed pattern. */
int64_t kiln_days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);                    /* [0, 399] */
    unsigned mp = m > 2 ? m - 3 : m + 9;                         /* March = 0 */
    unsigned doy = (153 * mp + 2) / 5 + d - 1;                   /* [0, 365] */
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;        /* [0, 146096] */
    return era * 146097 + (int64_t)doe - 719468;
}

void kiln_civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

char *kiln_time_iso(int64_t t, char *buf, size_t bufsz)
{
    int64_t days = t >= 0 ? t / 86400 : -((-t + 86399) / 86400);
    int64_t secs = t - days * 86400;
    int64_t y;
    unsigned m, d;
    kiln_civil_from_days(days, &y, &m, &d);
    snprintf(buf, bufsz, "%04" PRId64 "-%02u-%02uT%02d:%02d:%02dZ", y, m, d,
             (int)(secs / 3600), (int)(secs / 60 % 60), (int)(secs % 60));
    return buf;
}

static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)**p))
            return -1;
        v = v * 10 + (**p - '0');
        (*p)++;
    }
    *out = v;
    return 0;
}

static int days_in_month(int64_t y, unsigned m)
{
    static const int dm[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return dm[m - 1] + (m == 2 && leap);
}

int kiln_time_parse_iso(const char *s, int64_t *out)
{
    const char *p = s;
    int y, mo, d, h = 0, mi = 0, sec = 0;
    if (digits(&p, 4, &y) || *p++ != '-' || digits(&p, 2, &mo) || *p++ != '-' ||
        digits(&p, 2, &d))
        goto bad;
    if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, (unsigned)mo))
        goto bad;
    int offset = 0;
    if (*p == '\0')
        goto done;
    if (*p != 'T' && *p != 't' && *p != ' ')
        goto bad;
    p++;
    if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &mi))
        goto bad;
    if (*p == ':') {
        p++;
        if (digits(&p, 2, &sec))
            goto bad;
        if (*p == '.' || *p == ',') {
            p++;
            if (!isdigit((unsigned char)*p))
                goto bad;
            while (isdigit((unsigned char)*p))
                p++;
        }
    }
    if (h > 23 || mi > 59 || sec > 60)
        goto bad;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1, oh, om = 0;
        if (digits(&p, 2, &oh))
            goto bad;
        if (*p == ':')
            p++;
        if (*p != '\0' && digits(&p, 2, &om))
            goto bad;
        if (oh > 23 || om > 59)
            goto bad;
        offset = sign * (oh * 3600 + om * 60);
    } else {
        goto bad; /* an instant without a zone is ambiguous: refuse it */
    }
    if (*p != '\0')
        goto bad;
done:
    *out = kiln_days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400 + h * 3600 + mi * 60 +
           (sec == 60 ? 59 : sec) - offset;
    return 0;
bad:
    return kiln_errf(KILN_EINVAL,
                     "'%s' is not an ISO 8601 instant (expected e.g. 2024-05-02T00:00:00Z)", s);
}

static const struct {
    const char *name;
    int64_t ms;
} duration_units[] = {
    {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000},
};

int kiln_duration_parse(const char *s, int64_t *out)
{
    const char *p = s;
    int64_t total = 0;
    int parts = 0;
    if (s == NULL || *s == '\0')
        goto bad;
    while (*p != '\0') {
        if (!isdigit((unsigned char)*p))
            goto bad;
        int64_t v = 0;
        while (isdigit((unsigned char)*p)) {
            if (v > INT64_MAX / 10 - 10)
                goto range;
            v = v * 10 + (*p++ - '0');
        }
        int64_t unit = 0;
        if (*p == '\0' && parts == 0) {
            unit = 1000; /* a bare number is seconds */
        } else {
            size_t best = 0;
            for (size_t i = 0; i < sizeof duration_units / sizeof duration_units[0]; i++) {
                size_t n = strlen(duration_units[i].name);
                if (strncmp(p, duration_units[i].name, n) == 0 && n > best) {
                    best = n;
                    unit = duration_units[i].ms;
                }
            }
            if (best == 0)
                goto bad;
            p += best;
        }
        if (v > (INT64_MAX - total) / unit)
            goto range;
        total += v * unit;
        parts++;
    }
    *out = total;
    return 0;
bad:
    return kiln_errf(KILN_EINVAL,
                     "'%s' is not a duration (expected e.g. 30s, 5m, 2h, 1h30m, 500ms)",
                     s ? s : "");
range:
    return kiln_errf(KILN_ERANGE, "duration '%s' is too large", s);
}

char *kiln_duration_format(int64_t ms, char *buf, size_t bufsz)
{
    if (ms % 1000 != 0 || ms == 0) {
        snprintf(buf, bufsz, "%" PRId64 "ms", ms);
        return buf;
    }
    int64_t s = ms / 1000;
    size_t n = 0;
    static const struct {
        char unit;
        int64_t secs;
    } parts[] = {{'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}};
    buf[0] = '\0';
    for (size_t i = 0; i < 4 && n < bufsz; i++) {
        if (s >= parts[i].secs) {
            n += (size_t)snprintf(buf + n, bufsz - n, "%" PRId64 "%c", s / parts[i].secs,
                                  parts[i].unit);
            s %= parts[i].secs;
        }
    }
    return buf;
}
