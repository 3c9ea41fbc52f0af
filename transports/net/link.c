/* Provider connections with peers and the idle wait of a net proxy (link.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/check.h"
#include "core/log.h"
#include "core/param.h"
#include "link.h"

WEFT_PARAM_DECL(BootstrapTimeout);

/* Listens once per link and sends each peer its handles; receives theirs. */
static ncclResult_t net_links_exchange(const struct weft_net *net, struct weft_bootstrap *bs,
                                       int tag, int me, int dev, const int *peers, int npeers,
                                       int nlinks, struct weft_net_link *links, const char *who)
{
    size_t n = (size_t)nlinks * NCCL_NET_HANDLE_MAXSIZE;
    char *buf = calloc(1, n);
    ncclResult_t res = ncclSuccess;
    if (buf == NULL) {
        WEFT_WARN("rank %d: %s: out of memory for handles", me, who);
        return ncclSystemError;
    }
    for (int i = 0; i < npeers; i++) {
        memset(buf, 0, n);
        for (int k = 0; k < nlinks; k++) {
            struct weft_net_link *l = &links[(size_t)i * nlinks + k];
            res = net->table->listen(net->ctx, dev, buf + (size_t)k * NCCL_NET_HANDLE_MAXSIZE,
                                     &l->listen_comm);
            if (res != ncclSuccess || l->listen_comm == NULL) {
                WEFT_WARN("rank %d: %s: listen for peer %d failed (error %d)", me, who, peers[i],
                          (int)res);
                res = res != ncclSuccess ? res : ncclInternalError;
                goto out;
            }
        }
        /* a few KiB: fits the socket buffers, so every rank sends first, then receives */
        WEFT_CHECK_GOTO(weft_bootstrap_send(bs, peers[i], tag, buf, n), res, out);
    }
    for (int i = 0; i < npeers; i++) {
        WEFT_CHECK_GOTO(weft_bootstrap_recv(bs, peers[i], tag, buf, n), res, out);
        for (int k = 0; k < nlinks; k++)
            memcpy(links[(size_t)i * nlinks + k].theirs, buf + (size_t)k * NCCL_NET_HANDLE_MAXSIZE,
                   NCCL_NET_HANDLE_MAXSIZE);
    }
out:
    free(buf);
    return res;
}

ncclResult_t weft_net_links_open(const struct weft_net *net, struct weft_bootstrap *bs, int tag,
                                 int me, int dev, const int *peers, int npeers, int nlinks,
                                 struct weft_net_link *links, const volatile uint32_t *abort_flag,
                                 const char *who)
{
    const ncclNet_v11_t *t = net->table;
    WEFT_CHECK(net_links_exchange(net, bs, tag, me, dev, peers, npeers, nlinks, links, who));
    uint64_t deadline = weft_time_ns() + (uint64_t)weft_param_BootstrapTimeout() * 1000000000ull;
    for (;;) {
        int left = 0, moved = 0;
        for (int i = 0; i < npeers * nlinks; i++) {
            struct weft_net_link *l = &links[i];
            ncclResult_t res;
            if (l->send_comm == NULL) {
                ncclNetDeviceHandle_v11_t *dh = NULL;
                res = t->connect(net->ctx, dev, l->theirs, &l->send_comm, &dh);
                if (res != ncclSuccess) {
                    WEFT_WARN("rank %d: %s: connect to peer %d failed (error %d)", me, who,
                              peers[i / nlinks], (int)res);
                    return res;
                }
                moved |= l->send_comm != NULL;
            }
            if (l->recv_comm == NULL) {
                ncclNetDeviceHandle_v11_t *dh = NULL;
                res = t->accept(l->listen_comm, &l->recv_comm, &dh);
                if (res != ncclSuccess) {
                    WEFT_WARN("rank %d: %s: accept from peer %d failed (error %d)", me, who,
                              peers[i / nlinks], (int)res);
                    return res;
                }
                if (l->recv_comm != NULL) {
                    (void)t->closeListen(l->listen_comm);
                    l->listen_comm = NULL;
                    moved = 1;
                }
            }
            left += (l->send_comm == NULL) + (l->recv_comm == NULL);
        }
        if (left == 0)
            return ncclSuccess;
        if (__atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) {
            WEFT_WARN("rank %d: %s: setup aborted with %d connections still open", me, who, left);
            return ncclInternalError;
        }
        if (weft_time_ns() > deadline) {
            WEFT_WARN("rank %d: %s: %d connections not made within %lld s "
                      "(WEFT_BOOTSTRAP_TIMEOUT): a peer is gone or unreachable",
                      me, who, left, (long long)weft_param_BootstrapTimeout());
            return ncclRemoteError;
        }
        if (!moved)
            usleep(200);
    }
}

void weft_net_links_close(const struct weft_net *net, struct weft_net_link *links, int n)
{
    const ncclNet_v11_t *t = net->table;
    for (int i = 0; links != NULL && i < n; i++) {
        struct weft_net_link *l = &links[i];
        if (l->send_comm != NULL)
            (void)t->closeSend(l->send_comm);
        if (l->recv_comm != NULL)
            (void)t->closeRecv(l->recv_comm);
        if (l->listen_comm != NULL)
            (void)t->closeListen(l->listen_comm);
        l->send_comm = l->recv_comm = l->listen_comm = NULL;
    }
}

void weft_net_nap(struct weft_net_nap *n, struct weft_doorbell *bell, uint64_t spin_ns,
                  uint64_t max_ns, int (*recheck)(void *arg), void *arg)
{
    uint64_t now = weft_time_ns();
    if (n->idle_since == 0)
        n->idle_since = now;
    if (now - n->idle_since < spin_ns) {
        weft_cpu_relax();
        return;
    }
    if (n->nap_ns == 0)
        n->nap_ns = 20000;
    uint32_t seq = __atomic_load_n(&bell->seq, __ATOMIC_ACQUIRE);
    int deaf = weft_doorbell_enter(bell) != 0;
    if (recheck(arg)) {
        weft_net_nap_reset(n);
    } else {
        weft_futex_wait(&bell->seq, seq, deaf && n->nap_ns > 100000 ? 100000 : n->nap_ns);
        n->nap_ns = n->nap_ns * 2 > max_ns ? max_ns : n->nap_ns * 2;
    }
    weft_doorbell_leave(bell);
}
