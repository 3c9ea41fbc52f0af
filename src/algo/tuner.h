/*
 * Algorithm choice. Depends only on values every rank shares (collective, bytes, rank count and
 * the knobs, which every rank of a job is expected to set alike), so all ranks choose the same.
 */
#ifndef WEFT_ALGO_TUNER_H
#define WEFT_ALGO_TUNER_H

#include <stddef.h>

/*
 * enum weft_algo for coll (enum weft_coll) moving `bytes` (NCCL's count x element size) among
 * nranks; oversubscribed: the host runs more ranks than it has cores (the same on every rank).
 */
int weft_tune_algo(int coll, size_t bytes, int nranks, int oversubscribed);

#endif
