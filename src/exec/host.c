/*
 * The host executor: runs the tasks of one group to completion in the calling thread.
 *
 * Each task becomes one lane per channel (its schedule for this rank). Lanes that share a
 * communicator and channel use the same connections, so they run in issue order: a lane starts
 * when the previous lane with the same key is done. All other lanes progress together, which is
 * what lets one thread drive several communicators, or many peers, without deadlock.
 *
 * Waiting: after a round in which no lane moved, spin a little, then yield, then sleep on the
 * doorbell of the communicator we are blocked on (see fifo.h). While sleeping, every wake-up
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
           "runs of 3 or more all-reduces of a group, together up to this size, are packed into "
           "one (0 disables)");
WEFT_PARAM(SingleCopyMinBytes, "WEFT_SINGLE_COPY_MIN_BYTES", 65536,
           "send/recv, all-to-all (out of place), gather and scatter steps of at least this many "
           "bytes between ranks of one host move in one copy: the receiver reads the sender's "
           "buffer (memcpy in one process, process_vm_readv from another) instead of two copies "
           "through the FIFO (0: never; at least 4096)");
WEFT_PARAM(SpinCount, "WEFT_SPIN_COUNT", -1,
           "idle polling rounds before a waiting rank starts yielding its core (-1: 100000, a few "
           "milliseconds, or 0 when the host runs more ranks than it has cores)");
WEFT_PARAM(YieldCount, "WEFT_YIELD_COUNT", -1,
           "sched_yield rounds before a waiting rank sleeps on its doorbell (-1: 1000, or 0 when "
           "a socket proxy thread of the process moves the data); 20 ms of them at most");

/*
 * The longest a waiting rank yields before it sleeps on its doorbell, whatever WEFT_YIELD_COUNT
 * says. 1000 yields take about a millisecond while the machine runs only our ranks, but one yield
 * can take a scheduler slice of every other runnable task on the core: with 24 busy loops on 2
 * cores, 1000 yields took 10-25 s. The stuck checks (notes, abort, deadline) run only once the
 * rank sleeps, so a mismatch that moves no data (sig-root) went unnoticed for that long. Asleep,
 * the doorbell wakes it as soon as a peer posts.
 */
#define WEFT_EXEC_YIELD_MAX_NS 20000000ull
/* Polls of one awaited word between two full rounds (exec/wait.h: weft_lane_watch). The rounds
 * in between check the other conditions (a mismatch seen on the other FIFO, errors). */
#define WEFT_EXEC_WATCH_POLLS 64

static int weft_task_is_p2p(const struct weft_task *task)
{
    return task->coll == WEFT_COLL_SEND || task->coll == WEFT_COLL_RECV;
}

/* The task that agrees on a group's fusion (see weft_fuse_scan); names it in messages. */
static const char weft_fuse_agree_api[] = "ncclGroupEnd (fusion agreement)";

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
    int resume; /* a lane of a task some collectives wait for (weft_exec_resume) */
};


/*
 * The schedule cache: the step lists of a communicator's last few operations, so that the same
 * call again, the small-operation loop of every training step and benchmark (a send/recv pair of
 * pipeline parallelism, an all-reduce), skips choosing the algorithm and building the steps (8 B
 * all-reduce: ~30 ns of ~170 per operation at 1 rank; a 2-rank send/recv pair ~700 of ~4400
 * instructions). A schedule's inputs that vary between calls are the collective, count, element
 * size and root or peer (the tuner's choice is a function of those and of the communicator's
 * shared values, comm->tune; channels, chunk, ring and rank are the communicator's), so a cached
 * list is exactly what every rank would build again. Buffers are not in the steps (offsets only).
 * Cached calls log no TUNING line: the choice was logged when built. Only short lists are kept,
 * WEFT_EXEC_CACHE_ENTRIES of them, replaced in turn. Zero-copy candidates (exec/zcopy.h) take
 * their own path and are never cached.
 *
 * An entry keeps the lanes as they were built, too: everything in a lane but the buffers, the
 * operator, the signature and the task's own numbers is a function of the same inputs. A lone
 * task (weft_exec_one) runs the entry's lanes in place with those few fields set and the step
 * engine's state reset (weft_exec_lane_reuse); the tasks of a group copy lanes and lists (a later
 * task of the group may replace the entry), so no running lane reads an entry while it is
 * rewritten, and the communicator's tickets keep two threads from using it at once. That work
 * lies between a repeated call and its first post, which the peers wait for (2-rank 8 B
 * all-reduce: 2327 -> 2219 instructions per call, callgrind).
 */
#define WEFT_EXEC_CACHE_STEPS 64
#define WEFT_EXEC_CACHE_ENTRIES 4

struct weft_exec_cache_entry {
    uint64_t key;   /* weft_exec_cache_key of the collective, root, element size; 0: empty */
    uint64_t count;
    int nlanes;     /* one per channel (1 for point-to-point) */
    uint64_t total; /* steps of every lane, packed in order in steps[] */
    struct weft_step steps[WEFT_EXEC_CACHE_STEPS];
    struct weft_exec_lane lanes[WEFT_MAX_CHANNELS]; /* as built; their steps are in steps[] */
};

/*
 * A group of the communicator's tasks as it last ran (a send/recv pair of every pipeline step):
 * its tasks' keys and counts in order, and its lanes as built, with their step lists, in one
 * block. A repeat of the group with no fusion plan runs these lanes in place, as a lone task
 * runs its entry's (weft_exec_group_find), instead of finding, copying and ordering every task's.
 * Groups of up to WEFT_EXEC_GROUP_TASKS tasks and WEFT_EXEC_GROUP_STEPS steps are kept,
 * WEFT_EXEC_GROUP_ENTRIES of them, replaced in turn.
 */
#define WEFT_EXEC_GROUP_TASKS 8
#define WEFT_EXEC_GROUP_STEPS 256
#define WEFT_EXEC_GROUP_ENTRIES 2

struct weft_exec_group_entry {
    int ntasks; /* 0: empty */
    uint64_t keys[WEFT_EXEC_GROUP_TASKS];
    uint64_t counts[WEFT_EXEC_GROUP_TASKS];
    int nlanes;
    struct weft_exec_lane *lanes; /* [nlanes], then task_of[nlanes] and the steps: one block */
    int *task_of;                 /* the task (index in the group) of each lane */
};

