/*
 * policy_pool — the policy threads: a fair queue of calls, the threads that
 * run them, and the completions handed back to the loop (see policy.h,
 * policy_int.h).
 *
 * The queue is fair in two levels: tenants (the calls' ev.tenant) take
 * turns, and within a tenant its fairness keys (the subscriptions) do.
 * Each key is a FIFO of calls; each tenant with calls waiting is a group
 * holding a ring of its keys with calls waiting; the groups are a ring
 * too.  A free thread takes the first call of the first key of the group
 * at the head of the ring, then moves that key to the tail of its group's
 * ring and the group to the tail of the groups' ring.  So a call waits for
 * at most one call of each other tenant ahead of it, however many
 * subscriptions and calls that tenant has (with N threads, a tenant whose
 * calls all run into their deadline delays another tenant's call by at
 * most about one deadline per thread), and within its tenant for one call
 * of each other key.  A key or group leaves the hash and its ring when its
 * last call is taken.
 *
 * The loop's submissions of one turn are queued together when its
 * callbacks are done (pool_flush): one lock and one wake-up for a claim's
 * worth of calls.  A finished call goes on the done list; uv_async_send
 * wakes the loop, which runs the registry's completion for every call on
 * the list, oldest first.  While calls wait, the answers are announced in
 * batches (POOL_DONE_BATCH, or once the oldest has waited
 * POOL_DONE_WAIT_NS): a claim's worth of calls then costs the loop a few
 * wake-ups, not one per call, and its attempts start together.  Any thread
 * announces the list, and a thread that takes the queue's last call
 * announces before running it, so no answer waits behind a long call
 * while the other threads have nothing to do.
 *
 * The threads also destroy versions whose last reference went away (the
 * "graves"), so that closing a large Lua state never holds the loop; they
 * do that before taking the next call.
 *
 * Locks: mu guards the queue, the graves and the stop flag; done_mu the
 * done list (taken inside mu, never the other way).  No lock is held while
 * a call runs or a version is destroyed.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "policy_int.h"
#include "util.h"

#define POOL_BUCKETS 256   /* hash buckets of the keys with calls waiting */
#define POOL_KEY_MAX 64    /* longer keys are cut (subscription ids are 36) */
#define POOL_GROUP_MAX 256 /* a tenant id's longest */
#define POOL_STACK_BYTES (8u << 20)
#define POOL_DONE_BATCH 16          /* answers announced at once while calls wait */
#define POOL_DONE_WAIT_NS 200000ull /* ... or once the oldest has waited this long */

/* A tenant with calls waiting: the ring of its keys with calls waiting. */
struct pool_group {
    struct pool_group *hnext; /* hash chain */
    struct pool_group *rnext; /* ring of groups with calls waiting */
    struct pool_key *ring_head, *ring_tail;
    char name[POOL_GROUP_MAX + 1];
};

/* The calls of one key of a group waiting for a thread. */
struct pool_key {
    struct pool_key *hnext; /* hash chain */
    struct pool_key *rnext; /* its group's ring of keys with calls waiting */
    struct pool_group *group;
    struct hub_policy_call *head, *tail;
    char key[POOL_KEY_MAX + 1];
};

struct policy_pool {
    uv_loop_t *loop;
    uv_async_t async; /* wakes the loop for the done list */
    void (*done)(void *arg, struct hub_policy_call *call);
    void *arg;
    atomic_int refs; /* one per loop handle (until closed) and one per version */
    uv_thread_t *threads;
    int n_threads;

    uv_mutex_t mu;
    uv_cond_t cond;
    int stopping;
    int idle_threads; /* waiting on cond: a signal is only needed then */
    struct pool_key *buckets[POOL_BUCKETS];
    struct pool_group *groups[POOL_BUCKETS];
    struct pool_group *ring_head, *ring_tail;
    /* the group and key of calls whose own could not be allocated */
    struct pool_group overflow_group;
    struct pool_key overflow;
    size_t queued;
    struct hub_policy *graves; /* versions to destroy */

    /* Submissions of the current loop turn (loop thread only): queued at
     * once when its callbacks are done, before the loop polls or after
     * (prepare, check), one lock and one wake-up for all of them instead
     * of one each, which the threads then contended for. */
    uv_prepare_t prepare;
    uv_check_t check;
    struct hub_policy_call *sub_head, *sub_tail;
    size_t n_sub;

