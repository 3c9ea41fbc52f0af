/*
 * A stand-in libcuda.so.1 for test_foreign: the one driver entry point Weft's "none" backend asks
 * (cuPointerGetAttribute), answering "device memory" for the ranges fake_cuda_alloc made
 * (PROT_NONE: a library that read them as host memory would die of SIGSEGV) and "not CUDA
 * memory" (CUDA_ERROR_INVALID_VALUE) for everything else, as the real driver does for plain host
 * memory.
 */
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define FAKE_MAX 16
static struct {
    uintptr_t base;
    size_t size;
} fake_ranges[FAKE_MAX];
static int fake_n;

__attribute__((visibility("default"))) void *fake_cuda_alloc(size_t size)
{
    if (fake_n == FAKE_MAX)
        return NULL;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    fake_ranges[fake_n].base = (uintptr_t)p;
    fake_ranges[fake_n].size = size;
    fake_n++;
    return p;
}

__attribute__((visibility("default"))) int cuPointerGetAttribute(void *data, int attribute,
                                                                 uintptr_t ptr)
{
    for (int i = 0; i < fake_n; i++) {
        if (ptr >= fake_ranges[i].base && ptr < fake_ranges[i].base + fake_ranges[i].size) {
            if (attribute == 2) /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
                *(unsigned *)data = 2; /* CU_MEMORYTYPE_DEVICE */
            else if (attribute == 8) /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
                *(unsigned *)data = 0;
            return 0;
        }
    }
    return 1; /* CUDA_ERROR_INVALID_VALUE: not memory the driver knows */
}
