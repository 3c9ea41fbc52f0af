/* Alpha-beta cost of the schedules (see cost.h for the formulas). */
#include <stdlib.h>

#include "algo/cost.h"
#include "algo/sched.h"
#include "core/log.h"

/* Per dependent message, and per byte moved by one rank (about 4 GB/s through a FIFO). */
#define WEFT_COST_ALPHA_US 1.0
#define WEFT_COST_US_PER_BYTE (1.0 / 4000.0)
/*
 * TCP between network namespaces over veth (tests/net/net.sh algos on the 2-core development
 * machine). sendrecv_perf 2 hosts x 1 rank: 22-50 us at 8 B, 1.12-1.31 GB/s at 2 MiB: alpha + msg
 * and the per-byte cost. Where cores suffice, alpha 25 us between hosts and msg 5 us (two system
 * calls) are estimates, and a hop inside a host is shm's.
 * Where a machine runs more ranks than it has cores (2x2, 2x4 and 4x2 namespaces on 2 cores), a
 * message costs mostly the CPU time of the system calls and wake-ups on its way. The values are
 * the grid point (intra alpha 1..40, inter alpha 5..90, msg 2..40 us, 0.8..2 GB/s) whose choices
 * among ring, tree, direct and hier lose least against the fastest measured: three runs of the
 * benchmark (each 3 layouts x 8 sizes from 8 B to 512 KiB, medians of 3; 72 points): inter alpha
 * 30 us, msg 30 us, a hop inside a host shm's alpha. The choice then takes 1.04x the fastest
 * time on average (58 of 72 the fastest), against 1.09x (55) with the earlier guess of alpha
 * 5 us inside and between hosts; the best point of each run alone does no better on the others.
 */
#define WEFT_COST_SOCK_ALPHA_US 25.0
#define WEFT_COST_SOCK_US_PER_BYTE (1.0 / 1300.0)
#define WEFT_COST_SOCK_MSG_US 5.0
#define WEFT_COST_SOCK_ALPHA_OVERSUB_US 30.0
#define WEFT_COST_SOCK_MSG_OVERSUB_US 30.0

void weft_cost_fabric_shm(struct weft_cost_fabric *f)
{
    f->intra_alpha_us = f->inter_alpha_us = WEFT_COST_ALPHA_US;
    f->intra_us_per_byte = f->inter_us_per_byte = WEFT_COST_US_PER_BYTE;
    f->msg_us = 0;
    f->ranks_per_host = 1 << 30;
    f->chunk_bytes = 0;
}

void weft_cost_fabric_socket(struct weft_cost_fabric *f, double chunk_bytes, int oversubscribed)
{
    f->intra_alpha_us = WEFT_COST_ALPHA_US;
    f->intra_us_per_byte = WEFT_COST_US_PER_BYTE;
    f->inter_us_per_byte = WEFT_COST_SOCK_US_PER_BYTE;
    f->inter_alpha_us = oversubscribed ? WEFT_COST_SOCK_ALPHA_OVERSUB_US : WEFT_COST_SOCK_ALPHA_US;
    f->msg_us = oversubscribed ? WEFT_COST_SOCK_MSG_OVERSUB_US : WEFT_COST_SOCK_MSG_US;
    f->ranks_per_host = 1 << 30;
    f->chunk_bytes = chunk_bytes;
}

static int cost_ceil_log2(int n)
{
    int l = 0;
    while ((1 << l) < n)
        l++;
    return l;
}

static int cost_host(const int *host, int k, int r)
{
    return host != NULL ? host[r] : r / k;
}

static int cost_maxi(int a, int b)
{
    return a > b ? a : b;
}

