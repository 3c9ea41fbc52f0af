/*
 * The host executor: runs the tasks of one group to completion in the calling thread.
 *
 * Each task becomes one lane per channel (its schedule for this rank). Lanes that share a
 * communicator and channel use the same connections, so they run in issue order: a lane starts
 * when the previous lane with the same key is done. All other lanes progress together, which is
 * what lets one thread drive several communicators, or many peers, without deadlock.
 *
 * Waiting: after a round in which no lane moved, spin a little, then yield, then sleep on the
 * doorbell of the communicator we are blocked on (see exec/wait.h). While sleeping, every wake-up
 * checks the abort flag, a connection failure a transport's proxy recorded (comm->net_error), the
 * deadline (WEFT_TIMEOUT) and, for a peer on this host, whether its process still exists, so a
 * dead or stuck peer becomes an error naming it instead of a hang.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/param.h"
#include "core/trace.h"
#include "exec/arena.h"
#include "exec/lane.h"
#include "exec/sig.h"
#include "exec/wait.h"
#include "exec/zcopy.h"

WEFT_PARAM(Timeout, "WEFT_TIMEOUT", 300,
           "seconds an operation may wait for a peer without any progress before it fails");
WEFT_PARAM(FuseBytes, "WEFT_FUSE_BYTES", 65536,
           "all-reduces of a group up to this size are packed into one (0 disables)");
WEFT_PARAM(SpinCount, "WEFT_SPIN_COUNT", -1,
           "idle polling rounds before a waiting rank starts yielding its core (-1: 100000, a few "
           "milliseconds, or 0 when the host runs more ranks than it has cores)");
WEFT_PARAM(YieldCount, "WEFT_YIELD_COUNT", -1,
           "sched_yield rounds before a waiting rank sleeps on its doorbell (-1: 1000, or 0 when "
           "a socket proxy thread of the process moves the data)");

static int weft_task_is_p2p(const struct weft_task *task)
{
    return task->coll == WEFT_COLL_SEND || task->coll == WEFT_COLL_RECV;
}

struct weft_exec_lane {
    struct weft_lane lane;
    struct weft_step *steps;
    struct weft_task *task;
    uint64_t seq;
    uint64_t rec; /* its record in comm->sig (exec/sig.h) */
    int prev_same; /* index of the previous lane with the same key, or -1 */
    /* Lanes with equal keys share connections and run in issue order. */
    int key_chan; /* connection channel (comm->nchannels for point-to-point) */
    int key_peer; /* point-to-point: the peer; collectives: -1 */
    int key_dir;  /* point-to-point: 0 send, 1 receive */
    uint64_t done_ns; /* WEFT_TRACE_FILE: when the lane finished (weft_exec_trace) */
    struct weft_zcopy_op *zc; /* a zero-copy candidate's lane (exec/zcopy.h), else NULL */
    int zc_ctl;               /* 1: its controller (channel 0); 0: gated until it decides */
};


