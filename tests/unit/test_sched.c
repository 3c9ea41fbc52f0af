/*
 * Schedules (src/algo/sched.h), checked structurally for every collective:
 *   - every step: count in [1, chunk], op/buffer/peer fields consistent, offsets inside buffers;
 *   - weft_sched_max_steps equals the number of steps built (it is exact), a short list is refused;
 *   - bytes sent per rank equal the algorithm's formula exactly;
 *   - per channel, the k-th send from a to b has the count of the k-th receive at b from a, and
 *     every send is received; for the collectives without forwarding (all-to-all, gather,
 *     scatter, send/recv) it also carries the same elements of the block (a's input block b for
 *     all-to-all and scatter, landing in b's output block a for all-to-all and gather);
 *   - every output element is written exactly once (reduce: by the root only; gather: the root
 *     only) and every input element read the expected number of times (once; twice for all-gather
 *     and the broadcast root: SEND and COPY; never for a scatter's non-root input); only the
 *     direct reducing schedules read their output; all-gather and broadcast never mark FINAL;
 *   - the direct (one-hop) schedules of all-reduce, all-gather, reduce-scatter, broadcast and
 *     reduce, besides: only the peers the schedule allows (itself through the loopback where it
 *     uses one), messages carry the element they land on, input and output are covered as often
 *     as the pattern reads and writes them, and piece by piece the steps are exactly those of the
 *     block comment in sched.c (check_direct_pieces): sends to r+1, r+2, ... in that order (to r
 *     itself, last, only where it loops back); the reducing ones RECV from 0, then RECV_REDUCE_COPY
 *     from 1 .. n-1 in rank order, with FINAL on the last one only.
 *   - the tree all-reduce (double binary tree): the two trees are checked as trees for n = 1 ..
 *     1100 and a few up to 4096 (check_tree_shape: one root, parent and children agree, depth
 *     floor(log2 n), in order, tree 1 is tree 0 mirrored for even n and shifted by one for odd n,
 *     no rank internal in both, every rank internal in one for even n, no rank the child of the
 *     same parent in both); steps only between tree neighbours; a message carries the element it
 *     lands on; slot by slot the steps are exactly those of the block comment in sched.c, small
 *     pieces on tree 0 alone (check_tree_pieces); input, output writes and output reads covered
 *     per half as the rank's role in that half's tree says (tree_role_counts).
 * Send/recv runs as "sendrecv": every rank r builds the SEND schedule to r+d and the RECV schedule
 * from r-d (d = 0 is a self-send), which together behave like one collective.
 *   - big counts (big, big-NAME): counts 2^31 + 5, 2^32 + 7 and 3 * 2^32 + 1 for 2, 3, 5 ranks
 *     and 1-2 channels: the same checks on the schedules alone (no memory of that size is touched).
 * Usage: test_sched [misc|NAME|NAME-ring|NAME-direct|allreduce-tree|alltoall|gather|scatter|
 * sendrecv|big|big-NAME] with NAME
 * one of allreduce, allgather, reducescatter, broadcast, reduce (default: all; NAME: ring and
 * direct, and tree for allreduce).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "algo/sched.h"
#include "../common/tree_bytes.h"

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

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (cond)                                                                                  \
            npass++;                                                                               \
        else                                                                                       \
            FAIL(__VA_ARGS__);                                                                     \
    } while (0)

static const uint64_t counts[] = {0, 1, 7, 1023, 1048576 + 3};
static const uint64_t chunks[] = {1, 2, 3, 5, 64, 1000, 65536, 1u << 20, UINT64_MAX / 3,
                                  UINT64_MAX};
/* Skip a chunk size when all ranks together would build more steps than this (keeps each
 * collective's sweep well under a second; all-to-all and the direct all-reduce, all-gather and
 * reduce-scatter, whose step lists grow with n^2, a quarter); the largest chunks always run. */
#define STEP_BUDGET 10000

static int op_sends(int op)
{
    return op == WEFT_STEP_SEND || op == WEFT_STEP_RECV_REDUCE_SEND ||
           op == WEFT_STEP_RECV_REDUCE_COPY_SEND || op == WEFT_STEP_RECV_COPY_SEND;
}

static int op_recvs(int op)
{
    return op != WEFT_STEP_SEND && op != WEFT_STEP_COPY;
}

/* Steps that read their local src buffer. */
static int op_reads(int op)
{
    return op == WEFT_STEP_SEND || op == WEFT_STEP_RECV_REDUCE_SEND ||
           op == WEFT_STEP_RECV_REDUCE_COPY || op == WEFT_STEP_RECV_REDUCE_COPY_SEND ||
           op == WEFT_STEP_COPY;
}

