/*
 * The CUDA executor with ranks as processes (run under weftrun; WEFT_CUDA=emu:D in CI, a real GPU
 * in tests/gpu/run.sh; exit 77 without a device): one rank per
 * process on device local_rank % D, device buffers, every collective through the p2p transport
 * (cuMem descriptors by default, legacy IPC handles with NCCL_CUMEM_ENABLE=0, host-memory FIFOs
 * with WEFT_EMU_PEER=0). Each rank checks its own output element by element (bitwise) against
 * the plain-loop reference of tests/common/coll_ref.h (every rank can compute every rank's input).
 *
 * Usage: weftrun -n N test_coll_mp CASE [-q]
 *   sweep  every collective x types x ops x counts x in/out-of-place (-q: fewer types and counts)
 *   split  ncclCommSplit into even and odd ranks, a sweep (-q) on each half, then the parent
 *   zcopy  registered ncclMemAlloc buffers (WEFT_ZCOPY_MIN_BYTES=1024): every candidate
 *          collective x float, half, bf16, int32 x every op x in/out of place, each checked to
 *          have run direct (weft_zcopy_count) exactly when it must; below the threshold; a
 *          group of two candidates (both direct), of a candidate and a small one (neither); one
 *          rank unregistered, then registered again; a cudaMalloc buffer registered (not
 *          shareable); everything deregistered
 *   straddle  registered buffers, rank 0's all-reduce count below WEFT_ZCOPY_MIN_BYTES (1024),
 *          the others' above: the others launch the direct kernel, rank 0 not; every rank gets
 *          the signature error (ncclInvalidUsage, "operations differ") well before WEFT_TIMEOUT
 *   kill   the last rank dies by SIGKILL as its kernel starts an all-reduce; every survivor,
 *          polling ncclCommGetAsyncError, gets an error naming it within WEFT_TIMEOUT seconds
 *          (run with weftrun --linger; each survivor prints "kill: ok"); -s: the survivors wait
 *          in cudaStreamSynchronize instead, and the kernel's deadline ends the wait (the error
 *          still names the dead rank); -z: registered ncclMemAlloc buffers, so the dying
 *          all-reduce runs in the direct kernel (checked on one that runs first)
 *   visible own|alias|both  each rank sets its own CUDA_VISIBLE_DEVICES before CUDA starts
 *          (WEFT_CUDA=emu:2; see case_visible): own, rank r < 2 sees only emulated device r and
 *          ranks r >= 2 see "1,0" and take the ordinal of emulated device r % 2 (one GPU under two
 *          ordinals); alias, every rank on emulated device 0, rank 0 as ordinal 0 of "0", the
 *          others as ordinal 1 of "1,0"; both, rank r on emulated device r % 2 as ordinal 0 of
 *          "0,1" or "1,0". Init succeeds, a quick sweep is right, and the FIFOs with a peer are
 *          pinned host memory exactly when it is on another GPU and either process does not see
 *          both devices or WEFT_EMU_PEER=0
 *   teardown  two all-reduces, then rank 0 destroys its communicator first (the others 0.5 s
 *          later): no FIFO memory freed while a peer has it open (legacy IPC; emulated GPU)
 *   stranger MODE  another process attacks the p2p transport's sockets (garbage, squat, forge,
 *          offer; see case_stranger): init succeeds, registered and plain operations right,
 *          nothing written into the attacker's memory
 * WEFT_TEST_SILENT_STRAY=1: every listener this process opens (bootstrap, socket transport,
 * device socket proxy) gets a silent connection the moment it listens, queued ahead of the real
 * peers; init must not wait for it (it took WEFT_SOCK_ADMIT_MS, 5 s, where the device proxy
 * admitted connections one at a time), so it must end in less than 5 s.
 * Exit 0 pass, 1 fail, 77 no device (each rank for itself; weftrun reports the first failure).
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/coll_ref.h"
#include "bootstrap/bootstrap.h"
#include "coll_cases.h"
#include "../common/elem.h"
#include "cuda/cuda_ops.h"
#include "exec/cuda.h"
#include "core/comm.h"
#include "exec/zcopy.h"
#include "nccl.h"
#include "redop.h"
#include "weft.h"

#define MAX_FAIL_PRINT 20


static int g_me, g_n, g_quick, g_sync, g_zreg;
static int g_passed, g_failed, g_printed;
static const struct weft_cuda_ops *cu;
static ncclComm_t g_comm;
static cudaStream_t g_stream;
static char *g_dsend, *g_drecv, *g_dscalar, *g_hsend, *g_hrecv;
static size_t g_bytes;

#define CU(call)                                                                                   \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_ != 0) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: %s failed: %s\n", g_me, __FILE__, __LINE__, #call,   \
                    cu->error_string(e_));                                                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int check(ncclResult_t res, const char *what)
{
    if (res != ncclSuccess) {
        fprintf(stderr, "rank %d: FAIL %s: %s (%s)\n", g_me, what, ncclGetErrorString(res),
                ncclGetLastError(g_comm));
        return 0;
    }
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bufs_ensure(size_t bytes)
{
    if (g_bytes >= bytes)
        return;
    if (g_dsend != NULL) {
        CU(cu->free(g_dsend));
        CU(cu->free(g_drecv));
    }
    free(g_hsend);
    free(g_hrecv);
    CU(cu->malloc((void **)&g_dsend, bytes));
    CU(cu->malloc((void **)&g_drecv, bytes));
    g_hsend = malloc(bytes);
    g_hrecv = malloc(bytes);
    if (g_hsend == NULL || g_hrecv == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", g_me);
        exit(1);
    }
    g_bytes = bytes;
}

static void fail(const char *what, int coll, int t, int op, size_t count, int inplace, size_t i,
                 double got, double want)
{
    g_failed++;
    if (g_printed++ < MAX_FAIL_PRINT)
        fprintf(stderr,
                "rank %d: FAIL %s %s type %d op %s count %zu %s index %zu: got %.17g want %.17g\n",
                g_me, what, coll_names[coll], t, op_name(op), count,
                inplace ? "in-place" : "out-of-place", i, got, want);
}

static double contrib(int coll, int t, int op, int r, size_t i)
{
    return coll_contrib(coll, t, op, r, i, g_n);
}

static ncclRedOp_t make_op(int t, int op)
{
    if (op != OP_PREMUL)
        return builtin_op(op);
    unsigned char scalar[8];
    ncclRedOp_t o = ncclSum;
    store(t, scalar, 0, premul_scalar(g_me));
    void *where = scalar;
    ncclScalarResidence_t res = ncclScalarHostImmediate;
    if (t % 2 == 1) { /* odd types: the scalar in device memory, read by the kernel */
        if (g_dscalar == NULL)
            CU(cu->malloc((void **)&g_dscalar, 8));
        CU(cu->memcpy_async(g_dscalar, scalar, 8, NULL));
        CU(cu->stream_synchronize(NULL));
        where = g_dscalar;
        res = ncclScalarDevice;
    }
    check(ncclRedOpCreatePreMulSum(&o, where, (ncclDataType_t)t, res, g_comm),
          "ncclRedOpCreatePreMulSum");
    return o;
}

