/*
 * policy — sandboxed Lua policies (see policy.h).
 *
 * Limits follow HAProxy's hlua: a count hook checks a deadline every
 * POLICY_HOOK_COUNT VM instructions (the JIT is off for the whole state, so
 * the hook always fires), and an accounting allocator refuses to grow the
 * state past its cap.  Because a policy may call pcall, the sandbox's pcall
 * re-raises once a call has been condemned (deadline passed or memory
 * refused): a policy cannot catch its own timeout.  C code that touches a
 * policy's state runs inside lua_cpcall, so an allocation failure anywhere
 * is an error to report, never a panic.
 *
 * Work inside library functions, where the hook never fires, is bounded
 * too: the functions that can run long in C (patterns, string.rep,
 * table.concat and table.insert, the JSON codec) are this hub's own
 * (lpattern, lbulk, ljson), which ask the call's budget every few thousand
 * steps; and the allocator refuses, as a timeout, a large block that could
 * not be filled in the time left (string.upper of 50 MB, s .. s, ...).
 * policy_left_ns() is the one place that reads the deadline.
 */
#include "policy.h"

#include <dirent.h>
#include <errno.h>
#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "backoff.h"
#include "config.h"
#include "lbudget.h"
#include "lbulk.h"
#include "ljson.h"
#include "log.h"
#include "lpattern.h"
#include "util.h"

#define POLICY_HOOK_COUNT 1000 /* VM instructions between deadline checks */
#define POLICY_LOG_BURST 20    /* hub.log lines a policy may write at once ... */
#define POLICY_LOG_PER_S 10    /* ... and per second after that */
#define POLICY_LOG_MSG_MAX 1024
/* Growth from which the allocator asks whether the block can still be
 * filled before the deadline (HUB_LBUDGET_NS_PER_BYTE); smaller blocks are
 * cheap next to the hook's period. */
#define POLICY_BIG_ALLOC (1 << 20)

extern const char hub_lua_sandbox[];
extern const size_t hub_lua_sandbox_len;

/* ---------------------------------------------------------------- names -- */

const char *hub_policy_fn_str(enum hub_policy_fn fn) {
    static const char *const s[HUB_POLICY_FN__COUNT] = {"match", "retry", "shape"};
    return fn < HUB_POLICY_FN__COUNT ? s[fn] : "?";
}

