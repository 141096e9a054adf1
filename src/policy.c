/*
 * policy — the registry of policies: directory scans, generations, reload,
 * the calls handed to the policy threads and the tripping of policies that
 * keep failing, GET /admin/policies and the metrics (see policy.h).
 *
 * Tripping: a call stopped for time or memory is a failure of its version.
 * When a version has had trip_failures of them within trip_window_ms, it is
 * tripped until trip_cooldown_ms from now: its calls are answered at once
 * with HUB_POLICY_TRIPPED, without running (calls already queued are
 * answered so by the thread that takes them), which the dispatcher treats
 * as it treats any failed call.  After the cool-down its calls run again
 * and it needs trip_failures fresh failures to trip again.  A reload clears
 * the trips of every policy in the new generation (a file changed or not:
 * the operator asked for it).  The record lives in the version and is
 * written on the loop only; the threads read the one atomic they need.
 */
#include "policy.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "log.h"
#include "metrics.h"
#include "policy_int.h"
#include "util.h"

/* ------------------------------------------------------ directory scans -- */

/* ----------------------------------------------------------------------
 * A scan reads the directory and compiles what changed; it owns its
 * results until a generation is built from them (gen_from_scan) or it is
 * dropped.  A reload runs one on the libuv threadpool, check-policies one
 * on its own thread, hub_policies_new one synchronously.
 * ---------------------------------------------------------------------- */

/* One file of a scan. */
struct scan_file {
    char name[HUB_POLICY_NAME_MAX + 1];
    char hash[65];
    char *src; /* the source while it waits to be compiled, else NULL */
    size_t len;
    struct hub_policy *policy; /* compiled now, or NULL */
    char *error;
};

/* A scan in progress, and what it found. */
struct scan {
    char *dir;
    struct hub_policy_limits lim;
    struct hub_policy_gen *prev; /* held; read-only here */
    struct scan_file *files;
    size_t n;
    char *dir_error;
    uint64_t started_ns;
};

/* qsort order of scan files: by name, so a generation can be searched. */
static int name_cmp(const void *a, const void *b) {
    return strcmp(((const struct scan_file *)a)->name, ((const struct scan_file *)b)->name);
}

/* A file's place in a generation: the version in use (held by the
 * generation) and what the last load said about the file. */
struct hub_policy_entry {
    char name[HUB_POLICY_NAME_MAX + 1];
    struct hub_policy *policy; /* the version in use, or NULL (never loaded) */
    uint64_t loaded_gen;       /* generation that loaded it */
    int64_t loaded_at_ms;
    char *error; /* the last load's error for this file, or NULL */
};

/* An immutable generation: built on the loop, shared by the registry and
 * the jobs that hold it (refs, loop thread only), freed with the last. */
struct hub_policy_gen {
    int refs;
    uint64_t number;
    int64_t created_ms;
    size_t n;
    struct hub_policy_entry *e; /* sorted by name */
};

/* The entry of name in g (binary search), or NULL; g may be NULL. */
static const struct hub_policy_entry *gen_entry(const struct hub_policy_gen *g, const char *name) {
    size_t lo = 0, hi = g != NULL ? g->n : 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(name, g->e[mid].name);
        if (c == 0) {
            return &g->e[mid];
        }
        if (c < 0) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return NULL;
}

/* Threads that compile a scan's files at once, at most: a reload of 100
 * files takes ~7 ms of CPU (~70 us each), and busy cores stretch that. */
#define SCAN_THREADS_MAX 4

/* One share of scan_compile(): every stride-th file from first. */
struct compile_part {
    struct scan *s;
    size_t first, stride;
};

static void compile_part(void *arg) {
    struct compile_part *cp = arg;
    for (size_t i = cp->first; i < cp->s->n; i += cp->stride) {
        struct scan_file *f = &cp->s->files[i];
        char err[512];
        if (f->src == NULL) {
            continue;
        }
        f->policy = policy_compile(f->name, f->src, f->len, f->hash, &cp->s->lim, err, sizeof(err));
        if (f->policy == NULL) {
            f->error = strdup(err);
        }
        free(f->src);
        f->src = NULL;
    }
}

/*
 * Compiles the files of s that wait for it, on up to SCAN_THREADS_MAX
 * threads (the calling one included; no more than the cores or the
 * files).  Each version is independent of the others, so their compiles
 * are too.  A share whose thread cannot start is compiled here.
 */
static void scan_compile(struct scan *s) {
    struct compile_part parts[SCAN_THREADS_MAX];
    uv_thread_t threads[SCAN_THREADS_MAX];
    int started[SCAN_THREADS_MAX] = {0};
    size_t todo = 0, k = uv_available_parallelism();

    for (size_t i = 0; i < s->n; i++) {
        todo += s->files[i].src != NULL;
    }
    k = k < SCAN_THREADS_MAX ? k : SCAN_THREADS_MAX;
    k = k < todo ? k : todo;
    if (k <= 1) {
        parts[0] = (struct compile_part){.s = s, .first = 0, .stride = 1};
        compile_part(&parts[0]);
        return;
    }
    for (size_t i = 0; i < k; i++) {
        parts[i] = (struct compile_part){.s = s, .first = i, .stride = k};
        if (i > 0) {
            started[i] = uv_thread_create(&threads[i], compile_part, &parts[i]) == 0;
        }
    }
    compile_part(&parts[0]);
    for (size_t i = 1; i < k; i++) {
        if (started[i]) {
            uv_thread_join(&threads[i]);
        } else {
            compile_part(&parts[i]);
        }
    }
}

/*
 * Reads dir and compiles each valid file into s->files (sorted).  A file
 * whose hash equals the loaded version in s->prev is not compiled again.
 * Runs on any thread: it touches only s and reads s->prev, which is
 * immutable while held.
 */
