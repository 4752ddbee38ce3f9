/*
 * tests/fuzz/fuzz_manifest.c - libFuzzer harness for the checkpoint manifest
 * reader: the bytes become manifest.json of a checkpoint directory (one
 * temporary directory root/ck for the whole run, rewritten per input), which
 * ckpt_open reads. Any bytes are either a checkpoint whose fields keep
 * their limits (tables <= CKPT_MAX_TABLES, dims in range, file names
 * without '/'), or KILN_ECORRUPT / KILN_EVERSION with a message naming the
 * manifest; never a crash. An accepted manifest then goes through
 * ckpt_verify and ckpt_chain_open, which must fail cleanly since the
 * files it lists are not there (or be empty).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"
#include "ckpt.h"

static char root[64]; /* a checkpoint root of its own: parents resolve inside it */
static char dir[96];
static char mpath[160];

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/kiln-fuzz-manifest-XXXXXX");
    if (mkdtemp(root) == NULL)
        abort();
    snprintf(dir, sizeof dir, "%s/ck", root);
    if (mkdir(dir, 0755) != 0)
        abort();
    snprintf(mpath, sizeof mpath, "%s/%s", dir, CKPT_MANIFEST);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (dir[0] == '\0')
        setup();
    FILE *f = fopen(mpath, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    ckpt_t *c = NULL;
    int rc = ckpt_open(dir, &c);
    if (rc < 0) {
        if (c != NULL || (rc != KILN_ECORRUPT && rc != KILN_EVERSION && rc != KILN_ENOMEM))
            abort();
        if (strstr(kiln_errmsg(), CKPT_MANIFEST) == NULL && rc != KILN_ENOMEM)
            abort();
        kiln_errclear();
        return 0;
    }
    const ckpt_info_t *in = ckpt_info(c);
    if (in->ntables < 0 || in->ntables > CKPT_MAX_TABLES || in->world_size < 1 ||
        in->uid[0] == '\0')
        abort();
    for (int t = 0; t < in->ntables; t++)
        if (in->tables[t].dim < 1 || in->tables[t].nstate < 0 || in->tables[t].nstate > 2)
            abort();
    (void)ckpt_verify(c);
    kiln_errclear();
    ckpt_close(c);
    ckpt_chain_t ch;
    if (ckpt_chain_open(dir, true, &ch) == 0)
        ckpt_chain_fini(&ch);
    kiln_errclear();
    return 0;
}