const char *hub_policy_status_str(enum hub_policy_status st) {
    static const char *const s[HUB_POLICY_STATUS__COUNT] = {"ok",    "error",      "timeout",
                                                            "nomem", "bad_return", "missing"};
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

/* ---------------------------------------------------------------- state -- */

enum condemned { ALIVE = 0, CONDEMNED_TIMEOUT, CONDEMNED_NOMEM };

struct hub_policy {
    int refs;
    char name[HUB_POLICY_NAME_MAX + 1];
    char hash[65];
    lua_State *L;
    size_t used; /* bytes the allocator has handed out */
    size_t cap;  /* ... and may hand out */
    int64_t timeout_ns;
    uint64_t deadline_ns; /* 0 outside a call; read only by policy_left_ns() */
    enum condemned condemned;
    struct hub_lbudget budget;             /* the library functions' view of the deadline */
    int policy_code;                       /* policy code runs: large blocks need time */
    int ref_fn[HUB_POLICY_FN__COUNT];      /* registry refs of the functions, LUA_NOREF if absent */
    int ref_encode;                        /* json.encode, for shaped tables */
    int ref_decode;                        /* json.decode, for ev.data */
    int ref_ev_meta;                       /* metatable of ev (lazy data) */
    int ref_ev_last;                       /* the last ev built, and ... */
    uint64_t ev_last_serial;               /* ... its serial (0 = none) */
    int64_t schedule[HUB_RETRY_MAX_STEPS]; /* retry as a table */
    size_t n_schedule;
    double log_tokens; /* hub.log rate limit */
    uint64_t log_last_ns;
    uint64_t log_dropped;
};

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Starts the deadline of a call (or of a file's top level). */
static void policy_deadline_arm(struct hub_policy *p) {
    p->deadline_ns = mono_ns() + (uint64_t)p->timeout_ns;
}

static void policy_deadline_disarm(struct hub_policy *p) {
    p->deadline_ns = 0;
}

/* Nanoseconds the running call has left: <= 0 past its deadline, INT64_MAX
 * outside a call.  The only reader of the deadline: the hook, the
 * allocator and the library budget all ask here. */
static int64_t policy_left_ns(const struct hub_policy *p) {
    if (p->deadline_ns == 0) {
        return INT64_MAX;
    }
    return (int64_t)(p->deadline_ns - mono_ns());
}

/* The library functions' budget (lbudget.h): refuses work of need_ns when
 * less is left, and condemns the call so that its error is a timeout no
 * pcall can catch. */
static int policy_budget_expired(void *ud, int64_t need_ns) {
    struct hub_policy *p = ud;
    if (policy_left_ns(p) > need_ns) {
        return 0;
    }
    p->condemned = CONDEMNED_TIMEOUT;
    return 1;
}

/*
 * The accounting allocator: the policy is its userdata.  During a call,
 * growth past the cap condemns the call as out of memory; and while policy
 * code runs, a large block that could not be filled before the deadline
 * (at HUB_LBUDGET_NS_PER_BYTE) condemns it as out of time: LuaJIT's own
 * string functions fill what they allocate in one loop the hook cannot
 * stop.  The hub's own copies (ev.body) are not the policy's doing and
 * are not refused.
 */
static void *policy_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    struct hub_policy *p = ud;
    void *np;

    if (nsize == 0) {
        free(ptr);
        p->used -= ptr != NULL ? osize : 0;
        return NULL;
    }
    if (ptr == NULL) {
        osize = 0;
    }
    if (nsize > osize && p->used + (nsize - osize) > p->cap) {
        /* condemns a running call: its pcall cannot catch this */
        if (p->deadline_ns != 0) {
            p->condemned = CONDEMNED_NOMEM;
        }
        return NULL;
    }
    if (nsize >= osize + POLICY_BIG_ALLOC && p->policy_code &&
        policy_budget_expired(p, (int64_t)nsize * HUB_LBUDGET_NS_PER_BYTE)) {
        return NULL;
    }
    np = realloc(ptr, nsize);
    if (np != NULL) {
        p->used = p->used - osize + nsize;
    }
    return np;
}

static struct hub_policy *policy_of(lua_State *L) {
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* The count hook: past the deadline, every check raises again, so loops
 * around pcall cannot outlive it. */
static void policy_hook(lua_State *L, lua_Debug *ar) {
    struct hub_policy *p = policy_of(L);
    (void)ar;
    if (policy_budget_expired(p, 0)) {
        luaL_error(L, "policy ran past its deadline (%d ms)", (int)(p->timeout_ns / 1000000));
    }
}

/* pcall/xpcall for policies: as the real ones, except that a condemned
 * call's error passes through. */
static int sandbox_pcall(lua_State *L) {
    struct hub_policy *p = policy_of(L);
    int status;

    luaL_checkany(L, 1);
    status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (p->condemned != ALIVE) {
        return lua_error(L);
    }
    lua_pushboolean(L, status == 0);
    lua_insert(L, 1);
    return lua_gettop(L);
}

/* The message handler xpcall really installs: the policy's handler (upvalue
 * 1), except for a condemned call, whose error passes untouched.  LuaJIT
 * runs the handler inside the count hook that raised the timeout, where no
 * hook fires: a looping handler would never be stopped. */
static int xpcall_handler(lua_State *L) {
    if (policy_of(L)->condemned != ALIVE) {
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* xpcall(f, handler): the handler runs with the error, as in Lua 5.1. */
static int sandbox_xpcall(lua_State *L) {
    struct hub_policy *p = policy_of(L);
    int status;

    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    lua_pushcclosure(L, xpcall_handler, 1); /* f, wrapped handler */
    lua_insert(L, 1);                       /* wrapped handler, f */
    status = lua_pcall(L, 0, LUA_MULTRET, 1);
    if (p->condemned != ALIVE) {
        return lua_error(L);
    }
    lua_pushboolean(L, status == 0);
    lua_replace(L, 1); /* replaces the handler */
    return lua_gettop(L);
}

/* hub.log(level, msg): rate-limited, capped, tagged with the policy. */
static int sandbox_log(lua_State *L) {
    struct hub_policy *p = policy_of(L);
    const char *level = luaL_checkstring(L, 1);
    size_t len = 0;
    const char *msg = luaL_checklstring(L, 2, &len);
    enum hub_log_level lv = HUB_INFO;
    uint64_t now = mono_ns();
    char buf[POLICY_LOG_MSG_MAX + 1];

    if (strcmp(level, "debug") == 0) {
        lv = HUB_DEBUG;
    } else if (strcmp(level, "warn") == 0) {
        lv = HUB_WARN;
    } else if (strcmp(level, "error") == 0) {
        lv = HUB_ERROR;
    } else if (strcmp(level, "info") != 0) {
        return luaL_argerror(L, 1, "level must be debug, info, warn or error");
    }
    p->log_tokens += (double)(now - p->log_last_ns) / 1e9 * POLICY_LOG_PER_S;
    if (p->log_tokens > POLICY_LOG_BURST) {
        p->log_tokens = POLICY_LOG_BURST;
    }
    p->log_last_ns = now;
    if (p->log_tokens < 1.0) {
        p->log_dropped++;
        return 0;
    }
    p->log_tokens -= 1.0;
    if (!hub_log_enabled(lv)) {
        return 0;
    }
    len = len > POLICY_LOG_MSG_MAX ? POLICY_LOG_MSG_MAX : len;
    memcpy(buf, msg, len);
    buf[len] = '\0';
    hub_log(lv, buf, HUB_LS("policy", p->name), HUB_LI("dropped", (int64_t)p->log_dropped));
    p->log_dropped = 0;
    return 0;
}

/* ev's __index: ev.data decodes ev.body on first access (nil when it is not
 * JSON) and keeps it. */
static int ev_index(lua_State *L) {
    struct hub_policy *p = policy_of(L);
    const char *key = lua_tostring(L, 2);

    if (key == NULL || strcmp(key, "data") != 0) {
        return 0;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->ref_decode);
    lua_getfield(L, 1, "body");
    if (lua_pcall(L, 1, 1, 0) != 0) {
        if (p->condemned != ALIVE) {
            return lua_error(L);
        }
        lua_pop(L, 1);
        return 0; /* not JSON: ev.data is nil */
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, 1, "data"); /* rawset: ev has no __newindex */
    return 1;
}

/* Builds the sandbox (lua/sandbox.lua) and returns its environment on the
 * stack.  Runs under lua_cpcall. */
static int build_sandbox(lua_State *L) {
    struct hub_policy *p = lua_touserdata(L, 1);
    static const luaL_Reg libs[] = {{"", luaopen_base},
                                    {LUA_STRLIBNAME, luaopen_string},
                                    {LUA_TABLIBNAME, luaopen_table},
                                    {LUA_MATHLIBNAME, luaopen_math},
                                    {LUA_OSLIBNAME, luaopen_os},
                                    {NULL, NULL}};

    for (const luaL_Reg *l = libs; l->func != NULL; l++) {
        lua_pushcfunction(L, l->func);
        lua_pushstring(L, l->name);
        lua_call(L, 1, 0);
    }
    /* the library functions that run long in C, replaced by bounded ones
     * before the sandbox copies the tables */
    lua_getglobal(L, LUA_STRLIBNAME);
    lua_getglobal(L, LUA_TABLIBNAME);
    hub_lpattern_register(L, -2, &p->budget);
    hub_lbulk_register(L, -2, -1, &p->budget);
    lua_pop(L, 2);
    if (luaL_loadbuffer(L, hub_lua_sandbox, hub_lua_sandbox_len, "=sandbox") != 0) {
        return lua_error(L);
    }
    lua_pushvalue(L, LUA_GLOBALSINDEX);
    lua_createtable(L, 0, 3);
    lua_pushcfunction(L, sandbox_pcall);
    lua_setfield(L, -2, "pcall");
    lua_pushcfunction(L, sandbox_xpcall);
    lua_setfield(L, -2, "xpcall");
    lua_pushcfunction(L, sandbox_log);
    lua_setfield(L, -2, "log");
    hub_ljson_push(L, &p->budget);
    lua_getfield(L, -1, "decode");
    p->ref_decode = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "encode");
    p->ref_encode = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_call(L, 3, 1); /* env */

    lua_createtable(L, 0, 2);
    lua_pushcfunction(L, ev_index);
    lua_setfield(L, -2, "__index");
    lua_pushliteral(L, "event");
    lua_setfield(L, -2, "__metatable");
    p->ref_ev_meta = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushboolean(L, 0);
    p->ref_ev_last = luaL_ref(L, LUA_REGISTRYINDEX);

    /* The chunk's own globals are the sandbox: the real ones are left
     * unreachable (no getfenv, no debug). */
    lua_pushvalue(L, -1);
    lua_replace(L, LUA_GLOBALSINDEX);
    return 1;
}

static int64_t policy_value_ms(lua_State *L, int idx) {
    int64_t ms = -1;
    if (lua_type(L, idx) == LUA_TNUMBER) {
        double s = lua_tonumber(L, idx);
        ms = s > 0 && s <= HUB_BACKOFF_STEP_MAX_MS / 1000.0 ? (int64_t)(s * 1000.0 + 0.5) : -1;
        ms = ms == 0 ? 1 : ms;
    } else if (lua_type(L, idx) == LUA_TSTRING) {
        if (hub_duration_parse(lua_tostring(L, idx), &ms) != 0) {
            ms = -1;
        }
    }
    return ms;
}

struct load_ctx {
    struct hub_policy *p;
    const char *src;
    size_t len;
    char chunkname[HUB_POLICY_NAME_MAX + 8];
    char bad[256]; /* validation error, when not a Lua error */
};

/* Runs the chunk and validates the table it returns.  Under lua_cpcall,
 * with the sandbox environment at index 2. */
static int load_chunk(lua_State *L) {
    struct load_ctx *c = lua_touserdata(L, 1);
    struct hub_policy *p = c->p;
    static const char *const fields[HUB_POLICY_FN__COUNT] = {"match", "retry", "shape"};

    if (luaL_loadbufferx(L, c->src, c->len, c->chunkname, "t") != 0) {
        return lua_error(L);
    }
    p->policy_code = 1;
    lua_call(L, 0, 1);
    p->policy_code = 0;
    if (!lua_istable(L, -1)) {
        snprintf(c->bad, sizeof(c->bad), "the file must return a table, not %s",
                 luaL_typename(L, -1));
        return 0;
    }
    /* only known fields: a typo ("shap") would otherwise silently do nothing */
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        int known = 0;
        for (int i = 0; k != NULL && i < HUB_POLICY_FN__COUNT; i++) {
            known |= strcmp(k, fields[i]) == 0;
        }
        if (!known) {
            snprintf(c->bad, sizeof(c->bad),
                     "unknown field %s%.64s%s in the returned table (expected match, retry, shape)",
                     k ? "'" : "", k ? k : "(not a string)", k ? "'" : "");
            return 0;
        }
        lua_pop(L, 1);
    }
    for (int i = 0; i < HUB_POLICY_FN__COUNT; i++) {
        lua_getfield(L, -1, fields[i]);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        if (i == HUB_POLICY_RETRY && lua_istable(L, -1)) {
            size_t n = lua_objlen(L, -1);
            if (n < 1 || n > HUB_RETRY_MAX_STEPS) {
                snprintf(c->bad, sizeof(c->bad), "retry: a table of 1 to %d durations",
                         HUB_RETRY_MAX_STEPS);
                return 0;
            }
            for (size_t k = 1; k <= n; k++) {
                lua_rawgeti(L, -1, (int)k);
                p->schedule[k - 1] = policy_value_ms(L, -1);
                lua_pop(L, 1);
                if (p->schedule[k - 1] <= 0 || p->schedule[k - 1] > HUB_BACKOFF_STEP_MAX_MS) {
                    snprintf(c->bad, sizeof(c->bad),
                             "retry[%zu]: a duration in (0, 10h] (\"30s\", \"5m\" or seconds)", k);
                    return 0;
                }
            }
            p->n_schedule = n;
            lua_pop(L, 1);
            continue;
        }
        if (!lua_isfunction(L, -1)) {
            snprintf(c->bad, sizeof(c->bad), "%s must be a function%s, not %s", fields[i],
                     i == HUB_POLICY_RETRY ? " or a table of durations" : "", luaL_typename(L, -1));
            return 0;
        }
        p->ref_fn[i] = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    return 0;
}

/* Copies Lua's message for the error on top of the stack, prefixed, and
 * naming the file when Lua's message does not ("<name>.lua:<line>: ..." is
 * what error() at level 1 and syntax errors give). */
static void error_text(lua_State *L, const char *name, const char *prefix, char *err,
                       size_t errlen) {
    const char *m = lua_tostring(L, -1);
    size_t nl = strlen(name);

    if (err == NULL || errlen == 0) {
        return;
    }
    if (m == NULL) {
        m = "(error object is not a string)";
    }
    if (strncmp(m, name, nl) == 0 && strncmp(m + nl, ".lua:", 5) == 0) {
        snprintf(err, errlen, "%s%s", prefix, m);
    } else {
        snprintf(err, errlen, "%s%s.lua: %s", prefix, name, m);
    }
}

/* SHA-256 of src[0..len) as hex into out[65]. */
static void source_hash(const char *src, size_t len, char out[65]) {
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(src, len, md, &mdlen, EVP_sha256(), NULL);
    hub_hex(md, 32, out);
}

/* hub_policy_compile for a source whose hash the caller has already. */
static struct hub_policy *policy_compile(const char *name, const char *src, size_t len,
                                         const char *hash, const struct hub_policy_limits *lim,
                                         char *err, size_t errlen) {
    struct hub_policy *p = calloc(1, sizeof(*p));
    struct load_ctx c = {.p = p, .src = src, .len = len};
    int rc;

    if (p == NULL) {
        snprintf(err, errlen, "%s.lua: out of memory", name);
        return NULL;
    }
    p->refs = 1;
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(c.chunkname, sizeof(c.chunkname), "@%s.lua", name);
    snprintf(p->hash, sizeof(p->hash), "%s", hash);
    p->cap = lim->memory_bytes;
    p->timeout_ns = lim->timeout_ms * 1000000;
    p->budget.expired = policy_budget_expired;
    p->budget.ud = p;
    p->log_tokens = POLICY_LOG_BURST;
    p->log_last_ns = mono_ns();
    for (int i = 0; i < HUB_POLICY_FN__COUNT; i++) {
        p->ref_fn[i] = LUA_NOREF;
    }
    p->L = lua_newstate(policy_alloc, p);
    if (p->L == NULL) {
        snprintf(err, errlen, "%s.lua: cannot create a Lua state (memory cap too small?)", name);
        free(p);
        return NULL;
    }
    /* count hooks never fire in compiled traces: interpreter only */
    luaJIT_setmode(p->L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    lua_sethook(p->L, policy_hook, LUA_MASKCOUNT, POLICY_HOOK_COUNT);
    if (lua_cpcall(p->L, build_sandbox, p) != 0) {
        error_text(p->L, name, "", err, errlen);
        hub_policy_unref(p);
        return NULL;
    }
    /* the chunk's top level runs under the same limits as any call */
    policy_deadline_arm(p);
    rc = lua_cpcall(p->L, load_chunk, &c);
    policy_deadline_disarm(p);
    p->policy_code = 0;
    if (rc != 0 || c.bad[0] != '\0') {
        if (p->condemned == CONDEMNED_TIMEOUT) {
            snprintf(err, errlen, "%s.lua: the top level ran past the %lld ms deadline", name,
                     (long long)lim->timeout_ms);
        } else if (p->condemned == CONDEMNED_NOMEM || rc == LUA_ERRMEM) {
            snprintf(err, errlen, "%s.lua: the top level hit the %zu-byte memory cap", name,
                     p->cap);
        } else if (rc != 0) {
            error_text(p->L, name, "", err, errlen);
        } else {
            snprintf(err, errlen, "%s.lua: %s", name, c.bad);
        }
        hub_policy_unref(p);
        return NULL;
    }
    lua_settop(p->L, 0);
    lua_gc(p->L, LUA_GCCOLLECT, 0);
    return p;
}

struct hub_policy *hub_policy_compile(const char *name, const char *src, size_t len,
                                      const struct hub_policy_limits *lim, char *err,
                                      size_t errlen) {
    char hash[65];
    source_hash(src, len, hash);
    return policy_compile(name, src, len, hash, lim, err, errlen);
}

void hub_policy_ref(struct hub_policy *p) {
    p->refs++;
}

void hub_policy_unref(struct hub_policy *p) {
    if (p == NULL || --p->refs > 0) {
        return;
    }
    if (p->L != NULL) {
        lua_close(p->L);
    }
    free(p);
}

const char *hub_policy_name(const struct hub_policy *p) {
    return p->name;
}

const char *hub_policy_hash(const struct hub_policy *p) {
    return p->hash;
}

int hub_policy_has(const struct hub_policy *p, enum hub_policy_fn fn) {
    return p->ref_fn[fn] != LUA_NOREF || (fn == HUB_POLICY_RETRY && p->n_schedule > 0);
}

size_t hub_policy_memory(const struct hub_policy *p) {
    return p->used;
}

size_t hub_policy_retry_schedule(const struct hub_policy *p, const int64_t **steps) {
    if (p->n_schedule > 0) {
        *steps = p->schedule;
    }
    return p->n_schedule;
}

/* ---------------------------------------------------------------- calls -- */

struct call_ctx {
    struct hub_policy *p;
    enum hub_policy_fn fn;
    const struct hub_policy_event *ev;
    const struct hub_policy_retry_ctx *rctx;
    char bad[256];
    /* results */
    int matched;
    enum hub_policy_retry_action action;
    int64_t delay_ms;
    struct hub_policy_shaped *shaped;
};

static void set_str(lua_State *L, const char *k, const char *v) {
    if (v != NULL) {
        lua_pushstring(L, v);
        lua_setfield(L, -2, k);
    }
}

static void push_event(lua_State *L, struct hub_policy *p, const struct hub_policy_event *ev) {
    if (ev->serial != 0 && ev->serial == p->ev_last_serial) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, p->ref_ev_last);
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
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->ref_ev_meta);
    lua_setmetatable(L, -2);
    if (ev->serial != 0) {
        lua_pushvalue(L, -1);
        lua_rawseti(L, LUA_REGISTRYINDEX, p->ref_ev_last);
        p->ev_last_serial = ev->serial;
    }
}

/* Converts shape's results (body at -2, headers at -1). */
static int shape_results(lua_State *L, struct call_ctx *c) {
    struct hub_policy_shaped *s = c->shaped;
    size_t len = 0;
    const char *b;
    int n = 0;

    if (lua_istable(L, -2)) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, c->p->ref_encode);
        lua_pushvalue(L, -3);
        if (lua_pcall(L, 1, 1, 0) != 0) {
            if (c->p->condemned != ALIVE) {
                return lua_error(L);
            }
            snprintf(c->bad, sizeof(c->bad), "shape: the body table cannot be JSON-encoded: %s",
                     lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
            return 0;
        }
        lua_replace(L, -3);
        s->content_type = strdup("application/json");
        if (s->content_type == NULL) {
            return luaL_error(L, "out of memory");
        }
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
        s->body = malloc(len ? len : 1);
        if (s->body == NULL) {
            return luaL_error(L, "out of memory");
        }
        memcpy(s->body, b, len);
        s->body_len = len;
    }
    if (lua_isnil(L, -1)) {
        return 0;
    }
    if (!lua_istable(L, -1)) {
        snprintf(c->bad, sizeof(c->bad), "shape's second result must be a table of headers, not %s",
                 luaL_typename(L, -1));
        return 0;
    }
    s->headers = json_object();
    if (s->headers == NULL) {
        return luaL_error(L, "out of memory");
    }
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
            free(s->content_type);
            s->content_type = strdup(value);
            if (s->content_type == NULL) {
                return luaL_error(L, "out of memory");
            }
        } else if (json_object_set_new(s->headers, name, json_string(value)) != 0) {
            return luaL_error(L, "out of memory");
        }
        lua_pop(L, 1);
    }
    return 0;
}

