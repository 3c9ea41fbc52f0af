/* Collective and point-to-point entry points: argument checks, then a task for the group. */
#include <stdint.h>

#include "algo/sched.h"
#include "api/export.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/redop_build.h"
#include "exec/cuda.h"

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

/*
 * The largest buffer of the operation, in bytes, must be addressable: count elements per block
 * times the blocks a buffer holds (nranks for all-gather's output, reduce-scatter's input, both
 * all-to-all buffers, gather's output and scatter's input). A count whose byte size exceeds
 * every address space (2^57 bytes: 64-bit Linux maps at most 2^56 for a process, x86-64 with
 * 5-level paging; arm64 2^52) is the caller's mistake, not an allocation failure: SIZE_MAX int8
 * elements did not overflow size_t and failed as out of memory for the schedule's steps.
 */
#define WEFT_MAX_BUFFER_BYTES ((size_t)1 << 57)

static ncclResult_t weft_check_size(const struct ncclComm *comm, int coll, size_t count,
                                    ncclDataType_t dtype, const char *api)
{
    size_t blocks = 1;
    if (coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCESCATTER ||
        coll == WEFT_COLL_ALLTOALL || coll == WEFT_COLL_GATHER || coll == WEFT_COLL_SCATTER)
        blocks = (size_t)comm->nranks;
    size_t es = weft_dtype_size(dtype);
    /* Element sizes are powers of two: a shift; a division only where there are blocks (~15
     * cycles each on the path of every call). */
    size_t max = WEFT_MAX_BUFFER_BYTES >> __builtin_ctzll(es);
    if (blocks > 1)
        max /= blocks;
    if (count > max) {
        WEFT_WARN("%s: count %zu of %zu-byte elements%s overflows the address space", api, count,
                  es, blocks > 1 ? " per rank" : "");
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* The caller holds comm (weft_comm_enter). */
static ncclResult_t weft_check_usable(const struct ncclComm *comm, const char *api)
{
    if (comm->finalized) {
        WEFT_WARN("%s: communicator was finalized", api);
        return ncclInvalidUsage;
    }
    if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)) {
        WEFT_WARN("%s: communicator was revoked", api);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/*
 * Common path of every collective. On host memory the stream decides where the work runs: NULL
 * or a foreign stream (the operation is complete when the call or its group returns), or a Weft
 * host stream (asynchronous, in issue order).
 */
/* root_name: "root" or "peer" when root is a rank to check, NULL when the operation has none.
 * The caller holds comm. */
static ncclResult_t weft_coll_task_held(int coll, const char *api, const void *sendbuff,
                                        void *recvbuff, size_t count, ncclDataType_t dtype,
                                        int reduce, ncclRedOp_t op, int root,
                                        const char *root_name, ncclComm_t comm,
                                        cudaStream_t stream, int send_needed, int recv_needed)
{
    WEFT_CHECK(weft_check_usable(comm, api));
    WEFT_CHECK(weft_check_dtype(dtype, api));
    if (root_name != NULL)
        WEFT_CHECK(weft_check_root(comm, root, root_name, api));
    WEFT_CHECK(weft_check_size(comm, coll, count, dtype, api));
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
        .stream = stream,
    };
    if (reduce)
        WEFT_CHECK(weft_redop_build(comm, op, dtype, api, &task.redop));
    if (count == 0)
        return ncclSuccess; /* NCCL discards empty collectives; empty send/recv are no-ops */
    if (send_needed)
        WEFT_CHECK(weft_check_buf(sendbuff, "sendbuff", api));
    if (recv_needed)
        WEFT_CHECK(weft_check_buf(recvbuff, "recvbuff", api));
    WEFT_CHECK(weft_cuda_classify(comm, &task, send_needed, recv_needed));
    return weft_group_enqueue(&task);
}

/* Outside a group the call holds comm from its first check until the operation ran (host
 * memory) or was enqueued (device memory); inside one, the group holds it from its first call on
 * comm until the group ended. An abort or destroy on another thread waits for that, or the call
 * sees them and fails. */
static ncclResult_t weft_coll_task(int coll, const char *api, const void *sendbuff,
                                   void *recvbuff, size_t count, ncclDataType_t dtype, int reduce,
                                   ncclRedOp_t op, int root, const char *root_name, ncclComm_t comm,
                                   cudaStream_t stream, int send_needed, int recv_needed)
{
    if (weft_group_depth() > 0) {
        WEFT_CHECK(weft_group_hold(comm, api));
        return weft_coll_task_held(coll, api, sendbuff, recvbuff, count, dtype, reduce, op, root,
                                   root_name, comm, stream, send_needed, recv_needed);
    }
    WEFT_CHECK(weft_comm_enter(comm, api));
    ncclResult_t res = weft_coll_task_held(coll, api, sendbuff, recvbuff, count, dtype, reduce,
                                           op, root, root_name, comm, stream, send_needed,
                                           recv_needed);
    weft_comm_leave(comm);
    return res;
}

static ncclResult_t weft_coll(int coll, const char *api, const void *sendbuff, void *recvbuff,
                              size_t count, ncclDataType_t dtype, int reduce, ncclRedOp_t op,
                              int root, int rooted, ncclComm_t comm, cudaStream_t stream,
                              int send_needed, int recv_needed)
{
    return weft_group_record(weft_coll_task(coll, api, sendbuff, recvbuff, count, dtype, reduce,
                                            op, root, rooted ? "root" : NULL, comm, stream,
                                            send_needed, recv_needed));
}

static int weft_is_root(const struct ncclComm *comm, int root)
{
    return comm != NULL && comm->magic == WEFT_COMM_MAGIC && comm->rank == root;
}

WEFT_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_ALLREDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, 1,
                     op, 0, 0, comm, stream, 1, 1);
}

