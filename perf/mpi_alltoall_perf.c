/*
 * mpi_alltoall_perf: MPI_Alltoall (in place: MPI_IN_PLACE).
 * The peer of alltoall_perf: perf_coll_alltoall (colls.c), MPI backend (mpi_common.h).
 */
#include "mpi_common.h"

static ncclResult_t ma2a_run(const struct perf_ctx *ctx, const struct perf_op *op,
                             const void *send, void *recv)
{
    MPI_Datatype t = perf_mpi_type(op->type->type);
    int n;

    (void)ctx;
    if (perf_mpi_count(op->c.count, &n) != ncclSuccess)
        return ncclInvalidArgument;
    if (op->in_place)
        return perf_mpi_check(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, t,
                                           MPI_COMM_WORLD),
                              "MPI_Alltoall");
    return perf_mpi_check(MPI_Alltoall(send, n, t, recv, n, t, MPI_COMM_WORLD), "MPI_Alltoall");
}

int main(int argc, char **argv)
{
    struct perf_coll coll = perf_coll_alltoall;

    /* MPI defines the in-place result (unlike NCCL): check it. */
    coll.flags &= ~PERF_COLL_INPLACE_UNCHECKED;
    return perf_mpi_main(argc, argv, &coll, ma2a_run);
}
