#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# A poisoned partition does not block the others (SPEC §3.3): a database
# trigger makes every insert of the record with source '/poison' fail, so the
# batch of partition 0 that carries it fails again and again.  Partitions 1..3
# must still be stored in bounded time, partition 0 must not skip ahead of its
# poisoned record, and once the trigger is gone everything — the poisoned
# record included — is stored exactly once.  The same when the poisoned
# record shares its transaction with records of other partitions (scenario
# b): the failed transaction is split, one per partition, and only the
# poisoned partition stays behind.  And a poisoned partition, paused, given
# up in a rebalance and dealt back to the same process, is fetched again
# (scenario c: two processes in the group).
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

TOPIC=lerian.streaming.poison
N=2000

setup() {
    pg_start
    kafka_start --topic "$TOPIC:4"
    hub_shared
}

# poison_trigger NAME CONDITION: a trigger (and its function) NAME on
# event_inbox that makes every insert of a row matching CONDITION (on NEW) fail
poison_trigger() {
    psql_q "
    CREATE FUNCTION $1() RETURNS trigger LANGUAGE plpgsql AS \$\$
    BEGIN
        IF $2 THEN
            RAISE EXCEPTION 'test poison: % refused', NEW.event_id;
        END IF;
        RETURN NEW;
    END \$\$;
    CREATE TRIGGER $1 BEFORE INSERT ON event_inbox FOR EACH ROW EXECUTE FUNCTION $1();"
}

# count_on SQL_CONDITION: events stored on the partitions that match it
count_on() {
    psql_q "SELECT count(*) FROM event_inbox WHERE kafka_partition $1"
}

scenario_a_poisoned_partition_neither_blocks_the_others_nor_skips_ahead() {
    local tenant out others
    tenant=$(own_tenant)
    wait_until 30 'table_exists event_inbox' || fatal "event_inbox was not created by the hub"
    poison_trigger test_poison "NEW.source = '/poison'" || fatal "could not install the poison trigger"

    # The poisoned record first on partition 0 (i = 0 → partition 0), then N
    # normal records, record i on partition i % 4.
    out=$(produce --topic "$TOPIC" --tenant "$tenant" --partitions 4 --count 1 --source /poison \
        --id-prefix poison-)
    assert_contains "$out" "produced 1 failed 0" "poisoned record produced"
    out=$(produce --topic "$TOPIC" --tenant "$tenant" --partitions 4 --count "$N" --id-prefix n- \
        --payload-bytes 200)
    assert_contains "$out" "produced $N failed 0" "$N normal records produced"

    others=$((N * 3 / 4))
    if wait_until 60 "[[ \$(count_on 'IN (1, 2, 3)') -ge $others ]]"; then
        pass "partitions 1..3 stored while partition 0 is poisoned"
    else
        fail "partitions 1..3: only $(count_on 'IN (1, 2, 3)') of $others stored within 60 s"
    fi
    # Let partition 0 be retried a few more times: it must stay stuck behind
    # its poisoned record (stored in partition order, nothing skipped or lost).
    sleep 3
    assert_eq "$others" "$(count_on 'IN (1, 2, 3)')" "partitions 1..3 stored exactly once"
    assert_eq 0 "$(count_on '= 0')" "nothing of partition 0 stored past the poisoned record"
    assert_ge "$(metric streaming_hub_ingest_batch_failures_total)" 1 \
        "streaming_hub_ingest_batch_failures_total > 0"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM quarantine")" \
        "a database failure is not a verdict: nothing quarantined"
    assert_eq 200 "$(curl -s -o /dev/null -w '%{http_code}' "$HUB_URL/readyz")" \
        "hub still ready while one partition is retried"

    psql_q "DROP TRIGGER test_poison ON event_inbox" || fail "could not drop the trigger"
    if wait_until 90 "[[ \$(count_on '= 0') -ge $((N / 4 + 1)) ]]"; then
        pass "partition 0 recovers once the trigger is gone"
    else
        fail "partition 0: only $(count_on '= 0') of $((N / 4 + 1)) stored within 90 s"
    fi
    sleep 1
    assert_eq "$((N + 1))|$((N + 1))" \
        "$(psql_q "SELECT count(*), count(DISTINCT (tenant_id, source, event_id)) FROM event_inbox")" \
        "all $((N + 1)) records stored exactly once"
    assert_eq "1|0|0" "$(psql_q "SELECT count(*), min(kafka_partition), min(kafka_offset)
                                  FROM event_inbox WHERE source = '/poison'")" \
        "the poisoned record stored once, first on partition 0"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM (
                             SELECT seq, lag(seq) OVER (PARTITION BY kafka_partition
                                                        ORDER BY kafka_offset) AS prev
                               FROM event_inbox) x WHERE prev > seq")" \
        "each partition stored in partition order"
    assert_eq "$((N + 1))" "$(metric 'streaming_hub_ingest_records_total{verdict="accepted",reason=""}')" \
        "accepted counter counts each record once despite the retries"
}

