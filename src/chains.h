/*
 * chains — the growth of the hub's small chained hash tables (the token
 * buckets of bucket.c, the per-tenant counts of stats.c).
 *
 * An entry of such a table starts with a struct hub_chain (its link and its
 * full hash), so that one routine can move entries between slot arrays
 * whatever else they hold.  The table owns its entries; these functions
 * only move them.  Loop thread only; no locks.
 */
#ifndef HUB_CHAINS_H
#define HUB_CHAINS_H

#include <stddef.h>
#include <stdint.h>

/* The first member of every entry. */
struct hub_chain {
    struct hub_chain *next;
    uint64_t hash;
};

/*
 * Doubles the slot array *slots of *nslots chains (a power of two) and
 * moves every entry to its new chain.  Out of memory the table keeps its
 * size: longer chains, still correct.  Returns 0 or HUB_ENOMEM.
 */
int hub_chains_grow(struct hub_chain ***slots, size_t *nslots);

/* Frees every entry of the nslots chains of slots (with free(): each was
 * malloc'd whole, its link first) and slots itself.  slots may be NULL. */
void hub_chains_free(struct hub_chain **slots, size_t nslots);

#endif
