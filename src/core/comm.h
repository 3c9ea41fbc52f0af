/*
 * The communicator. struct ncclComm is the object behind the public ncclComm_t handle; its
 * name is NCCL's because the handle type is part of the ABI. Everything else here is Weft's.
 *
 * Lifetime: created by weft_comm_init (collective), used by one thread at a time for operations
 * (NCCL's rule), aborted from any thread through abort_flag, freed by weft_comm_free. Every API
 * call holds it (weft_comm_enter .. weft_comm_leave), so abort and destroy on another thread wait
 * for the call or the call sees them; a freed communicator's memory is kept a while as a dead
 * shell (weft_comm_free) so that a call racing with its free reads a dead magic, not freed memory.
 */
#ifndef WEFT_CORE_COMM_H
#define WEFT_CORE_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "nccl.h"
#include "core/communicator.h"


/* Validates a handle passed by the user; NULL or dead: ncclInvalidArgument with a message. */
ncclResult_t weft_comm_check(const struct ncclComm *comm, const char *api);

enum { WEFT_COMM_OPEN = 0, WEFT_COMM_CLOSING_DESTROY = 1, WEFT_COMM_CLOSING_ABORT = 2 };

/* weft_comm_enter's refusal: the message for a communicator being destroyed or aborted. */
ncclResult_t weft_comm_refuse_closing(const struct ncclComm *comm, const char *api);


/*
 * A call's hold on the communicator, from its first check to its return (a device operation:
 * until it is enqueued): while held, ncclCommAbort and ncclCommDestroy on another thread wait
 * (abort cuts the call's waits short through abort_flag). Fails, holding nothing, on a NULL or
 * dead handle (ncclInvalidArgument) and once destroy or abort has begun (ncclInvalidUsage), with a
 * message naming api. The busy count and the flags are read in sequentially consistent order on
 * both sides: either the closing thread sees the count, or the entering thread sees the flag.
 * Any thread; never blocks.
 */
static inline ncclResult_t weft_comm_enter(struct ncclComm *comm, const char *api)
{
    /* Read before writing: a handle that is not a communicator at all is refused untouched. */
    if (comm == NULL || __atomic_load_n(&comm->magic, __ATOMIC_RELAXED) != WEFT_COMM_MAGIC)
        return weft_comm_check(comm, api);
    __atomic_fetch_add(&comm->busy, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&comm->closing, __ATOMIC_SEQ_CST) == WEFT_COMM_OPEN)
        return ncclSuccess;
    __atomic_fetch_sub(&comm->busy, 1, __ATOMIC_SEQ_CST);
    return weft_comm_refuse_closing(comm, api);
}

static inline void weft_comm_leave(struct ncclComm *comm)
{
    __atomic_fetch_sub(&comm->busy, 1, __ATOMIC_SEQ_CST);
}

/*
 * Claims the communicator for destroy or abort (how: WEFT_COMM_CLOSING_*): 1 when this thread
 * is the one that will free it, 0 when another thread already closes it. New calls are refused
 * from here on.
 */
int weft_comm_claim_close(struct ncclComm *comm, uint32_t how);

/*
 * After weft_comm_claim_close: wakes threads sleeping in operations on the communicator (they
 * check abort_flag within one sleep period) and waits up to max_ms for the API calls and queued
 * batches still holding it to leave, but `own` (the caller's own holds). 1 when they left.
 */
int weft_comm_drain(struct ncclComm *comm, int own, int max_ms);

/*
 * Destroy's wait after weft_comm_claim_close: calls in flight on other threads finish first (their
 * own deadlines bound them); one still running after WEFT_TIMEOUT has its waits aborted. Fails
 * (ncclInternalError, the communicator left allocated) if one still runs a second after that.
 */
ncclResult_t weft_comm_drain_calls(struct ncclComm *comm, const char *api);

/* Blocking init: alloc + setup. */
ncclResult_t weft_comm_init(struct ncclComm **comm_p, int nranks, const ncclUniqueId *id, int rank,
                            const ncclConfig_t *config);
/* Validates arguments and config, allocates the communicator; nothing collective yet. */
ncclResult_t weft_comm_alloc(struct ncclComm **comm_p, int nranks, int rank,
                             const ncclConfig_t *config);
/* The collective part of init: bootstrap, peer exchange, transports. */
ncclResult_t weft_comm_setup(struct ncclComm *comm, const ncclUniqueId *id);

/* This process's values of the settings every rank must share (weft_peer_info.settings), for a
 * communicator of nchannels channels. */
void weft_comm_settings(int nchannels, int64_t net_id, int64_t *settings);

/* The tuner's knobs (NCCL_ALGO, NCCL_PROTO, WEFT_ALGO, WEFT_DIRECT_MAX_BYTES) read and parsed for
 * a communicator's weft_tune_comm (also weft-scale's); ncclInvalidUsage, with a message naming the
 * token, when one does not parse. */
ncclResult_t weft_comm_tune_cfg(struct weft_tune_cfg *cfg);



/* Takes the next ticket (issuing thread only). */
uint64_t weft_comm_ticket_take(struct ncclComm *comm);
/*
 * Blocks until every ticket before `ticket` finished, then marks it running. Fails if the
 * communicator is aborted, or when for WEFT_TIMEOUT seconds no earlier ticket ran or finished
 * (a leaked ticket, or work stuck before it started), naming both tickets.
 */
ncclResult_t weft_comm_ticket_wait(struct ncclComm *comm, uint64_t ticket);
void weft_comm_ticket_done(struct ncclComm *comm);
/* The state ncclCommGetAsyncError reports. */
ncclResult_t weft_comm_async_state(struct ncclComm *comm);
/*
 * As NCCL before it reads a communicator's attributes or finalizes it: ncclInvalidArgument (with a
 * message naming api) while its previous operation is still ncclInProgress; its sticky error if it
 * has one; ncclSuccess otherwise. Any thread; does not block.
 */
ncclResult_t weft_comm_ensure_ready(struct ncclComm *comm, const char *api);
/* Frees local resources; peers may be gone. */
ncclResult_t weft_comm_free(struct ncclComm *comm);



/* Collectives comm has run zero-copy, host (exec/zcopy.c) and device (exec/cuda.c): for tests. */
uint64_t weft_zcopy_count(struct ncclComm *comm);

#endif
