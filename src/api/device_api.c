/*
 * Host side of NCCL 2.28's device API (GPU-initiated communication from user kernels). Weft does
 * not implement it; these exist so that programs referencing the symbols load, and fail cleanly
 * when they call them: ncclInvalidUsage, a zeroed team or 0, and a message for ncclGetLastError.
 * Outputs are never written.
 */
#include <string.h>

#include "nccl.h"
#include "api/device_api.h"
#include "api/export.h"
#include "core/log.h"

#define WEFT_DEVICE_API_UNSUPPORTED(fn)                                                            \
    WEFT_WARN("%s: the NCCL device API is not supported by Weft", fn)

WEFT_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, ncclDevCommRequirements_t const *reqs,
         ncclDevComm_t *outDevComm)
{
    (void)comm;
    (void)reqs;
    (void)outDevComm;
    WEFT_DEVICE_API_UNSUPPORTED("ncclDevCommCreate");
    return ncclInvalidUsage;
}

WEFT_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, ncclDevComm_t const *devComm)
{
    (void)comm;
    (void)devComm;
    WEFT_DEVICE_API_UNSUPPORTED("ncclDevCommDestroy");
    return ncclInvalidUsage;
}

static ncclTeam_t weft_team_none(const char *fn)
{
    ncclTeam_t team;

    memset(&team, 0, sizeof(team));
    WEFT_DEVICE_API_UNSUPPORTED(fn);
    return team;
}

WEFT_API(ncclTeam_t, ncclTeamWorld, ncclComm_t comm)
{
    (void)comm;
    return weft_team_none("ncclTeamWorld");
}

WEFT_API(ncclTeam_t, ncclTeamLsa, ncclComm_t comm)
{
    (void)comm;
    return weft_team_none("ncclTeamLsa");
}

WEFT_API(ncclTeam_t, ncclTeamRail, ncclComm_t comm)
{
    (void)comm;
    return weft_team_none("ncclTeamRail");
}

WEFT_API(int, ncclTeamRankToWorld, ncclComm_t comm, ncclTeam_t team, int rank)
{
    (void)comm;
    (void)team;
    (void)rank;
    WEFT_DEVICE_API_UNSUPPORTED("ncclTeamRankToWorld");
    return 0;
}

WEFT_API(int, ncclTeamRankToLsa, ncclComm_t comm, ncclTeam_t team, int rank)
{
    (void)comm;
    (void)team;
    (void)rank;
    WEFT_DEVICE_API_UNSUPPORTED("ncclTeamRankToLsa");
    return 0;
}

WEFT_API(ncclResult_t, ncclLsaBarrierCreateRequirement, ncclTeam_t team, int nBarriers,
         ncclLsaBarrierHandle_t *outHandle, ncclDevResourceRequirements_t *outReq)
{
    (void)team;
    (void)nBarriers;
    (void)outHandle;
    (void)outReq;
    WEFT_DEVICE_API_UNSUPPORTED("ncclLsaBarrierCreateRequirement");
    return ncclInvalidUsage;
}

WEFT_API(ncclResult_t, ncclGinBarrierCreateRequirement, ncclComm_t comm, ncclTeam_t team,
         int nBarriers, ncclGinBarrierHandle_t *outHandle, ncclDevResourceRequirements_t *outReq)
{
    (void)comm;
    (void)team;
    (void)nBarriers;
    (void)outHandle;
    (void)outReq;
    WEFT_DEVICE_API_UNSUPPORTED("ncclGinBarrierCreateRequirement");
    return ncclInvalidUsage;
}

WEFT_API(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize)
{
    (void)maxElts;
    (void)maxEltSize;
    WEFT_DEVICE_API_UNSUPPORTED("ncclLLA2ACalcSlots");
    return 0;
}

WEFT_API(ncclResult_t, ncclLLA2ACreateRequirement, int nBlocks, int nSlots,
         ncclLLA2AHandle_t *outHandle, ncclDevResourceRequirements_t *outReq)
{
    (void)nBlocks;
    (void)nSlots;
    (void)outHandle;
    (void)outReq;
    WEFT_DEVICE_API_UNSUPPORTED("ncclLLA2ACreateRequirement");
    return ncclInvalidUsage;
}
