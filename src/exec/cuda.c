/*
 * The CUDA executor (see exec/cuda.h).
 *
 * Device state of a communicator (struct weft_cuda_comm), made at init:
 *   - one device allocation on the communicator's device holding the receive blocks of every
 *     connection into this rank (tail, slot sizes, WEFT_STEPS slots; dev_fifo.h) and the head
 *     words of its connections out, for channels 0 .. nch-1 (collectives) and nch (p2p), for
 *     every peer including itself (loopback); and the same layout in pinned host memory mapped
 *     for the devices when some peer's device and this rank's cannot reach each other (peer
 *     access, from masks all ranks exchange first): that connection's FIFOs live there on both
 *     ends. Ranks that are threads of this process use each other's base addresses (exchanged
 *     through the bootstrap all-gather) as they are; ranks in other processes of the host map
 *     them through the p2p transport (transports/p2p: cuMem descriptors or legacy IPC handles);
 *   - struct weft_dev_comm in device memory: the connection table with both ends' step counters
 *     (advanced by the kernel), the step windows, the ring order;
 *   - pinned host memory for the abort word and the stuck record;
 *   - an internal stream and two events.
 * Peers on other hosts: both ends of the connection in this rank's pinned host memory (its host
 * FIFOs, and a shadow of the peer's receive block), carried by the communicator's device bridge
 * (transport.h: over TCP, or over the network provider).
 * Scope: WEFT_SCOPE_GPU for peers of this process on this device, WEFT_SCOPE_SYS for the others
 * (other devices, host-memory FIFOs, other processes, other hosts).
 *
 * A submission's device tasks launch in three passes over their communicators so that ranks
 * sharing one user stream cannot deadlock: every user stream records ev_in and every internal
 * stream waits for it; then every launch; then each internal stream records ev_out and its user
 * streams wait for it. Under capture the same calls fork and join the captured graph.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algo/sched.h"
#include "algo/tuner.h"
#include "bootstrap/bootstrap.h"
#include "core/trace.h"
#include "core/check.h"
#include "core/communicator.h"
#include "core/cuda_peer.h"
#include "core/group.h"
#include "core/mem.h"
#include "core/param.h"
#include "cuda/cuda_ops.h"
#include "dev_fifo.h"
#include "dev_kernel.h"
#include "dev_ll.h"
#include "exec/cuda.h"
#include "exec/cuda_order.h"
#include "transport.h"
#include "exec/sig.h"
#include "exec/zcopy.h"

WEFT_PARAM(CudaChannels, "WEFT_CUDA_CHANNELS", 2,
           "blocks (channels) of the collective kernel; 1 with WEFT_EMU_SERIALIZE=1");
WEFT_PARAM(CudaThreads, "WEFT_CUDA_THREADS", -1,
           "threads per block of the collective kernel, at most 512 (-1: 256 on a GPU, 4 on the "
           "emulated one)");
WEFT_PARAM(CudaSlotBytes, "WEFT_CUDA_SLOT_BYTES", 65536,
           "bytes of one slot of a device FIFO (WEFT_STEPS slots per connection)");
WEFT_PARAM(CudaLlSlotBytes, "WEFT_CUDA_LL_SLOT_BYTES", 16384,
           "data bytes of one slot of a device LL FIFO (twice that in lines; WEFT_STEPS slots "
           "per connection)");
WEFT_PARAM(CudaLlMaxBytes, "WEFT_CUDA_LL_MAX_BYTES", 65536,
           "device operations of up to this many bytes (count x element size) take the LL "
           "protocol where NCCL_PROTO allows both LL and Simple");
WEFT_PARAM(CudaOrder, "WEFT_CUDA_ORDER", 1,
           "1: ranks of one process on one device queue their kernels in one order, as their "
           "streams may share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS): a call may wait for "
           "the device's other ranks to issue theirs (exec/cuda_order.h); 0: no such wait, for "
           "one thread issuing several ranks' calls of a device outside a group, safe only "
           "where no two of their streams share a queue");
WEFT_PARAM_DECL(Timeout);

/* The emulated build of the kernel (kernels/coll_kernel_emu.cc), and nvcc's, where linked. */
void weft_coll_kernel_emu(void *params);
const void *weft_coll_kernel_device_fn(void) __attribute__((weak));
void weft_zc_kernel_emu(void *params);
const void *weft_zc_kernel_device_fn(void) __attribute__((weak));

/* weft_cuda_test_kernel's choice (NULL, NULL: the library's kernel). */
static void (*weft_cuda_test_emu)(void *);
static const void *weft_cuda_test_dev;

void weft_cuda_test_kernel(void (*emu_fn)(void *), const void *device_fn)
{
    __atomic_store_n(&weft_cuda_test_emu, emu_fn, __ATOMIC_RELEASE);
    __atomic_store_n(&weft_cuda_test_dev, device_fn, __ATOMIC_RELEASE);
}

/*
 * The FIFO memory of the ranks of one communicator in this process, freed by the last of them to
 * leave: a rank's FIFOs receive its peers' posts (tail, and head for its sends) until every
 * peer's kernels are done, and a peer may still run when this rank destroys its communicator
 * (each rank synchronises only its own stream before it leaves). Allocated by the lowest rank of
 * the process; the others learn its address with the FIFO addresses. Peers in other processes map
 * the memory through the p2p transport and keep their own mappings.
 */
struct weft_cuda_clique {
    int refs; /* ranks of this process that have not left yet */
    int keep_legacy; /* a rank's p2p drain failed: legacy IPC FIFO memory is never freed */
    struct weft_cuda_order *order; /* ranks of this process sharing a device, or NULL */
    int nranks;
    struct {
        void *mem[WEFT_DEV_NREGIONS]; /* device FIFOs, host FIFOs (or NULL) */
        int how[WEFT_DEV_NREGIONS];   /* p2p mem_alloc's; -1: plain malloc / host_alloc */
        int dev;
    } rank[];
};

/* This rank's direct-kernel words (pinned, after its struct weft_zc_peer table). */
struct weft_cuda_zc_rank {
    uint64_t runs;
    uint32_t skip;
    uint32_t pad[13];
};

struct weft_cuda_comm {
    int dev;
    int nch;           /* collective channels (blocks) */
    int nthreads;
    size_t slot_bytes;
    size_t ll_payload; /* data bytes of an LL slot */
    char *fifo;        /* this rank's FIFO memory (device), owned by the clique once joined */
    char *hfifo;       /* its FIFOs in pinned host memory (peers that cannot reach the device) */
    int fifo_how[WEFT_DEV_NREGIONS]; /* how they were made (struct weft_cuda_clique) */
    int keep_legacy; /* the p2p drain failed: its legacy IPC FIFO memory is never freed */
    void *p2p;         /* the p2p transport's state: peers' FIFO memory mapped here */
    char *shadow;      /* pinned host: the shadows of peers on other hosts (transport.h, struct weft_dev_bridge) */
    void *net;         /* the device socket proxy's state (peers on other hosts), or NULL */
    struct weft_cuda_clique *clique; /* NULL until joined */
    struct weft_dev_comm *dstate; /* device */
    struct weft_step *steps;      /* device */
    int *ring;                    /* device, or NULL */
    void *pinned;                 /* abort word, stuck records, busy words */
    uint32_t *abort_host;
    struct weft_dev_stuck *stuck_host;
    uint32_t *busy_host; /* [nch]: a block of a kernel of this rank runs (weft_dev_comm.busy) */
    weft_cuda_stream_t stream;
    weft_cuda_event_t ev_in, ev_out;
    int reported; /* the stuck record was turned into an error */
    int dead_peer; /* a peer found gone while the kernels ran (their abort word set), or -1 */
    uint64_t alive_check_ns; /* when peers' liveness may be checked next */
    struct weft_kernel kernel;
    struct weft_kernel zkernel; /* the direct kernel; emu_fn NULL: none (a test kernel) */
    /* The direct kernel's view of the peers (kernels/dev_kernel.h), pinned: [nranks] tables,
     * then this rank's words. NULL where the ranks span hosts or some pair of devices lacks
     * peer access (the same on every rank: then no rank launches the direct kernel). Each rank's
     * exchange slots lie at zc_off in its device FIFO memory. Entries of imp[] change under
     * zc_lock (the launching thread and ncclCommRegister's). */
    struct weft_zc_peer *zpeers;
    struct weft_cuda_zc_rank *zrank;
    size_t zc_off;
    pthread_mutex_t zc_lock;
    uint64_t zc_next_id; /* the last share id given (under zc_lock) */
    int nhost_fifo;      /* peers of this host whose FIFOs with this rank are pinned host memory */
};

/* Logs a failed CUDA call with its text. */
static ncclResult_t weft_cuda_fail(int err, const char *what, int rank)
{
    WEFT_WARN("rank %d: %s failed: %s (%d)", rank, what, weft_cuda()->error_string(err), err);
    return ncclUnhandledCudaError;
}

#define WEFT_CUDA_CALL_GOTO(call, what, rank, res, label)                                          \
    do {                                                                                           \
        int weft_cerr_ = (call);                                                                   \
        if (weft_cerr_ != 0) {                                                                     \
            (res) = weft_cuda_fail(weft_cerr_, (what), (rank));                                    \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define WEFT_CUDA_CALL(call, what, rank)                                                           \
    do {                                                                                           \
        int weft_cerr_ = (call);                                                                   \
        if (weft_cerr_ != 0)                                                                       \
            return weft_cuda_fail(weft_cerr_, (what), (rank));                                     \
    } while (0)

int weft_cuda_current_device(void)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int n = 0, dev = -1;
    if (ops->get_device_count(&n) != 0 || n < 1 || ops->get_device(&dev) != 0)
        return -1;
    return dev;
}

int weft_cuda_device_count(void)
{
    int n = 0;
    return weft_cuda()->get_device_count(&n) == 0 ? n : 0;
}

int weft_cuda_set_device(int dev)
{
    return weft_cuda()->set_device(dev);
}

int weft_cuda_is_device_ptr(const void *p)
{
    struct weft_ptr_attr attr;
    if (p == NULL || weft_cuda()->pointer_attr(&attr, p) != 0)
        return 0;
    return attr.kind == WEFT_MEM_DEVICE || attr.kind == WEFT_MEM_MANAGED;
}

ncclResult_t weft_cuda_comm_bind(struct ncclComm *comm, int dev)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int n = 0;
    if (ops->get_device_count(&n) != 0 || n < 1) {
        comm->cuda_bound = 0;
        return ncclSuccess;
    }
    if (dev < 0)
        dev = weft_cuda_current_device();
    if (dev < 0 || dev >= n) {
        WEFT_WARN("rank %d: device %d does not exist (%d devices)", comm->rank, dev, n);
        return ncclInvalidArgument;
    }
    comm->cuda_dev = dev;
    comm->cuda_bound = 1;
    return ncclSuccess;
}

