/*
 * jschema_compat — would a new version of a schema reject a payload the
 * old one accepted?  A mechanical, conservative answer: the two documents
 * are walked side by side (local `$ref`s followed in each), and every
 * keyword that can only shrink the accepted set is reported with the JSON
 * pointer of the location in the new schema (in the old one for something
 * removed).  docs/schemas.md ("Compatibility rules") has the same list for
 * operators; the rule names are the "rule" values callers see.
 *
 * Checked, at every location the walk reaches (root, properties,
 * additionalProperties, patternProperties with the same key, items,
 * additionalItems, contains, propertyNames, dependencies schemas, allOf
 * members, anyOf/oneOf members when their count is unchanged):
 *   required-added        a name in `required` the old location lacked
 *   property-removed      a `properties` member of the old schema is gone
 *   type-narrowed         `type` admits fewer JSON types (integer is a part
 *                         of number: number -> integer narrows, the reverse
 *                         widens); a `type` where there was none
 *   enum-narrowed         `enum` lost a value, or appeared
 *   const-changed         `const` appeared or changed
 *   bound-narrowed        maximum/exclusiveMaximum lower, minimum/
 *                         exclusiveMinimum higher (the tighter of each pair
 *                         is compared; equal values narrow when the new one
 *                         is exclusive), maxLength/maxItems/maxProperties
 *                         lower, minLength/minItems/minProperties higher,
 *                         each also when added; `multipleOf` added, or not
 *                         dividing the old one
 *   pattern-narrowed      `pattern` added or changed in any way
 *   format-added          `format` date-time, uri or email added or changed
 *                         (other formats are annotations)
 *   uniqueItems-added, contains-added, propertyNames-added, items-added,
 *   patternProperties-added, dependency-added (a new or longer dependency)
 *   additional-tightened  additionalProperties (or additionalItems) false
 *                         or constrained where it was absent or true; when
 *                         both are schemas they are compared as any others,
 *                         and a new property is compared with the old
 *                         additionalProperties schema that admitted it
 *   schema-false          a location became `false`
 *   allOf-added           a new constrained allOf member
 *   anyOf-changed, oneOf-changed   members added or removed
 *   conditional-changed   `not`, `if`, `then` or `else` added or changed
 *   not-checked           the schemas are too large or deep to compare
 *                         (over 20,000 subschema pairs or 512 levels)
 *   ref-changed           a `$ref` to another document (which the check
 *                         cannot follow) added, removed or changed
 *
 * Not checked (accepted as compatible):
 *   - a new optional property where the old schema had no
 *     additionalProperties (the old one admitted any value under that name;
 *     adding a field is what a minor version is for);
 *   - whether a changed pattern accepts a superset of the old one (any
 *     change is reported instead), and the same for not/if/then/else;
 *   - anyOf/oneOf members compared pairwise by position only: reordered
 *     members may be reported, and a widened oneOf member that now overlaps
 *     another (making both match) is not;
 *   - interactions across keywords (an allOf member narrowing what a
 *     sibling `properties` admits is compared member by member, not as a
 *     whole), `dependencies` that became schemas or lists, `format` other
 *     than date-time, uri and email, `contentMediaType`/`contentEncoding`;
 *   - `$ref`s to other documents (reported as ref-changed when they change).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jschema_int.h"
#include "util.h"

/* Nested comparisons at most (the compiler's own bound is 8 x 64). */
#define COMPAT_MAX_DEPTH 512

/* Pairs of (old, new) subschemas compared at most; a larger walk stops
 * there (each pair is compared once, so cycles end anyway). */
#define COMPAT_MAX_PAIRS 20000

struct compat_pair {
    const json_t *old, *new_;
};

/* The state of one comparison. */
struct compat {
    const json_t *old_root, *new_root;
    json_t *changes;
    json_t *empty; /* {}, standing in for an old `true` */
    struct compat_pair *seen;
    size_t nseen, cap_seen;
    unsigned depth; /* nested compare calls */
    int gave_up;    /* the too-large change has been reported */
    int rc;
};