static void run_one(int coll, int t, int op, size_t count, int inplace, int root)
{
    int n = g_n, r = g_me;
    size_t es = weft_dtype_size(t);
    size_t in_elems = count, out_elems = count;
    int a2a = coll == C_ALLTOALL || coll == C_P2PALL;
    if (coll == C_ALLGATHER || a2a || coll == C_GATHER)
        out_elems = count * n;
    if (coll == C_REDUCESCATTER || a2a || coll == C_SCATTER)
        in_elems = count * n;
    size_t big = (in_elems > out_elems ? in_elems : out_elems) + 1;
    bufs_ensure(big * es);
    memset(g_hrecv, 0x5a, big * es);
    char *hin = g_hsend, *din = g_dsend, *dout = g_drecv;
    int ip = inplace && (coll != C_GATHER && coll != C_SCATTER ? 1 : r == root);
    if (ip) {
        hin = g_hrecv;
        din = g_drecv;
        if (coll == C_ALLGATHER || coll == C_GATHER) {
            hin = g_hrecv + (size_t)r * count * es;
            din = g_drecv + (size_t)r * count * es;
        }
        if (coll == C_REDUCESCATTER || coll == C_SCATTER)
            dout = g_drecv + (size_t)r * count * es;
    }
    for (size_t i = 0; i < in_elems; i++)
        store(t, hin, i, contrib(coll, t, op, r, i));
    CU(cu->memcpy_async(g_drecv, g_hrecv, big * es, NULL));
    if (!ip)
        CU(cu->memcpy_async(g_dsend, g_hsend, in_elems * es + 1, NULL));
    CU(cu->stream_synchronize(NULL));
    ncclRedOp_t rop = coll <= C_REDUCESCATTER ? make_op(t, op) : ncclSum;
    ncclComm_t c = g_comm;
    cudaStream_t s = g_stream;
    ncclResult_t res = ncclSuccess;
    switch (coll) {
    case C_ALLREDUCE: res = ncclAllReduce(din, dout, count, t, rop, c, s); break;
    case C_REDUCE: res = ncclReduce(din, dout, count, t, rop, root, c, s); break;
    case C_REDUCESCATTER: res = ncclReduceScatter(din, dout, count, t, rop, c, s); break;
    case C_ALLGATHER: res = ncclAllGather(din, dout, count, t, c, s); break;
    case C_BROADCAST: res = ncclBroadcast(din, dout, count, t, root, c, s); break;
    case C_ALLTOALL: res = ncclAlltoAll(din, dout, count, t, c, s); break;
    case C_GATHER: res = ncclGather(din, dout, count, t, root, c, s); break;
    case C_SCATTER: res = ncclScatter(din, dout, count, t, root, c, s); break;
    case C_SENDRECV:
        res = ncclGroupStart();
        if (res == ncclSuccess)
            res = ncclSend(din, count, t, (r + 1) % n, c, s);
        if (res == ncclSuccess)
            res = ncclRecv(dout, count, t, (r + n - 1) % n, c, s);
        if (res == ncclSuccess)
            res = ncclGroupEnd();
        break;
    default: /* every pair, this rank included, both ways, in one group */
        res = ncclGroupStart();
        for (int j = 0; j < n && res == ncclSuccess; j++) {
            int peer = (r + j) % n;
            res = ncclSend(din + (size_t)peer * count * es, count, t, peer, c, s);
            if (res == ncclSuccess)
                res = ncclRecv(dout + (size_t)peer * count * es, count, t, peer, c, s);
        }
        if (res == ncclSuccess)
            res = ncclGroupEnd();
        break;
    }
    int ok = check(res, coll_names[coll]);
    CU(cu->stream_synchronize(s));
    if (coll <= C_REDUCESCATTER && op == OP_PREMUL)
        ncclRedOpDestroy(rop, g_comm);
    ncclResult_t async = ncclSuccess;
    ok &= check(ncclCommGetAsyncError(g_comm, &async), "ncclCommGetAsyncError") &&
          check(async, "the kernel");
    if (!ok) {
        fail("call", coll, t, op, count, inplace, 0, 0, 0);
        exit(1); /* the ranks are out of step now */
    }
    CU(cu->memcpy_async(g_hrecv, g_drecv, big * es, NULL));
    CU(cu->stream_synchronize(NULL));
    const char *out = g_hrecv + (size_t)(dout - g_drecv);
    size_t nout = out_elems;
    if (coll == C_REDUCESCATTER || coll == C_SCATTER || coll == C_SENDRECV)
        nout = count;
    if ((coll == C_REDUCE || coll == C_GATHER) && r != root)
        return;
    for (size_t i = 0; i < nout; i++) {
        double want = coll_want(coll, t, op, r, root, n, count, i);
        unsigned char wbits[8];
        store(t, wbits, 0, round_to(t, want));
        if (memcmp(out + i * es, wbits, es) != 0) {
            fail("data", coll, t, op, count, inplace, i, load(t, out, i), want);
            return;
        }
    }
    size_t end = (size_t)(out - g_hrecv) + nout * es;
    if (!inplace && (unsigned char)g_hrecv[end] != 0x5a) {
        fail("overrun", coll, t, op, count, inplace, nout, g_hrecv[end], 0x5a);
        return;
    }
    g_passed++;
}

static int case_sweep(void)
{
    static const size_t counts[] = {0, 1, 7, 1023, 65536 + 3};
    static const int few_types[] = {ncclFloat32, ncclInt8, ncclBfloat16};
    int ncounts = g_quick ? 4 : 5;
    for (int coll = 0; coll < NCOLLS; coll++) {
        int reducing = coll <= C_REDUCESCATTER;
        int all_types = coll == C_ALLREDUCE && !g_quick;
        int ntypes = all_types ? 12 : g_quick ? 2 : 3;
        for (int ti = 0; ti < ntypes; ti++) {
            int t = all_types ? ti : few_types[ti];
            int nops = !reducing ? 1 : coll == C_ALLREDUCE ? NOPS : 2;
            for (int oi = 0; oi < nops; oi++) {
                int op = !reducing ? -1 : coll == C_ALLREDUCE ? oi : oi == 0 ? OP_SUM : OP_MAX;
                for (int ci = 0; ci < ncounts; ci++) {
                    int big = counts[ci] > 60000;
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
                        run_one(coll, t, op, count, inplace, (ci + ti) % g_n);
                    }
                }
            }
        }
    }
    return 0;
}

