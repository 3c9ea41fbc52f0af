/*
 * The launch store (see store.h): rank 0 serves its unique id to ranks 1..n-1 over one listening
 * socket, TCP or abstract Unix; clients retry until the deadline.
 *
 * Schedule. Rank 0: bind (retrying while the address is in use), then accept connections one at a
 * time; each gets a bounded wait for its HELLO and an ID or REJECT reply. It returns when every
 * other rank has been answered with the id. Ranks 1..n-1: connect, HELLO, read the reply; refused
 * connections, resets and REJECTs (another job, or an earlier round still being served) are
 * retried with backoff until the deadline.
 */
#include "core/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "core/check.h"
#include "core/log.h"

#define STORE_HDR_BYTES 12
#define STORE_HELLO_FIXED 16
#define STORE_REJECT_FIXED 16
#define STORE_CLIENT_WAIT_NS (10ull * 1000000000ull) /* one client's HELLO, at rank 0 */
#define STORE_BACKOFF_MAX_MS 200

enum store_type { STORE_HELLO = 1, STORE_ID = 2, STORE_REJECT = 3 };
enum store_reason { STORE_REJECT_KEY = 1, STORE_REJECT_SEQ = 2, STORE_REJECT_NRANKS = 3,
                    STORE_REJECT_RANK = 4 };

/* A decoded HELLO or REJECT (they share a layout after the first field). */
struct store_peer_msg {
    uint32_t first; /* HELLO: rank; REJECT: reason */
    uint32_t nranks;
    uint32_t seq;
    char key[WEFT_STORE_KEY_MAX + 1];
};

static const char *store_reason_str(uint32_t reason)
{
    switch (reason) {
    case STORE_REJECT_KEY: return "it serves another job";
    case STORE_REJECT_SEQ: return "it serves another round of this job";
    case STORE_REJECT_NRANKS: return "it expects a different number of ranks";
    case STORE_REJECT_RANK: return "our rank is out of its range";
    default: return "unknown reason";
    }
}

static void store_put32(unsigned char *p, uint32_t v)
{
    v = htonl(v);
    memcpy(p, &v, 4);
}

static uint32_t store_get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

static uint64_t store_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

ncclResult_t weft_store_addr_tcp(const char *what, const char *hostport,
                                 struct weft_store_addr *addr_p)
{
    union weft_sockaddr sa;
    struct weft_store_addr addr;
    char str[WEFT_SOCKADDR_STRLEN];

    memset(&addr, 0, sizeof(addr));
    if (weft_socket_addr_parse(hostport, &sa) != ncclSuccess || !weft_socket_addr_valid(&sa)) {
        WEFT_WARN("%s is '%s', expected host:port with a non-zero port", what, hostport);
        return ncclInvalidArgument;
    }
    addr.len = weft_socket_addr_len(&sa);
    memcpy(&addr.ss, &sa, addr.len);
    snprintf(addr.desc, sizeof(addr.desc), "tcp %s (%s)",
             weft_socket_addr_str(&sa, str, sizeof(str)), what);
    *addr_p = addr;
    return ncclSuccess;
}

ncclResult_t weft_store_addr_local(const char *key, struct weft_store_addr *addr_p)
{
    struct weft_store_addr addr;
    struct sockaddr_un *sun = (struct sockaddr_un *)&addr.ss;
    char name[64];

    if (key == NULL || key[0] == '\0') {
        WEFT_WARN("local store needs a job key");
        return ncclInvalidArgument;
    }
    memset(&addr, 0, sizeof(addr));
    snprintf(name, sizeof(name), "weft-store-%016llx", (unsigned long long)store_hash(key));
    sun->sun_family = AF_UNIX;
    sun->sun_path[0] = '\0'; /* abstract namespace: no file, gone when the listener closes */
    memcpy(sun->sun_path + 1, name, strlen(name));
    addr.len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    snprintf(addr.desc, sizeof(addr.desc), "unix @%s (job %s)", name, key);
    *addr_p = addr;
    return ncclSuccess;
}