int weft_cuda_host_fifo_peers(const struct ncclComm *comm)
{
    const struct weft_cuda_comm *cc = __atomic_load_n(&comm->cuda, __ATOMIC_ACQUIRE);
    return cc == NULL ? -1 : cc->nhost_fifo;
}

/* What every rank tells the others about its reach (first exchange: a row of WEFT_REACH_* per
 * peer), and its FIFO memory (the second). Within one job only (the bootstrap all-gather). */
#define WEFT_REACH_NONE 0 /* this rank's device cannot map the peer's device memory */
#define WEFT_REACH_PEER 1 /* it can (peer access) */
#define WEFT_REACH_SAME 2 /* one GPU (the same uuid), whatever each process numbers it */

struct weft_cuda_peer {
    uint64_t fifo;   /* address of its device FIFO memory (in its process) */
    uint64_t hfifo;  /* address of its host FIFO memory, 0 for none */
    uint64_t clique; /* the lowest rank of each process: its struct weft_cuda_clique */
    int32_t dev;
    int32_t pad;
};

/* Frees one FIFO region made as `how` (see struct weft_cuda_clique). */
static void weft_cuda_fifo_free(const struct weft_dev_transport *dt, void *mem, int how, int region,
                                int keep_legacy)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    if (mem == NULL)
        return;
    if (keep_legacy && how == WEFT_DEV_HOW_LEGACY) {
        WEFT_INFO(WEFT_LOG_INIT, "FIFO memory %p kept: a peer may still map it (legacy IPC)", mem);
        return;
    }
    if (how >= 0)
        dt->mem_free(mem, how);
    else if (region == WEFT_DEV_REGION_HOST)
        ops->host_free(mem);
    else
        ops->free(mem);
}

static void weft_cuda_release(struct ncclComm *comm, struct weft_cuda_comm *cc)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int prev = -1;
    if (cc->clique != NULL && cc->clique->order != NULL)
        weft_cuda_order_leave(cc->clique->order, comm->rank);
    ops->get_device(&prev);
    ops->set_device(cc->dev);
    if (cc->stream != NULL) {
        ops->stream_synchronize(cc->stream);
        ops->stream_destroy(cc->stream);
    }
    if (cc->ev_in != NULL)
        ops->event_destroy(cc->ev_in);
    if (cc->ev_out != NULL)
        ops->event_destroy(cc->ev_out);
    if (cc->ring != NULL)
        ops->free(cc->ring);
    if (cc->steps != NULL)
        ops->free(cc->steps);
    if (cc->dstate != NULL)
        ops->free(cc->dstate);
    if (cc->p2p != NULL)
        comm->dev_transport->close(&comm->tctx, cc->p2p);
    /* The proxy writes into this rank's host FIFOs and shadows: stopped before they go. */
    if (cc->net != NULL)
        comm->dev_bridge->close(&comm->tctx, cc->net);
    if (cc->shadow != NULL)
        ops->host_free(cc->shadow);
    if (cc->clique != NULL) {
        /* Our kernels are done (stream synchronised above); the last rank of this process frees
         * every FIFO of the process's ranks. */
        struct weft_cuda_clique *q = cc->clique;
        if (__atomic_sub_fetch(&q->refs, 1, __ATOMIC_ACQ_REL) == 0) {
            for (int r = 0; r < q->nranks; r++) {
                if (q->rank[r].mem[0] == NULL && q->rank[r].mem[1] == NULL)
                    continue;
                ops->set_device(q->rank[r].dev);
                for (int g = 0; g < WEFT_DEV_NREGIONS; g++)
                    weft_cuda_fifo_free(comm->dev_transport,
                                        q->rank[r].mem[g], q->rank[r].how[g], g,
                                        __atomic_load_n(&q->keep_legacy, __ATOMIC_ACQUIRE));
            }
            weft_cuda_order_free(q->order);
            free(q);
        }
    } else {
        weft_cuda_fifo_free(comm->dev_transport, cc->fifo, cc->fifo_how[0], WEFT_DEV_REGION_DEVICE,
                            cc->keep_legacy);
        weft_cuda_fifo_free(comm->dev_transport, cc->hfifo, cc->fifo_how[1], WEFT_DEV_REGION_HOST,
                            cc->keep_legacy);
    }
    if (cc->pinned != NULL)
        ops->host_free(cc->pinned);
    if (cc->zpeers != NULL)
        ops->host_free(cc->zpeers);
    pthread_mutex_destroy(&cc->zc_lock);
    if (prev >= 0)
        ops->set_device(prev);
    free(cc);
}

/* The device view of a pinned host address. */
static void *weft_cuda_dev_view(void *host)
{
    struct weft_ptr_attr attr;
    if (weft_cuda()->pointer_attr(&attr, host) != 0 || attr.dev_ptr == NULL)
        return host;
    return attr.dev_ptr;
}

static int weft_cuda_same_process(const struct ncclComm *comm, int a, int b)
{
    const struct weft_peer_info *pa = &comm->peer_info[a], *pb = &comm->peer_info[b];
    return pa->pid == pb->pid && pa->pid_ns == pb->pid_ns && pa->host_hash == pb->host_hash;
}

static int weft_cuda_other_host(const struct ncclComm *comm, int a, int b)
{
    return comm->peer_info[a].host_hash != comm->peer_info[b].host_hash;
}

/* Whether the FIFOs between ranks a and b live in pinned host memory: their devices differ and
 * one cannot map the other's memory. From exchanged rows (reach[a * n + b]: what a's device does
 * with b's memory), so both ends agree. */
static int weft_cuda_host_fifo(const uint8_t *reach, int n, int a, int b)
{
    uint8_t ab = reach[(size_t)a * n + b], ba = reach[(size_t)b * n + a];
    if (ab == WEFT_REACH_SAME && ba == WEFT_REACH_SAME)
        return 0;
    return !(ab != WEFT_REACH_NONE && ba != WEFT_REACH_NONE);
}

/* This rank's row of the reach matrix: per peer, from the device identities of the peer info
 * (ordinals mean nothing across processes: under CUDA_VISIBLE_DEVICES every rank may be device
 * 0). Another GPU is reached only if this process sees it (its bus id) and has peer access. */
static void weft_cuda_reach_row(const struct ncclComm *comm, uint8_t *row)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    for (int p = 0; p < comm->nranks; p++) {
        int d = weft_cuda_peer_device(&comm->tctx, p), can = 0;
        if (p == comm->rank || weft_cuda_same_gpu(&comm->tctx, comm->rank, p))
            row[p] = WEFT_REACH_SAME;
        else if (d >= 0 && d != comm->cuda_dev &&
                 ops->can_access_peer(&can, comm->cuda_dev, d) == 0 && can)
            row[p] = WEFT_REACH_PEER;
        else
            row[p] = WEFT_REACH_NONE;
    }
}

/*
 * Loads every kernel this rank may launch before any of them runs: with CUDA's lazy loading a
 * first launch may wait for the whole device to be idle, which never comes while another
 * communicator's kernel on it spins waiting for a peer (src/cuda/cuda_ops.h, load_kernels).
 */
static ncclResult_t weft_cuda_load_kernels(struct ncclComm *comm, struct weft_cuda_comm *cc)
{
    struct weft_kernel k[2] = {cc->kernel, cc->zkernel};
    int err = weft_cuda()->load_kernels(k, 2);
    if (err != 0)
        return weft_cuda_fail(err, "loading the kernels (cudaFuncGetAttributes)", comm->rank);
    return ncclSuccess;
}

