/*
 * common/files.c - small file-system helpers every program needs: making a
 * directory with its parents, for a path or for a file's parent, and
 * replacing a file atomically and durably.
 */
#include "kiln.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int kiln_mkdir_p(const char *dir)
{
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof tmp)
        return kiln_errf(KILN_EINVAL, "directory path too long: %s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
            return kiln_errf(KILN_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
        return kiln_errf(KILN_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
    struct stat sb;
    if (stat(tmp, &sb) < 0 || !S_ISDIR(sb.st_mode))
        return kiln_errf(KILN_EIO, "%s exists and is not a directory", tmp);
    return 0;
}

int kiln_mkdir_parent(const char *path)
{
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s", path);
    if (n <= 0 || (size_t)n >= sizeof tmp)
        return kiln_errf(KILN_EINVAL, "path too long: %s", path);
    char *slash = strrchr(tmp, '/');
    if (slash == NULL || slash == tmp)
        return 0;
    *slash = '\0';
    return kiln_mkdir_p(tmp);
}

struct kiln_atomic {
    char *path, *tmp;
    FILE *f;
};

int kiln_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return kiln_errf(KILN_EIO, "cannot open directory %s: %s", dir, strerror(errno));
    int rc = 0;
    if (fsync(fd) < 0 && errno != EINVAL) /* EINVAL: a file system without directory sync */
        rc = kiln_errf(KILN_EIO, "cannot fsync directory %s: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

int kiln_atomic_open(const char *path, kiln_atomic_t **out)
{
    *out = NULL;
    kiln_atomic_t *a = kiln_calloc(1, sizeof *a);
    if (a == NULL)
        return KILN_ENOMEM;
    a->path = kiln_strdup(path);
    a->tmp = kiln_asprintf("%s.tmp.%d", path, (int)getpid());
    if (a->path == NULL || a->tmp == NULL) {
        kiln_atomic_abort(a);
        return KILN_ENOMEM;
    }
    a->f = fopen(a->tmp, "we");
    if (a->f == NULL) {
        int rc = kiln_errf(KILN_EIO, "cannot create %s: %s", a->tmp, strerror(errno));
        kiln_atomic_abort(a);
        return rc;
    }
    *out = a;
    return 0;
}

FILE *kiln_atomic_file(kiln_atomic_t *a) { return a->f; }

const char *kiln_atomic_tmp(const kiln_atomic_t *a) { return a->tmp; }

void kiln_atomic_abort(kiln_atomic_t *a)
{
    if (a == NULL)
        return;
    if (a->f != NULL) {
        fclose(a->f);
        unlink(a->tmp);
    }
    free(a->path);
    free(a->tmp);
    free(a);
}

int kiln_atomic_commit(kiln_atomic_t *a)
{
    int rc = 0;
    if (fflush(a->f) != 0 || ferror(a->f) || fsync(fileno(a->f)) != 0) {
        rc = kiln_errf(KILN_EIO, "cannot write %s: %s", a->tmp, strerror(errno));
        goto out;
    }
    FILE *f = a->f;
    a->f = NULL;
    if (fclose(f) != 0) {
        rc = kiln_errf(KILN_EIO, "cannot close %s: %s", a->tmp, strerror(errno));
        unlink(a->tmp);
        goto out;
    }
    if (rename(a->tmp, a->path) < 0) {
        rc = kiln_errf(KILN_EIO, "cannot rename %s to %s: %s", a->tmp, a->path, strerror(errno));
        unlink(a->tmp);
        goto out;
    }
    char *dir = kiln_strdup(a->path);
    if (dir != NULL)
        kiln_fsync_dir(dirname(dir)); /* the rename itself survives a crash; best effort */
    free(dir);
out:
    kiln_atomic_abort(a);
    return rc;
}

int kiln_write_atomic(const char *path, const void *data, size_t len)
{
    kiln_atomic_t *a = NULL;
    KILN_CHECK(kiln_atomic_open(path, &a));
    if (len > 0 && fwrite(data, 1, len, kiln_atomic_file(a)) != len) {
        int rc = kiln_errf(KILN_EIO, "cannot write %s: %s", kiln_atomic_tmp(a), strerror(errno));
        kiln_atomic_abort(a);
        return rc;
    }
    return kiln_atomic_commit(a);
}
