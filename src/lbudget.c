/*
 * lbudget — step meter and state-owned buffer for the bounded Lua library
 * functions (see lbudget.h).
 */
#include "lbudget.h"

#include <lauxlib.h>
#include <stdint.h>

#define LBUF_MT "hub.lbuf"
#define LBUF_MIN_HEAP 4096

void hub_lmeter_init(struct hub_lmeter *m, lua_State *L, int upvalue, const char *what) {
    m->budget = lua_touserdata(L, lua_upvalueindex(upvalue));
    m->L = L;
    m->what = what;
    m->left = HUB_LBUDGET_STEPS;
}

void hub_lmeter_check(struct hub_lmeter *m) {
    m->left = HUB_LBUDGET_STEPS;
    if (m->budget != NULL && m->budget->expired(m->budget->ud, 0)) {
        luaL_error(m->L, "%s: deadline exceeded", m->what);
    }
}

void hub_lmeter_need(struct hub_lmeter *m, size_t bytes) {
    int64_t ns = bytes > (size_t)INT64_MAX / HUB_LBUDGET_NS_PER_BYTE
                     ? INT64_MAX
                     : (int64_t)bytes * HUB_LBUDGET_NS_PER_BYTE;
    if (m->budget != NULL && m->budget->expired(m->budget->ud, ns)) {
        luaL_error(m->L, "%s: deadline exceeded", m->what);
    }
}

void hub_lbudget_nest(const struct hub_lbudget *budget, lua_State *L, const char *what) {
    /* frame addresses, not a local's: a sanitizer may keep locals apart */
    const char *here = __builtin_frame_address(0);

    if (budget != NULL && budget->stack_top != NULL &&
        (intptr_t)budget->stack_top - (intptr_t)here > HUB_LBUDGET_CSTACK_MAX) {
        luaL_error(L, "%s: calls nested too deep", what);
    }
}

/* ------------------------------------------------------------- buffer -- */

/* The userdata that owns a buffer's heap block: the block is the state's
 * (its allocator, its cap), and freed by whoever lets go of it first, the
 * function when it finishes or the collector when an error unwound past
 * it. */
struct hub_lbuf_box {
    char *p; /* NULL once released */
    size_t cap;
    lua_Alloc alloc;
    void *ud;
};

/* __gc of a box: an error unwound past the function that owned it. */
static int lbuf_gc(lua_State *L) {
    struct hub_lbuf_box *box = lua_touserdata(L, 1);
    if (box != NULL && box->p != NULL) {
        box->alloc(box->ud, box->p, box->cap, 0);
        box->p = NULL;
        box->cap = 0;
    }
    return 0;
}

void hub_lbuf_init(lua_State *L, struct hub_lbuf *b) {
    lua_pushnil(L);
    b->slot = lua_gettop(L);
    b->L = L;
    b->box = NULL;
    b->p = b->inline_;
    b->n = 0;
    b->cap = sizeof(b->inline_);
}

/* Creates the box in the reserved slot (the first time a buffer outgrows
 * its inline storage); its metatable is made once per state. */
static struct hub_lbuf_box *lbuf_box(struct hub_lbuf *b) {
    lua_State *L = b->L;
    struct hub_lbuf_box *box = lua_newuserdata(L, sizeof(*box));

    box->p = NULL;
    box->cap = 0;
    box->alloc = lua_getallocf(L, &box->ud);
    if (luaL_newmetatable(L, LBUF_MT)) {
        lua_pushcfunction(L, lbuf_gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    lua_replace(L, b->slot);
    return box;
}

/* Grows the block to at least twice its size (4 KiB at first), moving the
 * inline contents over the first time. */
char *hub_lbuf_reserve(struct hub_lbuf *b, size_t more) {
    size_t need = b->n + more, cap;
    char *np;

    if (need < b->n) {
        luaL_error(b->L, "not enough memory");
    }
    if (need <= b->cap) {
        return b->p + b->n;
    }
    cap = b->cap < LBUF_MIN_HEAP / 2 ? LBUF_MIN_HEAP : b->cap * 2;
    if (cap < need || cap < b->cap) {
        cap = need;
    }
    if (b->box == NULL) {
        b->box = lbuf_box(b);
    }
    /* the state's allocator: counted against its cap, and refused when the
     * block could not be filled in the time left (policy_alloc) */
    np = b->box->alloc(b->box->ud, b->box->p, b->box->cap, cap);
    if (np == NULL) {
        luaL_error(b->L, "not enough memory");
    }
    if (b->box->p == NULL) {
        memcpy(np, b->inline_, b->n);
    }
    b->box->p = np;
    b->box->cap = cap;
    b->p = np;
    b->cap = cap;
    return b->p + b->n;
}

void hub_lbuf_push(struct hub_lbuf *b) {
    lua_pushlstring(b->L, b->p, b->n);
    if (b->box != NULL && b->box->p != NULL) {
        b->box->alloc(b->box->ud, b->box->p, b->box->cap, 0);
        b->box->p = NULL;
        b->box->cap = 0;
    }
    b->p = b->inline_;
    b->n = 0;
    b->cap = sizeof(b->inline_);
}

/* ------------------------------------------------------ registration -- */

void hub_lbudget_setfn(lua_State *L, int t, const char *name, lua_CFunction fn,
                       const struct hub_lbudget *budget) {
    t = t < 0 && t > LUA_REGISTRYINDEX ? lua_gettop(L) + t + 1 : t;
    lua_pushlightuserdata(L, (void *)budget);
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, t, name);
}

int32_t hub_lbudget_optint(lua_State *L, int i, int32_t def) {
    return lua_isnoneornil(L, i) ? def : hub_lbudget_checkint(L, i);
}

int32_t hub_lbudget_checkint(lua_State *L, int i) {
    double d = luaL_checknumber(L, i);

    /* x86's truncating conversion answers INT32_MIN out of range, and that
     * is what LuaJIT's library sees (string.rep("x", 2^32 + 3) is "") */
    return d > -2147483649.0 && d < 2147483648.0 ? (int32_t)d : INT32_MIN;
}
