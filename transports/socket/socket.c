/*
 * Socket transport: ranks on different hosts (or any ranks, with NCCL_SHM_DISABLE=1), over TCP.
 *
 * As on NCCL's network path, the step engine only ever touches local memory. For every FIFO
 * channel and every connected peer a rank owns two FIFOs in its own memory (fifo.h layout:
 * control block, then nslots slots): the *send* FIFO, which the rank's lanes fill, and the *recv*
 * FIFO, which the lanes drain. FIFO channels 0 .. nch-1 are the channels' slot FIFOs (WEFT_STEPS
 * slots), nch .. 2 nch-1 their LL FIFOs (WEFT_LL_SLOTS small slots, for small steps; absent when
 * NCCL_PROTO excludes LL everywhere); the proxy treats both kinds alike. Proxy threads of the
 * communicator bridge them over TCP:
 *
 *   sender rank: posts slot s (payload, bytes, then seq = s + 1 with a release store) and rings
 *                the proxy's doorbell (conn->peer_bell);
 *   sender proxy: sees seq == s + 1, sends frame DATA{channel, step s, bytes} + payload;
 *   receiver proxy: reads the frame straight into recv slot s % nslots (payload, then the
 *                header bytes, then seq with a release store) and rings the rank's doorbell;
 *   receiver rank: consumes the slot, publishes recv head = s + 1, rings the proxy's doorbell;
 *   receiver proxy: sends CREDIT{channel, head};
 *   sender proxy: stores head into the send FIFO's control block and rings the rank's doorbell,
 *                so the sender rank may reuse the slot.
 * A sender posts step s only when head + nslots > s, and head only counts steps the receiver
 * freed, so every DATA frame finds its recv slot free: a proxy never has to stop reading a socket,
 * and channels sharing a socket cannot block each other.
 *
 * Threads and sockets: NCCL_SOCKET_NTHREADS proxy threads per communicator; channel c of every
 * peer is served by thread c % nthreads, which owns NCCL_NSOCKS_PERTHREAD TCP connections to each
 * peer. Step s of channel c travels on connection (s + c) % nsocks, so large messages stripe over
 * all of them; credits of channel c always travel on connection c % nsocks. Everything a thread
 * touches (its links, the FIFOs of its channels) is its own: no locks.
 * A proxy polls for WEFT_SOCKET_SPIN_US after its last work, then sleeps in epoll_wait on its
 * sockets and the eventfd of its doorbell (fifo.h): rings cost nothing while it is awake.
 *
 * Wire format: socket/wire.h. Every frame is validated: version, check word, type, channel
 * range and owner thread, step == the next step expected on this connection for that channel,
 * step inside the receive window, bytes <= slot payload; credits must advance and stay inside the
 * window. A bad frame, EOF or reset without BYE fails the peer: the proxy logs the cause, records
 * it for the rank's waits (the context's fail callback, naming the peer, its host and address)
 * and rings the rank, whose wait loop then fails the operation with ncclRemoteError.
 *
 * Setup: every rank listens on the interface NCCL_SOCKET_IFNAME selects (bootstrap/socket.h,
 * IPv4 or IPv6), all-gathers its address, connects nthreads * nsocks times to every higher-ranked
 * socket peer and accepts the same from every lower-ranked one. Close hands every posted slot to
 * the kernel and sends BYE (bounded by WEFT_SOCKET_FLUSH_TIMEOUT, skipped after abort), then stops
 * the threads and closes the sockets.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "algo/tuner.h"
#include "core/check.h"
#include "core/peer_info.h"
#include "core/fault.h"
#include "core/param.h"
#include "fifo.h"
#include "socket/wire.h"
#include "transport.h"

WEFT_PARAM(SocketSlotBytes, "WEFT_SOCKET_SLOT_BYTES", 524288,
           "bytes per FIFO slot of a communicator that uses the socket transport (8 slots per "
           "connection and direction; each slot travels as one frame)");
WEFT_PARAM(SocketNthreads, "NCCL_SOCKET_NTHREADS", 1,
           "proxy threads per communicator for the socket transport (1..16); channel c of every "
           "peer is served by thread c mod n");
WEFT_PARAM(NsocksPerthread, "NCCL_NSOCKS_PERTHREAD", -1,
           "TCP connections per peer and proxy thread (1..16, threads x sockets <= 64); the "
           "slots of a channel are striped across them (-1: 8 up to 16 ranks, then fewer, so "
           "that a rank holds about 128 connections per thread)");
WEFT_PARAM(SocketSpinUs, "WEFT_SOCKET_SPIN_US", -1,
           "microseconds an idle socket proxy thread polls before it sleeps (-1: 50, or 0 when "
           "the host runs more ranks than it has cores)");
WEFT_PARAM(SocketFlushTimeout, "WEFT_SOCKET_FLUSH_TIMEOUT", 10,
           "seconds closing a communicator may spend handing posted data to the network");
WEFT_PARAM_DECL(BootstrapTimeout);

#define WEFT_SOCK_MAX_THREADS 16
#define WEFT_SOCK_MAX_SOCKS 16
#define WEFT_SOCK_MAX_LINKS 64
#define WEFT_SOCK_RXBUF 16384      /* staging for headers and small payloads */
#define WEFT_SOCK_DIRECT_MIN 4096  /* larger payload remainders go straight into the slot */
#define WEFT_SOCK_RX_BUDGET (8u << 20)
#define WEFT_SOCK_MAX_IOV 64
#define WEFT_SOCK_SLEEP_MS 100

struct weft_sock_txent {
    struct weft_sock_frame hdr;
    const char *payload;
    uint32_t len;  /* payload bytes */
    uint32_t done; /* bytes of header and payload already sent */
};

struct weft_sock_peer;
struct weft_sock_thread;

/* One TCP connection, owned by one proxy thread. */
struct weft_sock_link {
    int fd;
    int index; /* connection number within (peer, thread): 0 .. nsocks - 1 */
    struct weft_sock_peer *peer;
    struct weft_sock_thread *thread;
    int out_armed; /* EPOLLOUT requested */
    int bye_queued, bye_sent, bye_recv;
    int rx_closed; /* clean EOF after BYE */
    int dead;      /* out of service (error, or the peer left); nothing more goes through it */
    int late_data; /* data was posted for a peer that had left; reported */
    /* transmit queue: a ring of frames */
    struct weft_sock_txent *txq;
    uint32_t txcap, txhead, txcount;
    /* receive state */
    char *rxbuf;
    uint32_t rxbeg, rxend;
    int rx_in_payload;
    struct weft_sock_frame rxf;
    char *rxdst;
    uint32_t rxleft;
    uint64_t *rx_expect; /* [nch]: next step expected per channel on this connection */
    uint64_t *tx_next;   /* [nch]: next step to send per channel on this connection */
    uint64_t bytes_sent, bytes_recv;
};

