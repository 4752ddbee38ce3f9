/*
 * jobs/cron.c - cron expressions: parsing (5-field Vixie cron, @macros,
 * "@every <duration>"), timezones (UTC, fixed offsets, IANA zones from the
 * system zoneinfo) and the search for the next fire time.
 *
 * The search works on a naive calendar (days since 1970-01-01 plus a
 * minute of the day) and skips whole months, days and hours that cannot
 * match, so even a rare expression costs a few thousand steps at most.
 * Zones map that naive "wall clock" to real instants: a fixed offset is a
 * subtraction; an IANA zone asks libc (localtime_r under TZ=<zone>, guarded
 * by a mutex) and applies the DST rules documented in docs/cron.md:
 * a wall time skipped by a spring-forward jump fires once at the jump, a
 * wall time repeated by a fall-back fires once, at its first occurrence.
 *
 * Only libc and common/kiln.h are used here, so that the cron tests need no
 * libyaml.
 */
#include "jobs.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln.h"

/* ---- fields ------------------------------------------------------------------ */

static const char *const month_names[] = {"jan", "feb", "mar", "apr", "may", "jun", "jul",
                                          "aug", "sep", "oct", "nov", "dec", NULL};
static const char *const dow_names[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat", NULL};

/* One of the five fields: its name in messages, its range and its names
 * (names[i] is the value names_base + i). */
typedef struct field_def {
    const char *name;
    int min, max;
    const char *const *names;
    int names_base;
} field_def_t;

enum { F_MINUTE, F_HOUR, F_DOM, F_MONTH, F_DOW, NFIELDS };

static const field_def_t fields[NFIELDS] = {
    {"minute", 0, 59, NULL, 0},
    {"hour", 0, 23, NULL, 0},
    {"day-of-month", 1, 31, NULL, 0},
    {"month", 1, 12, month_names, 1},
    {"day-of-week", 0, 7, dow_names, 0}, /* 7 is Sunday too; folded into bit 0 */
};

/* The @macros and the 5-field expression each stands for. */
static const struct {
    const char *name;
    const char *expr;
} macros[] = {
    {"@yearly", "0 0 1 1 *"},  {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"},  {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};
#define NMACROS (sizeof macros / sizeof macros[0])

static const char *const macro_names[] = {"@yearly", "@annually", "@monthly", "@weekly", "@daily",
                                          "@midnight", "@hourly", "@every", NULL};

#define MAX_YEAR_S INT64_C(253402300799) /* 9999-12-31T23:59:59Z */
#define MIN_YEAR_S INT64_C(-62135596800) /* 0001-01-01T00:00:00Z */
#define SEARCH_DAYS (8 * 366 + 1)

/* Returns the name closest to word: a likely typo by kiln_did_you_mean
 * (which counts two swapped letters, "jnu" -> "jun", as one edit), or the
 * abbreviation of a full name ("friday" -> "fri"). */
static const char *suggest_name(const char *word, const char *const *names)
{
    const char *hint = kiln_did_you_mean(word, names);
    if (hint != NULL || strlen(word) <= 3)
        return hint;
    for (int j = 0; names[j] != NULL; j++)
        if (strncmp(word, names[j], 3) == 0)
            return names[j]; /* a full name: "friday" -> "fri" */
    return NULL;
}

/* Parses one value of field f (a number or, where the field has names, a
 * name) from s[*i..n). Returns 0 or KILN_ECRON. */
static int parse_value(const field_def_t *f, const char *s, size_t n, size_t *i, int *out)
{
    size_t start = *i;
    if (*i < n && isdigit((unsigned char)s[*i])) {
        long v = 0;
        while (*i < n && isdigit((unsigned char)s[*i])) {
            if (v < 100000)
                v = v * 10 + (s[*i] - '0');
            (*i)++;
        }
        if (v < f->min || v > f->max)
            return kiln_errf(KILN_ECRON, "%s: %.*s is out of range %d-%d", f->name,
                             (int)(*i - start), s + start, f->min, f->max);
        *out = (int)v;
        return 0;
    }
    if (*i < n && isalpha((unsigned char)s[*i])) {
        char word[16];
        size_t k = 0;
        while (*i < n && isalpha((unsigned char)s[*i])) {
            if (k + 1 < sizeof word)
                word[k++] = (char)tolower((unsigned char)s[*i]);
            (*i)++;
        }
        word[k] = '\0';
        if (f->names == NULL)
            return kiln_errf(KILN_ECRON, "%s: '%.*s' is not a number (names are allowed only in "
                             "the month and day-of-week fields)",
                             f->name, (int)(*i - start), s + start);
        for (int j = 0; f->names[j] != NULL; j++) {
            if (strcmp(word, f->names[j]) == 0) {
                *out = f->names_base + j;
                return 0;
            }
        }
        const char *hint = suggest_name(word, f->names);
        if (hint != NULL)
            return kiln_errf(KILN_ECRON, "%s: unknown name '%.*s' (did you mean '%s'?)", f->name,
                             (int)(*i - start), s + start, hint);
        return kiln_errf(KILN_ECRON, "%s: unknown name '%.*s' (expected %s..%s or a number)",
                         f->name, (int)(*i - start), s + start, f->names[0],
                         f->names == month_names ? "dec" : "sat");
    }
    if (*i >= n)
        return kiln_errf(KILN_ECRON, "%s: '%.*s' ends where a value was expected", f->name,
                         (int)n, s);
    return kiln_errf(KILN_ECRON, "%s: unexpected '%c' in '%.*s'", f->name, s[*i], (int)n, s);
}

/* Parses one list item: "*", "a", "a-b", each optionally followed by "/step"
 * ("a/step" means a-max/step, as Vixie cron and cronie read it). */
static int parse_item(const field_def_t *f, const char *s, size_t n, uint64_t *mask)
{
    size_t i = 0;
    int lo, hi, step = 1;
    if (n == 0)
        return kiln_errf(KILN_ECRON, "%s: empty item in the list", f->name);
    if (s[0] == '*') {
        lo = f->min;
        hi = f->max;
        i = 1;
    } else {
        KILN_CHECK(parse_value(f, s, n, &i, &lo));
        hi = lo;
        if (i < n && s[i] == '-') {
            i++;
            KILN_CHECK(parse_value(f, s, n, &i, &hi));
            if (hi < lo)
                return kiln_errf(KILN_ECRON, "%s: range '%.*s' runs backwards (write it as two "
                                 "ranges, e.g. %d-%d,%d-%d)",
                                 f->name, (int)n, s, lo, f->max, f->min, hi);
        } else if (i < n && s[i] == '/') {
            hi = f->max; /* "a/n" is "a-max/n" */
        }
    }
    if (i < n && s[i] == '/') {
        i++;
        size_t start = i;
        long v = 0;
        while (i < n && isdigit((unsigned char)s[i])) {
            if (v < 100000)
                v = v * 10 + (s[i] - '0');
            i++;
        }
        if (i == start)
            return kiln_errf(KILN_ECRON, "%s: '%.*s' needs a number after '/'", f->name, (int)n, s);
        if (v == 0)
            return kiln_errf(KILN_ECRON, "%s: step 0 is not allowed", f->name);
        if (v > f->max)
            return kiln_errf(KILN_ECRON, "%s: step %ld is out of range 1-%d", f->name, v, f->max);
        step = (int)v;
    }
    if (i < n)
        return kiln_errf(KILN_ECRON, "%s: unexpected '%c' in '%.*s'", f->name, s[i], (int)n, s);
    for (int v = lo; v <= hi; v += step)
        *mask |= UINT64_C(1) << v;
    return 0;
}

/* Parses a comma-separated field into a bit mask. */
static int parse_field(const field_def_t *f, const char *s, size_t n, uint64_t *mask /* OUT */)
{
    *mask = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || s[i] == ',') {
            if (i == start)
                return kiln_errf(KILN_ECRON, "%s: empty item in the list '%.*s'", f->name, (int)n,
                                 s);
            KILN_CHECK(parse_item(f, s + start, i - start, mask));
            start = i + 1;
        }
    }
    return 0;
}

/* Rejects a day-of-month that no selected month has (0 0 30 2 *). Only when
 * day-of-week is '*': otherwise either the weekday also has to match (still
 * possible) or it is the union (always possible). */
static int check_possible(const job_cron_t *c, const char *dom, size_t ndom, const char *mon,
                          size_t nmon)
{
    static const int longest[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (c->dom_star || !c->dow_star)
        return 0;
    for (int m = 1; m <= 12; m++) {
        if (!(c->months & (1u << m)))
            continue;
        uint32_t fits = (uint32_t)((UINT64_C(2) << longest[m]) - 2); /* bits 1..longest */
        if (c->doms & fits)
            return 0;
    }
    return kiln_errf(KILN_ECRON, "day-of-month: '%.*s' never occurs in month '%.*s', so the "
                     "expression can never fire",
                     (int)ndom, dom, (int)nmon, mon);
}

static int parse_fields(const char *expr, job_cron_t *c)
{
    const char *tok[NFIELDS];
    size_t len[NFIELDS];
    int count = 0;
    const char *p = expr;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == '\0')
            break;
        const char *start = p;
        while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            p++;
        if (count < NFIELDS) {
            tok[count] = start;
            len[count] = (size_t)(p - start);
        }
        count++;
    }
    if (count == 0)
        return kiln_errf(KILN_ECRON, "the expression is empty (expected 5 fields: minute hour "
                         "day-of-month month day-of-week, or a macro such as @daily)");
    if (count != NFIELDS)
        return kiln_errf(KILN_ECRON, "expected 5 fields, got %d (minute hour day-of-month month "
                         "day-of-week%s)",
                         count, count > NFIELDS ? "; Kiln has no seconds or year field" : "");
    uint64_t mask[NFIELDS];
    for (int f = 0; f < NFIELDS; f++)
        KILN_CHECK(parse_field(&fields[f], tok[f], len[f], &mask[f]));
    c->minutes = mask[F_MINUTE];
    c->hours = (uint32_t)mask[F_HOUR];
    c->doms = (uint32_t)mask[F_DOM];
    c->months = (uint16_t)mask[F_MONTH];
    c->dows = (uint8_t)((mask[F_DOW] | (mask[F_DOW] >> 7)) & 0x7f); /* 7 -> Sunday */
    /* Vixie's rule: a day field is "unrestricted" when its text starts with '*'. */
    c->dom_star = tok[F_DOM][0] == '*';
    c->dow_star = tok[F_DOW][0] == '*';
    return check_possible(c, tok[F_DOM], len[F_DOM], tok[F_MONTH], len[F_MONTH]);
}

