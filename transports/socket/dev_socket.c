/*
 * Device FIFOs across hosts over TCP (transport.h, struct weft_dev_bridge: the socket bridge, used
 * with the built-in socket transport): the CUDA executor's kernels of two ranks on different hosts
 * exchange device buffers through a proxy on each side.
 *
 * For a peer p on another host, both ends of this rank's connections with p live in pinned host
 * memory mapped for the device (kernels/dev_fifo.h layout, system scope):
 *   - receive (p -> this rank): the receive block in this rank's host FIFOs, as for a local peer;
 *     the rx thread writes the slots, bytes and sig of each DATA frame there, then release-stores
 *     tail. The kernel's head for those steps goes to a shadow (below), read by the tx thread and
 *     sent as CREDIT frames;
 *   - send (this rank -> p): the kernel posts into a shadow of p's receive block, in this rank's
 *     memory; the tx thread sends each posted slot as a DATA frame once p has credit for it (its
 *     CREDIT frames), then release-stores the kernel's head in this rank's host FIFOs (the shadow
 *     slot is free once its bytes are handed to TCP).
 * So the kernel sees an ordinary host-memory connection; up to WEFT_STEPS steps wait in the
 * shadow and WEFT_STEPS more in the receiver's block.
 *
 * Wire: one TCP connection per pair of ranks, the lower rank connecting, with the socket
 * transport's handshake (socket/wire.h: challenge, hello with MAC, accept; hello nthreads =
 * nsocks = 1, nchannels = the executor's connection channels, ll_fifos = WEFT_DEV_SOCK_HELLO,
 * slot_bytes = the device slot size) and its frames: DATA (step, bytes, sig; the payload
 * follows), CREDIT (step = steps the receiving kernel freed), BYE. A connection carries each
 * channel's steps in order. The rx thread reads every connection (poll, 100 ms, abort flag); the
 * tx thread polls the shadows (sleeping 20 us to 1 ms when idle) and writes; two threads, so a
 * blocked write never stops this rank from reading. A connection that ends without BYE (or a
 * bad frame) marks its peer dead: the kernels are stopped (abort word) and the executor's error
 * names that peer. A write that fails or makes no progress for WEFT_TIMEOUT only stops the
 * writes to that peer (a peer that closed after its BYE is no error; a dead one ends its
 * connection, which the rx thread sees; a stuck one leaves the kernels to their deadline).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/check.h"
#include "core/peer_info.h"
#include "core/param.h"
#include "dev_fifo.h"
#include "socket/wire.h"
#include "transport.h"

WEFT_PARAM_DECL(BootstrapTimeout);
WEFT_PARAM_DECL(Timeout);

/* hello.ll_fifos of a device connection: a host connection's hello never says 2 */
#define WEFT_DEV_SOCK_HELLO 2u
#define WEFT_DEV_SOCK_FLUSH_NS 5000000000ull /* close: posted data handed to TCP within 5 s */

struct weft_dev_sock_peer {
    int rank;
    int fd;
    int gone;       /* rx: BYE seen or connection failed */
    int tx_off;     /* tx: a write failed (the rx thread tells a dead peer from a closed one) */
    char *shadow;   /* host view: p's receive blocks and our heads for p's sends */
    uint64_t *sent;     /* [nconn] steps sent (tx) */
    uint64_t *credited; /* [nconn] credits sent (tx) */
    uint64_t *credit;   /* [nconn] p's freed steps (rx writes, tx reads) */
    uint64_t *rx_step;  /* [nconn] next step expected (rx) */
};

struct weft_dev_sock {
    const struct weft_transport_ctx *ctx;
    int me, nranks, nconn, npeers;
    size_t slot_bytes;
    char *fifo; /* host view of this rank's host FIFOs */
    int *dead_peer;
    uint32_t *abort_word;
    struct weft_dev_sock_peer *peers;
    pthread_t tx, rx;
    int tx_started, rx_started;
    int stop; /* 1: tx flushes and says BYE; 2: rx leaves too */
    int listen_fd;
    uint64_t *counters;
};

