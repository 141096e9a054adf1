/*
 * jschema — compiling a draft-07 schema into js_node graphs (jschema_int.h).
 *
 * Compile runs in three passes over a private deep copy of the document:
 * the meta-schema check (the document must itself be a valid draft-07
 * schema; its first error names the pointer), a walk that records every
 * subschema's location (base URI and JSON pointer) and every `$id`, and the
 * build of the nodes, which resolves `$ref`s through those records.  The
 * node of a location is made once and shared by every `$ref` to it, so a
 * recursive schema is a cyclic graph, not an infinite tree.
 */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jschema_int.h"
#include "util.h"

/*
 * The defaults are sized for event payloads of up to about 1 MiB checked
 * on worker threads: 1,000,000 steps is roughly 0.1 s of CPU at worst, and a
 * 1 KiB object of ten properties needs about 30 (tests/unit/test_jschema.c).
 */
void hub_jschema_limits_default(struct hub_jschema_limits *l) {
    l->max_schema_nodes = 10000;
    l->max_schema_bytes = 1 << 20;
    l->max_pattern_bytes = 4096;
    l->max_depth = 64;
    l->max_steps = 1000000;
    l->regex_match_limit = 100000;
    l->regex_depth_limit = 1000;
    l->max_errors = 8;
    /* a pattern compiles in microseconds to a few KiB; these bound a
     * schema written to make the compile itself the attack (thousands of
     * nested quantifiers: seconds of CPU and hundreds of MiB of JIT code) */
    l->max_patterns = 256;
    l->max_regex_bytes = 4 << 20;
}

/* A subschema location: where it is and which base URI applies in it. */
/*
 * The walk records one per subschema, keyed by the json_t address in the
 * compiled copy: the node builder then finds a `$ref` target's base URI
 * and pointer, and its node if already built, in constant time.
 */
struct js_loc {
    const json_t *json; /* NULL: empty slot */
    char *base;         /* absolute URI without fragment ("" for an anonymous root) */
    char *ptr;          /* JSON pointer from the document root */
    struct js_node *node;
};

/* A `$id`: an absolute URI (with a fragment for a plain-name anchor). */
struct js_res {
    char *uri;
    const json_t *json;
};

/* The state of one compile. */
/*
 * Everything a compile needs besides the result: the location table, the
 * `$id`s, and the first error (later failures, consequences of the first,
 * do not overwrite it).  Freed before the compile returns.
 */
struct js_cc {
    struct hub_jschema *s;
    struct hub_jschema_error *err;
    struct js_loc *locs; /* open addressing on the json_t address */
    size_t cap_locs, nlocs;
    struct js_res *res;
    size_t nres, cap_res;
    unsigned depth;     /* nested compile_at calls: nesting plus chains of $refs */
    size_t npatterns;   /* regexes compiled so far */
    size_t regex_bytes; /* their compiled and JIT code, in bytes */
    int rc;
};

/* Records the first error of a compile (later ones are consequences). */
static int cc_fail(struct js_cc *cc, int rc, const char *ptr, const char *fmt, ...) {
    if (cc->rc == 0) {
        cc->rc = rc;
        if (cc->err) {
            snprintf(cc->err->pointer, sizeof cc->err->pointer, "%s", ptr ? ptr : "");
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(cc->err->message, sizeof cc->err->message, fmt, ap);
            va_end(ap);
        }
    }
    return rc;
}

char *js_ptr_join(const char *base, const char *seg, size_t seglen) {
    size_t bl = strlen(base), extra = 0;
    for (size_t i = 0; i < seglen; i++) {
        extra += seg[i] == '~' || seg[i] == '/';
    }
    char *p = malloc(bl + 1 + seglen + extra + 1);
    if (!p) {
        return NULL;
    }
    memcpy(p, base, bl);
    size_t o = bl;
    p[o++] = '/';
    for (size_t i = 0; i < seglen; i++) {
        if (seg[i] == '~' || seg[i] == '/') {
            p[o++] = '~';
            p[o++] = seg[i] == '~' ? '0' : '1';
        } else {
            p[o++] = seg[i];
        }
    }
    p[o] = '\0';
    return p;
}

char *js_ptr_index(const char *base, size_t i) {
    char num[24];
    int n = snprintf(num, sizeof num, "%zu", i);
    return js_ptr_join(base, num, (size_t)n);
}

/*
 * The slot of j in a table of cap (a power of two) slots: the address,
 * mixed so that neighbouring allocations do not cluster.
 */