/* The protected body of every hook call. */
static int call_protected(lua_State *L) {
    struct call_ctx *c = lua_touserdata(L, 1);
    struct hub_policy *p = c->p;

    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->ref_fn[c->fn]);
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
        push_event(L, p, c->ev);
    }
    p->policy_code = 1;
    lua_call(L, 1, 2);
    p->policy_code = 0;
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
            double s = lua_tonumber(L, -2);
            double ms = s * 1000.0;
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
 * Runs one hook under the deadline.  Afterwards the state is collected when
 * the call was stopped for memory, so that garbage the policy left does not
 * condemn its next call.
 */
static enum hub_policy_status policy_call(struct call_ctx *c, char *err, size_t errlen) {
    struct hub_policy *p = c->p;
    char prefix[16];
    enum hub_policy_status st = HUB_POLICY_OK;
    int rc;

    snprintf(prefix, sizeof(prefix), "%s: ", hub_policy_fn_str(c->fn));
    p->condemned = ALIVE;
    policy_deadline_arm(p);
    rc = lua_cpcall(p->L, call_protected, c);
    policy_deadline_disarm(p);
    p->policy_code = 0;
    if (rc != 0) {
        if (p->condemned == CONDEMNED_TIMEOUT) {
            st = HUB_POLICY_TIMEOUT;
            snprintf(err, errlen, "%s%s.lua: ran past its %lld ms deadline and was stopped", prefix,
                     p->name, (long long)(p->timeout_ns / 1000000));
        } else if (p->condemned == CONDEMNED_NOMEM || rc == LUA_ERRMEM) {
            st = HUB_POLICY_NOMEM;
            snprintf(err, errlen, "%s%s.lua: hit its %zu-byte memory cap and was stopped", prefix,
                     p->name, p->cap);
        } else {
            st = HUB_POLICY_ERROR;
            error_text(p->L, p->name, prefix, err, errlen);
        }
    } else if (c->bad[0] != '\0') {
        st = HUB_POLICY_BAD_RETURN;
        snprintf(err, errlen, "%s.lua: %s", p->name, c->bad);
    }
    lua_settop(p->L, 0);
    if (p->condemned != ALIVE || rc == LUA_ERRMEM) {
        lua_gc(p->L, LUA_GCCOLLECT, 0);
        if (st == HUB_POLICY_NOMEM) {
            /* a collection only halves LuaJIT's concatenation buffer, which
             * a bomb of s .. s leaves at half the cap */
            lua_gc(p->L, LUA_GCCOLLECT, 0);
        }
    }
    p->condemned = ALIVE;
    return st;
}

