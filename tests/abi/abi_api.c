/*
 * ABI API test: a multi-process NCCL user built like abi_client (the CUDA toolkit's nccl.h, linked
 * to the toolkit's libnccl.so.2, run with LD_LIBRARY_PATH on Weft's build directory).
 *
 * Usage: abi_api -n N. The parent checks which libnccl.so.2 was loaded, makes the ncclUniqueId,
 * forks N rank processes (they inherit the id) and stays alive while they run, as the process
 * that made an id may own its bootstrap root. Each rank uses host (malloc) buffers and the NULL
 * stream, and compares every element with a plain loop:
 *   ring send/recv in a group; ncclAlltoAll and the same exchange from grouped send/recv;
 *   ncclGather/ncclScatter at roots 0 and n-1; nested groups; a non-blocking communicator
 *   (init, all-reduce, finalize polled through ncclCommGetAsyncError); PreMulSum with host
 *   scalars; ncclCommSplit (color rank % 2, one NCCL_SPLIT_NOCOLOR rank when n >= 3).
 * Every rank issues every collective even after a local mismatch, so a wrong answer on one rank
 * does not hang the others; a rank that dies or times out gets its peers killed after a grace.
 *
 * Env: WEFT_ABI_EXPECT_DIR, when set, is the directory the loaded libnccl.so.2 must come from.
 * Exit: 0 all passed, 1 a failure, 2 bad usage, 77 toolkit header absent at build time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The build passes the toolkit header's path as ABI_NCCL_H (see abi_client.c). */
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
#error "abi_api must be compiled against the CUDA toolkit's nccl.h, not Weft's"
#endif

#define MAX_RANKS 64
#define RANK_TIMEOUT_S 100   /* a rank's own alarm */
#define PARENT_TIMEOUT_S 110 /* the parent kills what is left (meson's limit is 120) */
#define GRACE_S 20           /* after one rank failed, how long its peers may still run */

/* Pass/fail counts of one process; ranks keep theirs in memory shared with the parent. */
struct counts {
    int pass;
    int fail;
};

static struct counts parent_counts;
static struct counts *counts = &parent_counts;
static char tag[32] = "main";

static void check(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One write per line, so lines of different ranks do not interleave. */
static void check(int ok, const char *name, const char *fmt, ...)
{
    char line[1024];
    int len;

    if (ok) {
        counts->pass++;
        len = snprintf(line, sizeof(line), "PASS: [%s] %s\n", tag, name);
    } else {
        va_list ap;
        counts->fail++;
        len = snprintf(line, sizeof(line), "FAIL: [%s] %s: ", tag, name);
        if (len > 0 && (size_t)len < sizeof(line)) {
            va_start(ap, fmt);
            len += vsnprintf(line + len, sizeof(line) - (size_t)len, fmt, ap);
            va_end(ap);
        }
        if (len < 0 || (size_t)len >= sizeof(line) - 1)
            len = (int)sizeof(line) - 2;
        line[len++] = '\n';
        line[len] = '\0';
    }
    if (len > (int)sizeof(line) - 1)
        len = (int)sizeof(line) - 1;
    fflush(stdout);
    if (write(STDOUT_FILENO, line, (size_t)len) < 0) {
        /* nothing more to do */
    }
}

static int check_res(ncclResult_t got, ncclResult_t want, const char *name)
{
    check(got == want, name, "returned %d (%s), expected %d; last error \"%s\"", (int)got,
          ncclGetErrorString(got), (int)want, ncclGetLastError(NULL));
    return got == want;
}

static void on_alarm(int sig)
{
    char msg[96];
    int len = snprintf(msg, sizeof(msg), "FAIL: [%s] timeout: no result after %d s\n", tag,
                       RANK_TIMEOUT_S);
    (void)sig;
    counts->fail++;
    if (len > 0 && write(STDOUT_FILENO, msg, (size_t)len) < 0) {
        /* nothing more to do */
    }
    _exit(1);
}

#include "abi_util.h"

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        printf("FAIL: [%s] out of memory\n", tag);
        exit(1);
    }
    return p;
}

/* ---- Data patterns ---------------------------------------------------------------------------
 * pat(src, dst, i): what rank src sends to rank dst at element i; a hash, so a block that lands
 * at the wrong place or comes from the wrong peer shows. sval/fval: small values for reductions,
 * exact in float in any order.
 */

