/*
 * Bootstrap tests. Each case runs in a forked child (knobs are read once per process, and a hang
 * or crash fails only its case); the parent kills a case after CASE_LIMIT_S seconds.
 * Ranks are threads of the child, or forked processes for the procs case.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/wire.h"
#include "bootstrap/socket.h"
#include "core/log.h"

#define CASE_LIMIT_S 20

static int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "    %s:%d: expected %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                    \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits (at most 5 s) for this process's root threads to finish, so leak checks see no root. */
static void wait_roots(void)
{
    for (int i = 0; i < 500 && weft_bootstrap_roots_active() > 0; i++)
        usleep(10000);
    usleep(20000); /* the detached thread has returned; let it finish exiting */
}

/* ---- one rank's full exercise ---------------------------------------------------------------- */

#define NTAGS 5

static unsigned char p2p_byte(int src, int dst, int tag, int copy, size_t i)
{
    return (unsigned char)(src * 31 + dst * 17 + tag * 7 + copy * 3 + i);
}

static size_t p2p_size(int tag)
{
    return (size_t)(tag * tag * 97 + 1);
}

static void exercise(struct weft_bootstrap *bs, int rank, int nranks, int full_p2p)
{
    /* allgather of rank-dependent data, element by element */
    enum { K = 37 };
    int *all = malloc(sizeof(int) * K * nranks);
    for (int i = 0; i < K * nranks; i++)
        all[i] = i / K == rank ? rank * 1000 + i % K : -1;
    EXPECT(weft_bootstrap_allgather(bs, all, sizeof(int) * K) == ncclSuccess, "rank %d", rank);
    for (int i = 0; i < K * nranks; i++)
        EXPECT(all[i] == (i / K) * 1000 + i % K, "rank %d element %d is %d", rank, i, all[i]);
    free(all);

    EXPECT(weft_bootstrap_barrier(bs) == ncclSuccess, "rank %d", rank);

    /* bcast from the last rank and from rank 0 */
    for (int r = 0; r < 2; r++) {
        int root = r == 0 ? nranks - 1 : 0;
        unsigned char buf[100];
        for (int i = 0; i < 100; i++)
            buf[i] = rank == root ? (unsigned char)(i * 3 + root) : 0;
        EXPECT(weft_bootstrap_bcast(bs, root, buf, sizeof(buf)) == ncclSuccess, "rank %d", rank);
        for (int i = 0; i < 100; i++)
            EXPECT(buf[i] == (unsigned char)(i * 3 + root), "rank %d bcast byte %d", rank, i);
    }

    /*
     * Tagged send/recv: to every peer (or to the ring neighbours) tags 0..NTAGS-1 in order, plus
     * a second message with tag 2; received in a shuffled tag order after a barrier, so the
     * messages must be kept aside while the barrier reads the same connections.
     */
    int npeers = full_p2p ? nranks : (nranks < 3 ? nranks : 3);
    for (int k = 0; k < npeers; k++) {
        int dst = full_p2p ? k : (rank + k - (npeers == 3 ? 1 : 0) + nranks) % nranks;
        for (int tag = 0; tag <= NTAGS; tag++) {
            int t = tag == NTAGS ? 2 : tag, copy = tag == NTAGS;
            size_t n = p2p_size(t);
            unsigned char *msg = malloc(n);
            for (size_t i = 0; i < n; i++)
                msg[i] = p2p_byte(rank, dst, t, copy, i);
            EXPECT(weft_bootstrap_send(bs, dst, t, msg, n) == ncclSuccess, "%d -> %d tag %d", rank,
                   dst, t);
            free(msg);
        }
    }
    EXPECT(weft_bootstrap_barrier(bs) == ncclSuccess, "rank %d", rank);
    static const int order[NTAGS + 1] = {3, 2, 0, 4, 2, 1};
    for (int k = 0; k < npeers; k++) {
        int src = full_p2p ? k : (rank - k + (npeers == 3 ? 1 : 0) + nranks) % nranks;
        int seen2 = 0;
        for (int j = 0; j <= NTAGS; j++) {
            int t = order[(j + rank) % (NTAGS + 1)], copy = t == 2 ? seen2++ : 0;
            size_t n = p2p_size(t);
            unsigned char *msg = malloc(n);
            EXPECT(weft_bootstrap_recv(bs, src, t, msg, n) == ncclSuccess, "%d <- %d tag %d", rank,
                   src, t);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += msg[i] != p2p_byte(src, rank, t, copy, i);
            EXPECT(bad == 0, "%d <- %d tag %d copy %d: %zu wrong bytes", rank, src, t, copy, bad);
            free(msg);
        }
    }
    EXPECT(weft_bootstrap_barrier(bs) == ncclSuccess, "rank %d", rank);
}

