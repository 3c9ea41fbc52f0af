/*
 * Zero-copy collectives on registered host buffers (NCCL's "direct" mode, host part).
 *
 * When every rank of a communicator runs on one machine, an all-reduce, all-gather or
 * reduce-scatter of at least WEFT_ZCOPY_MIN_BYTES (a setting every rank must share) is a
 * candidate: instead of moving its data through the FIFOs, each rank reads and writes its peers'
 * user buffers directly, where every rank registered them (ncclCommRegister) and could map them.
 * Candidacy depends only on values every rank shares (the knob, the collective, its size, the
 * ranks' machines); whether the buffers are registered and mappable is exchanged per operation:
 *
 *   1. descriptors: a small all-gather (a lane of the DIRECT all-gather schedule on channel 0's
 *      connections, carrying the operation's signature) of each rank's buffers: registered?, the
 *      memfd behind them (its fd number in the owner, st_dev, st_ino, size), the offset and the
 *      raw pointer, and a per-process nonce (equal nonce and pid: one address space, the raw
 *      pointer is valid);
 *   2. each rank maps what it needs: in its own process the raw pointers; from another process
 *      the memfd, taken with pidfd_getfd (or /proc/<pid>/fd) and checked with fstat against the
 *      owner's st_dev, st_ino and size before it is mapped (another PID namespace, or a reused fd
 *      number, must never map the wrong memory). Mappings are cached on the communicator per
 *      (owner, memfd inode) and unmapped when it is freed; a mapping holds the memfd's pages, so
 *      one whose block the owner freed stays valid memory (it is simply never matched again);
 *      an all-gather's input it cannot map (unregistered) a rank reads instead, from another
 *      process of its PID namespace, with process_vm_readv straight into its output
 *      (where it pays, core/cma.h; a failed read is a no vote);
 *   3. votes: a second all-gather of "I could map (or read) everything": zero-copy only if every
 *      rank could; otherwise every rank runs the task's normal schedules (nothing was written
 *      yet but blocks of an all-gather's output the normal path writes again);
 *   4. the data: all-reduce: rank i reduces block i of every rank's input in rank order 0..n-1
 *      (deterministic, the operator's pre-multiplication once per input and integer avg's
 *      division at the end, as the normal path) and writes the result into block i of every
 *      rank's output (in place this touches only block i, which only rank i reads); all-gather:
 *      rank i copies every rank's input into its output; reduce-scatter: rank i reduces block i
 *      of every input into its output. Pieces of WEFT_ZCOPY_PIECE bytes, so a reduced piece is
 *      still in cache when it is copied to the peers;
 *   5. done: a third all-gather, so no rank returns (and lets its user touch its buffers) while
 *      a peer still reads or writes them.
 * The channel 0 lane of the task runs these phases (the controller); the task's lanes of other
 * channels wait until it decides, then run their schedules (fallback) or nothing (zero-copy), so
 * the lanes that follow on the same connections keep their order. Every phase is a lane of the
 * executor's round: it waits with the usual abort, deadline and liveness checks.
 *
 * Device buffers never come here (the CUDA executor runs them): they take the normal path.
 */
#ifndef WEFT_EXEC_ZCOPY_H
#define WEFT_EXEC_ZCOPY_H

#include <stdint.h>

#include "nccl.h"

struct ncclComm;
struct weft_task;
struct weft_lane;
struct weft_zcopy_op;

/* At init, once the settings are agreed: the least size of a zero-copy candidate on comm, from
 * values every rank exchanged (comm->zcopy_min_bytes), so the per-operation test is one compare. */
void weft_zcopy_setup(struct ncclComm *comm);

/* 1 when the task is a zero-copy candidate (from values every rank shares). */
int weft_zcopy_candidate(const struct weft_task *task);

/*
 * Makes `lane`, the task's channel 0 lane, already built with its normal schedule, the
 * controller: its schedule is kept for a fallback and the lane starts with the descriptor
 * exchange. Allocates from the executor's arena. NULL when out of memory (a warning is logged).
 */
struct weft_zcopy_op *weft_zcopy_begin(const struct weft_task *task, struct weft_lane *lane);

/*
 * For `lane`, a lane of the task on another channel: 1 while the controller has not decided
 * (the lane must wait); then 0, after emptying the lane (no steps) when the task ran zero-copy.
 * The executor may move its lanes in memory (fusion adds lanes as a group goes on), so the
 * controller keeps no pointer to them: each asks here.
 */
int weft_zcopy_gated(const struct weft_zcopy_op *zc, struct weft_lane *lane);

/*
 * Called when the controller lane finished its current phase: sets it up for the next one and
 * returns 1, or returns 0 when the task is complete. Runs the data phase itself (local memory
 * traffic only, it never waits).
 */
int weft_zcopy_next(struct weft_zcopy_op *zc, struct weft_lane *lane);

/* Unmaps the peers' buffers mapped for comm (at comm free). */
void weft_zcopy_fini(struct ncclComm *comm);

/* All-gathers that ran zero-copy reading some peers' unregistered inputs (process_vm_readv). */
uint64_t weft_zcopy_cma_count(struct ncclComm *comm);

#endif
