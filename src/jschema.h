/*
 * jschema — JSON Schema draft-07 over jansson: compile a schema once,
 * validate many instances against it with bounded work, and compare two
 * versions of a schema for changes that would reject what the old one
 * accepted.
 *
 * Compile checks the schema against the draft-07 meta-schema, resolves
 * every `$ref` inside the document (JSON pointers, `definitions`, `$id`
 * anchors; nothing is fetched: a `$ref` to another document is an error,
 * except the draft-07 meta-schema itself, which is built in), compiles each
 * `pattern` and `patternProperties` key with PCRE2, and refuses a schema
 * larger than the limits below.  The pattern limits are checked as each
 * pattern is compiled, so a hostile schema costs at most the patterns
 * before the one that crossed a limit, never the whole document.  Every compile error names the
 * JSON pointer of the schema location at fault.
 *
 * Validate walks the instance with per-call state only: one compiled schema
 * may be validated from any number of threads at once.  Its work is bounded
 * by the instance depth and a step budget: a keyword evaluated at one
 * instance location, a value compared, costs a step, and work over a
 * string costs by its length (lengths, formats, string equality); a regex
 * search costs 8 steps plus one per 256 bytes of subject, under a PCRE2
 * match limit of 100; a search that needs more is re-run once under
 * regex_match_limit and charged regex_match_limit / 10 steps more.  Those
 * limits count per start position, so a search is also charged what it
 * did (its callouts, and for a long subject or a re-run its CPU time) and
 * ends when the time the steps left stand for is up.  A step stands for
 * about 100 ns, and the default budget for about 0.1-0.3 s of CPU however
 * hostile the schema and payload (docs/schemas.md has figures).  A run
 * that reaches a bound stops with HUB_ERANGE and a result saying which.
 *
 * Formats `date-time` (RFC 3339), `uri` (RFC 3986 absolute URI) and `email`
 * (RFC 5321 mailbox, dot-atom or quoted local part) are assertions; other
 * formats are annotations and always pass.
 */
/*
 * Use (a registry compiles on registration or reload, workers validate):
 *
 *     struct hub_jschema *s;
 *     struct hub_jschema_error err;
 *     if (hub_jschema_compile(doc, NULL, &s, &err) < 0)
 *         -> 400 naming err.pointer and err.message
 *     ...on any thread, as often as needed:
 *     struct hub_jschema_result res;
 *     int rc = hub_jschema_validate(s, payload, &res);
 *     rc == 0 && res.valid       -> accept
 *     rc == 0 && !res.valid      -> schema_violation, evidence from res.errors
 *     rc == HUB_ERANGE           -> too costly to check: res.limit says which
 *                                   bound, the last error where (the caller
 *                                   decides; quarantine keeps the event)
 *     ...when no thread can still use it: hub_jschema_free(s).
 *
 * A struct hub_jschema_result is about 12 KiB, and a validation at the
 * deepest the default limits allow uses under 256 KiB of stack (1 MiB in
 * the sanitizer build): any libuv or pthread worker thread has room.
 */
#ifndef HUB_JSCHEMA_H
#define HUB_JSCHEMA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Buffer sizes of the error records; longer texts are cut (a cut pointer
 * ends in "..."). */
#define HUB_JSCHEMA_POINTER_MAX 256
#define HUB_JSCHEMA_KEYWORD_MAX 32
#define HUB_JSCHEMA_MESSAGE_MAX 192
/* The most errors one validation records (the first ones found). */
#define HUB_JSCHEMA_ERRORS_MAX 16

/* A compiled schema: immutable after compile, shared read-only by threads. */
struct hub_jschema;

/*
 * Limits of one compiled schema; hub_jschema_limits_default() fills the
 * defaults given beside each field.  A zero field means the default.
 */
struct hub_jschema_limits {
    size_t max_schema_nodes;    /* subschemas in the document (10,000) */
    size_t max_schema_bytes;    /* compact JSON text of the schema (1 MiB) */
    size_t max_pattern_bytes;   /* one `pattern` source (4,096) */
    unsigned max_depth;         /* instance nesting and `$ref` nesting (64) */
    uint64_t max_steps;         /* keyword evaluations per validation (1,000,000) */
    uint32_t regex_match_limit; /* PCRE2 match limit per regex call (100,000) */
    uint32_t regex_depth_limit; /* PCRE2 depth (backtracking) limit per call (1,000) */
    size_t max_errors;          /* errors recorded per validation (<= ERRORS_MAX; 8) */
    size_t max_patterns;        /* `pattern`s and `patternProperties` keys (256) */
    size_t max_regex_bytes;     /* their compiled plus JIT code, summed (4 MiB) */
};

