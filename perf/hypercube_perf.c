/*
 * hypercube_perf: an all-gather built from ncclSend/ncclRecv, by recursive
 * doubling. Rank r starts with its own block at block r of the receive buffer (copied there
 * unless in place); step k (mask = 2^k, k < log2 n) swaps, in one group, the 2^k blocks it holds
 * (those of the aligned group r & ~(mask-1)) with those of peer r ^ mask. n must be a power of
 * two (PERF_COLL_POW2: the driver refuses other sizes). A thread driving several ranks (-g) has
 * the driver call it once per step (perf_coll_hypercube.phases), so each step's group across
 * those ranks only sends what earlier steps received.
 * Geometry, data and bandwidth: perf_coll_hypercube (colls.c); flags and output: common.h.
 */
#include "common.h"

static ncclResult_t hc_run(const struct perf_ctx *ctx, const struct perf_op *op,
                           const void *send, void *recv)
{
    size_t block = op->c.count * op->type->size;
    char *out = recv;
    ncclResult_t res = ncclSuccess, end;

    /* Phased (a thread driving several ranks): step `phase` only, the copy with the first. */
    int first = op->nphases > 1 ? 1 << op->phase : 1;
    int last = op->nphases > 1 ? first : ctx->nranks - 1;

    /* The local block: a copy on the rank's stream (device buffers) or a plain one. */
    if (!op->in_place && block > 0 && first == 1)
        res = perf_copy(ctx, out + (size_t)ctx->rank * block, send, block);
    for (int mask = first; mask <= last && mask < ctx->nranks && res == ncclSuccess;
         mask <<= 1) {
        int peer = ctx->rank ^ mask;
        size_t mine = (size_t)(ctx->rank & ~(mask - 1)), theirs = (size_t)(peer & ~(mask - 1));
        size_t n = op->c.count * (size_t)mask;

        res = ncclGroupStart();
        if (res != ncclSuccess)
            break;
        res = ncclSend(out + mine * block, n, op->type->type, peer, ctx->comm, ctx->stream);
        if (res == ncclSuccess)
            res = ncclRecv(out + theirs * block, n, op->type->type, peer, ctx->comm, ctx->stream);
        end = ncclGroupEnd();
        if (res == ncclSuccess)
            res = end;
    }
    return res;
}

int main(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_coll_hypercube, hc_run);
}
