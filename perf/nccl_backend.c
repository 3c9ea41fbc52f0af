/* ---------------------------------------------------------------------------------------------
 * NCCL backend
 *
 * Binds to whichever libnccl.so.2 is loaded. weftLaunchInfo is a weak reference: with Weft's
 * library it gives rank, size and unique id under any launcher; with another library (NVIDIA's,
 * through LD_LIBRARY_PATH) it is absent and the process must be the whole job (one process,
 * -t x -g ranks, id from ncclGetUniqueId). The helper collectives are small ncclAllReduce calls
 * on a scratch buffer of the ranks' kind: device memory on device buffers (NVIDIA's library
 * takes no plain host memory), the host otherwise.
 * ------------------------------------------------------------------------------------------- */
#include "driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

#pragma weak weftLaunchInfo

static ncclUniqueId nccl_job_id; /* this process's id, made or received by init */

/* Per rank (ctx->be_state): the helper collectives' buffer. A grown one keeps the old until
 * comm_fini: cudaFree waits for the whole device, where another thread's ranks may have a
 * collective in flight that waits for this thread. */
#define NCCL_SCRATCH_RETIRED 8
struct nccl_rank_state {
    void *scratch;
    size_t cap;
    void *retired[NCCL_SCRATCH_RETIRED];
    int nretired;
};

/* Sized at comm_init for every helper the driver calls (its all-gather of rank lines). */
#define NCCL_SCRATCH_PER_RANK 256

/* Job sizes other launchers announce: a job of several processes cannot run without Weft's
 * launch helper (nothing here could hand them one unique id). */
static int nccl_env_job_size(void)
{
    static const char *const vars[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                       "SLURM_NTASKS", "WORLD_SIZE"};

    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL && atoi(v) > 1)
            return atoi(v);
    }
    return 1;
}

static char nccl_be_error[256];

static ncclResult_t nccl_be_init(struct perf_ctx *ctx, char *version_line, size_t len)
{
    int libver = 0;
    ncclResult_t res;

    ctx->local_rank = 0;
    if (weftLaunchInfo != NULL) {
        res = weftLaunchInfo(&ctx->rank, &ctx->nranks, &ctx->local_rank, &nccl_job_id);
        if (res != ncclSuccess)
            return res;
    } else {
        if (nccl_env_job_size() > 1) {
            snprintf(nccl_be_error, sizeof(nccl_be_error),
                     "this libnccl.so.2 is not Weft's (no weftLaunchInfo): run one process and "
                     "-t/-g ranks in it, a %d-process job needs Weft", nccl_env_job_size());
            return ncclInvalidUsage;
        }
        ctx->rank = 0;
        ctx->nranks = 1;
        res = ncclGetUniqueId(&nccl_job_id);
        if (res != ncclSuccess)
            return res;
    }
    res = ncclGetVersion(&libver);
    if (res != ncclSuccess)
        return res;
    snprintf(version_line, len,
             "# weft perf (nccl-tests 2.19.6 compatible) nccl-headers=%d nccl-library=%d",
             NCCL_VERSION_CODE, libver);
    ctx->comm = NULL;
    ctx->stream = NULL;
    ctx->library = weftLaunchInfo != NULL ? "weft" : "nccl";
    return ncclSuccess;
}

static int nccl_be_early_rank(void)
{
    int rank = 0;

    if (weftLaunchInfo == NULL)
        return 0;
    return weftLaunchInfo(&rank, NULL, NULL, NULL) == ncclSuccess ? rank : 0;
}

static ncclResult_t nccl_be_fini(struct perf_ctx *ctx)
{
    (void)ctx;
    return ncclSuccess;
}

static ncclResult_t nccl_be_cuda_error(const char *what, int err)
{
    snprintf(nccl_be_error, sizeof(nccl_be_error), "%s: %s", what,
             perf_devmem_get(NULL)->error_string(err));
    return ncclUnhandledCudaError;
}

static ncclResult_t nccl_scratch(struct perf_ctx *ctx, size_t bytes, void **p_p);

