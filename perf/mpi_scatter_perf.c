/*
 * mpi_scatter_perf: MPI_Scatter (in place: MPI_IN_PLACE as the root's receive buffer).
 * The peer of scatter_perf: perf_coll_scatter (colls.c), MPI backend (mpi_common.h).
 */
#include "mpi_common.h"

static ncclResult_t msc_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    MPI_Datatype t = perf_mpi_type(op->type->type);
    int in_place_root = op->in_place && ctx->rank == op->root;
    int n;

    if (perf_mpi_count(op->c.count, &n) != ncclSuccess)
        return ncclInvalidArgument;
    return perf_mpi_check(MPI_Scatter(send, n, t, in_place_root ? MPI_IN_PLACE : recv, n, t,
                                      op->root, MPI_COMM_WORLD),
                          "MPI_Scatter");
}

int main(int argc, char **argv)
{
    return perf_mpi_main(argc, argv, &perf_coll_scatter, msc_run);
}
