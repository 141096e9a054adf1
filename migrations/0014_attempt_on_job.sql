-- Fewer row versions per delivery (SPEC §7.3, §9, §12): a successful
-- attempt is recorded on its job's row, by the update that settles the job,
-- instead of as a row of its own.
--
-- A delivery whose first attempt succeeds used to write three row versions
-- of its job (ingest, claim, outcome) plus an attempt row with its primary
-- key entry, in a partition touched by nothing else.  The outcome now
-- writes the success's delivery id, number, start, duration, status and
-- response excerpt into the job's own columns (success_*), in the update it
-- makes anyway; failed attempts, and a second success of a job that already
-- holds one (a replay, a redelivery), still get rows.  What that saved is in
-- docs/performance.md ("Attempts on the job's row").
--
-- delivery_attempts stays what operators and the API query, every attempt
-- included: the table is renamed delivery_attempt_rows and delivery_attempts
-- is a view over its rows and the attempts recorded on jobs, with the old
-- table's columns in the old order.  Its rows stay where they are (nothing
-- is copied).  Expand only (docs/deploy.md): a binary before this migration
-- goes on working on this schema: its statements name delivery_attempts,
-- which it now reads through the view, and inserts through it (an INSTEAD OF
-- trigger puts them in delivery_attempt_rows); a prepared statement is
-- analysed again after the rename and finds the view.  Its GET
-- /v1/deliveries/{id} reads the view too, so either binary shows every
-- attempt, whichever wrote it.
--
-- Retention: the rows' day partitions are dropped as before (they keep
-- their names, delivery_attempts_YYYYMMDD).  A success recorded on its job
-- lives as long as the job row, like the job's state and counts.
--
-- The statements below take their locks for the length of this migration's
-- transaction (milliseconds: no table is rewritten); the previous binary's
-- outcomes and claims wait that long.

ALTER TABLE delivery_jobs
    ADD COLUMN success_delivery_id uuid,          -- NULL: no success recorded on the job
    ADD COLUMN success_number      int,
    ADD COLUMN success_started_at  timestamptz,
    ADD COLUMN success_duration_ms int,
    ADD COLUMN success_status      int,
    ADD COLUMN success_excerpt     text;

ALTER TABLE delivery_attempts RENAME TO delivery_attempt_rows;

-- Every attempt: the rows, then the successes recorded on jobs (by key:
-- a query by job_id reaches each branch through its primary key).
CREATE VIEW delivery_attempts AS
SELECT day, delivery_id, job_id, number, started_at, duration_ms, status, error, response_excerpt
  FROM delivery_attempt_rows
UNION ALL
SELECT (success_started_at AT TIME ZONE 'UTC')::date, success_delivery_id, id, success_number,
       success_started_at, success_duration_ms, success_status, NULL::text, success_excerpt
  FROM delivery_jobs
 WHERE success_delivery_id IS NOT NULL;

-- Inserts into the view (a binary before this migration, an operator's or
-- a test's SQL) become rows.
CREATE FUNCTION hub_delivery_attempts_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_attempt_rows (day, delivery_id, job_id, number, started_at, duration_ms,
                                       status, error, response_excerpt)
    VALUES (NEW.day, NEW.delivery_id, NEW.job_id, NEW.number, NEW.started_at, NEW.duration_ms,
            NEW.status, NEW.error, NEW.response_excerpt);
    RETURN NEW;
END $$;

CREATE TRIGGER delivery_attempts_insert INSTEAD OF INSERT ON delivery_attempts
FOR EACH ROW EXECUTE FUNCTION hub_delivery_attempts_insert();

-- Partition upkeep (as in 0006) for the renamed parent: its partitions keep
-- the prefix delivery_attempts_, so that the days created before the rename
-- and after it are named alike and none is created twice.
CREATE OR REPLACE FUNCTION hub_maintain_partitions(retention interval, ahead int DEFAULT 3)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date;
    parent text;
    prefix text;
    part record;
    has_rows boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('streaming_hub_partitions'));
    FOREACH parent IN ARRAY ARRAY['event_inbox', 'delivery_attempt_rows'] LOOP
        prefix := CASE parent WHEN 'delivery_attempt_rows' THEN 'delivery_attempts' ELSE parent END;
        FOR i IN -1 .. ahead LOOP
            d := today + i;
            EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I '
                           'FOR VALUES FROM (%L) TO (%L)',
                           prefix || '_' || to_char(d, 'YYYYMMDD'), parent, d, d + 1);
        END LOOP;
        FOR part IN
            SELECT c.relname FROM pg_inherits i
              JOIN pg_class c ON c.oid = i.inhrelid
              JOIN pg_class p ON p.oid = i.inhparent
             WHERE p.relname = parent
               AND c.relname ~ ('^' || prefix || '_[0-9]{8}$')
               AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1
                   < ((now() - retention) AT TIME ZONE 'UTC')::date
        LOOP
            EXECUTE format('DROP TABLE IF EXISTS %I', part.relname);
        END LOOP;
        -- analyzed (or vacuumed) while empty: reltuples 0, relpages 0
        FOR part IN
            SELECT c.relname FROM pg_inherits i
              JOIN pg_class c ON c.oid = i.inhrelid
              JOIN pg_class p ON p.oid = i.inhparent
             WHERE p.relname = parent AND c.relkind = 'r'
               AND c.reltuples = 0 AND c.relpages = 0
               AND c.relname ~ ('^' || prefix || '_[0-9]{8}$')
               AND to_date(right(c.relname, 8), 'YYYYMMDD') BETWEEN today - 1 AND today + ahead
        LOOP
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', part.relname) INTO has_rows;
            IF has_rows THEN
                EXECUTE format('ANALYZE %I', part.relname);
            END IF;
        END LOOP;
    END LOOP;
END $$;

-- Room on each job's page for the versions the claim and the outcome write
-- (neither update can be HOT: both change indexed columns).  With full
-- pages each update moved the job to another page, whose WAL record carries
-- the whole new tuple; on the same page PostgreSQL logs only the bytes that
-- changed, and only one page is dirtied.  Claim and outcome wrote 13% less
-- WAL per job at fillfactor 50, the ingest insert the same, for twice the
-- pages at insert time (docs/performance.md, "Attempts on the job's row").
-- Applies to pages written from now on (no rewrite of the table).
ALTER TABLE delivery_jobs SET (fillfactor = 50);