static int op_writes(int op)
{
    return op != WEFT_STEP_SEND && op != WEFT_STEP_RECV_REDUCE_SEND;
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Buffers holding n blocks of count elements. */
static int in_blocks(int coll)
{
    return coll == WEFT_COLL_REDUCESCATTER || coll == WEFT_COLL_ALLTOALL ||
           coll == WEFT_COLL_SCATTER;
}

static int out_blocks(int coll)
{
    return coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_ALLTOALL || coll == WEFT_COLL_GATHER;
}

/* Buffer sizes in elements for one rank. */
static uint64_t in_size(int coll, uint64_t count, int n)
{
    return in_blocks(coll) ? count * (uint64_t)n : count;
}

static uint64_t out_size(int coll, uint64_t count, int n)
{
    return out_blocks(coll) ? count * (uint64_t)n : count;
}

/* The schedules DIRECT has of its own (for the others it names RING's). */
static int is_direct(int coll, int algo)
{
    return algo == WEFT_ALGO_DIRECT && coll < WEFT_COLL_ALLTOALL;
}

/* The collectives that move data without reducing it: nothing they do is FINAL. */
static int is_copy_only(int coll)
{
    return coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_BROADCAST || coll >= WEFT_COLL_ALLTOALL;
}

/*
 * Elements rank r sends, from first principles:
 *   direct allreduce, reducescatter: n * count (every piece goes to every rank, itself included);
 *   direct broadcast: (n-1) * count at the root (to every other rank), 0 elsewhere;
 *   direct reduce: count (to the root; the root's own through its loopback);
 *   direct allgather: (n-1) * count, as the ring's;
 *   allreduce: per channel range of len elements, pieces of P = n*chunk elements (one piece of len
 *     when chunk > len/n), the last one smaller; each piece is split into n chunks of
 *     P/n + (c < P%n) elements; rank r sends every chunk but r in the reduce-scatter half and every
 *     chunk but r+1 in the all-gather half: sum over pieces of 2P - s(r) - s(r+1);
 *   allgather, reducescatter: (n-1) * count;
 *   broadcast: count, except 0 for the last rank of the chain (root-1);
 *   reduce: count, except 0 for the root;
 *   alltoall: (n-1) * count (the own block is copied);
 *   gather: count, except 0 for the root; scatter: (n-1) * count at the root, 0 elsewhere;
 *   sendrecv: count, also for n == 1 (a self-send goes through the loopback connection).
 */
static uint64_t expected_elems(int coll, int algo, uint64_t count, int n, int r, int root,
                               int nch, uint64_t chunk)
{
    if (coll == WEFT_COLL_SEND)
        return count;
    if (n == 1)
        return 0;
    if (algo == WEFT_ALGO_TREE) /* see tests/common/tree_bytes.h */
        return tree_expected_elems(count, n, r, nch, chunk);
    if (is_direct(coll, algo)) {
        switch (coll) {
        case WEFT_COLL_ALLREDUCE:
        case WEFT_COLL_REDUCESCATTER:
            return (uint64_t)n * count;
        case WEFT_COLL_BROADCAST:
            return r == root ? (uint64_t)(n - 1) * count : 0;
        case WEFT_COLL_REDUCE:
            return count;
        default:
            break;
        }
    }
    switch (coll) {
    case WEFT_COLL_ALLREDUCE: {
        uint64_t total = 0;
        for (int ch = 0; ch < nch; ch++) {
            uint64_t off, len;
            weft_sched_range(count, ch, nch, &off, &len);
            uint64_t piece = chunk > len / (uint64_t)n ? len : chunk * (uint64_t)n;
            for (uint64_t po = 0; po < len; po += piece) {
                uint64_t p = len - po < piece ? len - po : piece;
                uint64_t q = p / (uint64_t)n, rem = p % (uint64_t)n;
                uint64_t s_r = q + ((uint64_t)r < rem);
                uint64_t s_next = q + ((uint64_t)mod(r + 1, n) < rem);
                total += 2 * p - s_r - s_next;
            }
        }
        return total;
    }
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_REDUCESCATTER:
        return (uint64_t)(n - 1) * count;
    case WEFT_COLL_BROADCAST:
        return r == mod(root - 1, n) ? 0 : count;
    case WEFT_COLL_REDUCE:
    case WEFT_COLL_GATHER:
        return r == root ? 0 : count;
    case WEFT_COLL_ALLTOALL:
        return (uint64_t)(n - 1) * count;
    case WEFT_COLL_SCATTER:
        return r == root ? (uint64_t)(n - 1) * count : 0;
    default:
        return 0;
    }
}

/* Times each input element is read by rank r (small counts check). */
static int expected_reads(int coll, int algo, int n, int r, int root)
{
    if (is_direct(coll, algo)) {
        switch (coll) {
        case WEFT_COLL_ALLREDUCE: /* n SENDs; n == 1: one COPY */
        case WEFT_COLL_ALLGATHER: /* n-1 SENDs and the COPY */
            return n;
        case WEFT_COLL_BROADCAST:
            return r == root ? n : 0;
        default: /* reduce, reducescatter: each element SENT once (n == 1: one COPY) */
            return 1;
        }
    }
    switch (coll) {
    case WEFT_COLL_ALLGATHER:
        return n > 1 ? 2 : 1; /* SEND and COPY */
    case WEFT_COLL_BROADCAST:
        return r != root ? 0 : n > 1 ? 2 : 1;
    case WEFT_COLL_SCATTER:
        return r == root;
    default:
        return 1;
    }
}

static int expected_writes(int coll, int algo, int n, int r, int root)
{
    /* Reducing: RECV, then n-1 RECV_REDUCE_COPY (n == 1: one COPY); reduce at the root only. */
    if (is_direct(coll, algo) && !is_copy_only(coll))
        return coll == WEFT_COLL_REDUCE && r != root ? 0 : n;
    return (coll == WEFT_COLL_REDUCE || coll == WEFT_COLL_GATHER) && r != root ? 0 : 1;
}

/* Times rank r reads each output element: the direct reducing schedules accumulate in it. */
static int expected_out_reads(int coll, int algo, int n, int r, int root)
{
    if (!is_direct(coll, algo) || is_copy_only(coll) || (coll == WEFT_COLL_REDUCE && r != root))
        return 0;
    return n - 1;
}

/* For sendrecv (coll WEFT_COLL_SEND), root is the distance d: rank r sends to r+d. */
struct cfg {
    int coll, algo, n, root, nch;
    uint64_t count, chunk;
};

/* Messages carry the same elements of the block at both ends (nothing is forwarded). */
static int cfg_unforwarded(const struct cfg *c)
{
    return c->coll >= WEFT_COLL_ALLTOALL || is_direct(c->coll, c->algo);
}

/* The schedules rank r runs on channel ch: one, or for sendrecv its SEND and its RECV. Returns how
 * many were written to a[0..2). */
static int cfg_args(const struct cfg *c, int r, int ch, struct weft_sched_args *a)
{
    struct weft_sched_args base = {c->coll, c->algo, c->count, c->n, r, c->root, ch, c->nch,
                                   c->chunk, NULL, NULL, 0};
    a[0] = base;
    if (c->coll != WEFT_COLL_SEND)
        return 1;
    a[0].root = mod(r + c->root, c->n);
    a[1] = base;
    a[1].coll = WEFT_COLL_RECV;
    a[1].root = mod(r - c->root, c->n);
    return 2;
}

/* Whether step s of rank r uses the peers (and only the ops) its collective allows. */
static int peers_ok(const struct cfg *c, int r, const struct weft_step *s)
{
    int n = c->n, sp = s->send_peer, rp = s->recv_peer;
    int sends = op_sends(s->op), recvs = op_recvs(s->op);
    if (!sends && sp != -1)
        return 0;
    if (!recvs && rp != -1)
        return 0;
    if (c->algo == WEFT_ALGO_TREE) { /* tree neighbours only; n == 1: COPY only */
        int ok_s = !sends, ok_r = !recvs;
        if (n == 1)
            return s->op == WEFT_STEP_COPY;
        for (int t = 0; t < 2; t++) {
            int nb[3];
            weft_sched_tree(n, t, r, &nb[0], &nb[1], &nb[2]);
            for (int j = 0; j < 3; j++) {
                ok_s |= nb[j] >= 0 && sp == nb[j];
                ok_r |= nb[j] >= 0 && rp == nb[j];
            }
        }
        return s->op != WEFT_STEP_COPY && s->op != WEFT_STEP_RECV_REDUCE_COPY_SEND && ok_s && ok_r;
    }
    if (is_direct(c->coll, c->algo)) { /* n == 1: COPY only */
        int any_s = sp >= 0 && sp < n, any_r = rp >= 0 && rp < n;
        if (n == 1)
            return s->op == WEFT_STEP_COPY;
        if (s->op == WEFT_STEP_RECV_REDUCE_SEND || s->op == WEFT_STEP_RECV_REDUCE_COPY_SEND ||
            s->op == WEFT_STEP_RECV_COPY_SEND)
            return 0;
        switch (c->coll) {
        case WEFT_COLL_ALLREDUCE: /* any rank, itself included (loopback) */
        case WEFT_COLL_REDUCESCATTER:
            return s->op != WEFT_STEP_COPY && (!sends || any_s) && (!recvs || any_r);
        case WEFT_COLL_REDUCE: /* all send to the root (itself too); the root receives from all */
            return sends ? sp == c->root : r == c->root && s->op != WEFT_STEP_COPY && any_r;
        case WEFT_COLL_BROADCAST: /* no loopback */
            if (r != c->root)
                return s->op == WEFT_STEP_RECV && rp == c->root;
            return s->op == WEFT_STEP_COPY || (s->op == WEFT_STEP_SEND && any_s && sp != r);
        case WEFT_COLL_ALLGATHER: /* no loopback */
            return s->op != WEFT_STEP_RECV_REDUCE_COPY && (!sends || (any_s && sp != r)) &&
                   (!recvs || (any_r && rp != r));
        default:
            return 0;
        }
    }
    if (c->coll < WEFT_COLL_ALLTOALL) /* rings and chains: next and prev only */
        return (!sends || (sp == mod(r + 1, n) && n > 1)) &&
               (!recvs || (rp == mod(r - 1, n) && n > 1));
    /* The rest use plain SEND, RECV and COPY. */
    if (s->op != WEFT_STEP_SEND && s->op != WEFT_STEP_RECV && s->op != WEFT_STEP_COPY)
        return 0;
    switch (c->coll) {
    case WEFT_COLL_ALLTOALL:
        return (!sends || (sp >= 0 && sp < n && sp != r)) &&
               (!recvs || (rp >= 0 && rp < n && rp != r));
    case WEFT_COLL_GATHER:
        if (r != c->root)
            return s->op == WEFT_STEP_SEND && sp == c->root;
        return s->op != WEFT_STEP_SEND && (!recvs || (rp >= 0 && rp < n && rp != r));
    case WEFT_COLL_SCATTER:
        if (r != c->root)
            return s->op == WEFT_STEP_RECV && rp == c->root;
        return s->op != WEFT_STEP_RECV && (!sends || (sp >= 0 && sp < n && sp != r));
    case WEFT_COLL_SEND:
        return s->op == WEFT_STEP_SEND ? sp == mod(r + c->root, n)
                                       : s->op == WEFT_STEP_RECV && rp == mod(r - c->root, n);
    default:
        return 0;
    }
}

static void cfg_str(const struct cfg *c, char *buf, size_t len)
{
    int sr = c->coll == WEFT_COLL_SEND;
    snprintf(buf, len, "%s/%s n %d %s %d count %llu nch %d chunk %llu",
             weft_algo_name(c->algo), sr ? "SendRecv" : weft_coll_name(c->coll), c->n,
             sr ? "distance" : "root", c->root, (unsigned long long)c->count, c->nch,
             (unsigned long long)c->chunk);
}

static void check_step(const struct cfg *c, int r, uint64_t i, const struct weft_step *s,
                       const char *name)
{
    int n = c->n;
    uint64_t isz = in_size(c->coll, c->count, n), osz = out_size(c->coll, c->count, n);
    int ok = 1;
    if (s->count < 1 || s->count > c->chunk || s->op > WEFT_STEP_COPY || (s->flags & ~1u))
        ok = 0;
    if (!peers_ok(c, r, s))
        ok = 0;
    if (is_copy_only(c->coll) && s->flags != 0) /* no reduction, nothing is FINAL */
        ok = 0;
    if (op_reads(s->op)) {
        uint64_t sz = s->src == WEFT_BUF_INPUT ? isz : s->src == WEFT_BUF_OUTPUT ? osz : 0;
        if (s->src == WEFT_BUF_NONE || s->src_off > sz || s->count > sz - s->src_off)
            ok = 0;
    } else if (s->src != WEFT_BUF_NONE) {
        ok = 0;
    }
    if (op_writes(s->op)) {
        if (s->dst != WEFT_BUF_OUTPUT || s->dst_off > osz || s->count > osz - s->dst_off)
            ok = 0;
    } else if (s->dst != WEFT_BUF_NONE) {
        ok = 0;
    }
    if (!ok)
        FAIL("%s rank %d step %llu: op %d src %d+%llu dst %d+%llu count %llu peers %d/%d flags %d",
             name, r, (unsigned long long)i, s->op, s->src, (unsigned long long)s->src_off,
             s->dst, (unsigned long long)s->dst_off, (unsigned long long)s->count, s->send_peer,
             s->recv_peer, s->flags);
    else
        npass++;
}

/* Element of the block that a send to b reads, and that a receive from a writes: equal for a
 * matched pair when the collective forwards nothing. */
static uint64_t send_elem(const struct cfg *c, int b, const struct weft_step *s)
{
    return s->src_off - (in_blocks(c->coll) ? (uint64_t)b * c->count : 0);
}

static uint64_t recv_elem(const struct cfg *c, int a, const struct weft_step *s)
{
    return s->dst_off - (out_blocks(c->coll) ? (uint64_t)a * c->count : 0);
}

/* Tree steps touch the same element index in whichever buffer they use. */
static uint64_t step_elem(const struct weft_step *s)
{
    return s->src != WEFT_BUF_NONE ? s->src_off : s->dst_off;
}

/* Per channel: the k-th send a->b has the count of the k-th receive at b from a; none is left.
 * Sends are first grouped by pair, in order: idx[first[a*n+b] ..) are a's steps that send to b. */
static void check_matching(const struct cfg *c, int ch, struct weft_step **steps, uint64_t *ns,
                           const char *name)
{
    int n = c->n;
    size_t np = (size_t)n * n;
    uint64_t *first = calloc(np + 1, sizeof(*first));
    uint64_t *matched = calloc(np, sizeof(*matched));
    uint64_t *sent = calloc(np, sizeof(*sent));
    uint64_t *idx = NULL;
    int ok = 1;
    for (int a = 0; a < n && ok; a++)
        for (uint64_t i = 0; i < ns[a] && ok; i++) {
            const struct weft_step *s = &steps[a][i];
            if (op_sends(s->op) && (s->send_peer < 0 || s->send_peer >= n)) {
                FAIL("%s ch %d: rank %d step %llu sends to %d", name, ch, a, (unsigned long long)i,
                     s->send_peer);
                ok = 0;
            } else if (op_recvs(s->op) && (s->recv_peer < 0 || s->recv_peer >= n)) {
                FAIL("%s ch %d: rank %d step %llu receives from %d", name, ch, a,
                     (unsigned long long)i, s->recv_peer);
                ok = 0;
            } else if (op_sends(s->op)) {
                sent[(size_t)a * n + s->send_peer]++;
            }
        }
    for (size_t p = 0; p < np && ok; p++)
        first[p + 1] = first[p] + sent[p];
    if (ok) {
        uint64_t *fill = calloc(np, sizeof(*fill));
        idx = malloc((first[np] + 1) * sizeof(*idx));
        for (int a = 0; a < n; a++)
            for (uint64_t i = 0; i < ns[a]; i++)
                if (op_sends(steps[a][i].op)) {
                    size_t p = (size_t)a * n + steps[a][i].send_peer;
                    idx[first[p] + fill[p]++] = i;
                }
        free(fill);
    }
    for (int b = 0; b < n && ok; b++) {
        for (uint64_t i = 0; i < ns[b] && ok; i++) {
            const struct weft_step *s = &steps[b][i];
            if (!op_recvs(s->op))
                continue;
            int a = s->recv_peer;
            size_t p = (size_t)a * n + b;
            if (matched[p] == sent[p]) {
                FAIL("%s ch %d: rank %d step %llu receives from %d, which sends no more", name, ch,
                     b, (unsigned long long)i, a);
                ok = 0;
                break;
            }
            const struct weft_step *t = &steps[a][idx[first[p] + matched[p]]];
            if (t->count != s->count) {
                FAIL("%s ch %d: %d->%d message %llu: sent %llu, received %llu", name, ch, a, b,
                     (unsigned long long)matched[p], (unsigned long long)t->count,
                     (unsigned long long)s->count);
                ok = 0;
            } else if (c->algo == WEFT_ALGO_TREE && step_elem(t) != step_elem(s)) {
                FAIL("%s ch %d: %d->%d message %llu: sends element %llu, lands at %llu", name, ch,
                     a, b, (unsigned long long)matched[p], (unsigned long long)step_elem(t),
                     (unsigned long long)step_elem(s));
                ok = 0;
            } else if (cfg_unforwarded(c) && send_elem(c, b, t) != recv_elem(c, a, s)) {
                FAIL("%s ch %d: %d->%d message %llu: sends block element %llu, lands at %llu",
                     name, ch, a, b, (unsigned long long)matched[p],
                     (unsigned long long)send_elem(c, b, t),
                     (unsigned long long)recv_elem(c, a, s));
                ok = 0;
            }
            matched[p]++;
        }
    }
    for (size_t p = 0; p < np && ok; p++) {
        if (sent[p] != matched[p]) {
            FAIL("%s ch %d: %d->%d sends %llu messages, %llu received", name, ch, (int)(p / n),
                 (int)(p % n), (unsigned long long)sent[p], (unsigned long long)matched[p]);
            ok = 0;
        }
    }
    if (ok)
        npass++;
    free(first);
    free(matched);
    free(sent);
    free(idx);
}

/* Intervals a rank reads or writes, as +1/-1 events, to check how often each element is covered. */
struct cover {
    struct event {
        uint64_t pos;
        int64_t delta;
    } *ev;
    size_t n, cap;
};

static void cover_add(struct cover *cv, uint64_t off, uint64_t count)
{
    if (cv->n + 2 > cv->cap) {
        cv->cap = cv->cap ? 2 * cv->cap : 64;
        cv->ev = realloc(cv->ev, cv->cap * sizeof(*cv->ev));
    }
    cv->ev[cv->n++] = (struct event){off, 1};
    cv->ev[cv->n++] = (struct event){off + count, -1};
}

static int event_cmp(const void *a, const void *b)
{
    const struct event *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Sorts the events by position: LSD radix sort on the bytes below the largest position when
 * positions fit in 32 bits (much faster than qsort here; a byte no position differs in is
 * skipped), insertion sort for a few, qsort for huge positions. */
static void cover_sort(struct cover *cv)
{
    uint64_t maxpos = 0;
    for (size_t i = 0; i < cv->n; i++)
        maxpos = cv->ev[i].pos > maxpos ? cv->ev[i].pos : maxpos;
    if (maxpos >> 32) {
        qsort(cv->ev, cv->n, sizeof(*cv->ev), event_cmp);
        return;
    }
    if (cv->n < 32) {
        for (size_t i = 1; i < cv->n; i++) {
            struct event e = cv->ev[i];
            size_t j = i;
            for (; j > 0 && cv->ev[j - 1].pos > e.pos; j--)
                cv->ev[j] = cv->ev[j - 1];
            cv->ev[j] = e;
        }
        return;
    }
    struct event *tmp = malloc(cv->n * sizeof(*tmp)), *from = cv->ev, *to = tmp;
    size_t hist[256];
    for (int shift = 0; shift < 32 && (maxpos >> shift) != 0; shift += 8) {
        memset(hist, 0, sizeof(hist));
        for (size_t i = 0; i < cv->n; i++)
            hist[(from[i].pos >> shift) & 0xff]++;
        if (hist[(from[0].pos >> shift) & 0xff] == cv->n)
            continue; /* one digit: this pass would not move anything */
        size_t sum = 0;
        for (size_t d = 0; d < 256; d++) {
            size_t h = hist[d];
            hist[d] = sum;
            sum += h;
        }
        for (size_t i = 0; i < cv->n; i++)
            to[hist[(from[i].pos >> shift) & 0xff]++] = from[i];
        struct event *t = from;
        from = to;
        to = t;
    }
    if (from != cv->ev)
        memcpy(cv->ev, from, cv->n * sizeof(*from));
    free(tmp);
}

/* Every element of [0, size) is covered exactly `want` times, nothing outside it. */
static void cover_check(struct cover *cv, uint64_t size, int want, const char *what)
{
    if (want == 0 || size == 0) {
        EXPECT(cv->n == 0, "%s: %zu intervals, want none", what, cv->n / 2);
        return;
    }
    cover_sort(cv);
    int64_t level = 0;
    uint64_t at = 0; /* everything below `at` has been checked */
    for (size_t i = 0; i < cv->n;) {
        uint64_t pos = cv->ev[i].pos;
        if (pos > at && level != want) { /* [at, pos) holds `level` intervals */
            FAIL("%s: elements %llu..%llu covered %lld times, want %d", what,
                 (unsigned long long)at, (unsigned long long)pos - 1, (long long)level, want);
            return;
        }
        at = pos;
        while (i < cv->n && cv->ev[i].pos == pos)
            level += cv->ev[i++].delta;
    }
    if (at != size || level != 0) {
        FAIL("%s: covers [%llu, %llu), want [0, %llu)", what,
             (unsigned long long)(cv->n ? cv->ev[0].pos : 0), (unsigned long long)at,
             (unsigned long long)size);
        return;
    }
    npass++;
}

static void step_str(const struct weft_step *s, char *buf, size_t len)
{
    static const char *const ops[] = {
        "SEND", "RECV", "RECV_REDUCE_SEND", "RECV_REDUCE_COPY", "RECV_REDUCE_COPY_SEND",
        "RECV_COPY_SEND", "COPY",
    };
    snprintf(buf, len, "%s src %d+%llu dst %d+%llu count %llu peers %d/%d flags %d",
             s->op <= WEFT_STEP_COPY ? ops[s->op] : "?", s->src, (unsigned long long)s->src_off,
             s->dst, (unsigned long long)s->dst_off, (unsigned long long)s->count, s->send_peer,
             s->recv_peer, s->flags);
}

/* Equal where it matters: offsets only for the buffers the step uses. */
static int step_eq(const struct weft_step *want, const struct weft_step *got)
{
    return want->op == got->op && want->src == got->src && want->dst == got->dst &&
           want->flags == got->flags && want->send_peer == got->send_peer &&
           want->recv_peer == got->recv_peer && want->count == got->count &&
           (want->src == WEFT_BUF_NONE || want->src_off == got->src_off) &&
           (want->dst == WEFT_BUF_NONE || want->dst_off == got->dst_off);
}

static void put_step(struct weft_step *w, int *k, int op, int src, uint64_t src_off, int dst,
                     uint64_t dst_off, int send_peer, int recv_peer, int flags, uint64_t count)
{
    w[(*k)++] = (struct weft_step){.op = (uint8_t)op,
                                   .src = (uint8_t)src,
                                   .dst = (uint8_t)dst,
                                   .flags = (uint8_t)flags,
                                   .send_peer = send_peer,
                                   .recv_peer = recv_peer,
                                   .src_off = src_off,
                                   .dst_off = dst_off,
                                   .count = count};
}

/* RECV output[e] <- 0, then RECV_REDUCE_COPY output[e] <- p (src output[e]) for p = 1 .. n-1:
 * every rank adds in the same (rank) order; FINAL on the last. */
static void put_reduce_in_order(struct weft_step *w, int *k, int n, uint64_t e, uint64_t cnt)
{
    put_step(w, k, WEFT_STEP_RECV, WEFT_BUF_NONE, 0, WEFT_BUF_OUTPUT, e, -1, 0, 0, cnt);
    for (int p = 1; p < n; p++)
        put_step(w, k, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_OUTPUT, e, WEFT_BUF_OUTPUT, e, -1, p,
                 p == n - 1 ? WEFT_STEP_FINAL : 0, cnt);
}

/* The steps of rank r for the piece of cnt elements at e (block element), restated from the block
 * comment of sched.c, into w (room for 2n). Returns how many. */
static int direct_piece(const struct cfg *c, int r, uint64_t e, uint64_t cnt, struct weft_step *w)
{
    int n = c->n, root = c->root, k = 0;
    uint64_t count = c->count;
    if (n == 1) { /* FINAL only for a reduction */
        put_step(w, &k, WEFT_STEP_COPY, WEFT_BUF_INPUT, e, WEFT_BUF_OUTPUT, e, -1, -1,
                 is_copy_only(c->coll) ? 0 : WEFT_STEP_FINAL, cnt);
        return k;
    }
    switch (c->coll) {
    case WEFT_COLL_ALLREDUCE: /* to r+1, ..., r+n-1, r: itself last, through the loopback */
        for (int j = 1; j <= n; j++)
            put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_INPUT, e, WEFT_BUF_NONE, 0, mod(r + j, n), -1,
                     0, cnt);
        put_reduce_in_order(w, &k, n, e, cnt);
        break;
    case WEFT_COLL_REDUCESCATTER: /* block p to p, its own last (before output is written) */
        for (int j = 1; j <= n; j++) {
            int p = mod(r + j, n);
            put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_INPUT, (uint64_t)p * count + e, WEFT_BUF_NONE,
                     0, p, -1, 0, cnt);
        }
        put_reduce_in_order(w, &k, n, e, cnt);
        break;
    case WEFT_COLL_REDUCE: /* the root's own input through its loopback */
        put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_INPUT, e, WEFT_BUF_NONE, 0, root, -1, 0, cnt);
        if (r == root)
            put_reduce_in_order(w, &k, n, e, cnt);
        break;
    case WEFT_COLL_BROADCAST:
        if (r != root) {
            put_step(w, &k, WEFT_STEP_RECV, WEFT_BUF_NONE, 0, WEFT_BUF_OUTPUT, e, -1, root, 0, cnt);
            break;
        }
        for (int j = 1; j < n; j++)
            put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_INPUT, e, WEFT_BUF_NONE, 0, mod(r + j, n), -1,
                     0, cnt);
        put_step(w, &k, WEFT_STEP_COPY, WEFT_BUF_INPUT, e, WEFT_BUF_OUTPUT, e, -1, -1, 0, cnt);
        break;
    case WEFT_COLL_ALLGATHER:
        for (int j = 1; j < n; j++)
            put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_INPUT, e, WEFT_BUF_NONE, 0, mod(r + j, n), -1,
                     0, cnt);
        put_step(w, &k, WEFT_STEP_COPY, WEFT_BUF_INPUT, e, WEFT_BUF_OUTPUT,
                 (uint64_t)r * count + e, -1, -1, 0, cnt);
        for (int j = 1; j < n; j++) {
            int p = mod(r - j, n);
            put_step(w, &k, WEFT_STEP_RECV, WEFT_BUF_NONE, 0, WEFT_BUF_OUTPUT,
                     (uint64_t)p * count + e, -1, p, 0, cnt);
        }
        break;
    default:
        break;
    }
    return k;
}

