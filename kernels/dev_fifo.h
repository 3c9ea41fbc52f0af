/*
 * The FIFO protocol of the CUDA executor ("Simple"), and the credit rules it shares with the host
 * step engine (exec/lane.h) and with the device's LL protocol (dev_ll.h: each connection also has
 * an LL FIFO, with its own slots, head word and step counters, laid out after these).
 *
 * A connection carries data from one rank (sender) to another (receiver) through WEFT_STEPS slots
 * of slot_bytes each. Both ends count steps with 64-bit counters that never wrap and never reset:
 *   - `tail` (steps posted) lives in the receiver's memory, written by the sender only;
 *   - `head` (steps freed) lives in the sender's memory, written by the receiver only;
 * so every poll reads local memory and every post is one remote store (NCCL's placement).
 *
 * Send of step s (one block):
 *   1. one thread acquire-polls head until weft_fifo_has_credit(head, s, WEFT_STEPS);
 *   2. a block barrier; every thread writes its part of slot weft_fifo_slot(s, WEFT_STEPS);
 *   3. a block barrier; the same thread stores bytes[slot], then release-stores tail = s + 1
 *      (the release after the barrier is cumulative over the writes of every thread of the block).
 * Receive of step s:
 *   1. one thread acquire-polls tail until weft_fifo_has_data(tail, s);
 *   2. a block barrier; every thread reads the slot (volatile loads: no stale L1 lines);
 *   3. a block barrier; the thread release-stores head = s + 1.
 * Steps are sliced alike on both ends (weft_fifo_slice), so bytes[slot] must equal what the
 * receiver expects; a difference means the ranks issued different operations. The sender stores
 * sig[slot] (its operation's signature hash) beside bytes[slot]; a receiver whose own hash differs
 * gives up with WEFT_DEV_SIG_MISMATCH before it reads the slot.
 *
 * Scope is a property of the connection: WEFT_SCOPE_GPU when both ends are kernels of this
 * process on one device, WEFT_SCOPE_SYS otherwise (peer devices, host memory).
 *
 * Memory layout (per rank, one device allocation, the same offsets on every rank): for each
 * connection channel c (0 .. nch, nch being point-to-point) and peer p, the receive block of the
 * connection p -> this rank (struct weft_dev_recv_ctrl, then the slots); after all of them, the
 * head words of the connections this rank -> p (struct weft_dev_send_ctrl). The step counters of
 * both ends live in the communicator's device state (struct weft_dev_conn), advanced by the kernel
 * itself, so CUDA graph replays stay valid.
 *
 * Compiled as C by gcc (the host executor and the tests use the layout and the rules) and as C++
 * by g++ and nvcc (the kernel, with kernels/dialect.h for the device half at the end).
 */
#ifndef WEFT_KERNELS_DEV_FIFO_H
#define WEFT_KERNELS_DEV_FIFO_H

#include <stddef.h>
#include <stdint.h>

#include "compat.h"

/* Slots of a FIFO; a schedule step spans at most WEFT_CHUNK_SLOTS of them (two in flight). */
#define WEFT_STEPS 8
#define WEFT_CHUNK_SLOTS (WEFT_STEPS / 2)
#define WEFT_CACHELINE 128

/* ---- the rules, shared with the host step engine ------------------------------------------- */

/* Slot of `step` in a FIFO of nslots slots (a power of two). */
WEFT_HD uint32_t weft_fifo_slot(uint64_t step, uint32_t nslots)
{
    return (uint32_t)(step & (uint64_t)(nslots - 1));
}

/* The sender may fill the slot of `step` once the receiver freed every step up to step-nslots. */
WEFT_HD int weft_fifo_has_credit(uint64_t head, uint64_t step, uint32_t nslots)
{
    return head + nslots > step;
}

/* The receiver may read the slot of `step` once the sender posted it. */
WEFT_HD int weft_fifo_has_data(uint64_t tail, uint64_t step)
{
    return tail > step;
}

/* Elements of the next slice of a step of `count` elements of which `done` moved already. */
WEFT_HD uint64_t weft_fifo_slice(uint64_t slot_payload, uint64_t elem_size, uint64_t count,
                                 uint64_t done)
{
    uint64_t n = slot_payload / elem_size, left = count - done;
    return n < left ? n : left;
}

/* Elements per schedule step: two steps fit in the FIFO (see algo/sched.h). */
WEFT_HD uint64_t weft_fifo_chunk(uint64_t slot_payload, uint64_t elem_size)
{
    uint64_t c = slot_payload * WEFT_CHUNK_SLOTS / elem_size;
    return c > 0 ? c : 1;
}

/* ---- device connection layout ------------------------------------------------------------- */

/* In the receiver's memory: written by the sender. */
struct weft_dev_recv_ctrl {
    uint64_t tail; /* steps posted */
    char pad0[WEFT_CACHELINE - sizeof(uint64_t)];
    uint32_t bytes[WEFT_STEPS]; /* payload bytes of the slice in each slot */
    uint32_t sig[WEFT_STEPS];   /* the operation's signature hash of each slot (exec/sig.h); 0: the
                                 * sender does not check */
    char pad1[WEFT_CACHELINE - 2 * WEFT_STEPS * sizeof(uint32_t)];
} WEFT_ALIGNED_TYPE(WEFT_CACHELINE);

