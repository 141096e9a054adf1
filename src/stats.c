/*
 * stats — the in-memory counts and their flush (see stats.h).
 *
 * The table: a chained hash of entries keyed by (tenant, hour, source,
 * event type), plus one "anchor" entry per (tenant, hour) that counts the
 * keys that tenant has in that hour (the cap).  An entry that gains a
 * count while it has none joins the dirty list; a flush takes the dirty
 * entries' counts into a batch (copied: the entries are zeroed and may be
 * counted into again at once) and writes the batch with one upsert.
 * Entries stay for their hour, so the cap holds across flushes; once the
 * hour is over, a sweep frees those with nothing left to write.
 */
#include "stats.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "chains.h"
#include "hub.h"
#include "ingest.h"
#include "ingest_batch.h"
#include "log.h"
#include "pg.h"
#include "pg_array.h"
#include "sidecar.h"
#include "store_stats.h"
#include "util.h"

/* Distinct (source, event type) pairs one process keeps apart per tenant
 * and hour; more are counted under ("(other)", "(other)"). */
#define STATS_KEYS_PER_TENANT_HOUR 1000
/* Entries of the whole table at most (about 200 bytes each): past it, new
 * keys' counts are dropped (counted in stats_counts_lost). */
#define STATS_ENTRIES_MAX 200000
#define STATS_OTHER "(other)"
/* Tenants a Kafka record the parser refused may start entries for in one
 * hour, when nothing else started them: the tenant such a record claims is
 * unchecked (the roster never saw it), and made-up ids, one per record,
 * would fill the table every tenant's counts share. */
#define STATS_CLAIMED_TENANTS_HOUR 1000
#define STATS_SLOTS_MIN 1024
/* How long a clean stop waits for its last write. */
#define STATS_STOP_MS 2000
#define STATS_PURGE_MS (3600 * 1000)

struct entry {
    struct hub_chain link; /* first: the table's chain and the key's hash */
    struct entry *dirty;   /* next entry of the dirty list */
    int64_t hour;          /* Unix hours */
    int64_t c[HUB_STAT__COUNT];
    int is_dirty;
    int anchor;             /* the (tenant, hour) entry counting its keys */
    uint32_t keys;          /* anchor only */
    const char *source;     /* into text; NULL for an anchor */
    const char *event_type; /* into text */
    char text[];            /* tenant \0 source \0 event_type \0 */
};

/* One write in flight: copies of the rows it carries. */
struct flush {
    struct hub_stats *s;
    size_t n;
    struct flush_row {
        char *tenant, *source, *event_type; /* one allocation, tenant first */
        int64_t hour;
        int64_t c[HUB_STAT__COUNT];
    } * rows;
};

struct hub_stats {
    struct hub *hub; /* NULL once stopping */
    /* one connection; timer 0 flushes (then is the stop's deadline), timer 1
     * purges */
    struct hub_sidecar side;
    struct hub_chain **slots; /* each chain's entries are struct entry */
    size_t nslots;
    size_t count;
    struct entry *dirty; /* entries with counts to write */
    int64_t swept_hour;  /* entries of hours before it are gone unless dirty */
    int flushing;        /* a write is in flight */
    int stopping;
    int64_t claimed_hour;        /* the hour claimed_new counts in */
    int claimed_new;             /* tenants started by unchecked claims then */
    struct hub_metrics *metrics; /* the hub's: it outlives the pool's last callback */
};

static const char *const stat_names[HUB_STAT__COUNT] = {"accepted", "duplicates", "quarantined",
                                                        "dropped",  "delivered",  "delayed",
                                                        "retried",  "dead",       "replayed"};

const char *hub_stat_name(enum hub_stat which) {
    return stat_names[which];
}

/* ------------------------------------------------------------ the table -- */

/* The hash of a key; source NULL hashes the (tenant, hour) anchor.  A
 * separator byte keeps ("ab", "c") apart from ("a", "bc"). */
static uint64_t key_hash(const char *tenant, int64_t hour, const char *source,
                         const char *event_type) {
    static const unsigned char sep = 0xff;
    uint64_t h = hub_fnv1a(HUB_FNV1A_BASIS, tenant, strlen(tenant));

    h = hub_fnv1a(hub_fnv1a(h, &sep, 1), &hour, sizeof(hour));
    if (source == NULL) {
        return h; /* the anchor */
    }
    h = hub_fnv1a(hub_fnv1a(h, source, strlen(source)), &sep, 1);
    return hub_fnv1a(h, event_type, strlen(event_type));
}

