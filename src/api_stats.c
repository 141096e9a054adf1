/*
 * api_stats — GET /v1/stats and GET /admin/tenants/{id}/stats (see
 * api_stats.h): the window and group_by read from the query, then one
 * statement over the hourly rollups (store_stats.h), answered as JSON.
 */
#include "api_stats.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_util.h"
#include "envelope.h"
#include "hub.h"
#include "log.h"
#include "stats.h"
#include "store_stats.h"
#include "util.h"

#define STATS_PATH "/v1/stats"
#define HOUR_US (3600LL * 1000000)
/* The default window: the 24 hours before until. */
#define STATS_DEFAULT_HOURS 24

/* One stats request (api_util.h's call machinery). */
struct stats_call {
    struct hub_api_call call; /* first: see api_util.h */
    int admin;                /* the admin route: an unknown tenant is 404 */
    int route_status;         /* tenant route: 404 for paths under /v1/stats */
    char *tenant;
    int64_t since_h, until_h; /* the window, in Unix hours: since_h <= h < until_h */
    const char *group_by;     /* "source", "event_type" or NULL (static) */
};

/* on_free: the tenant copy. */
static void stats_call_free(struct hub_api_call *call) {
    free(((struct stats_call *)call)->tenant);
}

/* ---------------------------------------------------------------- input -- */

/* floor(a / b) for b > 0, also for a < 0 (times before 1970). */
static int64_t div_floor(int64_t a, int64_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* The Unix hour holding us. */
static int64_t hour_floor(int64_t us) {
    return div_floor(us, HOUR_US);
}

/* Counts a refused request and logs it, at most one line a minute. */
static void count_invalid(struct hub *hub, const char *tenant, const char *field) {
    struct hub_metrics *m = &hub->metrics;
    uint64_t now = hub_now_ns();
    uint64_t *last = &m->api_invalid_logged_ns[HUB_API_INVALID_STATS];

    m->api_invalid[HUB_API_INVALID_STATS]++;
    if (*last == 0 || now - *last > 60ULL * 1000000000ULL) {
        *last = now;
        hub_log(HUB_INFO, "stats request refused (bad input; logged once a minute)",
                HUB_LS("tenant", tenant ? tenant : ""), HUB_LS("field", field));
    }
}

/* One of since/until: absent (0, *us untouched), or RFC 3339 (0, *us set);
 * else an error naming it and HUB_EINVAL. */
static int window_param(h2o_req_t *req, const char *name, int64_t *us, json_t **errors) {
    const char *v = NULL;
    int rc = hub_api_query_param(req, name, &v);

    if (rc == 0) {
        return 0;
    }
    if (rc < 0 || hub_rfc3339_parse(v, strlen(v), us) != 0) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "%s must be an RFC 3339 time, e.g. 2026-01-31T10:00:00Z (a '+' offset is "
                 "written %%2B in a query)",
                 name);
        hub_api_errors_add(errors, name, msg);
        return HUB_EINVAL;
    }
    return 0;
}

/*
 * Reads the window and group_by into c.  Returns 0, or answers 400 (each
 * field at fault named) and returns HUB_EINVAL.
 */
static int stats_params(struct stats_call *c) {
    h2o_req_t *req = c->call.req;
    json_t *errors = NULL;
    const char *group_by = NULL;
    const char *bad = NULL;
    int64_t until_us = hub_unix_us();
    int64_t since_us;
    int since_rc, until_rc;

    until_rc = window_param(req, "until", &until_us, &errors);
    since_us = until_us - STATS_DEFAULT_HOURS * HOUR_US;
    since_rc = window_param(req, "since", &since_us, &errors);
    bad = until_rc != 0 ? "until" : since_rc != 0 ? "since" : NULL;
    if (since_rc == 0 && until_rc == 0 && since_us > until_us) {
        hub_api_errors_add(&errors, "since", "since must not be after until");
        bad = "since";
    }
    if (hub_api_query_param(req, "group_by", &group_by) < 0 ||
        (group_by != NULL && strcmp(group_by, "source") != 0 &&
         strcmp(group_by, "event_type") != 0)) {
        hub_api_errors_add(&errors, "group_by", "group_by must be source or event_type");
        bad = bad ? bad : "group_by";
    }
    if (errors != NULL) {
        count_invalid(c->call.hub, c->tenant, bad);
        hub_api_send_invalid(req, errors);
        return HUB_EINVAL;
    }
    c->group_by = group_by == NULL ? NULL : group_by[0] == 's' ? "source" : "event_type";
    /* whole hours covering [since, until) */
    c->since_h = hour_floor(since_us);
    c->until_h = hour_floor(until_us) + (until_us - hour_floor(until_us) * HOUR_US != 0);
    return 0;
}

/* ------------------------------------------------------------- answering -- */

/* An hour as RFC 3339 UTC: "2026-01-31T10:00:00Z". */
static json_t *hour_json(int64_t hour) {
    time_t t = (time_t)(hour * 3600);
    struct tm tm;
    char buf[32];

    gmtime_r(&t, &tm);
    strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(buf);
}

/* Sets the counters of row `row` of r on o. */
static void counters_set(json_t *o, PGresult *r, int row) {
    for (int k = 0; k < HUB_STAT__COUNT; k++) {
        json_object_set_new(
            o, hub_stat_name((enum hub_stat)k),
            json_integer(strtoll(PQgetvalue(r, row, HUB_STATS_COL_COUNTERS + k), NULL, 10)));
    }
}

