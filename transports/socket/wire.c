/* The socket transport's handshake and frame parsers (socket/socket.h): pure, and fuzzed. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "socket/socket.h"

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
