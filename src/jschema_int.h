/*
 * jschema_int — what the files of the jschema module share: the compiled
 * node a subschema becomes (jschema.c builds it, jschema_validate.c walks
 * it), the PCRE2 wrapper and the format checks (jschema_format.c), and the
 * embedded draft-07 meta-schema (jschema_meta.c).  Nothing outside
 * src/jschema*.c includes this header.
 */
#ifndef HUB_JSCHEMA_INT_H
#define HUB_JSCHEMA_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>

#include "jschema.h"

/* Bits of the `type` keyword; JS_T_NUMBER also admits integers. */
enum js_type {
    JS_T_NULL = 1 << 0,
    JS_T_BOOLEAN = 1 << 1,
    JS_T_OBJECT = 1 << 2,
    JS_T_ARRAY = 1 << 3,
    JS_T_NUMBER = 1 << 4,
    JS_T_STRING = 1 << 5,
    JS_T_INTEGER = 1 << 6,
};

/* The formats that assert; every other `format` is an annotation. */
enum js_format {
    JS_FMT_NONE = 0,
    JS_FMT_DATE_TIME,
    JS_FMT_URI,
    JS_FMT_EMAIL,
};

struct js_node;

/* One `properties` member, kept sorted by name for binary search. */
struct js_prop {
    const char *name; /* borrowed from the compiled schema's copy */
    size_t len;
    struct js_node *node;
};

/* One `patternProperties` member. */
struct js_pprop {
    pcre2_code *re;
    struct js_node *node;
};

/* One `dependencies` member: a schema, or a list of property names. */
struct js_dep {
    const char *name;
    struct js_node *schema; /* NULL when names is set */
    const json_t *names;    /* array of strings, borrowed */
};

/* A list of subschemas (`allOf`, `anyOf`, `oneOf`, array-form `items`). */
struct js_list {
    struct js_node **v;
    size_t n;
};

/*
 * A compiled subschema.  Pointers to json_t are borrowed from the compiled
 * schema's private copy of the document and are only read during
 * validation (no reference counts change), which keeps concurrent
 * validation free of shared writes.  Integer bounds of -1 are absent.
 */
struct js_node {
    char *ptr;            /* JSON pointer of this subschema in its document, owned */
    int boolean;          /* -1: an object schema; 0: `false`; 1: `true` */
    struct js_node *ref;  /* `$ref` target: every sibling keyword is ignored */
    unsigned types;       /* enum js_type bits; 0: no `type` */
    const json_t *enum_;  /* array */
    const json_t *const_; /* any value (JSON null is a non-NULL json_t) */
    const json_t *multiple_of, *maximum, *minimum;       /* numbers, NULL when absent */
    const json_t *exclusive_maximum, *exclusive_minimum; /* draft-07: numbers, not flags */
    long long max_length, min_length;                    /* code points */
    long long max_items, min_items, max_props, min_props;
    pcre2_code *pattern;   /* owned, searched (not anchored) */
    enum js_format format; /* JS_FMT_NONE: no assertion */
    bool unique_items;
    bool items_is_list;               /* `items` was an array: items_list is positional */
    struct js_node *items;            /* `items` as one schema for every element */
    struct js_list items_list;        /* `items` as an array */
    struct js_node *additional_items; /* only with items_is_list */
    struct js_node *contains;
    const json_t *required; /* array of strings, NULL when empty */
    struct js_prop *props;  /* sorted by name */
    size_t nprops;
    struct js_pprop *pprops; /* in document order */
    size_t npprops;
    struct js_node *additional_props; /* members neither props nor pprops match */
    struct js_dep *deps;
    size_t ndeps;
    struct js_node *property_names;      /* applied to each name as a string */
    struct js_node *if_, *then_, *else_; /* then/else only count with if */
    struct js_node *not_;
    struct js_list all_of, any_of, one_of;
};