ncclResult_t weft_cuda_comm_setup(struct ncclComm *comm)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int nranks = comm->nranks, me = comm->rank, prev = -1;
    ncclResult_t res = ncclSuccess;
    /* Every rank decides alike, from the exchanged peer info: a device on every rank. Every pair
     * of such ranks is then connected: in one process (raw pointers), through the p2p transport
     * (one host), or through the device socket proxy (two hosts). */
    int all_dev = 1, one_process = 1, multi_host = 0;
    for (int p = 0; p < nranks; p++) {
        all_dev &= comm->peer_info[p].cuda_dev >= 0;
        one_process &= weft_cuda_same_process(comm, p, me);
        multi_host |= weft_cuda_other_host(comm, p, 0);
    }
    if (!all_dev) {
        if (comm->cuda_bound)
            WEFT_INFO(WEFT_LOG_INIT, "rank %d: no CUDA executor (a rank has no device)", me);
        return ncclSuccess;
    }
    struct weft_cuda_comm *cc = calloc(1, sizeof(*cc));
    struct weft_cuda_peer *peers = calloc((size_t)nranks, sizeof(*peers));
    size_t row_bytes = ((size_t)nranks + 7) & ~(size_t)7;
    uint8_t *reach = calloc((size_t)nranks, row_bytes);
    uint8_t *remote = calloc((size_t)nranks, 1);
    uint8_t *xhost = calloc((size_t)nranks, 1);
    char **shadows = calloc((size_t)nranks, sizeof(char *));
    uint8_t *want = calloc((size_t)nranks * WEFT_DEV_NREGIONS, 1);
    void **mapped = calloc((size_t)nranks * WEFT_DEV_NREGIONS, sizeof(void *));
    struct weft_dev_conn *conns = NULL;
    if (cc == NULL || peers == NULL || reach == NULL || remote == NULL || want == NULL ||
        mapped == NULL || xhost == NULL || shadows == NULL) {
        WEFT_WARN("rank %d: out of memory for the CUDA executor", me);
        res = ncclSystemError;
        free(cc);
        cc = NULL;
        goto err;
    }
    cc->fifo_how[0] = cc->fifo_how[1] = -1;
    cc->dead_peer = -1;
    pthread_mutex_init(&cc->zc_lock, NULL);
    ops->get_device(&prev);
    cc->dev = comm->cuda_dev;
    WEFT_CUDA_CALL_GOTO(ops->set_device(cc->dev), "cudaSetDevice", me, res, err);
    int64_t nch = weft_param_CudaChannels();
    cc->nch = nch < 1 ? 1 : nch > WEFT_MAX_CHANNELS ? WEFT_MAX_CHANNELS : (int)nch;
    int64_t nt = weft_param_CudaThreads();
    if (nt < 0)
        nt = ops->kernel_threads;
    cc->nthreads = nt < 1 ? 1 : nt > WEFT_COLL_KERNEL_MAX_THREADS ? WEFT_COLL_KERNEL_MAX_THREADS
                                                                   : (int)nt;
    int64_t sb = weft_param_CudaSlotBytes();
    sb = sb < 256 ? 256 : sb > (1 << 24) ? (1 << 24) : sb;
    cc->slot_bytes = (size_t)sb & ~(size_t)127;
    int64_t lb = weft_param_CudaLlSlotBytes();
    lb = lb < WEFT_LL_PACK ? WEFT_LL_PACK : lb > (1 << 22) ? (1 << 22) : lb;
    cc->ll_payload = (size_t)lb & ~(size_t)(WEFT_LL_PACK - 1);
    int nconn = cc->nch + 1;
    size_t fifo_bytes = weft_dev_all_fifo_bytes(nranks, nconn, cc->slot_bytes, cc->ll_payload);
    /* The direct kernel's exchange slots follow the FIFOs (zeroed with them). */
    cc->zc_off = (fifo_bytes + 127) & ~(size_t)127;
    fifo_bytes = cc->zc_off + (size_t)cc->nch * sizeof(struct weft_zc_slot);

    /* 1: which devices reach which, so every rank places every connection's FIFOs alike. */
    weft_cuda_reach_row(comm, reach + (size_t)me * row_bytes);
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bootstrap, reach, row_bytes), res, err);
    /* rows padded to 8 bytes in the exchange: packed to nranks bytes each from here on */
    for (int p = 1; p < nranks; p++)
        memmove(reach + (size_t)p * nranks, reach + (size_t)p * row_bytes, (size_t)nranks);
    int need_host = 0, leader = me, nlocal = 0, nxhost = 0;
    for (int p = 0; p < nranks; p++) {
        /* Peers on other hosts: host FIFOs here, bridged by the proxy (nothing mapped). */
        xhost[p] = weft_cuda_other_host(comm, me, p);
        nxhost += xhost[p];
        need_host |= xhost[p] || weft_cuda_host_fifo(reach, nranks, me, p);
        remote[p] = !weft_cuda_same_process(comm, me, p);
        if (remote[p] && !xhost[p])
            want[p * WEFT_DEV_NREGIONS + weft_cuda_host_fifo(reach, nranks, me, p)] = 1;
        else if (!remote[p]) {
            nlocal++;
            leader = p < leader ? p : leader;
        }
    }

    WEFT_CUDA_CALL_GOTO(ops->stream_create(&cc->stream), "cudaStreamCreate", me, res, err);
    WEFT_CUDA_CALL_GOTO(ops->event_create(&cc->ev_in), "cudaEventCreate", me, res, err);
    WEFT_CUDA_CALL_GOTO(ops->event_create(&cc->ev_out), "cudaEventCreate", me, res, err);
    /* FIFO memory other processes map comes from the p2p transport. */
    if (one_process) {
        WEFT_CUDA_CALL_GOTO(ops->malloc((void **)&cc->fifo, fifo_bytes), "cudaMalloc (FIFOs)", me,
                            res, err);
        if (need_host)
            WEFT_CUDA_CALL_GOTO(ops->host_alloc((void **)&cc->hfifo, fifo_bytes),
                                "cudaHostAlloc (FIFOs)", me, res, err);
    } else {
        WEFT_CHECK_GOTO(comm->dev_transport->mem_alloc(&comm->tctx, fifo_bytes, WEFT_DEV_REGION_DEVICE,
                                                         (void **)&cc->fifo, &cc->fifo_how[0]),
                        res, err);
        if (need_host)
            WEFT_CHECK_GOTO(comm->dev_transport->mem_alloc(&comm->tctx, fifo_bytes,
                                                             WEFT_DEV_REGION_HOST,
                                                             (void **)&cc->hfifo,
                                                             &cc->fifo_how[1]),
                            res, err);
    }
    WEFT_CUDA_CALL_GOTO(ops->memset_async(cc->fifo, 0, fifo_bytes, cc->stream), "cudaMemsetAsync",
                        me, res, err);
    if (cc->hfifo != NULL)
        memset(cc->hfifo, 0, fifo_bytes);
    size_t shadow_bytes = weft_dev_shadow_bytes(nconn, cc->slot_bytes);
    if (nxhost > 0) {
        WEFT_CUDA_CALL_GOTO(ops->host_alloc((void **)&cc->shadow, (size_t)nxhost * shadow_bytes),
                            "cudaHostAlloc (FIFO shadows)", me, res, err);
        memset(cc->shadow, 0, (size_t)nxhost * shadow_bytes);
        for (int p = 0, i = 0; p < nranks; p++)
            if (xhost[p])
                shadows[p] = cc->shadow + (size_t)i++ * shadow_bytes;
    }
    int nwin = 1 + 2 * nranks;
    size_t step_bytes = (size_t)cc->nch * (size_t)nwin * WEFT_DEV_WINDOW * sizeof(struct weft_step);
    WEFT_CUDA_CALL_GOTO(ops->malloc((void **)&cc->steps, step_bytes), "cudaMalloc (steps)", me,
                        res, err);
    size_t pinned_bytes = WEFT_CACHELINE + (size_t)cc->nch * sizeof(struct weft_dev_stuck) +
                          (size_t)cc->nch * sizeof(uint32_t);
    WEFT_CUDA_CALL_GOTO(ops->host_alloc(&cc->pinned, pinned_bytes), "cudaHostAlloc", me, res,
                        err);
    memset(cc->pinned, 0, pinned_bytes);
    cc->abort_host = (uint32_t *)cc->pinned;
    cc->stuck_host = (struct weft_dev_stuck *)((char *)cc->pinned + WEFT_CACHELINE);
    cc->busy_host = (uint32_t *)(cc->stuck_host + cc->nch);
    if (comm->ring != NULL) {
        WEFT_CUDA_CALL_GOTO(ops->malloc((void **)&cc->ring, 2 * (size_t)nranks * sizeof(int)),
                            "cudaMalloc (ring)", me, res, err);
        WEFT_CUDA_CALL_GOTO(ops->memcpy_async(cc->ring, comm->ring, nranks * sizeof(int),
                                              cc->stream), "cudaMemcpyAsync", me, res, err);
        WEFT_CUDA_CALL_GOTO(ops->memcpy_async(cc->ring + nranks, comm->ring_pos,
                                              nranks * sizeof(int), cc->stream),
                            "cudaMemcpyAsync", me, res, err);
    }
    WEFT_CUDA_CALL_GOTO(ops->stream_synchronize(cc->stream), "cudaStreamSynchronize", me, res,
                        err);

    /* 2: everyone's FIFOs are zeroed before anyone learns where they are. */
    peers[me].fifo = (uint64_t)(uintptr_t)cc->fifo;
    peers[me].hfifo = (uint64_t)(uintptr_t)cc->hfifo;
    peers[me].dev = cc->dev;
    struct weft_cuda_clique *clique = NULL;
    if (me == leader) {
        clique = calloc(1, sizeof(*clique) + (size_t)nranks * sizeof(clique->rank[0]));
        if (clique == NULL) {
            WEFT_WARN("rank %d: out of memory for the CUDA executor", me);
            res = ncclSystemError;
            goto err;
        }
        clique->refs = nlocal;
        clique->nranks = nranks;
        int *local_dev = malloc((size_t)nranks * sizeof(int));
        if (local_dev == NULL) {
            WEFT_WARN("rank %d: out of memory for the CUDA executor", me);
            res = ncclSystemError;
            free(clique);
            goto err;
        }
        for (int p = 0; p < nranks; p++)
            local_dev[p] = remote[p] ? -1 : comm->peer_info[p].cuda_dev;
        if (weft_param_CudaOrder() != 0)
            clique->order = weft_cuda_order_new(nranks, local_dev, &res);
        free(local_dev);
        if (res != ncclSuccess) {
            free(clique);
            goto err;
        }
        peers[me].clique = (uint64_t)(uintptr_t)clique;
    }
    /* Nothing may fail between here and joining the clique: every local rank must join it. */
    res = weft_bootstrap_allgather(comm->bootstrap, peers, sizeof(*peers));
    if (res != ncclSuccess) {
        if (clique != NULL)
            weft_cuda_order_free(clique->order);
        free(clique);
        goto err;
    }
    cc->clique = (struct weft_cuda_clique *)(uintptr_t)peers[leader].clique;
    cc->clique->rank[me].mem[0] = cc->fifo;
    cc->clique->rank[me].mem[1] = cc->hfifo;
    cc->clique->rank[me].how[0] = cc->fifo_how[0];
    cc->clique->rank[me].how[1] = cc->fifo_how[1];
    cc->clique->rank[me].dev = cc->dev;

    /* 3: the other processes' FIFO memory, mapped here (collective when any pair needs it). */
    if (!one_process) {
        void *mine[WEFT_DEV_NREGIONS] = {cc->fifo, cc->hfifo};
        WEFT_CHECK_GOTO(comm->dev_transport->setup(&comm->tctx, mine, cc->fifo_how, fifo_bytes, want,
                                                     mapped, &cc->p2p),
                        res, err);
    }
    /* 4: the proxy to peers on other hosts (collective when any pair is on two hosts). */
    if (multi_host)
        WEFT_CHECK_GOTO(comm->dev_bridge->setup(&comm->tctx, xhost, nconn, cc->slot_bytes, cc->hfifo,
                                                shadows, &cc->dead_peer, cc->abort_host, &cc->net),
                        res, err);
    /* 5: the direct kernel reads and writes peers' device buffers: one host, and every pair of
     * devices maps each other's memory (reach and hosts are the same on every rank). */
    int all_reach = !multi_host;
    for (int a = 0; a < nranks; a++)
        for (int b = 0; b < nranks; b++)
            all_reach &= !weft_cuda_host_fifo(reach, nranks, a, b);
    if (all_reach) {
        size_t zb = (size_t)nranks * sizeof(struct weft_zc_peer) + sizeof(struct weft_cuda_zc_rank);
        WEFT_CUDA_CALL_GOTO(ops->host_alloc((void **)&cc->zpeers, zb),
                            "cudaHostAlloc (zero-copy tables)", me, res, err);
        memset(cc->zpeers, 0, zb);
        cc->zrank = (struct weft_cuda_zc_rank *)(cc->zpeers + nranks);
        for (int p = 0; p < nranks; p++) {
            char *base = remote[p] ? mapped[p * WEFT_DEV_NREGIONS + WEFT_DEV_REGION_DEVICE]
                                   : (char *)(uintptr_t)peers[p].fifo;
            if (base == NULL) {
                WEFT_WARN("rank %d: no FIFO memory of peer %d mapped", me, p);
                res = ncclInternalError;
                goto err;
            }
            cc->zpeers[p].slots = (uint64_t)(uintptr_t)(base + cc->zc_off);
            cc->zpeers[p].local = !remote[p];
        }
    }
    for (int p = 0; p < nranks; p++) {
        if (remote[p] || peers[p].dev == cc->dev || weft_cuda_host_fifo(reach, nranks, me, p))
            continue;
        /* 704: already enabled (by another rank of this process on our device). */
        int err = ops->enable_peer_access(peers[p].dev);
        if (err != 0 && err != 704) {
            res = weft_cuda_fail(err, "cudaDeviceEnablePeerAccess", me);
            goto err;
        }
    }

    conns = calloc((size_t)nconn * nranks, sizeof(*conns));
    if (conns == NULL) {
        WEFT_WARN("rank %d: out of memory for %d connections", me, nconn * nranks);
        res = ncclSystemError;
        goto err;
    }
    int nhost = 0;
    for (int p = 0; p < nranks; p++) {
        /* Per peer: device memory, or host memory mapped for both devices; raw pointers within
         * the process, the p2p transport's mappings across processes. */
        int host = xhost[p] || weft_cuda_host_fifo(reach, nranks, me, p);
        char *mine = host ? weft_cuda_dev_view(cc->hfifo) : cc->fifo;
        char *theirs = xhost[p]    ? (char *)weft_cuda_dev_view(cc->shadow) +
                                         (shadows[p] - cc->shadow)
                       : remote[p] ? mapped[p * WEFT_DEV_NREGIONS + host]
                                   : (char *)(uintptr_t)(host ? peers[p].hfifo : peers[p].fifo);
        if (host && !xhost[p])
            theirs = weft_cuda_dev_view(theirs);
        nhost += host && !xhost[p];
        if (theirs == NULL) {
            WEFT_WARN("rank %d: no FIFO memory of peer %d mapped", me, p);
            res = ncclInternalError;
            goto err;
        }
        for (int c = 0; c < nconn; c++) {
            struct weft_dev_conn *k = &conns[(size_t)c * nranks + p];
            size_t to_them = weft_dev_recv_off(c, me, nranks, cc->slot_bytes);
            size_t from_them = weft_dev_recv_off(c, p, nranks, cc->slot_bytes);
            k->send_rc = (struct weft_dev_recv_ctrl *)(theirs + to_them);
            k->send_slots = theirs + to_them + sizeof(struct weft_dev_recv_ctrl);
            k->send_sc = (struct weft_dev_send_ctrl *)(mine + weft_dev_head_off(
                                                                  c, p, nranks, nconn,
                                                                  cc->slot_bytes));
            k->recv_rc = (struct weft_dev_recv_ctrl *)(mine + from_them);
            k->recv_slots = mine + from_them + sizeof(struct weft_dev_recv_ctrl);
            k->recv_sc = (struct weft_dev_send_ctrl *)(theirs + weft_dev_head_off(
                                                                    c, me, nranks, nconn,
                                                                    cc->slot_bytes));
            if (xhost[p]) { /* the shadow of the peer's memory (transport.h, struct weft_dev_bridge) */
                k->send_rc = weft_dev_shadow_send_rc(nconn, cc->slot_bytes, theirs, c);
                k->send_slots = (char *)(k->send_rc + 1);
                k->recv_sc = weft_dev_shadow_recv_sc(nconn, cc->slot_bytes, theirs, c);
            }
            /* .gpu scope only between kernels of this process on one device. */
            k->scope = !remote[p] && !host && peers[p].dev == cc->dev ? WEFT_DEV_SCOPE_GPU
                                                                       : WEFT_DEV_SCOPE_SYS;
            size_t ll_to = weft_dev_ll_recv_off(c, me, nranks, nconn, cc->slot_bytes,
                                                cc->ll_payload);
            size_t ll_from = weft_dev_ll_recv_off(c, p, nranks, nconn, cc->slot_bytes,
                                                  cc->ll_payload);
            k->ll_send_rc = (struct weft_dev_recv_ctrl *)(theirs + ll_to);
            k->ll_send_slots = theirs + ll_to + sizeof(struct weft_dev_recv_ctrl);
            k->ll_send_sc = (struct weft_dev_send_ctrl *)(mine + weft_dev_ll_head_off(
                                                                     c, p, nranks, nconn,
                                                                     cc->slot_bytes,
                                                                     cc->ll_payload));
            k->ll_recv_rc = (struct weft_dev_recv_ctrl *)(mine + ll_from);
            k->ll_recv_slots = mine + ll_from + sizeof(struct weft_dev_recv_ctrl);
            k->ll_recv_sc = (struct weft_dev_send_ctrl *)(theirs + weft_dev_ll_head_off(
                                                                       c, me, nranks, nconn,
                                                                       cc->slot_bytes,
                                                                       cc->ll_payload));
        }
    }
    size_t conn_bytes = (size_t)nconn * nranks * sizeof(*conns);
    size_t state_bytes = sizeof(struct weft_dev_comm) + conn_bytes;
    WEFT_CUDA_CALL_GOTO(ops->malloc((void **)&cc->dstate, state_bytes), "cudaMalloc (state)", me,
                        res, err);
    struct weft_dev_comm st;
    memset(&st, 0, sizeof(st));
    st.rank = me;
    st.nranks = nranks;
    st.nchannels = cc->nch;
    st.local_ranks = comm->hier_k;
    st.nwin = nwin;
    st.slot_bytes = cc->slot_bytes;
    st.ll_payload = cc->ll_payload;
    st.timeout_ns = (uint64_t)weft_param_Timeout() * 1000000000ull;
    st.abort = (const uint32_t *)weft_cuda_dev_view(cc->abort_host);
    st.stuck = (struct weft_dev_stuck *)weft_cuda_dev_view(cc->stuck_host);
    st.busy = (uint32_t *)weft_cuda_dev_view(cc->busy_host);
    st.ring = cc->ring;
    st.ring_pos = cc->ring != NULL ? cc->ring + nranks : NULL;
    st.steps = cc->steps;
    st.conns = (struct weft_dev_conn *)(cc->dstate + 1);
    WEFT_CUDA_CALL_GOTO(ops->memcpy_async(cc->dstate, &st, sizeof(st), cc->stream),
                        "cudaMemcpyAsync", me, res, err);
    WEFT_CUDA_CALL_GOTO(ops->memcpy_async(cc->dstate + 1, conns, conn_bytes, cc->stream),
                        "cudaMemcpyAsync", me, res, err);
    WEFT_CUDA_CALL_GOTO(ops->stream_synchronize(cc->stream), "cudaStreamSynchronize", me, res,
                        err);
    cc->kernel.name = "weft_coll_kernel";
    cc->kernel.device_fn = weft_coll_kernel_device_fn != NULL ? weft_coll_kernel_device_fn()
                                                              : NULL;
    cc->kernel.emu_fn = weft_coll_kernel_emu;
    void (*test_emu)(void *) = __atomic_load_n(&weft_cuda_test_emu, __ATOMIC_ACQUIRE);
    const void *test_dev = __atomic_load_n(&weft_cuda_test_dev, __ATOMIC_ACQUIRE);
    cc->zkernel.name = "weft_zc_kernel";
    cc->zkernel.device_fn = weft_zc_kernel_device_fn != NULL ? weft_zc_kernel_device_fn() : NULL;
    cc->zkernel.emu_fn = weft_zc_kernel_emu;
    if (test_emu != NULL || test_dev != NULL) {
        cc->kernel.emu_fn = test_emu;
        cc->kernel.device_fn = test_dev;
        cc->zkernel.emu_fn = NULL; /* a test kernel knows no skip word */
    }
    WEFT_CHECK_GOTO(weft_cuda_load_kernels(comm, cc), res, err);
    free(conns);
    free(peers);
    free(reach);
    free(remote);
    free(xhost);
    free(shadows);
    free(want);
    free(mapped);
    if (prev >= 0)
        ops->set_device(prev);
    /* Published last, with release: ncclCommGetAsyncError of a non-blocking init reads it (in
     * weft_cuda_comm_check) while this runs on the communicator's stream. */
    __atomic_store_n(&comm->cuda, cc, __ATOMIC_RELEASE);
    cc->nhost_fifo = nhost;
    WEFT_INFO(WEFT_LOG_INIT, "rank %d: CUDA executor on device %d (%s): %d channels x %d "
              "threads, %zu-byte slots, %zu-byte LL slots, %zu bytes of FIFOs, %d peers in "
              "other processes (p2p), %d peers through host memory, %d on other hosts (socket "
              "proxy)", me, cc->dev, ops->name, cc->nch, cc->nthreads, cc->slot_bytes,
              cc->ll_payload, fifo_bytes, nranks - nlocal - nxhost, nhost, nxhost);
    return ncclSuccess;