/* One group of ncclCommInitRank, each on its rank's device (current at the call, as NCCL binds
 * it), as nccl-tests' ncclGroupStart + ncclCommInitRank per GPU. */
static ncclResult_t nccl_be_comm_init(struct perf_team *team)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);
    ncclResult_t res = ncclSuccess, end = ncclSuccess;

    for (int i = 0; i < team->n; i++) {
        void *p;
        team->ctx[i].be_state = calloc(1, sizeof(struct nccl_rank_state));
        if (team->ctx[i].be_state == NULL)
            return ncclSystemError;
        res = nccl_scratch(&team->ctx[i],
                           (size_t)team->ctx[i].nranks * NCCL_SCRATCH_PER_RANK + 64, &p);
        if (res != ncclSuccess)
            return res;
    }
    if (team->n > 1)
        res = ncclGroupStart();
    for (int i = 0; i < team->n && res == ncclSuccess; i++) {
        struct perf_ctx *ctx = &team->ctx[i];
        int err = ctx->dev_bufs ? dm->set_device(ctx->device) : 0;
        if (err != 0)
            res = nccl_be_cuda_error("cudaSetDevice", err);
        else
            res = ncclCommInitRank(&ctx->comm, ctx->nranks, nccl_job_id, ctx->rank);
    }
    if (team->n > 1)
        end = ncclGroupEnd(); /* always closed, so that a failure leaves no group open */
    return res != ncclSuccess ? res : end;
}

static ncclResult_t nccl_be_comm_device(const struct perf_ctx *ctx, int *dev_p)
{
    return ncclCommCuDevice(ctx->comm, dev_p);
}

static void nccl_scratch_free(const struct perf_ctx *ctx, void *p)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);

    if (p == NULL)
        return;
    if (!ctx->dev_bufs) {
        free(p);
        return;
    }
    dm->set_device(ctx->device);
    dm->free(p);
}

static ncclResult_t nccl_be_comm_fini(struct perf_team *team)
{
    ncclResult_t res = ncclSuccess;

    for (int i = 0; i < team->n; i++) {
        struct perf_ctx *ctx = &team->ctx[i];
        struct nccl_rank_state *rs = ctx->be_state;
        ncclResult_t r = ncclCommDestroy(ctx->comm);

        if (res == ncclSuccess)
            res = r;
        if (rs != NULL) {
            nccl_scratch_free(ctx, rs->scratch);
            for (int k = 0; k < rs->nretired; k++)
                nccl_scratch_free(ctx, rs->retired[k]);
        }
        free(rs);
        ctx->be_state = NULL;
    }
    return res;
}

/* Rank i's scratch of at least bytes, of the rank's memory kind. */
static ncclResult_t nccl_scratch(struct perf_ctx *ctx, size_t bytes, void **p_p)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);
    struct nccl_rank_state *rs = ctx->be_state;
    void *p = NULL;
    int err;

    if (rs->cap >= bytes) {
        *p_p = rs->scratch;
        return ncclSuccess;
    }
    if (rs->scratch != NULL && rs->nretired == NCCL_SCRATCH_RETIRED) {
        snprintf(nccl_be_error, sizeof(nccl_be_error), "helper scratch grown too often");
        return ncclInternalError;
    }
    if (!ctx->dev_bufs) {
        p = malloc(bytes);
        if (p == NULL)
            return ncclSystemError;
    } else {
        err = dm->set_device(ctx->device);
        if (err == 0)
            err = dm->malloc(&p, bytes);
        if (err != 0)
            return nccl_be_cuda_error("cudaMalloc", err);
    }
    if (rs->scratch != NULL)
        rs->retired[rs->nretired++] = rs->scratch;
    rs->scratch = p;
    rs->cap = bytes;
    *p_p = p;
    return ncclSuccess;
}

/*
 * In place over all ranks: buf holds team->n blocks of `bytes` (the team's ranks in order), each
 * replaced by the all-reduce of count elements. One group over the team, then each stream waited
 * for, so it is blocking on device buffers as on host ones.
 */
