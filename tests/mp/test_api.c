/*
 * Multi-process tests of the rest of the API on host memory: point-to-point (ring, random
 * pairing orders inside groups, self, many peers), all-to-all (native and from grouped send/recv),
 * gather/scatter, nested groups, fused groups of small all-reduces, PreMulSum with host-immediate
 * and pointer scalars for every floating type, host streams overlapping computation,
 * non-blocking communicators, and several communicators driven from one thread.
 * Every result is checked element by element against values each rank can regenerate.
 *
 * Usage: test_api -n NRANKS [-t SECONDS]
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl.h"
#include "../common/id_pipe.h"
#include "../common/time_scale.h"
#include "redop.h"
#include "weft.h"

struct shared_counts {
    int passed;
    int failed;
};

static int g_rank, g_nranks;
static struct shared_counts *g_counts;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        int ok_ = (cond);                                                                          \
        __atomic_fetch_add(ok_ ? &g_counts->passed : &g_counts->failed, 1, __ATOMIC_RELAXED);     \
        if (!ok_) {                                                                                \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", g_rank, __FILE__, __LINE__);                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (last error: %s)\n", ncclGetLastError(NULL));                        \
        }                                                                                          \
    } while (0)

#define NCCLOK(call) CHECK((call) == ncclSuccess, "%s", #call)

/* A value rank `src` sends to rank `dst` at index i, distinct for every triple. */
static int32_t p2p_value(int src, int dst, size_t i)
{
    return (int32_t)(src * 1000003 + dst * 7919 + (int64_t)i * 31) ^ 0x5a5a;
}

static int check_block(const int32_t *got, size_t count, int src, int dst, const char *what)
{
    for (size_t i = 0; i < count; i++) {
        if (got[i] != p2p_value(src, dst, i)) {
            CHECK(0, "%s: from %d to %d index %zu got %d want %d", what, src, dst, i, got[i],
                  p2p_value(src, dst, i));
            return 0;
        }
    }
    CHECK(1, "%s", what);
    return 1;
}

static void fill_block(int32_t *buf, size_t count, int src, int dst)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = p2p_value(src, dst, i);
}

/* Ring exchange: everyone sends to r+1 and receives from r-1 in one group, both orders. */
static void test_ring(ncclComm_t comm, size_t count)
{
    int n = g_nranks, r = g_rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    int32_t *s = malloc(count * 4 + 4), *d = malloc(count * 4 + 4);
    fill_block(s, count, r, next);
    for (int order = 0; order < 2; order++) {
        memset(d, 0, count * 4);
        NCCLOK(ncclGroupStart());
        if (order == 0 || (r % 2)) {
            NCCLOK(ncclSend(s, count, ncclInt32, next, comm, NULL));
            NCCLOK(ncclRecv(d, count, ncclInt32, prev, comm, NULL));
        } else {
            NCCLOK(ncclRecv(d, count, ncclInt32, prev, comm, NULL));
            NCCLOK(ncclSend(s, count, ncclInt32, next, comm, NULL));
        }
        NCCLOK(ncclGroupEnd());
        check_block(d, count, prev, r, "ring send/recv");
    }
    free(s);
    free(d);
}

/* Everyone exchanges with everyone (itself included) in one group, in a rank-specific order. */
static void test_all_pairs(ncclComm_t comm, size_t count, unsigned seed)
{
    int n = g_nranks, r = g_rank;
    int32_t *s = malloc((size_t)n * count * 4 + 4), *d = calloc((size_t)n * count + 1, 4);
    for (int p = 0; p < n; p++)
        fill_block(s + (size_t)p * count, count, r, p);
    /* A random interleaving of the 2n calls; per-peer order is irrelevant (one each). */
    int *calls = malloc(sizeof(int) * 2 * (size_t)n);
    for (int i = 0; i < 2 * n; i++)
        calls[i] = i;
    unsigned st = seed * 2654435761u + (unsigned)r * 40503u + 1;
    for (int i = 2 * n - 1; i > 0; i--) {
        st = st * 1103515245u + 12345u;
        int j = (int)((st >> 8) % (unsigned)(i + 1));
        int t = calls[i];
        calls[i] = calls[j];
        calls[j] = t;
    }
    NCCLOK(ncclGroupStart());
    for (int i = 0; i < 2 * n; i++) {
        int p = calls[i] / 2;
        if (calls[i] % 2)
            NCCLOK(ncclSend(s + (size_t)p * count, count, ncclInt32, p, comm, NULL));
        else
            NCCLOK(ncclRecv(d + (size_t)p * count, count, ncclInt32, p, comm, NULL));
    }
    NCCLOK(ncclGroupEnd());
    for (int p = 0; p < n; p++)
        check_block(d + (size_t)p * count, count, p, r, "all-pairs send/recv");
    free(calls);
    free(s);
    free(d);
}

