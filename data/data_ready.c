/*
 * data/data_ready.c - whether a partition that landed is complete, so that an
 * incremental or online job takes it once, whole (docs/job-spec.md,
 * data.ready). kilnd's scan of an incremental job's new files and an online
 * trainer's poll both ask here, so the two agree on what "landed" means.
 *
 * Three signals, each a writer's convention:
 *   - Parquet: the footer, which every writer puts last (trailing "PAR1");
 *   - marker: a _SUCCESS file in the partition's directory (Spark, Hadoop);
 *   - settle: the file's size and mtime have not changed for a quiet period.
 *     A file last modified settle ago or earlier was unchanged since, so the
 *     mtime's age says it without remembering earlier looks.
 */
#include "data_int.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The marker's name: what Spark and Hadoop's committers write last. */
#define MARKER "_SUCCESS"

bool data_is_marker(const char *path)
{
    const char *slash = strrchr(path, '/');
    return strcmp(slash != NULL ? slash + 1 : path, MARKER) == 0;
}

static int marker_present(const char *path)
{
    char *dup = kiln_strdup(path);
    if (dup == NULL)
        return KILN_ENOMEM;
    char *m = kiln_asprintf("%s/%s", dirname(dup), MARKER);
    free(dup);
    if (m == NULL)
        return KILN_ENOMEM;
    int rc = access(m, F_OK) == 0;
    free(m);
    return rc;
}

int data_partition_ready(const char *path, const data_ready_t *how)
{
    struct stat sb;
    if (stat(path, &sb) < 0)
        return kiln_errf(errno == ENOENT ? KILN_ENOENT : KILN_EIO, "cannot stat %s: %s", path,
                         strerror(errno));
    if (how->marker) {
        int rc = marker_present(path);
        if (rc != 1)
            return rc;
    }
    if (how->parquet)
        return data_parquet_complete(path);
    if (how->marker)
        return 1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t age_ms = ((int64_t)now.tv_sec - (int64_t)sb.st_mtim.tv_sec) * 1000 +
                     ((int64_t)now.tv_nsec - (int64_t)sb.st_mtim.tv_nsec) / 1000000;
    return age_ms >= how->settle_ms;
}
