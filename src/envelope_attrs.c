/*
 * envelope_attrs — attribute validation and derivation (SPEC §3.1).
 *
 * The syntax of each attribute (RFC 3339 time, URI and URI-reference,
 * media type, SemVer schema version, tenant id, attribute names, text),
 * the required/optional table applied to a parse context, the JSON payload
 * rule, and what is derived from valid attributes: the event type, the
 * schema major and attrs_json.  The pure checks are also public (envelope.h)
 * for the modules that read the same attributes elsewhere (the API, the
 * fuzz target).  Nothing here allocates outside the parse's arena.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "envelope_int.h"
#include "error.h"
#include "util.h"

/* Size limits of SPEC §3.1's attribute table, in bytes. */
#define MAX_ID_BYTES 256
#define MAX_SOURCE_BYTES 1024
#define MAX_TYPE_BYTES 256
#define MAX_TENANT_BYTES 256
#define MAX_SUBJECT_BYTES 1024

#define LERIAN_TYPE_PREFIX "studio.lerian."

/* ------------------------------------------------------------------------- */
/* Text and names                                                            */
/* ------------------------------------------------------------------------- */

/*
 * Checks that bytes are valid UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF) and contain no control character (< 0x20 or 0x7F).
 * Returns NULL when fine, else a short description of the problem.  Not
 * hub_utf8_valid: that one accepts control characters other than NUL.
 */
const char *env_text_problem(const unsigned char *s, size_t len) {
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
        /* The lead byte gives the sequence length, its payload bits and the
         * smallest code point that length may encode. */
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
        /* The minimum per length refuses overlong forms. */
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return "is not valid UTF-8";
        }
        i += extra + 1;
    }
    return NULL;
}

/* See envelope_int.h.  The CloudEvents naming rule: no dots, dashes or
 * capitals, so a name spells the same as a header, a member and a key. */
bool env_attr_name_valid(const char *s, size_t len) {
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

/* A character of tenantid, [a-zA-Z0-9._-] (SPEC §3.1). */
static bool is_tenant_char(unsigned char c) {
    return is_alpha(c) || is_digit(c) || c == '.' || c == '_' || c == '-';
}

/* ------------------------------------------------------------------------- */
/* Event type and schema versions                                            */
/* ------------------------------------------------------------------------- */

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
            /* "studio.lerian.ledger.transaction.created" keeps
             * "transaction.created": the segments after the second-to-last dot. */
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
    /* MINOR and PATCH are optional; a fourth part is left for the final check to refuse. */
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
    /* Checked digit by digit, so that a long suffix cannot overflow v itself. */
    for (size_t k = i; k < len; k++) {
        v = v * 10 + (topic[k] - '0');
        if (v > INT_MAX) {
            return 0;
        }
    }
    return (int)v;
}

/* ------------------------------------------------------------------------- */
/* RFC 3339 time                                                             */
/* ------------------------------------------------------------------------- */

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

/* Days in month m (1..12) of year y. */
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
 * Returns 0, or HUB_EINVAL when malformed.
 */
