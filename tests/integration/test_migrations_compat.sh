#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Migrations stay backward compatible with the previous release's binary
# (docs/deploy.md, "Upgrades": expand first, contract in a later release), so
# that a rolling upgrade never runs old pods against a schema they cannot use.
#
# The previous release is built from git history: the newest v* tag below
# HEAD, or, while the project has no release tags, the last commit before the
# newest change to migrations/ (the binary of the previous schema).
# HUB_COMPAT_BASE=<commit> names another one.  Only the `streaming-hub`
# target is built, without optimisation (the SQL it sends is the same), and
# kept in $BUILD/compat/<commit> for the next run: ~10 s once, 0 after.
#
# Covers, in the order of an upgrade:
#   1. the previous binary migrates an empty database and serves (role all)
#      under a steady load of Kafka events delivered to the sink;
#   2. this tree's binary refuses to serve on that older schema with
#      AUTO_MIGRATE=false (migrations first), with one clear log line;
#   3. this tree's `migrate` runs while the previous hub works: it exits 0,
#      the previous hub stays ready and logs no error, and goes on storing
#      and delivering;
#   4. a hub of this tree joins (the rolling restart), the previous one gets
#      SIGTERM and exits 0;
#   5. every event is stored once and delivered, none dead, none lost;
# then, side by side (the middle of a rolling upgrade):
#   6. a previous hub and a hub of this tree deliver from one database at
#      once, with failures and retries, so that one job's attempts may be
#      made by either: both record outcomes, each in its own way (the
#      previous one a row per attempt through the delivery_attempts view,
#      this tree's a first success on the job's row, migrations/0014), and
#      every attempt of every job is visible, numbered 1..attempt_count,
#      in the view and in GET /v1/deliveries/{id} of either hub.
#
# Skipped (exit 77) only when the checkout has no history to build from (a
# shallow clone).
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

REPO=$HUB_TEST_REPO
TOPIC=lerian.streaming.compat
EVENTS=4000