/* Appends one breaking change {pointer, rule, reason}, reason formatted
 * from fmt and ap. */
static void vreport(struct compat *c, const char *ptr, const char *rule, const char *fmt,
                    va_list ap) {
    char reason[256];
    vsnprintf(reason, sizeof reason, fmt, ap);
    json_t *o = json_pack("{s:s, s:s, s:s}", "pointer", ptr, "rule", rule, "reason", reason);
    if (!o || json_array_append_new(c->changes, o) < 0) {
        c->rc = HUB_ENOMEM;
    }
}

/* A breaking change at ptr. */
static void report(struct compat *c, const char *ptr, const char *rule, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(c, ptr, rule, fmt, ap);
    va_end(ap);
}

/* A breaking change at the keyword kw of the subschema at ptr. */
static void report_kw(struct compat *c, const char *ptr, const char *kw, const char *rule,
                      const char *fmt, ...) {
    char *p = js_ptr_join(ptr, kw, strlen(kw));
    va_list ap;
    va_start(ap, fmt);
    vreport(c, p ? p : ptr, rule, fmt, ap);
    va_end(ap);
    free(p);
}

/*
 * Follows local `$ref`s ("#..." pointers) from s within root until a
 * subschema without one; a reference to another document, or one that
 * names nothing, stays as is (compared as text).  32 hops end a cycle of
 * references that never reaches a schema.
 */
static const json_t *deref(const json_t *root, const json_t *s) {
    for (int hops = 0; hops < 32 && json_is_object(s); hops++) {
        const char *ref = json_string_value(json_object_get(s, "$ref"));
        const json_t *t = ref ? js_local_ref(root, ref) : NULL;
        if (!t) {
            break;
        }
        s = t;
    }
    return s;
}

/* The slot of the pair (o, n) in a table of cap (a power of two) slots. */
static size_t pair_slot(const json_t *o, const json_t *n, size_t cap) {
    uint64_t h = (uint64_t)(uintptr_t)o * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)n;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return (size_t)(h ^ (h >> 32)) & (cap - 1);
}

/* Puts the pair in the first free slot of its probe run (the caller knows
 * it is absent and that the table has room). */
static void pair_put(struct compat_pair *t, size_t cap, const json_t *o, const json_t *n) {
    size_t i = pair_slot(o, n, cap);
    while (t[i].old) {
        i = (i + 1) & (cap - 1);
    }
    t[i] = (struct compat_pair){o, n};
}

/*
 * 1 the first time the pair (o, n) is seen; 0 after, or past the cap (then
 * reported once as not-checked).  An open-addressing set kept at most half
 * full, so a large schema compares in linear time.
 */
static int first_visit(struct compat *c, const json_t *o, const json_t *n) {
    for (size_t i = c->cap_seen ? pair_slot(o, n, c->cap_seen) : 0; c->cap_seen && c->seen[i].old;
         i = (i + 1) & (c->cap_seen - 1)) {
        if (c->seen[i].old == o && c->seen[i].new_ == n) {
            return 0;
        }
    }
    if (c->nseen >= COMPAT_MAX_PAIRS) {
        if (!c->gave_up) {
            c->gave_up = 1;
            report(c, "", "not-checked", "more than %d subschema pairs to compare",
                   COMPAT_MAX_PAIRS);
        }
        return 0;
    }
    if (2 * (c->nseen + 1) > c->cap_seen) {
        size_t ncap = c->cap_seen ? 2 * c->cap_seen : 64;
        struct compat_pair *t = calloc(ncap, sizeof *t);
        if (!t) {
            c->rc = HUB_ENOMEM;
            return 0;
        }
        for (size_t i = 0; i < c->cap_seen; i++) {
            if (c->seen[i].old) {
                pair_put(t, ncap, c->seen[i].old, c->seen[i].new_);
            }
        }
        free(c->seen);
        c->seen = t;
        c->cap_seen = ncap;
    }
    pair_put(c->seen, c->cap_seen, o, n);
    c->nseen++;
    return 1;
}

