/*
 * envelope — CloudEvents envelope parsing and validation (SPEC §3.1, §4).
 *
 * One call turns the headers and value of a record into a validated
 * struct hub_event or into a precise refusal (reason + attribute at fault).
 *
 * Shape of a parse:
 *
 *   1. classify headers: ce-<attr> / ce_<attr> (Kafka only) / content-type /
 *      traceparent / tracestate; everything else is ignored.  Only the index of
 *      the last header of each attribute is remembered (last one wins), so the
 *      scan is O(n); extensions are sorted once (O(n log n)) to apply the same
 *      rule without a quadratic search.
 *   2. materialise the winning values into the event's arena, NUL-terminated,
 *      after HTTP percent-decoding, refusing control characters and bad UTF-8.
 *      In structured mode the values come from the members of the JSON
 *      CloudEvent instead.
 *   3. extract the payload and check its size, validate every attribute in a
 *      fixed order (so the reported field is deterministic), check that a JSON
 *      payload is well-formed, then derive event type, schema major,
 *      attrs_json and the SHA-256 digest.
 *
 * Everything the event points to lives in one arena (a list of malloc'd
 * blocks with a bump pointer); hub_event_free() releases the list.  Header
 * values are never assumed to be NUL-terminated and every index is checked
 * against its length: this function is fuzzed (tests/fuzz/fuzz_envelope.c).
 */
#include "envelope.h"

#include <jansson.h>
#include <limits.h>
#include <openssl/sha.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* SPEC §2.2 default of STREAMING_HUB_MAX_EVENT_BYTES, used when limits is NULL. */
#define ENVELOPE_DEFAULT_MAX_EVENT_BYTES ((size_t)1048576)

#define MAX_ID_BYTES 256
#define MAX_SOURCE_BYTES 1024
#define MAX_TYPE_BYTES 256
#define MAX_TENANT_BYTES 256
#define MAX_SUBJECT_BYTES 1024

#define LERIAN_TYPE_PREFIX "studio.lerian."
#define DEFAULT_CONTENT_TYPE "application/json"

/* jansson flags for parsing one value out of a longer text (see locate_data_span). */
#define JSON_LOAD_ONE                                                                              \
    (JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL)

/* ------------------------------------------------------------------------- */
/* Arena                                                                     */
/* ------------------------------------------------------------------------- */

/*
 * Small events (the common case: a dozen short attributes plus attrs_json)
 * fit in one block, so a parse costs one malloc for all its strings.
 */
#define ARENA_BLOCK_SIZE 1024 /* most events fit in one block: keeps in-flight batches small */

struct arena_block {
    struct arena_block *next;
    size_t cap;
    size_t used;
    max_align_t data[]; /* max_align_t elements keep every block start aligned */
};

struct arena {
    struct arena_block *head; /* current bump block; the rest of the list is full */
};

/*
 * Returns n bytes aligned to `align` (a power of two <= alignof(max_align_t))
 * owned by the arena, or NULL when out of memory.  Large requests get a block
 * of their own, linked behind the head so the head keeps serving small ones.
 */
static void *arena_alloc(struct arena *a, size_t n, size_t align) {
    struct arena_block *b = a->head;

    if (b != NULL) {
        size_t off = (b->used + align - 1) & ~(align - 1);
        if (off <= b->cap && b->cap - off >= n) {
            b->used = off + n;
            return (char *)b->data + off;
        }
    }
    if (n > SIZE_MAX - sizeof(struct arena_block) - ARENA_BLOCK_SIZE) {
        return NULL;
    }
    if (n > ARENA_BLOCK_SIZE / 4) {
        struct arena_block *big = malloc(sizeof(*big) + n);
        if (big == NULL) {
            return NULL;
        }
        big->cap = n;
        big->used = n;
        if (b != NULL) {
            big->next = b->next;
            b->next = big;
        } else {
            big->next = NULL;
            a->head = big;
        }
        return big->data;
    }
    struct arena_block *nb = malloc(sizeof(*nb) + ARENA_BLOCK_SIZE);
    if (nb == NULL) {
        return NULL;
    }
    nb->cap = ARENA_BLOCK_SIZE;
    nb->used = n;
    nb->next = b;
    a->head = nb;
    return nb->data;
}

/* Copies n bytes into the arena and NUL-terminates them; NULL when out of memory. */
static char *arena_strndup(struct arena *a, const void *p, size_t n) {
    if (n == SIZE_MAX) {
        return NULL;
    }
    char *s = arena_alloc(a, n + 1, 1);
    if (s == NULL) {
        return NULL;
    }
    if (n > 0) {
        memcpy(s, p, n);
    }
    s[n] = '\0';
    return s;
}

