/*
 * Compile test of include/nccl.h: the ABI facts of NCCL 2.28.9 (sizes, offsets, enum values,
 * macros) checked at compile time. Built as C99, C11 and (through header_compile.cc) C++, with
 * warnings as errors, and with cuda_runtime.h included before (HC_CUDA_FIRST) or after
 * (HC_CUDA_AFTER) nccl.h. Building it is the test; running it checks the initializers.
 */
#if defined(HC_CUDA_FIRST)
#include <cuda_runtime.h>
#endif
#include "nccl.h"
#if defined(HC_DEVICE_API)
#include "api/device_api.h"
#endif
#if defined(HC_CUDA_AFTER)
#include <cuda_runtime.h>
#endif

#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#ifndef WEFT_NCCL_HEADER
#error "header_compile must include Weft's nccl.h"
#endif

#if defined(__cplusplus) && __cplusplus >= 201103L
#define HC_ASSERT(cond, msg) static_assert(cond, msg)
#elif !defined(__cplusplus) && defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define HC_ASSERT(cond, msg) _Static_assert(cond, msg)
#else
#define HC_CAT2(a, b) a##b
#define HC_CAT(a, b) HC_CAT2(a, b)
#define HC_ASSERT(cond, msg) typedef char HC_CAT(hc_assert_line_, __LINE__)[(cond) ? 1 : -1]
#endif

/* Version */
HC_ASSERT(NCCL_MAJOR == 2 && NCCL_MINOR == 28 && NCCL_PATCH == 9, "version macros");
HC_ASSERT(NCCL_VERSION_CODE == 22809, "NCCL_VERSION_CODE");
HC_ASSERT(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH) == NCCL_VERSION_CODE, "NCCL_VERSION");
HC_ASSERT(NCCL_VERSION(2, 8, 4) == 2804, "old version scheme");
HC_ASSERT(NCCL_VERSION(2, 9, 0) == 20900, "new version scheme");
HC_ASSERT(sizeof(NCCL_SUFFIX) == 1, "empty NCCL_SUFFIX");

/* Handles and the unique id */
HC_ASSERT(NCCL_UNIQUE_ID_BYTES == 128, "NCCL_UNIQUE_ID_BYTES");
HC_ASSERT(sizeof(ncclUniqueId) == 128, "sizeof(ncclUniqueId)");
HC_ASSERT(sizeof(ncclComm_t) == sizeof(void *), "ncclComm_t is a pointer");
HC_ASSERT(sizeof(ncclWindow_t) == sizeof(void *), "ncclWindow_t is a pointer");
HC_ASSERT(sizeof(cudaStream_t) == sizeof(void *), "cudaStream_t is a pointer");

/* Enums are 4 bytes */
HC_ASSERT(sizeof(ncclResult_t) == 4, "sizeof(ncclResult_t)");
HC_ASSERT(sizeof(ncclRedOp_t) == 4, "sizeof(ncclRedOp_t)");
HC_ASSERT(sizeof(ncclDataType_t) == 4, "sizeof(ncclDataType_t)");
HC_ASSERT(sizeof(ncclScalarResidence_t) == 4, "sizeof(ncclScalarResidence_t)");

/* ncclResult_t */
HC_ASSERT(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 &&
              ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5 &&
              ncclRemoteError == 6 && ncclInProgress == 7 && ncclNumResults == 8,
          "ncclResult_t values");

/* ncclRedOp_t */
HC_ASSERT(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 &&
              ncclNumOps == 5,
          "ncclRedOp_t values");
HC_ASSERT(ncclNumOps_dummy == 5, "ncclNumOps_dummy");
HC_ASSERT((unsigned long)ncclMaxRedOp == 0x7fffffffUL, "ncclMaxRedOp");

/* ncclDataType_t */
HC_ASSERT(ncclInt8 == 0 && ncclChar == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt == 2 &&
              ncclUint32 == 3 && ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 &&
              ncclHalf == 6 && ncclFloat32 == 7 && ncclFloat == 7 && ncclFloat64 == 8 &&
              ncclDouble == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 &&
              ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
          "ncclDataType_t values");

/* ncclScalarResidence_t */
HC_ASSERT(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1, "ncclScalarResidence_t values");

