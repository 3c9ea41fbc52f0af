/*
 * Shared driver of the *_perf tools: an nccl-tests (2.19.6) compatible benchmark on device or host
 * memory.
 *
 * A tool is one small file: the call that runs its collective and
 *
 *     int main(int argc, char **argv) { return perf_main(argc, argv, &perf_coll_all_gather, run); }
 *
 * What a collective *is* -- its buffer geometry, its input data, the result each rank must see and
 * its bus bandwidth factor -- is a `struct perf_coll` defined once in colls.c, so that a Weft tool
 * and its MPI peer (mpi_*_perf, see mpi_common.h) measure and validate exactly the same thing. Only
 * the library call differs (a perf_run_fn).
 *
 * perf_main parses the nccl-tests flags, finds rank/size/unique id with weftLaunchInfo (run the
 * tool under weftrun), creates the communicators, sweeps sizes x types x ops x roots, and prints
 * the nccl-tests table. Built with -DPERF_NO_NCCL (the driver: common.c, data.c, args.c and
 * report.c, without nccl_backend.c), nothing links against NCCL, and perf_run drives another
 * library through a struct perf_backend (the MPI peer tools).
 *
 * Ranks and devices (NCCL backend). A process runs -t threads, each driving -g ranks: rank =
 * (process * t + thread) * g + i of processes * t * g, on device (host-local index) mod (devices),
 * so several ranks may share a device. A thread creates its ranks' communicators in one group
 * (ncclCommInitRank per rank, its device current) and issues every call on all its ranks in one
 * group, as nccl-tests. Buffers are device memory wherever a device runtime is found (devmem.h:
 * Weft's weftCuda* with WEFT_CUDA=emu:N or a GPU, or the CUDA runtime under another libnccl.so.2),
 * each rank with its own non-blocking stream (-y 1: the NULL stream); host memory otherwise or with
 * -H 1 (stream NULL: a call is complete when it returns). On device buffers data is made and
 * checked on the host and copied in and out, outside the timed loop; -G N captures the `-n`
 * iterations into one graph per rank and times N launches of it. The tools link libnccl.so.2 (not
 * libcudart), so LD_LIBRARY_PATH can swap in NVIDIA's library; without Weft's weftLaunchInfo the
 * process must be the whole job. WEFT_PERF_DEVICE=1 (perf-smoke's device tests): exit 77 (skip),
 * with the reason, when no device buffers are available or when the library has no CUDA executor,
 * i.e. it does not bind communicators to their ranks' devices (ncclCommCuDevice);
 * WEFT_PERF_DEVICE=buffers asks for device buffers only (the mock runtime's tests).
 *
 * For each row it runs out-of-place then in-place: initialise data, one op, barrier, `-n` timed
 * iterations (each of `-m` ops, grouped when m > 1), time combined over ranks per `-a`, then `-c`
 * validation rounds (poison the receive buffer, fill the send data, one op, compare every element
 * bit for bit with an independently computed expected value). Each call's buffers rotate through
 * the -e sized allocation as nccl-tests does; in place uses nccl-tests' offsets
 * (sendbuff = recvbuff + rank * send_inplace_offset).
 *
 * Data. Every rank can compute any rank's input: perf_fill() writes the value `rank` contributes at
 * element index i, a pure function of (seed, rank, i, type, op, nranks). Values are chosen so that
 * every reduction order gives the same bits (see perf_fill_reduced), which makes #wrong bit-exact
 * for every type and op. A collective's callbacks only map indices (n ranks, c = count column):
 *   all_reduce      send = fill(rank, 0..c),    expected = reduced(0..c)
 *   reduce_scatter  send = fill(rank, 0..n*c),  expected = reduced(rank*c..+c)
 *   all_gather      send = fill(rank, 0..c),    expected block r = fill(r, 0..c)
 *   broadcast       send = fill(root, 0..c),    expected = fill(root, 0..c)
 *   reduce          send = fill(rank, 0..c),    expected (root only) = reduced(0..c)
 *   alltoall        send = fill(rank, 0..n*c),  expected block r = fill(r, rank*c..+c)
 *   sendrecv        send = fill(rank, 0..c),    expected = fill(rank-1 mod n, 0..c)
 *   gather          send = fill(rank, 0..c),    expected (root only) block r = fill(r, 0..c)
 *   scatter         send = fill(root, 0..n*c),  expected = fill(root, rank*c..+c)
 *   hypercube       as all_gather
 *
 * Output. Rank 0 prints the nccl-tests table on stdout. With -J FILE it also writes one JSON object
 * per measurement (one half of a table row) to FILE, one per line, in this order; the NCCL and
 * the MPI tools write the same fields the same way, so runs can be compared line by line:
 *   "library"    "weft" (the *_perf tools on Weft), "nccl" (on another libnccl.so.2); "openmpi",
 *                "mpich", "intelmpi", "mvapich" or "mpi"
 *                (the mpi_*_perf tools, from MPI_Get_library_version)
 *   "collective" all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv,
 *                gather, scatter or hypercube (the tool name without mpi_ and _perf)
 *   "nranks"     ranks in the communicator
 *   "bytes"      the size column: the larger of a rank's send and receive buffers, in bytes
 *   "count"      the count column: the count argument of the call (per rank / per peer where
 *                nccl-tests' table has it so)
 *   "type"       nccl-tests type name (int8 ... f8e5m2)
 *   "op"         sum, prod, max, min, avg, mulsum, or "none" for data movement
 *   "root"       the root rank, -1 for unrooted collectives
 *   "inplace"    false, true
 *   "time_us"    microseconds per op, combined over ranks per -a (3 decimals)
 *   "algbw"      GB/s (1e9 bytes/s, 6 decimals); "busbw" likewise (algbw x bus factor)
 *   "wrong"      wrong elements summed over ranks; null with -c 0
 *   "memory"     "device" or "host": where the buffers were
 *   "iters"      timed iterations per repeat (-n, or the count -S chose for this size)
 *   "repeats"    timed runs of the measurement (-k); "time_us" is their median
 *   "time_us_min", "time_us_max"  the fastest and the slowest of those runs
 * Non-finite numbers are written as null. New fields are only ever added at the end.
 *
 * Threads: -t driving threads (the first is the main thread; it alone prints, on process 0), and
 * the -T watchdog, which only calls the backend's abort (ncclCommAbort) on every rank.
 */