/* host == NULL: hosts of k consecutive ranks. */
static ncclResult_t cost_layout(struct weft_cost_layout *l, int n, const int *host, int k)
{
    struct weft_cost_layout o = {0};
    o.nranks = n;
    for (int r = 0; r < n; r++)
        o.nhosts = cost_maxi(o.nhosts, cost_host(host, k, r) + 1);
    int stride = 4; /* per host: ranks, ring exits, tree halves sent out up and down */
    int *cnt = calloc((size_t)o.nhosts * (size_t)stride, sizeof(int));
    if (cnt == NULL) {
        WEFT_WARN("out of memory counting the layout of %d hosts", o.nhosts);
        return ncclSystemError;
    }
    while ((2 << o.tree_depth) <= n)
        o.tree_depth++;
    for (int r = 0; r < n; r++) {
        int h = cost_host(host, k, r), halves = 0;
        int *c = &cnt[(size_t)h * (size_t)stride];
        c[0]++;
        for (int t = 0; t < 2 && n > 1; t++) {
            int nb[3], inter = 0;
            weft_sched_tree(n, t, r, &nb[0], &nb[1], &nb[2]);
            /* inter-host edges on the way to the root */
            for (int x = r, p = nb[0]; p >= 0;) {
                int d0, d1, pp;
                inter += cost_host(host, k, p) != cost_host(host, k, x);
                weft_sched_tree(n, t, p, &pp, &d0, &d1);
                x = p;
                p = pp;
            }
            o.tree_path_inter = cost_maxi(o.tree_path_inter, inter);
            for (int i = 0; i < 3; i++) {
                if (nb[i] < 0)
                    continue;
                halves++;
                if (cost_host(host, k, nb[i]) != h)
                    c[2 + (i > 0)]++; /* parent: up; children: down */
            }
        }
        o.tree_rank_halves = cost_maxi(o.tree_rank_halves, halves);
    }
    /* The ring runs in host order (weft_sched_ring_order): it leaves every host once. */
    o.ring_cross = o.nhosts > 1 ? o.nhosts : 0;
    o.hier_k = o.nhosts > 0 ? n / o.nhosts : 0;
    for (int h = 0; h < o.nhosts; h++) {
        int *c = &cnt[(size_t)h * (size_t)stride];
        c[1] = o.nhosts > 1 && c[0] > 0;
        if (c[0] != o.hier_k)
            o.hier_k = 0;
        o.ranks_per_host = cost_maxi(o.ranks_per_host, c[0]);
        o.ring_nic = cost_maxi(o.ring_nic, c[1]);
        for (int ph = 0; ph < 2; ph++)
            o.tree_nic_halves[ph] = cost_maxi(o.tree_nic_halves[ph], c[2 + ph]);
    }
    free(cnt);
    *l = o;
    return ncclSuccess;
}

ncclResult_t weft_cost_layout_init(struct weft_cost_layout *l, int nranks, const int *host)
{
    if (host == NULL)
        return cost_layout(l, nranks, NULL, nranks > 0 ? nranks : 1);
    return cost_layout(l, nranks, host, 1);
}

ncclResult_t weft_cost_layout_blocks(struct weft_cost_layout *l, int nranks, int ranks_per_host)
{
    return cost_layout(l, nranks, NULL, ranks_per_host < 1 ? 1 : ranks_per_host);
}

static double cost_max(double a, double b)
{
    return a > b ? a : b;
}

