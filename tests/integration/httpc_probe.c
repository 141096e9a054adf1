/*
 * httpc_probe — drives src/httpc.c against a running hub-sink
 * (tests/support/sink.md) and checks what a caller of the module would
 * notice: statuses, excerpts, Retry-After, redirects not followed, timeouts,
 * the body cap, broken servers, connection reuse, the SSRF guard, error
 * classes and closing with requests in flight.
 *
 *   httpc_probe BASE_URL        (BASE_URL = http://127.0.0.1:PORT of the sink)
 *
 * Prints one line per check, "ok <what>" or "FAIL <what>: <why>", and exits
 * 0 only when every check passed (1 otherwise, 2 on bad usage or a stuck
 * loop).  tests/integration/test_httpc.sh turns the lines into assertions
 * and checks the sink's record for what only the sink can see (headers sent,
 * nothing recorded for blocked requests).  Requests whose path the script
 * looks for use the fixed prefixes /ok/hdr, /ok/par, /ok/blocked*.
 */
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "httpc.h"
#include "netguard.h"
#include "util.h"

#define PROBE_WATCHDOG_MS 60000 /* one wait longer than this means the loop is stuck */
#define PROBE_PARALLEL 200
#define PROBE_PARALLEL_CONNS 16
#define PROBE_MAX_BODY (1024 * 1024)
#define PROBE_HEADER_VALUE "probe-7f3a"
#define PROBE_UA "streaming-hub/probe"

struct probe {
    uv_loop_t loop;
    uv_timer_t watchdog;
    uv_timer_t tick; /* one-shot actions (closing a client mid-flight) */
    char base[256];  /* the sink's base URL, no trailing slash */
    int port;        /* the sink's port */
    int checks;
    int failures;
};

/* What one request's callback saw (copied: the response is borrowed). */
struct call {
    struct probe *p;
    struct hub_httpc *client;
    int calls; /* times the callback ran: must end at exactly 1 */
    enum hub_httpc_error error;
    char error_text[512];
    long status;
    char excerpt[4096];
    size_t excerpt_len;
    int excerpt_terminated; /* excerpt[excerpt_len] was NUL */
    size_t body_len;
    int has_retry_after;
    char retry_after[256];
    int64_t duration_ms;
    uint64_t t0_ns;
    int64_t elapsed_ms; /* measured here, post to callback */
    /* optional work done inside the callback (re-entrancy checks) */
    void (*then)(struct call *);
    struct call *other;
    int then_rc;
};

/* Records one check's outcome; fmt explains a failure. */
__attribute__((format(printf, 4, 5))) static void check(struct probe *p, int ok, const char *what,
                                                        const char *fmt, ...) {
    p->checks++;
    if (ok) {
        printf("ok %s\n", what);
    } else {
        va_list ap;
        p->failures++;
        printf("FAIL %s: ", what);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
    }
    fflush(stdout);
}

static void on_done(void *arg, const struct hub_httpc_response *res) {
    struct call *k = arg;
    size_t n =
        res->excerpt_len < sizeof(k->excerpt) - 1 ? res->excerpt_len : sizeof(k->excerpt) - 1;

    k->calls++;
    k->error = res->error;
    snprintf(k->error_text, sizeof(k->error_text), "%s",
             res->error_text != NULL ? res->error_text : "(null)");
    k->status = res->status;
    if (res->excerpt != NULL) {
        memcpy(k->excerpt, res->excerpt, n);
        k->excerpt_terminated = res->excerpt[res->excerpt_len] == '\0';
    }
    k->excerpt[n] = '\0';
    k->excerpt_len = res->excerpt_len;
    k->body_len = res->body_len;
    k->has_retry_after = res->retry_after != NULL;
    snprintf(k->retry_after, sizeof(k->retry_after), "%s",
             res->retry_after != NULL ? res->retry_after : "");
    k->duration_ms = res->duration_ms;
    k->elapsed_ms = (int64_t)((hub_now_ns() - k->t0_ns) / 1000000u);
    if (k->then != NULL) {
        k->then(k);
    }
    /* let wait_all re-check: a transfer can finish in the timer phase, and
     * uv_run would then go on to block in the poll phase */
    uv_stop(&k->p->loop);
}

/*
 * Starts a POST of body[0..len) to target (a path on the sink, or an
 * absolute URL) with headers (NULL-terminated, may be NULL).  Returns
 * hub_httpc_post's result.
 */
static int start(struct probe *p, struct hub_httpc *client, struct call *k, const char *target,
                 const char *const *headers, const void *body, size_t len, int64_t timeout_ms) {
    char url[1024];
    struct hub_httpc_request req;

    k->p = p;
    k->client = client;
    if (target[0] == '/') {
        snprintf(url, sizeof(url), "%s%s", p->base, target);
    } else {
        snprintf(url, sizeof(url), "%s", target);
    }
    memset(&req, 0, sizeof(req));
    req.url = url;
    req.headers = headers;
    req.body = body;
    req.body_len = len;
    req.timeout_ms = timeout_ms;
    req.connect_timeout_ms = 5000;
    k->t0_ns = hub_now_ns();
    return hub_httpc_post(client, &req, on_done, k);
}

