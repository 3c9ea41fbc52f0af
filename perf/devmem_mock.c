/*
 * A stand-in device runtime for perf-smoke (LD_PRELOAD): the weftCuda* forwards of include/weft.h
 * over host memory, so that the perf tools' device-buffer path (devmem.c binding, copies in and
 * out, per-rank streams, -G capture and replay, several ranks per device) runs on any machine
 * against the host executor. Not a GPU: "device" memory is malloc'd, streams are tokens (every
 * call it carries completed on return), a capture records nothing and a graph launch does
 * nothing (so -G times nothing; validation runs outside the graph and still checks every
 * element). Each allocation is poisoned so that a copy the driver forgets shows up as #wrong.
 * WEFT_PERF_MOCK_DEVICES sets the device count (default 2). WEFT_PERF_MOCK_CORRUPT=1 flips the
 * lowest bit of the last byte of every synchronous copy of 64 bytes or more out of "device" memory,
 * so that a test can see the driver count wrong elements it only sees through such copies.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

#define MOCK_API __attribute__((visibility("default")))

struct mock_stream {
    int device;
    int capturing;
};

static __thread int mock_device;

/* Live allocations, for WEFT_PERF_MOCK_CORRUPT (the driver makes a few dozen at most). */
#define MOCK_MAX_ALLOCS 4096
static struct {
    uintptr_t base;
    size_t bytes;
} mock_allocs[MOCK_MAX_ALLOCS];
static pthread_mutex_t mock_lock = PTHREAD_MUTEX_INITIALIZER;

static void mock_track(void *p, size_t bytes, int add)
{
    pthread_mutex_lock(&mock_lock);
    for (int i = 0; i < MOCK_MAX_ALLOCS; i++) {
        if (add && mock_allocs[i].base == 0) {
            mock_allocs[i].base = (uintptr_t)p;
            mock_allocs[i].bytes = bytes;
            break;
        }
        if (!add && mock_allocs[i].base == (uintptr_t)p) {
            mock_allocs[i].base = 0;
            break;
        }
    }
    pthread_mutex_unlock(&mock_lock);
}

static int mock_is_device(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int found = 0;

    pthread_mutex_lock(&mock_lock);
    for (int i = 0; i < MOCK_MAX_ALLOCS && !found; i++)
        found = mock_allocs[i].base != 0 && a >= mock_allocs[i].base &&
                a < mock_allocs[i].base + mock_allocs[i].bytes;
    pthread_mutex_unlock(&mock_lock);
    return found;
}

MOCK_API const char *weftCudaBackend(void);
MOCK_API const char *weftCudaBackend(void)
{
    return "emu";
}

MOCK_API int weftCudaGetDeviceCount(int *n);
MOCK_API int weftCudaGetDeviceCount(int *n)
{
    const char *v = getenv("WEFT_PERF_MOCK_DEVICES");

    *n = v != NULL ? atoi(v) : 2;
    return 0;
}

MOCK_API int weftCudaSetDevice(int dev);
MOCK_API int weftCudaSetDevice(int dev)
{
    int n = 0;

    weftCudaGetDeviceCount(&n);
    if (dev < 0 || dev >= n)
        return 101; /* cudaErrorInvalidDevice */
    mock_device = dev;
    return 0;
}

MOCK_API int weftCudaMalloc(void **p, size_t bytes);
MOCK_API int weftCudaMalloc(void **p, size_t bytes)
{
    void *m = NULL;

    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0)
        return 2;
    memset(m, 0x5a, bytes);
    mock_track(m, bytes, 1);
    *p = m;
    return 0;
}

MOCK_API int weftCudaFree(void *p);
MOCK_API int weftCudaFree(void *p)
{
    mock_track(p, 0, 0);
    free(p);
    return 0;
}

MOCK_API int weftCudaMemcpy(void *dst, const void *src, size_t bytes);
MOCK_API int weftCudaMemcpy(void *dst, const void *src, size_t bytes)
{
    const char *corrupt = getenv("WEFT_PERF_MOCK_CORRUPT");

    memmove(dst, src, bytes);
    /* From 64 bytes: the driver's 8-byte helper results (time, error counts) stay intact. */
    if (corrupt != NULL && atoi(corrupt) != 0 && bytes >= 64 && mock_is_device(src) &&
        !mock_is_device(dst))
        ((unsigned char *)dst)[bytes - 1] ^= 1;
    return 0;
}

MOCK_API int weftCudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t s);
MOCK_API int weftCudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t s)
{
    struct mock_stream *ms = (struct mock_stream *)(void *)s;

    if (ms != NULL && ms->capturing)
        return 0; /* recorded (and dropped) by the capture */
    memmove(dst, src, bytes);
    return 0;
}

MOCK_API int weftCudaMemset(void *p, int value, size_t bytes);
MOCK_API int weftCudaMemset(void *p, int value, size_t bytes)
{
    memset(p, value, bytes);
    return 0;
}

MOCK_API int weftCudaStreamCreate(cudaStream_t *s);
MOCK_API int weftCudaStreamCreate(cudaStream_t *s)
{
    struct mock_stream *ms = calloc(1, sizeof(*ms));

    if (ms == NULL)
        return 2;
    ms->device = mock_device;
    *s = (cudaStream_t)(void *)ms;
    return 0;
}

MOCK_API int weftCudaStreamDestroy(cudaStream_t s);
MOCK_API int weftCudaStreamDestroy(cudaStream_t s)
{
    free((void *)s);
    return 0;
}

MOCK_API int weftCudaStreamSynchronize(cudaStream_t s);
MOCK_API int weftCudaStreamSynchronize(cudaStream_t s)
{
    struct mock_stream *ms = (struct mock_stream *)(void *)s;

    return ms != NULL && ms->capturing ? 900 : 0; /* no synchronising a capturing stream */
}

MOCK_API int weftCudaStreamBeginCapture(cudaStream_t s);
MOCK_API int weftCudaStreamBeginCapture(cudaStream_t s)
{
    struct mock_stream *ms = (struct mock_stream *)(void *)s;

    if (ms == NULL || ms->capturing)
        return 1;
    ms->capturing = 1;
    return 0;
}

MOCK_API int weftCudaStreamEndCapture(cudaStream_t s, void **g);
MOCK_API int weftCudaStreamEndCapture(cudaStream_t s, void **g)
{
    struct mock_stream *ms = (struct mock_stream *)(void *)s;

    if (ms == NULL || !ms->capturing)
        return 1;
    ms->capturing = 0;
    *g = malloc(1);
    return *g != NULL ? 0 : 2;
}

MOCK_API int weftCudaGraphLaunch(void *g, cudaStream_t s);
MOCK_API int weftCudaGraphLaunch(void *g, cudaStream_t s)
{
    (void)s;
    return g != NULL ? 0 : 400;
}

MOCK_API int weftCudaGraphDestroy(void *g);
MOCK_API int weftCudaGraphDestroy(void *g)
{
    free(g);
    return 0;
}

MOCK_API const char *weftCudaGetErrorString(int err);
MOCK_API const char *weftCudaGetErrorString(int err)
{
    return err == 0 ? "no error" : "mock device runtime error";
}
