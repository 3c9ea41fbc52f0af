/*
 * p2p transport: the CUDA executor's FIFO memory shared between processes of one host.
 *
 * Each rank owns up to two regions laid out by the executor (kernels/dev_fifo.h): one in device
 * memory of its device, and one in pinned host memory mapped for every device (for peers whose
 * device cannot reach its device). setup exports them and maps every connected peer's regions
 * into this process:
 *   - cuMem (the default; NCCL_CUMEM_ENABLE=0 turns it off): the device region comes from
 *     mem_create (cuMemCreate with the POSIX file descriptor handle type); its descriptor is
 *     passed to each peer over an abstract-namespace Unix datagram socket with SCM_RIGHTS and
 *     imported there (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess);
 *   - legacy IPC: the device region comes from malloc (cudaMalloc); its cudaIpcMemHandle_t travels
 *     in the bootstrap all-gather and peers open it (cudaIpcOpenMemHandle);
 *   - the host region always comes from mem_create(WEFT_MEM_HOST_PINNED) and travels as a
 *     descriptor, like a cuMem region.
 * A rank whose backend has no cuMem (mem_create returns 801) uses legacy IPC under the automatic
 * setting; each rank says in the all-gather which way its region went, so peers may differ.
 *
 * Wire (version 2, the bootstrap all-gather, struct weft_p2p_info): magic, version, how each
 * region is shared, its device, the legacy handle, a random nonce and the random names of its
 * sockets. Datagrams on the socket: struct weft_p2p_msg (magic, communicator hash, sender rank,
 * region, MAC) with exactly one descriptor attached.
 *
 * Strangers: abstract sockets have no permissions, and /proc/net/unix lists their names, so any
 * process of the host may send to them or bind a name first. Hence: every name is random
 * (WEFT_P2P_TOKEN_BYTES from getrandom) and travels only in the all-gather; a name already taken
 * means another random one, never a failure. Every datagram is authenticated twice: the kernel's
 * SCM_CREDENTIALS (SO_PASSCRED on every receiving socket) must name the pid the sender gave in
 * the bootstrap (where both share a PID namespace), and it carries HMAC-SHA256 under the
 * communicator's secret (weft_bootstrap_key) over both ranks' nonces and the message
 * (core/auth.h). Registration messages also carry a sequence number that must grow. Whatever
 * fails a check (malformed, unauthenticated, replayed) is dropped, its descriptor closed, with
 * an INFO line at most once a second; it never fails init or an operation.
 *
 * Registered buffers (reg_share): a socket per rank and peer (the peer's own queue of Linux's
 * 10 datagrams), bound at setup and kept until close, connected to the peer's socket for this
 * rank once the all-gather has named it (the kernel then refuses every other sender), takes
 * struct weft_p2p_reg_msg datagrams from that peer and sends this rank's to it: an offer (a
 * cuMem allocation's descriptor attached, or a legacy handle inside) or a withdrawal, of a
 * share id. A datagram a full peer queue refuses waits in this rank's list until a later
 * reg_poll; one to a peer already gone is dropped. Offers are mapped on receipt (a second offer
 * of a mapped id is refused), withdrawals unmapped: the receiver reads its socket in reg_poll
 * (the executor calls it before each direct launch and at each registration).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/auth.h"
#include "core/check.h"
#include "core/peer_info.h"
#include "core/cuda_peer.h"
#include "core/param.h"
#include "cuda/cuda_ops.h"
#include "transport.h"

WEFT_PARAM(CumemEnable, "NCCL_CUMEM_ENABLE", -2,
           "shareable device memory (device FIFOs, ncclMemAlloc): 1 cuMem (file descriptors "
           "passed over a Unix socket), 0 cudaMalloc and legacy CUDA IPC handles, -2 cuMem "
           "where the driver has it");
WEFT_PARAM_DECL(BootstrapTimeout);

#define WEFT_P2P_MAGIC 0x3270327074666577ull /* "weftp2p2" */
#define WEFT_P2P_VERSION 2
#define WEFT_P2P_TOKEN_BYTES 16 /* of a socket name's random part */
#define WEFT_P2P_BIND_TRIES 64  /* random names tried before giving up */
#define WEFT_P2P_MAX_FDS 4      /* descriptors one recvmsg takes (any beyond one: dropped) */
#define WEFT_P2P_RECV_BATCH 64  /* datagrams read between two abort and deadline checks */

struct weft_p2p_info {
    uint64_t magic;
    uint32_t version;
    int32_t dev;
    int32_t how[WEFT_DEV_NREGIONS]; /* enum weft_dev_how per region */
    struct weft_cuda_ipc_handle handle; /* legacy handle of the device region */
    uint8_t nonce[WEFT_AUTH_NONCE_BYTES]; /* random: in the MAC of every datagram to or from it */
    uint8_t fifo_name[WEFT_P2P_TOKEN_BYTES]; /* random: its FIFO descriptor socket's name */
    uint8_t reg_name[WEFT_P2P_TOKEN_BYTES];  /* random: its registration sockets' names */
};

struct weft_p2p_msg {
    uint64_t magic;
    uint64_t comm_hash;
    int32_t from;
    int32_t region;
    uint8_t mac[WEFT_AUTH_MAC_BYTES]; /* over everything before it */
};

#define WEFT_P2P_REG_MAGIC 0x3367657274666577ull /* "weftreg3" */
enum { WEFT_P2P_REG_OFFER = 1, WEFT_P2P_REG_WITHDRAW = 2 };