err:
    free(conns);
    free(peers);
    free(reach);
    free(remote);
    free(xhost);
    free(shadows);
    free(want);
    free(mapped);
    if (cc != NULL)
        weft_cuda_release(comm, cc);
    if (prev >= 0)
        ops->set_device(prev);
    return res;
}

void weft_cuda_comm_abort(struct ncclComm *comm)
{
    struct weft_cuda_comm *cc = comm->cuda;
    if (cc == NULL)
        return;
    __atomic_store_n(cc->abort_host, 1, __ATOMIC_RELEASE);
    if (cc->clique != NULL && cc->clique->order != NULL)
        weft_cuda_order_leave(cc->clique->order, comm->rank);
}

ncclResult_t weft_cuda_comm_sync(struct ncclComm *comm)
{
    struct weft_cuda_comm *cc = comm->cuda;
    if (cc == NULL)
        return ncclSuccess;
    const struct weft_cuda_ops *ops = weft_cuda();
    int prev = -1, err;
    ops->get_device(&prev);
    ops->set_device(cc->dev);
    err = ops->stream_synchronize(cc->stream);
    if (prev >= 0)
        ops->set_device(prev);
    if (err != 0)
        return weft_cuda_fail(err, "cudaStreamSynchronize (the communicator's kernels)",
                              comm->rank);
    return weft_cuda_comm_check(comm);
}

