/*
 * The real CUDA backend: the CUDA runtime, linked statically (libcudart_static.a, its symbols
 * kept out of the export table by -Wl,--exclude-libs and the version script), so libnccl.so.2
 * has no DT_NEEDED on libcudart or libcuda and loads on machines without a driver. The driver
 * functions needed (cuPointerGetAttribute, for an allocation's base and size; the cuMem API for
 * memory shared between processes) are fetched through cudaGetDriverEntryPointByVersion; no
 * -lcuda, no dlopen of our own.
 *
 * weft_cuda_real_probe runs once (on the first weft_cuda() that wants the real backend), never in
 * a constructor: cudaGetDeviceCount initialises the driver. Any error there (35 no driver, 34 stub
 * library, 100 no device, 999) or zero devices means "no CUDA" for the rest of the process.
 *
 * Capture uses the mode WEFT_CUDA_CAPTURE_MODE names (default global), as the emulator does.
 * Kernels: k->device_fn takes the params struct by value; launch passes params as its only
 * argument.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/log.h"
#include "core/param.h"
#include "cuda/cuda_ops.h"

WEFT_PARAM_DECL(CudaCaptureMode);

typedef CUresult (*weft_pfn_cu_pointer_get_attribute)(void *data, CUpointer_attribute attr,
                                                      CUdeviceptr ptr);
static weft_pfn_cu_pointer_get_attribute real_cu_pointer_get_attribute;

static int real_get_device_count(int *n_p) { return (int)cudaGetDeviceCount(n_p); }
static int real_get_device(int *dev_p) { return (int)cudaGetDevice(dev_p); }
static int real_set_device(int dev) { return (int)cudaSetDevice(dev); }
static int real_can_access_peer(int *can_p, int dev, int peer)
{
    return (int)cudaDeviceCanAccessPeer(can_p, dev, peer);
}
static int real_enable_peer_access(int peer)
{
    return (int)cudaDeviceEnablePeerAccess(peer, 0);
}
/* Identity across processes: the uuid, and the bus id cudaDeviceGetByPCIBusId maps back to the
 * ordinal of this process (CUDA_VISIBLE_DEVICES numbers devices per process). */
static int real_device_id(int dev, struct weft_cuda_dev_id *id_p)
{
    struct cudaDeviceProp prop;
    struct weft_cuda_dev_id id;
    if (id_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    memset(&id, 0, sizeof(id));
    cudaError_t e = cudaGetDeviceProperties(&prop, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetPCIBusId(id.bus_id, (int)sizeof(id.bus_id), dev);
    if (e != cudaSuccess)
        return (int)e;
    memcpy(id.uuid, prop.uuid.bytes, sizeof(id.uuid));
    id.bus_id[sizeof(id.bus_id) - 1] = '\0';
    *id_p = id;
    return 0;
}
static int real_device_by_bus_id(int *dev_p, const char *bus_id)
{
    return (int)cudaDeviceGetByPCIBusId(dev_p, bus_id);
}
static int real_malloc(void **p_p, size_t bytes) { return (int)cudaMalloc(p_p, bytes); }
static int real_free(void *p) { return (int)cudaFree(p); }
static int real_host_alloc(void **p_p, size_t bytes)
{
    return (int)cudaHostAlloc(p_p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
}
static int real_host_free(void *p) { return (int)cudaFreeHost(p); }

static int real_pointer_attr(struct weft_ptr_attr *attr_p, const void *p)
{
    if (attr_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct weft_ptr_attr out = {WEFT_MEM_HOST, -1, NULL, NULL, 0};
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof(a));
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it so later calls do not see it */
        *attr_p = out;
        return WEFT_CUDA_SUCCESS;
    }
    switch (a.type) {
    case cudaMemoryTypeHost:
        out.kind = WEFT_MEM_HOST_PINNED;
        out.dev_ptr = a.devicePointer;
        break;
    case cudaMemoryTypeDevice:
        out.kind = WEFT_MEM_DEVICE;
        out.device = a.device;
        out.dev_ptr = a.devicePointer;
        break;
    case cudaMemoryTypeManaged:
        out.kind = WEFT_MEM_MANAGED;
        out.device = a.device;
        out.dev_ptr = a.devicePointer;
        break;
    default:
        *attr_p = out;
        return WEFT_CUDA_SUCCESS;
    }
    if (real_cu_pointer_get_attribute != NULL) {
        CUdeviceptr base = 0;
        size_t size = 0;
        CUdeviceptr dp = (CUdeviceptr)(uintptr_t)(out.dev_ptr ? out.dev_ptr : p);
        if (real_cu_pointer_get_attribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dp) ==
                CUDA_SUCCESS &&
            real_cu_pointer_get_attribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dp) ==
                CUDA_SUCCESS) {
            /* For pinned memory the range is in device addresses; map it back to p's space. */
            uintptr_t shift = (uintptr_t)dp - (uintptr_t)p;
            out.base = (void *)((uintptr_t)base - shift);
            out.size = size;
        }
    }
    *attr_p = out;
    return WEFT_CUDA_SUCCESS;
}

