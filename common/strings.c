/*
 * common/strings.c - small string helpers: edit distance and did-you-mean,
 * the one suggestion rule of Kiln: the spec parser (unknown keys, enum
 * values), cron names and macros, the CLI (commands, options) and kilnd's
 * options all ask kiln_did_you_mean. And kiln_utf8_scrub, which makes a
 * message that quotes user text valid UTF-8 again after a cut.
 */
#include "kiln.h"

#include <string.h>

/* Optimal string alignment: Levenshtein's three edits plus a swap of two
 * neighbouring letters, each costing one, no substring edited twice. Rows
 * two back are kept for the swap (d[i-2][j-2]). */
int kiln_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 255;
    int back[65], prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            int best = sub < del ? sub : del;
            best = best < ins ? best : ins;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                back[j - 2] + 1 < best)
                best = back[j - 2] + 1;
            cur[j] = best;
        }
        memcpy(back, prev, sizeof(int) * (lb + 1));
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb] > 255 ? 255 : prev[lb];
}

const char *kiln_did_you_mean(const char *word, const char *const *candidates)
{
    const char *best = NULL;
    int best_d = 255;
    for (size_t i = 0; candidates[i] != NULL; i++) {
        int d = kiln_edit_distance(word, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    int limit = (int)strlen(word) / 3;
    if (limit < 1)
        limit = 1;
    if (limit > 3)
        limit = 3;
    return best_d <= limit ? best : NULL;
}

/* The length of the well-formed UTF-8 sequence at p (1-4), or 0 when the
 * bytes there are not one (RFC 3629's table: no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
static size_t utf8_seq_len(const unsigned char *p)
{
    unsigned char b = p[0];
    if (b < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) {
        n = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
        n = 3;
        lo = b == 0xe0 ? 0xa0 : 0x80;
        hi = b == 0xed ? 0x9f : 0xbf;
    } else if (b >= 0xf0 && b <= 0xf4) {
        n = 4;
        lo = b == 0xf0 ? 0x90 : 0x80;
        hi = b == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) /* also stops at the NUL */
            return 0;
    return n;
}

char *kiln_utf8_scrub(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p != '\0') {
        size_t n = utf8_seq_len(p);
        if (n == 0) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
    return s;
}