struct weft_p2p_reg_msg {
    uint64_t magic;
    uint64_t comm_hash;
    int32_t from;
    int32_t kind; /* WEFT_P2P_REG_* */
    int32_t how;  /* offer: enum weft_dev_how */
    int32_t dev;  /* offer: the allocating device */
    uint64_t id;
    uint64_t bytes;
    uint64_t seq; /* per sender and receiver, from 1: a receiver takes only a larger one */
    struct weft_cuda_ipc_handle handle; /* offer, WEFT_DEV_HOW_LEGACY */
    uint8_t mac[WEFT_AUTH_MAC_BYTES];   /* over everything before it */
};

/* A datagram still to send (fd: its descriptor, or -1), or a peer's allocation mapped here. */
struct weft_p2p_reg {
    struct weft_p2p_reg *next;
    int peer;
    int fd;
    int how;
    uint64_t id;
    void *mem;
    struct weft_p2p_reg_msg msg;
};

struct weft_p2p_state {
    int nranks;
    void **imports; /* [nranks * WEFT_DEV_NREGIONS]: what this rank mapped */
    int *import_how;
    struct weft_p2p_info *info; /* [nranks]: every rank's (socket names, nonces) */
    uint8_t key[WEFT_AUTH_KEY_BYTES]; /* the communicator's secret (weft_bootstrap_key) */
    uint64_t *seq_out, *seq_in; /* [nranks]: registration messages sent to, taken from */
    uint64_t drops;             /* datagrams dropped since the last INFO line about them */
    double drop_logged;         /* when that line was written */
    /* Registered buffers: under lock (ncclCommRegister's thread and the launching one). */
    pthread_mutex_t lock;
    int reg_on;            /* 1: some peer is connected (registration messages go out) */
    int *reg_in;           /* [nranks]: the socket for that peer, or -1: takes its messages (its
                            * own queue) and sends to it; connected to the peer's for this rank,
                            * so the kernel refuses any other sender */
    uint8_t *reg_peer;     /* [nranks]: offers go there */
    struct weft_p2p_reg *outbox, *mapped;
};

static int p2p_can_connect(const struct weft_transport_ctx *ctx, int a, int b)
{
    const struct weft_peer_info *pa = &ctx->peers[a], *pb = &ctx->peers[b];
    int same_process = pa->pid == pb->pid && pa->pid_ns == pb->pid_ns;
    return pa->host_hash == pb->host_hash && !same_process && pa->cuda_dev >= 0 &&
           pb->cuda_dev >= 0;
}