/* Frees every block; leaves the arena empty and reusable. */
static void arena_free(struct arena *a) {
    struct arena_block *b = a->head;
    while (b != NULL) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* ------------------------------------------------------------------------- */
/* Attributes                                                                */
/* ------------------------------------------------------------------------- */

/* Attributes with a dedicated field in struct hub_event. */
enum attr_id {
    A_SPECVERSION,
    A_ID,
    A_SOURCE,
    A_TYPE,
    A_TIME,
    A_TENANTID,
    A_SUBJECT,
    A_SCHEMAVERSION,
    A_DATACONTENTTYPE,
    A_DATASCHEMA,
    A_RESOURCETYPE,
    A_EVENTTYPE,
    /*
     * traceparent/tracestate are the CloudEvents distributed-tracing extension:
     * they arrive as plain `traceparent` headers or as ce-traceparent.  Giving
     * them a slot (instead of listing them as extensions) keeps one value per
     * name, so attrs_json never has two different "traceparent" keys.
     */
    A_TRACEPARENT,
    A_TRACESTATE,
    A_COUNT
};

static const struct {
    const char *name;
    size_t len;
} attr_names[A_COUNT] = {
    [A_SPECVERSION] = {"specversion", 11},
    [A_ID] = {"id", 2},
    [A_SOURCE] = {"source", 6},
    [A_TYPE] = {"type", 4},
    [A_TIME] = {"time", 4},
    [A_TENANTID] = {"tenantid", 8},
    [A_SUBJECT] = {"subject", 7},
    [A_SCHEMAVERSION] = {"schemaversion", 13},
    [A_DATACONTENTTYPE] = {"datacontenttype", 15},
    [A_DATASCHEMA] = {"dataschema", 10},
    [A_RESOURCETYPE] = {"resourcetype", 12},
    [A_EVENTTYPE] = {"eventtype", 9},
    [A_TRACEPARENT] = {"traceparent", 11},
    [A_TRACESTATE] = {"tracestate", 10},
};

/* A materialised attribute value: NUL-terminated, in the arena. */
struct str {
    const char *p; /* NULL when absent */
    size_t n;
};

/* A ce-* header that is not a known attribute, before dedup (binary mode). */
struct ext_ref {
    const char *name; /* after the prefix, as spelled */
    size_t name_len;
    size_t index; /* position in the header array: the last one wins */
};

/* Printed length of a field name in messages (names are not NUL-terminated). */
#define FIELD_PRINT_LEN(n) ((int)((n) < 64 ? (n) : 64))

/* No header index: slots store index + 1 so that 0 means "absent". */
#define NO_HEADER 0

struct parse_ctx {
    enum hub_envelope_mode mode;
    const struct hub_header *headers;
    size_t n_headers;
    size_t max_bytes;
    struct arena arena;
    struct hub_envelope_error *err;

    /* binary mode: index + 1 of the last header of each attribute */
    size_t ce_slot[A_COUNT];
    size_t plain_content_type;
    size_t plain_traceparent;
    size_t plain_tracestate;
    struct ext_ref *ext_refs; /* malloc'd scratch, freed before returning */
    size_t n_ext_refs;

    struct str val[A_COUNT];
    struct str content_type; /* effective: datacontenttype, content-type or the default */
    bool content_type_from_header;
    struct hub_attr *extensions;
    size_t n_extensions;

    const unsigned char *payload;
    size_t payload_len;
    bool payload_checked_json; /* payload is known to be well-formed JSON already */
    bool payload_absent;       /* structured event without data: no JSON check */
    bool payload_json_unchecked; /* must be JSON; its grammar is left to the caller */
    json_t *root;              /* structured mode: the parsed CloudEvent */

    struct hub_envelope_issues *issues;  /* limits->issues: collect every refusal */
    bool refused;                        /* validation refused something */
    struct hub_envelope_error first_err; /* ...and this first */
};

/* ------------------------------------------------------------------------- */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------- */

static unsigned char ascii_lower(unsigned char c) {
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

static bool is_alpha(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Case-insensitive (ASCII) equality of a length-delimited name with a literal. */
static bool name_eq(const char *name, size_t len, const char *lit, size_t lit_len) {
    if (len != lit_len) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        if (ascii_lower((unsigned char)name[i]) != (unsigned char)lit[i]) {
            return false;
        }
    }
    return true;
}

/* Case-insensitive prefix test on a length-delimited string. */
static bool prefix_ieq(const char *s, size_t len, const char *lit, size_t lit_len) {
    return len >= lit_len && name_eq(s, lit_len, lit, lit_len);
}

/*
 * Fills *err and returns -1.  The field is copied with non-printable bytes
 * replaced by '?' (it may come from an attacker-chosen header name and ends up
 * in logs and problem+json bodies); messages never quote attribute values or
 * payload bytes, only names and lengths.
 */
static int fail(struct hub_envelope_error *err, enum hub_envelope_reason reason, const char *field,
                size_t field_len, const char *fmt, ...) {
    size_t n = 0;

    err->reason = reason;
    if (field != NULL) {
        for (size_t i = 0; i < field_len && n + 1 < sizeof(err->field); i++) {
            unsigned char c = (unsigned char)field[i];
            err->field[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
        }
    }
    err->field[n] = '\0';

    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -1;
}

/* fail() for one of the dedicated attributes. */
static int fail_attr(struct parse_ctx *ctx, enum attr_id id, const char *fmt, ...) {
    char msg[sizeof(ctx->err->message)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return fail(ctx->err, HUB_ENVELOPE_INVALID, attr_names[id].name, attr_names[id].len, "%s", msg);
}

static int fail_nomem(struct parse_ctx *ctx) {
    /* There is no "transient" reason in the enum; the message lets the caller tell. */
    return fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0, "out of memory while parsing the envelope");
}

/*
 * Checks that bytes are valid UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF) and contain no control character (< 0x20 or 0x7F).
 * Returns NULL when fine, else a short description of the problem.
 */
static const char *check_text(const unsigned char *s, size_t len) {
    size_t i = 0;

    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f) {
                return "contains a control character";
            }
            i++;
            continue;
        }
        size_t extra;
        uint32_t cp;
        uint32_t min;
        if ((c & 0xe0) == 0xc0) {
            extra = 1;
            cp = c & 0x1f;
            min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            extra = 2;
            cp = c & 0x0f;
            min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            extra = 3;
            cp = c & 0x07;
            min = 0x10000;
        } else {
            return "is not valid UTF-8";
        }
        if (len - i - 1 < extra) {
            return "is not valid UTF-8";
        }
        for (size_t k = 1; k <= extra; k++) {
            unsigned char cc = s[i + k];
            if ((cc & 0xc0) != 0x80) {
                return "is not valid UTF-8";
            }
            cp = (cp << 6) | (cc & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return "is not valid UTF-8";
        }
        i += extra + 1;
    }
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* Public pure helpers                                                       */
/* ------------------------------------------------------------------------- */

const char *hub_envelope_reason_str(enum hub_envelope_reason reason) {
    switch (reason) {
    case HUB_ENVELOPE_OK:
        return "ok";
    case HUB_ENVELOPE_INVALID:
        return "invalid_envelope";
    case HUB_ENVELOPE_TOO_LARGE:
        return "too_large";
    }
    return "invalid_envelope";
}

/* Appends src[0..n) to out at *pos, never writing past outsz - 1. */
static void put_bytes(char *out, size_t outsz, size_t *pos, const char *src, size_t n) {
    if (out != NULL && *pos + 1 < outsz) {
        size_t room = outsz - 1 - *pos;
        memcpy(out + *pos, src, n < room ? n : room);
    }
    *pos += n;
}

/*
 * SPEC §3.1 "event type".  resourcetype.eventtype wins when both are given;
 * a studio.lerian.* type keeps its last two dot-segments (or the whole
 * remainder when it has only one); anything else is the whole ce-type.  An
 * empty remainder ("studio.lerian.") falls back to the whole type rather than
 * producing an empty event type.  Like snprintf, returns the full length and
 * writes at most outsz - 1 bytes plus the terminator (out may be NULL when
 * outsz is 0).
 */
size_t hub_event_type_derive(const char *ce_type, const char *resourcetype, const char *eventtype,
                             char *out, size_t outsz) {
    size_t pos = 0;

    if (resourcetype != NULL && eventtype != NULL) {
        put_bytes(out, outsz, &pos, resourcetype, strlen(resourcetype));
        put_bytes(out, outsz, &pos, ".", 1);
        put_bytes(out, outsz, &pos, eventtype, strlen(eventtype));
    } else if (ce_type != NULL) {
        size_t len = strlen(ce_type);
        size_t plen = sizeof(LERIAN_TYPE_PREFIX) - 1;
        const char *seg = ce_type;
        size_t seg_len = len;
        if (len > plen && memcmp(ce_type, LERIAN_TYPE_PREFIX, plen) == 0) {
            const char *rest = ce_type + plen;
            size_t rest_len = len - plen;
            const char *last = memrchr(rest, '.', rest_len);
            seg = rest;
            seg_len = rest_len;
            if (last != NULL && last > rest) {
                const char *prev = memrchr(rest, '.', (size_t)(last - rest));
                if (prev != NULL) {
                    seg = prev + 1;
                    seg_len = rest_len - (size_t)(seg - rest);
                }
            }
        }
        put_bytes(out, outsz, &pos, seg, seg_len);
    }
    if (out != NULL && outsz > 0) {
        out[pos < outsz ? pos : outsz - 1] = '\0';
    }
    return pos;
}

/*
 * Parses a SemVer numeric identifier at s[*i]: digits, no leading zero unless
 * it is "0".  Stores its value capped at INT_MAX + 1 (so callers can refuse
 * overflow) and advances *i.  Returns false when there is no valid number.
 */
static bool parse_numeric_id(const char *s, size_t len, size_t *i, long long *value) {
    size_t start = *i;
    long long v = 0;

    while (*i < len && is_digit((unsigned char)s[*i])) {
        if (v <= INT_MAX) {
            v = v * 10 + (s[*i] - '0');
        }
        (*i)++;
    }
    if (*i == start || (s[start] == '0' && *i - start > 1)) {
        return false;
    }
    *value = v;
    return true;
}

/*
 * Parses dot-separated SemVer identifiers ([0-9A-Za-z-]+) at s[*i]; when
 * numeric_rule is set (pre-release), all-digit identifiers may not have
 * leading zeros.  Returns false when empty or malformed.
 */
static bool parse_semver_ids(const char *s, size_t len, size_t *i, bool numeric_rule) {
    for (;;) {
        size_t start = *i;
        bool all_digits = true;
        while (*i < len) {
            unsigned char c = (unsigned char)s[*i];
            if (!is_alpha(c) && !is_digit(c) && c != '-') {
                break;
            }
            all_digits = all_digits && is_digit(c);
            (*i)++;
        }
        if (*i == start) {
            return false;
        }
        if (numeric_rule && all_digits && s[start] == '0' && *i - start > 1) {
            return false;
        }
        if (*i < len && s[*i] == '.') {
            (*i)++;
            continue;
        }
        return true;
    }
}

/*
 * Accepts an optional 'v'/'V', then MAJOR, MAJOR.MINOR or full SemVer 2.0.0
 * MAJOR.MINOR.PATCH[-pre-release][+build].  Pre-release and build metadata
 * only follow a full three-part version, as in SemVer.  Returns the major
 * (0..INT_MAX) or -1.
 */
int hub_schema_major_parse(const char *s, size_t len) {
    size_t i = 0;
    long long major = 0;
    long long part = 0;
    int parts = 1;

    if (s == NULL || len == 0) {
        return -1;
    }
    if (s[0] == 'v' || s[0] == 'V') {
        i = 1;
    }
    if (!parse_numeric_id(s, len, &i, &major) || major > INT_MAX) {
        return -1;
    }
    while (parts < 3 && i < len && s[i] == '.') {
        i++;
        if (!parse_numeric_id(s, len, &i, &part)) {
            return -1;
        }
        parts++;
    }
    if (parts == 3 && i < len && s[i] == '-') {
        i++;
        if (!parse_semver_ids(s, len, &i, true)) {
            return -1;
        }
    }
    if (parts == 3 && i < len && s[i] == '+') {
        i++;
        if (!parse_semver_ids(s, len, &i, false)) {
            return -1;
        }
    }
    return i == len ? (int)major : -1;
}

/*
 * ".vN" at the very end of the topic, N one or more digits.  "v0" and values
 * that do not fit an int count as no suffix (0), so the caller falls back to 1.
 */
int hub_topic_schema_major(const char *topic) {
    if (topic == NULL) {
        return 0;
    }
    size_t len = strlen(topic);
    size_t i = len;
    while (i > 0 && is_digit((unsigned char)topic[i - 1])) {
        i--;
    }
    if (i == len || i < 2 || topic[i - 1] != 'v' || topic[i - 2] != '.') {
        return 0;
    }
    long long v = 0;
    for (size_t k = i; k < len; k++) {
        v = v * 10 + (topic[k] - '0');
        if (v > INT_MAX) {
            return 0;
        }
    }
    return (int)v;
}

/* Two or four ASCII digits at s (bounds checked by the caller); -1 otherwise. */
static int digits_at(const char *s, size_t n) {
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit((unsigned char)s[i])) {
            return -1;
        }
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static bool is_leap_year(int y) {
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int days_in_month(int y, int m) {
    static const int dim[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return (m == 2 && is_leap_year(y)) ? 29 : dim[m - 1];
}

/*
 * Days from 0001-01-01 to y-m-d in the proleptic Gregorian calendar (y >= 1).
 * Callers shift years by 400 (exactly 146097 days, same leap pattern) so that
 * year 0000 of RFC 3339 stays in range without negative division.
 */
static int64_t days_since_year_one(int y, int m, int d) {
    static const int before_month[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    int64_t py = (int64_t)y - 1;
    int64_t days = py * 365 + py / 4 - py / 100 + py / 400;
    days += before_month[m - 1] + ((m > 2 && is_leap_year(y)) ? 1 : 0);
    return days + d - 1;
}

/*
 * RFC 3339 date-time:
 *   YYYY-MM-DD ("T" / "t") hh:mm:ss [ "." 1*DIGIT ] ( "Z" / "z" / ("+" / "-") hh:mm )
 * Ranges are checked (month, day of month with leap years, hour <= 23,
 * minute <= 59, second <= 60 for leap seconds, offset <= 23:59).  The space
 * separator that RFC 3339 mentions only in a note is refused: the value is
 * forwarded to consumers, and strict parsers downstream reject it.  Fractions
 * may have any number of digits; digits past the sixth are truncated.  A
 * leap second is converted as the first second of the next minute.
 */
int hub_rfc3339_parse(const char *s, size_t len, int64_t *out_us) {
    if (s == NULL || len < 20) {
        return -1;
    }
    int year = digits_at(s, 4);
    int month = digits_at(s + 5, 2);
    int day = digits_at(s + 8, 2);
    int hour = digits_at(s + 11, 2);
    int minute = digits_at(s + 14, 2);
    int second = digits_at(s + 17, 2);
    if (year < 0 || s[4] != '-' || month < 1 || month > 12 || s[7] != '-' || day < 1 ||
        day > days_in_month(year, month) || (s[10] != 'T' && s[10] != 't') || hour < 0 ||
        hour > 23 || s[13] != ':' || minute < 0 || minute > 59 || s[16] != ':' || second < 0 ||
        second > 60) {
        return -1;
    }

    size_t i = 19;
    int64_t frac_us = 0;
    if (s[i] == '.') {
        size_t start = ++i;
        int64_t scale = 100000;
        while (i < len && is_digit((unsigned char)s[i])) {
            frac_us += (s[i] - '0') * scale;
            scale /= 10;
            i++;
        }
        if (i == start) {
            return -1;
        }
    }

    int64_t offset_s = 0;
    if (i < len && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i < len && (s[i] == '+' || s[i] == '-')) {
        if (len - i < 6) {
            return -1;
        }
        int oh = digits_at(s + i + 1, 2);
        int om = digits_at(s + i + 4, 2);
        if (oh < 0 || oh > 23 || s[i + 3] != ':' || om < 0 || om > 59) {
            return -1;
        }
        offset_s = (int64_t)oh * 3600 + om * 60;
        if (s[i] == '-') {
            offset_s = -offset_s;
        }
        i += 6;
    } else {
        return -1;
    }
    if (i != len) {
        return -1;
    }

    int64_t days =
        days_since_year_one(year + 400, month, day) - days_since_year_one(1970 + 400, 1, 1);
    int64_t secs = days * 86400 + (int64_t)hour * 3600 + minute * 60 + second - offset_s;
    if (out_us != NULL) {
        *out_us = secs * 1000000 + frac_us;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Attribute syntax checks                                                   */
/* ------------------------------------------------------------------------- */

/* RFC 3986 unreserved, gen-delims and sub-delims ('%' is handled apart). */
static bool is_uri_char(unsigned char c) {
    if (is_alpha(c) || is_digit(c)) {
        return true;
    }
    return strchr("-._~:/?#[]@!$&'()*+,;=", c) != NULL && c != '\0';
}

/*
 * A pragmatic RFC 3986 check: only URI characters, well-formed percent
 * escapes, at most one '#', and when a ':' comes before any '/', '?' or '#'
 * the part before it must be a valid scheme (a relative reference cannot
 * have a colon in its first segment).  With `absolute`, the scheme is
 * required.  Returns NULL when fine, else what is wrong.
 */
static const char *check_uri(const char *s, size_t len, bool absolute) {
    size_t hashes = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '%') {
            if (len - i < 3 || hub_hex_value((unsigned char)s[i + 1]) < 0 ||
                hub_hex_value((unsigned char)s[i + 2]) < 0) {
                return "has a malformed percent-escape";
            }
            i += 2;
        } else if (c == '#') {
            if (++hashes > 1) {
                return "has more than one '#'";
            }
        } else if (!is_uri_char(c)) {
            return "contains a character not allowed in a URI";
        }
    }

    size_t colon = len;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == ':') {
            colon = i;
            break;
        }
        if (c == '/' || c == '?' || c == '#') {
            break;
        }
    }
    if (colon == len) {
        return absolute ? "must be an absolute URI (scheme:...)" : NULL;
    }
    if (colon == 0 || !is_alpha((unsigned char)s[0])) {
        return "has an invalid URI scheme";
    }
    for (size_t i = 1; i < colon; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!is_alpha(c) && !is_digit(c) && c != '+' && c != '-' && c != '.') {
            return "has an invalid URI scheme";
        }
    }
    return NULL;
}

static size_t skip_token(const char *s, size_t len, size_t i) {
    while (i < len && hub_http_tchar((unsigned char)s[i])) {
        i++;
    }
    return i;
}

static size_t skip_ows(const char *s, size_t len, size_t i) {
    while (i < len && (s[i] == ' ' || s[i] == '\t')) {
        i++;
    }
    return i;
}

/*
 * type "/" subtype *( OWS ";" OWS token "=" ( token / quoted-string ) ).
 * Bytes >= 0x80 are allowed inside quoted strings (obs-text); the value has
 * already been checked to be UTF-8 without control characters.
 */
static bool check_media_type(const char *s, size_t len) {
    size_t i = skip_token(s, len, 0);
    if (i == 0 || i >= len || s[i] != '/') {
        return false;
    }
    size_t sub = ++i;
    i = skip_token(s, len, i);
    if (i == sub) {
        return false;
    }
    for (;;) {
        i = skip_ows(s, len, i);
        if (i == len) {
            return true;
        }
        if (s[i] != ';') {
            return false;
        }
        i = skip_ows(s, len, i + 1);
        size_t name = i;
        i = skip_token(s, len, i);
        if (i == name || i >= len || s[i] != '=') {
            return false;
        }
        i++;
        if (i < len && s[i] == '"') {
            i++;
            while (i < len && s[i] != '"') {
                if (s[i] == '\\') {
                    i++;
                    if (i >= len) {
                        return false;
                    }
                }
                i++;
            }
            if (i >= len) {
                return false;
            }
            i++;
        } else {
            size_t v = i;
            i = skip_token(s, len, i);
            if (i == v) {
                return false;
            }
        }
    }
}

/*
 * JSON content types: application/json, text/json and any "+json" structured
 * syntax suffix (RFC 6839), compared case-insensitively without parameters.
 */
static bool is_json_media_type(const char *s, size_t len) {
    size_t end = 0;
    while (end < len && s[end] != ';') {
        end++;
    }
    while (end > 0 && (s[end - 1] == ' ' || s[end - 1] == '\t')) {
        end--;
    }
    if (name_eq(s, end, "application/json", 16) || name_eq(s, end, "text/json", 9)) {
        return true;
    }
    const char *slash = memchr(s, '/', end);
    return slash != NULL && (size_t)(s + end - slash) > 5 && name_eq(s + end - 5, 5, "+json", 5);
}

int hub_media_type_is_json(const char *s, size_t len) {
    return is_json_media_type(s, len);
}

static bool is_tenant_char(unsigned char c) {
    return is_alpha(c) || is_digit(c) || c == '.' || c == '_' || c == '-';
}

/* CloudEvents attribute naming: [a-z0-9]+ (names are already lower-cased). */
static bool is_valid_attr_name(const char *s, size_t len) {
    if (len == 0) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || is_digit(c))) {
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------------------- */
/* Binary mode                                                               */
/* ------------------------------------------------------------------------- */

/* Dedicated attribute named by a (case-insensitive) spelling, or A_COUNT. */
static enum attr_id lookup_attr(const char *name, size_t len) {
    for (int a = 0; a < A_COUNT; a++) {
        if (name_eq(name, len, attr_names[a].name, attr_names[a].len)) {
            return (enum attr_id)a;
        }
    }
    return A_COUNT;
}

/*
 * One pass over the headers: remembers the last header of each attribute
 * (index + 1) and collects every other ce-* header in ctx->ext_refs (a
 * scratch array sized on first use).  In HTTP mode only "ce-" is a prefix;
 * "ce_foo" is then an unrelated header and ignored.
 */
static int classify_headers(struct parse_ctx *ctx) {
    for (size_t i = 0; i < ctx->n_headers; i++) {
        const struct hub_header *h = &ctx->headers[i];
        const char *name = h->name;
        size_t len = name != NULL ? h->name_len : 0;

        if (len >= 3 && ascii_lower((unsigned char)name[0]) == 'c' &&
            ascii_lower((unsigned char)name[1]) == 'e' &&
            (name[2] == '-' || (name[2] == '_' && ctx->mode == HUB_ENVELOPE_KAFKA))) {
            enum attr_id a = lookup_attr(name + 3, len - 3);
            if (a != A_COUNT) {
                ctx->ce_slot[a] = i + 1;
                continue;
            }
            if (ctx->ext_refs == NULL) {
                /* Sized for the worst case once, so the scan stays O(n). */
                ctx->ext_refs = malloc((ctx->n_headers - i) * sizeof(*ctx->ext_refs));
                if (ctx->ext_refs == NULL) {
                    return fail_nomem(ctx);
                }
            }
            ctx->ext_refs[ctx->n_ext_refs++] = (struct ext_ref){name + 3, len - 3, i};
        } else if (name_eq(name, len, "content-type", 12)) {
            ctx->plain_content_type = i + 1;
        } else if (name_eq(name, len, "traceparent", 11)) {
            ctx->plain_traceparent = i + 1;
        } else if (name_eq(name, len, "tracestate", 10)) {
            ctx->plain_tracestate = i + 1;
        }
    }
    return 0;
}

/*
 * Copies header `slot` (index + 1) into the arena as a NUL-terminated string.
 * `decode` applies the HTTP binding's percent-decoding (any "%XX" becomes
 * the byte XX; a '%' not followed by two hex digits is refused).  The result
 * must be UTF-8 without control characters.  Errors name `field`.
 */
static int take_header_value(struct parse_ctx *ctx, size_t slot, bool decode, const char *field,
                             size_t field_len, struct str *out) {
    const struct hub_header *h = &ctx->headers[slot - 1];
    const unsigned char *in = h->value;
    size_t len = in != NULL ? h->value_len : 0;

    if (len == SIZE_MAX) {
        return fail_nomem(ctx);
    }
    char *buf = arena_alloc(&ctx->arena, len + 1, 1);
    if (buf == NULL) {
        return fail_nomem(ctx);
    }
    size_t n = 0;
    if (decode) {
        for (size_t i = 0; i < len; i++) {
            if (in[i] != '%') {
                buf[n++] = (char)in[i];
                continue;
            }
            int hi = len - i >= 3 ? hub_hex_value(in[i + 1]) : -1;
            int lo = len - i >= 3 ? hub_hex_value(in[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                return fail(ctx->err, HUB_ENVELOPE_INVALID, field, field_len,
                            "%.*s has a malformed percent-encoding", FIELD_PRINT_LEN(field_len),
                            field);
            }
            buf[n++] = (char)(hi * 16 + lo);
            i += 2;
        }
    } else if (len > 0) {
        memcpy(buf, in, len);
        n = len;
    }
    buf[n] = '\0';

    const char *problem = check_text((const unsigned char *)buf, n);
    if (problem != NULL) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, field, field_len, "%.*s %s",
                    FIELD_PRINT_LEN(field_len), field, problem);
    }
    out->p = buf;
    out->n = n;
    return 0;
}

/* Case-insensitive equality of two extension ref names. */
static bool ext_ref_same_name(const struct ext_ref *x, const struct ext_ref *y) {
    if (x->name_len != y->name_len) {
        return false;
    }
    for (size_t i = 0; i < x->name_len; i++) {
        if (ascii_lower((unsigned char)x->name[i]) != ascii_lower((unsigned char)y->name[i])) {
            return false;
        }
    }
    return true;
}

/* Orders extension refs by lower-cased name, then by header position. */
static int ext_ref_cmp(const void *a, const void *b) {
    const struct ext_ref *x = a;
    const struct ext_ref *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;

    for (size_t i = 0; i < n; i++) {
        unsigned char cx = ascii_lower((unsigned char)x->name[i]);
        unsigned char cy = ascii_lower((unsigned char)y->name[i]);
        if (cx != cy) {
            return cx < cy ? -1 : 1;
        }
    }
    if (x->name_len != y->name_len) {
        return x->name_len < y->name_len ? -1 : 1;
    }
    return x->index < y->index ? -1 : (x->index > y->index ? 1 : 0);
}

/*
 * Extensions of binary mode: sort the refs so that equal names are adjacent
 * with the last header of each name last, keep that one, and check the name
 * ([a-z0-9]+, after lower-casing since header names are case-insensitive)
 * and the value.  The result is sorted by name.
 */
static int take_binary_extensions(struct parse_ctx *ctx) {
    size_t n = ctx->n_ext_refs;

    if (n == 0) {
        return 0;
    }
    qsort(ctx->ext_refs, n, sizeof(*ctx->ext_refs), ext_ref_cmp);

    /* A ref wins when the next one has another name; count winners to size the array. */
    size_t unique = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 1 == n || !ext_ref_same_name(&ctx->ext_refs[i], &ctx->ext_refs[i + 1])) {
            unique++;
        }
    }
    ctx->extensions =
        arena_alloc(&ctx->arena, unique * sizeof(*ctx->extensions), alignof(struct hub_attr));
    if (ctx->extensions == NULL) {
        return fail_nomem(ctx);
    }

    bool decode = ctx->mode == HUB_ENVELOPE_HTTP;
    for (size_t i = 0; i < n; i++) {
        const struct ext_ref *r = &ctx->ext_refs[i];
        if (i + 1 < n && ext_ref_same_name(r, &ctx->ext_refs[i + 1])) {
            continue; /* a later header of the same name wins */
        }
        char *name = arena_strndup(&ctx->arena, r->name, r->name_len);
        if (name == NULL) {
            return fail_nomem(ctx);
        }
        for (size_t k = 0; k < r->name_len; k++) {
            name[k] = (char)ascii_lower((unsigned char)name[k]);
        }
        if (!is_valid_attr_name(name, r->name_len)) {
            return fail(ctx->err, HUB_ENVELOPE_INVALID, name, r->name_len,
                        "extension attribute name must match [a-z0-9]+");
        }
        if (strcmp(name, "data") == 0) {
            return fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                        "\"data\" is reserved and cannot be an extension attribute");
        }
        struct str v;
        if (take_header_value(ctx, r->index + 1, decode, name, r->name_len, &v) != 0) {
            return -1;
        }
        ctx->extensions[ctx->n_extensions].name = name;
        ctx->extensions[ctx->n_extensions].value = v.p;
        ctx->n_extensions++;
    }
    return 0;
}

