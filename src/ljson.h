/*
 * ljson — json.encode and json.decode for policy states, compatible with
 * lua-cjson 2.1's defaults and bounded by the call's budget.
 *
 * lua-cjson does its work in one C call: decoding a 1 MiB array of empty
 * arrays took ~50 ms, encoding half a million numbers ~75 ms, and a table
 * of shared references (t = {t, t} twenty times) millions of nodes, with
 * the count hook silent throughout; its encode buffer also lived outside
 * the state's memory cap.  This codec produces the same values and text
 * and the same error messages as lua-cjson 2.1 with its default settings
 * (the documents and values of tests/unit/test_ljson.c and the fuzz
 * target are compared with lua-cjson's): `null` decodes to json.null (a
 * NULL light userdata); numbers go through strtod and are written with
 * "%.14g"; '/' is escaped; an array is a table whose keys are all positive
 * integers and not excessively sparse (more than twice as many slots as
 * elements and over 10); nesting stops at 1000 levels; NaN and infinity
 * are refused.  It spends a step of the budget (lbudget.h) per token or
 * value and per 64 bytes of string, and builds its text in a state-owned
 * buffer.
 */
#ifndef HUB_LJSON_H
#define HUB_LJSON_H

#include <lua.h>

#include "lbudget.h"

/*
 * Pushes a new table {encode = ..., decode = ..., null = json.null} whose
 * functions are bounded by budget (borrowed for as long as the state may
 * call them; NULL: unbounded).  encode takes exactly its first argument
 * (json.encode() is "null"); decode requires exactly one.
 */
void hub_ljson_push(lua_State *L, const struct hub_lbudget *budget);

#endif
