/*
 * libFuzzer target for hub_duration_parse() (config.h): durations such as
 * "500ms", "30s", "2m", "120h", "1h30m".
 *
 * Input framing: the whole input is the string, NUL-terminated by the
 * target (an embedded NUL simply ends the string early).  The input is
 * copied into an exactly-sized heap block so AddressSanitizer catches a
 * read past the terminator.
 *
 * Invariants: the parser returns 0 or -1 and a parsed duration is never
 * negative (the grammar has no sign and overflow must be refused); the
 * list parser returns -1 or a count between 1 and its capacity.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (s == NULL) {
        return 0;
    }
    if (size > 0) {
        memcpy(s, data, size);
    }
    s[size] = '\0';

    int64_t ms = -1;
    int rc = hub_duration_parse(s, &ms);
    CHECK(rc == 0 || rc == -1);
    if (rc == 0) {
        CHECK(ms >= 0);
    }

    int64_t list[8];
    int count = hub_duration_list_parse(s, list, sizeof(list) / sizeof(list[0]));
    CHECK(count == -1 || (count >= 1 && count <= 8));
    for (int i = 0; i < count; i++) {
        CHECK(list[i] >= 0);
    }

    free(s);
    return 0;
}
