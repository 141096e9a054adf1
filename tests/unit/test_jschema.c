/*
 * Unit tests of src/jschema*.c beyond the official suite: compile errors
 * name the schema pointer, validation errors name the instance pointer,
 * keyword and schema location, every bound (depth, steps, regex) stops a
 * hostile schema or payload quickly, one compiled schema validates from
 * several threads at once with the same answers, the asserting formats,
 * and the compatibility rules.  Also prints the cost of validating a 1 KiB
 * object of 10 properties (types, bounds, a pattern) in µs.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "error.h"
#include "jschema.h"

static json_t *parse(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    if (!j) {
        fail_msg("bad test JSON: %s: %s", e.text, text);
    }
    return j;
}

/* Compiles text, expecting success. */
static struct hub_jschema *compile_ok(const char *text) {
    json_t *j = parse(text);
    struct hub_jschema *s = NULL;
    struct hub_jschema_error err;
    int rc = hub_jschema_compile(j, NULL, &s, &err);
    json_decref(j);
    if (rc != 0) {
        fail_msg("compile failed: %s at \"%s\": %s", hub_strerror(rc), err.pointer, err.message);
    }
    return s;
}

/* Compiles text under limits l (NULL: defaults), expecting rc and the pointer. */
static void compile_fails(const char *text, const struct hub_jschema_limits *l, int rc,
                          const char *pointer) {
    json_t *j = parse(text);
    struct hub_jschema *s = NULL;
    struct hub_jschema_error err;
    int got = hub_jschema_compile(j, l, &s, &err);
    json_decref(j);
    assert_null(s);
    if (got != rc || strcmp(err.pointer, pointer) != 0) {
        fail_msg("%s: got %d at \"%s\" (%s), want %d at \"%s\"", text, got, err.pointer,
                 err.message, rc, pointer);
    }
    assert_true(err.message[0] != '\0');
}

/* Validates instance text against s; returns the rc, *res filled. */
static int check(const struct hub_jschema *s, const char *text, struct hub_jschema_result *res) {
    json_t *j = parse(text);
    int rc = hub_jschema_validate(s, j, res);
    json_decref(j);
    return rc;
}

/*
 * A registration refused with 400 must say where: every kind of compile
 * error (not draft-07, unresolvable or non-local $ref, a pattern PCRE2
 * refuses, over a size, node or pattern limit, nested too deeply) names
 * the JSON pointer of the offending schema location.
 */
static void test_compile_errors_name_the_pointer(void **state) {
    (void)state;
    compile_fails("{\"properties\": {\"a\": {\"type\": \"strin\"}}}", NULL, HUB_EINVAL,
                  "/properties/a/type");
    compile_fails("{\"properties\": {\"a\": {\"minLength\": -1}}}", NULL, HUB_EINVAL,
                  "/properties/a/minLength");
    compile_fails("{\"items\": [{\"$ref\": \"#/definitions/missing\"}]}", NULL, HUB_EINVAL,
                  "/items/0/$ref");
    compile_fails("{\"properties\": {\"a\": {\"$ref\": \"http://example.com/s.json\"}}}", NULL,
                  HUB_EINVAL, "/properties/a/$ref");
    compile_fails("{\"properties\": {\"a\": {\"pattern\": \"(unclosed\"}}}", NULL, HUB_EINVAL,
                  "/properties/a/pattern");
    compile_fails("{\"patternProperties\": {\"[\": {}}}", NULL, HUB_EINVAL, "/patternProperties/[");
    /* in a definition nothing refers to yet */
    compile_fails("{\"definitions\": {\"later\": {\"pattern\": \"a{2,1}\"}}}", NULL, HUB_EINVAL,
                  "/definitions/later/pattern");
    compile_fails(
        "{\"$ref\": \"#/properties/a/type\", \"properties\": {\"a\": {\"type\": \"string\"}}}",
        NULL, HUB_EINVAL, "/$ref");
    compile_fails("42", NULL, HUB_EINVAL, "");
    compile_fails("{\"$schema\": \"https://json-schema.org/draft/2020-12/schema\"}", NULL,
                  HUB_EINVAL, "/$schema");
    struct hub_jschema *ok =
        compile_ok("{\"$schema\": \"http://json-schema.org/draft-07/schema#\"}");
    hub_jschema_free(ok);
    struct hub_jschema_limits l = {.max_schema_bytes = 64};
    compile_fails("{\"properties\": {\"a\": {\"description\": "
                  "\"a description long enough to pass sixty-four bytes\"}}}",
                  &l, HUB_ERANGE, "");
    struct hub_jschema_limits n = {.max_schema_nodes = 3};
    compile_fails("{\"properties\": {\"a\": {}, \"b\": {}, \"c\": {}}}", &n, HUB_ERANGE,
                  "/properties/c");
    struct hub_jschema_limits pl = {.max_pattern_bytes = 4};
    compile_fails("{\"pattern\": \"abcdef\"}", &pl, HUB_ERANGE, "/pattern");
    /* a schema nested deeper than the meta-schema check allows */
    char deep[8192] = "";
    for (int i = 0; i < 200; i++) {
        strcat(deep, "{\"not\":");
    }
    strcat(deep, "{}");
    for (int i = 0; i < 200; i++) {
        strcat(deep, "}");
    }
    json_t *j = parse(deep);
    struct hub_jschema *s = NULL;
    struct hub_jschema_error err;
    assert_int_equal(hub_jschema_compile(j, NULL, &s, &err), HUB_ERANGE);
    json_decref(j);
    /* a flat chain of 5,000 $refs: deep for the compiler, not for the meta-schema check */
    json_t *defs = json_object();
    for (int i = 0; i < 5000; i++) {
        char name[16], ref[40];
        snprintf(name, sizeof name, "d%d", i);
        snprintf(ref, sizeof ref, "#/definitions/d%d", i + 1);
        json_object_set_new(defs, name, i < 4999 ? json_pack("{s:s}", "$ref", ref) : json_true());
    }
    j = json_pack("{s:o, s:s}", "definitions", defs, "$ref", "#/definitions/d0");
    assert_int_equal(hub_jschema_compile(j, NULL, &s, &err), HUB_ERANGE);
    assert_null(s);
    json_decref(j);
}

