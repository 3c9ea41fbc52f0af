/* Zero-copy collectives on registered host buffers: see exec/zcopy.h. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "algo/sched.h"
#include "core/auth.h"
#include "core/check.h"
#include "core/cma.h"
#include "core/communicator.h"
#include "core/group.h"
#include "core/mem.h"
#include "core/param.h"
#include "exec/arena.h"
#include "exec/lane.h"
#include "exec/zcopy.h"

WEFT_PARAM(ZcopyMinBytes, "WEFT_ZCOPY_MIN_BYTES", 262144,
           "all-reduces, all-gathers and reduce-scatters of at least this many bytes on a "
           "communicator of one machine read and write the peers' registered host buffers "
           "directly when every rank registered them (0 disables; the same on every rank)");

/* Bytes reduced (or copied) at a time: small enough to stay in cache while the result is copied
 * to every peer. */
#define WEFT_ZCOPY_PIECE 65536

/*
 * The descriptor every rank sends (uint64_t words). Version 1. The nonce; the call (collective,
 * datatype, operator kind) and count: a rank whose peers called something else votes no, so the
 * normal path reports the mismatch (with the signature check off, too) instead of reading past a
 * peer's buffer; the operator's scalar (PreMulSum's may differ per rank: rank k's input is
 * pre-multiplied by rank k's). For each of
 * the send and recv
 * buffers: flags (WEFT_ZCOPY_REG: registered on this communicator; WEFT_ZCOPY_MEMFD: inside an
 * ncclMemAlloc block, so another process may map it), the memfd's number in the owner, its
 * st_dev, st_ino and size, the offset in it, and the raw pointer.
 * Version 2: the vote (the second exchange) says how a rank got its peers' data: 1 every buffer
 * mapped, 2 some inputs read with process_vm_readv (an all-gather), 0 no; version 1 voted 0 or 1
 * only, so the two never mix (each votes no on the other's descriptors).
 */
#define WEFT_ZCOPY_VERSION 2
enum { ZD_VERSION, ZD_NONCE, ZD_CALL, ZD_COUNT, ZD_SCALAR, ZD_BUF };
enum { ZD_BUF_WORDS = 7, ZD_WORDS = ZD_BUF + 2 * ZD_BUF_WORDS };
enum { ZB_FLAGS, ZB_FD, ZB_DEV, ZB_INO, ZB_SIZE, ZB_OFFSET, ZB_PTR };
#define WEFT_ZCOPY_REG 0x1u
#define WEFT_ZCOPY_MEMFD 0x2u

/* A peer's memfd block mapped into this process (comm->zcopy_maps). */
struct weft_zcopy_map {
    struct weft_zcopy_map *next;
    uint64_t nonce;
    int pid;
    uint64_t dev, ino;
    size_t size;
    char *base;
};

enum { ZC_DESC, ZC_VOTE, ZC_DONE, ZC_FALLBACK, ZC_FINISHED };

struct weft_zcopy_op {
    const struct weft_task *task;
    struct ncclComm *comm;
    int phase;
    int decided;
    struct weft_lane normal; /* the controller lane as built with its normal schedule (fallback) */
    int direct; /* decided: zero-copy (the other channels' lanes then have nothing to do) */
    /* exchanges */
    struct weft_step *desc_steps, *word_steps;
    uint64_t desc_nsteps, word_nsteps;
    uint64_t desc[ZD_WORDS];
    uint64_t *descs; /* [nranks][ZD_WORDS] */
    uint64_t word;
    uint64_t *words; /* [nranks] */
    char *tmp;       /* WEFT_ZCOPY_PIECE bytes: a reduced piece */
    /* the peers' buffers in this address space */
    const char **in;
    char **out;
    char *cma; /* [nranks]: 1 where peer k's input was read already (process_vm_readv) */
    struct weft_redop *ops; /* [nranks]: the operator with rank k's scalar */
};

/* Equal on two ranks: the same address space (with the same pid and PID namespace). */
static uint64_t weft_zcopy_nonce(void)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t nonce;
    static pid_t owner;
    pthread_mutex_lock(&lock);
    if (owner != getpid()) { /* a forked child is another address space */
        if (weft_auth_random(&nonce, sizeof(nonce)) != ncclSuccess)
            nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&nonce;
        nonce |= 1; /* never 0 */
        owner = getpid();
    }
    uint64_t n = nonce;
    pthread_mutex_unlock(&lock);
    return n;
}

