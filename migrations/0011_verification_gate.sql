-- Verification is a gate (SPEC §6): nothing is delivered to a destination
-- that has not answered the challenge.
--
-- A subscription's jobs are attempted only while it is enabled AND its
-- verification_state is 'active' (the claim checks both since this
-- release).  Until now the parking trigger parked jobs only when a
-- subscription was disabled: a subscription sent back to 'pending' by a url
-- change, or 'failed' by its probe, kept its jobs pending, and the claim,
-- which checked only `enabled`, delivered them to the unverified url.
--
-- Now the jobs are parked whenever the subscription stops being deliverable,
-- for either reason, and given back when it is deliverable again (verified
-- and enabled), exactly as 0007/0008 do for a disable: a job whose attempt
-- is in flight is parked with its lease kept (its outcome still lands, and
-- a retry it asks for stays parked), and unparking gives it back to that
-- attempt while the lease runs, to the claim otherwise.
CREATE OR REPLACE FUNCTION hub_subscription_park_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.enabled AND NEW.verification_state = 'active' THEN
        IF NOT (OLD.enabled AND OLD.verification_state = 'active') THEN
            UPDATE delivery_jobs
               SET state = CASE WHEN lease_until > now() THEN 'in_flight' ELSE 'pending' END,
                   lease_owner = CASE WHEN lease_until > now() THEN lease_owner END,
                   lease_until = CASE WHEN lease_until > now() THEN lease_until END,
                   next_attempt_at = now(), updated_at = now()
             WHERE subscription_id = NEW.id AND state = 'parked';
        END IF;
    ELSE
        -- not deliverable: also parks a job a concurrent transaction made
        -- pending since the last change (an ingest that matched it while it
        -- was still active), which the claim would skip anyway
        UPDATE delivery_jobs SET state = 'parked', updated_at = now()
         WHERE subscription_id = NEW.id AND state IN ('pending', 'in_flight');
    END IF;
    RETURN NEW;
END $$;

-- The trigger now runs only when one of the two flags really changes: the
-- outcome statement sets `enabled` on every streak it writes (a 410 or an
-- auto-disable may turn it off in the same update), and most of those
-- updates change neither flag.
DROP TRIGGER subscriptions_park ON subscriptions;
CREATE TRIGGER subscriptions_park
AFTER UPDATE OF enabled, verification_state ON subscriptions
FOR EACH ROW WHEN (OLD.enabled IS DISTINCT FROM NEW.enabled
                   OR OLD.verification_state IS DISTINCT FROM NEW.verification_state)
EXECUTE FUNCTION hub_subscription_park_sync();

-- Rows as they are: jobs waiting for a subscription that is enabled but
-- pending or failed were claimable until now; they are parked, and resume
-- when it verifies.
UPDATE delivery_jobs j SET state = 'parked', updated_at = now()
  FROM subscriptions s
 WHERE s.id = j.subscription_id AND j.state IN ('pending', 'in_flight')
   AND NOT (s.enabled AND s.verification_state = 'active');
