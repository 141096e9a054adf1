#!/usr/bin/env bash
# The dispatcher's outcome statement (hub_sql_dispatch_outcomes in
# src/store_dispatch.c, printed by hub-sql as the hub sends it) against the
# real schema, for what a live delivery run cannot arrange on purpose:
# several outcomes of one subscription in one batch, in a chosen order.
# SPEC §7.7: a failure streak records the first and last failure since the
# last success, and one success clears it.  The statement also fences each
# job by the lease of the claim that handed it out ("<owner>#<claim
# serial>": another dispatcher's, or a later claim of the same one, keeps
# the job) and numbers attempts by the job's count.  The fence covers
# everything an outcome moves: stale outcomes of every kind (another
# process's lease, a later claim's, a lease that ran out and was cleared)
# touch no job, record no attempt, neither extend nor clear a streak, and
# neither a 410 nor the auto-disable gates disable anything; fenced ones
# do (the controls).  Then the verification gate in the outcome (a retry of
# a job whose subscription is no longer verified is parked), and the
# trigger that parks and unparks a subscription's jobs (migrations/0011),
# a give-back that races a verification (pending, not parked for good),
# including the migration's parking of the rows it finds.  Since 0014 a
# first success is recorded on its job and the rest as rows, the
# delivery_attempts view shows both and takes inserts (a previous binary's)
# as rows, and partition upkeep keeps the rows' day partitions.
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
hub_test_init

pg_start
"$HUB_BIN" migrate >"$WORK/migrate.log" 2>&1 || fatal "migrate failed: $(tail -n 3 "$WORK/migrate.log")"

HUB_SQL=$BUILD/hub-sql
[[ -x $HUB_SQL ]] || fatal "hub-sql not found: $HUB_SQL (build the hub-sql target)"
SQL=$("$HUB_SQL" dispatch_outcomes) || fatal "hub-sql does not know dispatch_outcomes"
[[ $SQL == "WITH o AS ("* ]] || fatal "dispatch_outcomes is not the outcome statement: ${SQL:0:40}"
SUB=00000000-0000-7000-8000-000000000001
export PGTZ=UTC # the timestamps below are compared as text
TYPES='int8[], text[], text[], int8[], bool[], text[], timestamptz[], int4[], int4[], text[], text[], text[], bool[], text, int8[], boolean, bigint, bigint'

psql_q "INSERT INTO tenants (id, status) VALUES ('t', 'active');
        INSERT INTO subscriptions (id, tenant_id, event_types, schema_major, url, secret_sealed,
                                   verification_state, failure_first_at, failure_last_at)
        VALUES ('$SUB', 't', '{*}', 1, 'http://sink.invalid/', 'sealed', 'active',
                now() - interval '23 hours', now() - interval '1 hour');
        CREATE TABLE delivery_attempts_test PARTITION OF delivery_attempt_rows
            FOR VALUES FROM ('2000-01-01') TO ('2100-01-01');
        INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,
                                   event_type, state, lease_owner, lease_until)
        SELECT '$SUB', 't', g, current_date, 'e' || g, 'a.b', 'in_flight',
               CASE WHEN g = 7 THEN 'another#1' WHEN g = 8 THEN 'us#2' ELSE 'us#1' END,
               now() + interval '1 minute'
          FROM generate_series(1, 8) g" >/dev/null