static ncclResult_t nccl_team_allreduce(const struct perf_team *team, void *buf, size_t count,
                                        ncclDataType_t type, ncclRedOp_t op)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);
    size_t bytes = count * perf_type_get(type)->size;
    ncclResult_t res = ncclSuccess, end = ncclSuccess;
    void **at = calloc((size_t)team->n, sizeof(*at));
    int err = 0;

    if (at == NULL)
        return ncclSystemError;
    for (int i = 0; i < team->n && res == ncclSuccess; i++) {
        struct perf_ctx *ctx = &team->ctx[i];
        res = nccl_scratch(ctx, bytes ? bytes : 1, &at[i]);
        if (res == ncclSuccess && ctx->dev_bufs)
            err = dm->memcpy(at[i], (char *)buf + (size_t)i * bytes, bytes);
        else if (res == ncclSuccess)
            memcpy(at[i], (char *)buf + (size_t)i * bytes, bytes);
        if (err != 0)
            res = nccl_be_cuda_error("cudaMemcpy", err);
    }
    if (res != ncclSuccess)
        goto out;
    if (team->n > 1)
        res = ncclGroupStart();
    for (int i = 0; i < team->n && res == ncclSuccess; i++)
        res = ncclAllReduce(at[i], at[i], count, type, op, team->ctx[i].comm, team->ctx[i].stream);
    if (team->n > 1)
        end = ncclGroupEnd();
    if (res == ncclSuccess)
        res = end;
    for (int i = 0; i < team->n && res == ncclSuccess; i++) {
        const struct perf_ctx *ctx = &team->ctx[i];
        if (!ctx->dev_bufs) {
            memcpy((char *)buf + (size_t)i * bytes, at[i], bytes);
            continue;
        }
        err = dm->stream_synchronize(ctx->stream);
        if (err == 0)
            err = dm->memcpy((char *)buf + (size_t)i * bytes, at[i], bytes);
        if (err != 0)
            res = nccl_be_cuda_error("cudaStreamSynchronize/cudaMemcpy", err);
    }
out:
    free(at);
    return res;
}

static ncclResult_t nccl_be_barrier(const struct perf_team *team)
{
    int32_t v[team->n];

    /* Every rank's contribution is needed before anyone's result: a barrier. */
    for (int i = 0; i < team->n; i++)
        v[i] = 1;
    return nccl_team_allreduce(team, v, 1, ncclInt32, ncclSum);
}

/* A team's value counts once in a sum (its first rank gives it, the others the identity); min
 * and max are the same whichever ranks repeat it. */
static ncclResult_t nccl_be_reduce_double(const struct perf_team *team, double *v, int op)
{
    double in[team->n];
    ncclResult_t res;

    for (int i = 0; i < team->n; i++)
        in[i] = op == PERF_OP_SUM && i > 0 ? 0.0 : *v;
    res = nccl_team_allreduce(team, in, 1, ncclFloat64, (ncclRedOp_t)op);
    if (res == ncclSuccess)
        *v = in[0];
    return res;
}

static ncclResult_t nccl_be_sum_int64(const struct perf_team *team, int64_t *v)
{
    int64_t in[team->n];
    ncclResult_t res;

    for (int i = 0; i < team->n; i++)
        in[i] = i == 0 ? *v : 0;
    res = nccl_team_allreduce(team, in, 1, ncclInt64, ncclSum);
    if (res == ncclSuccess)
        *v = in[0];
    return res;
}

/* Through all-reduce, so that it needs nothing but ncclAllReduce: every rank fills its own
 * slot and zeros the others; a byte sum puts each slot together. */
static ncclResult_t nccl_be_allgather(const struct perf_team *team, const void *in, void *out,
                                      size_t bytes)
{
    size_t total = bytes * (size_t)team->ctx[0].nranks;
    char *tmp = calloc((size_t)team->n, total ? total : 1);
    ncclResult_t res;

    if (tmp == NULL)
        return ncclSystemError;
    for (int i = 0; i < team->n; i++)
        memcpy(tmp + (size_t)i * total + bytes * (size_t)team->ctx[i].rank,
               (const char *)in + (size_t)i * bytes, bytes);
    res = nccl_team_allreduce(team, tmp, total, ncclUint8, ncclSum);
    if (res == ncclSuccess)
        memcpy(out, tmp, total);
    free(tmp);
    return res;
}

