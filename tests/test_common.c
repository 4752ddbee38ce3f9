/*
 * tests/test_common.c - common/: error names and messages, durations, ISO
 * instants and civil dates, xxh64 (against the reference vectors published
 * with xxHash), did-you-mean and the log line format.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kiln.h"
#include "proc.h"

static void test_errors(void **state)
{
    (void)state;
    assert_string_equal(kiln_strerror(KILN_OK), "success");
    assert_string_equal(kiln_strerror(KILN_ENOENT), "not found");
    assert_string_equal(kiln_errname(KILN_ESPEC), "KILN_ESPEC");
    assert_string_equal(kiln_strerror(-9999), "unknown error");
    kiln_errclear();
    assert_string_equal(kiln_errmsg(), "");
    int rc = kiln_errf(KILN_ENOENT, "no job named '%s'", "x");
    assert_int_equal(rc, KILN_ENOENT);
    assert_int_equal(kiln_errcode(), KILN_ENOENT);
    assert_string_equal(kiln_errmsg(), "no job named 'x'");
}

/* A message wrapped with its own text (`kiln_errf(rc, "ctx: %s", kiln_errmsg())`,
 * the way a caller adds context) reads as the context and then the whole
 * inner message, at any depth, wherever the inner message sits among the
 * arguments, and a wrap that overflows the buffer is cut, not garbled. */
