# shellcheck shell=bash
#
# tests/support/configmap.sh — a Kubernetes ConfigMap volume on a plain
# directory, laid out and updated the way kubelet's atomic writer does it:
#
#   DIR/..2026_01_01_00_00_00.000000001/KEY   the files of one version
#   DIR/..data -> ..2026_...                  the current version
#   DIR/KEY -> ..data/KEY                     one symlink per key
#
# An update writes a new timestamped directory, points a fresh ..data_tmp
# symlink at it and renames that over ..data (the one atomic step), links the
# new keys, removes the links of keys that are gone and then the old
# directory.  Used by the policy watch tests (the hub must react to the
# ..data rename) and by the container test (the policy directory mounted
# into the container).
#
#   configmap_write "$WORK/cm" a.lua="$WORK/src/a" b.lua="$WORK/src/b"

CONFIGMAP_SERIAL=0

# configmap_write DIR KEY=FILE...: makes DIR hold exactly these keys, each
# with the contents of FILE (created world-readable, so that a container
# user can read them).
configmap_write() {
    local dir=$1 ts old kv key
    shift
    CONFIGMAP_SERIAL=$((CONFIGMAP_SERIAL + 1))
    ts=..2026_01_01_00_00_00.$(printf '%09d' "$CONFIGMAP_SERIAL")
    mkdir -p "$dir" "$dir/$ts"
    chmod 755 "$dir" "$dir/$ts"
    for kv in "$@"; do
        install -m 644 "${kv#*=}" "$dir/$ts/${kv%%=*}"
    done
    old=$(readlink "$dir/..data" 2>/dev/null || true)
    ln -s "$ts" "$dir/..data_tmp"
    mv -T "$dir/..data_tmp" "$dir/..data"
    for kv in "$@"; do
        key=${kv%%=*}
        [[ -L $dir/$key ]] || ln -s "..data/$key" "$dir/$key"
    done
    for key in "$dir"/*; do
        key=$(basename "$key")
        [[ -e $dir/..data/$key ]] || rm -f "${dir:?}/$key"
    done
    if [[ -n $old ]]; then
        rm -rf "${dir:?}/$old"
    fi
    return 0
}