/* The emulated GPU's count of cudaFree calls on memory another process still had open through a
 * legacy IPC handle (src/cuda/emu.c). */
uint64_t weft_emu_ipc_busy_frees(void);

/*
 * Issue 29, finding 5 (legacy IPC teardown): a few all-reduces through the FIFOs (legacy IPC
 * handles with NCCL_CUMEM_ENABLE=0); then main destroys the communicator on rank 0 at once and
 * on the others 0.5 s later: rank 0 must not free its FIFO memory while the peers still have it
 * open (the emulated GPU reports such a cudaFree; main checks that none happened).
 */
static int case_teardown(void)
{
    run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, 1023, 0, 0);
    run_one(C_ALLGATHER, ncclFloat32, -1, 4099, 0, 0);
    return 0;
}

/* run_one, then checks that the operation went direct (want 1) or not (0) on this rank. */
static void zc_run(int coll, int t, int op, size_t count, int inplace, int want)
{
    uint64_t before = weft_zcopy_count(g_comm);
    int failed = g_failed;
    run_one(coll, t, op, count, inplace, 0);
    uint64_t ran = weft_zcopy_count(g_comm) - before;
    if (g_failed == failed && ran != (uint64_t)want) {
        g_passed--;
        fail("direct-count", coll, t, op, count, inplace, 0, (double)ran, (double)want);
    }
}

/* One group on the registered buffers: an all-reduce (float, sum) of count, then an all-gather
 * (int32) of count2 further on; both checked element by element, and the direct runs (want). */
static void zc_group(size_t count, size_t count2, int want)
{
    int n = g_n, r = g_me;
    size_t off = (count * 4 + 255) & ~(size_t)255, agbytes = (size_t)n * count2 * 4;
    for (size_t i = 0; i < count; i++)
        store(ncclFloat32, g_hsend, i, contrib(C_ALLREDUCE, ncclFloat32, OP_SUM, r, i));
    for (size_t i = 0; i < count2; i++)
        store(ncclInt32, g_hsend + off, i, contrib(C_ALLGATHER, ncclInt32, -1, r, i));
    CU(cu->memcpy_async(g_dsend, g_hsend, off + count2 * 4, NULL));
    CU(cu->memset_async(g_drecv, 0, off + agbytes, NULL));
    CU(cu->stream_synchronize(NULL));
    uint64_t before = weft_zcopy_count(g_comm);
    int ok = check(ncclGroupStart(), "ncclGroupStart") &&
             check(ncclAllReduce(g_dsend, g_drecv, count, ncclFloat32, ncclSum, g_comm, g_stream),
                   "ncclAllReduce") &&
             check(ncclAllGather(g_dsend + off, g_drecv + off, count2, ncclInt32, g_comm,
                                 g_stream), "ncclAllGather") &&
             check(ncclGroupEnd(), "ncclGroupEnd");
    CU(cu->stream_synchronize(g_stream));
    ncclResult_t async = ncclSuccess;
    ok &= check(ncclCommGetAsyncError(g_comm, &async), "ncclCommGetAsyncError") &&
          check(async, "the kernel");
    if (!ok)
        exit(1);
    CU(cu->memcpy_async(g_hrecv, g_drecv, off + agbytes, NULL));
    CU(cu->stream_synchronize(NULL));
    for (int k = 0; k < 2; k++) {
        int coll = k == 0 ? C_ALLREDUCE : C_ALLGATHER, t = k == 0 ? ncclFloat32 : ncclInt32;
        size_t c = k == 0 ? count : count2, nout = k == 0 ? count : (size_t)n * count2;
        const char *out = g_hrecv + (k == 0 ? 0 : off);
        for (size_t i = 0; i < nout; i++) {
            double w = coll_want(coll, t, k == 0 ? OP_SUM : -1, r, 0, n, c, i);
            unsigned char wbits[8];
            store(t, wbits, 0, round_to(t, w));
            if (memcmp(out + i * 4, wbits, 4) != 0) {
                fail("group data", coll, t, k == 0 ? OP_SUM : -1, c, 0, i, load(t, out, i), w);
                return;
            }
        }
    }
    uint64_t ran = weft_zcopy_count(g_comm) - before;
    if (ran != (uint64_t)want) {
        fail("group direct-count", C_ALLGATHER, ncclInt32, -1, count2, 0, 0, (double)ran, want);
        return;
    }
    g_passed++;
}

/* Registered device buffers of `bytes` each (ncclMemAlloc + ncclCommRegister) become the
 * send and receive buffers of the next operations, with host copies of that size. 0 on success. */
static int zc_bufs_register(size_t bytes, char **hs_p, char **hr_p, void **rs_p, void **rr_p)
{
    free(g_hsend);
    free(g_hrecv);
    g_hsend = malloc(bytes);
    g_hrecv = malloc(bytes);
    if (g_hsend == NULL || g_hrecv == NULL ||
        !check(ncclMemAlloc((void **)hs_p, bytes), "ncclMemAlloc") ||
        !check(ncclMemAlloc((void **)hr_p, bytes), "ncclMemAlloc") ||
        !check(ncclCommRegister(g_comm, *hs_p, bytes, rs_p), "ncclCommRegister") ||
        !check(ncclCommRegister(g_comm, *hr_p, bytes, rr_p), "ncclCommRegister"))
        return 1;
    g_dsend = *hs_p;
    g_drecv = *hr_p;
    g_bytes = bytes;
    return 0;
}

