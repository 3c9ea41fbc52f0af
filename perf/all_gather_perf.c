/*
 * all_gather_perf: ncclAllGather: count elements per rank, gathered in rank order.
 * Geometry, data and bandwidth: perf_coll_all_gather (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t ag_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    return ncclAllGather(send, recv, op->c.count, op->type->type, ctx->comm, ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_all_gather, ag_run);
}
