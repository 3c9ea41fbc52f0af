/* What the parts of test_kern_unit share. */
#ifndef WEFT_TESTS_KERN_UNIT_H
#define WEFT_TESTS_KERN_UNIT_H

#ifdef __cplusplus
extern "C" {
#endif

/* kern_unit_rules.c: the LL wrap rule with 8-bit flags; returns the failures. */
int kern_unit_rules_f8(void);

/* kern_unit_f8.cc (and, on a GPU build, its nvcc twin): the collective kernel with 8-bit LL
 * flags, for weft_cuda_test_kernel. */
void weft_coll_kernel_emu_f8(void *params);
const void *weft_coll_kernel_device_fn_f8(void) __attribute__((weak));

#ifdef __cplusplus
}
#endif

#endif