static ncclResult_t p2p_mem_alloc(const struct weft_transport_ctx *ctx, size_t bytes, int region, void **p_p,
                                  int *how_p)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int64_t knob = weft_param_CumemEnable();
    int err;
    if (region == WEFT_DEV_REGION_HOST) {
        err = ops->mem_create(p_p, bytes, WEFT_MEM_HOST_PINNED);
        if (err == 0)
            *how_p = WEFT_DEV_HOW_FD;
    } else {
        err = WEFT_CUDA_ERR_NOT_SUPPORTED;
        if (knob != 0) {
            err = ops->mem_create(p_p, bytes, WEFT_MEM_DEVICE);
            if (err == 0)
                *how_p = WEFT_DEV_HOW_FD;
            else if (err == WEFT_CUDA_ERR_NOT_SUPPORTED && knob < 0)
                WEFT_INFO(WEFT_LOG_INIT, "rank %d: no cuMem here; legacy CUDA IPC for the FIFOs",
                          ctx->rank);
        }
        if (err == WEFT_CUDA_ERR_NOT_SUPPORTED && knob <= 0) {
            err = ops->malloc(p_p, bytes);
            if (err == 0)
                *how_p = WEFT_DEV_HOW_LEGACY;
        }
    }
    if (err != 0) {
        WEFT_WARN("rank %d: %zu bytes of shareable %s memory for the FIFOs: %s (%d)", ctx->rank,
                  bytes, region == WEFT_DEV_REGION_HOST ? "host" : "device", ops->error_string(err),
                  err);
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

static ncclResult_t p2p_mem_free(void *p, int how)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int err = how == WEFT_DEV_HOW_LEGACY ? ops->free(p) : ops->mem_release(p);
    if (err != 0) {
        WEFT_WARN("freeing FIFO memory %p: %s (%d)", p, ops->error_string(err), err);
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

static double p2p_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The name "weft-<kind>-<token in hex>[-<from>]" in the abstract namespace (leading NUL: nothing
 * in the file system, gone with the socket). */
static void p2p_sock_name(struct sockaddr_un *a, socklen_t *len, const char *kind,
                          const uint8_t token[WEFT_P2P_TOKEN_BYTES], int from)
{
    char hex[2 * WEFT_P2P_TOKEN_BYTES + 1];
    for (int i = 0; i < WEFT_P2P_TOKEN_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", token[i]);
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    int n = from < 0 ? snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "weft-%s-%s", kind, hex)
                     : snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "weft-%s-%s-%d", kind,
                                hex, from);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void p2p_close_all(int *socks, int n)
{
    for (int i = 0; i < n; i++)
        if (socks[i] >= 0) {
            close(socks[i]);
            socks[i] = -1;
        }
}

/*
 * Binds socks[i] for every i < n with use[i] set (socks[0] alone when use is NULL; from -1 in
 * its name) under one random token, each with SO_PASSCRED. A name taken (by another process of
 * this host: they can all bind abstract names) means a fresh token for all, not a failure.
 */
static ncclResult_t p2p_bind(const struct weft_transport_ctx *ctx, const char *kind, int *socks,
                             const uint8_t *use, int n, uint8_t token[WEFT_P2P_TOKEN_BYTES])
{
    for (int attempt = 0; attempt < WEFT_P2P_BIND_TRIES; attempt++) {
        WEFT_CHECK(weft_auth_random(token, WEFT_P2P_TOKEN_BYTES));
        int taken = 0;
        for (int i = 0; i < n && !taken; i++) {
            if (use != NULL && !use[i])
                continue;
            struct sockaddr_un a;
            socklen_t alen;
            int one = 1;
            p2p_sock_name(&a, &alen, kind, token, use != NULL ? i : -1);
            socks[i] = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            if (socks[i] >= 0 &&
                setsockopt(socks[i], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) == 0 &&
                bind(socks[i], (struct sockaddr *)&a, alen) == 0)
                continue;
            int err = errno;
            if (err != EADDRINUSE) {
                WEFT_WARN("rank %d: the p2p socket @%s: %s", ctx->rank, a.sun_path + 1,
                          strerror(err));
                p2p_close_all(socks, n);
                return ncclSystemError;
            }
            WEFT_INFO(WEFT_LOG_INIT, "rank %d: the p2p socket name @%s is taken (another "
                      "process of this host?); trying another", ctx->rank, a.sun_path + 1);
            taken = 1;
        }
        if (!taken)
            return ncclSuccess;
        p2p_close_all(socks, n);
    }
    WEFT_WARN("rank %d: %d random names for the p2p %s sockets were all taken", ctx->rank,
              WEFT_P2P_BIND_TRIES, kind);
    return ncclSystemError;
}

/* One datagram of len bytes to `to` (NULL: the socket's connected peer), descriptor fd attached
 * (-1: none), without blocking: 1 sent, 0 the peer's queue is full (try again after reading
 * ours), -1 failed (errno says why). */
static int p2p_dgram_send(int sock, const struct sockaddr_un *to, socklen_t tolen,
                          const void *buf, size_t len, int fd)
{
    struct iovec iov = {(void *)buf, len};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    memset(&u, 0, sizeof(u));
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_name = (void *)to;
    m.msg_namelen = tolen;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (fd >= 0) {
        m.msg_control = u.buf;
        m.msg_controllen = sizeof(u.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    if (sendmsg(sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len)
        return 1;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOBUFS ? 0 : -1;
}

/*
 * One waiting datagram into buf: its length, or -1 (errno; EAGAIN: none waiting); *fd_p the
 * descriptor it carried, or -1; *pid_p the sender's pid from the kernel (SCM_CREDENTIALS), or 0.
 * A datagram longer than len, or with more than one descriptor, reads as length 0 with every
 * descriptor closed (whoever sent it, it is none of ours).
 */
static ssize_t p2p_dgram_recv(int sock, void *buf, size_t len, int *fd_p, pid_t *pid_p)
{
    struct iovec iov = {buf, len};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(WEFT_P2P_MAX_FDS * sizeof(int))];
    } u;
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof(u.buf);
    *fd_p = -1;
    *pid_p = 0;
    ssize_t n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return -1;
    int nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET)
            continue;
        if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred cred;
            memcpy(&cred, CMSG_DATA(c), sizeof(cred));
            *pid_p = cred.pid;
        } else if (c->cmsg_type == SCM_RIGHTS) {
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                if (nfds++ == 0)
                    *fd_p = fd;
                else
                    close(fd);
            }
        }
    }
    if (nfds > 1 || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
        if (*fd_p >= 0)
            close(*fd_p);
        *fd_p = -1;
        return 0;
    }
    return n;
}

/* HMAC-SHA256 of a datagram (len bytes before its MAC) from rank `from` to rank `to`. */
static void p2p_mac(const struct weft_p2p_state *st, const char *label, int from, int to,
                    const void *msg, size_t len, uint8_t mac[WEFT_AUTH_MAC_BYTES])
{
    weft_auth_mac(st->key, label, st->info[to].nonce, st->info[from].nonce, msg, len, mac);
}

/* 1 when rank `from` (a peer of this communicator in another process) sent the datagram: the
 * kernel's pid where it means the same here as there, and the MAC. */
static int p2p_authentic(const struct weft_transport_ctx *ctx, const struct weft_p2p_state *st,
                         const char *label, int from, pid_t pid, const void *msg, size_t len,
                         const uint8_t *mac)
{
    if (from < 0 || from >= st->nranks || from == ctx->rank)
        return 0;
    const struct weft_peer_info *peer = &ctx->peers[from], *me = &ctx->peers[ctx->rank];
    if (peer->pid_ns != 0 && peer->pid_ns == me->pid_ns && pid != peer->pid)
        return 0;
    uint8_t want[WEFT_AUTH_MAC_BYTES];
    p2p_mac(st, label, from, ctx->rank, msg, len, want);
    return weft_auth_equal(want, mac, sizeof(want));
}

/* A datagram no peer sent (or not as it came): dropped; an INFO line at most once a second. */
static void p2p_drop(const struct weft_transport_ctx *ctx, struct weft_p2p_state *st, const char *what,
                     ssize_t len, pid_t pid)
{
    st->drops++;
    double now = p2p_now();
    if (st->drop_logged != 0 && now - st->drop_logged < 1.0)
        return;
    WEFT_INFO(WEFT_LOG_INIT, "rank %d: dropped %llu datagram(s) on the p2p %s sockets that no "
              "peer of this communicator sent (the latest %zd bytes from pid %d): another process "
              "of this host?", ctx->rank, (unsigned long long)st->drops, what, len, (int)pid);
    st->drops = 0;
    st->drop_logged = now;
}

