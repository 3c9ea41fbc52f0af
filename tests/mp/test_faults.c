/*
 * Faults become errors, never hangs: a peer that exits, a peer that never shows up (deadline),
 * ranks that disagree on the count, and ncclCommAbort from another thread while a collective is
 * stuck. Each case forks its own ranks and checks the error code, that the error names the peer,
 * and that it came within a bound.
 *
 * And the converse: a peer that did its part, destroyed the communicator and exited is not a
 * fault (early-exit): the root of a gather-like exchange still waits for a slow third rank.
 *
 * mismatch-ll: counts whose slices take different FIFOs (32 B takes the LL FIFO, 4 KiB the slot
 * FIFO): over shared memory the mismatch is found at once from the other FIFO, not at the
 * deadline (WEFT_TIMEOUT=30 here); over sockets (NCCL_SHM_DISABLE=1) within 10 s.
 *
 * proto-mismatch: one rank sets another NCCL_PROTO, so its FIFOs are laid out differently: every
 * rank's init fails (one names the difference), none crashes.
 *
 * Usage: test_faults CASE   (dead-peer, timeout, mismatch, mismatch-ll, proto-mismatch, abort,
 *                            early-exit)
 */
#include <pthread.h>
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

struct abort_arg {
    ncclComm_t comm;
    double delay;
};

static void *abort_later(void *p)
{
    struct abort_arg *a = p;
    usleep((useconds_t)(a->delay * 1e6));
    ncclCommAbort(a->comm);
    return NULL;
}

/* What one rank does in each case; returns its exit status (0 = as expected). */
static int rank_main(const char *c, int rank, int nranks, ncclUniqueId id)
{
    ncclComm_t comm;
    if (strcmp(c, "proto-mismatch") == 0) {
        /* the last rank alone without LL FIFOs: every rank's init fails, none crashes or hangs */
        if (rank == nranks - 1)
            setenv("NCCL_PROTO", "Simple", 1);
        double t0 = now_s();
        ncclResult_t res = ncclCommInitRank(&comm, nranks, id, rank);
        EXPECT(res != ncclSuccess, "rank %d: init with another NCCL_PROTO succeeded", rank);
        EXPECT(now_s() - t0 < 20, "rank %d: init took %.1f s", rank, now_s() - t0);
        EXPECT(ncclGetLastError(NULL)[0] != '\0', "rank %d: no message", rank);
        return g_failed;
    }
    if (strcmp(c, "setting-mismatch") == 0) {
        /* WEFT_TEST_MISMATCH=VAR=VALUE on rank 1 only: every rank's init fails, at once, with a
         * message naming VAR and the rank that holds the other value. */
        const char *spec = getenv("WEFT_TEST_MISMATCH");
        char var[64];
        const char *eq = spec != NULL ? strchr(spec, '=') : NULL;
        if (eq == NULL || (size_t)(eq - spec) >= sizeof(var)) {
            fprintf(stderr, "setting-mismatch needs WEFT_TEST_MISMATCH=VAR=VALUE\n");
            return 2;
        }
        memcpy(var, spec, (size_t)(eq - spec));
        var[eq - spec] = 0;
        if (rank == 1)
            setenv(var, eq + 1, 1);
        double t0 = now_s();
        ncclResult_t res = ncclCommInitRank(&comm, nranks, id, rank);
        const char *msg = ncclGetLastError(NULL);
        EXPECT(res == ncclInvalidUsage, "rank %d: init with %s on rank 1 returned %d", rank, spec,
               res);
        EXPECT(now_s() - t0 < 10, "rank %d: init took %.1f s", rank, now_s() - t0);
        EXPECT(strstr(msg, var) != NULL && strstr(msg, "differ") != NULL &&
                   strstr(msg, " ranks 1") != NULL,
               "rank %d: message names neither %s nor rank 1: %s", rank, var, msg);
        return g_failed;
    }
    if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    float buf[4096] = {0};
    /* one good collective first: the communicator works */
    if (ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL) != ncclSuccess)
        return 1;
    int victim = nranks - 1;
    if (strcmp(c, "dead-peer") == 0) {
        if (rank == victim)
            _exit(0); /* gone without a word */
        double t0 = now_s();
        ncclResult_t res = ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL);
        double dt = now_s() - t0;
        const char *msg = ncclGetLastError(NULL);
        EXPECT(res == ncclRemoteError, "rank %d: dead peer gave %d", rank, res);
        EXPECT(strstr(msg, "exited") != NULL && strstr(msg, "ncclAllReduce") != NULL,
               "rank %d: message does not name the exit and the operation: %s", rank, msg);
        EXPECT(dt < 5, "rank %d: dead peer noticed after %.1f s", rank, dt);
        ncclResult_t async;
        ncclCommGetAsyncError(comm, &async);
        EXPECT(async == ncclRemoteError, "rank %d: async error %d", rank, async);
        ncclCommAbort(comm);
    } else if (strcmp(c, "timeout") == 0) {
        /* WEFT_TIMEOUT=2 in the environment; the victim is alive but never joins. */
        if (rank == victim) {
            sleep(8);
            ncclCommAbort(comm);
            return 0;
        }
        double t0 = now_s();
        ncclResult_t res = ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL);
        double dt = now_s() - t0;
        const char *msg = ncclGetLastError(NULL);
        EXPECT(res == ncclRemoteError, "rank %d: stuck peer gave %d", rank, res);
        EXPECT(strstr(msg, "no progress") != NULL && strstr(msg, "peer") != NULL,
               "rank %d: message: %s", rank, msg);
        EXPECT(dt > 1.5 && dt < 5, "rank %d: timed out after %.1f s (WEFT_TIMEOUT=2)", rank, dt);
        sleep(2); /* stay alive: the other survivor must see its own deadline, not our exit */
        ncclCommAbort(comm);
    } else if (strcmp(c, "mismatch") == 0) {
        /* the victim sends more elements than the others expect */
        size_t count = rank == victim ? 4096 : 4000;
        alarm(weft_test_scaled(20));
        ncclResult_t res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
        EXPECT(res != ncclSuccess, "rank %d: mismatched counts succeeded", rank);
        ncclCommAbort(comm);
    } else if (strcmp(c, "mismatch-ll") == 0) {
        /* the victim's 8 floats fit an LL slot; the others' 1024 do not */
        size_t count = rank == victim ? 8 : 1024;
        alarm(weft_test_scaled(20));
        double t0 = now_s();
        ncclResult_t res = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
        double dt = now_s() - t0;
        const char *msg = ncclGetLastError(NULL);
        /* A rank that found the mismatch first may have left before this one looked (its
         * process gone, or its connections closed). */
        int found = res == ncclInvalidUsage && (strstr(msg, "count or datatype differ") != NULL ||
                                                strstr(msg, "differ between ranks") != NULL);
        int left = res == ncclRemoteError && strstr(msg, "peer") != NULL;
        EXPECT(found || left, "rank %d: mismatched counts gave %d: %s", rank, res, msg);
        int proxied = getenv("NCCL_SHM_DISABLE") != NULL;
        EXPECT(dt < (proxied ? 15 : 5), "rank %d: the mismatch took %.1f s (WEFT_TIMEOUT=30)",
               rank, dt);
        ncclCommAbort(comm);
    } else if (strcmp(c, "early-exit") == 0) {
        /* rank 0 receives from 1 and 2; 1 sends, destroys the communicator and exits at once
         * (a zombie until the harness reaps it), 2 sends half a second later */
        if (rank == 0) {
            float in1[64], in2[64];
            ncclGroupStart();
            ncclRecv(in1, 64, ncclFloat, 1, comm, NULL);
            ncclRecv(in2, 64, ncclFloat, 2, comm, NULL);
            ncclResult_t res = ncclGroupEnd();
            EXPECT(res == ncclSuccess, "rank 0: receive after rank 1 left cleanly gave %d: %s", res,
                   ncclGetLastError(NULL));
            EXPECT(res != ncclSuccess || (in1[7] == 1.0f && in2[7] == 2.0f),
                   "rank 0: received %g and %g", in1[7], in2[7]);
            ncclCommDestroy(comm);
        } else {
            float out[64];
            for (int i = 0; i < 64; i++)
                out[i] = (float)rank;
            if (rank == 2)
                usleep(500000);
            EXPECT(ncclSend(out, 64, ncclFloat, 0, comm, NULL) == ncclSuccess, "rank %d: send",
                   rank);
            ncclCommDestroy(comm);
            if (rank == 1)
                _exit(g_failed);
        }
    } else if (strcmp(c, "abort") == 0) {
        /* the victim never joins; the others abort from a second thread */
        if (rank == victim) {
            sleep(3);
            ncclCommAbort(comm);
            return 0;
        }
        pthread_t th;
        struct abort_arg a = {comm, 0.5};
        pthread_create(&th, NULL, abort_later, &a);
        double t0 = now_s();
        ncclResult_t res = ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, NULL);
        double dt = now_s() - t0;
        pthread_join(th, NULL);
        EXPECT(res != ncclSuccess, "rank %d: aborted collective returned success", rank);
        EXPECT(dt < 3, "rank %d: abort took %.1f s", rank, dt);
    }
    return g_failed;
}

