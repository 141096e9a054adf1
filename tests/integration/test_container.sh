#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The container image end to end (Containerfile, scripts/container, SPEC §13):
# built here (the Debian base images too when they are missing), then run
# with a read-only root file system against the test PostgreSQL, the mock
# Kafka cluster and the recording sink, all on the host network.
#
# Covers:
#   1. the image: the bytes it adds above its base (< 60 MB), numeric
#      non-root USER, STOPSIGNAL SIGTERM, EXPOSE 8080, `serve` as the command,
#      OCI labels, the container defaults, no compiler or headers inside.
#   2. scripts/container's smoke checks: `version` runs, the one-line errors
#      for a missing KAFKA_BROKERS and DSN, the mock cluster writing /tmp on
#      a read-only root, a clear error for a data dir on the read-only root.
#   3. `migrate` from the image, then `serve` with AUTO_MIGRATE=false as the
#      Deployments run it: start to ready (target < 5 s), root file system
#      read-only, uid 10001.
#   4. events from Kafka delivered to the sink, shaped by a policy mounted as
#      a ConfigMap volume; a ..data swap reloads it (deliveries after it carry
#      the new version); a broken swap keeps the good version and the log
#      names file and line.
#   5. SIGTERM under load (1,000 events/s, attempts in flight to a slow
#      sink): /readyz answers 503 at once, the drain finishes, the container
#      exits 0 well within SHUTDOWN_TIMEOUT; a second container then finds
#      every offset committed (no duplicate verdict: nothing read twice), and
#      at the end every event is stored once and delivered exactly once, with
#      no job reclaimed (no attempt was left without an outcome).
#   6. figures for docs/deploy.md: the hub's CPU and peak RSS in the
#      container under that load, printed as "# ..." lines.
#
# The image is built and the services started once (setup); the scenarios
# share the first container when they run in order (3 starts it, 4 and 5
# use it), and each starts its own when run alone.
#
# Skipped (exit 77) only when no container engine can run here at all.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"
# shellcheck source=tests/support/configmap.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/configmap.sh"
# shellcheck source=scripts/container
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/container"

IMAGE=streaming-hub:test
TOPIC=lerian.streaming.container
SHUTDOWN_TIMEOUT_S=20
LOAD_EVENTS=6000
LOAD_RATE=1000

now_ms() { date +%s%3N; }

# Containers are removed however the test ends (the lib's trap runs after);
# their names are kept in a file, as scenarios start them in subshells.
ctr_cleanup() {
    local c
    [[ -f $WORK/containers ]] || return 0
    while read -r c; do
        ctr rm -f "$c" >/dev/null 2>&1
    done <"$WORK/containers"
}

# stamp_src VERSION [BROKEN]: the policy the mounted directory holds.
stamp_src() {
    printf -- '-- stamp %s\nreturn {\n  shape = function(ev)\n    return nil, { ["X-Policy"] = "%s" }%s\n  end,\n}\n' \
        "$1" "$1" "${2:+ end}"
}

setup() {
    local t0
    if ! ctr_init; then
        echo "skipped: neither podman nor docker can run containers on this machine"
        exit 77
    fi
    log "container engine: ${CTR_CMD[*]}"
    # shellcheck disable=SC2154 # rc is assigned inside the trap
    trap 'rc=$?; ctr_cleanup; (exit $rc); hub_test_cleanup' EXIT
    t0=$(now_ms)
    ctr_build "$IMAGE" >"$WORK/build.log" 2>&1 || {
        tail -n 40 "$WORK/build.log" >&2
        fatal "the image did not build (log above)"
    }
    log "image built in $((($(now_ms) - t0) / 1000)) s"
    pass "the image builds from the Containerfile"
    pg_start
    kafka_start --topic "$TOPIC:4"
    sink_start
    KEK=$(head -c 32 /dev/urandom | base64)
    # The policy directory, mounted read-only like a ConfigMap volume.
    CM=$WORK/cm
    mkdir -p "$WORK/src"
    stamp_src v1 >"$WORK/src/v1"
    stamp_src v2 >"$WORK/src/v2"
    stamp_src v3 broken >"$WORK/src/v3"
    configmap_write "$CM" stamp.lua="$WORK/src/v1"
}