/* ---- framing ---- */

static ncclResult_t store_send(int fd, uint16_t type, const unsigned char *payload, uint32_t len,
                               uint64_t deadline, const char *what)
{
    unsigned char buf[STORE_HDR_BYTES + STORE_HELLO_FIXED + WEFT_STORE_KEY_MAX +
                      NCCL_UNIQUE_ID_BYTES];
    uint16_t v;

    WEFT_ASSERT(len <= sizeof(buf) - STORE_HDR_BYTES);
    store_put32(buf, WEFT_STORE_MAGIC);
    v = htons(WEFT_STORE_VERSION);
    memcpy(buf + 4, &v, 2);
    v = htons(type);
    memcpy(buf + 6, &v, 2);
    store_put32(buf + 8, len);
    memcpy(buf + STORE_HDR_BYTES, payload, len);
    return weft_socket_send_all(fd, buf, STORE_HDR_BYTES + len, deadline, NULL, what);
}

/* Reads one message: checks magic, version and the length allowed for its type. */
static ncclResult_t store_recv(int fd, uint64_t deadline, const char *what, uint16_t *type_p,
                               unsigned char *payload, uint32_t cap, uint32_t *len_p)
{
    unsigned char hdr[STORE_HDR_BYTES];
    uint16_t version, type;
    uint32_t len, min, max;

    WEFT_CHECK(weft_socket_recv_all(fd, hdr, sizeof(hdr), deadline, NULL, what));
    memcpy(&version, hdr + 4, 2);
    memcpy(&type, hdr + 6, 2);
    version = ntohs(version);
    type = ntohs(type);
    len = store_get32(hdr + 8);
    if (store_get32(hdr) != WEFT_STORE_MAGIC) {
        WEFT_WARN("%s: not a Weft launch store peer (magic 0x%08x)", what, store_get32(hdr));
        return ncclRemoteError;
    }
    if (version != WEFT_STORE_VERSION) {
        WEFT_WARN("%s: store protocol version %u, this library speaks %u", what, version,
                  WEFT_STORE_VERSION);
        return ncclRemoteError;
    }
    switch (type) {
    case STORE_HELLO:
        min = STORE_HELLO_FIXED;
        max = STORE_HELLO_FIXED + WEFT_STORE_KEY_MAX;
        break;
    case STORE_REJECT:
        min = STORE_REJECT_FIXED;
        max = STORE_REJECT_FIXED + WEFT_STORE_KEY_MAX;
        break;
    case STORE_ID:
        min = max = NCCL_UNIQUE_ID_BYTES;
        break;
    default:
        WEFT_WARN("%s: unknown store message type %u", what, type);
        return ncclRemoteError;
    }
    if (len < min || len > max || len > cap) {
        WEFT_WARN("%s: store message type %u has %u bytes, expected %u..%u", what, type, len, min,
                  max);
        return ncclRemoteError;
    }
    WEFT_CHECK(weft_socket_recv_all(fd, payload, len, deadline, NULL, what));
    *type_p = type;
    *len_p = len;
    return ncclSuccess;
}

/* HELLO and REJECT: four u32 then the key, whose length must account for the rest exactly. */
static uint32_t store_encode_peer(unsigned char *buf, uint32_t first, uint32_t nranks, uint32_t seq,
                                  const char *key)
{
    uint32_t klen = (uint32_t)strlen(key);

    store_put32(buf, first);
    store_put32(buf + 4, nranks);
    store_put32(buf + 8, seq);
    store_put32(buf + 12, klen);
    memcpy(buf + 16, key, klen);
    return 16 + klen;
}

static ncclResult_t store_decode_peer(const unsigned char *buf, uint32_t len, const char *what,
                                      struct store_peer_msg *msg_p)
{
    uint32_t klen = store_get32(buf + 12);

