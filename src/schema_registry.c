/*
 * schema_registry — polled by generation, compiled off the loop, swapped in
 * as an immutable snapshot (see schema_registry.h).
 */
#include "schema_registry.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "error.h"
#include "hub.h"
#include "jschema.h"
#include "log.h"
#include "pg.h"
#include "sidecar.h"
#include "store_schemas.h"
#include "util.h"

/* One (scope, type) of a snapshot: its versions entries[start ..
 * start+count), ascending, and its setting. */
struct schema_group {
    char *key; /* scope "\x1f" type */
    size_t start, count;
    int unknown_quarantine; /* -1: no setting of this scope */
};

/*
 * A compiled schema shared by every snapshot whose entries have its digest:
 * a reload compiles only the texts no snapshot in use has compiled, not
 * every live row (a change of one version no longer costs every process a
 * compile of everything every tenant registered).
 */
struct schema_compiled {
    atomic_int refs; /* one per entry of each snapshot that uses it */
    char digest[65];
    struct hub_jschema *s;
};

struct hub_schema_set {
    atomic_int refs;
    uint64_t generation;
    struct hub_schema_entry *entries;
    struct schema_compiled **compiled; /* entries[i].compiled is compiled[i]->s */
    size_t n_entries;
    char **strings; /* scope and type texts the entries borrow */
    size_t n_strings;
    struct schema_group *groups;
    size_t n_groups;
    int32_t *slots; /* open addressing over groups, at most half full */
    size_t cap;
};

/* A waiter of hub_schemas_when_ready. */
struct schema_waiter {
    void (*cb)(void *arg);
    void *arg;
    struct schema_waiter *next;
};

struct hub_schemas {
    struct hub *hub;            /* NULL once stopping */
    struct hub_sidecar side;    /* timer 0: the poll */
    struct hub_schema_set *set; /* in use (a reference), or NULL: none registered */
    uint64_t generation;        /* of what is in use or being compiled */
    int ready;                  /* a first snapshot is in use */
    int busy;                   /* a poll, load or compile is under way */
    int poked;                  /* poll again once the current round ends */
    int failing;                /* polls are failing (logged once) */
    int closed;                 /* the sidecar is closed: the last one out frees reg */
    struct schema_waiter *waiters;
    /* hub_schemas_after_reload: for the next round, and the round under way */
    struct schema_waiter *pending, *round;
};

/* ------------------------------------------------------------ versions -- */

/* Parses one semver number at s: digits, no leading zero, at most 9 digits
 * (so it fits an int).  Returns the position after it with *out set, or
 * NULL when there is no such number. */
static const char *version_number(const char *s, int *out) {
    int v = 0;
    int n = 0;

    while (s[n] >= '0' && s[n] <= '9') {
        v = v * 10 + (s[n] - '0');
        if (++n > 9) {
            return NULL;
        }
    }
    if (n == 0 || (n > 1 && s[0] == '0')) {
        return NULL;
    }
    *out = v;
    return s + n;
}

int hub_schema_version_parse(const char *s, int *major, int *minor, int *patch) {
    if (s == NULL || strlen(s) >= HUB_SCHEMA_VERSION_MAX) {
        return HUB_EINVAL;
    }
    if ((s = version_number(s, major)) == NULL || *s++ != '.' ||
        (s = version_number(s, minor)) == NULL || *s++ != '.' ||
        (s = version_number(s, patch)) == NULL || *s != '\0') {
        return HUB_EINVAL;
    }
    return 0;
}

/* ----------------------------------------------------------- snapshots -- */

/* Frees a snapshot and everything it owns: the compiled schemas, the
 * texts its entries borrow, the groups.  Its last reference is gone (or it
 * was never published: a load that ran out of memory). */
static void compiled_release(struct schema_compiled *c) {
    if (c != NULL && atomic_fetch_sub(&c->refs, 1) == 1) {
        hub_jschema_free(c->s);
        free(c);
    }
}

static void set_free(struct hub_schema_set *set) {
    for (size_t i = 0; set->compiled != NULL && i < set->n_entries; i++) {
        compiled_release(set->compiled[i]);
    }
    free(set->compiled);
    for (size_t i = 0; i < set->n_strings; i++) {
        free(set->strings[i]);
    }
    for (size_t i = 0; i < set->n_groups; i++) {
        free(set->groups[i].key);
    }
    free(set->strings);
    free(set->entries);
    free(set->groups);
    free(set->slots);
    free(set);
}

