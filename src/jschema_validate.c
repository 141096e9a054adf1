/*
 * jschema_validate — walking an instance against compiled js_nodes with
 * bounded work.
 *
 * All state of one validation lives in a struct js_vctx on the caller's
 * stack (and one PCRE2 match data it allocates), so threads share nothing
 * writable.  Every keyword evaluated, every value compared by `enum`,
 * `const` and `uniqueItems`, and every 256 bytes a regex scans cost a step;
 * the run stops at max_steps, at an instance or evaluation depth over the
 * limit, or when PCRE2 reports its match or depth limit.
 *
 * Errors are recorded only on the path that decides the verdict: inside
 * `anyOf`, `oneOf`, `not`, `if` and `contains` subschemas are evaluated
 * "speculatively" (nothing recorded, first failure returns), and the
 * keyword itself records one error when its outcome fails the instance.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jschema_int.h"
#include "util.h"

/* The state of one validation. */
struct js_vctx {
    const struct hub_jschema_limits *l;
    struct hub_jschema_result *res;
    pcre2_match_context *mctx, *mctx_first;
    pcre2_match_data *md; /* made on the first regex search */
    int record;           /* errors are recorded (not inside a speculative branch) */
    unsigned depth;       /* instance nesting of the current location */
    unsigned eval_depth;  /* nested subschema evaluations (guards the C stack) */
    int stop;             /* set with the code that ends the run */
    size_t plen;          /* length of path */
    char path[HUB_JSCHEMA_POINTER_MAX];
};

/*
 * Ends the run at a bound (HUB_ERANGE) or on allocation failure.  A bound
 * is recorded as a last error with keyword "limit" at the instance location
 * reached, so evidence says where a payload became too costly.
 */
static int stop(struct js_vctx *c, int rc, enum hub_jschema_limit why) {
    static const char *const names[] = {"", "depth", "step", "regex"};
    if (c->stop) {
        return -1;
    }
    c->stop = rc;
    c->res->limit = why;
    if (why != HUB_JSCHEMA_LIMIT_NONE && c->l->max_errors > 0) {
        struct hub_jschema_result *r = c->res;
        /* the last slot is overwritten when all are taken: where it stopped matters most */
        size_t i = r->nerrors < c->l->max_errors ? r->nerrors++ : r->nerrors - 1;
        struct hub_jschema_issue *e = &r->errors[i];
        snprintf(e->instance, sizeof e->instance, "%s", c->path);
        snprintf(e->keyword, sizeof e->keyword, "limit");
        e->schema[0] = '\0';
        snprintf(e->message, sizeof e->message, "validation stopped at the %s limit", names[why]);
        r->total_errors++;
    }
    return -1;
}

/* Charges n steps; -1 when the budget is used up (the run stops there,
 * with res->steps past max_steps by less than n). */
static int charge(struct js_vctx *c, uint64_t n) {
    c->res->steps += n;
    if (c->res->steps > c->l->max_steps) {
        return stop(c, HUB_ERANGE, HUB_JSCHEMA_LIMIT_STEPS);
    }
    return 0;
}

/* 1 when a failure should not end the evaluation of a node: more errors
 * are still to be recorded. */
static int more(const struct js_vctx *c) {
    return c->record && c->res->nerrors < c->l->max_errors;
}

/*
 * Marks a subschema failure in *ok (its errors are already recorded) and
 * says whether to go on evaluating, as more() does.
 */
static int failed(const struct js_vctx *c, int *ok) {
    *ok = 0;
    return more(c);
}

/*
 * Records a failure of keyword kw of node n at the current instance
 * location (when recording).  Returns 0, the verdict of the keyword.
 */