# outcomes "ID:KIND:STARTED_AT ...": one batch of outcomes, written as the
# dispatcher "us" from its claim OUT_CLAIM (default 1).  KIND t is a
# success, f a failure with status OUT_FAIL_STATUS (default 500) retried in
# 1 s, d a failure that leaves the job dead (reason exhausted), filtered or
# released an outcome without an attempt.  Every outcome is
# of subscription OUT_SUB (default $SUB); OUT_AUTODISABLE (t/f, default f),
# OUT_WINDOW_MS and OUT_SPREAD_MS (default 0) are the auto-disable
# settings.  The statement's rows (the subscriptions it disabled, then the
# jobs it set dead) go to $WORK/outcomes.out.
outcomes() {
    local ids=() states=() nulls=() delays=() tried=() dids=() starts=() durations=() statuses=()
    local errors=() subs=() okays=() claims=() reasons=() id ok at
    for o in "$@"; do
        IFS=: read -r id ok at <<<"$o"
        ids+=("$id") starts+=("\"$at\"") nulls+=(NULL) durations+=(5) reasons+=(NULL)
        claims+=("${OUT_CLAIM:-1}")
        subs+=("${OUT_SUB:-$SUB}") dids+=("00000000-0000-7000-8000-0000000$(printf %05d "$id")")
        case $ok in
        t) states+=(succeeded) delays+=(0) statuses+=(200) errors+=(NULL) tried+=(t) okays+=(t) ;;
        f)
            states+=(pending) delays+=(1000) statuses+=("${OUT_FAIL_STATUS:-500}") errors+=(status)
            tried+=(t) okays+=(f)
            ;;
        d)
            states+=(dead) delays+=(0) statuses+=(500) errors+=(status) tried+=(t) okays+=(f)
            reasons[-1]=exhausted
            ;;
        filtered | released)
            states+=("$([[ $ok == filtered ]] && echo filtered || echo pending)") delays+=(0)
            statuses+=(NULL) errors+=(NULL) tried+=(f) okays+=(f)
            ;;
        esac
    done
    local IFS=,
    psql -XAtq -v ON_ERROR_STOP=1 "$STREAMING_HUB_POSTGRES_DSN" >"$WORK/outcomes.out" 2>"$WORK/outcomes.err" <<SQL
PREPARE o($TYPES) AS $SQL;
EXECUTE o('{${ids[*]}}', '{${states[*]}}', '{${reasons[*]}}', '{${delays[*]}}', '{${tried[*]}}',
          '{${dids[*]}}', '{${starts[*]}}', '{${durations[*]}}', '{${statuses[*]}}',
          '{${errors[*]}}', '{${nulls[*]}}', '{${subs[*]}}', '{${okays[*]}}', 'us',
          '{${claims[*]}}', '${OUT_AUTODISABLE:-f}', ${OUT_WINDOW_MS:-0}, ${OUT_SPREAD_MS:-0});
SQL
}
streak() { psql_q "SELECT coalesce(failure_first_at::text, '-') || ' | ' || coalesce(failure_last_at::text, '-') FROM subscriptions"; }

# 1. failures only: the streak that began 23 h ago goes on
outcomes "1:f:2026-12-04 10:00:00+00" || fatal "the outcome statement failed"
assert_eq t "$(psql_q "SELECT now() - failure_first_at > interval '22 hours' AND failure_last_at = '2026-12-04 10:00:00+00' FROM subscriptions")" \
    "failures only: the streak keeps its first failure and moves its last"

# 2. a success, then a failure 2 ms later, in one batch: the success ended
# the old streak, the failure starts a new one
outcomes "2:t:2026-12-04 11:00:00+00" "3:f:2026-12-04 11:00:00.002+00"
assert_eq "2026-12-04 11:00:00.002+00 | 2026-12-04 11:00:00.002+00" "$(streak)" \
    "success then failure in one batch: a new streak from that failure"

# 3. two failures around a success: only the one after it counts
psql_q "UPDATE subscriptions SET failure_first_at = now() - interval '23 hours'" >/dev/null
outcomes "4:f:2026-12-04 12:00:00+00" "5:t:2026-12-04 12:00:01+00" "6:f:2026-12-04 12:00:02+00"
assert_eq "2026-12-04 12:00:02+00 | 2026-12-04 12:00:02+00" "$(streak)" \
    "failure, success, failure: the streak starts at the last failure"

# 4. the newest outcome a success: no streak
psql_q "UPDATE delivery_jobs SET state = 'in_flight', lease_owner = 'us#1' WHERE id IN (1, 2)" >/dev/null
outcomes "1:f:2026-12-04 13:00:00+00" "2:t:2026-12-04 13:00:01+00"
assert_eq "- | -" "$(streak)" "failure then success: the streak is cleared"

