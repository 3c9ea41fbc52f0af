/*
 * Schedule generators (see sched.h for the step semantics).
 *
 * Notation: n ranks, rank r, "r-k" is (r - k) mod n, next = r+1, prev = r-1. Every generator works
 * on the channel's range [off, off+len) of a block (weft_sched_range) and cuts it into pieces; the
 * whole per-piece pattern repeats for each piece, so that no step exceeds args.chunk elements and
 * no rank runs more than one step ahead of the data it has received (sending all pieces of a block
 * before receiving would fill every FIFO of the ring at once and deadlock). Chunks that come out
 * empty (a piece smaller than n) yield no step on any rank, so sends and receives stay matched.
 * Only reduction results carry WEFT_STEP_FINAL; the copies of all-gather and broadcast do not.
 *
 * RING ORDER: rings and chains (ring all-reduce, all-gather, reduce-scatter, chain broadcast and
 * reduce) run on ring positions when args.ring is set (weft_sched_ring_order: hosts in order of
 * their lowest rank, a host's ranks in rank order, so the ring leaves each host once): below, r,
 * next, prev and the chain positions are positions, mapped to ranks for the peers; all-gather and
 * reduce-scatter blocks stay rank-indexed (block of the rank at position r-k), so results keep the
 * rank layout. All-reduce chunks are indexed by position (any index every rank agrees on works).
 *
 * HIER ALLREDUCE (H = n/k hosts of k = local_ranks ranks; ring position h*k + l is local index l
 * on host h; k == 1 or H == 1: the ring all-reduce). Pieces of n*chunk elements; piece P is cut
 * into k shards (sched_split), shard s into H parts: cell (s, c), at most chunk elements.
 *   1. for each part c: ring reduce-scatter among the host's k ranks over cells (., c):
 *      SEND input cell (l-1, c); RECV_REDUCE_SEND input cells (l-j, c), j = 2 .. k-1;
 *      RECV_REDUCE_COPY input cell (l, c) -> output (not FINAL: shard l reduced over the host).
 *   2. ring all-reduce (the RING ALLREDUCE piece pattern, H members, chunk index h) of shard l
 *      among the ranks of local index l on every host, reducing with the output (src OUTPUT:
 *      no pre-multiplication again); FINAL on cell (l, h) as in the ring.
 *   3. for each part c: ring all-gather among the host's ranks: SEND output cell (l, c);
 *      RECV_COPY_SEND output cells (l-j, c), j = 1 .. k-2; RECV output cell (l+1, c).
 *   In place works: input cell (l, c) is read last in phase 1, by the step that overwrites it,
 *   and phase 3 writes only cells phase 1 has consumed. Bytes sent per piece: (k-1)/k P inside
 *   the host twice, and 2(H-1)/H P/k across hosts (so a host's NIC carries 2(H-1)/H P, the
 *   host-order ring 2(n-1)/n P); exact: every cell but shard l's and but shard l+1's, plus
 *   2 size(shard l) - size(cell (l, h)) - size(cell (l, h+1)).
 *   No deadlock with FIFOs of two chunks: each phase is a set of disjoint rings (intra-host
 *   connections for 1 and 3, inter-host for 2), each running the ring pattern, in which a
 *   message sent at round t is received at round t+1 of the same ring. Order every rank's steps
 *   by (piece, phase, part, round); all ranks run the same sequence. Take the blocked rank whose
 *   position is least. A blocked RECV waits for a sender at an earlier position (contradiction);
 *   a blocked SEND finds the FIFO full, but the receiver, at a position not earlier, has taken
 *   every message sent before the previous round, so at most one chunk is queued. The simulator
 *   checks it at the executor's chunk (two chunks per FIFO) for 14 host shapes up to 8x8.
 *   The H part rings run one after the other (a ring's ranks finish together), so the phases
 *   inside a host cost H(k-1) latencies each: hier wins where NIC bytes or inter-host latency
 *   dominate, not on intra-host latency (see cost.h).
 *
 * RING ALLREDUCE (pieces of n*chunk elements; piece P is cut into n chunks, chunk c of
 * P/n + (c < P%n) elements at c*(P/n) + min(c, P%n), identical on every rank):
 *     SEND                  chunk r-1        input -> next
 *     RECV_REDUCE_SEND      chunks r-2 .. r-(n-1)       (n-2 steps)
 *     RECV_REDUCE_COPY_SEND chunk r          FINAL, input + recv -> output, next
 *     RECV_COPY_SEND        chunks r-1 .. r-(n-2)       (n-2 steps)
 *     RECV                  chunk r+1        -> output
 *   Bytes sent per piece: 2P - size(chunk r) - size(chunk r+1). n == 1: COPY FINAL per chunk.
 * RING ALLGATHER (count = block; pieces of chunk elements of the block's channel range, at po):
 *     SEND input[po] -> next; COPY input[po] -> output[r*count+po];
 *     RECV_COPY_SEND output[(r-k)*count+po] for k = 1 .. n-2; RECV output[(r+1)*count+po].
 *   n == 1: COPY only. Bytes sent: (n-1) * count.
 * RING REDUCESCATTER (count = output block; input holds n blocks; pieces of chunk elements):
 *     SEND input[(r-1)*count+po]; RECV_REDUCE_SEND input[(r-k)*count+po] for k = 2 .. n-1;
 *     RECV_REDUCE_COPY FINAL input[r*count+po] -> output[po].
 *   n == 1: COPY FINAL. Bytes sent: (n-1) * count.
 * CHAIN BROADCAST root -> root+1 -> ... -> root-1 (position p = r - root mod n), per piece:
 *     p == 0: SEND input, then COPY input -> output (skipped by the executor when in place);
 *     0 < p < n-1: RECV_COPY_SEND -> output; p == n-1: RECV -> output.
 *   n == 1: COPY. Bytes sent: count, except 0 for the last rank of the chain.
 * CHAIN REDUCE root+1 -> root+2 -> ... -> root (position p = r - root - 1 mod n), per piece:
 *     p == 0: SEND input; 0 < p < n-1: RECV_REDUCE_SEND input; root: RECV_REDUCE_COPY FINAL.
 *   n == 1: COPY FINAL. Bytes sent: count, except 0 for the root.
 *
 * The collectives below carry no reduction and use only SEND, RECV and COPY. Algorithms RING and
 * DIRECT both select them (there is one schedule for each; the algorithm does not change it).
 * Pieces are chunk elements of the block's channel range, at po, e = off + po; "block j" of a
 * buffer of n blocks starts at element j*count.
 * SEND (peer = root): SEND input[e] -> peer per piece; RECV (peer = root): RECV output[e] <- peer.
 *   The peer may be the rank itself (the executor loops back). Bytes sent: count for SEND.
 * PAIRWISE ALLTOALL (input and output hold n blocks; block j of the input goes to rank j, block i
 * of the output comes from rank i), per piece, for k = 0 .. n-1:
 *     k == 0: COPY input[r*count+e] -> output[r*count+e];
 *     k > 0:  SEND input[(r+k)*count+e] -> r+k, then RECV output[(r-k)*count+e] <- r-k.
 *   Bytes sent: (n-1) * count. No deadlock with FIFOs of two chunks, writing position (P, k) for
 *   piece P, round k, ordered lexicographically:
 *   - a SEND never waits for its receiver to act: the message a -> b at (P, k) is received by b at
 *     the same position (b receives from b-k = a there). Before a reaches piece P it has finished
 *     piece P-1, so it has received b's message of piece P-1; b sent that only after finishing
 *     piece P-2, so b has consumed a's messages up to piece P-2. At most the messages of pieces P-1
 *     and P (two chunks) are in a's FIFO to b, which holds two chunks.
 *   - so only RECVs wait. A RECV of a at (P, k) waits for a-k to post its SEND at (P, k); if a-k is
 *     blocked too, it waits at a RECV before that SEND, at a position strictly before (P, k) (at
 *     (P, k) itself its SEND is done). A wait chain strictly decreases in (P, k), so it is finite
 *     and ends at a rank that can move: some rank always progresses.
 * DIRECT ALLTOALL (small blocks): the same steps as pairwise, reordered per piece: COPY, then every
 *   SEND (k = 1 .. n-1), then every RECV (k = 1 .. n-1). A rank posts all its blocks at once, so
 *   each rank has to run twice per operation instead of once per round: with more ranks than
 *   cores, every round of the pairwise order costs a context switch. No deadlock, by the pairwise
 *   argument: a SEND at piece P finds at most the piece P-1 message still in the FIFO (the
 *   receiver has finished piece P-2, whose RECVs took it), so it never waits; a RECV of a at
 *   piece P from b waits only until b posts its SENDs of P, which come before any step of b at P
 *   that can wait, so a wait chain moves strictly back in P and is finite.
 *   In place (input == output) this order needs no copy of the input: every block of piece P is
 *   sent (copied into a slot) before any RECV writes piece P, and pieces are disjoint; the host
 *   executor takes it for every in-place all-to-all. Ranks may mix it with the pairwise order
 *   (one in place, another not): each connection carries one message per piece in both, SENDs
 *   still never wait, and a RECV at P waits for a pairwise rank only at a position of P before
 *   its SEND to us (then back along the pairwise chain) or for a rank at an earlier piece, never
 *   for a direct rank at P (it sent everything of P first): the chain is finite.
 * DIRECT ALLREDUCE (one-shot, for small messages: one message latency instead of 2(n-1)), per
 * piece of chunk elements at e:
 *     SEND input[e] -> r+1, ..., r+n-1, then r (itself, through the loopback connection: last,
 *     so that the peers' messages leave first, and the loopback's work overlaps their latency);
 *     RECV output[e] <- 0; RECV_REDUCE_COPY output <- p (src OUTPUT) for p = 1 .. n-1, the last
 *     FINAL. Every rank adds the contributions in rank order, so all ranks get the same bits; the
 *     rank's own input goes through the loopback so that in place works (output is written before
 *     the rank's own turn). The reduction is "received OP accumulated", which equals
 *     "accumulated OP received" bit for bit since every NCCL operator is commutative.
 *   n == 1: COPY FINAL. Bytes sent: n * count (n-1 to peers plus the loopback). No deadlock for
 *   the reason pairwise all-to-all has none: per piece every connection carries one message.
 * DET ALLREDUCE (two-shot, rank order: WEFT_DETERMINISTIC). Pieces of n*chunk elements of the
 * channel range (ring_piece), piece P cut into n chunks as the ring cuts it; chunk q is rank q's:
 *     SEND input chunk q -> q for q = r, r+1, ..., r+n-1 (chunk r through the loopback);
 *     RECV output chunk r <- 0; RECV_REDUCE_COPY output chunk r <- q (src OUTPUT) for
 *       q = 1 .. n-1, the last FINAL (direct reduce-scatter of the piece);
 *     SEND output chunk r -> r+1, ..., r+n-1 (src OUTPUT); RECV output chunk q <- q for
 *       q = r-1, r-2, ..., r+1 (direct all-gather).
 *   Every element is reduced by one rank as ((x0 op x1) op x2) ... op x(n-1), as DIRECT ALLREDUCE
 *   reduces it, so the result does not depend on the channels, the pieces, the protocol or which
 *   of the two schedules ran: the bits are a function of the inputs and n alone. In place works as
 *   in DIRECT ALLREDUCE (every input chunk of the piece is sent before any output is written).
 *   n == 1: COPY FINAL. Bytes sent per piece: P (n-1 to peers plus the loopback) + (n-1) size(r).
 *   No deadlock with FIFOs of two chunks: per piece a connection a -> b carries two messages
 *   (phase 1 chunk b, phase 2 chunk a). When a posts its phase-1 message of P it has received
 *   b's phase-2 message of P-1, which b sent after consuming a's phase-1 message of P-1; when it
 *   posts the phase-2 one it has received b's phase-1 message of P, so b is done with P-1. At
 *   most two messages wait in the FIFO, so SENDs never wait, and a RECV waits for a SEND that
 *   comes after a strictly earlier step of its rank: wait chains are finite.
 * DIRECT BROADCAST (small messages: one hop instead of a chain of n-1), per piece at e:
 *     root: SEND input[e] -> every p != root (in order root+1, root+2, ...), then COPY -> output;
 *     others: RECV output[e] <- root. n == 1: COPY. Bytes sent: (n-1) * count at the root.
 * DIRECT REDUCE: like DIRECT ALLREDUCE, but only the root receives: every rank SENDs input[e] to
 *     the root (the root through its loopback); the root RECVs from 0, then RECV_REDUCE_COPY from
 *     1 .. n-1 (src OUTPUT, the last FINAL). n == 1: COPY FINAL. Bytes sent: count per rank.
 * DIRECT ALLGATHER, per piece at e: SEND input[e] -> r+1, ..., r+n-1; COPY input[e] ->
 *     output[r*count+e]; RECV output[p*count+e] <- p for p = r-1, r-2, ..., r+1. Bytes sent:
 *     (n-1) * count. Deadlock-free for the all-to-all reason (one message per connection per piece).
 * DIRECT REDUCESCATTER (input holds n blocks), per piece at e: SEND input[p*count+e] -> p for
 *     p = r+1, ..., r+n-1, then r (block r through the loopback, last as in DIRECT ALLREDUCE but
 *     before anything is written, so in place works); RECV output[e] <- 0; RECV_REDUCE_COPY output[e] <- p (src OUTPUT) for p = 1 .. n-1,
 *     the last FINAL: the same rank-order sum on every rank. Bytes sent: n * count.
 * DIRECT GATHER (output at the root holds n blocks): non-root: SEND input[e] -> root per piece;
 *     root: COPY input[e] -> output[root*count+e] per piece, then for each p != root in rank order,
 *     each piece, RECV output[p*count+e] <- p. Bytes sent: count, 0 for the root.
 * DIRECT SCATTER (input at the root holds n blocks): root: for each p != root in rank order, each
 *     piece, SEND input[p*count+e] -> p; then COPY input[root*count+e] -> output[e] per piece;
 *     non-root: RECV output[e] <- root per piece. Bytes sent: (n-1) * count at the root, 0 others.
 *   Gather and scatter cannot deadlock: only the root talks to several peers, and a non-root rank
 *   waits for nothing but the root's progress on the single connection they share.
 *
 * TREE ALLREDUCE (double binary tree). Tree positions are 1..n; lowbit(p) = p & -p. The root is
 * R, the largest power of two <= n; p with lowbit b >= 2 has the left child p - b/2 and the right
 * child p + c for the largest power of two c < b with p + c <= n (none if p == n); odd p are leaves.
 * Every p != R has exactly one parent: p + lowbit(p) when p/lowbit(p) = 1 mod 4 and that is <= n,
 * else p - lowbit(p); lowbits double going up, so the depth is floor(log2 n). The tree is in
 * order (left subtree < p < right subtree), so low levels join neighbouring ranks (on a host).
 * Tree 0 puts rank r at position r+1; tree 1 mirrors it for even n (r at n - r) and shifts it for
 * odd n (r at (r+1) mod n + 1). Internal nodes are the even positions: the odd ranks in tree 0,
 * the even ranks in tree 1 (odd n: but n-1), so no rank is internal in both (for even n each rank
 * is internal in exactly one) and every rank forwards about as many bytes as every other. The
 * mirror keeps tree 1 aligned, as tree 0 is, with blocks of consecutive ranks (a host's, usually),
 * where the shift cuts every block apart: with hosts of 8 ranks a host's NIC sends 6 halves per
 * piece instead of 10 (weft-scale, 64 ranks, 16 MiB, 25 GB/s between hosts: 2065 us, not 3397).
 * Piece P (2*chunk elements; one piece of len when chunk >= ceil(len/2)) is cut into halves
 * h0 = ceil(P/2), h1 = floor(P/2) at o0 = 0, o1 = h0: tree t carries half t. A piece of at most
 * min(chunk, WEFT_SCHED_TREE_ONE_MAX) elements goes whole over tree 0 (h0 = P, h1 = 0): where
 * latency rules, a second tree only doubles the messages (a rank sends 4 instead of 1 to 3).
 * Per half at e, rank with parent p, children c0 (c1):
 *   up:   leaf: SEND input[e] -> p;
 *         one child: RECV_REDUCE_SEND c0 + input -> p (root: RECV_REDUCE_COPY FINAL -> output);
 *         two children: RECV_REDUCE_COPY c0 + input -> output, then RECV_REDUCE_SEND c1 + output
 *         -> p (root: RECV_REDUCE_COPY FINAL c1 + output -> output);
 *   down: root: SEND output -> c0, SEND output -> c1; leaf: RECV output <- p; others:
 *         RECV_COPY_SEND output <- p -> c0, then SEND output -> c1 when there is a c1.
 * Order: slots. D = floor(log2 n) is the depth of both trees and depth_t(r) the edges from r to
 * the root of tree t. Piece P of tree t runs in slot P + D - depth_t(r) in the up phase (a rank
 * sends a piece up one slot before its parent takes it) and in slot P + depth_t(r) in the down
 * phase (a child takes it one slot after its parent sends it). The rank runs every up step slot
 * by slot, then every down step slot by slot; within a slot up runs first the tree the rank is a
 * leaf in (tree 0 when it is a leaf in both), down first the tree it is internal in (tree 0 when
 * internal in neither), so that it forwards before it takes its own copy. Both halves run in the
 * one lane of the channel (two channels would halve the channels the host can use for ranges and
 * tie tree t to channel parity), and the lane is serial: a rank's steps of the two trees wait for
 * each other. Ordered piece by piece instead (both trees' steps of piece P, then of P+1), a
 * rank's leaf step of piece P+1 waits for its internal steps of piece P, which wait for its
 * children's internal steps of piece P in the other tree, and so on down: every piece crosses the
 * whole depth before the next can start, and the time grows with depth x bytes (weft-scale, 64
 * ranks, 16 MiB, 2 us and 25 GB/s links: 6428 us, 4.8 times the 1342 us of 2 x 16 MiB / 25 GB/s).
 * With slots a step waits only for steps of the slot before, so the pieces pipeline through the
 * depth once per phase (1432 us there). Overlapping the broadcast of one piece with the reduction
 * of a later one would not shorten any rank's serial work.
 * All ranks get the root's bits: the root computes every element once (FINAL: integer avg divides
 * there) and the broadcast copies it. n == 1: COPY FINAL per half. Steps per half and tree, k
 * children: up max(k, 1), down k at the root, max(k, 1) elsewhere. Bytes sent: h0 * deg0 + h1 *
 * deg1 summed over the pieces, deg_t = children plus parent of the rank in tree t.
 *   No deadlock with FIFOs that hold two chunks (ours do). Give each message the slot its sender
 *   sends it in, counting the down phase's slots after all of the up phase's: it is taken in the
 *   next slot, and every rank runs its steps in slot order. A connection a -> b carries one
 *   message per slot at most: up it is used by the tree in which a is b's child, down by the one
 *   in which b is a's child, and a is b's child in one tree at most, since |b - a| would be the
 *   lowbit of a's position in both, a+1 in tree 0 and n-a (even n) or a+2 (odd n) in tree 1, one
 *   odd and one even (the wrapped rank n-1 stands at a leaf of tree 1); so both ends order its
 *   messages alike, one per piece in consecutive slots of a phase. Suppose every unfinished rank
 *   is blocked, and take one, a, whose current step has the smallest slot S:
 *   - a receive from x is blocked: x has not sent its message of slot S-1, so x is unfinished and
 *     blocked at a slot <= S-1 < S;
 *   - a send to b is blocked: b's FIFO from a is full, so it holds slices of two earlier messages
 *     of that connection (a message fills at most half the FIFO, and the one a is sending is not
 *     complete), the older from slot S-2 or before, which b takes in slot S-1 or before: b is
 *     blocked at a slot < S.
 *   Either way some blocked rank is at a slot below the smallest: impossible, so some rank always
 *   progresses.
 */
