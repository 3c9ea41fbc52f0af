/*
 * Per-rank traces in Chrome's trace-event format (WEFT_TRACE_FILE): what Perfetto
 * (ui.perfetto.dev) and chrome://tracing open directly, and what tools/weft-trace merges into one
 * timeline (one track per rank, pid = rank).
 *
 * A communicator records every operation its host executor runs (enqueue time, start, end, and
 * when each channel's lane finished) and every operation the CUDA executor launches (enqueue and
 * launch on the host; the kernel's own run is the GPU's and is not seen here) into memory, and
 * writes the file when it is destroyed or aborted (weft_trace_flush): nothing is written on the
 * operation's path. At most WEFT_TRACE_MAX_OPS operations are kept; later ones are counted.
 *
 * WEFT_TRACE_FILE expands %r (the rank in the communicator), %n (its size), %h (host), %p (pid)
 * and %c (the communicator's hash, for programs with several communicators per rank). Times in
 * the file are CLOCK_REALTIME microseconds, so files from several hosts line up as far as their
 * clocks agree. Thread-safe: a communicator's records are taken under its trace's lock.
 *
 * The times an operation's record gives (struct weft_trace_op) are the executor's one
 * per-operation record (exec/sig.h, struct weft_op_rec), read on CLOCK_MONOTONIC (weft_time_ns,
 * fifo.h): the trace converts them to CLOCK_REALTIME with the offset between the two clocks
 * taken when the communicator's trace is created.
 */
#ifndef WEFT_CORE_TRACE_H
#define WEFT_CORE_TRACE_H

#include <stdint.h>

#include "nccl.h"

struct ncclComm;
struct weft_trace;

/* Nonzero when WEFT_TRACE_FILE is set (read once). */
int weft_trace_enabled(void);

/* The communicator's trace (created on first use; NULL when tracing is off or memory is short). */
struct weft_trace *weft_trace_get(struct ncclComm *comm);

/* One operation: api (public name), collective, count, datatype (ncclDataType_t), algorithm
 * (enum weft_algo or -1), nch lane end times lane_end_ns[nch] (may be NULL when nch is 0),
 * device 1 for the CUDA executor (then start_ns is the launch and end_ns 0). Times:
 * CLOCK_MONOTONIC nanoseconds (see above). */
struct weft_trace_op {
    const char *api;
    int coll, dtype, algo, root, device, nch;
    uint64_t seq, count;
    uint64_t enq_ns, start_ns, end_ns;
    const uint64_t *lane_end_ns;
};
void weft_trace_record(struct ncclComm *comm, const struct weft_trace_op *op);

/* Writes the file (if anything was recorded) and frees the trace. Called once by the
 * communicator's teardown; the error, if any, is logged (a trace never fails a destroy). */
void weft_trace_flush(struct ncclComm *comm);

#endif
