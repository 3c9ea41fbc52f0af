/* Ring for bandwidth, one-shot (direct) all-reduce where latency dominates. */
#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/param.h"

WEFT_PARAM(DirectMaxBytes, "WEFT_DIRECT_MAX_BYTES", 16384,
           "all-reduces up to this many bytes use the one-shot (direct) algorithm (0: never)");

int weft_tune_algo(int coll, size_t bytes, int nranks)
{
    if (coll == WEFT_COLL_ALLREDUCE && nranks > 1 &&
        bytes <= (size_t)weft_param_DirectMaxBytes())
        return WEFT_ALGO_DIRECT;
    return WEFT_ALGO_RING;
}
