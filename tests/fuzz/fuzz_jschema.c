/*
 * libFuzzer target for src/jschema*.c over (schema, instance) pairs.
 *
 * The input is a schema document, a NUL byte, and an instance document
 * (without a NUL, the same bytes are both).  When the schema compiles, the
 * instance is validated twice and the invariants checked: the run ends in
 * a verdict or at a bound (never another code), a valid verdict has no
 * errors and an invalid one has at least one, two runs that both reach a
 * verdict agree (a pattern search is charged its CPU time too, so one run
 * may meet the budget where the other does not), and the step count stays
 * within twice the budget (the charge that ends a run may overshoot it, a
 * timed search by at most the time it was given).  The schema is also compared with
 * itself by the compatibility check, which must find no breaking change,
 * and with the instance (read as a schema) both ways, for crashes only.
 * Any broken invariant aborts; crashes, leaks and UB are the sanitizers'.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "jschema.h"

static json_t *load(const uint8_t *p, size_t n) {
    return json_loadb((const char *)p, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    json_t *schema = load(data, slen);
    if (!schema) {
        return 0;
    }
    json_t *inst = nul ? load(nul + 1, size - slen - 1) : json_incref(schema);
    struct hub_jschema_limits l = {.max_steps = 200000, .max_depth = 32};
    struct hub_jschema *s = NULL;
    struct hub_jschema_error err;
    int rc = hub_jschema_compile(schema, &l, &s, &err);
    if (rc != 0 && rc != HUB_EINVAL && rc != HUB_ERANGE && rc != HUB_ENOMEM) {
        abort();
    }
    if (rc == 0 && inst) {
        struct hub_jschema_result a, b;
        int ra = hub_jschema_validate(s, inst, &a);
        int rb = hub_jschema_validate(s, inst, &b);
        if ((ra != 0 && ra != HUB_ERANGE && ra != HUB_ENOMEM) ||
            (rb != 0 && rb != HUB_ERANGE && rb != HUB_ENOMEM) ||
            (ra == 0 && rb == 0 && a.valid != b.valid) || a.steps > 2 * l.max_steps ||
            b.steps > 2 * l.max_steps) {
            abort();
        }
        if (ra == 0 && a.valid != (a.nerrors == 0)) {
            fprintf(stderr, "verdict %d with %zu errors\n", a.valid, a.nerrors);
            abort();
        }
    }
    if (rc == 0) {
        json_t *changes = NULL;
        if (hub_jschema_compat(schema, schema, &changes) == 0 && json_array_size(changes) != 0) {
            char *t = json_dumps(changes, 0);
            fprintf(stderr, "a schema breaks itself: %s\n", t ? t : "?");
            abort();
        }
        json_decref(changes);
        /* the instance read as a schema: the check must not crash on pairs
         * of unrelated documents either way round */
        if (inst && (json_is_object(inst) || json_is_boolean(inst))) {
            if (hub_jschema_compat(schema, inst, &changes) == 0) {
                json_decref(changes);
            }
            if (hub_jschema_compat(inst, schema, &changes) == 0) {
                json_decref(changes);
            }
        }
    }
    hub_jschema_free(s);
    json_decref(inst);
    json_decref(schema);
    return 0;
}
