/* ncclCommRegister and ncclCommDeregister (core/mem.h): registrations on a communicator's list,
 * shared with the peers' kernels where the buffer is device memory. Above core/mem.c (its
 * lookups, which the executors use) and the CUDA executor (the sharing). */
#include <pthread.h>
#include <stdlib.h>

#include "core/check.h"
#include "core/communicator.h"
#include "core/log.h"
#include "core/mem.h"
#include "exec/cuda.h"

ncclResult_t weft_mem_register(struct ncclComm *comm, void *buff, size_t size, void **handle_p)
{
    if (handle_p == NULL) {
        WEFT_WARN("ncclCommRegister: handle is NULL");
        return ncclInvalidArgument;
    }
    if (buff == NULL && size > 0) {
        WEFT_WARN("ncclCommRegister: buff is NULL with size %zu", size);
        return ncclInvalidArgument;
    }
    struct weft_reg *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        WEFT_WARN("ncclCommRegister: out of memory");
        return ncclSystemError;
    }
    r->magic = WEFT_REG_MAGIC;
    r->comm = comm;
    r->buff = buff;
    r->size = size;
    size_t offset;
    int fd = size > 0 ? weft_mem_lookup(buff, size, &offset, NULL) : -1;
    char *base = NULL;
    size_t bytes = 0;
    int cumem = 0;
    if (size > 0 && weft_mem_device_block(buff, size, &base, &bytes, &cumem)) {
        r->share_id = weft_cuda_reg_share(comm, base, bytes, cumem);
        r->share_base = base;
        fd = r->share_id != 0 ? 0 : -1; /* for the log line */
    }
    pthread_mutex_lock(&comm->reg_lock);
    r->next = comm->regs;
    comm->regs = r;
    pthread_mutex_unlock(&comm->reg_lock);
    WEFT_INFO(WEFT_LOG_REG, "rank %d: registered %p (%zu bytes, %s)", comm->rank, buff, size,
              fd >= 0 ? "shareable" : "private");
    *handle_p = r;
    return ncclSuccess;
}

ncclResult_t weft_mem_deregister(struct ncclComm *comm, void *handle)
{
    if (handle == NULL)
        return ncclSuccess;
    /* Found on this communicator's list, or refused without being dereferenced (another
     * communicator's handle, one already deregistered, or garbage). */
    pthread_mutex_lock(&comm->reg_lock);
    struct weft_reg **it = &comm->regs;
    while (*it != NULL && *it != handle)
        it = &(*it)->next;
    struct weft_reg *r = *it;
    if (r != NULL)
        *it = r->next;
    pthread_mutex_unlock(&comm->reg_lock);
    if (r == NULL) {
        WEFT_WARN("ncclCommDeregister: %p is not a registration handle of this communicator",
                  handle);
        return ncclInvalidArgument;
    }
    weft_cuda_reg_unshare(comm, r->share_id);
    r->magic = 0;
    free(r);
    return ncclSuccess;
}