# One ingest connection, so that a transaction held open holds every record
# that arrives meanwhile back for the next one.
hub_env_b_a_poisoned_record_in_a_shared_transaction_holds_back_only_its_partition() {
    echo STREAMING_HUB_INGEST_PG_CONNECTIONS=1
}

# The first transaction (record gate-0, partition 0) waits on an advisory
# lock the test holds until all n records were taken by the hub: the next
# transaction then carries every partition's records, the poisoned shared-0
# (partition 0) among them.  It fails, is split into one per partition, and
# only partition 0 stays behind.  Nothing here depends on when fetches come.
scenario_b_a_poisoned_record_in_a_shared_transaction_holds_back_only_its_partition() {
    local tenant out n=400 shared key=8316025777593609325
    tenant=$(own_tenant)
    wait_until 30 'table_exists event_inbox' || fatal "event_inbox was not created by the hub"
    poison_trigger test_poison_b "NEW.event_id = 'shared-0'" || fatal "could not install the poison trigger"
    psql_q "
    CREATE FUNCTION test_gate_b() RETURNS trigger LANGUAGE plpgsql AS \$\$
    BEGIN
        IF NEW.event_id = 'gate-0' THEN
            PERFORM pg_advisory_xact_lock_shared($key);
        END IF;
        RETURN NEW;
    END \$\$;
    CREATE TRIGGER test_gate_b BEFORE INSERT ON event_inbox FOR EACH ROW EXECUTE FUNCTION test_gate_b();" ||
        fatal "could not install the gate trigger"
    held_session_start gate "SELECT pg_advisory_lock($key);"
    wait_until 10 "[[ \$(psql_q \"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                                  AND objid = $((key & 0xFFFFFFFF))\") -ge 1 ]]" || fatal "the test did not take the lock"

    out=$(produce --topic "$TOPIC" --tenant "$tenant" --partitions 4 --count 1 --id-prefix gate-)
    assert_contains "$out" "produced 1 failed 0" "the gate record produced"
    wait_until 30 "[[ \$(psql_q \"SELECT count(*) FROM pg_stat_activity
                                  WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'\") -ge 1 ]]" ||
        fatal "the hub's first transaction did not reach the gate"
    out=$(produce --topic "$TOPIC" --tenant "$tenant" --partitions 4 --count "$n" --id-prefix shared- \
        --payload-bytes 200)
    assert_contains "$out" "produced $n failed 0" "$n records produced, the first of partition 0 poisoned"
    wait_until 30 "[[ \$(metric streaming_hub_ingest_records_pending) -ge $((n + 1)) ]]" ||
        fatal "the hub did not take the $n records behind the gate ($(metric streaming_hub_ingest_records_pending))"
    echo "SELECT pg_advisory_unlock($key);" >&"$HELD_FD"
    exec {HELD_FD}>&-

    mine() {
        psql_q "SELECT count(*) FROM event_inbox
                 WHERE tenant_id = '$tenant' AND event_id LIKE 'shared-%' AND kafka_partition $1"
    }
    if wait_until 60 "[[ \$(mine 'IN (1, 2, 3)') -ge $((n * 3 / 4)) ]]"; then
        pass "partitions 1..3 stored although the poisoned record shared their transaction"
    else
        fail "partitions 1..3: only $(mine 'IN (1, 2, 3)') of $((n * 3 / 4)) stored within 60 s"
    fi
    shared=$(grep '"partition batch not stored, retrying"' "$HUB_LOG" | grep -o '"partitions":[0-9]*' |
        cut -d: -f2 | sort -n | tail -n1)
    assert_eq 4 "${shared:-0}" "the failed transaction carried the records of all four partitions"
    sleep 2
    assert_eq 0 "$(mine '= 0')" "nothing of partition 0 stored past the poisoned record"

    psql_q "DROP TRIGGER test_poison_b ON event_inbox; DROP TRIGGER test_gate_b ON event_inbox" ||
        fail "could not drop the triggers"
    if wait_until 60 "[[ \$(mine '= 0') -ge $((n / 4)) ]]"; then
        pass "partition 0 recovers once the trigger is gone"
    else
        fail "partition 0: only $(mine '= 0') of $((n / 4)) stored within 60 s"
    fi
    sleep 1
    assert_eq "$((n + 1))|$((n + 1))" "$(psql_q "SELECT count(*), count(DISTINCT event_id) FROM event_inbox
                                  WHERE tenant_id = '$tenant'")" "all $n records and the gate stored exactly once"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM (
                             SELECT seq, lag(seq) OVER (PARTITION BY kafka_partition
                                                        ORDER BY kafka_offset) AS prev
                               FROM event_inbox WHERE tenant_id = '$tenant') x WHERE prev > seq")" \
        "each partition stored in partition order"
}

