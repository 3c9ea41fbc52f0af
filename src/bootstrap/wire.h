/*
 * Bootstrap internals shared by the rank side (bootstrap.c) and the root thread (root.c): the
 * unique id layout, the wire format and its parsers (wire.c: pure functions of the bytes read,
 * fuzzed by tests/fuzz). Not for use outside src/bootstrap and its tests.
 *
 * Unique id (first 80 of the 128 bytes; the rest must be zero), layout version 2:
 *     u32 tag      WEFT_BS_ID_TAG ("WFT" + id layout version 2)
 *     u32 flags    WEFT_BS_ID_ROOT_IN_RANK0 when made from NCCL_COMM_ID
 *     u64 magic    random (getrandom), or a hash of NCCL_COMM_ID; never 0; names the communicator
 *     28 bytes     the root's sockaddr_in or sockaddr_in6 (network byte order), zero padded
 *     u32 0
 *     32 bytes     the secret: random (getrandom); from NCCL_COMM_ID, HMAC(WEFT_SECRET, the
 *                  address) or all zero without WEFT_SECRET (then nothing is authenticated)
 * The secret never travels: every connection proves it knows it (core/auth.h).
 *
 * Wire format, protocol version 2 (version 1 had no challenge and no MACs; the two refuse each
 * other at the first header). Integers are in host byte order (every rank runs on one
 * architecture, as with NCCL). Messages start with a 32-byte header:
 *     u32 version  WEFT_BS_VERSION ("WBS" + protocol version 2)
 *     u32 type     CHALLENGE, HELLO, REPLY_OK, REPLY_ERR, CONNECT, ACCEPT, DATA_USER or DATA_COLL
 *     u64 magic    the id's magic: anything else is rejected, so two jobs never mix
 *     i32 rank     the sender's rank (REPLY_*: the recipient's; CHALLENGE: -1)
 *     i32 tag      DATA_USER: the user's tag; DATA_COLL: collective sequence number;
 *                  REPLY_ERR: the ncclResult_t the rank should return; else 0
 *     u64 size     payload bytes that follow, checked against what the type allows
 * Every connection starts with a handshake; the accepting side (the root, or the rank that
 * accepts a bootstrap link) speaks first:
 *     CHALLENGE  acceptor -> connector: payload a 16-byte nonce Ns
 *     HELLO      rank -> root, payload {i32 nranks; u32 0; 28-byte listen sockaddr; nonce Nc;
 *                mac = HMAC(secret, "bs-hello", Ns, Nc, the header and payload before mac)}
 *     REPLY_OK   root -> rank once all ranks arrived: nranks listen sockaddrs, indexed by rank,
 *                then 32 bytes HMAC(secret, "bs-reply", Ns, Nc, header and table) (not in size)
 *     REPLY_ERR  root -> rank: NUL-terminated reason (at most WEFT_BS_ERR_LEN bytes), then its
 *                MAC as for REPLY_OK
 *     CONNECT    first message of a rank -> rank link: names the sending rank; payload {nonce Nc;
 *                mac = HMAC(secret, "bs-connect", Ns, Nc, header and Nc)}
 *     ACCEPT     acceptor -> connector once CONNECT checked: payload HMAC(secret, "bs-accept",
 *                Ns, Nc, header); the link carries data one way (connector to acceptor) from then
 * A connection whose handshake fails, that says nothing for WEFT_BS_ADMIT_MS, or that sends
 * anything else first is closed and changes nothing. After the handshake:
 *     DATA_*     payload only (at most WEFT_BS_MAX_MSG bytes).
 */
#ifndef WEFT_BOOTSTRAP_WIRE_H
#define WEFT_BOOTSTRAP_WIRE_H

#include <stdint.h>
#include <string.h>

#include "bootstrap/socket.h"
#include "core/auth.h"
#include "nccl.h"

#define WEFT_BS_ID_TAG 0x02544657u /* "WFT\2" in little-endian memory */
#define WEFT_BS_ID_ROOT_IN_RANK0 0x1u
#define WEFT_BS_VERSION 0x02534257u /* "WBS\2" */
#define WEFT_BS_MAX_RANKS (1 << 20)
#define WEFT_BS_MAX_MSG (1ull << 30)
#define WEFT_BS_ERR_LEN 256
#define WEFT_BS_ADMIT_MS 5000         /* a connection must finish its handshake within this */
#define WEFT_BS_MAX_UNEXPECTED 65536  /* early messages kept per rank, in count ... */
#define WEFT_BS_MAX_UNEXPECTED_BYTES (1ull << 31) /* ... and in bytes */