/*
 * Before this rank's FIFO memory goes: the p2p transport unmaps the peers' and waits until no peer
 * maps this rank's (issue 29: a legacy IPC region freed under a peer still finishing its last
 * operation). Where that cannot be known (abort, a dead peer, deadline) legacy memory is kept
 * (leaked).
 */
static void weft_cuda_drain(struct ncclComm *comm, struct weft_cuda_comm *cc)
{
    if (cc->p2p == NULL)
        return;
    /* A peer found dead never comes to the barrier: keep the memory, leave the unmapping to
     * close. */
    if (__atomic_load_n(&cc->dead_peer, __ATOMIC_ACQUIRE) < 0 &&
        comm->dev_transport->drain(&comm->tctx, cc->p2p) == ncclSuccess)
        return;
    cc->keep_legacy = 1;
    if (cc->clique != NULL)
        __atomic_store_n(&cc->clique->keep_legacy, 1, __ATOMIC_RELEASE);
}

ncclResult_t weft_cuda_comm_free(struct ncclComm *comm)
{
    struct weft_cuda_comm *cc = comm->cuda;
    if (cc == NULL)
        return ncclSuccess;
    /* Kernels still queued finish first (an aborted one leaves at once); then say why a kernel
     * gave up, if one did and nobody asked yet. */
    const struct weft_cuda_ops *ops = weft_cuda();
    int prev = -1;
    ops->get_device(&prev);
    ops->set_device(cc->dev);
    ops->stream_synchronize(cc->stream);
    if (prev >= 0)
        ops->set_device(prev);
    weft_cuda_comm_check(comm);
    comm->cuda = NULL;
    weft_cuda_drain(comm, cc);
    weft_cuda_release(comm, cc);
    return ncclSuccess;
}

/* NCCL's name of each collective, for messages. */
static const char *weft_cuda_api_name(int coll)
{
    static const char *const names[WEFT_COLL_COUNT] = {
        "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
        "ncclAlltoAll",  "ncclGather",    "ncclScatter",       "ncclSend",      "ncclRecv",
    };
    return coll >= 0 && coll < WEFT_COLL_COUNT ? names[coll] : "an operation";
}

#define WEFT_CUDA_ALIVE_PERIOD_NS 100000000ull /* peers' liveness, at most every 100 ms */

static uint64_t weft_cuda_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A peer whose process is gone, or -1 (one system call or two per peer on this host): one that
 * died without leaving the communicator first, rather than one that left after its own error;
 * with left_too 0, only the former (a peer that destroyed the communicator and exited did its
 * part: the ranks still waiting may be waiting for a live, slow peer). */
static int weft_cuda_find_dead(const struct ncclComm *comm, int left_too)
{
    int left = -1;
    for (int p = 0; p < comm->nranks; p++) {
        if (weft_comm_peer_alive(comm, p))
            continue;
        int departed = weft_comm_peer_departed(comm, p);
        if (!departed)
            return p;
        if (left < 0 && left_too)
            left = p;
    }
    return left;
}

/* 1 while a block of one of this rank's kernels runs (the busy words the kernels keep). */
static int weft_cuda_kernel_running(const struct weft_cuda_comm *cc)
{
    for (int b = 0; b < cc->nch; b++)
        if (__atomic_load_n(&cc->busy_host[b], __ATOMIC_RELAXED) != 0)
            return 1;
    return 0;
}

/*
 * While the kernels run, a peer process that died (SIGKILL, crash) is found here rather than at
 * the kernels' deadline: then the abort word makes them leave, and the error names the dead peer.
 * Rate-limited, and only while a kernel of this rank runs: that is read from the pinned busy
 * words the kernels write, never by querying the stream, which under CUDA's global capture mode
 * fails (900) and invalidates every capture of the process (this runs at each launch, including
 * one under capture, and from ncclCommGetAsyncError, which a watchdog thread polls).
 */
