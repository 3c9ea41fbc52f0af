/*
 * nccl.h -- Weft's public header, ABI-compatible with NVIDIA NCCL 2.28.9.
 *
 * Weft is a from-scratch implementation of the NCCL API. This header is written independently from
 * the published ABI facts (names, enum values, struct layouts, signatures); a program compiled
 * against it runs with NVIDIA's libnccl.so.2, and a program compiled against NVIDIA's header runs
 * with Weft's libnccl.so.2.
 *
 * CUDA headers. The only CUDA type in the API is cudaStream_t (NULL means the legacy default
 * stream). The header picks its definition this way:
 *   - cuda_runtime.h (or driver_types.h) was included before this header: it is used as is, and
 *     cuda_fp16.h / cuda_bf16.h / cuda_fp8.h (C++ only) are included as NVIDIA's header does;
 *   - WEFT_USE_CUDA_HEADERS is defined and the compiler finds <cuda_runtime.h>: the same, with
 *     cuda_runtime.h included here;
 *   - otherwise the header declares `typedef struct CUstream_st *cudaStream_t;`, the very type the
 *     CUDA headers declare, so a translation unit may still include cuda_runtime.h afterwards (C11
 *     and C++ accept the repeated typedef; strict C99 -pedantic warns about it).
 *
 * Device API. NCCL 2.28's GPU-side "device API" (ncclDevComm, ncclTeam, the barrier and LLA2A
 * requirements) is declared by nvcc-compiled nccl_device.h, not here, exactly as in NVIDIA's
 * nccl.h: a program includes <nccl.h> and then <nccl_device.h> from the CUDA toolkit's NCCL. Weft's
 * library exports the eleven host functions of that API; they fail with ncclInvalidUsage until
 * Weft's GPU path serves them.
 *
 * Profiling interface. Every function exists twice: pncclX is the implementation and ncclX is a
 * weak alias of it, so a tool may define its own ncclX and forward to pncclX.
 *
 * Threads. Unless stated otherwise a function may be called from any thread. Group state
 * (ncclGroupStart/ncclGroupEnd) is per thread. Buffers passed in are owned by the caller; the
 * library keeps no pointer to them after the operation completes.
 */
#ifndef NCCL_H_
#define NCCL_H_

/* Marks this header as Weft's (NVIDIA's header does not define it). */
#define WEFT_NCCL_HEADER 1

/* ---------------------------------------------------------------------------------------------
 * cudaStream_t
 * ------------------------------------------------------------------------------------------- */
#if defined(__CUDA_RUNTIME_H__) || defined(__DRIVER_TYPES_H__)
#define WEFT_NCCL_CUDA_HEADERS_ 1
#elif defined(WEFT_USE_CUDA_HEADERS) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#define WEFT_NCCL_CUDA_HEADERS_ 1
#endif
#endif

#if defined(WEFT_NCCL_CUDA_HEADERS_)
/* Match NVIDIA's header: users may rely on it for the half/bfloat16/fp8 C types. */
#if defined(__CUDA_RUNTIME_H__) && defined(__has_include)
#if __has_include(<cuda_fp16.h>)
#include <cuda_fp16.h>
#endif
#if defined(CUDART_VERSION) && CUDART_VERSION >= 11000 && __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#endif
#if defined(__cplusplus) && defined(CUDART_VERSION) && CUDART_VERSION >= 11080 &&                 \
    __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#endif
#endif
#else
/* Same declaration as CUDA's driver_types.h: an opaque pointer to the driver's stream object. */
typedef struct CUstream_st *cudaStream_t;
#endif

#include <limits.h> /* INT_MIN */
#include <stddef.h> /* size_t, NULL */