/* Several messages to the same peer in one group are matched in issue order. Sizes repeat, and
 * the test runs 3 times: the schedule cache (exec/host_run.h, 4 entries) serves tasks of a
 * group from entries that later tasks of the same group replace. */
static void test_ordered_same_peer(ncclComm_t comm)
{
    int n = g_nranks, r = g_rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    enum { K = 7 };
    size_t sizes[K] = {1, 100, 7, 70000, 3, 1, 100};
    int32_t *s[K], *d[K];
    NCCLOK(ncclGroupStart());
    for (int k = 0; k < K; k++) {
        s[k] = malloc(sizes[k] * 4);
        d[k] = calloc(sizes[k], 4);
        fill_block(s[k], sizes[k], r * 10 + k, next);
        NCCLOK(ncclSend(s[k], sizes[k], ncclInt32, next, comm, NULL));
    }
    for (int k = 0; k < K; k++)
        NCCLOK(ncclRecv(d[k], sizes[k], ncclInt32, prev, comm, NULL));
    NCCLOK(ncclGroupEnd());
    for (int k = 0; k < K; k++) {
        check_block(d[k], sizes[k], prev * 10 + k, r, "ordered messages to one peer");
        free(s[k]);
        free(d[k]);
    }
}

/* Groups that repeat, as a pipeline step's do: the executor keeps a group's lanes ready and runs
 * them in place (exec/host_run.h: two groups of a communicator, replaced in turn). Four
 * shapes in an order that hits, misses and replaces entries; every time fresh buffers and values,
 * and the all-reduce alternates max and sum (same shape, another operator), all checked. Shape 3
 * sends two messages of one size to the same peer: they must arrive in order, hit or miss. */
static void test_group_repeat(ncclComm_t comm)
{
    int n = g_nranks, r = g_rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    static const int shapes[] = {0, 1, 2, 0, 2, 1, 0, 0, 1, 1, 2, 2, 0, 3, 3, 0, 3, 2, 3, 3};
    for (int it = 0; it < (int)(sizeof(shapes) / sizeof(shapes[0])); it++) {
        int shape = shapes[it];
        size_t count = shape == 1 ? 5 : 3;
        if (shape == 3) {
            int32_t *s2[2], *d2[2];
            NCCLOK(ncclGroupStart());
            for (int k = 0; k < 2; k++) {
                s2[k] = malloc(count * 4);
                d2[k] = calloc(count, 4);
                fill_block(s2[k], count, r + (2 * it + k) * n, next);
                NCCLOK(ncclSend(s2[k], count, ncclInt32, next, comm, NULL));
            }
            for (int k = 0; k < 2; k++)
                NCCLOK(ncclRecv(d2[k], count, ncclInt32, prev, comm, NULL));
            NCCLOK(ncclGroupEnd());
            for (int k = 0; k < 2; k++) {
                check_block(d2[k], count, prev + (2 * it + k) * n, r, "repeated group: in order");
                free(s2[k]);
                free(d2[k]);
            }
            continue;
        }
        int32_t *s = malloc(count * 4), *d = calloc(count, 4), *a = malloc(count * 4);
        fill_block(s, count, r + it * n, next);
        for (size_t i = 0; i < count; i++)
            a[i] = r * 7 + it * 3 + (int32_t)i;
        ncclRedOp_t op = it % 2 ? ncclSum : ncclMax;
        NCCLOK(ncclGroupStart());
        if (shape == 2) { /* shape 0's tasks in another order */
            NCCLOK(ncclRecv(d, count, ncclInt32, prev, comm, NULL));
            NCCLOK(ncclAllReduce(a, a, count, ncclInt32, op, comm, NULL));
            NCCLOK(ncclSend(s, count, ncclInt32, next, comm, NULL));
        } else {
            NCCLOK(ncclSend(s, count, ncclInt32, next, comm, NULL));
            NCCLOK(ncclAllReduce(a, a, count, ncclInt32, op, comm, NULL));
            NCCLOK(ncclRecv(d, count, ncclInt32, prev, comm, NULL));
        }
        NCCLOK(ncclGroupEnd());
        check_block(d, count, prev + it * n, r, "repeated group: send/recv");
        int bad = 0;
        for (size_t i = 0; i < count; i++) {
            int32_t want = (n - 1) * 7 + it * 3 + (int32_t)i; /* max */
            if (op == ncclSum)
                want = 7 * n * (n - 1) / 2 + n * (it * 3 + (int32_t)i);
            bad += a[i] != want;
        }
        CHECK(bad == 0, "repeated group %d (shape %d): all-reduce wrong in %d of %zu", it, shape,
              bad, count);
        free(s);
        free(d);
        free(a);
    }
}

