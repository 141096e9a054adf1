/*
 * sign — webhook signing secrets and request signatures (SPEC §7.2).
 *
 * HMAC-SHA256 goes through OpenSSL 3's EVP_MAC so the message can be fed in
 * parts (id, timestamp, separators, body) without ever copying the body.
 */
#include "sign.h"

#include "util.h"

#include <inttypes.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>

#define SECRET_RAW_BYTES 32
#define MAC_BYTES 32
#define B64_MAC_CHARS 44 /* base64 of 32 bytes, one '=' of padding included */

static const char WEBHOOK_PREFIX[] = "v1,";
static const char LERIAN_PREFIX[] = "v1,sha256=";

/* One piece of the signed message, borrowed. */
struct mac_part {
    const void *p;
    size_t len;
};

/*
 * A context keyed for HMAC-SHA256 under key: copies of it sign each message,
 * so that the key schedule and the digest lookup (EVP_MAC_init fetches
 * SHA256 from the provider store) happen once per key, not per signature.
 * mac is a fetched "HMAC" algorithm, borrowed.  NULL on failure; the context
 * holds a copy of the key, which OpenSSL wipes on EVP_MAC_CTX_free.
 */
static EVP_MAC_CTX *hmac_keyed(EVP_MAC *mac, const unsigned char *key, size_t keylen) {
    char digest[] = "SHA256";
    OSSL_PARAM params[2];
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);

    if (ctx == NULL) {
        return NULL;
    }
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0);
    params[1] = OSSL_PARAM_construct_end();
    if (EVP_MAC_init(ctx, key, keylen, params) != 1) {
        EVP_MAC_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* HMAC of the concatenation of parts[0..nparts) with a copy of the keyed
 * context, written to out.  Returns 0 or -1. */
static int hmac_parts(const EVP_MAC_CTX *keyed, const struct mac_part *parts, size_t nparts,
                      unsigned char out[MAC_BYTES]) {
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(keyed);
    size_t outl = 0;
    int rc = -1;

    if (ctx == NULL) {
        return -1;
    }
    for (size_t i = 0; i < nparts; i++) {
        if (parts[i].len > 0 && EVP_MAC_update(ctx, parts[i].p, parts[i].len) != 1) {
            goto fail_mac;
        }
    }
    if (EVP_MAC_final(ctx, out, &outl, MAC_BYTES) != 1 || outl != MAC_BYTES) {
        goto fail_mac;
    }
    rc = 0;
fail_mac:
    EVP_MAC_CTX_free(ctx);
    return rc;
}

/* 1 when a key length is one we sign with. */
static int key_ok(const unsigned char *key, size_t keylen) {
    return key != NULL && keylen > 0 && keylen <= HUB_SIGN_KEY_MAX;
}

/* Decimal timestamp into buf (24 bytes is enough for any int64). */
static size_t format_ts(int64_t ts, char buf[24]) {
    int n = snprintf(buf, 24, "%" PRId64, ts);
    return n > 0 ? (size_t)n : 0;
}

/* hub_sign_webhook() with an already keyed context; see sign.h. */
static size_t sign_webhook_with(const EVP_MAC_CTX *keyed, const char *msg_id, int64_t ts,
                                const void *body, size_t len, char *out, size_t outsz) {
    unsigned char digest[MAC_BYTES];
    char tsbuf[24];
    size_t plen = sizeof(WEBHOOK_PREFIX) - 1;

    if (out == NULL || outsz < HUB_SIGN_WEBHOOK_SIZE || msg_id == NULL ||
        (body == NULL && len > 0)) {
        return 0;
    }
    struct mac_part parts[] = {
        {msg_id, strlen(msg_id)}, {".", 1}, {tsbuf, format_ts(ts, tsbuf)}, {".", 1}, {body, len},
    };
    if (hmac_parts(keyed, parts, sizeof(parts) / sizeof(parts[0]), digest) != 0) {
        return 0;
    }
    memcpy(out, WEBHOOK_PREFIX, plen);
    /* EVP_EncodeBlock directly into the caller's buffer: hub_base64() would
     * allocate for every signature on the delivery hot path */
    EVP_EncodeBlock((unsigned char *)out + plen, digest, MAC_BYTES);
    return plen + B64_MAC_CHARS;
}

/* hub_sign_lerian() with an already keyed context; see sign.h. */
static size_t sign_lerian_with(const EVP_MAC_CTX *keyed, int64_t ts, const void *body, size_t len,
                               char *out, size_t outsz) {
    unsigned char digest[MAC_BYTES];
    char tsbuf[24];
    size_t plen = sizeof(LERIAN_PREFIX) - 1;

    if (out == NULL || outsz < HUB_SIGN_LERIAN_SIZE || (body == NULL && len > 0)) {
        return 0;
    }
    struct mac_part parts[] = {
        {"v1:", 3},
        {tsbuf, format_ts(ts, tsbuf)},
        {".", 1},
        {body, len},
    };
    if (hmac_parts(keyed, parts, sizeof(parts) / sizeof(parts[0]), digest) != 0) {
        return 0;
    }
    memcpy(out, LERIAN_PREFIX, plen);
    hub_hex(digest, MAC_BYTES, out + plen);
    return plen + 2 * MAC_BYTES;
}

int hub_secret_generate(char *out, size_t outsz) {
    unsigned char raw[SECRET_RAW_BYTES];
    size_t plen = sizeof(HUB_SECRET_PREFIX) - 1;

    if (out == NULL || outsz < HUB_SECRET_SIZE) {
        return -1;
    }
    out[0] = '\0';
    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        return -1;
    }
    memcpy(out, HUB_SECRET_PREFIX, plen);
    EVP_EncodeBlock((unsigned char *)out + plen, raw, sizeof(raw));
    OPENSSL_cleanse(raw, sizeof(raw));
    return 0;
}

