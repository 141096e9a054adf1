#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Exact HTTP ingest answers (SPEC §4, issue 23 item 3) and dedup across a
# UTC midnight (SPEC §3.3, issue 23 item 7).
#
# Requests that arrive together share transactions (src/ingest_http.c); each
# answer still says what happened to that request's own events:
#   - a later transaction of the group that fails (here: the quarantine row
#     of a digest conflict, refused by a trigger) leaves the events the
#     first one stored answered 202 with their sequence; only the events it
#     carried are not stored (a batch element 503, a single event an error),
#     and a retry of those is safe;
#   - a key raced by another transaction runs again alone: the events the
#     first pass stored keep their 202 and sequence, the raced one is a
#     duplicate (made deterministic with a trigger that holds the first
#     transaction open after its insert).
# Midnight: the same new key stored by two transactions on either side of a
# UTC midnight is stored once (migrations/0010); the ingest statement is run
# with psql under a moved clock (hub_ingest_clock() redefined for the test),
# one transaction held open while the other runs: the second waits and
# stores nothing.  Outside the midnight window the same two transactions
# both store it: the race the window closes is real.  Two hubs on either
# side of midnight posting the same keys at once store each key once.
#
# No `set -e`: every check below is an explicit assertion.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/ingest_http.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/ingest_http.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

M='streaming_hub_ingest_records_total'

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
    kafka_start --topic lerian.streaming.answers:1
    sink_start
    hub_shared STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
}

# jqb EXPR: jq -r EXPR over the last answer's body.
jqb() {
    last_body | jq -r "$1" 2>/dev/null
}

# id_count ID: rows of event_inbox with that event id of $TENANT.
id_count() {
    psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = '$1'"
}

# the verdict counter of VERDICT REASON
verdict() {
    metric "$M{verdict=\"$1\",reason=\"$2\"}"
}

# ingest_waiting: HTTP ingest requests waiting for a transaction.
ingest_waiting() {
    metric streaming_hub_ingest_http_waiting
}

# ---------------------------------------------------------------------------
# a later transaction of the group fails
# ---------------------------------------------------------------------------

# The quarantine row of $TENANT's digest conflicts is refused by a trigger:
# the transaction after the insert fails.
conflict_trigger_on() {
    psql_q "CREATE FUNCTION boom_$1() RETURNS trigger LANGUAGE plpgsql AS
              \$\$BEGIN RAISE EXCEPTION 'test: conflict quarantine refused'; END\$\$;
            CREATE TRIGGER boom_$1 BEFORE INSERT ON quarantine FOR EACH ROW
              WHEN (NEW.reason = 'digest_conflict' AND NEW.tenant_id = '$TENANT')
              EXECUTE FUNCTION boom_$1();" >/dev/null || fatal "cannot create the trigger"
}

conflict_trigger_off() {
    psql_q "DROP TRIGGER boom_$1 ON quarantine; DROP FUNCTION boom_$1();" >/dev/null
}

