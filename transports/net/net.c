/*
 * Net transport: ranks on different hosts through a network provider with NCCL's net plugin
 * semantics (net.h, net_abi.h): today an external plugin; the socket and InfiniBand providers
 * follow. Used when the communicator's network is a provider (weft_net_open chose one), for
 * every pair of ranks shared memory does not join.
 *
 * As on the socket transport, the step engine only touches local memory: for every FIFO channel
 * and every peer a rank owns a send FIFO its lanes fill and a receive FIFO its lanes drain
 * (fifo.h layout; channels 0 .. nch-1 are slot FIFOs, nch .. 2 nch-1 LL FIFOs when LL is
 * allowed). One proxy thread per communicator moves them over one provider connection per
 * (peer, FIFO channel, direction), as NCCL's net transport does per channel:
 *
 *   sender rank:    posts slot s (seq = s + 1 last) and rings the proxy's doorbell;
 *   sender proxy:   isend(slot s from its bytes field: bytes, sig, payload), in step order;
 *                   when the oldest send completes, stores the FIFO's head = s + 1 (the rank may
 *                   reuse the slot) and rings the rank;
 *   receiver proxy: keeps an irecv posted for every slot the rank has freed (head + nslots),
 *                   into the slot from its bytes field; when the oldest completes, checks the
 *                   size against the bytes field and stores seq = s + 1 (release), rings the rank.
 * The seq word never crosses the network: a receiver sees it only after the provider said the
 * whole message landed, whatever order the provider writes bytes in (RDMA writes have none).
 * Sends and receives of one connection match in posting order (the provider's rule), so step s
 * of the sender is step s of the receiver.
 *
 * A provider gives no descriptor to sleep on: an idle proxy polls for the spin time, then sleeps
 * on its doorbell (rung by its rank's posts and frees) for a time that doubles from 20 us up to
 * WEFT_NET_POLL_MAX_US while nothing arrives, so data from a peer waits at most that long after
 * a quiet spell. Errors from the provider fail the peer: the proxy records them on the
 * communicator (naming the peer, its host, the channel and the call) and rings the rank, whose
 * wait then fails the operation with ncclRemoteError.
 *
 * Setup: each rank listens once per (peer, FIFO channel) and sends the peer its handles over the
 * bootstrap; then every rank connects to its peers' handles and accepts their connections in one
 * loop (both calls never block), bounded by the bootstrap deadline and the abort flag; the FIFOs
 * are registered with their connections. Close hands posted slots to the provider first (bounded
 * by WEFT_SOCKET_FLUSH_TIMEOUT, skipped after abort).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "algo/tuner.h"
#include "bootstrap/bootstrap.h"
#include "core/check.h"
#include "core/peer_info.h"
#include "core/param.h"
#include "fifo.h"
#include "link.h"
#include "net.h"
#include "transport.h"

WEFT_PARAM(NetPollMaxUs, "WEFT_NET_POLL_MAX_US", 1000,
           "longest microseconds an idle net proxy sleeps between polls of its provider");
WEFT_PARAM(NetSlotBytes, "WEFT_NET_SLOT_BYTES", 524288,
           "bytes of each slot of a net plugin's host FIFOs, header included (a multiple of 64, "
           "4096 .. 1 GiB)");
WEFT_PARAM_DECL(SocketSpinUs);
WEFT_PARAM_DECL(SocketFlushTimeout);
WEFT_PARAM_DECL(BootstrapTimeout);

#define WEFT_NET_TAG (0x57530000 - 0x200)
#define WEFT_NET_MAX_SLOTS (WEFT_LL_SLOTS > WEFT_STEPS ? WEFT_LL_SLOTS : WEFT_STEPS)
/* What crosses the network from a slot: the header after seq, then the payload. */
#define WEFT_NET_SKIP offsetof(struct weft_slot_header, bytes)