static void test_alltoall(ncclComm_t comm, size_t count, int grouped)
{
    int n = g_nranks, r = g_rank;
    int32_t *s = malloc((size_t)n * count * 4 + 4), *d = calloc((size_t)n * count + 1, 4);
    for (int p = 0; p < n; p++)
        fill_block(s + (size_t)p * count, count, r, p);
    if (grouped) {
        NCCLOK(ncclGroupStart());
        for (int p = 0; p < n; p++) {
            NCCLOK(ncclSend(s + (size_t)p * count, count, ncclInt32, p, comm, NULL));
            NCCLOK(ncclRecv(d + (size_t)p * count, count, ncclInt32, p, comm, NULL));
        }
        NCCLOK(ncclGroupEnd());
    } else {
        NCCLOK(ncclAlltoAll(s, d, count, ncclInt32, comm, NULL));
    }
    for (int p = 0; p < n; p++)
        check_block(d + (size_t)p * count, count, p, r,
                    grouped ? "all-to-all from send/recv" : "ncclAlltoAll");
    free(s);
    free(d);
}

/* In place (sendbuff == recvbuff) all-to-all. */
static void test_alltoall_inplace(ncclComm_t comm, size_t count)
{
    int n = g_nranks, r = g_rank;
    int32_t *b = malloc((size_t)n * count * 4 + 4);
    for (int p = 0; p < n; p++)
        fill_block(b + (size_t)p * count, count, r, p);
    NCCLOK(ncclAlltoAll(b, b, count, ncclInt32, comm, NULL));
    for (int p = 0; p < n; p++)
        check_block(b + (size_t)p * count, count, p, r, "in-place ncclAlltoAll");
    free(b);
}

/* Even ranks call in place, odd ranks out of place (each rank chooses for itself, as NCCL
 * allows): the order an in-place rank takes meets the others' on the wire. */
static void test_alltoall_mixed(ncclComm_t comm, size_t count)
{
    int n = g_nranks, r = g_rank;
    int32_t *s = malloc((size_t)n * count * 4 + 4);
    int32_t *d = r % 2 == 0 ? s : malloc((size_t)n * count * 4 + 4);
    for (int p = 0; p < n; p++)
        fill_block(s + (size_t)p * count, count, r, p);
    NCCLOK(ncclAlltoAll(s, d, count, ncclInt32, comm, NULL));
    for (int p = 0; p < n; p++)
        check_block(d + (size_t)p * count, count, p, r,
                    r % 2 == 0 ? "in-place ncclAlltoAll (mixed)" : "ncclAlltoAll (mixed)");
    if (d != s)
        free(d);
    free(s);
}

/*
 * In place needs no copy of the input: the process's peak resident memory grows by less than a
 * quarter of the 64 MiB buffer during the call (by all of it while the executor staged a copy).
 * Runs first, before other cases raise the peak. A warm-up of 4 MiB blocks (more than a
 * connection's 8 slots of 512 KiB over sockets) first touches every slot of every connection,
 * with its buffers freed before the measured call's buffer exists.
 */
static void test_alltoall_inplace_nocopy(ncclComm_t comm)
{
    int n = g_nranks, r = g_rank;
    size_t count = (64u << 20) / 4 / (size_t)n + 3, wc = 1u << 20;
    int32_t *ws = malloc((size_t)n * wc * 4), *wd = malloc((size_t)n * wc * 4);
    for (int p = 0; p < n; p++)
        fill_block(ws + (size_t)p * wc, wc, r, p);
    NCCLOK(ncclAlltoAll(ws, wd, wc, ncclInt32, comm, NULL));
    free(ws);
    free(wd);
    int32_t *b = malloc((size_t)n * count * 4);
    for (int p = 0; p < n; p++)
        fill_block(b + (size_t)p * count, count, r, p);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long before = ru.ru_maxrss; /* KiB */
    NCCLOK(ncclAlltoAll(b, b, count, ncclInt32, comm, NULL));
    getrusage(RUSAGE_SELF, &ru);
    CHECK(ru.ru_maxrss - before < 16 * 1024,
          "in-place all-to-all of %zu MiB raised the peak resident memory by %ld KiB",
          (size_t)n * count * 4 >> 20, ru.ru_maxrss - before);
    for (int p = 0; p < n; p++)
        check_block(b + (size_t)p * count, count, p, r, "in-place ncclAlltoAll (64 MiB)");
    free(b);
}

