/*
 * jschema_format — the PCRE2 wrapper behind `pattern` and
 * `patternProperties`, and the three formats that assert (date-time, uri,
 * email).
 *
 * JSON Schema patterns are ECMA-262 regular expressions.  PCRE2 has no
 * ECMAScript mode; these options bring it closest for what schemas write:
 * UTF-8 subject and pattern, `$` only at the very end (no match before a
 * final newline), a back-reference to an unset group matches the empty
 * string, `\uhhhh` (and with PCRE2 >= 10.38 `\u{h...}`) escapes, and no `\C`
 * (which could split a UTF-8 character).  \d, \w and \b stay ASCII as in
 * ECMAScript without the `u` flag; \s stays ASCII where ECMAScript's is
 * Unicode (the optional ecmascript-regex cases list the difference).
 * Patterns are searched, not anchored, as the spec says.
 *
 * A search's cost is not bounded by PCRE2's match limit: the limit counts
 * per start position, and a pattern whose every attempt reads to the end of
 * the subject (`(?=a*[bc])` over a run of `a`) fails quickly at each
 * position after reading the rest, O(length^2) in all, with no limit ever
 * met: seconds for 200 KB, minutes for 1 MiB.  Patterns are therefore
 * compiled with automatic callouts (one before each item, which costs
 * little: the first-character scans and JIT stay), and the callout ends a
 * search whose thread has run past the deadline its caller set.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "jschema_int.h"
#include "util.h"

/* Compiled once per schema; the code is shared read-only by every
 * validating thread (PCRE2 code and JIT code are immutable after compile). */
pcre2_code *js_regex_compile(const char *src, size_t len, char *msg, size_t cap) {
    pcre2_compile_context *cctx = pcre2_compile_context_create(NULL);
    if (!cctx) {
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
#ifdef PCRE2_EXTRA_ALT_BSUX
    pcre2_set_compile_extra_options(cctx, PCRE2_EXTRA_ALT_BSUX);
#endif
    int code;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_MATCH_UNSET_BACKREF | PCRE2_ALT_BSUX |
                    PCRE2_NEVER_BACKSLASH_C | PCRE2_AUTO_CALLOUT;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)src, len, opts, &code, &off, cctx);
    pcre2_compile_context_free(cctx);
    if (!re) {
        PCRE2_UCHAR buf[120];
        pcre2_get_error_message(code, buf, sizeof buf);
        snprintf(msg, cap, "%s at offset %zu", (const char *)buf, (size_t)off);
        return NULL;
    }
    /* JIT is an optimisation: a pattern it refuses still runs interpreted */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

/* The search running on this thread: its deadline on the thread's CPU
 * clock (0: none), and its callouts. */
static __thread uint64_t search_deadline_ns;
static __thread unsigned search_callouts;

/* What a callout answers to end a search past its deadline (any negative
 * value ends it, and pcre2_match returns it). */
#define JS_REGEX_OVERTIME (-1000)

/* Every 32nd callout reads the clock (a system call): a few attempts of a
 * costly pattern, a fraction of a microsecond spread over cheap ones. */
static int search_callout(pcre2_callout_block *block, void *data) {
    (void)block;
    (void)data;
    if ((++search_callouts & 31) == 0 && search_deadline_ns != 0 &&
        hub_thread_cpu_ns() > search_deadline_ns) {
        return JS_REGEX_OVERTIME;
    }
    return 0;
}

void js_regex_context_init(pcre2_match_context *mctx) {
    pcre2_set_callout(mctx, search_callout, NULL);
}

/* Every limit error maps to -1 so that the caller can retry a first try
 * under the larger limit, and stop at a bound after that.  Strings come
 * from jansson, which holds them as valid UTF-8: no check per search. */
