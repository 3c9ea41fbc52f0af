/*
 * What the CUDA executor (src/exec/cuda.c, C) and the collective kernel (kernels/coll_kernel.cu,
 * C++ for g++ and nvcc) share: the kernel parameters and the communicator's device state.
 *
 * Parameters describe operations only (what to do, on which buffers); every counter and FIFO
 * position lives in the device state, which the kernel advances itself, so a launch captured in a
 * CUDA graph stays valid for every replay.
 *
 * Blocks: one per collective channel (weft_dev_comm.nchannels). Block b runs channel b of every
 * collective of the launch, in order, and the point-to-point operations whose `block` is b; the
 * operations of a block progress together (a block polls them in turn and moves whichever can
 * move), the ones sharing connections (a collective's channel; one peer and direction of
 * point-to-point) in issue order. Each operation takes one protocol for all its slices
 * (weft_dev_op.proto: Simple, dev_fifo.h, or LL, dev_ll.h), the same on every rank.
 */
#ifndef WEFT_KERNELS_DEV_KERNEL_H
#define WEFT_KERNELS_DEV_KERNEL_H

#include <stdint.h>

#include "algo/sched.h"
#include "dev_fifo.h"
#include "dev_ll.h"

/* Operations per launch (a larger group becomes several launches, cut where every rank agrees:
 * exec/cuda.c, weft_cuda_phases). */
#define WEFT_DEV_MAX_OPS 32
/* Threads of a block at most: the kernel's launch bound, which leaves it 128 registers a thread
 * (a bound of 1024 left 64, and the kernel spilled 244 bytes). */
#define WEFT_COLL_KERNEL_MAX_THREADS 512
/* Steps a block keeps per connection key (weft_sched_build_window refills it). */
#define WEFT_DEV_WINDOW 32
/* Dynamic shared memory of a block: the slice all its threads work on and thread 0's state. */
#define WEFT_DEV_SHARED_BYTES 8192

struct weft_dev_op {
    uint64_t count;       /* NCCL's count */
    const void *sendbuf;  /* device addresses */
    void *recvbuf;
    uint64_t seq;         /* the operation's number on the communicator, for reports */
    uint64_t divisor;     /* integer avg */
    uint64_t scalar;      /* premul scalar, the element type's bytes */
    const void *scalar_dev; /* or its device address (read when the kernel runs), or NULL */
    int32_t root;         /* root, or peer for send/recv */
    uint8_t coll;         /* enum weft_coll */
    uint8_t algo;         /* enum weft_algo, chosen by the host tuner */
    uint8_t dtype;        /* enum weft_dtype */
    uint8_t kind;         /* enum weft_red_kind */
    uint8_t has_redop;
    uint8_t premul;
    uint8_t postdiv;
    uint8_t block;        /* point-to-point: the block that runs it */
    uint8_t proto;        /* WEFT_DEV_PROTO_*, chosen alike by every rank (exec/cuda.c) */
    uint32_t sig;         /* signature hash sent with and checked on every slice; 0: no check */
};

/* struct weft_dev_op.proto: which FIFO of each connection the operation's slices take. */
#define WEFT_DEV_PROTO_SIMPLE 0 /* dev_fifo.h */
#define WEFT_DEV_PROTO_LL 1     /* dev_ll.h */

struct weft_dev_params {
    struct weft_dev_comm *comm; /* device address */
    int32_t nops;
    int32_t pad;
    /* Or NULL. A launch of one registered-buffer candidate (exec/cuda.c) follows a direct kernel
     * (struct weft_zc_params) that sets this word to 1 when it did the operation: then every
     * thread returns at once. */
    const uint32_t *skip;
    /* Or NULL. A launch holding collectives that no direct kernel precedes, on a communicator
     * with direct kernels: this rank's exchange slots [nblocks] (device). Each block first
     * publishes "not direct" there under the next direct sequence number, so that a peer's
     * direct kernel for a mismatched call (a candidate there, not here) votes no at once and the
     * normal kernels report the mismatch. Every rank publishes once per launch holding
     * collectives, by one kernel or the other, so the numbers stay in step. */
    struct weft_zc_slot *zc_mine;
    struct weft_dev_op ops[WEFT_DEV_MAX_OPS];
};