/* A compile error: where in the schema, and why. */
struct hub_jschema_error {
    char pointer[HUB_JSCHEMA_POINTER_MAX]; /* JSON pointer into the schema ("" = root) */
    char message[HUB_JSCHEMA_MESSAGE_MAX];
};

/* One validation error. */
struct hub_jschema_issue {
    char instance[HUB_JSCHEMA_POINTER_MAX]; /* JSON pointer into the instance */
    char keyword[HUB_JSCHEMA_KEYWORD_MAX];  /* the failing keyword, e.g. "maximum" */
    char schema[HUB_JSCHEMA_POINTER_MAX];   /* JSON pointer of that keyword in the schema */
    char message[HUB_JSCHEMA_MESSAGE_MAX];
};

/* Why a validation stopped before a verdict (result.limit). */
enum hub_jschema_limit {
    HUB_JSCHEMA_LIMIT_NONE = 0,
    HUB_JSCHEMA_LIMIT_DEPTH, /* instance or $ref nesting over max_depth */
    HUB_JSCHEMA_LIMIT_STEPS, /* max_steps used up */
    HUB_JSCHEMA_LIMIT_REGEX, /* a regex hit its match or depth limit */
};

/* What one validation found.  The caller owns it (stack is fine). */
struct hub_jschema_result {
    int valid;                    /* 1 valid, 0 invalid or stopped */
    enum hub_jschema_limit limit; /* set when the validation stopped at a bound */
    uint64_t steps;               /* keyword evaluations used */
    size_t nerrors;               /* errors recorded in errors[] */
    size_t total_errors;          /* errors found (may exceed nerrors) */
    struct hub_jschema_issue errors[HUB_JSCHEMA_ERRORS_MAX];
};

/* Fills *limits with the defaults. */
void hub_jschema_limits_default(struct hub_jschema_limits *limits);

/*
 * Compiles schema (borrowed for the call; the compiled schema keeps its own
 * copy) under limits (NULL: defaults).  Returns 0 and *out (owned by the
 * caller, freed with hub_jschema_free); or HUB_EINVAL (not valid draft-07,
 * a `$ref` that cannot be resolved, a pattern PCRE2 refuses), HUB_ERANGE (over
 * a limit) or HUB_ENOMEM, with *err (when err is not NULL) naming the schema
 * pointer and the reason.
 */
int hub_jschema_compile(const json_t *schema, const struct hub_jschema_limits *limits,
                        struct hub_jschema **out, struct hub_jschema_error *err);

/*
 * Validates instance (borrowed) against s.  Thread-safe: any number of
 * threads may validate against one s at once; s must outlive the calls.
 * Returns 0 when a verdict was reached (res->valid says which, res->errors
 * the first errors found), HUB_ERANGE when a bound stopped it (res->limit
 * says which; res->valid is 0; its last recorded error, keyword "limit",
 * names the instance location where it stopped), HUB_ENOMEM when an
 * allocation failed.
 */
int hub_jschema_validate(const struct hub_jschema *s, const json_t *instance,
                         struct hub_jschema_result *res);

/* Frees a compiled schema; NULL is ignored. */
void hub_jschema_free(struct hub_jschema *s);

/*
 * The errors of res as a new JSON array of {"pointer", "keyword",
 * "message"} objects (returns owned; NULL on allocation failure), the shape
 * of problem+json `errors[]` and of quarantine evidence.
 */
json_t *hub_jschema_result_json(const struct hub_jschema_result *res);

/*
 * Compares two draft-07 schemas of one major version: would new_schema
 * reject an instance that old_schema accepted, by the mechanical rules of
 * jschema_compat.c (docs/schemas.md lists which are checked and which are
 * not).  Both are borrowed.  Returns 0 and *changes = a new JSON array
 * (owned by the caller; empty when compatible) of {"pointer", "rule",
 * "reason"} objects, pointer naming the location in new_schema (or in
 * old_schema for something removed); HUB_EINVAL when either is not a schema
 * object or boolean; HUB_ENOMEM.
 */
int hub_jschema_compat(const json_t *old_schema, const json_t *new_schema, json_t **changes);

#endif
