/*
 * Bootstrap, rank side: unique id, rendezvous with the root, ring of TCP connections, tagged
 * messages and the collectives built on them. The id layout and wire format are in wire.h; the
 * root thread is in root.c.
 */
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "bootstrap/wire.h"
#include "core/check.h"
#include "core/param.h"

WEFT_PARAM(BootstrapTimeout, "WEFT_BOOTSTRAP_TIMEOUT", 120,
           "seconds any bootstrap wait (rendezvous, allgather, send/recv) may take; <= 0: none");
WEFT_PARAM_STR(CommId, "NCCL_COMM_ID", NULL,
               "fixed bootstrap root address host:port or [ipv6]:port; rank 0 runs the root");

/* A message that arrived before anyone asked for it. */
struct weft_bs_msg {
    struct weft_bs_msg *next;
    int peer;
    uint32_t type;
    int32_t tag;
    size_t size;
    char data[];
};

/* An accepted connection whose CONNECT has not been checked yet. */
struct weft_bs_pending {
    int fd;
    uint64_t since;
    size_t got;
    struct weft_auth_nonces nonces;
    unsigned char msg[sizeof(struct weft_bs_connect)];
};

struct weft_bootstrap {
    int rank;
    int nranks;
    uint64_t magic;
    uint8_t key[WEFT_AUTH_KEY_BYTES];
    int64_t timeout_s;
    volatile uint32_t *abort_flag;
    int listen_fd;
    union weft_sockaddr *addrs; /* every rank's listen address */
    int *send_fd;               /* per peer: connection we made (we write), -1 until used */
    /* Per peer: connection it made (we read), -1 until admitted. The admission thread sets an
     * entry (from -1 only, atomically); the caller's thread reads it and closes it. */
    int *recv_fd;
    struct weft_bs_msg *unexpected; /* FIFO, oldest first */
    struct weft_bs_msg **unexpected_tail;
    size_t unexpected_count, unexpected_bytes;
    int32_t coll_seq;
    /* Admission thread: the only user of listen_fd, pending and pfds. */
    pthread_t admit_thread;
    int admit_running;
    int admitted_fd; /* eventfd: the thread adds 1 after each admission (wakes a waiting call) */
    int stop_fd;     /* eventfd: weft_bootstrap_close() ends the thread */
    struct weft_bs_pending *pending; /* accepted, handshake not done */
    int npending, pending_cap;
    struct pollfd *pfds; /* 2 + pending_cap */
    uint64_t accept_after; /* out of descriptors: the listener rests until then */
};

/* A message being written while we wait for another one (ring steps send and receive at once). */
struct weft_bs_out {
    int fd;
    struct weft_bs_hdr hdr;
    const void *data;
    size_t hdr_done;
    size_t data_done;
    char what[128];
};

/* ---------------------------------------------------------------------------------------------
 * Unique id
 * ------------------------------------------------------------------------------------------- */

static int weft_bs_id_decode(const ncclUniqueId *id, struct weft_bs_id *v)
{
    return weft_bs_id_parse(id->internal, NCCL_UNIQUE_ID_BYTES, v) == NULL;
}

const uint8_t *weft_bootstrap_key(const struct weft_bootstrap *bs)
{
    return bs->key;
}

uint64_t weft_bootstrap_magic(const ncclUniqueId *id)
{
    struct weft_bs_id v;
    return weft_bs_id_decode(id, &v) ? v.magic : 0;
}

/* FNV-1a: every process computes the same magic from the same NCCL_COMM_ID. */
static uint64_t weft_bs_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h != 0 ? h : 1;
}

static ncclResult_t weft_bs_make_id(ncclUniqueId *id, int use_comm_id)
{
    struct weft_bs_id v;
    char ifname[WEFT_IFNAME_LEN], str[WEFT_SOCKADDR_STRLEN];
    if (id == NULL) {
        WEFT_WARN("bootstrap: NULL unique id");
        return ncclInvalidArgument;
    }
    memset(&v, 0, sizeof(v));
    v.tag = WEFT_BS_ID_TAG;
    const char *env = use_comm_id ? weft_param_CommId() : NULL;
    if (env != NULL && *env != '\0') {
        int have;
        WEFT_CHECK(weft_socket_addr_parse(env, &v.root));
        v.flags = WEFT_BS_ID_ROOT_IN_RANK0;
        v.magic = weft_bs_hash(env);
        /* Every process computes the same id: the only secret there can be is the job's. */
        WEFT_CHECK(weft_auth_job_secret(env, v.secret, &have));
        WEFT_INFO(WEFT_LOG_BOOTSTRAP,
                  "unique id from NCCL_COMM_ID %s: rank 0 will run the root; %s",
                  weft_socket_addr_str(&v.root, str, sizeof(str)),
                  have ? "ranks prove they know WEFT_SECRET"
                       : "no WEFT_SECRET: anyone who reaches the port can join");
    } else {
        do {
            WEFT_CHECK(weft_auth_random(&v.magic, sizeof(v.magic)));
        } while (v.magic == 0);
        WEFT_CHECK(weft_auth_random(v.secret, sizeof(v.secret)));
        WEFT_CHECK(weft_socket_find_interface(ifname, sizeof(ifname), &v.root));
        WEFT_CHECK(weft_bs_root_start(&v.root, v.magic, v.secret, weft_param_BootstrapTimeout()));
    }
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, &v, sizeof(v));
    return ncclSuccess;
}

ncclResult_t weft_bootstrap_get_unique_id(ncclUniqueId *id)
{
    return weft_bs_make_id(id, 1);
}

