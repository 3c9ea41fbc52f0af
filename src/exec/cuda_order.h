/*
 * The launch order of the ranks of one communicator that share a device in one process (issue 29,
 * finding 3).
 *
 * The streams of a device feed CUDA_DEVICE_MAX_CONNECTIONS in-order hardware queues (8 by
 * default; Megatron-LM and Transformer Engine set 1), shared by every stream of the process. A
 * queue holds everything behind an item whose stream must first finish earlier work: the event
 * record after a kernel, the user stream's wait for it, the next kernel of the same stream. So if
 * rank A queues such an item for its kernel k before rank B (same device) queued the kernel k
 * that A's kernel waits for, B's kernel may sit behind it and neither finishes.
 *
 * The rule: a rank queues nothing that waits for its kernel until every rank of the process on
 * its device has queued the kernels that kernel waits for. A kernel's operations wait for their
 * partners: collective #c of every rank, the n-th receive from (send to) this rank. Each rank
 * counts what it has launched: collectives, and sends and receives per peer of the process;
 * rank A is "covered" when every same-device peer B has launched at least as many collectives,
 * at least as many receives from A as A sends to B, and at least as many sends to A as A
 * receives from B. The launch path asks weft_cuda_order_ready before a second launch of a group
 * and weft_cuda_order_wait before queueing the users' waits. One thread issuing every rank's
 * calls must do so inside one group (the executor then launches all before any wait); outside a
 * group its first call waits for the others until WEFT_TIMEOUT, then fails naming them
 * (WEFT_CUDA_ORDER=0 turns the order off for such programs, safe only without shared queues).
 *
 * Captured work is not counted (nothing is queued: the graph's launch is the user's).
 * Thread-safe: every entry point takes the order's lock.
 */
#ifndef WEFT_EXEC_CUDA_ORDER_H
#define WEFT_EXEC_CUDA_ORDER_H

#include <stdint.h>

#include "nccl.h"

struct ncclComm;
struct weft_dev_params;
struct weft_cuda_order;

/* An order for the ranks of this process: dev[p] is rank p's device for ranks of this process,
 * -1 for the others. NULL when no two ranks of the process share a device (nothing to order) or
 * out of memory (logged; *res_p set). */
struct weft_cuda_order *weft_cuda_order_new(int nranks, const int *dev, ncclResult_t *res_p);
void weft_cuda_order_free(struct weft_cuda_order *o);

/* Counts a launch of rank's kernel with these operations; _direct: of its direct kernel (one
 * collective, which the normal kernel queued after it waits for). */
void weft_cuda_order_launched(struct weft_cuda_order *o, int rank,
                              const struct weft_dev_params *params);
void weft_cuda_order_launched_direct(struct weft_cuda_order *o, int rank);
/* 1 when rank is covered (see above): it may queue what waits for its kernels. */
int weft_cuda_order_ready(struct weft_cuda_order *o, int rank);
/* Waits until comm's rank is covered: ncclSuccess; ncclInvalidUsage when comm is aborted or
 * revoked; ncclRemoteError when a peer it waits for left (destroyed or aborted its communicator)
 * or after WEFT_TIMEOUT seconds in which no rank of the order launched (as the kernel's own
 * deadline for a peer that does not come); logged, naming the peer. */
ncclResult_t weft_cuda_order_wait(struct weft_cuda_order *o, struct ncclComm *comm);
/* rank will launch nothing more (its communicator is destroyed or aborted). */
void weft_cuda_order_leave(struct weft_cuda_order *o, int rank);

#endif
