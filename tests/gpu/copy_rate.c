/*
 * copy_rate [BYTES] [ITERS]: the device-to-device copy rate of device 0 through Weft's device
 * runtime (include/weft.h), the physical baseline the GPU check prints beside all-reduce busbw.
 * Copies BYTES (default 1 GiB) ITERS times (default 20) on one stream after 3 warm-ups, checks
 * the last copy element by element, and prints one line:
 *     copy_rate: BYTES bytes, ITERS copies, T us each, X GB/s copied (2X GB/s read + written)
 * Runs on the real GPU and on the emulated one (WEFT_CUDA=emu:1); exits 77 without a device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "weft.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_ != 0) {                                                                             \
            fprintf(stderr, "copy_rate: %s failed: %s\n", #call, weftCudaGetErrorString(e_));      \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)1 << 30;
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    int ndev = 0;
    if (weftCudaGetDeviceCount(&ndev) != 0 || ndev < 1) {
        printf("SKIP: no device (backend %s)\n", weftCudaBackend());
        return 77;
    }
    bytes &= ~(size_t)7;
    size_t n = bytes / 8;
    uint64_t *host = malloc(bytes), *a, *b;
    if (host == NULL || n == 0 || iters < 1) {
        fprintf(stderr, "copy_rate: bad size %zu or iterations %d\n", bytes, iters);
        return 2;
    }
    for (size_t i = 0; i < n; i++)
        host[i] = i * 0x9e3779b97f4a7c15ull;
    CUDA_OK(weftCudaSetDevice(0));
    CUDA_OK(weftCudaMalloc((void **)&a, bytes));
    CUDA_OK(weftCudaMalloc((void **)&b, bytes));
    cudaStream_t s;
    CUDA_OK(weftCudaStreamCreate(&s));
    CUDA_OK(weftCudaMemcpy(a, host, bytes));
    CUDA_OK(weftCudaMemset(b, 0, bytes));
    for (int i = 0; i < 3; i++)
        CUDA_OK(weftCudaMemcpyAsync(b, a, bytes, s));
    CUDA_OK(weftCudaStreamSynchronize(s));
    double t0 = now_us();
    for (int i = 0; i < iters; i++)
        CUDA_OK(weftCudaMemcpyAsync(b, a, bytes, s));
    CUDA_OK(weftCudaStreamSynchronize(s));
    double us = (now_us() - t0) / iters;
    for (size_t i = 0; i < n; i++)
        host[i] = 0;
    CUDA_OK(weftCudaMemcpy(host, b, bytes));
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += host[i] != i * 0x9e3779b97f4a7c15ull;
    double gbs = (double)bytes / us * 1e-3;
    printf("copy_rate: %zu bytes, %d copies, %.1f us each, %.1f GB/s copied (%.1f GB/s read + "
           "written) on %s device 0, %zu wrong\n",
           bytes, iters, us, gbs, 2 * gbs, weftCudaBackend(), wrong);
    weftCudaStreamDestroy(s);
    weftCudaFree(a);
    weftCudaFree(b);
    free(host);
    return wrong ? 1 : 0;
}
