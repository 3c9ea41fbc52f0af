/*
 * The real CUDA backend: the CUDA runtime, linked statically (libcudart_static.a, its symbols
 * kept out of the export table by -Wl,--exclude-libs and the version script), so libnccl.so.2
 * has no DT_NEEDED on libcudart or libcuda and loads on machines without a driver. The one driver
 * function needed (cuPointerGetAttribute, for an allocation's base and size) is fetched through
 * cudaGetDriverEntryPointByVersion; no -lcuda, no dlopen of our own.
 *
 * weft_cuda_real_probe runs once (on the first weft_cuda() that wants the real backend), never in
 * a constructor: cudaGetDeviceCount initialises the driver. Any error there (35 no driver, 34 stub
 * library, 100 no device, 999) or zero devices means "no CUDA" for the rest of the process.
 *
 * Capture uses the mode WEFT_CUDA_CAPTURE_MODE names (default global), as the emulator does.
 * Kernels: k->device_fn takes the params struct by value; launch passes params as its only
 * argument.
 */
#include <pthread.h>
#include <string.h>

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
};

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
