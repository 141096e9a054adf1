/*
 * Unit tests of src/ljson.c: json.decode and json.encode give what
 * lua-cjson 2.1 gives with its default settings (values, text, error
 * messages), case by case and over random documents and values from a
 * fixed seed; the budget stops them on large or adversarial input; and
 * decoding is not slower than lua-cjson's on a typical event body.
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

#include "ljson.h"
#include "lua_compare.h"

int luaopen_cjson(lua_State *L);

static void push_ref(lua_State *L) {
    lua_pushcfunction(L, luaopen_cjson);
    lua_call(L, 0, 1);
}

static void push_mine(lua_State *L, const struct hub_lbudget *b) {
    hub_ljson_push(L, b);
}

static void test_decode_cases(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    run(L, "=decode",
        "local cases = {\n"
        "  '{\"a\":1}', '[1,2,3]', '\"str\"', '1', '-1.5e3', 'true', 'false', 'null', '[]',\n"
        "  '{}', '[[],[[]]]', '{\"a\":{\"b\":[1,{\"c\":null}]}}', ' \\t\\n\\r[ 1 , 2 ] ',\n"
        "  '\"\\\\u00e9\\\\u20ac\\\\ud83d\\\\ude00\"', "
        "'\"\\\\n\\\\t\\\\r\\\\b\\\\f\\\\/\\\\\\\\\\\\\"\"',\n"
        "  '\"\\\\u0000\"', '\"\\\\u0041\\\\u007f\\\\u0080\\\\u07ff\\\\u0800\\\\uffff\"',\n"
        "  '{\"a\":1,\"a\":2}', '[1,null,3]', '1e400', '-1e400', '0x1F', '-0x10', '+1', '+',\n"
        "  'inf', '-inf', 'nan', '-nan', 'Infinity', '-Infinity', 'NaN', 'INF', 'nanx',\n"
        "  '01', '1.', '.5', '1e', '1e+', '-', '--1', '1.5.5', '1e5x', '[1,]', '{\"a\"}',\n"
        "  '{\"a\":}', '{1:2}', '[1 2]', '{\"a\":1 \"b\":2}', '', ' ', 'nul', 'tru', 'fals',\n"
        "  'x', '\"abc', '\"\\\\x\"', '\"\\\\u12\"', '\"\\\\u12g4\"', '\"\\\\ud800\"',\n"
        "  '\"\\\\udc00\"', '\"\\\\ud800\\\\u0041\"', '\"\\\\ud800x\"', '\"\\\\ud800\\\\udbff\"',\n"
        "  '[1]\\0junk', '\\0[1]', 'a\\0', '1\\0', '\"a\\0b\"', 'truefalse', '[true false]',\n"
        "  '1 2', '\"a\" \"b\"', '[1,2]x', '\\239\\187\\191[1]', '\"\\1\\2\\127\\200\\255\"',\n"
        "  '[\"a\",{\"b\":[[[\"c\"]]]}]', '{\"\":\"\"}', '{\"a\":[]}', '[{}]', ']', '}', ':',\n"
        "  ',', '[,', '{,', '{\"a\",', '{\"a\":1,', '[1,', '\"\\\\', '\"\\\\\"',\n"
        "  ('[' ):rep(999) .. (']'):rep(999), ('['):rep(1000) .. (']'):rep(1000),\n"
        "  ('['):rep(1001) .. (']'):rep(1001), ('{\"a\":'):rep(1001) .. '1' .. ('}'):rep(1001),\n"
        "  '\"' .. ('x'):rep(100000) .. '\"', ('1'):rep(5000), '0.' .. ('1'):rep(5000),\n"
        "  '[' .. ('1,'):rep(5000) .. '1]', '1e-400', '123456789012345678901234567890',\n"
        "  5, 1.5, nil, {}, true,\n"
        "}\n"
        "for i = 1, table.maxn(cases) do compare('decode ' .. i, 'decode', cases[i]) end\n"
        "compare('two arguments', 'decode', '1', 2)\n"
        "compare('no argument', 'decode')\n");
    lua_close(L);
}

static void test_encode_cases(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    run(L, "=encode",
        "local deep999, deep1000 = {}, {}\n"
        "for _ = 1, 998 do deep999 = {deep999} end\n"
        "for _ = 1, 1000 do deep1000 = {deep1000} end\n"
        "local mixed = {}\n"
        "for i = 1, 200 do mixed['k' .. i] = i % 2 == 0 and i / 7 or {i, 'v' .. i} end\n"
        "local cases = {\n"
        "  1, -1, 0, -0.0, 1.5, 1/3, 1e100, 1e14, 1e14 - 1, -1e14 + 1, 1e15, 123456789012345,\n"
        "  -123456789012345, 2^53, 2^63, -2^63, 0.1, 1e-300, 5e-324, math.huge, -math.huge,\n"
        "  0/0, 'str', '', 'a/b\"c\\\\d\\n\\t\\r\\b\\f\\1\\31\\127\\128\\255\\0', true, false,\n"
        "  {}, {1, 2, 3}, {a = 1}, {1, 2, nil, 4}, {[1] = 1, [3] = 3}, {[1] = 1, [12] = 12},\n"
        "  {[11] = 1}, {[10] = 1}, {[0] = 1}, {[-1] = 1}, {[1.5] = 1}, {[2^31] = 1},\n"
        "  {[2^31 - 1] = 1}, {[2^40] = 1, [1] = 2}, {[math.huge] = 1}, {[-math.huge] = 1},\n"
        "  {[true] = 1}, {[{}] = 1}, {f = print}, {co = coroutine.create(print)},\n"
        "  {u = io.stdout}, {n = 0/0}, {{n = math.huge}}, {a = {b = {c = {}}}},\n"
        "  {1, {2, {3, {}}}}, {['a/b'] = 'c'}, {[1] = 'a', b = 'c'}, {[1] = 'a', [2.5] = 'b'},\n"
        "  setmetatable({}, {__index = {1, 2}}), setmetatable({1}, {__len = function() return 3 "
        "end}),\n"
        "  deep999, deep1000, mixed, {('x'):rep(100000)}, print,\n"
        "}\n"
        "for i = 1, table.maxn(cases) do compare('encode ' .. i, 'encode', cases[i]) end\n"
        "compare('encode nil', 'encode', nil)\n"
        "compare('encode null', 'encode', {mine.null, mine.null})\n"
        "-- the sandbox's encode takes its first argument only\n"
        "assert(mine.encode() == 'null' and mine.encode(1, 2) == '1')\n"
        "assert(mine.null == ref.null)\n");
    lua_close(L);
}

/* Random documents (decoded by both) and random values (encoded by
 * both); Lua's PRNG with a fixed seed. */
