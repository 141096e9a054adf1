-- Disabling a subscription parks its jobs in flight too.
--
-- The outcome of an attempt that was in flight when its subscription was
-- disabled decided between 'pending' (retry) and 'parked' by reading the
-- subscription in its own snapshot.  When the disabling transaction
-- committed between that snapshot and the outcome's commit, the job was left
-- 'pending' under a disabled subscription (never attempted, as the claim
-- wants the subscription enabled, but listed as pending and not parked).
-- Now the disabling transaction parks jobs in flight as well (their lease is
-- kept, so the outcome still lands), and the outcome keeps 'parked' when it
-- finds the job parked: whichever transaction writes the job second sees the
-- other's row.  Enabling the subscription again gives a parked job whose
-- lease is still running back to its attempt, not to the claim.
CREATE OR REPLACE FUNCTION hub_subscription_park_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.enabled AND NEW.verification_state = 'active'
       AND NOT (OLD.enabled AND OLD.verification_state = 'active') THEN
        -- a job parked while its attempt was in flight is in flight again
        -- until that attempt's outcome (or its lease's expiry) settles it
        UPDATE delivery_jobs
           SET state = CASE WHEN lease_until > now() THEN 'in_flight' ELSE 'pending' END,
               next_attempt_at = now(), updated_at = now()
         WHERE subscription_id = NEW.id AND state = 'parked';
    ELSIF NOT NEW.enabled AND OLD.enabled THEN
        UPDATE delivery_jobs SET state = 'parked', updated_at = now()
         WHERE subscription_id = NEW.id AND state IN ('pending', 'in_flight');
    END IF;
    RETURN NEW;
END $$;
