#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2119 # the runner (scenario.sh) calls scenario_*, prepare_*, hub_env_*
# deploy/kubernetes checked offline (no cluster):
#   1. yamllint (tests/deploy/yamllint.yaml);
#   2. tests/deploy/validate.mjs: each kustomization rendered, every object
#      validated against the Kubernetes schemas of the npm kubernetes-models
#      package (unknown fields refused, as `kubectl --validate=strict` does),
#      and the deployment rules of docs/deploy.md (roles, probes, grace
#      period, resources, non-root read-only pods, secrets, policies,
#      PodDisruptionBudgets, scrape annotations, AUTO_MIGRATE=false, the
#      migration Job, the image of this release);
#   3. the policy ConfigMap's files pass `streaming-hub check-policies`;
#   4. the checks can fail: broken copies of the tree (a misspelt field, a
#      wrong type, a literal secret, a grace period under the drain budget, a
#      writable root, a subPath policy mount, a YAML syntax error) are each
#      refused with the right message.
# Nothing here runs a hub or a database.
set -uo pipefail
# shellcheck source=tests/support/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

DEPLOY=$HUB_TEST_REPO/deploy/kubernetes
CHECKS=$HUB_TEST_REPO/tests/deploy
VERSION=$(sed -n 's/^project(streaming-hub VERSION \([^ )]*\).*/\1/p' "$HUB_TEST_REPO/CMakeLists.txt")

setup() {
    command -v yamllint >/dev/null || fatal "yamllint is not installed (scripts/install-deps)"
    command -v node >/dev/null || fatal "node is not installed (scripts/install-deps)"
    "$CHECKS/npm-install" || fatal "the npm packages of tests/deploy could not be installed"
}

# validate DIR POLICIES_OUT: runs validate.mjs on DIR (the policy
# ConfigMap's files written to POLICIES_OUT); its output in VALIDATE_OUT.
# Returns validate.mjs's status.
validate() {
    local out rc
    out=$(node "$CHECKS/validate.mjs" "$1" --version "$VERSION" --policies-out "$2" 2>&1)
    rc=$?
    VALIDATE_OUT=$out
    return "$rc"
}

# ---------------------------------------------------------------------------
# 1-2. the tree as committed
# ---------------------------------------------------------------------------
scenario_yamllint_accepts_the_tree() {
    local out
    if out=$(yamllint -s -c "$CHECKS/yamllint.yaml" "$DEPLOY" 2>&1); then
        pass "yamllint: deploy/kubernetes"
    else
        fail "yamllint: $out"
    fi
}

scenario_manifests_pass_the_schemas_and_the_rules() {
    local rc n_ok n_fail what
    validate "$DEPLOY" "$WORK/policies-validate"
    rc=$?
    n_ok=$(grep -c '^ok - ' <<<"$VALIDATE_OUT")
    n_fail=$(grep -c '^FAIL - ' <<<"$VALIDATE_OUT")
    grep '^FAIL - ' <<<"$VALIDATE_OUT"
    assert_eq 0 "$rc" "validate.mjs accepts deploy/kubernetes"
    assert_eq 0 "$n_fail" "no failed manifest check"
    assert_ge "$n_ok" 100 "validate.mjs ran its checks ($n_ok passed)"
    for what in "valid against the Kubernetes schema" "readiness probe on /readyz" \
        "terminationGracePeriodSeconds" "a PodDisruptionBudget covers its pods" "runs streaming-hub migrate"; do
        grep -q "^ok - .*$what" <<<"$VALIDATE_OUT" && pass "checked: $what" || fail "not checked: $what"
    done
}

# ---------------------------------------------------------------------------
# 3. the shipped policies compile
# ---------------------------------------------------------------------------
prepare_shipped_policies_compile() {
    # the policy ConfigMap's files, as validate.mjs renders them
    validate "$DEPLOY" "$WORK/policies" >/dev/null || true
}