/*
 * Binary mode: materialises the winning ce-* headers, content-type and the
 * trace headers.  The payload is the record value itself (zero-copy).
 */
static int take_binary(struct parse_ctx *ctx, const void *value, size_t value_len) {
    bool decode = ctx->mode == HUB_ENVELOPE_HTTP;

    for (int a = 0; a < A_COUNT; a++) {
        size_t slot = ctx->ce_slot[a];
        /* A plain traceparent/tracestate header competes with its ce- spelling. */
        bool plain = false;
        if (a == A_TRACEPARENT && ctx->plain_traceparent > slot) {
            slot = ctx->plain_traceparent;
            plain = true;
        } else if (a == A_TRACESTATE && ctx->plain_tracestate > slot) {
            slot = ctx->plain_tracestate;
            plain = true;
        }
        if (slot == NO_HEADER) {
            continue;
        }
        if (take_header_value(ctx, slot, decode && !plain, attr_names[a].name, attr_names[a].len,
                              &ctx->val[a]) != 0) {
            return -1;
        }
    }

    if (ctx->val[A_DATACONTENTTYPE].p != NULL) {
        ctx->content_type = ctx->val[A_DATACONTENTTYPE];
    } else if (ctx->plain_content_type != NO_HEADER) {
        /* The binding maps datacontenttype to the content-type header. */
        if (take_header_value(ctx, ctx->plain_content_type, false, "datacontenttype", 15,
                              &ctx->content_type) != 0) {
            return -1;
        }
        ctx->content_type_from_header = true;
    }

    if (take_binary_extensions(ctx) != 0) {
        return -1;
    }

    static const unsigned char empty[1] = {0};
    ctx->payload = value != NULL ? value : empty;
    ctx->payload_len = value != NULL ? value_len : 0;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Structured mode                                                           */
/* ------------------------------------------------------------------------- */

static size_t skip_json_ws(const char *s, size_t len, size_t i) {
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) {
        i++;
    }
    return i;
}

