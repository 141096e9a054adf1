/*
 * rekey — `streaming-hub rekey` (see rekey.h).
 *
 * A blocking command, like `migrate`: one libpq connection, no loop.  Each
 * pass walks both tables in pages of STREAMING_HUB_REKEY_BATCH rows; a page
 * is re-sealed in memory (plaintext only between opening and sealing, then
 * wiped) and written in one transaction, each row with a compare-and-set.
 * A row that changed between the page's read and its write is counted and
 * left for the next pass; passes repeat while such rows appear, up to
 * REKEY_PASSES.  Logs carry subscription ids and counts, never a sealed
 * value or a key.
 */
#include "rekey.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "crypto.h"
#include "error.h"
#include "log.h"
#include "migrate.h"
#include "store_rekey.h"

/* Passes over both tables at most: each one only retries rows that hubs
 * changed during the previous one, which is rare. */
#define REKEY_PASSES 5

/* What one table's walk did. */
struct rekey_count {
    int64_t resealed;   /* rows written back under the current KEK */
    int64_t changed;    /* rows that changed between read and write: next pass */
    int64_t unopenable; /* rows holding a value no key of the ring opens */
};

/* The run: the connection, the ring and the counts of the current pass. */
struct rekey {
    PGconn *conn;
    const struct hub_keyring *ring;
    char like[32]; /* "v1:<current kid>:%" */
    char batch[16];
    struct rekey_count subs, idem;
};

/* Runs a statement with text parameters; returns its result, or NULL after
 * logging a failure (the caller rolls back). */
static PGresult *run(struct rekey *k, const struct hub_sql *sql, int n, const char *const *params) {
    PGresult *r = PQexecParams(k->conn, sql->text, n, NULL, params, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);

    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
        msg[strcspn(msg, "\n")] = '\0';
        hub_log(HUB_ERROR, "rekey: statement failed", HUB_LS("statement", sql->name),
                HUB_LS("error", msg));
        PQclear(r);
        return NULL;
    }
    return r;
}

/* BEGIN, COMMIT or ROLLBACK; 0 or -1 (logged). */
static int txn(struct rekey *k, const char *what) {
    PGresult *r = PQexec(k->conn, what);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;

    if (!ok) {
        hub_log(HUB_ERROR, "rekey: transaction control failed", HUB_LS("step", what),
                HUB_LS("error", PQerrorMessage(k->conn)));
    }
    PQclear(r);
    return ok ? 0 : -1;
}

/*
 * One sealed value under the current KEK: *out is NULL for NULL, a copy of
 * in when it is under the current KEK already, else in opened with the ring
 * and sealed again (aad: the subscription id it is bound to).  Returns 0
 * (*out owned, malloc'd), HUB_ECRYPTO when no key of the ring opens it, or
 * HUB_ENOMEM.  The plaintext is wiped before returning.
 */
static int reseal(const struct hub_keyring *ring, const char *in, const char *aad, char **out) {
    unsigned char *pt = NULL;
    size_t len = 0;

    *out = NULL;
    if (in == NULL) {
        return 0;
    }
    /* kept as it is: sealing it again would only change its bytes (a new
     * nonce), and the compare-and-set would then fight a concurrent writer
     * for nothing */
    if (hub_keyring_is_current(ring, in)) {
        *out = strdup(in);
        return *out != NULL ? 0 : HUB_ENOMEM;
    }
    if (hub_keyring_open(ring, in, aad, &pt, &len) != 0) {
        return HUB_ECRYPTO;
    }
    *out = hub_keyring_seal(ring, pt, len, aad);
    OPENSSL_cleanse(pt, len);
    free(pt);
    return *out != NULL ? 0 : HUB_ENOMEM;
}

/* The value of column col of row i, or NULL for SQL NULL (no headers, no
 * previous secret: nothing to re-seal, and NULL is what is written back). */
static const char *value(PGresult *r, int i, int col) {
    return PQgetisnull(r, i, col) ? NULL : PQgetvalue(r, i, col);
}

/*
 * Re-seals and writes back subscription row i of page r (inside the page's
 * transaction).  Returns 0 (counted in k->subs) or -1 on a database error
 * or out of memory.
 */
