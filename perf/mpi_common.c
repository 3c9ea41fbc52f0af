/*
 * The MPI backend of the driver (see mpi_common.h): init/fini, the driver's barrier, reductions
 * and all-gather, and the type and op tables the peer tools share.
 */
#include "mpi_common.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char mpi_last_error[MPI_MAX_ERROR_STRING + 64];

/* Keeps MPI's text for the failure line; MPI errors return (MPI_ERRORS_RETURN) as SystemError. */
ncclResult_t perf_mpi_check(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;

    if (rc == MPI_SUCCESS)
        return ncclSuccess;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof(text), "MPI error %d", rc);
    snprintf(mpi_last_error, sizeof(mpi_last_error), "%s: %s", what, text);
    return ncclSystemError;
}

MPI_Datatype perf_mpi_type(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8:
        return MPI_INT8_T;
    case ncclUint8:
        return MPI_UINT8_T;
    case ncclInt32:
        return MPI_INT32_T;
    case ncclUint32:
        return MPI_UINT32_T;
    case ncclInt64:
        return MPI_INT64_T;
    case ncclUint64:
        return MPI_UINT64_T;
    case ncclFloat32:
        return MPI_FLOAT;
    case ncclFloat64:
        return MPI_DOUBLE;
    default:
        return MPI_DATATYPE_NULL;
    }
}

MPI_Op perf_mpi_op(int op)
{
    switch (op) {
    case PERF_OP_SUM:
        return MPI_SUM;
    case PERF_OP_PROD:
        return MPI_PROD;
    case PERF_OP_MAX:
        return MPI_MAX;
    case PERF_OP_MIN:
        return MPI_MIN;
    default:
        return MPI_OP_NULL;
    }
}

ncclResult_t perf_mpi_count(size_t count, int *n_p)
{
    if (count > INT_MAX) {
        snprintf(mpi_last_error, sizeof(mpi_last_error), "count %zu does not fit MPI's int",
                 count);
        return ncclInvalidArgument;
    }
    *n_p = (int)count;
    return ncclSuccess;
}

/* JSON "library" from MPI_Get_library_version's text. MVAPICH and Intel MPI derive from MPICH and
 * may say so, so they are looked for first. */
static const char *mpi_library_name(const char *version)
{
    if (strstr(version, "Open MPI") != NULL)
        return "openmpi";
    if (strstr(version, "MVAPICH") != NULL)
        return "mvapich";
    if (strstr(version, "Intel") != NULL)
        return "intelmpi";
    if (strstr(version, "MPICH") != NULL)
        return "mpich";
    return "mpi";
}

static ncclResult_t mpi_be_init(struct perf_ctx *ctx, char *version_line, size_t len)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int lib_len = 0;
    MPI_Comm node;

    if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
        snprintf(mpi_last_error, sizeof(mpi_last_error), "MPI_Init failed");
        return ncclSystemError;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (perf_mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank), "MPI_Comm_rank") ||
        perf_mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &ctx->nranks), "MPI_Comm_size"))
        return ncclSystemError;
    /* Local rank: rank among the processes that share this node. */
    if (perf_mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx->rank,
                                           MPI_INFO_NULL, &node),
                       "MPI_Comm_split_type"))
        return ncclSystemError;
    MPI_Comm_rank(node, &ctx->local_rank);
    MPI_Comm_free(&node);
    ctx->comm = NULL;
    ctx->stream = NULL;
    ctx->be_state = NULL;

    MPI_Get_library_version(lib, &lib_len);
    ctx->library = mpi_library_name(lib);
    lib[strcspn(lib, ",\n")] = '\0'; /* "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4" */
    snprintf(version_line, len, "# mpi perf (nccl-tests 2.19.6 compatible) mpi-library=%s%s%s",
             lib[0] ? "\"" : "", lib, lib[0] ? "\"" : "");
    return ncclSuccess;
}

static int mpi_be_early_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};

    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL)
            return atoi(v);
    }
    return 0;
}

static ncclResult_t mpi_be_fini(struct perf_ctx *ctx)
{
    (void)ctx;
    return perf_mpi_check(MPI_Finalize(), "MPI_Finalize");
}