/* A direct schedule, rank r on channel ch, piece by piece (cnt = min(chunk, rest) elements at e,
 * in order through the channel's range): exactly the steps of direct_piece, nothing after the
 * last piece. Per piece (n > 1):
 *   allreduce:     SEND input[e] -> r, r+1, ..., r+n-1; the reduction in rank order;
 *   reducescatter: SEND input[p*count+e] -> p for p = r, r+1, ..., r+n-1; the reduction;
 *   reduce:        SEND input[e] -> root; at the root, the reduction;
 *   broadcast:     root: SEND input[e] -> r+1, ..., r+n-1, COPY input[e] -> output[e]; others:
 *                  RECV output[e] <- root;
 *   allgather:     SEND input[e] -> r+1, ..., r+n-1; COPY input[e] -> output[r*count+e]; RECV
 *                  output[p*count+e] <- p for p = r-1, r-2, ..., r+1;
 *   the reduction: RECV output[e] <- 0, then RECV_REDUCE_COPY output[e] <- p (src output[e]) for
 *                  p = 1 .. n-1, which makes every rank add in the same order; FINAL on the last
 *                  step only.
 * n == 1: one COPY input[e] -> output[e] per piece, FINAL for the reducing ones. */
static void check_direct_pieces(const struct cfg *c, int r, int ch, const struct weft_step *st,
                                uint64_t ns, const char *name)
{
    uint64_t off, len, i = 0;
    weft_sched_range(c->count, ch, c->nch, &off, &len);
    struct weft_step *want = malloc(2 * (size_t)c->n * sizeof(*want));
    const char *why = NULL;
    const struct weft_step *w = NULL;
    for (uint64_t po = 0; po < len && why == NULL; po += c->chunk) {
        uint64_t cnt = len - po < c->chunk ? len - po : c->chunk, e = off + po;
        int k = direct_piece(c, r, e, cnt, want);
        for (int j = 0; j < k; j++, i++) { /* on a failure, i stays at the step */
            w = &want[j];
            if (i == ns)
                why = "list ends inside a piece";
            else if (!step_eq(w, &st[i]))
                why = "not the documented step";
            if (why != NULL)
                break;
        }
    }
    if (why == NULL && i != ns) {
        why = "steps after the last piece";
        w = NULL;
    }
    if (why != NULL) {
        char got[160] = "none", exp[160] = "none";
        if (i < ns)
            step_str(&st[i], got, sizeof(got));
        if (w != NULL)
            step_str(w, exp, sizeof(exp));
        FAIL("%s ch %d rank %d step %llu of %llu: %s: got %s, want %s", name, ch, r,
             (unsigned long long)i, (unsigned long long)ns, why, got, exp);
    } else {
        npass++;
    }
    free(want);
}

