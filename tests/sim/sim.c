/*
 * The simulator: runs the real schedules (src/algo) of n virtual ranks (1..64) through the real
 * step engine (src/exec/lane.h) in one thread, over in-memory FIFO connections.
 *
 * For every ordered pair (a, b) that a schedule uses and every channel, one struct weft_fifo_ctrl
 * and WEFT_STEPS slots are shared by a's send end and b's receive end. Each (rank, channel) gets a
 * lane; the lanes are progressed round-robin until all are done. A full round in which no lane
 * moves is a deadlock: the test fails and names the stuck ranks and what they wait for.
 *
 * Slots are small (256 B; 1 KiB for the large counts) and chunk is two slots' worth of elements,
 * so that every step is sliced and large counts loop over many pieces. All-to-all, gather, scatter
 * and send/recv use one element less than four slots, so that a FIFO holds exactly the two chunks
 * the pairwise exchange relies on (as in the host executor) and slices do not line up with chunks.
 * Outputs are checked element by element against a plain loop, with inputs chosen so that every
 * result is exact in any order (small integers, +-1 for products, n * 2^j for float avg so that
 * each premultiplied term is a power of two); out-of-place inputs must be left untouched, and a
 * reduce or gather must not write the non-root outputs. Bytes sent per rank (the lanes'
 * bytes_sent) must equal the algorithm's formula.
 *
 * Send/recv runs as "sendrecv": every rank r has two lanes per channel, a SEND to r+d and a RECV
 * from r-d, progressed independently, for d = 1 and d = 0 (a self-send over the loopback
 * connection from a rank to itself). All-to-all and send/recv have no in-place form.
 *
 * All-reduce, all-gather, reduce-scatter, broadcast and reduce run with algorithm RING ("NAME")
 * and DIRECT ("NAME-direct", one hop: every rank sends straight to the ranks that need its data,
 * itself included over a loopback connection where the schedule uses one, and the reducing ones
 * add the n contributions in rank order); direct uses the all-to-all chunk, the host executor's
 * (its FIFOs must hold two chunks too, and a loopback SEND must fit before its RECV). Every
 * rank's all-reduce output must be bitwise equal to rank 0's. All-reduce also runs with TREE
 * ("allreduce-tree": the double binary tree, with the all-to-all chunk too, so that a FIFO holds
 * exactly two chunks; a full round without progress fails as a deadlock). The direct all-reduce, reduce-scatter
 * and reduce also run "float sum rounding": float inputs whose sums round, so that the result
 * depends on the order of the additions; every output (each block of a reduce-scatter, the
 * reduce's root) must equal, bit for bit, the float sum in rank order.
 *
 * Usage: sim <NAME|NAME-direct|allreduce-tree|alltoall|gather|scatter|sendrecv|big|big-NAME|
 * big-NAME-direct|big-allreduce-tree|huge-NAME...>,
 * NAME one of allreduce, allgather, reducescatter, broadcast, reduce (big: 1 MiB + 3 elements for
 * every collective at a few rank counts; huge-NAME: 2^32 + 7 int8 elements, 2 ranks, 2 channels, on
 * buffers of aliased windows, run_huge). WEFT_TEST_SIM_HUGE_COUNT=N runs huge-NAME with N elements
 * instead: the tsan setup passes 2^26 + 7 (meson.build), as ThreadSanitizer's shadow of 4 GiB
 * buffers does not fit in memory (the sim was killed with 23 GB resident).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "algo/sched.h"
#include "../common/tree_bytes.h"
#include "exec/lane.h"
#include "redop.h"

static unsigned long npass, nfail;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (nfail < 40) {                                                                          \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
        nfail++;                                                                                   \
    } while (0)

/* Data type and operator of one run. avg: 1 = integer avg (sum, then divide the final result),
 * 2 = float avg (premultiply every input by 1/n, then sum). rounding: float sum of inputs whose
 * sums round (the result is the float sum in rank order; direct reducing schedules only). */
struct dcase {
    const char *name;
    int dtype;
    int kind;
    int avg;
    int rounding;
};

static const struct dcase red_cases[] = {
    {"int32 sum", WEFT_INT32, WEFT_RED_SUM, 0, 0},
    {"float sum", WEFT_FLOAT32, WEFT_RED_SUM, 0, 0},
    {"int8 max", WEFT_INT8, WEFT_RED_MAX, 0, 0},
    {"double prod", WEFT_FLOAT64, WEFT_RED_PROD, 0, 0},
    {"uint8 min", WEFT_UINT8, WEFT_RED_MIN, 0, 0},
    {"int32 avg", WEFT_INT32, WEFT_RED_SUM, 1, 0},
    {"float avg", WEFT_FLOAT32, WEFT_RED_SUM, 2, 0},
    {"float sum rounding", WEFT_FLOAT32, WEFT_RED_SUM, 0, 1}, /* last: direct only */
};

/* Collectives without a reduction only move bytes: a few element sizes, values unique per rank. */
static const struct dcase copy_cases[] = {
    {"int8", WEFT_INT8, -1, 0, 0},
    {"int32", WEFT_INT32, -1, 0, 0},
    {"double", WEFT_FLOAT64, -1, 0, 0},
};

/* For sendrecv (coll WEFT_COLL_SEND), root is the distance d: rank r sends to r+d. */
/* hosts > 0: rank r runs on host r % hosts (round robin) and rings run in host order (ring,
 * ring_pos: weft_sched_ring_order); HIER then has hosts of n / hosts ranks. */
struct cfg {
    int coll, algo, n, root, nch, inplace;
    uint64_t count;
    const struct dcase *dc;
    int hosts;
    const int *ring, *ring_pos;
};

static int cfg_pos(const struct cfg *c, int r)
{
    return c->ring_pos != NULL ? c->ring_pos[r] : r;
}

static int cfg_k(const struct cfg *c)
{
    return c->algo == WEFT_ALGO_HIER && c->hosts > 0 ? c->n / c->hosts : 1;
}

/* Elements rank r sends in one hierarchical piece of p elements (see sched.c): cells (shard,
 * part) of every shard but its own (reduce-scatter) and but l+1's (all-gather) inside the host,
 * and its shard's ring all-reduce across hosts. */
