/* Communicator entry points: version, errors, unique id, init, finalize, destroy, abort, queries. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/export.h"
#include "bootstrap/bootstrap.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/split.h"
#include "exec/cuda.h"
#include "exec/stream.h"
#include "exec/wait.h"

WEFT_API(ncclResult_t, ncclGetVersion, int *version)
{
    if (version == NULL) {
        WEFT_WARN("ncclGetVersion: version is NULL");
        return ncclInvalidArgument;
    }
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

WEFT_API(const char *, ncclGetErrorString, ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

WEFT_API(const char *, ncclGetLastError, ncclComm_t comm)
{
    (void)comm;
    return weft_log_last_error();
}

WEFT_API(void, ncclResetDebugInit, void)
{
    /* Logging settings are read once; re-reading them at run time is not supported. */
}

WEFT_EXPORT void ncclResetDebugInitInternal(void);
WEFT_EXPORT void ncclResetDebugInitInternal(void)
{
}

WEFT_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    if (uniqueId == NULL) {
        WEFT_WARN("ncclGetUniqueId: uniqueId is NULL");
        return ncclInvalidArgument;
    }
    return weft_bootstrap_get_unique_id(uniqueId);
}

WEFT_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId,
         int rank, ncclConfig_t *config)
{
    if (comm == NULL) {
        WEFT_WARN("ncclCommInitRankConfig: comm is NULL");
        return ncclInvalidArgument;
    }
    return weft_group_enqueue_init(comm, nranks, &commId, rank, config);
}

WEFT_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId,
         int rank)
{
    if (comm == NULL) {
        WEFT_WARN("ncclCommInitRank: comm is NULL");
        return ncclInvalidArgument;
    }
    return weft_group_enqueue_init(comm, nranks, &commId, rank, NULL);
}

WEFT_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comms, int ndev, const int *devlist)
{
    if (comms == NULL) {
        WEFT_WARN("ncclCommInitAll: comms is NULL");
        return ncclInvalidArgument;
    }
    if (ndev < 1) {
        WEFT_WARN("ncclCommInitAll: ndev %d must be at least 1", ndev);
        return ncclInvalidArgument;
    }
    for (int i = 0; devlist != NULL && i < ndev; i++) {
        if (devlist[i] < 0) {
            WEFT_WARN("ncclCommInitAll: devlist[%d] = %d is not a valid device", i, devlist[i]);
            return ncclInvalidArgument;
        }
        for (int j = 0; j < i; j++) {
            if (devlist[j] == devlist[i]) {
                WEFT_WARN("ncclCommInitAll: device %d appears twice in devlist", devlist[i]);
                return ncclInvalidUsage;
            }
        }
    }
    /* Rank i on devlist[i] (device i without a list; Weft wraps around the devices there are,
     * where NCCL would fail, so several ranks may share a device). Without a device the list
     * names nothing and is not checked. */
    int ndevices = weft_cuda_device_count(), prev = weft_cuda_current_device();
    for (int i = 0; devlist != NULL && ndevices > 0 && i < ndev; i++) {
        if (devlist[i] >= ndevices) {
            WEFT_WARN("ncclCommInitAll: devlist[%d] = %d is not a valid device (%d devices)", i,
                      devlist[i], ndevices);
            return ncclInvalidArgument;
        }
    }
    ncclUniqueId id;
    WEFT_CHECK(weft_bootstrap_get_unique_id(&id));
    WEFT_CHECK(weft_group_start());
    ncclResult_t res = ncclSuccess;
    for (int i = 0; i < ndev && res == ncclSuccess; i++) {
        if (ndevices > 0)
            weft_cuda_set_device(devlist != NULL ? devlist[i] : i % ndevices);
        res = weft_group_enqueue_init(&comms[i], ndev, &id, i, NULL);
    }
    if (prev >= 0)
        weft_cuda_set_device(prev);
    ncclResult_t end = weft_group_end();
    return res != ncclSuccess ? res : end;
}

