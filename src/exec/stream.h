/*
 * Host streams: a worker thread that runs jobs in issue order, asynchronously to the caller.
 *
 * Users get them through weftStreamCreate (include/weft.h) and pass them where NCCL takes a
 * cudaStream_t; non-blocking communicators own one internally and run all their work on it.
 * A stream handle is recognised through a registry of live streams, never by dereferencing a
 * pointer that might be a real CUDA stream.
 *
 * Ordering across streams on one communicator: every piece of work on a communicator takes a
 * ticket when it is issued (comm->issued) and starts only when every earlier ticket finished
 * (comm->completed), so work runs in issue order whichever threads run it (see
 * weft_comm_ticket_wait).
 */
#ifndef WEFT_EXEC_STREAM_H
#define WEFT_EXEC_STREAM_H

#include <pthread.h>
#include <stdint.h>

#include "nccl.h"

struct weft_job;
typedef ncclResult_t (*weft_job_fn_t)(struct weft_job *job);

/*
 * A unit of work on a stream. The worker calls run(), counts the job as done (so synchronize and
 * query see it), and only then finish(), which releases what the job holds (communicator tickets,
 * memory): whoever waits on those next already sees the stream's work as complete.
 */
struct weft_job {
    struct weft_job *next;
    weft_job_fn_t run;
    void (*finish)(struct weft_job *job, ncclResult_t res);
};

struct weft_stream {
    uint64_t magic;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct weft_job *head, *tail;
    uint64_t enqueued;  /* jobs handed to the stream */
    uint64_t completed; /* jobs finished */
    ncclResult_t error; /* first error of any job (sticky until synchronize reports it) */
    int running;        /* the worker is inside a job's run() */
    int stop;
};

ncclResult_t weft_stream_create(struct weft_stream **stream_p);
/* Waits for queued work, stops the worker, frees. */
ncclResult_t weft_stream_destroy(struct weft_stream *stream);
/* Queues a job; never blocks on the job. */
void weft_stream_enqueue(struct weft_stream *stream, struct weft_job *job);
/*
 * Waits until every job queued so far finished; returns (and clears) the first error. A running
 * job is bounded by its own deadlines; when for WEFT_TIMEOUT seconds jobs were pending and none
 * ran, it fails (ncclSystemError) instead of waiting on.
 */
ncclResult_t weft_stream_synchronize(struct weft_stream *stream);
/* ncclSuccess when idle, ncclInProgress when work is queued or running, or the error. */
ncclResult_t weft_stream_query(struct weft_stream *stream);
/* The live stream behind a user's cudaStream_t, or NULL if it is not one of ours. */
struct weft_stream *weft_stream_lookup(const void *handle);

#endif