/* The tree of the block comment in sched.c, restated from the parent side: position q (1-based)
 * with lowbit c hangs below q + c when q/c = 1 mod 4 and q + c <= n, else below q - c; the root is
 * the largest power of two <= n. Tree 0 puts rank r at r+1; tree 1 mirrors it for even n (r at
 * n - r) and shifts it for odd n (r at (r+1) mod n + 1). */
static int tree_pos_ref(int n, int t, int r)
{
    return t == 0 ? r + 1 : n % 2 == 0 ? n - r : (r + 1) % n + 1;
}

static int tree_parent_ref(int n, int t, int r)
{
    int q = tree_pos_ref(n, t, r), c = q & -q, root = 1;
    while (2 * root <= n)
        root *= 2;
    if (q == root)
        return -1;
    int p = (q / c) % 4 == 1 && q + c <= n ? q + c : q - c;
    return t == 0 ? p - 1 : n % 2 == 0 ? n - p : mod(p - 2, n);
}

/* In-order walk of tree t from rank r: appends positions to seq (checks the order). */
static void tree_inorder(int n, int t, int r, int *seq, int *len, int depth, int *maxdepth)
{
    int p, c0, c1;
    weft_sched_tree(n, t, r, &p, &c0, &c1);
    if (depth > *maxdepth)
        *maxdepth = depth;
    if (*len > n)
        return; /* a cycle: the caller sees the overrun */
    if (c0 >= 0)
        tree_inorder(n, t, c0, seq, len, depth + 1, maxdepth);
    seq[(*len)++] = tree_pos_ref(n, t, r);
    if (c1 >= 0)
        tree_inorder(n, t, c1, seq, len, depth + 1, maxdepth);
}

