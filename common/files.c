/*
 * common/files.c - small file-system helpers every program needs: making a
 * directory with its parents, for a path or for a file's parent, and
 * replacing a file atomically and durably.
 */
#include "kiln.h"

#include <errno.h>
#include <fcntl.h>
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

int kiln_atomic_open(const char *path, kiln_atomic_t *a)
{
    *a = (kiln_atomic_t){0};
    a->path = kiln_strdup(path);
    a->tmp = kiln_asprintf("%s.tmp.%d", path, (int)getpid());
    if (a->path == NULL || a->tmp == NULL) {
        kiln_atomic_abort(a);
        return KILN_ENOMEM;
    }
    a->f = fopen(a->tmp, "we");
    if (a->f == NULL) {
        int rc = kiln_errf(KILN_EIO, "cannot write %s: %s", a->tmp, strerror(errno));
        kiln_atomic_abort(a);
        return rc;
    }
    return 0;
}

int kiln_atomic_commit(kiln_atomic_t *a)
{
    int rc = 0;
    if (fflush(a->f) != 0 || ferror(a->f) || fsync(fileno(a->f)) != 0) {
        rc = kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO, "cannot write %s: %s", a->tmp,
                       strerror(errno));
    } else if (fclose(a->f) != 0) {
        a->f = NULL;
        rc = kiln_errf(KILN_EIO, "cannot write %s: %s", a->tmp, strerror(errno));
    } else {
        a->f = NULL;
        if (rename(a->tmp, a->path) != 0)
            rc = kiln_errf(KILN_EIO, "cannot rename %s to %s: %s", a->tmp, a->path,
                           strerror(errno));
    }
    if (rc < 0) {
        kiln_atomic_abort(a);
        return rc;
    }
    char *slash = strrchr(a->path, '/');
    if (slash != NULL && slash != a->path) {
        *slash = '\0'; /* a->path becomes its directory; freed below */
        rc = kiln_fsync_dir(a->path);
    } else {
        rc = kiln_fsync_dir(slash == a->path ? "/" : ".");
    }
    free(a->tmp);
    free(a->path);
    *a = (kiln_atomic_t){0};
    return rc;
}

void kiln_atomic_abort(kiln_atomic_t *a)
{
    if (a->f != NULL)
        fclose(a->f);
    if (a->tmp != NULL)
        unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    *a = (kiln_atomic_t){0};
}

int kiln_write_atomic(const char *path, const void *data, size_t len)
{
    kiln_atomic_t a;
    KILN_CHECK(kiln_atomic_open(path, &a));
    if (len > 0 && fwrite(data, 1, len, a.f) != len) {
        int rc = kiln_errf(errno == ENOSPC ? KILN_ENOSPC : KILN_EIO, "cannot write %s: %s",
                           a.tmp, strerror(errno));
        kiln_atomic_abort(&a);
        return rc;
    }
    return kiln_atomic_commit(&a);
}