static int32_t pat(int src, int dst, size_t i)
{
    uint32_t x = (uint32_t)src * 0x9e3779b1u + (uint32_t)dst * 0x85ebca77u +
                 (uint32_t)i * 0xc2b2ae3du + 0x27d4eb2fu;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    return (int32_t)x;
}

static int32_t sval(int rank, size_t i)
{
    return (int32_t)((rank + 1) * (int32_t)(i % 1000) - 500 + 7 * rank);
}

static double fval(int rank, size_t i)
{
    return (double)((rank + 1) * (int)(i % 13) - 3 * rank);
}

static long cmp_i32(const int32_t *got, const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

static long cmp_f32(const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

static long cmp_f64(const double *got, const double *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            return (long)i;
    return -1;
}

/* Reports a call that failed, or the first mismatch of its result. */
static void report_i32(const char *name, ncclResult_t res, const int32_t *got,
                       const int32_t *want, size_t n)
{
    long bad;

    if (res != ncclSuccess) {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
        return;
    }
    bad = cmp_i32(got, want, n);
    check(bad < 0, name, "element %ld of %zu: got %d, expected %d", bad, n,
          bad >= 0 ? got[bad] : 0, bad >= 0 ? want[bad] : 0);
}

static void report_f32(const char *name, ncclResult_t res, const float *got, const float *want,
                       size_t n)
{
    long bad;

    if (res != ncclSuccess) {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
        return;
    }
    bad = cmp_f32(got, want, n);
    check(bad < 0, name, "element %ld of %zu: got %g, expected %g", bad, n,
          bad >= 0 ? (double)got[bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0);
}

static void report_f64(const char *name, ncclResult_t res, const double *got, const double *want,
                       size_t n)
{
    long bad;

    if (res != ncclSuccess) {
        check(0, name, "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
              ncclGetLastError(NULL));
        return;
    }
    bad = cmp_f64(got, want, n);
    check(bad < 0, name, "element %ld of %zu: got %g, expected %g", bad, n,
          bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
}

/* ---- 1. Ring send/recv ---------------------------------------------------------------------- */

static void test_ring(ncclComm_t comm, int rank, int n)
{
    static const size_t sizes[] = {1, 1000, 300000};
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;

    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t count = sizes[s];
        int32_t *send = xcalloc(count, sizeof(int32_t));
        int32_t *recv = xcalloc(count, sizeof(int32_t));
        int32_t *want = xcalloc(count, sizeof(int32_t));
        ncclResult_t res;
        char name[128];

        for (size_t i = 0; i < count; i++) {
            send[i] = pat(rank, next, i);
            want[i] = pat(prev, rank, i);
        }
        memset(recv, 0xa5, count * sizeof(int32_t));
        res = ncclGroupStart();
        if (res == ncclSuccess)
            res = ncclSend(send, count, ncclInt32, next, comm, NULL);
        if (res == ncclSuccess)
            res = ncclRecv(recv, count, ncclInt32, prev, comm, NULL);
        res = group_end(res);
        snprintf(name, sizeof(name), "ring send/recv int32 count %zu (to %d, from %d)", count,
                 next, prev);
        report_i32(name, res, recv, want, count);
        free(want);
        free(recv);
        free(send);
    }
}

/* ---- 2. All-to-all -------------------------------------------------------------------------- */

static void test_alltoall(ncclComm_t comm, int rank, int n)
{
    static const size_t sizes[] = {1, 1000, 65537};

    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t count = sizes[s], total = count * (size_t)n;
        int32_t *send = xcalloc(total, sizeof(int32_t));
        int32_t *recv = xcalloc(total, sizeof(int32_t));
        int32_t *want = xcalloc(total, sizeof(int32_t));
        ncclResult_t res;
        char name[128];

        /* Block j goes to rank j; block i of the result came from rank i. */
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < count; i++) {
                send[(size_t)p * count + i] = pat(rank, p, i);
                want[(size_t)p * count + i] = pat(p, rank, i);
            }
        }

        memset(recv, 0xa5, total * sizeof(int32_t));
        res = ncclAlltoAll(send, recv, count, ncclInt32, comm, NULL);
        snprintf(name, sizeof(name), "ncclAlltoAll int32 count %zu", count);
        report_i32(name, res, recv, want, total);

        memset(recv, 0xa5, total * sizeof(int32_t));
        res = ncclGroupStart();
        for (int p = 0; p < n && res == ncclSuccess; p++) {
            res = ncclSend(send + (size_t)p * count, count, ncclInt32, p, comm, NULL);
            if (res == ncclSuccess)
                res = ncclRecv(recv + (size_t)p * count, count, ncclInt32, p, comm, NULL);
        }
        res = group_end(res);
        snprintf(name, sizeof(name), "all-to-all from grouped send/recv (self included) int32 "
                                     "count %zu",
                 count);
        report_i32(name, res, recv, want, total);

        free(want);
        free(recv);
        free(send);
    }
}

