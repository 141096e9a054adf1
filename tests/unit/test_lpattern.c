/*
 * Unit tests of src/lpattern.c: the bounded pattern functions give what
 * LuaJIT's own give, case by case.  Every case runs through both LuaJIT's
 * string.find/match/gmatch/gsub and this module's, in one plain Lua state,
 * and the results are compared value by value (types, numbers, strings
 * byte for byte, and error messages).  Then the same over random patterns
 * and subjects from a fixed seed, the budget (a step budget stops the
 * call), and the speed of typical policy patterns against LuaJIT's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#include "lpattern.h"
#include "lua_compare.h"

static void push_ref(lua_State *L) {
    lua_getglobal(L, "string");
}

static void push_mine(lua_State *L, const struct hub_lbudget *b) {
    lua_newtable(L);
    hub_lpattern_register(L, -1, b);
}

/* LuaJIT's string library as `ref`, this module's functions as `mine`. */
static lua_State *new_state(struct step_budget *sb) {
    return compare_state(push_ref, push_mine, sb != NULL ? &sb->b : NULL);
}

/* ------------------------------------------------------------- cases -- */

static void test_find_and_match(void **state) {
    (void)state;
    lua_State *L = new_state(NULL);
    run(L, "=find",
        "local cases = {\n"
        "  {'hello world', 'o w'}, {'hello world', 'o', 6}, {'hello', 'l+'},\n"
        "  {'hello', ''}, {'', ''}, {'', 'a*'}, {'', 'a'}, {'abc', '', 10}, {'abc', '', 4},\n"
        "  {'abc', 'b', -1}, {'abc', 'b', -2}, {'abc', 'b', -10}, {'abc', 'a', 0},\n"
        "  {'abc', 'c', 2.9}, {'abc', 'c', '2'}, {'abc', 'a', 2^32 + 3}, {'abc', 'b', 0/0},\n"
        "  {'abc', 'b', -2^32 + 2}, {'abc', 'c', 2^31}, {'abc', 'a', -2^31},\n"
        "  {'a.b', '.', 1, true}, {'a.b', '.', 1, 0}, {'a+b', '+', 1, nil},\n"
        "  {'a+b', 'a+', 1, false}, {'abcabc', 'bc', 3, true}, {'abc', '', 10, true},\n"
        "  {'a)', 'a)'}, {'x\\0%a', '\\0%a'}, {'x\\0ab', '\\0%a'}, {'a\\0b', '\\0b'},\n"
        "  {12345, 3}, {1.5, '.', 1, true}, {'1.5', 1.5},\n"
        "  {'THE (quick) fox', '%f[%a]%a+'}, {'abc', '%f[%z]'}, {'abc', '%f[a]'},\n"
        "  {'\\255a', '%f[%a]'}, {'abc', '^'}, {'abc', '$'}, {'', '^$'}, {'abc', '^b', 2},\n"
        "  {'a$b', '$b'}, {'abc', '(b)()'}, {'hello world', '(o)(r)'},\n"
        "  {'aaab', 'a-b'}, {'aaab', 'a*b'}, {'aaab', 'a+b'}, {'aaab', 'a?b'},\n"
        "  {'aaab', 'a?a?a?b'}, {'ab', 'ab?'}, {'xyz', 'y*'}, {'xyz', 'x-'},\n"
        "  {'key = value', '(%w+)%s*=%s*(%w+)'}, {'2024-03-01', '(%d+)-(%d+)-(%d+)'},\n"
        "  {'x(a(b)c)y', '%b()'}, {'((a)', '%b()'}, {\"x'a'b\", \"%b''\"}, {'(a)x(b)', '%b()x'},\n"
        "  {'{{{}}}}', '%b{}'}, {'}{', '%b{}'}, {'abab', '(ab)%1'}, {'abab', '()%1'},\n"
        "  {'abac', '(a)(.)%1%2'}, {'abab', '(a)(b)%1%2'}, {'aa', '(a*)%1'},\n"
        "  {'<a><b>', '<(.-)>'}, {'<a><b>', '<(.*)>'}, {'ab', '(a?)(b?)'}, {'aaa', '(a)*'},\n"
        "  {'*a', '*a'}, {'+a', '+a'}, {'a^b', 'a^b'}, {'a$b', 'a$b'}, {'ab', 'b$'},\n"
        "  {'-', '[a-]'}, {'x-z', '[a-]+'}, {'b-', '[%a-]+'}, {'a]', '[]a]+'}, {']', '[]]'},\n"
        "  {']', '[^]]'}, {'a1_', '[%w_]+'}, {'a1_ ', '[^%s]+'}, {'a-%', '[a-%%]+'},\n"
        "  {'-', '[%a-z]'}, {'a-', '[^-]+'}, {'\\200\\201', '[\\128-\\255]+'}, {'a b', '[%S]+'},\n"
        "  {'b', '[c-a]'}, {'ab12', '[%d-z]+'}, {'x\\0ab', '[%z]'}, {'x\\0ab', '%z%a'},\n"
        "  {'\\0', '.'}, {'a%b', '%%'}, {'a.b', '%.'}, {'a]b', '%]'}, {'aqb', '%q'},\n"
        "  {'xab', 'a\\0%a'}, {'x\\0ab', '\\0%a'}, {'abc', '[b]', 1, true},\n"
        "  {'a', '%'}, {'a', '[a'}, {'a', '[%'}, {'a', '[a%]'}, {'ab', '['}, {'ab', '[^'},\n"
        "  {'ab', '[^]'}, {'a', '%b'}, {'a', '%ba'}, {'a', '%b\\0\\0'}, {'a', '%fa'},\n"
        "  {'a', '%f'}, {'a', '%f[a'}, {'a', '(a'}, {'a', 'a)'}, {'a', '%1'}, {'a', '(%1)'},\n"
        "  {'a', '(a)%0'}, {'abab', '(ab'}, {'abab', '(()'}, {'', 'a['}, {'x', 'a['},\n"
        "  {'a', 'a['}, {'a', ('()'):rep(32)}, {'a', ('()'):rep(33)},\n"
        "  {('a'):rep(300), ('a?'):rep(300)}, {('a'):rep(300), ('(a)'):rep(30)},\n"
        "  {('a'):rep(300), ('a?'):rep(197)}, {('a'):rep(300), ('a?'):rep(198)},\n"
        "  {('a'):rep(300), ('a?'):rep(199)}, {('a'):rep(300), ('a?'):rep(200)},\n"
        "  {('a'):rep(300), ('a-'):rep(199)}, {('a'):rep(300), ('a-'):rep(200)},\n"
        "  {('a'):rep(50), ('(a)'):rep(99)}, {('a'):rep(50), ('(a*)'):rep(31) .. 'a'},\n"
        "  {('ab'):rep(40), '((((((((((b))))))))))'}, {('a'):rep(30), ('(a?)'):rep(33)},\n"
        "  {'a', nil}, {nil, 'a'}, {{}, 'a'}, {'a', {}}, {'abc', 'a', 'x'}, {'abc', 'a', {}},\n"
        "}\n"
        "for i, c in ipairs(cases) do\n"
        "  local n = table.maxn(c)\n"
        "  compare('find ' .. i, 'find', unpack(c, 1, n))\n"
        "  compare('match ' .. i, 'match', unpack(c, 1, n >= 4 and 3 or n))\n"
        "end\n");
    lua_close(L);
}

