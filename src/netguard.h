/*
 * netguard — destination vetting against SSRF (SPEC §7.6, §11).
 *
 * Two jobs, both pure (no DNS, no sockets, no global state):
 *
 *   hub_url_parse()        parses and normalises a destination URL, refusing
 *                          anything a webhook URL has no business containing
 *                          (userinfo, fragments, odd schemes, control bytes),
 *                          and derives the origin that keys the breaker;
 *   hub_netguard_blocked() decides whether one resolved address may be
 *                          connected to when private sinks are not allowed.
 *
 * The caller resolves the host, vets every address with
 * hub_netguard_blocked(), and pins the vetted address for the connection
 * (CURLOPT_RESOLVE / CURLOPT_CONNECT_TO), so a second DNS answer cannot
 * rebind the request to a private address.
 */
#ifndef HUB_NETGUARD_H
#define HUB_NETGUARD_H

#include <sys/socket.h>

/*
 * 1 when an address must not be connected to: loopback, private, link-local,
 * CGNAT, multicast, unspecified, broadcast and reserved IPv4 ranges, their
 * IPv6 counterparts, and IPv6 forms that embed a blocked IPv4 address
 * (IPv4-mapped ::ffff:0:0/96, IPv4-translated ::ffff:0:0:0/96,
 * IPv4-compatible ::/96, NAT64 64:ff9b::/96, 6to4 2002::/16).  The full list
 * is in netguard.c.
 *
 * Fails closed: NULL or a family other than AF_INET/AF_INET6 is blocked.
 * sa is borrowed for the call and must be at least as large as its family's
 * struct (sockaddr_in / sockaddr_in6).  0 when the address is public.
 */
int hub_netguard_blocked(const struct sockaddr *sa);

/* A parsed destination URL.  Strings are NUL-terminated and owned by the struct. */
struct hub_url {
    char scheme[8];   /* "http" or "https" */
    char host[256];   /* lower-case; IPv6 literals keep their brackets; IPv4 in any
                         numeric spelling is normalised to dotted quad by libcurl */
    int port;         /* 1..65535; 80/443 when the URL has none */
    char origin[300]; /* "scheme://host:port", always with the port: the breaker key */
    const char *path; /* path and query exactly as written ("/hooks?a=1", or "?a=1"
                         when the path is empty), borrowed from the url string passed
                         to hub_url_parse(); "/" (static) when there is neither */
};

/*
 * Parses an absolute http(s) URL.  Refuses (returns -1, *out zeroed): other
 * schemes, a missing "//", an empty host, userinfo ("user@", ":pass@"),
 * percent-encoding in the authority, an IPv6 zone id, a fragment (even an
 * empty "#"), a port outside 1..65535, bytes outside printable ASCII
 * (spaces, control characters, non-ASCII: IDNs must be given in punycode),
 * backslashes, and hosts longer than 255 bytes.  Returns 0 on success.
 *
 * url is borrowed and must outlive out->path.  Uses libcurl's URL parser
 * (curl_url()), so the hub reads a URL exactly as the dispatcher's libcurl
 * will; it does no DNS and needs no curl_global_init().
 */
int hub_url_parse(const char *url, struct hub_url *out);

#endif
