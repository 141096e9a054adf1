/*
 * uuid — UUIDv7 generation (see uuid.h).
 */
#include "uuid.h"

#include <openssl/rand.h>
#include <string.h>
#include <time.h>

#include "util.h"

#define COUNTER_BITS 42
#define COUNTER_MAX ((UINT64_C(1) << COUNTER_BITS) - 1)
#define TS_MAX ((INT64_C(1) << 48) - 1)

static int64_t wall_ms(void) {
    struct timespec ts;

    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return 0; /* cannot happen for CLOCK_REALTIME; the counter still orders */
    }
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define RND_BYTES 10 /* per id: 6 bytes of counter seed, 4 of the low rand_b bits */

/* The next RND_BYTES of g's pool, refilled from the CSPRNG when spent (a
 * zeroed generator has none left); each byte is handed out once.  NULL when
 * the CSPRNG fails. */
static const unsigned char *pool_take(struct hub_uuid7_gen *g) {
    if (g->pool_left < RND_BYTES) {
        if (RAND_bytes(g->pool, (int)sizeof(g->pool)) != 1) {
            return NULL;
        }
        g->pool_left = sizeof(g->pool);
    }
    g->pool_left -= RND_BYTES;
    return g->pool + g->pool_left;
}

int hub_uuid7_next(struct hub_uuid7_gen *g, int64_t unix_ms, unsigned char out[HUB_UUID_BYTES]) {
    const unsigned char *rnd = pool_take(g);
    int64_t ms;
    uint64_t counter;

    if (rnd == NULL) {
        return -1;
    }
    if (unix_ms < 0) {
        unix_ms = 0;
    }
    if (unix_ms > g->last_ms) {
        /* A new millisecond: a random counter with its top bit clear, so at
         * least 2^41 more ids fit in this millisecond before any rollover. */
        ms = unix_ms;
        counter = 0;
        for (int i = 0; i < 6; i++) {
            counter = (counter << 8) | rnd[i];
        }
        counter &= COUNTER_MAX >> 1;
    } else {
        /* Same millisecond, or the clock stepped back: keep the last
         * timestamp and count on, so ids never go backwards. */
        ms = g->last_ms;
        counter = g->counter + 1;
        if (counter > COUNTER_MAX) {
            ms++;
            counter = 0;
        }
    }
    if (ms > TS_MAX) {
        ms = TS_MAX; /* the year 10889: only reachable with a bogus clock */
    }
    g->last_ms = ms;
    g->counter = counter;

    /* unix_ts_ms, 48 bits big-endian */
    for (int i = 0; i < 6; i++) {
        out[i] = (unsigned char)((uint64_t)ms >> (40 - 8 * i));
    }
    /* ver 0111 + the counter's top 12 bits (rand_a) */
    out[6] = (unsigned char)(0x70 | ((counter >> 38) & 0x0f));
    out[7] = (unsigned char)(counter >> 30);
    /* var 10 + the counter's low 30 bits (the top of rand_b) */
    out[8] = (unsigned char)(0x80 | ((counter >> 24) & 0x3f));
    out[9] = (unsigned char)(counter >> 16);
    out[10] = (unsigned char)(counter >> 8);
    out[11] = (unsigned char)counter;
    /* the last 32 bits of rand_b: fresh randomness */
    memcpy(out + 12, rnd + 6, 4);
    return 0;
}

int hub_uuid7_text(char out[HUB_UUID_TEXT_SIZE]) {
    static _Thread_local struct hub_uuid7_gen gen;
    unsigned char raw[HUB_UUID_BYTES];

    if (hub_uuid7_next(&gen, wall_ms(), raw) != 0) {
        out[0] = '\0';
        return -1;
    }
    hub_uuid_format(raw, out);
    return 0;
}

void hub_uuid_format(const unsigned char in[HUB_UUID_BYTES], char out[HUB_UUID_TEXT_SIZE]) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (int i = 0; i < HUB_UUID_BYTES; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            out[o++] = '-';
        }
        out[o++] = hex[in[i] >> 4];
        out[o++] = hex[in[i] & 0x0f];
    }
    out[o] = '\0';
}

int hub_uuid_parse(const char *s, size_t len, unsigned char out[HUB_UUID_BYTES]) {
    size_t p = 0;

    if (len != HUB_UUID_TEXT_SIZE - 1) {
        return -1;
    }
    for (int i = 0; i < HUB_UUID_BYTES; i++) {
        int hi, lo;
        if ((i == 4 || i == 6 || i == 8 || i == 10) && s[p++] != '-') {
            return -1;
        }
        hi = hub_hex_value(s[p]);
        lo = hub_hex_value(s[p + 1]);
        if (hi < 0 || lo < 0) {
            return -1;
        }
        out[i] = (unsigned char)(hi << 4 | lo);
        p += 2;
    }
    return 0;
}

int64_t hub_uuid7_unix_ms(const unsigned char in[HUB_UUID_BYTES]) {
    int64_t ms = 0;

    for (int i = 0; i < 6; i++) {
        ms = (ms << 8) | in[i];
    }
    return ms;
}