# 5. the lease fence and the attempt numbers
outcomes "7:t:2026-12-04 14:00:00+00"
assert_eq "in_flight another#1 0" "$(psql_q "SELECT state || ' ' || lease_owner || ' ' || attempt_count FROM delivery_jobs WHERE id = 7")" \
    "a job leased to another dispatcher keeps its state"
outcomes "8:t:2026-12-04 14:00:00+00"
assert_eq "in_flight us#2 0" "$(psql_q "SELECT state || ' ' || lease_owner || ' ' || attempt_count FROM delivery_jobs WHERE id = 8")" \
    "a job claimed again by the same dispatcher keeps its state: the late outcome of claim 1 does not land"
assert_eq "1:1,2 2:1,2 3:1 4:1 5:1 6:1" \
    "$(psql_q "SELECT string_agg(job_id || ':' || numbers, ' ' ORDER BY job_id) FROM (SELECT job_id, string_agg(number::text, ',' ORDER BY number) AS numbers FROM delivery_attempts GROUP BY job_id) x")" \
    "each attempt recorded once, numbered by the job's count; none for the fenced job"
# where they are (migrations/0014): a job's first success on the job's row,
# everything else (failures, a job's second success) as rows
assert_eq "rows 1:1,2 2:2 3:1 4:1 6:1 | on jobs 2:1 5:1" \
    "$(psql_q "SELECT 'rows ' || (SELECT string_agg(job_id || ':' || numbers, ' ' ORDER BY job_id) FROM (SELECT job_id, string_agg(number::text, ',' ORDER BY number) AS numbers FROM delivery_attempt_rows GROUP BY job_id) x)
                      || ' | on jobs ' || (SELECT string_agg(id || ':' || success_number, ' ' ORDER BY id) FROM delivery_jobs WHERE success_delivery_id IS NOT NULL)")" \
    "a first success is recorded on its job, failures and a second success as rows"
assert_eq "5|1|$(date -u +%Y-%m-%d)|00000000-0000-7000-8000-000000000005|200|5|-|true" \
    "$(psql_q "SELECT job_id || '|' || number || '|' || day || '|' || delivery_id || '|' || status || '|' || duration_ms
                      || '|' || coalesce(error, '-') || '|' || (started_at = '2026-12-04 12:00:01+00')
                 FROM delivery_attempts WHERE job_id = 5" | sed "s/|2026-12-04|/|$(date -u +%Y-%m-%d)|/")" \
    "the view shows a success on its job as an attempt with every column"
assert_eq "{fillfactor=50}" "$(psql_q "SELECT reloptions FROM pg_class WHERE relname = 'delivery_jobs'")" \
    "jobs' pages keep room for the claim's and the outcome's versions"
# a binary before 0014 inserts its attempts into delivery_attempts: the view
# takes them as rows
psql_q "INSERT INTO delivery_attempts (day, delivery_id, job_id, number, started_at, duration_ms,
                                       status, error, response_excerpt)
        VALUES (current_date, '00000000-0000-7000-8000-0000000000ff', 3, 2, now(), 7, 503,
                'status', 'later')" >/dev/null
assert_eq "2|503|later" \
    "$(psql_q "SELECT number || '|' || status || '|' || response_excerpt FROM delivery_attempt_rows WHERE job_id = 3 AND number = 2")" \
    "an insert into the delivery_attempts view becomes a row"

# 6. the parking trigger (migrations): re-enabling a subscription gives a
# parked job with a live lease back to its attempt, and clears a lease that
# ran out while parked (its attempt's late outcome must not land)
psql_q "UPDATE subscriptions SET enabled = false WHERE id = '$SUB';
        UPDATE delivery_jobs SET state = 'parked', lease_owner = 'us#1',
               lease_until = CASE WHEN id = 1 THEN now() + interval '1 minute'
                                  ELSE now() - interval '1 second' END
         WHERE id IN (1, 2);
        UPDATE subscriptions SET enabled = true WHERE id = '$SUB'" >/dev/null
assert_eq "1 in_flight us#1|2 pending -" \
    "$(psql_q "SELECT string_agg(id || ' ' || state || ' ' || coalesce(lease_owner, '-'), '|' ORDER BY id) FROM delivery_jobs WHERE id IN (1, 2)")" \
    "unparking: a live lease is in flight again, an expired one is cleared"

