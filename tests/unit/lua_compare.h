/*
 * lua_compare.h — the differential harness of the tests of the bounded Lua
 * library functions (test_lpattern, test_lbulk, test_ljson): one plain
 * Lua state holding a reference implementation (LuaJIT's own library, or
 * lua-cjson) as `ref` and the hub's as `mine`, and Lua helpers that call
 * both with the same arguments and fail on the first difference: values
 * compared by type and contents (tables deeply, NaN equal to NaN, strings
 * byte for byte), error messages included.
 *
 *   compare(label, fn, args...)       ref[fn](args...) against mine[fn](args...)
 *   compare(label, 'gmatch', s, p)    every step of the two iterations
 *   compare(label, 'gsubf', s, p, ret [, n])
 *                                     gsub with a function: its calls and results
 *   mine_finishes(fn, args...)        false when the budget stopped mine
 *
 * Included by one test file each (static functions only); cmocka.h first.
 */
#ifndef HUB_TEST_LUA_COMPARE_H
#define HUB_TEST_LUA_COMPARE_H

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "lbudget.h"

/* A budget that expires after `limit` checks (each HUB_LBUDGET_STEPS
 * steps); counts the checks. */
struct step_budget {
    struct hub_lbudget b;
    long checks, limit;
};

static int step_expired(void *ud, int64_t need_ns) {
    struct step_budget *sb = ud;
    (void)need_ns;
    return ++sb->checks > sb->limit;
}

static const char COMPARE_LUA[] =
    "local ref, mine = ...\n"
    "local show\n"
    "function show(v)\n"
    "  if type(v) == 'string' then return string.format('%q', v) end\n"
    "  if type(v) == 'table' then\n"
    "    local t = {}\n"
    "    for k, x in pairs(v) do t[#t + 1] = show(k) .. '=' .. show(x) end\n"
    "    table.sort(t)\n"
    "    return '{' .. table.concat(t, ', ') .. '}'\n"
    "  end\n"
    "  return type(v) .. ':' .. tostring(v)\n"
    "end\n"
    "local function pack(...) return {n = select('#', ...), ...} end\n"
    "-- values: tables by contents, NaN equal to NaN\n"
    "-- (false, and where they differ, when they do)\n"
    "local function deep(a, b, at)\n"
    "  if type(a) ~= type(b) then return false, at end\n"
    "  if type(a) ~= 'table' then return a == b or (a ~= a and b ~= b), at end\n"
    "  for k, v in pairs(a) do\n"
    "    local ok, where = deep(v, rawget(b, k), at .. '[' .. show(k) .. ']')\n"
    "    if not ok then return false, where end\n"
    "  end\n"
    "  for k in pairs(b) do\n"
    "    if rawget(a, k) == nil then return false, at .. '[' .. show(k) .. ']' end\n"
    "  end\n"
    "  return true\n"
    "end\n"
    "local function same(a, b)\n"
    "  if a.n ~= b.n then return false, 'the number of results' end\n"
    "  for i = 1, a.n do\n"
    "    local ok, where = deep(a[i], b[i], 'result ' .. i)\n"
    "    if not ok then return false, where end\n"
    "  end\n"
    "  return true\n"
    "end\n"
    "local function text(r)\n"
    "  local t = {}\n"
    "  for i = 1, r.n do t[#t + 1] = show(r[i]) end\n"
    "  return '(' .. table.concat(t, ', ') .. ')'\n"
    "end\n"
    "-- gmatch: every value of every step, then whether it ended or failed\n"
    "local function iterate(lib, s, p)\n"
    "  local out = {n = 0}\n"
    "  local ok, e = pcall(function()\n"
    "    local it = lib.gmatch(s, p)\n"
    "    for _ = 1, 1000 do\n"
    "      local r = pack(it())\n"
    "      if r[1] == nil then break end\n"
    "      for i = 1, r.n do out.n = out.n + 1; out[out.n] = r[i] end\n"
    "      out.n = out.n + 1; out[out.n] = '|'\n"
    "    end\n"
    "  end)\n"
    "  out.n = out.n + 1; out[out.n] = ok and 'end' or e\n"
    "  return out\n"
    "end\n"
    "-- gsub with a function: the calls it received, then the result\n"
    "local function gsub_calls(lib, s, p, ret, n)\n"
    "  local out = {n = 0}\n"
    "  local function f(...)\n"
    "    local r = pack(...)\n"
    "    for i = 1, r.n do out.n = out.n + 1; out[out.n] = r[i] end\n"
    "    out.n = out.n + 1; out[out.n] = '|'\n"
    "    return ret(...)\n"
    "  end\n"
    "  local r = pack(pcall(lib.gsub, s, p, f, n))\n"
    "  for i = 1, r.n do out.n = out.n + 1; out[out.n] = r[i] end\n"
    "  return out\n"
    "end\n"
    "-- compare(label, fn, args...): fn is 'find', 'match', 'gsub' or 'gmatch'\n"
    "function compare(label, fn, ...)\n"
    "  local a, b\n"
    "  if fn == 'gmatch' then\n"
    "    a, b = iterate(ref, ...), iterate(mine, ...)\n"
    "  elseif fn == 'gsubf' then\n"
    "    a, b = gsub_calls(ref, ...), gsub_calls(mine, ...)\n"
    "  else\n"
    "    a, b = pack(pcall(ref[fn], ...)), pack(pcall(mine[fn], ...))\n"
    "  end\n"
    "  local ok, where = same(a, b)\n"
    "  if not ok then\n"
    "    local args = pack(...)\n"
    "    error(label .. ': ' .. fn .. text(args) .. ': differs at ' .. where .. ': reference '\n"
    "          .. text(a) .. ' but hub ' .. text(b), 0)\n"
    "  end\n"
    "end\n"
    "-- mine alone: false when the budget stopped it\n"
    "function mine_finishes(fn, ...)\n"
    "  local ok, e\n"
    "  if fn == 'gmatch' then\n"
    "    e = iterate(mine, ...)\n"
    "    e = e[e.n]\n"
    "  else\n"
    "    ok, e = pcall(mine[fn], ...)\n"
    "  end\n"
    "  return not (type(e) == 'string' and e:find('deadline exceeded', 1, true))\n"
    "end\n";