/*
 * SPEC §3.1 wants the payload to be the `data` member "exactly as it appears
 * in the received JSON text", and jansson does not report member positions.
 * It does report, with JSON_DISABLE_EOF_CHECK, how many bytes one value
 * used.  So, on a text jansson has already accepted as a whole object, this
 * walks the top-level members letting jansson parse each key and each value
 * and only steps over the ", : { }" punctuation and JSON whitespace itself.
 * Every JSON value is still parsed by jansson; nothing here decides validity.
 * The last "data" member wins, as it does in jansson's object.
 * Returns 0 with [*start, *end) or -1 when not found (caller treats as a bug).
 */
static int locate_data_span(const char *text, size_t len, size_t *start, size_t *end) {
    bool found = false;
    json_error_t jerr;
    size_t i = skip_json_ws(text, len, 0);

    if (i >= len || text[i] != '{') {
        return -1;
    }
    i++;
    for (;;) {
        i = skip_json_ws(text, len, i);
        if (i >= len) {
            return -1;
        }
        if (text[i] == '}') {
            break;
        }
        json_t *key = json_loadb(text + i, len - i, JSON_LOAD_ONE, &jerr);
        if (!json_is_string(key) || jerr.position <= 0) {
            json_decref(key);
            return -1;
        }
        bool is_data =
            json_string_length(key) == 4 && memcmp(json_string_value(key), "data", 4) == 0;
        json_decref(key);
        i = skip_json_ws(text, len, i + (size_t)jerr.position);
        if (i >= len || text[i] != ':') {
            return -1;
        }
        i = skip_json_ws(text, len, i + 1);
        json_t *v = json_loadb(text + i, len - i, JSON_LOAD_ONE, &jerr);
        if (v == NULL || jerr.position <= 0) {
            json_decref(v);
            return -1;
        }
        json_decref(v);
        if (is_data) {
            *start = i;
            *end = i + (size_t)jerr.position;
            found = true;
        }
        i = skip_json_ws(text, len, i + (size_t)jerr.position);
        if (i < len && text[i] == ',') {
            i++;
            continue;
        }
        if (i < len && text[i] == '}') {
            break;
        }
        return -1;
    }
    return found ? 0 : -1;
}