    if (klen != len - 16 || klen > WEFT_STORE_KEY_MAX) {
        WEFT_WARN("%s: key length %u does not match the message length %u", what, klen, len);
        return ncclRemoteError;
    }
    msg_p->first = store_get32(buf);
    msg_p->nranks = store_get32(buf + 4);
    msg_p->seq = store_get32(buf + 8);
    memcpy(msg_p->key, buf + 16, klen);
    msg_p->key[klen] = '\0';
    return ncclSuccess;
}

/* ---- sockets (TCP or Unix: socket.h's helpers are IP only for bind/connect) ---- */

static ncclResult_t store_listen(const struct weft_store_addr *addr, uint64_t deadline, int *fd_p)
{
    struct sockaddr_storage ss = addr->ss;
    int backoff_ms = 10, one = 1, fd, waited = 0;
    ncclResult_t res;

    for (;;) {
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        WEFT_SYSCHECK(fd, "socket");
        if (ss.ss_family != AF_UNIX)
            WEFT_SYSCHECK_GOTO(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)),
                               "setsockopt", res, err_close);
        if (bind(fd, (struct sockaddr *)&ss, addr->len) == 0)
            break;
        if (errno == EADDRNOTAVAIL && ss.ss_family == AF_INET) {
            /* The name resolves to an address this host does not own (NAT, /etc/hosts): listen
             * on every interface at that port instead. */
            ((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_ANY);
        } else if (errno == EADDRNOTAVAIL && ss.ss_family == AF_INET6) {
            ((struct sockaddr_in6 *)&ss)->sin6_addr = in6addr_any;
        } else if (errno == EADDRINUSE && (deadline == 0 || weft_socket_now_ns() < deadline)) {
            /* An earlier job's store may still hold it; it lets go once served. */
            if (!waited)
                WEFT_INFO(WEFT_LOG_INIT, "launch store %s is in use; retrying", addr->desc);
            waited = 1;
            close(fd);
            WEFT_CHECK(weft_socket_sleep(backoff_ms, deadline, NULL, "launch store bind"));
            backoff_ms = backoff_ms * 2 > STORE_BACKOFF_MAX_MS ? STORE_BACKOFF_MAX_MS
                                                              : backoff_ms * 2;
            continue;
        } else {
            WEFT_WARN("cannot listen for the launch store at %s: %s%s", addr->desc,
                      strerror(errno),
                      errno == EADDRINUSE ? " (another process holds it; set WEFT_STORE_ADDR to "
                                            "a free host:port)"
                                          : "");
            res = ncclSystemError;
            goto err_close;
        }
        close(fd);
    }
    WEFT_SYSCHECK_GOTO(listen(fd, SOMAXCONN), "listen", res, err_close);
    *fd_p = fd;
    return ncclSuccess;
err_close:
    close(fd);
    return res;
}

static int store_retriable(int err)
{
    return err == ECONNREFUSED || err == ENOENT || err == ECONNRESET || err == ETIMEDOUT ||
           err == EHOSTUNREACH || err == ENETUNREACH || err == ECONNABORTED || err == EAGAIN;
}

/* One connection attempt: 0 with *fd_p set, or the errno (a timeout of the attempt: ETIMEDOUT). */
static int store_try_connect(const struct weft_store_addr *addr, uint64_t deadline, int *fd_p)
{
    int fd = socket(addr->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int err = 0;
    socklen_t elen = sizeof(err);

    if (fd < 0)
        return errno;
    if (connect(fd, (const struct sockaddr *)&addr->ss, addr->len) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            err = errno;
            close(fd);
            return err;
        }
        for (;;) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int ms = 100, n;
            uint64_t now = weft_socket_now_ns();
            if (deadline != 0 && now >= deadline) {
                close(fd);
                return ETIMEDOUT;
            }
            n = poll(&pfd, 1, ms);
            if (n > 0)
                break;
            if (n < 0 && errno != EINTR) {
                err = errno;
                close(fd);
                return err;
            }
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
            err = errno;
        if (err != 0) {
            close(fd);
            return err;
        }
    }
    *fd_p = fd;
    return 0;
}

/* ---- rank 0 ---- */

