/*
 * tree_bytes.h -- elements a rank sends in the double binary tree all-reduce, derived from the
 * tree shape (the expectation that the schedule unit test and the simulator both check).
 *
 * Pieces P of 2*chunk (one piece of len when chunk >= ceil(len/2)); half 0 (ceil(P/2)) goes over
 * tree 0, half 1 (floor(P/2)) over tree 1 (all of P over tree 0 when P <= min(chunk,
 * WEFT_SCHED_TREE_ONE_MAX)), and rank r sends each half once to every neighbour it has in that
 * tree: up to its parent, down to each child.
 */
#ifndef WEFT_TESTS_TREE_BYTES_H
#define WEFT_TESTS_TREE_BYTES_H

#include <stdint.h>

#include "algo/sched.h"

static inline uint64_t tree_expected_elems(uint64_t count, int n, int r, int nch, uint64_t chunk)
{
    int deg[2];
    for (int t = 0; t < 2; t++) {
        int nb[3];
        weft_sched_tree(n, t, r, &nb[0], &nb[1], &nb[2]);
        deg[t] = (nb[0] >= 0) + (nb[1] >= 0) + (nb[2] >= 0);
    }
    uint64_t total = 0;
    for (int ch = 0; ch < nch; ch++) {
        uint64_t off, len;
        weft_sched_range(count, ch, nch, &off, &len);
        uint64_t piece = chunk >= len - len / 2 ? len : 2 * chunk;
        for (uint64_t po = 0; po < len; po += piece) {
            uint64_t p = len - po < piece ? len - po : piece;
            uint64_t one = chunk < WEFT_SCHED_TREE_ONE_MAX ? chunk : WEFT_SCHED_TREE_ONE_MAX;
            if (p <= one) /* a small piece goes whole over tree 0 */
                total += p * (uint64_t)deg[0];
            else
                total += (p - p / 2) * (uint64_t)deg[0] + p / 2 * (uint64_t)deg[1];
        }
    }
    return total;
}

#endif
