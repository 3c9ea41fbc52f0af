/*
 * The CUDA ops table: every CUDA runtime or driver call Weft makes goes through weft_cuda().
 *
 * Backends (one is chosen per process, lazily, on the first weft_cuda() call; never in a
 * constructor):
 *   "none"  get_device_count reports 0, pointer_attr says plain host for every address, every
 *           other slot returns an error (35, cudaErrorInsufficientDriver). No NULL slots.
 *   "emu"   the emulated GPU (src/cuda/emu.c): N devices in this process, device memory backed by
 *           one memfd per allocation, streams as worker threads, kernels compiled by g++ through
 *           kernels/dialect.h and run with one OS thread per emulated GPU thread.
 *   "cuda"  the real runtime (src/cuda/real.c), linked statically; built only with the toolkit.
 * Selection, by the string knob WEFT_CUDA: "emu:N" (or "emu" = 1 device) -> emu with N devices;
 * "0" or "none" -> none; unset, "" or "auto" -> cuda if built and cudaGetDeviceCount finds >= 1
 * device, else none; "cuda" -> like auto, with a warning when it falls back to none.
 *
 * Errors are int with cudaError_t values (WEFT_CUDA_ERR_*). Outputs (the _p arguments) are
 * written only on success. Any thread may call any slot; a table never changes once returned.
 *
 * Streams: weft_cuda_stream_t NULL is the calling thread's current device's legacy stream. Streams
 * made by stream_create are non-blocking (no implicit synchronisation with the legacy stream).
 * Asynchronous slots (memcpy_async, memset_async, launch, event_record, stream_wait_event,
 * launch_host_func) only enqueue: they return before the work runs; buffers they read must stay
 * valid until the stream reaches them (launch copies its params at the call).
 * Blocking slots: stream_synchronize, event_synchronize, device_synchronize, stream_destroy
 * (emu: waits for the stream's queued work), free (waits for the device's work, like cudaFree);
 * mem_release does not wait.
 */
#ifndef WEFT_CUDA_CUDA_OPS_H
#define WEFT_CUDA_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2: shareable memory (mem_create .. ipc_close_handle) added at the end. Version 4:
 * facts; 5 adds device identity (device_id, device_by_bus_id); 6 load_kernels. */
#define WEFT_CUDA_OPS_VERSION 6

/* cudaError_t values used by the backends. */
enum weft_cuda_err {
    WEFT_CUDA_SUCCESS = 0,
    WEFT_CUDA_ERR_INVALID_VALUE = 1,
    WEFT_CUDA_ERR_OUT_OF_MEMORY = 2,
    WEFT_CUDA_ERR_INVALID_CONFIG = 9,
    WEFT_CUDA_ERR_NO_DRIVER = 35,          /* cudaErrorInsufficientDriver: the "none" table */
    WEFT_CUDA_ERR_INVALID_DEVICE_FN = 98,
    WEFT_CUDA_ERR_NO_DEVICE = 100,
    WEFT_CUDA_ERR_INVALID_DEVICE = 101,
    WEFT_CUDA_ERR_INVALID_CONTEXT = 201,   /* cudaErrorDeviceUninitialized: "invalid device context" */
    WEFT_CUDA_ERR_MAP_FAILED = 205,        /* cudaErrorMapBufferObjectFailed */
    WEFT_CUDA_ERR_PEER_UNSUPPORTED = 217,  /* cudaErrorPeerAccessUnsupported */
    WEFT_CUDA_ERR_INVALID_HANDLE = 400,
    WEFT_CUDA_ERR_ILLEGAL_STATE = 401,
    WEFT_CUDA_ERR_NOT_READY = 600,
    WEFT_CUDA_ERR_LAUNCH_RESOURCES = 701,
    WEFT_CUDA_ERR_LAUNCH_TIMEOUT = 702,    /* emulator: a wait passed its deadline (WEFT_TIMEOUT) */
    WEFT_CUDA_ERR_PEER_ALREADY_ENABLED = 704,
    WEFT_CUDA_ERR_ASSERT = 710,
    WEFT_CUDA_ERR_LAUNCH_FAILURE = 719,
    WEFT_CUDA_ERR_NOT_SUPPORTED = 801,
    WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED = 900,
    WEFT_CUDA_ERR_CAPTURE_INVALIDATED = 901,
    WEFT_CUDA_ERR_CAPTURE_UNMATCHED = 902,
    WEFT_CUDA_ERR_UNKNOWN = 999,
};

