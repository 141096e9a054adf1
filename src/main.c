/*
 * streaming-hub — command line entry point (SPEC §2.1).
 */
#include <curl/curl.h>
#include <h2o/version.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <luajit.h>
#include <malloc.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "config.h"
#include "dev.h"
#include "hub.h"
#include "kafka.h"
#include "log.h"
#include "migrate.h"
#include "policy.h"
#include "policy_test.h"
#include "rekey.h"

static void usage(FILE *out) {
    fprintf(out, "usage: streaming-hub [command]\n\n"
                 "commands:\n"
                 "  serve                 run the hub (default)\n"
                 "  migrate               apply the embedded migrations and exit\n"
                 "  rekey                 re-seal stored secrets under STREAMING_HUB_KEK\n"
                 "  dev                   everything embedded: private PostgreSQL, Kafka, secrets\n"
                 "  kafka-mock [--brokers N] [--topic NAME:PARTITIONS]...\n"
                 "                        run only the embedded Kafka cluster\n"
                 "  check-policies DIR    compile and validate every policy file offline\n"
                 "  policy-test FILE [EVENT_FILE...] [--attempt N --status CODE]\n"
                 "                        run a policy's match, shape and retry on events\n"
                 "  version               versions of the hub and its libraries\n\n"
                 "`streaming-hub serve --help` lists every environment variable.\n");
}

static int cmd_version(void) {
    int pq = PQlibVersion();
    printf("streaming-hub %s\n", HUB_VERSION);
    printf("  libuv       %s\n", uv_version_string());
    printf("  librdkafka  %s\n", rd_kafka_version_str());
    printf("  libpq       %d.%d\n", pq / 10000, pq % 10000);
    printf("  libcurl     %s\n", curl_version_info(CURLVERSION_NOW)->version);
    printf("  OpenSSL     %s\n", OpenSSL_version(OPENSSL_VERSION));
    printf("  jansson     %s\n", jansson_version_str());
    printf("  h2o         %s\n", H2O_VERSION);
    printf("  LuaJIT      %s\n", LUAJIT_VERSION);
    return 0;
}

static int cmd_serve(int argc, char **argv) {
    struct hub_config cfg = {0};

    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: streaming-hub serve\n\n");
            hub_config_print_help(stdout);
            return 0;
        }
        fprintf(stderr, "streaming-hub serve: unknown argument %s\n", argv[i]);
        return 2;
    }
    if (hub_config_load_cli(&cfg, NULL) != 0) {
        return 2;
    }
    return hub_serve(&cfg);
}

static void check_report(void *arg, const char *file, const char *message) {
    int *problems = arg;
    (*problems)++;
    /* messages name the file already ("name.lua:3: ..."); directory errors do not */
    if (strncmp(message, file, strlen(file)) == 0) {
        printf("%s\n", message);
    } else {
        printf("%s: %s\n", file, message);
    }
}

/* check-policies DIR: the load and validation a reload does, offline, under
 * the configured limits.  Exit 0 when every file loads, 1 otherwise. */
static int cmd_check_policies(int argc, char **argv) {
    struct hub_config cfg = {0};
    struct hub_policy_limits lim;
    int problems = 0, ok;

    if (argc != 1 || strcmp(argv[0], "--help") == 0) {
        fprintf(argc == 1 ? stdout : stderr, "usage: streaming-hub check-policies DIR\n");
        return argc == 1 ? 0 : 2;
    }
    if (hub_config_load_cli(&cfg, "error") != 0) {
        return 2;
    }
    lim = (struct hub_policy_limits){cfg.policy_timeout_ms, (size_t)cfg.policy_memory_bytes};
    hub_config_free(&cfg);
    ok = hub_policy_check_dir(argv[0], &lim, check_report, &problems);
    if (ok < 0 || problems > 0) {
        return 1;
    }
    printf("%d %s OK\n", ok, ok == 1 ? "policy" : "policies");
    return 0;
}

/*
 * glibc gives each thread that allocates its own malloc arena (up to 8 per
 * core), and an arena keeps what it freed.  librdkafka's threads allocate
 * the fetched records the loop thread frees: with one arena each, the hub's
 * peak RSS in bench/ingest was 142-153 MiB; with two arenas, 108-125 MiB.
 *
 * Blocks of 1 MiB and more (librdkafka's fetch responses, which its records
 * point into) are mapped on their own and unmapped when freed.  glibc's
 * default threshold moves up to the largest block freed so far (up to
 * 32 MiB), after which those responses were carved out of the arenas and
 * left holes the arenas kept.  A fixed threshold also fixes the trim
 * threshold (128 KiB): freed arena tops go back to the kernel.
 *
 * MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES in the
 * environment still decide when set.
 */
static void limit_malloc_arenas(void) {
    if (getenv("MALLOC_ARENA_MAX") == NULL) {
        mallopt(M_ARENA_MAX, 2);
    }
    if (getenv("MALLOC_MMAP_THRESHOLD_") == NULL && getenv("GLIBC_TUNABLES") == NULL) {
        mallopt(M_MMAP_THRESHOLD, 1 << 20);
    }
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : "serve";

    limit_malloc_arenas();
    /* libuv runs DNS lookups on at most half of its pool (4 threads by
     * default): 16 lets 8 run while others hang (api_subs_input.c) and
     * leaves the schema checks room; an operator's setting stays */
    setenv("UV_THREADPOOL_SIZE", "16", 0);

    if (strcmp(cmd, "serve") == 0) {
        return cmd_serve(argc > 2 ? argc - 2 : 0, argv + 2);
    }
    if (strcmp(cmd, "migrate") == 0) {
        return hub_migrate_main();
    }
    if (strcmp(cmd, "rekey") == 0) {
        return hub_rekey_main(argc - 2, argv + 2);
    }
    if (strcmp(cmd, "dev") == 0) {
        return hub_dev_main(argc - 2, argv + 2);
    }
    if (strcmp(cmd, "kafka-mock") == 0) {
        return hub_kafka_mock_main(argc - 2, argv + 2);
    }
    if (strcmp(cmd, "check-policies") == 0) {
        return cmd_check_policies(argc - 2, argv + 2);
    }
    if (strcmp(cmd, "policy-test") == 0) {
        return hub_policy_test_main(argc - 2, argv + 2);
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        return cmd_version();
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "streaming-hub: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
