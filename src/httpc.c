/*
 * httpc — outgoing HTTP on libcurl's multi interface, driven by libuv.
 *
 * The model is the one of curl's docs/examples/multi-uv.c:
 *
 *   - one CURLM per client, so every request shares one connection cache
 *     (keep-alive, HTTP/2 multiplexing over TLS);
 *   - CURLMOPT_SOCKETFUNCTION tells us which sockets to watch: each gets a
 *     struct httpc_sock (uv_poll_t + the socket), remembered by libcurl with
 *     curl_multi_assign() and by us in c->by_fd;
 *   - a socket's poll lives as long as the socket, not as long as libcurl
 *     watches it: a keep-alive connection is dropped from libcurl's watch
 *     (CURL_POLL_REMOVE) after every response and taken back by the next
 *     request.  Closing and re-creating the poll each time cost the
 *     dispatcher 2.4 epoll_ctl calls and half an ioctl per request
 *     (strace); now a poll is left as it was (and stopped only if it fires
 *     while libcurl is not watching) and closed when libcurl closes the
 *     socket (CURLOPT_CLOSESOCKETFUNCTION).  Only for the sockets libcurl
 *     opened through CURLOPT_OPENSOCKETFUNCTION: the threaded resolver's
 *     socketpair is closed by libcurl itself, so its poll is closed at its
 *     CURL_POLL_REMOVE (left open, libuv kept watching a descriptor number
 *     the process would reuse);
 *   - CURLMOPT_TIMERFUNCTION arms the client's one uv_timer_t;
 *   - poll and timer callbacks call curl_multi_socket_action(), then
 *     httpc_drain() hands finished transfers to their callbacks.
 *
 * A request is a struct httpc_req: the easy handle plus everything the
 * transfer needs (callback, response buffers, header list), attached to the
 * easy handle with CURLOPT_PRIVATE.  Finished requests go to a small free
 * list so that the easy handle (and its buffers) is reused by the next one.
 *
 * SSRF guard (SPEC §11): CURLOPT_OPENSOCKETFUNCTION sees every address
 * libcurl is about to connect to — after DNS, for every address of a
 * happy-eyeballs race — and refuses the non-public ones unless the client
 * allows private sinks.  Because the check is on the address the socket is
 * actually opened for, a second DNS answer cannot rebind the request to a
 * private address.  Proxies are disabled (CURLOPT_PROXY ""), so
 * http_proxy / https_proxy in the environment cannot route around it.
 *
 * Re-entrancy: user callbacks run only from httpc_drain() and
 * hub_httpc_close(), never inside a libcurl callback, so they may call
 * hub_httpc_post() (a retry) or hub_httpc_close().  The client's memory
 * lives until the last uv handle is closed, which is always later than the
 * callback that asked for the close.
 */
#include "httpc.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "netguard.h"
#include "util.h"

#define HTTPC_EXCERPT_DEFAULT 1024
#define HTTPC_MAX_BODY_DEFAULT (1024 * 1024)
#define HTTPC_TIMEOUT_DEFAULT_MS 30000 /* STREAMING_HUB_DELIVERY_TIMEOUT default */
#define HTTPC_CONNECT_DEFAULT_MS 5000
#define HTTPC_IDLE_MAX 64         /* idle easy handles kept for reuse */
#define HTTPC_RETRY_AFTER_MAX 128 /* longer Retry-After values are ignored */

/* One socket libcurl asked us to watch, until libcurl closes it. */
struct httpc_sock {
    uv_poll_t poll; /* freed (with the struct) in httpc_sock_closed */
    struct hub_httpc *c;
    curl_socket_t fd;
    int want;                /* UV_READABLE|UV_WRITABLE libcurl watches; 0: none now */
    int watching;            /* what the poll is started with; 0: stopped */
    int ours;                /* opened by httpc_opensocket_cb: httpc_closesocket_cb
                              * closes it, so its poll may outlive a REMOVE */
    struct httpc_sock *prev; /* c->socks, while the poll is open */
    struct httpc_sock *next;
};

/* One request: the easy handle and all per-transfer state (CURLOPT_PRIVATE). */
struct httpc_req {
    struct hub_httpc *c;
    CURL *easy;
    hub_httpc_cb cb;
    void *arg;
    struct curl_slist *headers; /* caller's lines + "Expect:", in hdr_mem */
    void *hdr_mem;              /* the list's nodes and lines, reused; wiped after each
                                 * request (destination credentials, SPEC §11) */
    size_t hdr_cap;
    size_t hdr_used;
    int configured; /* the options every request shares are set */
    uint64_t started_ns;
    size_t body_len;    /* body bytes accepted (never more than max_body) */
    size_t excerpt_len; /* bytes in excerpt[], <= excerpt_max */
    size_t excerpt_max; /* this request's excerpt (hub_httpc_request.excerpt_bytes) */
    size_t excerpt_cap; /* room in excerpt[] (the client's excerpt_bytes, or more) */
    int too_big;        /* the write callback refused more body */
    int blocked;        /* the SSRF guard refused an address */
    int has_retry_after;
    char retry_after[HTTPC_RETRY_AFTER_MAX];
    char blocked_addr[INET6_ADDRSTRLEN];
    char errbuf[CURL_ERROR_SIZE]; /* CURLOPT_ERRORBUFFER */
    char error_text[CURL_ERROR_SIZE + 64];
    struct httpc_req *prev; /* c->active while in flight, c->idle (next only) when idle */
    struct httpc_req *next;
    char excerpt[]; /* excerpt_cap + 1 */
};