/* The `type` of s as enum js_type bits, "any type" when absent; integer
 * is a part of number. */
static unsigned types_of(const json_t *s) {
    static const char *const names[] = {"null",   "boolean", "object", "array",
                                        "number", "string",  "integer"};
    const json_t *t = json_object_get(s, "type");
    if (!t) {
        return 0x7f;
    }
    unsigned bits = 0;
    for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
        const char *name = json_string_value(json_is_array(t) ? json_array_get(t, i) : t);
        for (unsigned k = 0; name && k < 7; k++) {
            bits |= strcmp(name, names[k]) == 0 ? 1u << k : 0;
        }
    }
    if (bits & JS_T_NUMBER) {
        bits |= JS_T_INTEGER;
    }
    return bits;
}

/* An effective bound from a value keyword and its exclusive twin. */
struct bound {
    int set;
    double v;
    int exclusive;
};

/* The effective bound of s from incl ("maximum") and excl
 * ("exclusiveMaximum"): both may be present, and the tighter one applies. */
static struct bound bound_of(const json_t *s, const char *incl, const char *excl, int upper) {
    struct bound b = {0};
    const json_t *i = json_object_get(s, incl), *e = json_object_get(s, excl);
    if (json_is_number(i)) {
        b = (struct bound){1, json_number_value(i), 0};
    }
    if (json_is_number(e)) {
        double v = json_number_value(e);
        /* the tighter of the two applies */
        if (!b.set || (upper ? v <= b.v : v >= b.v)) {
            b = (struct bound){1, v, 1};
        }
    }
    return b;
}

/* 1 when bound n admits less than bound o (upper: lower maximum). */
static int bound_narrower(struct bound o, struct bound n, int upper) {
    if (!n.set) {
        return 0;
    }
    if (!o.set) {
        return 1;
    }
    if (n.v != o.v) {
        return upper ? n.v < o.v : n.v > o.v;
    }
    return n.exclusive && !o.exclusive;
}

static void compare(struct compat *c, const json_t *o, const json_t *n, const char *ptr,
                    const char *optr);
static void compare_schema(struct compat *c, const json_t *o, const json_t *n, const char *ptr,
                           const char *optr);

/* Compares o[key] with n[key] when both exist. */
static void compare_member(struct compat *c, const json_t *o, const json_t *n, const char *key,
                           const char *ptr, const char *optr) {
    const json_t *ov = json_object_get(o, key), *nv = json_object_get(n, key);
    if (!ov || !nv) {
        return;
    }
    char *p = js_ptr_join(ptr, key, strlen(key));
    char *op = js_ptr_join(optr, key, strlen(key));
    if (p && op) {
        compare(c, ov, nv, p, op);
    } else {
        c->rc = HUB_ENOMEM;
    }
    free(p);
    free(op);
}

/* 1 when the subschema s accepts everything (absent, true or {}). */
static int accepts_all(const json_t *s) {
    return !s || json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0);
}