static void scan_dir(struct scan *s) {
    DIR *dir = opendir(s->dir);
    struct dirent *de;
    size_t cap = 0;

    if (dir == NULL) {
        char msg[512];
        snprintf(msg, sizeof(msg), "cannot read the policy directory %s: %s", s->dir,
                 strerror(errno));
        s->dir_error = strdup(msg);
        return;
    }
    while ((de = readdir(dir)) != NULL) {
        size_t nl = strlen(de->d_name);
        struct scan_file *f;
        char path[4096], err[512];
        char *src;
        size_t len = 0;
        const struct hub_policy_entry *old;

        if (nl < 5 || strcmp(de->d_name + nl - 4, ".lua") != 0 || de->d_name[0] == '.') {
            continue;
        }
        if (s->n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            struct scan_file *nf = realloc(s->files, sizeof(*nf) * ncap);
            if (nf == NULL) {
                break;
            }
            s->files = nf;
            cap = ncap;
        }
        f = &s->files[s->n++];
        memset(f, 0, sizeof(*f));
        if (!hub_policy_name_valid(de->d_name, nl - 4)) {
            snprintf(f->name, sizeof(f->name), "%.*s", (int)(nl - 4 > 64 ? 64 : nl - 4),
                     de->d_name);
            snprintf(err, sizeof(err), "%.200s: not a valid policy name ([A-Za-z0-9_-]{1,64}.lua)",
                     de->d_name);
            f->error = strdup(err);
            continue;
        }
        memcpy(f->name, de->d_name, nl - 4);
        f->name[nl - 4] = '\0';
        snprintf(path, sizeof(path), "%s/%s", s->dir, de->d_name);
        src = hub_read_file(path, &len);
        if (src == NULL || len > HUB_POLICY_FILE_MAX) {
            snprintf(err, sizeof(err), "%s.lua: %s", f->name,
                     src == NULL ? "cannot be read" : "larger than 1 MiB");
            f->error = strdup(err);
            free(src);
            continue;
        }
        policy_source_hash(src, len, f->hash);
        old = gen_entry(s->prev, f->name);
        /* unchanged: no policy and no error, gen_from_scan keeps the
         * previous generation's compiled version; changed: compiled below */
        if (old == NULL || old->policy == NULL || strcmp(old->policy->hash, f->hash) != 0) {
            f->src = src;
            f->len = len;
        } else {
            free(src);
        }
    }
    closedir(dir);
    scan_compile(s);
    if (s->n > 1) {
        qsort(s->files, s->n, sizeof(*s->files), name_cmp);
    }
}

/* Frees a scan and what it still owns: versions no generation took, the
 * messages, its hold on the previous generation.  Loop thread, or the
 * thread of a scan that never had a previous generation. */
static void scan_free(struct scan *s) {
    for (size_t i = 0; i < s->n; i++) {
        hub_policy_unref(s->files[i].policy);
        free(s->files[i].src);
        free(s->files[i].error);
    }
    free(s->files);
    free(s->dir_error);
    free(s->dir);
    hub_policy_gen_release(s->prev);
    free(s);
}

/* check-policies: a scan on the calling thread, reported file by file and
 * dropped (its versions have no pool: they are destroyed here). */
int hub_policy_check_dir(const char *dir, const struct hub_policy_limits *lim,
                         void (*report)(void *arg, const char *file, const char *message),
                         void *arg) {
    struct scan *s = calloc(1, sizeof(*s));
    int ok = 0;

    if (s == NULL || (s->dir = strdup(dir)) == NULL) {
        free(s);
        report(arg, dir, "out of memory");
        return -1;
    }
    s->lim = *lim;
    scan_dir(s);
    if (s->dir_error != NULL) {
        report(arg, dir, s->dir_error);
        scan_free(s);
        return -1;
    }
    for (size_t i = 0; i < s->n; i++) {
        char file[HUB_POLICY_NAME_MAX + 8];
        snprintf(file, sizeof(file), "%s.lua", s->files[i].name);
        if (s->files[i].error != NULL) {
            report(arg, file, s->files[i].error);
        } else {
            ok++;
        }
    }
    scan_free(s);
    return ok;
}

/* ---------------------------------------------------------- generations -- */

struct hub_policy *hub_policy_gen_find(const struct hub_policy_gen *gen, const char *name) {
    const struct hub_policy_entry *e = gen_entry(gen, name);
    return e != NULL ? e->policy : NULL;
}

uint64_t hub_policy_gen_number(const struct hub_policy_gen *gen) {
    return gen->number;
}

/* Frees a generation whose last reference is gone, dropping its hold on
 * each version (the last one of a version sends it to a policy thread). */
static void gen_free(struct hub_policy_gen *g) {
    for (size_t i = 0; i < g->n; i++) {
        hub_policy_unref(g->e[i].policy);
        free(g->e[i].error);
    }
    free(g->e);
    free(g);
}

void hub_policy_gen_release(struct hub_policy_gen *gen) {
    if (gen != NULL && --gen->refs == 0) {
        gen_free(gen);
    }
}

/*
 * Builds the next generation from a finished scan: new versions where a
 * file compiled, the previous version (with the new error) where it did not,
 * nothing for files that are gone.  New versions send their last unref to
 * pool (when not NULL).  Loop thread (touches refcounts).
 */
