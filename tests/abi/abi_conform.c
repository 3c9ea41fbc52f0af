/*
 * ABI conformance sweep: the calls unseen NCCL clients make (nccl-tests, PyTorch's
 * ProcessGroupNCCL, Megatron/DeepSpeed patterns), built like abi_client (the CUDA toolkit's nccl.h,
 * linked to the toolkit's libnccl.so.2, run with LD_LIBRARY_PATH on Weft's build directory), on
 * host buffers and the NULL stream. Ranks are threads of this process (one thread per rank, or
 * one thread driving every rank in groups), so one run covers many communicator shapes fast.
 *
 * Each case says what NVIDIA's NCCL 2.28 documents and checks it: results element by element
 * against a plain loop over the ranks' inputs (inputs chosen so every sum is exact in any order),
 * return codes, and a non-empty ncclGetLastError after each rejected call.
 *
 * Usage: abi_conform [-c CASE]  (CASE: a substring of the case names; default all)
 *        abi_conform -p N | -e N  (ranks as N processes: the id from rank 0 through pipes, MPI
 *                                   style, or NCCL_COMM_ID in every process; see run_processes)
 *        abi_conform -s N         (the thread cases' rank bodies with ranks as N processes, MPI
 *                                   style; see proc_bodies)
 * Env: WEFT_ABI_EXPECT_DIR, when set, is the directory the loaded libnccl.so.2 must come from.
 * Exit: 0 all passed, 1 a failure, 77 toolkit header absent at build time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(ABI_NCCL_H)
#define ABI_HAVE_TOOLKIT 1
#endif

#ifndef ABI_HAVE_TOOLKIT

int main(void)
{
    printf("SKIP: the CUDA toolkit's cuda_runtime.h/nccl.h were not found at build time\n");
    return 77;
}

#else

#include <cuda_runtime.h>
#include ABI_NCCL_H

#define TIMEOUT_S 150
#define MAXR 8

/* ---- Reporting (thread-safe: ranks are threads) -------------------------------------------- */

static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;
static int n_pass;
static int n_fail;
static const char *cur_case = "?";

static void check(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void check(int ok, const char *name, const char *fmt, ...)
{
    pthread_mutex_lock(&print_lock);
    if (ok) {
        n_pass++;
    } else {
        va_list ap;
        n_fail++;
        printf("FAIL [%s] %s: ", cur_case, name);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
    }
    pthread_mutex_unlock(&print_lock);
}

static int check_res(ncclResult_t got, ncclResult_t want, const char *name)
{
    check(got == want, name, "returned %d (%s), expected %d; last error \"%s\"", (int)got,
          ncclGetErrorString(got), (int)want, ncclGetLastError(NULL));
    return got == want;
}

/* A rejected call: the code NCCL returns and a message for ncclGetLastError. */
static void check_reject(ncclResult_t got, ncclResult_t want, const char *name)
{
    const char *last = ncclGetLastError(NULL);
    check(got == want, name, "returned %d (%s), expected %d", (int)got, ncclGetErrorString(got),
          (int)want);
    check(last != NULL && last[0] != '\0', name, "no ncclGetLastError text after the error");
}

static void on_alarm(int sig)
{
    static const char msg[] = "FAIL: abi_conform timed out (a call hung)\n";
    (void)sig;
    if (write(1, msg, sizeof(msg) - 1) < 0) {
    }
    _exit(1);
}

#include "abi_util.h"
#include "../common/torchrun_env.h"

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    return p;
}

/* ---- Ranks as threads ------------------------------------------------------------------------ */

struct world {
    int n;
    ncclUniqueId id;
    ncclUniqueId ids[MAXR];
    pthread_barrier_t bar;
    ncclComm_t comm[MAXR];
    void *shared[MAXR]; /* per-rank pointers a case shares between its ranks */
};

typedef void (*rank_fn)(struct world *w, int rank);

struct rank_arg {
    struct world *w;
    int rank;
    rank_fn fn;
};

static void *rank_thread(void *p)
{
    struct rank_arg *a = p;
    a->fn(a->w, a->rank);
    return NULL;
}

/* Runs fn on n threads, one per rank, with a fresh unique id; returns when all are done. */
static void run_ranks(struct world *w, int n, rank_fn fn)
{
    pthread_t tid[MAXR];
    struct rank_arg args[MAXR];

    w->n = n;
    if (!check_res(ncclGetUniqueId(&w->id), ncclSuccess, "ncclGetUniqueId"))
        return;
    pthread_barrier_init(&w->bar, NULL, (unsigned)n);
    for (int r = 0; r < n; r++) {
        args[r] = (struct rank_arg){w, r, fn};
        if (pthread_create(&tid[r], NULL, rank_thread, &args[r]) != 0) {
            printf("FAIL: pthread_create\n");
            exit(1);
        }
    }
    for (int r = 0; r < n; r++)
        pthread_join(tid[r], NULL);
    pthread_barrier_destroy(&w->bar);
}

/* ---- Values ---------------------------------------------------------------------------------- */

/* Small integers, so float sums and products are exact in any order. */
static int ival(int rank, size_t i)
{
    return (int)((rank * 7 + i * 3) % 5) + 1; /* 1..5 */
}

/* Element i of rank `src`'s block for `dst` in exchanges. */
static int32_t pat(int src, int dst, size_t i)
{
    return (int32_t)(src * 1000000 + dst * 10000 + (int)i);
}

static void fill_i32(int32_t *p, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++)
        p[i] = ival(rank, i) + 100 * rank;
}

static long cmp_i32(const int32_t *got, const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

static void report_i32(const char *name, ncclResult_t res, const int32_t *got,
                       const int32_t *want, size_t n)
{
    long bad;
    if (!check_res(res, ncclSuccess, name))
        return;
    bad = cmp_i32(got, want, n);
    check(bad < 0, name, "element %ld: got %d, expected %d", bad, bad >= 0 ? got[bad] : 0,
          bad >= 0 ? want[bad] : 0);
}

/* ---- Element codecs: independent of the library's own conversions --------------------------- */

/* A binary floating format with `eb` exponent bits and `mb` mantissa bits (IEEE-like, no
 * infinities used here): fp16 5/10, bf16 8/7, e4m3 4/3, e5m2 5/2. */
static double fmt_decode(uint32_t bits, int eb, int mb)
{
    int bias = (1 << (eb - 1)) - 1;
    uint32_t sign = bits >> (eb + mb) & 1;
    uint32_t e = bits >> mb & ((1u << eb) - 1);
    uint32_t m = bits & ((1u << mb) - 1);
    double v = e == 0 ? ldexp((double)m, 1 - bias - mb)
                      : ldexp((double)(m | (1u << mb)), (int)e - bias - mb);
    return sign ? -v : v;
}

/* Exact encoding of v (which must be representable: small integers and their quarters here). */
static uint32_t fmt_encode(double v, int eb, int mb)
{
    int bias = (1 << (eb - 1)) - 1;
    uint32_t sign = v < 0 ? 1u : 0u;
    int e;
    double f;

    if (v == 0.0)
        return 0;
    if (v < 0)
        v = -v;
    f = frexp(v, &e); /* v = f * 2^e, f in [0.5, 1) */
    e -= 1;           /* v = (2f) * 2^e, 2f in [1, 2) */
    uint32_t m = (uint32_t)((2 * f - 1) * (double)(1u << mb));
    return sign << (eb + mb) | (uint32_t)(e + bias) << mb | m;
}

struct dtype {
    ncclDataType_t t;
    const char *name;
    size_t size;
    int is_float;
    int is_signed;
    int eb, mb; /* for 16- and 8-bit floats */
};

static const struct dtype dtypes[] = {
    {ncclInt8, "int8", 1, 0, 1, 0, 0},        {ncclUint8, "uint8", 1, 0, 0, 0, 0},
    {ncclInt32, "int32", 4, 0, 1, 0, 0},      {ncclUint32, "uint32", 4, 0, 0, 0, 0},
    {ncclInt64, "int64", 8, 0, 1, 0, 0},      {ncclUint64, "uint64", 8, 0, 0, 0, 0},
    {ncclFloat16, "float16", 2, 1, 1, 5, 10}, {ncclFloat32, "float32", 4, 1, 1, 0, 0},
    {ncclFloat64, "float64", 8, 1, 1, 0, 0},  {ncclBfloat16, "bfloat16", 2, 1, 1, 8, 7},
    {ncclFloat8e4m3, "f8e4m3", 1, 1, 1, 4, 3}, {ncclFloat8e5m2, "f8e5m2", 1, 1, 1, 5, 2},
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

static void put(const struct dtype *d, void *buf, size_t i, double v)
{
    switch (d->t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    case ncclFloat16:
    case ncclBfloat16: ((uint16_t *)buf)[i] = (uint16_t)fmt_encode(v, d->eb, d->mb); break;
    default: ((uint8_t *)buf)[i] = (uint8_t)fmt_encode(v, d->eb, d->mb); break;
    }
}

static double get(const struct dtype *d, const void *buf, size_t i)
{
    switch (d->t) {
    case ncclInt8: return ((const int8_t *)buf)[i];
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclUint32: return ((const uint32_t *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    case ncclUint64: return (double)((const uint64_t *)buf)[i];
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclFloat64: return ((const double *)buf)[i];
    case ncclFloat16:
    case ncclBfloat16: return fmt_decode(((const uint16_t *)buf)[i], d->eb, d->mb);
    default: return fmt_decode(((const uint8_t *)buf)[i], d->eb, d->mb);
    }
}

/* Inputs: 1..4, so sums, products (24 over 4 ranks: int8 Prod wraps only where wrap_int says)
 * and every partial result in any order are exact in each type; fp8 gets 1..2 (e4m3) or 1
 * under PreMulSum (e5m2, whose 2 mantissa bits cannot hold 9 or 11). Signed types get negative
 * values on odd elements so that max/min see signs. */
static double red_in(const struct dtype *d, int op, int rank, size_t i)
{
    double v = (double)((rank + i) % 4 + 1);
    if (d->is_float && d->size == 1)
        v = (d->mb == 2 && op == ncclNumOps) ? 1.0 : (double)((rank + i) % 2 + 1);
    if (d->is_signed && (i & 1))
        v = -v;
    return v;
}

static double wrap_int(const struct dtype *d, double v)
{
    if (d->is_float)
        return v;
    if (d->size == 1)
        return d->is_signed ? (double)(int8_t)(int64_t)v : (double)(uint8_t)(int64_t)v;
    if (d->size == 4)
        return d->is_signed ? (double)(int32_t)(int64_t)v : (double)(uint32_t)(int64_t)v;
    return d->is_signed ? v : (double)(uint64_t)(int64_t)v;
}

/* The reference result of op over ranks 0..n-1 for element i; scal[r] for PreMulSum. */
static double red_want(const struct dtype *d, int op, int n, size_t i, const double *scal)
{
    double acc = 0;
    for (int r = 0; r < n; r++) {
        double x = red_in(d, op, r, i);
        switch (op) {
        case ncclSum: acc = r ? acc + x : x; break;
        case ncclProd: acc = r ? wrap_int(d, acc * x) : x; break;
        case ncclMax: acc = r ? (x > acc ? x : acc) : x; break;
        case ncclMin: acc = r ? (x < acc ? x : acc) : x; break;
        case ncclAvg: acc = d->is_float ? (r ? acc + x / n : x / n) : (r ? acc + x : x); break;
        default: acc = r ? acc + x * scal[r] : x * scal[r]; break; /* PreMulSum */
        }
    }
    if (op == ncclAvg && !d->is_float)
        acc = trunc(acc / n); /* integer division truncates toward zero */
    return wrap_int(d, acc);
}

/* ---- Cases ----------------------------------------------------------------------------------- */

/* Error strings NCCL prints for each code (reference: observed 2.28 texts). */
static void case_error_strings(void)
{
    static const char *const want[] = {
        "no error",
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "internal error - please report this issue to the NCCL developers",
        "invalid argument (run with NCCL_DEBUG=WARN for details)",
        "invalid usage (run with NCCL_DEBUG=WARN for details)",
        "remote process exited or there was a network error",
        "NCCL operation in progress",
    };
    for (int i = 0; i < 8; i++) {
        const char *s = ncclGetErrorString((ncclResult_t)i);
        check(s != NULL && strcmp(s, want[i]) == 0, "ncclGetErrorString text", "code %d: \"%s\"",
              i, s ? s : "(null)");
    }
    for (int i = 8; i < 11; i++) {
        const char *s = ncclGetErrorString((ncclResult_t)i);
        check(s != NULL && strcmp(s, "unknown result code") == 0,
              "ncclGetErrorString of an unknown code", "code %d: \"%s\"", i, s ? s : "(null)");
    }
    check(ncclGetLastError(NULL) != NULL, "ncclGetLastError(NULL) is a string", "NULL");
}

static ncclResult_t init1(ncclComm_t *comm, ncclConfig_t *config)
{
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess)
        return res;
    return ncclCommInitRankConfig(comm, 1, id, 0, config);
}

/* A 1-rank all-reduce (a local copy) proves a communicator works. */
static void check_works(ncclComm_t comm, const char *name)
{
    int32_t s[33], r[33];
    fill_i32(s, 33, 0);
    memset(r, 0, sizeof(r));
    report_i32(name, poll_async(comm, ncclAllReduce(s, r, 33, ncclInt32, ncclSum, comm, NULL)), r,
               s, 33);
}

/* Every 2.28 config field, valid values accepted and invalid ones refused with
 * ncclInvalidArgument; older and newer struct sizes. */
static void case_config(void)
{
    struct {
        const char *name;
        size_t off;
        int bad;
    } bads[] = {
        {"blocking 2", offsetof(ncclConfig_t, blocking), 2},
        {"minCTAs 0", offsetof(ncclConfig_t, minCTAs), 0},
        {"maxCTAs -1", offsetof(ncclConfig_t, maxCTAs), -1},
        {"splitShare 2", offsetof(ncclConfig_t, splitShare), 2},
        {"collnetEnable 3", offsetof(ncclConfig_t, collnetEnable), 3},
        {"CTAPolicy 7", offsetof(ncclConfig_t, CTAPolicy), 7},
        {"shrinkShare 2", offsetof(ncclConfig_t, shrinkShare), 2},
        {"nvlsCTAs 0", offsetof(ncclConfig_t, nvlsCTAs), 0},
        {"nChannelsPerNetPeer 0", offsetof(ncclConfig_t, nChannelsPerNetPeer), 0},
        {"nChannelsPerNetPeer 65", offsetof(ncclConfig_t, nChannelsPerNetPeer), 65},
        {"nvlinkCentricSched 5", offsetof(ncclConfig_t, nvlinkCentricSched), 5},
    };
    ncclComm_t comm = NULL;

    {
        ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
        c.blocking = 1;
        c.cgaClusterSize = 2;
        c.minCTAs = 2;
        c.maxCTAs = 8;
        c.netName = "Socket";
        c.splitShare = 1;
        c.trafficClass = 0;
        c.commName = "conform-all-fields";
        c.collnetEnable = 0;
        c.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
        c.shrinkShare = 1;
        c.nvlsCTAs = 4;
        c.nChannelsPerNetPeer = 2;
        c.nvlinkCentricSched = 1;
        if (check_res(init1(&comm, &c), ncclSuccess, "init with every 2.28 config field set")) {
            check_works(comm, "all-fields comm works");
            check_res(ncclCommDestroy(comm), ncclSuccess, "all-fields destroy");
        }
    }
    {
        ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
        c.CTAPolicy = NCCL_CTA_POLICY_ZERO;
        c.minCTAs = 64;
        c.maxCTAs = 64;
        if (check_res(init1(&comm, &c), ncclSuccess, "init CTAPolicy ZERO, min=max=64")) {
            check_works(comm, "CTAPolicy ZERO comm works");
            ncclCommDestroy(comm);
        }
    }
    for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
        ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
        char name[96];
        memcpy((char *)&c + bads[i].off, &bads[i].bad, sizeof(int));
        snprintf(name, sizeof(name), "config %s -> ncclInvalidArgument", bads[i].name);
        comm = NULL;
        check_reject(init1(&comm, &c), ncclInvalidArgument, name);
    }
    {
        ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
        c.minCTAs = 16;
        c.maxCTAs = 4;
        check_reject(init1(&comm, &c), ncclInvalidArgument,
                     "config minCTAs > maxCTAs -> ncclInvalidArgument");
    }
    {
        /* A program built against a 2.26 header: its struct ends before commName. What lies
         * beyond its size is not its memory: garbage there must be ignored. */
        ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
        c.size = offsetof(ncclConfig_t, commName);
        c.version = 22603;
        c.blocking = 1;
        memset((char *)&c + c.size, 0x5a, sizeof(c) - c.size);
        if (check_res(init1(&comm, &c), ncclSuccess, "config of an older (2.26) size")) {
            check_works(comm, "older-size config comm works");
            ncclCommDestroy(comm);
        }
    }
    {
        /* A program built against a newer header passes a bigger struct. */
        struct {
            ncclConfig_t c;
            int graphUsageMode, numRmaCtx;
        } big = {NCCL_CONFIG_INITIALIZER, 0, 1};
        big.c.size = sizeof(big);
        if (check_res(init1(&comm, &big.c), ncclSuccess, "config of a newer (bigger) size")) {
            check_works(comm, "bigger config comm works");
            ncclCommDestroy(comm);
        }
    }
    if (check_res(init1(&comm, NULL), ncclSuccess, "ncclCommInitRankConfig(config NULL)")) {
        check_works(comm, "NULL-config comm works");
        ncclCommDestroy(comm);
    }
}

/* ---- Non-blocking communicators (PyTorch TORCH_NCCL_USE_COMM_NONBLOCKING style) ------------- */

static void nb_rank(struct world *w, int rank)
{
    const int n = w->n;
    const size_t count = 1031;
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL, child = NULL;
    int32_t *s = xcalloc(count, 4), *r = xcalloc(count, 4), *r2 = xcalloc(count, 4);
    int32_t *want = xcalloc(count, 4);
    ncclResult_t res;

    c.blocking = 0;
    res = ncclCommInitRankConfig(&comm, n, w->id, rank, &c);
    check(res == ncclSuccess || res == ncclInProgress, "non-blocking init returns",
          "returned %d", (int)res);
    if (!check_res(poll_async(comm, res), ncclSuccess, "non-blocking init completes"))
        goto out;

    fill_i32(s, count, rank);
    for (size_t i = 0; i < count; i++) {
        want[i] = 0;
        for (int q = 0; q < n; q++)
            want[i] += ival(q, i) + 100 * q;
    }
    res = ncclAllReduce(s, r, count, ncclInt32, ncclSum, comm, NULL);
    check(res == ncclSuccess || res == ncclInProgress, "non-blocking allreduce returns",
          "returned %d", (int)res);
    report_i32("non-blocking allreduce", poll_async(comm, res), r, want, count);

    /* A group of two: ncclGroupEnd may return ncclInProgress. */
    memset(r, 0, count * 4);
    ncclGroupStart();
    res = ncclAllReduce(s, r, count, ncclInt32, ncclSum, comm, NULL);
    if (res == ncclSuccess || res == ncclInProgress)
        res = ncclAllReduce(s, r2, count, ncclInt32, ncclSum, comm, NULL);
    {
        ncclResult_t end = ncclGroupEnd();
        if (res == ncclSuccess || res == ncclInProgress)
            res = end;
    }
    check(res == ncclSuccess || res == ncclInProgress, "non-blocking group end returns",
          "returned %d", (int)res);
    res = poll_async(comm, res);
    report_i32("non-blocking group allreduce 1", res, r, want, count);
    report_i32("non-blocking group allreduce 2", res, r2, want, count);

    /* Split with config NULL inherits non-blocking. */
    res = ncclCommSplit(comm, rank % 2, rank, &child, NULL);
    check(res == ncclSuccess || res == ncclInProgress, "non-blocking split returns",
          "returned %d", (int)res);
    if (child == NULL) {
        check(0, "non-blocking split sets *newcomm", "NULL for color %d", rank % 2);
    } else if (check_res(poll_async(child, res), ncclSuccess, "non-blocking split completes")) {
        int cn = 0, cr = -1;
        ncclCommCount(child, &cn);
        ncclCommUserRank(child, &cr);
        check(cn == (n - rank % 2 + 1) / 2 && cr == rank / 2, "non-blocking split shape",
              "count %d rank %d", cn, cr);
        memset(r, 0, count * 4);
        res = ncclAllGather(s, r, 1, ncclInt32, child, NULL);
        res = poll_async(child, res);
        if (check_res(res, ncclSuccess, "non-blocking child allgather")) {
            for (int q = 0; q < cn; q++)
                check(r[q] == ival(rank % 2 + 2 * q, 0) + 100 * (rank % 2 + 2 * q),
                      "non-blocking child allgather data", "slot %d: %d", q, r[q]);
        }
        res = ncclCommFinalize(child);
        check(res == ncclSuccess || res == ncclInProgress, "non-blocking child finalize returns",
              "returned %d", (int)res);
        check_res(poll_async(child, res), ncclSuccess, "non-blocking child finalize completes");
        check_res(ncclCommDestroy(child), ncclSuccess, "non-blocking child destroy");
    }
    res = ncclCommFinalize(comm);
    check(res == ncclSuccess || res == ncclInProgress, "non-blocking finalize returns",
          "returned %d", (int)res);
    check_res(poll_async(comm, res), ncclSuccess, "non-blocking finalize completes");
    check_res(ncclCommDestroy(comm), ncclSuccess, "non-blocking destroy");
out:
    free(s);
    free(r);
    free(r2);
    free(want);
}

static void case_nonblocking(void)
{
    struct world w;
    run_ranks(&w, 4, nb_rank);
    run_ranks(&w, 3, nb_rank);
}

/* ncclCommAbort while a non-blocking init waits for a rank that never comes: must return
 * promptly (PyTorch's watchdog does this on an init timeout). */
static void case_abort_pending_init(void)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    ncclResult_t res, state = ncclSuccess;
    double t0;

    c.blocking = 0;
    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "abort-init ncclGetUniqueId"))
        return;
    res = ncclCommInitRankConfig(&comm, 2, id, 0, &c);
    check(res == ncclInProgress, "non-blocking init missing a rank returns ncclInProgress",
          "returned %d", (int)res);
    if (comm == NULL) {
        check(0, "non-blocking init sets *comm before it completes", "comm is NULL");
        return;
    }
    usleep(100000);
    check_res(ncclCommGetAsyncError(comm, &state), ncclSuccess, "abort-init get async error");
    check(state == ncclInProgress, "init still in progress while a rank is missing", "state %d",
          (int)state);
    t0 = now_s();
    check_res(ncclCommAbort(comm), ncclSuccess, "ncclCommAbort during a pending init");
    check(now_s() - t0 < 10.0, "ncclCommAbort during a pending init is prompt", "took %.1f s",
          now_s() - t0);
}