struct hub_httpc {
    uv_loop_t *loop;
    CURLM *multi;
    uv_timer_t timer; /* CURLMOPT_TIMERFUNCTION's timer */
    int allow_private;
    long max_connections;
    size_t excerpt_bytes;
    size_t max_body_bytes;
    char *user_agent;
    char *ca_file;            /* NULL: libcurl's (the system's) CA bundle */
    struct httpc_req *active; /* in flight (doubly linked) */
    struct httpc_req *idle;   /* for reuse (singly linked) */
    size_t n_idle;
    size_t inflight;
    struct httpc_sock *socks;  /* open polls */
    struct httpc_sock **by_fd; /* the open poll of each socket, by descriptor */
    unsigned char *ours;       /* by descriptor: opened by httpc_opensocket_cb */
    size_t n_by_fd;            /* entries of both */
    int handles;               /* open uv handles: the timer and the polls */
    int closing;
};

static struct httpc_sock *httpc_sock_find(const struct hub_httpc *c, curl_socket_t fd);
static int httpc_sock_track(struct hub_httpc *c, curl_socket_t fd);
static void httpc_sock_close(struct hub_httpc *c, struct httpc_sock *s);

/* ------------------------------------------------------------------------- */
/* Requests: allocation, reuse                                                */
/* ------------------------------------------------------------------------- */

/* Frees a request that is in no list and not attached to the multi handle. */
static void httpc_req_destroy(struct httpc_req *r) {
    curl_easy_cleanup(r->easy);
    if (r->hdr_mem != NULL) {
        OPENSSL_cleanse(r->hdr_mem, r->hdr_used);
    }
    free(r->hdr_mem);
    free(r);
}

/*
 * An idle request: from the free list, or new.  Returns NULL when out of
 * memory.  The easy handle carries no options, or (r->configured) those
 * every request of the client shares (see httpc_setup).
 */
static struct httpc_req *httpc_req_get(struct hub_httpc *c, size_t excerpt) {
    struct httpc_req *r = c->idle;
    size_t cap = excerpt > c->excerpt_bytes ? excerpt : c->excerpt_bytes;

    /* idle requests have the client's room; a larger excerpt is a new one */
    if (r != NULL && cap == c->excerpt_bytes) {
        c->idle = r->next;
        c->n_idle--;
        r->next = NULL;
        return r;
    }
    r = calloc(1, sizeof(*r) + cap + 1);
    if (r == NULL) {
        return NULL;
    }
    r->excerpt_cap = cap;
    r->c = c;
    r->easy = curl_easy_init();
    if (r->easy == NULL) {
        free(r);
        return NULL;
    }
    return r;
}

/*
 * Takes back a request that is in no list and detached from the multi
 * handle: kept for reuse while the free list is short and the client is
 * open, destroyed otherwise.  A kept easy handle keeps the options every
 * request shares (curl_easy_reset and setting them again were 3.5% of the
 * dispatcher's CPU) but not the body's copy.
 */
static void httpc_req_release(struct hub_httpc *c, struct httpc_req *r) {
    if (c->closing || c->n_idle >= HTTPC_IDLE_MAX || r->excerpt_cap != c->excerpt_bytes) {
        httpc_req_destroy(r);
        return;
    }
    r->headers = NULL;
    /* the lines held the destination's credential headers: plaintext for
     * one request only (SPEC §11) */
    if (r->hdr_mem != NULL) {
        OPENSSL_cleanse(r->hdr_mem, r->hdr_used);
    }
    r->hdr_used = 0;
    r->cb = NULL;
    r->arg = NULL;
    if (!r->configured || curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, "") != CURLE_OK) {
        /* a setup that failed half way: start again from nothing (keeps
         * the connection cache, which belongs to the multi handle) */
        curl_easy_reset(r->easy);
        r->configured = 0;
    }
    r->prev = NULL;
    r->next = c->idle;
    c->idle = r;
    c->n_idle++;
}

static void httpc_active_link(struct hub_httpc *c, struct httpc_req *r) {
    r->prev = NULL;
    r->next = c->active;
    if (c->active != NULL) {
        c->active->prev = r;
    }
    c->active = r;
    c->inflight++;
}

static void httpc_active_unlink(struct hub_httpc *c, struct httpc_req *r) {
    if (r->prev != NULL) {
        r->prev->next = r->next;
    } else {
        c->active = r->next;
    }
    if (r->next != NULL) {
        r->next->prev = r->prev;
    }
    r->prev = NULL;
    r->next = NULL;
    c->inflight--;
}

/* ------------------------------------------------------------------------- */
/* Per-transfer libcurl callbacks                                            */
/* ------------------------------------------------------------------------- */

/*
 * CURLOPT_WRITEFUNCTION: keeps the first excerpt_bytes of the body
 * (NUL-terminated) and counts the rest.  More than max_body_bytes in all
 * aborts the transfer (returning less than was given makes libcurl fail it
 * with CURLE_WRITE_ERROR), reported as PROTOCOL "body too large".
 */
static size_t httpc_write_cb(char *data, size_t size, size_t nmemb, void *userdata) {
    struct httpc_req *r = userdata;
    struct hub_httpc *c = r->c;
    size_t n = size * nmemb;
    size_t room = r->excerpt_max - r->excerpt_len;

    if (n > c->max_body_bytes - r->body_len) {
        r->too_big = 1;
        return 0;
    }
    if (room > 0) {
        size_t keep = n < room ? n : room;
        memcpy(r->excerpt + r->excerpt_len, data, keep);
        r->excerpt_len += keep;
        r->excerpt[r->excerpt_len] = '\0';
    }
    r->body_len += n;
    return n;
}

