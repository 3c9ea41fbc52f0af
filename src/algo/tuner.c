/*
 * Ring/chain schedules for bandwidth; direct (one-hop) schedules where latency dominates.
 * The size compared with each threshold is the bytes one rank contributes (NCCL's count times the
 * element size; for all-gather and reduce-scatter the per-rank block).
 */
#include <string.h>
#include <strings.h>

#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/param.h"

WEFT_PARAM(DirectMaxBytes, "WEFT_DIRECT_MAX_BYTES", -1,
           "all-reduce, reduce-scatter, all-gather, broadcast and reduce up to this many bytes "
           "per rank use the direct (one-hop) schedules (0: never; -1: 8 KiB, or 32 KiB when "
           "ranks outnumber cores and every hop of a ring costs a context switch)");
WEFT_PARAM_STR(Algo, "WEFT_ALGO", "auto",
               "force the algorithm of every collective that has both: ring, direct or auto");

int weft_tune_algo(int coll, size_t bytes, int nranks, int oversubscribed)
{
    int has_direct = coll == WEFT_COLL_ALLREDUCE || coll == WEFT_COLL_ALLGATHER ||
                     coll == WEFT_COLL_REDUCESCATTER || coll == WEFT_COLL_BROADCAST ||
                     coll == WEFT_COLL_REDUCE;
    if (!has_direct)
        return WEFT_ALGO_RING; /* the pairwise schedules are the same under both names */
    const char *force = weft_param_Algo();
    if (strcasecmp(force, "ring") == 0)
        return WEFT_ALGO_RING;
    if (strcasecmp(force, "direct") == 0)
        return WEFT_ALGO_DIRECT;
    int64_t limit = weft_param_DirectMaxBytes();
    if (limit < 0)
        limit = oversubscribed ? 32768 : 8192;
    if (nranks > 1 && bytes <= (size_t)limit)
        return WEFT_ALGO_DIRECT;
    return WEFT_ALGO_RING;
}
