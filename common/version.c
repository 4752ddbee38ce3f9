/*
 * common/version.c - Kiln's version, one place for every program: the
 * version of CMake's project() (common/CMakeLists.txt defines KILN_VERSION
 * for this file alone), and the --version flag that kilnd and kiln-serve
 * look for before their own options.
 */
#include "kiln.h"

#include <stdio.h>
#include <string.h>

#ifndef KILN_VERSION
#error "KILN_VERSION must be CMake's project version"
#endif

const char *kiln_version(void)
{
    return KILN_VERSION;
}

bool kiln_version_flag(int argc, char *const *argv, const char *prog)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("%s %s\n", prog, kiln_version());
            return true;
        }
    }
    return false;
}