static int parse_every(const char *arg, job_cron_t *c)
{
    int64_t ms = 0;
    while (*arg == ' ' || *arg == '\t')
        arg++;
    size_t n = strlen(arg);
    while (n > 0 && (arg[n - 1] == ' ' || arg[n - 1] == '\t' || arg[n - 1] == '\n'))
        n--;
    char buf[64];
    if (n == 0)
        return kiln_errf(KILN_ECRON, "@every: missing duration (e.g. @every 30s, @every 1h30m)");
    if (n >= sizeof buf)
        return kiln_errf(KILN_ECRON, "@every: duration '%.*s...' is too long", 20, arg);
    memcpy(buf, arg, n);
    buf[n] = '\0';
    if (kiln_duration_parse(buf, &ms) < 0)
        return kiln_errf(KILN_ECRON, "@every: '%s' is not a duration (expected e.g. 30s, 5m, "
                         "1h30m, 1d)",
                         buf);
    if (ms < 1000)
        return kiln_errf(KILN_ECRON, "@every: %s is below the minimum of 1s", buf);
    if (ms % 1000 != 0)
        return kiln_errf(KILN_ECRON, "@every: %s is not a whole number of seconds", buf);
    c->every_s = ms / 1000;
    return 0;
}

int job_cron_parse(const char *expr, job_cron_t *out)
{
    job_cron_t c;
    memset(&c, 0, sizeof c);
    memset(out, 0, sizeof *out);
    if (expr == NULL)
        return kiln_errf(KILN_ECRON, "no cron expression given");
    while (*expr == ' ' || *expr == '\t')
        expr++;
    if (expr[0] == '@') {
        size_t n = 1;
        while (expr[n] != '\0' && expr[n] != ' ' && expr[n] != '\t' && expr[n] != '\n')
            n++;
        char word[32];
        size_t k = 0;
        for (size_t i = 0; i < n && k + 1 < sizeof word; i++)
            word[k++] = (char)tolower((unsigned char)expr[i]);
        word[k] = '\0';
        if (strcmp(word, "@every") == 0) {
            KILN_CHECK(parse_every(expr + n, &c));
            *out = c;
            return 0;
        }
        const char *rest = expr + n;
        while (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r')
            rest++;
        for (size_t i = 0; i < NMACROS; i++) {
            if (strcmp(word, macros[i].name) == 0) {
                if (*rest != '\0')
                    return kiln_errf(KILN_ECRON, "%s takes no arguments, got '%s'", macros[i].name,
                                     rest);
                KILN_CHECK(parse_fields(macros[i].expr, &c));
                *out = c;
                return 0;
            }
        }
        if (strcmp(word, "@reboot") == 0)
            return kiln_errf(KILN_ECRON, "@reboot is not supported (a Kiln schedule needs fire "
                             "times; submit a one-off job instead)");
        const char *hint = kiln_did_you_mean(word, macro_names);
        if (hint != NULL)
            return kiln_errf(KILN_ECRON, "unknown macro '%.*s' (did you mean %s?)", (int)n, expr,
                             hint);
        return kiln_errf(KILN_ECRON, "unknown macro '%.*s' (expected @yearly, @annually, "
                         "@monthly, @weekly, @daily, @midnight, @hourly or @every <duration>)",
                         (int)n, expr);
    }
    KILN_CHECK(parse_fields(expr, &c));
    *out = c;
    return 0;
}

/* ---- timezones ------------------------------------------------------------------ */

/* Parses "+HH[:MM]" / "-HH[:MM]" into seconds east of UTC. */
static int parse_offset(const char *s, int *out)
{
    int sign = s[0] == '+' ? 1 : s[0] == '-' ? -1 : 0;
    if (sign == 0)
        return -1;
    s++;
    if (!isdigit((unsigned char)s[0]))
        return -1;
    int h = s[0] - '0', m = 0;
    s++;
    if (isdigit((unsigned char)s[0]))
        h = h * 10 + (*s++ - '0');
    if (*s == ':') {
        s++;
        if (!isdigit((unsigned char)s[0]) || !isdigit((unsigned char)s[1]))
            return -1;
        m = (s[0] - '0') * 10 + (s[1] - '0');
        s += 2;
    }
    if (*s != '\0' || h > 14 || m > 59 || (h == 14 && m > 0))
        return -1;
    *out = sign * (h * 3600 + m * 60);
    return 0;
}

/* True when name is a plausible zone name that names a TZif file. */
static bool zone_exists(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof(((job_cron_t *)0)->tz_name) || name[0] == '/' ||
        strstr(name, "..") != NULL)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (!isalnum(ch) && ch != '/' && ch != '_' && ch != '-' && ch != '+')
            return false;
    }
    const char *dir = getenv("TZDIR");
    if (dir == NULL || dir[0] == '\0')
        dir = "/usr/share/zoneinfo";
    char path[512];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return false;
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return false;
    char magic[4] = {0};
    size_t got = fread(magic, 1, sizeof magic, fp);
    fclose(fp);
    return got == 4 && memcmp(magic, "TZif", 4) == 0;
}

