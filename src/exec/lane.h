/*
 * The step engine shared by every host-side executor: the real host executor (ranks in processes
 * or threads over shm/socket connections) and the simulator (any number of virtual ranks driven
 * round-robin by one thread over in-memory connections). It moves data through connections laid
 * out as the FIFO contract says (fifo.h: slots, slot header, control block, doorbell).
 *
 * LL (NCCL's name for its low-latency protocol): a step that fits one slot of a connection's LL
 * FIFO (conn->ll) travels there when the lane allows LL (lane->ll, from NCCL_PROTO) and the
 * connection has one; every other slice takes the slot FIFO ("Simple").
 * Both ends cut the same slices from the same schedule, so they agree which FIFO each takes; the
 * sender posts slices in order, so where both FIFOs are shared memory (conn->ll_ordered) a
 * receiver that finds the other FIFO posted ahead of the one it waits on knows the peer cut a
 * different slice (mismatched counts) and fails (weft_lane_check_mismatch: when the executor
 * checks a blocked operation, not on every poll); through a socket proxy the two arrive in any
 * order, so there the other FIFO must stay ahead for 10 s first.
 *
 * Direct sends: a large SEND step of point-to-point work, all-to-all, gather or scatter (where the
 * peer's matching step is a plain RECV) may travel as one slot that describes the data instead of
 * holding it (bytes WEFT_SLOT_DIRECT, payload struct weft_direct_desc): the receiver copies the
 * whole step straight from the sender's buffer into its own, with memcpy in one address space
 * or process_vm_readv from another process (one copy instead of two through the FIFO: 2-rank
 * send/recv of 1 MiB 7 -> 21 GB/s on the 2-core machine), then frees the slot. Only receivers
 * that said so at setup (conn->direct, a probe read of the sender's memory) get such slots. The
 * sender goes on with its next steps (a slot not yet read is just a FIFO slot not yet freed, so
 * this waits no more than the FIFO path would), but its lane is done only once every slot it
 * described was freed, so its user buffer stays untouched until the peers have read it.
 *
 * A lane runs one ordered list of steps (one channel of a collective, or one peer direction of
 * point-to-point work). weft_lane_progress never blocks: it does as much as the connections allow
 * now and returns; the caller decides how to wait. Each step is moved in slices of at most one
 * slot's payload; a slice of a recv-reduce-send step reduces straight from the incoming slot into
 * the outgoing slot (no staging copy).
 */
#ifndef WEFT_EXEC_LANE_H
#define WEFT_EXEC_LANE_H

#include <stddef.h>
#include <stdint.h>

#include "algo/sched.h"
#include "fifo.h"
#include "redop.h"

/* A direct send's slot (hdr->bytes WEFT_SLOT_DIRECT): the step's data, in the sender's address
 * space. */
struct weft_direct_desc {
    uint64_t addr;
    uint64_t bytes;
    uint32_t revoked; /* set by a sender that gave the step up (weft_lane_revoke_direct) */
};

struct weft_lane {
    /* set by the caller */
    const struct weft_step *steps;
    uint64_t nsteps;
    struct weft_peer_conns *peers; /* [nranks] for this lane's channel */
    int nranks;
    const void *input;
    void *output;
    size_t elem_size; /* a power of two (every datatype's size) */
    const struct weft_redop *op; /* NULL for collectives without reduction */
    int ll;                      /* small slices may take the connections' LL FIFOs */
    uint32_t sig; /* the operation's signature hash, sent with every slice and compared with
                   * every received one (exec/sig.h); 0: no check */
    uint64_t direct_min_bytes; /* SEND steps of at least this many bytes go direct where the
                                * connection allows (0: never; only where every matching step
                                * of the peers is a plain RECV) */
    int direct_coalesce; /* point-to-point: one direct send covers consecutive steps */
    /* progress state, zeroed by weft_lane_init */
    uint64_t cur;        /* current step */
    uint64_t cur_done;   /* elements of the current step already moved */
    uint64_t bytes_sent; /* statistics */
    uint64_t bytes_recv;
    int direct_pending; /* direct sends posted; the lane is done once the peers freed them */
    int direct_scan;    /* peers below this one have freed every direct send of the lane */
    /* set when weft_lane_progress returns -1: the peer sent a slice of the wrong size, or (errno
     * != 0) a direct send could not be read */
    int error_peer;
    uint32_t error_got_bytes;
    uint32_t error_want_bytes;
    uint32_t error_sig; /* != 0: the peer's slice carried this signature hash, not lane->sig */
    int mismatch_checks; /* weft_lane_check_mismatch's count */
    int error_errno;     /* != 0: process_vm_readv of peer error_peer's direct send failed */
    /* set when weft_lane_progress returns blocked on data: the slot header word it waits on and
     * the value that word takes once the slice is there (weft_lane_watch) */
    const uint64_t *awaited;
    uint64_t awaited_seq;
};

void weft_lane_init(struct weft_lane *lane);

/* 1 when every step is done (and the peers have read every direct send). */
static inline int weft_lane_done(const struct weft_lane *lane)
{
    return lane->cur >= lane->nsteps && !lane->direct_pending;
}

/*
 * Moves as many slices as the connections allow without waiting. Returns 1 if anything moved,
 * 0 if the lane is blocked (or done), -1 if a peer posted a slice whose size differs from what
 * this rank's schedule expects (mismatched counts or datatypes across ranks; see error_* fields).
 * Never blocks. Only the thread that owns the lane calls it.
 * When blocked, *blocked_peer_p (if not NULL) is set to the peer it waits for and *blocked_send_p
 * to 1 when it waits for send credit, 0 when it waits for data.
 */
int weft_lane_progress(struct weft_lane *lane, int *blocked_peer_p, int *blocked_send_p);

/*
 * After an error that ends the lane's operation early: marks every direct send of the lane the
 * peers have not read yet as revoked, before the user may touch the buffer again. A receiver
 * that finds its slot revoked, before or after reading, keeps what it read out of use and waits
 * (the peer's failure, or the deadline, then ends its operation) rather than returning data
 * that may have changed while it read.
 */
void weft_lane_revoke_direct(struct weft_lane *lane);

/*
 * For a lane that waits for data: -1 (error_* set, as weft_lane_progress) when the peer has
 * posted its next slice on the connection's other FIFO (LL instead of slots, or the reverse),
 * which it does only when it cut this slice differently; 0 otherwise. Where the two FIFOs reach
 * this rank through a proxy (!ll_ordered), only once that has held at `checks` calls in a row.
 * Off the fast path: the executor calls it when it checks a blocked operation for faults.
 */
int weft_lane_check_mismatch(struct weft_lane *lane, int checks);

#endif
