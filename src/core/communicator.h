/*
 * The communicator's state: struct ncclComm (the object behind the public ncclComm_t handle; its
 * name is NCCL's because the handle type is part of the ABI), what ranks exchange at init, and the
 * few calls every layer below the lifecycle makes on it (a peer's liveness and whereabouts, the
 * errors an operation or a proxy records). The lifecycle (init, free, holds, tickets) is
 * core/comm.h's, which the executors and transports never need: they see this.
 */
#ifndef WEFT_CORE_COMMUNICATOR_H
#define WEFT_CORE_COMMUNICATOR_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "algo/tuner.h"
#include "core/peer_info.h"
#include "fifo.h"
#include "transport.h"

#define WEFT_COMM_MAGIC 0x7765667463306d6dull /* "weftc0mm" */
#define WEFT_COMM_DEAD 0x646561642d636f6dull /* "dead-com" */
#define WEFT_MAX_CHANNELS 16
#define WEFT_MAX_TRANSPORTS 4
#define WEFT_NET_ERROR_LEN 512

struct weft_bootstrap;
struct weft_transport;
struct weft_stream;
struct weft_cuda_comm;
struct weft_reg;
struct weft_zcopy_map;
struct weft_net;
struct weft_dev_bridge;


/* A user-created reduction operator (PreMulSum), owned by one communicator. */
struct weft_user_op {
    int in_use;
    int dtype;
    int residence; /* ncclScalarResidence_t */
    const void *scalar_ptr;
    uint8_t scalar[8];
};

#define WEFT_MAX_USER_OPS 256

/*
 * Set once any communicator of this process found more ranks on its host than cores. Then every
 * communicator of the process waits as an oversubscribed one (exec/host.c): a 2-rank group split
 * from an 8-rank job on 2 cores is not crowded by its own count, but its peers still share the
 * cores with the rest of the job. Only waits read it; algorithm choices use comm->tune, which
 * every rank of a communicator computes alike from exchanged values.
 */
extern int weft_host_oversubscribed;

struct ncclComm {
    uint64_t magic; /* WEFT_COMM_MAGIC while alive */
    int rank;
    int nranks;
    int cuda_dev;
    int nchannels; /* channels for collectives; channel index nchannels is for point-to-point */
    uint64_t comm_hash;
    ncclConfig_t config;

    struct weft_bootstrap *bootstrap;
    struct weft_peer_info *peer_info; /* [nranks] */
    /* [nranks] or NULL: the index in transports[] of the transport that connects each peer (-1:
     * none), whose peer_departed and peer_lock_fd slots answer for it. */
    int *peer_transport;

    /*
     * connections: chan_peers[c][peer]; c == nchannels is the point-to-point channel. The arrays
     * are the communicator's (one allocation, peers_mem); the transports fill the entries.
     */
    struct weft_peer_conns *chan_peers[WEFT_MAX_CHANNELS + 1];
    struct weft_peer_conns *peers_mem;
    struct weft_doorbell *bell; /* this rank's doorbell (shm segment, or the socket transport's) */
    struct weft_net *net; /* the network across hosts (transports/net/net.h); NULL: the
                           * built-in socket transport */
    const struct weft_dev_transport *dev_transport; /* device FIFOs between processes (p2p) */
    const struct weft_dev_bridge *dev_bridge; /* device FIFOs across hosts: net's or socket's */
    int proxied; /* a proxy thread of this process moves some connections' data (socket
                  * transport): a waiting rank must not hold a core it may need (exec/host.c) */
    size_t slot_bytes;          /* of every connection of this communicator */
    /* what the transports get (transport.h), valid from the setup of the first to the close of
     * the last */
    struct weft_transport_ctx tctx;
    /* transports set up, in setup order (closed in reverse), with their states */
    const struct weft_transport *transports[WEFT_MAX_TRANSPORTS];
    void *transport_states[WEFT_MAX_TRANSPORTS];
    int ntransports;

    /*
     * Set by a transport's proxy thread when a connection fails (EOF, reset, bad frame): the first
     * error wins; net_error_msg names the peer and its host and is written before net_error is
     * published (release). The executor checks it where it checks abort_flag.
     */
    ncclResult_t net_error;
    uint32_t net_error_claimed;
    char net_error_msg[WEFT_NET_ERROR_LEN];

