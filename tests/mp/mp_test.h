/*
 * Scaffolding shared by the forked multi-process tests (test_faults, test_inject, test_sig): the
 * EXPECT macro, a monotonic clock, forking the ranks and collecting their exit statuses. Each
 * test keeps only what its cases do.
 */
#ifndef WEFT_TEST_MP_TEST_H
#define WEFT_TEST_MP_TEST_H

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_failed __attribute__((unused)); /* EXPECT sets it; a test may not use EXPECT */
/* Where EXPECT writes: stderr, or the real stderr where a rank captures fd 2 (test_sig). */
static int g_fail_fd __attribute__((unused)) = 2;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            dprintf(g_fail_fd, "FAIL %s:%d: ", __FILE__, __LINE__);                                \
            dprintf(g_fail_fd, __VA_ARGS__);                                                       \
            dprintf(g_fail_fd, "\n");                                                              \
            g_failed = 1;                                                                          \
        }                                                                                          \
    } while (0)

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * Forks nranks children (buffers flushed first, so nothing prints twice): child r arms
 * alarm(alarm_s) (a hang fails it with SIGALRM) and exits with rank_main(r, arg). pids gets
 * nranks entries. Returns 0, or -1 when a fork failed (the children made so far are in pids).
 */
static inline int mp_fork_ranks(int nranks, unsigned alarm_s, int (*rank_main)(int r, void *arg),
                                void *arg, pid_t *pids)
{
    fflush(NULL);
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return -1;
        }
        if (pids[r] == 0) {
            alarm(alarm_s);
            _exit(rank_main(r, arg));
        }
    }
    return 0;
}

/* Waits for rank r: 1 when it ended as it should (exit 0, or SIGKILL when want_kill); else
 * prints its status and returns 0. */
static inline int mp_wait_rank(pid_t pid, int r, int want_kill)
{
    int status = 0;
    waitpid(pid, &status, 0);
    int ok = want_kill ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                       : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok)
        fprintf(stderr, "rank %d: status 0x%x%s\n", r, status,
                want_kill ? " (expected SIGKILL)" : "");
    return ok;
}

/* Prints the case's result line ("[name: ]1 passed, 0 failed") and returns its exit code. */
static inline int mp_result(const char *name, int bad)
{
    printf("%s%s%d passed, %d failed\n", name != NULL ? name : "", name != NULL ? ": " : "",
           bad ? 0 : 1, bad ? 1 : 0);
    return bad ? 1 : 0;
}

#endif