WEFT_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype, 0,
                     ncclSum, root, 1, comm, stream, weft_is_root(comm, root), 1);
}

WEFT_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root,
         ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_BROADCAST, "ncclBcast", buff, buff, count, datatype, 0, ncclSum,
                     root, 1, comm, stream, 1, 1);
}

WEFT_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_REDUCE, "ncclReduce", sendbuff, recvbuff, count, datatype, 1, op,
                     root, 1, comm, stream, 1, weft_is_root(comm, root));
}

WEFT_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_ALLGATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype,
                     0, ncclSum, 0, 0, comm, stream, 1, 1);
}

WEFT_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_REDUCESCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount,
                     datatype, 1, op, 0, 0, comm, stream, 1, 1);
}

WEFT_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_ALLTOALL, "ncclAlltoAll", sendbuff, recvbuff, count, datatype, 0,
                     ncclSum, 0, 0, comm, stream, 1, 1);
}

WEFT_API(ncclResult_t, ncclGather, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_GATHER, "ncclGather", sendbuff, recvbuff, count, datatype, 0,
                     ncclSum, root, 1, comm, stream, 1, weft_is_root(comm, root));
}

WEFT_API(ncclResult_t, ncclScatter, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return weft_coll(WEFT_COLL_SCATTER, "ncclScatter", sendbuff, recvbuff, count, datatype, 0,
                     ncclSum, root, 1, comm, stream, weft_is_root(comm, root), 1);
}

/* Point-to-point: count 0 is a valid no-op; the peer may be this rank. */
static ncclResult_t weft_p2p(int coll, const char *api, const void *sendbuff, void *recvbuff,
                             size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                             cudaStream_t stream)
{
    return weft_coll_task(coll, api, sendbuff, recvbuff, count, dtype, 0, ncclSum, peer, "peer",
                          comm, stream, coll == WEFT_COLL_SEND, coll == WEFT_COLL_RECV);
}

WEFT_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclComm_t comm, cudaStream_t stream)
{
    return weft_group_record(weft_p2p(WEFT_COLL_SEND, "ncclSend", sendbuff, NULL, count, datatype,
                                      peer, comm, stream));
}

WEFT_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    return weft_group_record(weft_p2p(WEFT_COLL_RECV, "ncclRecv", NULL, recvbuff, count, datatype,
                                      peer, comm, stream));
}