static ncclResult_t weft_exec_build(struct weft_task *tasks, int ntasks, const uint64_t *recs,
                                    struct weft_exec_lane **lanes_p, int *nlanes_p)
{
    int total = 0;
    for (int t = 0; t < ntasks; t++)
        total += weft_task_is_p2p(&tasks[t]) ? 1 : tasks[t].comm->nchannels;
    struct weft_exec_lane *lanes = weft_arena_alloc((size_t)total * sizeof(*lanes));
    if (lanes == NULL) {
        WEFT_WARN("out of memory building %d lanes", total);
        return ncclSystemError;
    }
    int n = 0;
    for (int t = 0; t < ntasks; t++) {
        struct weft_task *task = &tasks[t];
        struct ncclComm *comm = task->comm;
        size_t es = weft_dtype_size(task->dtype);
        uint64_t seq = ++comm->op_seq;
        int p2p = weft_task_is_p2p(task);
        int nch = p2p ? 1 : comm->nchannels;
        int algo = weft_tune_algo(task->coll, task->count * es, &comm->tune);
        /* Element sizes are powers of two: a shift, not a 64-bit division (~40 cycles). */
        uint64_t chunk = (weft_slot_payload(comm->slot_bytes) * WEFT_CHUNK_SLOTS) >>
                         __builtin_ctzll(es);
        for (int c = 0; c < nch; c++) {
            struct weft_exec_lane *el = &lanes[n];
            struct weft_sched_args args = {
                .coll = task->coll,
                .algo = algo,
                .count = task->count,
                .nranks = comm->nranks,
                .rank = comm->rank,
                .root = task->root,
                .channel = c,
                .nchannels = nch,
                .chunk = chunk,
                .ring = comm->ring,
                .ring_pos = comm->ring_pos,
                .local_ranks = comm->hier_k,
            };
            uint64_t max = weft_sched_max_steps(&args);
            el->steps = max > 0 ? weft_arena_alloc(max * sizeof(struct weft_step)) : NULL;
            if (max > 0 && el->steps == NULL) {
                WEFT_WARN("out of memory for %llu steps of %s", (unsigned long long)max,
                          task->api);
                return ncclSystemError;
            }
            uint64_t nsteps = weft_sched_build(&args, el->steps, max);
            if (nsteps == UINT64_MAX) {
                WEFT_WARN("%s: no schedule for %s with %d ranks", task->api,
                          weft_coll_name(task->coll), comm->nranks);
                return ncclInternalError;
            }
            el->lane.steps = el->steps;
            el->lane.nsteps = nsteps;
            el->key_chan = p2p ? comm->nchannels : c;
            el->key_peer = p2p ? task->root : -1;
            el->key_dir = task->coll == WEFT_COLL_RECV;
            el->lane.peers = comm->chan_peers[el->key_chan];
            el->lane.nranks = comm->nranks;
            el->lane.input = task->sendbuf;
            el->lane.output = task->recvbuf;
            el->lane.elem_size = es;
            el->lane.op = task->has_redop ? &task->redop : NULL;
            el->lane.ll = weft_tune_ll(task->coll);
            el->lane.sig = weft_sig_enabled() ? weft_sig_of(comm, recs[t])->hash : 0;
            weft_lane_init(&el->lane);
            el->task = task;
            el->seq = seq;
            el->rec = recs[t];
            el->done_ns = 0;
            el->zc = NULL;
            el->zc_ctl = c == 0;
            if (!p2p && (c == 0 ? weft_zcopy_candidate(task) : lanes[n - c].zc != NULL)) {
                el->zc = c == 0 ? weft_zcopy_begin(task, &el->lane) : lanes[n - c].zc;
                if (el->zc == NULL)
                    return ncclSystemError;
                if (c > 0)
                    weft_zcopy_gate(el->zc, &el->lane);
            }
            el->prev_same = -1;
            for (int j = n - 1; j >= 0; j--) {
                if (lanes[j].task->comm == comm && lanes[j].key_chan == el->key_chan &&
                    lanes[j].key_peer == el->key_peer && lanes[j].key_dir == el->key_dir) {
                    el->prev_same = j;
                    break;
                }
            }
            n++;
        }
    }
    *lanes_p = lanes;
    *nlanes_p = n;
    return ncclSuccess;
}

/* Where the executor is stuck, for messages and liveness checks. */
struct weft_exec_block {
    int lane;
    int peer;
    int send;
};

/* One round over every runnable lane. Returns 1 if anything moved, 0 if not, <0 on error. */
static int weft_exec_round(struct weft_exec_lane *lanes, int nlanes, int *ndone_p,
                           struct weft_exec_block *block)
{
    int moved = 0, ndone = 0;
    for (int i = 0; i < nlanes; i++) {
        struct weft_exec_lane *el = &lanes[i];
        if (weft_lane_done(&el->lane)) {
            ndone++;
            continue;
        }
        if (el->prev_same >= 0 && !weft_lane_done(&lanes[el->prev_same].lane))
            continue;
        if (__builtin_expect(el->zc != NULL, 0) && !el->zc_ctl && !weft_zcopy_decided(el->zc))
            continue;
        int peer = -1, send = 0;
        int r = weft_lane_progress(&el->lane, &peer, &send);
        if (r < 0) {
            block->lane = i;
            return -1;
        }
        moved |= r;
        /* A zero-copy controller's phase ended: the next one starts (exec/zcopy.h). */
        if (__builtin_expect(el->zc != NULL, 0) && el->zc_ctl && weft_lane_done(&el->lane) &&
            weft_zcopy_next(el->zc, &el->lane)) {
            moved = 1;
            continue;
        }
        if (weft_lane_done(&el->lane)) {
            ndone++;
            if (__builtin_expect(el->task->enq_ns != 0, 0))
                el->done_ns = weft_time_ns();
        }
        else if (r == 0 && peer >= 0) {
            block->lane = i;
            block->peer = peer;
            block->send = send;
        }
    }
    *ndone_p = ndone;
    return moved;
}

