/*
 * One rank of a multi-host test (tests/net/net.sh starts it in network namespaces, one per
 * "host"). Rank, size and unique id come from the environment (weftLaunchInfo: WEFT_RANK,
 * WEFT_NRANKS, WEFT_LOCAL_RANK, WEFT_UNIQUE_ID).
 *
 *   net_colls id            print a unique id as hex (with NCCL_COMM_ID set: no root thread; rank
 *                           0 serves the rendezvous inside its init)
 *   net_colls colls         every collective (all-reduce, reduce, reduce-scatter, all-gather,
 *                           broadcast, all-to-all, gather, scatter, send/recv in groups) over
 *                           several types, ops, counts, roots, in and out of place; every element
 *                           checked against a plain loop over what each rank contributed; and
 *                           the tuner's choices, equal on every rank, from WEFT_NET_NHOSTS hosts
 *   net_colls kill V HOST   all-reduces in a loop until one fails (the script kills rank V
 *                           meanwhile): the error must be ncclRemoteError, name "peer V" and HOST,
 *                           and come within 10 s of the last good operation
 * Exit 0 on success; failures are printed with the rank.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/elem.h"
#include "nccl.h"
#include "redop.h"
#include "weft.h"

#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/comm.h"
#include "core/hexid.h"

static int g_rank, g_nranks, g_failed, g_passed;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check(ncclResult_t res, const char *what)
{
    if (res != ncclSuccess) {
        fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, what, ncclGetErrorString(res),
                ncclGetLastError(NULL));
        g_failed++;
        return 0;
    }
    return 1;
}

/*
 * Small integers keep every reduction exact in every type and order: |sum| <= 9 * 6, products
 * of at most 9 factors in {-1, 1, 2} (unsigned types: {1, 2}): powers of two, exact in every
 * float type; 8-bit products wrap modulo 256 in any order.
 */
static double value(int t, ncclRedOp_t op, int r, size_t i, uint64_t salt)
{
    uint64_t h = mix(((uint64_t)r << 40) ^ (i * 0x9e3779b97f4a7c15ull) ^ salt);
    int is_unsigned = t == ncclUint8;
    if (op == ncclProd)
        return h % 3 == 0 ? 2.0 : (h % 3 == 1 || is_unsigned) ? 1.0 : -1.0;
    return is_unsigned ? (double)(h % 7) : (double)(h % 13) - 6.0;
}

static double reduce2(ncclRedOp_t op, double a, double b)
{
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return a + b;
    }
}

static double expected(int t, ncclRedOp_t op, size_t i, uint64_t salt)
{
    double acc = value(t, op, 0, i, salt);
    for (int r = 1; r < g_nranks; r++)
        acc = reduce2(op, acc, value(t, op, r, i, salt));
    return acc;
}

/* Compares n elements at got with what want(i) stores; reports the first mismatch. */
static int compare(const char *what, int t, const char *got, size_t n,
                   double (*want)(size_t, void *), void *arg)
{
    size_t es = weft_dtype_size(t);
    unsigned char w[8];
    for (size_t i = 0; i < n; i++) {
        store(t, w, 0, want(i, arg));
        if (memcmp(got + i * es, w, es) != 0) {
            fprintf(stderr, "rank %d: FAIL %s type %d: element %zu of %zu differs\n", g_rank, what,
                    t, i, n);
            return 0;
        }
    }
    return 1;
}

struct want_arg {
    int t;
    ncclRedOp_t op;
    uint64_t salt;
    size_t base;  /* element offset into the reduced vector */
    size_t count; /* per-rank block (gathers) */
    int src;      /* rank whose data is wanted, -1: block index decides */
    int stride_rank;
};

static double want_reduced(size_t i, void *p)
{
    struct want_arg *a = p;
    return expected(a->t, a->op, a->base + i, a->salt);
}

/* Element i of a gathered vector: rank i / count's element i % count (+ base). */
static double want_gathered(size_t i, void *p)
{
    struct want_arg *a = p;
    int r = a->src >= 0 ? a->src : (int)(i / a->count);
    return value(a->t, ncclSum, r, a->base + (a->src >= 0 ? i : i % a->count), a->salt);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", g_rank, n);
        exit(1);
    }
    return p;
}

static void fill(int t, ncclRedOp_t op, char *buf, size_t n, int r, size_t base, uint64_t salt)
{
    for (size_t i = 0; i < n; i++)
        store(t, buf, i, value(t, op, r, base + i, salt));
}

static void result(int ok)
{
    if (ok)
        g_passed++;
    else
        g_failed++;
}