/*
 * Quarantine evidence and the 422 answer list the errors a producer must
 * fix: each with the instance pointer (escaped as RFC 6901 says), the
 * keyword and where in the schema it is; all of them up to max_errors,
 * in instance order, through `$ref`s.
 */
static void test_errors_name_pointer_keyword_and_schema(void **state) {
    (void)state;
    struct hub_jschema *s = compile_ok(
        "{\"type\": \"object\", \"required\": [\"id\"], \"properties\": {"
        "\"id\": {},"
        "\"amount\": {\"type\": \"number\", \"maximum\": 100},"
        "\"items\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/definitions/item\"}},"
        "\"a/b~c\": {\"type\": \"string\"}},"
        "\"additionalProperties\": false,"
        "\"definitions\": {\"item\": {\"type\": \"object\", \"properties\": {\"sku\": "
        "{\"type\": \"string\", \"pattern\": \"^[A-Z]{3}-[0-9]+$\"}}}}}");
    struct hub_jschema_result r;
    assert_int_equal(check(s, "{\"id\": 1, \"amount\": 5, \"items\": [{\"sku\": \"ABC-1\"}]}", &r),
                     0);
    assert_true(r.valid);
    assert_int_equal(r.nerrors, 0);
    assert_int_equal(check(s,
                           "{\"amount\": \"12\", \"items\": [{\"sku\": \"ABC-1\"}, {\"sku\": "
                           "\"bad\"}], \"a/b~c\": 3, \"extra\": true}",
                           &r),
                     0);
    assert_false(r.valid);
    assert_int_equal(r.nerrors, 5);
    assert_string_equal(r.errors[0].instance, "");
    assert_string_equal(r.errors[0].keyword, "required");
    assert_string_equal(r.errors[0].schema, "/required");
    const char *want[][3] = {
        {"/amount", "type", "/properties/amount/type"},
        {"/items/1/sku", "pattern", "/definitions/item/properties/sku/pattern"},
        {"/a~1b~0c", "type", "/properties/a~1b~0c/type"},
        {"/extra", "additionalProperties", "/additionalProperties"}};
    /* members are visited in the instance's order, which jansson keeps */
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(r.errors[i + 1].instance, want[i][0]);
        assert_string_equal(r.errors[i + 1].keyword, want[i][1]);
        assert_string_equal(r.errors[i + 1].schema, want[i][2]);
    }
    json_t *a = hub_jschema_result_json(&r);
    assert_int_equal(json_array_size(a), 5);
    assert_string_equal(json_string_value(json_object_get(json_array_get(a, 1), "pointer")),
                        "/amount");
    json_decref(a);
    hub_jschema_free(s);

    /* max_errors keeps the first ones and counts the rest */
    json_t *j = parse("{\"items\": {\"type\": \"string\"}}");
    struct hub_jschema_limits l = {.max_errors = 2};
    assert_int_equal(hub_jschema_compile(j, &l, &s, NULL), 0);
    json_decref(j);
    assert_int_equal(check(s, "[1, 2, 3, \"x\", 5]", &r), 0);
    assert_false(r.valid);
    assert_int_equal(r.nerrors, 2);
    assert_string_equal(r.errors[1].instance, "/1");
    hub_jschema_free(s);
}

/* Milliseconds since an arbitrary origin. */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/*
 * A hostile payload or schema stops at a bound, fast, with HUB_ERANGE and
 * the bound named: a deep instance, a $ref cycle, a quadratic uniqueItems,
 * catastrophic backtracking, and many searches each just under the
 * regex limit (charged their worst case, so the step budget ends them).
 */