/* ---------------------------------------------------------------------------------------------
 * Version. NCCL_VERSION encodes releases up to 2.8.x as X*1000+Y*100+Z and later ones as
 * X*10000+Y*100+Z; ncclGetVersion() returns the library's NCCL_VERSION_CODE. Programs should
 * compare the run-time value as well as the compile-time one.
 * ------------------------------------------------------------------------------------------- */
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z)                                                                      \
    (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define WEFT_NCCL_DEPRECATED_(msg) __attribute__((deprecated(msg)))
#else
#define WEFT_NCCL_DEPRECATED_(msg)
#endif

/* ---------------------------------------------------------------------------------------------
 * Handles
 * ------------------------------------------------------------------------------------------- */

/* A communicator: one rank's membership in a group of nranks ranks. Opaque. */
typedef struct ncclComm *ncclComm_t;
/* A registered memory window (ncclCommWindowRegister). Opaque to host code. */
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* The rendezvous token made by ncclGetUniqueId and shared by the caller with every rank (MPI,
 * a key-value store...). Its content is private to the library that made it; only ranks running
 * the same library understand it. 128 bytes, byte-aligned, passed by value to ncclCommInitRank. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ---------------------------------------------------------------------------------------------
 * Status codes. ncclInProgress is not an error: a non-blocking communicator is still working;
 * poll ncclCommGetAsyncError until it reports something else.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

/* ---------------------------------------------------------------------------------------------
 * Constants
 * ------------------------------------------------------------------------------------------- */

/* "Not set" values of ncclConfig_t fields: the library picks its default (or the env knob). */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
/* ncclCommSplit color of a rank that joins no new communicator (it gets *newcomm = NULL). */
#define NCCL_SPLIT_NOCOLOR -1
/* Initial value of float outputs such as ncclSimInfo_t.estimatedTime. */
#define NCCL_UNDEF_FLOAT -1.0f

/* winFlags of ncclCommWindowRegister. COLL_SYMMETRIC promises that every rank registers a buffer
 * at the same offset of an ncclMemAlloc allocation, aligned to NCCL_WIN_REQUIRED_ALIGNMENT. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy: how many GPU thread blocks the library may occupy. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* shrinkFlags of ncclCommShrink. DEFAULT needs a healthy parent; ABORT first stops the parent's
 * outstanding work (use it after a failure). */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* revokeFlags of ncclCommRevoke; no other value is accepted yet. */
#define NCCL_REVOKE_DEFAULT 0x00

/* ---------------------------------------------------------------------------------------------
 * ncclConfig_t: communicator options for ncclCommInitRankConfig, ncclCommInitRankScalable,
 * ncclCommSplit and ncclCommShrink. Always start from NCCL_CONFIG_INITIALIZER and then set the
 * fields you want; the library rejects a struct without the magic (ncclInvalidArgument).
 *
 * ABI: the struct only grows at its end. `size` and `version` tell the library which fields the
 * caller's header had; fields the caller could not know about are treated as unset. 80 bytes on
 * LP64 (offsets 0, 8, 12, 16, 20, 24, 28, 32, 40, 44, 48, 56, 60, 64, 68, 72, 76).
 * ------------------------------------------------------------------------------------------- */
typedef struct ncclConfig_v22800 {
    /* Set by NCCL_CONFIG_INITIALIZER; do not change. */
    size_t size;          /* sizeof(ncclConfig_t) as the caller saw it */
    unsigned int magic;   /* 0xcafebeef */
    unsigned int version; /* NCCL_VERSION code of the caller's header */
    /* User options; NCCL_CONFIG_UNDEF_* means "library default". */
    int blocking;            /* 1: calls wait for peers; 0: they may return ncclInProgress */
    int cgaClusterSize;      /* CUDA thread-block cluster size of the kernels */
    int minCTAs;             /* lower bound on thread blocks (channels) per kernel */
    int maxCTAs;             /* upper bound on thread blocks per kernel */
    const char *netName;     /* network plugin/transport to use, by name */
    int splitShare;          /* 1: ncclCommSplit children share the parent's resources */
    int trafficClass;        /* network traffic class (e.g. IB/RoCE service level) */
    const char *commName;    /* name shown in logs and profilers */
    int collnetEnable;       /* 1: allow in-network reduction (CollNet) */
    int CTAPolicy;           /* NCCL_CTA_POLICY_* */
    int shrinkShare;         /* 1: ncclCommShrink children share the parent's resources */
    int nvlsCTAs;            /* thread blocks for NVLink SHARP algorithms */
    int nChannelsPerNetPeer; /* channels per remote peer for network p2p (1..64) */
    int nvlinkCentricSched;  /* 1: schedule favouring NVLink traffic */
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        sizeof(ncclConfig_t), /* size */                                                           \
            0xcafebeef,       /* magic */                                                          \
            NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */                        \
            NCCL_CONFIG_UNDEF_INT,                            /* blocking */                       \
            NCCL_CONFIG_UNDEF_INT,                            /* cgaClusterSize */                 \
            NCCL_CONFIG_UNDEF_INT,                            /* minCTAs */                        \
            NCCL_CONFIG_UNDEF_INT,                            /* maxCTAs */                        \
            NCCL_CONFIG_UNDEF_PTR,                            /* netName */                        \
            NCCL_CONFIG_UNDEF_INT,                            /* splitShare */                     \
            NCCL_CONFIG_UNDEF_INT,                            /* trafficClass */                   \
            NCCL_CONFIG_UNDEF_PTR,                            /* commName */                       \
            NCCL_CONFIG_UNDEF_INT,                            /* collnetEnable */                  \
            NCCL_CONFIG_UNDEF_INT,                            /* CTAPolicy */                      \
            NCCL_CONFIG_UNDEF_INT,                            /* shrinkShare */                    \
            NCCL_CONFIG_UNDEF_INT,                            /* nvlsCTAs */                       \
            NCCL_CONFIG_UNDEF_INT,                            /* nChannelsPerNetPeer */            \
            NCCL_CONFIG_UNDEF_INT                             /* nvlinkCentricSched */             \
    }

/* ---------------------------------------------------------------------------------------------
 * ncclSimInfo_t: output of ncclGroupSimulateEnd. Start from NCCL_SIM_INFO_INITIALIZER (the
 * library checks the magic). 24 bytes on LP64.
 * ------------------------------------------------------------------------------------------- */
typedef struct ncclSimInfo_v22200 {
    size_t size;         /* sizeof(ncclSimInfo_t) as the caller saw it */
    unsigned int magic;  /* 0x74685283 */
    unsigned int version;
    float estimatedTime; /* predicted time of the group, microseconds; NCCL_UNDEF_FLOAT if none */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                                  \
    {                                                                                              \
        sizeof(ncclSimInfo_t), /* size */                                                          \
            0x74685283,        /* magic */                                                         \
            NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */                        \
            NCCL_UNDEF_FLOAT                                  /* estimatedTime */                  \
    }

/* ---------------------------------------------------------------------------------------------
 * Reduction operators (4 bytes). Values ncclNumOps..ncclMaxRedOp are handles of operators made
 * by ncclRedOpCreatePreMulSum; such a handle is valid only on the communicator that made it.
 * ncclAvg is the sum divided by the number of ranks (integer types: truncating division of the
 * sum; floating types: each input is scaled by 1/nranks first).
 * ------------------------------------------------------------------------------------------- */

/* Exists only so that ncclMaxRedOp can be computed from the size of an enum like ncclRedOp_t. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5, /* number of built-in operators */
    /* Largest valid value (0x7fffffff with 4-byte enums); it keeps the enum 4 bytes wide. */
    ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* ---------------------------------------------------------------------------------------------
 * Element types (4 bytes). Sizes in bytes: 1 1 4 4 8 8 2 4 8 2 1 1. The FP8 types can be
 * reduced only on sm_90 and newer GPUs; they can always be copied (broadcast, gathers, p2p).
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
    /* Device-visible memory, read when each collective using the operator runs; it must stay
     * valid until then. */
    ncclScalarDevice = 0,
    /* Host memory, copied before ncclRedOpCreatePreMulSum returns. */
    ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* =============================================================================================
 * Functions. Each is listed with its profiling twin pnccl<Name>; both have the same contract.
 * Outputs are written only on success.
 * =========================================================================================== */

/* ---- Version, errors, queries ---------------------------------------------------------------- */

/* Stores the library's NCCL_VERSION_CODE in *version. Never blocks; needs no communicator. */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t pncclGetVersion(int *version);

/* Returns a static, human-readable text for a status code ("unknown result code" for values out
 * of range). The string is never freed. */
const char *ncclGetErrorString(ncclResult_t result);
const char *pncclGetErrorString(ncclResult_t result);

/* Returns the text of the most recent error the library reported, in any thread and on any
 * communicator (comm is accepted for API compatibility and may be NULL). "" if none. The string
 * stays valid until the next error is reported. */
const char *ncclGetLastError(ncclComm_t comm);
const char *pncclGetLastError(ncclComm_t comm);

/* Stores the communicator's sticky state in *asyncError: ncclSuccess, ncclInProgress while a
 * non-blocking operation (init, split, group end...) is still running, or the error a background
 * thread hit (network failure, peer gone). Never blocks: watchdogs poll it from other threads and
 * call ncclCommAbort on an error. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);

/* Number of ranks of comm. Local, non-blocking. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int *count);

/* CUDA device the communicator is bound to (the device current when it was created). Local,
 * non-blocking. */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device);

/* This rank's index in comm, 0..count-1. Local, non-blocking. */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank);