static struct hub_policy_gen *gen_from_scan(struct scan *s, uint64_t number,
                                            struct policy_pool *pool) {
    struct hub_policy_gen *g = calloc(1, sizeof(*g));
    int64_t now_ms = hub_unix_us() / 1000; /* a time of day, for GET /admin/policies */

    if (g == NULL || (s->n > 0 && (g->e = calloc(s->n, sizeof(*g->e))) == NULL)) {
        free(g);
        return NULL;
    }
    g->refs = 1;
    g->number = number;
    g->created_ms = now_ms;
    for (size_t i = 0; i < s->n; i++) {
        struct scan_file *f = &s->files[i];
        const struct hub_policy_entry *old = gen_entry(s->prev, f->name);
        struct hub_policy_entry *e = &g->e[g->n++];

        snprintf(e->name, sizeof(e->name), "%s", f->name);
        e->error = f->error;
        f->error = NULL;
        if (f->policy != NULL) {
            e->policy = f->policy;
            f->policy = NULL;
            if (pool != NULL) {
                e->policy->pool = pool;
                policy_pool_ref(pool);
            }
            e->loaded_gen = number;
            e->loaded_at_ms = now_ms;
        } else if (old != NULL && old->policy != NULL) {
            /* unchanged, or broken now: the previous version stays */
            e->policy = old->policy;
            hub_policy_ref(e->policy);
            e->loaded_gen = old->loaded_gen;
            e->loaded_at_ms = old->loaded_at_ms;
        }
    }
    return g;
}

/* -------------------------------------------------------------- registry -- */

/* Counters survive reloads: one row per policy name with errors or trips. */
struct policy_stat {
    struct policy_stat *next;
    char name[HUB_POLICY_NAME_MAX + 1];
    uint64_t count[HUB_POLICY_FN__COUNT][HUB_POLICY_STATUS__COUNT];
    uint64_t trips;
};

/* A POST /admin/policies/reload waiting for the generation it asked for. */
struct reload_waiter {
    struct reload_waiter *next;
    void (*cb)(void *arg, const char *json, double seconds);
    void *arg;
};

/* The registry: loop thread only (but the pool's own locks). */
struct hub_policies {
    uv_loop_t *loop;
    char *dir;
    struct hub_policy_limits lim;
    struct hub_policy_gen *current;
    uint64_t next_number;
    struct policy_stat *stats;
    uint64_t reloads[2]; /* ok, error */
    double last_reload_seconds;
    char *reload_error; /* why the last reload published nothing (the directory), or NULL */
    /* calls on the policy threads */
    struct policy_pool *pool;
    size_t calls_in_flight;            /* submitted and not yet completed */
    size_t dry_in_flight;              /* ... of them, the workbench's */
    struct hub_histogram wait_seconds; /* submitted → a thread took it */
    struct hub_histogram run_seconds;  /* run time on the thread */
    void (*on_trip)(void *arg, const char *policy, const char *tenant, int64_t until_ms,
                    const char *last_error);
    void *on_trip_arg;
    /* reload state: one scan on the threadpool at a time */
    uv_work_t work;
    struct scan *scan;
    int running;
    int again;                       /* requested while running: run once more */
    struct reload_waiter *waiting;   /* for the running reload */
    struct reload_waiter *next_wait; /* for the one after it */
    int freed;                       /* hub_policies_free called while running */
};

/* A scan of the registry's directory against the current generation
 * (held until the scan is freed, so that unchanged files reuse its
 * versions).  NULL when out of memory. */
static struct scan *scan_new(struct hub_policies *ps) {
    struct scan *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->dir = strdup(ps->dir)) == NULL) {
        free(s);
        return NULL;
    }
    s->lim = ps->lim;
    s->prev = ps->current;
    if (s->prev != NULL) {
        s->prev->refs++;
    }
    s->started_ns = hub_now_ns();
    return s;
}

/* One log line per file that failed to load (and for an unreadable
 * directory): at every reload, since the operator may be watching. */
static void log_scan_errors(const struct hub_policy_gen *g, const char *dir_error) {
    if (dir_error != NULL) {
        hub_log(HUB_WARN, "policies not loaded", HUB_LS("error", dir_error));
    }
    for (size_t i = 0; i < g->n; i++) {
        if (g->e[i].error != NULL) {
            hub_log(HUB_ERROR,
                    g->e[i].policy != NULL ? "policy failed to load; its previous version stays"
                                           : "policy failed to load",
                    HUB_LS("policy", g->e[i].name), HUB_LS("error", g->e[i].error));
        }
    }
}

static void trip_clear(struct hub_policy *p);

/* Publishes the scan as the next generation, and clears the trips of every
 * policy in it (a reload of its file).  A reload that could not read the
 * directory (gone while it is replaced, out of descriptors) publishes
 * nothing: the generation before stays, as a file that fails to compile
 * keeps its previous version.  At start there is none to keep, and a
 * directory that cannot be read is no policies.  Loop thread. */
static void publish(struct hub_policies *ps, struct scan *s) {
    struct hub_policy_gen *g;
    int failed = s->dir_error != NULL;
    size_t loaded = 0;

    ps->last_reload_seconds = (double)(hub_now_ns() - s->started_ns) / 1e9;
    free(ps->reload_error);
    ps->reload_error = NULL;
    if (s->dir_error != NULL && ps->current != NULL) {
        ps->reload_error = strdup(s->dir_error);
        ps->reloads[1]++;
        hub_log(HUB_ERROR, "policy reload failed; the loaded policies stay",
                HUB_LS("error", s->dir_error), HUB_LI("generation", ps->current->number));
        return;
    }
    g = gen_from_scan(s, ps->next_number, ps->pool);
    if (g == NULL) {
        ps->reloads[1]++;
        hub_log(HUB_ERROR, "policy reload failed: out of memory");
        return;
    }
    ps->next_number++;
    for (size_t i = 0; i < g->n; i++) {
        failed |= g->e[i].error != NULL;
        loaded += g->e[i].policy != NULL;
        if (g->e[i].policy != NULL) {
            trip_clear(g->e[i].policy);
        }
    }
    log_scan_errors(g, s->dir_error);
    ps->reloads[failed ? 1 : 0]++;
    hub_policy_gen_release(ps->current);
    ps->current = g;
    hub_log(failed ? HUB_WARN : HUB_INFO, "policies loaded", HUB_LI("generation", g->number),
            HUB_LI("policies", (int64_t)loaded), HUB_LI("files", (int64_t)g->n),
            HUB_LI("duration_us", (int64_t)(ps->last_reload_seconds * 1e6)));
}