static void watchdog_cb(uv_timer_t *t) {
    printf("FAIL watchdog: nothing finished within %d ms, giving up\n", PROBE_WATCHDOG_MS);
    fflush(stdout);
    exit(2);
}

/* Runs the loop until every one of calls[0..n) has had its callback (each
 * callback stops the loop so that this re-checks). */
static void wait_all(struct probe *p, struct call *calls, size_t n) {
    uv_update_time(&p->loop);
    uv_timer_start(&p->watchdog, watchdog_cb, PROBE_WATCHDOG_MS, 0);
    for (;;) {
        size_t done = 0;
        for (size_t i = 0; i < n; i++) {
            done += calls[i].calls > 0;
        }
        if (done == n) {
            break;
        }
        uv_run(&p->loop, UV_RUN_DEFAULT);
    }
    uv_timer_stop(&p->watchdog);
}

/* One request, waited for.  Returns 0, or -1 when the post was refused. */
static int run1(struct probe *p, struct hub_httpc *client, struct call *k, const char *target,
                const char *const *headers, const void *body, size_t len, int64_t timeout_ms) {
    if (start(p, client, k, target, headers, body, len, timeout_ms) != 0) {
        return -1;
    }
    wait_all(p, k, 1);
    return 0;
}

/* Short description of a result, for failure messages. */
static const char *desc(const struct call *k) {
    static char buf[768];
    snprintf(buf, sizeof(buf),
             "calls=%d error=%s text=\"%s\" status=%ld body_len=%zu "
             "excerpt_len=%zu duration=%" PRId64 " ms elapsed=%" PRId64 " ms",
             k->calls, hub_httpc_error_str(k->error), k->error_text, k->status, k->body_len,
             k->excerpt_len, k->duration_ms, k->elapsed_ms);
    return buf;
}

/* The sink's /_count (requests recorded so far), or -1. */
static long sink_count(struct probe *p, struct hub_httpc *client) {
    struct call k;
    memset(&k, 0, sizeof(k));
    if (run1(p, client, &k, "/_count", NULL, NULL, 0, 5000) != 0 || k.error != HUB_HTTPC_OK ||
        k.status != 200) {
        return -1;
    }
    return strtol(k.excerpt, NULL, 10);
}

/* Peak resident set size of this process, KiB. */
static long maxrss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/*
 * TCP sockets (any state but LISTEN) whose remote port is port: the client
 * sides of connections to the sink, TIME_WAIT included — so a connection
 * opened and closed again still counts.
 */
static long client_sockets_to(int port) {
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    long n = 0;

    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned lport, rport, st;
        if (sscanf(line, " %*d: %*x:%x %*x:%x %x", &lport, &rport, &st) == 3 &&
            (int)rport == port && st != 0x0A) {
            n++;
        }
    }
    fclose(f);
    return n;
}

/* A loopback port nothing listens on (bound, then released). */
static int closed_port(void) {
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int port = 0;

    if (fd < 0) {
        return 0;
    }
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0) {
        port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}

/* ------------------------------------------------------------------------- */

static void case_statuses(struct probe *p, struct hub_httpc *c) {
    struct call k;

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/ok/basic", NULL, "x", 1, 5000);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 200 &&
              strcmp(k.excerpt, "ok") == 0 && k.excerpt_len == 2 && k.body_len == 2 &&
              k.excerpt_terminated && !k.has_retry_after && strcmp(k.error_text, "ok") == 0,
          "200 with excerpt \"ok\"", "%s excerpt=\"%s\"", desc(&k), k.excerpt);

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/status/503/x", NULL, "x", 1, 5000);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 503 &&
              strncmp(k.excerpt, "status 503", 10) == 0,
          "/status/503 is a response (error ok, status 503)", "%s", desc(&k));

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/status/204", NULL, NULL, 0, 5000);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 204 && k.body_len == 0 &&
              k.excerpt_len == 0 && k.excerpt_terminated,
          "/status/204 with an empty POST body: no body", "%s", desc(&k));

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/gone", NULL, "x", 1, 5000);
    check(p, k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 410, "/gone gives 410", "%s",
          desc(&k));

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/retry-after/429/7", NULL, "x", 1, 5000);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 429 && k.has_retry_after &&
              strcmp(k.retry_after, "7") == 0,
          "Retry-After 7 captured from /retry-after/429/7", "%s retry_after=%s\"%s\"", desc(&k),
          k.has_retry_after ? "" : "NULL ", k.retry_after);

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/retry-after/503/Wed,%2021%20Oct%202015%2007:28:00%20GMT", NULL, "x", 1, 5000);
    check(p,
          k.calls == 1 && k.status == 503 && k.has_retry_after &&
              strcmp(k.retry_after, "Wed, 21 Oct 2015 07:28:00 GMT") == 0,
          "Retry-After HTTP-date captured whole", "%s retry_after=\"%s\"", desc(&k), k.retry_after);
}