/*
 * Sends this rank's descriptors to every connected peer and receives theirs (fds[p*R + r]),
 * without deadlock: sends never block, and a rank whose peer's queue is full reads its own queue
 * before trying again. Bounded by the bootstrap deadline and the abort flag.
 */
static ncclResult_t p2p_exchange_fds(const struct weft_transport_ctx *ctx, struct weft_p2p_state *st, int sock,
                                     const int *my_fds, const uint8_t *want, int *fds)
{
    const struct weft_p2p_info *info = st->info;
    int n = ctx->nranks, me = ctx->rank, R = WEFT_DEV_NREGIONS;
    int to_send = 0, to_recv = 0;
    uint8_t *sent = calloc((size_t)n * R, 1);
    if (sent == NULL)
        return ncclSystemError;
    for (int p = 0; p < n; p++)
        for (int r = 0; r < R; r++) {
            if (!want[p * R + r])
                continue;
            to_send += my_fds[r] >= 0;
            to_recv += info[p].how[r] == WEFT_DEV_HOW_FD;
        }
    int64_t limit = weft_param_BootstrapTimeout();
    double deadline = limit > 0 ? p2p_now() + (double)limit : 0;
    ncclResult_t res = ncclSuccess;
    while (to_send > 0 || to_recv > 0) {
        int progress = 0;
        for (int p = 0; p < n && res == ncclSuccess; p++) {
            for (int r = 0; r < R; r++) {
                if (!want[p * R + r] || my_fds[r] < 0 || sent[p * R + r])
                    continue;
                struct sockaddr_un to;
                socklen_t tolen;
                p2p_sock_name(&to, &tolen, "p2p", info[p].fifo_name, -1);
                struct weft_p2p_msg msg;
                memset(&msg, 0, sizeof(msg));
                msg.magic = WEFT_P2P_MAGIC;
                msg.comm_hash = ctx->comm_hash;
                msg.from = me;
                msg.region = r;
                p2p_mac(st, "p2p-fifo", me, p, &msg, offsetof(struct weft_p2p_msg, mac), msg.mac);
                int got = p2p_dgram_send(sock, &to, tolen, &msg, sizeof(msg), my_fds[r]);
                if (got < 0) {
                    WEFT_WARN("rank %d: passing FIFO memory to rank %d (host %s): sendmsg failed: "
                              "%s", me, p, ctx->peers[p].hostname, strerror(errno));
                    res = ncclRemoteError;
                    break;
                }
                if (got == 1) {
                    sent[p * R + r] = 1;
                    to_send--;
                    progress = 1;
                }
            }
        }
        for (int k = 0; k < WEFT_P2P_RECV_BATCH && res == ncclSuccess; k++) {
            struct weft_p2p_msg msg;
            int fd = -1;
            pid_t pid = 0;
            ssize_t got = p2p_dgram_recv(sock, &msg, sizeof(msg), &fd, &pid);
            if (got < 0) {
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    WEFT_WARN("rank %d: reading the p2p socket: %s", me, strerror(errno));
                    res = ncclSystemError;
                }
                break;
            }
            if (got != (ssize_t)sizeof(msg) || fd < 0 || msg.magic != WEFT_P2P_MAGIC ||
                msg.comm_hash != ctx->comm_hash ||
                !p2p_authentic(ctx, st, "p2p-fifo", msg.from, pid, &msg,
                               offsetof(struct weft_p2p_msg, mac), msg.mac)) {
                if (fd >= 0)
                    close(fd);
                p2p_drop(ctx, st, "FIFO", got, pid);
                continue;
            }
            /* From the peer itself: anything unexpected is a bug of ours, not a stranger. */
            if (msg.region < 0 || msg.region >= R || !want[msg.from * R + msg.region] ||
                info[msg.from].how[msg.region] != WEFT_DEV_HOW_FD ||
                fds[msg.from * R + msg.region] >= 0) {
                WEFT_WARN("rank %d: unexpected FIFO descriptor from rank %d region %d", me,
                          msg.from, msg.region);
                close(fd);
                res = ncclRemoteError;
                break;
            }
            fds[msg.from * R + msg.region] = fd;
            to_recv--;
            progress = 1;
        }
        if (res != ncclSuccess)
            break;
        if (__atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE)) {
            WEFT_WARN("rank %d: communicator aborted while passing FIFO memory", me);
            res = ncclInvalidUsage;
            break;
        }
        if (deadline > 0 && p2p_now() > deadline) {
            WEFT_WARN("rank %d: passing FIFO memory between processes: %d descriptors still to "
                      "send and %d to receive after %lld s (WEFT_BOOTSTRAP_TIMEOUT)", me, to_send,
                      to_recv, (long long)limit);
            res = ncclRemoteError;
            break;
        }
        if (!progress) {
            struct pollfd pf = {sock, POLLIN, 0};
            poll(&pf, 1, 1);
        }
    }
    free(sent);
    return res;
}