enum hub_policy_status hub_policy_match(struct hub_policy *p, const struct hub_policy_event *ev,
                                        int *matched, char *err, size_t errlen) {
    struct call_ctx c = {.p = p, .fn = HUB_POLICY_MATCH, .ev = ev};
    enum hub_policy_status st;

    *matched = 1;
    if (p->ref_fn[HUB_POLICY_MATCH] == LUA_NOREF) {
        return HUB_POLICY_OK;
    }
    st = policy_call(&c, err, errlen);
    if (st == HUB_POLICY_OK) {
        *matched = c.matched;
    }
    return st;
}

enum hub_policy_status hub_policy_retry(struct hub_policy *p,
                                        const struct hub_policy_retry_ctx *ctx,
                                        enum hub_policy_retry_action *action, int64_t *delay_ms,
                                        char *err, size_t errlen) {
    struct call_ctx c = {.p = p, .fn = HUB_POLICY_RETRY, .rctx = ctx};
    enum hub_policy_status st;

    *action = HUB_POLICY_RETRY_SCHEDULE;
    *delay_ms = 0;
    if (p->ref_fn[HUB_POLICY_RETRY] == LUA_NOREF) {
        return HUB_POLICY_OK;
    }
    st = policy_call(&c, err, errlen);
    if (st == HUB_POLICY_OK) {
        *action = c.action;
        *delay_ms = c.delay_ms;
    }
    return st;
}