/* ------------------------------------------------------------ tripping -- */

static int64_t now_unix_ms(void) {
    return hub_unix_us() / 1000;
}

/* The counters row of a policy name, made at first use (NULL out of
 * memory).  Names are valid policy names, so the label set stays bounded
 * by the files an operator ever installed. */
static struct policy_stat *stat_of(struct hub_policies *ps, const char *policy) {
    struct policy_stat *s;

    for (s = ps->stats; s != NULL && strcmp(s->name, policy) != 0; s = s->next) {
    }
    if (s == NULL) {
        if (!hub_policy_name_valid(policy, strlen(policy)) || (s = calloc(1, sizeof(*s))) == NULL) {
            return NULL;
        }
        snprintf(s->name, sizeof(s->name), "%s", policy);
        s->next = ps->stats;
        ps->stats = s;
    }
    return s;
}

/* 1 while a cool-down of p runs for the tenant whose owner is `owner`. */
static int trip_active(const struct hub_policy *p, uint64_t owner, int64_t now_ms) {
    return policy_trip_until(p, owner, now_ms) > 0;
}

/* The latest cool-down of p still running, any tenant's (0: none), and in
 * *n how many tenants' run (the version's counts as one).  For the
 * operator's views. */
static int64_t trip_latest(const struct hub_policy *p, int64_t now_ms, int *n) {
    int64_t latest = atomic_load(&p->all_until_ms);

    latest = latest > now_ms ? latest : 0;
    *n = latest > 0;
    for (int i = 0; i < POLICY_TRIP_SLOTS; i++) {
        int64_t until = atomic_load(&p->trip_tags[i].until_ms);
        if (atomic_load(&p->trip_tags[i].owner) != 0 && until > now_ms) {
            latest = until > latest ? until : latest;
            (*n)++;
        }
    }
    return latest;
}

/* Forgets p's failures and ends its cool-downs (a reload of its file). */
static void trip_clear(struct hub_policy *p) {
    atomic_store(&p->all_until_ms, 0);
    for (int i = 0; i < POLICY_TRIP_SLOTS; i++) {
        atomic_store(&p->trip_tags[i].owner, 0);
        atomic_store(&p->trip_tags[i].until_ms, 0);
        if (p->trips_of != NULL) {
            free(p->trips_of[i].fail_ms);
        }
    }
    free(p->trips_of);
    p->trips_of = NULL;
    free(p->trips_none.fail_ms);
    memset(&p->trips_none, 0, sizeof(p->trips_none));
}

/* Trips p for the tenant of slot i, or for every tenant (i < 0): its calls
 * are answered without running until the cool-down ends.  Counted, logged
 * once, and told to the on_trip hook (tenant NULL: every tenant). */
static void trip(struct hub_policies *ps, struct hub_policy *p, int i, int64_t now_ms) {
    int64_t until = now_ms + ps->lim.trip_cooldown_ms;
    struct policy_stat *st = stat_of(ps, p->name);
    const char *tenant = i >= 0 ? p->trips_of[i].tenant : NULL;
    char when[40];

    if (i >= 0) {
        atomic_store(&p->trip_tags[i].until_ms, until);
        p->trips_of[i].fail_n = 0; /* after the cool-down it takes fresh failures */
        p->trips_of[i].fail_at = 0;
    } else {
        atomic_store(&p->all_until_ms, until);
    }
    p->trips++;
    if (st != NULL) {
        st->trips++;
    }
    hub_rfc3339(until * 1000, 3, when, sizeof(when));
    hub_log(HUB_WARN,
            i >= 0 ? "policy tripped for a tenant: its calls for that tenant are answered "
                     "without running until the cool-down ends"
                   : "policy tripped for every tenant (every trip slot holds a cool-down): its "
                     "calls are answered without running until the cool-down ends",
            HUB_LS("policy", p->name), HUB_LS("hash", p->hash), HUB_LS("tenant", tenant),
            HUB_LI("failures", ps->lim.trip_failures), HUB_LI("window_ms", ps->lim.trip_window_ms),
            HUB_LI("cooldown_ms", ps->lim.trip_cooldown_ms), HUB_LS("until", when),
            HUB_LS("last_error", p->last_call_error));
    if (ps->on_trip != NULL) {
        ps->on_trip(ps->on_trip_arg, p->name, tenant, until, p->last_call_error);
    }
}

/*
 * The slot of the tenant's trip record, made when it has none (in a free
 * slot, else the one whose last failure is oldest among those with no
 * cool-down running); -1 when every slot holds a cool-down, or out of
 * memory (trips_of not made).
 */