/* ---- 3. Gather and scatter ------------------------------------------------------------------
 * Out of place, non-roots pass a buffer that must stay untouched; in place (root's own block
 * already in place), non-roots pass NULL for the buffer the API says they do not use.
 */

static void test_gather(ncclComm_t comm, int rank, int n, int root, size_t count, int in_place)
{
    size_t total = count * (size_t)n;
    int32_t *recv = xcalloc(total, sizeof(int32_t));
    int32_t *want = xcalloc(total, sizeof(int32_t));
    int32_t *own = xcalloc(count, sizeof(int32_t));
    const int32_t *send;
    void *recvbuff = recv;
    ncclResult_t res;
    char name[128];

    for (size_t i = 0; i < count; i++)
        own[i] = pat(rank, root, i);
    memset(recv, 0xa5, total * sizeof(int32_t));
    if (rank == root) {
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < count; i++)
                want[(size_t)p * count + i] = pat(p, root, i);
    } else {
        memset(want, 0xa5, total * sizeof(int32_t)); /* untouched */
    }
    if (in_place && rank == root) {
        memcpy(recv + (size_t)root * count, own, count * sizeof(int32_t));
        send = recv + (size_t)root * count;
    } else {
        send = own;
        if (in_place)
            recvbuff = NULL;
    }
    res = ncclGather(send, recvbuff, count, ncclInt32, root, comm, NULL);
    snprintf(name, sizeof(name), "ncclGather int32 root %d count %zu %s", root, count,
             in_place ? "in-place, non-root recvbuff NULL" : "out-of-place");
    if (rank == root || !in_place)
        report_i32(name, res, recv, want, total);
    else
        check_res(res, ncclSuccess, name);
    free(own);
    free(want);
    free(recv);
}

static void test_scatter(ncclComm_t comm, int rank, int n, int root, size_t count, int in_place)
{
    size_t total = count * (size_t)n;
    int32_t *send = xcalloc(total, sizeof(int32_t));
    int32_t *recv = xcalloc(count, sizeof(int32_t));
    int32_t *want = xcalloc(count, sizeof(int32_t));
    const void *sendbuff = send;
    int32_t *recvbuff = recv;
    ncclResult_t res;
    char name[128];

    if (rank == root) {
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < count; i++)
                send[(size_t)p * count + i] = pat(root, p, i);
    } else {
        for (size_t i = 0; i < total; i++)
            send[i] = pat(rank, rank, i); /* not the root's data: must not be what arrives */
        if (in_place)
            sendbuff = NULL;
    }
    for (size_t i = 0; i < count; i++)
        want[i] = pat(root, rank, i);
    memset(recv, 0xa5, count * sizeof(int32_t));
    if (in_place && rank == root)
        recvbuff = send + (size_t)root * count;
    res = ncclScatter(sendbuff, recvbuff, count, ncclInt32, root, comm, NULL);
    snprintf(name, sizeof(name), "ncclScatter int32 root %d count %zu %s", root, count,
             in_place ? "in-place, non-root sendbuff NULL" : "out-of-place");
    report_i32(name, res, recvbuff, want, count);
    free(want);
    free(recv);
    free(send);
}

static void test_gather_scatter(ncclComm_t comm, int rank, int n)
{
    int roots[2] = {0, n - 1};

    for (int r = 0; r < (n > 1 ? 2 : 1); r++) {
        test_gather(comm, rank, n, roots[r], 1, 0);
        test_gather(comm, rank, n, roots[r], 4099, 0);
        test_gather(comm, rank, n, roots[r], 1000, 1);
        test_scatter(comm, rank, n, roots[r], 1, 0);
        test_scatter(comm, rank, n, roots[r], 4099, 0);
        test_scatter(comm, rank, n, roots[r], 1000, 1);
    }
}

