/*
 * The launch order of the ranks of one device in one process (see exec/cuda_order.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/communicator.h"
#include "core/cond.h"
#include "core/log.h"
#include "core/param.h"
#include "dev_kernel.h"
#include "exec/cuda_order.h"

WEFT_PARAM_DECL(Timeout);

/* What one rank of the process has launched; sends and receives indexed by local rank. */
struct weft_cuda_order_rank {
    uint64_t coll;    /* normal kernels' collectives */
    uint64_t direct;  /* direct kernels (each one collective) */
    uint64_t *send;   /* [nlocal] */
    uint64_t *recv;   /* [nlocal] */
    int dev;
    int gone;         /* its communicator is destroyed or aborted */
};

struct weft_cuda_order {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t launches; /* every launch counted: progress, for the deadline */
    int nlocal;
    int *local;        /* [nranks]: index among this process's ranks, or -1 */
    int *rank_of;      /* [nlocal] */
    struct weft_cuda_order_rank *r; /* [nlocal] */
    uint64_t *counts;  /* the send and receive rows */
};

struct weft_cuda_order *weft_cuda_order_new(int nranks, const int *dev, ncclResult_t *res_p)
{
    int nlocal = 0, shared = 0;
    for (int p = 0; p < nranks; p++) {
        if (dev[p] < 0)
            continue;
        for (int q = 0; q < p; q++)
            shared |= dev[q] == dev[p];
        nlocal++;
    }
    if (!shared)
        return NULL;
    struct weft_cuda_order *o = calloc(1, sizeof(*o));
    if (o != NULL) {
        pthread_mutex_init(&o->mu, NULL);
        pthread_cond_init(&o->cv, NULL);
        o->local = malloc((size_t)nranks * sizeof(int));
        o->rank_of = malloc((size_t)nlocal * sizeof(int));
        o->r = calloc((size_t)nlocal, sizeof(*o->r));
        o->counts = calloc(2 * (size_t)nlocal * (size_t)nlocal, sizeof(uint64_t));
    }
    if (o == NULL || o->local == NULL || o->rank_of == NULL || o->r == NULL || o->counts == NULL) {
        WEFT_WARN("out of memory ordering the launches of %d ranks sharing devices", nlocal);
        *res_p = ncclSystemError;
        weft_cuda_order_free(o);
        return NULL;
    }
    o->nlocal = nlocal;
    for (int p = 0, l = 0; p < nranks; p++) {
        o->local[p] = dev[p] < 0 ? -1 : l;
        if (dev[p] < 0)
            continue;
        o->rank_of[l] = p;
        o->r[l].dev = dev[p];
        o->r[l].send = o->counts + (size_t)(2 * l) * (size_t)nlocal;
        o->r[l].recv = o->r[l].send + nlocal;
        l++;
    }
    return o;
}

void weft_cuda_order_free(struct weft_cuda_order *o)
{
    if (o == NULL)
        return;
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o->local);
    free(o->rank_of);
    free(o->r);
    free(o->counts);
    free(o);
}