static int fail(struct js_vctx *c, const struct js_node *n, const char *kw, const char *fmt, ...) {
    if (!c->record) {
        return 0;
    }
    c->res->total_errors++;
    if (c->res->nerrors >= c->l->max_errors) {
        return 0;
    }
    struct hub_jschema_issue *e = &c->res->errors[c->res->nerrors++];
    snprintf(e->instance, sizeof e->instance, "%s", c->path);
    snprintf(e->keyword, sizeof e->keyword, "%s", kw);
    int w = snprintf(e->schema, sizeof e->schema, "%s/%s", n->ptr, kw);
    if (w >= (int)sizeof e->schema) {
        memcpy(e->schema + sizeof e->schema - 4, "...", 4);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return 0;
}

/*
 * Appends a pointer segment to the instance path; returns the length to
 * restore with path_pop.  A path that would not fit ends in "/...".
 */
static size_t path_push(struct js_vctx *c, const char *seg, size_t len) {
    size_t old = c->plen, o = old;
    const size_t cap = sizeof c->path - 5; /* room for "/..." */
    if (o >= cap) {
        return old;
    }
    c->path[o++] = '/';
    for (size_t i = 0; i < len && o < cap; i++) {
        if (seg[i] == '~' || seg[i] == '/') {
            c->path[o++] = '~';
            c->path[o++] = seg[i] == '~' ? '0' : '1';
        } else {
            c->path[o++] = seg[i];
        }
    }
    if (o >= cap) {
        memcpy(c->path + old, "/...", 5);
        o = old + 4;
    }
    c->path[o] = '\0';
    c->plen = o;
    return old;
}

/* path_push of an array index. */
static size_t path_push_index(struct js_vctx *c, size_t i) {
    char num[24];
    int n = snprintf(num, sizeof num, "%zu", i);
    return path_push(c, num, (size_t)n);
}

/* Restores the path to the length path_push returned. */
static void path_pop(struct js_vctx *c, size_t old) {
    c->plen = old;
    c->path[old] = '\0';
}

/* minLength and maxLength count code points (jansson has checked the
 * UTF-8 already), not bytes and not UTF-16 units. */
size_t js_utf8_length(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        /* count every byte that is not a continuation byte */
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    }
    return n;
}

/* 1 when the number x has an integer value (2 and 2.0 alike). */
static int is_integral(const json_t *x) {
    if (json_is_integer(x)) {
        return 1;
    }
    double d = json_real_value(x);
    return isfinite(d) && d == floor(d);
}

/* Compares two numbers: exactly when both are integers, else as doubles. */
static int num_cmp(const json_t *a, const json_t *b) {
    if (json_is_integer(a) && json_is_integer(b)) {
        json_int_t x = json_integer_value(a), y = json_integer_value(b);
        return (x > y) - (x < y);
    }
    double x = json_number_value(a), y = json_number_value(b);
    return (x > y) - (x < y);
}

/*
 * Equality with a step counter: each value visited costs one of *budget.
 * Returns 1 equal, 0 not, -1 budget exhausted.
 */
static int equal_bounded(const json_t *a, const json_t *b, uint64_t *budget) {
    if (*budget == 0) {
        return -1;
    }
    (*budget)--;
    if (json_is_number(a) && json_is_number(b)) {
        return num_cmp(a, b) == 0;
    }
    if (json_typeof(a) != json_typeof(b)) {
        return 0;
    }
    switch (json_typeof(a)) {
    case JSON_STRING: {
        /* equal lengths compare every byte: a step per 256 of them */
        size_t cost = json_string_length(a) / 256;
        if (json_string_length(a) != json_string_length(b)) {
            return 0;
        }
        if (cost > *budget) {
            return -1;
        }
        *budget -= cost;
        return memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    }
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b)) {
            return 0;
        }
        for (size_t i = 0; i < json_array_size(a); i++) {
            int r = equal_bounded(json_array_get(a, i), json_array_get(b, i), budget);
            if (r != 1) {
                return r;
            }
        }
        return 1;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) {
            return 0;
        }
        const char *k;
        size_t klen;
        json_t *v;
        json_object_keylen_foreach((json_t *)a, k, klen, v) {
            const json_t *w = json_object_getn(b, k, klen);
            if (!w) {
                return 0;
            }
            int r = equal_bounded(v, w, budget);
            if (r != 1) {
                return r;
            }
        }
        return 1;
    }
    default:
        /* true, false, null: same type is same value */
        return 1;
    }
}