enum weft_bs_type {
    WEFT_BS_HELLO = 1,
    WEFT_BS_REPLY_OK,
    WEFT_BS_REPLY_ERR,
    WEFT_BS_CONNECT,
    WEFT_BS_DATA_USER,
    WEFT_BS_DATA_COLL,
    WEFT_BS_CHALLENGE,
    WEFT_BS_ACCEPT,
};

struct weft_bs_id {
    uint32_t tag;
    uint32_t flags;
    uint64_t magic;
    union weft_sockaddr root;
    uint32_t pad;
    uint8_t secret[WEFT_AUTH_KEY_BYTES];
};
_Static_assert(sizeof(struct weft_bs_id) <= NCCL_UNIQUE_ID_BYTES, "unique id layout too big");

struct weft_bs_hdr {
    uint32_t version;
    uint32_t type;
    uint64_t magic;
    int32_t rank;
    int32_t tag;
    uint64_t size;
};

struct weft_bs_hello {
    struct weft_bs_hdr hdr;
    int32_t nranks;
    uint32_t pad;
    union weft_sockaddr addr;
    uint8_t nonce[WEFT_AUTH_NONCE_BYTES];
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
};

struct weft_bs_challenge {
    struct weft_bs_hdr hdr;
    uint8_t nonce[WEFT_AUTH_NONCE_BYTES];
};

struct weft_bs_connect {
    struct weft_bs_hdr hdr;
    uint8_t nonce[WEFT_AUTH_NONCE_BYTES];
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
};

struct weft_bs_accept {
    struct weft_bs_hdr hdr;
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
};


static inline void weft_bs_hdr_fill(struct weft_bs_hdr *hdr, uint32_t type, uint64_t magic,
                                    int rank, int tag, uint64_t size)
{
    memset(hdr, 0, sizeof(*hdr));
    hdr->version = WEFT_BS_VERSION;
    hdr->type = type;
    hdr->magic = magic;
    hdr->rank = rank;
    hdr->tag = tag;
    hdr->size = size;
}

/* ---- parsers (wire.c): pure functions of the bytes received; NULL on success, else why ---- */

/* The 128 id bytes (len must be NCCL_UNIQUE_ID_BYTES) into *v. */
const char *weft_bs_id_parse(const void *bytes, size_t len, struct weft_bs_id *v);
/* A CHALLENGE for this magic: the server's nonce into nonces->server. */
const char *weft_bs_challenge_parse(const void *bytes, size_t len, uint64_t magic,
                                    struct weft_auth_nonces *nonces);
/* A HELLO at the root: checks version, type, size, magic and the MAC (with nonces->server);
 * writes the message and nonces->client. Ranks and nranks are left to the root. */
const char *weft_bs_hello_parse(const void *bytes, size_t len, uint64_t magic, const uint8_t *key,
                                struct weft_auth_nonces *nonces, struct weft_bs_hello *msg_p);
/* A CONNECT at a rank of nranks: the connecting rank into *rank_p, nonces->client filled. */
const char *weft_bs_connect_parse(const void *bytes, size_t len, uint64_t magic, int nranks,
                                  const uint8_t *key, struct weft_auth_nonces *nonces, int *rank_p);
/* An ACCEPT for the CONNECT `rank` sent with these nonces. */
const char *weft_bs_accept_parse(const void *bytes, size_t len, uint64_t magic, int rank,
                                 const uint8_t *key, const struct weft_auth_nonces *nonces);
/* The header of a root reply to `rank` of nranks (its payload size is then hdr->size). */
const char *weft_bs_reply_hdr_parse(const void *bytes, size_t len, uint64_t magic, int rank,
                                    int nranks, struct weft_bs_hdr *hdr_p);
/* The header of a data message from peer on an admitted link. */
const char *weft_bs_data_hdr_parse(const void *bytes, size_t len, uint64_t magic, int peer,
                                   struct weft_bs_hdr *hdr_p);
/* The MAC of a root reply (header then payload). */
void weft_bs_reply_mac(const uint8_t *key, const struct weft_auth_nonces *nonces,
                       const struct weft_bs_hdr *hdr, const void *payload,
                       uint8_t mac[WEFT_AUTH_MAC_BYTES]);

/*
 * Listens on *addr (port 0: one is picked and written back) and starts a detached root thread
 * serving one communicator whose ranks hold `magic` and prove they know `key`, for at most
 * timeout_s seconds (<= 0: no limit). Does not block. Defined in root.c.
 */
ncclResult_t weft_bs_root_start(union weft_sockaddr *addr, uint64_t magic,
                                const uint8_t key[WEFT_AUTH_KEY_BYTES], int64_t timeout_s);

#endif