/* ---- ranks as threads -------------------------------------------------------------------------
 */

struct rank_arg {
    ncclUniqueId id;
    int rank;
    int nranks;
    int full_p2p;
    volatile uint32_t *abort_flag;
    ncclResult_t init_res;
};

static void *rank_thread(void *p)
{
    struct rank_arg *a = p;
    struct weft_bootstrap *bs = NULL;
    a->init_res = weft_bootstrap_init(&a->id, a->rank, a->nranks, a->abort_flag, &bs);
    if (a->init_res != ncclSuccess)
        return NULL;
    if (a->full_p2p >= 0)
        exercise(bs, a->rank, a->nranks, a->full_p2p);
    EXPECT(weft_bootstrap_close(bs) == ncclSuccess, "rank %d", a->rank);
    return NULL;
}

/* Runs nranks threads; rank_of/nranks_of let a case lie about ranks (NULL: honest). */
static void run_threads(const ncclUniqueId *id, int nranks, int full_p2p, const int *rank_of,
                        const int *nranks_of, ncclResult_t *res)
{
    pthread_t *t = calloc(nranks, sizeof(*t));
    struct rank_arg *a = calloc(nranks, sizeof(*a));
    for (int i = 0; i < nranks; i++) {
        a[i] = (struct rank_arg){.id = *id,
                                 .rank = rank_of ? rank_of[i] : i,
                                 .nranks = nranks_of ? nranks_of[i] : nranks,
                                 .full_p2p = full_p2p};
        EXPECT(pthread_create(&t[i], NULL, rank_thread, &a[i]) == 0, "thread %d", i);
    }
    for (int i = 0; i < nranks; i++) {
        pthread_join(t[i], NULL);
        if (res != NULL)
            res[i] = a[i].init_res;
        else
            EXPECT(a[i].init_res == ncclSuccess, "rank %d init: %d (%s)", i, a[i].init_res,
                   weft_log_last_error());
    }
    free(t);
    free(a);
}

static void threads_case(int nranks, int full_p2p)
{
    ncclUniqueId id;
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    EXPECT(weft_bootstrap_magic(&id) != 0, "magic of a fresh id");
    run_threads(&id, nranks, full_p2p, NULL, NULL, NULL);
}

static void case_threads_1(void)
{
    threads_case(1, 1);
}
static void case_threads_2(void)
{
    threads_case(2, 1);
}
static void case_threads_3(void)
{
    threads_case(3, 1);
}
static void case_threads_8(void)
{
    threads_case(8, 1);
}
static void case_threads_16(void)
{
    threads_case(16, 1);
}
static void case_threads_64(void)
{
    threads_case(64, 0);
}

/* Several communicators bootstrapping at once in one process. */
static void *comm_thread(void *p)
{
    threads_case(*(int *)p, 1);
    return NULL;
}