static void case_redirect(struct probe *p, struct hub_httpc *c) {
    struct call k;
    long before = sink_count(p, c), after;

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/redirect", NULL, "x", 1, 5000);
    after = sink_count(p, c);
    check(p, k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 302,
          "/redirect returns 302 as the response", "%s", desc(&k));
    check(p, before >= 0 && after == before + 1,
          "redirect not followed (the sink recorded only /redirect)",
          "/_count before %ld after %ld", before, after);
}

static void case_timing(struct probe *p, struct hub_httpc *c) {
    struct call k;

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/slow/300", NULL, "x", 1, 2000);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 200 && k.duration_ms >= 290 &&
              k.elapsed_ms >= 290 && k.elapsed_ms < 2000,
          "/slow/300 with timeout 2000: 200 after >= 290 ms (two clocks, ms rounding)", "%s",
          desc(&k));

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/hang", NULL, "x", 1, 500);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_TIMEOUT && k.status == 0 && k.elapsed_ms >= 450 &&
              k.elapsed_ms < 1500,
          "/hang with timeout 500: TIMEOUT after about 500 ms", "%s", desc(&k));
}

static void case_body_cap(struct probe *p, struct hub_httpc *c) {
    const char *paths[] = {"/big", "/big-chunked"};

    for (size_t i = 0; i < 2; i++) {
        struct call k;
        long rss0 = maxrss_kib(), grew;
        char what[128];

        memset(&k, 0, sizeof(k));
        run1(p, c, &k, paths[i], NULL, "x", 1, 20000);
        grew = maxrss_kib() - rss0;
        snprintf(what, sizeof(what), "%s (64 MiB) with a 1 MiB cap: PROTOCOL \"body too large\"",
                 paths[i]);
        check(p,
              k.calls == 1 && k.error == HUB_HTTPC_PROTOCOL &&
                  strcmp(k.error_text, "body too large") == 0 && k.body_len <= PROBE_MAX_BODY &&
                  k.excerpt_len <= 1024,
              what, "%s", desc(&k));
        snprintf(what, sizeof(what),
                 "%s refused quickly (%" PRId64 " ms, %zu body bytes read) "
                 "in little memory (peak RSS +%ld KiB)",
                 paths[i], k.elapsed_ms, k.body_len, grew);
        check(p, k.elapsed_ms < 3000 && grew < 32 * 1024, what, "%s", desc(&k));
    }
}

static void case_broken_servers(struct probe *p, struct hub_httpc *c) {
    struct {
        const char *path;
        enum hub_httpc_error want;
    } cases[] = {
        {"/garbage", HUB_HTTPC_PROTOCOL},
        {"/reset", HUB_HTTPC_CONNECT},
        {"/close", HUB_HTTPC_CONNECT},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct call k;
        char what[128];

        memset(&k, 0, sizeof(k));
        run1(p, c, &k, cases[i].path, NULL, "x", 1, 5000);
        snprintf(what, sizeof(what), "%s gives %s", cases[i].path,
                 hub_httpc_error_str(cases[i].want));
        check(p, k.calls == 1 && k.error == cases[i].want && k.error_text[0] != '\0', what, "%s",
              desc(&k));
    }
    /* and the client still works afterwards */
    {
        struct call k;
        memset(&k, 0, sizeof(k));
        run1(p, c, &k, "/ok/after-broken", NULL, "x", 1, 5000);
        check(p, k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 200,
              "a request after the broken servers succeeds", "%s", desc(&k));
    }
}

static void case_echo_and_headers(struct probe *p, struct hub_httpc *c) {
    static const char body[] = "hello echo \0 binary \xff tail";
    static const char *const hdrs[] = {"Content-Type: application/octet-stream", NULL};
    static const char *const hdrs2[] = {"X-Httpc-Probe: " PROBE_HEADER_VALUE,
                                        "Content-Type: application/cloudevents+json", NULL};
    static const char *const bad_hdrs[] = {"X-Evil: a\r\nX-Injected: b", NULL};
    char long_body[3000];
    struct call k;

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/echo/binary", hdrs, body, sizeof(body) - 1, 5000);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 200 &&
              k.body_len == sizeof(body) - 1 && k.excerpt_len == sizeof(body) - 1 &&
              memcmp(k.excerpt, body, sizeof(body) - 1) == 0 && k.excerpt_terminated,
          "/echo returns the (binary) body byte for byte", "%s", desc(&k));

    memset(long_body, 'a', sizeof(long_body));
    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/echo/long", hdrs, long_body, sizeof(long_body), 5000);
    check(p,
          k.calls == 1 && k.error == HUB_HTTPC_OK && k.body_len == sizeof(long_body) &&
              k.excerpt_len == 1024 && k.excerpt_terminated && strlen(k.excerpt) == 1024,
          "a 3000-byte body: excerpt is the first 1024 bytes, body_len 3000", "%s", desc(&k));

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "/ok/hdr", hdrs2, "{}", 2, 5000);
    check(p, k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 200,
          "request with custom headers (checked in the sink's record)", "%s", desc(&k));

    memset(&k, 0, sizeof(k));
    check(p, start(p, c, &k, "/ok/injected", bad_hdrs, "x", 1, 5000) == -1 && k.calls == 0,
          "a header line with CR/LF is refused at once", "post accepted it");
    check(p,
          start(p, c, &k, "ftp://127.0.0.1/x", NULL, "x", 1, 5000) == -1 &&
              start(p, c, &k, "http://user@127.0.0.1/x", NULL, "x", 1, 5000) == -1 &&
              start(p, c, &k, "not a url", NULL, "x", 1, 5000) == -1 && k.calls == 0,
          "bad URLs are refused at once without a callback", "post accepted one");
}