static uint64_t hier_piece_elems(const struct cfg *c, int r, uint64_t p)
{
    int k = cfg_k(c), H = c->n / k, pos = cfg_pos(c, r), h = pos / k, l = pos % k;
    uint64_t total = 0, cell[64][64];
    for (int sh = 0; sh < k; sh++) {
        uint64_t sl = p / (uint64_t)k + ((uint64_t)sh < p % (uint64_t)k);
        for (int j = 0; j < H; j++)
            cell[sh][j] = sl / (uint64_t)H + ((uint64_t)j < sl % (uint64_t)H);
    }
    for (int j = 0; j < H; j++) {
        for (int sh = 0; sh < k; sh++)
            total += (sh != l ? cell[sh][j] : 0) + (sh != (l + 1) % k ? cell[sh][j] : 0);
        total += 2 * cell[l][j];
    }
    return total - cell[l][h] - cell[l][(h + 1) % H];
}

/* The schedules DIRECT has of its own (for the others it names RING's). */
static int cfg_direct(const struct cfg *c)
{
    return c->algo == WEFT_ALGO_DIRECT && c->coll <= WEFT_COLL_ALLTOALL;
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Lanes per rank and channel: sendrecv's SEND and RECV, one otherwise. */
static int cfg_sub(const struct cfg *c)
{
    return c->coll == WEFT_COLL_SEND ? 2 : 1;
}

/* ---- element values ---- */

static double load(int dtype, const void *buf, uint64_t i)
{
    switch (dtype) {
    case WEFT_INT8:
        return ((const int8_t *)buf)[i];
    case WEFT_UINT8:
        return ((const uint8_t *)buf)[i];
    case WEFT_INT32:
        return ((const int32_t *)buf)[i];
    case WEFT_FLOAT32:
        return ((const float *)buf)[i];
    case WEFT_FLOAT64:
        return ((const double *)buf)[i];
    default:
        return 0;
    }
}

static void store(int dtype, void *buf, uint64_t i, double v)
{
    switch (dtype) {
    case WEFT_INT8:
        ((int8_t *)buf)[i] = (int8_t)v;
        break;
    case WEFT_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    case WEFT_INT32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case WEFT_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    case WEFT_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    default:
        break;
    }
}

/* Input element i of rank r (i indexes the whole input buffer). */
static double gen(const struct dcase *dc, int n, int r, uint64_t i)
{
    uint64_t u = (uint64_t)r, h = i * 2654435761u + u * 40503u; /* mixes rank and index */
    if (dc->kind < 0) {                                         /* copy collectives */
        if (dc->dtype == WEFT_INT8)
            return (double)(int8_t)((u * 37 + i * 11 + (i >> 8)) & 0xff);
        return (double)(u * 1000003 + i) * (dc->dtype == WEFT_FLOAT64 ? 0.5 : 1);
    }
    if (dc->rounding) /* +-(0 .. 1000) * 2^-(0 .. 23): exact in float, sums round */
        return (double)((int)((h >> 4) % 2001) - 1000) / (double)(1 << ((h >> 15) % 24));
    switch (dc->kind) {
    case WEFT_RED_PROD:
        return (h >> 7) % 3 == 0 ? -1.0 : 1.0;
    case WEFT_RED_MAX:
        return (double)(int)((u * 31 + i * 17 + (h >> 9)) % 251) - 125;
    case WEFT_RED_MIN:
        return (double)((u * 13 + i * 7 + (h >> 11)) % 256);
    default:
        break;
    }
    if (dc->avg == 2) { /* 0 or +-n * 2^j: times fl(1/n) gives +-2^j exactly for the n we test */
        if ((h >> 5) % 7 == 0)
            return 0;
        double v = (double)n * (double)(1 << ((h >> 3) % 3));
        return (h >> 8) % 5 < 2 ? -v : v;
    }
    return (double)(int)((h >> 4) % 23) - 11;
}

/* The reduction of the values vals[0 .. n) as the operator defines it. */
static double fold(const struct dcase *dc, int n, const double *vals)
{
    double acc = 0;
    if (dc->rounding) { /* float additions in rank order */
        float f = (float)vals[0];
        for (int q = 1; q < n; q++) {
            float x = (float)vals[q];
            f = x + f;
        }
        return f;
    }
    if (dc->avg == 2) {
        float s = (float)(1.0 / n);
        for (int q = 0; q < n; q++)
            acc += (double)((float)vals[q] * s);
        return acc;
    }
    acc = vals[0];
    for (int q = 1; q < n; q++) {
        switch (dc->kind) {
        case WEFT_RED_SUM:
            acc += vals[q];
            break;
        case WEFT_RED_PROD:
            acc *= vals[q];
            break;
        case WEFT_RED_MAX:
            acc = vals[q] > acc ? vals[q] : acc;
            break;
        case WEFT_RED_MIN:
            acc = vals[q] < acc ? vals[q] : acc;
            break;
        }
    }
    if (dc->avg == 1)
        acc = (double)((int64_t)acc / (int64_t)n);
    return acc;
}

/* Elements rank r sends (see tests/unit/test_sched.c for the derivation). */
static uint64_t expected_elems(const struct cfg *c, int r, uint64_t chunk)
{
    int n = c->n;
    if (c->coll == WEFT_COLL_SEND)
        return c->count;
    if (n == 1)
        return 0;
    if (c->algo == WEFT_ALGO_TREE) /* each half once per tree neighbour (parent, children) */
        return tree_expected_elems(c->count, n, r, c->nch, chunk);
    if (cfg_direct(c)) {
        switch (c->coll) {
        case WEFT_COLL_ALLREDUCE: /* to every rank, itself included */
        case WEFT_COLL_REDUCESCATTER:
            return (uint64_t)n * c->count;
        case WEFT_COLL_BROADCAST: /* the root to every other rank */
            return r == c->root ? (uint64_t)(n - 1) * c->count : 0;
        case WEFT_COLL_REDUCE: /* to the root; the root's own through its loopback */
            return c->count;
        default: /* allgather: (n-1) * count, as the ring */
            break;
        }
    }
    if (c->algo == WEFT_ALGO_DET) { /* per piece: all of it (loopback included), then its chunk
                                     * to the n-1 others */
        uint64_t total = 0;
        for (int ch = 0; ch < c->nch; ch++) {
            uint64_t off, len;
            weft_sched_range(c->count, ch, c->nch, &off, &len);
            uint64_t piece = chunk > len / (uint64_t)n ? len : chunk * (uint64_t)n;
            for (uint64_t po = 0; po < len; po += piece) {
                uint64_t p = len - po < piece ? len - po : piece;
                uint64_t mine = p / (uint64_t)n + ((uint64_t)r < p % (uint64_t)n);
                total += p + (uint64_t)(n - 1) * mine;
            }
        }
        return total;
    }
    if (c->algo == WEFT_ALGO_HIER && cfg_k(c) > 1 && cfg_k(c) < n) {
        uint64_t total = 0;
        for (int ch = 0; ch < c->nch; ch++) {
            uint64_t off, len;
            weft_sched_range(c->count, ch, c->nch, &off, &len);
            uint64_t piece = chunk > len / (uint64_t)n ? len : chunk * (uint64_t)n;
            for (uint64_t po = 0; po < len; po += piece)
                total += hier_piece_elems(c, r, len - po < piece ? len - po : piece);
        }
        return total;
    }
    r = cfg_pos(c, r); /* rings run on positions */
    switch (c->coll) {
    case WEFT_COLL_ALLREDUCE: {
        uint64_t total = 0;
        for (int ch = 0; ch < c->nch; ch++) {
            uint64_t off, len;
            weft_sched_range(c->count, ch, c->nch, &off, &len);
            uint64_t piece = chunk > len / (uint64_t)n ? len : chunk * (uint64_t)n;
            for (uint64_t po = 0; po < len; po += piece) {
                uint64_t p = len - po < piece ? len - po : piece;
                uint64_t q = p / (uint64_t)n, rem = p % (uint64_t)n;
                total += 2 * p - (q + ((uint64_t)r < rem)) - (q + ((uint64_t)((r + 1) % n) < rem));
            }
        }
        return total;
    }
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_REDUCESCATTER:
        return (uint64_t)(n - 1) * c->count;
    case WEFT_COLL_BROADCAST:
        return r == (cfg_pos(c, c->root) + n - 1) % n ? 0 : c->count;
    case WEFT_COLL_REDUCE:
        return r == cfg_pos(c, c->root) ? 0 : c->count;
    case WEFT_COLL_GATHER:
        return r == c->root ? 0 : c->count;
    case WEFT_COLL_ALLTOALL:
        return (uint64_t)(n - 1) * c->count;
    case WEFT_COLL_SCATTER:
        return r == c->root ? (uint64_t)(n - 1) * c->count : 0;
    default:
        return 0;
    }
}

/* ---- connections ---- */

struct link {
    struct weft_fifo_ctrl *ctrl, *ll_ctrl;
    char *slots, *ll_slots;
    struct weft_conn send, recv, ll_send, ll_recv;
};

struct sim {
    const struct cfg *c;
    size_t es, slot_bytes;
    uint64_t chunk;
    int ll;                        /* links have LL FIFOs and lanes use them (half the cases) */
    int nsub;                      /* lanes per rank and channel (cfg_sub) */
    struct link **links;           /* [nch][n*n], created when a schedule uses the pair */
    struct weft_peer_conns *peers; /* [nch][n][n] */
    struct weft_step **steps;      /* [nch][nsub][n], as lanes */
    struct weft_lane *lanes;       /* [nch][nsub][n]: lane (ch * nsub + sub) * n + r */
    char **in_alloc, **out_alloc;  /* per rank; NULL where the buffer is the other one */
    void **in, **out;              /* per rank, as the user passes them */
    int huge;                      /* buffers are huge_map windows (run_huge) */
};

/*
 * Buffers of gigabytes without the memory: `bytes` of address space in which one window of
 * HUGE_WINDOW bytes (a memfd) is mapped again and again, so element i and i + HUGE_WINDOW share
 * their byte. The window is 3 MiB, which divides no power of two: an offset cut to 32 bits lands
 * on another byte of the window.
 */
#define HUGE_WINDOW (3u << 20)

static char *huge_map(size_t bytes, unsigned char seed)
{
    size_t span = (bytes + HUGE_WINDOW - 1) / HUGE_WINDOW * HUGE_WINDOW;
    if (span == 0)
        return NULL;
    int fd = memfd_create("sim-huge", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, HUGE_WINDOW) != 0)
        return NULL;
    char *base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    for (size_t off = 0; base != MAP_FAILED && off < span; off += HUGE_WINDOW)
        if (mmap(base + off, HUGE_WINDOW, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                 0) == MAP_FAILED) {
            munmap(base, span);
            base = MAP_FAILED;
        }
    close(fd);
    if (base == MAP_FAILED)
        return NULL;
    for (size_t i = 0; i < HUGE_WINDOW; i++)
        base[i] = (char)(unsigned char)(i * 7 + seed);
    return base;
}

