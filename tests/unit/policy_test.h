/*
 * policy_test.h — what the policy unit tests share (test_policy.c,
 * test_policy_pool.c): a watchdog per test, so that a call which never
 * comes back fails the run instead of hanging it, the two clocks a
 * policy's deadline is about, and writing a policy file.
 *
 * Include after cmocka.h; define WATCHDOG_S (seconds per test) and
 * WATCHDOG_MSG (the line written when it fires, ending in "\n") first.
 */
#ifndef HUB_TEST_POLICY_TEST_H
#define HUB_TEST_POLICY_TEST_H

#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* Async-signal-safe: a write and _exit, status 3. */
static void watchdog_fired(int sig) {
    static const char msg[] = WATCHDOG_MSG;
    (void)sig;
    if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
        /* nothing more to do: the exit status says it */
    }
    _exit(3);
}

/* cmocka setup and teardown: WATCHDOG_S seconds for the test between. */
static int watchdog_arm(void **state) {
    (void)state;
    signal(SIGALRM, watchdog_fired);
    alarm(WATCHDOG_S);
    return 0;
}

static int watchdog_disarm(void **state) {
    (void)state;
    alarm(0);
    return 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* CPU time of the calling thread: what a policy's deadline counts. */
static double thread_cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Whether calls that began at (t0 on the clock, c0 of the thread's CPU) ran
 * past a bound of `deadlines` deadlines of deadline_ms.  On the clock alone a
 * loaded machine fails it: a thread that is not scheduled is not stopped
 * either, by the deadline or by the wall-clock backstop.  So a call is late
 * only if it ran past the bound on the clock AND had the CPU to be stopped
 * well before (more than two deadlines of its own CPU time).
 */
static inline int ran_late(double t0, double c0, double deadlines, int64_t deadline_ms) {
    double wall = now_ms() - t0, cpu = thread_cpu_ms() - c0;
    return wall > deadlines * (double)deadline_ms && cpu > 2.0 * (double)deadline_ms + 3.0;
}

/* Writes text to dir/name (a test's own directory). */
static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    fclose(f);
}

#endif
