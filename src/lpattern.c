/*
 * lpattern — Lua 5.1 patterns with a step budget (see lpattern.h).
 *
 * The matcher is a backtracking interpreter over the pattern text, as the
 * manual's semantics need (greedy and lazy repetition, back-references):
 * single-character items without a quantifier advance in a loop, and a
 * recursive activation is made only where the match must be able to come
 * back (a quantifier's continuation, a capture's opening and closing).
 * Those activations are what LuaJIT counts toward its "pattern too
 * complex" limit, and what this one counts too.  Malformed items are
 * reported when the matcher reaches them, never earlier, as LuaJIT does:
 * ("a["):find("x") is nil, ("a["):find("a") an error.
 *
 * Steps: every activation, and every 64 bytes scanned (by a repetition, a
 * %b, a back-reference, a skip or a plain search) or copied into gsub's
 * result.
 */
#include "lpattern.h"

#include <lauxlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define LP_MAXCAPTURES 32
#define LP_MAXDEPTH 200 /* nested activations */
#define LP_OPEN (-1)    /* length of a capture still open */
#define LP_POSITION (-2)
#define LP_ESC '%'
#define LP_SPECIALS "^$*+?.([%-"
#define LP_CHUNK 65536 /* bytes scanned between step charges */
#define LP_MAP_MIN 256 /* subjects shorter than this skip without a byte map */

/*
 * The state of one search: the subject, the captures of the attempt in
 * progress, and the step meter.  Lives on the C stack of the library
 * function; a Lua error (a malformed pattern, the budget) unwinds past it
 * with nothing to free.
 */
struct lp {
    const char *s0, *se; /* the subject: [s0, se), se[0] == '\0' (a Lua string) */
    lua_State *L;
    struct hub_lmeter m;
    int level; /* captures started */
    int depth; /* activations in progress */
    struct {
        const char *at;
        ptrdiff_t len; /* LP_OPEN, LP_POSITION or the length */
    } cap[LP_MAXCAPTURES];
};

/* What the first consuming item of an unanchored pattern accepts, so that
 * the search loops can jump to the next position where a match may start. */
struct lp_first {
    enum { LP_FIRST_NONE, LP_FIRST_BYTE, LP_FIRST_MAP } kind;
    unsigned char c;
    uint8_t map[32];
};

/* Starts a search of s[0..len) for the function `what`, whose budget is in
 * upvalue budget_upvalue of the running closure. */
static void lp_init(struct lp *ms, lua_State *L, const char *s, size_t len, int budget_upvalue,
                    const char *what) {
    ms->s0 = s;
    ms->se = s + len;
    ms->L = L;
    ms->level = 0;
    ms->depth = 0;
    hub_lmeter_init(&ms->m, L, budget_upvalue, what);
}

/* One step: a matcher activation (the unit of backtracking work). */
static inline void lp_step(struct lp *ms) {
    hub_lmeter_spend(&ms->m, 1);
}

/* Steps for work of `units` 64-byte pieces, each as dear as item [p, ep)
 * makes it: matching a byte against a set reads the set (lp_inset), so a
 * set of 100,000 bytes costs that much per subject byte, and finding its
 * end (lp_item_end) as much again.  Short items cost nothing more. */
static inline void lp_spend_items(struct lp *ms, int64_t units, const char *p, const char *ep) {
    int64_t n = units * (1 + (ep - p) / 32);
    hub_lmeter_spend(&ms->m, n > INT32_MAX ? INT32_MAX : (int32_t)n);
}

/* ------------------------------------------------------------ classes -- */

static inline int lp_isalpha(int c) {
    return (unsigned)((c | 0x20) - 'a') < 26;
}

static inline int lp_isdigit(int c) {
    return (unsigned)(c - '0') < 10;
}

/* Whether byte c is in the class named by letter cl (%a, %d, ...; the
 * upper-case letter is the complement); any other cl stands for itself.
 * ASCII only, whatever the locale, as LuaJIT. */