/* The compiled schema behind struct hub_jschema. */
struct hub_jschema {
    json_t *doc;            /* owned copy of the schema document */
    struct js_node *root;   /* borrowed from nodes */
    struct js_node **nodes; /* every node, owned */
    size_t nnodes, cap_nodes;
    struct hub_jschema_limits limits;
    pcre2_match_context *mctx;       /* regex_match_limit; read-only after compile */
    pcre2_match_context *mctx_first; /* JS_REGEX_FIRST_LIMIT: the cheap first try */
};

/* The time a step of the validation budget stands for (jschema.h). */
#define JS_NS_PER_STEP 100

/* Subjects up to this long are searched without reading the thread's CPU
 * clock (a system call, about as dear as a short search): an item tried
 * reads at most this much, so such a search is charged by its callouts. */
#define JS_REGEX_UNTIMED_BYTES 256

/* The PCRE2 match limit of a first search; normal patterns need under 30
 * (measured: anchored ids, e-mail shapes, searches in 10 KB subjects). */
#define JS_REGEX_FIRST_LIMIT 100

/*
 * Compiles a regex source (UTF-8, len bytes) with the module's
 * ECMAScript-leaning options.  Returns owned code or NULL with msg (size
 * cap) set to PCRE2's reason.
 */
pcre2_code *js_regex_compile(const char *src, size_t len, char *msg, size_t cap);

/* Sets the callout that ends searches past their deadline (see
 * js_regex_search) on a match context, once, before it is shared. */
void js_regex_context_init(pcre2_match_context *mctx);

/*
 * Searches subject (valid UTF-8: a jansson string) for re with match data
 * md (the caller's, one per thread) under mctx's limits, until the thread's
 * CPU clock (hub_thread_cpu_ns) passes deadline_ns (0: no deadline), and
 * adds its callouts (one before each pattern item tried) to *callouts.
 * Returns 1 match, 0 no match, -1 a limit was hit, -2 another PCRE2 error,
 * -3 the deadline passed.
 */
int js_regex_search(const pcre2_code *re, const char *subject, size_t len, pcre2_match_data *md,
                    pcre2_match_context *mctx, uint64_t deadline_ns, uint64_t *callouts);

/* 1 when s (len bytes) is valid under format f, else 0; JS_FMT_NONE is 1. */
int js_format_check(enum js_format f, const char *s, size_t len);

/* The format named name, or JS_FMT_NONE. */
enum js_format js_format_parse(const char *name);

/* The draft-07 meta-schema's text (NUL-terminated), embedded at build time
 * from src/jschema_draft07.json (as json-schema.org publishes it), and its
 * $id. */
extern const char js_meta_schema_text[];
#define JS_META_ID "http://json-schema.org/draft-07/schema"

/*
 * The compiled meta-schema, built once per process on first use and never
 * freed (immutable, shared by every compile).  NULL when it could not be
 * built (allocation failure).
 */
const struct hub_jschema *js_meta_schema(void);

/*
 * hub_jschema_validate under limits l (depth, steps, errors) instead of
 * s's own: the meta-schema check of a compile runs with the limits of the
 * schema being compiled.
 */
int js_validate(const struct hub_jschema *s, const json_t *instance,
                const struct hub_jschema_limits *l, struct hub_jschema_result *res);

/* base + "/" + seg (len bytes) escaped as RFC 6901 says (~ as ~0, / as
 * ~1): a JSON pointer one level down.  Returns owned text, NULL on
 * allocation failure. */
char *js_ptr_join(const char *base, const char *seg, size_t len);

/* The subschema a local `$ref` ("#" or "#/json/pointer", URI-escaped)
 * names in root (borrowed), or NULL: a reference to another document or
 * to nothing. */
const json_t *js_local_ref(const json_t *root, const char *ref);

/* js_ptr_join with an array index as the segment. */
char *js_ptr_index(const char *base, size_t i);

/* Value equality of the JSON Schema spec: 1 == 1.0; objects by members. */
int js_equal(const json_t *a, const json_t *b);

/* The number of code points in a UTF-8 string of len bytes. */
size_t js_utf8_length(const char *s, size_t len);

#endif
