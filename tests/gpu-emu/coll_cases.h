/*
 * The collectives the gpu-emu sweeps run (ranks as threads: test_coll.c; as processes:
 * test_coll_mp.c), what each rank contributes and what element i of rank r's output must be:
 * one definition, so both sweeps check the same thing. Uses tests/common/coll_ref.h.
 */
#ifndef WEFT_TESTS_GPU_EMU_COLL_CASES_H
#define WEFT_TESTS_GPU_EMU_COLL_CASES_H

#include <stddef.h>

#include "../common/coll_ref.h"

enum {
    C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_ALLTOALL, C_GATHER,
    C_SCATTER, C_SENDRECV, C_P2PALL, NCOLLS
};
static const char *coll_names[NCOLLS] = {"allreduce", "reduce",  "reducescatter",
                                         "allgather", "broadcast", "alltoall",
                                         "gather",    "scatter", "sendrecv",
                                         "p2p-all"};

/* Element i of what rank r of n contributes (reductions: op's values; others: OP_SUM's). */
static inline double coll_contrib(int coll, int t, int op, int r, size_t i, int n)
{
    return input_value(t, coll <= C_REDUCESCATTER ? op : OP_SUM, r, i, n);
}

/* Element i of rank r's output (count: elements per rank's block; sendrecv: from rank r - 1). */
static inline double coll_want(int coll, int t, int op, int r, int root, int n, size_t count,
                               size_t i)
{
    switch (coll) {
    case C_ALLREDUCE:
    case C_REDUCE: return expected_reduce(t, op, i, n);
    case C_REDUCESCATTER: return expected_reduce(t, op, (size_t)r * count + i, n);
    case C_ALLGATHER:
    case C_GATHER: return coll_contrib(coll, t, op, (int)(i / count), i % count, n);
    case C_BROADCAST: return coll_contrib(coll, t, op, root, i, n);
    case C_ALLTOALL:
    case C_P2PALL:
        return coll_contrib(coll, t, op, (int)(i / count), (size_t)r * count + i % count, n);
    case C_SCATTER: return coll_contrib(coll, t, op, root, (size_t)r * count + i, n);
    default: return coll_contrib(coll, t, op, (r + n - 1) % n, i, n);
    }
}

#endif
