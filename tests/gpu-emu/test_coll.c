/*
 * The CUDA executor on the emulated GPU (WEFT_CUDA=emu:D): ranks are threads of this process,
 * buffers are device memory, every collective runs as kernels on streams. Results are checked
 * element by element (bitwise) against a plain loop over what each rank contributed, with inputs
 * that keep every intermediate exact, so any reduction order gives the same bits (the reference of
 * tests/common/coll_ref.h, shared with tests/mp/test_colls.c).
 *
 * Usage: test_coll CASE [-n NRANKS] [-d DEVICES] [-s] [-q] [-a]
 *   sweep      every collective x type x op x count x in/out-of-place (ncclCommInitAll; rank i on
 *              device i % D); -s: all ranks on one user stream inside one group; -q: fewer types;
 *              -a: every type and op for every collective (otherwise all-reduce only); the
 *              protocol is NCCL_PROTO's (unset: LL for the small counts, Simple for the large)
 *   multicomm  one group over two communicators (all-reduce on one, all-gather on the other)
 *   initrank   one thread per rank, each ncclCommInitRank on its device and its own stream
 *              (-b: non-blocking communicators, ncclCommInitRankConfig with blocking = 0)
 *   zcopy      registered device buffers go direct (WEFT_ZCOPY_MIN_BYTES set low): every
 *              candidate collective x type x op x in/out of place checked and counted
 *              (weft_zcopy_count); one rank unregistered; deregistration; a graph replayed 3 times
 *   queues     one thread per rank, 24 operations issued back to back, synchronised at the end
 *              (run with CUDA_DEVICE_MAX_CONNECTIONS=1: the ranks of a device share one queue)
 *   lonely     rank 0 of 2 on one device calls alone from its own thread (WEFT_TEST_LONELY=abort,
 *              left or timeout): its call waits for rank 1 and ends as that says
 *   graph      3 all-reduces captured into a graph, replayed 5 times, checked after each replay
 *   graph-watchdog  an all-reduce captured while another thread polls ncclCommGetAsyncError
 *   graph-memfree   an all-reduce captured while another thread calls ncclMemFree
 *   biggroup   one group of 101 operations per rank (send/recv in orders that differ between
 *              ranks, an all-reduce): more than one launch holds, cut where every rank agrees
 *   abort      rank 0 launches alone; ncclCommAbort makes its kernel leave within 1 s
 *   timeout    rank 0 launches alone with WEFT_TIMEOUT=2: the error names peer 1
 *   badbuf     a device buffer on a communicator of another device, host/device mix
 *   mismatch   rank 0 sends more than rank 1 receives: rank 1 reports it, naming peer 0
 *   sig        (WEFT_TEST_SIG=count|dtype|op|root|coll) rank 0 of 2 calls another count,
 *              datatype (int32 against float), op (max against sum), broadcast root or
 *              collective; both ranks' kernels stop (the root case at WEFT_TIMEOUT: no data moves)
 *              and each rank, checked from its own thread, fails naming both calls (from the
 *              NCCL_DEBUG_FILE log); no output element holds the other rank's data
 *   skip       rank 1 never joins all-reduce #2 (WEFT_TIMEOUT=2): rank 0's error names it
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/coll_ref.h"
#include "coll_cases.h"
#include "../common/elem.h"
#include "cuda/cuda_ops.h"
#include "emu_check.h"
#include "core/comm.h"
#include "exec/zcopy.h"
#include "nccl.h"
#include "redop.h"
#include "weft.h"

#define MAXR 8
#define MAX_FAIL_PRINT 20


static int g_n = 2, g_d = 1, g_one_stream, g_quick, g_nonblocking, g_all;
static int g_passed, g_failed, g_printed;
static const struct weft_cuda_ops *cu;

/* ---- one configuration over all ranks ---------------------------------------------------- */

struct rank_bufs {
    char *dsend, *drecv; /* device */
    char *hsend, *hrecv; /* host staging */
    char *dscalar;       /* a PreMulSum scalar in device memory (ncclScalarDevice) */
    size_t bytes;
    cudaStream_t stream;
    void *hsend_reg, *hrecv_reg; /* ncclCommRegister handles (case zcopy) */
};

static ncclComm_t g_comms[MAXR];
static struct rank_bufs g_bufs[MAXR];
static int g_dev[MAXR];
/* case zcopy: ranks whose buffers bufs_ensure registers (bit r) */
static unsigned g_reg_mask;
static int g_reg_send_only; /* register the send buffers only */

static void bufs_unregister(int r)
{
    struct rank_bufs *b = &g_bufs[r];
    if (b->hsend_reg != NULL)
        check(ncclCommDeregister(g_comms[r], b->hsend_reg), "ncclCommDeregister");
    if (b->hrecv_reg != NULL)
        check(ncclCommDeregister(g_comms[r], b->hrecv_reg), "ncclCommDeregister");
    b->hsend_reg = b->hrecv_reg = NULL;
}

static void bufs_register(int r)
{
    struct rank_bufs *b = &g_bufs[r];
    bufs_unregister(r);
    if (!(g_reg_mask >> r & 1) || b->dsend == NULL)
        return;
    check(ncclCommRegister(g_comms[r], b->dsend, b->bytes, &b->hsend_reg), "ncclCommRegister");
    if (!g_reg_send_only)
        check(ncclCommRegister(g_comms[r], b->drecv, b->bytes, &b->hrecv_reg),
              "ncclCommRegister");
}

static void bufs_ensure(int r, size_t bytes)
{
    struct rank_bufs *b = &g_bufs[r];
    if (b->bytes >= bytes)
        return;
    CU(cu->set_device(g_dev[r]));
    bufs_unregister(r);
    if (b->dsend != NULL) {
        CU(cu->free(b->dsend));
        CU(cu->free(b->drecv));
    }
    free(b->hsend);
    free(b->hrecv);
    CU(cu->malloc((void **)&b->dsend, bytes));
    CU(cu->malloc((void **)&b->drecv, bytes));
    b->hsend = malloc(bytes);
    b->hrecv = malloc(bytes);
    b->bytes = bytes;
    bufs_register(r);
}

static void fail(const char *what, int coll, int t, int op, size_t count, int inplace, int r,
                 size_t i, double got, double want)
{
    g_failed++;
    if (g_printed++ < MAX_FAIL_PRINT)
        fprintf(stderr,
                "FAIL %s %s type %d op %s count %zu %s rank %d index %zu: got %.17g want %.17g\n",
                what, coll_names[coll], t, op_name(op), count,
                inplace ? "in-place" : "out-of-place", r, i, got, want);
}

static double contrib(int coll, int t, int op, int r, size_t i)
{
    return coll_contrib(coll, t, op, r, i, g_n);
}

static ncclRedOp_t make_op(int r, int t, int op)
{
    if (op != OP_PREMUL)
        return builtin_op(op);
    unsigned char scalar[8];
    ncclRedOp_t o = ncclSum;
    store(t, scalar, 0, premul_scalar(r));
    /* Odd types take the scalar from device memory, read by the kernel when it runs. */
    void *where = scalar;
    ncclScalarResidence_t res = ncclScalarHostImmediate;
    if (t % 2 == 1) {
        struct rank_bufs *b = &g_bufs[r];
        CU(cu->set_device(g_dev[r]));
        if (b->dscalar == NULL)
            CU(cu->malloc((void **)&b->dscalar, 8));
        CU(cu->memcpy_async(b->dscalar, scalar, 8, NULL));
        CU(cu->stream_synchronize(NULL));
        where = b->dscalar;
        res = ncclScalarDevice;
    }
    check(ncclRedOpCreatePreMulSum(&o, where, (ncclDataType_t)t, res, g_comms[r]),
          "ncclRedOpCreatePreMulSum");
    return o;
}

/* Rank r's stream: its own, or with -s the one of the first rank on its device (CUDA fails an
 * operation on a stream of another device than the communicator's). */
static cudaStream_t user_stream(int r)
{
    return g_bufs[g_one_stream ? r % g_d : r].stream;
}

