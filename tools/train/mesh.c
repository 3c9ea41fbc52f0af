/*
 * mesh.c -- the process mesh (DP x TP x PP, EP folded into DP), counted allocations and counted
 * collective wrappers of the training layer.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train.h"

int wt_log_rank = -1;
struct wt_mem_stats wt_mem;
int wt_mem_mute;
struct wt_comm_stats wt_comm;

void wt_errorf(const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    fprintf(stderr, "weft-train[%d]: %s:%d: %s\n", wt_log_rank, base ? base + 1 : file, line, msg);
}

double wt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------- */

static const char *const mem_names[WT_MEM_KINDS] = {"params", "grads", "optim", "acts", "comm"};

const char *wt_mem_name(enum wt_mem_kind kind)
{
    return (unsigned)kind < WT_MEM_KINDS ? mem_names[kind] : "?";
}

void *wt_alloc(enum wt_mem_kind kind, size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (p == NULL) {
        WT_ERR("out of memory allocating %zu bytes of %s", bytes, wt_mem_name(kind));
        abort();
    }
    if (!wt_mem_mute) {
        wt_mem.now[kind] += bytes;
        if (wt_mem.now[kind] > wt_mem.peak[kind])
            wt_mem.peak[kind] = wt_mem.now[kind];
    }
    return p;
}

void wt_free(enum wt_mem_kind kind, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (!wt_mem_mute)
        wt_mem.now[kind] -= bytes;
    free(p);
}

/* ---------------------------------------------------------------------------------------- */

static const char *const coll_names[WT_COLL_KINDS] = {
    "allreduce", "reducescatter", "allgather", "broadcast", "reduce", "sendrecv", "alltoall"};

const char *wt_coll_name(enum wt_coll coll)
{
    return (unsigned)coll < WT_COLL_KINDS ? coll_names[coll] : "?";
}

static void count(enum wt_coll coll, size_t bytes, double t0)
{
    wt_comm.calls[coll]++;
    wt_comm.bytes[coll] += bytes;
    wt_comm.seconds[coll] += wt_now() - t0;
}

static size_t comm_size(ncclComm_t comm)
{
    int n = 1;
    if (ncclCommCount(comm, &n) != ncclSuccess)
        return 1;
    return (size_t)n;
}

#define STREAM(s) weftStreamAsCuda(s)

ncclResult_t wt_allreduce(const float *send, float *recv, size_t count_, ncclRedOp_t op,
                          ncclComm_t comm, weftStream_t stream)
{
    double t0 = wt_now();
    WT_CHECK(ncclAllReduce(send, recv, count_, ncclFloat32, op, comm, STREAM(stream)));
    count(WT_COLL_ALLREDUCE, count_ * sizeof(float), t0);
    return ncclSuccess;
}

ncclResult_t wt_reducescatter(const float *send, float *recv, size_t recvcount, ncclComm_t comm,
                              weftStream_t stream)
{
    double t0 = wt_now();
    WT_CHECK(ncclReduceScatter(send, recv, recvcount, ncclFloat32, ncclSum, comm, STREAM(stream)));
    count(WT_COLL_REDUCESCATTER, recvcount * comm_size(comm) * sizeof(float), t0);
    return ncclSuccess;
}

ncclResult_t wt_allgather(const float *send, float *recv, size_t sendcount, ncclComm_t comm,
                          weftStream_t stream)
{
    double t0 = wt_now();
    WT_CHECK(ncclAllGather(send, recv, sendcount, ncclFloat32, comm, STREAM(stream)));
    count(WT_COLL_ALLGATHER, sendcount * comm_size(comm) * sizeof(float), t0);
    return ncclSuccess;
}