static void weft_cuda_watch_peers(struct ncclComm *comm, struct weft_cuda_comm *cc)
{
    if (__atomic_load_n(&cc->dead_peer, __ATOMIC_ACQUIRE) >= 0)
        return;
    uint64_t now = weft_cuda_now_ns(), due = __atomic_load_n(&cc->alive_check_ns, __ATOMIC_RELAXED);
    if (now < due || !__atomic_compare_exchange_n(&cc->alive_check_ns, &due,
                                                  now + WEFT_CUDA_ALIVE_PERIOD_NS, 0,
                                                  __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    if (!weft_cuda_kernel_running(cc))
        return;
    /* Only a crash stops the kernels early; a peer that left is named at the deadline. */
    int dead = weft_cuda_find_dead(comm, 0);
    if (dead < 0)
        return;
    int none = -1;
    if (__atomic_compare_exchange_n(&cc->dead_peer, &none, dead, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        __atomic_store_n(cc->abort_host, 1, __ATOMIC_RELEASE);
}

/*
 * What a block that gave up waited for, in the user's words, as "for data from peer 1 (in this
 * process)"; the FIFO's step counters mean nothing to a user and stay out.
 */
static void weft_cuda_stuck_awaited(const struct ncclComm *comm, const struct weft_dev_stuck *st,
                                    const char *api, char *buf, size_t len)
{
    char where[WEFT_HOSTNAME_LEN + 48];
    if (st->peer < 0 || st->peer >= comm->nranks) {
        snprintf(buf, len, "with no peer to wait for");
        return;
    }
    weft_comm_peer_where(comm, st->peer, where, sizeof(where));
    switch (st->wait) {
    case WEFT_DEV_WAIT_JOIN:
        snprintf(buf, len, "for peer %d (%s) to call %s too (direct copy)", st->peer, where, api);
        break;
    case WEFT_DEV_WAIT_DONE:
        snprintf(buf, len, "for peer %d (%s) to finish reading this rank's buffers (direct copy)",
                 st->peer, where);
        break;
    default:
        if (st->send)
            snprintf(buf, len,
                     "for peer %d (%s) to receive the data sent so far (its receive "
                     "buffer is full)",
                     st->peer, where);
        else
            snprintf(buf, len, "for data from peer %d (%s)", st->peer, where);
        break;
    }
}

ncclResult_t weft_cuda_comm_check(struct ncclComm *comm)
{
    /* Acquire: may run while a non-blocking init is still setting up (see weft_cuda_comm_setup). */
    struct weft_cuda_comm *cc = __atomic_load_n(&comm->cuda, __ATOMIC_ACQUIRE);
    if (cc == NULL)
        return ncclSuccess;
    weft_cuda_watch_peers(comm, cc);
    const struct weft_dev_stuck *st = NULL;
    uint32_t state = WEFT_DEV_OK;
    /* The block that gave up for its own reason, rather than one that followed it. */
    for (int b = 0; b < cc->nch; b++) {
        uint32_t s = __atomic_load_n(&cc->stuck_host[b].state, __ATOMIC_ACQUIRE);
        if (s != WEFT_DEV_OK && (st == NULL || state == WEFT_DEV_ABORTED)) {
            st = &cc->stuck_host[b];
            state = s;
        }
    }
    if (st == NULL)
        return ncclSuccess;
    ncclResult_t res = state == WEFT_DEV_MISMATCH || state == WEFT_DEV_SIG_MISMATCH
                           ? ncclInvalidUsage
                       : state == WEFT_DEV_BAD_SCHED ? ncclInternalError
                                                     : ncclRemoteError;
    if (__atomic_exchange_n(&cc->reported, 1, __ATOMIC_ACQ_REL))
        return res;
    const char *api = weft_cuda_api_name(st->coll);
    char where[WEFT_HOSTNAME_LEN + 48], awaited[WEFT_HOSTNAME_LEN + 160];
    weft_cuda_stuck_awaited(comm, st, api, awaited, sizeof(awaited));
    int dead = __atomic_load_n(&cc->dead_peer, __ATOMIC_ACQUIRE);
    if (dead < 0 && state == WEFT_DEV_TIMEOUT)
        dead = weft_cuda_find_dead(comm, 1);
    if (dead >= 0 && (state == WEFT_DEV_TIMEOUT || state == WEFT_DEV_ABORTED)) {
        int left = weft_comm_peer_departed(comm, dead);
        WEFT_WARN("rank %d: peer %d (%s) %s while this rank's kernel waited %s in %s "
                  "(operation %llu)",
                  comm->rank, dead, weft_comm_peer_where(comm, dead, where, sizeof(where)),
                  left ? "destroyed the communicator and exited" : "died", awaited, api,
                  (unsigned long long)st->seq);
        weft_comm_set_error(comm, ncclRemoteError);
        return ncclRemoteError;
    }
    switch (state) {
    case WEFT_DEV_TIMEOUT: {
        char msg[1024];
        snprintf(msg, sizeof(msg),
                 "rank %d: no progress for %lld s on the device: %s (operation %llu) waited %s; "
                 "the peer is stuck or issued different operations",
                 comm->rank, (long long)weft_param_Timeout(), api, (unsigned long long)st->seq,
                 awaited);
        /* The report, and what the other ranks say: a mismatch that moved no data shows here. */
        uint64_t rec;
        if (weft_sig_find_op(comm, st->seq, &rec)) {
            struct weft_sig_wait w = {rec, st->peer, st->send, NULL, NULL};
            uint64_t idle = (uint64_t)weft_param_Timeout() * 1000000000ull;
            if (weft_sig_deadline(comm, &w, idle, msg, sizeof(msg)) != ncclSuccess) {
                res = ncclInvalidUsage;
                break;
            }
        }
        WEFT_WARN("%s", msg);
        break;
    }
    case WEFT_DEV_ABORTED:
        WEFT_WARN("rank %d: communicator aborted while %s (operation %llu) waited %s", comm->rank,
                  api, (unsigned long long)st->seq, awaited);
        break;
    case WEFT_DEV_SIG_MISMATCH: {
        /* Both calls named: exec/sig.c asks the peer for its signature. */
        uint64_t rec;
        if (weft_sig_find(comm, (uint32_t)st->expected, &rec)) {
            weft_sig_mismatch(comm, rec, st->peer, (uint32_t)st->seen);
            break;
        }
        WEFT_WARN("rank %d: peer %d sent a slice of another operation (signature 0x%08llx, this "
                  "rank's 0x%08llx) in %s (operation %llu, channel %d)",
                  comm->rank, st->peer, (unsigned long long)st->seen,
                  (unsigned long long)st->expected, api, (unsigned long long)st->seq,
                  st->channel);
        break;
    }
    case WEFT_DEV_MISMATCH:
        WEFT_WARN("rank %d: peer %d sent a %llu-byte slice where %llu bytes were expected in %s "
                  "(operation %llu, channel %d): count or datatype differ between ranks",
                  comm->rank, st->peer, (unsigned long long)st->seen,
                  (unsigned long long)st->expected, api, (unsigned long long)st->seq,
                  st->channel);
        break;
    default:
        WEFT_WARN("rank %d: the kernel found no schedule for %s (operation %llu)", comm->rank,
                  api, (unsigned long long)st->seq);
        break;
    }
    weft_comm_set_error(comm, res);
    return res;
}

/* Memory kind of a user buffer, and the address kernels use. */
static ncclResult_t weft_cuda_buf(struct ncclComm *comm, const void *buf, const char *name,
                                  const char *api, int *kind_p, int *dev_p, void **dev_ptr_p)
{
    struct weft_ptr_attr attr;
    int err = weft_cuda()->pointer_attr(&attr, buf);
    if (err != 0) {
        WEFT_WARN("%s: rank %d: cannot tell where %s %p lives: %s", api, comm->rank, name, buf,
                  weft_cuda()->error_string(err));
        return ncclInvalidArgument;
    }
    *kind_p = attr.kind;
    *dev_p = attr.device;
    *dev_ptr_p = attr.kind == WEFT_MEM_HOST_PINNED && attr.dev_ptr != NULL ? attr.dev_ptr
                                                                           : (void *)buf;
    return ncclSuccess;
}

static ncclResult_t weft_cuda_classify_buffers(struct ncclComm *comm, struct weft_task *task,
                                               int send_needed, int recv_needed);

ncclResult_t weft_cuda_classify(struct ncclComm *comm, struct weft_task *task, int send_needed,
                                int recv_needed)
{
    task->on_device = 0;
    /* Even without a device of ours the buffers are classified: the none backend recognises the
     * CUDA memory of a process that uses CUDA itself, which must fail cleanly, not be read. */
    if (!weft_cuda()->host_only())
        WEFT_CHECK(weft_cuda_classify_buffers(comm, task, send_needed, recv_needed));
    if (!task->on_device && task->has_redop && task->redop.scalar_dev != NULL) {
        /* A device-resident PreMulSum scalar for the host executor: read it now. */
        const struct weft_cuda_ops *ops = weft_cuda();
        size_t es = weft_dtype_size(task->dtype);
        int err = ops->memcpy_async(task->redop.scalar.bytes, task->redop.scalar_dev, es, NULL);
        if (err == 0)
            err = ops->stream_synchronize(NULL);
        if (err != 0)
            return weft_cuda_fail(err, "reading the PreMulSum scalar", comm->rank);
        task->redop.scalar_dev = NULL;
    }
    return ncclSuccess;
}

static ncclResult_t weft_cuda_classify_buffers(struct ncclComm *comm, struct weft_task *task,
                                               int send_needed, int recv_needed)
{
    const char *api = task->api;
    const void *bufs[2] = {task->sendbuf, task->recvbuf};
    const char *names[2] = {"sendbuff", "recvbuff"};
    int kinds[2] = {WEFT_MEM_HOST, WEFT_MEM_HOST}, devs[2] = {-1, -1};
    void *dptr[2] = {NULL, NULL};
    int any_dev = 0, any_host = 0;
    int needed[2] = {send_needed, recv_needed};
    for (int i = 0; i < 2; i++) {
        if (bufs[i] == NULL)
            continue;
        WEFT_CHECK(weft_cuda_buf(comm, bufs[i], names[i], api, &kinds[i], &devs[i], &dptr[i]));
        if (!needed[i]) /* not used on this rank (broadcast's input off the root, ...) */
            continue;
        if (kinds[i] == WEFT_MEM_HOST)
            any_host = 1;
        else
            any_dev = 1;
    }
    if (!any_dev)
        return ncclSuccess;
    int d = needed[0] && kinds[0] != WEFT_MEM_HOST ? 0 : 1;
    if (any_host) {
        WEFT_WARN("%s: rank %d: %s %p is host memory but %s %p is CUDA memory; both must be one "
                  "or the other", api, comm->rank, names[1 - d], bufs[1 - d], names[d], bufs[d]);
        return ncclInvalidArgument;
    }
    if (comm->cuda == NULL) {
        WEFT_WARN("%s: rank %d: %s %p is CUDA memory but the communicator has no CUDA device", api,
                  comm->rank, names[d], bufs[d]);
        return ncclInvalidArgument;
    }
    for (int i = 0; i < 2; i++) {
        if (bufs[i] != NULL && needed[i] && kinds[i] == WEFT_MEM_DEVICE &&
            devs[i] != comm->cuda->dev) {
            WEFT_WARN("%s: rank %d: %s %p is memory of device %d, the communicator's device is %d",
                      api, comm->rank, names[i], bufs[i], devs[i], comm->cuda->dev);
            return ncclInvalidArgument;
        }
    }
    task->on_device = 1;
    task->sendbuf = dptr[0];
    task->recvbuf = dptr[1];
    return ncclSuccess;
}

/*
 * The protocol of a device operation, from values every rank shares (the collective, NCCL's
 * count x element size, the knobs), so both ends of each connection pick the same FIFO: LL up
 * to WEFT_CUDA_LL_MAX_BYTES where NCCL_PROTO allows LL and Simple (or LL128, which the device
 * does not have and which stands for Simple here), only the allowed one otherwise; Simple
 * whenever the communicator spans hosts.
 */
static int weft_cuda_proto(const struct ncclComm *comm, int coll, size_t bytes)
{
    /* The device socket proxy (ranks on other hosts) bridges the Simple FIFOs only; nhosts is the
     * same on every rank. */
    if (comm->nhosts > 1)
        return WEFT_DEV_PROTO_SIMPLE;
    const struct weft_tune_cfg *tune = &comm->tune.cfg;
    int ll = weft_tune_ll(tune, coll), simple = weft_tune_slots(tune, coll);
    if (ll && (!simple || bytes <= (size_t)weft_param_CudaLlMaxBytes()))
        return WEFT_DEV_PROTO_LL;
    return WEFT_DEV_PROTO_SIMPLE;
}

/* The parameters of one task. */
static void weft_cuda_op(struct ncclComm *comm, const struct weft_task *t, struct weft_dev_op *op)
{
    size_t es = weft_dtype_size(t->dtype);
    memset(op, 0, sizeof(*op));
    op->count = t->count;
    op->sendbuf = t->sendbuf;
    op->recvbuf = t->recvbuf;
    op->seq = ++comm->op_seq;
    op->root = t->root;
    op->coll = (uint8_t)t->coll;
    /* An in-place all-to-all takes the direct order (weft_tune_algo_of), so the kernel needs no
     * copy of the input: a SEND step has copied its block into the FIFO slot when the lane moves
     * on. */
    op->algo = (uint8_t)weft_tune_algo_of(t->coll,
                                          t->coll == WEFT_COLL_ALLTOALL && t->sendbuf == t->recvbuf,
                                          t->count * es, &comm->tune);
    op->dtype = (uint8_t)t->dtype;
    if (t->has_redop) {
        op->has_redop = 1;
        op->kind = (uint8_t)t->redop.kind;
        op->premul = (uint8_t)t->redop.premul;
        op->postdiv = (uint8_t)t->redop.postdiv;
        op->divisor = t->redop.divisor;
        op->scalar = t->redop.scalar.u64;
        op->scalar_dev = t->redop.scalar_dev;
    }
    op->proto = (uint8_t)weft_cuda_proto(comm, t->coll, t->count * es);
    int dir = t->coll == WEFT_COLL_RECV;
    op->block = (uint8_t)((2 * t->root + dir) % comm->cuda->nch);
    /* The record ends at the launch: the host does not see a kernel's operations finish. */
    uint64_t rec;
    weft_sig_begin(comm, t, 1, t, &rec);
    op->sig = weft_sig_enabled() ? weft_sig_of(comm, rec)->hash : 0;
    weft_sig_end(comm, rec, 0);
    if (__builtin_expect(t->enq_ns != 0, 0)) { /* WEFT_TRACE_FILE: enqueue and launch */
        struct weft_trace_op tr = {
            .api = t->api, .coll = t->coll, .dtype = t->dtype, .algo = op->algo,
            .root = t->root, .device = 1, .seq = op->seq, .count = t->count,
            .enq_ns = t->enq_ns, .start_ns = weft_sig_rec(comm, rec)->start_ns,
        };
        weft_trace_record(comm, &tr);
    }
}

/*
 * A launch of the one operation t may go direct (registered buffers read and written in place by
 * the direct kernel) when this is 1. Decided only from what every rank shares: the collective,
 * its size against WEFT_ZCOPY_MIN_BYTES (weft_zcopy_candidate, the host path's test), and whether
 * every pair of ranks maps each other's device memory on one host;
 * never from this rank's registration (the direct kernel votes on that).
 */
static int weft_cuda_zc_candidate(const struct ncclComm *comm, const struct weft_task *t)
{
    const struct weft_cuda_comm *cc = comm->cuda;
    return cc->zpeers != NULL && cc->zkernel.emu_fn != NULL && t->count > 0 &&
           weft_zcopy_candidate(t);
}

/* reg_poll's report: peer's allocation id mapped here at base (NULL: withdrawn). */
static int weft_cuda_zc_seen(void *arg, int peer, uint64_t id, void *base, size_t bytes)
{
    struct weft_cuda_comm *cc = arg;
    struct weft_zc_import *imp = cc->zpeers[peer].imp;
    /* A second offer under a mapped id is refused: the direct kernel takes the first match. */
    for (int i = 0; base != NULL && i < WEFT_ZC_MAX_IMPORTS; i++) {
        if (__atomic_load_n(&imp[i].id, __ATOMIC_ACQUIRE) == id) {
            WEFT_INFO(WEFT_LOG_REG, "peer %d offered registered buffer %llu again: refused", peer,
                      (unsigned long long)id);
            return 0;
        }
    }
    for (int i = 0; i < WEFT_ZC_MAX_IMPORTS; i++) {
        uint64_t have = __atomic_load_n(&imp[i].id, __ATOMIC_ACQUIRE);
        if (base == NULL && have == id) {
            __atomic_store_n(&imp[i].id, 0, __ATOMIC_RELEASE);
            return 1;
        }
        if (base != NULL && have == 0) {
            imp[i].base = (uint64_t)(uintptr_t)base;
            imp[i].size = bytes;
            __atomic_store_n(&imp[i].id, id, __ATOMIC_RELEASE); /* the kernel reads id first */
            return 1;
        }
    }
    if (base != NULL)
        WEFT_INFO(WEFT_LOG_REG, "more than %d registered buffers of peer %d mapped: its newest "
                  "goes the normal path", WEFT_ZC_MAX_IMPORTS, peer);
    return 0;
}

/* Maps the peers' new shares and unmaps withdrawn ones (the current device is this rank's). */
static void weft_cuda_zc_poll(struct ncclComm *comm, struct weft_cuda_comm *cc)
{
    if (cc->zpeers == NULL || cc->p2p == NULL)
        return;
    pthread_mutex_lock(&cc->zc_lock);
    comm->dev_transport->reg_poll(&comm->tctx, cc->p2p, weft_cuda_zc_seen, cc);
    pthread_mutex_unlock(&cc->zc_lock);
}

uint64_t weft_cuda_reg_share(struct ncclComm *comm, void *base, size_t bytes, int cumem)
{
    struct weft_cuda_comm *cc = __atomic_load_n(&comm->cuda, __ATOMIC_ACQUIRE);
    if (cc == NULL || cc->zpeers == NULL || cc->p2p == NULL)
        return 0;
    const struct weft_cuda_ops *ops = weft_cuda();
    int prev = -1;
    ops->get_device(&prev);
    ops->set_device(cc->dev);
    pthread_mutex_lock(&cc->zc_lock);
    uint64_t id = ++cc->zc_next_id;
    int err = comm->dev_transport->reg_share(&comm->tctx, cc->p2p, id, base, bytes,
                                               cumem ? WEFT_DEV_HOW_FD : WEFT_DEV_HOW_LEGACY);
    comm->dev_transport->reg_poll(&comm->tctx, cc->p2p, weft_cuda_zc_seen, cc);
    pthread_mutex_unlock(&cc->zc_lock);
    if (prev >= 0)
        ops->set_device(prev);
    if (err != 0) {
        WEFT_INFO(WEFT_LOG_REG, "rank %d: sharing registered buffer %p with other processes: %s "
                  "(%d); collectives on it take the normal path", comm->rank, base,
                  ops->error_string(err), err);
        return 0;
    }
    return id;
}

void weft_cuda_reg_unshare(struct ncclComm *comm, uint64_t id)
{
    struct weft_cuda_comm *cc = __atomic_load_n(&comm->cuda, __ATOMIC_ACQUIRE);
    if (cc == NULL || cc->zpeers == NULL || cc->p2p == NULL || id == 0)
        return;
    pthread_mutex_lock(&cc->zc_lock);
    comm->dev_transport->reg_unshare(&comm->tctx, cc->p2p, id);
    pthread_mutex_unlock(&cc->zc_lock);
}

/* Launches the direct kernel for params->ops[0] (task t) before its normal launch, which then
 * skips when the direct kernel did the work. */
static ncclResult_t weft_cuda_zc_launch(struct ncclComm *comm, const struct weft_task *t,
                                        struct weft_dev_params *params)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    struct weft_cuda_comm *cc = comm->cuda;
    size_t bytes = t->count * weft_dtype_size(t->dtype), n = (size_t)comm->nranks;
    size_t in = t->coll == WEFT_COLL_REDUCESCATTER ? n * bytes : bytes;
    size_t out = t->coll == WEFT_COLL_ALLGATHER ? n * bytes : bytes;
    weft_cuda_zc_poll(comm, cc);
    struct weft_zc_params zp;
    memset(&zp, 0, sizeof(zp));
    zp.comm = cc->dstate;
    zp.peers = weft_cuda_dev_view(cc->zpeers);
    zp.skip = weft_cuda_dev_view(&cc->zrank->skip);
    zp.runs = weft_cuda_dev_view(&cc->zrank->runs);
    zp.vote2 = cc->p2p != NULL;
    /* As on the host path: all-gather and reduce-scatter write only their own output, so only
     * the inputs the peers read must be registered; all-reduce writes the peers' outputs too. */
    size_t soff = 0, roff = 0;
    zp.reg = weft_mem_reg_find(comm, t->sendbuf, in, &zp.send_id, &soff) &&
             (t->coll != WEFT_COLL_ALLREDUCE ||
              weft_mem_reg_find(comm, t->recvbuf, out, &zp.recv_id, &roff));
    zp.send_off = soff;
    zp.recv_off = roff;
    zp.op = params->ops[0];
    params->skip = zp.skip;
    WEFT_CUDA_CALL(ops->launch(&cc->zkernel, cc->nch, cc->nthreads, WEFT_DEV_SHARED_BYTES, &zp,
                               sizeof(zp), cc->stream),
                   "direct kernel launch", comm->rank);
    return ncclSuccess;
}

uint64_t weft_cuda_zcopy_count(struct ncclComm *comm)
{
    struct weft_cuda_comm *cc = comm->cuda;
    if (cc == NULL || cc->zrank == NULL)
        return 0;
    return __atomic_load_n(&cc->zrank->runs, __ATOMIC_ACQUIRE);
}

/*
 * The phase of each of comm's tasks (phase[t]; other communicators' entries are left as they
 * are), for cutting
 * a group into launches of at most WEFT_DEV_MAX_OPS operations. A launch's kernel finishes only
 * when the peers run the partners of its operations, so every rank must cut at points its peers
 * agree with: the phase of an operation is one its partners share. Collective i of the group has
 * phase i (every rank issues the same collectives in the same order); the k-th send to peer p,
 * and the k-th receive from peer p, phase ncoll + k (its partner is the k-th receive from, or
 * send to, this rank on p). A launch takes a run of whole phases: then by induction on the
 * phase, every operation's partner runs in a launch that has started or will once the launches
 * of earlier phases are done, and within a launch an operation waits only for earlier phases of
 * its own connection (the kernel keeps issue order per peer and direction). Returns the number of
 * phases, or -1 (logged): out of memory (*res_p = ncclSystemError), or one phase alone holds
 * more than WEFT_DEV_MAX_OPS operations (point-to-point with more than WEFT_DEV_MAX_OPS / 2 peers
 * each way in one round; *res_p = ncclInvalidUsage).
 */
static int weft_cuda_phases(struct ncclComm *comm, const struct weft_task *tasks, int ntasks,
                            int *phase, ncclResult_t *res_p)
{
    int nranks = comm->nranks, ncoll = 0, nphases = 0;
    /* queue[2 peer + dir]: operations so far; then widest[p]: operations of phase p */
    int *queue = calloc(2 * (size_t)nranks + (size_t)ntasks, sizeof(int)),
        *widest = queue + 2 * nranks;
    if (queue == NULL) {
        WEFT_WARN("rank %d: out of memory ordering %d device operations", comm->rank, ntasks);
        *res_p = ncclSystemError;
        return -1;
    }
    for (int t = 0; t < ntasks; t++)
        if (tasks[t].comm == comm && tasks[t].coll != WEFT_COLL_SEND &&
            tasks[t].coll != WEFT_COLL_RECV)
            ncoll++;
    for (int t = 0, c = 0; t < ntasks; t++) {
        if (tasks[t].comm != comm)
            continue;
        if (tasks[t].coll == WEFT_COLL_SEND || tasks[t].coll == WEFT_COLL_RECV)
            phase[t] = ncoll + queue[2 * tasks[t].root + (tasks[t].coll == WEFT_COLL_RECV)]++;
        else
            phase[t] = c++;
        if (phase[t] + 1 > nphases)
            nphases = phase[t] + 1;
        if (++widest[phase[t]] > WEFT_DEV_MAX_OPS) {
            WEFT_WARN("rank %d: more than %d device operations in one round of a group "
                      "(point-to-point with more than %d peers each way): split the group",
                      comm->rank, WEFT_DEV_MAX_OPS, WEFT_DEV_MAX_OPS / 2);
            free(queue);
            *res_p = ncclInvalidUsage;
            return -1;
        }
    }
    free(queue);
    return nphases;
}

/* 1 when the launch holds a collective (every rank then makes this launch). */
static int weft_cuda_has_coll(const struct weft_dev_params *params)
{
    for (int i = 0; i < params->nops; i++)
        if (params->ops[i].coll != WEFT_COLL_SEND && params->ops[i].coll != WEFT_COLL_RECV)
            return 1;
    return 0;
}

/* The user streams of comm's tasks, without repeats. */
static int weft_cuda_streams(const struct weft_task *tasks, int ntasks,
                             const struct ncclComm *comm, weft_cuda_stream_t *out, int max)
{
    int n = 0;
    for (int t = 0; t < ntasks; t++) {
        if (tasks[t].comm != comm)
            continue;
        int seen = 0;
        for (int i = 0; i < n; i++)
            seen |= out[i] == (weft_cuda_stream_t)tasks[t].stream;
        if (!seen && n < max)
            out[n++] = (weft_cuda_stream_t)tasks[t].stream;
    }
    return n;
}

#define WEFT_CUDA_MAX_STREAMS 64

/* One communicator's launches of a submission, queued one step at a time. */
struct weft_cuda_launches {
    struct ncclComm *comm;
    int nphases, next; /* phases, and the first not launched yet */
    int all_zc;        /* every operation a direct candidate: one launch each */
    int launched;      /* a kernel is queued: what comes next on its stream waits for it */
    struct weft_cuda_order *order; /* ranks of this process on its device to keep pace with */
    struct weft_dev_params *held;  /* its direct kernel is queued, itself not yet (or NULL) */
};

static int weft_cuda_launches_left(const struct weft_cuda_launches *L)
{
    return L->held != NULL || L->next < L->nphases;
}

static ncclResult_t weft_cuda_launch_params(struct weft_cuda_launches *L,
                                            const struct weft_dev_params *params)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    struct weft_cuda_comm *cc = L->comm->cuda;
    size_t bytes = offsetof(struct weft_dev_params, ops) +
                   (size_t)params->nops * sizeof(struct weft_dev_op);
    WEFT_CUDA_CALL(ops->launch(&cc->kernel, cc->nch, cc->nthreads, WEFT_DEV_SHARED_BYTES, params,
                               bytes, cc->stream),
                   "kernel launch", L->comm->rank);
    if (L->order != NULL)
        weft_cuda_order_launched(L->order, L->comm->rank, params);
    return ncclSuccess;
}

/*
 * Queues L's next kernel: as many whole phases as fit one launch (see weft_cuda_phases); a
 * lone direct candidate queues its direct kernel first and is held, its normal kernel (which
 * waits for the direct one on the stream) queued by the next step.
 */
static ncclResult_t weft_cuda_launch_step(struct weft_cuda_launches *L,
                                          const struct weft_task *tasks, int ntasks,
                                          const int *phase, struct weft_dev_params *params)
{
    struct ncclComm *comm = L->comm;
    struct weft_cuda_comm *cc = comm->cuda;
    L->launched = 1;
    if (L->held != NULL) {
        ncclResult_t res = weft_cuda_launch_params(L, L->held);
        free(L->held);
        L->held = NULL;
        return res;
    }
    /* phases p0 .. p1-1 */
    int p0 = L->next, p1 = p0, n = 0;
    while (p1 < L->nphases && !(L->all_zc && p1 > p0)) {
        int in = 0;
        for (int t = 0; t < ntasks; t++)
            in += tasks[t].comm == comm && phase[t] == p1;
        if (n + in > WEFT_DEV_MAX_OPS)
            break;
        n += in;
        p1++;
    }
    L->next = p1;
    memset(params, 0, sizeof(*params));
    params->comm = cc->dstate;
    int first = -1; /* the launch's first task */
    for (int t = 0; t < ntasks; t++) {
        if (tasks[t].comm != comm || phase[t] < p0 || phase[t] >= p1)
            continue;
        if (first < 0)
            first = t;
        weft_cuda_op(comm, &tasks[t], &params->ops[params->nops++]);
    }
    if (params->nops == 1 && weft_cuda_zc_candidate(comm, &tasks[first])) {
        WEFT_CHECK(weft_cuda_zc_launch(comm, &tasks[first], params));
        size_t bytes = offsetof(struct weft_dev_params, ops) + sizeof(struct weft_dev_op);
        if (L->order == NULL)
            return weft_cuda_launch_params(L, params);
        weft_cuda_order_launched_direct(L->order, comm->rank);
        L->held = malloc(bytes);
        if (L->held == NULL) {
            WEFT_WARN("rank %d: out of memory launching a device operation", comm->rank);
            return ncclSystemError;
        }
        memcpy(L->held, params, bytes);
        return ncclSuccess;
    }
    if (cc->zpeers != NULL && weft_cuda_has_coll(params))
        params->zc_mine = (struct weft_zc_slot *)(cc->fifo + cc->zc_off);
    return weft_cuda_launch_params(L, params);
}

ncclResult_t weft_cuda_exec(struct weft_task *tasks, int ntasks)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    ncclResult_t res = ncclSuccess;
    int prev = -1, ncomms = 0;
    ops->get_device(&prev);
    struct weft_cuda_launches *L = calloc((size_t)ntasks, sizeof(*L));
    struct weft_dev_params *params = malloc(sizeof(*params));
    int *phase = calloc((size_t)ntasks, sizeof(int));
    weft_cuda_stream_t streams[WEFT_CUDA_MAX_STREAMS];
    if (L == NULL || params == NULL || phase == NULL) {
        WEFT_WARN("out of memory launching %d device operations", ntasks);
        res = ncclSystemError;
        goto out;
    }

    for (int t = 0; t < ntasks; t++) {
        int seen = 0;
        for (int i = 0; i < ncomms; i++)
            seen |= L[i].comm == tasks[t].comm;
        if (!seen)
            L[ncomms++].comm = tasks[t].comm;
    }
    for (int i = 0; i < ncomms; i++) {
        struct ncclComm *comm = L[i].comm;
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
            WEFT_WARN("rank %d: communicator aborted", comm->rank);
            res = ncclInvalidUsage;
            goto out;
        }
        WEFT_CHECK_GOTO(weft_cuda_comm_check(comm), res, out);
        /* Before anything is enqueued: the group can be cut into launches. */
        L[i].nphases = weft_cuda_phases(comm, tasks, ntasks, phase, &res);
        if (L[i].nphases < 0)
            goto out;
        /* A group whose every operation is a direct candidate (collectives only: each phase one
         * collective) goes one launch per operation, each with its direct kernel. The same cut
         * on every rank: candidates are decided from shared values. */
        L[i].all_zc = 1;
        for (int t = 0; t < ntasks && L[i].all_zc; t++)
            L[i].all_zc = tasks[t].comm != comm || weft_cuda_zc_candidate(comm, &tasks[t]);
    }
    /* 1: the internal streams wait for their users' streams. */
    for (int i = 0; i < ncomms; i++) {
        struct weft_cuda_comm *cc = L[i].comm->cuda;
        int me = L[i].comm->rank;
        WEFT_CUDA_CALL_GOTO(ops->set_device(cc->dev), "cudaSetDevice", me, res, out);
        int ns = weft_cuda_streams(tasks, ntasks, L[i].comm, streams, WEFT_CUDA_MAX_STREAMS);
        for (int s = 0; s < ns; s++) {
            WEFT_CUDA_CALL_GOTO(ops->event_record(cc->ev_in, streams[s]), "cudaEventRecord", me,
                                res, out);
            WEFT_CUDA_CALL_GOTO(ops->stream_wait_event(cc->stream, cc->ev_in),
                                "cudaStreamWaitEvent", me, res, out);
        }
        /* Ranks of this process on this device keep pace (exec/cuda_order.h), except in a
         * capture (nothing is queued). */
        int capturing = 0;
        if (cc->clique != NULL && cc->clique->order != NULL)
            WEFT_CUDA_CALL_GOTO(ops->stream_capturing(cc->stream, &capturing),
                                "cudaStreamIsCapturing", me, res, out);
        if (cc->clique != NULL && !capturing)
            L[i].order = cc->clique->order;
    }
    /* 2: the launches (one per communicator, more where a group holds more than
     * WEFT_DEV_MAX_OPS, cut at phases), one step per communicator in turn. A communicator's
     * next kernel waits for its previous one on its stream, so it is queued only once the ranks
     * of its device launched what the previous one waits for; while none can go on, the first
     * that cannot waits for them. */
    for (;;) {
        int left = 0, moved = 0, stuck = -1;
        for (int i = 0; i < ncomms; i++) {
            if (!weft_cuda_launches_left(&L[i]))
                continue;
            left = 1;
            struct ncclComm *comm = L[i].comm;
            if (L[i].launched && L[i].order != NULL &&
                !weft_cuda_order_ready(L[i].order, comm->rank)) {
                stuck = stuck < 0 ? i : stuck;
                continue;
            }
            WEFT_CUDA_CALL_GOTO(ops->set_device(comm->cuda->dev), "cudaSetDevice", comm->rank,
                                res, out);
            WEFT_CHECK_GOTO(weft_cuda_launch_step(&L[i], tasks, ntasks, phase, params), res, out);
            moved = 1;
        }
        if (!left)
            break;
        if (!moved)
            WEFT_CHECK_GOTO(weft_cuda_order_wait(L[stuck].order, L[stuck].comm), res, out);
    }
    /* 3: the users' streams wait for the launches (once the device's ranks kept pace). */
    for (int i = 0; i < ncomms; i++) {
        struct weft_cuda_comm *cc = L[i].comm->cuda;
        int me = L[i].comm->rank;
        if (L[i].order != NULL)
            WEFT_CHECK_GOTO(weft_cuda_order_wait(L[i].order, L[i].comm), res, out);
        WEFT_CUDA_CALL_GOTO(ops->set_device(cc->dev), "cudaSetDevice", me, res, out);
        WEFT_CUDA_CALL_GOTO(ops->event_record(cc->ev_out, cc->stream), "cudaEventRecord", me, res,
                            out);
        int ns = weft_cuda_streams(tasks, ntasks, L[i].comm, streams, WEFT_CUDA_MAX_STREAMS);
        for (int s = 0; s < ns; s++)
            WEFT_CUDA_CALL_GOTO(ops->stream_wait_event(streams[s], cc->ev_out),
                                "cudaStreamWaitEvent", me, res, out);
    }
out:
    if (prev >= 0)
        ops->set_device(prev);
    if (WEFT_IS_ERROR(res))
        for (int i = 0; i < ncomms; i++)
            weft_comm_set_error(L[i].comm, res);
    for (int i = 0; i < ncomms; i++)
        free(L[i].held);
    free(phase);
    free(params);
    free(L);
    return res;
}