static void run_one(int coll, int t, int op, size_t count, int inplace, int root)
{
    int n = g_n;
    size_t es = weft_dtype_size(t);
    size_t in_elems = count, out_elems = count;
    int a2a = coll == C_ALLTOALL || coll == C_P2PALL;
    if (coll == C_ALLGATHER || a2a || coll == C_GATHER)
        out_elems = count * n;
    if (coll == C_REDUCESCATTER || a2a || coll == C_SCATTER)
        in_elems = count * n;
    size_t big = (in_elems > out_elems ? in_elems : out_elems) + 1;
    const char *inptr[MAXR];
    char *outptr[MAXR];
    ncclRedOp_t rops[MAXR];
    for (int r = 0; r < n; r++) {
        bufs_ensure(r, big * es);
        struct rank_bufs *b = &g_bufs[r];
        memset(b->hrecv, 0x5a, big * es);
        char *hin = b->hsend, *din = b->dsend, *dout = b->drecv;
        /* In place: NCCL's layouts (all-gather's input is its block of the output, ...). */
        int ip = inplace && (coll != C_GATHER && coll != C_SCATTER ? 1 : r == root);
        if (ip) {
            hin = b->hrecv;
            din = b->drecv;
            if (coll == C_ALLGATHER || coll == C_GATHER) {
                hin = b->hrecv + (size_t)r * count * es;
                din = b->drecv + (size_t)r * count * es;
            }
            if (coll == C_REDUCESCATTER || coll == C_SCATTER)
                dout = b->drecv + (size_t)r * count * es;
        }
        for (size_t i = 0; i < in_elems; i++)
            store(t, hin, i, contrib(coll, t, op, r, i));
        CU(cu->set_device(g_dev[r]));
        CU(cu->memcpy_async(b->drecv, b->hrecv, big * es, NULL));
        if (!ip)
            CU(cu->memcpy_async(b->dsend, b->hsend, in_elems * es + 1, NULL));
        CU(cu->stream_synchronize(NULL));
        inptr[r] = din;
        outptr[r] = dout;
        rops[r] = coll <= C_REDUCESCATTER ? make_op(r, t, op) : ncclSum;
    }
    int ok = check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < n && ok; r++) {
        ncclComm_t c = g_comms[r];
        cudaStream_t s = user_stream(r);
        ncclResult_t res = ncclSuccess;
        switch (coll) {
        case C_ALLREDUCE: res = ncclAllReduce(inptr[r], outptr[r], count, t, rops[r], c, s); break;
        case C_REDUCE:
            res = ncclReduce(inptr[r], outptr[r], count, t, rops[r], root, c, s);
            break;
        case C_REDUCESCATTER:
            res = ncclReduceScatter(inptr[r], outptr[r], count, t, rops[r], c, s);
            break;
        case C_ALLGATHER: res = ncclAllGather(inptr[r], outptr[r], count, t, c, s); break;
        case C_BROADCAST: res = ncclBroadcast(inptr[r], outptr[r], count, t, root, c, s); break;
        case C_ALLTOALL: res = ncclAlltoAll(inptr[r], outptr[r], count, t, c, s); break;
        case C_GATHER: res = ncclGather(inptr[r], outptr[r], count, t, root, c, s); break;
        case C_SCATTER: res = ncclScatter(inptr[r], outptr[r], count, t, root, c, s); break;
        case C_SENDRECV:
            res = ncclSend(inptr[r], count, t, (r + 1) % n, c, s);
            if (res == ncclSuccess)
                res = ncclRecv(outptr[r], count, t, (r + n - 1) % n, c, s);
            break;
        default: /* every pair, this rank included, both ways, in one group */
            for (int j = 0; j < n && res == ncclSuccess; j++) {
                int peer = (r + j) % n; /* a different order on every rank */
                res = ncclSend(inptr[r] + (size_t)peer * count * es, count, t, peer, c, s);
                if (res == ncclSuccess)
                    res = ncclRecv(outptr[r] + (size_t)peer * count * es, count, t, peer, c, s);
            }
            break;
        }
        ok = check(res, coll_names[coll]);
    }
    ok &= check(ncclGroupEnd(), "ncclGroupEnd");
    for (int r = 0; r < n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_synchronize(user_stream(r)));
        if (coll <= C_REDUCESCATTER && op == OP_PREMUL)
            ncclRedOpDestroy(rops[r], g_comms[r]);
    }
    if (!ok) {
        fail("call", coll, t, op, count, inplace, -1, 0, 0, 0);
        return;
    }
    for (int r = 0; r < n; r++) {
        struct rank_bufs *b = &g_bufs[r];
        CU(cu->set_device(g_dev[r]));
        CU(cu->memcpy_async(b->hrecv, b->drecv, big * es, NULL));
        CU(cu->stream_synchronize(NULL));
        const char *out = b->hrecv + (size_t)(outptr[r] - b->drecv);
        size_t nout = out_elems;
        if (coll == C_REDUCESCATTER || coll == C_SCATTER || coll == C_SENDRECV)
            nout = count;
        if ((coll == C_REDUCE || coll == C_GATHER) && r != root)
            continue;
        int rok = 1;
        for (size_t i = 0; i < nout && rok; i++) {
            double want = coll_want(coll, t, op, r, root, n, count, i);
            unsigned char wbits[8];
            store(t, wbits, 0, round_to(t, want));
            if (memcmp(out + i * es, wbits, es) != 0) {
                fail("data", coll, t, op, count, inplace, r, i, load(t, out, i), want);
                rok = 0;
            }
        }
        /* Nothing past the output may be written. */
        size_t end = (size_t)(out - b->hrecv) + nout * es;
        if (rok && !inplace && (unsigned char)b->hrecv[end] != 0x5a) {
            fail("overrun", coll, t, op, count, inplace, r, nout, b->hrecv[end], 0x5a);
            rok = 0;
        }
        if (rok)
            g_passed++;
    }
}

static int init_all(ncclComm_t *comms)
{
    if (!check(ncclCommInitAll(comms, g_n, NULL), "ncclCommInitAll"))
        return 0;
    for (int r = 0; r < g_n; r++) {
        int dev = -1;
        if (!check(ncclCommCuDevice(comms[r], &dev), "ncclCommCuDevice"))
            return 0;
        if (dev != r % g_d) {
            fprintf(stderr, "FAIL rank %d bound to device %d, expected %d\n", r, dev, r % g_d);
            return 0;
        }
    }
    return 1;
}

static void setup_streams(void)
{
    for (int r = 0; r < g_n; r++) {
        g_dev[r] = r % g_d;
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_create((weft_cuda_stream_t *)&g_bufs[r].stream));
    }
    CU(cu->set_device(0));
}

static void teardown(void)
{
    for (int r = 0; r < g_n; r++) {
        if (g_comms[r] != NULL)
            bufs_unregister(r);
        if (g_comms[r] != NULL)
            check(ncclCommDestroy(g_comms[r]), "ncclCommDestroy");
        g_comms[r] = NULL;
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_destroy(g_bufs[r].stream));
        if (g_bufs[r].dsend != NULL) {
            CU(cu->free(g_bufs[r].dsend));
            CU(cu->free(g_bufs[r].drecv));
        }
        if (g_bufs[r].dscalar != NULL)
            CU(cu->free(g_bufs[r].dscalar));
        free(g_bufs[r].hsend);
        free(g_bufs[r].hrecv);
        memset(&g_bufs[r], 0, sizeof(g_bufs[r]));
    }
}

/* Streams and ncclCommInitAll communicators in g_comms for the g_n ranks; 0 if init fails. */
static int setup_all(void)
{
    setup_streams();
    return init_all(g_comms);
}

/* Counts the one result of a check that is not per element. */
static void tally(int ok)
{
    if (ok)
        g_passed++;
    else
        g_failed++;
}

/* Ends a case that made its ranks with setup_all: counts its result, frees everything. */
static int finish(int ok)
{
    teardown();
    tally(ok);
    return 0;
}

static int case_sweep(void)
{
    if (!setup_all())
        return 1;
    static const size_t counts[] = {0, 1, 7, 1023, 65536 + 3};
    static const int few_types[] = {ncclFloat32, ncclInt8, ncclBfloat16};
    for (int coll = 0; coll < NCOLLS; coll++) {
        int reducing = coll <= C_REDUCESCATTER;
        int all_types = (coll == C_ALLREDUCE || g_all) && !g_quick;
        int all_ops = coll == C_ALLREDUCE || g_all;
        int ntypes = all_types ? 12 : 3;
        for (int ti = 0; ti < ntypes; ti++) {
            int t = all_types ? ti : few_types[ti];
            int nops = !reducing ? 1 : all_ops ? NOPS : 2;
            for (int oi = 0; oi < nops; oi++) {
                int op = !reducing ? -1 : all_ops ? oi : oi == 0 ? OP_SUM : OP_MAX;
                for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                    int big = counts[ci] > 60000;
                    /* The large count on a subset of types and ops, to stay fast. */
                    if (big && coll == C_ALLREDUCE && ti % 4 != 0 && oi != 0)
                        continue;
                    for (int inplace = 0; inplace < 2; inplace++) {
                        if (inplace && coll >= C_SENDRECV)
                            continue;
                        size_t count = counts[ci];
                        if (big && (coll == C_ALLGATHER || coll == C_REDUCESCATTER ||
                                    coll == C_ALLTOALL || coll == C_GATHER ||
                                    coll == C_SCATTER || coll == C_P2PALL))
                            count = count / (size_t)g_n + 1;
                        run_one(coll, t, op, count, inplace, (int)((ci + (size_t)ti) % g_n));
                    }
                }
            }
        }
    }
    teardown();
    return 0;
}


/* ---- registered device buffers (zero-copy, the direct kernel) ---------------------------- */

static int graph_run(int reg, int reps);
static int zc_peers_reach(void);

/* 0 with WEFT_EMU_PEER=0 on 2 devices: they cannot map each other's memory, nothing goes direct. */
static int zc_peers_reach(void)
{
    const char *peer = getenv("WEFT_EMU_PEER");
    return g_d == 1 || peer == NULL || strcmp(peer, "0") != 0;
}

/* 1 when run_one's operation must have gone direct on every rank: every rank registered, and
 * the larger buffer at least WEFT_ZCOPY_MIN_BYTES (the test sets it). */
static int zc_expect(int coll, int t, size_t count)
{
    const char *e = getenv("WEFT_ZCOPY_MIN_BYTES");
    long long min = e != NULL ? atoll(e) : 262144;
    if (!zc_peers_reach())
        return 0;
    /* the larger of the input and the output */
    size_t bytes = count * weft_dtype_size(t) * (coll == C_ALLREDUCE ? 1 : (size_t)g_n);
    return g_n > 1 && min > 0 && bytes > 0 && bytes >= (size_t)min &&
           g_reg_mask == (1u << g_n) - 1 && coll <= C_ALLGATHER && coll != C_REDUCE &&
           (!g_reg_send_only || coll != C_ALLREDUCE);
}

/* run_one, then checks on every rank that the operation went direct exactly when it must. */
static void zc_run(int coll, int t, int op, size_t count, int inplace)
{
    uint64_t before[MAXR];
    for (int r = 0; r < g_n; r++) {
        bufs_ensure(r, (count * (size_t)g_n + 1) * weft_dtype_size(t));
        before[r] = weft_zcopy_count(g_comms[r]);
    }
    run_one(coll, t, op, count, inplace, 0);
    uint64_t want = (uint64_t)zc_expect(coll, t, count);
    for (int r = 0; r < g_n; r++) {
        uint64_t ran = weft_zcopy_count(g_comms[r]) - before[r];
        if (ran != want) {
            fail("direct-count", coll, t, op, count, inplace, r, 0, (double)ran, (double)want);
            continue;
        }
        g_passed++;
    }
}

/*
 * Registered device buffers (WEFT_ZCOPY_MIN_BYTES set low by the test): all-reduce,
 * reduce-scatter and all-gather x types x ops x in/out of place, every element checked and each
 * operation checked to have run direct (weft_zcopy_count) exactly when every rank registered
 * and it is large enough; then one rank unregistered (normal path, right results), a
 * deregistration between two operations, and a captured graph replayed 3 times.
 */
