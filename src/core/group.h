/*
 * Groups and tasks. Every operation becomes a task; outside a group it runs at once (an implicit
 * group of one), inside ncclGroupStart/End it is recorded and the outermost ncclGroupEnd runs
 * every recorded task together, so that tasks on several communicators or with several peers
 * progress at the same time. Group state is per thread, as in NCCL.
 */
#ifndef WEFT_CORE_GROUP_H
#define WEFT_CORE_GROUP_H

#include <stddef.h>

#include "nccl.h"
#include "redop.h"

struct ncclComm;

struct weft_task {
    struct ncclComm *comm;
    int coll; /* enum weft_coll */
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    int dtype;
    int root; /* root, or peer for send/recv */
    int has_redop;
    struct weft_redop redop; /* captured at enqueue: the user may destroy the op right after */
    const char *api;         /* public name, for messages */
    const void *stream;      /* the user's cudaStream_t: NULL, a Weft host stream, or foreign */
    int on_device;           /* buffers are CUDA memory: the CUDA executor runs it (exec/cuda.h) */
    uint64_t enq_ns;         /* WEFT_TRACE_FILE: when the call was made (weft_time_ns), else 0 */
};

/* Runs the task now (no group open: the executors may change it, and it must live until the call
 * returns) or records a copy; an error is reported at group end. Sets task->enq_ns. */
ncclResult_t weft_group_enqueue(struct weft_task *task);

/* A communicator init recorded inside a group runs at ncclGroupEnd (concurrently with others). */
ncclResult_t weft_group_enqueue_init(struct ncclComm **comm_p, int nranks, const ncclUniqueId *id,
                                     int rank, const ncclConfig_t *config);

/* Inside a group, remembers the first error for ncclGroupEnd; returns res unchanged. */
ncclResult_t weft_group_record(ncclResult_t res);

int weft_group_depth(void);
/*
 * Inside a group: the calling thread's group holds comm (weft_comm_enter) from its first call in
 * the group until the group ends, so abort or destroy on another thread waits for the group (or
 * the call fails, naming api). One hold per communicator and group.
 */
ncclResult_t weft_group_hold(struct ncclComm *comm, const char *api);
/*
 * Before the calling thread destroys or aborts comm: its open group (if any) drops comm's tasks
 * and its hold; returns 1 when it held comm.
 */
int weft_group_forget(struct ncclComm *comm);
ncclResult_t weft_group_start(void);
ncclResult_t weft_group_end(void);
/* Like the outermost ncclGroupEnd, but only predicts the group's time; nothing runs. */
ncclResult_t weft_group_simulate_end(ncclSimInfo_t *info);

/*
 * Issues tasks: each communicator's tasks take one ticket and go, together, to the stream of the
 * communicator's first task (a Weft host stream, the communicator's own stream if it is
 * non-blocking, or the calling thread). Returns the inline result, or ncclInProgress when work
 * went to a non-blocking communicator.
 */
ncclResult_t weft_submit(struct weft_task *tasks, int ntasks);

/* Runs tasks to completion in the calling thread (exec/host_plan.c); the caller holds comm->busy of
 * every communicator of the tasks (core/submit.c). */
ncclResult_t weft_exec_tasks(struct weft_task *tasks, int ntasks);

/* Frees comm's schedule cache (exec/host_cache.c). */
void weft_exec_cache_free(struct ncclComm *comm);

/* Steps this rank has received as direct (single-copy) sends on comm (exec/lane.h): for tests. */
uint64_t weft_exec_single_copy_count(const struct ncclComm *comm);

#endif