void hub_schemas_release(struct hub_schema_set *set) {
    if (set != NULL && atomic_fetch_sub(&set->refs, 1) == 1) {
        set_free(set);
    }
}

uint64_t hub_schema_set_generation(const struct hub_schema_set *set) {
    return set->generation;
}

/* The hash of a group's key (scope, 0x1f, type): the separator cannot occur
 * in a tenant id or an event type, so ("a", "b.c") and ("a.b", "c") differ. */
static uint64_t group_hash(const char *scope, const char *type) {
    static const unsigned char sep = 0x1f;
    uint64_t h = hub_fnv1a(HUB_FNV1A_BASIS, scope, strlen(scope));

    h = hub_fnv1a(h, &sep, 1);
    return hub_fnv1a(h, type, strlen(type));
}

/* 1 when key is scope "\x1f" type. */
static int group_key_is(const char *key, const char *scope, const char *type) {
    size_t ls = strlen(scope);
    return strncmp(key, scope, ls) == 0 && key[ls] == 0x1f && strcmp(key + ls + 1, type) == 0;
}

/* The group of (scope, type), or NULL. */
static const struct schema_group *group_find(const struct hub_schema_set *set, const char *scope,
                                             const char *type) {
    size_t h;

    if (set->cap == 0) {
        return NULL;
    }
    h = (size_t)group_hash(scope, type) & (set->cap - 1);
    while (set->slots[h] >= 0) {
        const struct schema_group *g = &set->groups[set->slots[h]];
        if (group_key_is(g->key, scope, type)) {
            return g;
        }
        h = (h + 1) & (set->cap - 1);
    }
    return NULL;
}

/* The group of (scope, type), added when missing.  NULL on OOM. */
static struct schema_group *group_get(struct hub_schema_set *set, size_t max_groups,
                                      const char *scope, const char *type) {
    size_t h = (size_t)group_hash(scope, type) & (set->cap - 1);
    struct schema_group *g;
    size_t ls = strlen(scope);
    size_t lt = strlen(type);

    while (set->slots[h] >= 0) {
        g = &set->groups[set->slots[h]];
        if (group_key_is(g->key, scope, type)) {
            return g;
        }
        h = (h + 1) & (set->cap - 1);
    }
    if (set->n_groups >= max_groups) {
        return NULL;
    }
    g = &set->groups[set->n_groups];
    memset(g, 0, sizeof(*g));
    g->unknown_quarantine = -1;
    if ((g->key = malloc(ls + lt + 2)) == NULL) {
        return NULL;
    }
    memcpy(g->key, scope, ls);
    g->key[ls] = 0x1f;
    memcpy(g->key + ls + 1, type, lt + 1);
    set->slots[h] = (int32_t)set->n_groups++;
    return g;
}

/* An event's schemaversion names a stored version when they are equal once
 * the event's spelling drops a leading v and build metadata: v1.2.0 and
 * 1.2.0+b7 name 1.2.0 (SPEC §3.1 allows the v; build metadata does not
 * change precedence, and stored versions have none). */
static int version_names(const char *stored, const char *asked) {
    size_t n;

    if (*asked == 'v' || *asked == 'V') {
        asked++;
    }
    n = strcspn(asked, "+");
    return strlen(stored) == n && memcmp(stored, asked, n) == 0;
}

/* Among group g's versions of `major`: the exact version, else the highest. */
static const struct hub_schema_entry *group_pick(const struct hub_schema_set *set,
                                                 const struct schema_group *g, const char *version,
                                                 int major) {
    const struct hub_schema_entry *best = NULL;

    for (size_t i = g->start; i < g->start + g->count; i++) {
        const struct hub_schema_entry *e = &set->entries[i];
        if (e->major != major) {
            continue;
        }
        if (version != NULL && version_names(e->version, version)) {
            return e;
        }
        best = e; /* ascending: the last one seen is the highest */
    }
    return best;
}