static size_t loc_hash(const json_t *j, size_t cap) {
    uintptr_t h = (uintptr_t)j;
    h ^= h >> 17;
    h *= (uintptr_t)0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

/* The recorded location of the subschema j, or NULL (probes until an
 * empty slot; the table is never more than half full). */
static struct js_loc *loc_find(struct js_cc *cc, const json_t *j) {
    if (cc->cap_locs == 0) {
        return NULL;
    }
    for (size_t i = loc_hash(j, cc->cap_locs);; i = (i + 1) & (cc->cap_locs - 1)) {
        if (cc->locs[i].json == j) {
            return &cc->locs[i];
        }
        if (cc->locs[i].json == NULL) {
            return NULL;
        }
    }
}

/*
 * Adds the location of j (base and ptr are copied), or returns the one it
 * has.  NULL on allocation failure or when the document has more
 * subschemas than the limit (cc->rc says which).
 */
static struct js_loc *loc_add(struct js_cc *cc, const json_t *j, const char *base,
                              const char *ptr) {
    struct js_loc *l = loc_find(cc, j);
    if (l) {
        return l;
    }
    if (cc->nlocs >= cc->s->limits.max_schema_nodes) {
        cc_fail(cc, HUB_ERANGE, ptr, "more than %zu subschemas", cc->s->limits.max_schema_nodes);
        return NULL;
    }
    if (2 * (cc->nlocs + 1) > cc->cap_locs) {
        /* grow at half full so probes stay short */
        size_t ncap = cc->cap_locs ? 2 * cc->cap_locs : 64;
        struct js_loc *n = calloc(ncap, sizeof *n);
        if (!n) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return NULL;
        }
        for (size_t i = 0; i < cc->cap_locs; i++) {
            if (cc->locs[i].json) {
                size_t k = loc_hash(cc->locs[i].json, ncap);
                while (n[k].json) {
                    k = (k + 1) & (ncap - 1);
                }
                n[k] = cc->locs[i];
            }
        }
        free(cc->locs);
        cc->locs = n;
        cc->cap_locs = ncap;
    }
    size_t k = loc_hash(j, cc->cap_locs);
    while (cc->locs[k].json) {
        k = (k + 1) & (cc->cap_locs - 1);
    }
    l = &cc->locs[k];
    l->base = strdup(base);
    l->ptr = strdup(ptr);
    if (!l->base || !l->ptr) {
        free(l->base);
        free(l->ptr);
        l->base = l->ptr = NULL;
        cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
        return NULL;
    }
    l->json = j;
    cc->nlocs++;
    return l;
}

/* Registers a `$id`: uri (copied) names the subschema j.  Returns 0 or
 * HUB_ENOMEM (recorded in cc). */
static int res_add(struct js_cc *cc, const char *uri, const json_t *j) {
    if (cc->nres == cc->cap_res) {
        size_t ncap = cc->cap_res ? 2 * cc->cap_res : 8;
        struct js_res *n = realloc(cc->res, ncap * sizeof *n);
        if (!n) {
            return cc_fail(cc, HUB_ENOMEM, "", "out of memory");
        }
        cc->res = n;
        cc->cap_res = ncap;
    }
    char *u = strdup(uri);
    if (!u) {
        return cc_fail(cc, HUB_ENOMEM, "", "out of memory");
    }
    cc->res[cc->nres].uri = u;
    cc->res[cc->nres].json = j;
    cc->nres++;
    return 0;
}

/* The subschema registered under the absolute URI uri (with a "#name"
 * fragment for an anchor), or NULL.  A linear scan: documents have few
 * `$id`s, and this runs only at compile time. */
static const json_t *res_find(struct js_cc *cc, const char *uri) {
    for (size_t i = 0; i < cc->nres; i++) {
        if (strcmp(cc->res[i].uri, uri) == 0) {
            return cc->res[i].json;
        }
    }
    return NULL;
}

/* The length of the scheme of u ("http" in "http://"), 0 when it has none:
 * letters first, then up to a ':' before any '/', '?' or '#' (RFC 3986 §3.1,
 * loosely: this only tells absolute references from relative ones). */
static size_t uri_scheme_len(const char *u) {
    size_t i = 0;
    if (!((u[0] >= 'a' && u[0] <= 'z') || (u[0] >= 'A' && u[0] <= 'Z'))) {
        return 0;
    }
    while (u[i] && u[i] != ':' && u[i] != '/' && u[i] != '?' && u[i] != '#') {
        i++;
    }
    return u[i] == ':' ? i : 0;
}

/*
 * Resolves reference ref against base (RFC 3986 §5.2, without dot-segment
 * removal, which no local reference needs).  Returns owned text or NULL.
 */
static char *uri_resolve(const char *base, const char *ref) {
    size_t bl = strcspn(base, "#"); /* the base never carries a fragment */
    char *out;
    if (uri_scheme_len(ref) > 0) {
        return strdup(ref);
    }
    if (ref[0] == '\0' || ref[0] == '#') {
        out = malloc(bl + strlen(ref) + 1);
        if (out) {
            memcpy(out, base, bl);
            strcpy(out + bl, ref);
        }
        return out;
    }
    size_t keep;
    size_t sl = uri_scheme_len(base);
    if (ref[0] == '/' && ref[1] == '/') {
        keep = sl ? sl + 1 : 0;
    } else if (ref[0] == '/') {
        /* keep scheme://authority */
        keep = sl;
        if (sl && base[sl + 1] == '/' && base[sl + 2] == '/') {
            keep = sl + 3 + strcspn(base + sl + 3, "/?#");
        } else if (sl) {
            keep = sl + 1;
        }
    } else {
        /* keep the base up to its last '/' */
        keep = 0;
        for (size_t i = 0; i < bl && base[i] != '?'; i++) {
            if (base[i] == '/') {
                keep = i + 1;
            }
        }
    }
    out = malloc(keep + strlen(ref) + 1);
    if (out) {
        memcpy(out, base, keep);
        strcpy(out + keep, ref);
    }
    return out;
}