/* One (peer, FIFO channel): the two local FIFOs and the lanes' view of them. FIFO channel c <
 * nch is channel c's slot FIFO, nch + c its LL FIFO (fifo.h). */
struct weft_sock_chan {
    struct weft_fifo_ctrl *send_ctrl;
    char *send_slots;
    struct weft_fifo_ctrl *recv_ctrl;
    char *recv_slots;
    uint64_t credit_sent; /* recv head last sent back */
    int credit_queued;
    struct weft_conn send, recv;
};

struct weft_sock_peer {
    int rank;
    char where[192]; /* "peer 3 (host h, 10.0.0.2:41234)" */
    void *fifo_mem;
    size_t fifo_bytes;
    struct weft_sock_chan *chans;  /* [nfifo] */
    struct weft_sock_link *links;  /* [nthreads][nsocks] */
};

struct weft_sock_thread {
    /* the proxy's doorbell (eventfd kind), alone in its cache line */
    struct weft_doorbell bell __attribute__((aligned(WEFT_CACHELINE)));
    struct weft_sock_state *st;
    int index;
    int epfd;
    int efd;
    pthread_t tid;
    int started;
    int exited;
    int ring_rank; /* something was published for the rank in this round */
    struct weft_sock_link **links;
    int nlinks;
};

enum { WEFT_SOCK_RUN = 0, WEFT_SOCK_FLUSH, WEFT_SOCK_STOP };

struct weft_sock_state {
    const struct weft_transport_ctx *ctx;
    int nranks, me, nch, nthreads, nsocks;
    int nfifo; /* FIFO channels: nch slot FIFOs, then nch LL FIFOs unless NCCL_PROTO excludes LL */
    size_t slot_bytes;
    uint64_t spin_ns;
    int listen_fd;
    struct weft_sock_info *infos;   /* [nranks] */
    struct weft_sock_peer *peers;   /* [npeers]: remote peers of this transport */
    int npeers;
    struct weft_sock_peer **by_rank; /* [nranks] */
    struct weft_sock_thread *threads; /* [nthreads] */
    void *self_mem;                  /* loopback FIFOs when this rank talks to itself */
    size_t self_bytes;
    struct weft_conn *self_conns;    /* [nch][2] */
    struct weft_doorbell *own_bell;  /* the rank's doorbell when no other transport had one */
    struct weft_doorbell *rank_bell;
    int stop;
};

static size_t sock_fifo_stride(size_t slot, uint32_t nslots)
{
    return (sizeof(struct weft_fifo_ctrl) + nslots * slot + 4095) & ~(size_t)4095;
}


static int sock_can_connect(const struct weft_transport_ctx *ctx, int a, int b)
{
    (void)ctx;
    (void)a;
    (void)b;
    return 1; /* TCP reaches anyone; shm is asked first */
}

static ncclResult_t sock_slot_bytes(const struct weft_transport_ctx *ctx, size_t *bytes_p)
{
    (void)ctx;
    int64_t slot = weft_param_SocketSlotBytes();
    if (slot < 4096 || slot % 64 != 0 || slot > (1 << 30)) { /* header included */
        WEFT_WARN("WEFT_SOCKET_SLOT_BYTES %lld must be a multiple of 64 between 4096 and 1 GiB",
                  (long long)slot);
        return ncclInvalidArgument;
    }
    *bytes_p = (size_t)slot;
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------------
 * Proxy thread
 * ------------------------------------------------------------------------------------------- */

static void sock_link_epoll(struct weft_sock_link *l, int out)
{
    struct epoll_event ev = {.events = (l->rx_closed ? 0 : EPOLLIN) | (out ? EPOLLOUT : 0),
                             .data.ptr = l};
    epoll_ctl(l->thread->epfd, EPOLL_CTL_MOD, l->fd, &ev);
    l->out_armed = out;
}

/* Takes every connection of l's peer on this thread out of service. */
static void sock_peer_drop(struct weft_sock_thread *t, struct weft_sock_peer *p)
{
    struct weft_sock_state *st = t->st;
    for (int k = 0; k < st->nsocks; k++) {
        struct weft_sock_link *l = &p->links[t->index * st->nsocks + k];
        if (l->dead)
            continue;
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, l->fd, NULL);
        shutdown(l->fd, SHUT_RDWR);
        l->dead = 1;
        l->txcount = 0;
    }
}

/*
 * A connection failed. After the peer said BYE this is its normal departure; otherwise the peer
 * is gone or broken: log, record on the communicator, drop the peer, wake the rank.
 */
static void sock_link_fail(struct weft_sock_link *l, ncclResult_t res, const char *why)
{
    struct weft_sock_thread *t = l->thread;
    struct weft_sock_state *st = t->st;
    if (l->bye_recv || __atomic_load_n(&st->stop, __ATOMIC_ACQUIRE) == WEFT_SOCK_STOP) {
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, l->fd, NULL);
        l->dead = 1;
        l->txcount = 0;
        return;
    }
    WEFT_WARN("rank %d: socket connection %d to %s: %s", st->me,
              t->index * st->nsocks + l->index, l->peer->where, why);
    weft_transport_fail(st->ctx, res, "connection %d to %s failed: %s",
                            t->index * st->nsocks + l->index, l->peer->where, why);
    sock_peer_drop(t, l->peer);
    weft_doorbell_ring(st->rank_bell);
}

static void sock_link_fail_errno(struct weft_sock_link *l, const char *op, int err)
{
    char why[128];
    snprintf(why, sizeof(why), "%s failed: %s", op, strerror(err));
    sock_link_fail(l, err == ECONNRESET || err == EPIPE || err == ETIMEDOUT ? ncclRemoteError
                                                                             : ncclSystemError,
                   why);
}

static int sock_enqueue(struct weft_sock_link *l, int type, int channel, uint64_t step,
                        const char *payload, uint32_t len, uint32_t sig)
{
    if (l->txcount == l->txcap)
        return 0; /* cannot happen: the queue holds the most a link can have in flight */
    struct weft_sock_txent *e = &l->txq[(l->txhead + l->txcount) % l->txcap];
    e->hdr.version = WEFT_SOCK_VERSION;
    e->hdr.type = (uint16_t)type;
    e->hdr.channel = (uint16_t)channel;
    e->hdr.step = step;
    e->hdr.bytes = len;
    e->hdr.sig = sig;
    e->hdr.pad = 0;
    e->hdr.check = weft_sock_check(&e->hdr);
    e->payload = payload;
    e->len = len;
    e->done = 0;
    l->txcount++;
    return 1;
}

static void sock_rx(struct weft_sock_link *l);