enum hub_schema_pick hub_schema_set_pick(const struct hub_schema_set *set, const char *tenant,
                                         const char *event_type, const char *version, int major,
                                         const struct hub_schema_entry **entry) {
    const struct schema_group *gt = group_find(set, tenant, event_type);
    const struct schema_group *gp = group_find(set, "", event_type);
    const struct hub_schema_entry *e = NULL;
    int q;

    *entry = NULL;
    if ((gt == NULL || gt->count == 0) && (gp == NULL || gp->count == 0)) {
        return HUB_SCHEMA_NONE;
    }
    /* precedence per major: the tenant's versions of it hide the platform's */
    if (gt != NULL) {
        e = group_pick(set, gt, version, major);
    }
    if (e == NULL && gp != NULL) {
        e = group_pick(set, gp, version, major);
    }
    if (e != NULL) {
        *entry = e;
        return HUB_SCHEMA_CHECK;
    }
    q = gt != NULL && gt->unknown_quarantine >= 0   ? gt->unknown_quarantine
        : gp != NULL && gp->unknown_quarantine >= 0 ? gp->unknown_quarantine
                                                    : 0;
    return q ? HUB_SCHEMA_UNKNOWN_QUARANTINE : HUB_SCHEMA_UNKNOWN_ACCEPT;
}

/* ----------------------------------------------------------- the load -- */

/* One row of the load, copied off its PGresult for the compile thread. */
struct load_row {
    char *scope, *type, *schema;
    char version[HUB_SCHEMA_VERSION_MAX];
    char digest[65];
    int major, minor, patch;
};

struct load_setting {
    char *scope, *type;
    int quarantine;
};

/* A load on its way through the threadpool. */
struct schema_load {
    uv_work_t work;
    struct hub_schemas *reg;
    uint64_t generation;
    struct load_row *rows;
    size_t n_rows;
    struct load_setting *settings;
    size_t n_settings;
    struct hub_schema_set *set;  /* built by the thread; NULL on OOM */
    struct hub_schema_set *prev; /* a reference to the snapshot in use, or NULL */
    size_t refused;              /* schemas that did not compile */
    char refused_what[256];      /* the first one, for the log */
};

/* Frees a load's copied rows and the load (its snapshot has been handed on,
 * or released, by then). */
static void load_free(struct schema_load *ld) {
    for (size_t i = 0; i < ld->n_rows; i++) {
        free(ld->rows[i].scope);
        free(ld->rows[i].type);
        free(ld->rows[i].schema);
    }
    for (size_t i = 0; i < ld->n_settings; i++) {
        free(ld->settings[i].scope);
        free(ld->settings[i].type);
    }
    free(ld->rows);
    free(ld->settings);
    hub_schemas_release(ld->prev);
    free(ld);
}

/* The compiled schemas a load can reuse, by digest: open addressing over a
 * power-of-two table at most half full.  It holds no references: the load's
 * reference to the snapshot in use keeps that one's alive, and the new
 * snapshot's entries keep the new ones. */
struct compiled_table {
    struct schema_compiled **slots;
    size_t cap;
};

/* The slot of digest in t: its entry, or the empty slot where it goes. */
static struct schema_compiled **compiled_slot(struct compiled_table *t, const char *digest) {
    /* the digest is a hex SHA-256: its first 16 digits are hash enough */
    char head[17];
    snprintf(head, sizeof(head), "%.16s", digest);
    uint64_t h = strtoull(head, NULL, 16);
    for (size_t i = (size_t)h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        if (t->slots[i] == NULL || strcmp(t->slots[i]->digest, digest) == 0) {
            return &t->slots[i];
        }
    }
}

/*
 * The compiled schema of row r: the one a snapshot in use (or an earlier
 * row of this load) has for its digest, with a reference more, else a new
 * compile added to t.  Returns 0, or the compile's error.
 */
static int compiled_get(struct compiled_table *t, const struct load_row *r,
                        struct schema_compiled **out) {
    struct schema_compiled **slot = compiled_slot(t, r->digest);
    struct hub_jschema_error err;

    if (*slot != NULL) {
        atomic_fetch_add(&(*slot)->refs, 1);
        *out = *slot;
        return 0;
    }
    struct schema_compiled *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return HUB_ENOMEM;
    }
    json_t *doc = json_loads(r->schema, 0, NULL);
    int rc = doc != NULL ? hub_jschema_compile(doc, NULL, &c->s, &err) : HUB_EINVAL;
    json_decref(doc);
    if (rc != 0) {
        free(c);
        return rc;
    }
    atomic_init(&c->refs, 1); /* the entry's */
    snprintf(c->digest, sizeof(c->digest), "%s", r->digest);
    *slot = c;
    *out = c;
    return 0;
}

