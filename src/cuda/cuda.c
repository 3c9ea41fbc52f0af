/*
 * weft_cuda(): the choice of the CUDA backend (see cuda_ops.h), the "none" table and the error
 * texts. The choice is made once, on the first call (pthread_once), never in a constructor: the
 * probe of the real runtime initialises the driver, which a CPU-only job must not pay for.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/param.h"
#include "cuda/cuda_ops.h"

WEFT_PARAM_STR(Cuda, "WEFT_CUDA", "auto",
               "CUDA backend: auto (the real GPU if one answers, else none), 0/none, cuda, "
               "emu:N (N emulated devices in this process)");

WEFT_PARAM(CudaCaptureMode, "WEFT_CUDA_CAPTURE_MODE", 0,
           "capture mode of every stream capture, as cudaStreamCaptureMode: 0 global, "
           "1 thread-local, 2 relaxed");

const char *weft_cuda_error_text(int err)
{
    switch (err) {
    case WEFT_CUDA_SUCCESS: return "no error";
    case WEFT_CUDA_ERR_INVALID_VALUE: return "invalid argument";
    case WEFT_CUDA_ERR_OUT_OF_MEMORY: return "out of memory";
    case WEFT_CUDA_ERR_INVALID_CONFIG: return "invalid configuration argument";
    case WEFT_CUDA_ERR_NO_DRIVER:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case WEFT_CUDA_ERR_INVALID_DEVICE_FN: return "invalid device function";
    case WEFT_CUDA_ERR_NO_DEVICE: return "no CUDA-capable device is detected";
    case WEFT_CUDA_ERR_INVALID_DEVICE: return "invalid device ordinal";
    case WEFT_CUDA_ERR_INVALID_CONTEXT: return "invalid device context";
    case WEFT_CUDA_ERR_MAP_FAILED: return "mapping of buffer object failed";
    case WEFT_CUDA_ERR_PEER_UNSUPPORTED: return "peer access is not supported between these two devices";
    case WEFT_CUDA_ERR_INVALID_HANDLE: return "invalid resource handle";
    case WEFT_CUDA_ERR_ILLEGAL_STATE:
        return "the operation cannot be performed in the present state";
    case WEFT_CUDA_ERR_NOT_READY: return "device not ready";
    case WEFT_CUDA_ERR_LAUNCH_RESOURCES: return "too many resources requested for launch";
    case WEFT_CUDA_ERR_LAUNCH_TIMEOUT: return "the launch timed out and was terminated";
    case WEFT_CUDA_ERR_PEER_ALREADY_ENABLED:
        return "peer access is already enabled";
    case WEFT_CUDA_ERR_ASSERT: return "device-side assert triggered";
    case WEFT_CUDA_ERR_LAUNCH_FAILURE: return "unspecified launch failure";
    case WEFT_CUDA_ERR_NOT_SUPPORTED: return "operation not supported";
    case WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED:
        return "operation not permitted when stream is capturing";
    case WEFT_CUDA_ERR_CAPTURE_INVALIDATED:
        return "operation failed due to a previous error during capture";
    case WEFT_CUDA_ERR_CAPTURE_UNMATCHED:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "unknown error";
    }
}

/* ---- none: no CUDA in this process ----------------------------------------------------------- */

#define NONE_ERR WEFT_CUDA_ERR_NO_DRIVER

static void none_probe_driver(void);