struct weft_exec_cache {
    int next; /* the entry the next store replaces */
    struct weft_exec_cache_entry entries[WEFT_EXEC_CACHE_ENTRIES];
    int group_next;
    struct weft_exec_group_entry groups[WEFT_EXEC_GROUP_ENTRIES];
};

void weft_exec_cache_free(struct ncclComm *comm)
{
    if (comm->exec_cache == NULL)
        return;
    for (int g = 0; g < WEFT_EXEC_GROUP_ENTRIES; g++)
        free(comm->exec_cache->groups[g].lanes);
    free(comm->exec_cache);
    comm->exec_cache = NULL;
}

/* comm's schedule cache, made on first use (NULL without memory: every call builds). */
static struct weft_exec_cache *weft_exec_cache_get(struct ncclComm *comm)
{
    if (comm->exec_cache == NULL)
        comm->exec_cache = calloc(1, sizeof(struct weft_exec_cache));
    return comm->exec_cache;
}

/* An in-place all-to-all's schedule differs (weft_tune_algo_of). */
static int weft_exec_a2a_in_place(const struct weft_task *task)
{
    return task->coll == WEFT_COLL_ALLTOALL && task->sendbuf == task->recvbuf;
}

/* What, besides the count, selects a schedule: one word to compare (never 0). */
static uint64_t weft_exec_cache_key(const struct weft_task *task)
{
    return 1 | (uint64_t)weft_exec_a2a_in_place(task) << 1 |
           (uint64_t)__builtin_ctzll(weft_dtype_size(task->dtype)) << 2 |
           (uint64_t)(uint8_t)task->coll << 8 | (uint64_t)(uint32_t)task->root << 32;
}

/* The signature hash a task's slices carry (its record rec; 0 with the check off). */
static uint32_t weft_exec_sig(const struct ncclComm *comm, uint64_t rec)
{
    return weft_sig_enabled() ? weft_sig_of(comm, rec)->hash : 0;
}

/* comm's cache entry for key and count when it holds that schedule, else NULL. */
static struct weft_exec_cache_entry *weft_exec_cache_find(const struct ncclComm *comm,
                                                          uint64_t key, uint64_t count)
{
    if (comm->exec_cache == NULL)
        return NULL;
    for (int i = 0; i < WEFT_EXEC_CACHE_ENTRIES; i++) {
        struct weft_exec_cache_entry *c = &comm->exec_cache->entries[i];
        if (c->key == key && c->count == count)
            return c;
    }
    return NULL;
}

/* Keeps lanes[0 .. nch) (task's, just built, not run) and their lists in comm's cache when the
 * lists are short. */
static void weft_exec_cache_store(struct ncclComm *comm, const struct weft_task *task,
                                  uint64_t key, const struct weft_exec_lane *lanes, int nch)
{
    uint64_t total = 0;
    for (int c = 0; c < nch; c++)
        total += lanes[c].lane.nsteps;
    if (total == 0 || total > WEFT_EXEC_CACHE_STEPS)
        return;
    struct weft_exec_cache *cache = weft_exec_cache_get(comm);
    if (cache == NULL)
        return;
    struct weft_exec_cache_entry *e = &cache->entries[cache->next];
    cache->next = (cache->next + 1) % WEFT_EXEC_CACHE_ENTRIES;
    e->key = key;
    e->count = task->count;
    e->nlanes = nch;
    e->total = total;
    struct weft_step *at = e->steps;
    for (int c = 0; c < nch; c++) {
        e->lanes[c] = lanes[c];
        if (lanes[c].lane.nsteps > 0) /* a channel without steps may have no list at all */
            memcpy(at, lanes[c].steps, lanes[c].lane.nsteps * sizeof(*at));
        e->lanes[c].steps = at;
        e->lanes[c].lane.steps = at;
        at += lanes[c].lane.nsteps;
    }
}

/* Readies a cached lane for task's call: this call's buffers, operator, signature and numbers,
 * and the step engine's state afresh. */
static void weft_exec_lane_ready(struct weft_exec_lane *el, struct weft_task *task, uint32_t sig,
                                 uint64_t seq, uint64_t rec)
{
    weft_lane_init(&el->lane);
    el->done_ns = 0;
    el->lane.input = task->sendbuf;
    el->lane.output = task->recvbuf;
    el->lane.op = task->has_redop ? &task->redop : NULL;
    el->lane.sig = sig;
    el->task = task;
    el->seq = seq;
    el->rec = rec;
}

/*
 * Readies the lanes of a cached call for task: `lanes` is the entry's own (a lone task runs them
 * in place) or room for a copy, whose lists are then `steps` (a copy of the entry's). They get
 * this call's buffers, operator, signature and numbers, and the step engine's state afresh.
 */
static void weft_exec_lane_reuse(struct weft_exec_lane *lanes,
                                 const struct weft_exec_cache_entry *hit,
                                 const struct weft_step *steps, struct weft_task *task,
                                 uint32_t sig, uint64_t seq, uint64_t rec)
{
    for (int c = 0; c < hit->nlanes; c++) {
        struct weft_exec_lane *el = &lanes[c];
        if (el != &hit->lanes[c]) {
            *el = hit->lanes[c];
            el->steps = (struct weft_step *)steps + (hit->lanes[c].steps - hit->steps);
            el->lane.steps = el->steps;
        }
        el->prev_same = -1;
        weft_exec_lane_ready(el, task, sig, seq, rec);
    }
}

/* Sets lanes[n].prev_same: the last lane before it with the same connections, or -1. */
static void weft_exec_lane_order(struct weft_exec_lane *lanes, int n)
{
    struct weft_exec_lane *el = &lanes[n];
    el->prev_same = -1;
    for (int j = n - 1; j >= 0; j--) {
        if (lanes[j].task->comm == el->task->comm && lanes[j].key_chan == el->key_chan &&
            lanes[j].key_peer == el->key_peer && lanes[j].key_dir == el->key_dir) {
            el->prev_same = j;
            return;
        }
    }
}

