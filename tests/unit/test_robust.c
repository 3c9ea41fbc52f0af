/*
 * Liveness pieces without peers (issue 14 item 5) and the WEFT_FAULT parser (issue 15 item 4):
 *   fault-parse  weft_fault_parse: every kind with its keys and defaults; every malformed spec
 *                (unknown kind or key, missing required key, bad numbers, empty items, too many)
 *                fails with a message naming the problem
 *   arena        the executor arena keeps a small block for reuse and gives a large one back
 *   ticket       (WEFT_TIMEOUT=1) a ticket nobody runs fails its successor's wait in about a
 *                second, naming both; a ticket that runs for longer than the deadline does not
 *   stream       (WEFT_TIMEOUT=1) synchronize waits out a job that runs longer than the deadline,
 *                and fails when jobs are pending while none runs
 *   keepalive    connected sockets (both ends) carry keepalive and TCP_USER_TIMEOUT from
 *                WEFT_SOCKET_KEEPALIVE (15 s by default)
 *   init-failed  (WEFT_BOOTSTRAP_TIMEOUT=2) work queued on a non-blocking communicator whose init
 *                fails is refused with an error, not run
 *   doorbell     no wake-up is lost: a process sleeps on a doorbell for each of 20000 posts of
 *                another, which posts while the sleeper announces itself, at offsets swept over
 *                a range wider than a cache-line transfer; with the light ring (membarrier)
 *                where the kernel has it and with the fenced one. A lost ring shows as a sleep
 *                that runs to its 1 s timeout with the post there
 * Usage: test_robust CASE
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <linux/membarrier.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "nccl.h"
#include "bootstrap/socket.h"
#include "core/comm.h"
#include "core/fault.h"
#include "exec/arena.h"
#include "exec/stream.h"
#include "exec/wait.h"

static int nfail, npass;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (cond) {                                                                                \
            npass++;                                                                               \
        } else if (nfail++ < 40) {                                                                 \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void case_fault_parse(void)
{
    struct weft_fault f[WEFT_FAULT_MAX];
    char err[256];
    EXPECT(weft_fault_parse("", f, WEFT_FAULT_MAX, err, sizeof(err)) == 0, "empty");
    EXPECT(weft_fault_parse(NULL, f, WEFT_FAULT_MAX, err, sizeof(err)) == 0, "NULL");
    int n = weft_fault_parse("kill:op=5:rank=1,stall:peer=2:sec=3,drop,corrupt:frame=4:rank=0:"
                             "peer=1,alloc:op=2,devalloc:n=3,launch:n=7,note:peer=2:n=4",
                             f, WEFT_FAULT_MAX, err, sizeof(err));
    EXPECT(n == 8, "eight faults: %d (%s)", n, n < 0 ? err : "");
    if (n == 8) {
        EXPECT(f[0].kind == WEFT_FAULT_KILL && f[0].n == 5 && f[0].rank == 1 && f[0].peer == -1,
               "kill");
        EXPECT(f[1].kind == WEFT_FAULT_STALL && f[1].sec == 3 && f[1].peer == 2 &&
                   f[1].rank == -1 && f[1].n == 1,
               "stall: frame defaults to 1, rank to any");
        EXPECT(f[2].kind == WEFT_FAULT_DROP && f[2].rank == -1 && f[2].peer == -1 && f[2].n == 1,
               "drop");
        EXPECT(f[3].kind == WEFT_FAULT_CORRUPT && f[3].n == 4 && f[3].rank == 0 && f[3].peer == 1,
               "corrupt");
        EXPECT(f[4].kind == WEFT_FAULT_ALLOC && f[4].n == 2, "alloc");
        EXPECT(f[5].kind == WEFT_FAULT_DEVALLOC && f[5].n == 3, "devalloc");
        EXPECT(f[6].kind == WEFT_FAULT_LAUNCH && f[6].n == 7, "launch");
        EXPECT(f[7].kind == WEFT_FAULT_NOTE && f[7].n == 4 && f[7].peer == 2 && f[7].rank == -1,
               "note");
        for (int i = 0; i < 8; i++)
            EXPECT(f[i].seen == 0 && f[i].fired == 0, "fault %d starts unfired", i);
    }
    static const struct {
        const char *spec;
        const char *says;
    } bad[] = {
        {"explode", "unknown fault"},
        {"kill", "needs op="},
        {"kill:rank=1", "needs op="},
        {"stall:peer=1", "needs sec="},
        {"devalloc", "needs n="},
        {"kill:op=0", "op \"0\""},
        {"kill:op=-3", "op \"-3\""},
        {"kill:op=5x", "op \"5x\""},
        {"kill:op=", "op \"\""},
        {"kill:op=5:rank=-1", "rank \"-1\""},
        {"kill:op=5:rank=99999999999", "rank"},
        {"kill:op=5:peer=1", "takes no key \"peer\""},
        {"drop:sec=1", "takes no key \"sec\""},
        {"note:frame=1", "takes no key \"frame\""},
        {"launch:n=1:rank=0", "takes no key \"rank\""},
        {"drop:frame", "not KEY=VALUE"},
        {"drop,,kill:op=1", "empty fault"},
        {"drop,", "empty fault"},
        {",drop", "empty fault"},
        {"stall:sec=1:frame=0", "frame \"0\""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        err[0] = '\0';
        int r = weft_fault_parse(bad[i].spec, f, WEFT_FAULT_MAX, err, sizeof(err));
        EXPECT(r == -1 && strstr(err, bad[i].says) != NULL && strstr(err, "WEFT_FAULT") != NULL,
               "\"%s\": %d, \"%s\" (wanted \"%s\")", bad[i].spec, r, err, bad[i].says);
    }
    char many[512] = "drop";
    for (int i = 1; i <= WEFT_FAULT_MAX; i++)
        strcat(many, ",drop");
    EXPECT(weft_fault_parse(many, f, WEFT_FAULT_MAX, err, sizeof(err)) == -1 &&
               strstr(err, "more than") != NULL,
           "too many: %s", err);
    char longone[300];
    memset(longone, 'x', sizeof(longone) - 1);
    longone[sizeof(longone) - 1] = '\0';
    EXPECT(weft_fault_parse(longone, f, WEFT_FAULT_MAX, err, sizeof(err)) == -1, "too long");
    /* a tiny error buffer is still a NUL-terminated message */
    char tiny[8];
    EXPECT(weft_fault_parse("explode", f, WEFT_FAULT_MAX, tiny, sizeof(tiny)) == -1 &&
               strlen(tiny) < sizeof(tiny),
           "tiny buffer");
}

