/*
 * lbulk — bounded string.rep, table.concat, table.insert and table.sort
 * (see lbulk.h).
 */
#include "lbulk.h"

#include <lauxlib.h>

#define LB_PIECE (1 << 20) /* bytes copied between two step charges */
#define LB_SMALL 256       /* results built on the C stack, with no budget to ask */
#define LB_BATCH 32        /* table.concat's elements on the Lua stack at once */

/* Copies len bytes in pieces of LB_PIECE, charging the meter for each: the
 * deadline can stop a copy of tens of megabytes between two pieces. */
static void lb_copy(struct hub_lmeter *m, char *dst, const char *src, size_t len) {
    while (len > 0) {
        size_t n = len < LB_PIECE ? len : LB_PIECE;
        memcpy(dst, src, n);
        hub_lmeter_spend(m, (int32_t)(n / 64) + 1);
        dst += n;
        src += n;
        len -= n;
    }
}

/*
 * Writes total bytes of s, sep, s, sep, ... into out: one copy of s..sep,
 * then doubling what is already there (a few large copies rather than n
 * small ones), each piece charged to m.
 */
static void lb_rep_fill(struct hub_lmeter *m, char *out, size_t total, const char *s, size_t ls,
                        const char *sep, size_t lsep) {
    size_t done = ls + lsep < total ? ls + lsep : total;

    memcpy(out, s, ls < total ? ls : total);
    if (ls < total) {
        memcpy(out + ls, sep, done - ls);
    }
    while (done < total) {
        size_t n = done < total - done ? done : total - done;
        lb_copy(m, out + done, out, n);
        done += n;
    }
}

/*
 * string.rep(s, n [, sep]): a small result is built on the C stack; a
 * larger one is reserved whole in the state-owned buffer (so that a result
 * over the memory cap fails before any work) and filled in pieces.
 */
static int lb_rep(lua_State *L) {
    size_t ls, lsep = 0, total;
    const char *s = luaL_checklstring(L, 1, &ls);
    int32_t n = hub_lbudget_checkint(L, 2);
    const char *sep = luaL_optlstring(L, 3, "", &lsep);
    struct hub_lmeter m;
    struct hub_lbuf b;

    if (n <= 0 || (ls == 0 && lsep == 0)) {
        lua_pushliteral(L, "");
        return 1;
    }
    /* n < 2^31 and both lengths < 2^31: no overflow in 64 bits */
    total = (ls + lsep) * (size_t)n - lsep;
    if (total <= LB_SMALL) {
        /* the common ("-"):rep(40): no buffer, no budget */
        char small[LB_SMALL];
        size_t k = 0;
        if (ls == 1 && lsep == 0) {
            memset(small, s[0], total);
            k = total;
        }
        while (k < total) {
            /* byte loops: cheaper than calls to memcpy at these sizes */
            for (size_t i = 0; i < ls && k < total; i++) {
                small[k++] = s[i];
            }
            for (size_t i = 0; i < lsep && k < total; i++) {
                small[k++] = sep[i];
            }
        }
        lua_pushlstring(L, small, total);
        return 1;
    }
    hub_lmeter_init(&m, L, 1, "string.rep");
    hub_lbuf_init(L, &b);
    lb_rep_fill(&m, hub_lbuf_reserve(&b, total), total, s, ls, sep, lsep);
    b.n = total;
    hub_lbuf_push(&b);
    return 1;
}

/* table.concat(t [, sep [, i [, j]]]): the raw elements i..j (j defaults
 * to #t, ignoring __len), strings or numbers (numbers as tostring writes
 * them), joined by sep; the first element of another type (nil included)
 * is an error naming its index. */
static int lb_concat(lua_State *L) {
    size_t lsep = 0;
    const char *sep;
    int32_t i, j;
    struct hub_lmeter m;
    struct hub_lbuf b;

    luaL_checktype(L, 1, LUA_TTABLE);
    sep = luaL_optlstring(L, 2, "", &lsep);
    i = hub_lbudget_optint(L, 3, 1);
    j = lua_isnoneornil(L, 4) ? (int32_t)lua_objlen(L, 1) : hub_lbudget_optint(L, 4, 0);
    hub_lmeter_init(&m, L, 1, "table.concat");
    hub_lbuf_init(L, &b);
    luaL_checkstack(L, LB_BATCH, "table.concat");
    for (int64_t k = i; k <= j;) {
        /* elements are fetched a batch at a time: popping them one by one
         * costs more than copying them */
        int base = lua_gettop(L), n = j - k + 1 < LB_BATCH ? (int)(j - k + 1) : LB_BATCH;

        for (int x = 0; x < n; x++) {
            lua_rawgeti(L, 1, (int)(k + x));
        }
        for (int x = 1; x <= n; x++, k++) {
            size_t len;
            const char *v = lua_tolstring(L, base + x, &len); /* NULL unless a string or number */
            if (v == NULL) {
                return luaL_error(L, "invalid value (%s) at index %d in table for 'concat'",
                                  luaL_typename(L, base + x), (int)k);
            }
            hub_lbuf_add(&b, v, len);
            if (k < j) {
                hub_lbuf_add(&b, sep, lsep);
            }
            hub_lmeter_spend(&m, (int32_t)((len + lsep) / 64) + 1);
        }
        lua_settop(L, base);
    }
    hub_lbuf_push(&b);
    return 1;
}

