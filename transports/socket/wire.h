/*
 * The socket transport's wire format (transports/socket/socket.c has the protocol). Shared with
 * tests that play a peer speaking it. Integers travel in host byte order: every rank of a job
 * runs on one architecture, as with NCCL.
 *
 * Setup (collective, through the bootstrap): every rank all-gathers a struct weft_sock_info.
 * A rank then connects nthreads * nsocks times to every higher-ranked socket peer's address. On
 * each connection (since wire version 3; version 2 had no handshake):
 *   acceptor -> connector  struct weft_sock_challenge: a 16-byte nonce Ns
 *   connector -> acceptor  struct weft_sock_hello_auth: the hello, a nonce Nc and
 *                          HMAC(secret, "sock-hello", Ns, Nc, hello), secret = the unique id's
 *   acceptor -> connector  struct weft_sock_accept: HMAC(secret, "sock-accept", Ns, Nc, hello)
 * The acceptor polls its listener and every unfinished handshake at once: a connection that
 * closes, sends garbage or a wrong MAC, or says nothing for WEFT_SOCK_ADMIT_MS is dropped and
 * changes nothing. An authenticated hello is then checked field by field (comm hash, both ranks,
 * connection number, thread and socket counts, channels, slot size); any difference fails init.
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
 *
 * Device connections (socket/dev_socket.c, the CUDA executor's FIFOs across hosts) use the same
 * handshake and frames on a listener of their own, one connection per pair of ranks: the hello
 * says nthreads = nsocks = 1, nchannels = the executor's connection channels, ll_fifos = 2
 * (never a host connection's value) and the device slot size; DATA carries a slice of the
 * kernel's FIFO (bytes at most the slot size, sig the slot's signature word), CREDIT the steps
 * the receiving kernel freed, and every channel's steps travel in order.
 */
#ifndef WEFT_TRANSPORTS_SOCKET_WIRE_H
#define WEFT_TRANSPORTS_SOCKET_WIRE_H

#include <stdint.h>

#include "bootstrap/socket.h"
#include "core/auth.h"

/* "WSK" + wire version: 2 LL FIFO channels; 3 handshake with MACs (the unique id's secret);
 * 4 DATA frames carry the signature word (32-byte frames) */
#define WEFT_SOCK_VERSION 0x044b5357u
#define WEFT_SOCK_INFO_VERSION 1u

enum weft_sock_type {
    WEFT_SOCK_HELLO = 1,
    WEFT_SOCK_DATA,
    WEFT_SOCK_CREDIT,
    WEFT_SOCK_BYE,
    WEFT_SOCK_CHALLENGE,
    WEFT_SOCK_ACCEPT,
};

#define WEFT_SOCK_ADMIT_MS 5000

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

struct weft_sock_challenge {
    uint32_t version; /* WEFT_SOCK_VERSION */
    uint32_t type;    /* WEFT_SOCK_CHALLENGE */
    uint64_t comm_hash;
    uint8_t nonce[WEFT_AUTH_NONCE_BYTES];
};

struct weft_sock_hello_auth {
    struct weft_sock_hello hello;
    uint8_t nonce[WEFT_AUTH_NONCE_BYTES];
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
};

struct weft_sock_accept {
    uint32_t version; /* WEFT_SOCK_VERSION */
    uint32_t type;    /* WEFT_SOCK_ACCEPT */
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
};

/*
 * Pure parsers (socket/wire.c; no I/O, fuzzed by tests/fuzz). NULL on success, else why not.
 * challenge: the acceptor's nonce into nonces->server. hello_auth: version, type and MAC checked
 * (nonces->server known), the hello and nonces->client written; its fields are the caller's to
 * compare. accept: the MAC over the hello we sent. frame: the checks that need no connection
 * state (version, check word, type, channel range and owner thread, credits carry no bytes);
 * writes why (a message) and returns it, or NULL.
 */
const char *weft_sock_challenge_parse(const void *bytes, size_t len, uint64_t comm_hash,
                                      struct weft_auth_nonces *nonces);
const char *weft_sock_hello_parse(const void *bytes, size_t len, const uint8_t *key,
                                  struct weft_auth_nonces *nonces, struct weft_sock_hello *h_p);
const char *weft_sock_accept_parse(const void *bytes, size_t len, const uint8_t *key,
                                   const struct weft_auth_nonces *nonces,
                                   const struct weft_sock_hello *h);
const char *weft_sock_frame_parse(const void *bytes, size_t len, int nfifo, int nthreads,
                                  int thread, struct weft_sock_frame *f_p, char *why,
                                  size_t why_len);

/*
 * The connecting side of the handshake on a connected socket: reads the challenge, sends h with
 * its MAC, checks the acceptor's. Blocks until deadline (abort_flag may be NULL). Errors are
 * logged, naming `what`.
 */
ncclResult_t weft_sock_handshake(int fd, const uint8_t *key, const struct weft_sock_hello *h,
                                 uint64_t deadline, volatile uint32_t *abort_flag,
                                 const char *what);

/*
 * The accepting side's check of an authenticated hello: sets *fd_pp to the slot (holding -1) where
 * the connection's fd goes, or to NULL to drop the connection silently (it changes nothing);
 * returns an error (logged) for a hello that must fail setup (ranks disagree on a setting).
 */
typedef ncclResult_t (*weft_sock_admit_fn_t)(void *arg, const struct weft_sock_hello *h,
                                            int **fd_pp);

/*
 * The accepting side of the handshake: accepts connections on listen_fd until `expected` are
 * admitted, serving every pending handshake at once, so a stray, silent (WEFT_SOCK_ADMIT_MS),
 * garbage or unauthenticated connection holds up none of the others. A hello whose MAC checks out
 * goes to admit(); its connection gets the ACCEPT and lands in the slot admit() chose. Blocks
 * until deadline or *abort_flag; what names the wait for errors.
 */
ncclResult_t weft_sock_accept_all(int listen_fd, const uint8_t *key, uint64_t comm_hash,
                                  int expected, weft_sock_admit_fn_t admit, void *arg,
                                  uint64_t deadline, volatile uint32_t *abort_flag,
                                  const char *what);

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
