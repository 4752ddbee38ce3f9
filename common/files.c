/*
 * common/files.c - small file-system helpers every program needs: making a
 * directory with its parents, for a path or for a file's parent.
 */
#include "kiln.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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