/* The entry of the key, or NULL.  source NULL looks for the anchor. */
static struct entry *lookup(struct hub_stats *s, uint64_t h, const char *tenant, int64_t hour,
                            const char *source, const char *event_type) {
    for (struct entry *e = (struct entry *)s->slots[h & (s->nslots - 1)]; e != NULL;
         e = (struct entry *)e->link.next) {
        if (e->link.hash == h && e->hour == hour && e->anchor == (source == NULL) &&
            strcmp(e->text, tenant) == 0 &&
            (source == NULL ||
             (strcmp(e->source, source) == 0 && strcmp(e->event_type, event_type) == 0))) {
            return e;
        }
    }
    return NULL;
}

/* A new entry for the key (source NULL: the anchor), or NULL. */
static struct entry *insert(struct hub_stats *s, uint64_t h, const char *tenant, int64_t hour,
                            const char *source, const char *event_type) {
    size_t lt = strlen(tenant) + 1;
    size_t ls = source != NULL ? strlen(source) + 1 : 0;
    size_t le = source != NULL ? strlen(event_type) + 1 : 0;
    struct entry *e;

    if (s->count >= STATS_ENTRIES_MAX || (e = calloc(1, sizeof(*e) + lt + ls + le)) == NULL) {
        return NULL;
    }
    if (s->count >= s->nslots * 2) {
        hub_chains_grow(&s->slots, &s->nslots); /* out of memory: longer chains */
    }
    memcpy(e->text, tenant, lt);
    if (source != NULL) {
        e->source = memcpy(e->text + lt, source, ls);
        e->event_type = memcpy(e->text + lt + ls, event_type, le);
    }
    e->anchor = source == NULL;
    e->link.hash = h;
    e->hour = hour;
    e->link.next = s->slots[h & (s->nslots - 1)];
    s->slots[h & (s->nslots - 1)] = &e->link;
    s->count++;
    return e;
}

/*
 * The entry counts of (tenant, hour, source, event_type) go to: the key's
 * own, or ("(other)", "(other)") once the tenant has
 * STATS_KEYS_PER_TENANT_HOUR keys in that hour.  NULL when memory or the
 * table's cap ran out.
 */
static struct entry *entry_for(struct hub_stats *s, const char *tenant, int64_t hour,
                               const char *source, const char *event_type) {
    uint64_t h = key_hash(tenant, hour, source, event_type);
    struct entry *e = lookup(s, h, tenant, hour, source, event_type);
    struct entry *anchor;
    uint64_t ha;

    if (e != NULL) {
        return e;
    }
    ha = key_hash(tenant, hour, NULL, NULL);
    anchor = lookup(s, ha, tenant, hour, NULL, NULL);
    if (anchor == NULL && (anchor = insert(s, ha, tenant, hour, NULL, NULL)) == NULL) {
        return NULL;
    }
    if (anchor->keys >= STATS_KEYS_PER_TENANT_HOUR) {
        source = event_type = STATS_OTHER;
        h = key_hash(tenant, hour, source, event_type);
        if ((e = lookup(s, h, tenant, hour, source, event_type)) != NULL) {
            return e;
        }
    }
    e = insert(s, h, tenant, hour, source, event_type);
    anchor->keys += e != NULL;
    return e;
}

/* Adds n to counter `which` of the key in `hour`. */
static void add_at(struct hub_stats *s, const char *tenant, int64_t hour, const char *source,
                   const char *event_type, enum hub_stat which, int64_t n) {
    struct entry *e =
        entry_for(s, tenant, hour, source ? source : "", event_type ? event_type : "");

    if (e == NULL) {
        s->metrics->stats_counts_lost += (uint64_t)n;
        return;
    }
    e->c[which] += n;
    if (!e->is_dirty) {
        e->is_dirty = 1;
        e->dirty = s->dirty;
        s->dirty = e;
    }
}

/* The Unix hour of the wall clock: the hour a count belongs to is the hour
 * its verdict or outcome was decided, not the event's time. */
static int64_t current_hour(void) {
    return hub_unix_us() / (3600LL * 1000000);
}

void hub_stats_add(struct hub_stats *s, const char *tenant, const char *source,
                   const char *event_type, enum hub_stat which, int64_t n) {
    if (s == NULL || tenant == NULL || n <= 0 || s->stopping) {
        return;
    }
    add_at(s, tenant, current_hour(), source, event_type, which, n);
}

