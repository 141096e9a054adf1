/*
 * libFuzzer target for src/lpattern.c: the bounded pattern functions
 * against LuaJIT's own, and against hangs.
 *
 * Input framing (every byte string is a valid input):
 *   byte 0   bits 0-1: function (find, match, gsub, gmatch)
 *            bits 2-3: init / n: none, byte 1 as is, byte 1 negative, 2^31
 *            bit 4:    find's plain flag
 *            bits 5-6: gsub's replacement: a string, a table, a function, a number
 *            bit 7:    hammer mode (below)
 *   byte 1   init, or gsub's n
 *   byte 2   pattern length P; then P bytes of pattern
 *   (gsub with a string replacement) one length byte R, then R bytes
 *   the rest is the subject.
 *
 * Differential mode: the hub's function runs first with a step budget; when
 * it finishes within it, LuaJIT's runs with the same arguments (it then
 * finishes too: the two explore the same matches), and every result is
 * compared (types, values, error messages; gmatch step by step; gsub's
 * function replacement sees the same calls).  A difference aborts.
 *
 * Hammer mode: the subject is repeated to 16 KiB and only the hub's
 * function runs, under a small step budget: it must come back (result or
 * Lua error) without crashing, whatever the pattern; libFuzzer's -timeout
 * catches a budget that does not stop it.
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lpattern.h"

#define HAMMER_BYTES 16384

static const char HARNESS[] =
    "local ref, mine = ...\n"
    "local function pack(...) return {n = select('#', ...), ...} end\n"
    "local function same(a, b)\n"
    "  if a.n ~= b.n then return false end\n"
    "  for i = 1, a.n do\n"
    "    local x, y = a[i], b[i]\n"
    "    if type(x) ~= type(y) or (x ~= y and not (x ~= x and y ~= y)) then return false end\n"
    "  end\n"
    "  return true\n"
    "end\n"
    "local function show(r)\n"
    "  local t = {}\n"
    "  for i = 1, r.n do\n"
    "    local v = r[i]\n"
    "    t[i] = type(v) == 'string' and string.format('%q', v) or tostring(v)\n"
    "  end\n"
    "  return table.concat(t, ', ')\n"
    "end\n"
    "local calls\n"
    "local function repl_fn(...)\n"
    "  local r = pack(...)\n"
    "  for i = 1, r.n do calls.n = calls.n + 1; calls[calls.n] = r[i] end\n"
    "  local k = #calls % 4\n"
    "  if k == 0 then return nil elseif k == 1 then return false end\n"
    "  if k == 2 then return '<' .. tostring(r[1]) .. '>' end\n"
    "  return #calls\n"
    "end\n"
    "local repl_table = setmetatable({a = 'A', b = false, [1] = 'one', [2] = 2},\n"
    "                                {__index = function(_, k) return k == 'x' and {} end})\n"
    "local function run(lib, fn, s, p, a3, a4)\n"
    "  calls = {n = 0}\n"
    "  local out\n"
    "  if fn == 'gmatch' then\n"
    "    out = {n = 0}\n"
    "    local ok, e = pcall(function()\n"
    "      local it = lib.gmatch(s, p)\n"
    "      for _ = 1, 300 do\n"
    "        local r = pack(it())\n"
    "        if r[1] == nil then break end\n"
    "        for i = 1, r.n do out.n = out.n + 1; out[out.n] = r[i] end\n"
    "        out.n = out.n + 1; out[out.n] = '|'\n"
    "      end\n"
    "    end)\n"
    "    out.n = out.n + 1; out[out.n] = ok and 'end' or e\n"
    "  else\n"
    "    if a3 == 'TABLE' then a3 = repl_table elseif a3 == 'FUNCTION' then a3 = repl_fn end\n"
    "    out = pack(pcall(lib[fn], s, p, a3, a4))\n"
    "  end\n"
    "  for i = 1, calls.n do out.n = out.n + 1; out[out.n] = calls[i] end\n"
    "  return out\n"
    "end\n"
    "local function stopped(r)\n"
    "  for i = 1, r.n do\n"
    "    if type(r[i]) == 'string' and r[i]:find('deadline exceeded', 1, true) then\n"
    "      return true\n"
    "    end\n"
    "  end\n"
    "  return false\n"
    "end\n"
    "function differential(fn, s, p, a3, a4)\n"
    "  local b = run(mine, fn, s, p, a3, a4)\n"
    "  if stopped(b) then return end\n"
    "  local a = run(ref, fn, s, p, a3, a4)\n"
    "  if not same(a, b) then\n"
    "    error(fn .. '(' .. show(pack(s, p, a3, a4)) .. '): LuaJIT (' .. show(a)\n"
    "          .. ') but lpattern (' .. show(b) .. ')', 0)\n"
    "  end\n"
    "end\n"
    "function hammer(fn, s, p, a3, a4)\n"
    "  run(mine, fn, s, p, a3, a4)\n"
    "end\n";

struct step_budget {
    struct hub_lbudget b;
    long checks, limit;
};

static int step_expired(void *ud, int64_t need_ns) {
    struct step_budget *sb = ud;
    (void)need_ns;
    return ++sb->checks > sb->limit;
}

static struct step_budget budget = {.b = {.expired = step_expired, .ud = &budget}};
static lua_State *L;

/* At exit, before LeakSanitizer looks: what the state holds through
 * pointers in LuaJIT's own heap, which it does not scan (lua-cjson's
 * encode buffer), would look leaked. */