static int case_zcopy(void)
{
    const size_t count = 4099; /* every candidate's larger buffer >= 1024 bytes */
    const char *e = getenv("WEFT_ZCOPY_MIN_BYTES");
    if (e == NULL || atoll(e) != 1024) {
        fprintf(stderr, "rank %d: zcopy wants WEFT_ZCOPY_MIN_BYTES=1024\n", g_me);
        return 1;
    }
    /* the emulated devices all reach each other unless WEFT_EMU_PEER=0 */
    const char *peer = getenv("WEFT_EMU_PEER");
    int direct = g_n > 1 && (peer == NULL || atoi(peer) != 0);
    size_t bytes = ((size_t)g_n * count + 1) * 8;
    bufs_ensure(1); /* the plain buffers exist; the registered ones stand in for them */
    char *plain_send = g_dsend, *plain_recv = g_drecv;
    size_t plain_bytes = g_bytes;
    char *hs = NULL, *hr = NULL;
    void *rs = NULL, *rr = NULL;
    if (zc_bufs_register(bytes, &hs, &hr, &rs, &rr) != 0)
        return 1;
    /* a barrier (not a candidate): every rank has registered, its offers are on their way */
    zc_run(C_ALLREDUCE, ncclFloat32, OP_SUM, 1, 0, 0);
    static const int types[] = {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32};
    static const int colls[] = {C_ALLREDUCE, C_REDUCESCATTER, C_ALLGATHER};
    for (int ci = 0; ci < 3; ci++)
        for (int ti = 0; ti < 4; ti++)
            for (int op = 0; op < (colls[ci] == C_ALLGATHER ? 1 : NOPS); op++)
                for (int inplace = 0; inplace < 2; inplace++)
                    zc_run(colls[ci], types[ti], colls[ci] == C_ALLGATHER ? -1 : op, count,
                           inplace, direct);
    zc_run(C_ALLREDUCE, ncclFloat32, OP_SUM, 7, 0, 0); /* 28 bytes: below the threshold */
    /* groups: two candidates go one launch each, both direct; with one below the threshold
     * the group is one launch, the normal path */
    zc_group(count, count, 2 * direct);
    zc_group(count, 7, 0);
    /* the last rank's input unregistered: nobody goes direct; registered again: all do */
    int last = g_me == g_n - 1;
    if (last && !check(ncclCommDeregister(g_comm, rs), "ncclCommDeregister"))
        return 1;
    zc_run(C_ALLGATHER, ncclFloat32, -1, count, 0, 0);
    zc_run(C_ALLREDUCE, ncclInt32, OP_SUM, count, 0, 0);
    if (last && !check(ncclCommRegister(g_comm, hs, bytes, &rs), "ncclCommRegister"))
        return 1;
    zc_run(C_ALLREDUCE, ncclFloat32, OP_SUM, 1, 0, 0); /* barrier */
    zc_run(C_ALLGATHER, ncclFloat32, -1, count, 0, direct);
    zc_run(C_REDUCESCATTER, ncclBfloat16, OP_MAX, count, 0, direct);
    /* rank 0's input a registered cudaMalloc buffer: its peers cannot map it (legacy IPC is
     * the comm's handle form only for ncclMemAlloc memory), so every rank votes no */
    void *rp = NULL;
    if (g_me == 0) {
        g_dsend = plain_send;
        if (plain_bytes < bytes) {
            CU(cu->free(plain_send));
            CU(cu->malloc((void **)&plain_send, bytes));
            g_dsend = plain_send;
            plain_bytes = bytes;
        }
        if (!check(ncclCommRegister(g_comm, g_dsend, bytes, &rp), "ncclCommRegister"))
            return 1;
    }
    zc_run(C_ALLGATHER, ncclFloat32, -1, count, 0, 0);
    zc_run(C_REDUCESCATTER, ncclFloat32, OP_SUM, count, 0, 0);
    g_dsend = hs;
    if (g_me == 0 && !check(ncclCommDeregister(g_comm, rp), "ncclCommDeregister"))
        return 1;
    zc_run(C_ALLGATHER, ncclFloat32, -1, count, 0, direct);
    /* everything deregistered: the normal path, right results */
    if (!check(ncclCommDeregister(g_comm, rs), "ncclCommDeregister") ||
        !check(ncclCommDeregister(g_comm, rr), "ncclCommDeregister"))
        return 1;
    zc_run(C_ALLREDUCE, ncclFloat32, OP_SUM, count, 0, 0);
    zc_run(C_ALLGATHER, ncclInt32, -1, count, 1, 0);
    g_dsend = plain_send;
    g_drecv = plain_recv;
    g_bytes = plain_bytes < bytes ? plain_bytes : bytes;
    if (!check(ncclMemFree(hs), "ncclMemFree") || !check(ncclMemFree(hr), "ncclMemFree"))
        return 1;
    return 0;
}

/* case visible: rank r's emulated device, its CUDA_VISIBLE_DEVICES and ordinal there. */
static const char *g_visible;
static int vis_phys(int r) { return strcmp(g_visible, "alias") == 0 ? 0 : r % 2; }
static const char *vis_list(int r)
{
    if (strcmp(g_visible, "alias") == 0)
        return r == 0 ? "0" : "1,0";
    if (strcmp(g_visible, "both") == 0)
        return r % 2 == 0 ? "0,1" : "1,0";
    return r == 0 ? "0" : r == 1 ? "1" : "1,0";
}
static int vis_ordinal(int r)
{
    return strcmp(g_visible, "both") != 0 && strcmp(vis_list(r), "1,0") == 0 ? 1 - vis_phys(r)
                                                                             : 0;
}
/* Whether rank r's process sees emulated device k. */
static int vis_sees(int r, int k) { return strchr(vis_list(r), '0' + k) != NULL; }

static int case_visible(void)
{
    int ndev = 0, want_ndev = strchr(vis_list(g_me), ',') != NULL ? 2 : 1;
    struct weft_cuda_dev_id id;
    char bus[WEFT_CUDA_BUS_ID_BYTES];
    CU(cu->get_device_count(&ndev));
    CU(cu->device_id(vis_ordinal(g_me), &id));
    snprintf(bus, sizeof(bus), "0000:%02x:00.0", 0x10 + vis_phys(g_me));
    if (ndev != want_ndev || strcmp(id.bus_id, bus) != 0) {
        fprintf(stderr, "rank %d: CUDA_VISIBLE_DEVICES %s: %d devices (want %d), ordinal %d at "
                "%s (want %s)\n", g_me, vis_list(g_me), ndev, want_ndev, vis_ordinal(g_me),
                id.bus_id, bus);
        return 1;
    }
    const char *peer = getenv("WEFT_EMU_PEER");
    int nopeer = peer != NULL && atoi(peer) == 0, want = 0;
    /* another GPU goes through host memory unless both processes see both devices and have
     * peer access (a device a process does not see is not reached directly, as CUDA's
     * cudaDeviceGetByPCIBusId cannot name it there) */
    int mine = vis_phys(g_me);
    for (int q = 0; q < g_n; q++)
        want += q != g_me && vis_phys(q) != mine &&
                (nopeer || !vis_sees(g_me, vis_phys(q)) || !vis_sees(q, mine));
    int got = weft_cuda_host_fifo_peers(g_comm);
    if (got != want) {
        fprintf(stderr, "rank %d (emulated device %d as ordinal %d of \"%s\"): %d peers through "
                "host-memory FIFOs, want %d\n", g_me, vis_phys(g_me), vis_ordinal(g_me),
                vis_list(g_me), got, want);
        g_failed++;
    }
    g_quick = 1;
    return case_sweep();
}

/* Polls ncclCommGetAsyncError until it reports an error or limit seconds pass: the error (or
 * ncclSuccess), *took_p the seconds waited from t0. */
