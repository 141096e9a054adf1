-- The pull API (SPEC §9, GET /v1/events?after=<seq>) reads one tenant's
-- accepted events in arrival order.  Without this index a page walks every
-- tenant's events by sequence (the primary key) and filters, so its cost
-- grows with the other tenants' traffic; with it, a page reads its own rows.
--
-- Created on the partitioned table, so every partition (present and future)
-- gets its own.  On a large existing inbox this build holds a write lock on
-- each partition while it runs; ingest waits for it once.
CREATE INDEX event_inbox_tenant_seq ON event_inbox (tenant_id, seq);