/*
 * CURLOPT_HEADERFUNCTION: captures Retry-After (name case-insensitive, value
 * trimmed) of the final response.  A status line starts a new response (an
 * interim 1xx, or HTTP/2's ":status" which libcurl renders as "HTTP/2 NNN"),
 * so what an earlier one said is forgotten.  Empty, overlong or
 * non-printable values are ignored: the caller parses what we keep.
 */
static size_t httpc_header_cb(char *buf, size_t size, size_t nitems, void *userdata) {
    static const char name[] = "retry-after:";
    struct httpc_req *r = userdata;
    size_t len = size * nitems;
    const char *v, *end;

    if (len >= 5 && memcmp(buf, "HTTP/", 5) == 0) {
        r->has_retry_after = 0;
        return len;
    }
    if (len < sizeof(name) - 1 || strncasecmp(buf, name, sizeof(name) - 1) != 0) {
        return len;
    }
    v = buf + sizeof(name) - 1;
    end = buf + len;
    while (v < end && (*v == ' ' || *v == '\t')) {
        v++;
    }
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    r->has_retry_after = 0;
    if (end == v || (size_t)(end - v) >= sizeof(r->retry_after)) {
        return len;
    }
    for (const char *p = v; p < end; p++) {
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) {
            return len;
        }
    }
    memcpy(r->retry_after, v, (size_t)(end - v));
    r->retry_after[end - v] = '\0';
    r->has_retry_after = 1;
    return len;
}

/*
 * CURLOPT_OPENSOCKETFUNCTION: the SSRF guard.  Called for every address
 * libcurl is about to connect to; a refused one makes libcurl try the next
 * address or fail the transfer with CURLE_COULDNT_CONNECT, which
 * httpc_classify() reports as BLOCKED because r->blocked is set.
 */
static curl_socket_t httpc_opensocket_cb(void *clientp, curlsocktype purpose,
                                         struct curl_sockaddr *address) {
    struct httpc_req *r = clientp;
    struct sockaddr_storage ss;
    curl_socket_t fd;

    (void)purpose; /* every purpose is checked: a socket is a socket */
    if (!r->c->allow_private) {
        /* hub_netguard_blocked reads a whole sockaddr_in6 for AF_INET6:
         * hand it a buffer that is surely that large */
        memset(&ss, 0, sizeof(ss));
        if (address->addrlen <= sizeof(ss)) {
            memcpy(&ss, &address->addr, address->addrlen);
        } else {
            ss.ss_family = AF_UNSPEC; /* fails closed */
        }
        if (hub_netguard_blocked((const struct sockaddr *)&ss)) {
            const void *ip = NULL;
            r->blocked = 1;
            if (ss.ss_family == AF_INET) {
                ip = &((const struct sockaddr_in *)&ss)->sin_addr;
            } else if (ss.ss_family == AF_INET6) {
                ip = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
            }
            if (ip == NULL ||
                inet_ntop(ss.ss_family, ip, r->blocked_addr, sizeof(r->blocked_addr)) == NULL) {
                snprintf(r->blocked_addr, sizeof(r->blocked_addr), "(family %d)",
                         (int)ss.ss_family);
            }
            return CURL_SOCKET_BAD;
        }
    }
    fd = socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
    if (fd < 0) {
        return CURL_SOCKET_BAD;
    }
    {
        /* a poll left on this descriptor number belongs to a socket that was
         * closed without httpc_closesocket_cb: it must not watch this one */
        struct httpc_sock *stale = httpc_sock_find(r->c, fd);
        if (stale != NULL) {
            httpc_sock_close(r->c, stale);
        }
    }
    /* out of memory it is not marked: its poll is then closed at each
     * REMOVE, which costs system calls, not correctness */
    if (httpc_sock_track(r->c, fd) == 0) {
        r->c->ours[fd] = 1;
    }
    return fd;
}

/* ------------------------------------------------------------------------- */
/* Completion                                                                 */
/* ------------------------------------------------------------------------- */

