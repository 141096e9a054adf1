/*
 * lpattern — Lua 5.1 pattern matching (string.find, match, gmatch, gsub)
 * whose work the deadline of a policy call can stop.
 *
 * LuaJIT's own matcher backtracks in C, where the count hook never fires:
 * `("{"):rep(2^20):match("%b{}")` or `(.-)(.-)(.-)x` over a large body ran
 * for seconds to minutes.  This matcher is written from the reference
 * manual (§5.4.1) with the same results, captures, error messages and
 * limits as LuaJIT 2.1 (32 captures, 200 nested matcher activations:
 * "pattern too complex"; %g and %z classes; a pattern ends at its first NUL
 * byte), checked case by case and by differential fuzzing against LuaJIT
 * (tests/unit/test_lpattern.c, tests/fuzz/fuzz_lpattern.c).  It counts its
 * steps and asks the budget of lbudget.h every few thousand of them; when
 * the budget has expired the call raises "string.<fn>: deadline exceeded",
 * which a policy sees as its timeout.
 *
 * Unanchored searches skip, with memchr or a byte map, start positions
 * where the pattern's first item cannot match, which makes the common
 * policy patterns cheaper than LuaJIT's (docs/policies.md has the figures).
 */
#ifndef HUB_LPATTERN_H
#define HUB_LPATTERN_H

#include <lua.h>

#include "lbudget.h"

/*
 * Sets find, match, gmatch and gsub in the table at index t (a string
 * library table) to this module's versions, bounded by budget (borrowed
 * for as long as the state may call them; NULL: unbounded).
 */
void hub_lpattern_register(lua_State *L, int t, const struct hub_lbudget *budget);

#endif