scenario_shipped_policies_compile() {
    local out
    if out=$("$HUB_BIN" check-policies "$WORK/policies" 2>&1); then
        pass "the policy ConfigMap's files pass check-policies: $out"
    else
        fail "check-policies on the policy ConfigMap: $out"
    fi
}

# ---------------------------------------------------------------------------
# 4. broken copies are refused
# ---------------------------------------------------------------------------
# broken NAME FILE SED_SCRIPT EXPECTED: a copy of the tree with FILE edited
# must fail validate.mjs with a FAIL line containing EXPECTED.
broken() {
    local name=$1 file=$2 script=$3 expected=$4 copy=$WORK/broken-$1
    rm -rf "$copy"
    cp -r "$DEPLOY" "$copy"
    sed -i -e "$script" "$copy/$file"
    if cmp -s "$DEPLOY/$file" "$copy/$file"; then
        fail "$name: the edit did not change $file"
        return
    fi
    if validate "$copy" "$WORK/policies-$1"; then
        fail "$name: a broken tree passed validate.mjs"
    elif grep '^FAIL - ' <<<"$VALIDATE_OUT" | grep -qF -- "$expected"; then
        pass "$name is refused ($expected)"
    else
        fail "$name: refused, but not for '$expected': $(grep '^FAIL - ' <<<"$VALIDATE_OUT" | head -n 3)"
    fi
}

scenario_a_misspelt_field_is_refused() {
    broken "a misspelt field" roles/ingest.yaml 's/readinessProbe:/readinessprobe:/' \
        "fields the API does not have: spec.template.spec.containers[0].readinessprobe"
}

scenario_a_wrong_type_is_refused() {
    broken "a wrong type" roles/delivery.yaml 's/runAsNonRoot: true/runAsNonRoot: "yes"/' \
        "runAsNonRoot must be boolean"
}

scenario_a_literal_secret_is_refused() {
    broken "a literal secret" all/deployment.yaml \
        '/- name: STREAMING_HUB_KEK/{n;N;N;N;s/.*/              value: c2VjcmV0/}' \
        "STREAMING_HUB_KEK from the Secret (not a secretKeyRef)"
}

scenario_a_grace_period_under_the_drain_budget_is_refused() {
    broken "a grace period under the drain budget" roles/delivery.yaml \
        's/terminationGracePeriodSeconds: 45/terminationGracePeriodSeconds: 30/' \
        "terminationGracePeriodSeconds 30 > SHUTDOWN_TIMEOUT 30 s"
}

scenario_a_writable_root_is_refused() {
    broken "a writable root file system" roles/ingest.yaml \
        's/readOnlyRootFilesystem: true/readOnlyRootFilesystem: false/' "read-only root file system"
}

scenario_a_subpath_policy_mount_is_refused() {
    broken "a subPath policy mount" all/deployment.yaml \
        's#mountPath: /etc/streaming-hub/policies#mountPath: /etc/streaming-hub/policies\n              subPath: x#' \
        "policies from a ConfigMap mounted as a directory"
}

scenario_auto_migrate_left_on_is_refused() {
    broken "AUTO_MIGRATE left on" base/config.yaml 's/STREAMING_HUB_AUTO_MIGRATE: "false"/STREAMING_HUB_AUTO_MIGRATE: "true"/' \
        "AUTO_MIGRATE=false"
}

scenario_an_image_of_another_release_is_refused() {
    broken "an image of another release" kustomization.yaml 's/newTag: .*/newTag: 0.0.1/' \
        "image of this release"
}

scenario_a_yaml_syntax_error_is_refused() {
    local out
    broken "a YAML syntax error" base/service.yaml 's/^  ports:/  ports: [/' "cannot render"
    if out=$(yamllint -s -c "$CHECKS/yamllint.yaml" "$WORK/broken-a YAML syntax error" 2>&1); then
        fail "yamllint passed a YAML syntax error"
    else
        pass "yamllint refuses a YAML syntax error"
    fi
}

scenarios_main "$@"
