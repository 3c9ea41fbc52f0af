/*
 * C++ compile test of include/nccl.h: the C checks of header_compile.c, plus the exact signature
 * of every API and its pnccl twin (written here from the ABI reference, independently of the
 * header). static_cast between function pointer types of different signatures does not compile,
 * and inside sizeof it is not evaluated, so nothing needs to be linked.
 */
#include "header_compile.c"

#define HC_SIG(name, ret, params)                                                                  \
    HC_ASSERT(sizeof(static_cast<ret(*) params>(&name)) > 0, #name);                               \
    HC_ASSERT(sizeof(static_cast<ret(*) params>(&p##name)) > 0, "p" #name)

/* Version, errors, queries */
HC_SIG(ncclGetVersion, ncclResult_t, (int *));
HC_SIG(ncclGetErrorString, const char *, (ncclResult_t));
HC_SIG(ncclGetLastError, const char *, (ncclComm_t));
HC_SIG(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t, ncclResult_t *));
HC_SIG(ncclCommCount, ncclResult_t, (const ncclComm_t, int *));
HC_SIG(ncclCommCuDevice, ncclResult_t, (const ncclComm_t, int *));
HC_SIG(ncclCommUserRank, ncclResult_t, (const ncclComm_t, int *));

/* Lifecycle */
HC_SIG(ncclGetUniqueId, ncclResult_t, (ncclUniqueId *));
HC_SIG(ncclCommInitRank, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int));
HC_SIG(ncclCommInitRankConfig, ncclResult_t,
       (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *));
HC_SIG(ncclCommInitRankScalable, ncclResult_t,
       (ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *));
HC_SIG(ncclCommInitAll, ncclResult_t, (ncclComm_t *, int, const int *));
HC_SIG(ncclCommFinalize, ncclResult_t, (ncclComm_t));
HC_SIG(ncclCommDestroy, ncclResult_t, (ncclComm_t));
HC_SIG(ncclCommAbort, ncclResult_t, (ncclComm_t));
HC_SIG(ncclCommRevoke, ncclResult_t, (ncclComm_t, int));
HC_SIG(ncclCommSplit, ncclResult_t, (ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *));
HC_SIG(ncclCommShrink, ncclResult_t, (ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int));

/* Collectives */
HC_SIG(ncclAllReduce, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
HC_SIG(ncclBroadcast, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
HC_SIG(ncclBcast, ncclResult_t, (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
HC_SIG(ncclReduce, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
        cudaStream_t));
HC_SIG(ncclAllGather, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
HC_SIG(ncclReduceScatter, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
HC_SIG(ncclAlltoAll, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
HC_SIG(ncclGather, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
HC_SIG(ncclScatter, ncclResult_t,
       (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));

/* Point-to-point and groups */
HC_SIG(ncclSend, ncclResult_t,
       (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
HC_SIG(ncclRecv, ncclResult_t, (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
HC_SIG(ncclGroupStart, ncclResult_t, ());
HC_SIG(ncclGroupEnd, ncclResult_t, ());
HC_SIG(ncclGroupSimulateEnd, ncclResult_t, (ncclSimInfo_t *));

/* Reduction operators, memory, registration */
HC_SIG(ncclRedOpCreatePreMulSum, ncclResult_t,
       (ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t, ncclComm_t));
HC_SIG(ncclRedOpDestroy, ncclResult_t, (ncclRedOp_t, ncclComm_t));
HC_SIG(ncclMemAlloc, ncclResult_t, (void **, size_t));
HC_SIG(ncclMemFree, ncclResult_t, (void *));
HC_SIG(ncclCommRegister, ncclResult_t, (const ncclComm_t, void *, size_t, void **));
HC_SIG(ncclCommDeregister, ncclResult_t, (const ncclComm_t, void *));
HC_SIG(ncclCommWindowRegister, ncclResult_t, (ncclComm_t, void *, size_t, ncclWindow_t *, int));
HC_SIG(ncclCommWindowDeregister, ncclResult_t, (ncclComm_t, ncclWindow_t));

#if defined(HC_DEVICE_API)
/* Device API, host side (src/api/device_api.h) */
HC_SIG(ncclDevCommCreate, ncclResult_t,
       (ncclComm_t, ncclDevCommRequirements_t const *, ncclDevComm_t *));
HC_SIG(ncclDevCommDestroy, ncclResult_t, (ncclComm_t, ncclDevComm_t const *));
HC_SIG(ncclTeamWorld, ncclTeam_t, (ncclComm_t));
HC_SIG(ncclTeamLsa, ncclTeam_t, (ncclComm_t));
HC_SIG(ncclTeamRail, ncclTeam_t, (ncclComm_t));
HC_SIG(ncclTeamRankToWorld, int, (ncclComm_t, ncclTeam_t, int));
HC_SIG(ncclTeamRankToLsa, int, (ncclComm_t, ncclTeam_t, int));
HC_SIG(ncclLsaBarrierCreateRequirement, ncclResult_t,
       (ncclTeam_t, int, ncclLsaBarrierHandle_t *, ncclDevResourceRequirements_t *));
HC_SIG(ncclGinBarrierCreateRequirement, ncclResult_t,
       (ncclComm_t, ncclTeam_t, int, ncclGinBarrierHandle_t *, ncclDevResourceRequirements_t *));
HC_SIG(ncclLLA2ACalcSlots, int, (int, int));
HC_SIG(ncclLLA2ACreateRequirement, ncclResult_t,
       (int, int, ncclLLA2AHandle_t *, ncclDevResourceRequirements_t *));
#endif

/* Deprecated, declared with a warning attribute: check its type without using it. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
HC_SIG(ncclResetDebugInit, void, ());
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
