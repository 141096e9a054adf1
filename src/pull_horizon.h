/*
 * pull_horizon — the highest sequence a pull page may reach without
 * skipping an event for good (SPEC §9: "pull pages never skip an event").
 *
 * Why: event_seq values come from nextval() inside concurrent ingest
 * transactions (Kafka partitions, shared HTTP transactions, N processes),
 * and they commit in any order.  A page that returned 102 while 101 was
 * still uncommitted would move its consumer's cursor past 101 forever.
 *
 * How: every ingest transaction takes the hold (store_events.h,
 * HUB_SQL_PULL_HOLD: a shared advisory lock) before its first nextval.  A
 * horizon is taken in two reads, in this order: S, the sequence's last
 * value, then V, the virtual transaction ids holding the hold.  Any
 * transaction that took a sequence <= S held the hold before S was read, so
 * it is in V unless it had already ended; once none of V holds it any more,
 * every sequence <= S is committed or rolled back for good, and S is the
 * horizon.  Only ingest transactions take the hold: a replay, an idle
 * session or a backup never holds a pull back.
 *
 * Pulls share the work: the pulls that arrive while one snapshot is in
 * flight wait for the next one, and one poller (every ~1 ms, on a
 * connection of its own) checks the holders of every snapshot still
 * waiting at once.  A snapshot whose holders are gone resolves itself and
 * every older one.  The delay a pull sees is what is left of the ingest
 * transactions in flight when it arrived: below one ingest transaction.
 * A snapshot still held after STREAMING_HUB_PULL_HOLD_MAX (a stuck ingest
 * transaction, or an operator's session holding the lock) answers its
 * pulls with the last horizon resolved, which is older but just as safe.
 *
 * Metrics: streaming_hub_pull_holdback_seconds (each pull's wait),
 * _pull_holdback_timeouts_total, _pull_horizon_lag (sequences above the
 * resolved horizon at the last snapshot), _pull_holdback_oldest_seconds.
 *
 * Loop thread only.  The horizon state hangs off struct hub and is created
 * on the first pull.
 */
#ifndef HUB_PULL_HORIZON_H
#define HUB_PULL_HORIZON_H

#include <stdint.h>

struct hub;

/*
 * Called once per wait with the horizon: every sequence <= horizon is
 * final, and it was taken after the wait started (or, after
 * STREAMING_HUB_PULL_HOLD_MAX, it is the newest one resolved).  horizon is
 * -1 when the hub is shutting down or memory ran out: no page can be safe.
 */
typedef void (*hub_pull_horizon_cb)(void *arg, int64_t horizon);

/*
 * Asks for a horizon taken after this call; cb(arg, horizon) runs later,
 * on the loop, never before this returns.  arg is borrowed until then.
 * Returns 0, or HUB_ENOMEM (cb will not run).
 */
int hub_pull_horizon_wait(struct hub *hub, hub_pull_horizon_cb cb, void *arg);

/* At shutdown: answers every wait with -1, closes the poller's connection
 * and frees the state once it is closed.  Safe when none was created. */
void hub_pull_horizon_free(struct hub *hub);

#endif
