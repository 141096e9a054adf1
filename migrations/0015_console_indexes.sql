-- The console's look-ups (issue 27; src/store_console.c and the tenant's
-- deliveries list): "what happened to my event" by event id, one tenant's
-- jobs newest first, and every tenant's jobs of one state (dead ones)
-- newest first.  Without them each is a scan of delivery_jobs.
-- Expand only: an older binary ignores these indexes.
CREATE INDEX IF NOT EXISTS delivery_jobs_event ON delivery_jobs (event_id, tenant_id);
CREATE INDEX IF NOT EXISTS delivery_jobs_tenant_id ON delivery_jobs (tenant_id, id);
-- Only the rare states: every index on delivery_jobs takes an entry at each
-- of a delivery's updates (neither the claim's nor the outcome's is HOT), so
-- one over every job would cost each delivery two index writes; a common
-- state is found newest first by the primary key alone.
CREATE INDEX IF NOT EXISTS delivery_jobs_state_id ON delivery_jobs (state, id)
    WHERE state IN ('dead', 'parked');
