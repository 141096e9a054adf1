/*
 * Unit tests of src/lbulk.c: string.rep, table.concat, table.insert and
 * table.sort give
 * what LuaJIT's give (values, the tables they change, error messages), and
 * the budget stops them on large inputs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <luajit.h>

#include "lbulk.h"
#include "lua_compare.h"

/* Builds the library table from rep, concat, insert and sort on the stack;
 * `insert` and `sort` are compared through a copy of their table: their
 * results are the table after the call and how many values it returned. */
static const char BUILD_LIB[] = "local rep, concat, insert, sort = ...\n"
                                "local function on_copy(f)\n"
                                "  return function(t, ...)\n"
                                "    if type(t) ~= 'table' then return f(t, ...) end\n"
                                "    local c = {}\n"
                                "    for k, v in pairs(t) do c[k] = v end\n"
                                "    local r = {f(c, ...)}\n"
                                "    return c, #r\n"
                                "  end\n"
                                "end\n"
                                "return {rep = rep, concat = concat, insert = on_copy(insert),\n"
                                "        sort = on_copy(sort)}\n";

/* Replaces rep, concat, insert, sort (the top four values) with the table. */
static void build_lib(lua_State *L) {
    if (luaL_loadstring(L, BUILD_LIB) != 0) {
        fail_msg("%s", lua_tostring(L, -1));
    }
    lua_insert(L, -5);
    lua_call(L, 4, 1);
}

static void push_ref(lua_State *L) {
    lua_getglobal(L, "string");
    lua_getfield(L, -1, "rep");
    lua_remove(L, -2);
    lua_getglobal(L, "table");
    lua_getfield(L, -1, "concat");
    lua_getfield(L, -2, "insert");
    lua_getfield(L, -3, "sort");
    lua_remove(L, -4);
    build_lib(L);
}

/* The hub's functions as they are registered into a policy state: rep,
 * concat, insert and sort on the stack. */
static void push_registered(lua_State *L, const struct hub_lbudget *b) {
    lua_newtable(L); /* string */
    lua_newtable(L); /* table */
    hub_lbulk_register(L, -2, -1, b);
    lua_getfield(L, -2, "rep");
    lua_getfield(L, -2, "concat");
    lua_getfield(L, -3, "insert");
    lua_getfield(L, -4, "sort");
    lua_remove(L, -5);
    lua_remove(L, -5);
}

static void push_mine(lua_State *L, const struct hub_lbudget *b) {
    push_registered(L, b);
    build_lib(L);
}

static void test_rep(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    run(L, "=rep",
        "local cases = {\n"
        "  {'ab', 3}, {'ab', 3, ','}, {'a', 0}, {'a', -1}, {'a', 1}, {'a', 1, ','},\n"
        "  {'a', 0, ','}, {'a', 2^32 + 3}, {'a', 3.9}, {'a', -0.5}, {'a', '3'}, {'a', 0/0},\n"
        "  {'a', 2^31}, {'a', -2^31}, {12, 2}, {'a', 3, 5}, {'', 5}, {'', 5, 'x'},\n"
        "  {'', 0, 'x'}, {'x', 1, 'sep'}, {('xy'):rep(100), 50, '--'}, {'abc', 1000},\n"
        "  {'abc', 100000, 'z'}, {'\\0', 7, '\\0\\1'}, {'a'}, {'a', nil}, {nil, 2},\n"
        "  {'a', 'x'}, {'a', 2, {}}, {{}, 2}, {'a', {}},\n"
        "}\n"
        "for i, c in ipairs(cases) do compare('rep ' .. i, 'rep', unpack(c, 1, 3)) end\n");
    lua_close(L);
}

static void test_concat(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    run(L, "=concat",
        "local big = {}\n"
        "for i = 1, 5000 do big[i] = i % 3 == 0 and i or ('s' .. i) end\n"
        "local cases = {\n"
        "  {{1, 2, 3}}, {{1, 2, 3}, ','}, {{1, 2, 3}, ',', 2}, {{1, 2, 3}, ',', 2, 3},\n"
        "  {{1, 2, 3}, 5}, {{1, {}, 3}}, {{1, nil, 3}, ',', 1, 3}, {{1.5, 2, 1e100, -0.0}},\n"
        "  {{}, ','}, {{}, ',', 1, 0}, {{'a'}, ',', 1, 2^32 + 2}, {{1, 2}, ',', 2^32 + 1},\n"
        "  {{'a', 'b'}, nil, 2}, {{'a', 'b'}, ',', '2'}, {{'a', 'b', 'c'}, ',', -1, 1},\n"
        "  {{'a', true}}, {{'a', 'b'}, ',', 0}, {{[0] = 'z', 'a'}, '-', 0, 1},\n"
        "  {setmetatable({}, {__index = function() return 'z' end}), ',', 1, 2},\n"
        "  {setmetatable({1, 2}, {__len = function() return 5 end})},\n"
        "  {{'\\0', 'a\\0'}, '\\0'}, {big, ', '}, {big, '', 10, 4000},\n"
        "  {'x'}, {}, {{1, 2, 3}, {}}, {{1, 2, 3}, ',', 'x'}, {{1, 2}, ',', 1, 'y'},\n"
        "}\n"
        "for i, c in ipairs(cases) do compare('concat ' .. i, 'concat', unpack(c, 1, 4)) end\n");
    lua_close(L);
}

