/*
 * Transports as tables. Each transport fills one struct weft_transport with designated
 * initialisers; the communicator picks one per peer (src/core/comm.c, weft_comm_connect) and never
 * tests a name or a NULL slot: every slot is filled, with a stub where a transport has nothing to
 * do. One communicator may use several transports at once (shm inside a host, net or socket
 * across).
 *
 * A transport's job is to give each rank, for every channel and every peer it connects to, a
 * send and a receive struct weft_conn (fifo.h) whose FIFO the host step engine can read and
 * write directly: shm maps the peers' memory; socket and net fill local FIFOs from a proxy thread.
 * It gets what it needs in a context (struct weft_transport_ctx, the communicator's, valid until
 * close) and hands back what it made in an output (struct weft_transport_out), which the core
 * copies into the communicator: no transport reads or writes struct ncclComm.
 *
 * Versioning: `version` comes first; slots are only ever added at the end.
 * Version 2: setup/close carry the transport's per-communicator state; slot_bytes added.
 * Version 3: a context in, an output out; peer_departed, peer_lock_fd, settings and cost.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "algo/cost.h"
#include "dev_fifo.h"
#include "fifo.h"
#include "nccl.h"

struct weft_bootstrap;
struct weft_peer_info;
struct weft_net;

#define WEFT_TRANSPORT_VERSION 3

/* What the core gives every transport of a communicator, host and device (read-only for them). */
struct weft_transport_ctx {
    int rank, nranks;
    uint64_t comm_hash;
    const struct weft_peer_info *peers; /* [nranks], as exchanged at init */
    struct weft_bootstrap *bootstrap;
    volatile uint32_t *abort_flag;        /* set by ncclCommAbort: every wait ends */
    volatile ncclResult_t *async_error;   /* an operation failed (0: none) */
    int nchannels;    /* connection channels: 0 .. nchannels (the last is point-to-point) */
    int ll;           /* an LL FIFO beside each channel's FIFO (NCCL_PROTO allows LL somewhere) */
    size_t slot_bytes; /* of every connection (the largest any transport in use wants) */
    int oversubscribed; /* more ranks than cores on this host: proxies must not spin */
    const struct weft_net *net; /* the network across hosts (transports/net), NULL: built in */
    int cuda_dev;               /* this rank's CUDA device (device transports), -1: none */
    struct weft_doorbell *bell; /* the rank's doorbell when an earlier transport made one */
    /* A connection failed (any thread, typically a proxy): the first call records msg for the
     * rank's waits, which fail their operation with res. The caller logged the cause and rings
     * the rank's doorbell. */
    void (*fail)(void *arg, ncclResult_t res, const char *msg);
    void *fail_arg;
};