/* Decodes %XX escapes of a URI fragment in place. */
static void uri_unescape(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        int hi, lo;
        if (p[0] == '%' && (hi = hub_hex_value((unsigned char)p[1])) >= 0 &&
            (lo = hub_hex_value((unsigned char)p[2])) >= 0) {
            *o++ = (char)(hi * 16 + lo);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

/*
 * Where subschemas live in a draft-07 document: the walk descends only
 * through these, so a `$id` or a location inside `enum`, `const`,
 * `default` or an unknown keyword is not a schema location (a `$ref` may
 * still point there; compile_at walks such a target on demand).
 */
/* Keywords whose value is one subschema; items is handled apart. */
static const char *const kw_single[] = {
    "additionalItems",
    "additionalProperties",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
};
/* Keywords whose value is an object of subschemas. */
static const char *const kw_map[] = {"definitions", "properties", "patternProperties",
                                     "dependencies"};
/* Keywords whose value is an array of subschemas. */
static const char *const kw_list[] = {"allOf", "anyOf", "oneOf", "items"};

static void walk(struct js_cc *cc, const json_t *j, const char *base, const char *ptr);

/* Walks the subschema at j[key] (a member of a schema at ptr). */
static void walk_member(struct js_cc *cc, const json_t *j, const char *key, const char *base,
                        const char *ptr) {
    const json_t *v = json_object_get(j, key);
    if (!v) {
        return;
    }
    char *p = js_ptr_join(ptr, key, strlen(key));
    if (!p) {
        cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
        return;
    }
    walk(cc, v, base, p);
    free(p);
}

/*
 * Records the location of the subschema j (base URI and pointer) and of
 * every subschema under it, and registers each `$id` (a `$id` beside a
 * `$ref` is ignored, as draft-07 ignores every sibling of `$ref`).
 */
static void walk(struct js_cc *cc, const json_t *j, const char *base, const char *ptr) {
    if (cc->rc || !(json_is_object(j) || json_is_boolean(j)) || loc_find(cc, j)) {
        return;
    }
    if (!loc_add(cc, j, base, ptr) || !json_is_object(j)) {
        return;
    }
    char *own = NULL;
    const json_t *id = json_object_get(j, "$id");
    /* a `$id` changes the base URI of everything below it and registers
     * this subschema under the resolved URI (and "#name" anchors) */
    if (json_is_string(id) && !json_object_get(j, "$ref")) {
        own = uri_resolve(base, json_string_value(id));
        if (!own) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return;
        }
        char *hash = strchr(own, '#');
        if (hash && hash[1]) {
            /* a plain-name anchor: "#foo" names this subschema */
            res_add(cc, own, j);
        }
        if (hash) {
            *hash = '\0';
        }
        if (!hash || !hash[1] || strcmp(own, base) != 0) {
            res_add(cc, own, j);
        }
        struct js_loc *l = loc_find(cc, j);
        char *b = strdup(own);
        if (!b) {
            free(own);
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return;
        }
        free(l->base);
        l->base = b;
        base = own;
    }
    for (size_t i = 0; i < sizeof kw_single / sizeof *kw_single; i++) {
        walk_member(cc, j, kw_single[i], base, ptr);
    }
    const json_t *items = json_object_get(j, "items");
    if (items && !json_is_array(items)) {
        walk_member(cc, j, "items", base, ptr);
    }
    for (size_t i = 0; i < sizeof kw_map / sizeof *kw_map; i++) {
        const json_t *m = json_object_get(j, kw_map[i]);
        if (!json_is_object(m)) {
            continue;
        }
        char *mp = js_ptr_join(ptr, kw_map[i], strlen(kw_map[i]));
        if (!mp) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            break;
        }
        const char *k;
        size_t klen;
        json_t *v;
        json_object_keylen_foreach((json_t *)m, k, klen, v) {
            char *p = js_ptr_join(mp, k, klen);
            if (!p) {
                cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
                break;
            }
            walk(cc, v, base, p);
            free(p);
        }
        free(mp);
    }
    for (size_t i = 0; i < sizeof kw_list / sizeof *kw_list; i++) {
        const json_t *a = json_object_get(j, kw_list[i]);
        if (!json_is_array(a)) {
            continue;
        }
        char *ap = js_ptr_join(ptr, kw_list[i], strlen(kw_list[i]));
        if (!ap) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            break;
        }
        for (size_t k = 0; k < json_array_size(a); k++) {
            char *p = js_ptr_index(ap, k);
            if (!p) {
                cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
                break;
            }
            walk(cc, json_array_get(a, k), base, p);
            free(p);
        }
        free(ap);
    }
    free(own);
}

static struct js_node *compile_at(struct js_cc *cc, const json_t *j, const char *base,
                                  const char *ptr);

/* A non-negative count keyword (`maxLength`...) of s: -1 when absent.  The
 * meta-schema has checked it is a non-negative integer, possibly 2.0. */
static long long count_of(const json_t *s, const char *key) {
    const json_t *v = json_object_get(s, key);
    if (json_is_integer(v)) {
        return json_integer_value(v) < 0 ? 0 : json_integer_value(v);
    }
    if (json_is_real(v)) {
        /* the meta-schema admits 2.0 as an integer; clamp what no instance reaches */
        double d = json_real_value(v);
        return d < 0 ? 0 : d >= 9.2e18 ? LLONG_MAX : (long long)d;
    }
    return -1;
}

/* A number keyword of s (borrowed from the compiled copy), or NULL. */
static const json_t *number_of(const json_t *s, const char *key) {
    const json_t *v = json_object_get(s, key);
    return json_is_number(v) ? v : NULL;
}

/*
 * Follows the JSON pointer ptr (already percent-decoded) from doc.
 * Returns the value there (borrowed) or NULL.
 */
