/*
 * The socket transport's wire format (transports/socket/socket.c has the protocol). Shared with
 * tests that play a peer speaking it. Integers travel in host byte order: every rank of a job
 * runs on one architecture, as with NCCL.
 *
 * Setup (collective, through the bootstrap): every rank all-gathers a struct weft_sock_info.
 * A rank then connects nthreads * nsocks times to every higher-ranked socket peer's address and
 * sends struct weft_sock_hello first on each connection; the acceptor checks every field (comm
 * hash, both ranks, connection number, thread and socket counts, channels, slot size) and refuses
 * the connection, failing init, on any difference.
 *
 * Then frames flow both ways, each a struct weft_sock_frame header. `channel` is a FIFO channel:
 * below nchannels a channel's slot FIFO, from nchannels (when the hellos say ll_fifos) its LL FIFO.
 *   DATA    step = the step, bytes = payload bytes that follow (at most the slot's payload),
 *           sig = the slot header's signature word (exec/sig.h), copied into the receiver's slot;
 *           step s of channel c travels on connection (s + c) % nsocks of the channel's thread
 *           (c % nthreads), so each connection carries a channel's steps in order, nsocks apart
 *   CREDIT  step = steps the receiver has freed on that channel (it only grows, by at most
 *           the FIFO's slots at a time), bytes = 0; on connection c % nsocks of the channel's thread
 *   BYE     the sender is closing the communicator; nothing follows but EOF
 * `check` is weft_sock_check() of the other fields, so a stream that lost its framing is caught
 * at the next header.
 */
#ifndef WEFT_TRANSPORTS_SOCKET_H
#define WEFT_TRANSPORTS_SOCKET_H

#include <stdint.h>

#include "bootstrap/socket.h"

/* "WSK" + wire version: 2 LL FIFO channels; 3 DATA frames carry the signature word (32-byte
 * frames) */
#define WEFT_SOCK_VERSION 0x034b5357u
#define WEFT_SOCK_INFO_VERSION 1u

enum weft_sock_type {
    WEFT_SOCK_HELLO = 1,
    WEFT_SOCK_DATA,
    WEFT_SOCK_CREDIT,
    WEFT_SOCK_BYE,
};

struct weft_sock_frame {
    uint32_t version; /* WEFT_SOCK_VERSION */
    uint16_t type;    /* enum weft_sock_type */
    uint16_t channel;
    uint64_t step;
    uint32_t bytes;
    uint32_t sig; /* DATA: the slot header's signature word; else 0 */
    uint32_t check;
    uint32_t pad; /* 0 */
};
_Static_assert(sizeof(struct weft_sock_frame) == 32, "frame header layout");

static inline uint32_t weft_sock_check(const struct weft_sock_frame *f)
{
    uint32_t x = f->version ^ ((uint32_t)f->type << 16) ^ f->channel ^ (uint32_t)f->step ^
                 (uint32_t)(f->step >> 32) ^ f->bytes ^ (f->sig * 0x85ebca6bu);
    return x * 0x9e3779b1u ^ 0x5eb1c0deu;
}

/* First bytes on every connection, from the connecting (lower) rank. */
struct weft_sock_hello {
    uint32_t version; /* WEFT_SOCK_VERSION */
    uint32_t type;    /* WEFT_SOCK_HELLO */
    uint64_t comm_hash;
    int32_t rank; /* the connecting rank */
    int32_t peer; /* the rank it meant to reach */
    uint32_t thread;
    uint32_t sock;
    uint32_t nthreads;
    uint32_t nsocks;
    uint32_t nchannels; /* comm->nchannels + 1 (point-to-point) */
    uint32_t ll_fifos;  /* 1: FIFO channels nchannels .. 2 nchannels - 1 are the LL FIFOs */
    uint64_t slot_bytes;
};

/* What every rank all-gathers at setup (listening 0: the rank has no socket peer). */
struct weft_sock_info {
    uint32_t version; /* WEFT_SOCK_INFO_VERSION */
    uint32_t listening;
    uint32_t nthreads;
    uint32_t nsocks;
    uint64_t slot_bytes;
    union weft_sockaddr addr;
};

#endif