/*
 * table.insert(t, [pos,] value): with pos, the raw elements pos..#t move
 * up by one first, one step each (pos is not checked against the bounds,
 * as in LuaJIT: a pos far below 1 moves elements into non-positive keys
 * until the budget stops it).  Any other number of arguments is an error.
 */
static int lb_insert(lua_State *L) {
    int nargs = lua_gettop(L);
    int64_t e;
    struct hub_lmeter m;

    luaL_checktype(L, 1, LUA_TTABLE);
    e = (int64_t)lua_objlen(L, 1) + 1;
    if (nargs != 2) {
        int32_t pos;
        if (nargs != 3) {
            return luaL_error(L, "wrong number of arguments to 'insert'");
        }
        pos = hub_lbudget_checkint(L, 2);
        hub_lmeter_init(&m, L, 1, "table.insert");
        for (; e > pos; e--) {
            lua_rawgeti(L, 1, (int)(e - 1));
            lua_rawseti(L, 1, (int)e);
            hub_lmeter_spend(&m, 1);
        }
        e = pos;
    }
    lua_pushvalue(L, nargs);
    lua_rawseti(L, 1, (int)e);
    return 0;
}

/* 1 when t[i] sorts before t[j]: the comparator at index 2 when there is
 * one (a step, and its own instructions for the hook), else `<` (a step, or
 * one per 64 bytes of the shorter of two strings: it compares them). */
static int lb_less(lua_State *L, struct hub_lmeter *m, int comp, int i, int j) {
    int r;

    lua_rawgeti(L, 1, i);
    lua_rawgeti(L, 1, j);
    if (comp) {
        hub_lmeter_spend(m, 1);
        lua_pushvalue(L, 2);
        lua_insert(L, -3);
        lua_call(L, 2, 1);
        r = lua_toboolean(L, -1);
        lua_pop(L, 1);
        return r;
    }
    if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING) {
        size_t la = lua_objlen(L, -2), lb = lua_objlen(L, -1);
        hub_lmeter_spend(m, (int32_t)((la < lb ? la : lb) / 64) + 1);
    } else {
        hub_lmeter_spend(m, 1);
    }
    r = lua_lessthan(L, -2, -1); /* may run __lt, or raise as `<` does */
    lua_pop(L, 2);
    return r;
}

static void lb_swap(lua_State *L, int i, int j) {
    lua_rawgeti(L, 1, i);
    lua_rawgeti(L, 1, j);
    lua_rawseti(L, 1, i);
    lua_rawseti(L, 1, j);
}

/* Moves t[root] down the heap t[1..end]. */
static void lb_sift(lua_State *L, struct hub_lmeter *m, int comp, int root, int end) {
    for (int child; (child = 2 * root) <= end && child > 0; root = child) {
        if (child < end && lb_less(L, m, comp, child, child + 1)) {
            child++;
        }
        if (!lb_less(L, m, comp, root, child)) {
            return;
        }
        lb_swap(L, root, child);
    }
}

/*
 * table.sort(t [, comp]): t[1..#t] in place, by comp or `<`.  LuaJIT's is a
 * quicksort in C: quadratic on an adversary's order (event data a policy
 * sorts) and never stopped by the hook, which counts the call as one
 * instruction.  This one is a heapsort (n log n comparisons whatever the
 * order), each comparison a step.  As LuaJIT's, it is not stable; unlike
 * it, an inconsistent comparator gives some order rather than "invalid
 * order function for sorting".
 */
static int lb_sort(lua_State *L) {
    int n, comp;
    struct hub_lmeter m;

    luaL_checktype(L, 1, LUA_TTABLE);
    n = (int)lua_objlen(L, 1);
    comp = !lua_isnoneornil(L, 2);
    hub_lmeter_init(&m, L, 1, "table.sort");
    if (comp) {
        luaL_checktype(L, 2, LUA_TFUNCTION);
    }
    /* a comparison may call back into Lua (the comparator, or an __lt
     * metamethod without one), which may sort again */
    hub_lbudget_nest(m.budget, L, "table.sort");
    lua_settop(L, 2);
    for (int start = n / 2; start >= 1; start--) {
        lb_sift(L, &m, comp, start, n);
    }
    for (int end = n; end > 1; end--) {
        lb_swap(L, 1, end);
        lb_sift(L, &m, comp, 1, end - 1);
    }
    return 0;
}

void hub_lbulk_register(lua_State *L, int st, int tt, const struct hub_lbudget *budget) {
    hub_lbudget_setfn(L, st, "rep", lb_rep, budget);
    hub_lbudget_setfn(L, tt, "concat", lb_concat, budget);
    hub_lbudget_setfn(L, tt, "insert", lb_insert, budget);
    hub_lbudget_setfn(L, tt, "sort", lb_sort, budget);
}
