/*
 * sign — webhook signing secrets and request signatures (SPEC §6, §7.2).
 *
 * A subscription's signing secret is "whsec_" + standard base64 of 32 random
 * bytes; the HMAC key is the decoded part.  Every delivery carries two
 * signature headers computed with that key:
 *
 *   webhook-signature   "v1,<base64 HMAC-SHA256(key, id "." ts "." body)>"
 *                       (Standard Webhooks, so off-the-shelf verifiers work)
 *   X-Lerian-Signature  "v1,sha256=<hex HMAC-SHA256(key, "v1:" ts "." body)>"
 *
 * During a secret rotation both the new and the previous secret sign, and each
 * header holds one entry per key, space-separated (hub_sign_headers()).
 *
 * Pure code: no I/O, no global state; randomness comes from OpenSSL's CSPRNG
 * only in hub_secret_generate().  Safe to call from any thread.
 */
#ifndef HUB_SIGN_H
#define HUB_SIGN_H

#include <stddef.h>
#include <stdint.h>

#define HUB_SECRET_PREFIX "whsec_"

/* Largest HMAC key accepted (the SHA-256 block size; longer keys buy nothing). */
#define HUB_SIGN_KEY_MAX 64

/* Bytes needed for a generated secret: "whsec_" + 44 base64 characters + NUL. */
#define HUB_SECRET_SIZE 51

/* Bytes needed for one entry, NUL included: "v1," + 44 base64 characters. */
#define HUB_SIGN_WEBHOOK_SIZE 48
/* Bytes needed for one entry, NUL included: "v1,sha256=" + 64 hex digits. */
#define HUB_SIGN_LERIAN_SIZE 75
/* Bytes needed for a header of n entries: each entry is followed by a space or the NUL. */
#define HUB_SIGN_HEADER_SIZE(entry_size, n) ((entry_size) * (n))

/* One decoded signing key.  Holds secret material: wipe it (OPENSSL_cleanse)
 * when done, as the dispatcher does after each attempt. */
struct hub_sign_key {
    unsigned char key[HUB_SIGN_KEY_MAX];
    size_t len;
};

/*
 * Writes a new secret, "whsec_" + base64 of 32 bytes from RAND_bytes, into out
 * (outsz >= HUB_SECRET_SIZE), NUL-terminated.  Returns 0, or -1 when the
 * buffer is too small or the CSPRNG fails (out is then "").
 */
int hub_secret_generate(char *out, size_t outsz);

/*
 * Decodes a secret into its HMAC key.  Accepts "whsec_<base64>" and, as the
 * Standard Webhooks libraries do, a bare "<base64>".  The base64 is standard
 * alphabet, padding optional but exact when present, no whitespace.
 *
 * key must hold HUB_SIGN_KEY_MAX bytes.  Returns 0 with *keylen in 1..64, or
 * -1 when the secret is malformed, empty or decodes to more than 64 bytes
 * (key is then wiped and *keylen is 0).
 */
int hub_secret_key(const char *secret, unsigned char *key, size_t *keylen);

/*
 * Standard Webhooks signature entry "v1,<base64 HMAC-SHA256(key, msg_id "." ts
 * "." body)>" into out, NUL-terminated.  The parts are fed to the MAC one
 * after the other: the body is never copied.  key (1..64 bytes), msg_id and
 * body are borrowed for the call; body may be NULL when len is 0.
 *
 * Returns the length written (47), or 0 when out is smaller than
 * HUB_SIGN_WEBHOOK_SIZE, an argument is invalid or OpenSSL fails.
 */
size_t hub_sign_webhook(const unsigned char *key, size_t keylen, const char *msg_id, int64_t ts,
                        const void *body, size_t len, char *out, size_t outsz);

/*
 * Lerian signature entry "v1,sha256=<lower hex HMAC-SHA256(key, "v1:" ts "."
 * body)>" into out, NUL-terminated.  Same ownership and failure rules as
 * hub_sign_webhook().  Returns the length written (74) or 0.
 */
size_t hub_sign_lerian(const unsigned char *key, size_t keylen, int64_t ts, const void *body,
                       size_t len, char *out, size_t outsz);

/*
 * Builds both signature header values for one request signed by every key in
 * keys[0..nkeys): webhook_sig gets the Standard Webhooks entries, lerian_sig
 * the Lerian ones, in the order of keys, separated by one space.  Put the
 * current key first and the previous one (still within its grace) second.
 *
 * wsz must be >= HUB_SIGN_HEADER_SIZE(HUB_SIGN_WEBHOOK_SIZE, nkeys) and lsz >=
 * HUB_SIGN_HEADER_SIZE(HUB_SIGN_LERIAN_SIZE, nkeys).  Everything is borrowed
 * for the call.  Returns nkeys on success; 0 when nkeys is 0, a buffer is too
 * small, a key is invalid or OpenSSL fails (both outputs are then "").
 */
size_t hub_sign_headers(const struct hub_sign_key *keys, size_t nkeys, const char *msg_id,
                        int64_t ts, const void *body, size_t len, char *webhook_sig, size_t wsz,
                        char *lerian_sig, size_t lsz);

#endif
