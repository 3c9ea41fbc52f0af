/*
 * broadcast_perf: ncclBroadcast: the root's count elements to every rank (-r root,
 * -r -1 every root in turn).
 * Geometry, data and bandwidth: perf_coll_broadcast (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t bc_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    return ncclBroadcast(send, recv, op->c.count, op->type->type, op->root, ctx->comm,
                         ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_broadcast, bc_run);
}