/* ncclConfig_t (LP64 layout) */
HC_ASSERT(sizeof(ncclConfig_t) == 80, "sizeof(ncclConfig_t)");
HC_ASSERT(sizeof(struct ncclConfig_v22800) == 80, "struct tag ncclConfig_v22800");
HC_ASSERT(offsetof(ncclConfig_t, size) == 0, "offsetof size");
HC_ASSERT(offsetof(ncclConfig_t, magic) == 8, "offsetof magic");
HC_ASSERT(offsetof(ncclConfig_t, version) == 12, "offsetof version");
HC_ASSERT(offsetof(ncclConfig_t, blocking) == 16, "offsetof blocking");
HC_ASSERT(offsetof(ncclConfig_t, cgaClusterSize) == 20, "offsetof cgaClusterSize");
HC_ASSERT(offsetof(ncclConfig_t, minCTAs) == 24, "offsetof minCTAs");
HC_ASSERT(offsetof(ncclConfig_t, maxCTAs) == 28, "offsetof maxCTAs");
HC_ASSERT(offsetof(ncclConfig_t, netName) == 32, "offsetof netName");
HC_ASSERT(offsetof(ncclConfig_t, splitShare) == 40, "offsetof splitShare");
HC_ASSERT(offsetof(ncclConfig_t, trafficClass) == 44, "offsetof trafficClass");
HC_ASSERT(offsetof(ncclConfig_t, commName) == 48, "offsetof commName");
HC_ASSERT(offsetof(ncclConfig_t, collnetEnable) == 56, "offsetof collnetEnable");
HC_ASSERT(offsetof(ncclConfig_t, CTAPolicy) == 60, "offsetof CTAPolicy");
HC_ASSERT(offsetof(ncclConfig_t, shrinkShare) == 64, "offsetof shrinkShare");
HC_ASSERT(offsetof(ncclConfig_t, nvlsCTAs) == 68, "offsetof nvlsCTAs");
HC_ASSERT(offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72, "offsetof nChannelsPerNetPeer");
HC_ASSERT(offsetof(ncclConfig_t, nvlinkCentricSched) == 76, "offsetof nvlinkCentricSched");
HC_ASSERT(NCCL_CONFIG_UNDEF_INT == INT_MIN, "NCCL_CONFIG_UNDEF_INT");

/* ncclSimInfo_t */
HC_ASSERT(sizeof(ncclSimInfo_t) == 24, "sizeof(ncclSimInfo_t)");
HC_ASSERT(sizeof(struct ncclSimInfo_v22200) == 24, "struct tag ncclSimInfo_v22200");
HC_ASSERT(offsetof(ncclSimInfo_t, magic) == 8 && offsetof(ncclSimInfo_t, version) == 12 &&
              offsetof(ncclSimInfo_t, estimatedTime) == 16,
          "ncclSimInfo_t offsets");

/* Other macros */
HC_ASSERT(NCCL_SPLIT_NOCOLOR == -1, "NCCL_SPLIT_NOCOLOR");
HC_ASSERT(NCCL_WIN_DEFAULT == 0 && NCCL_WIN_COLL_SYMMETRIC == 1, "window flags");
HC_ASSERT(NCCL_WIN_REQUIRED_ALIGNMENT == 4096, "NCCL_WIN_REQUIRED_ALIGNMENT");
HC_ASSERT(NCCL_CTA_POLICY_DEFAULT == 0 && NCCL_CTA_POLICY_EFFICIENCY == 1 &&
              NCCL_CTA_POLICY_ZERO == 2,
          "CTA policies");
HC_ASSERT(NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1, "shrink flags");
HC_ASSERT(NCCL_REVOKE_DEFAULT == 0, "NCCL_REVOKE_DEFAULT");

#if defined(HC_DEVICE_API)
/* Device API types (Weft's private declaration of what nccl_device.h defines) */
HC_ASSERT(sizeof(ncclTeam_t) == 3 * sizeof(int), "ncclTeam_t");
HC_ASSERT(offsetof(struct ncclTeam, nRanks) == 0 && offsetof(struct ncclTeam, rank) == 4 &&
              offsetof(struct ncclTeam, stride) == 8,
          "struct ncclTeam offsets");
#else
/* NVIDIA's nccl.h leaves the device API's types to nccl_device.h, and so must Weft's: defining
 * them here would fail to compile if nccl.h had defined them already. */
struct ncclTeam {
    char defined_by_nccl_device_h_only;
};
struct ncclDevComm {
    char defined_by_nccl_device_h_only;
};
#endif

int main(void)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ncclComm_t comm = NCCL_COMM_NULL;
    int fail = 0;

    if (config.size != 80 || config.magic != 0xcafebeefu || config.version != 22809u ||
        config.blocking != INT_MIN || config.cgaClusterSize != INT_MIN ||
        config.minCTAs != INT_MIN || config.maxCTAs != INT_MIN || config.netName != NULL ||
        config.splitShare != INT_MIN || config.trafficClass != INT_MIN ||
        config.commName != NULL || config.collnetEnable != INT_MIN ||
        config.CTAPolicy != INT_MIN || config.shrinkShare != INT_MIN ||
        config.nvlsCTAs != INT_MIN || config.nChannelsPerNetPeer != INT_MIN ||
        config.nvlinkCentricSched != INT_MIN) {
        printf("FAIL: NCCL_CONFIG_INITIALIZER values\n");
        fail = 1;
    }
    if (sim.size != 24 || sim.magic != 0x74685283u || sim.version != 22809u ||
        sim.estimatedTime != NCCL_UNDEF_FLOAT || NCCL_UNDEF_FLOAT != -1.0f) {
        printf("FAIL: NCCL_SIM_INFO_INITIALIZER values\n");
        fail = 1;
    }
    if (comm != NULL) {
        printf("FAIL: NCCL_COMM_NULL\n");
        fail = 1;
    }
    if (!fail)
        printf("PASS: nccl.h compiles and its ABI facts hold\n");
    return fail;
}
