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

int kiln_write_atomic(const char *path, const void *data, size_t len)
{
    char *tmp = kiln_asprintf("%s.tmp.%d", path, (int)getpid());
    char *dir = kiln_strdup(path);
    int rc = 0, fd = -1;
    if (tmp == NULL || dir == NULL) {
        rc = KILN_ENOMEM;
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = kiln_errf(KILN_EIO, "cannot write %s: %s", tmp, strerror(errno));
        goto out;
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, (const char *)data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            rc = kiln_errf(KILN_EIO, "cannot write %s: %s", tmp, strerror(errno));
            goto out;
        }
        off += (size_t)w;
    }
    if (fsync(fd) < 0) {
        rc = kiln_errf(KILN_EIO, "cannot write %s: fsync: %s", tmp, strerror(errno));
        goto out;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) < 0) {
        rc = kiln_errf(KILN_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* the rename itself survives a crash */
        close(dfd);
    }
out:
    if (fd >= 0)
        close(fd);
    if (rc < 0 && tmp != NULL)
        unlink(tmp);
    free(tmp);
    free(dir);
    return rc;
}