static void check_members(ncclComm_t comm, int parent_rank, const int *members, int nm,
                          const char *name);

/* Using a non-blocking communicator before its init returned ncclSuccess: NCCL refuses with
 * ncclInvalidArgument ("use communicator before the previous operation returned ncclSuccess");
 * rank 1 joins only after rank 0 tried. */
static void nb_early_rank(struct world *w, int rank)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    int32_t s[16], r[16], want[16];
    ncclResult_t res;

    c.blocking = 0;
    if (rank == 1)
        pthread_barrier_wait(&w->bar);
    res = ncclCommInitRankConfig(&comm, 2, w->id, rank, &c);
    check(res == ncclSuccess || res == ncclInProgress, "early-use init returns", "returned %d",
          (int)res);
    if (rank == 0) {
        check(res == ncclInProgress, "init waiting for a rank returns ncclInProgress",
              "returned %d", (int)res);
        check_reject(ncclAllReduce(s, r, 16, ncclInt32, ncclSum, comm, NULL), ncclInvalidArgument,
                     "collective on a non-blocking comm still initializing");
        pthread_barrier_wait(&w->bar);
    }
    if (!check_res(poll_async(comm, res), ncclSuccess, "early-use init completes"))
        return;
    for (int i = 0; i < 16; i++) {
        s[i] = pat(rank, 0, (size_t)i);
        want[i] = pat(0, 0, (size_t)i) + pat(1, 0, (size_t)i);
    }
    res = ncclAllReduce(s, r, 16, ncclInt32, ncclSum, comm, NULL);
    report_i32("comm works once its init completed", poll_async(comm, res), r, want, 16);
    /* Shrink a non-blocking comm (the 2-rank comm to rank 0 alone): returns ncclInProgress or
     * ncclSuccess; the child is polled. */
    if (rank == 0) {
        ncclComm_t child = NULL;
        int ex[] = {1};
        res = ncclCommShrink(comm, ex, 1, &child, NULL, NCCL_SHRINK_DEFAULT);
        check(res == ncclSuccess || res == ncclInProgress, "non-blocking shrink returns",
              "returned %d", (int)res);
        if (child != NULL && check_res(poll_async(child, res), ncclSuccess,
                                       "non-blocking shrink completes")) {
            int cn = 0;
            ncclCommCount(child, &cn);
            check(cn == 1, "non-blocking shrink size", "count %d", cn);
            check_works(child, "non-blocking shrunk comm works");
            ncclCommDestroy(child);
        } else {
            check(child != NULL, "non-blocking shrink sets *newcomm", "NULL");
        }
    }
    pthread_barrier_wait(&w->bar);
    check_res(ncclCommDestroy(comm), ncclSuccess, "early-use destroy");
}

/* One thread initializes three non-blocking comms in a group (nccl-tests -g with a
 * non-blocking config), polls each, then runs a grouped all-reduce over them. */
static void case_nonblocking_grouped(void)
{
    enum { N = 3 };
    ncclComm_t comms[N] = {NULL, NULL, NULL};
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    int32_t s[N][50], r[N][50], want[50];
    ncclResult_t res = ncclSuccess;

    c.blocking = 0;
    ncclGetUniqueId(&id);
    ncclGroupStart();
    for (int i = 0; i < N && (res == ncclSuccess || res == ncclInProgress); i++)
        res = ncclCommInitRankConfig(&comms[i], N, id, i, &c);
    {
        ncclResult_t end = ncclGroupEnd();
        if (res == ncclSuccess || res == ncclInProgress)
            res = end;
    }
    check(res == ncclSuccess || res == ncclInProgress, "grouped non-blocking inits end",
          "returned %d", (int)res);
    for (int i = 0; i < N; i++)
        if (comms[i] == NULL ||
            !check_res(poll_async(comms[i], res), ncclSuccess, "grouped non-blocking init"))
            return;
    for (int j = 0; j < 50; j++) {
        want[j] = 0;
        for (int i = 0; i < N; i++) {
            s[i][j] = pat(i, 12, (size_t)j);
            want[j] += s[i][j];
        }
    }
    ncclGroupStart();
    for (int i = 0; i < N; i++)
        ncclAllReduce(s[i], r[i], 50, ncclInt32, ncclSum, comms[i], NULL);
    res = ncclGroupEnd();
    check(res == ncclSuccess || res == ncclInProgress, "grouped non-blocking allreduce end",
          "returned %d", (int)res);
    for (int i = 0; i < N; i++)
        report_i32("grouped non-blocking allreduce", poll_async(comms[i], res), r[i], want, 50);
    for (int i = 0; i < N; i++)
        check_res(ncclCommDestroy(comms[i]), ncclSuccess, "grouped non-blocking destroy");
}

static void case_nonblocking_early(void)
{
    struct world w;
    run_ranks(&w, 2, nb_early_rank);
    case_nonblocking_grouped();
}

/* Split configs: a non-blocking child of a blocking parent, and splitShare = 1. */
static void split_cfg_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL, a = NULL, b = NULL;
    ncclConfig_t nb = NCCL_CONFIG_INITIALIZER, share = NCCL_CONFIG_INITIALIZER;
    ncclResult_t res;

    nb.blocking = 0;
    share.splitShare = 1;
    if (!check_res(ncclCommInitRank(&comm, w->n, w->id, rank), ncclSuccess, "split-cfg init"))
        return;
    res = ncclCommSplit(comm, 0, rank, &a, &nb);
    check(res == ncclSuccess || res == ncclInProgress, "non-blocking child of a blocking parent",
          "returned %d", (int)res);
    if (a != NULL && check_res(poll_async(a, res), ncclSuccess, "non-blocking child completes")) {
        int32_t s = rank + 1, r = 0;
        res = ncclAllReduce(&s, &r, 1, ncclInt32, ncclSum, a, NULL);
        res = poll_async(a, res);
        check(res == ncclSuccess && r == w->n * (w->n + 1) / 2, "non-blocking child allreduce",
              "res %d value %d", (int)res, r);
    }
    res = ncclCommSplit(comm, rank % 2, rank, &b, &share);
    if (check_res(res, ncclSuccess, "split with splitShare 1") && b != NULL) {
        int members[MAXR], nm = 0;
        for (int q = 0; q < w->n; q++)
            if (q % 2 == rank % 2)
                members[nm++] = q;
        check_members(b, rank, members, nm, "splitShare child members");
    }
    if (a) {
        res = ncclCommFinalize(a);
        check_res(poll_async(a, res), ncclSuccess, "non-blocking child finalize");
        ncclCommDestroy(a);
    }
    if (b)
        ncclCommDestroy(b);
    ncclCommDestroy(comm);
}

static void case_split_config(void)
{
    struct world w;
    run_ranks(&w, 4, split_cfg_rank);
}

/* ---- Init variants -------------------------------------------------------------------------- */

static int scalable_nid;

static void scalable_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL;
    int32_t s[5], r[5 * MAXR], want[5 * MAXR];

    if (!check_res(ncclCommInitRankScalable(&comm, w->n, rank, scalable_nid, w->ids, NULL),
                   ncclSuccess, "ncclCommInitRankScalable"))
        return;
    for (int i = 0; i < 5; i++)
        s[i] = pat(rank, 0, (size_t)i);
    for (int q = 0; q < w->n; q++)
        for (int i = 0; i < 5; i++)
            want[q * 5 + i] = pat(q, 0, (size_t)i);
    report_i32("scalable comm allgather", ncclAllGather(s, r, 5, ncclInt32, comm, NULL), r, want,
               5 * (size_t)w->n);
    check_res(ncclCommDestroy(comm), ncclSuccess, "scalable destroy");
}

static void case_scalable(void)
{
    struct world w;
    ncclComm_t comm = NULL;
    int nids[] = {2, 4};

    for (int k = 0; k < 2; k++) {
        scalable_nid = nids[k];
        for (int i = 0; i < scalable_nid; i++)
            ncclGetUniqueId(&w.ids[i]);
        run_ranks(&w, 4, scalable_rank);
    }
    check_reject(ncclCommInitRankScalable(&comm, 4, 0, 0, w.ids, NULL), ncclInvalidArgument,
                 "ncclCommInitRankScalable nId 0 -> ncclInvalidArgument");
    check_reject(ncclCommInitRankScalable(&comm, 2, 0, 3, w.ids, NULL), ncclInvalidArgument,
                 "ncclCommInitRankScalable nId > nranks -> ncclInvalidArgument");
    check_reject(ncclCommInitRankScalable(&comm, 2, 0, 1, NULL, NULL), ncclInvalidArgument,
                 "ncclCommInitRankScalable ids NULL -> ncclInvalidArgument");
}

/* Verifies a communicator's membership and order: an all-gather of the parent ranks must give
 * exactly `members` (parent ranks in the child's rank order). */
static void check_members(ncclComm_t comm, int parent_rank, const int *members, int nm,
                          const char *name)
{
    int cn = -1, cr = -1, me = -1;
    int32_t mine = parent_rank, *all = xcalloc((size_t)nm, 4);

    ncclCommCount(comm, &cn);
    ncclCommUserRank(comm, &cr);
    for (int i = 0; i < nm; i++)
        if (members[i] == parent_rank)
            me = i;
    check(cn == nm && cr == me, name, "count %d rank %d, expected %d %d", cn, cr, nm, me);
    if (cn == nm && check_res(ncclAllGather(&mine, all, 1, ncclInt32, comm, NULL), ncclSuccess,
                              name)) {
        for (int i = 0; i < nm; i++)
            check(all[i] == members[i], name, "child rank %d is parent %d, expected %d", i,
                  all[i], members[i]);
    }
    free(all);
}

/* Split: NCCL_SPLIT_NOCOLOR, keys reversing the order, equal keys (ties by parent rank), and a
 * split of a split. 6 ranks. */
static void split_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL, a = NULL, b = NULL, c = NULL;

    if (!check_res(ncclCommInitRank(&comm, w->n, w->id, rank), ncclSuccess, "split init"))
        return;
    /* Color rank % 2, key n - rank: the child order reverses; rank 5 opts out. */
    {
        int color = rank == 5 ? NCCL_SPLIT_NOCOLOR : rank % 2;
        check_res(ncclCommSplit(comm, color, w->n - rank, &a, NULL), ncclSuccess,
                  "split reversed keys");
        if (rank == 5) {
            check(a == NULL, "NCCL_SPLIT_NOCOLOR gives a NULL comm", "got %p", (void *)a);
        } else if (a != NULL) {
            static const int even[] = {4, 2, 0}, odd[] = {3, 1};
            check_members(a, rank, rank % 2 ? odd : even, rank % 2 ? 2 : 3,
                          "split reversed keys members");
        }
    }
    /* All keys equal: ordered by parent rank. */
    check_res(ncclCommSplit(comm, rank < 3, 0, &b, NULL), ncclSuccess, "split equal keys");
    if (b != NULL) {
        static const int lo[] = {0, 1, 2}, hi[] = {3, 4, 5};
        check_members(b, rank, rank < 3 ? lo : hi, 3, "split equal keys members");
        /* Split of a split: within b, color by b-rank parity, key descending. */
        {
            int br = -1;
            ncclCommUserRank(b, &br);
            check_res(ncclCommSplit(b, br == 1 ? 7 : 3, -br, &c, NULL), ncclSuccess,
                      "split of a split");
            if (c != NULL) {
                int base = rank < 3 ? 0 : 3;
                int pair[2] = {base + 2, base + 0}, single[1] = {base + 1};
                check_members(c, rank, br == 1 ? single : pair, br == 1 ? 1 : 2,
                              "split of a split members");
                check_res(ncclCommDestroy(c), ncclSuccess, "split-of-split destroy");
            }
        }
    }
    /* Destroy in a different order on each rank. */
    if (rank % 2) {
        if (a)
            check_res(ncclCommDestroy(a), ncclSuccess, "split destroy a");
        check_res(ncclCommDestroy(comm), ncclSuccess, "split destroy parent");
        if (b)
            check_res(ncclCommDestroy(b), ncclSuccess, "split destroy b");
    } else {
        if (b)
            check_res(ncclCommDestroy(b), ncclSuccess, "split destroy b");
        if (a)
            check_res(ncclCommDestroy(a), ncclSuccess, "split destroy a");
        check_res(ncclCommDestroy(comm), ncclSuccess, "split destroy parent");
    }
}

static void case_split(void)
{
    struct world w;
    run_ranks(&w, 6, split_rank);
}

/* Shrink: exclude rank 1 (healthy parent, default flag), then with NCCL_SHRINK_ABORT exclude the
 * last rank, which never calls it and aborts its parent. */
static void shrink_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL, s1 = NULL, s2 = NULL;
    int ex1[] = {1};

    if (!check_res(ncclCommInitRank(&comm, w->n, w->id, rank), ncclSuccess, "shrink init"))
        return;
    if (rank == 1) {
        check_reject(ncclCommShrink(comm, ex1, 1, &s1, NULL, NCCL_SHRINK_DEFAULT),
                     ncclInvalidArgument, "an excluded rank calling ncclCommShrink");
    } else {
        static const int members[] = {0, 2, 3};
        check_res(ncclCommShrink(comm, ex1, 1, &s1, NULL, NCCL_SHRINK_DEFAULT), ncclSuccess,
                  "ncclCommShrink exclude 1");
        if (s1 != NULL)
            check_members(s1, rank, members, 3, "shrink members");
    }
    pthread_barrier_wait(&w->bar);
    if (rank == 3) {
        /* The "failed" rank: gone from the job's point of view. */
        check_res(ncclCommAbort(comm), ncclSuccess, "abort of the shrunk-away rank");
        comm = NULL;
    } else {
        int ex2[] = {3};
        static const int members[] = {0, 1, 2};
        check_res(ncclCommShrink(comm, ex2, 1, &s2, NULL, NCCL_SHRINK_ABORT), ncclSuccess,
                  "ncclCommShrink NCCL_SHRINK_ABORT");
        if (s2 != NULL) {
            check_members(s2, rank, members, 3, "shrink-abort members");
            check_res(ncclCommDestroy(s2), ncclSuccess, "shrink-abort destroy");
        }
    }
    pthread_barrier_wait(&w->bar);
    if (s1)
        check_res(ncclCommDestroy(s1), ncclSuccess, "shrink destroy s1");
    if (comm)
        check_res(ncclCommDestroy(comm), ncclSuccess, "shrink destroy parent");
}

static void case_shrink(void)
{
    struct world w;
    ncclComm_t comm = NULL, out = NULL;
    int ex[] = {0};

    run_ranks(&w, 4, shrink_rank);
    if (check_res(init1(&comm, NULL), ncclSuccess, "shrink-args init")) {
        check_reject(ncclCommShrink(comm, ex, 0, &out, NULL, 0), ncclInvalidArgument,
                     "ncclCommShrink excludeRanksCount 0");
        check_reject(ncclCommShrink(comm, NULL, 1, &out, NULL, 0), ncclInvalidArgument,
                     "ncclCommShrink excludeRanksList NULL");
        ncclCommDestroy(comm);
    }
}

/* ---- Groups, p2p, layouts -------------------------------------------------------------------- */