    uv_mutex_t done_mu;
    struct hub_policy_call *done_head, *done_tail;
    size_t unannounced;      /* answers on the list the loop has not been woken for */
    uint64_t unannounced_ns; /* when the oldest of them was added */
};

/* ------------------------------------------------------------- the queue -- */

/* The group record of a tenant, made (and hashed) when it has no calls
 * waiting; the overflow group out of memory.  Under mu. */
static struct pool_group *group_get(struct policy_pool *pool, const char *tenant) {
    char name[POOL_GROUP_MAX + 1];
    size_t b;
    struct pool_group *g;

    snprintf(name, sizeof(name), "%s", tenant != NULL ? tenant : "");
    b = (size_t)(hub_fnv1a_str(name) % POOL_BUCKETS);
    for (g = pool->groups[b]; g != NULL; g = g->hnext) {
        if (strcmp(g->name, name) == 0) {
            return g;
        }
    }
    if ((g = calloc(1, sizeof(*g))) == NULL) {
        /* out of memory: the call still runs, sharing a turn with others */
        return &pool->overflow_group;
    }
    memcpy(g->name, name, sizeof(name));
    g->hnext = pool->groups[b];
    pool->groups[b] = g;
    return g;
}

static size_t key_bucket(const struct pool_group *g, const char *key) {
    return (size_t)((hub_fnv1a_str(key) ^ (uintptr_t)g) % POOL_BUCKETS);
}

/* The record of key in group g, made (and hashed) when it has no calls
 * waiting; the overflow key (of the overflow group) out of memory.  Under
 * mu. */
static struct pool_key *key_get(struct policy_pool *pool, struct pool_group *g, const char *key) {
    char k[POOL_KEY_MAX + 1];
    size_t b;
    struct pool_key *pk;

    if (g == &pool->overflow_group) {
        return &pool->overflow;
    }
    snprintf(k, sizeof(k), "%s", key != NULL ? key : "");
    b = key_bucket(g, k);
    for (pk = pool->buckets[b]; pk != NULL; pk = pk->hnext) {
        if (pk->group == g && strcmp(pk->key, k) == 0) {
            return pk;
        }
    }
    if ((pk = calloc(1, sizeof(*pk))) == NULL) {
        return &pool->overflow;
    }
    memcpy(pk->key, k, sizeof(k));
    pk->group = g;
    pk->hnext = pool->buckets[b];
    pool->buckets[b] = pk;
    return pk;
}

/* Drops a key record whose last call was taken.  Under mu. */
static void key_drop(struct policy_pool *pool, struct pool_key *pk) {
    struct pool_key **pp;

    if (pk == &pool->overflow) {
        return;
    }
    for (pp = &pool->buckets[key_bucket(pk->group, pk->key)]; *pp != NULL; pp = &(*pp)->hnext) {
        if (*pp == pk) {
            *pp = pk->hnext;
            break;
        }
    }
    free(pk);
}

/* Drops a group record whose last key left its ring.  Under mu. */
static void group_drop(struct policy_pool *pool, struct pool_group *g) {
    struct pool_group **pp;

    if (g == &pool->overflow_group) {
        return;
    }
    for (pp = &pool->groups[hub_fnv1a_str(g->name) % POOL_BUCKETS]; *pp != NULL;
         pp = &(*pp)->hnext) {
        if (*pp == g) {
            *pp = g->hnext;
            break;
        }
    }
    free(g);
}

/* Puts pk at the tail of its group's ring: its next turn comes after
 * every key of the group already there.  Under mu. */
static void key_ring_push(struct pool_key *pk) {
    struct pool_group *g = pk->group;

    pk->rnext = NULL;
    if (g->ring_tail != NULL) {
        g->ring_tail->rnext = pk;
    } else {
        g->ring_head = pk;
    }
    g->ring_tail = pk;
}

/* Puts g at the tail of the ring of groups.  Under mu. */
static void group_ring_push(struct policy_pool *pool, struct pool_group *g) {
    g->rnext = NULL;
    if (pool->ring_tail != NULL) {
        pool->ring_tail->rnext = g;
    } else {
        pool->ring_head = g;
    }
    pool->ring_tail = g;
}