static int rekey_subscription(struct rekey *k, PGresult *r, int i) {
    const char *id = PQgetvalue(r, i, HUB_REKEY_SUBS_ID);
    const char *old[3] = {value(r, i, HUB_REKEY_SUBS_SECRET), value(r, i, HUB_REKEY_SUBS_HEADERS),
                          value(r, i, HUB_REKEY_SUBS_PREV_SECRET)};
    char *neu[3] = {NULL, NULL, NULL};
    int rc = 0, bad = 0;

    /* all three or none: a row is either fully under the current KEK after
     * this, or left for an operator who has the missing key */
    for (int c = 0; c < 3 && rc == 0; c++) {
        int e = reseal(k->ring, old[c], id, &neu[c]);
        bad |= e == HUB_ECRYPTO;
        rc = e == HUB_ENOMEM ? -1 : 0;
    }
    if (rc == 0 && bad) {
        /* left as it is: re-sealing the rest would hide that this row
         * still needs a key the ring does not have */
        hub_log(HUB_ERROR, "rekey: a subscription's secrets do not open with any configured KEK",
                HUB_LS("subscription", id));
        k->subs.unopenable++;
    } else if (rc == 0) {
        PGresult *u = run(k, &hub_sql_rekey_subs_update, 7,
                          (const char *[]){id, neu[0], neu[1], neu[2], old[0], old[1], old[2]});
        if (u == NULL) {
            rc = -1;
        } else {
            /* no row: a PATCH or a rotation committed since the page was
             * read; its values are the current KEK's, or the next pass
             * sees them */
            *(PQntuples(u) == 1 ? &k->subs.resealed : &k->subs.changed) += 1;
            PQclear(u);
        }
    }
    for (int c = 0; c < 3; c++) {
        free(neu[c]);
    }
    return rc;
}

/*
 * The body of an idempotency record with "_ss" and "_hs" under the current
 * KEK, as malloc'd JSON text in *out (member order kept, so a replay of it
 * renders the same answer).  Returns 0, HUB_ECRYPTO (a value no key opens),
 * HUB_EINVAL (not an object with a string "id") or HUB_ENOMEM.
 */
static int rekey_body(const struct hub_keyring *ring, const char *body, char **out) {
    static const char *const members[] = {"_ss", "_hs"};
    json_t *obj = json_loads(body, 0, NULL);
    const char *id = json_string_value(json_object_get(obj, "id"));
    int rc = 0;

    *out = NULL;
    if (!json_is_object(obj) || id == NULL) {
        json_decref(obj);
        return HUB_EINVAL;
    }
    for (size_t m = 0; m < sizeof(members) / sizeof(members[0]) && rc == 0; m++) {
        const char *v = json_string_value(json_object_get(obj, members[m]));
        char *sealed = NULL;
        /* a record holds one or both (a verify's has no secret) */
        if (v == NULL || hub_keyring_is_current(ring, v)) {
            continue;
        }
        rc = reseal(ring, v, id, &sealed);
        if (rc == 0 && json_object_set_new(obj, members[m], json_string(sealed)) != 0) {
            rc = HUB_ENOMEM;
        }
        free(sealed);
    }
    if (rc == 0 && (*out = json_dumps(obj, JSON_COMPACT)) == NULL) {
        rc = HUB_ENOMEM;
    }
    /* on failure *out stays NULL and the record is left as it is */
    json_decref(obj);
    return rc;
}

/* Re-seals and writes back idempotency record i of page r; as
 * rekey_subscription, counted in k->idem. */