static int real_memcpy_async(void *dst, const void *src, size_t bytes, weft_cuda_stream_t s)
{
    return (int)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)s);
}
static int real_memset_async(void *dst, int value, size_t bytes, weft_cuda_stream_t s)
{
    return (int)cudaMemsetAsync(dst, value, bytes, (cudaStream_t)s);
}
static int real_stream_create(weft_cuda_stream_t *s_p)
{
    return (int)cudaStreamCreateWithFlags((cudaStream_t *)s_p, cudaStreamNonBlocking);
}
static int real_stream_destroy(weft_cuda_stream_t s) { return (int)cudaStreamDestroy(s); }
static int real_stream_synchronize(weft_cuda_stream_t s) { return (int)cudaStreamSynchronize(s); }
static int real_stream_query(weft_cuda_stream_t s) { return (int)cudaStreamQuery(s); }
static int real_stream_capturing(weft_cuda_stream_t s, int *capturing_p)
{
    if (capturing_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    enum cudaStreamCaptureStatus st;
    cudaError_t e = cudaStreamIsCapturing((cudaStream_t)s, &st);
    if (e == cudaSuccess)
        *capturing_p = st != cudaStreamCaptureStatusNone;
    return (int)e;
}
static int real_event_create(weft_cuda_event_t *e_p)
{
    return (int)cudaEventCreateWithFlags((cudaEvent_t *)e_p, cudaEventDisableTiming);
}
static int real_event_destroy(weft_cuda_event_t e) { return (int)cudaEventDestroy(e); }
static int real_event_record(weft_cuda_event_t e, weft_cuda_stream_t s)
{
    return (int)cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s);
}
static int real_stream_wait_event(weft_cuda_stream_t s, weft_cuda_event_t e)
{
    return (int)cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0);
}
static int real_event_synchronize(weft_cuda_event_t e) { return (int)cudaEventSynchronize(e); }

static int real_launch(const struct weft_kernel *k, int grid, int block, size_t shared_bytes,
                       const void *params, size_t params_bytes, weft_cuda_stream_t s)
{
    if (k == NULL || k->device_fn == NULL) {
        WEFT_WARN("cudaLaunchKernel: kernel %s was not built for the GPU",
                  k && k->name ? k->name : "(null)");
        return WEFT_CUDA_ERR_INVALID_DEVICE_FN;
    }
    if (grid < 1 || block < 1)
        return WEFT_CUDA_ERR_INVALID_CONFIG;
    (void)params_bytes; /* the runtime knows the parameter's size from the kernel */
    void *args[1] = {(void *)params};
    dim3 g = {(unsigned)grid, 1, 1}, b = {(unsigned)block, 1, 1};
    return (int)cudaLaunchKernel(k->device_fn, g, b, args, shared_bytes, (cudaStream_t)s);
}

static int real_capture_begin(weft_cuda_stream_t s)
{
    int knob = (int)weft_param_CudaCaptureMode();
    enum cudaStreamCaptureMode mode = knob == 1   ? cudaStreamCaptureModeThreadLocal
                                      : knob == 2 ? cudaStreamCaptureModeRelaxed
                                                  : cudaStreamCaptureModeGlobal;
    return (int)cudaStreamBeginCapture((cudaStream_t)s, mode);
}