static void huge_unmap(char *p, size_t bytes)
{
    if (p != NULL)
        munmap(p, (bytes + HUGE_WINDOW - 1) / HUGE_WINDOW * HUGE_WINDOW);
}

static struct link *sim_link(struct sim *s, int ch, int a, int b)
{
    int n = s->c->n;
    struct link **lp = &s->links[(size_t)ch * n * n + (size_t)a * n + b];
    if (*lp != NULL)
        return *lp;
    struct link *l = calloc(1, sizeof(*l));
    l->ctrl = aligned_alloc(WEFT_CACHELINE, sizeof(struct weft_fifo_ctrl));
    memset(l->ctrl, 0, sizeof(*l->ctrl));
    l->slots = aligned_alloc(64, WEFT_STEPS * s->slot_bytes);
    memset(l->slots, 0, WEFT_STEPS * s->slot_bytes); /* slot headers must start at seq 0 */
    struct weft_conn conn = {.ctrl = l->ctrl, .slots = l->slots, .slot_bytes = s->slot_bytes,
                             .nslots = WEFT_STEPS};
    l->send = conn;
    l->recv = conn;
    if (s->ll) {
        l->ll_ctrl = aligned_alloc(WEFT_CACHELINE, sizeof(struct weft_fifo_ctrl));
        memset(l->ll_ctrl, 0, sizeof(*l->ll_ctrl));
        l->ll_slots = aligned_alloc(WEFT_CACHELINE, WEFT_LL_SLOTS * WEFT_LL_SLOT_BYTES);
        memset(l->ll_slots, 0, WEFT_LL_SLOTS * WEFT_LL_SLOT_BYTES);
        struct weft_conn ll = {.ctrl = l->ll_ctrl, .slots = l->ll_slots,
                               .slot_bytes = WEFT_LL_SLOT_BYTES, .nslots = WEFT_LL_SLOTS};
        l->ll_send = ll;
        l->ll_recv = ll;
        l->send.ll = &l->ll_send;
        l->recv.ll = &l->ll_recv;
        l->send.ll_ordered = l->recv.ll_ordered = 1;
    }
    s->peers[((size_t)ch * n + a) * n + b].send = &l->send;
    s->peers[((size_t)ch * n + b) * n + a].recv = &l->recv;
    *lp = l;
    return l;
}