#include "algo/sched.h"

/*
 * The CUDA executor includes this file into its kernel (kernels/coll_kernel.cu) with
 * WEFT_SCHED_FN set to nvcc's __host__ __device__ and WEFT_SCHED_DEVICE defined, so the kernel
 * computes its steps with this very code; the parts only the host needs are left out there.
 */
#ifndef WEFT_SCHED_FN
#define WEFT_SCHED_FN
#endif

struct sched_out {
    struct weft_step *steps;
    uint64_t max;
    uint64_t n;     /* steps produced so far (may exceed max: then the caller reports overflow) */
    uint64_t first; /* steps before this index are counted, not stored (windowed builds) */
};

WEFT_SCHED_FN
static void sched_emit(struct sched_out *o, int op, int src, int dst, int flags, int send_peer,
                       int recv_peer, uint64_t src_off, uint64_t dst_off, uint64_t count)
{
    if (count == 0)
        return;
    if (o->n >= o->first && o->n - o->first < o->max) {
        struct weft_step *s = &o->steps[o->n - o->first];
        s->op = (uint8_t)op;
        s->src = (uint8_t)src;
        s->dst = (uint8_t)dst;
        s->flags = (uint8_t)flags;
        s->send_peer = send_peer;
        s->recv_peer = recv_peer;
        s->pad = 0;
        s->src_off = src_off;
        s->dst_off = dst_off;
        s->count = count;
    }
    o->n++;
}