/*
 * The compile thread: every row's schema compiled (or taken from the
 * snapshot in use, or from an earlier row, when its digest is there) and
 * grouped by (scope, type) (rows come ordered so a group's versions are
 * contiguous and ascending), then the settings.  A row that does not
 * compile is left out.
 */
static void load_work(uv_work_t *w) {
    struct schema_load *ld = w->data;
    size_t max_groups = ld->n_rows + ld->n_settings;
    struct hub_schema_set *set = calloc(1, sizeof(*set));

    if (set == NULL) {
        return;
    }
    atomic_init(&set->refs, 1);
    set->generation = ld->generation;
    /* a power of two at least twice the groups: probes stay short and the
     * table never fills, so a lookup always ends on an empty slot */
    set->cap = 16;
    while (set->cap < max_groups * 2) {
        set->cap *= 2;
    }
    set->entries = calloc(ld->n_rows + 1, sizeof(*set->entries));
    set->compiled = calloc(ld->n_rows + 1, sizeof(*set->compiled));
    set->strings = calloc(ld->n_rows * 2 + 1, sizeof(*set->strings));
    set->groups = calloc(max_groups + 1, sizeof(*set->groups));
    set->slots = malloc(set->cap * sizeof(*set->slots));
    struct compiled_table known = {.cap = 16};
    size_t n_known = ld->n_rows + (ld->prev != NULL ? ld->prev->n_entries : 0);
    while (known.cap < n_known * 2) {
        known.cap *= 2;
    }
    known.slots = calloc(known.cap, sizeof(*known.slots));
    if (set->entries == NULL || set->compiled == NULL || set->strings == NULL ||
        set->groups == NULL || set->slots == NULL || known.slots == NULL) {
        free(known.slots);
        set_free(set);
        return;
    }
    memset(set->slots, 0xff, set->cap * sizeof(*set->slots));
    for (size_t i = 0; ld->prev != NULL && i < ld->prev->n_entries; i++) {
        struct schema_compiled **slot = compiled_slot(&known, ld->prev->compiled[i]->digest);
        *slot = ld->prev->compiled[i];
    }
    for (size_t i = 0; i < ld->n_rows; i++) {
        struct load_row *r = &ld->rows[i];
        struct hub_schema_entry *e = &set->entries[set->n_entries];
        struct schema_compiled *c = NULL;
        struct schema_group *g;
        int rc = compiled_get(&known, r, &c);
        if (rc != 0) {
            if (ld->refused++ == 0) {
                snprintf(ld->refused_what, sizeof(ld->refused_what), "%s/%s (%s)", r->type,
                         r->version, rc == HUB_ENOMEM ? "out of memory" : "does not compile");
            }
            continue;
        }
        e->compiled = c->s;
        set->compiled[set->n_entries] = c;
        if ((g = group_get(set, max_groups, r->scope, r->type)) == NULL) {
            compiled_release(c);
            free(known.slots);
            set_free(set);
            return;
        }
        if (g->count == 0) {
            g->start = set->n_entries;
        }
        g->count++;
        /* the texts move to the snapshot: the entry borrows them */
        e->scope = set->strings[set->n_strings++] = r->scope;
        e->type = set->strings[set->n_strings++] = r->type;
        r->scope = r->type = NULL;
        memcpy(e->version, r->version, sizeof(e->version));
        memcpy(e->digest, r->digest, sizeof(e->digest));
        e->major = r->major;
        e->minor = r->minor;
        e->patch = r->patch;
        set->n_entries++;
    }
    free(known.slots);
    /* settings may name a type without schemas (kept: a later version of
     * it finds its setting); pick ignores a group with no versions */
    for (size_t i = 0; i < ld->n_settings; i++) {
        struct schema_group *g =
            group_get(set, max_groups, ld->settings[i].scope, ld->settings[i].type);
        if (g == NULL) {
            set_free(set);
            return;
        }
        g->unknown_quarantine = ld->settings[i].quarantine;
    }
    ld->set = set;
}

