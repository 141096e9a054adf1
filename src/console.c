/*
 * console — serves the embedded console files (see console.h).
 *
 * The files are few and small (tens of KiB in all), so a linear search of
 * the table and a copy into the request's pool per answer cost less than
 * any cache would; the browser revalidates each load (no-cache) so a new
 * binary never meets modules of the old one.
 */
#include "console.h"

#include <string.h>

#include "api_util.h"

#define CONSOLE_PREFIX "/console"

/*
 * The policy every console answer carries.  Scripts and styles come only
 * from the hub's own files (no inline script or style element, no eval),
 * fetches only go to the hub itself, nothing may frame the console, and
 * forms and <base> are inert.  Element styles set from script through the
 * CSSOM are not "inline" for CSP, which is how the charts size their bars.
 */
static const char csp[] = "default-src 'none'; script-src 'self'; style-src 'self'; "
                          "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                          "form-action 'none'; frame-ancestors 'none'";

/* The Content-Type of an embedded file, from its extension. */
static const char *file_type(const char *path) {
    const char *dot = strrchr(path, '.');

    if (dot == NULL) {
        return "application/octet-stream";
    }
    if (strcmp(dot, ".html") == 0) {
        return "text/html; charset=utf-8";
    }
    if (strcmp(dot, ".js") == 0) {
        return "text/javascript; charset=utf-8";
    }
    if (strcmp(dot, ".css") == 0) {
        return "text/css; charset=utf-8";
    }
    if (strcmp(dot, ".svg") == 0) {
        return "image/svg+xml";
    }
    if (strcmp(dot, ".png") == 0) {
        return "image/png";
    }
    return "application/octet-stream";
}

/* The embedded file at path[0..len) (relative to /console), or NULL. */
static const struct hub_console_file *file_find(const char *path, size_t len) {
    for (int i = 0; i < hub_console_files_count; i++) {
        const struct hub_console_file *f = &hub_console_files[i];
        if (strlen(f->path) == len && memcmp(f->path, path, len) == 0) {
            return f;
        }
    }
    return NULL;
}

/* The headers of every console answer, the 404 and 405 included (a
 * problem+json page is a document too). */
static void add_security_headers(h2o_req_t *req) {
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("content-security-policy"), 0,
                          NULL, csp, sizeof(csp) - 1);
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-frame-options"), 0, NULL,
                          H2O_STRLIT("DENY"));
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-content-type-options"), 0,
                          NULL, H2O_STRLIT("nosniff"));
    h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("referrer-policy"), 0, NULL,
                          H2O_STRLIT("no-referrer"));
}

/* The router's hook (http.c).  Tokens are not checked here: the files hold
 * no data, and every call the console makes goes through the API's own
 * authentication. */
int hub_console_handle(h2o_req_t *req) {
    h2o_iovec_t p = req->path_normalized;
    size_t plen = sizeof(CONSOLE_PREFIX) - 1;
    const struct hub_console_file *f;
    const char *type;
    ssize_t inm;

    if (p.len < plen || memcmp(p.base, CONSOLE_PREFIX, plen) != 0 ||
        (p.len > plen && p.base[plen] != '/')) {
        return 0;
    }
    add_security_headers(req);
    if (!hub_api_method_is(req, "GET") && !hub_api_method_is(req, "HEAD")) {
        hub_api_send_method_not_allowed(req, "GET, HEAD");
        return 1;
    }
    /* relative URLs of the page resolve against the directory */
    if (p.len == plen) {
        h2o_send_redirect(req, 301, "Moved Permanently", H2O_STRLIT(CONSOLE_PREFIX "/"));
        return 1;
    }
    if (p.len == plen + 1) {
        f = file_find("/index.html", sizeof("/index.html") - 1);
    } else {
        f = file_find(p.base + plen, p.len - plen);
    }
    if (f == NULL) {
        hub_api_send_problem(req, 404, "no such console file", NULL);
        return 1;
    }
    type = file_type(f->path);
    /* the files change with the binary only: each load revalidates (never
     * a stale module after an upgrade), and an unchanged file is a bodiless
     * 304, which also lets the browser reuse its compiled modules */
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-cache"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ETAG, NULL, f->etag, strlen(f->etag));
    inm = h2o_find_header(&req->headers, H2O_TOKEN_IF_NONE_MATCH, -1);
    if (inm != -1 && h2o_memis(req->headers.entries[inm].value.base,
                               req->headers.entries[inm].value.len, f->etag, strlen(f->etag))) {
        req->res.status = 304;
        req->res.reason = "Not Modified";
        h2o_send_inline(req, NULL, 0);
        return 1;
    }
    req->res.status = 200;
    req->res.reason = "OK";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, type, strlen(type));
    req->res.content_length = f->len;
    h2o_send_inline(req, (const char *)f->data, f->len); /* copies */
    return 1;
}