static ncclResult_t weft_exec_lane_error(struct weft_exec_lane *el)
{
    struct ncclComm *comm = el->task->comm;
    if (el->lane.error_sig != 0)
        return weft_sig_mismatch(comm, el->rec, el->lane.error_peer, el->lane.error_sig);
    WEFT_WARN("rank %d: peer %d sent a %u-byte slice where %u bytes were expected in %s "
              "(operation %llu): count or datatype differ between ranks",
              comm->rank, el->lane.error_peer, el->lane.error_got_bytes,
              el->lane.error_want_bytes, el->task->api, (unsigned long long)el->seq);
    return ncclInvalidUsage;
}

/* Where the blocked lane waits, for exec/sig.c. */
static void weft_exec_sig_wait(const struct weft_exec_lane *el, const struct weft_exec_block *block,
                               struct weft_sig_wait *w)
{
    w->rec = el->rec;
    w->peer = block->peer;
    w->send = block->send;
    w->send_conn = block->peer >= 0 ? el->lane.peers[block->peer].send : NULL;
    w->recv_conn = block->peer >= 0 ? el->lane.peers[block->peer].recv : NULL;
}

/* Checks abort, the peer's process and the deadline while blocked. */
static ncclResult_t weft_exec_check_stuck(struct weft_exec_lane *lanes, int nlanes,
                                          const struct weft_exec_block *block, uint64_t idle_ns)
{
    for (int i = 0; i < nlanes; i++) {
        struct ncclComm *comm = lanes[i].task->comm;
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)) {
            WEFT_WARN("rank %d: communicator %s during %s (operation %llu)", comm->rank,
                      comm->revoked ? "revoked" : "aborted", lanes[i].task->api,
                      (unsigned long long)lanes[i].seq);
            return ncclInvalidUsage;
        }
        ncclResult_t net = __atomic_load_n(&comm->net_error, __ATOMIC_ACQUIRE);
        if (net != ncclSuccess) {
            WEFT_WARN("rank %d: %s; %s (operation %llu) fails", comm->rank, comm->net_error_msg,
                      lanes[i].task->api, (unsigned long long)lanes[i].seq);
            return net;
        }
    }
    if (block->lane < 0)
        return ncclSuccess;
    struct weft_exec_lane *el = &lanes[block->lane];
    struct ncclComm *comm = el->task->comm;
    const struct weft_peer_info *peer = &comm->peer_info[block->peer];
    const struct weft_peer_info *self = &comm->peer_info[comm->rank];
    int pid = peer->pid;
    if (!weft_comm_peer_alive(comm, block->peer)) {
        WEFT_WARN("rank %d: peer %d (pid %d, host %s) exited while this rank waited for %s in %s "
                  "(operation %llu)",
                  comm->rank, block->peer, pid, peer->hostname,
                  block->send ? "buffer space" : "data", el->task->api,
                  (unsigned long long)el->seq);
        return ncclRemoteError;
    }
    /* Another local rank died: the ranks we wait for may be stuck behind it, or failed over the
     * network and wait themselves. Name it now rather than a live peer at the deadline. */
    for (int p = 0; p < comm->nranks; p++) {
        const struct weft_peer_info *other = &comm->peer_info[p];
        if (p == block->peer || other->host_hash != self->host_hash || other->pid == self->pid ||
            weft_comm_peer_alive(comm, p))
            continue;
        /* It destroyed the communicator before exiting: its part is done, not a crash. */
        if (comm->peer_departed != NULL && comm->peer_departed[p] != NULL &&
            __atomic_load_n(comm->peer_departed[p], __ATOMIC_ACQUIRE))
            continue;
        WEFT_WARN("rank %d: peer %d (pid %d, host %s) exited while this rank waited for %s from "
                  "peer %d in %s (operation %llu)",
                  comm->rank, p, other->pid, other->hostname,
                  block->send ? "buffer space" : "data", block->peer, el->task->api,
                  (unsigned long long)el->seq);
        return ncclRemoteError;
    }
    uint64_t timeout_ns = (uint64_t)weft_param_Timeout() * 1000000000ull;
    if (idle_ns > timeout_ns) {
        char msg[1024];
        snprintf(msg, sizeof(msg),
                 "rank %d: no progress for %llu s waiting for %s from peer %d (host %s) in %s "
                 "(operation %llu); the peer is stuck or issued different operations",
                 comm->rank, (unsigned long long)(idle_ns / 1000000000ull),
                 block->send ? "buffer space" : "data", block->peer, peer->hostname,
                 el->task->api, (unsigned long long)el->seq);
        struct weft_sig_wait w;
        weft_exec_sig_wait(el, block, &w);
        WEFT_CHECK(weft_sig_deadline(comm, &w, idle_ns, msg, sizeof(msg)));
        WEFT_WARN("%s", msg);
        return ncclRemoteError;
    }
    return ncclSuccess;
}

