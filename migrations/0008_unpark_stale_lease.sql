-- A parked job whose lease ran out goes back to pending without that lease.
--
-- Enabling a subscription again gives its parked jobs back: to in_flight
-- when the attempt that was running at the disable still holds its lease
-- (its outcome settles the job), to pending otherwise.  The pending ones
-- kept lease_owner and lease_until, so the outcome of that old attempt,
-- should it still arrive, passed the outcome's fence (the lease owner) and
-- settled a job that had meanwhile been claimed again.  An expired lease is
-- now cleared with the state: only a live lease survives the unparking.
CREATE OR REPLACE FUNCTION hub_subscription_park_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.enabled AND NEW.verification_state = 'active'
       AND NOT (OLD.enabled AND OLD.verification_state = 'active') THEN
        -- a job parked while its attempt was in flight is in flight again
        -- until that attempt's outcome (or its lease's expiry) settles it
        UPDATE delivery_jobs
           SET state = CASE WHEN lease_until > now() THEN 'in_flight' ELSE 'pending' END,
               lease_owner = CASE WHEN lease_until > now() THEN lease_owner END,
               lease_until = CASE WHEN lease_until > now() THEN lease_until END,
               next_attempt_at = now(), updated_at = now()
         WHERE subscription_id = NEW.id AND state = 'parked';
    ELSIF NOT NEW.enabled AND OLD.enabled THEN
        UPDATE delivery_jobs SET state = 'parked', updated_at = now()
         WHERE subscription_id = NEW.id AND state IN ('pending', 'in_flight');
    END IF;
    RETURN NEW;
END $$;