double weft_cost_layout_us(int coll, int algo, size_t bytes, const struct weft_cost_layout *l,
                           const struct weft_cost_fabric *f)
{
    int nranks = l->nranks;
    double n = nranks, b = (double)bytes, chunk = f->chunk_bytes;
    if (nranks <= 1)
        return b * f->intra_us_per_byte / 4; /* a local copy */
    int multi = l->nhosts > 1, k = l->ranks_per_host;
    double ai = f->intra_alpha_us, bi = f->intra_us_per_byte, o = f->msg_us;
    double ax = multi ? f->inter_alpha_us : ai, bx = multi ? f->inter_us_per_byte : bi;
    if (coll == WEFT_COLL_ALLREDUCE && algo == WEFT_ALGO_TREE) {
        /* a piece of up to WEFT_SCHED_TREE_ONE_MAX elements (4-byte ones here) rides tree 0 */
        double one = 4.0 * WEFT_SCHED_TREE_ONE_MAX;
        one = chunk > 0 && chunk < one ? chunk : one;
        double h = b <= one ? b : chunk > 0 && chunk < b / 2 ? chunk : b / 2;
        double pieces = chunk > 0 && chunk < b / 2 ? (double)(size_t)(b / (2 * chunk) + 0.999999)
                                                   : 1;
        double rank = (l->tree_rank_halves < 4 ? l->tree_rank_halves : 4) / 2.0 * (o + h * bx);
        double w = 0;
        for (int ph = 0; ph < 2; ph++)
            w += cost_max(rank, l->tree_nic_halves[ph] * (o + h * bx));
        /* Up and down: the slowest root path's latencies, and each of its edges stores and
         * forwards one step. Once pieces overlap, a slot holds a step of each tree, so a rank
         * forwards two; across hosts the two trees leave a host at about the same levels from
         * neighbouring ranks, so a NIC often carries two even for one piece (weft-scale: 1 to 2
         * by layout; 1.5 is within 30% of both). */
        int d = l->tree_depth, dx = l->tree_path_inter < d ? l->tree_path_inter : d;
        double s = 2 - 1 / pieces, sx = multi && k >= 2 ? cost_max(s, 1.5) : s;
        /* a parent sends to its second child after its first: 1.5 messages per hop at least */
        double so = cost_max(s, 1.5), sxo = cost_max(sx, 1.5);
        if (chunk <= 0) /* steps stream: latency, then the busiest rank's bytes */
            return 2 * (dx * (ax + sxo * o) + (d - dx) * (ai + so * o)) + w;
        return 2 * (dx * (ax + sxo * o + sx * h * bx) + (d - dx) * (ai + so * o + s * h * bi)) +
               (pieces - 1) * w;
    }
    if (algo == WEFT_ALGO_DIRECT && coll <= WEFT_COLL_REDUCE) {
        /* One hop; the busiest rank sends n messages, (n-1) or n times the bytes; a NIC carries
         * its host's ranks' inter-host share of them, k (n - k) messages. */
        double per_rank = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_BROADCAST ? (n - 1) * b
                                                                                      : n * b;
        double pieces = chunk > 0 && b > chunk ? (double)(size_t)(b / chunk + 0.999999) : 1;
        double t = ax + pieces * n * o + per_rank * bi;
        if (multi)
            t += (double)k * per_rank * (n - k) / n * bx + pieces * (k - 1) * (n - k) * o;
        return t;
    }
    if (coll == WEFT_COLL_ALLREDUCE && algo == WEFT_ALGO_HIER && l->hier_k > 1 && multi) {
        /* Cells of s = bytes/n, pc messages each. Inside a host: the H part rings of k-1 steps
         * one after the other (a ring's ranks finish together, so their latencies add up;
         * weft-scale agrees), twice; across hosts: a ring all-reduce of 2(H-1) steps whose NIC
         * carries the k rings of its host at once. */
        double hk = l->hier_k, nh = l->nhosts, s = b / n;
        double pc = chunk > 0 && s > chunk ? (double)(size_t)(s / chunk + 0.999999) : 1;
        double intra = (hk - 1) * nh * (pc * (ai + o) + s * bi);
        double inter = 2 * (nh - 1) * cost_max(pc * hk * o + s * hk * bx, pc * (ax + o) + s * bx);
        return 2 * intra + inter;
    }
    /* Ring (HIER where it has no hierarchy): a mixed alpha and per-byte cost along the ring; the
     * NIC with most exits gates. */
    double fr = l->ring_cross / n;
    double amix = fr * ax + (1 - fr) * ai, bmix = fr * bx + (1 - fr) * bi;
    double bnic = multi ? cost_max(bi, l->ring_nic * bx) : bi;
    double steps, per_step;
    switch (coll) {
    case WEFT_COLL_ALLREDUCE: /* reduce-scatter + all-gather around the ring */
        steps = 2 * (n - 1);
        per_step = b / n;
        break;
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_REDUCESCATTER:
    case WEFT_COLL_ALLTOALL: /* bytes is the per-rank block */
    case WEFT_COLL_GATHER:
    case WEFT_COLL_SCATTER:
        steps = n - 1;
        per_step = b;
        break;
    case WEFT_COLL_BROADCAST:
    case WEFT_COLL_REDUCE: /* pipelined chain: the last rank starts n-1 messages late */
        return (n - 1) * (amix + o) + b * bnic;
    default: /* send/recv */
        return amix + o + b * bnic;
    }
    double pieces = chunk > 0 && per_step > chunk ? (double)(size_t)(per_step / chunk + 0.999999)
                                                  : 1;
    return steps * cost_max(pieces * o + per_step * bnic, pieces * (amix + o) + per_step * bmix);
}

double weft_cost_fabric_us(int coll, int algo, size_t bytes, int nranks,
                           const struct weft_cost_fabric *f)
{
    struct weft_cost_layout l;
    int k = f->ranks_per_host < nranks ? f->ranks_per_host : nranks;
    if (weft_cost_layout_blocks(&l, nranks, k) != ncclSuccess)
        return -1;
    return weft_cost_layout_us(coll, algo, bytes, &l, f);
}

double weft_cost_us(int coll, int algo, size_t bytes, int nranks)
{
    double n = nranks, b = (double)bytes, alpha = WEFT_COST_ALPHA_US, beta = WEFT_COST_US_PER_BYTE;
    double steps, moved;
    if (nranks <= 1)
        return b * beta / 4; /* a local copy */
    if (coll == WEFT_COLL_ALLREDUCE && algo == WEFT_ALGO_TREE)
        return 2 * cost_ceil_log2(nranks) * alpha + 2 * b * beta;
    if (algo == WEFT_ALGO_DIRECT && coll <= WEFT_COLL_REDUCE)
        return alpha + (coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_BROADCAST ? n - 1 : n) *
                           b * beta;
    switch (coll) {
    case WEFT_COLL_ALLREDUCE:
        steps = 2 * (n - 1);
        moved = 2 * (n - 1) / n * b;
        break;
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_REDUCESCATTER:
    case WEFT_COLL_ALLTOALL:
    case WEFT_COLL_GATHER:
    case WEFT_COLL_SCATTER:
        steps = n - 1;
        moved = (n - 1) * b;
        break;
    case WEFT_COLL_BROADCAST:
    case WEFT_COLL_REDUCE:
        steps = n - 1;
        moved = b;
        break;
    default:
        steps = 1;
        moved = b;
        break;
    }
    return steps * alpha + moved * beta;
}
