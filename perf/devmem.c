/*
 * Run-time binding of the perf tools' device memory (see devmem.h): Weft's weftCuda* forwards when
 * the loaded libnccl.so.2 is Weft's, else a dlopen'ed CUDA runtime, else nothing.
 */
#include "devmem.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* cudaError_t / enum values of the CUDA runtime API that the cudart adapters pass. */
#define PERF_CUDA_MEMCPY_DEFAULT 4      /* cudaMemcpyDefault: direction from the pointers (UVA) */
#define PERF_CUDA_STREAM_NON_BLOCKING 1 /* cudaStreamNonBlocking */
#define PERF_CUDA_CAPTURE_THREAD_LOCAL 1 /* cudaStreamCaptureModeThreadLocal, as nccl-tests */
#define PERF_CUDA_ERROR_INVALID_VALUE 1
#define PERF_CUDA_ERROR_NO_DEVICE 100

static struct perf_devmem devmem = {.name = "none", .kind = "none"};
static char devmem_why[256];
static pthread_once_t devmem_once = PTHREAD_ONCE_INIT;

/* ---- none: every slot fails (ndev is 0, so the driver never calls them) ---- */

static int none_set_device(int dev)
{
    (void)dev;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_malloc(void **p_p, size_t bytes)
{
    (void)p_p;
    (void)bytes;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_ptr(void *p)
{
    (void)p;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_memcpy(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_memcpy_async(void *dst, const void *src, size_t bytes, cudaStream_t s)
{
    (void)s;
    return none_memcpy(dst, src, bytes);
}
static int none_memset(void *p, int value, size_t bytes)
{
    (void)p;
    (void)value;
    (void)bytes;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_stream_create(cudaStream_t *s_p)
{
    (void)s_p;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_stream(cudaStream_t s)
{
    (void)s;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_capture_end(cudaStream_t s, perf_graph_t *g_p)
{
    (void)s;
    (void)g_p;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static int none_graph_launch(perf_graph_t g, cudaStream_t s)
{
    (void)g;
    (void)s;
    return PERF_CUDA_ERROR_NO_DEVICE;
}
static void none_describe(int dev, char *out, size_t len)
{
    (void)dev;
    snprintf(out, len, "[host] host memory");
}
static const char *none_error_string(int err)
{
    return err == 0 ? "no error" : "no CUDA device runtime";
}

static void devmem_set_none(void)
{
    devmem = (struct perf_devmem){
        .name = "none",
        .kind = "none",
        .ndev = 0,
        .set_device = none_set_device,
        .malloc = none_malloc,
        .free = none_ptr,
        .memcpy = none_memcpy,
        .memcpy_async = none_memcpy_async,
        .memset = none_memset,
        .stream_create = none_stream_create,
        .stream_destroy = none_stream,
        .stream_synchronize = none_stream,
        .capture_begin = none_stream,
        .capture_end = none_capture_end,
        .graph_launch = none_graph_launch,
        .graph_destroy = none_ptr,
        .describe = none_describe,
        .error_string = none_error_string,
    };
}

/* Looks up every name of a table; on the first missing one says which and returns -1. */
static int bind_all(void *handle, const char *const *names, void **slots, size_t n,
                    const char *lib)
{
    for (size_t i = 0; i < n; i++) {
        slots[i] = dlsym(handle, names[i]);
        if (slots[i] == NULL) {
            snprintf(devmem_why, sizeof(devmem_why), "%s has no %s", lib, names[i]);
            return -1;
        }
    }
    return 0;
}

/* ---- weft: include/weft.h's forwards have the slots' signatures, so they are the slots ---- */

static struct {
    const char *(*backend)(void);
    int (*get_device_count)(int *n_p);
} weft_extra;

static void weft_describe(int dev, char *out, size_t len)
{
    if (strcmp(devmem.kind, "emu") == 0)
        snprintf(out, len, "[emu:%d] Weft emulated GPU", dev);
    else
        snprintf(out, len, "[cuda:%d] CUDA device (Weft)", dev);
}

static int devmem_bind_weft(void)
{
    static const char *const names[] = {
        "weftCudaGetDeviceCount", "weftCudaSetDevice",         "weftCudaMalloc",
        "weftCudaFree",           "weftCudaMemcpy",            "weftCudaMemcpyAsync",
        "weftCudaMemset",         "weftCudaStreamCreate",      "weftCudaStreamDestroy",
        "weftCudaStreamSynchronize", "weftCudaStreamBeginCapture", "weftCudaStreamEndCapture",
        "weftCudaGraphLaunch",    "weftCudaGraphDestroy",      "weftCudaGetErrorString",
    };
    void *s[sizeof(names) / sizeof(names[0])];
    int n = 0;

    weft_extra.backend = (const char *(*)(void))dlsym(RTLD_DEFAULT, "weftCudaBackend");
    if (bind_all(RTLD_DEFAULT, names, s, sizeof(names) / sizeof(names[0]), "libnccl.so.2") != 0)
        return -1;
    weft_extra.get_device_count = (int (*)(int *))s[0];
    devmem.name = "weft";
    devmem.kind = weft_extra.backend();
    devmem.set_device = (int (*)(int))s[1];
    devmem.malloc = (int (*)(void **, size_t))s[2];
    devmem.free = (int (*)(void *))s[3];
    devmem.memcpy = (int (*)(void *, const void *, size_t))s[4];
    devmem.memcpy_async = (int (*)(void *, const void *, size_t, cudaStream_t))s[5];
    devmem.memset = (int (*)(void *, int, size_t))s[6];
    devmem.stream_create = (int (*)(cudaStream_t *))s[7];
    devmem.stream_destroy = (int (*)(cudaStream_t))s[8];
    devmem.stream_synchronize = (int (*)(cudaStream_t))s[9];
    devmem.capture_begin = (int (*)(cudaStream_t))s[10];
    devmem.capture_end = (int (*)(cudaStream_t, perf_graph_t *))s[11];
    devmem.graph_launch = (int (*)(perf_graph_t, cudaStream_t))s[12];
    devmem.graph_destroy = (int (*)(perf_graph_t))s[13];
    devmem.error_string = (const char *(*)(int))s[14];
    devmem.describe = weft_describe;
    if (devmem.kind == NULL || strcmp(devmem.kind, "none") == 0) {
        snprintf(devmem_why, sizeof(devmem_why), "Weft reports no CUDA backend (WEFT_CUDA)");
        return -1;
    }
    if (weft_extra.get_device_count(&n) != 0 || n < 1) {
        snprintf(devmem_why, sizeof(devmem_why), "Weft's %s backend reports no device",
                 devmem.kind);
        return -1;
    }
    devmem.ndev = n;
    return 0;
}

/* ---- cudart: adapters from the slots to the CUDA runtime API ---- */

static struct {
    int (*get_device_count)(int *n);
    int (*set_device)(int dev);
    int (*malloc)(void **p, size_t bytes);
    int (*free)(void *p);
    int (*memcpy)(void *dst, const void *src, size_t bytes, int kind);
    int (*memcpy_async)(void *dst, const void *src, size_t bytes, int kind, cudaStream_t s);
    int (*memset)(void *p, int value, size_t bytes);
    int (*stream_create_with_flags)(cudaStream_t *s, unsigned flags);
    int (*stream_destroy)(cudaStream_t s);
    int (*stream_synchronize)(cudaStream_t s);
    int (*begin_capture)(cudaStream_t s, int mode);
    int (*end_capture)(cudaStream_t s, void **graph);
    /* WithFlags: one signature from CUDA 11.4 to 13 (plain cudaGraphInstantiate changed in 12) */
    int (*graph_instantiate)(void **exec, void *graph, unsigned long long flags);
    int (*graph_launch)(void *exec, cudaStream_t s);
    int (*graph_exec_destroy)(void *exec);
    int (*graph_destroy)(void *graph);
    int (*device_get_pci_bus_id)(char *id, int len, int dev);
    const char *(*get_error_string)(int err);
} cudart;

static int cudart_memcpy(void *dst, const void *src, size_t bytes)
{
    return cudart.memcpy(dst, src, bytes, PERF_CUDA_MEMCPY_DEFAULT);
}

static int cudart_memcpy_async(void *dst, const void *src, size_t bytes, cudaStream_t s)
{
    return cudart.memcpy_async(dst, src, bytes, PERF_CUDA_MEMCPY_DEFAULT, s);
}

static int cudart_stream_create(cudaStream_t *s_p)
{
    return cudart.stream_create_with_flags(s_p, PERF_CUDA_STREAM_NON_BLOCKING);
}

static int cudart_capture_begin(cudaStream_t s)
{
    return cudart.begin_capture(s, PERF_CUDA_CAPTURE_THREAD_LOCAL);
}

/* The captured graph is instantiated at once and only the executable one is kept. */
static int cudart_capture_end(cudaStream_t s, perf_graph_t *g_p)
{
    void *graph = NULL, *exec = NULL;
    int err = cudart.end_capture(s, &graph);

    if (err != 0)
        return err;
    err = cudart.graph_instantiate(&exec, graph, 0);
    cudart.graph_destroy(graph);
    if (err == 0)
        *g_p = exec;
    return err;
}

static int cudart_graph_launch(perf_graph_t g, cudaStream_t s)
{
    return cudart.graph_launch(g, s);
}

static int cudart_graph_destroy(perf_graph_t g)
{
    return cudart.graph_exec_destroy(g);
}

static void cudart_describe(int dev, char *out, size_t len)
{
    char bus[32] = "";

    if (cudart.device_get_pci_bus_id(bus, (int)sizeof(bus), dev) != 0)
        snprintf(bus, sizeof(bus), "cuda:%d", dev);
    snprintf(out, len, "[%s] CUDA device", bus);
}

static int devmem_bind_cudart(void)
{
    static const char *const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    static const char *const names[] = {
        "cudaGetDeviceCount",      "cudaSetDevice",           "cudaMalloc",
        "cudaFree",                "cudaMemcpy",              "cudaMemcpyAsync",
        "cudaMemset",              "cudaStreamCreateWithFlags", "cudaStreamDestroy",
        "cudaStreamSynchronize",   "cudaStreamBeginCapture",  "cudaStreamEndCapture",
        "cudaGraphInstantiateWithFlags", "cudaGraphLaunch",   "cudaGraphExecDestroy",
        "cudaGraphDestroy",        "cudaDeviceGetPCIBusId",   "cudaGetErrorString",
    };
    void *handle = NULL;
    const char *lib = NULL;
    int n = 0, err;

    _Static_assert(sizeof(cudart) == sizeof(names) / sizeof(names[0]) * sizeof(void *),
                   "one name per cudart slot, in order");
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]) && handle == NULL; i++) {
        handle = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        lib = libs[i];
    }
    if (handle == NULL) {
        snprintf(devmem_why, sizeof(devmem_why), "no CUDA runtime (libcudart.so.13/.12) found");
        return -1;
    }
    /* The struct is a row of function pointers in the order of names (asserted above). */
    if (bind_all(handle, names, (void **)&cudart, sizeof(names) / sizeof(names[0]), lib) != 0)
        goto err_close;
    err = cudart.get_device_count(&n);
    if (err != 0 || n < 1) {
        snprintf(devmem_why, sizeof(devmem_why), "%s reports no device: %s", lib,
                 err ? cudart.get_error_string(err) : "0 devices");
        goto err_close;
    }
    devmem = (struct perf_devmem){
        .name = "cudart",
        .kind = "cuda",
        .ndev = n,
        .set_device = cudart.set_device,
        .malloc = cudart.malloc,
        .free = cudart.free,
        .memcpy = cudart_memcpy,
        .memcpy_async = cudart_memcpy_async,
        .memset = cudart.memset,
        .stream_create = cudart_stream_create,
        .stream_destroy = cudart.stream_destroy,
        .stream_synchronize = cudart.stream_synchronize,
        .capture_begin = cudart_capture_begin,
        .capture_end = cudart_capture_end,
        .graph_launch = cudart_graph_launch,
        .graph_destroy = cudart_graph_destroy,
        .describe = cudart_describe,
        .error_string = cudart.get_error_string,
    };
    return 0;
err_close:
    dlclose(handle);
    return -1;
}

static void devmem_bind(void)
{
    devmem_set_none();
    /* Weft's library is the one loaded: its own device runtime, never a second CUDA runtime. */
    if (dlsym(RTLD_DEFAULT, "weftCudaBackend") != NULL) {
        if (devmem_bind_weft() != 0)
            devmem_set_none();
        return;
    }
    /* A Weft without a device runtime runs on host memory only: device pointers from a CUDA
     * runtime of our own would reach its host executor. */
    if (dlsym(RTLD_DEFAULT, "weftLaunchInfo") != NULL) {
        snprintf(devmem_why, sizeof(devmem_why),
                 "this Weft libnccl.so.2 has no device runtime (no weftCudaBackend)");
        return;
    }
    if (devmem_bind_cudart() != 0)
        devmem_set_none();
}

const struct perf_devmem *perf_devmem_get(const char **why_p)
{
    pthread_once(&devmem_once, devmem_bind);
    if (why_p != NULL)
        *why_p = devmem_why;
    return &devmem;
}
