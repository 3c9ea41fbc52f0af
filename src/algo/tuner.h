/*
 * Algorithm choice. Depends only on values every rank shares (collective, bytes, rank count and
 * the knobs, which every rank of a job is expected to set alike), so all ranks choose the same.
 *
 * NCCL_ALGO and NCCL_PROTO use NCCL's syntax: a comma list of names (case-insensitive), `^` first
 * to exclude them instead, or per collective `allreduce:tree,ring;allgather:ring` (Broadcast,
 * Reduce, AllGather, ReduceScatter, AllReduce; collectives not named keep every algorithm).
 * Algorithms: Ring, Tree, Direct (ours), and NCCL's CollNetDirect, CollNetChain, NVLS, NVLSTree and
 * PAT, which are accepted and never chosen (we have none of them). Protocols: LL, LL128, Simple;
 * the host has one protocol, so NCCL_PROTO is validated and logged only. An unknown name is
 * ncclInvalidUsage at communicator creation (weft_tune_check), as in NCCL.
 */
#ifndef WEFT_ALGO_TUNER_H
#define WEFT_ALGO_TUNER_H

#include <stddef.h>

#include "nccl.h"

/*
 * Validates NCCL_ALGO and NCCL_PROTO (WEFT_WARN naming the bad token, ncclInvalidUsage) and logs
 * what they allow under TUNING. Called at communicator creation, from any thread; cheap after the
 * first call.
 */
ncclResult_t weft_tune_check(void);

/*
 * Bit (1 << enum weft_algo) set of the algorithms NCCL_ALGO allows for coll; every bit when
 * NCCL_ALGO is unset or invalid.
 */
unsigned weft_tune_allowed(int coll);

/*
 * enum weft_algo for coll (enum weft_coll) moving `bytes` (NCCL's count x element size) among
 * nranks; oversubscribed: the host runs more ranks than it has cores (the same on every rank).
 * Unset NCCL_ALGO keeps the measured single-host rule (direct up to WEFT_DIRECT_MAX_BYTES, ring
 * above). Tree is a candidate
 * only where NCCL_ALGO allows it explicitly (its single-host constants are not measured yet), and
 * is chosen when the cost model predicts it faster than the rule's choice among what is allowed.
 * When nothing allowed has a schedule for coll, the unset rule applies (logged once).
 */
int weft_tune_algo(int coll, size_t bytes, int nranks, int oversubscribed);

#endif
