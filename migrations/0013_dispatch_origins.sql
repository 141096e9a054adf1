-- Per-destination concurrency (SPEC §7.1): what the claim needs to know a
-- job's destination origin (scheme://host:port) without reading its
-- subscription, and an index that lets it skip an origin at its cap.
--
-- The dispatcher caps the attempts in flight per (tenant, origin) and per
-- origin (src/dispatch_caps.c).  A claim offers only the (tenant, origin)
-- lanes that have room, and reads each lane's due jobs from its own range
-- of delivery_jobs_due_origin: a lane at its cap is never offered, so its
-- backlog is never read, however long it is (a filter on the origin after
-- reading the tenant's range would read the whole capped backlog row by
-- row, every claim).
--
-- The origin is identified by a 64-bit hash of its text.  The text follows
-- the hub's URL parser (src/netguard.c): scheme and host lower-cased, the
-- default port filled in.  Spellings only libcurl normalises (an IPv4
-- address written in hex, a trailing dot) make another id for the same
-- endpoint, which then has caps of its own.
--
-- Expand only (docs/deploy.md): the old due index stays for binaries before
-- this migration, whose claim reads it; a later release may drop it.  On a
-- large existing backlog the index build holds a write lock on
-- delivery_jobs while it runs (ingest and outcomes wait for it once).

-- "scheme://host:port" of an http(s) URL, or NULL when it is not one.
CREATE FUNCTION hub_url_origin(url text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT lower(m[1]) || '://' || lower(m[2]) || ':' ||
           CASE WHEN coalesce(m[3], '') <> '' THEN coalesce(nullif(ltrim(m[3], '0'), ''), '0')
                WHEN lower(m[1]) = 'https' THEN '443'
                ELSE '80' END
      FROM regexp_match(url, '^([A-Za-z][A-Za-z0-9+.-]*)://(\[[^]/?#]*\]|[^:/?#]*)(?::([0-9]*))?(?:[/?#]|$)') m
$$;

-- The origin's id: the first 64 bits of the MD5 of its text (of the whole
-- URL when it has no origin), never 0 (0 marks a job not given one yet).
CREATE FUNCTION hub_origin_id(url text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN h = 0 THEN 1 ELSE h END
      FROM (SELECT ('x' || left(md5(coalesce(hub_url_origin(url), url)), 16))::bit(64)::bigint AS h) x
$$;

ALTER TABLE subscriptions ADD COLUMN origin_id bigint GENERATED ALWAYS AS (hub_origin_id(url)) STORED;

-- 0 until set: a job is given its subscription's origin when it is created
-- (by the trigger below, for every writer: the ingest statement, replays,
-- and binaries before this migration) and when it is re-armed.
ALTER TABLE delivery_jobs ADD COLUMN origin_id bigint NOT NULL DEFAULT 0;

UPDATE delivery_jobs j SET origin_id = s.origin_id
  FROM subscriptions s
 WHERE s.id = j.subscription_id AND j.state IN ('pending', 'in_flight', 'parked');

-- what the claim reads: per (tenant, origin) lane, due pending unordered
-- jobs, oldest first; its tenant sample walks the lanes by skip scan
CREATE INDEX delivery_jobs_due_origin ON delivery_jobs (tenant_id, origin_id, next_attempt_at, id)
    WHERE state = 'pending' AND NOT fifo;

-- A job takes its subscription's origin.
CREATE FUNCTION hub_job_origin() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT s.origin_id INTO NEW.origin_id FROM subscriptions s WHERE s.id = NEW.subscription_id;
    NEW.origin_id := coalesce(NEW.origin_id, 0);
    RETURN NEW;
END $$;

-- Inserts that do not name the origin (replays, an older binary's ingest).
CREATE TRIGGER delivery_jobs_origin BEFORE INSERT ON delivery_jobs
FOR EACH ROW WHEN (NEW.origin_id = 0) EXECUTE FUNCTION hub_job_origin();

-- A finished job made pending again (redelivery, a replay re-arming it)
-- takes the origin of the subscription's URL as it is now.
CREATE TRIGGER delivery_jobs_origin_rearm BEFORE UPDATE OF state ON delivery_jobs
FOR EACH ROW WHEN (NEW.state = 'pending' AND OLD.state IN ('succeeded', 'dead'))
EXECUTE FUNCTION hub_job_origin();

-- A URL change moves the subscription's unfinished jobs to the new origin,
-- whatever their state: a parked job (a disabled subscription, or one
-- waiting for its new URL to verify) carries the new origin when it is
-- pending again; one in flight keeps its slot until its outcome and is
-- then pending under the new origin.
CREATE FUNCTION hub_subscription_origin_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE delivery_jobs SET origin_id = NEW.origin_id
     WHERE subscription_id = NEW.id AND state IN ('pending', 'in_flight', 'parked')
       AND origin_id <> NEW.origin_id;
    RETURN NEW;
END $$;

CREATE TRIGGER subscriptions_origin
AFTER UPDATE OF url ON subscriptions
FOR EACH ROW WHEN (OLD.origin_id IS DISTINCT FROM NEW.origin_id)
EXECUTE FUNCTION hub_subscription_origin_sync();