/* Makes the library read NCCL_DEBUG* again on the next log call. Kept for old programs. */
WEFT_NCCL_DEPRECATED_("ncclResetDebugInit is not part of the supported API and will be removed")
void ncclResetDebugInit(void);
WEFT_NCCL_DEPRECATED_("pncclResetDebugInit is not part of the supported API and will be removed")
void pncclResetDebugInit(void);

/* ---- Communicator lifecycle ---------------------------------------------------------------- */

/* Makes a new rendezvous token. Call it on one rank, then give the 128 bytes to all ranks before
 * they call ncclCommInitRank*. It may start a listener the library owns until the communicator
 * is created. Does not block on other ranks. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId);

/* Creates this rank's communicator of nranks ranks, 0 <= rank < nranks, all ranks passing the
 * same commId (by value). Collective: blocks until every rank has joined, unless it is called
 * inside ncclGroupStart/End (then ncclGroupEnd completes it; this is how one thread creates
 * several communicators). The communicator uses the CUDA device current at the call. Equivalent
 * to ncclCommInitRankConfig with a NULL config. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);

/* As ncclCommInitRank, with options (config may be NULL for the defaults). With
 * config->blocking == 0 it may return ncclInProgress with *comm already set; poll
 * ncclCommGetAsyncError(*comm) until it is no longer ncclInProgress. The config is read during
 * the call only. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t *config);

/* As ncclCommInitRankConfig, with nId tokens (1 <= nId <= nranks) to spread the rendezvous load
 * over several roots. Every rank passes the same array in the same order. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId *commIds, ncclConfig_t *config);

/* Single-process helper: creates ndev communicators, rank i on device devlist[i] (devices
 * 0..ndev-1 when devlist is NULL), stored in comm[0..ndev-1]. Blocks until all are ready. The
 * caller's current device is restored. */
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);

