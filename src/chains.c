/*
 * chains — growing a chained hash table (see chains.h).
 */
#include "chains.h"

#include <stdlib.h>

#include "error.h"

int hub_chains_grow(struct hub_chain ***slots, size_t *nslots) {
    size_t n = *nslots * 2;
    struct hub_chain **grown = calloc(n, sizeof(*grown));

    if (grown == NULL) {
        return HUB_ENOMEM;
    }
    /* each entry goes to the chain its stored hash names: nothing is
     * hashed again */
    for (size_t i = 0; i < *nslots; i++) {
        while ((*slots)[i] != NULL) {
            struct hub_chain *e = (*slots)[i];
            (*slots)[i] = e->next;
            e->next = grown[e->hash & (n - 1)];
            grown[e->hash & (n - 1)] = e;
        }
    }
    free(*slots);
    *slots = grown;
    *nslots = n;
    return 0;
}

void hub_chains_free(struct hub_chain **slots, size_t nslots) {
    for (size_t i = 0; slots != NULL && i < nslots; i++) {
        while (slots[i] != NULL) {
            struct hub_chain *e = slots[i];
            slots[i] = e->next;
            free(e);
        }
    }
    free(slots);
}