int job_cron_set_timezone(job_cron_t *c, const char *tz)
{
    int off = 0;
    if (tz == NULL || tz[0] == '\0' || strcmp(tz, "UTC") == 0 || strcmp(tz, "Z") == 0) {
        c->tz_offset_s = 0;
        c->tz_name[0] = '\0';
        return 0;
    }
    if (strncmp(tz, "UTC", 3) == 0 && (tz[3] == '+' || tz[3] == '-')) {
        if (parse_offset(tz + 3, &off) < 0)
            return kiln_errf(KILN_EINVAL, "timezone: bad offset in '%s' (expected UTC+HH:MM or "
                             "UTC-HH:MM, at most 14 hours)",
                             tz);
        c->tz_offset_s = off;
        c->tz_name[0] = '\0';
        return 0;
    }
    if (!zone_exists(tz))
        return kiln_errf(KILN_EINVAL, "timezone: unknown zone '%s' (expected UTC, UTC+HH:MM or an "
                         "IANA name such as Europe/Berlin)",
                         tz);
    c->tz_offset_s = 0;
    snprintf(c->tz_name, sizeof c->tz_name, "%s", tz);
    return 0;
}

/* ---- the search ----------------------------------------------------------------- */

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* Lowest set bit of mask at position >= from, or -1. */
static int next_bit(uint64_t mask, int from)
{
    if (from > 63)
        return -1;
    uint64_t m = mask >> from;
    return m == 0 ? -1 : from + __builtin_ctzll(m);
}