# ctr_hub_start: runs the image's `serve` as the Deployments do; sets CNAME,
# HUB_URL and HUB_LOG (the container's log, fetched by ctr_hub_logs), and
# READY_MS (from `run` to /readyz = 200); keeps them in $WORK/ctr.state
# for the scenarios after this one (ctr_hub_ensure).
ctr_hub_start() {
    local port t code n
    n=$(($(cat "$WORK/containers" 2>/dev/null | wc -l) + 1))
    CNAME=hub-ctest-$$-$n
    echo "$CNAME" >>"$WORK/containers"
    HUB_LOG=$WORK/hub.c$n.log
    port=$(random_port)
    t=$(now_ms)
    ctr run -d --name "$CNAME" --network=host --read-only --tmpfs /tmp:rw,size=64m,mode=1777 \
        -v "$CM:/etc/streaming-hub/policies:ro" \
        -e STREAMING_HUB_POSTGRES_DSN -e STREAMING_HUB_KAFKA_BROKERS \
        -e STREAMING_HUB_HTTP_LISTEN_ADDR=127.0.0.1:$port \
        -e STREAMING_HUB_ADMIN_TOKEN="$ADMIN_TOKEN" -e STREAMING_HUB_KEK="$KEK" \
        -e STREAMING_HUB_AUTO_MIGRATE=false -e STREAMING_HUB_ALLOW_PRIVATE_SINKS=true \
        -e STREAMING_HUB_KAFKA_SESSION_TIMEOUT=3s -e STREAMING_HUB_DISPATCH_WORKERS=64 \
        -e STREAMING_HUB_SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT_S}s \
        "$IMAGE" >/dev/null || fatal "the container did not start"
    HUB_URL=http://127.0.0.1:$port
    while (($(now_ms) - t < 30000)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$HUB_URL/readyz")
        [[ $code == 200 ]] && break
        if [[ $(ctr inspect --format '{{.State.Running}}' "$CNAME") != true ]]; then
            ctr_hub_logs
            fatal "the container exited during start-up"
        fi
        sleep 0.05
    done
    READY_MS=$(($(now_ms) - t))
    [[ $code == 200 ]] || {
        ctr_hub_logs
        fatal "the container was not ready within 30 s"
    }
    printf 'CNAME=%q\nHUB_URL=%q\nHUB_LOG=%q\n' "$CNAME" "$HUB_URL" "$HUB_LOG" >"$WORK/ctr.state"
    log "container $CNAME ready at $HUB_URL in $READY_MS ms"
}

ctr_hub_logs() {
    ctr logs "$CNAME" >"$HUB_LOG" 2>&1
}

# ctr_migrate: `migrate` from the image (the migration Job's command).
ctr_migrate() {
    ctr_run -e STREAMING_HUB_POSTGRES_DSN "$IMAGE" migrate >>"$WORK/migrate.log" 2>&1
}

# ctr_hub_ensure: the container an earlier scenario left running, or a new
# one (migrating first).
ctr_hub_ensure() {
    if [[ -f $WORK/ctr.state ]]; then
        # shellcheck source=/dev/null
        source "$WORK/ctr.state"
        if [[ $(ctr inspect --format '{{.State.Running}}' "$CNAME" 2>/dev/null) == true ]]; then
            return 0
        fi
    fi
    ctr_migrate || fatal "migrate from the image failed"
    ctr_hub_start
}

# ---------------------------------------------------------------------------
# 1. the image
# ---------------------------------------------------------------------------
cfg() { ctr image inspect --format "{{$1}}" "$IMAGE"; }