/* Frees the entries of hours before the current one that have nothing
 * left to write (their anchors with them: a past hour takes no new keys). */
static void sweep(struct hub_stats *s, int64_t hour) {
    if (hour == s->swept_hour) {
        return;
    }
    s->swept_hour = hour;
    for (size_t i = 0; i < s->nslots; i++) {
        struct hub_chain **pp = &s->slots[i];
        while (*pp != NULL) {
            struct entry *e = (struct entry *)*pp;
            if (e->hour < hour && !e->is_dirty) {
                *pp = e->link.next;
                free(e);
                s->count--;
            } else {
                pp = &e->link.next;
            }
        }
    }
}

/* ------------------------------------------------------------ the hooks -- */

/* 1 when a refused record may count for the tenant it claims: over HTTP
 * the claim is the key's tenant; a Kafka record's counts when the tenant
 * has entries this hour, or while fewer than STATS_CLAIMED_TENANTS_HOUR
 * tenants were started so. */
static int claim_counts(struct hub_stats *s, const struct hub_ingest_rec *r, const char *tenant,
                        int64_t hour) {
    if (r->msg == NULL || lookup(s, key_hash(tenant, hour, NULL, NULL), tenant, hour, NULL, NULL)) {
        return 1;
    }
    if (s->claimed_hour != hour) {
        s->claimed_hour = hour;
        s->claimed_new = 0;
    }
    if (s->claimed_new >= STATS_CLAIMED_TENANTS_HOUR) {
        return 0;
    }
    s->claimed_new++;
    return 1;
}

void hub_stats_ingest(struct hub_stats *s, const struct hub_ingest_rec *recs, size_t n) {
    static const int map[HUB_V__COUNT] = {
        [HUB_V_ACCEPTED] = HUB_STAT_ACCEPTED,
        [HUB_V_DUPLICATE] = HUB_STAT_DUPLICATES,
        [HUB_V_DROPPED_UNKNOWN_TENANT] = -1, /* no tenant to count it for */
        [HUB_V_DROPPED_INACTIVE_TENANT] = HUB_STAT_DROPPED,
        [HUB_V_QUARANTINED_INVALID] = HUB_STAT_QUARANTINED,
        [HUB_V_QUARANTINED_CONFLICT] = HUB_STAT_QUARANTINED,
        [HUB_V_QUARANTINED_TOO_LARGE] = HUB_STAT_QUARANTINED,
        [HUB_V_QUARANTINED_SCHEMA] = HUB_STAT_QUARANTINED,
        [HUB_V_QUARANTINED_UNKNOWN_SCHEMA] = HUB_STAT_QUARANTINED,
    };
    int64_t hour = current_hour();

    if (s == NULL || s->stopping) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const struct hub_ingest_rec *r = &recs[i];
        /* a record the parser refused is quarantined, whatever its verdict
         * says (one whose headers could not be read keeps verdict 0) */
        int which = r->ok ? map[r->verdict] : HUB_STAT_QUARANTINED;
        if (which < 0) {
            continue;
        }
        if (r->ok) {
            add_at(s, r->ev.tenant, hour, r->ev.source, r->ev.event_type, (enum hub_stat)which, 1);
            continue;
        }
        /* refused by the parser: the tenant and source it claims (the
         * quarantine row's evidence), when it names one */
        struct hub_store_quarantine_row row;
        struct ingest_evidence ev;
        ingest_rec_evidence(r, &row, &ev);
        if (row.tenant_id != NULL && claim_counts(s, r, row.tenant_id, hour)) {
            add_at(s, row.tenant_id, hour, row.source, "", (enum hub_stat)which, 1);
        } else if (row.tenant_id != NULL) {
            s->metrics->stats_counts_lost++;
        }
        ingest_evidence_free(&ev);
    }
}

/*
 * The "source" attribute of stored attributes (jsonb's text form: members
 * as "name": value, so the pattern can only match the member itself; a
 * string's quotes inside values are escaped).  Returns it in buf (or a
 * malloc'd string in *owned when longer), or NULL when absent.
 */