static void case_concurrent_comms(void)
{
    static int sizes[4] = {2, 3, 4, 5};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, comm_thread, &sizes[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
}

/* ---- ranks as processes -----------------------------------------------------------------------
 */

/*
 * The id is made in its own process, as when one rank makes it and sends it out of band; the
 * ranks are forked from a process without a root thread (a fork would copy the root's memory
 * but not its thread, which leak checkers rightly report).
 */
static void case_procs_4(void)
{
    enum { N = 4 };
    ncclUniqueId id;
    pid_t pid[N + 1];
    int fds[2];
    EXPECT(pipe(fds) == 0, "pipe");
    pid[N] = fork();
    if (pid[N] == 0) {
        close(fds[0]);
        EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
        EXPECT(write(fds[1], &id, sizeof(id)) == sizeof(id), "write");
        wait_roots();
        _exit(failures ? 1 : 0);
    }
    close(fds[1]);
    EXPECT(read(fds[0], &id, sizeof(id)) == sizeof(id), "read the id");
    close(fds[0]);
    for (int r = 0; r < N; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            struct weft_bootstrap *bs;
            ncclResult_t res = weft_bootstrap_init(&id, r, N, NULL, &bs);
            EXPECT(res == ncclSuccess, "rank %d init: %d (%s)", r, res, weft_log_last_error());
            if (res == ncclSuccess) {
                exercise(bs, r, N, 1);
                weft_bootstrap_close(bs);
            }
            _exit(failures ? 1 : 0);
        }
    }
    for (int r = 0; r <= N; r++) {
        int status = 0;
        waitpid(pid[r], &status, 0);
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d status 0x%x", r, status);
    }
}

/* ---- bad ids, stale ids, mismatches -----------------------------------------------------------
 */

static void expect_init_fails(const ncclUniqueId *id, ncclResult_t want, double max_s)
{
    struct weft_bootstrap *bs = NULL;
    double t0 = now_s();
    ncclResult_t res = weft_bootstrap_init(id, 0, 2, NULL, &bs);
    double dt = now_s() - t0;
    EXPECT(res == want, "init returned %d, %d expected (%s)", res, want, weft_log_last_error());
    EXPECT(bs == NULL, "no handle on failure");
    EXPECT(dt < max_s, "failed after %.2f s, limit %.2f s", dt, max_s);
}

static void case_garbage_id(void)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    expect_init_fails(&id, ncclInvalidArgument, 0.5);
    EXPECT(weft_bootstrap_magic(&id) == 0, "magic of a zeroed id");
    srand(7);
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        id.internal[i] = (char)rand();
    expect_init_fails(&id, ncclInvalidArgument, 0.5);
    /* A real id with a flipped byte in its zero tail. */
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    id.internal[100] = 1;
    expect_init_fails(&id, ncclInvalidArgument, 0.5);
    EXPECT(weft_bootstrap_init(&id, 2, 2, NULL, NULL) == ncclInvalidArgument, "rank out of range");
}

/* WEFT_BOOTSTRAP_TIMEOUT is 1 here: the root that nobody visits is gone after a second. */
static void case_stale_id_timed_out(void)
{
    ncclUniqueId id;
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    wait_roots();
    EXPECT(weft_bootstrap_roots_active() == 0, "root still running after its deadline");
    expect_init_fails(&id, ncclSystemError, 1.5);
}

/* The root served one communicator and exited; reusing the id must fail quickly. */
static void case_stale_id_reused(void)
{
    ncclUniqueId id;
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    run_threads(&id, 2, 1, NULL, NULL, NULL);
    wait_roots();
    expect_init_fails(&id, ncclSystemError, 1.5);
}

static void case_mismatched_nranks(void)
{
    ncclUniqueId id;
    static const int nranks_of[2] = {2, 3};
    ncclResult_t res[2];
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    double t0 = now_s();
    run_threads(&id, 2, 1, NULL, nranks_of, res);
    for (int i = 0; i < 2; i++)
        EXPECT(res[i] == ncclInvalidUsage, "rank %d returned %d", i, res[i]);
    EXPECT(strstr(weft_log_last_error(), "nranks") != NULL, "message: %s", weft_log_last_error());
    EXPECT(now_s() - t0 < 1.0, "took %.2f s", now_s() - t0);
}

