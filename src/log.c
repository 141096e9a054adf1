/*
 * log — JSON lines on stderr.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static enum hub_log_level log_min = HUB_INFO;
static int log_json = 1;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void hub_log_init(const char *level, const char *format) {
    for (int i = 0; i < 4; i++) {
        if (level != NULL && strcmp(level, level_names[i]) == 0) {
            log_min = (enum hub_log_level)i;
        }
    }
    log_json = !(format != NULL && strcmp(format, "text") == 0);
}

int hub_log_enabled(enum hub_log_level level) {
    return level >= log_min;
}

/* Appends s JSON-escaped; stops quietly when the buffer is full (the line is
 * then cut, never overflowed). */
static size_t log_escape(char *buf, size_t pos, size_t cap, const char *s) {
    static const char hex[] = "0123456789abcdef";
    for (; s != NULL && *s != '\0' && pos + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[pos++] = '\\';
            buf[pos++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(buf + pos, "\\u00", 4);
            buf[pos + 4] = hex[c >> 4];
            buf[pos + 5] = hex[c & 15];
            pos += 6;
        } else {
            buf[pos++] = (char)c;
        }
    }
    return pos;
}

static size_t log_append(char *buf, size_t pos, size_t cap, const char *s) {
    size_t room = pos + 1 < cap ? cap - pos - 1 : 0;
    size_t n = strnlen(s, room);
    memcpy(buf + pos, s, n);
    return pos + n;
}

void hub_log_(enum hub_log_level level, const char *msg, ...) {
    char buf[4096];
    size_t pos = 0;
    const size_t cap = sizeof(buf) - 2; /* room for "}\n" */
    struct timeval tv;
    struct tm tm;
    char ts[64];
    va_list ap;

    if (level < log_min) {
        return;
    }
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(tv.tv_usec / 1000));

    if (log_json) {
        pos = log_append(buf, pos, cap, "{\"ts\":\"");
        pos = log_append(buf, pos, cap, ts);
        pos = log_append(buf, pos, cap, "\",\"level\":\"");
        pos = log_append(buf, pos, cap, level_names[level]);
        pos = log_append(buf, pos, cap, "\",\"msg\":\"");
        pos = log_escape(buf, pos, cap, msg);
        pos = log_append(buf, pos, cap, "\"");
    } else {
        pos = log_append(buf, pos, cap, ts);
        pos = log_append(buf, pos, cap, " ");
        pos = log_append(buf, pos, cap, level_names[level]);
        pos = log_append(buf, pos, cap, " ");
        pos = log_append(buf, pos, cap, msg);
    }

    va_start(ap, msg);
    for (;;) {
        struct hub_log_field f = va_arg(ap, struct hub_log_field);
        char num[32];
        if (f.type == HUB_LOG_END) {
            break;
        }
        if (f.type == HUB_LOG_STR && f.s == NULL) {
            continue;
        }
        pos = log_append(buf, pos, cap, log_json ? ",\"" : " ");
        pos = log_escape(buf, pos, cap, f.key);
        pos = log_append(buf, pos, cap, log_json ? "\":" : "=");
        if (f.type == HUB_LOG_INT) {
            snprintf(num, sizeof(num), "%lld", (long long)f.i);
            pos = log_append(buf, pos, cap, num);
        } else {
            if (log_json) {
                pos = log_append(buf, pos, cap, "\"");
            }
            pos = log_escape(buf, pos, cap, f.s);
            if (log_json) {
                pos = log_append(buf, pos, cap, "\"");
            }
        }
    }
    va_end(ap);
    if (log_json) {
        buf[pos++] = '}';
    }
    buf[pos++] = '\n';
    /* one write per line keeps lines whole when several threads log */
    if (write(STDERR_FILENO, buf, pos) < 0) {
        /* nothing sensible to do when stderr is gone */
    }
}