/* Completes every operation issued on comm and makes the communicator quiescent on all ranks
 * (collective). After it, ncclCommDestroy frees local resources only. Non-blocking
 * communicators may return ncclInProgress. Calling it twice is ncclInvalidArgument. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* Frees the communicator, finalizing it first if needed (waits for its outstanding work).
 * NULL is accepted. The handle is invalid afterwards. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Stops all work on comm (including kernels waiting on dead peers) and frees it. Never hangs;
 * may be called from another thread while an operation on comm is blocked. NULL is accepted. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Stops in-flight operations without freeing the communicator (revokeFlags must be
 * NCCL_REVOKE_DEFAULT). The state reads ncclInProgress until quiescent; afterwards only
 * ncclCommDestroy, ncclCommSplit and ncclCommShrink are allowed. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Collective over all ranks of comm: ranks with the same color form a new communicator, ordered
 * by key (ties: parent rank). A rank with NCCL_SPLIT_NOCOLOR takes part and gets NULL. A NULL
 * config inherits the parent's options. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                            ncclConfig_t *config);

/* Collective over the ranks of comm that are not listed in excludeRanksList (excludeRanksCount
 * > 0 entries, parent ranks): builds a communicator of the survivors in parent order.
 * shrinkFlags is NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT. A NULL config inherits the parent's. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                             ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);

/* ---- Memory and registration ---------------------------------------------------------------- */

/* Allocates size bytes of device memory on the current device, suitable for every optimization
 * (registration, symmetric windows, peer access). Free it with ncclMemFree only. Works inside and
 * outside groups. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t pncclMemAlloc(void **ptr, size_t size);

/* Frees memory from ncclMemAlloc. */
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t pncclMemFree(void *ptr);

