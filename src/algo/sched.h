/*
 * Schedules: what one rank does for one collective on one channel, as a list of steps.
 *
 * Pure code. A schedule knows no transport, touches no memory, allocates nothing and uses integer
 * math only, so that nvcc can compile it for the CUDA executor later. Every rank computes the steps
 * of every other rank identically from the same arguments, which is what keeps sends and receives
 * matched: the k-th send from rank a to rank b on a channel carries exactly the element count of
 * the k-th receive that b posts from a on that channel.
 *
 * Step semantics (counts and offsets in elements of the datatype; "local" means the src buffer):
 *   SEND                   send src[src_off .. +count) to send_peer
 *   RECV                   receive count elements from recv_peer into dst[dst_off ..)
 *   RECV_REDUCE_SEND       receive, reduce with local src, send the result to send_peer
 *   RECV_REDUCE_COPY       receive, reduce with local src, write the result to dst
 *   RECV_REDUCE_COPY_SEND  receive, reduce with local src, write to dst and send to send_peer
 *   RECV_COPY_SEND         receive, write to dst and forward the same data to send_peer
 *   COPY                   dst = src locally (the executor skips it when they are the same memory)
 * Reductions always combine "received" (left) with "local src" (right); the local src is a user
 * input, so the operator's pre-multiplication (avg, PreMulSum) applies to it, and to data a SEND
 * or COPY takes from the user's input. WEFT_STEP_FINAL marks steps whose output is a final result
 * (integer avg divides there).
 *
 * Chunking: a step never carries more than args.chunk elements (the executor's FIFO holds at least
 * two such steps), so ring steps in flight always fit in the connection and rings cannot
 * deadlock; large inputs loop the whole ring pattern over pieces of nranks * chunk elements.
 * The pairwise all-to-all relies on the same two-step bound (the argument is in sched.c).
 * Channels split the count into contiguous ranges, one per channel (see weft_sched_range); for the
 * collectives whose buffers hold n blocks, every block is split the same way.
 *
 * Buffers (elements): all-to-all input and output n*count; gather input count, output n*count at
 * the root (other ranks' output is never touched); scatter input n*count at the root (other ranks'
 * input is never read), output count. SEND (args.root = peer) reads input[0 .. count) and RECV
 * (args.root = peer) writes output[0 .. count); the peer may be the rank itself (the executor has
 * a loopback connection), and the SEND and RECV schedules of a pair cut count into equal pieces.
 */
#ifndef WEFT_ALGO_SCHED_H
#define WEFT_ALGO_SCHED_H

#include <stddef.h>
#include <stdint.h>

enum weft_coll {
    WEFT_COLL_ALLREDUCE = 0,
    WEFT_COLL_ALLGATHER,
    WEFT_COLL_REDUCESCATTER,
    WEFT_COLL_BROADCAST,
    WEFT_COLL_REDUCE,
    WEFT_COLL_ALLTOALL,
    WEFT_COLL_GATHER,
    WEFT_COLL_SCATTER,
    WEFT_COLL_SEND,
    WEFT_COLL_RECV,
    WEFT_COLL_COUNT,
};

/*
 * All-to-all has a pairwise schedule (RING: one peer per round) and a direct one (DIRECT: every
 * block posted at once, then every receive); gather, scatter (the root talks to every peer
 * directly) and send/recv have one schedule each, which RING and DIRECT both select; TREE does
 * not.
 */
enum weft_algo {
    WEFT_ALGO_RING = 0, /* rings for all-reduce/all-gather/reduce-scatter, chains for bcast/reduce */
    WEFT_ALGO_TREE,     /* double binary tree: all-reduce only */
    WEFT_ALGO_DIRECT,   /* one-shot all-reduce; pairwise all-to-all, gather, scatter */
    WEFT_ALGO_HIER,     /* hierarchical all-reduce (hosts of local_ranks ranks): all-reduce only */
    WEFT_ALGO_DET,      /* rank-order two-shot all-reduce (WEFT_DETERMINISTIC): all-reduce only */
    WEFT_ALGO_COUNT,
};

enum weft_step_op {
    WEFT_STEP_SEND = 0,
    WEFT_STEP_RECV,
    WEFT_STEP_RECV_REDUCE_SEND,
    WEFT_STEP_RECV_REDUCE_COPY,
    WEFT_STEP_RECV_REDUCE_COPY_SEND,
    WEFT_STEP_RECV_COPY_SEND,
    WEFT_STEP_COPY,
};

