/*
 * all_reduce_perf: ncclAllReduce: every rank sends and receives count elements.
 * Geometry, data and bandwidth: perf_coll_all_reduce (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t ar_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    return ncclAllReduce(send, recv, op->c.count, op->type->type, op->nccl_op, ctx->comm,
                         ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_all_reduce, ar_run);
}
