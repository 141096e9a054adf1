/*
 * The official JSON Schema Test Suite (draft7) against src/jschema.c.
 *
 * Runs every case of every keyword file in the suite's draft7 directory
 * (Debian's json-schema-test-suite package; JSON_SCHEMA_TEST_SUITE names
 * another draft7 directory) and prints, per file, how many cases passed,
 * failed and were skipped, then each failure.  Skipped: refRemote.json,
 * whose schemas `$ref` documents on a web server (the validator never
 * fetches).  The optional/ files run too and are printed, but do not count
 * toward the required rate; a file jansson cannot load (bignum.json, its
 * integers overflow 64 bits) is listed as skipped.  Fails when fewer than
 * 95% of the required cases pass.  Under the sanitizer build every case
 * runs under ASan and UBSan.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "jschema.h"

#define SUITE_DIR "/usr/share/json-schema-test-suite/tests/draft7"

/* Files skipped whole, with the reason printed beside them. */
static const struct {
    const char *file, *reason;
} skipped_files[] = {
    {"refRemote.json", "remote $ref: the validator does not fetch"},
};

struct tally {
    int passed, failed, skipped;
};

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted *.json names in dir (owned array of owned names); n set. */
static char **list_json(const char *dir, size_t *n) {
    DIR *d = opendir(dir);
    char **v = NULL;
    *n = 0;
    if (!d) {
        return NULL;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0) {
            v = realloc(v, (*n + 1) * sizeof *v);
            assert_non_null(v);
            v[(*n)++] = strdup(e->d_name);
        }
    }
    closedir(d);
    qsort(v, *n, sizeof *v, name_cmp);
    return v;
}

/* Runs the cases of one file into *t; failures go to the failures log. */
/* A group whose schema does not compile fails all its cases (the compile
 * error is printed); each case compares the verdict with "valid". */
static void run_file(const char *path, const char *label, struct tally *t, FILE *failures) {
    json_error_t jerr;
    json_t *groups = json_load_file(path, 0, &jerr);
    if (!groups) {
        fprintf(failures, "  %s: not loaded (%s): skipped\n", label, jerr.text);
        t->skipped++;
        return;
    }
    size_t gi;
    json_t *g;
    json_array_foreach(groups, gi, g) {
        const char *gdesc = json_string_value(json_object_get(g, "description"));
        json_t *tests = json_object_get(g, "tests");
        struct hub_jschema *s = NULL;
        struct hub_jschema_error err;
        int rc = hub_jschema_compile(json_object_get(g, "schema"), NULL, &s, &err);
        size_t ti;
        json_t *tc;
        json_array_foreach(tests, ti, tc) {
            const char *tdesc = json_string_value(json_object_get(tc, "description"));
            int want = json_is_true(json_object_get(tc, "valid"));
            if (rc < 0) {
                t->failed++;
                fprintf(failures, "  %s: %s / %s: compile failed at \"%s\": %s\n", label, gdesc,
                        tdesc, err.pointer, err.message);
                continue;
            }
            struct hub_jschema_result res;
            int vr = hub_jschema_validate(s, json_object_get(tc, "data"), &res);
            if (vr == 0 && res.valid == want) {
                t->passed++;
            } else {
                t->failed++;
                fprintf(failures, "  %s: %s / %s: expected %s, got %s%s%s\n", label, gdesc, tdesc,
                        want ? "valid" : "invalid",
                        vr < 0      ? "a stop"
                        : res.valid ? "valid"
                                    : "invalid",
                        res.nerrors ? " at " : "", res.nerrors ? res.errors[0].keyword : "");
            }
        }
        hub_jschema_free(s);
    }
    json_decref(groups);
}

/*
 * The README table comes from this output: one row per keyword file with
 * passed, failed and skipped counts, the required total and rate, then one
 * line per failure (optional files included) saying what was expected.
 */
static void test_official_suite(void **state) {
    (void)state;
    const char *dir = getenv("JSON_SCHEMA_TEST_SUITE");
    if (!dir || !*dir) {
        dir = SUITE_DIR;
    }
    char opt[1024], fmt[1024];
    snprintf(opt, sizeof opt, "%s/optional", dir);
    snprintf(fmt, sizeof fmt, "%s/optional/format", dir);
    size_t nreq = 0, nopt = 0, nfmt = 0;
    char **req = list_json(dir, &nreq);
    char **optf = list_json(opt, &nopt);
    char **fmtf = list_json(fmt, &nfmt);
    /* optional/format/x.json joins the optional list as "format/x.json" */
    for (size_t i = 0; i < nfmt; i++) {
        optf = realloc(optf, (nopt + 1) * sizeof *optf);
        assert_non_null(optf);
        size_t l = strlen(fmtf[i]) + 8;
        optf[nopt] = malloc(l);
        assert_non_null(optf[nopt]);
        snprintf(optf[nopt++], l, "format/%s", fmtf[i]);
        free(fmtf[i]);
    }
    free(fmtf);
    if (!req || nreq == 0) {
        fail_msg("no draft7 files in %s (install json-schema-test-suite)", dir);
    }
    char *fbuf = NULL;
    size_t fsize = 0;
    FILE *failures = open_memstream(&fbuf, &fsize);
    assert_non_null(failures);
    struct tally total = {0};
    printf("| file | passed | failed | skipped |\n|---|---:|---:|---:|\n");
    for (size_t i = 0; i < nreq + nopt; i++) {
        int optional = i >= nreq;
        const char *name = optional ? optf[i - nreq] : req[i];
        char path[2048], label[512];
        snprintf(path, sizeof path, "%s/%s", optional ? opt : dir, name);
        snprintf(label, sizeof label, "%s%s", optional ? "optional/" : "", name);
        struct tally t = {0};
        const char *why = NULL;
        for (size_t k = 0; k < sizeof skipped_files / sizeof *skipped_files; k++) {
            if (strcmp(name, skipped_files[k].file) == 0) {
                why = skipped_files[k].reason;
            }
        }
        if (why) {
            json_t *doc = json_load_file(path, 0, NULL);
            size_t gi;
            json_t *g;
            json_array_foreach(doc, gi, g) {
                t.skipped += (int)json_array_size(json_object_get(g, "tests"));
            }
            json_decref(doc);
        } else {
            run_file(path, label, &t, failures);
        }
        printf("| %s%s | %d | %d | %d%s%s |\n", label, optional ? " (optional, not counted)" : "",
               t.passed, t.failed, t.skipped, why ? ": " : "", why ? why : "");
        if (!optional) {
            total.passed += t.passed;
            total.failed += t.failed;
            total.skipped += t.skipped;
        }
    }
    fclose(failures);
    int counted = total.passed + total.failed;
    double rate = counted ? 100.0 * total.passed / counted : 0;
    printf("| **required total** | %d | %d | %d |\n", total.passed, total.failed, total.skipped);
    printf("required cases passed: %.1f%% (%d of %d run; %d skipped)\n", rate, total.passed,
           counted, total.skipped);
    printf("failures:\n%s", fsize ? fbuf : "  none\n");
    free(fbuf);
    for (size_t i = 0; i < nreq; i++) {
        free(req[i]);
    }
    for (size_t i = 0; i < nopt; i++) {
        free(optf[i]);
    }
    free(req);
    free(optf);
    if (rate < 95.0) {
        fail_msg("%.1f%% of the required draft7 cases passed, under 95%%", rate);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_official_suite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
