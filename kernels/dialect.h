/*
 * The kernel dialect: one kernel source, two compilers.
 *
 *   nvcc (__CUDACC__): the real GPU. Memory order maps to inline PTX (ld.acquire / st.release /
 *        ld.relaxed / st.relaxed / fence.acq_rel with .gpu or .sys scope, generic addressing so a
 *        pointer may be global, host-mapped or shared).
 *   g++:  the emulated GPU (src/cuda/emu.c). Each emulated GPU thread is an OS thread; indices
 *        come from the thread-local context of src/cuda/emu_thread.h; memory order maps to
 *        __atomic builtins (scope ignored: the host is one coherent domain); barriers are real
 *        blocking barriers; spin hints yield.
 *
 * C++ only; kernels are never compiled as C. Keep raw volatile + fence idioms out of kernels: use
 * these functions, whose C++ memory-model meaning maps to PTX by NVIDIA's published mapping, so a
 * protocol that is race-free (TSan-clean) on the emulator is sound on the device.
 *
 * Kernel entry points: the GPU takes the params struct by value, the emulator a pointer to the
 * launch's copy. WEFT_KERNEL_ENTRY writes both from one body:
 *
 *     WEFT_DEVFN void my_body(const struct my_params *p) { ... weft_tid() ... }
 *     WEFT_KERNEL_ENTRY(my_kernel, struct my_params, my_body)
 *
 * defines `__global__ void my_kernel(struct my_params)` under nvcc and
 * `void my_kernel_emu(void *params)` under g++ (for struct weft_kernel's emu_fn).
 *
 * Warp size: WEFT_WARP_SIZE is 32 on the GPU; on the emulator it is WEFT_EMU_WARP_SIZE (default
 * 32), a compile-time constant that a test build may lower (-DWEFT_EMU_WARP_SIZE=1) to run a
 * kernel with blocks of 1, 2 or 4 threads. Never write the literal 32.
 */
#ifndef WEFT_KERNELS_DIALECT_H
#define WEFT_KERNELS_DIALECT_H

#ifndef __cplusplus
#error "kernels/dialect.h is C++: compile kernels with nvcc or g++"
#endif

#include <stdint.h>

#include "compat.h"

/* Scopes of memory order: threads of this program on this device, or the whole system (host,
 * peer devices, other processes). */
#define WEFT_SCOPE_GPU 1
#define WEFT_SCOPE_SYS 2

/* A 16-byte vector; aligned 16 so one instruction moves it on the GPU. */
struct weft_u128 {
    uint64_t lo, hi;
} WEFT_ALIGNED_TYPE(16);

/* ============================================================================================ */
#if defined(__CUDACC__)

#define WEFT_GLOBAL __global__
#define WEFT_DEVFN static __device__ __forceinline__
#define WEFT_WARP_SIZE 32

#define WEFT_KERNEL_ENTRY(name, ptype, body)                                                       \
    __global__ void name(ptype weft_params_)                                                       \
    {                                                                                              \
        body(&weft_params_);                                                                       \
    }

WEFT_DEVFN int weft_tid(void) { return (int)threadIdx.x; }
WEFT_DEVFN int weft_ntid(void) { return (int)blockDim.x; }
WEFT_DEVFN int weft_bid(void) { return (int)blockIdx.x; }
WEFT_DEVFN int weft_nbid(void) { return (int)gridDim.x; }