static const json_t *pointer_get(const json_t *doc, const char *ptr) {
    const json_t *v = doc;
    while (*ptr == '/' && v) {
        ptr++;
        size_t n = strcspn(ptr, "/");
        char *tok = malloc(n + 1);
        if (!tok) {
            return NULL;
        }
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            if (ptr[i] == '~' && i + 1 < n && (ptr[i + 1] == '0' || ptr[i + 1] == '1')) {
                tok[o++] = ptr[i + 1] == '0' ? '~' : '/';
                i++;
            } else {
                tok[o++] = ptr[i];
            }
        }
        tok[o] = '\0';
        if (json_is_object(v)) {
            v = json_object_getn(v, tok, o);
        } else if (json_is_array(v) && o > 0 && o < 10 && strspn(tok, "0123456789") == o &&
                   (o == 1 || tok[0] != '0')) {
            v = json_array_get(v, (size_t)strtoul(tok, NULL, 10));
        } else {
            v = NULL;
        }
        free(tok);
        ptr += n;
    }
    return *ptr ? NULL : v;
}

const json_t *js_local_ref(const json_t *root, const char *ref) {
    if (ref[0] != '#') {
        return NULL;
    }
    char *frag = strdup(ref + 1);
    if (!frag) {
        return NULL;
    }
    uri_unescape(frag);
    const json_t *t = frag[0] == '\0' || frag[0] == '/' ? pointer_get(root, frag) : NULL;
    free(frag);
    return t;
}

/*
 * Resolves the `$ref` text ref of the subschema at ptr (base URI base) to a
 * node: a subschema of this document, or the built-in meta-schema.  NULL
 * with cc->rc set when it cannot be resolved.
 */
static struct js_node *resolve_ref(struct js_cc *cc, const char *ref, const char *base,
                                   const char *ptr) {
    struct js_node *n = NULL;
    char *where = js_ptr_join(ptr, "$ref", 4);
    char *full = uri_resolve(base, ref);
    char *uri = full ? strdup(full) : NULL;
    if (!where || !full || !uri) {
        cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
        goto out;
    }
    char *hash = strchr(uri, '#');
    char *frag = hash ? hash + 1 : uri + strlen(uri);
    if (hash) {
        *hash = '\0';
    }
    /* "#/a%25b" names the member "a%b": the fragment is URI-escaped first,
     * then a JSON pointer (RFC 6901 §6) */
    uri_unescape(frag);
    const json_t *target = NULL;
    const char *tbase = uri;
    char *tptr = NULL;
    if (frag[0] == '\0' || frag[0] == '/') {
        const json_t *doc = res_find(cc, uri);
        if (!doc) {
            const struct hub_jschema *meta = js_meta_schema();
            if (meta && meta != cc->s && strcmp(uri, JS_META_ID) == 0 && frag[0] == '\0') {
                n = meta->root;
                goto out;
            }
            cc_fail(cc, HUB_EINVAL, where, "cannot resolve $ref \"%s\": only local references",
                    ref);
            goto out;
        }
        target = pointer_get(doc, frag);
        const struct js_loc *dl = loc_find(cc, doc);
        size_t dlen = dl ? strlen(dl->ptr) : 0;
        tptr = malloc(dlen + strlen(frag) + 1);
        if (!tptr) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            goto out;
        }
        memcpy(tptr, dl ? dl->ptr : "", dlen);
        strcpy(tptr + dlen, frag);
    } else {
        /* a plain-name fragment: a `$id` of "#name" registered it whole */
        target = res_find(cc, full);
    }
    if (!target) {
        cc_fail(cc, HUB_EINVAL, where, "cannot resolve $ref \"%s\"", ref);
    } else if (!json_is_object(target) && !json_is_boolean(target)) {
        cc_fail(cc, HUB_EINVAL, where, "$ref \"%s\" is not a schema", ref);
    } else {
        n = compile_at(cc, target, tbase, tptr ? tptr : "");
    }
    free(tptr);
out:
    free(where);
    free(full);
    free(uri);
    return n;
}

/* Compiles the subschema j[key] of the subschema at ptr (base URI base);
 * NULL when absent or on failure (cc->rc tells them apart). */
static struct js_node *child(struct js_cc *cc, const json_t *j, const char *key, const char *base,
                             const char *ptr) {
    const json_t *v = json_object_get(j, key);
    if (!v || cc->rc) {
        return NULL;
    }
    char *p = js_ptr_join(ptr, key, strlen(key));
    if (!p) {
        cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
        return NULL;
    }
    struct js_node *n = compile_at(cc, v, base, p);
    free(p);
    return n;
}

/* Compiles the array of subschemas j[key] into *list (owned by the node,
 * freed by hub_jschema_free); an absent or empty array leaves it empty. */
static void child_list(struct js_cc *cc, const json_t *j, const char *key, const char *base,
                       const char *ptr, struct js_list *list) {
    const json_t *a = json_object_get(j, key);
    size_t n = json_array_size(a);
    if (n == 0 || cc->rc) {
        return;
    }
    char *ap = js_ptr_join(ptr, key, strlen(key));
    list->v = calloc(n, sizeof *list->v);
    if (!ap || !list->v) {
        free(ap);
        cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
        return;
    }
    list->n = n;
    for (size_t i = 0; i < n && !cc->rc; i++) {
        char *p = js_ptr_index(ap, i);
        if (!p) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            break;
        }
        list->v[i] = compile_at(cc, json_array_get(a, i), base, p);
        free(p);
    }
    free(ap);
}

/*
 * Compiles a regex (`pattern`, or a `patternProperties` key) found at
 * where, under the pattern length, count and compiled-size limits.  Returns
 * owned code, or NULL with the error recorded against where.  The limits are
 * checked per pattern so the compile stops at the first one over them;
 * nothing is compiled once the compile has failed.
 */