/* Takes the next call: the first of the first key of the group at the
 * head of the ring; the key's turn then passes to the next key of its
 * group, and the group's to the next group.  Under mu, with calls
 * waiting. */
static struct hub_policy_call *queue_pop(struct policy_pool *pool) {
    struct pool_group *g = pool->ring_head;
    struct pool_key *pk = g->ring_head;
    struct hub_policy_call *c = pk->head;

    pk->head = c->next;
    if (pk->head == NULL) {
        pk->tail = NULL;
    }
    c->next = NULL;
    g->ring_head = pk->rnext;
    if (g->ring_head == NULL) {
        g->ring_tail = NULL;
    }
    if (pk->head != NULL) {
        key_ring_push(pk);
    } else {
        key_drop(pool, pk);
    }
    pool->ring_head = g->rnext;
    if (pool->ring_head == NULL) {
        pool->ring_tail = NULL;
    }
    if (g->ring_head != NULL) {
        group_ring_push(pool, g);
    } else {
        group_drop(pool, g);
    }
    pool->queued--;
    return c;
}

/* Queues c under its tenant's group and its key (mu held).  A key or
 * group with nothing waiting is in no ring: it joins at the tail. */
static void queue_push(struct policy_pool *pool, struct hub_policy_call *c) {
    struct pool_group *g = group_get(pool, c->ev.tenant);
    struct pool_key *pk = key_get(pool, g, c->key);

    if (pk->group != g) { /* the overflow key: g, just made, holds nothing */
        if (g->ring_head == NULL) {
            group_drop(pool, g);
        }
        g = pk->group;
    }
    c->next = NULL;
    if (pk->head == NULL) {
        pk->head = c;
        if (g->ring_head == NULL) {
            group_ring_push(pool, g);
        }
        key_ring_push(pk);
    } else {
        pk->tail->next = c;
    }
    pk->tail = c;
    pool->queued++;
}

/* Queues the loop's submissions, in their order, under one lock, and wakes
 * as many idle threads as they need (one broadcast for all of them). */
static void pool_flush(struct policy_pool *pool) {
    struct hub_policy_call *c = pool->sub_head;
    size_t n = pool->n_sub;

    if (n == 0) {
        return;
    }
    pool->sub_head = pool->sub_tail = NULL;
    pool->n_sub = 0;
    uv_prepare_stop(&pool->prepare);
    uv_check_stop(&pool->check);
    uv_mutex_lock(&pool->mu);
    while (c != NULL) {
        struct hub_policy_call *next = c->next;
        queue_push(pool, c);
        c = next;
    }
    if (pool->idle_threads > 0 && n >= (size_t)pool->idle_threads) {
        uv_cond_broadcast(&pool->cond);
    } else if (pool->idle_threads > 0) {
        for (size_t i = 0; i < n; i++) { /* fewer calls than idle threads */
            uv_cond_signal(&pool->cond);
        }
    }
    uv_mutex_unlock(&pool->mu);
}

static void pool_prepare_cb(uv_prepare_t *h) {
    pool_flush(h->data);
}

static void pool_check_cb(uv_check_t *h) {
    pool_flush(h->data);
}

void policy_pool_submit(struct policy_pool *pool, struct hub_policy_call *c) {
    c->next = NULL;
    c->queued_ns = hub_now_ns();
    if (pool->sub_tail != NULL) {
        pool->sub_tail->next = c;
    } else {
        pool->sub_head = c;
        uv_prepare_start(&pool->prepare, pool_prepare_cb);
        uv_check_start(&pool->check, pool_check_cb);
    }
    pool->sub_tail = c;
    pool->n_sub++;
}

size_t policy_pool_queued(struct policy_pool *pool) {
    size_t n;
    uv_mutex_lock(&pool->mu);
    n = pool->queued;
    uv_mutex_unlock(&pool->mu);
    return n + pool->n_sub;
}

int policy_pool_threads(const struct policy_pool *pool) {
    return pool->n_threads;
}

/* ----------------------------------------------------------- the threads -- */

/* Runs one call on this thread, unless its policy was tripped after the
 * call was queued (the registry words the answer on the loop). */
