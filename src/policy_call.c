/*
 * policy_call — one call of a policy's match, retry or shape on the calling
 * thread, and its results (see policy.h).
 *
 * A call takes a state of the version from its idle list, or builds one
 * when every state is busy on another thread (a version has as many states
 * as it ever had calls at once: at most one per policy thread, plus the
 * tests' own), runs the function under the state's deadline and memory
 * cap, converts what it returned, and gives the state back.  Nothing here
 * knows about threads or queues: policy_pool.c calls these on its threads.
 */
#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backoff.h"
#include "policy_int.h"
#include "util.h"

/* ---------------------------------------------------------------- names -- */

const char *hub_policy_fn_str(enum hub_policy_fn fn) {
    static const char *const s[HUB_POLICY_FN__COUNT] = {"match", "retry", "shape"};
    return fn < HUB_POLICY_FN__COUNT ? s[fn] : "?";
}

const char *hub_policy_status_str(enum hub_policy_status st) {
    static const char *const s[HUB_POLICY_STATUS__COUNT] = {
        "ok", "error", "timeout", "nomem", "bad_return", "missing", "tripped"};
    return st < HUB_POLICY_STATUS__COUNT ? s[st] : "?";
}

int hub_policy_name_valid(const char *s, size_t len) {
    if (len == 0 || len > HUB_POLICY_NAME_MAX) {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-')) {
            return 0;
        }
    }
    return 1;
}

/* --------------------------------------------------------------- states -- */

/* 1 when two states' top levels returned the same functions and retry
 * table (compared field by field: the struct has padding). */
static int defs_equal(const struct policy_defs *a, const struct policy_defs *b) {
    if (a->n_schedule != b->n_schedule) {
        return 0;
    }
    for (int i = 0; i < HUB_POLICY_FN__COUNT; i++) {
        if (a->has_fn[i] != b->has_fn[i]) {
            return 0;
        }
    }
    for (size_t i = 0; i < a->n_schedule; i++) {
        if (a->schedule[i] != b->schedule[i]) {
            return 0;
        }
    }
    return 1;
}

/*
 * A state of p for one call: an idle one, or a new one built from the
 * source.  A new state's top level must return what the first one's did
 * (a file whose table depends on the time or on chance cannot give one
 * state a shape and another none).  Returns NULL with the reason in err,
 * prefixed.
 */
static struct policy_state *state_take(struct hub_policy *p, const char *prefix, char *err,
                                       size_t errlen) {
    struct policy_state *s;
    struct policy_defs defs;
    char why[400];

    uv_mutex_lock(&p->mu);
    s = p->idle;
    if (s != NULL) {
        p->idle = s->next;
        s->next = NULL;
    }
    uv_mutex_unlock(&p->mu);
    if (s != NULL) {
        return s;
    }
    s = policy_state_new(p, &defs, why, sizeof(why));
    if (s == NULL) {
        snprintf(err, errlen, "%s%s.lua: cannot build a state for this call: %s", prefix, p->name,
                 why);
        return NULL;
    }
    if (!defs_equal(&defs, &p->defs)) {
        policy_state_free(s);
        snprintf(err, errlen,
                 "%s%s.lua: the file's top level returned a different table than when it "
                 "was loaded",
                 prefix, p->name);
        return NULL;
    }
    return s;
}

/* Gives a state back to p's idle list, its memory published. */
static void state_give(struct hub_policy *p, struct policy_state *s) {
    policy_state_publish(s);
    uv_mutex_lock(&p->mu);
    s->next = p->idle;
    p->idle = s;
    uv_mutex_unlock(&p->mu);
}

/* ---------------------------------------------------------------- calls -- */

/* One call under lua_cpcall: what it runs and what it returns.  Borrowed
 * from the caller's stack; shaped is the caller's. */
struct call_ctx {
    struct policy_state *s;
    enum hub_policy_fn fn;
    const struct hub_policy_event *ev;
    const struct hub_policy_retry_ctx *rctx;
    char bad[256];
    /* results */
    int matched;
    enum hub_policy_retry_action action;
    int64_t delay_ms;
    struct hub_policy_shaped *shaped;
    int64_t cpu_ns; /* policy_cpu_spent_ns() of the call */
};

/* t[k] = v for the table on top of the stack; nothing for a NULL v (an
 * absent attribute reads as nil). */