WEFT_DEVFN void weft_sync_block(void) { __syncthreads(); }
/* Named barrier 1..15; nthreads a multiple of WEFT_WARP_SIZE. */
WEFT_DEVFN void weft_bar_sync(int id, int nthreads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

WEFT_DEVFN void *weft_shared(void)
{
    extern __shared__ __align__(16) unsigned char weft_dyn_smem_[];
    return (void *)weft_dyn_smem_;
}

/* The asm strings differ only by scope; a constant scope folds the branch away. */
#define WEFT_PTX_SCOPED(gpu_stmt, sys_stmt)                                                        \
    do {                                                                                           \
        if (scope == WEFT_SCOPE_SYS) {                                                             \
            sys_stmt;                                                                              \
        } else {                                                                                   \
            gpu_stmt;                                                                              \
        }                                                                                          \
    } while (0)

WEFT_DEVFN uint64_t weft_ld_acquire_u64(const uint64_t *p, int scope)
{
    uint64_t v;
    WEFT_PTX_SCOPED(asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"),
                    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"));
    return v;
}
WEFT_DEVFN void weft_st_release_u64(uint64_t *p, uint64_t v, int scope)
{
    WEFT_PTX_SCOPED(asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"),
                    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"));
}
WEFT_DEVFN uint64_t weft_ld_relaxed_u64(const uint64_t *p, int scope)
{
    uint64_t v;
    WEFT_PTX_SCOPED(asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"),
                    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"));
    return v;
}
WEFT_DEVFN void weft_st_relaxed_u64(uint64_t *p, uint64_t v, int scope)
{
    WEFT_PTX_SCOPED(asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"),
                    asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"));
}
WEFT_DEVFN uint32_t weft_ld_acquire_u32(const uint32_t *p, int scope)
{
    uint32_t v;
    WEFT_PTX_SCOPED(asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"),
                    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"));
    return v;
}
WEFT_DEVFN void weft_st_release_u32(uint32_t *p, uint32_t v, int scope)
{
    WEFT_PTX_SCOPED(asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"),
                    asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"));
}
WEFT_DEVFN uint32_t weft_ld_relaxed_u32(const uint32_t *p, int scope)
{
    uint32_t v;
    WEFT_PTX_SCOPED(asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"),
                    asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"));
    return v;
}
WEFT_DEVFN void weft_st_relaxed_u32(uint32_t *p, uint32_t v, int scope)
{
    WEFT_PTX_SCOPED(asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"),
                    asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"));
}
WEFT_DEVFN void weft_fence(int scope)
{
    WEFT_PTX_SCOPED(asm volatile("fence.acq_rel.gpu;" ::: "memory"),
                    asm volatile("fence.acq_rel.sys;" ::: "memory"));
}

WEFT_DEVFN struct weft_u128 weft_ld_v16(const void *p)
{
    struct weft_u128 v;
    asm volatile("ld.v2.u64 {%0, %1}, [%2];" : "=l"(v.lo), "=l"(v.hi) : "l"(p) : "memory");
    return v;
}
/* Receiver reads of FIFO data another agent writes: volatile, so no stale L1 line is reused. */
WEFT_DEVFN struct weft_u128 weft_ld_volatile_v16(const void *p)
{
    struct weft_u128 v;
    asm volatile("ld.volatile.v2.u64 {%0, %1}, [%2];" : "=l"(v.lo), "=l"(v.hi) : "l"(p) : "memory");
    return v;
}
WEFT_DEVFN void weft_st_v16(void *p, struct weft_u128 v)
{
    asm volatile("st.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v.lo), "l"(v.hi) : "memory");
}
WEFT_DEVFN void weft_st_volatile_v16(void *p, struct weft_u128 v)
{
    asm volatile("st.volatile.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v.lo), "l"(v.hi) : "memory");
}

WEFT_DEVFN void weft_spin_hint(void) { __nanosleep(64); }
WEFT_DEVFN uint64_t weft_globaltimer_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Device-side assert: the kernel stops and the launch reports an error (710 / 719). */
WEFT_DEVFN void weft_trap(const char *why)
{
    (void)why;
    __trap();
}

#undef WEFT_PTX_SCOPED

/* ============================================================================================ */
#else /* g++: the emulated GPU */

#include <sched.h>
#include <time.h>

#include "cuda/emu_thread.h"

#define WEFT_GLOBAL
#define WEFT_DEVFN static inline
#ifndef WEFT_EMU_WARP_SIZE
#define WEFT_EMU_WARP_SIZE 32
#endif
#define WEFT_WARP_SIZE WEFT_EMU_WARP_SIZE

#define WEFT_KERNEL_ENTRY(name, ptype, body)                                                       \
    void name##_emu(void *weft_params_)                                                            \
    {                                                                                              \
        body((const ptype *)weft_params_);                                                         \
    }

WEFT_DEVFN int weft_tid(void) { return weft_emu_tls.tid; }
WEFT_DEVFN int weft_ntid(void) { return weft_emu_tls.ntid; }
WEFT_DEVFN int weft_bid(void) { return weft_emu_tls.bid; }
WEFT_DEVFN int weft_nbid(void) { return weft_emu_tls.nbid; }

WEFT_DEVFN void weft_sync_block(void) { weft_emu_sync_block(); }
/* Any count on the emulator; it checks that every arrival of a generation passes the same one. */
WEFT_DEVFN void weft_bar_sync(int id, int nthreads) { weft_emu_bar_sync(id, nthreads); }
WEFT_DEVFN void *weft_shared(void) { return weft_emu_tls.shared; }

WEFT_DEVFN uint64_t weft_ld_acquire_u64(const uint64_t *p, int scope)
{
    (void)scope;
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
WEFT_DEVFN void weft_st_release_u64(uint64_t *p, uint64_t v, int scope)
{
    (void)scope;
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
WEFT_DEVFN uint64_t weft_ld_relaxed_u64(const uint64_t *p, int scope)
{
    (void)scope;
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
WEFT_DEVFN void weft_st_relaxed_u64(uint64_t *p, uint64_t v, int scope)
{
    (void)scope;
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
WEFT_DEVFN uint32_t weft_ld_acquire_u32(const uint32_t *p, int scope)
{
    (void)scope;
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
WEFT_DEVFN void weft_st_release_u32(uint32_t *p, uint32_t v, int scope)
{
    (void)scope;
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
WEFT_DEVFN uint32_t weft_ld_relaxed_u32(const uint32_t *p, int scope)
{
    (void)scope;
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
WEFT_DEVFN void weft_st_relaxed_u32(uint32_t *p, uint32_t v, int scope)
{
    (void)scope;
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
WEFT_DEVFN void weft_fence(int scope)
{
    (void)scope;
    __atomic_thread_fence(__ATOMIC_ACQ_REL);
}

/* Plain 16-byte load, for data ordered by an earlier acquire. */
WEFT_DEVFN struct weft_u128 weft_ld_v16(const void *p)
{
    return *(const struct weft_u128 *)p;
}
/*
 * Loads and stores that may race with another agent (LL lines, FIFO data polled before an
 * acquire): two relaxed 8-byte atomics, which is what the GPU guarantees per half (each 8-byte
 * half is single-copy atomic; the pair is not). Keeps TSan quiet about intended races and stops
 * the compiler from hoisting a poll out of its loop.
 */
WEFT_DEVFN struct weft_u128 weft_ld_volatile_v16(const void *p)
{
    const uint64_t *q = (const uint64_t *)p;
    struct weft_u128 v;
    v.lo = __atomic_load_n(&q[0], __ATOMIC_RELAXED);
    v.hi = __atomic_load_n(&q[1], __ATOMIC_RELAXED);
    return v;
}
WEFT_DEVFN void weft_st_v16(void *p, struct weft_u128 v)
{
    uint64_t *q = (uint64_t *)p;
    __atomic_store_n(&q[0], v.lo, __ATOMIC_RELAXED);
    __atomic_store_n(&q[1], v.hi, __ATOMIC_RELAXED);
}
WEFT_DEVFN void weft_st_volatile_v16(void *p, struct weft_u128 v) { weft_st_v16(p, v); }

WEFT_DEVFN void weft_spin_hint(void) { weft_emu_spin_hint(); }
WEFT_DEVFN uint64_t weft_globaltimer_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
WEFT_DEVFN void weft_trap(const char *why) { weft_emu_trap(why); }

#endif

/* Lane and warp of the calling thread (from the constants above). */
WEFT_DEVFN int weft_lane(void) { return weft_tid() % WEFT_WARP_SIZE; }
WEFT_DEVFN int weft_warp(void) { return weft_tid() / WEFT_WARP_SIZE; }

#endif