scenario_image_is_small_non_root_and_labelled() {
    local layer user l v envs e out
    layer=$(ctr_layer_bytes "$IMAGE")
    echo "# image layers above debian:bookworm-slim: $layer bytes"
    assert_le "$layer" 60000000 "the image adds under 60 MB above its base"
    user=$(cfg .Config.User)
    [[ $user =~ ^[0-9]+(:[0-9]+)?$ && ${user%%:*} != 0 ]] && pass "USER is numeric and not root ($user)" ||
        fail "USER is '$user'"
    assert_eq SIGTERM "$(cfg .Config.StopSignal)" "STOPSIGNAL SIGTERM"
    assert_contains "$(cfg .Config.ExposedPorts)" "8080/tcp" "EXPOSE 8080"
    assert_eq "[serve]" "$(cfg .Config.Cmd)" "the default command is serve"
    for l in version source licenses revision; do
        v=$(ctr image inspect --format "{{index .Config.Labels \"org.opencontainers.image.$l\"}}" "$IMAGE")
        [[ -n $v && $v != "<no value>" ]] && pass "label org.opencontainers.image.$l=$v" ||
            fail "no label org.opencontainers.image.$l"
    done
    envs=$(ctr image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE")
    for e in STREAMING_HUB_HTTP_LISTEN_ADDR=0.0.0.0:8080 STREAMING_HUB_DATA_DIR=/tmp/streaming-hub \
        STREAMING_HUB_POLICY_DIR=/etc/streaming-hub/policies STREAMING_HUB_KAFKA_BROKERS=; do
        grep -qxF "$e" <<<"$envs" && pass "image default $e" || fail "image default $e missing: $envs"
    done
    out=$(ctr_run --entrypoint /bin/sh "$IMAGE" -c \
        'for t in cc gcc clang ld make cmake; do command -v $t; done; ls /usr/include/uv.h /usr/include/libpq-fe.h 2>/dev/null; true')
    assert_eq "" "$out" "no compiler, build tool or header in the image"
}

# ---------------------------------------------------------------------------
# 2. the smoke checks of scripts/container
# ---------------------------------------------------------------------------
scenario_smoke_checks_pass() {
    if ctr_smoke "$IMAGE" 2>"$WORK/smoke.log"; then
        pass "scripts/container smoke: $(grep -c ': ok:' "$WORK/smoke.log") checks"
    else
        cat "$WORK/smoke.log" >&2
        fail "scripts/container smoke failed: $(grep FAILED "$WORK/smoke.log" | tr '\n' ' ')"
    fi
}

# ---------------------------------------------------------------------------
# 3. migrate, then serve
# ---------------------------------------------------------------------------
scenario_migrate_then_serve_read_only() {
    ctr_migrate
    assert_eq 0 "$?" "\`migrate\` from the image (the migration Job's command) exits 0"
    assert_eq t "$(psql_q "SELECT count(*) > 0 FROM schema_migrations")" "the migrations are applied"
    ctr_hub_start
    echo "# container start to ready: $READY_MS ms"
    assert_le "$READY_MS" 5000 "container start to ready under 5 s (migrated database, mock cluster)"
    assert_eq 10001 "$(ctr exec "$CNAME" id -u)" "the hub runs as uid 10001"
    ctr exec "$CNAME" sh -c 'touch /etc/x' 2>/dev/null && fail "the root file system is writable" ||
        pass "the root file system is read-only"
    assert_eq 200 "$(curl -s -o /dev/null -w '%{http_code}' "$HUB_URL/healthz")" "/healthz"
    assert_contains "$(curl -s "$HUB_URL/metrics")" "streaming_hub_ingest_records_total" "/metrics"
}

# ---------------------------------------------------------------------------
# 4. deliveries shaped by a policy from the mounted directory; reloads
# ---------------------------------------------------------------------------
scenario_deliveries_shaped_by_the_mounted_policy_and_reloaded() {
    local tenant key pol_sub hash_v2
    ctr_hub_ensure
    tenant=$(own_tenant)
    key=$(tenant_key "$tenant")
    [[ $key == shk_* ]] || fatal "no tenant API key"
    pol_sub=$(subscribe_active "$key" "$(subscription_json policy.tick "$SINK_URL/ok/pol" ',"policy":"stamp"')") ||
        fail "policy.tick subscription not activated"

    produce --topic "$TOPIC" --tenant "$tenant" --count 20 --id-prefix p1- --type studio.lerian.policy.tick ||
        fail "produce policy.tick failed"
    sink_wait 20 /ok/pol 30 && pass "20 events delivered end to end through the container" ||
        fail "only $(sink_count /ok/pol) of 20 policy.tick events delivered"
    assert_eq "20 v1" "$(sink_header /ok/pol x-policy | sort | uniq -c | awk '{print $1, $2}')" \
        "every delivery was shaped by the mounted policy (v1)"

    CONFIGMAP_SERIAL=100 # past setup's (it ran in the main shell, before this subshell)
    configmap_write "$CM" stamp.lua="$WORK/src/v2"
    hash_v2=$(sha256sum <"$WORK/src/v2" | cut -d' ' -f1)
    wait_until 5 "[[ \$(admin_curl GET /admin/policies | jq -r '.policies[] | select(.name == \"stamp\") | .hash') == $hash_v2 ]]" &&
        pass "a ..data swap in the mounted directory reloads the policy" ||
        fail "the policy was not reloaded within 5 s of the swap"
    produce --topic "$TOPIC" --tenant "$tenant" --count 20 --id-prefix p2- --type studio.lerian.policy.tick ||
        fail "produce policy.tick failed"
    sink_wait 40 /ok/pol 30 || fail "only $(sink_count /ok/pol) of 40 policy.tick events delivered"
    assert_eq "20 v1,20 v2" "$(sink_header /ok/pol x-policy | sort | uniq -c | awk '{print $1, $2}' | paste -sd,)" \
        "the deliveries after the swap carry the new version (v2)"
    assert_eq 40 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$pol_sub' AND state = 'succeeded'")" \
        "every policy.tick job succeeded"

    configmap_write "$CM" stamp.lua="$WORK/src/v3"
    sleep 1.5
    assert_eq "$hash_v2" "$(admin_curl GET /admin/policies | jq -r '.policies[] | select(.name == "stamp") | .hash')" \
        "a broken ConfigMap update keeps the last good version"
    ctr_hub_logs
    grep -F '"msg":"policy failed to load; its previous version stays"' "$HUB_LOG" | grep -qF 'stamp.lua:5:' &&
        pass "the container's log names the broken file and line (stamp.lua:5)" ||
        fail "no log line naming stamp.lua:5"
}

# ---------------------------------------------------------------------------
# 5. SIGTERM under load (6. the figures for docs/deploy.md)
# ---------------------------------------------------------------------------
scenario_sigterm_under_load_drains_and_commits() {
    local tenant key load_sub PID CLK c0 c1 t0 t1 rss cpu inflight stored peak t_term first503 code t_exit m
    ctr_hub_ensure
    tenant=$(own_tenant)
    key=$(tenant_key "$tenant")
    [[ $key == shk_* ]] || fatal "no tenant API key"
    load_sub=$(subscribe_active "$key" "$(subscription_json load.tick "$SINK_URL/slow/40/load")") ||
        fail "load.tick subscription not activated"
    PID=$(ctr inspect --format '{{.State.Pid}}' "$CNAME")
    ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
    CLK=$(getconf CLK_TCK)
    produce_bg --topic "$TOPIC" --tenant "$tenant" --count "$LOAD_EVENTS" --rate "$LOAD_RATE" \
        --id-prefix ld- --type studio.lerian.load.tick
    sleep 1
    c0=$(ticks)
    t0=$(now_ms)
    sleep 2.5
    c1=$(ticks)
    t1=$(now_ms)
    rss=$(awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$PID/status")
    cpu=$(awk -v c=$((c1 - c0)) -v k="$CLK" -v ms=$((t1 - t0)) 'BEGIN { printf "%.0f", 100 * c / k / (ms / 1000) }')
    inflight=$(psql_q "SELECT count(*) FROM delivery_jobs WHERE state = 'in_flight'")
    stored=$(psql_q "SELECT count(*) FROM event_inbox WHERE event_type = 'load.tick'")
    log "under load: $stored stored, $inflight in flight, hub CPU $cpu%, RSS $rss MiB"
    assert_ge "$inflight" 1 "deliveries are in flight when SIGTERM comes"

    peak=$(awk '/^VmHWM/ {print int($2 / 1024)}' "/proc/$PID/status")
    t_term=$(now_ms)
    ctr kill --signal TERM "$CNAME" >/dev/null
    first503=
    while (($(now_ms) - t_term < 5000)); do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$HUB_URL/readyz")
        if [[ $code == 503 ]]; then
            first503=$(($(now_ms) - t_term))
            break
        fi
        [[ $code == 000 ]] && break # already gone
    done
    echo "# /readyz 503 after SIGTERM: ${first503:-never} ms"
    [[ -n $first503 ]] && assert_le "$first503" 500 "/readyz answers 503 at once after SIGTERM" ||
        fail "/readyz never answered 503 after SIGTERM (last status $code)"
    code=$(timeout $((SHUTDOWN_TIMEOUT_S + 10)) "${CTR_CMD[@]}" wait "$CNAME" 2>/dev/null)
    t_exit=$(($(now_ms) - t_term))
    echo "# SIGTERM to exit under load: $t_exit ms (SHUTDOWN_TIMEOUT ${SHUTDOWN_TIMEOUT_S}s)"
    assert_eq 0 "$code" "the container exits 0 after SIGTERM under load"
    assert_le "$t_exit" $((SHUTDOWN_TIMEOUT_S * 1000 / 2)) "it exits well within SHUTDOWN_TIMEOUT (half of it)"
    ctr_hub_logs
    for m in draining "ingest drained" "dispatcher drained" stopped; do
        grep -qF "\"msg\":\"$m\"" "$HUB_LOG" && pass "log: $m" || fail "no \"$m\" in the container's log"
    done
    grep -qF 'drain deadline passed' "$HUB_LOG" && fail "the drain deadline was reached"
    echo "# hub in the container at $LOAD_RATE events/s in (and their deliveries): CPU ${cpu}% of a core, RSS ${rss} MiB (peak ${peak} MiB)"

    wait "$PRODUCER_PID" || fail "the producer failed: $(tail -n 3 "$PRODUCER_LOG")"

    # A second container takes over: it must find every offset committed.
    ctr_hub_start
    wait_until 60 "[[ \$(psql_q \"SELECT count(*) FROM delivery_jobs WHERE subscription_id = '$load_sub' AND state = 'succeeded'\") == $LOAD_EVENTS ]]" ||
        fail "not every load event was delivered: $(psql_q "SELECT state, count(*) FROM delivery_jobs WHERE subscription_id = '$load_sub' GROUP BY 1")"
    assert_eq 0 "$(metric 'streaming_hub_ingest_records_total{verdict="duplicate",reason=""}')" \
        "the second container read no record twice (the first committed its offsets)"
    assert_eq "$LOAD_EVENTS" "$(psql_q "SELECT count(*) FROM event_inbox WHERE event_type = 'load.tick'")" \
        "every load event stored once"
    # (the subscription's verification probe went to the same path: not an event)
    load_ids() { sink_header /slow/40/load x-lerian-event-id | grep '^ld-'; }
    assert_eq "$LOAD_EVENTS" "$(load_ids | sort -u | wc -l)" "every load event reached the sink"
    assert_eq 0 "$(load_ids | sort | uniq -d | wc -l)" "no load event was delivered twice"
    assert_eq 0 "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE reclaims > 0")" \
        "no job was reclaimed (every attempt in flight got its outcome)"
    ctr kill --signal TERM "$CNAME" >/dev/null
    assert_eq 0 "$(timeout 40 "${CTR_CMD[@]}" wait "$CNAME" 2>/dev/null)" "the second container exits 0 on SIGTERM"
    ctr_hub_logs
}

scenarios_main "$@"
