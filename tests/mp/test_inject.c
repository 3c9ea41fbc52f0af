/*
 * Injected faults (WEFT_FAULT, src/core/fault.h) end in a clear error or a correct result, never a
 * hang or a crash of a healthy rank. Each case forks its ranks; every rank runs NOPS all-reduces
 * and checks each result element by element against the sum it computes itself, until one fails.
 * WEFT_FAULT (and NCCL_SHM_DISABLE, WEFT_TIMEOUT) come from the environment (tests/mp/meson.build):
 *
 *   kill      kill:rank=1:op=3, 3 ranks: rank 1 dies of SIGKILL at operation 3; ops 1-2 are
 *             correct everywhere, and on the others op 3 (over sockets op 2 or 3: rank 1 may take
 *             data it posted for op 2 with it) fails with ncclRemoteError naming peer 1 (its exit,
 *             or its connection closing) and the operation within 5 s
 *   alloc     alloc:rank=1:op=2, 3 ranks: rank 1's op 2 fails (ncclSystemError, "out of memory"),
 *             it aborts and exits; the others' op 2 fails naming peer 1's exit and operation 2
 *   stall     stall:rank=1:peer=0:frame=3:sec=2 over sockets, WEFT_TIMEOUT=20: every op is
 *             correct, and the run took the 2 s of the stall
 *   stall-long  ...:sec=8, WEFT_TIMEOUT=2: an op fails on rank 0 with "no progress" naming peer 1
 *             within 5 s; the ops before it are correct; rank 1 fails too (no hang)
 *   drop      drop:rank=1:peer=0:frame=3 over sockets, WEFT_TIMEOUT=3: an op fails on both ranks,
 *             rank 0's error names peer 1, within 8 s
 *   corrupt   corrupt:rank=1:peer=0:frame=3 over sockets, WEFT_TIMEOUT=30: rank 0's op fails in
 *             under 5 s (not at the deadline) with the bad check word and peer 1 named
 *   bad-spec  WEFT_FAULT=explode: init fails with ncclInvalidArgument naming WEFT_FAULT
 * Usage: test_inject CASE
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "../common/id_pipe.h"
#include "../common/time_scale.h"
#include "mp_test.h"

#define NOPS 6
#define COUNT 65536

struct expect {
    const char *name;
    int nranks;
    int fail_op;       /* the op that fails on the healthy ranks: 0 none, -1 some op */
    int victim_killed; /* rank 1 dies of SIGKILL */
    double max_s;      /* the failing op's bound on the healthy rank 0 */
    const char *says;  /* rank 0's message contains this (and "peer 1") */
};

static const struct expect cases[] = {
    {"kill", 3, 3, 1, 5, "peer 1"}, /* shm: "exited"; sockets: the connection closed */
    {"alloc", 3, 2, 0, 8, "exited"},
    {"stall", 2, 0, 0, 0, NULL},
    {"stall-long", 2, -1, 0, 5, "no progress"},
    {"drop", 2, -1, 0, 8, "peer 1"},
    {"corrupt", 2, -1, 0, 5, "check word"},
};

/* Runs the ops; returns the first failing op (0: all correct) with its result and duration. */
static char g_msg[1024]; /* ncclGetLastError right after the failing op */

static int run_ops(ncclComm_t comm, int rank, int nranks, float *buf, ncclResult_t *res_p,
                   double *dt_p, int *wrong_p)
{
    for (int op = 1; op <= NOPS; op++) {
        for (int i = 0; i < COUNT; i++)
            buf[i] = (float)((rank + 1) * (i % 7 + 1) + op);
        double t0 = now_s();
        ncclResult_t res = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL);
        *dt_p = now_s() - t0;
        *res_p = res;
        if (res != ncclSuccess) {
            snprintf(g_msg, sizeof(g_msg), "%s", ncclGetLastError(NULL));
            return op;
        }
        for (int i = 0; i < COUNT; i++) {
            float want = (float)(nranks * (nranks + 1) / 2 * (i % 7 + 1) + nranks * op);
            if (buf[i] != want && (*wrong_p)++ < 5)
                fprintf(stderr, "rank %d op %d: element %d is %g, expected %g\n", rank, op, i,
                        buf[i], want);
        }
    }
    return 0;
}

