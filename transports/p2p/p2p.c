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
 * Wire (version 1, the bootstrap all-gather, struct weft_p2p_info): magic, version, how each
 * region is shared, its device, the legacy handle. Datagrams on the socket: struct weft_p2p_msg
 * (magic, communicator hash, sender rank, region) with exactly one descriptor attached.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/param.h"
#include "cuda/cuda_ops.h"
#include "transport.h"

WEFT_PARAM(CumemEnable, "NCCL_CUMEM_ENABLE", -2,
           "shareable device memory (device FIFOs, ncclMemAlloc): 1 cuMem (file descriptors "
           "passed over a Unix socket), 0 cudaMalloc and legacy CUDA IPC handles, -2 cuMem "
           "where the driver has it");
WEFT_PARAM_DECL(BootstrapTimeout);

#define WEFT_P2P_MAGIC 0x3170327074666577ull /* "weftp2p1" */
#define WEFT_P2P_VERSION 1

struct weft_p2p_info {
    uint64_t magic;
    uint32_t version;
    int32_t dev;
    int32_t how[WEFT_DEV_NREGIONS]; /* enum weft_dev_how per region */
    struct weft_cuda_ipc_handle handle; /* legacy handle of the device region */
};

struct weft_p2p_msg {
    uint64_t magic;
    uint64_t comm_hash;
    int32_t from;
    int32_t region;
};

struct weft_p2p_state {
    int nranks;
    void **imports; /* [nranks * WEFT_DEV_NREGIONS]: what this rank mapped */
    int *import_how;
};

static int p2p_can_connect(const struct ncclComm *comm, int a, int b)
{
    const struct weft_peer_info *pa = &comm->peer_info[a], *pb = &comm->peer_info[b];
    int same_process = pa->pid == pb->pid && pa->pid_ns == pb->pid_ns;
    return pa->host_hash == pb->host_hash && !same_process && pa->cuda_dev >= 0 &&
           pb->cuda_dev >= 0;
}

static ncclResult_t p2p_mem_alloc(struct ncclComm *comm, size_t bytes, int region, void **p_p,
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
                          comm->rank);
        }
        if (err == WEFT_CUDA_ERR_NOT_SUPPORTED && knob <= 0) {
            err = ops->malloc(p_p, bytes);
            if (err == 0)
                *how_p = WEFT_DEV_HOW_LEGACY;
        }
    }
    if (err != 0) {
        WEFT_WARN("rank %d: %zu bytes of shareable %s memory for the FIFOs: %s (%d)", comm->rank,
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

static void p2p_sock_name(struct sockaddr_un *a, socklen_t *len, uint64_t comm_hash, int rank)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    /* Abstract namespace (leading NUL): nothing in the file system, gone with the socket. */
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "weft-p2p-%016llx-%d",
                     (unsigned long long)comm_hash, rank);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static ncclResult_t p2p_send_fd(int sock, const struct sockaddr_un *to, socklen_t tolen,
                                const struct weft_p2p_msg *msg, int fd, int *sent_p)
{
    struct iovec iov = {(void *)msg, sizeof(*msg)};
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
    m.msg_control = u.buf;
    m.msg_controllen = sizeof(u.buf);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    *sent_p = 0;
    if (sendmsg(sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(*msg)) {
        *sent_p = 1;
        return ncclSuccess;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOBUFS)
        return ncclSuccess; /* the peer's queue is full: try again after reading ours */
    return ncclRemoteError; /* the caller names the peer, with errno */
}

/* One datagram if one is waiting: *fd_p = -1 when none. */
static ncclResult_t p2p_recv_fd(int sock, struct weft_p2p_msg *msg, int *fd_p)
{
    struct iovec iov = {msg, sizeof(*msg)};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } u;
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof(u.buf);
    *fd_p = -1;
    ssize_t n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? ncclSuccess
                                                                          : ncclSystemError;
    int fd = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(c), sizeof(int));
    if (n != (ssize_t)sizeof(*msg) || fd < 0 || msg->magic != WEFT_P2P_MAGIC) {
        if (fd >= 0)
            close(fd);
        WEFT_WARN("a malformed FIFO descriptor message (%zd bytes) on the p2p socket", n);
        return ncclRemoteError;
    }
    *fd_p = fd;
    return ncclSuccess;
}

static double p2p_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/*
 * Sends this rank's descriptors to every connected peer and receives theirs (fds[p*R + r]),
 * without deadlock: sends never block, and a rank whose peer's queue is full reads its own queue
 * before trying again. Bounded by the bootstrap deadline and the abort flag.
 */
