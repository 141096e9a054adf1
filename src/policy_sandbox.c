/*
 * policy_sandbox — a policy's Lua states: the limits they run under, the
 * sandbox they run in, the file's top level; and the compiled version that
 * owns them (see policy.h, policy_int.h).
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
 *
 * The deadline is in the calling thread's CPU time, so that a healthy call
 * on a thread the kernel preempted (busy cores) is not condemned for the
 * time it did not run; a wall-clock backstop of POLICY_WALL_BACKSTOP
 * deadlines still ends a call that gets its CPU too slowly, once it has
 * used a fraction of its deadline (a short call is never stopped for one
 * long preemption).  Reading a
 * thread's CPU clock is a system call (~0.5 us, against ~20 ns for the
 * monotonic clock): it is read once when a call starts, and afterwards
 * policy_left_ns() reads the monotonic clock first (a call cannot have used
 * more CPU than the wall time since it started) and asks the CPU clock
 * only when that wall time nears the deadline.  policy_left_ns() is the one
 * place that reads the deadline.
 */
#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backoff.h"
#include "lbulk.h"
#include "ljson.h"
#include "log.h"
#include "lpattern.h"
#include "policy_int.h"
#include "util.h"

#define POLICY_HOOK_COUNT 1000 /* VM instructions between deadline checks */
#define POLICY_LOG_BURST 20    /* hub.log lines a policy may write at once ... */
#define POLICY_LOG_PER_S 10    /* ... and per second after that */
#define POLICY_LOG_MSG_MAX 1024
/* Growth from which the allocator asks whether the block can still be
 * filled before the deadline (HUB_LBUDGET_NS_PER_BYTE); smaller blocks are
 * cheap next to the hook's period. */
#define POLICY_BIG_ALLOC (1 << 20)
/* The wall-clock backstop, in deadlines: a call that has run this long on
 * the clock, and used at least 1/POLICY_WALL_BACKSTOP of its deadline in
 * CPU time, is stopped. */
#define POLICY_WALL_BACKSTOP 4

extern const char hub_lua_sandbox[];
extern const size_t hub_lua_sandbox_len;

/* ------------------------------------------------------------ deadline -- */

/*
 * The thread's CPU clock is a system call (the vDSO reads only the wall
 * clocks) and most calls end before their first check: it is read at that
 * check (policy_left_ns), not here.  What ran before it, at most
 * POLICY_HOOK_COUNT instructions or HUB_LBUDGET_STEPS library steps
 * (microseconds), is left out of the CPU time; a wait for the core before
 * it is not counted either.
 */
void policy_deadline_arm(struct policy_state *s) {
    s->start_ns = hub_now_ns();
    s->checked = 0;
    /* the caller's frame is above this one: the call runs below it */
    s->budget.stack_top = __builtin_frame_address(0);
}

void policy_deadline_disarm(struct policy_state *s) {
    s->start_ns = 0;
    s->budget.stack_top = NULL;
}

int64_t policy_cpu_spent_ns(const struct policy_state *s) {
    if (!s->checked) {
        return 0;
    }
    return (int64_t)(hub_thread_cpu_ns() - s->start_cpu_ns);
}

/*
 * Nanoseconds the running call has left, exact enough to compare with
 * need_ns: when the wall time since the call started leaves more than
 * need_ns of the deadline, that (a lower bound of the CPU time left) is the
 * answer; otherwise the smaller of the CPU time left and the backstop's
 * wall time left.  INT64_MAX outside a call.  The only reader of the
 * deadline: the hook, the allocator and the library budget all ask here.
 *
 * The CPU clock is read again only when the wall time leaves too little:
 * calls far from their deadline never pay for a second system call.
 */
static int64_t policy_left_ns(struct policy_state *s, int64_t need_ns) {
    uint64_t now;
    int64_t wall, cpu, backstop_left;

    if (s->start_ns == 0) {
        return INT64_MAX;
    }
    now = hub_now_ns();
    wall = (int64_t)(now - s->start_ns);
    if (!s->checked) {
        s->start_cpu_ns = hub_thread_cpu_ns();
        s->checked = 1;
    }
    if (s->timeout_ns - wall > need_ns) {
        return s->timeout_ns - wall;
    }
    cpu = (int64_t)(hub_thread_cpu_ns() - s->start_cpu_ns);
    /* A call that has used little CPU is not stopped on the clock: on
     * saturated cores one preemption can outlast the backstop, and a short
     * healthy call caught by it would be condemned (and count toward
     * tripping its policy) for the machine's load. */
    if (cpu < s->timeout_ns / POLICY_WALL_BACKSTOP) {
        return s->timeout_ns - cpu;
    }
    backstop_left = s->timeout_ns * POLICY_WALL_BACKSTOP - wall;
    return s->timeout_ns - cpu < backstop_left ? s->timeout_ns - cpu : backstop_left;
}