static void case_arena(void)
{
    weft_arena_reset();
    void *a = weft_arena_alloc(1000);
    EXPECT(a != NULL && ((uintptr_t)a & 63) == 0, "small allocation, aligned");
    weft_arena_reset();
    size_t held = weft_arena_held();
    EXPECT(held > 0 && held <= (4u << 20), "a small arena is kept: %zu", held);
    EXPECT(weft_arena_alloc(1000) == a, "and reused");
    weft_arena_reset();
    size_t big = 256u << 20;
    char *p = weft_arena_alloc(big);
    EXPECT(p != NULL, "256 MiB");
    if (p != NULL)
        memset(p, 1, big); /* resident now */
    EXPECT(weft_arena_held() >= big, "held while in use: %zu", weft_arena_held());
    weft_arena_reset();
    EXPECT(weft_arena_held() <= (4u << 20), "given back after reset: %zu", weft_arena_held());
    /* many small allocations that outgrow one block merge into one kept block */
    for (int i = 0; i < 100; i++)
        EXPECT(weft_arena_alloc(10000) != NULL, "allocation %d", i);
    weft_arena_reset();
    held = weft_arena_held();
    EXPECT(held >= 100 * 10048 && held <= (4u << 20), "merged: %zu", held);
    void *q = weft_arena_alloc(900000);
    EXPECT(q != NULL && weft_arena_held() == held, "one block serves a call that size");
    weft_arena_reset();
}

struct ticket_arg {
    struct ncclComm *comm;
    uint64_t ticket;
    double run_s;
};

