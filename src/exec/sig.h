/*
 * Operation signatures and the hang report (both executors).
 *
 * Signature check (WEFT_CHECK, on by default). Every operation of a communicator gets a signature:
 * collective, count, datatype, reduction, root (peer for point-to-point) and a sequence number
 * (collectives: the communicator's collective count; point-to-point: the count of sends to /
 * receives from that peer). Its 32-bit hash travels in every slice the operation sends, in the
 * slot header's word beside `bytes` (host path, also through the socket proxy's DATA frames) or
 * in the receive control block (CUDA path): no extra byte or round trip. A receiver compares it
 * with its own before it touches the data, so a mismatch (even one with the same bytes: float
 * against int32, max against sum, another root) is an error, never wrong data. A send's hash is
 * computed as the matching receive computes it (the pair's ranks, in order). A fused run of
 * all-reduces hashes every member, so a group is checked op by op.
 *
 * Naming both calls: the receiver knows only the peer's hash. A rank that finds a mismatch sends
 * its own signature to every rank through the bootstrap (a MISMATCH note); every rank that hears
 * one fails its operation too and answers with its own; each then names itself and the first
 * rank whose call differs from its own ("rank 0 called ncclAllReduce(count 1000, float, sum) #17,
 * rank 2 called ncclAllReduce(count 100000, float, sum) #17"). Notes are read only where an
 * operation waits (every 100 ms of a blocked wait), never on the fast path.
 *
 * Hang report. Each communicator keeps its last WEFT_SIG_HISTORY operations (signature, start
 * and end time), and every operation still in flight however many there are (a group of 200:
 * the ring grows rather than overwrite a record its lanes still use). An operation blocked for a second tells every rank where it is (a STATE note:
 * its operation, the peer it waits on, the last operation it completed); a STATE note for the
 * same collective with another hash is a mismatch too (it catches mismatches that move no data,
 * such as two ranks each waiting for the other's broadcast). At the deadline (WEFT_TIMEOUT),
 * after WEFT_HANG_REPORT seconds without progress (the operation goes on), or on
 * weftCommHangReport, a rank prints one report: the stuck operation, the peer it waits on and
 * for what, the FIFO positions of that connection, what every peer last said, and the ranks that
 * never said they entered the operation; rank 0 adds a summary for the job.
 *
 * Threads: everything here runs in the thread that executes the communicator's operation, except
 * weft_sig_request_report (any thread).
 */
#ifndef WEFT_EXEC_SIG_H
#define WEFT_EXEC_SIG_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;
struct weft_task;
struct weft_conn;

#define WEFT_SIG_HISTORY 64 /* records kept at least (the ring's first size) */
_Static_assert((WEFT_SIG_HISTORY & (WEFT_SIG_HISTORY - 1)) == 0,
               "the record ring is indexed by a mask");
#define WEFT_SIG_NOTE_VERSION 1u

/* What a call was, as every rank describes it (fixed size: it travels in bootstrap notes). */
struct weft_op_sig {
    uint64_t seq;   /* 1, 2, ...; 0: no operation */
    uint64_t count; /* elements (all members of a fused run) */
    int32_t coll;   /* enum weft_coll */
    int32_t dtype;
    int32_t redop;  /* enum weft_red_kind | 0x10 premul | 0x20 postdiv; -1: none */
    int32_t root;   /* root; peer for send/recv; -1 */
    int32_t nfused; /* all-reduces packed into this one (1: not fused) */
    uint32_t hash;  /* what travels on the wire; never 0 (0: unchecked) */
};

/*
 * One entry of a communicator's recent operations: the one record of each operation, for the
 * hang report and the trace file (core/trace.h) alike. Times are CLOCK_MONOTONIC: precise
 * (weft_time_ns) when the operation is traced (its task's enq_ns is set), else the coarse clock
 * (weft_time_coarse_ns: a few ns, against ~20 on the 8 B path).
 */
struct weft_op_rec {
    struct weft_op_sig sig;
    uint64_t start_ns;
    uint64_t end_ns; /* 0 while it runs */
    uint64_t op_seq; /* comm->op_seq when it began (the number older messages give) */
    int failed;
    int precise; /* traced: the precise clock */
};

/* A note one rank sends another through the bootstrap (exec/sig.c). */
struct weft_sig_note {
    uint32_t version; /* WEFT_SIG_NOTE_VERSION */
    uint32_t kind;    /* WEFT_SIG_NOTE_* */
    int32_t rank;
    int32_t waits_on;   /* the peer the sender waits for, -1 */
    int32_t waits_send; /* 1: for buffer space, 0: for data */
    int32_t about;      /* MISMATCH: the rank whose hash differed, -1 */
    struct weft_op_sig cur;  /* the operation the sender is in */
    struct weft_op_sig last; /* the last collective it completed (seq 0: none) */
};

enum { WEFT_SIG_NOTE_STATE = 1, WEFT_SIG_NOTE_MISMATCH = 2 };

/* Per-communicator state; comm->sig, made by weft_sig_init. */
/* Operations whose signature prefixes are cached apart: collectives, sends, receives. */
#define WEFT_SIG_PREFIX_KINDS 3