/* Which user buffer a step reads (src) or writes (dst). */
enum weft_buf {
    WEFT_BUF_NONE = 0,
    WEFT_BUF_INPUT,
    WEFT_BUF_OUTPUT,
};

#define WEFT_STEP_FINAL 0x1

struct weft_step {
    uint8_t op;    /* enum weft_step_op */
    uint8_t src;   /* enum weft_buf */
    uint8_t dst;   /* enum weft_buf */
    uint8_t flags; /* WEFT_STEP_FINAL */
    int32_t send_peer; /* rank in the communicator, -1 if the step sends nothing */
    int32_t recv_peer; /* rank in the communicator, -1 if the step receives nothing */
    uint32_t pad;
    uint64_t src_off;
    uint64_t dst_off;
    uint64_t count;
};

struct weft_sched_args {
    int coll;         /* enum weft_coll */
    int algo;         /* enum weft_algo */
    uint64_t count;   /* NCCL's count argument (per-rank block for AG/RS/A2A/gather/scatter) */
    int nranks;
    int rank;
    int root;         /* broadcast/reduce/gather/scatter; peer for send/recv */
    int channel;      /* 0 .. nchannels-1 */
    int nchannels;
    uint64_t chunk;   /* max elements per step, >= 1 */
    /*
     * Ring order (weft_sched_ring_order): ring[i] is the rank at ring position i and ring_pos[r]
     * the position of rank r (both [nranks], or both NULL for rank order). Rings and chains run on
     * positions; results keep the rank layout (all-gather block i is rank i's, and so on).
     */
    const int *ring;
    const int *ring_pos;
    int local_ranks;  /* HIER: ranks per host k (positions h*k .. h*k+k-1 are host h; n % k == 0);
                       * 0 or 1: one rank per host (HIER is then the ring) */
};

/* Elements [*off, *off + *len) of a block of `count` elements that channel `channel` handles. */
void weft_sched_range(uint64_t count, int channel, int nchannels, uint64_t *off, uint64_t *len);

/* Tree all-reduce: pieces of at most min(chunk, this) elements go whole over tree 0 (sched.c). */
#define WEFT_SCHED_TREE_ONE_MAX 1024

/* Upper bound on the number of steps weft_sched_build produces for these arguments. */
uint64_t weft_sched_max_steps(const struct weft_sched_args *args);

/*
 * Writes the steps of args.rank into steps[0 .. max) in execution order and returns how many.
 * Steps with count 0 are never emitted. Returns UINT64_MAX if the arguments are not supported
 * (unknown collective/algorithm pair) or max is too small (then steps[0 .. max) may be written).
 */
uint64_t weft_sched_build(const struct weft_sched_args *args, struct weft_step *steps, uint64_t max);

/*
 * Steps first .. first+max-1 of the same list (a window, for executors that keep only a few steps
 * at a time: the CUDA kernel). Writes them to steps[0 ..), sets *total_p to the length of the whole
 * list and returns how many were written (0 once first >= total), or UINT64_MAX if the arguments
 * are not supported. Costs as much as building the whole list.
 */
uint64_t weft_sched_build_window(const struct weft_sched_args *args, uint64_t first,
                                 struct weft_step *steps, uint64_t max, uint64_t *total_p);

/*
 * Tree `tree` (0 or 1) of the double binary tree over nranks (see sched.c): rank's parent (-1 at the
 * root) and children (-1 where absent; child1 >= 0 only if child0 >= 0). Every rank computes the
 * same trees.
 */
void weft_sched_tree(int nranks, int tree, int rank, int *parent_p, int *child0_p, int *child1_p);

/*
 * The ring order of nranks ranks on hosts host[r] (numbered 0, 1, ... in order of their lowest
 * rank): hosts in that order, the ranks of a host in rank order, so the ring leaves each host once.
 * Fills ring[nranks] (rank at each position) and, if not NULL, ring_pos[nranks] (its inverse).
 * Pure; O(nranks * hosts).
 */
void weft_sched_ring_order(int nranks, const int *host, int *ring, int *ring_pos);

/* Bytes this rank sends in total (sum of send step counts times elem_size), for tests and stats. */
uint64_t weft_sched_bytes_sent(const struct weft_step *steps, uint64_t nsteps, size_t elem_size);

const char *weft_coll_name(int coll);
const char *weft_algo_name(int algo);

#endif