/* Unbounded: for the compatibility check, which compares schema values,
 * never payloads. */
int js_equal(const json_t *a, const json_t *b) {
    uint64_t budget = UINT64_MAX;
    return equal_bounded(a, b, &budget) == 1;
}

/* equal_bounded charged to the validation's steps. */
static int equal(struct js_vctx *c, const json_t *a, const json_t *b) {
    /* the comparison may use what is left of the run's steps, no more */
    uint64_t left = c->res->steps < c->l->max_steps ? c->l->max_steps - c->res->steps : 0;
    uint64_t budget = left;
    int r = equal_bounded(a, b, &budget);
    c->res->steps += left - budget;
    if (r < 0) {
        return stop(c, HUB_ERANGE, HUB_JSCHEMA_LIMIT_STEPS);
    }
    return r;
}

static int v_node(struct js_vctx *c, const struct js_node *n, const json_t *x);

/* Evaluates n without recording errors (a branch of anyOf, oneOf, not...). */
static int speculate(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    int saved = c->record;
    c->record = 0;
    int r = v_node(c, n, x);
    c->record = saved;
    return r;
}

/* Evaluates n on a member or element of the current instance. */
static int v_child(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    if (c->depth >= c->l->max_depth) {
        return stop(c, HUB_ERANGE, HUB_JSCHEMA_LIMIT_DEPTH);
    }
    c->depth++;
    int r = v_node(c, n, x);
    c->depth--;
    return r;
}

/* The JSON type of x as `type` names it, for messages. */
static const char *type_name(const json_t *x) {
    switch (json_typeof(x)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "null";
    }
}

/* The names of the types in bits, "a or b or c", into buf. */
static void type_names(unsigned bits, char *buf, size_t cap) {
    static const char *const names[] = {"null",   "boolean", "object", "array",
                                        "number", "string",  "integer"};
    size_t o = 0;
    buf[0] = '\0';
    for (unsigned k = 0; k < 7 && o < cap; k++) {
        if (bits & (1u << k)) {
            int w = snprintf(buf + o, cap - o, "%s%s", o ? " or " : "", names[k]);
            o += w > 0 ? (size_t)w : 0;
        }
    }
}

/* 1 when x has one of the types in bits; 2.0 is an integer, as the spec
 * says ("integer" is any number with a zero fractional part). */
static int type_ok(unsigned bits, const json_t *x) {
    switch (json_typeof(x)) {
    case JSON_OBJECT:
        return (bits & JS_T_OBJECT) != 0;
    case JSON_ARRAY:
        return (bits & JS_T_ARRAY) != 0;
    case JSON_STRING:
        return (bits & JS_T_STRING) != 0;
    case JSON_INTEGER:
        return (bits & (JS_T_NUMBER | JS_T_INTEGER)) != 0;
    case JSON_REAL:
        return (bits & JS_T_NUMBER) || ((bits & JS_T_INTEGER) && is_integral(x));
    case JSON_TRUE:
    case JSON_FALSE:
        return (bits & JS_T_BOOLEAN) != 0;
    default:
        return (bits & JS_T_NULL) != 0;
    }
}

/* The text of a number for messages. */
static void num_text(const json_t *v, char *buf, size_t cap) {
    if (json_is_integer(v)) {
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    } else {
        snprintf(buf, cap, "%.17g", json_real_value(v));
    }
}

/* 1 when x is a multiple of m. */
static int multiple_ok(const json_t *x, const json_t *m) {
    if (json_is_integer(x) && json_is_integer(m)) {
        json_int_t a = json_integer_value(x), b = json_integer_value(m);
        /* b is positive (meta-schema: exclusiveMinimum 0); no INT_MIN % -1 */
        return b > 0 && a % b == 0;
    }
    double q = json_number_value(x) / json_number_value(m);
    if (!isfinite(q)) {
        return 0;
    }
    /* decimal steps such as 0.0001 are inexact in binary: allow rounding noise */
    return fabs(q - nearbyint(q)) <= 1e-9 * fmax(1.0, fabs(q));
}

