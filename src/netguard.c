/*
 * netguard — SSRF guard: address classification and destination URL parsing.
 */
#include "netguard.h"

#include <curl/curl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* An IPv4 prefix in host byte order. */
struct v4_prefix {
    uint32_t net;
    unsigned bits;
};

/*
 * IPv4 ranges a webhook must never reach.  Besides what SPEC §11 names, the
 * IETF-reserved 192.0.0.0/24, the benchmarking 198.18.0.0/15 and the reserved
 * 240.0.0.0/4 (which includes the limited broadcast 255.255.255.255) are
 * here: none of them is a legitimate public destination, and some are
 * routed inside data centres.
 */
static const struct v4_prefix V4_BLOCKED[] = {
    {0x00000000u, 8},  /* 0.0.0.0/8      "this network", includes unspecified */
    {0x0A000000u, 8},  /* 10.0.0.0/8     private */
    {0x64400000u, 10}, /* 100.64.0.0/10  CGNAT (shared address space) */
    {0x7F000000u, 8},  /* 127.0.0.0/8    loopback */
    {0xA9FE0000u, 16}, /* 169.254.0.0/16 link-local, cloud metadata services */
    {0xAC100000u, 12}, /* 172.16.0.0/12  private */
    {0xC0000000u, 24}, /* 192.0.0.0/24   IETF protocol assignments */
    {0xC0A80000u, 16}, /* 192.168.0.0/16 private */
    {0xC6120000u, 15}, /* 198.18.0.0/15  benchmarking */
    {0xE0000000u, 4},  /* 224.0.0.0/4    multicast */
    {0xF0000000u, 4},  /* 240.0.0.0/4    reserved, includes 255.255.255.255 */
};

/* 1 when the IPv4 address a (host byte order) is in a blocked range. */
static int v4_blocked(uint32_t a) {
    for (size_t i = 0; i < sizeof(V4_BLOCKED) / sizeof(V4_BLOCKED[0]); i++) {
        uint32_t mask = 0xFFFFFFFFu << (32 - V4_BLOCKED[i].bits);
        if ((a & mask) == V4_BLOCKED[i].net) {
            return 1;
        }
    }
    return 0;
}

/* The IPv4 address in b[0..4), network order in memory, as a host-order integer. */
static uint32_t v4_at(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* 1 when b[0..n) are all zero. */
static int all_zero(const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/*
 * 1 when the IPv6 address b[0..16) is blocked.  Forms that carry an IPv4
 * address are judged by that address, because that is where a translator,
 * a dual-stack socket or a 6to4 relay would actually deliver the packets.
 */
static int v6_blocked(const unsigned char *b) {
    static const unsigned char nat64_wkp[12] = {0x00, 0x64, 0xff, 0x9b};
    static const unsigned char nat64_local[6] = {0x00, 0x64, 0xff, 0x9b, 0x00, 0x01};

    /* ::/96 — IPv4-compatible (deprecated).  This also covers the
     * unspecified :: and the loopback ::1: as IPv4 they are 0.0.0.0 and
     * 0.0.0.1, both in the blocked 0.0.0.0/8. */
    if (all_zero(b, 12)) {
        return v4_blocked(v4_at(b + 12));
    }
    /* ::ffff:0:0/96 — IPv4-mapped */
    if (all_zero(b, 10) && b[10] == 0xff && b[11] == 0xff) {
        return v4_blocked(v4_at(b + 12));
    }
    /* ::ffff:0:0:0/96 — IPv4-translated (SIIT) */
    if (all_zero(b, 8) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0) {
        return v4_blocked(v4_at(b + 12));
    }
    /* 64:ff9b::/96 — NAT64 well-known prefix */
    if (memcmp(b, nat64_wkp, sizeof(nat64_wkp)) == 0) {
        return v4_blocked(v4_at(b + 12));
    }
    /* 64:ff9b:1::/48 — NAT64 for local use only (RFC 8215): never public */
    if (memcmp(b, nat64_local, sizeof(nat64_local)) == 0) {
        return 1;
    }
    /* 2002::/16 — 6to4, the IPv4 address is bits 16..47 */
    if (b[0] == 0x20 && b[1] == 0x02) {
        return v4_blocked(v4_at(b + 2));
    }
    /* fc00::/7 — unique local (private) */
    if ((b[0] & 0xfe) == 0xfc) {
        return 1;
    }
    /* fe80::/10 link-local, and fec0::/10 site-local (deprecated, still private) */
    if (b[0] == 0xfe && (b[1] & 0x80) == 0x80) {
        return 1;
    }
    /* ff00::/8 — multicast */
    if (b[0] == 0xff) {
        return 1;
    }
    return 0;
}

int hub_netguard_blocked(const struct sockaddr *sa) {
    if (sa == NULL) {
        return 1;
    }
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in in4;
        memcpy(&in4, sa, sizeof(in4));
        return v4_blocked(ntohl(in4.sin_addr.s_addr));
    }
    if (sa->sa_family == AF_INET6) {
        struct sockaddr_in6 in6;
        memcpy(&in6, sa, sizeof(in6));
        return v6_blocked(in6.sin6_addr.s6_addr);
    }
    /* AF_UNIX and friends are not destinations: fail closed */
    return 1;
}

/*
 * Checks what libcurl's parser is lenient about (it accepts "http:/h",
 * "http:///h", empty fragments, percent-encoded hosts) so that one spelling
 * means one destination.  On success returns the offset of the authority
 * (just after "scheme://") and sets *auth_len.  Returns -1 when refused.
 */
static long prescan(const char *url, size_t *auth_len) {
    const char *sep = strstr(url, "://");
    const char *auth, *end;

    for (const char *p = url; *p != '\0'; p++) {
        unsigned char c = (unsigned char)*p;
        /* printable ASCII only: no space, control, DEL or non-ASCII byte;
         * no backslash (some parsers read it as '/'); no fragment */
        if (c <= 0x20 || c >= 0x7f || c == '\\' || c == '#') {
            return -1;
        }
    }
    if (sep == NULL || sep == url) {
        return -1;
    }
    /* everything before "://" must be a scheme, so that a "://" later in the
     * path cannot make this scan and libcurl disagree on the authority */
    for (const char *p = url; p < sep; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z'))) {
            return -1;
        }
    }
    auth = sep + 3;
    end = auth + strcspn(auth, "/?");
    if (end == auth) {
        return -1; /* empty host, or "http:///host" */
    }
    for (const char *p = auth; p < end; p++) {
        /* userinfo, and percent-encoding that would hide a host or zone id */
        if (*p == '@' || *p == '%') {
            return -1;
        }
    }
    *auth_len = (size_t)(end - auth);
    return auth - url;
}