/* Revoke: in-flight work stops, further operations are refused, destroy still works. */
static void test_revoke(ncclComm_t comm)
{
    float x = 1;
    NCCLOK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, NULL) == ncclInvalidUsage,
          "collective after revoke");
    CHECK(ncclCommFinalize(comm) == ncclInvalidUsage, "finalize after revoke");
    NCCLOK(ncclCommDestroy(comm));
}

static void test_gather_scatter(ncclComm_t comm, size_t count, int root, int inplace)
{
    int n = g_nranks, r = g_rank;
    /* gather: rank p's block is fill(p, root) */
    int32_t *big = calloc((size_t)n * count + 1, 4), *mine = malloc(count * 4 + 4);
    int32_t *in = mine;
    if (inplace && r == root)
        in = big + (size_t)root * count;
    fill_block(in, count, r, root);
    NCCLOK(ncclGather(in, big, count, ncclInt32, root, comm, NULL));
    if (r == root)
        for (int p = 0; p < n; p++)
            check_block(big + (size_t)p * count, count, p, root, "ncclGather");
    /* scatter: root sends block p = fill(root, p) */
    if (r == root)
        for (int p = 0; p < n; p++)
            fill_block(big + (size_t)p * count, count, root, p);
    int32_t *out = (inplace && r == root) ? big + (size_t)root * count : mine;
    if (out == mine)
        memset(mine, 0, count * 4);
    NCCLOK(ncclScatter(big, out, count, ncclInt32, root, comm, NULL));
    check_block(out, count, root, r, "ncclScatter");
    free(big);
    free(mine);
}

/* Nested groups: only the outermost end runs; several collectives in one group. */
static void test_nested_groups(ncclComm_t comm)
{
    int n = g_nranks;
    enum { K = 64 };
    float *bufs[K];
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclGroupStart());
    for (int k = 0; k < K; k++) {
        size_t cnt = 1 + (size_t)k * 3;
        bufs[k] = malloc(cnt * sizeof(float));
        for (size_t i = 0; i < cnt; i++)
            bufs[k][i] = (float)(g_rank + k + (int)i % 5);
        NCCLOK(ncclAllReduce(bufs[k], bufs[k], cnt, ncclFloat, ncclSum, comm, NULL));
        if (k == K / 2) {
            NCCLOK(ncclGroupEnd()); /* inner end: must not run anything yet */
            NCCLOK(ncclGroupStart());
        }
    }
    NCCLOK(ncclGroupEnd());
    NCCLOK(ncclGroupEnd());
    for (int k = 0; k < K; k++) {
        size_t cnt = 1 + (size_t)k * 3;
        int bad = 0;
        for (size_t i = 0; i < cnt; i++) {
            float want = (float)(n * (k + (int)i % 5) + n * (n - 1) / 2);
            bad += bufs[k][i] != want;
        }
        CHECK(bad == 0, "fused group all-reduce %d: %d wrong", k, bad);
        free(bufs[k]);
    }
}

/* In one group, a small all-reduce that reads the previous one's result sees that result. */
static void test_group_dependency(ncclComm_t comm)
{
    int n = g_nranks;
    float x[16], y[16], z[16];
    for (int i = 0; i < 16; i++)
        x[i] = (float)(g_rank + 1);
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(x, y, 16, ncclFloat, ncclSum, comm, NULL));
    NCCLOK(ncclAllReduce(y, z, 16, ncclFloat, ncclSum, comm, NULL));
    NCCLOK(ncclGroupEnd());
    int bad = 0;
    for (int i = 0; i < 16; i++)
        bad += y[i] != (float)(n * (n + 1) / 2) || z[i] != (float)(n * n * (n + 1) / 2);
    CHECK(bad == 0, "dependent all-reduces in one group: y %g z %g", y[0], z[0]);
}

/* Rank r's own input to member m of the chained groups below. */
static float chain_value(int r, int m, int i)
{
    return (float)(r + 1) * (float)(m + 1) + (float)(i % 7);
}

/*
 * A group of K small all-reduces where the ranks in `chains` feed members 1 and 3 with the result
 * of the member before (buffers chained), the others give every member its own input. Fusion is
 * agreed: every rank must get the results a rank-by-rank computation gives, with no error.
 */