/*
 * Whether other processes crowd the machine: more runnable tasks (the kernel's instantaneous
 * count, /proc/loadavg's fourth field) than twice the online CPUs, sampled at most every 100 ms
 * by whichever rank asks. Then a waiting rank must not spin: the peer it waits for is likely not
 * running, and spinning holds a core the peer needs. 2 ranks on 2 cores with ~20 runnable tasks
 * of other jobs: 8 B all-reduce 5-13 ms per call spinning 100000 rounds first, 3.8 us yielding at
 * once; 1 MiB 2.1-86 ms against 0.33-0.58 ms. One CPU hog (3 runnable on 2 cores) is not
 * crowded: there the long spin keeps the core (0.17 us against 29 us, below).
 */
static int weft_exec_machine_crowded(void)
{
    static uint64_t checked_ns;
    static int crowded, ncpu;
    uint64_t now = weft_time_coarse_ns(); /* called on every wait: the cheap clock */
    if (now - __atomic_load_n(&checked_ns, __ATOMIC_RELAXED) < 100000000ull)
        return __atomic_load_n(&crowded, __ATOMIC_RELAXED);
    __atomic_store_n(&checked_ns, now, __ATOMIC_RELAXED);
    if (__atomic_load_n(&ncpu, __ATOMIC_RELAXED) == 0)
        __atomic_store_n(&ncpu, (int)sysconf(_SC_NPROCESSORS_ONLN), __ATOMIC_RELAXED);
    int c = 0, fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[128];
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        int running = 0;
        if (n > 0) {
            buf[n] = '\0';
            if (sscanf(buf, "%*f %*f %*f %d/", &running) == 1)
                c = ncpu > 0 && running > 2 * ncpu;
        }
    }
    __atomic_store_n(&crowded, c, __ATOMIC_RELAXED);
    return c;
}

/*
 * How long to poll before giving the core away. With a core per rank, polling answers a peer in
 * a fraction of a microsecond, and it must go on for milliseconds: a rank that yields or sleeps
 * sooner hands its core to any other process on the machine and pays ~30 us to get it back on
 * every operation (measured: 2 ranks and one CPU hog on 2 cores, 8 B all-reduce 29 us after 1000
 * polling rounds, 0.17 us after 100000, Open MPI 0.15 us). With more ranks than cores, the peer
 * we wait for may need our core to run at all: then yield at once (sched_yield hands the core to a
 * runnable rank; when none is runnable it returns in well under a microsecond), and sleep only
 * after a long idle stretch. "More ranks than cores" is the job's view, not the communicator's:
 * a 2-rank group split from an 8-rank job on 2 cores polled for milliseconds per wait while its
 * peer waited for a core (weft-train dp 4 x tp 2: 1,200 tok/s, 46,000 with dp 8 alone).
 */
