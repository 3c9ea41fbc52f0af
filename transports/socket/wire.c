/* The socket transport's handshake and frame parsers (socket/wire.h): pure, and fuzzed; and
 * both sides of the handshake, shared by the host and device socket transports. */
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "socket/wire.h"

const char *weft_sock_challenge_parse(const void *bytes, size_t len, uint64_t comm_hash,
                                      struct weft_auth_nonces *nonces)
{
    struct weft_sock_challenge c;
    if (len != sizeof(c))
        return "wrong length";
    memcpy(&c, bytes, sizeof(c));
    if (c.version != WEFT_SOCK_VERSION || c.type != WEFT_SOCK_CHALLENGE)
        return "not a socket transport challenge of this version";
    if (c.comm_hash != comm_hash)
        return "the listener belongs to another communicator";
    memcpy(nonces->server, c.nonce, sizeof(c.nonce));
    return NULL;
}

static void weft_sock_mac(const uint8_t *key, const char *label,
                          const struct weft_auth_nonces *nonces, const struct weft_sock_hello *h,
                          uint8_t *mac)
{
    weft_auth_mac(key, label, nonces->server, nonces->client, h, sizeof(*h), mac);
}

const char *weft_sock_hello_parse(const void *bytes, size_t len, const uint8_t *key,
                                  struct weft_auth_nonces *nonces, struct weft_sock_hello *h_p)
{
    struct weft_sock_hello_auth m;
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    if (len != sizeof(m))
        return "wrong length";
    memcpy(&m, bytes, sizeof(m));
    if (m.hello.version != WEFT_SOCK_VERSION || m.hello.type != WEFT_SOCK_HELLO)
        return "not a socket transport hello of this version";
    memcpy(nonces->client, m.nonce, sizeof(m.nonce));
    weft_sock_mac(key, "sock-hello", nonces, &m.hello, mac);
    if (!weft_auth_equal(mac, m.mac, sizeof(mac)))
        return "authentication failed (wrong secret)";
    *h_p = m.hello;
    return NULL;
}

const char *weft_sock_accept_parse(const void *bytes, size_t len, const uint8_t *key,
                                   const struct weft_auth_nonces *nonces,
                                   const struct weft_sock_hello *h)
{
    struct weft_sock_accept a;
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    if (len != sizeof(a))
        return "wrong length";
    memcpy(&a, bytes, sizeof(a));
    if (a.version != WEFT_SOCK_VERSION || a.type != WEFT_SOCK_ACCEPT)
        return "not a socket transport accept of this version";
    weft_sock_mac(key, "sock-accept", nonces, h, mac);
    if (!weft_auth_equal(mac, a.mac, sizeof(mac)))
        return "the peer failed authentication (wrong secret)";
    return NULL;
}

const char *weft_sock_frame_parse(const void *bytes, size_t len, int nfifo, int nthreads,
                                  int thread, struct weft_sock_frame *f_p, char *why,
                                  size_t why_len)
{
    struct weft_sock_frame f;
    if (len != sizeof(f)) {
        snprintf(why, why_len, "bad frame: %zu header bytes", len);
        return why;
    }
    memcpy(&f, bytes, sizeof(f));
    if (f.version != WEFT_SOCK_VERSION) {
        snprintf(why, why_len, "bad frame: version 0x%08x, expected 0x%08x", f.version,
                 WEFT_SOCK_VERSION);
        return why;
    }
    if (f.check != weft_sock_check(&f)) {
        snprintf(why, why_len,
                 "bad frame: check word 0x%08x does not match (type %u channel %u step %llu "
                 "bytes %u)",
                 f.check, f.type, f.channel, (unsigned long long)f.step, f.bytes);
        return why;
    }
    if (f.type != WEFT_SOCK_DATA && f.type != WEFT_SOCK_CREDIT && f.type != WEFT_SOCK_BYE) {
        snprintf(why, why_len, "bad frame: unknown type %u", f.type);
        return why;
    }
    if (f.type != WEFT_SOCK_BYE &&
        (nthreads < 1 || f.channel >= nfifo || f.channel % nthreads != thread)) {
        snprintf(why, why_len,
                 "bad frame: channel %d (%d FIFO channels, this connection serves channels %d "
                 "mod %d)",
                 f.channel, nfifo, thread, nthreads);
        return why;
    }
    *f_p = f;
    return NULL;
}

