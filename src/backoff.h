/*
 * backoff — the retry schedule (SPEC §7.3, §7.4).
 *
 * A schedule is 1..12 steps, each in (0, 10h].  After the k-th failed attempt
 * the next attempt waits a delay drawn uniformly from (0, step_k] ("full
 * jitter", so a destination that comes back is not hit by every retry at
 * once); after the last step the job is dead.  A Retry-After header from a
 * 429/503 can push the next attempt later, never beyond 10h.
 *
 * Pure code: the caller passes the random value and the clock, so every
 * result is reproducible in tests.  No global mutable state.
 */
#ifndef HUB_BACKOFF_H
#define HUB_BACKOFF_H

#include <stddef.h>
#include <stdint.h>

#define HUB_BACKOFF_MAX_STEPS 12
#define HUB_BACKOFF_STEP_MAX_MS (10 * 3600 * 1000LL) /* 10h: also the Retry-After cap */

/*
 * The default curve 1m, 5m, 15m, 1h, 3h, 6h, 8h, 10h (≈ 28h end to end, 9
 * attempts in all).  Returns a pointer to static constant data and stores the
 * step count in *n.  The configured STREAMING_HUB_RETRY_SCHEDULE normally
 * supplies the same values; this is the fallback for a malformed override.
 */
const int64_t *hub_backoff_default(size_t *n);

/*
 * 1 when schedule_ms[0..n) is a valid schedule: 1..12 steps, each in
 * (0, 10h].  0 otherwise (including a NULL schedule).
 */
int hub_backoff_schedule_valid(const int64_t *schedule_ms, size_t n);

/*
 * Delay in milliseconds before the next attempt of a job that has failed
 * failed_attempts times (1-based: after the first failure use 1).  The delay
 * is 1 + floor(random * step / 2^64) for step = schedule_ms[failed_attempts-1],
 * i.e. uniform over 1..step ms and monotone in random: random 0 gives 1 ms,
 * UINT64_MAX gives the full step.  Pass 64 fresh random bits.
 *
 * Returns -1 when failed_attempts > n (retries exhausted: the job is dead),
 * or when failed_attempts < 1 or the schedule is NULL/empty.  A step outside
 * (0, 10h] is clamped into it so an unvalidated schedule can never produce a
 * zero, negative or unbounded delay; callers should still validate first.
 */
int64_t hub_backoff_delay_ms(const int64_t *schedule_ms, size_t n, int failed_attempts,
                             uint64_t random);

/*
 * Parses a Retry-After header value (RFC 9110 §10.2.3): delta-seconds, or an
 * HTTP-date in any of the three forms recipients must accept (IMF-fixdate
 * "Sun, 06 Nov 1994 08:49:37 GMT", obsolete RFC 850 "Sunday, 06-Nov-94
 * 08:49:37 GMT", asctime "Sun Nov  6 08:49:37 1994").  Surrounding spaces and
 * tabs are ignored.  header_value is borrowed; now_unix_ms is the wall clock.
 *
 * Returns the wait in milliseconds from now, capped at 10h (a date in the
 * past gives 0), or -1 when the value is NULL, empty or malformed.
 */
int64_t hub_retry_after_ms(const char *header_value, int64_t now_unix_ms);

#endif