static void set_str(lua_State *L, const char *k, const char *v) {
    if (v != NULL) {
        lua_pushstring(L, v);
        lua_setfield(L, -2, k);
    }
}

/* Pushes ev as a table: the one built for the same serial on this state
 * when there is one (match and shape of one attempt share ev.data). */
static void push_event(lua_State *L, struct policy_state *s, const struct hub_policy_event *ev) {
    if (ev->serial != 0 && ev->serial == s->ev_last_serial) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_ev_last);
        return;
    }
    lua_createtable(L, 0, 16);
    set_str(L, "id", ev->id);
    set_str(L, "source", ev->source);
    set_str(L, "type", ev->type);
    set_str(L, "event_type", ev->event_type);
    set_str(L, "tenant", ev->tenant);
    set_str(L, "subject", ev->subject);
    set_str(L, "time", ev->time);
    set_str(L, "schema_version", ev->schema_version);
    set_str(L, "content_type", ev->content_type);
    lua_pushinteger(L, ev->schema_major);
    lua_setfield(L, -2, "schema_major");
    lua_newtable(L);
    for (const char *const *x = ev->extensions; x != NULL && x[0] != NULL && x[1] != NULL; x += 2) {
        set_str(L, x[0], x[1]);
    }
    lua_setfield(L, -2, "extensions");
    lua_pushlstring(L, ev->body != NULL ? ev->body : "", ev->body != NULL ? ev->body_len : 0);
    lua_setfield(L, -2, "body");
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_ev_meta);
    lua_setmetatable(L, -2);
    if (ev->serial != 0) {
        lua_pushvalue(L, -1);
        lua_rawseti(L, LUA_REGISTRYINDEX, s->ref_ev_last);
        s->ev_last_serial = ev->serial;
    }
}

/* Appends p[0..n) to sh's buffer, and a NUL when nul: the offset it went
 * to, or SIZE_MAX when memory ran out. */
static size_t shaped_put(struct hub_policy_shaped *sh, const char *p, size_t n, int nul) {
    size_t at = sh->len, need = sh->len + n + (nul ? 1 : 0);
    if (need > sh->cap || sh->buf == NULL) { /* an empty body is not NULL */
        size_t cap = sh->cap ? sh->cap : 1024;
        char *nb;
        while (cap < need) {
            cap *= 2;
        }
        nb = realloc(sh->buf, cap);
        if (nb == NULL) {
            return SIZE_MAX;
        }
        sh->buf = nb;
        sh->cap = cap;
    }
    memcpy(sh->buf + at, p, n);
    if (nul) {
        sh->buf[at + n] = '\0';
    }
    sh->len = need;
    return at;
}

/* Converts shape's results (body at -2, headers at -1) into c->shaped: a
 * table body JSON-encoded (a condemned encode raises again: its stop is
 * the call's), a string copied, the headers validated one by one.  A
 * result the contract refuses leaves c->bad set and returns normally.
 * The pointers are set last: the buffer may move as it grows. */