static void test_bounds_stop_hostile_work(void **state) {
    (void)state;
    struct hub_jschema_result r;
    /* an instance deeper than max_depth under a recursive schema */
    struct hub_jschema *s = compile_ok("{\"items\": {\"$ref\": \"#\"}}");
    char deep[4096] = "";
    for (int i = 0; i < 100; i++) {
        strcat(deep, "[");
    }
    for (int i = 0; i < 100; i++) {
        strcat(deep, "]");
    }
    assert_int_equal(check(s, deep, &r), HUB_ERANGE);
    assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_DEPTH);
    assert_false(r.valid);
    /* the last error names the first location over the limit: 65 levels down */
    assert_string_equal(r.errors[r.nerrors - 1].keyword, "limit");
    assert_int_equal(strlen(r.errors[r.nerrors - 1].instance), 2 * 65);
    assert_int_equal(check(s, "[[[]]]", &r), 0);
    assert_true(r.valid);
    hub_jschema_free(s);

    /* a $ref cycle that never descends the instance */
    s = compile_ok("{\"definitions\": {\"a\": {\"$ref\": \"#/definitions/b\"}, \"b\": {\"$ref\": "
                   "\"#/definitions/a\"}}, \"$ref\": \"#/definitions/a\"}");
    assert_int_equal(check(s, "1", &r), HUB_ERANGE);
    assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_DEPTH);
    hub_jschema_free(s);

    /* uniqueItems over a large array runs out of steps, quickly */
    s = compile_ok("{\"uniqueItems\": true}");
    json_t *big = json_array();
    for (int i = 0; i < 20000; i++) {
        json_array_append_new(big, json_pack("{s:i}", "k", i));
    }
    double t0 = now_ms();
    assert_int_equal(hub_jschema_validate(s, big, &r), HUB_ERANGE);
    assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_STEPS);
    double took = now_ms() - t0;
    printf("uniqueItems over 20,000 objects stopped after %.1f ms\n", took);
    /* the limit asserted above is the point; the time only catches a runaway */
    assert_true(took < 10000);
    json_decref(big);
    hub_jschema_free(s);

    /* catastrophic backtracking meets the PCRE2 match limit */
    s = compile_ok("{\"pattern\": \"^(a+)+$\"}");
    char evil[80];
    memset(evil, 'a', 60);
    strcpy(evil + 60, "!");
    json_t *str = json_string(evil);
    t0 = now_ms();
    assert_int_equal(hub_jschema_validate(s, str, &r), HUB_ERANGE);
    assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_REGEX);
    took = now_ms() - t0;
    printf("(a+)+$ over 60 a's and a '!' stopped after %.1f ms\n", took);
    /* the limit asserted above is the point; the time only catches a runaway */
    assert_true(took < 10000);
    json_decref(str);
    assert_int_equal(check(s, "\"aaaa\"", &r), 0);
    assert_true(r.valid);
    hub_jschema_free(s);

    /* many searches just under the limit: each is charged its worst case,
     * so the step budget ends the run after about a thousand of them (each
     * item passes: a failing one would end the run with a verdict) */
    s = compile_ok("{\"items\": {\"not\": {\"pattern\": \"^(a|aa)+$\"}}}");
    json_t *arr = json_array();
    memset(evil, 'a', 18);
    strcpy(evil + 18, "!");
    for (int i = 0; i < 20000; i++) {
        json_array_append_new(arr, json_string(evil));
    }
    t0 = now_ms();
    assert_int_equal(hub_jschema_validate(s, arr, &r), HUB_ERANGE);
    took = now_ms() - t0;
    printf("20,000 costly searches stopped after %.1f ms at item %s\n", took,
           r.errors[r.nerrors - 1].instance);
    assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_STEPS);
    /* the limit asserted above is the point; the time only catches a runaway */
    assert_true(took < 10000);
    json_decref(arr);
    hub_jschema_free(s);
}

/* A string of n bytes: prefix, then fill up to n. */
static json_t *long_string(const char *prefix, char fill, size_t n) {
    char *buf = malloc(n + 1);
    json_t *str;
    assert_non_null(buf);
    memset(buf, fill, n);
    memcpy(buf, prefix, strlen(prefix));
    buf[n] = '\0';
    str = json_string(buf);
    free(buf);
    assert_non_null(str);
    return str;
}

/* allOf of n copies of the subschema sub, compiled. */
static struct hub_jschema *all_of(size_t n, const char *sub) {
    json_t *arr = json_array(), *one = parse(sub);
    struct hub_jschema *s = NULL;
    struct hub_jschema_error err;
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(arr, json_deep_copy(one));
    }
    json_t *doc = json_pack("{s:o}", "allOf", arr);
    assert_int_equal(hub_jschema_compile(doc, NULL, &s, &err), 0);
    json_decref(one);
    json_decref(doc);
    return s;
}

/* Work that grows with a long string is bounded too (a tenant's schema and
 * event must not hold a threadpool thread for seconds): a pattern whose
 * every attempt reads to the end (PCRE2's match limit counts per start
 * position: 13 s over 200 KB before the searches ran under a deadline),
 * and many formats or lengths over a 1 MB string (each a scan, once
 * charged one step).  Searches that are cheap on long strings still pass. */
