/*
 * scheduler/sched_inputs.c - which partitions an incremental job's fire
 * takes: the files data.train matches that are complete (data.ready) and
 * that no succeeded run of the job consumed, and why a fire with none is
 * skipped.
 *
 * Each job remembers what it saw of its files (sched_seen_t: device, inode,
 * size, mtime and ctime in ns, the content hash, whether a run consumed it).
 * A file that was consumed and whose stat is unchanged since is passed over
 * without reading it or asking the database: before, every fire read and
 * hashed every file the glob matched, so a job's cost per fire grew with all
 * the data it had ever trained on (issue 27 item 9's soak: kilnd from 4.6 %
 * to 10-20 % of a core after 2,350 partitions at @every 1s). A file that
 * changes in any way (its ctime moves with any write, and cannot be set
 * back) is read and checked again, so a consumed file that changed is still
 * reported (issue 26). kilnd remembers nothing across a restart: its first
 * fire reads every file once.
 */
#include "sched_int.h"

#include "data.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- what a job saw of its files ------------------------------------------------------ */

/* One file as the last fire saw it. */
typedef struct {
    char *path;
    uint64_t dev, ino;
    int64_t size, mtime_ns, ctime_ns;
    char hex[17];  /* xxh64 of its bytes */
    bool consumed; /* a succeeded run consumed it (or it changed after one did) */
    bool taken;    /* moved into this fire's view: the path belongs to it */
} sched_seen_file_t;

struct sched_seen {
    sched_seen_file_t *files; /* sorted by path */
    size_t n;
};

sched_seen_t *sched_seen_create(void)
{
    return kiln_calloc(1, sizeof(sched_seen_t));
}

static void seen_files_free(sched_seen_file_t *f, size_t n)
{
    for (size_t i = 0; f != NULL && i < n; i++)
        if (!f[i].taken)
            free(f[i].path);
    free(f);
}

void sched_seen_destroy(sched_seen_t *seen)
{
    if (seen == NULL)
        return;
    seen_files_free(seen->files, seen->n);
    free(seen);
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const sched_seen_file_t *)a)->path, ((const sched_seen_file_t *)b)->path);
}

static sched_seen_file_t *seen_find(sched_seen_t *seen, const char *path)
{
    if (seen == NULL || seen->n == 0)
        return NULL;
    sched_seen_file_t key = {.path = (char *)path};
    return bsearch(&key, seen->files, seen->n, sizeof key, by_path);
}