# The previous release: found and built (once, kept under $BUILD/compat)
# before anything starts; sets BASE, PREV_BIN, NEW_BIN and new_migrations.
setup() {
    local last t0 prev_dir
    if [[ $(git -C "$REPO" rev-parse --is-shallow-repository 2>/dev/null) != false ]]; then
        echo "skipped: $REPO has no git history to build the previous release from"
        exit 77
    fi
    BASE=${HUB_COMPAT_BASE:-}
    if [[ -z $BASE ]]; then
        BASE=$(git -C "$REPO" describe --tags --abbrev=0 --match 'v*' HEAD^ 2>/dev/null)
    fi
    if [[ -z $BASE ]]; then
        last=$(git -C "$REPO" log -1 --format=%H HEAD -- migrations)
        BASE=$last^
    fi
    BASE=$(git -C "$REPO" rev-parse --verify -q "$BASE^{commit}") || fatal "no commit $BASE in $REPO"
    log "previous release: $(git -C "$REPO" log -1 --format='%h %s' "$BASE")"
    new_migrations=$(comm -13 <(git -C "$REPO" ls-tree --name-only "$BASE" migrations/ | sort) \
        <(ls "$REPO"/migrations/*.sql | sed "s#^$REPO/##" | sort) | tr '\n' ' ')
    log "migrations this tree adds: ${new_migrations:-none}"

    prev_dir=$BUILD/compat/$BASE
    PREV_BIN=$prev_dir/streaming-hub
    if [[ ! -x $PREV_BIN ]]; then
        t0=$SECONDS
        rm -rf "$prev_dir.tmp"
        mkdir -p "$prev_dir.tmp/src"
        git -C "$REPO" archive "$BASE" | tar -x -C "$prev_dir.tmp/src" || fatal "git archive $BASE failed"
        if ! (cmake -S "$prev_dir.tmp/src" -B "$prev_dir.tmp/build" -DCMAKE_BUILD_TYPE=None \
            -DCMAKE_C_FLAGS=-O0 && cmake --build "$prev_dir.tmp/build" -j"$(nproc)" --target streaming-hub) \
            >"$WORK/prev-build.log" 2>&1; then
            tail -n 30 "$WORK/prev-build.log" >&2
            fatal "the previous release did not build"
        fi
        mkdir -p "$prev_dir"
        mv "$prev_dir.tmp/build/streaming-hub" "$PREV_BIN"
        rm -rf "$prev_dir.tmp"
        log "previous release built in $((SECONDS - t0)) s"
        echo "# previous release built in $((SECONDS - t0)) s"
    fi
    NEW_BIN=$HUB_BIN
    KEK=$(head -c 32 /dev/urandom | base64)
    HUB_ENV=(STREAMING_HUB_KEK="$KEK" STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
        STREAMING_HUB_AUTO_MIGRATE=false STREAMING_HUB_DISPATCH_WORKERS=32)
    pg_start
    kafka_start --topic "$TOPIC:4"
    sink_start
}

# prev_migrate: the previous release migrates the database (an empty one
# the first time; nothing to do once it is at that schema).
prev_migrate() {
    STREAMING_HUB_LOG_FORMAT=json "$PREV_BIN" migrate >>"$WORK/prev-migrate.log" 2>&1
}

# ---------------------------------------------------------------------------
# this tree's binary on the previous schema, without migrating: refused
# ---------------------------------------------------------------------------
scenario_this_tree_refuses_the_previous_schema_without_migrating() {
    local out rc
    prev_migrate
    assert_eq 0 "$?" "the previous release migrates an empty database"
    if [[ -z $new_migrations ]]; then
        pass "this tree adds no migration: nothing to refuse"
        return
    fi
    out=$(cd "$WORK" && env STREAMING_HUB_AUTO_MIGRATE=false STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:0 \
        STREAMING_HUB_POLICY_DIR="$WORK/policies" STREAMING_HUB_DATA_DIR="$WORK/hub" \
        timeout 30 "$NEW_BIN" serve 2>&1)
    rc=$?
    [[ $rc != 0 && $rc != 124 ]] && pass "this tree's hub refuses an older schema with AUTO_MIGRATE=false (exit $rc)" ||
        fail "this tree's hub started on the older schema (exit $rc)"
    assert_contains "$out" "database schema is not current" "... and says to run streaming-hub migrate"
}

# ---------------------------------------------------------------------------
# the upgrade: the previous release serving under load, this tree's
# migrations beside it, then the rolling restart
# ---------------------------------------------------------------------------
scenario_rolling_upgrade_under_load_loses_nothing() {
    local PREV_PID PREV_URL PREV_LOG KEY SUB before m v not_ready errors
    # 1. the previous release, migrated and serving under load
    prev_migrate
    assert_eq 0 "$?" "the previous release migrates the database"
    HUB_BIN=$PREV_BIN hub_start "${HUB_ENV[@]}"
    PREV_PID=$HUB_PID PREV_URL=$HUB_URL PREV_LOG=$HUB_LOG
    tenant_create acme
    KEY=$(tenant_key acme)
    [[ $KEY == shk_* ]] || fatal "no tenant API key"
    SUB=$(subscribe_active "$KEY" "$(subscription_json compat.tick "$SINK_URL/ok/compat")") ||
        fail "subscription not activated"
    produce_bg --topic "$TOPIC" --tenant acme --count "$EVENTS" --rate 500 --id-prefix cp- \
        --type studio.lerian.compat.tick
    wait_until 20 "(( \$(sink_count /ok/compat) >= 200 ))" &&
        pass "the previous release delivers under load" || fail "the previous release delivered nothing"

    # 3. this tree's migrations under the running previous release
    HUB_URL=$PREV_URL
    before=$(sink_count /ok/compat)
    "$NEW_BIN" migrate >"$WORK/new-migrate.log" 2>&1
    assert_eq 0 "$?" "this tree's migrate runs beside the previous release under load"
    for m in $new_migrations; do
        v=$(basename "$m" .sql)
        assert_eq 1 "$(psql_q "SELECT count(*) FROM schema_migrations WHERE version LIKE '$v%'")" "applied: $v"
    done
    not_ready=0
    for _ in $(seq 1 20); do
        [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$PREV_URL/readyz") == 200 ]] ||
            not_ready=$((not_ready + 1))
        sleep 0.2
    done
    assert_eq 0 "$not_ready" "the previous release stays ready after the migrations"
    wait_until 20 "(( \$(sink_count /ok/compat) >= $before + 500 ))" &&
        pass "the previous release goes on delivering on the new schema" ||
        fail "the previous release stopped delivering after the migrations ($(sink_count /ok/compat) delivered)"
    errors=$(grep '"level":"error"' "$PREV_LOG" | head -n 3)
    assert_eq "" "$errors" "the previous release logs no error on the new schema"

    # 4. the rolling restart: a new hub joins, the previous one stops
    hub_start "${HUB_ENV[@]}"
    kill -TERM "$PREV_PID"
    wait_until 30 "! kill -0 $PREV_PID 2>/dev/null" || fail "the previous release did not stop within 30 s"
    wait_until 5 "[[ -n \$(hub_exit_status $((HUB_START_N - 1))) ]]" >/dev/null
    assert_eq 0 "$(hub_exit_status $((HUB_START_N - 1)))" \
        "the previous release exits 0 on SIGTERM (its drain on the new schema)"
    wait "$PRODUCER_PID" || fail "the producer failed"

    # 5. nothing lost
    wait_until 60 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$SUB' AND state = 'succeeded'\") == $EVENTS ]]" ||
        fail "not every event was delivered: $(psql_q "SELECT state, count(*) FROM delivery_jobs WHERE subscription_id = '$SUB' GROUP BY 1")"
    assert_eq "$EVENTS" "$(psql_q "SELECT count(*) FROM event_inbox WHERE event_type = 'compat.tick'")" \
        "every event stored once"
    assert_eq "$EVENTS" "$(sink_header /ok/compat x-lerian-event-id | grep '^cp-' | sort -u | wc -l)" \
        "every event reached the sink"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE state = 'dead'")" "no job dead"
    errors=$(grep '"level":"error"' "$HUB_LOG" | head -n 3)
    assert_eq "" "$errors" "this tree's hub logs no error after the upgrade"
}

# ---------------------------------------------------------------------------
# side by side: previous and new dispatchers on one database, every attempt
# of every job visible whichever process made it
# ---------------------------------------------------------------------------
scenario_old_and_new_hubs_side_by_side_show_every_attempt() {
    local PREV_PID PREV_URL KEY OK FLAKY n_events=200 bad job url n want no_breaker
    # the hub the rolling upgrade left running is stopped: this scenario
    # starts its own pair (and the runner stops only the last hub started)
    hub_state_load
    hub_stop
    prev_migrate
    assert_eq 0 "$?" "the previous release migrates the database"
    "$NEW_BIN" migrate >>"$WORK/new-migrate.log" 2>&1
    assert_eq 0 "$?" "this tree's migrations run"
    # breakers that never open: the failing destination's jobs are retried
    # at once rather than shed for the open time
    no_breaker=(STREAMING_HUB_BREAKER_CONSECUTIVE_FAILURES=100000 STREAMING_HUB_BREAKER_MIN_ATTEMPTS=1000000)
    # the previous release (4 workers; this tree's hub has 32) cannot keep
    # up alone with 100 events/s to a destination answering in 50 ms, so
    # the backlog is there for both hubs' claims and each delivers some
    # (with the same workers against an instant destination, it had
    # sometimes claimed every job before this tree's hub's first claim)
    HUB_BIN=$PREV_BIN hub_start "${HUB_ENV[@]}" "${no_breaker[@]}" STREAMING_HUB_DISPATCH_WORKERS=4
    PREV_PID=$HUB_PID PREV_URL=$HUB_URL
    hub_start "${HUB_ENV[@]}" "${no_breaker[@]}" STREAMING_HUB_ROLE=delivery
    tenant_create side
    KEY=$(tenant_key side)
    [[ $KEY == shk_* ]] || fatal "no tenant API key"
    # one destination that answers 200 after 50 ms, one that answers 503 to its first
    # 40 requests (those jobs are retried within a second, by either hub)
    OK=$(subscribe_active "$KEY" "$(subscription_json side.ok "$SINK_URL/slow/50/side")") ||
        fail "subscription not activated"
    FLAKY=$(subscribe_active "$KEY" "$(subscription_json side.ok "$SINK_URL/flaky/40/side" \
        ',"retry_schedule":["1s","1s","1s","1s","1s","1s","1s","1s","1s","1s","1s","1s"]')") ||
        fail "subscription not activated"
    produce --topic "$TOPIC" --tenant side --count "$n_events" --rate 100 --id-prefix sd- \
        --type studio.lerian.side.ok >/dev/null || fail "produce failed"
    wait_until 60 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id IN ('$OK', '$FLAKY') AND state = 'succeeded'\") == $((2 * n_events)) ]]" ||
        fail "not every job succeeded: $(psql_q "SELECT state, count(*) FROM delivery_jobs WHERE subscription_id IN ('$OK', '$FLAKY') GROUP BY 1")"
    # both delivered (each counts its own outcomes)
    assert_ge "$(HUB_URL=$PREV_URL metric 'streaming_hub_deliveries_total{outcome="succeeded"}')" 1 \
        "the previous hub delivered"
    assert_ge "$(metric 'streaming_hub_deliveries_total{outcome="succeeded"}')" 1 "this tree's hub delivered"
    if [[ " $new_migrations " == *" migrations/0014_attempt_on_job.sql "* ]]; then
        # a previous release before 0014 records its successes as rows
        # (through the view), this tree's on their jobs
        assert_ge "$(psql_q "SELECT count(*) FROM delivery_attempt_rows a JOIN delivery_jobs j ON j.id = a.job_id
                              WHERE j.subscription_id IN ('$OK', '$FLAKY') AND a.status = 200")" 1 \
            "the previous hub's successes are rows"
        assert_ge "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id IN ('$OK', '$FLAKY')
                              AND success_delivery_id IS NOT NULL")" 1 \
            "this tree's successes are on their jobs"
    fi
    assert_ge "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$FLAKY' AND attempt_count > 1")" 1 \
        "jobs were retried"
    # every attempt visible: numbers 1..attempt_count, once each
    bad=$(psql_q "SELECT count(*) FROM delivery_jobs j
                   WHERE j.subscription_id IN ('$OK', '$FLAKY')
                     AND (SELECT count(*) || ':' || count(DISTINCT a.number) || ':' || coalesce(max(a.number), 0)
                            FROM delivery_attempts a WHERE a.job_id = j.id)
                         <> j.attempt_count || ':' || j.attempt_count || ':' || j.attempt_count")
    assert_eq 0 "$bad" "the delivery_attempts view shows each job's attempts 1..attempt_count once"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs j WHERE j.subscription_id IN ('$OK', '$FLAKY')
                            AND NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.job_id = j.id
                                              AND a.number = j.attempt_count AND a.status = 200)")" \
        "each job's last attempt is its success"
    # the API of either hub: a retried job and a first-attempt one
    for job in $(psql_q "(SELECT id FROM delivery_jobs WHERE subscription_id = '$FLAKY' ORDER BY attempt_count DESC, id LIMIT 2)
                         UNION ALL (SELECT id FROM delivery_jobs WHERE subscription_id = '$OK' ORDER BY id LIMIT 1)"); do
        want=$(psql_q "SELECT attempt_count FROM delivery_jobs WHERE id = $job")
        for url in "$PREV_URL" "$HUB_URL"; do
            n=$(curl -s -H "Authorization: Bearer $KEY" "$url/v1/deliveries/$job" | grep -o '"delivery_id"' | wc -l)
            assert_eq "$want" "$n" "GET /v1/deliveries/$job on the $([[ $url == "$PREV_URL" ]] && echo previous || echo new) hub lists its $want attempt(s)"
        done
    done
    kill -TERM "$PREV_PID"
    wait_until 30 "! kill -0 $PREV_PID 2>/dev/null" || fail "the previous release did not stop within 30 s"
    log "side by side: $(psql_q "SELECT count(*) || ' attempts, ' || count(*) FILTER (WHERE a.status = 200) || ' successes'
                                  FROM delivery_attempts a JOIN delivery_jobs j ON j.id = a.job_id
                                 WHERE j.subscription_id IN ('$OK', '$FLAKY')")"
}

scenarios_main "$@"