/*
 * multipleOf and the four bounds on a number x.  Returns 1 valid, 0
 * invalid (errors recorded while more() allows).  Integer against integer
 * compares exactly; anything else as doubles, which is exact below 2^53.
 */
static int v_number(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    int ok = 1;
    char a[32], b[32];
    if (n->multiple_of && !multiple_ok(x, n->multiple_of)) {
        num_text(x, a, sizeof a);
        num_text(n->multiple_of, b, sizeof b);
        ok = fail(c, n, "multipleOf", "%s is not a multiple of %s", a, b);
        if (!more(c)) {
            return 0;
        }
    }
    const struct {
        const json_t *bound;
        const char *kw, *what;
        int bad_from; /* fail when num_cmp(x, bound) * sign >= bad_from */
        int sign;
    } checks[] = {
        {n->maximum, "maximum", "greater than the maximum", 1, 1},
        {n->exclusive_maximum, "exclusiveMaximum", "not less than the exclusive maximum", 0, 1},
        {n->minimum, "minimum", "less than the minimum", 1, -1},
        {n->exclusive_minimum, "exclusiveMinimum", "not greater than the exclusive minimum", 0, -1},
    };
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++) {
        if (checks[i].bound && num_cmp(x, checks[i].bound) * checks[i].sign >= checks[i].bad_from) {
            num_text(x, a, sizeof a);
            num_text(checks[i].bound, b, sizeof b);
            ok = fail(c, n, checks[i].kw, "%s is %s %s", a, checks[i].what, b);
            if (!more(c)) {
                return 0;
            }
        }
    }
    return ok;
}

/* Nanoseconds the steps left stand for. */
static uint64_t left_ns(const struct js_vctx *c) {
    return (c->l->max_steps - c->res->steps) * JS_NS_PER_STEP;
}

/*
 * Searches s for re.  The first try runs under JS_REGEX_FIRST_LIMIT and
 * costs 8 steps plus one per 256 bytes; only a search that needs more is
 * re-run under regex_match_limit, charged limit / 10 steps more (a step is
 * ~100 ns of keyword work; a match-limit unit ~1-13 ns of matching,
 * measured on a loaded 2-core machine).  Both limits count per start
 * position, not per search (jschema_format.c), so the work is also charged
 * as it was: a step per two callouts (an item tried, which reads at most
 * JS_REGEX_UNTIMED_BYTES of a short subject), and for a longer subject or
 * a re-run the CPU time it took, under a deadline of the time the steps
 * left stand for.  Many searches meet the budget as one long one does.
 */
static int regex_search(struct js_vctx *c, const pcre2_code *re, const char *s, size_t len) {
    uint64_t t0 = 0, callouts = 0, spent;
    int r;

    if (charge(c, 8 + len / 256) < 0) {
        return -1;
    }
    if (!c->md && !(c->md = pcre2_match_data_create(1, NULL))) {
        return stop(c, HUB_ENOMEM, HUB_JSCHEMA_LIMIT_NONE);
    }
    if (len > JS_REGEX_UNTIMED_BYTES) {
        t0 = hub_thread_cpu_ns();
    }
    r = js_regex_search(re, s, len, c->md, c->mctx_first, t0 != 0 ? t0 + left_ns(c) : 0, &callouts);
    if (r == -1) {
        if (charge(c, c->l->regex_match_limit / 10) < 0) {
            return -1;
        }
        if (t0 == 0) {
            t0 = hub_thread_cpu_ns();
        }
        r = js_regex_search(re, s, len, c->md, c->mctx, t0 + left_ns(c), &callouts);
    }
    spent = callouts / 2 + (t0 != 0 ? (hub_thread_cpu_ns() - t0) / JS_NS_PER_STEP : 0);
    if (charge(c, spent) < 0 || r == -3) {
        return stop(c, HUB_ERANGE, HUB_JSCHEMA_LIMIT_STEPS);
    }
    if (r < 0) {
        return stop(c, HUB_ERANGE, HUB_JSCHEMA_LIMIT_REGEX);
    }
    return r;
}