#ifndef WEFT_PERF_COMMON_H
#define WEFT_PERF_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Operations the tools know. 0..4 are ncclRedOp_t values; mulsum is ncclRedOpCreatePreMulSum with
 * scalar 1 on even ranks and 2 on odd ranks (as nccl-tests); none is for data-movement
 * collectives (the op column prints "none"). */
enum perf_op_kind {
    PERF_OP_SUM = ncclSum,
    PERF_OP_PROD = ncclProd,
    PERF_OP_MAX = ncclMax,
    PERF_OP_MIN = ncclMin,
    PERF_OP_AVG = ncclAvg,
    PERF_OP_MULSUM = 5,
    PERF_OP_COUNT = 6,
    PERF_OP_NONE = -1,
};

/* A datatype as the tools see it (static table, indexed by ncclDataType_t). */
struct perf_type {
    ncclDataType_t type;
    const char *name; /* nccl-tests name: int8 ... f8e5m2 */
    size_t size;      /* bytes per element */
    int is_float;
    int is_signed;    /* integers only */
    int exp_bits;     /* floats: exponent bits (0 for integers) */
    int mant_bits;    /* floats: stored mantissa bits */
    int exp_lo, exp_hi; /* floats: range of the per-element power of two in test values */
};

/* Buffer geometry of one call, in elements (set by perf_coll.get_counts). */
struct perf_counts {
    size_t count;               /* the count argument of the call ("count" column) */
    size_t send_count;          /* elements in this rank's send buffer */
    size_t recv_count;          /* elements in this rank's receive buffer */
    size_t send_inplace_offset; /* in place: sendbuff = recvbuff + rank * this */
    size_t recv_inplace_offset; /* in place: recvbuff = recvbuff + rank * this */
    double alg_bytes;           /* bytes that define algbw (nccl-tests getBw) */
};

