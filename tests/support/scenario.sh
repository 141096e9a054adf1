# shellcheck shell=bash
#
# tests/support/scenario.sh — the scenario runner (sourced by lib.sh).
#
# An integration script defines, in the order they should read as a spec:
#
#   setup()                the shared services, started once in the main
#                          shell: pg_start, kafka_start, sink_start,
#                          hub_shared NAME=VALUE... (the hub every scenario
#                          gets), fixtures every scenario may use
#   scenario_<name>()      one user-visible behaviour, with its own set-up
#                          on the shared services (own_tenant, own_id: its
#                          own tenants, keys, subscriptions, paths and ids)
#   prepare_<name>()       optional: the part of scenario <name>'s set-up
#                          that only starts work (subscriptions, produced
#                          events), run for every selected scenario before
#                          the first scenario body, several at once
#                          (HUB_TEST_PREPARE_JOBS, default 4), so that their
#                          waits overlap; it hands variables to the body
#                          with `keep VAR...`.  Scenarios that restart the
#                          hub with another configuration come after the
#                          ones that prepare (and prepare nothing themselves)
#   hub_env_<name>()       optional: prints the NAME=VALUE words (no
#                          blanks inside) scenario <name>'s hub has on top
#                          of the shared configuration; the runner starts
#                          that hub before the scenario (hub_ensure).  A
#                          scenario that must first do something on the
#                          shared hub calls hub_ensure NAME=VALUE... itself
#   teardown()             optional: last checks on the shared services
#
# and ends with `scenarios_main "$@"`, which
#   - with --list prints the scenario names and exits (nothing is started);
#   - picks the scenarios named on the command line or in HUB_TEST_ONLY
#     (names or shell patterns, e.g. `quota_429 'pull_*'`), else all;
#     leaves out those HUB_TEST_SKIP names (same form; the sanitizer pass
#     skips pure latency checks this way, tests/integration/CMakeLists.txt),
#     printing a `# scenario NAME: skipped` line for each;
#   - runs hub_test_init and setup, the prepares, then each scenario body in
#     order, each in a subshell of its own: its variables, its `cd` and its
#     failures stay its own, and fatal ends that scenario only;
#   - before each scenario, when the script shares a hub (hub_shared),
#     calls hub_ensure (with the words of hub_env_<name> if defined): a
#     scenario that stopped the hub or ran it with another configuration
#     does not leave that to the next one;
#   - tags every assertion with the scenario's name (ok [name] …,
#     FAIL [name] …), prints a line per scenario with its counts, a
#     scenario that made no assertion or ended early is a failure;
#   - ends with teardown and hub_test_done: the failed scenarios, the line
#     "N passed, M failed", exit status 1 if anything failed.
#
# A scenario run alone (by name) gets the same set-up as within the whole
# file: everything it reads it made itself (own_client, own_tenant, own_id
# in lib.sh), or is a shared service or fixture.  The hub's counters are
# shared too: a scenario compares their growth (metric_delta), unless it
# runs on a hub of its own.

# keep VAR...: in a prepare_<name>, hands these variables (scalars or
# arrays) to scenario_<name>'s body.
keep() {
    local var
    mkdir -p "$WORK/scenarios"
    for var in "$@"; do
        declare -p "$var" | sed 's/^declare /declare -g /' >>"$WORK/scenarios/$HUB_SCENARIO.vars"
    done
}

# scenarios_list: the names of the script's scenario_* functions, in the
# order they are defined.
scenarios_list() {
    local f
    shopt -s extdebug
    for f in $(declare -F | awk '$3 ~ /^scenario_/ { print $3 }'); do
        declare -F "$f"
    done | sort -k2,2n | awk '{ sub(/^scenario_/, "", $1); print $1 }'
    shopt -u extdebug
}