static int case_zcopy(void)
{
    if (!setup_all())
        return 1;
    static const int types[] = {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32, ncclFloat8e4m3};
    static const int colls[] = {C_ALLREDUCE, C_REDUCESCATTER, C_ALLGATHER};
    static const size_t counts[] = {7, 1500, 65536 + 3};
    g_reg_mask = (1u << g_n) - 1;
    for (int ci = 0; ci < 3; ci++) {
        int coll = colls[ci];
        for (int ti = 0; ti < (int)(sizeof(types) / sizeof(types[0])); ti++) {
            int nops = coll == C_ALLGATHER ? 1 : NOPS;
            for (int op = 0; op < nops; op++)
                for (int k = 0; k < 3; k++) {
                    if (k == 2 && (op != 0 || (ti != 0 && ti != 2)))
                        continue; /* the large count on a few cases, to stay fast */
                    for (int inplace = 0; inplace < 2; inplace++)
                        zc_run(coll, types[ti], coll == C_ALLGATHER ? -1 : op, counts[k],
                               inplace);
                }
        }
    }
    /* More than one 1 MiB piece per block of the direct kernel (2 blocks by default). */
    for (int ci = 0; ci < 3; ci++)
        for (int inplace = 0; inplace < 2; inplace++)
            zc_run(colls[ci], ncclFloat32, colls[ci] == C_ALLGATHER ? -1 : OP_SUM,
                   (1u << 20) + 5, inplace);
    /* The last rank unregistered: everyone takes the normal path. */
    g_reg_mask = (1u << g_n) - 1 - (1u << (g_n - 1));
    for (int r = 0; r < g_n; r++)
        bufs_register(r);
    for (int ci = 0; ci < 3; ci++)
        for (int inplace = 0; inplace < 2; inplace++)
            zc_run(colls[ci], ncclFloat32, colls[ci] == C_ALLGATHER ? -1 : OP_SUM, 1500, inplace);
    /* Send buffers only: all-gather and reduce-scatter (in place too: the input lies in the
     * unregistered output then, so only out of place goes direct) still go direct, all-reduce
     * does not. */
    g_reg_mask = (1u << g_n) - 1;
    g_reg_send_only = 1;
    for (int r = 0; r < g_n; r++)
        bufs_register(r);
    for (int ci = 0; ci < 3; ci++)
        zc_run(colls[ci], ncclFloat32, colls[ci] == C_ALLGATHER ? -1 : OP_SUM, 1500, 0);
    g_reg_send_only = 0;
    /* Registered, one direct all-reduce; deregistered, the next one takes the normal path. */
    for (int r = 0; r < g_n; r++)
        bufs_register(r);
    zc_run(C_ALLREDUCE, ncclFloat32, OP_SUM, 1500, 0);
    g_reg_mask = 0;
    for (int r = 0; r < g_n; r++)
        bufs_register(r);
    zc_run(C_ALLREDUCE, ncclFloat32, OP_SUM, 1500, 0);
    tally(graph_run(1, 3));
    teardown();
    return 0;
}

