/*
 * Shared-memory transport (ranks on the same host, host memory).
 *
 * Each rank creates one segment (shm_open, reserved with posix_fallocate, mmap) holding its
 * doorbell and, for every channel and every rank of its host that it connects to (itself
 * included), the FIFOs *into* this rank from that rank: control block then
 * WEFT_STEPS slots, then the LL FIFO (control block, WEFT_LL_SLOTS small slots; fifo.h), left
 * out when NCCL_PROTO excludes LL for every collective. Every rank maps every connected peer's
 * segment, so a sender writes its slices straight into the receiver's slots and the receiver
 * reduces straight out of them. Segments are
 * unlinked as soon as every rank has mapped them, so a crash leaves nothing in /dev/shm. Small
 * communicators map every FIFO page at setup (WEFT_SHM_PREFAULT_BYTES); larger ones only the LL
 * FIFOs, and their other pages cost memory only once used.
 *
 * A segment is reserved whole when it is made: a /dev/shm too small for it (Docker's default is
 * 64 MiB) fails init on every rank with a message naming the size needed, the space there and the
 * knobs that shrink it, instead of a SIGBUS in the middle of a collective. A peer's segment of
 * another size than this rank expects (another WEFT_HOST_NCHANNELS, slot size or NCCL_PROTO) is
 * refused before it is mapped, for the same reason.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <sys/uio.h>

#include "bootstrap/bootstrap.h"
#include "core/auth.h"
#include "core/check.h"
#include "core/cma.h"
#include "core/peer_info.h"
#include "algo/tuner.h"
#include "core/param.h"
#include "fifo.h"
#include "transport.h"

WEFT_PARAM(ShmSlotBytes, "WEFT_SHM_SLOT_BYTES", -1,
           "bytes per FIFO slot of a shared-memory connection (8 slots per connection; -1: "
           "128 KiB on a communicator of 2 ranks, 32 KiB otherwise)");

/* The default slot. 2 ranks, each with a core of its own: a 1 MiB all-reduce takes ~3 us per
 * slice on top of ~29 us (32 KiB slots 177 us, 64 KiB 104, 128 KiB 66; 256 KiB no faster), and
 * 256 KiB and 4 MiB gain too. With more ranks a connection's FIFO is one of many competing for
 * the caches (and ranks often share cores), so they keep 32 KiB. From the rank count, which
 * every rank shares. */
#define WEFT_SHM_SLOT_DEFAULT(nranks) ((nranks) == 2 ? 131072 : 32768)

#define WEFT_SHM_SEGMENT_MAGIC 0x7765667473686d31ull /* "weftshm1" */
#define WEFT_SHM_HEADER_BYTES 4096
#define WEFT_SHM_PREFAULT_BYTES (16u << 20) /* FIFOs into one rank mapped at setup, at most */

struct weft_shm_header {
    uint64_t magic;
    int32_t rank;
    int32_t nranks;
    uint32_t departed; /* 1 once the owner destroyed the communicator (shm_peer_departed) */
    uint32_t pad0;
    uint64_t conn_stride; /* bytes per (channel, peer) FIFO pair: the owner's layout */
    uint64_t self_addr;   /* this header's address in the owner's process (shm_direct_mode) */
    char pad[WEFT_CACHELINE - 40];
    struct weft_doorbell bell;
};

struct weft_shm_state {
    size_t *seg_bytes;          /* [nranks]: each connected rank's segment */
    size_t conn_stride;
    int nconn_channels;
    int nranks;
    void **segs;                /* [nranks], NULL for peers not connected */
    int *fds;                   /* [nranks]: each segment's descriptor, kept open (-1: none); this
                                 * rank holds a lock on its own while it lives
                                 * (shm_peer_lock_fd) */
    struct weft_conn *conns;    /* [nconn_channels][nranks][4]: send, recv, their LL FIFOs */
    uint64_t (*tokens)[2];      /* [nranks]: each segment's random name (shm_name) */
};