/* The library functions' budget (lbudget.h): refuses work of need_ns when
 * less is left, and condemns the call so that its error is a timeout no
 * pcall can catch. */
static int policy_budget_expired(void *ud, int64_t need_ns) {
    struct policy_state *s = ud;
    if (policy_left_ns(s, need_ns) > need_ns) {
        return 0;
    }
    s->condemned = POLICY_CONDEMNED_TIMEOUT;
    return 1;
}

/* ---------------------------------------------------------- allocator -- */

/* Bytes of freed blocks a state keeps (struct policy_state: blocks); none
 * under AddressSanitizer, which must see every block freed. */
#if defined(__SANITIZE_ADDRESS__)
#define POLICY_BLOCK_CACHE_BYTES 0
#else
#define POLICY_BLOCK_CACHE_BYTES (128 << 10)
#endif

/* The class of a block of n bytes (1 <= n <= POLICY_BLOCK_MAX). */
static unsigned block_class(size_t n) {
    unsigned p;
    if (n <= 256) {
        return (unsigned)((n + 15) >> 4) - 1;
    }
    p = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1)); /* 2^p < n <= 2^(p+1) */
    return 16 + (p - 8) * 4 + (unsigned)((n - 1 - ((size_t)1 << p)) >> (p - 2));
}

/* The bytes a block of class c holds. */
static size_t block_size(unsigned c) {
    unsigned p;
    if (c < 16) {
        return (size_t)(c + 1) << 4;
    }
    p = 8 + (c - 16) / 4;
    return ((size_t)1 << p) + (size_t)((c - 16) % 4 + 1) * ((size_t)1 << (p - 2));
}

/* A block of n bytes: a cached one of its class when there is one. */
static void *block_get(struct policy_state *s, size_t n) {
    unsigned c;
    void *b;
    if (n > POLICY_BLOCK_MAX) {
        return malloc(n);
    }
    c = block_class(n);
    b = s->blocks[c];
    if (b == NULL) {
        return malloc(block_size(c));
    }
    memcpy(&s->blocks[c], b, sizeof(void *));
    s->cached -= block_size(c);
    return b;
}

/* Gives back block b of n bytes: kept while the cache has room. */
static void block_put(struct policy_state *s, void *b, size_t n) {
    unsigned c = n <= POLICY_BLOCK_MAX ? block_class(n) : 0;
    if (n > POLICY_BLOCK_MAX || s->cached + block_size(c) > POLICY_BLOCK_CACHE_BYTES) {
        free(b);
        return;
    }
    memcpy(b, &s->blocks[c], sizeof(void *));
    s->blocks[c] = b;
    s->cached += block_size(c);
}

/* Frees every cached block (the state is going). */
static void blocks_release(struct policy_state *s) {
    for (unsigned c = 0; c < POLICY_BLOCK_CLASSES; c++) {
        while (s->blocks[c] != NULL) {
            void *b = s->blocks[c];
            memcpy(&s->blocks[c], b, sizeof(void *));
            free(b);
        }
    }
    s->cached = 0;
}

/* ptr (osize bytes) resized to nsize > 0: in place within its class, by
 * realloc() between large blocks, else moved. */
static void *block_resize(struct policy_state *s, void *ptr, size_t osize, size_t nsize) {
    void *np;
    if (ptr == NULL) {
        return block_get(s, nsize);
    }
    if (osize > POLICY_BLOCK_MAX && nsize > POLICY_BLOCK_MAX) {
        return realloc(ptr, nsize);
    }
    if (osize <= POLICY_BLOCK_MAX && nsize <= POLICY_BLOCK_MAX &&
        block_class(osize) == block_class(nsize)) {
        return ptr;
    }
    np = block_get(s, nsize);
    if (np != NULL) {
        memcpy(np, ptr, osize < nsize ? osize : nsize);
        block_put(s, ptr, osize);
    }
    return np;
}