static ncclResult_t await_error(double t0, double limit, double *took_p)
{
    ncclResult_t async = ncclSuccess;
    while (now_s() - t0 < limit) {
        if (!check(ncclCommGetAsyncError(g_comm, &async), "ncclCommGetAsyncError"))
            exit(1);
        if (async != ncclSuccess && async != ncclInProgress)
            break;
        usleep(10000);
    }
    *took_p = now_s() - t0;
    return async;
}

static int case_straddle(void)
{
    size_t bytes = 4099 * sizeof(float), count = g_me == 0 ? 100 : 4099;
    char *hs = NULL, *hr = NULL;
    void *rs = NULL, *rr = NULL;
    if (!check(ncclMemAlloc((void **)&hs, bytes), "ncclMemAlloc") ||
        !check(ncclMemAlloc((void **)&hr, bytes), "ncclMemAlloc") ||
        !check(ncclCommRegister(g_comm, hs, bytes, &rs), "ncclCommRegister") ||
        !check(ncclCommRegister(g_comm, hr, bytes, &rr), "ncclCommRegister"))
        return 1;
    CU(cu->memset_async(hs, 0, bytes, g_stream));
    /* a barrier (not a candidate), then the mismatched pair */
    if (!check(ncclAllReduce(hs, hr, 1, ncclFloat32, ncclSum, g_comm, g_stream), "ncclAllReduce"))
        return 1;
    CU(cu->stream_synchronize(g_stream));
    double t0 = now_s();
    if (!check(ncclAllReduce(hs, hr, count, ncclFloat32, ncclSum, g_comm, g_stream),
               "ncclAllReduce"))
        return 1;
    const char *to = getenv("WEFT_TIMEOUT");
    double limit = (to != NULL ? atof(to) : 300) / 3, took;
    ncclResult_t async = await_error(t0, limit, &took);
    const char *msg = ncclGetLastError(g_comm);
    int ok = async == ncclInvalidUsage && strstr(msg, "operations differ between ranks") != NULL &&
             took < limit;
    fprintf(stderr, "rank %d: straddle: %s after %.1f s (limit %.0f s): %s: %s\n", g_me,
            ok ? "ok" : "FAIL", took, limit, ncclGetErrorString(async), msg);
    sleep(1); /* the slower ranks still read this one's slots */
    ncclCommAbort(g_comm);
    g_comm = NULL;
    _exit(ok ? 0 : 1); /* the communicator is broken: nothing else to tidy */
}

static int case_kill(void)
{
    int victim = g_n - 1;
    size_t count = 1 << 20;
    run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, 1023, 0, 0); /* everyone is up and connected */
    bufs_ensure(count * sizeof(float));
    if (g_zreg) {
        /* registered ncclMemAlloc buffers: the all-reduces run in the direct kernel, whose
         * exchange waits must end too (with WEFT_ZCOPY_MIN_BYTES at most 4 MiB) */
        void *h0 = NULL, *h1 = NULL;
        bufs_ensure((count + 1) * sizeof(float)); /* run_one's size: no reallocation below */
        if (!check(ncclMemAlloc((void **)&g_dsend, g_bytes), "ncclMemAlloc") ||
            !check(ncclMemAlloc((void **)&g_drecv, g_bytes), "ncclMemAlloc") ||
            !check(ncclCommRegister(g_comm, g_dsend, g_bytes, &h0), "register") ||
            !check(ncclCommRegister(g_comm, g_drecv, g_bytes, &h1), "register"))
            return 1;
        run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, 1, 0, 0); /* a barrier: all registered */
        uint64_t before = weft_zcopy_count(g_comm);
        run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, count, 0, 0);
        if (weft_zcopy_count(g_comm) != before + 1) {
            fprintf(stderr, "rank %d: kill -z: the all-reduce did not run direct\n", g_me);
            return 1;
        }
    }
    if (!check(ncclAllReduce(g_dsend, g_drecv, count, ncclFloat32, ncclSum, g_comm, g_stream),
               "ncclAllReduce"))
        return 1;
    /* The victim dies right after its launch, its kernel queued or running; the survivors' next
     * all-reduce cannot finish, whatever became of the first. */
    if (g_me == victim)
        raise(SIGKILL);
    if (!check(ncclAllReduce(g_dsend, g_drecv, count, ncclFloat32, ncclSum, g_comm, g_stream),
               "ncclAllReduce"))
        return 1;
    const char *to = getenv("WEFT_TIMEOUT");
    double limit = to != NULL ? atof(to) : 300, t0 = now_s();
    ncclResult_t async = ncclSuccess;
    if (g_sync) {
        /* Blocked in the stream: the kernel gives up at its deadline, then the error is read. */
        cu->stream_synchronize(g_stream);
        limit += 10; /* the kernel's deadline is WEFT_TIMEOUT itself: allow for its polling */
    }
    double took;
    async = await_error(t0, limit + 30, &took);
    const char *msg = ncclGetLastError(g_comm);
    char want[32];
    snprintf(want, sizeof(want), "peer %d ", victim);
    /* Across hosts the host socket transport (which also links the ranks) may see the victim's
     * connection end first: its error names the peer too. */
    int ok = async == ncclRemoteError && strstr(msg, want) != NULL &&
             (strstr(msg, "died") != NULL || strstr(msg, "closed by the peer") != NULL) &&
             took < limit;
    fprintf(stderr, "rank %d: kill: %s after %.1f s (deadline %.0f s): %s: %s\n", g_me,
            ok ? "ok" : "FAIL", took, limit, ncclGetErrorString(async), msg);
    /* Stay a while: a survivor that exits at once is a second dead peer for the slower ones, which
     * may name it instead (in -s mode every survivor's kernel gives up at the same deadline). */
    sleep(3);
    ncclCommAbort(g_comm);
    g_comm = NULL;
    _exit(ok ? 0 : 1); /* the dead peer's memory stays mapped: nothing else to tidy */
}

/* ncclCommSplit into even and odd ranks: a quick sweep on each half (its own p2p mappings), then
 * one all-reduce on the parent again. */
static int case_split(void)
{
    ncclComm_t parent = g_comm, child = NULL;
    int me = g_me, n = g_n;
    if (!check(ncclCommSplit(parent, me % 2, me, &child, NULL), "ncclCommSplit"))
        return 1;
    if (!check(ncclCommUserRank(child, &g_me), "ncclCommUserRank") ||
        !check(ncclCommCount(child, &g_n), "ncclCommCount"))
        return 1;
    g_comm = child;
    g_quick = 1;
    case_sweep();
    if (!check(ncclCommDestroy(child), "ncclCommDestroy (child)"))
        return 1;
    g_comm = parent;
    g_me = me;
    g_n = n;
    run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, 65536 + 3, 0, 0);
    return 0;
}