static int shm_can_connect(const struct weft_transport_ctx *ctx, int a, int b)
{
    const struct weft_peer_info *pa = &ctx->peers[a], *pb = &ctx->peers[b];
    return pa->host_hash == pb->host_hash && !((pa->flags | pb->flags) & WEFT_PEER_NO_SHM);
}

static ncclResult_t shm_slot_bytes(const struct weft_transport_ctx *ctx, size_t *bytes_p)
{
    int64_t knob = weft_param_ShmSlotBytes();
    if (knob == -1)
        knob = WEFT_SHM_SLOT_DEFAULT(ctx->nranks);
    if (knob < 4096 || knob % 64 != 0 || knob > (1 << 30)) { /* header included */
        WEFT_WARN("WEFT_SHM_SLOT_BYTES %lld must be -1 or a multiple of 64 between 4096 and 1 GiB",
                  (long long)knob);
        return ncclInvalidArgument;
    }
    size_t slot = (size_t)knob;
    *bytes_p = slot;
    return ncclSuccess;
}

/*
 * Segment names are random (getrandom), drawn by each owner and handed to its peers over the
 * bootstrap, never derived from the communicator hash: that hash is public (every challenge sends
 * it), and another user of the host who created /weft-<hash>-<rank> first made init fail, since a
 * rank that is not root cannot unlink a name of another user in /dev/shm (issue 30).
 */
#define WEFT_SHM_NAME_TRIES 16

static void shm_name(char *buf, size_t len, const uint64_t token[2])
{
    snprintf(buf, len, "/weft-%016llx%016llx", (unsigned long long)token[0],
             (unsigned long long)token[1]);
}

/*
 * Position of rank `from` among the ranks whose FIFOs live in `owner`'s segment: those owner
 * connects to over shared memory, in rank order (from = nranks: how many there are). Computed
 * from exchanged peer info only, so every rank finds the same layout of every segment.
 */
static int shm_local_index(const struct weft_transport_ctx *ctx, int owner, int from)
{
    int idx = 0;
    for (int q = 0; q < from; q++)
        idx += shm_can_connect(ctx, owner, q);
    return idx;
}

static size_t shm_seg_bytes(const struct weft_transport_ctx *ctx, const struct weft_shm_state *st,
                            int owner)
{
    return WEFT_SHM_HEADER_BYTES + (size_t)st->nconn_channels *
                                       shm_local_index(ctx, owner, ctx->nranks) * st->conn_stride;
}

/* FIFO into segment owner from `from` on channel c. */
static char *shm_fifo(const struct weft_transport_ctx *ctx, const struct weft_shm_state *st, void *seg,
                      int owner, int c, int from)
{
    int nlocal = shm_local_index(ctx, owner, ctx->nranks);
    return (char *)seg + WEFT_SHM_HEADER_BYTES +
           ((size_t)c * nlocal + shm_local_index(ctx, owner, from)) * st->conn_stride;
}

static ncclResult_t shm_close(const struct weft_transport_ctx *ctx, void *state)
{
    struct weft_shm_state *st = state;
    if (st == NULL)
        return ncclSuccess;
    /* Departed means "its part is done": not after an abort or a failed operation, whose peers
     * must name this rank when it exits rather than wait for the deadline. */
    int done = !__atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE) &&
               __atomic_load_n(ctx->async_error, __ATOMIC_ACQUIRE) == ncclSuccess;
    if (done && st->segs != NULL && st->segs[ctx->rank] != NULL)
        __atomic_store_n(&((struct weft_shm_header *)st->segs[ctx->rank])->departed, 1,
                         __ATOMIC_RELEASE);
    for (int p = 0; st->fds != NULL && p < st->nranks; p++)
        if (st->fds[p] >= 0)
            close(st->fds[p]);
    free(st->fds);
    for (int p = 0; st->segs != NULL && p < st->nranks; p++)
        if (st->segs[p] != NULL)
            munmap(st->segs[p], st->seg_bytes[p]);
    free(st->segs);
    free(st->seg_bytes);
    free(st->conns);
    free(st->tokens);
    free(st);
    return ncclSuccess;
}

