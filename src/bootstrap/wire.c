/*
 * Parsers of everything the bootstrap reads from the wire (wire.h): each takes the bytes and
 * their length, checks every field and the MAC, and says why it refuses. No allocation, no I/O,
 * no logging: tests/fuzz feeds them arbitrary bytes.
 */
#include <stddef.h>

#include "bootstrap/wire.h"

const char *weft_bs_id_parse(const void *bytes, size_t len, struct weft_bs_id *v)
{
    const uint8_t *p = bytes;
    if (len != NCCL_UNIQUE_ID_BYTES)
        return "wrong length";
    memcpy(v, p, sizeof(*v));
    for (size_t i = sizeof(*v); i < len; i++)
        if (p[i] != 0)
            return "trailing bytes not zero";
    if (v->tag != WEFT_BS_ID_TAG)
        return "not a unique id of this layout";
    if ((v->flags & ~WEFT_BS_ID_ROOT_IN_RANK0) != 0 || v->pad != 0)
        return "unknown flags";
    if (v->magic == 0)
        return "zero magic";
    if (!weft_socket_addr_valid(&v->root))
        return "invalid root address";
    return NULL;
}

/* Version, type, magic and exact size of a handshake message of `want` bytes. */
static const char *weft_bs_hs_check(const void *bytes, size_t len, size_t want, uint32_t type,
                                    uint64_t magic, struct weft_bs_hdr *h)
{
    if (len != want)
        return "wrong length";
    memcpy(h, bytes, sizeof(*h));
    if (h->version != WEFT_BS_VERSION)
        return "not a bootstrap message of this version";
    if (h->type != type)
        return "unexpected message type";
    if (h->size != want - sizeof(*h))
        return "wrong payload size";
    if (h->magic != magic)
        return "it belongs to another communicator or job (stale id?)";
    return NULL;
}

const char *weft_bs_challenge_parse(const void *bytes, size_t len, uint64_t magic,
                                    struct weft_auth_nonces *nonces)
{
    struct weft_bs_challenge c;
    const char *why = weft_bs_hs_check(bytes, len, sizeof(c), WEFT_BS_CHALLENGE, magic, &c.hdr);
    if (why != NULL)
        return why;
    memcpy(&c, bytes, sizeof(c));
    memcpy(nonces->server, c.nonce, sizeof(c.nonce));
    return NULL;
}

const char *weft_bs_hello_parse(const void *bytes, size_t len, uint64_t magic, const uint8_t *key,
                                struct weft_auth_nonces *nonces, struct weft_bs_hello *msg_p)
{
    struct weft_bs_hello m;
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    const char *why = weft_bs_hs_check(bytes, len, sizeof(m), WEFT_BS_HELLO, magic, &m.hdr);
    if (why != NULL)
        return why;
    memcpy(&m, bytes, sizeof(m));
    weft_auth_mac(key, "bs-hello", nonces->server, m.nonce, &m, offsetof(struct weft_bs_hello, mac),
                  mac);
    if (!weft_auth_equal(mac, m.mac, sizeof(mac)))
        return "authentication failed (wrong secret)";
    memcpy(nonces->client, m.nonce, sizeof(m.nonce));
    *msg_p = m;
    return NULL;
}

const char *weft_bs_connect_parse(const void *bytes, size_t len, uint64_t magic, int nranks,
                                  const uint8_t *key, struct weft_auth_nonces *nonces, int *rank_p)
{
    struct weft_bs_connect m;
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    const char *why = weft_bs_hs_check(bytes, len, sizeof(m), WEFT_BS_CONNECT, magic, &m.hdr);
    if (why != NULL)
        return why;
    memcpy(&m, bytes, sizeof(m));
    if (m.hdr.rank < 0 || m.hdr.rank >= nranks)
        return "invalid rank";
    weft_auth_mac(key, "bs-connect", nonces->server, m.nonce, &m,
                  offsetof(struct weft_bs_connect, mac), mac);
    if (!weft_auth_equal(mac, m.mac, sizeof(mac)))
        return "authentication failed (wrong secret)";
    memcpy(nonces->client, m.nonce, sizeof(m.nonce));
    *rank_p = m.hdr.rank;
    return NULL;
}

const char *weft_bs_accept_parse(const void *bytes, size_t len, uint64_t magic, int rank,
                                 const uint8_t *key, const struct weft_auth_nonces *nonces)
{
    struct weft_bs_accept m;
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    const char *why = weft_bs_hs_check(bytes, len, sizeof(m), WEFT_BS_ACCEPT, magic, &m.hdr);
    if (why != NULL)
        return why;
    memcpy(&m, bytes, sizeof(m));
    if (m.hdr.rank != rank)
        return "it names another rank";
    weft_auth_mac(key, "bs-accept", nonces->server, nonces->client, &m.hdr, sizeof(m.hdr), mac);
    if (!weft_auth_equal(mac, m.mac, sizeof(mac)))
        return "the peer failed authentication (wrong secret)";
    return NULL;
}

const char *weft_bs_reply_hdr_parse(const void *bytes, size_t len, uint64_t magic, int rank,
                                    int nranks, struct weft_bs_hdr *hdr_p)
{
    struct weft_bs_hdr h;
    if (len != sizeof(h))
        return "wrong length";
    memcpy(&h, bytes, sizeof(h));
    if (h.version != WEFT_BS_VERSION || h.magic != magic || h.rank != rank)
        return "not a reply of this version for this rank and communicator";
    if (h.type == WEFT_BS_REPLY_ERR) {
        if (h.size == 0 || h.size > WEFT_BS_ERR_LEN)
            return "error text of a bad length";
    } else if (h.type == WEFT_BS_REPLY_OK) {
        if (nranks < 1 || nranks > WEFT_BS_MAX_RANKS ||
            h.size != (uint64_t)nranks * sizeof(union weft_sockaddr))
            return "address table of the wrong size";
    } else {
        return "unexpected message type";
    }
    *hdr_p = h;
    return NULL;
}

const char *weft_bs_data_hdr_parse(const void *bytes, size_t len, uint64_t magic, int peer,
                                   struct weft_bs_hdr *hdr_p)
{
    struct weft_bs_hdr h;
    if (len != sizeof(h))
        return "wrong length";
    memcpy(&h, bytes, sizeof(h));
    if (h.version != WEFT_BS_VERSION || h.magic != magic || h.rank != peer)
        return "not a message of this version from that peer";
    if (h.type != WEFT_BS_DATA_USER && h.type != WEFT_BS_DATA_COLL)
        return "unexpected message type";
    if (h.size > WEFT_BS_MAX_MSG)
        return "message too large";
    *hdr_p = h;
    return NULL;
}

void weft_bs_reply_mac(const uint8_t *key, const struct weft_auth_nonces *nonces,
                       const struct weft_bs_hdr *hdr, const void *payload,
                       uint8_t mac[WEFT_AUTH_MAC_BYTES])
{
    struct weft_hmac_part parts[5] = {{"bs-reply", sizeof("bs-reply")},
                                      {nonces->server, WEFT_AUTH_NONCE_BYTES},
                                      {nonces->client, WEFT_AUTH_NONCE_BYTES},
                                      {hdr, sizeof(*hdr)},
                                      {payload, (size_t)hdr->size}};
    weft_hmac_sha256(key, WEFT_AUTH_KEY_BYTES, parts, 5, mac);
}