enum weft_mem_kind {
    WEFT_MEM_HOST = 0,    /* plain host memory, unknown to CUDA */
    WEFT_MEM_HOST_PINNED, /* cudaHostAlloc'd / registered, mapped */
    WEFT_MEM_DEVICE,
    WEFT_MEM_MANAGED
};

struct weft_ptr_attr {
    int kind;      /* enum weft_mem_kind */
    int device;    /* owning device for DEVICE/MANAGED, -1 otherwise */
    void *dev_ptr; /* address kernels use (== p for device; mapped address for pinned) */
    void *base;    /* start of the allocation holding p, NULL for plain host */
    size_t size;   /* bytes of that allocation, 0 for plain host */
};

/* What communicator init reports of the backend and a device (weft_cuda_report). */
struct weft_cuda_facts {
    int driver;       /* cudaDriverGetVersion: 1000 major + 10 minor (13000: CUDA 13.0, the
                       * 580 driver); 0: no driver */
    int runtime;      /* cudaRuntimeGetVersion: the runtime linked in (emu: the one emulated) */
    int compute_mode; /* cudaComputeMode: 0 default, 2 prohibited, 3 exclusive-process; -1 unknown */
    int mig;          /* 1: the device is a MIG instance, 0: not, -1: unknown */
    char name[96];    /* the device's name, "" when unknown */
};

typedef void *weft_cuda_stream_t; /* cudaStream_t for real, an emu object for emu; NULL = legacy */
typedef void *weft_cuda_event_t;
typedef void *weft_cuda_graph_t; /* executable graph */

/* A legacy IPC handle (cudaIpcMemHandle_t): opaque bytes, copied between processes by value. */
#define WEFT_CUDA_IPC_HANDLE_BYTES 64
struct weft_cuda_ipc_handle {
    unsigned char bytes[WEFT_CUDA_IPC_HANDLE_BYTES];
};

/*
 * What names a device in every process of a host, whatever CUDA_VISIBLE_DEVICES renumbered: the
 * same uuid is the same GPU; bus_id is what cudaDeviceGetByPCIBusId takes ("0000:3b:00.0").
 */
#define WEFT_CUDA_BUS_ID_BYTES 16
struct weft_cuda_dev_id {
    unsigned char uuid[16];               /* cudaDeviceProp.uuid */
    char bus_id[WEFT_CUDA_BUS_ID_BYTES]; /* cudaDeviceGetPCIBusId, NUL-terminated */
};

/*
 * One kernel, both compilations. On the GPU device_fn is a __global__ function taking exactly one
 * argument, the parameter struct by value (launch passes params as that argument). On the emulated
 * GPU emu_fn is called once per emulated thread with a pointer to the launch's private copy of the
 * params (shared by all threads of that launch; treat it as read-only).
 */
struct weft_kernel {
    const char *name;
    const void *device_fn;        /* nvcc's __global__ symbol (real), NULL where not built */
    void (*emu_fn)(void *params); /* the g++ build, run once per emulated thread */
};

struct weft_cuda_ops {
    uint32_t version; /* WEFT_CUDA_OPS_VERSION */
    const char *name; /* "none", "emu", "cuda" */

    /* Devices. The current device is per calling thread (default 0). */
    int (*get_device_count)(int *n_p);
    int (*get_device)(int *dev_p);
    int (*set_device)(int dev);
    /* *can_p = 1 when dev can map peer's memory (never for dev == peer, as in CUDA). */
    int (*can_access_peer)(int *can_p, int dev, int peer);
    /* From the current device; 704 when already enabled. */
    int (*enable_peer_access)(int peer);

    /* Memory. malloc: device memory of the current device (0 bytes -> NULL, success). free waits
     * for the owning device's queued work first (as cudaFree does); free(NULL) succeeds. */
    int (*malloc)(void **p_p, size_t bytes);
    int (*free)(void *p);
    int (*host_alloc)(void **p_p, size_t bytes); /* pinned, mapped, portable */
    int (*host_free)(void *p);
    /* Never fails for host memory: unknown addresses are WEFT_MEM_HOST. */
    int (*pointer_attr)(struct weft_ptr_attr *attr_p, const void *p);

    /* Asynchronous copies (kind default: any direction) and memset on stream s. */
    int (*memcpy_async)(void *dst, const void *src, size_t bytes, weft_cuda_stream_t s);
    int (*memset_async)(void *dst, int value, size_t bytes, weft_cuda_stream_t s);

