/*
 * The host executor's lanes (see host.c): taken from the caches, or built from the schedules
 * (src/algo) and stored in the schedule cache. The caches are described in host_run.h, with
 * what every operation calls of them (lookups, and the group cache's store).
 */
#include <stdlib.h>
#include <string.h>

#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/check.h"
#include "core/communicator.h"
#include "core/param.h"
#include "exec/arena.h"
#include "exec/host_run.h"
#include "exec/lane.h"
#include "exec/zcopy.h"

WEFT_PARAM(SingleCopyMinBytes, "WEFT_SINGLE_COPY_MIN_BYTES", 65536,
           "send/recv, all-to-all (out of place), gather and scatter steps of at least this many "
           "bytes between ranks of one host move in one copy: the receiver reads the sender's "
           "buffer (memcpy in one process, process_vm_readv from another) instead of two copies "
           "through the FIFO (0: never; at least 4096)");

void weft_exec_cache_free(struct ncclComm *comm)
{
    if (comm->exec_cache == NULL)
        return;
    for (int g = 0; g < WEFT_EXEC_GROUP_ENTRIES; g++)
        free(comm->exec_cache->groups[g].lanes);
    free(comm->exec_cache);
    comm->exec_cache = NULL;
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
    struct weft_exec_cache *cache = weft_host_cache_get(comm);
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

uint64_t weft_exec_single_copy_count(const struct ncclComm *comm)
{
    uint64_t n = 0;
    for (int c = 0; c <= comm->nchannels; c++)
        for (int p = 0; comm->chan_peers[c] != NULL && p < comm->nranks; p++)
            if (comm->chan_peers[c][p].recv != NULL)
                n += comm->chan_peers[c][p].recv->direct_reads;
    return n;
}

/*
 * Builds the lanes of tasks[0 .. ntasks): from the schedule cache, or anew. A task that misses
 * stores its lists in the cache, which may replace an entry another task's lanes read: cached
 * lists are copied then. `once`: the run builds no more lanes later (it has no fusion plan);
 * then, when every task hits, nothing is stored before the lanes end and they read the entries'
 * lists in place (a send/recv pair: two allocations and copies fewer).
 */
ncclResult_t weft_host_build(struct weft_task *tasks, int ntasks, const uint64_t *recs,
                             int once, struct weft_exec_lane **lanes_p, int *nlanes_p)
{
    int in_place = once;
    for (int t = 0; t < ntasks && in_place; t++)
        in_place = weft_host_cache_find(tasks[t].comm, weft_host_cache_key(&tasks[t]),
                                        tasks[t].count) != NULL;
    int total = 0;
    for (int t = 0; t < ntasks; t++)
        total += weft_host_task_is_p2p(&tasks[t]) ? 1 : tasks[t].comm->nchannels;
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
        int p2p = weft_host_task_is_p2p(task);
        int nch = p2p ? 1 : comm->nchannels;
        int a2a_in_place = weft_host_a2a_in_place(task);
        /* Whether a task is a zero-copy candidate follows from its key and count: a hit is none. */
        struct weft_exec_cache_entry *hit =
            weft_host_cache_find(comm, weft_host_cache_key(task), task->count);
        int zc = hit == NULL && !p2p && weft_zcopy_candidate(task);
        uint32_t sig = weft_host_sig(comm, recs[t]);
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
            weft_host_lane_reuse(&lanes[n], hit, steps, task, sig, seq, recs[t]);
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
            weft_exec_cache_store(comm, task, weft_host_cache_key(task), lanes + n - nch, nch);
    }
    *lanes_p = lanes;
    *nlanes_p = n;
    return ncclSuccess;
}

/* Appends the lanes of x's tasks from `first` on to *lanes_p (lanes of earlier tasks kept). */
ncclResult_t weft_host_add_lanes(struct weft_exec_plan *x, int first,
                                 struct weft_exec_lane **lanes_p, int *nlanes_p)
{
    struct weft_exec_lane *add, *all;
    int nadd, n = *nlanes_p;
    WEFT_CHECK(weft_host_build(x->tasks + first, x->ntasks - first, x->recs + first,
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