static void test_random_differential(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    run(L, "=random",
        "math.randomseed(24)\n"
        "local pieces = {'{', '}', '[', ']', ',', ':', '\"', '\"a\"', '\\\\', '\\\\u', 'd83d',\n"
        "                'dc00', '00e9', 'n', 'true', 'false', 'null', '0', '1', '-', '.', 'e',\n"
        "                '+', 'x', ' ', '\\n', '\\0', '\\200', 'inf', 'nan', '12.5', '\"k\":'}\n"
        "for i = 1, 20000 do\n"
        "  local t = {}\n"
        "  for j = 1, math.random(1, 12) do t[j] = pieces[math.random(#pieces)] end\n"
        "  compare('random document ' .. i, 'decode', table.concat(t))\n"
        "end\n"
        "local function value(depth)\n"
        "  local r = math.random(10)\n"
        "  if depth > 3 or r <= 3 then\n"
        "    local s = math.random(6)\n"
        "    if s == 1 then return math.random(-1e6, 1e6) end\n"
        "    if s == 2 then return math.random() * 10 ^ math.random(-20, 20) end\n"
        "    if s == 3 then return ('x/\"\\n\\1\\200'):sub(math.random(6)) end\n"
        "    if s == 4 then return math.random(2) == 1 end\n"
        "    if s == 5 then return mine.null end\n"
        "    return ''\n"
        "  end\n"
        "  local t = {}\n"
        "  for _ = 1, math.random(0, 6) do\n"
        "    local k = math.random(4)\n"
        "    if k == 1 then t[#t + 1] = value(depth + 1)\n"
        "    elseif k == 2 then t[math.random(1, 30)] = value(depth + 1)\n"
        "    elseif k == 3 then t['k' .. math.random(5)] = value(depth + 1)\n"
        "    else t[math.random(-2, 2) + 0.5 * math.random(0, 1)] = value(depth + 1) end\n"
        "  end\n"
        "  return t\n"
        "end\n"
        "for i = 1, 20000 do\n"
        "  local v = value(0)\n"
        "  compare('random value ' .. i, 'encode', v)\n"
        "  local ok, text = pcall(mine.encode, v)\n"
        "  if ok then compare('round trip ' .. i, 'decode', text) end\n"
        "end\n");
    lua_close(L);
}

