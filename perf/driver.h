/*
 * The perf driver's private declarations, shared by its files (common.h says what the driver
 * does):
 *
 *   common.c        the driver: state, -T watchdog, failure lines, timing, the size sweep, the
 *                   validation rounds, the ranks' buffers and teams, threads, perf_run;
 *   data.c          the data: datatypes and their formats, test values (perf_fill,
 *                   perf_fill_reduced) and filling and checking a rank's buffers;
 *   args.c          the arguments: nccl-tests' flags;
 *   report.c        the report: the nccl-tests table's numbers, its header and device lines, and
 *                   the -J JSON lines;
 *   nccl_backend.c  the NCCL backend (perf_nccl_backend, perf_main; left out of the builds with
 *                   -DPERF_NO_NCCL, whose backends are mpi_common.c and gloo/gloo_perf.cc).
 *
 * Everything here runs on the thread that drives the ranks it is given (struct perf_state), as in
 * common.h.
 */
#ifndef WEFT_PERF_COMMON_INTERNAL_H
#define WEFT_PERF_COMMON_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "devmem.h"

#define PERF_ALIGN 64
#define PERF_MAX_TYPES 16
#define PERF_MAX_THREADS 64

struct perf_args {
    size_t min_bytes, max_bytes, step_bytes;
    long step_factor;
    int iters, warmup, agg, cycles, check, root, blocking, average, unalign, timeout_s;
    double time_target; /* -S: seconds each timed run of a size aims at (0: -n iterations) */
    int repeats;        /* -k: timed runs per row; the row shows their median */
    int report_cputime, parallel_init, stream_null;
    int nthreads, ngpus, graph_launches, host_buffers;
    int local_register; /* -R 1: buffers from the backend's reg_alloc (ncclMemAlloc, registered) */
    const char *json_path;
    int ntypes;
    const struct perf_type *types[PERF_MAX_TYPES];
    int nops;
    int ops[PERF_OP_COUNT];
};

/* One rank's buffers. On device buffers `stage` is the host copy that data is made and checked
 * in; on host buffers the driver works on the buffers themselves. */
struct perf_slot {
    struct perf_ctx *ctx;
    char *send_base, *recv_base; /* 64-byte aligned (device: as cudaMalloc returned) */
    void *send_alloc, *recv_alloc;
    void *send_reg, *recv_reg; /* -R 1: registration handles (send_alloc/recv_alloc: reg_alloc's) */
    char *stage, *expect;
    void *stage_alloc, *expect_alloc;
    ncclRedOp_t nccl_op; /* this communicator's op of the current test (mulsum: its PreMulSum) */
    perf_graph_t graph;
    /* expected-values cache */
    int exp_valid;
    uint64_t exp_seed;
    const struct perf_type *exp_type;
    int exp_op, exp_root;
    size_t exp_count, exp_n;
};

/* One driving thread (-t): its team of -g ranks. Thread 0 is the process's main thread. */
struct perf_state {
    const struct perf_coll *coll;
    perf_run_fn run;
    const char *prog; /* program name, for the header, footer and messages */
    const struct perf_backend *be;
    const struct perf_devmem *dm; /* device runtime when dev_bufs */
    struct perf_args a;
    struct perf_ctx proc;   /* what be->init said about this process */
    struct perf_team team;
    struct perf_slot *slots; /* [team.n] */
    int thread;
    int nteams;             /* teams in the job */
    int dev_bufs;
    int is_main;            /* global rank 0's thread: prints */
    int require_device;     /* WEFT_PERF_DEVICE: 1 device buffers and executor, 2 buffers */
    char host[256];
    size_t buf_bytes;    /* usable bytes of send/recv (rotation space) */
    size_t expect_bytes;
    uint64_t row_seed;   /* advances per table row, identically on every rank */
    /* results */
    double bw_sum;
    long bw_count;
    long local_errors; /* measurements where a rank of this team saw a wrong element */
    int rc;
    FILE *json;
    int verbose;
};

struct perf_result {
    double time_us, algbw, busbw; /* time_us: the median of the repeats */
    int64_t wrong; /* -1: not checked */
    double time_min_us, time_max_us; /* the fastest and slowest repeat */
    int iters;                       /* timed iterations per repeat */
};

/* ---- common.c ---- */

/* nccl-tests' failure lines (library, CUDA), then exit(1). */
void perf_fail(const struct perf_state *st, const char *file, int line, ncclResult_t res);
void perf_cuda_fail(const struct perf_state *st, const char *file, int line, int err);

#define PERF_CHECK(st, call)                                                                       \
    do {                                                                                           \
        ncclResult_t perf_res_ = (call);                                                           \
        if (perf_res_ != ncclSuccess && perf_res_ != ncclInProgress)                               \
            perf_fail((st), __FILE__, __LINE__, perf_res_);                                        \
    } while (0)

#define PERF_CUDACHECK(st, call)                                                                   \
    do {                                                                                           \
        int perf_err_ = (call);                                                                    \
        if (perf_err_ != 0)                                                                        \
            perf_cuda_fail((st), __FILE__, __LINE__, perf_err_);                                   \
    } while (0)

/* Makes rank i's device current on this thread (device buffers only). */
static inline void perf_slot_use(struct perf_state *st, int i)
{
    if (st->dev_bufs)
        PERF_CUDACHECK(st, st->dm->set_device(st->team.ctx[i].device));
}

/* ---- data.c ---- */

/* The datatypes, indexed by ncclDataType_t, and the names of the ops (enum perf_op_kind). */
extern const struct perf_type perf_types[ncclNumTypes];
extern const char *const perf_op_names[PERF_OP_COUNT];

/* How test values of (t, op) are made for nranks ranks (struct perf_gen). */
void perf_make_gen(struct perf_gen *g, const struct perf_type *t, int op, int nranks);
/* PreMulSum's scalar of rank (mulsum: 1 on even ranks, 2 on odd ones, as nccl-tests). */
static inline int64_t perf_mulsum_scalar(int rank)
{
    return rank % 2 ? 2 : 1;
}
/* Lays rank i's input for op at send (host memory, or copied in from the stage on device
 * buffers). */
void perf_fill_send(struct perf_state *st, int i, const struct perf_op *op, uint64_t seed,
                    char *send);
/* Rank i's wrong elements in recv after a validation op (copied out on device buffers). */
int64_t perf_check_rank(struct perf_state *st, int i, const struct perf_op *op, uint64_t seed,
                        const char *recv);

/* ---- args.c ---- */

/* Parses the nccl-tests flags into *a: 0 to run, 2 for a usage error (printed on the main rank),
 * -1 after --help. */
int perf_parse_args(struct perf_args *a, int argc, char **argv, const char *prog, int is_main,
                    const struct perf_backend *be);

/* ---- report.c ---- */

/* Whether rows end with iterations and spread columns (-S or -k). */
int perf_timing_columns(const struct perf_args *a);
/* Appends one half of a table row (time, algbw, busbw, #wrong) to line. */
void perf_append_body(char *line, size_t n, const struct perf_result *r);
/* Writes one measurement's JSON line to st->json. */
void perf_json_line(struct perf_state *st, const struct perf_op *op, const struct perf_result *r);
/* The "# Using devices" lines of every rank (collective: every thread calls it). */
void perf_print_devices(struct perf_state *st);
/* The table header (main thread). */
void perf_print_table_header(const struct perf_state *st);

#endif