ncclResult_t weft_sock_handshake(int fd, const uint8_t *key, const struct weft_sock_hello *h,
                                 uint64_t deadline, volatile uint32_t *abort_flag,
                                 const char *what)
{
    struct weft_sock_challenge ch;
    struct weft_sock_hello_auth m;
    struct weft_sock_accept acc;
    struct weft_auth_nonces nonces;
    const char *why;
    WEFT_CHECK(weft_socket_recv_all(fd, &ch, sizeof(ch), deadline, abort_flag, what));
    why = weft_sock_challenge_parse(&ch, sizeof(ch), h->comm_hash, &nonces);
    if (why == NULL) {
        memset(&m, 0, sizeof(m));
        m.hello = *h;
        WEFT_CHECK(weft_auth_random(nonces.client, sizeof(nonces.client)));
        memcpy(m.nonce, nonces.client, sizeof(m.nonce));
        weft_sock_mac(key, "sock-hello", &nonces, h, m.mac);
        WEFT_CHECK(weft_socket_send_all(fd, &m, sizeof(m), deadline, abort_flag, what));
        WEFT_CHECK(weft_socket_recv_all(fd, &acc, sizeof(acc), deadline, abort_flag, what));
        why = weft_sock_accept_parse(&acc, sizeof(acc), key, &nonces, h);
    }
    if (why != NULL) {
        WEFT_WARN("%s: handshake failed: %s", what, why);
        return ncclSystemError;
    }
    return ncclSuccess;
}

/* An accepted connection whose handshake is not done yet. */
struct weft_sock_pending {
    int fd;
    uint64_t since;
    size_t got;
    struct weft_auth_nonces nonces;
    unsigned char msg[sizeof(struct weft_sock_hello_auth)];
};

/* Sends a fresh connection its challenge; 0 when it cannot take it (it is then dropped). */
static int sock_challenge(uint64_t comm_hash, struct weft_sock_pending *c)
{
    struct weft_sock_challenge ch;
    size_t done = 0;
    memset(&ch, 0, sizeof(ch));
    ch.version = WEFT_SOCK_VERSION;
    ch.type = WEFT_SOCK_CHALLENGE;
    ch.comm_hash = comm_hash;
    if (weft_auth_random(c->nonces.server, sizeof(c->nonces.server)) != ncclSuccess)
        return 0;
    memcpy(ch.nonce, c->nonces.server, sizeof(ch.nonce));
    return weft_socket_send_some(c->fd, &ch, sizeof(ch), &done, NULL) == ncclSuccess &&
           done == sizeof(ch);
}

/*
 * Reads what pending connection c sent. *admitted: it became a link (its fd is in the slot);
 * *drop: it is to be closed (it did not authenticate, or admit() did not want it). An error from
 * admit() fails the setup.
 */
static ncclResult_t sock_pending_read(const uint8_t *key, struct weft_sock_pending *c,
                                      weft_sock_admit_fn_t admit, void *arg, const char *what,
                                      int *admitted, int *drop)
{
    struct weft_sock_hello h;
    struct weft_sock_accept acc;
    const char *why;
    size_t done = 0;
    int *slot = NULL;
    *admitted = *drop = 0;
    if (weft_socket_recv_some(c->fd, c->msg, sizeof(c->msg), &c->got, NULL) != ncclSuccess) {
        *drop = 1;
        return ncclSuccess;
    }
    if (c->got < sizeof(c->msg))
        return ncclSuccess;
    why = weft_sock_hello_parse(c->msg, sizeof(c->msg), key, &c->nonces, &h);
    if (why != NULL) {
        WEFT_INFO(WEFT_LOG_NET, "%s: dropped a connection: %s", what, why);
        *drop = 1;
        return ncclSuccess;
    }
    WEFT_CHECK(admit(arg, &h, &slot));
    if (slot == NULL) {
        *drop = 1;
        return ncclSuccess;
    }
    memset(&acc, 0, sizeof(acc));
    acc.version = WEFT_SOCK_VERSION;
    acc.type = WEFT_SOCK_ACCEPT;
    weft_sock_mac(key, "sock-accept", &c->nonces, &h, acc.mac);
    if (weft_socket_send_some(c->fd, &acc, sizeof(acc), &done, NULL) != ncclSuccess ||
        done != sizeof(acc)) {
        *drop = 1;
        return ncclSuccess;
    }
    *slot = c->fd;
    *admitted = 1;
    return ncclSuccess;
}