/* One rank per process: the team is this process's rank, its communicator MPI_COMM_WORLD. */
static ncclResult_t mpi_be_comm_init(struct perf_team *team)
{
    (void)team;
    return ncclSuccess;
}

static ncclResult_t mpi_be_comm_fini(struct perf_team *team)
{
    (void)team;
    return ncclSuccess;
}

static ncclResult_t mpi_be_comm_device(const struct perf_ctx *ctx, int *dev_p)
{
    (void)ctx;
    *dev_p = -1;
    return ncclSuccess;
}

static ncclResult_t mpi_be_barrier(const struct perf_team *team)
{
    (void)team;
    return perf_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

static ncclResult_t mpi_be_reduce_double(const struct perf_team *team, double *v, int op)
{
    (void)team;
    return perf_mpi_check(
        MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, perf_mpi_op(op), MPI_COMM_WORLD),
        "MPI_Allreduce");
}

static ncclResult_t mpi_be_sum_int64(const struct perf_team *team, int64_t *v)
{
    (void)team;
    return perf_mpi_check(MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD),
                          "MPI_Allreduce");
}

static ncclResult_t mpi_be_allgather(const struct perf_team *team, const void *in, void *out,
                                     size_t bytes)
{
    int n;

    (void)team;
    if (perf_mpi_count(bytes, &n) != ncclSuccess)
        return ncclInvalidArgument;
    return perf_mpi_check(MPI_Allgather(in, n, MPI_BYTE, out, n, MPI_BYTE, MPI_COMM_WORLD),
                          "MPI_Allgather");
}

/* MPI has no groups: -m ops simply run back to back. */
static ncclResult_t mpi_be_group(void)
{
    return ncclSuccess;
}

static ncclResult_t mpi_be_op_create(const struct perf_ctx *ctx, struct perf_op *op)
{
    (void)ctx;
    op->nccl_op = op->op >= 0 ? (ncclRedOp_t)op->op : ncclSum; /* mapped to MPI_Op at each call */
    return ncclSuccess;
}

static ncclResult_t mpi_be_op_destroy(const struct perf_ctx *ctx, struct perf_op *op)
{
    (void)ctx;
    (void)op;
    return ncclSuccess;
}

static int mpi_be_supports(const struct perf_type *t, int op)
{
    if (t != NULL && perf_mpi_type(t->type) == MPI_DATATYPE_NULL)
        return 0;
    return op == PERF_OP_NONE || perf_mpi_op(op) != MPI_OP_NULL;
}

static const char *mpi_be_error_string(ncclResult_t res)
{
    switch (res) {
    case ncclSuccess:
        return "no error";
    case ncclInvalidArgument:
        return "invalid argument";
    default:
        return "MPI error";
    }
}

static const char *mpi_be_last_error(void)
{
    return mpi_last_error;
}

static ncclResult_t mpi_be_abort(const struct perf_ctx *ctx)
{
    (void)ctx;
    MPI_Abort(MPI_COMM_WORLD, 1);
    return ncclSuccess;
}

const struct perf_backend perf_mpi_backend = {
    .name = "MPI",
    .caps = 0,
    .init = mpi_be_init,
    .early_rank = mpi_be_early_rank,
    .fini = mpi_be_fini,
    .comm_init = mpi_be_comm_init,
    .comm_fini = mpi_be_comm_fini,
    .comm_device = mpi_be_comm_device,
    .barrier = mpi_be_barrier,
    .reduce_double = mpi_be_reduce_double,
    .sum_int64 = mpi_be_sum_int64,
    .allgather = mpi_be_allgather,
    .group_start = mpi_be_group,
    .group_end = mpi_be_group,
    .op_create = mpi_be_op_create,
    .op_destroy = mpi_be_op_destroy,
    .supports = mpi_be_supports,
    .error_string = mpi_be_error_string,
    .last_error = mpi_be_last_error,
    .abort = mpi_be_abort,
};

int perf_mpi_main(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run)
{
    return perf_run(argc, argv, coll, run, &perf_mpi_backend);
}