static const char *attrs_source(const char *attrs, char *buf, size_t bufsz, char **owned) {
    static const char pat[] = "\"source\": \"";
    const char *p = attrs != NULL ? strstr(attrs, pat) : NULL;
    const char *q;
    size_t n;

    *owned = NULL;
    if (p == NULL) {
        return NULL;
    }
    p += sizeof(pat) - 1;
    for (q = p; *q != '\0' && *q != '"'; q++) {
        if (*q == '\\' && q[1] != '\0') {
            q++;
        }
    }
    n = (size_t)(q - p);
    if (memchr(p, '\\', n) != NULL) {
        /* escapes: let the JSON parser read the string literal */
        json_t *v = json_loadb(p - 1, n + 2, JSON_DECODE_ANY, NULL);
        *owned = json_is_string(v) ? strdup(json_string_value(v)) : NULL;
        json_decref(v);
        return *owned;
    }
    if (n >= bufsz) {
        return *owned = strndup(p, n);
    }
    memcpy(buf, p, n);
    buf[n] = '\0';
    return buf;
}

/* Adds 1 to `which` for a job, reading its source from attrs. */
static void add_job(struct hub_stats *s, const char *tenant, const char *attrs,
                    const char *event_type, enum hub_stat which) {
    char buf[512];
    char *owned;
    const char *source = attrs_source(attrs, buf, sizeof(buf), &owned);

    add_at(s, tenant, current_hour(), source, event_type, which, 1);
    free(owned);
}

void hub_stats_attempt(struct hub_stats *s, const char *tenant, const char *attrs,
                       const char *event_type, const char *state) {
    if (s == NULL || tenant == NULL || s->stopping) {
        return;
    }
    /* an attempt ends its job (delivered, dead) or sends it back to wait
     * for its retry: "pending" after an attempt is a failure to retry */
    if (strcmp(state, "succeeded") == 0) {
        add_job(s, tenant, attrs, event_type, HUB_STAT_DELIVERED);
    } else if (strcmp(state, "dead") == 0) {
        add_job(s, tenant, attrs, event_type, HUB_STAT_DEAD);
    } else if (strcmp(state, "pending") == 0) {
        add_job(s, tenant, attrs, event_type, HUB_STAT_RETRIED);
    }
}

void hub_stats_delayed(struct hub_stats *s, const char *tenant, const char *attrs,
                       const char *event_type) {
    if (s == NULL || tenant == NULL || s->stopping) {
        return;
    }
    add_job(s, tenant, attrs, event_type, HUB_STAT_DELAYED);
}

void hub_stats_replayed(struct hub_stats *s, const char *tenant, int64_t jobs) {
    hub_stats_add(s, tenant, "", "", HUB_STAT_REPLAYED, jobs);
}

/* ------------------------------------------------------------ the flush -- */

/* Frees a write and its row copies. */
static void flush_free(struct flush *f) {
    for (size_t i = 0; i < f->n; i++) {
        free(f->rows[i].tenant);
    }
    free(f->rows);
    free(f);
}

static int flush_send(struct hub_stats *s);
static void stop_deadline_cb(uv_timer_t *t);

/* A write ended.  Committed: done.  Not committed for sure and worth
 * another try (a transient statement error, never sent): its counts go back
 * for the next write.  Unknown (the connection dropped after sending):
 * dropped, so nothing counts twice.  Refused for what it holds (any other
 * statement error): dropped too, or the same rows would fail every write
 * from then on and no tenant's figures would be written again. */
static void flush_done(void *arg, const struct hub_pg_outcome *out) {
    struct flush *f = arg;
    struct hub_stats *s = f->s;

    s->flushing = 0;
    if (out->status == HUB_PG_OK) {
        s->metrics->stats_flushes++;
    } else {
        s->metrics->stats_flush_errors++;
        int refused = out->status == HUB_PG_ESTMT && !hub_pg_sqlstate_transient(out->sqlstate);
        if (out->status == HUB_PG_ECONN || refused || s->stopping) {
            for (size_t i = 0; i < f->n; i++) {
                for (int k = 0; k < HUB_STAT__COUNT; k++) {
                    s->metrics->stats_counts_lost += (uint64_t)f->rows[i].c[k];
                }
            }
        }
        if (out->status == HUB_PG_ECONN) {
            hub_log(HUB_WARN,
                    "per-tenant counts lost: the database connection dropped while "
                    "they were written (they are never written twice)",
                    HUB_LI("rows", (int64_t)f->n));
        } else if (refused) {
            hub_log(HUB_ERROR, "per-tenant counts lost: the database refused them",
                    HUB_LI("rows", (int64_t)f->n), HUB_LS("error", out->error));
        } else if (!s->stopping) {
            for (size_t i = 0; i < f->n; i++) {
                const struct flush_row *r = &f->rows[i];
                for (int k = 0; k < HUB_STAT__COUNT; k++) {
                    if (r->c[k] > 0) {
                        add_at(s, r->tenant, r->hour, r->source, r->event_type, (enum hub_stat)k,
                               r->c[k]);
                    }
                }
            }
            hub_log(HUB_WARN, "per-tenant counts not written; they go with the next write",
                    HUB_LS("error", out->error));
        }
    }
    flush_free(f);
    if (s->stopping && !s->side.closing && !flush_send(s)) {
        /* the last write is over: close from the timer, not from inside
         * the pool's own callback */
        uv_timer_start(&s->side.timer[0], stop_deadline_cb, 0, 0);
    }
}