static struct weft_dev_recv_ctrl *ds_shadow_rc(const struct weft_dev_sock *s, char *shadow, int c)
{
    return weft_dev_shadow_send_rc(s->nconn, s->slot_bytes, shadow, c);
}

static struct weft_dev_send_ctrl *ds_shadow_sc(const struct weft_dev_sock *s, char *shadow, int c)
{
    return weft_dev_shadow_recv_sc(s->nconn, s->slot_bytes, shadow, c);
}

/* Peer p is gone (or stuck): stop the kernels, and let the executor's error name it. */
static void ds_peer_dead(struct weft_dev_sock *s, struct weft_dev_sock_peer *p, const char *why)
{
    if (__atomic_load_n(s->ctx->abort_flag, __ATOMIC_ACQUIRE))
        return;
    int none = -1;
    if (__atomic_compare_exchange_n(s->dead_peer, &none, p->rank, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        WEFT_WARN("rank %d: device connection to peer %d (host %s) failed: %s", s->me, p->rank,
                  s->ctx->peers[p->rank].hostname, why);
    __atomic_store_n(s->abort_word, 1, __ATOMIC_RELEASE);
}

static void ds_frame(struct weft_sock_frame *f, int type, int c, uint64_t step, uint32_t bytes,
                     uint32_t sig)
{
    memset(f, 0, sizeof(*f));
    f->version = WEFT_SOCK_VERSION;
    f->type = (uint16_t)type;
    f->channel = (uint16_t)c;
    f->step = step;
    f->bytes = bytes;
    f->sig = sig;
    f->check = weft_sock_check(f);
}

static ncclResult_t ds_write(struct weft_dev_sock *s, struct weft_dev_sock_peer *p,
                             const void *buf, size_t len)
{
    char what[96];
    snprintf(what, sizeof(what), "rank %d: device data to peer %d", s->me, p->rank);
    uint64_t deadline = weft_socket_deadline(weft_param_Timeout());
    return weft_socket_send_all(p->fd, buf, len, deadline, s->ctx->abort_flag, what);
}

/* One pass over every connection to p: posted slots out, freed steps back. 1 if it moved. */
static int ds_tx_peer(struct weft_dev_sock *s, struct weft_dev_sock_peer *p, int *pending)
{
    int moved = 0;
    for (int c = 0; c < s->nconn; c++) {
        struct weft_dev_recv_ctrl *rc = ds_shadow_rc(s, p->shadow, c);
        uint64_t tail = __atomic_load_n(&rc->tail, __ATOMIC_ACQUIRE);
        uint64_t credit = __atomic_load_n(&p->credit[c], __ATOMIC_ACQUIRE);
        while (p->sent[c] < tail && weft_fifo_has_credit(credit, p->sent[c], WEFT_STEPS)) {
            uint64_t st = p->sent[c];
            uint32_t slot = weft_fifo_slot(st, WEFT_STEPS);
            uint32_t bytes = rc->bytes[slot];
            struct weft_sock_frame f;
            if (bytes > s->slot_bytes) {
                ds_peer_dead(s, p, "the kernel posted an oversized slice");
                return 0;
            }
            ds_frame(&f, WEFT_SOCK_DATA, c, st, bytes, rc->sig[slot]);
            const char *data = (const char *)(rc + 1) + (size_t)slot * s->slot_bytes;
            if (ds_write(s, p, &f, sizeof(f)) != ncclSuccess ||
                ds_write(s, p, data, bytes) != ncclSuccess) {
                p->tx_off = 1;
                return 0;
            }
            p->sent[c] = st + 1;
            /* The slot is free again: the kernel's head for its sends to p. */
            struct weft_dev_send_ctrl *head =
                (struct weft_dev_send_ctrl *)(s->fifo + weft_dev_head_off(c, p->rank, s->nranks,
                                                                          s->nconn,
                                                                          s->slot_bytes));
            __atomic_store_n(&head->head, st + 1, __ATOMIC_RELEASE);
            moved = 1;
        }
        *pending |= p->sent[c] < tail;
        uint64_t freed = __atomic_load_n(&ds_shadow_sc(s, p->shadow, c)->head, __ATOMIC_ACQUIRE);
        if (freed > p->credited[c]) {
            struct weft_sock_frame f;
            ds_frame(&f, WEFT_SOCK_CREDIT, c, freed, 0, 0);
            if (ds_write(s, p, &f, sizeof(f)) != ncclSuccess) {
                p->tx_off = 1;
                return 0;
            }
            p->credited[c] = freed;
            moved = 1;
        }
    }
    return moved;
}

static void *ds_tx_main(void *arg)
{
    struct weft_dev_sock *s = arg;
    uint64_t flush_end = 0, idle_since = 0;
    for (;;) {
        int moved = 0, pending = 0;
        for (int i = 0; i < s->npeers; i++)
            if (!s->peers[i].tx_off && !__atomic_load_n(&s->peers[i].gone, __ATOMIC_ACQUIRE))
                moved |= ds_tx_peer(s, &s->peers[i], &pending);
        if (__atomic_load_n(s->ctx->abort_flag, __ATOMIC_ACQUIRE))
            break;
        if (__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
            /* Posted data reaches the network before BYE, within a short deadline. */
            uint64_t now = weft_socket_now_ns();
            if (flush_end == 0)
                flush_end = now + WEFT_DEV_SOCK_FLUSH_NS;
            if (!pending || now > flush_end)
                break;
        }
        if (moved) {
            idle_since = 0;
            continue;
        }
        /* Idle: sleep, longer the longer nothing moves (8 ranks share 2 cores): 20 us for the
         * first 2 ms (the next slice of a running collective), then 200 us, 1 ms after 100 ms. */
        uint64_t now = weft_socket_now_ns();
        if (idle_since == 0)
            idle_since = now;
        uint64_t idle = now - idle_since;
        long ns = idle < 2000000ull ? 20000 : idle < 100000000ull ? 200000 : 1000000;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
    }
    if (!__atomic_load_n(s->ctx->abort_flag, __ATOMIC_ACQUIRE)) {
        struct weft_sock_frame f;
        ds_frame(&f, WEFT_SOCK_BYE, 0, 0, 0, 0);
        for (int i = 0; i < s->npeers; i++)
            if (!s->peers[i].tx_off)
                ds_write(s, &s->peers[i], &f, sizeof(f));
    }
    return NULL;
}

/* One frame from p (readable). */
static void ds_rx_frame(struct weft_dev_sock *s, struct weft_dev_sock_peer *p)
{
    char what[96], why[256];
    snprintf(what, sizeof(what), "rank %d: device data from peer %d", s->me, p->rank);
    uint64_t deadline = weft_socket_deadline(weft_param_Timeout());
    unsigned char hdr[sizeof(struct weft_sock_frame)];
    struct weft_sock_frame f;
    if (weft_socket_recv_all(p->fd, hdr, sizeof(hdr), deadline, s->ctx->abort_flag, NULL) !=
        ncclSuccess) {
        __atomic_store_n(&p->gone, 1, __ATOMIC_RELEASE);
        ds_peer_dead(s, p, "the connection closed without BYE (the peer died?)");
        return;
    }
    const char *bad = weft_sock_frame_parse(hdr, sizeof(hdr), s->nconn, 1, 0, &f, why,
                                            sizeof(why));
    if (bad != NULL) {
        __atomic_store_n(&p->gone, 1, __ATOMIC_RELEASE);
        ds_peer_dead(s, p, bad);
        return;
    }
    if (f.type == WEFT_SOCK_BYE) {
        __atomic_store_n(&p->gone, 1, __ATOMIC_RELEASE);
        return;
    }
    int c = f.channel;
    if (f.type == WEFT_SOCK_CREDIT) {
        __atomic_store_n(&p->credit[c], f.step, __ATOMIC_RELEASE);
        return;
    }
    char *blk = s->fifo + weft_dev_recv_off(c, p->rank, s->nranks, s->slot_bytes);
    struct weft_dev_recv_ctrl *rc = (struct weft_dev_recv_ctrl *)blk;
    uint64_t freed = __atomic_load_n(&ds_shadow_sc(s, p->shadow, c)->head, __ATOMIC_ACQUIRE);
    if (f.step != p->rx_step[c] || f.bytes > s->slot_bytes ||
        !weft_fifo_has_credit(freed, f.step, WEFT_STEPS)) {
        snprintf(why, sizeof(why), "bad frame: step %llu of %u bytes on channel %d (expected step "
                 "%llu, at most %zu bytes, %llu steps freed)", (unsigned long long)f.step,
                 f.bytes, c, (unsigned long long)p->rx_step[c], s->slot_bytes,
                 (unsigned long long)freed);
        __atomic_store_n(&p->gone, 1, __ATOMIC_RELEASE);
        ds_peer_dead(s, p, why);
        return;
    }
    uint32_t slot = weft_fifo_slot(f.step, WEFT_STEPS);
    char *data = blk + sizeof(*rc) + (size_t)slot * s->slot_bytes;
    if (weft_socket_recv_all(p->fd, data, f.bytes, deadline, s->ctx->abort_flag, what) !=
        ncclSuccess) {
        __atomic_store_n(&p->gone, 1, __ATOMIC_RELEASE);
        ds_peer_dead(s, p, "the connection ended inside a slice, without BYE (the peer died?)");
        return;
    }
    rc->bytes[slot] = f.bytes;
    rc->sig[slot] = f.sig;
    /* The slot's bytes before the tail the kernel acquires (system scope). */
    __atomic_store_n(&rc->tail, f.step + 1, __ATOMIC_RELEASE);
    p->rx_step[c] = f.step + 1;
}

static void *ds_rx_main(void *arg)
{
    struct weft_dev_sock *s = arg;
    struct pollfd *fds = calloc((size_t)s->npeers, sizeof(*fds));
    int *idx = calloc((size_t)s->npeers, sizeof(*idx));
    if (fds == NULL || idx == NULL) {
        WEFT_WARN("rank %d: out of memory in the device socket proxy", s->me);
        if (s->npeers > 0)
            ds_peer_dead(s, &s->peers[0], "out of memory");
        goto out;
    }
    uint64_t drain_end = 0;
    while (!__atomic_load_n(s->ctx->abort_flag, __ATOMIC_ACQUIRE)) {
        /* Closing: read on until every peer said BYE (a socket closed with unread bytes resets
         * the connection, which may lose the peer our BYE), for at most a second. */
        if (__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE) >= 2) {
            uint64_t now = weft_socket_now_ns();
            if (drain_end == 0)
                drain_end = now + 1000000000ull;
            if (now > drain_end)
                break;
        }
        int n = 0;
        for (int i = 0; i < s->npeers; i++) {
            if (s->peers[i].gone)
                continue;
            fds[n].fd = s->peers[i].fd;
            fds[n].events = POLLIN;
            fds[n].revents = 0;
            idx[n++] = i;
        }
        if (n == 0) {
            if (drain_end != 0)
                break;
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
            continue;
        }
        int r = poll(fds, (nfds_t)n, 100);
        if (r < 0 && errno != EINTR) {
            ds_peer_dead(s, &s->peers[idx[0]], strerror(errno));
            break;
        }
        for (int k = 0; r > 0 && k < n; k++)
            if (fds[k].revents != 0)
                ds_rx_frame(s, &s->peers[idx[k]]);
    }
out:
    free(fds);
    free(idx);
    return NULL;
}

static void ds_hello(const struct weft_dev_sock *s, struct weft_sock_hello *h, int peer)
{
    memset(h, 0, sizeof(*h));
    h->version = WEFT_SOCK_VERSION;
    h->type = WEFT_SOCK_HELLO;
    h->comm_hash = s->ctx->comm_hash;
    h->rank = s->me;
    h->peer = peer;
    h->nthreads = 1;
    h->nsocks = 1;
    h->nchannels = (uint32_t)s->nconn;
    h->ll_fifos = WEFT_DEV_SOCK_HELLO;
    h->slot_bytes = s->slot_bytes;
}

/* weft_sock_admit_fn_t for the device proxy: a lower-ranked peer not connected yet (anything
 * else is dropped); its settings must be this rank's (ncclInvalidUsage otherwise). */
static ncclResult_t ds_admit(void *arg, const struct weft_sock_hello *h, int **fd_pp)
{
    struct weft_dev_sock *s = arg;
    struct weft_sock_hello want;
    ds_hello(s, &want, s->me);
    int ok = h->comm_hash == want.comm_hash && h->peer == s->me && h->rank >= 0 &&
             h->rank < s->me && h->thread == 0 && h->sock == 0 && h->nthreads == 1 &&
             h->nsocks == 1 && h->nchannels == want.nchannels && h->ll_fifos == want.ll_fifos &&
             h->slot_bytes == want.slot_bytes;
    if (!ok) {
        WEFT_WARN("rank %d: rejected a device socket connection from rank %d for rank %d (%u "
                  "channels, slot %llu bytes); expected %u channels, slot %llu bytes (set "
                  "WEFT_CUDA_CHANNELS and WEFT_CUDA_SLOT_BYTES alike on every rank)",
                  s->me, h->rank, h->peer, h->nchannels, (unsigned long long)h->slot_bytes,
                  want.nchannels, (unsigned long long)want.slot_bytes);
        return ncclInvalidUsage;
    }
    for (int i = 0; i < s->npeers; i++)
        if (s->peers[i].rank == h->rank && s->peers[i].fd < 0)
            *fd_pp = &s->peers[i].fd;
    return ncclSuccess;
}

static ncclResult_t ds_connect_all(struct weft_dev_sock *s, const union weft_sockaddr *addrs)
{
    const struct weft_transport_ctx *ctx = s->ctx;
    uint64_t deadline = weft_socket_deadline(weft_param_BootstrapTimeout());
    char what[128];
    int expected = 0;
    for (int i = 0; i < s->npeers; i++) {
        struct weft_dev_sock_peer *p = &s->peers[i];
        if (p->rank < s->me) {
            expected++;
            continue;
        }
        snprintf(what, sizeof(what), "rank %d: device socket connection to rank %d (host %s)",
                 s->me, p->rank, ctx->peers[p->rank].hostname);
        WEFT_CHECK(weft_socket_connect(&addrs[p->rank], deadline, ctx->abort_flag, what,
                                       &p->fd));
        struct weft_sock_hello h;
        ds_hello(s, &h, p->rank);
        WEFT_CHECK(weft_sock_handshake(p->fd, weft_bootstrap_key(ctx->bootstrap), &h, deadline,
                                       ctx->abort_flag, what));
    }
    snprintf(what, sizeof(what), "rank %d: %d device socket connections from lower ranks",
             s->me, expected);
    return weft_sock_accept_all(s->listen_fd, weft_bootstrap_key(ctx->bootstrap),
                                ctx->comm_hash, expected, ds_admit, s, deadline,
                                ctx->abort_flag, what);
}

static ncclResult_t ds_close(const struct weft_transport_ctx *ctx, void *state);

static ncclResult_t ds_setup(const struct weft_transport_ctx *ctx, const uint8_t *xhost, int nconn,
                                 size_t slot_bytes, char *fifo, char *const *shadow,
                                 int *dead_peer, uint32_t *abort_word, void **state_p)
{
    ncclResult_t res = ncclSuccess;
    int nranks = ctx->nranks, me = ctx->rank;
    union weft_sockaddr *addrs = calloc((size_t)nranks, sizeof(*addrs));
    struct weft_dev_sock *s = calloc(1, sizeof(*s));
    if (addrs == NULL || s == NULL) {
        WEFT_WARN("rank %d: out of memory for the device socket proxy", me);
        free(addrs);
        free(s);
        return ncclSystemError;
    }
    s->ctx = ctx;
    s->me = me;
    s->nranks = nranks;
    s->nconn = nconn;
    s->slot_bytes = slot_bytes;
    s->fifo = fifo;
    s->dead_peer = dead_peer;
    s->abort_word = abort_word;
    s->listen_fd = -1;
    for (int p = 0; p < nranks; p++)
        s->npeers += xhost[p] != 0;
    s->peers = calloc((size_t)s->npeers + 1, sizeof(*s->peers));
    uint64_t *counters = calloc((size_t)(s->npeers + 1) * 4 * (size_t)nconn, sizeof(uint64_t));
    s->counters = counters;
    if (s->peers == NULL || counters == NULL) {
        WEFT_WARN("rank %d: out of memory for %d device socket peers", me, s->npeers);
        res = ncclSystemError;
        goto err;
    }
    for (int p = 0, i = 0; p < nranks; p++) {
        if (!xhost[p])
            continue;
        struct weft_dev_sock_peer *q = &s->peers[i];
        q->rank = p;
        q->fd = -1;
        q->shadow = shadow[p];
        q->sent = counters + (size_t)i * 4 * nconn;
        q->credited = q->sent + nconn;
        q->credit = q->credited + nconn;
        q->rx_step = q->credit + nconn;
        i++;
    }
    if (s->npeers > 0) {
        char ifname[WEFT_IFNAME_LEN];
        WEFT_CHECK_GOTO(weft_socket_find_interface(ifname, sizeof(ifname), &addrs[me]), res, err);
        WEFT_CHECK_GOTO(weft_socket_listen(&addrs[me], &s->listen_fd), res, err);
    }
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(ctx->bootstrap, addrs, sizeof(*addrs)), res, err);
    for (int i = 0; i < s->npeers; i++) {
        if (!weft_socket_addr_valid(&addrs[s->peers[i].rank])) {
            WEFT_WARN("rank %d: peer %d (host %s) has no device socket address", me,
                      s->peers[i].rank, ctx->peers[s->peers[i].rank].hostname);
            res = ncclInvalidUsage;
            goto err;
        }
    }
    WEFT_CHECK_GOTO(ds_connect_all(s, addrs), res, err);
    weft_socket_close(&s->listen_fd);
    if (s->npeers > 0) {
        if (pthread_create(&s->rx, NULL, ds_rx_main, s) != 0) {
            WEFT_WARN("rank %d: cannot start the device socket proxy", me);
            res = ncclSystemError;
            goto err;
        }
        s->rx_started = 1;
        if (pthread_create(&s->tx, NULL, ds_tx_main, s) != 0) {
            WEFT_WARN("rank %d: cannot start the device socket proxy", me);
            res = ncclSystemError;
            goto err;
        }
        s->tx_started = 1;
    }
    WEFT_INFO(WEFT_LOG_NET | WEFT_LOG_INIT, "rank %d: device FIFOs to %d peers on other hosts "
              "through the socket proxy", me, s->npeers);
    free(addrs);
    *state_p = s;
    return ncclSuccess;
err:
    free(addrs);
    ds_close(ctx, s);
    return res;
}

static ncclResult_t ds_close(const struct weft_transport_ctx *ctx, void *state)
{
    (void)ctx;
    struct weft_dev_sock *s = state;
    if (s == NULL)
        return ncclSuccess;
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    if (s->tx_started)
        pthread_join(s->tx, NULL);
    __atomic_store_n(&s->stop, 2, __ATOMIC_RELEASE);
    if (s->rx_started)
        pthread_join(s->rx, NULL);
    weft_socket_close(&s->listen_fd);
    if (s->peers != NULL) {
        for (int i = 0; i < s->npeers; i++)
            weft_socket_close(&s->peers[i].fd);
        free(s->peers);
    }
    free(s->counters);
    free(s);
    return ncclSuccess;
}

const struct weft_dev_bridge weft_dev_bridge_socket = {
    .version = WEFT_DEV_BRIDGE_VERSION,
    .name = "socket",
    .setup = ds_setup,
    .close = ds_close,
};
