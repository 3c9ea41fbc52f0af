/* Reduction operators as seen by the API: built-ins, avg, and per-communicator PreMulSum. */
#include <string.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/redop_build.h"
#include "exec/cuda.h"

/* Handle = ncclNumOps + slot + WEFT_MAX_USER_OPS * tag, tag derived from the communicator. */
#define WEFT_USER_OP_TAGS ((0x7fffffff - ncclNumOps) / WEFT_MAX_USER_OPS)

static uint32_t weft_user_op_tag(const struct ncclComm *comm)
{
    uint64_t h = comm->comm_hash ^ ((uint64_t)(uintptr_t)comm * 0x9e3779b97f4a7c15ull);
    return (uint32_t)((h >> 17) % WEFT_USER_OP_TAGS);
}

static int weft_dtype_is_float(int dtype)
{
    return dtype == ncclFloat16 || dtype == ncclFloat32 || dtype == ncclFloat64 ||
           dtype == ncclBfloat16 || dtype == ncclFloat8e4m3 || dtype == ncclFloat8e5m2;
}

/* Slot of a user op handle on this comm, or -1. */
static int weft_user_op_slot(const struct ncclComm *comm, ncclRedOp_t op)
{
    if ((int)op < ncclNumOps || (unsigned)op > (unsigned)ncclMaxRedOp)
        return -1;
    uint32_t v = (uint32_t)op - ncclNumOps;
    if (v / WEFT_MAX_USER_OPS != weft_user_op_tag(comm))
        return -1;
    int slot = (int)(v % WEFT_MAX_USER_OPS);
    return comm->user_ops[slot].in_use ? slot : -1;
}

ncclResult_t weft_redop_build(const struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t dtype,
                              const char *api, struct weft_redop *out)
{
    if ((int)dtype < 0 || (int)dtype >= ncclNumTypes) {
        WEFT_WARN("%s: invalid datatype %d", api, (int)dtype);
        return ncclInvalidArgument;
    }
    memset(out, 0, sizeof(*out));
    out->dtype = dtype;
    switch ((int)op) {
    case ncclSum:
        out->kind = WEFT_RED_SUM;
        return ncclSuccess;
    case ncclProd:
        out->kind = WEFT_RED_PROD;
        return ncclSuccess;
    case ncclMax:
        out->kind = WEFT_RED_MAX;
        return ncclSuccess;
    case ncclMin:
        out->kind = WEFT_RED_MIN;
        return ncclSuccess;
    case ncclAvg:
        out->kind = WEFT_RED_SUM;
        if (weft_dtype_is_float(dtype)) {
            out->premul = 1;
            weft_dtype_from_double(dtype, 1.0 / comm->nranks, out->scalar.bytes);
        } else {
            out->postdiv = 1;
            out->divisor = (uint64_t)comm->nranks;
        }
        return ncclSuccess;
    default:
        break;
    }
    int slot = weft_user_op_slot(comm, op);
    if (slot < 0) {
        WEFT_WARN("%s: invalid reduction operation %d (not a built-in op, or a user op that was "
                  "destroyed or belongs to another communicator)",
                  api, (int)op);
        return ncclInvalidArgument;
    }
    const struct weft_user_op *uop = &comm->user_ops[slot];
    if (uop->dtype != (int)dtype) {
        WEFT_WARN("%s: reduction operation %d was created for datatype %d, used with %d", api,
                  (int)op, uop->dtype, (int)dtype);
        return ncclInvalidArgument;
    }
    out->kind = WEFT_RED_SUM;
    out->premul = 1;
    size_t es = weft_dtype_size(dtype);
    /* A device-resident scalar in host memory is read when the operation is issued; one in CUDA
     * memory is read where the operation runs (exec/cuda.c). */
    if (uop->residence == ncclScalarDevice && weft_cuda_is_device_ptr(uop->scalar_ptr)) {
        out->scalar_dev = uop->scalar_ptr;
        return ncclSuccess;
    }
    memcpy(out->scalar.bytes,
           uop->residence == ncclScalarDevice ? (const uint8_t *)uop->scalar_ptr : uop->scalar,
           es);
    return ncclSuccess;
}

ncclResult_t weft_redop_create_premulsum(struct ncclComm *comm, ncclRedOp_t *op_p, void *scalar,
                                         ncclDataType_t dtype, ncclScalarResidence_t residence)
{
    if (op_p == NULL || scalar == NULL) {
        WEFT_WARN("ncclRedOpCreatePreMulSum: %s is NULL", op_p == NULL ? "op" : "scalar");
        return ncclInvalidArgument;
    }
    if ((int)dtype < 0 || (int)dtype >= ncclNumTypes) {
        WEFT_WARN("ncclRedOpCreatePreMulSum: invalid datatype %d", (int)dtype);
        return ncclInvalidArgument;
    }
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
        WEFT_WARN("ncclRedOpCreatePreMulSum: invalid scalar residence %d", (int)residence);
        return ncclInvalidArgument;
    }
    for (int slot = 0; slot < WEFT_MAX_USER_OPS; slot++) {
        struct weft_user_op *uop = &comm->user_ops[slot];
        if (uop->in_use)
            continue;
        memset(uop, 0, sizeof(*uop));
        uop->in_use = 1;
        uop->dtype = dtype;
        uop->residence = residence;
        uop->scalar_ptr = scalar;
        if (residence == ncclScalarHostImmediate)
            memcpy(uop->scalar, scalar, weft_dtype_size(dtype));
        *op_p = (ncclRedOp_t)(ncclNumOps + slot + WEFT_MAX_USER_OPS * weft_user_op_tag(comm));
        return ncclSuccess;
    }
    WEFT_WARN("ncclRedOpCreatePreMulSum: all %d user operations of this communicator are in use",
              WEFT_MAX_USER_OPS);
    return ncclInvalidUsage;
}

ncclResult_t weft_redop_destroy(struct ncclComm *comm, ncclRedOp_t op)
{
    if ((int)op >= 0 && (int)op < ncclNumOps) {
        WEFT_WARN("ncclRedOpDestroy: %d is a built-in operation", (int)op);
        return ncclInvalidArgument;
    }
    int slot = weft_user_op_slot(comm, op);
    if (slot < 0) {
        WEFT_WARN("ncclRedOpDestroy: operation %d was not created on this communicator or was "
                  "already destroyed",
                  (int)op);
        return ncclInvalidArgument;
    }
    comm->user_ops[slot].in_use = 0;
    return ncclSuccess;
}