long hub_envelope_batch_split(const void *value, size_t len, size_t max, size_t **spans) {
    const char *text = value;
    json_error_t jerr;
    json_t *all;
    size_t n = 0;
    size_t i;

    *spans = NULL;
    if (text == NULL || len > INT_MAX / 2 || memchr(text, '\0', len) != NULL) {
        return -1; /* a raw NUL is never JSON (see take_structured) */
    }
    all = json_loadb(text, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    if (!json_is_array(all) || json_array_size(all) > max) {
        json_decref(all);
        return -1;
    }
    if (json_array_size(all) > 0) {
        *spans = malloc(sizeof(**spans) * 2 * json_array_size(all));
        if (*spans == NULL) {
            json_decref(all);
            return -1;
        }
    }
    json_decref(all);
    /* As in locate_data_span: jansson measures each element, this only
     * steps over "[ , ]" and whitespace of a text jansson accepted whole. */
    i = skip_json_ws(text, len, 0) + 1; /* past '[' */
    for (;;) {
        i = skip_json_ws(text, len, i);
        if (i >= len || text[i] == ']') {
            break;
        }
        json_t *v = json_loadb(text + i, len - i, JSON_LOAD_ONE, &jerr);
        if (v == NULL || jerr.position <= 0 || *spans == NULL) {
            json_decref(v);
            break;
        }
        json_decref(v);
        (*spans)[2 * n] = i;
        (*spans)[2 * n + 1] = i + (size_t)jerr.position;
        n++;
        i = skip_json_ws(text, len, i + (size_t)jerr.position);
        if (i < len && text[i] == ',') {
            i++;
        }
    }
    return (long)n;
}

/*
 * Decodes RFC 4648 base64 (padding optional, no whitespace).  Checks the
 * size against the limit before allocating.  Stores the bytes in the arena.
 */
static int take_data_base64(struct parse_ctx *ctx, const char *s, size_t len) {
    size_t out_len;
    if (hub_base64_decoded_len(s, len, &out_len) != 0) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "data_base64", 11,
                    "data_base64 is not valid base64");
    }
    if (out_len > ctx->max_bytes) {
        return fail(ctx->err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                    "payload of %zu bytes exceeds the limit of %zu bytes", out_len, ctx->max_bytes);
    }
    unsigned char *out = arena_alloc(&ctx->arena, out_len + 1, 1);
    if (out == NULL) {
        return fail_nomem(ctx);
    }
    size_t n;
    if (hub_base64_decode(s, len, 0, out, out_len, &n) != 0) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "data_base64", 11,
                    "data_base64 is not valid base64");
    }
    out[n] = '\0';
    ctx->payload = out;
    ctx->payload_len = n;
    return 0;
}

/*
 * Turns one member value into an attribute string.  Dedicated attributes
 * must be JSON strings.  Extensions may also be a JSON integer (CloudEvents
 * Integer, 32-bit) or boolean: those are CloudEvents types whose canonical
 * string form is what binary mode would carry, so the event looks the same
 * whichever mode it came in.  Because the document is decoded with integers
 * as reals, an integral number written 5.0 or 5e0 is taken as 5 too.  JSON
 * null means "absent".  Returns 1 when absent, 0 when stored, -1 on error.
 */
static int take_member(struct parse_ctx *ctx, const char *name, size_t name_len, json_t *v,
                       bool extension, struct str *out) {
    char num[16];
    const char *p;
    size_t n;

    if (json_is_null(v)) {
        return 1;
    }
    if (json_is_string(v)) {
        p = json_string_value(v);
        n = json_string_length(v);
    } else if (extension && json_is_boolean(v)) {
        p = json_is_true(v) ? "true" : "false";
        n = strlen(p);
    } else if (extension && json_is_real(v) && json_real_value(v) >= INT32_MIN &&
               json_real_value(v) <= INT32_MAX &&
               json_real_value(v) == (double)(int32_t)json_real_value(v)) {
        /* The document is parsed with JSON_DECODE_INT_AS_REAL (see take_structured). */
        n = (size_t)snprintf(num, sizeof(num), "%d", (int)(int32_t)json_real_value(v));
        p = num;
    } else {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, name, name_len,
                    extension ? "%.*s must be a string, a boolean or a 32-bit integer"
                              : "%.*s must be a JSON string",
                    FIELD_PRINT_LEN(name_len), name);
    }
    const char *problem = check_text((const unsigned char *)p, n);
    if (problem != NULL) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, name, name_len, "%.*s %s",
                    FIELD_PRINT_LEN(name_len), name, problem);
    }
    out->p = arena_strndup(&ctx->arena, p, n);
    if (out->p == NULL) {
        return fail_nomem(ctx);
    }
    out->n = n;
    return 0;
}

