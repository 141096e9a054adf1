/*
 * error — the hub's error codes, one set for every module.
 *
 * Public functions that can fail return 0 (or a count, or a pointer) on
 * success and one of these negative codes on failure, as libuv does; a
 * caller logs hub_strerror(rc) and, where it has one, the detail the module
 * wrote into an error buffer of its own.  The values are negative errno
 * numbers where one fits, so they never collide with a count.
 */
#ifndef HUB_ERROR_H
#define HUB_ERROR_H

#include <errno.h>

enum hub_error {
    HUB_OK = 0,
    HUB_EINVAL = -EINVAL,       /* malformed input: a value, a file, a request */
    HUB_ENOMEM = -ENOMEM,       /* an allocation failed */
    HUB_EIO = -EIO,             /* a system call failed (the log line says which) */
    HUB_ENOENT = -ENOENT,       /* what was asked for does not exist */
    HUB_ERANGE = -ERANGE,       /* a value is outside its bounds, or output did not fit */
    HUB_EEXIST = -EEXIST,       /* it exists already */
    HUB_ECANCELED = -ECANCELED, /* given up: shutting down, or the caller went away */
    HUB_ETIMEDOUT = -ETIMEDOUT, /* a deadline passed */
    HUB_EAGAIN = -EAGAIN,       /* over a limit or not ready yet: try again later */
    HUB_ECRYPTO = -4001,        /* the crypto library refused (bad key, tag mismatch) */
    HUB_EDB = -4002,            /* the database refused or could not be reached */
    HUB_EKAFKA = -4003,         /* librdkafka refused */
    HUB_ELUA = -4004,           /* a Lua state could not be built or run */
};

/* A short static description of rc (one of the codes above, or any
 * negative errno value); "unknown error" for anything else. */
const char *hub_strerror(int rc);

#endif
