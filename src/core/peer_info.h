/*
 * What every rank tells the others at communicator init (struct weft_peer_info, all-gathered by
 * core/comm.c), on its own so that the transports, which read it through their context
 * (transport.h), see it without the communicator.
 */
#ifndef WEFT_CORE_PEER_INFO_H
#define WEFT_CORE_PEER_INFO_H

#include <stdint.h>

#define WEFT_HOSTNAME_LEN 64

/*
 * Settings that shape the wire or a schedule (channels, algorithm and protocol restrictions, the
 * direct and fusion limits, the network, and each transport's slot sizes and links): every rank
 * must hold the same, and init fails on every rank, naming each that differs and the ranks, when
 * one does (core/comm.c).
 */
#define WEFT_NSETTINGS 16
#define WEFT_SETTING_NCORE 8            /* the core's, first; then each transport's (transport.h) */
#define WEFT_SETTING_ZCOPY_MIN_BYTES 6  /* its index (weft_comm_settings) */
#define WEFT_SETTING_NET 7              /* the network across hosts (weft_net_id) */

/* What every rank tells the others at init. Fixed size: exchanged with the bootstrap all-gather.
 * Version 4: settings added. Version 5: WEFT_DETERMINISTIC among them. Version 6:
 * WEFT_ZCOPY_MIN_BYTES among them. Version 7: the device's uuid and PCI bus id. Version 8:
 * the network among the settings. */
#define WEFT_PEER_INFO_VERSION 8
struct weft_peer_info {
    uint32_t version;
    int32_t rank;
    int32_t pid;
    int32_t cuda_dev;
    uint64_t host_hash; /* same value = same host (shared memory reachable) */
    uint64_t comm_hash; /* must agree on every rank */
    uint32_t flags;     /* WEFT_PEER_* */
    int32_t ncpu;       /* cores the rank may run on; 0: unknown */
    char hostname[WEFT_HOSTNAME_LEN]; /* for messages that name the peer's host */
    uint64_t machine_hash; /* same value = same machine (boot id), whatever NCCL_HOSTID says */
    int64_t settings[WEFT_NSETTINGS];
    uint64_t pid_ns; /* inode of /proc/self/ns/pid (0: unknown): a pid means something to a
                      * peer only in the same PID namespace (containers on one host differ) */
    /* cuda_dev is an ordinal of the rank's process (CUDA_VISIBLE_DEVICES renumbers per process):
     * across processes the device is the uuid (same uuid = same GPU) and the PCI bus id (the
     * ordinal a peer's process gives it, if it sees it: cudaDeviceGetByPCIBusId). Zero without
     * a device. */
    uint8_t cuda_uuid[16];
    char cuda_bus_id[16];
};

/* The rank set NCCL_SHM_DISABLE: no pair that includes it uses shared memory. */
#define WEFT_PEER_NO_SHM 0x1u

#endif
