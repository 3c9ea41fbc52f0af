/*
 * The collectives the *_perf tools measure, independent of the library that runs them: buffer
 * geometry, input data, expected result and bus factor, as nccl-tests 2.19.6 defines them (see
 * common.h). The Weft tools and their MPI peers both use these, so both validate and report the
 * same thing.
 *
 * Counts. all_reduce, broadcast, reduce and sendrecv pass count = bytes / type size. all_gather,
 * reduce_scatter, alltoall, gather, scatter and hypercube pass a per-rank (per-peer) count:
 * (count / nranks) rounded down to a multiple of 16 bytes.
 *
 * In place (nccl-tests): sendbuff = recvbuff + rank * send_inplace_offset, recvbuff + rank *
 * recv_inplace_offset holds the result. So all_gather, gather and hypercube send from their own
 * block of the receive buffer; reduce_scatter and scatter receive into their own block of the
 * send buffer; the others use one buffer. NCCL defines no in-place result for alltoall and
 * sendrecv (one buffer sent and received concurrently): nccl-tests times them and prints N/A.
 */
#include "common.h"

static void set_counts(struct perf_counts *c, size_t count, size_t send, size_t recv,
                       size_t send_off, size_t recv_off, double alg_bytes)
{
    c->count = count;
    c->send_count = send;
    c->recv_count = recv;
    c->send_inplace_offset = send_off;
    c->recv_inplace_offset = recv_off;
    c->alg_bytes = alg_bytes;
}

/* nccl-tests' per-rank count: (bytes / ts) / nranks, rounded down to a multiple of 16 bytes. */
static size_t per_rank_count(size_t bytes, size_t ts, int nranks)
{
    size_t align = ts < 16 ? 16 / ts : 1;

    return bytes / ts / (size_t)nranks / align * align;
}

static double factor_one(int nranks)
{
    (void)nranks;
    return 1.0;
}

/* (n-1)/n: each rank receives (or sends) all but its own share of the data. */
static double factor_nm1_n(int nranks)
{
    return nranks > 0 ? (double)(nranks - 1) / nranks : 0;
}

/* One call does the whole collective. */
static int phases_one(int nranks)
{
    (void)nranks;
    return 1;
}

/* log2(n) exchange steps, each using what the previous one received. */
static int phases_log2(int nranks)
{
    int n = 0;

    while ((1 << (n + 1)) <= nranks)
        n++;
    return n > 0 ? n : 1;
}

/* 2(n-1)/n: a ring all-reduce is a reduce-scatter then an all-gather. */
static double factor_all_reduce(int nranks)
{
    return nranks > 0 ? 2.0 * (nranks - 1) / nranks : 0;
}

/* ---- shared data callbacks ---- */

static void send_own(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                     void *send)
{
    perf_fill(ctx, op, seed, ctx->rank, 0, op->c.send_count, send);
}

static void send_root(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                      void *send)
{
    if (ctx->rank == op->root)
        perf_fill(ctx, op, seed, op->root, 0, op->c.send_count, send);
}

static size_t expect_reduced(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                             void *expect)
{
    perf_fill_reduced(ctx, op, seed, 0, op->c.count, expect);
    return op->c.count;
}

/* Block r of the result is rank r's send data (all_gather, gather, hypercube). */
static size_t expect_gathered(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                              void *expect)
{
    size_t block = op->c.count * op->type->size;

    for (int r = 0; r < ctx->nranks; r++)
        perf_fill(ctx, op, seed, r, 0, op->c.count, (char *)expect + (size_t)r * block);
    return op->c.count * (size_t)ctx->nranks;
}

/* ---- all_reduce ---- */

static void ar_counts(size_t bytes, size_t ts, int nranks, struct perf_counts *c_p)
{
    size_t count = bytes / ts;

    (void)nranks;
    set_counts(c_p, count, count, count, 0, 0, (double)count * (double)ts);
}

const struct perf_coll perf_coll_all_reduce = {
    .name = "all_reduce",
    .flags = PERF_COLL_REDUCE,
    .get_counts = ar_counts,
    .init_data = send_own,
    .expected = expect_reduced,
    .bus_factor = factor_all_reduce,
    .phases = phases_one,
};

/* ---- all_gather: count per rank; algbw counts the whole gathered buffer ---- */

static void ag_counts(size_t bytes, size_t ts, int nranks, struct perf_counts *c_p)
{
    size_t base = per_rank_count(bytes, ts, nranks), n = (size_t)nranks;

    set_counts(c_p, base, base, base * n, base, 0, (double)(base * n) * (double)ts);
}

const struct perf_coll perf_coll_all_gather = {
    .name = "all_gather",
    .flags = 0,
    .get_counts = ag_counts,
    .init_data = send_own,
    .expected = expect_gathered,
    .bus_factor = factor_nm1_n,
    .phases = phases_one,
};

/* ---- reduce_scatter: count per rank (the receive count) ---- */

static void rs_counts(size_t bytes, size_t ts, int nranks, struct perf_counts *c_p)
{
    size_t base = per_rank_count(bytes, ts, nranks), n = (size_t)nranks;

    set_counts(c_p, base, base * n, base, 0, base, (double)(base * n) * (double)ts);
}