int js_regex_search(const pcre2_code *re, const char *subject, size_t len, pcre2_match_data *md,
                    pcre2_match_context *mctx, uint64_t deadline_ns, uint64_t *callouts) {
    int rc;

    search_deadline_ns = deadline_ns;
    search_callouts = 0;
    rc = pcre2_match(re, (PCRE2_SPTR)subject, len, 0, PCRE2_NO_UTF_CHECK, md, mctx);
    search_deadline_ns = 0;
    *callouts += search_callouts;
    if (rc >= 0) {
        return 1;
    }
    switch (rc) {
    case PCRE2_ERROR_NOMATCH:
        return 0;
    case JS_REGEX_OVERTIME:
        return -3;
    case PCRE2_ERROR_MATCHLIMIT:
    case PCRE2_ERROR_DEPTHLIMIT:
    case PCRE2_ERROR_HEAPLIMIT:
    case PCRE2_ERROR_JIT_STACKLIMIT:
        return -1;
    default:
        return -2;
    }
}

/* Unknown names are annotations: draft-07 lets a validator ignore
 * formats it does not implement. */
enum js_format js_format_parse(const char *name) {
    if (!name) {
        return JS_FMT_NONE;
    }
    if (strcmp(name, "date-time") == 0) {
        return JS_FMT_DATE_TIME;
    }
    if (strcmp(name, "uri") == 0) {
        return JS_FMT_URI;
    }
    if (strcmp(name, "email") == 0) {
        return JS_FMT_EMAIL;
    }
    return JS_FMT_NONE;
}

/* Reads exactly n decimal digits at s[*i] into *v, advancing *i; 0 when
 * the subject ends or a character is not a digit. */
static int digits(const char *s, size_t len, size_t *i, int n, int *v) {
    *v = 0;
    for (int k = 0; k < n; k++, (*i)++) {
        if (*i >= len || s[*i] < '0' || s[*i] > '9') {
            return 0;
        }
        *v = *v * 10 + (s[*i] - '0');
    }
    return 1;
}

/* Consumes one character of the set any at s[*i]; 0 when absent. */
static int expect(const char *s, size_t len, size_t *i, const char *any) {
    if (*i < len && s[*i] && strchr(any, s[*i])) {
        (*i)++;
        return 1;
    }
    return 0;
}

/*
 * RFC 3339 §5.6 date-time, e.g. 1985-04-12T23:20:50.52Z: full-date "T"
 * full-time, with "T" and "Z" in either case (§5.6 note), any number of
 * fraction digits, an offset of Z or +hh:mm / -hh:mm.  Calendar ranges are
 * checked (February 29 only in leap years); a leap second (:60) only where
 * it is 23:59:60 in UTC.  ISO 8601's other shapes (week dates, no
 * separators, a space for "T") are not RFC 3339 and fail.
 */
static int date_time_ok(const char *s, size_t len) {
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    size_t i = 0;
    int y, mo, d, h, mi, se, oh = 0, om = 0, sign = 0;
    if (!digits(s, len, &i, 4, &y) || !expect(s, len, &i, "-") || !digits(s, len, &i, 2, &mo) ||
        !expect(s, len, &i, "-") || !digits(s, len, &i, 2, &d) || !expect(s, len, &i, "Tt") ||
        !digits(s, len, &i, 2, &h) || !expect(s, len, &i, ":") || !digits(s, len, &i, 2, &mi) ||
        !expect(s, len, &i, ":") || !digits(s, len, &i, 2, &se)) {
        return 0;
    }
    if (i < len && s[i] == '.') {
        size_t start = ++i;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            i++;
        }
        if (i == start) {
            return 0;
        }
    }
    if (expect(s, len, &i, "Zz")) {
        sign = 0;
    } else if (i < len && (s[i] == '+' || s[i] == '-')) {
        sign = s[i++] == '+' ? 1 : -1;
        if (!digits(s, len, &i, 2, &oh) || !expect(s, len, &i, ":") ||
            !digits(s, len, &i, 2, &om)) {
            return 0;
        }
    } else {
        return 0;
    }
    if (i != len || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || se > 60 || oh > 23 ||
        om > 59) {
        return 0;
    }
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > mdays[mo - 1] + (mo == 2 && leap)) {
        return 0;
    }
    if (se == 60) {
        /* a leap second is 23:59:60 in UTC, whatever the offset */
        int utc = ((h * 60 + mi - sign * (oh * 60 + om)) % 1440 + 1440) % 1440;
        return utc == 23 * 60 + 59;
    }
    return 1;
}

