/* Issuing work: tickets per communicator, then inline or onto a host stream. */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/fault.h"
#include "core/group.h"
#include "exec/cuda.h"
#include "exec/stream.h"

struct weft_part {
    struct ncclComm *comm;
    uint64_t ticket;
};

/* What one thread (the caller or a stream's worker) runs: tasks of one or more communicators. */
struct weft_batch {
    struct weft_job job;
    int ntasks;
    int nparts;
    struct weft_task *tasks;
    struct weft_part *parts;
};

/* Waits for every part's turn, then runs all tasks together. Inline: the common case, one
 * communicator run by the calling thread (weft_submit_host), then needs no loops. The
 * communicators are held: by the API call for a batch run inline, by the batch itself (taken at
 * enqueue, weft_batch_job_finish leaves) for one queued on a host stream. */
static inline ncclResult_t weft_batch_run(struct weft_batch *b)
{
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < b->nparts; i++)
        WEFT_CHECK_IGNORE(weft_comm_ticket_wait(b->parts[i].comm, b->parts[i].ticket), res);
    for (int i = 0; i < b->nparts && res == ncclSuccess; i++) {
        struct ncclComm *comm = b->parts[i].comm;
        if (!__atomic_load_n(&comm->ready, __ATOMIC_ACQUIRE)) {
            WEFT_WARN("rank %d: %s on a communicator whose initialization failed (error %d)",
                      comm->rank, b->tasks[0].api,
                      (int)__atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE));
            res = ncclInvalidUsage;
        }
    }
    if (res == ncclSuccess)
        res = weft_exec_tasks(b->tasks, b->ntasks);
    return res;
}

/* Records errors and passes each communicator's turn on. */
static inline void weft_batch_finish(struct weft_batch *b, ncclResult_t res)
{
    for (int i = 0; i < b->nparts; i++) {
        if (WEFT_IS_ERROR(res))
            weft_comm_set_error(b->parts[i].comm, res);
        weft_comm_ticket_done(b->parts[i].comm);
    }
}

static ncclResult_t weft_batch_job_run(struct weft_job *job)
{
    return weft_batch_run((struct weft_batch *)job);
}

static void weft_batch_job_finish(struct weft_job *job, ncclResult_t res)
{
    struct weft_batch *b = (struct weft_batch *)job;
    weft_batch_finish(b, res);
    /* The last touch of each communicator: an abort waiting for it may free it now. */
    for (int i = 0; i < b->nparts; i++)
        weft_comm_leave(b->parts[i].comm);
    free(job);
}

/* Where a communicator's work of this submission runs: NULL = the calling thread. */
static struct weft_stream *weft_target(const struct weft_task *first)
{
    struct weft_stream *s = weft_stream_lookup(first->stream);
    if (s != NULL)
        return s;
    return first->comm->blocking ? NULL : first->comm->async_stream;
}

/*
 * Everything that can fail (the arrays, one batch per stream) is allocated before any ticket is
 * taken: a ticket taken is a turn every later operation of the communicator waits for, so it must
 * always be passed on (weft_batch_finish).
 */