static void weft_exec_wait_policy(const struct ncclComm *comm, int64_t *spins_p, int64_t *yields_p)
{
    int64_t spins = weft_param_SpinCount(), yields = weft_param_YieldCount();
    int crowded = comm->oversubscribed || __atomic_load_n(&weft_host_oversubscribed,
                                                          __ATOMIC_RELAXED);
    /* A proxied rank brings a proxy thread: count both against the machine's cores (2 namespaces
     * x 1 rank on 2 cores: 8 B all-reduce 90-118 us polling 1000 rounds, 25-28 us sleeping at
     * once). */
    int ncpu = comm->peer_info[comm->rank].ncpu;
    crowded |= comm->proxied && ncpu > 0 && 2 * comm->machine_ranks > ncpu;
    /* Over sockets the data moves on this process's proxy thread (and in the kernel's TCP
     * path), which needs the core the waiting rank holds: poll briefly, then sleep on the
     * doorbell the proxy rings. Yielding instead kept the rank runnable, and the scheduler gave
     * it half of a core the proxy needed: 2 namespaces x 1 rank on 2 cores, all-reduce 64 MiB,
     * busbw 0.55 GB/s polling for milliseconds, 1.07-1.3 with 1000 rounds then yields, 1.43-1.69
     * sleeping (iperf3 1.52-1.68 per direction); 2x2, 8 B 280-300 us instead of 440-630. */
    crowded |= weft_exec_machine_crowded(); /* other jobs can crowd the machine too */
    *spins_p = spins >= 0 ? spins : crowded ? 0 : comm->proxied ? 1000 : 100000;
    *yields_p = yields >= 0 ? yields : comm->proxied ? 0 : 1000;
}

static ncclResult_t weft_exec_run(struct weft_exec_lane *lanes, int nlanes)
{
    int64_t spins, yields;
    weft_exec_wait_policy(lanes[0].task->comm, &spins, &yields);
    int64_t idle = 0;
    uint64_t idle_since = 0, last_check = 0;
    int multi_comm = 0;
    for (int i = 1; i < nlanes; i++)
        multi_comm |= lanes[i].task->comm != lanes[0].task->comm;
    for (;;) {
        struct weft_exec_block block = {-1, -1, 0};
        int ndone = 0;
        int r = weft_exec_round(lanes, nlanes, &ndone, &block);
        if (r < 0)
            return weft_exec_lane_error(&lanes[block.lane]);
        if (ndone == nlanes)
            return ncclSuccess;
        if (r > 0) {
            idle = 0;
            idle_since = 0;
            continue;
        }
        if (++idle <= spins) {
            weft_cpu_relax();
            continue;
        }
        uint64_t now = weft_time_ns();
        if (idle_since == 0)
            idle_since = now;
        if (idle <= spins + yields) {
            sched_yield();
            continue;
        }
        /* Sleep on the doorbell of the communicator we are blocked on. */
        struct ncclComm *comm = lanes[block.lane >= 0 ? block.lane : 0].task->comm;
        struct weft_doorbell *bell = comm->bell;
        if (bell != NULL) {
            uint32_t seq = __atomic_load_n(&bell->seq, __ATOMIC_ACQUIRE);
            __atomic_fetch_add(&bell->sleepers, 1, __ATOMIC_SEQ_CST);
            r = weft_exec_round(lanes, nlanes, &ndone, &block);
            /* One comm: its doorbell hears every post; several: poll at 100 us. */
            if (r == 0)
                weft_futex_wait(&bell->seq, seq, multi_comm ? 100000 : 50000000);
            __atomic_fetch_sub(&bell->sleepers, 1, __ATOMIC_SEQ_CST);
            if (r < 0)
                return weft_exec_lane_error(&lanes[block.lane]);
            if (r > 0) {
                idle = 0;
                idle_since = 0;
                continue;
            }
        }
        now = weft_time_ns();
        if (now - last_check > 100000000ull) {
            last_check = now;
            /* Only lanes at the head of their connections' order: a later one's FIFO positions
             * are still its predecessor's. Every 100 ms: through a proxy, 100 checks are 10 s. */
            for (int i = 0; i < nlanes; i++)
                if ((lanes[i].prev_same < 0 || weft_lane_done(&lanes[lanes[i].prev_same].lane)) &&
                    weft_lane_check_mismatch(&lanes[i].lane, 100) < 0)
                    return weft_exec_lane_error(&lanes[i]);
            /* Notes from other ranks (mismatches, where they wait) and the hang report. */
            int head = block.lane;
            for (int i = 0; head < 0 && i < nlanes; i++)
                if (!weft_lane_done(&lanes[i].lane))
                    head = i;
            if (head >= 0) {
                struct weft_exec_block b = block.lane >= 0 ? block
                                                           : (struct weft_exec_block){head, -1, 0};
                struct weft_sig_wait w;
                weft_exec_sig_wait(&lanes[head], &b, &w);
                WEFT_CHECK(weft_sig_poll(lanes[head].task->comm, &w, now - idle_since));
            }
            ncclResult_t res = weft_exec_check_stuck(lanes, nlanes, &block, now - idle_since);
            /* A peer may post its last data and exit between our round and the check: look
             * once more before calling it dead. */
            if (res != ncclSuccess && weft_exec_round(lanes, nlanes, &ndone, &block) != 0)
                continue;
            WEFT_CHECK(res);
        }
    }
}

