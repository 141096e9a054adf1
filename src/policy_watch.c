/*
 * policy_watch — debounced policy reloads on changes in the policy directory
 * (the contract and the Kubernetes ConfigMap layout are in policy_watch.h).
 */
#include "policy_watch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "policy.h"

/* Quiet time after the last event before the reload starts: kubelet's swap
 * and an editor's save are each a handful of events within milliseconds. */
#define WATCH_DEBOUNCE_MS 200
/* A directory that never goes quiet (a slow copy) still reloads this long
 * after its first change; a later change starts another reload. */
#define WATCH_MAX_DELAY_MS 1000
/* How often a missing or replaced directory is looked at again. */
#define WATCH_RETRY_MS 5000

struct hub_policy_watch {
    uv_loop_t *loop;
    struct hub_policies *ps; /* borrowed */
    char *dir;
    uv_fs_event_t event;
    uv_timer_t debounce;
    uv_timer_t retry;
    int watching; /* event is started on the directory (dev, ino) */
    dev_t dev;
    ino_t ino;
    uint64_t burst_start; /* uv_now() of the first change not yet reloaded; 0: none */
    int missing_logged;   /* "cannot be watched" was logged for the current outage */
    int open_handles;     /* handles still to close before the free */
};

static void watch_event_cb(uv_fs_event_t *h, const char *filename, int events, int status);

/* 1 when a change to this directory entry can change the policies: a
 * policy file (not a dot file, which the registry skips too), the ConfigMap's
 * ..data link, or an event without a name or about the directory itself
 * (libuv names the latter by the directory's base name). */
static int watch_relevant(const struct hub_policy_watch *w, const char *name) {
    const char *base = strrchr(w->dir, '/');
    size_t len;

    if (name == NULL || strcmp(name, "..data") == 0) {
        return 1;
    }
    base = base != NULL && base[1] != '\0' ? base + 1 : w->dir;
    if (strcmp(name, base) == 0) {
        return 1;
    }
    len = strlen(name);
    return name[0] != '.' && len > 4 && strcmp(name + len - 4, ".lua") == 0;
}

static void watch_disarm(struct hub_policy_watch *w) {
    if (w->watching) {
        uv_fs_event_stop(&w->event);
        w->watching = 0;
    }
}

/*
 * Starts the inotify watch on the directory as it is now.  Returns 0, or a
 * negative errno/libuv code when the path is missing, not a directory or
 * cannot be watched; the first failure of an outage is logged.
 */
static int watch_arm(struct hub_policy_watch *w) {
    struct stat st;
    int rc;

    if (stat(w->dir, &st) != 0) {
        rc = -errno;
    } else if (!S_ISDIR(st.st_mode)) {
        rc = -ENOTDIR;
    } else {
        rc = uv_fs_event_start(&w->event, watch_event_cb, w->dir, 0);
    }
    if (rc != 0) {
        if (!w->missing_logged) {
            hub_log(HUB_WARN, "policy directory cannot be watched; looking again every 5 s",
                    HUB_LS("dir", w->dir), HUB_LS("error", uv_strerror(rc)));
            w->missing_logged = 1;
        }
        return rc;
    }
    w->watching = 1;
    w->dev = st.st_dev;
    w->ino = st.st_ino;
    w->missing_logged = 0;
    return 0;
}

/* 1 when the path still names the directory being watched: a directory
 * deleted, or renamed away and replaced, needs a new watch. */
static int watch_same_dir(const struct hub_policy_watch *w) {
    struct stat st;
    return w->watching && stat(w->dir, &st) == 0 && st.st_dev == w->dev && st.st_ino == w->ino;
}

static void watch_reload(struct hub_policy_watch *w, const char *why) {
    hub_log(HUB_INFO, "policy directory changed; reloading", HUB_LS("dir", w->dir),
            HUB_LS("why", why));
    hub_policies_reload(w->ps, NULL, NULL);
}

