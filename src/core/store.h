/*
 * The launch store: a one-shot rendezvous that hands rank 0's ncclUniqueId to every other rank of a
 * job started by a launcher that gives ranks but no id (mpirun, mpiexec, srun, torchrun). Used by
 * weftLaunchInfo (src/core/launch.c); no MPI or PMI library is involved.
 *
 * Rank 0 listens at the store address, every other rank connects (retrying until the deadline) and
 * sends a HELLO; rank 0 answers each with the id (ID) or refuses it (REJECT) and returns once every
 * rank 1..n-1 has had the id. The listener lives only for that call.
 *
 * Wire format (all integers big-endian), version WEFT_STORE_VERSION:
 *
 *   header   u32 magic 'WFST' | u16 version | u16 type | u32 payload length
 *   HELLO    u32 rank | u32 nranks | u32 seq | u32 key length | key bytes (<= WEFT_STORE_KEY_MAX)
 *   ID       NCCL_UNIQUE_ID_BYTES bytes of ncclUniqueId
 *   REJECT   u32 reason | u32 nranks | u32 seq | u32 key length | key bytes (the server's own)
 *
 * Every length is checked against its type before anything is read into a buffer. The key names
 * the job (launcher and job identifier), so a rank of one job that reaches another job's store on
 * a shared port is refused and keeps retrying; seq counts the exchanges made by this process, so a
 * process that calls weftLaunchInfo twice never takes an id from the previous round.
 */
#ifndef WEFT_CORE_STORE_H
#define WEFT_CORE_STORE_H

#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

#define WEFT_STORE_MAGIC 0x57465354u /* "WFST" */
#define WEFT_STORE_VERSION 1
#define WEFT_STORE_KEY_MAX 256
#define WEFT_STORE_DESC_LEN 192

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