/* Part i of `parts` near-equal contiguous parts of `total` (the first total % parts get one
 * element more). */
WEFT_SCHED_FN
static void sched_split(uint64_t total, uint64_t parts, uint64_t i, uint64_t *off, uint64_t *len)
{
    uint64_t base = total / parts, rem = total % parts;
    *off = i * base + (i < rem ? i : rem);
    *len = base + (i < rem ? 1 : 0);
}

WEFT_SCHED_FN
static inline int sched_mod(int a, int n)
{
    a %= n;
    return a < 0 ? a + n : a;
}

WEFT_SCHED_FN
static inline uint64_t sched_min(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

WEFT_SCHED_FN
static inline uint64_t sched_div_up(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

WEFT_SCHED_FN
void weft_sched_range(uint64_t count, int channel, int nchannels, uint64_t *off, uint64_t *len)
{
    if (nchannels < 1 || channel < 0 || channel >= nchannels) {
        *off = 0;
        *len = 0;
        return;
    }
    sched_split(count, (uint64_t)nchannels, (uint64_t)channel, off, len);
}

/* Elements per all-reduce piece: n*chunk, or the whole range when that would not be smaller. */
WEFT_SCHED_FN
static uint64_t ring_piece(uint64_t len, int n, uint64_t chunk)
{
    if (chunk > len / (uint64_t)n)
        return len > 0 ? len : 1;
    return (uint64_t)n * chunk;
}

/* Rank at ring position pos, and ring position of rank (the identity without a ring order). */
WEFT_SCHED_FN
static inline int sched_rank_at(const struct weft_sched_args *a, int pos)
{
    return a->ring != NULL ? a->ring[pos] : pos;
}

WEFT_SCHED_FN
static inline int sched_pos_of(const struct weft_sched_args *a, int rank)
{
    return a->ring != NULL ? a->ring_pos[rank] : rank;
}

/* One ring all-reduce piece of psize elements at base among n ring members (this one at position
 * r): the reduce steps combine with src (the input, or the output a previous phase wrote). */
WEFT_SCHED_FN
static void ring_allreduce_piece(struct sched_out *o, int n, int r, int next, int prev, int src,
                                 uint64_t base, uint64_t psize)
{
    uint64_t co, cl;
    sched_split(psize, (uint64_t)n, (uint64_t)sched_mod(r - 1, n), &co, &cl);
    sched_emit(o, WEFT_STEP_SEND, src, WEFT_BUF_NONE, 0, next, -1, base + co, 0, cl);
    for (int k = 2; k < n; k++) {
        sched_split(psize, (uint64_t)n, (uint64_t)sched_mod(r - k, n), &co, &cl);
        sched_emit(o, WEFT_STEP_RECV_REDUCE_SEND, src, WEFT_BUF_NONE, 0, next, prev, base + co, 0,
                   cl);
    }
    sched_split(psize, (uint64_t)n, (uint64_t)r, &co, &cl);
    sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY_SEND, src, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, next,
               prev, base + co, base + co, cl);
    for (int k = 1; k < n - 1; k++) {
        sched_split(psize, (uint64_t)n, (uint64_t)sched_mod(r - k, n), &co, &cl);
        sched_emit(o, WEFT_STEP_RECV_COPY_SEND, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, next, prev, 0,
                   base + co, cl);
    }
    sched_split(psize, (uint64_t)n, (uint64_t)sched_mod(r + 1, n), &co, &cl);
    sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, prev, 0, base + co, cl);
}