/* WEFT_SINGLE_COPY_MIN_BYTES, 0 when off; at least 4096, so no such step is ever an LL one. */
static uint64_t weft_exec_single_copy_min(void)
{
    int64_t v = weft_param_SingleCopyMinBytes();
    return v <= 0 ? 0 : v < 4096 ? 4096 : (uint64_t)v;
}

/*
 * Builds the lanes of tasks[0 .. ntasks): from the schedule cache, or anew. A task that misses
 * stores its lists in the cache, which may replace an entry another task's lanes read: cached
 * lists are copied then. `once`: the run builds no more lanes later (it has no fusion plan);
 * then, when every task hits, nothing is stored before the lanes end and they read the entries'
 * lists in place (a send/recv pair: two allocations and copies fewer).
 */
static ncclResult_t weft_exec_build(struct weft_task *tasks, int ntasks, const uint64_t *recs,
                                    int once, struct weft_exec_lane **lanes_p, int *nlanes_p)
{
    int in_place = once;
    for (int t = 0; t < ntasks && in_place; t++)
        in_place = weft_exec_cache_find(tasks[t].comm, weft_exec_cache_key(&tasks[t]),
                                        tasks[t].count) != NULL;
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
        int a2a_in_place = weft_exec_a2a_in_place(task);
        /* Whether a task is a zero-copy candidate follows from its key and count: a hit is none. */
        struct weft_exec_cache_entry *hit =
            weft_exec_cache_find(comm, weft_exec_cache_key(task), task->count);
        int zc = hit == NULL && !p2p && weft_zcopy_candidate(task);
        uint32_t sig = weft_exec_sig(comm, recs[t]);
        if (hit != NULL) {
            const struct weft_step *steps = hit->steps;
            if (!in_place) {
                struct weft_step *copy = weft_arena_alloc(hit->total * sizeof(*copy));
                if (copy == NULL) {
                    WEFT_WARN("out of memory for %llu steps of %s",
                              (unsigned long long)hit->total, task->api);
                    return ncclSystemError;
                }
                memcpy(copy, hit->steps, hit->total * sizeof(*copy));
                steps = copy;
            }
            weft_exec_lane_reuse(&lanes[n], hit, steps, task, sig, seq, recs[t]);
            for (int c = 0; c < nch; c++, n++)
                weft_exec_lane_order(lanes, n);
            continue;
        }
        int algo = weft_tune_algo_of(task->coll, a2a_in_place, task->count * es, &comm->tune);
        /* Element sizes are powers of two: a shift, not a 64-bit division (~40 cycles). */
        uint64_t chunk = (weft_slot_payload(comm->slot_bytes) * WEFT_CHUNK_SLOTS) >>
                         __builtin_ctzll(es);
        int ll = weft_tune_ll(&comm->tune.cfg, task->coll);
        /* Only where every SEND step meets a plain RECV on the peer (exec/lane.h), and never an
         * in-place all-to-all, whose receives overwrite blocks a peer may still read. */
        int single_copy = task->coll == WEFT_COLL_SEND || task->coll == WEFT_COLL_GATHER ||
                          task->coll == WEFT_COLL_SCATTER ||
                          (task->coll == WEFT_COLL_ALLTOALL && !a2a_in_place);
        uint64_t direct_min = single_copy ? weft_exec_single_copy_min() : 0;
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
            el->lane.nsteps = nsteps;
            el->lane.steps = el->steps;
            el->key_chan = p2p ? comm->nchannels : c;
            el->key_peer = p2p ? task->root : -1;
            el->key_dir = task->coll == WEFT_COLL_RECV;
            el->lane.peers = comm->chan_peers[el->key_chan];
            el->lane.nranks = comm->nranks;
            el->lane.input = task->sendbuf;
            el->lane.output = task->recvbuf;
            el->lane.elem_size = es;
            el->lane.op = task->has_redop ? &task->redop : NULL;
            el->lane.ll = ll;
            el->lane.sig = sig;
            el->lane.direct_min_bytes = direct_min;
            el->lane.direct_coalesce = task->coll == WEFT_COLL_SEND;
            weft_lane_init(&el->lane);
            el->task = task;
            el->seq = seq;
            el->rec = recs[t];
            el->done_ns = 0;
            el->zc = NULL;
            el->zc_ctl = c == 0;
            if (zc) {
                el->zc = c == 0 ? weft_zcopy_begin(task, &el->lane) : lanes[n - c].zc;
                if (el->zc == NULL)
                    return ncclSystemError;
            }
            el->resume = 0;
            weft_exec_lane_order(lanes, n);
            n++;
        }
        if (!zc)
            weft_exec_cache_store(comm, task, weft_exec_cache_key(task), lanes + n - nch, nch);
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
        if (__builtin_expect(el->zc != NULL, 0) && !el->zc_ctl &&
            weft_zcopy_gated(el->zc, &el->lane))
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
    if (el->lane.error_errno != 0) {
        int p = el->lane.error_peer;
        WEFT_WARN("rank %d: cannot read the data peer %d (pid %d) sent in %s (operation %llu) "
                  "with process_vm_readv: %s", comm->rank, p, comm->peer_info[p].pid,
                  el->task->api, (unsigned long long)el->seq, strerror(el->lane.error_errno));
        return ncclSystemError;
    }
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
            /* Name what this rank waited for when the wait was this communicator's. */
            char awaited[WEFT_HOSTNAME_LEN + 96] = "", where[WEFT_HOSTNAME_LEN + 48];
            if (block->lane >= 0 && block->peer >= 0 && lanes[block->lane].task->comm == comm)
                snprintf(awaited, sizeof(awaited), " while it waited for %s from peer %d (%s)",
                         block->send ? "buffer space" : "data", block->peer,
                         weft_comm_peer_where(comm, block->peer, where, sizeof(where)));
            WEFT_WARN("rank %d: communicator %s during %s (operation %llu)%s", comm->rank,
                      comm->revoked ? "revoked" : "aborted", lanes[i].task->api,
                      (unsigned long long)lanes[i].seq, awaited);
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
        char msg[1024], where[WEFT_HOSTNAME_LEN + 48];
        snprintf(msg, sizeof(msg),
                 "rank %d: no progress for %llu s waiting for %s from peer %d (%s) in %s "
                 "(operation %llu); the peer is stuck or issued different operations",
                 comm->rank, (unsigned long long)(idle_ns / 1000000000ull),
                 block->send ? "buffer space" : "data", block->peer,
                 weft_comm_peer_where(comm, block->peer, where, sizeof(where)), el->task->api,
                 (unsigned long long)el->seq);
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

