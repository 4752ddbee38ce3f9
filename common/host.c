/*
 * common/host.c - whose name a request was sent to: the Host check that
 * both of Kiln's HTTP servers (kilnd's status page, kiln-serve) apply
 * against DNS rebinding. A page in a browser can make a name of its own
 * resolve to 127.0.0.1 and then read what a loopback server answers to it;
 * the request still carries the attacker's name in Host, so a server that
 * answers only to its own names is out of reach.
 */
#include "kiln.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Copies the host part of an authority ("name", "name:port", "[v6]:port")
 * into out without a trailing dot. Returns false when it is malformed. */
static bool host_part(const char *authority, char *out, size_t cap)
{
    const char *h = authority, *end;
    if (h[0] == '[') {
        end = strchr(h, ']');
        if (end == NULL || (end[1] != '\0' && end[1] != ':'))
            return false;
        h++;
    } else {
        end = strchr(h, ':');
        if (end != NULL && strchr(end + 1, ':') != NULL)
            return false; /* an IPv6 address without brackets */
        if (end == NULL)
            end = h + strlen(h);
    }
    const char *port = *end == ']' ? end + 1 : end;
    if (*port == ':')
        for (const char *p = port + 1; *p; p++)
            if (*p < '0' || *p > '9')
                return false;
    size_t n = (size_t)(end - h);
    if (n > 0 && h[n - 1] == '.')
        n--;
    if (n == 0 || n >= cap)
        return false;
    memcpy(out, h, n);
    out[n] = '\0';
    return true;
}

/* Whether name is one of list (comma-separated, case-insensitive, a
 * trailing dot ignored; "*" matches any). */
static bool in_list(const char *name, const char *list)
{
    for (const char *p = list; p != NULL && *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        while (n > 0 && p[0] == ' ')
            p++, n--;
        while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '.'))
            n--;
        if ((n == 1 && p[0] == '*') || (n == strlen(name) && strncasecmp(p, name, n) == 0))
            return true;
        p = comma ? comma + 1 : NULL;
    }
    return false;
}

/* The address in s (IPv4 or IPv6) into buf (16 bytes); its family or 0. */
static int parse_ip(const char *s, unsigned char buf[16])
{
    if (inet_pton(AF_INET, s, buf) == 1)
        return AF_INET;
    if (inet_pton(AF_INET6, s, buf) == 1)
        return AF_INET6;
    return 0;
}

bool kiln_host_allowed(const char *host, const char *bind_addr, const char *allowed)
{
    if (host == NULL)
        return true;
    char name[256];
    if (!host_part(host, name, sizeof name))
        return false;
    if (in_list(name, allowed))
        return true;
    unsigned char b[16], h[16];
    int bf = parse_ip(bind_addr ? bind_addr : "", b);
    bool any = (bf == AF_INET && memcmp(b, "\0\0\0\0", 4) == 0) ||
               (bf == AF_INET6 && memcmp(b, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16) == 0);
    bool loopback = (bf == AF_INET && b[0] == 127) ||
                    (bf == AF_INET6 && memcmp(b, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\1", 16) == 0);
    int hf = parse_ip(name, h);
    if (hf != 0) /* an address: this server's own, or any of the host's for a wildcard bind */
        return any || (hf == bf && memcmp(h, b, hf == AF_INET ? 4 : 16) == 0);
    if (strcasecmp(name, "localhost") == 0)
        return any || loopback;
    char self[256] = "";
    return any && gethostname(self, sizeof self - 1) == 0 && strcasecmp(name, self) == 0;
}

int kiln_host_list_check(const char *list, const char *what)
{
    if (list == NULL || *list == '\0')
        return kiln_errf(KILN_EINVAL, "%s wants host names separated by commas (or *), got ''",
                         what);
    for (const char *p = list; p != NULL;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        char entry[256], name[256];
        bool ok = n > 0 && n < sizeof entry;
        for (size_t i = 0; ok && i < n; i++)
            ok = p[i] > 0x20 && p[i] < 0x7f && p[i] != '/' && p[i] != '@';
        if (ok) {
            snprintf(entry, sizeof entry, "%.*s", (int)n, p);
            ok = strcmp(entry, "*") == 0 || host_part(entry, name, sizeof name);
        }
        if (!ok)
            return kiln_errf(KILN_EINVAL, "%s wants host names separated by commas (or *); "
                                          "'%.*s' in '%s' is not one",
                             what, (int)n, p, list);
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}