/*
 * Takes the dirty entries' counts into one write and sends it.  Returns 1
 * when a write was sent, 0 when there was nothing to write or it could not
 * be built (the counts then stay in the table, or are lost on OOM).
 */
static int flush_send(struct hub_stats *s) {
    static const uint32_t oids[HUB_STATS_FLUSH_NPARAMS] = {
        HUB_OID_TEXT, HUB_OID_INT8, HUB_OID_TEXT, HUB_OID_TEXT, HUB_OID_INT8,
        HUB_OID_INT8, HUB_OID_INT8, HUB_OID_INT8, HUB_OID_INT8, HUB_OID_INT8,
        HUB_OID_INT8, HUB_OID_INT8, HUB_OID_INT8};
    struct hub_pgarr a[HUB_STATS_FLUSH_NPARAMS];
    struct hub_pg_txn *txn;
    struct flush *f;
    size_t n = 0;

    if (s->flushing || s->dirty == NULL) {
        return 0;
    }
    for (struct entry *e = s->dirty; e != NULL; e = e->dirty) {
        n++;
    }
    f = calloc(1, sizeof(*f));
    if (f == NULL || (f->rows = calloc(n, sizeof(*f->rows))) == NULL) {
        free(f);
        return 0; /* the counts wait in the table for the next tick */
    }
    f->s = s;
    for (int k = 0; k < HUB_STATS_FLUSH_NPARAMS; k++) {
        hub_pgarr_init(&a[k], oids[k]);
    }
    /* the batch takes the counts: the entries are clean again */
    while (s->dirty != NULL) {
        struct entry *e = s->dirty;
        struct flush_row *r = &f->rows[f->n];
        size_t lt = strlen(e->text) + 1, ls = strlen(e->source) + 1;
        s->dirty = e->dirty;
        e->dirty = NULL;
        e->is_dirty = 0;
        r->tenant = malloc(lt + ls + strlen(e->event_type) + 1);
        if (r->tenant == NULL) {
            for (int k = 0; k < HUB_STAT__COUNT; k++) {
                s->metrics->stats_counts_lost += (uint64_t)e->c[k];
            }
            memset(e->c, 0, sizeof(e->c));
            continue;
        }
        r->source = memcpy(r->tenant + lt, e->source, ls);
        r->event_type = strcpy(r->tenant + lt + ls, e->event_type);
        memcpy(r->tenant, e->text, lt);
        r->hour = e->hour;
        memcpy(r->c, e->c, sizeof(r->c));
        memset(e->c, 0, sizeof(e->c));
        hub_pgarr_add_text(&a[0], r->tenant);
        hub_pgarr_add_i64(&a[1], r->hour);
        hub_pgarr_add_text(&a[2], r->source);
        hub_pgarr_add_text(&a[3], r->event_type);
        for (int k = 0; k < HUB_STAT__COUNT; k++) {
            hub_pgarr_add_i64(&a[4 + k], r->c[k]);
        }
        f->n++;
    }
    txn = f->n > 0 ? hub_pg_txn_new(s->side.pg, flush_done, f) : NULL;
    if (txn == NULL) {
        for (int k = 0; k < HUB_STATS_FLUSH_NPARAMS; k++) {
            hub_pgarr_free(&a[k]);
        }
        /* put them back (the hour of each row is kept) */
        struct hub_pg_outcome never = {HUB_PG_ECLOSED, NULL, 0, "out of memory", ""};
        s->flushing = 1;
        flush_done(f, &never);
        return 0;
    }
    /* an array out of memory leaves the statement out: the transaction
     * then does nothing and the counts are dropped with it (counted) */
    if (hub_pgarr_txn_add(txn, &hub_sql_stats_flush, a, HUB_STATS_FLUSH_NPARAMS) != 0) {
        for (size_t i = 0; i < f->n; i++) {
            for (int k = 0; k < HUB_STAT__COUNT; k++) {
                s->metrics->stats_counts_lost += (uint64_t)f->rows[i].c[k];
            }
            memset(f->rows[i].c, 0, sizeof(f->rows[i].c));
        }
    }
    s->flushing = 1;
    hub_pg_txn_submit(txn);
    return 1;
}