static void test_classes_exhaustive(void **state) {
    (void)state;
    lua_State *L = new_state(NULL);
    /* every byte against every class letter, its complement, inside and
     * outside a set, and as a frontier */
    run(L, "=classes",
        "local all = {}\n"
        "for c = 0, 255 do all[#all + 1] = string.char(c) end\n"
        "local s = table.concat(all)\n"
        "for c = 0, 255 do\n"
        "  local ch = string.char(c)\n"
        "  if ch ~= '\\0' then\n"
        "    compare('escape ' .. c, 'gsub', s, '%' .. ch, '')\n"
        "    compare('set escape ' .. c, 'gsub', s, '[%' .. ch .. ']', '')\n"
        "    compare('neg set escape ' .. c, 'gsub', s, '[^%' .. ch .. ']', '')\n"
        "    compare('literal ' .. c, 'find', s, ch)\n"
        "    compare('frontier ' .. c, 'gsub', s, '%f[%' .. ch .. ']', '<')\n"
        "  end\n"
        "end\n"
        "for _, r in ipairs {'a-z', 'A-Z', '0-9', '\\1-\\127', '\\128-\\255', 'z-a', '%a-%d',\n"
        "                    '-a', 'a-', '%--/', ']-a', '^-', '%%-%]'} do\n"
        "  compare('range ' .. r, 'gsub', s, '[' .. r .. ']', '.')\n"
        "  compare('neg range ' .. r, 'gsub', s, '[^' .. r .. ']', '.')\n"
        "end\n");
    lua_close(L);
}

