/*
 * reduce_scatter_perf: ncclReduceScatter: n * count elements in, block `rank` of the
 * reduction (count elements) out.
 * Geometry, data and bandwidth: perf_coll_reduce_scatter (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t rs_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    return ncclReduceScatter(send, recv, op->c.count, op->type->type, op->nccl_op, ctx->comm,
                             ctx->stream);
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_reduce_scatter, rs_run);
}