/*
 * Fusion: a run of consecutive small all-reduces on one communicator with the same datatype and
 * operator becomes one all-reduce over a staging buffer (inputs packed, result unpacked), so a
 * group of many small all-reduces pays the per-step latency once.
 */
struct weft_fused {
    int first; /* index of the first original task */
    int count; /* how many original tasks */
    char *stage;
};

/* Longest run packed into one all-reduce (bounds the dependency check below). */
#define WEFT_FUSE_MAX_TASKS 256

/*
 * run[0 .. nrun) are already packed; b joins them if it is the same kind of all-reduce, fits, and
 * does not read what one of them writes (packing reads every input before any result exists).
 */
static int weft_fusable(const struct weft_task *run, int nrun, const struct weft_task *b,
                        size_t total, size_t limit)
{
    const struct weft_task *a = &run[0];
    size_t es = weft_dtype_size(b->dtype);
    if (nrun >= WEFT_FUSE_MAX_TASKS || a->coll != WEFT_COLL_ALLREDUCE ||
        b->coll != WEFT_COLL_ALLREDUCE || a->comm != b->comm || a->dtype != b->dtype ||
        memcmp(&a->redop, &b->redop, sizeof(a->redop)) != 0 || b->count * es > limit ||
        total + b->count * es > limit)
        return 0;
    const char *in = b->sendbuf;
    for (int k = 0; k < nrun; k++) {
        const char *out = run[k].recvbuf;
        if (in < out + run[k].count * es && out < in + b->count * es)
            return 0;
    }
    return 1;
}

static ncclResult_t weft_exec_fuse(struct weft_task *tasks, int ntasks, struct weft_task **out_p,
                                   int *nout_p, struct weft_fused **fused_p, int *nfused_p,
                                   uint64_t **recs_p)
{
    size_t limit = (size_t)weft_param_FuseBytes();
    struct weft_task *out = weft_arena_alloc((size_t)ntasks * sizeof(*out));
    struct weft_fused *fused = weft_arena_alloc((size_t)ntasks * sizeof(*fused));
    uint64_t *recs = weft_arena_alloc((size_t)ntasks * sizeof(*recs));
    if (out == NULL || fused == NULL || recs == NULL) {
        WEFT_WARN("out of memory planning %d operations", ntasks);
        return ncclSystemError;
    }
    int nout = 0, nfused = 0;
    for (int t = 0; t < ntasks;) {
        size_t es = weft_dtype_size(tasks[t].dtype);
        size_t total = tasks[t].count * es;
        int run = 1;
        if (tasks[t].coll == WEFT_COLL_ALLREDUCE && total <= limit)
            while (t + run < ntasks && weft_fusable(&tasks[t], run, &tasks[t + run], total, limit))
                total += tasks[t + run++].count * es;
        out[nout] = tasks[t];
        if (tasks[t].coll == WEFT_COLL_ALLTOALL && tasks[t].sendbuf == tasks[t].recvbuf) {
            /* In place, the pairwise exchange would overwrite blocks before sending them. */
            size_t bytes = tasks[t].count * es * (size_t)tasks[t].comm->nranks;
            void *copy = weft_arena_alloc(bytes);
            if (copy == NULL) {
                WEFT_WARN("out of memory staging an in-place all-to-all (%zu bytes)", bytes);
                return ncclSystemError;
            }
            memcpy(copy, tasks[t].sendbuf, bytes);
            out[nout].sendbuf = copy;
        }
        if (run > 1) {
            char *stage = weft_arena_alloc(total);
            if (stage == NULL) {
                WEFT_WARN("out of memory fusing %d all-reduces (%zu bytes)", run, total);
                return ncclSystemError;
            }
            size_t off = 0;
            for (int k = 0; k < run; k++) {
                memcpy(stage + off, tasks[t + k].sendbuf, tasks[t + k].count * es);
                off += tasks[t + k].count * es;
            }
            out[nout].sendbuf = stage;
            out[nout].recvbuf = stage;
            out[nout].count = total / es;
            fused[nfused++] = (struct weft_fused){t, run, stage};
        }
        weft_sig_begin(tasks[t].comm, &tasks[t], run, &out[nout], &recs[nout]);
        nout++;
        t += run;
    }
    *out_p = out;
    *nout_p = nout;
    *fused_p = fused;
    *nfused_p = nfused;
    *recs_p = recs;
    return ncclSuccess;
}

