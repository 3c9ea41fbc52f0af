/*
 * weft.h -- Weft's public extensions to the NCCL API.
 *
 * Everything here is Weft-only: a program that uses it runs with Weft's libweft.so / libnccl.so.2
 * and not with NVIDIA's library. Names are camelCase with the `weft` prefix (the version script
 * exports `weft[A-Z]*`); types and values come from nccl.h, which this header includes.
 *
 * Threads. Unless stated otherwise a function may be called from any thread. Buffers passed in are
 * owned by the caller.
 */
#ifndef WEFT_H_
#define WEFT_H_

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Launch helper
 *
 * A process started by a launcher learns its place in the job from the environment. The launcher
 * `weftrun -n N prog` (tools/weftrun.c) sets, in every rank:
 *
 *   WEFT_RANK        this rank, 0 .. N-1
 *   WEFT_NRANKS      N
 *   WEFT_LOCAL_RANK  this rank's index among the ranks on its host
 *   WEFT_LOCAL_SIZE  number of ranks on its host (informational; not returned here)
 *   WEFT_UNIQUE_ID   the job's ncclUniqueId, 2*NCCL_UNIQUE_ID_BYTES (256) hex digits; weftrun
 *                    made it with ncclGetUniqueId and keeps the bootstrap root alive for the job
 *
 * Under other launchers (Open MPI's mpirun, MPICH's mpiexec, Slurm's srun, torchrun) the rank comes
 * from their variables and the id from rank 0 through a small store; see weftLaunchInfo.
 * ------------------------------------------------------------------------------------------- */

/* Number of hex digits in WEFT_UNIQUE_ID: two per byte of ncclUniqueId. */
#define WEFT_UNIQUE_ID_HEX_LEN (2 * NCCL_UNIQUE_ID_BYTES)

/*
 * weftLaunchInfo -- rank, size, local rank and unique id of this process, from the environment.
 *
 * Rank, size and local rank come from the first of these families whose rank variable is set
 * (a family is used as a whole; families are never mixed):
 *
 *   1. weftrun:    WEFT_RANK            / WEFT_NRANKS          / WEFT_LOCAL_RANK
 *   2. Open MPI:   OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK
 *   3. MPICH/Hydra, Intel MPI:
 *                  PMI_RANK             / PMI_SIZE             / MPI_LOCALRANKID
 *   4. Slurm srun: SLURM_PROCID         / SLURM_NTASKS         / SLURM_LOCALID
 *   5. torchrun:   RANK                 / WORLD_SIZE           / LOCAL_RANK
 *
 * None of the rank variables set: rank 0 of 1, local rank 0. In the chosen family the size
 * variable must be set too; the local-rank variable is optional and defaults to the rank (i.e.
 * all ranks are assumed to share one host). Values are decimal integers; a value that does not
 * parse, rank outside [0, nranks), nranks < 1 or local rank outside [0, nranks) is an error.
 *
 * Local size (ranks on this host), used only to pick the rendezvous below: WEFT_LOCAL_SIZE,
 * OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, LOCAL_WORLD_SIZE for the families above; Slurm: all
 * ranks when SLURM_STEP_NUM_NODES (or SLURM_NNODES) is 1.
 *
 * The unique id:
 *   - WEFT_UNIQUE_ID set: decoded from exactly WEFT_UNIQUE_ID_HEX_LEN hex digits (either case, no
 *     spaces or prefix); whichever family gave the rank.
 *   - not set and nranks == 1: made here with ncclGetUniqueId (which starts a bootstrap root
 *     listener in this process; each such call makes a new id).
 *   - not set and nranks > 1: rank 0 makes it with ncclGetUniqueId and hands it to the other ranks
 *     through the launch store (src/core/store.h), a one-shot listener in rank 0 that lives only
 *     for this call. No MPI or PMI library is used. The store is at, in priority order:
 *       1. WEFT_STORE_ADDR=host:port (rank 0 binds that address; when it is not one of rank 0's
 *          own, every interface at that port);
 *       2. MASTER_ADDR:MASTER_PORT (torchrun and many Slurm scripts). Under torchrun's agent store
 *          (TORCHELASTIC_USE_AGENT_STORE=True), which holds MASTER_PORT itself, MASTER_PORT + 1;
 *       3. when every rank is on this host (local size == nranks): an abstract-namespace Unix
 *          socket named after the job, identified by PMIX_NAMESPACE or OMPI_MCA_ess_base_jobid
 *          (Open MPI), the job's hydra_pmi_proxy process (MPICH Hydra, which exports no job id),
 *          SLURM_JOB_ID.SLURM_STEP_ID (Slurm), TORCHELASTIC_RUN_ID (torchrun);
 *       4. otherwise ncclInvalidUsage, asking for WEFT_STORE_ADDR or MASTER_ADDR/MASTER_PORT.
 *     Messages carry a job key (family and job identifier), nranks and a per-process round
 *     number, so ranks of two jobs that share a port never take each other's id: a rank refused
 *     by another job's store retries, and a rank 0 that finds the port busy waits for it.
 *     Every rank with nranks > 1 must call weftLaunchInfo with id != NULL the same number of
 *     times; each call is one exchange and yields a new id.
 *
 * Parameters: every output may be NULL when the caller does not want it. With id == NULL no id is
 * made or required and nothing blocks (so the call also serves jobs that only want the rank), but
 * a WEFT_UNIQUE_ID that is present is still checked. Outputs are written only when the call
 * returns ncclSuccess.
 *
 * Returns:
 *   ncclSuccess          outputs written
 *   ncclInvalidArgument  a malformed variable: not an integer, out of range, WEFT_UNIQUE_ID of the
 *                        wrong length or with a non-hex character, a size variable missing,
 *                        WEFT_STORE_ADDR or MASTER_ADDR:MASTER_PORT not a host:port
 *   ncclInvalidUsage     id != NULL, nranks > 1, no WEFT_UNIQUE_ID and no store address: ranks on
 *                        several hosts (or an unknown number per host) without WEFT_STORE_ADDR or
 *                        MASTER_ADDR/MASTER_PORT, or one host but no job identifier; also only one
 *                        of MASTER_ADDR/MASTER_PORT set
 *   ncclSystemError      the store exchange failed: no id within WEFT_BOOTSTRAP_TIMEOUT seconds
 *                        (the message names the missing ranks or the last refusal), or rank 0
 *                        cannot bind the store address
 *   (other)              whatever ncclGetUniqueId returned
 * Every error is logged (NCCL_DEBUG=WARN) and its text is what ncclGetLastError() returns next.
 *
 * Blocking: with id != NULL, nranks > 1 and no WEFT_UNIQUE_ID, blocks until the exchange is done:
 * rank 0 until every other rank has the id, the others until they have it (each at most
 * WEFT_BOOTSTRAP_TIMEOUT seconds). Otherwise reads the environment only. Reads the environment with
 * getenv, so it must not race with setenv/putenv in another thread.
 */
ncclResult_t weftLaunchInfo(int *rank, int *nranks, int *localRank, ncclUniqueId *id);

/* ---------------------------------------------------------------------------------------------
 * Hang report
 *
 * weftCommHangReport -- prints this rank's hang report for comm on stderr: the operation in flight
 * (if any), the peer it waits on and for what, the FIFO positions of that connection, what each
 * peer last said about itself, the ranks that never said they entered the operation, and the
 * communicator's recent operations. With an operation in flight the executor prints it at its
 * next check (within about 100 ms, once the operation is blocked); otherwise it prints at once.
 * Any thread. Does not block and does not fail the operation. ncclInvalidArgument for a bad comm.
 * WEFT_HANG_REPORT=SECONDS prints the same report by itself once an operation has made no progress
 * for that long; at the WEFT_TIMEOUT deadline every stuck rank prints it before failing.
 * ------------------------------------------------------------------------------------------- */
ncclResult_t weftCommHangReport(ncclComm_t comm);

/* ---------------------------------------------------------------------------------------------
 * Host streams
 *
 * The host-memory counterpart of cudaStream_t: a queue served by a worker thread. Pass a stream
 * wherever NCCL takes a cudaStream_t (cast with weftStreamAsCuda); the call then returns at once
 * and the operation runs asynchronously, after every operation issued earlier on that stream.
 * Buffers must stay valid and untouched until weftStreamSynchronize (or a successful
 * weftStreamQuery) says the work is done. Stream NULL keeps NCCL's host behaviour: the operation is
 * complete when the call (or its group) returns.
 *
 * Operations on one communicator run in the order they were issued, whatever streams carry them;
 * the operations of one group on one communicator run together on the stream of the first of them.
 * Any thread may call these functions; a stream may be used from several threads.
 * ------------------------------------------------------------------------------------------- */

typedef struct weftStream *weftStream_t;

/* Creates a stream (starts its worker thread). */
ncclResult_t weftStreamCreate(weftStream_t *stream);
/* Waits for the stream's work, then frees it. Returns the first error of that work, if any. */
ncclResult_t weftStreamDestroy(weftStream_t stream);
/* Blocks until every operation issued so far on the stream finished; returns (and clears) the
 * first error any of them hit. */
ncclResult_t weftStreamSynchronize(weftStream_t stream);
/* ncclSuccess if the stream is idle, ncclInProgress if work is queued or running, else the error. */
ncclResult_t weftStreamQuery(weftStream_t stream);

/* The handle to pass as the cudaStream_t argument of NCCL calls. */
static inline cudaStream_t weftStreamAsCuda(weftStream_t stream)
{
    return (cudaStream_t)(void *)stream;
}

/* ---------------------------------------------------------------------------------------------
 * Device runtime
 *
 * Thin forwards of the CUDA backend Weft chose for this process (WEFT_CUDA: unset/auto = the real
 * GPU when one answers, else none; 0 = none; emu:N = N emulated devices in this process), so that
 * tools and tests run unchanged on a GPU, on the emulated GPU and on a machine without CUDA.
 * Each returns an int with cudaError_t's values (0 success, 1 invalid value, 2 out of memory,
 * 400 invalid handle, 600 not ready, 900 not permitted while a stream captures, 901 capture
 * invalidated; 35 for everything but the queries when the backend is "none"). Streams are
 * cudaStream_t (NULL = the current device's legacy stream); under the real backend these are
 * CUDA's own handles, under emu they are emulated objects typed as such. Under the real backend a
 * weftCudaEvent_t is a cudaEvent_t and a weftCudaGraph_t a cudaGraphExec_t.
 * The first call picks the backend (and may initialise the CUDA driver).
 * ------------------------------------------------------------------------------------------- */

typedef struct CUevent_st *weftCudaEvent_t;
typedef struct CUgraphExec_st *weftCudaGraph_t;

/* "none", "emu" or "cuda". */
const char *weftCudaBackend(void);
int weftCudaGetDeviceCount(int *count);
/* The calling thread's current device. */
int weftCudaSetDevice(int device);
int weftCudaGetDevice(int *device);
int weftCudaDeviceCanAccessPeer(int *canAccess, int device, int peer);
int weftCudaDeviceEnablePeerAccess(int peer);
int weftCudaDeviceSynchronize(void);
/* Device memory of the current device; cudaFree waits for the device's work. */
int weftCudaMalloc(void **ptr, size_t bytes);
int weftCudaFree(void *ptr);
/* Pinned host memory, mapped and portable. */
int weftCudaHostAlloc(void **ptr, size_t bytes);
int weftCudaHostFree(void *ptr);
/* Synchronous copy in any direction (cudaMemcpyDefault on the legacy stream, then waits). */
int weftCudaMemcpy(void *dst, const void *src, size_t bytes);
int weftCudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream);
/* Synchronous memset (the legacy stream, then waits). */
int weftCudaMemset(void *dst, int value, size_t bytes);
int weftCudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream);
/* A non-blocking stream of the current device. */
int weftCudaStreamCreate(cudaStream_t *stream);
int weftCudaStreamDestroy(cudaStream_t stream);
int weftCudaStreamSynchronize(cudaStream_t stream);
/* 0 idle, 600 work pending. */
int weftCudaStreamQuery(cudaStream_t stream);
/* Capture (global mode) into an executable graph. */
int weftCudaStreamBeginCapture(cudaStream_t stream);
int weftCudaStreamEndCapture(cudaStream_t stream, weftCudaGraph_t *graph);
int weftCudaGraphLaunch(weftCudaGraph_t graph, cudaStream_t stream);
int weftCudaGraphDestroy(weftCudaGraph_t graph);
/* Events without timing. Waiting on an event never recorded does nothing. */
int weftCudaEventCreate(weftCudaEvent_t *event);
int weftCudaEventRecord(weftCudaEvent_t event, cudaStream_t stream);
int weftCudaEventSynchronize(weftCudaEvent_t event);
int weftCudaEventDestroy(weftCudaEvent_t event);
int weftCudaStreamWaitEvent(cudaStream_t stream, weftCudaEvent_t event);
const char *weftCudaGetErrorString(int error);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_H_ */
