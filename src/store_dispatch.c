/*
 * store_dispatch — the SQL texts of the delivery engine (see
 * store_dispatch.h for what each statement takes and returns).
 *
 * The comments here say why each statement has the shape it has: most of
 * them are about plans.  The pools that run these statements force generic
 * plans (HUB_DISPATCH_PG_OPTIONS), which are made once from the statistics
 * of that moment, so every statement reaches its rows by key (LATERAL
 * probes with LIMIT 1, lists of keys) whatever the statistics say.  What
 * each choice was measured to cost or save is in docs/performance.md,
 * "Notes moved out of the dispatcher's code (issue 22)".
 */
#include "store_dispatch.h"

#include <stddef.h>

#include "store_subs.h"

/* The SQL below is laid out for reading as SQL; clang-format would reflow the
 * string pieces across macro boundaries. */
// clang-format off

/* -------------------------------------------------------- tenant sample -- */

/*
 * A skip scan of the lanes' due index finds each (tenant, origin) lane with
 * pending unordered jobs in one descent, and a LIMIT 1 probe per lane keeps
 * those with one due now.  A LATERAL with a LIMIT is never turned into a
 * hash join over the whole pending set, and its ORDER BY is the index's, so
 * no plan can read the table in physical order hoping to meet a due job
 * early (behind a history of finished jobs, that cost seconds per sample).
 * Neither probe reads past a lane's first entries, however long its
 * backlog.  Tenants with open fifo jobs come from a skip scan of their own
 * index, as lanes without an origin.
 * Columns: enum hub_due_tenants_col.
 */
const struct hub_sql hub_sql_dispatch_due_tenants = {
    "dispatch_due_tenants",
    "WITH RECURSIVE l(tenant_id, origin_id) AS ("
    "  (SELECT tenant_id, origin_id FROM delivery_jobs WHERE state = 'pending' AND NOT fifo"
    "    ORDER BY tenant_id, origin_id LIMIT 1)"
    "  UNION ALL"
    "  SELECT n.tenant_id, n.origin_id FROM l CROSS JOIN LATERAL ("
    "    SELECT j.tenant_id, j.origin_id FROM delivery_jobs j"
    "     WHERE j.state = 'pending' AND NOT j.fifo"
    "       AND (j.tenant_id, j.origin_id) > (l.tenant_id, l.origin_id)"
    "     ORDER BY j.tenant_id, j.origin_id LIMIT 1) n"
    "), ft(tenant_id) AS ("
    "  (SELECT tenant_id FROM delivery_jobs WHERE fifo AND state IN ('pending', 'in_flight')"
    "    ORDER BY tenant_id LIMIT 1)"
    "  UNION ALL"
    "  SELECT (SELECT j.tenant_id FROM delivery_jobs j"
    "           WHERE j.fifo AND j.state IN ('pending', 'in_flight') AND j.tenant_id > ft.tenant_id"
    "           ORDER BY j.tenant_id LIMIT 1)"
    "    FROM ft WHERE ft.tenant_id IS NOT NULL"
    ")"
    " (SELECT l.tenant_id, l.origin_id::text, 'f' FROM l CROSS JOIN LATERAL ("
    "     SELECT 1 FROM delivery_jobs d"
    "      WHERE d.state = 'pending' AND NOT d.fifo AND d.tenant_id = l.tenant_id"
    "        AND d.origin_id = l.origin_id AND d.next_attempt_at <= now()"
    "      ORDER BY d.next_attempt_at LIMIT 1) due"
    "  UNION ALL"
    "  SELECT ft.tenant_id, NULL, 't' FROM ft WHERE ft.tenant_id IS NOT NULL)"
    " LIMIT $1::int",
    0,
};

/* ---------------------------------------------------------------- claim -- */

/*
 * What an attempt needs of its subscription (s) and of its stored event (e),
 * read by the claim or by the load: enum hub_load_sub_col, and enum
 * hub_load_event_col after the key column each statement puts first.
 */
#define DISPATCH_SUB_COLUMNS                                                                       \
    "s.id::text,"                                      /* HUB_LOAD_SUB_ID */                       \
    " s.url,"                                          /* HUB_LOAD_SUB_URL */                      \
    " s.headers_sealed,"                               /* HUB_LOAD_SUB_HEADERS_SEALED */           \
    " s.secret_sealed,"                                /* HUB_LOAD_SUB_SECRET_SEALED */            \
    " CASE WHEN s.prev_secret_until > now()"                                                       \
    " THEN s.prev_secret_sealed END,"                  /* HUB_LOAD_SUB_PREV_SECRET_SEALED */       \
    " array_to_string(s.retry_schedule, ','),"         /* HUB_LOAD_SUB_RETRY_SCHEDULE */           \
    " s.max_rate::text,"                               /* HUB_LOAD_SUB_MAX_RATE */                 \
    " s.policy"                                        /* HUB_LOAD_SUB_POLICY */