static pcre2_code *regex_at(struct js_cc *cc, const char *src, size_t len, const char *where) {
    char msg[128];
    const struct hub_jschema_limits *l = &cc->s->limits;
    if (cc->rc) {
        return NULL;
    }
    if (len > l->max_pattern_bytes) {
        cc_fail(cc, HUB_ERANGE, where, "pattern longer than %zu bytes", l->max_pattern_bytes);
        return NULL;
    }
    if (cc->npatterns >= l->max_patterns) {
        cc_fail(cc, HUB_ERANGE, where, "more than %zu patterns in the schema", l->max_patterns);
        return NULL;
    }
    cc->npatterns++;
    pcre2_code *re = js_regex_compile(src, len, msg, sizeof msg);
    if (!re) {
        cc_fail(cc, HUB_EINVAL, where, "invalid pattern: %s", msg);
        return NULL;
    }
    size_t size = 0, jit = 0;
    (void)pcre2_pattern_info(re, PCRE2_INFO_SIZE, &size);
    /* 0 when JIT refused or is unavailable: the interpreter needs no more */
    if (pcre2_pattern_info(re, PCRE2_INFO_JITSIZE, &jit) != 0) {
        jit = 0;
    }
    cc->regex_bytes += size + jit;
    if (cc->regex_bytes > l->max_regex_bytes) {
        cc_fail(cc, HUB_ERANGE, where, "compiled patterns over %zu bytes (%zu so far)",
                l->max_regex_bytes, cc->regex_bytes);
        pcre2_code_free(re);
        return NULL;
    }
    return re;
}

/* Orders `properties` entries by name bytes, then length, the order
 * prop_find in jschema_validate.c searches. */
static int prop_cmp(const void *a, const void *b) {
    const struct js_prop *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* The `type` keyword t (a name or an array of names) as enum js_type
 * bits; 0 when absent, which means any type. */
static unsigned type_bits(const json_t *t) {
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"null", JS_T_NULL},      {"boolean", JS_T_BOOLEAN}, {"object", JS_T_OBJECT},
                 {"array", JS_T_ARRAY},    {"number", JS_T_NUMBER},   {"string", JS_T_STRING},
                 {"integer", JS_T_INTEGER}};
    unsigned bits = 0;
    for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
        const char *s = json_string_value(json_is_array(t) ? json_array_get(t, i) : t);
        for (size_t k = 0; s && k < sizeof names / sizeof *names; k++) {
            if (strcmp(s, names[k].name) == 0) {
                bits |= names[k].bit;
            }
        }
    }
    return bits;
}

/* Compiles `properties` (sorted for binary search), `patternProperties`
 * (each key a regex) and `dependencies` (a schema, or a list of names kept
 * as the borrowed array) of j into n. */
static void compile_object_keywords(struct js_cc *cc, struct js_node *n, const json_t *j,
                                    const char *base, const char *ptr) {
    const char *k;
    size_t klen;
    json_t *v;
    const json_t *props = json_object_get(j, "properties");
    if (json_object_size(props) > 0) {
        n->props = calloc(json_object_size(props), sizeof *n->props);
        if (!n->props) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return;
        }
        char *pp = js_ptr_join(ptr, "properties", 10);
        json_object_keylen_foreach((json_t *)props, k, klen, v) {
            char *p = pp ? js_ptr_join(pp, k, klen) : NULL;
            if (!p) {
                cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
                break;
            }
            n->props[n->nprops++] = (struct js_prop){k, klen, compile_at(cc, v, base, p)};
            free(p);
        }
        free(pp);
        qsort(n->props, n->nprops, sizeof *n->props, prop_cmp);
    }
    const json_t *pprops = json_object_get(j, "patternProperties");
    if (json_object_size(pprops) > 0 && !cc->rc) {
        n->pprops = calloc(json_object_size(pprops), sizeof *n->pprops);
        if (!n->pprops) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return;
        }
        char *pp = js_ptr_join(ptr, "patternProperties", 17);
        json_object_keylen_foreach((json_t *)pprops, k, klen, v) {
            char *p = pp ? js_ptr_join(pp, k, klen) : NULL;
            if (!p) {
                cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
                break;
            }
            struct js_pprop *e = &n->pprops[n->npprops++];
            e->re = regex_at(cc, k, klen, p);
            e->node = e->re ? compile_at(cc, v, base, p) : NULL;
            free(p);
            if (cc->rc) {
                break;
            }
        }
        free(pp);
    }
    const json_t *deps = json_object_get(j, "dependencies");
    if (json_object_size(deps) > 0 && !cc->rc) {
        n->deps = calloc(json_object_size(deps), sizeof *n->deps);
        if (!n->deps) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return;
        }
        char *dp = js_ptr_join(ptr, "dependencies", 12);
        json_object_keylen_foreach((json_t *)deps, k, klen, v) {
            struct js_dep *d = &n->deps[n->ndeps++];
            d->name = k;
            if (json_is_array(v)) {
                d->names = v;
                continue;
            }
            char *p = dp ? js_ptr_join(dp, k, klen) : NULL;
            if (!p) {
                cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
                break;
            }
            d->schema = compile_at(cc, v, base, p);
            free(p);
        }
        free(dp);
    }
}

/* Compiles the keywords of the object schema j (at ptr, base URI base)
 * into n.  Keywords draft-07 does not define are ignored, as the spec
 * says; `default`, `title` and the like are annotations. */
