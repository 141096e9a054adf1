#!/usr/bin/env bash
# A partition's batches in flight together (STREAMING_HUB_INGEST_PARTITION_BATCHES)
# are stored in partition order (SPEC §3.4) when one of them fails while
# later ones are already pipelined behind it on the partition's lane: a
# steady stream into one partition carries payloads that are not JSON (the
# batch's insert fails, it is checked row by row and written again) and
# records whose first insert a trigger fails once (the batch is retried
# after a backoff).  Every good record must be stored exactly once, in
# offset order, the bad ones quarantined, and a restart must find the
# offsets committed past all of it.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

TOPIC=lerian.streaming.lanes
N=3000

hub_test_init
pg_start
kafka_start --topic "$TOPIC:1"
hub_start STREAMING_HUB_INGEST_PARTITION_BATCHES=4
admin_curl POST /admin/tenants '{"id":"lanes","status":"active"}' >/dev/null
# The first 8 inserts of a '/flaky' record fail (the sequence does not roll
# back): as many failed batches, each retried after its backoff.
psql_q "CREATE SEQUENCE lanes_flaky;
        CREATE FUNCTION lanes_flaky() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN
          IF NEW.source = '/flaky' AND nextval('lanes_flaky') <= 8 THEN
            RAISE EXCEPTION 'flaky insert of %', NEW.event_id;
          END IF;
          RETURN NEW;
        END \$\$;
        CREATE TRIGGER lanes_flaky BEFORE INSERT ON event_inbox
          FOR EACH ROW EXECUTE FUNCTION lanes_flaky();" >/dev/null || fatal "trigger"
printf '[1,2' >"$WORK/cut.json"

produce_bg --topic "$TOPIC" --tenant lanes --partitions 1 --count $N --rate 1000 --id-prefix good-
for i in $(seq 1 8); do
    sleep 0.25
    produce --topic "$TOPIC" --tenant lanes --partitions 1 --count 1 --payload-file "$WORK/cut.json" \
        --id-prefix "bad$i-" >/dev/null || fail "produce bad$i"
    produce --topic "$TOPIC" --tenant lanes --partitions 1 --count 1 --source /flaky \
        --id-prefix "flaky$i-" >/dev/null || fail "produce flaky$i"
done
wait "$PRODUCER_PID" || fail "the stream's producer failed"
stored="SELECT count(*) FROM event_inbox WHERE tenant_id = 'lanes'"
wait_until 90 "[[ \$(psql_q \"$stored\") -ge $((N + 8)) ]]" ||
    fail "only $(psql_q "$stored") of $((N + 8)) records stored"
wait_until 30 "[[ \$(psql_q \"SELECT count(*) FROM quarantine WHERE tenant_id = 'lanes'\") -ge 8 ]]" ||
    fail "the bad payloads were not all quarantined"

assert_eq $((N + 8)) "$(psql_q "SELECT count(DISTINCT event_id) FROM event_inbox WHERE tenant_id = 'lanes'")" \
    "every good and flaky record stored"
assert_eq $((N + 8)) "$(psql_q "$stored")" "none of them twice"
assert_eq 0 "$(psql_q "SELECT count(*) FROM (SELECT kafka_offset, max(kafka_offset) OVER (ORDER BY seq
                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
                          FROM event_inbox WHERE tenant_id = 'lanes') x WHERE kafka_offset < before")" \
    "stored in partition order: sequences follow offsets"
assert_eq 8 "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = 'lanes' AND event_id LIKE 'bad%'")" \
    "the payloads that are not JSON quarantined, once each"
assert_ge "$(psql_q "SELECT last_value FROM lanes_flaky")" 9 "the flaky inserts failed, then passed"
log "failed batches: $(metric streaming_hub_ingest_batch_failures_total), lane checks that failed:" \
    "$(grep -c 'did not commit' "$HUB_LOG")"

# Offsets were committed past everything: a restart stores nothing again.
hub_stop
q0=$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = 'lanes'")
hub_start STREAMING_HUB_INGEST_PARTITION_BATCHES=4
sleep 5
assert_eq $((N + 8)) "$(psql_q "$stored")" "after a restart: nothing stored again"
assert_eq "$q0" "$(psql_q "SELECT count(*) FROM quarantine WHERE tenant_id = 'lanes'")" \
    "after a restart: nothing quarantined again (offsets committed)"
assert_eq 0 "$(metric 'streaming_hub_ingest_records_total{verdict="duplicate",reason=""}')" \
    "after a restart: no record read again"
hub_test_done
