/* Groups, reduction ops, memory and registration entry points. */
#include <stdlib.h>
#include <string.h>

#include "api/export.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/mem.h"
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
    return weft_group_simulate_end(simInfo);
}

WEFT_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar,
         ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm)
{
    WEFT_CHECK(weft_comm_enter(comm, "ncclRedOpCreatePreMulSum"));
    ncclResult_t res = weft_redop_create_premulsum(comm, op, scalar, datatype, residence);
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm)
{
    WEFT_CHECK(weft_comm_enter(comm, "ncclRedOpDestroy"));
    ncclResult_t res = weft_redop_destroy(comm, op);
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size)
{
    return weft_mem_alloc(ptr, size);
}

WEFT_API(ncclResult_t, ncclMemFree, void *ptr)
{
    return weft_mem_free(ptr);
}

WEFT_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size,
         void **handle)
{
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommRegister"));
    ncclResult_t res = weft_mem_register(comm, buff, size, handle);
    weft_comm_leave(comm);
    return res;
}

WEFT_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle)
{
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommDeregister"));
    ncclResult_t res = weft_mem_deregister(comm, handle);
    weft_comm_leave(comm);
    return res;
}

/*
 * Windows exist for NCCL's symmetric-memory GPU kernels. On host memory there is no window to
 * create: like NCCL with registration disabled, the call succeeds with a NULL window, and every
 * collective works on the buffer unregistered.
 */
WEFT_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size,
         ncclWindow_t *win, int winFlags)
{
    (void)buff, (void)size, (void)winFlags;
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommWindowRegister"));
    weft_comm_leave(comm);
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
    WEFT_CHECK(weft_comm_enter(comm, "ncclCommWindowDeregister"));
    weft_comm_leave(comm);
    return ncclSuccess;
}
