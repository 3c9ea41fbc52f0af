/*
 * A communicator closed from one thread while another thread's call on it is starting or running
 * (issue 30 item 1: PyTorch's watchdog aborts while the main thread issues work). Ranks are
 * threads of this process, written against the public API only. For each delay in {0, 10, 100,
 * 1000} us after the caller threads announce their call, the main thread closes every
 * communicator; each caller must return (a deadline catches a hang; a crash kills the test), with
 * ncclSuccess and right results, or with an error. Each try builds fresh communicators. (A
 * device operation cut short by an abort leaves its stream without a CUDA error, as in NCCL: its
 * results are checked only where nothing could cut it short.)
 *
 * Usage: test_abort_race CASE [-d] [-k TRIES]
 *   abort     2 ranks: rank 0 calls all-reduce (rank 1 too on odd tries, else rank 0 waits for
 *             it until aborted); ncclCommAbort on both communicators
 *   revoke    as abort, with ncclCommRevoke (then ncclCommDestroy once the callers returned)
 *   destroy   1 rank: the call completes on its own; ncclCommDestroy waits for it or refuses it
 *   finalize  1 rank: ncclCommFinalize against the call, then ncclCommDestroy
 *   -d        device buffers on the emulated GPU (WEFT_CUDA=emu:1), kernels on a stream per rank
 *   -g        the call is a group: ncclGroupStart, the all-reduce, ncclGroupEnd (the group holds
 *             the communicator from the all-reduce to its end)
 *   -k        tries per delay (default 50: 200 in all)
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda_ops.h"
#include "nccl.h"

#define COUNT 1024

enum { CASE_ABORT, CASE_REVOKE, CASE_DESTROY, CASE_FINALIZE };

static int g_case, g_device, g_group, g_tries = 50;
static int g_pass, g_fail;
static const struct weft_cuda_ops *cu;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_pass++;                                                                              \
        } else if (g_fail++ < 20) {                                                                \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

struct caller {
    int rank;
    ncclComm_t comm;
    float *send, *recv;     /* what the call gets: host, or device memory */
    float *hsend, *hrecv;   /* host copies (device case) */
    weft_cuda_stream_t stream;
    int calls;              /* 1: takes part in this try */
    volatile int started;   /* about to call */
    volatile int returned;
    ncclResult_t res;       /* of the call */
    int sync_err;           /* device: the stream synchronize after it */
};

