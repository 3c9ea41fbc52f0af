/*
 * Bootstrap: the out-of-band TCP network every communicator starts with.
 *
 * weft_bootstrap_get_unique_id() makes the 128-byte ncclUniqueId the user hands to every rank. It
 * holds a random 64-bit magic, a random 32-byte secret and the address of a "root": a detached
 * thread listening on a TCP
 * port, which serves the rendezvous of exactly one communicator and then exits. Each rank's
 * weft_bootstrap_init() opens its own listening socket, sends (rank, nranks, listen address) to
 * the root, and gets back every rank's address once all nranks ranks have arrived. It then
 * connects to rank+1 and accepts rank-1, forming a ring; connections to other peers are made on
 * first use. Each TCP connection carries messages one way only (the connecting side sends).
 *
 * With NCCL_COMM_ID=<host:port> (or [ipv6]:port) set, the id encodes that address and a magic
 * derived from it, so every process may compute the id itself; no thread is started then, and
 * rank 0 runs the root inside weft_bootstrap_init() instead. Its secret is then derived from
 * WEFT_SECRET, or all zero without it (nothing is authenticated then, as with NCCL).
 *
 * Authentication: every connection (rank to root, rank to rank) starts with a challenge-response
 * on the secret, both ways (wire.h); a rank is admitted only after it. An admission thread per
 * handle serves the listening socket and the unfinished handshakes from init to close, whatever
 * the caller's thread does (waits, computes, sleeps), so a first message to a rank never waits for
 * that rank to call in, and stray, silent (WEFT_BS_ADMIT_MS), garbage or unauthenticated
 * connections are dropped without holding anything up or changing anything.
 *
 * Guarantees:
 *   - Every wait polls with short timeouts, checks *abort_flag (when not NULL) and ends at a
 *     deadline of WEFT_BOOTSTRAP_TIMEOUT seconds (default 120; <= 0 means no deadline) counted
 *     from the start of each call. Connections refused for WEFT_SOCKET_CONNECT_TIMEOUT seconds
 *     (default 20) fail: a stale id (root gone) is an error within that time, never a hang.
 *   - Everything read from the wire is checked (wire.c's pure parsers): version, magic (two jobs
 *     never mix), type, lengths (before any allocation), rank numbers, MACs. Messages that arrive
 *     before they are asked for are kept up to WEFT_BS_MAX_UNEXPECTED (count and bytes) per rank;
 *     more is an error naming the peer. A rank whose nranks differs from another's, or a rank
 *     number used twice, makes the root fail the rendezvous on every rank with a message naming
 *     the rank.
 *   - Ranks may be threads of one process or separate processes; any number of communicators
 *     may bootstrap concurrently (no global state besides the cached interface choice).
 *
 * Threads: all functions block the calling thread. Calls on one handle must not overlap (the
 * caller serialises them); different handles are independent. Each handle owns one admission
 * thread (above), started by init and joined by close.
 * Errors: ncclInvalidArgument (bad arguments or unique id), ncclInvalidUsage (ranks disagree:
 * nranks, duplicate rank, message size), ncclRemoteError (a peer closed its connection),
 * ncclSystemError (timeouts, abort, system calls). After an error other than ncclInvalidArgument
 * the handle may only be closed. Each error is logged once with WEFT_WARN where it is detected
 * (abort only at INFO level).
 */
#ifndef WEFT_BOOTSTRAP_BOOTSTRAP_H
#define WEFT_BOOTSTRAP_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct weft_bootstrap; /* opaque: one rank's view of one communicator's bootstrap network */

/*
 * Fills *id (all 128 bytes). Without NCCL_COMM_ID: picks an interface (NCCL_SOCKET_IFNAME,
 * NCCL_SOCKET_FAMILY), opens a listening socket and starts the detached root thread, which
 * exits after serving one communicator, or after WEFT_BOOTSTRAP_TIMEOUT seconds if not all ranks
 * came (replying an error naming the missing ranks to those that did). Does not block.
 * With NCCL_COMM_ID: only encodes the address (ncclInvalidArgument if it does not parse).
 */
ncclResult_t weft_bootstrap_get_unique_id(ncclUniqueId *id);

