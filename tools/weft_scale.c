/*
 * weft-scale: projects all-reduce time at scale by running the real schedules (weft_sched_build)
 * of every rank through an event simulation of a fabric, and prints the cost model's prediction
 * (weft_cost_layout_us, what the tuner compares) next to it. With --tuner it prints instead what
 * the tuner chooses by size for a layout of hosts, and its predictions, without running anything.
 *
 * Fabric: hosts of --ranks-per-host consecutive ranks; a message between hosts costs --lat-us plus
 * bytes / --bw-gbps (GB/s) and goes through the sending host's one NIC, which serialises the
 * inter-host messages of all its ranks, first come first served; within a host --intra-lat-us and
 * --intra-bw-gbps. Each rank runs its steps in order, one at a time: a step starts when the rank
 * finished the previous one and, for a receive, when the message has arrived; a send occupies the
 * sender (and the NIC) for --msg-us plus bytes / bw, and its message arrives latency later. Steps
 * run in the order of their start times (a heap), so that a NIC is reserved in time order: a rank
 * that ran ahead in the simulation must not delay a sender of its host that starts earlier. FIFOs
 * are unbounded (the schedules are deadlock-free with two chunks; credit is not modelled), a step
 * is stored and forwarded whole (the executor slices it), receives and reductions cost nothing.
 * One channel, float elements; the step size (chunk) is 128 KiB, larger where the step lists would
 * not fit; the model is given the same.
 *
 * Output: one row per size: time (us) and busbw (GB/s, 2(n-1)/n * bytes / time) of ring, tree and
 * direct, each with the model's time, then the algorithm the model picks and the one the
 * simulation finds fastest ("-" where a schedule is too large to simulate).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/cost.h"
#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/comm.h"
#include "core/param.h"
#include "exec/lane.h"

#define SCALE_STEP_BUDGET (48u << 20) /* steps of all ranks together */

struct sstep {
    int32_t sp, rp;
    uint32_t count;
    uint8_t op;
};

struct msg {
    double arrival;
    int64_t next;
};

struct slot {
    uint64_t key; /* src * n + dst + 1; 0: empty */
    int64_t head, tail;
};

struct scale {
    int n, k;
    double lat, bpu, ilat, ibpu; /* us, us per byte: inter, intra */
    double msg;                  /* us a message occupies its sender (and NIC) besides its bytes */
    struct sstep *steps;
    uint64_t *first; /* [n+1] */
    struct slot *tab;
    uint64_t tabcap;
    struct msg *msgs;
    uint64_t nmsgs, msgcap;
};

static struct slot *scale_slot(struct scale *s, int src, int dst)
{
    uint64_t key = (uint64_t)src * (uint64_t)s->n + (uint64_t)dst + 1;
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    for (uint64_t i = h % s->tabcap;; i = (i + 1) % s->tabcap) {
        if (s->tab[i].key == key)
            return &s->tab[i];
        if (s->tab[i].key == 0) {
            s->tab[i].key = key;
            s->tab[i].head = s->tab[i].tail = -1;
            return &s->tab[i];
        }
    }
}

/* A binary min-heap of ranks by the start time of their next step (ties: lower rank). */
struct hent {
    double time;
    int rank;
};

struct heap {
    struct hent *e;
    int len;
    char *in; /* [n]: rank is in the heap */
};

static int hent_less(struct hent a, struct hent b)
{
    return a.time < b.time || (a.time == b.time && a.rank < b.rank);
}

static void heap_push(struct heap *h, struct hent x)
{
    int i = h->len++;
    while (i > 0 && hent_less(x, h->e[(i - 1) / 2])) {
        h->e[i] = h->e[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->e[i] = x;
    h->in[x.rank] = 1;
}

static struct hent heap_pop(struct heap *h)
{
    struct hent top = h->e[0], x = h->e[--h->len];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->len)
            break;
        if (c + 1 < h->len && hent_less(h->e[c + 1], h->e[c]))
            c++;
        if (!hent_less(h->e[c], x))
            break;
        h->e[i] = h->e[c];
        i = c;
    }
    if (h->len > 0)
        h->e[i] = x;
    h->in[top.rank] = 0;
    return top;
}

/* Queues rank r if it has a next step that can start: no receive, or its message is sent. */
static void scale_ready(struct scale *s, struct heap *h, const double *t, const uint64_t *idx,
                        int r)
{
    if (idx[r] >= s->first[r + 1])
        return;
    const struct sstep *st = &s->steps[idx[r]];
    double start = t[r];
    if (st->rp >= 0) {
        struct slot *q = scale_slot(s, st->rp, r);
        if (q->head < 0)
            return; /* queued again when the message is sent */
        double arr = s->msgs[q->head].arrival;
        start = start > arr ? start : arr;
    }
    heap_push(h, (struct hent){start, r});
}