/*
 * The accounting allocator: the state is its userdata.  During a call,
 * growth past the cap condemns the call as out of memory; and while policy
 * code runs, a large block that could not be filled before the deadline
 * (at HUB_LBUDGET_NS_PER_BYTE) condemns it as out of time: LuaJIT's own
 * string functions fill what they allocate in one loop the hook cannot
 * stop.  The hub's own copies (ev.body) are not the policy's doing and
 * are not refused.
 */
static void *policy_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    struct policy_state *s = ud;
    void *np;

    if (nsize == 0) {
        if (ptr != NULL) {
            block_put(s, ptr, osize);
            s->used -= osize;
        }
        return NULL;
    }
    if (ptr == NULL) {
        osize = 0;
    }
    if (nsize > osize && s->used + (nsize - osize) > s->cap) {
        /* condemns a running call: its pcall cannot catch this */
        if (s->start_ns != 0) {
            s->condemned = POLICY_CONDEMNED_NOMEM;
        }
        return NULL;
    }
    if (nsize >= osize + POLICY_BIG_ALLOC && s->policy_code &&
        policy_budget_expired(s, (int64_t)nsize * HUB_LBUDGET_NS_PER_BYTE)) {
        return NULL;
    }
    np = block_resize(s, ptr, osize, nsize);
    if (np != NULL) {
        s->used = s->used - osize + nsize;
    }
    return np;
}

