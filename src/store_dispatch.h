/*
 * store_dispatch — the SQL of the delivery engine (SPEC §7): the tenant
 * sample, the claim in its four forms, the load of claimed jobs, the fenced
 * outcome write, 410 and auto-disable, the reclaim of expired leases and
 * the due-jobs gauge.  dispatch_claim.c, dispatch_outcome.c and dispatch.c
 * run them; nothing here runs anything.
 *
 * Every statement is parameterised and casts each parameter (pg.c prepares
 * without parameter types).  Result columns are read through the enum
 * declared beside each statement, never by a number written elsewhere:
 * adding a column means adding it to the statement's SELECT list (in
 * store_dispatch.c) and to its enum, in the same place in both.
 *
 * The claim and the load return binary results: every column but the
 * payload is text (whose binary form is its text) and the payload comes as
 * its bytes.  The other statements return text.
 *
 * The statement objects are static and compared by address by pg.c; their
 * names ("dispatch_claim", ...) show in PostgreSQL's logs and tests look for
 * them there.
 */
#ifndef HUB_STORE_DISPATCH_H
#define HUB_STORE_DISPATCH_H

#include "pg.h"

/*
 * Session settings of the claim, load and outcome pools (hub_pg_new
 * options).  Every statement there reaches its rows by key, and a generic
 * plan is made once, from the statistics of that moment: sequential and
 * bitmap scans are off so that no statistics can pick one (a tenant sample
 * planned while a predicate looked common kept reading whole tables; a day's
 * inbox partition has no statistics until autovacuum analyzes it, and the
 * plan then fetched each event through a one-entry bitmap).  Measurements:
 * docs/performance.md, "Notes moved out of the dispatcher's code".
 */
#define HUB_DISPATCH_PG_OPTIONS                                                                    \
    HUB_PG_GENERIC_PLANS " -c enable_seqscan=off -c enable_bitmapscan=off"

/* -------------------------------------------------------- tenant sample -- */

/*
 * Lanes with due jobs, for the claim's round-robin: each (tenant, origin)
 * lane with a pending unordered job due now, and each tenant with open fifo
 * jobs as a lane without an origin (whether a fifo head is due is the
 * claim's question).  Reads a few index pages per lane, so it runs every so
 * often, not per claim.  $1 most rows (int).  Rows (text), in no particular
 * order: enum hub_due_tenants_col.
 */
extern const struct hub_sql hub_sql_dispatch_due_tenants;
enum hub_due_tenants_col {
    HUB_DUE_TENANTS_ID,     /* tenant id */
    HUB_DUE_TENANTS_ORIGIN, /* origin id (int8 as text), NULL on a fifo row */
    HUB_DUE_TENANTS_FIFO,   /* 't': the tenant has open fifo jobs, only its claims look for
                             * heads; 'f': an unordered lane */
    HUB_DUE_TENANTS_NCOLS,
};

/* ---------------------------------------------------------------- claim -- */

/*
 * The claim: leases up to $3 due jobs of the lanes offered, each lane
 * offering its oldest due jobs up to its limit ($8), in the order offered,
 * and stops as soon as the batch is full.  An unordered lane (a tenant and
 * an origin) offers its unordered jobs to that origin due now from its
 * floor on; a fifo entry (fifo forms only; a tenant, no origin) the head of
 * each of the tenant's fifo subscriptions (SPEC §7.8: the oldest unfinished
 * job, only while none is in flight) but those going to a (tenant, origin)
 * pair listed in $9/$10 (lanes or origins at their cap).  Only jobs of
 * deliverable subscriptions are claimed: enabled AND verification_state
 * 'active' (SPEC §6, the gate).  FOR UPDATE SKIP LOCKED: several
 * dispatchers claim concurrently.  Claimed jobs become 'in_flight' with
 * lease_owner $1 until now() + $2 ms.
 *
 * Four forms (the two without the fifo arm take $1 .. $8 only):
 *   hub_sql_dispatch_claim              unordered jobs only, the job columns
 *   hub_sql_dispatch_claim_lookup       ... plus what the attempts need
 *   hub_sql_dispatch_claim_fifo         unordered jobs and fifo heads
 *   hub_sql_dispatch_claim_fifo_lookup  ... plus what the attempts need
 * A form without the fifo arm is for claims that offer no tenant with open
 * fifo jobs; a form without the lookups leaves them to the load statements
 * on another connection (dispatch_claim.c says when).  Neither form has plan
 * nodes for what it leaves out.
 */
