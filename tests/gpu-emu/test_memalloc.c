/*
 * ncclMemAlloc / ncclMemFree: device memory in a process with a CUDA device (as NVIDIA's NCCL),
 * host memfd memory without one.
 *
 * Usage: test_memalloc CASE [-n NRANKS] [-d DEVICES]
 *   device  (WEFT_CUDA=emu:D) rank r allocates on device r % D: the pointer classifies as device
 *           memory of that device, covering the bytes asked for; it is exportable as cuMem (a
 *           POSIX fd) by default and is cudaMalloc memory (a legacy IPC handle) with
 *           NCCL_CUMEM_ENABLE=0; a weftCudaMemcpy round trip returns every byte; all-reduce and
 *           all-gather (out of place and in place) on it are right element by element; after
 *           ncclMemFree a touch faults (SIGSEGV in a child); freeing twice, or a pointer
 *           cudaMalloc gave, is ncclInvalidArgument
 *   host    (WEFT_CUDA=0) plain host memory a memfd backs: writable, the registry knows its fd,
 *           freed once; bad frees refused
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/mem.h"
#include "cuda/cuda_ops.h"
#include "emu_check.h"
#include "nccl.h"
#include "weft.h"

#define MAXR 8

static const struct weft_cuda_ops *cu;
static int g_n = 2, g_d = 1, g_failed, g_passed;

static void expect(int ok, const char *what, int r)
{
    if (ok) {
        g_passed++;
        return;
    }
    g_failed++;
    fprintf(stderr, "FAIL rank %d: %s\n", r, what);
}

/* Runs a touch of p in a child; returns the signal that killed it (0 if it exited). */
static int child_touch(volatile char *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        *p = 1;
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

/* Element i of rank r's input: small integers, so every sum is exact in float. */
static float value(int r, size_t i) { return (float)((r + 1) * (int)(i % 251 + 1)); }

/* Rank r's count floats at dev: all-reduce (sum) and all-gather, out of place and in place. */
static void run_colls(ncclComm_t *comms, cudaStream_t *streams, float **dsend, float **drecv,
                      size_t count)
{
    int n = g_n;
    float *h = malloc(count * n * sizeof(float));
    for (int coll = 0; coll < 2; coll++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            for (int r = 0; r < n; r++) {
                size_t at = coll == 1 && inplace ? (size_t)r * count : 0;
                for (size_t i = 0; i < count; i++)
                    h[i] = value(r, i);
                CU(cu->set_device(r % g_d));
                CU(weftCudaMemset(drecv[r], 0, count * n * sizeof(float)));
                CU(weftCudaMemcpy((inplace ? drecv[r] : dsend[r]) + at, h,
                                  count * sizeof(float)));
            }
            int ok = check(ncclGroupStart(), "ncclGroupStart");
            for (int r = 0; r < n && ok; r++) {
                float *in = inplace ? drecv[r] + (coll == 1 ? (size_t)r * count : 0) : dsend[r];
                ok = coll == 0 ? check(ncclAllReduce(in, drecv[r], count, ncclFloat32, ncclSum,
                                                     comms[r], streams[r]),
                                       "ncclAllReduce")
                               : check(ncclAllGather(in, drecv[r], count, ncclFloat32, comms[r],
                                                     streams[r]),
                                       "ncclAllGather");
            }
            ok = check(ncclGroupEnd(), "ncclGroupEnd") && ok;
            expect(ok, "collective calls", -1);
            for (int r = 0; r < n; r++) {
                CU(cu->set_device(r % g_d));
                CU(cu->stream_synchronize(streams[r]));
                size_t nout = coll == 0 ? count : count * n;
                CU(weftCudaMemcpy(h, drecv[r], nout * sizeof(float)));
                size_t bad = 0;
                for (size_t i = 0; i < nout; i++) {
                    float want = 0;
                    if (coll == 0)
                        for (int q = 0; q < n; q++)
                            want += value(q, i);
                    else
                        want = value((int)(i / count), i % count);
                    if (h[i] != want && bad++ < 5)
                        fprintf(stderr, "FAIL %s %s rank %d [%zu]: got %g want %g\n",
                                coll == 0 ? "allreduce" : "allgather",
                                inplace ? "in-place" : "out-of-place", r, i, h[i], want);
                }
                expect(bad == 0, "collective result", r);
            }
        }
    }
    free(h);
}