static bool day_matches(const job_cron_t *c, int64_t day, unsigned d)
{
    int wday = (int)(((day % 7) + 11) % 7); /* 1970-01-01 was a Thursday (4) */
    bool dom = (c->doms >> d) & 1u;
    bool dow = (c->dows >> wday) & 1u;
    if (c->dom_star || c->dow_star)
        return dom && dow;
    return dom || dow;
}

/* First minute matching c strictly after naive time t (seconds on a clock
 * with no zone). Returns 0 or KILN_ERANGE past 8 years or year 9999. */
static int naive_next(const job_cron_t *c, int64_t t, int64_t *out)
{
    int64_t minute = floor_div(t, 60) + 1;
    int64_t day = floor_div(minute, 1440);
    int mod = (int)(minute - day * 1440);
    int h = mod / 60, mi = mod % 60;
    int64_t last_day = day + SEARCH_DAYS;
    if (last_day > MAX_YEAR_S / 86400)
        last_day = MAX_YEAR_S / 86400;
    while (day <= last_day) {
        int64_t y;
        unsigned m, d;
        kiln_civil_from_days(day, &y, &m, &d);
        if (!((c->months >> m) & 1u)) {
            day = m == 12 ? kiln_days_from_civil(y + 1, 1, 1) : kiln_days_from_civil(y, m + 1, 1);
            h = mi = 0;
            continue;
        }
        if (!day_matches(c, day, d)) {
            day++;
            h = mi = 0;
            continue;
        }
        int hh = next_bit(c->hours, h);
        if (hh < 0 || hh > 23) {
            day++;
            h = mi = 0;
            continue;
        }
        if (hh != h) {
            h = hh;
            mi = 0;
        }
        int mm = next_bit(c->minutes, mi);
        if (mm < 0 || mm > 59) {
            mi = 0;
            if (++h == 24) {
                day++;
                h = 0;
            }
            continue;
        }
        *out = day * 86400 + h * 3600 + mm * 60;
        return 0;
    }
    char buf[KILN_ISO_LEN];
    return kiln_errf(KILN_ERANGE, "cron: no fire time within 8 years after %s",
                     kiln_time_iso(t, buf, sizeof buf));
}

