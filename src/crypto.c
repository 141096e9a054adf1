/*
 * crypto — AES-256-GCM sealing of secrets at rest under a rotatable KEK.
 */
#include "crypto.h"

#include "util.h"

#include <limits.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NONCE_BYTES 12
#define TAG_BYTES 16
#define KID_HEX 16
/* Secrets and header sets are small; a cap keeps every length well inside
 * the int that the EVP API takes. */
#define SEAL_MAX_PLAINTEXT (64u * 1024u * 1024u)

static const char SEAL_VERSION[] = "v1:";

/* Length of an optional AAD string, or -1 when it does not fit the EVP API. */
static int aad_len(const char *aad) {
    size_t n = aad != NULL ? strlen(aad) : 0;
    return n <= INT_MAX ? (int)n : -1;
}

int hub_kek_parse(const char *base64, struct hub_kek *out) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    size_t n = 0;

    if (out == NULL) {
        return -1;
    }
    /* decode into out->key directly: no stray copy of the KEK to wipe */
    if (base64 == NULL ||
        hub_base64_decode(base64, strlen(base64), HUB_B64_STRICT, out->key, sizeof(out->key), &n) !=
            0 ||
        n != HUB_KEK_BYTES) {
        goto fail;
    }
    if (EVP_Digest(out->key, sizeof(out->key), digest, &dlen, EVP_sha256(), NULL) != 1) {
        goto fail;
    }
    hub_hex(digest, KID_HEX / 2, out->id);
    return 0;
fail:
    OPENSSL_cleanse(out, sizeof(*out));
    return -1;
}

char *hub_seal(const struct hub_kek *kek, const void *pt, size_t len, const char *aad) {
    size_t hdr = sizeof(SEAL_VERSION) - 1 + KID_HEX + 1; /* "v1:" kid ":" */
    size_t rawlen = NONCE_BYTES + len + TAG_BYTES;
    unsigned char *raw = NULL;
    EVP_CIPHER_CTX *ctx = NULL;
    char *out = NULL;
    int alen = aad_len(aad);
    int outl = 0, finl = 0;

    if (kek == NULL || (pt == NULL && len > 0) || len > SEAL_MAX_PLAINTEXT || alen < 0) {
        return NULL;
    }
    raw = malloc(rawlen);
    if (raw == NULL) {
        goto fail_raw;
    }
    /* 96-bit random nonces: fine for the few values one KEK ever seals
     * (far below the 2^32 messages NIST allows for random GCM nonces) */
    if (RAND_bytes(raw, NONCE_BYTES) != 1) {
        goto fail_ctx;
    }
    ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL) {
        goto fail_ctx;
    }
    if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, kek->key, raw) != 1) {
        goto fail_cipher;
    }
    if (alen > 0 && EVP_EncryptUpdate(ctx, NULL, &outl, (const unsigned char *)aad, alen) != 1) {
        goto fail_cipher;
    }
    outl = 0;
    if (len > 0 && EVP_EncryptUpdate(ctx, raw + NONCE_BYTES, &outl, pt, (int)len) != 1) {
        goto fail_cipher;
    }
    /* GCM is a stream mode: Final writes nothing, but must run to compute the tag */
    if (EVP_EncryptFinal_ex(ctx, raw + NONCE_BYTES + outl, &finl) != 1 ||
        (size_t)outl + (size_t)finl != len) {
        goto fail_cipher;
    }
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG_BYTES, raw + NONCE_BYTES + len) != 1) {
        goto fail_cipher;
    }
    out = malloc(hdr + 4 * ((rawlen + 2) / 3) + 1);
    if (out == NULL) {
        goto fail_cipher;
    }
    memcpy(out, SEAL_VERSION, sizeof(SEAL_VERSION) - 1);
    memcpy(out + sizeof(SEAL_VERSION) - 1, kek->id, KID_HEX);
    out[hdr - 1] = ':';
    EVP_EncodeBlock((unsigned char *)out + hdr, raw, (int)rawlen);