/* The numeric and count bounds, multipleOf, uniqueItems. */
static void compare_bounds(struct compat *c, const json_t *o, const json_t *n, const char *ptr) {
    static const struct {
        const char *incl, *excl;
        int upper;
    } pairs[] = {{"maximum", "exclusiveMaximum", 1},
                 {"minimum", "exclusiveMinimum", 0},
                 {"maxLength", NULL, 1},
                 {"minLength", NULL, 0},
                 {"maxItems", NULL, 1},
                 {"minItems", NULL, 0},
                 {"maxProperties", NULL, 1},
                 {"minProperties", NULL, 0}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        const char *ex = pairs[i].excl ? pairs[i].excl : "";
        struct bound ob = bound_of(o, pairs[i].incl, ex, pairs[i].upper);
        struct bound nb = bound_of(n, pairs[i].incl, ex, pairs[i].upper);
        if (bound_narrower(ob, nb, pairs[i].upper)) {
            const char *kw = nb.exclusive ? ex : pairs[i].incl;
            report_kw(c, ptr, kw, "bound-narrowed", "%s %.17g %s than %s", kw, nb.v,
                      pairs[i].upper ? "is lower" : "is higher",
                      ob.set ? "before" : "no bound before");
        }
    }
    const json_t *om = json_object_get(o, "multipleOf"), *nm = json_object_get(n, "multipleOf");
    if (json_is_number(nm)) {
        /* every multiple of the old step must stay a multiple of the new one */
        double q = json_is_number(om) ? json_number_value(om) / json_number_value(nm) : NAN;
        if (!isfinite(q) || fabs(q - nearbyint(q)) > 1e-9 * fmax(1.0, fabs(q))) {
            report_kw(c, ptr, "multipleOf", "bound-narrowed", "multipleOf %.17g %s",
                      json_number_value(nm),
                      json_is_number(om) ? "does not divide the old step" : "added");
        }
    }
    if (json_is_true(json_object_get(n, "uniqueItems")) &&
        !json_is_true(json_object_get(o, "uniqueItems"))) {
        report_kw(c, ptr, "uniqueItems", "uniqueItems-added", "uniqueItems added");
    }
}

/* A hash of v that values js_equal calls equal share: numbers by their
 * value (1 and 1.0 alike), objects whatever the order of their members. */
static uint64_t value_hash(const json_t *v) {
    uint64_t h = HUB_FNV1A_BASIS;
    const char *k;
    json_t *e;
    size_t i;

    switch (json_typeof(v)) {
    case JSON_INTEGER:
    case JSON_REAL: {
        double d = json_number_value(v);
        d = d == 0 ? 0 : d; /* -0 is 0 */
        return hub_fnv1a(h ^ 'n', &d, sizeof d);
    }
    case JSON_STRING:
        return hub_fnv1a(h ^ 's', json_string_value(v), json_string_length(v));
    case JSON_ARRAY:
        h ^= 'a';
        json_array_foreach(v, i, e) {
            uint64_t x = value_hash(e);
            h = hub_fnv1a(h, &x, sizeof x);
        }
        return h;
    case JSON_OBJECT: {
        uint64_t sum = 0;
        json_object_foreach((json_t *)v, k, e) {
            uint64_t x = value_hash(e);
            sum += hub_fnv1a(hub_fnv1a_str(k), &x, sizeof x); /* a sum: any order */
        }
        return hub_fnv1a(h ^ 'o', &sum, sizeof sum);
    }
    default:
        return h ^ (uint64_t)json_typeof(v); /* true, false, null */
    }
}

/* 1 when every value of the array old is among the values of the array new
 * (js_equal).  The new values go in a hash table first: comparing every
 * pair of two enums of 100,000 values took a minute, with every other
 * registration of the process waiting behind it. */
static int enum_kept(const json_t *old, const json_t *new) {
    size_t n = json_array_size(new), cap = 16;
    int kept = 1;

    while (cap < 2 * n) {
        cap *= 2;
    }
    struct slot {
        uint64_t h;
        const json_t *v; /* NULL: empty */
    } *t = calloc(cap, sizeof *t);
    if (t == NULL) {
        return 0; /* out of memory: reported as narrowed, which only refuses */
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(new, i);
        uint64_t h = value_hash(v);
        size_t at = h & (cap - 1);
        /* a value already there is not added again: repeats of one value
         * would make one long run of slots to probe */
        while (t[at].v != NULL && !(t[at].h == h && js_equal(v, t[at].v))) {
            at = (at + 1) & (cap - 1);
        }
        if (t[at].v == NULL) {
            t[at] = (struct slot){h, v};
        }
    }
    for (size_t i = 0; kept && i < json_array_size(old); i++) {
        const json_t *v = json_array_get(old, i);
        uint64_t h = value_hash(v);
        size_t at = h & (cap - 1);
        kept = 0;
        for (; !kept && t[at].v != NULL; at = (at + 1) & (cap - 1)) {
            kept = t[at].h == h && js_equal(v, t[at].v);
        }
    }
    free(t);
    return kept;
}