/* Answers one client. Errors of a single client are its own: logged and dropped by the caller. */
static ncclResult_t store_serve_one(int fd, const char *key, uint32_t seq, int nranks,
                                    const ncclUniqueId *id, uint64_t deadline, int *rank_p)
{
    unsigned char buf[STORE_HELLO_FIXED + WEFT_STORE_KEY_MAX];
    struct store_peer_msg hello;
    uint32_t len, reason = 0;
    uint16_t type;
    uint64_t until = weft_socket_now_ns() + STORE_CLIENT_WAIT_NS;

    if (deadline != 0 && deadline < until)
        until = deadline;
    *rank_p = -1;
    WEFT_CHECK(store_recv(fd, until, "launch store: hello from a rank", &type, buf, sizeof(buf),
                          &len));
    if (type != STORE_HELLO) {
        WEFT_WARN("launch store: expected a hello, got message type %u", type);
        return ncclRemoteError;
    }
    WEFT_CHECK(store_decode_peer(buf, len, "launch store: hello", &hello));
    if (strcmp(hello.key, key) != 0)
        reason = STORE_REJECT_KEY;
    else if (hello.nranks != (uint32_t)nranks)
        reason = STORE_REJECT_NRANKS;
    else if (hello.seq != seq)
        reason = STORE_REJECT_SEQ;
    else if (hello.first == 0 || hello.first >= (uint32_t)nranks)
        reason = STORE_REJECT_RANK;
    if (reason != 0) {
        WEFT_INFO(WEFT_LOG_INIT,
                  "launch store: refused rank %u of job '%s' (%u ranks, round %u): %s", hello.first,
                  hello.key, hello.nranks, hello.seq, store_reason_str(reason));
        len = store_encode_peer(buf, reason, (uint32_t)nranks, seq, key);
        return store_send(fd, STORE_REJECT, buf, len, until, "launch store: refusal");
    }
    WEFT_CHECK(store_send(fd, STORE_ID, (const unsigned char *)id->internal, NCCL_UNIQUE_ID_BYTES,
                          until, "launch store: unique id to a rank"));
    *rank_p = (int)hello.first;
    return ncclSuccess;
}

static ncclResult_t store_serve(const struct weft_store_addr *addr, const char *key, uint32_t seq,
                                int nranks, const ncclUniqueId *id, uint64_t deadline)
{
    char what[WEFT_STORE_DESC_LEN + 256];
    unsigned char *served;
    int lfd = -1, missing = nranks - 1, first_missing = 1;
    ncclResult_t res;

    served = calloc((size_t)nranks, 1);
    if (served == NULL) {
        WEFT_WARN("launch store: out of memory for %d ranks", nranks);
        return ncclSystemError;
    }
    WEFT_CHECK_GOTO(store_listen(addr, deadline, &lfd), res, err_free);
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_BOOTSTRAP, "launch store: rank 0 serving %d ranks at %s",
              nranks - 1, addr->desc);
    while (missing > 0) {
        struct pollfd pfd = {.fd = lfd, .events = POLLIN};
        int cfd = -1, rank = -1;

        while (served[first_missing])
            first_missing++;
        snprintf(what, sizeof(what),
                 "the other ranks at the launch store %s (%d of %d missing, first rank %d; were "
                 "they started with the same launcher and environment?)",
                 addr->desc, missing, nranks - 1, first_missing);
        WEFT_CHECK_GOTO(weft_socket_poll(&pfd, 1, deadline, NULL, what), res, err_close);
        WEFT_CHECK_GOTO(weft_socket_accept(lfd, &cfd), res, err_close);
        if (cfd < 0)
            continue;
        res = store_serve_one(cfd, key, seq, nranks, id, deadline, &rank);
        weft_socket_close(&cfd);
        if (res != ncclSuccess) {
            WEFT_INFO(WEFT_LOG_INIT, "launch store: dropped a client -> %d", res);
            continue;
        }
        if (rank > 0 && !served[rank]) {
            served[rank] = 1;
            missing--;
        }
    }
    res = ncclSuccess;
err_close:
    weft_socket_close(&lfd);