#define DISPATCH_EVENT_COLUMNS                                                                     \
    "e.content_type,"                                  /* HUB_LOAD_EVENT_CONTENT_TYPE */           \
    " e.headers::text,"                                /* HUB_LOAD_EVENT_ATTRS */                  \
    " e.payload,"                                      /* HUB_LOAD_EVENT_PAYLOAD */                \
    " e.schema_major::text,"                           /* HUB_LOAD_EVENT_SCHEMA_MAJOR */           \
    " e.schema_version"                                /* HUB_LOAD_EVENT_SCHEMA_VERSION */

/*
 * The claim offers lanes of the last sample in rotation order: a
 * (tenant, origin) lane its oldest due jobs up to the lane's limit, which
 * the dispatcher sets from the tenant's share and the room left under the
 * lane's and the origin's caps (dispatch_caps.h).  A lane at its cap is not
 * offered, so its backlog is not read: each lane is a range of its own in
 * delivery_jobs_due_origin.  The nested loop stops as soon as the batch is
 * full, so a claim reads about as many rows as it takes however many lanes
 * have a backlog, and the next claim goes on from where this one stopped.
 * Every join is a LATERAL on a key, so no plan ever scans the pending set
 * whatever the statistics say (planning this statement costs more than
 * running it: the claim connection forces generic plans).
 *
 * A fifo head is the first entry of its subscription in the fifo index
 * (by arrival sequence, SPEC 3.3: a replay's new jobs have higher ids than
 * the older ones it re-arms),
 * found by a skip scan over the tenant's subscriptions with open fifo jobs:
 * the backlog behind a head is never read, and a head whose lane or origin
 * is at its cap is passed over (one row per fifo subscription, not a
 * backlog).  Fifo heads come with the tenant's entry that has no origin.
 * A lane's unordered jobs are read from its floor on (struct due_lane,
 * dispatch_claim.c): the due index keeps the entries of claimed jobs until
 * a vacuum, and every claim would otherwise step over all of them.
 */
#define CLAIM_SQL_HEAD                                                                             \
    "WITH cand AS ("                                                                               \
    "  SELECT c.id FROM unnest($4::text[], $5::int8[], $6::timestamptz[], $7::bool[],"             \
    "                          $8::int4[]) t(tenant_id, origin_id, floor, fifo, lim)"              \
    "  CROSS JOIN LATERAL ("                                                                       \
    "   SELECT u.id FROM ("                                                                        \
    "    (SELECT j.id, j.next_attempt_at"                                                          \
    "       FROM delivery_jobs j JOIN subscriptions s ON s.id = j.subscription_id"                 \
    "      WHERE j.state = 'pending' AND NOT j.fifo AND j.tenant_id = t.tenant_id"                 \
    "        AND j.origin_id = t.origin_id AND s.enabled AND s.verification_state = 'active'"      \
    "        AND j.next_attempt_at >= t.floor AND j.next_attempt_at <= now()"                      \
    "      ORDER BY j.next_attempt_at, j.id LIMIT t.lim)"

/* the fifo heads of the tenants flagged in $7, but those whose (tenant,
 * origin) lane or origin is at its cap ($9, $10) */