/* Fills res->error and res->error_text (pointing into r) for a finished transfer. */
static void httpc_classify(struct httpc_req *r, CURLcode rc, struct hub_httpc_response *res) {
    const char *detail = r->errbuf[0] != '\0' ? r->errbuf : curl_easy_strerror(rc);

    res->error_text = r->error_text;
    if (rc == CURLE_OK) {
        res->error = HUB_HTTPC_OK;
        res->error_text = hub_httpc_error_str(HUB_HTTPC_OK);
        return;
    }
    if (r->too_big || rc == CURLE_FILESIZE_EXCEEDED) {
        /* FILESIZE_EXCEEDED: a Content-Length over the cap, refused before
         * reading the body (CURLOPT_MAXFILESIZE_LARGE) */
        res->error = HUB_HTTPC_PROTOCOL;
        snprintf(r->error_text, sizeof(r->error_text), "body too large");
        return;
    }
    if (r->blocked && rc == CURLE_COULDNT_CONNECT) {
        /* the address goes to the operator's log only: the text reaches the
         * tenant (attempts, /verify), and a name that resolves to an
         * internal address (rebinding, a CNAME) would tell it that address */
        res->error = HUB_HTTPC_BLOCKED;
        snprintf(r->error_text, sizeof(r->error_text),
                 "blocked: the destination resolved to a non-public address "
                 "(private sinks not allowed)");
        hub_log(HUB_WARN, "a destination resolved to a non-public address: not connected",
                HUB_LS("address", r->blocked_addr));
        return;
    }
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        res->error = HUB_HTTPC_TIMEOUT;
        break;
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    /* The peer accepted and closed without a byte of response (a reused
     * connection that died is retried by libcurl on a fresh one before we
     * see this).  Nothing was malformed: it is a dropped connection, the
     * same class as a reset. */
    case CURLE_GOT_NOTHING:
        res->error = HUB_HTTPC_CONNECT;
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        res->error = HUB_HTTPC_DNS;
        break;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_USE_SSL_FAILED:
        res->error = HUB_HTTPC_TLS;
        break;
    case CURLE_OUT_OF_MEMORY:
        res->error = HUB_HTTPC_INTERNAL;
        break;
    default:
        /* WEIRD_SERVER_REPLY, UNSUPPORTED_PROTOCOL (a bad status line),
         * HTTP2, HTTP2_STREAM, PARTIAL_FILE and whatever else: the server
         * said something we cannot take as a response */
        res->error = HUB_HTTPC_PROTOCOL;
        break;
    }
    snprintf(r->error_text, sizeof(r->error_text), "%s", detail);
}

/*
 * Completes a request that was just detached from the multi handle and
 * unlinked from c->active: builds the response, calls the callback, then
 * recycles the request.  rc is the transfer's result.
 */
static void httpc_complete(struct hub_httpc *c, struct httpc_req *r, CURLcode rc) {
    struct hub_httpc_response res;
    curl_off_t total_us = 0;
    long status = 0;

    memset(&res, 0, sizeof(res));
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(r->easy, CURLINFO_TOTAL_TIME_T, &total_us);
    httpc_classify(r, rc, &res);
    /* the status line may have arrived before the transfer failed (a body
     * over the cap): reported as received, res.error says what went wrong */
    res.status = status;
    res.excerpt = r->excerpt;
    res.excerpt_len = r->excerpt_len;
    res.body_len = r->body_len;
    res.retry_after = r->has_retry_after ? r->retry_after : NULL;
    res.duration_ms = total_us > 0 ? (int64_t)(total_us / 1000)
                                   : (int64_t)((hub_now_ns() - r->started_ns) / 1000000u);
    r->cb(r->arg, &res);
    httpc_req_release(c, r);
}

/* Ends request r in flight without its answer: detached from the multi
 * handle (libcurl closes its connection) and from c->active, its callback
 * called with error and text, and whatever had arrived (for the logs).
 * The caller then releases or destroys r. */
static void httpc_end_unanswered(struct hub_httpc *c, struct httpc_req *r,
                                 enum hub_httpc_error error, const char *text) {
    struct hub_httpc_response res;

    curl_multi_remove_handle(c->multi, r->easy);
    httpc_active_unlink(c, r);
    memset(&res, 0, sizeof(res));
    res.error = error;
    res.error_text = text;
    res.excerpt = r->excerpt;
    res.excerpt_len = r->excerpt_len;
    res.body_len = r->body_len;
    res.duration_ms = (int64_t)((hub_now_ns() - r->started_ns) / 1000000u);
    r->cb(r->arg, &res);
}

void hub_httpc_abort(struct hub_httpc *c) {
    if (c == NULL || c->closing) {
        return;
    }
    while (c->active != NULL) {
        struct httpc_req *r = c->active;
        httpc_end_unanswered(c, r, HUB_HTTPC_ABORTED, hub_httpc_error_str(HUB_HTTPC_ABORTED));
        httpc_req_release(c, r);
    }
}

/*
 * Hands every finished transfer to its callback.  Stops when a callback
 * closed the client: the multi handle is gone then, and hub_httpc_close()
 * has already completed what was left.
 */
static void httpc_drain(struct hub_httpc *c) {
    CURLMsg *msg;
    int left;

    while (!c->closing && (msg = curl_multi_info_read(c->multi, &left)) != NULL) {
        struct httpc_req *r;
        char *priv = NULL;
        CURL *easy = msg->easy_handle;
        CURLcode rc = msg->data.result;

        if (msg->msg != CURLMSG_DONE) {
            continue;
        }
        /* msg is invalid once the handle is removed: read it first */
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
        curl_multi_remove_handle(c->multi, easy);
        r = (struct httpc_req *)priv;
        if (r == NULL) {
            continue; /* not ours: cannot happen, every handle has its request */
        }
        httpc_active_unlink(c, r);
        httpc_complete(c, r, rc);
    }
}

/* ------------------------------------------------------------------------- */
/* libuv <-> libcurl                                                          */
/* ------------------------------------------------------------------------- */

/* One uv handle of c is closed; the client goes with the last one after a close. */
static void httpc_handle_gone(struct hub_httpc *c) {
    if (--c->handles == 0 && c->closing) {
        free(c->by_fd);
        free(c->ours);
        free(c->user_agent);
        free(c->ca_file);
        free(c);
        /* last: a callback that closed the client had its own easy handle
         * cleaned up after hub_httpc_close returned */
        curl_global_cleanup();
    }
}

/* Close callback of a poll: frees it. */
static void httpc_sock_closed(uv_handle_t *h) {
    struct httpc_sock *s = h->data;
    struct hub_httpc *c = s->c;

    free(s);
    httpc_handle_gone(c);
}

