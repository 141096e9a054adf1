/*
 * api_admin — the operator API under /admin (SPEC §9): the tenant roster,
 * tenant API keys and the quarantine, behind the admin bearer token.
 */
#ifndef HUB_API_ADMIN_H
#define HUB_API_ADMIN_H

#include <h2o.h>

struct hub;

/*
 * Answers one request whose path is "/admin" or starts with "/admin/".
 * Checks the admin token first (401 for everything when it is missing, wrong
 * or not configured), then routes; unknown paths are 404 and known paths
 * with another method 405 with Allow.  Borrows hub and req; the answer may
 * be sent later, from a database callback.
 */
void hub_api_admin_handle(struct hub *hub, h2o_req_t *req);

#endif
