/*
 * uuid — UUIDv7 identifiers (RFC 9562 §5.7): subscription ids and delivery
 * ids (X-Lerian-Delivery-Id).  Time-ordered, so ids created later sort later
 * (as text and as PostgreSQL uuid), which keeps b-tree inserts at the right
 * edge and makes "paginated by id" mean "in creation order".
 *
 * Layout (big-endian, 128 bits):
 *
 *     unix_ts_ms:48 | ver:4 = 0111 | rand_a:12 | var:2 = 10 | rand_b:62
 *
 * Monotonicity (RFC 9562 §6.2, method 1, "fixed bit-length dedicated
 * counter"): rand_a and the top 30 bits of rand_b form a 42-bit counter.  A
 * new millisecond seeds it with random bits, its top bit clear (the RFC's
 * rollover guard); another id within the same millisecond (or with a clock
 * that went backwards) increments it; should it overflow, the timestamp
 * field moves on by 1 ms.  The low 32 bits of rand_b are fresh CSPRNG bits
 * in every id, so ids stay unguessable.  Ids from one generator therefore
 * strictly increase; ids from different processes are unique, not ordered.
 */
#ifndef HUB_UUID_H
#define HUB_UUID_H

#include <stddef.h>
#include <stdint.h>

#define HUB_UUID_BYTES 16
/* "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" + NUL */
#define HUB_UUID_TEXT_SIZE 37

/* Generator state: the last timestamp used, the counter, and CSPRNG bytes
 * drawn ahead (one RAND_bytes call per 50 ids rather than per id: it was
 * 4% of the dispatcher's CPU).  Zero it before first use (static or
 * `= {0}`); touch it from one thread at a time.  A forked child must not
 * draw from its parent's generator, or both hand out the same bytes (the
 * hub's children exec or exit at once). */
#define HUB_UUID7_POOL 500
struct hub_uuid7_gen {
    int64_t last_ms;
    uint64_t counter; /* 42 bits */
    size_t pool_left; /* CSPRNG bytes at the start of pool not handed out yet */
    unsigned char pool[HUB_UUID7_POOL];
};

/*
 * Writes the next UUIDv7 of g for the wall-clock time unix_ms (Unix
 * milliseconds, >= 0) into out.  Strictly greater than every id g made
 * before, whatever unix_ms says.  Returns 0, or -1 when the CSPRNG fails
 * (out and g are then unchanged).
 */
int hub_uuid7_next(struct hub_uuid7_gen *g, int64_t unix_ms, unsigned char out[HUB_UUID_BYTES]);

/*
 * Writes a new UUIDv7 in text form (lower-case 8-4-4-4-12, NUL-terminated)
 * into out, using the real clock and the calling thread's own generator
 * (thread-local: the one piece of mutable state outside struct hub in this
 * module, so that every caller on a thread — API, dispatcher — draws from one
 * monotonic sequence without a lock).  Returns 0, or -1 when the CSPRNG fails
 * (out is then "").
 */
int hub_uuid7_text(char out[HUB_UUID_TEXT_SIZE]);

/* Formats 16 bytes as lower-case 8-4-4-4-12 text into out (NUL-terminated). */
void hub_uuid_format(const unsigned char in[HUB_UUID_BYTES], char out[HUB_UUID_TEXT_SIZE]);

/* Parses 8-4-4-4-12 hex text (either case) of len bytes into out: the
 * inverse of hub_uuid_format.  Returns 0, or -1 when s is not such text. */
int hub_uuid_parse(const char *s, size_t len, unsigned char out[HUB_UUID_BYTES]);

/* The 48-bit Unix-millisecond timestamp of a UUIDv7. */
int64_t hub_uuid7_unix_ms(const unsigned char in[HUB_UUID_BYTES]);

#endif