static int lp_class(int c, int cl) {
    int in;

    switch (cl | 0x20) {
    case 'a':
        in = lp_isalpha(c);
        break;
    case 'c':
        in = c < 32 || c == 127;
        break;
    case 'd':
        in = lp_isdigit(c);
        break;
    case 'g':
        in = c > 32 && c < 127;
        break;
    case 'l':
        in = (unsigned)(c - 'a') < 26;
        break;
    case 'p':
        in = c > 32 && c < 127 && !lp_isalpha(c) && !lp_isdigit(c);
        break;
    case 's':
        in = c == ' ' || (unsigned)(c - '\t') < 5;
        break;
    case 'u':
        in = (unsigned)(c - 'A') < 26;
        break;
    case 'w':
        in = lp_isalpha(c) || lp_isdigit(c);
        break;
    case 'x':
        in = lp_isdigit(c) || (unsigned)((c | 0x20) - 'a') < 6;
        break;
    case 'z':
        in = c == 0;
        break;
    default:
        return cl == c;
    }
    return (cl & 0x20) ? in : !in;
}

/*
 * Whether c is in the set that starts at p ('[') and ends at close (']'),
 * as lp_item_end delimited it.  Inside a set, %x is a class or an escaped
 * character, x-y a range when something follows the '-' before the end
 * (so "[a-]" and "[-a]" hold a '-'), and anything else itself; "[^...]" is
 * the complement.
 */
static int lp_inset(int c, const char *p, const char *close) {
    int in = 1;

    p++;
    if (*p == '^') {
        in = 0;
        p++;
    }
    for (; p < close; p++) {
        if (*p == LP_ESC) {
            p++;
            if (lp_class(c, (unsigned char)*p)) {
                return in;
            }
        } else if (p[1] == '-' && p + 2 < close) {
            /* a range; a '-' first or last in the set is itself */
            if ((unsigned char)p[0] <= c && c <= (unsigned char)p[2]) {
                return in;
            }
            p += 2;
        } else if ((unsigned char)*p == c) {
            return in;
        }
    }
    return !in;
}

/* Whether c matches the single-character item [p, end). */
static inline int lp_single(int c, const char *p, const char *end) {
    switch (*p) {
    case '.':
        return 1;
    case LP_ESC:
        return lp_class(c, (unsigned char)p[1]);
    case '[':
        return lp_inset(c, p, end - 1);
    default:
        return (unsigned char)*p == c;
    }
}

/*
 * Where the single-character item at p ends: after "%x", after the ']' of
 * a set, or after one character.  A set's first character (after a '^')
 * is part of it even when it is ']', and "%]" does not close it.  A
 * malformed item ("%" at the end, a set without its ']') raises when L is
 * not NULL, and gives NULL otherwise (lp_first must not raise).
 */
static const char *lp_item_end(lua_State *L, const char *p) {
    char c = *p++;

    if (c == LP_ESC) {
        if (*p == '\0') {
            if (L != NULL) {
                luaL_error(L, "malformed pattern (ends with '%%')");
            }
            return NULL;
        }
        return p + 1;
    }
    if (c != '[') {
        return p;
    }
    if (*p == '^') {
        p++;
    }
    /* the first character is part of the set even when it is ']' */
    do {
        if (*p == '\0') {
            if (L != NULL) {
                luaL_error(L, "malformed pattern (missing ']')");
            }
            return NULL;
        }
        c = *p++;
        if (c == LP_ESC && *p != '\0') {
            p++; /* %] is a ']' in the set */
        }
    } while (*p != ']');
    return p + 1;
}

/* ------------------------------------------------------------ matcher -- */

static const char *lp_do(struct lp *ms, const char *s, const char *p);

/* '(' at p: a capture (or a position capture, "()") starting at s, then
 * the rest of the pattern; on failure the capture is forgotten again. */
static const char *lp_open(struct lp *ms, const char *s, const char *p) {
    ptrdiff_t what = LP_OPEN;
    const char *r;

    p++;
    if (*p == ')') {
        what = LP_POSITION;
        p++;
    }
    if (ms->level >= LP_MAXCAPTURES) {
        luaL_error(ms->L, "too many captures");
    }
    ms->cap[ms->level].at = s;
    ms->cap[ms->level].len = what;
    ms->level++;
    r = lp_do(ms, s, p);
    if (r == NULL) {
        ms->level--;
    }
    return r;
}

