/*
 * api_filters — the query filters that the deliveries lists share (the
 * tenant's GET /v1/subscriptions/{id}/deliveries and the operator's GET
 * /admin/deliveries): ?event_id=, ?since=, ?until= and ?state=.
 */
#ifndef HUB_API_FILTERS_H
#define HUB_API_FILTERS_H

#include <h2o.h>
#include <jansson.h>

/* Longest event id a filter takes: CloudEvents ids are short strings; a
 * longer one cannot be stored (ingest refuses it), so it finds nothing. */
#define HUB_FILTER_EVENT_ID_MAX 1024

/* The parsed filters.  event_id and state borrow the request pool (valid
 * while the request is); since/until are normalised RFC 3339 UTC, "" when
 * not given. */
struct hub_deliv_filter {
    const char *event_id; /* NULL: any */
    const char *state;    /* NULL: any (only when want_state) */
    char since[40];
    char until[40];
};

/*
 * Reads ?event_id=, ?since=, ?until= and, when want_state, ?state= of req
 * into *f.  Each bad value adds an entry naming its parameter to *errors
 * (api_util.h's problem+json "errors"), as does since not before until.
 * Returns 0, or HUB_EINVAL when it added an entry.
 */
int hub_deliv_filter_parse(h2o_req_t *req, int want_state, struct hub_deliv_filter *f,
                           json_t **errors);

/* since / until as a statement parameter: the text, or NULL when not given. */
const char *hub_deliv_filter_since(const struct hub_deliv_filter *f);
const char *hub_deliv_filter_until(const struct hub_deliv_filter *f);

#endif