enum hub_claim_param {
    HUB_CLAIM_PARAM_OWNER,    /* $1 lease owner, "<owner>#<claim serial>" (text) */
    HUB_CLAIM_PARAM_LEASE_MS, /* $2 lease in ms (bigint, text) */
    HUB_CLAIM_PARAM_BATCH,    /* $3 most jobs (int, text) */
    HUB_CLAIM_PARAM_TENANTS,  /* $4 the lanes' tenants, in rotation order (binary text[]) */
    HUB_CLAIM_PARAM_ORIGINS,  /* $5 their origins (binary int8[], NULL: a fifo entry) */
    HUB_CLAIM_PARAM_FLOORS,   /* $6 their floors (binary timestamptz[], -infinity: none) */
    HUB_CLAIM_PARAM_FIFO,     /* $7 fifo entries (binary bool[]; only the fifo forms look) */
    HUB_CLAIM_PARAM_LIMITS,   /* $8 most jobs per entry (binary int4[]) */
    /* the fifo forms only (the others take $1 .. $8): */
    HUB_CLAIM_PARAM_CAPPED_TENANTS, /* $9 (tenant, origin) pairs whose fifo heads wait: tenants
                                     * (binary text[]) ... */
    HUB_CLAIM_PARAM_CAPPED_ORIGINS, /* $10 ... and origins (binary int8[]) */
    HUB_CLAIM_NPARAMS,
    HUB_CLAIM_NPARAMS_UNORDERED = HUB_CLAIM_PARAM_CAPPED_TENANTS, /* the others' count */
};
extern const struct hub_sql hub_sql_dispatch_claim;
extern const struct hub_sql hub_sql_dispatch_claim_lookup;
extern const struct hub_sql hub_sql_dispatch_claim_fifo;
extern const struct hub_sql hub_sql_dispatch_claim_fifo_lookup;

/*
 * What an attempt needs of its subscription: the columns of
 * hub_sql_dispatch_load_subscriptions, repeated from HUB_CLAIM_SUB on in the
 * lookup forms of the claim.  Text; NULL where the column is NULL.
 */
enum hub_load_sub_col {
    HUB_LOAD_SUB_ID,                 /* subscription id (uuid text) */
    HUB_LOAD_SUB_URL,                /* destination url */
    HUB_LOAD_SUB_HEADERS_SEALED,     /* sealed destination headers, or NULL */
    HUB_LOAD_SUB_SECRET_SEALED,      /* sealed signing secret */
    HUB_LOAD_SUB_PREV_SECRET_SEALED, /* the previous one while within its grace, else NULL */
    HUB_LOAD_SUB_RETRY_SCHEDULE,     /* retry steps "1000,5000,..." (ms), or NULL */
    HUB_LOAD_SUB_MAX_RATE,           /* deliveries per second, or NULL: unlimited */
    HUB_LOAD_SUB_POLICY,             /* policy name, or NULL */
    HUB_LOAD_SUB_NCOLS,
};

/*
 * What an attempt needs of its stored event: the columns of
 * hub_sql_dispatch_load_events, repeated from HUB_CLAIM_EVENT on in the
 * lookup forms of the claim.  The first column is the row's key: the job's
 * 1-based row in the claim result in the load, the event's seq in the claim
 * (NULL there when the event is gone: its partition was dropped).
 */
enum hub_load_event_col {
    HUB_LOAD_EVENT_KEY,            /* see above */
    HUB_LOAD_EVENT_CONTENT_TYPE,   /* datacontenttype, or NULL */
    HUB_LOAD_EVENT_ATTRS,          /* the CloudEvents attributes (JSON object text) */
    HUB_LOAD_EVENT_PAYLOAD,        /* the payload's bytes (bytea, binary) */
    HUB_LOAD_EVENT_SCHEMA_MAJOR,   /* int as text */
    HUB_LOAD_EVENT_SCHEMA_VERSION, /* the registered version it was checked against, or NULL */
    HUB_LOAD_EVENT_NCOLS,
};

/*
 * The claim's result: one row per claimed job (binary, see above).  Every
 * form returns the job columns; the lookup forms add the subscription's and
 * the event's from HUB_CLAIM_SUB and HUB_CLAIM_EVENT (LEFT JOINs: NULL when
 * the subscription or the event is gone), so column k of the subscription
 * is HUB_CLAIM_SUB + k (k of enum hub_load_sub_col).
 */