/*
 * The direct (zero-copy) kernel's exchange slot: one per rank and block, at the end of the rank's
 * device FIFO memory (exec/cuda.c), which every peer maps (raw pointers within a process, the p2p
 * transport across processes). A block writes its fields, then seq (release, system scope); with
 * a second round (ranks in several processes) its vote; after the data movement (or the decision
 * to fall back) done. seq and done count this block's direct launches on the communicator: equal
 * on every rank, since every rank launches the direct kernel for the same operations, so they
 * stay right under graph replays.
 */
#define WEFT_ZC_NOT_DIRECT (~(uint64_t)0) /* call: a normal kernel's "not direct" */
struct weft_zc_slot {
    uint64_t seq, done;
    uint64_t call;   /* coll | dtype << 8 | kind << 16 | has_redop << 24 | premul << 25 */
    uint64_t count;
    uint64_t scalar; /* this rank's PreMulSum scalar (element bits) */
    uint64_t reg;    /* 1: both buffers registered on this communicator */
    uint64_t send, recv; /* raw pointers (peers of this process use them) */
    /* For peers in other processes: the registrations' share ids (0: not shared) and the
     * buffers' offsets in the shared allocations (struct weft_zc_import). */
    uint64_t send_id, send_off, recv_id, recv_off;
    uint64_t vote; /* second round: 2 seq + 1 when this rank can reach every peer's buffers */
    uint64_t pad[3];
};

/* A peer's shared allocation this process mapped (id 0: a free entry). */
#define WEFT_ZC_MAX_IMPORTS 32
struct weft_zc_import {
    uint64_t id;
    uint64_t base; /* device view here */
    uint64_t size;
    uint64_t pad;
};

/* What this rank sees of peer k (pinned host memory, written by the host). */
struct weft_zc_peer {
    uint64_t slots; /* device address here of k's slots [nblocks] */
    uint32_t local; /* 1: k is a thread of this process (its raw pointers hold here) */
    uint32_t pad[5];
    struct weft_zc_import imp[WEFT_ZC_MAX_IMPORTS];
};

struct weft_zc_params {
    const struct weft_dev_comm *comm; /* abort word, deadline, stuck records */
    const struct weft_zc_peer *peers; /* [nranks], device view */
    uint32_t *skip;                   /* this rank's skip word (weft_dev_params.skip) */
    uint64_t *runs;                   /* this rank's count of direct runs (host reads it) */
    int32_t reg;                      /* this rank's buffers are registered */
    int32_t vote2;                    /* 1: a second round (some peer in another process) */
    uint64_t send_id, send_off, recv_id, recv_off; /* this rank's shares (weft_zc_slot) */
    struct weft_dev_op op;
};

/* The communicator's device state (device memory, written by the host at init). */
struct weft_dev_comm {
    int32_t rank;
    int32_t nranks;
    int32_t nchannels;   /* collective channels = blocks; connection channel nchannels is p2p */
    int32_t local_ranks; /* for the HIER schedule */
    int32_t nwin;        /* step windows per block: 1 + 2 * nranks */
    int32_t pad;
    uint64_t slot_bytes;  /* payload of a slot, a multiple of 16 */
    uint64_t ll_payload;  /* data bytes of an LL slot, a multiple of 16 */
    uint64_t timeout_ns;  /* no progress for this long: the kernel gives up (0: never) */
    const uint32_t *abort;         /* pinned host word, device view; nonzero: leave */
    struct weft_dev_stuck *stuck;  /* [nchannels] pinned host records, device view */
    const int *ring;               /* [nranks] device memory, or NULL for rank order */
    const int *ring_pos;
    struct weft_step *steps;       /* [nchannels][nwin][WEFT_DEV_WINDOW] */
    struct weft_dev_conn *conns;   /* [(nchannels + 1) * nranks] */
    /* Or NULL. [nchannels] pinned host words, device view: thread 0 of block b of either kernel
     * stores 1 in busy[b] when the block starts and 0 when it leaves. The host's liveness watch
     * (exec/cuda.c) reads them instead of querying the stream, which CUDA forbids while any
     * stream of the process captures (global mode). */
    uint32_t *busy;
};

/* The window of steps of connection key `key` in block b (key 0: collectives, 1 + 2 peer + dir:
 * point-to-point with peer, dir 0 send, 1 receive). */
WEFT_HD uint64_t weft_dev_win_index(int b, int nwin, int key)
{
    return ((uint64_t)b * (uint64_t)nwin + (uint64_t)key) * WEFT_DEV_WINDOW;
}

#endif