/* Buffer sizes; every rank gets the root's size for gather and scatter. */
static size_t in_elems(const struct cfg *c)
{
    int blocks = c->coll == WEFT_COLL_REDUCESCATTER || c->coll == WEFT_COLL_ALLTOALL ||
                 c->coll == WEFT_COLL_SCATTER;
    return blocks ? (size_t)c->count * c->n : (size_t)c->count;
}

static size_t out_elems(const struct cfg *c)
{
    int blocks = c->coll == WEFT_COLL_ALLGATHER || c->coll == WEFT_COLL_ALLTOALL ||
                 c->coll == WEFT_COLL_GATHER;
    return blocks ? (size_t)c->count * c->n : (size_t)c->count;
}

/* Buffers as NCCL defines in-place: allgather and gather sendbuff = recvbuff + rank*count,
 * reducescatter and scatter recvbuff = sendbuff + rank*count (what matters for gather and scatter
 * is the root), the others sendbuff == recvbuff. */
static void sim_buffers(struct sim *s)
{
    const struct cfg *c = s->c;
    size_t es = s->es, ni = in_elems(c), no = out_elems(c);
    for (int r = 0; r < c->n; r++) {
        if (!c->inplace) {
            s->in_alloc[r] = malloc(ni * es + 1);
            s->out_alloc[r] = malloc(no * es + 1);
            memset(s->out_alloc[r], 0xa5, no * es + 1);
            s->in[r] = s->in_alloc[r];
            s->out[r] = s->out_alloc[r];
        } else if (c->coll == WEFT_COLL_ALLGATHER || c->coll == WEFT_COLL_GATHER) {
            s->out_alloc[r] = malloc(no * es + 1);
            memset(s->out_alloc[r], 0xa5, no * es + 1);
            s->out[r] = s->out_alloc[r];
            s->in[r] = s->out_alloc[r] + (size_t)r * c->count * es;
        } else if (c->coll == WEFT_COLL_REDUCESCATTER || c->coll == WEFT_COLL_SCATTER) {
            s->in_alloc[r] = malloc(ni * es + 1);
            s->in[r] = s->in_alloc[r];
            s->out[r] = s->in_alloc[r] + (size_t)r * c->count * es;
        } else {
            s->in_alloc[r] = malloc(ni * es + 1);
            s->in[r] = s->out[r] = s->in_alloc[r];
        }
        for (size_t i = 0; i < ni; i++)
            store(c->dc->dtype, s->in[r], i, gen(c->dc, c->n, r, i));
    }
}

/* Builds steps, connections and lanes. Returns 0 on success. */
static int sim_setup(struct sim *s, struct weft_redop *op)
{
    const struct cfg *c = s->c;
    int n = c->n, nch = c->nch;
    for (int li = 0; li < nch * s->nsub * n; li++) {
        int r = li % n, sub = li / n % s->nsub, ch = li / n / s->nsub;
        struct weft_sched_args a = {c->coll, c->algo, c->count, n,           r,
                                    c->root, ch,      nch,      s->chunk,    c->ring,
                                    c->ring_pos, cfg_k(c)};
        if (c->coll == WEFT_COLL_SEND) { /* lane 0 sends to r+d, lane 1 receives from r-d */
            a.coll = sub == 0 ? WEFT_COLL_SEND : WEFT_COLL_RECV;
            a.root = mod(sub == 0 ? r + c->root : r - c->root, n);
        }
        uint64_t max = weft_sched_max_steps(&a);
        struct weft_step *st = malloc((size_t)(max + 1) * sizeof(*st));
        uint64_t ns = weft_sched_build(&a, st, max);
        s->steps[li] = st;
        if (ns == UINT64_MAX) {
            FAIL("rank %d ch %d %s: weft_sched_build failed", r, ch, weft_coll_name(a.coll));
            return -1;
        }
        for (uint64_t i = 0; i < ns; i++) {
            if (st[i].send_peer >= 0)
                sim_link(s, ch, r, st[i].send_peer);
            if (st[i].recv_peer >= 0)
                sim_link(s, ch, st[i].recv_peer, r);
        }
        struct weft_lane *l = &s->lanes[li];
        memset(l, 0, sizeof(*l));
        l->steps = st;
        l->nsteps = ns;
        l->peers = &s->peers[((size_t)ch * n + r) * n];
        l->nranks = n;
        l->input = s->in[r];
        l->output = s->out[r];
        l->elem_size = s->es;
        l->op = op;
        l->ll = s->ll;
        weft_lane_init(l);
    }
    return 0;
}

