-- The schema registry (SPEC §3.5, docs/schemas.md).  New tables and one
-- nullable column only: a binary of the previous release runs on this
-- schema unchanged.

-- One row per registered version of an event type's JSON Schema (draft-07),
-- platform-wide (tenant_id '') or a tenant's own.  A version is immutable:
-- DELETE retires it (retired_at set), and the same version may then be
-- registered again as a new row.  digest is the hex SHA-256 of the schema
-- text as stored; events checked against a version keep its version
-- (event_inbox.schema_version) whatever happens to it later.
CREATE TABLE event_schemas (
    id            bigserial PRIMARY KEY,
    tenant_id     text NOT NULL DEFAULT '',
    event_type    text NOT NULL,
    version       text NOT NULL,
    major         int NOT NULL,
    minor         int NOT NULL,
    patch         int NOT NULL,
    schema        text NOT NULL,
    digest        text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    registered_by text NOT NULL,
    retired_at    timestamptz,
    retired_by    text
);
-- At most one live row per version; the lookups go by (scope, type).
CREATE UNIQUE INDEX event_schemas_live ON event_schemas (tenant_id, event_type, version)
    WHERE retired_at IS NULL;

-- Per-type settings (tenant_id '' for the platform's): what an event whose
-- major has no schema gets while its type has some.
CREATE TABLE event_schema_settings (
    tenant_id       text NOT NULL DEFAULT '',
    event_type      text NOT NULL,
    unknown_version text NOT NULL CHECK (unknown_version IN ('accept', 'quarantine')),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    updated_by      text NOT NULL,
    PRIMARY KEY (tenant_id, event_type)
);

-- The registry's generation: bumped by every change to the two tables
-- above, polled by every process (src/schema_registry.c), which reloads
-- when it moved.
CREATE TABLE event_schema_generation (
    id         int PRIMARY KEY CHECK (id = 1),
    generation bigint NOT NULL
);
INSERT INTO event_schema_generation VALUES (1, 1);

CREATE FUNCTION hub_schema_generation_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE event_schema_generation SET generation = generation + 1 WHERE id = 1;
    RETURN NULL;
END $$;

CREATE TRIGGER event_schemas_generation AFTER INSERT OR UPDATE OR DELETE ON event_schemas
    FOR EACH STATEMENT EXECUTE FUNCTION hub_schema_generation_bump();
CREATE TRIGGER event_schema_settings_generation
    AFTER INSERT OR UPDATE OR DELETE ON event_schema_settings
    FOR EACH STATEMENT EXECUTE FUNCTION hub_schema_generation_bump();

-- The registered version an accepted event was checked against (NULL: its
-- type had no schema, or its major none and the type's setting accepts it).
ALTER TABLE event_inbox ADD COLUMN schema_version text;
