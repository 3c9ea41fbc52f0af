/* ncclMemAlloc (device memory on a GPU, memfd host memory otherwise), its registry, and the
 * lookups of registered buffers (core/register.c makes and drops registrations). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/check.h"
#include "core/comm.h"
#include "core/mem.h"
#include "core/param.h"
#include "cuda/cuda_ops.h"

WEFT_PARAM_DECL(CumemEnable); /* transports/p2p: NCCL_CUMEM_ENABLE */

/* What backs an ncclMemAlloc block, and so how ncclMemFree releases it. */
enum weft_mem_how {
    WEFT_MEM_HOW_MEMFD = 0, /* host pages of a memfd (fd): no CUDA device in the process */
    WEFT_MEM_HOW_CUMEM,     /* device memory from the ops table's mem_create (cuMem, exportable) */
    WEFT_MEM_HOW_CUDA,      /* device memory from the ops table's malloc (cudaMalloc: legacy IPC) */
};

struct weft_mem_block {
    struct weft_mem_block *next;
    char *ptr;
    size_t size; /* memfd: mapped bytes, page multiple; device: the bytes asked for */
    int fd;      /* memfd only; -1 for device memory */
    int how;     /* enum weft_mem_how */
};

static pthread_mutex_t weft_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weft_mem_block *weft_mem_blocks;

/*
 * The device this thread's CUDA work goes to, or -1 when the process has no usable CUDA device
 * (no toolkit, WEFT_CUDA=0, no device): then ncclMemAlloc is host memory.
 */
static int weft_mem_current_device(const struct weft_cuda_ops *ops)
{
    int n = 0, dev = -1;
    if (ops->get_device_count(&n) != 0 || n <= 0 || ops->get_device(&dev) != 0)
        return -1;
    return dev;
}

/*
 * Device memory on the current device, as NVIDIA's ncclMemAlloc gives: cuMem (mem_create:
 * granularity-rounded, exportable as a POSIX fd, mapped for the devices that can reach it) unless
 * NCCL_CUMEM_ENABLE=0 or the driver lacks cuMem, then cudaMalloc (shared by legacy IPC).
 */
static ncclResult_t weft_mem_alloc_device(const struct weft_cuda_ops *ops, int dev,
                                          struct weft_mem_block *b, size_t size)
{
    int64_t knob = weft_param_CumemEnable();
    int err = WEFT_CUDA_ERR_NOT_SUPPORTED;
    if (knob != 0) {
        err = ops->mem_create((void **)&b->ptr, size, WEFT_MEM_DEVICE);
        b->how = WEFT_MEM_HOW_CUMEM;
    }
    if (err == WEFT_CUDA_ERR_NOT_SUPPORTED && knob <= 0) {
        err = ops->malloc((void **)&b->ptr, size);
        b->how = WEFT_MEM_HOW_CUDA;
    }
    if (err != 0) {
        WEFT_WARN("ncclMemAlloc: %zu bytes of device memory on device %d (%s): %s (%d)", size,
                  dev, b->how == WEFT_MEM_HOW_CUMEM ? "cuMem" : "cudaMalloc",
                  ops->error_string(err), err);
        return err == WEFT_CUDA_ERR_OUT_OF_MEMORY ? ncclSystemError : ncclUnhandledCudaError;
    }
    b->fd = -1;
    b->size = size;
    return ncclSuccess;
}

/* Host memory a local peer can map: a memfd, page-rounded. */
static ncclResult_t weft_mem_alloc_host(struct weft_mem_block *b, size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = (size + page - 1) / page * page;
    if (bytes < size) {
        WEFT_WARN("ncclMemAlloc: size %zu is too large", size);
        return ncclInvalidArgument;
    }
    b->how = WEFT_MEM_HOW_MEMFD;
    b->fd = memfd_create("weft-memalloc", MFD_CLOEXEC);
    if (b->fd < 0 || ftruncate(b->fd, (off_t)bytes) != 0) {
        WEFT_WARN("ncclMemAlloc: cannot create %zu bytes of shareable memory: %s", bytes,
                  strerror(errno));
        if (b->fd >= 0)
            close(b->fd);
        return ncclSystemError;
    }
    b->ptr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
    if (b->ptr == MAP_FAILED) {
        WEFT_WARN("ncclMemAlloc: mmap of %zu bytes failed: %s", bytes, strerror(errno));
        close(b->fd);
        return ncclSystemError;
    }
    b->size = bytes;
    return ncclSuccess;
}

ncclResult_t weft_mem_alloc(void **ptr_p, size_t size)
{
    if (ptr_p == NULL) {
        WEFT_WARN("ncclMemAlloc: ptr is NULL");
        return ncclInvalidArgument;
    }
    if (size == 0) {
        *ptr_p = NULL;
        return ncclSuccess;
    }
    struct weft_mem_block *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        WEFT_WARN("ncclMemAlloc: out of memory");
        return ncclSystemError;
    }
    const struct weft_cuda_ops *ops = weft_cuda();
    int dev = weft_mem_current_device(ops);
    ncclResult_t res = dev >= 0 ? weft_mem_alloc_device(ops, dev, b, size)
                                : weft_mem_alloc_host(b, size);
    if (res != ncclSuccess) {
        free(b);
        return res;
    }
    pthread_mutex_lock(&weft_mem_lock);
    b->next = weft_mem_blocks;
    weft_mem_blocks = b;
    pthread_mutex_unlock(&weft_mem_lock);
    WEFT_INFO(WEFT_LOG_ALLOC, "ncclMemAlloc: %zu bytes at %p (%s)", size, (void *)b->ptr,
              b->how == WEFT_MEM_HOW_MEMFD  ? "host memfd"
              : b->how == WEFT_MEM_HOW_CUMEM ? "device cuMem"
                                             : "device cudaMalloc");
    *ptr_p = b->ptr;
    return ncclSuccess;
}