static int hub_attr_cmp(const void *a, const void *b) {
    return strcmp(((const struct hub_attr *)a)->name, ((const struct hub_attr *)b)->name);
}

/*
 * Structured mode: the value is a JSON CloudEvent (application/cloudevents+json).
 * Plain traceparent/tracestate headers are taken first; members of the same
 * name override them (the event is the JSON document).  ce-* headers are
 * ignored, as the bindings prescribe for structured mode.
 */
static int take_structured(struct parse_ctx *ctx, const void *value, size_t value_len) {
    const struct hub_header *ct = &ctx->headers[ctx->plain_content_type - 1];
    const char *ctv = ct->value;
    size_t ctlen = ctv != NULL ? ct->value_len : 0;
    size_t end = 0;
    json_error_t jerr;

    while (end < ctlen && ctv[end] != ';' && ctv[end] != ' ' && ctv[end] != '\t') {
        end++;
    }
    if (name_eq(ctv, end, "application/cloudevents-batch+json", 34)) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                    "batch mode is not accepted here; split the batch into events first");
    }
    if (!name_eq(ctv, end, "application/cloudevents+json", 28)) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                    "unsupported structured content type (only application/cloudevents+json)");
    }
    /* jansson reports positions as int; nothing that large is a sane event. */
    if (value_len > INT_MAX / 2) {
        return fail(ctx->err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                    "structured event of %zu bytes is too large", value_len);
    }

    if (ctx->plain_traceparent != NO_HEADER &&
        take_header_value(ctx, ctx->plain_traceparent, false, "traceparent", 11,
                          &ctx->val[A_TRACEPARENT]) != 0) {
        return -1;
    }
    if (ctx->plain_tracestate != NO_HEADER &&
        take_header_value(ctx, ctx->plain_tracestate, false, "tracestate", 10,
                          &ctx->val[A_TRACESTATE]) != 0) {
        return -1;
    }

    /*
     * JSON_ALLOW_NUL: "\u0000" is legal JSON; attribute values are checked
     * below.  JSON_DECODE_INT_AS_REAL: integers beyond 64 bits (big amounts
     * in data) are legal JSON too, and jansson would refuse them as "too big
     * integer"; the payload is taken from the text, so how numbers decode
     * here does not matter except for Integer extensions (take_member).
     */
    if (value_len > 0 && memchr(value, '\0', value_len) != NULL) {
        /* A raw NUL is never JSON, but jansson 2.14 skips one that follows a
         * literal or a number ({"a":true<NUL>} parses): refused first. */
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                    "structured event is not valid JSON (raw NUL byte)");
    }
    ctx->root = json_loadb(value != NULL ? value : "", value != NULL ? value_len : 0,
                           JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    if (ctx->root == NULL) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                    "structured event is not valid JSON (line %d, column %d)", jerr.line,
                    jerr.column);
    }
    if (!json_is_object(ctx->root)) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "", 0,
                    "structured event must be a JSON object");
    }

    size_t n_members = json_object_size(ctx->root);
    ctx->extensions =
        arena_alloc(&ctx->arena, n_members * sizeof(*ctx->extensions), alignof(struct hub_attr));
    if (ctx->extensions == NULL && n_members > 0) {
        return fail_nomem(ctx);
    }

    const char *key;
    size_t key_len;
    json_t *member;
    json_t *data = NULL;
    json_t *data_b64 = NULL;
    json_object_keylen_foreach(ctx->root, key, key_len, member) {
        if (key_len == 4 && memcmp(key, "data", 4) == 0) {
            data = json_is_null(member) ? NULL : member;
            continue;
        }
        if (key_len == 11 && memcmp(key, "data_base64", 11) == 0) {
            data_b64 = json_is_null(member) ? NULL : member;
            continue;
        }
        if (!is_valid_attr_name(key, key_len)) {
            return fail(ctx->err, HUB_ENVELOPE_INVALID, key, key_len,
                        "attribute name must match [a-z0-9]+");
        }
        enum attr_id a = A_COUNT;
        for (int k = 0; k < A_COUNT; k++) {
            if (key_len == attr_names[k].len && memcmp(key, attr_names[k].name, key_len) == 0) {
                a = (enum attr_id)k;
                break;
            }
        }
        if (a != A_COUNT) {
            struct str v = {NULL, 0};
            int rc = take_member(ctx, key, key_len, member, false, &v);
            if (rc < 0) {
                return -1;
            }
            if (rc == 0) {
                ctx->val[a] = v;
            }
            continue;
        }
        struct str v;
        int rc = take_member(ctx, key, key_len, member, true, &v);
        if (rc < 0) {
            return -1;
        }
        if (rc == 0) {
            char *name = arena_strndup(&ctx->arena, key, key_len);
            if (name == NULL) {
                return fail_nomem(ctx);
            }
            ctx->extensions[ctx->n_extensions].name = name;
            ctx->extensions[ctx->n_extensions].value = v.p;
            ctx->n_extensions++;
        }
    }
    if (ctx->n_extensions > 1) {
        qsort(ctx->extensions, ctx->n_extensions, sizeof(*ctx->extensions), hub_attr_cmp);
    }
    if (ctx->val[A_DATACONTENTTYPE].p != NULL) {
        ctx->content_type = ctx->val[A_DATACONTENTTYPE];
    }

    bool json_ct =
        ctx->content_type.p == NULL || is_json_media_type(ctx->content_type.p, ctx->content_type.n);
    if (data != NULL && data_b64 != NULL) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                    "data and data_base64 are mutually exclusive");
    }
    if (data_b64 != NULL) {
        if (!json_is_string(data_b64)) {
            return fail(ctx->err, HUB_ENVELOPE_INVALID, "data_base64", 11,
                        "data_base64 must be a JSON string");
        }
        return take_data_base64(ctx, json_string_value(data_b64), json_string_length(data_b64));
    }
    if (data == NULL) {
        /* No data at all is a CloudEvent without payload, not a malformed JSON payload. */
        ctx->payload = (const unsigned char *)"";
        ctx->payload_len = 0;
        ctx->payload_absent = true;
        return 0;
    }

    const char *src;
    size_t n;
    if (json_is_string(data) && !json_ct) {
        /* A string under a non-JSON type is the data itself (JSON event format §3.1). */
        src = json_string_value(data);
        n = json_string_length(data);
    } else {
        size_t start = 0;
        size_t stop = 0;
        if (locate_data_span(value, value_len, &start, &stop) != 0) {
            return fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                        "internal error: could not locate the data member");
        }
        src = (const char *)value + start;
        n = stop - start;
        /* jansson parsed this exact span as one JSON value. */
        ctx->payload_checked_json = true;
    }
    if (n > ctx->max_bytes) {
        return fail(ctx->err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                    "payload of %zu bytes exceeds the limit of %zu bytes", n, ctx->max_bytes);
    }
    /* Copied so that a structured payload never depends on the record value (envelope.h). */
    char *copy = arena_strndup(&ctx->arena, src, n);
    if (copy == NULL) {
        return fail_nomem(ctx);
    }
    ctx->payload = (const unsigned char *)copy;
    ctx->payload_len = n;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Validation                                                                */
/* ------------------------------------------------------------------------- */

/* Required, non-empty, at most max bytes (max 0: no limit). */
static int check_required(struct parse_ctx *ctx, enum attr_id a, size_t max) {
    const struct str *v = &ctx->val[a];
    if (v->p == NULL) {
        return fail_attr(ctx, a, "%s is required", attr_names[a].name);
    }
    if (v->n == 0) {
        return fail_attr(ctx, a, "%s must not be empty", attr_names[a].name);
    }
    if (max > 0 && v->n > max) {
        return fail_attr(ctx, a, "%s must be at most %zu bytes (got %zu)", attr_names[a].name, max,
                         v->n);
    }
    return 0;
}

/* Optional: when present, non-empty and at most max bytes (max 0: no limit). */
static int check_optional(struct parse_ctx *ctx, enum attr_id a, size_t max) {
    if (ctx->val[a].p == NULL) {
        return 0;
    }
    return check_required(ctx, a, max);
}

/*
 * Validation refused something (err holds it).  Without a collector that
 * ends validation: returns 0.  With one (HTTP ingest names every attribute
 * at fault, SPEC §4) it is recorded and validation goes on: returns 1.
 * The first refusal is what err reports in the end either way.
 */