static int shape_results(lua_State *L, struct call_ctx *c) {
    struct hub_policy_shaped *sh = c->shaped;
    size_t len = 0, body_at = SIZE_MAX, ct_at = SIZE_MAX, ct_len = 0;
    const char *b, *ct = NULL;
    int n = 0;

    if (lua_istable(L, -2)) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, c->s->ref_encode);
        lua_pushvalue(L, -3);
        if (lua_pcall(L, 1, 1, 0) != 0) {
            if (c->s->condemned != POLICY_ALIVE) {
                return lua_error(L);
            }
            snprintf(c->bad, sizeof(c->bad), "shape: the body table cannot be JSON-encoded: %s",
                     lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
            return 0;
        }
        lua_replace(L, -3);
        ct = "application/json";
        ct_len = 16;
    } else if (!lua_isnil(L, -2) && lua_type(L, -2) != LUA_TSTRING) {
        snprintf(c->bad, sizeof(c->bad), "shape must return a string, a table or nil, not %s",
                 luaL_typename(L, -2));
        return 0;
    }
    if (lua_type(L, -2) == LUA_TSTRING) {
        b = lua_tolstring(L, -2, &len);
        if (len > HUB_POLICY_BODY_MAX) {
            snprintf(c->bad, sizeof(c->bad), "shape: the body is %zu bytes, over the %d cap", len,
                     HUB_POLICY_BODY_MAX);
            return 0;
        }
        if ((body_at = shaped_put(sh, b, len, 0)) == SIZE_MAX) {
            return luaL_error(L, "out of memory");
        }
    }
    if (!lua_isnil(L, -1) && !lua_istable(L, -1)) {
        snprintf(c->bad, sizeof(c->bad), "shape's second result must be a table of headers, not %s",
                 luaL_typename(L, -1));
        return 0;
    }
    sh->headers_at = sh->len;
    /* the headers, name and value after one another; a Content-Type
     * among them (its string stays on the stack) goes after them */
    if (lua_istable(L, -1)) {
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            size_t nl = 0, vl = 0;
            const char *name, *value;
            if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING) {
                snprintf(c->bad, sizeof(c->bad), "shape: headers must map strings to strings");
                return 0;
            }
            name = lua_tolstring(L, -2, &nl);
            value = lua_tolstring(L, -1, &vl);
            if (++n > HUB_POLICY_HEADERS_MAX || nl > 256 || vl > HUB_POLICY_HEADER_VALUE_MAX ||
                !hub_http_token(name, nl) || !hub_http_value_safe(value, vl)) {
                snprintf(c->bad, sizeof(c->bad),
                         "shape: header '%.64s' is not a valid header (or over %d headers)", name,
                         HUB_POLICY_HEADERS_MAX);
                return 0;
            }
            if (strcasecmp(name, "Content-Type") == 0) {
                ct = value;
                ct_len = vl;
            } else if (shaped_put(sh, name, nl, 1) == SIZE_MAX ||
                       shaped_put(sh, value, vl, 1) == SIZE_MAX) {
                return luaL_error(L, "out of memory");
            } else {
                sh->n_headers++;
            }
            lua_pop(L, 1);
        }
    }
    sh->headers_end = sh->len;
    if (ct != NULL && (ct_at = shaped_put(sh, ct, ct_len, 1)) == SIZE_MAX) {
        return luaL_error(L, "out of memory");
    }
    if (body_at != SIZE_MAX) {
        sh->body = sh->buf + body_at;
        sh->body_len = len;
    }
    if (ct_at != SIZE_MAX) {
        sh->content_type = sh->buf + ct_at;
    }
    return 0;
}

/* The protected body of every hook call: pushes the function and its
 * argument (ev, or ctx for retry), calls it with the policy's code flag on
 * (large blocks then need time: policy_alloc), and converts the results.
 * Under lua_cpcall with the call's deadline armed. */
static int call_protected(lua_State *L) {
    struct call_ctx *c = lua_touserdata(L, 1);
    struct policy_state *s = c->s;

    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_fn[c->fn]);
    if (c->fn == HUB_POLICY_RETRY) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, c->rctx->attempt);
        lua_setfield(L, -2, "attempt");
        if (c->rctx->status > 0) {
            lua_pushinteger(L, c->rctx->status);
            lua_setfield(L, -2, "status");
        }
        set_str(L, "error", c->rctx->error);
    } else {
        push_event(L, s, c->ev);
    }
    s->policy_code = 1;
    lua_call(L, 1, 2);
    s->policy_code = 0;
    switch (c->fn) {
    case HUB_POLICY_MATCH:
        c->matched = lua_toboolean(L, -2);
        return 0;
    case HUB_POLICY_RETRY:
        if (lua_isnil(L, -2)) {
            c->action = HUB_POLICY_RETRY_SCHEDULE;
        } else if (lua_isboolean(L, -2) && !lua_toboolean(L, -2)) {
            c->action = HUB_POLICY_RETRY_DEAD;
        } else if (lua_type(L, -2) == LUA_TNUMBER) {
            /* clamped to (0, 10h] (SPEC §8) */
            double sec = lua_tonumber(L, -2);
            double ms = sec * 1000.0;
            c->action = HUB_POLICY_RETRY_DELAY;
            c->delay_ms = ms < 1.0 || ms != ms                   ? 1
                          : ms > (double)HUB_BACKOFF_STEP_MAX_MS ? HUB_BACKOFF_STEP_MAX_MS
                                                                 : (int64_t)ms;
        } else if (lua_type(L, -2) == LUA_TSTRING &&
                   hub_duration_parse(lua_tostring(L, -2), &c->delay_ms) == 0) {
            /* the same clamp as for seconds */
            c->action = HUB_POLICY_RETRY_DELAY;
            c->delay_ms = c->delay_ms < 1                         ? 1
                          : c->delay_ms > HUB_BACKOFF_STEP_MAX_MS ? HUB_BACKOFF_STEP_MAX_MS
                                                                  : c->delay_ms;
        } else {
            snprintf(c->bad, sizeof(c->bad),
                     "retry must return seconds, a duration, nil or false, not %s",
                     luaL_typename(L, -2));
        }
        return 0;
    default:
        return shape_results(L, c);
    }
}