/* Free (or, with total, all) bytes of the file system of POSIX shared memory; 0: unknown. */
static size_t shm_fs_bytes(int total)
{
    struct statvfs vfs;
    if (statvfs("/dev/shm", &vfs) != 0)
        return 0;
    return (size_t)(total ? vfs.f_blocks : vfs.f_bavail) * vfs.f_frsize;
}

/*
 * Creates (create) or opens a segment of `bytes` and maps it. A new segment is reserved whole
 * (posix_fallocate): where /dev/shm cannot hold it that fails here, with ncclSystemError and a
 * message (host_bytes: what the segments of every rank of this host take together), rather than
 * as a SIGBUS at the first touch of a page past the end of the space. A
 * peer's segment of another size is refused (ncclInvalidUsage) before it is mapped. The
 * descriptor stays open (*fd_p): on its own segment the owner takes a lock that lasts as long as
 * its process, and its peers test that lock to learn whether it still lives.
 */
static ncclResult_t shm_map(const char *name, size_t bytes, int create, int owner,
                            size_t host_bytes, void **seg_p, int *fd_p)
{
    int fd;
    /* A name another process holds (create): ncclInProgress, not logged; the caller draws again */
    fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
    if (fd < 0 && create && errno == EEXIST)
        return ncclInProgress;
    if (fd < 0) {
        WEFT_WARN("shm_open %s failed: %s", name, strerror(errno));
        return ncclSystemError;
    }
    if (create) {
        int err = ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
        if (err != 0) {
            WEFT_WARN("rank %d: cannot reserve %zu MiB of shared memory for its FIFOs in /dev/shm "
                      "(%s): the ranks of this host need %zu MiB there, it holds %zu MiB in all "
                      "(%zu MiB free there now); give /dev/shm more room (docker run --shm-size), "
                      "or lower WEFT_HOST_NCHANNELS or WEFT_SHM_SLOT_BYTES, or use "
                      "NCCL_PROTO=Simple, or set NCCL_SHM_DISABLE=1",
                      owner, (bytes + (1u << 20) - 1) >> 20, strerror(err),
                      (host_bytes + (1u << 20) - 1) >> 20, shm_fs_bytes(1) >> 20,
                      shm_fs_bytes(0) >> 20);
            close(fd);
            shm_unlink(name);
            return ncclSystemError;
        }
    } else {
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != bytes) {
            WEFT_WARN("the shared-memory segment of rank %d is %lld bytes, this rank expects %zu: "
                      "set WEFT_HOST_NCHANNELS, WEFT_SHM_SLOT_BYTES and NCCL_PROTO alike on "
                      "every rank",
                      owner, (long long)sb.st_size, bytes);
            close(fd);
            return ncclInvalidUsage;
        }
    }
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (create && fcntl(fd, F_OFD_SETLK, &lock) != 0) {
        WEFT_WARN("locking %s failed: %s", name, strerror(errno));
        close(fd);
        shm_unlink(name);
        return ncclSystemError;
    }
    void *seg = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (seg == MAP_FAILED) {
        WEFT_WARN("mmap of %s (%zu bytes) failed: %s", name, bytes, strerror(errno));
        close(fd);
        if (create)
            shm_unlink(name);
        return ncclSystemError;
    }
    *seg_p = seg;
    *fd_p = fd;
    return ncclSuccess;
}

/*
 * Every rank's outcome of a setup phase, so that a rank that failed (no room in /dev/shm, a
 * segment of the wrong size) makes every rank fail now, with a message naming it, instead of
 * leaving the others waiting for it. Collective; also the barrier between the phases.
 */
struct weft_shm_outcome {
    int32_t res;
    uint32_t pad;
    uint64_t token[2]; /* the name of the rank's segment (shm_name) */
};

