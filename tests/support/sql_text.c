/*
 * hub-sql — prints the text of one of the hub's named SQL statements, as the
 * hub sends it, so that a test can run the very statement with psql instead
 * of copying it or scraping it out of the C source.
 *
 *   hub-sql NAME     the text of the statement named NAME (its hub_sql name,
 *                    e.g. dispatch_outcomes), then a newline; exit 0
 *   hub-sql --list   the names it knows, one a line
 *
 * Exit status 2 for a name it does not know, or no argument.  The statements
 * are those of the lists below (one per store module that exports one).
 */
#include <stdio.h>
#include <string.h>

#include "store_dispatch.h"
#include "store_ingest.h"

static const struct hub_sql *const *const lists[] = {hub_sql_dispatch_all, hub_sql_ingest_all};

int main(int argc, char **argv) {
    int list = argc == 2 && strcmp(argv[1], "--list") == 0;

    if (argc != 2) {
        fprintf(stderr, "usage: hub-sql NAME | --list\n");
        return 2;
    }
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++) {
        for (const struct hub_sql *const *s = lists[k]; *s != NULL; s++) {
            if (list) {
                printf("%s\n", (*s)->name);
            } else if (strcmp((*s)->name, argv[1]) == 0) {
                printf("%s\n", (*s)->text);
                return 0;
            }
        }
    }
    if (!list) {
        fprintf(stderr, "hub-sql: no statement named '%s' (see hub-sql --list)\n", argv[1]);
        return 2;
    }
    return 0;
}