/* ---- 4. Nested groups ----------------------------------------------------------------------- */

static void test_nested_groups(ncclComm_t comm, int rank, int n)
{
    enum { NA = 1, NB = 1000, NC = 65537, ND = 7, NE = 513, NF = 100 };
    int32_t *a_send = xcalloc(NA, 4), *a_recv = xcalloc(NA, 4), *a_want = xcalloc(NA, 4);
    float *b_send = xcalloc(NB, 4), *b_recv = xcalloc(NB, 4), *b_want = xcalloc(NB, 4);
    int32_t *c_send = xcalloc(NC, 4), *c_recv = xcalloc(NC, 4), *c_want = xcalloc(NC, 4);
    int32_t *d_buf = xcalloc(ND, 4), *d_want = xcalloc(ND, 4);
    float *e_send = xcalloc(NE, 4), *e_recv = xcalloc(NE, 4), *e_want = xcalloc(NE, 4);
    int32_t *f_recv = xcalloc((size_t)NF * (size_t)n, 4);
    int32_t *f_send = xcalloc(NF, 4), *f_want = xcalloc((size_t)NF * (size_t)n, 4);
    ncclResult_t res, outer, inner_end = ncclInternalError, outer_end;
    int root = n - 1;

    /* Inputs and plain-loop references. */
    for (size_t i = 0; i < NA; i++) {
        a_send[i] = sval(rank, i);
        a_want[i] = 0;
        for (int p = 0; p < n; p++)
            a_want[i] += sval(p, i);
    }
    for (size_t i = 0; i < NB; i++) {
        b_send[i] = (float)fval(rank, i);
        b_want[i] = 0.0f;
        for (int p = 0; p < n; p++)
            b_want[i] += (float)fval(p, i);
    }
    for (size_t i = 0; i < NC; i++) {
        c_send[i] = pat(rank, 0, i);
        c_want[i] = pat(0, 0, i);
        for (int p = 1; p < n; p++)
            c_want[i] = pat(p, 0, i) > c_want[i] ? pat(p, 0, i) : c_want[i];
    }
    for (size_t i = 0; i < ND; i++) {
        d_buf[i] = sval(rank, i + 11);
        d_want[i] = 0;
        for (int p = 0; p < n; p++)
            d_want[i] += sval(p, i + 11);
    }
    for (size_t i = 0; i < NE; i++) {
        e_send[i] = (float)fval(rank, i + 5);
        e_want[i] = (float)fval(root, i + 5);
    }
    for (size_t i = 0; i < NF; i++)
        f_send[i] = pat(rank, n, i);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < NF; i++)
            f_want[(size_t)p * NF + i] = pat(p, n, i);

    outer = ncclGroupStart();
    res = outer == ncclSuccess ? ncclGroupStart() : outer;
    if (res == ncclSuccess) {
        res = ncclAllReduce(a_send, a_recv, NA, ncclInt32, ncclSum, comm, NULL);
        if (res == ncclSuccess)
            res = ncclAllReduce(b_send, b_recv, NB, ncclFloat32, ncclSum, comm, NULL);
        if (res == ncclSuccess)
            res = ncclAllReduce(c_send, c_recv, NC, ncclInt32, ncclMax, comm, NULL);
        inner_end = ncclGroupEnd();
    }
    check(res == ncclSuccess && inner_end == ncclSuccess, "nested groups: inner ncclGroupEnd",
          "calls returned %d, inner end %d; last error \"%s\"", (int)res, (int)inner_end,
          ncclGetLastError(NULL));
    if (res == ncclSuccess && outer == ncclSuccess)
        res = inner_end;
    if (res == ncclSuccess)
        res = ncclAllReduce(d_buf, d_buf, ND, ncclInt32, ncclSum, comm, NULL);
    if (res == ncclSuccess)
        res = ncclBroadcast(e_send, e_recv, NE, ncclFloat32, root, comm, NULL);
    if (res == ncclSuccess)
        res = ncclAllGather(f_send, f_recv, NF, ncclInt32, comm, NULL);
    outer_end = outer == ncclSuccess ? ncclGroupEnd() : outer;
    check(outer_end == ncclSuccess, "nested groups: outer ncclGroupEnd",
          "returned %d (%s); last error \"%s\"", (int)outer_end, ncclGetErrorString(outer_end),
          ncclGetLastError(NULL));
    if (res == ncclSuccess)
        res = outer_end;

    report_i32("nested groups: allreduce int32 sum count 1 (inner group)", res, a_recv, a_want,
               NA);
    report_f32("nested groups: allreduce float32 sum count 1000 (inner group)", res, b_recv,
               b_want, NB);
    report_i32("nested groups: allreduce int32 max count 65537 (inner group)", res, c_recv,
               c_want, NC);
    report_i32("nested groups: allreduce int32 sum count 7 in-place (outer group)", res, d_buf,
               d_want, ND);
    report_f32("nested groups: broadcast float32 count 513 root n-1 (outer group)", res, e_recv,
               e_want, NE);
    report_i32("nested groups: allgather int32 count 100 (outer group)", res, f_recv, f_want,
               (size_t)NF * (size_t)n);

    free(f_want);
    free(f_send);
    free(f_recv);
    free(e_want);
    free(e_recv);
    free(e_send);
    free(d_want);
    free(d_buf);
    free(c_want);
    free(c_recv);
    free(c_send);
    free(b_want);
    free(b_recv);
    free(b_send);
    free(a_want);
    free(a_recv);
    free(a_send);
}