static int case_multicomm(void)
{
    setup_streams();
    ncclComm_t b[MAXR];
    if (!init_all(g_comms) || !init_all(b))
        return 1;
    size_t count = 4099;
    float *dx[MAXR], *dz[MAXR], *dy[MAXR], *hx = malloc(count * g_n * sizeof(float));
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&dx[r], count * sizeof(float)));
        CU(cu->malloc((void **)&dz[r], count * sizeof(float)));
        CU(cu->malloc((void **)&dy[r], count * g_n * sizeof(float)));
        for (size_t i = 0; i < count; i++)
            hx[i] = (float)(r + 1) * (float)(i % 100);
        CU(cu->memcpy_async(dx[r], hx, count * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL)); /* hx is reused at once */
        for (size_t i = 0; i < count; i++)
            hx[i] = (float)(r * 10000 + (int)i);
        CU(cu->memcpy_async(dz[r], hx, count * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
    }
    /* One group: an all-reduce on the first communicators and an all-gather on the second.
     * Operations of one group on different communicators are not ordered (as in NCCL): they
     * touch different buffers. */
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < g_n; r++) {
        check(ncclAllReduce(dx[r], dx[r], count, ncclFloat32, ncclSum, g_comms[r],
                            g_bufs[r].stream), "ncclAllReduce");
        check(ncclAllGather(dz[r], dy[r], count, ncclFloat32, b[r], g_bufs[r].stream),
              "ncclAllGather");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    float tot = (float)(g_n * (g_n + 1) / 2);
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_synchronize(g_bufs[r].stream));
        CU(cu->memcpy_async(hx, dy[r], count * g_n * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
        int ok = 1;
        for (size_t i = 0; i < count * g_n && ok; i++) {
            float want = (float)((int)(i / count) * 10000 + (int)(i % count));
            if (hx[i] != want) {
                fail("data", C_ALLGATHER, ncclFloat32, -1, count, 0, r, i, hx[i], want);
                ok = 0;
            }
        }
        CU(cu->memcpy_async(hx, dx[r], count * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
        for (size_t i = 0; i < count && ok; i++) {
            float want = tot * (float)(i % 100);
            if (hx[i] != want) {
                fail("data", C_ALLREDUCE, ncclFloat32, OP_SUM, count, 1, r, i, hx[i], want);
                ok = 0;
            }
        }
        g_passed += ok;
        CU(cu->free(dx[r]));
        CU(cu->free(dy[r]));
        CU(cu->free(dz[r]));
    }
    /* A group of more operations than one launch carries (WEFT_DEV_MAX_OPS): several launches
     * per communicator, in order; then ncclCommFinalize waits for them. */
    enum { NOPS_BIG = 40 };
    size_t small = 33;
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&dx[r], NOPS_BIG * small * sizeof(float)));
        for (size_t i = 0; i < NOPS_BIG * small; i++)
            hx[i] = (float)(r + (int)(i / small));
        CU(cu->memcpy_async(dx[r], hx, NOPS_BIG * small * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
    }
    check(ncclGroupStart(), "ncclGroupStart");
    for (int k = 0; k < NOPS_BIG; k++)
        for (int r = 0; r < g_n; r++)
            check(ncclAllReduce(dx[r] + k * small, dx[r] + k * small, small, ncclFloat32, ncclSum,
                                b[r], g_bufs[r].stream), "ncclAllReduce");
    check(ncclGroupEnd(), "ncclGroupEnd");
    for (int r = 0; r < g_n; r++)
        check(ncclCommFinalize(b[r]), "ncclCommFinalize");
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->memcpy_async(hx, dx[r], NOPS_BIG * small * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
        int ok = 1;
        for (size_t i = 0; i < NOPS_BIG * small && ok; i++) {
            float want = (float)(g_n * (g_n - 1) / 2 + g_n * (int)(i / small));
            if (hx[i] != want) {
                fail("data", C_ALLREDUCE, ncclFloat32, OP_SUM, small, 1, r, i, hx[i], want);
                ok = 0;
            }
        }
        g_passed += ok;
        CU(cu->free(dx[r]));
    }
    free(hx);
    for (int r = 0; r < g_n; r++)
        check(ncclCommDestroy(b[r]), "ncclCommDestroy");
    teardown();
    return 0;
}

/* ---- one thread per rank ----------------------------------------------------------------- */

struct thr {
    int rank;
    ncclUniqueId id;
    int ok;
};

static void *initrank_thread(void *arg)
{
    struct thr *th = arg;
    int r = th->rank, dev = r % g_d;
    CU(cu->set_device(dev));
    ncclComm_t comm;
    if (g_nonblocking) {
        /* Non-blocking: the init goes on in the background; device work once it is done. */
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t res = ncclCommInitRankConfig(&comm, g_n, th->id, r, &cfg);
        if (res != ncclSuccess && res != ncclInProgress) {
            check(res, "ncclCommInitRankConfig");
            return NULL;
        }
        ncclResult_t state = ncclInProgress;
        while (state == ncclInProgress) {
            if (!check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError"))
                return NULL;
            usleep(1000);
        }
        if (!check(state, "non-blocking init"))
            return NULL;
    } else if (!check(ncclCommInitRank(&comm, g_n, th->id, r), "ncclCommInitRank")) {
        return NULL;
    }
    weft_cuda_stream_t s;
    CU(cu->stream_create(&s));
    size_t count = 10007;
    int32_t *d, *h = malloc(count * sizeof(int32_t));
    CU(cu->malloc((void **)&d, count * sizeof(int32_t)));
    int ok = 1;
    for (int iter = 0; iter < 5 && ok; iter++) {
        for (size_t i = 0; i < count; i++)
            h[i] = (int32_t)(r * 1000 + (int)i + iter);
        CU(cu->memcpy_async(d, h, count * sizeof(int32_t), s));
        ok &= check(ncclAllReduce(d, d, count, ncclInt32, ncclSum, comm, (cudaStream_t)s),
                    "ncclAllReduce");
        CU(cu->memcpy_async(h, d, count * sizeof(int32_t), s));
        CU(cu->stream_synchronize(s));
        for (size_t i = 0; i < count && ok; i++) {
            int32_t want = 1000 * g_n * (g_n - 1) / 2 + g_n * ((int)i + iter);
            if (h[i] != want) {
                fprintf(stderr, "FAIL initrank rank %d iter %d index %zu: got %d want %d\n", r,
                        iter, i, h[i], want);
                ok = 0;
            }
        }
    }
    /* Split by parity from another current device: the child stays on the parent's device and
     * reduces device buffers among its half. */
    if (ok && !g_nonblocking) {
        CU(cu->set_device((dev + 1) % g_d));
        ncclComm_t child = NULL;
        ok &= check(ncclCommSplit(comm, r % 2, r, &child, NULL), "ncclCommSplit");
        CU(cu->set_device(dev));
        int cdev = -1, cn = 0;
        ok &= child != NULL && check(ncclCommCuDevice(child, &cdev), "ncclCommCuDevice") &&
              check(ncclCommCount(child, &cn), "ncclCommCount");
        if (ok && cdev != dev) {
            fprintf(stderr, "FAIL split: rank %d's child on device %d, parent on %d\n", r, cdev,
                    dev);
            ok = 0;
        }
        for (size_t i = 0; ok && i < count; i++)
            h[i] = (int32_t)(r + 1);
        if (ok) {
            CU(cu->memcpy_async(d, h, count * sizeof(int32_t), s));
            ok &= check(ncclAllReduce(d, d, count, ncclInt32, ncclSum, child, (cudaStream_t)s),
                        "ncclAllReduce (child)");
            CU(cu->memcpy_async(h, d, count * sizeof(int32_t), s));
            CU(cu->stream_synchronize(s));
            int32_t want = 0;
            for (int q = r % 2; q < g_n; q += 2)
                want += q + 1;
            for (size_t i = 0; i < count && ok; i++)
                if (h[i] != want) {
                    fprintf(stderr, "FAIL split rank %d index %zu: got %d want %d\n", r, i, h[i],
                            want);
                    ok = 0;
                }
        }
        if (child != NULL)
            ok &= check(ncclCommDestroy(child), "ncclCommDestroy (child)");
    }
    CU(cu->free(d));
    free(h);
    CU(cu->stream_destroy(s));
    ok &= check(ncclCommDestroy(comm), "ncclCommDestroy");
    th->ok = ok;
    return NULL;
}

/* Runs body on a thread per rank (one unique id for all), counting each rank's result. */
static int run_rank_threads(void *(*body)(void *))
{
    ncclUniqueId id;
    if (!check(ncclGetUniqueId(&id), "ncclGetUniqueId"))
        return 1;
    pthread_t t[MAXR];
    struct thr th[MAXR];
    for (int r = 0; r < g_n; r++) {
        th[r].rank = r;
        th[r].id = id;
        th[r].ok = 0;
        pthread_create(&t[r], NULL, body, &th[r]);
    }
    for (int r = 0; r < g_n; r++) {
        pthread_join(t[r], NULL);
        tally(th[r].ok);
    }
    return 0;
}

static int case_initrank(void)
{
    return run_rank_threads(initrank_thread);
}

/*
 * Issue 29, finding 3: ranks of one device in one process, a thread each, issue 24 operations
 * back to back (all-reduces and ring send/recv groups, each into its own output) and synchronise
 * only at the end, rank r pausing 2r ms between calls so rank 0 runs ahead. With
 * CUDA_DEVICE_MAX_CONNECTIONS=1 every stream of a device feeds one in-order queue: a rank's
 * kernel k must not sit behind another rank's wait for its own kernel k-1 ... or the kernels spin
 * until WEFT_TIMEOUT. Every output is checked element by element.
 */
#define QUEUE_OPS 24
static int check_cuda(int err, const char *what);
#define QUEUE_COUNT 4096

static void *queues_thread(void *arg)
{
    struct thr *th = arg;
    int r = th->rank, n = g_n, dev = r % g_d;
    CU(cu->set_device(dev));
    ncclComm_t comm;
    if (!check(ncclCommInitRank(&comm, n, th->id, r), "ncclCommInitRank"))
        return NULL;
    weft_cuda_stream_t s;
    CU(cu->stream_create(&s));
    size_t bytes = (size_t)QUEUE_OPS * QUEUE_COUNT * sizeof(int32_t);
    int32_t *din, *dout, *h = malloc(bytes);
    CU(cu->malloc((void **)&din, bytes));
    CU(cu->malloc((void **)&dout, bytes));
    for (int k = 0; k < QUEUE_OPS; k++)
        for (size_t i = 0; i < QUEUE_COUNT; i++)
            h[(size_t)k * QUEUE_COUNT + i] = (int32_t)(r * 1000 + (int)i + k);
    CU(cu->memcpy_async(din, h, bytes, s));
    CU(cu->memset_async(dout, 0, bytes, s));
    CU(cu->stream_synchronize(s));
    int ok = 1;
    for (int k = 0; k < QUEUE_OPS && ok; k++) {
        int32_t *in = din + (size_t)k * QUEUE_COUNT, *out = dout + (size_t)k * QUEUE_COUNT;
        if (k % 2 == 0) {
            ok = check(ncclAllReduce(in, out, QUEUE_COUNT, ncclInt32, ncclSum, comm,
                                     (cudaStream_t)s), "ncclAllReduce");
        } else {
            ok = check(ncclGroupStart(), "ncclGroupStart") &&
                 check(ncclSend(in, QUEUE_COUNT, ncclInt32, (r + 1) % n, comm, (cudaStream_t)s),
                       "ncclSend") &&
                 check(ncclRecv(out, QUEUE_COUNT, ncclInt32, (r + n - 1) % n, comm,
                                (cudaStream_t)s), "ncclRecv");
            ok &= check(ncclGroupEnd(), "ncclGroupEnd");
        }
        if (r > 0)
            usleep(2000 * (unsigned)r);
    }
    if (ok)
        ok = check_cuda(cu->stream_synchronize(s), "cudaStreamSynchronize");
    ncclResult_t async = ncclSuccess;
    ok &= check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError") &&
          check(async, "asynchronous error");
    if (ok) {
        CU(cu->memcpy_async(h, dout, bytes, s));
        CU(cu->stream_synchronize(s));
    }
    for (int k = 0; k < QUEUE_OPS && ok; k++)
        for (size_t i = 0; i < QUEUE_COUNT && ok; i++) {
            int from = (r + n - 1) % n;
            int32_t want = k % 2 == 0 ? 1000 * n * (n - 1) / 2 + n * ((int)i + k)
                                      : from * 1000 + (int)i + k;
            if (h[(size_t)k * QUEUE_COUNT + i] != want) {
                fprintf(stderr, "FAIL queues rank %d op %d index %zu: got %d want %d\n", r, k,
                        i, h[(size_t)k * QUEUE_COUNT + i], want);
                ok = 0;
            }
        }
    CU(cu->free(din));
    CU(cu->free(dout));
    free(h);
    CU(cu->stream_destroy(s));
    ok &= check(ok ? ncclCommDestroy(comm) : ncclCommAbort(comm), "ncclCommDestroy");
    th->ok = ok;
    return NULL;
}

static int case_queues(void)
{
    return run_rank_threads(queues_thread);
}

/*
 * The order's own waits (exec/cuda_order.h): rank 0 of 2 on one device calls ncclAllReduce alone,
 * from a thread of its own; the call waits for rank 1 to launch its part. WEFT_TEST_LONELY says
 * how it ends: abort (ncclCommAbort of rank 0 from this thread: the call returns within 1 s),
 * left (rank 1's communicator aborted: ncclRemoteError within 1 s, naming rank 1), timeout
 * (WEFT_TIMEOUT=2: ncclRemoteError after about 2 s, naming rank 1 and what it did not launch).
 * In every case the kernel that was launched leaves too.
 */
struct lonely_call {
    float *d;
    ncclResult_t res;
    int done; /* atomic */
    double t_done;
    char msg[1024];
};

static void *lonely_thread(void *arg)
{
    struct lonely_call *lc = arg;
    CU(cu->set_device(g_dev[0]));
    lc->res = ncclAllReduce(lc->d, lc->d, 1024, ncclFloat32, ncclSum, g_comms[0],
                            g_bufs[0].stream);
    lc->t_done = now_s();
    snprintf(lc->msg, sizeof(lc->msg), "%s", ncclGetLastError(NULL));
    __atomic_store_n(&lc->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int case_lonely(void)
{
    const char *how = getenv("WEFT_TEST_LONELY");
    if (how == NULL || (strcmp(how, "abort") != 0 && strcmp(how, "left") != 0 &&
                        strcmp(how, "timeout") != 0)) {
        fprintf(stderr, "set WEFT_TEST_LONELY to abort, left or timeout\n");
        return 1;
    }
    if (g_n != 2 || g_d != 1) {
        fprintf(stderr, "lonely needs -n 2 -d 1\n");
        return 1;
    }
    if (!setup_all())
        return 1;
    struct lonely_call lc;
    memset(&lc, 0, sizeof(lc));
    CU(cu->set_device(g_dev[0]));
    CU(cu->malloc((void **)&lc.d, 1024 * sizeof(float)));
    double t0 = now_s();
    pthread_t th;
    pthread_create(&th, NULL, lonely_thread, &lc);
    usleep(500000);
    int ok = 1;
    if (__atomic_load_n(&lc.done, __ATOMIC_ACQUIRE)) {
        fprintf(stderr, "FAIL lonely: rank 0's call returned (%d) without rank 1's: %s\n",
                lc.res, lc.msg);
        ok = 0;
    }
    double t1 = now_s();
    ncclResult_t want = ncclRemoteError;
    if (strcmp(how, "abort") == 0) {
        ok &= check(ncclCommAbort(g_comms[0]), "ncclCommAbort");
        g_comms[0] = NULL;
        want = ncclInvalidUsage;
    } else if (strcmp(how, "left") == 0) {
        ok &= check(ncclCommAbort(g_comms[1]), "ncclCommAbort (rank 1)");
        g_comms[1] = NULL;
    }
    pthread_join(th, NULL);
    double waited = lc.t_done - t1, total = lc.t_done - t0;
    if (lc.res != want) {
        fprintf(stderr, "FAIL lonely %s: the call returned %d, want %d: %s\n", how, lc.res, want,
                lc.msg);
        ok = 0;
    }
    if (strcmp(how, "timeout") == 0 ? total < 1.5 || total > 10 : waited > 1.0) {
        fprintf(stderr, "FAIL lonely %s: the call returned after %.3f s (%.3f s after the "
                "close)\n", how, total, waited);
        ok = 0;
    }
    if (strcmp(how, "abort") != 0 &&
        (strstr(lc.msg, "rank 1") == NULL ||
         strstr(lc.msg, strcmp(how, "left") == 0 ? "left" : "did not launch its collective #1") ==
             NULL)) {
        fprintf(stderr, "FAIL lonely %s: the message does not say what rank 1 failed to do: %s\n",
                how, lc.msg);
        ok = 0;
    }
    printf("lonely %s: the call returned %d after %.3f s: %s\n", how, lc.res, total, lc.msg);
    /* The kernel launched before the wait leaves too (abort, or its own deadline). */
    for (int r = 0; r < 2; r++)
        if (g_comms[r] != NULL) {
            ncclCommAbort(g_comms[r]);
            g_comms[r] = NULL;
        }
    CU(cu->set_device(g_dev[0]));
    double ts = now_s();
    CU(cu->stream_synchronize(g_bufs[0].stream));
    if (now_s() - ts > 1.0) {
        fprintf(stderr, "FAIL lonely %s: the kernel left %.3f s after the abort\n", how,
                now_s() - ts);
        ok = 0;
    }
    CU(cu->free(lc.d));
    return finish(ok);
}

/* ---- graphs ------------------------------------------------------------------------------ */

/* Every rank's stream starts (ends into g[r]) a capture; every rank's graph g[r] is launched. */
static void graphs_begin(void)
{
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(weftCudaStreamBeginCapture(g_bufs[r].stream));
    }
}

static void graphs_end(weftCudaGraph_t *g)
{
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(weftCudaStreamEndCapture(g_bufs[r].stream, &g[r]));
    }
}

static void graphs_launch(weftCudaGraph_t *g)
{
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(weftCudaGraphLaunch(g[r], g_bufs[r].stream));
    }
}

/*
 * 3 in-place all-reduces captured into a graph per rank, replayed reps times, checked after each
 * replay. reg: the buffers registered, and every replay must run all 3 direct (the descriptors
 * are exchanged when the kernels run). 1 when all is right.
 */
static int graph_run(int reg, int reps)
{
    size_t count = 3001;
    float *d[MAXR][3], *h = malloc(count * sizeof(float));
    void *hd[MAXR][3] = {{NULL}};
    weftCudaGraph_t g[MAXR];
    int all_ok = 1;
    /* Through the public forwards of weft.h, as a program would. Each rank's stream captures its
     * own graph; the captures run from one thread inside one
     * group per operation (the kernels of all ranks must run at once at replay). */
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        for (int k = 0; k < 3; k++) {
            CU(cu->malloc((void **)&d[r][k], count * sizeof(float)));
            if (reg)
                all_ok &= check(ncclCommRegister(g_comms[r], d[r][k], count * sizeof(float),
                                                 &hd[r][k]), "ncclCommRegister");
        }
    }
    graphs_begin();
    for (int k = 0; k < 3; k++) {
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < g_n; r++)
            check(ncclAllReduce(d[r][k], d[r][k], count, ncclFloat32, ncclSum, g_comms[r],
                                g_bufs[r].stream), "ncclAllReduce");
        check(ncclGroupEnd(), "ncclGroupEnd");
    }
    graphs_end(g);
    for (int rep = 0; rep < reps; rep++) {
        uint64_t before[MAXR];
        for (int r = 0; r < g_n; r++) {
            before[r] = weft_zcopy_count(g_comms[r]);
            CU(cu->set_device(g_dev[r]));
            for (int k = 0; k < 3; k++) {
                for (size_t i = 0; i < count; i++)
                    h[i] = (float)((r + 1) * (k + 1) + (int)(i % 50) + rep);
                CU(cu->memcpy_async(d[r][k], h, count * sizeof(float), g_bufs[r].stream));
                CU(cu->stream_synchronize(g_bufs[r].stream)); /* h is rewritten next */
            }
        }
        graphs_launch(g);
        for (int r = 0; r < g_n; r++) {
            CU(cu->set_device(g_dev[r]));
            CU(cu->stream_synchronize(g_bufs[r].stream));
            uint64_t ran = weft_zcopy_count(g_comms[r]) - before[r];
            int want_ran = reg && zc_peers_reach() ? 3 : 0;
            if (ran != (uint64_t)want_ran) {
                fprintf(stderr, "FAIL graph replay %d rank %d: %llu direct runs, want %d\n", rep,
                        r, (unsigned long long)ran, want_ran);
                all_ok = 0;
            }
            for (int k = 0; k < 3; k++) {
                CU(cu->memcpy_async(h, d[r][k], count * sizeof(float), g_bufs[r].stream));
                CU(cu->stream_synchronize(g_bufs[r].stream));
                int ok = 1;
                for (size_t i = 0; i < count && ok; i++) {
                    float want = (float)((k + 1) * g_n * (g_n + 1) / 2 +
                                         g_n * ((int)(i % 50) + rep));
                    if (h[i] != want) {
                        fprintf(stderr, "FAIL graph replay %d rank %d op %d index %zu: got %g "
                                "want %g\n", rep, r, k, i, h[i], want);
                        ok = 0;
                    }
                }
                all_ok &= ok;
                if (!reg)
                    tally(ok);
            }
        }
    }
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(weftCudaGraphDestroy(g[r]));
        for (int k = 0; k < 3; k++) {
            if (hd[r][k] != NULL)
                check(ncclCommDeregister(g_comms[r], hd[r][k]), "ncclCommDeregister");
            CU(cu->free(d[r][k]));
        }
    }
    free(h);
    return all_ok;
}