/* 1 when libcurl found the given part in the URL. */
static int has_part(CURLU *h, CURLUPart what) {
    char *part = NULL;
    CURLUcode rc = curl_url_get(h, what, &part, 0);
    curl_free(part);
    return rc == CURLUE_OK;
}

/* Copies a libcurl part into dst (dstsz bytes), lower-cased.  0 or -1. */
static int get_lower(CURLU *h, CURLUPart what, unsigned flags, char *dst, size_t dstsz) {
    char *part = NULL;
    size_t n;

    if (curl_url_get(h, what, &part, flags) != CURLUE_OK || part == NULL) {
        curl_free(part);
        return -1;
    }
    n = strlen(part);
    if (n == 0 || n >= dstsz) {
        curl_free(part);
        return -1;
    }
    for (size_t i = 0; i <= n; i++) {
        char c = part[i];
        dst[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    curl_free(part);
    return 0;
}

int hub_url_parse(const char *url, struct hub_url *out) {
    char port[8];
    CURLU *h = NULL;
    size_t auth_len = 0;
    long auth_at;
    char *end = NULL;
    long p;

    if (out == NULL) {
        return -1;
    }
    memset(out, 0, sizeof(*out));
    if (url == NULL) {
        return -1;
    }
    auth_at = prescan(url, &auth_len);
    if (auth_at < 0) {
        return -1;
    }
    h = curl_url();
    if (h == NULL) {
        goto fail;
    }
    /* flags 0: no scheme guessing, no spaces, only schemes libcurl knows */
    if (curl_url_set(h, CURLUPART_URL, url, 0) != CURLUE_OK) {
        goto fail;
    }
    if (get_lower(h, CURLUPART_SCHEME, 0, out->scheme, sizeof(out->scheme)) != 0 ||
        (strcmp(out->scheme, "http") != 0 && strcmp(out->scheme, "https") != 0)) {
        goto fail;
    }
    /* belt and braces with prescan(): libcurl's own view must agree */
    if (has_part(h, CURLUPART_USER) || has_part(h, CURLUPART_PASSWORD) ||
        has_part(h, CURLUPART_OPTIONS) || has_part(h, CURLUPART_ZONEID) ||
        has_part(h, CURLUPART_FRAGMENT)) {
        goto fail;
    }
    if (get_lower(h, CURLUPART_HOST, 0, out->host, sizeof(out->host)) != 0) {
        goto fail;
    }
    if (get_lower(h, CURLUPART_PORT, CURLU_DEFAULT_PORT, port, sizeof(port)) != 0) {
        goto fail;
    }
    p = strtol(port, &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) {
        goto fail;
    }
    out->port = (int)p;
    if (snprintf(out->origin, sizeof(out->origin), "%s://%s:%d", out->scheme, out->host,
                 out->port) >= (int)sizeof(out->origin)) {
        goto fail;
    }
    out->path = url[auth_at + (long)auth_len] != '\0' ? url + auth_at + auth_len : "/";
    curl_url_cleanup(h);
    return 0;
fail:
    curl_url_cleanup(h);
    memset(out, 0, sizeof(*out));
    return -1;
}
