#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# Several `serve` processes on one consumer group and one database (SPEC §3.3,
# §7, §7.1, §9): the deployment an operator scales out.
#
# Three processes share the Kafka group, the PostgreSQL database and the KEK:
# A and B with STREAMING_HUB_ROLE=all (they consume, store, match and
# deliver), C with role delivery (it only delivers; every role serves the
# API).  Two tenants, one verified subscription each at the sink's /echo; two
# producers stream 6,000 events each over 8 partitions while four pull
# consumers follow `next_cursor` through different processes.  6 s into the
# 24 s stream, A is killed with SIGKILL while it holds partitions and leases.
#
# Then: every event stored once and delivered (the sink counts requests per
# ce-id), at most 1.1 requests per event; B holds all 8 partitions, A's
# partitions store again and A's leased jobs are delivered by the survivors,
# each within TAKEOVER_MAX_S of the kill; each pull consumer saw exactly the
# tenant's stored sequences, once each, in order.
#
# Then A comes back, and a tenant's ingest quota holds over the three
# processes together (the cluster-wide limits, README "Limits across
# processes"), its neighbour untouched.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"
# shellcheck source=tests/support/delivery.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/delivery.sh"

TOPIC=lerian.streaming.multi
PARTITIONS=8
N_PER_TENANT=6000
# The kill leaves A's group membership to the session timeout (3 s, set by
# hub_start) and its leases to DISPATCH_LEASE (3 s, below, reclaimed every
# second); 10 s is that plus a rebalance, a replay of the uncommitted
# records and slack for a loaded two-core machine.
TAKEOVER_MAX_S=10

setup() {
    pg_start
    kafka_start --topic "$TOPIC:$PARTITIONS"
    sink_start
    # one configuration for the three processes (one KEK: any of them opens
    # the secrets another stored); the pull rate is out of the way of four
    # followers polling a few times a second
    # shellcheck disable=SC2054 # the retry schedule's commas are its own
    MP_ENV=(STREAMING_HUB_KEK="$(head -c 32 /dev/urandom | base64)"
        STREAMING_HUB_ALLOW_PRIVATE_SINKS=true
        STREAMING_HUB_DISPATCH_LEASE=3s STREAMING_HUB_DISPATCH_WORKERS=16
        STREAMING_HUB_DISPATCH_CLAIM_BATCH=64 STREAMING_HUB_RETRY_SCHEDULE=200ms,500ms,1s
        STREAMING_HUB_DELIVERY_TIMEOUT=5s STREAMING_HUB_SHUTDOWN_TIMEOUT=5s
        STREAMING_HUB_PULL_RATE=1000 STREAMING_HUB_PULL_BURST=1000)
    mp_start A all
    mp_start B all
    mp_start C delivery
}

# ---------------------------------------------------------------------------
# The processes.  lib.sh follows one "current" hub; these helpers keep each
# process's start number and URL in $WORK/mp/NAME.* so any shell (a
# scenario's subshell, the main one) finds them.
# ---------------------------------------------------------------------------

# mp_start NAME ROLE: starts process NAME (A, B, C) with role ROLE and the
# shared configuration, waits for /readyz (hub_start).
mp_start() {
    local name=$1 role=$2
    hub_start STREAMING_HUB_ROLE="$role" "${MP_ENV[@]}"
    # hub_test_cleanup kills only the current hub: the others are tracked
    track_pid "$HUB_PID"
    track_pid "$HUB_WRAPPER_PID"
    mkdir -p "$WORK/mp"
    echo "$HUB_START_N" >"$WORK/mp/$name.n"
    echo "$HUB_URL" >"$WORK/mp/$name.url"
    log "process $name (role $role) is hub #$HUB_START_N, pid $HUB_PID"
}