WEFT_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank,
         int nId, ncclUniqueId *commIds, ncclConfig_t *config)
{
    if (newcomm == NULL || commIds == NULL) {
        WEFT_WARN("ncclCommInitRankScalable: %s is NULL", newcomm == NULL ? "newcomm" : "commIds");
        return ncclInvalidArgument;
    }
    if (nId < 1 || nId > nranks) {
        WEFT_WARN("ncclCommInitRankScalable: nId %d must be between 1 and nranks %d", nId, nranks);
        return ncclInvalidArgument;
    }
    /* One root serves every rank: the first id names it (the others only spread load). */
    return weft_group_enqueue_init(newcomm, nranks, &commIds[0], myrank, config);
}

/* Finalize waits for every operation issued before it, on any stream. */
struct weft_finalize_job {
    struct weft_job job;
    struct ncclComm *comm;
    uint64_t ticket;
};

static ncclResult_t weft_finalize_run(struct weft_job *job)
{
    struct weft_finalize_job *f = (struct weft_finalize_job *)job;
    WEFT_CHECK(weft_comm_ticket_wait(f->comm, f->ticket));
    return weft_cuda_comm_sync(f->comm); /* and every kernel launched before */
}

static void weft_finalize_finish(struct weft_job *job, ncclResult_t res)
{
    (void)res;
    weft_comm_ticket_done(((struct weft_finalize_job *)job)->comm);
    free(job);
}

static ncclResult_t weft_finalize(struct ncclComm *comm)
{
    if (comm->revoked) {
        WEFT_WARN("ncclCommFinalize: communicator was revoked (destroy it instead)");
        return ncclInvalidUsage;
    }
    if (comm->finalized) {
        WEFT_WARN("ncclCommFinalize: communicator was already finalized");
        return ncclInvalidArgument;
    }
    /* NCCL refuses to finalize a non-blocking comm whose previous operation is still in progress
     * (ncclInvalidArgument); ncclCommDestroy still works. NCCL also leaves that error sticky on
     * the comm: not done here, since the sticky error would cut short the op still running. */
    WEFT_CHECK(weft_comm_ensure_ready(comm, "ncclCommFinalize"));
    comm->finalized = 1;
    struct weft_finalize_job *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        WEFT_WARN("ncclCommFinalize: out of memory");
        return ncclSystemError;
    }
    f->comm = comm;
    f->ticket = weft_comm_ticket_take(comm);
    f->job.run = weft_finalize_run;
    f->job.finish = weft_finalize_finish;
    if (!comm->blocking) {
        weft_stream_enqueue(comm->async_stream, &f->job);
        return ncclInProgress;
    }
    ncclResult_t res = weft_finalize_run(&f->job);
    weft_finalize_finish(&f->job, res);
    return res;
}

WEFT_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm)
{
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommFinalize"));
    ncclResult_t res = weft_finalize(comm);
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    WEFT_CHECK(weft_comm_check(comm, "ncclCommDestroy"));
    weft_group_forget(comm); /* this thread's open group: its calls on comm go with it */
    if (!weft_comm_claim_close(comm, WEFT_COMM_CLOSING_DESTROY))
        return weft_comm_refuse_closing(comm, "ncclCommDestroy");
    WEFT_CHECK(weft_comm_drain_calls(comm, "ncclCommDestroy"));
    /* Work still queued on host streams finishes first (an implicit finalize). */
    if (comm->async_stream != NULL)
        weft_stream_synchronize(comm->async_stream);
    uint64_t ticket = weft_comm_ticket_take(comm);
    ncclResult_t res = weft_comm_ticket_wait(comm, ticket);
    weft_comm_ticket_done(comm);
    ncclResult_t fres = weft_comm_free(comm);
    return res != ncclSuccess ? res : fres;
}

