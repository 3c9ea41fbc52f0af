/*
 * The emulated GPU's per-thread launch context, read by kernels/dialect.h in its g++ mapping.
 *
 * Each emulated GPU thread is a real OS thread (a pooled pthread). Before calling a kernel's
 * emu_fn, the emulator (src/cuda/emu.c) fills weft_emu_tls for that thread: indices, sizes, the
 * block's dynamic shared memory, and opaque pointers to the block and launch that the barrier
 * functions below use. Outside a kernel weft_emu_tls.block is NULL.
 *
 * C and C++: the emulator is C, the kernels are C++ (g++).
 */
#ifndef WEFT_CUDA_EMU_THREAD_H
#define WEFT_CUDA_EMU_THREAD_H

#ifdef __cplusplus
extern "C" {
#endif

struct weft_emu_tctx {
    int tid, ntid; /* threadIdx.x, blockDim.x */
    int bid, nbid; /* blockIdx.x, gridDim.x */
    int device;    /* the emulated device running the kernel */
    void *shared;  /* the block's dynamic shared memory (launch's shared_bytes), NULL if 0 */
    void *block;   /* struct emu_block *, opaque */
    void *launch;  /* struct emu_launch *, opaque */
};

extern __thread struct weft_emu_tctx weft_emu_tls;

/*
 * Barriers of the calling thread's block. sync_block: every live thread of the block (threads
 * that returned from the kernel no longer count, as on the hardware). bar_sync(id, n): named
 * barrier id 1..15 completing when n threads arrived; the first arrival of a generation sets n,
 * a later arrival with another n is a kernel bug: the launch fails (719) and its threads are
 * unwound. A block whose every live thread waits in barriers that cannot complete is a deadlock:
 * same outcome, with a message naming the kernel, block and barriers.
 */
void weft_emu_sync_block(void);
void weft_emu_bar_sync(int id, int nthreads);
/* Spin-wait hint: yields the CPU (sched_yield; every 256th call sleeps 20 us); unwinds the thread
 * when its launch failed, so a kernel spinning on a flag never outlives a trap. */
void weft_emu_spin_hint(void);
/* Device-side assert: the launch fails with 710 and every thread of it is unwound. */
void weft_emu_trap(const char *why) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif

#endif