/* ---- 5. ncclCommSplit ----------------------------------------------------------------------- */

#define NOCOLOR_RANK 1 /* the rank passing NCCL_SPLIT_NOCOLOR when n >= 3 */

static int split_color(int rank, int n)
{
    return n >= 3 && rank == NOCOLOR_RANK ? NCCL_SPLIT_NOCOLOR : rank % 2;
}

/* ncclCommCount/ncclCommUserRank of a child, then an all-reduce on it; members lists the
 * parent ranks of the child in child-rank order. */
static void check_child(ncclComm_t child, int rank, const int *members, int nmembers,
                        const char *what)
{
    const size_t count = 1000;
    int32_t *send = xcalloc(count, sizeof(int32_t)), *recv = xcalloc(count, sizeof(int32_t));
    int32_t *want = xcalloc(count, sizeof(int32_t));
    int got_count = -1, got_rank = -1, want_rank = -1;
    ncclResult_t r1, r2, res;
    char name[160];

    for (int m = 0; m < nmembers; m++)
        if (members[m] == rank)
            want_rank = m;
    r1 = ncclCommCount(child, &got_count);
    r2 = ncclCommUserRank(child, &got_rank);
    snprintf(name, sizeof(name), "%s: child ncclCommCount/ncclCommUserRank", what);
    check(r1 == ncclSuccess && r2 == ncclSuccess && got_count == nmembers &&
              got_rank == want_rank,
          name, "results %d %d, count %d (want %d), rank %d (want %d)", (int)r1, (int)r2,
          got_count, nmembers, got_rank, want_rank);

    for (size_t i = 0; i < count; i++) {
        send[i] = sval(rank, i);
        want[i] = 0;
        for (int m = 0; m < nmembers; m++)
            want[i] += sval(members[m], i);
    }
    memset(recv, 0xa5, count * sizeof(int32_t));
    res = ncclAllReduce(send, recv, count, ncclInt32, ncclSum, child, NULL);
    snprintf(name, sizeof(name), "%s: child allreduce int32 sum count %zu", what, count);
    report_i32(name, res, recv, want, count);

    /* Child rank 0 broadcasts: shows the child's rank order, not just its membership. */
    for (size_t i = 0; i < count; i++) {
        send[i] = pat(rank, 0, i);
        want[i] = pat(members[0], 0, i);
    }
    memset(recv, 0xa5, count * sizeof(int32_t));
    res = ncclBroadcast(send, recv, count, ncclInt32, 0, child, NULL);
    snprintf(name, sizeof(name), "%s: child broadcast from child rank 0 (parent rank %d)", what,
             members[0]);
    report_i32(name, res, recv, want, count);

    free(want);
    free(recv);
    free(send);
}