static void test_errors_wrapped(void **state)
{
    (void)state;
    kiln_errf(KILN_EFULL, "table 'slot0' is full");
    kiln_errf(KILN_EFULL, "rank %d: %s", 1, kiln_errmsg());
    assert_string_equal(kiln_errmsg(), "rank 1: table 'slot0' is full");
    kiln_errf(kiln_errcode(), "run 7: %s", kiln_errmsg());
    assert_string_equal(kiln_errmsg(), "run 7: rank 1: table 'slot0' is full");
    assert_int_equal(kiln_errcode(), KILN_EFULL);
    /* The inner message after other arguments, and twice. */
    kiln_errf(KILN_EINVAL, "top layer must end in 1");
    kiln_errf(KILN_EINVAL, "%s/%s: %s (%s)", "dir", "f.kpush", kiln_errmsg(), kiln_errmsg());
    assert_string_equal(kiln_errmsg(),
                        "dir/f.kpush: top layer must end in 1 (top layer must end in 1)");
    /* A long inner message wrapped past the buffer is cut at its end. */
    char longmsg[1500];
    memset(longmsg, 'x', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    kiln_errf(KILN_EIO, "%s", longmsg);
    kiln_errf(KILN_EIO, "ctx: %s", kiln_errmsg());
    const char *m = kiln_errmsg();
    assert_int_equal(strncmp(m, "ctx: xxxx", 9), 0);
    assert_true(strlen(m) > 900);
    assert_int_equal(strspn(m + 5, "x"), strlen(m) - 5);
    kiln_errclear();
}

/* The Host check against DNS rebinding: the names of the bind address, and
 * those configured. */
static void test_host_allowed(void **state)
{
    (void)state;
    static const struct {
        const char *host, *bind, *allowed;
        bool ok;
    } cases[] = {
        {NULL, "127.0.0.1", NULL, true}, /* HTTP/1.0 without Host */
        {"127.0.0.1", "127.0.0.1", NULL, true},
        {"127.0.0.1:8480", "127.0.0.1", NULL, true},
        {"localhost:8480", "127.0.0.1", NULL, true},
        {"LocalHost.", "127.0.0.1", NULL, true},
        {"evil.example", "127.0.0.1", NULL, false},
        {"evil.example:8480", "127.0.0.1", NULL, false},
        {"127.0.0.2", "127.0.0.1", NULL, false},
        {"127.0.0.1.evil.example", "127.0.0.1", NULL, false},
        {"127.0.0.1:80x", "127.0.0.1", NULL, false},
        {"", "127.0.0.1", NULL, false},
        {"[::1]:8480", "::1", NULL, true},
        {"localhost", "::1", NULL, true},
        {"::1", "::1", NULL, false}, /* IPv6 needs brackets */
        {"[::1]", "127.0.0.1", NULL, false},
        {"10.1.2.3:8480", "10.1.2.3", NULL, true},
        {"localhost", "10.1.2.3", NULL, false},
        {"10.9.9.9", "0.0.0.0", NULL, true}, /* a wildcard bind: any address of the host */
        {"[fe80::1]", "::", NULL, true},
        {"localhost", "0.0.0.0", NULL, true},
        {"evil.example", "0.0.0.0", NULL, false},
        {"status.example:443", "127.0.0.1", "a.example, Status.Example.", true},
        {"b.example", "127.0.0.1", "a.example,status.example", false},
        {"anything.example", "127.0.0.1", "*", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (kiln_host_allowed(cases[i].host, cases[i].bind, cases[i].allowed) != cases[i].ok)
            fail_msg("Host '%s' bound to %s, allowed '%s': want %s", cases[i].host ? cases[i].host
                                                                                   : "(none)",
                     cases[i].bind, cases[i].allowed ? cases[i].allowed : "",
                     cases[i].ok ? "allowed" : "refused");
    char self[256] = "";
    if (gethostname(self, sizeof self - 1) == 0 && self[0] != '\0') {
        assert_true(kiln_host_allowed(self, "0.0.0.0", NULL));
        assert_false(kiln_host_allowed(self, "127.0.0.1", NULL) &&
                     strcasecmp(self, "localhost") != 0);
    }
    assert_int_equal(kiln_host_list_check("a.example,*,b.example:80", "--allow-host"), 0);
    assert_int_equal(kiln_host_list_check("", "--allow-host"), KILN_EINVAL);
    assert_int_equal(kiln_host_list_check("a.example,,b", "--allow-host"), KILN_EINVAL);
    assert_int_equal(kiln_host_list_check("http://a.example", "--allow-host"), KILN_EINVAL);
    assert_non_null(strstr(kiln_errmsg(), "--allow-host"));
}

static int check_fn(int v) { return v; }

static int uses_check(int v, int *reached)
{
    KILN_CHECK(check_fn(v));
    *reached = 1;
    return 0;
}

static void test_check_macros(void **state)
{
    (void)state;
    int reached = 0;
    assert_int_equal(uses_check(KILN_EIO, &reached), KILN_EIO);
    assert_int_equal(reached, 0);
    assert_int_equal(uses_check(0, &reached), 0);
    assert_int_equal(reached, 1);
}

/* The one backoff of runs (sched_run.c) and pushes (ops_deliver.c). */
static void test_backoff(void **state)
{
    (void)state;
    assert_int_equal(kiln_backoff_ms(1000, 8000, 1, 0), 1000);
    assert_int_equal(kiln_backoff_ms(1000, 8000, 3, 0), 4000);
    assert_int_equal(kiln_backoff_ms(1000, 8000, 10, 0), 8000); /* capped */
    assert_int_equal(kiln_backoff_ms(1000, 6000, 4, 0), 6000);  /* 8000 over the cap */
    assert_int_equal(kiln_backoff_ms(0, 8000, 5, 12345), 0);    /* no delay, no jitter */
    for (uint64_t noise = 0; noise < 5000; noise += 7) {
        int64_t d = kiln_backoff_ms(2000, 300000, 2, noise);
        assert_true(d >= 4000 && d <= 4800); /* up to 20 % jitter */
    }
}

static void test_durations(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {{"30s", 30000},   {"2h", 7200000}, {"1h30m", 5400000}, {"500ms", 500},
                {"45", 45000},    {"1d", 86400000}, {"5m", 300000},    {"1m30s", 90000}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t ms = -1;
        assert_int_equal(kiln_duration_parse(good[i].text, &ms), 0);
        assert_int_equal(ms, good[i].ms);
        char buf[64], back[64];
        kiln_duration_format(ms, buf, sizeof buf);
        int64_t again = -1;
        assert_int_equal(kiln_duration_parse(buf, &again), 0);
        assert_int_equal(again, ms);
        (void)back;
    }
    static const char *const bad[] = {"", "s", "10x", "-5s", "1.5h", "h1", "10 s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t ms;
        assert_int_equal(kiln_duration_parse(bad[i], &ms), KILN_EINVAL);
        assert_non_null(strstr(kiln_errmsg(), "not a duration"));
    }
    int64_t ms;
    assert_int_equal(kiln_duration_parse("99999999999999999999s", &ms), KILN_ERANGE);
    char buf[32];
    assert_string_equal(kiln_duration_format(5400000, buf, sizeof buf), "1h30m");
    assert_string_equal(kiln_duration_format(1500, buf, sizeof buf), "1500ms");
}

static void test_civil_dates(void **state)
{
    (void)state;
    assert_int_equal(kiln_days_from_civil(1970, 1, 1), 0);
    assert_int_equal(kiln_days_from_civil(2000, 3, 1), 11017);
    assert_int_equal(kiln_days_from_civil(1969, 12, 31), -1);
    /* Every day from 1900 to 2400 round-trips and advances by one. */
    int64_t start = kiln_days_from_civil(1900, 1, 1), end = kiln_days_from_civil(2400, 12, 31);
    int64_t py = 1899;
    unsigned pm = 12, pd = 31;
    for (int64_t z = start; z <= end; z++) {
        int64_t y;
        unsigned m, d;
        kiln_civil_from_days(z, &y, &m, &d);
        assert_int_equal(kiln_days_from_civil(y, m, d), z);
        int next_day = (y == py && m == pm && d == pd + 1);
        int next_month = (y == py && m == pm + 1 && d == 1);
        int next_year = (y == py + 1 && m == 1 && d == 1 && pm == 12 && pd == 31);
        assert_true(next_day || next_month || next_year);
        py = y, pm = m, pd = d;
    }
    /* 2000 was a leap year, 1900 and 2100 were not. */
    assert_int_equal(kiln_days_from_civil(2000, 3, 1) - kiln_days_from_civil(2000, 2, 28), 2);
    assert_int_equal(kiln_days_from_civil(1900, 3, 1) - kiln_days_from_civil(1900, 2, 28), 1);
    assert_int_equal(kiln_days_from_civil(2100, 3, 1) - kiln_days_from_civil(2100, 2, 28), 1);
}

static void test_iso_instants(void **state)
{
    (void)state;
    char buf[KILN_ISO_LEN];
    assert_string_equal(kiln_time_iso(0, buf, sizeof buf), "1970-01-01T00:00:00Z");
    assert_string_equal(kiln_time_iso(1714608000, buf, sizeof buf), "2024-05-02T00:00:00Z");
    assert_string_equal(kiln_time_iso(951782400, buf, sizeof buf), "2000-02-29T00:00:00Z");
    assert_string_equal(kiln_time_iso(-1, buf, sizeof buf), "1969-12-31T23:59:59Z");
    static const struct {
        const char *text;
        int64_t t;
    } good[] = {
        {"2024-05-02T00:00:00Z", 1714608000},     {"2024-05-02T02:00:00+02:00", 1714608000},
        {"2024-05-01T19:00:00-05:00", 1714608000}, {"2024-05-02", 1714608000},
        {"2024-05-02 00:00Z", 1714608000},        {"2024-05-02T00:00:00.250Z", 1714608000},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t t = 0;
        assert_int_equal(kiln_time_parse_iso(good[i].text, &t), 0);
        assert_int_equal(t, good[i].t);
    }
    static const char *const bad[] = {"2024-13-01T00:00:00Z", "2023-02-29", "2024-05-02T00:00:00",
                                      "yesterday", "2024-05-02T24:00Z", "2024-05-02T00:00:00Zx"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t t;
        assert_int_equal(kiln_time_parse_iso(bad[i], &t), KILN_EINVAL);
    }
}

static void test_xxh64(void **state)
{
    (void)state;
    /* Reference values of XXH64 from the xxHash specification's examples. */
    assert_true(kiln_xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL);
    assert_true(kiln_xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5BULL);
    assert_true(kiln_xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ULL);
    char hex[17];
    assert_string_equal(kiln_hash_hex(0xEF46DB3751D8E999ULL, hex, sizeof hex), "ef46db3751d8e999");
    uint64_t back = 0;
    assert_int_equal(kiln_hash_parse_hex(hex, &back), 0);
    assert_true(back == 0xEF46DB3751D8E999ULL);
    assert_int_equal(kiln_hash_parse_hex("xyz", &back), KILN_EINVAL);

    /* Streaming and file hashing agree with one-shot hashing. */
    char data[100000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (char)(i * 7 + 3);
    kiln_hasher_t *h = kiln_hasher_create(42);
    assert_non_null(h);
    for (size_t off = 0; off < sizeof data; off += 333)
        kiln_hasher_update(h, data + off, off + 333 <= sizeof data ? 333 : sizeof data - off);
    assert_true(kiln_hasher_digest(h) == kiln_xxh64(data, sizeof data, 42));
    kiln_hasher_destroy(h);
    kiln_hasher_destroy(NULL);

    char path[] = "/tmp/kiln-test-common-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, sizeof data), (ssize_t)sizeof data);
    close(fd);
    uint64_t fh = 0, size = 0;
    assert_int_equal(kiln_xxh64_file(path, 42, &fh, &size), 0);
    assert_true(fh == kiln_xxh64(data, sizeof data, 42));
    assert_int_equal(size, sizeof data);
    unlink(path);
    assert_int_equal(kiln_xxh64_file(path, 42, &fh, NULL), KILN_ENOENT);
    assert_non_null(strstr(kiln_errmsg(), path));
}

/* kiln_now_s and kiln_now_ms read one clock: a second read after a
 * millisecond one is never in an earlier second (time() reads a coarse
 * clock that lags by up to a tick, so it was, right after each second).
 * Spins across at least one second boundary. */
static void test_now_one_clock(void **state)
{
    (void)state;
    int64_t start = kiln_now_ms();
    while (kiln_now_ms() - start < 1100) {
        int64_t ms = kiln_now_ms(), s = kiln_now_s();
        if (s < ms / 1000)
            fail_msg("kiln_now_s() %lld after kiln_now_ms() %lld", (long long)s, (long long)ms);
    }
}

static void test_did_you_mean(void **state)
{
    (void)state;
    static const char *const keys[] = {"concurrency", "catchup", "schedule", "priority", NULL};
    assert_string_equal(kiln_did_you_mean("concurency", keys), "concurrency");
    assert_string_equal(kiln_did_you_mean("schedul", keys), "schedule");
    assert_string_equal(kiln_did_you_mean("prority", keys), "priority");
    assert_null(kiln_did_you_mean("banana", keys));
    assert_int_equal(kiln_edit_distance("kitten", "sitting"), 3);
    assert_int_equal(kiln_edit_distance("", "abc"), 3);
    /* Damerau (optimal string alignment): a swap of neighbours is one edit,
     * and no substring is edited twice ("ca" -> "abc" is 3, not 2). */
    assert_int_equal(kiln_edit_distance("trian", "train"), 1);
    assert_int_equal(kiln_edit_distance("mdoel", "model"), 1);
    assert_int_equal(kiln_edit_distance("ca", "abc"), 3);
    static const char *const fields[] = {"name", "data", "model", "train", NULL};
    assert_string_equal(kiln_did_you_mean("trian", fields), "train");
    assert_string_equal(kiln_did_you_mean("mdoel", fields), "model");
}

/* Bytes that are not UTF-8 become '?', one each; whole characters stay. */
static void test_utf8_scrub(void **state)
{
    (void)state;
    char ok[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xa5";
    assert_string_equal(kiln_utf8_scrub(ok), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xa5");
    char cut[] = "name \"ab\xc3"; /* "%.80s" cut an e-acute in two */
    assert_string_equal(kiln_utf8_scrub(cut), "name \"ab?");
    char bad[] = "\x80x\xc0\xafy\xed\xa0\x80z\xf4\x90\x80\x80";
    assert_string_equal(kiln_utf8_scrub(bad), "?x??y???z????");
    /* kiln_errf makes its message whole again after a cut. */
    kiln_errf(KILN_EINVAL, "\"%.3s\" is bad", "ab\xc3\xa9");
    assert_string_equal(kiln_errmsg(), "\"ab?\" is bad");
}

static void *counted_alloc(int *n)
{
    ++*n;
    return kiln_malloc(16);
}

static void test_alloc(void **state)
{
    (void)state;
    assert_null(kiln_calloc(SIZE_MAX / 2, 4));
    assert_int_equal(kiln_errcode(), KILN_ENOMEM);
    char *s = kiln_asprintf("%s-%d", "run", 7);
    assert_string_equal(s, "run-7");
    free(s);
    s = kiln_strndup("abcdef", 3);
    assert_string_equal(s, "abc");
    free(s);
    /* Each argument is evaluated once (ASan's leak check sees the frees). */
    int made = 0;
    KILN_FREE_ALL(counted_alloc(&made), NULL, counted_alloc(&made));
    assert_int_equal(made, 2);
    /* A list of strings goes with its strings (ASan again); NULL is none. */
    char **v = kiln_calloc(3, sizeof *v);
    assert_non_null(v);
    v[0] = kiln_strdup("a");
    v[2] = kiln_strdup("c");
    kiln_strv_free(v, 3);
    kiln_strv_free(NULL, 3);
}

static void test_log_file(void **state)
{
    (void)state;
    char path[] = "/tmp/kiln-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kiln_log_open(path, KILN_LOG_INFO), 0);
    KILN_DEBUG("hidden %d", 1);
    KILN_WARN("visible %d", 2);
    kiln_log_close();
    FILE *f = fopen(path, "r");
    char line[256] = "";
    assert_non_null(fgets(line, sizeof line, f));
    assert_null(fgets(line + 128, 128, f)); /* exactly one line */
    fclose(f);
    unlink(path);
    /* "2024-05-02T00:00:00.123Z warn  visible 2" */
    assert_int_equal(strlen(line) > 25, 1);
    assert_int_equal(line[4], '-');
    assert_int_equal(line[19], '.');
    assert_int_equal(line[23], 'Z');
    assert_non_null(strstr(line, "warn  visible 2\n"));
    kiln_log_level_t lv;
    assert_int_equal(kiln_log_level_parse("debug", &lv), 0);
    assert_int_equal(lv, KILN_LOG_DEBUG);
    assert_int_equal(kiln_log_level_parse("loud", &lv), KILN_EINVAL);
    assert_int_equal(kiln_log_open("/nonexistent/dir/log", KILN_LOG_INFO), KILN_EIO);
    kiln_log_set_level(KILN_LOG_INFO);
}

/* kiln_atomic_*: the old file stays until commit, the new one replaces it
 * whole, an abort or a failed commit leaves no temporary file behind. */
static void test_atomic_write(void **state)
{
    (void)state;
    char dir[] = "/tmp/kiln-test-atomic-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64], text[64];
    snprintf(path, sizeof path, "%s/f.json", dir);
    assert_int_equal(kiln_write_atomic(path, "old\n", 4), 0);

    kiln_atomic_t a;
    assert_int_equal(kiln_atomic_open(path, &a), 0);
    assert_non_null(strstr(a.tmp, "/f.json.tmp."));
    fputs("new\n", a.f);
    FILE *f = fopen(path, "r"); /* before commit: the old file, whole */
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_string_equal(text, "old\n");
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s", a.tmp);
    assert_int_equal(kiln_atomic_commit(&a), 0);
    assert_null(a.f); /* committed: nothing held */
    assert_int_equal(access(tmp, F_OK), -1);
    f = fopen(path, "r");
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_string_equal(text, "new\n");

    assert_int_equal(kiln_atomic_open(path, &a), 0); /* abort: the file stays */
    fputs("lost\n", a.f);
    snprintf(tmp, sizeof tmp, "%s", a.tmp);
    kiln_atomic_abort(&a);
    kiln_atomic_abort(&a); /* twice is harmless */
    assert_int_equal(access(tmp, F_OK), -1);
    f = fopen(path, "r");
    assert_non_null(fgets(text, sizeof text, f));
    fclose(f);
    assert_string_equal(text, "new\n");

    /* A directory that does not exist: a clear error naming the file. */
    char bad[96];
    snprintf(bad, sizeof bad, "%s/no/such/f.json", dir);
    assert_int_equal(kiln_atomic_open(bad, &a), KILN_EIO);
    assert_non_null(strstr(kiln_errmsg(), "no/such/f.json.tmp."));
    assert_int_equal(kiln_write_atomic(bad, "x", 1), KILN_EIO);
    assert_int_equal(kiln_fsync_dir(dir), 0);
    unlink(path);
    rmdir(dir);
}

PROC_TEST_MAIN_EACH(NULL, NULL, NULL, NULL,
    test_errors, test_errors_wrapped, test_check_macros, test_host_allowed, test_durations,
    test_civil_dates, test_iso_instants, test_xxh64, test_did_you_mean, test_utf8_scrub, test_alloc,
    test_now_one_clock, test_backoff, test_log_file, test_atomic_write)
