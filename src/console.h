/*
 * console — the web console's static files (console/ in the source tree),
 * embedded at build time (cmake/embed_console.cmake) and served under
 * /console/ with headers that keep tenant data inert: a strict
 * Content-Security-Policy (scripts and styles only from the hub's own
 * files, no inline script, no framing, no other origin), X-Frame-Options
 * DENY, nosniff and no referrer.  The console itself is HTML, CSS and
 * JavaScript modules that call the hub's HTTP API with the token the user
 * signed in with (docs/console.md); this module serves files only.
 */
#ifndef HUB_CONSOLE_H
#define HUB_CONSOLE_H

#include <h2o.h>
#include <stddef.h>

/* One embedded file: its path under /console ("/index.html"), bytes, and
 * ETag (a quoted hash of the bytes). */
struct hub_console_file {
    const char *path;
    const unsigned char *data;
    size_t len;
    const char *etag;
};

/* The generated table (console_gen.c), sorted by path. */
extern const struct hub_console_file hub_console_files[];
extern const int hub_console_files_count;

/*
 * Answers req and returns 1 when its path is "/console" or lies under
 * "/console/": "/console" redirects to "/console/", "/console/" is
 * index.html, a known file is 200 with its type and ETag (304 when
 * If-None-Match names it), anything else 404; methods
 * other than GET and HEAD are 405.  Returns 0 without touching req for any
 * other path.  Borrows req.
 */
int hub_console_handle(h2o_req_t *req);

#endif