scenario_failed_conflict_quarantine_keeps_stored_events_answered() {
    local acc0 seq out
    own_client
    ev_post "$KEY" c-1 '{"v":1}' >/dev/null
    assert_eq 202 "$(http_status)" "c-1 stored (the key the conflicts below collide with)"
    conflict_trigger_on fq
    acc0=$(verdict accepted "")

    # one batch: a new event, and a conflict whose quarantine row is refused
    ev_batch "$KEY" "$(ev_json new-1 '{"v":1}')" "$(ev_json c-1 '{"v":2}')" >/dev/null
    assert_eq 207 "$(http_status)" "the batch is answered 207"
    assert_eq 202 "$(jqb '.results[0].status')" "the stored event is 202, though a later transaction failed"
    seq=$(jqb '.results[0].sequence')
    assert_match "$seq" '^[0-9]+$' "... with its sequence"
    assert_eq "$seq" "$(psql_q "SELECT seq FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'new-1'")" \
        "... the sequence it was stored under"
    assert_eq 503 "$(jqb '.results[1].status')" "the conflict whose quarantine failed is 503 (not stored)"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = '$TENANT'")" \
        "... and nothing of it is quarantined"

    # two single events that share one transaction: the first two requests
    # hold both running transactions (the inbox is locked), so these two
    # wait and go together into the next.  The second holder is sent once
    # the first has its transaction: sent at once, under load they could
    # arrive in one loop turn and share one, leaving the other free
    inbox_lock
    ev_post_bg "$WORK/fq-h1" "$KEY" hold-1
    wait_until 10 '[[ $(hub_ingest_inflight) == 1 && $(ingest_waiting) == 0 ]]' ||
        fail "the first holding request did not start its transaction"
    ev_post_bg "$WORK/fq-h2" "$KEY" hold-2
    wait_until 10 '[[ $(hub_ingest_inflight) == 2 && $(ingest_waiting) == 0 ]]' ||
        fail "the two holding requests did not start their transactions"
    ev_post_bg "$WORK/fq-r1" "$KEY" new-2 '{"v":1}'
    ev_post_bg "$WORK/fq-r2" "$KEY" c-1 '{"v":3}'
    wait_until 10 '[[ $(ingest_waiting) == 2 ]]' || fail "the two requests did not queue together"
    inbox_unlock
    wait_until 20 "[[ -s $WORK/fq-r1 && -s $WORK/fq-r2 && -s $WORK/fq-h1 && -s $WORK/fq-h2 ]]" ||
        fail "not every request was answered"
    out=$(cat "$WORK/fq-r1")
    assert_eq 202 "${out%% *}" "the stored single event of the shared transaction is 202 (not 503)"
    assert_match "$(jq -r .sequence <<<"${out#* }")" '^[0-9]+$' "... with its sequence"
    assert_eq 1 "$(id_count new-2)" "... and it is stored once"
    out=$(cat "$WORK/fq-r2")
    [[ ${out%% *} == 5* ]] && pass "the single conflict whose quarantine failed is answered ${out%% *}" ||
        fail "the single conflict whose quarantine failed: ${out:0:200}"
    assert_eq 4 "$(metric_delta "$M{verdict=\"accepted\",reason=\"\"}" "$acc0")" \
        "accepted counted once per stored event (new-1, new-2 and the two holding ones)"
    conflict_trigger_off fq

    ev_post "$KEY" c-1 '{"v":3}' >/dev/null
    assert_eq 409 "$(http_status)" "the conflict retried is quarantined (409): a retry was safe"
    ev_post "$KEY" new-2 '{"v":1}' >/dev/null
    assert_eq 200 "$(http_status)" "the stored event retried is a duplicate"
    assert_eq 1 "$(id_count new-2)" "... still stored once"
}

# ---------------------------------------------------------------------------
# a raced key
# ---------------------------------------------------------------------------

scenario_raced_key_runs_again_alone() {
    local acc0 dup0 g1 g2
    own_client
    psql_q "CREATE FUNCTION hold_rk() RETURNS trigger LANGUAGE plpgsql AS
              \$\$BEGIN PERFORM pg_sleep(2); RETURN NULL; END\$\$;
            CREATE TRIGGER hold_rk AFTER INSERT ON event_inbox FOR EACH ROW
              WHEN (NEW.event_id = 'slow-1' AND NEW.tenant_id = '$TENANT')
              EXECUTE FUNCTION hold_rk();" >/dev/null || fatal "cannot create the trigger"
    acc0=$(verdict accepted "")
    dup0=$(verdict duplicate "")
    # the first transaction stores slow-1 and k-2, then holds k-2 uncommitted
    ev_batch_bg "$WORK/rk-g1" "$KEY" "$(ev_json slow-1)" "$(ev_json k-2)"
    wait_sql 10 1 "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'
                     AND query LIKE '%event_inbox%'" || fail "the first transaction is not held"
    # the second (another connection) stores k-3 and races for k-2
    ev_batch_bg "$WORK/rk-g2" "$KEY" "$(ev_json k-2)" "$(ev_json k-3)"
    wait_until 20 "[[ -s $WORK/rk-g1 && -s $WORK/rk-g2 ]]" || fail "the two batches were not answered"
    g1=$(cat "$WORK/rk-g1")
    g2=$(cat "$WORK/rk-g2")
    assert_eq "207 202 202" "${g1%% *} $(jq -r '[.results[].status] | join(" ")' <<<"${g1#* }")" \
        "the first transaction's events: 202, 202"
    assert_eq "207 200 202" "${g2%% *} $(jq -r '[.results[].status] | join(" ")' <<<"${g2#* }")" \
        "the raced key is a duplicate, the event stored in the first pass keeps its 202"
    assert_match "$(jq -r '.results[1].sequence' <<<"${g2#* }")" '^[0-9]+$' \
        "... with its sequence (it was not written again)"
    assert_eq "$(psql_q "SELECT seq FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'k-3'")" \
        "$(jq -r '.results[1].sequence' <<<"${g2#* }")" "... the sequence it is stored under"
    assert_eq "1 1 1" "$(id_count slow-1) $(id_count k-2) $(id_count k-3)" "every key stored once"
    assert_eq 3 "$(metric_delta "$M{verdict=\"accepted\",reason=\"\"}" "$acc0")" "3 accepted counted"
    assert_eq 1 "$(metric_delta "$M{verdict=\"duplicate\",reason=\"\"}" "$dup0")" "1 duplicate counted"
    psql_q "DROP TRIGGER hold_rk ON event_inbox; DROP FUNCTION hold_rk();" >/dev/null
}

# A subscription deleted while an ingest transaction that matched it was
# still running: the job's foreign key failed at the statement's end
# (23503), and every request of the shared transaction, any tenant's, was
# answered 500.  The transaction runs once more, where the subscription is
# no longer matched.
scenario_a_subscription_deleted_meanwhile_fails_no_request() {
    local sub g
    own_client
    sub=$(subscribe_at "$KEY" "/ok/$(own_id)/" 'account.*')
    psql_q "CREATE FUNCTION hold_fk() RETURNS trigger LANGUAGE plpgsql AS
              \$\$BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END\$\$;
            CREATE TRIGGER hold_fk AFTER INSERT ON event_inbox FOR EACH ROW
              WHEN (NEW.event_id = 'fk-1' AND NEW.tenant_id = '$TENANT')
              EXECUTE FUNCTION hold_fk();" >/dev/null || fatal "cannot create the trigger"
    ev_batch_bg "$WORK/fk-g1" "$KEY" "$(ev_json fk-1)"
    wait_sql 10 1 "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'
                     AND query LIKE '%event_inbox%'" || fail "the transaction is not held"
    hub_curl DELETE "/v1/subscriptions/$sub" "" -H "Authorization: Bearer $KEY" >/dev/null
    assert_eq 204 "$(http_status)" "the subscription is deleted while the transaction holds"
    wait_until 20 "[[ -s $WORK/fk-g1 ]]" || fail "the event was not answered"
    psql_q "DROP TRIGGER hold_fk ON event_inbox; DROP FUNCTION hold_fk();" >/dev/null
    g=$(cat "$WORK/fk-g1")
    assert_eq "207 202" "${g%% *} $(jq -r '[.results[].status] | join(" ")' <<<"${g#* }" 2>/dev/null)" \
        "the event is stored (202), not failed with the deleted subscription"
    assert_eq "1 0" "$(id_count fk-1) $(psql_q "SELECT count(*) FROM delivery_jobs WHERE event_id = 'fk-1'")" \
        "stored once, with no job for the deleted subscription"
}

# ---------------------------------------------------------------------------
# dedup across a UTC midnight
# ---------------------------------------------------------------------------

# clock_on: hub_ingest_clock() reads the session setting hub.test_clock
# when it is set (now() otherwise).
clock_on() {
    psql_q "CREATE OR REPLACE FUNCTION hub_ingest_clock() RETURNS timestamptz LANGUAGE sql STABLE AS
              \$\$SELECT coalesce(nullif(current_setting('hub.test_clock', true), '')::timestamptz, now())\$\$" \
        >/dev/null || fatal "cannot redefine hub_ingest_clock()"
}

clock_off() {
    psql_q "CREATE OR REPLACE FUNCTION hub_ingest_clock() RETURNS timestamptz LANGUAGE sql STABLE AS
              'SELECT now()'" >/dev/null
}

# ingest_sql_file FILE: the hub's own ingest statement, prepared as "ins".
ingest_sql_file() {
    {
        printf 'PREPARE ins AS '
        "$BUILD/hub-sql" ingest_insert
        printf ';\n'
    } >"$1"
}

# ins_exec KEY: EXECUTE of the ingest statement for one event of $TENANT
# with id KEY (payload {"m":1}); its row: ord|status|digest|seq|...
ins_exec() {
    printf "EXECUTE ins('{0}', '{%s}', '{/midnight}', '{%s}', '{t.x}', '{t.x}', '{0}',
                      '{2026-01-01T00:00:00Z}', '{application/json}', ARRAY['{}'::jsonb],
                      ARRAY[convert_to('{\"m\":1}', 'UTF8')],
                      ARRAY[sha256(convert_to('{\"m\":1}', 'UTF8'))],
                      '{NULL}', '{NULL}', '{NULL}', '{f}', '{NULL}');\n" "$TENANT" "$1"
}

# race CLOCK_A CLOCK_B KEY: transaction A (clock CLOCK_A) stores KEY and
# stays open 2 s; B (clock CLOCK_B) stores KEY meanwhile, then once more.
# Prints B's two rows (ord|status|stored digest|seq).
race() {
    local a=$1 b=$2 key=$3 sql=$WORK/ins.sql
    ingest_sql_file "$sql"
    {
        cat "$sql"
        printf "BEGIN;\nSET LOCAL hub.test_clock = '%s';\n" "$a"
        ins_exec "$key"
        printf "SELECT pg_sleep(2);\nCOMMIT;\n"
    } | psql -XAtq -v ON_ERROR_STOP=1 "$STREAMING_HUB_POSTGRES_DSN" >"$WORK/race-a.out" 2>&1 &
    track_pid $!
    wait_sql 10 1 "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'" ||
        fail "transaction A did not reach its sleep"
    {
        cat "$sql"
        printf "SET hub.test_clock = '%s';\n" "$b"
        ins_exec "$key"
        ins_exec "$key"
    } | psql -XAtq -v ON_ERROR_STOP=1 "$STREAMING_HUB_POSTGRES_DSN" 2>&1
    wait
}

scenario_same_key_across_midnight_is_stored_once() {
    local d d1 out rows
    own_client
    d=$(psql_q "SELECT (now() AT TIME ZONE 'UTC')::date")
    d1=$(psql_q "SELECT (now() AT TIME ZONE 'UTC')::date + 1")
    clock_on
    out=$(race "$d 23:59:59.9+00" "$d1 00:00:00.1+00" mid-1)
    log "B: $out"
    rows=$(grep -E '^0\|' <<<"$out")
    assert_match "$(sed -n 1p <<<"$rows")" '^0\|active\|\|\|' \
        "B, after midnight, waited for A (before midnight) and stored nothing: its row is raced"
    assert_match "$(sed -n 2p <<<"$rows")" '^0\|active\|\\x[0-9a-f]{64}\|\|' \
        "B again: the key is a duplicate of A's"
    assert_eq 1 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'mid-1'")" \
        "the key is stored once, on A's day"
    assert_eq "$d" "$(psql_q "SELECT day FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'mid-1'")" \
        "... A's day"

    # the control: the same two transactions at noon on either day (no
    # midnight window) both store the key — the race the window closes
    out=$(race "$d 12:00:00+00" "$d1 12:00:00+00" noon-1)
    assert_eq 2 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'noon-1'")" \
        "outside the window both days store the key (what the midnight keys prevent)"
    clock_off
    psql_q "DELETE FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id = 'noon-1'" >/dev/null
}

# The keys table is emptied of keys older than an hour at start and by
# the hourly maintenance.
scenario_midnight_keys_are_purged() {
    own_client
    psql_q "INSERT INTO inbox_midnight_keys (tenant_id, source, event_id, day, created_at)
            VALUES ('$TENANT', '/p', 'old', current_date, now() - interval '2 hours'),
                   ('$TENANT', '/p', 'new', current_date, now())" >/dev/null
    hub_stop
    hub_start_shared
    assert_eq "new" "$(psql_q "SELECT string_agg(event_id, ',') FROM inbox_midnight_keys WHERE tenant_id = '$TENANT'")" \
        "a key older than an hour is purged, a new one kept"
}

# second_hub_start NAME=VALUE...: another hub on the same database (delivery
# role: HTTP ingest only), for this scenario; sets HUB2_URL, HUB2_PID.
second_hub_start() {
    local log=$WORK/hub2.log addr=""
    (cd "$WORK" && exec env STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 STREAMING_HUB_ROLE=delivery \
        STREAMING_HUB_DATA_DIR="$WORK/hub2" STREAMING_HUB_POLICY_DIR="$WORK/policies" \
        STREAMING_HUB_ADMIN_TOKEN="$ADMIN_TOKEN" "$@" "$HUB_BIN" serve) >>"$log" 2>&1 &
    HUB2_PID=$!
    track_pid "$HUB2_PID"
    wait_until 30 "grep -q '\"msg\":\"http listening\"' $log" || fatal "the second hub did not listen"
    addr=$(grep -F '"msg":"http listening"' "$log" | grep -oE '127\.0\.0\.1:[0-9]+' | head -n1)
    HUB2_URL=http://$addr
}

# post_all URL OUT: posts ids mn-0..mn-199 in 4 parallel streams to URL;
# "id status" lines in OUT.
post_all() {
    local url=$1 out=$2 w
    for w in 0 1 2 3; do
        (
            HUB_HTTP_LAST=$out.$w.http HUB_URL=$url
            for i in $(seq "$w" 4 199); do
                ev_post "$KEY" "mn-$i" '{"m":1}' >/dev/null
                echo "mn-$i $(http_status)"
            done
        ) >"$out.$w" &
    done
    wait
    cat "$out".? >"$out"
}

# Two hubs whose ingest transactions are on either side of midnight (their
# sessions' clocks) post the same 200 new keys at once: each key is stored
# once, answered 202 by one hub and 200 by the other.
scenario_two_hubs_across_midnight_store_each_key_once() {
    local d d1 dsn_a dsn_b pa
    own_client
    d=$(psql_q "SELECT (now() AT TIME ZONE 'UTC')::date")
    d1=$(psql_q "SELECT (now() AT TIME ZONE 'UTC')::date + 1")
    clock_on
    dsn_a="$STREAMING_HUB_POSTGRES_DSN options='-c hub.test_clock=${d}T23:59:59.99Z'"
    dsn_b="$STREAMING_HUB_POSTGRES_DSN options='-c hub.test_clock=${d1}T00:00:00.01Z'"
    hub_ensure STREAMING_HUB_POSTGRES_DSN="$dsn_a"
    second_hub_start STREAMING_HUB_POSTGRES_DSN="$dsn_b"
    post_all "$HUB_URL" "$WORK/mn-a.out" &
    pa=$!
    post_all "$HUB2_URL" "$WORK/mn-b.out" &
    wait "$pa" $!
    assert_eq 200 "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE 'mn-%'")" \
        "200 keys posted to both hubs, each stored once"
    assert_eq 200 "$(cat "$WORK/mn-a.out" "$WORK/mn-b.out" | awk '$2 == 202' | wc -l)" \
        "each key answered 202 once across the two hubs"
    assert_eq 200 "$(cat "$WORK/mn-a.out" "$WORK/mn-b.out" | awk '$2 == 200' | wc -l)" \
        "... and 200 (duplicate) by the other"
    log "days: $(psql_q "SELECT day, count(*) FROM event_inbox WHERE tenant_id = '$TENANT' AND event_id LIKE 'mn-%' GROUP BY 1" | tr '\n' ' ')"
    kill -TERM "$HUB2_PID" 2>/dev/null
    wait "$HUB2_PID"
    assert_eq 0 "$?" "the second hub exits 0"
    clock_off
}

scenarios_main "$@"