static int trip_slot(struct hub_policy *p, const char *tenant, int64_t now_ms) {
    uint64_t owner = policy_trip_owner(tenant);
    int free_i = -1, old_i = -1, take;

    if (p->trips_of == NULL &&
        (p->trips_of = calloc(POLICY_TRIP_SLOTS, sizeof(*p->trips_of))) == NULL) {
        return -1;
    }
    for (int i = 0; i < POLICY_TRIP_SLOTS; i++) {
        uint64_t o = atomic_load(&p->trip_tags[i].owner);
        if (o == owner) {
            return i;
        }
        if (o == 0) {
            free_i = free_i < 0 ? i : free_i;
        } else if (atomic_load(&p->trip_tags[i].until_ms) <= now_ms &&
                   (old_i < 0 || p->trips_of[i].last_ms < p->trips_of[old_i].last_ms)) {
            old_i = i;
        }
    }
    take = free_i >= 0 ? free_i : old_i;
    if (take < 0) {
        return -1;
    }
    /* until first: a thread reading the new owner never sees the old
     * tenant's cool-down (none runs in a slot that is taken anyway) */
    atomic_store(&p->trip_tags[take].until_ms, 0);
    atomic_store(&p->trip_tags[take].owner, owner);
    snprintf(p->trips_of[take].tenant, sizeof(p->trips_of[take].tenant), "%s",
             tenant != NULL ? tenant : "");
    p->trips_of[take].fail_n = 0;
    p->trips_of[take].fail_at = 0;
    return take;
}

/* Counts a failure at now in t's ring; 1 when it is the trip_failures-th
 * within trip_window_ms (0 too when the ring cannot be made). */
static int trip_count(const struct hub_policies *ps, struct policy_trip *t, int64_t now) {
    int n = ps->lim.trip_failures;

    if (t->fail_ms == NULL && (t->fail_ms = calloc((size_t)n, sizeof(int64_t))) == NULL) {
        return 0;
    }
    t->last_ms = now;
    t->fail_ms[t->fail_at] = now;
    t->fail_at = (t->fail_at + 1) % n;
    t->fail_n += t->fail_n < n;
    /* full: fail_at is now the oldest of the last n */
    return t->fail_n == n && now - t->fail_ms[t->fail_at % n] <= ps->lim.trip_window_ms;
}

/*
 * Records a call of p for `tenant` stopped for time or memory (err: its
 * message): trips p for that tenant when it is the tenant's trip_failures-th
 * within trip_window_ms.  The tenants that find no slot (every one holds a
 * cool-down) count together, in one record: their trip_failures-th within
 * the window trips p for every tenant.  Calls that were already running
 * when it tripped do not count toward the next trip.
 */
static void trip_note(struct hub_policies *ps, struct hub_policy *p, const char *tenant,
                      const char *err) {
    int64_t now = now_unix_ms();
    char *copy = strdup(err);
    int i;

    if (copy != NULL) {
        free(p->last_call_error);
        p->last_call_error = copy;
    }
    if (ps->lim.trip_failures <= 0 || trip_active(p, policy_trip_owner(tenant), now)) {
        return;
    }
    if ((i = trip_slot(p, tenant, now)) >= 0) {
        if (trip_count(ps, &p->trips_of[i], now)) {
            trip(ps, p, i, now);
        }
    } else if (p->trips_of != NULL && trip_count(ps, &p->trips_none, now)) {
        p->trips_none.fail_n = 0; /* after the cool-down it takes fresh failures */
        p->trips_none.fail_at = 0;
        trip(ps, p, -1, now);
    }
}

/* The answer of a call of a tripped policy: what happened and until when. */
static void trip_message(const struct hub_policies *ps, struct hub_policy_call *c) {
    char when[40];
    int64_t now = now_unix_ms();
    int64_t until = policy_trip_until(c->policy, policy_trip_owner(c->ev.tenant), now);

    /* 0: the cool-down ended (or a reload cleared it) since a thread
     * found it running */
    if (until > 0) {
        hub_rfc3339(until * 1000, 3, when, sizeof(when));
    } else {
        snprintf(when, sizeof(when), "moments ago");
    }
    snprintf(c->err, sizeof(c->err),
             "%s: %s.lua: tripped until %s after %d timeouts or memory stops within %lld ms; "
             "not run. Last: %s",
             hub_policy_fn_str(c->fn), c->policy->name, when, ps->lim.trip_failures,
             (long long)ps->lim.trip_window_ms,
             c->policy->last_call_error != NULL ? c->policy->last_call_error : "(none)");
}

/* ---------------------------------------------------------------- calls -- */

static void registry_free(struct hub_policies *ps);

/* A call finished on a policy thread (loop thread): timed, noted for
 * tripping, and handed to its caller. */
static void call_done(void *arg, struct hub_policy_call *c) {
    struct hub_policies *ps = arg;

    ps->calls_in_flight--;
    hub_histogram_observe(&ps->wait_seconds, (double)(c->started_ns - c->queued_ns) / 1e9);
    hub_histogram_observe(&ps->run_seconds, (double)(c->ended_ns - c->started_ns) / 1e9);
    if (c->run != NULL) {
        /* a dry-run: never counted toward a trip */
        ps->dry_in_flight--;
        c->cb(c);
        if (ps->freed && ps->calls_in_flight == 0 && !ps->running) {
            registry_free(ps); /* hub_policies_free came meanwhile */
        }
        return;
    }
    if (c->status == HUB_POLICY_TIMEOUT || c->status == HUB_POLICY_NOMEM) {
        trip_note(ps, c->policy, c->ev.tenant, c->err);
    } else if (c->shaped_ahead &&
               (c->shape_status == HUB_POLICY_TIMEOUT || c->shape_status == HUB_POLICY_NOMEM)) {
        trip_note(ps, c->policy, c->ev.tenant, c->err);
    } else if (c->status == HUB_POLICY_TRIPPED) {
        trip_message(ps, c);
    }
    c->cb(c);
}

