/*
 * The CUDA executor: collectives on device buffers run as one kernel launch per communicator per
 * group (kernels/coll_kernel.cu), on the communicator's internal stream joined to the user's
 * stream with events. Every CUDA call goes through weft_cuda() (src/cuda/cuda_ops.h), so the same
 * code drives a real GPU and the emulated one.
 *
 * Scope of this version: ranks as threads of one process or as processes (any number per device,
 * one or several devices; processes of one host share FIFO memory through the p2p transport,
 * transports/p2p), on one or several hosts (peers on other hosts through the device socket proxy,
 * transports/socket/dev_socket.c).
 *
 * Threads: the hooks below are called by the thread that owns the communicator (init, submit,
 * destroy), except weft_cuda_comm_abort (any thread).
 */
#ifndef WEFT_EXEC_CUDA_H
#define WEFT_EXEC_CUDA_H

#include "nccl.h"

struct ncclComm;
struct weft_task;

/* The calling thread's current device, or -1 when the process has no CUDA device. */
int weft_cuda_current_device(void);
/* Devices of the process (0: none), and cudaSetDevice (0 or a CUDA error code). */
int weft_cuda_device_count(void);
int weft_cuda_set_device(int dev);

/* 1 when p is device or managed memory (the host cannot read it directly on a real GPU). */
int weft_cuda_is_device_ptr(const void *p);

/* Binds a new communicator to device dev (-1: the current one; nothing without devices).
 * Before the peer exchange, so every rank learns every rank's device. */
ncclResult_t weft_cuda_comm_bind(struct ncclComm *comm, int dev);

/* Peers of this host whose FIFOs with this rank are pinned host memory (no peer access), -1
 * without the CUDA executor; for tests and logs. (Which GPU a peer uses: core/cuda_peer.h.) */
int weft_cuda_host_fifo_peers(const struct ncclComm *comm);

/* Collective, after the peer exchange: device FIFOs, state, stream and events, where every rank
 * has a device and all ranks are on this host; nothing otherwise. */
ncclResult_t weft_cuda_comm_setup(struct ncclComm *comm);

/* Sets the abort word a waiting kernel polls (it leaves within a millisecond or so). */
void weft_cuda_comm_abort(struct ncclComm *comm);

/* Waits for the kernels launched so far (ncclCommFinalize); their error, if one gave up. */
ncclResult_t weft_cuda_comm_sync(struct ncclComm *comm);

/* Waits for the communicator's kernels, frees its device resources. Idempotent. */
ncclResult_t weft_cuda_comm_free(struct ncclComm *comm);

/*
 * Where a task runs: sets task->on_device (and device views of its buffers) from the memory kinds
 * of the buffers the operation uses on this rank (send_needed, recv_needed). Host buffers: the
 * host path. Device, managed or pinned buffers: the CUDA executor. ncclInvalidArgument naming
 * the buffer when the communicator has no device, the buffer is on another device, or host and
 * device buffers are mixed; ncclInvalidUsage where the communicator spans hosts.
 */
ncclResult_t weft_cuda_classify(struct ncclComm *comm, struct weft_task *task, int send_needed,
                                int recv_needed);

/* Launches the device tasks of one submission (any communicators): returns once enqueued. */
ncclResult_t weft_cuda_exec(struct weft_task *tasks, int ntasks);

/*
 * ncclCommRegister on a device communicator whose ranks span processes: offers the ncclMemAlloc
 * allocation [base, base + bytes) (cumem: from cuMem, else cudaMalloc) to the peers in other
 * processes, which map it for the direct kernel. The share id (nonzero), or 0 where nothing is
 * shared (no such peers, no direct kernel, the export failed). Any thread.
 */
uint64_t weft_cuda_reg_share(struct ncclComm *comm, void *base, size_t bytes, int cumem);
/* ncclCommDeregister: the peers unmap share id (0: nothing). Any thread. */
void weft_cuda_reg_unshare(struct ncclComm *comm, uint64_t id);

/* Collectives this rank ran with the direct kernel (registered device buffers, zero-copy). */
uint64_t weft_cuda_zcopy_count(struct ncclComm *comm);

/* Turns a kernel's stuck record into the communicator's error (logged once); ncclSuccess if the
 * kernels are fine. Called where the async error is read and before every launch; while the
 * kernels run it also looks (every 100 ms at most) for a peer process that died, and then stops
 * them (the abort word) so the error names the dead peer before the kernels' deadline. */
ncclResult_t weft_cuda_comm_check(struct ncclComm *comm);

/* Tests: communicators set up from now on run this build of the collective kernel (the emulated
 * GPU's entry and the GPU's, either NULL where absent) instead of the library's; (NULL, NULL)
 * restores it. For kernels built with test flags (kernels/coll_kernel.cu, WEFT_LL_FLAG_BITS). */
void weft_cuda_test_kernel(void (*emu_fn)(void *), const void *device_fn);

#endif
