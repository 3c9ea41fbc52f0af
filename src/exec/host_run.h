/*
 * The host executor's private declarations, shared by its files and included by no other:
 *
 *   host.c        the run loop: rounds over a run's lanes, and how a rank waits (spin, yield,
 *                 sleep on the doorbell) while none moves;
 *   host_plan.c   what a group runs (its plan: tasks single or fused, fusion agreements), and the
 *                 entry point weft_exec_tasks with its common case, the lone task;
 *   host_cache.c  the schedule cache and the lanes of a run, taken from the caches or built from
 *                 the schedules (the caches themselves are described here);
 *   host_watch.c  a blocked run's watch (abort, connection failure, a dead peer, the deadline) and
 *                 the messages of a lane that failed.
 *
 * Everything here runs on the thread that runs the group (weft_exec_tasks' caller, which holds
 * the communicators). What every operation calls on its way to its first post (the caches'
 * lookups, the group cache's store, readying a cached lane) is static inline here: the split put
 * no call on those paths, where the peers wait.
 */
#ifndef WEFT_EXEC_HOST_INTERNAL_H
#define WEFT_EXEC_HOST_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/communicator.h"
#include "core/group.h"
#include "exec/lane.h"
#include "exec/sig.h"

static inline int weft_host_task_is_p2p(const struct weft_task *task)
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
 * engine's state reset (weft_host_lane_reuse); the tasks of a group copy lanes and lists (a later
 * task of the group may replace the entry), so no running lane reads an entry while it is
 * rewritten, and the communicator's tickets keep two threads from using it at once. That work
 * lies between a repeated call and its first post, which the peers wait for (2-rank 8 B
 * all-reduce: 2327 -> 2219 instructions per call, callgrind).
 */
#define WEFT_EXEC_CACHE_STEPS 64
#define WEFT_EXEC_CACHE_ENTRIES 4