/* How test values are made for one (type, op, nranks); filled by the driver, used by perf_fill. */
struct perf_gen {
    int64_t k;         /* integer magnitude bound of a value */
    uint32_t modulus;  /* rank r gives a non-identity value at index i iff (r+i) % modulus == 0 */
    int raw;           /* integers: any bit pattern (max/min/none) */
    int e_lo, e_span;  /* floats: value = s * 2^(e_lo + h % e_span), h shared by all ranks */
};

/* One measured configuration (one half of a table row). */
struct perf_op {
    const struct perf_type *type;
    int op;              /* enum perf_op_kind */
    ncclRedOp_t nccl_op; /* what is passed to NCCL (a PreMulSum handle for mulsum) */
    int root;            /* -1 for unrooted collectives */
    int in_place;
    struct perf_counts c;
    struct perf_gen gen;
    /* nphases 1: run does the whole call; else only step `phase` of perf_coll.phases (the
     * driver's calls for phase 0 .. nphases-1 follow each other). */
    int phase, nphases;
};

/* One rank's state a callback may read. A process runs -t threads of -g ranks each (NCCL
 * backend); the MPI and Gloo peers run one rank per process. */
struct perf_ctx {
    int rank, nranks, local_rank;
    const char *library;  /* JSON "library", set by the backend's init (static string) */
    ncclComm_t comm;     /* NCCL backend */
    cudaStream_t stream; /* NULL: host calls return when done (host buffers), or -y 1 */
    void *be_state;      /* other backends (e.g. the MPI communicator); NCCL: helper scratch */
    int device;          /* CUDA device of this rank (devmem.h), -1 on host buffers */
    int dev_bufs;        /* 1: the rank's buffers are device memory (copy in and out) */
};

/* The ranks one thread drives (-g of them), in local order; what the helper collectives of a
 * backend act on. Every team of a job has the same n. */
struct perf_team {
    int n;
    struct perf_ctx *ctx; /* [n] */
};

/* Flags of a collective. */
#define PERF_COLL_REDUCE 0x1u /* takes a reduction op: sweeps -o; else op is "none" */
#define PERF_COLL_ROOTED 0x2u /* takes a root: sweeps -r (-1 = every root); else root is -1 */
#define PERF_COLL_POW2 0x4u   /* needs a power-of-two number of ranks (else exit 2, a message) */
/* In place has no defined result in NCCL (alltoall, send/recv on one buffer): the in-place half is
 * timed but not checked, #wrong prints N/A (JSON null), as nccl-tests does. */
#define PERF_COLL_INPLACE_UNCHECKED 0x8u

/*
 * A collective, independent of the library that runs it (colls.c). Every slot is required.
 * Called on the thread that drives the rank; buffers belong to the driver and are 64-byte aligned
 * (plus -u elements). init_data and expected always work on host memory (on device buffers the
 * driver copies in and out).
 */
struct perf_coll {
    const char *name; /* collective name, e.g. "all_gather" (JSON "collective") */
    unsigned flags;   /* PERF_COLL_* */
    /* Geometry for a sweep step of `bytes` (nccl-tests: count = bytes / type_size; AG, RS, A2A,
     * gather, scatter and hypercube then take count / nranks rounded down to 16 bytes). */
    void (*get_counts)(size_t bytes, size_t type_size, int nranks, struct perf_counts *c_p);
    /* Writes this rank's send data: op->c.send_count elements at send (may write nothing on
     * ranks that send nothing, e.g. non-roots of scatter). */
    void (*init_data)(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                      void *send);
    /* Writes what this rank must receive and returns how many elements to compare (0: nothing
     * to check on this rank, e.g. non-roots of reduce). expect holds op->c.recv_count. */
    size_t (*expected)(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                       void *expect);
    /* busbw = algbw * bus_factor(nranks) */
    double (*bus_factor)(int nranks);
    /* Dependent steps of one call (1 for most). A thread that drives several ranks issues
     * their calls in one group (as nccl-tests); where a later step sends what an earlier one
     * received (hypercube), one group would run the steps at once, so the driver then calls run
     * once per step (struct perf_op phase/nphases), each step of every rank in its own group. */
    int (*phases)(int nranks);
};

