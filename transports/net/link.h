/*
 * What the net transport's host and device bridges share (net.c, dev_net.c): provider
 * connections made with a communicator's peers, and the idle wait of a proxy thread.
 *
 * A link is one pair of provider connections with one peer: a send comm to it and a receive comm
 * from it. Making links (weft_net_links_open) is collective over the peers involved: each rank
 * listens once per link, sends each peer its handles over the bootstrap (authenticated, so a
 * handle reaches only the peer it is for), then connects to the peers' handles and accepts their
 * connections in one loop (the provider's calls never block), bounded by the bootstrap deadline
 * and the abort flag.
 */
#ifndef WEFT_TRANSPORTS_NET_LINK_H
#define WEFT_TRANSPORTS_NET_LINK_H

#include <stdint.h>

#include "fifo.h"
#include "net.h"

struct weft_bootstrap;

struct weft_net_link {
    void *listen_comm, *send_comm, *recv_comm;
    char theirs[NCCL_NET_HANDLE_MAXSIZE]; /* the peer's listen handle (connect keeps state) */
};

/*
 * Opens nlinks links with each of the npeers ranks in peers[] (links[i * nlinks + k] is link k
 * with peers[i]); every listed peer must call it with this rank listed and the same nlinks, and
 * the same tag. who names the caller in messages ("NET/<name> host FIFOs"). On failure the links
 * made so far stay in links[] for weft_net_links_close.
 */
ncclResult_t weft_net_links_open(const struct weft_net *net, struct weft_bootstrap *bs, int tag,
                                 int me, int dev, const int *peers, int npeers, int nlinks,
                                 struct weft_net_link *links, const volatile uint32_t *abort_flag,
                                 const char *who);
/* Closes what weft_net_links_open made (n links; NULL comms are skipped). */
void weft_net_links_close(const struct weft_net *net, struct weft_net_link *links, int n);

/*
 * The idle wait of a proxy thread driving a provider (which gives no descriptor to sleep on):
 * poll for spin_ns after the last work, then sleep on bell (rung by the rank's posts) for a time
 * that doubles from 20 us up to max_ns while nothing moves, asking recheck(arg) once more after
 * announcing the sleep (a post that lands after it rings the bell).
 */
struct weft_net_nap {
    uint64_t idle_since;
    uint64_t nap_ns;
};
/* Call after a pass that moved something. */
static inline void weft_net_nap_reset(struct weft_net_nap *n)
{
    n->idle_since = 0;
    n->nap_ns = 0;
}
/* Call after a pass that moved nothing. */
void weft_net_nap(struct weft_net_nap *n, struct weft_doorbell *bell, uint64_t spin_ns,
                  uint64_t max_ns, int (*recheck)(void *arg), void *arg);

#endif
