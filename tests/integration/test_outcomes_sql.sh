#!/usr/bin/env bash
# The dispatcher's outcome statement (hub_sql_dispatch_outcomes in
# src/store_dispatch.c, printed by hub-sql as the hub sends it) against the
# real schema, for what a live delivery run cannot arrange on purpose:
# several outcomes of one subscription in one batch, in a chosen order.
# SPEC §7.7: a failure streak records the first and last failure since the
# last success, and one success clears it.  The statement also fences each
# job by the lease of the claim that handed it out ("<owner>#<claim
# serial>": another dispatcher's, or a later claim of the same one, keeps
# the job) and numbers attempts by the job's count.  Last, the trigger that
# parks and unparks a subscription's jobs.
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
TYPES='int8[], text[], text[], int8[], bool[], text[], timestamptz[], int4[], int4[], text[], text[], text[], bool[], text, int8[]'

psql_q "INSERT INTO tenants (id, status) VALUES ('t', 'active');
        INSERT INTO subscriptions (id, tenant_id, event_types, schema_major, url, secret_sealed,
                                   verification_state, failure_first_at, failure_last_at)
        VALUES ('$SUB', 't', '{*}', 1, 'http://sink.invalid/', 'sealed', 'active',
                now() - interval '23 hours', now() - interval '1 hour');
        CREATE TABLE delivery_attempts_test PARTITION OF delivery_attempts
            FOR VALUES FROM ('2000-01-01') TO ('2100-01-01');
        INSERT INTO delivery_jobs (subscription_id, tenant_id, event_seq, event_day, event_id,
                                   event_type, state, lease_owner, lease_until)
        SELECT '$SUB', 't', g, current_date, 'e' || g, 'a.b', 'in_flight',
               CASE WHEN g = 7 THEN 'another#1' WHEN g = 8 THEN 'us#2' ELSE 'us#1' END,
               now() + interval '1 minute'
          FROM generate_series(1, 8) g" >/dev/null

# outcomes "ID:SUCCESS:STARTED_AT ...": one batch of attempted outcomes of
# $SUB, written as the dispatcher "us" from its claim 1 (a failure is a 500,
# retried in 1 s)
outcomes() {
    local ids=() states=() nulls=() delays=() yes=() dids=() starts=() durations=() statuses=()
    local errors=() subs=() okays=() claims=() id ok at
    for o in "$@"; do
        IFS=: read -r id ok at <<<"$o"
        ids+=("$id") okays+=("$ok") starts+=("\"$at\"") nulls+=(NULL) yes+=(t) durations+=(5)
        claims+=(1)
        subs+=("$SUB") dids+=("00000000-0000-7000-8000-0000000000$(printf %02d "$id")")
        if [[ $ok == t ]]; then
            states+=(succeeded) delays+=(0) statuses+=(200) errors+=(NULL)
        else
            states+=(pending) delays+=(1000) statuses+=(500) errors+=(status)
        fi
    done
    local IFS=,
    psql -XAtq -v ON_ERROR_STOP=1 "$STREAMING_HUB_POSTGRES_DSN" >/dev/null 2>"$WORK/outcomes.err" <<SQL
PREPARE o($TYPES) AS $SQL;
EXECUTE o('{${ids[*]}}', '{${states[*]}}', '{${nulls[*]}}', '{${delays[*]}}', '{${yes[*]}}',
          '{${dids[*]}}', '{${starts[*]}}', '{${durations[*]}}', '{${statuses[*]}}',
          '{${errors[*]}}', '{${nulls[*]}}', '{${subs[*]}}', '{${okays[*]}}', 'us',
          '{${claims[*]}}');
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

hub_test_done