/* ASCII classes, free of the locale that <ctype.h> would consult. */
static int is_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int is_digit(char c) {
    return c >= '0' && c <= '9';
}

static int is_hex(char c) {
    return hub_hex_value((unsigned char)c) >= 0;
}

/*
 * RFC 3986 §4.3 absolute URI: a scheme (a letter, then letters, digits,
 * "+", "-", "."), a ":", then only unreserved, reserved and %XX-escaped
 * characters, at most one "#".  Relative references fail (that is
 * `uri-reference`); the authority's inner grammar (IPv6 literals, ports)
 * is not parsed, only its characters checked.
 */
static int uri_ok(const char *s, size_t len) {
    size_t i = 0;
    if (len == 0 || !is_alpha(s[0])) {
        return 0;
    }
    while (i < len &&
           (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '+' || s[i] == '-' || s[i] == '.')) {
        i++;
    }
    if (i >= len || s[i] != ':') {
        return 0;
    }
    int hashes = 0;
    for (i++; i < len; i++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= len || !is_hex(s[i + 1]) || !is_hex(s[i + 2])) {
                return 0;
            }
            i += 2;
        } else if (c == '#') {
            hashes++;
        } else if (!(is_alpha(c) || is_digit(c) || (c && strchr("-._~:/?[]@!$&'()*+,;=", c)))) {
            return 0;
        }
    }
    return hashes <= 1;
}

/* A domain of dot-separated labels of letters, digits and inner hyphens
 * (RFC 1123 host names): each label 1-63 characters, 253 in all. */
static int hostname_ok(const char *s, size_t len) {
    if (len == 0 || len > 253) {
        return 0;
    }
    size_t label = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || s[i] == '.') {
            if (label == 0 || label > 63 || s[i - 1] == '-' || s[i - label] == '-') {
                return 0;
            }
            label = 0;
        } else if (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '-') {
            label++;
        } else {
            return 0;
        }
    }
    return 1;
}

/*
 * RFC 5321 §4.1.2 mailbox: a local part that is a dot-atom (atext
 * characters, dots only between them, at most 64) or a quoted string
 * (printable ASCII, backslash escapes), "@", then a host name or an
 * address literal in brackets.  Non-ASCII addresses are `idn-email`.
 */
static int email_ok(const char *s, size_t len) {
    const char *at = NULL;
    size_t i = 0;
    if (len > 0 && s[0] == '"') {
        for (i = 1; i < len && s[i] != '"'; i++) {
            if (s[i] == '\\') {
                i++;
            } else if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) {
                return 0;
            }
        }
        if (i >= len || i + 1 >= len || s[i + 1] != '@') {
            return 0;
        }
        at = s + i + 1;
    } else {
        for (i = 0; i < len && s[i] != '@'; i++) {
            char c = s[i];
            if (c == '.') {
                if (i == 0 || s[i - 1] == '.' || i + 1 >= len || s[i + 1] == '@') {
                    return 0;
                }
            } else if (!(is_alpha(c) || is_digit(c) || (c && strchr("!#$%&'*+-/=?^_`{|}~", c)))) {
                return 0;
            }
        }
        if (i == 0 || i >= len || i > 64) {
            return 0;
        }
        at = s + i;
    }
    const char *dom = at + 1;
    size_t dlen = len - (size_t)(dom - s);
    if (dlen >= 2 && dom[0] == '[' && dom[dlen - 1] == ']') {
        /* an address literal: digits, dots, hex and colons (IPv6:...) */
        for (size_t k = 1; k + 1 < dlen; k++) {
            if (!(is_hex(dom[k]) || dom[k] == '.' || dom[k] == ':' || is_alpha(dom[k]))) {
                return 0;
            }
        }
        return dlen > 2;
    }
    return hostname_ok(dom, dlen);
}

/* Dispatches on the format; a string of another format passes. */
int js_format_check(enum js_format f, const char *s, size_t len) {
    switch (f) {
    case JS_FMT_DATE_TIME:
        return date_time_ok(s, len);
    case JS_FMT_URI:
        return uri_ok(s, len);
    case JS_FMT_EMAIL:
        return email_ok(s, len);
    default:
        return 1;
    }
}