static void *caller_run(void *arg)
{
    struct caller *c = arg;
    if (g_device)
        cu->set_device(0);
    __atomic_store_n(&c->started, 1, __ATOMIC_SEQ_CST);
    if (g_group)
        ncclGroupStart();
    c->res = ncclAllReduce(c->send, c->recv, COUNT, ncclFloat, ncclSum, c->comm,
                           (cudaStream_t)c->stream);
    if (g_group) {
        ncclResult_t end = ncclGroupEnd();
        if (c->res == ncclSuccess)
            c->res = end;
    }
    if (g_device && c->res == ncclSuccess)
        c->sync_err = cu->stream_synchronize(c->stream);
    __atomic_store_n(&c->returned, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void sleep_us(long us)
{
    if (us == 0)
        return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits up to `sec` seconds for the caller to return; 1 when it did. */
static int caller_join(struct caller *c, pthread_t th, int sec)
{
    for (int i = 0; i < sec * 1000 && !__atomic_load_n(&c->returned, __ATOMIC_SEQ_CST); i++)
        sleep_us(1000);
    if (!__atomic_load_n(&c->returned, __ATOMIC_SEQ_CST))
        return 0;
    pthread_join(th, NULL);
    return 1;
}

static int buffers_alloc(struct caller *c)
{
    c->hsend = malloc(COUNT * sizeof(float));
    c->hrecv = malloc(COUNT * sizeof(float));
    if (c->hsend == NULL || c->hrecv == NULL)
        return -1;
    for (int i = 0; i < COUNT; i++) {
        c->hsend[i] = (float)(c->rank * 1000 + i % 97); /* sums exact in any order */
        c->hrecv[i] = -1.0f;
    }
    if (!g_device) {
        c->send = c->hsend;
        c->recv = c->hrecv;
        return 0;
    }
    if (cu->malloc((void **)&c->send, COUNT * sizeof(float)) != 0 ||
        cu->malloc((void **)&c->recv, COUNT * sizeof(float)) != 0 ||
        cu->stream_create(&c->stream) != 0 ||
        cu->memcpy_async(c->send, c->hsend, COUNT * sizeof(float), c->stream) != 0 ||
        cu->memcpy_async(c->recv, c->hrecv, COUNT * sizeof(float), c->stream) != 0 ||
        cu->stream_synchronize(c->stream) != 0)
        return -1;
    return 0;
}

static void buffers_free(struct caller *c)
{
    if (g_device) {
        cu->stream_synchronize(c->stream);
        cu->free(c->send);
        cu->free(c->recv);
        cu->stream_destroy(c->stream);
    }
    free(c->hsend);
    free(c->hrecv);
}

/* A call that says it succeeded left the sum of every caller's input in its output. */
static void check_result(struct caller *c, int nranks)
{
    if (g_device && cu->memcpy_async(c->hrecv, c->recv, COUNT * sizeof(float), c->stream) == 0)
        cu->stream_synchronize(c->stream);
    int wrong = 0, first = -1;
    for (int i = 0; i < COUNT; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += (float)(r * 1000 + i % 97);
        if (c->hrecv[i] != want && wrong++ == 0)
            first = i;
    }
    EXPECT(wrong == 0, "rank %d: %d wrong elements after success (first at %d: %g)", c->rank,
           wrong, first, first >= 0 ? c->hrecv[first] : 0.0);
}

static void close_comm(ncclComm_t comm)
{
    switch (g_case) {
    case CASE_ABORT:
        EXPECT(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort failed: %s",
               ncclGetLastError(NULL));
        break;
    case CASE_REVOKE:
        EXPECT(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) == ncclSuccess,
               "ncclCommRevoke failed: %s", ncclGetLastError(NULL));
        break;
    case CASE_DESTROY:
        EXPECT(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy failed: %s",
               ncclGetLastError(NULL));
        break;
    case CASE_FINALIZE: {
        ncclResult_t r = ncclCommFinalize(comm);
        EXPECT(r == ncclSuccess, "ncclCommFinalize failed (%d): %s", (int)r,
               ncclGetLastError(NULL));
        EXPECT(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy after finalize: %s",
               ncclGetLastError(NULL));
        break;
    }
    }
}

static void one_try(long delay_us, int try_no, int *outcomes)
{
    int nranks = g_case == CASE_ABORT || g_case == CASE_REVOKE ? 2 : 1;
    ncclComm_t comms[2];
    /* Device case: both ranks on the one emulated device (no list: rank i on i % devices). */
    if (ncclCommInitAll(comms, nranks, NULL) != ncclSuccess) {
        EXPECT(0, "ncclCommInitAll: %s", ncclGetLastError(NULL));
        return;
    }
    struct caller c[2];
    pthread_t th[2];
    memset(c, 0, sizeof(c));
    for (int r = 0; r < nranks; r++) {
        c[r].rank = r;
        c[r].comm = comms[r];
        c[r].calls = r == 0 || try_no % 2 == 1;
        if (buffers_alloc(&c[r]) != 0) {
            EXPECT(0, "buffers for rank %d", r);
            exit(1);
        }
    }
    for (int r = 0; r < nranks; r++)
        if (c[r].calls)
            pthread_create(&th[r], NULL, caller_run, &c[r]);
    for (int r = 0; r < nranks; r++)
        while (c[r].calls && !__atomic_load_n(&c[r].started, __ATOMIC_SEQ_CST))
            sched_yield();
    sleep_us(delay_us);
    for (int r = 0; r < nranks; r++)
        close_comm(comms[r]);
    for (int r = 0; r < nranks; r++) {
        if (!c[r].calls)
            continue;
        if (!caller_join(&c[r], th[r], 30)) {
            printf("FAIL: rank %d's call did not return within 30 s of the %s (delay %ld us)\n",
                   r, g_case == CASE_ABORT ? "abort" : "close", delay_us);
            fflush(stdout);
            _exit(1);
        }
        outcomes[c[r].res == ncclSuccess]++;
        if (c[r].res == ncclSuccess && c[r].sync_err == 0 && g_case != CASE_ABORT &&
            g_case != CASE_REVOKE)
            check_result(&c[r], nranks);
        else if (c[r].res == ncclSuccess && c[r].sync_err == 0 && c[0].calls && c[1].calls &&
                 nranks == 2 && !g_device)
            check_result(&c[r], nranks); /* both ranks called: a success is a full sum */
        else
            g_pass++;
    }
    if (g_case == CASE_REVOKE)
        for (int r = 0; r < nranks; r++)
            EXPECT(ncclCommDestroy(comms[r]) == ncclSuccess, "destroy after revoke: %s",
                   ncclGetLastError(NULL));
    for (int r = 0; r < nranks; r++)
        buffers_free(&c[r]);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_abort_race abort|revoke|destroy|finalize [-d] [-g] [-k TRIES]\n");
        return 2;
    }
    const char *names[] = {"abort", "revoke", "destroy", "finalize"};
    g_case = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(argv[1], names[i]) == 0)
            g_case = i;
    if (g_case < 0) {
        fprintf(stderr, "unknown case %s\n", argv[1]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-d") == 0)
            g_device = 1;
        else if (strcmp(argv[i], "-g") == 0)
            g_group = 1;
        else if (strcmp(argv[i], "-k") == 0 && i + 1 < argc)
            g_tries = atoi(argv[++i]);
    }
    if (g_device) {
        cu = weft_cuda();
        int n = 0;
        if (cu == NULL || cu->get_device_count(&n) != 0 || n < 1) {
            printf("SKIP: no (emulated) device: set WEFT_CUDA=emu:1\n");
            return 77;
        }
    }
    static const long delays[] = {0, 10, 100, 1000};
    for (int d = 0; d < 4; d++) {
        int outcomes[2] = {0, 0}; /* [0] errors, [1] successes */
        for (int t = 0; t < g_tries; t++)
            one_try(delays[d], t, outcomes);
        printf("%s%s%s delay %4ld us: %d tries, calls returned %d errors, %d successes\n",
               names[g_case], g_device ? " (device)" : "", g_group ? " (group)" : "", delays[d], g_tries, outcomes[0],
               outcomes[1]);
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
}