static void case_duplicate_rank(void)
{
    ncclUniqueId id;
    static const int rank_of[2] = {1, 1};
    ncclResult_t res[2];
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    run_threads(&id, 2, 1, rank_of, NULL, res);
    for (int i = 0; i < 2; i++)
        EXPECT(res[i] == ncclInvalidUsage, "thread %d returned %d", i, res[i]);
    EXPECT(strstr(weft_log_last_error(), "rank 1 joined twice") != NULL, "message: %s",
           weft_log_last_error());
}

static void case_size_mismatch(void)
{
    ncclUniqueId id;
    struct rank_arg a = {.rank = 1, .nranks = 2, .full_p2p = -1};
    pthread_t t;
    struct weft_bootstrap *bs;
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    a.id = id;
    pthread_create(&t, NULL, rank_thread, &a); /* joins, then closes right away */
    EXPECT(weft_bootstrap_init(&id, 0, 2, NULL, &bs) == ncclSuccess, "%s", weft_log_last_error());
    pthread_join(t, NULL);
    char buf[16] = {0};
    EXPECT(weft_bootstrap_send(bs, 0, 9, buf, 8) == ncclSuccess, "send to self");
    EXPECT(weft_bootstrap_recv(bs, 0, 9, buf, 16) == ncclInvalidUsage, "size mismatch");
    weft_bootstrap_close(bs);
}

/* Rank 1 sends more early messages than a rank keeps: rank 0's receive fails naming the bound,
 * instead of queueing without limit. */
static void *flood_thread(void *p)
{
    struct rank_arg *a = p;
    struct weft_bootstrap *bs;
    if (weft_bootstrap_init(&a->id, 1, 2, NULL, &bs) != ncclSuccess)
        return NULL;
    for (int i = 0; i <= WEFT_BS_MAX_UNEXPECTED; i++)
        if (weft_bootstrap_send(bs, 0, 1, NULL, 0) != ncclSuccess)
            break;
    weft_bootstrap_close(bs); /* what was sent is still delivered */
    return NULL;
}

static void case_unexpected_bound(void)
{
    ncclUniqueId id;
    struct rank_arg a = {.rank = 1, .nranks = 2};
    pthread_t t;
    struct weft_bootstrap *bs;
    char buf[4];
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    a.id = id;
    pthread_create(&t, NULL, flood_thread, &a);
    EXPECT(weft_bootstrap_init(&id, 0, 2, NULL, &bs) == ncclSuccess, "%s", weft_log_last_error());
    EXPECT(weft_bootstrap_recv(bs, 1, 2, buf, sizeof(buf)) == ncclInvalidUsage,
           "receive past the bound of early messages");
    EXPECT(strstr(weft_log_last_error(), "nobody asked for") != NULL, "%s",
           weft_log_last_error());
    weft_bootstrap_close(bs);
    pthread_join(t, NULL);
}

/* ---- knobs: NCCL_COMM_ID, interfaces, abort ---------------------------------------------------
 */

static int free_port(void)
{
    union weft_sockaddr addr = {.sin = {.sin_family = AF_INET}};
    int fd;
    addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (weft_socket_listen(&addr, &fd) != ncclSuccess)
        return 0;
    close(fd);
    return ntohs(addr.sin.sin_port);
}