/* The open poll of socket fd, or NULL. */
static struct httpc_sock *httpc_sock_find(const struct hub_httpc *c, curl_socket_t fd) {
    return fd >= 0 && (size_t)fd < c->n_by_fd ? c->by_fd[fd] : NULL;
}

/* Stops watching s and closes its poll; the memory goes in httpc_sock_closed. */
static void httpc_sock_close(struct hub_httpc *c, struct httpc_sock *s) {
    if (httpc_sock_find(c, s->fd) == s) {
        c->by_fd[s->fd] = NULL;
    }
    if (s->prev != NULL) {
        s->prev->next = s->next;
    } else {
        c->socks = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    }
    s->prev = s->next = NULL;
    /* uv_close stops the poll and drops the fd from epoll now, while the
     * socket is still open (libcurl closes it after this callback) */
    uv_close((uv_handle_t *)&s->poll, httpc_sock_closed);
}

static void httpc_poll_cb(uv_poll_t *h, int status, int events) {
    struct httpc_sock *s = h->data;
    struct hub_httpc *c = s->c;
    int flags = 0;
    int running;

    if (s->want == 0) {
        /* libcurl is not watching (an idle keep-alive connection the peer
         * wrote to or closed): stop until it asks again; it finds out
         * itself whether the connection is still good */
        uv_poll_stop(&s->poll);
        s->watching = 0;
        return;
    }
    if (status < 0) {
        flags |= CURL_CSELECT_ERR;
    }
    if (events & UV_READABLE) {
        flags |= CURL_CSELECT_IN;
    }
    if (events & UV_WRITABLE) {
        flags |= CURL_CSELECT_OUT;
    }
    /* may close s (CURL_POLL_REMOVE): do not touch it afterwards */
    curl_multi_socket_action(c->multi, s->fd, flags, &running);
    httpc_drain(c);
}

/* Makes room for descriptor fd in c->by_fd.  Returns 0, or -1 when out of memory. */
static int httpc_sock_track(struct hub_httpc *c, curl_socket_t fd) {
    size_t n = c->n_by_fd;
    struct httpc_sock **grown;
    unsigned char *ours;

    if ((size_t)fd < n) {
        return 0;
    }
    while (n <= (size_t)fd) {
        n = n == 0 ? 64 : 2 * n;
    }
    grown = realloc(c->by_fd, n * sizeof(*grown));
    if (grown == NULL) {
        return -1;
    }
    memset(grown + c->n_by_fd, 0, (n - c->n_by_fd) * sizeof(*grown));
    c->by_fd = grown;
    ours = realloc(c->ours, n);
    if (ours == NULL) {
        return -1; /* by_fd is larger than n_by_fd says: harmless */
    }
    memset(ours + c->n_by_fd, 0, n - c->n_by_fd);
    c->ours = ours;
    c->n_by_fd = n;
    return 0;
}

/*
 * CURLMOPT_SOCKETFUNCTION: start, change or stop watching socket fd.
 * socketp is our struct httpc_sock once curl_multi_assign() gave it one;
 * libcurl forgets it on CURL_POLL_REMOVE, c->by_fd does not.
 * Returns 0, or -1 (libcurl then fails the transfer) when out of resources.
 * Ignored while closing: every poll was closed already.
 */
static int httpc_socket_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp) {
    struct hub_httpc *c = userp;
    struct httpc_sock *s = socketp;
    int events = 0;

    (void)easy;
    if (c->closing) {
        return 0;
    }
    if (s == NULL) {
        s = httpc_sock_find(c, fd); /* libcurl forgets a socket on REMOVE */
    }
    if (what == CURL_POLL_REMOVE) {
        if (s != NULL) {
            curl_multi_assign(c->multi, fd, NULL);
            s->want = 0; /* the poll stays as it is: see httpc_poll_cb */
            if (!s->ours) {
                httpc_sock_close(c, s); /* libcurl closes it without us */
            }
        }
        return 0;
    }
    if (s == NULL) {
        if (fd < 0 || httpc_sock_track(c, fd) != 0) {
            return -1;
        }
        s = calloc(1, sizeof(*s));
        if (s == NULL) {
            return -1;
        }
        if (uv_poll_init_socket(c->loop, &s->poll, fd) != 0) {
            free(s);
            return -1;
        }
        s->poll.data = s;
        s->c = c;
        s->fd = fd;
        s->ours = c->ours[fd];
        s->next = c->socks;
        if (c->socks != NULL) {
            c->socks->prev = s;
        }
        c->socks = s;
        c->by_fd[fd] = s;
        c->handles++;
    }
    if (socketp == NULL) {
        curl_multi_assign(c->multi, fd, s);
    }
    if (what & CURL_POLL_IN) {
        events |= UV_READABLE;
    }
    if (what & CURL_POLL_OUT) {
        events |= UV_WRITABLE;
    }
    s->want = events;
    if (events == s->watching) {
        return 0; /* the usual case: a keep-alive connection's next request */
    }
    s->watching = 0;
    if (events == 0) {
        uv_poll_stop(&s->poll);
        return 0;
    }
    if (uv_poll_start(&s->poll, events, httpc_poll_cb) != 0) {
        return -1;
    }
    s->watching = events;
    return 0;
}

/*
 * CURLOPT_CLOSESOCKETFUNCTION (clientp is the client): closes the socket's
 * poll first, which takes it out of epoll while it is still open, then the
 * socket.  Also called by curl_multi_cleanup() while the client closes.
 */
