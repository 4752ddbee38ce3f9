/*
 * trainer/train_online.c - online training: poll data.train for new files, train on
 * each as it lands, export on the configured cadence.
 */
#include "train_int.h"

/* ---- online training -------------------------------------------------------------------
 * train.mode: online keeps the run training as partitions land: rank 0 looks
 * at data.train's glob twice a second and names the files it has not seen
 * (path, size and mtime: a file is taken once it has landed; write
 * partitions under another name and rename them into place) to every rank;
 * each new set is trained on once, in order, and recorded as an input of
 * the run. Exports (export.every, the control file, SIGUSR1) are written
 * between sets and while waiting; kilnd pushes each as it appears. The run
 * ends when kilnd stops it (cancel, resources.timeout) or at
 * train.max_steps. */

#define ONLINE_POLL_MS 500

typedef struct seen {
    char **path;
    int64_t *size, *mtime;
    int n, cap;
} seen_t;

static bool seen_has(const seen_t *s, const char *path, int64_t size, int64_t mtime)
{
    for (int i = 0; i < s->n; i++)
        if (s->size[i] == size && s->mtime[i] == mtime && strcmp(s->path[i], path) == 0)
            return true;
    return false;
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

/* Rank 0: new files of pattern (regular, not empty, not seen, and for
 * Parquet complete: a file without its trailing PAR1 is still being
 * written and is looked at again next time), marked seen, as one
 * '\n'-joined list (malloc'd; "" when none). */
static int find_new(seen_t *seen, const char *pattern, bool parquet, char **list)
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
        if (stat(p, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0 ||
            seen_has(seen, p, (int64_t)sb.st_size, (int64_t)sb.st_mtime) ||
            (parquet && rt_parquet_complete(p) != 1))
            continue;
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
        rc = seen_add(seen, p);
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

/* The files an online run starts on, moved to the front of files: for
 * Parquet, rank 0 keeps those that are complete and every rank keeps the
 * same (the others are found again as they complete). Collective. */
static int start_files(trainer_t *tr, char **files, int nfiles, int *nstart)
{
    *nstart = nfiles;
    if (tr->spec.data.format != JOB_FMT_PARQUET || nfiles == 0)
        return 0;
    unsigned char *keep = kiln_calloc((size_t)nfiles, 1);
    int rc = agree(keep != NULL ? 0 : KILN_ENOMEM);
    if (rc < 0) {
        free(keep);
        return rc;
    }
    for (int i = 0; tr->rank == 0 && i < nfiles; i++)
        keep[i] = rt_parquet_complete(files[i]) == 1;
    if (MPI_Bcast(keep, nfiles, MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        rc = kiln_errf(KILN_EMPI, "MPI_Bcast of the complete files failed");
    *nstart = 0;
    for (int i = 0; rc == 0 && i < nfiles; i++) {
        if (!keep[i])
            continue;
        char *t = files[*nstart];
        files[(*nstart)++] = files[i];
        files[i] = t;
    }
    free(keep);
    return rc;
}

int train_online(trainer_t *tr, char **files, int nfiles)
{
    const job_spec_t *sp = &tr->spec;
    seen_t seen = {0};
    char *pattern =
        tr->opt.data ? kiln_strdup(tr->opt.data) : train_spec_relative(tr, sp->data.train);
    char **cur = files, *list = NULL;
    int ncur = nfiles, rc = 0;
    if (pattern == NULL)
        return KILN_ENOMEM;
    rc = start_files(tr, files, nfiles, &ncur);
    if (rc == 0 && tr->rank == 0) {
        for (int i = 0; i < ncur && rc == 0; i++)
            rc = seen_add(&seen, files[i]);
        /* An incremental job's earlier runs consumed what kilnd did not list. */
        if (rc == 0 && tr->opt.inputs != NULL)
            rc = find_new(&seen, pattern, sp->data.format == JOB_FMT_PARQUET, &list);
        free(list);
        list = NULL;
    }
    int64_t limit = train_step_limit(tr);
    tr->rec_every = sp->train.log_every / 10 > 0 ? sp->train.log_every / 10 : 1;
    train_say(tr, "kiln-train: online: training as files matching %s land\n", pattern);
    for (bool first = true; (rc = agree(rc)) == 0; first = false) {
        if (ncur > 0) {
            if (!first && tr->rank == 0)
                train_record_inputs(tr, cur, ncur);
            train_hash_inputs(cur, ncur, tr->inputs_hash);
            rc = train_loop(tr, cur, ncur, 1);
            tr->start_epoch = tr->start_k = 0; /* a resume's position was in the first set */
            if (rc < 0)
                break;
        }
        if (cur != files)
            train_free_list(cur, ncur);
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
            rc = find_new(&seen, pattern, sp->data.format == JOB_FMT_PARQUET, &list);
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
        train_free_list(cur, ncur);
    free(list);
    free(pattern);
    seen_fini(&seen);
    return rc;
}