/* Round-robin until every lane is done. Returns 0, or -1 on a deadlock or a size mismatch. */
static int sim_run(struct sim *s, const char *name)
{
    int nl = s->c->n * s->c->nch * s->nsub, n = s->c->n;
    int *bpeer = calloc((size_t)nl, sizeof(int)), *bsend = calloc((size_t)nl, sizeof(int));
    int res = 0;
    for (;;) {
        int moved = 0, done = 1;
        for (int i = 0; i < nl; i++) {
            struct weft_lane *l = &s->lanes[i];
            if (weft_lane_done(l))
                continue;
            int rc = weft_lane_progress(l, &bpeer[i], &bsend[i]);
            if (rc < 0) {
                FAIL("%s: rank %d ch %d lane %d step %llu: peer %d posted %u bytes, want %u",
                     name, i % n, i / n / s->nsub, i / n % s->nsub, (unsigned long long)l->cur,
                     l->error_peer, l->error_got_bytes, l->error_want_bytes);
                res = -1;
                goto out;
            }
            moved |= rc > 0;
            done &= weft_lane_done(l);
        }
        if (done)
            break;
        if (!moved) {
            char buf[512];
            int len = 0;
            for (int i = 0; i < nl && len < (int)sizeof(buf) - 64; i++) {
                struct weft_lane *l = &s->lanes[i];
                if (!weft_lane_done(l))
                    len += snprintf(buf + len, sizeof(buf) - len, " r%d/c%d/%d@%llu:%s%d", i % n,
                                    i / n / s->nsub, i / n % s->nsub, (unsigned long long)l->cur,
                                    bsend[i] ? "credit<-" : "data<-", bpeer[i]);
            }
            FAIL("%s: deadlock; stuck lanes (rank/channel/lane@step:waits-for<-peer):%s", name,
                 buf);
            res = -1;
            goto out;
        }
    }
out:
    free(bpeer);
    free(bsend);
    return res;
}

static void sim_free(struct sim *s)
{
    const struct cfg *c = s->c;
    int n = c->n;
    for (size_t i = 0; i < (size_t)c->nch * n * n; i++) {
        if (s->links[i] == NULL)
            continue;
        free(s->links[i]->ctrl);
        free(s->links[i]->slots);
        free(s->links[i]->ll_ctrl);
        free(s->links[i]->ll_slots);
        free(s->links[i]);
    }
    for (int i = 0; i < c->nch * s->nsub * n; i++)
        free(s->steps[i]);
    for (int r = 0; r < n; r++) {
        if (s->huge) {
            huge_unmap(s->in_alloc[r], in_elems(c) * s->es);
            huge_unmap(s->out_alloc[r], out_elems(c) * s->es);
            continue;
        }
        free(s->in_alloc[r]);
        free(s->out_alloc[r]);
    }
    free(s->links);
    free(s->peers);
    free(s->steps);
    free(s->lanes);
    free(s->in_alloc);
    free(s->out_alloc);
    free(s->in);
    free(s->out);
}

/* Compares rank r's buffer element i with want; reports the first mismatch per run. */
static int expect_elem(const struct cfg *c, const char *name, const char *what, int r,
                       const void *buf, uint64_t i, double want, int *reported)
{
    double got = load(c->dc->dtype, buf, i);
    if (got == want || (got != got && want != want))
        return 1;
    if (!*reported)
        FAIL("%s: rank %d %s[%llu] = %.17g, want %.17g", name, r, what, (unsigned long long)i, got,
             want);
    *reported = 1;
    return 0;
}

/* Whether rank r's bytes [from, to) of buf still hold the 0xa5 fill. */
static int untouched(const struct cfg *c, const char *name, int r, const void *buf, size_t from,
                     size_t to, int *reported)
{
    for (size_t b = from; b < to; b++)
        if (((const uint8_t *)buf)[b] != 0xa5) {
            if (!*reported)
                FAIL("%s: rank %d output byte %zu written", name, r, b);
            *reported = 1;
            return 0;
        }
    (void)c;
    return 1;
}

static void sim_check_bytes(struct sim *s, const char *name);

static void sim_check(struct sim *s, const char *name)
{
    const struct cfg *c = s->c;
    int n = c->n, bad = 0;
    uint64_t count = c->count;
    double *vals = malloc((size_t)n * sizeof(double));
    int dt = c->dc->dtype;

    switch (c->coll) {
    case WEFT_COLL_ALLREDUCE:
        for (uint64_t i = 0; i < count; i++) {
            for (int q = 0; q < n; q++)
                vals[q] = gen(c->dc, n, q, i);
            double want = fold(c->dc, n, vals);
            for (int r = 0; r < n; r++)
                expect_elem(c, name, "out", r, s->out[r], i, want, &bad);
        }
        /* Every rank holds the same bits (NCCL's guarantee, whatever the inputs). */
        for (int r = 1; r < n && !bad; r++)
            if (memcmp(s->out[r], s->out[0], count * s->es) != 0) {
                FAIL("%s: rank %d output differs from rank 0's", name, r);
                bad = 1;
            }
        break;
    case WEFT_COLL_ALLGATHER:
        for (int r = 0; r < n; r++)
            for (int b = 0; b < n; b++)
                for (uint64_t i = 0; i < count; i++)
                    expect_elem(c, name, "out", r, s->out[r], (uint64_t)b * count + i,
                                gen(c->dc, n, b, i), &bad);
        break;
    case WEFT_COLL_REDUCESCATTER:
        for (int r = 0; r < n; r++)
            for (uint64_t i = 0; i < count; i++) {
                for (int q = 0; q < n; q++)
                    vals[q] = gen(c->dc, n, q, (uint64_t)r * count + i);
                expect_elem(c, name, "out", r, s->out[r], i, fold(c->dc, n, vals), &bad);
            }
        break;
    case WEFT_COLL_BROADCAST:
        for (int r = 0; r < n; r++)
            for (uint64_t i = 0; i < count; i++)
                expect_elem(c, name, "out", r, s->out[r], i, gen(c->dc, n, c->root, i), &bad);
        break;
    case WEFT_COLL_REDUCE:
        for (uint64_t i = 0; i < count; i++) {
            for (int q = 0; q < n; q++)
                vals[q] = gen(c->dc, n, q, i);
            expect_elem(c, name, "out", c->root, s->out[c->root], i, fold(c->dc, n, vals), &bad);
        }
        /* Other ranks' recvbuff is not NCCL's to touch. */
        for (int r = 0; r < n && c->inplace; r++)
            for (uint64_t i = 0; i < count && r != c->root; i++)
                expect_elem(c, name, "in-place buffer", r, s->out[r], i, gen(c->dc, n, r, i), &bad);
        for (int r = 0; r < n && !c->inplace; r++)
            if (r != c->root)
                untouched(c, name, r, s->out[r], 0, count * s->es, &bad);
        break;
    case WEFT_COLL_ALLTOALL:
        for (int r = 0; r < n; r++)
            for (int b = 0; b < n; b++)
                for (uint64_t i = 0; i < count; i++)
                    expect_elem(c, name, "out", r, s->out[r], (uint64_t)b * count + i,
                                gen(c->dc, n, b, (uint64_t)r * count + i), &bad);
        break;
    case WEFT_COLL_GATHER:
        for (int b = 0; b < n; b++)
            for (uint64_t i = 0; i < count; i++)
                expect_elem(c, name, "out", c->root, s->out[c->root], (uint64_t)b * count + i,
                            gen(c->dc, n, b, i), &bad);
        /* Non-root outputs are not NCCL's to touch (in place, block r is the rank's input). */
        for (int r = 0; r < n; r++) {
            if (r == c->root)
                continue;
            size_t blk = count * s->es;
            untouched(c, name, r, s->out[r], 0, (size_t)r * blk, &bad);
            untouched(c, name, r, s->out[r], (size_t)(r + 1) * blk, (size_t)n * blk, &bad);
            for (uint64_t i = 0; i < count; i++)
                if (c->inplace)
                    expect_elem(c, name, "in-place buffer", r, s->out[r], (uint64_t)r * count + i,
                                gen(c->dc, n, r, i), &bad);
            if (!c->inplace)
                untouched(c, name, r, s->out[r], (size_t)r * blk, (size_t)(r + 1) * blk, &bad);
        }
        break;
    case WEFT_COLL_SCATTER:
        for (int r = 0; r < n; r++)
            for (uint64_t i = 0; i < count; i++)
                expect_elem(c, name, "out", r, s->out[r], i,
                            gen(c->dc, n, c->root, (uint64_t)r * count + i), &bad);
        /* In place, the rest of every input (all of the root's) stays as it was. */
        for (int r = 0; r < n && c->inplace; r++)
            for (int b = 0; b < n; b++)
                for (uint64_t i = 0; i < count && (b != r || r == c->root); i++)
                    expect_elem(c, name, "in-place buffer", r, s->in[r], (uint64_t)b * count + i,
                                gen(c->dc, n, r, (uint64_t)b * count + i), &bad);
        break;
    case WEFT_COLL_SEND:
        for (int r = 0; r < n; r++)
            for (uint64_t i = 0; i < count; i++)
                expect_elem(c, name, "out", r, s->out[r], i, gen(c->dc, n, mod(r - c->root, n), i),
                            &bad);
        break;
    }
    /* Out-of-place inputs stay as they were. */
    for (int r = 0; r < n && !c->inplace; r++)
        for (uint64_t i = 0; i < in_elems(c); i++)
            expect_elem(c, name, "in", r, s->in[r], i, gen(c->dc, n, r, i), &bad);
    (void)dt;
    if (!bad)
        npass++;
    free(vals);
    sim_check_bytes(s, name);
}

