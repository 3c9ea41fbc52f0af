/*
 * mpi_all_gather_perf: MPI_Allgather (in place: MPI_IN_PLACE, own block already in place).
 * The peer of all_gather_perf: perf_coll_all_gather (colls.c), MPI backend (mpi_common.h).
 */
#include "mpi_common.h"

static ncclResult_t mag_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    MPI_Datatype t = perf_mpi_type(op->type->type);
    int n;

    (void)ctx;
    if (perf_mpi_count(op->c.count, &n) != ncclSuccess)
        return ncclInvalidArgument;
    return perf_mpi_check(MPI_Allgather(op->in_place ? MPI_IN_PLACE : send, n, t, recv, n, t,
                                        MPI_COMM_WORLD),
                          "MPI_Allgather");
}

int main(int argc, char **argv)
{
    return perf_mpi_main(argc, argv, &perf_coll_all_gather, mag_run);
}
