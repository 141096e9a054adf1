-- A fifo subscription's head is its open job of the lowest arrival sequence
-- (SPEC 3.3: "pull cursors and ordering use it"), no longer the one of the
-- lowest job id.  A replay over a window where some events have no job
-- (they arrived while the subscription was disabled or not verified, or its
-- match policy filtered them) re-arms the old jobs and makes the missing
-- ones with higher ids: by id, the window's events went out of order.
--
-- delivery_jobs_fifo (0005, by id) stays for the previous release's claim
-- during a rolling upgrade; a later migration drops it.  Both hold only
-- open fifo jobs.  On a large install, build this one first with CREATE
-- INDEX CONCURRENTLY (docs/deploy.md): the build reads the whole table.
CREATE INDEX IF NOT EXISTS delivery_jobs_fifo_seq ON delivery_jobs (tenant_id, subscription_id, event_seq)
    WHERE fifo AND state IN ('pending', 'in_flight');