void hub_policy_shaped_free(struct hub_policy_shaped *s) {
    free(s->body);
    free(s->content_type);
    json_decref(s->headers);
    memset(s, 0, sizeof(*s));
}

enum hub_policy_status hub_policy_shape(struct hub_policy *p, const struct hub_policy_event *ev,
                                        struct hub_policy_shaped *out, char *err, size_t errlen) {
    struct call_ctx c = {.p = p, .fn = HUB_POLICY_SHAPE, .ev = ev, .shaped = out};
    enum hub_policy_status st;

    memset(out, 0, sizeof(*out));
    if (p->ref_fn[HUB_POLICY_SHAPE] == LUA_NOREF) {
        return HUB_POLICY_OK;
    }
    st = policy_call(&c, err, errlen);
    if (st != HUB_POLICY_OK) {
        hub_policy_shaped_free(out);
    }
    return st;
}

/* ------------------------------------------------------ directory scans -- */

/* One file of a scan. */
struct scan_file {
    char name[HUB_POLICY_NAME_MAX + 1];
    char hash[65];
    struct hub_policy *policy; /* compiled now, or NULL */
    char *error;
};

struct scan {
    char *dir;
    struct hub_policy_limits lim;
    struct hub_policy_gen *prev; /* held; read-only here */
    struct scan_file *files;
    size_t n;
    char *dir_error;
    uint64_t started_ns;
};

static int name_cmp(const void *a, const void *b) {
    return strcmp(((const struct scan_file *)a)->name, ((const struct scan_file *)b)->name);
}

struct hub_policy_entry {
    char name[HUB_POLICY_NAME_MAX + 1];
    struct hub_policy *policy; /* the version in use, or NULL (never loaded) */
    uint64_t loaded_gen;       /* generation that loaded it */
    int64_t loaded_at_ms;
    char *error; /* the last load's error for this file, or NULL */
};

struct hub_policy_gen {
    int refs;
    uint64_t number;
    int64_t created_ms;
    size_t n;
    struct hub_policy_entry *e; /* sorted by name */
};

static const struct hub_policy_entry *gen_entry(const struct hub_policy_gen *g, const char *name) {
    size_t lo = 0, hi = g != NULL ? g->n : 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(name, g->e[mid].name);
        if (c == 0) {
            return &g->e[mid];
        }
        if (c < 0) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return NULL;
}

/*
 * Reads dir and compiles each valid file into s->files (sorted).  A file
 * whose hash equals the loaded version in s->prev is not compiled again.
 * Runs on any thread: it touches only s and reads s->prev, which is
 * immutable while held.
 */