static void p2p_rank(struct world *w, int rank)
{
    const int n = w->n;
    ncclComm_t comm = NULL;

    if (!check_res(ncclCommInitRank(&comm, n, w->id, rank), ncclSuccess, "p2p init"))
        return;

    /* Self send/recv in a group, with count 0 pairs to every peer. */
    {
        int32_t s[257], r[257], sentinel = 0x7eadbeef;
        for (int i = 0; i < 257; i++) {
            s[i] = pat(rank, rank, (size_t)i);
            r[i] = sentinel;
        }
        ncclGroupStart();
        ncclResult_t res = ncclSend(s, 257, ncclInt32, rank, comm, NULL);
        if (res == ncclSuccess)
            res = ncclRecv(r, 257, ncclInt32, rank, comm, NULL);
        for (int p = 0; p < n && res == ncclSuccess; p++) {
            res = ncclSend(NULL, 0, ncclInt32, p, comm, NULL);
            if (res == ncclSuccess)
                res = ncclRecv(NULL, 0, ncclInt32, p, comm, NULL);
        }
        report_i32("self send/recv in a group (with count-0 pairs)", group_end(res), r, s, 257);
    }
    /* Count-0 send/recv outside a group: no-ops that return. */
    {
        int peer = rank ^ 1;
        if (peer < n) {
            ncclResult_t res = rank & 1 ? ncclRecv(NULL, 0, ncclFloat32, peer, comm, NULL)
                                        : ncclSend(NULL, 0, ncclFloat32, peer, comm, NULL);
            check_res(res, ncclSuccess, "count-0 send/recv outside a group");
        }
    }
    /* All-to-all-v from grouped send/recv with uneven counts, zeros included. */
    {
        size_t soff[MAXR + 1], roff[MAXR + 1];
        int32_t *s, *r, *want;
#define A2AV_COUNT(src, dst) ((size_t)(((src) * 3 + (dst) * 5) % 7) * 37)
        soff[0] = roff[0] = 0;
        for (int p = 0; p < n; p++) {
            soff[p + 1] = soff[p] + A2AV_COUNT(rank, p);
            roff[p + 1] = roff[p] + A2AV_COUNT(p, rank);
        }
        s = xcalloc(soff[n], 4);
        r = xcalloc(roff[n], 4);
        want = xcalloc(roff[n], 4);
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < A2AV_COUNT(rank, p); i++)
                s[soff[p] + i] = pat(rank, p, i);
            for (size_t i = 0; i < A2AV_COUNT(p, rank); i++)
                want[roff[p] + i] = pat(p, rank, i);
        }
        ncclGroupStart();
        ncclResult_t res = ncclSuccess;
        for (int p = 0; p < n && res == ncclSuccess; p++) {
            res = ncclSend(s + soff[p], A2AV_COUNT(rank, p), ncclInt32, p, comm, NULL);
            if (res == ncclSuccess)
                res = ncclRecv(r + roff[p], A2AV_COUNT(p, rank), ncclInt32, p, comm, NULL);
        }
        report_i32("all-to-all-v from grouped send/recv", group_end(res), r, want, roff[n]);
        free(s);
        free(r);
        free(want);
#undef A2AV_COUNT
    }
    /* Count-0 collectives with NULL buffers: success, nothing runs. */
    {
        ncclResult_t res;
        res = ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL);
        check_res(res, ncclSuccess, "allreduce count 0");
        res = ncclBroadcast(NULL, NULL, 0, ncclFloat32, 0, comm, NULL);
        check_res(res, ncclSuccess, "broadcast count 0");
        res = ncclBcast(NULL, 0, ncclFloat32, n - 1, comm, NULL);
        check_res(res, ncclSuccess, "bcast count 0");
        res = ncclReduce(NULL, NULL, 0, ncclFloat32, ncclMax, 0, comm, NULL);
        check_res(res, ncclSuccess, "reduce count 0");
        res = ncclAllGather(NULL, NULL, 0, ncclFloat32, comm, NULL);
        check_res(res, ncclSuccess, "allgather count 0");
        res = ncclReduceScatter(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL);
        check_res(res, ncclSuccess, "reducescatter count 0");
        res = ncclAlltoAll(NULL, NULL, 0, ncclFloat32, comm, NULL);
        check_res(res, ncclSuccess, "alltoall count 0");
        res = ncclGather(NULL, NULL, 0, ncclFloat32, 0, comm, NULL);
        check_res(res, ncclSuccess, "gather count 0");
        res = ncclScatter(NULL, NULL, 0, ncclFloat32, 0, comm, NULL);
        check_res(res, ncclSuccess, "scatter count 0");
        ncclGroupStart();
        res = ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL);
        check_res(group_end(res), ncclSuccess, "count-0 allreduce in a group");
    }
    check_res(ncclCommDestroy(comm), ncclSuccess, "p2p destroy");
}

/* ---- Device buffers (the emulated GPU, or a real one) ------------------------------------------
 * A client built against NVIDIA's nccl.h would take its CUDA runtime from libcudart; here the
 * device runtime is Weft's own forward of its CUDA backend (weft.h's weftCuda*, looked up with
 * dlsym so this program still needs nothing but the toolkit's nccl.h). The cases run where that
 * backend has a device: WEFT_CUDA=emu:2 in the abi_conform_emu test. */

typedef struct CUevent_st *dev_event_t;
typedef struct CUgraphExec_st *dev_graph_t;
static struct {
    const char *(*backend)(void);
    int (*count)(int *);
    int (*set)(int);
    int (*get)(int *);
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t);
    int (*memcpy_async)(void *, const void *, size_t, cudaStream_t);
    int (*stream_create)(cudaStream_t *);
    int (*stream_destroy)(cudaStream_t);
    int (*stream_sync)(cudaStream_t);
    int (*stream_query)(cudaStream_t);
    int (*event_create)(dev_event_t *);
    int (*event_record)(dev_event_t, cudaStream_t);
    int (*event_destroy)(dev_event_t);
    int (*stream_wait_event)(cudaStream_t, dev_event_t);
    int (*begin_capture)(cudaStream_t);
    int (*end_capture)(cudaStream_t, dev_graph_t *);
    int (*graph_launch)(dev_graph_t, cudaStream_t);
    int (*graph_destroy)(dev_graph_t);
} dv;

/* Returns the number of devices, 0 when there is none (or the functions are missing). */
static int dev_load(void)
{
    int n = 0;
#define DV(field, name)                                                                            \
    do {                                                                                           \
        *(void **)&dv.field = dlsym(RTLD_DEFAULT, name);                                           \
        if (dv.field == NULL)                                                                      \
            return 0;                                                                              \
    } while (0)
    DV(backend, "weftCudaBackend");
    DV(count, "weftCudaGetDeviceCount");
    DV(set, "weftCudaSetDevice");
    DV(get, "weftCudaGetDevice");
    DV(malloc_, "weftCudaMalloc");
    DV(free_, "weftCudaFree");
    DV(memcpy_, "weftCudaMemcpy");
    DV(memcpy_async, "weftCudaMemcpyAsync");
    DV(stream_create, "weftCudaStreamCreate");
    DV(stream_destroy, "weftCudaStreamDestroy");
    DV(stream_sync, "weftCudaStreamSynchronize");
    DV(stream_query, "weftCudaStreamQuery");
    DV(event_create, "weftCudaEventCreate");
    DV(event_record, "weftCudaEventRecord");
    DV(event_destroy, "weftCudaEventDestroy");
    DV(stream_wait_event, "weftCudaStreamWaitEvent");
    DV(begin_capture, "weftCudaStreamBeginCapture");
    DV(end_capture, "weftCudaStreamEndCapture");
    DV(graph_launch, "weftCudaGraphLaunch");
    DV(graph_destroy, "weftCudaGraphDestroy");
#undef DV
    if (strcmp(dv.backend(), "none") == 0 || dv.count(&n) != 0)
        return 0;
    return n;
}

/* Layout corners: NULL send buffer on broadcast non-roots and NULL receive buffer on reduce
 * non-roots (NCCL ignores them), buffers not aligned to more than their element (nccl-tests -u),
 * a long group of small operations, a window registered inside a group. */
static void corners_rank(struct world *w, int rank)
{
    const int n = w->n;
    ncclComm_t comm = NULL;
    ncclResult_t res;

    if (!check_res(ncclCommInitRank(&comm, n, w->id, rank), ncclSuccess, "corners init"))
        return;
    {
        int32_t r[300], want[300], root = n - 1;
        for (int i = 0; i < 300; i++) {
            r[i] = rank == root ? pat(root, 4, (size_t)i) : -1;
            want[i] = pat(root, 4, (size_t)i);
        }
        res = ncclBroadcast(rank == root ? r : NULL, r, 300, ncclInt32, root, comm, NULL);
        report_i32("broadcast with sendbuff NULL on non-roots", res, r, want, 300);
        for (int i = 0; i < 300; i++) {
            r[i] = pat(rank, 4, (size_t)i);
            want[i] = 0;
            for (int q = 0; q < n; q++)
                want[i] += pat(q, 4, (size_t)i);
        }
        res = ncclReduce(r, rank == 0 ? r : NULL, 300, ncclInt32, ncclSum, 0, comm, NULL);
        if (rank == 0)
            report_i32("reduce (root) with recvbuff NULL on non-roots", res, r, want, 300);
        else
            check_res(res, ncclSuccess, "reduce with recvbuff NULL on a non-root");
    }
    /* Unaligned: int8 at odd byte offsets, int32 at 4-byte but not 8-aligned addresses. */
    for (int sh = 1; sh <= 3; sh += 2) {
        const size_t cnt = 1027;
        char *sb = xcalloc(cnt * (size_t)n + 16, 1), *rb = xcalloc(cnt * (size_t)n + 16, 1);
        int8_t *s8 = (int8_t *)(sb + sh), *r8 = (int8_t *)(rb + sh + 2);
        int8_t *w8 = xcalloc(cnt * (size_t)n, 1);
        int bad = -1;
        for (size_t i = 0; i < cnt; i++)
            s8[i] = (int8_t)((rank * 5 + (int)i) % 7);
        for (size_t i = 0; i < cnt; i++) {
            int v = 0;
            for (int q = 0; q < n; q++)
                v += (q * 5 + (int)i) % 7;
            w8[i] = (int8_t)v;
        }
        res = ncclAllReduce(s8, r8, cnt, ncclInt8, ncclSum, comm, NULL);
        for (size_t i = 0; i < cnt && bad < 0; i++)
            if (r8[i] != w8[i])
                bad = (int)i;
        check(res == ncclSuccess && bad < 0, "allreduce int8 at odd addresses",
              "res %d element %d", (int)res, bad);
        res = ncclAllGather(s8, r8, cnt, ncclInt8, comm, NULL);
        bad = -1;
        for (int q = 0; q < n && bad < 0; q++)
            for (size_t i = 0; i < cnt && bad < 0; i++)
                if (r8[(size_t)q * cnt + i] != (int8_t)((q * 5 + (int)i) % 7))
                    bad = (int)((size_t)q * cnt + i);
        check(res == ncclSuccess && bad < 0, "allgather int8 at odd addresses",
              "res %d element %d", (int)res, bad);
        {
            int32_t *s32 = (int32_t *)(sb + 4), *r32 = (int32_t *)(rb + 12);
            int32_t *w32 = xcalloc(cnt / 4, 4);
            size_t c32 = cnt / 4 / (size_t)n;
            for (size_t i = 0; i < c32 * (size_t)n; i++)
                s32[i] = pat(rank, 8, i);
            for (size_t i = 0; i < c32; i++) {
                w32[i] = 0;
                for (int q = 0; q < n; q++)
                    w32[i] += pat(q, 8, (size_t)rank * c32 + i);
            }
            report_i32("reducescatter int32 at 4-byte-aligned addresses",
                       ncclReduceScatter(s32, r32, c32, ncclInt32, ncclSum, comm, NULL), r32,
                       w32, c32);
            free(w32);
        }
        free(sb);
        free(rb);
        free(w8);
    }
    /* A long group: 100 small all-reduces and 100 send/recv pairs around the ring. */
    {
        enum { K = 100 }; /* more operations than Weft's operation history holds (64) */
        int32_t *s = xcalloc(K, 4), *r = xcalloc(K, 4), *rv = xcalloc(K, 4);
        int next = (rank + 1) % n, prev = (rank + n - 1) % n, bad = -1;
        for (int k = 0; k < K; k++)
            s[k] = pat(rank, 10, (size_t)k);
        ncclGroupStart();
        res = ncclSuccess;
        for (int k = 0; k < K && res == ncclSuccess; k++) {
            res = ncclAllReduce(&s[k], &r[k], 1, ncclInt32, ncclSum, comm, NULL);
            if (res == ncclSuccess)
                res = ncclSend(&s[k], 1, ncclInt32, next, comm, NULL);
            if (res == ncclSuccess)
                res = ncclRecv(&rv[k], 1, ncclInt32, prev, comm, NULL);
        }
        res = group_end(res);
        for (int k = 0; k < K && bad < 0; k++) {
            int32_t want = 0;
            for (int q = 0; q < n; q++)
                want += pat(q, 10, (size_t)k);
            if (r[k] != want || rv[k] != pat(prev, 10, (size_t)k))
                bad = k;
        }
        check(res == ncclSuccess && bad < 0, "a group of 300 operations", "res %d op %d",
              (int)res, bad);
        free(s);
        free(r);
        free(rv);
    }
    /* ncclCommWindowRegister is collective: inside a group, then used and deregistered. */
    {
        void *m = NULL;
        ncclWindow_t win = NULL;
        res = ncclMemAlloc(&m, 8192);
        if (check_res(res, ncclSuccess, "window ncclMemAlloc")) {
            ncclGroupStart();
            res = ncclCommWindowRegister(comm, m, 8192, &win, NCCL_WIN_COLL_SYMMETRIC);
            check_res(group_end(res), ncclSuccess, "ncclCommWindowRegister inside a group");
            /* With a device current, ncclMemAlloc gives device memory (as NVIDIA's NCCL): filled
             * and read with copies on this rank's own stream (ranks share devices here: the
             * legacy NULL stream, or a synchronous copy, would wait for a peer's kernel that waits
             * for this rank). */
            int on_dev = dev_load() > 0;
            cudaStream_t st = NULL;
            if (on_dev)
                check(dv.stream_create(&st) == 0, "window stream", "failed");
            int32_t b[2048], want[2048];
            for (int i = 0; i < 2048; i++) {
                b[i] = pat(rank, 11, (size_t)i);
                want[i] = 0;
                for (int q = 0; q < n; q++)
                    want[i] += pat(q, 11, (size_t)i);
            }
            if (on_dev)
                check(dv.memcpy_async(m, b, sizeof(b), st) == 0, "window copy in", "failed");
            else
                memcpy(m, b, sizeof(b));
            res = ncclAllReduce(m, m, 2048, ncclInt32, ncclSum, comm, st);
            if (on_dev) {
                check(res != ncclSuccess ||
                          (dv.memcpy_async(b, m, sizeof(b), st) == 0 && dv.stream_sync(st) == 0),
                      "window copy out", "failed");
                dv.stream_destroy(st);
            } else {
                memcpy(b, m, sizeof(b));
            }
            report_i32("allreduce in place on a window", res, b, want, 2048);
            ncclGroupStart();
            res = ncclCommWindowDeregister(comm, win);
            check_res(group_end(res), ncclSuccess, "ncclCommWindowDeregister inside a group");
            ncclMemFree(m);
        }
    }
    check_res(ncclCommDestroy(comm), ncclSuccess, "corners destroy");
}

static void case_corners(void)
{
    struct world w;
    run_ranks(&w, 4, corners_rank);
    run_ranks(&w, 3, corners_rank);
}

static void case_p2p(void)
{
    struct world w;
    run_ranks(&w, 4, p2p_rank);
    run_ranks(&w, 3, p2p_rank);
}