    /* Streams, on the current device; created non-blocking. */
    int (*stream_create)(weft_cuda_stream_t *s_p);
    int (*stream_destroy)(weft_cuda_stream_t s);
    /* Blocks until the stream's work is done; returns the stream's first asynchronous error
     * (sticky). 900 (and the capture is invalidated) when s is capturing. */
    int (*stream_synchronize)(weft_cuda_stream_t s);
    int (*stream_query)(weft_cuda_stream_t s); /* 0 idle, 600 not ready */
    int (*stream_capturing)(weft_cuda_stream_t s, int *capturing_p);

    /* Events (timing disabled). Waiting on an event never recorded is a no-op. */
    int (*event_create)(weft_cuda_event_t *e_p);
    int (*event_destroy)(weft_cuda_event_t e);
    int (*event_record)(weft_cuda_event_t e, weft_cuda_stream_t s);
    int (*stream_wait_event)(weft_cuda_stream_t s, weft_cuda_event_t e);
    int (*event_synchronize)(weft_cuda_event_t e);

    /* grid x block threads (x only), shared_bytes of dynamic shared memory per block; params is
     * copied at the call (params_bytes bytes). */
    int (*launch)(const struct weft_kernel *k, int grid, int block, size_t shared_bytes,
                  const void *params, size_t params_bytes, weft_cuda_stream_t s);

    /* Graphs: begin/end capture on a stream, launch/destroy an executable graph. Other streams
     * join a capture by waiting on an event recorded in it (as in CUDA). The capture mode is the
     * knob WEFT_CUDA_CAPTURE_MODE (cudaStreamCaptureMode values; default 0, global). */
    int (*capture_begin)(weft_cuda_stream_t s);
    int (*capture_end)(weft_cuda_stream_t s, weft_cuda_graph_t *g_p);
    int (*graph_launch)(weft_cuda_graph_t g, weft_cuda_stream_t s);
    int (*graph_destroy)(weft_cuda_graph_t g);

    const char *(*error_string)(int err);

    /* ---- added by piece E after the contract (version 1): ---- */
    /* cudaLaunchHostFunc: fn(arg) runs on the stream's worker (emu) or a driver thread (real)
     * when the stream reaches it; it must not call CUDA. Captured like any other node. */
    int (*launch_host_func)(weft_cuda_stream_t s, void (*fn)(void *arg), void *arg);
    /* cudaDeviceSynchronize on the current device. */
    int (*device_synchronize)(void);
    /* Threads per block a collective kernel gets unless WEFT_CUDA_THREADS says otherwise: a
     * GPU's warps want hundreds; each emulated thread is an OS thread on a small machine. */
    int kernel_threads;

    /* ---- version 2: memory another process maps (the p2p transport, transports/p2p) ---- */
    /*
     * cuMem-style shareable memory. mem_create: `bytes` of kind WEFT_MEM_DEVICE (the current
     * device: cuMemCreate with the POSIX file descriptor handle type, mapped read/write for the
     * current device and the devices it has peer access to) or WEFT_MEM_HOST_PINNED (host memory
     * mapped for every device: a memfd registered with cudaHostRegister(Portable|Mapped); the
     * kernel's address is pointer_attr's dev_ptr). Blocking; not under capture. Released with
     * mem_release, never free/host_free.
     */
    int (*mem_create)(void **p_p, size_t bytes, int kind);
    /* A new file descriptor (the caller closes it) for the allocation mem_create returned at p:
     * cuMemExportToShareableHandle; pass it to another process with SCM_RIGHTS. */
    int (*mem_export)(int *fd_p, void *p);
    /*
     * Maps an exported allocation into this process (the fd stays the caller's; close it after):
     * cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap, cuMemSetAccess for the
     * current device (or mmap + cudaHostRegister for host memory). kind and bytes as created;
     * owner_dev is the allocating device for WEFT_MEM_DEVICE as this process numbers it
     * (device_by_bus_id of the owner's bus id; ordinals differ between processes under
     * CUDA_VISIBLE_DEVICES), -1 when this process does not see it. 1 when fd is no such
     * allocation or is smaller than bytes; 217 when the current device cannot reach the memory's
     * device (no peer access, or a device this process does not see). The mapping is at a new
     * address.
     */
    int (*mem_import)(void **p_p, int fd, size_t bytes, int kind, int owner_dev);
    /* Frees a mem_create allocation or unmaps an import; the memory lives on while another
     * process still maps it. Does NOT wait for queued work (as cuMemUnmap and NCCL's
     * ncclMemFree; a device synchronise would be illegal during a capture): the caller releases
     * only memory no queued or running kernel uses. Weft's callers: ncclMemFree (the user's
     * buffer, whose work the user waited for, as NCCL requires), a peer's withdrawn registration
     * (the direct kernels' done handshake ended every access to it before the peer could
     * deregister), and communicator teardown (after the internal stream is synchronised).
     * Allowed while a stream captures. */
    int (*mem_release)(void *p);
    /*
     * Legacy IPC, on device memory from malloc (never mem_create's: VMM memory has no legacy
     * handle). ipc_get_handle: cudaIpcGetMemHandle for the allocation holding p. ipc_open_handle:
     * cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess) returns the allocation's base mapped
     * here (opened again in this process: the same address, reference counted); 201 in the
     * process that made the handle, 1 for a handle that names no live allocation, 217 when the
     * current device cannot reach the memory's device. ipc_close_handle: cudaIpcCloseMemHandle on
     * the address open returned. The owner must not free before every importer closed (as CUDA).
     */
    int (*ipc_get_handle)(struct weft_cuda_ipc_handle *h_p, void *p);
    int (*ipc_open_handle)(void **p_p, const struct weft_cuda_ipc_handle *h);
    int (*ipc_close_handle)(void *p);

