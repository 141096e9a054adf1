/*
 * log — one JSON object per line on stderr: ts, level, msg, and context
 * fields.  Never pass a payload byte, secret, credential or API key.
 *
 * The level and format are process-wide settings written once by
 * hub_log_init() before any other thread starts; they are the one piece of
 * global state outside struct hub, because every module logs and threading a
 * context through each call would add nothing but noise.  Writing a line is
 * thread-safe (a single write(2) per line).
 */
#ifndef HUB_LOG_H
#define HUB_LOG_H

#include <stdint.h>

enum hub_log_level { HUB_DEBUG = 0, HUB_INFO = 1, HUB_WARN = 2, HUB_ERROR = 3 };

enum hub_log_ftype { HUB_LOG_END = 0, HUB_LOG_STR, HUB_LOG_INT };

struct hub_log_field {
    const char *key;
    enum hub_log_ftype type;
    const char *s;
    int64_t i;
};

#define HUB_LS(k, v) ((struct hub_log_field){(k), HUB_LOG_STR, (v), 0})
#define HUB_LI(k, v) ((struct hub_log_field){(k), HUB_LOG_INT, NULL, (int64_t)(v)})
#define HUB_LEND ((struct hub_log_field){NULL, HUB_LOG_END, NULL, 0})

/* hub_log(level, "message", HUB_LS("tenant", t), HUB_LI("partition", p)); */
#define hub_log(level, ...) hub_log_((level), __VA_ARGS__, HUB_LEND)

/* Sets the level ("debug".."error") and format ("json"|"text"). */
void hub_log_init(const char *level, const char *format);

/* Whether a line of this level would be written. */
int hub_log_enabled(enum hub_log_level level);

/* Writes one line; the varargs are struct hub_log_field, ending with HUB_LEND. */
void hub_log_(enum hub_log_level level, const char *msg, ...);

#endif
