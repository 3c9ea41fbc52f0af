/* Per-thread groups: nesting, recorded tasks and inits, errors reported at the outermost end. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "algo/cost.h"
#include "algo/sched.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/trace.h"
#include "exec/cuda.h"
#include "exec/stream.h"
#include "exec/wait.h"

struct weft_init_job {
    struct ncclComm **comm_p;
    int nranks;
    ncclUniqueId id;
    int rank;
    int has_config;
    ncclConfig_t config;
    ncclResult_t res;
    int cuda_dev; /* the caller's current device when it asked (-1: none) */
};

struct weft_group {
    int depth;
    ncclResult_t error; /* first error recorded inside the group */
    struct weft_task *tasks;
    int ntasks, task_cap;
    struct weft_init_job *inits;
    int ninits, init_cap;
    struct ncclComm **held; /* communicators the group holds (weft_group_hold) */
    int nheld, held_cap;
};

/* initial-exec, as the executor's arena (exec/arena.c): a fixed offset from the thread pointer,
 * not a __tls_get_addr call on every access (12 per grouped send/recv pair, 3% of its
 * instructions); 48 bytes of the static TLS surplus glibc keeps for libraries loaded with dlopen. */
static __thread struct weft_group weft_group_state __attribute__((tls_model("initial-exec")));

int weft_group_depth(void)
{
    return weft_group_state.depth;
}

ncclResult_t weft_group_hold(struct ncclComm *comm, const char *api)
{
    struct weft_group *g = &weft_group_state;
    for (int i = g->nheld - 1; i >= 0; i--)
        if (g->held[i] == comm)
            return ncclSuccess;
    if (g->nheld == g->held_cap) {
        int cap = g->held_cap ? 2 * g->held_cap : 8;
        struct ncclComm **h = realloc(g->held, (size_t)cap * sizeof(*h));
        if (h == NULL) {
            WEFT_WARN("%s: out of memory recording %d communicators in a group", api, cap);
            return ncclSystemError;
        }
        g->held = h;
        g->held_cap = cap;
    }
    WEFT_CHECK(weft_comm_enter(comm, api));
    g->held[g->nheld++] = comm;
    return ncclSuccess;
}

int weft_group_forget(struct ncclComm *comm)
{
    struct weft_group *g = &weft_group_state;
    int nt = 0, was_held = 0;
    for (int t = 0; t < g->ntasks; t++)
        if (g->tasks[t].comm != comm)
            g->tasks[nt++] = g->tasks[t];
    g->ntasks = nt;
    for (int i = 0; i < g->nheld; i++) {
        if (g->held[i] == comm) {
            weft_comm_leave(comm);
            g->held[i] = g->held[--g->nheld];
            was_held = 1;
            break;
        }
    }
    return was_held;
}

ncclResult_t weft_group_start(void)
{
    weft_group_state.depth++;
    return ncclSuccess;
}

/* The collective part of a blocking init whose communicator was allocated already. */
static void *weft_init_thread(void *arg)
{
    struct weft_init_job *job = arg;
    job->res = weft_comm_setup(*job->comm_p, &job->id);
    if (job->res != ncclSuccess) {
        weft_comm_free(*job->comm_p);
        *job->comm_p = NULL;
    }
    return NULL;
}

/* The collective part of a non-blocking init, on the communicator's own stream. */
struct weft_init_async {
    struct weft_job job;
    struct ncclComm *comm;
    ncclUniqueId id;
};

static ncclResult_t weft_init_async_run(struct weft_job *job)
{
    struct weft_init_async *a = (struct weft_init_async *)job;
    return weft_comm_setup(a->comm, &a->id);
}

static void weft_init_async_finish(struct weft_job *job, ncclResult_t res)
{
    struct weft_init_async *a = (struct weft_init_async *)job;
    weft_comm_set_error(a->comm, res);
    weft_comm_ticket_done(a->comm);
    free(job);
}