/*
 * Like weft_bootstrap_get_unique_id without NCCL_COMM_ID, whatever the environment says: a fresh
 * magic and secret and a root thread on this host. For ids made inside the library and handed to
 * the other ranks over an existing communicator (split, shrink), which NCCL_COMM_ID's one fixed
 * address cannot serve.
 */
ncclResult_t weft_bootstrap_fresh_id(ncclUniqueId *id);

/*
 * Collective over nranks ranks holding the same id: returns once every rank has reached the
 * root and this rank's ring connections are up. Validates 0 <= rank < nranks and the id
 * (ncclInvalidArgument for a zeroed, garbage or foreign id). abort_flag may be NULL; it must
 * stay valid until weft_bootstrap_close(). *bs_p is set only on success.
 */
ncclResult_t weft_bootstrap_init(const ncclUniqueId *id, int rank, int nranks,
                                 volatile uint32_t *abort_flag, struct weft_bootstrap **bs_p);

/*
 * All-gather over the ring: data holds nranks * size bytes, this rank's block at rank * size
 * (read), the others' blocks are written. size may be 0. Collective; the caller owns data.
 */
ncclResult_t weft_bootstrap_allgather(struct weft_bootstrap *bs, void *data, size_t size);

/* Returns once every rank has entered the barrier. Collective. */
ncclResult_t weft_bootstrap_barrier(struct weft_bootstrap *bs);

/*
 * Tagged point-to-point messages. send connects to peer on first use and returns once the
 * message is handed to the kernel (it blocks until peer receives when the message exceeds the
 * socket buffers, so two ranks must not both send large messages to each other before
 * receiving). recv returns the oldest message from peer with this tag; messages with other tags
 * that arrive first are kept until asked for. Sizes must match exactly (ncclInvalidUsage
 * otherwise). peer may be this rank.
 */
ncclResult_t weft_bootstrap_send(struct weft_bootstrap *bs, int peer, int tag, const void *data,
                                 size_t size);
ncclResult_t weft_bootstrap_recv(struct weft_bootstrap *bs, int peer, int tag, void *data,
                                 size_t size);

/*
 * weft_bootstrap_send bounded by timeout_ms instead of WEFT_BOOTSTRAP_TIMEOUT (connecting
 * included: a peer that closed its bootstrap refuses connections until the deadline). For notes a
 * waiting rank sends its peers (exec/sig.c), which must not hold it up.
 */
ncclResult_t weft_bootstrap_send_brief(struct weft_bootstrap *bs, int peer, int tag,
                                       const void *data, size_t size, int timeout_ms);

/*
 * Non-blocking receive of the oldest message with this tag from any peer: *got_p is 1 and
 * *peer_p names the sender when one was there (already kept, or readable now), 0 otherwise.
 * Reads only messages whose first bytes have arrived on admitted connections (a message
 * is written whole by its sender, so the rest follows at once). A peer whose connection closed
 * is dropped silently (it left). Sizes must match (ncclInvalidUsage otherwise). For the
 * executor's fault checks (exec/sig.c), off every fast path.
 */
ncclResult_t weft_bootstrap_try_recv(struct weft_bootstrap *bs, int tag, void *data, size_t size,
                                     int *peer_p, int *got_p);

/* Broadcast of size bytes from root's data to every rank's data, along the ring. Collective. */
ncclResult_t weft_bootstrap_bcast(struct weft_bootstrap *bs, int root, void *data, size_t size);

/*
 * Closes every connection and frees the handle (messages never received are dropped, with an
 * INFO line). Not collective and does not block; NULL is accepted.
 */
ncclResult_t weft_bootstrap_close(struct weft_bootstrap *bs);

/* The id's 64-bit magic (for naming shared-memory segments etc.); 0 for an invalid id. */
uint64_t weft_bootstrap_magic(const ncclUniqueId *id);

/*
 * The communicator's 32-byte secret from its unique id (all zero when it has none: NCCL_COMM_ID
 * without WEFT_SECRET). Other connections of the communicator (the socket transport) prove they
 * know it the same way (core/auth.h). Valid until weft_bootstrap_close().
 */
const uint8_t *weft_bootstrap_key(const struct weft_bootstrap *bs);

/* Number of root threads still running in this process (for tests and leak checks). */
int weft_bootstrap_roots_active(void);

#endif
