/*
 * mpi_reduce_scatter_perf: MPI_Reduce_scatter_block.
 * In place, MPI_IN_PLACE leaves rank r's block at the start of the buffer, not at block r as
 * NCCL does: this tool's in-place geometry says so (recv_inplace_offset 0), and the result is
 * checked there.
 * The peer of reduce_scatter_perf: perf_coll_reduce_scatter (colls.c), MPI backend (mpi_common.h).
 */
#include "mpi_common.h"

static void mrs_counts(size_t bytes, size_t type_size, int nranks, struct perf_counts *c_p)
{
    perf_coll_reduce_scatter.get_counts(bytes, type_size, nranks, c_p);
    c_p->recv_inplace_offset = 0;
}

static ncclResult_t mrs_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    MPI_Datatype t = perf_mpi_type(op->type->type);
    int n;

    (void)ctx;
    if (perf_mpi_count(op->c.count, &n) != ncclSuccess)
        return ncclInvalidArgument;
    return perf_mpi_check(MPI_Reduce_scatter_block(op->in_place ? MPI_IN_PLACE : send, recv, n, t,
                                                   perf_mpi_op(op->op), MPI_COMM_WORLD),
                          "MPI_Reduce_scatter_block");
}

int main(int argc, char **argv)
{
    struct perf_coll coll = perf_coll_reduce_scatter;

    coll.get_counts = mrs_counts;
    return perf_mpi_main(argc, argv, &coll, mrs_run);
}