static void run_reductions(ncclComm_t comm, int t, ncclRedOp_t op, size_t count, int inplace,
                           uint64_t salt)
{
    int n = g_nranks, r = g_rank;
    size_t es = weft_dtype_size(t);
    char *send = xmalloc(count * n * es), *recv = xmalloc(count * n * es);
    struct want_arg a = {.t = t, .op = op, .salt = salt, .src = -1};
    int root = (int)((count + (size_t)t) % (size_t)n);

    /* all-reduce */
    fill(t, op, send, count, r, 0, salt);
    char *in = inplace ? recv : send;
    if (inplace)
        memcpy(recv, send, count * es);
    if (check(ncclAllReduce(in, recv, count, t, op, comm, NULL), "ncclAllReduce"))
        result(compare("allreduce", t, recv, count, want_reduced, &a));

    /* reduce */
    fill(t, op, inplace ? recv : send, count, r, 0, salt);
    if (check(ncclReduce(inplace ? recv : send, recv, count, t, op, root, comm, NULL),
              "ncclReduce"))
        result(r != root || compare("reduce", t, recv, count, want_reduced, &a));

    /* reduce-scatter: input count * n, this rank's block out */
    fill(t, op, inplace ? recv : send, count * n, r, 0, salt);
    char *out = inplace ? recv + (size_t)r * count * es : recv;
    if (check(ncclReduceScatter(inplace ? recv : send, out, count, t, op, comm, NULL),
              "ncclReduceScatter")) {
        a.base = (size_t)r * count;
        result(compare("reducescatter", t, out, count, want_reduced, &a));
    }
    free(send);
    free(recv);
}

static void run_moves(ncclComm_t comm, int t, size_t count, int inplace, uint64_t salt)
{
    int n = g_nranks, r = g_rank;
    size_t es = weft_dtype_size(t);
    char *send = xmalloc(count * n * es), *recv = xmalloc(count * n * es);
    struct want_arg a = {.t = t, .salt = salt, .count = count, .src = -1};
    int root = (int)((count / 7 + (size_t)t) % (size_t)n);

    /* all-gather */
    char *in = inplace ? recv + (size_t)r * count * es : send;
    fill(t, ncclSum, in, count, r, 0, salt);
    if (check(ncclAllGather(in, recv, count, t, comm, NULL), "ncclAllGather"))
        result(compare("allgather", t, recv, count * n, want_gathered, &a));

    /* broadcast */
    fill(t, ncclSum, inplace ? recv : send, count, r, 0, salt);
    if (check(ncclBroadcast(inplace ? recv : send, recv, count, t, root, comm, NULL),
              "ncclBroadcast")) {
        a.src = root;
        result(compare("broadcast", t, recv, count, want_gathered, &a));
        a.src = -1;
    }

    /* all-to-all: block j of rank r's input goes to rank j; value index = r's block j */
    for (int j = 0; j < n; j++)
        fill(t, ncclSum, send + (size_t)j * count * es, count, r, (size_t)j * count, salt);
    if (check(ncclAlltoAll(send, recv, count, t, comm, NULL), "ncclAlltoAll")) {
        int ok = 1;
        for (int j = 0; j < n && ok; j++) {
            struct want_arg b = {.t = t, .salt = salt, .src = j, .base = (size_t)r * count};
            ok = compare("alltoall", t, recv + (size_t)j * count * es, count, want_gathered, &b);
        }
        result(ok);
    }

    /* gather to root, scatter from root */
    fill(t, ncclSum, send, count, r, 0, salt);
    if (check(ncclGather(send, recv, count, t, root, comm, NULL), "ncclGather"))
        result(r != root || compare("gather", t, recv, count * n, want_gathered, &a));
    if (r == root)
        for (int j = 0; j < n; j++)
            fill(t, ncclSum, send + (size_t)j * count * es, count, j, 0, salt ^ 1);
    if (check(ncclScatter(send, recv, count, t, root, comm, NULL), "ncclScatter")) {
        struct want_arg b = {.t = t, .salt = salt ^ 1, .src = r};
        result(compare("scatter", t, recv, count, want_gathered, &b));
    }

    /* send/recv: in one group, rank r sends to r + k and receives from r - k, every k */
    for (int k = 1; k < n; k++)
        fill(t, ncclSum, send + (size_t)(k - 1) * count * es, count, r, (size_t)k * count, salt);
    int ok = check(ncclGroupStart(), "ncclGroupStart");
    for (int k = 1; k < n && ok; k++) {
        ok &= check(ncclSend(send + (size_t)(k - 1) * count * es, count, t, (r + k) % n, comm,
                             NULL),
                    "ncclSend");
        ok &= check(ncclRecv(recv + (size_t)(k - 1) * count * es, count, t, (r - k + n) % n, comm,
                             NULL),
                    "ncclRecv");
    }
    ok &= check(ncclGroupEnd(), "ncclGroupEnd");
    for (int k = 1; k < n && ok; k++) {
        struct want_arg b = {.t = t, .salt = salt, .src = (r - k + n) % n,
                             .base = (size_t)k * count};
        ok = compare("sendrecv", t, recv + (size_t)(k - 1) * count * es, count, want_gathered, &b);
    }
    result(ok);
    free(send);
    free(recv);
}