/* The collectives (colls.c). */
extern const struct perf_coll perf_coll_all_reduce, perf_coll_all_gather,
    perf_coll_reduce_scatter, perf_coll_broadcast, perf_coll_reduce, perf_coll_alltoall,
    perf_coll_sendrecv, perf_coll_gather, perf_coll_scatter, perf_coll_hypercube;

/*
 * Issues one collective with the library under test: op->c.count elements of op->type, op->root,
 * op->nccl_op; send/recv laid out as op->c says (in place: op->in_place, pointers already at
 * nccl-tests' offsets), on ctx->stream: on host buffers (stream NULL) the result is in recv when
 * it returns; on device buffers the call only enqueues and the driver waits for the stream (the
 * call may be captured into a graph: stream-ordered work only, see perf_copy). Several ranks of one
 * thread are issued inside one group. A failure returns non-success after setting the backend's
 * last error where the library does not.
 */
typedef ncclResult_t (*perf_run_fn)(const struct perf_ctx *ctx, const struct perf_op *op,
                                    const void *send, void *recv);

/* perf_backend.caps */
#define PERF_BE_DEVICE 0x1u /* device buffers, -g/-t > 1 and -G (the NCCL backend) */

/*
 * What the driver needs from the communication library besides the collective under test. The
 * NCCL one (perf_nccl_backend: weftLaunchInfo + ncclCommInitRank, small ncclAllReduce calls) is
 * what the *_perf tools use; the mpi_*_perf tools bring an MPI one (mpi_common.c) so that the
 * peers run the very same sweep, timing, validation and output. Every slot is required. init,
 * early_rank and fini run on the main thread; the team slots on the thread that drives the team
 * (one per -t), abort on the -T watchdog thread. Calls are collective where the NCCL call would
 * be. A failing slot returns non-success; the driver then prints error_string/last_error and
 * exits 1. A backend without PERF_BE_DEVICE only ever sees teams of one rank, one thread.
 */