int hub_policies_submit(struct hub_policies *ps, struct hub_policy_call *c) {
    const struct policy_defs *defs = &c->policy->defs;
    int runs = defs->has_fn[c->fn] && !(c->fn == HUB_POLICY_RETRY && defs->n_schedule > 0);

    /* the neutral answers, as the synchronous functions give them */
    c->status = HUB_POLICY_OK;
    c->err[0] = '\0';
    c->matched = 1;
    c->shaped_ahead = 0;
    c->shape_status = HUB_POLICY_OK;
    c->action = HUB_POLICY_RETRY_SCHEDULE;
    c->delay_ms = 0;
    hub_policy_shaped_reset(&c->shaped);
    c->queued_ns = c->started_ns = c->ended_ns = 0;
    c->cpu_ns = 0;
    if (!runs) {
        return 1;
    }
    /* a tripped policy's calls never reach the queue: they would wait
     * their turn only to be answered the same way */
    if (trip_active(c->policy, policy_trip_owner(c->ev.tenant), now_unix_ms())) {
        c->status = HUB_POLICY_TRIPPED;
        trip_message(ps, c);
        return 1;
    }
    ps->calls_in_flight++;
    policy_pool_submit(ps->pool, c);
    return 0;
}

int hub_policies_submit_dry(struct hub_policies *ps, struct hub_policy_call *c) {
    if (ps->dry_in_flight >= HUB_POLICY_DRY_MAX) {
        return HUB_EAGAIN;
    }
    c->status = HUB_POLICY_OK;
    c->err[0] = '\0';
    c->queued_ns = c->started_ns = c->ended_ns = 0;
    c->cpu_ns = 0;
    ps->calls_in_flight++;
    ps->dry_in_flight++;
    policy_pool_submit(ps->pool, c);
    return 0;
}

size_t hub_policies_dry_room(const struct hub_policies *ps) {
    return ps->dry_in_flight < HUB_POLICY_DRY_MAX ? HUB_POLICY_DRY_MAX - ps->dry_in_flight : 0;
}

struct hub_policy_limits hub_policies_limits(const struct hub_policies *ps) {
    return ps->lim;
}

void hub_policies_on_trip(struct hub_policies *ps,
                          void (*cb)(void *arg, const char *policy, const char *tenant,
                                     int64_t until_ms, const char *last_error),
                          void *arg) {
    ps->on_trip = cb;
    ps->on_trip_arg = arg;
}

struct hub_policy_limits hub_policy_limits_from(const struct hub_config *cfg) {
    return (struct hub_policy_limits){
        .timeout_ms = cfg->policy_timeout_ms,
        .memory_bytes = (size_t)cfg->policy_memory_bytes,
        .threads = (int)cfg->policy_threads,
        .trip_failures = (int)cfg->policy_trip_failures,
        .trip_window_ms = cfg->policy_trip_window_ms,
        .trip_cooldown_ms = cfg->policy_trip_cooldown_ms,
    };
}

struct hub_policies *hub_policies_new(uv_loop_t *loop, const char *dir,
                                      const struct hub_policy_limits *lim) {
    struct hub_policies *ps = calloc(1, sizeof(*ps));
    struct scan *s;

    if (ps == NULL || (ps->dir = strdup(dir != NULL ? dir : "./policies")) == NULL) {
        free(ps);
        return NULL;
    }
    ps->loop = loop;
    ps->lim = *lim;
    ps->next_number = 1;
    ps->work.data = ps;
    ps->pool = policy_pool_new(loop, lim->threads, call_done, ps);
    if (ps->pool == NULL) {
        free(ps->dir);
        free(ps);
        return NULL;
    }
    s = scan_new(ps);
    if (s == NULL) {
        hub_policies_free(ps);
        return NULL;
    }
    scan_dir(s);
    publish(ps, s);
    scan_free(s);
    if (ps->current == NULL) {
        hub_policies_free(ps);
        return NULL;
    }
    return ps;
}

/* Frees the registry once no reload runs: the current generation, the
 * threads (after the versions only it held were destroyed on them), the
 * counters and any reload waiters left. */
static void registry_free(struct hub_policies *ps) {
    /* the versions only this generation held go to the threads, which
     * destroy them before they stop */
    hub_policy_gen_release(ps->current);
    if (ps->pool != NULL) {
        policy_pool_stop(ps->pool);
    }
    while (ps->stats != NULL) {
        struct policy_stat *n = ps->stats->next;
        free(ps->stats);
        ps->stats = n;
    }
    for (struct reload_waiter *w = ps->waiting, *n; w != NULL; w = n) {
        n = w->next;
        free(w);
    }
    for (struct reload_waiter *w = ps->next_wait, *n; w != NULL; w = n) {
        n = w->next;
        free(w);
    }
    free(ps->reload_error);
    free(ps->dir);
    free(ps);
}

void hub_policies_free(struct hub_policies *ps) {
    if (ps == NULL) {
        return;
    }
    if (ps->running || ps->dry_in_flight > 0) {
        /* reload_after, or the last dry-run call's completion, frees it:
         * a dry-run outlives the request that asked for it */
        ps->freed = 1;
        return;
    }
    registry_free(ps);
}

struct hub_policy_gen *hub_policies_acquire(struct hub_policies *ps) {
    ps->current->refs++;
    return ps->current;
}

/* The threadpool's part of a reload: the scan alone (it touches nothing
 * else of the registry). */
static void reload_work(uv_work_t *w) {
    struct hub_policies *ps = w->data;
    scan_dir(ps->scan);
}

static void reload_start(struct hub_policies *ps);

/* Back on the loop after a scan: publishes it (or frees everything, when
 * hub_policies_free came meanwhile), answers the waiters with the new
 * generation's JSON and starts the coalesced reload that was asked for
 * during this one. */
