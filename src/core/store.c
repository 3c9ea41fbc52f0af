/*
 * The launch store (see store.h): rank 0 serves its unique id to ranks 1..n-1 over one listening
 * socket, TCP or abstract Unix; clients retry until the deadline.
 *
 * Schedule. Rank 0: bind (retrying while the address is in use), then poll the listener and every
 * client at once: each gets a CHALLENGE at accept and at most STORE_CLIENT_WAIT_NS for its
 * authenticated HELLO, then an ID or REJECT; anything else is dropped and changes nothing. It
 * returns when every other rank has been answered with the id. Ranks 1..n-1: connect, read the
 * challenge, HELLO, read and check the reply; refused connections, resets, REJECTs (another job,
 * or an earlier round still being served) and unauthenticated replies are retried with backoff
 * until the deadline.
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
#include "core/auth.h"
#include "core/check.h"
#include "core/log.h"

#define STORE_CLIENT_WAIT_NS (5ull * 1000000000ull) /* a client's whole handshake, at rank 0 */
#define STORE_BACKOFF_MAX_MS 200
#define STORE_MAX_MSG (WEFT_STORE_HDR_BYTES + WEFT_STORE_HELLO_MAX)

enum store_reason { STORE_REJECT_KEY = 1, STORE_REJECT_SEQ = 2, STORE_REJECT_NRANKS = 3,
                    STORE_REJECT_RANK = 4 };

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

static uint16_t store_get16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return ntohs(v);
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

/* ---- messages: pure parsers (fuzzed by tests/fuzz) ---- */

const char *weft_store_hdr_parse(const unsigned char *hdr, size_t len, uint16_t *type_p,
                                 uint32_t *len_p)
{
    uint32_t plen, min, max;
    uint16_t type;
    if (len != WEFT_STORE_HDR_BYTES)
        return "short header";
    if (store_get32(hdr) != WEFT_STORE_MAGIC)
        return "not a Weft launch store peer";
    if (store_get16(hdr + 4) != WEFT_STORE_VERSION)
        return "another store protocol version";
    type = store_get16(hdr + 6);
    plen = store_get32(hdr + 8);
    switch (type) {
    case WEFT_STORE_CHALLENGE: min = max = WEFT_AUTH_NONCE_BYTES; break;
    case WEFT_STORE_HELLO: min = 16 + WEFT_AUTH_NONCE_BYTES + WEFT_AUTH_MAC_BYTES;
        max = WEFT_STORE_HELLO_MAX; break;
    case WEFT_STORE_REJECT: min = 16 + WEFT_AUTH_MAC_BYTES;
        max = 16 + WEFT_STORE_KEY_MAX + WEFT_AUTH_MAC_BYTES; break;
    case WEFT_STORE_ID: min = max = NCCL_UNIQUE_ID_BYTES + WEFT_AUTH_MAC_BYTES; break;
    default: return "unknown message type";
    }
    if (plen < min || plen > max)
        return "payload length out of range for its type";
    *type_p = type;
    *len_p = plen;
    return NULL;
}