static void chain_next(struct call *k) {
    k->then_rc = start(k->p, k->client, k->other, "/status/201/chain-2", NULL, "y", 1, 5000);
}

static void case_chain(struct probe *p, struct hub_httpc *c) {
    struct call k[2];

    memset(k, 0, sizeof(k));
    k[0].then = chain_next;
    k[0].other = &k[1];
    if (start(p, c, &k[0], "/ok/chain-1", NULL, "x", 1, 5000) != 0) {
        check(p, 0, "a callback can start the next request", "post refused");
        return;
    }
    wait_all(p, &k[0], 1);
    if (k[0].then_rc == 0) {
        wait_all(p, &k[1], 1);
    }
    check(p, k[0].status == 200 && k[0].then_rc == 0 && k[1].calls == 1 && k[1].status == 201,
          "a callback can start the next request", "first: %s; second post rc %d status %ld",
          desc(&k[0]), k[0].then_rc, k[1].status);
}

static void case_parallel(struct probe *p) {
    struct hub_httpc_options o = {.allow_private = 1,
                                  .max_connections = PROBE_PARALLEL_CONNS,
                                  .excerpt_bytes = 1024,
                                  .max_body_bytes = PROBE_MAX_BODY,
                                  .user_agent = PROBE_UA};
    struct hub_httpc *c = hub_httpc_new(&p->loop, &o);
    struct call *k = calloc(PROBE_PARALLEL, sizeof(*k));
    long socks0, socks1;
    uint64_t t0;
    int started = 0, good = 0;

    if (c == NULL || k == NULL) {
        check(p, 0, "parallel: client", "cannot create the client");
        free(k);
        hub_httpc_close(c);
        return;
    }
    socks0 = client_sockets_to(p->port);
    t0 = hub_now_ns();
    for (int i = 0; i < PROBE_PARALLEL; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/ok/par/%d", i);
        started += start(p, c, &k[i], path, NULL, "x", 1, 10000) == 0;
    }
    check(p, started == PROBE_PARALLEL && hub_httpc_inflight(c) == PROBE_PARALLEL,
          "200 parallel requests started", "started %d, inflight %zu", started,
          hub_httpc_inflight(c));
    wait_all(p, k, (size_t)started);
    socks1 = client_sockets_to(p->port);
    for (int i = 0; i < started; i++) {
        good += k[i].calls == 1 && k[i].error == HUB_HTTPC_OK && k[i].status == 200;
    }
    {
        int64_t ms = (int64_t)((hub_now_ns() - t0) / 1000000u);
        char what[160];
        snprintf(what, sizeof(what), "200 parallel requests all 200 in %" PRId64 " ms", ms);
        check(p, good == PROBE_PARALLEL && ms < 10000 && hub_httpc_inflight(c) == 0, what,
              "%d good; first: %s", good, desc(&k[0]));
        snprintf(what, sizeof(what),
                 "connections reused: %ld new client sockets for 200 requests (max %d)",
                 socks1 - socks0, PROBE_PARALLEL_CONNS);
        check(p, socks0 >= 0 && socks1 - socks0 <= PROBE_PARALLEL_CONNS, what,
              "before %ld after %ld", socks0, socks1);
    }
    hub_httpc_close(c);
    free(k);
}

/*
 * Keep-alive across bursts: a wave of parallel requests, then another.  By
 * default libcurl keeps 4 × the transfers in progress, so as the first wave
 * drains it closes connections that the second wave opens again; with
 * cached_connections every connection of the first wave serves the second.
 */
