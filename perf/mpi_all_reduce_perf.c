/*
 * mpi_all_reduce_perf: MPI_Allreduce (in place: MPI_IN_PLACE).
 * The peer of all_reduce_perf: perf_coll_all_reduce (colls.c), MPI backend (mpi_common.h).
 */
#include "mpi_common.h"

static ncclResult_t mar_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    MPI_Datatype t = perf_mpi_type(op->type->type);
    int n;

    (void)ctx;
    if (perf_mpi_count(op->c.count, &n) != ncclSuccess)
        return ncclInvalidArgument;
    return perf_mpi_check(MPI_Allreduce(op->in_place ? MPI_IN_PLACE : send, recv, n, t,
                                        perf_mpi_op(op->op), MPI_COMM_WORLD),
                          "MPI_Allreduce");
}

int main(int argc, char **argv)
{
    return perf_mpi_main(argc, argv, &perf_coll_all_reduce, mar_run);
}