/*
 * stranger MODE: another process on the host (a child of each rank, as user nobody when the
 * test runs as root) attacks the p2p transport's datagram sockets (transports/p2p/p2p.c). Every
 * bind() of the library passes through the override below, which tells the attacker each name
 * the moment it is bound (so the attack lands before any peer's message) and, in squat mode,
 * lets the attacker bind it first. The attacker keeps hitting the names it knows every 10 ms
 * while the ranks run (without pause with WEFT_TEST_STRANGER_FLOOD set). MODE:
 *   garbage  datagrams of 1, 24, 112 and 200 random bytes, some with a descriptor attached
 *   squat    the attacker binds names before the library does: its 1st and 2nd FIFO socket
 *            name, and its 1st and 3rd registration socket name (with 3 ranks the 3rd is the
 *            second of a set: the first, bound, must make way too)
 *   forge    well-formed FIFO descriptor messages (magic, communicator hash, every sender
 *            rank and region; the layout before authentication, and the one after with a
 *            random MAC) with the attacker's memfd, and withdrawals of registration ids 1-4
 *   offer    registration offers of ids 1-4 carrying the attacker's memfd (pattern-filled)
 *   impostor forge's FIFO messages and offer's offers, each sent once claiming every rank's pid
 *            in SCM_CREDENTIALS (the attacker stays root for that; without root, plain): the
 *            MAC alone tells them from the peers'
 * Each rank then runs registered and plain all-reduces, all-gathers and reduce-scatters, checked
 * element by element (init must succeed), the registered ones all direct (the peers' offers
 * mapped, whatever the attacker sent); at the end the attacker's memfd must hold its pattern
 * still (nothing of this rank's data written into it).
 */
#define ATT_MEM_BYTES (4u << 20)
#define ATT_PATTERN 0x5a
struct att_fifo_msg { /* transports/p2p/p2p.c before authentication */
    uint64_t magic;
    uint64_t comm_hash;
    int32_t from;
    int32_t region;
};
struct att_reg_msg {
    uint64_t magic;
    uint64_t comm_hash;
    int32_t from;
    int32_t kind;
    int32_t how;
    int32_t dev;
    uint64_t id;
    uint64_t bytes;
    struct weft_cuda_ipc_handle handle;
};
/* The same with authentication (version 2): the stranger cannot make the MAC (random here). */
struct att_fifo_msg2 {
    struct att_fifo_msg m;
    unsigned char mac[32];
};
struct att_reg_msg2 {
    uint64_t magic;
    uint64_t comm_hash;
    int32_t from;
    int32_t kind;
    int32_t how;
    int32_t dev;
    uint64_t id;
    uint64_t bytes;
    uint64_t seq;
    struct weft_cuda_ipc_handle handle;
    unsigned char mac[32];
};
static const char *g_att_mode;
static int g_att_sock = -1, g_att_binds[2], g_att_memfd = -1;
static pid_t g_att_pid = -1;
static uint64_t g_att_hash, g_att_offer_bytes;

static pid_t g_att_pids[16]; /* impostor: the ranks (weftrun's children) */
static int g_att_npids;

/* impostor: every rank's pid (the children of this rank's parent, weftrun). */
static void att_find_ranks(void)
{
    char path[300], line[512];
    long launcher = -1;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)getppid());
    FILE *f = fopen(path, "r");
    if (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        const char *e = strrchr(line, ')'); /* after the command name: state, then ppid */
        if (e != NULL)
            sscanf(e + 2, "%*c %ld", &launcher);
    }
    if (f != NULL)
        fclose(f);
    DIR *d = opendir("/proc");
    struct dirent *de;
    g_att_npids = 0;
    while (d != NULL && (de = readdir(d)) != NULL && g_att_npids < 16) {
        long ppid = -1;
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
        if ((f = fopen(path, "r")) == NULL)
            continue;
        if (fgets(line, sizeof(line), f) != NULL) {
            const char *e = strrchr(line, ')');
            if (e != NULL)
                sscanf(e + 2, "%*c %ld", &ppid);
        }
        fclose(f);
        if (ppid == launcher)
            g_att_pids[g_att_npids++] = (pid_t)atoi(de->d_name);
    }
    if (d != NULL)
        closedir(d);
}

static void att_send1(int s, const char *name, const void *buf, size_t len, int fd, pid_t pid)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    size_t nl = strlen(name);
    memcpy(a.sun_path + 1, name, nl);
    struct iovec iov = {(void *)buf, len};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
    } u;
    memset(&u, 0, sizeof(u));
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_name = &a;
    m.msg_namelen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.b;
    struct cmsghdr *c = &u.h; /* the first header; the second right after it */
    if (fd >= 0) {
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
        m.msg_controllen += CMSG_SPACE(sizeof(int));
        c = (struct cmsghdr *)(u.b + CMSG_SPACE(sizeof(int)));
    }
    if (pid > 0) { /* root may claim any pid (CAP_SYS_ADMIN) */
        struct ucred cred = {pid, 0, 0};
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_CREDENTIALS;
        c->cmsg_len = CMSG_LEN(sizeof(cred));
        memcpy(CMSG_DATA(c), &cred, sizeof(cred));
        m.msg_controllen += CMSG_SPACE(sizeof(cred));
    }
    if (m.msg_controllen == 0)
        m.msg_control = NULL;
    (void)sendmsg(s, &m, MSG_DONTWAIT | MSG_NOSIGNAL); /* a full queue: next round */
}

/* One datagram; as an impostor, one per rank's pid claimed. */
static void att_send(int s, const char *name, const void *buf, size_t len, int fd)
{
    if (strcmp(g_att_mode, "impostor") != 0) {
        att_send1(s, name, buf, len, fd, 0);
        return;
    }
    if (g_att_npids < g_n)
        att_find_ranks();
    for (int i = 0; i < g_att_npids; i++)
        att_send1(s, name, buf, len, fd, g_att_pids[i]);
}

