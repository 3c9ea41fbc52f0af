/*
 * Cost model: predicted time of one collective, latency + bytes / bandwidth, per algorithm and
 * fabric. Pure, so every rank predicts the same from the same arguments. The default constants are
 * calibrated for shared memory on the development machine (see the perf issue notes); the tuner
 * that chooses among algorithms builds on this, and tools/weft-scale puts it next to its event
 * simulation of the real schedules.
 */
#ifndef WEFT_ALGO_COST_H
#define WEFT_ALGO_COST_H

#include <stddef.h>

/*
 * A fabric: hosts of ranks_per_host consecutive ranks; a message costs alpha + bytes * per_byte,
 * intra-host or inter-host. One NIC per host carries all its ranks' inter-host bytes.
 */
struct weft_cost_fabric {
    double intra_alpha_us, intra_us_per_byte;
    double inter_alpha_us, inter_us_per_byte;
    int ranks_per_host; /* >= nranks: one host */
};

/* The shared-memory fabric the defaults are calibrated for (one host). */
void weft_cost_fabric_shm(struct weft_cost_fabric *f);

/*
 * Microseconds for coll (enum weft_coll) with algo (enum weft_algo) of `bytes` (NCCL's count times
 * the element size) among nranks on fabric f. Per algorithm, h hops of latency and the bytes the
 * busiest rank (or NIC) moves:
 *   ring all-reduce:   2(n-1) hops, 2(n-1)/n * bytes;
 *   tree all-reduce:   2 ceil(log2 n) hops, 2 * bytes (an internal node sends its half up once
 *                      and down twice, the other half up once: 4 halves);
 *   direct all-reduce: 1 hop, n * bytes (every rank sends its input to every rank);
 * hops on a multi-host fabric count as inter-host in the proportion the schedule has (ring: 1 in
 * ranks_per_host; tree: the levels above log2(ranks_per_host)); bytes through the NIC cost the
 * inter-host rate, shared by the host's ranks for direct.
 */
double weft_cost_fabric_us(int coll, int algo, size_t bytes, int nranks,
                           const struct weft_cost_fabric *f);

/* The same on the shared-memory fabric. */
double weft_cost_us(int coll, int algo, size_t bytes, int nranks);

#endif
