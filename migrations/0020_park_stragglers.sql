-- What the dispatcher's sweep reads (hub_sql_dispatch_park_stragglers,
-- src/store_dispatch.c): the subscriptions that stopped being deliverable
-- lately, by when they changed.  Only those rows are in it, so it stays
-- small, and the outcome statement's streak updates of a deliverable
-- subscription (which change neither flag nor updated_at) stay HOT.
-- Expand only: the previous release does not read it.
CREATE INDEX IF NOT EXISTS subscriptions_undeliverable ON subscriptions (updated_at)
    WHERE NOT (enabled AND verification_state = 'active');