static void compile_keywords(struct js_cc *cc, struct js_node *n, const json_t *j, const char *base,
                             const char *ptr) {
    const json_t *ref = json_object_get(j, "$ref");
    if (json_is_string(ref)) {
        /* draft-07: every keyword beside $ref is ignored */
        n->ref = resolve_ref(cc, json_string_value(ref), base, ptr);
        return;
    }
    n->types = type_bits(json_object_get(j, "type"));
    n->enum_ = json_object_get(j, "enum");
    n->const_ = json_object_get(j, "const");
    n->multiple_of = number_of(j, "multipleOf");
    n->maximum = number_of(j, "maximum");
    n->minimum = number_of(j, "minimum");
    n->exclusive_maximum = number_of(j, "exclusiveMaximum");
    n->exclusive_minimum = number_of(j, "exclusiveMinimum");
    n->max_length = count_of(j, "maxLength");
    n->min_length = count_of(j, "minLength");
    n->max_items = count_of(j, "maxItems");
    n->min_items = count_of(j, "minItems");
    n->max_props = count_of(j, "maxProperties");
    n->min_props = count_of(j, "minProperties");
    n->unique_items = json_is_true(json_object_get(j, "uniqueItems"));
    n->format = js_format_parse(json_string_value(json_object_get(j, "format")));
    const json_t *req = json_object_get(j, "required");
    n->required = json_array_size(req) > 0 ? req : NULL;
    const json_t *pat = json_object_get(j, "pattern");
    if (json_is_string(pat)) {
        char *p = js_ptr_join(ptr, "pattern", 7);
        if (!p) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return;
        }
        n->pattern = regex_at(cc, json_string_value(pat), json_string_length(pat), p);
        free(p);
    }
    const json_t *items = json_object_get(j, "items");
    if (json_is_array(items)) {
        n->items_is_list = true;
        child_list(cc, j, "items", base, ptr, &n->items_list);
    } else {
        n->items = child(cc, j, "items", base, ptr);
    }
    n->additional_items = child(cc, j, "additionalItems", base, ptr);
    n->contains = child(cc, j, "contains", base, ptr);
    n->additional_props = child(cc, j, "additionalProperties", base, ptr);
    n->property_names = child(cc, j, "propertyNames", base, ptr);
    n->if_ = child(cc, j, "if", base, ptr);
    n->then_ = child(cc, j, "then", base, ptr);
    n->else_ = child(cc, j, "else", base, ptr);
    n->not_ = child(cc, j, "not", base, ptr);
    child_list(cc, j, "allOf", base, ptr, &n->all_of);
    child_list(cc, j, "anyOf", base, ptr, &n->any_of);
    child_list(cc, j, "oneOf", base, ptr, &n->one_of);
    if (!cc->rc) {
        compile_object_keywords(cc, n, j, base, ptr);
    }
}

/*
 * The node of the subschema j, made on first use: j's recorded location
 * gives its base URI and pointer (base and ptr are used for a location the
 * walk did not reach, a `$ref` into a non-schema keyword).  NULL with
 * cc->rc set on failure.
 */
static struct js_node *compile_at(struct js_cc *cc, const json_t *j, const char *base,
                                  const char *ptr) {
    if (cc->rc) {
        return NULL;
    }
    struct js_loc *l = loc_find(cc, j);
    if (!l) {
        walk(cc, j, base, ptr);
        l = loc_find(cc, j);
        if (!l) {
            if (!cc->rc) {
                cc_fail(cc, HUB_EINVAL, ptr, "not a schema");
            }
            return NULL;
        }
    }
    /* one node per location: a second `$ref` to it, or the walk reaching a
     * location a `$ref` compiled first, shares the node */
    if (l->node) {
        return l->node;
    }
    /* nesting is bounded by the meta-schema check, but a chain of distinct
     * `$ref`s (a -> b -> c ...) is flat in the document and deep here */
    if (cc->depth >= 8 * cc->s->limits.max_depth) {
        cc_fail(cc, HUB_ERANGE, l->ptr, "schema nested or chained by $ref too deeply");
        return NULL;
    }
    struct hub_jschema *s = cc->s;
    if (s->nnodes == s->cap_nodes) {
        size_t ncap = s->cap_nodes ? 2 * s->cap_nodes : 32;
        struct js_node **nv = realloc(s->nodes, ncap * sizeof *nv);
        if (!nv) {
            cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
            return NULL;
        }
        s->nodes = nv;
        s->cap_nodes = ncap;
    }
    struct js_node *n = calloc(1, sizeof *n);
    char *nbase = strdup(l->base);
    if (n) {
        n->ptr = strdup(l->ptr);
    }
    if (!n || !n->ptr || !nbase) {
        if (n) {
            free(n->ptr);
        }
        free(n);
        free(nbase);
        cc_fail(cc, HUB_ENOMEM, ptr, "out of memory");
        return NULL;
    }
    s->nodes[s->nnodes++] = n;
    /* set before the children compile, so a cycle back here finds it */
    l->node = n;
    if (json_is_boolean(j)) {
        n->boolean = json_is_true(j);
    } else {
        n->boolean = -1;
        cc->depth++;
        compile_keywords(cc, n, j, nbase, n->ptr);
        cc->depth--;
    }
    free(nbase);
    return n;
}

/* Frees what a compile built, whole or partial: the nodes (never the
 * meta-schema's, which are not in s->nodes), their regexes, the document. */