/* In place, every collective with NCCL's in-place layout; ncclBcast; nested groups. */
static void inplace_rank(struct world *w, int rank)
{
    const int n = w->n;
    const size_t cnt = 1000 + 3;
    ncclComm_t comm = NULL;
    int32_t *buf = xcalloc(cnt * (size_t)n, 4), *want = xcalloc(cnt * (size_t)n, 4);
    ncclResult_t res;

    if (!check_res(ncclCommInitRank(&comm, n, w->id, rank), ncclSuccess, "inplace init"))
        goto out;

    /* AllReduce in place. */
    fill_i32(buf, cnt, rank);
    for (size_t i = 0; i < cnt; i++) {
        want[i] = 0;
        for (int q = 0; q < n; q++)
            want[i] += ival(q, i) + 100 * q;
    }
    report_i32("allreduce in place", ncclAllReduce(buf, buf, cnt, ncclInt32, ncclSum, comm, NULL),
               buf, want, cnt);

    /* Broadcast in place and the legacy ncclBcast, root n-1. */
    for (int legacy = 0; legacy < 2; legacy++) {
        for (size_t i = 0; i < cnt; i++) {
            buf[i] = rank == n - 1 ? pat(n - 1, legacy, i) : -1;
            want[i] = pat(n - 1, legacy, i);
        }
        res = legacy ? ncclBcast(buf, cnt, ncclInt32, n - 1, comm, NULL)
                     : ncclBroadcast(buf, buf, cnt, ncclInt32, n - 1, comm, NULL);
        report_i32(legacy ? "ncclBcast" : "broadcast in place", res, buf, want, cnt);
    }

    /* Reduce in place at root 1 (max). */
    {
        int root = 1 % n;
        fill_i32(buf, cnt, rank);
        for (size_t i = 0; i < cnt; i++) {
            want[i] = INT32_MIN;
            for (int q = 0; q < n; q++)
                if (ival(q, i) + 100 * q > want[i])
                    want[i] = ival(q, i) + 100 * q;
        }
        res = ncclReduce(buf, buf, cnt, ncclInt32, ncclMax, root, comm, NULL);
        if (rank == root)
            report_i32("reduce in place (root)", res, buf, want, cnt);
        else
            check_res(res, ncclSuccess, "reduce in place (non-root)");
    }

    /* AllGather in place: sendbuff = recvbuff + rank * count. */
    for (size_t i = 0; i < cnt * (size_t)n; i++)
        buf[i] = -1;
    for (size_t i = 0; i < cnt; i++)
        buf[(size_t)rank * cnt + i] = pat(rank, 0, i);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
            want[(size_t)q * cnt + i] = pat(q, 0, i);
    report_i32("allgather in place",
               ncclAllGather(buf + (size_t)rank * cnt, buf, cnt, ncclInt32, comm, NULL), buf,
               want, cnt * (size_t)n);

    /* ReduceScatter in place: recvbuff = sendbuff + rank * recvcount. */
    for (size_t i = 0; i < cnt * (size_t)n; i++)
        buf[i] = pat(rank, 1, i % 4096);
    for (size_t i = 0; i < cnt; i++) {
        size_t g = (size_t)rank * cnt + i;
        want[i] = 0;
        for (int q = 0; q < n; q++)
            want[i] += pat(q, 1, g % 4096);
    }
    report_i32("reducescatter in place",
               ncclReduceScatter(buf, buf + (size_t)rank * cnt, cnt, ncclInt32, ncclSum, comm,
                                 NULL),
               buf + (size_t)rank * cnt, want, cnt);

    /* Gather in place at the root: sendbuff = recvbuff + root * count. */
    {
        int root = n - 1;
        for (size_t i = 0; i < cnt * (size_t)n; i++)
            buf[i] = -1;
        if (rank == root) {
            for (size_t i = 0; i < cnt; i++)
                buf[(size_t)root * cnt + i] = pat(rank, 2, i);
            res = ncclGather(buf + (size_t)root * cnt, buf, cnt, ncclInt32, root, comm, NULL);
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < cnt; i++)
                    want[(size_t)q * cnt + i] = pat(q, 2, i);
            report_i32("gather in place (root)", res, buf, want, cnt * (size_t)n);
        } else {
            for (size_t i = 0; i < cnt; i++)
                buf[i] = pat(rank, 2, i);
            check_res(ncclGather(buf, NULL, cnt, ncclInt32, root, comm, NULL), ncclSuccess,
                      "gather (non-root, recvbuff NULL)");
        }
    }
    /* Scatter in place at the root: recvbuff = sendbuff + root * count. */
    {
        int root = 0;
        for (size_t i = 0; i < cnt; i++)
            want[i] = pat(root, rank, i);
        if (rank == root) {
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < cnt; i++)
                    buf[(size_t)q * cnt + i] = pat(root, q, i);
            res = ncclScatter(buf, buf + (size_t)root * cnt, cnt, ncclInt32, root, comm, NULL);
            report_i32("scatter in place (root)", res, buf + (size_t)root * cnt, want, cnt);
        } else {
            for (size_t i = 0; i < cnt; i++)
                buf[i] = -1;
            report_i32("scatter (non-root, sendbuff NULL)",
                       ncclScatter(NULL, buf, cnt, ncclInt32, root, comm, NULL), buf, want, cnt);
        }
    }
    /* Three-deep nested groups mixing collectives and p2p; only the outermost end runs them. */
    {
        int32_t *ar = xcalloc(cnt, 4), *ag = xcalloc(cnt * (size_t)n, 4), *rv = xcalloc(cnt, 4);
        int32_t *src = xcalloc(cnt, 4), *w_ar = xcalloc(cnt, 4), *w_ag = xcalloc(cnt * n, 4);
        int32_t *w_rv = xcalloc(cnt, 4);
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        for (size_t i = 0; i < cnt; i++) {
            src[i] = pat(rank, 3, i);
            w_ar[i] = 0;
            for (int q = 0; q < n; q++)
                w_ar[i] += pat(q, 3, i);
            w_rv[i] = pat(prev, 3, i);
            for (int q = 0; q < n; q++)
                w_ag[(size_t)q * cnt + i] = pat(q, 3, i);
        }
        res = ncclGroupStart();
        if (res == ncclSuccess)
            res = ncclAllReduce(src, ar, cnt, ncclInt32, ncclSum, comm, NULL);
        if (res == ncclSuccess && (res = ncclGroupStart()) == ncclSuccess) {
            res = ncclSend(src, cnt, ncclInt32, next, comm, NULL);
            if (res == ncclSuccess && (res = ncclGroupStart()) == ncclSuccess) {
                res = ncclRecv(rv, cnt, ncclInt32, prev, comm, NULL);
                res = group_end(res);
            }
            if (res == ncclSuccess)
                res = ncclAllGather(src, ag, cnt, ncclInt32, comm, NULL);
            res = group_end(res);
        }
        check(ar[0] == 0 && rv[0] == 0, "nothing runs before the outermost group end",
              "allreduce %d recv %d", ar[0], rv[0]);
        res = group_end(res);
        report_i32("nested groups: allreduce", res, ar, w_ar, cnt);
        report_i32("nested groups: recv", res, rv, w_rv, cnt);
        report_i32("nested groups: allgather", res, ag, w_ag, cnt * (size_t)n);
        free(ar);
        free(ag);
        free(rv);
        free(src);
        free(w_ar);
        free(w_ag);
        free(w_rv);
    }
    check_res(ncclCommDestroy(comm), ncclSuccess, "inplace destroy");
out:
    free(buf);
    free(want);
}

static void case_inplace(void)
{
    struct world w;
    run_ranks(&w, 4, inplace_rank);
    run_ranks(&w, 3, inplace_rank);
    run_ranks(&w, 1, inplace_rank);
}

/* ncclGroupSimulateEnd: a time estimate and nothing run; bad magic refused. */
static void case_simulate(void)
{
    ncclComm_t comm = NULL;
    int32_t s[64], r[64];
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ncclResult_t res;

    if (!check_res(init1(&comm, NULL), ncclSuccess, "simulate init"))
        return;
    fill_i32(s, 64, 0);
    for (int i = 0; i < 64; i++)
        r[i] = -7;
    check(sim.estimatedTime == NCCL_UNDEF_FLOAT, "NCCL_SIM_INFO_INITIALIZER", "%f",
          (double)sim.estimatedTime);
    ncclGroupStart();
    res = ncclAllReduce(s, r, 64, ncclInt32, ncclSum, comm, NULL);
    check_res(res, ncclSuccess, "simulate: allreduce recorded");
    check_res(ncclGroupSimulateEnd(&sim), ncclSuccess, "ncclGroupSimulateEnd");
    check(sim.estimatedTime > 0.0f, "ncclGroupSimulateEnd estimates a time", "%f",
          (double)sim.estimatedTime);
    check(r[0] == -7 && r[63] == -7, "ncclGroupSimulateEnd runs nothing", "recv[0] %d", r[0]);
    /* The group is over: a plain call runs at once. */
    check_works(comm, "after ncclGroupSimulateEnd, calls run");
    check_reject(ncclGroupSimulateEnd(&sim), ncclInvalidUsage,
                 "ncclGroupSimulateEnd outside a group -> ncclInvalidUsage");
    /* A simInfo without NCCL_SIM_INFO_INITIALIZER's magic: ncclInvalidArgument, and the group
     * is over all the same (NCCL checks it after the outermost end): nothing stays deferred. */
    {
        ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
        bad.magic = 0;
        ncclGroupStart();
        ncclAllReduce(s, r, 64, ncclInt32, ncclSum, comm, NULL);
        check_reject(ncclGroupSimulateEnd(&bad), ncclInvalidArgument,
                     "ncclGroupSimulateEnd with a bad magic -> ncclInvalidArgument");
        check(r[0] == -7, "a refused simulation runs nothing", "recv[0] %d", r[0]);
        check_reject(ncclGroupEnd(), ncclInvalidUsage,
                     "the group is closed after a refused simulation");
        check_works(comm, "calls run at once after a refused simulation");
    }
    ncclCommDestroy(comm);
}

/* One thread, several communicators: ncclCommInitAll, grouped inits of ncclCommInitRankConfig
 * (nccl-tests -g), grouped collectives and a ring of send/recv across the comms. */
static void case_one_thread(void)
{
    enum { N = 4 };
    ncclComm_t comms[N];
    int32_t *s[N], *r[N], *want = xcalloc(999, 4);
    ncclResult_t res = ncclSuccess;

    for (int k = 0; k < 2; k++) {
        memset(comms, 0, sizeof(comms));
        if (k == 0) {
            int dev[N] = {0, 0, 0, 0};
            (void)dev;
            if (!check_res(ncclCommInitAll(comms, N, NULL), ncclSuccess, "ncclCommInitAll"))
                continue;
        } else {
            ncclUniqueId id;
            ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
            c.nvlinkCentricSched = 1; /* what nccl-tests sets with 2.28 headers */
            ncclGetUniqueId(&id);
            ncclGroupStart();
            for (int i = 0; i < N && res == ncclSuccess; i++)
                res = ncclCommInitRankConfig(&comms[i], N, id, i, &c);
            if (!check_res(group_end(res), ncclSuccess, "grouped ncclCommInitRankConfig"))
                continue;
        }
        for (int i = 0; i < N; i++) {
            int cn = 0, cr = -1;
            ncclCommCount(comms[i], &cn);
            ncclCommUserRank(comms[i], &cr);
            check(cn == N && cr == i, "one-thread comm shape", "comm %d: count %d rank %d", i, cn,
                  cr);
            s[i] = xcalloc(999, 4);
            r[i] = xcalloc(999, 4);
            fill_i32(s[i], 999, i);
        }
        for (size_t j = 0; j < 999; j++) {
            want[j] = 0;
            for (int i = 0; i < N; i++)
                want[j] += ival(i, j) + 100 * i;
        }
        ncclGroupStart();
        for (int i = 0; i < N; i++)
            ncclAllReduce(s[i], r[i], 999, ncclInt32, ncclSum, comms[i], NULL);
        res = ncclGroupEnd();
        for (int i = 0; i < N; i++)
            report_i32("one-thread grouped allreduce", res, r[i], want, 999);
        ncclGroupStart();
        for (int i = 0; i < N; i++) {
            ncclSend(s[i], 999, ncclInt32, (i + 1) % N, comms[i], NULL);
            ncclRecv(r[i], 999, ncclInt32, (i + N - 1) % N, comms[i], NULL);
        }
        res = ncclGroupEnd();
        for (int i = 0; i < N; i++)
            report_i32("one-thread grouped ring", res, r[i], s[(i + N - 1) % N], 999);
        /* Destroy in reverse, one by one (each destroy is an implicit group). */
        for (int i = N - 1; i >= 0; i--) {
            check_res(ncclCommDestroy(comms[i]), ncclSuccess, "one-thread destroy");
            free(s[i]);
            free(r[i]);
        }
    }
    free(want);
    {
        int dup[2] = {0, 0}, bad[2] = {0, 999};
        ncclComm_t two[2] = {NULL, NULL};
        check_reject(ncclCommInitAll(two, 0, NULL), ncclInvalidArgument,
                     "ncclCommInitAll ndev 0");
        check_reject(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument,
                     "ncclCommInitAll comms NULL");
        (void)dup;
        (void)bad;
    }
}

/* Mixing a blocking and a non-blocking communicator in one group: ncclInvalidArgument. */
static void case_mixed_group(void)
{
    ncclComm_t b = NULL, nb = NULL;
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    int32_t s[8] = {1, 2, 3, 4, 5, 6, 7, 8}, r1[8], r2[8];
    ncclResult_t res;

    c.blocking = 0;
    if (!check_res(init1(&b, NULL), ncclSuccess, "mixed: blocking init"))
        return;
    res = init1(&nb, &c);
    if (!check_res(poll_async(nb, res), ncclSuccess, "mixed: non-blocking init")) {
        ncclCommDestroy(b);
        return;
    }
    ncclGroupStart();
    res = ncclAllReduce(s, r1, 8, ncclInt32, ncclSum, b, NULL);
    if (res == ncclSuccess)
        res = ncclAllReduce(s, r2, 8, ncclInt32, ncclSum, nb, NULL);
    res = group_end(res);
    check_reject(res, ncclInvalidArgument,
                 "blocking and non-blocking comms in one group -> ncclInvalidArgument");
    check_works(b, "blocking comm works after the refused group");
    ncclCommDestroy(b);
    ncclCommDestroy(nb);
}

/* ---- Reductions: every type x op, PreMulSum, destroyed ops ---------------------------------- */

struct red_case {
    int n;
};

static void red_rank(struct world *w, int rank)
{
    const int n = w->n;
    const size_t cnt = 67;
    ncclComm_t comm = NULL;
    unsigned char *s = xcalloc(cnt * (size_t)n, 8), *r = xcalloc(cnt * (size_t)n, 8);
    double scal[MAXR];

    if (!check_res(ncclCommInitRank(&comm, n, w->id, rank), ncclSuccess, "reduction init"))
        goto out;
    for (int q = 0; q < n; q++)
        scal[q] = (q % 2) ? 2.0 : 1.0; /* nccl-tests' mulsum scalars */

    for (size_t t = 0; t < NDTYPES; t++) {
        const struct dtype *d = &dtypes[t];
        for (int op = 0; op <= ncclNumOps; op++) {
            char name[96];
            ncclRedOp_t rop = (ncclRedOp_t)op;
            ncclResult_t res = ncclSuccess;
            long bad = -1;

            if (op == ncclAvg && d->is_float && (n & (n - 1)) != 0)
                continue; /* x / n is not exact: run as processes on 3 or 6 ranks (-s) */
            if (op == ncclNumOps) {
                /* PreMulSum, host-immediate scalar of the element type. */
                unsigned char sc[8];
                put(d, sc, 0, scal[rank]);
                res = ncclRedOpCreatePreMulSum(&rop, sc, d->t, ncclScalarHostImmediate, comm);
                memset(sc, 0xff, sizeof(sc)); /* read at creation: later changes don't count */
                snprintf(name, sizeof(name), "ncclRedOpCreatePreMulSum %s", d->name);
                if (!check_res(res, ncclSuccess, name))
                    continue;
            }
            /* All-reduce. */
            for (size_t i = 0; i < cnt; i++)
                put(d, s, i, red_in(d, op, rank, i));
            memset(r, 0xa5, cnt * d->size);
            res = ncclAllReduce(s, r, cnt, d->t, rop, comm, NULL);
            snprintf(name, sizeof(name), "allreduce %s op %d", d->name, op);
            if (check_res(res, ncclSuccess, name)) {
                for (size_t i = 0; i < cnt && bad < 0; i++)
                    if (get(d, r, i) != red_want(d, op, n, i, scal))
                        bad = (long)i;
                check(bad < 0, name, "element %ld: got %g, expected %g", bad,
                      bad >= 0 ? get(d, r, (size_t)bad) : 0.0,
                      bad >= 0 ? red_want(d, op, n, (size_t)bad, scal) : 0.0);
            }
            /* Reduce-scatter of the same values laid out per block. */
            for (size_t i = 0; i < cnt * (size_t)n; i++)
                put(d, s, i, red_in(d, op, rank, i));
            memset(r, 0xa5, cnt * d->size);
            res = ncclReduceScatter(s, r, cnt, d->t, rop, comm, NULL);
            snprintf(name, sizeof(name), "reducescatter %s op %d", d->name, op);
            bad = -1;
            if (check_res(res, ncclSuccess, name)) {
                for (size_t i = 0; i < cnt && bad < 0; i++)
                    if (get(d, r, i) != red_want(d, op, n, (size_t)rank * cnt + i, scal))
                        bad = (long)i;
                check(bad < 0, name, "element %ld: got %g, expected %g", bad,
                      bad >= 0 ? get(d, r, (size_t)bad) : 0.0,
                      bad >= 0 ? red_want(d, op, n, (size_t)rank * cnt + (size_t)bad, scal)
                               : 0.0);
            }
            if (op == ncclNumOps) {
                /* Wrong datatype for the op; then destroy, then use after destroy. */
                ncclDataType_t other = d->t == ncclFloat32 ? ncclFloat64 : ncclFloat32;
                snprintf(name, sizeof(name), "PreMulSum(%s) used with another type", d->name);
                check_reject(ncclAllReduce(s, r, cnt, other, rop, comm, NULL),
                             ncclInvalidArgument, name);
                check_res(ncclRedOpDestroy(rop, comm), ncclSuccess, "ncclRedOpDestroy");
                snprintf(name, sizeof(name), "destroyed PreMulSum(%s) used", d->name);
                check_reject(ncclAllReduce(s, r, cnt, d->t, rop, comm, NULL), ncclInvalidArgument,
                             name);
                check_reject(ncclRedOpDestroy(rop, comm), ncclInvalidArgument,
                             "ncclRedOpDestroy twice");
            }
        }
    }
    /* nccl-tests' pattern: create, enqueue and destroy inside an open group; then end it. */
    {
        ncclRedOp_t rop;
        float sc = scal[rank] , fs[100], fr[100];
        ncclResult_t res;
        for (int i = 0; i < 100; i++)
            fs[i] = (float)(i % 9);
        ncclGroupStart();
        res = ncclRedOpCreatePreMulSum(&rop, &sc, ncclFloat32, ncclScalarHostImmediate, comm);
        if (res == ncclSuccess)
            res = ncclAllReduce(fs, fr, 100, ncclFloat32, rop, comm, NULL);
        if (res == ncclSuccess)
            res = ncclRedOpDestroy(rop, comm);
        res = group_end(res);
        if (check_res(res, ncclSuccess, "PreMulSum destroyed before its group ends")) {
            double tot = 0;
            int bad = -1;
            for (int q = 0; q < n; q++)
                tot += scal[q];
            for (int i = 0; i < 100 && bad < 0; i++)
                if (fr[i] != (float)(tot * (i % 9)))
                    bad = i;
            check(bad < 0, "PreMulSum destroyed before its group ends: data", "element %d: %g",
                  bad, bad >= 0 ? (double)fr[bad] : 0.0);
        }
    }
    /* A PreMulSum created on one comm is not valid on another (only with a second comm: split). */
    {
        ncclComm_t other = NULL;
        ncclRedOp_t rop;
        float sc = 1.0f, fs[4] = {1, 2, 3, 4}, fr[4];
        if (check_res(ncclCommSplit(comm, 0, rank, &other, NULL), ncclSuccess, "red split") &&
            check_res(ncclRedOpCreatePreMulSum(&rop, &sc, ncclFloat32, ncclScalarHostImmediate,
                                               comm),
                      ncclSuccess, "PreMulSum for the cross-comm check")) {
            ncclRedOp_t rop2;
            /* Make `other` have a user op of its own, so the value alone is not unknown. */
            ncclRedOpCreatePreMulSum(&rop2, &sc, ncclFloat64, ncclScalarHostImmediate, other);
            if (rop2 == rop)
                check_reject(ncclAllReduce(fs, fr, 4, ncclFloat32, rop, other, NULL),
                             ncclInvalidArgument, "PreMulSum of comm A used on comm B");
            else
                check_reject(ncclAllReduce(fs, fr, 4, ncclFloat32, rop, other, NULL),
                             ncclInvalidArgument, "PreMulSum of comm A used on comm B");
            ncclRedOpDestroy(rop2, other);
            ncclRedOpDestroy(rop, comm);
        }
        if (other)
            ncclCommDestroy(other);
    }
    check_res(ncclCommDestroy(comm), ncclSuccess, "reduction destroy");
out:
    free(s);
    free(r);
}

static void case_reductions(void)
{
    struct world w;
    run_ranks(&w, 4, red_rank);
    run_ranks(&w, 2, red_rank);
}

/* ---- Memory and registration ----------------------------------------------------------------- */

