/*
 * Small helpers of the gpu-emu test programs whose ranks are threads of one process: a monotonic
 * clock, CU() for a call through the CUDA ops table (exits on failure; the file defines `cu`),
 * and check() for an NCCL call (prints why it failed, returns 0).
 */
#ifndef WEFT_TESTS_GPU_EMU_EMU_CHECK_H
#define WEFT_TESTS_GPU_EMU_EMU_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nccl.h"

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CU(call)                                                                                   \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_ != 0) {                                                                             \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                  \
                    cu->error_string(e_));                                                         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline int check(ncclResult_t res, const char *what)
{
    if (res != ncclSuccess) {
        fprintf(stderr, "FAIL %s: %s (%s)\n", what, ncclGetErrorString(res),
                ncclGetLastError(NULL));
        return 0;
    }
    return 1;
}

#endif