void hub_jschema_free(struct hub_jschema *s) {
    if (!s) {
        return;
    }
    for (size_t i = 0; i < s->nnodes; i++) {
        struct js_node *n = s->nodes[i];
        free(n->ptr);
        pcre2_code_free(n->pattern);
        free(n->items_list.v);
        free(n->props);
        for (size_t k = 0; k < n->npprops; k++) {
            pcre2_code_free(n->pprops[k].re);
        }
        free(n->pprops);
        free(n->deps);
        free(n->all_of.v);
        free(n->any_of.v);
        free(n->one_of.v);
        free(n);
    }
    free(s->nodes);
    pcre2_match_context_free(s->mctx);
    pcre2_match_context_free(s->mctx_first);
    json_decref(s->doc);
    free(s);
}

/*
 * Refuses a root `$schema` naming another dialect: its keywords would
 * silently mean something else here (2019-09's `$defs`, 2020-12's
 * `prefixItems`).  Absent, or draft-07 with or without "#" and over http
 * or https, is accepted.
 */
static int dialect_check(struct js_cc *cc, const json_t *schema) {
    const char *d = json_string_value(json_object_get(schema, "$schema"));
    if (!d) {
        return 0;
    }
    size_t n = strcspn(d, "#");
    static const char *const ok[] = {"http://json-schema.org/draft-07/schema",
                                     "https://json-schema.org/draft-07/schema"};
    for (size_t i = 0; i < 2; i++) {
        if (n == strlen(ok[i]) && strncmp(d, ok[i], n) == 0 && (d[n] == '\0' || !d[n + 1])) {
            return 0;
        }
    }
    return cc_fail(cc, HUB_EINVAL, "/$schema", "only draft-07 schemas are supported, not \"%s\"",
                   d);
}

/*
 * Checks schema against the meta-schema with limits scaled from l (a
 * schema is about twice as deep as the instances it describes).  Returns 0
 * or the error code with cc's error set.
 */
static int meta_check(struct js_cc *cc, const json_t *schema, const struct hub_jschema_limits *l) {
    const struct hub_jschema *meta = js_meta_schema();
    if (!meta) {
        return cc_fail(cc, HUB_ENOMEM, "", "out of memory");
    }
    struct hub_jschema_limits ml = *l;
    ml.max_depth = 2 * l->max_depth + 8;
    ml.max_steps = 64 * (uint64_t)l->max_schema_nodes + l->max_steps;
    ml.max_errors = 1;
    struct hub_jschema_result *res = malloc(sizeof *res);
    if (!res) {
        return cc_fail(cc, HUB_ENOMEM, "", "out of memory");
    }
    int rc = js_validate(meta, schema, &ml, res);
    if (rc == HUB_ERANGE) {
        rc = cc_fail(cc, HUB_ERANGE, res->nerrors ? res->errors[0].instance : "",
                     res->limit == HUB_JSCHEMA_LIMIT_DEPTH ? "schema nested too deeply"
                                                           : "schema too large to check");
    } else if (rc < 0) {
        rc = cc_fail(cc, rc, "", "out of memory");
    } else if (!res->valid && res->nerrors > 0) {
        /* the meta-schema's own wording ("matches none of the anyOf
         * schemas") means little to a schema author: name the keyword
         * whose value is wrong, the last segment of the pointer */
        const struct hub_jschema_issue *e = &res->errors[0];
        const char *slash = strrchr(e->instance, '/');
        if (slash && strcmp(e->keyword, "type") != 0 && strcmp(e->keyword, "required") != 0) {
            rc = cc_fail(cc, HUB_EINVAL, e->instance,
                         "not valid draft-07: the value of \"%s\" is not allowed (%s)", slash + 1,
                         e->message);
        } else {
            rc = cc_fail(cc, HUB_EINVAL, e->instance, "not valid draft-07: %s", e->message);
        }
    } else if (!res->valid) {
        rc = cc_fail(cc, HUB_EINVAL, "", "not valid draft-07");
    }
    if (rc == 0) {
        rc = dialect_check(cc, schema);
    }
    free(res);
    return rc;
}

/*
 * Builds the node of every walked location no `$ref` reached from the
 * root (unused `definitions`, siblings of a `$ref`), so that a pattern
 * PCRE2 refuses anywhere in the document is a compile error, not a
 * surprise when a later version starts referring to it.
 */
static void compile_rest(struct js_cc *cc) {
    size_t n = 0;
    const json_t **todo = malloc(cc->nlocs * sizeof *todo);
    if (!todo) {
        cc_fail(cc, HUB_ENOMEM, "", "out of memory");
        return;
    }
    /* collected first: building nodes may grow (rehash) the table */
    for (size_t i = 0; i < cc->cap_locs; i++) {
        if (cc->locs[i].json && !cc->locs[i].node) {
            todo[n++] = cc->locs[i].json;
        }
    }
    for (size_t i = 0; i < n && !cc->rc; i++) {
        const struct js_loc *l = loc_find(cc, todo[i]);
        compile_at(cc, todo[i], l->base, l->ptr);
    }
    free(todo);
}

/*
 * The compile behind hub_jschema_compile; check_meta is 0 only for the
 * meta-schema itself.
 */