static void *ticket_runner(void *p)
{
    struct ticket_arg *a = p;
    if (weft_comm_ticket_wait(a->comm, a->ticket) == ncclSuccess)
        usleep((useconds_t)(a->run_s * 1e6));
    weft_comm_ticket_done(a->comm);
    return NULL;
}

static void case_ticket(void)
{
    struct ncclComm *comm;
    if (weft_comm_alloc(&comm, 1, 0, NULL) != ncclSuccess) {
        EXPECT(0, "comm alloc: %s", ncclGetLastError(NULL));
        return;
    }
    /* ticket 0 runs for 2.5 s (longer than WEFT_TIMEOUT=1): ticket 1 waits it out */
    struct ticket_arg a = {comm, weft_comm_ticket_take(comm), 2.5};
    uint64_t t1 = weft_comm_ticket_take(comm);
    pthread_t th;
    pthread_create(&th, NULL, ticket_runner, &a);
    double t0 = now_s();
    ncclResult_t res = weft_comm_ticket_wait(comm, t1);
    double dt = now_s() - t0;
    EXPECT(res == ncclSuccess && dt > 2.0, "waited for a running ticket: %d after %.1f s (%s)",
           res, dt, ncclGetLastError(NULL));
    weft_comm_ticket_done(comm);
    pthread_join(th, NULL);
    /* ticket 2 is taken and never run (a leaked turn): ticket 3 fails in about a second */
    uint64_t t2 = weft_comm_ticket_take(comm);
    uint64_t t3 = weft_comm_ticket_take(comm);
    t0 = now_s();
    res = weft_comm_ticket_wait(comm, t3);
    dt = now_s() - t0;
    const char *msg = ncclGetLastError(NULL);
    EXPECT(res == ncclSystemError && dt > 0.9 && dt < 3, "leaked ticket: %d after %.1f s", res,
           dt);
    char want[64];
    snprintf(want, sizeof(want), "work %llu waited", (unsigned long long)t3);
    EXPECT(strstr(msg, want) != NULL && strstr(msg, "never started") != NULL, "message: %s", msg);
    (void)t2;
}

struct slow_job {
    struct weft_job job;
    double run_s, finish_s;
};

static ncclResult_t slow_run(struct weft_job *job)
{
    usleep((useconds_t)(((struct slow_job *)job)->run_s * 1e6));
    return ncclSuccess;
}

static void slow_finish(struct weft_job *job, ncclResult_t res)
{
    (void)res;
    usleep((useconds_t)(((struct slow_job *)job)->finish_s * 1e6));
}

static void case_stream(void)
{
    struct weft_stream *s;
    if (weft_stream_create(&s) != ncclSuccess) {
        EXPECT(0, "stream create");
        return;
    }
    struct slow_job a = {{NULL, slow_run, slow_finish}, 2.5, 0};
    weft_stream_enqueue(s, &a.job);
    double t0 = now_s();
    ncclResult_t res = weft_stream_synchronize(s);
    EXPECT(res == ncclSuccess && now_s() - t0 > 2.0, "a job running past WEFT_TIMEOUT: %d", res);
    /* the worker is stuck in a job's finish (outside run) while another job waits */
    struct slow_job b = {{NULL, slow_run, slow_finish}, 0, 3.0};
    struct slow_job c = {{NULL, slow_run, slow_finish}, 0, 0};
    weft_stream_enqueue(s, &b.job);
    weft_stream_enqueue(s, &c.job);
    t0 = now_s();
    res = weft_stream_synchronize(s);
    double dt = now_s() - t0;
    EXPECT(res == ncclSystemError && dt < 2.9, "pending, none running: %d after %.1f s", res, dt);
    EXPECT(strstr(ncclGetLastError(NULL), "none ran") != NULL, "message: %s",
           ncclGetLastError(NULL));
    weft_stream_destroy(s);
}