const char *weft_store_msg_parse(const unsigned char *msg, size_t len, struct weft_store_msg *m)
{
    uint32_t plen, klen;
    const unsigned char *p = msg + WEFT_STORE_HDR_BYTES;
    const char *why;
    if (len < WEFT_STORE_HDR_BYTES)
        return "short header";
    memset(m, 0, sizeof(*m));
    why = weft_store_hdr_parse(msg, WEFT_STORE_HDR_BYTES, &m->type, &plen);
    if (why != NULL)
        return why;
    if (len != WEFT_STORE_HDR_BYTES + (size_t)plen)
        return "length differs from the header's";
    m->signed_len = len - WEFT_AUTH_MAC_BYTES;
    switch (m->type) {
    case WEFT_STORE_CHALLENGE:
        memcpy(m->nonce, p, WEFT_AUTH_NONCE_BYTES);
        m->signed_len = 0;
        return NULL;
    case WEFT_STORE_ID:
        memcpy(m->id, p, NCCL_UNIQUE_ID_BYTES);
        memcpy(m->mac, p + NCCL_UNIQUE_ID_BYTES, WEFT_AUTH_MAC_BYTES);
        return NULL;
    default:
        break;
    }
    /* HELLO and REJECT: four u32, the key, (HELLO) a nonce, the MAC; the key length must account
     * for the rest exactly. */
    klen = store_get32(p + 12);
    if (klen > WEFT_STORE_KEY_MAX ||
        klen + 16 + WEFT_AUTH_MAC_BYTES +
                (m->type == WEFT_STORE_HELLO ? WEFT_AUTH_NONCE_BYTES : 0) !=
            plen)
        return "key length does not match the message length";
    m->first = store_get32(p);
    m->nranks = store_get32(p + 4);
    m->seq = store_get32(p + 8);
    memcpy(m->key, p + 16, klen);
    m->key[klen] = '\0';
    if (memchr(m->key, '\0', klen) != NULL)
        return "key holds a NUL byte";
    if (m->type == WEFT_STORE_HELLO)
        memcpy(m->nonce, p + 16 + klen, WEFT_AUTH_NONCE_BYTES);
    memcpy(m->mac, msg + len - WEFT_AUTH_MAC_BYTES, WEFT_AUTH_MAC_BYTES);
    return NULL;
}

/* ---- building and checking messages ---- */

static size_t store_hdr(unsigned char *buf, uint16_t type, uint32_t plen)
{
    uint16_t v;
    store_put32(buf, WEFT_STORE_MAGIC);
    v = htons(WEFT_STORE_VERSION);
    memcpy(buf + 4, &v, 2);
    v = htons(type);
    memcpy(buf + 6, &v, 2);
    store_put32(buf + 8, plen);
    return WEFT_STORE_HDR_BYTES;
}

/* HELLO (with nonce) or REJECT, then the MAC; returns the message length. */
static size_t store_build_peer(unsigned char *buf, uint16_t type, uint32_t first, uint32_t nranks,
                               uint32_t seq, const char *key, const uint8_t *akey,
                               const struct weft_auth_nonces *n)
{
    uint32_t klen = (uint32_t)strlen(key);
    uint32_t plen = 16 + klen + WEFT_AUTH_MAC_BYTES +
                    (type == WEFT_STORE_HELLO ? WEFT_AUTH_NONCE_BYTES : 0);
    size_t off = store_hdr(buf, type, plen);
    store_put32(buf + off, first);
    store_put32(buf + off + 4, nranks);
    store_put32(buf + off + 8, seq);
    store_put32(buf + off + 12, klen);
    memcpy(buf + off + 16, key, klen);
    off += 16 + klen;
    if (type == WEFT_STORE_HELLO) {
        memcpy(buf + off, n->client, WEFT_AUTH_NONCE_BYTES);
        off += WEFT_AUTH_NONCE_BYTES;
    }
    weft_auth_mac(akey, type == WEFT_STORE_HELLO ? "store-hello" : "store-reject", n->server,
                  n->client, buf, off, buf + off);
    return off + WEFT_AUTH_MAC_BYTES;
}

static int store_mac_ok(const uint8_t *akey, const char *label, const struct weft_auth_nonces *n,
                        const unsigned char *msg, const struct weft_store_msg *m)
{
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    weft_auth_mac(akey, label, n->server, n->client, msg, m->signed_len, mac);
    return weft_auth_equal(mac, m->mac, sizeof(mac));
}

/* The id travels XORed with HMAC(key, "store-id-stream" ...) blocks: the secret in it never
 * crosses the wire in clear, and only a holder of the job secret can read it. */