/* The first snapshot is in use: every batch that waited for it goes on,
 * in turn (each may submit a transaction before the next runs). */
static void waiters_run(struct hub_schemas *reg) {
    while (reg->waiters != NULL) {
        struct schema_waiter *w = reg->waiters;
        reg->waiters = w->next;
        w->cb(w->arg);
        free(w);
    }
}

static void poll_send(struct hub_schemas *reg);

/* Runs and frees a list of waiters (hub_schemas_after_reload). */
static void waiters_list_run(struct schema_waiter *w) {
    while (w != NULL) {
        struct schema_waiter *next = w->next;
        w->cb(w->arg);
        free(w);
        w = next;
    }
}

/* A round (a poll, and the load it started) has ended, however: its
 * waiters may answer. */
static void round_end(struct hub_schemas *reg) {
    struct schema_waiter *w = reg->round;

    reg->busy = 0;
    reg->round = NULL;
    waiters_list_run(w);
}

/* Back on the loop: the new snapshot replaces the one in use. */
static void load_done(uv_work_t *w, int status) {
    struct schema_load *ld = w->data;
    struct hub_schemas *reg = ld->reg;

    (void)status;
    if (reg->hub == NULL) { /* stopped meanwhile */
        reg->busy = 0;
        hub_schemas_release(ld->set);
        load_free(ld);
        if (reg->closed) {
            free(reg);
        }
        return;
    }
    if (ld->set == NULL) {
        hub_log(HUB_ERROR, "out of memory loading the schema registry; keeping the last one");
        reg->generation = 0; /* load again at the next poll */
    } else {
        if (ld->refused > 0) {
            hub_log(HUB_ERROR, "registered schemas that do not compile are not used",
                    HUB_LI("count", (int64_t)ld->refused), HUB_LS("first", ld->refused_what));
        }
        hub_schemas_release(reg->set);
        /* an empty registry is no snapshot: ingest then skips the step */
        if (ld->set->n_entries == 0) {
            hub_schemas_release(ld->set);
            reg->set = NULL;
        } else {
            reg->set = ld->set;
        }
        reg->hub->metrics.schema_generation = (int64_t)ld->generation;
        if (!reg->ready) {
            reg->ready = 1;
            waiters_run(reg);
        }
    }
    load_free(ld);
    /* after the swap: the round's waiters answer with the new snapshot in use */
    round_end(reg);
    if (reg->poked) {
        poll_send(reg);
    }
}

/* Copies the load's rows off their results and hands them to a thread.
 * Returns 0 or HUB_ENOMEM. */
static int load_start(struct hub_schemas *reg, uint64_t generation, PGresult *rows,
                      PGresult *settings) {
    struct schema_load *ld = calloc(1, sizeof(*ld));
    int n = PQntuples(rows);
    int ns = PQntuples(settings);

    if (ld == NULL) {
        return HUB_ENOMEM;
    }
    ld->reg = reg;
    ld->generation = generation;
    /* the snapshot in use lends its compiled schemas to the load */
    if (reg->set != NULL) {
        atomic_fetch_add(&reg->set->refs, 1);
        ld->prev = reg->set;
    }
    ld->rows = calloc((size_t)n + 1, sizeof(*ld->rows));
    ld->settings = calloc((size_t)ns + 1, sizeof(*ld->settings));
    if (ld->rows == NULL || ld->settings == NULL) {
        load_free(ld);
        return HUB_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        struct load_row *r = &ld->rows[ld->n_rows++];
        r->scope = strdup(PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_SCOPE));
        r->type = strdup(PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_TYPE));
        r->schema = strdup(PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_SCHEMA));
        snprintf(r->version, sizeof(r->version), "%s",
                 PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_VERSION));
        snprintf(r->digest, sizeof(r->digest), "%s",
                 PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_DIGEST));
        r->major = atoi(PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_MAJOR));
        r->minor = atoi(PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_MINOR));
        r->patch = atoi(PQgetvalue(rows, i, HUB_SCHEMA_LOAD_COL_PATCH));
        if (r->scope == NULL || r->type == NULL || r->schema == NULL) {
            load_free(ld);
            return HUB_ENOMEM;
        }
    }
    for (int i = 0; i < ns; i++) {
        struct load_setting *s = &ld->settings[ld->n_settings++];
        s->scope = strdup(PQgetvalue(settings, i, HUB_SCHEMA_SETTINGS_COL_SCOPE));
        s->type = strdup(PQgetvalue(settings, i, HUB_SCHEMA_SETTINGS_COL_TYPE));
        s->quarantine =
            strcmp(PQgetvalue(settings, i, HUB_SCHEMA_SETTINGS_COL_UNKNOWN), "quarantine") == 0;
        if (s->scope == NULL || s->type == NULL) {
            load_free(ld);
            return HUB_ENOMEM;
        }
    }
    ld->work.data = ld;
    if (uv_queue_work(reg->hub->loop, &ld->work, load_work, load_done) != 0) {
        load_free(ld);
        return HUB_ENOMEM;
    }
    return 0;
}