static void scan_dir(struct scan *s) {
    DIR *dir = opendir(s->dir);
    struct dirent *de;
    size_t cap = 0;

    if (dir == NULL) {
        char msg[512];
        snprintf(msg, sizeof(msg), "cannot read the policy directory %s: %s", s->dir,
                 strerror(errno));
        s->dir_error = strdup(msg);
        return;
    }
    while ((de = readdir(dir)) != NULL) {
        size_t nl = strlen(de->d_name);
        struct scan_file *f;
        char path[4096], err[512];
        char *src;
        size_t len = 0;
        const struct hub_policy_entry *old;

        if (nl < 5 || strcmp(de->d_name + nl - 4, ".lua") != 0 || de->d_name[0] == '.') {
            continue;
        }
        if (s->n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            struct scan_file *nf = realloc(s->files, sizeof(*nf) * ncap);
            if (nf == NULL) {
                break;
            }
            s->files = nf;
            cap = ncap;
        }
        f = &s->files[s->n++];
        memset(f, 0, sizeof(*f));
        if (!hub_policy_name_valid(de->d_name, nl - 4)) {
            snprintf(f->name, sizeof(f->name), "%.*s", (int)(nl - 4 > 64 ? 64 : nl - 4),
                     de->d_name);
            snprintf(err, sizeof(err), "%.200s: not a valid policy name ([A-Za-z0-9_-]{1,64}.lua)",
                     de->d_name);
            f->error = strdup(err);
            continue;
        }
        memcpy(f->name, de->d_name, nl - 4);
        f->name[nl - 4] = '\0';
        snprintf(path, sizeof(path), "%s/%s", s->dir, de->d_name);
        src = hub_read_file(path, &len);
        if (src == NULL || len > HUB_POLICY_FILE_MAX) {
            snprintf(err, sizeof(err), "%s.lua: %s", f->name,
                     src == NULL ? "cannot be read" : "larger than 1 MiB");
            f->error = strdup(err);
            free(src);
            continue;
        }
        source_hash(src, len, f->hash);
        old = gen_entry(s->prev, f->name);
        /* unchanged: no policy and no error, gen_from_scan keeps the
         * previous generation's compiled version */
        if (old == NULL || old->policy == NULL || strcmp(old->policy->hash, f->hash) != 0) {
            f->policy = policy_compile(f->name, src, len, f->hash, &s->lim, err, sizeof(err));
            if (f->policy == NULL) {
                f->error = strdup(err);
            }
        }
        free(src);
    }
    closedir(dir);
    if (s->n > 1) {
        qsort(s->files, s->n, sizeof(*s->files), name_cmp);
    }
}

static void scan_free(struct scan *s) {
    for (size_t i = 0; i < s->n; i++) {
        hub_policy_unref(s->files[i].policy);
        free(s->files[i].error);
    }
    free(s->files);
    free(s->dir_error);
    free(s->dir);
    hub_policy_gen_release(s->prev);
    free(s);
}

int hub_policy_check_dir(const char *dir, const struct hub_policy_limits *lim,
                         void (*report)(void *arg, const char *file, const char *message),
                         void *arg) {
    struct scan *s = calloc(1, sizeof(*s));
    int ok = 0;

    if (s == NULL || (s->dir = strdup(dir)) == NULL) {
        free(s);
        report(arg, dir, "out of memory");
        return -1;
    }
    s->lim = *lim;
    scan_dir(s);
    if (s->dir_error != NULL) {
        report(arg, dir, s->dir_error);
        scan_free(s);
        return -1;
    }
    for (size_t i = 0; i < s->n; i++) {
        char file[HUB_POLICY_NAME_MAX + 8];
        snprintf(file, sizeof(file), "%s.lua", s->files[i].name);
        if (s->files[i].error != NULL) {
            report(arg, file, s->files[i].error);
        } else {
            ok++;
        }
    }
    scan_free(s);
    return ok;
}

/* ---------------------------------------------------------- generations -- */

struct hub_policy *hub_policy_gen_find(const struct hub_policy_gen *gen, const char *name) {
    const struct hub_policy_entry *e = gen_entry(gen, name);
    return e != NULL ? e->policy : NULL;
}

uint64_t hub_policy_gen_number(const struct hub_policy_gen *gen) {
    return gen->number;
}

static void gen_free(struct hub_policy_gen *g) {
    for (size_t i = 0; i < g->n; i++) {
        hub_policy_unref(g->e[i].policy);
        free(g->e[i].error);
    }
    free(g->e);
    free(g);
}

void hub_policy_gen_release(struct hub_policy_gen *gen) {
    if (gen != NULL && --gen->refs == 0) {
        gen_free(gen);
    }
}

/*
 * Builds the next generation from a finished scan: new versions where a
 * file compiled, the previous version (with the new error) where it did not,
 * nothing for files that are gone.  Loop thread (touches refcounts).
 */
static struct hub_policy_gen *gen_from_scan(struct scan *s, uint64_t number) {
    struct hub_policy_gen *g = calloc(1, sizeof(*g));
    int64_t now_ms = hub_unix_us() / 1000; /* a time of day, for GET /admin/policies */

    if (g == NULL || (s->n > 0 && (g->e = calloc(s->n, sizeof(*g->e))) == NULL)) {
        free(g);
        return NULL;
    }
    g->refs = 1;
    g->number = number;
    g->created_ms = now_ms;
    for (size_t i = 0; i < s->n; i++) {
        struct scan_file *f = &s->files[i];
        const struct hub_policy_entry *old = gen_entry(s->prev, f->name);
        struct hub_policy_entry *e = &g->e[g->n++];

        snprintf(e->name, sizeof(e->name), "%s", f->name);
        e->error = f->error;
        f->error = NULL;
        if (f->policy != NULL) {
            e->policy = f->policy;
            f->policy = NULL;
            e->loaded_gen = number;
            e->loaded_at_ms = now_ms;
        } else if (old != NULL && old->policy != NULL) {
            /* unchanged, or broken now: the previous version stays */
            e->policy = old->policy;
            hub_policy_ref(e->policy);
            e->loaded_gen = old->loaded_gen;
            e->loaded_at_ms = old->loaded_at_ms;
        }
    }
    return g;
}

