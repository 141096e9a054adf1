/*
 * migrate — ordered, idempotent, advisory-locked schema migrations.
 */
#include "migrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "pg.h"

/* Arbitrary but fixed: the lock every hub takes to migrate. */
#define MIGRATE_LOCK_KEY "7318744562110001"

static int exec_ok(PGconn *conn, const char *sql, const char *what) {
    PGresult *r = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(r);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
        msg[strcspn(msg, "\n")] = '\0';
        hub_log(HUB_ERROR, "migration step failed", HUB_LS("step", what), HUB_LS("error", msg));
    }
    PQclear(r);
    return ok ? 0 : -1;
}

static int migration_applied(PGconn *conn, const char *name) {
    const char *params[1] = {name};
    PGresult *r = PQexecParams(conn, "SELECT 1 FROM schema_migrations WHERE version = $1", 1, NULL,
                               params, NULL, NULL, 0);
    int applied = PQresultStatus(r) == PGRES_TUPLES_OK ? PQntuples(r) > 0 : -1;
    PQclear(r);
    return applied;
}

int hub_migrate_apply(PGconn *conn) {
    int applied = 0;

    if (exec_ok(conn, "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", "lock") != 0) {
        return -1;
    }
    if (exec_ok(conn,
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version text PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())",
                "schema_migrations") != 0) {
        goto fail;
    }
    for (int i = 0; i < hub_migrations_count; i++) {
        const struct hub_migration *m = &hub_migrations[i];
        const char *params[1] = {m->name};
        int done = migration_applied(conn, m->name);
        PGresult *r;

        if (done < 0) {
            goto fail;
        }
        if (done) {
            continue;
        }
        if (exec_ok(conn, "BEGIN", m->name) != 0) {
            goto fail;
        }
        if (exec_ok(conn, m->sql, m->name) != 0) {
            exec_ok(conn, "ROLLBACK", m->name);
            goto fail;
        }
        r = PQexecParams(conn, "INSERT INTO schema_migrations (version) VALUES ($1)", 1, NULL,
                         params, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            PQclear(r);
            exec_ok(conn, "ROLLBACK", m->name);
            goto fail;
        }
        PQclear(r);
        if (exec_ok(conn, "COMMIT", m->name) != 0) {
            goto fail;
        }
        hub_log(HUB_INFO, "migration applied", HUB_LS("version", m->name));
        applied++;
    }
    exec_ok(conn, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", "unlock");
    return applied;

fail:
    exec_ok(conn, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", "unlock");
    return -1;
}

int hub_migrate_current(PGconn *conn) {
    PGresult *r = PQexec(conn, "SELECT to_regclass('schema_migrations') IS NOT NULL");
    int exists = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
                 strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!exists) {
        return 0;
    }
    for (int i = 0; i < hub_migrations_count; i++) {
        int done = migration_applied(conn, hub_migrations[i].name);
        if (done <= 0) {
            return done;
        }
    }
    return 1;
}

int hub_migrate_main(void) {
    struct hub_config cfg = {0};
    PGconn *conn;
    int n;

    if (hub_config_load_cli(&cfg, NULL) != 0) {
        return 2;
    }
    if (cfg.postgres_dsn == NULL) {
        fprintf(stderr, "streaming-hub: STREAMING_HUB_POSTGRES_DSN: required for migrate\n");
        hub_config_free(&cfg);
        return 2;
    }
    conn = hub_pg_connect_blocking(cfg.postgres_dsn, "streaming-hub-migrate");
    hub_config_free(&cfg);
    if (conn == NULL) {
        return 1;
    }
    n = hub_migrate_apply(conn);
    PQfinish(conn);
    if (n < 0) {
        return 1;
    }
    hub_log(HUB_INFO, "migrations current", HUB_LI("applied", n),
            HUB_LI("total", hub_migrations_count));
    return 0;
}
