/*
 * Device FIFOs across hosts through the communicator's network provider (transport.h,
 * struct weft_dev_bridge): the bridge the CUDA executor uses when weft_net_open chose a provider.
 * Memory as for every bridge: the kernel posts its sends to peer p into a shadow of p's receive
 * block (pinned host memory of this rank) and reads p's sends from its own host FIFOs.
 *
 * One provider link (link.h) per (peer, connection channel). Step s travels as two messages, in
 * order: an 8-byte header (bytes, sig) from the proxy's memory, then the payload straight from
 * the shadow slot into the peer's receive slot; the receiving proxy stores bytes and sig beside
 * the slot and release-stores tail only once both arrived, so the kernel never sees a step the
 * provider has not finished. The sender's slot is free (the kernel's head) once the payload's
 * send completed; receives are posted for every slot the kernel freed (the shadow head). An
 * empty header is a goodbye: the peer closed, and what follows on that link is no failure.
 *
 * A provider gives nothing to sleep on and kernels ring no doorbell: the proxy naps from 20 us
 * up to WEFT_NET_POLL_MAX_US while nothing moves. A provider error or a malformed message stops
 * this rank's kernels (abort word) and names the peer (dead_peer), as the socket bridge does.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/peer_info.h"
#include "core/log.h"
#include "core/param.h"
#include "dev_fifo.h"
#include "link.h"
#include "net.h"
#include "transport.h"

WEFT_PARAM_DECL(NetPollMaxUs);

#define WEFT_DEV_NET_TAG (0x57530000 - 0x201)
#define WEFT_DEV_NET_FLUSH_NS 5000000000ull /* close: posted steps handed over within 5 s */
#define WEFT_DEV_NET_MSGS (2 * WEFT_STEPS)  /* messages in flight per direction: 2 per step */

/* One (peer, connection channel). Message m of a direction is part m % 2 (0 header, 1 payload)
 * of step m / 2. */
struct weft_dev_net_conn {
    struct weft_net_link *link;
    struct weft_dev_recv_ctrl *send_rc;   /* the shadow of the peer's receive block */
    struct weft_dev_send_ctrl *send_head; /* the kernel's head for its sends (own host FIFOs) */
    struct weft_dev_recv_ctrl *recv_rc;   /* own receive block (host FIFOs) */
    struct weft_dev_send_ctrl *recv_head; /* the kernel's frees of received steps (shadow) */
    void *send_mh, *recv_mh, *hdr_send_mh, *hdr_recv_mh;
    uint64_t tx_posted, tx_done, rx_posted, rx_done; /* messages */
    void *tx_req[WEFT_DEV_NET_MSGS], *rx_req[WEFT_DEV_NET_MSGS];
    int peer_bye, bye_sent;
    void *bye_req;
    uint32_t tx_hdr[WEFT_STEPS][2]; /* bytes, sig */
    uint32_t rx_hdr[WEFT_STEPS][2];
};

struct weft_dev_net_peer {
    int rank;
    int dead;
    struct weft_dev_net_conn *conns; /* [nconn] */
};

struct weft_dev_net {
    struct weft_doorbell bell __attribute__((aligned(WEFT_CACHELINE))); /* rung only to stop */
    const struct weft_transport_ctx *ctx;
    const struct weft_net *net;
    const ncclNet_v11_t *t;
    int me, nranks, nconn, npeers, dev;
    size_t slot_bytes;
    uint64_t poll_max_ns;
    int *dead_peer;
    uint32_t *abort_word;
    struct weft_dev_net_peer *peers;
    struct weft_dev_net_conn *conns; /* [npeers][nconn] */
    struct weft_net_link *links;     /* [npeers][nconn] */
    pthread_t tid;
    int started;
    int stop; /* 1: flush and say goodbye; 2: leave now */
    int flushed;
};

