/*
 * trainer/train_online.c - online training: poll data.train for new files, train on
 * each as it lands, export on the configured cadence.
 */
#include "train_int.h"

/* ---- online training -------------------------------------------------------------------
 * train.mode: online keeps the run training as partitions land: rank 0 looks
 * at data.train's glob twice a second and names the files it has not seen
 * to every rank. A file is taken once it is complete (data.ready: its
 * _SUCCESS marker, its Parquet footer, or data.settle of quiet) and only
 * once: one the job consumed before, or that the checkpoint the run started
 * from covers, is not trained again, and one that changes after it was
 * taken is reported (a "warning" event of the run), never retrained whole.
 * Each new file is trained on once, in order, on its own: it is judged on
 * its own lines (data.max_malformed, no lines, no good row), and a bad one
 * is reported by name and set aside while training goes on. Each is
 * recorded as an input of the run. Exports (export.every, the control file,
 * SIGUSR1) are written between files and at step boundaries; kilnd pushes
 * each as it appears. The run ends when kilnd stops it (cancel,
 * resources.timeout) or at train.max_steps. */

#define ONLINE_POLL_MS 500

typedef struct seen {
    char **path;
    int64_t *size, *mtime;
    int n, cap;
} seen_t;

/* The index of path in s, or -1. */
static int seen_find(const seen_t *s, const char *path)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->path[i], path) == 0)
            return i;
    return -1;
}

static int seen_add(seen_t *s, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) < 0)
        return 0; /* gone again: nothing to remember */
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 64;
        char **np = kiln_reallocarray(s->path, (size_t)cap, sizeof *np);
        if (np == NULL)
            return KILN_ENOMEM;
        s->path = np;
        int64_t *ns = kiln_reallocarray(s->size, (size_t)cap, sizeof *ns);
        if (ns == NULL)
            return KILN_ENOMEM;
        s->size = ns;
        int64_t *nm = kiln_reallocarray(s->mtime, (size_t)cap, sizeof *nm);
        if (nm == NULL)
            return KILN_ENOMEM;
        s->mtime = nm;
        s->cap = cap;
    }
    if ((s->path[s->n] = kiln_strdup(path)) == NULL)
        return KILN_ENOMEM;
    s->size[s->n] = (int64_t)sb.st_size;
    s->mtime[s->n] = (int64_t)sb.st_mtime;
    s->n++;
    return 0;
}

static void seen_fini(seen_t *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->path[i]);
    KILN_FREE_ALL(s->path, s->size, s->mtime);
}

/* What rank 0 needs to tell a new file from one taken before. */
typedef struct scan {
    seen_t seen;
    data_ready_t ready;
    int64_t job_id; /* with --db: the job whose earlier runs consumed files; 0 */
} scan_t;

/* Rank 0: a file taken before that changed since: said once per version in
 * the run's log and, with --db, as a "warning" event of the run. */
static void report_changed(trainer_t *tr, const char *path, const struct stat *sb,
                           const char *by)
{
    char *msg = kiln_asprintf("input %s changed after %s took it (now %lld bytes, mtime %lld): "
                              "it is not trained again. Land new data as a new file (write it "
                              "under another name and rename it into place)",
                              path, by, (long long)sb->st_size, (long long)sb->st_mtime);
    train_warning(tr, msg);
    free(msg);
}

/* Rank 0: whether an earlier run of the job consumed path (in this version,
 * or in another one: then it changed since, which is reported). */
static bool consumed_before(trainer_t *tr, const scan_t *sc, const char *path,
                            const struct stat *sb)
{
    int64_t by = 0;
    if (tr->db == NULL || sc->job_id <= 0 ||
        state_input_consumed_run(tr->db, sc->job_id, path, &by) < 0 || by <= 0) {
        kiln_errclear();
        return false;
    }
    uint64_t h = 0;
    char hex[17], who[64];
    bool same = false;
    if (kiln_xxh64_file(path, 0, &h, NULL) == 0) {
        kiln_hash_hex(h, hex, sizeof hex);
        state_input_t in = {(char *)path, (int64_t)sb->st_size, (int64_t)sb->st_mtime, hex};
        if (state_input_consumed(tr->db, sc->job_id, &in, &same) < 0)
            same = false;
    }
    kiln_errclear();
    snprintf(who, sizeof who, "run %lld", (long long)by);
    if (!same)
        report_changed(tr, path, sb, who);
    return true;
}

/* Rank 0: new files of pattern (regular, not empty, not a _SUCCESS marker,
 * complete as data.ready says, neither seen, consumed by an earlier run nor
 * covered by the state), marked seen, as one '\n'-joined list (malloc'd; ""
 * when none). A file not complete yet is looked at again next time; a seen
 * one that changed is reported once per version. */