ncclResult_t weft_sock_accept_all(int listen_fd, const uint8_t *key, uint64_t comm_hash,
                                  int expected, weft_sock_admit_fn_t admit, void *arg,
                                  uint64_t deadline, volatile uint32_t *abort_flag,
                                  const char *what)
{
    struct weft_sock_pending *pend = NULL;
    struct pollfd *pfds = NULL;
    int npend = 0, cap = 0;
    uint64_t accept_after = 0; /* out of descriptors: the listener rests until then */
    ncclResult_t res = ncclSuccess;
    while (expected > 0) {
        uint64_t now = weft_socket_now_ns();
        for (int i = npend - 1; i >= 0; i--) {
            if (now - pend[i].since < WEFT_SOCK_ADMIT_MS * 1000000ull)
                continue;
            WEFT_INFO(WEFT_LOG_NET, "%s: dropped a connection silent for %d ms", what,
                      WEFT_SOCK_ADMIT_MS);
            close(pend[i].fd);
            pend[i] = pend[--npend];
        }
        if (npend + 1 > cap) {
            int ncap = cap ? 2 * cap : 16;
            struct weft_sock_pending *np = realloc(pend, (size_t)ncap * sizeof(*np));
            if (np != NULL)
                pend = np;
            struct pollfd *npf = realloc(pfds, (size_t)(ncap + 1) * sizeof(*npf));
            if (npf != NULL)
                pfds = npf;
            if (np == NULL || npf == NULL) {
                WEFT_WARN("%s: out of memory for %d handshakes", what, ncap);
                res = ncclSystemError;
                goto out;
            }
            cap = ncap;
        }
        int n = npend;
        int resting = now < accept_after;
        pfds[0] = (struct pollfd){.fd = resting ? -1 : listen_fd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            pfds[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        if (!resting) {
            WEFT_CHECK_GOTO(weft_socket_poll(pfds, (nfds_t)n + 1, deadline, abort_flag, what), res,
                            out);
        } else {
            /* Out of descriptors: only the pending handshakes are watched for a short while. */
            if (abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) {
                WEFT_INFO(WEFT_LOG_NET, "%s: aborted", what);
                res = ncclSystemError;
                goto out;
            }
            if (deadline != 0 && now >= deadline) {
                WEFT_WARN("%s: timed out with %d connections missing (out of descriptors)", what,
                          expected);
                res = ncclSystemError;
                goto out;
            }
            if (poll(pfds, (nfds_t)n + 1, WEFT_ACCEPT_LATER_MS) < 0)
                for (int i = 0; i <= n; i++)
                    pfds[i].revents = 0; /* EINTR or ENOMEM: look again */
        }
        /* Backwards: a finished entry is replaced by the last one, already looked at. */
        for (int i = n - 1; i >= 0; i--) {
            int admitted, drop;
            if (pfds[i + 1].revents == 0)
                continue;
            WEFT_CHECK_GOTO(sock_pending_read(key, &pend[i], admit, arg, what, &admitted, &drop),
                            res, out);
            if (drop)
                close(pend[i].fd);
            if (admitted)
                expected--;
            if (admitted || drop)
                pend[i] = pend[--npend];
        }
        /* A burst at a time: a stranger's queue of connections is worked through quickly. */
        for (int k = 0; pfds[0].revents != 0 && k < 64 && npend < cap; k++) {
            int fd;
            enum weft_accept_act act;
            int oldest = 0;
            for (int i = 1; i < npend; i++)
                if (pend[i].since < pend[oldest].since)
                    oldest = i;
            WEFT_CHECK_GOTO(weft_socket_accept_pending(listen_fd, npend,
                                                       npend > 0 ? pend[oldest].since : 0,
                                                       expected, what, &fd, &act),
                            res, out);
            if (act == WEFT_ACCEPT_NONE)
                break;
            if (act == WEFT_ACCEPT_LATER) {
                accept_after = weft_socket_now_ns() + WEFT_ACCEPT_LATER_MS * 1000000ull;
                break;
            }
            if (act == WEFT_ACCEPT_EVICT && npend > 0) {
                WEFT_INFO(WEFT_LOG_NET, "%s: dropped the oldest pending connection for a new one",
                          what);
                close(pend[oldest].fd);
                pend[oldest] = pend[--npend];
            }
            if (fd < 0)
                continue;
            pend[npend] = (struct weft_sock_pending){.fd = fd, .since = weft_socket_now_ns()};
            if (sock_challenge(comm_hash, &pend[npend]))
                npend++;
            else
                close(fd);
        }
    }
out:
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    free(pend);
    free(pfds);
    return res;
}