WEFT_SCHED_FN
static void ring_allreduce(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = sched_pos_of(a, a->rank);
    int next = sched_rank_at(a, sched_mod(r + 1, n)), prev = sched_rank_at(a, sched_mod(r - 1, n));
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    if (n == 1) {
        for (uint64_t po = 0; po < len; po += a->chunk) {
            uint64_t c = sched_min(a->chunk, len - po);
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, -1, -1,
                       off + po, off + po, c);
        }
        return;
    }
    uint64_t piece = ring_piece(len, n, a->chunk);
    for (uint64_t po = 0; po < len; po += piece)
        ring_allreduce_piece(o, n, r, next, prev, WEFT_BUF_INPUT, off + po,
                             sched_min(piece, len - po));
}

/* Cell (s, c) of a hierarchical piece of psize elements: shard s of k, part c of H in it. */
WEFT_SCHED_FN
static void hier_cell(uint64_t psize, int k, int H, int s, int c, uint64_t *off, uint64_t *len)
{
    uint64_t so, sl, co;
    sched_split(psize, (uint64_t)k, (uint64_t)s, &so, &sl);
    sched_split(sl, (uint64_t)H, (uint64_t)c, &co, len);
    *off = so + co;
}

WEFT_SCHED_FN
static void hier_allreduce(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, k = a->local_ranks > 1 ? a->local_ranks : 1, H = n / k;
    if (k == 1 || H == 1) {
        ring_allreduce(a, o);
        return;
    }
    int pos = sched_pos_of(a, a->rank), h = pos / k, l = pos % k;
    int lnext = sched_rank_at(a, h * k + sched_mod(l + 1, k));
    int lprev = sched_rank_at(a, h * k + sched_mod(l - 1, k));
    int xnext = sched_rank_at(a, sched_mod(h + 1, H) * k + l);
    int xprev = sched_rank_at(a, sched_mod(h - 1, H) * k + l);
    uint64_t off, len, co, cl;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    uint64_t piece = ring_piece(len, n, a->chunk);
    for (uint64_t po = 0; po < len; po += piece) {
        uint64_t psize = sched_min(piece, len - po), base = off + po;
        /* 1: reduce-scatter inside the host, one ring per part c; shard l ends in the output. */
        for (int c = 0; c < H; c++) {
            hier_cell(psize, k, H, sched_mod(l - 1, k), c, &co, &cl);
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, lnext, -1, base + co,
                       0, cl);
            for (int j = 2; j < k; j++) {
                hier_cell(psize, k, H, sched_mod(l - j, k), c, &co, &cl);
                sched_emit(o, WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, lnext,
                           lprev, base + co, 0, cl);
            }
            hier_cell(psize, k, H, l, c, &co, &cl);
            sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1,
                       lprev, base + co, base + co, cl);
        }
        /* 2: all-reduce of shard l across hosts, a ring of the ranks with local index l. */
        uint64_t so, sl;
        sched_split(psize, (uint64_t)k, (uint64_t)l, &so, &sl);
        ring_allreduce_piece(o, H, h, xnext, xprev, WEFT_BUF_OUTPUT, base + so, sl);
        /* 3: all-gather inside the host, one ring per part c. */
        for (int c = 0; c < H; c++) {
            hier_cell(psize, k, H, l, c, &co, &cl);
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_OUTPUT, WEFT_BUF_NONE, 0, lnext, -1, base + co,
                       0, cl);
            for (int j = 1; j < k - 1; j++) {
                hier_cell(psize, k, H, sched_mod(l - j, k), c, &co, &cl);
                sched_emit(o, WEFT_STEP_RECV_COPY_SEND, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, lnext,
                           lprev, 0, base + co, cl);
            }
            hier_cell(psize, k, H, sched_mod(l + 1, k), c, &co, &cl);
            sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, lprev, 0,
                       base + co, cl);
        }
    }
}