static void case_comm_id(void)
{
    char env[64];
    ncclUniqueId a, b;
    snprintf(env, sizeof(env), "127.0.0.1:%d", free_port());
    setenv("NCCL_COMM_ID", env, 1);
    EXPECT(weft_bootstrap_get_unique_id(&a) == ncclSuccess, "%s", weft_log_last_error());
    EXPECT(weft_bootstrap_get_unique_id(&b) == ncclSuccess, "%s", weft_log_last_error());
    EXPECT(memcmp(&a, &b, sizeof(a)) == 0, "NCCL_COMM_ID ids differ");
    EXPECT(weft_bootstrap_roots_active() == 0, "a root thread started before init");
    run_threads(&a, 3, 1, NULL, NULL, NULL);
}

static void case_ipv6_lo(void)
{
    setenv("NCCL_SOCKET_IFNAME", "=lo", 1);
    setenv("NCCL_SOCKET_FAMILY", "AF_INET6", 1);
    ncclUniqueId id;
    if (weft_bootstrap_get_unique_id(&id) != ncclSuccess) {
        printf("    (no IPv6 loopback here: %s)\n", weft_log_last_error());
        return;
    }
    run_threads(&id, 3, 1, NULL, NULL, NULL);
}

static void case_bad_ifname(void)
{
    setenv("NCCL_SOCKET_IFNAME", "=no_such_if0", 1);
    ncclUniqueId id;
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclInvalidArgument, "%s", weft_log_last_error());
}

static void case_abort(void)
{
    static volatile uint32_t flag;
    ncclUniqueId id;
    struct rank_arg a = {.rank = 0, .nranks = 2, .abort_flag = &flag};
    pthread_t t;
    EXPECT(weft_bootstrap_get_unique_id(&id) == ncclSuccess, "%s", weft_log_last_error());
    a.id = id;
    double t0 = now_s();
    pthread_create(&t, NULL, rank_thread, &a); /* rank 1 never comes */
    usleep(100000);
    __atomic_store_n(&flag, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    EXPECT(a.init_res == ncclSystemError, "init returned %d", a.init_res);
    EXPECT(now_s() - t0 < 0.5, "abort took %.2f s", now_s() - t0);
}

/* ---- driver ---------------------------------------------------------------------------------- */

struct test_case {
    const char *name;
    void (*fn)(void);
    const char *timeout; /* WEFT_BOOTSTRAP_TIMEOUT for the case */
};

static const struct test_case cases[] = {
    {"threads_1", case_threads_1, "10"},
    {"threads_2", case_threads_2, "10"},
    {"threads_3", case_threads_3, "10"},
    {"threads_8", case_threads_8, "10"},
    {"threads_16", case_threads_16, "10"},
    {"threads_64", case_threads_64, "10"},
    {"concurrent_comms", case_concurrent_comms, "10"},
    {"procs_4", case_procs_4, "10"},
    {"garbage_id", case_garbage_id, "1"},
    {"stale_id_timed_out", case_stale_id_timed_out, "1"},
    {"stale_id_reused", case_stale_id_reused, "1"},
    {"mismatched_nranks", case_mismatched_nranks, "1"},
    {"duplicate_rank", case_duplicate_rank, "5"},
    {"size_mismatch", case_size_mismatch, "5"},
    {"unexpected_bound", case_unexpected_bound, "5"},
    {"comm_id", case_comm_id, "10"},
    {"ipv6_lo", case_ipv6_lo, "10"},
    {"bad_ifname", case_bad_ifname, "10"},
    {"abort", case_abort, "2"},
};

static int run_case(const struct test_case *c)
{
    double t0 = now_s();
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("WEFT_BOOTSTRAP_TIMEOUT", c->timeout, 1);
        c->fn();
        wait_roots();
        fflush(stdout);
        exit(failures ? 1 : 0);
    }
    int status = -1;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_s() - t0 > CASE_LIMIT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            printf("FAIL %s: killed after %d s\n", c->name, CASE_LIMIT_S);
            return 0;
        }
        usleep(5000);
    }
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("%s %s (%.2f s)\n", ok ? "ok  " : "FAIL", c->name, now_s() - t0);
    return ok;
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        if (run_case(&cases[i]))
            passed++;
        else
            failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