static void weft_exec_unfuse(const struct weft_task *tasks, const struct weft_fused *fused,
                             int nfused, int copy_out)
{
    for (int f = 0; f < nfused; f++) {
        size_t off = 0;
        for (int k = 0; copy_out && k < fused[f].count; k++) {
            const struct weft_task *t = &tasks[fused[f].first + k];
            size_t bytes = t->count * weft_dtype_size(t->dtype);
            memcpy(t->recvbuf, fused[f].stage + off, bytes);
            off += bytes;
        }
    }
}

/* WEFT_TRACE_FILE: each task's times (its record in comm->sig, exec/sig.h) and its lanes' (lanes
 * of a task are consecutive). */
static void weft_exec_trace(const struct weft_exec_lane *lanes, int nlanes)
{
    for (int i = 0; i < nlanes;) {
        const struct weft_task *task = lanes[i].task;
        const struct weft_op_rec *rec = weft_sig_rec(task->comm, lanes[i].rec);
        uint64_t ends[WEFT_MAX_CHANNELS + 1];
        int nch = 0;
        for (; i < nlanes && lanes[i].task == task; i++)
            if (nch <= WEFT_MAX_CHANNELS)
                ends[nch++] = lanes[i].done_ns;
        size_t es = weft_dtype_size(task->dtype);
        struct weft_trace_op op = {
            .api = task->api, .coll = task->coll, .dtype = task->dtype,
            .algo = weft_task_is_p2p(task) ? -1
                    : weft_tune_algo_quiet(task->coll, task->count * es, &task->comm->tune, NULL),
            .root = task->root, .device = 0, .nch = nch, .seq = lanes[i - 1].seq,
            .count = task->count, .enq_ns = task->enq_ns, .start_ns = rec->start_ns,
            .end_ns = rec->end_ns, .lane_end_ns = ends,
        };
        weft_trace_record(task->comm, &op);
    }
}

ncclResult_t weft_exec_tasks(struct weft_task *orig_tasks, int norig)
{
    struct weft_task *tasks;
    struct weft_fused *fused;
    int ntasks, nfused;
    struct weft_exec_lane *lanes;
    int nlanes;
    uint64_t *recs = NULL;
    ncclResult_t res =
        weft_exec_fuse(orig_tasks, norig, &tasks, &ntasks, &fused, &nfused, &recs);
    if (res == ncclSuccess)
        res = weft_exec_build(tasks, ntasks, recs, &lanes, &nlanes);
    if (res != ncclSuccess) {
        for (int t = 0; recs != NULL && t < ntasks; t++)
            weft_sig_end(tasks[t].comm, recs[t], 1);
        weft_arena_reset();
        return res;
    }
    /* comm->busy is held by the caller (core/submit.c) for every communicator of the tasks. */
    res = weft_exec_run(lanes, nlanes);
    for (int t = 0; t < ntasks; t++) {
        weft_sig_end(tasks[t].comm, recs[t], res != ncclSuccess);
        if (res != ncclSuccess)
            weft_comm_set_error(tasks[t].comm, res);
    }
    if (ntasks > 0 && tasks[0].enq_ns != 0 && res == ncclSuccess)
        weft_exec_trace(lanes, nlanes);
    weft_exec_unfuse(orig_tasks, fused, nfused, res == ncclSuccess);
    weft_arena_reset();
    return res;
}
