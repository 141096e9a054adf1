-- "What happened to my event" without an index over every job.
--
-- delivery_jobs_event (0015) took an entry at each row version of every job:
-- its insert, its claim and its outcome (neither update is HOT: each changes
-- `state`, which other indexes name), three entries per delivery for a
-- look-up an operator makes now and then.  The look-up now starts from the
-- event's stored copies, found by event id here (one entry per event, at
-- ingest, on an insert-only table), and reaches each of its jobs through
-- UNIQUE (subscription_id, event_seq) for every subscription of the event's
-- tenant (src/store_console.c, src/store_subs.c).
--
-- Created on the partitioned table, so every partition (present and future)
-- gets its own; on a large existing inbox the build holds each partition's
-- write lock while it runs (docs/deploy.md: build it per partition with
-- CREATE INDEX CONCURRENTLY first on a large install).  Dropping the old
-- index breaks no statement of the previous binary: during a rollout its
-- event look-ups read delivery_jobs without it (slower, still right).
CREATE INDEX IF NOT EXISTS event_inbox_event ON event_inbox (event_id, tenant_id);
DROP INDEX IF EXISTS delivery_jobs_event;
