/*
 * all_reduce_perf: ncclAllReduce on host memory, nccl-tests compatible (see common.h).
 * Every rank sends and receives count elements; algbw counts count * size bytes and busbw
 * multiplies it by 2(n-1)/n, the data a ring moves per rank.
 */
#include "common.h"

static void ar_get_counts(size_t bytes, size_t type_size, int nranks, struct perf_counts *c_p)
{
    (void)nranks;
    c_p->count = bytes / type_size;
    c_p->send_count = c_p->count;
    c_p->recv_count = c_p->count;
    c_p->send_inplace_offset = 0;
    c_p->recv_inplace_offset = 0;
    c_p->alg_bytes = (double)c_p->count * (double)type_size;
}

static void ar_init_data(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                         void *send)
{
    perf_fill(ctx, op, seed, ctx->rank, 0, op->c.send_count, send);
}

static size_t ar_expected(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                          void *expect)
{
    perf_fill_reduced(ctx, op, seed, 0, op->c.recv_count, expect);
    return op->c.recv_count;
}

static ncclResult_t ar_run(const struct perf_ctx *ctx, const struct perf_op *op, const void *send,
                           void *recv)
{
    return ncclAllReduce(send, recv, op->c.count, op->type->type, op->nccl_op, ctx->comm,
                         ctx->stream);
}

static double ar_bus_factor(int nranks)
{
    return nranks > 0 ? 2.0 * (nranks - 1) / nranks : 0;
}

static const struct perf_coll all_reduce_coll = {
    .name = "all_reduce_perf",
    .flags = PERF_COLL_REDUCE,
    .get_counts = ar_get_counts,
    .init_data = ar_init_data,
    .expected = ar_expected,
    .run = ar_run,
    .bus_factor = ar_bus_factor,
};

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &all_reduce_coll);
}