/* Peer p failed (or sent garbage): stop the kernels, and let the executor's error name it. */
static void dn_fail(struct weft_dev_net *s, struct weft_dev_net_peer *p, int c, const char *why,
                    ncclResult_t res)
{
    if (p->dead)
        return;
    p->dead = 1;
    int left = 0;
    for (int k = 0; k < s->nconn; k++)
        left |= p->conns[k].peer_bye;
    if (__atomic_load_n(s->ctx->abort_flag, __ATOMIC_ACQUIRE) ||
        (left && __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)))
        return; /* aborting, or closing after the peer left: nothing is lost */
    int none = -1;
    if (__atomic_compare_exchange_n(s->dead_peer, &none, p->rank, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        WEFT_WARN("rank %d: NET/%s: device connection to peer %d (host %s), channel %d: %s%s "
                  "(error %d)",
                  s->me, s->net->name, p->rank, s->ctx->peers[p->rank].hostname, c, why,
                  left ? " after the peer closed its communicator (the ranks issued different "
                         "operations)"
                  : res == ncclRemoteError ? ": connection closed by the peer without a goodbye "
                                             "(it died or aborted)"
                                           : "",
                  (int)res);
    __atomic_store_n(s->abort_word, 1, __ATOMIC_RELEASE);
}

static char *dn_slot(struct weft_dev_recv_ctrl *rc, size_t slot_bytes, uint64_t step)
{
    return (char *)(rc + 1) + (size_t)weft_fifo_slot(step, WEFT_STEPS) * slot_bytes;
}

/* Moves one connection as far as it goes now; 1 if anything moved. */
static int dn_conn_progress(struct weft_dev_net *s, struct weft_dev_net_peer *p, int c)
{
    const ncclNet_v11_t *t = s->t;
    struct weft_dev_net_conn *k = &p->conns[c];
    int moved = 0;
    ncclResult_t res;
    /* sends: the header and payload of every step the kernel posted, in order */
    uint64_t tail = __atomic_load_n(&k->send_rc->tail, __ATOMIC_ACQUIRE);
    while (k->tx_posted / 2 < tail) {
        uint64_t step = k->tx_posted / 2;
        uint32_t slot = weft_fifo_slot(step, WEFT_STEPS);
        void *req = NULL;
        if (k->tx_posted % 2 == 0) {
            k->tx_hdr[slot][0] = k->send_rc->bytes[slot];
            k->tx_hdr[slot][1] = k->send_rc->sig[slot];
            if (k->tx_hdr[slot][0] > s->slot_bytes) {
                dn_fail(s, p, c, "the kernel posted an oversized slice", ncclInternalError);
                return 1;
            }
            res = t->isend(k->link->send_comm, k->tx_hdr[slot], sizeof(k->tx_hdr[slot]), s->me,
                           k->hdr_send_mh, NULL, &req);
        } else {
            res = t->isend(k->link->send_comm, dn_slot(k->send_rc, s->slot_bytes, step),
                           k->tx_hdr[slot][0], s->me, k->send_mh, NULL, &req);
        }
        if (res != ncclSuccess) {
            dn_fail(s, p, c, "isend failed", res);
            return 1;
        }
        if (req == NULL)
            break;
        k->tx_req[k->tx_posted % WEFT_DEV_NET_MSGS] = req;
        k->tx_posted++;
        moved = 1;
    }
    while (k->tx_done < k->tx_posted) {
        int done = 0;
        res = t->test(k->tx_req[k->tx_done % WEFT_DEV_NET_MSGS], &done, NULL);
        if (res != ncclSuccess) {
            dn_fail(s, p, c, "a send failed", res);
            return 1;
        }
        if (!done)
            break;
        k->tx_done++;
        if (k->tx_done % 2 == 0) /* a payload left: its shadow slot is the kernel's again */
            __atomic_store_n(&k->send_head->head, k->tx_done / 2, __ATOMIC_RELEASE);
        moved = 1;
    }
    if (k->peer_bye)
        return moved;
    /* receives: posted for every slot the kernel freed; tail once header and payload landed */
    uint64_t freed = __atomic_load_n(&k->recv_head->head, __ATOMIC_ACQUIRE);
    while (weft_fifo_has_credit(freed, k->rx_posted / 2, WEFT_STEPS)) {
        uint64_t step = k->rx_posted / 2;
        uint32_t slot = weft_fifo_slot(step, WEFT_STEPS);
        void *data, *mh, *req = NULL;
        size_t size;
        int tag = p->rank;
        if (k->rx_posted % 2 == 0) {
            data = k->rx_hdr[slot];
            size = sizeof(k->rx_hdr[slot]);
            mh = k->hdr_recv_mh;
        } else {
            data = dn_slot(k->recv_rc, s->slot_bytes, step);
            size = s->slot_bytes;
            mh = k->recv_mh;
        }
        res = t->irecv(k->link->recv_comm, 1, &data, &size, &tag, &mh, NULL, &req);
        if (res != ncclSuccess) {
            dn_fail(s, p, c, "irecv failed", res);
            return 1;
        }
        if (req == NULL)
            break;
        k->rx_req[k->rx_posted % WEFT_DEV_NET_MSGS] = req;
        k->rx_posted++;
        moved = 1;
    }
    while (k->rx_done < k->rx_posted) {
        int done = 0, size = 0;
        res = t->test(k->rx_req[k->rx_done % WEFT_DEV_NET_MSGS], &done, &size);
        if (res != ncclSuccess) {
            dn_fail(s, p, c, "a receive failed", res);
            return 1;
        }
        if (!done)
            break;
        uint64_t step = k->rx_done / 2;
        uint32_t slot = weft_fifo_slot(step, WEFT_STEPS);
        if (k->rx_done % 2 == 0) {
            if (size == 0) {
                k->peer_bye = 1; /* a goodbye */
                return 1;
            }
            if (size != (int)sizeof(k->rx_hdr[slot]) || k->rx_hdr[slot][0] > s->slot_bytes) {
                dn_fail(s, p, c, "a malformed step header arrived", ncclRemoteError);
                return 1;
            }
        } else {
            if ((uint32_t)size != k->rx_hdr[slot][0]) {
                dn_fail(s, p, c, "a step's payload differs from its header", ncclRemoteError);
                return 1;
            }
            k->recv_rc->bytes[slot] = k->rx_hdr[slot][0];
            k->recv_rc->sig[slot] = k->rx_hdr[slot][1];
            /* the slot's bytes before the tail the kernel acquires (system scope) */
            __atomic_store_n(&k->recv_rc->tail, step + 1, __ATOMIC_RELEASE);
        }
        k->rx_done++;
        moved = 1;
    }
    return moved;
}

static int dn_scan(void *arg)
{
    struct weft_dev_net *s = arg;
    int moved = 0;
    for (int i = 0; i < s->npeers; i++)
        for (int c = 0; c < s->nconn && !s->peers[i].dead; c++)
            moved |= dn_conn_progress(s, &s->peers[i], c);
    return moved;
}

/* Closing: 1 once every posted step and then a goodbye left on every link (or its peer is
 * gone). */
static int dn_flushed(struct weft_dev_net *s)
{
    int flushed = 1;
    for (int i = 0; i < s->npeers; i++) {
        struct weft_dev_net_peer *p = &s->peers[i];
        for (int c = 0; c < s->nconn && !p->dead; c++) {
            struct weft_dev_net_conn *k = &p->conns[c];
            if (k->tx_done < k->tx_posted ||
                k->tx_posted / 2 < __atomic_load_n(&k->send_rc->tail, __ATOMIC_ACQUIRE)) {
                flushed = 0;
                continue;
            }
            if (k->bye_sent)
                continue;
            ncclResult_t res = ncclSuccess;
            int done = 0;
            if (k->bye_req == NULL)
                res = s->t->isend(k->link->send_comm, k->tx_hdr, 0, s->me, k->hdr_send_mh, NULL,
                                  &k->bye_req);
            if (res == ncclSuccess && k->bye_req != NULL)
                res = s->t->test(k->bye_req, &done, NULL);
            if (res != ncclSuccess)
                dn_fail(s, p, c, "the goodbye failed", res);
            else if (done)
                k->bye_sent = 1;
            else
                flushed = 0;
        }
    }
    return flushed;
}

static void *dn_proxy_main(void *arg)
{
    struct weft_dev_net *s = arg;
    struct weft_net_nap nap = {0, 0};
    uint64_t flush_end = 0;
    for (;;) {
        int stop = __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE);
        if (stop == 2 || __atomic_load_n(s->ctx->abort_flag, __ATOMIC_ACQUIRE))
            break;
        int moved = dn_scan(s);
        if (stop == 1) {
            if (flush_end == 0)
                flush_end = weft_time_ns() + WEFT_DEV_NET_FLUSH_NS;
            if (dn_flushed(s) || weft_time_ns() > flush_end)
                break;
        }
        if (moved)
            weft_net_nap_reset(&nap);
        else
            weft_net_nap(&nap, &s->bell, 0, s->poll_max_ns, dn_scan, s);
    }
    return NULL;
}