static int rekey_record(struct rekey *k, PGresult *r, int i) {
    const char *scope = PQgetvalue(r, i, HUB_REKEY_IDEM_SCOPE);
    const char *key = PQgetvalue(r, i, HUB_REKEY_IDEM_KEY);
    const char *body = PQgetvalue(r, i, HUB_REKEY_IDEM_BODY);
    char *neu = NULL;
    int e = rekey_body(k->ring, body, &neu), rc = 0;

    if (e == HUB_ECRYPTO || e == HUB_EINVAL) {
        hub_log(HUB_ERROR,
                e == HUB_ECRYPTO
                    ? "rekey: an idempotency record's secrets do not open with any configured KEK"
                    : "rekey: an idempotency record is not a subscription object",
                HUB_LS("scope", scope));
        k->idem.unopenable++;
    } else if (e != 0) {
        rc = -1;
    } else {
        PGresult *u =
            run(k, &hub_sql_rekey_idem_update, 4, (const char *[]){scope, key, neu, body});
        if (u == NULL) {
            rc = -1;
        } else {
            *(PQntuples(u) == 1 ? &k->idem.resealed : &k->idem.changed) += 1;
            PQclear(u);
        }
    }
    free(neu);
    return rc;
}

/*
 * One walk over a table: pages from `page` (whose first n_after parameters
 * are the keyset position, the next the LIKE pattern and the last the
 * limit), each re-sealed row by row with `row` in one transaction.  key_cols
 * says which columns of a page's last row are the next position.  Returns 0
 * or -1 (a database error; the page's transaction is rolled back).
 */
static int rekey_walk(struct rekey *k, const struct hub_sql *page, const char *const *start,
                      const int *key_cols, int n_after,
                      int (*row)(struct rekey *k, PGresult *r, int i)) {
    char *after[2] = {strdup(start[0]), n_after > 1 ? strdup(start[1]) : NULL};
    int rc = 0;

    for (;;) {
        const char *params[4] = {after[0], after[1], NULL, NULL};
        PGresult *r;
        int rows;
        params[n_after] = k->like;
        params[n_after + 1] = k->batch;
        if (after[0] == NULL || (n_after > 1 && after[1] == NULL) ||
            (r = run(k, page, n_after + 2, params)) == NULL) {
            rc = -1;
            break;
        }
        rows = PQntuples(r);
        if (rows == 0) {
            PQclear(r);
            break;
        }
        /* one transaction per page: row locks are held for one page's
         * writes only, so hubs changing a row wait milliseconds at most */
        rc = txn(k, "BEGIN");
        for (int i = 0; i < rows && rc == 0; i++) {
            rc = row(k, r, i);
        }
        rc = rc == 0 ? txn(k, "COMMIT") : (txn(k, "ROLLBACK"), -1);
        /* the keyset moves past every row of the page, written or not:
         * unopenable rows are not read again, changed ones wait for the
         * next pass */
        for (int c = 0; c < n_after; c++) {
            free(after[c]);
            after[c] = strdup(PQgetvalue(r, rows - 1, key_cols[c]));
        }
        PQclear(r);
        if (rc != 0) {
            break;
        }
    }
    free(after[0]);
    free(after[1]);
    return rc;
}

/* One pass over both tables; 0 or -1. */
static int rekey_pass(struct rekey *k) {
    static const int subs_key[1] = {HUB_REKEY_SUBS_ID};
    static const int idem_key[2] = {HUB_REKEY_IDEM_SCOPE, HUB_REKEY_IDEM_KEY};

    memset(&k->subs, 0, sizeof(k->subs));
    memset(&k->idem, 0, sizeof(k->idem));
    if (rekey_walk(k, &hub_sql_rekey_subs_page,
                   (const char *[]){"00000000-0000-0000-0000-000000000000"}, subs_key, 1,
                   rekey_subscription) != 0) {
        return -1;
    }
    return rekey_walk(k, &hub_sql_rekey_idem_page, (const char *[]){"", ""}, idem_key, 2,
                      rekey_record);
}

static void usage(FILE *out) {
    fprintf(out, "usage: streaming-hub rekey\n\n"
                 "Re-seals every stored signing secret and destination-headers blob under\n"
                 "STREAMING_HUB_KEK, opening them with STREAMING_HUB_KEK_PREVIOUS (see\n"
                 "docs/deploy.md, \"KEK rotation\").  Idempotent; safe while hubs serve once\n"
                 "every hub has STREAMING_HUB_KEK in its keys.  Exit 0 when nothing is left\n"
                 "under another key.\n");
}

/* The configuration, the ring and the connection, then passes until no
 * row changed under the walk, then what is left.  See rekey.h. */