/* Tree positions are 1-based; see the block comment. */
WEFT_SCHED_FN
static inline int tree_pos(int n, int tree, int r)
{
    return tree == 0 ? r + 1 : n % 2 == 0 ? n - r : (r + 1) % n + 1;
}

WEFT_SCHED_FN
static inline int tree_rank(int n, int tree, int p)
{
    return tree == 0 ? p - 1 : n % 2 == 0 ? n - p : sched_mod(p - 2, n);
}

WEFT_SCHED_FN
void weft_sched_tree(int nranks, int tree, int rank, int *parent_p, int *child0_p, int *child1_p)
{
    int n = nranks, p = tree_pos(n, tree, rank), b = p & -p, root = 1;
    int parent = -1, c0 = -1, c1 = -1;
    while (2 * root <= n)
        root *= 2;
    if (p != root)
        parent = (p / b) % 4 == 1 && p + b <= n ? p + b : p - b;
    if (b >= 2) {
        c0 = p - b / 2;
        for (int c = b / 2; c >= 1 && c1 < 0; c /= 2)
            if (p + c <= n)
                c1 = p + c;
    }
    *parent_p = parent > 0 ? tree_rank(n, tree, parent) : -1;
    *child0_p = c0 > 0 ? tree_rank(n, tree, c0) : -1;
    *child1_p = c1 > 0 ? tree_rank(n, tree, c1) : -1;
}

/* Elements per tree piece: two halves of at most chunk, or the whole range when that fits. */
WEFT_SCHED_FN
static uint64_t tree_piece(uint64_t len, uint64_t chunk)
{
    if (chunk >= len - len / 2)
        return len > 0 ? len : 1;
    return 2 * chunk;
}

/* Pieces of at most this many elements go whole over tree 0. */
WEFT_SCHED_FN
static uint64_t tree_one_max(uint64_t chunk)
{
    return chunk < WEFT_SCHED_TREE_ONE_MAX ? chunk : WEFT_SCHED_TREE_ONE_MAX;
}

/* Half k of a piece of p elements: ceil and floor of p/2, or all of it on tree 0 for small p. */
WEFT_SCHED_FN
static void tree_half(uint64_t p, uint64_t chunk, int k, uint64_t *off, uint64_t *len)
{
    if (p <= tree_one_max(chunk)) {
        *off = k == 0 ? 0 : p;
        *len = k == 0 ? p : 0;
        return;
    }
    sched_split(p, 2, (uint64_t)k, off, len);
}

struct tree_node {
    int parent, c0, c1;
};

WEFT_SCHED_FN
static void tree_up(struct sched_out *o, const struct tree_node *t, uint64_t e, uint64_t c)
{
    int root = t->parent < 0;
    if (t->c0 < 0) {
        sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, t->parent, -1, e, 0, c);
        return;
    }
    if (t->c1 < 0) {
        if (root)
            sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT,
                       WEFT_STEP_FINAL, -1, t->c0, e, e, c);
        else
            sched_emit(o, WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, t->parent,
                       t->c0, e, 0, c);
        return;
    }
    sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, t->c0, e, e,
               c);
    if (root)
        sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_OUTPUT, WEFT_BUF_OUTPUT,
                   WEFT_STEP_FINAL, -1, t->c1, e, e, c);
    else
        sched_emit(o, WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_OUTPUT, WEFT_BUF_NONE, 0, t->parent,
                   t->c1, e, 0, c);
}

WEFT_SCHED_FN
static void tree_down(struct sched_out *o, const struct tree_node *t, uint64_t e, uint64_t c)
{
    if (t->parent < 0)
        sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_OUTPUT, WEFT_BUF_NONE, 0, t->c0, -1, e, 0, c);
    else if (t->c0 < 0)
        sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, t->parent, 0, e, c);
    else
        sched_emit(o, WEFT_STEP_RECV_COPY_SEND, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, t->c0,
                   t->parent, 0, e, c);
    if (t->c1 >= 0)
        sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_OUTPUT, WEFT_BUF_NONE, 0, t->c1, -1, e, 0, c);
}

/* Edges from rank up to the root of tree `tree`. */
WEFT_SCHED_FN
static int tree_depth(int n, int tree, int rank)
{
    int d = 0, p, c0, c1;
    for (;;) {
        weft_sched_tree(n, tree, rank, &p, &c0, &c1);
        if (p < 0)
            return d;
        rank = p;
        d++;
    }
}

WEFT_SCHED_FN
static void tree_allreduce(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks;
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);
    struct tree_node t[2];
    int depth[2], dmax = 0;
    for (int k = 0; k < 2; k++) {
        weft_sched_tree(n, k, a->rank, &t[k].parent, &t[k].c0, &t[k].c1);
        depth[k] = tree_depth(n, k, a->rank);
    }
    while ((2 << dmax) <= n)
        dmax++;

    /* Up: the tree the rank is a leaf in first (a SEND that waits for nobody); down: the tree
     * it is internal in first (forwarding before receiving its own copy). Piece P of tree k runs
     * in slot P + dmax - depth up, P + depth down (see the block comment). */
    int first[2] = {t[0].c0 >= 0, t[1].c0 >= 0};
    uint64_t piece = tree_piece(len, a->chunk);
    uint64_t npieces = len == 0 ? 0 : sched_div_up(len, piece);
    for (int down = 0; down < 2; down++) {
        for (uint64_t slot = 0; slot < npieces + (uint64_t)dmax; slot++) {
            for (int j = 0; j < 2; j++) {
                int k = j ^ first[down];
                uint64_t lag = (uint64_t)(down ? depth[k] : dmax - depth[k]);
                if (slot < lag || slot - lag >= npieces)
                    continue;
                uint64_t po = (slot - lag) * piece, psize = sched_min(piece, len - po);
                uint64_t ho, hl;
                tree_half(psize, a->chunk, k, &ho, &hl);
                uint64_t e = off + po + ho;
                if (n == 1) {
                    if (!down)
                        sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT,
                                   WEFT_STEP_FINAL, -1, -1, e, e, hl);
                } else if (!down) {
                    tree_up(o, &t[k], e, hl);
                } else {
                    tree_down(o, &t[k], e, hl);
                }
            }
        }
    }
}

WEFT_SCHED_FN
static void ring_allgather(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, me = a->rank, r = sched_pos_of(a, me);
    int next = sched_rank_at(a, sched_mod(r + 1, n)), prev = sched_rank_at(a, sched_mod(r - 1, n));
    uint64_t count = a->count, off, len;
    weft_sched_range(count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (n > 1)
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, next, -1, e, 0, c);
        sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1, e,
                   (uint64_t)me * count + e, c);
        if (n == 1)
            continue;
        for (int k = 1; k < n - 1; k++)
            sched_emit(o, WEFT_STEP_RECV_COPY_SEND, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, next, prev,
                       0, (uint64_t)sched_rank_at(a, sched_mod(r - k, n)) * count + e, c);
        sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, prev, 0,
                   (uint64_t)next * count + e, c);
    }
}