static void test_bounds_stop_long_subjects(void **state) {
    (void)state;
    struct hub_jschema_result r;
    struct hub_jschema *s = compile_ok("{\"pattern\": \"(?=a*[bc])\"}");
    json_t *str = long_string("", 'a', 200000);
    double t0 = now_ms();
    assert_int_equal(hub_jschema_validate(s, str, &r), HUB_ERANGE);
    double took = now_ms() - t0;
    printf("(?=a*[bc]) over 200,000 a's stopped after %.1f ms\n", took);
    assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_STEPS);
    assert_true(took < 3000);
    json_decref(str);
    hub_jschema_free(s);

    static const char *const subs[] = {"{\"format\": \"uri\"}", "{\"minLength\": 0}"};
    str = long_string("a:", '/', 1000000);
    for (size_t i = 0; i < 2; i++) {
        s = all_of(9000, subs[i]);
        t0 = now_ms();
        assert_int_equal(hub_jschema_validate(s, str, &r), HUB_ERANGE);
        took = now_ms() - t0;
        printf("9,000 x %s over 1 MB stopped after %.1f ms\n", subs[i], took);
        assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_STEPS);
        assert_true(took < 3000);
        hub_jschema_free(s);
    }
    json_decref(str);

    s = compile_ok("{\"pattern\": \"y\"}");
    str = long_string("", 'x', 1 << 20);
    assert_int_equal(hub_jschema_validate(s, str, &r), 0);
    assert_false(r.valid); /* no y: searched to the end, within the budget */
    json_decref(str);
    hub_jschema_free(s);
    s = compile_ok("{\"pattern\": \"^[a-z]+$\", \"minLength\": 1, \"format\": \"email\"}");
    str = long_string("", 'a', 200000);
    assert_int_equal(hub_jschema_validate(s, str, &r), 0);
    assert_int_equal(r.limit, HUB_JSCHEMA_LIMIT_NONE);
    json_decref(str);
    hub_jschema_free(s);
}

/* An object schema of n properties p0..p<n-1>, each with pattern re
 * (returns owned). */
static json_t *many_patterns(size_t n, const char *re) {
    json_t *props = json_object();
    for (size_t i = 0; i < n; i++) {
        char name[24];
        snprintf(name, sizeof name, "p%zu", i);
        json_object_set_new(props, name, json_pack("{s:s, s:s}", "type", "string", "pattern", re));
    }
    return json_pack("{s:s, s:o}", "type", "object", "properties", props);
}

/*
 * The compile itself can be the attack: 9,000 properties each with a
 * pattern of nested counted repeats is a valid 0.6 MiB draft-07 document
 * that took seconds of CPU and ~480 MiB of JIT code to compile.  The
 * pattern count and compiled-size limits refuse it after a few dozen
 * patterns, naming the pattern that crossed the limit.
 */
static void test_compile_bounds_hostile_patterns(void **state) {
    (void)state;
    json_t *doc = many_patterns(9000, "(?:(?:[a-z]\\d?){1,30}){1,30}");
    struct hub_jschema *s = NULL;
    struct hub_jschema_error err;
    double t0 = now_ms();
    int rc = hub_jschema_compile(doc, NULL, &s, &err);
    double took = now_ms() - t0;
    json_decref(doc);
    print_message("hostile 9,000-pattern schema refused in %.1f ms: %s at %s\n", took, err.message,
                  err.pointer);
    assert_int_equal(rc, HUB_ERANGE);
    assert_null(s);
    assert_true(strncmp(err.pointer, "/properties/p", 13) == 0);
    assert_non_null(strstr(err.pointer, "/pattern"));
    assert_non_null(strstr(err.message, "compiled patterns over"));
    /* seconds before the limit; the meta-schema check of 0.6 MiB remains */
    assert_true(took < 1500);

    /* the count limit, with patterns that compile small */
    doc = many_patterns(300, "^a$");
    rc = hub_jschema_compile(doc, NULL, &s, &err);
    assert_int_equal(rc, HUB_ERANGE);
    assert_non_null(strstr(err.message, "more than 256 patterns"));
    assert_non_null(strstr(err.pointer, "/pattern"));
    json_decref(doc);
    doc = many_patterns(256, "^a$");
    assert_int_equal(hub_jschema_compile(doc, NULL, &s, &err), 0);
    hub_jschema_free(s);
    json_decref(doc);

    /* a lower compiled-size limit names the first pattern over it */
    struct hub_jschema_limits l = {.max_regex_bytes = 1};
    compile_fails("{\"properties\": {\"a\": {\"pattern\": \"x\"}}}", &l, HUB_ERANGE,
                  "/properties/a/pattern");
    l = (struct hub_jschema_limits){.max_patterns = 1};
    compile_fails("{\"properties\": {\"a\": {\"pattern\": \"x\"}}, "
                  "\"patternProperties\": {\"^y\": {}}}",
                  &l, HUB_ERANGE, "/patternProperties/^y");
}

