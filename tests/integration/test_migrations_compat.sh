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
#   5. every event is stored once and delivered, none dead, none lost.
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

scenarios_main "$@"