/*
 * max<what> and min<what> (what: "Length", "Items", "Properties") on a
 * count of units; a bound of -1 is absent.  Returns 1 within both, else 0
 * with the errors recorded.
 */
static int v_counts(struct js_vctx *c, const struct js_node *n, size_t count, long long max,
                    long long min, const char *what, const char *units) {
    char kw[HUB_JSCHEMA_KEYWORD_MAX];
    int ok = 1;
    if (max >= 0 && count > (unsigned long long)max) {
        snprintf(kw, sizeof kw, "max%s", what);
        ok = fail(c, n, kw, "%zu %s, more than %lld", count, units, max);
        if (!more(c)) {
            return 0;
        }
    }
    if (min >= 0 && count < (unsigned long long)min) {
        snprintf(kw, sizeof kw, "min%s", what);
        ok = fail(c, n, kw, "%zu %s, fewer than %lld", count, units, min);
    }
    return ok;
}

/*
 * maxLength, minLength (in code points), pattern and format on a string x.
 * Returns 1, 0, or -1 when a regex search stopped the run.
 */
static int v_string(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    int ok = 1;
    const char *s = json_string_value(x);
    size_t len = json_string_length(x);
    /* a length counts code points and a format scans the string: a step
     * per 64 bytes for the one (~0.8 ns a byte), per 32 for the other
     * (~3.6 ns a byte for uri), so a schema naming them many times over
     * meets the budget */
    if ((n->max_length >= 0 || n->min_length >= 0) && charge(c, len / 64) < 0) {
        return -1;
    }
    if (n->format != JS_FMT_NONE && charge(c, len / 32) < 0) {
        return -1;
    }
    if ((n->max_length >= 0 || n->min_length >= 0) &&
        !v_counts(c, n, js_utf8_length(s, len), n->max_length, n->min_length, "Length",
                  "characters") &&
        !failed(c, &ok)) {
        return 0;
    }
    if (n->pattern) {
        int r = regex_search(c, n->pattern, s, len);
        if (r < 0) {
            return -1;
        }
        if (r == 0) {
            ok = fail(c, n, "pattern", "does not match the pattern");
            if (!more(c)) {
                return 0;
            }
        }
    }
    if (n->format != JS_FMT_NONE && !js_format_check(n->format, s, len)) {
        static const char *const names[] = {"", "date-time", "uri", "email"};
        ok = fail(c, n, "format", "not a valid %s", names[n->format]);
    }
    return ok;
}

/*
 * maxItems, minItems, uniqueItems, items/additionalItems and contains on
 * an array x.  uniqueItems compares every pair, charged per value visited,
 * so a large array meets the step budget instead of running quadratic
 * time.  Returns 1, 0 or -1.
 */
static int v_array(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    int ok = 1, r;
    size_t size = json_array_size(x);
    if (!v_counts(c, n, size, n->max_items, n->min_items, "Items", "items") && !failed(c, &ok)) {
        return 0;
    }
    /* the first equal pair is enough: uniqueItems is one error, not one per pair */
    if (n->unique_items) {
        for (size_t i = 1; i < size; i++) {
            for (size_t k = 0; k < i; k++) {
                if ((r = equal(c, json_array_get(x, i), json_array_get(x, k))) < 0) {
                    return -1;
                }
                if (r) {
                    ok = fail(c, n, "uniqueItems", "items %zu and %zu are equal", k, i);
                    if (!more(c)) {
                        return 0;
                    }
                    goto unique_done;
                }
            }
        }
    }
unique_done:
    /* without items, nothing applies to the elements: skip the walk */
    for (size_t i = 0; (n->items || n->items_is_list) && i < size; i++) {
        const struct js_node *in = NULL;
        if (!n->items_is_list) {
            in = n->items;
        } else if (i < n->items_list.n) {
            in = n->items_list.v[i];
        } else {
            in = n->additional_items;
        }
        if (!in) {
            /* past a positional list without additionalItems: nothing more applies */
            if (n->items_is_list && i >= n->items_list.n) {
                break;
            }
            continue;
        }
        size_t old = path_push_index(c, i);
        r = v_child(c, in, json_array_get(x, i));
        path_pop(c, old);
        if (r < 0) {
            return -1;
        }
        if (r == 0) {
            ok = 0;
            if (!more(c)) {
                return 0;
            }
        }
    }
    /* contains needs one match: items are tried speculatively, nothing is
     * recorded for the ones that fail, one error when none matches */
    if (n->contains) {
        int found = 0;
        for (size_t i = 0; i < size && !found; i++) {
            c->depth++;
            r = c->depth > c->l->max_depth ? stop(c, HUB_ERANGE, HUB_JSCHEMA_LIMIT_DEPTH)
                                           : speculate(c, n->contains, json_array_get(x, i));
            c->depth--;
            if (r < 0) {
                return -1;
            }
            found = r;
        }
        if (!found) {
            ok = fail(c, n, "contains", "no item matches the contains schema");
        }
    }
    return ok;
}