/* Index of the first lane of a task others wait for whose lanes are all done, or -1. */
static int weft_exec_resume_lane(const struct weft_exec_lane *lanes, int nlanes)
{
    for (int i = 0; i < nlanes;) {
        if (!lanes[i].resume) {
            i++;
            continue;
        }
        int j = i, done = 1;
        for (; j < nlanes && lanes[j].task == lanes[i].task; j++)
            done &= weft_lane_done(&lanes[j].lane);
        if (done)
            return i;
        i = j;
    }
    return -1;
}

/* Runs the lanes to completion; with `resuming`, returns ncclInProgress as soon as a task others
 * wait for is done (the caller adds them, weft_exec_resume, and calls again). */
static ncclResult_t weft_exec_run(struct weft_exec_lane *lanes, int nlanes, int resuming)
{
    /* The wait policy and the lanes' communicators are looked at only once a round finds
     * nothing to do: a lane that never waits skips them, and a rank that waits for its peer
     * spends that time anyway (a clock read and four knob reads off the 8 B path). */
    int64_t spins = -1, yields = 0;
    int64_t idle = 0;
    uint64_t idle_since = 0, last_check = 0;
    int multi_comm = 0;
    for (;;) {
        struct weft_exec_block block = {-1, -1, 0};
        int ndone = 0;
        int r = weft_exec_round(lanes, nlanes, &ndone, &block);
        if (r < 0)
            return weft_exec_lane_error(&lanes[block.lane]);
        if (resuming && weft_exec_resume_lane(lanes, nlanes) >= 0)
            return ncclInProgress;
        if (ndone == nlanes)
            return ncclSuccess;
        if (r > 0) {
            idle = 0;
            idle_since = 0;
            continue;
        }
        if (__builtin_expect(spins < 0, 0)) {
            weft_exec_wait_policy(lanes[0].task->comm, &spins, &yields);
            for (int i = 1; i < nlanes; i++)
                multi_comm |= lanes[i].task->comm != lanes[0].task->comm;
        }
        if (idle < spins) {
            /* The one lane left waits for a slice: watch that word alone until it comes. */
            const struct weft_lane *last = block.lane >= 0 ? &lanes[block.lane].lane : NULL;
            if (ndone == nlanes - 1 && last != NULL && !block.send && last->awaited != NULL) {
                idle += 1 + weft_lane_watch(last, WEFT_EXEC_WATCH_POLLS);
            } else {
                idle++;
                weft_cpu_relax();
            }
            continue;
        }
        idle++;
        uint64_t now = weft_time_ns();
        if (idle_since == 0)
            idle_since = now;
        if (idle <= spins + yields && now - idle_since < WEFT_EXEC_YIELD_MAX_NS) {
            sched_yield();
            continue;
        }
        /* Sleep on the doorbell of the communicator we are blocked on. */
        struct ncclComm *comm = lanes[block.lane >= 0 ? block.lane : 0].task->comm;
        struct weft_doorbell *bell = comm->bell;
        if (bell != NULL) {
            uint32_t seq = __atomic_load_n(&bell->seq, __ATOMIC_ACQUIRE);
            int deaf = weft_doorbell_enter(bell) != 0;
            r = weft_exec_round(lanes, nlanes, &ndone, &block);
            /* One comm: its doorbell hears every post; several (or one that may not hear a post):
             * poll at 100 us. */
            if (r == 0)
                weft_futex_wait(&bell->seq, seq, multi_comm || deaf ? 100000 : 50000000);
            weft_doorbell_leave(bell);
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
 * Fusion: a run of consecutive small all-reduces of one communicator (the same datatype and
 * operator, together within WEFT_FUSE_BYTES) becomes one all-reduce over a staging buffer (inputs
 * packed, result unpacked), so a group of many small all-reduces pays the per-step latency once.
 *
 * Every rank must fuse alike (the fused all-reduce is one operation on the wire), but whether a
 * member may join depends on this rank's buffers: packing reads every input before any result
 * exists, so a member that reads what an earlier one of its run writes (buffers chained
 * differently on each rank) cannot join, nor can a PreMulSum whose scalar (each rank's own)
 * differs. So the runs are found from values every rank has (the communicator's collectives in
 * order, their kinds and sizes; point-to-point and other communicators' tasks in between do not
 * count, having no order against the collectives anyway), and a run of WEFT_FUSE_MIN_RUN or more
 * is cut where any rank needs it: each rank marks, member by member, where its own greedy packing
 * must start a new piece (1) or not (0), and a tiny all-reduce (uint8, max) of those marks over
 * the communicator decides. The union of every rank's cuts suits every rank (a piece of a run
 * that has no chaining has none either). Shorter runs are never fused: no agreement, no
 * addresses.
 *
 * The agreement is an operation of the group like the others, run by the same executor beside
 * every task that does not wait for it (other communicators, point-to-point, this communicator's
 * collectives before the run). So agreements of several communicators need no order that every
 * process shares (ranks may issue the communicators in any order), and a rank in an agreement
 * still serves the group's other operations, which a peer may need before it reaches its own
 * agreement: running the agreements first, one after another, could deadlock in both cases. When
 * its lanes are done, the communicator's remaining collectives are planned from the agreed cuts
 * and join the running lanes. One agreement per communicator and group.
 *
 * A later collective may read what a fused piece writes (that is why a rank cut there), and the
 * members' results exist only once the whole piece is done and unpacked: so the collectives after
 * a fused piece are added when it is done, after its results are copied out.
 */
struct weft_fused {
    const struct weft_task *members; /* copies of the original tasks, in order */
    int count;
    char *stage;
    int unpacked; /* its results were copied out */
};

/* Longest run packed into one all-reduce. */
#define WEFT_FUSE_MAX_TASKS 256
/* Shortest run worth an agreement: it costs about one small all-reduce and saves run - 1 of
 * them (all_reduce_perf -b 8 -e 8 -m 4|8 on a shared 2-core machine: the agreement added 1.9-2.1
 * us per group on 2 ranks, where one 8 B all-reduce took about 2, and 8-13 us on 4, one 5-8). */
#define WEFT_FUSE_MIN_RUN 3

/* A communicator of the group with a run worth agreeing on. */
struct weft_fuse_plan {
    struct ncclComm *comm;
    struct weft_task **held; /* its collectives from the first such run on, in order */
    int nheld;
    uint8_t *cut; /* [nheld]: 1 where a piece starts (this rank's view, then agreed) */
    int next;     /* held[next ..] are not planned yet */
    int wait;     /* they wait for this executed task (agreement or fused piece); -1: none */
    int wait_fused; /* the fused piece waited for (unpacked first), in fused[]; -1: none */
};

/* Whether b may join a run of a, by values every rank of the communicator has. */
static int weft_fuse_same_kind(const struct weft_task *a, const struct weft_task *b)
{
    return b->coll == WEFT_COLL_ALLREDUCE && a->comm == b->comm && a->dtype == b->dtype &&
           a->redop.kind == b->redop.kind && a->redop.premul == b->redop.premul &&
           a->redop.postdiv == b->redop.postdiv;
}

/* Length of the run starting at list[i] (1: not fusable). */
static int weft_fuse_run(struct weft_task *const *list, int n, int i, size_t limit)
{
    size_t es = weft_dtype_size(list[i]->dtype), total = list[i]->count * es;
    if (list[i]->coll != WEFT_COLL_ALLREDUCE || limit == 0 || total > limit)
        return 1;
    int k = 1;
    while (i + k < n && k < WEFT_FUSE_MAX_TASKS && weft_fuse_same_kind(list[i], list[i + k]) &&
           total + list[i + k]->count * es <= limit)
        total += list[i + k++]->count * es;
    return k;
}

/* This rank's cuts in the run list[i .. i + k): greedy pieces that read no result of their own. */
static void weft_fuse_local_cuts(struct weft_task *const *list, int i, int k, uint8_t *cut)
{
    size_t es = weft_dtype_size(list[i]->dtype);
    int first = i;
    cut[i] = 1;
    for (int m = i + 1; m < i + k; m++) {
        const char *in = list[m]->sendbuf;
        int c = memcmp(&list[m]->redop, &list[first]->redop, sizeof(list[m]->redop)) != 0;
        for (int j = first; j < m && !c; j++) {
            const char *out = list[j]->recvbuf;
            c = in < out + list[j]->count * es && out < in + list[m]->count * es;
        }
        cut[m] = (uint8_t)c;
        if (c)
            first = m;
    }
}

/*
 * Finds the communicators with a run of WEFT_FUSE_MIN_RUN or more; marks their collectives from
 * there on as held (planned once agreed: (*held_p)[task], NULL when there is none) and computes
 * this rank's cuts.
 */
static ncclResult_t weft_fuse_scan(struct weft_task *tasks, int ntasks, uint8_t **held_p,
                                   struct weft_fuse_plan **plans_p, int *nplans_p)
{
    *held_p = NULL;
    *nplans_p = 0;
    if (ntasks < WEFT_FUSE_MIN_RUN)
        return ncclSuccess; /* the common case, one operation: nothing to look at */
    size_t limit = (size_t)weft_param_FuseBytes();
    if (limit == 0)
        return ncclSuccess;
    struct weft_task **list = weft_arena_alloc((size_t)ntasks * sizeof(*list));
    struct weft_fuse_plan *plans = weft_arena_alloc((size_t)ntasks * sizeof(*plans));
    uint8_t *seen = weft_arena_alloc((size_t)ntasks), *held = weft_arena_alloc((size_t)ntasks);
    if (list == NULL || plans == NULL || seen == NULL || held == NULL) {
        WEFT_WARN("out of memory planning %d operations", ntasks);
        return ncclSystemError;
    }
    memset(seen, 0, (size_t)ntasks);
    memset(held, 0, (size_t)ntasks);
    int nplans = 0;
    for (int t = 0; t < ntasks; t++) {
        if (seen[t])
            continue;
        struct ncclComm *comm = tasks[t].comm;
        int n = 0, start = -1;
        for (int u = t; u < ntasks; u++) {
            if (tasks[u].comm != comm)
                continue;
            seen[u] = 1;
            if (!weft_task_is_p2p(&tasks[u]))
                list[n++] = &tasks[u];
        }
        for (int i = 0; i < n && start < 0;)
            if (weft_fuse_run(list, n, i, limit) >= WEFT_FUSE_MIN_RUN)
                start = i;
            else
                i += weft_fuse_run(list, n, i, limit);
        if (start < 0)
            continue;
        struct weft_fuse_plan *p = &plans[nplans++];
        p->comm = comm;
        p->nheld = n - start;
        p->held = weft_arena_alloc((size_t)p->nheld * sizeof(*p->held));
        p->cut = weft_arena_alloc((size_t)p->nheld);
        if (p->held == NULL || p->cut == NULL) {
            WEFT_WARN("out of memory planning %d operations", ntasks);
            return ncclSystemError;
        }
        memcpy(p->held, list + start, (size_t)p->nheld * sizeof(*p->held));
        memset(p->cut, 1, (size_t)p->nheld); /* runs shorter than WEFT_FUSE_MIN_RUN: singles */
        for (int i = 0; i < p->nheld;) {
            int k = weft_fuse_run(p->held, p->nheld, i, limit);
            if (k >= WEFT_FUSE_MIN_RUN)
                weft_fuse_local_cuts(p->held, i, k, p->cut);
            i += k;
        }
        for (int i = 0; i < p->nheld; i++)
            held[p->held[i] - tasks] = 1;
        p->next = 0;
        p->wait = -1;
        p->wait_fused = -1;
    }
    *held_p = nplans > 0 ? held : NULL;
    *plans_p = plans;
    *nplans_p = nplans;
    return ncclSuccess;
}

/* What the executor runs: tasks (single, fused or agreements) and their signature records. */
struct weft_exec_plan {
    struct weft_task *tasks;
    uint64_t *recs;
    int ntasks;
    struct weft_fused *fused;
    int nfused;
    int nlaned; /* tasks[0 .. nlaned) have lanes */
    uint8_t *waited; /* [task]: collectives of a plan wait for it; NULL: no plan */
};

/* Adds members[0 .. k) as one task (fused when k > 1). */
static ncclResult_t weft_exec_emit(struct weft_exec_plan *x, struct weft_task *const *members,
                                   int k)
{
    struct weft_task *task = &x->tasks[x->ntasks];
    const struct weft_task *first = members[0];
    size_t es = weft_dtype_size(first->dtype);
    *task = *first;
    const struct weft_task *sig_tasks = first;
    if (k > 1) {
        struct weft_task *copies = weft_arena_alloc((size_t)k * sizeof(*copies));
        size_t total = 0;
        for (int m = 0; m < k; m++)
            total += members[m]->count * es;
        char *stage = weft_arena_alloc(total);
        if (copies == NULL || stage == NULL) {
            WEFT_WARN("out of memory fusing %d all-reduces (%zu bytes)", k, total);
            return ncclSystemError;
        }
        size_t off = 0;
        for (int m = 0; m < k; m++) {
            copies[m] = *members[m];
            memcpy(stage + off, members[m]->sendbuf, members[m]->count * es);
            off += members[m]->count * es;
        }
        task->sendbuf = stage;
        task->recvbuf = stage;
        task->count = total / es;
        x->fused[x->nfused++] = (struct weft_fused){copies, k, stage, 0};
        sig_tasks = copies;
        WEFT_INFO(WEFT_LOG_COLL, "rank %d: %d all-reduces fused into one of %zu elements",
                  first->comm->rank, k, task->count);
    }
    weft_sig_begin(first->comm, sig_tasks, k, task, &x->recs[x->ntasks]);
    x->ntasks++;
    return ncclSuccess;
}

/*
 * Adds the plan's held collectives from p->next on, in pieces at the (agreed) cuts. Packing reads
 * a fused piece's inputs at once, so it comes only once every earlier collective of the
 * communicator is done (it is first, after what the plan waited for), and what follows it waits
 * until it is done and unpacked: p->wait.
 */
static ncclResult_t weft_exec_emit_held(struct weft_exec_plan *x, struct weft_fuse_plan *p)
{
    p->wait = -1;
    p->wait_fused = -1;
    for (int first = 1; p->next < p->nheld; first = 0) {
        int i = p->next, m = 1;
        while (i + m < p->nheld && p->cut[i + m] == 0)
            m++;
        if (m > 1 && !first) {
            p->wait = x->ntasks - 1; /* the communicator's last collective (lanes in order) */
            x->waited[p->wait] = 1;
            break;
        }
        WEFT_CHECK(weft_exec_emit(x, p->held + i, m));
        p->next += m;
        if (m > 1 && p->next < p->nheld) {
            p->wait = x->ntasks - 1;
            p->wait_fused = x->nfused - 1;
            x->waited[p->wait] = 1;
            break;
        }
    }
    return ncclSuccess;
}

/* Adds the agreement on p's cuts: an all-reduce (max) of them, in place. */
static ncclResult_t weft_exec_emit_agree(struct weft_exec_plan *x, struct weft_fuse_plan *p)
{
    struct weft_task *task = &x->tasks[x->ntasks];
    *task = (struct weft_task){
        .comm = p->comm,
        .coll = WEFT_COLL_ALLREDUCE,
        .sendbuf = p->cut,
        .recvbuf = p->cut,
        .count = (size_t)p->nheld,
        .dtype = ncclUint8,
        .has_redop = 1,
        .redop = {.dtype = ncclUint8, .kind = WEFT_RED_MAX},
        .api = weft_fuse_agree_api,
    };
    p->wait = x->ntasks;
    p->wait_fused = -1;
    x->waited[p->wait] = 1;
    weft_sig_begin(p->comm, task, 1, task, &x->recs[x->ntasks]);
    x->ntasks++;
    return ncclSuccess;
}

/* Copies the results of fused pieces out (those not unpacked yet). */
static void weft_exec_unfuse(struct weft_fused *fused, int nfused)
{
    for (int f = 0; f < nfused; f++) {
        size_t off = 0;
        if (fused[f].unpacked)
            continue;
        fused[f].unpacked = 1;
        for (int k = 0; k < fused[f].count; k++) {
            const struct weft_task *t = &fused[f].members[k];
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
        if (task->api != weft_fuse_agree_api) /* not the user's operation */
            weft_trace_record(task->comm, &op);
    }
}

/* Appends the lanes of x's tasks from `first` on to *lanes_p (lanes of earlier tasks kept). */
static ncclResult_t weft_exec_add_lanes(struct weft_exec_plan *x, int first,
                                        struct weft_exec_lane **lanes_p, int *nlanes_p)
{
    struct weft_exec_lane *add, *all;
    int nadd, n = *nlanes_p;
    WEFT_CHECK(weft_exec_build(x->tasks + first, x->ntasks - first, x->recs + first,
                               x->waited == NULL, &add, &nadd));
    if (n == 0) {
        all = add;
        goto done;
    }
    /* The new lanes' predecessors on their connections are done: the task they waited for. */
    all = weft_arena_alloc((size_t)(n + nadd) * sizeof(*all));
    if (all == NULL) {
        WEFT_WARN("out of memory building %d lanes", n + nadd);
        return ncclSystemError;
    }
    memcpy(all, *lanes_p, (size_t)n * sizeof(*all));
    for (int i = 0; i < nadd; i++) {
        all[n + i] = add[i];
        if (add[i].prev_same >= 0)
            all[n + i].prev_same += n;
    }
done:
    for (int i = n; i < n + nadd; i++)
        all[i].resume = x->waited != NULL && x->waited[all[i].task - x->tasks];
    *lanes_p = all;
    *nlanes_p = n + nadd;
    x->nlaned = x->ntasks;
    return ncclSuccess;
}

/* Adds the collectives that waited for tasks now done (after unpacking a fused piece's
 * results); *left counts the plans still waiting. */
static ncclResult_t weft_exec_resume(struct weft_exec_plan *x, struct weft_fuse_plan *plans,
                                     int nplans, struct weft_exec_lane **lanes_p, int *nlanes_p,
                                     int *left)
{
    int first = x->ntasks;
    for (int i; (i = weft_exec_resume_lane(*lanes_p, *nlanes_p)) >= 0;) {
        const struct weft_task *done = (*lanes_p)[i].task;
        for (; i < *nlanes_p && (*lanes_p)[i].task == done; i++)
            (*lanes_p)[i].resume = 0;
        for (int p = 0; p < nplans; p++) {
            if (plans[p].wait < 0 || &x->tasks[plans[p].wait] != done)
                continue;
            if (plans[p].wait_fused >= 0)
                weft_exec_unfuse(&x->fused[plans[p].wait_fused], 1);
            WEFT_CHECK(weft_exec_emit_held(x, &plans[p]));
            *left -= plans[p].wait < 0;
        }
    }
    if (x->ntasks > first)
        WEFT_CHECK(weft_exec_add_lanes(x, first, lanes_p, nlanes_p));
    return ncclSuccess;
}

uint64_t weft_exec_single_copy_count(const struct ncclComm *comm)
{
    uint64_t n = 0;
    for (int c = 0; c <= comm->nchannels; c++)
        for (int p = 0; comm->chan_peers[c] != NULL && p < comm->nranks; p++)
            if (comm->chan_peers[c][p].recv != NULL)
                n += comm->chan_peers[c][p].recv->direct_reads;
    return n;
}

/* Ends an executor's run of tasks[0 .. ntasks) (of which the first nlaned got lanes) with res:
 * revokes what the peers may still read, closes the tasks' records, marks their communicators on
 * failure and frees the run's scratch memory. */
static void weft_exec_finish(struct weft_task *tasks, const uint64_t *recs, int ntasks, int nlaned,
                             struct weft_exec_lane *lanes, int nlanes, ncclResult_t res)
{
    /* Direct sends the peers never read must not be read once we return (exec/lane.h). */
    for (int i = 0; res != ncclSuccess && i < nlanes; i++)
        weft_lane_revoke_direct(&lanes[i].lane);
    /* Tasks planned but never run (a failure building them) count as failed operations. */
    for (int t = 0; t < ntasks; t++) {
        weft_sig_end(tasks[t].comm, recs[t], res != ncclSuccess);
        if (t < nlaned && res != ncclSuccess)
            weft_comm_set_error(tasks[t].comm, res);
    }
    weft_arena_reset();
}

/* Runs a lone task's lanes. A single lane (small operations have one) moves once before the
 * general loop: its first post comes ~50 instructions sooner, and a lane that ends there (a root
 * that only sends, a peer whose data is in) never enters the loop. */
static ncclResult_t weft_exec_run_lone(struct weft_exec_lane *lanes, int nlanes)
{
    if (nlanes == 1 && lanes->zc == NULL) {
        int peer = -1, send = 0;
        if (weft_lane_progress(&lanes->lane, &peer, &send) < 0)
            return weft_exec_lane_error(lanes);
        if (weft_lane_done(&lanes->lane)) {
            if (__builtin_expect(lanes->task->enq_ns != 0, 0))
                lanes->done_ns = weft_time_ns();
            return ncclSuccess;
        }
    }
    return weft_exec_run(lanes, nlanes, 0);
}

/*
 * One operation, the common case (a call outside a group, or a group of one): what
 * weft_exec_tasks does for it, without its plan (no fusion, no agreement, nothing to resume).
 * Its time from the call to its first post is time every peer waits for (2-rank 8 B all-reduce).
 */
static ncclResult_t weft_exec_one(struct weft_task *task)
{
    uint64_t rec;
    struct weft_exec_lane *lanes = NULL;
    int nlanes = 0;
    struct ncclComm *comm = task->comm;
    weft_sig_begin(comm, task, 1, task, &rec);
    ncclResult_t res = ncclSuccess;
    struct weft_exec_cache_entry *hit =
        weft_exec_cache_find(comm, weft_exec_cache_key(task), task->count);
    if (hit != NULL) {
        /* Its entry's lanes run in place: nothing else uses them meanwhile (no other task of
         * this executor stores an entry, and the communicator's tickets keep other threads out). */
        weft_exec_lane_reuse(hit->lanes, hit, hit->steps, task, weft_exec_sig(comm, rec),
                             ++comm->op_seq, rec);
        lanes = hit->lanes;
        nlanes = hit->nlanes;
    } else {
        res = weft_exec_build(task, 1, &rec, 1, &lanes, &nlanes);
    }
    int laned = res == ncclSuccess;
    if (laned)
        res = weft_exec_run_lone(lanes, nlanes);
    if (__builtin_expect(task->enq_ns != 0, 0) && res == ncclSuccess)
        weft_exec_trace(lanes, nlanes);
    weft_exec_finish(task, &rec, 1, laned, lanes, nlanes, res);
    return res;
}

/* The entry of x's group (tasks of one communicator, no plan) when the cache holds it. */
static struct weft_exec_group_entry *weft_exec_group_find(const struct weft_exec_plan *x)
{
    struct ncclComm *comm = x->tasks[0].comm;
    if (comm->exec_cache == NULL || x->ntasks > WEFT_EXEC_GROUP_TASKS)
        return NULL;
    for (int g = 0; g < WEFT_EXEC_GROUP_ENTRIES; g++) {
        struct weft_exec_group_entry *e = &comm->exec_cache->groups[g];
        int same = e->ntasks == x->ntasks;
        for (int t = 0; t < x->ntasks && same; t++)
            same = x->tasks[t].comm == comm && e->counts[t] == x->tasks[t].count &&
                   e->keys[t] == weft_exec_cache_key(&x->tasks[t]);
        if (same)
            return e;
    }
    return NULL;
}

/* Readies e's lanes in place for x's tasks (the numbers each task's lanes would get built). */
static void weft_exec_group_ready(struct weft_exec_group_entry *e, struct weft_exec_plan *x)
{
    struct ncclComm *comm = x->tasks[0].comm;
    uint64_t seq[WEFT_EXEC_GROUP_TASKS];
    uint32_t sig[WEFT_EXEC_GROUP_TASKS];
    for (int t = 0; t < x->ntasks; t++) {
        seq[t] = ++comm->op_seq;
        sig[t] = weft_exec_sig(comm, x->recs[t]);
    }
    for (int l = 0; l < e->nlanes; l++) {
        int t = e->task_of[l];
        weft_exec_lane_ready(&e->lanes[l], &x->tasks[t], sig[t], seq[t], x->recs[t]);
    }
    x->nlaned = x->ntasks;
}

/* Keeps x's lanes (just built, not run; no plan) as its group's entry when the group is small and
 * of one communicator. */
static void weft_exec_group_store(const struct weft_exec_plan *x,
                                  const struct weft_exec_lane *lanes, int nlanes)
{
    struct ncclComm *comm = x->tasks[0].comm;
    uint64_t total = 0;
    for (int l = 0; l < nlanes; l++) {
        if (lanes[l].task->comm != comm || lanes[l].zc != NULL)
            return;
        total += lanes[l].lane.nsteps;
    }
    if (x->ntasks > WEFT_EXEC_GROUP_TASKS || total > WEFT_EXEC_GROUP_STEPS)
        return;
    struct weft_exec_cache *cache = weft_exec_cache_get(comm);
    size_t lanes_bytes = (size_t)nlanes * sizeof(*lanes);
    size_t step_align = _Alignof(struct weft_step);
    size_t index_bytes = ((size_t)nlanes * sizeof(int) + step_align - 1) & ~(step_align - 1);
    size_t bytes = lanes_bytes + index_bytes + total * sizeof(struct weft_step);
    char *block = cache != NULL ? malloc(bytes) : NULL;
    if (block == NULL)
        return; /* no entry: the group builds its lanes every time, as without one */
    struct weft_exec_group_entry *e = &cache->groups[cache->group_next];
    cache->group_next = (cache->group_next + 1) % WEFT_EXEC_GROUP_ENTRIES;
    free(e->lanes);
    e->ntasks = x->ntasks;
    for (int t = 0; t < x->ntasks; t++) {
        e->keys[t] = weft_exec_cache_key(&x->tasks[t]);
        e->counts[t] = x->tasks[t].count;
    }
    e->nlanes = nlanes;
    e->lanes = (struct weft_exec_lane *)block;
    e->task_of = (int *)(block + lanes_bytes);
    struct weft_step *at = (struct weft_step *)(block + lanes_bytes + index_bytes);
    for (int l = 0; l < nlanes; l++) {
        e->lanes[l] = lanes[l];
        e->task_of[l] = (int)(lanes[l].task - x->tasks);
        if (lanes[l].lane.nsteps > 0)
            memcpy(at, lanes[l].steps, lanes[l].lane.nsteps * sizeof(*at));
        e->lanes[l].steps = at;
        e->lanes[l].lane.steps = at;
        at += lanes[l].lane.nsteps;
    }
}

ncclResult_t weft_exec_tasks(struct weft_task *orig_tasks, int norig)
{
    if (norig == 1)
        return weft_exec_one(orig_tasks);
    struct weft_fuse_plan *plans = NULL;
    int nplans = 0, nlanes = 0, left = 0;
    struct weft_exec_lane *lanes = NULL;
    /* At most one agreement per communicator: norig more tasks. A small group (a send/recv
     * pair) plans on the stack. */
    enum { SMALL = 4 };
    struct weft_task small_tasks[2 * SMALL];
    uint64_t small_recs[2 * SMALL];
    struct weft_fused small_fused[SMALL];
    int small = norig <= SMALL;
    struct weft_exec_plan x = {
        .tasks = small ? small_tasks : weft_arena_alloc((size_t)2 * norig * sizeof(*x.tasks)),
        .recs = small ? small_recs : weft_arena_alloc((size_t)2 * norig * sizeof(*x.recs)),
        .fused = small ? small_fused : weft_arena_alloc((size_t)norig * sizeof(*x.fused)),
    };
    uint8_t *held = NULL;
    ncclResult_t res = ncclSuccess;
    if (x.tasks == NULL || x.recs == NULL || x.fused == NULL) {
        WEFT_WARN("out of memory planning %d operations", norig);
        res = ncclSystemError;
        goto out;
    }
    WEFT_CHECK_GOTO(weft_fuse_scan(orig_tasks, norig, &held, &plans, &nplans), res, out);
    if (nplans > 0) {
        x.waited = weft_arena_alloc((size_t)2 * norig);
        if (x.waited == NULL) {
            WEFT_WARN("out of memory planning %d operations", norig);
            res = ncclSystemError;
            goto out;
        }
        memset(x.waited, 0, (size_t)2 * norig);
    }
    for (int t = 0; t < norig; t++) {
        if (held != NULL && held[t])
            continue;
        struct weft_task *one = &orig_tasks[t];
        WEFT_CHECK_GOTO(weft_exec_emit(&x, &one, 1), res, out);
    }
    for (int p = 0; p < nplans; p++) /* on one rank too: then a copy, and one way for all */
        WEFT_CHECK_GOTO(weft_exec_emit_agree(&x, &plans[p]), res, out);
    struct weft_exec_group_entry *ready = nplans == 0 ? weft_exec_group_find(&x) : NULL;
    if (ready != NULL) {
        /* Nothing stores into the entry while its lanes run (only a later run of another group). */
        weft_exec_group_ready(ready, &x);
        lanes = ready->lanes;
        nlanes = ready->nlanes;
    } else {
        WEFT_CHECK_GOTO(weft_exec_add_lanes(&x, 0, &lanes, &nlanes), res, out);
        if (nplans == 0)
            weft_exec_group_store(&x, lanes, nlanes);
    }
    for (int p = 0; p < nplans; p++)
        left += plans[p].wait >= 0;
    for (;;) {
        res = weft_exec_run(lanes, nlanes, left > 0);
        if (res != ncclInProgress)
            break;
        /* A task others waited for is done: add them, then go on with every lane. */
        WEFT_CHECK_GOTO(weft_exec_resume(&x, plans, nplans, &lanes, &nlanes, &left), res, out);
    }
    if (norig > 0 && orig_tasks[0].enq_ns != 0 && res == ncclSuccess)
        weft_exec_trace(lanes, nlanes);
out:
    if (res == ncclSuccess)
        weft_exec_unfuse(x.fused, x.nfused);
    weft_exec_finish(x.tasks, x.recs, x.ntasks, x.nlaned, lanes, nlanes, res);
    return res;
}