# scenarios_select ALL_NAMES PATTERN...: the names matching any pattern, in
# ALL_NAMES's order (all of them without a pattern); 1 (with a message) if a
# pattern matches nothing.
scenarios_select() {
    local all=$1 p n hit rc=0
    shift
    if (($# == 0)); then
        printf '%s\n' "$all"
        return 0
    fi
    for p in "$@"; do
        hit=0
        for n in $all; do
            # shellcheck disable=SC2053 # a pattern on purpose
            [[ $n == $p ]] && hit=1
        done
        if ((!hit)); then
            echo "no scenario matches '$p'; the scenarios of $(basename "$0"):" >&2
            # shellcheck disable=SC2086 # one name a word
            printf '  %s\n' $all >&2
            rc=1
        fi
    done
    ((rc == 0)) || return 1
    for n in $all; do
        for p in "$@"; do
            # shellcheck disable=SC2053
            if [[ $n == $p ]]; then
                echo "$n"
                break
            fi
        done
    done
}

# scenarios_start KIND NAME: starts KIND_NAME (KIND prepare or scenario) in
# a subshell tagged NAME, in the background (the main shell still takes
# signals, the watchdog's, while it waits); sets SCENARIO_PID.
scenarios_start() {
    local kind=$1 name=$2
    if [[ $kind == scenario ]]; then
        printf '# scenario %s\n' "$name"
    fi
    log "$kind $name"
    mkdir -p "$WORK/http"
    (
        # shellcheck disable=SC2034 # read by fatal, hub_curl and the rest of lib.sh
        HUB_SCENARIO=$name HUB_SCENARIO_PID=$BASHPID HUB_HTTP_LAST=$WORK/http/$name
        if [[ -f $WORK/scenarios/$name.vars ]]; then
            # shellcheck source=/dev/null
            source "$WORK/scenarios/$name.vars"
        fi
        "${kind}_$name"
        exit 0
    ) &
    SCENARIO_PID=$!
    track_pid "$SCENARIO_PID"
}

# scenarios_finish KIND NAME PID T0_MS FAILED_BEFORE: waits for it, takes
# over the hub it may have restarted, and judges it: ended early without a
# failed assertion, or (a scenario) made no assertion, is a failure.
# Prints a scenario's counts and time.
scenarios_finish() {
    local kind=$1 name=$2 pid=$3 t0=$4 before=$5 rc counts p f
    wait "$pid"
    rc=$?
    hub_state_load
    counts=$(hub_test_counts "$name")
    p=${counts% *}
    f=${counts#* }
    if ((rc != 0 && f == before)); then
        HUB_SCENARIO=$name fail "$kind ended early (status $rc) without a failed assertion"
        f=$((f + 1))
    fi
    if [[ $kind == scenario ]]; then
        if ((p == 0 && f == 0)); then
            HUB_SCENARIO=$name fail "the scenario made no assertion"
            f=1
        fi
        t0=$(($(date +%s%3N) - t0))
        printf '# scenario %s: %d passed, %d failed (%d.%03d s)\n' "$name" "$p" "$f" \
            $((t0 / 1000)) $((t0 % 1000))
    fi
}

# scenarios_failed NAME: failed assertions of NAME so far.
scenarios_failed() {
    local counts
    counts=$(hub_test_counts "$1")
    echo "${counts#* }"
}

# scenarios_prepare NAME...: runs the prepares of these scenarios, up to
# HUB_TEST_PREPARE_JOBS (default 4) at a time: they only start work for
# scenarios that share nothing, so their own waits (a probe, a producer)
# need not add up.
scenarios_prepare() {
    local name jobs=${HUB_TEST_PREPARE_JOBS:-4} pids=() names=() befores=() i
    for name in "$@"; do
        declare -F "prepare_$name" >/dev/null || continue
        if ((${#pids[@]} >= jobs)); then
            scenarios_finish prepare "${names[0]}" "${pids[0]}" 0 "${befores[0]}"
            pids=("${pids[@]:1}")
            names=("${names[@]:1}")
            befores=("${befores[@]:1}")
        fi
        befores+=("$(scenarios_failed "$name")")
        scenarios_start prepare "$name"
        pids+=("$SCENARIO_PID")
        names+=("$name")
    done
    for i in "${!pids[@]}"; do
        scenarios_finish prepare "${names[$i]}" "${pids[$i]}" 0 "${befores[$i]}"
    done
}

# scenarios_main [--list] [NAME|PATTERN...]: the script's whole run (see the
# header of this file).
scenarios_main() {
    local all selected name t0 before
    all=$(scenarios_list)
    case ${1:-} in
    --list | -l)
        printf '%s\n' "$all"
        exit 0
        ;;
    --help | -h)
        echo "usage: $0 [--list] [SCENARIO|PATTERN...]   (or HUB_TEST_ONLY=\"...\")"
        exit 0
        ;;
    esac
    if (($# == 0)) && [[ -n ${HUB_TEST_ONLY:-} ]]; then
        local only
        IFS=$' \t,' read -ra only <<<"$HUB_TEST_ONLY" # no globbing of the patterns
        set -- "${only[@]}"
    fi
    selected=$(scenarios_select "$all" "$@") || exit 2
    if [[ -n ${HUB_TEST_SKIP:-} ]]; then
        local skip kept="" p hit
        IFS=$' \t,' read -ra skip <<<"$HUB_TEST_SKIP"
        for name in $selected; do
            hit=0
            for p in "${skip[@]}"; do
                # shellcheck disable=SC2053 # a pattern on purpose
                [[ $name == $p ]] && hit=1
            done
            if ((hit)); then
                printf '# scenario %s: skipped (HUB_TEST_SKIP)\n' "$name"
            else
                kept+="$name"$'\n'
            fi
        done
        selected=$kept
        if [[ -z $selected ]]; then
            echo "# every selected scenario is skipped (HUB_TEST_SKIP)"
            exit 77 # ctest's SKIP_RETURN_CODE: not a pass, not a failure
        fi
    fi

    hub_test_init
    # shellcheck disable=SC2034 # read by hub_test_summary and hub_ensure
    HUB_SCENARIOS_RUN=1 HUB_SHARED_ENV=()
    if declare -F setup >/dev/null; then
        HUB_SCENARIO=setup
        setup
    fi
    # shellcheck disable=SC2086 # one name a word
    scenarios_prepare $selected
    for name in $selected; do
        HUB_SCENARIO=$name
        if declare -F "hub_env_$name" >/dev/null; then
            # shellcheck disable=SC2046 # NAME=VALUE words on purpose
            hub_ensure $("hub_env_$name")
        elif [[ -n ${HUB_SHARED:-} ]]; then
            hub_ensure
        fi
        t0=$(date +%s%3N)
        before=$(scenarios_failed "$name")
        scenarios_start scenario "$name"
        scenarios_finish scenario "$name" "$SCENARIO_PID" "$t0" "$before"
    done
    HUB_SCENARIO=teardown
    if declare -F teardown >/dev/null; then
        teardown
    fi
    hub_test_done
}