struct fault_run {
    const char *c;
    int nranks;
    struct weft_test_id_pipe ip;
};

static int fault_rank(int r, void *arg)
{
    struct fault_run *f = arg;
    ncclUniqueId id;
    return weft_test_id_pipe_recv(&f->ip, &id) != 0 ? 3 : rank_main(f->c, r, f->nranks, id);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr,
                "usage: %s dead-peer|timeout|bad-timeout|mismatch|mismatch-ll|proto-mismatch|"
                "setting-mismatch|abort|early-exit\n",
                argv[0]);
        return 2;
    }
    const char *c = argv[1];
    if (strcmp(c, "bad-timeout") == 0) {
        /* A negative deadline once meant "never" (a cast to unsigned): init refuses it. */
        setenv("WEFT_TIMEOUT", "-5", 1);
        ncclComm_t comm = NULL;
        ncclResult_t res = ncclCommInitAll(&comm, 1, NULL);
        const char *msg = ncclGetLastError(NULL);
        EXPECT(res == ncclInvalidArgument, "init with WEFT_TIMEOUT=-5 returned %d", res);
        EXPECT(msg != NULL && strstr(msg, "WEFT_TIMEOUT") != NULL, "message: %s", msg);
        return mp_result(NULL, g_failed);
    }
    if (strcmp(c, "timeout") == 0)
        setenv("WEFT_TIMEOUT", "2", 1);
    if (strcmp(c, "mismatch-ll") == 0)
        setenv("WEFT_TIMEOUT", "30", 1);
    struct fault_run run = {.c = c, .nranks = 3};
    ncclUniqueId id;
    if (weft_test_id_pipe_open(&run.ip) != 0)
        return 1;
    pid_t pids[3];
    int bad = mp_fork_ranks(run.nranks, weft_test_scaled(30), fault_rank, &run, pids) != 0;
    if (!bad)
        weft_test_id_pipe_send(&run.ip, run.nranks, &id);
    for (int r = 0; r < run.nranks; r++)
        bad += !mp_wait_rank(pids[r], r, 0);
    return mp_result(NULL, bad);
}
