/*
 * api_util — shared request/response helpers of the JSON API (see api_util.h).
 *
 * Three parts, in this order: answering (JSON bodies, problem details,
 * database errors), reading a request (paths, query strings, bodies,
 * cursors, bearer tokens), and the call machinery that keeps a request's
 * state alive across database round trips (struct hub_api_call), with the
 * tenant key authentication built on it.
 *
 * Answers are always complete documents sent with h2o_send_inline (h2o
 * copies the bytes), so no buffer of this module has to outlive a call.
 */
#include "api_util.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth_cache.h"
#include "hub.h"
#include "log.h"
#include "store_admin.h"
#include "util.h"
#include "uuid.h"

/* RFC 9457 "type" URIs: a URN, so that no client tries to fetch it. */
#define PROBLEM_TYPE_PREFIX "urn:streaming-hub:problem:"
#define API_KEY_PREFIX "shk_"
#define API_KEY_LEN 47 /* "shk_" + base64url(32 bytes) = 4 + 43 */
/* A decoded cursor is "<kind>:<value>": kinds are short words and values
 * uuids or bigints, so anything longer is not one of ours. */
#define CURSOR_MAX 1024
/* Query parameter names we look for are short; longer ones are skipped
 * without decoding. */
#define QUERY_NAME_MAX 64

/* What the API says about a status it sends. */
struct status_info {
    int status;
    const char *reason;
    const char *slug;
};

/* Reason phrases (RFC 9110) and problem slugs of the statuses the API uses. */
static const struct status_info status_table[] = {
    {200, "OK", NULL},
    {201, "Created", NULL},
    {202, "Accepted", NULL},
    {204, "No Content", NULL},
    {207, "Multi-Status", NULL},
    {400, "Bad Request", "bad-request"},
    {401, "Unauthorized", "unauthorized"},
    {403, "Forbidden", "forbidden"},
    {404, "Not Found", "not-found"},
    {405, "Method Not Allowed", "method-not-allowed"},
    {409, "Conflict", "conflict"},
    {413, "Content Too Large", "too-large"},
    {415, "Unsupported Media Type", "unsupported-media-type"},
    {422, "Unprocessable Content", "unprocessable"},
    {429, "Too Many Requests", "too-many-requests"},
    {500, "Internal Server Error", "internal"},
    {503, "Service Unavailable", "unavailable"},
};

/* The row of status_table for status; an unknown status (a bug) still
 * gets a generic reason and slug rather than a NULL. */
static const struct status_info *status_find(int status) {
    static const struct status_info unknown = {0, "Error", "error"};
    for (size_t i = 0; i < sizeof(status_table) / sizeof(status_table[0]); i++) {
        if (status_table[i].status == status) {
            return &status_table[i];
        }
    }
    return &unknown;
}

/* Copies req->path_normalized into buf for logging (cut, never overflowed). */
static const char *req_path(const h2o_req_t *req, char *buf, size_t bufsz) {
    size_t n = req->path_normalized.len < bufsz - 1 ? req->path_normalized.len : bufsz - 1;
    memcpy(buf, req->path_normalized.base, n);
    buf[n] = '\0';
    return buf;
}

/* json_string() refuses invalid UTF-8; error details may quote client bytes,
 * so those are replaced rather than losing the whole message. */
static json_t *json_text(const char *s) {
    json_t *v;
    char *copy;

    if (hub_utf8_valid(s, strlen(s))) {
        return json_string(s);
    }
    copy = strdup(s);
    if (copy == NULL) {
        return NULL;
    }
    for (char *p = copy; *p != '\0'; p++) {
        if ((unsigned char)*p >= 0x80) {
            *p = '?';
        }
    }
    v = json_string(copy);
    free(copy);
    return v;
}

/* ------------------------------------------------------------ responses -- */

/*
 * Every answer goes out through send_body: one Content-Type, "Cache-Control:
 * no-store", an exact Content-Length.  Errors are problem details (RFC 9457):
 * "type" is a URN naming the status's slug (or "validation" when a list of
 * field errors comes with it), "title" the reason phrase, "detail" a
 * sentence for a human, never a secret or a body.
 */

/* Adds a response header; both strings are copied into the request pool
 * (see the body).  Names are given in lower case, as HTTP/2 requires. */
void hub_api_add_header(h2o_req_t *req, const char *name, const char *value) {
    /* h2o keeps pointers, not copies: both strings must live as long as the request. */
    h2o_iovec_t n = h2o_strdup(&req->pool, name, SIZE_MAX);
    h2o_iovec_t v = h2o_strdup(&req->pool, value, SIZE_MAX);
    h2o_add_header_by_str(&req->pool, &req->res.headers, n.base, n.len, 1, NULL, v.base, v.len);
}

/* Sends status with body (copied by h2o_send_inline). */
static void send_body(h2o_req_t *req, int status, const char *content_type, const char *body,
                      size_t len) {
    req->res.status = status;
    req->res.reason = status_find(status)->reason;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, content_type,
                   strlen(content_type));
    /* API answers can carry secrets (new keys) and are never cacheable. */
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-store"));
    req->res.content_length = len;
    h2o_send_inline(req, body, len);
}

/* For text that is JSON already (rendered by PostgreSQL or spliced, as the
 * pull API's events): sent as is, not parsed again. */
void hub_api_send_json_text(h2o_req_t *req, int status, const char *text, size_t len) {
    send_body(req, status, "application/json", text, len);
}

/* Serialises with HUB_API_JSON_FLAGS (one byte format for every answer and
 * replay); a failure to serialise is answered as 500 instead. */
void hub_api_send_json(h2o_req_t *req, int status, const json_t *body) {
    char *text = json_dumps(body, HUB_API_JSON_FLAGS);

    if (text == NULL) {
        hub_api_send_problem(req, 500, "out of memory rendering the response", NULL);
        return;
    }
    send_body(req, status, "application/json", text, strlen(text));
    free(text);
}