static size_t type_size(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

ncclResult_t wt_broadcast(const void *send, void *recv, size_t count_, ncclDataType_t type,
                          int root, ncclComm_t comm, weftStream_t stream)
{
    double t0 = wt_now();
    WT_CHECK(ncclBroadcast(send, recv, count_, type, root, comm, STREAM(stream)));
    count(WT_COLL_BROADCAST, count_ * type_size(type), t0);
    return ncclSuccess;
}

ncclResult_t wt_reduce(const void *send, void *recv, size_t count_, ncclDataType_t type,
                       ncclRedOp_t op, int root, ncclComm_t comm, weftStream_t stream)
{
    double t0 = wt_now();
    WT_CHECK(ncclReduce(send, recv, count_, type, op, root, comm, STREAM(stream)));
    count(WT_COLL_REDUCE, count_ * type_size(type), t0);
    return ncclSuccess;
}

ncclResult_t wt_send(const void *buf, size_t bytes, int peer, ncclComm_t comm, enum wt_coll kind)
{
    double t0 = wt_now();
    WT_CHECK(ncclSend(buf, bytes, ncclUint8, peer, comm, NULL));
    count(kind, bytes, t0);
    return ncclSuccess;
}

ncclResult_t wt_recv(void *buf, size_t bytes, int peer, ncclComm_t comm)
{
    WT_CHECK(ncclRecv(buf, bytes, ncclUint8, peer, comm, NULL));
    return ncclSuccess;
}

ncclResult_t wt_stream_sync(weftStream_t stream)
{
    if (stream == NULL)
        return ncclSuccess;
    double t0 = wt_now();
    WT_CHECK(weftStreamSynchronize(stream));
    wt_comm.sync_seconds += wt_now() - t0;
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------- */

void wt_mesh_single(struct wt_mesh *mesh)
{
    memset(mesh, 0, sizeof(*mesh));
    mesh->world = mesh->dp = mesh->tp = mesh->pp = mesh->ep = mesh->edp = 1;
}

void wt_mesh_coords(struct wt_mesh *m, int dp, int tp, int pp, int ep, int sp, int rank)
{
    memset(m, 0, sizeof(*m));
    m->world = dp * tp * pp;
    m->rank = rank;
    m->dp = dp;
    m->tp = tp;
    m->pp = pp;
    m->ep = ep;
    m->edp = dp / ep;
    m->sp = sp;
    m->tp_rank = rank % tp;
    m->dp_rank = (rank / tp) % dp;
    m->pp_rank = rank / (tp * dp);
    m->ep_rank = m->dp_rank % ep;
    m->edp_rank = m->dp_rank / ep;
}

/* Members of a group share every coordinate outside it; the color encodes those, the key is the
 * coordinate inside it, so group rank == that coordinate. */
static ncclResult_t split(ncclComm_t world, int color, int key, ncclComm_t *comm_p)
{
    WT_CHECK(ncclCommSplit(world, color, key, comm_p, NULL));
    return ncclSuccess;
}

ncclResult_t wt_mesh_init(struct wt_mesh *mesh, ncclComm_t world, int dp, int tp, int pp, int ep,
                          int sp)
{
    int nranks, rank;
    WT_CHECK(ncclCommCount(world, &nranks));
    WT_CHECK(ncclCommUserRank(world, &rank));
    wt_log_rank = rank;
    if (dp < 1 || tp < 1 || pp < 1 || ep < 1 || dp * tp * pp != nranks) {
        WT_ERR("mesh dp %d x tp %d x pp %d does not match the %d ranks of the job", dp, tp, pp,
               nranks);
        return ncclInvalidArgument;
    }
    if (dp % ep != 0) {
        WT_ERR("ep %d must divide dp %d (experts are spread over the data-parallel group)", ep,
               dp);
        return ncclInvalidArgument;
    }
    if (sp && tp == 1)
        sp = 0; /* sequence parallelism lives inside the TP group */

    struct wt_mesh m;
    wt_mesh_coords(&m, dp, tp, pp, ep, sp, rank);
    m.world_comm = world;

    /* Every rank joins every split (ncclCommSplit is collective over world); a rank that does
     * not belong to the tie group passes NCCL_SPLIT_NOCOLOR. */
    WT_CHECK(split(world, m.dp_rank + dp * m.pp_rank, m.tp_rank, &m.tp_comm));
    WT_CHECK(split(world, m.tp_rank + tp * m.pp_rank, m.dp_rank, &m.dp_comm));
    WT_CHECK(split(world, m.tp_rank + tp * m.dp_rank, m.pp_rank, &m.pp_comm));
    WT_CHECK(split(world, (m.tp_rank + tp * m.pp_rank) * m.edp + m.edp_rank, m.ep_rank,
                   &m.ep_comm));
    WT_CHECK(split(world, (m.tp_rank + tp * m.pp_rank) * ep + m.ep_rank, m.edp_rank,
                   &m.edp_comm));
    int in_tie = pp > 1 && (m.pp_rank == 0 || m.pp_rank == pp - 1);
    WT_CHECK(split(world, in_tie ? m.tp_rank + tp * m.dp_rank : NCCL_SPLIT_NOCOLOR,
                   m.pp_rank, &m.tie_comm));
    *mesh = m;
    return ncclSuccess;
}

void wt_mesh_fini(struct wt_mesh *mesh)
{
    ncclComm_t *comms[] = {&mesh->tp_comm, &mesh->dp_comm, &mesh->pp_comm,
                           &mesh->ep_comm, &mesh->edp_comm, &mesh->tie_comm};
    for (size_t i = 0; i < sizeof(comms) / sizeof(comms[0]); i++) {
        if (*comms[i] != NULL)
            ncclCommDestroy(*comms[i]);
        *comms[i] = NULL;
    }
}
