/*
 * fault — failure injection for tests: the places where the hub handles an
 * allocation failure ask hub_fault() first, so that a test can make exactly
 * that allocation fail and check what the hub does about it.
 *
 * The hub's own binary links the definition in fault.c, which never fails
 * anything: there is no knob in a production build.  The test binary
 * streaming-hub-faults (tests/support/faults.c) links its own definition,
 * which reads STREAMING_HUB_TEST_FAULTS (see that file).
 *
 * Points (the name a call site passes):
 *   kafka_take        a Kafka record entering its partition's pending list
 *   kafka_headers     reading a Kafka record's headers for the parser
 *   envelope_alloc    the envelope parser's arena
 *   pg_array          growing a PostgreSQL array (pg_array.c)
 */
#ifndef HUB_FAULT_H
#define HUB_FAULT_H

/* 1 when the operation at `point` (a static string) is to fail as if out of
 * memory; 0 otherwise (always, outside the test binary).  Loop thread or
 * any other: the test definition counts atomically. */
int hub_fault(const char *point);

#endif
