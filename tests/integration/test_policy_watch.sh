#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# The policy directory watch (STREAMING_HUB_POLICY_WATCH, src/policy_watch.c):
# policies reload by themselves when their files change, debounced, in a
# plain directory and in the layout of a Kubernetes ConfigMap volume.
#
# Covers:
#   1. a plain directory: a new file, an edit in place and several files
#      written together each reload (the burst as exactly one reload); other
#      files (dot files, *.txt) do not reload.
#   2. a broken file keeps its last good version: same hash, last_error and
#      the log name the file and the line, reloads_total{result="error"}.
#   3. a ConfigMap volume (dir/..data -> ..<timestamp>/, keys as symlinks
#      through ..data), updated the way kubelet's atomic writer does it (new
#      timestamped dir, ..data_tmp symlink renamed over ..data, new keys
#      linked, the old dir removed): one reload per swap, a new key appears,
#      a removed key disappears, a swap with a broken file keeps the good
#      version and names file and line.
#   4. the directory replaced (renamed away, a new one put in its place) and
#      missing for a while: nothing reloads while it is missing (the
#      policies stay), and once it is back it is watched and loaded again.
#   5. STREAMING_HUB_POLICY_WATCH=false: changes are not picked up until
#      SIGHUP.
#
# Each scenario watches a directory of its own (made by its prepare_*, so
# that its hub loads it at start) with a hub of its own (watch_hub): the
# delivery role without a KEK, so no Kafka and no dispatcher are needed to
# load policies.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# shellcheck source=tests/support/configmap.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/configmap.sh"

setup() {
    command -v jq >/dev/null || fatal "jq is required by this test"
    pg_start
}

# put FILE < source: writes FILE atomically (a dot temp file, then rename).
put() {
    local dir base
    dir=$(dirname "$1")
    base=$(basename "$1")
    cat >"$dir/.$base.tmp" && mv -f "$dir/.$base.tmp" "$1"
}

# policy_src VERSION: a small valid policy that says its version.
policy_src() {
    printf -- '-- version %s\nreturn {\n  shape = function(ev) return nil, { ["X-Version"] = "%s" } end,\n}\n' "$1" "$1"
}

sha() { sha256sum | cut -d' ' -f1; }

pols() { admin_curl GET /admin/policies; }
gen() { pols | jq -r .generation; }
hash_of() { pols | jq -r --arg n "$1" '.policies[] | select(.name == $n) | .hash'; }
err_of() { pols | jq -r --arg n "$1" '.policies[] | select(.name == $n) | .last_error'; }
names() { pols | jq -r '[.policies[].name] | sort | join(",")'; }
reloads() { metric "streaming_hub_policy_reloads_total{result=\"$1\"}"; }

# settle: waits until no reload has happened for 1.5 s (the debounce is
# 200 ms, a burst at most 1 s), so counts taken next are stable.
settle() {
    local g
    g=$(gen)
    while sleep 1.5; do
        [[ $(gen) == "$g" ]] && return 0
        g=$(gen)
    done
}

# pdir NAME: the directory scenario NAME watches.
pdir() {
    echo "$WORK/pw-$1"
}

# watch_hub NAME [NAME=VALUE...]: the hub of a scenario: the delivery role
# (no KEK: no dispatcher) watching pdir NAME, with the extra settings.
watch_hub() {
    local dir
    dir=$(pdir "$1")
    shift
    hub_ensure STREAMING_HUB_ROLE=delivery "STREAMING_HUB_POLICY_DIR=$dir" "$@"
}

# ---------------------------------------------------------------------------
# 1. a plain directory
# ---------------------------------------------------------------------------
prepare_plain_directory_reloads_by_itself() {
    mkdir -p "$(pdir plain)"
    policy_src a1 | put "$(pdir plain)/alpha.lua"
}