enum hub_claim_col {
    HUB_CLAIM_ID,            /* job id (int8 as text) */
    HUB_CLAIM_SUB_ID,        /* subscription id (uuid text) */
    HUB_CLAIM_TENANT,        /* tenant id */
    HUB_CLAIM_EVENT_ID,      /* CloudEvents id */
    HUB_CLAIM_EVENT_TYPE,    /* event type */
    HUB_CLAIM_ATTEMPT_COUNT, /* attempts so far (int as text) */
    HUB_CLAIM_FIFO,          /* 't' for a fifo head */
    HUB_CLAIM_DUE_US,        /* next_attempt_at in Unix µs (int8 as text) */
    HUB_CLAIM_EVENT_SEQ,     /* the stored event's key: seq (int8 as text) ... */
    HUB_CLAIM_EVENT_DAY,     /* ... and day, in days since 2000-01-01 (int as text) */
    HUB_CLAIM_ORIGIN,        /* the job's origin id (int8 as text): its lane's */
    HUB_CLAIM_JOB_NCOLS,     /* the forms without lookups end here */
    HUB_CLAIM_SUB = HUB_CLAIM_JOB_NCOLS,
    HUB_CLAIM_EVENT = HUB_CLAIM_SUB + HUB_LOAD_SUB_NCOLS,
    HUB_CLAIM_LOOKUP_NCOLS = HUB_CLAIM_EVENT + HUB_LOAD_EVENT_NCOLS,
};

/* ----------------------------------------------------------------- load -- */

/*
 * The subscriptions of a claim that did not look them up: $1 their ids
 * (binary text[]).  One row per subscription that still exists and is
 * still deliverable (enabled, verified: see the claim) (binary): enum
 * hub_load_sub_col.
 */
extern const struct hub_sql hub_sql_dispatch_load_subscriptions;

/*
 * The stored events of one day of such a claim: $1 their seqs (binary
 * int8[]), $2 the 1-based rows of their jobs in the claim result (binary
 * int4[]), $3 the day (days since 2000-01-01, int as text: one statement per
 * day, so that the executor prunes the inbox to that partition as it
 * starts).  One row per event that still exists (binary): enum
 * hub_load_event_col, its key being the row given in $2.
 */
#define HUB_LOAD_EVENTS_NPARAMS 3
extern const struct hub_sql hub_sql_dispatch_load_events;

/* ------------------------------------------------------------- outcomes -- */

/*
 * Outcomes of finished jobs, one array element per outcome (attempted,
 * shed, deferred, released or filtered), all arrays in the same order and
 * binary except $14, $16, $17 and $18.  Each job is fenced by the lease of
 * the claim that handed it out: it is updated only while its lease_owner is
 * still "$14#<claim>", so a job reclaimed since keeps its new holder's
 * state.  The fence covers everything an outcome changes: an outcome whose
 * job it does not update (a stale one) records no attempt, moves no streak,
 * disables nothing.  For the fenced ones:
 *   - state 'filtered' deletes the job; any other state is set, with
 *     reason, next_attempt_at = now() + delay, the lease cleared and
 *     attempt_count raised for an attempted outcome; 'pending' becomes
 *     'parked' when the subscription stopped being deliverable meanwhile
 *     (disabled, or not verified: SPEC §6, §7.7);
 *   - an attempted outcome records its attempt, numbered by the job's new
 *     attempt_count, once (only by the transaction that updated the job):
 *     a success on the job's own row (success_*, migrations/0014) when the
 *     job holds none yet, anything else as a row of delivery_attempt_rows;
 *     the delivery_attempts view shows both;
 *   - each subscription's failure streak (SPEC §7.7) follows its newest
 *     attempted outcome in the batch; a success in the batch ends the
 *     streak before it;
 *   - with $16 true (STREAMING_HUB_AUTODISABLE_ENABLED), a 410 disables its
 *     subscription at once (disabled_reason 'gone'), and a subscription
 *     with a failure in the batch whose streak is then at least $17 ms old
 *     and spans at least $18 ms is auto-disabled ('auto_disabled'); both
 *     audited (actor "dispatcher").
 * One row per subscription this statement disabled (text, dead_job NULL),
 * then one per job it set to 'dead' (dead_job its id; the reason the
 * outcome's): enum hub_outcomes_col.  hub_sql_dispatch_outcomes_checked does the same but
 * first probes for an attempt already recorded under its number (a job's
 * attempt_count lowered by hand), at an index descent per attempt: the
 * dispatcher switches to it after a unique violation (23505).
 */
