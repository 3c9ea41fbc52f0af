/*
 * Cost model: predicted time of one collective, latency + bytes / bandwidth, per algorithm, fabric
 * and layout (which rank runs on which host). Pure arithmetic on values every rank shares, so every
 * rank predicts the same. The shared-memory constants are calibrated on the development machine
 * (see the perf issue notes), the socket ones across network namespaces (tests/net/net.sh algos);
 * the tuner chooses among algorithms with them, and tools/weft-scale prints them next to its event
 * simulation of the real schedules (the check that the formulas below describe the schedules).
 */
#ifndef WEFT_ALGO_COST_H
#define WEFT_ALGO_COST_H

#include <stddef.h>

#include "nccl.h"

/*
 * A fabric: a message costs alpha + bytes * per_byte, intra-host or inter-host; one NIC per host
 * carries, one message after the other, what its ranks send to other hosts.
 */
struct weft_cost_fabric {
    double intra_alpha_us, intra_us_per_byte;
    double inter_alpha_us, inter_us_per_byte;
    double msg_us;        /* time a message occupies its sender (and, between hosts, the NIC)
                           * besides its bytes: the CPU cost of a message */
    int ranks_per_host;   /* weft_cost_fabric_us only: hosts of this many consecutive ranks */
    double chunk_bytes;   /* bytes per step: large messages pipeline in steps of this size, each
                           * stored and forwarded whole; 0: steps stream (no fill term) */
};

/* The shared-memory fabric the defaults are calibrated for (one host, chunk_bytes 0). */
void weft_cost_fabric_shm(struct weft_cost_fabric *f);

/*
 * The socket fabric across hosts: shared memory inside a host, TCP between hosts (measured between
 * network namespaces over veth; see cost.c), chunk_bytes as given (the executor's step: 4 slots).
 * oversubscribed: some machine runs more ranks than it has cores, so that every hop, inside a host
 * too, waits for a core, and every message queued at a NIC for the proxy's turn.
 */
void weft_cost_fabric_socket(struct weft_cost_fabric *f, double chunk_bytes, int oversubscribed);

/*
 * What a layout does to each schedule, counted once from the rank-to-host map (the schedules'
 * own neighbours, weft_sched_tree for the tree). Halves: a tree piece is two halves, one per tree.
 */
struct weft_cost_layout {
    int nranks;
    int nhosts;
    int ranks_per_host;      /* the most ranks on one host */
    int ring_cross;          /* ring hops that leave a host (in ring order: one per host) */
    int ring_nic;            /* the most of those that leave one host */
    int hier_k;              /* ranks on every host when all hold the same number, else 0 */
    int tree_depth;          /* floor(log2 n): edges from the deepest rank to the root */
    int tree_path_inter;     /* the most inter-host edges on one rank's path to its root */
    int tree_rank_halves;    /* the most halves one rank sends per piece, both phases */
    int tree_nic_halves[2];  /* the most halves that leave one host per piece: up, down */
};

/*
 * Counts the layout of nranks ranks where rank r runs on host host[r] (0 .. nhosts-1, any order;
 * NULL: one host). O(n log^2 n); allocates a counter per host while it runs.
 */
ncclResult_t weft_cost_layout_init(struct weft_cost_layout *l, int nranks, const int *host);

/* The same for hosts of ranks_per_host consecutive ranks (the last one may hold fewer). */
ncclResult_t weft_cost_layout_blocks(struct weft_cost_layout *l, int nranks, int ranks_per_host);

/*
 * Microseconds for coll (enum weft_coll) with algo (enum weft_algo) of `bytes` (NCCL's count times
 * the element size) on layout l and fabric f. With c the bytes of one step, P the pieces, a and b
 * the alpha and per-byte cost of a link (mixed in the proportion the schedule crosses hosts, or the
 * slowest where it bottlenecks), o = msg_us:
 *   ring all-reduce:   2(n-1) steps of c = min(chunk, bytes/n); each piece is a chain around the
 *                      ring, and the host with most ring exits gates every step through its NIC:
 *                      2(n-1) max(P o + bytes/n b_nic, P (a_mix + o) + bytes/n b_mix);
 *   tree all-reduce:   up, then down, each over the slowest root path of D = floor(log2 n) edges,
 *                      dx of them between hosts, every edge a hop that stores and forwards one
 *                      step of h = min(chunk, bytes/2) (all of bytes up to 1024 4-byte elements:
 *                      one tree); once pieces overlap a slot holds a step of each tree, so a hop
 *                      forwards s = 2 - 1/P steps, and at least sx = 1.5 between hosts of several
 *                      ranks, where both trees leave a host together; then P-1 more pieces, each
 *                      gated per phase by the busiest rank (2 steps) or NIC (its halves):
 *                      2 (dx (a_x + sx' o + sx h b_x) + (D-dx) (a_i + s' o + s h b_i))
 *                        + (P-1) (W_up + W_down),  W = max(2, nic_halves) (o + h b_x),
 *                      s' and sx' at least 1.5 (a parent sends to its second child after the
 *                      first);
 *   direct all-reduce: 1 hop; a rank sends n messages of bytes (itself included) per piece of
 *                      chunk bytes, and a NIC its host's inter-host share, k (n - k) messages:
 *                      a + P n o + n bytes b_i + k (n-k) bytes b_x + P (k-1)(n-k) o;
 *   hier all-reduce:   H hosts of k ranks (hier_k), cells of s = bytes/n in pc = ceil(s/chunk)
 *                      messages: reduce-scatter and all-gather inside hosts, H part rings of
 *                      k-1 steps one after the other; between them a ring all-reduce of each
 *                      rank's shard across hosts, 2(H-1) steps, the NIC carrying the k rings of
 *                      its host (NIC bytes per host 2(H-1)/H bytes, the host-order ring's
 *                      2(n-1)/n: fewer for few hosts):
 *                      2 H (k-1) (pc (a_i + o) + s b_i)
 *                        + 2(H-1) max(pc k o + s k b_x, pc (a_x + o) + s b_x);
 *                      without a hierarchy (k < 2, one host, hosts of unequal size) the ring;
 *   other collectives: ring (n-1 steps of bytes; chains: (n-1) (a + o) + bytes b) and direct
 *                      ((n-1) bytes for all-gather and broadcast).
 * With chunk_bytes 0 (steps stream), msg_us 0 and one host the ring term is 2(n-1) a + 2(n-1)/n
 * bytes b and the tree term 2 floor(log2 n) a + 2 bytes b (n >= 4).
 */
double weft_cost_layout_us(int coll, int algo, size_t bytes, const struct weft_cost_layout *l,
                           const struct weft_cost_fabric *f);

/* The same on hosts of f->ranks_per_host consecutive ranks (one host where that is >= nranks). */
double weft_cost_fabric_us(int coll, int algo, size_t bytes, int nranks,
                           const struct weft_cost_fabric *f);

/*
 * The single-host model the tuner's single-host rule and ncclGroupSimulateEnd use, unchanged since
 * it was measured: the shared-memory fabric, ring 2(n-1) a + 2(n-1)/n bytes b, tree
 * 2 ceil(log2 n) a + 2 bytes b, direct as above. Allocates nothing.
 */
double weft_cost_us(int coll, int algo, size_t bytes, int nranks);

#endif
