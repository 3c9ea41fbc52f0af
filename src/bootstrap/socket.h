/*
 * Small TCP helpers for the bootstrap (and any other code that needs a plain socket): interface
 * selection, listen, connect with retry until a deadline, non-blocking and deadline-bounded
 * send/recv, and a poll wrapper that checks an abort flag.
 *
 * Conventions shared by every function here:
 *   - Sockets are created non-blocking and close-on-exec; connected sockets have TCP_NODELAY,
 *     keepalive and TCP_USER_TIMEOUT (WEFT_SOCKET_KEEPALIVE: a silently dead host fails them).
 *     Sends use MSG_NOSIGNAL, so a closed peer is an error return, never SIGPIPE.
 *   - A deadline is an absolute CLOCK_MONOTONIC time in nanoseconds (weft_socket_deadline());
 *     0 means no deadline. Waits poll() in slices of at most 100 ms and check *abort_flag
 *     (which may be NULL) between slices; nothing spins.
 *   - `what` names the operation for error messages ("recv from rank 3"); errors are logged
 *     here with WEFT_WARN, so callers pass them on with WEFT_CHECK only.
 *   - Return codes: ncclRemoteError when the peer closed or reset the connection,
 *     ncclSystemError on timeouts, abort (logged as INFO, not WARN) and system call failures,
 *     ncclInvalidArgument on unparsable addresses or no usable interface.
 * All functions are thread-safe (they keep no state besides the cached interface choice).
 */
#ifndef WEFT_BOOTSTRAP_SOCKET_H
#define WEFT_BOOTSTRAP_SOCKET_H

#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

/* An IPv4 or IPv6 socket address; 28 bytes, plain data, may be copied and sent as is. */
union weft_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
};

/* Longest text weft_socket_addr_str() writes: "[v6addr%scope]:port". */
#define WEFT_SOCKADDR_STRLEN (INET6_ADDRSTRLEN + 16)
#define WEFT_IFNAME_LEN 64

/* Current CLOCK_MONOTONIC time in ns; deadline `seconds` from now (0 when seconds <= 0). */
uint64_t weft_socket_now_ns(void);
uint64_t weft_socket_deadline(int64_t seconds);

/* Length to pass to bind/connect for addr's family (0 for an unknown family). */
socklen_t weft_socket_addr_len(const union weft_sockaddr *addr);
/* 1 when addr is AF_INET or AF_INET6 with a non-zero port. */
int weft_socket_addr_valid(const union weft_sockaddr *addr);
/* Writes "a.b.c.d:port" or "[v6]:port" into buf (WEFT_SOCKADDR_STRLEN bytes); returns buf. */
const char *weft_socket_addr_str(const union weft_sockaddr *addr, char *buf, size_t len);
/*
 * Parses "host:port" or "[v6addr]:port" (host may be a name, resolved with getaddrinfo).
 * Blocks on name resolution. ncclInvalidArgument on a malformed string or unknown host.
 */
ncclResult_t weft_socket_addr_parse(const char *str, union weft_sockaddr *addr_p);

/*
 * Picks the interface used for out-of-band traffic, following NCCL_SOCKET_IFNAME (comma list of
 * name prefixes; a leading ^ excludes the listed ones; a leading = (after any ^) matches names
 * exactly) and NCCL_SOCKET_FAMILY (AF_INET or AF_INET6). Default: the first interface that is up,
 * not loopback and not docker*, else loopback. IPv4 addresses are preferred to IPv6 ones on the
 * chosen interface order; IPv6 link-local addresses are skipped. The choice is made once per
 * process and cached. Writes the name and the address (port 0) on success.
 */
ncclResult_t weft_socket_find_interface(char *ifname, size_t ifname_len,
                                        union weft_sockaddr *addr_p);

/*
 * Opens a socket listening on *addr (port 0 picks one; SO_REUSEADDR, backlog SOMAXCONN) and
 * writes the bound address back into *addr. Does not block.
 */
ncclResult_t weft_socket_listen(union weft_sockaddr *addr, int *fd_p);

/*
 * Connects to addr. Refused, reset, unreachable or timed-out attempts are retried with backoff
 * (10 ms doubling to 200 ms) until `deadline` or WEFT_SOCKET_CONNECT_TIMEOUT seconds from now,
 * whichever comes first: a peer that does not listen within that window is an error
 * (ncclSystemError). Blocks (polling abort_flag). The socket is connected on success.
 */