# 7. stale outcomes of every kind move nothing.  Two more subscriptions,
# both verified and enabled: S2 with a failure streak that began 23 h ago,
# S3 without one.  Their jobs: 101 leased to another dispatcher, 102 to a
# later claim of ours (claim 2), 103 reclaimed (its lease ran out and was
# cleared), 104 and 105 leased to our claim 1 (for the controls below), 106
# (S3's) leased to another dispatcher.
S2=00000000-0000-7000-8000-000000000002
S3=00000000-0000-7000-8000-000000000003
NOW=$(date -u +'%Y-%m-%d %H:%M:%S+00')
psql_q "INSERT INTO subscriptions (id, tenant_id, event_types, schema_major, url, secret_sealed,
                                   verification_state, failure_first_at, failure_last_at)
        VALUES ('$S2', 't', '{*}', 1, 'http://sink.invalid/2', 'sealed', 'active',
                now() - interval '23 hours', now() - interval '1 hour'),
               ('$S3', 't', '{*}', 1, 'http://sink.invalid/3', 'sealed', 'active', NULL, NULL);
        INSERT INTO delivery_jobs (id, subscription_id, tenant_id, event_seq, event_day, event_id,
                                   event_type, state, lease_owner, lease_until)
        OVERRIDING SYSTEM VALUE
        SELECT g, CASE WHEN g IN (105, 106) THEN '$S3' ELSE '$S2' END::uuid, 't', g, current_date,
               'e' || g, 'a.b', CASE WHEN g = 103 THEN 'pending' ELSE 'in_flight' END,
               CASE g WHEN 101 THEN 'another#1' WHEN 102 THEN 'us#2' WHEN 103 THEN NULL
                      WHEN 106 THEN 'another#1' ELSE 'us#1' END,
               CASE WHEN g = 103 THEN NULL ELSE now() + interval '1 minute' END
          FROM generate_series(101, 106) g" >/dev/null
# moved: everything an outcome may move, on one line
moved() {
    psql_q "SELECT string_agg(id || ':' || enabled || ':' || coalesce(disabled_reason, '-') || ':'
                              || coalesce(failure_first_at::text, '-') || ':'
                              || coalesce(failure_last_at::text, '-'), ' ' ORDER BY id)
              FROM subscriptions WHERE id IN ('$S2', '$S3');
            SELECT string_agg(id || ':' || state || ':' || coalesce(lease_owner, '-') || ':'
                              || attempt_count, ' ' ORDER BY id)
              FROM delivery_jobs WHERE id BETWEEN 101 AND 106;
            SELECT count(*) FROM delivery_attempts WHERE job_id BETWEEN 101 AND 106;
            SELECT count(*) FROM audit_log" | tr '\n' ' '
}
before=$(moved)
OUT_SUB=$S2 OUT_FAIL_STATUS=410 OUT_AUTODISABLE=t outcomes "101:f:$NOW" "102:f:$NOW" "103:f:$NOW" ||
    fatal "stale 410s: $(cat "$WORK/outcomes.err")"
assert_eq "$before" "$(moved)" "stale 410s (another's lease, a later claim's, a lease run out) move nothing"
assert_eq "" "$(cat "$WORK/outcomes.out")" "and disable nothing"
OUT_SUB=$S2 OUT_AUTODISABLE=t OUT_WINDOW_MS=1000 OUT_SPREAD_MS=1000 \
    outcomes "101:f:$NOW" "102:f:$NOW" "103:f:$NOW"
