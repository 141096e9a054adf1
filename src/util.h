/*
 * util — small helpers shared by several modules (text checks, encodings,
 * clocks).  Pure functions, no allocation unless stated.
 */
#ifndef HUB_UTIL_H
#define HUB_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* 1 when p[0..len) is valid UTF-8 without NUL bytes (storable as PG text). */
int hub_utf8_valid(const void *p, size_t len);

/* Length of the longest prefix of p[0..len) that hub_utf8_valid accepts: where
 * text cut at a byte limit, or holding a stray byte, stops being storable. */
size_t hub_utf8_prefix(const void *p, size_t len);

/* Value of one hex digit (either case), -1 for anything else. */
int hub_hex_value(unsigned char c);

/* Lower-case hex of len bytes into out (2*len+1 bytes, NUL-terminated). */
void hub_hex(const unsigned char *in, size_t len, char *out);

/* Standard base64 with padding; returns malloc'd NUL-terminated text or NULL. */
char *hub_base64(const void *in, size_t len);

/* base64url without padding into out (4*ceil(len/3)+1 bytes); returns length. */
size_t hub_base64url(const unsigned char *in, size_t len, char *out);

/* How hub_base64_decode reads its input (flags, or'ed). */
enum {
    HUB_B64_URL = 1,    /* the RFC 4648 §5 alphabet ('-', '_') instead of §4's ('+', '/') */
    HUB_B64_STRICT = 2, /* the last character's unused bits must be zero: one spelling
                         * per value, so a mangled key is refused instead of becoming
                         * a different key */
};

/*
 * Decodes base64 in[0..inlen) into out[0..outsz): padding optional but
 * exact when present (only with a length that is a multiple of 4), no
 * whitespace.  Returns 0 with *outlen set, or -1 (malformed, or longer than
 * outsz).
 */
int hub_base64_decode(const char *in, size_t inlen, unsigned flags, unsigned char *out,
                      size_t outsz, size_t *outlen);

/* The length hub_base64_decode would give for text of this shape (its
 * padding and length; the characters are not checked): 0 with *outlen set,
 * or -1 when no base64 text is this long.  For a size check before the
 * buffer exists. */
int hub_base64_decoded_len(const char *in, size_t inlen, size_t *outlen);

/* 1 when c belongs to the base64url alphabet (no padding). */
int hub_base64url_char(char c);

/*
 * FNV-1a, 64 bits: the one hash of the hub's small in-memory tables (rate
 * buckets, the URL cache, the batch's repeated keys).  Not for anything an
 * attacker can aim at a fixed table size to degrade it beyond a longer
 * chain.  hub_fnv1a continues from h (start with HUB_FNV1A_BASIS), so a key
 * of several parts hashes part by part; hub_fnv1a_str hashes one C string.
 */
#define HUB_FNV1A_BASIS 14695981039346656037ULL
uint64_t hub_fnv1a(uint64_t h, const void *p, size_t len);
uint64_t hub_fnv1a_str(const char *s);

/* 1 when c is an RFC 9110 token character (header names, media types). */
int hub_http_tchar(unsigned char c);

/* 1 when s[0..len) is a non-empty RFC 9110 token (a header name). */
int hub_http_token(const char *s, size_t len);

/* 1 when s[0..len) may stand on the wire as a header value verbatim: HTAB,
 * SP..~ and bytes >= 0x80; never CR, LF, NUL or another control byte (the
 * bytes of header injection). */
int hub_http_value_safe(const char *s, size_t len);

/* Monotonic clock in nanoseconds. */
uint64_t hub_now_ns(void);

/* The calling thread's CPU clock, in nanoseconds (a system call: the vDSO
 * reads only the wall clocks). */
uint64_t hub_thread_cpu_ns(void);

/* Wall clock in Unix microseconds. */
int64_t hub_unix_us(void);

/* Writes unix_us as RFC 3339 UTC with frac_digits (3 or 6) fractional
 * digits, "2026-12-03T07:15:41.123Z", into out (at least 32 bytes). */
void hub_rfc3339(int64_t unix_us, int frac_digits, char *out, size_t outsz);

/* Creates dir and its parents (mode 0755 for new ones).  Returns 0 or -1. */
int hub_mkdir_p(const char *dir);

/* Reads a whole small file into a malloc'd NUL-terminated buffer; NULL on error. */
char *hub_read_file(const char *path, size_t *len);

/* Writes data to path atomically (temp file + rename) with the given mode. */
int hub_write_file(const char *path, const void *data, size_t len, int mode);

#endif