int hub_rekey_main(int argc, char **argv) {
    struct hub_config cfg = {0};
    struct hub_keyring ring;
    struct rekey k;
    char err[160];
    PGresult *left;
    int64_t resealed_subs = 0, resealed_idem = 0, left_subs = -1, left_idem = -1;
    int rc = 1, pass;

    /* no options: everything comes from the environment, as for serve */
    if (argc > 0) {
        int help = strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0;
        usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    if (hub_config_load_cli(&cfg, NULL) != 0) {
        return 2;
    }
    if (cfg.postgres_dsn == NULL || cfg.kek == NULL) {
        fprintf(stderr, "streaming-hub rekey: %s is required\n",
                cfg.postgres_dsn == NULL ? "STREAMING_HUB_POSTGRES_DSN" : "STREAMING_HUB_KEK");
        hub_config_free(&cfg);
        return 2;
    }
    if (hub_keyring_parse(cfg.kek, cfg.kek_previous, &ring, err, sizeof(err)) != 0) {
        fprintf(stderr, "streaming-hub rekey: %s\n", err);
        hub_config_free(&cfg);
        return 2;
    }
    memset(&k, 0, sizeof(k));
    k.ring = &ring;
    /* the key id is in every sealed text (crypto.h): the statements find
     * what is not under the current KEK without opening anything */
    snprintf(k.like, sizeof(k.like), "v1:%s:%%", ring.keys[0].id);
    snprintf(k.batch, sizeof(k.batch), "%lld", (long long)cfg.rekey_batch);
    k.conn = hub_pg_connect_blocking(cfg.postgres_dsn, "streaming-hub-rekey");
    hub_config_free(&cfg);
    if (k.conn == NULL) {
        goto done;
    }
    /* the tables it walks are those of the current schema */
    if (hub_migrate_current(k.conn) != 1) {
        fprintf(stderr, "streaming-hub rekey: the schema is not current: run `streaming-hub "
                        "migrate` first\n");
        goto done;
    }
    /* a pass that saw no row change under it is the last: everything it
     * could open is re-sealed by then */
    for (pass = 1; pass <= REKEY_PASSES; pass++) {
        if (rekey_pass(&k) != 0) {
            goto done;
        }
        resealed_subs += k.subs.resealed;
        resealed_idem += k.idem.resealed;
        hub_log(HUB_INFO, "rekey pass", HUB_LI("pass", pass),
                HUB_LI("subscriptions_resealed", k.subs.resealed),
                HUB_LI("records_resealed", k.idem.resealed),
                HUB_LI("changed_meanwhile", k.subs.changed + k.idem.changed),
                HUB_LI("unopenable", k.subs.unopenable + k.idem.unopenable));
        if (k.subs.changed + k.idem.changed == 0) {
            break;
        }
    }
    /* counted afresh rather than summed: values a hub wrote meanwhile, or
     * rows the passes gave up on, show here */
    left = run(&k, &hub_sql_rekey_left, 1, (const char *[]){k.like});
    if (left == NULL) {
        goto done;
    }
    left_subs = atoll(PQgetvalue(left, 0, HUB_REKEY_LEFT_SUBS));
    left_idem = atoll(PQgetvalue(left, 0, HUB_REKEY_LEFT_IDEM));
    PQclear(left);
    printf("rekey: %lld subscriptions and %lld idempotency records re-sealed under KEK %s; "
           "%lld and %lld still hold values under other keys\n",
           (long long)resealed_subs, (long long)resealed_idem, ring.keys[0].id,
           (long long)left_subs, (long long)left_idem);
    rc = left_subs == 0 && left_idem == 0 ? 0 : 1;
    if (rc != 0) {
        hub_log(HUB_ERROR,
                "rekey: values under other keys remain (see the errors above); keep "
                "STREAMING_HUB_KEK_PREVIOUS until they are gone",
                HUB_LI("subscriptions", left_subs), HUB_LI("records", left_idem));
    }
done:
    if (k.conn != NULL) {
        PQfinish(k.conn);
    }
    OPENSSL_cleanse(&ring, sizeof(ring));
    return rc;
}
