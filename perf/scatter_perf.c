/*
 * scatter_perf: ncclScatter: block r (count elements) of the root's buffer to rank r
 * (-r root, -r -1 every root in turn).
 * Geometry, data and bandwidth: perf_coll_scatter (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t sc_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    return ncclScatter(send, recv, op->c.count, op->type->type, op->root, ctx->comm,
                       ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_scatter, sc_run);
}