static void case_keepalive(void)
{
    union weft_sockaddr addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin.sin_family = AF_INET;
    addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int lfd = -1, cfd = -1, afd = -1;
    EXPECT(weft_socket_listen(&addr, &lfd) == ncclSuccess, "listen");
    EXPECT(weft_socket_connect(&addr, weft_socket_deadline(5), NULL, "test", &cfd) == ncclSuccess,
           "connect");
    for (int i = 0; i < 500 && afd < 0; i++) {
        if (weft_socket_accept(lfd, &afd) != ncclSuccess)
            break;
        if (afd < 0)
            usleep(10000);
    }
    EXPECT(afd >= 0, "accepted");
    int fds[2] = {cfd, afd};
    for (int i = 0; i < 2; i++) {
        int ka = 0, cnt = 0;
        unsigned int ut = 0;
        socklen_t len = sizeof(ka);
        getsockopt(fds[i], SOL_SOCKET, SO_KEEPALIVE, &ka, &len);
        len = sizeof(ut);
        getsockopt(fds[i], IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, &len);
        len = sizeof(cnt);
        getsockopt(fds[i], IPPROTO_TCP, TCP_KEEPCNT, &cnt, &len);
        EXPECT(ka == 1 && ut == 15000 && cnt == 3, "%s: keepalive %d user timeout %u count %d",
               i == 0 ? "connected" : "accepted", ka, ut, cnt);
    }
    weft_socket_close(&cfd);
    weft_socket_close(&afd);
    weft_socket_close(&lfd);
}

/* A non-blocking init that fails (its peer never comes): work issued on it is refused with an
 * error, never run on connections that do not exist (it crashed on a NULL peer table). While the
 * init is in progress NCCL refuses the call at once (ncclInvalidArgument: the comm is used before
 * its previous operation returned ncclSuccess). */
static void case_init_failed(void)
{
    ncclUniqueId id;
    EXPECT(ncclGetUniqueId(&id) == ncclSuccess, "unique id");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&comm, 2, id, 0, &cfg);
    EXPECT(res == ncclInProgress || res == ncclSuccess, "init %d", res);
    if (comm == NULL)
        return;
    /* NCCL's attribute queries and finalize also refuse a comm whose init is pending (they may
     * not read it before the init is joined) and leave their output alone. */
    int out = -7;
    res = ncclCommCount(comm, &out);
    EXPECT(res == ncclInvalidArgument && out == -7, "count during the init %d (%d)", res, out);
    res = ncclCommCuDevice(comm, &out);
    EXPECT(res == ncclInvalidArgument && out == -7, "cu device during the init %d (%d)", res, out);
    res = ncclCommUserRank(comm, &out);
    EXPECT(res == ncclInvalidArgument && out == -7, "user rank during the init %d (%d)", res, out);
    EXPECT(strstr(ncclGetLastError(comm), "ncclCommUserRank") != NULL, "message '%s'",
           ncclGetLastError(comm));
    res = ncclCommFinalize(comm);
    EXPECT(res == ncclInvalidArgument, "finalize during the init %d", res);
    int v = 1;
    res = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL);
    EXPECT(res == ncclInvalidArgument, "all-reduce during the init %d", res);
    ncclResult_t state = ncclInProgress;
    double t0 = now_s();
    while (state == ncclInProgress && now_s() - t0 < 20) {
        ncclCommGetAsyncError(comm, &state);
        usleep(10000);
    }
    EXPECT(state != ncclSuccess && state != ncclInProgress, "async state %d", state);
    EXPECT(v == 1, "the all-reduce ran: %d", v);
    /* Once the init failed, the queries return its error, as NCCL's do. */
    res = ncclCommCount(comm, &out);
    EXPECT(res == state && out == -7, "count after the failed init %d (%d)", res, out);
    ncclCommAbort(comm);
}

/* Rank 1 of case_finalize_busy: joins the all-reduce only once rank 0 has tried to finalize. */
struct busy_peer {
    ncclUniqueId id;
    int go;
    int v;
    ncclResult_t res;
};

static ncclResult_t busy_wait(ncclComm_t comm)
{
    ncclResult_t state = ncclInProgress;
    double t0 = now_s();
    while (state == ncclInProgress && now_s() - t0 < 20) {
        ncclCommGetAsyncError(comm, &state);
        if (state == ncclInProgress)
            usleep(1000);
    }
    return state;
}

