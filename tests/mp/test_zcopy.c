/*
 * Zero-copy collectives on registered host buffers (exec/zcopy.h): all-reduce, all-gather and
 * reduce-scatter x every datatype x every op x in/out of place on ranks that read and write each
 * other's ncclMemAlloc buffers, each element checked against a plain loop over what every rank
 * contributed (tests/common/coll_ref.h: exact values, so the reduction order does not matter),
 * and whether the operation really ran zero-copy (weft_zcopy_count) or fell back as it must.
 *
 * Usage: test_zcopy -n NRANKS -c CASE [-t SECONDS]
 *   reg      every rank registers its ncclMemAlloc buffers: every operation runs zero-copy
 *   sub      buffers inside larger ncclMemAlloc blocks, at an offset, only they registered
 *   mixed    rank 0's buffers come from malloc, unregistered: every rank falls back, still right,
 *            except all-gather: the others read rank 0's input with process_vm_readv
 *            (weft_zcopy_cma_count; with WEFT_CMA=0 it falls back too)
 *   dereg    registered, then deregistered before use: falls back (all-gather: as mixed)
 *   threads  ranks as threads of one process (ncclCommInitAll), malloc buffers registered
 *   kill     rank 1 is killed as it issues a zero-copy all-reduce: the others fail naming it
 *   mismatch rank 0 all-reduces another count: every rank fails, none crashes
 * WEFT_ZCOPY_MIN_BYTES is set to 4096 so that small counts keep the test fast; WEFT_CMA to 1 unless
 * the environment sets it.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/coll_ref.h"
#include "../common/elem.h"
#include "../common/id_pipe.h"
#include "../common/time_scale.h"
#include "mp_test.h"
#include "core/comm.h"
#include "exec/zcopy.h"
#include "nccl.h"
#include "redop.h"

#define NTYPES 12
#define MAX_RANKS 8

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCESCATTER, NCOLLS };
static const char *coll_names[NCOLLS] = {"allreduce", "allgather", "reducescatter"};

struct shared_counts {
    int passed;
    int failed;
};

static struct shared_counts *g_counts;
static const char *g_case;
static int g_nranks, g_printed;

static int check(ncclResult_t res, int rank, const char *what)
{
    if (res != ncclSuccess) {
        fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, what, ncclGetErrorString(res),
                ncclGetLastError(NULL));
        return 0;
    }
    return 1;
}

static void result(int ok)
{
    __atomic_fetch_add(ok ? &g_counts->passed : &g_counts->failed, 1, __ATOMIC_RELAXED);
}

/* One rank's buffers: big enough for the largest case, allocated once. */
struct rank_bufs {
    ncclComm_t comm;
    int rank;
    char *send, *recv;          /* the operation's buffers */
    void *send_alloc, *recv_alloc;
    void *send_reg, *recv_reg;  /* registration handles, NULL when not registered */
    unsigned char scalar[8];
    ncclRedOp_t op;
};

static const size_t g_counts_run[] = {4099, 40003};
#define MAX_COUNT 40003

static size_t buf_bytes(void)
{
    return (size_t)MAX_COUNT * 8 * (size_t)g_nranks + 64;
}

static int bufs_setup(struct rank_bufs *b, int use_memalloc, int reg, size_t offset)
{
    size_t bytes = buf_bytes() + offset;
    if (use_memalloc) {
        if (!check(ncclMemAlloc(&b->send_alloc, bytes), b->rank, "ncclMemAlloc") ||
            !check(ncclMemAlloc(&b->recv_alloc, bytes), b->rank, "ncclMemAlloc"))
            return 0;
    } else {
        b->send_alloc = malloc(bytes);
        b->recv_alloc = malloc(bytes);
        if (b->send_alloc == NULL || b->recv_alloc == NULL)
            return 0;
    }
    b->send = (char *)b->send_alloc + offset;
    b->recv = (char *)b->recv_alloc + offset;
    b->send_reg = b->recv_reg = NULL;
    if (reg && (!check(ncclCommRegister(b->comm, b->send, buf_bytes(), &b->send_reg), b->rank,
                       "ncclCommRegister") ||
                !check(ncclCommRegister(b->comm, b->recv, buf_bytes(), &b->recv_reg), b->rank,
                       "ncclCommRegister")))
        return 0;
    return 1;
}