/* -------------------------------------------------------------- registry -- */

/* Error counters survive reloads: one row per (policy, fn, status) seen. */
struct policy_stat {
    struct policy_stat *next;
    char name[HUB_POLICY_NAME_MAX + 1];
    uint64_t count[HUB_POLICY_FN__COUNT][HUB_POLICY_STATUS__COUNT];
};

struct reload_waiter {
    struct reload_waiter *next;
    void (*cb)(void *arg, const char *json, double seconds);
    void *arg;
};

struct hub_policies {
    uv_loop_t *loop;
    char *dir;
    struct hub_policy_limits lim;
    struct hub_policy_gen *current;
    uint64_t next_number;
    struct policy_stat *stats;
    uint64_t reloads[2]; /* ok, error */
    double last_reload_seconds;
    /* reload state: one scan on the threadpool at a time */
    uv_work_t work;
    struct scan *scan;
    int running;
    int again;                       /* requested while running: run once more */
    struct reload_waiter *waiting;   /* for the running reload */
    struct reload_waiter *next_wait; /* for the one after it */
    int freed;                       /* hub_policies_free called while running */
};

static struct scan *scan_new(struct hub_policies *ps) {
    struct scan *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->dir = strdup(ps->dir)) == NULL) {
        free(s);
        return NULL;
    }
    s->lim = ps->lim;
    s->prev = ps->current;
    if (s->prev != NULL) {
        s->prev->refs++;
    }
    s->started_ns = hub_now_ns();
    return s;
}

static void log_scan_errors(const struct hub_policy_gen *g, const char *dir_error) {
    if (dir_error != NULL) {
        hub_log(HUB_WARN, "policies not loaded", HUB_LS("error", dir_error));
    }
    for (size_t i = 0; i < g->n; i++) {
        if (g->e[i].error != NULL) {
            hub_log(HUB_ERROR,
                    g->e[i].policy != NULL ? "policy failed to load; its previous version stays"
                                           : "policy failed to load",
                    HUB_LS("policy", g->e[i].name), HUB_LS("error", g->e[i].error));
        }
    }
}

/* Publishes the scan as the next generation.  Loop thread. */
static void publish(struct hub_policies *ps, struct scan *s) {
    struct hub_policy_gen *g = gen_from_scan(s, ps->next_number);
    int failed = s->dir_error != NULL;
    size_t loaded = 0;

    ps->last_reload_seconds = (double)(hub_now_ns() - s->started_ns) / 1e9;
    if (g == NULL) {
        ps->reloads[1]++;
        hub_log(HUB_ERROR, "policy reload failed: out of memory");
        return;
    }
    ps->next_number++;
    for (size_t i = 0; i < g->n; i++) {
        failed |= g->e[i].error != NULL;
        loaded += g->e[i].policy != NULL;
    }
    log_scan_errors(g, s->dir_error);
    ps->reloads[failed ? 1 : 0]++;
    hub_policy_gen_release(ps->current);
    ps->current = g;
    hub_log(failed ? HUB_WARN : HUB_INFO, "policies loaded", HUB_LI("generation", g->number),
            HUB_LI("policies", (int64_t)loaded), HUB_LI("files", (int64_t)g->n),
            HUB_LI("duration_us", (int64_t)(ps->last_reload_seconds * 1e6)));
}

struct hub_policies *hub_policies_new(uv_loop_t *loop, const char *dir,
                                      const struct hub_policy_limits *lim) {
    struct hub_policies *ps = calloc(1, sizeof(*ps));
    struct scan *s;

    if (ps == NULL || (ps->dir = strdup(dir != NULL ? dir : "./policies")) == NULL) {
        free(ps);
        return NULL;
    }
    ps->loop = loop;
    ps->lim = *lim;
    ps->next_number = 1;
    ps->work.data = ps;
    s = scan_new(ps);
    if (s == NULL) {
        hub_policies_free(ps);
        return NULL;
    }
    scan_dir(s);
    publish(ps, s);
    scan_free(s);
    if (ps->current == NULL) {
        hub_policies_free(ps);
        return NULL;
    }
    return ps;
}

static void registry_free(struct hub_policies *ps) {
    hub_policy_gen_release(ps->current);
    while (ps->stats != NULL) {
        struct policy_stat *n = ps->stats->next;
        free(ps->stats);
        ps->stats = n;
    }
    for (struct reload_waiter *w = ps->waiting, *n; w != NULL; w = n) {
        n = w->next;
        free(w);
    }
    for (struct reload_waiter *w = ps->next_wait, *n; w != NULL; w = n) {
        n = w->next;
        free(w);
    }
    free(ps->dir);
    free(ps);
}

void hub_policies_free(struct hub_policies *ps) {
    if (ps == NULL) {
        return;
    }
    if (ps->running) {
        ps->freed = 1; /* reload_after frees it */
        return;
    }
    registry_free(ps);
}

struct hub_policy_gen *hub_policies_acquire(struct hub_policies *ps) {
    ps->current->refs++;
    return ps->current;
}

static void reload_work(uv_work_t *w) {
    struct hub_policies *ps = w->data;
    scan_dir(ps->scan);
}

static void reload_start(struct hub_policies *ps);

static void reload_after(uv_work_t *w, int status) {
    struct hub_policies *ps = w->data;
    struct reload_waiter *waiters = ps->waiting;
    char *json = NULL;

    (void)status;
    ps->running = 0;
    ps->waiting = NULL;
    if (ps->freed) {
        scan_free(ps->scan);
        ps->scan = NULL;
        while (waiters != NULL) {
            struct reload_waiter *n = waiters->next;
            free(waiters);
            waiters = n;
        }
        registry_free(ps);
        return;
    }
    publish(ps, ps->scan);
    scan_free(ps->scan);
    ps->scan = NULL;
    if (waiters != NULL) {
        json = hub_policies_json(ps);
    }
    while (waiters != NULL) {
        struct reload_waiter *n = waiters->next;
        waiters->cb(waiters->arg, json, ps->last_reload_seconds);
        free(waiters);
        waiters = n;
    }
    free(json);
    if (ps->again) {
        ps->again = 0;
        ps->waiting = ps->next_wait;
        ps->next_wait = NULL;
        reload_start(ps);
    }
}