static void store_id_crypt(const uint8_t *akey, const struct weft_auth_nonces *n, unsigned char *id)
{
    for (uint8_t i = 0; i < NCCL_UNIQUE_ID_BYTES / WEFT_AUTH_MAC_BYTES; i++) {
        uint8_t block[WEFT_AUTH_MAC_BYTES];
        weft_auth_mac(akey, "store-id-stream", n->server, n->client, &i, 1, block);
        for (int j = 0; j < WEFT_AUTH_MAC_BYTES; j++)
            id[i * WEFT_AUTH_MAC_BYTES + j] ^= block[j];
    }
}

/* Reads one whole message (header checked before the payload is read) into buf. */
static ncclResult_t store_recv(int fd, uint64_t deadline, const char *what, unsigned char *buf,
                               struct weft_store_msg *m)
{
    uint16_t type;
    uint32_t plen;
    const char *why;
    WEFT_CHECK(weft_socket_recv_all(fd, buf, WEFT_STORE_HDR_BYTES, deadline, NULL, what));
    why = weft_store_hdr_parse(buf, WEFT_STORE_HDR_BYTES, &type, &plen);
    if (why == NULL) {
        WEFT_CHECK(weft_socket_recv_all(fd, buf + WEFT_STORE_HDR_BYTES, plen, deadline, NULL,
                                        what));
        why = weft_store_msg_parse(buf, WEFT_STORE_HDR_BYTES + plen, m);
    }
    if (why != NULL) {
        WEFT_WARN("%s: %s", what, why);
        return ncclRemoteError;
    }
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

/* A client being served: challenge sent, its HELLO being read. */
struct store_conn {
    int fd;
    uint64_t since;
    size_t got;
    struct weft_auth_nonces nonces;
    unsigned char buf[STORE_MAX_MSG];
};

struct store_server {
    const char *key;
    uint32_t seq;
    int nranks;
    const ncclUniqueId *id;
    uint8_t akey[WEFT_AUTH_KEY_BYTES];
    struct store_conn *conns;
    int nconns, cap;
};

/* The challenge goes out at accept; a fresh socket always has room for it. */
static int store_challenge(struct store_conn *c)
{
    unsigned char buf[WEFT_STORE_HDR_BYTES + WEFT_AUTH_NONCE_BYTES];
    size_t done = 0;
    if (weft_auth_random(c->nonces.server, sizeof(c->nonces.server)) != ncclSuccess)
        return 0;
    store_hdr(buf, WEFT_STORE_CHALLENGE, WEFT_AUTH_NONCE_BYTES);
    memcpy(buf + WEFT_STORE_HDR_BYTES, c->nonces.server, WEFT_AUTH_NONCE_BYTES);
    return weft_socket_send_some(c->fd, buf, sizeof(buf), &done, NULL) ==
               ncclSuccess &&
           done == sizeof(buf);
}

/* A complete HELLO: the rank it proves, or -1 (refused, or not authenticated: dropped). */
static int store_answer(struct store_server *sv, struct store_conn *c)
{
    struct weft_store_msg m;
    unsigned char out[STORE_MAX_MSG];
    size_t len, done = 0;
    uint32_t reason = 0;
    const char *why = weft_store_msg_parse(c->buf, c->got, &m);
    if (why == NULL && m.type != WEFT_STORE_HELLO)
        why = "not a hello";
    memcpy(c->nonces.client, m.nonce, WEFT_AUTH_NONCE_BYTES);
    if (why == NULL && !store_mac_ok(sv->akey, "store-hello", &c->nonces, c->buf, &m))
        why = "authentication failed (another WEFT_SECRET, or none)";
    if (why != NULL) {
        WEFT_INFO(WEFT_LOG_INIT, "launch store: dropped a client: %s", why);
        return -1;
    }
    if (strcmp(m.key, sv->key) != 0)
        reason = STORE_REJECT_KEY;
    else if (m.nranks != (uint32_t)sv->nranks)
        reason = STORE_REJECT_NRANKS;
    else if (m.seq != sv->seq)
        reason = STORE_REJECT_SEQ;
    else if (m.first == 0 || m.first >= (uint32_t)sv->nranks)
        reason = STORE_REJECT_RANK;
    if (reason != 0) {
        WEFT_INFO(WEFT_LOG_INIT,
                  "launch store: refused rank %u of job '%s' (%u ranks, round %u): %s", m.first,
                  m.key, m.nranks, m.seq, store_reason_str(reason));
        len = store_build_peer(out, WEFT_STORE_REJECT, reason, (uint32_t)sv->nranks, sv->seq,
                               sv->key, sv->akey, &c->nonces);
    } else {
        len = store_hdr(out, WEFT_STORE_ID, NCCL_UNIQUE_ID_BYTES + WEFT_AUTH_MAC_BYTES);
        memcpy(out + len, sv->id->internal, NCCL_UNIQUE_ID_BYTES);
        store_id_crypt(sv->akey, &c->nonces, out + len);
        len += NCCL_UNIQUE_ID_BYTES;
        weft_auth_mac(sv->akey, "store-id", c->nonces.server, c->nonces.client, out, len,
                      out + len);
        len += WEFT_AUTH_MAC_BYTES;
    }
    /* At most a few hundred bytes on a socket that has sent only the challenge: fits. */
    if (weft_socket_send_some(c->fd, out, len, &done, NULL) != ncclSuccess ||
        done != len)
        return -1;
    return reason == 0 ? (int)m.first : -1;
}

/* Reads what client c sent; returns the rank served or -1; sets *closed when done with it. */
static int store_read(struct store_server *sv, struct store_conn *c, int *closed)
{
    uint16_t type;
    uint32_t plen;
    size_t want = WEFT_STORE_HDR_BYTES;
    const char *why;
    *closed = 0;
    if (c->got >= WEFT_STORE_HDR_BYTES) {
        if (weft_store_hdr_parse(c->buf, WEFT_STORE_HDR_BYTES, &type, &plen) != NULL)
            return -1; /* cannot happen: checked when the header arrived */
        want += plen;
    }
    if (weft_socket_recv_some(c->fd, c->buf, want, &c->got, NULL) !=
        ncclSuccess) {
        *closed = 1;
        return -1;
    }
    if (c->got < want)
        return -1;
    if (want == WEFT_STORE_HDR_BYTES) {
        why = weft_store_hdr_parse(c->buf, WEFT_STORE_HDR_BYTES, &type, &plen);
        if (why == NULL && type != WEFT_STORE_HELLO)
            why = "not a hello";
        if (why != NULL) {
            WEFT_INFO(WEFT_LOG_INIT, "launch store: dropped a client: %s", why);
            *closed = 1;
        }
        return -1; /* the payload comes next */
    }
    *closed = 1;
    return store_answer(sv, c);
}

/* The client that has waited longest (any index when there is none). */
static int store_oldest(const struct store_server *sv)
{
    int oldest = 0;
    for (int i = 1; i < sv->nconns; i++)
        if (sv->conns[i].since < sv->conns[oldest].since)
            oldest = i;
    return oldest;
}

static ncclResult_t store_serve(const struct weft_store_addr *addr, const char *key, uint32_t seq,
                                int nranks, const ncclUniqueId *id, uint64_t deadline)
{
    char what[WEFT_STORE_DESC_LEN + 256];
    unsigned char *served;
    struct pollfd *pfds = NULL;
    struct store_server sv = {.key = key, .seq = seq, .nranks = nranks, .id = id};
    int lfd = -1, missing = nranks - 1, first_missing = 1, have;
    ncclResult_t res;

    WEFT_CHECK(weft_auth_job_secret("weft-store", sv.akey, &have));
    served = calloc((size_t)nranks, 1);
    if (served == NULL) {
        WEFT_WARN("launch store: out of memory for %d ranks", nranks);
        return ncclSystemError;
    }
    WEFT_CHECK_GOTO(store_listen(addr, deadline, &lfd), res, err_free);
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_BOOTSTRAP,
              "launch store: rank 0 serving %d ranks at %s (%s)", nranks - 1, addr->desc,
              have ? "clients prove they know WEFT_SECRET"
                   : "no WEFT_SECRET: any process that reaches it gets the id");
    while (missing > 0) {
        uint64_t now = weft_socket_now_ns();
        int n;
        while (served[first_missing])
            first_missing++;
        snprintf(what, sizeof(what),
                 "the other ranks at the launch store %s (%d of %d missing, first rank %d; were "
                 "they started with the same launcher and environment?)",
                 addr->desc, missing, nranks - 1, first_missing);
        /* A client has STORE_CLIENT_WAIT_NS for its whole handshake. */
        for (int i = sv.nconns - 1; i >= 0; i--) {
            if (now - sv.conns[i].since < STORE_CLIENT_WAIT_NS)
                continue;
            WEFT_INFO(WEFT_LOG_INIT, "launch store: dropped a client silent for %llu s",
                      STORE_CLIENT_WAIT_NS / 1000000000ull);
            close(sv.conns[i].fd);
            sv.conns[i] = sv.conns[--sv.nconns];
        }
        n = sv.nconns;
        struct pollfd *p = realloc(pfds, (size_t)(n + 1) * sizeof(*p));
        if (p == NULL) {
            WEFT_WARN("launch store: out of memory for %d clients", n);
            res = ncclSystemError;
            goto err_close;
        }
        pfds = p;
        pfds[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            pfds[i + 1] = (struct pollfd){.fd = sv.conns[i].fd, .events = POLLIN};
        WEFT_CHECK_GOTO(weft_socket_poll(pfds, (nfds_t)n + 1, deadline, NULL, what), res,
                        err_close);
        /* Backwards: a finished client is replaced by the last one, already looked at. */
        for (int i = n - 1; i >= 0; i--) {
            int closed, rank;
            if (pfds[i + 1].revents == 0)
                continue;
            rank = store_read(&sv, &sv.conns[i], &closed);
            if (rank > 0 && !served[rank]) {
                served[rank] = 1;
                missing--;
            }
            if (closed) {
                close(sv.conns[i].fd);
                sv.conns[i] = sv.conns[--sv.nconns];
            }
        }
        while (pfds[0].revents != 0) {
            /* Within weft_socket_accept_pending()'s limits: strangers holding connections take
             * neither the process's descriptors nor the ranks' turn (the oldest go first). */
            int cfd, oldest = store_oldest(&sv);
            enum weft_accept_act act;
            uint64_t since = sv.nconns > 0 ? sv.conns[oldest].since : 0;
            WEFT_CHECK_GOTO(weft_socket_accept_pending(lfd, sv.nconns, since, nranks - 1,
                                                       "launch store", &cfd, &act),
                            res, err_close);
            if (act == WEFT_ACCEPT_NONE)
                break;
            if (act == WEFT_ACCEPT_LATER) { /* out of descriptors, nothing to drop: rest */
                usleep(WEFT_ACCEPT_LATER_MS * 1000);
                break;
            }
            if (act == WEFT_ACCEPT_EVICT) {
                WEFT_INFO(WEFT_LOG_INIT, "launch store: dropped the oldest client waiting for "
                                         "its handshake to make room");
                close(sv.conns[oldest].fd);
                sv.conns[oldest] = sv.conns[--sv.nconns];
            }
            if (cfd < 0)
                continue;
            if (sv.nconns == sv.cap) {
                int cap = sv.cap ? 2 * sv.cap : 16;
                struct store_conn *c = realloc(sv.conns, (size_t)cap * sizeof(*c));
                if (c == NULL) {
                    close(cfd);
                    WEFT_WARN("launch store: out of memory for %d clients", cap);
                    res = ncclSystemError;
                    goto err_close;
                }
                sv.conns = c;
                sv.cap = cap;
            }
            struct store_conn *c = &sv.conns[sv.nconns];
            c->fd = cfd;
            c->since = weft_socket_now_ns();
            c->got = 0;
            if (store_challenge(c))
                sv.nconns++;
            else
                close(cfd);
        }
    }
    res = ncclSuccess;
err_close:
    for (int i = 0; i < sv.nconns; i++)
        close(sv.conns[i].fd);
    free(sv.conns);
    free(pfds);
    weft_socket_close(&lfd);
err_free:
    free(served);
    memset(sv.akey, 0, sizeof(sv.akey));
    return res;
}

/* ---- ranks 1..n-1 ---- */

/* One attempt on a connected socket: 1 with *id_p set, else 0 with `last` saying why. */
static int store_fetch_one(int fd, const char *key, uint32_t seq, int rank, int nranks,
                           const uint8_t *akey, uint64_t deadline, ncclUniqueId *id_p, char *last,
                           size_t last_len)
{
    unsigned char buf[STORE_MAX_MSG];
    struct weft_store_msg m;
    struct weft_auth_nonces n;
    size_t len;
    if (store_recv(fd, deadline, "launch store: challenge from rank 0", buf, &m) != ncclSuccess ||
        m.type != WEFT_STORE_CHALLENGE) {
        snprintf(last, last_len, "no challenge from rank 0 (not a store of this version?)");
        return 0;
    }
    memcpy(n.server, m.nonce, sizeof(n.server));
    if (weft_auth_random(n.client, sizeof(n.client)) != ncclSuccess)
        return 0;
    len = store_build_peer(buf, WEFT_STORE_HELLO, (uint32_t)rank, (uint32_t)nranks, seq, key, akey,
                           &n);
    if (weft_socket_send_all(fd, buf, len, deadline, NULL, "launch store: hello to rank 0") !=
            ncclSuccess ||
        store_recv(fd, deadline, "launch store: reply from rank 0", buf, &m) != ncclSuccess) {
        snprintf(last, last_len,
                 "connection closed before the id came (rank 0 refused us: another WEFT_SECRET?)");
        return 0;
    }
    if (m.type == WEFT_STORE_ID && store_mac_ok(akey, "store-id", &n, buf, &m)) {
        store_id_crypt(akey, &n, m.id);
        memcpy(id_p->internal, m.id, NCCL_UNIQUE_ID_BYTES);
        return 1;
    }
    if (m.type == WEFT_STORE_REJECT && store_mac_ok(akey, "store-reject", &n, buf, &m))
        snprintf(last, last_len,
                 "refused: %s (it serves job '%s', %u ranks, round %u; we are job '%s', %d "
                 "ranks, round %u)",
                 store_reason_str(m.first), m.key, m.nranks, m.seq, key, nranks, seq);
    else
        snprintf(last, last_len,
                 "a reply that failed authentication (the store is not our rank 0: another "
                 "WEFT_SECRET, or another process holds the address)");
    return 0;
}

static ncclResult_t store_fetch(const struct weft_store_addr *addr, const char *key, uint32_t seq,
                                int rank, int nranks, uint64_t deadline, ncclUniqueId *id_p)
{
    char last[WEFT_STORE_KEY_MAX + 200] = "no answer";
    uint8_t akey[WEFT_AUTH_KEY_BYTES];
    int backoff_ms = 10, attempts = 0, have;

    WEFT_CHECK(weft_auth_job_secret("weft-store", akey, &have));
    for (;;) {
        int fd = -1, err;

        attempts++;
        err = store_try_connect(addr, deadline, &fd);
        if (err == 0) {
            int ok = store_fetch_one(fd, key, seq, rank, nranks, akey, deadline, id_p, last,
                                     sizeof(last));
            weft_socket_close(&fd);
            if (ok) {
                memset(akey, 0, sizeof(akey));
                WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_BOOTSTRAP,
                          "launch store: rank %d got the unique id from %s after %d attempts",
                          rank, addr->desc, attempts);
                return ncclSuccess;
            }
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