static int case_device(void)
{
    const char *knob = getenv("NCCL_CUMEM_ENABLE");
    int legacy = knob != NULL && strcmp(knob, "0") == 0;
    size_t count = 5000; /* not a page multiple: rounding is the library's business */
    size_t bytes = count * g_n * sizeof(float);
    float *dsend[MAXR], *drecv[MAXR];
    cudaStream_t streams[MAXR];
    ncclComm_t comms[MAXR];
    for (int r = 0; r < g_n; r++) {
        int dev = r % g_d;
        CU(cu->set_device(dev));
        if (!check(ncclMemAlloc((void **)&dsend[r], bytes), "ncclMemAlloc") ||
            !check(ncclMemAlloc((void **)&drecv[r], bytes), "ncclMemAlloc"))
            return 1;
        struct weft_ptr_attr a;
        CU(cu->pointer_attr(&a, dsend[r]));
        expect(a.kind == WEFT_MEM_DEVICE && a.device == dev, "device memory of its device", r);
        expect(a.size >= bytes && (char *)a.base <= (char *)dsend[r] &&
                   (char *)a.base + a.size >= (char *)dsend[r] + bytes,
               "covers the bytes asked for", r);
        /* cuMem memory exports as a POSIX fd and has no legacy handle; cudaMalloc's the reverse. */
        int fd = -1;
        struct weft_cuda_ipc_handle ih;
        int exp = cu->mem_export(&fd, dsend[r]);
        int ipc = cu->ipc_get_handle(&ih, dsend[r]);
        if (fd >= 0)
            close(fd);
        expect(legacy ? exp != 0 && ipc == 0 : exp == 0 && ipc != 0,
               legacy ? "cudaMalloc memory (legacy IPC handle, no cuMem fd)"
                      : "cuMem memory (exportable fd, no legacy handle)",
               r);
        /* A round trip through the runtime's copies. */
        unsigned char *h = malloc(bytes), *back = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            h[i] = (unsigned char)(i * 7 + r);
        CU(weftCudaMemcpy(dsend[r], h, bytes));
        memset(back, 0, bytes);
        CU(weftCudaMemcpy(back, dsend[r], bytes));
        expect(memcmp(h, back, bytes) == 0, "cudaMemcpy round trip", r);
        free(h);
        free(back);
        CU(cu->stream_create((weft_cuda_stream_t *)&streams[r]));
    }
    CU(cu->set_device(0));
    if (!check(ncclCommInitAll(comms, g_n, NULL), "ncclCommInitAll"))
        return 1;
    run_colls(comms, streams, dsend, drecv, count);
    for (int r = 0; r < g_n; r++) {
        check(ncclCommDestroy(comms[r]), "ncclCommDestroy");
        CU(cu->set_device(r % g_d));
        CU(cu->stream_destroy(streams[r]));
        expect(child_touch((char *)dsend[r] + 8) == 0, "live memory does not fault", r);
        expect(check(ncclMemFree(dsend[r]), "ncclMemFree"), "ncclMemFree", r);
        expect(check(ncclMemFree(drecv[r]), "ncclMemFree"), "ncclMemFree", r);
        expect(child_touch((char *)dsend[r] + 8) == SIGSEGV, "freed memory faults", r);
        expect(ncclMemFree(dsend[r]) == ncclInvalidArgument, "second free refused", r);
    }
    void *plain;
    CU(cu->malloc(&plain, 64));
    expect(ncclMemFree(plain) == ncclInvalidArgument, "cudaMalloc pointer refused", -1);
    CU(cu->free(plain));
    return 0;
}

static int case_host(void)
{
    size_t bytes = 10000;
    char *p;
    if (!check(ncclMemAlloc((void **)&p, bytes), "ncclMemAlloc"))
        return 1;
    struct weft_ptr_attr a;
    CU(cu->pointer_attr(&a, p));
    expect(a.kind == WEFT_MEM_HOST, "host memory without a device", 0);
    memset(p, 0x33, bytes);
    size_t off = 1, block = 0;
    int fd = weft_mem_lookup(p + 100, 200, &off, &block);
    expect(fd >= 0 && off == 100 && block >= bytes, "the registry knows its memfd", 0);
    expect(p[bytes - 1] == 0x33, "writable", 0);
    expect(check(ncclMemFree(p), "ncclMemFree"), "ncclMemFree", 0);
    expect(child_touch(p) == SIGSEGV, "freed memory faults", 0);
    expect(ncclMemFree(p) == ncclInvalidArgument, "second free refused", 0);
    char stack_buf[16];
    expect(ncclMemFree(stack_buf) == ncclInvalidArgument, "foreign pointer refused", 0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s device|host [-n NRANKS] [-d DEVICES]\n", argv[0]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            g_n = atoi(argv[++i]);
        else if (strcmp(argv[i], "-d") == 0 && i + 1 < argc)
            g_d = atoi(argv[++i]);
    }
    if (g_n < 1 || g_n > MAXR || g_d < 1)
        return 2;
    cu = weft_cuda();
    int ndev = 0, rc;
    cu->get_device_count(&ndev);
    if (strcmp(argv[1], "device") == 0) {
        if (ndev < g_d) {
            fprintf(stderr, "SKIP: %d devices (%s backend), %d needed; set WEFT_CUDA=emu:%d\n",
                    ndev, cu->name, g_d, g_d);
            return 77;
        }
        rc = case_device();
    } else if (strcmp(argv[1], "host") == 0) {
        if (ndev != 0) {
            fprintf(stderr, "FAIL: the host case needs WEFT_CUDA=0 (%d devices)\n", ndev);
            return 1;
        }
        rc = case_host();
    } else {
        fprintf(stderr, "unknown case %s\n", argv[1]);
        return 2;
    }
    printf("%s -n %d -d %d: %d passed, %d failed\n", argv[1], g_n, g_d, g_passed, g_failed);
    return rc != 0 || g_failed > 0 || g_passed == 0;
}