/* tokens: NULL, or [nranks][2] with this rank's entry filled; the others' come from their owners */
static ncclResult_t shm_agree(const struct weft_transport_ctx *ctx, ncclResult_t mine, const char *phase,
                              uint64_t (*tokens)[2])
{
    int nranks = ctx->nranks;
    struct weft_shm_outcome *all = calloc((size_t)nranks, sizeof(*all));
    if (all == NULL) {
        WEFT_WARN("out of memory exchanging shared-memory setup results of %d ranks", nranks);
        return ncclSystemError;
    }
    all[ctx->rank].res = (int32_t)mine;
    if (tokens != NULL)
        memcpy(all[ctx->rank].token, tokens[ctx->rank], sizeof(all->token));
    ncclResult_t res = weft_bootstrap_allgather(ctx->bootstrap, all, sizeof(*all));
    for (int p = 0; res == ncclSuccess && tokens != NULL && p < nranks; p++)
        memcpy(tokens[p], all[p].token, sizeof(all->token));
    for (int p = 0; res == ncclSuccess && p < nranks; p++) {
        if (all[p].res == ncclSuccess)
            continue;
        res = (ncclResult_t)all[p].res;
        if (p != ctx->rank)
            WEFT_WARN("rank %d: rank %d (host %s) failed to %s (its log says why)", ctx->rank, p,
                      ctx->peers[p].hostname, phase);
        break;
    }
    free(all);
    return res;
}

/*
 * Maps the pages of [addr, addr + len) into this process now. Operations walk a FIFO's pages one
 * slot after the other, and the first pass faulted each page (2 ranks, the first 20 all-reduces
 * of 8 B over the LL FIFO took 2-9 us each instead of 0.18). Best effort: an old kernel (before
 * 5.14) faults them on first use instead.
 */
static void shm_prefault(char *addr, size_t len)
{
#ifdef MADV_POPULATE_WRITE
    uintptr_t page = 4096, a = (uintptr_t)addr & ~(page - 1);
    uintptr_t end = ((uintptr_t)addr + len + page - 1) & ~(page - 1);
    (void)madvise((void *)a, end - a, MADV_POPULATE_WRITE);
#else
    (void)addr;
    (void)len;
#endif
}

/*
 * How this rank can read what peer p sends it directly (exec/lane.h, direct sends), given p's
 * segment header ph as mapped here. One process (same pid, same PID namespace): memcpy. Another
 * process: process_vm_readv, if it pays on this machine (core/cma.h) and works (same user, Yama
 * permitting): the probe reads the header's first words through the owner's own address of it
 * and must find what this mapping shows, which also proves the pid names the owner.
 */
static int shm_direct_mode(const struct weft_transport_ctx *ctx, int p, const struct weft_shm_header *ph)
{
    const struct weft_peer_info *pi = &ctx->peers[p], *self = &ctx->peers[ctx->rank];
    if (p == ctx->rank)
        return WEFT_DIRECT_MEMCPY;
    if (pi->pid_ns == 0 || pi->pid_ns != self->pid_ns)
        return WEFT_DIRECT_NONE;
    if (pi->pid == self->pid)
        return WEFT_DIRECT_MEMCPY;
    if (!weft_cma_pays())
        return WEFT_DIRECT_NONE;
    uint64_t seen[2] = {0, 0};
    struct iovec local = {seen, sizeof(seen)};
    struct iovec remote = {(void *)(uintptr_t)ph->self_addr, sizeof(seen)};
    ssize_t got = process_vm_readv(pi->pid, &local, 1, &remote, 1, 0);
    if (got != (ssize_t)sizeof(seen) || memcmp(seen, ph, sizeof(seen)) != 0) {
        WEFT_INFO(WEFT_LOG_SHM | WEFT_LOG_INIT, "rank %d: no single-copy reads from rank %d "
                  "(pid %d): process_vm_readv %s", ctx->rank, p, pi->pid,
                  got < 0 ? strerror(errno) : "read something else");
        return WEFT_DIRECT_NONE;
    }
    return WEFT_DIRECT_CMA;
}

/* Tells peer p's sends (every channel's FIFO from p into this rank) how this rank reads them. */
static void shm_direct_publish(const struct weft_transport_ctx *ctx, const struct weft_shm_state *st, int p,
                               int mode)
{
    for (int c = 0; c < st->nconn_channels; c++) {
        struct weft_fifo_ctrl *ctrl =
            (struct weft_fifo_ctrl *)shm_fifo(ctx, st, st->segs[ctx->rank], ctx->rank, c, p);
        ctrl->direct = (uint32_t)mode;
    }
}

