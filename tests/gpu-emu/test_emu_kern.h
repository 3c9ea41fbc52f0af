/* Parameters and tables of the gpu-emu test kernels (test_emu_kern.cc); C and C++. */
#ifndef WEFT_TEST_EMU_KERN_H
#define WEFT_TEST_EMU_KERN_H

#include <stdint.h>

#include "cuda/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

struct temu_index_params {
    uint32_t *phase1, *phase2, *dims;
};
struct temu_axpb_params {
    uint64_t *data;
    int n;
    uint64_t mul, add;
};
struct temu_flag_params {
    uint64_t *flag, *out;
    uint64_t value;
    unsigned sleep_ms;
};
struct temu_order_params {
    uint32_t *active, *max_active, *next, *order;
};
struct temu_v16_params {
    const void *in;
    void *out;
    uint32_t *done;
    int n;
};

/* One rank's view of a ring of mailboxes: slot [rank * nblocks + block]. */
struct temu_ring_params {
    uint64_t *flag, *ack, *mail, *out;
    int rank, nranks, iters;
};

extern const struct weft_kernel temu_ring_kernel;
extern const struct weft_kernel temu_index_kernel, temu_named_kernel, temu_mismatch_kernel,
    temu_deadlock_kernel, temu_axpb_kernel, temu_sleep_store_kernel, temu_spin_kernel,
    temu_trap_kernel, temu_order_kernel, temu_v16_kernel;

#ifdef __cplusplus
}
#endif

#endif