ncclResult_t weft_mem_free(void *ptr)
{
    if (ptr == NULL)
        return ncclSuccess;
    pthread_mutex_lock(&weft_mem_lock);
    struct weft_mem_block **it = &weft_mem_blocks;
    while (*it != NULL && (*it)->ptr != ptr)
        it = &(*it)->next;
    struct weft_mem_block *b = *it;
    if (b != NULL)
        *it = b->next;
    pthread_mutex_unlock(&weft_mem_lock);
    if (b == NULL) {
        WEFT_WARN("ncclMemFree: %p was not returned by ncclMemAlloc", ptr);
        return ncclInvalidArgument;
    }
    int err = 0;
    if (b->how == WEFT_MEM_HOW_MEMFD) {
        munmap(b->ptr, b->size);
        close(b->fd);
    } else {
        const struct weft_cuda_ops *ops = weft_cuda();
        err = b->how == WEFT_MEM_HOW_CUMEM ? ops->mem_release(b->ptr) : ops->free(b->ptr);
    }
    if (err != 0) {
        /* Still the device's (its queued work may use it): back on the list, not lost. */
        WEFT_WARN("ncclMemFree(%p): releasing device memory failed: %s (%d)", ptr,
                  weft_cuda()->error_string(err), err);
        pthread_mutex_lock(&weft_mem_lock);
        b->next = weft_mem_blocks;
        weft_mem_blocks = b;
        pthread_mutex_unlock(&weft_mem_lock);
        return ncclUnhandledCudaError;
    }
    free(b);
    return ncclSuccess;
}

int weft_mem_lookup(const void *ptr, size_t size, size_t *offset_p, size_t *block_p)
{
    int fd = -1;
    const char *p = ptr;
    pthread_mutex_lock(&weft_mem_lock);
    for (struct weft_mem_block *b = weft_mem_blocks; b != NULL; b = b->next) {
        if (b->how == WEFT_MEM_HOW_MEMFD && p >= b->ptr && size <= b->size && (size_t)(p - b->ptr) <= b->size - size) {
            fd = b->fd;
            *offset_p = (size_t)(p - b->ptr);
            if (block_p != NULL)
                *block_p = b->size;
            break;
        }
    }
    pthread_mutex_unlock(&weft_mem_lock);
    return fd;
}


int weft_mem_device_block(const void *ptr, size_t size, char **base_p, size_t *bytes_p,
                                 int *cumem_p)
{
    const char *p = ptr;
    int found = 0;
    pthread_mutex_lock(&weft_mem_lock);
    for (struct weft_mem_block *b = weft_mem_blocks; b != NULL && !found; b = b->next) {
        if (b->how != WEFT_MEM_HOW_MEMFD && p >= b->ptr && size <= b->size &&
            (size_t)(p - b->ptr) <= b->size - size) {
            found = 1;
            *base_p = b->ptr;
            *bytes_p = b->size;
            *cumem_p = b->how == WEFT_MEM_HOW_CUMEM;
        }
    }
    pthread_mutex_unlock(&weft_mem_lock);
    return found;
}



int weft_mem_reg_find(struct ncclComm *comm, const void *ptr, size_t bytes, uint64_t *id_p,
                      size_t *off_p)
{
    const char *p = ptr;
    int found = 0;
    pthread_mutex_lock(&comm->reg_lock);
    for (const struct weft_reg *r = comm->regs; r != NULL && !found; r = r->next) {
        found = p >= r->buff && bytes <= r->size && (size_t)(p - r->buff) <= r->size - bytes;
        /* a shared registration before an unshared one covering the same bytes */
        if (found && r->share_id == 0)
            for (const struct weft_reg *q = r->next; q != NULL; q = q->next)
                if (q->share_id != 0 && p >= q->buff && bytes <= q->size &&
                    (size_t)(p - q->buff) <= q->size - bytes) {
                    r = q;
                    break;
                }
        if (found) {
            *id_p = r->share_id;
            *off_p = r->share_id != 0 ? (size_t)(p - r->share_base) : 0;
        }
    }
    pthread_mutex_unlock(&comm->reg_lock);
    return found;
}

int weft_mem_reg_covers(struct ncclComm *comm, const void *ptr, size_t bytes)
{
    uint64_t id;
    size_t off;
    return weft_mem_reg_find(comm, ptr, bytes, &id, &off);
}

void weft_mem_reg_drop(struct ncclComm *comm)
{
    pthread_mutex_lock(&comm->reg_lock);
    while (comm->regs != NULL) {
        struct weft_reg *r = comm->regs;
        comm->regs = r->next;
        r->magic = 0; /* no unshare: the peers unmap everything at their destroy */
        free(r);
    }
    pthread_mutex_unlock(&comm->reg_lock);
}