static void weft_zcopy_sizes(const struct weft_task *task, size_t *in_p, size_t *out_p)
{
    size_t bytes = task->count * weft_dtype_size(task->dtype);
    size_t n = (size_t)task->comm->nranks;
    *in_p = task->coll == WEFT_COLL_REDUCESCATTER ? n * bytes : bytes;
    *out_p = task->coll == WEFT_COLL_ALLGATHER ? n * bytes : bytes;
}

void weft_zcopy_setup(struct ncclComm *comm)
{
    /* The knob as every rank holds it (the settings check made them equal), one machine (the
     * boot id, not NCCL_HOSTID) and shared memory allowed on every rank. */
    const struct weft_peer_info *pi = comm->peer_info;
    int64_t min = pi[0].settings[WEFT_SETTING_ZCOPY_MIN_BYTES];
    int ok = min > 0 && comm->nranks > 1;
    for (int p = 0; p < comm->nranks && ok; p++)
        ok = pi[p].machine_hash == pi[0].machine_hash && pi[p].host_hash == pi[0].host_hash &&
             !(pi[p].flags & WEFT_PEER_NO_SHM);
    comm->zcopy_min_bytes = ok ? (uint64_t)min : UINT64_MAX;
}

int weft_zcopy_candidate(const struct weft_task *task)
{
    if (task->coll != WEFT_COLL_ALLREDUCE && task->coll != WEFT_COLL_ALLGATHER &&
        task->coll != WEFT_COLL_REDUCESCATTER)
        return 0;
    size_t in, out;
    weft_zcopy_sizes(task, &in, &out);
    return (in > out ? in : out) >= task->comm->zcopy_min_bytes;
}

static void weft_zcopy_describe(struct ncclComm *comm, const void *buf, size_t bytes, uint64_t *d)
{
    memset(d, 0, ZD_BUF_WORDS * sizeof(*d));
    d[ZB_PTR] = (uint64_t)(uintptr_t)buf;
    if (!weft_mem_reg_covers(comm, buf, bytes))
        return;
    d[ZB_FLAGS] = WEFT_ZCOPY_REG;
    size_t offset, block;
    int fd = weft_mem_lookup(buf, bytes, &offset, &block);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return;
    d[ZB_FLAGS] |= WEFT_ZCOPY_MEMFD;
    d[ZB_FD] = (uint64_t)fd;
    d[ZB_DEV] = (uint64_t)st.st_dev;
    d[ZB_INO] = (uint64_t)st.st_ino;
    d[ZB_SIZE] = block;
    d[ZB_OFFSET] = offset;
}

/* Peer's memfd `fd` as a descriptor of this process; -1 when it cannot be had. */
static int weft_zcopy_take_fd(int pid, int fd)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd >= 0) {
        int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
        close(pidfd);
        if (got >= 0)
            return got;
    }
#endif
    /* pidfd_getfd needs ptrace rights over the peer; /proc/<pid>/fd needs fewer (Yama). */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