static void check_tree_shape(int n)
{
    int *seq = malloc(((size_t)n + 2) * sizeof(int)), internal[2] = {0, 0}, both = 0, ok = 1;
    int log2n = 0;
    while ((2 << log2n) <= n)
        log2n++;
    for (int t = 0; t < 2; t++) {
        int root = -1, nroots = 0;
        for (int r = 0; r < n; r++) {
            int p, c0, c1, pp, q0, q1;
            weft_sched_tree(n, t, r, &p, &c0, &c1);
            if (p != tree_parent_ref(n, t, r) || (c1 >= 0 && c0 < 0))
                ok = 0;
            if (p < 0) {
                root = r;
                nroots++;
            } else { /* the parent lists r as a child */
                weft_sched_tree(n, t, p, &pp, &q0, &q1);
                ok &= q0 == r || q1 == r;
            }
            for (int j = 0; j < 2; j++) { /* the children name r as their parent */
                int c = j == 0 ? c0 : c1;
                if (c >= 0)
                    ok &= tree_parent_ref(n, t, c) == r && c != r;
            }
            /* tree 1 is tree 0 mirrored (even n: r stands where n-1-r stands in tree 0) or
             * shifted (odd n: where r+1 stands) */
            if (t == 1 && n % 2 == 0) {
                int p0, d0, d1;
                weft_sched_tree(n, 0, n - 1 - r, &p0, &d0, &d1);
                ok &= p == (p0 < 0 ? -1 : n - 1 - p0) && c0 == (d0 < 0 ? -1 : n - 1 - d0) &&
                      c1 == (d1 < 0 ? -1 : n - 1 - d1);
            } else if (t == 1) {
                int p0, d0, d1;
                weft_sched_tree(n, 0, (r + 1) % n, &p0, &d0, &d1);
                ok &= p == (p0 < 0 ? -1 : mod(p0 - 1, n)) && c0 == (d0 < 0 ? -1 : mod(d0 - 1, n)) &&
                      c1 == (d1 < 0 ? -1 : mod(d1 - 1, n));
            }
            /* one direction of a pair in one tree per phase: r is not a's child in both trees */
            if (t == 1 && p >= 0) {
                int p0, d0, d1;
                weft_sched_tree(n, 0, r, &p0, &d0, &d1);
                ok &= p0 != p;
            }
        }
        int len = 0, depth = 0;
        if (nroots == 1)
            tree_inorder(n, t, root, seq, &len, 0, &depth);
        ok &= nroots == 1 && len == n && depth == log2n;
        for (int i = 0; i < len && i < n && ok; i++)
            ok &= seq[i] == i + 1;
    }
    for (int r = 0; r < n; r++) {
        int in[2];
        for (int t = 0; t < 2; t++) {
            int p, c0, c1;
            weft_sched_tree(n, t, r, &p, &c0, &c1);
            in[t] = c0 >= 0;
            internal[t] += in[t];
        }
        both += in[0] && in[1];
        ok &= n % 2 == 1 || n == 1 || in[0] || in[1];
    }
    EXPECT(ok && both == 0 && internal[0] == n / 2,
           "tree shape n %d: ok %d, %d ranks internal in both, %d internal in tree 0", n, ok, both,
           internal[0]);
    free(seq);
}

/* Per half of tree t: how often rank r reads each input element, writes and reads each output
 * element (from the step list of the block comment). */
static void tree_role_counts(int n, int t, int r, int *in_rd, int *out_wr, int *out_rd)
{
    *in_rd = 1;
    if (n == 1) {
        *out_wr = 1;
        *out_rd = 0;
        return;
    }
    int p, c0, c1;
    weft_sched_tree(n, t, r, &p, &c0, &c1);
    int k = (c0 >= 0) + (c1 >= 0);
    *out_wr = p < 0 ? k : (k == 2) + 1;        /* reductions into output; the broadcast's copy */
    *out_rd = p < 0 ? (k == 2) + k : 2 * (k == 2); /* 2nd child's reduce; sends from output */
}

/* The steps of rank r for half t (up or down) of cnt elements at e, restated from the block
 * comment of sched.c. Returns how many (at most 2). */
static int tree_half(int n, int t, int r, int down, uint64_t e, uint64_t cnt, struct weft_step *w)
{
    int k = 0, p, c0, c1;
    if (n == 1) {
        if (!down)
            put_step(w, &k, WEFT_STEP_COPY, WEFT_BUF_INPUT, e, WEFT_BUF_OUTPUT, e, -1, -1,
                     WEFT_STEP_FINAL, cnt);
        return k;
    }
    weft_sched_tree(n, t, r, &p, &c0, &c1);
    if (!down) {
        if (c0 < 0) {
            put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_INPUT, e, WEFT_BUF_NONE, 0, p, -1, 0, cnt);
        } else if (c1 < 0 && p >= 0) {
            put_step(w, &k, WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_INPUT, e, WEFT_BUF_NONE, 0, p, c0,
                     0, cnt);
        } else if (c1 < 0) {
            put_step(w, &k, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, e, WEFT_BUF_OUTPUT, e, -1,
                     c0, WEFT_STEP_FINAL, cnt);
        } else {
            put_step(w, &k, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, e, WEFT_BUF_OUTPUT, e, -1,
                     c0, 0, cnt);
            if (p >= 0)
                put_step(w, &k, WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_OUTPUT, e, WEFT_BUF_NONE, 0,
                         p, c1, 0, cnt);
            else
                put_step(w, &k, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_OUTPUT, e, WEFT_BUF_OUTPUT, e,
                         -1, c1, WEFT_STEP_FINAL, cnt);
        }
        return k;
    }
    if (p < 0)
        put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_OUTPUT, e, WEFT_BUF_NONE, 0, c0, -1, 0, cnt);
    else if (c0 < 0)
        put_step(w, &k, WEFT_STEP_RECV, WEFT_BUF_NONE, 0, WEFT_BUF_OUTPUT, e, -1, p, 0, cnt);
    else
        put_step(w, &k, WEFT_STEP_RECV_COPY_SEND, WEFT_BUF_NONE, 0, WEFT_BUF_OUTPUT, e, c0, p, 0,
                 cnt);
    if (c1 >= 0)
        put_step(w, &k, WEFT_STEP_SEND, WEFT_BUF_OUTPUT, e, WEFT_BUF_NONE, 0, c1, -1, 0, cnt);
    return k;
}

/* Pieces of 2*chunk elements (one piece of len when chunk >= ceil(len/2)), halves ceil and floor
 * of P/2. Piece P of tree t runs in slot P + D - depth_t(r) up and P + depth_t(r) down (D =
 * floor(log2 n), depth: edges to the root), so that every message is taken one slot after it is
 * sent; the steps go up slot by slot, then down slot by slot, and within a slot up takes the tree
 * r is a leaf in first, down the tree r is internal in first. */
static uint64_t tree_piece_ref(uint64_t len, uint64_t chunk)
{
    return chunk >= len - len / 2 ? (len > 0 ? len : 1) : 2 * chunk;
}

/* Elements of half t of a piece of p elements, and where it starts in the piece: ceil and floor
 * of p/2, or all of p on tree 0 when p <= min(chunk, WEFT_SCHED_TREE_ONE_MAX). */
static uint64_t tree_half_ref(uint64_t p, uint64_t chunk, int t, uint64_t *at)
{
    uint64_t one = chunk < WEFT_SCHED_TREE_ONE_MAX ? chunk : WEFT_SCHED_TREE_ONE_MAX;
    if (p <= one) {
        *at = t == 0 ? 0 : p;
        return t == 0 ? p : 0;
    }
    *at = t == 0 ? 0 : p - p / 2;
    return t == 0 ? p - p / 2 : p / 2;
}

static int tree_depth_ref(int n, int t, int r)
{
    int d = 0;
    for (int p = tree_parent_ref(n, t, r); p >= 0; p = tree_parent_ref(n, t, p))
        d++;
    return d;
}

/* A tree schedule, rank r on channel ch: exactly the steps of tree_half in the order above. */
static void check_tree_pieces(const struct cfg *c, int r, int ch, const struct weft_step *st,
                              uint64_t ns, const char *name)
{
    uint64_t off, len, i = 0;
    weft_sched_range(c->count, ch, c->nch, &off, &len);
    uint64_t piece = tree_piece_ref(len, c->chunk), npieces = (len + piece - 1) / piece;
    int dmax = 0, depth[2] = {tree_depth_ref(c->n, 0, r), tree_depth_ref(c->n, 1, r)};
    while ((2 << dmax) <= c->n)
        dmax++;
    struct weft_step want[2];
    const char *why = NULL;
    const struct weft_step *w = NULL;
    for (int down = 0; down < 2 && why == NULL; down++)
        for (uint64_t slot = 0; slot < npieces + (uint64_t)dmax && why == NULL; slot++) {
            for (int j = 0; j < 2 && why == NULL; j++) {
                int pr, c0[2], c1;
                weft_sched_tree(c->n, 0, r, &pr, &c0[0], &c1);
                weft_sched_tree(c->n, 1, r, &pr, &c0[1], &c1);
                int t = j ^ (c0[down] >= 0);
                int64_t pi = (int64_t)slot - (down ? depth[t] : dmax - depth[t]);
                if (pi < 0 || (uint64_t)pi >= npieces)
                    continue;
                uint64_t po = (uint64_t)pi * piece;
                uint64_t p = len - po < piece ? len - po : piece;
                uint64_t at, h = tree_half_ref(p, c->chunk, t, &at), e = off + po + at;
                int k = h > 0 ? tree_half(c->n, t, r, down, e, h, want) : 0;
                for (int j = 0; j < k; j++, i++) {
                    w = &want[j];
                    if (i == ns)
                        why = "list ends inside a piece";
                    else if (!step_eq(w, &st[i]))
                        why = "not the documented step";
                    if (why != NULL)
                        break;
                }
            }
        }
    if (why == NULL && i != ns) {
        why = "steps after the last piece";
        w = NULL;
    }
    if (why != NULL) {
        char got[160] = "none", exp[160] = "none";
        if (i < ns)
            step_str(&st[i], got, sizeof(got));
        if (w != NULL)
            step_str(w, exp, sizeof(exp));
        FAIL("%s ch %d rank %d step %llu of %llu: %s: got %s, want %s", name, ch, r,
             (unsigned long long)i, (unsigned long long)ns, why, got, exp);
    } else {
        npass++;
    }
}

