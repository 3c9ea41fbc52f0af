/*
 * Transports as tables. Each transport fills one struct weft_transport with designated
 * initialisers; the communicator picks one per peer (src/core/topo.c) and never tests a name or
 * a NULL slot: every slot is filled, with a stub where a transport has nothing to do.
 *
 * A transport's job is to give each rank, for every channel and every peer it connects to, a
 * send and a receive struct weft_conn (exec/lane.h) whose FIFO the host step engine can read and
 * write directly: shm maps the peers' memory; socket (later) fills local FIFOs from a proxy thread.
 *
 * Versioning: `version` comes first; slots are only ever added at the end.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stdint.h>

#include "nccl.h"

struct ncclComm;

#define WEFT_TRANSPORT_VERSION 1

struct weft_transport {
    uint32_t version;
    const char *name;
    /*
     * 1 if this transport can connect the calling rank with `peer` (peer info already exchanged).
     * Non-blocking, called by the init thread.
     */
    int (*can_connect)(const struct ncclComm *comm, int peer);
    /*
     * Collective over the communicator (uses its bootstrap): creates this rank's resources and
     * connects to the peers with peer_mask[peer] != 0, filling comm->chan_peers[c][peer] for
     * every channel c in 0 .. comm->nchannels (the last is point-to-point). Blocks until the peers
     * have done the same, bounded by the bootstrap deadline and abort flag. Called once per
     * communicator by its init thread.
     */
    ncclResult_t (*setup)(struct ncclComm *comm, const uint8_t *peer_mask);
    /* Frees what setup created. Never waits for peers (they may be dead). */
    ncclResult_t (*close)(struct ncclComm *comm);
};

extern const struct weft_transport weft_transport_shm;

#endif