static ncclResult_t dn_close(const struct weft_transport_ctx *ctx, void *state)
{
    (void)ctx;
    struct weft_dev_net *s = state;
    if (s == NULL)
        return ncclSuccess;
    if (s->started) {
        __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
        __atomic_fetch_add(&s->bell.seq, 1, __ATOMIC_SEQ_CST);
        weft_futex_wake(&s->bell.seq);
        pthread_join(s->tid, NULL);
    }
    __atomic_store_n(&s->stop, 2, __ATOMIC_RELEASE);
    const ncclNet_v11_t *t = s->t;
    for (int i = 0; s->conns != NULL && i < s->npeers * s->nconn; i++) {
        struct weft_dev_net_conn *k = &s->conns[i];
        if (k->send_mh != NULL)
            (void)t->deregMr(k->link->send_comm, k->send_mh);
        if (k->hdr_send_mh != NULL)
            (void)t->deregMr(k->link->send_comm, k->hdr_send_mh);
        if (k->recv_mh != NULL)
            (void)t->deregMr(k->link->recv_comm, k->recv_mh);
        if (k->hdr_recv_mh != NULL)
            (void)t->deregMr(k->link->recv_comm, k->hdr_recv_mh);
    }
    weft_net_links_close(s->net, s->links, s->npeers * s->nconn);
    free(s->links);
    free(s->conns);
    free(s->peers);
    free(s);
    return ncclSuccess;
}