/* Simulated microseconds of one all-reduce, or -1 when it does not fit the budget; the step
 * size used (elements) in *chunk_p. */
static double scale_run(struct scale *s, int algo, uint64_t count, uint64_t *chunk_p)
{
    int n = s->n;
    uint64_t chunk = 32768, total;
    for (;;) {
        total = 0;
        for (int r = 0; r < n && total <= SCALE_STEP_BUDGET; r++) {
            struct weft_sched_args a = {WEFT_COLL_ALLREDUCE, algo, count, n, r, 0, 0, 1, chunk,
                                        NULL, NULL, s->k};
            total += weft_sched_max_steps(&a);
        }
        if (total <= SCALE_STEP_BUDGET)
            break;
        if (chunk >= count)
            return -1;
        chunk *= 2;
    }
    *chunk_p = chunk;
    s->steps = malloc((total + 1) * sizeof(*s->steps));
    s->first = malloc(((size_t)n + 1) * sizeof(*s->first));
    struct weft_step *tmp = NULL;
    uint64_t tmpcap = 0, at = 0, npairs = 0;
    for (int r = 0; r < n; r++) {
        struct weft_sched_args a = {WEFT_COLL_ALLREDUCE, algo, count, n, r, 0, 0, 1, chunk,
                                    NULL, NULL, s->k};
        uint64_t m = weft_sched_max_steps(&a);
        if (m > tmpcap) {
            tmpcap = m;
            tmp = realloc(tmp, m * sizeof(*tmp));
        }
        uint64_t got = weft_sched_build(&a, tmp, m);
        s->first[r] = at;
        for (uint64_t i = 0; i < got; i++) {
            struct sstep *d = &s->steps[at++];
            d->sp = tmp[i].send_peer;
            d->rp = tmp[i].recv_peer;
            d->count = (uint32_t)tmp[i].count;
            d->op = tmp[i].op;
            npairs += d->sp >= 0;
        }
    }
    s->first[n] = at;
    free(tmp);
    s->tabcap = 2 * (npairs < (uint64_t)n * n ? npairs : (uint64_t)n * n) + 16;
    s->tab = calloc(s->tabcap, sizeof(*s->tab));
    s->msgcap = 1024;
    s->msgs = malloc(s->msgcap * sizeof(*s->msgs));
    s->nmsgs = 0;

    double *t = calloc((size_t)n, sizeof(double));
    int nhosts = (n + s->k - 1) / s->k;
    double *nic = calloc((size_t)nhosts, sizeof(double));
    uint64_t *idx = malloc((size_t)n * sizeof(*idx));
    struct heap h = {malloc((size_t)n * sizeof(*h.e)), 0, calloc((size_t)n, 1)};
    for (int r = 0; r < n; r++) {
        idx[r] = s->first[r];
        scale_ready(s, &h, t, idx, r);
    }
    /* Steps run in the order of their start times, so that each NIC serves its senders first
     * come, first served. */
    while (h.len > 0) {
        struct hent top = heap_pop(&h);
        int r = top.rank;
        const struct sstep *st = &s->steps[idx[r]];
        double start = top.time, bytes = 4.0 * st->count;
        if (st->rp >= 0) {
            struct slot *q = scale_slot(s, st->rp, r);
            q->head = s->msgs[q->head].next;
            if (q->head < 0)
                q->tail = -1;
        }
        if (st->sp >= 0) {
            int inter = r / s->k != st->sp / s->k;
            double arrival;
            if (inter) {
                double *free_at = &nic[r / s->k];
                double dep = start > *free_at ? start : *free_at;
                *free_at = dep + s->msg + bytes * s->bpu;
                t[r] = *free_at;
                arrival = t[r] + s->lat;
            } else {
                t[r] = start + s->msg + bytes * s->ibpu;
                arrival = t[r] + s->ilat;
            }
            if (s->nmsgs == s->msgcap) {
                s->msgcap *= 2;
                s->msgs = realloc(s->msgs, s->msgcap * sizeof(*s->msgs));
            }
            struct slot *q = scale_slot(s, r, st->sp);
            s->msgs[s->nmsgs] = (struct msg){arrival, -1};
            if (q->tail >= 0)
                s->msgs[q->tail].next = (int64_t)s->nmsgs;
            else
                q->head = (int64_t)s->nmsgs;
            q->tail = (int64_t)s->nmsgs++;
        } else if (st->op == WEFT_STEP_COPY) {
            t[r] = start + bytes * s->ibpu;
        } else {
            t[r] = start;
        }
        idx[r]++;
        scale_ready(s, &h, t, idx, r);
        if (st->sp >= 0 && st->sp != r && !h.in[st->sp])
            scale_ready(s, &h, t, idx, st->sp);
    }
    double end = 0;
    int stuck = 0;
    for (int r = 0; r < n; r++) {
        end = t[r] > end ? t[r] : end;
        stuck |= idx[r] < s->first[r + 1];
    }
    free(t);
    free(nic);
    free(idx);
    free(h.e);
    free(h.in);
    free(s->steps);
    free(s->first);
    free(s->tab);
    free(s->msgs);
    if (stuck) {
        fprintf(stderr, "weft-scale: %s with %d ranks did not finish\n", weft_algo_name(algo), n);
        exit(1);
    }
    return end;
}