/*
 * Non-blocking init: the communicator exists (and *comm_p is set) at once; the collective part
 * runs on its stream as ticket 0, and ncclCommGetAsyncError says ncclInProgress until it is done.
 */
static ncclResult_t weft_init_nonblocking(struct ncclComm *comm, const ncclUniqueId *id)
{
    struct weft_init_async *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        WEFT_WARN("out of memory for a non-blocking init");
        return ncclSystemError;
    }
    ncclResult_t res = weft_stream_create(&comm->async_stream);
    if (res != ncclSuccess) {
        free(a);
        return res;
    }
    a->comm = comm;
    a->id = *id;
    a->job.run = weft_init_async_run;
    a->job.finish = weft_init_async_finish;
    weft_comm_ticket_take(comm);
    comm->ticket_running = 1; /* ticket 0, init, runs at once (the bootstrap deadline bounds it) */
    weft_stream_enqueue(comm->async_stream, &a->job);
    return ncclInProgress;
}

/* Allocates, then runs the collective part now (blocking) or on the comm's stream. */
static ncclResult_t weft_init_start(struct weft_init_job *job, int *started_async)
{
    struct ncclComm *comm;
    WEFT_CHECK(weft_comm_alloc(&comm, job->nranks, job->rank,
                               job->has_config ? &job->config : NULL));
    if (job->cuda_dev >= 0) {
        ncclResult_t res = weft_cuda_comm_bind(comm, job->cuda_dev);
        if (res != ncclSuccess) {
            weft_comm_free(comm);
            return res;
        }
    }
    *job->comm_p = comm;
    if (!comm->blocking) {
        *started_async = 1;
        ncclResult_t res = weft_init_nonblocking(comm, &job->id);
        if (res != ncclInProgress) {
            *job->comm_p = NULL;
            weft_comm_free(comm);
        }
        return res;
    }
    *started_async = 0;
    return ncclSuccess;
}

/* Inits of a group run concurrently: each blocks until all its ranks arrive. */
static ncclResult_t weft_group_run_inits(struct weft_group *g)
{
    ncclResult_t res = ncclSuccess;
    int in_progress = 0, nblocking = 0;
    for (int i = 0; i < g->ninits; i++) {
        int async = 0;
        g->inits[i].res = weft_init_start(&g->inits[i], &async);
        if (async) {
            in_progress |= g->inits[i].res == ncclInProgress;
            if (g->inits[i].res != ncclInProgress)
                WEFT_CHECK_IGNORE(g->inits[i].res, res);
            g->inits[i].comm_p = NULL; /* done: not for the threads below */
        } else if (g->inits[i].res != ncclSuccess) {
            WEFT_CHECK_IGNORE(g->inits[i].res, res);
            g->inits[i].comm_p = NULL;
        } else {
            nblocking++;
        }
    }
    if (nblocking == 0)
        return res == ncclSuccess && in_progress ? ncclInProgress : res;
    if (nblocking == 1) {
        for (int i = 0; i < g->ninits; i++)
            if (g->inits[i].comm_p != NULL)
                weft_init_thread(&g->inits[i]);
        for (int i = 0; i < g->ninits; i++)
            if (g->inits[i].comm_p != NULL)
                WEFT_CHECK_IGNORE(g->inits[i].res, res);
        return res == ncclSuccess && in_progress ? ncclInProgress : res;
    }
    pthread_t *threads = calloc((size_t)g->ninits, sizeof(pthread_t));
    if (threads == NULL) {
        WEFT_WARN("out of memory starting %d communicator inits", g->ninits);
        return ncclSystemError;
    }
    int *started = calloc((size_t)g->ninits, sizeof(int));
    if (started == NULL) {
        free(threads);
        WEFT_WARN("out of memory starting %d communicator inits", g->ninits);
        return ncclSystemError;
    }
    for (int i = 0; i < g->ninits; i++) {
        if (g->inits[i].comm_p == NULL)
            continue;
        int err = pthread_create(&threads[i], NULL, weft_init_thread, &g->inits[i]);
        if (err != 0) {
            WEFT_WARN("pthread_create for communicator init failed: %s", strerror(err));
            res = ncclSystemError;
            break;
        }
        started[i] = 1;
    }
    for (int i = 0; i < g->ninits; i++) {
        if (!started[i])
            continue;
        pthread_join(threads[i], NULL);
        WEFT_CHECK_IGNORE(g->inits[i].res, res);
    }
    free(started);
    free(threads);
    return res == ncclSuccess && in_progress ? ncclInProgress : res;
}

