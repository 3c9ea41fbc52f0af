/*
 * mpi_sendrecv_perf: MPI_Sendrecv around a ring: send count elements to rank+1, receive
 * from rank-1 (in place: MPI_Sendrecv_replace).
 * The peer of sendrecv_perf: perf_coll_sendrecv (colls.c), MPI backend (mpi_common.h).
 */
#include "mpi_common.h"

static ncclResult_t msr_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    MPI_Datatype t = perf_mpi_type(op->type->type);
    int next = (ctx->rank + 1) % ctx->nranks;
    int prev = (ctx->rank + ctx->nranks - 1) % ctx->nranks;
    int n;

    if (perf_mpi_count(op->c.count, &n) != ncclSuccess)
        return ncclInvalidArgument;
    if (op->in_place)
        return perf_mpi_check(MPI_Sendrecv_replace(recv, n, t, next, 0, prev, 0, MPI_COMM_WORLD,
                                                   MPI_STATUS_IGNORE),
                              "MPI_Sendrecv_replace");
    return perf_mpi_check(MPI_Sendrecv(send, n, t, next, 0, recv, n, t, prev, 0, MPI_COMM_WORLD,
                                       MPI_STATUS_IGNORE),
                          "MPI_Sendrecv");
}

int main(int argc, char **argv)
{
    struct perf_coll coll = perf_coll_sendrecv;

    /* MPI defines the in-place result (unlike NCCL): check it. */
    coll.flags &= ~PERF_COLL_INPLACE_UNCHECKED;
    return perf_mpi_main(argc, argv, &coll, msr_run);
}
