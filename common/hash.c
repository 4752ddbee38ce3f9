/*
 * common/hash.c - xxh64 through libxxhash: one-shot, streaming, whole files,
 * and the 16-hex-digit form Kiln stores in manifests and the database.
 */
#include "kiln.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

uint64_t kiln_xxh64(const void *data, size_t len, uint64_t seed)
{
    return (uint64_t)XXH64(data, len, (XXH64_hash_t)seed);
}

char *kiln_hash_hex(uint64_t h, char *buf, size_t bufsz)
{
    snprintf(buf, bufsz, "%016llx", (unsigned long long)h);
    return buf;
}

int kiln_hash_parse_hex(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; i < 16; i++) {
        char c = s[i];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            break;
        v = (v << 4) | (uint64_t)d;
    }
    if (i != 16 || s[16] != '\0')
        return kiln_errf(KILN_EINVAL, "'%s' is not a 16-digit hex xxh64", s);
    *out = v;
    return 0;
}

struct kiln_hasher {
    XXH64_state_t *st;
};

kiln_hasher_t *kiln_hasher_create(uint64_t seed)
{
    kiln_hasher_t *h = kiln_malloc(sizeof *h);
    if (h == NULL)
        return NULL;
    h->st = XXH64_createState();
    if (h->st == NULL) {
        free(h);
        kiln_errf(KILN_ENOMEM, "out of memory creating an xxh64 state");
        return NULL;
    }
    XXH64_reset(h->st, (XXH64_hash_t)seed);
    return h;
}

void kiln_hasher_update(kiln_hasher_t *h, const void *data, size_t len)
{
    XXH64_update(h->st, data, len);
}

uint64_t kiln_hasher_digest(const kiln_hasher_t *h) { return (uint64_t)XXH64_digest(h->st); }

void kiln_hasher_destroy(kiln_hasher_t *h)
{
    if (h == NULL)
        return;
    XXH64_freeState(h->st);
    free(h);
}

int kiln_xxh64_file(const char *path, uint64_t seed, uint64_t *out, uint64_t *size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kiln_errf(errno == ENOENT ? KILN_ENOENT : KILN_EIO, "cannot open %s: %s", path,
                         strerror(errno));
    kiln_hasher_t *h = kiln_hasher_create(seed);
    if (h == NULL) {
        fclose(f);
        return KILN_ENOMEM;
    }
    static _Thread_local unsigned char buf[1 << 16];
    uint64_t total = 0;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        kiln_hasher_update(h, buf, n);
        total += n;
    }
    int rc = 0;
    if (ferror(f))
        rc = kiln_errf(KILN_EIO, "error reading %s: %s", path, strerror(errno));
    else
        *out = kiln_hasher_digest(h);
    if (size != NULL)
        *size = total;
    kiln_hasher_destroy(h);
    fclose(f);
    return rc;
}
