/*
 * scheduler/sched_loop.c - kilnd's options and its one event loop. epoll
 * waits on: a signalfd (SIGCHLD, SIGTERM, SIGINT, SIGHUP), one timerfd armed
 * at the earliest thing due (a cron fire, a retry's not_before, a timeout, a
 * stop's SIGKILL backstop, the next database poll, a progress import while
 * runs are active), an inotify on the database's directory (a commit by the
 * CLI touches kiln.db-wal, so a submit is noticed at once; the 1 s poll of
 * PRAGMA data_version is the fallback), and a pidfd per supervised run (an
 * adopted supervisor is not our child, so SIGCHLD would never come). Each
 * wake runs one tick: notice cancels and timeouts, fire cron, launch what
 * the queue allows, and sleep again. Idle, that is one cheap query per poll.
 */
#include "sched_int.h"
#include "web.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define TAG_SIGNAL UINT64_MAX
#define TAG_TIMER (UINT64_MAX - 1)
#define TAG_INOTIFY (UINT64_MAX - 2)
#define PROGRESS_EVERY_MS 5000

/* ---- options ------------------------------------------------------------------------ */

static char default_home[PATH_MAX];

void sched_options_init(sched_options_t *o)
{
    memset(o, 0, sizeof *o);
    const char *home = getenv("KILN_HOME");
    if (home != NULL && home[0] != '\0')
        snprintf(default_home, sizeof default_home, "%s", home);
    else if (getenv("HOME") != NULL)
        snprintf(default_home, sizeof default_home, "%s/.kiln", getenv("HOME"));
    else
        snprintf(default_home, sizeof default_home, ".kiln");
    o->home = default_home;
    o->listen = "127.0.0.1:8480";
    o->trainer = getenv("KILN_TRAIN");
    o->mpirun = "mpirun";
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o->max_ranks = cores > 0 ? (int)cores : 1;
    o->grace_ms = 10000;
    o->poll_ms = 1000;
    o->stats_every_ms = 10000;
    o->slurm_poll_ms = 5000;
}

/* What an option sets in sched_options_t, at off. */
typedef enum {
    OPT_STR,      /* const char *: the value */
    OPT_FLAG,     /* bool: true */
    OPT_INT,      /* int: a positive number */
    OPT_DURATION, /* int64_t ms: a duration, raised to min_ms */
    OPT_DAYS,     /* int64_t ms: a duration, a bare number counting days */
    OPT_LOG_FORMAT,
    OPT_HELP,
} opt_kind_t;

typedef struct {
    const char *name, *arg, *help;
    opt_kind_t kind;
    size_t off;
    int64_t min_ms;
} opt_t;

#define AT(m) offsetof(sched_options_t, m)
static const opt_t opts[] = {
    {"db", "PATH", "database file (default $KILN_HOME/kiln.db)", OPT_STR, AT(db_path), 0},
    {"home", "DIR", "Kiln's home: run directories go in DIR/runs (default $KILN_HOME or ~/.kiln)",
     OPT_STR, AT(home), 0},
    {"listen", "ADDR", "address of the status page (default 127.0.0.1:8480)", OPT_STR, AT(listen),
     0},
    {"max-ranks", "N",
     "ranks in use at once over all runs (default: the number of cores); a "
     "run asking for more runs alone",
     OPT_INT, AT(max_ranks), 0},
    {"grace", "DURATION", "SIGTERM to SIGKILL on cancel and timeout (default 10s)", OPT_DURATION,
     AT(grace_ms), 0},
    {"poll", "DURATION", "database change poll (default 1s)", OPT_DURATION, AT(poll_ms), 50},
    {"stats-every", "DURATION",
     "read each endpoint's /v1/stats this often for the endpoints "
     "page (default 10s; 0: never)",
     OPT_DURATION, AT(stats_every_ms), 0},
    {"slurm-poll", "DURATION",
     "how often a Slurm run's supervisor asks Slurm about its job "
     "(default 5s)",
     OPT_DURATION, AT(slurm_poll_ms), 100},
    {"keep-runs", "DURATION",
     "compact runs that ended DURATION ago (7d, 12h, 90s; a bare number is days): their "
     "events, loss points and logs go, what consumed data, checkpoints and endpoints need "
     "stays until nothing needs it (default: keep every run whole)",
     OPT_DAYS, AT(keep_runs_ms), 1000},
    {"drain", NULL, "on SIGTERM, wait for running runs to end (a second SIGTERM stops now)",
     OPT_FLAG, AT(drain), 0},
    {"trainer", "PATH", "kiln-train (default $KILN_TRAIN, else next to kilnd, else PATH)", OPT_STR,
     AT(trainer), 0},
    {"mpirun", "PATH", "mpirun (default: from PATH)", OPT_STR, AT(mpirun), 0},
    {"log", "FILE", "append the daemon's log to FILE instead of stderr", OPT_STR, AT(log_path), 0},
    {"log-format", "FORMAT", "text (default) or json: one JSON object per log line", OPT_LOG_FORMAT,
     AT(log_json), 0},
    {"help", NULL, "show this help", OPT_HELP, 0, 0},
    {NULL, NULL, NULL, OPT_HELP, 0, 0}};