/* One (peer, FIFO channel): the two local FIFOs, their provider connections and requests. */
struct weft_net_fifo {
    struct weft_conn send, recv;
    size_t bytes;               /* of each FIFO's slots */
    struct weft_net_link *link; /* its provider connections (st->links) */
    void *send_mh, *recv_mh;
    uint64_t tx_posted, tx_done; /* steps handed to isend, steps whose send completed */
    uint64_t rx_posted, rx_done; /* steps with an irecv posted, steps received */
    int peer_bye;                /* the peer's goodbye arrived: it closed this connection */
    void *bye_req;               /* our goodbye, while in flight */
    int bye_sent;
    void *tx_req[WEFT_NET_MAX_SLOTS];
    void *rx_req[WEFT_NET_MAX_SLOTS];
};

struct weft_net_peer {
    int rank;
    int dead;
    char where[160]; /* "peer 3 (host h)" */
    void *mem;
    size_t mem_bytes;
    struct weft_net_fifo *fifos; /* [nfifo] */
};

enum { WEFT_NET_RUN = 0, WEFT_NET_FLUSH, WEFT_NET_STOP };

struct weft_net_state {
    /* the proxy's doorbell, alone in its cache line */
    struct weft_doorbell bell __attribute__((aligned(WEFT_CACHELINE)));
    const struct weft_transport_ctx *ctx;
    const struct weft_net *net;
    const ncclNet_v11_t *t;
    int me, nch, nfifo, dev;
    size_t slot_bytes;
    uint64_t spin_ns, poll_max_ns;
    struct weft_net_peer *peers; /* [npeers] */
    int npeers;
    struct weft_net_link *links; /* [npeers][nfifo] */
    struct weft_doorbell *rank_bell;
    struct weft_doorbell *own_bell; /* the rank's doorbell when no other transport had one */
    pthread_t tid;
    int started;
    int stop;
    int flushed; /* the proxy saw every posted send complete while flushing */
};

static int net_can_connect(const struct weft_transport_ctx *ctx, int a, int b)
{
    return a != b && ctx->net != NULL; /* shm is asked first; a rank and itself: socket */
}

static ncclResult_t net_slot_bytes(const struct weft_transport_ctx *ctx, size_t *bytes_p)
{
    int64_t slot = weft_param_NetSlotBytes();
    if (slot < 4096 || slot % 64 != 0 || slot > (1 << 30)) { /* header included */
        WEFT_WARN("WEFT_NET_SLOT_BYTES %lld must be a multiple of 64 between 4096 and 1 GiB",
                  (long long)slot);
        return ncclInvalidArgument;
    }
    if (ctx->net != NULL && (size_t)slot > ctx->net->props.maxP2pBytes) {
        WEFT_WARN("NET/%s: WEFT_NET_SLOT_BYTES %lld is above the network's largest message "
                  "(%zu bytes)",
                  ctx->net->name, (long long)slot, ctx->net->props.maxP2pBytes);
        return ncclInvalidArgument;
    }
    *bytes_p = (size_t)slot;
    return ncclSuccess;
}

/* ---- the proxy ----------------------------------------------------------------------------- */

static void net_peer_fail(struct weft_net_state *st, struct weft_net_peer *p, int c,
                          const char *call, ncclResult_t res)
{
    if (p->dead)
        return;
    p->dead = 1;
    int left = 0; /* the peer said goodbye: it closed its communicator */
    for (int k = 0; k < st->nfifo; k++)
        left |= p->fifos[k].peer_bye;
    if (__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE) == WEFT_NET_STOP ||
        (left && strcmp(call, "goodbye") == 0))
        return;
    if (left) {
        WEFT_WARN("rank %d: NET/%s: %s closed its communicator while this rank still had data "
                  "for it (FIFO channel %d): the ranks issued different operations",
                  st->me, st->net->name, p->where, c);
        weft_transport_fail(st->ctx, ncclRemoteError,
                                "%s closed its communicator while this rank still had data for it",
                                p->where);
    } else {
        /* the provider's ncclRemoteError: the peer's end went away without our goodbye */
        const char *how = res == ncclRemoteError ? "connection closed by the peer without a "
                                                   "goodbye (it died or aborted)"
                                                 : "network error";
        WEFT_WARN("rank %d: NET/%s: %s: %s failed on FIFO channel %d (error %d): %s", st->me,
                  st->net->name, p->where, call, c, (int)res, how);
        weft_transport_fail(st->ctx, ncclRemoteError, "NET/%s: %s: %s (%s failed)",
                                st->net->name, p->where, how, call);
    }
    weft_doorbell_ring(st->rank_bell);
}

