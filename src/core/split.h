/*
 * Communicators made from a communicator: ncclCommSplit (by color and key) and ncclCommShrink
 * (the parent less some excluded ranks). A child is a communicator of its own: a fresh unique id,
 * its own bootstrap, its own transport connections and abort flag.
 * The parent's bootstrap only carries the agreement on who joins which child and the child's
 * unique id; the parent stays usable afterwards and is freed independently of its children.
 *
 * The child is initialised like ncclCommInitRankConfig's: inside ncclGroupStart/End its init
 * runs at the outermost ncclGroupEnd, and a non-blocking config (blocking 0, which a NULL config
 * inherits from a non-blocking parent) returns ncclInProgress with *newcomm set at once. The
 * agreement over the parent's bootstrap always runs at call time, in the calling thread: one
 * thread that holds several ranks of the parent cannot split them inside one group (the first
 * call waits for the others until the bootstrap deadline). A non-blocking parent with an
 * operation (its init included) still in progress is refused with ncclInvalidArgument.
 *
 * Resources are never shared with the parent on the host path: config.splitShare and
 * config.shrinkShare are accepted (and inherited) but change nothing, because a host child's
 * resources are its shared-memory segments and bootstrap sockets, which are cheap and tied to
 * the child's own rank numbering.
 *
 * Use of the parent's bootstrap (struct weft_bootstrap of comm):
 *   - Split uses two bootstrap all-gathers, which every parent rank runs (it is collective). They
 *     travel as collective messages numbered by the bootstrap's own call sequence, a space apart
 *     from tagged point-to-point messages, so they cannot be confused with any tag. The number
 *     of collective calls stays equal on every rank, so later parent collectives stay in step.
 *   - Shrink cannot use a collective (excluded ranks do not call it and may be dead). It uses
 *     tagged point-to-point messages in the range reserved below. Nothing else in Weft may send
 *     bootstrap tags in [WEFT_SPLIT_TAG_FIRST, WEFT_SPLIT_TAG_LAST].
 */
#ifndef WEFT_CORE_SPLIT_H
#define WEFT_CORE_SPLIT_H

#include "nccl.h"

struct ncclComm;

/* Bootstrap tags reserved for this file ("WS" in the high half). */
#define WEFT_SPLIT_TAG_FIRST 0x57530000
#define WEFT_SPLIT_TAG_LAST 0x5753ffff
/* Shrink: the lowest surviving rank sends the child's unique id to each other survivor. */
#define WEFT_SPLIT_TAG_SHRINK_ID (WEFT_SPLIT_TAG_FIRST + 1)

/*
 * ncclCommSplit. Collective over every rank of comm; blocks the calling thread until the child
 * is initialised (but see groups and non-blocking configs above; every wait ends at the
 * bootstrap deadline, WEFT_BOOTSTRAP_TIMEOUT). color must be >= 0 or NCCL_SPLIT_NOCOLOR (the
 * rank takes part and gets *newcomm_p = NULL); other colors are rejected before any
 * communication with ncclInvalidArgument, so ranks that all pass a bad color all fail at once.
 * Ranks of one color form a child ordered by (key, parent rank). config NULL: the parent's
 * resolved config; otherwise the caller's, parsed and checked by the child's init, so a bad
 * config fails on every member after the exchange (the id's root thread then waits out its
 * deadline unused). *newcomm_p is written only on success. Errors of a color's first rank
 * (which makes the unique id) reach every rank of that color through the second all-gather, so
 * they fail together instead of waiting for a rendezvous that never comes.
 */
ncclResult_t weft_comm_split(struct ncclComm *comm, int color, int key, const ncclConfig_t *config,
                             struct ncclComm **newcomm_p);

/*
 * ncclCommShrink. Called by every rank of comm not in exclude[0 .. nexclude-1], and only by those;
 * the excluded ranks are never contacted (they may be dead). Validates, before any
 * communication: nexclude > 0 and exclude != NULL, every entry in [0, nranks), no duplicates, the
 * caller not excluded, flags NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT (all ncclInvalidArgument).
 * Survivors keep the parent's order with the gaps closed. The lowest survivor makes the unique
 * id and sends it, with a fingerprint of the exclude set, to each survivor (tag
 * WEFT_SPLIT_TAG_SHRINK_ID); survivors whose exclude set differs fail with ncclInvalidUsage.
 * Blocks like split; *newcomm_p is written only on success.
 *
 * NCCL_SHRINK_ABORT means "abort the parent's outstanding work first". Host collectives issued
 * without a stream run to completion in the calling thread before they return, so when the owner
 * of comm calls shrink nothing of the parent is outstanding and the flag needs no action. (Once
 * parent work can still be queued on a host stream when shrink is called, ABORT has to raise that
 * work's abort and wait for it to drain first.) The parent's abort flag itself is deliberately
 * not raised: the parent's bootstrap, which carries the unique id, polls that very flag and would
 * fail. The parent stays usable among live ranks; after a failure the caller should
 * ncclCommAbort it, which only frees local resources, whatever state the peers are in.
 */
ncclResult_t weft_comm_shrink(struct ncclComm *comm, const int *exclude, int nexclude,
                              const ncclConfig_t *config, int flags, struct ncclComm **newcomm_p);

#endif
