-- Why a payload is not well-formed JSON, or NULL when it is (SPEC §3.1: a
-- JSON content type requires a well-formed JSON payload).
--
-- Ingest checks the grammar of a whole batch's JSON payloads inside its
-- insert statement, with PostgreSQL's JSON parser (a validating pass that
-- builds nothing, several times faster than a jansson document per event).
-- One bad payload fails that statement; ingest then asks this function about
-- each JSON payload of the batch — a subtransaction per row, the slow path
-- taken only for bad input — quarantines the culprits and inserts the rest.
-- The reasons are fixed words: PostgreSQL's messages quote payload bytes.
CREATE FUNCTION hub_json_error(payload bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    PERFORM convert_from(payload, 'UTF8')::json;
    RETURN NULL;
EXCEPTION
    WHEN character_not_in_repertoire OR untranslatable_character THEN
        RETURN 'not UTF-8';
    WHEN statement_too_complex THEN
        RETURN 'nested too deeply';
    WHEN invalid_text_representation THEN
        RETURN 'invalid JSON syntax';
END $$;