static int httpc_closesocket_cb(void *clientp, curl_socket_t fd) {
    struct hub_httpc *c = clientp;
    struct httpc_sock *s = httpc_sock_find(c, fd);

    if (s != NULL) {
        httpc_sock_close(c, s);
    }
    if (fd >= 0 && (size_t)fd < c->n_by_fd) {
        c->ours[fd] = 0;
    }
    return close(fd);
}

static void httpc_timer_cb(uv_timer_t *t) {
    struct hub_httpc *c = t->data;
    int running;

    curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    httpc_drain(c);
}

/*
 * CURLMOPT_TIMERFUNCTION: -1 stops the timer, anything else (re)arms it.
 * 0 means "as soon as possible": the timer fires on the next loop turn —
 * calling curl_multi_socket_action() from here would re-enter libcurl.
 */
static int httpc_timer_fn(CURLM *multi, long timeout_ms, void *userp) {
    struct hub_httpc *c = userp;

    (void)multi;
    if (c->closing) {
        return 0;
    }
    if (timeout_ms < 0) {
        uv_timer_stop(&c->timer);
        return 0;
    }
    return uv_timer_start(&c->timer, httpc_timer_cb, (uint64_t)timeout_ms, 0) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------- */
/* Public API                                                                 */
/* ------------------------------------------------------------------------- */

const char *hub_httpc_error_str(enum hub_httpc_error e) {
    switch (e) {
    case HUB_HTTPC_OK:
        return "ok";
    case HUB_HTTPC_TIMEOUT:
        return "timeout";
    case HUB_HTTPC_CONNECT:
        return "connect";
    case HUB_HTTPC_DNS:
        return "dns";
    case HUB_HTTPC_TLS:
        return "tls";
    case HUB_HTTPC_BLOCKED:
        return "blocked";
    case HUB_HTTPC_PROTOCOL:
        return "protocol";
    case HUB_HTTPC_INTERNAL:
        return "internal";
    case HUB_HTTPC_ABORTED:
        return "aborted";
    }
    return "unknown";
}

/*
 * Options left at zero get defaults: excerpt 1024 bytes, body cap 1 MiB,
 * user agent "streaming-hub/<version>".  Takes nothing from opt (copied).
 */
struct hub_httpc *hub_httpc_new(uv_loop_t *loop, const struct hub_httpc_options *opt) {
    struct hub_httpc *c;
    const char *ua;

    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        goto fail_alloc;
    }
    c->loop = loop;
    c->allow_private = opt != NULL && opt->allow_private;
    c->max_connections = opt != NULL ? opt->max_connections : 0;
    c->excerpt_bytes =
        opt != NULL && opt->excerpt_bytes > 0 ? opt->excerpt_bytes : HTTPC_EXCERPT_DEFAULT;
    c->max_body_bytes =
        opt != NULL && opt->max_body_bytes > 0 ? opt->max_body_bytes : HTTPC_MAX_BODY_DEFAULT;
    ua = opt != NULL && opt->user_agent != NULL ? opt->user_agent : "streaming-hub/" HUB_VERSION;
    c->user_agent = strdup(ua);
    if (c->user_agent == NULL) {
        goto fail_ua;
    }
    if (opt != NULL && opt->ca_file != NULL && (c->ca_file = strdup(opt->ca_file)) == NULL) {
        goto fail_global;
    }
    /* reference-counted, and thread-safe in this libcurl (>= 7.84) */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        goto fail_global;
    }
    c->multi = curl_multi_init();
    if (c->multi == NULL) {
        goto fail_multi;
    }
    if (curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, httpc_socket_cb) != CURLM_OK ||
        curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c) != CURLM_OK ||
        curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, httpc_timer_fn) != CURLM_OK ||
        curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c) != CURLM_OK ||
        curl_multi_setopt(c->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX) != CURLM_OK) {
        goto fail_multi_opts;
    }
    if (c->max_connections > 0 && curl_multi_setopt(c->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS,
                                                    c->max_connections) != CURLM_OK) {
        goto fail_multi_opts;
    }
    if (opt != NULL && opt->cached_connections > 0 &&
        curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, opt->cached_connections) != CURLM_OK) {
        goto fail_multi_opts;
    }
    /* last: from here on the client is freed only through close callbacks */
    if (uv_timer_init(loop, &c->timer) != 0) {
        goto fail_multi_opts;
    }
    c->timer.data = c;
    c->handles = 1;
    return c;

fail_multi_opts:
    curl_multi_cleanup(c->multi);
fail_multi:
    curl_global_cleanup();
fail_global:
    free(c->ca_file);
    free(c->user_agent);
fail_ua:
    free(c);
fail_alloc:
    hub_log(HUB_ERROR, "httpc: cannot create the HTTP client");
    return NULL;
}