/* ')' before p: closes the innermost open capture at s, then the rest of
 * the pattern; on failure the capture is open again (backtracking may
 * close it elsewhere). */
static const char *lp_close(struct lp *ms, const char *s, const char *p) {
    int i = ms->level - 1;
    const char *r;

    while (i >= 0 && ms->cap[i].len != LP_OPEN) {
        i--;
    }
    if (i < 0) {
        luaL_error(ms->L, "invalid pattern capture");
    }
    ms->cap[i].len = s - ms->cap[i].at;
    r = lp_do(ms, s, p);
    if (r == NULL) {
        ms->cap[i].len = LP_OPEN;
    }
    return r;
}

/* %bxy at p (pointing at x): the end of the balanced run x...y starting at
 * s, or NULL.  Linear in what it scans, but tried at every start position
 * of an unanchored search, which is what makes "%b{}" over a long run of
 * '{' quadratic and this scan the place to count it. */
static const char *lp_balance(struct lp *ms, const char *s, const char *p) {
    int open = (unsigned char)p[0], close = (unsigned char)p[1];
    size_t depth = 1;

    if (p[0] == '\0' || p[1] == '\0') {
        luaL_error(ms->L, "unbalanced pattern");
    }
    if (s >= ms->se || (unsigned char)*s != open) {
        return NULL;
    }
    s++;
    while (s < ms->se) {
        const char *from = s, *lim = ms->se - s > LP_CHUNK ? s + LP_CHUNK : ms->se;
        for (; s < lim; s++) {
            int c = (unsigned char)*s;
            if (c == close) {
                if (--depth == 0) {
                    break;
                }
            } else if (c == open) {
                depth++;
            }
        }
        /* every piece is paid for: the long runs of "{{{{…" are what this
         * budget is for */
        hub_lmeter_spend(&ms->m, (int32_t)((s - from) / 64) + 1);
        if (depth == 0) {
            return s + 1;
        }
    }
    return NULL;
}

/* %1-%9 at p: the text of capture p[1] again at s, or NULL. */
static const char *lp_backref(struct lp *ms, const char *s, const char *p) {
    int i = p[1] - '1';
    size_t len;

    if (i < 0 || i >= ms->level || ms->cap[i].len == LP_OPEN) {
        luaL_error(ms->L, "invalid capture index");
    }
    /* a position capture never matches: its "length" is huge */
    len = (size_t)ms->cap[i].len;
    if ((size_t)(ms->se - s) < len) {
        return NULL;
    }
    for (size_t done = 0; done < len;) {
        size_t n = len - done < LP_CHUNK ? len - done : LP_CHUNK;
        if (memcmp(ms->cap[i].at + done, s + done, n) != 0) {
            return NULL;
        }
        hub_lmeter_spend(&ms->m, (int32_t)(n / 64) + 1);
        done += n;
    }
    return s + len;
}

/* Item [p, ep) repeated as often as possible from s, then fewer times
 * until the rest of the pattern (after the quantifier at ep) matches:
 * '*', and '+' once its first repetition has matched.  The scan is done in
 * pieces so that a long run is counted before the backtracking starts. */
static const char *lp_greedy(struct lp *ms, const char *s, const char *p, const char *ep) {
    const char *q = s;

    if (*p == '.') {
        q = ms->se;
        hub_lmeter_spend(&ms->m, (int32_t)((ms->se - s) / 64) + 1);
    } else {
        /* pieces as dear as LP_CHUNK bytes of a short item */
        ptrdiff_t chunk = LP_CHUNK / (1 + (ep - p) / 32);
        chunk = chunk < 1 ? 1 : chunk;
        for (;;) {
            const char *from = q, *lim = ms->se - q > chunk ? q + chunk : ms->se;
            while (q < lim && lp_single((unsigned char)*q, p, ep)) {
                q++;
            }
            lp_spend_items(ms, (q - from) / 64 + 1, p, ep);
            if (q < lim || q == ms->se) {
                break;
            }
        }
    }
    for (;; q--) {
        const char *r = lp_do(ms, q, ep + 1);
        if (r != NULL) {
            return r;
        }
        if (q == s) {
            return NULL;
        }
    }
}