/* The admin route's unknown tenant: 404 problem+json naming the path's
 * tenant as the field, as a bad window names its parameter. */
static void send_no_tenant(h2o_req_t *req) {
    json_t *errors = NULL;

    hub_api_errors_add(&errors, "tenant", "no such tenant");
    hub_api_send_problem(req, 404, "tenant not found", errors);
}

/* The statement's rows (store_stats.h): the totals first, then the groups
 * in their order. */
static void stats_done(struct hub_api_call *call, const struct hub_pg_outcome *out) {
    struct stats_call *c = (struct stats_call *)call;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;
    json_t *body, *groups;
    int rows;

    if (out->status != HUB_PG_OK || r == NULL || PQntuples(r) < 1) {
        hub_api_send_db_error(call->req, out);
        return;
    }
    rows = PQntuples(r);
    if (c->admin && strcmp(PQgetvalue(r, 0, HUB_STATS_COL_FOUND), "1") != 0) {
        send_no_tenant(call->req);
        return;
    }
    body = json_object();
    groups = json_array();
    if (body == NULL || groups == NULL) {
        json_decref(body);
        json_decref(groups);
        hub_api_send_oom(call->req);
        return;
    }
    json_object_set_new(body, "tenant", json_string(c->tenant));
    json_object_set_new(body, "since", hour_json(c->since_h));
    json_object_set_new(body, "until", hour_json(c->until_h));
    counters_set(body, r, 0);
    for (int i = 1; i < rows; i++) {
        json_t *g = json_object();
        json_object_set_new(g, "key", json_string(PQgetvalue(r, i, HUB_STATS_COL_KEY)));
        counters_set(g, r, i);
        json_array_append_new(groups, g);
    }
    json_object_set_new(body, "groups", groups);
    hub_api_send_json(call->req, 200, body);
    json_decref(body);
}

/* Reads the query and runs the statement (the call's tenant is set). */
static void stats_start(struct stats_call *c) {
    char since[24], until[24], d0[24], d1[24];
    const char *params[HUB_SQL_STATS_QUERY_NPARAMS] = {c->tenant, since, until, d0, d1, NULL};
    int64_t first_day, end_day;

    if (stats_params(c) != 0) {
        return;
    }
    /* the whole days of the window come from the daily rollups */
    first_day = -div_floor(-c->since_h, 24);
    end_day = div_floor(c->until_h, 24);
    if (first_day >= end_day) {
        first_day = end_day = 0; /* no whole day: every hour from the hourly rollups */
    }
    snprintf(since, sizeof(since), "%lld", (long long)c->since_h);
    snprintf(until, sizeof(until), "%lld", (long long)c->until_h);
    snprintf(d0, sizeof(d0), "%lld", (long long)first_day);
    snprintf(d1, sizeof(d1), "%lld", (long long)end_day);
    params[5] = c->group_by;
    hub_api_call_query(&c->call, stats_done, &hub_sql_stats_query, HUB_SQL_STATS_QUERY_NPARAMS,
                       params);
}

/* --------------------------------------------------------------- routing -- */

/* The tenant route once the key was checked (api_util.h's prologue): a
 * failed key, a path under /v1/stats (404) or another method (405) is
 * answered; else the key's tenant is the one whose figures are read. */
static void stats_authed(struct hub_api_call *call, const char *tenant_id, int status) {
    struct stats_call *c = (struct stats_call *)call;

    if (hub_api_route_answered(call->req, status, c->route_status, "GET, HEAD",
                               "no such resource")) {
        return;
    }
    c->tenant = strdup(tenant_id);
    if (c->tenant == NULL) {
        hub_api_send_oom(call->req);
        return;
    }
    stats_start(c);
}

int hub_api_stats_handle(struct hub *hub, h2o_req_t *req) {
    h2o_iovec_t p = req->path_normalized;
    size_t n = sizeof(STATS_PATH) - 1;
    struct stats_call *c;
    int route_status = 0;

    if (!hub_api_path_under(p, STATS_PATH)) {
        return 0;
    }
    /* the route is decided before authentication, answered after it: a
     * path under /v1/stats is 404 (a trailing "/" is the route itself) */
    if (p.len > n && !(p.len == n + 1 && p.base[n] == '/')) {
        route_status = 404;
    } else if (!hub_api_method_get(req)) {
        route_status = 405;
    }
    if ((c = hub_api_call_new(hub, req, sizeof(*c), stats_call_free)) != NULL) {
        c->route_status = route_status;
        hub_api_auth_tenant(&c->call, stats_authed);
    }
    return 1;
}

void hub_api_stats_admin(struct hub *hub, h2o_req_t *req, h2o_iovec_t tenant) {
    struct stats_call *c;
    int oom = 0;

    if (!hub_api_tenant_id_valid(tenant.base, tenant.len)) {
        send_no_tenant(req);
        return;
    }
    c = hub_api_call_new(hub, req, sizeof(*c), stats_call_free);
    if (c == NULL) {
        return;
    }
    c->admin = 1;
    c->tenant = hub_api_strndup(tenant.base, tenant.len, &oom);
    if (oom) {
        hub_api_send_oom(req);
        return;
    }
    stats_start(c);
}
