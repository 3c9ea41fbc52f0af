/* Collective and point-to-point entry points: argument checks, then a task for the group. */
#include "algo/sched.h"
#include "api/export.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/redop_build.h"

static ncclResult_t weft_check_dtype(ncclDataType_t dtype, const char *api)
{
    if ((int)dtype < 0 || (int)dtype >= ncclNumTypes) {
        WEFT_WARN("%s: invalid datatype %d", api, (int)dtype);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static ncclResult_t weft_check_root(const struct ncclComm *comm, int root, const char *what,
                                    const char *api)
{
    if (root < 0 || root >= comm->nranks) {
        WEFT_WARN("%s: %s %d is out of range for %d ranks", api, what, root, comm->nranks);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static ncclResult_t weft_check_buf(const void *buf, const char *name, const char *api)
{
    if (buf == NULL) {
        WEFT_WARN("%s: %s is NULL", api, name);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static ncclResult_t weft_check_usable(const struct ncclComm *comm, const char *api)
{
    WEFT_CHECK(weft_comm_check(comm, api));
    if (comm->finalized) {
        WEFT_WARN("%s: communicator was finalized", api);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/*
 * Common path of every collective. The stream is accepted and ignored on host memory: an
 * operation issued with host buffers has completed when the call (or its group) returns.
 */
static ncclResult_t weft_coll(int coll, const char *api, const void *sendbuff, void *recvbuff,
                              size_t count, ncclDataType_t dtype, int reduce, ncclRedOp_t op,
                              int root, int rooted, ncclComm_t comm, int send_needed,
                              int recv_needed)
{
    WEFT_CHECK(weft_check_usable(comm, api));
    WEFT_CHECK(weft_check_dtype(dtype, api));
    if (rooted)
        WEFT_CHECK(weft_check_root(comm, root, "root", api));
    struct weft_task task = {
        .comm = comm,
        .coll = coll,
        .sendbuf = sendbuff,
        .recvbuf = recvbuff,
        .count = count,
        .dtype = dtype,
        .root = root,
        .has_redop = reduce,
        .api = api,
    };
    if (reduce)
        WEFT_CHECK(weft_redop_build(comm, op, dtype, api, &task.redop));
    if (count == 0)
        return ncclSuccess; /* NCCL discards empty collectives */
    if (send_needed)
        WEFT_CHECK(weft_check_buf(sendbuff, "sendbuff", api));
    if (recv_needed)
        WEFT_CHECK(weft_check_buf(recvbuff, "recvbuff", api));
    return weft_group_enqueue(&task);
}

WEFT_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return weft_coll(WEFT_COLL_ALLREDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, 1,
                     op, 0, 0, comm, 1, 1);
}

WEFT_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    int is_root = comm != NULL && comm->magic == WEFT_COMM_MAGIC && comm->rank == root;
    return weft_coll(WEFT_COLL_BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype, 0,
                     ncclSum, root, 1, comm, is_root, 1);
}

WEFT_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return weft_coll(WEFT_COLL_BROADCAST, "ncclBcast", buff, buff, count, datatype, 0, ncclSum,
                     root, 1, comm, 1, 1);
}

WEFT_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    int is_root = comm != NULL && comm->magic == WEFT_COMM_MAGIC && comm->rank == root;
    return weft_coll(WEFT_COLL_REDUCE, "ncclReduce", sendbuff, recvbuff, count, datatype, 1, op,
                     root, 1, comm, 1, is_root);
}

WEFT_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return weft_coll(WEFT_COLL_ALLGATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype,
                     0, ncclSum, 0, 0, comm, 1, 1);
}

WEFT_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    (void)stream;
    return weft_coll(WEFT_COLL_REDUCESCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount,
                     datatype, 1, op, 0, 0, comm, 1, 1);
}

/* Not implemented yet: all-to-all, gather, scatter and point-to-point (next issue). */
static ncclResult_t weft_not_yet(const char *api, ncclComm_t comm)
{
    WEFT_CHECK(weft_comm_check(comm, api));
    WEFT_WARN("%s is not supported by this version of Weft yet", api);
    return ncclInvalidUsage;
}

WEFT_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)stream;
    return weft_not_yet("ncclAlltoAll", comm);
}

WEFT_API(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root, (void)stream;
    return weft_not_yet("ncclGather", comm);
}

WEFT_API(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root, (void)stream;
    return weft_not_yet("ncclScatter", comm);
}

WEFT_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)count, (void)datatype, (void)peer, (void)stream;
    return weft_not_yet("ncclSend", comm);
}

WEFT_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    (void)recvbuff, (void)count, (void)datatype, (void)peer, (void)stream;
    return weft_not_yet("ncclRecv", comm);
}