/* Bytes: lanes == schedule == formula. */
static void sim_check_bytes(struct sim *s, const char *name)
{
    const struct cfg *c = s->c;
    int n = c->n;
    for (int r = 0; r < n; r++) {
        uint64_t lane_bytes = 0, sched_bytes = 0;
        for (int li = r; li < c->nch * s->nsub * n; li += n) {
            const struct weft_lane *l = &s->lanes[li];
            lane_bytes += l->bytes_sent;
            sched_bytes += weft_sched_bytes_sent(l->steps, l->nsteps, s->es);
        }
        uint64_t want = expected_elems(c, r, s->chunk) * s->es;
        if (lane_bytes == want && sched_bytes == want) {
            npass++;
        } else {
            FAIL("%s: rank %d sent %llu bytes (schedule %llu), formula %llu", name, r,
                 (unsigned long long)lane_bytes, (unsigned long long)sched_bytes,
                 (unsigned long long)want);
        }
    }
}

static void run_one(const struct cfg *c)
{
    char name[200];
    snprintf(name, sizeof(name), "%s/%s %s n %d hosts %d count %llu %s nch %d %s %d",
             weft_algo_name(c->algo),
             c->coll == WEFT_COLL_SEND ? "SendRecv" : weft_coll_name(c->coll), c->dc->name, c->n,
             c->hosts, (unsigned long long)c->count, c->inplace ? "in-place" : "out-of-place",
             c->nch, c->coll == WEFT_COLL_SEND ? "distance" : "root", c->root);
    struct sim s;
    memset(&s, 0, sizeof(s));
    int n = c->n, nch = c->nch;
    s.c = c;
    s.es = weft_dtype_size(c->dc->dtype);
    s.slot_bytes = c->count > 4096 ? 1024 : 256;
    s.ll = (int)((c->count + (uint64_t)c->n + (uint64_t)c->coll) & 1);
    s.nsub = cfg_sub(c);
    if (c->coll >= WEFT_COLL_ALLTOALL || cfg_direct(c) || c->algo >= WEFT_ALGO_TREE)
        s.chunk = WEFT_CHUNK_SLOTS * weft_slot_payload(s.slot_bytes) / s.es - 1;
    else
        s.chunk = 2 * weft_slot_payload(s.slot_bytes) / s.es;
    s.links = calloc((size_t)nch * n * n, sizeof(*s.links));
    s.peers = calloc((size_t)nch * n * n, sizeof(*s.peers));
    s.steps = calloc((size_t)nch * s.nsub * n, sizeof(*s.steps));
    s.lanes = calloc((size_t)nch * s.nsub * n, sizeof(*s.lanes));
    s.in_alloc = calloc((size_t)n, sizeof(char *));
    s.out_alloc = calloc((size_t)n, sizeof(char *));
    s.in = calloc((size_t)n, sizeof(void *));
    s.out = calloc((size_t)n, sizeof(void *));

    struct weft_redop op;
    memset(&op, 0, sizeof(op));
    op.dtype = c->dc->dtype;
    op.kind = c->dc->kind < 0 ? WEFT_RED_SUM : c->dc->kind;
    if (c->dc->avg == 1) {
        op.postdiv = 1;
        op.divisor = (uint64_t)n;
    } else if (c->dc->avg == 2) {
        op.premul = 1;
        weft_dtype_from_double(op.dtype, 1.0 / n, op.scalar.bytes);
    }

    sim_buffers(&s);
    if (sim_setup(&s, c->dc->kind < 0 ? NULL : &op) == 0 && sim_run(&s, name) == 0)
        sim_check(&s, name);
    sim_free(&s);
}