static void watch_retry_cb(uv_timer_t *t) {
    struct hub_policy_watch *w = t->data;

    if (watch_arm(w) != 0) {
        return;
    }
    uv_timer_stop(&w->retry);
    hub_log(HUB_INFO, "watching the policy directory again", HUB_LS("dir", w->dir));
    /* whatever it holds now was never loaded */
    watch_reload(w, "directory is back");
}

/* Starts retrying after the watch was lost; nothing is reloaded meanwhile,
 * so a directory being replaced never leaves the hub without policies. */
static void watch_lost(struct hub_policy_watch *w) {
    watch_disarm(w);
    if (watch_arm(w) == 0) {
        watch_reload(w, "directory replaced");
        return;
    }
    if (!uv_is_active((uv_handle_t *)&w->retry)) {
        uv_timer_start(&w->retry, watch_retry_cb, WATCH_RETRY_MS, WATCH_RETRY_MS);
    }
}

/* The burst is over: reload, unless the directory went away under the watch. */
static void watch_debounce_cb(uv_timer_t *t) {
    struct hub_policy_watch *w = t->data;

    w->burst_start = 0;
    if (!watch_same_dir(w)) {
        watch_lost(w);
        return;
    }
    watch_reload(w, "files changed");
}

static void watch_event_cb(uv_fs_event_t *h, const char *filename, int events, int status) {
    struct hub_policy_watch *w = h->data;
    uint64_t now = uv_now(w->loop);
    uint64_t delay = WATCH_DEBOUNCE_MS;

    (void)events;
    if (status < 0) {
        hub_log(HUB_WARN, "policy directory watch failed", HUB_LS("dir", w->dir),
                HUB_LS("error", uv_strerror(status)));
        watch_lost(w);
        return;
    }
    if (!watch_relevant(w, filename)) {
        return;
    }
    if (w->burst_start == 0) {
        w->burst_start = now;
    }
    /* restart the quiet period, but never past the burst's deadline */
    if (now + delay > w->burst_start + WATCH_MAX_DELAY_MS) {
        delay = w->burst_start + WATCH_MAX_DELAY_MS > now
                    ? w->burst_start + WATCH_MAX_DELAY_MS - now
                    : 0;
    }
    uv_timer_start(&w->debounce, watch_debounce_cb, delay, 0);
}

struct hub_policy_watch *hub_policy_watch_start(uv_loop_t *loop, const char *dir,
                                                struct hub_policies *ps) {
    struct hub_policy_watch *w = calloc(1, sizeof(*w));

    if (w == NULL || (w->dir = strdup(dir)) == NULL) {
        free(w);
        hub_log(HUB_ERROR, "policy directory watch not started: out of memory");
        return NULL;
    }
    w->loop = loop;
    w->ps = ps;
    uv_fs_event_init(loop, &w->event);
    uv_timer_init(loop, &w->debounce);
    uv_timer_init(loop, &w->retry);
    w->event.data = w->debounce.data = w->retry.data = w;
    w->open_handles = 3;
    if (watch_arm(w) == 0) {
        hub_log(HUB_INFO, "watching the policy directory", HUB_LS("dir", w->dir));
    } else {
        uv_timer_start(&w->retry, watch_retry_cb, WATCH_RETRY_MS, WATCH_RETRY_MS);
    }
    return w;
}

static void watch_closed(uv_handle_t *h) {
    struct hub_policy_watch *w = h->data;

    if (--w->open_handles == 0) {
        free(w->dir);
        free(w);
    }
}

void hub_policy_watch_stop(struct hub_policy_watch *w) {
    if (w == NULL) {
        return;
    }
    /* uv_close stops each handle: no callback of this module runs after this */
    uv_close((uv_handle_t *)&w->event, watch_closed);
    uv_close((uv_handle_t *)&w->debounce, watch_closed);
    uv_close((uv_handle_t *)&w->retry, watch_closed);
}
