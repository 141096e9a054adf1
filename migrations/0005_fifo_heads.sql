-- FIFO subscriptions (SPEC §7.8) without walking their backlog.
--
-- A fifo subscription delivers only its oldest unfinished job.  Its jobs
-- used to share the due index with everyone else's, so a claim that met a
-- fifo backlog checked each of its jobs for an older open one: a fifo
-- subscription with 54,000 jobs waiting made every claim take 300 ms, for
-- every tenant.  Now each job says whether it is ordered, the due index
-- holds the unordered ones only, and a fifo subscription's head is the first
-- entry of its own small index: one descent per subscription with open
-- ordered jobs, whatever its backlog.
ALTER TABLE delivery_jobs ADD COLUMN fifo boolean NOT NULL DEFAULT false;

UPDATE delivery_jobs j SET fifo = true
  FROM subscriptions s
 WHERE s.id = j.subscription_id AND s.ordering = 'fifo'
   AND j.state IN ('pending', 'in_flight', 'parked');

DROP INDEX delivery_jobs_due;
CREATE INDEX delivery_jobs_due ON delivery_jobs (tenant_id, next_attempt_at, id)
    WHERE state = 'pending' AND NOT fifo;
-- the open ordered jobs, per tenant and subscription in order: a
-- subscription's first entry is its head (pending: it may go when due;
-- in flight: the subscription waits)
CREATE INDEX delivery_jobs_fifo ON delivery_jobs (tenant_id, subscription_id, id)
    WHERE fifo AND state IN ('pending', 'in_flight');

-- An ordering change moves the subscription's unfinished jobs to the other
-- path.  A job an ingest transaction inserts while the change commits may
-- keep the old flag: it is then delivered by the path it names (in order,
-- or not), never lost.
CREATE FUNCTION hub_subscription_ordering_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE delivery_jobs SET fifo = (NEW.ordering = 'fifo')
     WHERE subscription_id = NEW.id AND state IN ('pending', 'in_flight', 'parked')
       AND fifo <> (NEW.ordering = 'fifo');
    RETURN NEW;
END $$;

CREATE TRIGGER subscriptions_ordering
AFTER UPDATE OF ordering ON subscriptions
FOR EACH ROW WHEN (OLD.ordering IS DISTINCT FROM NEW.ordering)
EXECUTE FUNCTION hub_subscription_ordering_sync();
