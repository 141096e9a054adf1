/*
 * ljson — a bounded JSON codec with lua-cjson 2.1's behaviour (see
 * ljson.h).
 *
 * Decoding reads a NUL-terminated Lua string: like lua-cjson, a NUL byte
 * ends the document ("[1]\0junk" is [1]), and error messages count
 * characters from 1.  Tokens are those of lua-cjson, and so are the names
 * its messages use for them (T_OBJ_END, ...).
 */
#include "ljson.h"

#include <lauxlib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LJ_MAX_DEPTH 1000 /* nesting, both ways */
#define LJ_SPARSE_RATIO 2 /* arrays: more slots than this times the elements ... */
#define LJ_SPARSE_SAFE 10 /* ... and more than this many are refused */
#define LJ_NUMBER_FMT "%.14g"
#define LJ_SCAN_PIECE 65536 /* bytes scanned between two step charges */

/* ------------------------------------------------------------ decoding -- */

enum lj_tok {
    LJ_OBJ_BEGIN,
    LJ_OBJ_END,
    LJ_ARR_BEGIN,
    LJ_ARR_END,
    LJ_STRING,
    LJ_NUMBER,
    LJ_BOOLEAN,
    LJ_NULL,
    LJ_COLON,
    LJ_COMMA,
    LJ_END,
    LJ_ERROR,
};

/* lua-cjson's names, as its messages show them */
static const char *const lj_tok_names[] = {
    "T_OBJ_BEGIN", "T_OBJ_END", "T_ARR_BEGIN", "T_ARR_END", "T_STRING", "T_NUMBER",
    "T_BOOLEAN",   "T_NULL",    "T_COLON",     "T_COMMA",   "T_END",    "T_ERROR",
};

/* One token; str of an LJ_STRING is valid until the next token. */
struct lj_token {
    enum lj_tok type;
    size_t index;    /* where it starts (an error: where it went wrong), from 0 */
    const char *str; /* LJ_STRING (in the input or the scratch buffer); LJ_ERROR: what */
    size_t len;
    double num;
    int boolean;
};

/* A decoding in progress; on the C stack of json.decode, the scratch
 * buffer's slot on the Lua stack. */
struct lj_dec {
    const char *s0; /* the document, NUL-terminated */
    const char *p;
    lua_State *L;
    struct hub_lmeter m;
    struct hub_lbuf tmp; /* strings with escapes */
    int depth;
};

/* Turns t into an error token at the current position. */
static void lj_token_error(struct lj_dec *d, struct lj_token *t, const char *what) {
    t->type = LJ_ERROR;
    t->index = (size_t)(d->p - d->s0);
    t->str = what;
}

/* The value of the four hex digits at p, or -1. */
static int lj_hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = (unsigned char)p[i], x;
        if (c >= '0' && c <= '9') {
            x = c - '0';
        } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
            x = (c | 0x20) - 'a' + 10;
        } else {
            return -1; /* including the NUL that ends the input */
        }
        v = v << 4 | x;
    }
    return v;
}

/*
 * \uXXXX at d->p, as UTF-8 into the scratch buffer, and moves past it: 0,
 * or -1 when it is not a valid escape.  A high surrogate (D800-DBFF) must
 * be followed at once by an escaped low one (DC00-DFFF), the pair being
 * one code point of 4 UTF-8 bytes; a low surrogate alone is invalid.
 * \u0000 gives a NUL byte (Lua strings hold it).
 */
static int lj_unicode(struct lj_dec *d) {
    int cp = lj_hex4(d->p + 2), n = 6;
    char u[4];
    size_t len;

    if (cp < 0) {
        return -1;
    }
    if ((cp & 0xF800) == 0xD800) {
        int lo;
        if ((cp & 0x400) != 0 || d->p[6] != '\\' || d->p[7] != 'u') {
            return -1; /* a low surrogate first, or a high one alone */
        }
        lo = lj_hex4(d->p + 8);
        if (lo < 0 || (lo & 0xFC00) != 0xDC00) {
            return -1;
        }
        cp = (((cp & 0x3FF) << 10) | (lo & 0x3FF)) + 0x10000;
        n = 12;
    }
    if (cp < 0x80) {
        u[0] = (char)cp;
        len = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3F));
        len = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12);
        u[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        len = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18);
        u[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        len = 4;
    }
    hub_lbuf_add(&d->tmp, u, len);
    d->p += n;
    return 0;
}

