/*
 * ABI client: a program built like any NCCL user, against the CUDA toolkit's own nccl.h and
 * linked to the toolkit's libnccl.so.2, then run with LD_LIBRARY_PATH pointing at Weft's build
 * directory so that Weft's libnccl.so.2 is loaded in its place. Everything uses host buffers and
 * the NULL stream; the program never calls CUDA.
 *
 * Checks: version, error strings, unique id, 1-rank init, config init, ncclCommInitAll with several
 * ranks driven from one thread in a group, threads each calling ncclCommInitRankConfig, every
 * collective compared element by element with a plain loop, and argument errors.
 *
 * Env: WEFT_ABI_EXPECT_DIR, when set, is the directory the loaded libnccl.so.2 must come from (so
 * the test cannot pass by loading NVIDIA's library through the loader cache).
 * Exit: 0 all passed, 1 a failure, 77 toolkit header absent at build time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The build passes the toolkit header's path as ABI_NCCL_H, so that no include path set for the
 * rest of the project (Weft's include/ has an nccl.h too) can take its place. */
#if defined(ABI_NCCL_H)
#define ABI_HAVE_TOOLKIT 1
#elif defined(__has_include)
#if __has_include(<cuda_runtime.h>) && __has_include(<nccl.h>)
#define ABI_HAVE_TOOLKIT 1
#endif
#endif

#ifndef ABI_HAVE_TOOLKIT

int main(void)
{
    printf("SKIP: the CUDA toolkit's cuda_runtime.h/nccl.h were not found at build time\n");
    return 77;
}

#else

#include <cuda_runtime.h>
#if defined(ABI_NCCL_H)
#include ABI_NCCL_H
#else
#include <nccl.h>
#endif

#ifdef WEFT_NCCL_HEADER
#error "abi_client must be compiled against the CUDA toolkit's nccl.h, not Weft's"
#endif

#define NRANKS_ALL 4     /* ranks of the ncclCommInitAll test */
#define NRANKS_THREADS 3 /* ranks of the threaded ncclCommInitRankConfig test */
#define TIMEOUT_S 120

static int n_pass;
static int n_fail;