static ncclResult_t nccl_be_group_start(void)
{
    return ncclGroupStart();
}

static ncclResult_t nccl_be_group_end(void)
{
    return ncclGroupEnd();
}

static ncclResult_t nccl_be_op_create(const struct perf_ctx *ctx, struct perf_op *op)
{
    uint64_t scalar = 0;

    if (op->op != PERF_OP_MULSUM) {
        op->nccl_op = op->op >= 0 ? (ncclRedOp_t)op->op : ncclSum;
        return ncclSuccess;
    }
    /* nccl-tests' PreMulSum scalars: 1 on even ranks, 2 on odd ranks, read at creation. */
    perf_store_double(op->type, &scalar, 0, (double)perf_mulsum_scalar(ctx->rank));
    return ncclRedOpCreatePreMulSum(&op->nccl_op, &scalar, op->type->type,
                                    ncclScalarHostImmediate, ctx->comm);
}

static ncclResult_t nccl_be_op_destroy(const struct perf_ctx *ctx, struct perf_op *op)
{
    if (op->op != PERF_OP_MULSUM)
        return ncclSuccess;
    return ncclRedOpDestroy(op->nccl_op, ctx->comm);
}

static int nccl_be_supports(const struct perf_type *t, int op)
{
    (void)t;
    (void)op;
    return 1;
}

static const char *nccl_be_last_error(void)
{
    const char *last = ncclGetLastError(NULL);

    return nccl_be_error[0] != '\0' && (last == NULL || last[0] == '\0') ? nccl_be_error : last;
}

static ncclResult_t nccl_be_abort(const struct perf_ctx *ctx)
{
    return ctx->comm != NULL ? ncclCommAbort(ctx->comm) : ncclSuccess;
}

/* -R 1 (nccl-tests' --local_register): ncclMemAlloc'd (on the calling thread's current device
 * where there is one), registered on the rank's communicator. */
static ncclResult_t nccl_be_reg_alloc(const struct perf_ctx *ctx, size_t bytes, void **p_p,
                                      void **handle_p)
{
    ncclResult_t res = ncclMemAlloc(p_p, bytes);
    if (res != ncclSuccess)
        return res;
    res = ncclCommRegister(ctx->comm, *p_p, bytes, handle_p);
    if (res != ncclSuccess)
        ncclMemFree(*p_p);
    return res;
}

static ncclResult_t nccl_be_reg_free(const struct perf_ctx *ctx, void *p, void *handle)
{
    ncclResult_t res = ncclCommDeregister(ctx->comm, handle);
    ncclResult_t res2 = ncclMemFree(p);
    return res != ncclSuccess ? res : res2;
}

const struct perf_backend perf_nccl_backend = {
    .name = "NCCL",
    .caps = PERF_BE_DEVICE,
    .init = nccl_be_init,
    .early_rank = nccl_be_early_rank,
    .fini = nccl_be_fini,
    .comm_init = nccl_be_comm_init,
    .comm_fini = nccl_be_comm_fini,
    .reg_alloc = nccl_be_reg_alloc,
    .reg_free = nccl_be_reg_free,
    .comm_device = nccl_be_comm_device,
    .barrier = nccl_be_barrier,
    .reduce_double = nccl_be_reduce_double,
    .sum_int64 = nccl_be_sum_int64,
    .allgather = nccl_be_allgather,
    .group_start = nccl_be_group_start,
    .group_end = nccl_be_group_end,
    .op_create = nccl_be_op_create,
    .op_destroy = nccl_be_op_destroy,
    .supports = nccl_be_supports,
    .error_string = ncclGetErrorString,
    .last_error = nccl_be_last_error,
    .abort = nccl_be_abort,
};

int perf_main(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run)
{
    return perf_run(argc, argv, coll, run, &perf_nccl_backend);
}