#define CLAIM_SQL_FIFO                                                                             \
    "    UNION ALL"                                                                                \
    "    (WITH RECURSIVE f(sub) AS ("                                                              \
    "       (SELECT o.subscription_id FROM delivery_jobs o"                                        \
    "         WHERE o.fifo AND o.state IN ('pending', 'in_flight') AND o.tenant_id = t.tenant_id"  \
    "         ORDER BY o.subscription_id LIMIT 1)"                                                 \
    "       UNION ALL"                                                                             \
    "       SELECT (SELECT o.subscription_id FROM delivery_jobs o"                                 \
    "                WHERE o.fifo AND o.state IN ('pending', 'in_flight')"                         \
    "                  AND o.tenant_id = t.tenant_id AND o.subscription_id > f.sub"                \
    "                ORDER BY o.subscription_id LIMIT 1)"                                          \
    "         FROM f WHERE f.sub IS NOT NULL"                                                      \
    "     )"                                                                                       \
    "     SELECT h.id, h.next_attempt_at FROM f CROSS JOIN LATERAL ("                              \
    "        SELECT o.id, o.state, o.next_attempt_at, o.origin_id FROM delivery_jobs o"            \
    "         WHERE o.fifo AND o.state IN ('pending', 'in_flight') AND o.tenant_id = t.tenant_id"  \
    "           AND o.subscription_id = f.sub ORDER BY o.event_seq LIMIT 1) h"                            \
    "      CROSS JOIN LATERAL (SELECT 1 FROM subscriptions s WHERE s.id = f.sub"                   \
    "                           AND s.enabled AND s.verification_state = 'active' LIMIT 1) s"      \
    "      WHERE t.fifo AND h.state = 'pending' AND h.next_attempt_at <= now()"                    \
    "        AND NOT EXISTS (SELECT 1 FROM unnest($9::text[], $10::int8[]) x(tenant_id, origin_id)"\
    "                         WHERE x.tenant_id = t.tenant_id AND x.origin_id = h.origin_id)"      \
    "      LIMIT t.lim)"

/*
 * The rest of the claim.  Candidates are locked by primary key, one row at a
 * time: a semi-join against the pending set would read all of it whenever
 * the statistics lag behind a fast-growing backlog.  The update takes a list
 * of keys, not a join: a generic plan had merge-joined the locked rows
 * against the whole primary key from its first job.
 */
#define CLAIM_SQL_CORE                                                                             \
    "   ) u ORDER BY u.next_attempt_at, u.id LIMIT t.lim) c"                                       \
    "  LIMIT $3::int"                                                                              \
    "), locked AS ("                                                                               \
    "  SELECT l.id FROM cand CROSS JOIN LATERAL ("                                                 \
    "     SELECT j.id FROM delivery_jobs j WHERE j.id = cand.id AND j.state = 'pending'"           \
    "        FOR UPDATE SKIP LOCKED) l"                                                            \
    "), claimed AS ("                                                                              \
    "  UPDATE delivery_jobs j SET state = 'in_flight', lease_owner = $1::text,"                    \
    "         lease_until = now() + $2::bigint * interval '1 millisecond', updated_at = now()"     \
    "   WHERE j.id = ANY (ARRAY(SELECT id FROM locked))"                                           \
    "  RETURNING j.id, j.subscription_id, j.tenant_id, j.event_seq, j.event_day, j.event_id,"      \
    "            j.event_type, j.attempt_count, j.fifo, j.next_attempt_at, j.origin_id"            \
    ")"

/* The claimed jobs: enum hub_claim_col up to HUB_CLAIM_JOB_NCOLS. */
#define CLAIM_SQL_JOBS                                                                             \
    " SELECT c.id::text,"                              /* HUB_CLAIM_ID */                          \
    " c.subscription_id::text,"                        /* HUB_CLAIM_SUB_ID */                      \
    " c.tenant_id,"                                    /* HUB_CLAIM_TENANT */                      \
    " c.event_id,"                                     /* HUB_CLAIM_EVENT_ID */                    \
    " c.event_type,"                                   /* HUB_CLAIM_EVENT_TYPE */                  \
    " c.attempt_count::text,"                          /* HUB_CLAIM_ATTEMPT_COUNT */               \
    " c.fifo::text,"                                   /* HUB_CLAIM_FIFO */                        \
    " ((extract(epoch FROM c.next_attempt_at)"                                                     \
    " * 1000000)::int8)::text,"                        /* HUB_CLAIM_DUE_US */                      \
    " c.event_seq::text,"                              /* HUB_CLAIM_EVENT_SEQ */                   \
    " (c.event_day - date '2000-01-01')::text,"        /* HUB_CLAIM_EVENT_DAY */                   \
    " c.origin_id::text"                               /* HUB_CLAIM_ORIGIN */

/*
 * The lookups: the subscription's columns from HUB_CLAIM_SUB and the
 * event's from HUB_CLAIM_EVENT (its seq first, NULL when it is gone).  LIMIT
 * 1 keeps each lookup a probe by key (flattened, the subscriptions join
 * became a hash join over the whole table).
 */
