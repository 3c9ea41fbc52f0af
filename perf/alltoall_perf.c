/*
 * alltoall_perf: ncclAlltoAll: block j (count elements) of each rank's buffer
 * goes to rank j. In place is timed only (#wrong N/A), as in nccl-tests.
 * Geometry, data and bandwidth: perf_coll_alltoall (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t a2a_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    return ncclAlltoAll(send, recv, op->c.count, op->type->type, ctx->comm, ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_alltoall, a2a_run);
}