struct weft_exec_cache_entry {
    uint64_t key;   /* weft_host_cache_key of the collective, root, element size; 0: empty */
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
 * runs its entry's (weft_host_group_find), instead of finding, copying and ordering every task's.
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

/* Where the executor is stuck, for messages and liveness checks. */
struct weft_exec_block {
    int lane;
    int peer;
    int send;
};

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

/* ---- The caches, on every operation's path (their stores on a miss: host_cache.c) ---- */

/* An in-place all-to-all's schedule differs (weft_tune_algo_of). */
static inline int weft_host_a2a_in_place(const struct weft_task *task)
{
    return task->coll == WEFT_COLL_ALLTOALL && task->sendbuf == task->recvbuf;
}

/* What, besides the count, selects a schedule: one word to compare (never 0). */
static inline uint64_t weft_host_cache_key(const struct weft_task *task)
{
    return 1 | (uint64_t)weft_host_a2a_in_place(task) << 1 |
           (uint64_t)__builtin_ctzll(weft_dtype_size(task->dtype)) << 2 |
           (uint64_t)(uint8_t)task->coll << 8 | (uint64_t)(uint32_t)task->root << 32;
}

/* The signature hash a task's slices carry (its record rec; 0 with the check off). */
static inline uint32_t weft_host_sig(const struct ncclComm *comm, uint64_t rec)
{
    return weft_sig_enabled() ? weft_sig_of(comm, rec)->hash : 0;
}

/* comm's cache entry for key and count when it holds that schedule, else NULL. */
static inline struct weft_exec_cache_entry *weft_host_cache_find(const struct ncclComm *comm,
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

/* Readies a cached lane for task's call: this call's buffers, operator, signature and numbers,
 * and the step engine's state afresh. */
static inline void weft_host_lane_ready(struct weft_exec_lane *el, struct weft_task *task,
                                        uint32_t sig, uint64_t seq, uint64_t rec)
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
static inline void weft_host_lane_reuse(struct weft_exec_lane *lanes,
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
        weft_host_lane_ready(el, task, sig, seq, rec);
    }
}

/* comm's schedule cache, made on first use (NULL without memory: every call builds). */
static inline struct weft_exec_cache *weft_host_cache_get(struct ncclComm *comm)
{
    if (comm->exec_cache == NULL)
        comm->exec_cache = calloc(1, sizeof(struct weft_exec_cache));
    return comm->exec_cache;
}

/* The entry of x's group (tasks of one communicator, no plan) when the cache holds it. */
static inline struct weft_exec_group_entry *weft_host_group_find(const struct weft_exec_plan *x)
{
    struct ncclComm *comm = x->tasks[0].comm;
    if (comm->exec_cache == NULL || x->ntasks > WEFT_EXEC_GROUP_TASKS)
        return NULL;
    for (int g = 0; g < WEFT_EXEC_GROUP_ENTRIES; g++) {
        struct weft_exec_group_entry *e = &comm->exec_cache->groups[g];
        int same = e->ntasks == x->ntasks;
        for (int t = 0; t < x->ntasks && same; t++)
            same = x->tasks[t].comm == comm && e->counts[t] == x->tasks[t].count &&
                   e->keys[t] == weft_host_cache_key(&x->tasks[t]);
        if (same)
            return e;
    }
    return NULL;
}

/* Readies e's lanes in place for x's tasks (the numbers each task's lanes would get built). */
static inline void weft_host_group_ready(struct weft_exec_group_entry *e, struct weft_exec_plan *x)
{
    struct ncclComm *comm = x->tasks[0].comm;
    uint64_t seq[WEFT_EXEC_GROUP_TASKS];
    uint32_t sig[WEFT_EXEC_GROUP_TASKS];
    for (int t = 0; t < x->ntasks; t++) {
        seq[t] = ++comm->op_seq;
        sig[t] = weft_host_sig(comm, x->recs[t]);
    }
    for (int l = 0; l < e->nlanes; l++) {
        int t = e->task_of[l];
        weft_host_lane_ready(&e->lanes[l], &x->tasks[t], sig[t], seq[t], x->recs[t]);
    }
    x->nlaned = x->ntasks;
}

/* Keeps x's lanes (just built, not run; no plan) as its group's entry when the group is small and
 * of one communicator. */
static inline void weft_host_group_store(const struct weft_exec_plan *x,
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
    struct weft_exec_cache *cache = weft_host_cache_get(comm);
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
        e->keys[t] = weft_host_cache_key(&x->tasks[t]);
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

/* ---- The run loop's, the plan's and the watch's ---- */

/* Index of the first lane of a task others wait for whose lanes are all done, or -1. */
static inline int weft_host_resume_lane(const struct weft_exec_lane *lanes, int nlanes)
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

/* Where the blocked lane waits, for exec/sig.c. */
static inline void weft_host_sig_wait(const struct weft_exec_lane *el,
                                      const struct weft_exec_block *block,
                                      struct weft_sig_wait *w)
{
    w->rec = el->rec;
    w->peer = block->peer;
    w->send = block->send;
    w->send_conn = block->peer >= 0 ? el->lane.peers[block->peer].send : NULL;
    w->recv_conn = block->peer >= 0 ? el->lane.peers[block->peer].recv : NULL;
}

/* ---- host.c ---- */

/* Runs lanes[0 .. nlanes) to completion (blocks: waits for the peers as WEFT_SPIN_COUNT and
 * WEFT_YIELD_COUNT say, watched by weft_host_check_stuck); ncclInProgress with `resuming` as soon
 * as a task others wait for is done. */
ncclResult_t weft_host_run(struct weft_exec_lane *lanes, int nlanes, int resuming);

/* ---- host_cache.c ---- */

/* Builds the lanes of tasks[0 .. ntasks) (arena memory) from the schedule cache or anew, storing
 * what it built; `once`: no more lanes are built in this run (they may read the entries). */
ncclResult_t weft_host_build(struct weft_task *tasks, int ntasks, const uint64_t *recs, int once,
                             struct weft_exec_lane **lanes_p, int *nlanes_p);
/* Builds the lanes of x's tasks from `first` on and appends them to *lanes_p. */
ncclResult_t weft_host_add_lanes(struct weft_exec_plan *x, int first,
                                 struct weft_exec_lane **lanes_p, int *nlanes_p);

/* ---- host_watch.c ---- */

/* The error of a lane that failed (a slice that does not match, a single copy that failed),
 * reported (WEFT_WARN) with the peer and the operation. */
ncclResult_t weft_host_lane_error(struct weft_exec_lane *el);
/* A blocked run's checks, idle_ns after it last moved: abort or revoke, a connection failure, a
 * peer that exited, the WEFT_TIMEOUT deadline; each fails with a WEFT_WARN naming the peer. */
ncclResult_t weft_host_check_stuck(struct weft_exec_lane *lanes, int nlanes,
                                   const struct weft_exec_block *block, uint64_t idle_ns);

#endif
