/* Alpha-beta cost of the schedules (see cost.h for the formulas). */
#include "algo/cost.h"
#include "algo/sched.h"

/* Per dependent message, and per byte moved by one rank (about 4 GB/s through a FIFO). */
#define WEFT_COST_ALPHA_US 1.0
#define WEFT_COST_US_PER_BYTE (1.0 / 4000.0)

void weft_cost_fabric_shm(struct weft_cost_fabric *f)
{
    f->intra_alpha_us = f->inter_alpha_us = WEFT_COST_ALPHA_US;
    f->intra_us_per_byte = f->inter_us_per_byte = WEFT_COST_US_PER_BYTE;
    f->ranks_per_host = 1 << 30;
}

static int cost_ceil_log2(int n)
{
    int l = 0;
    while ((1 << l) < n)
        l++;
    return l;
}

double weft_cost_fabric_us(int coll, int algo, size_t bytes, int nranks,
                           const struct weft_cost_fabric *f)
{
    double n = nranks, b = (double)bytes;
    if (nranks <= 1)
        return b * f->intra_us_per_byte / 4; /* a local copy */
    int k = f->ranks_per_host < nranks ? f->ranks_per_host : nranks;
    int multi = k < nranks;
    /* Share of a ring's hops that leave a host, and the slower per-byte rate on the path. */
    double fr = multi ? 1.0 / k : 0.0;
    double alpha = fr * f->inter_alpha_us + (1 - fr) * f->intra_alpha_us;
    double beta = multi && f->inter_us_per_byte > f->intra_us_per_byte ? f->inter_us_per_byte
                                                                      : f->intra_us_per_byte;
    double steps, moved;
    if (coll == WEFT_COLL_ALLREDUCE && algo == WEFT_ALGO_TREE) {
        int d = cost_ceil_log2(nranks), dl = multi ? cost_ceil_log2(k) : d;
        dl = dl < d ? dl : d;
        return 2 * (dl * f->intra_alpha_us + (d - dl) * f->inter_alpha_us) + 2 * b * beta;
    }
    if (algo == WEFT_ALGO_DIRECT && coll <= WEFT_COLL_REDUCE) {
        /* One hop; the busiest rank moves (n-1) or n times the bytes; a NIC carries the
         * host's ranks' inter-host share of it. */
        double per_rank = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_BROADCAST ? (n - 1) * b
                                                                                      : n * b;
        double t = (multi ? f->inter_alpha_us : f->intra_alpha_us) +
                   per_rank * f->intra_us_per_byte;
        if (multi)
            t += (double)k * per_rank * (n - k) / n * f->inter_us_per_byte;
        return t;
    }
    switch (coll) {
    case WEFT_COLL_ALLREDUCE: /* reduce-scatter + all-gather around the ring */
        steps = 2 * (n - 1);
        moved = 2 * (n - 1) / n * b;
        break;
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_REDUCESCATTER:
    case WEFT_COLL_ALLTOALL: /* bytes is the per-rank block */
    case WEFT_COLL_GATHER:
    case WEFT_COLL_SCATTER:
        steps = n - 1;
        moved = (n - 1) * b;
        break;
    case WEFT_COLL_BROADCAST:
    case WEFT_COLL_REDUCE: /* pipelined chain: the last rank starts n-1 messages late */
        steps = n - 1;
        moved = b;
        break;
    default: /* send/recv */
        steps = 1;
        moved = b;
        break;
    }
    return steps * alpha + moved * beta;
}

double weft_cost_us(int coll, int algo, size_t bytes, int nranks)
{
    struct weft_cost_fabric f;
    weft_cost_fabric_shm(&f);
    return weft_cost_fabric_us(coll, algo, bytes, nranks, &f);
}
