/*
 * libFuzzer target for src/ljson.c: the bounded JSON codec against
 * lua-cjson 2.1 (default settings).
 *
 * The input is a document.  The hub's json.decode runs first with a step
 * budget; when it finishes within it, lua-cjson decodes the same bytes, and
 * the two results are compared (values deeply, NaN equal to NaN; error
 * messages byte for byte).  When the document decoded, the value is
 * encoded by both and the texts (or errors) compared.  A difference aborts.
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ljson.h"

int luaopen_cjson(lua_State *L);

static const char HARNESS[] =
    "local ref, mine = ...\n"
    "local function deep(a, b)\n"
    "  if type(a) ~= type(b) then return false end\n"
    "  if type(a) ~= 'table' then return a == b or (a ~= a and b ~= b) end\n"
    "  for k, v in pairs(a) do if not deep(v, rawget(b, k)) then return false end end\n"
    "  for k in pairs(b) do if rawget(a, k) == nil then return false end end\n"
    "  return true\n"
    "end\n"
    "local function stopped(ok, e)\n"
    "  return not ok and type(e) == 'string' and e:find('deadline exceeded', 1, true)\n"
    "end\n"
    "function check(doc)\n"
    "  local ok2, v2 = pcall(mine.decode, doc)\n"
    "  if stopped(ok2, v2) then return end\n"
    "  local ok1, v1 = pcall(ref.decode, doc)\n"
    "  if ok1 ~= ok2 or not deep(v1, v2) then\n"
    "    error(string.format('decode(%q): lua-cjson %s %s but ljson %s %s', doc,\n"
    "          tostring(ok1), tostring(v1), tostring(ok2), tostring(v2)), 0)\n"
    "  end\n"
    "  if not ok1 then return end\n"
    "  local ok4, t2 = pcall(mine.encode, v2)\n"
    "  if stopped(ok4, t2) then return end\n"
    "  local ok3, t1 = pcall(ref.encode, v1)\n"
    "  if ok3 ~= ok4 or t1 ~= t2 then\n"
    "    error(string.format('encode(decode(%q)): lua-cjson %s %q but ljson %s %q', doc,\n"
    "          tostring(ok3), tostring(t1), tostring(ok4), tostring(t2)), 0)\n"
    "  end\n"
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
    lua_pushcfunction(L, luaopen_cjson);
    lua_call(L, 0, 1);
    /* lua-cjson keeps its encode buffer, malloc'd, for good: grow it now,
     * or the first input that does would look like a leak */
    if (luaL_loadstring(L, "(...).encode({('\\1'):rep(65536)})") != 0) {
        abort();
    }
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0);
    hub_ljson_push(L, &budget.b);
    if (lua_pcall(L, 2, 0, 0) != 0) {
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (L == NULL) {
        setup();
    }
    lua_settop(L, 0);
    lua_getglobal(L, "check");
    lua_pushlstring(L, (const char *)data, size);
    budget.checks = 0;
    budget.limit = 64;
    if (lua_pcall(L, 1, 0, 0) != 0) {
        fprintf(stderr, "fuzz_ljson: %s\n", lua_tostring(L, -1));
        abort();
    }
    lua_gc(L, LUA_GCSTEP, 0);
    return 0;
}