WEFT_SCHED_FN
static void ring_reducescatter(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, me = a->rank, r = sched_pos_of(a, me);
    int next = sched_rank_at(a, sched_mod(r + 1, n)), prev = sched_rank_at(a, sched_mod(r - 1, n));
    uint64_t count = a->count, off, len;
    weft_sched_range(count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (n == 1) {
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, -1, -1,
                       e, e, c);
            continue;
        }
        sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, next, -1,
                   (uint64_t)prev * count + e, 0, c);
        for (int k = 2; k < n; k++)
            sched_emit(o, WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, next, prev,
                       (uint64_t)sched_rank_at(a, sched_mod(r - k, n)) * count + e, 0, c);
        sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL,
                   -1, prev, (uint64_t)me * count + e, e, c);
    }
}

WEFT_SCHED_FN
static void chain_broadcast(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = sched_pos_of(a, a->rank);
    int next = sched_rank_at(a, sched_mod(r + 1, n)), prev = sched_rank_at(a, sched_mod(r - 1, n));
    int pos = sched_mod(r - sched_pos_of(a, a->root), n);
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (pos == 0) {
            if (n > 1)
                sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, next, -1, e, 0, c);
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1, e, e, c);
        } else if (pos < n - 1) {
            sched_emit(o, WEFT_STEP_RECV_COPY_SEND, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, next, prev,
                       0, e, c);
        } else {
            sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, prev, 0, e, c);
        }
    }
}

WEFT_SCHED_FN
static void chain_reduce(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = sched_pos_of(a, a->rank);
    int next = sched_rank_at(a, sched_mod(r + 1, n)), prev = sched_rank_at(a, sched_mod(r - 1, n));
    int pos = sched_mod(r - sched_pos_of(a, a->root) - 1, n);
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (n == 1)
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, -1, -1,
                       e, e, c);
        else if (pos == 0)
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, next, -1, e, 0, c);
        else if (pos < n - 1)
            sched_emit(o, WEFT_STEP_RECV_REDUCE_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, next, prev,
                       e, 0, c);
        else
            sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT,
                       WEFT_STEP_FINAL, -1, prev, e, e, c);
    }
}

WEFT_SCHED_FN
static void p2p_send(const struct weft_sched_args *a, struct sched_out *o)
{
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk)
        sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, a->root, -1, off + po, 0,
                   sched_min(a->chunk, len - po));
}

WEFT_SCHED_FN
static void p2p_recv(const struct weft_sched_args *a, struct sched_out *o)
{
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk)
        sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, a->root, 0, off + po,
                   sched_min(a->chunk, len - po));
}

/* Pairwise (each SEND followed by its round's RECV) or direct (every SEND, then every RECV). */
WEFT_SCHED_FN
static void alltoall_steps(const struct weft_sched_args *a, struct sched_out *o, int sends_first)
{
    int n = a->nranks, r = a->rank;
    uint64_t count = a->count, off, len;
    weft_sched_range(count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1,
                   (uint64_t)r * count + e, (uint64_t)r * count + e, c);
        for (int pass = 0; pass < 1 + sends_first; pass++)
            for (int k = 1; k < n; k++) {
                int to = sched_mod(r + k, n), from = sched_mod(r - k, n);
                if (pass == 0)
                    sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, to, -1,
                               (uint64_t)to * count + e, 0, c);
                if (pass == sends_first)
                    sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, from, 0,
                               (uint64_t)from * count + e, c);
            }
    }
}

WEFT_SCHED_FN
static void pairwise_alltoall(const struct weft_sched_args *a, struct sched_out *o)
{
    alltoall_steps(a, o, 0);
}

WEFT_SCHED_FN
static void direct_alltoall(const struct weft_sched_args *a, struct sched_out *o)
{
    alltoall_steps(a, o, 1);
}

/* Receives one piece from every rank in rank order and reduces it into output[e] (FINAL last). */
WEFT_SCHED_FN
static void direct_reduce_in_order(struct sched_out *o, int n, uint64_t e, uint64_t c)
{
    sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, 0, 0, e, c);
    for (int p = 1; p < n; p++)
        sched_emit(o, WEFT_STEP_RECV_REDUCE_COPY, WEFT_BUF_OUTPUT, WEFT_BUF_OUTPUT,
                   p == n - 1 ? WEFT_STEP_FINAL : 0, -1, p, e, e, c);
}

WEFT_SCHED_FN
static void direct_allreduce(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank;
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (n == 1) {
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, -1, -1,
                       e, e, c);
            continue;
        }
        for (int k = 1; k <= n; k++)
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, sched_mod(r + k, n),
                       -1, e, 0, c);
        direct_reduce_in_order(o, n, e, c);
    }
}

WEFT_SCHED_FN
static void det_allreduce(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank;
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    if (n == 1) {
        for (uint64_t po = 0; po < len; po += a->chunk) {
            uint64_t c = sched_min(a->chunk, len - po);
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, -1, -1,
                       off + po, off + po, c);
        }
        return;
    }
    uint64_t piece = ring_piece(len, n, a->chunk);
    for (uint64_t po = 0; po < len; po += piece) {
        uint64_t p = sched_min(piece, len - po), base = off + po, co, cl, mo, ml;
        for (int k = 0; k < n; k++) {
            int to = sched_mod(r + k, n);
            sched_split(p, (uint64_t)n, (uint64_t)to, &co, &cl);
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, to, -1, base + co, 0,
                       cl);
        }
        sched_split(p, (uint64_t)n, (uint64_t)r, &mo, &ml);
        direct_reduce_in_order(o, n, base + mo, ml);
        for (int k = 1; k < n; k++)
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_OUTPUT, WEFT_BUF_NONE, 0, sched_mod(r + k, n),
                       -1, base + mo, 0, ml);
        for (int k = 1; k < n; k++) {
            int from = sched_mod(r - k, n);
            sched_split(p, (uint64_t)n, (uint64_t)from, &co, &cl);
            sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, from, 0,
                       base + co, cl);
        }
    }
}

WEFT_SCHED_FN
static void direct_broadcast(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank, root = a->root;
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (r != root) {
            sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, root, 0, e, c);
            continue;
        }
        for (int k = 1; k < n; k++)
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, sched_mod(r + k, n),
                       -1, e, 0, c);
        sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1, e, e, c);
    }
}

WEFT_SCHED_FN
static void direct_reduce(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank, root = a->root;
    uint64_t off, len;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (n == 1) {
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, -1, -1,
                       e, e, c);
            continue;
        }
        sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, root, -1, e, 0, c);
        if (r == root)
            direct_reduce_in_order(o, n, e, c);
    }
}

WEFT_SCHED_FN
static void direct_allgather(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank;
    uint64_t count = a->count, off, len;
    weft_sched_range(count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        for (int k = 1; k < n; k++)
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, sched_mod(r + k, n),
                       -1, e, 0, c);
        sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1, e,
                   (uint64_t)r * count + e, c);
        for (int k = 1; k < n; k++) {
            int from = sched_mod(r - k, n);
            sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, from, 0,
                       (uint64_t)from * count + e, c);
        }
    }
}