static void test_group_chain(ncclComm_t comm, const char *what, int chains_rank)
{
    enum { K = 5, C = 16 };
    int n = g_nranks;
    float in[K][C], out[K][C], want[K][C];
    int me = chains_rank < 0 || chains_rank == g_rank;
    for (int m = 0; m < K; m++)
        for (int i = 0; i < C; i++) {
            in[m][i] = chain_value(g_rank, m, i);
            out[m][i] = -1;
        }
    NCCLOK(ncclGroupStart());
    for (int m = 0; m < K; m++) {
        const float *src = me && (m == 1 || m == 3) ? out[m - 1] : in[m];
        NCCLOK(ncclAllReduce(src, out[m], C, ncclFloat, ncclSum, comm, NULL));
    }
    NCCLOK(ncclGroupEnd());
    for (int m = 0; m < K; m++)
        for (int i = 0; i < C; i++) {
            float w = 0;
            for (int r = 0; r < n; r++) {
                int chained = (chains_rank < 0 || chains_rank == r) && (m == 1 || m == 3);
                w += chained ? want[m - 1][i] : chain_value(r, m, i);
            }
            want[m][i] = w;
        }
    int bad = 0;
    for (int m = 0; m < K; m++)
        for (int i = 0; i < C; i++)
            bad += out[m][i] != want[m][i];
    CHECK(bad == 0, "group of %d all-reduces, %s: %d wrong (member 3: %g, want %g)", K, what, bad,
          out[3][0], want[3][0]);
}

/* Nobody chains: 5 all-reduces of 13 floats fuse into one of 65 (the api-fused test greps the
 * log line every rank writes). */
static void test_group_fused(ncclComm_t comm)
{
    enum { K = 5, C = 13 };
    int n = g_nranks;
    float in[K][C], out[K][C];
    for (int m = 0; m < K; m++)
        for (int i = 0; i < C; i++)
            in[m][i] = chain_value(g_rank, m, i);
    NCCLOK(ncclGroupStart());
    for (int m = 0; m < K; m++)
        NCCLOK(ncclAllReduce(in[m], out[m], C, ncclFloat, ncclSum, comm, NULL));
    NCCLOK(ncclGroupEnd());
    int bad = 0;
    for (int m = 0; m < K; m++)
        for (int i = 0; i < C; i++) {
            float w = 0;
            for (int r = 0; r < n; r++)
                w += chain_value(r, m, i);
            bad += out[m][i] != w;
        }
    CHECK(bad == 0, "fused group of %d all-reduces: %d wrong", K, bad);
}

/*
 * Two communicators in one group, issued in opposite orders by even and odd ranks, each with a
 * run that needs an agreement: the agreements must not wait for each other.
 */
static void test_group_two_comms(ncclComm_t comm)
{
    enum { K = 4, C = 8 };
    ncclComm_t dup;
    NCCLOK(ncclCommSplit(comm, 0, g_rank, &dup, NULL));
    int n = g_nranks;
    float in[2][K][C], out[2][K][C];
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < K; m++)
            for (int i = 0; i < C; i++)
                in[c][m][i] = chain_value(g_rank, m + c * K, i);
    NCCLOK(ncclGroupStart());
    for (int j = 0; j < 2; j++) {
        int c = g_rank % 2 ? 1 - j : j;
        for (int m = 0; m < K; m++)
            NCCLOK(ncclAllReduce(in[c][m], out[c][m], C, ncclFloat, ncclSum, c ? dup : comm,
                                 NULL));
    }
    NCCLOK(ncclGroupEnd());
    int bad = 0;
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < K; m++)
            for (int i = 0; i < C; i++) {
                float w = 0;
                for (int r = 0; r < n; r++)
                    w += chain_value(r, m + c * K, i);
                bad += out[c][m][i] != w;
            }
    CHECK(bad == 0, "group over two communicators in opposite orders: %d wrong", bad);
    NCCLOK(ncclCommDestroy(dup));
}