static void case_waves(struct probe *p) {
    struct hub_httpc_options o = {
        .allow_private = 1, .cached_connections = PROBE_PARALLEL_CONNS, .user_agent = PROBE_UA};
    struct hub_httpc *c = hub_httpc_new(&p->loop, &o);
    struct call k[PROBE_PARALLEL_CONNS];
    long socks[3];
    int good = 0;
    char what[160];

    if (c == NULL) {
        check(p, 0, "waves: client", "cannot create the client");
        return;
    }
    socks[0] = client_sockets_to(p->port);
    for (int wave = 0; wave < 2; wave++) {
        int started = 0;
        memset(k, 0, sizeof(k));
        for (int i = 0; i < PROBE_PARALLEL_CONNS; i++) {
            char path[64];
            snprintf(path, sizeof(path), "/ok/wave/%d/%d", wave, i);
            started += start(p, c, &k[i], path, NULL, "x", 1, 5000) == 0;
        }
        wait_all(p, k, (size_t)started);
        for (int i = 0; i < started; i++) {
            good += k[i].calls == 1 && k[i].error == HUB_HTTPC_OK && k[i].status == 200;
        }
        socks[wave + 1] = client_sockets_to(p->port);
    }
    snprintf(what, sizeof(what),
             "keep-alive across bursts: %d of %d ok, the second wave opened %ld connection(s)",
             good, 2 * PROBE_PARALLEL_CONNS, socks[2] - socks[1]);
    /* "<= 1": a TIME_WAIT of an earlier user of the port may expire meanwhile */
    check(p, good == 2 * PROBE_PARALLEL_CONNS && socks[0] >= 0 && socks[2] - socks[1] <= 1, what,
          "sockets %ld, %ld, %ld", socks[0], socks[1], socks[2]);
    hub_httpc_close(c);
}

/* Keep-alive: sequential requests on a fresh client share one connection. */
static void case_keepalive(struct probe *p) {
    struct hub_httpc_options o = {.allow_private = 1, .user_agent = PROBE_UA};
    struct hub_httpc *c = hub_httpc_new(&p->loop, &o);
    long socks0, socks1;
    int good = 0;
    char what[128];

    if (c == NULL) {
        check(p, 0, "keep-alive: client", "cannot create the client");
        return;
    }
    socks0 = client_sockets_to(p->port);
    for (int i = 0; i < 20; i++) {
        struct call k;
        char path[64];
        memset(&k, 0, sizeof(k));
        snprintf(path, sizeof(path), "/ok/seq/%d", i);
        run1(p, c, &k, path, NULL, "x", 1, 5000);
        good += k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 200;
    }
    socks1 = client_sockets_to(p->port);
    snprintf(what, sizeof(what),
             "keep-alive: 20 sequential requests, %d ok, over %ld connection(s)", good,
             socks1 - socks0);
    /* "<= 1": a TIME_WAIT left by an earlier user of the port may expire
     * meanwhile; without reuse this would be 20 */
    check(p, good == 20 && socks0 >= 0 && socks1 - socks0 <= 1, what, "before %ld after %ld",
          socks0, socks1);
    hub_httpc_close(c);
}

/*
 * A keep-alive connection the server closes while idle.  libcurl stops
 * watching a connection between requests but the client leaves its poll
 * in place (see src/httpc.c): the poll must stop when the server's FIN
 * makes it readable, or the loop spins on it, and the next request must
 * still get through on a new connection.  The server is a canned one in
 * this process: it answers the first bytes of each connection with a fixed
 * keep-alive 200 and closes the connection IDLE_CLOSE_MS later.
 */
#define IDLE_CLOSE_MS 50

struct idle_server {
    uv_tcp_t listener;
    uv_check_t turns; /* counts the loop's turns */
    long n_turns;
    int accepted;
    int closed; /* of listener and turns */
};

struct idle_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wr;
    int answered;
    int open_handles;
    char buf[4096];
};

static const char idle_answer[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                  "Content-Length: 2\r\n\r\nok";

static void idle_conn_closed(uv_handle_t *h) {
    struct idle_conn *ic = h->data;
    if (--ic->open_handles == 0) {
        free(ic);
    }
}

static void idle_conn_close(struct idle_conn *ic) {
    if (!uv_is_closing((uv_handle_t *)&ic->tcp)) {
        uv_close((uv_handle_t *)&ic->tcp, idle_conn_closed);
        uv_close((uv_handle_t *)&ic->timer, idle_conn_closed);
    }
}

static void idle_timer_cb(uv_timer_t *t) {
    idle_conn_close(t->data);
}

static void idle_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
    struct idle_conn *ic = h->data;
    (void)hint;
    *buf = uv_buf_init(ic->buf, sizeof(ic->buf));
}

static void idle_read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    struct idle_conn *ic = st->data;
    (void)buf;
    if (n < 0) {
        idle_conn_close(ic);
        return;
    }
    if (n > 0 && !ic->answered) {
        /* one small request per connection: its first bytes are enough */
        uv_buf_t b = uv_buf_init((char *)idle_answer, sizeof(idle_answer) - 1);
        ic->answered = 1;
        uv_write(&ic->wr, st, &b, 1, NULL);
        uv_timer_start(&ic->timer, idle_timer_cb, IDLE_CLOSE_MS, 0);
    }
}