/* Moves one FIFO channel of one peer as far as it goes now. Returns 1 if anything moved. */
static int net_fifo_progress(struct weft_net_state *st, struct weft_net_peer *p, int c)
{
    const ncclNet_v11_t *t = st->t;
    struct weft_net_fifo *f = &p->fifos[c];
    uint32_t nslots = f->send.nslots;
    int work = 0, ring = 0;
    ncclResult_t res;
    /* sends: hand over posted slots in order, then retire the oldest that completed */
    while (f->tx_posted < f->tx_done + nslots) {
        struct weft_slot_header *h = weft_conn_slot(&f->send, f->tx_posted);
        if (__atomic_load_n(&h->seq, __ATOMIC_ACQUIRE) != f->tx_posted + 1)
            break;
        size_t size = WEFT_SLOT_HEADER - WEFT_NET_SKIP + h->bytes;
        if (size > f->send.slot_bytes - WEFT_NET_SKIP)
            size = f->send.slot_bytes - WEFT_NET_SKIP; /* never: the lanes fill at most a slot */
        void *req = NULL;
        res = t->isend(f->link->send_comm, (char *)h + WEFT_NET_SKIP, size, st->me, f->send_mh,
                       NULL, &req);
        if (res != ncclSuccess)
            return net_peer_fail(st, p, c, "isend", res), 1;
        if (req == NULL)
            break; /* the provider is not ready: again on the next pass */
        f->tx_req[f->tx_posted % nslots] = req;
        f->tx_posted++;
        work = 1;
    }
    while (f->tx_done < f->tx_posted) {
        int done = 0;
        res = t->test(f->tx_req[f->tx_done % nslots], &done, NULL);
        if (res != ncclSuccess)
            return net_peer_fail(st, p, c, "send test", res), 1;
        if (!done)
            break;
        f->tx_done++;
        __atomic_store_n(&f->send.ctrl->head, f->tx_done, __ATOMIC_RELEASE);
        work = ring = 1;
    }
    /* receives: one posted for every slot the rank freed; publish the oldest that landed */
    if (f->peer_bye)
        goto out; /* the peer closed this connection; what is still posted never completes */
    uint64_t head = __atomic_load_n(&f->recv.ctrl->head, __ATOMIC_ACQUIRE);
    while (f->rx_posted < head + nslots) {
        struct weft_slot_header *h = weft_conn_slot(&f->recv, f->rx_posted);
        void *data = (char *)h + WEFT_NET_SKIP;
        size_t size = f->recv.slot_bytes - WEFT_NET_SKIP;
        int tag = p->rank;
        void *req = NULL;
        res = t->irecv(f->link->recv_comm, 1, &data, &size, &tag, &f->recv_mh, NULL, &req);
        if (res != ncclSuccess)
            return net_peer_fail(st, p, c, "irecv", res), 1;
        if (req == NULL)
            break;
        f->rx_req[f->rx_posted % nslots] = req;
        f->rx_posted++;
        work = 1;
    }
    while (f->rx_done < f->rx_posted) {
        int done = 0, size = 0;
        res = t->test(f->rx_req[f->rx_done % nslots], &done, &size);
        if (res != ncclSuccess)
            return net_peer_fail(st, p, c, "receive test", res), 1;
        if (!done)
            break;
        if (size == 0) {
            f->peer_bye = 1; /* a goodbye: no step is ever empty (bytes and sig travel) */
            work = 1;
            break;
        }
        struct weft_slot_header *h = weft_conn_slot(&f->recv, f->rx_done);
        size_t want = WEFT_SLOT_HEADER - WEFT_NET_SKIP + (size_t)h->bytes;
        if (size < (int)(WEFT_SLOT_HEADER - WEFT_NET_SKIP) || (size_t)size != want) {
            WEFT_WARN("rank %d: NET/%s: %s sent %d bytes for step %llu of FIFO channel %d, "
                      "whose header says %u payload bytes",
                      st->me, st->net->name, p->where, size, (unsigned long long)f->rx_done, c,
                      h->bytes);
            net_peer_fail(st, p, c, "a malformed message", ncclRemoteError);
            return 1;
        }
        __atomic_store_n(&h->seq, f->rx_done + 1, __ATOMIC_RELEASE);
        f->rx_done++;
        work = ring = 1;
    }
out:
    if (ring)
        weft_doorbell_ring(st->rank_bell);
    return work;
}