static int case_graph(void)
{
    if (!setup_all())
        return 1;
    graph_run(0, 5);
    teardown();
    return 0;
}

/*
 * A capture beside another thread's calls (CUDA's global capture mode, the default: an unsafe
 * call from any thread invalidates every capture in progress). Case graph-watchdog: a thread polls
 * ncclCommGetAsyncError of every rank in a loop, as PyTorch's watchdog does, before, during and
 * after the capture (held open 0.5 s, longer than the executor's 100 ms liveness period); the
 * rank's own launch under capture comes when a liveness check is due. Case graph-memfree: another
 * thread ncclMemFree's an unrelated ncclMemAlloc buffer of every rank while the streams capture
 * (NCCL's ncclMemFree does not synchronise the device). Either way the captures end valid, and
 * the graphs, replayed twice, give the right sums.
 */
struct side_args {
    int memfree;        /* 0: poll ncclCommGetAsyncError; 1: free mem[] once go is set */
    int stop, go, done; /* __atomic */
    int ok, polls;
    void *mem[MAXR];
};

static void *side_thread(void *arg)
{
    struct side_args *a = arg;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        if (a->memfree) {
            if (__atomic_load_n(&a->go, __ATOMIC_ACQUIRE) && !a->done) {
                for (int r = 0; r < g_n; r++)
                    a->ok &= check(ncclMemFree(a->mem[r]), "ncclMemFree during a capture");
                __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
            }
        } else {
            for (int r = 0; r < g_n; r++) {
                ncclResult_t st = ncclInternalError;
                a->ok &= check(ncclCommGetAsyncError(g_comms[r], &st), "ncclCommGetAsyncError") &&
                         check(st, "the async error during a capture");
            }
            a->polls++;
        }
        usleep(2000);
    }
    return NULL;
}

static int case_graph_side(int memfree)
{
    if (!setup_all())
        return 1;
    run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, 1031, 0, 0); /* kernels ran: the path is warm */
    size_t count = 3001;
    float *d[MAXR], *h = malloc(count * sizeof(float));
    struct side_args a = {.memfree = memfree, .ok = 1};
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&d[r], count * sizeof(float)));
        if (memfree)
            a.ok &= check(ncclMemAlloc(&a.mem[r], 1 << 20), "ncclMemAlloc");
    }
    pthread_t t;
    pthread_create(&t, NULL, side_thread, &a);
    usleep(150000); /* the next liveness check is due */
    graphs_begin();
    __atomic_store_n(&a.go, 1, __ATOMIC_RELEASE);
    for (double t0 = now_s(); memfree && !__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) &&
                              now_s() - t0 < 10;)
        usleep(1000);
    usleep(250000);
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < g_n; r++)
        a.ok &= check(ncclAllReduce(d[r], d[r], count, ncclFloat32, ncclSum, g_comms[r],
                                    g_bufs[r].stream), "ncclAllReduce under capture");
    a.ok &= check(ncclGroupEnd(), "ncclGroupEnd");
    usleep(250000);
    weftCudaGraph_t g[MAXR];
    int captured = 1;
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        int e = weftCudaStreamEndCapture(g_bufs[r].stream, &g[r]);
        if (e != 0) {
            fprintf(stderr, "FAIL %s: rank %d's capture ended with %s (%d)\n",
                    memfree ? "graph-memfree" : "graph-watchdog", r, cu->error_string(e), e);
            g[r] = NULL;
            captured = 0;
        }
    }
    for (int rep = 0; rep < 2 && captured; rep++) {
        for (int r = 0; r < g_n; r++) {
            CU(cu->set_device(g_dev[r]));
            for (size_t i = 0; i < count; i++)
                h[i] = (float)((r + 1) * (int)(i % 50 + 1) + rep);
            CU(cu->memcpy_async(d[r], h, count * sizeof(float), g_bufs[r].stream));
            CU(cu->stream_synchronize(g_bufs[r].stream));
        }
        graphs_launch(g);
        for (int r = 0; r < g_n; r++) {
            CU(cu->set_device(g_dev[r]));
            CU(cu->stream_synchronize(g_bufs[r].stream));
            CU(cu->memcpy_async(h, d[r], count * sizeof(float), g_bufs[r].stream));
            CU(cu->stream_synchronize(g_bufs[r].stream));
            int ok = 1;
            for (size_t i = 0; i < count && ok; i++) {
                float want = (float)(g_n * (g_n + 1) / 2 * (int)(i % 50 + 1) + g_n * rep);
                if (h[i] != want) {
                    fprintf(stderr, "FAIL graph replay %d rank %d index %zu: got %g want %g\n",
                            rep, r, i, h[i], want);
                    ok = 0;
                }
            }
            tally(ok);
        }
    }
    __atomic_store_n(&a.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    if (!memfree && a.polls < 100) {
        fprintf(stderr, "FAIL graph-watchdog: only %d polls\n", a.polls);
        a.ok = 0;
    }
    tally(a.ok && captured && (!memfree || a.done));
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        if (g[r] != NULL)
            CU(weftCudaGraphDestroy(g[r]));
        CU(cu->free(d[r]));
    }
    free(h);
    teardown();
    return 0;
}