WEFT_SCHED_FN
static void direct_reducescatter(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank;
    uint64_t count = a->count, off, len;
    weft_sched_range(count, a->channel, a->nchannels, &off, &len);

    for (uint64_t po = 0; po < len; po += a->chunk) {
        uint64_t c = sched_min(a->chunk, len - po), e = off + po;
        if (n == 1) {
            sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, WEFT_STEP_FINAL, -1, -1,
                       e, e, c);
            continue;
        }
        for (int k = 1; k <= n; k++) {
            int to = sched_mod(r + k, n);
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, to, -1,
                       (uint64_t)to * count + e, 0, c);
        }
        direct_reduce_in_order(o, n, e, c);
    }
}

WEFT_SCHED_FN
static void direct_gather(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank, root = a->root;
    uint64_t count = a->count, off, len;
    weft_sched_range(count, a->channel, a->nchannels, &off, &len);

    if (r != root) {
        p2p_send(a, o);
        return;
    }
    for (uint64_t po = 0; po < len; po += a->chunk)
        sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1, off + po,
                   (uint64_t)root * count + off + po, sched_min(a->chunk, len - po));
    for (int p = 0; p < n; p++) {
        if (p == root)
            continue;
        for (uint64_t po = 0; po < len; po += a->chunk)
            sched_emit(o, WEFT_STEP_RECV, WEFT_BUF_NONE, WEFT_BUF_OUTPUT, 0, -1, p, 0,
                       (uint64_t)p * count + off + po, sched_min(a->chunk, len - po));
    }
}

WEFT_SCHED_FN
static void direct_scatter(const struct weft_sched_args *a, struct sched_out *o)
{
    int n = a->nranks, r = a->rank, root = a->root;
    uint64_t count = a->count, off, len;
    weft_sched_range(count, a->channel, a->nchannels, &off, &len);

    if (r != root) {
        p2p_recv(a, o);
        return;
    }
    for (int p = 0; p < n; p++) {
        if (p == root)
            continue;
        for (uint64_t po = 0; po < len; po += a->chunk)
            sched_emit(o, WEFT_STEP_SEND, WEFT_BUF_INPUT, WEFT_BUF_NONE, 0, p, -1,
                       (uint64_t)p * count + off + po, 0, sched_min(a->chunk, len - po));
    }
    for (uint64_t po = 0; po < len; po += a->chunk)
        sched_emit(o, WEFT_STEP_COPY, WEFT_BUF_INPUT, WEFT_BUF_OUTPUT, 0, -1, -1,
                   (uint64_t)root * count + off + po, off + po, sched_min(a->chunk, len - po));
}

/*
 * Exact step counts, in closed form so that sizing a step list costs O(1). Must agree with the
 * generators above (the unit test checks equality).
 */
/* Steps of one all-reduce piece of p elements: its m = min(p, n) non-empty chunks are chunks
 * 0 .. m-1; each is handled once per half except chunk r (not sent before it is final) and chunk
 * r+1 (only received in the second half), so 2m steps, less one when chunk r is among them. */
WEFT_SCHED_FN
static uint64_t ring_allreduce_piece_steps(const struct weft_sched_args *a, uint64_t p)
{
    uint64_t m = sched_min(p, (uint64_t)a->nranks);
    return p == 0 ? 0 : 2 * m - ((uint64_t)sched_pos_of(a, a->rank) < m ? 1 : 0);
}

WEFT_SCHED_FN
static uint64_t ring_allreduce_count(const struct weft_sched_args *a, uint64_t len)
{
    if (len == 0)
        return 0;
    if (a->nranks == 1)
        return sched_div_up(len, a->chunk);
    uint64_t piece = ring_piece(len, a->nranks, a->chunk);
    return len / piece * ring_allreduce_piece_steps(a, piece) +
           ring_allreduce_piece_steps(a, len % piece);
}

/* Tree all-reduce: per non-empty half of tree k, up max(ch, 1) steps and down ch at the root,
 * max(ch, 1) elsewhere (ch children); n == 1: one COPY per half. Half 1 is empty when
 * P <= min(chunk, WEFT_SCHED_TREE_ONE_MAX). */
WEFT_SCHED_FN
static uint64_t tree_allreduce_count(const struct weft_sched_args *a, uint64_t len)
{
    if (len == 0)
        return 0;
    uint64_t st[2];
    for (int k = 0; k < 2; k++) {
        struct tree_node t;
        weft_sched_tree(a->nranks, k, a->rank, &t.parent, &t.c0, &t.c1);
        uint64_t ch = (uint64_t)(t.c0 >= 0) + (uint64_t)(t.c1 >= 0);
        uint64_t m = ch > 1 ? ch : 1;
        st[k] = a->nranks == 1 ? 1 : m + (t.parent < 0 ? ch : m);
    }
    uint64_t piece = tree_piece(len, a->chunk), rem = len % piece;
    uint64_t one = tree_one_max(a->chunk);
    return len / piece * (st[0] + (piece > one ? st[1] : 0)) + (rem >= 1 ? st[0] : 0) +
           (rem > one ? st[1] : 0);
}

/* Step counts; only called once sched_lookup accepted the arguments. */
WEFT_SCHED_FN
static uint64_t sched_count(const struct weft_sched_args *a)
{
    uint64_t off, len;
    uint64_t n = (uint64_t)a->nranks;
    weft_sched_range(a->count, a->channel, a->nchannels, &off, &len);
    uint64_t pieces = sched_div_up(len, a->chunk);

    int is_root = a->rank == a->root;
    if (a->algo == WEFT_ALGO_HIER || a->algo == WEFT_ALGO_DET) { /* O(steps): a dry run */
        struct sched_out o = {NULL, 0, 0, 0};
        if (a->algo == WEFT_ALGO_HIER)
            hier_allreduce(a, &o);
        else
            det_allreduce(a, &o);
        return o.n;
    }
    if (a->algo == WEFT_ALGO_TREE)
        return a->coll == WEFT_COLL_ALLREDUCE ? tree_allreduce_count(a, len) : 0;
    if (a->algo == WEFT_ALGO_DIRECT) {
        switch (a->coll) {
        case WEFT_COLL_ALLREDUCE:
        case WEFT_COLL_REDUCESCATTER:
            return pieces * (n == 1 ? 1 : 2 * n);
        case WEFT_COLL_BROADCAST:
            return pieces * (is_root ? n : 1);
        case WEFT_COLL_REDUCE:
            return pieces * (n == 1 ? 1 : is_root ? n + 1 : 1);
        case WEFT_COLL_ALLGATHER:
            return pieces * (2 * n - 1);
        default:
            break;
        }
    }
    switch (a->coll) {
    case WEFT_COLL_ALLREDUCE:
        return ring_allreduce_count(a, len);
    case WEFT_COLL_ALLGATHER:
        return pieces * (n == 1 ? 1 : n + 1);
    case WEFT_COLL_REDUCESCATTER:
        return pieces * n;
    case WEFT_COLL_BROADCAST:
        return pieces * (n > 1 && a->rank == a->root ? 2 : 1);
    case WEFT_COLL_REDUCE:
    case WEFT_COLL_SEND:
    case WEFT_COLL_RECV:
        return pieces;
    case WEFT_COLL_ALLTOALL:
        return pieces * (2 * n - 1);
    case WEFT_COLL_GATHER:
    case WEFT_COLL_SCATTER:
        return pieces * (a->rank == a->root ? n : 1);
    default:
        return 0;
    }
}