static uint64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (uint64_t)v;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: weft-scale [--ranks N] [--ranks-per-host k] [--lat-us L] [--bw-gbps B]"
            " [--intra-lat-us L] [--intra-bw-gbps B] [--msg-us O] [--sizes 8,1K,1M,...]\n"
            "       weft-scale --tuner [--ranks N] [--hosts H] [--oversubscribed 0|1]"
            " [--sizes ...]\n"
            "  O: us a message occupies its sender (and NIC) besides its bytes (default 0.2)\n"
            "  bandwidths in GB/s; sizes in bytes (K, M, G suffixes), default 8 B .. 1 GiB by 8x\n"
            "  (--tuner: 8 B .. 32 MiB by 4x, and 64 MiB). --tuner prints the algorithm the\n"
            "  tuner chooses for an all-reduce on H hosts of N/H consecutive ranks (NCCL_ALGO and\n"
            "  WEFT_ALGO apply) and its predictions, without running anything.\n");
    exit(2);
}

WEFT_PARAM_DECL(ShmSlotBytes);
WEFT_PARAM_DECL(SocketSlotBytes);

/* The tuner's choices by size for a layout, as a communicator on it would make them. */
static int tuner_table(int n, int nhosts, int oversubscribed, const uint64_t *sizes, int nsizes)
{
    if (nhosts < 1 || nhosts > n || n % nhosts != 0) {
        fprintf(stderr, "weft-scale: --hosts %d must divide --ranks %d\n", nhosts, n);
        return 2;
    }
    /* The executor's step: 4 slots of the largest slot size among the transports in use. */
    int64_t slot = weft_param_ShmSlotBytes();
    if (nhosts > 1 && weft_param_SocketSlotBytes() > slot)
        slot = weft_param_SocketSlotBytes();
    struct weft_tune_comm tc;
    if (weft_tune_comm_blocks(&tc, n, n / nhosts, oversubscribed,
                              (double)(slot - WEFT_SLOT_HEADER) * WEFT_CHUNK_SLOTS) != ncclSuccess ||
        weft_comm_tune_cfg(&tc.cfg) != ncclSuccess) /* NCCL_ALGO etc., as a communicator */
        return 1;
    const struct weft_cost_layout *l = &tc.layout;
    printf("# weft-scale --tuner: all-reduce, %d ranks on %d hosts of %d%s; %s model, step %.0f "
           "KiB\n# layout: ring leaves hosts %d times; tree depth %d, %d inter-host edges on the "
           "longest path, a NIC sends %d+%d halves per piece\n",
           n, nhosts, n / nhosts, oversubscribed ? " (oversubscribed)" : "",
           nhosts > 1 ? "socket" : "shared-memory", tc.chunk_bytes / 1024, l->ring_cross,
           l->tree_depth, l->tree_path_inter, l->tree_nic_halves[0], l->tree_nic_halves[1]);
    printf("# %12s %8s %12s %12s %12s %12s\n", "bytes", "choice", "ring_us", "tree_us",
           "direct_us", "hier_us");
    for (int i = 0; i < nsizes; i++) {
        double us[WEFT_ALGO_COUNT];
        int a = weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, sizes[i], &tc, us);
        printf("%14llu %8s %12.1f %12.1f %12.1f %12.1f\n", (unsigned long long)sizes[i],
               weft_algo_name(a), us[WEFT_ALGO_RING], us[WEFT_ALGO_TREE], us[WEFT_ALGO_DIRECT],
               us[WEFT_ALGO_HIER]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct scale s = {0};
    int n = 1024, k = 8, tuner = 0, nhosts = 1, oversub = 0, sizes_set = 0;
    double lat = 2.0, bw = 25.0, ilat = 0.5, ibw = 100.0, msg = 0.2;
    uint64_t sizes[64];
    int nsizes = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "--tuner") == 0) {
            tuner = 1;
            continue;
        }
        if (v == NULL)
            usage();
        if (strcmp(o, "--ranks") == 0)
            n = atoi(v);
        else if (strcmp(o, "--ranks-per-host") == 0)
            k = atoi(v);
        else if (strcmp(o, "--hosts") == 0)
            nhosts = atoi(v);
        else if (strcmp(o, "--oversubscribed") == 0)
            oversub = atoi(v);
        else if (strcmp(o, "--lat-us") == 0)
            lat = atof(v);
        else if (strcmp(o, "--bw-gbps") == 0)
            bw = atof(v);
        else if (strcmp(o, "--intra-lat-us") == 0)
            ilat = atof(v);
        else if (strcmp(o, "--intra-bw-gbps") == 0)
            ibw = atof(v);
        else if (strcmp(o, "--msg-us") == 0)
            msg = atof(v);
        else if (strcmp(o, "--sizes") == 0) {
            nsizes = 0;
            sizes_set = 1;
            char *dup = strdup(v);
            for (char *tok = strtok(dup, ","); tok != NULL && nsizes < 64; tok = strtok(NULL, ","))
                sizes[nsizes++] = parse_size(tok);
            free(dup);
        } else
            usage();
        i++;
    }
    if (!sizes_set) {
        uint64_t top = tuner ? 64ull << 20 : 1ull << 30;
        for (uint64_t b = 8; b <= top; b *= tuner ? 4 : 8)
            sizes[nsizes++] = b;
        if (sizes[nsizes - 1] < top)
            sizes[nsizes++] = top;
    }
    if (tuner)
        return n < 1 ? 2 : tuner_table(n, nhosts, oversub, sizes, nsizes);
    if (n < 1 || k < 1 || bw <= 0 || ibw <= 0 || msg < 0 || nsizes == 0)
        usage();
    s.n = n;
    s.k = k;
    s.lat = lat;
    s.bpu = 1.0 / (bw * 1e3);
    s.ilat = ilat;
    s.ibpu = 1.0 / (ibw * 1e3);
    s.msg = msg;
    struct weft_cost_fabric f = {.intra_alpha_us = ilat, .intra_us_per_byte = s.ibpu,
                                 .inter_alpha_us = lat, .inter_us_per_byte = s.bpu,
                                 .msg_us = msg, .ranks_per_host = k};
    struct weft_cost_layout layout;
    if (weft_cost_layout_blocks(&layout, n, k) != ncclSuccess)
        return 1;
    static const int algos[4] = {WEFT_ALGO_RING, WEFT_ALGO_TREE, WEFT_ALGO_DIRECT, WEFT_ALGO_HIER};
    static const char *const names[4] = {"ring", "tree", "direct", "hier"};
    int nalgos = k > 1 && k < n && n % k == 0 ? 4 : 3; /* hier: hosts of k ranks each */

    printf("# weft-scale: all-reduce, %d ranks, %d per host, inter %.2f us %.1f GB/s, intra %.2f us "
           "%.1f GB/s, %.2f us per message\n",
           n, k, lat, bw, ilat, ibw, msg);
    printf("# %12s %12s %9s %12s %12s %9s %12s %12s %9s %12s", "bytes", "ring_us", "ring_bw",
           "ring_model", "tree_us", "tree_bw", "tree_model", "direct_us", "direct_bw",
           "direct_model");
    if (nalgos == 4)
        printf(" %12s %9s %12s", "hier_us", "hier_bw", "hier_model");
    printf(" %7s %7s\n", "model", "sim");
    for (int si = 0; si < nsizes; si++) {
        uint64_t bytes = sizes[si] < 4 ? 4 : sizes[si] / 4 * 4;
        double best = -1, bestm = -1;
        int pick = 0, pickm = 0;
        printf("%14llu", (unsigned long long)bytes);
        for (int a = 0; a < nalgos; a++) {
            uint64_t chunk = 32768;
            double us = scale_run(&s, algos[a], bytes / 4, &chunk);
            f.chunk_bytes = 4.0 * (double)chunk; /* the model pipelines in the sim's steps */
            double model = weft_cost_layout_us(WEFT_COLL_ALLREDUCE, algos[a], bytes, &layout, &f);
            if (us < 0) {
                printf(" %12s %9s", "-", "-");
            } else {
                double busbw = us > 0 ? (double)bytes / us / 1e3 * 2 * (n - 1) / n : 0;
                printf(" %12.2f %9.3f", us, busbw);
                if (best < 0 || us < best) {
                    best = us;
                    pick = a;
                }
            }
            printf(" %12.2f", model);
            if (bestm < 0 || model < bestm) {
                bestm = model;
                pickm = a;
            }
        }
        printf(" %7s %7s\n", names[pickm], names[pick]);
        fflush(stdout);
    }
    return 0;
}