/* 204 without a body or Content-Type: DELETE and revoke answers. */
void hub_api_send_no_content(h2o_req_t *req) {
    req->res.status = 204;
    req->res.reason = "No Content";
    /* SIZE_MAX: no Content-Length header, which a 204 must not carry. */
    req->res.content_length = SIZE_MAX;
    h2o_send_inline(req, "", 0);
}

/* A problem object (RFC 9457).  Members are set one by one: an allocation
 * that fails loses its member, not the answer.  Takes errors. */
json_t *hub_api_problem(int status, const char *detail, json_t *errors) {
    const struct status_info *si = status_find(status);
    const char *title = errors != NULL ? "Validation failed" : si->reason;
    char type[96];
    json_t *p = json_object();

    snprintf(type, sizeof(type), PROBLEM_TYPE_PREFIX "%s",
             errors != NULL ? "validation" : si->slug);
    json_object_set_new(p, "type", json_string(type));
    json_object_set_new(p, "title", json_string(title));
    json_object_set_new(p, "status", json_integer(status));
    json_object_set_new(p, "detail", json_text(detail != NULL ? detail : title));
    if (errors != NULL) {
        json_object_set_new(p, "errors", errors); /* takes errors, even when p is NULL */
    }
    return p;
}

/* Sends a problem; when even that cannot be rendered, a fixed 500 text
 * that needs no allocation. */
void hub_api_send_problem(h2o_req_t *req, int status, const char *detail, json_t *errors) {
    static const char fallback[] = "{\"type\":\"" PROBLEM_TYPE_PREFIX "internal\","
                                   "\"title\":\"Internal Server Error\",\"status\":500,"
                                   "\"detail\":\"out of memory\"}";
    json_t *p = hub_api_problem(status, detail, errors);
    char *text = p != NULL ? json_dumps(p, HUB_API_JSON_FLAGS) : NULL;

    json_decref(p);
    if (text == NULL) {
        send_body(req, 500, "application/problem+json", fallback, sizeof(fallback) - 1);
        return;
    }
    send_body(req, status, "application/problem+json", text, strlen(text));
    free(text);
}

/* 400 whose detail lists every {field, message}, cut at 512 bytes with
 * "..." (the errors array keeps them all).  Takes errors. */
void hub_api_send_invalid(h2o_req_t *req, json_t *errors) {
    char detail[512];
    size_t pos = 0;
    size_t n = json_array_size(errors);

    /* The detail names every offending field so a human reading one line
     * (or a log) sees all of it; errors[] is the machine-readable form.
     * snprintf returns what it would have written, so pos may pass the
     * end: the loop condition and the "..." below account for it. */
    for (size_t i = 0; i < n && pos < sizeof(detail) - 1; i++) {
        json_t *e = json_array_get(errors, i);
        const char *field = json_string_value(json_object_get(e, "field"));
        const char *message = json_string_value(json_object_get(e, "message"));
        int w = snprintf(detail + pos, sizeof(detail) - pos, "%s%s: %s", i ? "; " : "",
                         field ? field : "", message ? message : "");
        if (w < 0) {
            break;
        }
        pos += (size_t)w;
    }
    if (pos >= sizeof(detail)) {
        memcpy(detail + sizeof(detail) - 4, "...", 4);
    }
    hub_api_send_problem(req, 400, n > 0 ? detail : "invalid request", errors);
}

/* Out of memory while building an answer: the problem text itself is
 * small, and hub_api_send_problem has a static fallback if even it fails. */
void hub_api_send_oom(h2o_req_t *req) {
    hub_api_send_problem(req, 500, "out of memory", NULL);
}

/* why is for the operator (the log), detail for the client: the two differ
 * when the cause names internals (CSPRNG, KEK) the client cannot act on. */
void hub_api_send_internal(h2o_req_t *req, const char *why, const char *detail) {
    hub_log(HUB_ERROR, why);
    hub_api_send_problem(req, 500, detail, NULL);
}

/* A 401 must say how to authenticate (RFC 9110 §11.6.1): Bearer. */
void hub_api_send_unauthorized(h2o_req_t *req, const char *detail) {
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_WWW_AUTHENTICATE, NULL,
                   H2O_STRLIT("Bearer"));
    hub_api_send_problem(req, 401, detail, NULL);
}

/* A 405 must list the methods the resource has (RFC 9110 §15.5.6). */
void hub_api_send_method_not_allowed(h2o_req_t *req, const char *allow) {
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ALLOW, NULL, allow, strlen(allow));
    hub_api_send_problem(req, 405, "this method is not allowed on this resource", NULL);
}

/* Logs a failed transaction with the request path (never bodies or keys)
 * and returns the status to answer. */
static int db_error_status(const h2o_req_t *req, const struct hub_pg_outcome *out) {
    char path[256];
    int status =
        out->status == HUB_PG_ESTMT && !hub_pg_sqlstate_transient(out->sqlstate) ? 500 : 503;

    hub_log(status == 500 ? HUB_ERROR : HUB_WARN, "database request failed",
            HUB_LS("path", req_path(req, path, sizeof(path))), HUB_LS("sqlstate", out->sqlstate),
            HUB_LS("error", out->error));
    return status;
}

/* 503 with "Retry-After: 1": the condition is transient (a reconnect, a
 * restart), so clients are told to come back soon, not to give up. */
static void send_unavailable(h2o_req_t *req, const char *detail) {
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL, H2O_STRLIT("1"));
    hub_api_send_problem(req, 503, detail, NULL);
}

/* A statement that failed (SQLSTATE) is our bug or a constraint the
 * validation missed: 500.  A lost connection or a closing pool is
 * transient: 503, retry. */
void hub_api_send_db_error(h2o_req_t *req, const struct hub_pg_outcome *out) {
    if (db_error_status(req, out) == 503) {
        send_unavailable(req, "the database is unavailable; retry later");
    } else {
        hub_api_send_problem(req, 500, "the database refused the request", NULL);
    }
}

/* Both texts go through json_text: a field name may quote a client's
 * member name, which need not be valid UTF-8. */