/* type, enum, const, pattern, format. */
static void compare_values(struct compat *c, const json_t *o, const json_t *n, const char *ptr) {
    unsigned ot = types_of(o), nt = types_of(n);
    if (ot & ~nt) {
        report_kw(c, ptr, "type", "type-narrowed", "type no longer admits what it admitted before");
    }
    const json_t *oe = json_object_get(o, "enum"), *ne = json_object_get(n, "enum");
    if (json_is_array(ne)) {
        if (!json_is_array(oe) || !enum_kept(oe, ne)) {
            report_kw(c, ptr, "enum", "enum-narrowed",
                      json_is_array(oe) ? "enum lost a value it had" : "enum added");
        }
    }
    const json_t *oc = json_object_get(o, "const"), *nc = json_object_get(n, "const");
    if (nc && !(oc && js_equal(oc, nc))) {
        report_kw(c, ptr, "const", "const-changed", oc ? "const changed" : "const added");
    }
    static const char *const text_kw[] = {"pattern", "format"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *ov = json_object_get(o, text_kw[i]), *nv = json_object_get(n, text_kw[i]);
        if (i == 1 && js_format_parse(json_string_value(nv)) == JS_FMT_NONE) {
            continue; /* formats other than the three asserting ones are annotations */
        }
        if (json_is_string(nv) && !(json_is_string(ov) && json_equal(ov, nv))) {
            char *p = js_ptr_join(ptr, text_kw[i], strlen(text_kw[i]));
            /* regex inclusion is undecidable here: any new or changed pattern counts */
            report(c, p ? p : ptr, i == 0 ? "pattern-narrowed" : "format-added", "%s %s",
                   text_kw[i], ov ? "changed" : "added");
            free(p);
        }
    }
}

/* Compares what o admitted for an undeclared member (rest_o: old
 * additionalProperties or additionalItems) with what n now asks of it. */
static void compare_rest(struct compat *c, const json_t *rest_o, const json_t *rest_n,
                         const char *ptr, const char *optr, const char *kw) {
    if (!rest_n || json_is_false(rest_o)) {
        return; /* new admits anything, or old admitted nothing */
    }
    char *p = js_ptr_join(ptr, kw, strlen(kw));
    char *op = js_ptr_join(optr, kw, strlen(kw));
    if (!p || !op) {
        c->rc = HUB_ENOMEM;
    } else if (!rest_o) {
        if (!accepts_all(rest_n)) {
            report(c, p, "additional-tightened", "%s %s", kw,
                   json_is_false(rest_n) ? "now false" : "now constrained");
        }
    } else {
        compare(c, rest_o, rest_n, p, op);
    }
    free(p);
    free(op);
}

/* required, properties, patternProperties, additionalProperties,
 * dependencies, propertyNames. */