static void test_split(ncclComm_t comm, int rank, int n)
{
    ncclComm_t sentinel = (ncclComm_t)(uintptr_t)0x1; /* never a valid handle */
    ncclComm_t child = sentinel;
    int color = split_color(rank, n);
    int members[MAX_RANKS], nmembers = 0;
    ncclResult_t res;
    char name[160];

    /* By color rank % 2, key rank: child order is parent order. */
    res = ncclCommSplit(comm, color, rank, &child, NULL);
    snprintf(name, sizeof(name), "ncclCommSplit color %d key %d", color, rank);
    if (check_res(res, ncclSuccess, name)) {
        if (color == NCCL_SPLIT_NOCOLOR) {
            check(child == NULL, "ncclCommSplit NCCL_SPLIT_NOCOLOR gives *newcomm NULL",
                  "got %p", (void *)child);
        } else {
            check(child != NULL && child != sentinel, "ncclCommSplit gives a communicator",
                  "got %p", (void *)child);
            if (child != NULL && child != sentinel) {
                for (int p = 0; p < n; p++)
                    if (split_color(p, n) == color)
                        members[nmembers++] = p;
                check_child(child, rank, members, nmembers, "split rank%2");
                check_res(ncclCommDestroy(child), ncclSuccess, "split rank%2: child destroy");
            }
        }
    }

    /* One color, key n - rank: the child reverses the parent's order. */
    child = sentinel;
    res = ncclCommSplit(comm, 0, n - rank, &child, NULL);
    if (check_res(res, ncclSuccess, "ncclCommSplit color 0 key n-rank") && child != NULL &&
        child != sentinel) {
        nmembers = 0;
        for (int p = n - 1; p >= 0; p--)
            members[nmembers++] = p;
        check_child(child, rank, members, nmembers, "split reversed");
        check_res(ncclCommDestroy(child), ncclSuccess, "split reversed: child destroy");
    } else if (res == ncclSuccess) {
        check(0, "ncclCommSplit color 0 gives a communicator", "got %p", (void *)child);
    }
}

/* ---- 6. Non-blocking communicator ----------------------------------------------------------- */

static void test_nonblocking(ncclComm_t comm, int rank, int n)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t nb = NULL;
    ncclUniqueId id;
    const size_t count = 4099;
    float *send = NULL, *recv = NULL, *want = NULL;
    ncclResult_t res;

    memset(&id, 0, sizeof(id));
    if (rank == 0)
        res = ncclGetUniqueId(&id);
    else
        res = ncclSuccess;
    /* Everyone joins the broadcast even if rank 0 failed, so that no rank hangs. */
    res = ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, comm, NULL) == ncclSuccess
              ? res
              : ncclSystemError;
    if (!check_res(res, ncclSuccess, "non-blocking: unique id broadcast as 128 ncclUint8"))
        return;

    cfg.blocking = 0;
    res = ncclCommInitRankConfig(&nb, n, id, rank, &cfg);
    check(res == ncclSuccess || res == ncclInProgress,
          "non-blocking: ncclCommInitRankConfig returns ncclSuccess or ncclInProgress",
          "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
          ncclGetLastError(NULL));
    if (res != ncclSuccess && res != ncclInProgress)
        return;
    printf("INFO: [%s] non-blocking ncclCommInitRankConfig returned %s\n", tag,
           res == ncclInProgress ? "ncclInProgress" : "ncclSuccess");
    check(nb != NULL, "non-blocking: *comm set on return", "NULL");
    if (nb == NULL)
        return;
    if (!check_res(poll_async(nb, res), ncclSuccess, "non-blocking: init polled to ncclSuccess"))
        goto out_destroy;

    send = xcalloc(count, sizeof(float));
    recv = xcalloc(count, sizeof(float));
    want = xcalloc(count, sizeof(float));
    for (size_t i = 0; i < count; i++) {
        send[i] = (float)fval(rank, i);
        want[i] = 0.0f;
        for (int p = 0; p < n; p++)
            want[i] += (float)fval(p, i);
    }
    memset(recv, 0xff, count * sizeof(float));
    res = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, nb, NULL);
    check(res == ncclSuccess || res == ncclInProgress,
          "non-blocking: ncclAllReduce returns ncclSuccess or ncclInProgress",
          "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
          ncclGetLastError(NULL));
    res = poll_async(nb, res);
    report_f32("non-blocking: allreduce float32 sum count 4099 polled to ncclSuccess", res, recv,
               want, count);

    res = ncclCommFinalize(nb);
    check(res == ncclSuccess || res == ncclInProgress,
          "non-blocking: ncclCommFinalize returns ncclSuccess or ncclInProgress",
          "returned %d (%s); last error \"%s\"", (int)res, ncclGetErrorString(res),
          ncclGetLastError(NULL));
    check_res(poll_async(nb, res), ncclSuccess, "non-blocking: finalize polled to ncclSuccess");