#define CLAIM_SQL_JOINS                                                                            \
    "   FROM claimed c"                                                                            \
    "   LEFT JOIN LATERAL (SELECT * FROM subscriptions s"                                          \
    "                       WHERE s.id = c.subscription_id LIMIT 1) s ON true"                     \
    "   LEFT JOIN LATERAL (SELECT * FROM event_inbox e"                                            \
    "                       WHERE e.seq = c.event_seq AND e.day = c.event_day LIMIT 1) e ON true"
#define CLAIM_SQL_LOOKUP                                                                           \
    CLAIM_SQL_JOBS                                                                                 \
    ", " DISPATCH_SUB_COLUMNS                          /* from HUB_CLAIM_SUB */                    \
    ", e.seq::text, " DISPATCH_EVENT_COLUMNS           /* from HUB_CLAIM_EVENT */                  \
    CLAIM_SQL_JOINS

/*
 * The four forms.  The fifo arm is left out when no tenant offered has open
 * fifo jobs: it yields rows only for those, but the executor still sets it
 * up for every tenant.  A form without the lookups has no plan nodes for
 * them to set up, which a parameter skipping them would still have.
 */
#define CLAIM_SQL(fifo_arm, result) CLAIM_SQL_HEAD fifo_arm CLAIM_SQL_CORE result

const struct hub_sql hub_sql_dispatch_claim = {
    "dispatch_claim", CLAIM_SQL("", CLAIM_SQL_JOBS " FROM claimed c"), 0,
};
const struct hub_sql hub_sql_dispatch_claim_lookup = {
    "dispatch_claim_lookup", CLAIM_SQL("", CLAIM_SQL_LOOKUP), 0,
};
const struct hub_sql hub_sql_dispatch_claim_fifo = {
    "dispatch_claim_fifo", CLAIM_SQL(CLAIM_SQL_FIFO, CLAIM_SQL_JOBS " FROM claimed c"), 0,
};
const struct hub_sql hub_sql_dispatch_claim_fifo_lookup = {
    "dispatch_claim_fifo_lookup", CLAIM_SQL(CLAIM_SQL_FIFO, CLAIM_SQL_LOOKUP), 0,
};

/* ----------------------------------------------------------------- load -- */

/*
 * The load runs in one round trip on its own connection: the subscriptions
 * once each, then one events statement per day of the batch (usually one).
 * It reads the subscriptions in a later snapshot than the claim's, so it
 * checks the gate again: a url changed since the claim (verification back to
 * 'pending') must not be attempted with the jobs leased before the change.
 * Those jobs find no subscription row and are not attempted; the change
 * parked them, lease and all (migrations/0011).
 * The day is a parameter so that the executor prunes the inbox to that
 * day's partition as it starts; a day per row was pruned only row by row,
 * after every partition's scan had been set up, and partitions grow with the
 * retention.  Each lookup is by key, one row at a time (LIMIT 1 keeps it a
 * nested index probe).
 */
const struct hub_sql hub_sql_dispatch_load_subscriptions = {
    "dispatch_load_subscriptions",
    "SELECT " DISPATCH_SUB_COLUMNS "  FROM unnest($1::text[]) u(id)"
    "  CROSS JOIN LATERAL (SELECT * FROM subscriptions s WHERE s.id = u.id::uuid"
    "                       AND s.enabled AND s.verification_state = 'active' LIMIT 1) s",
    0,
};

const struct hub_sql hub_sql_dispatch_load_events = {
    "dispatch_load_events",
    "SELECT u.ord::text, " /* HUB_LOAD_EVENT_KEY */ DISPATCH_EVENT_COLUMNS
    "  FROM unnest($1::int8[], $2::int4[]) u(seq, ord)"
    "  CROSS JOIN LATERAL (SELECT * FROM event_inbox e"
    "                       WHERE e.seq = u.seq AND e.day = date '2000-01-01' + $3::int4"
    "                       LIMIT 1) e",
    0,
};

/* ------------------------------------------------------------- outcomes -- */