static void idle_accept_cb(uv_stream_t *l, int status) {
    struct idle_server *srv = l->data;
    struct idle_conn *ic;

    if (status < 0 || (ic = calloc(1, sizeof(*ic))) == NULL) {
        return;
    }
    uv_tcp_init(l->loop, &ic->tcp);
    uv_timer_init(l->loop, &ic->timer);
    ic->tcp.data = ic->timer.data = ic;
    ic->open_handles = 2;
    if (uv_accept(l, (uv_stream_t *)&ic->tcp) != 0) {
        idle_conn_close(ic);
        return;
    }
    srv->accepted++;
    uv_read_start((uv_stream_t *)&ic->tcp, idle_alloc_cb, idle_read_cb);
}

static void count_turn(uv_check_t *h) {
    ((struct idle_server *)h->data)->n_turns++;
}

static void idle_server_closed(uv_handle_t *h) {
    ((struct idle_server *)h->data)->closed++;
}

static void stop_loop(uv_timer_t *t) {
    uv_stop(t->loop);
}

static void case_idle_close(struct probe *p) {
    struct hub_httpc_options o = {.allow_private = 1, .user_agent = PROBE_UA};
    struct idle_server srv;
    struct sockaddr_in a;
    int alen = sizeof(a);
    struct hub_httpc *c;
    struct call k[2];
    char url[64];

    memset(&srv, 0, sizeof(srv));
    memset(k, 0, sizeof(k));
    uv_ip4_addr("127.0.0.1", 0, &a);
    uv_tcp_init(&p->loop, &srv.listener);
    uv_check_init(&p->loop, &srv.turns);
    srv.listener.data = srv.turns.data = &srv;
    if (uv_tcp_bind(&srv.listener, (const struct sockaddr *)&a, 0) != 0 ||
        uv_listen((uv_stream_t *)&srv.listener, 16, idle_accept_cb) != 0 ||
        uv_tcp_getsockname(&srv.listener, (struct sockaddr *)&a, &alen) != 0 ||
        (c = hub_httpc_new(&p->loop, &o)) == NULL) {
        check(p, 0, "idle close: set-up", "cannot listen or create the client");
        c = NULL;
        goto out;
    }
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/idle", ntohs(a.sin_port));
    run1(p, c, &k[0], url, NULL, "x", 1, 5000);
    /* the server closes the idle connection; count the loop's turns meanwhile */
    uv_check_start(&srv.turns, count_turn);
    uv_update_time(&p->loop);
    uv_timer_start(&p->tick, stop_loop, 4 * IDLE_CLOSE_MS, 0);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    uv_check_stop(&srv.turns);
    run1(p, c, &k[1], url, NULL, "x", 1, 5000);
    check(p,
          k[0].error == HUB_HTTPC_OK && k[0].status == 200 && k[1].error == HUB_HTTPC_OK &&
              k[1].status == 200 && srv.accepted == 2,
          "idle close: a request after the server closed the idle connection succeeds",
          "first: %s %ld; second: %s; connections accepted %d", hub_httpc_error_str(k[0].error),
          k[0].status, desc(&k[1]), srv.accepted);
    /* a few turns: the FIN, the server's timer and close; a poll left
     * readable would have made thousands */
    check(p, srv.n_turns < 50, "idle close: the loop does not spin on a closed idle connection",
          "%ld loop turns in %d ms", srv.n_turns, 4 * IDLE_CLOSE_MS);
out:
    hub_httpc_close(c);
    /* srv is on this stack: its handles must be closed before it goes */
    uv_close((uv_handle_t *)&srv.listener, idle_server_closed);
    uv_close((uv_handle_t *)&srv.turns, idle_server_closed);
    while (srv.closed < 2) {
        uv_run(&p->loop, UV_RUN_ONCE);
    }
}

/*
 * A lookup that ends without a connect (here the guard refuses the address
 * the machine's own name resolves to) must leave no poll behind on the
 * resolver's socket, which libcurl closes itself: a stale poll made libuv
 * refuse a descriptor the process opened next with the same number (a
 * database connection: uv_poll_init's EEXIST), or took its events (an
 * accepted API connection, then stopped), found in review.  The next 32
 * sockets take the lowest free numbers, the resolver's among them.
 */
static void case_resolver_leaves_no_poll(struct probe *p, struct hub_httpc *c) {
    char host[256], url[400];
    struct addrinfo *ai = NULL;
    uv_poll_t polls[32];
    int fds[32], n = 0, taken = 0;
    struct call k;

    if (gethostname(host, sizeof(host)) != 0 || getaddrinfo(host, NULL, NULL, &ai) != 0) {
        check(p, 1, "resolver: (skipped: the machine's name does not resolve)", "%s", host);
        return;
    }
    freeaddrinfo(ai);
    snprintf(url, sizeof(url), "http://%s:%d/ok/blocked-host", host, p->port);
    memset(&k, 0, sizeof(k));
    run1(p, c, &k, url, NULL, "x", 1, 5000);
    check(p, k.calls == 1, "resolver: a request to the machine's name ended", "%s", desc(&k));
    for (n = 0; n < 32; n++) {
        fds[n] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[n] < 0) {
            break;
        }
        if (uv_poll_init_socket(&p->loop, &polls[n], fds[n]) != 0) {
            taken++;
            polls[n].type = UV_UNKNOWN_HANDLE; /* not initialised: nothing to close */
        }
    }
    for (int i = 0; i < n; i++) {
        if (polls[i].type == UV_POLL) {
            uv_close((uv_handle_t *)&polls[i], NULL);
        }
    }
    uv_run(&p->loop, UV_RUN_NOWAIT); /* the closes end before their sockets */
    for (int i = 0; i < n; i++) {
        close(fds[i]);
    }
    check(p, n == 32 && taken == 0, "resolver: a lookup without a connect leaves no poll behind",
          "%d of %d new sockets were already watched by libuv", taken, n);
}