static void bufs_free(struct rank_bufs *b, int use_memalloc)
{
    if (b->send_reg != NULL)
        check(ncclCommDeregister(b->comm, b->send_reg), b->rank, "ncclCommDeregister");
    if (b->recv_reg != NULL)
        check(ncclCommDeregister(b->comm, b->recv_reg), b->rank, "ncclCommDeregister");
    if (use_memalloc) {
        ncclMemFree(b->send_alloc);
        ncclMemFree(b->recv_alloc);
    } else {
        free(b->send_alloc);
        free(b->recv_alloc);
    }
}

/* Where rank r's input and output lie for this case. */
static void op_ptrs(const struct rank_bufs *b, int coll, size_t count, size_t es, int inplace,
                    char **in_p, char **out_p)
{
    *in_p = b->send;
    *out_p = b->recv;
    if (inplace) {
        *in_p = b->recv;
        if (coll == C_ALLGATHER)
            *in_p = b->recv + (size_t)b->rank * count * es;
        if (coll == C_REDUCESCATTER)
            *out_p = b->recv + (size_t)b->rank * count * es;
    }
}

static void fill(struct rank_bufs *b, int coll, int t, int op, size_t count, int inplace)
{
    size_t es = weft_dtype_size(t), n = (size_t)g_nranks;
    char *in, *out;
    memset(b->recv, 0x5a, buf_bytes());
    op_ptrs(b, coll, count, es, inplace, &in, &out);
    size_t in_elems = coll == C_REDUCESCATTER ? count * n : count;
    for (size_t i = 0; i < in_elems; i++) {
        if (coll != C_ALLGATHER)
            store(t, in, i, input_value(t, op, b->rank, i, g_nranks));
        else
            for (size_t k = 0; k < es; k++)
                in[i * es + k] = (char)mix(((uint64_t)b->rank << 48) ^ (i * es + k));
    }
    b->op = ncclSum;
    if (coll != C_ALLGATHER) {
        if (op == OP_PREMUL) {
            store(t, b->scalar, 0, premul_scalar(b->rank));
            check(ncclRedOpCreatePreMulSum(&b->op, b->scalar, (ncclDataType_t)t,
                                           ncclScalarHostImmediate, b->comm),
                  b->rank, "ncclRedOpCreatePreMulSum");
        } else {
            b->op = builtin_op(op);
        }
    }
}

static ncclResult_t issue(struct rank_bufs *b, int coll, int t, size_t count, int inplace)
{
    char *in, *out;
    op_ptrs(b, coll, count, weft_dtype_size(t), inplace, &in, &out);
    switch (coll) {
    case C_ALLREDUCE: return ncclAllReduce(in, out, count, t, b->op, b->comm, NULL);
    case C_ALLGATHER: return ncclAllGather(in, out, count, t, b->comm, NULL);
    default: return ncclReduceScatter(in, out, count, t, b->op, b->comm, NULL);
    }
}

static int verify(struct rank_bufs *b, int coll, int t, int op, size_t count, int inplace)
{
    size_t es = weft_dtype_size(t), n = (size_t)g_nranks;
    char *in, *out;
    op_ptrs(b, coll, count, es, inplace, &in, &out);
    if (coll != C_ALLGATHER && op == OP_PREMUL)
        ncclRedOpDestroy(b->op, b->comm);
    size_t out_elems = coll == C_ALLGATHER ? count * n : count;
    for (size_t i = 0; i < out_elems; i++) {
        if (coll == C_ALLGATHER) {
            size_t src = i / count, j = i % count;
            for (size_t k = 0; k < es; k++) {
                char want = (char)mix(((uint64_t)src << 48) ^ (j * es + k));
                if (out[i * es + k] != want)
                    goto bad;
            }
            continue;
        }
        size_t base = coll == C_REDUCESCATTER ? (size_t)b->rank * count : 0;
        unsigned char wbits[8];
        store(t, wbits, 0, round_to(t, expected_reduce(t, op, base + i, g_nranks)));
        if (memcmp(out + i * es, wbits, es) != 0)
            goto bad;
        continue;
    bad:
        if (g_printed++ < 20)
            fprintf(stderr, "rank %d: FAIL %s %s type %d op %s count %zu %s: element %zu\n",
                    b->rank, g_case, coll_names[coll], t, op_name(op), count,
                    inplace ? "in place" : "out of place", i);
        return 0;
    }
    /* Nothing past the output is written. */
    if (!inplace)
        for (size_t k = out_elems * es; k < out_elems * es + 64; k++)
            if ((unsigned char)b->recv[k] != 0x5a) {
                if (g_printed++ < 20)
                    fprintf(stderr, "rank %d: FAIL %s %s overrun\n", b->rank, g_case,
                            coll_names[coll]);
                return 0;
            }
    return 1;
}