/*
 * The fence ("<owner>#<claim serial>", set by the claim) holds even when the
 * new holder of a reclaimed job is this same dispatcher: an outcome delayed
 * past its lease by a database outage must not settle the job's next
 * attempt.  It holds for everything an outcome moves, not only the job:
 * streaks, 410 disables and the auto-disable gates read the outcomes whose
 * job this statement settled (j), never the batch as sent (o).  A stale
 * outcome (its lease expired, the job reclaimed and perhaps delivered by
 * another process since) changes nothing at all.
 *
 * j: a job whose subscription stopped being deliverable while it was in
 * flight (disabled, or sent back to verification: SPEC §6, §7.7) is parked
 * rather than retried: the transaction that changed the subscription parked
 * it (d.state is the row as committed, re-read when that transaction wrote
 * it first), or it committed before this snapshot.  A job given back
 * without an attempt follows d.state alone: the subscription's row read
 * here is this snapshot's, and a verification that committed after it,
 * whose trigger unparked the job (the row re-read), would have the give-
 * back park it again for good; a give-back of a job the change did not
 * park (an ingest that committed after it) is left to the stragglers'
 * sweep.  The lease owner is set
 * only while a job is in flight, so it is the whole fence; a "state =
 * 'in_flight'" there would let the planner walk the partial lease index
 * (all jobs in flight) instead of the primary key whenever its statistics
 * think few are in flight, slower as the backlog of outcomes grows.
 * j also records a success on the job itself (success_*, migrations/0014)
 * when the job holds none yet: the common delivery, a first attempt that
 * succeeds, then writes no attempt row and no index entry for one, only
 * the job's version it writes anyway.  A job that already holds a success
 * (replayed or redelivered since) gets a row for the new one, so no
 * attempt is ever overwritten.  j returns the success it holds, which tells
 * a which attempts are on their job: the number and the delivery id (new
 * per attempt) both match.
 * f: a policy's match turned the job down: as if it had never matched.
 * a: the other attempted outcomes become rows of delivery_attempt_rows (the
 * table behind the delivery_attempts view).  An attempt is numbered by the
 * job's attempt count after j.  Only the
 * transaction that updated the job (our lease, its row lock held) records
 * it, and the count only grows, so a number is recorded once: a batch
 * retried after a lost commit finds its leases cleared and records nothing,
 * and a key twice in one batch is written once (DISTINCT ON).  The hub
 * itself never writes a duplicate key.  A count lowered by hand (an
 * operator's SQL) could, and the batch would fail on the primary key and be
 * retried whole, holding every outcome back: after such a failure the
 * dispatcher switches to hub_sql_dispatch_outcomes_checked, which probes for
 * the key first.  The probe is not in the usual statement because it costs
 * an index descent per attempt, and ON CONFLICT's speculative insertion
 * costs more (one more WAL record a row).
 * b, last: failure streaks take the newest fenced outcome per subscription
 * in the batch; a success anywhere in the batch ends the streak before it,
 * so failures after it start a new one.  last also says whether the batch
 * holds a fenced failure (the auto-disable gates are checked at every
 * recorded failure, SPEC §7.7) and a fenced 410.
 * chg: only subscriptions that change; a success on a subscription without
 * a streak writes nothing (no row version, no lock).
 * pre: the subscriptions whose streak this statement may write (a failure
 * in the batch, or a streak open) are locked before any job, in one order:
 * a transaction that changes a subscription (PATCH enabled:false) locks it
 * first and then parks its jobs (the trigger, migrations/0011), and taking
 * the job rows first here deadlocked against it, which the API answered
 * with a 500.  j reads pre's count (a one-time filter, run before its scan)
 * only to be run after it.  A success on a subscription without a streak
 * still locks nothing.
 * lk: two outcome batches may touch the same subscriptions: they lock them
 * in one order, so that concurrent batches queue instead of deadlocking.
 * It also keeps `enabled` as it was before u, to tell which subscriptions
 * this statement disabled.
 * u: the streak, and with $16 (the auto-disable kill switch) a 410's
 * disable and the auto-disable gates on the streak as it now is, all in one
 * update of each row (a second update of a row in one statement would be
 * ignored).  The parking trigger (migrations/0011) runs only when enabled
 * really changes.
 * au: the audit entries of the disables, which are also the result rows.
 * The jobs j set to 'dead' follow them (dead_job not NULL): only an outcome
 * that passed the fence and committed may tell the tenant its delivery is
 * dead, so the dispatcher publishes hub.delivery.dead from these rows.
 */
#define OUT_NEW_FIRST                                                                              \
    "(CASE WHEN last.success THEN NULL WHEN last.ok_at IS NOT NULL THEN last.first_fail"           \
    "      ELSE coalesce(s.failure_first_at, last.first_fail) END)"
#define OUT_NEW_LAST "(CASE WHEN last.success THEN NULL ELSE last.started_at END)"
#define OUT_GONE "($16::boolean AND s.enabled AND last.gone)"
#define OUT_AUTO                                                                                   \
    "($16::boolean AND s.enabled AND last.failed AND " OUT_NEW_FIRST " IS NOT NULL"                \
    " AND now() - " OUT_NEW_FIRST " >= $17::bigint * interval '1 millisecond'"                     \
    " AND " OUT_NEW_LAST " - " OUT_NEW_FIRST " >= $18::bigint * interval '1 millisecond')"