static int note_issue(struct parse_ctx *ctx) {
    struct hub_envelope_issues *is = ctx->issues;

    if (is == NULL) {
        return 0;
    }
    if (!ctx->refused) {
        ctx->first_err = *ctx->err;
        ctx->refused = true;
    }
    if (is->n < HUB_ENVELOPE_MAX_ISSUES) {
        snprintf(is->item[is->n].field, sizeof(is->item[is->n].field), "%s", ctx->err->field);
        snprintf(is->item[is->n].message, sizeof(is->item[is->n].message), "%s", ctx->err->message);
        is->n++;
    }
    return 1;
}

/* In validate_attributes: after a refused check, stop or go on (note_issue). */
#define REFUSED()                                                                                  \
    do {                                                                                           \
        if (!note_issue(ctx)) {                                                                    \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/*
 * The SPEC §3.1 table, in a fixed order.  Fills ev->time_us and
 * ev->schema_major on the way.  Each attribute is checked on its own, so a
 * collector (note_issue) hears of every one at fault.
 */
static int validate_attributes(struct parse_ctx *ctx, const char *topic, struct hub_event *ev) {
    const struct str *v = ctx->val;
    const char *problem;

    if (v[A_SPECVERSION].p == NULL) {
        fail_attr(ctx, A_SPECVERSION, "specversion is required");
        REFUSED();
    } else if (strcmp(v[A_SPECVERSION].p, "1.0") != 0) {
        fail_attr(ctx, A_SPECVERSION, "specversion must be \"1.0\"");
        REFUSED();
    }
    if (check_required(ctx, A_ID, MAX_ID_BYTES) != 0) {
        REFUSED();
    }
    if (check_required(ctx, A_SOURCE, MAX_SOURCE_BYTES) != 0) {
        REFUSED();
    } else if ((problem = check_uri(v[A_SOURCE].p, v[A_SOURCE].n, false)) != NULL) {
        fail_attr(ctx, A_SOURCE, "source %s", problem);
        REFUSED();
    }
    if (check_required(ctx, A_TYPE, MAX_TYPE_BYTES) != 0) {
        REFUSED();
    }
    if (check_required(ctx, A_TIME, 0) != 0) {
        REFUSED();
    } else if (hub_rfc3339_parse(v[A_TIME].p, v[A_TIME].n, &ev->time_us) != 0) {
        fail_attr(ctx, A_TIME, "time must be an RFC 3339 date-time");
        REFUSED();
    }
    if (check_required(ctx, A_TENANTID, MAX_TENANT_BYTES) != 0) {
        REFUSED();
    } else {
        for (size_t i = 0; i < v[A_TENANTID].n; i++) {
            if (!is_tenant_char((unsigned char)v[A_TENANTID].p[i])) {
                fail_attr(ctx, A_TENANTID, "tenantid must match [a-zA-Z0-9._-]{1,256}");
                REFUSED();
                break;
            }
        }
    }
    if (check_optional(ctx, A_SUBJECT, MAX_SUBJECT_BYTES) != 0) {
        REFUSED();
    }

    if (v[A_SCHEMAVERSION].p != NULL) {
        int major = hub_schema_major_parse(v[A_SCHEMAVERSION].p, v[A_SCHEMAVERSION].n);
        if (major < 0) {
            fail_attr(ctx, A_SCHEMAVERSION,
                      "schemaversion must be semver or a bare major (1.0.0, v2, ...)");
            REFUSED();
        }
        /* Major 0 is valid semver: stored, and matched by no subscription
         * (they name majors >= 1, SPEC §6); zero matches is no error. */
        ev->schema_major = major;
    } else {
        int major = hub_topic_schema_major(topic);
        ev->schema_major = major >= 1 ? major : 1;
    }

    if (ctx->content_type.p != NULL &&
        !check_media_type(ctx->content_type.p, ctx->content_type.n)) {
        fail_attr(ctx, A_DATACONTENTTYPE,
                  ctx->content_type_from_header
                      ? "content-type header is not a media type (type/subtype[;params])"
                      : "datacontenttype is not a media type (type/subtype[;params])");
        REFUSED();
    }
    if (v[A_DATASCHEMA].p != NULL) {
        problem = v[A_DATASCHEMA].n == 0 ? "must not be empty"
                                         : check_uri(v[A_DATASCHEMA].p, v[A_DATASCHEMA].n, true);
        if (problem != NULL) {
            fail_attr(ctx, A_DATASCHEMA, "dataschema %s", problem);
            REFUSED();
        }
    }
    /* An empty half would derive an event type like "ledger." that nothing can name. */
    if (check_optional(ctx, A_RESOURCETYPE, 0) != 0) {
        REFUSED();
    }
    if (check_optional(ctx, A_EVENTTYPE, 0) != 0) {
        REFUSED();
    }
    if (ctx->refused) {
        *ctx->err = ctx->first_err;
        return -1;
    }
    return 0;
}

#undef REFUSED

/*
 * A JSON content type requires a well-formed JSON payload: one jansson parse,
 * result discarded.  JSON_DECODE_INT_AS_REAL keeps integers beyond 64 bits
 * (big ledger amounts) from being refused as "too big integer"; numbers
 * beyond the double range (1e400) are still refused by jansson — a known
 * limitation.  JSON_ALLOW_NUL because "\u0000" is legal JSON.
 */
static int check_json_payload(struct parse_ctx *ctx) {
    if (ctx->payload_checked_json || ctx->payload_absent ||
        (ctx->content_type.p != NULL &&
         !is_json_media_type(ctx->content_type.p, ctx->content_type.n))) {
        return 0;
    }
    if (ctx->payload_len == 0) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                    "a JSON content type requires a JSON payload, got an empty one");
    }
    /* A raw NUL byte is never valid JSON (inside strings it must be escaped). */
    if (memchr(ctx->payload, '\0', ctx->payload_len) != NULL) {
        return fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                    "payload is not well-formed JSON (raw NUL byte)");
    }
    /* The grammar is the caller's to check (envelope.h: json_unchecked). */
    ctx->payload_json_unchecked = true;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Derivations                                                               */
/* ------------------------------------------------------------------------- */

/* One key/value of attrs_json. */
struct attr_kv {
    const char *key;
    const char *value;
    size_t len;
};

/* Dedicated attributes in strcmp order of their names, for attrs_json. */
static const enum attr_id attrs_sorted[A_COUNT] = {
    A_DATACONTENTTYPE, A_DATASCHEMA, A_EVENTTYPE, A_ID,   A_RESOURCETYPE, A_SCHEMAVERSION, A_SOURCE,
    A_SPECVERSION,     A_SUBJECT,    A_TENANTID,  A_TIME, A_TRACEPARENT,  A_TRACESTATE,    A_TYPE,
};

/* Length of s as a JSON string literal (see put_json_string). */
static size_t json_string_size(const char *s, size_t n) {
    size_t size = n + 2;
    for (size_t i = 0; i < n; i++) {
        size += (s[i] == '"' || s[i] == '\\') ? 1 : 0;
    }
    return size;
}

/*
 * Writes s as a JSON string literal and returns the end.  Only for values
 * already checked to be UTF-8 without control characters: then '"' and '\\'
 * are the only bytes JSON requires escaping, and the output is byte for byte
 * what jansson's encoder produces (the fuzz target checks exactly that).
 */
static char *put_json_string(char *out, const char *s, size_t n) {
    *out++ = '"';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\') {
            *out++ = '\\';
        }
        *out++ = s[i];
    }
    *out++ = '"';
    return out;
}

/* The next attrs_json pair in key order: merges the fixed list with the sorted extensions. */
static bool attrs_next(const struct parse_ctx *ctx, size_t *a, size_t *x, struct attr_kv *kv) {
    while (*a < A_COUNT) {
        enum attr_id id = attrs_sorted[*a];
        const struct str *v = id == A_DATACONTENTTYPE ? &ctx->content_type : &ctx->val[id];
        if (v->p != NULL) {
            break;
        }
        (*a)++;
    }
    bool have_attr = *a < A_COUNT;
    bool have_ext = *x < ctx->n_extensions;
    if (!have_attr && !have_ext) {
        return false;
    }
    if (have_attr) {
        enum attr_id id = attrs_sorted[*a];
        /* Extension names never equal a dedicated name (those are classified first). */
        if (!have_ext || strcmp(attr_names[id].name, ctx->extensions[*x].name) < 0) {
            const struct str *v = id == A_DATACONTENTTYPE ? &ctx->content_type : &ctx->val[id];
            *kv = (struct attr_kv){attr_names[id].name, v->p, v->n};
            (*a)++;
            return true;
        }
    }
    const struct hub_attr *e = &ctx->extensions[(*x)++];
    *kv = (struct attr_kv){e->name, e->value, strlen(e->value)};
    return true;
}