static int find_new(trainer_t *tr, scan_t *sc, const char *pattern, char **list)
{
    glob_t g;
    size_t len = 0, cap = 256;
    char *out = kiln_calloc(1, cap);
    int rc = 0;
    *list = NULL;
    if (out == NULL)
        return KILN_ENOMEM;
    int grc = glob(pattern, 0, NULL, &g);
    for (size_t i = 0; grc == 0 && rc == 0 && i < g.gl_pathc; i++) {
        struct stat sb;
        const char *p = g.gl_pathv[i];
        if (stat(p, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0 || data_is_marker(p))
            continue;
        int k = seen_find(&sc->seen, p);
        if (k >= 0) {
            if (sc->seen.size[k] != (int64_t)sb.st_size ||
                sc->seen.mtime[k] != (int64_t)sb.st_mtime) {
                report_changed(tr, p, &sb, "this run");
                sc->seen.size[k] = (int64_t)sb.st_size;
                sc->seen.mtime[k] = (int64_t)sb.st_mtime;
            }
            continue;
        }
        if (data_partition_ready(p, &sc->ready) != 1) {
            kiln_errclear();
            continue;
        }
        if (train_inputs_covered(tr, p) || consumed_before(tr, sc, p, &sb)) {
            rc = seen_add(&sc->seen, p);
            continue;
        }
        size_t pl = strlen(p);
        if (len + pl + 2 > cap) {
            while (len + pl + 2 > cap)
                cap *= 2;
            char *n = realloc(out, cap);
            if (n == NULL) {
                rc = KILN_ENOMEM;
                break;
            }
            out = n;
        }
        memcpy(out + len, p, pl);
        out[len + pl] = '\n';
        len += pl + 1;
        out[len] = '\0';
        rc = seen_add(&sc->seen, p);
    }
    if (grc == 0)
        globfree(&g);
    if (rc < 0) {
        free(out);
        return rc;
    }
    *list = out;
    return 0;
}

/* Rank 0 with --db: records files as inputs of this run (lineage walks from
 * a file to what was trained on it; an online run's inputs are its data
 * watermark). */
void train_record_inputs(trainer_t *tr, char **files, int n)
{
    for (int i = 0; tr->db != NULL && i < n; i++) {
        struct stat sb;
        uint64_t h = 0;
        char hex[17];
        if (stat(files[i], &sb) < 0 || kiln_xxh64_file(files[i], 0, &h, NULL) < 0)
            continue;
        kiln_hash_hex(h, hex, sizeof hex);
        state_input_t in = {files[i], (int64_t)sb.st_size, (int64_t)sb.st_mtime, hex};
        if (state_input_add(tr->db, tr->opt.run_id, &in) < 0)
            KILN_WARN("input %s not recorded: %s", files[i], kiln_errmsg());
    }
}

/* Rank 0's list of new files, to every rank (collective). */
static int share_list(trainer_t *tr, char **list)
{
    int64_t len = tr->rank == 0 ? (int64_t)strlen(*list) : 0;
    if (MPI_Bcast(&len, 1, MPI_INT64_T, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Bcast of the new files failed");
    if (tr->rank != 0) {
        free(*list);
        if ((*list = kiln_calloc(1, (size_t)len + 1)) == NULL)
            return KILN_ENOMEM;
    }
    if (len > 0 && MPI_Bcast(*list, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return kiln_errf(KILN_EMPI, "MPI_Bcast of the new files failed");
    return 0;
}

/* Splits a '\n'-joined list into files (malloc'd strings). */
static int split_list(const char *list, char ***files, int *n)
{
    int cnt = 0;
    for (const char *p = list; *p; p++)
        cnt += *p == '\n';
    *files = kiln_calloc((size_t)cnt + 1, sizeof **files);
    *n = 0;
    if (*files == NULL)
        return KILN_ENOMEM;
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, "\n");
        if (((*files)[(*n)++] = kiln_strndup(p, l)) == NULL)
            return KILN_ENOMEM;
        p += l + (p[l] == '\n');
    }
    return 0;
}

/* Trains one file on its own (collective). Its lines are judged alone: a
 * file over data.max_malformed, or with no line or no good row, is set aside
 * (reported by name in the log and as a "warning" event of the run) and 0 is
 * returned; training goes on. A file trained or set aside joins the inputs
 * the state covers. A resumed run continues the file its checkpoint stood
 * in where it stood. */
static int train_file(trainer_t *tr, char *file)
{
    int64_t rows = tr->run_rows, bad = tr->run_malformed;
    train_hash_inputs(&file, 1, tr->inputs_hash);
    tr->start_epoch = 0;
    tr->start_k = 0;
    if (tr->resume_hash[0] != '\0' && strcmp(tr->resume_hash, tr->inputs_hash) == 0) {
        tr->start_k = tr->resume_k;
        tr->resume_hash[0] = '\0';
    }
    tr->run_rows = tr->run_malformed = 0;
    tr->data_verdict = false;
    int rc = train_loop(tr, &file, 1, 1);
    tr->run_rows += rows;
    tr->run_malformed += bad;
    if (rc < 0 && tr->data_verdict) {
        char *msg = kiln_asprintf("partition %s set aside: %s", file, kiln_errmsg());
        if (tr->rank == 0)
            train_warning(tr, msg);
        free(msg);
        kiln_errclear();
        tr->error_told = false;
        tr->data_verdict = false;
        rc = 0;
    }
    if (rc == 0)
        rc = train_inputs_done(tr, file);
    return rc;
}

/* Rank 0 with --db: the run's job (its earlier runs' inputs count as
 * consumed); 0 when unknown. */
static int64_t job_of_run(trainer_t *tr)
{
    state_run_t r;
    if (tr->db == NULL || state_run_get(tr->db, tr->opt.run_id, &r) < 0) {
        kiln_errclear();
        return 0;
    }
    int64_t id = r.job_id;
    state_run_fini(&r);
    return id;
}

int train_online(trainer_t *tr, char **files, int nfiles)
{
    const job_spec_t *sp = &tr->spec;
    scan_t sc = {.ready = {.parquet = sp->data.format == JOB_FMT_PARQUET,
                           .marker = sp->data.ready == JOB_READY_MARKER,
                           .settle_ms = sp->data.settle_ms}};
    char *pattern =
        tr->opt.data ? kiln_strdup(tr->opt.data) : train_spec_relative(tr, sp->data.train);
    char **cur = files, *list = NULL;
    int ncur = nfiles, rc = 0;
    if (pattern == NULL)
        return KILN_ENOMEM;
    if (tr->done == NULL && (tr->done = json_array()) == NULL)
        rc = KILN_ENOMEM;
    rc = agree(rc);
    if (rc == 0)
        rc = train_keep_files(tr, files, nfiles, true, &ncur);
    if (rc == 0 && tr->rank == 0) {
        sc.job_id = job_of_run(tr);
        for (int i = 0; i < ncur && rc == 0; i++)
            rc = seen_add(&sc.seen, files[i]);
        /* Without the database, an incremental job's earlier runs consumed
         * what kilnd did not list. */
        if (rc == 0 && tr->opt.inputs != NULL && sc.job_id == 0)
            rc = find_new(tr, &sc, pattern, &list);
        free(list);
        list = NULL;
    }
    int64_t limit = train_step_limit(tr);
    tr->rec_every = sp->train.log_every / 10 > 0 ? sp->train.log_every / 10 : 1;
    train_say(tr, "kiln-train: online: training as files matching %s land\n", pattern);
    for (bool first = true; (rc = agree(rc)) == 0; first = false) {
        if (!first && ncur > 0 && tr->rank == 0)
            train_record_inputs(tr, cur, ncur);
        for (int i = 0; i < ncur && rc == 0 && !(limit > 0 && tr->steps >= limit); i++)
            rc = train_file(tr, cur[i]);
        if (rc < 0)
            break;
        if (cur != files)
            kiln_strv_free(cur, (size_t)ncur);
        cur = NULL;
        ncur = 0;
        if (limit > 0 && tr->steps >= limit)
            break;
        bool want = false;
        rc = train_export_requested(tr, &want);
        if (rc == 0 && want) {
            rc = train_checkpoint(tr, true);
            tr->last_export_ms = kiln_mono_ns() / 1000000;
            tr->export_step = tr->steps;
        }
        if (rc == 0 && tr->rank == 0)
            rc = find_new(tr, &sc, pattern, &list);
        if (agree(rc) < 0 || (rc = share_list(tr, &list)) < 0)
            continue; /* the loop's agree() ends it */
        rc = split_list(list != NULL ? list : "", &cur, &ncur);
        free(list);
        list = NULL;
        if (rc == 0 && ncur == 0) {
            struct timespec ts = {0, ONLINE_POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (cur != files)
        kiln_strv_free(cur, (size_t)ncur);
    free(list);
    free(pattern);
    seen_fini(&sc.seen);
    return rc;
}