/* PreMulSum for every floating type, host-immediate and pointer scalars. */
static void test_premulsum(ncclComm_t comm)
{
    static const int types[] = {ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16,
                                ncclFloat8e4m3, ncclFloat8e5m2};
    int n = g_nranks;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        int t = types[ti];
        size_t es = weft_dtype_size(t), count = 37;
        for (int residence = 0; residence < 2; residence++) {
            unsigned char scalar[8], *buf = malloc(count * es), *out = malloc(count * es);
            double sc = (g_rank % 2) ? 2.0 : 1.0;
            weft_dtype_from_double(t, sc, scalar);
            for (size_t i = 0; i < count; i++)
                weft_dtype_from_double(t, (double)((i + (size_t)g_rank) % 2), buf + i * es);
            ncclRedOp_t op;
            NCCLOK(ncclRedOpCreatePreMulSum(&op, scalar, (ncclDataType_t)t,
                                            (ncclScalarResidence_t)residence, comm));
            NCCLOK(ncclAllReduce(buf, out, count, (ncclDataType_t)t, op, comm, NULL));
            NCCLOK(ncclRedOpDestroy(op, comm));
            int bad = 0;
            for (size_t i = 0; i < count; i++) {
                double want = 0;
                for (int p = 0; p < n; p++)
                    want += ((p % 2) ? 2.0 : 1.0) * (double)((i + (size_t)p) % 2);
                unsigned char w[8];
                weft_dtype_from_double(t, want, w);
                bad += memcmp(w, out + i * es, es) != 0;
            }
            CHECK(bad == 0, "PreMulSum type %d residence %d: %d wrong", t, residence, bad);
            free(buf);
            free(out);
        }
    }
    /* A destroyed op and a built-in op cannot be destroyed/used. */
    ncclRedOp_t op;
    float one = 1;
    NCCLOK(ncclRedOpCreatePreMulSum(&op, &one, ncclFloat32, ncclScalarHostImmediate, comm));
    NCCLOK(ncclRedOpDestroy(op, comm));
    CHECK(ncclRedOpDestroy(op, comm) == ncclInvalidArgument, "double destroy");
    CHECK(ncclAllReduce(&one, &one, 1, ncclFloat32, op, comm, NULL) == ncclInvalidArgument,
          "use after destroy");
    CHECK(ncclRedOpDestroy(ncclSum, comm) == ncclInvalidArgument, "destroy built-in");
}

/* Host streams: issue work, compute while it runs, then synchronize and check. */
static void test_host_stream(ncclComm_t comm)
{
    int n = g_nranks;
    weftStream_t st;
    NCCLOK(weftStreamCreate(&st));
    enum { K = 8 };
    size_t count = 1 << 18;
    float *bufs[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++)
            bufs[k][i] = (float)(k + g_rank + (int)(i % 3));
        NCCLOK(ncclAllReduce(bufs[k], bufs[k], count, ncclFloat, ncclSum, comm,
                             weftStreamAsCuda(st)));
    }
    /* computation overlapping the communication */
    volatile double acc = 0;
    for (int i = 0; i < 2000000; i++)
        acc += i * 0.5;
    NCCLOK(weftStreamSynchronize(st));
    for (int k = 0; k < K; k++) {
        int bad = 0;
        for (size_t i = 0; i < count; i++)
            bad += bufs[k][i] != (float)(n * (k + (int)(i % 3)) + n * (n - 1) / 2);
        CHECK(bad == 0, "host stream all-reduce %d: %d wrong", k, bad);
        free(bufs[k]);
    }
    /* A NULL-stream op after stream work on the same comm runs after it. */
    float x = 1, y = 0;
    NCCLOK(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, weftStreamAsCuda(st)));
    NCCLOK(ncclAllReduce(&y, &y, 1, ncclFloat, ncclSum, comm, NULL));
    CHECK(y == (float)(n * n), "stream then NULL-stream order: got %g", y);
    CHECK(weftStreamQuery(st) == ncclSuccess, "query idle stream");
    NCCLOK(weftStreamDestroy(st));
    CHECK(weftStreamSynchronize(st) == ncclInvalidArgument, "destroyed stream rejected");
}

/* A non-blocking communicator: init, a collective and finalize polled to completion. */
static void test_nonblocking(ncclComm_t comm)
{
    ncclUniqueId id;
    if (g_rank == 0)
        NCCLOK(ncclGetUniqueId(&id));
    NCCLOK(ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, comm, NULL));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nb = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&nb, g_nranks, id, g_rank, &cfg);
    CHECK(res == ncclInProgress || res == ncclSuccess, "non-blocking init returned %d", res);
    ncclResult_t state;
    do {
        if (ncclCommGetAsyncError(nb, &state) != ncclSuccess)
            state = ncclInternalError;
    } while (state == ncclInProgress);
    CHECK(state == ncclSuccess, "non-blocking init state %d", state);
    float v = (float)g_rank, out = -1;
    res = ncclAllReduce(&v, &out, 1, ncclFloat, ncclSum, nb, NULL);
    CHECK(res == ncclInProgress || res == ncclSuccess, "non-blocking all-reduce returned %d", res);
    do {
        ncclCommGetAsyncError(nb, &state);
    } while (state == ncclInProgress);
    CHECK(state == ncclSuccess && out == (float)(g_nranks * (g_nranks - 1) / 2),
          "non-blocking all-reduce: state %d out %g", state, out);
    res = ncclCommFinalize(nb);
    CHECK(res == ncclInProgress || res == ncclSuccess, "non-blocking finalize returned %d", res);
    do {
        ncclCommGetAsyncError(nb, &state);
    } while (state == ncclInProgress);
    CHECK(state == ncclSuccess, "finalize state %d", state);
    NCCLOK(ncclCommDestroy(nb));
}