/* Column `col` of the job after the outcome: `value` when the outcome is a
 * success recorded on the job (the job holds none yet), else as it was. */
#define OUT_ON_JOB(value, col)                                                                     \
    "CASE WHEN o.attempted AND o.success AND d.success_delivery_id IS NULL THEN " value           \
    " ELSE d." col " END"
#define OUTCOMES_SQL(attempt_probe)                                                                \
    "WITH o AS ("                                                                                  \
    "  SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::int8[], $5::bool[],"           \
    "                       $6::text[], $7::timestamptz[], $8::int4[], $9::int4[], $10::text[],"   \
    "                       $11::text[], $12::text[], $13::bool[], $15::int8[])"                   \
    "    AS o(id, state, reason, delay_ms, attempted, delivery_id, started_at, duration_ms,"       \
    "         status, error, excerpt, subscription_id, success, claim)"                            \
    "), pre AS ("                                                                                  \
    "  SELECT s.id FROM subscriptions s"                                                           \
    "   WHERE s.id IN (SELECT o.subscription_id::uuid FROM o WHERE o.attempted)"                   \
    "     AND (s.failure_first_at IS NOT NULL OR s.id IN ("                                        \
    "          SELECT o.subscription_id::uuid FROM o WHERE o.attempted AND NOT o.success))"        \
    "   ORDER BY s.id FOR UPDATE"                                                                  \
    "), j AS ("                                                                                    \
    "  UPDATE delivery_jobs d SET state = CASE WHEN o.state = 'pending' AND ("                     \
    "             d.state = 'parked' OR o.attempted AND NOT EXISTS ("                              \
    "             SELECT 1 FROM subscriptions s WHERE s.id = d.subscription_id AND s.enabled"      \
    "                AND s.verification_state = 'active'))"                                        \
    "             THEN 'parked' ELSE o.state END, reason = o.reason,"                              \
    "         attempt_count = d.attempt_count + CASE WHEN o.attempted THEN 1 ELSE 0 END,"          \
    "         next_attempt_at = now() + o.delay_ms * interval '1 millisecond',"                    \
    "         lease_owner = NULL, lease_until = NULL, updated_at = now(),"                         \
    "         success_delivery_id = " OUT_ON_JOB("o.delivery_id::uuid", "success_delivery_id") ","  \
    "         success_number = " OUT_ON_JOB("d.attempt_count + 1", "success_number") ","            \
    "         success_started_at = " OUT_ON_JOB("o.started_at", "success_started_at") ","           \
    "         success_duration_ms = " OUT_ON_JOB("o.duration_ms", "success_duration_ms") ","        \
    "         success_status = " OUT_ON_JOB("o.status", "success_status") ","                       \
    "         success_excerpt = " OUT_ON_JOB("o.excerpt", "success_excerpt")                        \
    "    FROM o WHERE d.id = o.id AND d.lease_owner = $14::text || '#' || o.claim"                 \
    "     AND o.state <> 'filtered' AND (SELECT count(*) FROM pre) >= 0"                           \
    "  RETURNING d.id, d.attempt_count, d.success_number, d.success_delivery_id,"                 \
    "            d.state AS new_state, d.reason AS new_reason, d.tenant_id AS job_tenant,"         \
    "            d.subscription_id AS job_sub, d.event_id AS job_event_id,"                        \
    "            d.event_type AS job_event_type"                                                   \
    "), f AS ("                                                                                    \
    "  DELETE FROM delivery_jobs d USING o"                                                        \
    "   WHERE d.id = o.id AND o.state = 'filtered'"                                                \
    "     AND d.lease_owner = $14::text || '#' || o.claim"                                         \
    "), a AS ("                                                                                    \
    "  INSERT INTO delivery_attempt_rows (day, delivery_id, job_id, number, started_at,"          \
    "                                     duration_ms, status, error, response_excerpt)"           \
    "  SELECT DISTINCT ON (o.id) (o.started_at AT TIME ZONE 'UTC')::date, o.delivery_id::uuid,"    \
    "         o.id, j.attempt_count, o.started_at, o.duration_ms, o.status, o.error, o.excerpt"    \
    "    FROM o JOIN j ON j.id = o.id WHERE o.attempted"                                           \
    "     AND NOT (j.success_number IS NOT DISTINCT FROM j.attempt_count"                          \
    "              AND j.success_delivery_id IS NOT DISTINCT FROM o.delivery_id::uuid)"            \
    attempt_probe                                                                                  \
    "), b AS ("                                                                                    \
    "  SELECT o.subscription_id, o.success, o.started_at, o.status,"                               \
    "         max(o.started_at) FILTER (WHERE o.success)"                                          \
    "             OVER (PARTITION BY o.subscription_id) AS ok_at"                                  \
    "    FROM o JOIN j ON j.id = o.id WHERE o.attempted"                                           \
    "), last AS ("                                                                                 \
    "  SELECT DISTINCT ON (subscription_id) subscription_id::uuid AS id, success, started_at,"     \
    "         ok_at, min(started_at) FILTER (WHERE NOT success"                                    \
    "                                          AND started_at > coalesce(ok_at, '-infinity'))"     \
    "             OVER w AS first_fail,"                                                           \
    "         bool_or(NOT success) OVER w AS failed,"                                              \
    "         bool_or(status IS NOT DISTINCT FROM 410) OVER w AS gone"                             \
    "    FROM b WINDOW w AS (PARTITION BY subscription_id)"                                        \
    "   ORDER BY subscription_id, started_at DESC"                                                 \
    "), chg AS ("                                                                                  \
    "  SELECT last.* FROM last JOIN subscriptions s ON s.id = last.id"                             \
    "   WHERE NOT (last.success AND s.failure_first_at IS NULL AND s.failure_last_at IS NULL)"     \
    "      OR ($16::boolean AND last.gone)"                                                        \
    "), lk AS ("                                                                                   \
    "  SELECT s.id, s.enabled FROM subscriptions s WHERE s.id IN (SELECT id FROM chg)"             \
    "   ORDER BY s.id FOR UPDATE"                                                                  \
    "), u AS ("                                                                                    \
    "  UPDATE subscriptions s SET"                                                                 \
    "         failure_first_at = " OUT_NEW_FIRST ", failure_last_at = " OUT_NEW_LAST ","           \
    "         enabled = s.enabled AND NOT (" OUT_GONE " OR " OUT_AUTO "),"                         \
    "         disabled_reason = CASE WHEN " OUT_GONE " THEN 'gone'"                                \
    "                                WHEN " OUT_AUTO " THEN 'auto_disabled'"                       \
    "                                ELSE s.disabled_reason END,"                                  \
    "         updated_at = CASE WHEN " OUT_GONE " OR " OUT_AUTO " THEN now()"                      \
    "                           ELSE s.updated_at END"                                             \
    "    FROM chg last JOIN lk ON lk.id = last.id WHERE s.id = last.id"                            \
    "  RETURNING s.id, s.tenant_id, s.disabled_reason, s.failure_first_at, s.failure_last_at,"     \
    "            lk.enabled AND NOT s.enabled AS disabled"                                         \
    "), au AS ("                                                                                   \
    "  INSERT INTO audit_log (tenant_id, actor, action, object_id, detail)"                        \
    "  SELECT tenant_id, 'dispatcher',"                                                            \
    "         CASE WHEN disabled_reason = 'gone' THEN 'subscription.disable'"                      \
    "              ELSE 'subscription.auto_disable' END, id::text,"                                \
    "         CASE WHEN disabled_reason = 'gone' THEN '{\"reason\":\"gone\"}'::jsonb"              \
    "              ELSE jsonb_build_object('failure_first_at', failure_first_at,"                  \
    "                                      'failure_last_at', failure_last_at) END"                \
    "    FROM u WHERE disabled"                                                                    \
    ")"                                                                                            \
    " SELECT id::text, tenant_id, disabled_reason, NULL::text AS dead_job, NULL::text AS event_id,"  \
    "        NULL::text AS event_type,"                                                            \
    "        (SELECT NULL::text FROM pg_notify('" HUB_SUBS_CHANGED_CHANNEL "', u.id::text))"         \
    "   FROM u WHERE disabled"                                                                     \
    " UNION ALL"                                                                                   \
    " SELECT job_sub::text, job_tenant, new_reason, id::text, job_event_id, job_event_type,"       \
    "        NULL::text"                                                                           \
    "   FROM j WHERE new_state = 'dead'"