static void mem_rank(struct world *w, int rank)
{
    const int n = w->n;
    const size_t cnt = 4096;
    ncclComm_t comm = NULL;
    int32_t *s = NULL, *r = NULL, *want = xcalloc(cnt, 4);
    void *h1 = NULL, *h2 = NULL;
    ncclWindow_t win1 = NULL, win2 = NULL;
    ncclResult_t res;

    /* With a device current ncclMemAlloc gives device memory (NVIDIA's NCCL does too): the
     * device cases (dev_rank) check it there; these checks read and write it from the host. */
    if (dev_load() > 0)
        goto out;
    if (!check_res(ncclCommInitRank(&comm, n, w->id, rank), ncclSuccess, "mem init"))
        goto out;
    /* nccl-tests allocates inside an open group. */
    ncclGroupStart();
    res = ncclMemAlloc((void **)&s, cnt * 4);
    if (res == ncclSuccess)
        res = ncclMemAlloc((void **)&r, cnt * 4);
    res = group_end(res);
    if (!check_res(res, ncclSuccess, "ncclMemAlloc in an open group") || !s || !r)
        goto out_comm;
    check(((uintptr_t)s & 4095) == 0, "ncclMemAlloc memory is page-aligned", "%p", (void *)s);
    res = ncclCommRegister(comm, s, cnt * 4, &h1);
    check_res(res, ncclSuccess, "ncclCommRegister");
    res = ncclCommRegister(comm, r, cnt * 4, &h2);
    check_res(res, ncclSuccess, "ncclCommRegister 2");
    res = ncclCommWindowRegister(comm, s, cnt * 4, &win1, NCCL_WIN_COLL_SYMMETRIC);
    check_res(res, ncclSuccess, "ncclCommWindowRegister symmetric");
    res = ncclCommWindowRegister(comm, r, cnt * 4, &win2, NCCL_WIN_DEFAULT);
    check_res(res, ncclSuccess, "ncclCommWindowRegister default");
    fill_i32(s, cnt, rank);
    for (size_t i = 0; i < cnt; i++) {
        want[i] = 0;
        for (int q = 0; q < n; q++)
            want[i] += ival(q, i) + 100 * q;
    }
    for (int it = 0; it < 3; it++) {
        memset(r, 0, cnt * 4);
        report_i32("allreduce on registered ncclMemAlloc buffers",
                   ncclAllReduce(s, r, cnt, ncclInt32, ncclSum, comm, NULL), r, want, cnt);
    }
    check_res(ncclCommWindowDeregister(comm, win1), ncclSuccess, "ncclCommWindowDeregister");
    check_res(ncclCommWindowDeregister(comm, win2), ncclSuccess, "ncclCommWindowDeregister 2");
    check_res(ncclCommWindowDeregister(comm, NULL), ncclSuccess,
              "ncclCommWindowDeregister(NULL)");
    check_res(ncclCommDeregister(comm, h1), ncclSuccess, "ncclCommDeregister");
    check_res(ncclCommDeregister(comm, h2), ncclSuccess, "ncclCommDeregister 2");
    /* Registered plain malloc memory, and the buffers after deregistration. */
    {
        int32_t *m = xcalloc(cnt, 4);
        void *h = NULL;
        check_res(ncclCommRegister(comm, m, cnt * 4, &h), ncclSuccess, "register malloc memory");
        memset(r, 0, cnt * 4);
        report_i32("allreduce malloc sendbuff registered",
                   ncclAllReduce(s, m, cnt, ncclInt32, ncclSum, comm, NULL), m, want, cnt);
        check_res(ncclCommDeregister(comm, h), ncclSuccess, "deregister malloc memory");
        free(m);
    }
    check_res(ncclMemFree(s), ncclSuccess, "ncclMemFree");
    check_res(ncclMemFree(r), ncclSuccess, "ncclMemFree 2");
out_comm:
    check_res(ncclCommDestroy(comm), ncclSuccess, "mem destroy");
out:
    free(want);
}

static void case_memory(void)
{
    struct world w;
    run_ranks(&w, 3, mem_rank);
}

/* ---- Bad input, NULL and dead communicators ------------------------------------------------- */

static void case_errors(void)
{
    ncclComm_t comm = NULL, dead = NULL, out = NULL;
    float buf[64];
    int v = 0;
    ncclResult_t st;

    memset(buf, 0, sizeof(buf));
    check_reject(ncclGetVersion(NULL), ncclInvalidArgument, "ncclGetVersion(NULL)");
    check_reject(ncclGetUniqueId(NULL), ncclInvalidArgument, "ncclGetUniqueId(NULL)");
    check_reject(ncclCommCount(NULL, &v), ncclInvalidArgument, "ncclCommCount(NULL comm)");
    check_reject(ncclCommUserRank(NULL, &v), ncclInvalidArgument, "ncclCommUserRank(NULL)");
    check_reject(ncclCommCuDevice(NULL, &v), ncclInvalidArgument, "ncclCommCuDevice(NULL)");
    check_reject(ncclCommGetAsyncError(NULL, &st), ncclInvalidArgument,
                 "ncclCommGetAsyncError(NULL)");
    check_reject(ncclCommFinalize(NULL), ncclInvalidArgument, "ncclCommFinalize(NULL)");
    check_reject(ncclCommSplit(NULL, 0, 0, &out, NULL), ncclInvalidArgument,
                 "ncclCommSplit(NULL)");
    check_reject(ncclSend(buf, 4, ncclFloat32, 0, NULL, NULL), ncclInvalidArgument,
                 "ncclSend(NULL comm)");
    check_reject(ncclRecv(buf, 4, ncclFloat32, 0, NULL, NULL), ncclInvalidArgument,
                 "ncclRecv(NULL comm)");
    check_reject(ncclBcast(buf, 4, ncclFloat32, 0, NULL, NULL), ncclInvalidArgument,
                 "ncclBcast(NULL comm)");
    check_reject(ncclAlltoAll(buf, buf, 4, ncclFloat32, NULL, NULL), ncclInvalidArgument,
                 "ncclAlltoAll(NULL comm)");
    check_res(ncclCommAbort(NULL), ncclSuccess, "ncclCommAbort(NULL)");
    {
        ncclRedOp_t op;
        float sc = 1;
        check_reject(ncclRedOpCreatePreMulSum(&op, &sc, ncclFloat32, ncclScalarHostImmediate,
                                              NULL),
                     ncclInvalidArgument, "ncclRedOpCreatePreMulSum(NULL comm)");
    }
    if (!check_res(init1(&comm, NULL), ncclSuccess, "errors init"))
        return;
    check_reject(ncclCommCount(comm, NULL), ncclInvalidArgument, "ncclCommCount(count NULL)");
    check_reject(ncclCommUserRank(comm, NULL), ncclInvalidArgument,
                 "ncclCommUserRank(rank NULL)");
    check_reject(ncclCommGetAsyncError(comm, NULL), ncclInvalidArgument,
                 "ncclCommGetAsyncError(NULL)");
    check_reject(ncclSend(buf, 4, ncclFloat32, 1, comm, NULL), ncclInvalidArgument,
                 "ncclSend peer == nranks");
    check_reject(ncclRecv(buf, 4, ncclFloat32, -1, comm, NULL), ncclInvalidArgument,
                 "ncclRecv peer -1");
    check_reject(ncclSend(buf, 4, (ncclDataType_t)77, 0, comm, NULL), ncclInvalidArgument,
                 "ncclSend datatype 77");
    check_reject(ncclGather(buf, buf, 4, ncclFloat32, 3, comm, NULL), ncclInvalidArgument,
                 "ncclGather root 3");
    check_reject(ncclScatter(buf, buf, 4, ncclFloat32, -2, comm, NULL), ncclInvalidArgument,
                 "ncclScatter root -2");
    check_reject(ncclBcast(buf, 4, ncclFloat32, 1, comm, NULL), ncclInvalidArgument,
                 "ncclBcast root 1");
    check_reject(ncclReduceScatter(buf, buf, 4, ncclFloat32, (ncclRedOp_t)99, comm, NULL),
                 ncclInvalidArgument, "ncclReduceScatter op 99");
    check_reject(ncclAllGather(buf, buf, 4, (ncclDataType_t)ncclNumTypes, comm, NULL),
                 ncclInvalidArgument, "ncclAllGather datatype ncclNumTypes");
    /* Counts no buffer can hold, whose byte size still fits size_t (int8): the caller's
     * mistake, not out of memory (they failed with ncclSystemError sizing the schedule). */
    {
        const size_t huge[] = {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 8, (size_t)1 << 58};
        for (int k = 0; k < 4; k++) {
            char name[96];
            size_t c = huge[k];
            snprintf(name, sizeof(name), "int8 count %zu: allreduce", c);
            check_reject(ncclAllReduce(buf, buf, c, ncclInt8, ncclSum, comm, NULL),
                         ncclInvalidArgument, name);
            snprintf(name, sizeof(name), "int8 count %zu: allgather", c);
            check_reject(ncclAllGather(buf, buf, c, ncclUint8, comm, NULL), ncclInvalidArgument,
                         name);
            snprintf(name, sizeof(name), "int8 count %zu: reducescatter", c);
            check_reject(ncclReduceScatter(buf, buf, c, ncclInt8, ncclMax, comm, NULL),
                         ncclInvalidArgument, name);
            snprintf(name, sizeof(name), "int8 count %zu: alltoall", c);
            check_reject(ncclAlltoAll(buf, buf, c, ncclInt8, comm, NULL), ncclInvalidArgument,
                         name);
            snprintf(name, sizeof(name), "int8 count %zu: broadcast", c);
            check_reject(ncclBroadcast(buf, buf, c, ncclInt8, 0, comm, NULL), ncclInvalidArgument,
                         name);
            snprintf(name, sizeof(name), "fp8 count %zu: reduce", c);
            check_reject(ncclReduce(buf, buf, c, ncclFloat8e4m3, ncclSum, 0, comm, NULL),
                         ncclInvalidArgument, name);
            snprintf(name, sizeof(name), "int8 count %zu: send to itself", c);
            check_reject(group_end(ncclGroupStart() == ncclSuccess
                                       ? ncclSend(buf, c, ncclInt8, 0, comm, NULL)
                                       : ncclInternalError),
                         ncclInvalidArgument, name);
        }
    }
    check_reject(ncclRedOpCreatePreMulSum(NULL, buf, ncclFloat32, ncclScalarHostImmediate, comm),
                 ncclInvalidArgument, "ncclRedOpCreatePreMulSum(op NULL)");
    {
        ncclRedOp_t op;
        check_reject(ncclRedOpCreatePreMulSum(&op, buf, ncclFloat32, (ncclScalarResidence_t)5,
                                              comm),
                     ncclInvalidArgument, "ncclRedOpCreatePreMulSum residence 5");
        check_reject(ncclRedOpCreatePreMulSum(&op, buf, (ncclDataType_t)40,
                                              ncclScalarHostImmediate, comm),
                     ncclInvalidArgument, "ncclRedOpCreatePreMulSum datatype 40");
    }
    check_reject(ncclCommRevoke(comm, 5), ncclInvalidArgument, "ncclCommRevoke flags 5");
    /* An error in a group makes ncclGroupEnd fail and leaves the comm usable. */
    ncclGroupStart();
    ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL);
    ncclAllReduce(buf, buf, 4, ncclFloat32, (ncclRedOp_t)77, comm, NULL);
    check_reject(ncclGroupEnd(), ncclInvalidArgument, "group with a bad call fails at end");
    check_works(comm, "comm works after a failed group");
    /* Double finalize; destroy after finalize. */
    check_res(ncclCommFinalize(comm), ncclSuccess, "ncclCommFinalize");
    check_reject(ncclCommFinalize(comm), ncclInvalidArgument, "ncclCommFinalize twice");
    check_res(ncclCommDestroy(comm), ncclSuccess, "destroy after finalize");

    /* Revoked comm: collectives refused with ncclInvalidUsage; destroy works. */
    if (check_res(init1(&comm, NULL), ncclSuccess, "revoke init")) {
        ncclResult_t res = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
        check(res == ncclSuccess || res == ncclInProgress, "ncclCommRevoke", "returned %d",
              (int)res);
        check_res(poll_async(comm, res), ncclSuccess, "ncclCommRevoke completes");
        check_reject(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL),
                     ncclInvalidUsage, "allreduce on a revoked comm -> ncclInvalidUsage");
        check_res(ncclCommDestroy(comm), ncclSuccess, "destroy a revoked comm");
    }
    /* Aborted comm: calls with the stale handle must not crash (NCCL poisons the struct). */
    if (check_res(init1(&dead, NULL), ncclSuccess, "abort init")) {
        check_res(ncclCommAbort(dead), ncclSuccess, "ncclCommAbort");
    }
}

/* ---- Threads: concurrent inits and per-rank destroy order (Megatron: many groups) ----------- */

static void multi_rank(struct world *w, int rank)
{
    const int n = w->n;
    ncclComm_t world = NULL, tp = NULL, dp = NULL;
    int32_t s[10], r[10 * MAXR], want[10 * MAXR];

    /* Concurrent init from every thread. */
    if (!check_res(ncclCommInitRank(&world, n, w->id, rank), ncclSuccess, "threads init"))
        return;
    /* Megatron-style: tensor-parallel groups of 2 (contiguous) and data-parallel (strided). */
    check_res(ncclCommSplit(world, rank / 2, rank, &tp, NULL), ncclSuccess, "tp split");
    check_res(ncclCommSplit(world, rank % 2, rank, &dp, NULL), ncclSuccess, "dp split");
    for (int i = 0; i < 10; i++)
        s[i] = pat(rank, 9, (size_t)i);
    if (tp && dp) {
        for (int k = 0; k < 2; k++) {
            ncclComm_t c = k ? dp : tp;
            int cn = 0;
            ncclCommCount(c, &cn);
            for (int q = 0; q < cn; q++) {
                int pr = k ? (rank % 2) + 2 * q : (rank / 2) * 2 + q;
                for (int i = 0; i < 10; i++)
                    want[q * 10 + i] = pat(pr, 9, (size_t)i);
            }
            report_i32(k ? "dp allgather" : "tp allgather",
                       ncclAllGather(s, r, 10, ncclInt32, c, NULL), r, want, 10 * (size_t)cn);
        }
    }
    /* Each rank destroys its comms in its own order. */
    {
        ncclComm_t order[3];
        int k = rank % 3;
        order[0] = k == 0 ? world : k == 1 ? tp : dp;
        order[1] = k == 0 ? tp : k == 1 ? dp : world;
        order[2] = k == 0 ? dp : k == 1 ? world : tp;
        for (int i = 0; i < 3; i++)
            if (order[i])
                check_res(ncclCommDestroy(order[i]), ncclSuccess, "destroy in per-rank order");
    }
}

static void case_threads(void)
{
    struct world w;
    run_ranks(&w, 8, multi_rank);
    run_ranks(&w, 6, multi_rank);
}

/* ---- Device cases ---------------------------------------------------------------------------- */

