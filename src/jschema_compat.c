/*
 * jschema_compat — placeholder until the rules land.
 */
#include "error.h"
#include "jschema_int.h"

int hub_jschema_compat(const json_t *old_schema, const json_t *new_schema, json_t **changes) {
    *changes = json_array();
    return *changes ? 0 : HUB_ENOMEM;
}