#undef AT

void sched_usage(FILE *f, const char *prog)
{
    fprintf(f, "usage: %s [options]\n\nKiln's scheduler daemon: fires schedules, launches and "
               "supervises runs, retries, recovers (docs/operations.md).\n\noptions:\n",
            prog);
    for (const opt_t *o = opts; o->name; o++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-20s %s\n", left, o->help);
    }
    fprintf(f, "\nSignals: SIGTERM/SIGINT stop (runs keep going and are adopted at the next "
               "start; with --drain kilnd waits for them), SIGHUP re-reads jobs and the log.\n");
}

static int parse_int(const char *name, const char *v, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < 1 || x > 1000000)
        return kiln_errf(KILN_EUSAGE, "--%s expects a positive number, not '%s'", name, v);
    *out = (int)x;
    return 0;
}

/* A duration with a unit, or a bare number of days (what --keep-runs took
 * before it took durations). */
static int parse_days(const char *name, const char *v, int64_t *ms)
{
    char *end;
    long long days = strtoll(v, &end, 10);
    if (*v != '\0' && *end == '\0' && days >= 1 && days <= 100000) {
        *ms = days * 86400 * 1000;
        return 0;
    }
    if (kiln_duration_parse(v, ms) < 0 || *ms <= 0)
        return kiln_errf(KILN_EUSAGE,
                         "--%s expects a duration like 7d, 12h or 90s (a bare "
                         "number counts days), not '%s'",
                         name, v);
    return 0;
}

