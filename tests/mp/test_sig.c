/*
 * Signature check and hang report (exec/sig.h). Each case forks its ranks; rank 0 (or the last
 * rank) calls something else than the others after one good all-reduce (#1):
 *
 *   count, dtype, op, root, coll, group: 3 ranks; rank 0 differs in the count (1000 against
 *       100000), the datatype (float against int32: the same bytes), the op (max against sum),
 *       the broadcast root (1 against 0: no data moves at all), the collective (all-gather against
 *       all-reduce), or the count of the second all-reduce of a fused group. Every rank's call
 *       fails with ncclInvalidUsage within a few seconds (WEFT_TIMEOUT=60), and its message names
 *       rank 0's call and the others' call; no rank's buffer is changed by a mismatched slice.
 *   group-many, group-many-early: a group of 200 all-reduces (fusion off), rank 0's 150th (50th)
 *       in int32 instead of float: the failure names that operation on every rank, though the
 *       group holds more operations than the recent history (WEFT_SIG_HISTORY) keeps, and nothing
 *       of it lands in the outputs.
 *   group-alike: rank 0 groups three all-reduces, the others do not: the same failure, naming
 *       rank 0's fusion agreement (ranks must group alike; docs/algorithms.md "Fusion").
 *   p2p: rank 0 sends 100 floats to rank 1, which receives 200: rank 1's call fails naming its
 *       call (rank 0 may already be done: a send ends once its data is out).
 *   skip: 4 ranks; rank 3 skips all-reduce #2 (it sleeps, then aborts). The others fail at the
 *       deadline (WEFT_TIMEOUT=3) with a message naming rank 3 as the one that did not enter #2,
 *       and each prints a hang report (rank 0's with the job summary).
 *   skip-next: rank 3 skips #2 (4096 elements) and calls the next all-reduce (8192): its #2 is
 *       the others' #3, so every rank fails at once naming both calls.
 *   report: WEFT_HANG_REPORT=1; the last rank joins all-reduce #2 2.5 s late: the others print a
 *       report naming the operation, and the all-reduce still succeeds with the right sum;
 *       weftCommHangReport with nothing in flight lists the recent operations.
 *   check-off: WEFT_CHECK=0 with mismatched counts: the older slice-size check still fails it.
 *
 * Usage: test_sig CASE
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "weft.h"
#include "../common/id_pipe.h"
#include "mp_test.h"

/* What this rank wrote to stderr so far (malloc'd). */
static char *captured(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = calloc(1, 1 << 20);
    if (f != NULL && buf != NULL) {
        size_t n = fread(buf, 1, (1 << 20) - 1, f);
        buf[n] = 0;
    }
    if (f != NULL)
        fclose(f);
    return buf;
}

#define N_BIG 100000
#define GROUP_MANY 200 /* operations of the group-many cases (more than WEFT_SIG_HISTORY) */

/* A mismatch case: every rank's call fails at once naming rank 0's call and the others'. */
static void expect_mismatch(int rank, ncclResult_t res, double dt, const char *mine,
                            const char *theirs)
{
    const char *msg = ncclGetLastError(NULL);
    EXPECT(res == ncclInvalidUsage, "rank %d: mismatched call returned %d (%s)", rank, res, msg);
    char want0[256], want1[256];
    snprintf(want0, sizeof(want0), "rank 0 called %s", mine);
    snprintf(want1, sizeof(want1), "called %s", theirs);
    EXPECT(strstr(msg, want0) != NULL && strstr(msg, want1) != NULL,
           "rank %d: message does not name both calls (\"%s\", \"%s\"): %s", rank, want0, want1,
           msg);
    EXPECT(dt < 10, "rank %d: the mismatch took %.1f s", rank, dt);
}