/* Unmaps the peers' FIFO regions still mapped (drain does it first, close whatever is left). */
static ncclResult_t p2p_unmap_imports(const struct weft_transport_ctx *ctx, struct weft_p2p_state *st)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < st->nranks * WEFT_DEV_NREGIONS; i++) {
        if (st->imports[i] == NULL)
            continue;
        int err = st->import_how[i] == WEFT_DEV_HOW_LEGACY ? ops->ipc_close_handle(st->imports[i])
                                                           : ops->mem_release(st->imports[i]);
        if (err != 0 && res == ncclSuccess) {
            WEFT_WARN("rank %d: unmapping a peer's FIFO memory %p: %s (%d)", ctx->rank,
                      st->imports[i], ops->error_string(err), err);
            res = ncclUnhandledCudaError;
        }
        st->imports[i] = NULL;
    }
    return res;
}

static ncclResult_t p2p_close(const struct weft_transport_ctx *ctx, void *state)
{
    struct weft_p2p_state *st = state;
    if (st == NULL)
        return ncclSuccess;
    const struct weft_cuda_ops *ops = weft_cuda();
    ncclResult_t res = p2p_unmap_imports(ctx, st);
    while (st->outbox != NULL) {
        struct weft_p2p_reg *r = st->outbox;
        st->outbox = r->next;
        if (r->fd >= 0)
            close(r->fd);
        free(r);
    }
    while (st->mapped != NULL) {
        struct weft_p2p_reg *r = st->mapped;
        st->mapped = r->next;
        if (r->how == WEFT_DEV_HOW_LEGACY)
            ops->ipc_close_handle(r->mem);
        else
            ops->mem_release(r->mem);
        free(r);
    }
    for (int p = 0; st->reg_in != NULL && p < st->nranks; p++)
        if (st->reg_in[p] >= 0)
            close(st->reg_in[p]);
    free(st->reg_in);
    free(st->seq_out);
    free(st->seq_in);
    free(st->info);
    pthread_mutex_destroy(&st->lock);
    free(st->reg_peer);
    free(st->imports);
    free(st->import_how);
    free(st);
    return res;
}

/* Unmaps the peers' FIFO regions, then, where any rank shares its device region by a legacy
 * handle, a barrier: past it no peer maps this rank's regions any more. Where a barrier cannot be
 * had (abort, several ranks in one process, the deadline) it fails: legacy memory is kept. */
static ncclResult_t p2p_drain(const struct weft_transport_ctx *ctx, void *state)
{
    struct weft_p2p_state *st = state;
    if (st == NULL)
        return ncclSuccess;
    ncclResult_t res = p2p_unmap_imports(ctx, st);
    int legacy = 0;
    for (int p = 0; p < st->nranks; p++)
        legacy |= st->info[p].how[WEFT_DEV_REGION_DEVICE] == WEFT_DEV_HOW_LEGACY;
    if (!legacy)
        return ncclSuccess; /* cuMem and memfd regions live on while a peer maps them */
    /* Several ranks in one process are often destroyed one after another by one thread (as
     * nccl-tests does): a barrier of all ranks would wait for a rank not destroyed yet. The same
     * answer on every rank (from the exchanged peer info). */
    for (int p = 0; p < st->nranks; p++) {
        for (int q = p + 1; q < st->nranks; q++) {
            const struct weft_peer_info *a = &ctx->peers[p], *b = &ctx->peers[q];
            if (a->host_hash == b->host_hash && a->pid == b->pid && a->pid_ns == b->pid_ns) {
                WEFT_INFO(WEFT_LOG_INIT, "rank %d: ranks %d and %d share a process: no barrier "
                          "at free; legacy IPC FIFO memory is kept (not freed under peers that "
                          "may still map it)", ctx->rank, p, q);
                return ncclInvalidUsage;
            }
        }
    }
    if (__atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE)) {
        WEFT_INFO(WEFT_LOG_INIT, "rank %d: aborted: legacy IPC FIFO memory is kept (not freed "
                  "under peers that may still map it)", ctx->rank);
        return ncclRemoteError;
    }
    ncclResult_t bres = weft_bootstrap_barrier(ctx->bootstrap);
    if (bres != ncclSuccess) {
        WEFT_WARN("rank %d: the peers did not all unmap this rank's legacy IPC FIFO memory "
                  "(barrier: %s): it is kept, not freed under them", ctx->rank,
                  ncclGetErrorString(bres));
        return bres;
    }
    return res;
}