scenario_plain_directory_reloads_by_itself() {
    local PD G
    watch_hub plain
    PD=$(pdir plain)
    grep -q '"msg":"watching the policy directory"' "$HUB_LOG" &&
        pass "the hub logs that it watches the policy directory" ||
        fail "no \"watching the policy directory\" line in the log"
    assert_eq "$(policy_src a1 | sha)" "$(hash_of alpha)" "alpha v1 loaded at start"
    G=$(gen)

    policy_src b1 | put "$PD/beta.lua"
    wait_until 5 "[[ \$(hash_of beta) == $(policy_src b1 | sha) ]]" &&
        pass "a new file is loaded without a reload request" ||
        fail "beta.lua was not picked up within 5 s"
    settle
    assert_eq $((G + 1)) "$(gen)" "one new file: one reload"

    # an edit in place (truncate + write: several events) is one reload too
    G=$(gen)
    policy_src a2 >"$PD/alpha.lua"
    wait_until 5 "[[ \$(hash_of alpha) == $(policy_src a2 | sha) ]]" &&
        pass "an edit in place is loaded" || fail "alpha.lua v2 not loaded within 5 s"
    settle
    assert_eq $((G + 1)) "$(gen)" "an edit in place: one reload"

    # three files written together: one reload
    G=$(gen)
    policy_src c1 | put "$PD/gamma.lua"
    policy_src d1 | put "$PD/delta.lua"
    policy_src b2 | put "$PD/beta.lua"
    wait_until 5 "[[ \$(names) == alpha,beta,delta,gamma && \$(hash_of beta) == $(policy_src b2 | sha) ]]" &&
        pass "three files written together are all loaded" || fail "the burst was not loaded: $(names)"
    settle
    assert_eq $((G + 1)) "$(gen)" "a burst of three files: exactly one reload"

    # files that are not policies do not reload
    G=$(gen)
    echo notes >"$PD/README.txt"
    echo x >"$PD/.hidden.lua"
    sleep 1.5
    assert_eq "$G" "$(gen)" "a *.txt file and a dot file do not reload"
    rm -f "$PD/README.txt" "$PD/.hidden.lua"

    # removing a file reloads and the policy is gone
    rm -f "$PD/delta.lua"
    wait_until 5 "[[ \$(names) == alpha,beta,gamma ]]" && pass "a deleted file is gone" ||
        fail "delta still loaded after its file was deleted: $(names)"
    settle
}

# ---------------------------------------------------------------------------
# 2. a broken file keeps its last good version
# ---------------------------------------------------------------------------
prepare_broken_file_keeps_its_last_good_version() {
    mkdir -p "$(pdir broken)"
    policy_src c1 | put "$(pdir broken)/gamma.lua"
}

scenario_broken_file_keeps_its_last_good_version() {
    local PD G ERR0 GOOD e
    watch_hub broken
    PD=$(pdir broken)
    G=$(gen)
    ERR0=$(reloads error)
    GOOD=$(hash_of gamma)
    assert_eq "$(policy_src c1 | sha)" "$GOOD" "gamma v1 loaded at start"
    printf -- '-- broken on line 3\nreturn {\n  shape = function(ev) return nil end end,\n}\n' | put "$PD/gamma.lua"
    wait_until 5 "[[ \$(gen) -gt $G ]]" && pass "a broken file reloads" || fail "no reload after a broken file"
    settle
    assert_eq "$GOOD" "$(hash_of gamma)" "the broken gamma.lua keeps its last good version"
    e=$(err_of gamma)
    assert_contains "$e" "gamma.lua:3:" "last_error names the file and the line"
    assert_eq $((ERR0 + 1)) "$(reloads error)" 'reloads_total{result="error"} counts the broken reload'
    grep -F '"msg":"policy failed to load; its previous version stays"' "$HUB_LOG" | grep -qF 'gamma.lua:3:' &&
        pass "the log names the file and the line" || fail "no log line naming gamma.lua:3"
    policy_src c2 | put "$PD/gamma.lua"
    wait_until 5 "[[ \$(hash_of gamma) == $(policy_src c2 | sha) && \$(err_of gamma) == null ]]" &&
        pass "the fixed file loads and clears last_error" || fail "gamma.lua v2 not loaded"
    settle
}

# ---------------------------------------------------------------------------
# 3. a ConfigMap volume, updated like kubelet does (support/configmap.sh)
# ---------------------------------------------------------------------------
prepare_configmap_volume_reloads_on_each_swap() {
    local src=$WORK/src-cm
    mkdir -p "$src"
    policy_src m1 >"$src/m1"
    policy_src n1 >"$src/n1"
    policy_src m2 >"$src/m2"
    policy_src o1 >"$src/o1"
    printf 'return {\n  match = function(ev)\n    return ev.data.amount >\n  end,\n}\n' >"$src/broken"
    configmap_write "$(pdir cm)" mu.lua="$src/m1" nu.lua="$src/n1"
}

