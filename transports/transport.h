/*
 * Transports as tables. Each transport fills one struct weft_transport with designated
 * initialisers; the communicator picks one per peer (src/core/comm.c, weft_comm_connect) and never
 * tests a name or a NULL slot: every slot is filled, with a stub where a transport has nothing to
 * do. One communicator may use several transports at once (shm inside a host, socket across).
 *
 * A transport's job is to give each rank, for every channel and every peer it connects to, a
 * send and a receive struct weft_conn (exec/lane.h) whose FIFO the host step engine can read and
 * write directly: shm maps the peers' memory; socket fills local FIFOs from a proxy thread.
 *
 * Versioning: `version` comes first; slots are only ever added at the end.
 * Version 2: setup/close carry the transport's per-communicator state; slot_bytes added.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;

#define WEFT_TRANSPORT_VERSION 2

struct weft_transport {
    uint32_t version;
    const char *name;
    /*
     * 1 if this transport can connect ranks a and b of the communicator (peer info already
     * exchanged; a may equal b). Symmetric, and computed from exchanged peer info only, so every
     * rank gives the same answer for every pair: the communicator asks the transports in a fixed
     * order and takes the first that says yes. Non-blocking, called by the init thread.
     */
    int (*can_connect)(const struct ncclComm *comm, int a, int b);
    /*
     * The slot size (bytes, header included) this transport wants, after checking its knob
     * (ncclInvalidArgument with a message when the knob is out of range). Every connection of a
     * communicator uses one slot size, comm->slot_bytes: the largest wanted by the transports in
     * use, because both ends of every connection must cut steps into the same slices.
     * Non-blocking; called by the init thread before setup.
     */
    ncclResult_t (*slot_bytes)(const struct ncclComm *comm, size_t *bytes_p);
    /*
     * Collective over the communicator (uses its bootstrap): every rank calls it when any pair of
     * ranks uses this transport, with peer_mask possibly all zero. Creates this rank's resources
     * and connects to the peers with peer_mask[peer] != 0, filling comm->chan_peers[c][peer] (the
     * communicator owns the arrays) for every channel c in 0 .. comm->nchannels (the last is
     * point-to-point), with slots of comm->slot_bytes. Sets comm->bell when it is still NULL (a
     * doorbell the rank sleeps on and peers or proxies ring). Blocks until the peers have done
     * the same, bounded by the bootstrap deadline and abort flag. *state_p is set only on
     * success; it is handed back to close. Called once per communicator by its init thread.
     */
    ncclResult_t (*setup)(struct ncclComm *comm, const uint8_t *peer_mask, void **state_p);
    /*
     * Frees what setup created (state may be NULL). Waits for no peer acknowledgement (peers may be
     * dead): data this rank posted before is handed to the network first, bounded by a short
     * deadline and skipped after ncclCommAbort. Transports close in reverse setup order.
     */
    ncclResult_t (*close)(struct ncclComm *comm, void *state);
};

extern const struct weft_transport weft_transport_shm;
extern const struct weft_transport weft_transport_socket;

#endif