int hub_rfc3339_parse(const char *s, size_t len, int64_t *out_us) {
    /* The shortest form, "YYYY-MM-DDThh:mm:ssZ", is 20 bytes: the fixed
     * positions below are then all in bounds. */
    if (s == NULL || len < 20) {
        return HUB_EINVAL;
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
        return HUB_EINVAL;
    }

    size_t i = 19;
    int64_t frac_us = 0;
    if (s[i] == '.') {
        size_t start = ++i;
        /* Past the sixth digit scale is 0: further digits truncate, never round. */
        int64_t scale = 100000;
        while (i < len && is_digit((unsigned char)s[i])) {
            frac_us += (s[i] - '0') * scale;
            scale /= 10;
            i++;
        }
        if (i == start) {
            return HUB_EINVAL;
        }
    }

    int64_t offset_s = 0;
    if (i < len && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i < len && (s[i] == '+' || s[i] == '-')) {
        if (len - i < 6) {
            return HUB_EINVAL;
        }
        int oh = digits_at(s + i + 1, 2);
        int om = digits_at(s + i + 4, 2);
        if (oh < 0 || oh > 23 || s[i + 3] != ':' || om < 0 || om > 59) {
            return HUB_EINVAL;
        }
        /* Local time minus the offset is UTC: 10:00+01:00 is 09:00Z. */
        offset_s = (int64_t)oh * 3600 + om * 60;
        if (s[i] == '-') {
            offset_s = -offset_s;
        }
        i += 6;
    } else {
        return HUB_EINVAL;
    }
    if (i != len) {
        return HUB_EINVAL;
    }

    /* Both dates shifted by 400 years (days_since_year_one): the difference is the same. */
    int64_t days =
        days_since_year_one(year + 400, month, day) - days_since_year_one(1970 + 400, 1, 1);
    int64_t secs = days * 86400 + (int64_t)hour * 3600 + minute * 60 + second - offset_s;
    if (out_us != NULL) {
        *out_us = secs * 1000000 + frac_us;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* URIs and media types                                                      */
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

    /* A ':' ends a scheme only before any '/', '?' or '#': in "a/b:c" it is
     * part of a relative path, not the end of a scheme "a/b". */
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

/* Index past the RFC 9110 token at s[i] (i itself when there is none). */
static size_t skip_token(const char *s, size_t len, size_t i) {
    while (i < len && hub_http_tchar((unsigned char)s[i])) {
        i++;
    }
    return i;
}

/* Index past the optional whitespace (SP / HTAB, RFC 9110 OWS) at s[i]. */
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
            /* quoted-string: a backslash escapes the next byte, so \" does not end it. */
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
int hub_media_type_is_json(const char *s, size_t len) {
    size_t end = 0;
    while (end < len && s[end] != ';') {
        end++;
    }
    while (end > 0 && (s[end - 1] == ' ' || s[end - 1] == '\t')) {
        end--;
    }
    if (name_eq(s, end, "application/json", 16) || name_eq(s, end, "text/json", 9)) {
        return 1;
    }
    /* The "+json" suffix must lie after the slash, in the subtype. */
    const char *slash = memchr(s, '/', end);
    return slash != NULL && (size_t)(s + end - slash) > 5 && name_eq(s + end - 5, 5, "+json", 5);
}

/* ------------------------------------------------------------------------- */
/* Validation                                                                */
/* ------------------------------------------------------------------------- */

/* Required, non-empty, at most max bytes (max 0: no limit).  Returns 0 or -1. */
static int check_required(struct parse_ctx *ctx, enum attr_id a, size_t max) {
    const struct str *v = &ctx->val[a];
    const char *name = env_attr_names[a].name;
    if (v->p == NULL) {
        return env_fail_attr(ctx, a, "%s is required", name);
    }
    if (v->n == 0) {
        return env_fail_attr(ctx, a, "%s must not be empty", name);
    }
    if (max > 0 && v->n > max) {
        return env_fail_attr(ctx, a, "%s must be at most %zu bytes (got %zu)", name, max, v->n);
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
int env_validate_attributes(struct parse_ctx *ctx, const char *topic, struct hub_event *ev) {
    const struct str *v = ctx->val;
    const char *problem;

    /* The order is part of the contract: without a collector the first
     * refusal is the field err names (and the quarantine row records). */
    if (v[A_SPECVERSION].p == NULL) {
        env_fail_attr(ctx, A_SPECVERSION, "specversion is required");
        REFUSED();
    } else if (strcmp(v[A_SPECVERSION].p, "1.0") != 0) {
        env_fail_attr(ctx, A_SPECVERSION, "specversion must be \"1.0\"");
        REFUSED();
    }
    if (check_required(ctx, A_ID, MAX_ID_BYTES) != 0) {
        REFUSED();
    }
    if (check_required(ctx, A_SOURCE, MAX_SOURCE_BYTES) != 0) {
        REFUSED();
    } else if ((problem = check_uri(v[A_SOURCE].p, v[A_SOURCE].n, false)) != NULL) {
        env_fail_attr(ctx, A_SOURCE, "source %s", problem);
        REFUSED();
    }
    if (check_required(ctx, A_TYPE, MAX_TYPE_BYTES) != 0) {
        REFUSED();
    }
    if (check_required(ctx, A_TIME, 0) != 0) {
        REFUSED();
    } else if (hub_rfc3339_parse(v[A_TIME].p, v[A_TIME].n, &ev->time_us) != 0) {
        env_fail_attr(ctx, A_TIME, "time must be an RFC 3339 date-time");
        REFUSED();
    }
    if (check_required(ctx, A_TENANTID, MAX_TENANT_BYTES) != 0) {
        REFUSED();
    } else {
        for (size_t i = 0; i < v[A_TENANTID].n; i++) {
            if (!is_tenant_char((unsigned char)v[A_TENANTID].p[i])) {
                env_fail_attr(ctx, A_TENANTID, "tenantid must match [a-zA-Z0-9._-]{1,256}");
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
            env_fail_attr(ctx, A_SCHEMAVERSION,
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
        env_fail_attr(ctx, A_DATACONTENTTYPE,
                      ctx->content_type_from_header
                          ? "content-type header is not a media type (type/subtype[;params])"
                          : "datacontenttype is not a media type (type/subtype[;params])");
        REFUSED();
    }
    if (v[A_DATASCHEMA].p != NULL) {
        problem = v[A_DATASCHEMA].n == 0 ? "must not be empty"
                                         : check_uri(v[A_DATASCHEMA].p, v[A_DATASCHEMA].n, true);
        if (problem != NULL) {
            env_fail_attr(ctx, A_DATASCHEMA, "dataschema %s", problem);
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
    /* the event type they derive is a name subscriptions match, bounded as
     * a ce-type is (and as subscriptions' event_types entries are) */
    if (v[A_RESOURCETYPE].p != NULL && v[A_EVENTTYPE].p != NULL &&
        v[A_RESOURCETYPE].n + 1 + v[A_EVENTTYPE].n > MAX_TYPE_BYTES) {
        env_fail_attr(ctx, A_EVENTTYPE,
                      "the event type resourcetype.eventtype must be at most %d bytes (got %zu)",
                      MAX_TYPE_BYTES, v[A_RESOURCETYPE].n + 1 + v[A_EVENTTYPE].n);
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
 * A JSON content type requires a well-formed JSON payload.  What cannot be
 * JSON at all (empty, a raw NUL byte) is refused here; the grammar itself
 * is the caller's to check (envelope.h: json_unchecked), and a structured
 * event's data was parsed with the event.  Returns 0 or -1.
 */
int env_check_json_payload(struct parse_ctx *ctx) {
    if (ctx->payload_checked_json || ctx->payload_absent ||
        (ctx->content_type.p != NULL &&
         !hub_media_type_is_json(ctx->content_type.p, ctx->content_type.n))) {
        return 0;
    }
    if (ctx->payload_len == 0) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                        "a JSON content type requires a JSON payload, got an empty one");
    }
    /* A raw NUL byte is never valid JSON (inside strings it must be escaped). */
    if (memchr(ctx->payload, '\0', ctx->payload_len) != NULL) {
        return env_fail(ctx->err, HUB_ENVELOPE_INVALID, "data", 4,
                        "payload is not well-formed JSON (raw NUL byte)");
    }
    ctx->payload_json_unchecked = true;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Derivations                                                               */
/* ------------------------------------------------------------------------- */

/* See envelope_int.h.  Runs after validation, which refused an empty
 * resourcetype or eventtype, so the derived type has no empty half. */
int env_derive_event_type(struct parse_ctx *ctx, struct hub_event *ev) {
    const char *rt = ctx->val[A_RESOURCETYPE].p;
    const char *et = ctx->val[A_EVENTTYPE].p;
    /* Measured first (out NULL), then written into an exact arena block. */
    size_t n = hub_event_type_derive(ctx->val[A_TYPE].p, rt, et, NULL, 0);
    char *out = env_arena_alloc(&ctx->arena, n + 1, 1);
    if (out == NULL) {
        return env_fail_nomem(ctx);
    }
    hub_event_type_derive(ctx->val[A_TYPE].p, rt, et, out, n + 1);
    ev->event_type = out;
    return 0;
}

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

/*
 * The next attrs_json pair in key order: merges the fixed list (cursor *a
 * into attrs_sorted) with the sorted extensions (cursor *x).  Returns false
 * when both are exhausted.
 */
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
        if (!have_ext || strcmp(env_attr_names[id].name, ctx->extensions[*x].name) < 0) {
            const struct str *v = id == A_DATACONTENTTYPE ? &ctx->content_type : &ctx->val[id];
            *kv = (struct attr_kv){env_attr_names[id].name, v->p, v->n};
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
 * included, so consumers never have to know the default.  Two
 * passes over the pairs: the first sizes the one arena block, the second
 * writes it.
 */
int env_build_attrs_json(struct parse_ctx *ctx, struct hub_event *ev) {
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

    char *buf = env_arena_alloc(&ctx->arena, size + 1, 1);
    if (buf == NULL) {
        return env_fail_nomem(ctx);
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
