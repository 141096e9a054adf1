/*
 * migrate — applies the embedded migrations/NNNN_*.sql in order, each in its
 * own transaction, under a session advisory lock so that N hubs starting at
 * once apply each migration exactly once.
 */
#ifndef HUB_MIGRATE_H
#define HUB_MIGRATE_H

#include <libpq-fe.h>

struct hub_migration {
    const char *name; /* file name, e.g. "0001_roster.sql"; its version is the name */
    const char *sql;
};

/* Generated at build time from the .sql files of migrations/, sorted by name. */
extern const struct hub_migration hub_migrations[];
extern const int hub_migrations_count;

/* Applies what is missing.  Returns the number applied (>= 0) or -1 (logged). */
int hub_migrate_apply(PGconn *conn);

/* 1 when every embedded migration is recorded, 0 when some are missing,
 * -1 when the check itself failed. */
int hub_migrate_current(PGconn *conn);

/* The `migrate` command. */
int hub_migrate_main(void);

#endif
