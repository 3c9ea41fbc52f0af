/*
 * Memory for ncclMemAlloc and buffer registration.
 *
 * ncclMemAlloc follows NVIDIA's NCCL: in a process with a usable CUDA backend and a current device
 * (real or emulated) it is device memory on that device, from the ops table's mem_create (cuMem:
 * granularity-rounded, exportable as a POSIX fd) or, with NCCL_CUMEM_ENABLE=0 or no cuMem in the
 * driver, its malloc (cudaMalloc); programs cudaMemcpy into it and launch kernels on it. Without
 * a device (no toolkit, WEFT_CUDA=0) it is page-aligned host memory backed by a memfd, so that
 * local peers can map the very same pages (through the fd, e.g. pidfd_getfd or /proc/<pid>/fd)
 * and move data with one copy instead of two. A registry maps each allocation to what backs it;
 * ncclMemFree releases either kind and refuses any other pointer. ncclCommRegister records a
 * buffer on the communicator's list (comm->regs); the host executor's zero-copy collectives
 * (exec/zcopy.c) ask whether a buffer is registered, and map a peer's through its memfd.
 */
#ifndef WEFT_CORE_MEM_H
#define WEFT_CORE_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;

ncclResult_t weft_mem_alloc(void **ptr_p, size_t size);
ncclResult_t weft_mem_free(void *ptr);
/* The memfd and offset behind ptr if it lies in a host (memfd) ncclMemAlloc allocation (and, when block_p is
 * not NULL, the allocation's mapped size); -1 otherwise. */
int weft_mem_lookup(const void *ptr, size_t size, size_t *offset_p, size_t *block_p);

/* The device ncclMemAlloc block holding [ptr, ptr + size): 1 and its base, size and whether it
 * came from cuMem; 0 when none does. */
int weft_mem_device_block(const void *ptr, size_t size, char **base_p, size_t *bytes_p,
                          int *cumem_p);

#define WEFT_REG_MAGIC 0x7765667472656731ull /* "weftreg1" */

/* A registration: on its communicator's list (comm->regs, under comm->reg_lock). */
struct weft_reg {
    uint64_t magic;
    struct ncclComm *comm;
    struct weft_reg *next;
    char *buff;
    size_t size;
    /* Device buffers inside an ncclMemAlloc allocation on a communicator spanning processes:
     * the allocation offered to the peers (exec/cuda.c), or share_id 0. */
    uint64_t share_id;
    char *share_base;
};

/* ncclCommRegister and ncclCommDeregister (core/register.c): a registration on comm->regs; a
 * device buffer in an ncclMemAlloc allocation is offered to the peers (exec/cuda.c). */
ncclResult_t weft_mem_register(struct ncclComm *comm, void *buff, size_t size, void **handle_p);
ncclResult_t weft_mem_deregister(struct ncclComm *comm, void *handle);
/* 1 when [ptr, ptr + bytes) lies inside one buffer registered on comm. Any thread. */
int weft_mem_reg_covers(struct ncclComm *comm, const void *ptr, size_t bytes);
/* Like weft_mem_reg_covers; also the registration's share id (0: not shared with other
 * processes) and ptr's offset in the shared allocation. */
int weft_mem_reg_find(struct ncclComm *comm, const void *ptr, size_t bytes, uint64_t *id_p,
                      size_t *off_p);
/* Frees every registration left on comm (at destroy). */
void weft_mem_reg_drop(struct ncclComm *comm);

#endif
