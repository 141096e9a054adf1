/*
 * store_workbench — the SQL of the policy workbench's dry-run
 * (POST /admin/policies/dry-run, api_dryrun.c): a subscription's policy,
 * and a tenant's stored events read back to be run through a policy.
 *
 * The event statements run with hub_pg_txn_add_binary(): the payload
 * arrives as the bytes that were ingested.  Every other column is text
 * (their binary form is their text), so nothing here needs decoding.
 */
#ifndef HUB_STORE_WORKBENCH_H
#define HUB_STORE_WORKBENCH_H

#include "pg.h"

/*
 * $1 tenant, $2 subscription id (uuid text).  One row when the tenant has
 * that subscription, else none:
 *   POLICY  text: the policy it names, NULL when none
 */
#define HUB_SQL_DRYRUN_SUB_NPARAMS 2
extern const struct hub_sql hub_sql_dryrun_sub;
enum hub_dryrun_sub_col { HUB_DRYRUN_SUB_COL_POLICY };

/* The columns of both event statements, one row per event. */
enum hub_dryrun_event_col {
    HUB_DRYRUN_EV_COL_SEQ,          /* text: the arrival sequence */
    HUB_DRYRUN_EV_COL_ATTRS,        /* text: the stored attributes, a JSON object */
    HUB_DRYRUN_EV_COL_EVENT_TYPE,   /* text */
    HUB_DRYRUN_EV_COL_CONTENT_TYPE, /* text */
    HUB_DRYRUN_EV_COL_SCHEMA_MAJOR, /* text: an int */
    HUB_DRYRUN_EV_COL_PAYLOAD,      /* bytea: the data as ingested */
    HUB_DRYRUN_EV_COL_SCANNED,      /* text: events picked before the byte cap (same in
                                     * every row); more than the rows: the cap cut the list */
};

/*
 * $1 tenant, $2 subscription id (uuid text) or NULL, $3 limit (int4 text),
 * $4 byte cap (int8 text).  The tenant's newest $3 events, newest first,
 * while their payloads add up to at most $4 (the first one always); with a
 * subscription, only
 * those it would match by type and schema major (SPEC §6: the exact type,
 * "*", or "<resource>.*" against the type's first segment), whatever its
 * enabled and verification state.  Walks event_inbox_tenant_seq backwards.
 */
#define HUB_SQL_DRYRUN_RECENT_NPARAMS 4
extern const struct hub_sql hub_sql_dryrun_recent;

/*
 * $1 tenant, $2 sequence numbers (int8[] text, "{1,2}"), $3 byte cap (int8
 * text).  The tenant's events among them, in sequence order, within the
 * cap as above; another tenant's are never read.
 */
#define HUB_SQL_DRYRUN_SEQS_NPARAMS 3
extern const struct hub_sql hub_sql_dryrun_seqs;

/* ---------------------------------------------- operational events -- */

/*
 * $1 policy name, $2 limit (int4 text).  The enabled subscriptions that
 * name the policy, each with its tenant (opevents.c tells them of a trip):
 */
#define HUB_SQL_OPEVENTS_POLICY_SUBS_NPARAMS 3
extern const struct hub_sql hub_sql_opevents_policy_subs;
enum hub_opev_subs_col { HUB_OPEV_SUBS_COL_ID, HUB_OPEV_SUBS_COL_TENANT };

#endif