static void weft_group_reset(struct weft_group *g)
{
    for (int i = 0; i < g->nheld; i++)
        weft_comm_leave(g->held[i]);
    g->nheld = 0;
    g->ntasks = 0;
    g->ninits = 0;
    g->error = ncclSuccess;
}

ncclResult_t weft_group_end(void)
{
    struct weft_group *g = &weft_group_state;
    if (g->depth == 0) {
        WEFT_WARN("ncclGroupEnd: not inside a group (missing ncclGroupStart)");
        return ncclInvalidUsage;
    }
    if (--g->depth > 0)
        return ncclSuccess;
    ncclResult_t res = g->error;
    if (res == ncclSuccess && g->ninits > 0)
        res = weft_group_run_inits(g);
    if (WEFT_IS_ERROR(res)) {
        weft_group_reset(g);
        return res;
    }
    if (g->ntasks > 0) {
        ncclResult_t r = weft_submit(g->tasks, g->ntasks);
        if (r != ncclSuccess)
            res = r;
    }
    weft_group_reset(g);
    return res;
}

static ncclResult_t weft_group_fail(struct weft_group *g, ncclResult_t res)
{
    if (g->error == ncclSuccess)
        g->error = res;
    return res;
}

ncclResult_t weft_group_simulate_end(ncclSimInfo_t *info)
{
    struct weft_group *g = &weft_group_state;
    if (g->depth == 0) {
        WEFT_WARN("ncclGroupSimulateEnd: not inside a group (missing ncclGroupStart)");
        return ncclInvalidUsage;
    }
    if (--g->depth > 0)
        return ncclSuccess;
    /* As in NCCL, simInfo is read at the outermost end, which closes the group either way:
     * refused, it leaves nothing deferred behind. */
    if (info == NULL || info->magic != 0x74685283) {
        WEFT_WARN("ncclGroupSimulateEnd: simInfo %s", info == NULL
                                                          ? "is NULL"
                                                          : "was not initialized with "
                                                            "NCCL_SIM_INFO_INITIALIZER");
        weft_group_reset(g);
        return ncclInvalidArgument;
    }
    /* Predict, then drop the group: nothing runs. Communicators work in parallel, a
     * communicator's operations one after the other. */
    ncclResult_t res = g->error;
    double worst = 0;
    for (int t = 0; t < g->ntasks && res == ncclSuccess; t++) {
        double sum = 0;
        int seen_before = 0;
        for (int u = 0; u < t; u++)
            seen_before |= g->tasks[u].comm == g->tasks[t].comm;
        if (seen_before)
            continue;
        for (int u = t; u < g->ntasks; u++) {
            const struct weft_task *k = &g->tasks[u];
            if (k->comm == g->tasks[t].comm)
                sum += weft_cost_us(k->coll, WEFT_ALGO_RING, k->count * weft_dtype_size(k->dtype),
                                    k->comm->nranks);
        }
        worst = sum > worst ? sum : worst;
    }
    if (res == ncclSuccess)
        info->estimatedTime = (float)worst;
    weft_group_reset(g);
    return res;
}