static ncclResult_t p2p_exchange_fds(struct ncclComm *comm, int sock, const int *my_fds,
                                     const uint8_t *want, const struct weft_p2p_info *info,
                                     int *fds)
{
    int n = comm->nranks, me = comm->rank, R = WEFT_DEV_NREGIONS;
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
                p2p_sock_name(&to, &tolen, comm->comm_hash, p);
                struct weft_p2p_msg msg = {WEFT_P2P_MAGIC, comm->comm_hash, me, r};
                int ok = 0;
                res = p2p_send_fd(sock, &to, tolen, &msg, my_fds[r], &ok);
                if (res != ncclSuccess) {
                    WEFT_WARN("rank %d: passing FIFO memory to rank %d (host %s): sendmsg failed: "
                              "%s", me, p, comm->peer_info[p].hostname, strerror(errno));
                    break;
                }
                if (ok) {
                    sent[p * R + r] = 1;
                    to_send--;
                    progress = 1;
                }
            }
        }
        for (;;) {
            struct weft_p2p_msg msg;
            int fd = -1;
            if (res == ncclSuccess)
                res = p2p_recv_fd(sock, &msg, &fd);
            if (res != ncclSuccess || fd < 0)
                break;
            if (msg.comm_hash != comm->comm_hash || msg.from < 0 || msg.from >= n ||
                msg.region < 0 || msg.region >= R || !want[msg.from * R + msg.region] ||
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
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
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

static ncclResult_t p2p_close(struct ncclComm *comm, void *state)
{
    struct weft_p2p_state *st = state;
    (void)comm;
    if (st == NULL)
        return ncclSuccess;
    const struct weft_cuda_ops *ops = weft_cuda();
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < st->nranks * WEFT_DEV_NREGIONS; i++) {
        if (st->imports[i] == NULL)
            continue;
        int err = st->import_how[i] == WEFT_DEV_HOW_LEGACY ? ops->ipc_close_handle(st->imports[i])
                                                           : ops->mem_release(st->imports[i]);
        if (err != 0 && res == ncclSuccess) {
            WEFT_WARN("unmapping a peer's FIFO memory %p: %s (%d)", st->imports[i],
                      ops->error_string(err), err);
            res = ncclUnhandledCudaError;
        }
    }
    free(st->imports);
    free(st->import_how);
    free(st);
    return res;
}

static ncclResult_t p2p_setup(struct ncclComm *comm, void *const *mine, const int *mine_how,
                              size_t bytes, const uint8_t *want, void **theirs, void **state_p)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    int n = comm->nranks, me = comm->rank, R = WEFT_DEV_NREGIONS;
    ncclResult_t res = ncclSuccess;
    int sock = -1;
    int my_fds[WEFT_DEV_NREGIONS];
    struct weft_p2p_info *info = calloc((size_t)n, sizeof(*info));
    int *fds = malloc((size_t)n * R * sizeof(int));
    struct weft_p2p_state *st = calloc(1, sizeof(*st));
    if (st != NULL) {
        st->nranks = n;
        st->imports = calloc((size_t)n * R, sizeof(void *));
        st->import_how = calloc((size_t)n * R, sizeof(int));
    }
    for (int r = 0; r < R; r++)
        my_fds[r] = -1;
    if (info == NULL || fds == NULL || st == NULL || st->imports == NULL ||
        st->import_how == NULL) {
        WEFT_WARN("rank %d: out of memory for the p2p transport", me);
        res = ncclSystemError;
        goto out;
    }
    for (int i = 0; i < n * R; i++)
        fds[i] = -1;
    info[me].magic = WEFT_P2P_MAGIC;
    info[me].version = WEFT_P2P_VERSION;
    info[me].dev = comm->cuda_dev;
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
    /* The socket is bound before the all-gather, so every peer's is there once it returns. */
    if (any_peer) {
        struct sockaddr_un a;
        socklen_t alen;
        p2p_sock_name(&a, &alen, comm->comm_hash, me);
        sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (sock < 0 || bind(sock, (struct sockaddr *)&a, alen) != 0) {
            WEFT_WARN("rank %d: the p2p socket @%s: %s", me, a.sun_path + 1, strerror(errno));
            res = ncclSystemError;
            goto out;
        }
    }
    /* Every rank takes part, connected or not: the all-gather is collective. */
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bootstrap, info, sizeof(*info)), res, out);
    for (int p = 0; p < n; p++) {
        if (!want[p * R] && !want[p * R + 1])
            continue;
        if (info[p].magic != WEFT_P2P_MAGIC || info[p].version != WEFT_P2P_VERSION) {
            WEFT_WARN("rank %d: rank %d (host %s) runs another p2p transport (version %u)", me, p,
                      comm->peer_info[p].hostname, info[p].version);
            res = ncclInvalidUsage;
            goto out;
        }
        for (int r = 0; r < R; r++)
            any_fd |= want[p * R + r] && (info[p].how[r] == WEFT_DEV_HOW_FD || my_fds[r] >= 0);
    }
    if (any_fd)
        WEFT_CHECK_GOTO(p2p_exchange_fds(comm, sock, my_fds, want, info, fds), res, out);
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
                                      info[p].dev);
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
    free(info);
    if (st != NULL)
        p2p_close(comm, st);
    return res;
}

const struct weft_dev_transport weft_dev_transport_p2p = {
    .version = WEFT_DEV_TRANSPORT_VERSION,
    .name = "p2p",
    .can_connect = p2p_can_connect,
    .mem_alloc = p2p_mem_alloc,
    .mem_free = p2p_mem_free,
    .setup = p2p_setup,
    .close = p2p_close,
};
