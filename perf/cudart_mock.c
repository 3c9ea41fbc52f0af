/*
 * A stand-in libcudart.so.13 for test_devmem: the CUDA runtime entry points devmem.c binds when
 * the loaded libnccl.so.2 is not Weft's, over host memory. Each checks the arguments devmem.c must
 * pass (cudaMemcpyDefault, cudaStreamNonBlocking, thread-local capture, an instantiate of the
 * captured graph before its launch) and returns cudaErrorInvalidValue (1) otherwise, so that the
 * test sees a wrong adapter as a failed call. Built as build/perf/libcudart.so.13, never installed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOCK_API __attribute__((visibility("default")))

struct mock_graph {
    int instantiated;
    int destroyed;
};

static __thread int mock_device;
static __thread int mock_capturing;

MOCK_API int cudaGetDeviceCount(int *n);
MOCK_API int cudaGetDeviceCount(int *n)
{
    *n = 2;
    return 0;
}

MOCK_API int cudaSetDevice(int dev);
MOCK_API int cudaSetDevice(int dev)
{
    if (dev < 0 || dev >= 2)
        return 101;
    mock_device = dev;
    return 0;
}

MOCK_API int cudaMalloc(void **p, size_t bytes);
MOCK_API int cudaMalloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    return *p != NULL ? 0 : 2;
}

MOCK_API int cudaFree(void *p);
MOCK_API int cudaFree(void *p)
{
    free(p);
    return 0;
}

MOCK_API int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind);
MOCK_API int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind)
{
    if (kind != 4) /* cudaMemcpyDefault */
        return 1;
    memmove(dst, src, bytes);
    return 0;
}

MOCK_API int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *s);
MOCK_API int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *s)
{
    (void)s;
    return cudaMemcpy(dst, src, bytes, kind);
}

MOCK_API int cudaMemset(void *p, int value, size_t bytes);
MOCK_API int cudaMemset(void *p, int value, size_t bytes)
{
    memset(p, value, bytes);
    return 0;
}

MOCK_API int cudaStreamCreateWithFlags(void **s, unsigned flags);
MOCK_API int cudaStreamCreateWithFlags(void **s, unsigned flags)
{
    if (flags != 1) /* cudaStreamNonBlocking */
        return 1;
    *s = malloc(1);
    return 0;
}

MOCK_API int cudaStreamDestroy(void *s);
MOCK_API int cudaStreamDestroy(void *s)
{
    free(s);
    return 0;
}

MOCK_API int cudaStreamSynchronize(void *s);
MOCK_API int cudaStreamSynchronize(void *s)
{
    (void)s;
    return mock_capturing ? 900 : 0;
}

MOCK_API int cudaStreamBeginCapture(void *s, int mode);
MOCK_API int cudaStreamBeginCapture(void *s, int mode)
{
    if (s == NULL || mode != 1 || mock_capturing) /* cudaStreamCaptureModeThreadLocal */
        return 1;
    mock_capturing = 1;
    return 0;
}

MOCK_API int cudaStreamEndCapture(void *s, void **graph);
MOCK_API int cudaStreamEndCapture(void *s, void **graph)
{
    if (s == NULL || !mock_capturing)
        return 1;
    mock_capturing = 0;
    *graph = calloc(1, sizeof(struct mock_graph));
    return 0;
}

/* The executable graph points at its graph, so that a launch sees whether it was instantiated. */
MOCK_API int cudaGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
MOCK_API int cudaGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags)
{
    struct mock_graph *g = graph, *e;

    if (g == NULL || flags != 0)
        return 1;
    e = calloc(1, sizeof(*e));
    e->instantiated = 1;
    *exec = e;
    return 0;
}

MOCK_API int cudaGraphLaunch(void *exec, void *s);
MOCK_API int cudaGraphLaunch(void *exec, void *s)
{
    struct mock_graph *e = exec;

    (void)s;
    return e != NULL && e->instantiated && !e->destroyed ? 0 : 400;
}

MOCK_API int cudaGraphExecDestroy(void *exec);
MOCK_API int cudaGraphExecDestroy(void *exec)
{
    struct mock_graph *e = exec;

    if (e == NULL || !e->instantiated)
        return 400;
    free(e);
    return 0;
}

MOCK_API int cudaGraphDestroy(void *graph);
MOCK_API int cudaGraphDestroy(void *graph)
{
    struct mock_graph *g = graph;

    if (g == NULL || g->instantiated) /* an executable graph is not a graph */
        return 400;
    free(g);
    return 0;
}

MOCK_API int cudaDeviceGetPCIBusId(char *id, int len, int dev);
MOCK_API int cudaDeviceGetPCIBusId(char *id, int len, int dev)
{
    snprintf(id, (size_t)len, "0000:%02x:00.0", 0x10 + dev);
    return 0;
}

MOCK_API const char *cudaGetErrorString(int err);
MOCK_API const char *cudaGetErrorString(int err)
{
    return err == 0 ? "no error" : "mock cudart error";
}