static int dev_ndev;

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    if (dv.malloc_(&p, bytes ? bytes : 1) != 0 || p == NULL) {
        printf("FAIL: device allocation of %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

/* Waits for a stream the way PyTorch's watchdog does: query the stream, and poll the comm's
 * async error while work is pending (an error there would mean abort). */
static ncclResult_t dev_wait(ncclComm_t comm, cudaStream_t st)
{
    double deadline = now_s() + 60.0;
    for (;;) {
        ncclResult_t state = ncclSuccess;
        int q = dv.stream_query(st);
        if (q == 0) {
            /* A kernel that gave up ends too: the error is the communicator's (PyTorch's
             * watchdog asks ncclCommGetAsyncError before the stream). */
            if (ncclCommGetAsyncError(comm, &state) != ncclSuccess)
                return ncclInternalError;
            return state == ncclInProgress ? ncclSuccess : state;
        }
        if (q != 600)
            return ncclUnhandledCudaError;
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess ||
            (state != ncclSuccess && state != ncclInProgress))
            return state;
        if (now_s() > deadline)
            return ncclInternalError;
        usleep(100);
    }
}

static void dev_rank(struct world *w, int rank)
{
    const int n = w->n;
    const size_t cnt = 4099;
    ncclComm_t comm = NULL;
    cudaStream_t st = NULL, st2 = NULL;
    int32_t *h = xcalloc(cnt * (size_t)n, 4), *want = xcalloc(cnt * (size_t)n, 4);
    int32_t *ds, *dr;
    int dev = -1, cudev = -1, nlater = 0;
    void *later[8], *later_mem[2] = {NULL, NULL};
    cudaStream_t later_stream = NULL;
    ncclResult_t res;

    dv.set(rank % dev_ndev);
    if (!check_res(ncclCommInitRank(&comm, n, w->id, rank), ncclSuccess, "device init"))
        goto out;
    check_res(ncclCommCuDevice(comm, &cudev), ncclSuccess, "ncclCommCuDevice");
    check(cudev == rank % dev_ndev, "comm bound to the device current at init", "device %d",
          cudev);
    dv.stream_create(&st);
    dv.stream_create(&st2);
    ds = dmalloc(cnt * 4 * (size_t)n);
    dr = dmalloc(cnt * 4 * (size_t)n);

    /* All-reduce on a stream of the comm's own; wait as PyTorch's watchdog does. */
    fill_i32(h, cnt, rank);
    for (size_t i = 0; i < cnt; i++) {
        want[i] = 0;
        for (int q = 0; q < n; q++)
            want[i] += ival(q, i) + 100 * q;
    }
    dv.memcpy_(ds, h, cnt * 4);
    res = ncclAllReduce(ds, dr, cnt, ncclInt32, ncclSum, comm, st);
    if (res == ncclSuccess)
        res = dev_wait(comm, st);
    memset(h, 0, cnt * 4);
    dv.memcpy_(h, dr, cnt * 4);
    report_i32("device allreduce on a user stream", res, h, want, cnt);

    /* Input written by another stream, ordered by an event (cudaStreamWaitEvent). */
    {
        dev_event_t ev = NULL;
        int32_t *hin = xcalloc(cnt, 4);
        for (size_t i = 0; i < cnt; i++)
            hin[i] = pat(rank, 5, i);
        for (size_t i = 0; i < cnt; i++) {
            want[i] = 0;
            for (int q = 0; q < n; q++)
                want[i] += pat(q, 5, i);
        }
        dv.event_create(&ev);
        dv.memcpy_async(ds, hin, cnt * 4, st2);
        dv.event_record(ev, st2);
        dv.stream_wait_event(st, ev);
        res = ncclAllReduce(ds, ds, cnt, ncclInt32, ncclSum, comm, st);
        if (res == ncclSuccess)
            res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
        dv.memcpy_(h, ds, cnt * 4);
        report_i32("device allreduce in place after an event from another stream", res, h,
                   want, cnt);
        dv.event_destroy(ev);
        free(hin);
    }

    /* AllGather in place, ReduceScatter in place on the device. */
    for (size_t i = 0; i < cnt * (size_t)n; i++)
        h[i] = -1;
    for (size_t i = 0; i < cnt; i++)
        h[(size_t)rank * cnt + i] = pat(rank, 6, i);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
            want[(size_t)q * cnt + i] = pat(q, 6, i);
    dv.memcpy_(dr, h, cnt * 4 * (size_t)n);
    res = ncclAllGather(dr + (size_t)rank * cnt, dr, cnt, ncclInt32, comm, st);
    if (res == ncclSuccess)
        res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
    dv.memcpy_(h, dr, cnt * 4 * (size_t)n);
    report_i32("device allgather in place", res, h, want, cnt * (size_t)n);

    for (size_t i = 0; i < cnt * (size_t)n; i++)
        h[i] = pat(rank, 7, i % 5000);
    for (size_t i = 0; i < cnt; i++) {
        want[i] = 0;
        for (int q = 0; q < n; q++)
            want[i] += pat(q, 7, ((size_t)rank * cnt + i) % 5000);
    }
    dv.memcpy_(dr, h, cnt * 4 * (size_t)n);
    res = ncclReduceScatter(dr, dr + (size_t)rank * cnt, cnt, ncclInt32, ncclSum, comm, st);
    if (res == ncclSuccess)
        res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
    dv.memcpy_(h, dr + (size_t)rank * cnt, cnt * 4);
    report_i32("device reducescatter in place", res, h, want, cnt);

    /* PreMulSum with a device scalar: read when the collective runs, so a new value written
     * between two collectives changes the second result. */
    {
        float *dsc = dmalloc(sizeof(float)), sc = (float)(rank + 1), *hf = xcalloc(cnt, 4);
        float *fin = xcalloc(cnt, 4);
        ncclRedOp_t op;
        dv.memcpy_(dsc, &sc, sizeof(sc));
        res = ncclRedOpCreatePreMulSum(&op, dsc, ncclFloat32, ncclScalarDevice, comm);
        if (check_res(res, ncclSuccess, "PreMulSum with ncclScalarDevice")) {
            for (int k = 0; k < 2; k++) {
                double tot = 0;
                int bad = -1;
                for (size_t i = 0; i < cnt; i++)
                    fin[i] = (float)(i % 7);
                for (int q = 0; q < n; q++)
                    tot += k ? 2.0 * (q + 1) : (q + 1);
                dv.memcpy_(ds, fin, cnt * 4);
                res = ncclAllReduce(ds, dr, cnt, ncclFloat32, op, comm, st);
                if (res == ncclSuccess)
                    res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
                dv.memcpy_(hf, dr, cnt * 4);
                if (check_res(res, ncclSuccess, "device-scalar PreMulSum allreduce")) {
                    for (size_t i = 0; i < cnt && bad < 0; i++)
                        if (hf[i] != (float)(tot * (double)(i % 7)))
                            bad = (int)i;
                    check(bad < 0, k ? "device scalar changed between collectives"
                                     : "device-scalar PreMulSum data",
                          "element %d: got %g, expected %g", bad,
                          bad >= 0 ? (double)hf[bad] : 0.0,
                          bad >= 0 ? tot * (double)(bad % 7) : 0.0);
                }
                sc = (float)(2 * (rank + 1));
                dv.memcpy_(dsc, &sc, sizeof(sc));
            }
            check_res(ncclRedOpDestroy(op, comm), ncclSuccess, "device-scalar op destroy");
        }
        later[nlater++] = dsc;
        free(hf);
        free(fin);
    }

    /* Ring of device send/recv and an all-to-all on the NULL stream. */
    {
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        for (size_t i = 0; i < cnt; i++) {
            h[i] = pat(rank, next, i);
            want[i] = pat(prev, rank, i);
        }
        dv.memcpy_(ds, h, cnt * 4);
        ncclGroupStart();
        ncclSend(ds, cnt, ncclInt32, next, comm, NULL);
        ncclRecv(dr, cnt, ncclInt32, prev, comm, NULL);
        res = ncclGroupEnd();
        if (res == ncclSuccess)
            res = dv.stream_sync(NULL) == 0 ? ncclSuccess : ncclUnhandledCudaError;
        dv.memcpy_(h, dr, cnt * 4);
        report_i32("device ring send/recv (NULL stream)", res, h, want, cnt);

        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < 100; i++) {
                h[(size_t)q * 100 + i] = pat(rank, q, i);
                want[(size_t)q * 100 + i] = pat(q, rank, i);
            }
        dv.memcpy_(ds, h, 100 * 4 * (size_t)n);
        res = ncclAlltoAll(ds, dr, 100, ncclInt32, comm, st);
        if (res == ncclSuccess)
            res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
        dv.memcpy_(h, dr, 100 * 4 * (size_t)n);
        report_i32("device alltoall", res, h, want, 100 * (size_t)n);
    }

    /* ncclMemAlloc with a device current (nccl-tests' buffers): filled with cudaMemcpy,
     * registered, used as both buffers of an all-reduce, then mixed with cudaMalloc memory (both
     * are device memory, as in NCCL). */
    {
        int32_t *m = NULL, *m2 = NULL;
        void *hd = NULL, *hd2 = NULL;
        res = ncclMemAlloc((void **)&m, cnt * 4);
        if (res == ncclSuccess)
            res = ncclMemAlloc((void **)&m2, cnt * 4);
        if (check_res(res, ncclSuccess, "ncclMemAlloc with a device") && m && m2) {
            fill_i32(h, cnt, rank);
            for (size_t i = 0; i < cnt; i++) {
                want[i] = 0;
                for (int q = 0; q < n; q++)
                    want[i] += ival(q, i) + 100 * q;
            }
            check(dv.memcpy_(m, h, cnt * 4) == 0, "cudaMemcpy into ncclMemAlloc memory", "failed");
            check_res(ncclCommRegister(comm, m, cnt * 4, &hd), ncclSuccess,
                      "ncclCommRegister of ncclMemAlloc memory with a device");
            check_res(ncclCommRegister(comm, m2, cnt * 4, &hd2), ncclSuccess,
                      "ncclCommRegister of ncclMemAlloc memory with a device 2");
            res = ncclAllReduce(m, m2, cnt, ncclInt32, ncclSum, comm, st);
            if (res == ncclSuccess)
                res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
            memset(h, 0, cnt * 4);
            check(dv.memcpy_(h, m2, cnt * 4) == 0, "cudaMemcpy from ncclMemAlloc memory",
                  "failed");
            report_i32("allreduce on registered ncclMemAlloc memory with a device", res, h, want,
                       cnt);
            int32_t *d = dmalloc(cnt * 4);
            res = ncclAllReduce(m, d, cnt, ncclInt32, ncclSum, comm, st);
            if (res == ncclSuccess)
                res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
            memset(h, 0, cnt * 4);
            check(dv.memcpy_(h, d, cnt * 4) == 0, "cudaMemcpy from cudaMalloc memory", "failed");
            report_i32("allreduce from ncclMemAlloc into cudaMalloc memory", res, h, want, cnt);
            later[nlater++] = d; /* freed once every rank is done (below) */
            ncclCommDeregister(comm, hd);
            ncclCommDeregister(comm, hd2);
        }
        later_mem[0] = m; /* ncclMemFree waits for the device too: freed below */
        later_mem[1] = m2;
    }
    /* cudaMalloc memory registered with ncclCommRegister (PyTorch registers its caching
     * allocator's segments), used, deregistered, used again. */
    {
        void *hs = NULL, *hr = NULL;
        fill_i32(h, cnt, rank);
        for (size_t i = 0; i < cnt; i++) {
            want[i] = 0;
            for (int q = 0; q < n; q++)
                want[i] += ival(q, i) + 100 * q;
        }
        check_res(ncclCommRegister(comm, ds, cnt * 4, &hs), ncclSuccess,
                  "ncclCommRegister of cudaMalloc memory");
        check_res(ncclCommRegister(comm, dr, cnt * 4, &hr), ncclSuccess,
                  "ncclCommRegister of cudaMalloc memory 2");
        for (int k = 0; k < 2; k++) {
            dv.memcpy_(ds, h, cnt * 4);
            res = ncclAllReduce(ds, dr, cnt, ncclInt32, ncclSum, comm, st);
            if (res == ncclSuccess)
                res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
            {
                int32_t *got = xcalloc(cnt, 4);
                dv.memcpy_(got, dr, cnt * 4);
                report_i32(k ? "allreduce after deregistration" : "allreduce on registered "
                                                                  "cudaMalloc memory",
                           res, got, want, cnt);
                free(got);
            }
            if (k == 0) {
                check_res(ncclCommDeregister(comm, hs), ncclSuccess, "deregister cudaMalloc");
                check_res(ncclCommDeregister(comm, hr), ncclSuccess, "deregister cudaMalloc 2");
            }
        }
    }
    /* A buffer of another device, and a stream of another device: refused with an error (never
     * a crash or a hang), and the comm still works after. */
    if (dev_ndev > 1) {
        int other = (rank % dev_ndev + 1) % dev_ndev;
        int32_t *od;
        cudaStream_t ost = NULL;
        dv.set(other);
        od = dmalloc(64 * 4);
        dv.stream_create(&ost);
        dv.set(rank % dev_ndev);
        check_reject(ncclAllReduce(od, dr, 64, ncclInt32, ncclSum, comm, st), ncclInvalidArgument,
                     "sendbuff of another device -> ncclInvalidArgument");
        /* NCCL's answer here is the CUDA runtime's (an event of one device recorded on a
         * stream of another); only "returns, no hang" and the comm working after are checked. */
        res = ncclAllReduce(ds, dr, 64, ncclInt32, ncclSum, comm, ost);
        if (res == ncclSuccess)
            dv.stream_sync(ost);
        fill_i32(h, cnt, rank);
        for (size_t i = 0; i < cnt; i++) {
            want[i] = 0;
            for (int q = 0; q < n; q++)
                want[i] += ival(q, i) + 100 * q;
        }
        dv.memcpy_(ds, h, cnt * 4);
        res = ncclAllReduce(ds, dr, cnt, ncclInt32, ncclSum, comm, st);
        if (res == ncclSuccess)
            res = dv.stream_sync(st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
        dv.memcpy_(h, dr, cnt * 4);
        report_i32("device comm works after refused calls", res, h, want, cnt);
        dv.stream_sync(ost);
        later[nlater++] = od;
        later_stream = ost;
    }
    dv.get(&dev);
    check(dev == rank % dev_ndev, "the caller's current device is unchanged", "device %d", dev);
    later[nlater++] = ds;
    later[nlater++] = dr;
    dv.stream_sync(st);
    check_res(ncclCommDestroy(comm), ncclSuccess, "device destroy");
out:
    /* cudaFree waits for all work of the device, and ranks share devices here: a rank freeing
     * while a peer's kernel on its device still waits for this rank would wait forever (as on a
     * GPU). Free once every rank is done. */
    pthread_barrier_wait(&w->bar);
    for (int i = 0; i < nlater; i++)
        dv.free_(later[i]);
    for (int i = 0; i < 2; i++)
        if (later_mem[i] != NULL)
            check_res(ncclMemFree(later_mem[i]), ncclSuccess, "ncclMemFree with a device");
    if (st)
        dv.stream_destroy(st);
    if (st2)
        dv.stream_destroy(st2);
    if (later_stream)
        dv.stream_destroy(later_stream);
    free(h);
    free(want);
}

/* Non-blocking comm on device buffers: init and collective polled to completion. */
static void dev_nb_rank(struct world *w, int rank)
{
    const int n = w->n;
    const size_t cnt = 2053;
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    int32_t *h = xcalloc(cnt, 4), *want = xcalloc(cnt, 4), *d;
    cudaStream_t st = NULL;
    ncclResult_t res;

    c.blocking = 0;
    dv.set(rank % dev_ndev);
    res = ncclCommInitRankConfig(&comm, n, w->id, rank, &c);
    if (!check_res(poll_async(comm, res), ncclSuccess, "device non-blocking init"))
        goto out;
    dv.stream_create(&st);
    d = dmalloc(cnt * 4);
    fill_i32(h, cnt, rank);
    for (size_t i = 0; i < cnt; i++) {
        want[i] = INT32_MAX;
        for (int q = 0; q < n; q++)
            if (ival(q, i) + 100 * q < want[i])
                want[i] = ival(q, i) + 100 * q;
    }
    dv.memcpy_(d, h, cnt * 4);
    res = ncclAllReduce(d, d, cnt, ncclInt32, ncclMin, comm, st);
    res = poll_async(comm, res);
    if (res == ncclSuccess)
        res = dev_wait(comm, st);
    dv.memcpy_(h, d, cnt * 4);
    report_i32("device allreduce on a non-blocking comm", res, h, want, cnt);
    res = ncclCommFinalize(comm);
    check_res(poll_async(comm, res), ncclSuccess, "device non-blocking finalize");
    check_res(ncclCommDestroy(comm), ncclSuccess, "device non-blocking destroy");
    pthread_barrier_wait(&w->bar); /* cudaFree waits for the device, which ranks share */
    dv.free_(d);
    dv.stream_destroy(st);
    free(h);
    free(want);
    return;
out:
    pthread_barrier_wait(&w->bar);
    free(h);
    free(want);
}

/* One thread: ncclCommInitAll on a device list in reverse order, a group over both devices
 * without setting the device per call (nccl-tests -g 2), the caller's device restored. */
static void case_device_one_thread(void)
{
    ncclComm_t comms[2] = {NULL, NULL};
    int devlist[2] = {1, 0}, dev = -1, cud = -1;
    const size_t cnt = 777;
    int32_t *d[2], *h = xcalloc(cnt, 4), *want = xcalloc(cnt, 4);
    ncclResult_t res;

    if (dev_ndev < 2)
        return;
    dv.set(0);
    if (!check_res(ncclCommInitAll(comms, 2, devlist), ncclSuccess, "ncclCommInitAll devlist"))
        goto out;
    dv.get(&dev);
    check(dev == 0, "ncclCommInitAll restores the current device", "device %d", dev);
    for (int i = 0; i < 2; i++) {
        ncclCommCuDevice(comms[i], &cud);
        check(cud == devlist[i], "ncclCommInitAll rank i on devlist[i]", "rank %d device %d", i,
              cud);
        dv.set(devlist[i]);
        d[i] = dmalloc(cnt * 4);
        fill_i32(h, cnt, i);
        dv.memcpy_(d[i], h, cnt * 4);
    }
    dv.set(0);
    for (size_t i = 0; i < cnt; i++)
        want[i] = ival(0, i) + ival(1, i) + 100;
    ncclGroupStart();
    for (int i = 0; i < 2; i++)
        ncclAllReduce(d[i], d[i], cnt, ncclInt32, ncclSum, comms[i], NULL);
    res = ncclGroupEnd();
    for (int i = 0; i < 2; i++) {
        dv.set(devlist[i]);
        if (res == ncclSuccess)
            res = dv.stream_sync(NULL) == 0 ? ncclSuccess : ncclUnhandledCudaError;
        dv.memcpy_(h, d[i], cnt * 4);
        report_i32("one-thread device group over two devices", res, h, want, cnt);
        dv.free_(d[i]);
    }
    dv.set(0);
    for (int i = 0; i < 2; i++)
        check_res(ncclCommDestroy(comms[i]), ncclSuccess, "device InitAll destroy");
out:
    free(h);
    free(want);
}

/* ---- Device sweep: what nccl-tests, PyTorch and Megatron do on device buffers ------------------
 * Every type x op (PreMulSum with a host scalar) at counts 1, 3 and 1023 with both buffers one
 * element past an aligned address (nccl-tests -u; an int8 or half tensor's view), 65537 elements
 * of the narrow types; zero counts of every collective; all-to-allv by grouped send/recv with
 * uneven and zero counts, a send to itself included; 128 sends and receives with an all-reduce in
 * one group, the sends and receives on another stream than the collective; a captured group
 * replayed with new inputs; two communicators chained by an event. */

/* Runs coll on device copies of `in` (n elements of d at offset one element) and checks the
 * result against red_want, element by element. */
static void devsweep_red(ncclComm_t comm, cudaStream_t st, int rank, int n, const struct dtype *d,
                         int op, ncclRedOp_t rop, const double *scal, size_t cnt, int coll,
                         char *dbase, char *dbase2, unsigned char *h, const char *tag)
{
    const size_t es = d->size;
    const int root = (int)(cnt % (size_t)n);
    size_t nin = coll == 1 ? cnt * (size_t)n : cnt; /* reduce-scatter: n blocks in */
    char *ds = dbase + es, *dr = dbase2 + es;
    char name[128];
    ncclResult_t res;

    if (op == ncclAvg && d->is_float && (n & (n - 1)) != 0)
        return; /* x / 3 is not exact: the sum of the rounded quotients may differ */
    for (size_t i = 0; i < nin; i++)
        put(d, h, i, red_in(d, op, rank, i));
    dv.memcpy_(ds, h, nin * es);
    memset(h, 0xa5, nin * es);
    dv.memcpy_(dr, h, cnt * es);
    if (coll == 0)
        res = ncclAllReduce(ds, dr, cnt, d->t, rop, comm, st);
    else if (coll == 1)
        res = ncclReduceScatter(ds, dr, cnt, d->t, rop, comm, st);
    else
        res = ncclReduce(ds, dr, cnt, d->t, rop, root, comm, st);
    if (res == ncclSuccess)
        res = dev_wait(comm, st);
    snprintf(name, sizeof(name), "device %s %s op %d count %zu (%s, unaligned)",
             coll == 0 ? "allreduce" : coll == 1 ? "reducescatter" : "reduce", d->name, op, cnt,
             tag);
    if (!check_res(res, ncclSuccess, name))
        return;
    dv.memcpy_(h, dr, cnt * es);
    long bad = -1;
    size_t base = coll == 1 ? (size_t)rank * cnt : 0;
    for (size_t i = 0; i < cnt && bad < 0; i++) {
        double want = coll == 2 && rank != root ? get(d, (const unsigned char[8]){0xa5, 0xa5, 0xa5,
                                                      0xa5, 0xa5, 0xa5, 0xa5, 0xa5}, 0)
                                                : red_want(d, op, n, base + i, scal);
        double got = get(d, h, i);
        if (got != want && !(isnan(got) && isnan(want)))
            bad = (long)i;
    }
    check(bad < 0, name, "element %ld: got %g, expected %g", bad,
          bad >= 0 ? get(d, h, (size_t)bad) : 0.0,
          bad >= 0 ? red_want(d, op, n, base + (size_t)bad, scal) : 0.0);
}

/* Element i of the all-to-allv block from src to dst, and that block's length. */
static size_t a2av_len(int src, int dst)
{
    return (size_t)((src * 5 + dst * 3 + 1) % 4) * 37; /* 0, 37, 74 or 111: some zero */
}

static int hs_malloc(void **p, size_t b); /* hostsweep's: dv on host memory */

static void devsweep_rank(struct world *w, int rank)
{
    const int n = w->n;
    const size_t big = 65537, maxb = (big * (size_t)MAXR + 64) * 8;
    ncclComm_t comm = NULL;
    cudaStream_t st = NULL, st2 = NULL;
    unsigned char *h = xcalloc(maxb, 1), *h2 = xcalloc(maxb, 1);
    char *d1 = NULL, *d2 = NULL, *dsc = NULL;
    double scal[MAXR];
    ncclResult_t res;

    dv.set(rank % dev_ndev);
    if (!check_res(ncclCommInitRank(&comm, n, w->id, rank), ncclSuccess, "devsweep init"))
        goto out;
    dv.stream_create(&st);
    dv.stream_create(&st2);
    d1 = dmalloc(maxb);
    d2 = dmalloc(maxb);
    /* Allocated once: cudaFree synchronizes the device, which other ranks' kernels share. */
    dsc = dmalloc(8);
    for (int q = 0; q < n; q++)
        scal[q] = (q % 2) ? 2.0 : 1.0;

    /* Every type x op x collective, unaligned, odd counts. */
    for (size_t t = 0; t < NDTYPES; t++) {
        const struct dtype *d = &dtypes[t];
        for (int op = 0; op <= ncclNumOps; op++) {
            ncclRedOp_t rop = (ncclRedOp_t)op;
            if (op == ncclNumOps) {
                unsigned char sc[8];
                put(d, sc, 0, scal[rank]);
                if (!check_res(ncclRedOpCreatePreMulSum(&rop, sc, d->t, ncclScalarHostImmediate,
                                                        comm),
                               ncclSuccess, "devsweep PreMulSum"))
                    continue;
            }
            static const size_t cnts[] = {1, 3, 1023};
            for (int c = 0; c < 3; c++)
                for (int coll = 0; coll < 3; coll++)
                    devsweep_red(comm, st, rank, n, d, op, rop, scal, cnts[c], coll, d1, d2, h,
                                 "host scalar");
            if (op == ncclSum && (d->size <= 2 || d->t == ncclFloat32))
                for (int coll = 0; coll < 3; coll++)
                    devsweep_red(comm, st, rank, n, d, op, rop, scal, big, coll, d1, d2, h,
                                 "large");
            if (op == ncclNumOps)
                check_res(ncclRedOpDestroy(rop, comm), ncclSuccess, "devsweep op destroy");
        }
        /* PreMulSum with the scalar in device memory (ncclScalarDevice), read when it runs. */
        if (dv.malloc_ != hs_malloc) {
            unsigned char sc[8];
            ncclRedOp_t rop;
            put(d, sc, 0, scal[rank]);
            dv.memcpy_(dsc, sc, d->size);
            if (check_res(ncclRedOpCreatePreMulSum(&rop, dsc, d->t, ncclScalarDevice, comm),
                          ncclSuccess, "devsweep PreMulSum, device scalar")) {
                for (int coll = 0; coll < 3; coll++)
                    devsweep_red(comm, st, rank, n, d, ncclNumOps, rop, scal, 1023, coll, d1, d2,
                                 h, "device scalar");
                check_res(ncclRedOpDestroy(rop, comm), ncclSuccess, "devsweep op destroy");
            }
        }
    }

    /* All-gather and broadcast of 1- and 2-byte types one element off, odd counts. */
    {
        static const size_t cnts[] = {1, 3, 1023, 65537};
        for (int c = 0; c < 4; c++)
            for (size_t es = 1; es <= 2; es++) {
                size_t cnt = cnts[c];
                ncclDataType_t t = es == 1 ? ncclInt8 : ncclFloat16;
                char name[96];
                for (size_t i = 0; i < cnt * es; i++)
                    h[i] = (unsigned char)(rank * 31 + i * 7);
                dv.memcpy_(d1 + es, h, cnt * es);
                res = ncclAllGather(d1 + es, d2 + es, cnt, t, comm, st);
                if (res == ncclSuccess)
                    res = dev_wait(comm, st);
                snprintf(name, sizeof(name), "device allgather %zu-byte count %zu unaligned", es,
                         cnt);
                if (check_res(res, ncclSuccess, name)) {
                    long bad = -1;
                    dv.memcpy_(h2, d2 + es, cnt * es * (size_t)n);
                    for (size_t i = 0; i < cnt * es * (size_t)n && bad < 0; i++) {
                        size_t q = i / (cnt * es), j = i % (cnt * es);
                        if (h2[i] != (unsigned char)(q * 31 + j * 7))
                            bad = (long)i;
                    }
                    check(bad < 0, name, "byte %ld: got %d", bad, bad >= 0 ? h2[bad] : 0);
                }
                int root = (int)(cnt % (size_t)n);
                for (size_t i = 0; i < cnt * es; i++)
                    h[i] = (unsigned char)(rank == root ? i * 13 + 5 : 0xee);
                dv.memcpy_(d1 + es, h, cnt * es);
                res = ncclBroadcast(d1 + es, d2 + es, cnt, t, root, comm, st);
                if (res == ncclSuccess)
                    res = dev_wait(comm, st);
                snprintf(name, sizeof(name), "device broadcast %zu-byte count %zu unaligned", es,
                         cnt);
                if (check_res(res, ncclSuccess, name)) {
                    long bad = -1;
                    dv.memcpy_(h2, d2 + es, cnt * es);
                    for (size_t i = 0; i < cnt * es && bad < 0; i++)
                        if (h2[i] != (unsigned char)(i * 13 + 5))
                            bad = (long)i;
                    check(bad < 0, name, "byte %ld: got %d", bad, bad >= 0 ? h2[bad] : 0);
                }
            }
    }

    /* Zero counts of every collective and of send/recv, on device pointers. */
    ncclGroupStart();
    res = ncclAllReduce(d1, d2, 0, ncclFloat32, ncclSum, comm, st);
    if (res == ncclSuccess)
        res = ncclBroadcast(d1, d2, 0, ncclFloat32, 0, comm, st);
    if (res == ncclSuccess)
        res = ncclReduce(d1, d2, 0, ncclFloat32, ncclMax, n - 1, comm, st);
    if (res == ncclSuccess)
        res = ncclAllGather(d1, d2, 0, ncclFloat32, comm, st);
    if (res == ncclSuccess)
        res = ncclReduceScatter(d1, d2, 0, ncclFloat32, ncclSum, comm, st);
    if (res == ncclSuccess)
        res = ncclAlltoAll(d1, d2, 0, ncclFloat32, comm, st);
    if (res == ncclSuccess)
        res = ncclSend(d1, 0, ncclFloat32, (rank + 1) % n, comm, st);
    if (res == ncclSuccess)
        res = ncclRecv(d2, 0, ncclFloat32, (rank + n - 1) % n, comm, st);
    res = group_end(res);
    if (res == ncclSuccess)
        res = dev_wait(comm, st);
    check_res(res, ncclSuccess, "device zero-count group of every collective");

    /* All-to-allv by grouped send/recv, uneven and zero counts, a block to itself included. */
    {
        size_t soff[MAXR + 1], roff[MAXR + 1];
        soff[0] = roff[0] = 0;
        for (int q = 0; q < n; q++) {
            soff[q + 1] = soff[q] + a2av_len(rank, q);
            roff[q + 1] = roff[q] + a2av_len(q, rank);
        }
        int32_t *hs = (int32_t *)h, *hr = (int32_t *)h2;
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < a2av_len(rank, q); i++)
                hs[soff[q] + i] = pat(rank, q, i);
        dv.memcpy_(d1, hs, soff[n] * 4);
        ncclGroupStart();
        res = ncclSuccess;
        for (int q = 0; q < n && res == ncclSuccess; q++) {
            res = ncclSend((int32_t *)d1 + soff[q], a2av_len(rank, q), ncclInt32, q, comm, st);
            if (res == ncclSuccess)
                res = ncclRecv((int32_t *)d2 + roff[q], a2av_len(q, rank), ncclInt32, q, comm,
                               st);
        }
        res = group_end(res);
        if (res == ncclSuccess)
            res = dev_wait(comm, st);
        if (check_res(res, ncclSuccess, "device all-to-allv (uneven, zero and self blocks)")) {
            long bad = -1;
            dv.memcpy_(hr, d2, roff[n] * 4);
            for (int q = 0; q < n && bad < 0; q++)
                for (size_t i = 0; i < a2av_len(q, rank) && bad < 0; i++)
                    if (hr[roff[q] + i] != pat(q, rank, i))
                        bad = (long)(roff[q] + i);
            check(bad < 0, "device all-to-allv data", "element %ld: got %d", bad,
                  bad >= 0 ? hr[bad] : 0);
        }
    }

    /* 128 sends and 128 receives (to the next and from the previous rank, 64 each way round)
     * with an all-reduce in one group; p2p on st2, the collective on st. */
    {
        const int nops = 64;
        const size_t m = 19;
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        int32_t *hs = (int32_t *)h, *hr = (int32_t *)h2;
        for (int k = 0; k < 2 * nops; k++)
            for (size_t i = 0; i < m; i++)
                hs[(size_t)k * m + i] = pat(rank, k, i);
        float *fin = (float *)(d1 + 4 * m * 2 * (size_t)nops), *fout = (float *)(d2 + 4 * m * 2 *
                                                                                 (size_t)nops);
        float hf[333];
        for (int i = 0; i < 333; i++)
            hf[i] = (float)(rank + i % 7);
        dv.memcpy_(d1, hs, 2 * (size_t)nops * m * 4);
        dv.memcpy_(fin, hf, sizeof(hf));
        ncclGroupStart();
        res = ncclSuccess;
        for (int k = 0; k < nops && res == ncclSuccess; k++) {
            res = ncclSend((int32_t *)d1 + (size_t)k * m, m, ncclInt32, next, comm, st2);
            if (res == ncclSuccess)
                res = ncclRecv((int32_t *)d2 + (size_t)k * m, m, ncclInt32, prev, comm, st2);
            if (res == ncclSuccess)
                res = ncclSend((int32_t *)d1 + (size_t)(nops + k) * m, m, ncclInt32, prev, comm,
                               st2);
            if (res == ncclSuccess)
                res = ncclRecv((int32_t *)d2 + (size_t)(nops + k) * m, m, ncclInt32, next, comm,
                               st2);
            if (k == nops / 2 && res == ncclSuccess)
                res = ncclAllReduce(fin, fout, 333, ncclFloat32, ncclSum, comm, st);
        }
        res = group_end(res);
        if (res == ncclSuccess)
            res = dev_wait(comm, st);
        if (res == ncclSuccess)
            res = dev_wait(comm, st2);
        if (check_res(res, ncclSuccess, "device group of 256 p2p ops and an allreduce")) {
            long bad = -1;
            dv.memcpy_(hr, d2, 2 * (size_t)nops * m * 4);
            for (int k = 0; k < 2 * nops && bad < 0; k++)
                for (size_t i = 0; i < m && bad < 0; i++)
                    if (hr[(size_t)k * m + i] != pat(k < nops ? prev : next, k, i))
                        bad = (long)((size_t)k * m + i);
            check(bad < 0, "device 256 p2p ops data", "rank %d of %d, element %ld: got %d", rank,
                  n, bad, bad >= 0 ? hr[bad] : 0);
            dv.memcpy_(hf, fout, sizeof(hf));
            bad = -1;
            for (int i = 0; i < 333 && bad < 0; i++)
                if (hf[i] != (float)(n * (n - 1) / 2 + n * (i % 7)))
                    bad = i;
            check(bad < 0, "device allreduce inside the p2p group", "element %ld: got %g", bad,
                  bad >= 0 ? (double)hf[bad] : 0.0);
        }
    }

    /* The all-reduce's input still being copied on st when a group puts it with sends and
     * receives on st2: the collective waits for the copy (the emulated GPU's event released the
     * launch when st2's record ran: sums of zeros). */
    {
        const size_t m = 1u << 19, tail = 1024; /* 2 MiB: within d1 and d2 (maxb) */
        float *hf = xcalloc(m, 4), *din = (float *)d1, *dout = (float *)d2 + m;
        int32_t *p2 = (int32_t *)d2;
        for (int rep = 0; rep < 3; rep++) {
            for (size_t i = 0; i < m; i++)
                hf[i] = (float)(rank + rep + 1);
            dv.memcpy_async(din, hf, m * 4, st);
            ncclGroupStart();
            res = ncclAllReduce(din + m - tail, dout, tail, ncclFloat32, ncclSum, comm, st);
            if (res == ncclSuccess)
                res = ncclSend((int32_t *)d1 + m, 1, ncclInt32, (rank + 1) % n, comm, st2);
            if (res == ncclSuccess)
                res = ncclRecv(p2, 1, ncclInt32, (rank + n - 1) % n, comm, st2);
            res = group_end(res);
            if (res == ncclSuccess)
                res = dev_wait(comm, st);
            if (res == ncclSuccess)
                res = dev_wait(comm, st2);
            if (check_res(res, ncclSuccess, "allreduce of an input copied on its stream")) {
                long bad = -1;
                float want = (float)(n * (n - 1) / 2 + n * (rep + 1));
                dv.memcpy_(hf, dout, tail * 4);
                for (size_t i = 0; i < tail && bad < 0; i++)
                    if (hf[i] != want)
                        bad = (long)i;
                check(bad < 0, "allreduce waits for its stream's copy (other ops on st2)",
                      "rank %d rep %d element %ld: got %g, expected %g", rank, rep, bad,
                      bad >= 0 ? (double)hf[bad] : 0.0, (double)want);
            }
        }
        free(hf);
    }

    /* A captured group (ring send/recv and an all-reduce) replayed 3 times with new inputs. */
    {
        const size_t m = 1001;
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        int32_t *hs = (int32_t *)h, *hr = (int32_t *)h2;
        int32_t *s = (int32_t *)d1, *r = (int32_t *)d2, *ar = (int32_t *)d2 + m;
        dev_graph_t g = NULL;
        /* Capture is in CUDA's global mode: no rank thread may copy synchronously meanwhile. */
        pthread_barrier_wait(&w->bar);
        int ok = dv.begin_capture(st) == 0;
        if (ok) {
            ncclGroupStart();
            res = ncclSend(s, m, ncclInt32, next, comm, st);
            if (res == ncclSuccess)
                res = ncclRecv(r, m, ncclInt32, prev, comm, st);
            if (res == ncclSuccess)
                res = ncclAllReduce(s, ar, m, ncclInt32, ncclSum, comm, st);
            res = group_end(res);
            ok = dv.end_capture(st, &g) == 0 && g != NULL;
            check(ok && res == ncclSuccess, "device group captured", "res %d, capture %d", res,
                  ok);
        }
        pthread_barrier_wait(&w->bar);
        for (int rep = 0; ok && rep < 3; rep++) {
            for (size_t i = 0; i < m; i++)
                hs[i] = pat(rank, rep, i);
            dv.memcpy_(s, hs, m * 4);
            res = dv.graph_launch(g, st) == 0 ? ncclSuccess : ncclUnhandledCudaError;
            if (res == ncclSuccess)
                res = dev_wait(comm, st);
            char name[64];
            snprintf(name, sizeof(name), "captured group replay %d", rep);
            if (!check_res(res, ncclSuccess, name))
                break;
            dv.memcpy_(hr, r, m * 4);
            dv.memcpy_(hr + m, ar, m * 4);
            long bad = -1;
            for (size_t i = 0; i < m && bad < 0; i++) {
                int32_t sum = 0;
                for (int q = 0; q < n; q++)
                    sum += pat(q, rep, i);
                if (hr[i] != pat(prev, rep, i) || hr[m + i] != sum)
                    bad = (long)i;
            }
            check(bad < 0, name, "element %ld: recv %d sum %d", bad, bad >= 0 ? hr[bad] : 0,
                  bad >= 0 ? hr[m + bad] : 0);
        }
        if (g != NULL)
            dv.graph_destroy(g);
    }

    /* Two communicators chained by an event: a child (split, keys reversed) reduces on st2
     * what the parent reduced on st. */
    {
        ncclComm_t child = NULL;
        const size_t m = 4097;
        int32_t *hs = (int32_t *)h, *hr = (int32_t *)h2;
        res = ncclCommSplit(comm, 0, n - rank, &child, NULL);
        if (check_res(res, ncclSuccess, "devsweep split (keys reversed)")) {
            int crank = -1;
            ncclCommUserRank(child, &crank);
            check(crank == n - 1 - rank, "reversed keys reverse the ranks", "rank %d -> %d",
                  rank, crank);
            dev_event_t ev = NULL;
            dv.event_create(&ev);
            for (size_t i = 0; i < m; i++)
                hs[i] = ival(rank, i);
            dv.memcpy_(d1, hs, m * 4);
            res = ncclAllReduce(d1, d2, m, ncclInt32, ncclSum, comm, st);
            dv.event_record(ev, st);
            dv.stream_wait_event(st2, ev);
            if (res == ncclSuccess)
                res = ncclAllReduce(d2, d1, m, ncclInt32, ncclSum, child, st2);
            if (res == ncclSuccess)
                res = dev_wait(child, st2);
            if (check_res(res, ncclSuccess, "event chain parent -> child")) {
                long bad = -1;
                dv.memcpy_(hr, d1, m * 4);
                for (size_t i = 0; i < m && bad < 0; i++) {
                    int32_t sum = 0;
                    for (int q = 0; q < n; q++)
                        sum += ival(q, i);
                    if (hr[i] != sum * n)
                        bad = (long)i;
                }
                check(bad < 0, "event chain data", "element %ld: got %d", bad,
                      bad >= 0 ? hr[bad] : 0);
            }
            dv.event_destroy(ev);
            check_res(ncclCommDestroy(child), ncclSuccess, "devsweep child destroy");
        }
    }

    check_res(ncclCommFinalize(comm), ncclSuccess, "devsweep finalize");
    check_res(ncclCommDestroy(comm), ncclSuccess, "devsweep destroy");
out:
    if (dsc != NULL)
        dv.free_(dsc);
    if (d1 != NULL)
        dv.free_(d1);
    if (d2 != NULL)
        dv.free_(d2);
    if (st != NULL)
        dv.stream_destroy(st);
    if (st2 != NULL)
        dv.stream_destroy(st2);
    free(h);
    free(h2);
}