static int none_get_device_count(int *n_p)
{
    if (n_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    none_probe_driver();
    *n_p = 0;
    return WEFT_CUDA_SUCCESS;
}
static int none_int_p(int *p) { (void)p; return NONE_ERR; }
static int none_int(int v) { (void)v; return NONE_ERR; }
static int none_can_access_peer(int *can_p, int dev, int peer)
{
    (void)can_p, (void)dev, (void)peer;
    return NONE_ERR;
}
static int none_alloc(void **p_p, size_t bytes) { (void)p_p, (void)bytes; return NONE_ERR; }
static int none_ptr(void *p) { (void)p; return NONE_ERR; }
/*
 * The none backend still tells CUDA memory from host memory when the process itself uses CUDA
 * (a PyTorch program on a Weft built without the toolkit, or run with WEFT_CUDA=0): through the
 * driver the process has already loaded (RTLD_NOLOAD: a process that never loaded libcuda has no
 * device pointers, and we load nothing). Such a buffer then fails the call with
 * ncclInvalidArgument and a message instead of being read as host memory (SIGSEGV). Only the
 * driver API's stable C entry point is used, declared here with its documented values.
 */
typedef int (*none_cu_pointer_get_attribute_fn)(void *data, int attribute, uintptr_t ptr);
#define NONE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define NONE_CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define NONE_CU_MEMORYTYPE_DEVICE 2
#define NONE_CU_MEMORYTYPE_UNIFIED 4

static none_cu_pointer_get_attribute_fn none_cu_attr;
static uint32_t none_driver_probes;
/* Pointer queries that look for the driver (device counts always do). */
#define NONE_POINTER_PROBES 16

/* Looks for a loaded libcuda now and then: at every device count (each communicator's init asks)
 * and on the first pointer queries, since the program may start CUDA after loading us. */
static void none_probe_driver(void)
{
    if (__atomic_load_n(&none_cu_attr, __ATOMIC_ACQUIRE) != NULL)
        return;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        return;
    none_cu_pointer_get_attribute_fn fn =
        (none_cu_pointer_get_attribute_fn)(uintptr_t)dlsym(h, "cuPointerGetAttribute");
    if (fn != NULL)
        __atomic_store_n(&none_cu_attr, fn, __ATOMIC_RELEASE);
    /* the handle stays open: the program's own reference keeps the driver loaded anyway */
}

static int none_pointer_attr(struct weft_ptr_attr *attr_p, const void *p)
{
    if (attr_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct weft_ptr_attr a = {WEFT_MEM_HOST, -1, NULL, NULL, 0};
    none_cu_pointer_get_attribute_fn fn = __atomic_load_n(&none_cu_attr, __ATOMIC_ACQUIRE);
    /* the plain load first: once the probes are spent, an atomic add on every buffer of every
     * operation was 8% of a 1-rank 8 B all-reduce (perf: the lock xadd, 82% of this function) */
    if (fn == NULL && __atomic_load_n(&none_driver_probes, __ATOMIC_RELAXED) < NONE_POINTER_PROBES &&
        __atomic_fetch_add(&none_driver_probes, 1, __ATOMIC_RELAXED) < NONE_POINTER_PROBES) {
        none_probe_driver();
        fn = __atomic_load_n(&none_cu_attr, __ATOMIC_ACQUIRE);
    }
    unsigned type = 0, managed = 0;
    if (fn != NULL && fn(&type, NONE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (uintptr_t)p) == 0) {
        if (fn(&managed, NONE_CU_POINTER_ATTRIBUTE_IS_MANAGED, (uintptr_t)p) == 0 && managed)
            a.kind = WEFT_MEM_MANAGED;
        else if (type == NONE_CU_MEMORYTYPE_DEVICE || type == NONE_CU_MEMORYTYPE_UNIFIED)
            a.kind = WEFT_MEM_DEVICE;
    }
    *attr_p = a;
    return WEFT_CUDA_SUCCESS;
}
static int none_host_only(void)
{
    return __atomic_load_n(&none_cu_attr, __ATOMIC_ACQUIRE) == NULL &&
           __atomic_load_n(&none_driver_probes, __ATOMIC_RELAXED) >= NONE_POINTER_PROBES;
}
static int none_memcpy_async(void *dst, const void *src, size_t bytes, weft_cuda_stream_t s)
{
    (void)dst, (void)src, (void)bytes, (void)s;
    return NONE_ERR;
}
static int none_memset_async(void *dst, int value, size_t bytes, weft_cuda_stream_t s)
{
    (void)dst, (void)value, (void)bytes, (void)s;
    return NONE_ERR;
}
static int none_handle_p(void **h_p) { (void)h_p; return NONE_ERR; }
static int none_handle(void *h) { (void)h; return NONE_ERR; }
static int none_stream_capturing(weft_cuda_stream_t s, int *capturing_p)
{
    (void)s, (void)capturing_p;
    return NONE_ERR;
}
static int none_handle2(void *a, void *b) { (void)a, (void)b; return NONE_ERR; }
static int none_launch(const struct weft_kernel *k, int grid, int block, size_t shared_bytes,
                       const void *params, size_t params_bytes, weft_cuda_stream_t s)
{
    (void)k, (void)grid, (void)block, (void)shared_bytes, (void)params, (void)params_bytes;
    (void)s;
    return NONE_ERR;
}
static int none_load_kernels(const struct weft_kernel *k, int n)
{
    (void)k, (void)n;
    return NONE_ERR;
}
static int none_capture_end(weft_cuda_stream_t s, weft_cuda_graph_t *g_p)
{
    (void)s, (void)g_p;
    return NONE_ERR;
}
static int none_launch_host_func(weft_cuda_stream_t s, void (*fn)(void *arg), void *arg)
{
    (void)s, (void)fn, (void)arg;
    return NONE_ERR;
}
static int none_void(void) { return NONE_ERR; }
static int none_mem_create(void **p_p, size_t bytes, int kind)
{
    (void)p_p, (void)bytes, (void)kind;
    return NONE_ERR;
}
static int none_mem_export(int *fd_p, void *p) { (void)fd_p, (void)p; return NONE_ERR; }
static int none_mem_import(void **p_p, int fd, size_t bytes, int kind, int owner_dev)
{
    (void)p_p, (void)fd, (void)bytes, (void)kind, (void)owner_dev;
    return NONE_ERR;
}
static int none_ipc_get_handle(struct weft_cuda_ipc_handle *h_p, void *p)
{
    (void)h_p, (void)p;
    return NONE_ERR;
}
static int none_ipc_open_handle(void **p_p, const struct weft_cuda_ipc_handle *h)
{
    (void)p_p, (void)h;
    return NONE_ERR;
}

/* What a backend's failed probe saw (weft_cuda_set_unusable); why[0] == 0: nothing unusable. */
static pthread_mutex_t weft_cuda_unusable_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int driver, runtime;
    char why[320];
} weft_cuda_unusable;

void weft_cuda_set_unusable(int driver, int runtime, const char *why)
{
    pthread_mutex_lock(&weft_cuda_unusable_lock);
    if (weft_cuda_unusable.why[0] == '\0') {
        weft_cuda_unusable.driver = driver;
        weft_cuda_unusable.runtime = runtime;
        snprintf(weft_cuda_unusable.why, sizeof(weft_cuda_unusable.why), "%s", why);
    }
    pthread_mutex_unlock(&weft_cuda_unusable_lock);
}

static int none_facts(int dev, struct weft_cuda_facts *f_p)
{
    (void)dev;
    if (f_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct weft_cuda_facts f = {0, 0, -1, -1, ""};
    pthread_mutex_lock(&weft_cuda_unusable_lock);
    f.driver = weft_cuda_unusable.driver;
    f.runtime = weft_cuda_unusable.runtime;
    pthread_mutex_unlock(&weft_cuda_unusable_lock);
    *f_p = f;
    return WEFT_CUDA_SUCCESS;
}

static int none_device_id(int dev, struct weft_cuda_dev_id *id_p)
{
    (void)dev, (void)id_p;
    return NONE_ERR;
}
static int none_device_by_bus_id(int *dev_p, const char *bus_id)
{
    (void)dev_p, (void)bus_id;
    return NONE_ERR;
}

const struct weft_cuda_ops weft_cuda_none_ops = {
    .version = WEFT_CUDA_OPS_VERSION,
    .name = "none",
    .get_device_count = none_get_device_count,
    .get_device = none_int_p,
    .set_device = none_int,
    .can_access_peer = none_can_access_peer,
    .enable_peer_access = none_int,
    .malloc = none_alloc,
    .free = none_ptr,
    .host_alloc = none_alloc,
    .host_free = none_ptr,
    .pointer_attr = none_pointer_attr,
    .memcpy_async = none_memcpy_async,
    .memset_async = none_memset_async,
    .stream_create = none_handle_p,
    .stream_destroy = none_handle,
    .stream_synchronize = none_handle,
    .stream_query = none_handle,
    .stream_capturing = none_stream_capturing,
    .event_create = none_handle_p,
    .event_destroy = none_handle,
    .event_record = none_handle2,
    .stream_wait_event = none_handle2,
    .event_synchronize = none_handle,
    .launch = none_launch,
    .capture_begin = none_handle,
    .capture_end = none_capture_end,
    .graph_launch = none_handle2,
    .graph_destroy = none_handle,
    .error_string = weft_cuda_error_text,
    .launch_host_func = none_launch_host_func,
    .device_synchronize = none_void,
    .kernel_threads = 1,
    .mem_create = none_mem_create,
    .mem_export = none_mem_export,
    .mem_import = none_mem_import,
    .mem_release = none_ptr,
    .ipc_get_handle = none_ipc_get_handle,
    .ipc_open_handle = none_ipc_open_handle,
    .ipc_close_handle = none_ptr,
    .host_only = none_host_only,
    .facts = none_facts,
    .device_id = none_device_id,
    .device_by_bus_id = none_device_by_bus_id,
    .load_kernels = none_load_kernels,
};

/* ---- selection ------------------------------------------------------------------------------- */

static pthread_once_t weft_cuda_once = PTHREAD_ONCE_INIT;
static const struct weft_cuda_ops *weft_cuda_active;

static void weft_cuda_select(void)
{
    const char *v = weft_param_Cuda();
    const struct weft_cuda_ops *ops = &weft_cuda_none_ops;
    if (v == NULL || *v == '\0' || strcmp(v, "auto") == 0 || strcmp(v, "cuda") == 0 ||
        strcmp(v, "1") == 0) {
        const struct weft_cuda_ops *real = weft_cuda_real_probe();
        if (real != NULL)
            ops = real;
        else if (v != NULL && (strcmp(v, "cuda") == 0 || strcmp(v, "1") == 0))
            WEFT_WARN("WEFT_CUDA=%s: no usable CUDA device or runtime; running without CUDA", v);
    } else if (strcmp(v, "0") == 0 || strcmp(v, "none") == 0) {
        ops = &weft_cuda_none_ops;
    } else if (strncmp(v, "emu", 3) == 0 && (v[3] == '\0' || v[3] == ':')) {
        long n = 1;
        if (v[3] == ':') {
            char *end;
            n = strtol(v + 4, &end, 10);
            if (end == v + 4 || *end != '\0' || n < 1) {
                WEFT_WARN("WEFT_CUDA=%s: expected emu:N with N >= 1; using 1 device", v);
                n = 1;
            }
        }
        ops = weft_cuda_emu_init((int)n);
        if (ops == NULL) /* an emulated driver too old for the runtime (WEFT_EMU_DRIVER) */
            ops = &weft_cuda_none_ops;
    } else {
        WEFT_WARN("WEFT_CUDA=%s: unknown backend (auto, 0, none, cuda, emu:N); running without "
                  "CUDA", v);
    }
    WEFT_INFO(WEFT_LOG_INIT, "CUDA backend %s", ops->name);
    __atomic_store_n(&weft_cuda_active, ops, __ATOMIC_RELEASE);
}

const struct weft_cuda_ops *weft_cuda(void)
{
    const struct weft_cuda_ops *ops = __atomic_load_n(&weft_cuda_active, __ATOMIC_ACQUIRE);
    if (__builtin_expect(ops != NULL, 1))
        return ops;
    pthread_once(&weft_cuda_once, weft_cuda_select);
    return weft_cuda_active;
}

/* "13.0 (13000)" for a CUDA version number; "none" for 0. */
static const char *weft_cuda_version_text(int v, char *buf, size_t len)
{
    if (v <= 0)
        snprintf(buf, len, "none");
    else
        snprintf(buf, len, "%d.%d (%d)", v / 1000, v % 1000 / 10, v);
    return buf;
}

static const char *weft_cuda_mode_text(int mode)
{
    switch (mode) {
    case 0: return "default";
    case 1: return "exclusive-thread";
    case 2: return "prohibited";
    case 3: return "exclusive-process";
    default: return "unknown";
    }
}

/* Each WARN of weft_cuda_report once per process. */
enum { WEFT_CUDA_WARNED_UNUSABLE = 1, WEFT_CUDA_WARNED_PROHIBITED = 2,
       WEFT_CUDA_WARNED_EXCLUSIVE = 4, WEFT_CUDA_WARNED_MIG = 8 };
static uint32_t weft_cuda_warned;

static int weft_cuda_warn_once(uint32_t bit)
{
    return (__atomic_fetch_or(&weft_cuda_warned, bit, __ATOMIC_RELAXED) & bit) == 0;
}

void weft_cuda_report(int rank, int dev, int others_on_host)
{
    const struct weft_cuda_ops *ops = weft_cuda();
    struct weft_cuda_facts f = {0, 0, -1, -1, ""};
    if (ops->facts(dev >= 0 ? dev : 0, &f) != WEFT_CUDA_SUCCESS)
        f = (struct weft_cuda_facts){0, 0, -1, -1, ""};
    if (dev < 0) {
        f.compute_mode = -1;
        f.mig = -1;
        f.name[0] = '\0';
    }
    char drv[32], rt[32], where[128];
    if (dev >= 0)
        snprintf(where, sizeof(where), "device %d%s%s%s", dev, f.name[0] ? " (" : "", f.name,
                 f.name[0] ? ")" : "");
    else
        snprintf(where, sizeof(where), "no device");
    WEFT_INFO(WEFT_LOG_INIT, "rank %d: CUDA backend %s, driver %s, runtime %s, %s, compute mode "
              "%s, MIG %s", rank, ops->name, weft_cuda_version_text(f.driver, drv, sizeof(drv)),
              weft_cuda_version_text(f.runtime, rt, sizeof(rt)), where,
              weft_cuda_mode_text(f.compute_mode), f.mig < 0 ? "unknown" : f.mig ? "on" : "off");
    char why[sizeof(weft_cuda_unusable.why)];
    pthread_mutex_lock(&weft_cuda_unusable_lock);
    memcpy(why, weft_cuda_unusable.why, sizeof(why));
    pthread_mutex_unlock(&weft_cuda_unusable_lock);
    if (why[0] != '\0' && weft_cuda_warn_once(WEFT_CUDA_WARNED_UNUSABLE))
        WEFT_WARN("rank %d: a GPU is present but unusable: %s; running without CUDA (host "
                  "memory only)", rank, why);
    if (dev < 0)
        return;
    if (f.compute_mode == 2 && weft_cuda_warn_once(WEFT_CUDA_WARNED_PROHIBITED))
        WEFT_WARN("rank %d: device %d is in prohibited compute mode: no process can use it "
                  "(nvidia-smi -c DEFAULT)", rank, dev);
    if (f.compute_mode == 3 && others_on_host > 0 &&
        weft_cuda_warn_once(WEFT_CUDA_WARNED_EXCLUSIVE))
        WEFT_WARN("rank %d: device %d is in exclusive-process compute mode and %d rank%s of "
                  "other processes on this host %s in the communicator: only one process can use "
                  "the device, the others' CUDA calls fail (cudaErrorDevicesUnavailable, 46)",
                  rank, dev, others_on_host, others_on_host == 1 ? "" : "s",
                  others_on_host == 1 ? "is" : "are");
    if (f.mig == 1 && others_on_host > 0 && weft_cuda_warn_once(WEFT_CUDA_WARNED_MIG))
        WEFT_WARN("rank %d: device %d is a MIG instance and %d rank%s of other processes on "
                  "this host %s in the communicator: MIG instances support no peer access or "
                  "CUDA IPC between them, so device memory cannot be shared between those "
                  "processes", rank, dev, others_on_host, others_on_host == 1 ? "" : "s",
                  others_on_host == 1 ? "is" : "are");
}

#ifndef WEFT_HAVE_CUDA_RT
/* Built without the toolkit: no real backend. */
const struct weft_cuda_ops *weft_cuda_real_probe(void) { return NULL; }
#endif
