/*
 * Ranks of one host in different PID namespaces (containers started with --ipc=host
 * --network=host and a PID namespace each): a pid from another namespace names nothing here, so
 * liveness must not rest on kill(pid, 0). Each rank runs in a PID namespace of its own, rank 1
 * one fork deeper so that its pid (2) does not exist in rank 0's namespace, where only pid 1
 * lives.
 *
 *   test_pidns alive   rank 1 starts its all-reduce 3 s late: rank 0 waits, must not take it
 *                      for dead, and both get the right sum
 *   test_pidns dead    rank 1 exits without destroying its communicator: rank 0's all-reduce
 *                      fails within 10 s (WEFT_TIMEOUT is 60) with a message naming peer 1
 *
 * Needs root for the PID namespaces (exit 77, SKIP, otherwise).
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "../common/time_scale.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int rank_main(const char *mode, int rank, ncclUniqueId id)
{
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d (pid %d here): init failed: %s\n", rank, (int)getpid(),
                ncclGetLastError(NULL));
        return 1;
    }
    float x = (float)(rank + 1), sum = 0.0f;
    if (strcmp(mode, "dead") == 0 && rank == 1)
        _exit(0); /* gone without ncclCommDestroy: a crash, as its peer sees it */
    if (rank == 1)
        sleep(3);
    double t0 = now_s();
    ncclResult_t res = ncclAllReduce(&x, &sum, 1, ncclFloat, ncclSum, comm, NULL);
    double dt = now_s() - t0;
    int bad = 0;
    if (strcmp(mode, "alive") == 0) {
        if (res != ncclSuccess || sum != 3.0f) {
            fprintf(stderr, "rank %d: all-reduce returned %d, sum %g: %s\n", rank, res, sum,
                    ncclGetLastError(NULL));
            bad = 1;
        }
        ncclCommDestroy(comm);
    } else {
        const char *msg = ncclGetLastError(NULL);
        if (res == ncclSuccess || dt > 10 || strstr(msg, "peer 1") == NULL) {
            fprintf(stderr, "rank 0: all-reduce with a dead peer returned %d after %.1f s: %s\n",
                    res, dt, msg);
            bad = 1;
        }
        ncclCommAbort(comm);
    }
    return bad;
}

/* Runs fn in a new PID namespace, `depth` forks below its init; returns the rank's status. */
static int in_pid_ns(const char *mode, int rank, ncclUniqueId id, int depth)
{
    if (unshare(CLONE_NEWPID) != 0)
        return errno == EPERM ? 77 : 1;
    pid_t pid = fork(); /* pid 1 of the new namespace */
    if (pid == 0) {
        for (int d = 0; d < depth; d++) {
            pid_t c = fork();
            if (c != 0) {
                int st;
                waitpid(c, &st, 0);
                _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
            }
        }
        _exit(rank_main(mode, rank, id));
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "alive") != 0 && strcmp(argv[1], "dead") != 0)) {
        fprintf(stderr, "usage: %s alive|dead\n", argv[0]);
        return 2;
    }
    if (geteuid() != 0) {
        printf("SKIP: PID namespaces need root\n");
        return 77;
    }
    setenv("WEFT_TIMEOUT", "60", 1);
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return 1;
    fflush(NULL);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(weft_test_scaled(40));
            _exit(in_pid_ns(argv[1], r, id, r));
        }
    }
    int bad = 0, skip = 0;
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        skip |= code == 77;
        bad |= code != 0 && code != 77;
        if (code != 0)
            fprintf(stderr, "rank %d: exit %d\n", r, code);
    }
    if (skip && !bad) {
        printf("SKIP: cannot create a PID namespace here\n");
        return 77;
    }
    printf("%d passed, %d failed\n", bad ? 0 : 1, bad ? 1 : 0);
    return bad;
}
