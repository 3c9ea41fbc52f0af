/* Alpha-beta cost of the ring/chain/pairwise schedules over shared memory. */
#include "algo/cost.h"
#include "algo/sched.h"

/* Per dependent message, and per byte moved by one rank (about 4 GB/s through a FIFO). */
#define WEFT_COST_ALPHA_US 1.0
#define WEFT_COST_US_PER_BYTE (1.0 / 4000.0)

double weft_cost_us(int coll, int algo, size_t bytes, int nranks)
{
    (void)algo;
    double n = nranks, b = (double)bytes;
    if (nranks <= 1)
        return b * WEFT_COST_US_PER_BYTE / 4; /* a local copy */
    double steps, moved;
    switch (coll) {
    case WEFT_COLL_ALLREDUCE: /* reduce-scatter + all-gather around the ring */
        steps = 2 * (n - 1);
        moved = 2 * (n - 1) / n * b;
        break;
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_REDUCESCATTER:
    case WEFT_COLL_ALLTOALL: /* bytes is the per-rank block */
        steps = n - 1;
        moved = (n - 1) * b;
        break;
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
    return steps * WEFT_COST_ALPHA_US + moved * WEFT_COST_US_PER_BYTE;
}