static void check(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void check(int ok, const char *name, const char *fmt, ...)
{
    if (ok) {
        n_pass++;
        printf("PASS: %s\n", name);
    } else {
        va_list ap;
        n_fail++;
        printf("FAIL: %s: ", name);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
    }
    fflush(stdout);
}

/* Checks a call's status and prints the library's own text for a failure. */
static int check_res(ncclResult_t got, ncclResult_t want, const char *name)
{
    check(got == want, name, "returned %d (%s), expected %d; last error \"%s\"", (int)got,
          ncclGetErrorString(got), (int)want, ncclGetLastError(NULL));
    return got == want;
}

#include "abi_util.h"

static void on_alarm(int sig)
{
    static const char msg[] = "FAIL: timeout: the test did not finish in time\n";
    (void)sig;
    if (write(STDOUT_FILENO, msg, sizeof(msg) - 1) < 0) {
        /* nothing more to do */
    }
    _exit(1);
}

/* ---- Data patterns and reference results ---------------------------------------------------- */

/* Small integers, so float sums are exact in any order. */
static float val_f32(int rank, size_t i)
{
    return (float)((rank + 1) * (int)(i % 13) - 3 * rank);
}

static int32_t val_i32(int rank, size_t i)
{
    return (int32_t)((rank + 1) * (int32_t)(i % 1000) - 500 + 7 * rank);
}

static int32_t reduce_i32(int32_t a, int32_t b, ncclRedOp_t op)
{
    switch (op) {
    case ncclSum:
        return a + b;
    case ncclProd:
        return a * b;
    case ncclMax:
        return a > b ? a : b;
    case ncclMin:
        return a < b ? a : b;
    default:
        return 0;
    }
}

static void fill_f32(float *p, size_t n, int rank, size_t base)
{
    for (size_t i = 0; i < n; i++)
        p[i] = val_f32(rank, base + i);
}

static void fill_i32(int32_t *p, size_t n, int rank, size_t base)
{
    for (size_t i = 0; i < n; i++)
        p[i] = val_i32(rank, base + i);
}

/* Returns the index of the first mismatch, or -1. */
static long cmp_f32(const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

static long cmp_i32(const int32_t *got, const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    return p;
}

/* ---- Collectives over a set of communicators ------------------------------------------------
 * run_* issue one collective on each of the n communicators inside one group (ranks are comms of
 * this process), then compare every rank's output with a plain loop. With n == 1 the group is a
 * harmless nesting.
 */

struct comm_set {
    int n;
    ncclComm_t comm[NRANKS_ALL > NRANKS_THREADS ? NRANKS_ALL : NRANKS_THREADS];
};

static void run_allreduce_f32(const struct comm_set *cs, size_t count, int in_place,
                              const char *tag)
{
    float *send[NRANKS_ALL], *recv[NRANKS_ALL];
    float *want = xcalloc(count, sizeof(float));
    ncclResult_t res = ncclSuccess;
    char name[160];
    long bad = -1;
    int bad_rank = -1;

    snprintf(name, sizeof(name), "%s allreduce float32 sum count %zu%s", tag, count,
             in_place ? " in-place" : "");
    for (int r = 0; r < cs->n; r++) {
        send[r] = xcalloc(count, sizeof(float));
        recv[r] = in_place ? send[r] : xcalloc(count, sizeof(float));
        fill_f32(send[r], count, r, 0);
        if (!in_place)
            memset(recv[r], 0xff, count * sizeof(float));
    }
    for (size_t i = 0; i < count; i++) {
        want[i] = 0.0f;
        for (int r = 0; r < cs->n; r++)
            want[i] += val_f32(r, i);
    }
    ncclGroupStart();
    for (int r = 0; r < cs->n && res == ncclSuccess; r++)
        res = ncclAllReduce(send[r], recv[r], count, ncclFloat32, ncclSum, cs->comm[r], NULL);
    if (res == ncclSuccess)
        res = ncclGroupEnd();
    else
        ncclGroupEnd();
    if (res == ncclSuccess) {
        for (int r = 0; r < cs->n && bad < 0; r++) {
            bad = cmp_f32(recv[r], want, count);
            bad_rank = r;
        }
        check(bad < 0, name, "rank %d element %ld: got %g, expected %g", bad_rank, bad,
              bad >= 0 ? (double)recv[bad_rank][bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0);
    } else {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
    }
    for (int r = 0; r < cs->n; r++) {
        if (!in_place)
            free(recv[r]);
        free(send[r]);
    }
    free(want);
}

static void run_allreduce_i32(const struct comm_set *cs, size_t count, ncclRedOp_t op,
                              const char *opname, const char *tag)
{
    int32_t *send[NRANKS_ALL], *recv[NRANKS_ALL];
    int32_t *want = xcalloc(count, sizeof(int32_t));
    ncclResult_t res = ncclSuccess;
    char name[160];
    long bad = -1;
    int bad_rank = -1;

    snprintf(name, sizeof(name), "%s allreduce int32 %s count %zu", tag, opname, count);
    for (int r = 0; r < cs->n; r++) {
        send[r] = xcalloc(count, sizeof(int32_t));
        recv[r] = xcalloc(count, sizeof(int32_t));
        fill_i32(send[r], count, r, 0);
    }
    for (size_t i = 0; i < count; i++) {
        want[i] = val_i32(0, i);
        for (int r = 1; r < cs->n; r++)
            want[i] = reduce_i32(want[i], val_i32(r, i), op);
    }
    ncclGroupStart();
    for (int r = 0; r < cs->n && res == ncclSuccess; r++)
        res = ncclAllReduce(send[r], recv[r], count, ncclInt32, op, cs->comm[r], NULL);
    if (res == ncclSuccess)
        res = ncclGroupEnd();
    else
        ncclGroupEnd();
    if (res == ncclSuccess) {
        for (int r = 0; r < cs->n && bad < 0; r++) {
            bad = cmp_i32(recv[r], want, count);
            bad_rank = r;
        }
        check(bad < 0, name, "rank %d element %ld: got %d, expected %d", bad_rank, bad,
              bad >= 0 ? recv[bad_rank][bad] : 0, bad >= 0 ? want[bad] : 0);
    } else {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
    }
    for (int r = 0; r < cs->n; r++) {
        free(recv[r]);
        free(send[r]);
    }
    free(want);
}

static void run_broadcast(const struct comm_set *cs, size_t count, int root, const char *tag)
{
    float *send[NRANKS_ALL], *recv[NRANKS_ALL];
    float *want = xcalloc(count, sizeof(float));
    ncclResult_t res = ncclSuccess;
    char name[160];
    long bad = -1;
    int bad_rank = -1;

    snprintf(name, sizeof(name), "%s broadcast float32 root %d count %zu", tag, root, count);
    for (int r = 0; r < cs->n; r++) {
        send[r] = xcalloc(count, sizeof(float));
        recv[r] = xcalloc(count, sizeof(float));
        fill_f32(send[r], count, r, 0);
    }
    fill_f32(want, count, root, 0);
    ncclGroupStart();
    for (int r = 0; r < cs->n && res == ncclSuccess; r++)
        res = ncclBroadcast(send[r], recv[r], count, ncclFloat32, root, cs->comm[r], NULL);
    if (res == ncclSuccess)
        res = ncclGroupEnd();
    else
        ncclGroupEnd();
    if (res == ncclSuccess) {
        for (int r = 0; r < cs->n && bad < 0; r++) {
            bad = cmp_f32(recv[r], want, count);
            bad_rank = r;
        }
        check(bad < 0, name, "rank %d element %ld: got %g, expected %g", bad_rank, bad,
              bad >= 0 ? (double)recv[bad_rank][bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0);
    } else {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
    }
    for (int r = 0; r < cs->n; r++) {
        free(recv[r]);
        free(send[r]);
    }
    free(want);
}

static void run_reduce(const struct comm_set *cs, size_t count, int root, const char *tag)
{
    int32_t *send[NRANKS_ALL], *recv[NRANKS_ALL];
    int32_t *want = xcalloc(count, sizeof(int32_t));
    ncclResult_t res = ncclSuccess;
    char name[160];
    long bad;

    snprintf(name, sizeof(name), "%s reduce int32 sum root %d count %zu", tag, root, count);
    for (int r = 0; r < cs->n; r++) {
        send[r] = xcalloc(count, sizeof(int32_t));
        recv[r] = xcalloc(count, sizeof(int32_t));
        fill_i32(send[r], count, r, 0);
    }
    for (size_t i = 0; i < count; i++) {
        want[i] = 0;
        for (int r = 0; r < cs->n; r++)
            want[i] += val_i32(r, i);
    }
    ncclGroupStart();
    for (int r = 0; r < cs->n && res == ncclSuccess; r++)
        res = ncclReduce(send[r], recv[r], count, ncclInt32, ncclSum, root, cs->comm[r], NULL);
    if (res == ncclSuccess)
        res = ncclGroupEnd();
    else
        ncclGroupEnd();
    if (res == ncclSuccess) {
        bad = cmp_i32(recv[root], want, count);
        check(bad < 0, name, "root element %ld: got %d, expected %d", bad,
              bad >= 0 ? recv[root][bad] : 0, bad >= 0 ? want[bad] : 0);
    } else {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
    }
    for (int r = 0; r < cs->n; r++) {
        free(recv[r]);
        free(send[r]);
    }
    free(want);
}

static void run_allgather(const struct comm_set *cs, size_t count, const char *tag)
{
    size_t total = count * (size_t)cs->n;
    float *send[NRANKS_ALL], *recv[NRANKS_ALL];
    float *want = xcalloc(total, sizeof(float));
    ncclResult_t res = ncclSuccess;
    char name[160];
    long bad = -1;
    int bad_rank = -1;

    snprintf(name, sizeof(name), "%s allgather float32 sendcount %zu", tag, count);
    for (int r = 0; r < cs->n; r++) {
        send[r] = xcalloc(count, sizeof(float));
        recv[r] = xcalloc(total, sizeof(float));
        fill_f32(send[r], count, r, 0);
        fill_f32(want + (size_t)r * count, count, r, 0);
    }
    ncclGroupStart();
    for (int r = 0; r < cs->n && res == ncclSuccess; r++)
        res = ncclAllGather(send[r], recv[r], count, ncclFloat32, cs->comm[r], NULL);
    if (res == ncclSuccess)
        res = ncclGroupEnd();
    else
        ncclGroupEnd();
    if (res == ncclSuccess) {
        for (int r = 0; r < cs->n && bad < 0; r++) {
            bad = cmp_f32(recv[r], want, total);
            bad_rank = r;
        }
        check(bad < 0, name, "rank %d element %ld: got %g, expected %g", bad_rank, bad,
              bad >= 0 ? (double)recv[bad_rank][bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0);
    } else {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
    }
    for (int r = 0; r < cs->n; r++) {
        free(recv[r]);
        free(send[r]);
    }
    free(want);
}

static void run_reducescatter(const struct comm_set *cs, size_t count, const char *tag)
{
    size_t total = count * (size_t)cs->n;
    float *send[NRANKS_ALL], *recv[NRANKS_ALL];
    float *want = xcalloc(total, sizeof(float));
    ncclResult_t res = ncclSuccess;
    char name[160];
    long bad = -1;
    int bad_rank = -1;

    snprintf(name, sizeof(name), "%s reducescatter float32 sum recvcount %zu", tag, count);
    for (int r = 0; r < cs->n; r++) {
        send[r] = xcalloc(total, sizeof(float));
        recv[r] = xcalloc(count, sizeof(float));
        fill_f32(send[r], total, r, 0);
    }
    for (size_t i = 0; i < total; i++) {
        want[i] = 0.0f;
        for (int r = 0; r < cs->n; r++)
            want[i] += val_f32(r, i);
    }
    ncclGroupStart();
    for (int r = 0; r < cs->n && res == ncclSuccess; r++)
        res = ncclReduceScatter(send[r], recv[r], count, ncclFloat32, ncclSum, cs->comm[r], NULL);
    if (res == ncclSuccess)
        res = ncclGroupEnd();
    else
        ncclGroupEnd();
    if (res == ncclSuccess) {
        for (int r = 0; r < cs->n && bad < 0; r++) {
            bad = cmp_f32(recv[r], want + (size_t)r * count, count);
            bad_rank = r;
        }
        check(bad < 0, name, "rank %d element %ld: got %g, expected %g", bad_rank, bad,
              bad >= 0 ? (double)recv[bad_rank][bad] : 0.0,
              bad >= 0 ? (double)want[(size_t)bad_rank * count + (size_t)bad] : 0.0);
    } else {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
    }
    for (int r = 0; r < cs->n; r++) {
        free(recv[r]);
        free(send[r]);
    }
    free(want);
}

static const size_t counts[] = {1, 7, 1023, 65536 + 3};
#define N_COUNTS (sizeof(counts) / sizeof(counts[0]))

static void run_all_collectives(const struct comm_set *cs, const char *tag)
{
    for (size_t c = 0; c < N_COUNTS; c++) {
        size_t n = counts[c];
        run_allreduce_f32(cs, n, 0, tag);
        run_allreduce_f32(cs, n, 1, tag);
        run_allreduce_i32(cs, n, ncclSum, "sum", tag);
        run_broadcast(cs, n, cs->n - 1, tag);
        run_reduce(cs, n, cs->n > 1 ? 1 : 0, tag);
        run_allgather(cs, n, tag);
        run_reducescatter(cs, n, tag);
    }
    run_allreduce_i32(cs, 1023, ncclMax, "max", tag);
    run_allreduce_i32(cs, 1023, ncclMin, "min", tag);
    run_allreduce_i32(cs, 1023, ncclProd, "prod", tag);
}

static void check_comm_queries(const struct comm_set *cs, const char *tag)
{
    char name[160];

    for (int r = 0; r < cs->n; r++) {
        int count = -1, rank = -1;
        ncclResult_t async = ncclInternalError;
        ncclResult_t r1 = ncclCommCount(cs->comm[r], &count);
        ncclResult_t r2 = ncclCommUserRank(cs->comm[r], &rank);
        ncclResult_t r3 = ncclCommGetAsyncError(cs->comm[r], &async);

        snprintf(name, sizeof(name), "%s rank %d count/userrank/asyncerror", tag, r);
        check(r1 == ncclSuccess && r2 == ncclSuccess && r3 == ncclSuccess && count == cs->n &&
                  rank == r && async == ncclSuccess,
              name, "results %d %d %d, count %d (want %d), rank %d (want %d), async %d", (int)r1,
              (int)r2, (int)r3, count, cs->n, rank, r, (int)async);
    }
}

static void destroy_all(struct comm_set *cs, const char *tag)
{
    char name[160];
    ncclResult_t res = ncclSuccess;

    for (int r = 0; r < cs->n; r++) {
        ncclResult_t one = ncclCommDestroy(cs->comm[r]);
        if (one != ncclSuccess && res == ncclSuccess)
            res = one;
        cs->comm[r] = NULL;
    }
    snprintf(name, sizeof(name), "%s ncclCommDestroy", tag);
    check_res(res, ncclSuccess, name);
}

static void test_version(void)
{
    int version = -1;
    ncclResult_t res = ncclGetVersion(&version);

    check(res == ncclSuccess && version == 22809 && version == NCCL_VERSION_CODE,
          "ncclGetVersion == 22809", "result %d, version %d", (int)res, version);
}

static void test_error_strings(void)
{
    static const struct {
        int code;
        const char *text;
    } want[] = {
        {0, "no error"},
        {1, "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"},
        {2, "unhandled system error (run with NCCL_DEBUG=INFO for details)"},
        {3, "internal error - please report this issue to the NCCL developers"},
        {4, "invalid argument (run with NCCL_DEBUG=WARN for details)"},
        {5, "invalid usage (run with NCCL_DEBUG=WARN for details)"},
        {6, "remote process exited or there was a network error"},
        {7, "NCCL operation in progress"},
        {8, "unknown result code"},
        {1000, "unknown result code"},
    };
    char name[96];

    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *got = ncclGetErrorString((ncclResult_t)want[i].code);
        snprintf(name, sizeof(name), "ncclGetErrorString(%d)", want[i].code);
        check(got != NULL && strcmp(got, want[i].text) == 0, name, "got \"%s\", expected \"%s\"",
              got ? got : "(null)", want[i].text);
    }
}

static void test_unique_id(ncclUniqueId *id)
{
    int nonzero = 0;

    memset(id, 0, sizeof(*id));
    if (!check_res(ncclGetUniqueId(id), ncclSuccess, "ncclGetUniqueId"))
        return;
    for (size_t i = 0; i < sizeof(id->internal); i++)
        nonzero |= id->internal[i] != 0;
    check(nonzero, "ncclGetUniqueId fills the id", "all 128 bytes are zero");
}

static void test_single_rank(void)
{
    struct comm_set cs = {.n = 1};
    ncclUniqueId id;

    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "1-rank ncclGetUniqueId"))
        return;
    if (!check_res(ncclCommInitRank(&cs.comm[0], 1, id, 0), ncclSuccess,
                   "1-rank ncclCommInitRank"))
        return;
    check_comm_queries(&cs, "1-rank");
    run_all_collectives(&cs, "1-rank");
    destroy_all(&cs, "1-rank");
}

static void test_config(void)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    struct comm_set cs = {.n = 1};
    ncclComm_t comm = NULL;
    ncclUniqueId id;

    check(config.size == sizeof(ncclConfig_t) && config.magic == 0xcafebeef &&
              config.version == 22809 && config.blocking == INT_MIN && config.netName == NULL,
          "NCCL_CONFIG_INITIALIZER values", "size %zu magic 0x%x version %u blocking %d",
          config.size, config.magic, config.version, config.blocking);

    config.blocking = 1;
    config.commName = "abi-client";
    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "config ncclGetUniqueId"))
        return;
    if (!check_res(ncclCommInitRankConfig(&cs.comm[0], 1, id, 0, &config), ncclSuccess,
                   "ncclCommInitRankConfig with NCCL_CONFIG_INITIALIZER"))
        return;
    check_comm_queries(&cs, "config");
    run_allreduce_f32(&cs, 1023, 0, "config");
    destroy_all(&cs, "config");

    bad.magic = 0;
    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "bad-config ncclGetUniqueId"))
        return;
    if (!check_res(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument,
                   "ncclCommInitRankConfig without the magic -> ncclInvalidArgument") &&
        comm != NULL)
        ncclCommDestroy(comm);
}