/* The expected coverage of a tree all-reduce for rank r: per half, the role counts. */
static void tree_expected_cover(const struct cfg *c, int r, struct cover *in_rd,
                                struct cover *out_wr, struct cover *out_rd)
{
    for (int ch = 0; ch < c->nch; ch++) {
        uint64_t off, len;
        weft_sched_range(c->count, ch, c->nch, &off, &len);
        uint64_t piece = tree_piece_ref(len, c->chunk);
        for (uint64_t po = 0; po < len; po += piece) {
            uint64_t p = len - po < piece ? len - po : piece;
            for (int t = 0; t < 2; t++) {
                uint64_t at, h = tree_half_ref(p, c->chunk, t, &at), e = off + po + at;
                int ir, ow, orr;
                tree_role_counts(c->n, t, r, &ir, &ow, &orr);
                for (int j = 0; j < ir && h > 0; j++)
                    cover_add(in_rd, e, h);
                for (int j = 0; j < ow && h > 0; j++)
                    cover_add(out_wr, e, h);
                for (int j = 0; j < orr && h > 0; j++)
                    cover_add(out_rd, e, h);
            }
        }
    }
}

/* Level of coverage as a step function: positions where it changes and the new level. */
static size_t cover_levels(struct cover *cv, uint64_t *pos, int64_t *lvl)
{
    cover_sort(cv);
    size_t m = 0;
    int64_t level = 0;
    for (size_t i = 0; i < cv->n;) {
        uint64_t at = cv->ev[i].pos;
        while (i < cv->n && cv->ev[i].pos == at)
            level += cv->ev[i++].delta;
        if (m > 0 && lvl[m - 1] == level)
            continue;
        if (m == 0 && level == 0)
            continue;
        pos[m] = at;
        lvl[m++] = level;
    }
    return m;
}

/* Both covers count every element the same number of times. */
static void cover_equal(struct cover *got, struct cover *want, const char *what)
{
    size_t cap = got->n + want->n + 1;
    uint64_t *gp = malloc(cap * sizeof(*gp)), *wp = malloc(cap * sizeof(*wp));
    int64_t *gl = malloc(cap * sizeof(*gl)), *wl = malloc(cap * sizeof(*wl));
    size_t gm = cover_levels(got, gp, gl), wm = cover_levels(want, wp, wl);
    size_t i = 0;
    while (i < gm && i < wm && gp[i] == wp[i] && gl[i] == wl[i])
        i++;
    if (i == gm && i == wm)
        npass++;
    else
        FAIL("%s: coverage differs from element %llu (level %lld, want %lld)", what,
             (unsigned long long)(i < gm ? gp[i] : i < wm ? wp[i] : 0),
             (long long)(i < gm ? gl[i] : 0), (long long)(i < wm ? wl[i] : 0));
    free(gp);
    free(wp);
    free(gl);
    free(wl);
}

static void run_cfg(const struct cfg *c)
{
    char name[160];
    cfg_str(c, name, sizeof(name));
    int n = c->n;
    struct weft_step **steps = calloc((size_t)n, sizeof(*steps));
    uint64_t *ns = calloc((size_t)n, sizeof(*ns));
    uint64_t *elems = calloc((size_t)n, sizeof(*elems));
    uint64_t isz = in_size(c->coll, c->count, n), osz = out_size(c->coll, c->count, n);
    struct cover *rdv = calloc((size_t)n, sizeof(*rdv)), *wrv = calloc((size_t)n, sizeof(*wrv));
    struct cover *rdo = calloc((size_t)n, sizeof(*rdo)); /* reads of the output */

    for (int ch = 0; ch < c->nch; ch++) {
        for (int r = 0; r < n; r++) {
            struct weft_sched_args a[2];
            int na = cfg_args(c, r, ch, a);
            uint64_t maxs[2] = {0, 0};
            for (int j = 0; j < na; j++)
                maxs[j] = weft_sched_max_steps(&a[j]);
            steps[r] = malloc((size_t)(maxs[0] + maxs[1] + 1) * sizeof(struct weft_step));
            ns[r] = 0;
            /* sendrecv: the RECV schedule's steps follow the SEND schedule's. */
            for (int j = 0; j < na; j++) {
                struct weft_step *st = steps[r] + ns[r];
                uint64_t got = weft_sched_build(&a[j], st, maxs[j] + 1);
                if (got == UINT64_MAX || got != maxs[j]) {
                    FAIL("%s ch %d rank %d %s: built %llu steps, max_steps %llu", name, ch, r,
                         weft_coll_name(a[j].coll), (unsigned long long)got,
                         (unsigned long long)maxs[j]);
                    break;
                }
                npass++;
                if (got > 0 && r == 0 && ch == 0)
                    EXPECT(weft_sched_build(&a[j], st, got - 1) == UINT64_MAX,
                           "%s: short list accepted", name);
                ns[r] += got;
            }
            uint64_t got = ns[r];
            elems[r] += weft_sched_bytes_sent(steps[r], got, 1);
            EXPECT(weft_sched_bytes_sent(steps[r], got, 4) ==
                       4 * weft_sched_bytes_sent(steps[r], got, 1),
                   "%s: bytes_sent elem_size", name);
            for (uint64_t i = 0; i < got; i++) {
                const struct weft_step *s = &steps[r][i];
                check_step(c, r, i, s, name);
                if (op_reads(s->op) && s->src == WEFT_BUF_INPUT)
                    cover_add(&rdv[r], s->src_off, s->count);
                if (op_reads(s->op) && s->src == WEFT_BUF_OUTPUT)
                    cover_add(&rdo[r], s->src_off, s->count);
                if (op_writes(s->op))
                    cover_add(&wrv[r], s->dst_off, s->count);
            }
            if (is_direct(c->coll, c->algo))
                check_direct_pieces(c, r, ch, steps[r], got, name);
            if (c->algo == WEFT_ALGO_TREE)
                check_tree_pieces(c, r, ch, steps[r], got, name);
        }
        check_matching(c, ch, steps, ns, name);
        for (int r = 0; r < n; r++) {
            free(steps[r]);
            steps[r] = NULL;
        }
    }
    for (int r = 0; r < n; r++) {
        uint64_t want =
            expected_elems(c->coll, c->algo, c->count, n, r, c->root, c->nch, c->chunk);
        EXPECT(elems[r] == want, "%s rank %d: sends %llu elements, formula %llu", name, r,
               (unsigned long long)elems[r], (unsigned long long)want);
        char what[200];
        if (c->algo == WEFT_ALGO_TREE) {
            struct cover want[3];
            memset(want, 0, sizeof(want));
            tree_expected_cover(c, r, &want[0], &want[1], &want[2]);
            snprintf(what, sizeof(what), "%s rank %d: input", name, r);
            cover_equal(&rdv[r], &want[0], what);
            snprintf(what, sizeof(what), "%s rank %d: output", name, r);
            cover_equal(&wrv[r], &want[1], what);
            snprintf(what, sizeof(what), "%s rank %d: output read", name, r);
            cover_equal(&rdo[r], &want[2], what);
            for (int j = 0; j < 3; j++)
                free(want[j].ev);
            free(rdv[r].ev);
            free(wrv[r].ev);
            free(rdo[r].ev);
            continue;
        }
        snprintf(what, sizeof(what), "%s rank %d: input", name, r);
        cover_check(&rdv[r], isz, expected_reads(c->coll, c->algo, n, r, c->root), what);
        snprintf(what, sizeof(what), "%s rank %d: output", name, r);
        cover_check(&wrv[r], osz, expected_writes(c->coll, c->algo, n, r, c->root), what);
        snprintf(what, sizeof(what), "%s rank %d: output read", name, r);
        cover_check(&rdo[r], osz, expected_out_reads(c->coll, c->algo, n, r, c->root), what);
        free(rdv[r].ev);
        free(wrv[r].ev);
        free(rdo[r].ev);
    }
    free(rdv);
    free(rdo);
    free(wrv);
    free(steps);
    free(ns);
    free(elems);
}

/* Steps all ranks of all channels would build. */
static uint64_t total_steps(const struct cfg *c)
{
    uint64_t t = 0;
    for (int ch = 0; ch < c->nch; ch++)
        for (int r = 0; r < c->n; r++) {
            struct weft_sched_args a[2];
            int na = cfg_args(c, r, ch, a);
            for (int j = 0; j < na; j++)
                t += weft_sched_max_steps(&a[j]);
        }
    return t;
}