/*
 * A count whose byte size overflows size_t is the caller's mistake: ncclInvalidArgument with a
 * message, nothing enqueued (the collectives after it still match on every rank), never an
 * allocation failure. All-gather overflows at nranks times the block; all-reduce at the block.
 */
static void test_size_overflow(ncclComm_t comm)
{
    float x = 1.0f;
    size_t huge = SIZE_MAX / 2 + 1;
    CHECK(ncclAllReduce(&x, &x, huge, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument,
          "all-reduce of %zu floats", huge);
    const char *msg = ncclGetLastError(comm);
    CHECK(msg != NULL && strstr(msg, "overflows") != NULL, "message: %s", msg ? msg : "(null)");
    CHECK(ncclBroadcast(&x, &x, SIZE_MAX, ncclFloat16, 0, comm, NULL) == ncclInvalidArgument,
          "broadcast of SIZE_MAX halves");
    if (g_nranks > 1) {
        size_t per = SIZE_MAX / 4 / (size_t)g_nranks + 1;
        CHECK(ncclAllGather(&x, &x, per, ncclFloat32, comm, NULL) == ncclInvalidArgument,
              "all-gather of %zu floats per rank on %d ranks", per, g_nranks);
    }
    /* the communicator still works */
    float v = (float)g_rank, sum = 0.0f;
    NCCLOK(ncclAllReduce(&v, &sum, 1, ncclFloat32, ncclSum, comm, NULL));
    CHECK(sum == (float)(g_nranks * (g_nranks - 1) / 2), "sum %g after the refused calls", sum);
}

static int rank_main(ncclUniqueId id)
{
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, g_nranks, id, g_rank) != ncclSuccess) {
        CHECK(0, "init");
        return 1;
    }
    test_alltoall_inplace_nocopy(comm); /* first: it measures the peak resident memory */
    test_ring(comm, 1);
    test_ring(comm, 1000);
    test_ring(comm, 300000);
    for (unsigned seed = 0; seed < 3; seed++)
        test_all_pairs(comm, seed == 2 ? 100000 : 33, seed);
    for (int again = 0; again < 3; again++)
        test_ordered_same_peer(comm);
    test_group_repeat(comm);
    for (int grouped = 0; grouped < 2; grouped++) {
        test_alltoall(comm, 1, grouped);
        test_alltoall(comm, 1023, grouped);
        test_alltoall(comm, 100003, grouped);
    }
    test_alltoall_inplace(comm, 5);
    test_alltoall_inplace(comm, 70001);
    test_alltoall_mixed(comm, 1);
    test_alltoall_mixed(comm, 70001);
    for (int inplace = 0; inplace < 2; inplace++) {
        test_gather_scatter(comm, 7, 0, inplace);
        test_gather_scatter(comm, 50001, g_nranks - 1, inplace);
    }
    test_nested_groups(comm);
    test_group_dependency(comm);
    test_group_chain(comm, "one rank chains", g_nranks > 1 ? 1 : 0);
    test_group_chain(comm, "every rank chains", -1);
    test_group_chain(comm, "the last rank chains", g_nranks - 1);
    test_group_fused(comm);
    test_group_two_comms(comm);
    test_premulsum(comm);
    test_host_stream(comm);
    test_nonblocking(comm);
    /* zero-count point-to-point is a no-op, even outside a group */
    NCCLOK(ncclSend(NULL, 0, ncclInt32, (g_rank + 1) % g_nranks, comm, NULL));
    NCCLOK(ncclRecv(NULL, 0, ncclInt32, (g_rank + 1) % g_nranks, comm, NULL));
    CHECK(ncclSend(&id, 1, ncclInt32, g_nranks, comm, NULL) == ncclInvalidArgument,
          "peer out of range");
    test_size_overflow(comm);
    test_revoke(comm);
    return 0;
}