static int real_capture_end(weft_cuda_stream_t s, weft_cuda_graph_t *g_p)
{
    if (g_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture((cudaStream_t)s, &graph);
    if (e != cudaSuccess)
        return (int)e;
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess)
        return (int)e;
    *g_p = exec;
    return WEFT_CUDA_SUCCESS;
}

static int real_graph_launch(weft_cuda_graph_t g, weft_cuda_stream_t s)
{
    return (int)cudaGraphLaunch((cudaGraphExec_t)g, (cudaStream_t)s);
}
static int real_graph_destroy(weft_cuda_graph_t g) { return (int)cudaGraphExecDestroy(g); }
static const char *real_error_string(int err) { return cudaGetErrorString((cudaError_t)err); }
static int real_launch_host_func(weft_cuda_stream_t s, void (*fn)(void *arg), void *arg)
{
    return (int)cudaLaunchHostFunc((cudaStream_t)s, fn, arg);
}
static int real_device_synchronize(void) { return (int)cudaDeviceSynchronize(); }

/* ---- shareable memory: cuMem with POSIX file descriptors, host memfds, legacy IPC ---------- */

/* Driver entry points of the cuMem API (fetched by real_probe_once; NULL when the driver lacks
 * them: mem_create then returns 801 and the p2p transport uses legacy IPC). */
static CUresult (*real_cu_device_get)(CUdevice *dev, int ordinal);
static CUresult (*real_cu_mem_get_granularity)(size_t *gran, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option);
static CUresult (*real_cu_mem_create)(CUmemGenericAllocationHandle *h, size_t size,
                                      const CUmemAllocationProp *prop, unsigned long long flags);
static CUresult (*real_cu_mem_release)(CUmemGenericAllocationHandle h);
static CUresult (*real_cu_mem_address_reserve)(CUdeviceptr *ptr, size_t size, size_t align,
                                               CUdeviceptr addr, unsigned long long flags);
static CUresult (*real_cu_mem_address_free)(CUdeviceptr ptr, size_t size);
static CUresult (*real_cu_mem_map)(CUdeviceptr ptr, size_t size, size_t offset,
                                   CUmemGenericAllocationHandle h, unsigned long long flags);
static CUresult (*real_cu_mem_unmap)(CUdeviceptr ptr, size_t size);
static CUresult (*real_cu_mem_set_access)(CUdeviceptr ptr, size_t size,
                                          const CUmemAccessDesc *desc, size_t count);
static CUresult (*real_cu_mem_export)(void *shareable, CUmemGenericAllocationHandle h,
                                      CUmemAllocationHandleType type, unsigned long long flags);
static CUresult (*real_cu_mem_import)(CUmemGenericAllocationHandle *h, void *shareable,
                                      CUmemAllocationHandleType type);

static const struct {
    const char *name;
    void **fn;
} real_cumem_entries[] = {
    {"cuDeviceGet", (void **)&real_cu_device_get},
    {"cuMemGetAllocationGranularity", (void **)&real_cu_mem_get_granularity},
    {"cuMemCreate", (void **)&real_cu_mem_create},
    {"cuMemRelease", (void **)&real_cu_mem_release},
    {"cuMemAddressReserve", (void **)&real_cu_mem_address_reserve},
    {"cuMemAddressFree", (void **)&real_cu_mem_address_free},
    {"cuMemMap", (void **)&real_cu_mem_map},
    {"cuMemUnmap", (void **)&real_cu_mem_unmap},
    {"cuMemSetAccess", (void **)&real_cu_mem_set_access},
    {"cuMemExportToShareableHandle", (void **)&real_cu_mem_export},
    {"cuMemImportFromShareableHandle", (void **)&real_cu_mem_import},
};
#define REAL_NCUMEM ((int)(sizeof(real_cumem_entries) / sizeof(real_cumem_entries[0])))
static int real_have_cumem;

/* One shareable allocation or import (a short list: a communicator makes a few). */
struct real_share {
    struct real_share *next;
    void *p;
    size_t size; /* mapped bytes (rounded to the granularity or the page) */
    int kind;
    int fd;      /* host memory: the memfd; -1 for device memory */
    CUmemGenericAllocationHandle handle;
};
static pthread_mutex_t real_share_mu = PTHREAD_MUTEX_INITIALIZER;
static struct real_share *real_shares;