static int compile_doc(const json_t *schema, const struct hub_jschema_limits *limits,
                       int check_meta, struct hub_jschema **out, struct hub_jschema_error *err) {
    struct js_cc cc = {.err = err};
    *out = NULL;
    if (err) {
        err->pointer[0] = err->message[0] = '\0';
    }
    struct hub_jschema_limits l;
    hub_jschema_limits_default(&l);
    if (limits) {
        /* zero fields keep their default */
        l.max_schema_nodes =
            limits->max_schema_nodes ? limits->max_schema_nodes : l.max_schema_nodes;
        l.max_schema_bytes =
            limits->max_schema_bytes ? limits->max_schema_bytes : l.max_schema_bytes;
        l.max_pattern_bytes =
            limits->max_pattern_bytes ? limits->max_pattern_bytes : l.max_pattern_bytes;
        l.max_depth = limits->max_depth ? limits->max_depth : l.max_depth;
        l.max_steps = limits->max_steps ? limits->max_steps : l.max_steps;
        l.regex_match_limit =
            limits->regex_match_limit ? limits->regex_match_limit : l.regex_match_limit;
        l.regex_depth_limit =
            limits->regex_depth_limit ? limits->regex_depth_limit : l.regex_depth_limit;
        l.max_errors = limits->max_errors ? limits->max_errors : l.max_errors;
        l.max_patterns = limits->max_patterns ? limits->max_patterns : l.max_patterns;
        l.max_regex_bytes = limits->max_regex_bytes ? limits->max_regex_bytes : l.max_regex_bytes;
    }
    if (l.max_errors > HUB_JSCHEMA_ERRORS_MAX) {
        l.max_errors = HUB_JSCHEMA_ERRORS_MAX;
    }
    if (!json_is_object(schema) && !json_is_boolean(schema)) {
        return cc_fail(&cc, HUB_EINVAL, "", "a schema is an object or a boolean");
    }
    /* jansson measures the compact text without building it */
    size_t bytes = json_dumpb(schema, NULL, 0, JSON_COMPACT);
    if (bytes > l.max_schema_bytes) {
        return cc_fail(&cc, HUB_ERANGE, "", "schema of %zu bytes is over the limit of %zu", bytes,
                       l.max_schema_bytes);
    }
    /* the meta-schema check comes before the copy and the walk: a document
     * that is not a schema costs a validation, not a compile */
    if (check_meta && meta_check(&cc, schema, &l) < 0) {
        return cc.rc;
    }
    struct hub_jschema *s = calloc(1, sizeof *s);
    cc.s = s;
    if (!s || !(s->doc = json_deep_copy(schema)) || !(s->mctx = pcre2_match_context_create(NULL)) ||
        !(s->mctx_first = pcre2_match_context_create(NULL))) {
        hub_jschema_free(s);
        return cc_fail(&cc, HUB_ENOMEM, "", "out of memory");
    }
    s->limits = l;
    pcre2_set_match_limit(s->mctx, l.regex_match_limit);
    pcre2_set_depth_limit(s->mctx, l.regex_depth_limit);
    pcre2_set_match_limit(s->mctx_first, JS_REGEX_FIRST_LIMIT);
    js_regex_context_init(s->mctx);
    js_regex_context_init(s->mctx_first);
    pcre2_set_depth_limit(s->mctx_first, l.regex_depth_limit);
    /* the interpreter keeps backtracking frames on the heap: 4 MiB each search */
    pcre2_set_heap_limit(s->mctx, 4096);
    pcre2_set_heap_limit(s->mctx_first, 4096);
    /* the document itself answers to the empty URI, so "#..." resolves in
     * a schema without `$id`; a root `$id` adds its absolute URI */
    if (res_add(&cc, "", s->doc) == 0) {
        walk(&cc, s->doc, "", "");
        s->root = compile_at(&cc, s->doc, "", "");
        compile_rest(&cc);
    }
    for (size_t i = 0; i < cc.cap_locs; i++) {
        free(cc.locs[i].base);
        free(cc.locs[i].ptr);
    }
    free(cc.locs);
    for (size_t i = 0; i < cc.nres; i++) {
        free(cc.res[i].uri);
    }
    free(cc.res);
    if (cc.rc) {
        hub_jschema_free(s);
        return cc.rc;
    }
    *out = s;
    return 0;
}

/* The public compile always checks the schema against the meta-schema
 * first, so the node builder can trust the shape of every keyword. */
int hub_jschema_compile(const json_t *schema, const struct hub_jschema_limits *limits,
                        struct hub_jschema **out, struct hub_jschema_error *err) {
    return compile_doc(schema, limits, 1, out, err);
}

static struct hub_jschema *meta_schema;
static pthread_once_t meta_once = PTHREAD_ONCE_INIT;

/*
 * Builds the meta-schema (pthread_once).  Failure leaves meta_schema NULL,
 * and every compile then reports HUB_ENOMEM, the only way it can fail.
 */
static void meta_build(void) {
    json_t *doc = json_loads(js_meta_schema_text, 0, NULL);
    if (doc) {
        /* meta_schema is NULL while this runs, so its own "$ref": "#" stays local */
        struct hub_jschema *m = NULL;
        struct hub_jschema_limits l;
        hub_jschema_limits_default(&l);
        if (compile_doc(doc, &l, 0, &m, NULL) == 0) {
            meta_schema = m;
        }
        json_decref(doc);
    }
}

/* Built once and kept for the life of the process: it is immutable. */
const struct hub_jschema *js_meta_schema(void) {
    pthread_once(&meta_once, meta_build);
    return meta_schema;
}

/* One object per recorded error, in the order they were found; the
 * schema location stays out (evidence names the instance, not our tree). */
json_t *hub_jschema_result_json(const struct hub_jschema_result *res) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < res->nerrors; i++) {
        const struct hub_jschema_issue *e = &res->errors[i];
        json_t *o = json_pack("{s:s, s:s, s:s}", "pointer", e->instance, "keyword", e->keyword,
                              "message", e->message);
        if (!o || json_array_append_new(a, o) < 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}