/* In the sender's memory: written by the receiver. */
struct weft_dev_send_ctrl {
    uint64_t head; /* steps freed */
    char pad0[WEFT_CACHELINE - sizeof(uint64_t)];
} WEFT_ALIGNED_TYPE(WEFT_CACHELINE);

/* Bytes of one receive block (control, then WEFT_STEPS slots). */
WEFT_HD size_t weft_dev_recv_block_bytes(size_t slot_bytes)
{
    return sizeof(struct weft_dev_recv_ctrl) + (size_t)WEFT_STEPS * slot_bytes;
}

/* Offset of the receive block of the connection from `peer` on connection channel c. */
WEFT_HD size_t weft_dev_recv_off(int c, int peer, int nranks, size_t slot_bytes)
{
    return ((size_t)c * (size_t)nranks + (size_t)peer) * weft_dev_recv_block_bytes(slot_bytes);
}

/* Offset of the head word of the connection to `peer` on connection channel c. */
WEFT_HD size_t weft_dev_head_off(int c, int peer, int nranks, int nconn_chan, size_t slot_bytes)
{
    return weft_dev_recv_off(nconn_chan, 0, nranks, slot_bytes) +
           ((size_t)c * (size_t)nranks + (size_t)peer) * sizeof(struct weft_dev_send_ctrl);
}

/* Bytes of a rank's FIFO allocation. */
WEFT_HD size_t weft_dev_fifo_bytes(int nranks, int nconn_chan, size_t slot_bytes)
{
    return weft_dev_head_off(nconn_chan, 0, nranks, nconn_chan, slot_bytes);
}

/* struct weft_dev_conn.scope (the kernel maps them to the dialect's WEFT_SCOPE_*). */
#define WEFT_DEV_SCOPE_GPU 0
#define WEFT_DEV_SCOPE_SYS 1

/* Both ends of one connection pair (this rank <-> peer on one channel), as the kernel sees them. */
struct weft_dev_conn {
    /* to the peer */
    char *send_slots;                 /* peer's memory */
    struct weft_dev_recv_ctrl *send_rc; /* peer's memory: tail and bytes written here */
    struct weft_dev_send_ctrl *send_sc; /* own memory: head, polled here */
    uint64_t send_step;               /* next step to post */
    /* from the peer */
    const char *recv_slots;           /* own memory */
    struct weft_dev_recv_ctrl *recv_rc; /* own memory: tail, polled here */
    struct weft_dev_send_ctrl *recv_sc; /* peer's memory: head written here */
    uint64_t recv_step;               /* next step to free */
    int32_t scope;                    /* WEFT_DEV_SCOPE_GPU or WEFT_DEV_SCOPE_SYS */
    int32_t pad;
    /* the connection's LL FIFO (dev_ll.h): the same roles, its own slots and counters */
    char *ll_send_slots;
    struct weft_dev_recv_ctrl *ll_send_rc;
    struct weft_dev_send_ctrl *ll_send_sc;
    uint64_t ll_send_step;
    const char *ll_recv_slots;
    struct weft_dev_recv_ctrl *ll_recv_rc;
    struct weft_dev_send_ctrl *ll_recv_sc;
    uint64_t ll_recv_step;
};

/* Why a kernel gave up (struct weft_dev_stuck.state). */
enum weft_dev_stuck_state {
    WEFT_DEV_OK = 0,
    WEFT_DEV_TIMEOUT = 1,  /* no progress for the deadline */
    WEFT_DEV_ABORTED = 2,  /* the host set the abort word */
    WEFT_DEV_MISMATCH = 3, /* the peer posted a slice of another size (Simple or LL) */
    WEFT_DEV_BAD_SCHED = 4,/* no schedule for the operation's arguments */
    WEFT_DEV_SIG_MISMATCH = 5, /* the peer's slice carries another operation's signature:
                                * expected = this rank's hash, seen = the peer's */
};

/* What a block waited for when it gave up (struct weft_dev_stuck.wait), for the host's message. */
enum weft_dev_wait {
    WEFT_DEV_WAIT_FIFO = 0, /* a FIFO slot: data from the peer (send 0) or space in it (send 1) */
    WEFT_DEV_WAIT_JOIN = 1, /* direct kernel: the peer's kernel of this operation to start */
    WEFT_DEV_WAIT_DONE = 2, /* direct kernel: the peer to finish with this rank's buffers */
};

/*
 * Host-visible (pinned, mapped) record of why a block gave up, one per block (so no two writers
 * race on one record); the fields are written before `state` (release, system scope). A block
 * that sees any record's state != 0 leaves too, and so does every later kernel of the
 * communicator. The host reports the first record set.
 */
struct weft_dev_stuck {
    uint32_t state;   /* enum weft_dev_stuck_state; written last */
    int32_t channel;  /* block */
    int32_t peer;     /* rank waited for */
    int32_t send;     /* 1: waiting for buffer space (head), 0: for data (tail) */
    int32_t coll;     /* enum weft_coll of the operation */
    int32_t op_index; /* operation within the launch */
    int32_t wait;     /* enum weft_dev_wait: what the block waited for (TIMEOUT, ABORTED) */
    uint64_t seq;     /* the operation's sequence number on the communicator */
    uint64_t step;    /* schedule step index within the operation */
    uint64_t expected; /* counter value (or bytes) needed */
    uint64_t seen;     /* counter value (or bytes) found */
};

#endif