static int rank_main(const char *c, int rank, int nranks, ncclUniqueId id, const char *errpath)
{
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) {
        dprintf(g_fail_fd, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    float *buf = calloc(4 * N_BIG, sizeof(float));
    float *out = calloc(4 * N_BIG, sizeof(float));
    /* rank r contributes 2^r: a sum shows whose data it holds */
    for (int i = 0; i < 4 * N_BIG; i++)
        buf[i] = (float)(1 << rank);
    /* dtype, op: #1 has #2's count, so that only the datatype (the op) tells rank 0's #2 from #1:
     * the signature hash keeps the last call's prefix (exec/sig.c), which must not be reused. */
    size_t warm_n = strcmp(c, "dtype") == 0 || strcmp(c, "op") == 0 ? N_BIG : 4096;
    ncclResult_t warm = ncclAllReduce(buf, out, warm_n, ncclFloat, ncclSum, comm, NULL);
    if (warm != ncclSuccess) {
        dprintf(g_fail_fd, "rank %d: warm-up all-reduce gave %d: %s\n", rank, warm,
                ncclGetLastError(NULL));
        return 1;
    }
    for (size_t i = 0; i < warm_n; i++)
        if (out[i] != (float)((1 << nranks) - 1)) {
            dprintf(g_fail_fd, "rank %d: warm-up all-reduce out[%zu] = %g\n", rank, i, out[i]);
            return 1;
        }
    memset(out, 0, 4 * N_BIG * sizeof(float));
    double t0 = now_s();
    ncclResult_t res = ncclSuccess;
    const char *sum = "ncclAllReduce(count 100000, float, sum) #2";
    if (strcmp(c, "count") == 0) {
        res = ncclAllReduce(buf, out, rank == 0 ? 1000 : N_BIG, ncclFloat, ncclSum, comm, NULL);
        expect_mismatch(rank, res, now_s() - t0, "ncclAllReduce(count 1000, float, sum) #2", sum);
    } else if (strcmp(c, "dtype") == 0) {
        res = ncclAllReduce(buf, out, N_BIG, rank == 0 ? ncclInt32 : ncclFloat, ncclSum, comm,
                            NULL);
        expect_mismatch(rank, res, now_s() - t0, "ncclAllReduce(count 100000, int32, sum) #2", sum);
    } else if (strcmp(c, "op") == 0) {
        res = ncclAllReduce(buf, out, N_BIG, ncclFloat, rank == 0 ? ncclMax : ncclSum, comm, NULL);
        expect_mismatch(rank, res, now_s() - t0, "ncclAllReduce(count 100000, float, max) #2", sum);
    } else if (strcmp(c, "root") == 0) {
        res = ncclBroadcast(buf, out, 1000, ncclFloat, rank == 0 ? 1 : 0, comm, NULL);
        expect_mismatch(rank, res, now_s() - t0, "ncclBroadcast(count 1000, float, root 1) #2",
                        "ncclBroadcast(count 1000, float, root 0) #2");
    } else if (strcmp(c, "coll") == 0) {
        if (rank == 0)
            res = ncclAllGather(buf, out, 1000, ncclFloat, comm, NULL);
        else
            res = ncclAllReduce(buf, out, 1000, ncclFloat, ncclSum, comm, NULL);
        expect_mismatch(rank, res, now_s() - t0, "ncclAllGather(count 1000, float) #2",
                        "ncclAllReduce(count 1000, float, sum) #2");
    } else if (strcmp(c, "group") == 0) {
        /* every rank fuses its three all-reduces into one (#2 is the fusion agreement); rank
         * 0's second has another count, so the fused operations differ */
        ncclGroupStart();
        ncclAllReduce(buf, out, 100, ncclFloat, ncclSum, comm, NULL);
        ncclAllReduce(buf + 100, out + 100, rank == 0 ? 60 : 50, ncclFloat, ncclSum, comm, NULL);
        ncclAllReduce(buf + 200, out + 200, 25, ncclFloat, ncclSum, comm, NULL);
        res = ncclGroupEnd();
        expect_mismatch(rank, res, now_s() - t0,
                        "ncclAllReduce(count 185, float, sum; 3 fused) #3",
                        "ncclAllReduce(count 175, float, sum; 3 fused) #3");
    } else if (strncmp(c, "group-many", 10) == 0) {
        int odd = strcmp(c, "group-many") == 0 ? 149 : 49; /* 0-based: the 150th, the 50th */
        ncclGroupStart();
        for (int k = 0; k < GROUP_MANY; k++)
            ncclAllReduce(buf + 64 * k, out + 64 * k, 64,
                          rank == 0 && k == odd ? ncclInt32 : ncclFloat, ncclSum, comm, NULL);
        res = ncclGroupEnd();
        char mine[128], theirs[128];
        /* #1 is the warm-up: the k-th of the group (0-based) is #k+2 */
        snprintf(mine, sizeof(mine), "ncclAllReduce(count 64, int32, sum) #%d", odd + 2);
        snprintf(theirs, sizeof(theirs), "ncclAllReduce(count 64, float, sum) #%d", odd + 2);
        expect_mismatch(rank, res, now_s() - t0, mine, theirs);
        /* Other operations of the group may have run (whole or in part): only the mismatched
         * one's output is checked, as below. */
        int wrong = 0;
        for (int i = 64 * odd; i < 64 * (odd + 1); i++)
            wrong += rank == 0 ? out[i] != 0.0f && out[i] != 1.0f : ((int)out[i] & 1) != 0;
        EXPECT(wrong == 0, "rank %d: %d output elements hold data of the mismatched operation",
               rank, wrong);
    } else if (strcmp(c, "group-alike") == 0) {
        /* rank 0 groups three all-reduces (an agreement first, #2), the others issue them one
         * by one: every rank fails at once naming the agreement and the first all-reduce */
        if (rank == 0)
            ncclGroupStart();
        for (int k = 0; k < 3 && res == ncclSuccess; k++)
            res = ncclAllReduce(buf + 100 * k, out + 100 * k, 100, ncclFloat, ncclSum, comm, NULL);
        if (rank == 0)
            res = ncclGroupEnd();
        expect_mismatch(rank, res, now_s() - t0, "ncclAllReduce(count 3, uint8, max) #2",
                        "ncclAllReduce(count 100, float, sum) #2");
    } else if (strcmp(c, "p2p") == 0) {
        if (rank == 0)
            res = ncclSend(buf, 100, ncclFloat, 1, comm, NULL);
        if (rank != 1)
            sleep(2); /* over sockets a local rank that exits looks crashed to one still waiting */
        else if (rank == 1) {
            res = ncclRecv(out, 200, ncclFloat, 0, comm, NULL);
            const char *msg = ncclGetLastError(NULL);
            EXPECT(res == ncclInvalidUsage, "rank 1: mismatched receive returned %d", res);
            EXPECT(strstr(msg, "rank 1 called ncclRecv(count 200, float, peer 0) #1") != NULL &&
                       strstr(msg, "rank 0 ") != NULL,
                   "rank 1: message: %s", msg);
            EXPECT(out[0] == 0.0f, "rank 1: the mismatched slice was consumed (%g)", out[0]);
        }
    } else if (strcmp(c, "skip") == 0 || strcmp(c, "skip-next") == 0) {
        int next = strcmp(c, "skip-next") == 0;
        if (rank == nranks - 1 && !next) {
            sleep(7);
            ncclCommAbort(comm);
            return 0;
        }
        /* skip-next: the others call #2 with 4096 elements and #3 with 8192; the last rank skips
         * #2, so its #2 is their #3 */
        res = ncclAllReduce(buf, out, rank == nranks - 1 ? 8192 : 4096, ncclFloat, ncclSum, comm,
                            NULL);
        double dt = now_s() - t0;
        const char *msg = ncclGetLastError(NULL);
        if (next) {
            EXPECT(res == ncclInvalidUsage &&
                       strstr(msg, "called ncclAllReduce(count 4096, float, sum) #2") != NULL &&
                       strstr(msg, "rank 3 called ncclAllReduce(count 8192, float, sum) #2") != NULL,
                   "rank %d: skipped operation gave %d: %s", rank, res, msg);
            EXPECT(dt < 10, "rank %d: took %.1f s", rank, dt);
        } else {
            EXPECT(res == ncclRemoteError, "rank %d: skipped operation gave %d", rank, res);
            EXPECT(strstr(msg, "rank 3 did not enter ncclAllReduce(count 4096, float, sum) #2") !=
                       NULL,
                   "rank %d: message does not name rank 3: %s", rank, msg);
            EXPECT(dt > 2.5 && dt < 6, "rank %d: failed after %.1f s (WEFT_TIMEOUT=3)", rank, dt);
            char *err = captured(errpath);
            EXPECT(err != NULL && strstr(err, "weft hang report (deadline)") != NULL &&
                       strstr(err, "stuck: ncclAllReduce(count 4096, float, sum) #2") != NULL,
                   "rank %d: no hang report on stderr", rank);
            EXPECT(err != NULL && (rank != 0 || strstr(err, "job summary: rank 3 did not say") !=
                                                    NULL),
                   "rank 0: no job summary naming rank 3");
            free(err);
        }
        ncclCommAbort(comm);
        return g_failed;
    } else if (strcmp(c, "report") == 0) {
        if (rank == nranks - 1)
            usleep(2500000);
        res = ncclAllReduce(buf, out, 4096, ncclFloat, ncclSum, comm, NULL);
        EXPECT(res == ncclSuccess, "rank %d: late rank's all-reduce gave %d", rank, res);
        int wrong = 0;
        for (int i = 0; i < 4096; i++)
            wrong += out[i] != (float)((1 << nranks) - 1);
        EXPECT(wrong == 0, "rank %d: %d wrong elements", rank, wrong);
        EXPECT(weftCommHangReport(comm) == ncclSuccess, "rank %d: weftCommHangReport", rank);
        char *err = captured(errpath);
        if (rank != nranks - 1)
            EXPECT(strstr(err, "weft hang report (WEFT_HANG_REPORT)") != NULL &&
                       strstr(err, "stuck: ncclAllReduce(count 4096, float, sum) #2") != NULL,
                   "rank %d: no report while waiting for the late rank:\n%s", rank, err);
        EXPECT(strstr(err, "weft hang report (requested)") != NULL &&
                   strstr(err, "no operation in flight") != NULL &&
                   strstr(err, "ncclAllReduce(count 4096, float, sum) #2: done") != NULL,
               "rank %d: weftCommHangReport printed no history:\n%s", rank, err);
        free(err);
        res = ncclSuccess;
    } else if (strcmp(c, "check-off") == 0) {
        res = ncclAllReduce(buf, out, rank == 0 ? 4000 : 4096, ncclFloat, ncclSum, comm, NULL);
        const char *msg = ncclGetLastError(NULL);
        int found = res == ncclInvalidUsage && strstr(msg, "count or datatype differ") != NULL;
        int left = res == ncclRemoteError && strstr(msg, "peer") != NULL;
        EXPECT(found || left, "rank %d: WEFT_CHECK=0, mismatched counts gave %d: %s", rank, res,
               msg);
    } else {
        dprintf(g_fail_fd, "unknown case %s\n", c);
        return 2;
    }
    if (res != ncclSuccess && strcmp(c, "p2p") != 0 && strcmp(c, "root") != 0 &&
        strncmp(c, "group-many", 10) != 0) {
        /* Nothing of a mismatched slice may land in the output: rank 0 (alone with its call)
         * holds only its own 1s, the others only even sums (rank 0's bit clear). */
        int wrong = 0;
        for (int i = 0; i < 4 * N_BIG; i++)
            wrong += rank == 0 ? out[i] != 0.0f && out[i] != 1.0f : ((int)out[i] & 1) != 0;
        EXPECT(wrong == 0 || strcmp(c, "check-off") == 0,
               "rank %d: %d output elements hold data of a mismatched operation", rank, wrong);
    }
    if (res == ncclSuccess) {
        ncclCommDestroy(comm);
    } else {
        sleep(1); /* stay reachable while the others hear of the mismatch */
        ncclCommAbort(comm);
    }
    free(buf);
    free(out);
    return g_failed;
}

struct sig_run {
    const char *c;
    int nranks;
    struct weft_test_id_pipe ip; /* fork before the id's thread exists (ThreadSanitizer) */
    char paths[4][64];
};

/* A rank: fd 2 goes to its capture file (the parent shows it on failure), FAIL lines to the
 * real stderr. */
static int sig_rank(int r, void *arg)
{
    struct sig_run *run = arg;
    g_fail_fd = dup(2);
    int fd = open(run->paths[r], O_CREAT | O_TRUNC | O_RDWR, 0600);
    dup2(fd, 2);
    close(fd);
    ncclUniqueId id;
    if (weft_test_id_pipe_recv(&run->ip, &id) != 0)
        return 3;
    return rank_main(run->c, r, run->nranks, id, run->paths[r]);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s count|dtype|op|root|coll|group|group-many|group-many-early|"
                        "group-alike|p2p|skip|skip-next|report|check-off\n", argv[0]);
        return 2;
    }
    const char *c = argv[1];
    int nranks = strncmp(c, "skip", 4) == 0 ? 4 : 3;
    setenv("WEFT_TIMEOUT", strcmp(c, "skip") == 0 ? "3" : "60", 1);
    if (strcmp(c, "report") == 0)
        setenv("WEFT_HANG_REPORT", "1", 1);
    if (strcmp(c, "check-off") == 0)
        setenv("WEFT_CHECK", "0", 1);
    if (strncmp(c, "group-many", 10) == 0)
        setenv("WEFT_FUSE_BYTES", "0", 1); /* 200 operations, not one fused */
    struct sig_run run = {.c = c, .nranks = nranks};
    if (weft_test_id_pipe_open(&run.ip) != 0)
        return 1;
    pid_t pids[4];
    for (int r = 0; r < nranks; r++)
        snprintf(run.paths[r], sizeof(run.paths[r]), "/tmp/weft-test-sig-%d-%d.err", (int)getpid(),
                 r);
    int bad = mp_fork_ranks(nranks, 40, sig_rank, &run, pids) != 0;
    if (!bad) {
        ncclUniqueId id;
        bad = weft_test_id_pipe_send(&run.ip, nranks, &id) != 0;
    }
    for (int r = 0; r < nranks; r++) {
        int ok = mp_wait_rank(pids[r], r, 0);
        if (!ok || getenv("WEFT_TEST_SHOW") != NULL) {
            fprintf(stderr, "rank %d: its stderr:\n", r);
            char *err = captured(run.paths[r]);
            fprintf(stderr, "%s\n", err != NULL ? err : "");
            free(err);
        }
        bad += !ok;
        unlink(run.paths[r]);
    }
    return mp_result(c, bad);
}
