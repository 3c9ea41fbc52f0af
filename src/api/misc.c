/* Groups, reduction ops, memory and registration entry points. */
#include <stdlib.h>
#include <string.h>

#include "api/export.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/redop_build.h"

WEFT_API(ncclResult_t, ncclGroupStart, void)
{
    return weft_group_start();
}

WEFT_API(ncclResult_t, ncclGroupEnd, void)
{
    return weft_group_end();
}

WEFT_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo)
{
    (void)simInfo;
    WEFT_WARN("ncclGroupSimulateEnd is not supported by this version of Weft yet");
    return ncclInvalidUsage;
}

WEFT_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar,
         ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm)
{
    WEFT_CHECK(weft_comm_check(comm, "ncclRedOpCreatePreMulSum"));
    return weft_redop_create_premulsum(comm, op, scalar, datatype, residence);
}

WEFT_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm)
{
    WEFT_CHECK(weft_comm_check(comm, "ncclRedOpDestroy"));
    return weft_redop_destroy(comm, op);
}

/* Host memory: page-aligned so that registered buffers can later be shared with local peers. */
WEFT_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size)
{
    if (ptr == NULL) {
        WEFT_WARN("ncclMemAlloc: ptr is NULL");
        return ncclInvalidArgument;
    }
    if (size == 0) {
        *ptr = NULL;
        return ncclSuccess;
    }
    void *p = NULL;
    int err = posix_memalign(&p, 4096, size);
    if (err != 0) {
        WEFT_WARN("ncclMemAlloc: cannot allocate %zu bytes: %s", size, strerror(err));
        return ncclSystemError;
    }
    *ptr = p;
    return ncclSuccess;
}

WEFT_API(ncclResult_t, ncclMemFree, void *ptr)
{
    free(ptr);
    return ncclSuccess;
}

/* Registration is an optional optimisation in NCCL; on host memory it is a no-op for now. */
WEFT_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size,
         void **handle)
{
    (void)buff, (void)size;
    WEFT_CHECK(weft_comm_check(comm, "ncclCommRegister"));
    if (handle == NULL) {
        WEFT_WARN("ncclCommRegister: handle is NULL");
        return ncclInvalidArgument;
    }
    *handle = NULL;
    return ncclSuccess;
}

WEFT_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle)
{
    (void)handle;
    WEFT_CHECK(weft_comm_check(comm, "ncclCommDeregister"));
    return ncclSuccess;
}

WEFT_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size,
         ncclWindow_t *win, int winFlags)
{
    (void)buff, (void)size, (void)winFlags;
    WEFT_CHECK(weft_comm_check(comm, "ncclCommWindowRegister"));
    if (win == NULL) {
        WEFT_WARN("ncclCommWindowRegister: win is NULL");
        return ncclInvalidArgument;
    }
    *win = NULL;
    return ncclSuccess;
}

WEFT_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win)
{
    (void)win;
    WEFT_CHECK(weft_comm_check(comm, "ncclCommWindowDeregister"));
    return ncclSuccess;
}
