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

/* Lower-case hex of len bytes into out (2*len+1 bytes, NUL-terminated). */
void hub_hex(const unsigned char *in, size_t len, char *out);

/* Standard base64 with padding; returns malloc'd NUL-terminated text or NULL. */
char *hub_base64(const void *in, size_t len);

/* base64url without padding into out (4*ceil(len/3)+1 bytes); returns length. */
size_t hub_base64url(const unsigned char *in, size_t len, char *out);

/*
 * Strict standard base64 decode of in[0..inlen) into out[0..outsz): optional
 * but exact padding, no whitespace, zero unused bits (one spelling per value,
 * so a mangled key is refused instead of becoming a different key).  Returns
 * 0 with *outlen set, or -1.
 */
int hub_base64_decode(const char *in, size_t inlen, unsigned char *out, size_t outsz,
                      size_t *outlen);

/* Monotonic clock in nanoseconds. */
uint64_t hub_now_ns(void);

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
