/* schema_registry: the semver versions the registry takes (SPEC §3.5). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "error.h"
#include "schema_registry.h"

static void test_versions_taken(void **state) {
    int a, b, c;
    (void)state;
    assert_int_equal(hub_schema_version_parse("1.0.0", &a, &b, &c), 0);
    assert_int_equal(a * 100 + b * 10 + c, 100);
    assert_int_equal(hub_schema_version_parse("10.20.30", &a, &b, &c), 0);
    assert_int_equal(a, 10);
    assert_int_equal(b, 20);
    assert_int_equal(c, 30);
    assert_int_equal(hub_schema_version_parse("0.0.0", &a, &b, &c), 0);
    assert_int_equal(hub_schema_version_parse("999999999.0.1", &a, &b, &c), 0);
    assert_int_equal(a, 999999999);
}

/* Two spellings of one version would be two versions: leading zeros,
 * missing parts, pre-release and build parts are refused. */
static void test_versions_refused(void **state) {
    static const char *const bad[] = {
        "",       "1",      "1.0",    "1.0.0.0", "01.0.0", "1.00.0", "1.0.0-rc1",      "1.0.0+b",
        "v1.0.0", " 1.0.0", "1.0.0 ", "1..0",    "-1.0.0", "1.0.x",  "1000000000.0.0", "1.0.0\n",
        "a.b.c",  ".1.0",
    };
    int a, b, c;
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (hub_schema_version_parse(bad[i], &a, &b, &c) != HUB_EINVAL) {
            fail_msg("\"%s\" was taken", bad[i]);
        }
    }
    assert_int_equal(hub_schema_version_parse(NULL, &a, &b, &c), HUB_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_versions_taken),
        cmocka_unit_test(test_versions_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