static int64_t ns_of(struct timespec t)
{
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static bool seen_same(const sched_seen_file_t *f, const struct stat *sb)
{
    return f->dev == (uint64_t)sb->st_dev && f->ino == (uint64_t)sb->st_ino &&
           f->size == (int64_t)sb->st_size && f->mtime_ns == ns_of(sb->st_mtim) &&
           f->ctime_ns == ns_of(sb->st_ctim);
}

/* Moves an entry into this fire's view (its path with it; the old view
 * keeps the pointer for its searches until it is freed). */
static sched_seen_file_t seen_take(sched_seen_file_t *f)
{
    sched_seen_file_t t = *f;
    f->taken = true;
    return t;
}

static int seen_make(sched_seen_file_t *f, const char *path, const struct stat *sb,
                     const char *hex, bool consumed)
{
    *f = (sched_seen_file_t){.dev = (uint64_t)sb->st_dev, .ino = (uint64_t)sb->st_ino,
                             .size = (int64_t)sb->st_size, .mtime_ns = ns_of(sb->st_mtim),
                             .ctime_ns = ns_of(sb->st_ctim), .consumed = consumed};
    memcpy(f->hex, hex, sizeof f->hex);
    f->path = kiln_strdup(path);
    return f->path != NULL ? 0 : KILN_ENOMEM;
}

/* This fire's view replaces the last one: files gone from the glob are
 * forgotten. */
static void seen_replace(sched_seen_t *seen, sched_seen_file_t *now, size_t n)
{
    if (seen == NULL) {
        seen_files_free(now, n);
        return;
    }
    if (n > 1)
        qsort(now, n, sizeof *now, by_path);
    seen_files_free(seen->files, seen->n);
    seen->files = now;
    seen->n = n;
}

/* ---- the partitions a fire takes -------------------------------------------------- */

/* A file the job consumed that changed since (appended to, rewritten): said
 * once per version as a "warning" event of the run that consumed it (its
 * page and `kiln show` list it) and in kilnd's log. It is never trained
 * again: the run trained what the file held then, and a second pass would
 * train those rows twice. Returns 0 or a failure of the database. */
static int report_changed(sched_t *s, int64_t run_id, const state_input_t *in)
{
    char *msg = kiln_asprintf("input %s changed after run %lld consumed it (now %lld bytes, "
                              "mtime %lld): it is not trained again. Land new data as a new "
                              "file (write it under another name and rename it into place)",
                              in->path, (long long)run_id, (long long)in->size,
                              (long long)in->mtime);
    state_event_t *es = NULL;
    size_t n = 0;
    if (msg == NULL)
        return KILN_ENOMEM;
    int rc = state_event_list(s->st, 0, run_id, &es, &n);
    bool told = false;
    for (size_t i = 0; rc == 0 && i < n && !told; i++)
        told = es[i].message != NULL && strcmp(es[i].message, msg) == 0;
    state_events_free(es, n);
    if (rc == 0 && !told) {
        KILN_WARN("%s", msg);
        rc = state_event_add(s->st, 0, run_id, "warning", msg);
    }
    free(msg);
    return rc;
}

int sched_new_inputs(sched_t *s, const sched_job_t *job, const job_spec_t *spec,
                     const char *pattern, state_input_t **out, size_t *nout,
                     sched_incomplete_t *wait)
{
    glob_t g = {0};
    state_input_t *ins = NULL;
    size_t n = 0;
    int rc = 0;
    sched_seen_t *seen = job->seen;
    sched_seen_file_t *now = NULL; /* this fire's view of the files, becomes job->seen */
    size_t nnow = 0;
    *out = NULL;
    *nout = 0;
    int grc = glob(pattern, 0, NULL, &g);
    if (grc != 0 && grc != GLOB_NOMATCH)
        return kiln_errf(KILN_EIO, "cannot expand data.train %s", pattern);
    ins = kiln_calloc(g.gl_pathc + 1, sizeof *ins);
    now = kiln_calloc(g.gl_pathc + 1, sizeof *now);
    if (ins == NULL || now == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    const data_ready_t how = {.parquet = spec->data.format == JOB_FMT_PARQUET,
                              .marker = spec->data.ready == JOB_READY_MARKER,
                              .settle_ms = spec->data.settle_ms};
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *path = g.gl_pathv[i];
        struct stat sb;
        if (stat(path, &sb) < 0 || !S_ISREG(sb.st_mode) || data_is_marker(path))
            continue;
        sched_seen_file_t *was = seen_find(seen, path);
        bool same = was != NULL && seen_same(was, &sb);
        if (same && was->consumed) { /* consumed and untouched since: nothing to read */
            now[nnow++] = seen_take(was);
            continue;
        }
        int ready = data_partition_ready(path, &how);
        if (ready != 1) {
            kiln_errclear(); /* gone or unreadable: a later fire sees it again */
            if (ready == 0 && wait->n++ == 0)
                wait->first = kiln_strdup(path);
            continue;
        }
        char hex[17];
        if (same) {
            memcpy(hex, was->hex, sizeof hex);
        } else {
            uint64_t h = 0;
            if (kiln_xxh64_file(path, 0, &h, NULL) < 0) {
                kiln_errclear();
                continue; /* vanished or unreadable: a later fire sees it again */
            }
            kiln_hash_hex(h, hex, sizeof hex);
        }
        state_input_t in = {(char *)path, (int64_t)sb.st_size, (int64_t)sb.st_mtime, hex};
        bool consumed = false;
        KILN_CHECK_GOTO(state_input_consumed(s->st, job->row.id, &in, &consumed), rc, out);
        int64_t by = 0;
        if (!consumed)
            KILN_CHECK_GOTO(state_input_consumed_run(s->st, job->row.id, in.path, &by), rc, out);
        if (by > 0)
            KILN_CHECK_GOTO(report_changed(s, by, &in), rc, out);
        /* Remembered with its hash; consumed (or changed after it was: never
         * trained again) until the file changes. */
        KILN_CHECK_GOTO(seen_make(&now[nnow], path, &sb, hex, consumed || by > 0), rc, out);
        nnow++;
        if (consumed || by > 0)
            continue;
        ins[n].path = kiln_strdup(in.path);
        ins[n].checksum = kiln_strdup(hex);
        ins[n].size = in.size;
        ins[n].mtime = in.mtime;
        if (ins[n].path == NULL || ins[n].checksum == NULL) {
            n++;
            rc = KILN_ENOMEM;
            goto out;
        }
        n++;
    }
out:
    globfree(&g);
    /* Also after a failure: the entries taken from the last view belong to
     * this one now, and a file it did not reach is read again next fire. */
    seen_replace(seen, now, nnow);
    if (rc < 0) {
        state_inputs_free(ins, n);
        return rc;
    }
    *out = ins;
    *nout = n;
    return 0;
}

/* Why a run with nothing new to train on is skipped, malloc'd: the
 * partitions that are still landing when there are some (with what they
 * wait for), else that every one was consumed. manual: a run someone
 * queued, which kilnd does not keep waiting. */
char *sched_no_data_reason(const job_spec_t *spec, const sched_incomplete_t *wait, bool manual)
{
    if (wait->n == 0)
        return kiln_asprintf("no new data: every file matching %s was consumed by an earlier "
                             "successful run",
                             spec->data.train);
    char settle[32], what[160];
    if (spec->data.ready == JOB_READY_MARKER)
        snprintf(what, sizeof what, "it has no _SUCCESS marker beside it yet (data.ready: "
                                    "marker)");
    else if (spec->data.format == JOB_FMT_PARQUET)
        snprintf(what, sizeof what, "its Parquet footer is not written yet");
    else
        snprintf(what, sizeof what, "it is still settling: it changed less than data.settle "
                                    "(%s) ago",
                 kiln_duration_format(spec->data.settle_ms, settle, sizeof settle));
    return kiln_asprintf("no new data yet: %zu file%s matching %s %s not complete (%s%s: %s); "
                         "%s",
                         wait->n, wait->n == 1 ? "" : "s", spec->data.train,
                         wait->n == 1 ? "is" : "are", wait->n == 1 ? "" : "the first, ",
                         wait->first ? wait->first : "?", what,
                         manual ? "this run does not wait for it: submit the job again once "
                                  "it is complete"
                                : "a later fire takes it once it is complete");
}