static void test_gmatch(void **state) {
    (void)state;
    lua_State *L = new_state(NULL);
    run(L, "=gmatch",
        "local cases = {\n"
        "  {'hello world from Lua', '%a+'}, {'a=1, b=2', '(%w+)=(%w+)'}, {'abc', 'x*'},\n"
        "  {'abc', '()'}, {'ab', '()(.)'}, {'^a^b', '^.'}, {'abab', '^ab'}, {123, '%d'},\n"
        "  {'', ''}, {'', 'a'}, {'aaa', 'a*'}, {'aaa', 'a-'}, {'a,b,,c', '([^,]*)'},\n"
        "  {'one two  three', '%S+'}, {'x(a)(b)y', '%b()'}, {'THE (quick) fox', '%f[%a]%a+'},\n"
        "  {'a', '('}, {'a', '%'}, {'a', '[a'}, {'a', '%f'}, {'a', nil}, {nil, 'a'},\n"
        "  {('ab'):rep(100), 'a(b)'}, {('x'):rep(300), 'x'}, {('ab '):rep(200), '%a+'},\n"
        "}\n"
        "for i, c in ipairs(cases) do compare('gmatch ' .. i, 'gmatch', c[1], c[2]) end\n");
    lua_close(L);
}

static void test_gsub(void **state) {
    (void)state;
    lua_State *L = new_state(NULL);
    run(L, "=gsub",
        "local cases = {\n"
        "  {'abc', 'b', '%x'}, {'abc', 'b', '%'}, {'abc', 'b', 'x%\\0y'}, {'abc', 'b', 'x\\0y'},\n"
        "  {'abc', 'b', '%2'}, {'abc', 'b', '<%1>'}, {'abc', 'b', '<%0>'}, {'abc', '(b)', '%3'},\n"
        "  {'abc', '(b)', '[%0%1]'}, {'abc', '(b)', '%9'}, {'abc', '()b', '%1'},\n"
        "  {'abc', 'b', true}, {'abc', 'b'}, {'aaa', 'a', 'b', 2}, {'aaa', 'a', 'b', -1},\n"
        "  {'aaa', 'a', 'b', 1.7}, {'aaa', 'a', 'b', 2^32 + 1}, {'aaa', 'a', 'b', 0/0},\n"
        "  {'aaaa', 'a', 'b', 1e10}, {'aaaa', 'a', 'b', 2^31}, {'aaaa', 'a', 'b', 2^31 + 2},\n"
        "  {'aaaa', 'a', 'b', -0.5}, {'aaaa', 'a', 'b', 2.5}, {'aaaa', 'a', 'b', 1e300},\n"
        "  {'aa', 'a', 'b', nil}, {'aa', 'a', 'b', '1'}, {'aa', 'a', 'b', 'x'},\n"
        "  {'aa', 'a', true, 'x'}, {'abc', '', '-'}, {'aaa', '^a', '-'}, {'abc', '^', 'x'},\n"
        "  {'abc', '$', 'x'}, {'abc', '.-$', 'x'}, {'abc', 'x*', '-'}, {'', '', 'x'},\n"
        "  {'', 'a*', 'x'}, {1234, '2', 'x'}, {'abc', 'b', 5}, {'abc', 'b', 1.5},\n"
        "  {'abab', '(a', 'x'}, {'abab', '(a', '%1'}, {'hello world', 'o', '0', 1},\n"
        "  {'a.b.c', '%.', '/'}, {'  trim  ', '^%s*(.-)%s*$', '%1'}, {'x', 'x', '%%'},\n"
        "  {'abc', '%w', '%0%0'}, {'hello', '', '.'}, {'a\\0b\\0c', '%z', '0'},\n"
        "  {'abc', '%w', {a = 'A', b = false, c = 1}}, {'abc', '%w', {a = {}}},\n"
        "  {'abc', '()b', {[2] = 'X'}}, {'k=v', '(%w)=(%w)', {k = 'K'}}, {'abc', 'b', {}},\n"
        "  {'abc', '%w', setmetatable({}, {__index = function(_, k) return k:upper() end})},\n"
        "  {('ab'):rep(300), 'b', 'cd'}, {('x'):rep(1000), 'x', ''}, {'x', '(', 'y'},\n"
        "  {'x', '%', 'y'}, {'x', '[x', 'y'}, {'', '[x', 'y'}, {'abc', '(b)()', '%2%1'},\n"
        "}\n"
        "for i, c in ipairs(cases) do compare('gsub ' .. i, 'gsub', unpack(c, 1, 4)) end\n"
        "local rets = {\n"
        "  function() end, function() return false end, function() return 1.5 end,\n"
        "  function() return true end, function(a, b) return (b or '') .. (a or '') end,\n"
        "  function(...) return select('#', ...) end, function() return {} end,\n"
        "  function(c) return c:upper() end,\n"
        "}\n"
        "for i, ret in ipairs(rets) do\n"
        "  compare('gsub function ' .. i, 'gsubf', 'k=v, x=y', '(%w)=(%w)', ret)\n"
        "  compare('gsub function pos ' .. i, 'gsubf', 'abc', '()b()', ret)\n"
        "  compare('gsub function plain ' .. i, 'gsubf', 'abc', '%w', ret, 2)\n"
        "end\n");
    lua_close(L);
}

