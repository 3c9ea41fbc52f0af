/*
 * The launch store: a one-shot rendezvous that hands rank 0's ncclUniqueId to every other rank of a
 * job started by a launcher that gives ranks but no id (mpirun, mpiexec, srun, torchrun). Used by
 * weftLaunchInfo (src/core/launch.c); no MPI or PMI library is involved.
 *
 * Rank 0 listens at the store address, every other rank connects (retrying until the deadline) and
 * sends a HELLO; rank 0 answers each with the id (ID) or refuses it (REJECT) and returns once every
 * rank 1..n-1 has had the id. The listener lives only for that call.
 *
 * Wire format (all integers big-endian), version WEFT_STORE_VERSION 2 (version 1 had no
 * challenge, no MACs and the id in clear; the two refuse each other at the first header):
 *
 *   header     u32 magic 'WFST' | u16 version | u16 type | u32 payload length
 *   CHALLENGE  rank 0 -> client at accept: 16-byte nonce Ns
 *   HELLO      u32 rank | u32 nranks | u32 seq | u32 key length | key bytes (<= WEFT_STORE_KEY_MAX)
 *              | nonce Nc | HMAC(K, "store-hello", Ns, Nc, header and payload before the MAC)
 *   ID         the 128 id bytes XOR HMAC(K, "store-id-stream", Ns, Nc, block number) blocks
 *              | HMAC(K, "store-id", Ns, Nc, header and encrypted id)
 *   REJECT     u32 reason | u32 nranks | u32 seq | u32 key length | key bytes (the server's own)
 *              | HMAC(K, "store-reject", Ns, Nc, header and payload before the MAC)
 *
 * K is HMAC(WEFT_SECRET, "weft-store") (core/auth.h), all zero without WEFT_SECRET: then any
 * process that reaches the store gets the id, as any process that reaches NCCL's port may join.
 * With it, a client without the secret is dropped unanswered and learns nothing (the id travels
 * encrypted), a process holding the address first cannot serve a forged id (clients check its MAC
 * and keep retrying), and only authenticated hellos count as ranks. Rank 0 serves its clients
 * concurrently (poll); each has 5 s for its whole handshake; strays change nothing.
 *
 * Every length is checked against its type before anything is read into a buffer. The key names
 * the job (launcher and job identifier), so a rank of one job that reaches another job's store on
 * a shared port is refused and keeps retrying; seq counts the exchanges made by this process, so a
 * process that calls weftLaunchInfo twice never takes an id from the previous round.
 */
#ifndef WEFT_CORE_STORE_H
#define WEFT_CORE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

#define WEFT_STORE_MAGIC 0x57465354u /* "WFST" */
#define WEFT_STORE_VERSION 2
#define WEFT_STORE_KEY_MAX 256
#define WEFT_STORE_DESC_LEN 192
#define WEFT_STORE_HDR_BYTES 12
#define WEFT_STORE_HELLO_MAX (16 + WEFT_STORE_KEY_MAX + 16 + 32) /* payload bytes */

enum weft_store_type {
    WEFT_STORE_HELLO = 1,
    WEFT_STORE_ID = 2,
    WEFT_STORE_REJECT = 3,
    WEFT_STORE_CHALLENGE = 4,
};

/* A parsed message (fields as the type has them). */
struct weft_store_msg {
    uint16_t type;
    uint32_t first; /* HELLO: rank; REJECT: reason */
    uint32_t nranks;
    uint32_t seq;
    char key[WEFT_STORE_KEY_MAX + 1];
    uint8_t nonce[16];               /* CHALLENGE, HELLO */
    uint8_t id[NCCL_UNIQUE_ID_BYTES]; /* ID, still encrypted */
    uint8_t mac[32];
    size_t signed_len; /* bytes of the message the MAC covers (all but the MAC) */
};

/* Pure parsers (no I/O; fuzzed): the 12-byte header (type and payload length checked against
 * each other), and a whole message of len bytes. NULL on success, else why not. */
const char *weft_store_hdr_parse(const unsigned char *hdr, size_t len, uint16_t *type_p,
                                 uint32_t *len_p);
const char *weft_store_msg_parse(const unsigned char *msg, size_t len, struct weft_store_msg *m);

/* Where the store is: a TCP address or an abstract Unix socket, plus text for messages. */
struct weft_store_addr {
    struct sockaddr_storage ss;
    socklen_t len;
    char desc[WEFT_STORE_DESC_LEN];
};

/*
 * Parses "host:port" / "[v6]:port" (host resolved with getaddrinfo; blocks on DNS). `what` names
 * the source in messages ("WEFT_STORE_ADDR"). ncclInvalidArgument on a malformed address.
 */
ncclResult_t weft_store_addr_tcp(const char *what, const char *hostport,
                                 struct weft_store_addr *addr_p);

/*
 * An abstract-namespace Unix socket named after key (hashed; any length). Reachable only from the
 * same host and network namespace. Cannot fail for a non-empty key (ncclInvalidArgument if empty).
 */
ncclResult_t weft_store_addr_local(const char *key, struct weft_store_addr *addr_p);

/*
 * The exchange. Rank 0 (rank == 0) makes nothing itself: it serves *id, which the caller made, and
 * blocks until ranks 1..nranks-1 have all received it. Other ranks block until they received the
 * id from rank 0 into *id_p (written only on success). key is the job key (non-empty, at most
 * WEFT_STORE_KEY_MAX bytes), seq the caller's exchange counter; both must match on every rank.
 * deadline is absolute CLOCK_MONOTONIC ns (weft_socket_deadline), 0 for none. Called from any
 * thread; keeps no state.
 *
 * Returns ncclSystemError when the deadline passes (the message names the ranks still missing, or
 * the last refusal seen), the address cannot be bound or a system call fails; ncclInvalidArgument
 * for a bad key or rank.
 */
ncclResult_t weft_store_exchange(const struct weft_store_addr *addr, const char *key, uint32_t seq,
                                 int rank, int nranks, uint64_t deadline, ncclUniqueId *id_p);

#endif
