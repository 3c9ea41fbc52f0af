/* Per-thread groups: nesting, recorded tasks and inits, errors reported at the outermost end. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"

struct weft_init_job {
    struct ncclComm **comm_p;
    int nranks;
    ncclUniqueId id;
    int rank;
    int has_config;
    ncclConfig_t config;
    ncclResult_t res;
};

struct weft_group {
    int depth;
    ncclResult_t error; /* first error recorded inside the group */
    struct weft_task *tasks;
    int ntasks, task_cap;
    struct weft_init_job *inits;
    int ninits, init_cap;
};

static __thread struct weft_group weft_group_state;

int weft_group_depth(void)
{
    return weft_group_state.depth;
}

ncclResult_t weft_group_start(void)
{
    weft_group_state.depth++;
    return ncclSuccess;
}

static void *weft_init_thread(void *arg)
{
    struct weft_init_job *job = arg;
    job->res = weft_comm_init(job->comm_p, job->nranks, &job->id, job->rank,
                              job->has_config ? &job->config : NULL);
    return NULL;
}

/* Inits of a group run concurrently: each blocks until all its ranks arrive. */
static ncclResult_t weft_group_run_inits(struct weft_group *g)
{
    ncclResult_t res = ncclSuccess;
    if (g->ninits == 1) {
        weft_init_thread(&g->inits[0]);
        return g->inits[0].res;
    }
    pthread_t *threads = calloc((size_t)g->ninits, sizeof(pthread_t));
    if (threads == NULL) {
        WEFT_WARN("out of memory starting %d communicator inits", g->ninits);
        return ncclSystemError;
    }
    int started = 0;
    for (; started < g->ninits; started++) {
        int err = pthread_create(&threads[started], NULL, weft_init_thread, &g->inits[started]);
        if (err != 0) {
            WEFT_WARN("pthread_create for communicator init failed: %s", strerror(err));
            res = ncclSystemError;
            break;
        }
    }
    for (int i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
        WEFT_CHECK_IGNORE(g->inits[i].res, res);
    }
    free(threads);
    return res;
}

static void weft_group_reset(struct weft_group *g)
{
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
    if (res == ncclSuccess && g->ntasks > 0)
        res = weft_exec_tasks(g->tasks, g->ntasks);
    weft_group_reset(g);
    return res;
}

static ncclResult_t weft_group_fail(struct weft_group *g, ncclResult_t res)
{
    if (g->error == ncclSuccess)
        g->error = res;
    return res;
}

ncclResult_t weft_group_enqueue(const struct weft_task *task)
{
    struct weft_group *g = &weft_group_state;
    if (g->depth == 0) {
        struct weft_task copy = *task;
        return weft_exec_tasks(&copy, 1);
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
    if (g->depth == 0)
        return weft_comm_init(comm_p, nranks, id, rank, config);
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