static void compare_object(struct compat *c, const json_t *o, const json_t *n, const char *ptr,
                           const char *optr) {
    const json_t *oreq = json_object_get(o, "required"), *nreq = json_object_get(n, "required");
    for (size_t i = 0; i < json_array_size(nreq); i++) {
        const json_t *name = json_array_get(nreq, i);
        int had = 0;
        for (size_t k = 0; !had && k < json_array_size(oreq); k++) {
            had = json_equal(name, json_array_get(oreq, k));
        }
        if (!had) {
            char *rp = js_ptr_join(ptr, "required", 8);
            char *ip = rp ? js_ptr_index(rp, i) : NULL;
            report(c, ip ? ip : ptr, "required-added", "property \"%s\" is now required",
                   json_string_value(name) ? json_string_value(name) : "?");
            free(rp);
            free(ip);
        }
    }
    const json_t *oprops = json_object_get(o, "properties"),
                 *nprops = json_object_get(n, "properties");
    const json_t *oadd = json_object_get(o, "additionalProperties");
    const char *k;
    size_t klen;
    json_t *v;
    char *pp = js_ptr_join(ptr, "properties", 10), *opp = js_ptr_join(optr, "properties", 10);
    if (!pp || !opp) {
        c->rc = HUB_ENOMEM;
        goto out;
    }
    /* every property the old version declared: gone is breaking (consumers
     * rely on it), kept is compared recursively (retyped, narrowed) */
    json_object_keylen_foreach((json_t *)oprops, k, klen, v) {
        char *op = js_ptr_join(opp, k, klen), *p = js_ptr_join(pp, k, klen);
        const json_t *nv = json_object_getn(nprops, k, klen);
        if (!op || !p) {
            c->rc = HUB_ENOMEM;
        } else if (!nv) {
            report(c, op, "property-removed", "property \"%.*s\" was removed", (int)klen, k);
        } else {
            compare(c, v, nv, p, op);
        }
        free(op);
        free(p);
    }
    json_object_keylen_foreach((json_t *)nprops, k, klen, v) {
        if (json_object_getn(oprops, k, klen) || !oadd || json_is_false(oadd)) {
            /* declared before; or a new optional property where the old schema
             * admitted any member (accepted: evolution adds fields) or none */
            continue;
        }
        /* the old schema admitted this name through additionalProperties */
        char *p = js_ptr_join(pp, k, klen);
        char *op = js_ptr_join(optr, "additionalProperties", 20);
        if (p && op) {
            compare(c, oadd, v, p, op);
        } else {
            c->rc = HUB_ENOMEM;
        }
        free(p);
        free(op);
    }
    const json_t *opat = json_object_get(o, "patternProperties"),
                 *npat = json_object_get(n, "patternProperties");
    /* patternProperties are matched by their source text: the same regex
     * is compared, a new constrained one is reported (what it matches in
     * old payloads cannot be known here) */
    json_object_keylen_foreach((json_t *)npat, k, klen, v) {
        const json_t *ov = json_object_getn(opat, k, klen);
        char *p = js_ptr_join(ptr, "patternProperties", 17);
        char *kp = p ? js_ptr_join(p, k, klen) : NULL;
        char *op = js_ptr_join(optr, "patternProperties", 17);
        char *okp = op ? js_ptr_join(op, k, klen) : NULL;
        if (!kp || !okp) {
            c->rc = HUB_ENOMEM;
        } else if (ov) {
            compare(c, ov, v, kp, okp);
        } else if (!accepts_all(v)) {
            report(c, kp, "patternProperties-added", "a new constrained pattern property");
        }
        free(p);
        free(kp);
        free(op);
        free(okp);
    }
    compare_rest(c, oadd, json_object_get(n, "additionalProperties"), ptr, optr,
                 "additionalProperties");
    const json_t *odep = json_object_get(o, "dependencies"),
                 *ndep = json_object_get(n, "dependencies");
    /* a dependency list may only lose names; a dependency schema is
     * compared; anything new, or a list turned schema, is reported */
    json_object_keylen_foreach((json_t *)ndep, k, klen, v) {
        const json_t *ov = json_object_getn(odep, k, klen);
        if (ov && json_is_array(ov) && json_is_array(v)) {
            int wider = 0;
            for (size_t i = 0; i < json_array_size(v) && !wider; i++) {
                int had = 0;
                for (size_t j = 0; !had && j < json_array_size(ov); j++) {
                    had = json_equal(json_array_get(v, i), json_array_get(ov, j));
                }
                wider = !had;
            }
            if (!wider) {
                continue;
            }
        } else if (ov && !json_is_array(ov) && !json_is_array(v)) {
            char *p = js_ptr_join(ptr, "dependencies", 12),
                 *op = js_ptr_join(optr, "dependencies", 12);
            char *kp = p ? js_ptr_join(p, k, klen) : NULL,
                 *okp = op ? js_ptr_join(op, k, klen) : NULL;
            if (kp && okp) {
                compare(c, ov, v, kp, okp);
            } else {
                c->rc = HUB_ENOMEM;
            }
            free(p);
            free(op);
            free(kp);
            free(okp);
            continue;
        }
        char *p = js_ptr_join(ptr, "dependencies", 12);
        char *kp = p ? js_ptr_join(p, k, klen) : NULL;
        report(c, kp ? kp : ptr, "dependency-added", "dependency of \"%.*s\" added or extended",
               (int)klen, k);
        free(p);
        free(kp);
    }
    const json_t *onames = json_object_get(o, "propertyNames");
    if (onames) {
        compare_member(c, o, n, "propertyNames", ptr, optr);
    } else if (!accepts_all(json_object_get(n, "propertyNames"))) {
        report_kw(c, ptr, "propertyNames", "propertyNames-added", "propertyNames added");
    }
out:
    free(pp);
    free(opp);
}