/*
 * Runs one hook of p under the deadline, on a state taken for the call.
 * Afterwards the state is collected when the call was stopped for memory,
 * so that garbage the policy left does not condemn its next call.
 */
static enum hub_policy_status policy_call(struct hub_policy *p, struct call_ctx *c, char *err,
                                          size_t errlen) {
    char prefix[16];
    enum hub_policy_status st = HUB_POLICY_OK;
    struct policy_state *s;
    int rc;

    snprintf(prefix, sizeof(prefix), "%s: ", hub_policy_fn_str(c->fn));
    if ((s = state_take(p, prefix, err, errlen)) == NULL) {
        return HUB_POLICY_ERROR;
    }
    c->s = s;
    s->condemned = POLICY_ALIVE;
    policy_deadline_arm(s);
    rc = lua_cpcall(s->L, call_protected, c);
    policy_deadline_disarm(s);
    c->cpu_ns = policy_cpu_spent_ns(s);
    s->policy_code = 0;
    if (rc != 0) {
        if (s->condemned == POLICY_CONDEMNED_TIMEOUT) {
            st = HUB_POLICY_TIMEOUT;
            snprintf(err, errlen, "%s%s.lua: ran past its %lld ms deadline and was stopped", prefix,
                     p->name, (long long)p->lim.timeout_ms);
        } else if (s->condemned == POLICY_CONDEMNED_NOMEM || rc == LUA_ERRMEM) {
            st = HUB_POLICY_NOMEM;
            snprintf(err, errlen, "%s%s.lua: hit its %zu-byte memory cap and was stopped", prefix,
                     p->name, s->cap);
        } else {
            st = HUB_POLICY_ERROR;
            policy_error_text(s->L, p->name, prefix, err, errlen);
        }
    } else if (c->bad[0] != '\0') {
        st = HUB_POLICY_BAD_RETURN;
        snprintf(err, errlen, "%s.lua: %s", p->name, c->bad);
    }
    lua_settop(s->L, 0);
    if (s->condemned != POLICY_ALIVE || rc == LUA_ERRMEM) {
        lua_gc(s->L, LUA_GCCOLLECT, 0);
        if (st == HUB_POLICY_NOMEM) {
            /* a collection only halves LuaJIT's concatenation buffer, which
             * a bomb of s .. s leaves at half the cap */
            lua_gc(s->L, LUA_GCCOLLECT, 0);
        }
    }
    s->condemned = POLICY_ALIVE;
    state_give(p, s);
    return st;
}

/* match(ev) as hub_policy_match(), and its CPU time into *cpu_ns. */
static enum hub_policy_status policy_match(struct hub_policy *p, const struct hub_policy_event *ev,
                                           int *matched, char *err, size_t errlen,
                                           int64_t *cpu_ns) {
    struct call_ctx c = {.fn = HUB_POLICY_MATCH, .ev = ev};
    enum hub_policy_status st;

    *matched = 1;
    if (!p->defs.has_fn[HUB_POLICY_MATCH]) {
        return HUB_POLICY_OK;
    }
    st = policy_call(p, &c, err, errlen);
    *cpu_ns = c.cpu_ns;
    if (st == HUB_POLICY_OK) {
        *matched = c.matched;
    }
    return st;
}

/* retry(ctx) as hub_policy_retry(), and its CPU time into *cpu_ns. */
static enum hub_policy_status policy_retry(struct hub_policy *p,
                                           const struct hub_policy_retry_ctx *ctx,
                                           enum hub_policy_retry_action *action, int64_t *delay_ms,
                                           char *err, size_t errlen, int64_t *cpu_ns) {
    struct call_ctx c = {.fn = HUB_POLICY_RETRY, .rctx = ctx};
    enum hub_policy_status st;

    *action = HUB_POLICY_RETRY_SCHEDULE;
    *delay_ms = 0;
    /* a table (or nothing) is the schedule: no call */
    if (!p->defs.has_fn[HUB_POLICY_RETRY] || p->defs.n_schedule > 0) {
        return HUB_POLICY_OK;
    }
    st = policy_call(p, &c, err, errlen);
    *cpu_ns = c.cpu_ns;
    if (st == HUB_POLICY_OK) {
        *action = c.action;
        *delay_ms = c.delay_ms;
    }
    return st;
}