/*
 * An in-place ncclAlltoAll captured in a graph as the comms' first device operation, replayed
 * with new inputs: the kernel runs the direct order in place (no staging copy, which could not
 * be allocated under capture: ncclInvalidUsage before). Rank r's block j holds
 * (r * 1000 + j * 10 + rep) + i % 7; after the exchange block j holds rank j's block r.
 */
static float a2a_val(int from, int block, int rep, size_t i)
{
    return (float)(from * 1000 + block * 10 + rep) + (float)(i % 7);
}

static int case_graph_a2a(void)
{
    if (!setup_all())
        return 1;
    size_t count = 20011; /* per block: several Simple slots per piece, not a multiple of 4 */
    size_t total = count * (size_t)g_n;
    float *d[MAXR], *h = malloc(total * sizeof(float));
    weftCudaGraph_t g[MAXR];
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&d[r], total * sizeof(float)));
    }
    graphs_begin();
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < g_n; r++)
        check(ncclAlltoAll(d[r], d[r], count, ncclFloat32, g_comms[r], g_bufs[r].stream),
              "ncclAlltoAll in place under capture");
    check(ncclGroupEnd(), "ncclGroupEnd");
    graphs_end(g);
    for (int rep = 0; rep < 3; rep++) {
        for (int r = 0; r < g_n; r++) {
            CU(cu->set_device(g_dev[r]));
            for (size_t i = 0; i < total; i++)
                h[i] = a2a_val(r, (int)(i / count), rep, i % count);
            CU(cu->memcpy_async(d[r], h, total * sizeof(float), g_bufs[r].stream));
            CU(cu->stream_synchronize(g_bufs[r].stream));
        }
        graphs_launch(g);
        for (int r = 0; r < g_n; r++) {
            CU(cu->set_device(g_dev[r]));
            CU(cu->stream_synchronize(g_bufs[r].stream));
            CU(cu->memcpy_async(h, d[r], total * sizeof(float), g_bufs[r].stream));
            CU(cu->stream_synchronize(g_bufs[r].stream));
            int ok = 1;
            for (size_t i = 0; i < total && ok; i++) {
                float want = a2a_val((int)(i / count), r, rep, i % count);
                if (h[i] != want) {
                    fprintf(stderr, "FAIL in-place all-to-all replay %d rank %d index %zu: got %g "
                            "want %g\n", rep, r, i, h[i], want);
                    ok = 0;
                }
            }
            tally(ok);
        }
    }
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(weftCudaGraphDestroy(g[r]));
        CU(cu->free(d[r]));
    }
    free(h);
    teardown();
    return 0;
}

/* ---- faults ------------------------------------------------------------------------------ */

/* Rank 0 launches an all-reduce its peer never joins. */
/*
 * One group of 2 x 50 point-to-point operations per rank (more than one launch holds): rank r
 * sends 50 messages to r + 1 and receives 50 from r - 1, even ranks all sends first, odd ranks
 * send and receive in turn, so cutting each rank's list at the same index would leave a launch
 * waiting for a peer's later launch (a deadlock once the FIFO credit is gone). Sizes vary, every
 * 10th large (Simple by default), an all-reduce in the middle; every element checked.
 */
#define BIG_K 50
static size_t big_count(int k)
{
    return k % 10 == 3 ? 70000 + (size_t)k : 1 + (size_t)(k * 37 % 3000);
}

static float big_value(int from, int k, size_t i)
{
    return (float)((from * 131 + k * 7 + (int)(i % 1000)) % 4096);
}