/*
 * A state with the standard libraries, the value push_ref leaves as `ref`,
 * the one push_mine leaves (given the budget, NULL: unbounded) as `mine`
 * (both also globals), and the helpers above as globals.
 */
static lua_State *compare_state(void (*push_ref)(lua_State *L),
                                void (*push_mine)(lua_State *L, const struct hub_lbudget *b),
                                const struct hub_lbudget *budget) {
    lua_State *L = luaL_newstate();
    assert_non_null(L);
    luaL_openlibs(L);
    if (luaL_loadbuffer(L, COMPARE_LUA, sizeof(COMPARE_LUA) - 1, "=compare") != 0) {
        fail_msg("compare: %s", lua_tostring(L, -1));
    }
    push_ref(L);
    lua_pushvalue(L, -1);
    lua_setglobal(L, "ref");
    push_mine(L, budget);
    lua_pushvalue(L, -1);
    lua_setglobal(L, "mine");
    if (lua_pcall(L, 2, 0, 0) != 0) {
        fail_msg("compare: %s", lua_tostring(L, -1));
    }
    return L;
}

/* Runs a chunk (of compare(...) calls); fails with its first error. */
static void run(lua_State *L, const char *name, const char *chunk) {
    if (luaL_loadbuffer(L, chunk, strlen(chunk), name) != 0 || lua_pcall(L, 0, 0, 0) != 0) {
        fail_msg("%s", lua_tostring(L, -1));
    }
}

/*
 * Runs each chunk (which calls `mine`) with a budget that allows
 * sb->limit checks: each must fail with "deadline exceeded" and the
 * prefix `what` ("string.", "json.") in its message.
 */
static void expect_stopped(lua_State *L, struct step_budget *sb, const char *const *chunks,
                           size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        const char *e;
        sb->checks = 0;
        if (luaL_loadstring(L, chunks[i]) != 0) {
            fail_msg("%s", lua_tostring(L, -1));
        }
        if (lua_pcall(L, 0, 0, 0) == 0) {
            fail_msg("%s was not stopped", chunks[i]);
        }
        e = lua_tostring(L, -1);
        if (e == NULL || strstr(e, "deadline exceeded") == NULL || strstr(e, what) == NULL) {
            fail_msg("%s: %s", chunks[i], e ? e : "(no message)");
        }
        assert_int_equal(sb->checks, sb->limit + 1);
        lua_settop(L, 0);
    }
}

static double compare_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Runs the chunk bench(lib, n) with lib = ref and lib = mine, alternately
 * twice (the second round counts), and returns the CPU time of each in
 * t[0] (ref) and t[1] (mine), in ms.  The chunk returns a number, which
 * must be the same for both.
 */
static void compare_speed(lua_State *L, const char *bench, int n, double t[2]) {
    double result[2];
    for (int round = 0; round < 2; round++) {
        for (int which = 0; which < 2; which++) {
            double t0;
            if (luaL_loadbuffer(L, bench, strlen(bench), "=bench") != 0) {
                fail_msg("%s", lua_tostring(L, -1));
            }
            lua_getglobal(L, which == 0 ? "ref" : "mine");
            lua_pushinteger(L, n);
            t0 = compare_cpu_ms();
            if (lua_pcall(L, 2, 1, 0) != 0) {
                fail_msg("%s", lua_tostring(L, -1));
            }
            t[which] = compare_cpu_ms() - t0;
            result[which] = lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
    }
    if (result[0] != result[1]) {
        fail_msg("the benchmark's results differ: %g and %g", result[0], result[1]);
    }
}

#endif