/* The device sweep's calls on host memory: dv's slots done by the C library, every stream
 * NULL (each call complete on return), no capture (that part is skipped). */
static int hs_malloc(void **p, size_t b)
{
    *p = malloc(b);
    return *p != NULL ? 0 : 2;
}
static int hs_free(void *p)
{
    free(p);
    return 0;
}
static int hs_memcpy(void *d, const void *src, size_t b)
{
    memcpy(d, src, b);
    return 0;
}
static int hs_memcpy_async(void *d, const void *src, size_t b, cudaStream_t st)
{
    (void)st;
    return hs_memcpy(d, src, b);
}
static int hs_stream_create(cudaStream_t *st)
{
    *st = NULL;
    return 0;
}
static int hs_stream(cudaStream_t st)
{
    (void)st;
    return 0;
}
static int hs_int(int i)
{
    (void)i;
    return 0;
}
static int hs_get(int *i)
{
    *i = 0;
    return 0;
}
static int hs_event_create(dev_event_t *e)
{
    *e = NULL;
    return 0;
}
static int hs_event(dev_event_t e)
{
    (void)e;
    return 0;
}
static int hs_event_stream(dev_event_t e, cudaStream_t st)
{
    (void)e, (void)st;
    return 0;
}
static int hs_stream_event(cudaStream_t st, dev_event_t e)
{
    (void)e, (void)st;
    return 0;
}
static int hs_no_capture(cudaStream_t st)
{
    (void)st;
    return 1;
}

