/*
 * Fault injection (WEFT_FAULT), for tests and for users who want to see how their job fails.
 *
 *   WEFT_FAULT=SPEC[,SPEC...]     SPEC = KIND[:KEY=VALUE]...     (at most WEFT_FAULT_MAX specs)
 *
 *   kill:op=N[:rank=R]                rank R raises SIGKILL on itself when it issues its operation
 *                                     N (1-based, every collective or send/recv counts)
 *   alloc:op=N[:rank=R]               the first executor allocation of rank R's operation N fails,
 *                                     as if memory ran out (the executor's own error path)
 *   stall:sec=S[:rank=R][:peer=P][:frame=K]
 *                                     the socket proxy of rank R sleeps S seconds before its K-th
 *                                     data frame to peer P (default 1st); the thread serves nothing
 *                                     else meanwhile
 *   drop[:rank=R][:peer=P][:frame=K]  that data frame is never sent
 *   corrupt[:rank=R][:peer=P][:frame=K]
 *                                     that data frame's header has one bit flipped (the receiver's
 *                                     check word catches it; payloads carry no checksum: TCP's
 *                                     covers the wire, and one of ours would cost a pass over
 *                                     every byte)
 *   note[:rank=R][:peer=P][:n=K]      rank R's K-th note (exec/sig.h: where it waits, a mismatch)
 *                                     to peer P (default 1st) fails as if P did not answer in time
 *   devalloc:n=N                      the N-th emulated device allocation of the process fails
 *   launch:n=N                        the N-th emulated kernel launch of the process fails (701)
 *
 * rank and peer are ranks of the communicator at the hook; omitted, any. Each spec fires once per
 * process. The value is parsed once; a bad one fails ncclCommInitRank with ncclInvalidArgument.
 *
 * Call sites test WEFT_FAULT_ARMED() first: one load and a predictable branch while no fault is
 * set. The hooks below are the slow path; any thread may call them.
 */
#ifndef WEFT_CORE_FAULT_H
#define WEFT_CORE_FAULT_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

enum weft_fault_kind {
    WEFT_FAULT_KILL = 1,
    WEFT_FAULT_ALLOC,
    WEFT_FAULT_STALL,
    WEFT_FAULT_DROP,
    WEFT_FAULT_CORRUPT,
    WEFT_FAULT_DEVALLOC,
    WEFT_FAULT_LAUNCH,
    WEFT_FAULT_NOTE,
};

#define WEFT_FAULT_MAX 16

struct weft_fault {
    int kind;    /* enum weft_fault_kind */
    int rank;    /* -1: any */
    int peer;    /* -1: any */
    int64_t n;   /* operation (kill, alloc), frame (stall, drop, corrupt) or call number, >= 1 */
    int64_t sec; /* stall */
    /* state while armed */
    int64_t seen;
    int fired;
};

/*
 * Pure: parses `spec` into faults[0 .. max-1] and returns how many (0 for an empty string), or -1
 * with the reason in err (a NUL-terminated message of at most errlen bytes).
 */
int weft_fault_parse(const char *spec, struct weft_fault *faults, int max, char *err,
                     size_t errlen);

/* 0: not read yet, 1: no fault set, 2: faults armed. */
extern int weft_fault_state;
#define WEFT_FAULT_ARMED()                                                                         \
    __builtin_expect(__atomic_load_n(&weft_fault_state, __ATOMIC_RELAXED) != 1, 0)

/* Reads WEFT_FAULT (once); ncclInvalidArgument with a message when it does not parse. */
ncclResult_t weft_fault_check(void);
/* Rank `rank` issues an operation: kill (does not return) or arm alloc. */
void weft_fault_op(int rank);
/* 1 when this executor allocation must fail. */
int weft_fault_alloc(void);
/* Rank `rank`'s proxy sends a data frame to `peer`: 0, WEFT_FAULT_DROP or WEFT_FAULT_CORRUPT;
 * a stall sleeps here first. */
int weft_fault_frame(int rank, int peer);
/* 1 when rank `rank`'s note to `peer` must fail (exec/sig.c). */
int weft_fault_note(int rank, int peer);
/* 1 when this call (WEFT_FAULT_DEVALLOC or WEFT_FAULT_LAUNCH) must fail. */
int weft_fault_call(int kind);

#endif
