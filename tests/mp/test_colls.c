/*
 * Multi-process conformance: forks N ranks that talk over the shared-memory transport, runs every
 * collective x datatype x op x count x in/out-of-place, and checks every element against a plain
 * loop over what each rank contributed (every rank can regenerate every rank's input). The inputs
 * and the expected values, exact in every type so that any reduction order gives the same bits,
 * are those of tests/common/coll_ref.h (shared with tests/gpu-emu/test_coll.c).
 *
 * Usage: test_colls -n NRANKS [-l] [-t SECONDS]   (-l adds the large count 1M+3 on a subset)
 */
#include <errno.h>
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
#include "nccl.h"
#include "../common/id_pipe.h"
#include "../common/time_scale.h"
#include "redop.h"

#define NTYPES 12
#define MAX_FAIL_PRINT 20

enum { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, NCOLLS };
static const char *coll_names[NCOLLS] = {"allreduce", "reduce", "reducescatter", "allgather",
                                         "broadcast"};

struct shared_counts {
    int passed;
    int failed;
};

static int g_rank, g_nranks;
static struct shared_counts *g_counts;
static int g_printed;

static void fail(const char *what, int coll, int t, int op, size_t count, int inplace, size_t i,
                 double got, double want)
{
    if (g_printed++ < MAX_FAIL_PRINT)
        fprintf(stderr,
                "rank %d: FAIL %s %s type %d op %s count %zu %s index %zu: got %.17g want %.17g\n",
                g_rank, what, coll_names[coll], t, op_name(op), count,
                inplace ? "in-place" : "out-of-place", i, got, want);
}

static void count_result(int ok)
{
    __atomic_fetch_add(ok ? &g_counts->passed : &g_counts->failed, 1, __ATOMIC_RELAXED);
}

static int check(ncclResult_t res, const char *what)
{
    if (res != ncclSuccess) {
        fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, what, ncclGetErrorString(res),
                ncclGetLastError(NULL));
        return 0;
    }
    return 1;
}

static ncclRedOp_t make_op(ncclComm_t comm, int t, int op, void *scalar_store)
{
    if (op != OP_PREMUL)
        return builtin_op(op);
    ncclRedOp_t o;
    store(t, scalar_store, 0, premul_scalar(g_rank));
    if (!check(ncclRedOpCreatePreMulSum(&o, scalar_store, (ncclDataType_t)t,
                                        ncclScalarHostImmediate, comm),
               "ncclRedOpCreatePreMulSum"))
        return ncclSum;
    return o;
}