/* items (one schema or positional), additionalItems, contains. */
static void compare_array(struct compat *c, const json_t *o, const json_t *n, const char *ptr,
                          const char *optr) {
    const json_t *oi = json_object_get(o, "items"), *ni = json_object_get(n, "items");
    if (!json_is_array(oi) && !json_is_array(ni)) {
        if (oi) {
            compare_member(c, o, n, "items", ptr, optr);
        } else if (!accepts_all(ni)) {
            report_kw(c, ptr, "items", "items-added", "items now constrained");
        }
    } else if (json_is_array(oi) && json_is_array(ni)) {
        /* positional items: position i of the new list against position i
         * of the old one, or against old additionalItems past its end */
        char *p = js_ptr_join(ptr, "items", 5), *op = js_ptr_join(optr, "items", 5);
        for (size_t i = 0; p && op && i < json_array_size(ni); i++) {
            char *ip = js_ptr_index(p, i), *oip = js_ptr_index(op, i);
            const json_t *ov = json_array_get(oi, i);
            const json_t *oadd = json_object_get(o, "additionalItems");
            if (ip && oip) {
                if (ov) {
                    compare(c, ov, json_array_get(ni, i), ip, oip);
                } else if (oadd) {
                    compare(c, oadd, json_array_get(ni, i), ip, oip);
                } else if (!accepts_all(json_array_get(ni, i))) {
                    report(c, ip, "items-added", "item %zu now constrained", i);
                }
            }
            free(ip);
            free(oip);
        }
        free(p);
        free(op);
        /* a longer new list already compared its extra positions against the
         * old additionalItems; otherwise the two additionalItems compare */
        if (json_array_size(ni) <= json_array_size(oi)) {
            compare_rest(c, json_object_get(o, "additionalItems"),
                         json_object_get(n, "additionalItems"), ptr, optr, "additionalItems");
        }
    } else if (!json_equal(oi, ni)) {
        report_kw(c, ptr, "items", "items-changed", "items changed between one schema and a list");
    }
    if (json_object_get(o, "contains")) {
        compare_member(c, o, n, "contains", ptr, optr);
    } else if (json_object_get(n, "contains")) {
        report_kw(c, ptr, "contains", "contains-added", "contains added");
    }
}

/* allOf (pairwise; a new member narrows), anyOf/oneOf (pairwise when the
 * count is kept), not and if/then/else (any change counts). */
