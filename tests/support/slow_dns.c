/*
 * slow_dns — an LD_PRELOAD shim of getaddrinfo for test_subscriptions_api.sh:
 * a name under hang.test sleeps 3 s then does not resolve (a zone whose
 * servers never answer, without a network), one under nxdomain.test does
 * not resolve at once, one under public.test resolves at once to a public
 * address (192.0.2.1 is TEST-NET-1: documentation, never a real host, and
 * not among the ranges the SSRF guard blocks); any other goes to the real
 * getaddrinfo.  Built without sanitizers: it is preloaded into both trees'
 * hubs (the ASan one with verify_asan_link_order=0).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
    typedef int (*real_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    real_fn real = (real_fn)dlsym(RTLD_NEXT, "getaddrinfo");

    if (node != NULL && ends_with(node, ".hang.test")) {
        sleep(3);
        return EAI_NONAME;
    }
    if (node != NULL && ends_with(node, ".nxdomain.test")) {
        return EAI_NONAME;
    }
    if (node != NULL && ends_with(node, ".public.test")) {
        return real("192.0.2.1", service, hints, res);
    }
    return real(node, service, hints, res);
}