scenario_configmap_volume_reloads_on_each_swap() {
    local CM src=$WORK/src-cm G GOOD
    watch_hub cm
    CM=$(pdir cm)
    # the serial of configmap_write's timestamped directories, past the
    # prepare's (it ran in a shell of its own)
    CONFIGMAP_SERIAL=100
    assert_eq mu,nu "$(names)" "the ConfigMap's keys are loaded at start (..data and the timestamped dir are not policies)"
    G=$(gen)

    configmap_write "$CM" mu.lua="$src/m2" nu.lua="$src/n1" omicron.lua="$src/o1"
    wait_until 5 "[[ \$(names) == mu,nu,omicron && \$(hash_of mu) == $(sha <"$src/m2") ]]" &&
        pass "a ..data swap loads the changed and the new keys" ||
        fail "the ..data swap was not loaded: $(names)"
    settle
    assert_eq $((G + 1)) "$(gen)" "a ..data swap: exactly one reload"

    G=$(gen)
    configmap_write "$CM" mu.lua="$src/m2" omicron.lua="$src/o1"
    wait_until 5 "[[ \$(names) == mu,omicron ]]" && pass "a key removed from the ConfigMap is gone" ||
        fail "nu still loaded after its key was removed: $(names)"
    settle

    G=$(gen)
    GOOD=$(hash_of omicron)
    configmap_write "$CM" mu.lua="$src/m2" omicron.lua="$src/broken"
    wait_until 5 "[[ \$(gen) -gt $G ]]" && pass "a swap with a broken file reloads" ||
        fail "no reload after the broken swap"
    settle
    assert_eq "$GOOD" "$(hash_of omicron)" "the broken ConfigMap key keeps its last good version"
    assert_contains "$(err_of omicron)" "omicron.lua:4:" "last_error names the ConfigMap file and line"
    grep -F '"msg":"policy failed to load; its previous version stays"' "$HUB_LOG" | grep -qF 'omicron.lua:4:' &&
        pass "the log names the ConfigMap file and line" || fail "no log line naming omicron.lua:4"
}

# ---------------------------------------------------------------------------
# 4. the directory replaced, and missing for a while
# ---------------------------------------------------------------------------
prepare_directory_replaced_and_missing_is_watched_again() {
    mkdir -p "$(pdir moved)"
    policy_src a2 | put "$(pdir moved)/alpha.lua"
    policy_src b2 | put "$(pdir moved)/beta.lua"
    policy_src c2 | put "$(pdir moved)/gamma.lua"
}

scenario_directory_replaced_and_missing_is_watched_again() {
    local PD G
    watch_hub moved
    PD=$(pdir moved)
    G=$(gen)
    mv "$PD" "$PD.old"
    sleep 1.5
    assert_eq "$G" "$(gen)" "a missing directory does not reload (the policies stay)"
    assert_eq alpha,beta,gamma "$(names)" "the policies stay while the directory is missing"
    mkdir "$PD"
    policy_src e1 | put "$PD/epsilon.lua"
    policy_src a3 | put "$PD/alpha.lua"
    wait_until 12 "[[ \$(names) == alpha,epsilon ]]" &&
        pass "a directory put back in place is watched and loaded again" ||
        fail "the new directory was not loaded within 12 s: $(names)"
    grep -q '"msg":"watching the policy directory again"' "$HUB_LOG" &&
        pass "the log says the directory is watched again" || fail "no \"watching ... again\" line"
    settle
    policy_src e2 | put "$PD/epsilon.lua"
    wait_until 5 "[[ \$(hash_of epsilon) == $(policy_src e2 | sha) ]]" &&
        pass "changes in the new directory are picked up" || fail "epsilon v2 not loaded"
    rm -rf "$PD.old"
}

# ---------------------------------------------------------------------------
# 5. STREAMING_HUB_POLICY_WATCH=false
# ---------------------------------------------------------------------------
prepare_watch_off_reloads_on_sighup_only() {
    mkdir -p "$(pdir off)"
    policy_src e2 | put "$(pdir off)/epsilon.lua"
}

scenario_watch_off_reloads_on_sighup_only() {
    local PD G
    watch_hub off STREAMING_HUB_POLICY_WATCH=false
    PD=$(pdir off)
    grep -q '"msg":"watching the policy directory"' "$HUB_LOG" &&
        fail "POLICY_WATCH=false still watches" || pass "POLICY_WATCH=false: no watch started"
    G=$(gen)
    policy_src e3 | put "$PD/epsilon.lua"
    sleep 2
    assert_eq "$G" "$(gen)" "POLICY_WATCH=false: a changed file does not reload"
    kill -HUP "$HUB_PID"
    wait_until 5 "[[ \$(hash_of epsilon) == $(policy_src e3 | sha) ]]" &&
        pass "POLICY_WATCH=false: SIGHUP still reloads" || fail "SIGHUP did not reload"
}

scenarios_main "$@"