static ncclResult_t p2p_setup(const struct weft_transport_ctx *ctx, void *const *mine, const int *mine_how,
                              size_t bytes, const uint8_t *want, void **theirs, void **state_p)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int n = ctx->nranks, me = ctx->rank, R = WEFT_DEV_NREGIONS;
    ncclResult_t res = ncclSuccess;
    int sock = -1;
    int my_fds[WEFT_DEV_NREGIONS];
    struct weft_p2p_info *info = NULL;
    int *fds = malloc((size_t)n * R * sizeof(int));
    struct weft_p2p_state *st = calloc(1, sizeof(*st));
    if (st != NULL) {
        st->nranks = n;
        st->info = info = calloc((size_t)n, sizeof(*info));
        st->seq_out = calloc((size_t)n, sizeof(uint64_t));
        st->seq_in = calloc((size_t)n, sizeof(uint64_t));
        memcpy(st->key, weft_bootstrap_key(ctx->bootstrap), sizeof(st->key));
        st->imports = calloc((size_t)n * R, sizeof(void *));
        st->import_how = calloc((size_t)n * R, sizeof(int));
        st->reg_peer = calloc((size_t)n, 1);
        st->reg_in = malloc((size_t)n * sizeof(int));
        for (int p = 0; st->reg_in != NULL && p < n; p++)
            st->reg_in[p] = -1;
        pthread_mutex_init(&st->lock, NULL);
    }
    for (int r = 0; r < R; r++)
        my_fds[r] = -1;
    if (info == NULL || fds == NULL || st == NULL || st->imports == NULL ||
        st->import_how == NULL || st->reg_peer == NULL || st->reg_in == NULL ||
        st->seq_out == NULL || st->seq_in == NULL) {
        WEFT_WARN("rank %d: out of memory for the p2p transport", me);
        res = ncclSystemError;
        goto out;
    }
    for (int i = 0; i < n * R; i++)
        fds[i] = -1;
    info[me].magic = WEFT_P2P_MAGIC;
    info[me].version = WEFT_P2P_VERSION;
    info[me].dev = ctx->cuda_dev;
    WEFT_CHECK_GOTO(weft_auth_random(info[me].nonce, sizeof(info[me].nonce)), res, out);
    int any_peer = 0, any_fd = 0;
    for (int i = 0; i < n * R; i++)
        any_peer |= want[i] != 0;
    for (int r = 0; r < R; r++) {
        info[me].how[r] = mine[r] == NULL || !any_peer ? WEFT_DEV_HOW_NONE : mine_how[r];
        if (info[me].how[r] == WEFT_DEV_HOW_FD) {
            int err = ops->mem_export(&my_fds[r], mine[r]);
            if (err != 0) {
                WEFT_WARN("rank %d: exporting FIFO memory %p: %s (%d)", me, mine[r],
                          ops->error_string(err), err);
                res = ncclUnhandledCudaError;
                goto out;
            }
        } else if (info[me].how[r] == WEFT_DEV_HOW_LEGACY) {
            int err = ops->ipc_get_handle(&info[me].handle, mine[r]);
            if (err != 0) {
                WEFT_WARN("rank %d: cudaIpcGetMemHandle on FIFO memory %p: %s (%d)", me, mine[r],
                          ops->error_string(err), err);
                res = ncclUnhandledCudaError;
                goto out;
            }
        }
    }
    /* The sockets are bound before the all-gather, so every peer's is there once it returns;
     * their random names travel in it. */
    if (any_peer) {
        WEFT_CHECK_GOTO(p2p_bind(ctx, "p2p", &sock, NULL, 1, info[me].fifo_name), res, out);
        for (int p = 0; p < n; p++)
            st->reg_peer[p] = want[p * R] || want[p * R + 1];
        WEFT_CHECK_GOTO(p2p_bind(ctx, "reg", st->reg_in, st->reg_peer, n, info[me].reg_name),
                        res, out);
    }
    /* Every rank takes part, connected or not: the all-gather is collective. */
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(ctx->bootstrap, info, sizeof(*info)), res, out);
    for (int p = 0; p < n; p++) {
        if (!want[p * R] && !want[p * R + 1])
            continue;
        if (info[p].magic != WEFT_P2P_MAGIC || info[p].version != WEFT_P2P_VERSION) {
            WEFT_WARN("rank %d: rank %d (host %s) runs another p2p transport (version %u)", me, p,
                      ctx->peers[p].hostname, info[p].version);
            res = ncclInvalidUsage;
            goto out;
        }
        for (int r = 0; r < R; r++)
            any_fd |= want[p * R + r] && (info[p].how[r] == WEFT_DEV_HOW_FD || my_fds[r] >= 0);
    }
    /* Each registration socket pairs with the peer's for this rank: the kernel then takes
     * datagrams from that socket alone (others get EPERM), and sends go to it, not to a name. */
    for (int p = 0; p < n; p++) {
        if (!st->reg_peer[p])
            continue;
        struct sockaddr_un a;
        socklen_t alen;
        p2p_sock_name(&a, &alen, "reg", info[p].reg_name, me);
        if (connect(st->reg_in[p], (struct sockaddr *)&a, alen) != 0) {
            WEFT_WARN("rank %d: connecting the p2p registration socket to rank %d's @%s (host "
                      "%s): %s", me, p, a.sun_path + 1, ctx->peers[p].hostname,
                      strerror(errno));
            res = ncclRemoteError;
            goto out;
        }
        st->reg_on = 1;
    }
    if (any_fd)
        WEFT_CHECK_GOTO(p2p_exchange_fds(ctx, st, sock, my_fds, want, fds), res, out);
    for (int p = 0; p < n; p++) {
        for (int r = 0; r < R; r++) {
            if (!want[p * R + r])
                continue;
            int how = info[p].how[r], err = 0;
            void *m = NULL;
            if (how == WEFT_DEV_HOW_FD)
                err = ops->mem_import(&m, fds[p * R + r], bytes,
                                      r == WEFT_DEV_REGION_HOST ? WEFT_MEM_HOST_PINNED
                                                                : WEFT_MEM_DEVICE,
                                      weft_cuda_peer_device(ctx, p));
            else if (how == WEFT_DEV_HOW_LEGACY)
                err = ops->ipc_open_handle(&m, &info[p].handle);
            else
                err = WEFT_CUDA_ERR_INVALID_VALUE; /* a peer without the region it must have */
            if (err != 0) {
                WEFT_WARN("rank %d: mapping the %s FIFO memory of rank %d (device %d, %s): %s (%d)",
                          me, r == WEFT_DEV_REGION_HOST ? "host" : "device", p, info[p].dev,
                          how == WEFT_DEV_HOW_FD ? "cuMem" : "legacy IPC", ops->error_string(err),
                          err);
                res = ncclUnhandledCudaError;
                goto out;
            }
            st->imports[p * R + r] = m;
            st->import_how[p * R + r] = how;
        }
    }
    for (int p = 0; p < n; p++)
        for (int r = 0; r < R; r++)
            theirs[p * R + r] = st->imports[p * R + r];
    *state_p = st;
    st = NULL;
    WEFT_INFO(WEFT_LOG_INIT, "rank %d: p2p: FIFO memory shared with the other processes (%s)", me,
              mine_how[0] == WEFT_DEV_HOW_LEGACY ? "legacy IPC" : "cuMem, descriptors");
