/*
 * A stranger holding connections cannot exhaust a rank's descriptors (issue 30, item 4). Every
 * accepted connection held a descriptor until its handshake finished or WEFT_BS_ADMIT_MS passed,
 * without a cap, and the socket transport failed its setup on a failed accept: with ranks at 1024
 * descriptors, 1100 connections held on rank 0's bootstrap listener failed a split ("Too many
 * open files"), and held on the root's before init, failed init.
 *
 * This program defines listen(): each listener the chosen process opens gets ATTACK_CONNS silent
 * connections from an attacker process (its own descriptor limit raised) before listen() returns,
 * so they are queued ahead of every real peer, and they are held until the end. Ranks run at
 * RLIMIT_NOFILE 1024, init, all-reduce, split in two, all-reduce on both halves; every result
 * must be exact, and each rank done within STALL_SECS, the attacker's time in listen() aside (a
 * handshake that waited for a stranger's to time out, 5 s, took longer). Before the fix: ranks
 * failed ("Too many open files", rank 0 gone) or stalled 5 s per listener; the root held up
 * init 5 s. Sanitized builds (ASAN_OPTIONS or TSAN_OPTIONS set) check the results only.
 *
 *   test_fds rank0 N   every listener of rank 0 (its bootstrap listener, the split's, the socket
 *                      transport's under NCCL_SHM_DISABLE=1) is held
 *   test_fds root N    the bootstrap root's listener (in this process, also at 1024) is held
 *                      before any rank inits
 *   test_fds store N   ranks meet at the launch store (torchrun's environment, WEFT_SECRET):
 *                      rank 0's store listener is held first, then its others
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "weft.h"

#include "../common/id_pipe.h"
#include "../common/torchrun_env.h"

#define COUNT 4099
#define RANK_NOFILE 1024
#define ATTACK_CONNS 1100
#define ATTACK_MAX_LISTENERS 6
#define STALL_SECS 4.0

static int attack_on;   /* this process's listeners are attacked */
static double attack_secs; /* time listen() spent waiting for the attacker */
static int req_fd = -1; /* to the attacker: a listener's address */
static int ack_fd = -1; /* from the attacker: how many connections it holds on it */

static double secs_between(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) * 1e-9;
}

