/*
 * store — ingest SQL.
 */
#include "store.h"

#include <string.h>

/*
 * Why one statement: the roster gate, the dedup lookups and the insert all
 * happen server-side in one round trip.
 *
 * Dedup has two halves (see migrations/0002_inbox.sql): the per-day unique
 * index arbitrates today's partition through ON CONFLICT, at no extra cost;
 * keys stored on earlier days are looked up by the NOT EXISTS, which only
 * visits partitions older than today (pruned at executor start, `now()` being
 * stable).  Only rows that were not inserted — replays, normally rare — pay
 * for fetching the stored digest that tells a duplicate from a conflict.  A
 * row inserted meanwhile by a concurrent hub is invisible to this
 * statement's snapshot: it comes back with neither seq nor digest, and ingest
 * runs the batch again to classify it.
 *
 * Each stored event gets its delivery jobs in the same statement, so an event
 * and its jobs commit (and the offset moves) together.
 *
 * r checks the grammar of the JSON payloads (envelope.h json_unchecked) with
 * PostgreSQL's JSON parser, every row's, the roster's rejects included: r is
 * read twice, so it is materialized whole.  A bad payload fails the
 * statement, and ingest finds it with hub_sql_ingest_json_errors.
 */
#define INGEST_INSERT_SQL                                                                          \
    "WITH b AS ("                                                                                  \
    "  SELECT * FROM unnest($1::int4[], $2::text[], $3::text[], $4::text[], $5::text[],"           \
    "                       $6::text[], $7::int4[], $8::timestamptz[], $9::text[], $10::jsonb[],"  \
    "                       $11::bytea[], $12::bytea[], $13::text[], $14::int4[], $15::int8[],"    \
    "                       $16::bool[])"                                                          \
    "    AS u(ord, tenant_id, source, event_id, ce_type, event_type, schema_major, event_time,"    \
    "         content_type, headers, payload, digest, topic, kafka_partition, kafka_offset,"       \
    "         json_check)"                                                                         \
    "), r AS ("                                                                                    \
    "  SELECT b.*, t.status FROM b LEFT JOIN tenants t ON t.id = b.tenant_id"                      \
    "   WHERE NOT b.json_check OR convert_from(b.payload, 'UTF8')::json IS NOT NULL"               \
    "), ins AS ("                                                                                  \
    "  INSERT INTO event_inbox (seq, day, tenant_id, source, event_id, ce_type, event_type,"       \
    "                           schema_major, event_time, content_type, headers, payload,"         \
    "                           digest, topic, kafka_partition, kafka_offset)"                     \
    "  SELECT nextval('event_seq'), (now() AT TIME ZONE 'UTC')::date, r.tenant_id, r.source,"      \
    "         r.event_id, r.ce_type, r.event_type, r.schema_major, r.event_time,"                  \
    "         r.content_type, r.headers, r.payload, r.digest, r.topic, r.kafka_partition,"         \
    "         r.kafka_offset"                                                                      \
    "    FROM r"                                                                                   \
    "   WHERE r.status = 'active'"                                                                 \
    "     AND NOT EXISTS (SELECT 1 FROM event_inbox e"                                             \
    "                      WHERE e.tenant_id = r.tenant_id AND e.source = r.source"                \
    "                        AND e.event_id = r.event_id"                                          \
    "                        AND e.day < (now() AT TIME ZONE 'UTC')::date)"                        \
    "   ORDER BY r.ord"                                                                            \
    "  ON CONFLICT (tenant_id, source, event_id, day) DO NOTHING"                                  \
    "  RETURNING seq, day, tenant_id, source, event_id, event_type, schema_major"                  \
    "), jobs AS (" /* matching (SPEC §6): the tenant's routes for this event type, its            \
                    * resource wildcard and '*', of subscriptions enabled AND verified */          \
    "  INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,"     \
    "                             event_type, fifo)"                                               \
    "  SELECT DISTINCT s.id, i.tenant_id, i.seq, i.day, i.event_id, i.event_type,"                 \
    "         s.ordering = 'fifo'"                                                                 \
    "    FROM ins i"                                                                               \
    "    JOIN subscription_routes sr ON sr.tenant_id = i.tenant_id"                                \
    "         AND sr.schema_major = i.schema_major"                                                \
    "         AND sr.pattern IN (i.event_type, split_part(i.event_type, '.', 1) || '.*', '*')"     \
    "    JOIN subscriptions s ON s.id = sr.subscription_id AND s.enabled"                          \
    "         AND s.verification_state = 'active'"                                                 \
    "  ON CONFLICT (subscription_id, event_seq) DO NOTHING"                                        \
    ")"                                                                                            \
    " SELECT r.ord, r.status,"                                                                     \
    "        CASE WHEN ins.seq IS NULL AND r.status = 'active' THEN"                               \
    "          (SELECT e.digest FROM event_inbox e"                                                \
    "            WHERE e.tenant_id = r.tenant_id AND e.source = r.source"                          \
    "              AND e.event_id = r.event_id LIMIT 1)"                                           \
    "        END,"                                                                                 \
    "        ins.seq"                                                                              \
    "   FROM r LEFT JOIN ins ON ins.tenant_id = r.tenant_id AND ins.source = r.source"             \
    "                       AND ins.event_id = r.event_id"                                         \
    "  ORDER BY r.ord"

const struct hub_sql hub_sql_ingest_insert = {
    "ingest_insert", INGEST_INSERT_SQL, 1, /* plan per batch: see struct hub_sql */
};

const struct hub_sql hub_sql_ingest_insert_prepared = {
    "ingest_insert_prepared",
    INGEST_INSERT_SQL,
    0,
};

const struct hub_sql hub_sql_ingest_json_errors = {
    "ingest_json_errors",
    "SELECT ord, e FROM ("
    "  SELECT u.ord, hub_json_error(u.payload) AS e"
    "    FROM unnest($1::int4[], $2::bytea[]) AS u(ord, payload)) x"
    " WHERE e IS NOT NULL",
    0,
};

const struct hub_sql hub_sql_quarantine_insert = {
    "quarantine_insert",
    "INSERT INTO quarantine (reason, field, detail, tenant_id, source, event_id, topic,"
    "                        kafka_partition, kafka_offset, headers, value)"
    " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],"
    "                      $6::text[], $7::text[], $8::int4[], $9::int8[], $10::jsonb[],"
    "                      $11::bytea[])",
    0,
};

const struct hub_sql hub_sql_maintain_partitions = {
    "maintain_partitions",
    "SELECT hub_maintain_partitions($1::interval)",
    0,
};

int hub_sqlstate_json_grammar(const char *sqlstate) {
    /* what json input and convert_from raise (as hub_json_error catches):
     * invalid_text_representation, character_not_in_repertoire,
     * untranslatable_character, statement_too_complex (nesting depth) */
    static const char *const codes[] = {"22P02", "22021", "22P05", "54001"};
    for (size_t i = 0; sqlstate != NULL && i < sizeof(codes) / sizeof(codes[0]); i++) {
        if (strcmp(sqlstate, codes[i]) == 0) {
            return 1;
        }
    }
    return 0;
}