static void pool_run(struct hub_policy_call *c) {
    int64_t until;

    c->started_ns = hub_now_ns();
    if (c->run != NULL) {
        /* the workbench: runs whether tripped or not (policy.h) */
        c->run(c);
        c->ended_ns = hub_now_ns();
        return;
    }
    until = policy_trip_until(c->policy, policy_trip_owner(c->ev.tenant), hub_unix_us() / 1000);
    if (until > 0) {
        c->status = HUB_POLICY_TRIPPED;
        c->err[0] = '\0';
    } else {
        policy_call_run(c);
    }
    c->ended_ns = hub_now_ns();
}

/*
 * Adds the answered call c (NULL: none) to the done list, and wakes the
 * loop for the answers it has not been woken for: at once when c is NULL
 * or no call waits (waiting 0), else once POOL_DONE_BATCH of them are held
 * or the oldest has waited POOL_DONE_WAIT_NS.  mu held.
 */
static void pool_done(struct policy_pool *pool, struct hub_policy_call *c, int waiting) {
    int announce;

    uv_mutex_lock(&pool->done_mu);
    if (c != NULL) {
        if (pool->done_tail != NULL) {
            pool->done_tail->next = c;
        } else {
            pool->done_head = c;
        }
        pool->done_tail = c;
        if (pool->unannounced++ == 0) {
            pool->unannounced_ns = c->ended_ns;
        }
    }
    announce =
        pool->unannounced > 0 && (c == NULL || !waiting || pool->unannounced >= POOL_DONE_BATCH ||
                                  c->ended_ns - pool->unannounced_ns >= POOL_DONE_WAIT_NS);
    if (announce) {
        pool->unannounced = 0;
    }
    uv_mutex_unlock(&pool->done_mu);
    if (announce) {
        uv_async_send(&pool->async);
    }
}

/*
 * A policy thread, until policy_pool_stop(): destroys the versions buried
 * meanwhile first (each holds Lua states, possibly large ones), else runs
 * the next call in turn and hands it to the loop through the done list,
 * else waits on cond.  It leaves only once the queue is empty, so no call
 * submitted before the stop is dropped.
 */
static void pool_thread(void *arg) {
    struct policy_pool *pool = arg;

    pthread_setname_np(pthread_self(), "hub-policy");
    uv_mutex_lock(&pool->mu);
    for (;;) {
        if (pool->graves != NULL) {
            struct hub_policy *p = pool->graves;
            pool->graves = p->grave_next;
            uv_mutex_unlock(&pool->mu);
            policy_destroy(p);
            uv_mutex_lock(&pool->mu);
        } else if (pool->ring_head != NULL) {
            struct hub_policy_call *c = queue_pop(pool);
            if (pool->ring_head == NULL) {
                pool_done(pool, NULL, 0); /* this call may be a long one */
            }
            uv_mutex_unlock(&pool->mu);
            pool_run(c);
            uv_mutex_lock(&pool->mu);
            pool_done(pool, c, pool->ring_head != NULL);
        } else if (pool->stopping) {
            break;
        } else {
            pool->idle_threads++;
            uv_cond_wait(&pool->cond, &pool->mu);
            pool->idle_threads--;
        }
    }
    uv_mutex_unlock(&pool->mu);
}

/* The loop's side of the done list: every finished call, oldest first, to
 * the registry.  A completion may submit the job's next call. */
static void pool_async_cb(uv_async_t *h) {
    struct policy_pool *pool = h->data;
    struct hub_policy_call *c;

    uv_mutex_lock(&pool->done_mu);
    c = pool->done_head;
    pool->done_head = pool->done_tail = NULL;
    pool->unannounced = 0;
    uv_mutex_unlock(&pool->done_mu);
    while (c != NULL) {
        struct hub_policy_call *next = c->next;
        c->next = NULL;
        pool->done(pool->arg, c); /* may free c */
        c = next;
    }
}

/* ------------------------------------------------------------ lifecycle -- */

static void pool_free(struct policy_pool *pool) {
    uv_cond_destroy(&pool->cond);
    uv_mutex_destroy(&pool->mu);
    uv_mutex_destroy(&pool->done_mu);
    free(pool->threads);
    free(pool);
}