static ncclResult_t weft_submit_host(struct weft_task *tasks, int ntasks)
{
    int one_comm = ntasks > 0;
    for (int t = 1; t < ntasks && one_comm; t++)
        one_comm = tasks[t].comm == tasks[0].comm;
    if (one_comm && weft_target(tasks) == NULL) {
        /* Work of one communicator that the calling thread runs (the common case: one operation,
         * or a group of sends and receives): what the general path below does for it, without
         * its arrays (a fifth of a 2-rank 8 B all-reduce's instructions). */
        struct weft_part part = {tasks->comm, weft_comm_ticket_take(tasks->comm)};
        struct weft_batch b = {.tasks = tasks, .ntasks = ntasks, .parts = &part, .nparts = 1};
        ncclResult_t res = weft_batch_run(&b);
        weft_batch_finish(&b, res);
        return res;
    }
    ncclResult_t res = ncclSuccess;
    /* Small submissions (the common case: one operation) use the stack. */
    enum { SMALL = 16 };
    struct weft_part parts_small[SMALL];
    struct weft_stream *targets_small[SMALL];
    struct weft_batch *batches_small[SMALL];
    int part_of_small[SMALL];
    int small = ntasks <= SMALL;
    struct weft_part *parts = small ? parts_small : calloc((size_t)ntasks, sizeof(*parts));
    struct weft_stream **targets =
        small ? targets_small : calloc((size_t)ntasks, sizeof(*targets));
    struct weft_batch **batches =
        small ? batches_small : calloc((size_t)ntasks, sizeof(*batches));
    int *part_of = small ? part_of_small : calloc((size_t)ntasks, sizeof(int));
    if (parts == NULL || targets == NULL || batches == NULL || part_of == NULL) {
        WEFT_WARN("out of memory issuing %d operations", ntasks);
        res = ncclSystemError;
        goto out;
    }
    /* One part per communicator, in order of first appearance. */
    int nparts = 0;
    for (int t = 0; t < ntasks; t++) {
        int p = 0;
        while (p < nparts && parts[p].comm != tasks[t].comm)
            p++;
        if (p == nparts) {
            parts[p].comm = tasks[t].comm;
            targets[p] = weft_target(&tasks[t]);
            batches[p] = NULL;
            nparts++;
        }
        part_of[t] = p;
    }
    /* One batch per stream, held by the stream's first part. */
    for (int p = 0; p < nparts; p++) {
        struct weft_stream *target = targets[p];
        int first = target != NULL;
        for (int q = 0; q < p && first; q++)
            first = targets[q] != target;
        if (!first)
            continue;
        int nt = 0, np = 0;
        for (int t = 0; t < ntasks; t++)
            nt += targets[part_of[t]] == target;
        for (int q = p; q < nparts; q++)
            np += targets[q] == target;
        batches[p] = calloc(1, sizeof(struct weft_batch) + (size_t)nt * sizeof(struct weft_task) +
                                   (size_t)np * sizeof(struct weft_part));
        if (batches[p] == NULL) {
            WEFT_WARN("out of memory queueing %d operations on a stream", nt);
            res = ncclSystemError;
            for (int q = 0; q < p; q++)
                free(batches[q]);
            goto out;
        }
    }
    /* Nothing fails from here on: tickets taken now, in order. */
    for (int p = 0; p < nparts; p++)
        parts[p].ticket = weft_comm_ticket_take(parts[p].comm);
    int in_progress = 0, has_inline = 0;
    /* Streams first, so their work overlaps whatever runs inline. */
    for (int p = 0; p < nparts; p++) {
        struct weft_stream *target = targets[p];
        struct weft_batch *b = batches[p];
        has_inline |= target == NULL;
        if (b == NULL)
            continue;
        b->tasks = (struct weft_task *)(b + 1);
        for (int t = 0; t < ntasks; t++)
            if (targets[part_of[t]] == target)
                b->ntasks++;
        b->parts = (struct weft_part *)(b->tasks + b->ntasks);
        b->ntasks = 0;
        for (int t = 0; t < ntasks; t++)
            if (targets[part_of[t]] == target)
                b->tasks[b->ntasks++] = tasks[t];
        for (int q = p; q < nparts; q++) {
            if (targets[q] == target) {
                b->parts[b->nparts++] = parts[q];
                in_progress |= !parts[q].comm->blocking && target == parts[q].comm->async_stream;
            }
        }
        b->job.run = weft_batch_job_run;
        b->job.finish = weft_batch_job_finish;
        /* The batch holds its communicators until it finished (the caller holds them now). */
        for (int q = 0; q < b->nparts; q++)
            __atomic_fetch_add(&b->parts[q].comm->busy, 1, __ATOMIC_SEQ_CST);
        weft_stream_enqueue(target, &b->job);
    }
    if (has_inline) {
        struct weft_batch b = {.tasks = tasks};
        struct weft_part *inline_parts = parts; /* compacted in place: inline parts only */
        int np = 0;
        for (int p = 0; p < nparts; p++)
            if (targets[p] == NULL)
                inline_parts[np++] = parts[p];
        int nt = 0;
        for (int t = 0; t < ntasks; t++)
            if (targets[part_of[t]] == NULL)
                tasks[nt++] = tasks[t];
        b.ntasks = nt;
        b.parts = inline_parts;
        b.nparts = np;
        res = weft_batch_run(&b);
        weft_batch_finish(&b, res);
    }
    if (res == ncclSuccess && in_progress)
        res = ncclInProgress;
out:
    if (!small) {
        free(parts);
        free(targets);
        free(batches);
        free(part_of);
    }
    return res;
}

/*
 * Tasks on CUDA buffers (weft_cuda_classify) go to the CUDA executor, which only enqueues them on
 * the GPU, so they are launched first, from the calling thread; host tasks keep the path above.
 */
ncclResult_t weft_submit(struct weft_task *tasks, int ntasks)
{
    if (WEFT_FAULT_ARMED())
        for (int t = 0; t < ntasks; t++)
            weft_fault_op(tasks[t].comm->rank);
    int ndev = 0;
    for (int t = 0; t < ntasks; t++)
        ndev += tasks[t].on_device;
    if (ndev == 0)
        return weft_submit_host(tasks, ntasks);
    struct weft_task *dev = malloc((size_t)ndev * sizeof(*dev));
    if (dev == NULL) {
        WEFT_WARN("out of memory issuing %d device operations", ndev);
        return ncclSystemError;
    }
    int nd = 0, nh = 0;
    for (int t = 0; t < ntasks; t++) {
        if (tasks[t].on_device)
            dev[nd++] = tasks[t];
        else
            tasks[nh++] = tasks[t];
    }
    ncclResult_t res = weft_cuda_exec(dev, nd);
    free(dev);
    if (nh > 0) {
        ncclResult_t r = weft_submit_host(tasks, nh);
        if (res == ncclSuccess)
            res = r;
    }
    return res;
}