mp_url() { cat "$WORK/mp/$1.url"; }
mp_pid() { cat "$WORK/hub.$(cat "$WORK/mp/$1.n").pid"; }
mp_rc() { cat "$WORK/hub.$(cat "$WORK/mp/$1.n").rc" 2>/dev/null; }
mp_alive() { [[ -z $(mp_rc "$1") ]] && kill -0 "$(mp_pid "$1")" 2>/dev/null; }

# mp_metric NAME 'SERIES': the series' value on process NAME's /metrics.
mp_metric() {
    HUB_URL=$(mp_url "$1") metric "$2"
}

# mp_stop NAME: SIGTERM; the process must end with status 0 within 30 s.
mp_stop() {
    local pid
    pid=$(mp_pid "$1")
    kill -TERM "$pid" 2>/dev/null
    if ! wait_until 30 "[[ -n \$(mp_rc $1) ]]"; then
        fail "process $1 still running 30 s after SIGTERM"
        kill -9 "$pid" 2>/dev/null
        return
    fi
    assert_eq 0 "$(mp_rc "$1")" "process $1 exited cleanly after SIGTERM"
}

# ---------------------------------------------------------------------------
# Pull consumers
# ---------------------------------------------------------------------------

# pull_follow OUT KEY URL...: a consumer of KEY's tenant following
# `next_cursor` (then its last item's sequence once a page is not full),
# from the first URL, going on with the next one when a process does not
# answer.  Appends every item's sequence to OUT, one a line, in the order
# received.  Ends after an empty page read once $WORK/mp/pull.stop exists,
# or after 150 s.  Polls of a partial page are 100 ms apart.
pull_follow() {
    local out=$1 key=$2 after=0 i=0 code body seqs cursor last stop=0 deadline=$((SECONDS + 150))
    shift 2
    local urls=("$@") tmp=$out.page
    : >"$out"
    while ((SECONDS < deadline)); do
        [[ -e $WORK/mp/pull.stop ]] && stop=1
        code=$(curl -s --max-time 10 -o "$tmp" -w '%{http_code}' \
            -H "Authorization: Bearer $key" "${urls[i]}/v1/events?after=$after&limit=500")
        if [[ $code != 200 ]]; then
            # a process gone (000) moves the consumer on, a 429 or 503 waits
            [[ $code == 000 ]] && i=$(((i + 1) % ${#urls[@]})) &&
                echo "failover to ${urls[i]} after $after" >>"$out.log"
            sleep 0.1
            continue
        fi
        body=$(<"$tmp")
        # the cursor is `sequence` today, `hubsequence` once producers'
        # own `sequence` extension is kept beside it
        if [[ $body == *'"hubsequence":'* ]]; then
            seqs=$(grep -oE '"hubsequence":[0-9]+' <<<"$body" | cut -d: -f2)
        else
            seqs=$(grep -oE '"sequence":[0-9]+' <<<"$body" | cut -d: -f2)
        fi
        if [[ -z $seqs ]]; then
            ((stop)) && break
            sleep 0.1
            continue
        fi
        printf '%s\n' "$seqs" >>"$out"
        # one line a page, for a failure's post-mortem
        echo "$(date +%T.%3N) ${urls[i]} after=$after $(wc -l <<<"$seqs") $(head -n1 <<<"$seqs")..$(tail -n1 <<<"$seqs")" >>"$out.log"
        cursor=$(grep -oE '"next_cursor":"?[0-9]+' <<<"$body" | grep -oE '[0-9]+$')
        last=$(tail -n1 <<<"$seqs")
        after=${cursor:-$last}
        [[ -n $cursor ]] || sleep 0.1
    done
    rm -f "$tmp"
}

# pull_check OUT TENANT WHO: the sequences OUT received are exactly the
# tenant's stored ones, each once, in order.
pull_check() {
    local out=$1 tenant=$2 who=$3 got want missing dups unordered
    psql_q "SELECT seq FROM event_inbox WHERE tenant_id = '$tenant' ORDER BY seq" >"$out.want"
    got=$(wc -l <"$out")
    want=$(wc -l <"$out.want")
    missing=$(LC_ALL=C comm -23 <(sort "$out.want") <(sort -u "$out") | wc -l)
    dups=$((got - $(sort -u "$out" | wc -l)))
    unordered=$(awk 'NR > 1 && $1 <= prev { n++ } { prev = $1 } END { print n + 0 }' "$out")
    if cmp -s "$out" "$out.want"; then
        pass "$who saw all $want stored events of $tenant once each, in order"
    else
        fail "$who: $got received for $want stored: $missing missing ($(LC_ALL=C comm -23 \
            <(sort "$out.want") <(sort -u "$out") | head -n 3 | tr '\n' ' ')), $dups twice, $unordered out of order"
    fi
}

# ---------------------------------------------------------------------------

scenario_three_processes_one_sigkilled_deliver_every_event() {
    local ta tb ka kb sa sb sub_a sub_b pa pb pid_a parts_a kill_ms orphans orphan_ids
    local followers t t_start n_total i requests ids dups missing ratio ingest_ms lease_ms assigned_ms
    ta=$(own_id a)
    tb=$(own_id b)
    ka=$(own_tenant_key a)
    kb=$(own_tenant_key b)
    HUB_URL=$(mp_url C) # the API on the delivery-only process
    sa=$(subscription_create "$ka" "$(subscription_json transaction.posted "$SINK_URL/echo/$ta/")")
    sb=$(subscription_create "$kb" "$(subscription_json transaction.posted "$SINK_URL/echo/$tb/")")
    sub_a=$(json_field id "$sa")
    sub_b=$(json_field id "$sb")
    [[ -n $sub_a && -n $sub_b ]] || fatal "subscriptions not created: $sa $sb"
    if ! subscription_wait_verified "$sub_a" || ! subscription_wait_verified "$sub_b"; then
        fatal "the probes did not verify the /echo destinations"
    fi
    pass "two tenants, one verified subscription each"

    # four consumers: per tenant one through A then B (it fails over when A
    # dies), one through C
    pull_follow "$WORK/mp/pull.a1" "$ka" "$(mp_url A)" "$(mp_url B)" &
    followers=($!)
    pull_follow "$WORK/mp/pull.a2" "$ka" "$(mp_url C)" &
    followers+=($!)
    pull_follow "$WORK/mp/pull.b1" "$kb" "$(mp_url A)" "$(mp_url B)" &
    followers+=($!)
    pull_follow "$WORK/mp/pull.b2" "$kb" "$(mp_url C)" &
    followers+=($!)
    for i in "${followers[@]}"; do
        track_pid "$i"
    done

    # 2 x 6,000 events, record i on partition i % 8, 250/s each (24 s)
    produce_bg --topic "$TOPIC" --tenant "$ta" --count "$N_PER_TENANT" --payload-bytes 64 \
        --rate 250 --partitions "$PARTITIONS" --id-prefix a- --type studio.lerian.transaction.posted
    pa=$PRODUCER_PID
    produce_bg --topic "$TOPIC" --tenant "$tb" --count "$N_PER_TENANT" --payload-bytes 64 \
        --rate 250 --partitions "$PARTITIONS" --id-prefix b- --type studio.lerian.transaction.posted
    pb=$PRODUCER_PID
    n_total=$((2 * N_PER_TENANT))

    t_start=$SECONDS
    # the kill comes a quarter of the way in (6 s): the producers go on
    # for 18 s more, past any takeover the bound below accepts
    wait_until 40 "(( \$(inbox_count) >= $n_total / 5 && \$(sink_count /echo/) >= $n_total / 6 ))" ||
        fail "no progress before the kill: $(inbox_count) stored, $(sink_count /echo/) delivered"
    sleep $((t_start + 6 - SECONDS > 0 ? t_start + 6 - SECONDS : 0))
    pid_a=$(mp_pid A)
    parts_a=$(mp_metric A streaming_hub_kafka_partitions_assigned)
    assert_ge "$parts_a" 1 "A holds partitions before the kill ($parts_a)"
    # Stop A, and kill it while it holds leases of jobs in flight (it cannot
    # finish them while stopped), so the kill leaves both partitions and
    # leases behind; without a lease, let it run a moment and look again.
    for i in $(seq 1 50); do
        kill -STOP "$pid_a"
        orphan_ids=$(psql_q "SELECT string_agg(id::text, ',') FROM delivery_jobs
                              WHERE state = 'in_flight' AND lease_owner LIKE '%/$pid_a/%'")
        [[ -n $orphan_ids ]] && break
        kill -CONT "$pid_a"
        sleep 0.1
    done
    kill -9 "$pid_a"
    kill_ms=$(date +%s%3N)
    log "A killed $((SECONDS - t_start)) s into the stream, after $i look(s) at its leases"
    kill -CONT "$pid_a" 2>/dev/null
    wait_until 10 "[[ -n \$(mp_rc A) ]]" || fail "A did not die"
    orphan_ids=${orphan_ids:-0}
    orphans=$(psql_q "SELECT count(*) FROM delivery_jobs WHERE id IN ($orphan_ids)")
    log "at the kill: $(inbox_count) stored, $(sink_count /echo/) delivered; $orphans jobs leased by A"
    assert_ge "$orphans" 1 "A died holding leases of jobs in flight ($orphans)"

    # partitions: B alone in the group takes all of them
    if wait_until 30 "(( \$(mp_metric B streaming_hub_kafka_partitions_assigned) == $PARTITIONS ))"; then
        assigned_ms=$(($(date +%s%3N) - kill_ms))
        pass "B holds all $PARTITIONS partitions $assigned_ms ms after the kill"
        assert_le "$assigned_ms" $((TAKEOVER_MAX_S * 1000)) "partitions taken over within $TAKEOVER_MAX_S s"
    else
        fail "B holds $(mp_metric B streaming_hub_kafka_partitions_assigned) partitions 30 s after the kill"
    fi

    wait "$pa"
    assert_eq 0 "$?" "$ta's producer had every record acknowledged"
    wait "$pb"
    assert_eq 0 "$?" "$tb's producer had every record acknowledged"
    wait_until 60 "(( \$(inbox_count) >= $n_total ))" ||
        fail "only $(inbox_count) of $n_total events stored within 60 s"
    t=$((SECONDS + 60))
    if ! wait_jobs "$sub_a" succeeded "$N_PER_TENANT" 60 ||
        ! wait_jobs "$sub_b" succeeded "$N_PER_TENANT" $((t - SECONDS)); then
        fail "not every job succeeded: $ta $(job_states "$sub_a"); $tb $(job_states "$sub_b")"
    fi
    touch "$WORK/mp/pull.stop"

    assert_eq "$n_total" "$(inbox_count)" "$n_total events stored"
    assert_eq "$n_total" "$(psql_q "SELECT count(DISTINCT (tenant_id, event_id)) FROM event_inbox")" \
        "each stored once"
    assert_eq "$n_total" "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE state = 'succeeded'
                                       AND subscription_id IN ('$sub_a', '$sub_b')")" \
        "one succeeded job per event"

    # Every partition stored again after the kill: the first row of each
    # after it, the latest of those is when the last of A's partitions came
    # back (the producers were still sending to all of them).
    ingest_ms=$(psql_q "SELECT count(*) || ' ' || round(extract(epoch FROM max(f)) * 1000 - $kill_ms)
                          FROM (SELECT kafka_partition, min(received_at) f FROM event_inbox
                                 WHERE received_at > to_timestamp($kill_ms / 1000.0)
                                 GROUP BY kafka_partition) x")
    assert_eq "$PARTITIONS" "${ingest_ms% *}" "every partition stored events after the kill"
    ingest_ms=${ingest_ms#* }
    # A's partitions cannot move before its session times out: a figure
    # below 1 s would mean A held none, and nothing was taken over
    assert_ge "$ingest_ms" 1000 "A's partitions were idle until taken over ($ingest_ms ms)"
    assert_le "$ingest_ms" $((TAKEOVER_MAX_S * 1000)) \
        "A's partitions store again within $TAKEOVER_MAX_S s of the kill ($ingest_ms ms)"

    # leases: A's jobs were reclaimed and delivered by a survivor
    assert_eq "$orphans" "$(psql_q "SELECT count(*) FROM delivery_jobs WHERE id IN ($orphan_ids)
                                     AND state = 'succeeded' AND reclaims >= 1")" \
        "A's $orphans leased jobs were reclaimed and succeeded"
    lease_ms=$(psql_q "SELECT round(extract(epoch FROM max(updated_at)) * 1000 - $kill_ms)
                         FROM delivery_jobs WHERE id IN ($orphan_ids)")
    assert_le "$lease_ms" $((TAKEOVER_MAX_S * 1000)) \
        "A's leased jobs delivered within $TAKEOVER_MAX_S s of the kill ($lease_ms ms)"

    # the sink: every ce-id at least once, at most 1.1 requests per event
    {
        seq 0 $((N_PER_TENANT - 1)) | sed 's/^/a-/'
        seq 0 $((N_PER_TENANT - 1)) | sed 's/^/b-/'
    } | LC_ALL=C sort >"$WORK/mp/expected.ids"
    # (the probes' challenges carry no event id of the producers')
    sink_header /echo/ x-lerian-event-id | grep -E '^[ab]-[0-9]+$' >"$WORK/mp/received.all"
    requests=$(wc -l <"$WORK/mp/received.all")
    LC_ALL=C sort -u "$WORK/mp/received.all" >"$WORK/mp/received.ids"
    ids=$(wc -l <"$WORK/mp/received.ids")
    dups=$((requests - ids))
    missing=$(LC_ALL=C comm -23 "$WORK/mp/expected.ids" "$WORK/mp/received.ids" | wc -l)
    assert_eq 0 "$missing" "every event reached the sink ($missing missing)"
    assert_eq "$n_total" "$ids" "no ce-id the producers did not send"
    ratio=$(awk -v r="$requests" -v n="$n_total" 'BEGIN { printf "%.4f", r / n }')
    assert_le "$ratio" 1.1 "$requests requests for $n_total events: $ratio per event, $dups duplicates"
    assert_eq 0 "$(sink_header "/echo/$ta/" x-lerian-event-id | grep -E '^[ab]-' | grep -vc '^a-')" \
        "$ta's subscription got only $ta's events"

    # each survivor delivered (C has no consumer: deliveries are shared by
    # the claims, not by the partitions)
    for i in B C; do
        assert_ge "$(mp_metric "$i" 'streaming_hub_deliveries_total{outcome="succeeded"}')" 1 \
            "process $i delivered"
    done
    assert_eq 0 "$(mp_metric C streaming_hub_kafka_partitions_assigned)" "the delivery process consumes nothing"

    wait "${followers[@]}" # they end on the stop file
    pull_check "$WORK/mp/pull.a1" "$ta" "$ta's consumer through A then B"
    pull_check "$WORK/mp/pull.a2" "$ta" "$ta's consumer through C"
    pull_check "$WORK/mp/pull.b1" "$tb" "$tb's consumer through A then B"
    pull_check "$WORK/mp/pull.b2" "$tb" "$tb's consumer through C"
    assert_ge "$(cat "$WORK"/mp/pull.?1.log 2>/dev/null | grep -c failover)" 2 \
        "the consumers through A went on through B"

    log "figures: events $n_total, requests $requests ($ratio per event, $dups duplicates)," \
        "A's leases $orphans, partitions to B ${assigned_ms:-?} ms, A's partitions storing again" \
        "$ingest_ms ms, A's leased jobs delivered $lease_ms ms after the kill"
}

# mp_count_all N: each of the three processes counts N live processes
# (streaming_hub_cluster_processes: the split of the cluster-wide limits).
mp_count_all() {
    local p
    for p in A B C; do
        [[ $(mp_metric "$p" streaming_hub_cluster_processes) == "$1" ]] || return 1
    done
}

# round_robin FILE N KEY PREFIX: a curl config (round_robin_config) of N
# POST /v1/events of KEY's tenant spread over A, B and C in turn.
round_robin() {
    round_robin_config "$1" "$2" POST /v1/events "$3" "$4" "$(mp_url A)" "$(mp_url B)" "$(mp_url C)"
}

# After the crash A comes back: the cluster-wide ingest quota (quotas.
# ingest_rate, split by the live processes) holds over the three again once
# A's dead row aged out and the new A joined.  60 events/s round-robin for
# 5 s against 20/s with a burst of 10: the tenant gets 20/s over the run's
# measured length, within 10%, plus one burst; a neighbour with the same
# quota at 6/s is never refused.
scenario_ingest_quota_holds_across_the_processes_after_the_crash() {
    local rate=20 burst=10 secs=5 t other other_pid ok limited t0 ms want
    own_client
    other=$(own_tenant_key other)
    mp_alive A || mp_start A all
    HUB_URL=$(mp_url B)
    for t in "$TENANT" "$(own_id other)"; do
        admin_curl PATCH "/admin/tenants/$t" "{\"quotas\":{\"ingest_rate\":$rate,\"ingest_burst\":$burst}}" >/dev/null
        assert_eq 200 "$(http_status)" "$t's quota: $rate events/s, burst $burst"
    done
    wait_until 15 "mp_count_all 3" ||
        fail "not every process counts 3: $(for p in A B C; do mp_metric "$p" streaming_hub_cluster_processes; done | paste -sd ' ')"
    round_robin "$WORK/mp/quota.cfg" $((60 * secs)) "$KEY" q-
    round_robin "$WORK/mp/other.cfg" $((6 * secs)) "$other" o-
    curl -s --rate 6/s -K "$WORK/mp/other.cfg" >"$WORK/mp/other.codes" 2>/dev/null &
    other_pid=$!
    t0=$(date +%s%3N)
    curl -s --rate 60/s -K "$WORK/mp/quota.cfg" >"$WORK/mp/quota.codes" 2>/dev/null
    ms=$(($(date +%s%3N) - t0))
    wait "$other_pid"
    ok=$(grep -c '^202$' "$WORK/mp/quota.codes")
    limited=$(grep -c '^429$' "$WORK/mp/quota.codes")
    assert_eq $((60 * secs)) $((ok + limited)) "every event answered 202 or 429"
    # the buckets refill for as long as the run lasts: the rate is owed
    # over the measured time, not the nominal one
    want=$((rate * ms / 1000))
    log "figures: $ok of $((60 * secs)) events admitted in $ms ms round-robin over 3 processes" \
        "(ingest_rate $rate, burst $burst: want $want, +10%, + burst)"
    assert_ge "$ok" $((want * 9 / 10)) "$ok admitted in $ms ms: at least 90% of $want"
    assert_le "$ok" $((want * 11 / 10 + burst)) "$ok admitted: at most 110% of $want plus one burst ($burst)"
    assert_eq "$ok" "$(psql_q "SELECT count(*) FROM event_inbox WHERE tenant_id = '$TENANT'")" \
        "exactly the admitted events are stored"
    assert_eq 0 "$(grep -vc '^202$' "$WORK/mp/other.codes")" \
        "a neighbour with the same quota at 6/s meanwhile: every event 202"
}

teardown() {
    local p
    for p in A B C; do
        [[ -f $WORK/mp/$p.n ]] && mp_alive "$p" && mp_stop "$p"
    done
    # hub_test_done stops the current hub: there is none left
    HUB_PID=
    hub_state_save
}

scenarios_main "$@"