/* Item [p, ep) repeated as few times as possible from s ('-'): the rest of
 * the pattern is tried first, then one more repetition. */
static const char *lp_lazy(struct lp *ms, const char *s, const char *p, const char *ep) {
    for (;;) {
        const char *r = lp_do(ms, s, ep + 1);
        if (r != NULL) {
            return r;
        }
        if (ep - p > 32) {
            lp_spend_items(ms, 1, p, ep);
        }
        if (s < ms->se && lp_single((unsigned char)*s, p, ep)) {
            s++;
        } else {
            return NULL;
        }
    }
}

/*
 * Matches the pattern at p against the subject from s: returns where the
 * match ends, or NULL.  One activation per call, counted against the depth
 * limit and the budget; items that cannot need to come back (a single
 * character without quantifier, %b, %f, a back-reference, '?' once its
 * item is absent) continue in the loop instead of a nested call.  '$' is
 * an anchor only as the last character of the pattern, and the pattern
 * ends at its first NUL.
 */
static const char *lp_do(struct lp *ms, const char *s, const char *p) {
    const char *r = NULL;

    if (++ms->depth > LP_MAXDEPTH) {
        luaL_error(ms->L, "pattern too complex");
    }
    lp_step(ms);
    for (;;) {
        const char *ep;
        int m;

        switch (*p) {
        case '\0': /* the pattern ends at its first NUL, as LuaJIT's */
            r = s;
            goto done;
        case '(':
            r = lp_open(ms, s, p);
            goto done;
        case ')':
            r = lp_close(ms, s, p + 1);
            goto done;
        case '$':
            if (p[1] == '\0') {
                r = s == ms->se ? s : NULL;
                goto done;
            }
            break; /* a '$' elsewhere is itself */
        case LP_ESC:
            if (p[1] == 'b') {
                s = lp_balance(ms, s, p + 2);
                if (s == NULL) {
                    goto done;
                }
                p += 4;
                continue;
            }
            if (p[1] == 'f') {
                int prev, cur;
                p += 2;
                if (*p != '[') {
                    luaL_error(ms->L, "missing '[' after '%%f' in pattern");
                }
                ep = lp_item_end(ms->L, p);
                if (ep - p > 32) {
                    lp_spend_items(ms, 1, p, ep);
                }
                prev = s == ms->s0 ? '\0' : (unsigned char)s[-1];
                cur = (unsigned char)*s; /* '\0' at the end of the subject */
                if (lp_inset(prev, p, ep - 1) || !lp_inset(cur, p, ep - 1)) {
                    goto done;
                }
                p = ep;
                continue;
            }
            if (lp_isdigit((unsigned char)p[1])) {
                s = lp_backref(ms, s, p);
                if (s == NULL) {
                    goto done;
                }
                p += 2;
                continue;
            }
            break;
        default:
            break;
        }
        /* a single-character item, perhaps with a quantifier */
        ep = lp_item_end(ms->L, p);
        if (ep - p > 32) {
            lp_spend_items(ms, 1, p, ep);
        }
        m = s < ms->se && lp_single((unsigned char)*s, p, ep);
        switch (*ep) {
        case '?':
            if (m && (r = lp_do(ms, s + 1, ep + 1)) != NULL) {
                goto done;
            }
            p = ep + 1;
            continue;
        case '+':
            r = m ? lp_greedy(ms, s + 1, p, ep) : NULL;
            goto done;
        case '*':
            r = lp_greedy(ms, s, p, ep);
            goto done;
        case '-':
            r = lp_lazy(ms, s, p, ep);
            goto done;
        default:
            if (!m) {
                goto done;
            }
            s++;
            p = ep;
            continue;
        }
    }
done:
    ms->depth--;
    return r;
}