/* Runs one collective configuration and checks it. */
static void run_one(ncclComm_t comm, int coll, int t, int op, size_t count, int inplace, int root)
{
    int n = g_nranks, r = g_rank;
    size_t es = weft_dtype_size(t);
    size_t in_elems = count, out_elems = count;
    if (coll == C_ALLGATHER)
        out_elems = count * n;
    if (coll == C_REDUCESCATTER)
        in_elems = count * n;
    size_t alloc = (in_elems > out_elems ? in_elems : out_elems) + 1;
    char *recv = malloc(alloc * es), *send = malloc(alloc * es);
    if (recv == NULL || send == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", r);
        count_result(0);
        free(recv);
        free(send);
        return;
    }
    memset(recv, 0x5a, alloc * es);
    /* Where this rank's input lives. */
    char *in = send, *out = recv;
    if (inplace) {
        in = recv;
        if (coll == C_ALLGATHER)
            in = recv + (size_t)r * count * es;
        if (coll == C_REDUCESCATTER)
            out = recv + (size_t)r * count * es;
    }
    int reducing = coll <= C_REDUCESCATTER;
    uint64_t seed_t = (uint64_t)t * 1315423911u;
    for (size_t i = 0; i < in_elems; i++) {
        if (reducing)
            store(t, in, i, input_value(t, op, r, i, n));
        else
            for (size_t b = 0; b < es; b++)
                in[i * es + b] = (char)mix(seed_t ^ ((uint64_t)r << 48) ^ (i * es + b));
    }
    unsigned char scalar[8];
    ncclRedOp_t rop = reducing ? make_op(comm, t, op, scalar) : ncclSum;
    ncclResult_t res = ncclSuccess;
    switch (coll) {
    case C_ALLREDUCE: res = ncclAllReduce(in, out, count, t, rop, comm, NULL); break;
    case C_REDUCE: res = ncclReduce(in, out, count, t, rop, root, comm, NULL); break;
    case C_REDUCESCATTER: res = ncclReduceScatter(in, out, count, t, rop, comm, NULL); break;
    case C_ALLGATHER: res = ncclAllGather(in, out, count, t, comm, NULL); break;
    case C_BROADCAST: res = ncclBroadcast(in, out, count, t, root, comm, NULL); break;
    }
    if (reducing && op == OP_PREMUL)
        ncclRedOpDestroy(rop, comm);
    int ok = check(res, coll_names[coll]);
    if (ok) {
        if (coll == C_ALLGATHER) {
            for (size_t i = 0; i < out_elems && ok; i++) {
                int src = (int)(i / count);
                size_t j = i % count;
                for (size_t b = 0; b < es; b++) {
                    char want = (char)mix(seed_t ^ ((uint64_t)src << 48) ^ (j * es + b));
                    if (out[i * es + b] != want) {
                        fail("data", coll, t, op, count, inplace, i, out[i * es + b], want);
                        ok = 0;
                        break;
                    }
                }
            }
        } else if (coll == C_BROADCAST) {
            for (size_t i = 0; i < count * es && ok; i++) {
                char want = (char)mix(seed_t ^ ((uint64_t)root << 48) ^ i);
                if (out[i] != want) {
                    fail("data", coll, t, op, count, inplace, i / es, out[i], want);
                    ok = 0;
                }
            }
        } else if (coll != C_REDUCE || r == root) {
            size_t base = coll == C_REDUCESCATTER ? (size_t)r * count : 0;
            for (size_t i = 0; i < count && ok; i++) {
                double want = round_to(t, expected_reduce(t, op, base + i, n));
                unsigned char wbits[8];
                store(t, wbits, 0, want);
                if (memcmp(out + i * es, wbits, es) != 0) {
                    fail("data", coll, t, op, count, inplace, i, load(t, out, i), want);
                    ok = 0;
                }
            }
        }
        /* Nothing past the output may be written. */
        if (!inplace && (coll != C_REDUCE || r == root)) {
            size_t end = out_elems * es;
            for (size_t b = 0; b < es && ok; b++)
                if ((unsigned char)recv[end + b] != 0x5a) {
                    fail("overrun", coll, t, op, count, inplace, out_elems, recv[end + b], 0x5a);
                    ok = 0;
                }
        }
    }
    count_result(ok);
    free(recv);
    free(send);
}

/* Bad arguments fail cleanly and leave the communicator usable. */
static void run_bad_args(ncclComm_t comm)
{
    float buf[4] = {0};
    struct {
        ncclResult_t got;
        const char *what;
    } cases[] = {
        {ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, NULL, NULL), "null comm"},
        {ncclAllReduce(NULL, buf, 4, ncclFloat, ncclSum, comm, NULL), "null sendbuff"},
        {ncclAllReduce(buf, NULL, 4, ncclFloat, ncclSum, comm, NULL), "null recvbuff"},
        {ncclAllReduce(buf, buf, 4, (ncclDataType_t)99, ncclSum, comm, NULL), "bad datatype"},
        {ncclAllReduce(buf, buf, 4, ncclFloat, (ncclRedOp_t)77, comm, NULL), "bad op"},
        {ncclBroadcast(buf, buf, 4, ncclFloat, g_nranks, comm, NULL), "root >= nranks"},
        {ncclReduce(buf, buf, 4, ncclFloat, ncclSum, -1, comm, NULL), "root < 0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int ok = cases[i].got == ncclInvalidArgument && ncclGetLastError(NULL)[0] != '\0';
        if (!ok)
            fprintf(stderr, "rank %d: FAIL bad argument '%s' returned %d\n", g_rank,
                    cases[i].what, cases[i].got);
        count_result(ok);
    }
    ncclComm_t c2;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    count_result(ncclCommInitRank(&c2, g_nranks, id, g_nranks) == ncclInvalidArgument);
    count_result(ncclCommInitRank(&c2, 0, id, 0) == ncclInvalidArgument);
    count_result(ncclGroupEnd() == ncclInvalidUsage);
}