/* One round against one of the library's socket names. */
static void att_hit(int s, const char *name)
{
    int reg = strncmp(name, "weft-reg-", 9) == 0;
    const char *dash = strrchr(name, '-');
    int from = reg && dash != NULL ? atoi(dash + 1) : 0;
    unsigned char junk[256];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (unsigned char)rand();
    if (strcmp(g_att_mode, "garbage") == 0) {
        att_send(s, name, junk, 1, -1);
        att_send(s, name, junk, sizeof(struct att_fifo_msg), g_att_memfd);
        att_send(s, name, junk, sizeof(struct att_reg_msg), g_att_memfd);
        att_send(s, name, junk, 200, -1);
    } else if ((strcmp(g_att_mode, "forge") == 0 || strcmp(g_att_mode, "impostor") == 0) &&
               !reg) {
        for (int p = 0; p < g_n; p++)
            for (int r = 0; r < 2; r++) {
                struct att_fifo_msg m = {0x3170327074666577ull, g_att_hash, p, r};
                att_send(s, name, &m, sizeof(m), g_att_memfd);
                struct att_fifo_msg2 m2 = {{0x3270327074666577ull, g_att_hash, p, r}, {0}};
                memcpy(m2.mac, junk, sizeof(m2.mac));
                att_send(s, name, &m2, sizeof(m2), g_att_memfd);
            }
    } else {
        int offer = strcmp(g_att_mode, "forge") != 0;
        if (!reg)
            return;
        for (uint64_t id = 1; id <= 4; id++) {
            struct att_reg_msg m;
            memset(&m, 0, sizeof(m));
            m.magic = 0x3267657274666577ull;
            m.comm_hash = g_att_hash;
            m.from = from;
            m.kind = offer ? 1 : 2;
            m.how = 1; /* WEFT_DEV_HOW_FD */
            m.dev = 0;
            m.id = id;
            m.bytes = g_att_offer_bytes;
            att_send(s, name, &m, sizeof(m), offer ? g_att_memfd : -1);
            struct att_reg_msg2 m2;
            memset(&m2, 0, sizeof(m2));
            m2.magic = 0x3367657274666577ull;
            m2.comm_hash = g_att_hash;
            m2.from = from;
            m2.kind = m.kind;
            m2.how = m.how;
            m2.id = id;
            m2.bytes = m.bytes;
            m2.seq = id;
            memcpy(m2.mac, junk + id, sizeof(m2.mac));
            att_send(s, name, &m2, sizeof(m2), offer ? g_att_memfd : -1);
        }
    }
}

/* The attacker: takes commands ('b' name: attack it now; 's' name: bind it first) and
 * answers each with one byte; between them, attacks every name it was told every 10 ms. */
static void att_main(int cmd)
{
    /* another user where it can (root without CAP_SETUID, e.g. in a user namespace: the same) */
    if (getuid() == 0 && strcmp(g_att_mode, "impostor") != 0 &&
        (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0))
        perror("attacker: setresuid(nobody); attacking as root");
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    static char names[64][128];
    int nnames = 0;
    srand((unsigned)getpid());
    for (;;) {
        struct pollfd pf = {cmd, POLLIN, 0};
        int got = poll(&pf, 1, getenv("WEFT_TEST_STRANGER_FLOOD") ? 0 : 10);
        if (got > 0) {
            char buf[128];
            ssize_t n = recv(cmd, buf, sizeof(buf) - 1, 0);
            if (n <= 0)
                _exit(0);
            buf[n] = 0;
            if (buf[0] == 's') {
                struct sockaddr_un a;
                memset(&a, 0, sizeof(a));
                a.sun_family = AF_UNIX;
                size_t nl = strlen(buf + 1);
                memcpy(a.sun_path + 1, buf + 1, nl);
                int q = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                if (bind(q, (struct sockaddr *)&a,
                         (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)) != 0)
                    perror("attacker: squatting");
            } else if (buf[0] == 'b') {
                if (nnames < 64)
                    snprintf(names[nnames++], sizeof(names[0]), "%s", buf + 1);
                att_hit(s, buf + 1);
            }
            if (write(cmd, "k", 1) != 1)
                _exit(0);
        } else {
            for (int i = 0; i < nnames; i++)
                att_hit(s, names[i]);
        }
    }
}

/* Before init: the memfd, then the attacker (before any name is bound). */
static void att_start(const char *mode, const ncclUniqueId *id)
{
    g_att_mode = mode;
    g_att_hash = weft_bootstrap_magic(id);
    g_att_offer_bytes = ((size_t)g_n * 4099 + 1) * 8; /* as stranger_run registers */
    g_att_memfd = memfd_create("stranger", MFD_CLOEXEC);
    if (g_att_memfd < 0 || ftruncate(g_att_memfd, ATT_MEM_BYTES) != 0) {
        perror("memfd");
        exit(1);
    }
    unsigned char *p = mmap(NULL, ATT_MEM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED,
                            g_att_memfd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(p, ATT_PATTERN, ATT_MEM_BYTES);
    munmap(p, ATT_MEM_BYTES);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        exit(1);
    }
    g_att_pid = fork();
    if (g_att_pid == 0) {
        close(sv[0]);
        att_main(sv[1]);
    }
    close(sv[1]);
    g_att_sock = sv[0];
}

/* Tells the attacker (kind 'b' or 's') about name and waits for its answer (2 s at most). */
static void att_tell(char kind, const char *name, size_t nl)
{
    char buf[128];
    if (nl > sizeof(buf) - 2)
        return;
    buf[0] = kind;
    memcpy(buf + 1, name, nl);
    if (send(g_att_sock, buf, nl + 1, MSG_NOSIGNAL) != (ssize_t)(nl + 1))
        return;
    struct pollfd pf = {g_att_sock, POLLIN, 0};
    if (poll(&pf, 1, 2000) > 0)
        (void)!read(g_att_sock, buf, 1);
}

/* Every bind() of the library passes here (the stranger case's view of its socket names). */
int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
    const struct sockaddr_un *a = (const struct sockaddr_un *)sa;
    size_t off = offsetof(struct sockaddr_un, sun_path) + 1;
    int ours = g_att_sock >= 0 && sa->sa_family == AF_UNIX && len > off &&
               a->sun_path[0] == 0 && len - off >= 9 &&
               (memcmp(a->sun_path + 1, "weft-p2p-", 9) == 0 ||
                memcmp(a->sun_path + 1, "weft-reg-", 9) == 0);
    int reg = ours && a->sun_path[6] == 'r', nth = ours ? ++g_att_binds[reg] : 0;
    if (ours && strcmp(g_att_mode, "squat") == 0 && (nth == 1 || nth == 2 + reg)) {
        att_tell('s', a->sun_path + 1, len - off);
    }
    int rc = (int)syscall(SYS_bind, fd, sa, len);
    if (ours && rc == 0 && strcmp(g_att_mode, "squat") != 0)
        att_tell('b', a->sun_path + 1, len - off);
    return rc;
}