static void case_guard(struct probe *p, struct hub_httpc *open) {
    struct hub_httpc_options o = {.allow_private = 0, .user_agent = PROBE_UA};
    struct hub_httpc *c = hub_httpc_new(&p->loop, &o);
    char url[3][300];
    const char *what[3] = {"SSRF guard: 127.0.0.1 is BLOCKED without allow_private",
                           "SSRF guard: localhost (after DNS) is BLOCKED",
                           "SSRF guard: [::1] is BLOCKED"};
    long before, after;

    if (c == NULL) {
        check(p, 0, "guard: client", "cannot create the client");
        return;
    }
    snprintf(url[0], sizeof(url[0]), "%s/ok/blocked-ip", p->base);
    snprintf(url[1], sizeof(url[1]), "http://localhost:%d/ok/blocked-name", p->port);
    snprintf(url[2], sizeof(url[2]), "http://[::1]:%d/ok/blocked-v6", p->port);
    before = sink_count(p, open);
    for (int i = 0; i < 3; i++) {
        struct call k;
        memset(&k, 0, sizeof(k));
        run1(p, c, &k, url[i], NULL, "x", 1, 5000);
        check(p,
              k.calls == 1 && k.error == HUB_HTTPC_BLOCKED && k.status == 0 &&
                  strstr(k.error_text, "blocked") != NULL &&
                  strstr(k.error_text, "127.0.0.1") == NULL && strstr(k.error_text, "::1") == NULL,
              what[i], "%s", desc(&k));
    }
    case_resolver_leaves_no_poll(p, c);
    after = sink_count(p, open);
    check(p, before >= 0 && after == before, "SSRF guard: the sink recorded nothing",
          "/_count before %ld after %ld", before, after);
    hub_httpc_close(c);

    {
        struct call k;
        memset(&k, 0, sizeof(k));
        run1(p, open, &k, "/ok/allowed", NULL, "x", 1, 5000);
        check(p, k.calls == 1 && k.error == HUB_HTTPC_OK && k.status == 200,
              "with allow_private=1 the same sink is reached", "%s", desc(&k));
    }
}

static void case_errors(struct probe *p, struct hub_httpc *c) {
    struct call k;
    char url[300];
    int port = closed_port();

    memset(&k, 0, sizeof(k));
    run1(p, c, &k, "http://nonexistent.invalid/ok", NULL, "x", 1, 10000);
    check(p, k.calls == 1 && k.error == HUB_HTTPC_DNS && k.status == 0,
          "unresolvable host gives DNS", "%s", desc(&k));

    memset(&k, 0, sizeof(k));
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/ok", port);
    run1(p, c, &k, url, NULL, "x", 1, 5000);
    check(p, port > 0 && k.calls == 1 && k.error == HUB_HTTPC_CONNECT && k.status == 0,
          "closed port gives CONNECT", "port %d %s", port, desc(&k));

    /* TLS to a cleartext port: the handshake cannot succeed */
    memset(&k, 0, sizeof(k));
    snprintf(url, sizeof(url), "https://127.0.0.1:%d/ok/tls", p->port);
    run1(p, c, &k, url, NULL, "x", 1, 5000);
    check(p, k.calls == 1 && k.error == HUB_HTTPC_TLS && k.status == 0,
          "https to a cleartext port gives TLS", "%s", desc(&k));
}

/* Closing with requests in flight. */

static void close_tick(uv_timer_t *t) {
    hub_httpc_close(t->data);
}

static void try_post_while_closing(struct call *k) {
    struct call other;
    memset(&other, 0, sizeof(other));
    k->then_rc = start(k->p, k->client, &other, "/ok/after-close", NULL, "x", 1, 5000);
}

static void close_in_callback(struct call *k) {
    hub_httpc_close(k->client);
}

