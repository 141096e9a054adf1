/*
 * crypto — secrets at rest (SPEC §11).
 *
 * Signing secrets and destination credentials are stored sealed with
 * AES-256-GCM under the key-encryption key (KEK, STREAMING_HUB_KEK).  The
 * sealed text names the KEK that sealed it by a key id, so an operator can
 * rotate the KEK: the hub opens with a list of current + previous KEKs and
 * seals with the current one only.
 *
 * Sealed text (ASCII, storable in a PG text column):
 *
 *     v1:<kid>:<base64(nonce[12] || ciphertext || tag[16])>
 *
 * where kid is 16 lower-case hex digits, the first 8 bytes of SHA-256(KEK).
 * The optional AAD (e.g. the subscription id) is authenticated but not
 * stored: a sealed value copied onto another row does not open there.
 *
 * Pure code: no I/O, no global state; the nonce comes from OpenSSL's CSPRNG.
 */
#ifndef HUB_CRYPTO_H
#define HUB_CRYPTO_H

#include <stddef.h>

#define HUB_KEK_BYTES 32

/* A parsed KEK.  Holds secret material: wipe it (OPENSSL_cleanse) when done. */
struct hub_kek {
    unsigned char key[HUB_KEK_BYTES];
    char id[17]; /* hex of the first 8 bytes of SHA-256(key), NUL-terminated */
};

/*
 * Parses a KEK written as standard base64 of exactly 32 bytes (padding
 * optional, no whitespace) and derives its id.  base64 is borrowed.
 * Returns 0, or -1 when malformed or not 32 bytes (*out is then wiped).
 */
int hub_kek_parse(const char *base64, struct hub_kek *out);

/*
 * Seals pt[0..len) under kek with a fresh random 96-bit nonce; aad (a
 * NUL-terminated string, may be NULL — same as "") is authenticated.
 * Everything is borrowed for the call.
 *
 * Returns owned, malloc'd, NUL-terminated sealed text (free() it), or NULL
 * when the CSPRNG or OpenSSL fails, memory runs out, or len is absurd
 * (> 64 MiB).  Sealing the same plaintext twice gives different texts.
 */
char *hub_seal(const struct hub_kek *kek, const void *pt, size_t len, const char *aad);

/*
 * Opens sealed text with whichever of keks[0..nkeks) carries its key id,
 * verifying the GCM tag over the ciphertext and aad (NULL same as "").
 * Everything is borrowed for the call.
 *
 * Returns 0 and hands over *pt: owned, malloc'd plaintext followed by a NUL
 * that *len does not count; the caller wipes (OPENSSL_cleanse) and frees it.
 * Returns -1 on any failure — malformed text, unknown key id, tampered
 * nonce/ciphertext/tag, wrong aad, no memory — with *pt NULL and *len 0; the
 * reasons are deliberately not told apart to the caller.
 */
int hub_open(const struct hub_kek *keks, size_t nkeks, const char *sealed, const char *aad,
             unsigned char **pt, size_t *len);

/* ------------------------------------------------------------- key ring -- */

/* Keys a ring holds at most: the current KEK and up to 7 previous ones. */
#define HUB_KEYRING_MAX 8

/*
 * The KEKs a process knows (STREAMING_HUB_KEK and STREAMING_HUB_KEK_PREVIOUS):
 * keys[0] is the current one, the only one that seals; the others only
 * open what was sealed before a rotation.  Holds secret material: wipe it
 * (OPENSSL_cleanse) when done.
 */
struct hub_keyring {
    struct hub_kek keys[HUB_KEYRING_MAX];
    size_t n; /* >= 1 once parsed */
};

/*
 * Parses the current KEK (base64, as hub_kek_parse) and a comma-separated
 * list of previous ones (may be NULL or empty; blanks around entries are
 * ignored) into *out.  A previous key equal to one already in the ring is
 * left out.  Returns 0, or -1 after writing into err (errsz bytes) one line
 * that names the variable and, for a list entry, its position (never a key);
 * *out is then wiped.
 */
int hub_keyring_parse(const char *current, const char *previous, struct hub_keyring *out, char *err,
                      size_t errsz);

/* hub_seal under the ring's current key. */
char *hub_keyring_seal(const struct hub_keyring *ring, const void *pt, size_t len, const char *aad);

/* hub_open with every key of the ring. */
int hub_keyring_open(const struct hub_keyring *ring, const char *sealed, const char *aad,
                     unsigned char **pt, size_t *len);

/* 1 when sealed (NUL-terminated) names the ring's current key id, so that
 * re-sealing it would change nothing; 0 otherwise (another key's, or not a
 * sealed text at all). */
int hub_keyring_is_current(const struct hub_keyring *ring, const char *sealed);

#endif