static void reload_after(uv_work_t *w, int status) {
    struct hub_policies *ps = w->data;
    struct reload_waiter *waiters = ps->waiting;
    char *json = NULL;

    (void)status;
    ps->running = 0;
    ps->waiting = NULL;
    if (ps->freed) {
        scan_free(ps->scan);
        ps->scan = NULL;
        while (waiters != NULL) {
            struct reload_waiter *n = waiters->next;
            free(waiters);
            waiters = n;
        }
        if (ps->dry_in_flight == 0) {
            registry_free(ps);
        }
        return;
    }
    publish(ps, ps->scan);
    scan_free(ps->scan);
    ps->scan = NULL;
    if (waiters != NULL) {
        json = hub_policies_json(ps);
    }
    while (waiters != NULL) {
        struct reload_waiter *n = waiters->next;
        waiters->cb(waiters->arg, json, ps->last_reload_seconds);
        free(waiters);
        waiters = n;
    }
    free(json);
    if (ps->again) {
        ps->again = 0;
        ps->waiting = ps->next_wait;
        ps->next_wait = NULL;
        reload_start(ps);
    }
}

/* Starts a scan on the threadpool; when it cannot start, the reload fails
 * at once (counted, its waiters answered with NULL). */
static void reload_start(struct hub_policies *ps) {
    ps->scan = scan_new(ps);
    if (ps->scan == NULL || uv_queue_work(ps->loop, &ps->work, reload_work, reload_after) != 0) {
        hub_log(HUB_ERROR, "policy reload could not start");
        if (ps->scan != NULL) {
            scan_free(ps->scan);
            ps->scan = NULL;
        }
        ps->reloads[1]++;
        for (struct reload_waiter *w = ps->waiting, *n; w != NULL; w = n) {
            n = w->next;
            w->cb(w->arg, NULL, 0);
            free(w);
        }
        ps->waiting = NULL;
        return;
    }
    ps->running = 1;
}

void hub_policies_reload(struct hub_policies *ps,
                         void (*cb)(void *arg, const char *json, double seconds), void *arg) {
    struct reload_waiter *w = NULL;

    if (cb != NULL && (w = calloc(1, sizeof(*w))) != NULL) {
        w->cb = cb;
        w->arg = arg;
    }
    if (ps->running) {
        /* coalesce: everyone who asks meanwhile shares the next run */
        ps->again = 1;
        if (w != NULL) {
            w->next = ps->next_wait;
            ps->next_wait = w;
        }
        return;
    }
    if (w != NULL) {
        w->next = ps->waiting;
        ps->waiting = w;
    }
    reload_start(ps);
}

int hub_policies_usable(struct hub_policies *ps, const char *name, const char **why) {
    const struct hub_policy_entry *e = gen_entry(ps->current, name);
    if (e != NULL && e->policy != NULL) {
        return 1;
    }
    *why = e != NULL && e->error != NULL ? e->error : "unknown policy";
    return 0;
}

/* Unix ms as an RFC 3339 JSON string (milliseconds). */
static json_t *ms_time(int64_t ms) {
    char buf[64];
    hub_rfc3339(ms * 1000, 3, buf, sizeof(buf));
    return json_string(buf);
}

/* A version's trip records for GET /admin/policies: state ("ok", or
 * "tripped" while a cool-down runs for any tenant), tripped_until (the
 * latest, null when none), tripped_tenants (each tenant in a cool-down and
 * until when; "*" for every tenant), trips (of this version, all tenants)
 * and last_call_error (the last timeout or memory stop, or null). */
static void policy_trip_json(const struct hub_policy *p, int64_t now_ms, json_t *o) {
    int n;
    int64_t latest = trip_latest(p, now_ms, &n), all = atomic_load(&p->all_until_ms);
    json_t *tenants = json_array();

    if (all > now_ms) {
        json_array_append_new(tenants,
                              json_pack("{s:s, s:o}", "tenant", "*", "until", ms_time(all)));
    }
    for (int i = 0; p->trips_of != NULL && i < POLICY_TRIP_SLOTS; i++) {
        int64_t until = atomic_load(&p->trip_tags[i].until_ms);
        if (atomic_load(&p->trip_tags[i].owner) != 0 && until > now_ms) {
            json_array_append_new(tenants, json_pack("{s:s, s:o}", "tenant", p->trips_of[i].tenant,
                                                     "until", ms_time(until)));
        }
    }
    json_object_set_new(o, "state", json_string(n > 0 ? "tripped" : "ok"));
    json_object_set_new(o, "tripped_until", n > 0 ? ms_time(latest) : json_null());
    json_object_set_new(o, "tripped_tenants", tenants);
    json_object_set_new(o, "trips", json_integer((json_int_t)p->trips));
    json_object_set_new(o, "last_call_error",
                        p->last_call_error ? json_string(p->last_call_error) : json_null());
}

