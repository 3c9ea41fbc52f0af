/*
 * test_foreign FAKE_LIBCUDA: CUDA memory of the program's own given to a Weft without a device of
 * its own (WEFT_CUDA=0, or a build without the toolkit on a GPU machine): every call fails with
 * ncclInvalidArgument and a message naming the buffer, never reads it (the fake's ranges are
 * PROT_NONE), and host buffers keep working. The program "uses CUDA" by having libcuda.so.1
 * loaded, here the stand-in fake_libcuda.c.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "nccl.h"

static int failures;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s FAKE_LIBCUDA\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    void *(*fake_alloc)(size_t) = h ? (void *(*)(size_t))dlsym(h, "fake_cuda_alloc") : NULL;
    if (fake_alloc == NULL) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
        return 1;
    }
    ncclComm_t comm;
    if (ncclCommInitAll(&comm, 1, NULL) != ncclSuccess) {
        fprintf(stderr, "init: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    float *dev = fake_alloc(1 << 16), host[16] = {0};
    ncclResult_t res = ncclAllReduce(dev, dev, 16, ncclFloat, ncclSum, comm, NULL);
    EXPECT(res == ncclInvalidArgument, "all-reduce of device memory returned %d", res);
    const char *msg = ncclGetLastError(comm);
    EXPECT(strstr(msg, "sendbuff") != NULL && strstr(msg, "CUDA memory") != NULL,
           "message: %s", msg);
    res = ncclAllGather(host, dev, 16, ncclFloat, comm, NULL);
    EXPECT(res == ncclInvalidArgument, "host input with device output returned %d", res);
    res = ncclBroadcast(dev, dev, 16, ncclFloat, 0, comm, NULL);
    EXPECT(res == ncclInvalidArgument, "broadcast of device memory returned %d", res);
    /* host buffers still work */
    for (int i = 0; i < 16; i++)
        host[i] = (float)i;
    float out[16];
    EXPECT(ncclAllReduce(host, out, 16, ncclFloat, ncclSum, comm, NULL) == ncclSuccess,
           "host all-reduce: %s", ncclGetLastError(comm));
    for (int i = 0; i < 16; i++)
        EXPECT(out[i] == (float)i, "element %d: %g", i, out[i]);
    ncclCommDestroy(comm);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