static ncclResult_t dn_register(struct weft_dev_net *s)
{
    const ncclNet_v11_t *t = s->t;
    size_t slots = (size_t)WEFT_STEPS * s->slot_bytes;
    for (int i = 0; i < s->npeers * s->nconn; i++) {
        struct weft_dev_net_conn *k = &s->conns[i];
        ncclResult_t res =
            t->regMr(k->link->send_comm, k->send_rc + 1, slots, NCCL_PTR_HOST, &k->send_mh);
        if (res == ncclSuccess)
            res = t->regMr(k->link->send_comm, k->tx_hdr, sizeof(k->tx_hdr), NCCL_PTR_HOST,
                           &k->hdr_send_mh);
        if (res == ncclSuccess)
            res = t->regMr(k->link->recv_comm, k->recv_rc + 1, slots, NCCL_PTR_HOST, &k->recv_mh);
        if (res == ncclSuccess)
            res = t->regMr(k->link->recv_comm, k->rx_hdr, sizeof(k->rx_hdr), NCCL_PTR_HOST,
                           &k->hdr_recv_mh);
        if (res != ncclSuccess) {
            WEFT_WARN("rank %d: NET/%s: registering device FIFOs failed (error %d)", s->me,
                      s->net->name, (int)res);
            return res;
        }
    }
    return ncclSuccess;
}

