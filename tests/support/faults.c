/*
 * faults — hub_fault() for the test binary streaming-hub-faults (see
 * src/fault.h): the hub with allocation failures on request.
 *
 * STREAMING_HUB_TEST_FAULTS_DIR names a directory; a file in it named after
 * a fault point (kafka_take, kafka_headers, envelope_alloc, pg_array) holds
 * "FAIL" or "PASS FAIL": let the next PASS calls at that point through,
 * then fail the FAIL after them.  Each call counts one off and each failure
 * logs "test fault injected" with the point; a missing file, or 0, fails
 * nothing.  A test arms a point while the hub runs:
 *
 *   echo 2 >"$FAULTS/envelope_alloc"     # the next two parses run out of memory
 *   echo 1 1 >"$FAULTS/envelope_alloc"   # the next passes, the one after fails
 *
 * One open(2) per call at a point: fine for tests, and nothing of it is in
 * the hub's own binary, whose hub_fault() is the no-op of src/fault.c.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"

int hub_fault(const char *point) {
    static const char *dir;
    static int looked;
    char path[4096], buf[64];
    char *end, *end2;
    ssize_t n;
    long pass, left;
    int fd, fail;

    if (!looked) {
        dir = getenv("STREAMING_HUB_TEST_FAULTS_DIR");
        looked = 1;
    }
    if (dir == NULL) {
        return 0;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, point);
    fd = open(path, O_RDWR);
    if (fd < 0) {
        return 0;
    }
    n = pread(fd, buf, sizeof(buf) - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    pass = strtol(buf, &end, 10);
    left = strtol(end, &end2, 10);
    if (end2 == end) { /* one number: no call passes first */
        left = pass;
        pass = 0;
    }
    if (left <= 0) {
        close(fd);
        return 0;
    }
    fail = pass <= 0;
    n = fail ? snprintf(buf, sizeof(buf), "%ld\n", left - 1)
             : snprintf(buf, sizeof(buf), "%ld %ld\n", pass - 1, left);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
        unlink(path); /* could not count it down: this call is the last one */
    }
    close(fd);
    if (fail) {
        hub_log(HUB_WARN, "test fault injected", HUB_LS("point", point), HUB_LI("left", left - 1));
    }
    return fail;
}