static int case_biggroup(void)
{
    if (!setup_all())
        return 1;
    size_t total = 0, off[BIG_K];
    for (int k = 0; k < BIG_K; k++) {
        off[k] = total;
        total += big_count(k);
    }
    float *ds[MAXR], *dr[MAXR], *da[MAXR], *h = malloc(total * sizeof(float));
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&ds[r], total * sizeof(float)));
        CU(cu->malloc((void **)&dr[r], total * sizeof(float)));
        CU(cu->malloc((void **)&da[r], 64 * sizeof(float)));
        for (int k = 0; k < BIG_K; k++)
            for (size_t i = 0; i < big_count(k); i++)
                h[off[k] + i] = big_value(r, k, i);
        CU(cu->memcpy_async(ds[r], h, total * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
        for (int i = 0; i < 64; i++)
            h[i] = (float)(r + i);
        CU(cu->memcpy_async(da[r], h, 64 * sizeof(float), NULL));
        CU(cu->memset_async(dr[r], 0, total * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
    }
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < g_n; r++) {
        int next = (r + 1) % g_n, prev = (r + g_n - 1) % g_n;
        /* even ranks: 50 sends, the all-reduce, 50 receives; odd ranks: send k and receive k in
         * turn, the all-reduce in the middle */
        for (int j = 0; j < 2 * BIG_K; j++) {
            int sends = r % 2 == 0 ? j < BIG_K : j % 2 == 0;
            int k = r % 2 == 0 ? j % BIG_K : j / 2;
            if (j == BIG_K)
                check(ncclAllReduce(da[r], da[r], 64, ncclFloat32, ncclSum, g_comms[r],
                                    g_bufs[r].stream), "ncclAllReduce");
            if (sends)
                check(ncclSend(ds[r] + off[k], big_count(k), ncclFloat32, next, g_comms[r],
                               g_bufs[r].stream), "ncclSend");
            else
                check(ncclRecv(dr[r] + off[k], big_count(k), ncclFloat32, prev, g_comms[r],
                               g_bufs[r].stream), "ncclRecv");
        }
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    int ok = 1;
    for (int r = 0; r < g_n; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_synchronize(g_bufs[r].stream));
        ncclResult_t a = ncclSuccess;
        ok &= check(ncclCommGetAsyncError(g_comms[r], &a), "ncclCommGetAsyncError") &&
              check(a, "the kernels");
        int prev = (r + g_n - 1) % g_n;
        CU(cu->memcpy_async(h, dr[r], total * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
        int bad = 0;
        for (int k = 0; k < BIG_K && !bad; k++)
            for (size_t i = 0; i < big_count(k); i++)
                if (h[off[k] + i] != big_value(prev, k, i)) {
                    fprintf(stderr, "FAIL biggroup: rank %d message %d [%zu] = %g, want %g\n", r,
                            k, i, h[off[k] + i], big_value(prev, k, i));
                    bad = 1;
                    break;
                }
        CU(cu->memcpy_async(h, da[r], 64 * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
        for (int i = 0; i < 64 && !bad; i++)
            if (h[i] != (float)(g_n * (g_n - 1) / 2 + g_n * i)) {
                fprintf(stderr, "FAIL biggroup: rank %d all-reduce [%d] = %g\n", r, i, h[i]);
                bad = 1;
            }
        ok &= !bad;
        CU(cu->free(ds[r]));
        CU(cu->free(dr[r]));
        CU(cu->free(da[r]));
    }
    printf("biggroup: %d ranks, %d operations each in one group: %s\n", g_n, 2 * BIG_K + 1,
           ok ? "ok" : "FAILED");
    free(h);
    return finish(ok);
}

static int launch_lonely(float **d_p)
{
    if (!setup_all())
        return 0;
    CU(cu->set_device(g_dev[0]));
    CU(cu->malloc((void **)d_p, 1024 * sizeof(float)));
    if (!check(ncclAllReduce(*d_p, *d_p, 1024, ncclFloat32, ncclSum, g_comms[0],
                             g_bufs[0].stream), "ncclAllReduce"))
        return 0;
    return 1;
}

/*
 * The lonely rank's message says in plain words what it waited for: peer 1's data, or (a direct
 * kernel candidate, WEFT_ZCOPY_MIN_BYTES set) peer 1 joining the call; where peer 1 runs (a
 * thread of this process), not the FIFO's step counters or a bare hostname.
 */
static int wait_words_plain(const char *msg, const char *name)
{
    const char *want = getenv("WEFT_ZCOPY_MIN_BYTES") != NULL
                           ? "for peer 1 (in this process) to call ncclAllReduce too"
                           : "for data from peer 1 (in this process)";
    int ok = strstr(msg, want) != NULL && strstr(msg, "counter") == NULL &&
             strstr(msg, "needed") == NULL && strstr(msg, "step") == NULL &&
             strstr(msg, "(operation ") != NULL;
    if (!ok)
        fprintf(stderr, "FAIL %s: last error '%s' does not say '%s' plainly\n", name, msg, want);
    return ok;
}

static int case_abort(void)
{
    float *d;
    if (!launch_lonely(&d))
        return 1;
    usleep(300000);
    int ok = cu->stream_query(g_bufs[0].stream) == 600; /* the kernel waits for peer 1 */
    if (!ok)
        fprintf(stderr, "FAIL abort: the kernel finished without its peer\n");
    double t0 = now_s();
    ncclResult_t res = ncclCommAbort(g_comms[0]);
    g_comms[0] = NULL;
    CU(cu->set_device(g_dev[0]));
    CU(cu->stream_synchronize(g_bufs[0].stream));
    double dt = now_s() - t0;
    if (res != ncclSuccess || dt > 1.0) {
        fprintf(stderr, "FAIL abort: ncclCommAbort %d, kernel left after %.3f s\n", res, dt);
        ok = 0;
    }
    /* The abort logged what the kernel waited for. */
    const char *msg = ncclGetLastError(NULL);
    if (strstr(msg, "peer 1") == NULL) {
        fprintf(stderr, "FAIL abort: last error '%s' does not name peer 1\n", msg);
        ok = 0;
    }
    if (!wait_words_plain(msg, "abort"))
        ok = 0;
    printf("abort: kernel left %.3f s after ncclCommAbort: %s\n", dt, msg);
    CU(cu->free(d));
    return finish(ok);
}

static int case_timeout(void)
{
    float *d;
    if (!launch_lonely(&d))
        return 1;
    double t0 = now_s();
    CU(cu->set_device(g_dev[0]));
    CU(cu->stream_synchronize(g_bufs[0].stream)); /* the kernel gives up after WEFT_TIMEOUT */
    double dt = now_s() - t0;
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(g_comms[0], &async), "ncclCommGetAsyncError");
    const char *msg = ncclGetLastError(NULL);
    int ok = async == ncclRemoteError && strstr(msg, "peer 1") != NULL &&
             strstr(msg, "ncclAllReduce") != NULL && dt > 1.5 && dt < 10;
    ok &= wait_words_plain(msg, "timeout");
    printf("timeout: kernel left after %.3f s, async error %d: %s\n", dt, async, msg);
    /* The communicator stays failed: a later operation reports it at once. */
    ncclResult_t again = ncclAllReduce(d, d, 1024, ncclFloat32, ncclSum, g_comms[0],
                                       g_bufs[0].stream);
    ok &= again != ncclSuccess;
    if (!ok)
        fprintf(stderr, "FAIL timeout (again %d)\n", again);
    CU(cu->free(d));
    for (int r = 0; r < g_n; r++) {
        ncclCommAbort(g_comms[r]);
        g_comms[r] = NULL;
    }
    return finish(ok);
}

/* The emulated GPU's count of module loads that found their device busy (src/cuda/emu.c). */
uint64_t weft_emu_module_waits(void);

/* A CUDA call whose failure the case counts (and goes on). */
static int check_cuda(int err, const char *what)
{
    if (err != 0)
        fprintf(stderr, "FAIL %s: %s (%d)\n", what, cu->error_string(err), err);
    return err == 0;
}

/*
 * Issue 29, finding 2 (lazy module loading): communicator A's rank 0 launches an all-reduce whose
 * peer has not launched yet, so its kernel spins on device 0; then communicator B runs its first
 * direct all-reduce (registered buffers, WEFT_ZCOPY_MIN_BYTES low): a kernel never launched
 * before in the process. Its module must have been loaded at setup: loaded at the launch it
 * waits for device 0 to be idle, that is for A's kernel to give up (WEFT_TIMEOUT, low), and A's
 * all-reduce fails. Then A's rank 1 launches. Every result, both communicators' async errors,
 * the direct run (weft_zcopy_count) and the absence of any load wait are checked.
 */
static int case_lazyload(void)
{
    if (g_n != 2) {
        fprintf(stderr, "lazyload needs -n 2\n");
        return 1;
    }
    setup_streams();
    ncclComm_t b[2];
    cudaStream_t sb[2];
    if (!init_all(g_comms) || !init_all(b))
        return 1;
    uint64_t waits0 = weft_emu_module_waits();
    /* A's all-reduce is below WEFT_ZCOPY_MIN_BYTES (the test sets 1024): the collective kernel
     * alone; B's is above it. */
    size_t count = 4096, count_a = 128;
    float *da[2], *db[2], *h = malloc(count * sizeof(float));
    void *reg[2];
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_create((weft_cuda_stream_t *)&sb[r]));
        CU(cu->malloc((void **)&da[r], count * sizeof(float)));
        CU(cu->malloc((void **)&db[r], count * sizeof(float)));
        for (size_t i = 0; i < count; i++)
            h[i] = (float)(r + 1) * (float)(i % 100);
        CU(cu->memcpy_async(da[r], h, count * sizeof(float), NULL));
        CU(cu->memcpy_async(db[r], h, count * sizeof(float), NULL));
        CU(cu->stream_synchronize(NULL));
        check(ncclCommRegister(b[r], db[r], count * sizeof(float), &reg[r]), "ncclCommRegister");
    }
    uint64_t direct0 = weft_zcopy_count(b[0]);
    double t0 = now_s();
    check(ncclAllReduce(da[0], da[0], count_a, ncclFloat32, ncclSum, g_comms[0], g_bufs[0].stream),
          "ncclAllReduce (A, rank 0)");
    usleep(100000);
    int ok = cu->stream_query(g_bufs[0].stream) == 600; /* A's kernel waits for rank 1 */
    if (!ok)
        fprintf(stderr, "FAIL lazyload: A's kernel finished without its peer\n");
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < 2; r++)
        check(ncclAllReduce(db[r], db[r], count, ncclFloat32, ncclSum, b[r], sb[r]),
              "ncclAllReduce (B)");
    check(ncclGroupEnd(), "ncclGroupEnd");
    double tb = now_s() - t0;
    check(ncclAllReduce(da[1], da[1], count_a, ncclFloat32, ncclSum, g_comms[1], g_bufs[1].stream),
          "ncclAllReduce (A, rank 1)");
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        ok &= check_cuda(cu->stream_synchronize(g_bufs[r].stream), "sync A");
        ok &= check_cuda(cu->stream_synchronize(sb[r]), "sync B");
        ncclResult_t ea = ncclSuccess, eb = ncclSuccess;
        check(ncclCommGetAsyncError(g_comms[r], &ea), "ncclCommGetAsyncError");
        check(ncclCommGetAsyncError(b[r], &eb), "ncclCommGetAsyncError");
        if (ea != ncclSuccess || eb != ncclSuccess) {
            fprintf(stderr, "FAIL lazyload: rank %d async errors A %d B %d: %s\n", r, ea, eb,
                    ncclGetLastError(NULL));
            ok = 0;
        }
        float *src[2] = {da[r], db[r]};
        size_t n[2] = {count_a, count};
        for (int c = 0; c < 2; c++) {
            CU(cu->memcpy_async(h, src[c], n[c] * sizeof(float), NULL));
            CU(cu->stream_synchronize(NULL));
            for (size_t i = 0; i < n[c]; i++) {
                float want = 3.0f * (float)(i % 100);
                if (h[i] != want) {
                    fail("data", C_ALLREDUCE, ncclFloat32, OP_SUM, n[c], 1, r, i, h[i], want);
                    ok = 0;
                    break;
                }
            }
        }
    }
    uint64_t direct = weft_zcopy_count(b[0]) - direct0, waits = weft_emu_module_waits() - waits0;
    if (direct != 1 || waits != 0) {
        fprintf(stderr, "FAIL lazyload: B went direct %llu times (want 1), %llu module loads "
                "waited for a busy device (want 0)\n", (unsigned long long)direct,
                (unsigned long long)waits);
        ok = 0;
    }
    printf("lazyload: B's first direct all-reduce issued in %.3f s while A's kernel spun\n", tb);
    for (int r = 0; r < 2; r++) {
        check(ncclCommDeregister(b[r], reg[r]), "ncclCommDeregister");
        check(ncclCommDestroy(b[r]), "ncclCommDestroy");
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_destroy(sb[r]));
        CU(cu->free(da[r]));
        CU(cu->free(db[r]));
    }
    free(h);
    return finish(ok);
}

/* Rank 0 sends 1000 floats, rank 1 expects 999: rank 1's kernel finds the slice size wrong. */
static int case_mismatch(void)
{
    if (!setup_all())
        return 1;
    float *d[2];
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&d[r], 1000 * sizeof(float)));
    }
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclSend(d[0], 1000, ncclFloat32, 1, g_comms[0], g_bufs[0].stream), "ncclSend");
    check(ncclRecv(d[1], 999, ncclFloat32, 0, g_comms[1], g_bufs[1].stream), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_synchronize(g_bufs[r].stream));
    }
    ncclResult_t a0 = ncclSuccess, a1 = ncclSuccess;
    check(ncclCommGetAsyncError(g_comms[0], &a0), "ncclCommGetAsyncError");
    check(ncclCommGetAsyncError(g_comms[1], &a1), "ncclCommGetAsyncError");
    const char *msg = ncclGetLastError(NULL);
    printf("mismatch: rank 0 %d, rank 1 %d: %s\n", a0, a1, msg);
    int ok = a0 == ncclSuccess && a1 == ncclInvalidUsage && strstr(msg, "peer 0") != NULL &&
             strstr(msg, "ncclRecv") != NULL;
    if (!ok)
        fprintf(stderr, "FAIL mismatch\n");
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->free(d[r]));
    }
    return finish(ok);
}

/* ---- signatures (exec/sig.h) ----------------------------------------------------------- */

struct async_arg {
    ncclComm_t comm;
    ncclResult_t res;
};

static void *async_check(void *p)
{
    struct async_arg *a = p;
    a->res = ncclInProgress;
    ncclCommGetAsyncError(a->comm, &a->res);
    return NULL;
}