static struct policy_state *state_of(lua_State *L) {
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* The count hook: past the deadline, every check raises again, so loops
 * around pcall cannot outlive it. */
static void policy_hook(lua_State *L, lua_Debug *ar) {
    struct policy_state *s = state_of(L);
    (void)ar;
    if (policy_budget_expired(s, 0)) {
        luaL_error(L, "policy ran past its deadline (%d ms)", (int)(s->timeout_ns / 1000000));
    }
}

/* ------------------------------------------------------------- sandbox -- */

/* pcall/xpcall for policies: as the real ones, except that a condemned
 * call's error passes through. */
static int sandbox_pcall(lua_State *L) {
    struct policy_state *s = state_of(L);
    int status;

    luaL_checkany(L, 1);
    hub_lbudget_nest(&s->budget, L, "pcall");
    status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (s->condemned != POLICY_ALIVE) {
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
    if (state_of(L)->condemned != POLICY_ALIVE) {
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* xpcall(f, handler): the handler runs with the error, as in Lua 5.1. */
static int sandbox_xpcall(lua_State *L) {
    struct policy_state *s = state_of(L);
    int status;

    luaL_checktype(L, 2, LUA_TFUNCTION);
    hub_lbudget_nest(&s->budget, L, "xpcall");
    lua_settop(L, 2);
    lua_pushcclosure(L, xpcall_handler, 1); /* f, wrapped handler */
    lua_insert(L, 1);                       /* wrapped handler, f */
    status = lua_pcall(L, 0, LUA_MULTRET, 1);
    if (s->condemned != POLICY_ALIVE) {
        return lua_error(L);
    }
    lua_pushboolean(L, status == 0);
    lua_replace(L, 1); /* replaces the handler */
    return lua_gettop(L);
}

/* hub.log(level, msg): rate-limited per policy version (all its states
 * together), capped, tagged with the policy. */
static int sandbox_log(lua_State *L) {
    struct hub_policy *p = state_of(L)->p;
    const char *level = luaL_checkstring(L, 1);
    size_t len = 0;
    const char *msg = luaL_checklstring(L, 2, &len);
    enum hub_log_level lv = HUB_INFO;
    uint64_t now = hub_now_ns(), dropped = 0;
    char buf[POLICY_LOG_MSG_MAX + 1];
    int allowed;

    if (strcmp(level, "debug") == 0) {
        lv = HUB_DEBUG;
    } else if (strcmp(level, "warn") == 0) {
        lv = HUB_WARN;
    } else if (strcmp(level, "error") == 0) {
        lv = HUB_ERROR;
    } else if (strcmp(level, "info") != 0) {
        return luaL_argerror(L, 1, "level must be debug, info, warn or error");
    }
    uv_mutex_lock(&p->mu);
    p->log_tokens += (double)(now - p->log_last_ns) / 1e9 * POLICY_LOG_PER_S;
    if (p->log_tokens > POLICY_LOG_BURST) {
        p->log_tokens = POLICY_LOG_BURST;
    }
    p->log_last_ns = now;
    allowed = p->log_tokens >= 1.0;
    if (allowed) {
        p->log_tokens -= 1.0;
        dropped = p->log_dropped;
        p->log_dropped = 0;
    } else {
        p->log_dropped++;
    }
    uv_mutex_unlock(&p->mu);
    if (!allowed || !hub_log_enabled(lv)) {
        return 0;
    }
    len = len > POLICY_LOG_MSG_MAX ? POLICY_LOG_MSG_MAX : len;
    memcpy(buf, msg, len);
    buf[len] = '\0';
    hub_log(lv, buf, HUB_LS("policy", p->name), HUB_LI("dropped", (int64_t)dropped));
    return 0;
}

/* ev's __index: ev.data decodes ev.body on first access (nil when it is not
 * JSON) and keeps it. */
static int ev_index(lua_State *L) {
    struct policy_state *s = state_of(L);
    const char *key = lua_tostring(L, 2);

    if (key == NULL || strcmp(key, "data") != 0) {
        return 0;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_decode);
    lua_getfield(L, 1, "body");
    if (lua_pcall(L, 1, 1, 0) != 0) {
        if (s->condemned != POLICY_ALIVE) {
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
    struct policy_state *s = lua_touserdata(L, 1);
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
    hub_lpattern_register(L, -2, &s->budget);
    hub_lbulk_register(L, -2, -1, &s->budget);
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
    hub_ljson_push(L, &s->budget);
    lua_getfield(L, -1, "decode");
    s->ref_decode = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "encode");
    s->ref_encode = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_call(L, 3, 1); /* env */

    lua_createtable(L, 0, 2);
    lua_pushcfunction(L, ev_index);
    lua_setfield(L, -2, "__index");
    lua_pushliteral(L, "event");
    lua_setfield(L, -2, "__metatable");
    s->ref_ev_meta = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushboolean(L, 0);
    s->ref_ev_last = luaL_ref(L, LUA_REGISTRYINDEX);

    /* The chunk's own globals are the sandbox: the real ones are left
     * unreachable (no getfenv, no debug). */
    lua_pushvalue(L, -1);
    lua_replace(L, LUA_GLOBALSINDEX);
    return 1;
}

/* ------------------------------------------------------- the top level -- */

static int64_t policy_value_ms(lua_State *L, int idx) {
    int64_t ms = -1;
    if (lua_type(L, idx) == LUA_TNUMBER) {
        double sec = lua_tonumber(L, idx);
        ms =
            sec > 0 && sec <= HUB_BACKOFF_STEP_MAX_MS / 1000.0 ? (int64_t)(sec * 1000.0 + 0.5) : -1;
        ms = ms == 0 ? 1 : ms;
    } else if (lua_type(L, idx) == LUA_TSTRING) {
        if (hub_duration_parse(lua_tostring(L, idx), &ms) != 0) {
            ms = -1;
        }
    }
    return ms;
}

struct load_ctx {
    struct policy_state *s;
    struct policy_defs *defs;
    const char *src;
    size_t len;
    char chunkname[HUB_POLICY_NAME_MAX + 8];
    char bad[256]; /* validation error, when not a Lua error */
};

/* Runs the chunk and validates the table it returns into c->defs.  Under
 * lua_cpcall, with the sandbox environment at index 2. */
static int load_chunk(lua_State *L) {
    struct load_ctx *c = lua_touserdata(L, 1);
    struct policy_state *s = c->s;
    struct policy_defs *defs = c->defs;
    static const char *const fields[HUB_POLICY_FN__COUNT] = {"match", "retry", "shape"};

    if (luaL_loadbufferx(L, c->src, c->len, c->chunkname, "t") != 0) {
        return lua_error(L);
    }
    s->policy_code = 1;
    lua_call(L, 0, 1);
    s->policy_code = 0;
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
                defs->schedule[k - 1] = policy_value_ms(L, -1);
                lua_pop(L, 1);
                if (defs->schedule[k - 1] <= 0 || defs->schedule[k - 1] > HUB_BACKOFF_STEP_MAX_MS) {
                    snprintf(c->bad, sizeof(c->bad),
                             "retry[%zu]: a duration in (0, 10h] (\"30s\", \"5m\" or seconds)", k);
                    return 0;
                }
            }
            defs->n_schedule = n;
            defs->has_fn[i] = 1;
            lua_pop(L, 1);
            continue;
        }
        if (!lua_isfunction(L, -1)) {
            snprintf(c->bad, sizeof(c->bad), "%s must be a function%s, not %s", fields[i],
                     i == HUB_POLICY_RETRY ? " or a table of durations" : "", luaL_typename(L, -1));
            return 0;
        }
        defs->has_fn[i] = 1;
        s->ref_fn[i] = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    return 0;
}

void policy_error_text(lua_State *L, const char *name, const char *prefix, char *err,
                       size_t errlen) {
    const char *m = lua_tostring(L, -1);
    size_t nl = strlen(name);

    if (err == NULL || errlen == 0) {
        return;
    }
    if (m == NULL) {
        m = "(error object is not a string)";
    }
    /* "<name>.lua:<line>: ..." is what error() at level 1 and syntax errors
     * give */
    if (strncmp(m, name, nl) == 0 && strncmp(m + nl, ".lua:", 5) == 0) {
        snprintf(err, errlen, "%s%s", prefix, m);
    } else {
        snprintf(err, errlen, "%s%s.lua: %s", prefix, name, m);
    }
}

/* ---------------------------------------------------------------- states -- */

void policy_state_publish(struct policy_state *s) {
    if (s->used >= s->published) {
        atomic_fetch_add_explicit(&s->p->memory, s->used - s->published, memory_order_relaxed);
    } else {
        atomic_fetch_sub_explicit(&s->p->memory, s->published - s->used, memory_order_relaxed);
    }
    s->published = s->used;
}

void policy_state_free(struct policy_state *s) {
    if (s == NULL) {
        return;
    }
    if (s->L != NULL) {
        lua_close(s->L);
    }
    blocks_release(s);
    s->used = 0;
    policy_state_publish(s);
    uv_mutex_lock(&s->p->mu);
    s->p->n_states--;
    uv_mutex_unlock(&s->p->mu);
    free(s);
}

struct policy_state *policy_state_new(struct hub_policy *p, struct policy_defs *defs, char *err,
                                      size_t errlen) {
    struct policy_state *s = calloc(1, sizeof(*s));
    struct load_ctx c = {.s = s, .defs = defs, .src = p->src, .len = p->len};
    const char *name = p->name;
    int rc;

    memset(defs, 0, sizeof(*defs));
    if (s == NULL) {
        snprintf(err, errlen, "%s.lua: out of memory", name);
        return NULL;
    }
    s->p = p;
    s->cap = p->lim.memory_bytes;
    s->timeout_ns = p->lim.timeout_ms * 1000000;
    s->budget.expired = policy_budget_expired;
    s->budget.ud = s;
    for (int i = 0; i < HUB_POLICY_FN__COUNT; i++) {
        s->ref_fn[i] = LUA_NOREF;
    }
    uv_mutex_lock(&p->mu);
    p->n_states++; /* policy_state_free takes it back, on every path */
    uv_mutex_unlock(&p->mu);
    snprintf(c.chunkname, sizeof(c.chunkname), "@%s.lua", name);
    s->L = lua_newstate(policy_alloc, s);
    if (s->L == NULL) {
        snprintf(err, errlen, "%s.lua: cannot create a Lua state (memory cap too small?)", name);
        policy_state_free(s);
        return NULL;
    }
    /* count hooks never fire in compiled traces: interpreter only */
    luaJIT_setmode(s->L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    lua_sethook(s->L, policy_hook, LUA_MASKCOUNT, POLICY_HOOK_COUNT);
    if (lua_cpcall(s->L, build_sandbox, s) != 0) {
        policy_error_text(s->L, name, "", err, errlen);
        policy_state_free(s);
        return NULL;
    }
    /* the chunk's top level runs under the same limits as any call */
    policy_deadline_arm(s);
    rc = lua_cpcall(s->L, load_chunk, &c);
    policy_deadline_disarm(s);
    s->policy_code = 0;
    if (rc != 0 || c.bad[0] != '\0') {
        if (s->condemned == POLICY_CONDEMNED_TIMEOUT) {
            snprintf(err, errlen, "%s.lua: the top level ran past the %lld ms deadline", name,
                     (long long)p->lim.timeout_ms);
        } else if (s->condemned == POLICY_CONDEMNED_NOMEM || rc == LUA_ERRMEM) {
            snprintf(err, errlen, "%s.lua: the top level hit the %zu-byte memory cap", name,
                     s->cap);
        } else if (rc != 0) {
            policy_error_text(s->L, name, "", err, errlen);
        } else {
            snprintf(err, errlen, "%s.lua: %s", name, c.bad);
        }
        policy_state_free(s);
        return NULL;
    }
    lua_settop(s->L, 0);
    lua_gc(s->L, LUA_GCCOLLECT, 0);
    policy_state_publish(s);
    return s;
}

/* ------------------------------------------------------------- versions -- */

void policy_source_hash(const char *src, size_t len, char out[65]) {
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(src, len, md, &mdlen, EVP_sha256(), NULL);
    hub_hex(md, 32, out);
}

void policy_destroy(struct hub_policy *p) {
    struct policy_pool *pool = p->pool;

    /* the last reference is gone, so no call holds a state: all are idle */
    while (p->idle != NULL) {
        struct policy_state *s = p->idle;
        p->idle = s->next;
        policy_state_free(s);
    }
    uv_mutex_destroy(&p->mu);
    free(p->src);
    for (int i = 0; p->trips_of != NULL && i < POLICY_TRIP_SLOTS; i++) {
        free(p->trips_of[i].fail_ms);
    }
    free(p->trips_of);
    free(p->trips_none.fail_ms);
    free(p->last_call_error);
    free(p);
    if (pool != NULL) {
        policy_pool_unref(pool);
    }
}

struct hub_policy *policy_compile(const char *name, const char *src, size_t len, const char *hash,
                                  const struct hub_policy_limits *lim, char *err, size_t errlen) {
    struct hub_policy *p = calloc(1, sizeof(*p));
    struct policy_state *s;

    if (p == NULL || (p->src = malloc(len ? len : 1)) == NULL) {
        snprintf(err, errlen, "%s.lua: out of memory", name);
        free(p);
        return NULL;
    }
    if (uv_mutex_init(&p->mu) != 0) {
        snprintf(err, errlen, "%s.lua: cannot make a mutex", name);
        free(p->src);
        free(p);
        return NULL;
    }
    atomic_init(&p->refs, 1);
    atomic_init(&p->memory, 0);
    atomic_init(&p->all_until_ms, 0);
    for (int i = 0; i < POLICY_TRIP_SLOTS; i++) {
        atomic_init(&p->trip_tags[i].owner, 0);
        atomic_init(&p->trip_tags[i].until_ms, 0);
    }
    memcpy(p->src, src, len);
    p->len = len;
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->hash, sizeof(p->hash), "%s", hash);
    p->lim = *lim;
    p->log_tokens = POLICY_LOG_BURST;
    p->log_last_ns = hub_now_ns();
    /* the first state validates the file and waits, idle, for the first
     * call; later ones are built from the copy of the source */
    s = policy_state_new(p, &p->defs, err, errlen);
    if (s == NULL) {
        policy_destroy(p);
        return NULL;
    }
    p->idle = s;
    return p;
}

struct hub_policy *hub_policy_compile(const char *name, const char *src, size_t len,
                                      const struct hub_policy_limits *lim, char *err,
                                      size_t errlen) {
    char hash[65];
    policy_source_hash(src, len, hash);
    return policy_compile(name, src, len, hash, lim, err, errlen);
}

void hub_policy_ref(struct hub_policy *p) {
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}

void hub_policy_unref(struct hub_policy *p) {
    if (p == NULL || atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    /* closing states can take a while (a state that holds a large table):
     * a policy thread does it, never the loop */
    if (p->pool != NULL && policy_pool_bury(p->pool, p)) {
        return;
    }
    policy_destroy(p);
}

const char *hub_policy_name(const struct hub_policy *p) {
    return p->name;
}

const char *hub_policy_hash(const struct hub_policy *p) {
    return p->hash;
}

int hub_policy_has(const struct hub_policy *p, enum hub_policy_fn fn) {
    return fn < HUB_POLICY_FN__COUNT && p->defs.has_fn[fn];
}

size_t hub_policy_memory(const struct hub_policy *p) {
    return atomic_load_explicit(&((struct hub_policy *)p)->memory, memory_order_relaxed);
}

size_t hub_policy_retry_schedule(const struct hub_policy *p, const int64_t **steps) {
    if (p->defs.n_schedule > 0) {
        *steps = p->defs.schedule;
    }
    return p->defs.n_schedule;
}