static void *busy_peer_run(void *arg)
{
    struct busy_peer *b = arg;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    b->res = ncclCommInitRankConfig(&comm, 2, b->id, 1, &cfg);
    if (comm == NULL || (b->res = busy_wait(comm)) != ncclSuccess)
        return NULL;
    for (int i = 0; i < 20000 && !__atomic_load_n(&b->go, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    ncclAllReduce(&b->v, &b->v, 1, ncclInt32, ncclSum, comm, NULL);
    if ((b->res = busy_wait(comm)) == ncclSuccess) {
        ncclCommFinalize(comm);
        b->res = busy_wait(comm);
    }
    ncclCommDestroy(comm);
    return NULL;
}

/* ncclCommFinalize while a non-blocking all-reduce still waits for its peer: refused with
 * ncclInvalidArgument as NCCL does (its previous operation has not returned ncclSuccess); the
 * op still completes, and ncclCommDestroy right after waits for it and frees the comm. */
static void case_finalize_busy(void)
{
    struct busy_peer b = {.v = 2};
    EXPECT(ncclGetUniqueId(&b.id) == ncclSuccess, "unique id");
    pthread_t th;
    pthread_create(&th, NULL, busy_peer_run, &b);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&comm, 2, b.id, 0, &cfg);
    EXPECT(comm != NULL && busy_wait(comm) == ncclSuccess, "init %d", res);
    if (comm == NULL) {
        __atomic_store_n(&b.go, 1, __ATOMIC_RELEASE);
        pthread_join(th, NULL);
        return;
    }
    int v = 1;
    res = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL);
    EXPECT(res == ncclInProgress || res == ncclSuccess, "all-reduce %d", res);
    ncclResult_t state;
    ncclCommGetAsyncError(comm, &state);
    EXPECT(state == ncclInProgress, "the all-reduce waits for its peer: %d", state);
    res = ncclCommFinalize(comm);
    EXPECT(res == ncclInvalidArgument, "finalize with the all-reduce in flight %d", res);
    EXPECT(strstr(ncclGetLastError(comm), "ncclCommFinalize") != NULL, "message '%s'",
           ncclGetLastError(comm));
    __atomic_store_n(&b.go, 1, __ATOMIC_RELEASE);
    res = ncclCommDestroy(comm);
    EXPECT(res == ncclSuccess, "destroy right after %d", res);
    pthread_join(th, NULL);
    EXPECT(b.res == ncclSuccess, "peer %d", b.res);
    EXPECT(v == 3 && b.v == 3, "all-reduce gave %d and %d, want 3", v, b.v);
}

/* What the two processes of case_doorbell share. */
struct bell_shared {
    struct weft_doorbell bell;
    uint64_t posted __attribute__((aligned(64))); /* the poster's counter (its "slot") */
    uint64_t ready __attribute__((aligned(64)));  /* the sleeper began round n */
};

#define BELL_ROUNDS 20000
#define BELL_TIMEOUT_NS 1000000000ull
#define BELL_MAX_LOST 3

/* Pauses of the two sides before their store-then-load in round n: their difference sweeps a
 * range wider than a cache-line transfer, so that many rounds post while the sleeper announces
 * itself (a lost ring needs the poster's post still in its store buffer when the sleeper looks,
 * and the sleeper's announcement not yet visible when the poster looks). */
static uint64_t bell_delay(uint64_t n, int sleeper)
{
    uint64_t k = n % 32;
    return sleeper ? k : 31 - k;
}

static void bell_poster(struct bell_shared *sh)
{
    for (uint64_t n = 1; n <= BELL_ROUNDS; n++) {
        while (__atomic_load_n(&sh->ready, __ATOMIC_ACQUIRE) < n)
            ;
        for (uint64_t k = 0; k < bell_delay(n / 32, 0); k++)
            weft_cpu_relax();
        __atomic_store_n(&sh->posted, n, __ATOMIC_RELEASE);
        weft_doorbell_ring(&sh->bell);
    }
}