/* Patterns behave as ECMA-262 says where schemas rely on it: searched,
 * `$` only at the very end, code points not bytes, \u escapes. */
static void test_pattern_dialect(void **state) {
    (void)state;
    static const struct {
        const char *schema, *instance;
        int valid;
    } cases[] = {
        {"{\"pattern\": \"b\"}", "\"abc\"", 1},            /* searched, not anchored */
        {"{\"pattern\": \"^abc$\"}", "\"abc\\n\"", 0},     /* $ only at the very end */
        {"{\"pattern\": \"^.$\"}", "\"\\u00e9\"", 1},      /* . is a character */
        {"{\"pattern\": \"^\\\\u0041$\"}", "\"A\"", 1},    /* \u escapes */
        {"{\"maxLength\": 2}", "\"\\u00e9\\u00e9\"", 1},   /* code points, not bytes */
        {"{\"pattern\": \"^\\\\d+$\"}", "\"\\u0663\"", 0}, /* \d is ASCII */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct hub_jschema *s = compile_ok(cases[i].schema);
        struct hub_jschema_result r;
        assert_int_equal(check(s, cases[i].instance, &r), 0);
        if (r.valid != cases[i].valid) {
            fail_msg("%s on %s: got %d", cases[i].schema, cases[i].instance, r.valid);
        }
        hub_jschema_free(s);
    }
}

/* The three asserting formats, valid and invalid shapes of each, and an
 * annotation-only format that always passes. */
static void test_formats(void **state) {
    (void)state;
    static const struct {
        const char *format, *value;
        int valid;
    } cases[] = {
        {"date-time", "2026-12-06T08:35:53Z", 1},
        {"date-time", "2026-12-06t08:35:53.123+01:00", 1},
        {"date-time", "2024-02-29T00:00:00Z", 1},
        {"date-time", "2023-02-29T00:00:00Z", 0},
        {"date-time", "2026-12-06 08:35:53Z", 0},
        {"date-time", "2026-12-06T08:35:53", 0},
        {"date-time", "2026-13-06T08:35:53Z", 0},
        {"date-time", "1998-12-31T23:59:60Z", 1},
        {"date-time", "1998-12-31T22:59:60Z", 0},
        {"uri", "https://example.com/a?b=c#d", 1},
        {"uri", "urn:isbn:0451450523", 1},
        {"uri", "//example.com/relative", 0},
        {"uri", "http://exa mple.com", 0},
        {"uri", "http://example.com/%zz", 0},
        {"email", "joe.bloggs@example.com", 1},
        {"email", "\"joe bloggs\"@example.com", 1},
        {"email", "joe@[127.0.0.1]", 1},
        {"email", ".joe@example.com", 0},
        {"email", "joe..bloggs@example.com", 0},
        {"email", "joe@-example.com", 0},
        {"email", "joe", 0},
        {"hostname", "not checked: an annotation", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"format\": \"%s\"}", cases[i].format);
        struct hub_jschema *s = compile_ok(schema);
        json_t *v = json_string(cases[i].value);
        struct hub_jschema_result r;
        assert_int_equal(hub_jschema_validate(s, v, &r), 0);
        if (r.valid != cases[i].valid) {
            fail_msg("%s \"%s\": got %d", cases[i].format, cases[i].value, r.valid);
        }
        json_decref(v);
        hub_jschema_free(s);
    }
}

/* A 1 KiB order event: 10 properties with types, bounds and a pattern. */
static const char bench_schema[] =
    "{\"type\": \"object\", \"required\": [\"id\", \"amount\", \"currency\"],"
    "\"additionalProperties\": false, \"properties\": {"
    "\"id\": {\"type\": \"string\", \"pattern\": \"^ord-[0-9a-f]{8}-[0-9a-f]{4}$\"},"
    "\"amount\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 1000000},"
    "\"currency\": {\"enum\": [\"EUR\", \"USD\", \"BRL\"]},"
    "\"quantity\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 1000},"
    "\"customer\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 64},"
    "\"created\": {\"type\": \"string\", \"format\": \"date-time\"},"
    "\"paid\": {\"type\": \"boolean\"},"
    "\"tags\": {\"type\": \"array\", \"maxItems\": 10, \"items\": {\"type\": \"string\"}},"
    "\"channel\": {\"type\": \"string\", \"maxLength\": 16},"
    "\"note\": {\"type\": \"string\", \"maxLength\": 2000}}}";

static json_t *bench_instance(void) {
    char note[840];
    memset(note, 'n', sizeof note - 1);
    note[sizeof note - 1] = '\0';
    json_t *j = json_pack("{s:s, s:f, s:s, s:i, s:s, s:s, s:b, s:[s,s,s], s:s, s:s}", "id",
                          "ord-0123abcd-beef", "amount", 1234.5, "currency", "EUR", "quantity", 3,
                          "customer", "customer-42", "created", "2026-12-06T08:35:53Z", "paid", 1,
                          "tags", "a", "b", "c", "channel", "web", "note", note);
    assert_non_null(j);
    return j;
}