/*
 * attrs_json: every attribute kept, as one compact JSON object with keys in
 * sorted order (stable bytes for storage and tests), the same bytes as
 * jansson's JSON_COMPACT | JSON_SORT_KEYS.  It is written directly because
 * building a jansson object per event cost about 10 us, a third of the parse
 * of a typical event.  datacontenttype is the effective one, default
 * included, so consumers never have to know the default.
 */
static int build_attrs_json(struct parse_ctx *ctx, struct hub_event *ev) {
    struct attr_kv kv;
    size_t a = 0;
    size_t x = 0;
    size_t size = 2; /* braces */
    size_t pairs = 0;

    while (attrs_next(ctx, &a, &x, &kv)) {
        /* Keys are [a-z0-9]+: nothing to escape. */
        size += strlen(kv.key) + 3 + json_string_size(kv.value, kv.len);
        pairs++;
    }
    size += pairs > 1 ? pairs - 1 : 0; /* commas */

    char *buf = arena_alloc(&ctx->arena, size + 1, 1);
    if (buf == NULL) {
        return fail_nomem(ctx);
    }
    char *p = buf;
    a = 0;
    x = 0;
    *p++ = '{';
    for (size_t i = 0; attrs_next(ctx, &a, &x, &kv); i++) {
        if (i > 0) {
            *p++ = ',';
        }
        p = put_json_string(p, kv.key, strlen(kv.key));
        *p++ = ':';
        p = put_json_string(p, kv.value, kv.len);
    }
    *p++ = '}';
    *p = '\0';
    ev->attrs_json = buf;
    ev->attrs_json_len = (size_t)(p - buf);
    return 0;
}

static int derive_event_type(struct parse_ctx *ctx, struct hub_event *ev) {
    const char *rt = ctx->val[A_RESOURCETYPE].p;
    const char *et = ctx->val[A_EVENTTYPE].p;
    size_t n = hub_event_type_derive(ctx->val[A_TYPE].p, rt, et, NULL, 0);
    char *out = arena_alloc(&ctx->arena, n + 1, 1);
    if (out == NULL) {
        return fail_nomem(ctx);
    }
    hub_event_type_derive(ctx->val[A_TYPE].p, rt, et, out, n + 1);
    ev->event_type = out;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Entry points                                                              */
/* ------------------------------------------------------------------------- */

/*
 * See envelope.h.  Steps: size gate (binary), classify headers, take values
 * (binary or structured), validate, check a JSON payload, derive.  Every
 * failure lands in the single unwind below, which frees the arena and the
 * scratch array and leaves *ev zeroed.
 */
int hub_envelope_parse(enum hub_envelope_mode mode, const struct hub_header *headers,
                       size_t n_headers, const void *value, size_t value_len, const char *topic,
                       const struct hub_envelope_limits *limits, struct hub_event *ev,
                       struct hub_envelope_error *err) {
    struct hub_envelope_error scratch_err;
    struct parse_ctx ctx;

    if (err == NULL) {
        err = &scratch_err;
    }
    memset(err, 0, sizeof(*err));
    if (ev == NULL) {
        return fail(err, HUB_ENVELOPE_INVALID, "", 0, "no event to fill");
    }
    memset(ev, 0, sizeof(*ev));
    memset(&ctx, 0, sizeof(ctx));
    ctx.mode = mode == HUB_ENVELOPE_HTTP ? HUB_ENVELOPE_HTTP : HUB_ENVELOPE_KAFKA;
    ctx.headers = headers;
    ctx.n_headers = headers != NULL ? n_headers : 0;
    ctx.max_bytes = limits != NULL ? limits->max_event_bytes : ENVELOPE_DEFAULT_MAX_EVENT_BYTES;
    ctx.err = err;
    ctx.issues = limits != NULL ? limits->issues : NULL;
    if (ctx.issues != NULL) {
        ctx.issues->n = 0;
    }
    if (value == NULL) {
        value_len = 0;
    }

    if (classify_headers(&ctx) != 0) {
        goto fail;
    }
    const struct hub_header *ct =
        ctx.plain_content_type != NO_HEADER ? &headers[ctx.plain_content_type - 1] : NULL;
    bool structured = ct != NULL && ct->name != NULL && ct->value != NULL &&
                      prefix_ieq(ct->value, ct->value_len, "application/cloudevents", 23);

    if (structured) {
        if (take_structured(&ctx, value, value_len) != 0) {
            goto fail;
        }
    } else {
        /* Cheapest refusal first: the record value is the payload. */
        if (value_len > ctx.max_bytes) {
            fail(err, HUB_ENVELOPE_TOO_LARGE, "data", 4,
                 "payload of %zu bytes exceeds the limit of %zu bytes", value_len, ctx.max_bytes);
            goto fail;
        }
        if (take_binary(&ctx, value, value_len) != 0) {
            goto fail;
        }
    }
    if (ctx.val[A_TENANTID].p == NULL && limits != NULL && limits->default_tenant != NULL) {
        size_t n = strlen(limits->default_tenant);
        ctx.val[A_TENANTID].p = arena_strndup(&ctx.arena, limits->default_tenant, n);
        if (ctx.val[A_TENANTID].p == NULL) {
            fail_nomem(&ctx);
            goto fail;
        }
        ctx.val[A_TENANTID].n = n;
    }
    bool default_ct = ctx.content_type.p == NULL;
    if (default_ct) {
        ctx.content_type.p = DEFAULT_CONTENT_TYPE;
        ctx.content_type.n = sizeof(DEFAULT_CONTENT_TYPE) - 1;
    }

    if (validate_attributes(&ctx, topic, ev) != 0 || check_json_payload(&ctx) != 0 ||
        derive_event_type(&ctx, ev) != 0 || build_attrs_json(&ctx, ev) != 0) {
        goto fail;
    }

    ev->specversion = ctx.val[A_SPECVERSION].p;
    ev->id = ctx.val[A_ID].p;
    ev->source = ctx.val[A_SOURCE].p;
    ev->type = ctx.val[A_TYPE].p;
    ev->time = ctx.val[A_TIME].p;
    ev->tenant = ctx.val[A_TENANTID].p;
    ev->subject = ctx.val[A_SUBJECT].p;
    ev->schema_version = ctx.val[A_SCHEMAVERSION].p;
    ev->dataschema = ctx.val[A_DATASCHEMA].p;
    ev->resourcetype = ctx.val[A_RESOURCETYPE].p;
    ev->eventtype = ctx.val[A_EVENTTYPE].p;
    ev->traceparent = ctx.val[A_TRACEPARENT].p;
    ev->tracestate = ctx.val[A_TRACESTATE].p;
    if (default_ct) {
        /* Keep every string of the event in its arena, the default included. */
        ctx.content_type.p =
            arena_strndup(&ctx.arena, DEFAULT_CONTENT_TYPE, sizeof(DEFAULT_CONTENT_TYPE) - 1);
        if (ctx.content_type.p == NULL) {
            fail_nomem(&ctx);
            goto fail;
        }
    }
    ev->content_type = ctx.content_type.p;
    ev->extensions = ctx.n_extensions > 0 ? ctx.extensions : NULL;
    ev->n_extensions = ctx.n_extensions;
    ev->payload = ctx.payload;
    ev->payload_len = ctx.payload_len;
    ev->json_unchecked = ctx.payload_json_unchecked ? 1 : 0;
    SHA256(ctx.payload, ctx.payload_len, ev->digest);
    ev->structured = structured ? 1 : 0;
    ev->arena_ = ctx.arena.head;

    json_decref(ctx.root);
    free(ctx.ext_refs);
    return 0;

fail:
    json_decref(ctx.root);
    free(ctx.ext_refs);
    ctx.ext_refs = NULL;
    arena_free(&ctx.arena);
    memset(ev, 0, sizeof(*ev));
    return -1;
}

void hub_event_free(struct hub_event *ev) {
    if (ev == NULL) {
        return;
    }
    struct arena a = {ev->arena_};
    arena_free(&a);
    memset(ev, 0, sizeof(*ev));
}