/* Runs the executor's sleep protocol against a poster process for BELL_ROUNDS posts; returns how
 * many sleeps ran to their timeout although the post was there (lost rings). */
static int bell_rounds(int light)
{
    struct bell_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        EXPECT(0, "mmap");
        return -1;
    }
    weft_doorbell_init(&sh->bell, WEFT_BELL_FUTEX, -1);
    if (!light)
        sh->bell.light = 0;
    pid_t pid = fork();
    if (pid == 0) {
        bell_poster(sh);
        _exit(0);
    }
    int lost = 0, deaf = 0;
    for (uint64_t n = 1; n <= BELL_ROUNDS && lost < BELL_MAX_LOST; n++) {
        __atomic_store_n(&sh->ready, n, __ATOMIC_RELEASE);
        for (uint64_t k = 0; k < bell_delay(n / 32, 1); k++)
            weft_cpu_relax();
        while (__atomic_load_n(&sh->posted, __ATOMIC_ACQUIRE) < n) {
            uint32_t seq = __atomic_load_n(&sh->bell.seq, __ATOMIC_ACQUIRE);
            deaf += weft_doorbell_enter(&sh->bell) != 0;
            if (__atomic_load_n(&sh->posted, __ATOMIC_ACQUIRE) < n) {
                double t0 = now_s();
                weft_futex_wait(&sh->bell.seq, seq, BELL_TIMEOUT_NS);
                if (now_s() - t0 > 0.9 && __atomic_load_n(&sh->posted, __ATOMIC_ACQUIRE) >= n)
                    lost++;
            }
            weft_doorbell_leave(&sh->bell);
        }
    }
    if (lost >= BELL_MAX_LOST)
        kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(lost >= BELL_MAX_LOST || (WIFEXITED(status) && WEXITSTATUS(status) == 0),
           "poster exited with %d", status);
    EXPECT(deaf == 0, "membarrier failed %d times", deaf);
    munmap(sh, sizeof(*sh));
    return lost;
}

static void case_doorbell(void)
{
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    int can = cmds > 0 && (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
              (cmds & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED);
    struct weft_doorbell probe;
    weft_doorbell_init(&probe, WEFT_BELL_FUTEX, -1);
    EXPECT((int)probe.light == can && weft_bell_registered == can,
           "light %u, registered %d, but the kernel %s expedited global membarrier", probe.light,
           weft_bell_registered, can ? "has" : "lacks");
    weft_doorbell_init(&probe, WEFT_BELL_EVENTFD, 3);
    EXPECT(probe.light == 0 && probe.kind == WEFT_BELL_EVENTFD && probe.efd == 3,
           "an eventfd doorbell is never light (its owner sleeps in epoll_wait)");
    printf("membarrier: %s\n", can ? "light rings" : "not available: fenced rings only");
    for (int light = can; light >= 0; light--) {
        double t0 = now_s();
        int lost = bell_rounds(light);
        printf("%s rings: %d rounds in %.2f s, %d lost\n", light ? "light" : "fenced", BELL_ROUNDS,
               now_s() - t0, lost);
        EXPECT(lost == 0, "%d of %d rings lost (%s)", lost, BELL_ROUNDS,
               light ? "light" : "fenced");
    }
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    if (strcmp(c, "fault-parse") == 0)
        case_fault_parse();
    else if (strcmp(c, "arena") == 0)
        case_arena();
    else if (strcmp(c, "ticket") == 0)
        case_ticket();
    else if (strcmp(c, "stream") == 0)
        case_stream();
    else if (strcmp(c, "keepalive") == 0)
        case_keepalive();
    else if (strcmp(c, "init-failed") == 0)
        case_init_failed();
    else if (strcmp(c, "finalize-busy") == 0)
        case_finalize_busy();
    else if (strcmp(c, "doorbell") == 0)
        case_doorbell();
    else {
        fprintf(stderr,
                "usage: test_robust fault-parse|arena|ticket|stream|keepalive|init-failed|\n"
                "finalize-busy|doorbell\n");
        return 2;
    }
    printf("%s: %d passed, %d failed\n", c, npass, nfail);
    return nfail != 0;
}
