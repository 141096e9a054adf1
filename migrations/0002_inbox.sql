-- Arrival sequence: monotonically increasing per hub database (SPEC §3.3).
CREATE SEQUENCE event_seq AS bigint;

-- The event inbox: the exact payload bytes of every accepted event.
--
-- Partitioned by UTC arrival day so that retention drops whole partitions
-- (SPEC §12).  PostgreSQL requires the partition key in every unique index, so
-- the dedup key (tenant_id, source, event_id) is enforced per day by the
-- unique index below and across days by the ingest statement, which looks the
-- key up in every partition before inserting (see src/store.c).
CREATE TABLE event_inbox (
    seq             bigint NOT NULL,
    day             date NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    tenant_id       text NOT NULL,
    source          text NOT NULL,
    event_id        text NOT NULL,
    ce_type         text NOT NULL,
    event_type      text NOT NULL,
    schema_major    int NOT NULL,
    event_time      timestamptz NOT NULL,
    content_type    text NOT NULL,
    headers         jsonb NOT NULL,
    payload         bytea NOT NULL,
    digest          bytea NOT NULL,
    topic           text,
    kafka_partition int,
    kafka_offset    bigint,
    PRIMARY KEY (seq, day),
    UNIQUE (tenant_id, source, event_id, day)
) PARTITION BY RANGE (day);

-- Keeps daily partitions from `back` days ago to `ahead` days ahead, and drops
-- the ones wholly older than the retention.  Called by the hub at start and
-- every hour; safe to run concurrently from several hubs.
CREATE FUNCTION hub_maintain_partitions(retention interval, ahead int DEFAULT 3)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date;
    part record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('streaming_hub_partitions'));
    FOR i IN -1 .. ahead LOOP
        d := today + i;
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF event_inbox '
                       'FOR VALUES FROM (%L) TO (%L)',
                       'event_inbox_' || to_char(d, 'YYYYMMDD'), d, d + 1);
    END LOOP;
    FOR part IN
        SELECT c.relname FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
          JOIN pg_class p ON p.oid = i.inhparent
         WHERE p.relname = 'event_inbox'
           AND c.relname ~ '^event_inbox_[0-9]{8}$'
           AND to_date(substr(c.relname, 13), 'YYYYMMDD') + 1
               < ((now() - retention) AT TIME ZONE 'UTC')::date
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I', part.relname);
    END LOOP;
END $$;

-- Records refused by validation or dedup, with their evidence (SPEC §3.2).
-- Header values are kept as JSON strings when they are UTF-8 text and as
-- {"b64": ...} otherwise.
CREATE TABLE quarantine (
    id              bigserial PRIMARY KEY,
    received_at     timestamptz NOT NULL DEFAULT now(),
    reason          text NOT NULL,
    field           text,
    detail          text,
    tenant_id       text,
    source          text,
    event_id        text,
    topic           text,
    kafka_partition int,
    kafka_offset    bigint,
    headers         jsonb NOT NULL,
    value           bytea
);
CREATE INDEX quarantine_tenant_reason ON quarantine (tenant_id, reason, id);
CREATE INDEX quarantine_received ON quarantine (received_at);
