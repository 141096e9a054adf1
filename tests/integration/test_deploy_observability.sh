#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*
# deploy/prometheus and deploy/grafana checked against a real hub's /metrics:
#   1. `promtool check rules` accepts the alerting rules, and `promtool test
#      rules` (streaming-hub-rules.test.yaml) shows each tested alert firing
#      on the series that should raise it and quiet on healthy ones;
#   2. every streaming_hub_* metric an alert or a dashboard panel names is one
#      the hub exports (its # TYPE lines; a histogram's _bucket/_sum/_count);
#   3. the dashboard's structure: JSON, uid and title, the datasource and job
#      variables, unique panel ids, every panel with a type, a title and a
#      grid position inside the 24 columns, every non-row panel with targets
#      that each have a refId (unique in the panel) and an expr;
#   4. the checks can fail: a panel naming a metric the hub does not export,
#      a panel without targets, a duplicate id and a rule with a syntax error
#      are each refused.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

RULES=$HUB_TEST_REPO/deploy/prometheus/streaming-hub-rules.yaml
RULES_TEST=$HUB_TEST_REPO/deploy/prometheus/streaming-hub-rules.test.yaml
DASH=$HUB_TEST_REPO/deploy/grafana/streaming-hub.json

setup() {
    command -v promtool >/dev/null || fatal "promtool is not installed (scripts/install-deps: prometheus)"
    command -v jq >/dev/null || fatal "jq is not installed"
    pg_start
    kafka_start --topic lerian.streaming.observability:1
    hub_shared
    # the names the hub exports, one a line (histograms with their series)
    EXPORTED=$WORK/exported
    curl -s --max-time 10 "$HUB_URL/metrics" |
        awk '$1 == "#" && $2 == "TYPE" {
                 print $3
                 if ($4 == "histogram") { print $3 "_bucket"; print $3 "_sum"; print $3 "_count" }
             }' | sort -u >"$EXPORTED"
    [[ $(wc -l <"$EXPORTED") -gt 20 ]] || fatal "the hub's /metrics lists too few metrics"
}

# unknown_metrics FILE: the streaming_hub_* names FILE mentions that the
# hub does not export, one a line.
unknown_metrics() {
    grep -oE 'streaming_hub_[a-z0-9_]+' "$1" | sort -u | comm -23 - "$EXPORTED"
}

# dashboard_problems FILE: one line per structural problem of the dashboard.
dashboard_problems() {
    jq -r '
      def panels: .panels[]? | ., (.panels[]? // empty);
      (if (.uid | type) != "string" or (.title | type) != "string" then "no uid or title" else empty end),
      (if ([.templating.list[]?.name] | index("datasource")) == null then "no datasource variable" else empty end),
      (if ([.templating.list[]?.name] | index("job")) == null then "no job variable" else empty end),
      ([panels | .id] | group_by(.) | map(select(length > 1) | "duplicate panel id \(.[0])") | .[]),
      (panels |
        (if (.type | type) != "string" or (.title // "") == "" then "panel \(.id): no type or title" else empty end),
        (if (.gridPos.w // 0) < 1 or (.gridPos.h // 0) < 1 or (.gridPos.x // -1) < 0
            or ((.gridPos.x // 0) + (.gridPos.w // 0)) > 24 then "panel \(.id): bad gridPos" else empty end),
        (select(.type != "row") |
          (if (.targets | length) == 0 then "panel \(.id): no targets" else empty end),
          (if ([.targets[]? | .refId] | unique | length) != (.targets | length) then "panel \(.id): refIds not unique" else empty end),
          (.targets[]? | select((.expr // "") == "") | "panel: a target without expr")))
    ' "$1" 2>&1
}

scenario_promtool_accepts_the_rules() {
    local out
    out=$(promtool check rules "$RULES" 2>&1)
    assert_eq 0 "$?" "promtool check rules: $out"
    assert_match "$out" "SUCCESS: [0-9]+ rules found" "rules found"
    out=$(cd "$(dirname "$RULES_TEST")" && promtool test rules "$(basename "$RULES_TEST")" 2>&1)
    assert_eq 0 "$?" "promtool test rules: the alerts fire as tested: $out"
    local a
    for a in StreamingHubDown StreamingHubDatabaseUnreachable StreamingHubKafkaUnhealthy \
        StreamingHubBacklogGrowing StreamingHubBreakersOpen StreamingHubSubscriptionsAutoDisabled \
        StreamingHubPolicyErrors StreamingHubPolicyTripped StreamingHubIngestQuarantines; do
        grep -q "alert: $a\$" "$RULES" || fail "no alert $a"
        grep -q "alertname: $a\$" "$RULES_TEST" || fail "alert $a has no promtool test"
    done
    pass "every alert of issue 27 is defined and tested"
}

scenario_rules_and_dashboard_name_exported_metrics() {
    local u
    u=$(unknown_metrics "$RULES")
    assert_eq "" "$u" "every metric the rules name is exported"
    u=$(unknown_metrics "$DASH")
    assert_eq "" "$u" "every metric the dashboard names is exported"
    assert_ge "$(grep -c 'streaming_hub_' "$DASH")" 20 "the dashboard reads the hub's metrics"
}

scenario_dashboard_structure() {
    local out n
    out=$(dashboard_problems "$DASH")
    assert_eq "" "$out" "the dashboard has no structural problem"
    n=$(jq '[.panels[] | select(.type != "row")] | length' "$DASH")
    assert_ge "$n" 15 "it has panels ($n)"
    for what in jobs_due breakers_open subscriptions_auto_disabled policy_errors policy_trips \
        'verdict="quarantined"' kafka_healthy pg_connections_up; do
        jq -r '.. | .expr? // empty' "$DASH" | grep -q -- "$what" || fail "no panel shows $what"
    done
    pass "backlog, breakers, auto-disables, policy errors and trips, quarantines and readiness shown"
}

scenario_the_checks_can_fail() {
    local bad=$WORK/bad.json out
    jq '.panels[1].targets[0].expr = "rate(streaming_hub_no_such_metric_total[5m])"' "$DASH" >"$bad"
    assert_eq "streaming_hub_no_such_metric_total" "$(unknown_metrics "$bad")" "an unknown metric is named"
    jq '.panels[1].targets = []' "$DASH" >"$bad"
    assert_contains "$(dashboard_problems "$bad")" "no targets" "a panel without targets is refused"
    jq '.panels[2].id = .panels[1].id' "$DASH" >"$bad"
    assert_contains "$(dashboard_problems "$bad")" "duplicate panel id" "a duplicate id is refused"
    jq '.panels[1].gridPos.x = 20' "$DASH" >"$bad"
    assert_contains "$(dashboard_problems "$bad")" "bad gridPos" "a panel past 24 columns is refused"
    sed 's/expr: up{job=~".\*streaming-hub.\*"} == 0/expr: up{job=~ == 0/' "$RULES" >"$WORK/bad.yaml"
    out=$(promtool check rules "$WORK/bad.yaml" 2>&1)
    assert_ne 0 "$?" "promtool refuses a broken expression"
}

scenarios_main "$@"