WEFT_API(ncclResult_t, ncclCommAbort, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    WEFT_CHECK(weft_comm_check(comm, "ncclCommAbort"));
    weft_group_forget(comm); /* this thread's open group: its calls on comm go with it */
    /* Cuts every wait short, including those of a destroy under way on another thread. */
    __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
    if (!weft_comm_claim_close(comm, WEFT_COMM_CLOSING_ABORT)) {
        WEFT_INFO(WEFT_LOG_INIT, "ncclCommAbort: comm %p is already being destroyed or aborted "
                  "by another thread, which frees it", (void *)comm);
        return ncclSuccess;
    }
    weft_cuda_comm_abort(comm);
    if (!weft_comm_drain(comm, 0, 1000)) {
        WEFT_WARN("ncclCommAbort: an operation is still running on rank %d; resources leaked",
                  comm->rank);
        return ncclSuccess;
    }
    weft_comm_set_error(comm, ncclRemoteError);
    /*
     * The work the abort cut short reports its failure while the comm is freed (an init still
     * waiting at the bootstrap root leaves its error on the async stream): that is what abort is
     * for, so, as in NCCL, abort itself succeeds.
     */
    ncclResult_t res = weft_comm_free(comm);
    if (res != ncclSuccess)
        WEFT_INFO(WEFT_LOG_INIT, "ncclCommAbort: cleanup of the aborted work -> %d", (int)res);
    return ncclSuccess;
}

WEFT_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags)
{
    if (revokeFlags != NCCL_REVOKE_DEFAULT) {
        WEFT_CHECK(weft_comm_check(comm, "ncclCommRevoke"));
        WEFT_WARN("ncclCommRevoke: revokeFlags %d must be NCCL_REVOKE_DEFAULT", revokeFlags);
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommRevoke"));
    /*
     * Operations still running fail fast (the executor checks `revoked` where it checks abort),
     * then the communicator is quiescent: only destroy, split and shrink remain valid.
     */
    __atomic_store_n(&comm->revoked, 1, __ATOMIC_RELEASE);
    weft_cuda_comm_abort(comm); /* kernels in flight leave too */
    weft_comm_drain(comm, 1, 10000); /* 1: this call's own hold */
    weft_comm_leave(comm);
    return ncclSuccess;
}

WEFT_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config)
{
    if (newcomm == NULL) {
        WEFT_CHECK(weft_comm_check(comm, "ncclCommSplit"));
        WEFT_WARN("ncclCommSplit: newcomm is NULL");
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommSplit"));
    ncclResult_t res = weft_comm_split(comm, color, key, config, newcomm);
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList,
         int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    if (newcomm == NULL) {
        WEFT_CHECK(weft_comm_check(comm, "ncclCommShrink"));
        WEFT_WARN("ncclCommShrink: newcomm is NULL");
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommShrink"));
    ncclResult_t res = weft_comm_shrink(comm, excludeRanksList, excludeRanksCount, config,
                                        shrinkFlags, newcomm);
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError)
{
    if (asyncError == NULL) {
        WEFT_CHECK(weft_comm_check(comm, "ncclCommGetAsyncError"));
        WEFT_WARN("ncclCommGetAsyncError: asyncError is NULL");
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommGetAsyncError"));
    *asyncError = weft_comm_async_state(comm);
    weft_comm_leave(comm);
    return ncclSuccess;
}

WEFT_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count)
{
    if (count == NULL) {
        WEFT_CHECK(weft_comm_check(comm, "ncclCommCount"));
        WEFT_WARN("ncclCommCount: count is NULL");
        return ncclInvalidArgument;
    }
    /* NCCL: a non-blocking init still in progress is refused, a sticky error returned. */
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommCount"));
    ncclResult_t res = weft_comm_ensure_ready(comm, "ncclCommCount");
    if (res == ncclSuccess)
        *count = comm->nranks;
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device)
{
    if (device == NULL) {
        WEFT_CHECK(weft_comm_check(comm, "ncclCommCuDevice"));
        WEFT_WARN("ncclCommCuDevice: device is NULL");
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommCuDevice"));
    ncclResult_t res = weft_comm_ensure_ready(comm, "ncclCommCuDevice");
    if (res == ncclSuccess)
        *device = comm->cuda_dev;
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank)
{
    if (rank == NULL) {
        WEFT_CHECK(weft_comm_check(comm, "ncclCommUserRank"));
        WEFT_WARN("ncclCommUserRank: rank is NULL");
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommUserRank"));
    ncclResult_t res = weft_comm_ensure_ready(comm, "ncclCommUserRank");
    if (res == ncclSuccess)
        *rank = comm->rank;
    weft_comm_leave(comm);
    return res;
}