int sched_options_parse(int argc, char **argv, int from, sched_options_t *o)
{
    for (int i = from; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            return 1;
        if (strncmp(a, "--", 2) != 0)
            return kiln_errf(KILN_EUSAGE, "unexpected argument '%s' (see --help)", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const opt_t *opt = NULL;
        for (const opt_t *p = opts; p->name; p++)
            if (strlen(p->name) == len && strncmp(p->name, name, len) == 0)
                opt = p;
        if (opt == NULL) {
            const char *names[sizeof opts / sizeof opts[0]];
            size_t k = 0;
            for (const opt_t *p = opts; p->name; p++)
                names[k++] = p->name;
            names[k] = NULL;
            char word[64];
            snprintf(word, sizeof word, "%.*s", (int)len, name);
            const char *hint = kiln_did_you_mean(word, names);
            return kiln_errf(KILN_EUSAGE, "unknown option '%s'%s%s%s", a,
                             hint ? " (did you mean --" : "", hint ? hint : "", hint ? "?)" : "");
        }
        const char *v = eq ? eq + 1 : NULL;
        if (opt->arg != NULL && v == NULL) {
            if (i + 1 >= argc)
                return kiln_errf(KILN_EUSAGE, "--%s needs a value (%s)", opt->name, opt->arg);
            v = argv[++i];
        }
        void *at = (char *)o + opt->off;
        int64_t ms;
        switch (opt->kind) {
        case OPT_STR:
            *(const char **)at = v;
            break;
        case OPT_FLAG:
            *(bool *)at = true;
            break;
        case OPT_INT:
            KILN_CHECK(parse_int(opt->name, v, at));
            break;
        case OPT_DURATION:
            if (kiln_duration_parse(v, &ms) < 0 || ms < 0)
                return kiln_errf(KILN_EUSAGE, "--%s expects a duration like 10s or 500ms, not '%s'",
                                 opt->name, v);
            *(int64_t *)at = ms < opt->min_ms ? opt->min_ms : ms;
            break;
        case OPT_DAYS:
            KILN_CHECK(parse_days(opt->name, v, &ms));
            *(int64_t *)at = ms < opt->min_ms ? opt->min_ms : ms;
            break;
        case OPT_LOG_FORMAT:
            if (strcmp(v, "text") != 0 && strcmp(v, "json") != 0)
                return kiln_errf(KILN_EUSAGE, "--log-format is text or json, not '%s'", v);
            *(bool *)at = strcmp(v, "json") == 0;
            break;
        case OPT_HELP:
            break;
        }
    }
    return 0;
}

/* kiln-train: the option, else next to this program (an install puts them in
 * one bin/; a build tree has scheduler/, tools/ and trainer/ side by side),
 * else PATH. */
static char *find_trainer(const char *given)
{
    if (given != NULL && given[0] != '\0') {
        /* Absolute: the supervisor runs the command from the run directory. */
        char abs[PATH_MAX];
        if (strchr(given, '/') != NULL && realpath(given, abs) != NULL)
            return kiln_strdup(abs);
        return kiln_strdup(given);
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *dir = dirname(self);
        const char *tries[] = {"%s/kiln-train", "%s/../trainer/kiln-train"};
        for (size_t i = 0; i < 2; i++) {
            char *p = kiln_asprintf(tries[i], dir);
            if (p != NULL && access(p, X_OK) == 0)
                return p;
            free(p);
        }
    }
    return kiln_strdup("kiln-train");
}

/* ---- one tick ----------------------------------------------------------------------- */

static sched_active_t *active_by_run(sched_t *s, int64_t run_id)
{
    for (size_t i = 0; i < s->nact; i++)
        if (s->act[i].run_id == run_id)
            return &s->act[i];
    return NULL;
}

static void check_cancels(sched_t *s, int64_t now)
{
    for (size_t i = 0; i < s->nact; i++) {
        state_run_t r;
        if (state_run_get(s->st, s->act[i].run_id, &r) < 0)
            continue;
        if (r.cancel_requested)
            sched_stop(s, &s->act[i], STOP_CANCELED, now);
        state_run_fini(&r);
    }
}

static void earliest(int64_t *next, int64_t t)
{
    if (t > 0 && (*next == 0 || t < *next))
        *next = t;
}

static int64_t tick(sched_t *s, bool changed)
{
    int64_t now = kiln_now_ms(), next = now + s->o.poll_ms;
    if (changed) {
        if (sched_jobs_reload(s) < 0)
            KILN_WARN("cannot read the jobs: %s", kiln_errmsg());
        check_cancels(s, now);
        /* A trainer recorded an online export: queue its pushes. */
        for (size_t i = 0; i < s->nact; i++)
            sched_scan_exports(s, &s->act[i]);
    }
    earliest(&next, sched_finish_due(s, now));
    for (size_t i = 0; i < s->nact; i++) {
        sched_active_t *a = &s->act[i];
        if (a->end_retry_ms > 0) /* it ended: nothing to stop */
            continue;
        if (a->deadline_ms > 0 && a->stop == STOP_NONE) {
            if (now >= a->deadline_ms)
                sched_stop(s, a, STOP_TIMED_OUT, now);
            else
                earliest(&next, a->deadline_ms);
        }
        if (a->backstop_ms > 0) {
            if (now >= a->backstop_ms) {
                KILN_WARN("run %lld: supervisor %d outlived the grace period; SIGKILL",
                          (long long)a->run_id, (int)a->pid);
                sched_kill_session(a->pid, SIGKILL);
                kill(-a->pid, SIGKILL);
                a->backstop_ms = now + 5000;
            }
            earliest(&next, a->backstop_ms);
        }
    }
    if (s->nact > 0) {
        if (now >= s->next_progress_ms) {
            for (size_t i = 0; i < s->nact; i++)
                sched_import_progress(s, &s->act[i]);
            s->next_progress_ms = now + PROGRESS_EVERY_MS;
        }
        earliest(&next, s->next_progress_ms);
    }
    if (!s->stopping) {
        int64_t cron_next = 0, queue_next = 0;
        sched_cron_tick(s, now / 1000, &cron_next);
        if (sched_dispatch(s, now, &queue_next) < 0)
            KILN_WARN("cannot read the queue: %s", kiln_errmsg());
        earliest(&next, cron_next);
        earliest(&next, queue_next);
        earliest(&next, sched_retain(s, now));
    }
    return next;
}

/* ---- events ------------------------------------------------------------------------- */

static void on_signals(sched_t *s)
{
    struct signalfd_siginfo si;
    while (read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        switch (si.ssi_signo) {
        case SIGCHLD:
            for (;;) {
                int st;
                pid_t p = waitpid(-1, &st, WNOHANG);
                if (p <= 0)
                    break;
                for (size_t i = 0; i < s->nact; i++)
                    if (s->act[i].pid == p && s->act[i].child) {
                        s->act[i].child = false; /* reaped */
                        sched_finish(s, &s->act[i]);
                        break;
                    }
            }
            break;
        case SIGTERM:
        case SIGINT:
            if (s->stopping || !s->o.drain) {
                KILN_INFO("%s: stopping now; %zu run%s keep going and will be adopted at the "
                          "next start",
                          strsignal((int)si.ssi_signo), s->nact, s->nact == 1 ? "" : "s");
                s->quit = true;
            } else {
                KILN_INFO("%s: draining: no new launches; waiting for %zu run%s (signal again "
                          "to stop now)",
                          strsignal((int)si.ssi_signo), s->nact, s->nact == 1 ? "" : "s");
            }
            s->stopping = true;
            break;
        case SIGHUP:
            KILN_INFO("SIGHUP: re-reading jobs");
            if (s->o.log_path != NULL) {
                kiln_log_close();
                kiln_log_open(s->o.log_path, kiln_log_get_level());
            }
            s->dirty = true;
            break;
        }
    }
}

static bool db_changed(sched_t *s)
{
    int64_t v = 0;
    if (state_data_version(s->st, &v) < 0)
        return false;
    bool changed = v != s->data_version;
    s->data_version = v;
    return changed;
}

static int setup(sched_t *s)
{
    sigset_t set;
    sched_signal_set(&set);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return kiln_errf(KILN_EIO, "sigprocmask: %s", strerror(errno));
    signal(SIGPIPE, SIG_IGN);
    s->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    s->timerfd = timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    s->inofd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (s->sigfd < 0 || s->timerfd < 0 || s->epfd < 0)
        return kiln_errf(KILN_EIO, "cannot set up the event loop: %s", strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.u64 = TAG_SIGNAL;
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->sigfd, &ev);
    ev.data.u64 = TAG_TIMER;
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->timerfd, &ev);
    if (s->inofd >= 0) {
        char *dup = kiln_strdup(s->db_path);
        if (dup != NULL &&
            inotify_add_watch(s->inofd, dirname(dup), IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO) >= 0) {
            ev.data.u64 = TAG_INOTIFY;
            epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->inofd, &ev);
        }
        free(dup);
    }
    return 0;
}