/* shape(ev) as hub_policy_shape(), and its CPU time into *cpu_ns. */
static enum hub_policy_status policy_shape(struct hub_policy *p, const struct hub_policy_event *ev,
                                           struct hub_policy_shaped *out, char *err, size_t errlen,
                                           int64_t *cpu_ns) {
    struct call_ctx c = {.fn = HUB_POLICY_SHAPE, .ev = ev, .shaped = out};
    enum hub_policy_status st;

    hub_policy_shaped_reset(out);
    if (!p->defs.has_fn[HUB_POLICY_SHAPE]) {
        return HUB_POLICY_OK;
    }
    st = policy_call(p, &c, err, errlen);
    *cpu_ns = c.cpu_ns;
    if (st != HUB_POLICY_OK) {
        hub_policy_shaped_reset(out);
    }
    return st;
}

enum hub_policy_status hub_policy_match(struct hub_policy *p, const struct hub_policy_event *ev,
                                        int *matched, char *err, size_t errlen) {
    int64_t cpu_ns = 0;
    return policy_match(p, ev, matched, err, errlen, &cpu_ns);
}

enum hub_policy_status hub_policy_retry(struct hub_policy *p,
                                        const struct hub_policy_retry_ctx *ctx,
                                        enum hub_policy_retry_action *action, int64_t *delay_ms,
                                        char *err, size_t errlen) {
    int64_t cpu_ns = 0;
    return policy_retry(p, ctx, action, delay_ms, err, errlen, &cpu_ns);
}

enum hub_policy_status hub_policy_shape(struct hub_policy *p, const struct hub_policy_event *ev,
                                        struct hub_policy_shaped *out, char *err, size_t errlen) {
    int64_t cpu_ns = 0;
    return policy_shape(p, ev, out, err, errlen, &cpu_ns);
}

void hub_policy_shaped_reset(struct hub_policy_shaped *s) {
    *s = (struct hub_policy_shaped){.buf = s->buf, .cap = s->cap};
}

void hub_policy_shaped_free(struct hub_policy_shaped *s) {
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

const char *hub_policy_shaped_next(const struct hub_policy_shaped *s, size_t *pos,
                                   const char **value) {
    const char *name;
    if (s->headers_at + *pos >= s->headers_end) {
        return NULL;
    }
    name = s->buf + s->headers_at + *pos;
    *value = name + strlen(name) + 1;
    *pos = (size_t)(*value + strlen(*value) + 1 - (s->buf + s->headers_at));
    return name;
}

const char *hub_policy_shaped_header(const struct hub_policy_shaped *s, const char *name) {
    size_t pos = 0;
    const char *n, *v;
    while ((n = hub_policy_shaped_next(s, &pos, &v)) != NULL) {
        if (strcmp(n, name) == 0) {
            return v;
        }
    }
    return NULL;
}

/* The pool's entry point: the call as its fn says, CPU time included. */
void policy_call_run(struct hub_policy_call *c) {
    c->err[0] = '\0';
    c->cpu_ns = 0;
    switch (c->fn) {
    case HUB_POLICY_MATCH:
        c->status =
            policy_match(c->policy, &c->ev, &c->matched, c->err, sizeof(c->err), &c->cpu_ns);
        if (c->status == HUB_POLICY_OK && c->matched && c->shape_ahead &&
            c->policy->defs.has_fn[HUB_POLICY_SHAPE]) {
            /* on the state match used (push_event: ev.data decoded once) */
            int64_t cpu_ns = 0;
            c->shape_status =
                policy_shape(c->policy, &c->ev, &c->shaped, c->err, sizeof(c->err), &cpu_ns);
            c->shaped_ahead = 1;
            c->cpu_ns += cpu_ns;
        }
        break;
    case HUB_POLICY_RETRY:
        c->status = policy_retry(c->policy, &c->retry, &c->action, &c->delay_ms, c->err,
                                 sizeof(c->err), &c->cpu_ns);
        break;
    default:
        c->status = policy_shape(c->policy, &c->ev, &c->shaped, c->err, sizeof(c->err), &c->cpu_ns);
        break;
    }
}