ncclResult_t weft_group_record(ncclResult_t res)
{
    struct weft_group *g = &weft_group_state;
    if (g->depth > 0 && WEFT_IS_ERROR(res))
        weft_group_fail(g, res);
    return res;
}

ncclResult_t weft_group_enqueue(struct weft_task *task)
{
    struct weft_group *g = &weft_group_state;
    task->enq_ns = weft_trace_enabled() ? weft_time_ns() : 0;
    /* As in NCCL, a non-blocking communicator takes no operation before its previous one (init,
     * split, a collective, a group) has reached ncclSuccess through ncclCommGetAsyncError. */
    if (!task->comm->blocking && weft_comm_async_state(task->comm) == ncclInProgress) {
        WEFT_WARN("%s: comm %p used before its previous operation returned ncclSuccess (poll "
                  "ncclCommGetAsyncError until it does)",
                  task->api, (void *)task->comm);
        return weft_group_record(ncclInvalidArgument);
    }
    if (g->depth == 0)
        return weft_submit(task, 1);
    /* As in NCCL, one group holds blocking or non-blocking communicators, not both: its end
     * either returns when the work is enqueued or returns ncclInProgress. */
    if (g->ntasks > 0 && g->tasks[0].comm->blocking != task->comm->blocking) {
        WEFT_WARN("%s: blocking and non-blocking communicators are not allowed in the same group "
                  "(comm %p is %s, comm %p is %s)",
                  task->api, (void *)g->tasks[0].comm,
                  g->tasks[0].comm->blocking ? "blocking" : "non-blocking", (void *)task->comm,
                  task->comm->blocking ? "blocking" : "non-blocking");
        return weft_group_fail(g, ncclInvalidArgument);
    }
    if (g->ntasks == g->task_cap) {
        int cap = g->task_cap ? 2 * g->task_cap : 64;
        struct weft_task *t = realloc(g->tasks, (size_t)cap * sizeof(*t));
        if (t == NULL) {
            WEFT_WARN("out of memory recording %d operations in a group", cap);
            return weft_group_fail(g, ncclSystemError);
        }
        g->tasks = t;
        g->task_cap = cap;
    }
    g->tasks[g->ntasks++] = *task;
    return ncclSuccess;
}

ncclResult_t weft_group_enqueue_init(struct ncclComm **comm_p, int nranks, const ncclUniqueId *id,
                                     int rank, const ncclConfig_t *config)
{
    struct weft_group *g = &weft_group_state;
    if (g->depth == 0) {
        struct weft_init_job job = {comm_p, nranks, *id, rank, config != NULL, {0}, ncclSuccess,
                                    weft_cuda_current_device()};
        if (config != NULL) {
            size_t n = config->size < sizeof(job.config) ? config->size : sizeof(job.config);
            memcpy(&job.config, config, n);
        }
        int async = 0;
        ncclResult_t res = weft_init_start(&job, &async);
        if (res != ncclSuccess || async)
            return res;
        weft_init_thread(&job);
        return job.res;
    }
    if (g->ninits == g->init_cap) {
        int cap = g->init_cap ? 2 * g->init_cap : 8;
        struct weft_init_job *j = realloc(g->inits, (size_t)cap * sizeof(*j));
        if (j == NULL) {
            WEFT_WARN("out of memory recording communicator inits in a group");
            return weft_group_fail(g, ncclSystemError);
        }
        g->inits = j;
        g->init_cap = cap;
    }
    struct weft_init_job *job = &g->inits[g->ninits++];
    memset(job, 0, sizeof(*job));
    job->comm_p = comm_p;
    job->cuda_dev = weft_cuda_current_device();
    job->nranks = nranks;
    job->id = *id;
    job->rank = rank;
    if (config != NULL) {
        job->has_config = 1;
        size_t n = config->size < sizeof(job->config) ? config->size : sizeof(job->config);
        memcpy(&job->config, config, n);
        job->config.size = n;
    }
    return ncclSuccess;
}