out:
    if (sock >= 0)
        close(sock);
    for (int r = 0; r < R; r++)
        if (my_fds[r] >= 0)
            close(my_fds[r]);
    if (fds != NULL)
        for (int i = 0; i < n * R; i++)
            if (fds[i] >= 0)
                close(fds[i]);
    free(fds);
    if (st != NULL)
        p2p_close(ctx, st);
    return res;
}

/* Sends r's datagram: 1 sent (or dropped: the peer is gone), 0 its queue is full. */
static int p2p_reg_send(const struct weft_transport_ctx *ctx, struct weft_p2p_state *st, struct weft_p2p_reg *r)
{
    /* To the peer's socket itself (connected), never by name: once the peer is gone, anyone may
     * bind its name, and an offer carries a descriptor of this rank's memory. */
    int got = p2p_dgram_send(st->reg_in[r->peer], NULL, 0, &r->msg, sizeof(r->msg), r->fd);
    if (got >= 0)
        return got;
    /* Gone (its communicator destroyed): it will run no collective that needs this. */
    WEFT_INFO(WEFT_LOG_REG, "rank %d: registration message to rank %d dropped: %s", ctx->rank,
              r->peer, strerror(errno));
    return 1;
}

/* Under st->lock: sends what waits, in order, while peers take it. */
static void p2p_reg_flush(const struct weft_transport_ctx *ctx, struct weft_p2p_state *st)
{
    for (struct weft_p2p_reg **it = &st->outbox; *it != NULL;) {
        struct weft_p2p_reg *r = *it;
        if (!p2p_reg_send(ctx, st, r)) {
            it = &r->next;
            continue;
        }
        *it = r->next;
        if (r->fd >= 0)
            close(r->fd);
        free(r);
    }
}

/* Under st->lock: queues msg for every connected peer (each with its own copy of fd). */
static int p2p_reg_post(const struct weft_transport_ctx *ctx, struct weft_p2p_state *st,
                        const struct weft_p2p_reg_msg *msg, int fd)
{
    struct weft_p2p_reg **tail = &st->outbox;
    while (*tail != NULL)
        tail = &(*tail)->next;
    for (int p = 0; p < st->nranks; p++) {
        if (!st->reg_peer[p])
            continue;
        struct weft_p2p_reg *r = calloc(1, sizeof(*r));
        if (r == NULL) {
            WEFT_WARN("rank %d: out of memory offering a registered buffer", ctx->rank);
            return WEFT_CUDA_ERR_OUT_OF_MEMORY;
        }
        r->peer = p;
        r->msg = *msg;
        r->msg.seq = ++st->seq_out[p];
        p2p_mac(st, "p2p-reg", ctx->rank, p, &r->msg, offsetof(struct weft_p2p_reg_msg, mac),
                r->msg.mac);
        r->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
        if (fd >= 0 && r->fd < 0) {
            WEFT_WARN("rank %d: dup of a registered buffer's descriptor: %s", ctx->rank,
                      strerror(errno));
            free(r);
            return WEFT_CUDA_ERR_INVALID_VALUE;
        }
        *tail = r;
        tail = &r->next;
    }
    p2p_reg_flush(ctx, st);
    return 0;
}

static void p2p_reg_msg_init(const struct weft_transport_ctx *ctx, struct weft_p2p_reg_msg *msg, int kind,
                             uint64_t id)
{
    memset(msg, 0, sizeof(*msg));
    msg->magic = WEFT_P2P_REG_MAGIC;
    msg->comm_hash = ctx->comm_hash;
    msg->from = ctx->rank;
    msg->kind = kind;
    msg->id = id;
}

static int p2p_reg_share(const struct weft_transport_ctx *ctx, void *state, uint64_t id, void *base,
                         size_t bytes, int how)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    struct weft_p2p_state *st = state;
    if (st == NULL || !st->reg_on)
        return 0;
    struct weft_p2p_reg_msg msg;
    p2p_reg_msg_init(ctx, &msg, WEFT_P2P_REG_OFFER, id);
    msg.how = how;
    msg.dev = ctx->cuda_dev;
    msg.bytes = bytes;
    int fd = -1, err;
    if (how == WEFT_DEV_HOW_FD)
        err = ops->mem_export(&fd, base);
    else
        err = ops->ipc_get_handle(&msg.handle, base);
    if (err != 0)
        return err;
    pthread_mutex_lock(&st->lock);
    err = p2p_reg_post(ctx, st, &msg, fd);
    pthread_mutex_unlock(&st->lock);
    if (fd >= 0)
        close(fd);
    return err;
}

