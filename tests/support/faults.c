/*
 * faults — hub_fault() for the test binary streaming-hub-faults (see
 * src/fault.h): the hub with allocation failures on request.
 *
 * STREAMING_HUB_TEST_FAULTS_DIR names a directory; a file in it named after
 * a fault point (kafka_take, kafka_headers, envelope_alloc, pg_array) holds
 * how many of the next calls at that point fail.  Each failure takes one
 * off and logs "test fault injected" with the point; a missing file, or 0,
 * fails nothing.  A test arms a point while the hub runs:
 *
 *   echo 2 >"$FAULTS/envelope_alloc"     # the next two parses run out of memory
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
    char path[4096], buf[32];
    ssize_t n;
    long left;
    int fd;

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
    left = strtol(buf, NULL, 10);
    if (left <= 0) {
        close(fd);
        return 0;
    }
    n = snprintf(buf, sizeof(buf), "%ld\n", left - 1);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
        left = 1; /* could not count it down: this is the last one */
        unlink(path);
    }
    close(fd);
    hub_log(HUB_WARN, "test fault injected", HUB_LS("point", point), HUB_LI("left", left - 1));
    return 1;
}