static void teardown(void) {
    lua_close(L);
    L = NULL;
}

static void setup(void) {
    L = luaL_newstate();
    if (L == NULL) {
        abort();
    }
    atexit(teardown);
    luaL_openlibs(L);
    if (luaL_loadbuffer(L, HARNESS, sizeof(HARNESS) - 1, "=harness") != 0) {
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
        abort();
    }
    lua_getglobal(L, "string");
    lua_newtable(L);
    hub_lpattern_register(L, -1, &budget.b);
    if (lua_pcall(L, 2, 0, 0) != 0) {
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const fns[] = {"find", "match", "gsub", "gmatch"};
    size_t plen, rlen = 0, pos = 3;
    int mode, fn, hammer, nargs = 2;
    const char *repl = NULL;

    if (L == NULL) {
        setup();
    }
    if (size < 3) {
        return 0;
    }
    mode = data[0];
    fn = mode & 3;
    hammer = (mode & 0x80) != 0;
    plen = data[2] < size - pos ? data[2] : size - pos;
    if (fn == 2 && ((mode >> 5) & 3) == 0 && pos + plen < size) {
        rlen = data[pos + plen];
        rlen = rlen < size - pos - plen - 1 ? rlen : size - pos - plen - 1;
        repl = (const char *)data + pos + plen + 1;
    }

    lua_settop(L, 0);
    lua_getglobal(L, hammer ? "hammer" : "differential");
    lua_pushstring(L, fns[fn]);
    {
        /* the subject, repeated in hammer mode */
        size_t start = pos + plen + (repl != NULL ? rlen + 1 : 0);
        size_t slen = start < size ? size - start : 0;
        if (hammer && slen > 0) {
            char *big = malloc(HAMMER_BYTES);
            if (big == NULL) {
                return 0;
            }
            for (size_t i = 0; i < HAMMER_BYTES; i++) {
                big[i] = (char)data[start + i % slen];
            }
            lua_pushlstring(L, big, HAMMER_BYTES);
            free(big);
        } else {
            lua_pushlstring(L, (const char *)data + start, slen);
        }
    }
    lua_pushlstring(L, (const char *)data + pos, plen);
    if (fn == 2) {
        /* the replacement, then n */
        switch ((mode >> 5) & 3) {
        case 0:
            lua_pushlstring(L, repl != NULL ? repl : "", rlen);
            break;
        case 1:
            lua_pushliteral(L, "TABLE");
            break;
        case 2:
            lua_pushliteral(L, "FUNCTION");
            break;
        default:
            lua_pushinteger(L, data[1]);
            break;
        }
        nargs++;
    }
    if (fn != 3) {
        /* init (find, match) or n (gsub) */
        switch ((mode >> 2) & 3) {
        case 0:
            lua_pushnil(L);
            break;
        case 1:
            lua_pushinteger(L, data[1]);
            break;
        case 2:
            lua_pushinteger(L, -(lua_Integer)data[1]);
            break;
        default:
            lua_pushnumber(L, 2147483648.0);
            break;
        }
        nargs++;
        if (fn == 0) {
            lua_pushboolean(L, (mode >> 4) & 1);
            nargs++;
        }
    }
    budget.checks = 0;
    budget.limit = hammer ? 4 : 16;
    if (lua_pcall(L, nargs + 1, 0, 0) != 0) {
        fprintf(stderr, "fuzz_lpattern: %s\n", lua_tostring(L, -1));
        abort();
    }
    /* keep the state small between inputs */
    lua_gc(L, LUA_GCSTEP, 0);
    return 0;
}
