/*
 * mpi_broadcast_perf: MPI_Bcast. MPI has one buffer: out of place, the root broadcasts from
 * its send buffer and then copies it to its receive buffer (timed), as ncclBroadcast fills both.
 * The peer of broadcast_perf: perf_coll_broadcast (colls.c), MPI backend (mpi_common.h).
 */
#include <string.h>

#include "mpi_common.h"

static ncclResult_t mbc_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    MPI_Datatype t = perf_mpi_type(op->type->type);
    int root_oop = ctx->rank == op->root && !op->in_place;
    int n, rc;

    if (perf_mpi_count(op->c.count, &n) != ncclSuccess)
        return ncclInvalidArgument;
    rc = MPI_Bcast(root_oop ? (void *)send : recv, n, t, op->root, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS && root_oop && n > 0)
        memcpy(recv, send, op->c.count * op->type->size);
    return perf_mpi_check(rc, "MPI_Bcast");
}

int main(int argc, char **argv)
{
    return perf_mpi_main(argc, argv, &perf_coll_broadcast, mbc_run);
}