/*
 * Every case over the nlocal ranks of this process (1, or all of them as threads: then each call
 * is a group over them). want_zcopy: every operation must have run zero-copy, or none;
 * want_cma: every all-gather must have read unregistered inputs (process_vm_readv), or none.
 */
static void run_all(struct rank_bufs *bufs, int nlocal, int want_zcopy, int want_cma)
{
    for (int coll = 0; coll < NCOLLS; coll++)
        for (int t = 0; t < NTYPES; t++)
            for (int op = 0; op < (coll == C_ALLGATHER ? 1 : NOPS); op++)
                for (size_t ci = 0; ci < 2; ci++)
                    for (int inplace = 0; inplace < 2; inplace++) {
                        /* the large count on a few types (every element size) only */
                        if (ci == 1 && t != ncclFloat32 && t != ncclBfloat16 && t != ncclInt8 &&
                            t != ncclFloat64)
                            continue;
                        size_t count = g_counts_run[ci];
                        int aop = coll == C_ALLGATHER ? -1 : op;
                        uint64_t before[MAX_RANKS], before_cma[MAX_RANKS];
                        int cma = want_cma && coll == C_ALLGATHER;
                        for (int i = 0; i < nlocal; i++) {
                            fill(&bufs[i], coll, t, aop, count, inplace);
                            before[i] = weft_zcopy_count(bufs[i].comm);
                            before_cma[i] = weft_zcopy_cma_count(bufs[i].comm);
                        }
                        ncclResult_t res = ncclSuccess;
                        if (nlocal > 1)
                            ncclGroupStart();
                        for (int i = 0; i < nlocal && res == ncclSuccess; i++)
                            res = issue(&bufs[i], coll, t, count, inplace);
                        if (nlocal > 1 && res == ncclSuccess)
                            res = ncclGroupEnd();
                        for (int i = 0; i < nlocal; i++) {
                            int ok = check(res, bufs[i].rank, coll_names[coll]) &&
                                     verify(&bufs[i], coll, t, aop, count, inplace);
                            uint64_t ran = weft_zcopy_count(bufs[i].comm) - before[i];
                            uint64_t ran_cma =
                                weft_zcopy_cma_count(bufs[i].comm) - before_cma[i];
                            if (ok && ran_cma != (uint64_t)cma) {
                                if (g_printed++ < 20)
                                    fprintf(stderr, "rank %d: FAIL %s %s type %d: %s\n",
                                            bufs[i].rank, g_case, coll_names[coll], t,
                                            cma ? "did not read the inputs with process_vm_readv"
                                                : "read inputs with process_vm_readv");
                                ok = 0;
                            }
                            if (ok && ran != (uint64_t)(want_zcopy && !cma)) {
                                if (g_printed++ < 20)
                                    fprintf(stderr, "rank %d: FAIL %s %s type %d: %s\n",
                                            bufs[i].rank, g_case, coll_names[coll], t,
                                            want_zcopy ? "did not run zero-copy"
                                                       : "ran zero-copy, but must fall back");
                                ok = 0;
                            }
                            result(ok);
                        }
                    }
}