static void test_init_all(void)
{
    struct comm_set cs = {.n = NRANKS_ALL};

    if (!check_res(ncclCommInitAll(cs.comm, NRANKS_ALL, NULL), ncclSuccess,
                   "ncclCommInitAll 4 ranks"))
        return;
    check_comm_queries(&cs, "initall");
    run_all_collectives(&cs, "initall");
    destroy_all(&cs, "initall");
}

/* Each thread is one rank: init (blocking), then the threads meet and one of them checks. */
struct thread_rank {
    int rank;
    ncclUniqueId id;
    ncclComm_t comm;
    ncclResult_t init_res;
    ncclResult_t coll_res;
    float *send;
    float *recv;
    size_t count;
};

static void *thread_main(void *arg)
{
    struct thread_rank *t = arg;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;

    config.blocking = 1;
    t->init_res = ncclCommInitRankConfig(&t->comm, NRANKS_THREADS, t->id, t->rank, &config);
    if (t->init_res != ncclSuccess)
        return NULL;
    t->coll_res =
        ncclAllReduce(t->send, t->recv, t->count, ncclFloat32, ncclSum, t->comm, NULL);
    return NULL;
}

static void test_threads(void)
{
    struct thread_rank t[NRANKS_THREADS];
    pthread_t tid[NRANKS_THREADS];
    const size_t count = 4099;
    float *want = xcalloc(count, sizeof(float));
    ncclUniqueId id;
    int started = 0, init_ok = 1, coll_ok = 1;
    long bad = -1;
    int bad_rank = -1;

    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "threads ncclGetUniqueId")) {
        free(want);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        want[i] = 0.0f;
        for (int r = 0; r < NRANKS_THREADS; r++)
            want[i] += val_f32(r, i);
    }
    for (int r = 0; r < NRANKS_THREADS; r++) {
        memset(&t[r], 0, sizeof(t[r]));
        t[r].rank = r;
        t[r].id = id;
        t[r].count = count;
        t[r].init_res = ncclInternalError;
        t[r].coll_res = ncclInternalError;
        t[r].send = xcalloc(count, sizeof(float));
        t[r].recv = xcalloc(count, sizeof(float));
        fill_f32(t[r].send, count, r, 0);
    }
    for (int r = 0; r < NRANKS_THREADS; r++) {
        if (pthread_create(&tid[r], NULL, thread_main, &t[r]) != 0)
            break;
        started++;
    }
    for (int r = 0; r < started; r++)
        pthread_join(tid[r], NULL);
    check(started == NRANKS_THREADS, "threads pthread_create", "started %d", started);

    for (int r = 0; r < NRANKS_THREADS; r++) {
        init_ok &= t[r].init_res == ncclSuccess;
        coll_ok &= t[r].coll_res == ncclSuccess;
    }
    check(init_ok, "threads ncclCommInitRankConfig 3 ranks", "results %d %d %d; last error \"%s\"",
          (int)t[0].init_res, (int)t[1].init_res, (int)t[2].init_res, ncclGetLastError(NULL));
    if (init_ok) {
        check(coll_ok, "threads ncclAllReduce returns", "results %d %d %d; last error \"%s\"",
              (int)t[0].coll_res, (int)t[1].coll_res, (int)t[2].coll_res,
              ncclGetLastError(NULL));
        if (coll_ok) {
            for (int r = 0; r < NRANKS_THREADS && bad < 0; r++) {
                bad = cmp_f32(t[r].recv, want, count);
                bad_rank = r;
            }
            check(bad < 0, "threads allreduce float32 sum count 4099",
                  "rank %d element %ld: got %g, expected %g", bad_rank, bad,
                  bad >= 0 ? (double)t[bad_rank].recv[bad] : 0.0,
                  bad >= 0 ? (double)want[bad] : 0.0);
        }
        /* Destroy from one thread inside a group, as the init is over on every rank. */
        {
            ncclResult_t res = ncclSuccess;
            ncclGroupStart();
            for (int r = 0; r < NRANKS_THREADS; r++) {
                ncclResult_t one = ncclCommDestroy(t[r].comm);
                if (one != ncclSuccess && res == ncclSuccess)
                    res = one;
            }
            if (res == ncclSuccess)
                res = ncclGroupEnd();
            else
                ncclGroupEnd();
            check_res(res, ncclSuccess, "threads ncclCommDestroy");
        }
    }
    for (int r = 0; r < NRANKS_THREADS; r++) {
        free(t[r].send);
        free(t[r].recv);
    }
    free(want);
}