/*
 * The string token at d->p ('"').  Without escapes its value is a slice of
 * the input (no copy); with them it is built in the scratch buffer, run by
 * run.  Raw control characters and bytes over 127 pass unchanged, as in
 * lua-cjson; the escapes are \" \\ \/ \b \f \n \r \t and \u.  An
 * error token points at the backslash of a bad escape, or at the NUL where
 * the input ended inside the string.
 */
static void lj_string(struct lj_dec *d, struct lj_token *t) {
    const char *start = ++d->p;
    int copied = 0;

    d->tmp.n = 0;
    for (;;) {
        const char *run = d->p;
        unsigned char c;

        while ((c = (unsigned char)*d->p) != '"' && c != '\\' && c != '\0') {
            if ((++d->p - run) % LJ_SCAN_PIECE == 0) {
                hub_lmeter_spend(&d->m, LJ_SCAN_PIECE / 64);
            }
        }
        hub_lmeter_spend(&d->m, (int32_t)((d->p - run) % LJ_SCAN_PIECE / 64) + 1);
        if (c == '"') {
            if (copied) {
                hub_lbuf_add(&d->tmp, run, (size_t)(d->p - run));
            }
            break;
        }
        if (c == '\0') {
            lj_token_error(d, t, "unexpected end of string");
            return;
        }
        if (!copied) {
            d->tmp.n = 0;
            copied = 1;
        }
        hub_lbuf_add(&d->tmp, run, (size_t)(d->p - run));
        switch (d->p[1]) {
        case '"':
        case '\\':
        case '/':
            c = (unsigned char)d->p[1];
            break;
        case 'b':
            c = '\b';
            break;
        case 'f':
            c = '\f';
            break;
        case 'n':
            c = '\n';
            break;
        case 'r':
            c = '\r';
            break;
        case 't':
            c = '\t';
            break;
        case 'u':
            if (lj_unicode(d) != 0) {
                lj_token_error(d, t, "invalid unicode escape code");
                return;
            }
            continue;
        default:
            lj_token_error(d, t, "invalid escape code");
            return;
        }
        hub_lbuf_addc(&d->tmp, (char)c);
        d->p += 2;
    }
    t->type = LJ_STRING;
    if (copied) {
        t->str = d->tmp.p;
        t->len = d->tmp.n;
    } else {
        t->str = start;
        t->len = (size_t)(d->p - start);
    }
    d->p++; /* the closing quote */
}

/* A byte strtod may read as part of a number (hex, exponents, "infinity",
 * "nan(...)"): a superset, to measure the run it reads. */
static int lj_number_char(int c) {
    return (unsigned)(c - '0') < 10 || (unsigned)((c | 0x20) - 'a') < 26 || c == '.' || c == '+' ||
           c == '-' || c == '_' || c == '(' || c == ')';
}

/* The number token at d->p, read by strtod as lua-cjson does (so hex,
 * "inf" and "nan" pass).  strtod reads its digits in one go: the run it
 * can read is measured first, in pieces, and must fit in the time left. */
static void lj_number(struct lj_dec *d, struct lj_token *t) {
    const char *q = d->p;
    char *end;

    while (lj_number_char((unsigned char)*q)) {
        if ((++q - d->p) % LJ_SCAN_PIECE == 0) {
            hub_lmeter_spend(&d->m, LJ_SCAN_PIECE / 64);
        }
    }
    hub_lmeter_spend(&d->m, (int32_t)((q - d->p) % LJ_SCAN_PIECE / 64) + 1);
    if (q - d->p > LJ_SCAN_PIECE) {
        hub_lmeter_need(&d->m, (size_t)(q - d->p));
    }
    t->type = LJ_NUMBER;
    t->num = strtod(d->p, &end);
    if (end == d->p) {
        lj_token_error(d, t, "invalid number");
        return;
    }
    d->p = end;
}

/* lua-cjson's test for the non-JSON numbers it still reads when they do
 * not start with a digit or '-': a leading '+', inf, nan. */
static int lj_odd_number(const char *p) {
    return *p == '+' || strncasecmp(p, "inf", 3) == 0 || strncasecmp(p, "nan", 3) == 0;
}

/* The one-byte tokens, as token + 1 (0: not one). */
static const unsigned char lj_punct[256] = {
    ['{'] = LJ_OBJ_BEGIN + 1, ['}'] = LJ_OBJ_END + 1, ['['] = LJ_ARR_BEGIN + 1,
    [']'] = LJ_ARR_END + 1,   [','] = LJ_COMMA + 1,   [':'] = LJ_COLON + 1,
};

/*
 * Reads the next token into t, after JSON whitespace.  Structural
 * characters are one byte; a NUL is the end (and is not consumed); strings
 * and numbers as above; true, false and null are matched as prefixes
 * ("truex" is true, then an invalid token), as lua-cjson does.  Anything
 * else is an "invalid token" error token at its first byte.
 */
