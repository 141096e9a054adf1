#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The outgoing HTTP client (src/httpc.c, SPEC §7.2, §7.3, §11) against the
# real recording sink: httpc_probe runs the scripted requests and prints
# "ok ..." / "FAIL ...: why" per check; every line becomes an assertion here.
# Then the sink's record is checked for what only the sink can see: the
# headers that were sent, that a redirect was not followed, that requests
# refused by the SSRF guard never arrived, that plain http stayed HTTP/1.1.
#
# The probe runs once, in the set-up (it is the traffic both scenarios read;
# running it again would double the sink's counts).
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/sink.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/sink.sh"

setup() {
    local probe=$BUILD/httpc_probe
    [[ -x $probe ]] || fatal "probe not found: $probe (build the httpc_probe target)"
    sink_start 0 # a free port
    log "running $probe $SINK_URL"
    "$probe" "$SINK_URL" >"$WORK/probe.out" 2>"$WORK/probe.err"
    echo $? >"$WORK/probe.rc"
}

teardown() {
    sink_stop
}

scenario_every_httpc_probe_check_passes() {
    local line n_ok=0 probe_rc
    probe_rc=$(cat "$WORK/probe.rc")
    while IFS= read -r line; do
        case $line in
            "ok "*)
                pass "httpc: ${line#ok }"
                n_ok=$((n_ok + 1))
                ;;
            "FAIL "*)
                fail "httpc: ${line#FAIL }"
                ;;
        esac
    done <"$WORK/probe.out"
    assert_eq 0 "$probe_rc" "httpc_probe exit status"
    # A probe that stopped early (crash, watchdog) must not look like a pass.
    assert_ge "$n_ok" 40 "httpc_probe ran all its checks"
    if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$WORK/probe.err"; then
        fail "sanitizer report from httpc_probe"
        grep -m1 -A30 -E 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$WORK/probe.err" >&2
    else
        pass "no sanitizer report from httpc_probe"
    fi
    if ((probe_rc != 0)); then
        echo "----- httpc_probe stderr" >&2
        tail -n 40 "$WORK/probe.err" >&2
    fi
}

scenario_the_sink_records_what_httpc_sent() {
    local total
    # Headers as the sink recorded them.
    assert_eq "$(printf 'probe-7f3a')" "$(sink_header /ok/hdr x-httpc-probe)" \
        "custom header X-Httpc-Probe reached the sink"
    assert_eq "application/cloudevents+json" "$(sink_header /ok/hdr content-type)" \
        "Content-Type from the request headers"
    assert_eq "streaming-hub/probe" "$(sink_header /ok/hdr user-agent)" "User-Agent from the options"
    assert_eq "{}" "$(sink_bodies /ok/hdr)" "POST body recorded unchanged"
    assert_eq "" "$(sink_header /ok/injected x-injected)" "a CR/LF header line was never sent"

    # Redirects: the sink answers /redirect with Location: /ok; nothing else in
    # the probe uses the bare path /ok, so any record of it is a followed redirect.
    assert_eq 1 "$(sink_count /redirect)" "/redirect recorded once"
    assert_eq 0 "$(grep -c '"path":"/ok",' "$SINK_LOG")" "Location: /ok was not followed"

    # SSRF guard: refused before connecting, so never recorded.
    assert_eq 0 "$(sink_count /ok/blocked)" "requests refused by the guard never reached the sink"
    assert_eq 1 "$(sink_count /ok/allowed)" "with allow_private the sink is reached"

    # Parallel burst: every request arrived exactly once.
    assert_eq 200 "$(sink_count /ok/par/)" "200 parallel requests recorded"

    # Plain http is HTTP/1.1 (CURL_HTTP_VERSION_2TLS, never prior-knowledge h2c).
    total=$(wc -l <"$SINK_LOG")
    assert_ge "$total" 200 "the sink recorded the probe's requests"
    assert_eq 0 "$(grep -vc '"http_version":"1.1"}$' "$SINK_LOG")" "every request was HTTP/1.1"
}

scenarios_main "$@"