/* Prints (does not assert) the cost of the issue's reference payload, and
 * jansson's parse of the same text for scale: ingest parses it anyway. */
static void test_bench_1k_object(void **state) {
    (void)state;
    struct hub_jschema *s = compile_ok(bench_schema);
    json_t *inst = bench_instance();
    char *text = json_dumps(inst, JSON_COMPACT);
    size_t bytes = strlen(text);
    struct hub_jschema_result r;
    assert_int_equal(hub_jschema_validate(s, inst, &r), 0);
    assert_true(r.valid);
    const int n = 20000;
    double t0 = now_ms();
    for (int i = 0; i < n; i++) {
        hub_jschema_validate(s, inst, &r);
    }
    double t_val = now_ms() - t0;
    /* the parse ingest does anyway, for scale */
    t0 = now_ms();
    for (int i = 0; i < n; i++) {
        json_decref(json_loads(text, 0, NULL));
    }
    double t_parse = now_ms() - t0;
    printf("validate a %zu-byte object of 10 properties: %.2f us each (%" PRIu64
           " steps); json_loads of it: %.2f us; ratio %.2f\n",
           bytes, 1000.0 * t_val / n, r.steps, 1000.0 * t_parse / n, t_val / t_parse);
    free(text);
    json_decref(inst);
    hub_jschema_free(s);
}

struct worker {
    const struct hub_jschema *s;
    json_t *good, *bad;
    int wrong;
};

/* Validates a good and a bad instance alternately; counts wrong answers. */
static void *worker_run(void *arg) {
    struct worker *w = arg;
    for (int i = 0; i < 3000; i++) {
        struct hub_jschema_result r;
        const json_t *x = i % 2 ? w->bad : w->good;
        if (hub_jschema_validate(w->s, x, &r) != 0 || r.valid != !(i % 2) ||
            (!r.valid && strcmp(r.errors[0].instance, "/amount") != 0)) {
            w->wrong++;
        }
    }
    return NULL;
}

/* One compiled schema, four threads validating at once: every answer and
 * error pointer is the same as a lone thread's (run under TSan too). */
static void test_concurrent_validation(void **state) {
    (void)state;
    struct hub_jschema *s = compile_ok(bench_schema);
    json_t *good = bench_instance();
    json_t *bad = json_deep_copy(good);
    json_object_set_new(bad, "amount", json_integer(-1));
    struct worker w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){s, good, bad, 0};
        assert_int_equal(pthread_create(&t[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].wrong, 0);
    }
    json_decref(good);
    json_decref(bad);
    hub_jschema_free(s);
}

/* Compiles the bench schema and validates once; counts failures. */
static void *compile_run(void *arg) {
    int *wrong = arg;
    for (int i = 0; i < 20; i++) {
        json_t *j = json_loads(bench_schema, 0, NULL);
        struct hub_jschema *s = NULL;
        json_t *inst = bench_instance();
        struct hub_jschema_result r;
        if (!j || hub_jschema_compile(j, NULL, &s, NULL) != 0 ||
            hub_jschema_validate(s, inst, &r) != 0 || !r.valid) {
            (*wrong)++;
        }
        hub_jschema_free(s);
        json_decref(inst);
        json_decref(j);
    }
    return NULL;
}

/* Compiles from several threads at once: the first ones race to build the
 * shared meta-schema (built once, by pthread_once). */