struct weft_sig_comm {
    uint64_t coll_seq;
    uint64_t *p2p_seq; /* [2 * nranks]: sends to r at 2r, receives from r at 2r + 1 */
    struct weft_op_rec *hist; /* [cap]: record i at i & (cap - 1) (the last cap begun) */
    uint64_t cap;             /* WEFT_SIG_HISTORY, doubled while records in flight fill it:
                               * a power of two */
    uint64_t nhist;
    struct weft_op_sig last_coll; /* the last collective completed */
    struct weft_sig_note *notes;  /* [nranks]: the latest note from each rank (version 0: none) */
    uint8_t *tell;      /* [nranks]: 0xff: has told_seq's STATE note, else the tries that failed */
    uint64_t told_seq;  /* the operation (hist index + 1) whose STATE we send */
    uint64_t reported;  /* the operation (hist index + 1) whose report was printed */
    uint64_t mismatch_seq; /* MISMATCH notes about collectives before this one are old news */
    uint32_t report_req; /* weftCommHangReport asked for one */
    /* The hash of the last unfused collective's, send's and receive's signature without its
     * sequence number (exec/sig.c): a program repeats the same calls (a send/recv pair takes
     * turns), and then only the sequence number is mixed in. */
    struct weft_op_sig prefix_of[WEFT_SIG_PREFIX_KINDS]; /* seq and hash unused; coll -1: none */
    uint64_t prefix[WEFT_SIG_PREFIX_KINDS];
};

ncclResult_t weft_sig_init(struct ncclComm *comm);
void weft_sig_fini(struct ncclComm *comm);

/* 1 when the check is on (WEFT_CHECK). */
int weft_sig_enabled(void);

/*
 * Gives the task its signature (next sequence number) and records its start; returns the index
 * (in comm->sig->hist, modulo comm->sig->cap) through *rec_p. For a fused run, tasks[0 .. n)
 * are the members and *merged the packed all-reduce.
 */
void weft_sig_begin(struct ncclComm *comm, const struct weft_task *tasks, int n,
                    const struct weft_task *merged, uint64_t *rec_p);
/* Records the end of the operation begun as rec. */
void weft_sig_end(struct ncclComm *comm, uint64_t rec, int failed);
/* The most recent recorded operation whose hash is `hash`: 1 and *rec_p, or 0. */
int weft_sig_find(const struct ncclComm *comm, uint32_t hash, uint64_t *rec_p);
/* The most recent recorded operation begun when comm->op_seq was op_seq: 1 and *rec_p, or 0. */
int weft_sig_find_op(const struct ncclComm *comm, uint64_t op_seq, uint64_t *rec_p);
/* The signature of a recorded operation. */
const struct weft_op_sig *weft_sig_of(const struct ncclComm *comm, uint64_t rec);
/* The whole record (its times, for the trace). */
const struct weft_op_rec *weft_sig_rec(const struct ncclComm *comm, uint64_t rec);

/* Writes "ncclAllReduce(count 1000, float, sum) #17" into buf. */
void weft_sig_format(const struct weft_op_sig *sig, char *buf, size_t len);

/* Where a blocked operation waits, for notes and the report. */
struct weft_sig_wait {
    uint64_t rec; /* the blocked operation */
    int peer;     /* the peer it waits on, -1 */
    int send;     /* 1: for buffer space, 0: for data */
    const struct weft_conn *send_conn, *recv_conn; /* of that peer, may be NULL */
};

/*
 * Called every ~100 ms while an operation is blocked (idle_ns without progress): reads notes,
 * tells every rank where this one waits once it has waited a second (or the report is due),
 * prints the report when WEFT_HANG_REPORT or weftCommHangReport asks. A mismatch that a note
 * reveals fails the operation (ncclInvalidUsage, message naming both calls); else ncclSuccess.
 */
ncclResult_t weft_sig_poll(struct ncclComm *comm, const struct weft_sig_wait *w, uint64_t idle_ns);

/*
 * A receiver found peer's hash `got` where its operation rec expected its own: tells every rank,
 * gathers their signatures (up to a second) and fails with a message naming both calls.
 * Returns ncclInvalidUsage.
 */
ncclResult_t weft_sig_mismatch(struct ncclComm *comm, uint64_t rec, int peer, uint32_t got);

/*
 * The deadline passed: tells every rank, gathers their notes (half a second at most), prints the
 * report (the ranks that never entered the operation included) and appends to msg what it found
 * ("; rank 3 did not enter ncclAllReduce #5"). Returns ncclInvalidUsage, having logged both calls,
 * when a note shows the same collective with another signature (a mismatch that moved no data);
 * else ncclSuccess (the caller logs msg).
 */
ncclResult_t weft_sig_deadline(struct ncclComm *comm, const struct weft_sig_wait *w,
                               uint64_t idle_ns, char *msg, size_t len);

/* weftCommHangReport: prints now when no operation runs, else at the executor's next check. */
ncclResult_t weft_sig_request_report(struct ncclComm *comm);

#endif