int hub_secret_key(const char *secret, unsigned char *key, size_t *keylen) {
    size_t plen = sizeof(HUB_SECRET_PREFIX) - 1;
    size_t n = 0;

    if (keylen != NULL) {
        *keylen = 0;
    }
    if (secret == NULL || key == NULL || keylen == NULL) {
        return -1;
    }
    if (strncmp(secret, HUB_SECRET_PREFIX, plen) == 0) {
        secret += plen;
    }
    if (hub_base64_decode(secret, strlen(secret), HUB_B64_STRICT, key, HUB_SIGN_KEY_MAX, &n) != 0 ||
        n == 0) {
        /* a partial decode may have left key bytes behind */
        OPENSSL_cleanse(key, HUB_SIGN_KEY_MAX);
        return -1;
    }
    *keylen = n;
    return 0;
}

/* A keyed context for one signature outside a request (key_ok checked). */
static EVP_MAC_CTX *keyed_once(const unsigned char *key, size_t keylen) {
    EVP_MAC *mac;
    EVP_MAC_CTX *ctx;

    if (!key_ok(key, keylen) || (mac = EVP_MAC_fetch(NULL, "HMAC", NULL)) == NULL) {
        return NULL;
    }
    ctx = hmac_keyed(mac, key, keylen);
    EVP_MAC_free(mac); /* the context keeps its own reference */
    return ctx;
}

size_t hub_sign_webhook(const unsigned char *key, size_t keylen, const char *msg_id, int64_t ts,
                        const void *body, size_t len, char *out, size_t outsz) {
    EVP_MAC_CTX *keyed = keyed_once(key, keylen);
    size_t n = 0;

    if (keyed != NULL) {
        n = sign_webhook_with(keyed, msg_id, ts, body, len, out, outsz);
        EVP_MAC_CTX_free(keyed);
    }
    return n;
}

size_t hub_sign_lerian(const unsigned char *key, size_t keylen, int64_t ts, const void *body,
                       size_t len, char *out, size_t outsz) {
    EVP_MAC_CTX *keyed = keyed_once(key, keylen);
    size_t n = 0;

    if (keyed != NULL) {
        n = sign_lerian_with(keyed, ts, body, len, out, outsz);
        EVP_MAC_CTX_free(keyed);
    }
    return n;
}

size_t hub_sign_headers(const struct hub_sign_key *keys, size_t nkeys, const char *msg_id,
                        int64_t ts, const void *body, size_t len, char *webhook_sig, size_t wsz,
                        char *lerian_sig, size_t lsz) {
    EVP_MAC *mac;
    size_t w = 0, l = 0;

    if (webhook_sig == NULL || lerian_sig == NULL) {
        return 0;
    }
    webhook_sig[0] = lerian_sig[0] = '\0';
    /* the division form cannot overflow, unlike HUB_SIGN_HEADER_SIZE(n) */
    if (keys == NULL || nkeys == 0 || wsz / HUB_SIGN_WEBHOOK_SIZE < nkeys ||
        lsz / HUB_SIGN_LERIAN_SIZE < nkeys) {
        return 0;
    }
    /* one fetch for all the keys, one keyed context per key for its 2 MACs */
    mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (mac == NULL) {
        return 0;
    }
    for (size_t i = 0; i < nkeys; i++) {
        EVP_MAC_CTX *keyed;
        size_t n, m;
        if (i > 0) {
            webhook_sig[w++] = ' ';
            lerian_sig[l++] = ' ';
        }
        keyed = key_ok(keys[i].key, keys[i].len) ? hmac_keyed(mac, keys[i].key, keys[i].len) : NULL;
        if (keyed == NULL) {
            goto fail;
        }
        n = sign_webhook_with(keyed, msg_id, ts, body, len, webhook_sig + w, wsz - w);
        m = sign_lerian_with(keyed, ts, body, len, lerian_sig + l, lsz - l);
        EVP_MAC_CTX_free(keyed);
        if (n == 0 || m == 0) {
            goto fail;
        }
        w += n;
        l += m;
    }
    EVP_MAC_free(mac);
    return nkeys;
fail:
    /* never hand out a header that silently lacks one of the keys */
    EVP_MAC_free(mac);
    webhook_sig[0] = lerian_sig[0] = '\0';
    return 0;
}