    volatile uint32_t abort_flag;     /* set by ncclCommAbort from any thread */
    uint32_t closing;                 /* WEFT_COMM_CLOSING_*: destroy or abort under way; calls
                                       * entering now are refused (weft_comm_enter) */
    ncclResult_t async_error;         /* sticky; read by ncclCommGetAsyncError */
    int finalized;
    int revoked;
    uint64_t op_seq;                  /* operations issued, for error messages */
    struct weft_sig_comm *sig;        /* signatures and recent operations (exec/sig.h) */
    struct weft_exec_cache *exec_cache; /* the last few operations' schedules (exec/host_cache.c) */
    struct weft_trace *trace;         /* WEFT_TRACE_FILE's records (core/trace.h); NULL: none */
    int busy;                         /* API calls inside (weft_comm_enter), and batches queued
                                       * on host streams: abort and destroy wait for 0 */
    int blocking;                     /* config.blocking after NCCL_COMM_BLOCKING */
    int oversubscribed;               /* more ranks on this host than cores this rank may run on
                                       * (its own affinity: for its waits only) */
    int nhosts;                       /* distinct host_hash values among the peers */
    int ranks_per_host;               /* the most ranks on one host */
    /* Ring order (weft_sched_ring_order: hosts in order of their lowest rank, each host's ranks
     * in rank order), [nranks] each; NULL where that is rank order (hosts of consecutive ranks). */
    int *ring;
    int *ring_pos;
    int hier_k;                       /* ranks on every host when all hold the same number, or 0 */
    int machines_oversubscribed;      /* some machine runs more of our ranks than it has cores
                                       * (hosts that are namespaces of one machine count as one) */
    int machine_ranks;                /* ranks of this communicator on this rank's machine */
    struct weft_tune_comm tune;       /* what the tuner reads: the same on every rank */

    /*
     * Issue order: every piece of work takes a ticket (issued++) in the issuing thread and runs
     * only once completed == its ticket, whichever thread or stream runs it. issued, completed
     * and ticket_running are atomics, so work whose turn has come takes no lock (a locked
     * instruction costs ~20 ns, the 8 B path's scale); ticket_lock and ticket_cond serve the
     * waiters, counted in ticket_waiters so that finishing work wakes only when one sleeps.
     */
    pthread_mutex_t ticket_lock;
    pthread_cond_t ticket_cond;
    uint64_t issued;
    uint64_t completed;
    int ticket_waiters;
    int ready;          /* weft_comm_setup finished (release); work on a communicator whose
                         * non-blocking init failed is refused, not run on missing connections */
    int ticket_running; /* the holder of ticket `completed` is running (its own deadlines bound
                         * it); while not, waiters count WEFT_TIMEOUT against it */
    struct weft_stream *async_stream; /* non-blocking communicators run all their work here */

    struct weft_user_op user_ops[WEFT_MAX_USER_OPS];

    /* Buffers registered with ncclCommRegister (core/mem.c; any thread, under reg_lock), and
     * the peers' registered buffers this rank mapped for zero-copy collectives (exec/zcopy.c;
     * the executing thread, under reg_lock too), unmapped when the communicator is freed. */
    pthread_mutex_t reg_lock;
    struct weft_reg *regs;
    struct weft_zcopy_map *zcopy_maps;
    uint64_t zcopy_ops; /* collectives that ran zero-copy (tests read it: weft_zcopy_count) */
    uint64_t zcopy_cma_ops; /* all-gathers that read unregistered inputs (weft_zcopy_cma_count) */
    uint64_t zcopy_min_bytes; /* zero-copy candidates' least size, from exchanged values
                               * (weft_zcopy_setup); UINT64_MAX: none */

    /* The CUDA executor (exec/cuda.c): cuda_bound when the process has a device (cuda_dev is
     * then this rank's); cuda is its device state, NULL without one. */
    int cuda_bound;
    struct weft_cuda_comm *cuda;
};

/*
 * 0 when peer p's process is known to be gone (or a zombie), 1 when it lives or nobody can tell
 * (another host, or another PID namespace without a shared segment: the deadline decides then).
 * Any thread; a few system calls.
 */
int weft_comm_peer_alive(const struct ncclComm *comm, int p);

/*
 * 1 once peer p destroyed the communicator after its part was done (its transport saw it leave
 * cleanly: a peer process gone after that crashed no operation); 0 otherwise. Any thread.
 */
int weft_comm_peer_departed(const struct ncclComm *comm, int p);

/*
 * Where peer p runs, for messages: "in this process", "pid 123 on this host" or "pid 123 on
 * host NAME" (a hostname alone, such as "vm", reads as a word). Returns buf; any thread.
 */
const char *weft_comm_peer_where(const struct ncclComm *comm, int p, char *buf, size_t len);

/* Stores the first error of an operation where ncclCommGetAsyncError will find it. */
void weft_comm_set_error(struct ncclComm *comm, ncclResult_t res);

/*
 * Records a transport failure (any thread, typically a proxy): the first call formats the message
 * into net_error_msg and publishes res in net_error; later calls do nothing. Does not log (the
 * caller has logged the cause with WEFT_WARN) and does not wake anyone (the caller rings
 * comm->bell).
 */
void weft_comm_set_net_error(struct ncclComm *comm, ncclResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
