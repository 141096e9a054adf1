/*
 * policy_watch — reloads the policies when files in STREAMING_HUB_POLICY_DIR
 * change (SPEC §2.2 STREAMING_HUB_POLICY_WATCH), besides SIGHUP and
 * POST /admin/policies/reload.
 *
 * The directory itself is watched (inotify through uv_fs_event), not the
 * files: a Kubernetes ConfigMap volume is dir/..data -> ..<timestamp>/ with
 * each key a symlink dir/<key> -> ..data/<key>, and kubelet updates it by
 * writing a new ..<timestamp>/ and renaming a fresh ..data_tmp symlink over
 * ..data.  Inside the watched directory that swap is one rename whose target
 * is "..data"; an edit in a plain directory shows as a change of a *.lua
 * entry.  Either starts a debounced reload: the burst of events of one update
 * (a swap, an editor's save, `cp -r`) becomes one reload, which the policy
 * registry runs as a new generation and where a broken file keeps its last
 * good version (policy.h).
 *
 * A directory that is missing or replaced (deleted, or renamed away and
 * another put in its place) is looked at again every few seconds and watched
 * anew once it is there, with a reload.
 *
 * Loop thread only.
 */
#ifndef HUB_POLICY_WATCH_H
#define HUB_POLICY_WATCH_H

#include <uv.h>

struct hub_policies;
struct hub_policy_watch;

/*
 * Starts watching dir for ps.  Borrows loop and ps until
 * hub_policy_watch_stop(); copies dir.  A directory that cannot be watched
 * yet is logged and retried, so the watcher is returned anyway.  Returns an
 * owned watcher, or NULL when out of memory (logged; the hub runs without).
 */
struct hub_policy_watch *hub_policy_watch_start(uv_loop_t *loop, const char *dir,
                                                struct hub_policies *ps);

/*
 * Stops watching: no reload starts after this call.  The handles close on
 * the loop and the watcher is freed by their close callbacks, so the loop
 * must run once more.  NULL is a no-op.
 */
void hub_policy_watch_stop(struct hub_policy_watch *w);

#endif