out_destroy:
    check_res(ncclCommDestroy(nb), ncclSuccess, "non-blocking: ncclCommDestroy");
    free(want);
    free(recv);
    free(send);
}

/* ---- 7. PreMulSum --------------------------------------------------------------------------- */

static double premul_scalar(int rank)
{
    return rank % 2 ? 2.0 : 1.0;
}

/* destroy_in_group: create, all-reduce and destroy inside one group (the op may go as soon as
 * the call using it returned), as nccl-tests does. */
static void test_premulsum_one(ncclComm_t comm, int rank, int n, ncclDataType_t type,
                               int destroy_in_group)
{
    const size_t count = 1000;
    int is_f32 = type == ncclFloat32;
    size_t esize = is_f32 ? sizeof(float) : sizeof(double);
    void *send = xcalloc(count, esize), *recv = xcalloc(count, esize);
    void *want = xcalloc(count, esize);
    float scalar_f = (float)premul_scalar(rank);
    double scalar_d = premul_scalar(rank);
    ncclRedOp_t op = ncclNumOps;
    ncclResult_t res = ncclSuccess, dres = ncclSuccess;
    char name[160];

    for (size_t i = 0; i < count; i++) {
        double w = 0.0;
        for (int p = 0; p < n; p++)
            w += premul_scalar(p) * fval(p, i);
        if (is_f32) {
            ((float *)send)[i] = (float)fval(rank, i);
            ((float *)want)[i] = (float)w;
        } else {
            ((double *)send)[i] = fval(rank, i);
            ((double *)want)[i] = w;
        }
    }
    memset(recv, 0xff, count * esize);

    if (destroy_in_group)
        res = ncclGroupStart();
    if (res == ncclSuccess)
        res = ncclRedOpCreatePreMulSum(&op, is_f32 ? (void *)&scalar_f : (void *)&scalar_d, type,
                                       ncclScalarHostImmediate, comm);
    snprintf(name, sizeof(name), "PreMulSum %s ncclRedOpCreatePreMulSum%s",
             is_f32 ? "float32" : "float64", destroy_in_group ? " (in a group)" : "");
    check(res == ncclSuccess, name, "returned %d (%s); last error \"%s\"", (int)res,
          ncclGetErrorString(res), ncclGetLastError(NULL));
    /* The scalar was read at creation (HostImmediate): changing it now must not matter. */
    scalar_f = 100.0f;
    scalar_d = 100.0;
    if (res == ncclSuccess) {
        res = ncclAllReduce(send, recv, count, type, op, comm, NULL);
        dres = ncclRedOpDestroy(op, comm);
    } else {
        /* Keep the collective sequence the same on every rank. */
        ncclAllReduce(send, recv, count, type, ncclSum, comm, NULL);
    }
    if (destroy_in_group)
        res = group_end(res);
    snprintf(name, sizeof(name), "PreMulSum %s ncclRedOpDestroy%s",
             is_f32 ? "float32" : "float64", destroy_in_group ? " before ncclGroupEnd" : "");
    check_res(dres, ncclSuccess, name);
    snprintf(name, sizeof(name),
             "PreMulSum %s allreduce count %zu, scalar 1 even ranks, 2 odd ranks%s",
             is_f32 ? "float32" : "float64", count, destroy_in_group ? " (in a group)" : "");
    if (is_f32)
        report_f32(name, res, recv, want, count);
    else
        report_f64(name, res, recv, want, count);
    free(want);
    free(recv);
    free(send);
}

static void test_premulsum(ncclComm_t comm, int rank, int n)
{
    test_premulsum_one(comm, rank, n, ncclFloat32, 0);
    test_premulsum_one(comm, rank, n, ncclFloat64, 0);
    test_premulsum_one(comm, rank, n, ncclFloat32, 1);
    test_premulsum_one(comm, rank, n, ncclFloat64, 1);
}

/* ---- A rank --------------------------------------------------------------------------------- */