static int rank_main(int rank, ncclUniqueId id)
{
    struct rank_bufs b = {.rank = rank};
    if (!check(ncclCommInitRank(&b.comm, g_nranks, id, rank), rank, "ncclCommInitRank"))
        return 1;
    int memalloc = strcmp(g_case, "mixed") != 0 || rank != 0;
    int reg = memalloc;
    size_t offset = strcmp(g_case, "sub") == 0 ? 4096 + 64 * (size_t)rank : 0;
    if (!bufs_setup(&b, memalloc, reg, offset))
        return 1;
    if (strcmp(g_case, "sub") == 0) {
        /* A registration that does not cover the buffer does not count: register only the
         * operation's range again over a larger one below, checked to fall back first. */
        check(ncclCommDeregister(b.comm, b.send_reg), rank, "ncclCommDeregister");
        check(ncclCommRegister(b.comm, b.send, 100, &b.send_reg), rank, "ncclCommRegister");
        fill(&b, C_ALLREDUCE, ncclFloat32, OP_SUM, 4099, 0);
        uint64_t before = weft_zcopy_count(b.comm);
        result(check(issue(&b, C_ALLREDUCE, ncclFloat32, 4099, 0), rank, "allreduce") &&
               verify(&b, C_ALLREDUCE, ncclFloat32, OP_SUM, 4099, 0) &&
               weft_zcopy_count(b.comm) == before);
        check(ncclCommDeregister(b.comm, b.send_reg), rank, "ncclCommDeregister");
        check(ncclCommRegister(b.comm, b.send, buf_bytes(), &b.send_reg), rank,
              "ncclCommRegister");
    }
    if (strcmp(g_case, "dereg") == 0) {
        void *old = b.send_reg;
        check(ncclCommDeregister(b.comm, b.send_reg), rank, "ncclCommDeregister");
        check(ncclCommDeregister(b.comm, b.recv_reg), rank, "ncclCommDeregister");
        b.send_reg = b.recv_reg = NULL;
        /* the same handle twice, and a handle of nobody: refused with a message */
        result(ncclCommDeregister(b.comm, old) == ncclInvalidArgument &&
               ncclCommDeregister(b.comm, &b) == ncclInvalidArgument &&
               strstr(ncclGetLastError(b.comm), "not a registration handle") != NULL);
    }
    if (strcmp(g_case, "mismatch") == 0) {
        /* rank 0 all-reduces one element more: every rank fails (the exchange carries the
         * signature; and a peer that called something else gets a no vote), none reads past a
         * peer's buffer */
        size_t count = 5000 + (rank == 0);
        fill(&b, C_ALLREDUCE, ncclFloat32, OP_SUM, count, 0);
        ncclResult_t res = issue(&b, C_ALLREDUCE, ncclFloat32, count, 0);
        int ok = res != ncclSuccess && ncclGetLastError(b.comm)[0] != '\0';
        if (!ok)
            fprintf(stderr, "rank %d: FAIL mismatch: result %d\n", rank, res);
        result(ok);
        ncclCommAbort(b.comm);
        return !ok;
    }
    if (strcmp(g_case, "kill") == 0) {
        /* rank 1 dies as it issues its first operation (WEFT_FAULT, set by main) */
        fill(&b, C_ALLREDUCE, ncclFloat32, OP_SUM, 40003, 0);
        ncclResult_t res = issue(&b, C_ALLREDUCE, ncclFloat32, 40003, 0);
        const char *msg = ncclGetLastError(b.comm);
        int ok = res != ncclSuccess && strstr(msg, "peer 1") != NULL;
        if (!ok)
            fprintf(stderr, "rank %d: FAIL kill: result %d, message '%s'\n", rank, res, msg);
        result(ok);
        ncclCommAbort(b.comm);
        return !ok;
    }
    int want = strcmp(g_case, "reg") == 0 || strcmp(g_case, "sub") == 0;
    int want_cma = !want && strcmp(getenv("WEFT_CMA"), "0") != 0;
    run_all(&b, 1, want, want_cma);
    if (want) {
        /* Two zero-copy all-reduces of one group, in place on either buffer: they run in issue
         * order on the same connections, both right. */
        size_t count = 5000;
        for (size_t i = 0; i < count; i++) {
            store(ncclInt32, b.send, i, input_value(ncclInt32, OP_SUM, rank, i, g_nranks));
            store(ncclInt32, b.recv, i, input_value(ncclInt32, OP_MAX, rank, i, g_nranks));
        }
        uint64_t before = weft_zcopy_count(b.comm);
        ncclGroupStart();
        ncclAllReduce(b.send, b.send, count, ncclInt32, ncclSum, b.comm, NULL);
        ncclAllReduce(b.recv, b.recv, count, ncclInt32, ncclMax, b.comm, NULL);
        int ok = check(ncclGroupEnd(), rank, "group of two all-reduces") &&
                 weft_zcopy_count(b.comm) == before + 2;
        for (size_t i = 0; i < count && ok; i++)
            ok = load(ncclInt32, b.send, i) == expected_reduce(ncclInt32, OP_SUM, i, g_nranks) &&
                 load(ncclInt32, b.recv, i) == expected_reduce(ncclInt32, OP_MAX, i, g_nranks);
        if (!ok)
            fprintf(stderr, "rank %d: FAIL group of two zero-copy all-reduces\n", rank);
        result(ok);

        /* A zero-copy all-reduce in one group with three small ones that fusion packs: the
         * fusion agreement adds lanes as the group goes on (the executor's lane array moves),
         * while the zero-copy task's lanes wait for their controller. */
        size_t small = 300;
        for (size_t i = 0; i < count; i++)
            store(ncclInt32, b.send, i, input_value(ncclInt32, OP_SUM, rank, i, g_nranks));
        for (size_t i = 0; i < 3 * small; i++)
            store(ncclInt32, b.recv, i, input_value(ncclInt32, OP_MAX, rank, i, g_nranks));
        before = weft_zcopy_count(b.comm);
        ncclGroupStart();
        ncclAllReduce(b.send, b.send, count, ncclInt32, ncclSum, b.comm, NULL);
        for (size_t k = 0; k < 3; k++) {
            int32_t *part = (int32_t *)b.recv + k * small;
            ncclAllReduce(part, part, small, ncclInt32, ncclMax, b.comm, NULL);
        }
        ok = check(ncclGroupEnd(), rank, "group of a zero-copy and three fused all-reduces") &&
             weft_zcopy_count(b.comm) == before + 1;
        for (size_t i = 0; i < count && ok; i++)
            ok = load(ncclInt32, b.send, i) == expected_reduce(ncclInt32, OP_SUM, i, g_nranks);
        for (size_t i = 0; i < 3 * small && ok; i++)
            ok = load(ncclInt32, b.recv, i) == expected_reduce(ncclInt32, OP_MAX, i, g_nranks);
        if (!ok)
            fprintf(stderr, "rank %d: FAIL group of a zero-copy and three fused all-reduces\n",
                    rank);
        result(ok);
    }
    bufs_free(&b, memalloc);
    if (!check(ncclCommDestroy(b.comm), rank, "ncclCommDestroy"))
        return 1;
    return g_printed > 0;
}