assert_eq "$before" "$(moved)" "stale failures neither extend the streak nor trip the gates it passes"
assert_eq "" "$(cat "$WORK/outcomes.out")" "no auto-disable"
OUT_SUB=$S2 outcomes "101:t:$NOW" "102:t:$NOW" "103:t:$NOW"
assert_eq "$before" "$(moved)" "stale successes do not clear the streak"
OUT_SUB=$S3 OUT_AUTODISABLE=t outcomes "106:f:$NOW"
assert_eq "$before" "$(moved)" "a stale failure starts no streak"
OUT_SUB=$S2 outcomes "101:filtered:$NOW" "102:released:$NOW" "103:filtered:$NOW"
assert_eq "$before" "$(moved)" "stale outcomes without an attempt: no job deleted or given back"
OUT_CLAIM=2 OUT_SUB=$S2 OUT_FAIL_STATUS=410 OUT_AUTODISABLE=t outcomes "104:f:$NOW"
assert_eq "$before" "$(moved)" "claim 2's outcome of a job leased to claim 1 is stale too"

# the controls: the same outcomes under the live lease do move things.  A
# fenced 410 of S2 beside a stale success of S2: disabled as gone, audited,
# the streak follows the 410 only; a fenced failure of S3 past the gates
# (streak 2 h old): auto-disabled and audited
psql_q "UPDATE subscriptions SET failure_first_at = now() - interval '2 hours',
                                 failure_last_at = now() - interval '1 hour' WHERE id = '$S3'" >/dev/null
OUT_SUB=$S2 OUT_FAIL_STATUS=410 OUT_AUTODISABLE=t outcomes "104:f:$NOW" "102:t:$NOW"
assert_eq "$S2|t|gone||||" "$(cat "$WORK/outcomes.out")" "a fenced 410 disables its subscription (reported)"
assert_eq "false gone $NOW 1" \
    "$(psql_q "SELECT enabled || ' ' || disabled_reason || ' ' || failure_last_at || ' '
                      || (SELECT count(*) FROM audit_log WHERE object_id = '$S2'
                             AND action = 'subscription.disable' AND detail->>'reason' = 'gone')
                 FROM subscriptions WHERE id = '$S2'")" \
    "disabled as gone, audited; the streak moved by the fenced 410, not cleared by the stale success"
OUT_SUB=$S3 OUT_AUTODISABLE=t OUT_WINDOW_MS=3600000 OUT_SPREAD_MS=1000 outcomes "105:f:$NOW"
assert_eq "$S3|t|auto_disabled||||" "$(cat "$WORK/outcomes.out")" \
    "a fenced failure past the gates auto-disables (reported)"
assert_eq "false auto_disabled 1" \
    "$(psql_q "SELECT enabled || ' ' || disabled_reason || ' '
                      || (SELECT count(*) FROM audit_log WHERE object_id = '$S3'
                             AND action = 'subscription.auto_disable')
                 FROM subscriptions WHERE id = '$S3'")" "auto-disabled and audited"
assert_eq "104:parked:-:1 105:parked:-:1" \
    "$(psql_q "SELECT string_agg(id || ':' || state || ':' || coalesce(lease_owner, '-') || ':'
                                 || attempt_count, ' ' ORDER BY id)
                 FROM delivery_jobs WHERE id IN (104, 105)")" \
    "their retries are parked with the subscriptions they disabled"

# the kill switch: a fenced 410 with auto-disable off is a failure only
psql_q "UPDATE subscriptions SET enabled = true, disabled_reason = NULL WHERE id = '$S2';
        UPDATE delivery_jobs SET state = 'in_flight', lease_owner = 'us#1',
                                 lease_until = now() + interval '1 minute' WHERE id = 104" >/dev/null
OUT_SUB=$S2 OUT_FAIL_STATUS=410 outcomes "104:f:$NOW"
assert_eq "|t" "$(cat "$WORK/outcomes.out")|$(psql_q "SELECT enabled FROM subscriptions WHERE id = '$S2'")" \
    "with auto-disable off a 410 disables nothing"

