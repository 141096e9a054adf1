/* error: every code has its own description, and negative errno values pass through. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"

static void test_codes_described(void **state) {
    const int codes[] = {HUB_OK,      HUB_EINVAL, HUB_ENOMEM,    HUB_EIO,       HUB_ENOENT,
                         HUB_ERANGE,  HUB_EEXIST, HUB_ECANCELED, HUB_ETIMEDOUT, HUB_EAGAIN,
                         HUB_ECRYPTO, HUB_EDB,    HUB_EKAFKA,    HUB_ELUA};
    size_t n = sizeof(codes) / sizeof(codes[0]);
    (void)state;
    for (size_t i = 0; i < n; i++) {
        const char *s = hub_strerror(codes[i]);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown error");
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(s, hub_strerror(codes[j]));
        }
    }
    assert_string_equal(hub_strerror(-EPIPE), strerror(EPIPE));
    assert_string_equal(hub_strerror(5), "unknown error");
    assert_string_equal(hub_strerror(-9999), "unknown error");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_codes_described)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
