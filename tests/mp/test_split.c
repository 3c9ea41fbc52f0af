/*
 * Multi-process test of ncclCommSplit and ncclCommShrink over the shared-memory transport.
 *
 * Phase 1 forks N ranks that split their communicator in several ways (color rank % 2 and
 * rank % 3 with key -rank, ties on key, NCCL_SPLIT_NOCOLOR, a split of a split), shrink it
 * (excluding rank N-1, and ranks {0, 2} when N >= 4, and a shrink of a child), check each new
 * communicator's size and rank against a reference computed here by counting (not by sorting,
 * as the library does), run an all-reduce and an all-gather on it checked element by element,
 * and check that the parent still works. Bad arguments must fail with ncclInvalidArgument and a
 * message naming the argument.
 *
 * Phase 2 (N >= 2) forks N fresh ranks; rank N-1 kills itself with SIGKILL, the driver reaps it,
 * then the others shrink it away with NCCL_SHRINK_ABORT and use the child.
 *
 * Every element value is a small integer, so float sums are exact in any order.
 *
 * Usage: test_split -n NRANKS [-t SECONDS]
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "../common/id_pipe.h"
#include "../common/time_scale.h"

#define MAX_FAIL_PRINT 20
#define MAX_RANKS 64

struct shared_state {
    int passed;
    int failed;
    int ready;       /* phase 2: survivors that finished their last parent operation */
    int victim_dead; /* phase 2: set by the driver once it reaped the killed rank */
    int leaving[2];  /* per phase: ranks done with every operation */
};

static int g_rank, g_nranks;
static struct shared_state *g_shared;
static int g_printed;

static void count_result(int ok)
{
    __atomic_fetch_add(ok ? &g_shared->passed : &g_shared->failed, 1, __ATOMIC_RELAXED);
}

static void expect(int ok, const char *what, int got, int want)
{
    if (!ok && g_printed++ < MAX_FAIL_PRINT)
        fprintf(stderr, "rank %d: FAIL %s: got %d want %d\n", g_rank, what, got, want);
    count_result(ok);
}

static int check(ncclResult_t res, const char *what)
{
    if (res != ncclSuccess) {
        if (g_printed++ < MAX_FAIL_PRINT)
            fprintf(stderr, "rank %d: FAIL %s: %s (%s)\n", g_rank, what, ncclGetErrorString(res),
                    ncclGetLastError(NULL));
        count_result(0);
        return 0;
    }
    return 1;
}

/*
 * Waits (10 s at most) until `expected` ranks are done before this one exits. A rank that exits
 * right after its last collective can make a peer still finishing that collective report it
 * dead (the executor checks peer pids while it waits), which is not what this test is about.
 */
static void harness_leave(int phase, int expected)
{
    __atomic_fetch_add(&g_shared->leaving[phase], 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 10000 && __atomic_load_n(&g_shared->leaving[phase], __ATOMIC_ACQUIRE) <
                                     expected;
         i++)
        usleep(1000);
}

/* ------------------------------------------------------------------------------------------ */
/* Reference: members of a new communicator, as parent ranks listed by new rank.              */

/* Color rank % m, key -rank: members r' with the same color, largest parent rank first. */
static int ref_split_mod_rev(int n, int m, int color, int *members)
{
    int k = 0;
    for (int r = n - 1; r >= 0; r--)
        if (r % m == color)
            members[k++] = r;
    return k;
}

/* New rank of `r` in a split with color rank % m and key -rank: the same-color ranks above it. */
static int ref_rank_mod_rev(int n, int m, int r)
{
    int k = 0;
    for (int q = r + 1; q < n; q++)
        k += q % m == r % m;
    return k;
}

/* Parent ranks not in exclude[], in order. */
static int ref_shrink(int n, const int *exclude, int nexclude, int *members)
{
    int k = 0;
    for (int r = 0; r < n; r++) {
        int out = 0;
        for (int i = 0; i < nexclude; i++)
            out |= exclude[i] == r;
        if (!out)
            members[k++] = r;
    }
    return k;
}