/* Peer p's buffer described by d (bytes long) in this address space; NULL when it cannot be. */
static char *weft_zcopy_map_buf(struct ncclComm *comm, int p, uint64_t nonce, const uint64_t *d,
                                size_t bytes)
{
    const struct weft_peer_info *pi = &comm->peer_info[p], *self = &comm->peer_info[comm->rank];
    if (!(d[ZB_FLAGS] & WEFT_ZCOPY_REG))
        return NULL;
    if (nonce == weft_zcopy_nonce() && pi->pid == self->pid && pi->pid_ns == self->pid_ns)
        return (char *)(uintptr_t)d[ZB_PTR];
    /* Another process: only through its memfd, and only with a pid that means that process. */
    if (!(d[ZB_FLAGS] & WEFT_ZCOPY_MEMFD) || pi->pid_ns != self->pid_ns || pi->pid_ns == 0 ||
        d[ZB_OFFSET] > d[ZB_SIZE] || bytes > d[ZB_SIZE] - d[ZB_OFFSET])
        return NULL;
    char *base = NULL;
    pthread_mutex_lock(&comm->reg_lock);
    for (struct weft_zcopy_map *m = comm->zcopy_maps; m != NULL && base == NULL; m = m->next)
        if (m->nonce == nonce && m->pid == pi->pid && m->dev == d[ZB_DEV] &&
            m->ino == d[ZB_INO] && m->size == d[ZB_SIZE])
            base = m->base;
    pthread_mutex_unlock(&comm->reg_lock);
    if (base != NULL)
        return base + d[ZB_OFFSET];
    int fd = weft_zcopy_take_fd(pi->pid, (int)d[ZB_FD]);
    if (fd < 0) {
        WEFT_INFO(WEFT_LOG_REG, "rank %d: cannot take peer %d's memfd %d (pid %d): %s",
                  comm->rank, p, (int)d[ZB_FD], pi->pid, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != d[ZB_DEV] ||
        (uint64_t)st.st_ino != d[ZB_INO] || (uint64_t)st.st_size != d[ZB_SIZE]) {
        WEFT_INFO(WEFT_LOG_REG, "rank %d: peer %d's fd %d is not the memfd it described",
                  comm->rank, p, (int)d[ZB_FD]);
        close(fd);
        return NULL;
    }
    struct weft_zcopy_map *m = calloc(1, sizeof(*m));
    void *ptr = m == NULL ? MAP_FAILED
                          : mmap(NULL, d[ZB_SIZE], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the pages */
    if (ptr == MAP_FAILED) {
        WEFT_INFO(WEFT_LOG_REG, "rank %d: cannot map %llu bytes of peer %d's memory",
                  comm->rank, (unsigned long long)d[ZB_SIZE], p);
        free(m);
        return NULL;
    }
    *m = (struct weft_zcopy_map){NULL, nonce, pi->pid, d[ZB_DEV], d[ZB_INO], d[ZB_SIZE], ptr};
    pthread_mutex_lock(&comm->reg_lock);
    m->next = comm->zcopy_maps;
    comm->zcopy_maps = m;
    pthread_mutex_unlock(&comm->reg_lock);
    return (char *)ptr + d[ZB_OFFSET];
}

/* A lane running the DIRECT all-gather of `words` words per rank on channel 0. */
static struct weft_step *weft_zcopy_ag_steps(struct ncclComm *comm, uint64_t words,
                                             uint64_t *nsteps_p)
{
    struct weft_sched_args args = {
        .coll = WEFT_COLL_ALLGATHER, .algo = WEFT_ALGO_DIRECT, .count = words,
        .nranks = comm->nranks, .rank = comm->rank, .root = 0, .channel = 0, .nchannels = 1,
        .chunk = words, .ring = comm->ring, .ring_pos = comm->ring_pos,
        .local_ranks = comm->hier_k,
    };
    uint64_t max = weft_sched_max_steps(&args);
    struct weft_step *steps = weft_arena_alloc(max * sizeof(*steps));
    if (steps == NULL)
        return NULL;
    *nsteps_p = weft_sched_build(&args, steps, max);
    return *nsteps_p == UINT64_MAX ? NULL : steps;
}

static void weft_zcopy_lane_words(struct weft_lane *lane, const uint64_t *in, uint64_t *out,
                                  const struct weft_step *steps, uint64_t nsteps)
{
    lane->steps = steps;
    lane->nsteps = nsteps;
    lane->input = in;
    lane->output = out;
    lane->elem_size = sizeof(uint64_t);
    lane->op = NULL;
    lane->cur = 0;
    lane->cur_done = 0;
}

struct weft_zcopy_op *weft_zcopy_begin(const struct weft_task *task, struct weft_lane *lane)
{
    struct ncclComm *comm = task->comm;
    int n = comm->nranks;
    struct weft_zcopy_op *zc = weft_arena_alloc(sizeof(*zc));
    if (zc == NULL)
        goto oom;
    memset(zc, 0, sizeof(*zc));
    zc->task = task;
    zc->comm = comm;
    zc->normal = *lane;
    zc->descs = weft_arena_alloc((size_t)n * ZD_WORDS * sizeof(uint64_t));
    zc->words = weft_arena_alloc((size_t)n * sizeof(uint64_t));
    zc->in = weft_arena_alloc((size_t)n * sizeof(*zc->in));
    zc->out = weft_arena_alloc((size_t)n * sizeof(*zc->out));
    zc->cma = weft_arena_alloc((size_t)n);
    zc->tmp = weft_arena_alloc(WEFT_ZCOPY_PIECE);
    zc->ops = weft_arena_alloc((size_t)n * sizeof(*zc->ops));
    zc->desc_steps = weft_zcopy_ag_steps(comm, ZD_WORDS, &zc->desc_nsteps);
    zc->word_steps = weft_zcopy_ag_steps(comm, 1, &zc->word_nsteps);
    if (zc->descs == NULL || zc->words == NULL || zc->in == NULL || zc->out == NULL ||
        zc->cma == NULL || zc->tmp == NULL || zc->ops == NULL || zc->desc_steps == NULL ||
        zc->word_steps == NULL)
        goto oom;
    size_t in, out;
    weft_zcopy_sizes(task, &in, &out);
    zc->desc[ZD_VERSION] = WEFT_ZCOPY_VERSION;
    zc->desc[ZD_NONCE] = weft_zcopy_nonce();
    zc->desc[ZD_CALL] = (uint64_t)task->coll | (uint64_t)task->dtype << 8 |
                        (uint64_t)(task->has_redop ? task->redop.kind + 1 : 0) << 16;
    zc->desc[ZD_COUNT] = task->count;
    zc->desc[ZD_SCALAR] = task->has_redop ? task->redop.scalar.u64 : 0;
    weft_zcopy_describe(comm, task->sendbuf, in, &zc->desc[ZD_BUF]);
    weft_zcopy_describe(comm, task->recvbuf, out, &zc->desc[ZD_BUF + ZD_BUF_WORDS]);
    zc->phase = ZC_DESC;
    weft_zcopy_lane_words(lane, zc->desc, zc->descs, zc->desc_steps, zc->desc_nsteps);
    return zc;
oom:
    WEFT_WARN("out of memory planning the zero-copy exchange of %s", task->api);
    return NULL;
}

int weft_zcopy_gated(const struct weft_zcopy_op *zc, struct weft_lane *lane)
{
    if (!zc->decided)
        return 1;
    if (zc->direct)
        lane->nsteps = 0;
    return 0;
}

/*
 * An all-gather's input of peer p that could not be mapped, read straight into block p of this
 * rank's output with process_vm_readv (cross memory attach: one copy, in the kernel). Done
 * before the vote: the peer's input is valid and unchanging from its descriptor until the done
 * exchange, and this rank writes only its own output's block p, which the normal path (should
 * any rank vote no) writes again. Needs another process in this PID namespace (the pid must mean
 * that process), ptrace rights over it (same user, Yama permitting), and a machine where one
 * kernel copy beats two through the FIFOs (core/cma.h); 1 when all was read.
 */
static int weft_zcopy_cma_read(struct ncclComm *comm, int p, const uint64_t *d, char *dst,
                               size_t bytes)
{
    const struct weft_peer_info *pi = &comm->peer_info[p], *self = &comm->peer_info[comm->rank];
    if (!weft_cma_pays() || pi->pid_ns != self->pid_ns || pi->pid_ns == 0 ||
        pi->pid == self->pid)
        return 0;
    size_t done = 0;
    while (done < bytes) {
        struct iovec local = {dst + done, bytes - done};
        struct iovec remote = {(char *)(uintptr_t)d[ZB_PTR] + done, bytes - done};
        ssize_t got = process_vm_readv(pi->pid, &local, 1, &remote, 1, 0);
        if (got <= 0) {
            if (got < 0 && errno == EINTR)
                continue;
            WEFT_INFO(WEFT_LOG_REG, "rank %d: cannot read peer %d's input (pid %d) with "
                      "process_vm_readv: %s", comm->rank, p, pi->pid,
                      got < 0 ? strerror(errno) : "nothing read");
            return 0;
        }
        done += (size_t)got;
    }
    return 1;
}

/* Maps (or, an all-gather's inputs, reads) every buffer this rank needs; the vote: 1 when all
 * could be mapped, 2 when all could be had but some were read, 0 otherwise. */
static int weft_zcopy_map_all(struct weft_zcopy_op *zc)
{
    const struct weft_task *task = zc->task;
    struct ncclComm *comm = zc->comm;
    size_t in, out;
    weft_zcopy_sizes(task, &in, &out);
    /* All-reduce pushes results into every output; the others write only their own. */
    int push = task->coll == WEFT_COLL_ALLREDUCE, vote = 1;
    memset(zc->cma, 0, (size_t)comm->nranks);
    for (int p = 0; p < comm->nranks; p++) {
        const uint64_t *d = &zc->descs[(size_t)p * ZD_WORDS];
        if (d[ZD_VERSION] != WEFT_ZCOPY_VERSION || d[ZD_CALL] != zc->desc[ZD_CALL] ||
            d[ZD_COUNT] != zc->desc[ZD_COUNT])
            return 0;
        if (zc->normal.op != NULL) {
            zc->ops[p] = *zc->normal.op;
            zc->ops[p].scalar.u64 = d[ZD_SCALAR];
        }
        if (p == comm->rank) {
            zc->in[p] = task->sendbuf;
            zc->out[p] = task->recvbuf;
            continue;
        }
        zc->in[p] = weft_zcopy_map_buf(comm, p, d[ZD_NONCE], &d[ZD_BUF], in);
        if (zc->in[p] == NULL && task->coll == WEFT_COLL_ALLGATHER) {
            char *dst = (char *)task->recvbuf + (size_t)p * in;
            if (!weft_zcopy_cma_read(comm, p, &d[ZD_BUF], dst, in))
                return 0;
            zc->cma[p] = 1;
            zc->in[p] = dst;
            vote = 2;
            continue;
        }
        zc->out[p] = push ? weft_zcopy_map_buf(comm, p, d[ZD_NONCE], &d[ZD_BUF + ZD_BUF_WORDS],
                                               out)
                          : NULL;
        if (zc->in[p] == NULL || (push && zc->out[p] == NULL))
            return 0;
    }
    return vote;
}

/*
 * Copies to an output whose lines are not in this core's cache (a reduced piece to the peers, a
 * peer's input into an all-gather's output). On x86-64 with streaming stores: a plain store to a
 * line not in cache first reads it (read for ownership), a third more memory traffic, and
 * glibc's memcpy streams only copies larger than a share of the last-level cache (which this
 * 2-core VM reports as 480 MiB: never). 2 ranks, all-reduce of 64 MiB: memcpy took 50% of the
 * time, the reduction 22%; reduce-scatter 48% and 32%. weft_zcopy_data ends with a store fence,
 * so that the done message (a release store) is not seen before the data.
 */
static void weft_zcopy_put(char *dst, const char *src, size_t bytes)
{
#if defined(__x86_64__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > bytes)
        head = bytes;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    bytes -= head;
    for (; bytes >= 64; bytes -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
#endif
    memcpy(dst, src, bytes);
}

/* dst[0 .. m) = the rank-order reduction of in[k][0 .. m) over every rank k. */
static void weft_zcopy_reduce(const struct weft_zcopy_op *zc, void *dst, size_t off, size_t m)
{
    int n = zc->comm->nranks;
    size_t es = zc->normal.elem_size;
    weft_reduce(&zc->ops[0], dst, NULL, zc->in[0] + off * es, m, WEFT_REDUCE_PRE_B);
    for (int k = 1; k < n; k++)
        weft_reduce(&zc->ops[k], dst, dst, zc->in[k] + off * es, m,
                    WEFT_REDUCE_PRE_B | (k == n - 1 ? WEFT_REDUCE_POST : 0));
}

static void weft_zcopy_data(struct weft_zcopy_op *zc, char *tmp)
{
    const struct weft_task *task = zc->task;
    int n = zc->comm->nranks, me = zc->comm->rank;
    size_t es = zc->normal.elem_size, count = task->count, piece = WEFT_ZCOPY_PIECE / es;
    if (task->coll == WEFT_COLL_ALLGATHER) {
        for (int k = 0; k < n; k++) {
            char *dst = zc->out[me] + (size_t)k * count * es;
            if (dst != zc->in[k] && !zc->cma[k])
                weft_zcopy_put(dst, zc->in[k], count * es);
        }
        goto fence;
    }
    if (task->coll == WEFT_COLL_REDUCESCATTER) {
        int in_place = zc->out[me] == zc->in[me] + (size_t)me * count * es;
        for (size_t e = 0; e < count; e += piece) {
            size_t m = count - e < piece ? count - e : piece;
            weft_zcopy_reduce(zc, tmp, (size_t)me * count + e, m);
            /* In place the output is the input block just read (in cache): plain stores. */
            if (in_place)
                memcpy(zc->out[me] + e * es, tmp, m * es);
            else
                weft_zcopy_put(zc->out[me] + e * es, tmp, m * es);
        }
        goto fence;
    }
    /* All-reduce: block `me`, in whole cache lines so that ranks never write one line. */
    size_t unit = es >= 64 ? 1 : 64 / es;
    size_t per = (count + (size_t)n * unit - 1) / ((size_t)n * unit) * unit;
    size_t lo = (size_t)me * per, hi = lo + per;
    if (hi > count)
        hi = count;
    for (size_t e = lo; e < hi; e += piece) {
        size_t m = hi - e < piece ? hi - e : piece;
        weft_zcopy_reduce(zc, tmp, e, m);
        /* In place the output lines were just read, so they are in cache: plain stores. */
        for (int k = 0; k < n; k++) {
            if (zc->out[k] == zc->in[k])
                memcpy(zc->out[k] + e * es, tmp, m * es);
            else
                weft_zcopy_put(zc->out[k] + e * es, tmp, m * es);
        }
    }
fence:
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

int weft_zcopy_next(struct weft_zcopy_op *zc, struct weft_lane *lane)
{
    struct ncclComm *comm = zc->comm;
    int n = comm->nranks;
    switch (zc->phase) {
    case ZC_DESC:
        zc->word = (uint64_t)weft_zcopy_map_all(zc);
        zc->phase = ZC_VOTE;
        weft_zcopy_lane_words(lane, &zc->word, zc->words, zc->word_steps, zc->word_nsteps);
        return 1;
    case ZC_VOTE: {
        int all = 1, cma = 0;
        for (int p = 0; p < n; p++) {
            all &= zc->words[p] == 1 || zc->words[p] == 2;
            cma |= zc->words[p] == 2;
        }
        if (!all) {
            /* Nothing was written yet: every rank runs the normal schedules. */
            WEFT_INFO(WEFT_LOG_REG, "rank %d: %s of %zu elements: not every rank registered "
                      "mappable buffers; normal path", comm->rank, zc->task->api,
                      zc->task->count);
            zc->decided = 1;
            zc->phase = ZC_FALLBACK;
            *lane = zc->normal; /* not started: its progress state is the initial one */
            return zc->normal.nsteps > 0;
        }
        weft_zcopy_data(zc, zc->tmp);
        zc->direct = 1;
        zc->decided = 1;
        /* Every rank counts the same kind: the votes are the same everywhere. */
        __atomic_fetch_add(cma ? &comm->zcopy_cma_ops : &comm->zcopy_ops, 1, __ATOMIC_RELAXED);
        WEFT_INFO(WEFT_LOG_REG, "rank %d: %s of %zu elements ran zero-copy%s", comm->rank,
                  zc->task->api, zc->task->count, cma ? " (inputs read with process_vm_readv)" : "");
        zc->phase = ZC_DONE;
        weft_zcopy_lane_words(lane, &zc->word, zc->words, zc->word_steps, zc->word_nsteps);
        return 1;
    }
    default:
        zc->phase = ZC_FINISHED;
        return 0;
    }
}

void weft_zcopy_fini(struct ncclComm *comm)
{
    pthread_mutex_lock(&comm->reg_lock);
    while (comm->zcopy_maps != NULL) {
        struct weft_zcopy_map *m = comm->zcopy_maps;
        comm->zcopy_maps = m->next;
        munmap(m->base, m->size);
        free(m);
    }
    pthread_mutex_unlock(&comm->reg_lock);
}

uint64_t weft_zcopy_cma_count(struct ncclComm *comm)
{
    return __atomic_load_n(&comm->zcopy_cma_ops, __ATOMIC_RELAXED);
}