static int rank_main(int rank, int n, ncclUniqueId id)
{
    ncclComm_t comm = NULL;
    int got_count = -1, got_rank = -1;

    snprintf(tag, sizeof(tag), "rank %d/%d", rank, n);
    signal(SIGALRM, on_alarm);
    alarm(RANK_TIMEOUT_S);

    if (!check_res(ncclCommInitRank(&comm, n, id, rank), ncclSuccess, "ncclCommInitRank"))
        return 1;
    check(ncclCommCount(comm, &got_count) == ncclSuccess && got_count == n &&
              ncclCommUserRank(comm, &got_rank) == ncclSuccess && got_rank == rank,
          "ncclCommCount/ncclCommUserRank", "count %d rank %d", got_count, got_rank);

    test_ring(comm, rank, n);
    test_alltoall(comm, rank, n);
    test_gather_scatter(comm, rank, n);
    test_nested_groups(comm, rank, n);
    test_nonblocking(comm, rank, n);
    test_premulsum(comm, rank, n);
    /* Last, so that a split still being finished does not hide the results above. */
    test_split(comm, rank, n);

    check_res(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
    alarm(0);
    return counts->fail ? 1 : 0;
}

/* ---- The parent ----------------------------------------------------------------------------- */

static void usage(const char *argv0)
{
    fprintf(stderr, "usage: %s -n NRANKS (1..%d)\n", argv0, MAX_RANKS);
    exit(2);
}

int main(int argc, char **argv)
{
    struct counts *shared;
    pid_t pids[MAX_RANKS];
    int done[MAX_RANKS], killed[MAX_RANKS], status[MAX_RANKS];
    int n = -1, opt, alive = 0, total_pass, total_fail;
    double deadline, fail_at = -1.0;
    ncclUniqueId id;

    setvbuf(stdout, NULL, _IOLBF, 0);
    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt != 'n')
            usage(argv[0]);
        n = atoi(optarg);
    }
    if (n < 1 || n > MAX_RANKS || optind != argc)
        usage(argv[0]);

    check_library_identity();
    if (!check_res(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId in the parent"))
        goto out;

    shared = mmap(NULL, sizeof(struct counts) * MAX_RANKS, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        check(0, "mmap shared counters", "%s", strerror(errno));
        goto out;
    }
    memset(shared, 0, sizeof(struct counts) * MAX_RANKS);

    fflush(stdout);
    for (int r = 0; r < n; r++) {
        done[r] = killed[r] = 0;
        status[r] = 0;
        pids[r] = fork();
        if (pids[r] == 0) {
            counts = &shared[r];
            _exit(rank_main(r, n, id));
        }
        if (pids[r] < 0) {
            check(0, "fork", "rank %d: %s", r, strerror(errno));
            for (int k = 0; k < r; k++) {
                kill(pids[k], SIGKILL);
                waitpid(pids[k], NULL, 0);
            }
            goto out;
        }
        alive++;
    }

    /* Reap; after a failed rank its peers get GRACE_S, and nobody outlives the deadline. */
    deadline = now_s() + PARENT_TIMEOUT_S;
    while (alive > 0) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);

        if (pid > 0) {
            for (int r = 0; r < n; r++) {
                if (pids[r] == pid && !done[r]) {
                    done[r] = 1;
                    status[r] = st;
                    alive--;
                    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && fail_at < 0)
                        fail_at = now_s();
                }
            }
            continue;
        }
        if (now_s() > deadline || (fail_at >= 0 && now_s() > fail_at + GRACE_S)) {
            for (int r = 0; r < n; r++) {
                if (!done[r] && !killed[r]) {
                    killed[r] = 1;
                    kill(pids[r], SIGKILL);
                }
            }
        }
        usleep(10000);
    }

    for (int r = 0; r < n; r++) {
        char name[64];
        snprintf(name, sizeof(name), "rank %d exit", r);
        if (killed[r])
            check(0, name, "killed: still running %s",
                  fail_at >= 0 ? "after a peer failed" : "at the deadline");
        else if (WIFSIGNALED(status[r]))
            check(0, name, "died of signal %d", WTERMSIG(status[r]));
        else if (WEXITSTATUS(status[r]) != 0 && shared[r].fail == 0)
            check(0, name, "exit status %d with no failed check", WEXITSTATUS(status[r]));
    }
    total_pass = parent_counts.pass;
    total_fail = parent_counts.fail;
    for (int r = 0; r < n; r++) {
        total_pass += shared[r].pass;
        total_fail += shared[r].fail;
    }
    printf("%d passed, %d failed\n", total_pass, total_fail);
    return total_fail ? 1 : 0;

out:
    printf("%d passed, %d failed\n", parent_counts.pass, parent_counts.fail);
    return 1;
}

#endif /* ABI_HAVE_TOOLKIT */
