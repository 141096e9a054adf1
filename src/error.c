/*
 * error — descriptions of the hub's error codes.
 */
#include "error.h"

#include <string.h>

const char *hub_strerror(int rc) {
    switch (rc) {
    case HUB_OK:
        return "success";
    case HUB_EINVAL:
        return "invalid input";
    case HUB_ENOMEM:
        return "out of memory";
    case HUB_EIO:
        return "input/output error";
    case HUB_ENOENT:
        return "not found";
    case HUB_ERANGE:
        return "out of range";
    case HUB_EEXIST:
        return "already exists";
    case HUB_ECANCELED:
        return "canceled";
    case HUB_ETIMEDOUT:
        return "timed out";
    case HUB_EAGAIN:
        return "try again later";
    case HUB_ECRYPTO:
        return "crypto failure";
    case HUB_EDB:
        return "database failure";
    case HUB_EKAFKA:
        return "kafka failure";
    case HUB_ELUA:
        return "lua failure";
    default:
        /* strerror's table is static in glibc; any other negative errno a
         * module passes through reads as the system names it */
        return rc < 0 && rc > -4000 ? strerror(-rc) : "unknown error";
    }
}