static void case_close(struct probe *p) {
    struct hub_httpc_options o = {.allow_private = 1, .user_agent = PROBE_UA};
    struct hub_httpc *c = hub_httpc_new(&p->loop, &o);
    struct call k[4];
    int started = 0, good = 0;

    if (c == NULL) {
        check(p, 0, "close: client", "cannot create the client");
        return;
    }
    memset(k, 0, sizeof(k));
    k[0].then = try_post_while_closing;
    k[0].then_rc = 99;
    started += start(p, c, &k[0], "/hang/close-1", NULL, "x", 1, 10000) == 0;
    started += start(p, c, &k[1], "/hang/close-2", NULL, "x", 1, 10000) == 0;
    started += start(p, c, &k[2], "/hang/close-3", NULL, "x", 1, 10000) == 0;
    started += start(p, c, &k[3], "/slow/5000/close-4", NULL, "x", 1, 10000) == 0;
    p->tick.data = c;
    /* the loop's cached time is as old as its last turn (the previous case
     * may have ended a while ago); the 300 ms count from the posts above */
    uv_update_time(&p->loop);
    uv_timer_start(&p->tick, close_tick, 300, 0);
    wait_all(p, k, 4);
    for (int i = 0; i < 4; i++) {
        good += k[i].calls == 1 && k[i].error == HUB_HTTPC_INTERNAL &&
                strcmp(k[i].error_text, "closing") == 0 && k[i].elapsed_ms >= 250 &&
                k[i].elapsed_ms < 3000;
    }
    check(p, started == 4 && good == 4,
          "close with 4 requests in flight: each callback once, INTERNAL \"closing\"",
          "started %d good %d; first: %s", started, good, desc(&k[0]));
    check(p, k[0].then_rc == -1, "a post from a callback during close is refused",
          "post returned %d", k[0].then_rc);

    /* close from inside a completion callback */
    c = hub_httpc_new(&p->loop, &o);
    if (c == NULL) {
        check(p, 0, "close: client", "cannot create the client");
        return;
    }
    memset(k, 0, sizeof(k));
    k[1].then = close_in_callback;
    started = start(p, c, &k[0], "/hang/close-5", NULL, "x", 1, 10000) == 0;
    started += start(p, c, &k[1], "/ok/close-6", NULL, "x", 1, 10000) == 0;
    wait_all(p, k, 2);
    check(p,
          started == 2 && k[1].calls == 1 && k[1].status == 200 && k[0].calls == 1 &&
              k[0].error == HUB_HTTPC_INTERNAL,
          "hub_httpc_close from a completion callback completes the rest with INTERNAL",
          "started %d; ok: %s; hang: error %s calls %d", started, desc(&k[1]),
          hub_httpc_error_str(k[0].error), k[0].calls);
}

int main(int argc, char **argv) {
    struct probe p;
    struct hub_url u;
    struct hub_httpc *c;
    struct hub_httpc_options o = {.allow_private = 1,
                                  .max_connections = 0,
                                  .excerpt_bytes = 1024,
                                  .max_body_bytes = PROBE_MAX_BODY,
                                  .user_agent = PROBE_UA};
    size_t n;
    int rc;

    if (argc != 2 || hub_url_parse(argv[1], &u) != 0) {
        fprintf(stderr, "usage: httpc_probe http://127.0.0.1:PORT\n");
        return 2;
    }
    memset(&p, 0, sizeof(p));
    snprintf(p.base, sizeof(p.base), "%s", argv[1]);
    n = strlen(p.base);
    while (n > 0 && p.base[n - 1] == '/') {
        p.base[--n] = '\0';
    }
    p.port = u.port;
    if (uv_loop_init(&p.loop) != 0 || uv_timer_init(&p.loop, &p.watchdog) != 0 ||
        uv_timer_init(&p.loop, &p.tick) != 0) {
        fprintf(stderr, "httpc_probe: cannot set up the loop\n");
        return 2;
    }
    c = hub_httpc_new(&p.loop, &o);
    if (c == NULL) {
        fprintf(stderr, "httpc_probe: cannot create the client\n");
        return 2;
    }
    check(&p, 1, "client created", "-");

    case_statuses(&p, c);
    case_redirect(&p, c);
    case_timing(&p, c);
    case_body_cap(&p, c);
    case_broken_servers(&p, c);
    case_echo_and_headers(&p, c);
    case_chain(&p, c);
    case_guard(&p, c);
    case_errors(&p, c);
    case_keepalive(&p);
    case_idle_close(&p);
    case_waves(&p);
    case_parallel(&p);
    case_close(&p);

    check(&p, hub_httpc_inflight(c) == 0, "nothing left in flight", "inflight %zu",
          hub_httpc_inflight(c));
    hub_httpc_close(c);
    uv_close((uv_handle_t *)&p.watchdog, NULL);
    uv_close((uv_handle_t *)&p.tick, NULL);
    uv_run(&p.loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(&p.loop);
    /* uv_strerror(0) allocates an "Unknown system error" string that is never freed */
    check(&p, rc == 0, "every uv handle closed after hub_httpc_close", "uv_loop_close: %s",
          rc == 0 ? "ok" : uv_err_name(rc));
    printf("%d checks, %d failed\n", p.checks, p.failures);
    return p.failures == 0 ? 0 : 1;
}