# 8. the gate in the outcome: jobs leased while their subscription was
# verified, whose url then changed (verification pending again): parked by
# the change, leases kept; the attempt's success stands, a failure's retry
# stays parked; they resume only once verified and enabled
S4=00000000-0000-7000-8000-000000000004
psql_q "INSERT INTO subscriptions (id, tenant_id, event_types, schema_major, url, secret_sealed,
                                   verification_state)
        VALUES ('$S4', 't', '{*}', 1, 'http://sink.invalid/4', 'sealed', 'active');
        INSERT INTO delivery_jobs (id, subscription_id, tenant_id, event_seq, event_day, event_id,
                                   event_type, state, lease_owner, lease_until)
        OVERRIDING SYSTEM VALUE
        SELECT g, '$S4', 't', g, current_date, 'e' || g, 'a.b',
               CASE WHEN g < 113 THEN 'in_flight' ELSE 'pending' END,
               CASE WHEN g < 113 THEN 'us#1' END,
               CASE WHEN g < 113 THEN now() + interval '1 minute' END
          FROM generate_series(111, 113) g;
        UPDATE subscriptions SET url = 'http://sink.invalid/elsewhere',
                                 verification_state = 'pending' WHERE id = '$S4'" >/dev/null
s4_jobs() {
    psql_q "SELECT string_agg(id || ':' || state, ' ' ORDER BY id) FROM delivery_jobs
             WHERE subscription_id = '$S4' AND id > ${1:-0}"
}
assert_eq "111:parked:us#1 112:parked:us#1 113:parked:-" \
    "$(psql_q "SELECT string_agg(id || ':' || state || ':' || coalesce(lease_owner, '-'), ' ' ORDER BY id)
                 FROM delivery_jobs WHERE subscription_id = '$S4'")" \
    "leaving verification parks the jobs, those in flight with their lease"
OUT_SUB=$S4 outcomes "111:t:$NOW" "112:f:$NOW"
assert_eq "111:succeeded 112:parked 113:parked" "$(s4_jobs)" \
    "the attempt in flight settles: a success stands, a failure's retry stays parked"
psql_q "UPDATE subscriptions SET verification_state = 'failed' WHERE id = '$S4'" >/dev/null
assert_eq "112:parked 113:parked" "$(s4_jobs 111)" "a failed probe keeps them parked"
psql_q "UPDATE subscriptions SET verification_state = 'active' WHERE id = '$S4'" >/dev/null
assert_eq "112:pending 113:pending" "$(s4_jobs 111)" "verified again (and enabled): they resume"
psql_q "UPDATE subscriptions SET enabled = false, verification_state = 'pending' WHERE id = '$S4';
        UPDATE subscriptions SET verification_state = 'active' WHERE id = '$S4'" >/dev/null
assert_eq "112:parked 113:parked" "$(s4_jobs 111)" "verified but disabled: still parked"

# 8b. a job given back without an attempt while its subscription's new url
# is being verified: the outcome statement's snapshot is older than the
# verification, which unparked the job (its row lock makes the outcome
# wait and re-read the job); the job goes back to pending, not to parked
# for good (its subscription is deliverable, and nothing unparks it again)
S6=00000000-0000-7000-8000-000000000006
psql_q "INSERT INTO subscriptions (id, tenant_id, event_types, schema_major, url, secret_sealed,
                                   verification_state)
        VALUES ('$S6', 't', '{*}', 1, 'http://sink.invalid/6', 'sealed', 'active');
        INSERT INTO delivery_jobs (id, subscription_id, tenant_id, event_seq, event_day, event_id,
                                   event_type, state, lease_owner, lease_until)
        OVERRIDING SYSTEM VALUE
        VALUES (141, '$S6', 't', 141, current_date, 'e141', 'a.b', 'in_flight', 'us#1',
                now() + interval '1 minute');
        UPDATE subscriptions SET url = 'http://sink.invalid/6b', verification_state = 'pending'
         WHERE id = '$S6'" >/dev/null
psql -XAtq "$STREAMING_HUB_POSTGRES_DSN" >/dev/null 2>&1 <<SQL &
BEGIN;
UPDATE subscriptions SET verification_state = 'active' WHERE id = '$S6';
SELECT pg_sleep(2);
COMMIT;
SQL
verifier=$!
wait_sql 10 1 "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(2)%'" ||
    fatal "the verification did not reach its sleep"
OUT_SUB=$S6 outcomes "141:released:$NOW"
wait "$verifier" # only it: the script's watchdog is a child too
assert_eq "141:pending:-" \
    "$(psql_q "SELECT id || ':' || state || ':' || coalesce(lease_owner, '-') FROM delivery_jobs WHERE id = 141")" \
    "given back while its subscription was verified: pending, not parked for good"