/* One pass over every connection. Returns 1 if anything moved. */
static int net_scan(struct weft_net_state *st)
{
    int work = 0;
    for (int pi = 0; pi < st->npeers; pi++) {
        struct weft_net_peer *p = &st->peers[pi];
        for (int c = 0; c < st->nfifo && !p->dead; c++)
            work |= net_fifo_progress(st, p, c);
    }
    return work;
}

/*
 * Flushing: once every slot posted before close left this rank, a goodbye (an empty message) goes
 * on every connection, so the peer knows that the end of the connection which follows is a
 * departure and not a failure. 1 once every goodbye left (or its peer is gone).
 */
static int net_flushed(struct weft_net_state *st)
{
    int flushed = 1;
    for (int pi = 0; pi < st->npeers; pi++) {
        struct weft_net_peer *p = &st->peers[pi];
        for (int c = 0; c < st->nfifo && !p->dead; c++) {
            struct weft_net_fifo *f = &p->fifos[c];
            struct weft_slot_header *h = weft_conn_slot(&f->send, f->tx_posted);
            if (f->tx_done < f->tx_posted ||
                __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE) == f->tx_posted + 1) {
                flushed = 0;
                continue;
            }
            if (f->bye_sent)
                continue;
            ncclResult_t res;
            int done = 0;
            if (f->bye_req == NULL) {
                res = st->t->isend(f->link->send_comm, f->send.slots, 0, st->me, f->send_mh, NULL,
                                   &f->bye_req);
                if (res != ncclSuccess) {
                    net_peer_fail(st, p, c, "goodbye", res);
                    continue;
                }
            }
            if (f->bye_req != NULL) {
                res = st->t->test(f->bye_req, &done, NULL);
                if (res != ncclSuccess) {
                    net_peer_fail(st, p, c, "goodbye", res);
                    continue;
                }
            }
            if (done)
                f->bye_sent = 1;
            else
                flushed = 0;
        }
    }
    return flushed;
}

static int net_recheck(void *arg)
{
    return net_scan(arg);
}

static void *net_proxy_main(void *arg)
{
    struct weft_net_state *st = arg;
    struct weft_net_nap nap = {0, 0};
    for (;;) {
        int stop = __atomic_load_n(&st->stop, __ATOMIC_ACQUIRE);
        if (stop == WEFT_NET_STOP)
            break;
        int work = net_scan(st);
        if (stop == WEFT_NET_FLUSH && net_flushed(st)) {
            __atomic_store_n(&st->flushed, 1, __ATOMIC_RELEASE);
            break;
        }
        if (work)
            weft_net_nap_reset(&nap);
        else
            weft_net_nap(&nap, &st->bell, st->spin_ns, st->poll_max_ns, net_recheck, st);
    }
    return NULL;
}

