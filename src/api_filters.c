/*
 * api_filters — the deliveries lists' query filters (see api_filters.h).
 *
 * Both lists validate the same way so that a console screen can move
 * between the tenant's and the operator's list with the same query, and a
 * bad value is the same 400 whichever list it was given to.
 */
#include "api_filters.h"

#include <stdint.h>
#include <string.h>

#include "api_util.h"
#include "envelope.h"
#include "error.h"
#include "util.h"

/* The job states of SPEC §9, the only values ?state= takes. */
static const char *const job_states[] = {"pending", "in_flight", "succeeded",
                                         "dead",    "parked",    NULL};

/* Reads one RFC 3339 bound into out (normalised to UTC with microseconds,
 * so PostgreSQL's cast cannot disagree with our parse).  Returns 1 when
 * given, 0 when absent, HUB_EINVAL after adding an error. */
static int time_param(h2o_req_t *req, const char *name, char out[40], int64_t *us,
                      json_t **errors) {
    const char *v = NULL;
    int r = hub_api_query_param(req, name, &v);

    out[0] = '\0';
    if (r == 0) {
        return 0;
    }
    if (r < 0 || hub_rfc3339_parse(v, strlen(v), us) != 0) {
        hub_api_errors_add(errors, name, "must be an RFC 3339 timestamp");
        return HUB_EINVAL;
    }
    hub_rfc3339(*us, 6, out, 40);
    return 1;
}

/* Every parameter is read even after one failed, so that one 400 names all
 * the bad ones (api_util.h: the errors array). */
int hub_deliv_filter_parse(h2o_req_t *req, int want_state, struct hub_deliv_filter *f,
                           json_t **errors) {
    json_t *before = *errors;
    size_t n_before = before != NULL ? json_array_size(before) : 0;
    int64_t since_us = 0, until_us = 0;
    int r, rs, ru;

    memset(f, 0, sizeof(*f));
    /* an event id is any CloudEvents id: only its size and encoding are
     * ours to check (what it finds is the statement's answer) */
    r = hub_api_query_param(req, "event_id", &f->event_id);
    if (r < 0 || (r == 1 && (strlen(f->event_id) > HUB_FILTER_EVENT_ID_MAX ||
                             !hub_utf8_valid(f->event_id, strlen(f->event_id))))) {
        hub_api_errors_add(errors, "event_id", "must be a UTF-8 string of at most 1024 bytes");
    }
    if (r != 1) {
        f->event_id = NULL;
    }
    rs = time_param(req, "since", f->since, &since_us, errors);
    ru = time_param(req, "until", f->until, &until_us, errors);
    /* an empty window is a mistake the caller should hear about, as
     * replay's window (api_deliveries.c) says for the same pair */
    if (rs == 1 && ru == 1 && since_us >= until_us) {
        hub_api_errors_add(errors, "until", "must be later than since");
    }
    if (want_state) {
        r = hub_api_query_param(req, "state", &f->state);
        /* an unknown state would only find nothing: say it is unknown */
        if (r == 1) {
            int known = 0;
            for (const char *const *s = job_states; *s != NULL; s++) {
                known |= strcmp(f->state, *s) == 0;
            }
            r = known ? 1 : HUB_EINVAL;
        }
        if (r < 0) {
            hub_api_errors_add(errors, "state",
                               "must be one of pending, in_flight, succeeded, dead, parked");
        }
        if (r != 1) {
            f->state = NULL;
        }
    }
    /* errors may have been NULL before (hub_api_errors_add creates it) */
    return (*errors != NULL && json_array_size(*errors) > n_before) ? HUB_EINVAL : 0;
}

/* The statements take NULL for "no bound" (store_console.h). */
const char *hub_deliv_filter_since(const struct hub_deliv_filter *f) {
    return f->since[0] != '\0' ? f->since : NULL;
}

const char *hub_deliv_filter_until(const struct hub_deliv_filter *f) {
    return f->until[0] != '\0' ? f->until : NULL;
}
