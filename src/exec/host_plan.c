/*
 * What the host executor runs for a group (see host.c): its plan (the tasks, single or fused, and
 * the fusion agreements), the entry point weft_exec_tasks and its common case, the lone task.
 */
#include <stdlib.h>
#include <string.h>

#include "algo/tuner.h"
#include "core/check.h"
#include "core/communicator.h"
#include "core/group.h"
#include "core/param.h"
#include "core/trace.h"
#include "exec/arena.h"
#include "exec/host_run.h"
#include "exec/lane.h"
#include "exec/sig.h"
#include "exec/wait.h"

WEFT_PARAM(FuseBytes, "WEFT_FUSE_BYTES", 65536,
           "runs of 3 or more all-reduces of a group, together up to this size, are packed into "
           "one (0 disables)");

/* The task that agrees on a group's fusion (see weft_fuse_scan); names it in messages. */
static const char weft_fuse_agree_api[] = "ncclGroupEnd (fusion agreement)";

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
            if (!weft_host_task_is_p2p(&tasks[u]))
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
            .algo = weft_host_task_is_p2p(task) ? -1
                    : weft_tune_algo_quiet(task->coll, task->count * es, &task->comm->tune, NULL),
            .root = task->root, .device = 0, .nch = nch, .seq = lanes[i - 1].seq,
            .count = task->count, .enq_ns = task->enq_ns, .start_ns = rec->start_ns,
            .end_ns = rec->end_ns, .lane_end_ns = ends,
        };
        if (task->api != weft_fuse_agree_api) /* not the user's operation */
            weft_trace_record(task->comm, &op);
    }
}

/* Adds the collectives that waited for tasks now done (after unpacking a fused piece's
 * results); *left counts the plans still waiting. */
static ncclResult_t weft_exec_resume(struct weft_exec_plan *x, struct weft_fuse_plan *plans,
                                     int nplans, struct weft_exec_lane **lanes_p, int *nlanes_p,
                                     int *left)
{
    int first = x->ntasks;
    for (int i; (i = weft_host_resume_lane(*lanes_p, *nlanes_p)) >= 0;) {
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
        WEFT_CHECK(weft_host_add_lanes(x, first, lanes_p, nlanes_p));
    return ncclSuccess;
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
            return weft_host_lane_error(lanes);
        if (weft_lane_done(&lanes->lane)) {
            if (__builtin_expect(lanes->task->enq_ns != 0, 0))
                lanes->done_ns = weft_time_ns();
            return ncclSuccess;
        }
    }
    return weft_host_run(lanes, nlanes, 0);
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
        weft_host_cache_find(comm, weft_host_cache_key(task), task->count);
    if (hit != NULL) {
        /* Its entry's lanes run in place: nothing else uses them meanwhile (no other task of
         * this executor stores an entry, and the communicator's tickets keep other threads out). */
        weft_host_lane_reuse(hit->lanes, hit, hit->steps, task, weft_host_sig(comm, rec),
                             ++comm->op_seq, rec);
        lanes = hit->lanes;
        nlanes = hit->nlanes;
    } else {
        res = weft_host_build(task, 1, &rec, 1, &lanes, &nlanes);
    }
    int laned = res == ncclSuccess;
    if (laned)
        res = weft_exec_run_lone(lanes, nlanes);
    if (__builtin_expect(task->enq_ns != 0, 0) && res == ncclSuccess)
        weft_exec_trace(lanes, nlanes);
    weft_exec_finish(task, &rec, 1, laned, lanes, nlanes, res);
    return res;
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
    struct weft_exec_group_entry *ready = nplans == 0 ? weft_host_group_find(&x) : NULL;
    if (ready != NULL) {
        /* Nothing stores into the entry while its lanes run (only a later run of another group). */
        weft_host_group_ready(ready, &x);
        lanes = ready->lanes;
        nlanes = ready->nlanes;
    } else {
        WEFT_CHECK_GOTO(weft_host_add_lanes(&x, 0, &lanes, &nlanes), res, out);
        if (nplans == 0)
            weft_host_group_store(&x, lanes, nlanes);
    }
    for (int p = 0; p < nplans; p++)
        left += plans[p].wait >= 0;
    for (;;) {
        res = weft_host_run(lanes, nlanes, left > 0);
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
