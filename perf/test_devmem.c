/*
 * test_devmem: devmem.c's CUDA-runtime binding, the path the perf tools take under a libnccl.so.2
 * that is not Weft's. This program links no NCCL library (so no weft* symbol exists) and finds
 * cudart_mock.c as libcudart.so.13 through LD_LIBRARY_PATH; every slot is called once and must
 * succeed (the mock refuses the arguments a wrong adapter would pass).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "test_devmem: %s:%d: %s\n", __FILE__, __LINE__, #cond);                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(void)
{
    const char *why = NULL;
    const struct perf_devmem *dm = perf_devmem_get(&why);
    char host[64], back[64], desc[64];
    cudaStream_t s = NULL;
    perf_graph_t g = NULL;
    void *dev = NULL;

    if (strcmp(dm->name, "cudart") != 0)
        fprintf(stderr, "test_devmem: bound %s: %s\n", dm->name, why);
    CHECK(strcmp(dm->name, "cudart") == 0 && strcmp(dm->kind, "cuda") == 0 && dm->ndev == 2);
    CHECK(dm->set_device(1) == 0);
    CHECK(dm->malloc(&dev, sizeof(host)) == 0 && dev != NULL);
    for (size_t i = 0; i < sizeof(host); i++)
        host[i] = (char)i;
    CHECK(dm->memset(dev, 0x11, sizeof(host)) == 0);
    CHECK(dm->memcpy(dev, host, sizeof(host)) == 0);
    CHECK(dm->stream_create(&s) == 0 && s != NULL);
    CHECK(dm->memcpy_async(back, dev, sizeof(back), s) == 0);
    CHECK(dm->stream_synchronize(s) == 0);
    CHECK(memcmp(host, back, sizeof(host)) == 0);
    CHECK(dm->capture_begin(s) == 0);
    CHECK(dm->capture_end(s, &g) == 0 && g != NULL);
    CHECK(dm->graph_launch(g, s) == 0);
    CHECK(dm->graph_destroy(g) == 0);
    CHECK(dm->stream_destroy(s) == 0);
    CHECK(dm->free(dev) == 0);
    dm->describe(1, desc, sizeof(desc));
    CHECK(strstr(desc, "0000:11:00.0") != NULL);
    printf("cudart: %s\n", desc);
    return 0;
}