const struct hub_sql hub_sql_dispatch_outcomes = {"dispatch_outcomes", OUTCOMES_SQL(""), 0};
const struct hub_sql hub_sql_dispatch_outcomes_checked = {
    "dispatch_outcomes_checked",
    OUTCOMES_SQL("     AND NOT EXISTS (SELECT 1 FROM delivery_attempt_rows x"
                 "                      WHERE x.job_id = o.id AND x.number = j.attempt_count"
                 "                        AND x.day = (o.started_at AT TIME ZONE 'UTC')::date)"),
    0,
};

/* --------------------------------------------------------------- upkeep -- */

const struct hub_sql hub_sql_dispatch_reclaim = {
    "dispatch_reclaim",
    "UPDATE delivery_jobs d"
    "   SET state = CASE WHEN d.reclaims + 1 >= $1::int THEN 'dead' ELSE 'pending' END,"
    "       reason = CASE WHEN d.reclaims + 1 >= $1::int THEN 'poison' ELSE d.reason END,"
    "       reclaims = d.reclaims + 1, lease_owner = NULL, lease_until = NULL,"
    "       next_attempt_at = now(), updated_at = now()"
    "  FROM (SELECT id FROM delivery_jobs WHERE state = 'in_flight' AND lease_until < now()"
    "         ORDER BY lease_until LIMIT 1000 FOR UPDATE SKIP LOCKED) x"
    " WHERE d.id = x.id"
    " RETURNING d.id, d.state, d.tenant_id, d.subscription_id, d.event_id, d.event_type",
    0,
};

