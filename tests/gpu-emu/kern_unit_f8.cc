/* The collective kernel with 8-bit LL flags (they wrap every 256 steps of a connection, so the
 * cleanup of kernels/dev_ll.h runs in a short test) whose LL senders write the data lines 200 us
 * after the header (a receiver that could take a stale line then does), for the emulated GPU. */
#define WEFT_LL_FLAG_BITS 8
#define WEFT_LL_TEST_SENDER_DELAY_NS 200000
#define WEFT_COLL_KERNEL_SUFFIX _f8
#include "coll_kernel.cu"