static int case_stranger(void)
{
    const size_t count = 4099;
    size_t bytes = ((size_t)g_n * count + 1) * 8;
    /* the plain path (the FIFOs the attack aimed at during init) */
    run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, 1023, 0, 0);
    run_one(C_ALLGATHER, ncclInt32, -1, 65536 + 3, 0, 0);
    /* registered buffers: the peers' offers against the attacker's */
    char *plain_send = g_dsend, *plain_recv = g_drecv, *hs = NULL, *hr = NULL;
    size_t plain_bytes = g_bytes;
    void *rs = NULL, *rr = NULL;
    if (zc_bufs_register(bytes, &hs, &hr, &rs, &rr) != 0)
        return 1;
    uint64_t before = weft_zcopy_count(g_comm);
    run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, 1, 0, 0); /* a barrier: every offer sent */
    for (int round = 0; round < 3; round++) {
        run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, count, round == 1, 0);
        run_one(C_ALLGATHER, ncclInt32, -1, count, round == 2, 0);
        run_one(C_REDUCESCATTER, ncclFloat32, OP_MAX, count, 0, 0);
        usleep(20000); /* the attacker's next round lands in between */
    }
    uint64_t ran = weft_zcopy_count(g_comm) - before;
    if (ran != 9) {
        fprintf(stderr, "rank %d: FAIL stranger %s: %llu of 9 registered operations went direct\n",
                g_me, g_att_mode, (unsigned long long)ran);
        g_failed++;
    }
    if (!check(ncclCommDeregister(g_comm, rs), "ncclCommDeregister") ||
        !check(ncclCommDeregister(g_comm, rr), "ncclCommDeregister"))
        return 1;
    run_one(C_ALLREDUCE, ncclFloat32, OP_SUM, count, 0, 0);
    g_dsend = plain_send;
    g_drecv = plain_recv;
    g_bytes = plain_bytes < bytes ? plain_bytes : bytes;
    if (!check(ncclMemFree(hs), "ncclMemFree") || !check(ncclMemFree(hr), "ncclMemFree"))
        return 1;
    return 0;
}

/* After destroy: the attacker gone, its memory as it left it. */
static int att_finish(void)
{
    close(g_att_sock);
    g_att_sock = -1;
    int status = 0;
    waitpid(g_att_pid, &status, 0);
    unsigned char *p = mmap(NULL, ATT_MEM_BYTES, PROT_READ, MAP_SHARED, g_att_memfd, 0);
    if (p == MAP_FAILED)
        return 1;
    size_t changed = 0;
    for (size_t i = 0; i < ATT_MEM_BYTES; i++)
        changed += p[i] != ATT_PATTERN;
    munmap(p, ATT_MEM_BYTES);
    close(g_att_memfd);
    if (changed != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "rank %d: FAIL stranger %s: %zu bytes of the attacker's memory written "
                "(attacker status 0x%x)\n", g_me, g_att_mode, changed, status);
        return 1;
    }
    return 0;
}

/* Every listen() of the library passes here: with WEFT_TEST_SILENT_STRAY set, a connection that
 * never says anything is queued at the listener first (left open until the process exits). */
int listen(int fd, int backlog)
{
    int rc = (int)syscall(SYS_listen, fd, backlog);
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (rc != 0 || getenv("WEFT_TEST_SILENT_STRAY") == NULL ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return rc;
    if (ss.ss_family == AF_INET && ((struct sockaddr_in *)&ss)->sin_addr.s_addr == INADDR_ANY)
        ((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s >= 0 && connect(s, (struct sockaddr *)&ss, len) != 0)
        close(s); /* the listener is the library's: nothing to leak */
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: weftrun -n N %s sweep [-q] | split | zcopy | straddle | "
                "kill [-s|-z] | stranger MODE | visible own|alias|both | teardown\n", argv[0]);
        return 2;
    }
    g_quick = argc > 2 && strcmp(argv[2], "-q") == 0;
    g_sync = argc > 2 && strcmp(argv[2], "-s") == 0;
    g_zreg = argc > 2 && strcmp(argv[2], "-z") == 0;
    int local = 0, ndev = 0;
    ncclUniqueId id;
    if (strcmp(argv[1], "visible") == 0) { /* before CUDA starts: it reads the list once */
        g_visible = argc > 2 ? argv[2] : "own";
        if (!check(weftLaunchInfo(&g_me, &g_n, &local, &id), "weftLaunchInfo"))
            return 1;
        setenv("CUDA_VISIBLE_DEVICES", vis_list(g_me), 1);
    }
    cu = weft_cuda();
    if (cu->get_device_count(&ndev) != 0 || ndev < 1) {
        fprintf(stderr, "SKIP: no CUDA device (backend %s; WEFT_CUDA=emu:D emulates D)\n",
                cu->name);
        return 77;
    }
    if (g_visible == NULL && !check(weftLaunchInfo(&g_me, &g_n, &local, &id), "weftLaunchInfo"))
        return 1;
    if (strcmp(argv[1], "stranger") == 0) /* forked before any thread of the library starts */
        att_start(argc > 2 ? argv[2] : "garbage", &id);
    CU(cu->set_device(g_visible != NULL ? vis_ordinal(g_me) : local % ndev));
    CU(cu->stream_create((weft_cuda_stream_t *)&g_stream));
    double t_init = now_s();
    if (!check(ncclCommInitRank(&g_comm, g_n, id, g_me), "ncclCommInitRank"))
        return 1;
    t_init = now_s() - t_init;
    if (getenv("WEFT_TEST_SILENT_STRAY") != NULL && t_init >= 5.0) {
        fprintf(stderr, "rank %d: init took %.2f s with a silent stray at each listener\n", g_me,
                t_init);
        return 1;
    }
    double t0 = now_s();
    int rc = strcmp(argv[1], "kill") == 0    ? case_kill()
             : strcmp(argv[1], "split") == 0 ? case_split()
             : strcmp(argv[1], "zcopy") == 0 ? case_zcopy()
             : strcmp(argv[1], "straddle") == 0 ? case_straddle()
             : strcmp(argv[1], "stranger") == 0 ? case_stranger()
             : g_visible != NULL                  ? case_visible()
             : strcmp(argv[1], "teardown") == 0    ? case_teardown()
                                             : case_sweep();
    int teardown = strcmp(argv[1], "teardown") == 0;
    if (teardown && g_me != 0)
        usleep(500000); /* rank 0 leaves first */
    uint64_t busy0 = weft_emu_ipc_busy_frees();
    if (!check(ncclCommDestroy(g_comm), "ncclCommDestroy"))
        rc = 1;
    if (teardown && weft_emu_ipc_busy_frees() != busy0) {
        fprintf(stderr, "rank %d: FAIL teardown: the FIFO memory was freed while a peer still "
                "had it open (legacy IPC)\n", g_me);
        rc = 1;
    }
    if (g_att_sock >= 0 && att_finish() != 0)
        rc = 1;
    CU(cu->stream_destroy(g_stream));
    if (g_dsend != NULL) {
        CU(cu->free(g_dsend));
        CU(cu->free(g_drecv));
    }
    if (g_dscalar != NULL)
        CU(cu->free(g_dscalar));
    free(g_hsend);
    free(g_hrecv);
    fprintf(stderr, "rank %d of %d (device %d of %d): %s: %d passed, %d failed in %.2f s\n", g_me,
            g_n, local % ndev, ndev, argv[1], g_passed, g_failed, now_s() - t0);
    return rc != 0 || g_failed != 0 || g_passed == 0;
}
