/*
 * gather_perf: ncclGather: count elements from every rank into block `rank` of the
 * root's buffer (-r root, -r -1 every root in turn).
 * Geometry, data and bandwidth: perf_coll_gather (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t ga_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    return ncclGather(send, recv, op->c.count, op->type->type, op->root, ctx->comm, ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_gather, ga_run);
}