/*
 * The tuner's choices for every collective and size (8 B .. 64 MiB, every 4x) hashed on each rank,
 * gathered and compared: every rank must choose the same, from the same count of hosts (the
 * script's WEFT_NET_NHOSTS).
 */
static void check_tuner(ncclComm_t comm)
{
    uint64_t h = 0xcbf29ce484222325ull, *all = xmalloc((size_t)g_nranks * sizeof(uint64_t));
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        for (size_t b = 8; b <= (64u << 20); b *= 4)
            h = (h ^ (uint64_t)weft_tune_algo_quiet(c, b, &comm->tune, NULL)) * 0x100000001b3ull;
    h = (h ^ (uint64_t)comm->nhosts) * 0x100000001b3ull;
    const char *want = getenv("WEFT_NET_NHOSTS");
    if (want != NULL && atoi(want) != comm->nhosts) {
        fprintf(stderr, "rank %d: %d hosts counted, %s expected\n", g_rank, comm->nhosts, want);
        g_failed++;
    }
    if (check(ncclAllGather(&h, all, 1, ncclUint64, comm, NULL), "ncclAllGather (tuner)")) {
        int same = 1;
        for (int r = 0; r < g_nranks; r++)
            same &= all[r] == h;
        if (!same)
            fprintf(stderr, "rank %d: the ranks' tuner choices differ\n", g_rank);
        result(same);
    }
    free(all);
}

static int do_colls(ncclComm_t comm)
{
    check_tuner(comm);
    static const size_t counts[] = {0, 1, 7, 1023, 131075};
    static const int types[] = {ncclInt8, ncclUint8, ncclInt32, ncclInt64, ncclFloat16,
                                ncclBfloat16, ncclFloat32, ncclFloat64};
    static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin};
    uint64_t salt = 1;
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
            int inplace = (int)((ci + ti) & 1);
            /* every op on the small counts, sum and max on the large one */
            for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++)
                if (counts[ci] < 100000 || oi == 0 || oi == 2)
                    run_reductions(comm, types[ti], ops[oi], counts[ci], inplace, salt++);
            run_moves(comm, types[ti], counts[ci], !inplace, salt++);
        }
    }
    /* large: several slots per step and several steps per channel, both placements */
    run_reductions(comm, ncclFloat32, ncclSum, 1048576 + 3, 0, salt++);
    run_reductions(comm, ncclInt32, ncclMax, 1048576 + 3, 1, salt++);
    run_moves(comm, ncclFloat64, 262144 + 1, 0, salt++);
    printf("rank %d: %d passed, %d failed\n", g_rank, g_passed, g_failed);
    return g_failed != 0;
}

static int do_kill(ncclComm_t comm, int victim, const char *host)
{
    size_t count = 1 << 18;
    float *buf = xmalloc(count * sizeof(float));
    memset(buf, 0, count * sizeof(float));
    double last = now_s(), start = last;
    int iters = 0;
    for (;;) {
        ncclResult_t res = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
        double t = now_s();
        if (res == ncclSuccess) {
            last = t;
            iters++;
            if (t - start > 40) {
                fprintf(stderr, "rank %d: FAIL no error 40 s after the start (%d operations)\n",
                        g_rank, iters);
                return 1;
            }
            continue;
        }
        const char *msg = ncclGetLastError(NULL);
        char peer[32];
        snprintf(peer, sizeof(peer), "peer %d ", victim);
        int ok = res == ncclRemoteError && strstr(msg, peer) != NULL && strstr(msg, host) != NULL &&
                 t - last < 10;
        printf("rank %d: %s after %d operations, %.2f s after the last good one: %s: %s\n",
               g_rank, ok ? "ok" : "FAIL", iters, t - last, ncclGetErrorString(res), msg);
        fflush(stdout);
        /* Stay a while: our exit must not be what the other survivors report. */
        sleep(3);
        ncclCommAbort(comm);
        return !ok;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s id | colls | kill VICTIM HOST\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "id") == 0) {
        ncclUniqueId id;
        if (!check(ncclGetUniqueId(&id), "ncclGetUniqueId"))
            return 1;
        char hex[WEFT_HEXID_LEN + 1];
        weft_hexid_encode(&id, hex);
        printf("%s\n", hex);
        return 0;
    }
    ncclUniqueId id;
    int local;
    if (!check(weftLaunchInfo(&g_rank, &g_nranks, &local, &id), "weftLaunchInfo"))
        return 1;
    ncclComm_t comm;
    if (!check(ncclCommInitRank(&comm, g_nranks, id, g_rank), "ncclCommInitRank"))
        return 1;
    int rc;
    if (strcmp(argv[1], "colls") == 0) {
        rc = do_colls(comm);
    } else if (strcmp(argv[1], "kill") == 0 && argc == 4) {
        return do_kill(comm, atoi(argv[2]), argv[3]);
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    if (!check(ncclCommFinalize(comm), "ncclCommFinalize") ||
        !check(ncclCommDestroy(comm), "ncclCommDestroy"))
        return 1;
    return rc;
}
