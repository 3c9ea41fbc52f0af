/*
 * Cost model: predicted time of one collective, latency + bytes / bandwidth, per algorithm and
 * transport. Pure, so every rank predicts the same from the same arguments. The constants are
 * calibrated for shared memory on the development machine (see the perf issue notes); the tuner
 * that chooses among algorithms builds on this.
 */
#ifndef WEFT_ALGO_COST_H
#define WEFT_ALGO_COST_H

#include <stddef.h>

/* Microseconds for coll (enum weft_coll) of `bytes` (NCCL's count times the element size). */
double weft_cost_us(int coll, int algo, size_t bytes, int nranks);

#endif