fail_cipher:
    /* frees the key schedule, which OpenSSL wipes */
    EVP_CIPHER_CTX_free(ctx);
fail_ctx:
    /* raw holds only nonce, ciphertext and tag: nothing secret to wipe */
    free(raw);
fail_raw:
    return out;
}

/*
 * Decrypts and authenticates one (nonce, ciphertext, tag) under key.  On
 * success fills out[0..ctlen) and returns 0; on failure wipes out (GCM
 * releases plaintext before the tag is checked) and returns -1.
 */
static int open_with(const unsigned char *key, unsigned char *raw, size_t ctlen, const char *aad,
                     int alen, unsigned char *out) {
    EVP_CIPHER_CTX *ctx;
    int outl = 0, finl = 0;
    int rc = -1;

    ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL) {
        goto fail_ctx;
    }
    if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, raw) != 1) {
        goto fail_cipher;
    }
    if (alen > 0 && EVP_DecryptUpdate(ctx, NULL, &outl, (const unsigned char *)aad, alen) != 1) {
        goto fail_cipher;
    }
    outl = 0;
    if (ctlen > 0 && EVP_DecryptUpdate(ctx, out, &outl, raw + NONCE_BYTES, (int)ctlen) != 1) {
        goto fail_cipher;
    }
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG_BYTES, raw + NONCE_BYTES + ctlen) != 1) {
        goto fail_cipher;
    }
    /* the tag check happens here, in constant time inside OpenSSL */
    if (EVP_DecryptFinal_ex(ctx, out + outl, &finl) != 1 || (size_t)outl + (size_t)finl != ctlen) {
        goto fail_cipher;
    }
    rc = 0;
fail_cipher:
    EVP_CIPHER_CTX_free(ctx);
fail_ctx:
    if (rc != 0) {
        OPENSSL_cleanse(out, ctlen);
    }
    return rc;
}

int hub_open(const struct hub_kek *keks, size_t nkeks, const char *sealed, const char *aad,
             unsigned char **pt, size_t *len) {
    size_t vlen = sizeof(SEAL_VERSION) - 1;
    const char *kid, *b64;
    unsigned char *raw = NULL, *out = NULL;
    size_t b64len, rawcap, rawlen = 0, ctlen;
    int alen = aad_len(aad);

    if (pt != NULL) {
        *pt = NULL;
    }
    if (len != NULL) {
        *len = 0;
    }
    if (keks == NULL || sealed == NULL || pt == NULL || len == NULL || alen < 0) {
        return -1;
    }
    if (strncmp(sealed, SEAL_VERSION, vlen) != 0) {
        return -1;
    }
    kid = sealed + vlen;
    for (size_t i = 0; i < KID_HEX; i++) {
        if (!((kid[i] >= '0' && kid[i] <= '9') || (kid[i] >= 'a' && kid[i] <= 'f'))) {
            return -1;
        }
    }
    if (kid[KID_HEX] != ':') {
        return -1;
    }
    b64 = kid + KID_HEX + 1;
    b64len = strlen(b64);
    /* refuse before allocating: a sealed value can never be this large */
    if (b64len / 4 > (SEAL_MAX_PLAINTEXT + NONCE_BYTES + TAG_BYTES) / 3 + 1) {
        return -1;
    }
    rawcap = b64len / 4 * 3 + 2;
    raw = malloc(rawcap);
    if (raw == NULL) {
        goto fail_raw;
    }
    if (hub_base64_decode(b64, b64len, HUB_B64_STRICT, raw, rawcap, &rawlen) != 0 ||
        rawlen < NONCE_BYTES + TAG_BYTES) {
        goto fail_out;
    }
    ctlen = rawlen - NONCE_BYTES - TAG_BYTES;
    out = malloc(ctlen + 1);
    if (out == NULL) {
        goto fail_out;
    }
    /* Several KEKs could share an id only through a 64-bit hash collision or
     * a duplicated list entry; trying each one that matches costs nothing. */
    for (size_t i = 0; i < nkeks; i++) {
        if (memcmp(keks[i].id, kid, KID_HEX) != 0 || keks[i].id[KID_HEX] != '\0') {
            continue;
        }
        if (open_with(keks[i].key, raw, ctlen, aad, alen, out) == 0) {
            out[ctlen] = '\0';
            *pt = out;
            *len = ctlen;
            free(raw);
            return 0;
        }
    }
    /* open_with() already wiped out after each failed try */
    free(out);
fail_out:
    free(raw);
fail_raw:
    return -1;
}

