-- Partition upkeep also refreshes the statistics of a partition that was
-- analyzed while empty and has rows now.
--
-- Partitions are created days ahead.  A database-wide ANALYZE (an
-- operator's vacuumdb -z, or ANALYZE event_inbox) records them as empty,
-- and a generic plan made while such a partition was still empty sees no
-- cost difference between its primary key and the dedup index: a claim
-- planned so looked each event of the new day up through the dedup index by
-- day alone, reading the whole day per lookup (9 ms per job with 50,000
-- rows, growing).  Autovacuum analyzes the partition about a minute after
-- its first rows; the hub calls this function every 10 s during the first
-- two minutes of each UTC day, and an ANALYZE invalidates the cached plans.
CREATE OR REPLACE FUNCTION hub_maintain_partitions(retention interval, ahead int DEFAULT 3)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date;
    parent text;
    part record;
    has_rows boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('streaming_hub_partitions'));
    FOREACH parent IN ARRAY ARRAY['event_inbox', 'delivery_attempts'] LOOP
        FOR i IN -1 .. ahead LOOP
            d := today + i;
            EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I '
                           'FOR VALUES FROM (%L) TO (%L)',
                           parent || '_' || to_char(d, 'YYYYMMDD'), parent, d, d + 1);
        END LOOP;
        FOR part IN
            SELECT c.relname FROM pg_inherits i
              JOIN pg_class c ON c.oid = i.inhrelid
              JOIN pg_class p ON p.oid = i.inhparent
             WHERE p.relname = parent
               AND c.relname ~ ('^' || parent || '_[0-9]{8}$')
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
               AND c.relname ~ ('^' || parent || '_[0-9]{8}$')
               AND to_date(right(c.relname, 8), 'YYYYMMDD') BETWEEN today - 1 AND today + ahead
        LOOP
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', part.relname) INTO has_rows;
            IF has_rows THEN
                EXECUTE format('ANALYZE %I', part.relname);
            END IF;
        END LOOP;
    END LOOP;
END $$;