/* Errors raised from a Lua function carry its position, the same in both. */
static void test_error_positions_and_methods(void **state) {
    (void)state;
    lua_State *L = new_state(NULL);
    run(L, "=positions",
        "local function call(lib, fn, ...)\n"
        "  local r = {lib[fn](...)}\n"
        "  return unpack(r)\n"
        "end\n"
        "local function errs(lib, fn, ...)\n"
        "  local ok, e = pcall(call, lib, fn, ...)\n"
        "  return e\n"
        "end\n"
        "for _, c in ipairs { {'find', 'a', '('}, {'match', 'a', '[a'}, {'gsub', 'a', 'a', '%2'},\n"
        "                      {'find', nil, 'a'}, {'gsub', 'a', 'a', true} } do\n"
        "  local a, b = errs(string, unpack(c)), errs(mine, unpack(c))\n"
        "  assert(a == b, 'LuaJIT says ' .. a .. ', lpattern ' .. b)\n"
        "end\n"
        "-- as methods, through the string metatable\n"
        "local mt = getmetatable('')\n"
        "local saved = mt.__index\n"
        "local function methods(lib)\n"
        "  mt.__index = lib\n"
        "  local ok1, e1 = pcall(function() return ('abc'):find('(') end)\n"
        "  local ok2, e2 = pcall(function() return ('abc'):gsub('b', true) end)\n"
        "  local v = ('a,b'):gsub(',', ';')\n"
        "  mt.__index = saved\n"
        "  return e1 .. '|' .. e2 .. '|' .. v\n"
        "end\n"
        "local a = methods(string)\n"
        "local b = methods(setmetatable({find = mine.find, gsub = mine.gsub}, {__index = "
        "string}))\n"
        "assert(a == b, 'LuaJIT says ' .. a .. ', lpattern ' .. b)\n");
    lua_close(L);
}

/* ---------------------------------------------------- random patterns -- */

/* xorshift64: fixed seed, so a failure names a case that reproduces. */
static uint64_t rnd_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

static void random_text(char *out, size_t n, const char *alphabet) {
    size_t k = strlen(alphabet);
    for (size_t i = 0; i < n; i++) {
        out[i] = alphabet[rnd() % k];
    }
    out[n] = '\0';
}

/* Random patterns over an alphabet rich in pattern syntax, against random
 * subjects; mine runs first with a step budget, and the pair is compared
 * only when mine finished within it (LuaJIT then finishes too). */
static void test_random_differential(void **state) {
    (void)state;
    struct step_budget sb = {.b = {.expired = step_expired}};
    lua_State *L;
    int compared = 0, skipped = 0;
    static const char *const fns[] = {"find", "match", "gsub", "gmatch"};

    sb.b.ud = &sb;
    L = new_state(&sb);
    for (int i = 0; i < 30000; i++) {
        char pat[16], subj[40];
        const char *fn = fns[rnd() % 4];
        random_text(pat, 1 + rnd() % 12, "ab.%()[]^$*+-?-dwsbf1{}");
        random_text(subj, rnd() % 32, "aabb(){}-. 1x");
        int nargs = strcmp(fn, "gsub") == 0 ? 3 : 2;
        sb.checks = 0;
        sb.limit = 50;
        lua_getglobal(L, "mine_finishes");
        lua_pushstring(L, fn);
        lua_pushstring(L, subj);
        lua_pushstring(L, pat);
        if (nargs == 3) {
            lua_pushstring(L, "<%0>");
        }
        if (lua_pcall(L, nargs + 1, 1, 0) != 0) {
            fail_msg("%s", lua_tostring(L, -1));
        }
        if (!lua_toboolean(L, -1)) {
            skipped++;
            lua_settop(L, 0);
            continue;
        }
        lua_settop(L, 0);
        sb.limit = 1000000; /* the comparison itself must not be stopped */
        lua_getglobal(L, "compare");
        lua_pushfstring(L, "random %d", i);
        lua_pushstring(L, fn);
        lua_pushstring(L, subj);
        lua_pushstring(L, pat);
        if (nargs == 3) {
            lua_pushstring(L, "<%0>");
        }
        if (lua_pcall(L, nargs + 2, 0, 0) != 0) {
            fail_msg("%s", lua_tostring(L, -1));
        }
        compared++;
    }
    printf("lpattern: %d random cases compared with LuaJIT, %d stopped by the budget\n", compared,
           skipped);
    assert_true(compared > 25000);
    lua_close(L);
}