char *hub_policies_json(struct hub_policies *ps) {
    const struct hub_policy_gen *g = ps->current;
    json_t *root = json_object(), *arr = json_array();
    int64_t now_ms = now_unix_ms();
    char *text;

    for (size_t i = 0; i < g->n; i++) {
        const struct hub_policy_entry *e = &g->e[i];
        json_t *o = json_object(), *fns = json_array();
        json_object_set_new(o, "name", json_string(e->name));
        if (e->policy != NULL) {
            for (int f = 0; f < HUB_POLICY_FN__COUNT; f++) {
                if (hub_policy_has(e->policy, (enum hub_policy_fn)f)) {
                    json_array_append_new(fns,
                                          json_string(hub_policy_fn_str((enum hub_policy_fn)f)));
                }
            }
            json_object_set_new(o, "hash", json_string(e->policy->hash));
            json_object_set_new(o, "loaded_at", ms_time(e->loaded_at_ms));
            json_object_set_new(o, "generation", json_integer((json_int_t)e->loaded_gen));
            json_object_set_new(o, "memory_bytes",
                                json_integer((json_int_t)hub_policy_memory(e->policy)));
            policy_trip_json(e->policy, now_ms, o);
        } else {
            json_object_set_new(o, "hash", json_null());
            json_object_set_new(o, "loaded_at", json_null());
            json_object_set_new(o, "generation", json_null());
        }
        json_object_set_new(o, "functions", fns);
        json_object_set_new(o, "last_error", e->error ? json_string(e->error) : json_null());
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "generation", json_integer((json_int_t)g->number));
    json_object_set_new(root, "loaded_at", ms_time(g->created_ms));
    json_object_set_new(root, "reload_seconds", json_real(ps->last_reload_seconds));
    json_object_set_new(root, "reload_error",
                        ps->reload_error ? json_string(ps->reload_error) : json_null());
    json_object_set_new(root, "dir", json_string(ps->dir));
    json_object_set_new(root, "policies", arr);
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

void hub_policies_count_error(struct hub_policies *ps, const char *policy, enum hub_policy_fn fn,
                              enum hub_policy_status status) {
    struct policy_stat *s;

    if (ps == NULL || status == HUB_POLICY_OK || fn >= HUB_POLICY_FN__COUNT ||
        status >= HUB_POLICY_STATUS__COUNT || (s = stat_of(ps, policy)) == NULL) {
        return;
    }
    s->count[fn][status]++;
}

/* The metrics of the policy threads and of tripping. */
static void metrics_render_calls(const struct hub_policies *ps, FILE *out) {
    int64_t now = now_unix_ms();
    long long tripped = 0;

    fprintf(out, "# HELP streaming_hub_policy_trips_total Times a policy was tripped (its calls "
                 "kept timing out or running out of memory).\n"
                 "# TYPE streaming_hub_policy_trips_total counter\n");
    for (const struct policy_stat *s = ps ? ps->stats : NULL; s != NULL; s = s->next) {
        if (s->trips > 0) {
            fprintf(out, "streaming_hub_policy_trips_total{policy=\"%s\"} %llu\n", s->name,
                    (unsigned long long)s->trips);
        }
    }
    for (size_t i = 0; ps != NULL && ps->current != NULL && i < ps->current->n; i++) {
        const struct hub_policy *p = ps->current->e[i].policy;
        int n = 0;
        tripped += p != NULL && trip_latest(p, now, &n) > 0;
    }
    fprintf(out,
            "# HELP streaming_hub_policies_tripped Policies of the current generation in their "
            "cool-down.\n# TYPE streaming_hub_policies_tripped gauge\n"
            "streaming_hub_policies_tripped %lld\n"
            "# HELP streaming_hub_policy_threads Threads that run policy calls.\n"
            "# TYPE streaming_hub_policy_threads gauge\nstreaming_hub_policy_threads %d\n"
            "# HELP streaming_hub_policy_calls_in_flight Policy calls submitted and not yet "
            "answered.\n# TYPE streaming_hub_policy_calls_in_flight gauge\n"
            "streaming_hub_policy_calls_in_flight %zu\n"
            "# HELP streaming_hub_policy_calls_queued Policy calls waiting for a thread.\n"
            "# TYPE streaming_hub_policy_calls_queued gauge\nstreaming_hub_policy_calls_queued "
            "%zu\n",
            tripped, ps && ps->pool ? policy_pool_threads(ps->pool) : 0,
            ps ? ps->calls_in_flight : 0, ps && ps->pool ? policy_pool_queued(ps->pool) : 0);
    if (ps != NULL) {
        hub_histogram_render(out, "streaming_hub_policy_queue_seconds",
                             "Time a policy call waited for a policy thread.", &ps->wait_seconds);
        hub_histogram_render(out, "streaming_hub_policy_call_seconds",
                             "Time a policy call ran on its thread (wall clock).",
                             &ps->run_seconds);
    }
}

void hub_policies_metrics_render(const struct hub_policies *ps, FILE *out) {
    metrics_render_calls(ps, out);
    fprintf(out, "# HELP streaming_hub_policy_errors_total Policy calls that failed or were "
                 "stopped, by policy, function and kind.\n"
                 "# TYPE streaming_hub_policy_errors_total counter\n");
    for (const struct policy_stat *s = ps ? ps->stats : NULL; s != NULL; s = s->next) {
        for (int f = 0; f < HUB_POLICY_FN__COUNT; f++) {
            for (int k = 1; k < HUB_POLICY_STATUS__COUNT; k++) {
                if (s->count[f][k] > 0) {
                    fprintf(out,
                            "streaming_hub_policy_errors_total{policy=\"%s\",function=\"%s\","
                            "kind=\"%s\"} %llu\n",
                            s->name, hub_policy_fn_str((enum hub_policy_fn)f),
                            hub_policy_status_str((enum hub_policy_status)k),
                            (unsigned long long)s->count[f][k]);
                }
            }
        }
    }
    fprintf(out,
            "# HELP streaming_hub_policy_reloads_total Policy reloads, by result (error: some "
            "file failed and kept its previous version, or the directory could not be read "
            "and every policy did).\n"
            "# TYPE streaming_hub_policy_reloads_total counter\n"
            "streaming_hub_policy_reloads_total{result=\"ok\"} %llu\n"
            "streaming_hub_policy_reloads_total{result=\"error\"} %llu\n"
            "# HELP streaming_hub_policy_generation The policy generation in use.\n"
            "# TYPE streaming_hub_policy_generation gauge\n"
            "streaming_hub_policy_generation %llu\n",
            (unsigned long long)(ps ? ps->reloads[0] : 0),
            (unsigned long long)(ps ? ps->reloads[1] : 0),
            (unsigned long long)(ps && ps->current ? ps->current->number : 0));
}