/* ------------------------------------------------------------ results -- */

/* Pushes capture i of the match [s, e) (i 0 with no captures: the match). */
static void lp_push_capture(struct lp *ms, int i, const char *s, const char *e) {
    if (i >= ms->level) {
        if (i != 0) {
            luaL_error(ms->L, "invalid capture index");
        }
        lua_pushlstring(ms->L, s, (size_t)(e - s));
        return;
    }
    if (ms->cap[i].len == LP_OPEN) {
        luaL_error(ms->L, "unfinished capture");
    }
    if (ms->cap[i].len == LP_POSITION) {
        lua_pushinteger(ms->L, ms->cap[i].at - ms->s0 + 1);
    } else {
        lua_pushlstring(ms->L, ms->cap[i].at, (size_t)ms->cap[i].len);
    }
}

/* Pushes every capture, or the whole match when there are none and s is
 * not NULL; returns how many values. */
static int lp_push_captures(struct lp *ms, const char *s, const char *e) {
    int n = ms->level == 0 && s != NULL ? 1 : ms->level;
    luaL_checkstack(ms->L, n, "too many captures");
    for (int i = 0; i < n; i++) {
        lp_push_capture(ms, i, s, e);
    }
    return n;
}

/* ----------------------------------------------------- skipping ahead -- */

/* The first consuming item of pattern p, when every match must start with a
 * byte it accepts.  Only when reaching it cannot raise (fewer captures
 * before it than the limit, a well-formed item): skipping start positions
 * must not skip an error either.  A byte map only pays off on a longer
 * subject (len). */
static void lp_first(const char *p, size_t len, struct lp_first *f) {
    const char *ep;
    int opens = 0;

    f->kind = LP_FIRST_NONE;
    while (*p == '(') {
        if (++opens >= LP_MAXCAPTURES) {
            return;
        }
        p += p[1] == ')' ? 2 : 1;
    }
    switch (*p) {
    case '\0':
    case ')':
    case '.':
        return;
    case '$':
        if (p[1] == '\0') {
            return;
        }
        break;
    case LP_ESC:
        if (p[1] == 'b' || p[1] == 'f' || lp_isdigit((unsigned char)p[1])) {
            return;
        }
        break;
    default:
        break;
    }
    ep = lp_item_end(NULL, p);
    if (ep == NULL || *ep == '*' || *ep == '?' || *ep == '-') {
        return;
    }
    if (*p != LP_ESC && *p != '[') {
        f->kind = LP_FIRST_BYTE;
        f->c = (unsigned char)*p;
        return;
    }
    /* a map reads the set 256 times: not for a long one */
    if (len < LP_MAP_MIN || ep - p > 64) {
        return;
    }
    memset(f->map, 0, sizeof(f->map));
    for (int c = 0; c < 256; c++) {
        if (lp_single(c, p, ep)) {
            f->map[c >> 3] |= (uint8_t)(1u << (c & 7));
        }
    }
    f->kind = LP_FIRST_MAP;
}

/* The first position from s where a match may start, or NULL when there
 * is none before the end of the subject (where no match can start either:
 * the first item needs a byte).  Scans in pieces, one step per 64 bytes. */
static const char *lp_skip(struct lp *ms, const struct lp_first *f, const char *s) {
    while (s < ms->se) {
        size_t n = (size_t)(ms->se - s) > LP_CHUNK ? LP_CHUNK : (size_t)(ms->se - s);
        const char *q = NULL;

        if (f->kind == LP_FIRST_BYTE) {
            q = memchr(s, f->c, n);
        } else {
            for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)s[i];
                if (f->map[c >> 3] & (1u << (c & 7))) {
                    q = s + i;
                    break;
                }
            }
        }
        if (q != NULL) {
            hub_lmeter_spend(&ms->m, (int32_t)((q - s) / 64) + 1);
            return q;
        }
        hub_lmeter_spend(&ms->m, (int32_t)(n / 64) + 1);
        s += n;
    }
    return NULL;
}