static void sweep(int coll, int algo)
{
    static const int nchs[] = {1, 2, 3};
    unsigned long cfgs = 0, skipped = 0;
    /* Every rank talks to every rank per piece: all-to-all, direct all-reduce, AG and RS. */
    int quadratic = coll == WEFT_COLL_ALLTOALL ||
                    (is_direct(coll, algo) && coll != WEFT_COLL_BROADCAST &&
                     coll != WEFT_COLL_REDUCE);
    uint64_t budget = quadratic ? STEP_BUDGET / 4 : STEP_BUDGET;
    /* WEFT_TEST_SCHED_MAX_RANKS lowers the 64: CI's reduced AddressSanitizer pass sweeps 1..16
     * ranks (every schedule's code paths, odd counts and powers of two; a fifth of the time). */
    const char *max_env = getenv("WEFT_TEST_SCHED_MAX_RANKS");
    int max_ranks = max_env != NULL && atoi(max_env) > 0 && atoi(max_env) < 64 ? atoi(max_env) : 64;
    for (int n = 1; n <= max_ranks; n++) {
        /* Roots; for sendrecv the distance d (0: self-send). */
        int roots[3] = {0, n / 2, n - 1};
        int nroots = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE ||
                             coll == WEFT_COLL_GATHER || coll == WEFT_COLL_SCATTER ||
                             coll == WEFT_COLL_SEND
                         ? 3
                         : 1;
        for (int ri = 0; ri < nroots; ri++) {
            if (ri > 0 && roots[ri] == roots[ri - 1])
                continue;
            for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
                for (size_t hi = 0; hi < sizeof(nchs) / sizeof(nchs[0]); hi++)
                    for (size_t ki = 0; ki < sizeof(chunks) / sizeof(chunks[0]); ki++) {
                        struct cfg c = {coll, algo, n, roots[ri], nchs[hi], counts[ci],
                                        chunks[ki]};
                        if (chunks[ki] < (1u << 20) && total_steps(&c) > budget) {
                            skipped++;
                            continue;
                        }
                        run_cfg(&c);
                        cfgs++;
                    }
        }
    }
    printf("%s/%s: %lu configurations (%lu over the step budget skipped)\n",
           weft_algo_name(algo), coll == WEFT_COLL_SEND ? "SendRecv" : weft_coll_name(coll), cfgs,
           skipped);
}

/*
 * Counts past 2^31 elements and offsets past 2^32 (byte offsets past 4 GiB for any type): the same
 * structural checks, bytes formula and coverage as the sweeps, on schedules alone (no buffer is
 * allocated). Chunks as the executor's for int8 (2 MiB) and larger, so that the lists stay short.
 */
static void big(int coll, int algo)
{
    static const int ns[] = {2, 3, 5};
    static const struct {
        uint64_t count, chunk;
    } sizes[] = {
        {(1ull << 31) + 5, 1ull << 21}, /* past INT_MAX elements */
        {(1ull << 32) + 7, 1ull << 24}, /* past UINT32_MAX elements: offsets past 4 GiB */
        {(3ull << 32) + 1, UINT64_MAX}, /* one piece: counts past 2^32 in a single step */
    };
    unsigned long cfgs = 0;
    for (size_t ni = 0; ni < sizeof(ns) / sizeof(*ns); ni++)
        for (size_t si = 0; si < sizeof(sizes) / sizeof(*sizes); si++)
            for (int nch = 1; nch <= 2; nch++) {
                struct cfg c = {coll, algo, ns[ni], coll == WEFT_COLL_SEND ? 1 : ns[ni] - 1, nch,
                                sizes[si].count, sizes[si].chunk};
                run_cfg(&c);
                cfgs++;
            }
    printf("big %s/%s: %lu configurations\n", weft_algo_name(algo),
           coll == WEFT_COLL_SEND ? "SendRecv" : weft_coll_name(coll), cfgs);
}

static void misc(void)
{
    /* Channel ranges: contiguous, covering, near-equal. */
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        for (int nch = 1; nch <= 64; nch++) {
            uint64_t next = 0, lo = UINT64_MAX, hi = 0;
            for (int ch = 0; ch < nch; ch++) {
                uint64_t off, len;
                weft_sched_range(counts[ci], ch, nch, &off, &len);
                EXPECT(off == next, "range count %llu nch %d ch %d: off %llu, want %llu",
                       (unsigned long long)counts[ci], nch, ch, (unsigned long long)off,
                       (unsigned long long)next);
                next = off + len;
                lo = len < lo ? len : lo;
                hi = len > hi ? len : hi;
            }
            EXPECT(next == counts[ci] && hi - lo <= 1,
                   "range count %llu nch %d: end %llu spread %llu",
                   (unsigned long long)counts[ci], nch, (unsigned long long)next,
                   (unsigned long long)(hi - lo));
        }
    }
    uint64_t off = 1, len = 1;
    weft_sched_range(10, 3, 3, &off, &len);
    EXPECT(off == 0 && len == 0, "range of an invalid channel");

    /* Unsupported collectives and algorithms, bad arguments. */
    struct weft_step st[64];
    for (int algo = 0; algo < WEFT_ALGO_COUNT; algo++)
        for (int coll = 0; coll < WEFT_COLL_COUNT; coll++) {
            struct weft_sched_args a = {coll, algo, 100, 4, 1, 0, 0, 1, 64, NULL, NULL, 0};
            /* DIRECT has every collective (its own or RING's schedule); TREE all-reduce only. */
            int supported = algo == WEFT_ALGO_RING || algo == WEFT_ALGO_DIRECT ||
                            coll == WEFT_COLL_ALLREDUCE;
            uint64_t got = weft_sched_build(&a, st, 64);
            EXPECT(supported ? got != UINT64_MAX && got > 0 : got == UINT64_MAX,
                   "%s/%s: build returned %llu", weft_algo_name(algo), weft_coll_name(coll),
                   (unsigned long long)got);
            EXPECT(supported || weft_sched_max_steps(&a) == 0, "%s/%s: max_steps",
                   weft_algo_name(algo), weft_coll_name(coll));
        }
    struct weft_sched_args bad[] = {
        {WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 100, 0, 0, 0, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 100, 4, 4, 0, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 100, 4, 0, 0, 2, 2, 64, NULL, NULL, 0},
        {WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 100, 4, 0, 0, 0, 0, 64, NULL, NULL, 0},
        {WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 100, 4, 0, 0, 0, 1, 0, NULL, NULL, 0},
        {WEFT_COLL_BROADCAST, WEFT_ALGO_RING, 100, 4, 0, 4, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_REDUCE, WEFT_ALGO_RING, 100, 4, 0, -1, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_GATHER, WEFT_ALGO_RING, 100, 4, 0, 4, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_SCATTER, WEFT_ALGO_DIRECT, 100, 4, 0, -1, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_SEND, WEFT_ALGO_RING, 100, 4, 0, 4, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_RECV, WEFT_ALGO_DIRECT, 100, 4, 0, -1, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_ALLTOALL, WEFT_ALGO_TREE, 100, 4, 0, 0, 0, 1, 64, NULL, NULL, 0},
        {-1, WEFT_ALGO_RING, 100, 4, 0, 0, 0, 1, 64, NULL, NULL, 0},
        {WEFT_COLL_ALLREDUCE, WEFT_ALGO_COUNT, 100, 4, 0, 0, 0, 1, 64, NULL, NULL, 0},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        EXPECT(weft_sched_build(&bad[i], st, 64) == UINT64_MAX &&
                   weft_sched_max_steps(&bad[i]) == 0,
               "bad arguments %zu accepted", i);

    /* The double binary tree's shape: every n up to 1100, and around 2^11 and 2^12. */
    static const int big_trees[] = {2047, 2048, 2049, 3000, 4095, 4096};
    for (int n = 1; n <= 1100; n++)
        check_tree_shape(n);
    for (size_t i = 0; i < sizeof(big_trees) / sizeof(big_trees[0]); i++)
        check_tree_shape(big_trees[i]);

    /* The exact order for a 4-rank tree all-reduce, rank 1, one piece of 4 elements. Tree 0:
     * 3 <- 1 <- {0, 2}; tree 1 (mirrored): 0 <- 2 <- {3, 1}. Rank 1 is internal in tree 0 (depth
     * 1), a leaf in tree 1 (depth 2): up, tree 1 in slot 0, tree 0 in slot 1; down, tree 0 in
     * slot 1, tree 1 in slot 2. */
    {
        struct weft_sched_args ta = {WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE, 4, 4, 1, 0, 0, 1, 2,
                                     NULL, NULL, 0};
        static const struct weft_step want_tree[] = {
            {WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, 2, -1, 0, 2, 0, 2},
            {WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, 0, 0, 0, 0, 2},
            {WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_OUTPUT, WEFT_BUF_NONE, 0, 3, 2, 0, 0, 0, 2},
            {WEFT_STEP_RECV_COPY_SEND, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, 0, 3, 0, 0, 0, 2},
            {WEFT_STEP_SEND, WEFT_BUF_OUTPUT, WEFT_BUF_NONE, 0, 2, -1, 0, 0, 0, 2},
            {WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, 2, 0, 0, 2, 2},
        };
        memset(st, 0xff, sizeof(st));
        uint64_t tg = weft_sched_build(&ta, st, 64);
        EXPECT(tg == 6 && weft_sched_max_steps(&ta) == 6 &&
                   memcmp(st, want_tree, sizeof(want_tree)) == 0,
               "tree allreduce n 4 rank 1: %llu steps, or not in the documented order",
               (unsigned long long)tg);
        /* The root of tree 1 (rank 0) finishes with FINAL and broadcasts from its output. */
        ta.rank = 0;
        tg = weft_sched_build(&ta, st, 64);
        EXPECT(tg == 4 && st[0].op == WEFT_STEP_SEND && st[0].send_peer == 1 &&
                   st[1].op == WEFT_STEP_RECV_REDUCE_COPY && st[1].recv_peer == 2 &&
                   st[1].flags == WEFT_STEP_FINAL && st[1].src_off == 2 && st[2].op == WEFT_STEP_SEND &&
                   st[2].src == WEFT_BUF_OUTPUT && st[2].src_off == 2 && st[2].send_peer == 2 &&
                   st[3].op == WEFT_STEP_RECV && st[3].recv_peer == 1,
               "tree allreduce n 4 rank 0: %llu steps", (unsigned long long)tg);
    }

    /* Names. */
    EXPECT(strcmp(weft_coll_name(WEFT_COLL_ALLREDUCE), "AllReduce") == 0, "coll name");
    EXPECT(strcmp(weft_algo_name(WEFT_ALGO_RING), "Ring") == 0, "algo name");
    for (int i = -1; i <= WEFT_COLL_COUNT; i++)
        EXPECT(weft_coll_name(i) != NULL, "coll name %d", i);
    for (int i = -1; i <= WEFT_ALGO_COUNT; i++)
        EXPECT(weft_algo_name(i) != NULL, "algo name %d", i);

    /* The exact order for a 4-rank all-reduce, rank 1, one piece of 4 chunks of 2 elements. */
    struct weft_sched_args a = {WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 8, 4, 1, 0, 0, 1, 2,
                                NULL, NULL, 0};
    static const struct {
        int op;
        uint64_t off;
    } want[] = {
        {WEFT_STEP_SEND, 0},
        {WEFT_STEP_RECV_REDUCE_SEND, 6},
        {WEFT_STEP_RECV_REDUCE_SEND, 4},
        {WEFT_STEP_RECV_REDUCE_COPY_SEND, 2},
        {WEFT_STEP_RECV_COPY_SEND, 0},
        {WEFT_STEP_RECV_COPY_SEND, 6},
        {WEFT_STEP_RECV, 4},
    };
    uint64_t got = weft_sched_build(&a, st, 64);
    EXPECT(got == 7, "allreduce n 4: %llu steps", (unsigned long long)got);
    for (uint64_t i = 0; i < got && i < 7; i++) {
        uint64_t o = st[i].src != WEFT_BUF_NONE ? st[i].src_off : st[i].dst_off;
        EXPECT(st[i].op == want[i].op && o == want[i].off && st[i].count == 2,
               "allreduce n 4 step %llu: op %d off %llu", (unsigned long long)i, st[i].op,
               (unsigned long long)o);
    }
    EXPECT(st[3].flags == WEFT_STEP_FINAL && st[0].flags == 0, "allreduce FINAL flag");

    /* RING and DIRECT name the same schedule for the collectives that have one. */
    for (int coll = WEFT_COLL_GATHER; coll < WEFT_COLL_COUNT; coll++)
        for (int r = 0; r < 5; r++) {
            struct weft_step st2[64];
            struct weft_sched_args ring = {coll, WEFT_ALGO_RING, 13, 5, r, 2, 1, 2, 3,
                                           NULL, NULL, 0};
            struct weft_sched_args direct = ring;
            direct.algo = WEFT_ALGO_DIRECT;
            uint64_t n1 = weft_sched_build(&ring, st, 64), n2 = weft_sched_build(&direct, st2, 64);
            EXPECT(n1 == n2 && n1 != UINT64_MAX && memcmp(st, st2, n1 * sizeof(*st)) == 0,
                   "%s rank %d: RING and DIRECT differ", weft_coll_name(coll), r);
        }

    /* The exact order for a 3-rank all-to-all, rank 1, blocks of 2 elements, one piece:
     * pairwise (RING), then direct (every send, then every receive). */
    struct weft_sched_args b = {WEFT_COLL_ALLTOALL, WEFT_ALGO_RING, 2, 3, 1, 0, 0, 1, 2,
                                NULL, NULL, 0};
    static const struct weft_step want_a2a[] = {
        {WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1, 0, 2, 2, 2},
        {WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, 2, -1, 0, 4, 0, 2},
        {WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, 0, 0, 0, 0, 2},
        {WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, 0, -1, 0, 0, 0, 2},
        {WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, 2, 0, 0, 4, 2},
    };
    got = weft_sched_build(&b, st, 64);
    EXPECT(got == 5 && memcmp(st, want_a2a, sizeof(want_a2a)) == 0,
           "alltoall n 3 rank 1: %llu steps, or not in pairwise order", (unsigned long long)got);
    b.algo = WEFT_ALGO_DIRECT;
    const struct weft_step want_a2a_direct[] = {want_a2a[0], want_a2a[1], want_a2a[3], want_a2a[2],
                                                want_a2a[4]};
    got = weft_sched_build(&b, st, 64);
    EXPECT(got == 5 && memcmp(st, want_a2a_direct, sizeof(want_a2a_direct)) == 0,
           "direct alltoall n 3 rank 1: %llu steps, or not sends first", (unsigned long long)got);

    /* The exact order for a 3-rank direct all-reduce, rank 1, two pieces of 2 elements. */
    struct weft_sched_args d = {WEFT_COLL_ALLREDUCE, WEFT_ALGO_DIRECT, 4, 3, 1, 0, 0, 1, 2,
                                NULL, NULL, 0};
    struct weft_step want_ar[12];
    for (int p = 0; p < 2; p++) {
        struct weft_step *w = &want_ar[6 * p];
        uint64_t e = 2 * (uint64_t)p;
        for (int k = 0; k < 3; k++) /* to 2, 0, then itself */
            w[k] = (struct weft_step){WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, (2 + k) % 3,
                                      -1, 0, e, 0, 2};
        w[3] = (struct weft_step){WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, 0, 0, 0,
                                  e, 2};
        w[4] = (struct weft_step){WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_OUTPUT, WEFT_BUF_OUTPUT, 0,
                                  -1, 1, 0, e, e, 2};
        w[5] = (struct weft_step){WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_OUTPUT, WEFT_BUF_OUTPUT,
                                  WEFT_STEP_FINAL, -1, 2, 0, e, e, 2};
    }
    memset(st, 0xff, sizeof(st));
    got = weft_sched_build(&d, st, 64);
    EXPECT(got == 12 && weft_sched_max_steps(&d) == 12 &&
               memcmp(st, want_ar, sizeof(want_ar)) == 0,
           "direct allreduce n 3 rank 1: %llu steps, or not in the documented order",
           (unsigned long long)got);
    /* One rank: a COPY FINAL per piece. */
    d.nranks = 1;
    d.rank = 0;
    got = weft_sched_build(&d, st, 64);
    EXPECT(got == 2 && st[0].op == WEFT_STEP_COPY && st[0].flags == WEFT_STEP_FINAL &&
               st[1].src_off == 2 && st[1].dst_off == 2 && st[1].count == 2,
           "direct allreduce n 1: %llu steps", (unsigned long long)got);
}

