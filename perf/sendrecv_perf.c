/*
 * sendrecv_perf: ncclSend/ncclRecv, a ring: in one group every rank sends count
 * elements to rank+1 and receives count elements from rank-1 (itself when alone). In place is
 * timed only (#wrong N/A), as in nccl-tests.
 * Geometry, data and bandwidth: perf_coll_sendrecv (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t sr_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    int next = (ctx->rank + 1) % ctx->nranks;
    int prev = (ctx->rank + ctx->nranks - 1) % ctx->nranks;
    ncclResult_t res, end;

    res = ncclGroupStart();
    if (res != ncclSuccess)
        return res;
    res = ncclSend(send, op->c.count, op->type->type, next, ctx->comm, ctx->stream);
    if (res == ncclSuccess)
        res = ncclRecv(recv, op->c.count, op->type->type, prev, ctx->comm, ctx->stream);
    end = ncclGroupEnd(); /* always closed, so that a failure leaves no group open */
    return res != ncclSuccess ? res : end;
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_sendrecv, sr_run);
}