/* One thread drives every rank: non-blocking inits and a grouped collective over all comms. */
static void test_one_thread_many_comms(int n)
{
    ncclUniqueId id;
    NCCLOK(ncclGetUniqueId(&id));
    ncclComm_t *comms = calloc((size_t)n, sizeof(*comms));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    for (int r = 0; r < n; r++) {
        ncclResult_t res = ncclCommInitRankConfig(&comms[r], n, id, r, &cfg);
        CHECK(res == ncclInProgress || res == ncclSuccess, "init rank %d returned %d", r, res);
    }
    for (int r = 0; r < n; r++) {
        ncclResult_t state;
        do {
            ncclCommGetAsyncError(comms[r], &state);
        } while (state == ncclInProgress);
        CHECK(state == ncclSuccess, "one-thread init rank %d state %d", r, state);
    }
    int *vals = calloc((size_t)n, sizeof(int));
    for (int r = 0; r < n; r++)
        vals[r] = r + 1;
    /* blocking-style driving through a group: every comm in one ncclGroupEnd */
    NCCLOK(ncclGroupStart());
    for (int r = 0; r < n; r++)
        ncclAllReduce(&vals[r], &vals[r], 1, ncclInt32, ncclSum, comms[r], NULL);
    ncclResult_t res = ncclGroupEnd();
    CHECK(res == ncclSuccess || res == ncclInProgress, "group end %d", res);
    for (int r = 0; r < n; r++) {
        ncclResult_t state;
        do {
            ncclCommGetAsyncError(comms[r], &state);
        } while (state == ncclInProgress);
        CHECK(vals[r] == n * (n + 1) / 2, "one-thread all-reduce rank %d got %d", r, vals[r]);
        NCCLOK(ncclCommDestroy(comms[r]));
    }
    free(vals);
    free(comms);
    /* ncclCommInitAll + a group of blocking collectives from one thread */
    comms = calloc((size_t)n, sizeof(*comms));
    NCCLOK(ncclCommInitAll(comms, n, NULL));
    double *d = calloc((size_t)n * 1000, sizeof(double));
    NCCLOK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < 1000; i++)
            d[r * 1000 + i] = r == 2 % n ? i : -1;
        NCCLOK(ncclBroadcast(d + r * 1000, d + r * 1000, 1000, ncclDouble, 2 % n, comms[r], NULL));
    }
    NCCLOK(ncclGroupEnd());
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 1000; i++)
            bad += d[r * 1000 + i] != i;
    CHECK(bad == 0, "InitAll grouped broadcast: %d wrong", bad);
    for (int r = 0; r < n; r++)
        NCCLOK(ncclCommDestroy(comms[r]));
    free(d);
    free(comms);
}

int main(int argc, char **argv)
{
    int nranks = 2, timeout = 120, opt;
    while ((opt = getopt(argc, argv, "n:t:")) != -1) {
        if (opt == 'n')
            nranks = atoi(optarg);
        else if (opt == 't')
            timeout = atoi(optarg);
        else
            return 2;
    }
    g_nranks = nranks;
    g_counts = mmap(NULL, sizeof(*g_counts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    ncclUniqueId id;
    struct weft_test_id_pipe ip;
    if (weft_test_id_pipe_open(&ip) != 0)
        return 1;
    fflush(NULL);
    pid_t *pids = calloc((size_t)nranks + 1, sizeof(pid_t));
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            g_rank = r;
            alarm(weft_test_scaled((unsigned)timeout));
            _exit(weft_test_id_pipe_recv(&ip, &id) != 0 ? 3 : rank_main(id));
        }
    }
    /* the single-process multi-communicator part runs beside the ranks */
    pids[nranks] = fork();
    if (pids[nranks] == 0) {
        g_rank = -1;
        alarm(weft_test_scaled((unsigned)timeout));
        close(ip.fd[0]);
        close(ip.fd[1]);
        test_one_thread_many_comms(nranks);
        _exit(0);
    }
    weft_test_id_pipe_send(&ip, nranks, &id);
    int bad = 0;
    for (int r = 0; r <= nranks; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "process %d died (status 0x%x)\n", r, status);
            bad++;
            for (int k = 0; k <= nranks; k++)
                kill(pids[k], SIGKILL);
        }
    }
    printf("%d passed, %d failed\n", g_counts->passed, g_counts->failed + bad);
    return g_counts->failed + bad ? 1 : 0;
}