void weft_cuda_order_launched(struct weft_cuda_order *o, int rank,
                              const struct weft_dev_params *params)
{
    struct weft_cuda_order_rank *me = &o->r[o->local[rank]];
    pthread_mutex_lock(&o->mu);
    for (int i = 0; i < params->nops; i++) {
        const struct weft_dev_op *op = &params->ops[i];
        int peer = op->coll == WEFT_COLL_SEND || op->coll == WEFT_COLL_RECV ? o->local[op->root]
                                                                            : -2;
        if (peer == -2)
            me->coll++;
        else if (peer >= 0 && op->coll == WEFT_COLL_SEND)
            me->send[peer]++;
        else if (peer >= 0)
            me->recv[peer]++;
    }
    o->launches++;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

void weft_cuda_order_launched_direct(struct weft_cuda_order *o, int rank)
{
    pthread_mutex_lock(&o->mu);
    o->r[o->local[rank]].direct++;
    o->launches++;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* The first same-device peer (local index) that has not launched what rank li's kernels wait
 * for, or -1 when covered (a peer gone after launching it does not count). Under mu. */
static int weft_cuda_order_lagging(const struct weft_cuda_order *o, int li)
{
    const struct weft_cuda_order_rank *a = &o->r[li];
    for (int lj = 0; lj < o->nlocal; lj++) {
        const struct weft_cuda_order_rank *b = &o->r[lj];
        if (lj == li || b->dev != a->dev)
            continue;
        if (b->coll < a->coll || b->direct < a->direct || b->recv[li] < a->send[lj] ||
            b->send[li] < a->recv[lj])
            return lj;
    }
    return -1;
}

int weft_cuda_order_ready(struct weft_cuda_order *o, int rank)
{
    pthread_mutex_lock(&o->mu);
    int lag = weft_cuda_order_lagging(o, o->local[rank]);
    pthread_mutex_unlock(&o->mu);
    return lag < 0;
}

/* What rank li waits for from peer lj, in words. Under mu. */
static void weft_cuda_order_lack(const struct weft_cuda_order *o, int li, int lj, char *buf,
                                 size_t len)
{
    const struct weft_cuda_order_rank *a = &o->r[li], *b = &o->r[lj];
    int me = o->rank_of[li];
    if (b->coll < a->coll || b->direct < a->direct)
        snprintf(buf, len, "its collective #%llu",
                 (unsigned long long)(b->coll < a->coll ? a->coll : a->direct));
    else if (b->recv[li] < a->send[lj])
        snprintf(buf, len, "its receive #%llu from rank %d", (unsigned long long)a->send[lj], me);
    else
        snprintf(buf, len, "its send #%llu to rank %d", (unsigned long long)a->recv[lj], me);
}

static uint64_t weft_cuda_order_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

ncclResult_t weft_cuda_order_wait(struct weft_cuda_order *o, struct ncclComm *comm)
{
    int li = o->local[comm->rank];
    uint64_t limit_s = (uint64_t)weft_param_Timeout();
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&o->mu);
    uint64_t seen = o->launches, still_ns = weft_cuda_order_now_ns();
    int lag;
    while ((lag = weft_cuda_order_lagging(o, li)) >= 0) {
        char lack[96];
        int revoked = __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE);
        if (revoked || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
            WEFT_WARN("rank %d: communicator %s while waiting for rank %d to launch", comm->rank,
                      revoked ? "revoked" : "aborted", o->rank_of[lag]);
            res = ncclInvalidUsage;
            break;
        }
        if (o->r[lag].gone) {
            weft_cuda_order_lack(o, li, lag, lack, sizeof(lack));
            WEFT_WARN("rank %d: rank %d (this process, device %d) left (its communicator was "
                      "destroyed or aborted) without launching %s", comm->rank, o->rank_of[lag],
                      o->r[li].dev, lack);
            res = ncclRemoteError;
            break;
        }
        uint64_t now_ns = weft_cuda_order_now_ns();
        if (o->launches != seen) {
            seen = o->launches;
            still_ns = now_ns;
        } else if (now_ns - still_ns >= limit_s * 1000000000ull) {
            weft_cuda_order_lack(o, li, lag, lack, sizeof(lack));
            WEFT_WARN("rank %d: rank %d (this process, device %d) did not launch %s within %llu s "
                      "(WEFT_TIMEOUT): this rank's operation cannot be queued before it, as the "
                      "device's streams may share one hardware queue "
                      "(CUDA_DEVICE_MAX_CONNECTIONS). Ranks that share a device must issue their "
                      "calls from their own threads, or from one thread inside one group "
                      "(WEFT_CUDA_ORDER)",
                      comm->rank, o->rank_of[lag], o->r[li].dev, lack,
                      (unsigned long long)limit_s);
            res = ncclRemoteError;
            break;
        }
        weft_cond_wait_ms(&o->cv, &o->mu, 50); /* abort does not signal: look every 50 ms */
    }
    pthread_mutex_unlock(&o->mu);
    return res;
}

void weft_cuda_order_leave(struct weft_cuda_order *o, int rank)
{
    pthread_mutex_lock(&o->mu);
    o->r[o->local[rank]].gone = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}
