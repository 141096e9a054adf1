/*
 * dev — everything embedded on one machine.
 */
#include "dev.h"

#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <limits.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "hub.h"
#include "log.h"
#include "pg.h"
#include "util.h"

#define PG_BIN "/usr/lib/postgresql/15/bin"
#define DEV_PG_PORT_FIRST 54320
#define DEV_PG_PORT_LAST 54399

/* First port of the range that nothing listens on. */
static int dev_free_port(void) {
    for (int port = DEV_PG_PORT_FIRST; port <= DEV_PG_PORT_LAST; port++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0) {
            close(fd);
        }
        if (ok) {
            return port;
        }
    }
    return -1;
}

/* Runs argv as `user` (when root) and waits; returns the exit status. */
static int dev_run_as(const struct passwd *pw, char *const argv[], const char *log_path) {
    pid_t pid = fork();
    int status;

    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (pw != NULL && (setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0)) {
            _exit(126);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* 1 when `user` can enter dir (PostgreSQL refuses to run as root, so the
 * data dir must be reachable by the postgres user). */
static int dev_user_can_enter(const struct passwd *pw, const char *dir) {
    pid_t pid;
    int status;

    if (pw == NULL) {
        return access(dir, X_OK | W_OK) == 0;
    }
    pid = fork();
    if (pid == 0) {
        if (setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) {
            _exit(1);
        }
        _exit(access(dir, X_OK | W_OK) == 0 ? 0 : 1);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Reads KEY=VALUE lines of <data>/dev.env, generating missing secrets. */
static int dev_secrets(const char *data_dir, char **admin_token, char **kek) {
    char path[PATH_MAX + 16], *text, buf[512];
    unsigned char raw[32];
    char tok[64], kekb[64];

    snprintf(path, sizeof(path), "%s/dev.env", data_dir);
    text = hub_read_file(path, NULL);
    if (text != NULL) {
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            if (strncmp(line, "STREAMING_HUB_ADMIN_TOKEN=", 26) == 0) {
                *admin_token = strdup(line + 26);
            } else if (strncmp(line, "STREAMING_HUB_KEK=", 18) == 0) {
                *kek = strdup(line + 18);
            }
        }
        free(text);
        if (*admin_token && *kek) {
            return 0;
        }
    }
    if (RAND_bytes(raw, 24) != 1) {
        return -1;
    }
    hub_base64url(raw, 24, tok);
    if (RAND_bytes(raw, 32) != 1) {
        return -1;
    }
    char *b = hub_base64(raw, 32);
    snprintf(kekb, sizeof(kekb), "%s", b ? b : "");
    free(b);
    free(*admin_token);
    free(*kek);
    *admin_token = malloc(strlen(tok) + 5);
    sprintf(*admin_token, "dev_%s", tok);
    *kek = strdup(kekb);
    snprintf(buf, sizeof(buf), "STREAMING_HUB_ADMIN_TOKEN=%s\nSTREAMING_HUB_KEK=%s\n", *admin_token,
             *kek);
    return hub_write_file(path, buf, strlen(buf), 0600);
}

/* Starts postgres as a child in its own process group (so a terminal Ctrl-C
 * reaches only the hub, which stops PostgreSQL after draining). */
static pid_t dev_start_postgres(const struct passwd *pw, const char *pgdata, int port,
                                const char *log_path) {
    char portstr[16];
    pid_t pid;

    snprintf(portstr, sizeof(portstr), "%d", port);
    pid = fork();
    if (pid == 0) {
        char *argv[] = {PG_BIN "/postgres",
                        "-D",
                        (char *)pgdata,
                        "-p",
                        portstr,
                        "-k",
                        (char *)pgdata,
                        "-c",
                        "listen_addresses=127.0.0.1",
                        NULL};
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        setpgid(0, 0);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (pw != NULL && (setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0)) {
            _exit(126);
        }
        /* after setuid: a changed uid clears the parent-death signal */
        prctl(PR_SET_PDEATHSIG, SIGINT);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int dev_wait_postgres(const char *dsn_admin, pid_t pid) {
    for (int i = 0; i < 300; i++) {
        int status;
        if (PQping(dsn_admin) == PQPING_OK) {
            return 0;
        }
        if (waitpid(pid, &status, WNOHANG) == pid) {
            return -1;
        }
        usleep(100 * 1000);
    }
    return -1;
}

static int dev_create_database(const char *dsn_admin) {
    PGconn *c = PQconnectdb(dsn_admin);
    PGresult *r;
    int rc = -1;

    hub_pg_log_notices(c);
    if (PQstatus(c) != CONNECTION_OK) {
        PQfinish(c);
        return -1;
    }
    r = PQexec(c, "SELECT 1 FROM pg_database WHERE datname = 'hub'");
    if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        int exists = PQntuples(r) > 0;
        PQclear(r);
        if (exists) {
            rc = 0;
        } else {
            r = PQexec(c, "CREATE DATABASE hub");
            rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
            PQclear(r);
        }
    } else {
        PQclear(r);
    }
    PQfinish(c);
    return rc;
}

/* 1 when the listen address addr ("host:port", "[v6]:port") is a loopback
 * one: only then may dev allow private destinations by default (an API
 * reachable from elsewhere would let any tenant aim webhooks at this
 * machine's network). */
static int listen_is_loopback(const char *addr) {
    const char *colon = strrchr(addr, ':');
    size_t n = colon != NULL ? (size_t)(colon - addr) : strlen(addr);

    if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']') {
        addr++;
        n -= 2;
    }
    return (n >= 4 && strncmp(addr, "127.", 4) == 0) || (n == 3 && strncmp(addr, "::1", 3) == 0) ||
           (n == 9 && strncmp(addr, "localhost", 9) == 0);
}

int hub_dev_main(int argc, char **argv) {
    struct hub_config cfg = {0};
    char data_dir[PATH_MAX], pgdata[PATH_MAX + 64], logp[PATH_MAX + 64], dsn[PATH_MAX + 64],
        dsn_admin[512];
    const struct passwd *pw = NULL;
    pid_t pg_pid;
    int port, rc;

    if (argc > 0) {
        fprintf(stderr, "usage: streaming-hub dev   (configured by STREAMING_HUB_* variables)\n");
        return 2;
    }
    if (hub_config_load_cli(&cfg, NULL) != 0) {
        return 2;
    }
    /* A receiver on this machine is the point of a first try, so dev allows
     * loopback and private destinations unless told otherwise (or told it
     * is production, which refuses them, or listens beyond loopback);
     * `serve` keeps the default false.  The banner says which (hub.c). */
    if (getenv("STREAMING_HUB_ALLOW_PRIVATE_SINKS") == NULL && strcmp(cfg.env, "production") != 0 &&
        listen_is_loopback(cfg.http_listen_addr)) {
        cfg.allow_private_sinks = 1;
    }
    if (hub_mkdir_p(cfg.data_dir) != 0 || realpath(cfg.data_dir, data_dir) == NULL) {
        fprintf(stderr, "streaming-hub dev: cannot create %s: %s\n", cfg.data_dir, strerror(errno));
        hub_config_free(&cfg);
        return 1;
    }
    free(cfg.data_dir);
    cfg.data_dir = strdup(data_dir);

    if (geteuid() == 0) {
        pw = getpwnam("postgres");
        if (pw == NULL) {
            fprintf(stderr, "streaming-hub dev: running as root needs the 'postgres' user "
                            "(apt-get install postgresql-15)\n");
            hub_config_free(&cfg);
            return 1;
        }
    }
    snprintf(pgdata, sizeof(pgdata), "%s/postgres", data_dir);
    if (pw != NULL && !dev_user_can_enter(pw, data_dir)) {
        /* e.g. a checkout under /root (mode 0700): PostgreSQL, which never
         * runs as root, cannot reach it, so its files go under /var/tmp. */
        unsigned long h = 5381;
        for (const char *s = data_dir; *s; s++) {
            h = h * 33 + (unsigned char)*s;
        }
        snprintf(pgdata, sizeof(pgdata), "/var/tmp/streaming-hub-dev-%08lx/postgres", h);
        hub_log(HUB_INFO, "the postgres user cannot enter the data dir; using another place",
                HUB_LS("pgdata", pgdata));
    }
    snprintf(logp, sizeof(logp), "%s/postgres.log", data_dir);
    if (access(pgdata, F_OK) != 0 || access(strcat(strcpy(dsn, pgdata), "/PG_VERSION"), F_OK)) {
        char *initdb[] = {
            PG_BIN "/initdb",   "-D", pgdata, "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--locale=C.UTF-8", NULL};
        hub_mkdir_p(pgdata);
        if (pw != NULL && chown(pgdata, pw->pw_uid, pw->pw_gid) != 0) {
            fprintf(stderr, "streaming-hub dev: cannot chown %s\n", pgdata);
        }
        chmod(pgdata, 0700);
        hub_log(HUB_INFO, "initialising the dev database", HUB_LS("pgdata", pgdata));
        if (dev_run_as(pw, initdb, logp) != 0) {
            fprintf(stderr, "streaming-hub dev: initdb failed, see %s\n", logp);
            hub_config_free(&cfg);
            return 1;
        }
    }
    port = dev_free_port();
    if (port < 0) {
        fprintf(stderr, "streaming-hub dev: no free port in %d-%d\n", DEV_PG_PORT_FIRST,
                DEV_PG_PORT_LAST);
        hub_config_free(&cfg);
        return 1;
    }
    pg_pid = dev_start_postgres(pw, pgdata, port, logp);
    snprintf(dsn_admin, sizeof(dsn_admin), "host=127.0.0.1 port=%d dbname=postgres user=postgres",
             port);
    snprintf(dsn, sizeof(dsn), "host=127.0.0.1 port=%d dbname=hub user=postgres", port);
    if (pg_pid < 0 || dev_wait_postgres(dsn_admin, pg_pid) != 0 ||
        dev_create_database(dsn_admin) != 0) {
        fprintf(stderr, "streaming-hub dev: PostgreSQL did not start, see %s\n", logp);
        if (pg_pid > 0) {
            kill(pg_pid, SIGINT);
            waitpid(pg_pid, NULL, 0);
        }
        hub_config_free(&cfg);
        return 1;
    }
    free(cfg.postgres_dsn);
    cfg.postgres_dsn = strdup(dsn);
    if ((cfg.admin_token == NULL || cfg.kek == NULL)) {
        char *tok = NULL, *kek = NULL;
        if (dev_secrets(data_dir, &tok, &kek) != 0) {
            fprintf(stderr, "streaming-hub dev: cannot write %s/dev.env\n", data_dir);
        }
        if (cfg.admin_token == NULL) {
            cfg.admin_token = tok;
        } else {
            free(tok);
        }
        if (cfg.kek == NULL) {
            cfg.kek = kek;
        } else {
            free(kek);
        }
    }

    rc = hub_serve_with(&cfg, 1);

    hub_log(HUB_INFO, "stopping the dev database");
    kill(pg_pid, SIGINT); /* fast shutdown */
    while (waitpid(pg_pid, NULL, 0) < 0 && errno == EINTR) {
    }
    hub_config_free(&cfg);
    return rc;
}
