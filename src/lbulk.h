/*
 * lbulk — string.rep, table.concat, table.insert and table.sort whose work
 * the deadline of a policy call can stop.
 *
 * LuaJIT implements the three in C with a loop as long as their result
 * (rep, concat) or the table (insert at a position shifts every element
 * after it): string.rep("ab", 3e7), a concat over a table grown across
 * many calls, or a loop of inserts at the front of a large table ran for
 * tens of milliseconds per call with no hook in between.  These versions
 * give the same results and errors as LuaJIT 2.1 (rep's separator, the
 * int32 conversion of counts, "invalid value (at index ...)" and "wrong
 * number of arguments to 'insert'"), build their strings in a state-owned
 * buffer (so the memory cap applies while they are built, and the policy's
 * allocator refuses a block that cannot be filled in the time left), and
 * spend a step of the budget (lbudget.h) per element or 64 bytes copied.
 * table.sort is a heapsort (see lb_sort) with a step per comparison.
 */
#ifndef HUB_LBULK_H
#define HUB_LBULK_H

#include <lua.h>

#include "lbudget.h"

/* Sets rep in the string table at index st and concat, insert and sort in
 * the table library at index tt, bounded by budget (borrowed; NULL:
 * unbounded). */
void hub_lbulk_register(lua_State *L, int st, int tt, const struct hub_lbudget *budget);

#endif