void hub_api_errors_add(json_t **errors, const char *field, const char *message) {
    json_t *e;

    if (*errors == NULL) {
        *errors = json_array();
        if (*errors == NULL) {
            return;
        }
    }
    e = json_object();
    json_object_set_new(e, "field", json_text(field));
    json_object_set_new(e, "message", json_text(message));
    json_array_append_new(*errors, e);
}

/* The last step of validating a body: errors collected over every member,
 * and an out-of-memory flag raised by any copy on the way. */
int hub_api_input_refused(h2o_req_t *req, json_t *errors, int oom) {
    /* errors first: a client can fix them, whatever else went wrong */
    if (errors != NULL) {
        hub_api_send_invalid(req, errors);
        return 1;
    }
    if (oom) {
        hub_api_send_oom(req);
        return 1;
    }
    return 0;
}

/* Checks the transaction before the statement: a rolled-back transaction
 * has no meaningful results, whatever out->results holds. */
PGresult *hub_api_found(h2o_req_t *req, const struct hub_pg_outcome *out, int index,
                        const char *missing) {
    PGresult *r = out->results[index];

    if (out->status != HUB_PG_OK) {
        hub_api_send_db_error(req, out);
        return NULL;
    }
    if (r == NULL || PQntuples(r) == 0) {
        hub_api_send_problem(req, 404, missing, NULL);
        return NULL;
    }
    return r;
}

/* PostgreSQL renders objects with json_build_object, so a parse failure
 * means a broken statement or row: the log says so, the client gets 500. */
json_t *hub_api_pg_object(h2o_req_t *req, const char *text, size_t len) {
    json_t *obj = json_loadb(text, len, 0, NULL);

    if (obj == NULL) {
        hub_api_send_internal(req, "database returned malformed JSON",
                              "malformed object from the database");
    }
    return obj;
}

/* ------------------------------------------------------------- requests -- */

/* Methods are case-sensitive (RFC 9110 §9.1): "get" is not GET. */
int hub_api_method_is(const h2o_req_t *req, const char *method) {
    return h2o_memis(req->method.base, req->method.len, method, strlen(method));
}

/* GET routes also answer HEAD: h2o sends the GET answer's headers and
 * leaves its body out. */
int hub_api_method_get(const h2o_req_t *req) {
    return hub_api_method_is(req, "GET") || hub_api_method_is(req, "HEAD");
}

/* Callers pass path_normalized (h2o resolved "." and ".." segments), so a
 * segment is never a traversal.  Too many segments is an error, not a
 * truncated list: "/a/b/c/d/e" must not route as "/a/b/c/d". */
int hub_api_split_path(h2o_iovec_t path, size_t prefix_len, h2o_iovec_t *segs, int max) {
    size_t i = prefix_len;
    int n = 0;

    if (i < path.len && path.base[i] == '/') {
        i++;
    }
    while (i < path.len) {
        const char *start = path.base + i;
        const char *slash = memchr(start, '/', path.len - i);
        size_t len = slash != NULL ? (size_t)(slash - start) : path.len - i;
        /* "//" is refused rather than skipped: no two spellings of one path */
        if (len == 0 || n == max) {
            return HUB_EINVAL;
        }
        segs[n++] = h2o_iovec_init(start, len);
        i += len + 1;
    }
    return n;
}

/* "/v1/events" and "/v1/events/..." are under "/v1/events";
 * "/v1/eventsx" is not. */
int hub_api_path_under(h2o_iovec_t path, const char *prefix) {
    size_t plen = strlen(prefix);
    return path.len >= plen && memcmp(path.base, prefix, plen) == 0 &&
           (path.len == plen || path.base[plen] == '/');
}

/* Exact, case-sensitive: paths are (RFC 3986 §6.2.2.1). */
int hub_api_segment_is(h2o_iovec_t seg, const char *s) {
    return h2o_memis(seg.base, seg.len, s, strlen(s));
}

/* 18 digits at most: every such number fits an int64 (and a bigint), so
 * callers convert with strtoll without an overflow check. */
int hub_api_positive_id(const char *s, size_t len) {
    if (len == 0 || len > 18 || s[0] == '0') {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
    }
    return 1;
}

/* The first occurrence of the header; h2o stores names in lower case. */
int hub_api_header(const h2o_req_t *req, const char *name, h2o_iovec_t *value) {
    ssize_t i = h2o_find_header_by_str(&req->headers, name, strlen(name), -1);

    if (i < 0) {
        return 0;
    }
    *value = req->headers.entries[i].value;
    return 1;
}

/* The size check comes first: a body over the cap is refused (413)
 * without being parsed.  Duplicate members are refused: which of two
 * values counts would otherwise be the parser's choice, not the client's. */
json_t *hub_api_read_json_object(h2o_req_t *req, size_t max_bytes) {
    json_error_t err;
    json_t *v;
    char detail[256];

    if (req->entity.len > max_bytes) {
        snprintf(detail, sizeof(detail), "the request body is larger than %zu bytes", max_bytes);
        hub_api_send_problem(req, 413, detail, NULL);
        return NULL;
    }
    if (req->entity.base == NULL || req->entity.len == 0) {
        hub_api_send_problem(req, 400, "a JSON object is required as the request body", NULL);
        return NULL;
    }
    /* jansson refuses invalid UTF-8, NUL in strings and nesting past its depth limit. */
    v = json_loadb(req->entity.base, req->entity.len, JSON_REJECT_DUPLICATES, &err);
    if (v == NULL) {
        snprintf(detail, sizeof(detail), "malformed JSON at line %d, column %d: %s", err.line,
                 err.column, err.text);
        hub_api_send_problem(req, 400, detail, NULL);
        return NULL;
    }
    /* every route takes an object: arrays and scalars leave no room for the
     * members a later version may add */
    if (!json_is_object(v)) {
        json_decref(v);
        hub_api_send_problem(req, 400, "the request body must be a JSON object", NULL);
        return NULL;
    }
    return v;
}

