/*
 * backoff — retry delays with full jitter, and Retry-After parsing.
 */
#include "backoff.h"

#include <string.h>

static const int64_t DEFAULT_CURVE_MS[] = {
    60 * 1000LL,        /* 1m */
    5 * 60 * 1000LL,    /* 5m */
    15 * 60 * 1000LL,   /* 15m */
    3600 * 1000LL,      /* 1h */
    3 * 3600 * 1000LL,  /* 3h */
    6 * 3600 * 1000LL,  /* 6h */
    8 * 3600 * 1000LL,  /* 8h */
    10 * 3600 * 1000LL, /* 10h */
};

const int64_t *hub_backoff_default(size_t *n) {
    if (n != NULL) {
        *n = sizeof(DEFAULT_CURVE_MS) / sizeof(DEFAULT_CURVE_MS[0]);
    }
    return DEFAULT_CURVE_MS;
}

int hub_backoff_schedule_valid(const int64_t *schedule_ms, size_t n) {
    if (schedule_ms == NULL || n < 1 || n > HUB_BACKOFF_MAX_STEPS) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (schedule_ms[i] <= 0 || schedule_ms[i] > HUB_BACKOFF_STEP_MAX_MS) {
            return 0;
        }
    }
    return 1;
}

/*
 * High 64 bits of the 128-bit product a * b, from 32-bit halves so the code
 * needs no compiler extension.  No partial sum can overflow: the largest,
 * lo_hi + two 32-bit carries, is at most (2^32-1)^2 + 2(2^32-1) = 2^64-1.
 */
static uint64_t mul_hi64(uint64_t a, uint64_t b) {
    uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
    uint64_t b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
    uint64_t lo_lo = a_lo * b_lo;
    uint64_t hi_lo = a_hi * b_lo;
    uint64_t lo_hi = a_lo * b_hi;
    uint64_t hi_hi = a_hi * b_hi;
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;

    return hi_hi + (hi_lo >> 32) + (cross >> 32);
}

int64_t hub_backoff_delay_ms(const int64_t *schedule_ms, size_t n, int failed_attempts,
                             uint64_t random) {
    int64_t step;

    if (schedule_ms == NULL || n == 0 || failed_attempts < 1) {
        return -1;
    }
    if ((size_t)failed_attempts > n) {
        return -1; /* exhausted: the job is dead */
    }
    step = schedule_ms[failed_attempts - 1];
    if (step < 1) {
        step = 1;
    } else if (step > HUB_BACKOFF_STEP_MAX_MS) {
        step = HUB_BACKOFF_STEP_MAX_MS;
    }
    /* Scale random onto 0..step-1 by multiply-and-shift rather than modulo:
     * it is monotone in random (so the endpoints are testable exactly) and
     * its bias, at most step / 2^64, is far below anything observable.
     * The + 1 keeps 0 out: a retry always waits at least 1 ms. */
    return 1 + (int64_t)mul_hi64(random, (uint64_t)step);
}

/* ---- Retry-After --------------------------------------------------------- */

#define RETRY_AFTER_CAP_S (HUB_BACKOFF_STEP_MAX_MS / 1000)

static const char *const DAY3[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
static const char *const DAYL[] = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                   "Friday", "Saturday", "Sunday"};
static const char *const MON3[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

/* A read position in a bounded string. */
struct cursor {
    const char *p;
    const char *end;
};

/* Consumes the literal s when it comes next.  1 or 0. */
static int eat(struct cursor *c, const char *s) {
    size_t n = strlen(s);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, s, n) != 0) {
        return 0;
    }
    c->p += n;
    return 1;
}

/* Consumes exactly n decimal digits into *out.  1 or 0. */
static int eat_digits(struct cursor *c, int n, int *out) {
    int v = 0;
    if (c->end - c->p < n) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (c->p[i] < '0' || c->p[i] > '9') {
            return 0;
        }
        v = v * 10 + (c->p[i] - '0');
    }
    c->p += n;
    *out = v;
    return 1;
}

/* Consumes one of names[0..count) (HTTP-date names are case-sensitive).
 * Returns its index or -1. */
static int eat_name(struct cursor *c, const char *const *names, int count) {
    for (int i = 0; i < count; i++) {
        if (eat(c, names[i])) {
            return i;
        }
    }
    return -1;
}

/* Consumes "HH:MM:SS" into seconds of the day (a leap second 60 allowed).  1 or 0. */
static int eat_time(struct cursor *c, int *secs) {
    int h, m, s;
    if (!eat_digits(c, 2, &h) || !eat(c, ":") || !eat_digits(c, 2, &m) || !eat(c, ":") ||
        !eat_digits(c, 2, &s) || h > 23 || m > 59 || s > 60) {
        return 0;
    }
    *secs = h * 3600 + m * 60 + s;
    return 1;
}