/* Every listen() of the library passes here. */
int listen(int fd, int backlog)
{
    int rc = (int)syscall(SYS_listen, fd, backlog);
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int held;
    struct timespec t0, t1;
    if (rc != 0 || !attack_on || getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return rc;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (ss.ss_family == AF_INET && ((struct sockaddr_in *)&ss)->sin_addr.s_addr == INADDR_ANY)
        ((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (write(req_fd, &ss, sizeof(ss)) != (ssize_t)sizeof(ss) ||
        read(ack_fd, &held, sizeof(held)) != (ssize_t)sizeof(held))
        fprintf(stderr, "pid %d: the attacker is gone\n", (int)getpid());
    else
        fprintf(stderr, "pid %d: the attacker holds %d connections on a listener\n",
                (int)getpid(), held);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    attack_secs += secs_between(&t0, &t1);
    return rc;
}

/* Connects ATTACK_CONNS times to every address it is sent and holds them until the end. */
static int attacker(int req, int ack)
{
    struct sockaddr_storage ss;
    struct rlimit rl;
    int nlisteners = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    while (read(req, &ss, sizeof(ss)) == (ssize_t)sizeof(ss)) {
        int held = 0;
        socklen_t len = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in);
        for (int i = 0; i < ATTACK_CONNS && nlisteners < ATTACK_MAX_LISTENERS; i++) {
            int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            struct timeval tv = {.tv_sec = 0, .tv_usec = 200000}; /* a full backlog: stop */
            if (fd < 0)
                break;
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
            if (connect(fd, (struct sockaddr *)&ss, len) != 0) {
                close(fd);
                break;
            }
            held++; /* never closed: the process's exit closes them */
        }
        nlisteners++;
        if (write(ack, &held, sizeof(held)) != (ssize_t)sizeof(held))
            break;
    }
    return 0;
}

static int all_reduce_check(ncclComm_t comm, const char *what, int rank, int n)
{
    float *buf = malloc(COUNT * sizeof(float));
    int wrong = 0;
    for (int i = 0; i < COUNT; i++)
        buf[i] = (float)(rank * 1000 + i % 1000);
    if (ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) {
        fprintf(stderr, "%s rank %d: all-reduce failed: %s\n", what, rank, ncclGetLastError(comm));
        free(buf);
        return 1;
    }
    for (int i = 0; i < COUNT; i++)
        wrong += buf[i] != (float)(1000 * n * (n - 1) / 2 + n * (i % 1000));
    free(buf);
    if (wrong != 0)
        fprintf(stderr, "%s rank %d: %d wrong elements\n", what, rank, wrong);
    return wrong != 0;
}

static int g_store_port; /* store mode: the launch store's port; 0: the id comes by pipe */

/* torchrun's environment for rank `rank` of n, the store at 127.0.0.1:g_store_port. */
static void store_env(int rank, int n)
{
    weft_test_torchrun_env(rank, n, g_store_port, "fdstest");
    setenv("WEFT_SECRET", "fds-test-secret-0123456789abcdef", 1);
}

static int rank_main(struct weft_test_id_pipe *ip, int rank, int n, int attacked)
{
    struct rlimit rl;
    ncclUniqueId id;
    ncclComm_t comm, half;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 3;
    rl.rlim_cur = RANK_NOFILE; /* main() made sure the hard limit allows it */
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        perror("setrlimit");
        return 3;
    }
    attack_on = attacked;
    struct timespec t0, t1;
    if (g_store_port != 0) {
        int lrank, ln, llocal;
        alarm(40);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        store_env(rank, n);
        if (weftLaunchInfo(&lrank, &ln, &llocal, &id) != ncclSuccess || lrank != rank ||
            ln != n) {
            fprintf(stderr, "rank %d: weftLaunchInfo failed: %s\n", rank,
                    ncclGetLastError(NULL));
            return 1;
        }
    } else {
        if (weft_test_id_pipe_recv(ip, &id) != 0)
            return 3;
        alarm(40);
        clock_gettime(CLOCK_MONOTONIC, &t0);
    }
    if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    int bad = all_reduce_check(comm, "world", rank, n);
    if (ncclCommSplit(comm, rank % 2, rank, &half, NULL) != ncclSuccess) {
        fprintf(stderr, "rank %d: split failed: %s\n", rank, ncclGetLastError(comm));
        ncclCommDestroy(comm);
        return 1;
    }
    int hrank, hn;
    ncclCommUserRank(half, &hrank);
    ncclCommCount(half, &hn);
    bad |= all_reduce_check(half, "half", hrank, hn);
    bad |= all_reduce_check(comm, "world again", rank, n);
    ncclCommDestroy(half);
    ncclCommDestroy(comm);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* Without a stall: a handshake that waited for a stranger's to time out (WEFT_BS_ADMIT_MS,
     * 5 s) took longer than this. The attacker's own time in listen() does not count. Sanitized
     * builds run too slowly to tell. */
    double secs = secs_between(&t0, &t1) - attack_secs;
    fprintf(stderr, "rank %d: %.2f s without the attacker's (%.2f s)\n", rank, secs, attack_secs);
    if (secs > STALL_SECS && getenv("ASAN_OPTIONS") == NULL && getenv("TSAN_OPTIONS") == NULL) {
        fprintf(stderr, "rank %d took %.1f s: it waited for the stranger's connections\n", rank,
                secs);
        bad = 1;
    }
    return bad;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int n = argc > 2 ? atoi(argv[2]) : 4;
    int root = strcmp(mode, "root") == 0, store = strcmp(mode, "store") == 0;
    struct weft_test_id_pipe ip; /* fork before the id's thread exists (ThreadSanitizer) */
    int req[2], ack[2];
    pid_t pids[9];
    ncclUniqueId id;
    int bad = 0, st;
    if ((!root && !store && strcmp(mode, "rank0") != 0) || n < 2 || n > 8) {
        fprintf(stderr, "usage: test_fds rank0|root|store N (2..8)\n");
        return 2;
    }
    /* The attacker needs more descriptors than a rank may have (root may raise its own limit) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max < RANK_NOFILE) {
        printf("SKIP: the descriptor limit is below %d\n", RANK_NOFILE);
        return 77;
    }
    if (rl.rlim_max < 4 * ATTACK_CONNS) {
        struct rlimit more = {.rlim_cur = rl.rlim_cur, .rlim_max = 4 * ATTACK_CONNS};
        if (setrlimit(RLIMIT_NOFILE, &more) != 0) {
            printf("SKIP: the attacker cannot have %d descriptors (hard limit %llu)\n",
                   4 * ATTACK_CONNS, (unsigned long long)rl.rlim_max);
            return 77;
        }
    }
    if (pipe(req) != 0 || pipe(ack) != 0 || weft_test_id_pipe_open(&ip) != 0)
        return 1;
    if (store && (g_store_port = weft_test_free_port()) == 0)
        return 1;
    fflush(NULL);
    pids[n] = fork();
    if (pids[n] == 0) {
        close(req[1]);
        close(ack[0]);
        close(ip.fd[0]);
        close(ip.fd[1]);
        _exit(attacker(req[0], ack[1]));
    }
    close(req[0]);
    close(ack[1]);
    req_fd = req[1];
    ack_fd = ack[0];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(&ip, r, n, !root && r == 0));
    }
    if (root) {
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
            rl.rlim_cur = RANK_NOFILE;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        attack_on = 1; /* the root, made by ncclGetUniqueId, runs in this process */
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bad = !store && weft_test_id_pipe_send(&ip, n, &id) != 0;
    attack_on = 0;
    close(req[1]); /* the attacker ends once rank 0 (which holds a copy) is gone too */
    for (int r = 0; r < n; r++) {
        if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "rank %d failed (status 0x%x)\n", r, st);
            bad = 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    waitpid(pids[n], &st, 0);
    printf("fds-%s-%d: %s in %.1f s\n", mode, n, bad ? "FAILED" : "ok", secs_between(&t0, &t1));
    return bad;
}
