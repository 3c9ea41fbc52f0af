/*
 * The LL ("low latency") protocol of the CUDA executor: the rules both the kernel
 * (kernels/coll_kernel.cu, through nvcc and g++) and the host side (src/exec/cuda.c, the tests,
 * in C) use. Simple is in dev_fifo.h; a connection carries one FIFO of each.
 *
 * A slot of the LL FIFO is a run of 16-byte lines; each line is two 8-byte halves, each a 4-byte
 * data word and a 4-byte flag: {d0, flag, d1, flag}. The sender stores a whole line with one
 * 16-byte volatile store; the receiver loads it with one 16-byte volatile load and takes the data
 * when both flags equal the flag of the step. Each 8-byte half is single-copy atomic (on the GPU
 * and on the host), so a half with the right flag has the right data: no fence, no tail to wait
 * for. Line 0 of a slot is the header {bytes of the slice, flag, signature, flag} (the
 * operation's signature word, exec/sig.h; 0: unchecked), so the receiver learns the slice's size
 * and the operation from the same flags and reports a peer that issued another operation or cut
 * another slice (different counts across ranks); lines 1 .. carry the data, 8 bytes a line, 16
 * bytes (two lines) a thread at a time.
 *
 * Credits as Simple: the sender waits until head + WEFT_STEPS > step (weft_fifo_has_credit) and
 * the receiver release-stores head = step + 1 once the whole block read the slot. After a slice
 * the sender also stores bytes[slot] and tail = step + 1 in the LL FIFO's struct weft_dev_recv_ctrl
 * (relaxed: nobody waits on them; they say how far the peer got when a wait times out).
 *
 * Flag of step s: weft_ll_flag(s) = 1 + (s mod 2^B), B = WEFT_LL_FLAG_BITS (31; a test build may
 * set 8), never 0 (the zeroed FIFO never matches). Steps come from the connection's LL step
 * counters in device memory, advanced by the kernel, so a graph replay uses fresh flags.
 * Wrap: a line left in a slot from exactly 2^B steps ago would carry the flag of the current step.
 * So in the last WEFT_STEPS steps of every half period (2^(B-1) steps; weft_ll_cleanup) the
 * sender writes the flag into every line of the slot, used or not: then every line of a slot holds
 * a flag of one of the last 2^(B-1) + WEFT_STEPS steps, none of which has the current flag.
 */
#ifndef WEFT_KERNELS_DEV_LL_H
#define WEFT_KERNELS_DEV_LL_H

#include <stddef.h>
#include <stdint.h>

#include "compat.h"
#include "dev_fifo.h"

#ifndef WEFT_LL_FLAG_BITS
#define WEFT_LL_FLAG_BITS 31
#endif
WEFT_STATIC_ASSERT(WEFT_LL_FLAG_BITS >= 5 && WEFT_LL_FLAG_BITS <= 31,
                   "LL flags: a half period must hold at least two rounds of slots");
#define WEFT_LL_FLAG_MASK ((((uint64_t)1) << WEFT_LL_FLAG_BITS) - 1)

#define WEFT_LL_LINE 16     /* bytes of a line */
#define WEFT_LL_LINE_DATA 8 /* data bytes of a line */
#define WEFT_LL_PACK 16     /* data bytes a thread moves at a time (two lines) */

/* The flag of `step`. */
WEFT_HD uint32_t weft_ll_flag(uint64_t step)
{
    return 1u + (uint32_t)(step & WEFT_LL_FLAG_MASK);
}

/* 1 when the sender of `step` must write every line of the slot (see the wrap rule above). */
WEFT_HD int weft_ll_cleanup(uint64_t step)
{
    uint64_t last = (WEFT_LL_FLAG_MASK >> 1) & ~(uint64_t)(WEFT_STEPS - 1);
    return (step & (WEFT_LL_FLAG_MASK >> 1) & ~(uint64_t)(WEFT_STEPS - 1)) == last;
}

/* One 8-byte half of a line: data in the low word, flag in the high word (little endian, the
 * order of {d, flag} in memory). */
WEFT_HD uint64_t weft_ll_half(uint32_t data, uint32_t flag)
{
    return (uint64_t)data | (uint64_t)flag << 32;
}

WEFT_HD int weft_ll_half_ok(uint64_t half, uint32_t flag)
{
    return (uint32_t)(half >> 32) == flag;
}

WEFT_HD uint32_t weft_ll_half_data(uint64_t half)
{
    return (uint32_t)half;
}

/* Data lines of a slice of `bytes` (the header line not counted). */
WEFT_HD uint64_t weft_ll_data_lines(uint64_t bytes)
{
    return (bytes + WEFT_LL_LINE_DATA - 1) / WEFT_LL_LINE_DATA;
}

/* Bytes of one LL slot carrying up to `payload` data bytes (a multiple of WEFT_LL_PACK). */
WEFT_HD size_t weft_ll_slot_bytes(size_t payload)
{
    return WEFT_LL_LINE * (1 + (size_t)weft_ll_data_lines(payload));
}

/* ---- layout: after the Simple FIFOs (dev_fifo.h) of a rank's allocation --------------------- */

/* Bytes of one LL receive block (control, then WEFT_STEPS slots). */
WEFT_HD size_t weft_dev_ll_block_bytes(size_t payload)
{
    return sizeof(struct weft_dev_recv_ctrl) + (size_t)WEFT_STEPS * weft_ll_slot_bytes(payload);
}

/* Offset of the LL receive block of the connection from `peer` on connection channel c. */
WEFT_HD size_t weft_dev_ll_recv_off(int c, int peer, int nranks, int nconn_chan, size_t slot_bytes,
                                    size_t payload)
{
    return weft_dev_fifo_bytes(nranks, nconn_chan, slot_bytes) +
           ((size_t)c * (size_t)nranks + (size_t)peer) * weft_dev_ll_block_bytes(payload);
}

/* Offset of the LL head word of the connection to `peer` on connection channel c. */
WEFT_HD size_t weft_dev_ll_head_off(int c, int peer, int nranks, int nconn_chan, size_t slot_bytes,
                                    size_t payload)
{
    return weft_dev_ll_recv_off(nconn_chan, 0, nranks, nconn_chan, slot_bytes, payload) +
           ((size_t)c * (size_t)nranks + (size_t)peer) * sizeof(struct weft_dev_send_ctrl);
}

/* Bytes of a rank's FIFO allocation, both protocols. */
WEFT_HD size_t weft_dev_all_fifo_bytes(int nranks, int nconn_chan, size_t slot_bytes,
                                       size_t payload)
{
    return weft_dev_ll_head_off(nconn_chan, 0, nranks, nconn_chan, slot_bytes, payload);
}

#endif
