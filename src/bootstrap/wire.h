/*
 * Bootstrap internals shared by the rank side (bootstrap.c) and the root thread (root.c): the
 * unique id layout and the wire format. Not for use outside src/bootstrap.
 *
 * Unique id (first 48 of the 128 bytes; the rest must be zero):
 *     u32 tag    WEFT_BS_ID_TAG ("WFT" + id layout version 1)
 *     u32 flags  WEFT_BS_ID_ROOT_IN_RANK0 when made from NCCL_COMM_ID
 *     u64 magic  random (getrandom), or a hash of NCCL_COMM_ID; never 0
 *     28 bytes   the root's sockaddr_in or sockaddr_in6 (network byte order), zero padded
 *
 * Wire format. Integers are in host byte order (every rank runs on one architecture, as with
 * NCCL). Each message starts with a 32-byte header:
 *     u32 version  WEFT_BS_VERSION ("WBS" + protocol version 1)
 *     u32 type     HELLO, REPLY_OK, REPLY_ERR, CONNECT, DATA_USER or DATA_COLL
 *     u64 magic    the id's magic: anything else is rejected, so two jobs never mix
 *     i32 rank     the sender's rank (REPLY_*: the recipient's)
 *     i32 tag      DATA_USER: the user's tag; DATA_COLL: collective sequence number;
 *                  REPLY_ERR: the ncclResult_t the rank should return; else 0
 *     u64 size     payload bytes that follow, checked against what the type allows
 * HELLO    rank -> root, payload {i32 nranks; u32 0; 28-byte listen sockaddr}.
 * REPLY_OK root -> rank once all ranks arrived: nranks listen sockaddrs, indexed by rank.
 * REPLY_ERR root -> rank: NUL-terminated reason, at most WEFT_BS_ERR_LEN bytes.
 * CONNECT  first message on a rank -> rank connection, no payload: names the sending rank.
 * DATA_*   payload only (at most WEFT_BS_MAX_MSG bytes).
 */
#ifndef WEFT_BOOTSTRAP_WIRE_H
#define WEFT_BOOTSTRAP_WIRE_H

#include <stdint.h>
#include <string.h>

#include "bootstrap/socket.h"
#include "nccl.h"

#define WEFT_BS_ID_TAG 0x01544657u /* "WFT\1" in little-endian memory */
#define WEFT_BS_ID_ROOT_IN_RANK0 0x1u
#define WEFT_BS_VERSION 0x01534257u /* "WBS\1" */
#define WEFT_BS_MAX_RANKS (1 << 20)
#define WEFT_BS_MAX_MSG (1ull << 30)
#define WEFT_BS_ERR_LEN 256

enum weft_bs_type {
    WEFT_BS_HELLO = 1,
    WEFT_BS_REPLY_OK,
    WEFT_BS_REPLY_ERR,
    WEFT_BS_CONNECT,
    WEFT_BS_DATA_USER,
    WEFT_BS_DATA_COLL,
};

struct weft_bs_id {
    uint32_t tag;
    uint32_t flags;
    uint64_t magic;
    union weft_sockaddr root;
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

/*
 * Listens on *addr (port 0: one is picked and written back) and starts a detached root thread
 * serving one communicator whose ranks hold `magic`, for at most timeout_s seconds (<= 0: no
 * limit). Does not block. Defined in root.c.
 */
ncclResult_t weft_bs_root_start(union weft_sockaddr *addr, uint64_t magic, int64_t timeout_s);

#endif
