/*
 * The network a communicator uses across hosts: a provider with NCCL's net plugin semantics
 * (net_abi.h, ncclNet_v11_t), chosen as NCCL 2.28 chooses it (plugin.c):
 *
 *   - external plugins first, from NCCL_NET_PLUGIN (a comma list of names or paths; unset:
 *     libnccl-net.so; "none": no external plugin). A name without '/' that is not lib*.so is
 *     also tried as libnccl-net-<name>.so. The newest of ncclNetPlugin_v11 .. _v8 a library
 *     exports is used; older tables are adapted to v11. A library stays loaded once opened.
 *   - then the built-in providers: "Socket" (today the socket transport, transports/socket; it
 *     becomes a provider of this table next).
 *   - NCCL_NET (or ncclConfig_t.netName) keeps only the provider of that name (case ignored),
 *     compared with the table's name before init; none of that name: ncclInvalidUsage.
 *   - a provider whose init fails, or that reports no device, is finalized and skipped for the
 *     rest of the process, with an INFO line naming why; the next one is tried.
 *
 * The choice is made per communicator at init, before the peer exchange, and every rank must
 * make the same one: weft_net_id goes into the settings every rank compares (core/comm.c).
 */
#ifndef WEFT_TRANSPORTS_NET_H
#define WEFT_TRANSPORTS_NET_H

#include <stdint.h>

#include "net_abi.h"

/* A communicator's network: the provider's table and its per-communicator context. */
struct weft_net {
    const ncclNet_v11_t *table;    /* every call goes through it (v11: the plugin's own table) */
    void *ctx;                     /* from init; handed to listen, connect, finalize */
    const char *name;              /* the table's name, read after init */
    int version;                   /* of the plugin's table: 11 .. 8 */
    const char *path;              /* the library it came from */
    ncclNetProperties_v11_t props; /* of device 0 */
    int ndev;
};

/*
 * Chooses the network for a new communicator (comm_hash and trafficClass go to a v11 plugin's
 * init; net_name: ncclConfig_t.netName, NULL for none; NCCL_NET overrides it). *net_p is NULL
 * when the built-in socket transport carries the traffic, else a network to free with
 * weft_net_close. Errors: ncclInvalidUsage when NCCL_NET names no usable network.
 */
ncclResult_t weft_net_open(uint64_t comm_hash, int traffic_class, const char *net_name,
                           struct weft_net **net_p);
/* Finalizes the provider's context (the library stays loaded); NULL is accepted. */
void weft_net_close(struct weft_net *net);
/* A number equal on two ranks exactly when they chose the same network (0: built-in socket). */
int64_t weft_net_id(const struct weft_net *net);

#endif