static ncclResult_t dn_setup(const struct weft_transport_ctx *ctx, const uint8_t *xhost, int nconn,
                             size_t slot_bytes, char *fifo, char *const *shadow, int *dead_peer,
                             uint32_t *abort_word, void **state_p)
{
    ncclResult_t res = ncclSuccess;
    struct weft_dev_net *s = NULL;
    int *ranks = NULL;
    if (posix_memalign((void **)&s, WEFT_CACHELINE, sizeof(*s)) != 0) {
        WEFT_WARN("rank %d: out of memory for the device net bridge", ctx->rank);
        return ncclSystemError;
    }
    memset(s, 0, sizeof(*s));
    weft_doorbell_init(&s->bell, WEFT_BELL_FUTEX, -1);
    s->ctx = ctx;
    s->net = ctx->net;
    s->t = ctx->net->table;
    s->me = ctx->rank;
    s->nranks = ctx->nranks;
    s->nconn = nconn;
    s->slot_bytes = slot_bytes;
    s->dead_peer = dead_peer;
    s->abort_word = abort_word;
    int64_t poll_max = weft_param_NetPollMaxUs();
    s->poll_max_ns = (uint64_t)(poll_max < 20 ? 20 : poll_max) * 1000ull;
    int local = 0;
    for (int r = 0; r < ctx->rank; r++)
        local += ctx->peers[r].host_hash == ctx->peers[ctx->rank].host_hash;
    s->dev = local % s->net->ndev;
    for (int p = 0; p < s->nranks; p++)
        s->npeers += xhost[p] != 0;
    size_t nk = (size_t)s->npeers * nconn + 1;
    s->peers = calloc((size_t)s->npeers + 1, sizeof(*s->peers));
    s->conns = calloc(nk, sizeof(*s->conns));
    s->links = calloc(nk, sizeof(*s->links));
    ranks = calloc((size_t)s->npeers + 1, sizeof(int));
    if (s->peers == NULL || s->conns == NULL || s->links == NULL || ranks == NULL) {
        WEFT_WARN("rank %d: out of memory for the device net bridge to %d peers", s->me, s->npeers);
        res = ncclSystemError;
        goto err;
    }
    for (int r = 0, i = 0; r < s->nranks; r++) {
        if (!xhost[r])
            continue;
        struct weft_dev_net_peer *p = &s->peers[i];
        p->rank = r;
        p->conns = &s->conns[(size_t)i * nconn];
        ranks[i] = r;
        for (int c = 0; c < nconn; c++) {
            struct weft_dev_net_conn *k = &p->conns[c];
            k->link = &s->links[(size_t)i * nconn + c];
            k->send_rc = weft_dev_shadow_send_rc(nconn, slot_bytes, shadow[r], c);
            k->recv_head = weft_dev_shadow_recv_sc(nconn, slot_bytes, shadow[r], c);
            k->recv_rc = (struct weft_dev_recv_ctrl *)(fifo + weft_dev_recv_off(c, r, s->nranks,
                                                                                slot_bytes));
            k->send_head =
                (struct weft_dev_send_ctrl *)(fifo + weft_dev_head_off(c, r, s->nranks, nconn,
                                                                       slot_bytes));
        }
        i++;
    }
    char who[96];
    snprintf(who, sizeof(who), "NET/%s device FIFOs", s->net->name);
    WEFT_CHECK_GOTO(weft_net_links_open(s->net, ctx->bootstrap, WEFT_DEV_NET_TAG, s->me, s->dev,
                                        ranks, s->npeers, nconn, s->links, ctx->abort_flag, who),
                    res, err);
    WEFT_CHECK_GOTO(dn_register(s), res, err);
    if (s->npeers > 0) {
        int rc = pthread_create(&s->tid, NULL, dn_proxy_main, s);
        if (rc != 0) {
            WEFT_WARN("rank %d: NET/%s: starting the device proxy failed: %s", s->me, s->net->name,
                      strerror(rc));
            res = ncclSystemError;
            goto err;
        }
        s->started = 1;
    }
    WEFT_INFO(WEFT_LOG_NET | WEFT_LOG_INIT,
              "rank %d: device FIFOs to %d peers on other hosts through NET/%s (device %d)", s->me,
              s->npeers, s->net->name, s->dev);
    free(ranks);
    *state_p = s;
    return ncclSuccess;
err:
    free(ranks);
    dn_close(ctx, s);
    return res;
}

const struct weft_dev_bridge weft_dev_bridge_net = {
    .version = WEFT_DEV_BRIDGE_VERSION,
    .name = "net",
    .setup = dn_setup,
    .close = dn_close,
};