static void net_proxy_stop(struct weft_net_state *st, int flush)
{
    if (!st->started)
        return;
    const struct weft_transport_ctx *ctx = st->ctx;
    int64_t secs = weft_param_SocketFlushTimeout();
    if (flush && !__atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE) && secs > 0) {
        __atomic_store_n(&st->stop, WEFT_NET_FLUSH, __ATOMIC_RELEASE);
        __atomic_fetch_add(&st->bell.seq, 1, __ATOMIC_SEQ_CST);
        weft_futex_wake(&st->bell.seq);
        uint64_t deadline = weft_time_ns() + (uint64_t)secs * 1000000000ull;
        while (!__atomic_load_n(&st->flushed, __ATOMIC_ACQUIRE) &&
               !__atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE)) {
            if (weft_time_ns() > deadline) {
                WEFT_INFO(WEFT_LOG_NET,
                          "rank %d: NET/%s could not hand all posted data to the "
                          "network within %lld s; closing anyway",
                          st->me, st->net->name, (long long)secs);
                break;
            }
            usleep(1000);
        }
    }
    __atomic_store_n(&st->stop, WEFT_NET_STOP, __ATOMIC_RELEASE);
    __atomic_fetch_add(&st->bell.seq, 1, __ATOMIC_SEQ_CST);
    weft_futex_wake(&st->bell.seq);
    pthread_join(st->tid, NULL);
    st->started = 0;
}

/* ---- setup and close ----------------------------------------------------------------------- */

static ncclResult_t net_close(const struct weft_transport_ctx *ctx, void *state)
{
    (void)ctx; /* the state holds it (its proxy ran with it) */
    struct weft_net_state *st = state;
    if (st == NULL)
        return ncclSuccess;
    net_proxy_stop(st, 1);
    const ncclNet_v11_t *t = st->t;
    for (int pi = 0; st->peers != NULL && pi < st->npeers; pi++) {
        struct weft_net_peer *p = &st->peers[pi];
        for (int c = 0; p->fifos != NULL && c < st->nfifo; c++) {
            struct weft_net_fifo *f = &p->fifos[c];
            if (f->send_mh != NULL)
                (void)t->deregMr(f->link->send_comm, f->send_mh);
            if (f->recv_mh != NULL)
                (void)t->deregMr(f->link->recv_comm, f->recv_mh);
        }
        free(p->fifos);
        if (p->mem != NULL)
            munmap(p->mem, p->mem_bytes);
    }
    weft_net_links_close(st->net, st->links, st->npeers * st->nfifo);
    free(st->links);
    free(st->own_bell);
    free(st->peers);
    free(st);
    return ncclSuccess;
}

static size_t net_fifo_stride(size_t slot, uint32_t nslots)
{
    return (sizeof(struct weft_fifo_ctrl) + nslots * slot + 4095) & ~(size_t)4095;
}

/* The local FIFOs of one peer, entered into the communicator's connection table. */
static ncclResult_t net_peer_init(struct weft_net_state *st, struct weft_transport_out *out,
                                   struct weft_net_peer *p, int rank)
{
    const struct weft_transport_ctx *ctx = st->ctx;
    p->rank = rank;
    snprintf(p->where, sizeof(p->where), "peer %d (host %s)", rank, ctx->peers[rank].hostname);
    size_t stride = net_fifo_stride(st->slot_bytes, WEFT_STEPS);
    size_t ll_stride = net_fifo_stride(WEFT_LL_SLOT_BYTES, WEFT_LL_SLOTS);
    p->mem_bytes = (size_t)st->nch * 2 * stride + (size_t)(st->nfifo - st->nch) * 2 * ll_stride;
    void *mem =
        mmap(NULL, p->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        WEFT_WARN("mmap of %zu bytes for the net FIFOs of %s failed: %s", p->mem_bytes, p->where,
                  strerror(errno));
        return ncclSystemError;
    }
    p->mem = mem;
    WEFT_CALLOC(p->fifos, (size_t)st->nfifo);
    char *at = mem;
    for (int c = 0; c < st->nfifo; c++) {
        struct weft_net_fifo *f = &p->fifos[c];
        int ll = c >= st->nch;
        size_t slot_bytes = ll ? WEFT_LL_SLOT_BYTES : st->slot_bytes;
        uint32_t nslots = ll ? WEFT_LL_SLOTS : WEFT_STEPS;
        size_t fifo_stride = ll ? ll_stride : stride;
        f->bytes = nslots * slot_bytes;
        f->send = (struct weft_conn){.ctrl = (struct weft_fifo_ctrl *)at,
                                     .slots = at + sizeof(struct weft_fifo_ctrl),
                                     .slot_bytes = slot_bytes,
                                     .nslots = nslots,
                                     .peer_bell = &st->bell};
        at += fifo_stride;
        f->recv = (struct weft_conn){.ctrl = (struct weft_fifo_ctrl *)at,
                                     .slots = at + sizeof(struct weft_fifo_ctrl),
                                     .slot_bytes = slot_bytes,
                                     .nslots = nslots,
                                     .peer_bell = &st->bell};
        at += fifo_stride;
    }
    for (int c = 0; c < st->nch; c++) {
        struct weft_net_fifo *f = &p->fifos[c];
        if (st->nfifo > st->nch) {
            f->send.ll = &p->fifos[st->nch + c].send;
            f->recv.ll = &p->fifos[st->nch + c].recv;
        }
        out->chan_peers[c][rank].send = &f->send;
        out->chan_peers[c][rank].recv = &f->recv;
    }
    return ncclSuccess;
}