static int is_leap(int y) {
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int days_in_month(int y, int m) {
    static const int dim[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m == 2 && is_leap(y) ? 29 : dim[m - 1];
}

/* Leap years in 1..y-1, for y >= 1. */
static int64_t leaps_before(int y) {
    return (y - 1) / 4 - (y - 1) / 100 + (y - 1) / 400;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian, y >= 1, m 1..12). */
static int64_t days_from_civil(int y, int m, int d) {
    static const int before[] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    int64_t days = 365 * (int64_t)(y - 1970) + leaps_before(y) - leaps_before(1970);
    return days + before[m - 1] + (m > 2 && is_leap(y)) + (d - 1);
}

/* The calendar year containing Unix time ms (clamped to 1970 before the epoch). */
static int year_of(int64_t unix_ms) {
    int64_t days = unix_ms > 0 ? unix_ms / 86400000 : 0;
    /* no year is longer than 366 days, so this starts at or below the answer */
    int y = 1970 + (int)(days / 366);
    while (days_from_civil(y + 1, 1, 1) <= days) {
        y++;
    }
    return y;
}

/*
 * Parses one of the three HTTP-date forms from c into Unix milliseconds.
 * now_unix_ms resolves RFC 850's two-digit year.  1 or 0.
 */
static int parse_http_date(struct cursor *c, int64_t now_unix_ms, int64_t *out_ms) {
    struct cursor save = *c;
    int day, month, year, secs;

    if (eat_name(c, DAY3, 7) >= 0 && eat(c, ", ")) {
        /* IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT */
        if (!eat_digits(c, 2, &day) || !eat(c, " ") || (month = eat_name(c, MON3, 12)) < 0 ||
            !eat(c, " ") || !eat_digits(c, 4, &year) || !eat(c, " ") || !eat_time(c, &secs) ||
            !eat(c, " GMT")) {
            return 0;
        }
    } else if ((*c = save, eat_name(c, DAY3, 7) >= 0 && eat(c, " "))) {
        /* asctime: Sun Nov  6 08:49:37 1994 (day is space-padded) */
        if ((month = eat_name(c, MON3, 12)) < 0 || !eat(c, " ")) {
            return 0;
        }
        if (eat(c, " ")) {
            if (!eat_digits(c, 1, &day)) {
                return 0;
            }
        } else if (!eat_digits(c, 2, &day)) {
            return 0;
        }
        if (!eat(c, " ") || !eat_time(c, &secs) || !eat(c, " ") || !eat_digits(c, 4, &year)) {
            return 0;
        }
    } else if ((*c = save, eat_name(c, DAYL, 7) >= 0 && eat(c, ", "))) {
        /* RFC 850: Sunday, 06-Nov-94 08:49:37 GMT */
        int yy, now_year;
        if (!eat_digits(c, 2, &day) || !eat(c, "-") || (month = eat_name(c, MON3, 12)) < 0 ||
            !eat(c, "-") || !eat_digits(c, 2, &yy) || !eat(c, " ") || !eat_time(c, &secs) ||
            !eat(c, " GMT")) {
            return 0;
        }
        /* RFC 9110 §5.6.7: a two-digit year more than 50 years in the
         * future is the most recent past year with those digits, i.e. the
         * largest year <= now + 50 that ends in yy */
        now_year = year_of(now_unix_ms);
        year = now_year + 50 - ((now_year + 50 - yy) % 100);
    } else {
        return 0;
    }
    month += 1;
    if (year < 1 || day < 1 || day > days_in_month(year, month)) {
        return 0;
    }
    *out_ms = (days_from_civil(year, month, day) * 86400 + secs) * 1000;
    return 1;
}

int64_t hub_retry_after_ms(const char *header_value, int64_t now_unix_ms) {
    struct cursor c;
    int64_t when_ms, wait_ms;

    if (header_value == NULL) {
        return -1;
    }
    c.p = header_value;
    c.end = header_value + strlen(header_value);
    /* optional whitespace around a field value is not part of it */
    while (c.p < c.end && (*c.p == ' ' || *c.p == '\t')) {
        c.p++;
    }
    while (c.end > c.p && (c.end[-1] == ' ' || c.end[-1] == '\t')) {
        c.end--;
    }
    if (c.p == c.end) {
        return -1;
    }
    if (*c.p >= '0' && *c.p <= '9') {
        /* delta-seconds; saturate instead of overflowing on absurd lengths */
        int64_t secs = 0;
        for (; c.p < c.end; c.p++) {
            if (*c.p < '0' || *c.p > '9') {
                return -1;
            }
            if (secs <= RETRY_AFTER_CAP_S) {
                secs = secs * 10 + (*c.p - '0');
            }
        }
        return (secs > RETRY_AFTER_CAP_S ? RETRY_AFTER_CAP_S : secs) * 1000;
    }
    if (!parse_http_date(&c, now_unix_ms, &when_ms) || c.p != c.end) {
        return -1;
    }
    wait_ms = when_ms - now_unix_ms;
    if (wait_ms < 0) {
        return 0;
    }
    return wait_ms > HUB_BACKOFF_STEP_MAX_MS ? HUB_BACKOFF_STEP_MAX_MS : wait_ms;
}