/*
 * The trigger that parks a subscription's jobs when it stops being
 * deliverable (migrations/0011) runs in the transaction that changes it, and
 * cannot see the jobs of an ingest transaction that matched the
 * subscription while it was still deliverable and committed after the
 * change: those stayed pending for good.  They were never attempted (the
 * claim checks the gate), but they counted as due, every claim of their
 * lane stepped over them, and a later re-enable found nothing parked to give
 * back (it delivered them anyway: they were pending).
 *
 * Ten minutes covers any ingest transaction (a batch that takes longer has
 * failed long before).  The subscription is locked as a change locks it:
 * a change back to deliverable (which unparks its jobs) either committed
 * first, and the row no longer qualifies when it is locked, or waits for
 * this statement and then unparks these too.  A subscription being changed
 * is skipped until the next round.  Its own transaction: it takes no job
 * lock before the subscription's, in the order the outcome statement and
 * a change use.  migrations/0020 indexes the subscriptions it reads.
 */
const struct hub_sql hub_sql_dispatch_park_stragglers = {
    "dispatch_park_stragglers",
    "WITH s AS (SELECT id FROM subscriptions"
    "            WHERE NOT (enabled AND verification_state = 'active')"
    "              AND updated_at > now() - interval '10 minutes'"
    "            FOR NO KEY UPDATE SKIP LOCKED)"
    " UPDATE delivery_jobs j SET state = 'parked', updated_at = now()"
    "   FROM s WHERE j.subscription_id = s.id AND j.state = 'pending'"
    " RETURNING j.id::text, j.subscription_id::text",
    0,
};

/* One count per partial index, as no index holds both unordered and fifo
 * jobs. */
const struct hub_sql hub_sql_dispatch_due_sample = {
    "dispatch_due_sample",
    "SELECT (SELECT count(*) FROM (SELECT 1 FROM delivery_jobs"
    "         WHERE state = 'pending' AND NOT fifo AND next_attempt_at <= now()"
    "         LIMIT 100000) x)"
    "     + (SELECT count(*) FROM (SELECT 1 FROM delivery_jobs"
    "         WHERE fifo AND state = 'pending' AND next_attempt_at <= now()"
    "         LIMIT 100000) y)",
    0,
};

/* For tools that print a statement by name (store_dispatch.h). */
const struct hub_sql *const hub_sql_dispatch_all[] = {
    &hub_sql_dispatch_due_tenants,
    &hub_sql_dispatch_claim,
    &hub_sql_dispatch_claim_lookup,
    &hub_sql_dispatch_claim_fifo,
    &hub_sql_dispatch_claim_fifo_lookup,
    &hub_sql_dispatch_load_subscriptions,
    &hub_sql_dispatch_load_events,
    &hub_sql_dispatch_outcomes,
    &hub_sql_dispatch_outcomes_checked,
    &hub_sql_dispatch_reclaim,
    &hub_sql_dispatch_park_stragglers,
    &hub_sql_dispatch_due_sample,
    NULL,
};

// clang-format on