static ncclResult_t net_register(struct weft_net_state *st)
{
    const ncclNet_v11_t *t = st->t;
    for (int pi = 0; pi < st->npeers; pi++) {
        struct weft_net_peer *p = &st->peers[pi];
        for (int c = 0; c < st->nfifo; c++) {
            struct weft_net_fifo *f = &p->fifos[c];
            ncclResult_t res =
                t->regMr(f->link->send_comm, f->send.slots, f->bytes, NCCL_PTR_HOST, &f->send_mh);
            if (res == ncclSuccess)
                res = t->regMr(f->link->recv_comm, f->recv.slots, f->bytes, NCCL_PTR_HOST,
                               &f->recv_mh);
            if (res != ncclSuccess) {
                WEFT_WARN("rank %d: NET/%s: registering the FIFOs of %s failed (error %d)", st->me,
                          st->net->name, p->where, (int)res);
                return res;
            }
        }
    }
    return ncclSuccess;
}

static ncclResult_t net_setup(const struct weft_transport_ctx *ctx, const uint8_t *peer_mask,
                             struct weft_transport_out *out, void **state_p)
{
    ncclResult_t res = ncclSuccess;
    struct weft_net_state *st = NULL;
    if (posix_memalign((void **)&st, WEFT_CACHELINE, sizeof(*st)) != 0) {
        WEFT_WARN("out of memory for the net transport");
        return ncclSystemError;
    }
    memset(st, 0, sizeof(*st));
    weft_doorbell_init(&st->bell, WEFT_BELL_FUTEX, -1);
    st->ctx = ctx;
    st->net = ctx->net;
    st->t = ctx->net->table;
    st->me = ctx->rank;
    st->nch = ctx->nchannels + 1;
    st->nfifo = ctx->ll ? 2 * st->nch : st->nch;
    st->slot_bytes = ctx->slot_bytes;
    int64_t spin = weft_param_SocketSpinUs();
    st->spin_ns = (uint64_t)(spin >= 0 ? spin : ctx->oversubscribed ? 0 : 50) * 1000ull;
    int64_t poll_max = weft_param_NetPollMaxUs();
    st->poll_max_ns = (uint64_t)(poll_max < 20 ? 20 : poll_max) * 1000ull;
    /* devices in turn over the ranks of this host (topology will choose the nearest) */
    int local = 0;
    for (int r = 0; r < ctx->rank; r++)
        local += ctx->peers[r].host_hash == ctx->peers[ctx->rank].host_hash;
    st->dev = local % st->net->ndev;
    if (ctx->bell == NULL) {
        if (posix_memalign((void **)&st->own_bell, WEFT_CACHELINE, sizeof(*st->own_bell)) != 0) {
            st->own_bell = NULL;
            WEFT_WARN("out of memory for a doorbell");
            res = ncclSystemError;
            goto err;
        }
        weft_doorbell_init(st->own_bell, WEFT_BELL_FUTEX, -1);
        out->bell = st->own_bell;
    }
    st->rank_bell = ctx->bell != NULL ? ctx->bell : out->bell;
    out->proxied = 1;
    for (int p = 0; p < ctx->nranks; p++)
        st->npeers += p != ctx->rank && peer_mask[p];
    st->peers = calloc((size_t)st->npeers + 1, sizeof(*st->peers));
    if (st->peers == NULL) {
        WEFT_WARN("out of memory for %d net peers", st->npeers);
        res = ncclSystemError;
        goto err;
    }
    int np = 0;
    for (int p = 0; p < ctx->nranks; p++) {
        if (p == ctx->rank || !peer_mask[p])
            continue;
        WEFT_CHECK_GOTO(net_peer_init(st, out, &st->peers[np++], p), res, err);
    }
    st->links = calloc((size_t)st->npeers * st->nfifo + 1, sizeof(*st->links));
    int *ranks = calloc((size_t)st->npeers + 1, sizeof(int));
    if (st->links == NULL || ranks == NULL) {
        free(ranks);
        WEFT_WARN("out of memory for the net connections of %d peers", st->npeers);
        res = ncclSystemError;
        goto err;
    }
    for (int i = 0; i < st->npeers; i++) {
        ranks[i] = st->peers[i].rank;
        for (int c = 0; c < st->nfifo; c++)
            st->peers[i].fifos[c].link = &st->links[(size_t)i * st->nfifo + c];
    }
    char who[96];
    snprintf(who, sizeof(who), "NET/%s host FIFOs", st->net->name);
    res = weft_net_links_open(st->net, ctx->bootstrap, WEFT_NET_TAG, st->me, st->dev, ranks,
                              st->npeers, st->nfifo, st->links, ctx->abort_flag, who);
    free(ranks);
    if (res != ncclSuccess)
        goto err;
    WEFT_CHECK_GOTO(net_register(st), res, err);
    if (st->npeers > 0) {
        int rc = pthread_create(&st->tid, NULL, net_proxy_main, st);
        if (rc != 0) {
            WEFT_WARN("rank %d: NET/%s: starting the proxy thread failed: %s", ctx->rank,
                      st->net->name, strerror(rc));
            res = ncclSystemError;
            goto err;
        }
        st->started = 1;
    }
    WEFT_INFO(WEFT_LOG_NET | WEFT_LOG_INIT,
              "rank %d: NET/%s (%s v%d, %s) to %d peers over device %d of %d, %d FIFO "
              "channels, slot %zu bytes",
              ctx->rank, st->net->name, st->net->version >= 8 ? "plugin" : "built in",
              st->net->version, st->net->path, st->npeers, st->dev, st->net->ndev, st->nfifo,
              st->slot_bytes);
    *state_p = st;
    return ncclSuccess;
err:
    net_close(ctx, st);
    return res;
}

static int net_settings(const char **names, int64_t *values)
{
    names[0] = "WEFT_NET_SLOT_BYTES";
    values[0] = weft_param_NetSlotBytes();
    return 1;
}

const struct weft_transport weft_transport_net = {
    .version = WEFT_TRANSPORT_VERSION,
    .name = "net",
    .can_connect = net_can_connect,
    .slot_bytes = net_slot_bytes,
    .setup = net_setup,
    .close = net_close,
    .peer_departed = weft_transport_never_departed,
    .peer_lock_fd = weft_transport_no_lock_fd,
    .settings = net_settings,
    /* The socket model (a proxy moves every message, as the socket transport's does): a
     * provider's latency and speed (ncclNetProperties) describe this host's NIC only, and ranks
     * must choose alike; they count once ranks exchange them (the topology's work). */
    .cost = weft_cost_fabric_socket,
};