/* A FIFO at fifo: its control block, then nslots slots of slot bytes. */
static void shm_conn_init(struct weft_conn *conn, char *fifo, size_t slot, uint32_t nslots,
                          struct weft_doorbell *peer_bell)
{
    conn->ctrl = (struct weft_fifo_ctrl *)fifo;
    conn->slots = fifo + sizeof(struct weft_fifo_ctrl);
    conn->slot_bytes = slot;
    conn->nslots = nslots;
    conn->peer_bell = peer_bell;
}

static ncclResult_t shm_setup(const struct weft_transport_ctx *ctx, const uint8_t *peer_mask,
                             struct weft_transport_out *made, void **state_p)
{
    ncclResult_t res = ncclSuccess;
    int nranks = ctx->nranks, me = ctx->rank;
    int nch = ctx->nchannels + 1;
    size_t slot = ctx->slot_bytes;
    struct weft_shm_state *st;
    WEFT_CALLOC(st, 1);
    st->nconn_channels = nch;
    st->nranks = nranks;
    /* NCCL_PROTO is the same on every rank (as NCCL requires), so every rank lays out alike. */
    int ll = ctx->ll;
    size_t ll_offset = sizeof(struct weft_fifo_ctrl) + WEFT_STEPS * slot;
    size_t ll_bytes = ll ? sizeof(struct weft_fifo_ctrl) + WEFT_LL_SLOTS * WEFT_LL_SLOT_BYTES : 0;
    st->conn_stride = (ll_offset + ll_bytes + 4095) & ~(size_t)4095;
    /* The transport table hands shm the peers it is first to connect; that is every rank
     * shm_can_connect admits, which the segment layout counts on. */
    for (int p = 0; p < nranks; p++) {
        if (!peer_mask[p] != !shm_can_connect(ctx, me, p)) {
            WEFT_WARN("rank %d: shared-memory peers differ from the transport choice (rank %d)", me,
                      p);
            res = ncclInternalError;
            goto err;
        }
    }
    /* Map every FIFO now while they take little memory (8 ranks: 6 MiB a rank) and /dev/shm has
     * room for all the ranks' (a container's may hold 64 MiB), else the LL FIFOs only: the first
     * operations of a size faulted their pages one by one (8 ranks on 2 cores, the first 8
     * all-gathers of 64 KiB took 96-124 us each, 25-28 after). */
    int npeers = 0;
    for (int p = 0; p < nranks; p++)
        npeers += p != me && peer_mask[p];
    size_t fifo_total = (size_t)nch * npeers * st->conn_stride;
    int prefault_all = fifo_total <= WEFT_SHM_PREFAULT_BYTES &&
                       fifo_total * (size_t)(npeers + 1) <= shm_fs_bytes(0) / 4;
    st->segs = calloc((size_t)nranks, sizeof(void *));
    st->seg_bytes = calloc((size_t)nranks, sizeof(size_t));
    st->fds = malloc((size_t)nranks * sizeof(int));
    st->conns = calloc((size_t)nch * nranks * 4, sizeof(struct weft_conn));
    if (st->segs == NULL || st->seg_bytes == NULL || st->fds == NULL || st->conns == NULL) {
        WEFT_WARN("out of memory for shared-memory connections of %d ranks", nranks);
        res = ncclSystemError;
        goto err;
    }
    size_t host_bytes = 0; /* every segment of this host: each rank connects to all of them */
    for (int p = 0; p < nranks; p++)
        st->fds[p] = -1;
    for (int p = 0; p < nranks; p++) {
        if (peer_mask[p] || p == me)
            st->seg_bytes[p] = shm_seg_bytes(ctx, st, p);
        host_bytes += st->seg_bytes[p];
    }