static void lj_next(struct lj_dec *d, struct lj_token *t) {
    const char *ws = d->p;
    int c;

    while ((c = (unsigned char)*d->p) == ' ' || c == '\t' || c == '\n' || c == '\r') {
        if ((++d->p - ws) % LJ_SCAN_PIECE == 0) {
            hub_lmeter_spend(&d->m, LJ_SCAN_PIECE / 64);
        }
    }
    hub_lmeter_spend(&d->m, (int32_t)((d->p - ws) % LJ_SCAN_PIECE / 64) + 1);
    t->index = (size_t)(d->p - d->s0);
    if (lj_punct[c] != 0) {
        t->type = (enum lj_tok)(lj_punct[c] - 1);
        d->p++;
        return;
    }
    switch (c) {
    case '\0':
        t->type = LJ_END;
        return;
    case '"':
        lj_string(d, t);
        return;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            lj_number(d, t);
        } else if (strncmp(d->p, "true", 4) == 0) {
            t->type = LJ_BOOLEAN;
            t->boolean = 1;
            d->p += 4;
        } else if (strncmp(d->p, "false", 5) == 0) {
            t->type = LJ_BOOLEAN;
            t->boolean = 0;
            d->p += 5;
        } else if (strncmp(d->p, "null", 4) == 0) {
            t->type = LJ_NULL;
            d->p += 4;
        } else if ((c == '+' || c == 'i' || c == 'I' || c == 'n' || c == 'N') &&
                   lj_odd_number(d->p)) {
            lj_number(d, t);
        } else {
            lj_token_error(d, t, "invalid token");
        }
        return;
    }
}

/* Raises lua-cjson's syntax error: what was expected, what was found (an
 * error token's reason, or the token's name), and where (from 1). */
static void lj_throw(struct lj_dec *d, const char *expected, const struct lj_token *t) {
    luaL_error(d->L, "Expected %s but found %s at character %d", expected,
               t->type == LJ_ERROR ? t->str : lj_tok_names[t->type], (int)t->index + 1);
}

/* Enters an array or object, which needs `slots` Lua stack slots. */
static void lj_descend(struct lj_dec *d, int slots) {
    if (++d->depth > LJ_MAX_DEPTH || !lua_checkstack(d->L, slots)) {
        luaL_error(d->L, "Found too many nested data structures (%d) at character %d", d->depth,
                   (int)(d->p - d->s0));
    }
}

static void lj_value(struct lj_dec *d, struct lj_token *t);

/* Pushes the object (string keys, a later duplicate key replacing the
 * earlier value) or the array (a table 1..n; null elements are json.null,
 * so there are no holes) whose opening token was just read. */
static void lj_container(struct lj_dec *d, int object) {
    enum lj_tok end = object ? LJ_OBJ_END : LJ_ARR_END;
    struct lj_token t;

    lj_descend(d, object ? 3 : 2);
    lua_newtable(d->L);
    lj_next(d, &t);
    /* only right after the opening may the end come: "[1,]" is an error */
    for (int i = 1; t.type != end || i > 1; i++) {
        if (object) {
            if (t.type != LJ_STRING) {
                lj_throw(d, "object key string", &t);
            }
            lua_pushlstring(d->L, t.str, t.len);
            lj_next(d, &t);
            if (t.type != LJ_COLON) {
                lj_throw(d, "colon", &t);
            }
            lj_next(d, &t);
        }
        lj_value(d, &t);
        if (object) {
            lua_rawset(d->L, -3);
        } else {
            lua_rawseti(d->L, -2, i);
        }
        lj_next(d, &t);
        if (t.type == end) {
            break;
        }
        if (t.type != LJ_COMMA) {
            lj_throw(d, object ? "comma or object end" : "comma or array end", &t);
        }
        lj_next(d, &t);
    }
    d->depth--;
}

/* Pushes the value that starts with token t. */
static void lj_value(struct lj_dec *d, struct lj_token *t) {
    switch (t->type) {
    case LJ_STRING:
        lua_pushlstring(d->L, t->str, t->len);
        break;
    case LJ_NUMBER:
        lua_pushnumber(d->L, t->num);
        break;
    case LJ_BOOLEAN:
        lua_pushboolean(d->L, t->boolean);
        break;
    case LJ_NULL:
        lua_pushlightuserdata(d->L, NULL);
        break;
    case LJ_OBJ_BEGIN:
    case LJ_ARR_BEGIN:
        lj_container(d, t->type == LJ_OBJ_BEGIN);
        break;
    default:
        lj_throw(d, "value", t);
    }
}