static void p2p_reg_unshare(const struct weft_transport_ctx *ctx, void *state, uint64_t id)
{
    struct weft_p2p_state *st = state;
    if (st == NULL || !st->reg_on)
        return;
    struct weft_p2p_reg_msg msg;
    p2p_reg_msg_init(ctx, &msg, WEFT_P2P_REG_WITHDRAW, id);
    pthread_mutex_lock(&st->lock);
    /* An offer still waiting for a peer goes first (the queue keeps order). */
    p2p_reg_post(ctx, st, &msg, -1);
    pthread_mutex_unlock(&st->lock);
}

/* Under st->lock: 1 when peer's allocation id is mapped here. */
static int p2p_reg_mapped(const struct weft_p2p_state *st, int peer, uint64_t id)
{
    for (const struct weft_p2p_reg *r = st->mapped; r != NULL; r = r->next)
        if (r->peer == peer && r->id == id)
            return 1;
    return 0;
}

static void p2p_reg_poll(const struct weft_transport_ctx *ctx, void *state,
                         int (*seen)(void *arg, int peer, uint64_t id, void *base, size_t bytes),
                         void *arg)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    struct weft_p2p_state *st = state;
    if (st == NULL || !st->reg_on)
        return;
    pthread_mutex_lock(&st->lock);
    p2p_reg_flush(ctx, st);
    for (int p = 0, k = 0; p < st->nranks;) {
        struct weft_p2p_reg_msg msg;
        int fd = -1;
        pid_t pid = 0;
        /* a bounded batch per peer: a stranger's flood does not hold this thread */
        ssize_t got = st->reg_in[p] >= 0 && k < WEFT_P2P_RECV_BATCH
                          ? p2p_dgram_recv(st->reg_in[p], &msg, sizeof(msg), &fd, &pid)
                          : -1;
        if (got < 0) {
            p++; /* this peer's queue is empty */
            k = 0;
            continue;
        }
        k++;
        int ok = got == (ssize_t)sizeof(msg) && msg.magic == WEFT_P2P_REG_MAGIC &&
                 msg.comm_hash == ctx->comm_hash && msg.from == p &&
                 p2p_authentic(ctx, st, "p2p-reg", msg.from, pid, &msg,
                               offsetof(struct weft_p2p_reg_msg, mac), msg.mac) &&
                 msg.seq > st->seq_in[p]; /* a replay of one of p's is no news */
        if (ok)
            st->seq_in[p] = msg.seq;
        if (!ok) {
            p2p_drop(ctx, st, "registration", got, pid);
        } else if (msg.kind == WEFT_P2P_REG_WITHDRAW) {
            for (struct weft_p2p_reg **it = &st->mapped; *it != NULL; it = &(*it)->next) {
                struct weft_p2p_reg *r = *it;
                if (r->peer != msg.from || r->id != msg.id)
                    continue;
                seen(arg, r->peer, r->id, NULL, 0);
                *it = r->next;
                if (r->how == WEFT_DEV_HOW_LEGACY)
                    ops->ipc_close_handle(r->mem);
                else
                    ops->mem_release(r->mem);
                free(r);
                break;
            }
        } else if (p2p_reg_mapped(st, msg.from, msg.id)) {
            WEFT_INFO(WEFT_LOG_REG, "rank %d: rank %d offered its registered buffer %llu again "
                      "without withdrawing it: refused", ctx->rank, msg.from,
                      (unsigned long long)msg.id);
        } else {
            void *mem = NULL;
            int err = msg.how == WEFT_DEV_HOW_FD && fd >= 0
                          ? ops->mem_import(&mem, fd, msg.bytes, WEFT_MEM_DEVICE,
                                            weft_cuda_peer_device(ctx, msg.from))
                      : msg.how == WEFT_DEV_HOW_LEGACY ? ops->ipc_open_handle(&mem, &msg.handle)
                                                       : WEFT_CUDA_ERR_INVALID_VALUE;
            struct weft_p2p_reg *r = err == 0 ? calloc(1, sizeof(*r)) : NULL;
            if (err != 0) {
                /* Not fatal: collectives on that buffer take the normal path. */
                WEFT_INFO(WEFT_LOG_REG, "rank %d: mapping rank %d's registered buffer (%s, %llu "
                          "bytes): %s (%d)", ctx->rank, msg.from,
                          msg.how == WEFT_DEV_HOW_FD ? "cuMem" : "legacy IPC",
                          (unsigned long long)msg.bytes, ops->error_string(err), err);
            } else if (r == NULL || !seen(arg, msg.from, msg.id, mem, msg.bytes)) {
                if (msg.how == WEFT_DEV_HOW_LEGACY)
                    ops->ipc_close_handle(mem);
                else
                    ops->mem_release(mem);
                free(r);
            } else {
                r->peer = msg.from;
                r->id = msg.id;
                r->how = msg.how;
                r->mem = mem;
                r->fd = -1;
                r->next = st->mapped;
                st->mapped = r;
            }
        }
        if (fd >= 0)
            close(fd);
    }
    pthread_mutex_unlock(&st->lock);
}

const struct weft_dev_transport weft_dev_transport_p2p = {
    .version = WEFT_DEV_TRANSPORT_VERSION,
    .name = "p2p",
    .can_connect = p2p_can_connect,
    .mem_alloc = p2p_mem_alloc,
    .mem_free = p2p_mem_free,
    .setup = p2p_setup,
    .close = p2p_close,
    .reg_share = p2p_reg_share,
    .reg_unshare = p2p_reg_unshare,
    .reg_poll = p2p_reg_poll,
    .drain = p2p_drain,
};