    char name[64] = "";
    st->tokens = calloc((size_t)nranks, sizeof(*st->tokens));
    if (st->tokens == NULL) {
        WEFT_WARN("out of memory for the shared-memory segment names of %d ranks", nranks);
        res = ncclSystemError;
        goto err;
    }
    /* A name taken already (by anyone: it may be a squatter's) is skipped for a fresh one. */
    res = ncclInProgress;
    for (int t = 0; t < WEFT_SHM_NAME_TRIES && res == ncclInProgress; t++) {
        res = weft_auth_random(st->tokens[me], sizeof(st->tokens[me]));
        if (res != ncclSuccess)
            break;
        shm_name(name, sizeof(name), st->tokens[me]);
        res = shm_map(name, st->seg_bytes[me], 1, me, host_bytes, &st->segs[me], &st->fds[me]);
        if (res == ncclInProgress)
            WEFT_INFO(WEFT_LOG_SHM | WEFT_LOG_INIT, "rank %d: shared-memory name %s is taken; "
                      "drawing another", me, name);
    }
    if (res == ncclInProgress) {
        WEFT_WARN("rank %d: %d random shared-memory names in a row were taken in /dev/shm", me,
                  WEFT_SHM_NAME_TRIES);
        res = ncclSystemError;
    }
    if (res != ncclSuccess)
        name[0] = '\0'; /* nothing of ours to unlink */
    /* Everyone has created (and reserved) its segment or failed, and learnt every segment's name:
     * map the peers', then let everyone unlink its own. */
    WEFT_CHECK_GOTO(shm_agree(ctx, res, "reserve its shared-memory segment", st->tokens), res,
                    err_unlink);
    struct weft_shm_header *hdr = st->segs[me];
    hdr->magic = WEFT_SHM_SEGMENT_MAGIC;
    hdr->rank = me;
    hdr->nranks = nranks;
    hdr->conn_stride = st->conn_stride;
    hdr->self_addr = (uint64_t)(uintptr_t)hdr;
    weft_doorbell_init(&hdr->bell, WEFT_BELL_FUTEX, -1); /* before any peer maps it */
    WEFT_CHECK_GOTO(weft_bootstrap_barrier(ctx->bootstrap), res, err_unlink);
    ncclResult_t mapped = ncclSuccess;
    int reads_cma = 0, reads_memcpy = 0;
    if (peer_mask[me])
        shm_direct_publish(ctx, st, me, WEFT_DIRECT_MEMCPY);
    for (int p = 0; p < nranks && mapped == ncclSuccess; p++) {
        if (p == me || !peer_mask[p])
            continue;
        char peer_name[64];
        shm_name(peer_name, sizeof(peer_name), st->tokens[p]);
        mapped = shm_map(peer_name, st->seg_bytes[p], 0, p, 0, &st->segs[p], &st->fds[p]);
        if (mapped != ncclSuccess)
            break;
        struct weft_shm_header *ph = st->segs[p];
        if (ph->magic != WEFT_SHM_SEGMENT_MAGIC || ph->rank != p || ph->nranks != nranks) {
            WEFT_WARN("shared segment %s of rank %d is not a segment of this communicator",
                      peer_name, p);
            mapped = ncclInternalError;
        } else if (ph->conn_stride != st->conn_stride) {
            WEFT_WARN("rank %d: the shared-memory FIFOs of rank %d take %llu bytes per peer and "
                      "channel, here %zu: set WEFT_SHM_SLOT_BYTES and NCCL_PROTO alike on every "
                      "rank",
                      me, p, (unsigned long long)ph->conn_stride, st->conn_stride);
            mapped = ncclInvalidUsage;
        } else {
            /* before the agreement below, after which p's sends read it */
            int mode = shm_direct_mode(ctx, p, ph);
            shm_direct_publish(ctx, st, p, mode);
            reads_cma += mode == WEFT_DIRECT_CMA;
            reads_memcpy += mode == WEFT_DIRECT_MEMCPY;
        }
    }
    WEFT_CHECK_GOTO(shm_agree(ctx, mapped, "map the shared-memory segments of its peers", NULL),
                    res, err_unlink);
    shm_unlink(name);