/* memmem of p[0..lp) in s[0..ls), in windows of `step` bytes (overlapping
 * by lp - 1 so that no occurrence falls between two) that the budget can
 * stop. */
static const char *lp_memfind(struct lp *ms, const char *s, size_t ls, const char *p, size_t lp) {
    size_t step = lp > LP_CHUNK ? lp : LP_CHUNK;

    if (lp == 0) {
        return s;
    }
    while (ls >= lp) {
        size_t n = ls < step + lp - 1 ? ls : step + lp - 1;
        const char *q = memmem(s, n, p, lp);
        hub_lmeter_spend(&ms->m, (int32_t)(n / 64) + 1);
        if (q != NULL || n == ls) {
            return q;
        }
        s += step;
        ls -= step;
    }
    return NULL;
}

/* ---------------------------------------------------- find and match -- */

/* Whether find must treat p as a pattern: it holds one of ^$*+?.([%- . */
static int lp_has_specials(const char *p, size_t len) {
    /* the whole pattern: a NUL does not hide what follows, as in LuaJIT */
    for (size_t i = 0; i < len; i++) {
        if (p[i] != '\0' && strchr(LP_SPECIALS, p[i]) != NULL) {
            return 1;
        }
    }
    return 0;
}

/*
 * find and match.  Arguments as LuaJIT: s and pattern are strings (numbers
 * are converted), init counts from 1 (negative: from the end; 0 is 1; past
 * the end, the end); find with a true fourth argument, or a pattern
 * without special characters, is a plain substring search.  Returns find's
 * positions and captures, match's captures (or the whole match), or nil.
 * A leading '^' anchors the match at init.
 */
static int lp_find_aux(lua_State *L, int find) {
    size_t ls, lpat;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lpat);
    int64_t init = hub_lbudget_optint(L, 3, 1);
    struct lp ms;
    struct lp_first first = {.kind = LP_FIRST_NONE};
    const char *src;
    int anchor;

    /* init counts from 1, or from the end when negative; past the end it
     * means the end (Lua 5.1) */
    init = init < 0 ? init + (int64_t)ls : init - 1;
    init = init < 0 ? 0 : init > (int64_t)ls ? (int64_t)ls : init;
    lp_init(&ms, L, s, ls, 1, find ? "string.find" : "string.match");
    src = s + init;
    /* the pattern is read whole (lp_has_specials) */
    hub_lmeter_spend(&ms.m, (int32_t)(lpat / 64) + 1);
    if (find && (lua_toboolean(L, 4) || !lp_has_specials(p, lpat))) {
        const char *q = lp_memfind(&ms, src, ls - (size_t)init, p, lpat);
        if (q == NULL) {
            lua_pushnil(L);
            return 1;
        }
        lua_pushinteger(L, q - s + 1);
        lua_pushinteger(L, q - s + (ptrdiff_t)lpat);
        return 2;
    }
    anchor = *p == '^';
    p += anchor;
    if (!anchor) {
        lp_first(p, ls - (size_t)init, &first);
    }
    for (;;) {
        const char *e;
        if (!anchor && first.kind != LP_FIRST_NONE && (src = lp_skip(&ms, &first, src)) == NULL) {
            break;
        }
        ms.level = 0;
        ms.depth = 0;
        e = lp_do(&ms, src, p);
        if (e != NULL) {
            if (!find) {
                return lp_push_captures(&ms, src, e);
            }
            lua_pushinteger(L, src - s + 1);
            lua_pushinteger(L, e - s);
            return lp_push_captures(&ms, NULL, NULL) + 2;
        }
        if (anchor || src >= ms.se) {
            break;
        }
        src++;
    }
    lua_pushnil(L);
    return 1;
}

/* string.find(s, pattern [, init [, plain]]) */
static int lp_find(lua_State *L) {
    return lp_find_aux(L, 1);
}

/* string.match(s, pattern [, init]) */
static int lp_match(lua_State *L) {
    return lp_find_aux(L, 0);
}

/* ------------------------------------------------------------- gmatch -- */