err_free:
    free(served);
    return res;
}

/* ---- ranks 1..n-1 ---- */

static ncclResult_t store_fetch(const struct weft_store_addr *addr, const char *key, uint32_t seq,
                                int rank, int nranks, uint64_t deadline, ncclUniqueId *id_p)
{
    unsigned char buf[STORE_HELLO_FIXED + WEFT_STORE_KEY_MAX + NCCL_UNIQUE_ID_BYTES];
    char last[WEFT_STORE_KEY_MAX + 160] = "no answer";
    int backoff_ms = 10, attempts = 0;

    for (;;) {
        struct store_peer_msg rej;
        uint32_t len;
        uint16_t type;
        int fd = -1, err;

        attempts++;
        err = store_try_connect(addr, deadline, &fd);
        if (err == 0) {
            len = store_encode_peer(buf, (uint32_t)rank, (uint32_t)nranks, seq, key);
            if (store_send(fd, STORE_HELLO, buf, len, deadline, "launch store: hello to rank 0") ==
                    ncclSuccess &&
                store_recv(fd, deadline, "launch store: reply from rank 0", &type, buf,
                           sizeof(buf), &len) == ncclSuccess) {
                if (type == STORE_ID) {
                    weft_socket_close(&fd);
                    memcpy(id_p->internal, buf, NCCL_UNIQUE_ID_BYTES);
                    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_BOOTSTRAP,
                              "launch store: rank %d got the unique id from %s after %d attempts",
                              rank, addr->desc, attempts);
                    return ncclSuccess;
                }
                if (type == STORE_REJECT &&
                    store_decode_peer(buf, len, "launch store: refusal", &rej) == ncclSuccess)
                    snprintf(last, sizeof(last),
                             "refused: %s (it serves job '%s', %u ranks, round %u; we are job "
                             "'%s', %d ranks, round %u)",
                             store_reason_str(rej.first), rej.key, rej.nranks, rej.seq, key,
                             nranks, seq);
            } else {
                snprintf(last, sizeof(last), "connection lost before the id came");
            }
            weft_socket_close(&fd);
        } else if (store_retriable(err)) {
            snprintf(last, sizeof(last), "%s", strerror(err));
        } else {
            WEFT_WARN("rank %d: cannot connect to the launch store at %s: %s", rank, addr->desc,
                      strerror(err));
            return ncclSystemError;
        }
        if (deadline != 0 && weft_socket_now_ns() >= deadline)
            break;
        WEFT_CHECK(weft_socket_sleep(backoff_ms, deadline, NULL, "launch store retry"));
        backoff_ms = backoff_ms * 2 > STORE_BACKOFF_MAX_MS ? STORE_BACKOFF_MAX_MS : backoff_ms * 2;
        if (deadline != 0 && weft_socket_now_ns() >= deadline)
            break;
    }
    WEFT_WARN("rank %d: no unique id from rank 0's launch store at %s after %d attempts (last: "
              "%s); is rank 0 running, with the same launcher environment? (WEFT_BOOTSTRAP_TIMEOUT "
              "bounds the wait)",
              rank, addr->desc, attempts, last);
    return ncclSystemError;
}

ncclResult_t weft_store_exchange(const struct weft_store_addr *addr, const char *key, uint32_t seq,
                                 int rank, int nranks, uint64_t deadline, ncclUniqueId *id_p)
{
    if (key == NULL || key[0] == '\0' || strlen(key) > WEFT_STORE_KEY_MAX) {
        WEFT_WARN("launch store: the job key must have 1..%d bytes", WEFT_STORE_KEY_MAX);
        return ncclInvalidArgument;
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        WEFT_WARN("launch store: rank %d outside [0, %d)", rank, nranks);
        return ncclInvalidArgument;
    }
    if (nranks == 1)
        return ncclSuccess;
    if (rank == 0)
        return store_serve(addr, key, seq, nranks, id_p, deadline);
    return store_fetch(addr, key, seq, rank, nranks, deadline, id_p);
}