/* ------------------------------------------------------------ polling -- */

/* A poll or a load failed: logged once until one works; the snapshot in
 * use stays. */
static void poll_failed(struct hub_schemas *reg, const struct hub_pg_outcome *out) {
    if (!reg->failing) {
        reg->failing = 1;
        hub_log(HUB_WARN, "schema registry poll failed; keeping the schemas in use",
                HUB_LS("error", out->error));
    }
}

/* The load's answer: generation, versions, settings. */
static void load_answered(void *arg, const struct hub_pg_outcome *out) {
    struct hub_schemas *reg = arg;

    if (reg->hub == NULL) {
        round_end(reg);
        return; /* stopping: the sidecar's close frees reg */
    }
    if (out->status != HUB_PG_OK || out->n_results < 3) {
        round_end(reg);
        poll_failed(reg, out);
        return;
    }
    reg->failing = 0;
    uint64_t gen = strtoull(PQgetvalue(out->results[0], 0, HUB_SCHEMA_GEN_COL), NULL, 10);
    if (load_start(reg, gen, out->results[1], out->results[2]) != 0) {
        round_end(reg);
        hub_log(HUB_ERROR, "out of memory loading the schema registry; keeping the last one");
        return;
    }
    reg->generation = gen; /* busy until load_done */
}

/* The generation's answer: load when it moved. */
static void poll_answered(void *arg, const struct hub_pg_outcome *out) {
    struct hub_schemas *reg = arg;
    struct hub_pg_txn *txn;
    PGresult *r = out->n_results > 0 ? out->results[0] : NULL;

    if (reg->hub == NULL) {
        round_end(reg);
        return;
    }
    if (out->status != HUB_PG_OK || r == NULL || PQntuples(r) != 1) {
        round_end(reg);
        poll_failed(reg, out);
        return;
    }
    reg->failing = 0;
    if (strtoull(PQgetvalue(r, 0, HUB_SCHEMA_GEN_COL), NULL, 10) == reg->generation && reg->ready) {
        round_end(reg);
        if (reg->poked) {
            poll_send(reg);
        }
        return;
    }
    /* one transaction: the rows and the generation they belong to (read
     * first: a change committed meanwhile moves it again, and the next
     * poll loads that) */
    txn = hub_pg_txn_new(reg->side.pg, load_answered, reg);
    if (txn == NULL) {
        round_end(reg);
        return;
    }
    hub_pg_txn_add(txn, &hub_sql_schema_generation, 0, NULL, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_schema_load, 0, NULL, NULL, NULL);
    hub_pg_txn_add(txn, &hub_sql_schema_settings_load, 0, NULL, NULL, NULL);
    hub_pg_txn_submit(txn);
}

/* Reads the generation unless a round is under way (then the round polls
 * again when it ends if poked). */
static void poll_send(struct hub_schemas *reg) {
    struct hub_pg_txn *txn;

    if (reg->busy) {
        return;
    }
    reg->poked = 0;
    txn = hub_pg_txn_new(reg->side.pg, poll_answered, reg);
    if (txn == NULL) {
        /* no round: nothing better will come of waiting for one */
        struct schema_waiter *w = reg->pending;
        reg->pending = NULL;
        waiters_list_run(w);
        return;
    }
    reg->busy = 1;
    /* the round's poll starts now: it sees every change committed before */
    reg->round = reg->pending;
    reg->pending = NULL;
    hub_pg_txn_add(txn, &hub_sql_schema_generation, 0, NULL, NULL, NULL);
    hub_pg_txn_submit(txn);
}

