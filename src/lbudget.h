/*
 * lbudget — what the bounded Lua library functions (lpattern, lbulk,
 * ljson) need from the call they run in: a budget they consult every few
 * thousand steps, and a byte buffer whose memory belongs to the Lua state.
 *
 * The count hook that enforces a policy's deadline fires between VM
 * instructions only; a library function written in C holds the thread for
 * as long as it likes.  These functions therefore count their own steps
 * (one step is a small, bounded amount of work: one matcher activation, one
 * JSON token, 64 bytes scanned or copied) and ask the budget every
 * HUB_LBUDGET_STEPS steps whether the call may go on.  Memory follows the
 * same rule from the other side: the buffer allocates through the state's
 * allocator, so its bytes count against the state's cap, and the policy's
 * allocator can refuse a large block whose filling cannot fit in the time
 * left (policy.c).
 *
 * Ownership: a budget is owned by whoever registered the functions (a
 * policy) and must outlive the Lua state's use of them; the functions find
 * it as light userdata in their first upvalue (NULL: unbounded, for plain
 * states such as the tests').  A buffer lives on the C stack of one call
 * and holds one Lua stack slot from hub_lbuf_init() until the function
 * returns.
 */
#ifndef HUB_LBUDGET_H
#define HUB_LBUDGET_H

#include <lua.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Steps between two budget checks: a few microseconds of work, so a call
 * overruns its deadline by that much at most and a short call never pays
 * for a clock read. */
#define HUB_LBUDGET_STEPS 4096

/* What producing one byte in C costs at most, conservatively (copying into
 * fresh memory with its page faults, hashing, scanning: measured at 0.4 to
 * 1.3 ns, see docs/policies.md): work whose size is known before it starts
 * needs this much time left per byte. */
#define HUB_LBUDGET_NS_PER_BYTE 1

/* C stack a call may use below the frame that armed it before library
 * functions that call back into Lua (a gsub replacement function or
 * table, pcall) refuse to nest deeper.  LuaJIT bounds Lua's stack, not
 * C's: a gsub whose replacement calls gsub costs ~1.5 KB of C stack per
 * level and only a few Lua slots, and 8 MiB of thread stack ran out before
 * Lua's own limit (a SIGSEGV of the whole process). */
#define HUB_LBUDGET_CSTACK_MAX (1 << 20)

struct hub_lbudget {
    /*
     * Nonzero when the running call has less than need_ns nanoseconds left
     * (need_ns 0: when its deadline has passed).  Before answering nonzero
     * the owner marks the call as stopped for time, so that the error the
     * library function raises next is counted as a timeout and no pcall
     * inside the policy can catch it.
     */
    int (*expired)(void *ud, int64_t need_ns);
    void *ud;
    /* the C stack where the running call was armed; NULL: not checked */
    const char *stack_top;
};

/* The step counter of one library call. */
struct hub_lmeter {
    const struct hub_lbudget *budget; /* NULL: never expires */
    lua_State *L;
    const char *what; /* "string.gsub", ...: names the function in the error */
    int32_t left;     /* steps until the next check */
};

/* Starts a meter for the function `what` with the budget in upvalue
 * `upvalue` of the running C closure. */
void hub_lmeter_init(struct hub_lmeter *m, lua_State *L, int upvalue, const char *what);

/* Asks the budget; raises "<what>: deadline exceeded" when it has expired,
 * otherwise grants the next HUB_LBUDGET_STEPS steps. */
void hub_lmeter_check(struct hub_lmeter *m);

/* Raises "<what>: deadline exceeded" unless the time left covers work over
 * `bytes` bytes at HUB_LBUDGET_NS_PER_BYTE: for work done in one piece. */
void hub_lmeter_need(struct hub_lmeter *m, size_t bytes);

/* Before a library function calls back into Lua: raises "<what>: calls
 * nested too deep" once the running call has used HUB_LBUDGET_CSTACK_MAX of
 * C stack (budget NULL: never). */
void hub_lbudget_nest(const struct hub_lbudget *budget, lua_State *L, const char *what);

/* Spends n steps (n >= 1). */
static inline void hub_lmeter_spend(struct hub_lmeter *m, int32_t n) {
    m->left -= n;
    if (m->left <= 0) {
        hub_lmeter_check(m);
    }
}

/* ------------------------------------------------------------- buffer -- */

#define HUB_LBUF_INLINE 512

struct hub_lbuf_box; /* the userdata that owns a heap block (lbudget.c) */

/*
 * A growing byte buffer.  Small contents stay in the struct; larger ones
 * live in a block from the state's allocator, owned by a userdata kept in
 * the Lua stack slot reserved at init, whose __gc frees the block when an
 * error unwinds past the function.  Growth failures raise "not enough
 * memory" (a policy's allocator has by then marked the call as out of
 * memory, or out of time).
 */
struct hub_lbuf {
    char *p;
    size_t n, cap;
    lua_State *L;
    int slot;                 /* stack index reserved for the box */
    struct hub_lbuf_box *box; /* NULL while inline */
    char inline_[HUB_LBUF_INLINE];
};

/* Pushes one stack slot (nil) and starts an empty buffer. */
void hub_lbuf_init(lua_State *L, struct hub_lbuf *b);

/* Makes room for `more` bytes past b->n; returns where they go. */
char *hub_lbuf_reserve(struct hub_lbuf *b, size_t more);

static inline void hub_lbuf_add(struct hub_lbuf *b, const void *s, size_t len) {
    if (b->cap - b->n < len) {
        hub_lbuf_reserve(b, len);
    }
    if (len <= 16) {
        /* the many short pieces of a concat or a replacement: a call to
         * memcpy costs more than the copy */
        for (size_t i = 0; i < len; i++) {
            b->p[b->n + i] = ((const char *)s)[i];
        }
    } else {
        memcpy(b->p + b->n, s, len);
    }
    b->n += len;
}

static inline void hub_lbuf_addc(struct hub_lbuf *b, char c) {
    if (b->n == b->cap) {
        hub_lbuf_reserve(b, 1);
    }
    b->p[b->n++] = c;
}

/* Pushes the contents as a Lua string and releases the heap block at once.
 * The reserved slot stays below the string. */
void hub_lbuf_push(struct hub_lbuf *b);

/* ------------------------------------------------------ registration -- */

/* Sets t[name] = C closure of fn with the budget (light userdata) as its
 * only upvalue, for the table at index t. */
void hub_lbudget_setfn(lua_State *L, int t, const char *name, lua_CFunction fn,
                       const struct hub_lbudget *budget);

/* Converts argument i as LuaJIT's own library does for positions and
 * counts (string.find's init, string.rep's n, table.concat's i and j):
 * numbers and numeric strings truncate toward zero, and anything outside
 * the int32 range (or NaN) becomes INT32_MIN.  A missing or nil argument
 * gives def; anything else raises LuaJIT's "number expected" error. */
int32_t hub_lbudget_optint(lua_State *L, int i, int32_t def);

/* The same for a required argument. */
int32_t hub_lbudget_checkint(lua_State *L, int i);

#endif