/* Registers [buff, buff+size) with comm for faster transfers (local, not collective). *handle may
 * be NULL when registration is not used; pass it to ncclCommDeregister. The buffer stays owned by
 * the caller and must outlive the registration. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);

/* Undoes ncclCommRegister; a NULL handle is accepted. */
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle);

/* Collective: every rank registers a buffer as a window (winFlags: NCCL_WIN_*). *win may be set
 * to NULL when windows are not used; a NULL buff or size 0 is a no-op. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                     int winFlags);

/* Undoes ncclCommWindowRegister; a NULL win is accepted. */
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ---- Custom reduction operators ------------------------------------------------------------- */

/* Makes an operator computing sum over ranks of (scalar_r * x_r), each rank with its own scalar
 * of type datatype (see ncclScalarResidence_t). The handle in *op works only on comm and with
 * datatype. It may be destroyed as soon as the last call using it has returned, even inside an
 * unfinished group. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

/* Destroys an operator made by ncclRedOpCreatePreMulSum on comm; built-in operators are
 * rejected with ncclInvalidArgument. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- Collectives ---------------------------------------------------------------------------
 * Each call is collective: every rank of comm issues it, in the same order relative to other
 * operations on comm. The operation is ordered on `stream` (NULL: the legacy default stream) and
 * the call returns once it is enqueued; the buffers belong to the caller and must stay valid
 * until the stream reaches the operation. Weft also accepts host buffers: such calls complete
 * before they return (or before ncclGroupEnd returns inside a group). Counts are in elements of
 * datatype. A count of 0 is a successful no-op. Bad arguments (root out of range, datatype or op
 * out of range, NULL comm) give ncclInvalidArgument. Inside ncclGroupStart/End the call is only
 * recorded and ncclGroupEnd launches it.
 * ------------------------------------------------------------------------------------------- */

/* recvbuff[i] = op over ranks of sendbuff[i], on every rank; count elements each. In place when
 * sendbuff == recvbuff. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/* Copies count elements of root's sendbuff into every rank's recvbuff. sendbuff is read on root
 * only. In place when sendbuff == recvbuff. */
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);

/* In-place ncclBroadcast(buff, buff, ...). Kept for old programs. */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

/* As ncclAllReduce, but only root receives (recvbuff may be NULL elsewhere). */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* Every rank receives nranks*sendcount elements: rank r's sendbuff at offset r*sendcount. In
 * place when sendbuff == recvbuff + rank*sendcount. */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Reduces nranks*recvcount elements over ranks; rank r receives block r (recvcount elements). In
 * place when recvbuff == sendbuff + rank*recvcount. */
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/* Block j (count elements) of sendbuff goes to rank j; block i of recvbuff comes from rank i.
 * Both buffers hold nranks*count elements. */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* root receives nranks*count elements, rank r's sendbuff at offset r*count; recvbuff is used on
 * root only. */
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* Rank r receives block r (count elements) of root's sendbuff (nranks*count elements, read on
 * root only). */
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream);

/* ---- Point-to-point --------------------------------------------------------------------------
 * A send to peer is matched by a receive from this rank on peer, with the same count and
 * datatype; within a group, pairs between two ranks match in issue order. Outside a group each
 * call waits (on the stream) for its peer, so exchanges that must progress together go in one
 * group. peer may be this rank inside a group. count 0 is a valid no-op.
 * ------------------------------------------------------------------------------------------- */
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* ---- Groups ----------------------------------------------------------------------------------
 * Groups nest per thread; only the outermost ncclGroupEnd acts. Between them, calls are recorded
 * and not launched. ncclGroupEnd launches everything (fusing what it can) and returns when all
 * of it is enqueued, or the first error any recorded call hit. One thread driving several
 * communicators must use a group, or it deadlocks. ncclGroupEnd without ncclGroupStart is
 * ncclInvalidUsage.
 * ------------------------------------------------------------------------------------------- */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* Ends the group like ncclGroupEnd would, without running anything: fills simInfo (start from
 * NCCL_SIM_INFO_INITIALIZER) with the predicted time and discards the recorded calls. */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo);


#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