    /* ---- version 3 ---- */
    /* 1 while pointer_attr says WEFT_MEM_HOST of every address (no CUDA in the process, the none
     * backend once its driver probes are spent): the executor then skips classifying each
     * operation's buffers (~7% of a 2-rank 8 B all-reduce's instructions). */
    int (*host_only)(void);

    /* ---- version 4 ---- */
    /* The facts of device dev (never fails for the none backend: the versions its probe saw,
     * the rest unknown). Cheap enough for each communicator's init. */
    int (*facts)(int dev, struct weft_cuda_facts *f_p);
    /* ---- version 5: device identity across processes ---- */
    /* The uuid and PCI bus id of device dev (an ordinal of this process). Non-blocking. */
    int (*device_id)(int dev, struct weft_cuda_dev_id *id_p);
    /* The ordinal here of the device at bus_id (cudaDeviceGetByPCIBusId); 101 when this process
     * does not see that device (CUDA_VISIBLE_DEVICES left it out). Non-blocking. */
    int (*device_by_bus_id)(int *dev_p, const char *bus_id);
    /* ---- version 6 ---- */
    /*
     * Loads the modules of the n kernels k[0..n-1] into the current device's context now
     * (cudaFuncGetAttributes on each device_fn; entries without this backend's function are
     * skipped). With lazy loading (CUDA 12.2+ default) a kernel's first launch loads its module and
     * may wait for the whole context to be idle: if another kernel of the device spins waiting
     * for a peer that has yet to launch, that launch hangs. Loading every kernel at communicator
     * setup, before any of them runs, keeps loads off the launch path (NCCL does the same).
     */
    int (*load_kernels)(const struct weft_kernel *k, int n);
};

/* The active table (chosen once, lazily; see the top of this file). Never NULL. */
const struct weft_cuda_ops *weft_cuda(void);

/* The backends, for the selection in cuda.c and for tests. */
extern const struct weft_cuda_ops weft_cuda_none_ops;
/* Starts the emulated GPU with ndev devices (first call wins) and returns its table; NULL when
 * its emulated driver is too old for the runtime (WEFT_EMU_DRIVER: weft_cuda_set_unusable). */
const struct weft_cuda_ops *weft_cuda_emu_init(int ndev);
/* The real backend if built and at least one device answers, else NULL (never probes twice). */
const struct weft_cuda_ops *weft_cuda_real_probe(void);
/* cudaGetErrorString's text for the codes above (shared by none and emu). */
const char *weft_cuda_error_text(int err);
/* A backend's probe found a GPU it cannot use (a driver too old for the runtime, ...): why, and
 * the versions it saw; the first call wins. Communicator init reports it (weft_cuda_report). */
void weft_cuda_set_unusable(int driver, int runtime, const char *why);
/* At communicator init: one INFO line with the backend, the driver and runtime versions, the
 * compute mode and MIG state of device dev (-1: none bound); a WARN (once per process) when a
 * GPU is present but unusable, when dev's compute mode is prohibited, or when ranks of
 * other processes on this host (others_on_host > 0) meet an exclusive-process device or a MIG
 * instance. */
void weft_cuda_report(int rank, int dev, int others_on_host);

#ifdef __cplusplus
}
#endif

#endif