static void test_concurrent_compile(void **state) {
    (void)state;
    int wrong[4] = {0};
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_create(&t[i], NULL, compile_run, &wrong[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(wrong[i], 0);
    }
}

/* The rules hub_jschema_compat reports, as "rule@pointer" lines. */
/* Registration's 409 lists these: compared here as one string so a test
 * shows every rule and pointer at once when it fails. */
static char *compat_rules(const char *old_text, const char *new_text) {
    json_t *o = parse(old_text), *n = parse(new_text), *changes = NULL;
    assert_int_equal(hub_jschema_compat(o, n, &changes), 0);
    char *out = calloc(1, 4096);
    size_t i;
    json_t *c;
    json_array_foreach(changes, i, c) {
        snprintf(out + strlen(out), 4096 - strlen(out), "%s%s@%s", i ? " " : "",
                 json_string_value(json_object_get(c, "rule")),
                 json_string_value(json_object_get(c, "pointer")));
        assert_non_null(json_string_value(json_object_get(c, "reason")));
    }
    json_decref(o);
    json_decref(n);
    json_decref(changes);
    return out;
}

static void expect_compat(const char *old_text, const char *new_text, const char *want) {
    char *got = compat_rules(old_text, new_text);
    if (strcmp(got, want) != 0) {
        fail_msg("%s -> %s: got \"%s\", want \"%s\"", old_text, new_text, got, want);
    }
    free(got);
}

/* enum comparison: values equal as js_equal sees them (1 and 1.0, objects
 * in any member order) are kept; two enums of 100,000 values compare in a
 * moment (every pair compared took a minute). */
static void test_compat_enums(void **state) {
    (void)state;
    expect_compat("{\"enum\": [1, {\"a\": 1, \"b\": [2]}, \"x\", null]}",
                  "{\"enum\": [null, {\"b\": [2.0], \"a\": 1.0}, \"x\", 1.0, 7]}", "");
    expect_compat("{\"enum\": [1, {\"a\": 1, \"b\": [2]}]}",
                  "{\"enum\": [1, {\"a\": 1, \"b\": [3]}]}", "enum-narrowed@/enum");
    json_t *o = json_array(), *n = json_array(), *changes = NULL;
    for (int i = 0; i < 100000; i++) {
        json_array_append_new(o, json_integer(i));
    }
    for (int i = 99998; i >= 0; i--) { /* reversed, the last value gone */
        json_array_append_new(n, json_integer(i));
    }
    json_t *os = json_pack("{s:o}", "enum", o), *ns = json_pack("{s:o}", "enum", n);
    double t0 = now_ms();
    assert_int_equal(hub_jschema_compat(os, ns, &changes), 0);
    double took = now_ms() - t0;
    printf("enums of 100,000 values compared in %.1f ms\n", took);
    assert_int_equal(json_array_size(changes), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(changes, 0), "rule")),
                        "enum-narrowed");
    assert_true(took < 2000);
    json_decref(changes);
    json_decref(os);
    json_decref(ns);
    /* one value repeated 100,000 times in the new enum: stored once, no
     * long run of slots to probe */
    o = json_array();
    n = json_array();
    for (int i = 0; i < 100000; i++) {
        json_array_append_new(n, json_integer(7));
        json_array_append_new(o, json_integer(i % 2 ? 7 : 8));
    }
    os = json_pack("{s:o}", "enum", o);
    ns = json_pack("{s:o}", "enum", n);
    t0 = now_ms();
    assert_int_equal(hub_jschema_compat(os, ns, &changes), 0);
    took = now_ms() - t0;
    printf("an enum of one value 100,000 times compared in %.1f ms\n", took);
    assert_int_equal(json_array_size(changes), 1); /* 8 is gone */
    assert_true(took < 2000);
    json_decref(changes);
    json_decref(os);
    json_decref(ns);
}

/*
 * Compatible evolutions report nothing; each breaking rule is reported
 * with its pointer, in walk order; $refs are followed on both sides and a
 * recursive schema terminates; true/false schemas; non-schemas refused.
 */