static void compare_logic(struct compat *c, const json_t *o, const json_t *n, const char *ptr,
                          const char *optr) {
    static const char *const lists[] = {"allOf", "anyOf", "oneOf"};
    for (size_t i = 0; i < 3; i++) {
        const json_t *ol = json_object_get(o, lists[i]), *nl = json_object_get(n, lists[i]);
        if (!nl || json_equal(ol, nl)) {
            continue;
        }
        size_t on = json_array_size(ol), nn = json_array_size(nl);
        char *p = js_ptr_join(ptr, lists[i], strlen(lists[i]));
        char *op = js_ptr_join(optr, lists[i], strlen(lists[i]));
        if (!p || !op) {
            c->rc = HUB_ENOMEM;
        } else if (i == 0 || on == nn) {
            for (size_t k = 0; k < nn; k++) {
                char *ip = js_ptr_index(p, k), *oip = js_ptr_index(op, k);
                if (ip && oip && k < on) {
                    compare(c, json_array_get(ol, k), json_array_get(nl, k), ip, oip);
                } else if (ip && !accepts_all(json_array_get(nl, k))) {
                    report(c, ip, "allOf-added", "a new allOf member");
                }
                free(ip);
                free(oip);
            }
        } else {
            report(c, p, i == 1 ? "anyOf-changed" : "oneOf-changed",
                   "%s members changed in number (%zu to %zu)", lists[i], on, nn);
        }
        free(p);
        free(op);
    }
    static const char *const opaque[] = {"not", "if", "then", "else"};
    for (size_t i = 0; i < 4; i++) {
        const json_t *ov = json_object_get(o, opaque[i]), *nv = json_object_get(n, opaque[i]);
        if (nv && !(ov && js_equal(ov, nv))) {
            report_kw(c, ptr, opaque[i], "conditional-changed", "%s %s (not analysed)", opaque[i],
                      ov ? "changed" : "added");
        }
    }
}

/*
 * Reports what makes n (at ptr in the new document) reject a value o (at
 * optr in the old one) accepted.
 */
static void compare(struct compat *c, const json_t *o, const json_t *n, const char *ptr,
                    const char *optr) {
    if (c->rc) {
        return;
    }
    o = deref(c->old_root, o);
    n = deref(c->new_root, n);
    /* nothing old accepted can break, nothing breaks a schema that accepts
     * all, and a pair seen before (a recursive schema) is done */
    if (json_is_false(o) || accepts_all(n) || !first_visit(c, o, n)) {
        return;
    }
    /* what cannot be compared is reported, so registration refuses rather
     * than accepts it unchecked (a compiled schema never nests this deep) */
    if (c->depth >= COMPAT_MAX_DEPTH) {
        report(c, ptr, "not-checked", "nested too deeply to compare");
        return;
    }
    c->depth++;
    compare_schema(c, o, n, ptr, optr);
    c->depth--;
}

/* The comparison of two subschemas compare has dereferenced and not seen
 * before. */
static void compare_schema(struct compat *c, const json_t *o, const json_t *n, const char *ptr,
                           const char *optr) {
    if (json_is_false(n)) {
        report(c, ptr, "schema-false", "the schema is now false");
        return;
    }
    if (!json_is_object(n)) {
        return;
    }
    if (!json_is_object(o)) {
        /* true: compare against an empty schema (every keyword is new) */
        o = c->empty;
    }
    const char *oref = json_string_value(json_object_get(o, "$ref"));
    const char *nref = json_string_value(json_object_get(n, "$ref"));
    if ((oref || nref) && !(oref && nref && strcmp(oref, nref) == 0)) {
        report_kw(c, ptr, "$ref", "ref-changed", "a $ref the check cannot follow changed");
        return;
    }
    compare_values(c, o, n, ptr);
    compare_bounds(c, o, n, ptr);
    compare_object(c, o, n, ptr, optr);
    compare_array(c, o, n, ptr, optr);
    compare_logic(c, o, n, ptr, optr);
}

/* Walks both documents from their roots; each reported change is an
 * object the caller owns through *changes. */
int hub_jschema_compat(const json_t *old_schema, const json_t *new_schema, json_t **changes) {
    *changes = NULL;
    if ((!json_is_object(old_schema) && !json_is_boolean(old_schema)) ||
        (!json_is_object(new_schema) && !json_is_boolean(new_schema))) {
        return HUB_EINVAL;
    }
    struct compat c = {.old_root = old_schema,
                       .new_root = new_schema,
                       .changes = json_array(),
                       .empty = json_object()};
    if (!c.changes || !c.empty) {
        json_decref(c.changes);
        json_decref(c.empty);
        return HUB_ENOMEM;
    }
    compare(&c, old_schema, new_schema, "", "");
    free(c.seen);
    json_decref(c.empty);
    if (c.rc) {
        json_decref(c.changes);
        return c.rc;
    }
    *changes = c.changes;
    return 0;
}