struct perf_backend {
    const char *name; /* "NCCL", "MPI": in messages ("Test NCCL failure ...") */
    unsigned caps;    /* PERF_BE_* */
    /* Process level: sets ctx->rank and nranks to this process's index and the process count,
     * local_rank (among the processes of this host) and library; writes the first header line
     * ("# ... (nccl-tests 2.19.6 compatible) ..."). May create the communicator of a one-rank
     * process (MPI) or leave that to comm_init. Collective over processes. */
    ncclResult_t (*init)(struct perf_ctx *ctx, char *version_line, size_t len);
    /* This process's rank before init (who prints usage errors); 0 when unknown. */
    int (*early_rank)(void);
    ncclResult_t (*fini)(struct perf_ctx *ctx);
    /* Creates the team's communicators: team->ctx[i] comes with rank, nranks, local_rank,
     * library, device, dev_bufs and stream set (the calling thread's current device is
     * unspecified). Collective over all ranks; comm_fini undoes it. */
    ncclResult_t (*comm_init)(struct perf_team *team);
    ncclResult_t (*comm_fini)(struct perf_team *team);
    /* The device ctx's communicator is bound to (ncclCommCuDevice), -1 for none. */
    ncclResult_t (*comm_device)(const struct perf_ctx *ctx, int *dev_p);
    ncclResult_t (*barrier)(const struct perf_team *team);
    /* In place over all teams: *v = op(the *v of every team), op PERF_OP_SUM, _MIN or _MAX. */
    ncclResult_t (*reduce_double)(const struct perf_team *team, double *v, int op);
    ncclResult_t (*sum_int64)(const struct perf_team *team, int64_t *v);
    /* out (nranks * bytes) = every rank's `bytes`, in rank order; in holds team->n of them, the
     * team's ranks in local order. */
    ncclResult_t (*allgather)(const struct perf_team *team, const void *in, void *out,
                              size_t bytes);
    /* Brackets -m aggregated ops. */
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    /* Sets op->nccl_op for op->op on ctx's communicator (creating the mulsum PreMulSum op);
     * op_destroy undoes it. */
    ncclResult_t (*op_create)(const struct perf_ctx *ctx, struct perf_op *op);
    ncclResult_t (*op_destroy)(const struct perf_ctx *ctx, struct perf_op *op);
    /* Whether (t, op) can be run. t NULL asks about the op alone; op PERF_OP_NONE about the type
     * alone (which is also the data-movement case). */
    int (*supports)(const struct perf_type *t, int op);
    const char *(*error_string)(ncclResult_t res);
    const char *(*last_error)(void);
    /* -R 1: a buffer of bytes registered on ctx's communicator for zero-copy (ncclMemAlloc:
     * device memory on the current device where the process has one, else (Weft) host memory
     * its local peers can map; then ncclCommRegister); the caller zeroes it. reg_free
     * deregisters and frees it. NULL: the backend cannot (-R 1 is refused). */
    ncclResult_t (*reg_alloc)(const struct perf_ctx *ctx, size_t bytes, void **p_p,
                              void **handle_p);
    ncclResult_t (*reg_free)(const struct perf_ctx *ctx, void *p, void *handle);
    /* From the watchdog thread while the driving threads may be blocked; once per rank. */
    ncclResult_t (*abort)(const struct perf_ctx *ctx);
};

/* Runs the benchmark of coll, issued by run, over a backend; returns the process exit code (0
 * ok, 1 library/system failure, 2 usage, 7 wrong results or NCCL_TESTS_MIN_BW not met). */
int perf_run(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run,
             const struct perf_backend *be);

#ifndef PERF_NO_NCCL
extern const struct perf_backend perf_nccl_backend;

/* perf_run over NCCL/Weft: rank, size and unique id from weftLaunchInfo (run under weftrun). */
int perf_main(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run);
#endif

/* ---- helpers for run functions ---- */

/* Stream-ordered copy of bytes within ctx's buffers (host or device, as ctx->dev_bufs says), on
 * ctx->stream; capturable into a CUDA graph. */
ncclResult_t perf_copy(const struct perf_ctx *ctx, void *dst, const void *src, size_t bytes);

/* ---- data helpers for callbacks ---- */

/* buf[k] = value `rank` contributes at index first + k, for k < n (op->type's encoding). */
void perf_fill(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed, int rank,
               size_t first, size_t n, void *buf);

/* buf[k] = op over all ranks of their values at index first + k, for k < n, computed with a plain
 * loop in exact arithmetic (NCCL semantics: integer avg = sum / nranks truncated; float avg =
 * sum of x * (T)(1/nranks); mulsum = sum of x * scalar_r). */
void perf_fill_reduced(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                       size_t first, size_t n, void *buf);

/* Type table lookup by name ("float", ...); NULL if unknown. */
const struct perf_type *perf_type_by_name(const char *name);
const struct perf_type *perf_type_get(ncclDataType_t type);
/* Name of an op kind ("sum" ... "mulsum", "none"). */
const char *perf_op_name(int op);

/* Encodes a double exactly representable (or to be rounded to nearest even) in the type's format;
 * integers are truncated two's complement. Exposed for tools that make scalars (mulsum). */
void perf_store_double(const struct perf_type *t, void *buf, size_t idx, double v);
double perf_load_double(const struct perf_type *t, const void *buf, size_t idx);

#endif