static void reload_start(struct hub_policies *ps) {
    ps->scan = scan_new(ps);
    if (ps->scan == NULL || uv_queue_work(ps->loop, &ps->work, reload_work, reload_after) != 0) {
        hub_log(HUB_ERROR, "policy reload could not start");
        if (ps->scan != NULL) {
            scan_free(ps->scan);
            ps->scan = NULL;
        }
        ps->reloads[1]++;
        for (struct reload_waiter *w = ps->waiting, *n; w != NULL; w = n) {
            n = w->next;
            w->cb(w->arg, NULL, 0);
            free(w);
        }
        ps->waiting = NULL;
        return;
    }
    ps->running = 1;
}

void hub_policies_reload(struct hub_policies *ps,
                         void (*cb)(void *arg, const char *json, double seconds), void *arg) {
    struct reload_waiter *w = NULL;

    if (cb != NULL && (w = calloc(1, sizeof(*w))) != NULL) {
        w->cb = cb;
        w->arg = arg;
    }
    if (ps->running) {
        /* coalesce: everyone who asks meanwhile shares the next run */
        ps->again = 1;
        if (w != NULL) {
            w->next = ps->next_wait;
            ps->next_wait = w;
        }
        return;
    }
    if (w != NULL) {
        w->next = ps->waiting;
        ps->waiting = w;
    }
    reload_start(ps);
}

int hub_policies_usable(struct hub_policies *ps, const char *name, const char **why) {
    const struct hub_policy_entry *e = gen_entry(ps->current, name);
    if (e != NULL && e->policy != NULL) {
        return 1;
    }
    *why = e != NULL && e->error != NULL ? e->error : "unknown policy";
    return 0;
}

static json_t *ms_time(int64_t ms) {
    char buf[64];
    hub_rfc3339(ms * 1000, 3, buf, sizeof(buf));
    return json_string(buf);
}

char *hub_policies_json(struct hub_policies *ps) {
    const struct hub_policy_gen *g = ps->current;
    json_t *root = json_object(), *arr = json_array();
    char *text;

    for (size_t i = 0; i < g->n; i++) {
        const struct hub_policy_entry *e = &g->e[i];
        json_t *o = json_object(), *fns = json_array();
        json_object_set_new(o, "name", json_string(e->name));
        if (e->policy != NULL) {
            for (int f = 0; f < HUB_POLICY_FN__COUNT; f++) {
                if (hub_policy_has(e->policy, (enum hub_policy_fn)f)) {
                    json_array_append_new(fns,
                                          json_string(hub_policy_fn_str((enum hub_policy_fn)f)));
                }
            }
            json_object_set_new(o, "hash", json_string(e->policy->hash));
            json_object_set_new(o, "loaded_at", ms_time(e->loaded_at_ms));
            json_object_set_new(o, "generation", json_integer((json_int_t)e->loaded_gen));
            json_object_set_new(o, "memory_bytes", json_integer((json_int_t)e->policy->used));
        } else {
            json_object_set_new(o, "hash", json_null());
            json_object_set_new(o, "loaded_at", json_null());
            json_object_set_new(o, "generation", json_null());
        }
        json_object_set_new(o, "functions", fns);
        json_object_set_new(o, "last_error", e->error ? json_string(e->error) : json_null());
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "generation", json_integer((json_int_t)g->number));
    json_object_set_new(root, "loaded_at", ms_time(g->created_ms));
    json_object_set_new(root, "reload_seconds", json_real(ps->last_reload_seconds));
    json_object_set_new(root, "dir", json_string(ps->dir));
    json_object_set_new(root, "policies", arr);
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

void hub_policies_count_error(struct hub_policies *ps, const char *policy, enum hub_policy_fn fn,
                              enum hub_policy_status status) {
    struct policy_stat *s;

    if (ps == NULL || status == HUB_POLICY_OK || fn >= HUB_POLICY_FN__COUNT ||
        status >= HUB_POLICY_STATUS__COUNT) {
        return;
    }
    for (s = ps->stats; s != NULL && strcmp(s->name, policy) != 0; s = s->next) {
    }
    if (s == NULL) {
        /* names are valid policy names, so the label set stays bounded by
         * the files an operator ever installed */
        if (!hub_policy_name_valid(policy, strlen(policy)) || (s = calloc(1, sizeof(*s))) == NULL) {
            return;
        }
        snprintf(s->name, sizeof(s->name), "%s", policy);
        s->next = ps->stats;
        ps->stats = s;
    }
    s->count[fn][status]++;
}

void hub_policies_metrics_render(const struct hub_policies *ps, FILE *out) {
    fprintf(out, "# HELP streaming_hub_policy_errors_total Policy calls that failed or were "
                 "stopped, by policy, function and kind.\n"
                 "# TYPE streaming_hub_policy_errors_total counter\n");
    for (const struct policy_stat *s = ps ? ps->stats : NULL; s != NULL; s = s->next) {
        for (int f = 0; f < HUB_POLICY_FN__COUNT; f++) {
            for (int k = 1; k < HUB_POLICY_STATUS__COUNT; k++) {
                if (s->count[f][k] > 0) {
                    fprintf(out,
                            "streaming_hub_policy_errors_total{policy=\"%s\",function=\"%s\","
                            "kind=\"%s\"} %llu\n",
                            s->name, hub_policy_fn_str((enum hub_policy_fn)f),
                            hub_policy_status_str((enum hub_policy_status)k),
                            (unsigned long long)s->count[f][k]);
                }
            }
        }
    }
    fprintf(out,
            "# HELP streaming_hub_policy_reloads_total Policy generations built, by result "
            "(error: some file failed and kept its previous version).\n"
            "# TYPE streaming_hub_policy_reloads_total counter\n"
            "streaming_hub_policy_reloads_total{result=\"ok\"} %llu\n"
            "streaming_hub_policy_reloads_total{result=\"error\"} %llu\n"
            "# HELP streaming_hub_policy_generation The policy generation in use.\n"
            "# TYPE streaming_hub_policy_generation gauge\n"
            "streaming_hub_policy_generation %llu\n",
            (unsigned long long)(ps ? ps->reloads[0] : 0),
            (unsigned long long)(ps ? ps->reloads[1] : 0),
            (unsigned long long)(ps && ps->current ? ps->current->number : 0));
}
