/*
 * gpu_check CASE [-n NRANKS]: small checks of tests/gpu/run.sh that need only the public API
 * (nccl.h and weft.h's device runtime), so the binary links libnccl.so.2 and stays small in the
 * build carried to the GPU machine. Runs on a real GPU and on the emulated one (WEFT_CUDA=emu:1).
 *
 *   version          the library's version, without touching CUDA: the carried build loads
 *   probe            the backend Weft chose, the device count and one 1-rank all-reduce on device
 *                    memory, checked; with NCCL_DEBUG=INFO the library's init lines (backend,
 *                    driver and runtime versions) come with it. --want cuda: fail unless the
 *                    backend is the real GPU (a carried build that falls back to "none" on an
 *                    old driver is a failure there, not a skip).
 *   graph-watchdog   NRANKS (default 2) ranks as threads of this process (rank r on device r % the
 *                    device count: all on the GPU machine's one GPU); a watchdog
 *                    thread polls ncclCommGetAsyncError on every communicator all the time, as
 *                    PyTorch's does, while each rank's stream captures (global mode) 10
 *                    all-reduces (sum and max in turn) into a graph. The capture must survive
 *                    the polling (CUDA invalidates a global-mode capture on a stream query from
 *                    any thread: issue 29 item 1); the watchdog polls after each captured
 *                    all-reduce (the main thread waits for a round of it), and 20 replays, each
 *                    with new inputs and one uncaptured all-reduce between them, are checked
 *                    element by element.
 *
 * Exit 0 pass, 1 fail, 2 usage, 77 no device (with a SKIP line).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl.h"
#include "weft.h"

#define MAXR 8
#define NOPS 10
#define NREPS 20
#define COUNT 4099 /* floats: not a multiple of a slot, several LL lines */