/* The `properties` entry named k (klen bytes, may hold NUL), or NULL: a
 * binary search over the entries compile sorted with prop_cmp. */
static const struct js_node *prop_find(const struct js_node *n, const char *k, size_t klen) {
    size_t lo = 0, hi = n->nprops;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct js_prop *p = &n->props[mid];
        size_t m = p->len < klen ? p->len : klen;
        int cmp = memcmp(p->name, k, m);
        if (cmp == 0) {
            cmp = (p->len > klen) - (p->len < klen);
        }
        if (cmp == 0) {
            return p->node;
        }
        if (cmp < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return NULL;
}

/* Evaluates sub on the member k of object x (the path names it). */
static int v_member(struct js_vctx *c, const struct js_node *sub, const char *k, size_t klen,
                    const json_t *v) {
    size_t old = path_push(c, k, klen);
    int r = v_child(c, sub, v);
    path_pop(c, old);
    return r;
}

/* The properties/patternProperties/additionalProperties and propertyNames
 * keywords, member by member. */
static int v_members(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    int ok = 1, r;
    const char *k;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach((json_t *)x, k, klen, v) {
        int matched = 0;
        const struct js_node *p = n->nprops ? prop_find(n, k, klen) : NULL;
        if (p) {
            matched = 1;
            if ((r = v_member(c, p, k, klen, v)) < 0) {
                return -1;
            }
            if (r == 0 && !failed(c, &ok)) {
                return 0;
            }
        }
        /* every matching patternProperties schema applies, besides `properties` */
        for (size_t i = 0; i < n->npprops; i++) {
            if ((r = regex_search(c, n->pprops[i].re, k, klen)) < 0) {
                return -1;
            }
            if (r == 0) {
                continue;
            }
            matched = 1;
            if ((r = v_member(c, n->pprops[i].node, k, klen, v)) < 0) {
                return -1;
            }
            if (r == 0 && !failed(c, &ok)) {
                return 0;
            }
        }
        /* additionalProperties sees only members neither keyword matched */
        if (!matched && n->additional_props) {
            if (n->additional_props->boolean == 0) {
                /* name the keyword the schema author wrote, not "false" */
                size_t old = path_push(c, k, klen);
                ok = fail(c, n, "additionalProperties", "property is not allowed");
                path_pop(c, old);
                if (!more(c)) {
                    return 0;
                }
            } else {
                if ((r = v_member(c, n->additional_props, k, klen, v)) < 0) {
                    return -1;
                }
                if (r == 0 && !failed(c, &ok)) {
                    return 0;
                }
            }
        }
        /* propertyNames validates the name as a string instance; the error is
         * reported at the member, which is what a producer needs to find */
        if (n->property_names) {
            json_t *name = json_stringn_nocheck(k, klen);
            if (!name) {
                return stop(c, HUB_ENOMEM, HUB_JSCHEMA_LIMIT_NONE);
            }
            r = speculate(c, n->property_names, name);
            json_decref(name);
            if (r < 0) {
                return -1;
            }
            if (r == 0) {
                size_t old = path_push(c, k, klen);
                ok = fail(c, n, "propertyNames", "property name does not match propertyNames");
                path_pop(c, old);
                if (!more(c)) {
                    return 0;
                }
            }
        }
        if (charge(c, 1) < 0) {
            return -1;
        }
    }
    return ok;
}

/*
 * maxProperties, minProperties, required, dependencies, then the member
 * keywords (v_members) on an object x.  A missing required property is
 * reported at the object's pointer, its name in the message.  Returns 1,
 * 0 or -1.
 */
static int v_object(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    int ok = 1, r;
    size_t size = json_object_size(x);
    if (!v_counts(c, n, size, n->max_props, n->min_props, "Properties", "properties") &&
        !failed(c, &ok)) {
        return 0;
    }
    for (size_t i = 0; i < json_array_size(n->required); i++) {
        const json_t *name = json_array_get(n->required, i);
        if (!json_object_getn(x, json_string_value(name), json_string_length(name))) {
            ok = fail(c, n, "required", "missing property \"%s\"", json_string_value(name));
            if (!more(c)) {
                return 0;
            }
        }
    }
    for (size_t i = 0; i < n->ndeps; i++) {
        const struct js_dep *d = &n->deps[i];
        if (!json_object_get(x, d->name)) {
            continue;
        }
        if (d->schema) {
            if ((r = v_node(c, d->schema, x)) < 0) {
                return -1;
            }
            if (r == 0 && !failed(c, &ok)) {
                return 0;
            }
            continue;
        }
        for (size_t k = 0; k < json_array_size(d->names); k++) {
            const char *name = json_string_value(json_array_get(d->names, k));
            if (name && !json_object_get(x, name)) {
                ok = fail(c, n, "dependencies", "property \"%s\" requires property \"%s\"", d->name,
                          name);
                if (!more(c)) {
                    return 0;
                }
            }
        }
    }
    if (n->nprops || n->npprops || n->additional_props || n->property_names) {
        if ((r = v_members(c, n, x)) < 0) {
            return -1;
        }
        if (r == 0) {
            ok = 0;
        }
    }
    return ok;
}

/*
 * allOf (each member in recording mode: its errors are the instance's),
 * anyOf, oneOf and not (speculative: one error for the keyword), and
 * if/then/else (`if` speculative, the branch taken recording).  oneOf
 * stops counting at two matches.  Returns 1, 0 or -1.
 */
static int v_logic(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    int ok = 1, r;
    for (size_t i = 0; i < n->all_of.n; i++) {
        if ((r = v_node(c, n->all_of.v[i], x)) < 0) {
            return -1;
        }
        if (r == 0 && !failed(c, &ok)) {
            return 0;
        }
    }
    if (n->any_of.n) {
        int any = 0;
        for (size_t i = 0; i < n->any_of.n && !any; i++) {
            if ((r = speculate(c, n->any_of.v[i], x)) < 0) {
                return -1;
            }
            any = r;
        }
        if (!any) {
            ok = fail(c, n, "anyOf", "matches none of the anyOf schemas");
            if (!more(c)) {
                return 0;
            }
        }
    }
    if (n->one_of.n) {
        size_t valid = 0;
        for (size_t i = 0; i < n->one_of.n && valid < 2; i++) {
            if ((r = speculate(c, n->one_of.v[i], x)) < 0) {
                return -1;
            }
            valid += (size_t)r;
        }
        if (valid != 1) {
            ok = fail(c, n, "oneOf",
                      valid ? "matches more than one of the oneOf schemas"
                            : "matches none of the oneOf schemas");
            if (!more(c)) {
                return 0;
            }
        }
    }
    if (n->not_) {
        if ((r = speculate(c, n->not_, x)) < 0) {
            return -1;
        }
        if (r) {
            ok = fail(c, n, "not", "matches the schema of not");
            if (!more(c)) {
                return 0;
            }
        }
    }
    if (n->if_ && (n->then_ || n->else_)) {
        if ((r = speculate(c, n->if_, x)) < 0) {
            return -1;
        }
        const struct js_node *next = r ? n->then_ : n->else_;
        if (next) {
            if ((r = v_node(c, next, x)) < 0) {
                return -1;
            }
            if (r == 0) {
                ok = 0;
            }
        }
    }
    return ok;
}

/*
 * Evaluates node n on instance x.  Returns 1 valid, 0 invalid, -1 stopped
 * (c->stop says why).
 */
static int v_node(struct js_vctx *c, const struct js_node *n, const json_t *x) {
    if (c->stop || charge(c, 1) < 0) {
        return -1;
    }
    if (n->boolean >= 0) {
        return n->boolean ? 1 : fail(c, n, "false", "the schema false allows nothing");
    }
    /* a recursive $ref can nest evaluations without descending the
     * instance: bound them too, by the stack they take */
    if (c->eval_depth >= 8 * c->l->max_depth) {
        return stop(c, HUB_ERANGE, HUB_JSCHEMA_LIMIT_DEPTH);
    }
    c->eval_depth++;
    int r = 1;
    if (n->ref) {
        r = v_node(c, n->ref, x);
        goto out;
    }
#define STEP(expr)                                                                                 \
    do {                                                                                           \
        int r_ = (expr);                                                                           \
        if (r_ < 0) {                                                                              \
            r = -1;                                                                                \
            goto out;                                                                              \
        }                                                                                          \
        if (r_ == 0) {                                                                             \
            r = 0;                                                                                 \
            if (!more(c)) {                                                                        \
                goto out;                                                                          \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    /* while errors are recorded every keyword runs even after one failed,
     * so a producer sees all the problems of a payload at once (up to
     * max_errors); speculative runs return at the first failure */
    if (n->types && !type_ok(n->types, x)) {
        char want[80];
        type_names(n->types, want, sizeof want);
        STEP(fail(c, n, "type", "%s where %s is expected", type_name(x), want));
    }
    if (n->const_) {
        int e = equal(c, x, n->const_);
        STEP(e < 0 ? -1 : e ? 1 : fail(c, n, "const", "not the constant value"));
    }
    if (n->enum_) {
        int found = 0;
        for (size_t i = 0; i < json_array_size(n->enum_) && !found; i++) {
            found = equal(c, x, json_array_get(n->enum_, i));
            if (found < 0) {
                r = -1;
                goto out;
            }
        }
        STEP(found ? 1 : fail(c, n, "enum", "not one of the enum values"));
    }
    switch (json_typeof(x)) {
    case JSON_INTEGER:
    case JSON_REAL:
        STEP(v_number(c, n, x));
        break;
    case JSON_STRING:
        STEP(v_string(c, n, x));
        break;
    case JSON_ARRAY:
        STEP(v_array(c, n, x));
        break;
    case JSON_OBJECT:
        STEP(v_object(c, n, x));
        break;
    default:
        break;
    }
    STEP(v_logic(c, n, x));
#undef STEP
out:
    c->eval_depth--;
    return r;
}

/*
 * Runs one validation: the state lives here, on the caller's stack, and
 * the only allocation is the PCRE2 match data, made on the first regex
 * search and freed before return.
 */
int js_validate(const struct hub_jschema *s, const json_t *instance,
                const struct hub_jschema_limits *l, struct hub_jschema_result *res) {
    res->valid = 0;
    res->limit = HUB_JSCHEMA_LIMIT_NONE;
    res->steps = 0;
    res->nerrors = res->total_errors = 0;
    struct js_vctx c = {
        .l = l, .res = res, .mctx = s->mctx, .mctx_first = s->mctx_first, .record = 1};
    /* the path starts as "" (the root pointer); record is on at the top */
    int r = v_node(&c, s->root, instance);
    pcre2_match_data_free(c.md);
    if (r < 0) {
        return c.stop;
    }
    res->valid = r;
    return 0;
}

/* The public validate runs under the limits the schema was compiled with. */
int hub_jschema_validate(const struct hub_jschema *s, const json_t *instance,
                         struct hub_jschema_result *res) {
    return js_validate(s, instance, &s->limits, res);
}