/* Offset east of UTC of zone (TZ already set) at instant t. */
static int64_t zone_offset(int64_t t)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (localtime_r(&tt, &tm) == NULL)
        return 0;
    return tm.tm_gmtoff;
}

/* Maps a wall time of the zone to an instant: the first occurrence when the
 * wall time repeats (fall back), the instant of the jump when it was skipped
 * (spring forward). Assumes at most one offset change within a day. */
static int64_t wall_to_instant(int64_t wall)
{
    int64_t before = zone_offset(wall - 86400), after = zone_offset(wall + 86400);
    int64_t u1 = wall - before, u2 = wall - after;
    bool ok1 = zone_offset(u1) == before, ok2 = zone_offset(u2) == after;
    if (ok1 && ok2)
        return u1 < u2 ? u1 : u2;
    if (ok1)
        return u1;
    if (ok2)
        return u2;
    if (before >= after)
        return u1; /* not a gap we understand; keep the old offset */
    /* A gap: the jump T lies in (u2, u1]; find the first instant past it. */
    int64_t lo = u2, hi = u1;
    int64_t off_lo = zone_offset(lo);
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (zone_offset(mid) == off_lo)
            lo = mid;
        else
            hi = mid;
    }
    return hi;
}

static pthread_mutex_t tz_lock = PTHREAD_MUTEX_INITIALIZER;