static int g_n = 2;
static ncclComm_t g_comms[MAXR];
static cudaStream_t g_streams[MAXR];
static int g_devs[MAXR];

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_ != 0) {                                                                             \
            printf("FAIL %s: %s (%d)\n", #call, weftCudaGetErrorString(e_), e_);                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define NCCL_OK(call)                                                                              \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            printf("FAIL %s: %s: %s\n", #call, ncclGetErrorString(r_), ncclGetLastError(NULL));    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank r's input at replay rep: small integers, so sums and maxima are exact. */
static float input(int r, int rep, int i)
{
    return (float)((r + 1) * (rep + 1) + i % 5);
}

static float expected(int op, int rep, int i)
{
    float want = 0;
    for (int r = 0; r < g_n; r++) {
        float v = input(r, rep, i);
        want = op == 0 ? want + v : (r == 0 || v > want ? v : want);
    }
    return want;
}

static int probe(const char *want)
{
    int ndev = 0, e = weftCudaGetDeviceCount(&ndev), v = 0;
    const char *be = weftCudaBackend();
    ncclGetVersion(&v);
    printf("probe: Weft (ncclGetVersion %d), backend %s, %d device(s) (error %d)\n", v, be, ndev,
           e);
    if (want != NULL && strcmp(be, want) != 0) {
        printf("FAIL: backend %s, wanted %s (no driver, a driver older than the static runtime "
               "needs, or no device: see the WARN lines above)\n",
               be, want);
        return 1;
    }
    if (e != 0 || ndev < 1) {
        printf("SKIP: no device (backend %s)\n", be);
        return 77;
    }
    ncclComm_t comm;
    int dev0 = 0;
    float *d, h[COUNT];
    cudaStream_t s;
    CUDA_OK(weftCudaSetDevice(0));
    NCCL_OK(ncclCommInitAll(&comm, 1, &dev0));
    CUDA_OK(weftCudaStreamCreate(&s));
    CUDA_OK(weftCudaMalloc((void **)&d, sizeof(h)));
    for (int i = 0; i < COUNT; i++)
        h[i] = input(0, 0, i);
    CUDA_OK(weftCudaMemcpy(d, h, sizeof(h)));
    NCCL_OK(ncclAllReduce(d, d, COUNT, ncclFloat32, ncclSum, comm, s));
    CUDA_OK(weftCudaStreamSynchronize(s));
    CUDA_OK(weftCudaMemcpy(h, d, sizeof(h)));
    int bad = 0;
    for (int i = 0; i < COUNT; i++)
        bad += h[i] != input(0, 0, i);
    CUDA_OK(weftCudaFree(d));
    CUDA_OK(weftCudaStreamDestroy(s));
    NCCL_OK(ncclCommDestroy(comm));
    printf("probe: 1-rank all-reduce of %d floats on device 0: %s\n", COUNT, bad ? "WRONG" : "ok");
    return bad != 0;
}

/* ---- graph-watchdog ---------------------------------------------------------------------- */

static atomic_int g_stop, g_capturing;
static atomic_long g_polls, g_polls_in_capture, g_async_bad;

/* The watchdog: ncclCommGetAsyncError on every communicator, every 50 us (it sleeps, so it
 * never starves the ranks), as PyTorch's ProcessGroupNCCL watchdog does from its own thread. */
static void *watchdog(void *arg)
{
    (void)arg;
    struct timespec pause = {0, 50000};
    while (!atomic_load(&g_stop)) {
        for (int r = 0; r < g_n; r++) {
            ncclResult_t a = ncclInProgress;
            ncclResult_t res = ncclCommGetAsyncError(g_comms[r], &a);
            if (res != ncclSuccess || (a != ncclSuccess && a != ncclInProgress)) {
                if (atomic_fetch_add(&g_async_bad, 1) < 3)
                    printf("FAIL watchdog: rank %d ncclCommGetAsyncError %s, async %s: %s\n", r,
                           ncclGetErrorString(res), ncclGetErrorString(a),
                           ncclGetLastError(g_comms[r]));
            }
            atomic_fetch_add(&g_polls, 1);
            if (atomic_load(&g_capturing))
                atomic_fetch_add(&g_polls_in_capture, 1);
        }
        nanosleep(&pause, NULL);
    }
    return NULL;
}

/* Fills every rank's send buffer with its inputs of replay rep (uncaptured copies). */
static int fill(float **send, float *h, int rep)
{
    for (int r = 0; r < g_n; r++) {
        CUDA_OK(weftCudaSetDevice(g_devs[r]));
        for (int i = 0; i < COUNT; i++)
            h[i] = input(r, rep, i);
        CUDA_OK(weftCudaMemcpyAsync(send[r], h, COUNT * sizeof(float), g_streams[r]));
        CUDA_OK(weftCudaStreamSynchronize(g_streams[r]));
    }
    return 0;
}

/* Compares rank r's buffer with op's result of replay rep; prints the first difference. */
static int check(const float *dev, float *h, int op, int rep, int r, const char *what)
{
    CUDA_OK(weftCudaMemcpy(h, dev, COUNT * sizeof(float)));
    for (int i = 0; i < COUNT; i++)
        if (h[i] != expected(op, rep, i)) {
            printf("FAIL %s: replay %d rank %d index %d: got %g want %g\n", what, rep, r, i,
                   (double)h[i], (double)expected(op, rep, i));
            return 1;
        }
    return 0;
}

static int graph_watchdog(void)
{
    int fail = 0, ndev = 0;
    if (weftCudaGetDeviceCount(&ndev) != 0 || ndev < 1) {
        printf("SKIP: no device (backend %s)\n", weftCudaBackend());
        return 77;
    }
    float *send[MAXR], *recv[MAXR][NOPS], *extra[MAXR], *h = malloc(COUNT * sizeof(float));
    weftCudaGraph_t graph[MAXR];
    pthread_t wd;
    if (h == NULL)
        return 1;
    /* NULL: rank r on device r % count, so all on the one GPU of the GPU machine (a devlist may
     * not name a device twice) */
    NCCL_OK(ncclCommInitAll(g_comms, g_n, NULL));
    for (int r = 0; r < g_n; r++) {
        NCCL_OK(ncclCommCuDevice(g_comms[r], &g_devs[r]));
        CUDA_OK(weftCudaSetDevice(g_devs[r]));
        CUDA_OK(weftCudaStreamCreate(&g_streams[r]));
        CUDA_OK(weftCudaMalloc((void **)&send[r], COUNT * sizeof(float)));
        CUDA_OK(weftCudaMalloc((void **)&extra[r], COUNT * sizeof(float)));
        for (int k = 0; k < NOPS; k++)
            CUDA_OK(weftCudaMalloc((void **)&recv[r][k], COUNT * sizeof(float)));
    }
    if (fill(send, h, 0) != 0)
        return 1;
    /* One uncaptured all-reduce first: the communicators' setup is done before the capture. */
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < g_n; r++)
        NCCL_OK(ncclAllReduce(send[r], extra[r], COUNT, ncclFloat32, ncclSum, g_comms[r],
                              g_streams[r]));
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < g_n; r++)
        CUDA_OK(weftCudaStreamSynchronize(g_streams[r]));
    if (pthread_create(&wd, NULL, watchdog, NULL) != 0) {
        printf("FAIL pthread_create\n");
        return 1;
    }
    for (int r = 0; r < g_n; r++) {
        CUDA_OK(weftCudaSetDevice(g_devs[r]));
        CUDA_OK(weftCudaStreamBeginCapture(g_streams[r]));
    }
    atomic_store(&g_capturing, 1);
    for (int k = 0; k < NOPS; k++) {
        ncclResult_t res = ncclGroupStart();
        for (int r = 0; r < g_n && res == ncclSuccess; r++)
            res = ncclAllReduce(send[r], recv[r][k], COUNT, ncclFloat32, k % 2 ? ncclMax : ncclSum,
                                g_comms[r], g_streams[r]);
        ncclResult_t end = ncclGroupEnd();
        if (res != ncclSuccess || end != ncclSuccess) {
            printf("FAIL all-reduce %d under capture: %s: %s\n", k,
                   ncclGetErrorString(res != ncclSuccess ? res : end), ncclGetLastError(NULL));
            fail = 1;
            break;
        }
        /* A full round of the watchdog after each operation (up to 5 s for it to run), so it
         * polls every time while the communicators' streams are joined to the capture, not
         * only when the timing happens to let it. */
        long before = atomic_load(&g_polls);
        for (double t0 = now_s(); atomic_load(&g_polls) - before < 2 * g_n && now_s() - t0 < 5;) {
            struct timespec ms = {0, 200000};
            nanosleep(&ms, NULL);
        }
    }
    for (int r = 0; r < g_n; r++) {
        CUDA_OK(weftCudaSetDevice(g_devs[r]));
        int e = weftCudaStreamEndCapture(g_streams[r], &graph[r]);
        if (e != 0) {
            printf("FAIL rank %d: end of capture: %s (%d)%s\n", r, weftCudaGetErrorString(e), e,
                   e == 901 || e == 900 ? ": the capture was invalidated while the watchdog "
                                          "polled ncclCommGetAsyncError (issue 29 item 1)"
                                        : "");
            fail = 1;
            graph[r] = NULL;
        }
    }
    atomic_store(&g_capturing, 0);
    long in_capture = atomic_load(&g_polls_in_capture);
    if (in_capture < g_n) {
        printf("FAIL the watchdog polled %ld times while the capture was open: not tested\n",
               in_capture);
        fail = 1;
    }
    int replays = 0;
    for (int rep = 1; rep <= NREPS && !fail; rep++, replays++) {
        if (fill(send, h, rep) != 0)
            return 1;
        for (int r = 0; r < g_n; r++) {
            CUDA_OK(weftCudaSetDevice(g_devs[r]));
            CUDA_OK(weftCudaGraphLaunch(graph[r], g_streams[r]));
        }
        /* an uncaptured all-reduce between replays, on the same streams */
        NCCL_OK(ncclGroupStart());
        for (int r = 0; r < g_n; r++)
            NCCL_OK(ncclAllReduce(send[r], extra[r], COUNT, ncclFloat32, ncclSum, g_comms[r],
                                  g_streams[r]));
        NCCL_OK(ncclGroupEnd());
        for (int r = 0; r < g_n; r++) {
            CUDA_OK(weftCudaSetDevice(g_devs[r]));
            CUDA_OK(weftCudaStreamSynchronize(g_streams[r]));
            for (int k = 0; k < NOPS && !fail; k++)
                fail |= check(recv[r][k], h, k % 2, rep, r, "graph replay");
            fail |= !fail && check(extra[r], h, 0, rep, r, "uncaptured all-reduce");
        }
    }
    atomic_store(&g_stop, 1);
    pthread_join(wd, NULL);
    if (atomic_load(&g_async_bad) > 0)
        fail = 1;
    for (int r = 0; r < g_n; r++) {
        CUDA_OK(weftCudaSetDevice(g_devs[r]));
        if (graph[r] != NULL)
            CUDA_OK(weftCudaGraphDestroy(graph[r]));
        NCCL_OK(ncclCommDestroy(g_comms[r]));
        CUDA_OK(weftCudaFree(send[r]));
        CUDA_OK(weftCudaFree(extra[r]));
        for (int k = 0; k < NOPS; k++)
            CUDA_OK(weftCudaFree(recv[r][k]));
        CUDA_OK(weftCudaStreamDestroy(g_streams[r]));
    }
    free(h);
    printf("graph-watchdog: %d ranks, backend %s, %d all-reduces captured, %d replays checked, "
           "%ld watchdog polls (%ld during the capture): %s\n",
           g_n, weftCudaBackend(), NOPS, replays, atomic_load(&g_polls), in_capture,
           fail ? "FAIL" : "ok");
    return fail;
}

int main(int argc, char **argv)
{
    const char *want = NULL;
    if (argc < 2)
        goto usage;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            g_n = atoi(argv[++i]);
        else if (strcmp(argv[i], "--want") == 0 && i + 1 < argc)
            want = argv[++i];
        else
            goto usage;
    }
    if (g_n < 1 || g_n > MAXR)
        goto usage;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strcmp(argv[1], "version") == 0) {
        int v = 0;
        ncclGetVersion(&v);
        printf("gpu_check: libnccl.so.2 of Weft, ncclGetVersion %d\n", v);
        return v > 0 ? 0 : 1;
    }
    if (strcmp(argv[1], "probe") == 0)
        return probe(want);
    if (strcmp(argv[1], "graph-watchdog") == 0)
        return graph_watchdog();
usage:
    fprintf(stderr, "usage: %s version | probe [--want cuda] | graph-watchdog [-n NRANKS]\n",
            argv[0]);
    return 2;
}