/* The poll timer (repeating every STREAMING_HUB_SCHEMA_POLL). */
static void poll_tick(uv_timer_t *t) {
    poll_send(t->data);
}

/* ---------------------------------------------------------- lifecycle -- */

/* The first poll runs at once (timeout 0): until it has loaded, ingest
 * waits (hub_schemas_when_ready). */
void hub_schemas_start(struct hub *hub) {
    struct hub_schemas *reg = calloc(1, sizeof(*reg));

    if (reg == NULL) {
        hub_log(HUB_ERROR, "out of memory: schemas are not checked");
        return;
    }
    reg->hub = hub;
    if (hub_sidecar_open(&reg->side, hub, "streaming-hub-schemas", 1, reg) != 0) {
        free(reg);
        hub_log(HUB_ERROR, "out of memory: schemas are not checked");
        return;
    }
    hub->schemas = reg;
    uv_timer_start(&reg->side.timer[0], poll_tick, 0, (uint64_t)hub->cfg.schema_poll_ms);
}

/* The sidecar is closed; a compile still on the threadpool frees reg when
 * it comes back. */
static void schemas_closed(void *owner) {
    struct hub_schemas *reg = owner;

    hub_schemas_release(reg->set);
    reg->set = NULL;
    reg->closed = 1;
    if (!reg->busy) {
        free(reg);
    }
}

void hub_schemas_stop(struct hub *hub) {
    struct hub_schemas *reg = hub->schemas;

    if (reg == NULL) {
        return;
    }
    hub->schemas = NULL;
    reg->hub = NULL;
    /* the API's waits answer now: their changes are committed */
    waiters_list_run(reg->round);
    waiters_list_run(reg->pending);
    reg->round = reg->pending = NULL;
    /* waiters are batches of an ingest that has stopped by now */
    while (reg->waiters != NULL) {
        struct schema_waiter *w = reg->waiters;
        reg->waiters = w->next;
        free(w);
    }
    /* a load on the threadpool cannot be recalled: load_done frees reg */
    hub_sidecar_close(&reg->side, schemas_closed);
}

void hub_schemas_poke(struct hub *hub) {
    if (hub->schemas != NULL) {
        hub->schemas->poked = 1;
        poll_send(hub->schemas);
    }
}

/* Adds cb(arg) to the front of *list.  Returns 0 or HUB_ENOMEM. */
static int waiter_push(struct schema_waiter **list, void (*cb)(void *arg), void *arg) {
    struct schema_waiter *w = malloc(sizeof(*w));

    if (w == NULL) {
        return HUB_ENOMEM;
    }
    w->cb = cb;
    w->arg = arg;
    w->next = *list;
    *list = w;
    return 0;
}

int hub_schemas_after_reload(struct hub *hub, void (*cb)(void *arg), void *arg) {
    struct hub_schemas *reg = hub->schemas;

    if (reg == NULL) {
        cb(arg);
        return 0;
    }
    if (waiter_push(&reg->pending, cb, arg) != 0) {
        return HUB_ENOMEM;
    }
    reg->poked = 1;
    poll_send(reg);
    return 0;
}

int hub_schemas_ready(const struct hub *hub) {
    return hub->schemas == NULL || hub->schemas->ready;
}

int hub_schemas_when_ready(struct hub *hub, void (*cb)(void *arg), void *arg) {
    if (hub_schemas_ready(hub)) {
        cb(arg);
        return 0;
    }
    return waiter_push(&hub->schemas->waiters, cb, arg);
}

void hub_schemas_cancel_wait(struct hub *hub, void *arg) {
    struct schema_waiter **pw = hub->schemas != NULL ? &hub->schemas->waiters : NULL;

    while (pw != NULL && *pw != NULL) {
        struct schema_waiter *w = *pw;
        if (w->arg == arg) {
            *pw = w->next;
            free(w);
        } else {
            pw = &w->next;
        }
    }
}

/* The reference is taken on the loop, where the snapshot is swapped: a
 * snapshot is never freed while a reference can still be taken on it. */
struct hub_schema_set *hub_schemas_acquire(struct hub *hub) {
    struct hub_schema_set *set = hub->schemas != NULL ? hub->schemas->set : NULL;

    if (set != NULL) {
        atomic_fetch_add(&set->refs, 1);
    }
    return set;
}