/* Every STREAMING_HUB_STATS_FLUSH_INTERVAL: the entries of past hours go
 * once written, then the counts since the last write are sent (a write
 * still out skips this tick: its counts are the next one's). */
static void flush_tick(uv_timer_t *t) {
    struct hub_stats *s = t->data;

    sweep(s, current_hour());
    flush_send(s);
}

/* ------------------------------------------------------------ the purge -- */

/* The purge's outcome: only logged (the next hour tries again). */
static void purge_done(void *arg, const struct hub_pg_outcome *out) {
    (void)arg;
    if (out->status != HUB_PG_OK && out->status != HUB_PG_ECLOSED) {
        hub_log(HUB_WARN, "purge of expired per-tenant figures failed; retried in an hour",
                HUB_LS("error", out->error));
    }
}

/* Hourly (and once at start): the hours past STREAMING_HUB_STATS_RETENTION
 * go.  Every process runs it; a second run finds nothing to delete. */
static void purge_tick(uv_timer_t *t) {
    struct hub_stats *s = t->data;
    char retention[24];
    const char *params[HUB_SQL_STATS_PURGE_NPARAMS] = {retention};
    struct hub_pg_txn *txn = hub_pg_txn_new(s->side.pg, purge_done, s);

    if (txn == NULL) {
        return;
    }
    snprintf(retention, sizeof(retention), "%lld", (long long)s->hub->cfg.stats_retention_ms);
    hub_pg_txn_add(txn, &hub_sql_stats_purge, HUB_SQL_STATS_PURGE_NPARAMS, params, NULL, NULL);
    hub_pg_txn_submit(txn);
}

/* ------------------------------------------------------------ lifecycle -- */

void hub_stats_start(struct hub *hub) {
    struct hub_stats *s = calloc(1, sizeof(*s));

    if (s == NULL || (s->slots = calloc(STATS_SLOTS_MIN, sizeof(*s->slots))) == NULL) {
        free(s);
        hub_log(HUB_ERROR, "out of memory: per-tenant figures are not counted");
        return;
    }
    s->nslots = STATS_SLOTS_MIN;
    s->hub = hub;
    s->metrics = &hub->metrics;
    s->swept_hour = current_hour();
    if (hub_sidecar_open(&s->side, hub, "streaming-hub-stats", 2, s) != 0) {
        free(s->slots);
        free(s);
        hub_log(HUB_ERROR, "out of memory: per-tenant figures are not counted");
        return;
    }
    uv_timer_start(&s->side.timer[0], flush_tick, (uint64_t)hub->cfg.stats_flush_ms,
                   (uint64_t)hub->cfg.stats_flush_ms);
    uv_timer_start(&s->side.timer[1], purge_tick, 0, STATS_PURGE_MS);
    hub->stats = s;
}

/* The sidecar is closed: frees the table and the state. */
static void stats_closed(void *owner) {
    struct hub_stats *s = owner;

    hub_chains_free(s->slots, s->nslots);
    free(s);
}

/* Closes the timers and the pool (failing a write still out). */
static void stats_close(struct hub_stats *s) {
    hub_sidecar_close(&s->side, stats_closed);
}

/* The last write took too long (or is over: 0 ms): close, failing what is
 * still out; its counts are lost, never written twice. */
static void stop_deadline_cb(uv_timer_t *t) {
    stats_close(t->data);
}

void hub_stats_stop(struct hub *hub) {
    struct hub_stats *s = hub->stats;

    if (s == NULL) {
        return;
    }
    hub->stats = NULL;
    s->hub = NULL;
    s->stopping = 1;
    uv_timer_stop(&s->side.timer[1]);
    /* the last counts; with a write out, its callback sends them */
    if (!s->flushing && !flush_send(s)) {
        stats_close(s);
        return;
    }
    uv_timer_start(&s->side.timer[0], stop_deadline_cb, STATS_STOP_MS, 0);
}