static void test_insert(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    run(L, "=insert",
        "local function t() return {'a', 'b', 'c'} end\n"
        "local cases = {\n"
        "  {t(), 'x'}, {t(), 1, 'x'}, {t(), 2, 'x'}, {t(), 3, 'x'}, {t(), 4, 'x'},\n"
        "  {t(), 5, 'x'}, {t(), 0, 'x'}, {t(), -2, 'x'}, {t(), 2.7, 'x'}, {t(), '2', 'x'},\n"
        "  {t(), 1, nil}, {t(), nil}, {{}, 'x'}, {{}, 1, 'x'}, {{[2] = 'b'}, 1, 'x'},\n"
        "  {{n = 1}, 'x'}, {t()}, {t(), 1, 2, 3}, {}, {'s', 'x'}, {t(), 'y', 'x'},\n"
        "  {t(), {}, 'x'},\n"
        "}\n"
        "for i, c in ipairs(cases) do\n"
        "  compare('insert ' .. i, 'insert', unpack(c, 1, table.maxn(c)))\n"
        "end\n");
    lua_close(L);
}

/* table.sort sorts as LuaJIT's does (distinct keys: a heapsort and a
 * quicksort agree on them), with its errors (comparing a number with a
 * string names the two in the order it met them, which differs). */
static void test_sort(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    run(L, "=sort",
        "local r, s = {}, {}\n"
        "for i = 1, 500 do r[i] = (i * 7919) % 1009 + i / 10000 end\n"
        "for i = 1, 300 do s[i] = ('k' .. (i * 37) % 301) end\n"
        "local lt = setmetatable({}, {__lt = function(a, b) return a.v < b.v end})\n"
        "local function o(v) return setmetatable({v = v}, getmetatable(lt)) end\n"
        "local cases = {\n"
        "  {{5, 3, 9, 1, 8, 2, 7}}, {{'b', 'a', 'c', 'aa', ''}}, {{3, 1, 2}, function(a, b) return "
        "a > b end},\n"
        "  {{}}, {{1}}, {{2, 1}}, {r}, {s}, {r, function(a, b) return a > b end},\n"
        "  {{{}, {}}}, {{1, 2}, 3}, {'x'}, {{3, 2, 1}, nil}, {},\n"
        "  {{3, 1, 2}, function(a, b) error('no') end},\n"
        "}\n"
        "for i, c in ipairs(cases) do compare('sort ' .. i, 'sort', unpack(c, 1, table.maxn(c))) "
        "end\n"
        "-- which pair is compared first differs, so the message names the types\n"
        "-- in either order\n"
        "local ok, e = pcall(mine.sort, {1, 'x'})\n"
        "assert(not ok and e:find('attempt to compare'), 'mixed types')\n"
        "local t = mine.sort({o(3), o(1), o(2)}) -- the sorted copy\n"
        "assert(t[1].v == 1 and t[2].v == 2 and t[3].v == 3, '__lt')\n");
    lua_close(L);
}

/* Large work is stopped by the budget, naming the function. */
static void test_budget_stops(void **state) {
    (void)state;
    struct step_budget sb = {.b = {.expired = step_expired}, .limit = 5};
    lua_State *L;
    static const char *const chunks[] = {
        "mine.rep('ab', 3e7)",
        "mine.rep('x', 1e5, ('y'):rep(1000))",
        "local t = {} for i = 1, 1e5 do t[i] = 'abc' end mine.concat(t, ',')",
        "local t = {} for i = 1, 1e5 do t[i] = 'abc' end "
        "for i = 1, 10 do mine.insert(t, 1, 'x') end",
        "local t = {} for i = 1, 1e5 do t[i] = (i * 7919) % 100003 end mine.sort(t)",
        "local t = {} for i = 1, 1e5 do t[i] = i end mine.sort(t, function(a, b) return a > b end)",
    };

    sb.b.ud = &sb;
    L = compare_state(push_ref, push_mine, &sb.b);
    /* the insert and sort wrappers copy their table: the real ones are
     * wanted here */
    lua_getglobal(L, "mine");
    push_registered(L, &sb.b);
    lua_setfield(L, -5, "sort");
    lua_setfield(L, -4, "insert");
    lua_settop(L, 0);
    expect_stopped(L, &sb, chunks, sizeof(chunks) / sizeof(chunks[0]), "deadline");
    sb.checks = 0;
    run(L, "=short", "assert(mine.rep('-', 20) == ('-'):rep(20))");
    assert_int_equal(sb.checks, 0);
    lua_close(L);
}

/* Typical uses (a few small strings joined, a short rule, appends): the
 * ratio against LuaJIT's, printed; fails only on a gross slowdown. */
static void test_speed(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    static const char BENCH[] =
        "local lib, n = ...\n"
        "local parts = {'studio', 'lerian', 'ledger', 'transaction', 'posted', 'v2'}\n"
        "local size = 0\n"
        "for i = 1, n do\n"
        "  size = size + #lib.concat(parts, '.') + #lib.rep('-', 40)\n"
        "  local t = {}\n"
        "  for k = 1, 8 do lib.insert(t, k) end\n"
        "  size = size + #t\n"
        "end\n"
        "return size\n";
    double t[2];
    const int n = 20000;

    /* as in a policy state: interpreter only */
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    compare_speed(L, BENCH, n, t);
    printf("lbulk: concat + rep + 8 inserts, %.2f us with LuaJIT's functions, %.2f us with "
           "lbulk (ratio %.2f)\n",
           t[0] * 1000.0 / n, t[1] * 1000.0 / n, t[1] / t[0]);
    assert_true(t[1] < 3.0 * t[0]);
    lua_close(L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rep),          cmocka_unit_test(test_concat),
        cmocka_unit_test(test_insert),       cmocka_unit_test(test_sort),
        cmocka_unit_test(test_budget_stops), cmocka_unit_test(test_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