/* json.decode(text): exactly one argument, a string (a number is
 * converted); text in UTF-16 or UTF-32 (a NUL in its first two bytes) is
 * refused outright.  Pushes the value; anything after it but whitespace is
 * an error. */
static int lj_decode(lua_State *L) {
    struct lj_dec d;
    struct lj_token t;
    size_t len;

    luaL_argcheck(L, lua_gettop(L) == 1, 1, "expected 1 argument");
    d.s0 = d.p = luaL_checklstring(L, 1, &len);
    d.L = L;
    d.depth = 0;
    if (len >= 2 && (d.s0[0] == '\0' || d.s0[1] == '\0')) {
        return luaL_error(L, "JSON parser does not support UTF-16 or UTF-32");
    }
    hub_lmeter_init(&d.m, L, 1, "json.decode");
    hub_lbuf_init(L, &d.tmp);
    lj_next(&d, &t);
    lj_value(&d, &t);
    lj_next(&d, &t);
    if (t.type != LJ_END) {
        lj_throw(&d, "the end", &t);
    }
    return 1;
}

/* ------------------------------------------------------------ encoding -- */

/* An encoding in progress; on the C stack of json.encode. */
struct lj_enc {
    lua_State *L;
    struct hub_lmeter m;
    struct hub_lbuf out;
};

/* lua-cjson's escapes: control characters, '"', '\\', '/' and DEL */
static const char *lj_escape(unsigned char c) {
    static const char *const ctl[32] = {
        "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
        "\\b",     "\\t",     "\\n",     "\\u000b", "\\f",     "\\r",     "\\u000e", "\\u000f",
        "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
        "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
    };
    if (c < 32) {
        return ctl[c];
    }
    switch (c) {
    case '"':
        return "\\\"";
    case '\\':
        return "\\\\";
    case '/':
        return "\\/";
    case 127:
        return "\\u007f";
    default:
        return NULL;
    }
}

/* Writes the string at idx quoted and escaped; unescaped runs are copied
 * whole, in pieces of LJ_SCAN_PIECE bytes. */
static void lj_put_string(struct lj_enc *e, int idx) {
    size_t len;
    const char *s = lua_tolstring(e->L, idx, &len), *end = s + len;

    hub_lbuf_addc(&e->out, '"');
    while (s < end) {
        const char *run = s, *esc = NULL;
        const char *lim = end - s > LJ_SCAN_PIECE ? s + LJ_SCAN_PIECE : end;
        while (s < lim && (esc = lj_escape((unsigned char)*s)) == NULL) {
            s++;
        }
        hub_lbuf_add(&e->out, run, (size_t)(s - run));
        hub_lmeter_spend(&e->m, (int32_t)((s - run) / 64) + 1);
        if (s == lim && esc == NULL) {
            continue; /* a piece of a long run */
        }
        if (s < end) {
            hub_lbuf_add(&e->out, esc, strlen(esc));
            s++;
        }
    }
    hub_lbuf_addc(&e->out, '"');
}

/* Writes the number at idx as "%.14g" would (integers below 10^14 take a
 * shorter way to the same digits); NaN and infinities are refused, naming
 * the value's type as lua-cjson does. */
static void lj_put_number(struct lj_enc *e, int idx) {
    double x = lua_tonumber(e->L, idx);
    char buf[32];
    int n;

    if (isinf(x) || isnan(x)) {
        luaL_error(e->L, "Cannot serialise %s: must not be NaN or Inf", luaL_typename(e->L, idx));
    }
    if (x > -1e14 && x < 1e14 && x == (double)(long long)x && !(x == 0 && signbit(x))) {
        /* what %.14g writes for an integer of up to 14 digits */
        n = snprintf(buf, sizeof(buf), "%lld", (long long)x);
    } else {
        n = snprintf(buf, sizeof(buf), LJ_NUMBER_FMT, x);
    }
    hub_lbuf_add(&e->out, buf, (size_t)n);
}

/* Emulates the (int) conversion of lua-cjson's array test on x86-64: keys
 * of 2^31 and more become INT_MIN, so such a table is an object. */
static int lj_key_int(double k) {
    return k < 2147483648.0 ? (int)k : (int)INT32_MIN;
}

/*
 * The table on top: its length when it is an array (> 0), 0 or -1 when it
 * is an object.  Arrays are tables whose keys are all integers >= 1; the
 * length is the largest, so holes are written as null, unless the array is
 * excessively sparse (max > 2 * elements and max > 10), which is an error
 * (lua-cjson's default: no conversion to an object).  The walk stops at
 * the first other key.
 */