/* The iterator: upvalues s, pattern, next position (0-based), budget.  A
 * '^' is an ordinary character here (Lua 5.1). */
static int lp_gmatch_next(lua_State *L) {
    size_t ls, lpat;
    const char *s = lua_tolstring(L, lua_upvalueindex(1), &ls);
    const char *p = lua_tolstring(L, lua_upvalueindex(2), &lpat);
    lua_Integer pos = lua_tointeger(L, lua_upvalueindex(3));
    struct lp ms;
    struct lp_first first;
    const char *src;

    if (pos > (lua_Integer)ls) {
        return 0;
    }
    lp_init(&ms, L, s, ls, 4, "string.gmatch");
    lp_first(p, ls - (size_t)pos, &first);
    for (src = s + pos; src <= ms.se; src++) {
        const char *e;
        if (first.kind != LP_FIRST_NONE && (src = lp_skip(&ms, &first, src)) == NULL) {
            break;
        }
        ms.level = 0;
        ms.depth = 0;
        e = lp_do(&ms, src, p);
        if (e != NULL) {
            /* an empty match moves on by one, or it would be found again */
            lua_pushinteger(L, (e - s) + (e == src));
            lua_replace(L, lua_upvalueindex(3));
            return lp_push_captures(&ms, src, e);
        }
    }
    return 0;
}

/* string.gmatch(s, pattern) */
static int lp_gmatch(lua_State *L) {
    luaL_checkstring(L, 1);
    luaL_checkstring(L, 2);
    lua_settop(L, 2);
    lua_pushinteger(L, 0);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushcclosure(L, lp_gmatch_next, 4);
    return 1;
}

/* --------------------------------------------------------------- gsub -- */

/* Appends len bytes, in pieces the budget can stop: a replacement can copy
 * a long match many times ("%0%0%0..."). */
static void lp_emit(struct lp *ms, struct hub_lbuf *b, const char *s, size_t len) {
    do {
        size_t n = len < LP_CHUNK ? len : LP_CHUNK;
        hub_lbuf_add(b, s, n);
        hub_lmeter_spend(&ms->m, (int32_t)(n / 64) + 1);
        s += n;
        len -= n;
    } while (len > 0);
}

/* Appends the replacement string repl for the match [s, e): %0-%9 are
 * captures, % before anything else is that character. */
static void lp_add_string(struct lp *ms, struct hub_lbuf *b, const char *repl, size_t lr,
                          const char *s, const char *e) {
    const char *end = repl + lr;

    while (repl < end) {
        const char *pc = memchr(repl, LP_ESC, (size_t)(end - repl));
        int c, i;

        if (pc == NULL) {
            lp_emit(ms, b, repl, (size_t)(end - repl));
            break;
        }
        lp_emit(ms, b, repl, (size_t)(pc - repl));
        /* a '%' at the very end escapes the string's NUL terminator */
        c = (unsigned char)pc[1];
        repl = pc + 2;
        if (!lp_isdigit(c)) {
            hub_lbuf_addc(b, (char)c);
            continue;
        }
        i = c == '0' ? -1 : c - '1';
        if (i < 0 || (i == 0 && ms->level == 0)) {
            lp_emit(ms, b, s, (size_t)(e - s));
        } else if (i >= ms->level) {
            luaL_error(ms->L, "invalid capture index");
        } else if (ms->cap[i].len == LP_OPEN) {
            luaL_error(ms->L, "unfinished capture");
        } else if (ms->cap[i].len == LP_POSITION) {
            char num[24];
            int n = snprintf(num, sizeof(num), "%td", ms->cap[i].at - ms->s0 + 1);
            hub_lbuf_add(b, num, (size_t)n);
        } else {
            lp_emit(ms, b, ms->cap[i].at, (size_t)ms->cap[i].len);
        }
    }
}

/* Appends the replacement for the match [s, e) given by the function or
 * table at stack index 3: false or nil keeps the match. */