enum hub_outcomes_param {
    HUB_OUTCOMES_PARAM_ID,          /* $1  job id (int8[]) */
    HUB_OUTCOMES_PARAM_STATE,       /* $2  new state (text[]) */
    HUB_OUTCOMES_PARAM_REASON,      /* $3  reason, or NULL (text[]) */
    HUB_OUTCOMES_PARAM_DELAY_MS,    /* $4  next attempt after (int8[]) */
    HUB_OUTCOMES_PARAM_ATTEMPTED,   /* $5  an attempt was made (bool[]) */
    HUB_OUTCOMES_PARAM_DELIVERY_ID, /* $6  the attempt's delivery id (text[]) */
    HUB_OUTCOMES_PARAM_STARTED_AT,  /* $7  when it started (timestamptz[]) */
    HUB_OUTCOMES_PARAM_DURATION_MS, /* $8  how long it took (int4[]) */
    HUB_OUTCOMES_PARAM_STATUS,      /* $9  HTTP status, or NULL (int4[]) */
    HUB_OUTCOMES_PARAM_ERROR,       /* $10 error word, or NULL (text[]) */
    HUB_OUTCOMES_PARAM_EXCERPT,     /* $11 response excerpt, or NULL (text[]) */
    HUB_OUTCOMES_PARAM_SUB_ID,      /* $12 subscription id (text[]) */
    HUB_OUTCOMES_PARAM_SUCCESS,     /* $13 the attempt succeeded (bool[]) */
    HUB_OUTCOMES_PARAM_OWNER,       /* $14 the dispatcher's owner (text, not an array) */
    HUB_OUTCOMES_PARAM_CLAIM,       /* $15 serial of the claim that leased the job (int8[]) */
    HUB_OUTCOMES_PARAM_AUTODISABLE, /* $16 410 and auto-disable allowed ('true'/'false') */
    HUB_OUTCOMES_PARAM_WINDOW_MS,   /* $17 auto-disable: the streak's least age (bigint, text) */
    HUB_OUTCOMES_PARAM_SPREAD_MS,   /* $18 auto-disable: its least span (bigint, text) */
    HUB_OUTCOMES_NPARAMS,
};
enum hub_outcomes_col {
    HUB_OUTCOMES_SUB_ID,     /* subscription id */
    HUB_OUTCOMES_TENANT,     /* its tenant */
    HUB_OUTCOMES_REASON,     /* 'gone' or 'auto_disabled'; a dead job's reason */
    HUB_OUTCOMES_DEAD_JOB,   /* the dead job's id (int8 as text), NULL for a disable */
    HUB_OUTCOMES_EVENT_ID,   /* the dead job's event id, NULL for a disable */
    HUB_OUTCOMES_EVENT_TYPE, /* the dead job's event type, NULL for a disable */
    HUB_OUTCOMES_NOTIFIED,   /* NULL; a disable notifies HUB_SUBS_CHANGED_CHANNEL (store_subs.h) */
    HUB_OUTCOMES_NCOLS,
};
extern const struct hub_sql hub_sql_dispatch_outcomes;
extern const struct hub_sql hub_sql_dispatch_outcomes_checked;

/* --------------------------------------------------------------- upkeep -- */

/*
 * Expired leases (the dispatcher holding them died mid-attempt): up to 1,000
 * jobs back to 'pending', due now, their reclaim count raised; a job
 * reclaimed $1 times (int, text) is 'dead' with reason 'poison'.  One row
 * per job reclaimed (text): enum hub_reclaim_col, with what the
 * hub.delivery.dead event of a poison job tells its tenant.
 */
extern const struct hub_sql hub_sql_dispatch_reclaim;
enum hub_reclaim_col {
    HUB_RECLAIM_JOB_ID,     /* job id */
    HUB_RECLAIM_STATE,      /* 'pending', or 'dead' (poison) */
    HUB_RECLAIM_TENANT,     /* tenant id */
    HUB_RECLAIM_SUB_ID,     /* subscription id */
    HUB_RECLAIM_EVENT_ID,   /* the event's id */
    HUB_RECLAIM_EVENT_TYPE, /* the event's derived type */
    HUB_RECLAIM_NCOLS,
};

/*
 * Parks the pending jobs of subscriptions that stopped being deliverable
 * (disabled, or sent back to verification) in the last ten minutes: jobs an
 * ingest transaction inserted after matching the subscription while it was
 * still deliverable, committed after the change parked the rest
 * (store_dispatch.c).  No parameters.  One row per job parked (text): enum
 * hub_park_stragglers_col.
 */
extern const struct hub_sql hub_sql_dispatch_park_stragglers;
enum hub_park_stragglers_col {
    HUB_PARK_STRAGGLERS_JOB_ID, /* job id */
    HUB_PARK_STRAGGLERS_SUB_ID, /* subscription id */
    HUB_PARK_STRAGGLERS_NCOLS,
};

/*
 * Due jobs for the jobs_due gauge, at most 100,000 of each kind (unordered,
 * fifo).  No parameters.  One row (text): enum hub_due_sample_col.
 */
extern const struct hub_sql hub_sql_dispatch_due_sample;
enum hub_due_sample_col {
    HUB_DUE_SAMPLE_COUNT, /* int8 as text */
    HUB_DUE_SAMPLE_NCOLS,
};

/* Every statement above, NULL-terminated: for tools and tests that run one
 * by name (tests/support/sql_text.c). */
extern const struct hub_sql *const hub_sql_dispatch_all[];

#endif
