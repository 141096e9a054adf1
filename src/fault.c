/*
 * fault — the production definition of hub_fault() (see fault.h): nothing
 * fails.  Weak, so that the test binary's own definition replaces it at
 * link time; the call costs one function call at the few places that ask.
 */
#include "fault.h"

__attribute__((weak)) int hub_fault(const char *point) {
    (void)point;
    return 0;
}
