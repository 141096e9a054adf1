-- Dedup across a UTC midnight (SPEC §3.3: the dedup key is unique per hub
-- database, for as long as the event is kept).
--
-- The inbox is partitioned by UTC day, and PostgreSQL enforces a unique
-- index only within a partition, so the key is unique per day by the index
-- and across days by the ingest statement, which looks it up in the older
-- days' partitions before inserting.  That lookup cannot see a row another
-- transaction has inserted and not yet committed: two transactions that
-- store the same new key on either side of midnight (one writing day D, the
-- other day D+1) could both store it.
--
-- The ingest statement (src/store_ingest.c) therefore also inserts, when it
-- runs within five minutes of a UTC midnight, the key of every event it is
-- about to store for the first time into inbox_midnight_keys, whose primary
-- key spans the days: the second of two such transactions waits for the
-- first and, once that one has committed, stores nothing (its row for the
-- key comes back as raced, and ingest runs it again: a duplicate).  Outside
-- those ten minutes a day the table is not touched.  It covers any ingest
-- transaction shorter than five minutes.  The hub's hourly maintenance
-- empties it of keys older than an hour.
CREATE TABLE inbox_midnight_keys (
    tenant_id  text NOT NULL,
    source     text NOT NULL,
    event_id   text NOT NULL,
    day        date NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, source, event_id)
);

-- The ingest statement's "now", from which it takes the UTC day an event is
-- stored under.  An inlined SQL function, so the statement's plan is the
-- one it had with now() (partitions are still pruned when the executor
-- starts).  Only tests replace it, to put a transaction on either side of a
-- midnight (tests/integration/test_ingest_answers.sh).
CREATE FUNCTION hub_ingest_clock() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS 'SELECT now()';

-- Whether the ingest statement runs within five minutes of a UTC midnight:
-- the keys it stores for the first time then go to inbox_midnight_keys too.
CREATE FUNCTION hub_ingest_near_midnight() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS
$$SELECT (hub_ingest_clock() AT TIME ZONE 'UTC')::time NOT BETWEEN time '00:05' AND time '23:55'$$;