/* ------------------------------------------------------------- key ring -- */

/* Copies the entry [b, e) of a list into buf (blanks trimmed); 0, or -1 when
 * it does not fit (no KEK is that long). */
static int list_entry(const char *b, const char *e, char *buf, size_t size) {
    while (b < e && (*b == ' ' || *b == '\t')) {
        b++;
    }
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) {
        e--;
    }
    if ((size_t)(e - b) >= size) {
        return -1;
    }
    memcpy(buf, b, (size_t)(e - b));
    buf[e - b] = '\0';
    return 0;
}

int hub_keyring_parse(const char *current, const char *previous, struct hub_keyring *out, char *err,
                      size_t errsz) {
    char entry[128];
    int pos = 0;

    memset(out, 0, sizeof(*out));
    if (hub_kek_parse(current, &out->keys[0]) != 0) {
        snprintf(err, errsz, "STREAMING_HUB_KEK: not base64 of 32 bytes");
        goto fail;
    }
    out->n = 1;
    for (const char *p = previous; p != NULL && *p != '\0';) {
        const char *comma = strchr(p, ',');
        const char *end = comma != NULL ? comma : p + strlen(p);
        struct hub_kek k;
        int dup = 0;

        pos++;
        if (list_entry(p, end, entry, sizeof(entry)) != 0 || hub_kek_parse(entry, &k) != 0) {
            snprintf(err, errsz, "STREAMING_HUB_KEK_PREVIOUS: entry %d is not base64 of 32 bytes",
                     pos);
            goto fail;
        }
        for (size_t i = 0; i < out->n; i++) {
            dup |= memcmp(out->keys[i].key, k.key, sizeof(k.key)) == 0;
        }
        if (!dup && out->n == HUB_KEYRING_MAX) {
            OPENSSL_cleanse(&k, sizeof(k));
            snprintf(err, errsz, "STREAMING_HUB_KEK_PREVIOUS: more than %d keys",
                     HUB_KEYRING_MAX - 1);
            goto fail;
        }
        if (!dup) {
            out->keys[out->n++] = k;
        }
        OPENSSL_cleanse(&k, sizeof(k));
        p = comma != NULL ? comma + 1 : end;
    }
    OPENSSL_cleanse(entry, sizeof(entry));
    return 0;
fail:
    OPENSSL_cleanse(entry, sizeof(entry));
    OPENSSL_cleanse(out, sizeof(*out));
    return -1;
}

char *hub_keyring_seal(const struct hub_keyring *ring, const void *pt, size_t len,
                       const char *aad) {
    return ring != NULL && ring->n > 0 ? hub_seal(&ring->keys[0], pt, len, aad) : NULL;
}

int hub_keyring_open(const struct hub_keyring *ring, const char *sealed, const char *aad,
                     unsigned char **pt, size_t *len) {
    return hub_open(ring != NULL ? ring->keys : NULL, ring != NULL ? ring->n : 0, sealed, aad, pt,
                    len);
}

int hub_keyring_is_current(const struct hub_keyring *ring, const char *sealed) {
    size_t vlen = sizeof(SEAL_VERSION) - 1;

    return ring != NULL && ring->n > 0 && sealed != NULL &&
           strncmp(sealed, SEAL_VERSION, vlen) == 0 &&
           strncmp(sealed + vlen, ring->keys[0].id, KID_HEX) == 0 && sealed[vlen + KID_HEX] == ':';
}
