/*
 * api_schemas — the schema registry's routes (SPEC §3.5, docs/schemas.md):
 *
 *   /admin/schemas                              GET     the platform's versions
 *   /admin/schemas/{event_type}                 GET     one type's versions
 *                                               PUT     its settings
 *   /admin/schemas/{event_type}/{version}       PUT GET DELETE
 *   /v1/schemas ...                             the same for the key's tenant;
 *                                               GET lists and fetches fall back
 *                                               to the platform's versions
 *
 * A registration compiles the schema (400 naming the schema pointer when
 * it is not valid draft-07), then checks it against the highest live
 * version below it in the same scope and major (409 naming each breaking
 * change), then stores it with its digest and audit row and pokes the
 * registry (schema_registry.h) so this process uses it at once; the others
 * within their poll.
 */
#ifndef HUB_API_SCHEMAS_H
#define HUB_API_SCHEMAS_H

#include <h2o.h>
#include <jansson.h>

struct hub;

/* The admin routes: segs[0] is "schemas", n the number of segments (the
 * admin token is already checked).  Borrows hub and req. */
void hub_api_schemas_admin(struct hub *hub, h2o_req_t *req, const h2o_iovec_t *segs, int n);

/* The tenant routes: returns 0 when the path is not under /v1/schemas,
 * else 1 (answered now or later). */
int hub_api_schemas_handle(struct hub *hub, h2o_req_t *req);

/*
 * HTTP ingest's answer to an event the schema step quarantined (SPEC §3.5):
 * 422 with detail and errors[] (owned by the caller) from the evidence
 * (JSON text, borrowed; NULL when memory ran out making it): each error
 * {"field": "data<pointer>", "message", "pointer", "keyword"}.  violation
 * is 1 for schema_violation, 0 for unknown_schema_version.
 */
void hub_api_schema_answer(int violation, const char *evidence, int *status, const char **detail,
                           json_t **errors);

#endif