/* One kilnd per database: an flock on DB.kilnd.lock, held for kilnd's life
 * (the supervisors do not inherit it). DB is the database's real path
 * (symlinks resolved; it exists, state_open made it), so a second kilnd
 * given a link to the same file finds the same lock. */
static int take_lock(sched_t *s)
{
    char *real = realpath(s->db_path, NULL);
    char *path = kiln_asprintf("%s.kilnd.lock", real != NULL ? real : s->db_path);
    free(real);
    if (path == NULL)
        return KILN_ENOMEM;
    s->lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    int rc = 0;
    if (s->lockfd < 0) {
        rc = kiln_errf(KILN_EIO, "cannot open %s: %s", path, strerror(errno));
    } else if (flock(s->lockfd, LOCK_EX | LOCK_NB) < 0) {
        char buf[32] = "";
        ssize_t n = pread(s->lockfd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
        rc = kiln_errf(KILN_EBUSY, "another kilnd (pid %s) is running on %s; stop it first",
                       buf[0] ? buf : "?", s->db_path);
    } else {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%d\n", (int)getpid());
        if (ftruncate(s->lockfd, 0) < 0 || pwrite(s->lockfd, buf, (size_t)n, 0) < 0)
            KILN_WARN("cannot write %s", path);
    }
    free(path);
    return rc;
}

/* Whether prog names an executable regular file: a path when it holds a
 * '/', else a name looked up in PATH. *where gets the file found. */
static bool executable(const char *prog, char *where, size_t cap)
{
    struct stat sb;
    if (strchr(prog, '/') != NULL) {
        snprintf(where, cap, "%s", prog);
        return stat(prog, &sb) == 0 && S_ISREG(sb.st_mode) && access(prog, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; *p != '\0';) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        snprintf(where, cap, "%.*s/%s", (int)len, len ? p : ".", prog);
        if (stat(where, &sb) == 0 && S_ISREG(sb.st_mode) && access(where, X_OK) == 0)
            return true;
        p += len + (end ? 1 : 0);
    }
    snprintf(where, cap, "%s", prog);
    return false;
}

/* kilnd starts only with a trainer it can run (else every run would fail
 * with mpirun's exit code for a missing program), and with the mpirun it
 * was told to use. The default mpirun missing from PATH is a warning: a
 * job with another launcher needs none. */
static int check_programs(const sched_t *s)
{
    char where[PATH_MAX + 64];
    if (!executable(s->trainer, where, sizeof where))
        return kiln_errf(KILN_ENOENT,
                         "the trainer %s is not an executable file, so every run would fail: "
                         "pass --trainer with the path of kiln-train (or set KILN_TRAIN; the "
                         "default is kiln-train next to kilnd, else in PATH)",
                         where);
    if (!executable(s->o.mpirun, where, sizeof where)) {
        if (strcmp(s->o.mpirun, "mpirun") != 0)
            return kiln_errf(KILN_ENOENT,
                             "--mpirun %s is not an executable file: pass the path of Open "
                             "MPI's mpirun (Debian: openmpi-bin)",
                             where);
        KILN_WARN("mpirun is not in PATH: runs with launcher local or hostfile will fail "
                  "(install openmpi-bin or pass --mpirun PATH)");
    }
    return 0;
}

static void arm(sched_t *s, int64_t at_ms)
{
    struct itimerspec its = {0};
    its.it_value.tv_sec = at_ms / 1000;
    its.it_value.tv_nsec = (at_ms % 1000) * 1000000L;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1;
    timerfd_settime(s->timerfd, TFD_TIMER_ABSTIME, &its, NULL);
}

int sched_run(const sched_options_t *o)
{
    sched_t s_, *s = &s_;
    memset(s, 0, sizeof *s);
    s->o = *o;
    s->sigfd = s->timerfd = s->epfd = s->inofd = s->lockfd = -1;
    s->rng = (uint64_t)kiln_mono_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ULL;
    int rc = 0;
    bool started = false; /* past the start-up checks and recovery */
    web_t *web = NULL;
    kiln_log_set_json(o->log_json);
    if (o->log_path != NULL && kiln_log_open(o->log_path, kiln_log_get_level()) < 0)
        return kiln_errf(KILN_EIO, "cannot open the log %s", o->log_path);
    s->home = kiln_strdup(o->home);
    s->db_path = o->db_path ? kiln_strdup(o->db_path) : kiln_asprintf("%s/kiln.db", o->home);
    s->trainer = find_trainer(o->trainer);
    if (s->home == NULL || s->db_path == NULL || s->trainer == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    KILN_CHECK_GOTO(check_programs(s), rc, out);
    if (mkdir(s->home, 0755) < 0 && errno != EEXIST) {
        rc = kiln_errf(KILN_EIO, "cannot create %s: %s", s->home, strerror(errno));
        goto out;
    }
    KILN_CHECK_GOTO(state_open(s->db_path, &s->st), rc, out);
    KILN_CHECK_GOTO(take_lock(s), rc, out);
    KILN_CHECK_GOTO(setup(s), rc, out);
    gethostname(s->host, sizeof s->host - 1);
    if (s->o.max_ranks < 1)
        s->o.max_ranks = 1;
    KILN_INFO("kilnd %d on %s: database %s, runs in %s/runs, trainer %s, max %d ranks",
              (int)getpid(), s->host, s->db_path, s->home, s->trainer, s->o.max_ranks);
    /* The status page (web/): its threads start after setup() blocked the
     * signals, so SIGTERM still reaches the signalfd. A page that cannot bind
     * is logged, not fatal: scheduling goes on without it. --listen "" turns
     * it off. */
    if (s->o.listen != NULL && s->o.listen[0] != '\0') {
        web_config_t wc;
        web_config_init(&wc);
        wc.db_path = s->db_path;
        wc.listen = s->o.listen;
        wc.token_file = getenv("KILN_WEB_TOKEN_FILE");
        if (web_start(&wc, &web) < 0)
            KILN_ERROR("the web status page did not start: %s", kiln_errmsg());
    }
    state_data_version(s->st, &s->data_version);
    KILN_CHECK_GOTO(sched_jobs_reload(s), rc, out);
    KILN_CHECK_GOTO(sched_recover(s), rc, out);
    /* Pushes go out from threads of their own; a push that cannot start
     * is logged and the scheduling goes on. */
    if (sched_pusher_start(s->db_path, s->o.stats_every_ms, &s->pusher) < 0)
        KILN_ERROR("pushes will not be delivered: %s", kiln_errmsg());

    started = true;
    bool changed = true;
    while (!s->quit) {
        int64_t next = tick(s, changed || s->dirty);
        s->dirty = false;
        changed = false;
        if (s->stopping && s->nact == 0) {
            if (s->o.drain)
                KILN_INFO("drained: no runs left");
            break;
        }
        arm(s, next);
        struct epoll_event evs[16];
        int n = epoll_wait(s->epfd, evs, 16, -1);
        if (n < 0 && errno != EINTR) {
            rc = kiln_errf(KILN_EIO, "epoll_wait: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag == TAG_SIGNAL) {
                on_signals(s);
            } else if (tag == TAG_TIMER) {
                uint64_t x;
                if (read(s->timerfd, &x, sizeof x) < 0) {
                    /* spurious; nothing to do */
                }
            } else if (tag == TAG_INOTIFY) {
                char buf[4096];
                while (read(s->inofd, buf, sizeof buf) > 0) {
                }
            } else {
                sched_active_t *a = active_by_run(s, (int64_t)tag);
                if (a != NULL)
                    sched_finish(s, a);
            }
        }
        changed = db_changed(s);
    }
out:
    if (rc < 0 && o->log_path != NULL) {
        /* The reason goes to --log too (kilnd's caller prints it on stderr,
         * which a daemon's supervisor may not keep). */
        char why[1024];
        snprintf(why, sizeof why, "%s", kiln_errmsg()[0] ? kiln_errmsg() : kiln_strerror(rc));
        KILN_ERROR("kilnd %s: %s", started ? "stops" : "cannot start", why);
        kiln_errf(rc, "%s", why);
    }
    sched_pusher_stop(s->pusher);
    web_stop(web);
    for (size_t i = 0; i < s->nact; i++) {
        if (s->act[i].pidfd >= 0)
            close(s->act[i].pidfd);
        free(s->act[i].run_dir);
    }
    free(s->act);
    for (size_t i = 0; i < s->njobs; i++)
        sched_job_clear(&s->jobs[i]);
    free(s->jobs);
    int fds[] = {s->sigfd, s->timerfd, s->epfd, s->inofd, s->lockfd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    state_close(s->st);
    KILN_FREE_ALL(s->home, s->db_path, s->trainer);
    if (o->log_path != NULL)
        kiln_log_close();
    return rc;
}