# c: a partition paused while its transaction fails, then given up in a
# rebalance and dealt back to the same process, is fetched again.  librdkafka
# keeps the application's pause of a partition through a revoke and a new
# assignment; the hub forgot it (a partition starts unpaused on assignment),
# so partition 0 was never fetched again: lag without end, and /readyz
# still 200 (found in review, stop 40).  A second process joins the group
# while partition 0 is poisoned (every partition is revoked from the first
# and dealt out again), the poison goes, the second leaves: the first takes
# all four partitions back and must store what arrives on each of them.
scenario_c_a_partition_paused_when_given_up_is_fetched_again_when_dealt_back() {
    local tenant out failures n=400 first_pid
    tenant=$(own_tenant)
    poison_trigger test_poison_c "NEW.source = '/poison-c'" || fatal "could not install the poison trigger"
    failures=$(metric streaming_hub_ingest_batch_failures_total)
    out=$(produce --topic "$TOPIC" --tenant "$tenant" --partitions 4 --count 1 --source /poison-c \
        --id-prefix pc-)
    assert_contains "$out" "produced 1 failed 0" "the poisoned record produced (partition 0)"
    wait_until 30 "(( \$(metric streaming_hub_ingest_batch_failures_total) > $failures ))" ||
        fatal "partition 0's transaction did not fail"

    first_pid=$HUB_PID
    track_pid "$HUB_PID"
    track_pid "$HUB_WRAPPER_PID"
    hub_start "${HUB_SHARED_ENV[@]}" # ready: a member of the group, partitions dealt out again
    log "second process: hub #$HUB_START_N, pid $HUB_PID; first pid $first_pid"
    psql_q "DROP TRIGGER test_poison_c ON event_inbox" || fail "could not drop the trigger"
    hub_stop # the first process takes all four partitions back

    out=$(produce --topic "$TOPIC" --tenant "$tenant" --partitions 4 --count "$n" --id-prefix c- \
        --payload-bytes 200)
    assert_contains "$out" "produced $n failed 0" "$n records produced after the second process left"
    mine() {
        psql_q "SELECT count(*) FROM event_inbox
                 WHERE tenant_id = '$tenant' AND kafka_partition $1"
    }
    if wait_until 60 "[[ \$(mine '= 0') -ge $((n / 4 + 1)) ]]"; then
        pass "partition 0, paused when given up, is fetched again once dealt back"
    else
        fail "partition 0: only $(mine '= 0') of $((n / 4 + 1)) stored within 60 s"
    fi
    wait_until 30 "[[ \$(mine 'IN (1, 2, 3)') -ge $((n * 3 / 4)) ]]" ||
        fail "partitions 1..3: only $(mine 'IN (1, 2, 3)') of $((n * 3 / 4)) stored within 30 s"
    assert_eq "$((n + 1))|$((n + 1))" "$(psql_q "SELECT count(*), count(DISTINCT event_id) FROM event_inbox
                                  WHERE tenant_id = '$tenant'")" "all $n records and the poisoned one stored once"
    kill -TERM "$first_pid" 2>/dev/null
    wait_until 30 "! kill -0 $first_pid 2>/dev/null" || fail "the first process still runs 30 s after SIGTERM"
}

scenarios_main "$@"