static int threads_main(void)
{
    ncclComm_t comms[MAX_RANKS];
    struct rank_bufs bufs[MAX_RANKS];
    if (!check(ncclCommInitAll(comms, g_nranks, NULL), 0, "ncclCommInitAll"))
        return 1;
    for (int r = 0; r < g_nranks; r++) {
        bufs[r] = (struct rank_bufs){.comm = comms[r], .rank = r};
        if (!bufs_setup(&bufs[r], 0, 1, 0))
            return 1;
    }
    run_all(bufs, g_nranks, 1, 0);
    for (int r = 0; r < g_nranks; r++) {
        bufs_free(&bufs[r], 0);
        check(ncclCommDestroy(comms[r]), r, "ncclCommDestroy");
    }
    return g_printed > 0;
}

/* The ranks are forked before the id exists (ThreadSanitizer: tests/common/id_pipe.h). */
static struct weft_test_id_pipe g_ip;

static int zcopy_rank(int r, void *arg)
{
    (void)arg;
    ncclUniqueId id;
    return weft_test_id_pipe_recv(&g_ip, &id) != 0 ? 3 : rank_main(r, id);
}

int main(int argc, char **argv)
{
    int timeout = 120, opt;
    g_nranks = 2;
    g_case = "reg";
    while ((opt = getopt(argc, argv, "n:c:t:")) != -1) {
        switch (opt) {
        case 'n': g_nranks = atoi(optarg); break;
        case 'c': g_case = optarg; break;
        case 't': timeout = atoi(optarg); break;
        default: fprintf(stderr, "usage: %s -n NRANKS -c CASE [-t SECONDS]\n", argv[0]); return 2;
        }
    }
    if (g_nranks < 2 || g_nranks > MAX_RANKS) {
        fprintf(stderr, "test_zcopy: -n must be in [2, %d]\n", MAX_RANKS);
        return 2;
    }
    setenv("WEFT_ZCOPY_MIN_BYTES", "4096", 1);
    /* Reach unregistered buffers of peer processes unless told not to (by default whether
     * process_vm_readv pays is measured, core/cma.h: the answer depends on the machine). */
    setenv("WEFT_CMA", "1", 0);
    g_counts = mmap(NULL, sizeof(*g_counts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (g_counts == MAP_FAILED)
        return 1;
    if (strcmp(g_case, "threads") == 0) {
        alarm(weft_test_scaled((unsigned)timeout));
        int rc = threads_main();
        printf("%d passed, %d failed\n", g_counts->passed, g_counts->failed);
        return rc || g_counts->failed ? 1 : 0;
    }
    if (strcmp(g_case, "kill") == 0)
        setenv("WEFT_FAULT", "kill:op=1:rank=1", 1);
    if (weft_test_id_pipe_open(&g_ip) != 0)
        return 1;
    pid_t pids[MAX_RANKS];
    int bad = mp_fork_ranks(g_nranks, weft_test_scaled((unsigned)timeout), zcopy_rank, NULL,
                            pids) != 0;
    ncclUniqueId id;
    if (!bad)
        weft_test_id_pipe_send(&g_ip, g_nranks, &id);
    for (int r = 0; r < g_nranks; r++)
        bad += !mp_wait_rank(pids[r], r, strcmp(g_case, "kill") == 0 && r == 1);
    printf("%d passed, %d failed\n", g_counts->passed, g_counts->failed + bad);
    return g_counts->failed + bad || g_counts->passed == 0 ? 1 : 0;
}