static int rank_main(ncclUniqueId id, int large)
{
    ncclComm_t comm;
    if (!check(ncclCommInitRank(&comm, g_nranks, id, g_rank), "ncclCommInitRank"))
        return 1;
    int nr = -1, me = -1;
    count_result(ncclCommCount(comm, &nr) == ncclSuccess && nr == g_nranks &&
                 ncclCommUserRank(comm, &me) == ncclSuccess && me == g_rank);
    run_bad_args(comm);
    static const size_t counts[] = {0, 1, 7, 1023};
    for (int coll = 0; coll < NCOLLS; coll++) {
        int reducing = coll <= C_REDUCESCATTER;
        for (int t = 0; t < NTYPES; t++) {
            for (int op = 0; op < (reducing ? NOPS : 1); op++) {
                for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                    for (int inplace = 0; inplace < 2; inplace++) {
                        int root = (int)((ci + (size_t)t) % (size_t)g_nranks);
                        run_one(comm, coll, t, reducing ? op : -1, counts[ci], inplace, root);
                    }
                }
            }
        }
    }
    if (large) {
        /* 1M+3 elements on a subset that still covers each type size and each op kind. */
        static const int big[][2] = {{ncclFloat32, OP_SUM},   {ncclInt32, OP_MAX},
                                     {ncclBfloat16, OP_SUM},  {ncclInt8, OP_PROD},
                                     {ncclFloat64, OP_AVG},   {ncclFloat16, OP_PREMUL},
                                     {ncclUint8, OP_MIN},     {ncclInt64, OP_AVG},
                                     {ncclFloat8e4m3, OP_MAX}};
        size_t count = 1048576 + 3;
        for (int coll = 0; coll < NCOLLS; coll++)
            for (size_t k = 0; k < sizeof(big) / sizeof(big[0]); k++)
                for (int inplace = 0; inplace < 2; inplace++)
                    run_one(comm, coll, big[k][0], coll <= C_REDUCESCATTER ? big[k][1] : -1,
                            coll == C_ALLGATHER || coll == C_REDUCESCATTER ? count / g_nranks + 1
                                                                           : count,
                            inplace, (int)(k % (size_t)g_nranks));
    }
    /* Still usable after all of that, and after the bad calls: one more checked all-reduce. */
    run_one(comm, C_ALLREDUCE, ncclFloat32, OP_SUM, 4096, 0, 0);
    if (!check(ncclCommFinalize(comm), "ncclCommFinalize") ||
        !check(ncclCommDestroy(comm), "ncclCommDestroy"))
        return 1;
    return g_printed > 0;
}

int main(int argc, char **argv)
{
    int nranks = 2, large = 0, timeout = 120, opt;
    while ((opt = getopt(argc, argv, "n:lt:")) != -1) {
        switch (opt) {
        case 'n': nranks = atoi(optarg); break;
        case 'l': large = 1; break;
        case 't': timeout = atoi(optarg); break;
        default: fprintf(stderr, "usage: %s -n NRANKS [-l] [-t SECONDS]\n", argv[0]); return 2;
        }
    }
    g_nranks = nranks;
    g_counts = mmap(NULL, sizeof(*g_counts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (g_counts == MAP_FAILED)
        return 1;
    ncclUniqueId id;
    struct weft_test_id_pipe ip;
    if (weft_test_id_pipe_open(&ip) != 0)
        return 1;
    fflush(NULL);
    pid_t *pids = calloc((size_t)nranks, sizeof(pid_t));
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            g_rank = r;
            alarm(weft_test_scaled((unsigned)timeout));
            _exit(weft_test_id_pipe_recv(&ip, &id) != 0 ? 3 : rank_main(id, large));
        }
    }
    weft_test_id_pipe_send(&ip, nranks, &id);
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rank %d %s %d\n", r, WIFSIGNALED(status) ? "killed by signal" : "exited with",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            bad++;
            for (int k = 0; k < nranks; k++)
                kill(pids[k], SIGKILL);
        }
    }
    printf("%d passed, %d failed\n", g_counts->passed, g_counts->failed + bad);
    return (g_counts->failed + bad) ? 1 : 0;
}
