-- The tenant roster (SPEC §5): the one tenant-isolation point of ingest.
CREATE TABLE tenants (
    id          text PRIMARY KEY CHECK (id ~ '^[a-zA-Z0-9._-]+$' AND length(id) <= 256),
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    quotas      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Tenant API keys: shown once, stored as SHA-256 of the whole key text.
CREATE TABLE tenant_api_keys (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key_hash    bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX tenant_api_keys_tenant ON tenant_api_keys (tenant_id);

-- Who did what to which object, for operators (auto-disable, key changes, ...).
CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    tenant_id   text,
    actor       text NOT NULL,
    action      text NOT NULL,
    object_id   text,
    detail      jsonb
);
CREATE INDEX audit_log_tenant_at ON audit_log (tenant_id, at);

-- Idempotency-Key replay store for POSTs (kept 24h).
CREATE TABLE idempotency_keys (
    scope       text NOT NULL,
    key         text NOT NULL,
    status      int NOT NULL,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