static int lj_array_length(struct lj_enc *e) {
    lua_State *L = e->L;
    int max = 0, items = 0;

    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        double k;
        hub_lmeter_spend(&e->m, 1);
        if (lua_type(L, -2) == LUA_TNUMBER && (k = lua_tonumber(L, -2)) != 0 && floor(k) == k &&
            k >= 1) {
            if (k > max) {
                max = lj_key_int(k);
            }
            items++;
            lua_pop(L, 1);
            continue;
        }
        lua_pop(L, 2);
        return -1;
    }
    if (max > items * LJ_SPARSE_RATIO && max > LJ_SPARSE_SAFE) {
        luaL_error(L, "Cannot serialise %s: excessively sparse array", luaL_typename(L, -1));
    }
    return max;
}

static void lj_put_value(struct lj_enc *e, int depth);

/* Writes the table on top of the stack, at nesting depth (the outermost
 * table is 1): as an array when lj_array_length says so (holes are null),
 * otherwise as an object in lua_next order, numeric keys written as
 * strings. */
static void lj_put_table(struct lj_enc *e, int depth) {
    lua_State *L = e->L;
    int len;

    if (depth > LJ_MAX_DEPTH || !lua_checkstack(L, 3)) {
        luaL_error(L, "Cannot serialise, excessive nesting (%d)", depth);
    }
    len = lj_array_length(e);
    if (len > 0) {
        hub_lbuf_addc(&e->out, '[');
        for (int i = 1; i <= len; i++) {
            if (i > 1) {
                hub_lbuf_addc(&e->out, ',');
            }
            lua_rawgeti(L, -1, i);
            lj_put_value(e, depth);
            lua_pop(L, 1);
        }
        hub_lbuf_addc(&e->out, ']');
        return;
    }
    hub_lbuf_addc(&e->out, '{');
    lua_pushnil(L);
    for (int first = 1; lua_next(L, -2) != 0; first = 0) {
        if (!first) {
            hub_lbuf_addc(&e->out, ',');
        }
        if (lua_type(L, -2) == LUA_TNUMBER) {
            hub_lbuf_addc(&e->out, '"');
            lj_put_number(e, -2);
            hub_lbuf_add(&e->out, "\":", 2);
        } else if (lua_type(L, -2) == LUA_TSTRING) {
            lj_put_string(e, -2);
            hub_lbuf_addc(&e->out, ':');
        } else {
            luaL_error(L, "Cannot serialise %s: table key must be a number or string",
                       luaL_typename(L, -2));
        }
        lj_put_value(e, depth);
        lua_pop(L, 1);
    }
    hub_lbuf_addc(&e->out, '}');
}

/* Writes the value on top of the stack, at nesting depth. */
static void lj_put_value(struct lj_enc *e, int depth) {
    lua_State *L = e->L;

    hub_lmeter_spend(&e->m, 1);
    switch (lua_type(L, -1)) {
    case LUA_TSTRING:
        lj_put_string(e, -1);
        return;
    case LUA_TNUMBER:
        lj_put_number(e, -1);
        return;
    case LUA_TBOOLEAN:
        if (lua_toboolean(L, -1)) {
            hub_lbuf_add(&e->out, "true", 4);
        } else {
            hub_lbuf_add(&e->out, "false", 5);
        }
        return;
    case LUA_TTABLE:
        lj_put_table(e, depth + 1);
        return;
    case LUA_TNIL:
        hub_lbuf_add(&e->out, "null", 4);
        return;
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, -1) == NULL) {
            hub_lbuf_add(&e->out, "null", 4);
            return;
        }
        break;
    default:
        break;
    }
    luaL_error(L, "Cannot serialise %s: type not supported", luaL_typename(L, -1));
}

/* json.encode(value): the text of its first argument (nothing is "null");
 * the value is walked with raw access, metatables ignored. */
static int lj_encode(lua_State *L) {
    struct lj_enc e;

    lua_settop(L, 1);
    e.L = L;
    hub_lmeter_init(&e.m, L, 1, "json.encode");
    hub_lbuf_init(L, &e.out);
    lua_pushvalue(L, 1);
    lj_put_value(&e, 0);
    lua_pop(L, 1);
    hub_lbuf_push(&e.out);
    return 1;
}

void hub_ljson_push(lua_State *L, const struct hub_lbudget *budget) {
    lua_createtable(L, 0, 3);
    hub_lbudget_setfn(L, -1, "encode", lj_encode, budget);
    hub_lbudget_setfn(L, -1, "decode", lj_decode, budget);
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "null");
}
