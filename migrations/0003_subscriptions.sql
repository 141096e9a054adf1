-- Subscriptions (SPEC §6) and the delivery tables (SPEC §7) they feed.

CREATE TABLE subscriptions (
    id                  uuid PRIMARY KEY,
    tenant_id           text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    event_types         text[] NOT NULL CHECK (cardinality(event_types) >= 1),
    schema_major        int NOT NULL CHECK (schema_major >= 1),
    url                 text NOT NULL,
    -- destination headers (a credential) and signing secrets, sealed with
    -- AES-256-GCM under the KEK: "v1:<kek id>:<base64>" (src/crypto.c)
    headers_sealed      text,
    secret_sealed       text NOT NULL,
    prev_secret_sealed  text,
    prev_secret_until   timestamptz,
    enabled             boolean NOT NULL DEFAULT true,
    verification_state  text NOT NULL DEFAULT 'pending'
                        CHECK (verification_state IN ('pending', 'active', 'failed')),
    retry_schedule      text[],           -- as given (durations); NULL = the default curve
    policy              text,
    ordering            text NOT NULL DEFAULT 'unordered' CHECK (ordering IN ('unordered', 'fifo')),
    max_rate            double precision CHECK (max_rate IS NULL OR max_rate > 0),
    disabled_reason     text,
    failure_first_at    timestamptz,      -- open failure streak (SPEC §7.7)
    failure_last_at     timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscriptions_tenant ON subscriptions (tenant_id, id);

-- Matching index: one row per (subscription, event type pattern), so that an
-- event's candidates are found by (tenant, schema major, pattern) lookups
-- whose cost does not grow with other tenants' subscriptions.  Kept in step
-- with subscriptions.event_types by the trigger below.
CREATE TABLE subscription_routes (
    tenant_id       text NOT NULL,
    schema_major    int NOT NULL,
    pattern         text NOT NULL,   -- 'transaction.posted', 'balance.*' or '*'
    subscription_id uuid NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
    PRIMARY KEY (tenant_id, schema_major, pattern, subscription_id)
);
CREATE INDEX subscription_routes_subscription ON subscription_routes (subscription_id);

CREATE FUNCTION hub_subscription_routes_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.event_types = OLD.event_types
       AND NEW.schema_major = OLD.schema_major THEN
        RETURN NEW;
    END IF;
    DELETE FROM subscription_routes WHERE subscription_id = NEW.id;
    INSERT INTO subscription_routes (tenant_id, schema_major, pattern, subscription_id)
    SELECT DISTINCT NEW.tenant_id, NEW.schema_major, p, NEW.id FROM unnest(NEW.event_types) p;
    RETURN NEW;
END $$;

CREATE TRIGGER subscriptions_routes
AFTER INSERT OR UPDATE ON subscriptions
FOR EACH ROW EXECUTE FUNCTION hub_subscription_routes_sync();

-- One delivery job per (event, matching subscription).  The event is found
-- by (event_day, event_seq), the primary key of its inbox partition.
CREATE TABLE delivery_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription_id  uuid NOT NULL REFERENCES subscriptions (id) ON DELETE CASCADE,
    tenant_id        text NOT NULL,
    event_seq        bigint NOT NULL,
    event_day        date NOT NULL,
    event_id         text NOT NULL,
    event_type       text NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'in_flight', 'succeeded', 'dead', 'parked')),
    reason           text,             -- dead: exhausted | poison | gone | ...
    attempt_count    int NOT NULL DEFAULT 0,
    reclaims         int NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_until      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (subscription_id, event_seq)
);
-- what a dispatcher claims: per tenant, due pending jobs, oldest first (the
-- claim walks tenants with a skip scan, so one tenant's backlog never hides
-- another tenant's fresh event; SPEC §7.1)
CREATE INDEX delivery_jobs_due ON delivery_jobs (tenant_id, next_attempt_at, id)
    WHERE state = 'pending';
-- expired leases to reclaim
CREATE INDEX delivery_jobs_leased ON delivery_jobs (lease_until) WHERE state = 'in_flight';
CREATE INDEX delivery_jobs_subscription ON delivery_jobs (subscription_id, state, id);

-- Jobs of a disabled subscription are parked (kept, not attempted) and resume
-- when it is enabled again while verified (SPEC §7.7).  A trigger keeps that
-- true whoever flips the flags: the API, auto-disable, an operator's SQL.
CREATE FUNCTION hub_subscription_park_sync() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.enabled AND NEW.verification_state = 'active'
       AND NOT (OLD.enabled AND OLD.verification_state = 'active') THEN
        UPDATE delivery_jobs SET state = 'pending', next_attempt_at = now(), updated_at = now()
         WHERE subscription_id = NEW.id AND state = 'parked';
    ELSIF NOT NEW.enabled AND OLD.enabled THEN
        UPDATE delivery_jobs SET state = 'parked', updated_at = now()
         WHERE subscription_id = NEW.id AND state = 'pending';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER subscriptions_park
AFTER UPDATE OF enabled, verification_state ON subscriptions
FOR EACH ROW EXECUTE FUNCTION hub_subscription_park_sync();

-- Every attempt, kept for the API (SPEC §9) and for operators; partitioned by
-- day like the inbox, so retention drops whole partitions (SPEC §12).
CREATE TABLE delivery_attempts (
    day               date NOT NULL,
    delivery_id       uuid NOT NULL,      -- UUIDv7, sent as X-Lerian-Delivery-Id
    job_id            bigint NOT NULL,
    number            int NOT NULL,
    started_at        timestamptz NOT NULL,
    duration_ms       int NOT NULL,
    status            int,                -- HTTP status, NULL when none came back
    error             text,               -- error class: timeout, connect, tls, policy_error ...
    response_excerpt  text,               -- first 1 KiB of the response body
    PRIMARY KEY (job_id, number, day)
) PARTITION BY RANGE (day);

-- Partition upkeep now covers both day-partitioned tables.
CREATE OR REPLACE FUNCTION hub_maintain_partitions(retention interval, ahead int DEFAULT 3)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date;
    parent text;
    part record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('streaming_hub_partitions'));
    FOREACH parent IN ARRAY ARRAY['event_inbox', 'delivery_attempts'] LOOP
        FOR i IN -1 .. ahead LOOP
            d := today + i;
            EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I '
                           'FOR VALUES FROM (%L) TO (%L)',
                           parent || '_' || to_char(d, 'YYYYMMDD'), parent, d, d + 1);
        END LOOP;
        FOR part IN
            SELECT c.relname FROM pg_inherits i
              JOIN pg_class c ON c.oid = i.inhrelid
              JOIN pg_class p ON p.oid = i.inhparent
             WHERE p.relname = parent
               AND c.relname ~ ('^' || parent || '_[0-9]{8}$')
               AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1
                   < ((now() - retention) AT TIME ZONE 'UTC')::date
        LOOP
            EXECUTE format('DROP TABLE IF EXISTS %I', part.relname);
        END LOOP;
    END LOOP;
END $$;