static int rank_main(const struct expect *e, int rank, ncclUniqueId id)
{
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, e->nranks, id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    static float buf[COUNT];
    ncclResult_t res = ncclSuccess;
    double dt = 0, t0 = now_s();
    int wrong = 0;
    int failed = run_ops(comm, rank, e->nranks, buf, &res, &dt, &wrong);
    double total = now_s() - t0;
    const char *msg = g_msg;
    EXPECT(wrong == 0, "rank %d: %d wrong elements before op %d", rank, wrong, failed);
    if (failed != 0)
        fprintf(stderr, "rank %d: op %d failed with %d after %.1f s: %s\n", rank, failed, res,
                dt, msg);
    if (strcmp(e->name, "alloc") == 0 && rank == 1) {
        EXPECT(failed == 2 && res == ncclSystemError && strstr(msg, "out of memory") != NULL,
               "rank 1: op %d gave %d: %s", failed, res, msg);
        ncclCommAbort(comm);
        return g_failed;
    }
    if (e->fail_op == 0) {
        EXPECT(failed == 0, "rank %d: op %d failed: %d %s", rank, failed, res, msg);
        if (strcmp(e->name, "stall") == 0 && rank == 0)
            EXPECT(total > 1.8, "rank 0: %.1f s: the 2 s stall did not happen", total);
    } else {
        /* Over sockets a killed rank may take data it had posted for op N - 1 with it. */
        int lo = e->victim_killed ? e->fail_op - 1 : e->fail_op;
        EXPECT(e->fail_op < 0 ? failed > 0 : failed >= lo && failed <= e->fail_op,
               "rank %d: failing op %d, expected %d", rank, failed, e->fail_op);
        char op_text[32];
        snprintf(op_text, sizeof(op_text), "(operation %d)", failed);
        /* The last error is the process's: a proxy thread's warning about the same peer
         * ("socket connection ... closed") may land between the op's and our look. */
        EXPECT(strstr(msg, op_text) != NULL || strstr(msg, "socket connection") != NULL,
               "rank %d: message does not name %s: %s", rank, op_text, msg);
        EXPECT(res == ncclRemoteError || res == ncclSystemError, "rank %d: op gave %d", rank,
               res);
        if (rank == 0) {
            EXPECT(strstr(msg, "peer 1") != NULL && strstr(msg, e->says) != NULL,
                   "rank 0: message names neither peer 1 nor \"%s\": %s", e->says, msg);
            EXPECT(dt < e->max_s, "rank 0: the fault took %.1f s (at most %.0f)", dt, e->max_s);
        }
    }
    if (failed == 0) {
        ncclCommDestroy(comm); /* hands the last data to the peers */
    } else {
        sleep(1); /* stay alive: the other healthy ranks must see the fault, not our exit */
        ncclCommAbort(comm);
    }
    return g_failed;
}

struct inject_run {
    const struct expect *e;
    struct weft_test_id_pipe ip;
};

static int inject_rank(int r, void *arg)
{
    struct inject_run *run = arg;
    ncclUniqueId id;
    return weft_test_id_pipe_recv(&run->ip, &id) != 0 ? 3 : rank_main(run->e, r, id);
}

int main(int argc, char **argv)
{
    const char *c = argc == 2 ? argv[1] : "";
    if (strcmp(c, "bad-spec") == 0) {
        ncclComm_t comm = NULL;
        ncclResult_t res = ncclCommInitAll(&comm, 1, NULL);
        const char *msg = ncclGetLastError(NULL);
        EXPECT(res == ncclInvalidArgument, "init with WEFT_FAULT=%s returned %d",
               getenv("WEFT_FAULT"), res);
        EXPECT(strstr(msg, "WEFT_FAULT") != NULL, "message: %s", msg);
        printf("%d passed, %d failed\n", !g_failed, g_failed);
        return g_failed;
    }
    const struct expect *e = NULL;
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++)
        if (strcmp(c, cases[i].name) == 0)
            e = &cases[i];
    if (e == NULL) {
        fprintf(stderr, "usage: %s kill|alloc|stall|stall-long|drop|corrupt|bad-spec\n", argv[0]);
        return 2;
    }
    struct inject_run run = {.e = e};
    ncclUniqueId id;
    if (weft_test_id_pipe_open(&run.ip) != 0)
        return 1;
    pid_t pids[8];
    /* a hang fails the case (SIGALRM) */
    int bad = mp_fork_ranks(e->nranks, weft_test_scaled(40), inject_rank, &run, pids) != 0;
    if (!bad)
        weft_test_id_pipe_send(&run.ip, e->nranks, &id);
    for (int r = 0; r < e->nranks; r++)
        bad += !mp_wait_rank(pids[r], r, r == 1 && e->victim_killed);
    return mp_result(NULL, bad);
}