/* Next fire time in an IANA zone. Called with TZ set to the zone. */
static int zone_next(const job_cron_t *c, int64_t after, int64_t *next)
{
    int64_t wall = after + zone_offset(after);
    /* Wall times map to instants monotonically, and the wall time of `after`
     * maps to `after` or earlier, so the answer is the first matching wall
     * time after it whose instant lies after `after`. */
    for (int iter = 0; iter < 100000; iter++) {
        KILN_CHECK(naive_next(c, wall, &wall));
        int64_t u = wall_to_instant(wall);
        if (u > after) {
            *next = u;
            return 0;
        }
    }
    return kiln_errf(KILN_EINTERNAL, "cron: search in zone '%s' did not converge", c->tz_name);
}

static int next_in_zone(const job_cron_t *c, int64_t after, int64_t *next)
{
    char saved[256];
    char want[sizeof c->tz_name + 1];
    snprintf(want, sizeof want, ":%s", c->tz_name);

    pthread_mutex_lock(&tz_lock);
    const char *old = getenv("TZ");
    bool had_old = old != NULL;
    if (had_old)
        snprintf(saved, sizeof saved, "%s", old);
    int rc = KILN_EINTERNAL;
    if (setenv("TZ", want, 1) != 0) {
        rc = kiln_errf(KILN_ENOMEM, "cron: cannot set TZ to select zone '%s'", c->tz_name);
        goto out;
    }
    tzset();
    rc = zone_next(c, after, next);
out:
    if (had_old)
        setenv("TZ", saved, 1);
    else
        unsetenv("TZ");
    tzset();
    pthread_mutex_unlock(&tz_lock);
    return rc;
}

int job_cron_next(const job_cron_t *c, int64_t after, int64_t *next)
{
    char buf[KILN_ISO_LEN];
    if (after < MIN_YEAR_S || after >= MAX_YEAR_S)
        return kiln_errf(KILN_ERANGE, "cron: %s is outside the years 1-9999",
                         kiln_time_iso(after, buf, sizeof buf));
    if (c->every_s > 0) {
        int64_t t = (floor_div(after, c->every_s) + 1) * c->every_s;
        if (t > MAX_YEAR_S)
            return kiln_errf(KILN_ERANGE, "cron: no fire time before the year 10000");
        *next = t;
        return 0;
    }
    if (c->tz_name[0] != '\0')
        return next_in_zone(c, after, next);
    int64_t t;
    KILN_CHECK(naive_next(c, after + c->tz_offset_s, &t));
    *next = t - c->tz_offset_s;
    return 0;
}

int64_t job_next_fire(const char *schedule, const char *tz, int64_t after)
{
    job_cron_t c;
    int64_t next = 0;
    if (schedule == NULL || job_cron_parse(schedule, &c) < 0 ||
        (tz != NULL && job_cron_set_timezone(&c, tz) < 0) || job_cron_next(&c, after, &next) < 0) {
        kiln_errclear();
        return 0;
    }
    return next;
}