/*
 * Counts past 2^31 elements and byte offsets past 4 GiB through the real step engine, on huge_map
 * buffers (int8, 1 MiB slots, out of place): every lane completes with the sizes its peer posted
 * (no deadlock, no size mismatch, no fault outside the buffers), and the bytes sent equal the
 * formula. The data alias, so values are checked only where they cannot collide: a broadcast's
 * outputs equal the root's input window byte for byte.
 */
static void run_huge(const struct cfg *c)
{
    char name[200];
    snprintf(name, sizeof(name), "huge %s/%s n %d count %llu nch %d root %d",
             weft_algo_name(c->algo),
             c->coll == WEFT_COLL_SEND ? "SendRecv" : weft_coll_name(c->coll), c->n,
             (unsigned long long)c->count, c->nch, c->root);
    struct sim s;
    memset(&s, 0, sizeof(s));
    int n = c->n, nch = c->nch;
    s.c = c;
    s.es = 1;
    s.huge = 1;
    s.slot_bytes = 1u << 20;
    s.nsub = cfg_sub(c);
    if (c->coll >= WEFT_COLL_ALLTOALL || cfg_direct(c) || c->algo >= WEFT_ALGO_TREE)
        s.chunk = WEFT_CHUNK_SLOTS * weft_slot_payload(s.slot_bytes) / s.es - 1;
    else
        s.chunk = 2 * weft_slot_payload(s.slot_bytes) / s.es;
    s.links = calloc((size_t)nch * n * n, sizeof(*s.links));
    s.peers = calloc((size_t)nch * n * n, sizeof(*s.peers));
    s.steps = calloc((size_t)nch * s.nsub * n, sizeof(*s.steps));
    s.lanes = calloc((size_t)nch * s.nsub * n, sizeof(*s.lanes));
    s.in_alloc = calloc((size_t)n, sizeof(char *));
    s.out_alloc = calloc((size_t)n, sizeof(char *));
    s.in = calloc((size_t)n, sizeof(void *));
    s.out = calloc((size_t)n, sizeof(void *));
    int ok = 1;
    for (int r = 0; r < n; r++) {
        s.in[r] = s.in_alloc[r] = huge_map(in_elems(c), (unsigned char)(r + 1));
        s.out[r] = s.out_alloc[r] = huge_map(out_elems(c), 0xa5);
        ok &= s.in[r] != NULL && s.out[r] != NULL;
    }
    struct weft_redop op;
    memset(&op, 0, sizeof(op));
    op.dtype = WEFT_UINT8;
    op.kind = WEFT_RED_MAX;
    if (!ok)
        FAIL("%s: cannot map the buffers", name);
    else if (sim_setup(&s, c->dc->kind < 0 ? NULL : &op) == 0 && sim_run(&s, name) == 0) {
        sim_check_bytes(&s, name);
        if (c->coll == WEFT_COLL_BROADCAST) {
            int bad = 0;
            const char *want = s.in[c->root];
            for (int r = 0; r < n && !bad; r++)
                bad = memcmp(s.out[r], want, HUGE_WINDOW) != 0;
            if (bad)
                FAIL("%s: outputs differ from the root's input", name);
            else
                npass++;
        }
    }
    sim_free(&s);
}

static void sweep_huge(int coll, int algo)
{
    static const struct dcase huge_red = {"uint8 max", WEFT_UINT8, WEFT_RED_MAX, 0, 0};
    static const struct dcase huge_copy = {"uint8", WEFT_UINT8, -1, 0, 0};
    /* past 2^31 elements and 4 GiB of offsets at once (2^31 + 5 alone doubled the time) */
    uint64_t huge_counts[] = {(1ull << 32) + 7};
    const char *env = getenv("WEFT_TEST_SIM_HUGE_COUNT");
    if (env != NULL && strtoull(env, NULL, 0) > 0)
        huge_counts[0] = strtoull(env, NULL, 0);
    int red = coll == WEFT_COLL_ALLREDUCE || coll == WEFT_COLL_REDUCESCATTER ||
              coll == WEFT_COLL_REDUCE;
    unsigned long runs = 0;
    for (size_t ci = 0; ci < sizeof(huge_counts) / sizeof(*huge_counts); ci++) {
        int nch = 2;
        struct cfg c = {coll, algo, 2, 1, nch, 0, huge_counts[ci], red ? &huge_red : &huge_copy,
                        0, NULL, NULL};
        run_huge(&c);
        runs++;
    }
    printf("huge %s/%s: %lu runs\n", weft_algo_name(algo),
           coll == WEFT_COLL_SEND ? "SendRecv" : weft_coll_name(coll), runs);
}

/* hosts: 0 rank order; 1 round robin over 2 hosts (3 for odd n), the ring in host order; 2 (HIER)
 * the shapes hier_n x hier_h (ranks, hosts), placed round robin. */