/* Unknown members are errors rather than ignored: a misspelt optional
 * member would otherwise silently keep its default. */
int hub_api_reject_unknown_members(const json_t *obj, const char *const *allowed, json_t **errors) {
    const char *key;
    json_t *value;
    int unknown = 0;

    json_object_foreach((json_t *)obj, key, value) {
        int known = 0;
        for (const char *const *a = allowed; *a != NULL; a++) {
            if (strcmp(key, *a) == 0) {
                known = 1;
                break;
            }
        }
        if (!known) {
            hub_api_errors_add(errors, key, "unknown member");
            unknown++;
        }
    }
    return unknown;
}

/* Percent-decodes s[0..len) into out (len + 1 bytes), '+' meaning space.
 * Returns the decoded length, or -1 on a bad escape or a NUL byte. */
static long query_decode(const char *s, size_t len, char *out) {
    size_t o = 0;

    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%') {
            int hi, lo;
            if (i + 2 >= len) {
                return -1;
            }
            hi = hub_hex_value(s[i + 1]);
            lo = hub_hex_value(s[i + 2]);
            /* %00 is refused: the value is used as a C string, which a NUL would
             * silently cut short */
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                return -1;
            }
            c = (char)(hi * 16 + lo);
            i += 2;
        }
        out[o++] = c;
    }
    out[o] = '\0';
    return (long)o;
}

/* Scans the raw query string (req->path after '?'): returns 1 with the
 * decoded value in the request pool, 0 when absent or empty, -1 when the
 * value is badly percent-encoded or not UTF-8 (the database refuses such
 * text: a 500 where the client's request was at fault).  The last
 * occurrence wins. */
int hub_api_query_param(h2o_req_t *req, const char *name, const char **value) {
    const char *q, *end;
    int found = 0;

    /* query_at indexes the '?' in the raw path; SIZE_MAX when there is none */
    if (req->query_at == SIZE_MAX || req->query_at >= req->path.len) {
        return 0;
    }
    q = req->path.base + req->query_at + 1;
    end = req->path.base + req->path.len;
    while (q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *stop = amp != NULL ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(stop - q));
        const char *name_end = eq != NULL ? eq : stop;
        char decoded_name[QUERY_NAME_MAX + 1];

        /* A name longer than ours, or badly encoded, cannot be ours: skip it. */
        if ((size_t)(name_end - q) <= QUERY_NAME_MAX &&
            query_decode(q, (size_t)(name_end - q), decoded_name) >= 0 &&
            strcmp(decoded_name, name) == 0) {
            const char *v = eq != NULL ? eq + 1 : stop;
            char *out = h2o_mem_alloc_pool(&req->pool, (size_t)(stop - v) + 1);
            long n = query_decode(v, (size_t)(stop - v), out);
            if (n < 0 || !hub_utf8_valid(out, (size_t)n)) {
                return HUB_EINVAL;
            }
            /* keep going: the last occurrence wins; an empty value is no
             * value ("?tenant=&reason=": no filter, SPEC §9) */
            *value = out[0] != '\0' ? out : NULL;
            found = out[0] != '\0';
        }
        q = stop + 1;
    }
    return found;
}

/* Tenant ids (SPEC §5): [a-zA-Z0-9._-]{1,256}, safe in paths, logs and
 * the idempotency scope without escaping. */
int hub_api_tenant_id_valid(const char *s, size_t len) {
    /* "." and ".." are path segments h2o resolves: no /admin/tenants/{id}
     * request could ever reach such a tenant */
    if (len == 0 || len > HUB_API_TENANT_ID_MAX || (len <= 2 && memcmp(s, "..", len) == 0)) {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-')) {
            return 0;
        }
    }
    return 1;
}

/* A uuid in text form: ids from paths and cursors are checked here so that
 * a malformed one is 404 or 400, not a failing ::uuid cast (500). */
int hub_api_uuid_valid(const char *s, size_t len) {
    unsigned char u[HUB_UUID_BYTES];
    return hub_uuid_parse(s, len, u) == 0;
}

/* NULL in, NULL out without touching *oom: optional members copy with no
 * branch at the call site, and one *oom check covers a whole batch. */
char *hub_api_strndup(const char *s, size_t len, int *oom) {
    char *d;

    if (s == NULL) {
        return NULL;
    }
    d = strndup(s, len);
    if (d == NULL) {
        *oom = 1;
    }
    return d;
}

/* hub_api_strndup of a NUL-terminated (or NULL) string. */
char *hub_api_strdup(const char *s, int *oom) {
    return s != NULL ? hub_api_strndup(s, strlen(s), oom) : NULL;
}

/* -------------------------------------------------------------- paging -- */

/*
 * Lists are keyset-paginated: a list statement returns rows in key order
 * and is asked for limit + 1 rows; the cursor of the next page is the key of
 * the last row shown, and the statement continues after it.  No offsets, so
 * a page costs the same wherever it is and rows inserted meanwhile neither
 * repeat nor vanish.
 */

/* "1".."500", digits only: parsed by hand, as strtol would accept signs,
 * blanks and overflow. */