/* Adversarial documents and values are stopped by the budget. */
static void test_budget_stops(void **state) {
    (void)state;
    struct step_budget sb = {.b = {.expired = step_expired}, .limit = 5};
    lua_State *L;
    static const char *const chunks[] = {
        "mine.decode('[' .. ('[],'):rep(3e5) .. '[]]')",
        "mine.decode('[' .. ('1,'):rep(5e5) .. '1]')",
        "mine.decode('{' .. ('\"a\":1,'):rep(2e5) .. '\"a\":1}')",
        "mine.decode('\"' .. ('x'):rep(4e6) .. '\"')",
        "mine.decode(('1'):rep(4e6))",
        "mine.decode((' '):rep(4e6) .. '1')",
        "local t = {} for i = 1, 20 do t = {t, t} end mine.encode(t)",
        "local t = {} for i = 1, 2e5 do t[i] = i / 3 end mine.encode(t)",
        "mine.encode({('\\1'):rep(4e6)})",
    };

    sb.b.ud = &sb;
    L = compare_state(push_ref, push_mine, &sb.b);
    expect_stopped(L, &sb, chunks, sizeof(chunks) / sizeof(chunks[0]), "json.");
    sb.checks = 0;
    run(L, "=short", "assert(mine.decode(mine.encode({a = {1, 2}})).a[2] == 2)");
    assert_int_equal(sb.checks, 0);
    lua_close(L);
}

/* Decode and encode of a 1 KiB event body, as a policy's ev.data and
 * shape do, against lua-cjson; prints the ratio, fails only on a gross
 * slowdown. */
static void test_speed(void **state) {
    (void)state;
    lua_State *L = compare_state(push_ref, push_mine, NULL);
    static const char BENCH[] =
        "local lib, n = ...\n"
        "local body = "
        "'{\"id\":\"3f2a\",\"amount\":1500,\"currency\":\"EUR\",\"tags\":[\"a\",\"b\"],'\n"
        "             .. '\"payer\":{\"name\":\"Ana\",\"iban\":\"DE89370400440532013000\"},'\n"
        "             .. '\"memo\":\"' .. ('m'):rep(860) .. '\"}'\n"
        "local size = 0\n"
        "for i = 1, n do\n"
        "  local d = lib.decode(body)\n"
        "  size = size + #lib.encode({id = d.id, amount = d.amount, memo = d.memo, n = i})\n"
        "end\n"
        "return size\n";
    double t[2];
    const int n = 3000;

    /* as in a policy state: interpreter only */
    luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
    compare_speed(L, BENCH, n, t);
    printf("ljson: decode + encode of a 1 KiB body, %.2f us with lua-cjson, %.2f us with ljson "
           "(ratio %.2f)\n",
           t[0] * 1000.0 / n, t[1] * 1000.0 / n, t[1] / t[0]);
    assert_true(t[1] < 3.0 * t[0]);
    lua_close(L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_cases),
        cmocka_unit_test(test_encode_cases),
        cmocka_unit_test(test_random_differential),
        cmocka_unit_test(test_budget_stops),
        cmocka_unit_test(test_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
