/*
 * reduce_perf: ncclReduce: count elements from every rank reduced into the root's
 * buffer (-r root, -r -1 every root in turn).
 * Geometry, data and bandwidth: perf_coll_reduce (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t red_run(const struct perf_ctx *ctx, const struct perf_op *op,
                            const void *send, void *recv)
{
    return ncclReduce(send, recv, op->c.count, op->type->type, op->nccl_op, op->root, ctx->comm,
                      ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_reduce, red_run);
}