/* Records a connection failure through ctx->fail, formatted. */
static inline void weft_transport_fail(const struct weft_transport_ctx *ctx, ncclResult_t res,
                                       const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void weft_transport_fail(const struct weft_transport_ctx *ctx, ncclResult_t res,
                                       const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctx->fail(ctx->fail_arg, res, msg);
}

/* What setup hands back. The core owns chan_peers and clears the rest before each setup. */
struct weft_transport_out {
    struct weft_peer_conns *const *chan_peers; /* [nchannels + 1][nranks]: fill the entries of
                                                * the peers in peer_mask */
    struct weft_doorbell *bell; /* a doorbell this transport made for the rank (ctx->bell NULL) */
    int proxied;                /* a proxy thread of this process moves some of its data */
};

struct weft_transport {
    uint32_t version;
    const char *name;
    /*
     * 1 if this transport can connect ranks a and b of the communicator (peer info already
     * exchanged; a may equal b). Symmetric, and computed from exchanged peer info only, so every
     * rank gives the same answer for every pair: the communicator asks the transports in a fixed
     * order and takes the first that says yes. Non-blocking, called by the init thread.
     */
    int (*can_connect)(const struct weft_transport_ctx *ctx, int a, int b);
    /*
     * The slot size (bytes, header included) this transport wants, after checking its knob
     * (ncclInvalidArgument with a message when the knob is out of range). Every connection of a
     * communicator uses one slot size, ctx->slot_bytes: the largest wanted by the transports in
     * use, because both ends of every connection must cut steps into the same slices.
     * Non-blocking; called by the init thread before setup.
     */
    ncclResult_t (*slot_bytes)(const struct weft_transport_ctx *ctx, size_t *bytes_p);
    /*
     * Collective over the communicator (uses its bootstrap): every rank calls it when any pair of
     * ranks uses this transport, with peer_mask possibly all zero. Creates this rank's resources
     * and connects to the peers with peer_mask[peer] != 0, filling out->chan_peers[c][peer] for
     * every channel c in 0 .. ctx->nchannels, with slots of ctx->slot_bytes; makes the rank's
     * doorbell (out->bell) when ctx->bell is NULL and it has one to offer (a doorbell the rank
     * sleeps on and peers or proxies ring). Blocks until the peers have done the same, bounded by
     * the bootstrap deadline and the abort flag. *state_p is set only on success; it is handed
     * back to close and the other slots. Called once per communicator by its init thread.
     */
    ncclResult_t (*setup)(const struct weft_transport_ctx *ctx, const uint8_t *peer_mask,
                          struct weft_transport_out *out, void **state_p);
    /*
     * Frees what setup created (state may be NULL; its doorbell too: the core stops using it
     * first). Waits for no peer acknowledgement (peers may be dead): data this rank posted before
     * is handed to the network first, bounded by a short deadline and skipped after
     * ncclCommAbort. Transports close in reverse setup order.
     */
    ncclResult_t (*close)(const struct weft_transport_ctx *ctx, void *state);
    /* ---- version 3: a peer's liveness, for the waits' messages (any thread) ---- */
    /* 1 once peer p, which this transport connects, destroyed the communicator after its part
     * was done (a clean departure); 0 when it did not or nobody can tell. */
    int (*peer_departed)(void *state, int p);
    /* A descriptor on which peer p's process holds a lock while it lives (F_OFD_GETLK tells,
     * across PID namespaces), or -1. */
    int (*peer_lock_fd)(void *state, int p);
    /*
     * The knobs of this transport that every rank must hold alike (slot sizes, links per peer):
     * up to WEFT_TRANSPORT_MAX_SETTINGS names (the environment variables) and this process's
     * values. Returns how many. The core compares them across ranks at init, by position, for
     * every transport whether used or not, and names each that differs (core/comm.c). Any thread.
     */
    int (*settings)(const char **names, int64_t *values);
    /*
     * What a message between two hosts costs through this transport, for the tuner's model
     * (algo/cost.h; a hop inside a host is shm's): steps of chunk_bytes, oversubscribed when some
     * machine of the communicator runs more ranks than cores. Called on every rank for the
     * transport that carries the traffic between hosts, and every rank must get the same numbers
     * (its algorithm choices must agree): from the arguments and constants only, never from this
     * host's hardware. Any thread.
     */
    void (*cost)(struct weft_cost_fabric *f, double chunk_bytes, int oversubscribed);
};

#define WEFT_TRANSPORT_MAX_SETTINGS 4

/* settings for a transport without such knobs */
static inline int weft_transport_no_settings(const char **names, int64_t *values)
{
    (void)names, (void)values;
    return 0;
}

/*
 * Device transports: memory the CUDA executor's kernels of two ranks share (exec/cuda.c lays the
 * FIFOs out, kernels/dev_fifo.h). A rank owns up to WEFT_DEV_NREGIONS regions of one size: its
 * device FIFOs, and FIFOs in pinned host memory mapped for every device (for peers whose device
 * cannot reach its device). Ranks that are threads of one process share raw pointers; the p2p
 * transport (transports/p2p) shares regions between processes of one host.
 * Version 1. Version 2: reg_share, reg_unshare, reg_poll (registered buffers across processes).
 * Version 3: drain (before a communicator's regions are freed).
 */
#define WEFT_DEV_TRANSPORT_VERSION 3
#define WEFT_DEV_NREGIONS 2
#define WEFT_DEV_REGION_DEVICE 0
#define WEFT_DEV_REGION_HOST 1

/* How a region was made and is shared (mem_alloc's *how_p, and on the wire). */
enum weft_dev_how {
    WEFT_DEV_HOW_NONE = 0,   /* no such region */
    WEFT_DEV_HOW_FD = 1,     /* mem_create: exported as a file descriptor (cuMem, host memfd) */
    WEFT_DEV_HOW_LEGACY = 2, /* malloc: a legacy CUDA IPC handle */
};

struct weft_dev_transport {
    uint32_t version;
    const char *name;
    /* 1 if ranks a and b (both with devices) share FIFO memory through this transport. From
     * exchanged peer info only (the same answer on every rank). Non-blocking. */
    int (*can_connect)(const struct weft_transport_ctx *ctx, int a, int b);
    /* Region `region` (WEFT_DEV_REGION_*) of this rank, bytes long, in memory this transport can
     * share (device regions on the current device); *how_p says how it was made, for mem_free.
     * Blocking; the init thread. Not zeroed. */
    ncclResult_t (*mem_alloc)(const struct weft_transport_ctx *ctx, size_t bytes, int region, void **p_p,
                              int *how_p);
    /* Frees a region from mem_alloc (any thread of this process, once no kernel of this process
     * uses it; peers that mapped it keep their mapping valid where the backend allows). */
    ncclResult_t (*mem_free)(void *p, int how);
    /*
     * Collective over the communicator (every rank calls it, with `want` possibly all zero):
     * shares this rank's regions (mine[r], NULL for none, made as mine_how[r]; all regions of all
     * ranks are `bytes` long) and maps region r of peer p into this process wherever
     * want[p * WEFT_DEV_NREGIONS + r]: theirs[p * WEFT_DEV_NREGIONS + r] (NULL elsewhere). want
     * is symmetric (peer p's want for this rank equals this rank's want for p), so each rank
     * knows whom to send what. Blocks until the peers have done the same, bounded by the
     * bootstrap deadline and the abort flag. *state_p (set only on success) goes back to close.
     */
    ncclResult_t (*setup)(const struct weft_transport_ctx *ctx, void *const *mine, const int *mine_how,
                          size_t bytes, const uint8_t *want, void **theirs, void **state_p);
    /* Unmaps what setup and reg_poll mapped (after this rank's kernels are done; peers may be
     * gone). */
    ncclResult_t (*close)(const struct weft_transport_ctx *ctx, void *state);

    /* ---- version 2: user buffers registered with ncclCommRegister (state from setup) ---- */
    /*
     * Offers the allocation at base (bytes long; how: WEFT_DEV_HOW_FD from mem_create,
     * WEFT_DEV_HOW_LEGACY from malloc) to every peer setup connected, under id (this rank's,
     * never reused). Non-blocking: what a peer cannot take now is sent by a later reg_poll. 0,
     * or a CUDA error code (the export failed; nothing offered).
     */
    int (*reg_share)(const struct weft_transport_ctx *ctx, void *state, uint64_t id, void *base, size_t bytes,
                     int how);
    /* Withdraws id: the peers unmap it at their next reg_poll. */
    void (*reg_unshare)(const struct weft_transport_ctx *ctx, void *state, uint64_t id);
    /*
     * Non-blocking, on the thread whose current device is this rank's: sends what waits, maps
     * what peers offered since and unmaps what they withdrew, telling seen(arg, peer, id, base,
     * bytes) first (base NULL: withdrawn, after which no kernel of this rank may touch it).
     * seen returns 0 to have a new mapping dropped at once.
     */
    void (*reg_poll)(const struct weft_transport_ctx *ctx, void *state,
                     int (*seen)(void *arg, int peer, uint64_t id, void *base, size_t bytes),
                     void *arg);

    /* ---- version 3 ---- */
    /*
     * At communicator free, before close and before this rank's regions are freed: unmaps the
     * peers' regions (what close would) and, where some rank shares a region by a legacy handle
     * (freeing one that a peer still maps lets the peer's last writes fault), waits until every
     * rank has done the same: collective then, bounded by the bootstrap deadline and the abort
     * flag. ncclSuccess: this rank's regions may be freed. Otherwise (ncclCommAbort, the deadline,
     * a peer gone, several ranks in one process: they may be destroyed one after another by one
     * thread, so no barrier) legacy regions must be kept (leaked), never freed under a peer.
     */
    ncclResult_t (*drain)(const struct weft_transport_ctx *ctx, void *state);
};

extern const struct weft_dev_transport weft_dev_transport_p2p;

/*
 * Device FIFOs across hosts: a bridge (a proxy of this rank) carries the connections with peers on
 * other hosts (xhost[p] != 0). Both ends of such a connection live in this rank's pinned host
 * memory, mapped for the device: the receive block and the head word in its host FIFOs (`fifo`,
 * the host view, dev_fifo.h layout), and for each such peer a shadow (`shadow[p]`,
 * weft_dev_shadow_bytes, zeroed) that stands in for the peer's memory: the kernel posts its sends
 * to p into weft_dev_shadow_send_rc (tail, bytes, sig, then the slots) and frees p's steps into
 * weft_dev_shadow_recv_sc. So the kernel sees an ordinary host-memory connection.
 *
 * setup is collective over the communicator (every rank calls it when any pair of ranks is on two
 * hosts). A peer found dead sets *dead_peer (when -1) and *abort_word (the kernels stop). close
 * stops the proxy (posted data is handed to the network first, within 5 s) after this rank's
 * kernels are done; the memory stays the caller's. Which bridge a communicator uses follows its
 * network (core/comm.c: comm->dev_bridge): the socket bridge (transports/socket/dev_socket.c)
 * with the built-in socket transport, the net bridge (transports/net/dev_net.c) with a provider.
 * Version 1.
 */
#define WEFT_DEV_BRIDGE_VERSION 1

struct weft_dev_bridge {
    uint32_t version;
    const char *name;
    ncclResult_t (*setup)(const struct weft_transport_ctx *ctx, const uint8_t *xhost, int nconn, size_t slot_bytes,
                          char *fifo, char *const *shadow, int *dead_peer, uint32_t *abort_word,
                          void **state_p);
    ncclResult_t (*close)(const struct weft_transport_ctx *ctx, void *state);
};

extern const struct weft_dev_bridge weft_dev_bridge_socket;
extern const struct weft_dev_bridge weft_dev_bridge_net;

/* A shadow: nconn receive blocks (control, then the slots), then nconn head words. */
static inline size_t weft_dev_shadow_bytes(int nconn, size_t slot_bytes)
{
    return (size_t)nconn *
           (weft_dev_recv_block_bytes(slot_bytes) + sizeof(struct weft_dev_send_ctrl));
}

static inline struct weft_dev_recv_ctrl *weft_dev_shadow_send_rc(int nconn, size_t slot_bytes,
                                                                 char *shadow, int c)
{
    (void)nconn;
    return (struct weft_dev_recv_ctrl *)(shadow +
                                         (size_t)c * weft_dev_recv_block_bytes(slot_bytes));
}

static inline struct weft_dev_send_ctrl *weft_dev_shadow_recv_sc(int nconn, size_t slot_bytes,
                                                                 char *shadow, int c)
{
    return (struct weft_dev_send_ctrl *)(shadow +
                                         (size_t)nconn * weft_dev_recv_block_bytes(slot_bytes)) +
           c;
}

extern const struct weft_transport weft_transport_shm;
extern const struct weft_transport weft_transport_net;
extern const struct weft_transport weft_transport_socket;

/* For transports with nothing to tell through a version 3 slot: no departure, no lock. */
static inline int weft_transport_never_departed(void *state, int p)
{
    (void)state, (void)p;
    return 0;
}
static inline int weft_transport_no_lock_fd(void *state, int p)
{
    (void)state, (void)p;
    return -1;
}

#endif