ncclResult_t weft_bootstrap_fresh_id(ncclUniqueId *id)
{
    return weft_bs_make_id(id, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Rank side: waiting, connections, messages.
 * ------------------------------------------------------------------------------------------- */

static int weft_bs_out_pending(const struct weft_bs_out *o)
{
    return o->hdr_done < sizeof(o->hdr) || o->data_done < o->hdr.size;
}

static ncclResult_t weft_bs_out_progress(struct weft_bs_out *o)
{
    WEFT_CHECK(weft_socket_send_some(o->fd, &o->hdr, sizeof(o->hdr), &o->hdr_done, o->what));
    if (o->hdr_done == sizeof(o->hdr))
        WEFT_CHECK(weft_socket_send_some(o->fd, o->data, o->hdr.size, &o->data_done, o->what));
    return ncclSuccess;
}

/*
 * ---- admission: a thread per handle answers every incoming handshake ----
 * The first message to a rank opens a connection whose handshake the receiver must answer (two
 * round trips). Answering it from the receiver's own waits held the sender up for as long as the
 * receiver was busy elsewhere, asleep in user code or descheduled (notes sent with short limits
 * were lost under load). The thread answers at once, whatever the receiver's caller does, and
 * connections stay lazy (n-1 links per rank at most, a full mesh only where all pairs talk).
 */

static void weft_bs_pending_drop(struct weft_bootstrap *bs, int i, const char *why)
{
    WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap rank %d: dropped an incoming connection: %s",
              bs->rank, why);
    close(bs->pending[i].fd);
    bs->pending[i] = bs->pending[--bs->npending];
}

/* Drops the pending connection that has waited longest (a stranger's, when one holds many). */
static int weft_bs_pending_oldest(const struct weft_bootstrap *bs)
{
    int oldest = 0;
    for (int i = 1; i < bs->npending; i++)
        if (bs->pending[i].since < bs->pending[oldest].since)
            oldest = i;
    return oldest;
}

/*
 * Accepts what is pending on the listening socket and sends each a CHALLENGE at once. Within the
 * limits of weft_socket_accept_pending(): out of descriptors with nothing to drop, the listener
 * rests until accept_after.
 */
static ncclResult_t weft_bs_accept_new(struct weft_bootstrap *bs)
{
    char who[48];
    snprintf(who, sizeof(who), "bootstrap rank %d", bs->rank);
    for (;;) {
        int fd;
        enum weft_accept_act act;
        int oldest = weft_bs_pending_oldest(bs);
        uint64_t since = bs->npending > 0 ? bs->pending[oldest].since : 0;
        WEFT_CHECK(weft_socket_accept_pending(bs->listen_fd, bs->npending, since, bs->nranks - 1,
                                              who, &fd, &act));
        if (act == WEFT_ACCEPT_NONE)
            return ncclSuccess;
        if (act == WEFT_ACCEPT_LATER) {
            bs->accept_after = weft_socket_now_ns() + WEFT_ACCEPT_LATER_MS * 1000000ull;
            return ncclSuccess;
        }
        if (act == WEFT_ACCEPT_EVICT && bs->npending > 0)
            weft_bs_pending_drop(bs, oldest, "the oldest pending handshake made room");
        if (fd < 0)
            continue;
        if (bs->npending == bs->pending_cap) {
            int cap = bs->pending_cap ? 2 * bs->pending_cap : 16;
            struct weft_bs_pending *p = realloc(bs->pending, cap * sizeof(*p));
            if (p != NULL)
                bs->pending = p;
            struct pollfd *pfds = realloc(bs->pfds, (cap + 2) * sizeof(*pfds));
            if (pfds != NULL)
                bs->pfds = pfds;
            if (p == NULL || pfds == NULL) {
                close(fd);
                WEFT_WARN("bootstrap rank %d: out of memory for %d incoming connections",
                          bs->rank, cap);
                return ncclSystemError;
            }
            bs->pending_cap = cap;
        }
        struct weft_bs_pending *c = &bs->pending[bs->npending];
        struct weft_bs_challenge ch;
        size_t done = 0;
        *c = (struct weft_bs_pending){.fd = fd, .since = weft_socket_now_ns()};
        if (weft_auth_random(c->nonces.server, sizeof(c->nonces.server)) != ncclSuccess) {
            close(fd);
            return ncclSystemError;
        }
        memset(&ch, 0, sizeof(ch));
        weft_bs_hdr_fill(&ch.hdr, WEFT_BS_CHALLENGE, bs->magic, bs->rank, 0, sizeof(ch.nonce));
        memcpy(ch.nonce, c->nonces.server, sizeof(ch.nonce));
        /* A fresh socket has room for it; a peer already gone is just dropped. */
        if (weft_socket_send_some(fd, &ch, sizeof(ch), &done, NULL) !=
                ncclSuccess ||
            done != sizeof(ch)) {
            close(fd);
            continue;
        }
        bs->npending++;
    }
}

/* Reads what pending connection i sent; admits it under its rank once its CONNECT checks out. */
static void weft_bs_pending_read(struct weft_bootstrap *bs, int i)
{
    struct weft_bs_pending *c = &bs->pending[i];
    struct weft_bs_accept acc;
    size_t done = 0;
    int rank;
    if (weft_socket_recv_some(c->fd, c->msg, sizeof(c->msg), &c->got, NULL) !=
        ncclSuccess) {
        weft_bs_pending_drop(bs, i, "closed during the handshake");
        return;
    }
    if (c->got < sizeof(c->msg))
        return;
    const char *why = weft_bs_connect_parse(c->msg, sizeof(c->msg), bs->magic, bs->nranks,
                                            bs->key, &c->nonces, &rank);
    if (why == NULL && __atomic_load_n(&bs->recv_fd[rank], __ATOMIC_ACQUIRE) >= 0)
        why = "that rank is already connected";
    if (why != NULL) {
        weft_bs_pending_drop(bs, i, why);
        return;
    }
    memset(&acc, 0, sizeof(acc));
    weft_bs_hdr_fill(&acc.hdr, WEFT_BS_ACCEPT, bs->magic, rank, 0, sizeof(acc.mac));
    weft_auth_mac(bs->key, "bs-accept", c->nonces.server, c->nonces.client, &acc.hdr,
                  sizeof(acc.hdr), acc.mac);
    if (weft_socket_send_some(c->fd, &acc, sizeof(acc), &done, NULL) !=
            ncclSuccess ||
        done != sizeof(acc)) {
        weft_bs_pending_drop(bs, i, "closed during the handshake");
        return;
    }
    int none = -1;
    if (!__atomic_compare_exchange_n(&bs->recv_fd[rank], &none, c->fd, 0, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED)) {
        weft_bs_pending_drop(bs, i, "that rank is already connected");
        return;
    }
    bs->pending[i] = bs->pending[--bs->npending];
    uint64_t one = 1;
    ssize_t wr = write(bs->admitted_fd, &one, sizeof(one));
    (void)wr; /* only fails when the counter is huge: the waiter is awake then anyway */
}

/*
 * The admission thread: sleeps in poll() on the listening socket, the unfinished handshakes and
 * stop_fd (no timeout unless a handshake is unfinished: it must end within WEFT_BS_ADMIT_MS).
 * It waits for nothing else, so it needs no deadline or abort check; close() ends it.
 */
static void *weft_bs_admit_main(void *arg)
{
    struct weft_bootstrap *bs = arg;
    const uint64_t admit_ns = WEFT_BS_ADMIT_MS * 1000000ull;
    for (;;) {
        uint64_t now = weft_socket_now_ns();
        int timeout_ms = -1;
        for (int i = bs->npending - 1; i >= 0; i--)
            if (now - bs->pending[i].since >= admit_ns)
                weft_bs_pending_drop(bs, i, "no handshake within WEFT_BS_ADMIT_MS");
        for (int i = 0; i < bs->npending; i++) {
            int left = (int)((bs->pending[i].since + admit_ns - now) / 1000000ull) + 1;
            if (timeout_ms < 0 || left < timeout_ms)
                timeout_ms = left;
        }
        int resting = now < bs->accept_after;
        if (resting) {
            int left = (int)((bs->accept_after - now) / 1000000ull) + 1;
            if (timeout_ms < 0 || left < timeout_ms)
                timeout_ms = left;
        }
        int n = bs->npending;
        struct pollfd *pfd = bs->pfds;
        pfd[0] = (struct pollfd){.fd = bs->stop_fd, .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = resting ? -1 : bs->listen_fd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            pfd[2 + i] = (struct pollfd){.fd = bs->pending[i].fd, .events = POLLIN};
        if (poll(pfd, 2 + n, timeout_ms) < 0) {
            if (errno != EINTR) {
                WEFT_WARN("bootstrap rank %d: admission poll failed: %s", bs->rank,
                          strerror(errno));
                usleep(100000); /* ENOMEM: try again later rather than spin */
            }
            continue;
        }
        if (pfd[0].revents != 0)
            return NULL;
        /* Backwards: a finished entry is replaced by the last one, already looked at. */
        for (int i = n - 1; i >= 0; i--)
            if (pfd[2 + i].revents != 0)
                weft_bs_pending_read(bs, i);
        /* A broken listener (logged there): the connection stays queued; retry later. */
        if (pfd[1].revents != 0 && weft_bs_accept_new(bs) != ncclSuccess)
            bs->accept_after = weft_socket_now_ns() + 100000000ull;
    }
}

/* Starts the admission thread on bs->listen_fd (allocations are freed by close). */
static ncclResult_t weft_bs_admit_start(struct weft_bootstrap *bs)
{
    bs->admitted_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    bs->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (bs->admitted_fd < 0 || bs->stop_fd < 0) {
        WEFT_WARN("bootstrap rank %d: eventfd failed: %s", bs->rank, strerror(errno));
        return ncclSystemError;
    }
    WEFT_CALLOC(bs->pfds, 2);
    WEFT_PTHREADCHECK(pthread_create(&bs->admit_thread, NULL, weft_bs_admit_main, bs),
                      "pthread_create");
    bs->admit_running = 1;
    return ncclSuccess;
}

static void weft_bs_admit_stop(struct weft_bootstrap *bs)
{
    if (bs->admit_running) {
        uint64_t one = 1;
        ssize_t wr = write(bs->stop_fd, &one, sizeof(one));
        (void)wr; /* a fresh eventfd never refuses 1 */
        pthread_join(bs->admit_thread, NULL);
        bs->admit_running = 0;
    }
    weft_socket_close(&bs->admitted_fd);
    weft_socket_close(&bs->stop_fd);
}

/* Peer's admitted connection, -1 while there is none. */
static int weft_bs_link(struct weft_bootstrap *bs, int peer)
{
    return __atomic_load_n(&bs->recv_fd[peer], __ATOMIC_ACQUIRE);
}

/*
 * One poll for fd's events (fd may be -1), writing `out` (may be NULL) whenever its socket has
 * room; also returns when the admission thread admits a connection.
 */
static ncclResult_t weft_bs_wait(struct weft_bootstrap *bs, int fd, short events,
                                 struct weft_bs_out *out, uint64_t deadline, const char *what)
{
    struct pollfd pfd[3];
    pfd[0] = (struct pollfd){.fd = fd, .events = events};
    pfd[1] = (struct pollfd){.fd = -1};
    pfd[2] = (struct pollfd){.fd = bs->admitted_fd, .events = POLLIN};
    if (out != NULL && weft_bs_out_pending(out))
        pfd[1] = (struct pollfd){.fd = out->fd, .events = POLLOUT};
    WEFT_CHECK(weft_socket_poll(pfd, 3, deadline, bs->abort_flag, what));
    if (pfd[1].revents != 0)
        WEFT_CHECK(weft_bs_out_progress(out));
    if (pfd[2].revents != 0) {
        uint64_t count;
        ssize_t rd = read(bs->admitted_fd, &count, sizeof(count));
        (void)rd; /* the caller checks what it waits for again */
    }
    return ncclSuccess;
}

static ncclResult_t weft_bs_read(struct weft_bootstrap *bs, int fd, void *buf, size_t len,
                                 struct weft_bs_out *out, uint64_t deadline, const char *what)
{
    size_t done = 0;
    for (;;) {
        WEFT_CHECK(weft_socket_recv_some(fd, buf, len, &done, what));
        if (done == len)
            return ncclSuccess;
        WEFT_CHECK(weft_bs_wait(bs, fd, POLLIN, out, deadline, what));
    }
}

static ncclResult_t weft_bs_send_fd(struct weft_bootstrap *bs, int peer, uint64_t deadline,
                                    int *fd_p)
{
    if (bs->send_fd[peer] < 0) {
        ncclResult_t res = ncclSuccess;
        char what[96];
        struct weft_bs_challenge ch;
        struct weft_bs_connect con;
        struct weft_bs_accept acc;
        struct weft_auth_nonces nonces;
        const char *why;
        int fd;
        snprintf(what, sizeof(what), "bootstrap rank %d: connection to rank %d", bs->rank, peer);
        WEFT_CHECK(weft_socket_connect(&bs->addrs[peer], deadline, bs->abort_flag, what, &fd));
        /* Challenge-response (wire.h); the peer's admission thread answers. */
        WEFT_CHECK_GOTO(weft_bs_read(bs, fd, &ch, sizeof(ch), NULL, deadline, what), res, err);
        why = weft_bs_challenge_parse(&ch, sizeof(ch), bs->magic, &nonces);
        if (why != NULL)
            goto err_why;
        memset(&con, 0, sizeof(con));
        weft_bs_hdr_fill(&con.hdr, WEFT_BS_CONNECT, bs->magic, bs->rank, 0,
                         sizeof(con) - sizeof(con.hdr));
        WEFT_CHECK_GOTO(weft_auth_random(nonces.client, sizeof(nonces.client)), res, err);
        memcpy(con.nonce, nonces.client, sizeof(con.nonce));
        weft_auth_mac(bs->key, "bs-connect", nonces.server, nonces.client, &con,
                      offsetof(struct weft_bs_connect, mac), con.mac);
        WEFT_CHECK_GOTO(weft_socket_send_all(fd, &con, sizeof(con), deadline, bs->abort_flag, what),
                        res, err);
        WEFT_CHECK_GOTO(weft_bs_read(bs, fd, &acc, sizeof(acc), NULL, deadline, what), res, err);
        why = weft_bs_accept_parse(&acc, sizeof(acc), bs->magic, bs->rank, bs->key, &nonces);
        if (why != NULL)
            goto err_why;
        bs->send_fd[peer] = fd;
        goto done;
    err_why:
        WEFT_WARN("%s: handshake failed: %s", what, why);
        res = ncclSystemError;
    err:
        close(fd);
        return res;
    }
done:
    *fd_p = bs->send_fd[peer];
    return ncclSuccess;
}

static ncclResult_t weft_bs_recv_fd(struct weft_bootstrap *bs, int peer, struct weft_bs_out *out,
                                    uint64_t deadline, int *fd_p)
{
    char what[128];
    snprintf(what, sizeof(what), "bootstrap rank %d: connection from rank %d (timeout %lld s)",
             bs->rank, peer, (long long)bs->timeout_s);
    while (weft_bs_link(bs, peer) < 0)
        WEFT_CHECK(weft_bs_wait(bs, -1, 0, out, deadline, what));
    *fd_p = weft_bs_link(bs, peer);
    return ncclSuccess;
}

static ncclResult_t weft_bs_out_start(struct weft_bootstrap *bs, struct weft_bs_out *o, int peer,
                                      uint32_t type, int tag, const void *data, size_t size,
                                      uint64_t deadline)
{
    memset(o, 0, sizeof(*o));
    snprintf(o->what, sizeof(o->what),
             "bootstrap rank %d: send of %zu bytes to rank %d tag %d "
             "(timeout %lld s)",
             bs->rank, size, peer, tag, (long long)bs->timeout_s);
    WEFT_CHECK(weft_bs_send_fd(bs, peer, deadline, &o->fd));
    weft_bs_hdr_fill(&o->hdr, type, bs->magic, bs->rank, tag, size);
    o->data = data;
    return weft_bs_out_progress(o);
}

static ncclResult_t weft_bs_out_finish(struct weft_bootstrap *bs, struct weft_bs_out *o,
                                       uint64_t deadline)
{
    while (weft_bs_out_pending(o))
        WEFT_CHECK(weft_bs_wait(bs, -1, 0, o, deadline, o->what));
    return ncclSuccess;
}

static ncclResult_t weft_bs_check_size(const char *what, uint64_t got, size_t want)
{
    if (got != want) {
        WEFT_WARN("%s: the peer sent %llu bytes, %zu expected", what, (unsigned long long)got,
                  want);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/*
 * Receives the oldest message (peer, type, tag) into data: from the unexpected list, else from the
 * connection, keeping any other message read on the way. `out` is written meanwhile.
 */
/* Reads the payload of message h from peer into the kept list (kept until asked for): bounded in
 * count and bytes, checked before allocating. */
static ncclResult_t weft_bs_keep(struct weft_bootstrap *bs, int peer, const struct weft_bs_hdr *h,
                                 int fd, struct weft_bs_out *out, uint64_t deadline,
                                 const char *what)
{
    if (bs->unexpected_count >= WEFT_BS_MAX_UNEXPECTED ||
        h->size > WEFT_BS_MAX_UNEXPECTED_BYTES - bs->unexpected_bytes) {
        WEFT_WARN("%s: rank %d sent more messages nobody asked for than a rank keeps (%zu "
                  "messages, %zu bytes kept; at most %d, %llu bytes)",
                  what, peer, bs->unexpected_count, bs->unexpected_bytes, WEFT_BS_MAX_UNEXPECTED,
                  WEFT_BS_MAX_UNEXPECTED_BYTES);
        return ncclInvalidUsage;
    }
    struct weft_bs_msg *m = malloc(sizeof(*m) + h->size);
    if (m == NULL) {
        WEFT_WARN("%s: out of memory keeping a %llu-byte message", what,
                  (unsigned long long)h->size);
        return ncclSystemError;
    }
    *m = (struct weft_bs_msg){.peer = peer, .type = h->type, .tag = h->tag, .size = h->size};
    ncclResult_t res = weft_bs_read(bs, fd, m->data, h->size, out, deadline, what);
    if (res != ncclSuccess) {
        free(m);
        return res;
    }
    *bs->unexpected_tail = m;
    bs->unexpected_tail = &m->next;
    bs->unexpected_count++;
    bs->unexpected_bytes += h->size;
    return ncclSuccess;
}

static ncclResult_t weft_bs_recv_msg(struct weft_bootstrap *bs, int peer, uint32_t type, int tag,
                                     void *data, size_t size, struct weft_bs_out *out,
                                     uint64_t deadline)
{
    char what[160];
    snprintf(what, sizeof(what),
             "bootstrap rank %d: %s tag %d from rank %d (%zu bytes, timeout %lld s)", bs->rank,
             type == WEFT_BS_DATA_USER ? "message" : "collective", tag, peer, size,
             (long long)bs->timeout_s);
    for (struct weft_bs_msg **pp = &bs->unexpected; *pp != NULL; pp = &(*pp)->next) {
        struct weft_bs_msg *m = *pp;
        if (m->peer != peer || m->type != type || m->tag != tag)
            continue;
        WEFT_CHECK(weft_bs_check_size(what, m->size, size));
        memcpy(data, m->data, size);
        bs->unexpected_count--;
        bs->unexpected_bytes -= m->size;
        *pp = m->next;
        if (bs->unexpected_tail == &m->next)
            bs->unexpected_tail = pp;
        free(m);
        return ncclSuccess;
    }
    int fd;
    WEFT_CHECK(weft_bs_recv_fd(bs, peer, out, deadline, &fd));
    for (;;) {
        struct weft_bs_hdr raw, h;
        WEFT_CHECK(weft_bs_read(bs, fd, &raw, sizeof(raw), out, deadline, what));
        const char *why = weft_bs_data_hdr_parse(&raw, sizeof(raw), bs->magic, peer, &h);
        if (why != NULL) {
            WEFT_WARN("%s: malformed header (version 0x%x type %u rank %d size %llu): %s", what,
                      raw.version, raw.type, raw.rank, (unsigned long long)raw.size, why);
            return ncclSystemError;
        }
        if (h.type == type && h.tag == tag) {
            WEFT_CHECK(weft_bs_check_size(what, h.size, size));
            return weft_bs_read(bs, fd, data, size, out, deadline, what);
        }
        WEFT_CHECK(weft_bs_keep(bs, peer, &h, fd, out, deadline, what));
    }
}

static ncclResult_t weft_bs_send_msg(struct weft_bootstrap *bs, int peer, uint32_t type, int tag,
                                     const void *data, size_t size, uint64_t deadline)
{
    struct weft_bs_out out;
    WEFT_CHECK(weft_bs_out_start(bs, &out, peer, type, tag, data, size, deadline));
    return weft_bs_out_finish(bs, &out, deadline);
}

/* ---------------------------------------------------------------------------------------------
 * Init and close
 * ------------------------------------------------------------------------------------------- */

/* Says hello to the root and reads back every rank's listen address. */
static ncclResult_t weft_bs_rendezvous(struct weft_bootstrap *bs, const union weft_sockaddr *root,
                                       const union weft_sockaddr *me, uint64_t deadline)
{
    ncclResult_t res = ncclSuccess;
    char what[192], str[WEFT_SOCKADDR_STRLEN];
    struct weft_bs_challenge ch;
    struct weft_bs_hello hello;
    struct weft_bs_hdr raw, h;
    struct weft_auth_nonces nonces;
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    char *payload = NULL;
    const char *why;
    int fd = -1;
    weft_socket_addr_str(root, str, sizeof(str));
    snprintf(what, sizeof(what), "bootstrap rank %d (stale unique id, or its root exited?)",
             bs->rank);
    WEFT_CHECK(weft_socket_connect(root, deadline, bs->abort_flag, what, &fd));

    snprintf(what, sizeof(what), "bootstrap rank %d: all %d ranks at the root %s (timeout %lld s)",
             bs->rank, bs->nranks, str, (long long)bs->timeout_s);
    /* The root's challenge, our authenticated hello, its authenticated reply (wire.h). */
    WEFT_CHECK_GOTO(weft_socket_recv_all(fd, &ch, sizeof(ch), deadline, bs->abort_flag, what), res,
                    out);
    why = weft_bs_challenge_parse(&ch, sizeof(ch), bs->magic, &nonces);
    if (why != NULL)
        goto out_why;
    memset(&hello, 0, sizeof(hello));
    weft_bs_hdr_fill(&hello.hdr, WEFT_BS_HELLO, bs->magic, bs->rank, 0,
                     sizeof(hello) - sizeof(hello.hdr));
    hello.nranks = bs->nranks;
    hello.addr = *me;
    WEFT_CHECK_GOTO(weft_auth_random(nonces.client, sizeof(nonces.client)), res, out);
    memcpy(hello.nonce, nonces.client, sizeof(hello.nonce));
    weft_auth_mac(bs->key, "bs-hello", nonces.server, nonces.client, &hello,
                  offsetof(struct weft_bs_hello, mac), hello.mac);
    WEFT_CHECK_GOTO(weft_socket_send_all(fd, &hello, sizeof(hello), deadline, bs->abort_flag, what),
                    res, out);
    WEFT_CHECK_GOTO(weft_socket_recv_all(fd, &raw, sizeof(raw), deadline, bs->abort_flag, what),
                    res, out);
    why = weft_bs_reply_hdr_parse(&raw, sizeof(raw), bs->magic, bs->rank, bs->nranks, &h);
    if (why != NULL)
        goto out_why;
    /* Bounded by the parser: WEFT_BS_ERR_LEN, or nranks addresses. */
    payload = malloc(h.size + WEFT_AUTH_MAC_BYTES);
    if (payload == NULL) {
        WEFT_WARN("out of memory allocating %llu bytes", (unsigned long long)h.size);
        res = ncclSystemError;
        goto out;
    }
    WEFT_CHECK_GOTO(weft_socket_recv_all(fd, payload, h.size + WEFT_AUTH_MAC_BYTES, deadline,
                                         bs->abort_flag, what),
                    res, out);
    weft_bs_reply_mac(bs->key, &nonces, &h, payload, mac);
    if (!weft_auth_equal(mac, payload + h.size, sizeof(mac))) {
        why = "the reply failed authentication (not our root, or another secret)";
        goto out_why;
    }
    if (h.type == WEFT_BS_REPLY_ERR) {
        payload[h.size - 1] = '\0';
        WEFT_WARN("bootstrap rank %d: the root %s failed the rendezvous: %s", bs->rank, str,
                  payload);
        res = h.tag == ncclInvalidUsage ? ncclInvalidUsage : ncclSystemError;
        goto out;
    }
    for (int i = 0; i < bs->nranks; i++) {
        union weft_sockaddr a;
        memcpy(&a, payload + i * sizeof(a), sizeof(a));
        if (!weft_socket_addr_valid(&a)) {
            WEFT_WARN("bootstrap rank %d: the root %s sent an invalid address for rank %d",
                      bs->rank, str, i);
            res = ncclSystemError;
            goto out;
        }
    }
    bs->addrs = (union weft_sockaddr *)payload; /* the table, with the MAC unused at its end */
    payload = NULL;
    goto out;
out_why:
    WEFT_WARN("bootstrap rank %d: rendezvous with the root %s failed: %s", bs->rank, str, why);
    res = ncclSystemError;
out:
    free(payload);
    weft_socket_close(&fd);
    return res;
}

static ncclResult_t weft_bs_alloc_peers(struct weft_bootstrap *bs)
{
    WEFT_CALLOC(bs->send_fd, bs->nranks);
    for (int i = 0; i < bs->nranks; i++)
        bs->send_fd[i] = -1;
    WEFT_CALLOC(bs->recv_fd, bs->nranks);
    for (int i = 0; i < bs->nranks; i++)
        bs->recv_fd[i] = -1;
    return ncclSuccess;
}

ncclResult_t weft_bootstrap_init(const ncclUniqueId *id, int rank, int nranks,
                                 volatile uint32_t *abort_flag, struct weft_bootstrap **bs_p)
{
    ncclResult_t res = ncclSuccess;
    struct weft_bootstrap *bs;
    struct weft_bs_id v;
    union weft_sockaddr me;
    char ifname[WEFT_IFNAME_LEN], str[WEFT_SOCKADDR_STRLEN];
    int fd;
    if (id == NULL || bs_p == NULL || nranks < 1 || nranks > WEFT_BS_MAX_RANKS || rank < 0 ||
        rank >= nranks) {
        WEFT_WARN("bootstrap: invalid rank %d or nranks %d", rank, nranks);
        return ncclInvalidArgument;
    }
    if (!weft_bs_id_decode(id, &v)) {
        WEFT_WARN("bootstrap rank %d: invalid unique id (zeroed, corrupted, or not made by "
                  "ncclGetUniqueId of this library)",
                  rank);
        return ncclInvalidArgument;
    }
    WEFT_CALLOC(bs, 1);
    bs->rank = rank;
    bs->nranks = nranks;
    bs->magic = v.magic;
    memcpy(bs->key, v.secret, sizeof(bs->key));
    bs->abort_flag = abort_flag;
    bs->timeout_s = weft_param_BootstrapTimeout();
    bs->listen_fd = -1;
    bs->admitted_fd = -1;
    bs->stop_fd = -1;
    bs->unexpected_tail = &bs->unexpected;
    uint64_t deadline = weft_socket_deadline(bs->timeout_s);

    WEFT_CHECK_GOTO(weft_bs_alloc_peers(bs), res, err_close);
    if ((v.flags & WEFT_BS_ID_ROOT_IN_RANK0) && rank == 0)
        WEFT_CHECK_GOTO(weft_bs_root_start(&v.root, v.magic, v.secret, bs->timeout_s), res,
                        err_close);
    WEFT_CHECK_GOTO(weft_socket_find_interface(ifname, sizeof(ifname), &me), res, err_close);
    WEFT_CHECK_GOTO(weft_socket_listen(&me, &bs->listen_fd), res, err_close);
    WEFT_CHECK_GOTO(weft_bs_admit_start(bs), res, err_close);
    WEFT_CHECK_GOTO(weft_bs_rendezvous(bs, &v.root, &me, deadline), res, err_close);
    if (nranks > 1) {
        WEFT_CHECK_GOTO(weft_bs_send_fd(bs, (rank + 1) % nranks, deadline, &fd), res, err_close);
        WEFT_CHECK_GOTO(weft_bs_recv_fd(bs, (rank + nranks - 1) % nranks, NULL, deadline, &fd), res,
                        err_close);
    }
    WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap rank %d of %d ready on %s %s", rank, nranks, ifname,
              weft_socket_addr_str(&me, str, sizeof(str)));
    *bs_p = bs;
    return ncclSuccess;
err_close:
    weft_bootstrap_close(bs);
    return res;
}

ncclResult_t weft_bootstrap_close(struct weft_bootstrap *bs)
{
    if (bs == NULL)
        return ncclSuccess;
    int dropped = 0;
    while (bs->unexpected != NULL) {
        struct weft_bs_msg *m = bs->unexpected;
        bs->unexpected = m->next;
        free(m);
        dropped++;
    }
    if (dropped > 0)
        WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap rank %d: %d messages never received", bs->rank,
                  dropped);
    weft_bs_admit_stop(bs);
    for (int i = 0; i < bs->nranks && bs->send_fd != NULL; i++)
        weft_socket_close(&bs->send_fd[i]);
    for (int i = 0; i < bs->nranks && bs->recv_fd != NULL; i++)
        weft_socket_close(&bs->recv_fd[i]);
    for (int i = 0; i < bs->npending; i++)
        close(bs->pending[i].fd);
    weft_socket_close(&bs->listen_fd);
    free(bs->pending);
    free(bs->pfds);
    memset(bs->key, 0, sizeof(bs->key));
    free(bs->send_fd);
    free(bs->recv_fd);
    free(bs->addrs);
    free(bs);
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------------
 * Collectives and point-to-point
 * ------------------------------------------------------------------------------------------- */

/*
 * Ring all-gather: in step s (0 <= s < nranks-1) each rank sends block (rank - s) to rank+1 and
 * receives block (rank - s - 1) from rank-1, both at once so no socket buffer can deadlock the
 * ring. Every message of one call carries the call's sequence number as its tag.
 */
static ncclResult_t weft_bs_ring_allgather(struct weft_bootstrap *bs, char *data, size_t size)
{
    int n = bs->nranks, rank = bs->rank;
    int32_t seq = bs->coll_seq++;
    uint64_t deadline = weft_socket_deadline(bs->timeout_s);
    for (int s = 0; s < n - 1; s++) {
        size_t send_block = (size_t)((rank - s + n) % n),
               recv_block = (size_t)((rank - s - 1 + n) % n);
        struct weft_bs_out out;
        WEFT_CHECK(weft_bs_out_start(bs, &out, (rank + 1) % n, WEFT_BS_DATA_COLL, seq,
                                     data + send_block * size, size, deadline));
        WEFT_CHECK(weft_bs_recv_msg(bs, (rank - 1 + n) % n, WEFT_BS_DATA_COLL, seq,
                                    data + recv_block * size, size, &out, deadline));
        WEFT_CHECK(weft_bs_out_finish(bs, &out, deadline));
    }
    return ncclSuccess;
}

ncclResult_t weft_bootstrap_allgather(struct weft_bootstrap *bs, void *data, size_t size)
{
    if (bs == NULL || (data == NULL && size > 0) || size > WEFT_BS_MAX_MSG) {
        WEFT_WARN("bootstrap allgather: invalid arguments (data %p size %zu)", data, size);
        return ncclInvalidArgument;
    }
    char none[1];
    return weft_bs_ring_allgather(bs, data != NULL ? data : none, size);
}

ncclResult_t weft_bootstrap_barrier(struct weft_bootstrap *bs)
{
    char none[1];
    if (bs == NULL) {
        WEFT_WARN("bootstrap barrier: NULL handle");
        return ncclInvalidArgument;
    }
    /* A rank receives the last of nranks-1 blocks only after every rank has sent its own. */
    return weft_bs_ring_allgather(bs, none, 0);
}

/* Along the ring from root: receive from rank-1, forward to rank+1 unless that is the root. */
ncclResult_t weft_bootstrap_bcast(struct weft_bootstrap *bs, int root, void *data, size_t size)
{
    if (bs == NULL || root < 0 || root >= bs->nranks || (data == NULL && size > 0) ||
        size > WEFT_BS_MAX_MSG) {
        WEFT_WARN("bootstrap bcast: invalid arguments (root %d data %p size %zu)", root, data,
                  size);
        return ncclInvalidArgument;
    }
    int n = bs->nranks, next = (bs->rank + 1) % n;
    int32_t seq = bs->coll_seq++;
    uint64_t deadline = weft_socket_deadline(bs->timeout_s);
    if (n == 1)
        return ncclSuccess;
    if (bs->rank != root)
        WEFT_CHECK(weft_bs_recv_msg(bs, (bs->rank - 1 + n) % n, WEFT_BS_DATA_COLL, seq, data, size,
                                    NULL, deadline));
    if (next != root)
        WEFT_CHECK(weft_bs_send_msg(bs, next, WEFT_BS_DATA_COLL, seq, data, size, deadline));
    return ncclSuccess;
}

ncclResult_t weft_bootstrap_send(struct weft_bootstrap *bs, int peer, int tag, const void *data,
                                 size_t size)
{
    if (bs == NULL || peer < 0 || peer >= bs->nranks || (data == NULL && size > 0) ||
        size > WEFT_BS_MAX_MSG) {
        WEFT_WARN("bootstrap send: invalid arguments (peer %d data %p size %zu)", peer, data, size);
        return ncclInvalidArgument;
    }
    return weft_bs_send_msg(bs, peer, WEFT_BS_DATA_USER, tag, data, size,
                            weft_socket_deadline(bs->timeout_s));
}

ncclResult_t weft_bootstrap_recv(struct weft_bootstrap *bs, int peer, int tag, void *data,
                                 size_t size)
{
    if (bs == NULL || peer < 0 || peer >= bs->nranks || (data == NULL && size > 0) ||
        size > WEFT_BS_MAX_MSG) {
        WEFT_WARN("bootstrap recv: invalid arguments (peer %d data %p size %zu)", peer, data, size);
        return ncclInvalidArgument;
    }
    return weft_bs_recv_msg(bs, peer, WEFT_BS_DATA_USER, tag, data, size, NULL,
                            weft_socket_deadline(bs->timeout_s));
}

/* The oldest kept user message with this tag from any peer, unlinked; NULL if none. */
static struct weft_bs_msg *weft_bs_take_any(struct weft_bootstrap *bs, int tag)
{
    for (struct weft_bs_msg **pp = &bs->unexpected; *pp != NULL; pp = &(*pp)->next) {
        struct weft_bs_msg *m = *pp;
        if (m->type != WEFT_BS_DATA_USER || m->tag != tag)
            continue;
        *pp = m->next;
        if (bs->unexpected_tail == &m->next)
            bs->unexpected_tail = pp;
        bs->unexpected_count--;
        bs->unexpected_bytes -= m->size;
        return m;
    }
    return NULL;
}

/* Reads one whole message from peer's connection fd into the kept list. */
static ncclResult_t weft_bs_keep_one(struct weft_bootstrap *bs, int peer, int fd,
                                     uint64_t deadline)
{
    char what[96];
    snprintf(what, sizeof(what), "bootstrap rank %d: message from rank %d", bs->rank, peer);
    struct weft_bs_hdr raw, h;
    WEFT_CHECK(weft_bs_read(bs, fd, &raw, sizeof(raw), NULL, deadline, what));
    const char *why = weft_bs_data_hdr_parse(&raw, sizeof(raw), bs->magic, peer, &h);
    if (why != NULL) {
        WEFT_WARN("%s: malformed header (version 0x%x type %u rank %d size %llu): %s", what,
                  raw.version, raw.type, raw.rank, (unsigned long long)raw.size, why);
        return ncclSystemError;
    }
    return weft_bs_keep(bs, peer, &h, fd, NULL, deadline, what);
}

ncclResult_t weft_bootstrap_try_recv(struct weft_bootstrap *bs, int tag, void *data, size_t size,
                                     int *peer_p, int *got_p)
{
    struct weft_bs_msg *m = weft_bs_take_any(bs, tag);
    if (m == NULL) {
        uint64_t deadline = weft_socket_deadline(bs->timeout_s);
        for (int p = 0; p < bs->nranks; p++) {
            int fd;
            while ((fd = weft_bs_link(bs, p)) >= 0) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                if (poll(&pfd, 1, 0) <= 0 || pfd.revents == 0)
                    break;
                char c;
                /* EOF: the peer closed its bootstrap (it left); not worth a warning here. */
                if (recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0 ||
                    weft_bs_keep_one(bs, p, fd, deadline) != ncclSuccess) {
                    /* Closed (the peer left) or broken: nothing more will come from it. */
                    close(fd);
                    __atomic_store_n(&bs->recv_fd[p], -1, __ATOMIC_RELEASE);
                }
            }
        }
        m = weft_bs_take_any(bs, tag);
    }
    if (m == NULL) {
        *got_p = 0;
        return ncclSuccess;
    }
    ncclResult_t res = weft_bs_check_size("bootstrap try_recv", m->size, size);
    if (res == ncclSuccess) {
        memcpy(data, m->data, size);
        *peer_p = m->peer;
        *got_p = 1;
    }
    free(m);
    return res;
}

ncclResult_t weft_bootstrap_send_brief(struct weft_bootstrap *bs, int peer, int tag,
                                       const void *data, size_t size, int timeout_ms)
{
    if (bs == NULL || peer < 0 || peer >= bs->nranks || (data == NULL && size > 0) ||
        size > WEFT_BS_MAX_MSG || timeout_ms <= 0) {
        WEFT_WARN("bootstrap send: invalid arguments (peer %d data %p size %zu timeout %d ms)", peer,
                  data, size, timeout_ms);
        return ncclInvalidArgument;
    }
    uint64_t deadline = weft_socket_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    return weft_bs_send_msg(bs, peer, WEFT_BS_DATA_USER, tag, data, size, deadline);
}