static void test_compat_rules(void **state) {
    (void)state;
    const char *base = "{\"type\": \"object\", \"required\": [\"id\"], \"properties\": {"
                       "\"id\": {\"type\": \"string\"}, \"amount\": {\"type\": \"number\", "
                       "\"minimum\": 0, \"maximum\": 100}, \"kind\": {\"enum\": [\"a\", \"b\"]}}}";
    /* compatible: identical, a new optional property, wider bounds and enum, a type widened */
    expect_compat(base, base, "");
    expect_compat(base,
                  "{\"type\": \"object\", \"required\": [\"id\"], \"properties\": {"
                  "\"id\": {\"type\": [\"string\", \"integer\"]}, \"amount\": {\"type\": "
                  "\"number\", \"minimum\": -5, \"exclusiveMaximum\": 1000}, \"kind\": {\"enum\": "
                  "[\"a\", \"b\", \"c\"]}, \"note\": {\"type\": \"string\"}}}",
                  "");
    /* each breaking rule */
    expect_compat(base,
                  "{\"type\": \"object\", \"required\": [\"id\", \"amount\"], \"properties\": {"
                  "\"id\": {\"type\": \"string\"}, \"amount\": {\"type\": \"number\", "
                  "\"minimum\": 0, \"maximum\": 100}, \"kind\": {\"enum\": [\"a\", \"b\"]}}}",
                  "required-added@/required/1");
    expect_compat(base,
                  "{\"type\": \"object\", \"required\": [\"id\"], \"properties\": {"
                  "\"id\": {\"type\": \"string\"}, \"amount\": {\"type\": \"string\"}, "
                  "\"kind\": {\"enum\": [\"a\"]}}}",
                  "type-narrowed@/properties/amount/type enum-narrowed@/properties/kind/enum");
    expect_compat(base,
                  "{\"type\": \"object\", \"required\": [\"id\"], \"properties\": {"
                  "\"id\": {\"type\": \"string\", \"pattern\": \"^x\"}, \"amount\": {\"type\": "
                  "\"integer\", \"minimum\": 1, \"exclusiveMaximum\": 100}}, "
                  "\"additionalProperties\": false}",
                  "pattern-narrowed@/properties/id/pattern "
                  "type-narrowed@/properties/amount/type "
                  "bound-narrowed@/properties/amount/exclusiveMaximum "
                  "bound-narrowed@/properties/amount/minimum "
                  "property-removed@/properties/kind "
                  "additional-tightened@/additionalProperties");
    expect_compat("{\"additionalProperties\": {\"type\": \"string\"}}",
                  "{\"properties\": {\"x\": {\"type\": \"integer\"}}, \"additionalProperties\": "
                  "{\"type\": \"string\", \"maxLength\": 3}}",
                  "type-narrowed@/properties/x/type "
                  "bound-narrowed@/additionalProperties/maxLength");
    expect_compat("{\"items\": {\"type\": \"string\"}, \"maxItems\": 5}",
                  "{\"items\": {\"type\": \"string\", \"format\": \"email\"}, \"maxItems\": 4, "
                  "\"uniqueItems\": true}",
                  "bound-narrowed@/maxItems uniqueItems-added@/uniqueItems "
                  "format-added@/items/format");
    /* $refs are followed on both sides; a recursive schema terminates */
    expect_compat("{\"definitions\": {\"n\": {\"type\": \"object\", \"properties\": {\"next\": "
                  "{\"$ref\": \"#/definitions/n\"}, \"v\": {\"type\": \"number\"}}}}, \"$ref\": "
                  "\"#/definitions/n\"}",
                  "{\"definitions\": {\"n\": {\"type\": \"object\", \"properties\": {\"next\": "
                  "{\"$ref\": \"#/definitions/n\"}, \"v\": {\"type\": \"integer\"}}}}, \"$ref\": "
                  "\"#/definitions/n\"}",
                  "type-narrowed@/properties/v/type");
    expect_compat("{\"multipleOf\": 2}", "{\"multipleOf\": 4}", "bound-narrowed@/multipleOf");
    expect_compat("{\"multipleOf\": 4}", "{\"multipleOf\": 2}", "");
    expect_compat("{\"multipleOf\": 0.5}", "{\"multipleOf\": 0.25}", "");
    expect_compat("{\"type\": \"string\"}", "{\"type\": \"string\", \"minLength\": 1}",
                  "bound-narrowed@/minLength");
    expect_compat("{}", "{\"patternProperties\": {\"^x-\": {\"type\": \"string\"}}}",
                  "patternProperties-added@/patternProperties/^x-");
    expect_compat("{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}",
                  "{\"anyOf\": [{\"type\": \"string\"}]}", "anyOf-changed@/anyOf");
    expect_compat("{\"dependencies\": {\"a\": [\"b\"]}}",
                  "{\"dependencies\": {\"a\": [\"b\", \"c\"]}}",
                  "dependency-added@/dependencies/a");
    expect_compat("{\"dependencies\": {\"a\": [\"b\", \"c\"]}}",
                  "{\"dependencies\": {\"a\": [\"b\"]}}", "");
    expect_compat("{\"additionalProperties\": {\"type\": \"string\"}}",
                  "{\"additionalProperties\": false}", "schema-false@/additionalProperties");
    expect_compat("{\"not\": {\"type\": \"null\"}}", "{\"not\": {\"type\": \"string\"}}",
                  "conditional-changed@/not");
    expect_compat("{\"properties\": {\"a\": {\"$ref\": \"http://example.com/a.json\"}}}",
                  "{\"properties\": {\"a\": {\"$ref\": \"http://example.com/b.json\"}}}",
                  "ref-changed@/properties/a/$ref");
    expect_compat("true", "false", "schema-false@");
    /* past the pair cap the check refuses rather than passes what it did not compare */
    json_t *props = json_object();
    for (int i = 0; i < 25000; i++) {
        char k[16];
        snprintf(k, sizeof k, "p%d", i);
        json_object_set_new(props, k, json_pack("{s:s}", "type", "string"));
    }
    json_t *big = json_pack("{s:o}", "properties", props), *found = NULL;
    assert_int_equal(hub_jschema_compat(big, big, &found), 0);
    assert_int_equal(json_array_size(found), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(found, 0), "rule")),
                        "not-checked");
    json_decref(found);
    json_decref(big);
    expect_compat("false", "{\"type\": \"string\"}", "");
    json_t *changes = NULL, *num = json_integer(3), *obj = json_object();
    assert_int_equal(hub_jschema_compat(num, obj, &changes), HUB_EINVAL);
    json_decref(num);
    json_decref(obj);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* first: the meta-schema is built by whichever thread gets there */
        cmocka_unit_test(test_concurrent_compile),
        cmocka_unit_test(test_compile_errors_name_the_pointer),
        cmocka_unit_test(test_errors_name_pointer_keyword_and_schema),
        cmocka_unit_test(test_bounds_stop_hostile_work),
        cmocka_unit_test(test_bounds_stop_long_subjects),
        cmocka_unit_test(test_compile_bounds_hostile_patterns),
        cmocka_unit_test(test_pattern_dialect),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_bench_1k_object),
        cmocka_unit_test(test_concurrent_validation),
        cmocka_unit_test(test_compat_rules),
        cmocka_unit_test(test_compat_enums),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