# 9. the migration parks the rows it finds: the pending jobs of a
# subscription that is enabled but not verified (claimable until 0011),
# not those of a verified one
S5=00000000-0000-7000-8000-000000000005
psql_q "INSERT INTO subscriptions (id, tenant_id, event_types, schema_major, url, secret_sealed,
                                   verification_state)
        VALUES ('$S5', 't', '{*}', 1, 'http://sink.invalid/5', 'sealed', 'failed');
        INSERT INTO delivery_jobs (id, subscription_id, tenant_id, event_seq, event_day, event_id,
                                   event_type, state)
        OVERRIDING SYSTEM VALUE
        VALUES (121, '$S5', 't', 121, current_date, 'e121', 'a.b', 'pending'),
               (122, '$SUB', 't', 122, current_date, 'e122', 'a.b', 'pending')" >/dev/null
psql -XAtq -v ON_ERROR_STOP=1 "$STREAMING_HUB_POSTGRES_DSN" \
    -f "$HUB_TEST_REPO/migrations/0011_verification_gate.sql" >/dev/null 2>"$WORK/migration.err" ||
    fatal "0011 does not run again: $(cat "$WORK/migration.err")"
assert_eq "121:parked 122:pending" \
    "$(psql_q "SELECT string_agg(id || ':' || state, ' ' ORDER BY id) FROM delivery_jobs WHERE id IN (121, 122)")" \
    "the migration parks the pending jobs of an unverified subscription only"

# 11. dead jobs come back as rows (the dispatcher publishes hub.delivery.dead
# from them), only those the fence let through: a dead outcome of a job
# leased to another dispatcher, or to a later claim, is no row
psql_q "INSERT INTO delivery_jobs (id, subscription_id, tenant_id, event_seq, event_day, event_id,
                                   event_type, state, lease_owner, lease_until)
        OVERRIDING SYSTEM VALUE
        SELECT g, '$SUB', 't', g, current_date, 'e' || g, 'a.b', 'in_flight',
               CASE g WHEN 131 THEN 'us#1' WHEN 132 THEN 'another#1' ELSE 'us#2' END,
               now() + interval '1 minute'
          FROM generate_series(131, 133) g" >/dev/null
outcomes "131:d:$NOW" "132:d:$NOW" "133:d:$NOW" || fatal "dead outcomes: $(cat "$WORK/outcomes.err")"
assert_eq "$SUB|t|exhausted|131|e131|a.b|" "$(cat "$WORK/outcomes.out")" \
    "the fenced dead job is a row with its event; the stale ones are not"
assert_eq "131:dead 132:in_flight 133:in_flight" \
    "$(psql_q "SELECT string_agg(id || ':' || state, ' ' ORDER BY id) FROM delivery_jobs WHERE id BETWEEN 131 AND 133")" \
    "only the fenced job is dead"

# 10. retention of attempt rows (migrations/0014): partition upkeep keeps
# creating and dropping the renamed table's day partitions under their old
# names, delivery_attempts_YYYYMMDD
psql_q "DROP TABLE delivery_attempts_test" >/dev/null
psql_q "SET client_min_messages = warning; SELECT hub_maintain_partitions('7 days')" >/dev/null || fail "partition upkeep failed"
psql_q "CREATE TABLE delivery_attempts_20200101 PARTITION OF delivery_attempt_rows
            FOR VALUES FROM ('2020-01-01') TO ('2020-01-02')" >/dev/null
psql_q "SET client_min_messages = warning; SELECT hub_maintain_partitions('7 days')" >/dev/null || fail "partition upkeep failed"
assert_eq "0 1" \
    "$(psql_q "SELECT count(*) FILTER (WHERE c.relname = 'delivery_attempts_20200101') || ' '
                      || count(*) FILTER (WHERE c.relname = 'delivery_attempts_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD'))
                 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'delivery_attempt_rows'::regclass")" \
    "attempt rows: a day past the retention is dropped, today's partition exists"

hub_test_done