static int case_sig(void)
{
    const char *what = getenv("WEFT_TEST_SIG");
    const char *log = getenv("NCCL_DEBUG_FILE");
    if (what == NULL || log == NULL || g_n != 2) {
        fprintf(stderr, "sig needs WEFT_TEST_SIG, NCCL_DEBUG_FILE and -n 2\n");
        return 1;
    }
    if (!setup_all())
        return 1;
    enum { N = 4096 };
    float *d[2], *o[2], h[N];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < N; i++)
            h[i] = (float)(1 + r); /* rank r contributes 1 + r */
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&d[r], N * sizeof(float)));
        CU(cu->malloc((void **)&o[r], N * sizeof(float)));
        CU(cu->memcpy_async(d[r], h, sizeof(h), g_bufs[r].stream));
        CU(cu->memset_async(o[r], 0, sizeof(h), g_bufs[r].stream));
        CU(cu->stream_synchronize(g_bufs[r].stream));
    }
    /* WEFT_TEST_SIG_REG=1: the buffers registered, so the calls that differ are zero-copy
     * candidates; the direct kernel sees the difference and leaves it to the normal path. */
    void *reg[2][2] = {{NULL, NULL}, {NULL, NULL}};
    if (getenv("WEFT_TEST_SIG_REG") != NULL)
        for (int r = 0; r < 2; r++) {
            check(ncclCommRegister(g_comms[r], d[r], N * sizeof(float), &reg[r][0]),
                  "ncclCommRegister");
            check(ncclCommRegister(g_comms[r], o[r], N * sizeof(float), &reg[r][1]),
                  "ncclCommRegister");
        }
    const char *a = NULL, *b = NULL; /* rank 0's call, rank 1's */
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < 2; r++) {
        cudaStream_t st = g_bufs[r].stream;
        if (strcmp(what, "count") == 0) {
            ncclAllReduce(d[r], o[r], r == 0 ? 1000 : N, ncclFloat32, ncclSum, g_comms[r], st);
            a = "ncclAllReduce(count 1000, float, sum) #1";
            b = "ncclAllReduce(count 4096, float, sum) #1";
        } else if (strcmp(what, "dtype") == 0) {
            ncclAllReduce(d[r], o[r], N, r == 0 ? ncclInt32 : ncclFloat32, ncclSum, g_comms[r], st);
            a = "ncclAllReduce(count 4096, int32, sum) #1";
            b = "ncclAllReduce(count 4096, float, sum) #1";
        } else if (strcmp(what, "op") == 0) {
            ncclAllReduce(d[r], o[r], N, ncclFloat32, r == 0 ? ncclMax : ncclSum, g_comms[r], st);
            a = "ncclAllReduce(count 4096, float, max) #1";
            b = "ncclAllReduce(count 4096, float, sum) #1";
        } else if (strcmp(what, "root") == 0) {
            ncclBroadcast(d[r], o[r], N, ncclFloat32, r == 0 ? 1 : 0, g_comms[r], st);
            a = "ncclBroadcast(count 4096, float, root 1) #1";
            b = "ncclBroadcast(count 4096, float, root 0) #1";
        } else {
            if (r == 0)
                ncclAllGather(d[r], o[r], N / 2, ncclFloat32, g_comms[r], st);
            else
                ncclAllReduce(d[r], o[r], N / 2, ncclFloat32, ncclSum, g_comms[r], st);
            a = "ncclAllGather(count 2048, float) #1";
            b = "ncclAllReduce(count 2048, float, sum) #1";
        }
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_synchronize(g_bufs[r].stream));
    }
    /* One thread per rank, as an application with a thread per GPU checks them. */
    struct async_arg args[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        args[r].comm = g_comms[r];
        pthread_create(&th[r], NULL, async_check, &args[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    FILE *f = fopen(log, "r");
    static char text[1 << 16];
    size_t n = f != NULL ? fread(text, 1, sizeof(text) - 1, f) : 0;
    text[n] = 0;
    if (f != NULL)
        fclose(f);
    int ok = 1;
    for (int r = 0; r < 2; r++) {
        char want[512];
        snprintf(want, sizeof(want),
                 "rank %d: operations differ between ranks: rank 0 called %s, rank 1 called %s", r,
                 a, b);
        if (args[r].res != ncclInvalidUsage || strstr(text, want) == NULL) {
            fprintf(stderr, "FAIL sig %s: rank %d async error %d; no line \"%s\" in:\n%s\n", what,
                    r, args[r].res, want, text);
            ok = 0;
        }
        /* nothing of the other rank's data: rank 0 holds 0 or its 1s, rank 1 0 or its 2s */
        float out[N];
        CU(cu->set_device(g_dev[r]));
        CU(cu->memcpy_async(out, o[r], sizeof(out), g_bufs[r].stream));
        CU(cu->stream_synchronize(g_bufs[r].stream));
        int wrong = 0;
        for (int i = 0; i < N; i++)
            wrong += out[i] != 0.0f && out[i] != (float)(1 + r);
        if (wrong != 0) {
            fprintf(stderr, "FAIL sig %s: rank %d: %d elements hold the other rank's data\n", what,
                    r, wrong);
            ok = 0;
        }
    }
    printf("sig %s: rank 0 %d, rank 1 %d\n", what, args[0].res, args[1].res);
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        for (int k = 0; k < 2; k++)
            if (reg[r][k] != NULL)
                ncclCommDeregister(g_comms[r], reg[r][k]);
        CU(cu->free(d[r]));
        CU(cu->free(o[r]));
        ncclCommAbort(g_comms[r]);
        g_comms[r] = NULL;
    }
    return finish(ok);
}

/* Rank 1 never joins all-reduce #2: rank 0's error at the deadline names it. */
static int case_skip(void)
{
    if (!setup_all())
        return 1;
    float *d[2];
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->malloc((void **)&d[r], 1024 * sizeof(float)));
    }
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < 2; r++)
        ncclAllReduce(d[r], d[r], 1024, ncclFloat32, ncclSum, g_comms[r], g_bufs[r].stream);
    check(ncclGroupEnd(), "ncclGroupEnd");
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->stream_synchronize(g_bufs[r].stream));
    }
    check(ncclAllReduce(d[0], d[0], 1024, ncclFloat32, ncclSum, g_comms[0], g_bufs[0].stream),
          "ncclAllReduce");
    CU(cu->set_device(g_dev[0]));
    CU(cu->stream_synchronize(g_bufs[0].stream)); /* the kernel gives up after WEFT_TIMEOUT */
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(g_comms[0], &async), "ncclCommGetAsyncError");
    const char *msg = ncclGetLastError(NULL);
    int ok = async == ncclRemoteError &&
             strstr(msg, "rank 1 did not enter ncclAllReduce(count 1024, float, sum) #2") != NULL;
    printf("skip: async error %d: %s\n", async, msg);
    if (!ok)
        fprintf(stderr, "FAIL skip\n");
    for (int r = 0; r < 2; r++) {
        CU(cu->set_device(g_dev[r]));
        CU(cu->free(d[r]));
        ncclCommAbort(g_comms[r]);
        g_comms[r] = NULL;
    }
    return finish(ok);
}

static int case_badbuf(void)
{
    if (!setup_all())
        return 1;
    float *d1, host[16];
    CU(cu->set_device(g_d > 1 ? 1 : 0));
    CU(cu->malloc((void **)&d1, 16 * sizeof(float)));
    int ok = 1;
    if (g_d > 1) { /* rank 0 is on device 0 */
        ncclResult_t r = ncclAllReduce(d1, d1, 16, ncclFloat32, ncclSum, g_comms[0],
                                       g_bufs[0].stream);
        ok &= r == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "sendbuff") != NULL;
    }
    ncclResult_t r2 = ncclAllReduce(host, d1, 16, ncclFloat32, ncclSum,
                                    g_comms[g_d > 1 ? 1 : 0], g_bufs[0].stream);
    ok &= r2 == ncclInvalidArgument && strstr(ncclGetLastError(NULL), "host memory") != NULL;
    if (g_d > 1) {
        /* Rank 1's buffers, on device 1, and a stream of device 0: CUDA fails recording the
         * comm's event there (NCCL: ncclUnhandledCudaError, "invalid resource handle"). */
        ncclResult_t r3 = ncclAllReduce(d1, d1, 16, ncclFloat32, ncclSum, g_comms[1],
                                        g_bufs[0].stream);
        ok &= r3 == ncclUnhandledCudaError &&
              strstr(ncclGetLastError(NULL), "cudaEventRecord") != NULL;
        if (r3 != ncclUnhandledCudaError)
            fprintf(stderr, "FAIL badbuf: a stream of another device gave %d\n", r3);
    }
    if (!ok)
        fprintf(stderr, "FAIL badbuf: %s\n", ncclGetLastError(NULL));
    CU(cu->free(d1));
    return finish(ok);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE [-n NRANKS] [-d DEVICES] [-s] [-q] [-b] [-a]\n", argv[0]);
        return 2;
    }
    const char *c = argv[1];
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            g_n = atoi(argv[++i]);
        else if (strcmp(argv[i], "-d") == 0 && i + 1 < argc)
            g_d = atoi(argv[++i]);
        else if (strcmp(argv[i], "-s") == 0)
            g_one_stream = 1;
        else if (strcmp(argv[i], "-q") == 0)
            g_quick = 1;
        else if (strcmp(argv[i], "-b") == 0)
            g_nonblocking = 1;
        else if (strcmp(argv[i], "-a") == 0)
            g_all = 1;
    }
    if (g_n < 1 || g_n > MAXR || g_d < 1) {
        fprintf(stderr, "bad -n or -d\n");
        return 2;
    }
    cu = weft_cuda();
    int ndev = 0;
    if (cu->get_device_count(&ndev) != 0 || ndev < g_d) {
        fprintf(stderr, "SKIP: %d devices (%s backend), %d needed; set WEFT_CUDA=emu:%d\n", ndev,
                cu->name, g_d, g_d);
        return 77;
    }
    double t0 = now_s();
    int rc;
    if (strcmp(c, "sweep") == 0)
        rc = case_sweep();
    else if (strcmp(c, "multicomm") == 0)
        rc = case_multicomm();
    else if (strcmp(c, "initrank") == 0)
        rc = case_initrank();
    else if (strcmp(c, "queues") == 0)
        rc = case_queues();
    else if (strcmp(c, "lonely") == 0)
        rc = case_lonely();
    else if (strcmp(c, "graph") == 0)
        rc = case_graph();
    else if (strcmp(c, "graph-watchdog") == 0)
        rc = case_graph_side(0);
    else if (strcmp(c, "graph-memfree") == 0)
        rc = case_graph_side(1);
    else if (strcmp(c, "graph-a2a") == 0)
        rc = case_graph_a2a();
    else if (strcmp(c, "zcopy") == 0)
        rc = case_zcopy();
    else if (strcmp(c, "lazyload") == 0)
        rc = case_lazyload();
    else if (strcmp(c, "abort") == 0)
        rc = case_abort();
    else if (strcmp(c, "biggroup") == 0)
        rc = case_biggroup();
    else if (strcmp(c, "timeout") == 0)
        rc = case_timeout();
    else if (strcmp(c, "badbuf") == 0)
        rc = case_badbuf();
    else if (strcmp(c, "mismatch") == 0)
        rc = case_mismatch();
    else if (strcmp(c, "sig") == 0)
        rc = case_sig();
    else if (strcmp(c, "skip") == 0)
        rc = case_skip();
    else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    printf("%s -n %d -d %d%s: %d passed, %d failed in %.2f s\n", c, g_n, g_d,
           g_one_stream ? " (one stream)" : "", g_passed, g_failed, now_s() - t0);
    return rc != 0 || g_failed > 0 || g_passed == 0;
}