/* ------------------------------------------------------------- budget -- */

/* A catastrophic pattern is stopped by the budget with the error naming the
 * function; a short call never consults the budget. */
static void test_budget_stops(void **state) {
    (void)state;
    struct step_budget sb = {.b = {.expired = step_expired}, .limit = 5};
    lua_State *L;
    static const char *const chunks[] = {
        "mine.match(('{'):rep(1e5), '%b{}x')",
        "mine.find(('a'):rep(1e4), '(.-)(.-)(.-)x')",
        "mine.gsub(('a'):rep(1e4), '(.-)(.-)b', '')",
        "for x in mine.gmatch(('a'):rep(1e4), '.-.-.-b') do end",
        "mine.find(('a'):rep(40), ('a*'):rep(40) .. 'b')",
        "mine.find(('a'):rep(4e6), 'b', 1, true)",
        "mine.match(('a'):rep(4e6) .. 'b', '%a*%d')",
    };

    sb.b.ud = &sb;
    L = new_state(&sb);
    expect_stopped(L, &sb, chunks, sizeof(chunks) / sizeof(chunks[0]), "string.");
    sb.checks = 0;
    run(L, "=short", "assert(mine.match('key=value', '(%w+)=(%w+)') == 'key')");
    assert_int_equal(sb.checks, 0);
    lua_close(L);
}

/* -------------------------------------------------------------- speed -- */

/* Typical policy patterns, LuaJIT's functions against these (interpreter
 * only, as in a policy state); prints the ratio, and fails only on a gross
 * slowdown (the figure is in docs/policies.md). */
static void test_speed_typical_patterns(void **state) {
    (void)state;
    lua_State *L = new_state(NULL);
    static const char BENCH[] =
        "local lib, n = ...\n"
        "local body = ('{\"amount\":1500,\"currency\":\"EUR\",\"memo\":\"' .. ('m'):rep(960)\n"
        "             .. '\"}'):sub(1, 1024)\n"
        "local find, match, gsub = lib.find, lib.match, lib.gsub\n"
        "local hits = 0\n"
        "for i = 1, n do\n"
        "  if match('studio.lerian.ledger.v2', '^studio%.lerian%.') then hits = hits + 1 end\n"
        "  local a, b = match('release 12.34 ok', '(%d+)%.(%d+)')\n"
        "  if a then hits = hits + 1 end\n"
        "  if find(body, 'currency', 1, true) then hits = hits + 1 end\n"
        "  local s = gsub(body, '[\"{}]', '')\n"
        "  if match(body, '\"amount\":(%d+)') then hits = hits + 1 end\n"
        "end\n"
        "assert(hits == 4 * n)\n"
        "return hits\n";
    double t[2];
    const int n = 4000;

    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    compare_speed(L, BENCH, n, t);
    printf("lpattern: typical policy patterns, %.2f us per round with LuaJIT's functions, %.2f "
           "us with lpattern (ratio %.2f)\n",
           t[0] * 1000.0 / n, t[1] * 1000.0 / n, t[1] / t[0]);
    assert_true(t[1] < 3.0 * t[0]);
    lua_close(L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_and_match),
        cmocka_unit_test(test_classes_exhaustive),
        cmocka_unit_test(test_gmatch),
        cmocka_unit_test(test_gsub),
        cmocka_unit_test(test_error_positions_and_methods),
        cmocka_unit_test(test_random_differential),
        cmocka_unit_test(test_budget_stops),
        cmocka_unit_test(test_speed_typical_patterns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