/* Sends what the kernel takes from l's queue now; arms EPOLLOUT when it takes less. */
static void sock_tx(struct weft_sock_link *l)
{
    while (l->txcount > 0 && !l->dead) {
        struct iovec iov[WEFT_SOCK_MAX_IOV];
        int niov = 0;
        for (uint32_t i = 0; i < l->txcount && niov + 2 <= WEFT_SOCK_MAX_IOV; i++) {
            struct weft_sock_txent *e = &l->txq[(l->txhead + i) % l->txcap];
            uint32_t off = e->done;
            if (off < sizeof(e->hdr)) {
                iov[niov].iov_base = (char *)&e->hdr + off;
                iov[niov++].iov_len = sizeof(e->hdr) - off;
                off = 0;
            } else {
                off -= (uint32_t)sizeof(e->hdr);
            }
            if (e->len > off) {
                iov[niov].iov_base = (char *)e->payload + off;
                iov[niov++].iov_len = e->len - off;
            }
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(l->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!l->out_armed)
                    sock_link_epoll(l, 1);
                return;
            }
            int err = errno;
            /* A reset may come from a peer that left after saying goodbye: read what it sent
             * before judging (recv returns queued bytes before the reset). */
            if (!l->rx_closed)
                sock_rx(l);
            if (!l->dead)
                sock_link_fail_errno(l, "send", err);
            return;
        }
        l->bytes_sent += (uint64_t)n;
        size_t left = (size_t)n;
        while (l->txcount > 0) {
            struct weft_sock_txent *e = &l->txq[l->txhead];
            uint32_t need = (uint32_t)sizeof(e->hdr) + e->len - e->done;
            uint32_t take = left < need ? (uint32_t)left : need;
            e->done += take;
            left -= take;
            if (take < need)
                break;
            if (e->hdr.type == WEFT_SOCK_CREDIT)
                l->peer->chans[e->hdr.channel].credit_queued = 0;
            if (e->hdr.type == WEFT_SOCK_BYE) {
                l->bye_sent = 1;
                shutdown(l->fd, SHUT_WR);
            }
            l->txhead = (l->txhead + 1) % l->txcap;
            l->txcount--;
        }
    }
    if (l->out_armed && l->txcount == 0 && !l->dead)
        sock_link_epoll(l, 0);
}

/*
 * A peer closes its communicator only once its operations are done, so it needed nothing more from
 * us: data posted for it after its goodbye means the ranks issued different operations.
 */
static void sock_late_data(struct weft_sock_thread *t, struct weft_sock_link *l, int c)
{
    struct weft_sock_state *st = t->st;
    uint64_t s = l->tx_next[c];
    struct weft_slot_header *h = weft_conn_slot(&l->peer->chans[c].send, s);
    if (__atomic_load_n(&h->seq, __ATOMIC_ACQUIRE) != s + 1)
        return;
    l->late_data = 1;
    WEFT_WARN("rank %d: %s closed its communicator while this rank still had data for it "
              "(channel %d step %llu): the ranks issued different operations",
              st->me, l->peer->where, c, (unsigned long long)s);
    weft_transport_fail(st->ctx, ncclRemoteError,
                            "%s closed its communicator while this rank still had data for it",
                            l->peer->where);
    weft_doorbell_ring(st->rank_bell);
}

/* Enqueues posted slots and due credits of this thread's channels. Returns 1 if it queued any. */
static int sock_scan(struct weft_sock_thread *t)
{
    struct weft_sock_state *st = t->st;
    int work = 0, ns = st->nsocks;
    for (int pi = 0; pi < st->npeers; pi++) {
        struct weft_sock_peer *p = &st->peers[pi];
        struct weft_sock_link *links = &p->links[t->index * ns];
        for (int c = t->index; c < st->nfifo; c += st->nthreads) {
            struct weft_sock_chan *ch = &p->chans[c];
            for (int k = 0; k < ns; k++) {
                struct weft_sock_link *l = &links[k];
                if (l->dead) {
                    if (l->bye_recv && !l->late_data)
                        sock_late_data(t, l, c);
                    continue;
                }
                for (;;) {
                    uint64_t s = l->tx_next[c];
                    struct weft_slot_header *h = weft_conn_slot(&ch->send, s);
                    if (__atomic_load_n(&h->seq, __ATOMIC_ACQUIRE) != s + 1)
                        break;
                    uint32_t bytes = h->bytes;
                    if (bytes > weft_slot_payload(ch->send.slot_bytes))
                        bytes = (uint32_t)weft_slot_payload(ch->send.slot_bytes); /* never: lane's */
                    int fault = WEFT_FAULT_ARMED() ? weft_fault_frame(st->me, p->rank) : 0;
                    if (fault != WEFT_FAULT_DROP &&
                        !sock_enqueue(l, WEFT_SOCK_DATA, c, s, (const char *)h + WEFT_SLOT_HEADER,
                                      bytes, h->sig))
                        break;
                    if (fault == WEFT_FAULT_CORRUPT) /* one bit of the header: check word fails */
                        l->txq[(l->txhead + l->txcount - 1) % l->txcap].hdr.step ^= 1ull << 33;
                    l->tx_next[c] = s + (uint64_t)ns;
                    work = 1;
                }
            }
            struct weft_sock_link *cl = &links[c % ns];
            uint64_t head = __atomic_load_n(&ch->recv_ctrl->head, __ATOMIC_ACQUIRE);
            if (head > ch->credit_sent && !ch->credit_queued && !cl->dead &&
                sock_enqueue(cl, WEFT_SOCK_CREDIT, c, head, NULL, 0, 0)) {
                ch->credit_sent = head;
                ch->credit_queued = 1;
                work = 1;
            }
        }
    }
    return work;
}

