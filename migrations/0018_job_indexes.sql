-- Two of a delivery's index entries on delivery_jobs gone.
--
-- delivery_jobs_event (0015) is replaced by event_inbox_event (0017).
--
-- delivery_jobs_tenant_id (0015) took an entry at each of a delivery's three
-- row versions.  The claim's (pending -> in_flight) is on the path every
-- delivery waits for, and the jobs in flight at any moment are few (the
-- workers' and the claims' run-ahead, a few hundred per process): they are
-- found through delivery_jobs_leased instead, and the lists merge the two
-- (src/store_console.c, src/store_subs.c).  Two entries per delivery.
--
-- The drops come first: each takes delivery_jobs' ACCESS EXCLUSIVE lock, which
-- then covers the build.  Building first would take a SHARE lock and raise it
-- at the drop, and a previous release's transaction that had read the table
-- and waits to write it (behind the SHARE lock) would deadlock with that.
-- The previous binary's statements wait for the build (on a large install,
-- build the new index with CREATE INDEX CONCURRENTLY first, docs/deploy.md),
-- and its lists then read without the old indexes (slower, still right).
DROP INDEX IF EXISTS delivery_jobs_event;
DROP INDEX IF EXISTS delivery_jobs_tenant_id;
CREATE INDEX IF NOT EXISTS delivery_jobs_tenant_id_settled ON delivery_jobs (tenant_id, id)
    WHERE state <> 'in_flight';