    for (int c = 0; c < nch; c++) {
        for (int p = 0; p < nranks; p++) {
            if (!peer_mask[p])
                continue;
            struct weft_conn *send = &st->conns[((size_t)c * nranks + p) * 4];
            struct weft_conn *recv = send + 1;
            void *peer_seg = st->segs[p];
            /* The loopback rings nobody: the only thread that sleeps on this communicator's bell
             * is the one running its operation, the one that posts (a ring is a full fence, ~10
             * ns, twice per direct operation). */
            struct weft_doorbell *peer_bell =
                p == me ? NULL : &((struct weft_shm_header *)peer_seg)->bell;
            char *out = shm_fifo(ctx, st, peer_seg, p, c, me);
            char *in = shm_fifo(ctx, st, st->segs[me], me, c, p);
            shm_conn_init(send, out, slot, WEFT_STEPS, peer_bell);
            shm_conn_init(recv, in, slot, WEFT_STEPS, peer_bell);
            send->direct = (int)send->ctrl->direct;
            recv->direct = (int)recv->ctrl->direct;
            recv->direct_pid = ctx->peers[p].pid;
            if (ll) {
                send->ll = send + 2;
                recv->ll = send + 3;
                send->ll_ordered = recv->ll_ordered = 1;
                shm_conn_init(send->ll, out + ll_offset, WEFT_LL_SLOT_BYTES, WEFT_LL_SLOTS, peer_bell);
                shm_conn_init(recv->ll, in + ll_offset, WEFT_LL_SLOT_BYTES, WEFT_LL_SLOTS, peer_bell);
            }
            if (prefault_all) {
                shm_prefault(out, st->conn_stride);
                shm_prefault(in, st->conn_stride);
            } else if (ll) {
                shm_prefault(out + ll_offset, ll_bytes);
                shm_prefault(in + ll_offset, ll_bytes);
            }
            made->chan_peers[c][p].send = send;
            made->chan_peers[c][p].recv = recv;
        }
    }
    /* shm is set up first (src/core/comm.c), so the rank sleeps on the doorbell in its segment,
     * the one its shm peers ring; the socket proxies ring it too. */
    if (ctx->bell == NULL) {
        made->bell = &hdr->bell;
    }
    WEFT_INFO(WEFT_LOG_SHM | WEFT_LOG_INIT,
              "rank %d: shm segment %zu bytes, %d channels, slot %zu%s; %s mapped at setup; "
              "single-copy reads from %d peers with memcpy, %d with process_vm_readv", me,
              st->seg_bytes[me], nch, slot, ll ? ", LL FIFOs" : "",
              prefault_all ? "every FIFO" : ll ? "the LL FIFOs" : "nothing", reads_memcpy,
              reads_cma);
    *state_p = st;
    return ncclSuccess;

err_unlink:
    if (name[0] != '\0')
        shm_unlink(name);
err:
    shm_close(ctx, st);
    return res;
}

/* A peer marks its segment when it destroys the communicator cleanly (shm_close). */
static int shm_peer_departed(void *state, int p)
{
    const struct weft_shm_state *st = state;
    return st->segs[p] != NULL &&
           __atomic_load_n(&((const struct weft_shm_header *)st->segs[p])->departed,
                           __ATOMIC_ACQUIRE);
}

/* The peer's segment, on which its process holds a lock while it lives. */
static int shm_peer_lock_fd(void *state, int p)
{
    const struct weft_shm_state *st = state;
    return st->fds != NULL ? st->fds[p] : -1;
}

static int shm_settings(const char **names, int64_t *values)
{
    names[0] = "WEFT_SHM_SLOT_BYTES";
    values[0] = weft_param_ShmSlotBytes();
    return 1;
}

/* shm never joins two hosts: its model is the shared-memory one everywhere. */
static void shm_cost(struct weft_cost_fabric *f, double chunk_bytes, int oversubscribed)
{
    (void)chunk_bytes, (void)oversubscribed;
    weft_cost_fabric_shm(f);
}

const struct weft_transport weft_transport_shm = {
    .version = WEFT_TRANSPORT_VERSION,
    .name = "shm",
    .can_connect = shm_can_connect,
    .slot_bytes = shm_slot_bytes,
    .setup = shm_setup,
    .close = shm_close,
    .peer_departed = shm_peer_departed,
    .peer_lock_fd = shm_peer_lock_fd,
    .settings = shm_settings,
    .cost = shm_cost,
};