void policy_pool_ref(struct policy_pool *pool) {
    atomic_fetch_add_explicit(&pool->refs, 1, memory_order_relaxed);
}

void policy_pool_unref(struct policy_pool *pool) {
    if (atomic_fetch_sub_explicit(&pool->refs, 1, memory_order_acq_rel) == 1) {
        pool_free(pool);
    }
}

struct policy_pool *policy_pool_new(uv_loop_t *loop, int threads,
                                    void (*done)(void *arg, struct hub_policy_call *call),
                                    void *arg) {
    struct policy_pool *pool = calloc(1, sizeof(*pool));
    uv_thread_options_t opt = {.flags = UV_THREAD_HAS_STACK_SIZE, .stack_size = POOL_STACK_BYTES};

    if (pool == NULL) {
        hub_log(HUB_ERROR, "policy threads: out of memory");
        return NULL;
    }
    if (threads <= 0) {
        threads = (int)uv_available_parallelism();
    }
    pool->loop = loop;
    pool->done = done;
    pool->arg = arg;
    pool->overflow.group = &pool->overflow_group;
    atomic_init(&pool->refs, 1); /* the async handle's */
    pool->threads = calloc((size_t)threads, sizeof(*pool->threads));
    if (pool->threads == NULL || uv_mutex_init(&pool->mu) != 0) {
        goto fail_threads;
    }
    if (uv_mutex_init(&pool->done_mu) != 0) {
        goto fail_mu;
    }
    if (uv_cond_init(&pool->cond) != 0) {
        goto fail_done_mu;
    }
    if (uv_async_init(loop, &pool->async, pool_async_cb) != 0) {
        goto fail_cond;
    }
    pool->async.data = pool;
    /* cannot fail on Unix; closed with the async handle (policy_pool_stop) */
    uv_prepare_init(loop, &pool->prepare);
    uv_check_init(loop, &pool->check);
    pool->prepare.data = pool->check.data = pool;
    atomic_fetch_add(&pool->refs, 2);
    for (int i = 0; i < threads; i++) {
        int rc = uv_thread_create_ex(&pool->threads[pool->n_threads], &opt, pool_thread, pool);
        if (rc != 0) {
            hub_log(HUB_WARN, "a policy thread could not start", HUB_LS("error", uv_strerror(rc)));
            continue;
        }
        pool->n_threads++;
    }
    if (pool->n_threads == 0) {
        hub_log(HUB_ERROR, "no policy thread could start");
        policy_pool_stop(pool);
        return NULL;
    }
    hub_log(HUB_INFO, "policy threads started", HUB_LI("threads", pool->n_threads));
    return pool;

fail_cond:
    uv_cond_destroy(&pool->cond);
fail_done_mu:
    uv_mutex_destroy(&pool->done_mu);
fail_mu:
    uv_mutex_destroy(&pool->mu);
fail_threads:
    free(pool->threads);
    free(pool);
    hub_log(HUB_ERROR, "policy threads: cannot make their queue (out of memory)");
    return NULL;
}

int policy_pool_bury(struct policy_pool *pool, struct hub_policy *p) {
    uv_mutex_lock(&pool->mu);
    if (pool->stopping) {
        uv_mutex_unlock(&pool->mu);
        return 0;
    }
    p->grave_next = pool->graves;
    pool->graves = p;
    if (pool->idle_threads > 0) {
        uv_cond_signal(&pool->cond);
    }
    uv_mutex_unlock(&pool->mu);
    return 1;
}

static void pool_handle_closed(uv_handle_t *h) {
    policy_pool_unref(h->data);
}

void policy_pool_stop(struct policy_pool *pool) {
    pool_flush(pool); /* the threads leave only once these ran too */
    uv_mutex_lock(&pool->mu);
    pool->stopping = 1;
    uv_cond_broadcast(&pool->cond);
    uv_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->n_threads; i++) {
        uv_thread_join(&pool->threads[i]);
    }
    /* every caller is gone (policy.h): nothing is queued, and a call that
     * finished after the loop's last look at the done list has nobody to
     * hear of it */
    uv_close((uv_handle_t *)&pool->async, pool_handle_closed);
    uv_close((uv_handle_t *)&pool->prepare, pool_handle_closed);
    uv_close((uv_handle_t *)&pool->check, pool_handle_closed);
}