static void lp_add_value(struct lp *ms, struct hub_lbuf *b, int tr, const char *s, const char *e) {
    lua_State *L = ms->L;
    size_t len;
    const char *r;

    /* both may run Lua (a function, an __index), which may call gsub again */
    hub_lbudget_nest(ms->m.budget, L, ms->m.what);
    if (tr == LUA_TFUNCTION) {
        int n;
        lua_pushvalue(L, 3);
        n = lp_push_captures(ms, s, e);
        lua_call(L, n, 1);
    } else {
        lp_push_capture(ms, 0, s, e);
        lua_gettable(L, 3);
    }
    if (!lua_toboolean(L, -1)) {
        lua_pop(L, 1);
        lp_emit(ms, b, s, (size_t)(e - s));
        return;
    }
    if (!lua_isstring(L, -1)) {
        luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    }
    r = lua_tolstring(L, -1, &len);
    lp_emit(ms, b, r, len);
    lua_pop(L, 1);
}

/*
 * string.gsub(s, pattern, repl [, n]): at most n replacements (default:
 * one more than the length, i.e. all), left to right.  An empty match
 * copies the next character and moves on by one, so "" matches between
 * every two characters; a leading '^' makes it one attempt.  repl is a
 * string (with %0-%9), a table indexed by the first capture, or a function
 * called with the captures; see lp_add_value for what their results mean.
 * Returns the new string and the number of matches.  The argument checks
 * come in LuaJIT's order: s, pattern, n, then repl's type.
 */
static int lp_gsub(lua_State *L) {
    size_t ls, lpat, lr = 0;
    const char *src = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lpat);
    int tr = lua_type(L, 3);
    int max = luaL_optint(L, 4, (int)(ls + 1));
    const char *repl = NULL;
    int anchor, n = 0;
    struct lp ms;
    struct lp_first first;
    struct hub_lbuf b;

    luaL_argcheck(L,
                  tr == LUA_TNUMBER || tr == LUA_TSTRING || tr == LUA_TFUNCTION || tr == LUA_TTABLE,
                  3, "string/function/table expected");
    lua_settop(L, 4);
    if (tr == LUA_TNUMBER || tr == LUA_TSTRING) {
        repl = lua_tolstring(L, 3, &lr);
    }
    hub_lbuf_init(L, &b);
    lp_init(&ms, L, src, ls, 1, "string.gsub");
    anchor = *p == '^';
    p += anchor;
    first.kind = LP_FIRST_NONE;
    if (!anchor) {
        lp_first(p, ls, &first);
    }
    while (n < max) {
        const char *e;
        if (first.kind != LP_FIRST_NONE) {
            const char *next = lp_skip(&ms, &first, src);
            next = next != NULL ? next : ms.se;
            lp_emit(&ms, &b, src, (size_t)(next - src));
            src = next;
            if (src == ms.se) {
                break; /* the first item needs a byte */
            }
        }
        ms.level = 0;
        ms.depth = 0;
        e = lp_do(&ms, src, p);
        if (e != NULL) {
            n++;
            if (repl != NULL) {
                lp_add_string(&ms, &b, repl, lr, src, e);
            } else {
                lp_add_value(&ms, &b, tr, src, e);
            }
            hub_lmeter_spend(&ms.m, (int32_t)((e - src) / 64) + 1);
        }
        if (e != NULL && e > src) {
            src = e;
        } else if (src < ms.se) {
            hub_lbuf_addc(&b, *src++);
        } else {
            break;
        }
        if (anchor) {
            break;
        }
    }
    lp_emit(&ms, &b, src, (size_t)(ms.se - src));
    hub_lbuf_push(&b);
    lua_pushinteger(L, n);
    return 2;
}

/* ------------------------------------------------------- registration -- */

void hub_lpattern_register(lua_State *L, int t, const struct hub_lbudget *budget) {
    hub_lbudget_setfn(L, t, "find", lp_find, budget);
    hub_lbudget_setfn(L, t, "match", lp_match, budget);
    hub_lbudget_setfn(L, t, "gmatch", lp_gmatch, budget);
    hub_lbudget_setfn(L, t, "gsub", lp_gsub, budget);
}
