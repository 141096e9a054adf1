/*
 * util — shared helpers.
 */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t hub_fnv1a(uint64_t h, const void *p, size_t len) {
    const unsigned char *s = p;

    for (size_t i = 0; i < len; i++) {
        h = (h ^ s[i]) * 1099511628211ULL; /* the 64-bit FNV prime */
    }
    return h;
}

uint64_t hub_fnv1a_str(const char *s) {
    return hub_fnv1a(HUB_FNV1A_BASIS, s, strlen(s));
}

int hub_http_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

int hub_http_token(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (!hub_http_tchar((unsigned char)s[i])) {
            return 0;
        }
    }
    return len > 0;
}

int hub_http_value_safe(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            return 0;
        }
    }
    return 1;
}

size_t hub_utf8_prefix(const void *p, size_t len) {
    const unsigned char *s = p;
    size_t i = 0;

    while (i < len) {
        unsigned char c = s[i];
        size_t n;
        uint32_t cp;
        if (c == 0) {
            return i;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            n = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3;
            cp = c & 0x07;
        } else {
            return i;
        }
        if (i + n >= len) {
            return i;
        }
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) {
                return i;
            }
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        /* reject overlong forms, surrogates and code points past U+10FFFF */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
            return i;
        }
        i += n + 1;
    }
    return len;
}

int hub_utf8_valid(const void *p, size_t len) {
    return hub_utf8_prefix(p, len) == len;
}

int hub_hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

void hub_hex(const unsigned char *in, size_t len, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * len] = '\0';
}

char *hub_base64(const void *in, size_t len) {
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (out == NULL) {
        return NULL;
    }
    EVP_EncodeBlock((unsigned char *)out, in, (int)len);
    return out;
}

size_t hub_base64url(const unsigned char *in, size_t len, char *out) {
    size_t n = (size_t)EVP_EncodeBlock((unsigned char *)out, in, (int)len);
    while (n > 0 && out[n - 1] == '=') {
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        if (out[i] == '+') {
            out[i] = '-';
        } else if (out[i] == '/') {
            out[i] = '_';
        }
    }
    out[n] = '\0';
    return n;
}

/* Value of one base64 character of the alphabet flags name, -1 for
 * anything else. */
static int b64_value(unsigned char c, unsigned flags) {
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    if (c == ((flags & HUB_B64_URL) ? '-' : '+')) {
        return 62;
    }
    if (c == ((flags & HUB_B64_URL) ? '_' : '/')) {
        return 63;
    }
    return -1;
}

int hub_base64url_char(char c) {
    return b64_value((unsigned char)c, HUB_B64_URL) >= 0;
}

/* The characters of in[0..inlen) that carry data: without the padding,
 * which is there only to complete a length that is a multiple of 4.
 * Returns their count, or -1 when no base64 text has that shape (a lone
 * character in the last quantum cannot carry a whole byte). */
static long b64_data_chars(const char *in, size_t inlen) {
    size_t n = inlen;

    if (n > 0 && n % 4 == 0 && in[n - 1] == '=') {
        n--;
        if (in[n - 1] == '=') {
            n--;
        }
    }
    return n % 4 == 1 ? -1 : (long)n;
}

int hub_base64_decoded_len(const char *in, size_t inlen, size_t *outlen) {
    long n = b64_data_chars(in, inlen);

    if (n < 0) {
        return -1;
    }
    *outlen = (size_t)n / 4 * 3 + ((size_t)n % 4 ? (size_t)n % 4 - 1 : 0);
    return 0;
}

int hub_base64_decode(const char *in, size_t inlen, unsigned flags, unsigned char *out,
                      size_t outsz, size_t *outlen) {
    long n = b64_data_chars(in, inlen);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;

    if (n < 0) {
        return -1;
    }
    for (size_t i = 0; i < (size_t)n; i++) {
        int v = b64_value((unsigned char)in[i], flags);
        if (v < 0) {
            return -1;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o == outsz) {
                return -1;
            }
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1u;
        }
    }
    if ((flags & HUB_B64_STRICT) && acc != 0) {
        return -1;
    }
    *outlen = o;
    return 0;
}

uint64_t hub_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t hub_thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t hub_unix_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void hub_rfc3339(int64_t unix_us, int frac_digits, char *out, size_t outsz) {
    int64_t frac = ((unix_us % 1000000) + 1000000) % 1000000; /* floor, also before 1970 */
    time_t t = (time_t)((unix_us - frac) / 1000000);
    struct tm tm;
    size_t n;

    gmtime_r(&t, &tm);
    n = strftime(out, outsz, "%Y-%m-%dT%H:%M:%S", &tm);
    if (frac_digits == 3) {
        snprintf(out + n, outsz - n, ".%03dZ", (int)(frac / 1000));
    } else {
        snprintf(out + n, outsz - n, ".%06dZ", (int)frac);
    }
}

int hub_mkdir_p(const char *dir) {
    char path[4096];
    size_t len = strlen(dir);

    if (len == 0 || len >= sizeof(path)) {
        return -1;
    }
    memcpy(path, dir, len + 1);
    for (char *p = path + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        return -1;
    }
    return 0;
}

char *hub_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;

    if (f == NULL) {
        return NULL;
    }
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *b = realloc(buf, cap);
            if (b == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) {
            break;
        }
    }
    fclose(f);
    buf[n] = '\0';
    if (len) {
        *len = n;
    }
    return buf;
}

int hub_write_file(const char *path, const void *data, size_t len, int mode) {
    char tmp[4096];
    int fd;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        return -1;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) {
        return -1;
    }
    if (write(fd, data, len) != (ssize_t)len || fsync(fd) != 0) {
        close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}