static void sock_frame_bad(struct weft_sock_link *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sock_frame_bad(struct weft_sock_link *l, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    l->bye_recv = 0; /* a bad frame is an error even after BYE */
    sock_link_fail(l, ncclRemoteError, why);
}

/* Validates the frame header in l->rxf and acts on it. Returns 0 when the link failed. */
static int sock_frame(struct weft_sock_link *l)
{
    struct weft_sock_thread *t = l->thread;
    struct weft_sock_state *st = t->st;
    const struct weft_sock_frame *f = &l->rxf;
    struct weft_sock_frame parsed;
    char why[256];
    /* The checks that need no state (socket/wire.c); the windows and steps are checked below. */
    if (weft_sock_frame_parse(f, sizeof(*f), st->nfifo, st->nthreads, t->index, &parsed, why,
                              sizeof(why)) != NULL) {
        sock_frame_bad(l, "%s", why);
        return 0;
    }
    if (l->bye_recv) {
        sock_frame_bad(l, "bad frame: type %u after the peer said goodbye", f->type);
        return 0;
    }
    if (f->type == WEFT_SOCK_BYE) {
        l->bye_recv = 1;
        return 1;
    }
    int c = f->channel;
    struct weft_sock_chan *ch = &l->peer->chans[c];
    if (f->type == WEFT_SOCK_CREDIT) {
        uint64_t head = __atomic_load_n(&ch->send_ctrl->head, __ATOMIC_RELAXED);
        if (f->bytes != 0 || c % st->nsocks != l->index || f->step <= head ||
            f->step > head + ch->send.nslots) {
            sock_frame_bad(l, "bad credit frame: channel %d connection %d freed %llu steps, "
                           "%llu were freed before (window %u)",
                           c, l->index, (unsigned long long)f->step, (unsigned long long)head,
                           ch->send.nslots);
            return 0;
        }
        __atomic_store_n(&ch->send_ctrl->head, f->step, __ATOMIC_RELEASE);
        t->ring_rank = 1;
        return 1;
    }
    uint64_t head = __atomic_load_n(&ch->recv_ctrl->head, __ATOMIC_ACQUIRE);
    if (f->step != l->rx_expect[c] || f->step >= head + ch->recv.nslots) {
        sock_frame_bad(l, "bad data frame: channel %d step %llu, expected step %llu (receiver "
                       "freed %llu)",
                       c, (unsigned long long)f->step, (unsigned long long)l->rx_expect[c],
                       (unsigned long long)head);
        return 0;
    }
    if (f->bytes > weft_slot_payload(ch->send.slot_bytes)) {
        sock_frame_bad(l, "bad data frame: channel %d step %llu carries %u bytes, a slot holds %zu",
                       c, (unsigned long long)f->step, f->bytes,
                       weft_slot_payload(ch->send.slot_bytes));
        return 0;
    }
    struct weft_slot_header *h = weft_conn_slot(&ch->recv, f->step);
    l->rx_in_payload = 1;
    l->rxdst = (char *)h + WEFT_SLOT_HEADER;
    l->rxleft = f->bytes;
    return 1;
}

/* The payload of the current DATA frame is in its slot: publish it to the rank. */
static void sock_publish(struct weft_sock_link *l)
{
    struct weft_sock_state *st = l->thread->st;
    const struct weft_sock_frame *f = &l->rxf;
    const struct weft_sock_chan *ch = &l->peer->chans[f->channel];
    struct weft_slot_header *h = weft_conn_slot(&ch->recv, f->step);
    h->bytes = f->bytes;
    h->sig = f->sig;
    __atomic_store_n(&h->seq, f->step + 1, __ATOMIC_RELEASE);
    l->rx_expect[f->channel] = f->step + (uint64_t)st->nsocks;
    l->rx_in_payload = 0;
    l->thread->ring_rank = 1;
}

/* recv() without blocking: >0 bytes, 0 would block, -1 link failed (reported). */
static ssize_t sock_recv(struct weft_sock_link *l, void *buf, size_t len)
{
    for (;;) {
        ssize_t n = recv(l->fd, buf, len, MSG_DONTWAIT);
        if (n > 0) {
            /* Acknowledge at once: Linux leaves quick-ack mode on its own, and a delayed ACK
             * held a sender whose congestion window was full for 30-50 ms, with every thread of
             * both ranks asleep (2 namespaces x 1 rank, all-reduce 256 KiB in cycles of 20:
             * such stalls in 5 of 8 runs, none in 8 with this). Best effort, like TCP_NODELAY. */
            int one = 1;
            (void)setsockopt(l->fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
            l->bytes_recv += (uint64_t)n;
            return n;
        }
        if (n == 0) {
            if (l->bye_recv && !l->rx_in_payload && l->rxbeg == l->rxend) {
                /* The peer left after saying goodbye: nothing more goes either way. */
                epoll_ctl(l->thread->epfd, EPOLL_CTL_DEL, l->fd, NULL);
                l->rx_closed = 1;
                l->dead = 1;
                l->txcount = 0;
                return 0;
            }
            sock_link_fail(l, ncclRemoteError,
                           l->rx_in_payload || l->rxbeg != l->rxend
                               ? "connection closed by the peer (EOF) in the middle of a frame"
                               : "connection closed by the peer (EOF)");
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        sock_link_fail_errno(l, "recv", errno);
        return -1;
    }
}

/* Reads and handles frames until the socket has no more for now (or a budget is spent). */
static void sock_rx(struct weft_sock_link *l)
{
    uint32_t budget = WEFT_SOCK_RX_BUDGET;
    while (!l->dead && !l->rx_closed) {
        if (l->rx_in_payload) {
            uint32_t avail = l->rxend - l->rxbeg;
            if (avail > 0) {
                uint32_t take = avail < l->rxleft ? avail : l->rxleft;
                memcpy(l->rxdst, l->rxbuf + l->rxbeg, take);
                l->rxbeg += take;
                l->rxdst += take;
                l->rxleft -= take;
            }
            if (l->rxleft == 0) {
                sock_publish(l);
                continue;
            }
            ssize_t n;
            if (l->rxleft >= WEFT_SOCK_DIRECT_MIN) {
                n = sock_recv(l, l->rxdst, l->rxleft);
                if (n > 0) {
                    l->rxdst += n;
                    l->rxleft -= (uint32_t)n;
                }
            } else {
                l->rxbeg = l->rxend = 0;
                n = sock_recv(l, l->rxbuf, WEFT_SOCK_RXBUF);
                if (n > 0)
                    l->rxend = (uint32_t)n;
            }
            if (n <= 0)
                return;
            budget = (uint32_t)n >= budget ? 0 : budget - (uint32_t)n;
            if (budget == 0)
                return;
            continue;
        }
        if (l->rxend - l->rxbeg < sizeof(struct weft_sock_frame)) {
            if (budget == 0)
                return;
            memmove(l->rxbuf, l->rxbuf + l->rxbeg, l->rxend - l->rxbeg);
            l->rxend -= l->rxbeg;
            l->rxbeg = 0;
            ssize_t n = sock_recv(l, l->rxbuf + l->rxend, WEFT_SOCK_RXBUF - l->rxend);
            if (n <= 0)
                return;
            l->rxend += (uint32_t)n;
            budget = (uint32_t)n >= budget ? 0 : budget - (uint32_t)n;
            continue;
        }
        memcpy(&l->rxf, l->rxbuf + l->rxbeg, sizeof(l->rxf));
        l->rxbeg += (uint32_t)sizeof(l->rxf);
        if (!sock_frame(l))
            return;
    }
}

static void sock_event(struct weft_sock_thread *t, struct epoll_event *ev)
{
    struct weft_sock_link *l = ev->data.ptr;
    if (l == NULL) {
        uint64_t v;
        while (read(t->efd, &v, sizeof(v)) > 0) {
        }
        return;
    }
    if ((ev->events & (EPOLLIN | EPOLLERR | EPOLLHUP)) && !l->dead && !l->rx_closed)
        sock_rx(l);
    if ((ev->events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && !l->dead && l->txcount > 0)
        sock_tx(l);
}

/* Flushing: queue BYE on every live connection once nothing posted is left; 1 when all sent. */
static int sock_flush_step(struct weft_sock_thread *t)
{
    int done = 1;
    for (int i = 0; i < t->nlinks; i++) {
        struct weft_sock_link *l = t->links[i];
        if (l->dead || l->bye_sent)
            continue;
        if (!l->bye_queued && l->txcount == 0) {
            /* every posted slot of this link is queued by the scan that just ran */
            l->bye_queued = sock_enqueue(l, WEFT_SOCK_BYE, 0, 0, NULL, 0, 0);
            sock_tx(l);
        }
        if (!l->dead && !l->bye_sent)
            done = 0;
    }
    return done;
}

static void *sock_proxy_main(void *arg)
{
    struct weft_sock_thread *t = arg;
    struct weft_sock_state *st = t->st;
    struct epoll_event evs[64];
    uint64_t idle_since = 0;
    for (;;) {
        int stop = __atomic_load_n(&st->stop, __ATOMIC_ACQUIRE);
        if (stop == WEFT_SOCK_STOP)
            break;
        int work = sock_scan(t);
        for (int i = 0; i < t->nlinks; i++) {
            struct weft_sock_link *l = t->links[i];
            if (l->txcount > 0 && !l->out_armed && !l->dead)
                sock_tx(l);
        }
        if (stop == WEFT_SOCK_FLUSH && sock_flush_step(t))
            break;
        int timeout = 0, slept = 0;
        if (!work) {
            uint64_t now = weft_time_ns();
            if (idle_since == 0)
                idle_since = now;
            if (now - idle_since >= st->spin_ns) {
                __atomic_fetch_add(&t->bell.sleepers, 1, __ATOMIC_SEQ_CST);
                slept = 1;
                if (sock_scan(t))
                    work = 1;
                else
                    timeout = WEFT_SOCK_SLEEP_MS;
            }
        }
        int n = epoll_wait(t->epfd, evs, 64, work ? 0 : timeout);
        if (slept)
            __atomic_fetch_sub(&t->bell.sleepers, 1, __ATOMIC_SEQ_CST);
        for (int i = 0; i < n; i++) {
            sock_event(t, &evs[i]);
            if (evs[i].data.ptr != NULL)
                work = 1;
        }
        if (t->ring_rank) {
            t->ring_rank = 0;
            weft_doorbell_ring(st->rank_bell);
        }
        if (work)
            idle_since = 0;
        else if (n == 0 && !slept)
            weft_cpu_relax();
    }
    __atomic_store_n(&t->exited, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Setup and close
 * ------------------------------------------------------------------------------------------- */

static void sock_threads_stop(struct weft_sock_state *st, int flush)
{
    if (st->threads == NULL)
        return;
    const struct weft_transport_ctx *ctx = st->ctx;
    int64_t secs = weft_param_SocketFlushTimeout();
    if (flush && !__atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE) && secs > 0) {
        __atomic_store_n(&st->stop, WEFT_SOCK_FLUSH, __ATOMIC_RELEASE);
        for (int i = 0; i < st->nthreads; i++)
            if (st->threads[i].started)
                weft_eventfd_signal(st->threads[i].efd);
        uint64_t deadline = weft_time_ns() + (uint64_t)secs * 1000000000ull;
        for (;;) {
            int running = 0;
            for (int i = 0; i < st->nthreads; i++)
                running += st->threads[i].started &&
                           !__atomic_load_n(&st->threads[i].exited, __ATOMIC_ACQUIRE);
            if (running == 0 || __atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE))
                break;
            if (weft_time_ns() > deadline) {
                WEFT_INFO(WEFT_LOG_NET, "rank %d: socket transport could not hand all posted "
                          "data to the network within %lld s; closing anyway",
                          st->me, (long long)secs);
                break;
            }
            usleep(1000);
        }
    }
    __atomic_store_n(&st->stop, WEFT_SOCK_STOP, __ATOMIC_RELEASE);
    for (int i = 0; i < st->nthreads; i++) {
        struct weft_sock_thread *t = &st->threads[i];
        if (!t->started)
            continue;
        weft_eventfd_signal(t->efd);
        pthread_join(t->tid, NULL);
        t->started = 0;
    }
}

static ncclResult_t sock_close(const struct weft_transport_ctx *ctx, void *state)
{
    (void)ctx; /* the state holds it (its proxies ran with it) */
    struct weft_sock_state *st = state;
    if (st == NULL)
        return ncclSuccess;
    sock_threads_stop(st, 1);
    for (int pi = 0; st->peers != NULL && pi < st->npeers; pi++) {
        struct weft_sock_peer *p = &st->peers[pi];
        uint64_t sent = 0, recvd = 0;
        for (int i = 0; p->links != NULL && i < st->nthreads * st->nsocks; i++) {
            struct weft_sock_link *l = &p->links[i];
            sent += l->bytes_sent;
            recvd += l->bytes_recv;
            if (l->fd >= 0) {
                char sink[4096]; /* unread bytes would turn our FIN into a reset */
                while (recv(l->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
                }
            }
            weft_socket_close(&l->fd);
            free(l->txq);
            free(l->rxbuf);
            free(l->rx_expect);
            free(l->tx_next);
        }
        if (p->links != NULL)
            WEFT_INFO(WEFT_LOG_NET, "rank %d: closed %s: %llu bytes sent, %llu received", st->me,
                      p->where, (unsigned long long)sent, (unsigned long long)recvd);
        free(p->links);
        free(p->chans);
        if (p->fifo_mem != NULL)
            munmap(p->fifo_mem, p->fifo_bytes);
    }
    for (int i = 0; st->threads != NULL && i < st->nthreads; i++) {
        struct weft_sock_thread *t = &st->threads[i];
        if (t->epfd >= 0)
            close(t->epfd);
        if (t->efd >= 0)
            close(t->efd);
        free(t->links);
    }
    free(st->threads);
    if (st->self_mem != NULL)
        munmap(st->self_mem, st->self_bytes);
    free(st->self_conns);
    weft_socket_close(&st->listen_fd);
    free(st->own_bell);
    free(st->peers);
    free(st->by_rank);
    free(st->infos);
    free(st);
    return ncclSuccess;
}

static ncclResult_t sock_map(size_t bytes, void **mem_p)
{
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        WEFT_WARN("mmap of %zu bytes for socket FIFOs failed: %s", bytes, strerror(errno));
        return ncclSystemError;
    }
    *mem_p = mem;
    return ncclSuccess;
}

/* Local FIFOs and connections of one remote peer. */
static ncclResult_t sock_peer_init(struct weft_sock_state *st, struct weft_transport_out *out,
                                    struct weft_sock_peer *p, int rank)
{
    const struct weft_transport_ctx *ctx = st->ctx;
    char addr[WEFT_SOCKADDR_STRLEN];
    p->rank = rank;
    snprintf(p->where, sizeof(p->where), "peer %d (host %s, %s)", rank,
             ctx->peers[rank].hostname,
             weft_socket_addr_str(&st->infos[rank].addr, addr, sizeof(addr)));
    size_t stride = sock_fifo_stride(st->slot_bytes, WEFT_STEPS);
    size_t ll_stride = sock_fifo_stride(WEFT_LL_SLOT_BYTES, WEFT_LL_SLOTS);
    p->fifo_bytes = (size_t)st->nch * 2 * stride + (size_t)(st->nfifo - st->nch) * 2 * ll_stride;
    WEFT_CHECK(sock_map(p->fifo_bytes, &p->fifo_mem));
    int nlinks = st->nthreads * st->nsocks;
    p->chans = calloc((size_t)st->nfifo, sizeof(*p->chans));
    p->links = calloc((size_t)nlinks, sizeof(*p->links));
    if (p->chans == NULL || p->links == NULL) {
        WEFT_WARN("out of memory for the socket connections to %s", p->where);
        return ncclSystemError;
    }
    for (int i = 0; i < nlinks; i++)
        p->links[i].fd = -1;
    char *fifo = p->fifo_mem;
    for (int c = 0; c < st->nfifo; c++) {
        struct weft_sock_chan *ch = &p->chans[c];
        int ll = c >= st->nch;
        size_t slot_bytes = ll ? WEFT_LL_SLOT_BYTES : st->slot_bytes;
        uint32_t nslots = ll ? WEFT_LL_SLOTS : WEFT_STEPS;
        size_t fifo_stride = ll ? ll_stride : stride;
        ch->send_ctrl = (struct weft_fifo_ctrl *)fifo;
        ch->send_slots = fifo + sizeof(struct weft_fifo_ctrl);
        ch->recv_ctrl = (struct weft_fifo_ctrl *)(fifo + fifo_stride);
        ch->recv_slots = fifo + fifo_stride + sizeof(struct weft_fifo_ctrl);
        fifo += 2 * fifo_stride;
        struct weft_doorbell *proxy_bell = &st->threads[c % st->nthreads].bell;
        ch->send = (struct weft_conn){.ctrl = ch->send_ctrl, .slots = ch->send_slots,
                                      .slot_bytes = slot_bytes, .nslots = nslots,
                                      .peer_bell = proxy_bell};
        ch->recv = (struct weft_conn){.ctrl = ch->recv_ctrl, .slots = ch->recv_slots,
                                      .slot_bytes = slot_bytes, .nslots = nslots,
                                      .peer_bell = proxy_bell};
    }
    for (int c = 0; c < st->nch; c++) {
        struct weft_sock_chan *ch = &p->chans[c];
        if (st->nfifo > st->nch) {
            ch->send.ll = &p->chans[st->nch + c].send;
            ch->recv.ll = &p->chans[st->nch + c].recv;
        }
        out->chan_peers[c][rank].send = &ch->send;
        out->chan_peers[c][rank].recv = &ch->recv;
    }
    for (int t = 0; t < st->nthreads; t++) {
        for (int k = 0; k < st->nsocks; k++) {
            struct weft_sock_link *l = &p->links[t * st->nsocks + k];
            l->index = k;
            l->peer = p;
            l->thread = &st->threads[t];
            /* the most a link can have queued: every slot and a credit of every FIFO, a BYE */
            l->txcap = 1;
            for (int c = 0; c < st->nfifo; c++)
                l->txcap += p->chans[c].send.nslots + 1;
            l->txq = calloc(l->txcap, sizeof(*l->txq));
            l->rxbuf = malloc(WEFT_SOCK_RXBUF);
            l->rx_expect = calloc((size_t)st->nfifo, sizeof(uint64_t));
            l->tx_next = calloc((size_t)st->nfifo, sizeof(uint64_t));
            if (l->txq == NULL || l->rxbuf == NULL || l->rx_expect == NULL || l->tx_next == NULL) {
                WEFT_WARN("out of memory for the socket connections to %s", p->where);
                return ncclSystemError;
            }
            /* Step s of channel c travels on connection (s + c) % nsocks. */
            for (int c = 0; c < st->nfifo; c++) {
                uint64_t first = (uint64_t)((k - c % st->nsocks + st->nsocks) % st->nsocks);
                l->rx_expect[c] = first;
                l->tx_next[c] = first;
            }
        }
    }
    return ncclSuccess;
}

/* Loopback FIFOs: this rank sends to itself through one local FIFO per channel. */
static ncclResult_t sock_self_init(struct weft_sock_state *st, struct weft_transport_out *out)
{
    size_t stride = sock_fifo_stride(st->slot_bytes, WEFT_STEPS);
    st->self_bytes = (size_t)st->nch * stride;
    WEFT_CHECK(sock_map(st->self_bytes, &st->self_mem));
    WEFT_CALLOC(st->self_conns, (size_t)st->nch * 2);
    for (int c = 0; c < st->nch; c++) {
        char *fifo = (char *)st->self_mem + (size_t)c * stride;
        struct weft_conn conn = {.ctrl = (struct weft_fifo_ctrl *)fifo,
                                 .slots = fifo + sizeof(struct weft_fifo_ctrl),
                                 .slot_bytes = st->slot_bytes,
                                 .nslots = WEFT_STEPS,
                                 .peer_bell = st->rank_bell};
        st->self_conns[2 * c] = conn;
        st->self_conns[2 * c + 1] = conn;
        out->chan_peers[c][st->me].send = &st->self_conns[2 * c];
        out->chan_peers[c][st->me].recv = &st->self_conns[2 * c + 1];
    }
    return ncclSuccess;
}

static void sock_hello_fill(const struct weft_sock_state *st, struct weft_sock_hello *h, int peer,
                            int thread, int sock)
{
    memset(h, 0, sizeof(*h));
    h->version = WEFT_SOCK_VERSION;
    h->type = WEFT_SOCK_HELLO;
    h->comm_hash = st->ctx->comm_hash;
    h->rank = st->me;
    h->peer = peer;
    h->thread = (uint32_t)thread;
    h->sock = (uint32_t)sock;
    h->nthreads = (uint32_t)st->nthreads;
    h->nsocks = (uint32_t)st->nsocks;
    h->nchannels = (uint32_t)st->nch;
    h->ll_fifos = st->nfifo > st->nch;
    h->slot_bytes = st->slot_bytes;
}

/* weft_sock_admit_fn_t for this transport: a lower-ranked peer's link that is still free, with
 * every setting as this rank's; anything else fails init (ncclInvalidUsage). */
static ncclResult_t sock_admit(void *arg, const struct weft_sock_hello *hp, int **fd_pp)
{
    struct weft_sock_state *st = arg;
    struct weft_sock_hello h = *hp, want;
    int r = h.rank;
    struct weft_sock_peer *p = r >= 0 && r < st->me ? st->by_rank[r] : NULL;
    sock_hello_fill(st, &want, st->me, (int)h.thread, (int)h.sock);
    if (p == NULL || h.comm_hash != want.comm_hash ||
        h.peer != st->me || h.thread >= (uint32_t)st->nthreads ||
        h.sock >= (uint32_t)st->nsocks || h.nthreads != want.nthreads ||
        h.nsocks != want.nsocks || h.nchannels != want.nchannels ||
        h.ll_fifos != want.ll_fifos ||
        h.slot_bytes != want.slot_bytes ||
        p->links[h.thread * (uint32_t)st->nsocks + h.sock].fd >= 0) {
        WEFT_WARN("rank %d: rejected a socket connection: hello version 0x%08x type %u from "
                  "rank %d for rank %d (connection %u/%u of %u threads x %u sockets, %u "
                  "channels, LL FIFOs %u, slot %llu bytes, comm %016llx); expected comm "
                  "%016llx, %d x %d sockets, %d channels, LL FIFOs %u, slot %zu bytes (set "
                  "NCCL_PROTO alike on every rank)",
                  st->me, h.version, h.type, h.rank, h.peer, h.thread, h.sock, h.nthreads,
                  h.nsocks, h.nchannels, h.ll_fifos, (unsigned long long)h.slot_bytes,
                  (unsigned long long)h.comm_hash, (unsigned long long)want.comm_hash,
                  st->nthreads, st->nsocks, st->nch, want.ll_fifos, st->slot_bytes);
        return ncclInvalidUsage;
    }
    *fd_pp = &p->links[h.thread * (uint32_t)st->nsocks + h.sock].fd;
    return ncclSuccess;
}

/* Connects to every higher-ranked peer, then accepts every lower-ranked one. */
static ncclResult_t sock_connect_all(struct weft_sock_state *st)
{
    const struct weft_transport_ctx *ctx = st->ctx;
    uint64_t deadline = weft_socket_deadline(weft_param_BootstrapTimeout());
    char what[256];
    int expected = 0;
    for (int pi = 0; pi < st->npeers; pi++) {
        struct weft_sock_peer *p = &st->peers[pi];
        if (p->rank < st->me) {
            expected += st->nthreads * st->nsocks;
            continue;
        }
        for (int i = 0; i < st->nthreads * st->nsocks; i++) {
            struct weft_sock_link *l = &p->links[i];
            snprintf(what, sizeof(what), "rank %d: socket connection %d to %s", st->me, i,
                     p->where);
            WEFT_CHECK(weft_socket_connect(&st->infos[p->rank].addr, deadline, ctx->abort_flag,
                                           what, &l->fd));
            struct weft_sock_hello h;
            sock_hello_fill(st, &h, p->rank, i / st->nsocks, i % st->nsocks);
            WEFT_CHECK(weft_sock_handshake(l->fd, weft_bootstrap_key(ctx->bootstrap), &h,
                                           deadline, ctx->abort_flag, what));
        }
    }
    snprintf(what, sizeof(what), "rank %d: %d socket connections from lower-ranked peers",
             st->me, expected);
    return weft_sock_accept_all(st->listen_fd, weft_bootstrap_key(ctx->bootstrap),
                                ctx->comm_hash, expected, sock_admit, st, deadline,
                                ctx->abort_flag, what);
}

static ncclResult_t sock_threads_start(struct weft_sock_state *st)
{
    if (st->npeers == 0)
        return ncclSuccess; /* loopback only: the rank needs no proxy */
    for (int i = 0; i < st->nthreads; i++) {
        struct weft_sock_thread *t = &st->threads[i];
        WEFT_CALLOC(t->links, (size_t)st->npeers * st->nsocks + 1);
        t->epfd = epoll_create1(EPOLL_CLOEXEC);
        WEFT_SYSCHECK(t->epfd, "epoll_create1");
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
        WEFT_SYSCHECK(epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->efd, &ev), "epoll_ctl");
        for (int pi = 0; pi < st->npeers; pi++) {
            for (int k = 0; k < st->nsocks; k++) {
                struct weft_sock_link *l = &st->peers[pi].links[i * st->nsocks + k];
                ev.events = EPOLLIN;
                ev.data.ptr = l;
                WEFT_SYSCHECK(epoll_ctl(t->epfd, EPOLL_CTL_ADD, l->fd, &ev), "epoll_ctl");
                t->links[t->nlinks++] = l;
            }
        }
    }
    for (int i = 0; i < st->nthreads; i++) {
        struct weft_sock_thread *t = &st->threads[i];
        WEFT_PTHREADCHECK(pthread_create(&t->tid, NULL, sock_proxy_main, t), "pthread_create");
        t->started = 1;
    }
    return ncclSuccess;
}

static ncclResult_t sock_setup(const struct weft_transport_ctx *ctx, const uint8_t *peer_mask,
                              struct weft_transport_out *out, void **state_p)
{
    ncclResult_t res = ncclSuccess;
    int nranks = ctx->nranks, me = ctx->rank;
    int64_t nthreads = weft_param_SocketNthreads(), nsocks = weft_param_NsocksPerthread();
    if (nsocks == -1) {
        /* Every connection is a TCP flow of its own: 2 namespaces x 1 rank on 2 cores,
         * all-reduce 64 MiB busbw 1.4-1.6 GB/s with 2, 1.6-2.1 with 4, 2.0-2.7 with 8, 1.9-2.3
         * with 16 connections (iperf3, one flow each way: 1.6-1.7). Each rank connects to every
         * socket peer at setup: fewer per peer in large communicators keeps the descriptors a
         * rank holds near 128 per thread. Computed from nranks, so every rank agrees. */
        nsocks = 128 / nranks;
        nsocks = nsocks > 8 ? 8 : nsocks < 1 ? 1 : nsocks;
        if (nthreads >= 1 && nsocks * nthreads > WEFT_SOCK_MAX_LINKS)
            nsocks = WEFT_SOCK_MAX_LINKS / nthreads;
    }
    if (nthreads < 1 || nthreads > WEFT_SOCK_MAX_THREADS || nsocks < 1 ||
        nsocks > WEFT_SOCK_MAX_SOCKS || nthreads * nsocks > WEFT_SOCK_MAX_LINKS) {
        WEFT_WARN("NCCL_SOCKET_NTHREADS %lld and NCCL_NSOCKS_PERTHREAD %lld must be 1..%d and "
                  "1..%d with a product of at most %d",
                  (long long)nthreads, (long long)nsocks, WEFT_SOCK_MAX_THREADS,
                  WEFT_SOCK_MAX_SOCKS, WEFT_SOCK_MAX_LINKS);
        return ncclInvalidArgument;
    }
    struct weft_sock_state *st;
    WEFT_CALLOC(st, 1);
    st->ctx = ctx;
    st->nranks = nranks;
    st->me = me;
    st->nch = ctx->nchannels + 1;
    st->nfifo = ctx->ll ? 2 * st->nch : st->nch;
    st->nthreads = (int)nthreads;
    st->nsocks = (int)nsocks;
    st->slot_bytes = ctx->slot_bytes;
    st->listen_fd = -1;
    int64_t spin = weft_param_SocketSpinUs();
    st->spin_ns = (uint64_t)(spin >= 0 ? spin : ctx->oversubscribed ? 0 : 50) * 1000ull;
    st->infos = calloc((size_t)nranks, sizeof(*st->infos));
    st->by_rank = calloc((size_t)nranks, sizeof(*st->by_rank));
    st->threads = NULL;
    if (st->infos == NULL || st->by_rank == NULL) {
        WEFT_WARN("out of memory for the socket transport of %d ranks", nranks);
        res = ncclSystemError;
        goto err;
    }
    if (posix_memalign((void **)&st->threads, WEFT_CACHELINE,
                       (size_t)st->nthreads * sizeof(*st->threads)) != 0) {
        st->threads = NULL;
        WEFT_WARN("out of memory for %d socket proxy threads", st->nthreads);
        res = ncclSystemError;
        goto err;
    }
    memset(st->threads, 0, (size_t)st->nthreads * sizeof(*st->threads));
    for (int i = 0; i < st->nthreads; i++) {
        st->threads[i].st = st;
        st->threads[i].index = i;
        st->threads[i].epfd = -1;
        st->threads[i].efd = -1;
    }
    for (int i = 0; i < st->nthreads; i++) {
        struct weft_sock_thread *t = &st->threads[i];
        t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (t->efd < 0) {
            WEFT_WARN("call to eventfd failed: %s", strerror(errno));
            res = ncclSystemError;
            goto err;
        }
        weft_doorbell_init(&t->bell, WEFT_BELL_EVENTFD, t->efd);
    }
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

    for (int p = 0; p < nranks; p++)
        st->npeers += p != me && peer_mask[p];
    struct weft_sock_info *mine = &st->infos[me];
    mine->version = WEFT_SOCK_INFO_VERSION;
    mine->nthreads = (uint32_t)st->nthreads;
    mine->nsocks = (uint32_t)st->nsocks;
    mine->slot_bytes = st->slot_bytes;
    if (st->npeers > 0) {
        char ifname[WEFT_IFNAME_LEN];
        WEFT_CHECK_GOTO(weft_socket_find_interface(ifname, sizeof(ifname), &mine->addr), res, err);
        WEFT_CHECK_GOTO(weft_socket_listen(&mine->addr, &st->listen_fd), res, err);
        mine->listening = 1;
    }
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(ctx->bootstrap, st->infos, sizeof(*st->infos)), res,
                    err);
    st->peers = calloc((size_t)st->npeers + 1, sizeof(*st->peers));
    if (st->peers == NULL) {
        WEFT_WARN("out of memory for %d socket peers", st->npeers);
        res = ncclSystemError;
        goto err;
    }
    int np = 0;
    for (int p = 0; p < nranks; p++) {
        if (p == me || !peer_mask[p])
            continue;
        const struct weft_sock_info *in = &st->infos[p];
        if (in->version != WEFT_SOCK_INFO_VERSION || !in->listening ||
            in->nthreads != mine->nthreads || in->nsocks != mine->nsocks ||
            in->slot_bytes != mine->slot_bytes || !weft_socket_addr_valid(&in->addr)) {
            WEFT_WARN("rank %d: socket setup of rank %d (host %s) differs: version %u, "
                      "listening %u, %u threads x %u sockets, slot %llu bytes; here %d x %d, "
                      "slot %zu (set NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD and "
                      "WEFT_SOCKET_SLOT_BYTES alike on every rank)",
                      me, p, ctx->peers[p].hostname, in->version, in->listening,
                      in->nthreads, in->nsocks, (unsigned long long)in->slot_bytes,
                      st->nthreads, st->nsocks, st->slot_bytes);
            res = ncclInvalidUsage;
            goto err;
        }
        st->by_rank[p] = &st->peers[np];
        WEFT_CHECK_GOTO(sock_peer_init(st, out, &st->peers[np], p), res, err);
        np++;
    }
    if (peer_mask[me])
        WEFT_CHECK_GOTO(sock_self_init(st, out), res, err);
    WEFT_CHECK_GOTO(sock_connect_all(st), res, err);
    weft_socket_close(&st->listen_fd);
    WEFT_CHECK_GOTO(sock_threads_start(st), res, err);
    WEFT_INFO(WEFT_LOG_NET | WEFT_LOG_INIT,
              "rank %d: socket transport to %d peers%s, %d channels, %d threads x %d sockets per "
              "peer, slot %zu bytes",
              me, st->npeers, peer_mask[me] ? " and itself" : "", st->nch, st->nthreads,
              st->nsocks, st->slot_bytes);
    *state_p = st;
    return ncclSuccess;
err:
    __atomic_store_n(&st->stop, WEFT_SOCK_STOP, __ATOMIC_RELEASE);
    sock_threads_stop(st, 0);
    sock_close(ctx, st);
    return res;
}

static int sock_settings(const char **names, int64_t *values)
{
    names[0] = "WEFT_SOCKET_SLOT_BYTES";
    values[0] = weft_param_SocketSlotBytes();
    names[1] = "NCCL_SOCKET_NTHREADS";
    values[1] = weft_param_SocketNthreads();
    names[2] = "NCCL_NSOCKS_PERTHREAD";
    values[2] = weft_param_NsocksPerthread();
    return 3;
}

const struct weft_transport weft_transport_socket = {
    .version = WEFT_TRANSPORT_VERSION,
    .name = "socket",
    .can_connect = sock_can_connect,
    .slot_bytes = sock_slot_bytes,
    .setup = sock_setup,
    .close = sock_close,
    .peer_departed = weft_transport_never_departed,
    .peer_lock_fd = weft_transport_no_lock_fd,
    .settings = sock_settings,
    .cost = weft_cost_fabric_socket, /* calibrated on this transport (algo/cost.c) */
};