static void sweep(int coll, int algo, int big, int hosts)
{
    static const int nranks[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 64};
    static const int hier_n[] = {1, 2, 3, 4, 6, 6, 8, 8, 9, 16, 16, 33, 64, 64};
    static const int hier_h[] = {1, 2, 1, 2, 2, 3, 2, 4, 3, 4, 8, 3, 8, 2};
    /* The large count at a few rank counts; all-gather and reduce-scatter buffers grow with n. */
    static const int big_nranks[] = {1, 3, 8};
    static const int big_nranks_ag[] = {1, 2, 3};
    static const uint64_t counts[] = {0, 1, 7, 1023};
    static const uint64_t big_counts[] = {1048576 + 3};
    int red = coll == WEFT_COLL_ALLREDUCE || coll == WEFT_COLL_REDUCESCATTER ||
              coll == WEFT_COLL_REDUCE;
    const struct dcase *cases = red ? red_cases : copy_cases;
    size_t ncases = red ? sizeof(red_cases) / sizeof(red_cases[0])
                        : sizeof(copy_cases) / sizeof(copy_cases[0]);
    if (red && algo != WEFT_ALGO_DIRECT && algo != WEFT_ALGO_DET)
        ncases--; /* "float sum rounding" needs the rank order */
    int per_rank = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCESCATTER ||
                   coll == WEFT_COLL_ALLTOALL || coll == WEFT_COLL_GATHER ||
                   coll == WEFT_COLL_SCATTER;
    /* No in-place form for all-to-all and send/recv; sendrecv runs distances 1 and 0. */
    int ninplace = coll == WEFT_COLL_ALLTOALL || coll == WEFT_COLL_SEND ? 1 : 2;
    int ndist = coll == WEFT_COLL_SEND ? 2 : 1;
    const int *ns = !big ? nranks : per_rank ? big_nranks_ag : big_nranks;
    size_t nns = big ? 3 : sizeof(nranks) / sizeof(int);
    if (hosts == 2 && !big) {
        ns = hier_n;
        nns = sizeof(hier_n) / sizeof(int);
    }
    const uint64_t *cs = big ? big_counts : counts;
    size_t ncs = big ? 1 : sizeof(counts) / sizeof(counts[0]);
    unsigned long runs = 0;

    for (size_t ni = 0; ni < nns; ni++)
        for (size_t ci = 0; ci < ncs; ci++)
            for (size_t di = 0; di < ncases; di++)
                for (int inplace = 0; inplace < ninplace; inplace++)
                    for (int nch = 1; nch <= 2; nch++)
                        for (int dist = 1; dist > 1 - ndist; dist--) {
                            /* The large count: one type per collective and rank count is enough. */
                            if (big && di != (ni + (size_t)inplace) % ncases)
                                continue;
                            int n = ns[ni];
                            struct cfg c = {coll, algo, n, 0, nch, inplace, cs[ci],
                                            &cases[di], 0, NULL, NULL};
                            int ring[64], ring_pos[64], host[64];
                            if (hosts > 0) {
                                if (hosts == 2)
                                    c.hosts = big ? (n % 2 == 0 ? 2 : 1) : hier_h[ni];
                                else
                                    c.hosts = n < 2 ? 1 : n % 2 == 0 ? 2 : n < 3 ? n : 3;
                                for (int r = 0; r < n; r++)
                                    host[r] = r % c.hosts;
                                weft_sched_ring_order(n, host, ring, ring_pos);
                                c.ring = ring;
                                c.ring_pos = ring_pos;
                            }
                            c.root = (int)((cs[ci] + di + (size_t)nch * 5 + (size_t)inplace) %
                                           (uint64_t)n);
                            if (coll == WEFT_COLL_SEND)
                                c.root = dist % n;
                            run_one(&c);
                            runs++;
                        }
    printf("%s%s/%s%s: %lu runs\n", weft_algo_name(algo), hosts == 1 ? " (host-order ring)" : "",
           coll == WEFT_COLL_SEND ? "SendRecv" : weft_coll_name(coll), big ? " (1 MiB + 3)" : "",
           runs);
}

int main(int argc, char **argv)
{
    /* RING and DIRECT share the schedules of gather, scatter and send/recv. */
    static const struct {
        const char *name;
        int coll, algo, hosts;
    } tests[] = {
        {"allreduce-perm", WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 1},
        {"allgather-perm", WEFT_COLL_ALLGATHER, WEFT_ALGO_RING, 1},
        {"reducescatter-perm", WEFT_COLL_REDUCESCATTER, WEFT_ALGO_RING, 1},
        {"broadcast-perm", WEFT_COLL_BROADCAST, WEFT_ALGO_RING, 1},
        {"reduce-perm", WEFT_COLL_REDUCE, WEFT_ALGO_RING, 1},
        {"allreduce-hier", WEFT_COLL_ALLREDUCE, WEFT_ALGO_HIER, 2},
        {"allreduce", WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 0},
        {"allreduce-direct", WEFT_COLL_ALLREDUCE, WEFT_ALGO_DIRECT, 0},
        {"allreduce-tree", WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE, 0},
        {"allreduce-det", WEFT_COLL_ALLREDUCE, WEFT_ALGO_DET, 0},
        {"allgather", WEFT_COLL_ALLGATHER, WEFT_ALGO_RING, 0},
        {"allgather-direct", WEFT_COLL_ALLGATHER, WEFT_ALGO_DIRECT, 0},
        {"reducescatter", WEFT_COLL_REDUCESCATTER, WEFT_ALGO_RING, 0},
        {"reducescatter-direct", WEFT_COLL_REDUCESCATTER, WEFT_ALGO_DIRECT, 0},
        {"broadcast", WEFT_COLL_BROADCAST, WEFT_ALGO_RING, 0},
        {"broadcast-direct", WEFT_COLL_BROADCAST, WEFT_ALGO_DIRECT, 0},
        {"reduce", WEFT_COLL_REDUCE, WEFT_ALGO_RING, 0},
        {"reduce-direct", WEFT_COLL_REDUCE, WEFT_ALGO_DIRECT, 0},
        {"alltoall", WEFT_COLL_ALLTOALL, WEFT_ALGO_RING, 0},
        {"alltoall-direct", WEFT_COLL_ALLTOALL, WEFT_ALGO_DIRECT, 0},
        {"gather", WEFT_COLL_GATHER, WEFT_ALGO_RING, 0},
        {"scatter", WEFT_COLL_SCATTER, WEFT_ALGO_RING, 0},
        {"sendrecv", WEFT_COLL_SEND, WEFT_ALGO_RING, 0},
    };
    const char *which = argc > 1 ? argv[1] : "all";
    int ran = 0;
    for (size_t t = 0; t < sizeof(tests) / sizeof(tests[0]); t++) {
        const char *tn = tests[t].name;
        if (strcmp(which, "all") == 0 || strcmp(which, tn) == 0) {
            sweep(tests[t].coll, tests[t].algo, 0, tests[t].hosts);
            ran = 1;
        }
        if (strcmp(which, "all") == 0 || strcmp(which, "big") == 0 ||
            (strncmp(which, "big-", 4) == 0 && strcmp(which + 4, tn) == 0)) {
            sweep(tests[t].coll, tests[t].algo, 1, tests[t].hosts);
            ran = 1;
        }
        /* huge-NAME: not part of "all" (seconds per collective) */
        if (tests[t].hosts == 0 && strncmp(which, "huge-", 5) == 0 && strcmp(which + 5, tn) == 0) {
            sweep_huge(tests[t].coll, tests[t].algo);
            ran = 1;
        }
    }
    if (!ran) {
        printf("unknown test %s\n", which);
        return 2;
    }
    printf("%lu passed, %lu failed\n", npass, nfail);
    return nfail == 0 ? 0 : 1;
}