static int index_of(const int *members, int n, int r)
{
    for (int i = 0; i < n; i++)
        if (members[i] == r)
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Checks on one communicator whose ranks are the parent ranks members[0 .. n-1].             */

static float reduce_value(int parent_rank, size_t i)
{
    return (float)((parent_rank + 1) * (int)(1 + i % 5));
}

static int32_t gather_value(int parent_rank, size_t i)
{
    return (int32_t)(((uint32_t)parent_rank << 20) | (uint32_t)i);
}

static void check_allreduce(ncclComm_t comm, const int *members, int n, int me, size_t count,
                            const char *what)
{
    float *buf = malloc(count * sizeof(float)), *out = malloc((count + 1) * sizeof(float));
    if (buf == NULL || out == NULL) {
        count_result(0);
        free(buf);
        free(out);
        return;
    }
    for (size_t i = 0; i < count; i++)
        buf[i] = reduce_value(members[me], i);
    out[count] = -7.0f;
    int ok = check(ncclAllReduce(buf, out, count, ncclFloat32, ncclSum, comm, NULL), what);
    for (size_t i = 0; i < count && ok; i++) {
        float want = 0;
        for (int j = 0; j < n; j++)
            want += reduce_value(members[j], i);
        if (out[i] != want) {
            if (g_printed++ < MAX_FAIL_PRINT)
                fprintf(stderr, "rank %d: FAIL %s all-reduce count %zu index %zu: got %g want %g\n",
                        g_rank, what, count, i, out[i], want);
            ok = 0;
        }
    }
    if (ok && out[count] != -7.0f) {
        fprintf(stderr, "rank %d: FAIL %s all-reduce wrote past the end\n", g_rank, what);
        ok = 0;
    }
    count_result(ok);
    free(buf);
    free(out);
}

static void check_allgather(ncclComm_t comm, const int *members, int n, int me, size_t count,
                            const char *what)
{
    int32_t *buf = malloc(count * sizeof(int32_t));
    int32_t *out = malloc(((size_t)n * count + 1) * sizeof(int32_t));
    if (buf == NULL || out == NULL) {
        count_result(0);
        free(buf);
        free(out);
        return;
    }
    for (size_t i = 0; i < count; i++)
        buf[i] = gather_value(members[me], i);
    out[(size_t)n * count] = -7;
    int ok = check(ncclAllGather(buf, out, count, ncclInt32, comm, NULL), what);
    for (int j = 0; j < n && ok; j++) {
        for (size_t i = 0; i < count && ok; i++) {
            int32_t got = out[(size_t)j * count + i], want = gather_value(members[j], i);
            if (got != want) {
                if (g_printed++ < MAX_FAIL_PRINT)
                    fprintf(stderr,
                            "rank %d: FAIL %s all-gather block %d index %zu: got 0x%x want 0x%x\n",
                            g_rank, what, j, i, (unsigned)got, (unsigned)want);
                ok = 0;
            }
        }
    }
    if (ok && out[(size_t)n * count] != -7) {
        fprintf(stderr, "rank %d: FAIL %s all-gather wrote past the end\n", g_rank, what);
        ok = 0;
    }
    count_result(ok);
    free(buf);
    free(out);
}

/* Size, rank, then all-reduces and all-gathers of a few sizes. me: this rank's index. */
static void check_comm(ncclComm_t comm, const int *members, int n, int me, const char *what)
{
    int count = -1, rank = -1;
    if (comm == NULL) {
        expect(0, what, 0, 1);
        return;
    }
    int ok = check(ncclCommCount(comm, &count), "ncclCommCount") &&
             check(ncclCommUserRank(comm, &rank), "ncclCommUserRank");
    if (!ok)
        return;
    char msg[128];
    snprintf(msg, sizeof(msg), "%s: ncclCommCount", what);
    expect(count == n, msg, count, n);
    snprintf(msg, sizeof(msg), "%s: ncclCommUserRank", what);
    expect(rank == me, msg, rank, me);
    if (count != n || rank != me)
        return;
    static const size_t reduce_counts[] = {1, 1031, 65543};
    static const size_t gather_counts[] = {1, 1031};
    for (size_t k = 0; k < sizeof(reduce_counts) / sizeof(reduce_counts[0]); k++)
        check_allreduce(comm, members, n, me, reduce_counts[k], what);
    for (size_t k = 0; k < sizeof(gather_counts) / sizeof(gather_counts[0]); k++)
        check_allgather(comm, members, n, me, gather_counts[k], what);
}

static void check_parent(ncclComm_t parent, const char *what)
{
    int members[MAX_RANKS];
    for (int r = 0; r < g_nranks; r++)
        members[r] = r;
    check_allreduce(parent, members, g_nranks, g_rank, 4099, what);
}

/* ------------------------------------------------------------------------------------------ */
/* Bad arguments: local, no communication, clear message, nothing written.                    */

static void expect_invalid(ncclResult_t res, const char *what, const char *word)
{
    const char *err = ncclGetLastError(NULL);
    int ok = res == ncclInvalidArgument && err != NULL && strstr(err, word) != NULL;
    if (!ok && g_printed++ < MAX_FAIL_PRINT)
        fprintf(stderr, "rank %d: FAIL bad argument '%s' returned %d, last error '%s'\n", g_rank,
                what, res, err != NULL ? err : "(null)");
    count_result(ok);
}

static void run_bad_args(ncclComm_t parent)
{
    int n = g_nranks, me = g_rank;
    ncclComm_t sentinel = (ncclComm_t)(uintptr_t)0x1234, nc = sentinel;
    expect_invalid(ncclCommSplit(parent, -5, 0, &nc, NULL), "split color -5", "color");
    expect(nc == sentinel, "split color -5 leaves newcomm alone", 0, 1);
    expect_invalid(ncclCommSplit(parent, -2, me, &nc, NULL), "split color -2", "color");
    expect_invalid(ncclCommSplit(parent, 0, 0, NULL, NULL), "split newcomm NULL", "newcomm");
    expect_invalid(ncclCommSplit(NULL, 0, 0, &nc, NULL), "split comm NULL", "comm");

    int other = (me + 1) % n;
    int self[1] = {me}, range_hi[1] = {n}, range_lo[1] = {-1}, dup[2] = {other, other};
    expect_invalid(ncclCommShrink(parent, self, 0, &nc, NULL, NCCL_SHRINK_DEFAULT),
                   "shrink count 0", "excludeRanksCount");
    expect_invalid(ncclCommShrink(parent, NULL, 1, &nc, NULL, NCCL_SHRINK_DEFAULT),
                   "shrink list NULL", "excludeRanksList");
    expect_invalid(ncclCommShrink(parent, self, 1, &nc, NULL, NCCL_SHRINK_DEFAULT),
                   "excluded rank calls shrink", "excludeRanksList");
    expect_invalid(ncclCommShrink(parent, range_hi, 1, &nc, NULL, NCCL_SHRINK_DEFAULT),
                   "shrink rank nranks", "out of range");
    expect_invalid(ncclCommShrink(parent, range_lo, 1, &nc, NULL, NCCL_SHRINK_ABORT),
                   "shrink rank -1", "out of range");
    expect_invalid(ncclCommShrink(parent, dup, 2, &nc, NULL, NCCL_SHRINK_DEFAULT),
                   "shrink duplicate rank", "twice");
    expect_invalid(ncclCommShrink(parent, range_hi, 1, &nc, NULL, 7), "shrinkFlags 7",
                   "shrinkFlags");
    expect_invalid(ncclCommShrink(parent, range_hi, 1, NULL, NULL, NCCL_SHRINK_DEFAULT),
                   "shrink newcomm NULL", "newcomm");
    expect_invalid(ncclCommShrink(NULL, range_hi, 1, &nc, NULL, NCCL_SHRINK_DEFAULT),
                   "shrink comm NULL", "comm");
    expect(nc == sentinel, "failed calls leave newcomm alone", 0, 1);

    /* A bad config is found by the child's init, on every rank of every color alike. */
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    expect_invalid(ncclCommSplit(parent, me % 2, me, &nc, &bad), "split config magic 0",
                   "NCCL_CONFIG_INITIALIZER");
    bad = (ncclConfig_t)NCCL_CONFIG_INITIALIZER;
    bad.splitShare = 3;
    expect_invalid(ncclCommSplit(parent, 0, me, &nc, &bad), "split config splitShare 3",
                   "splitShare");
    expect(nc == sentinel, "failed splits leave newcomm alone", 0, 1);
}

/* ------------------------------------------------------------------------------------------ */

static int phase1(ncclUniqueId id)
{
    int n = g_nranks, me = g_rank;
    int members[MAX_RANKS], m;
    ncclComm_t parent;
    if (!check(ncclCommInitRank(&parent, n, id, me), "ncclCommInitRank"))
        return 1;
    run_bad_args(parent);
    check_parent(parent, "parent after bad arguments");

    /* Two splits in a row, both kept; then used in the reverse order of creation. */
    ncclComm_t by2 = NULL, by3 = NULL;
    check(ncclCommSplit(parent, me % 2, -me, &by2, NULL), "split color rank%2 key -rank");
    check(ncclCommSplit(parent, me % 3, -me, &by3, NULL), "split color rank%3 key -rank");
    m = ref_split_mod_rev(n, 3, me % 3, members);
    check_comm(by3, members, m, ref_rank_mod_rev(n, 3, me), "split rank%3");
    int members2[MAX_RANKS];
    int m2 = ref_split_mod_rev(n, 2, me % 2, members2);
    int me2 = ref_rank_mod_rev(n, 2, me);
    check_comm(by2, members2, m2, me2, "split rank%2");
    check_parent(parent, "parent after two splits");

    /* Equal keys: parent order. An explicit config with splitShare (accepted, not shared). */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.splitShare = 1;
    cfg.blocking = 1;
    ncclComm_t ties = NULL;
    if (check(ncclCommSplit(parent, me % 2, 0, &ties, &cfg), "split equal keys")) {
        m = 0;
        for (int r = 0; r < n; r++)
            if (r % 2 == me % 2)
                members[m++] = r;
        check_comm(ties, members, m, index_of(members, m, me), "split equal keys");
    }

    /* A non-blocking child: ncclInProgress (or ncclSuccess) at once, then ready when polled. */
    ncclConfig_t nbcfg = NCCL_CONFIG_INITIALIZER;
    nbcfg.blocking = 0;
    ncclComm_t nbc = NULL;
    ncclResult_t nbres = ncclCommSplit(parent, me % 2, -me, &nbc, &nbcfg);
    expect((nbres == ncclSuccess || nbres == ncclInProgress) && nbc != NULL,
           "non-blocking split returns success or in-progress", nbres, ncclInProgress);
    if (nbc != NULL) {
        ncclResult_t state = ncclInProgress;
        for (int i = 0; i < 20000 && state == ncclInProgress; i++) {
            if (ncclCommGetAsyncError(nbc, &state) != ncclSuccess)
                break;
            if (state == ncclInProgress)
                usleep(1000);
        }
        expect(state == ncclSuccess, "non-blocking split completes", state, ncclSuccess);
        int cnt = -1, rk = -1;
        ncclCommCount(nbc, &cnt);
        ncclCommUserRank(nbc, &rk);
        expect(cnt == m2, "non-blocking split: ncclCommCount", cnt, m2);
        expect(rk == me2, "non-blocking split: ncclCommUserRank", rk, me2);
        /* Its own split inherits blocking 0: one child of everything, same order. */
        ncclComm_t nbc2 = NULL;
        nbres = ncclCommSplit(nbc, 0, rk, &nbc2, NULL);
        expect((nbres == ncclSuccess || nbres == ncclInProgress) && nbc2 != NULL,
               "split of a non-blocking comm", nbres, ncclInProgress);
        state = ncclInProgress;
        for (int i = 0; nbc2 != NULL && i < 20000 && state == ncclInProgress; i++) {
            if (ncclCommGetAsyncError(nbc2, &state) != ncclSuccess)
                break;
            if (state == ncclInProgress)
                usleep(1000);
        }
        expect(state == ncclSuccess, "split of a non-blocking comm completes", state, ncclSuccess);
        if (nbc2 != NULL) {
            ncclCommUserRank(nbc2, &rk);
            expect(rk == me2, "split of a non-blocking comm: ncclCommUserRank", rk, me2);
            check(ncclCommDestroy(nbc2), "ncclCommDestroy non-blocking grandchild");
        }
        check(ncclCommDestroy(nbc), "ncclCommDestroy non-blocking child");
    }

    /* NCCL_SPLIT_NOCOLOR on ranks 1, 4, 7: they take part and get NULL. */
    ncclComm_t some = (ncclComm_t)(uintptr_t)0x1234;
    int color = me % 3 == 1 ? NCCL_SPLIT_NOCOLOR : me % 2;
    if (check(ncclCommSplit(parent, color, me, &some, NULL), "split with NOCOLOR")) {
        if (color == NCCL_SPLIT_NOCOLOR) {
            expect(some == NULL, "NOCOLOR gives NULL", some == NULL, 1);
        } else {
            m = 0;
            for (int r = 0; r < n; r++)
                if (r % 3 != 1 && r % 2 == color)
                    members[m++] = r;
            check_comm(some, members, m, index_of(members, m, me), "split with NOCOLOR");
        }
    }
    ncclComm_t none = (ncclComm_t)(uintptr_t)0x1234;
    if (check(ncclCommSplit(parent, NCCL_SPLIT_NOCOLOR, me, &none, NULL), "split all NOCOLOR"))
        expect(none == NULL, "all NOCOLOR gives NULL", none == NULL, 1);

    /* A split of a split: by2 split again by (child rank) % 2, key child rank. */
    ncclComm_t grand = NULL;
    if (by2 != NULL &&
        check(ncclCommSplit(by2, me2 % 2, me2, &grand, NULL), "split of a split")) {
        m = 0;
        for (int j = 0; j < m2; j++)
            if (j % 2 == me2 % 2)
                members[m++] = members2[j];
        check_comm(grand, members, m, index_of(members, m, me), "split of a split");
    }
    check_parent(parent, "parent after nested split");
    if (by2 != NULL)
        check_allreduce(by2, members2, m2, me2, 513, "child after its own split");

    /* Shrink away the last rank; the excluded rank does not call. */
    if (n >= 2) {
        int ex[1] = {n - 1};
        m = ref_shrink(n, ex, 1, members);
        if (me != n - 1) {
            ncclComm_t shrunk = NULL;
            if (check(ncclCommShrink(parent, ex, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT),
                      "shrink excluding the last rank")) {
                check_comm(shrunk, members, m, index_of(members, m, me), "shrink last");
                check(ncclCommDestroy(shrunk), "ncclCommDestroy shrunk");
            }
        }
        check_parent(parent, "parent after shrink");
    }
    /* Shrink away ranks 0 and 2 (listed out of order): the lowest survivor is rank 1. */
    if (n >= 4) {
        int ex[2] = {2, 0};
        m = ref_shrink(n, ex, 2, members);
        if (me != 0 && me != 2) {
            ncclComm_t shrunk = NULL;
            if (check(ncclCommShrink(parent, ex, 2, &shrunk, &cfg, NCCL_SHRINK_DEFAULT),
                      "shrink excluding 0 and 2")) {
                check_comm(shrunk, members, m, index_of(members, m, me), "shrink {0,2}");
                check(ncclCommDestroy(shrunk), "ncclCommDestroy shrunk");
            }
        }
        check_parent(parent, "parent after second shrink");
    }
    /* Shrink of a child: by2 without its rank 0. */
    if (by2 != NULL && m2 >= 2) {
        int ex[1] = {0};
        if (me2 != 0) {
            ncclComm_t shrunk = NULL;
            if (check(ncclCommShrink(by2, ex, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT),
                      "shrink of a child")) {
                check_comm(shrunk, members2 + 1, m2 - 1, me2 - 1, "shrink of a child");
                check(ncclCommDestroy(shrunk), "ncclCommDestroy shrunk child");
            }
        }
        check_allreduce(by2, members2, m2, me2, 77, "child after its shrink");
    }

    ncclComm_t kids[] = {grand, some, ties, by3, by2};
    for (size_t k = 0; k < sizeof(kids) / sizeof(kids[0]); k++)
        if (kids[k] != NULL && kids[k] != (ncclComm_t)(uintptr_t)0x1234)
            check(ncclCommDestroy(kids[k]), "ncclCommDestroy child");
    check_parent(parent, "parent after children destroyed");
    harness_leave(0, n);
    if (!check(ncclCommFinalize(parent), "ncclCommFinalize") ||
        !check(ncclCommDestroy(parent), "ncclCommDestroy"))
        return 1;
    return g_printed > 0;
}

/* Rank n-1 dies by SIGKILL; the others shrink it away with NCCL_SHRINK_ABORT. */
static int phase2(ncclUniqueId id)
{
    int n = g_nranks, me = g_rank, victim = n - 1;
    ncclComm_t parent;
    if (!check(ncclCommInitRank(&parent, n, id, me), "ncclCommInitRank (kill phase)"))
        return 1;
    check_parent(parent, "parent before the kill");
    if (me == victim) {
        /* Die only once every survivor is done with the parent's data. */
        for (int i = 0; i < 20000 && __atomic_load_n(&g_shared->ready, __ATOMIC_ACQUIRE) < n - 1;
             i++)
            usleep(1000);
        raise(SIGKILL);
        _exit(3);
    }
    __atomic_fetch_add(&g_shared->ready, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 20000 && !__atomic_load_n(&g_shared->victim_dead, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    expect(__atomic_load_n(&g_shared->victim_dead, __ATOMIC_ACQUIRE), "victim reaped", 0, 1);

    int ex[1] = {victim}, members[MAX_RANKS];
    int m = ref_shrink(n, ex, 1, members);
    ncclComm_t shrunk = NULL;
    if (check(ncclCommShrink(parent, ex, 1, &shrunk, NULL, NCCL_SHRINK_ABORT),
              "shrink after SIGKILL")) {
        check_comm(shrunk, members, m, me, "shrink after SIGKILL");
        harness_leave(1, n - 1);
        check(ncclCommDestroy(shrunk), "ncclCommDestroy shrunk (kill phase)");
    }
    check(ncclCommAbort(parent), "ncclCommAbort parent with a dead rank");
    return g_printed > 0;
}

/* Forks nranks ranks running fn; returns how many exited badly. victim: expected SIGKILL, or -1. */
static int run_phase(int (*fn)(ncclUniqueId), int nranks, int timeout, int victim)
{
    ncclUniqueId id;
    struct weft_test_id_pipe ip;
    if (weft_test_id_pipe_open(&ip) != 0)
        return 1;
    fflush(NULL);
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < nranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            return nranks;
        }
        if (pids[r] == 0) {
            g_rank = r;
            alarm(weft_test_scaled((unsigned)timeout));
            _exit(weft_test_id_pipe_recv(&ip, &id) != 0 ? 3 : fn(id));
        }
    }
    weft_test_id_pipe_send(&ip, nranks, &id);
    int bad = 0;
    if (victim >= 0) {
        int status;
        waitpid(pids[victim], &status, 0);
        int ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        if (!ok)
            fprintf(stderr, "rank %d was to die by SIGKILL: status 0x%x\n", victim, status);
        count_result(ok);
        __atomic_store_n(&g_shared->victim_dead, 1, __ATOMIC_RELEASE);
    }
    for (int r = 0; r < nranks; r++) {
        if (r == victim)
            continue;
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rank %d %s %d\n", r,
                    WIFSIGNALED(status) ? "killed by signal" : "exited with",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            bad++;
            for (int k = 0; k < nranks; k++)
                if (k != victim)
                    kill(pids[k], SIGKILL);
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    int nranks = 2, timeout = 60, opt;
    while ((opt = getopt(argc, argv, "n:t:")) != -1) {
        switch (opt) {
        case 'n': nranks = atoi(optarg); break;
        case 't': timeout = atoi(optarg); break;
        default: fprintf(stderr, "usage: %s -n NRANKS [-t SECONDS]\n", argv[0]); return 2;
        }
    }
    if (nranks < 1 || nranks > MAX_RANKS) {
        fprintf(stderr, "nranks %d must be between 1 and %d\n", nranks, MAX_RANKS);
        return 2;
    }
    g_nranks = nranks;
    g_shared = mmap(NULL, sizeof(*g_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                    -1, 0);
    if (g_shared == MAP_FAILED)
        return 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int bad = run_phase(phase1, nranks, timeout, -1);
    if (nranks >= 2)
        bad += run_phase(phase2, nranks, timeout, nranks - 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int failed = g_shared->failed + bad;
    printf("split/shrink, %d ranks, %.1f s\n", nranks,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    printf("%d passed, %d failed\n", g_shared->passed, failed);
    return failed ? 1 : 0;
}
