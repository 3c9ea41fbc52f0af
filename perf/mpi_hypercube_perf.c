/*
 * mpi_hypercube_perf: the all-gather of hypercube_perf by recursive doubling, each step
 * one MPI_Sendrecv with rank ^ mask (see hypercube_perf.c). n must be a power of two.
 * The peer of hypercube_perf: perf_coll_hypercube (colls.c), MPI backend (mpi_common.h).
 */
#include <string.h>

#include "mpi_common.h"

static ncclResult_t mhc_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    size_t block = op->c.count * op->type->size;
    MPI_Datatype t = perf_mpi_type(op->type->type);
    char *out = recv;
    int rc = MPI_SUCCESS, largest;

    /* The last step moves n/2 blocks. */
    if (perf_mpi_count(op->c.count * (size_t)(ctx->nranks / 2), &largest) != ncclSuccess)
        return ncclInvalidArgument;
    if (!op->in_place && block > 0)
        memcpy(out + (size_t)ctx->rank * block, send, block);
    for (int mask = 1; mask < ctx->nranks && rc == MPI_SUCCESS; mask <<= 1) {
        int peer = ctx->rank ^ mask;
        size_t mine = (size_t)(ctx->rank & ~(mask - 1)), theirs = (size_t)(peer & ~(mask - 1));
        int n = (int)(op->c.count * (size_t)mask);

        rc = MPI_Sendrecv(out + mine * block, n, t, peer, 0, out + theirs * block, n, t, peer, 0,
                          MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    return perf_mpi_check(rc, "MPI_Sendrecv");
}

int main(int argc, char **argv)
{
    return perf_mpi_main(argc, argv, &perf_coll_hypercube, mhc_run);
}
