/*
 * Device memory for the *_perf tools: allocation, copies, memset, streams and CUDA graphs, bound
 * at run time so that one perf binary runs on
 *
 *   weft     Weft's libnccl.so.2 with a GPU backend: the weftCuda* forwards of include/weft.h,
 *            found with dlsym(RTLD_DEFAULT, "weftCudaBackend"); weftCudaBackend() says "emu"
 *            (WEFT_CUDA=emu:N, emulated devices) or "cuda" (a real GPU), "none" (no device);
 *   cudart   another libnccl.so.2 (NVIDIA's, through LD_LIBRARY_PATH): the CUDA runtime, dlopen'ed
 *            as libcudart.so.13, libcudart.so.12 or libcudart.so, used when it reports >= 1 device;
 *   none     neither, or a Weft library without weftCudaBackend: the tools use host buffers only.
 *
 * The perf tools never link libcudart: every entry point is one pointer of `struct perf_devmem`,
 * filled once by perf_devmem_get() from whichever runtime was found (one way per thing; both
 * runtimes return cudaError_t values as int, 0 success).
 *
 * Threads: perf_devmem_get() may be called from any thread (it binds once, under a pthread_once).
 * The device slots follow CUDA: the current device is per thread (set_device), malloc and
 * stream_create act on the calling thread's current device. Buffers are owned by the caller.
 */
#ifndef WEFT_PERF_DEVMEM_H
#define WEFT_PERF_DEVMEM_H

#include <stddef.h>

#include "nccl.h"

/* An executable graph: a weftCudaGraph_t, or a cudaGraphExec_t (cudart). */
typedef void *perf_graph_t;

struct perf_devmem {
    const char *name;   /* "weft" or "cudart" (the runtime), "none" */
    const char *kind;   /* "emu", "cuda" (a device backend), or "none" */
    int ndev;           /* devices; 0 means host buffers only */
    /* Each returns a cudaError_t value (0 success). All block only as CUDA's would. */
    int (*set_device)(int dev);
    int (*malloc)(void **p_p, size_t bytes);             /* on the current device */
    int (*free)(void *p);
    int (*memcpy)(void *dst, const void *src, size_t bytes); /* synchronous, any direction */
    int (*memcpy_async)(void *dst, const void *src, size_t bytes, cudaStream_t s); /* any dir. */
    int (*memset)(void *p, int value, size_t bytes);     /* synchronous */
    int (*stream_create)(cudaStream_t *s_p);             /* non-blocking, current device */
    int (*stream_destroy)(cudaStream_t s);
    int (*stream_synchronize)(cudaStream_t s);
    /* Graphs: capture on one stream (thread-local mode), end gives an executable graph. */
    int (*capture_begin)(cudaStream_t s);
    int (*capture_end)(cudaStream_t s, perf_graph_t *g_p);
    int (*graph_launch)(perf_graph_t g, cudaStream_t s);
    int (*graph_destroy)(perf_graph_t g);
    /* "[bus id] name" of a device for the "# Using devices" lines; never NULL. */
    void (*describe)(int dev, char *out, size_t len);
    const char *(*error_string)(int err);
};

/* The bound runtime (never NULL; ndev == 0 when there is none). Where a runtime was found but
 * unusable (e.g. libcudart present, no device), *why_p (if not NULL) says why, else "". */
const struct perf_devmem *perf_devmem_get(const char **why_p);

#endif