/* Installs the host slots in dv (the device ones are saved in *saved). */
static void hostsweep_begin(void *saved, size_t len)
{
    memcpy(saved, &dv, len);
    dv.set = hs_int;
    dv.get = hs_get;
    dv.malloc_ = hs_malloc;
    dv.free_ = hs_free;
    dv.memcpy_ = hs_memcpy;
    dv.memcpy_async = hs_memcpy_async;
    dv.stream_create = hs_stream_create;
    dv.stream_destroy = hs_stream;
    dv.stream_sync = hs_stream;
    dv.stream_query = hs_stream;
    dv.event_create = hs_event_create;
    dv.event_record = hs_event_stream;
    dv.event_destroy = hs_event;
    dv.stream_wait_event = hs_stream_event;
    dv.begin_capture = hs_no_capture;
    dev_ndev = 1;
}

static void hostsweep_rank(struct world *w, int rank)
{
    devsweep_rank(w, rank);
}

/* A process's own: the host slots for this rank's run only. */
static void hostsweep_proc_rank(struct world *w, int rank)
{
    char saved[sizeof(dv)];
    int ndev = dev_ndev;
    hostsweep_begin(saved, sizeof(saved));
    devsweep_rank(w, rank);
    memcpy(&dv, saved, sizeof(dv));
    dev_ndev = ndev;
}

static void case_hostsweep(void)
{
    struct world w;
    char saved[sizeof(dv)];
    hostsweep_begin(saved, sizeof(saved));
    run_ranks(&w, 4, hostsweep_rank);
    run_ranks(&w, 3, hostsweep_rank);
    memcpy(&dv, saved, sizeof(dv));
}

static void case_devsweep(void)
{
    struct world w;
    dev_ndev = dev_load();
    if (dev_ndev == 0) {
        printf("devsweep skipped: no device backend (run with WEFT_CUDA=emu:2)\n");
        return;
    }
    run_ranks(&w, 4, devsweep_rank); /* 3 and 5 ranks: as processes (abi_conform_sweep-emu-*) */
}

static void case_device(void)
{
    struct world w;
    dev_ndev = dev_load();
    if (dev_ndev == 0) {
        printf("device cases skipped: no device backend (run with WEFT_CUDA=emu:2)\n");
        return;
    }
    run_ranks(&w, 4, dev_rank);
    run_ranks(&w, 3, dev_nb_rank);
    case_device_one_thread();
}

/* ---- Ranks as processes, launched the way users do it ------------------------------------------
 * -p N (MPI style): N processes; rank 0 calls ncclGetUniqueId and sends the 128 bytes to the others
 * (MPI_Bcast in a real program; a pipe per rank here), so the root lives in rank 0's process.
 * -e N (no launcher): NCCL_COMM_ID=127.0.0.1:PORT in every process's environment, and each calls
 * ncclGetUniqueId itself; rank 0 runs the root inside its init.
 * The parent calls no NCCL function (the children read the environment fresh). */

static void mp_body(int rank, int n, ncclUniqueId id)
{
    const size_t cnt = 100003;
    ncclComm_t comm = NULL, child = NULL;
    int32_t *s = xcalloc(cnt, 4), *r = xcalloc(cnt, 4), *want = xcalloc(cnt, 4);
    ncclResult_t res, state = ncclInternalError;
    int ndev = dev_load();

    if (ndev > 0)
        dv.set(rank % ndev);
    if (!check_res(ncclCommInitRank(&comm, n, id, rank), ncclSuccess, "process init"))
        goto out;
    check_res(ncclCommGetAsyncError(comm, &state), ncclSuccess, "process async error");
    check(state == ncclSuccess, "async state after init", "%d", (int)state);

    fill_i32(s, cnt, rank);
    for (size_t i = 0; i < cnt; i++) {
        want[i] = 0;
        for (int q = 0; q < n; q++)
            want[i] += ival(q, i) + 100 * q;
    }
    report_i32("process allreduce", ncclAllReduce(s, r, cnt, ncclInt32, ncclSum, comm, NULL), r,
               want, cnt);
    for (size_t i = 0; i < cnt; i++) {
        s[i] = rank == n - 1 ? pat(n - 1, 1, i) : -1;
        want[i] = pat(n - 1, 1, i);
    }
    report_i32("process broadcast root n-1",
               ncclBroadcast(s, s, cnt, ncclInt32, n - 1, comm, NULL), s, want, cnt);
    {
        int next = (rank + 1) % n, prev = (rank + n - 1) % n;
        for (size_t i = 0; i < cnt; i++) {
            s[i] = pat(rank, next, i);
            want[i] = pat(prev, rank, i);
        }
        ncclGroupStart();
        res = ncclSend(s, cnt, ncclInt32, next, comm, NULL);
        if (res == ncclSuccess)
            res = ncclRecv(r, cnt, ncclInt32, prev, comm, NULL);
        report_i32("process ring", group_end(res), r, want, cnt);
    }
    if (check_res(ncclCommSplit(comm, rank % 2, -rank, &child, NULL), ncclSuccess,
                  "process split") &&
        child != NULL) {
        int members[MAXR], nm = 0;
        for (int q = n - 1; q >= 0; q--)
            if (q % 2 == rank % 2)
                members[nm++] = q;
        check_members(child, rank, members, nm, "process split members");
    }
    if (ndev > 0) {
        /* Device buffers in each process, on device rank % ndev, with a user stream. */
        cudaStream_t st = NULL;
        int32_t *d = dmalloc(cnt * 4);
        dv.stream_create(&st);
        fill_i32(s, cnt, rank);
        for (size_t i = 0; i < cnt; i++) {
            want[i] = INT32_MIN;
            for (int q = 0; q < n; q++)
                if (ival(q, i) + 100 * q > want[i])
                    want[i] = ival(q, i) + 100 * q;
        }
        dv.memcpy_(d, s, cnt * 4);
        res = ncclAllReduce(d, d, cnt, ncclInt32, ncclMax, comm, st);
        if (res == ncclSuccess)
            res = dev_wait(comm, st);
        dv.memcpy_(r, d, cnt * 4);
        report_i32("process device allreduce", res, r, want, cnt);
        /* Rank 0 leaves (destroys the communicator, its process exits) while rank 2's kernel
         * waits for a late send of rank 1: a peer that left is no crash, rank 2 gets its data
         * (the device path's watch took rank 0 for dead and aborted rank 2's kernel). */
        if (n >= 3 && rank >= 1 && rank <= 2) {
            const size_t m = 4099;
            for (size_t i = 0; i < m; i++)
                s[i] = pat(1, 2, i);
            dv.memcpy_(d, s, m * 4);
            if (rank == 1) {
                usleep(700000);
                res = ncclSend(d, m, ncclInt32, 2, comm, st);
            } else {
                res = ncclRecv(d + m, m, ncclInt32, 1, comm, st);
            }
            if (res == ncclSuccess)
                res = dev_wait(comm, st);
            if (rank == 2) {
                dv.memcpy_(r, d + m, m * 4);
                report_i32("device recv while a peer that left has exited", res, r, s, m);
            } else {
                check_res(res, ncclSuccess, "device send after a peer left");
            }
        }
        dv.stream_destroy(st);
        dv.free_(d);
    }
    /* Destroy order differs per rank. */
    if (rank % 2) {
        check_res(ncclCommDestroy(comm), ncclSuccess, "process destroy parent");
        if (child)
            check_res(ncclCommDestroy(child), ncclSuccess, "process destroy child");
    } else {
        if (child)
            check_res(ncclCommDestroy(child), ncclSuccess, "process destroy child");
        check_res(ncclCommDestroy(comm), ncclSuccess, "process destroy parent");
    }
out:
    free(s);
    free(r);
    free(want);
}

static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t k = read(fd, (char *)buf + got, len - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* The rank bodies of the thread cases that need nothing but their world's id and size, run with
 * ranks as processes by -s N (one fresh id each, from rank 0); devsweep where a device is. */
static const struct {
    const char *name;
    rank_fn fn;
    int device;         /* needs a device */
    int min_n, max_n;   /* the rank counts it is written for */
} proc_bodies[] = {
    /* reductions: its inputs keep every sum exact in every type up to 5 ranks (e5m2: 9 no) */
    {"reductions", red_rank, 0, 1, 5}, {"p2p", p2p_rank, 0, 1, MAXR},
    {"inplace", inplace_rank, 0, 1, MAXR}, {"corners", corners_rank, 0, 1, MAXR},
    {"memory", mem_rank, 0, 1, MAXR}, {"split", split_rank, 0, 6, 6},
    {"devsweep", devsweep_rank, 1, 1, 5}, /* its reductions: as reductions */
    {"hostsweep", hostsweep_proc_rank, 0, 1, 5},
};
#define NPROC_BODIES (sizeof(proc_bodies) / sizeof(proc_bodies[0]))

static void proc_sweep(int rank, int n, const ncclUniqueId *ids)
{
    int ndev = dev_load();
    for (size_t b = 0; b < NPROC_BODIES; b++) {
        struct world w;
        int f0 = n_fail;
        double t0 = now_s();
        if ((proc_bodies[b].device && ndev == 0) || n < proc_bodies[b].min_n ||
            n > proc_bodies[b].max_n)
            continue;
        memset(&w, 0, sizeof(w));
        w.n = n;
        w.id = ids[b];
        pthread_barrier_init(&w.bar, NULL, 1); /* capture's global mode spans one process */
        dev_ndev = ndev;
        cur_case = proc_bodies[b].name;
        proc_bodies[b].fn(&w, rank);
        pthread_barrier_destroy(&w.bar);
        if (rank == 0)
            printf("%s %s as %d processes (%.2f s)\n", n_fail == f0 ? "ok  " : "FAIL",
                   proc_bodies[b].name, n, now_s() - t0);
    }
}

/* Rank 0 of the processes makes a unique id and writes it to every other rank's pipe; the others
 * read it (a rank that cannot exits). */
static void share_id(int r, int n, int pipes[][2], ncclUniqueId *id)
{
    if (r == 0) {
        check_res(ncclGetUniqueId(id), ncclSuccess, "rank 0 ncclGetUniqueId");
        for (int q = 1; q < n; q++)
            if (write(pipes[q][1], id, sizeof(*id)) != (ssize_t)sizeof(*id))
                check(0, "send the id", "write to rank %d", q);
    } else if (read_full(pipes[r][0], id, sizeof(*id)) != 0) {
        check(0, "receive the id", "rank %d", r);
        _exit(1);
    }
}

/* sweep: run proc_sweep (ids from rank 0 through the pipes) instead of mp_body. */
static int run_processes(int n, int commid, int sweep)
{
    int pipes[MAXR][2];
    pid_t pid[MAXR];
    int failed = 0;

    if (n < 1 || n > MAXR) {
        fprintf(stderr, "1 <= N <= %d\n", MAXR);
        return 2;
    }
    if (commid) {
        char v[64];
        int port = weft_test_free_port();
        if (port == 0) {
            printf("FAIL: no free port for NCCL_COMM_ID\n");
            return 1;
        }
        snprintf(v, sizeof(v), "127.0.0.1:%d", port);
        setenv("NCCL_COMM_ID", v, 1);
    }
    for (int r = 0; r < n; r++)
        if (pipe(pipes[r]) != 0)
            return 1;
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            ncclUniqueId id, ids[NPROC_BODIES];
            memset(&id, 0, sizeof(id));
            alarm(TIMEOUT_S);
            if (sweep) {
                for (size_t b = 0; b < NPROC_BODIES; b++)
                    share_id(r, n, pipes, &ids[b]);
                proc_sweep(r, n, ids);
                printf("rank %d: %d passed, %d failed\n", r, n_pass, n_fail);
                fflush(stdout);
                _exit(n_fail ? 1 : 0);
            }
            if (commid) {
                /* Every process computes the same id from NCCL_COMM_ID. */
                check_res(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId from NCCL_COMM_ID");
            } else {
                share_id(r, n, pipes, &id);
            }
            mp_body(r, n, id);
            printf("rank %d: %d passed, %d failed\n", r, n_pass, n_fail);
            fflush(stdout);
            _exit(n_fail ? 1 : 0);
        }
        if (pid[r] < 0)
            return 1;
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        if (waitpid(pid[r], &st, 0) != pid[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("FAIL: rank %d exited with status 0x%x\n", r, st);
            failed = 1;
        }
    }
    return failed;
}

/* ---- Lifecycle corners ----------------------------------------------------------------------- */

/* Every rank passes NCCL_SPLIT_NOCOLOR: the split succeeds and every *newcomm is NULL. */
static void nocolor_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL, child = (ncclComm_t)&child;
    if (!check_res(ncclCommInitRank(&comm, w->n, w->id, rank), ncclSuccess, "nocolor init"))
        return;
    check_res(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, rank, &child, NULL), ncclSuccess,
              "split with every rank NCCL_SPLIT_NOCOLOR");
    check(child == NULL, "every rank NOCOLOR: *newcomm NULL", "%p", (void *)child);
    {
        int members[MAXR];
        for (int q = 0; q < w->n; q++)
            members[q] = q;
        check_members(comm, rank, members, w->n, "parent works after an all-NOCOLOR split");
    }
    ncclCommDestroy(comm);
}

/* Ranks disagreeing on nranks: an error on each (NCCL's root refuses the mismatch), no hang. */
static void nranks_mismatch_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRank(&comm, rank == 0 ? 2 : 3, w->id, rank);
    check(res != ncclSuccess, "init with ranks disagreeing on nranks fails",
          "rank %d returned %d", rank, (int)res);
    if (res == ncclSuccess)
        ncclCommDestroy(comm);
}

/* Group state is per thread: an open group on one thread does not defer another's calls. */
static void group_thread_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL;
    if (!check_res(init1(&comm, NULL), ncclSuccess, "per-thread group init"))
        return;
    if (rank == 0) {
        ncclGroupStart();
        pthread_barrier_wait(&w->bar); /* rank 1 runs its call while this group is open */
        pthread_barrier_wait(&w->bar);
        check_res(ncclGroupEnd(), ncclSuccess, "the open group's end");
    } else {
        pthread_barrier_wait(&w->bar);
        check_works(comm, "a call on another thread while a group is open runs at once");
        pthread_barrier_wait(&w->bar);
    }
    ncclCommDestroy(comm);
}

/* ncclCommAbort from another thread while a blocking collective waits for a peer that never
 * calls (PyTorch's watchdog): the waiting call returns an error promptly, abort returns. */
static ncclComm_t abort_target;
static volatile int abort_returned;

static void abort_rank(struct world *w, int rank)
{
    ncclComm_t comm = NULL;
    if (!check_res(ncclCommInitRank(&comm, 2, w->id, rank), ncclSuccess, "abort-stuck init")) {
        pthread_barrier_wait(&w->bar);
        return;
    }
    if (rank == 0) {
        int32_t s[1000], r[1000];
        double t0;
        ncclResult_t res;
        memset(s, 0, sizeof(s));
        abort_target = comm;
        pthread_barrier_wait(&w->bar);
        t0 = now_s();
        res = ncclAllReduce(s, r, 1000, ncclInt32, ncclSum, comm, NULL);
        check(res != ncclSuccess, "a collective stuck on a silent peer fails on abort",
              "returned %d", (int)res);
        check(now_s() - t0 < 15.0, "the stuck collective returns promptly after abort",
              "%.1f s", now_s() - t0);
        /* ncclGetLastError(NULL): this thread's last message (the comm's is gone with it). */
        const char *msg = ncclGetLastError(NULL);
        check(msg != NULL && strstr(msg, "aborted") != NULL &&
                  strstr(msg, "for data from peer 1 (in this process)") != NULL,
              "the abort's message names the peer waited for", "\"%s\"", msg ? msg : "(null)");
    } else {
        /* Rank 1 never calls the all-reduce: it aborts rank 0's comm, then its own. */
        pthread_barrier_wait(&w->bar);
        usleep(300000);
        check_res(ncclCommAbort(abort_target), ncclSuccess, "ncclCommAbort of a stuck comm");
        check_res(ncclCommAbort(comm), ncclSuccess, "ncclCommAbort of the silent rank");
    }
}

static void case_lifecycle(void)
{
    struct world w;
    ncclComm_t two[2] = {NULL, NULL};
    run_ranks(&w, 3, nocolor_rank);
    run_ranks(&w, 2, nranks_mismatch_rank);
    run_ranks(&w, 2, group_thread_rank);
    run_ranks(&w, 2, abort_rank);
    {
        int dup[2] = {0, 0};
        check_reject(ncclCommInitAll(two, 2, dup), ncclInvalidUsage,
                     "ncclCommInitAll with a device twice -> ncclInvalidUsage");
    }
    if (dev_load() > 0) {
        int bad[2] = {0, 999};
        check_reject(ncclCommInitAll(two, 2, bad), ncclInvalidArgument,
                     "ncclCommInitAll with a device that does not exist -> ncclInvalidArgument");
    }
}

/* ---- Main -------------------------------------------------------------------------------------- */

/* Weft's library is the one loaded (abi_util.h), and its version is the header's. */
static void check_library_and_version(void)
{
    int version = 0;

    check_library_identity();
    check_res(ncclGetVersion(&version), ncclSuccess, "ncclGetVersion");
    check(version == NCCL_VERSION_CODE, "ncclGetVersion == header", "%d", version);
}

struct conform_case {
    const char *name;
    void (*fn)(void);
};

static const struct conform_case cases[] = {
    {"error_strings", case_error_strings},
    {"config", case_config},
    {"nonblocking", case_nonblocking},
    {"abort_pending_init", case_abort_pending_init},
    {"nonblocking_early", case_nonblocking_early},
    {"split_config", case_split_config},
    {"corners", case_corners},
    {"scalable", case_scalable},
    {"split", case_split},
    {"shrink", case_shrink},
    {"p2p", case_p2p},
    {"inplace", case_inplace},
    {"simulate", case_simulate},
    {"one_thread", case_one_thread},
    {"mixed_group", case_mixed_group},
    {"reductions", case_reductions},
    {"memory", case_memory},
    {"errors", case_errors},
    {"threads", case_threads},
    {"device", case_device},
    {"devsweep", case_devsweep},
    {"hostsweep", case_hostsweep},
    {"lifecycle", case_lifecycle},
};

int main(int argc, char **argv)
{
    const char *only = NULL;
    int opt;

    while ((opt = getopt(argc, argv, "c:p:e:s:")) != -1) {
        if (opt == 'c') {
            only = optarg;
        } else if (opt == 'p' || opt == 'e' || opt == 's') {
            setvbuf(stdout, NULL, _IOLBF, 0);
            return run_processes(atoi(optarg), opt == 'e', opt == 's');
        } else {
            fprintf(stderr, "usage: %s [-c CASE | -p N | -e N | -s N]\n", argv[0]);
            return 2;
        }
    }
    signal(SIGALRM, on_alarm);
    alarm(TIMEOUT_S);
    setvbuf(stdout, NULL, _IOLBF, 0);
    check_library_and_version();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double t0 = now_s();
        int f0 = n_fail;
        if (only && !strstr(cases[i].name, only))
            continue;
        cur_case = cases[i].name;
        cases[i].fn();
        printf("%s %s (%.2f s)\n", n_fail == f0 ? "ok  " : "FAIL", cases[i].name,
               now_s() - t0);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif /* ABI_HAVE_TOOLKIT */