static void test_bad_arguments(void)
{
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    float buf[16];
    const char *last;

    memset(buf, 0, sizeof(buf));
    check_res(ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument,
              "allreduce with NULL comm -> ncclInvalidArgument");
    last = ncclGetLastError(NULL);
    check(last != NULL && last[0] != '\0', "ncclGetLastError non-empty after an error",
          "got \"%s\"", last ? last : "(null)");
    check_res(ncclCommCount(NULL, &(int){0}), ncclInvalidArgument,
              "ncclCommCount with NULL comm -> ncclInvalidArgument");
    check_res(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart -> "
                                                "ncclInvalidUsage");

    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "bad-args ncclGetUniqueId"))
        return;
    check_res(ncclCommInitRank(&comm, 1, id, 1), ncclInvalidArgument,
              "ncclCommInitRank rank >= nranks -> ncclInvalidArgument");
    check_res(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument,
              "ncclCommInitRank nranks 0 -> ncclInvalidArgument");

    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "bad-args ncclGetUniqueId 2"))
        return;
    if (!check_res(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess, "bad-args ncclCommInitRank"))
        return;
    check_res(ncclAllReduce(buf, buf, 16, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL),
              ncclInvalidArgument, "allreduce datatype ncclNumTypes -> ncclInvalidArgument");
    check_res(ncclAllReduce(buf, buf, 16, (ncclDataType_t)-1, ncclSum, comm, NULL),
              ncclInvalidArgument, "allreduce datatype -1 -> ncclInvalidArgument");
    check_res(ncclAllReduce(buf, buf, 16, ncclFloat32, (ncclRedOp_t)ncclNumOps, comm, NULL),
              ncclInvalidArgument, "allreduce op ncclNumOps (never created) -> "
                                   "ncclInvalidArgument");
    check_res(ncclAllReduce(buf, buf, 16, ncclFloat32, (ncclRedOp_t)12345, comm, NULL),
              ncclInvalidArgument, "allreduce op 12345 -> ncclInvalidArgument");
    check_res(ncclBroadcast(buf, buf, 16, ncclFloat32, 1, comm, NULL), ncclInvalidArgument,
              "broadcast root == nranks -> ncclInvalidArgument");
    check_res(ncclBroadcast(buf, buf, 16, ncclFloat32, -1, comm, NULL), ncclInvalidArgument,
              "broadcast root -1 -> ncclInvalidArgument");
    check_res(ncclReduce(buf, buf, 16, ncclFloat32, ncclSum, 5, comm, NULL), ncclInvalidArgument,
              "reduce root 5 -> ncclInvalidArgument");
    check_res(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument,
              "ncclRedOpDestroy(ncclSum) -> ncclInvalidArgument");
    /* The communicator must still work after rejected calls. */
    {
        struct comm_set cs = {.n = 1};
        cs.comm[0] = comm;
        run_allreduce_f32(&cs, 7, 0, "after-bad-args");
    }
    check_res(ncclCommDestroy(comm), ncclSuccess, "bad-args ncclCommDestroy");
    check_res(ncclCommDestroy(NULL), ncclSuccess, "ncclCommDestroy(NULL) -> ncclSuccess");
}

int main(void)
{
    ncclUniqueId id;

    signal(SIGALRM, on_alarm);
    alarm(TIMEOUT_S);
    setvbuf(stdout, NULL, _IOLBF, 0);

    check_library_identity();
    test_version();
    test_error_strings();
    test_unique_id(&id);
    test_single_rank();
    test_config();
    test_init_all();
    test_threads();
    test_bad_arguments();

    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif /* ABI_HAVE_TOOLKIT */