ncclResult_t weft_socket_connect(const union weft_sockaddr *addr, uint64_t deadline,
                                 volatile uint32_t *abort_flag, const char *what, int *fd_p);

/*
 * Accepts one connection on a non-blocking listening socket. Does not block: *fd_p is -1 when
 * none is pending ("not ready"). The accepted socket is non-blocking, CLOEXEC, TCP_NODELAY.
 */
ncclResult_t weft_socket_accept(int listen_fd, int *fd_p);

/*
 * What weft_socket_accept_pending() asks of a listener that holds connections pending their
 * handshake (accepted, not authenticated yet).
 */
enum weft_accept_act {
    WEFT_ACCEPT_NONE,  /* nothing is waiting */
    WEFT_ACCEPT_NEW,   /* *fd_p is a new connection: add it */
    WEFT_ACCEPT_EVICT, /* close the oldest pending connection; then add *fd_p if it is >= 0, else
                        * call again (accept ran out of descriptors) */
    WEFT_ACCEPT_LATER, /* out of descriptors with nothing pending to close: leave the listener
                        * alone for a while (WEFT_ACCEPT_LATER_MS); its connections stay queued */
};
#define WEFT_ACCEPT_LATER_MS 20

/*
 * Accepts one connection for a listener that holds npending unauthenticated ones, within limits
 * that keep strangers from taking the process's descriptors: at most WEFT_HANDSHAKE_MAX pending
 * per listener once the oldest (accepted at oldest_ns, weft_socket_now_ns()) has waited longer
 * than a real peer's handshake takes (0.5 s), never more than an eighth of RLIMIT_NOFILE (or the
 * cap, if larger), at most a few once fewer than WEFT_FD_RESERVE descriptors are left under
 * RLIMIT_NOFILE, and EMFILE/ENFILE survived by dropping the oldest (*act_p). A stranger holding
 * connections can then delay no rank's handshake (the oldest go first) nor fail the job's own
 * sockets. The first time a limit is hit in the process: one WARN naming it and `ulimit -n`.
 * expect: how many real peers may be pending at once (the cap is never below it; 0: unknown).
 * Does not block. Fails (ncclSystemError) only on a broken listener. who names the listener.
 */
ncclResult_t weft_socket_accept_pending(int listen_fd, int npending, uint64_t oldest_ns, int expect,
                                        const char *who, int *fd_p, enum weft_accept_act *act_p);

/*
 * Non-blocking transfers: move what the kernel accepts now, advancing *done towards len.
 * recv reports a peer that closed before len bytes as ncclRemoteError. what NULL: errors are
 * returned but not logged (handshakes of connections not admitted yet: strays are no error).
 */
ncclResult_t weft_socket_send_some(int fd, const void *buf, size_t len, size_t *done,
                                   const char *what);
ncclResult_t weft_socket_recv_some(int fd, void *buf, size_t len, size_t *done, const char *what);

/* Blocking transfers of exactly len bytes, bounded by deadline and abort_flag. */
ncclResult_t weft_socket_send_all(int fd, const void *buf, size_t len, uint64_t deadline,
                                  volatile uint32_t *abort_flag, const char *what);
ncclResult_t weft_socket_recv_all(int fd, void *buf, size_t len, uint64_t deadline,
                                  volatile uint32_t *abort_flag, const char *what);

/*
 * poll() until at least one of fds has revents, the deadline passes (ncclSystemError, "timed out
 * waiting for <what>") or *abort_flag becomes non-zero (ncclSystemError). Retries EINTR.
 */
ncclResult_t weft_socket_poll(struct pollfd *fds, nfds_t nfds, uint64_t deadline,
                              volatile uint32_t *abort_flag, const char *what);

/* Sleeps ms milliseconds, ending early at deadline; fails (ncclSystemError) only on abort. */
ncclResult_t weft_socket_sleep(int ms, uint64_t deadline, volatile uint32_t *abort_flag,
                               const char *what);

/* Closes fd if >= 0 and sets it to -1. */
void weft_socket_close(int *fd);

#endif