int main(int argc, char **argv)
{
    /* "allreduce" runs both allreduce-ring and allreduce-direct (a name selects the entries it
     * equals or that it prefixes up to a '-'). RING and DIRECT share the schedules of all-to-all,
     * gather, scatter and send/recv. */
    static const struct {
        const char *name;
        int coll, algo;
    } tests[] = {
        {"allreduce-ring", WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING},
        {"allreduce-direct", WEFT_COLL_ALLREDUCE, WEFT_ALGO_DIRECT},
        {"allreduce-tree", WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE},
        {"allgather-ring", WEFT_COLL_ALLGATHER, WEFT_ALGO_RING},
        {"allgather-direct", WEFT_COLL_ALLGATHER, WEFT_ALGO_DIRECT},
        {"reducescatter-ring", WEFT_COLL_REDUCESCATTER, WEFT_ALGO_RING},
        {"reducescatter-direct", WEFT_COLL_REDUCESCATTER, WEFT_ALGO_DIRECT},
        {"broadcast-ring", WEFT_COLL_BROADCAST, WEFT_ALGO_RING},
        {"broadcast-direct", WEFT_COLL_BROADCAST, WEFT_ALGO_DIRECT},
        {"reduce-ring", WEFT_COLL_REDUCE, WEFT_ALGO_RING},
        {"reduce-direct", WEFT_COLL_REDUCE, WEFT_ALGO_DIRECT},
        {"alltoall", WEFT_COLL_ALLTOALL, WEFT_ALGO_RING},
        {"gather", WEFT_COLL_GATHER, WEFT_ALGO_RING},
        {"scatter", WEFT_COLL_SCATTER, WEFT_ALGO_RING},
        {"sendrecv", WEFT_COLL_SEND, WEFT_ALGO_RING},
    };
    const char *which = argc > 1 ? argv[1] : NULL;
    int ran = 0;
#ifdef __GLIBC__
    /* A sweep mallocs and frees gigabytes in small blocks; by default glibc hands the heap top
     * back to the kernel after every configuration and faults it in again (a third of the run). */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    if (which == NULL || strcmp(which, "misc") == 0) {
        misc();
        ran = 1;
    }
    /* big[-NAME]: the big counts, for every test whose name NAME selects as above */
    if (which != NULL && strncmp(which, "big", 3) == 0 && (which[3] == '\0' || which[3] == '-')) {
        const char *sub = which[3] == '-' ? which + 4 : NULL;
        size_t sl = sub != NULL ? strlen(sub) : 0;
        for (size_t t = 0; t < sizeof(tests) / sizeof(tests[0]); t++) {
            const char *tn = tests[t].name;
            if (sub == NULL || strcmp(sub, tn) == 0 ||
                (strncmp(sub, tn, sl) == 0 && tn[sl] == '-')) {
                big(tests[t].coll, tests[t].algo);
                ran = 1;
            }
        }
        printf("%lu passed, %lu failed\n", npass, nfail);
        return ran && nfail == 0 ? 0 : 1;
    }
    for (size_t t = 0; t < sizeof(tests) / sizeof(tests[0]); t++) {
        const char *tn = tests[t].name;
        size_t wl = which != NULL ? strlen(which) : 0;
        if (which == NULL || strcmp(which, tn) == 0 ||
            (strncmp(which, tn, wl) == 0 && tn[wl] == '-')) {
            sweep(tests[t].coll, tests[t].algo);
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