typedef void (*sched_gen_fn_t)(const struct weft_sched_args *a, struct sched_out *o);

/* The schedules that RING and DIRECT share: one each, whichever algorithm is asked for. */
WEFT_SCHED_FN
static sched_gen_fn_t sched_gen_pairwise(int coll)
{
    switch (coll) {
    case WEFT_COLL_ALLTOALL:
        return pairwise_alltoall;
    case WEFT_COLL_GATHER:
        return direct_gather;
    case WEFT_COLL_SCATTER:
        return direct_scatter;
    case WEFT_COLL_SEND:
        return p2p_send;
    case WEFT_COLL_RECV:
        return p2p_recv;
    default:
        return NULL;
    }
}

/* Generator per (algorithm, collective); NULL: not supported (yet). A switch rather than a
 * designated-initializer table, which nvcc's C++ would reject. */
WEFT_SCHED_FN
static sched_gen_fn_t sched_gen(int algo, int coll)
{
    switch (algo) {
    case WEFT_ALGO_RING:
        switch (coll) {
        case WEFT_COLL_ALLREDUCE:
            return ring_allreduce;
        case WEFT_COLL_ALLGATHER:
            return ring_allgather;
        case WEFT_COLL_REDUCESCATTER:
            return ring_reducescatter;
        case WEFT_COLL_BROADCAST:
            return chain_broadcast;
        case WEFT_COLL_REDUCE:
            return chain_reduce;
        default:
            return sched_gen_pairwise(coll);
        }
    case WEFT_ALGO_DIRECT:
        switch (coll) {
        case WEFT_COLL_ALLREDUCE:
            return direct_allreduce;
        case WEFT_COLL_ALLGATHER:
            return direct_allgather;
        case WEFT_COLL_REDUCESCATTER:
            return direct_reducescatter;
        case WEFT_COLL_BROADCAST:
            return direct_broadcast;
        case WEFT_COLL_REDUCE:
            return direct_reduce;
        case WEFT_COLL_ALLTOALL:
            return direct_alltoall;
        default:
            return sched_gen_pairwise(coll);
        }
    case WEFT_ALGO_TREE:
        return coll == WEFT_COLL_ALLREDUCE ? tree_allreduce : NULL;
    case WEFT_ALGO_HIER:
        return coll == WEFT_COLL_ALLREDUCE ? hier_allreduce : NULL;
    case WEFT_ALGO_DET:
        return coll == WEFT_COLL_ALLREDUCE ? det_allreduce : NULL;
    default:
        return NULL;
    }
}

/* The generator for valid arguments, NULL otherwise. */
WEFT_SCHED_FN
static sched_gen_fn_t sched_lookup(const struct weft_sched_args *a)
{
    if (a->nranks < 1 || a->rank < 0 || a->rank >= a->nranks || a->nchannels < 1 ||
        a->channel < 0 || a->channel >= a->nchannels || a->chunk < 1)
        return NULL;
    int rooted = a->coll == WEFT_COLL_BROADCAST || a->coll == WEFT_COLL_REDUCE ||
                 a->coll == WEFT_COLL_GATHER || a->coll == WEFT_COLL_SCATTER ||
                 a->coll == WEFT_COLL_SEND || a->coll == WEFT_COLL_RECV;
    if (rooted && (a->root < 0 || a->root >= a->nranks))
        return NULL;
    if ((a->ring != NULL && a->ring_pos == NULL) ||
        (a->algo == WEFT_ALGO_HIER && a->local_ranks > 1 && a->nranks % a->local_ranks != 0))
        return NULL;
    return sched_gen(a->algo, a->coll);
}

WEFT_SCHED_FN
uint64_t weft_sched_max_steps(const struct weft_sched_args *args)
{
    if (sched_lookup(args) == NULL)
        return 0;
    return sched_count(args);
}

WEFT_SCHED_FN
uint64_t weft_sched_build(const struct weft_sched_args *args, struct weft_step *steps, uint64_t max)
{
    sched_gen_fn_t gen = sched_lookup(args);
    if (gen == NULL || (steps == NULL && max > 0))
        return UINT64_MAX;
    /* No count first: sched_emit stores only the first max steps and counts the rest, so a
     * list that cannot fit is refused below (a second count cost ~40 ns of divisions per lane,
     * the 8 B path's scale, and a dry run of the whole schedule for hier and det). */
    struct sched_out o = {steps, max, 0, 0};
    gen(args, &o);
    return o.n > max ? UINT64_MAX : o.n;
}

WEFT_SCHED_FN
uint64_t weft_sched_build_window(const struct weft_sched_args *args, uint64_t first,
                                              struct weft_step *steps, uint64_t max,
                                              uint64_t *total_p)
{
    sched_gen_fn_t gen = sched_lookup(args);
    if (gen == NULL || (steps == NULL && max > 0))
        return UINT64_MAX;
    struct sched_out o = {steps, max, 0, first};
    gen(args, &o);
    *total_p = o.n;
    if (o.n <= first)
        return 0;
    return o.n - first < max ? o.n - first : max;
}

#ifndef WEFT_SCHED_DEVICE
WEFT_SCHED_FN
void weft_sched_ring_order(int nranks, const int *host, int *ring, int *ring_pos)
{
    int nhosts = 0, pos = 0;
    for (int r = 0; r < nranks; r++)
        nhosts = host[r] + 1 > nhosts ? host[r] + 1 : nhosts;
    for (int h = 0; h < nhosts; h++)
        for (int r = 0; r < nranks; r++)
            if (host[r] == h) {
                ring[pos] = r;
                if (ring_pos != NULL)
                    ring_pos[r] = pos;
                pos++;
            }
}

WEFT_SCHED_FN
uint64_t weft_sched_bytes_sent(const struct weft_step *steps, uint64_t nsteps, size_t elem_size)
{
    uint64_t elems = 0;
    for (uint64_t i = 0; i < nsteps; i++) {
        switch (steps[i].op) {
        case WEFT_STEP_SEND:
        case WEFT_STEP_RECV_REDUCE_SEND:
        case WEFT_STEP_RECV_REDUCE_COPY_SEND:
        case WEFT_STEP_RECV_COPY_SEND:
            elems += steps[i].count;
            break;
        default:
            break;
        }
    }
    return elems * (uint64_t)elem_size;
}

WEFT_SCHED_FN
const char *weft_coll_name(int coll)
{
    static const char *const names[WEFT_COLL_COUNT] = {
        "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
        "AllToAll",  "Gather",    "Scatter",       "Send",      "Recv",
    };
    return coll >= 0 && coll < WEFT_COLL_COUNT ? names[coll] : "Unknown";
}

WEFT_SCHED_FN
const char *weft_algo_name(int algo)
{
    static const char *const names[WEFT_ALGO_COUNT] = {"Ring", "Tree", "Direct", "Hier", "Det"};
    return algo >= 0 && algo < WEFT_ALGO_COUNT ? names[algo] : "Unknown";
}
#endif /* !WEFT_SCHED_DEVICE */