/* Sets one easy option; a failure (out of memory, bad value) fails the setup. */
#define HTTPC_SETOPT(easy, opt, val)                                                               \
    do {                                                                                           \
        if (curl_easy_setopt((easy), opt, (val)) != CURLE_OK) {                                    \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/*
 * r->headers: the lines (NULL-terminated, may be NULL) and an empty
 * "Expect:", which stops libcurl from waiting for 100-continue.  The nodes
 * and the copied lines share r->hdr_mem, kept from request to request:
 * curl_slist_append cost two allocations per line, 20 lines per delivery.
 * libcurl only reads the list.  Returns 0, or -1 for a line holding CR or
 * LF, or when out of memory.
 */
static int httpc_header_list(struct httpc_req *r, const char *const *lines) {
    static const char expect[] = "Expect:";
    size_t n = 1, bytes = sizeof(expect);
    struct curl_slist *node;
    char *text;

    for (const char *const *h = lines; h != NULL && *h != NULL; h++) {
        /* libcurl sends a header line verbatim: a CR or LF in it would
         * smuggle headers (or a second request) into the stream */
        if (strpbrk(*h, "\r\n") != NULL) {
            return -1;
        }
        n++;
        bytes += strlen(*h) + 1;
    }
    bytes += n * sizeof(*node);
    if (bytes > r->hdr_cap) {
        /* not realloc: it would free the old lines unwiped (they were
         * wiped at the last release, but a failed setup may not release) */
        void *grown = malloc(bytes);
        if (grown == NULL) {
            return -1;
        }
        if (r->hdr_mem != NULL) {
            OPENSSL_cleanse(r->hdr_mem, r->hdr_used);
        }
        free(r->hdr_mem);
        r->hdr_mem = grown;
        r->hdr_cap = bytes;
        r->hdr_used = 0;
    }
    node = r->hdr_mem;
    text = (char *)(node + n);
    for (size_t i = 0; i < n; i++) {
        const char *line = i + 1 < n ? lines[i] : expect;
        size_t len = strlen(line) + 1;
        memcpy(text, line, len);
        node[i].data = text;
        node[i].next = i + 1 < n ? &node[i + 1] : NULL;
        text += len;
    }
    r->headers = node;
    r->hdr_used = bytes > r->hdr_used ? bytes : r->hdr_used;
    return 0;
}

/*
 * Configures r's easy handle for req: what changes from request to
 * request, and once per easy handle what does not.  Copies everything it
 * keeps (libcurl copies strings; the body goes through
 * CURLOPT_COPYPOSTFIELDS; header lines into r->headers).  Returns 0, or -1
 * (the caller releases r, which starts from nothing again when the shared
 * options were left half set).
 */
static int httpc_setup(struct hub_httpc *c, struct httpc_req *r,
                       const struct hub_httpc_request *req, int https) {
    CURL *e = r->easy;
    int64_t timeout = req->timeout_ms > 0 ? req->timeout_ms : HTTPC_TIMEOUT_DEFAULT_MS;
    int64_t connect =
        req->connect_timeout_ms > 0 ? req->connect_timeout_ms : HTTPC_CONNECT_DEFAULT_MS;

    if (httpc_header_list(r, req->headers) != 0) {
        return -1;
    }
    HTTPC_SETOPT(e, CURLOPT_URL, req->url);
    HTTPC_SETOPT(e, CURLOPT_HTTPHEADER, r->headers);
    /* wait for a connection being set up to the same origin rather than
     * opening another, so h2 requests share it.  Not for http://: there
     * libcurl only learns the connection cannot multiplex from the first
     * response, so a hanging request would hold every other one back. */
    HTTPC_SETOPT(e, CURLOPT_PIPEWAIT, https ? 1L : 0L);
    HTTPC_SETOPT(e, CURLOPT_TIMEOUT_MS, (long)timeout);
    HTTPC_SETOPT(e, CURLOPT_CONNECTTIMEOUT_MS, (long)connect);
    /* a transfer removed while its name is still being looked up (timed
     * out, aborted) leaves the lookup thread to end alone: by default
     * libcurl's cleanup joins it, on the loop, for as long as a resolver
     * whose servers never answer takes (a destination's name can hold the
     * whole hub for seconds per attempt) */
    HTTPC_SETOPT(e, CURLOPT_QUICK_EXIT, 1L);
    /* the size first: COPYPOSTFIELDS copies that many bytes (binary safe) */
    HTTPC_SETOPT(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    if (req->body_len > 0) {
        HTTPC_SETOPT(e, CURLOPT_COPYPOSTFIELDS, (const char *)req->body);
    } else {
        HTTPC_SETOPT(e, CURLOPT_POSTFIELDS, "");
    }
    if (r->configured) {
        return 0;
    }
    /* the rest is the same for every request of this client */
    HTTPC_SETOPT(e, CURLOPT_PRIVATE, (void *)r);
    HTTPC_SETOPT(e, CURLOPT_NOSIGNAL, 1L);
    HTTPC_SETOPT(e, CURLOPT_ERRORBUFFER, r->errbuf);
    HTTPC_SETOPT(e, CURLOPT_PROTOCOLS_STR, "http,https");
    /* redirects are never followed: a 3xx is a response like any other.
     * MAXREDIRS 0 and an https-only redirect list (libcurl refuses an empty
     * one) are locks in case FOLLOWLOCATION is ever turned on. */
    HTTPC_SETOPT(e, CURLOPT_FOLLOWLOCATION, 0L);
    HTTPC_SETOPT(e, CURLOPT_MAXREDIRS, 0L);
    HTTPC_SETOPT(e, CURLOPT_REDIR_PROTOCOLS_STR, "https");
    /* no proxy, not even from the environment: the guard must see the
     * destination's own address */
    HTTPC_SETOPT(e, CURLOPT_PROXY, "");
    HTTPC_SETOPT(e, CURLOPT_SSL_VERIFYPEER, 1L);
    HTTPC_SETOPT(e, CURLOPT_SSL_VERIFYHOST, 2L);
    /* TLS 1.2 and up, ECDHE key exchange over EC groups only.  With
     * finite-field DHE the server picks the modulus, up to 10,000 bits,
     * and the handshake's two exponentiations run on the loop: a tenant's
     * server could take half a second of it per attempt. */
    HTTPC_SETOPT(e, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
    HTTPC_SETOPT(e, CURLOPT_SSL_CIPHER_LIST, "ECDHE+AESGCM:ECDHE+CHACHA20:ECDHE+AES");
    HTTPC_SETOPT(e, CURLOPT_SSL_EC_CURVES, "X25519:P-256:P-384:P-521");
    if (c->ca_file != NULL) {
        HTTPC_SETOPT(e, CURLOPT_CAINFO, c->ca_file);
    }
    /* h2 over TLS when ALPN agrees, HTTP/1.1 otherwise and for http:// */
    HTTPC_SETOPT(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    HTTPC_SETOPT(e, CURLOPT_TCP_KEEPALIVE, 1L);
    HTTPC_SETOPT(e, CURLOPT_USERAGENT, c->user_agent);
    HTTPC_SETOPT(e, CURLOPT_POST, 1L);
    /* a Content-Length over the cap fails before any body is read; the
     * write callback counts what comes without one */
    HTTPC_SETOPT(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)c->max_body_bytes);
    HTTPC_SETOPT(e, CURLOPT_WRITEFUNCTION, httpc_write_cb);
    HTTPC_SETOPT(e, CURLOPT_WRITEDATA, (void *)r);
    HTTPC_SETOPT(e, CURLOPT_HEADERFUNCTION, httpc_header_cb);
    HTTPC_SETOPT(e, CURLOPT_HEADERDATA, (void *)r);
    HTTPC_SETOPT(e, CURLOPT_OPENSOCKETFUNCTION, httpc_opensocket_cb);
    HTTPC_SETOPT(e, CURLOPT_OPENSOCKETDATA, (void *)r);
    HTTPC_SETOPT(e, CURLOPT_CLOSESOCKETFUNCTION, httpc_closesocket_cb);
    HTTPC_SETOPT(e, CURLOPT_CLOSESOCKETDATA, (void *)c);
    r->configured = 1;
    return 0;
}

/*
 * Starts a POST (see httpc.h).  Besides a URL that hub_url_parse() refuses,
 * a header line holding CR or LF is bad input (-1).  Never calls cb before
 * returning; later calls it exactly once, from the loop.
 */
int hub_httpc_post(struct hub_httpc *c, const struct hub_httpc_request *req, hub_httpc_cb cb,
                   void *arg) {
    struct hub_url parsed;
    const struct hub_url *url = req != NULL ? req->parsed : NULL;
    struct httpc_req *r;

    if (c == NULL || c->closing || req == NULL || req->url == NULL || cb == NULL ||
        (req->body == NULL && req->body_len > 0)) {
        return -1;
    }
    if (url == NULL) {
        if (hub_url_parse(req->url, &parsed) != 0) {
            return -1;
        }
        url = &parsed;
    }
    r = httpc_req_get(c, req->excerpt_bytes);
    if (r == NULL) {
        hub_log(HUB_ERROR, "httpc: out of memory");
        return -1;
    }
    r->cb = cb;
    r->arg = arg;
    r->started_ns = hub_now_ns();
    r->body_len = 0;
    r->excerpt_len = 0;
    r->excerpt_max = req->excerpt_bytes > 0 ? req->excerpt_bytes : c->excerpt_bytes;
    r->excerpt[0] = '\0';
    r->too_big = 0;
    r->blocked = 0;
    r->has_retry_after = 0;
    r->blocked_addr[0] = '\0';
    r->errbuf[0] = '\0';
    r->error_text[0] = '\0';
    if (httpc_setup(c, r, req, strcmp(url->scheme, "https") == 0) != 0) {
        goto fail_req;
    }
    /* arms the timer for "now"; the transfer starts on the next loop turn */
    if (curl_multi_add_handle(c->multi, r->easy) != CURLM_OK) {
        goto fail_req;
    }
    httpc_active_link(c, r);
    return 0;

fail_req:
    httpc_req_release(c, r);
    return -1;
}

size_t hub_httpc_inflight(const struct hub_httpc *c) {
    return c != NULL ? c->inflight : 0;
}

/* Close callback of the timer. */
static void httpc_timer_closed(uv_handle_t *h) {
    httpc_handle_gone(h->data);
}

/*
 * Aborts what is in flight (callbacks with INTERNAL "closing"; they may call
 * hub_httpc_post, which then fails, or hub_httpc_close, which does nothing),
 * then frees every libcurl handle and closes the uv handles.  The client's
 * memory goes in the last close callback.  Idempotent.
 */
void hub_httpc_close(struct hub_httpc *c) {
    if (c == NULL || c->closing) {
        return;
    }
    c->closing = 1;
    uv_timer_stop(&c->timer);
    /* polls first, while libcurl still holds their sockets open; from now
     * on the socket and timer functions ignore libcurl */
    while (c->socks != NULL) {
        httpc_sock_close(c, c->socks);
    }
    while (c->active != NULL) {
        struct httpc_req *r = c->active;
        httpc_end_unanswered(c, r, HUB_HTTPC_INTERNAL, "closing");
        httpc_req_destroy(r);
    }
    while (c->idle != NULL) {
        struct httpc_req *r = c->idle;
        c->idle = r->next;
        httpc_req_destroy(r);
    }
    c->n_idle = 0;
    /* closes the cached connections (and their sockets) */
    curl_multi_cleanup(c->multi);
    c->multi = NULL;
    uv_close((uv_handle_t *)&c->timer, httpc_timer_closed);
}
