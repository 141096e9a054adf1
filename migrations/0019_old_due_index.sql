-- The contract half of 0013: delivery_jobs_due (0005) is read by no binary
-- since 0013, whose claim, tenant sample and due count read
-- delivery_jobs_due_origin (the previous release included).  It still took
-- an entry for every job inserted pending and every failed attempt set
-- pending again: one index entry per job at ingest for nothing.
DROP INDEX IF EXISTS delivery_jobs_due;