static int parse_limit(const char *s, int *out) {
    long v = 0;
    size_t n = strlen(s);

    if (n == 0 || n > 3) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > HUB_API_LIMIT_MAX) {
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Both parameters are checked even when the first is bad, so one 400
 * names every problem. */
int hub_api_page_parse(h2o_req_t *req, const char *kind, struct hub_api_page *page,
                       json_t **errors) {
    const char *v = NULL;
    int rc = 0;
    int r;

    page->limit = HUB_API_LIMIT_DEFAULT;
    page->after = NULL;
    r = hub_api_query_param(req, "limit", &v);
    if (r < 0 || (r == 1 && parse_limit(v, &page->limit) != 0)) {
        hub_api_errors_add(errors, "limit", "must be an integer from 1 to 500");
        rc = HUB_EINVAL;
    }
    r = hub_api_query_param(req, "cursor", &v);
    if (r < 0 || (r == 1 && (page->after = hub_api_cursor_decode(req, kind, v)) == NULL)) {
        hub_api_errors_add(errors, "cursor", "is not a cursor of this list");
        rc = HUB_EINVAL;
    }
    return rc;
}

/* A cursor is opaque to clients (SPEC §9), but not secret: the kind only
 * keeps one list's cursor out of another list. */
char *hub_api_cursor_encode(const char *kind, const char *value) {
    size_t klen = strlen(kind), vlen = strlen(value);
    size_t rawlen = klen + 1 + vlen;
    unsigned char *raw = malloc(rawlen);
    char *out = malloc(4 * ((rawlen + 2) / 3) + 1);

    if (raw == NULL || out == NULL) {
        free(raw);
        free(out);
        return NULL;
    }
    /* base64url: the cursor travels in a query string without escaping */
    memcpy(raw, kind, klen);
    raw[klen] = ':';
    memcpy(raw + klen + 1, value, vlen);
    hub_base64url(raw, rawlen, out);
    free(raw);
    return out;
}

/* Decodes into a bounded stack buffer: a cursor is client input, and
 * anything longer than CURSOR_MAX is not one we made. */
const char *hub_api_cursor_decode(h2o_req_t *req, const char *kind, const char *cursor) {
    unsigned char raw[CURSOR_MAX];
    size_t klen = strlen(kind);
    size_t n;

    if (hub_base64_decode(cursor, strlen(cursor), HUB_B64_URL, raw, sizeof(raw), &n) != 0 ||
        n <= klen || memcmp(raw, kind, klen) != 0 || raw[klen] != ':') {
        return NULL;
    }
    /* the value goes to the database as text: UTF-8 without NUL only */
    if (!hub_utf8_valid(raw + klen + 1, n - klen - 1)) {
        return NULL;
    }
    return h2o_strdup(&req->pool, (const char *)raw + klen + 1, n - klen - 1).base;
}

/*
 * One page of a list (see the section's comment).  Items are rendered one
 * by one, each from its own row, so a route decides how an object is shown
 * (the subscription API strips its internal members) without this function
 * knowing the object.  Any failure is 500: a partial page would look like
 * the end of the list.
 */
void hub_api_send_page(h2o_req_t *req, PGresult *r, int limit, const char *kind, int key_col,
                       int obj_col, hub_api_item_fn item, void *arg) {
    int n = PQntuples(r);
    int shown = n > limit ? limit : n;
    json_t *items = json_array(), *body = NULL;
    char *cursor = NULL;

    if (items == NULL) {
        goto fail;
    }
    for (int i = 0; i < shown; i++) {
        const char *text = PQgetvalue(r, i, obj_col);
        size_t len = (size_t)PQgetlength(r, i, obj_col);
        json_t *it = item != NULL ? item(arg, text, len) : json_loadb(text, len, 0, NULL);
        if (it == NULL || json_array_append_new(items, it) != 0) {
            goto fail;
        }
    }
    /* the extra row is never shown: it only says that a next page exists,
     * which then starts after the last row shown */
    if (n > limit) {
        cursor = hub_api_cursor_encode(kind, PQgetvalue(r, shown - 1, key_col));
        if (cursor == NULL) {
            goto fail;
        }
    }
    body = json_pack("{s:o, s:o}", "items", items, "next_cursor",
                     cursor != NULL ? json_string(cursor) : json_null());
    items = NULL; /* json_pack's "o" took it, also on failure */
    if (body == NULL) {
        goto fail;
    }
    hub_api_send_json(req, 200, body);
    json_decref(body);
    free(cursor);
    return;
fail:
    json_decref(items);
    free(cursor);
    hub_api_send_problem(req, 500, "out of memory rendering the list", NULL);
}

/* --------------------------------------------------------------- auth -- */

/*
 * Two kinds of bearer: the admin token (configuration, compared here in
 * constant time) and tenant API keys ("shk_" + 43 base64url characters,
 * looked up by their SHA-256 in the database, hub_api_auth_tenant below).
 */

/* RFC 6750 §2.1 "Bearer <token>", scheme case-insensitive; spaces and
 * tabs around the token are tolerated, an empty token is not. */
int hub_api_bearer_token(const h2o_req_t *req, h2o_iovec_t *token) {
    h2o_iovec_t v;
    size_t i = 0, end;

    if (!hub_api_header(req, "authorization", &v)) {
        return 0;
    }
    /* optional white space before the scheme (RFC 9110 §5.6.3) */
    while (i < v.len && (v.base[i] == ' ' || v.base[i] == '\t')) {
        i++;
    }
    if (v.len - i < 7 || strncasecmp(v.base + i, "Bearer", 6) != 0 ||
        (v.base[i + 6] != ' ' && v.base[i + 6] != '\t')) {
        return 0;
    }
    i += 7;
    while (i < v.len && (v.base[i] == ' ' || v.base[i] == '\t')) {
        i++;
    }
    /* trailing white space is the header's, not the token's */
    end = v.len;
    while (end > i && (v.base[end - 1] == ' ' || v.base[end - 1] == '\t')) {
        end--;
    }
    if (end == i) {
        return 0;
    }
    *token = h2o_iovec_init(v.base + i, end - i);
    return 1;
}

/* SHA-256 of p[0..len) into out; 0, or -1 when OpenSSL fails. */
static int sha256(const void *p, size_t len, unsigned char out[32]) {
    unsigned int n = 0;
    return EVP_Digest(p, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32 ? 0 : -1;
}

/* The admin token check.  An unset token never matches, so a missing
 * configuration cannot open the admin API to an empty bearer. */
int hub_api_token_equals(const char *expected, const char *presented, size_t presented_len) {
    unsigned char a[32], b[32];
    int eq;

    if (expected == NULL || expected[0] == '\0') {
        return 0;
    }
    /* Comparing fixed-size digests hides the secret's length as well. */
    if (sha256(expected, strlen(expected), a) != 0 || sha256(presented, presented_len, b) != 0) {
        return 0;
    }
    eq = CRYPTO_memcmp(a, b, sizeof(a)) == 0;
    OPENSSL_cleanse(a, sizeof(a));
    return eq;
}

/* ------------------------------------------------ requests on the database -- */

/*
 * A call's life: hub_api_call_new ties it to the request; a route then runs
 * transactions (or waits) on it.  Three things keep it alive: the request
 * (req != NULL until h2o disposes of it), a transaction or wait in flight,
 * and a callback running on the stack.  Whichever ends last frees it
 * (call_release_if_done), after the route's on_free.  So a client hanging up
 * mid-transaction never frees memory the completion still uses, and a
 * completion never touches a request that is gone.
 */

/* The request-pool half of a call: h2o disposes of it with the request. */
struct call_slot {
    struct hub_api_call *call;
};

/* Frees the call once nobody can reach it any more: the request is gone, no
 * transaction will call back, and no callback is running further up the
 * stack (a callback may answer, and h2o may then dispose of the request). */
static void call_release_if_done(struct hub_api_call *call) {
    if (call->req != NULL || call->in_flight || call->in_callback > 0) {
        return;
    }
    if (call->on_free != NULL) {
        call->on_free(call);
    }
    free(call);
}

/* h2o disposes of the request (answered, client gone, server stopping):
 * the call loses its request, and is freed now unless work is pending. */
static void call_slot_dispose(void *p) {
    struct call_slot *slot = p;
    slot->call->req = NULL;
    call_release_if_done(slot->call);
}

/*
 * The call is malloc'd, not pool-allocated, because it may outlive the
 * request; the request pool holds only a slot whose destructor tells the
 * call that the request is gone (call_slot_dispose).
 */
void *hub_api_call_new(struct hub *hub, h2o_req_t *req, size_t size,
                       void (*on_free)(struct hub_api_call *call)) {
    struct hub_api_call *call = calloc(1, size);
    struct call_slot *slot;

    if (call == NULL) {
        hub_api_send_oom(req);
        return NULL;
    }
    /* h2o_mem_alloc_shared aborts rather than returning NULL, like all of h2o */
    slot = h2o_mem_alloc_shared(&req->pool, sizeof(*slot), call_slot_dispose);
    slot->call = call;
    call->req = req;
    call->hub = hub;
    call->on_free = on_free;
    return call;
}

/*
 * A tenant's turns (api_util.h, HUB_API_TENANT_RUNNING): its transactions
 * running on the API pool and those waiting for one of its turns, oldest
 * first.  An entry exists while either count is above 0, in a table keyed
 * by the tenant's id.  Loop thread only, as the whole API is.
 *
 * Without it the pool ran the transactions of every tenant first come,
 * first served: a tenant whose statements waited (a lock, a long scan)
 * held every connection and all the others' requests queued behind them.
 */
struct api_turns {
    struct api_turns *next; /* in its table bucket */
    int running;
    int waiting;
    int pins; /* turns_pump runs on it, perhaps nested: not freed meanwhile */
    struct hub_api_call *head, *tail; /* waiting, each with its turn_txn */
    char tenant[];
};

#define TURNS_BUCKETS 256
static struct api_turns *turns_table[TURNS_BUCKETS];

static struct api_turns **turns_slot(const char *tenant) {
    struct api_turns **t = &turns_table[hub_fnv1a_str(tenant) % TURNS_BUCKETS];

    while (*t != NULL && strcmp((*t)->tenant, tenant) != 0) {
        t = &(*t)->next;
    }
    return t;
}

/* The call's tenant's entry, made when it has none; NULL out of memory. */
static struct api_turns *turns_get(const char *tenant) {
    struct api_turns **slot = turns_slot(tenant);
    size_t len = strlen(tenant);

    if (*slot == NULL && (*slot = calloc(1, sizeof(**slot) + len + 1)) != NULL) {
        memcpy((*slot)->tenant, tenant, len + 1);
    }
    return *slot;
}

/* Frees the entry once nothing of its tenant runs or waits. */
static void turns_drop_if_idle(struct api_turns *t) {
    struct api_turns **slot;

    if (t->running > 0 || t->waiting > 0 || t->pins > 0) {
        return;
    }
    slot = turns_slot(t->tenant);
    *slot = t->next;
    free(t);
}

/* Hands free turns to the calls waiting, oldest first.  A call whose
 * request is gone gives its transaction up unsent: it completes at once
 * (hub_pg_txn_fail), its callback sees no request and frees the call; so
 * does one while no connection is up (its client hears 503 at once, as
 * call_txn_new would have answered).  A submit may complete at once too,
 * and its completion pump this entry again: pinned meanwhile. */
static void turns_pump(struct api_turns *t) {
    t->pins++;
    while (t->running < HUB_API_TENANT_RUNNING && t->head != NULL) {
        struct hub_api_call *call = t->head;
        struct hub_pg_txn *txn = call->turn_txn;

        t->head = call->turn_next;
        if (t->head == NULL) {
            t->tail = NULL;
        }
        t->waiting--;
        call->hub->metrics.api_turns_waiting--;
        call->turn_next = NULL;
        call->turn_txn = NULL;
        if (call->req == NULL || hub_pg_connected(call->hub->pg) == 0) {
            call->turns = NULL;
            hub_pg_txn_fail(txn, call->req == NULL ? "the request is gone"
                                                   : "the database is unavailable");
        } else {
            t->running++;
        }
        hub_pg_txn_submit(txn);
    }
    t->pins--;
    turns_drop_if_idle(t);
}

/* Every transaction of a call completes here: the route's callback runs
 * only while the request exists, and in_callback keeps the call alive
 * while it does (it may start another transaction, or answer).  A call
 * keeps its tenant's turn through its callback, for the next transaction
 * it may start there; the turn is handed on after. */
static void call_pg_done(void *arg, const struct hub_pg_outcome *out) {
    struct hub_api_call *call = arg;
    struct api_turns *turns = call->turns;

    /* in_flight cleared first: the callback may start the next transaction */
    call->in_flight = 0;
    call->turn_held = turns != NULL;
    call->in_callback++;
    if (call->req != NULL) {
        call->on_result(call, out);
    }
    call->in_callback--;
    if (call->turn_held) {
        call->turn_held = 0;
        call->turns = NULL;
        turns->running--;
        turns_pump(turns);
    }
    call_release_if_done(call);
}

/* Like hub_api_call_txn but answers nothing: NULL and the status to answer
 * with (503: no usable database; 429: the tenant's queue is full). */
static struct hub_pg_txn *call_txn_new(struct hub_api_call *call, hub_api_call_cb cb, int *status) {
    struct hub *hub = call->hub;
    struct hub_pg_txn *txn;
    struct api_turns **turns;

    /* Fail fast rather than queue: pg.c holds transactions until a
     * connection comes back, and a client would just hang meanwhile. */
    *status = 503;
    if (hub->pg == NULL || hub_pg_connected(hub->pg) == 0) {
        return NULL;
    }
    if (call->tenant[0] != '\0' && !call->turn_held &&
        *(turns = turns_slot(call->tenant)) != NULL &&
        (*turns)->waiting >= HUB_API_TENANT_WAITING_MAX) {
        *status = 429;
        return NULL;
    }
    txn = hub_pg_txn_new(hub->pg, call_pg_done, call);
    if (txn != NULL) {
        call->on_result = cb;
    }
    return txn;
}

/* The route's way to start a transaction: on failure the client hears 503
 * (or 429) at once, which is all a route would do anyway. */
struct hub_pg_txn *hub_api_call_txn(struct hub_api_call *call, hub_api_call_cb cb) {
    int status;
    struct hub_pg_txn *txn = call_txn_new(call, cb, &status);

    if (txn != NULL) {
        return txn;
    }
    if (status == 429) {
        call->hub->metrics.api_turns_refused++;
        h2o_add_header(&call->req->pool, &call->req->res.headers, H2O_TOKEN_RETRY_AFTER, NULL,
                       H2O_STRLIT("1"));
        hub_api_send_problem(call->req, 429,
                             "too many of this tenant's requests are waiting for the database; "
                             "retry later",
                             NULL);
    } else {
        send_unavailable(call->req, "the database is unavailable; retry later");
    }
    return NULL;
}

/* in_flight before submit: the completion may run inside
 * hub_pg_txn_submit, and it must find the flag set to clear.  A tenant's
 * call runs in one of its tenant's turns, the one it holds from its last
 * transaction or a free one, else waits for one, and its statements run
 * at most STREAMING_HUB_API_STATEMENT_TIMEOUT each; any other call (the
 * operator's, a key's lookup) runs at once, unbounded. */
void hub_api_call_submit(struct hub_api_call *call, struct hub_pg_txn *txn) {
    struct api_turns *t;

    call->in_flight = 1;
    if (call->tenant[0] != '\0') {
        /* a tenant's statement that waits (a lock, a long scan) gives its
         * connection back in time: four of them would hold the pool */
        hub_pg_txn_timeout(txn, call->hub->cfg.api_statement_timeout_ms);
    }
    if (call->turn_held) {
        call->turn_held = 0;
    } else if (call->tenant[0] != '\0' && (t = turns_get(call->tenant)) != NULL) {
        call->turns = t;
        if (t->running >= HUB_API_TENANT_RUNNING) {
            call->turn_txn = txn;
            if (t->tail != NULL) {
                t->tail->turn_next = call;
            } else {
                t->head = call;
            }
            t->tail = call;
            t->waiting++;
            call->hub->metrics.api_turns_waiting++;
            return;
        }
        t->running++;
    }
    hub_pg_txn_submit(txn);
}

/* One statement, one transaction: most routes' whole database work.  The
 * parameters are copied by hub_pg_txn_add, so the caller's array may live
 * on its stack. */
void hub_api_call_query(struct hub_api_call *call, hub_api_call_cb cb, const struct hub_sql *sql,
                        int nparams, const char *const *values) {
    struct hub_pg_txn *txn = hub_api_call_txn(call, cb);

    if (txn == NULL) {
        return;
    }
    hub_pg_txn_add(txn, sql, nparams, values, NULL, NULL);
    hub_api_call_submit(call, txn);
}

/* A wait is accounted as a transaction in flight: the call then outlives
 * its request exactly as it does for the database. */
void hub_api_call_wait(struct hub_api_call *call) {
    call->in_flight = 1;
}

/* Mirrors call_pg_done for waits that are not transactions. */
void hub_api_call_wake(struct hub_api_call *call, void (*cb)(struct hub_api_call *call, void *arg),
                       void *arg) {
    call->in_flight = 0;
    call->in_callback++;
    if (call->req != NULL) {
        cb(call, arg);
    }
    call->in_callback--;
    call_release_if_done(call);
}

/* "shk_" + 43 base64url characters; anything else is refused without a
 * database round trip. */
static int api_key_well_formed(h2o_iovec_t key) {
    if (key.len != API_KEY_LEN || memcmp(key.base, API_KEY_PREFIX, 4) != 0) {
        return 0;
    }
    for (size_t i = 4; i < key.len; i++) {
        if (!hub_base64url_char(key.base[i])) {
            return 0;
        }
    }
    return 1;
}

/* Only the two members the hub reads are checked; the others are the
 * operator's to keep (SPEC §5). */
void hub_api_quotas_check(const json_t *quotas, json_t **errors) {
    const json_t *rate, *burst;

    if (quotas == NULL || json_is_null(quotas)) {
        return;
    }
    if (!json_is_object(quotas)) {
        hub_api_errors_add(errors, "quotas", "must be an object or null");
        return;
    }
    rate = json_object_get(quotas, "ingest_rate");
    burst = json_object_get(quotas, "ingest_burst");
    if (rate != NULL && !json_is_null(rate) &&
        (!json_is_number(rate) || !(json_number_value(rate) > 0.0) ||
         json_number_value(rate) > HUB_QUOTA_MAX)) {
        hub_api_errors_add(errors, "quotas.ingest_rate",
                           "must be events per second, a number above 0 and at most 1000000");
    }
    if (burst != NULL && !json_is_null(burst) &&
        (!json_is_integer(burst) || json_integer_value(burst) < 1 ||
         json_integer_value(burst) > HUB_QUOTA_MAX)) {
        hub_api_errors_add(errors, "quotas.ingest_burst",
                           "must be an integer from 1 to 1000000 (events)");
    }
}

/* A quota member as the auth query returns it (text or NULL): its value in
 * (0, HUB_QUOTA_MAX], or 0 for none.  What the API would refuse (a row
 * written by hand) counts as none. */
static double quota_value(PGresult *r, enum hub_auth_tenant_col col) {
    const char *s;
    char *end;
    double v;

    if (PQnfields(r) <= (int)col || PQgetisnull(r, 0, col)) {
        return 0.0;
    }
    s = PQgetvalue(r, 0, col);
    v = strtod(s, &end);
    return end != s && *end == '\0' && v > 0.0 && v <= HUB_QUOTA_MAX ? v : 0.0;
}

/* The key's row (hub_auth_tenant_col): the tenant, and its ingest quota
 * kept in the call for the ingest route.  A burst below 1 (none given)
 * defaults to the rate, at least 1: a bucket must admit one event. */
static void auth_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    PGresult *r;
    struct hub_auth_entry e;
    const char *id;

    if (out->status != HUB_PG_OK) {
        call->on_auth(call, NULL, db_error_status(call->req, out));
        return;
    }
    /* no row: unknown or revoked key, or an inactive tenant, all alike 401 */
    r = out->results[0];
    if (r != NULL && PQntuples(r) == 1 && !PQgetisnull(r, 0, HUB_AUTH_TENANT_ID)) {
        call->ingest_rate = quota_value(r, HUB_AUTH_TENANT_INGEST_RATE);
        call->ingest_burst = quota_value(r, HUB_AUTH_TENANT_INGEST_BURST);
        if (call->ingest_burst < 1.0) {
            call->ingest_burst = call->ingest_rate > 1.0 ? call->ingest_rate : 1.0;
        }
        id = PQgetvalue(r, 0, HUB_AUTH_TENANT_ID);
        if (strlen(id) < sizeof(call->tenant)) {
            strcpy(call->tenant, id);
        }
        if (strlen(id) < sizeof(e.tenant_id)) {
            strcpy(e.tenant_id, id);
            e.ingest_rate = call->ingest_rate;
            e.ingest_burst = call->ingest_burst;
            hub_auth_cache_put(call->auth_hash, call->auth_started_ns,
                               call->hub->cfg.auth_cache_ttl_ms, &e);
        }
        call->on_auth(call, id, 200);
    } else {
        call->on_auth(call, NULL, 401);
    }
}

/* Only the SHA-256 of the key is sent: keys are stored hashed (SPEC §5),
 * and the plaintext never leaves the process.  A malformed key costs no
 * round trip. */
void hub_api_auth_tenant(struct hub_api_call *call, hub_api_auth_cb cb) {
    unsigned char *hash = call->auth_hash;
    const char *values[1] = {(const char *)hash};
    const int lengths[1] = {(int)sizeof(call->auth_hash)};
    const int formats[1] = {1};
    struct hub_pg_txn *txn;
    struct hub_auth_entry e;
    h2o_iovec_t key;
    int status;

    call->on_auth = cb;
    if (!hub_api_bearer_token(call->req, &key) || !api_key_well_formed(key) ||
        sha256(key.base, key.len, hash) != 0) {
        cb(call, NULL, 401);
        return;
    }
    /* Taken before the lookup is sent: the row it reads is at least this
     * recent, which is what bounds the cache's staleness. */
    call->auth_started_ns = hub_now_ns();
    if (hub_auth_cache_get(hash, call->auth_started_ns, call->hub->cfg.auth_cache_ttl_ms, &e)) {
        call->ingest_rate = e.ingest_rate;
        call->ingest_burst = e.ingest_burst;
        strcpy(call->tenant, e.tenant_id); /* both HUB_API_TENANT_ID_MAX + 1 */
        cb(call, e.tenant_id, 200);
        return;
    }
    /* the route answers 503 through its callback: its prologue
     * (hub_api_route_answered) handles every authentication outcome */
    txn = call_txn_new(call, auth_done, &status);
    if (txn == NULL) {
        cb(call, NULL, status);
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_api_auth_tenant, 1, values, lengths, formats);
    hub_api_call_submit(call, txn);
}

void hub_api_auth_forget(void) {
    hub_auth_cache_clear();
}

/* The answer to a failed tenant authentication; 1 when it answered. */
static int auth_answered(h2o_req_t *req, int status) {
    if (status == 200) {
        return 0;
    }
    /* 401 says nothing about why (unknown, revoked, inactive tenant): a
     * caller probing keys learns no more than "not valid" */
    if (status == 401) {
        hub_api_send_unauthorized(req, "a valid tenant API key is required "
                                       "(Authorization: Bearer shk_...)");
    } else {
        hub_api_send_problem(req, status,
                             status == 503 ? "the database is unavailable; retry later"
                                           : "cannot check the API key",
                             NULL);
    }
    return 1;
}

/* Authentication is answered before routing: without a valid key, a
 * client learns nothing about which paths or methods exist. */
int hub_api_route_answered(h2o_req_t *req, int status, int route_status, const char *allow,
                           const char *missing) {
    if (auth_answered(req, status)) {
        return 1;
    }
    if (route_status == 405) {
        hub_api_send_method_not_allowed(req, allow);
        return 1;
    }
    if (route_status != 0) {
        hub_api_send_problem(req, route_status, missing, NULL);
        return 1;
    }
    return 0;
}