static void real_share_add(struct real_share *r)
{
    pthread_mutex_lock(&real_share_mu);
    r->next = real_shares;
    real_shares = r;
    pthread_mutex_unlock(&real_share_mu);
}

/* Finds (remove = 0) or unlinks (remove = 1) the entry of p. */
static struct real_share *real_share_find(void *p, int remove)
{
    pthread_mutex_lock(&real_share_mu);
    struct real_share **pp = &real_shares;
    while (*pp != NULL && (*pp)->p != p)
        pp = &(*pp)->next;
    struct real_share *r = *pp;
    if (r != NULL && remove)
        *pp = r->next;
    pthread_mutex_unlock(&real_share_mu);
    return r;
}

static int real_cu_err(CUresult r)
{
    /* The driver's codes for these calls match the runtime's where Weft looks at them. */
    return r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_NOT_SUPPORTED ? WEFT_CUDA_ERR_NOT_SUPPORTED
                                                                   : (int)r;
}

static void real_dev_prop(CUmemAllocationProp *prop, int dev)
{
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Reserves an address range for handle h and maps it, readable and writable from the current
 * device and, for the owner, from every device with peer access to it. */
static int real_map_handle(struct real_share *r, int owner_dev, int all_peers)
{
    CUdeviceptr ptr = 0;
    CUmemAllocationProp prop;
    size_t gran = 0;
    real_dev_prop(&prop, owner_dev);
    CUresult e = real_cu_mem_get_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (e != CUDA_SUCCESS)
        return real_cu_err(e);
    e = real_cu_mem_address_reserve(&ptr, r->size, gran, 0, 0);
    if (e != CUDA_SUCCESS)
        return real_cu_err(e);
    e = real_cu_mem_map(ptr, r->size, 0, r->handle, 0);
    if (e != CUDA_SUCCESS) {
        real_cu_mem_address_free(ptr, r->size);
        return real_cu_err(e);
    }
    int cur = 0, n = 0;
    cudaGetDevice(&cur);
    cudaGetDeviceCount(&n);
    CUmemAccessDesc desc[64];
    size_t nd = 0;
    for (int d = 0; d < n && nd < 64; d++) {
        int can = d == cur;
        if (!can && all_peers && d != owner_dev)
            cudaDeviceCanAccessPeer(&can, d, owner_dev);
        if (!can)
            continue;
        memset(&desc[nd], 0, sizeof(desc[nd]));
        desc[nd].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[nd].location.id = d;
        desc[nd].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        nd++;
    }
    e = real_cu_mem_set_access(ptr, r->size, desc, nd);
    if (e != CUDA_SUCCESS) {
        real_cu_mem_unmap(ptr, r->size);
        real_cu_mem_address_free(ptr, r->size);
        return e == CUDA_ERROR_INVALID_DEVICE ? WEFT_CUDA_ERR_PEER_UNSUPPORTED : real_cu_err(e);
    }
    r->p = (void *)(uintptr_t)ptr;
    return 0;
}

/* Host memory another process maps: a memfd, mapped shared and registered with CUDA. */
static int real_map_host(struct real_share *r)
{
    void *p = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (p == MAP_FAILED) {
        WEFT_WARN("mmap of %zu bytes of shareable host memory failed: %s", r->size,
                  strerror(errno));
        return WEFT_CUDA_ERR_MAP_FAILED;
    }
    cudaError_t e = cudaHostRegister(p, r->size, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
        munmap(p, r->size);
        return (int)e;
    }
    r->p = p;
    return 0;
}

/*
 * The part real_mem_create and real_mem_import share: checks the arguments and makes an entry of
 * `kind` whose size is `bytes` rounded up to the page (host) or to the cuMem granularity of device
 * dev (device). *r_p is set only on success; real_share_done() finishes it.
 */
static int real_share_new(int kind, size_t bytes, int dev, struct real_share **r_p)
{
    if (r_p == NULL || bytes == 0 || (kind != WEFT_MEM_DEVICE && kind != WEFT_MEM_HOST_PINNED))
        return WEFT_CUDA_ERR_INVALID_VALUE;
    if (kind == WEFT_MEM_DEVICE && !real_have_cumem)
        return WEFT_CUDA_ERR_NOT_SUPPORTED;
    size_t unit = (size_t)sysconf(_SC_PAGESIZE);
    if (kind == WEFT_MEM_DEVICE) {
        CUmemAllocationProp prop;
        real_dev_prop(&prop, dev);
        CUresult e = real_cu_mem_get_granularity(&unit, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (e != CUDA_SUCCESS)
            return real_cu_err(e);
    }
    struct real_share *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    r->kind = kind;
    r->fd = -1;
    r->size = (bytes + unit - 1) / unit * unit;
    *r_p = r;
    return 0;
}

/* Maps r->handle (just created or imported: res says whether that worked); releases it if the
 * mapping fails. */
static int real_share_map_device(struct real_share *r, CUresult res, int owner_dev, int all_peers)
{
    if (res != CUDA_SUCCESS)
        return real_cu_err(res);
    int err = real_map_handle(r, owner_dev, all_peers);
    if (err != 0)
        real_cu_mem_release(r->handle);
    return err;
}

/* Lists r and returns its address in *p_p when res is 0; frees it otherwise. Returns res. */
static int real_share_done(struct real_share *r, int res, void **p_p)
{
    if (res != 0) {
        if (r->fd >= 0)
            close(r->fd);
        free(r);
        return res;
    }
    real_share_add(r);
    *p_p = r->p;
    return 0;
}

static int real_mem_create(void **p_p, size_t bytes, int kind)
{
    struct real_share *r;
    int dev = 0, res;
    if (kind == WEFT_MEM_DEVICE)
        cudaGetDevice(&dev);
    res = p_p == NULL ? WEFT_CUDA_ERR_INVALID_VALUE : real_share_new(kind, bytes, dev, &r);
    if (res != 0)
        return res;
    if (kind == WEFT_MEM_HOST_PINNED) {
        r->fd = memfd_create("weft-p2p-host", MFD_CLOEXEC);
        if (r->fd < 0 || ftruncate(r->fd, (off_t)r->size) != 0) {
            WEFT_WARN("shareable host memory of %zu bytes: %s", bytes, strerror(errno));
            res = WEFT_CUDA_ERR_OUT_OF_MEMORY;
        } else {
            res = real_map_host(r);
        }
    } else {
        CUmemAllocationProp prop;
        real_dev_prop(&prop, dev);
        res = real_share_map_device(r, real_cu_mem_create(&r->handle, r->size, &prop, 0), dev, 1);
    }
    return real_share_done(r, res, p_p);
}

static int real_mem_export(int *fd_p, void *p)
{
    struct real_share *r = real_share_find(p, 0);
    if (fd_p == NULL || r == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    if (r->kind == WEFT_MEM_HOST_PINNED) {
        int fd = fcntl(r->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            return WEFT_CUDA_ERR_INVALID_VALUE;
        *fd_p = fd;
        return 0;
    }
    int fd = -1;
    CUresult e = real_cu_mem_export(&fd, r->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (e != CUDA_SUCCESS)
        return real_cu_err(e);
    *fd_p = fd;
    return 0;
}

static int real_mem_import(void **p_p, int fd, size_t bytes, int kind, int owner_dev)
{
    struct real_share *r;
    /* Not visible here: the handle knows its device; the granularity is asked of ours. */
    if (owner_dev < 0)
        cudaGetDevice(&owner_dev);
    int res = p_p == NULL || fd < 0 ? WEFT_CUDA_ERR_INVALID_VALUE
                                    : real_share_new(kind, bytes, owner_dev, &r);
    if (res != 0)
        return res;
    if (kind == WEFT_MEM_HOST_PINNED) {
        r->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        res = r->fd < 0 ? WEFT_CUDA_ERR_INVALID_VALUE : real_map_host(r);
    } else {
        CUresult e = real_cu_mem_import(&r->handle, (void *)(uintptr_t)fd,
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        res = real_share_map_device(r, e, owner_dev, 0);
    }
    return real_share_done(r, res, p_p);
}

static int real_mem_release(void *p)
{
    if (p == NULL)
        return 0;
    struct real_share *r = real_share_find(p, 1);
    if (r == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    /*
     * No device synchronise (there was one): it is illegal while any stream of the process
     * captures (global mode: 900, and the capture is invalidated), stalls every stream of the
     * device, and with several ranks on the device may wait for a kernel that needs a launch this
     * thread has not issued yet. Like cuMemUnmap, and NCCL's ncclMemFree, this does not wait for
     * queued work: the callers release only memory none uses (see mem_release in cuda_ops.h).
     */
    int res = 0;
    if (r->kind == WEFT_MEM_HOST_PINNED) {
        res = (int)cudaHostUnregister(r->p);
        munmap(r->p, r->size);
        close(r->fd);
    } else {
        CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)r->p;
        res = real_cu_err(real_cu_mem_unmap(ptr, r->size));
        real_cu_mem_address_free(ptr, r->size);
        real_cu_mem_release(r->handle);
    }
    free(r);
    return res;
}

static int real_ipc_get_handle(struct weft_cuda_ipc_handle *h_p, void *p)
{
    _Static_assert(sizeof(cudaIpcMemHandle_t) == WEFT_CUDA_IPC_HANDLE_BYTES, "IPC handle size");
    if (h_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    if (e == cudaSuccess)
        memcpy(h_p->bytes, &h, sizeof(h));
    return (int)e;
}

static int real_ipc_open_handle(void **p_p, const struct weft_cuda_ipc_handle *hp)
{
    if (p_p == NULL || hp == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    cudaIpcMemHandle_t h;
    memcpy(&h, hp->bytes, sizeof(h));
    return (int)cudaIpcOpenMemHandle(p_p, h, cudaIpcMemLazyEnablePeerAccess);
}

static int real_ipc_close_handle(void *p) { return (int)cudaIpcCloseMemHandle(p); }

/* Device memory exists here: every buffer is classified. */
static int real_host_only(void)
{
    return 0;
}

static int real_facts(int dev, struct weft_cuda_facts *f_p);
/* cudaFuncGetAttributes loads a kernel's module into the current context (lazy loading's load,
 * done here at communicator setup instead of at the first launch). */
static int real_load_kernels(const struct weft_kernel *k, int n)
{
    for (int i = 0; i < n; i++) {
        if (k[i].device_fn == NULL)
            continue;
        struct cudaFuncAttributes attr;
        cudaError_t err = cudaFuncGetAttributes(&attr, k[i].device_fn);
        if (err != cudaSuccess) {
            WEFT_WARN("cudaFuncGetAttributes (loading kernel %s): %s (%d)", k[i].name,
                      cudaGetErrorString(err), (int)err);
            return (int)err;
        }
    }
    return cudaSuccess;
}

static const struct weft_cuda_ops real_ops = {
    .version = WEFT_CUDA_OPS_VERSION,
    .name = "cuda",
    .get_device_count = real_get_device_count,
    .get_device = real_get_device,
    .set_device = real_set_device,
    .can_access_peer = real_can_access_peer,
    .enable_peer_access = real_enable_peer_access,
    .malloc = real_malloc,
    .free = real_free,
    .host_alloc = real_host_alloc,
    .host_free = real_host_free,
    .pointer_attr = real_pointer_attr,
    .memcpy_async = real_memcpy_async,
    .memset_async = real_memset_async,
    .stream_create = real_stream_create,
    .stream_destroy = real_stream_destroy,
    .stream_synchronize = real_stream_synchronize,
    .stream_query = real_stream_query,
    .stream_capturing = real_stream_capturing,
    .event_create = real_event_create,
    .event_destroy = real_event_destroy,
    .event_record = real_event_record,
    .stream_wait_event = real_stream_wait_event,
    .event_synchronize = real_event_synchronize,
    .launch = real_launch,
    .capture_begin = real_capture_begin,
    .capture_end = real_capture_end,
    .graph_launch = real_graph_launch,
    .graph_destroy = real_graph_destroy,
    .error_string = real_error_string,
    .launch_host_func = real_launch_host_func,
    .device_synchronize = real_device_synchronize,
    .kernel_threads = 256,
    .mem_create = real_mem_create,
    .mem_export = real_mem_export,
    .mem_import = real_mem_import,
    .mem_release = real_mem_release,
    .ipc_get_handle = real_ipc_get_handle,
    .ipc_open_handle = real_ipc_open_handle,
    .ipc_close_handle = real_ipc_close_handle,
    .host_only = real_host_only,
    .facts = real_facts,
    .device_id = real_device_id,
    .device_by_bus_id = real_device_by_bus_id,
    .load_kernels = real_load_kernels,
};

static int real_facts(int dev, struct weft_cuda_facts *f_p)
{
    if (f_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct weft_cuda_facts f = {0, 0, -1, -1, ""};
    cudaDriverGetVersion(&f.driver);
    cudaRuntimeGetVersion(&f.runtime);
    int mode = -1;
    if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, dev) == cudaSuccess)
        f.compute_mode = mode;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
        snprintf(f.name, sizeof(f.name), "%.*s", (int)sizeof(f.name) - 1, prop.name);
        /* A MIG instance's name carries its profile: "NVIDIA H100 80GB HBM3 MIG 1g.10gb". */
        f.mig = strstr(prop.name, " MIG ") != NULL;
    }
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible != NULL && strstr(visible, "MIG-") != NULL)
        f.mig = 1;
    (void)cudaGetLastError(); /* a failed query above is not sticky: clear it */
    *f_p = f;
    return 0;
}

static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static const struct weft_cuda_ops *real_found;

static void real_probe_once(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        WEFT_INFO(WEFT_LOG_INIT, "CUDA unavailable: cudaGetDeviceCount returned %d (%s)", (int)e,
                  cudaGetErrorString(e));
        (void)cudaGetLastError();
        /* A GPU present but unusable is reported at communicator init (weft_cuda_report): a
         * driver older than the static runtime needs (35 with a driver version), a driver
         * library missing beside the device nodes, or any other failure but "no device". */
        int drv = 0, rt = 0;
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        char why[256];
        why[0] = '\0';
        if (e == cudaErrorInsufficientDriver && drv > 0)
            snprintf(why, sizeof(why), "the driver supports CUDA %d.%d, older than this build's "
                     "static CUDA %d.%d runtime needs (cudaGetDeviceCount: "
                     "cudaErrorInsufficientDriver (%d), \"%s\"): install driver 580 or newer",
                     drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, (int)e,
                     cudaGetErrorString(e));
        else if (e == cudaErrorInsufficientDriver && access("/dev/nvidiactl", F_OK) == 0)
            snprintf(why, sizeof(why), "/dev/nvidiactl exists but no CUDA driver library "
                     "(libcuda.so.1) loads (cudaGetDeviceCount: %s, %d)", cudaGetErrorString(e),
                     (int)e);
        else if (e != cudaErrorInsufficientDriver && e != cudaErrorNoDevice)
            snprintf(why, sizeof(why), "cudaGetDeviceCount failed: %s (%d)",
                     cudaGetErrorString(e), (int)e);
        if (why[0] != '\0')
            weft_cuda_set_unusable(drv, rt, why);
        (void)cudaGetLastError();
        return;
    }
    if (n < 1) {
        WEFT_INFO(WEFT_LOG_INIT, "CUDA: no device");
        return;
    }
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        real_cu_pointer_get_attribute = (weft_pfn_cu_pointer_get_attribute)fn;
    else
        WEFT_INFO(WEFT_LOG_INIT, "CUDA: cuPointerGetAttribute not found; pointer bases unknown");
    int have = 0;
    for (int i = 0; i < REAL_NCUMEM; i++) {
        fn = NULL;
        q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion(real_cumem_entries[i].name, &fn, 12000,
                                             cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess && fn != NULL) {
            *real_cumem_entries[i].fn = fn;
            have++;
        }
    }
    real_have_cumem = have == REAL_NCUMEM;
    if (!real_have_cumem)
        WEFT_INFO(WEFT_LOG_INIT, "CUDA: the driver lacks the cuMem API (%d of %d entry points); "
                  "processes share device memory through legacy IPC", have, REAL_NCUMEM);
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    WEFT_INFO(WEFT_LOG_INIT, "CUDA: %d device%s, runtime %d, driver %d", n, n == 1 ? "" : "s", rt,
              drv);
    real_found = &real_ops;
}

const struct weft_cuda_ops *weft_cuda_real_probe(void)
{
    pthread_once(&real_once, real_probe_once);
    return real_found;
}