static size_t rs_expected(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                          void *expect)
{
    perf_fill_reduced(ctx, op, seed, (size_t)ctx->rank * op->c.count, op->c.count, expect);
    return op->c.count;
}

const struct perf_coll perf_coll_reduce_scatter = {
    .name = "reduce_scatter",
    .flags = PERF_COLL_REDUCE,
    .get_counts = rs_counts,
    .init_data = send_own,
    .expected = rs_expected,
    .bus_factor = factor_nm1_n,
    .phases = phases_one,
};

/* ---- broadcast and reduce: count everywhere, the root sends (receives) it ---- */

static size_t bc_expected(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                          void *expect)
{
    perf_fill(ctx, op, seed, op->root, 0, op->c.count, expect);
    return op->c.count;
}

const struct perf_coll perf_coll_broadcast = {
    .name = "broadcast",
    .flags = PERF_COLL_ROOTED,
    .get_counts = ar_counts,
    .init_data = send_root,
    .expected = bc_expected,
    .bus_factor = factor_one,
    .phases = phases_one,
};

static size_t reduce_expected(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                              void *expect)
{
    return ctx->rank == op->root ? expect_reduced(ctx, op, seed, expect) : 0;
}

const struct perf_coll perf_coll_reduce = {
    .name = "reduce",
    .flags = PERF_COLL_REDUCE | PERF_COLL_ROOTED,
    .get_counts = ar_counts,
    .init_data = send_own,
    .expected = reduce_expected,
    .bus_factor = factor_one,
    .phases = phases_one,
};

/* ---- alltoall: count per peer; block j goes to rank j ---- */

static void a2a_counts(size_t bytes, size_t ts, int nranks, struct perf_counts *c_p)
{
    size_t base = per_rank_count(bytes, ts, nranks), n = (size_t)nranks;

    set_counts(c_p, base, base * n, base * n, 0, 0, (double)(base * n) * (double)ts);
}

/* Block r comes from rank r, which sent its block `rank`. */
static size_t a2a_expected(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                           void *expect)
{
    size_t block = op->c.count * op->type->size;

    for (int r = 0; r < ctx->nranks; r++)
        perf_fill(ctx, op, seed, r, (size_t)ctx->rank * op->c.count, op->c.count,
                  (char *)expect + (size_t)r * block);
    return op->c.count * (size_t)ctx->nranks;
}

const struct perf_coll perf_coll_alltoall = {
    .name = "alltoall",
    .flags = PERF_COLL_INPLACE_UNCHECKED,
    .get_counts = a2a_counts,
    .init_data = send_own,
    .expected = a2a_expected,
    .bus_factor = factor_nm1_n,
    .phases = phases_one,
};

/* ---- sendrecv: a ring, each rank sends count to rank+1 and receives from rank-1 ---- */

static size_t sr_expected(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                          void *expect)
{
    int prev = (ctx->rank + ctx->nranks - 1) % ctx->nranks;

    perf_fill(ctx, op, seed, prev, 0, op->c.count, expect);
    return op->c.count;
}

const struct perf_coll perf_coll_sendrecv = {
    .name = "sendrecv",
    .flags = PERF_COLL_INPLACE_UNCHECKED,
    .get_counts = ar_counts,
    .init_data = send_own,
    .expected = sr_expected,
    .bus_factor = factor_one,
    .phases = phases_one,
};

/* ---- gather and scatter: count per rank, the root holds all n blocks ---- */

static size_t gather_expected(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                              void *expect)
{
    return ctx->rank == op->root ? expect_gathered(ctx, op, seed, expect) : 0;
}

const struct perf_coll perf_coll_gather = {
    .name = "gather",
    .flags = PERF_COLL_ROOTED,
    .get_counts = ag_counts,
    .init_data = send_own,
    .expected = gather_expected,
    .bus_factor = factor_nm1_n,
    .phases = phases_one,
};

static size_t scatter_expected(const struct perf_ctx *ctx, const struct perf_op *op,
                               uint64_t seed, void *expect)
{
    perf_fill(ctx, op, seed, op->root, (size_t)ctx->rank * op->c.count, op->c.count, expect);
    return op->c.count;
}

const struct perf_coll perf_coll_scatter = {
    .name = "scatter",
    .flags = PERF_COLL_ROOTED,
    .get_counts = rs_counts,
    .init_data = send_root,
    .expected = scatter_expected,
    .bus_factor = factor_nm1_n,
    .phases = phases_one,
};

/*
 * ---- hypercube: an all-gather by recursive doubling ----
 * Step k (mask = 2^k) swaps the 2^k blocks each rank holds with rank ^ mask, so log2(n) steps
 * move (n-1) blocks in and out of every rank: algbw counts count * (n-1) elements, factor 1.
 */
static void hc_counts(size_t bytes, size_t ts, int nranks, struct perf_counts *c_p)
{
    size_t base = per_rank_count(bytes, ts, nranks), n = (size_t)nranks;

    set_counts(c_p, base, base, base * n, base, 0, (double)(base * (n - 1)) * (double)ts);
}

const struct perf_coll perf_coll_hypercube = {
    .name = "hypercube",
    .flags = PERF_COLL_POW2,
    .get_counts = hc_counts,
    .init_data = send_own,
    .expected = expect_gathered,
    .bus_factor = factor_one,
    .phases = phases_log2,
};
