/*
 * lbulk — bounded string.rep, table.concat and table.insert (see lbulk.h).
 */
#include "lbulk.h"

#include <lauxlib.h>

#define LB_PIECE (1 << 20) /* bytes copied between two step charges */

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
 * string.rep(s, n [, sep]): the whole result is reserved at once (so a
 * result over the memory cap fails before any work), one copy of s..sep is
 * written, and the rest doubles what is already there.
 */
static int lb_rep(lua_State *L) {
    size_t ls, lsep = 0, unit, total, done;
    const char *s = luaL_checklstring(L, 1, &ls);
    int32_t n;
    const char *sep;
    struct hub_lmeter m;
    struct hub_lbuf b;
    char *out;

    n = hub_lbudget_checkint(L, 2);
    sep = luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || (ls == 0 && lsep == 0)) {
        lua_pushliteral(L, "");
        return 1;
    }
    /* n < 2^31 and both lengths < 2^31: no overflow in 64 bits */
    unit = ls + lsep;
    total = unit * (size_t)n - lsep;
    hub_lmeter_init(&m, L, 1, "string.rep");
    hub_lbuf_init(L, &b);
    out = hub_lbuf_reserve(&b, total);
    memcpy(out, s, ls);
    memcpy(out + ls, sep, lsep < total - ls ? lsep : total - ls);
    for (done = unit < total ? unit : total; done < total;) {
        size_t n_copy = done < total - done ? done : total - done;
        lb_copy(&m, out + done, out, n_copy);
        done += n_copy;
    }
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
    lua_settop(L, 4);
    hub_lmeter_init(&m, L, 1, "table.concat");
    hub_lbuf_init(L, &b);
    for (int64_t k = i; k <= j; k++) {
        size_t len;
        const char *v;

        lua_rawgeti(L, 1, (int)k);
        if (!lua_isstring(L, -1)) {
            return luaL_error(L, "invalid value (%s) at index %d in table for 'concat'",
                              luaL_typename(L, -1), (int)k);
        }
        v = lua_tolstring(L, -1, &len);
        hub_lbuf_add(&b, v, len);
        if (k < j) {
            hub_lbuf_add(&b, sep, lsep);
        }
        lua_pop(L, 1);
        hub_lmeter_spend(&m, (int32_t)((len + lsep) / 64) + 1);
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

void hub_lbulk_register(lua_State *L, int st, int tt, const struct hub_lbudget *budget) {
    hub_lbudget_setfn(L, st, "rep", lb_rep, budget);
    hub_lbudget_setfn(L, tt, "concat", lb_concat, budget);
    hub_lbudget_setfn(L, tt, "insert", lb_insert, budget);
}
