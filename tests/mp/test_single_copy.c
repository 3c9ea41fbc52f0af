/*
 * Single-copy sends (exec/lane.h, direct sends): send/recv, all-to-all, gather and scatter steps
 * of at least WEFT_SINGLE_COPY_MIN_BYTES travel as a slot describing the sender's buffer, which
 * the receiver reads with process_vm_readv (ranks as processes) or memcpy (ranks as threads, or a
 * rank and itself). Every element is checked against what its sender wrote, and the receivers'
 * count of direct reads (weft_exec_single_copy_count) must move exactly where it should.
 * WEFT_CMA is 1 unless the environment sets it (the default measures whether process_vm_readv
 * pays on this machine, core/cma.h); with WEFT_CMA=0 ranks as processes read directly only what
 * they send themselves (memcpy), at most one transfer per operation.
 *
 * Usage: test_single_copy -n NRANKS -c CASE [-t SECONDS]
 *   procs     ranks as processes: a ring shift of counts below, at and above the threshold (one
 *             step, several steps), several sends to one peer in a group with a send to self,
 *             all-to-all out of place (direct) and in place (never direct: its receives
 *             overwrite blocks a peer may still read), gather and scatter from every root
 *   threads   the same, ranks as threads of one process (ncclCommInitAll)
 *   off       procs with WEFT_SINGLE_COPY_MIN_BYTES=0: right results, no direct read at all
 *   mismatch  rank 0 sends one element more than rank 1 receives: both fail, neither hangs
 *   kill      rank 1 is killed as it starts a ring shift of 1 MiB: the survivors fail, naming it
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../common/id_pipe.h"
#include "../common/time_scale.h"
#include "core/group.h"
#include "mp_test.h"
#include "nccl.h"

#define MAX_RANKS 8
#define THRESHOLD 65536 /* bytes, the default of WEFT_SINGLE_COPY_MIN_BYTES */

static const char *g_case;
static int g_nranks, g_direct_on;
static int g_peer_direct; /* direct reads between processes (WEFT_CMA) */
static struct weft_test_id_pipe g_ip;
static int *g_shared_failed; /* any process's failures, for the parent's verdict */

static int check(ncclResult_t res, int rank, const char *what)
{
    if (res != ncclSuccess) {
        fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, what, ncclGetErrorString(res),
                ncclGetLastError(NULL));
        return 0;
    }
    return 1;
}

/* What rank `from` sends rank `to` at element i of a transfer tagged `tag`: exact in float. */
static float value_of(int from, int to, size_t i, int tag)
{
    return (float)((from * 131 + to * 17 + tag * 7 + (int)(i % 1021)) % 4093);
}

/* The ranks of this process: one comm each (nlocal 1 for processes, all for threads). */
struct local_ranks {
    int nlocal;
    int first; /* global rank of comms[0] */
    ncclComm_t comms[MAX_RANKS];
};

static uint64_t reads_of(const struct local_ranks *lr, int k)
{
    return weft_exec_single_copy_count(lr->comms[k]);
}

static int group_end(int rank, const char *what)
{
    return check(ncclGroupEnd(), rank, what);
}

/* Each rank sends count floats to rank + shift and receives from rank - shift; `sends` sends
 * to the same peer in one group (distinct buffers), plus a send to self when self is set. */
static int case_shift(struct local_ranks *lr, size_t count, int shift, int sends, int self,
                      int tag)
{
    int n = g_nranks, ok = 1;
    size_t nbuf = (size_t)sends + (self ? 1 : 0);
    float *sb[MAX_RANKS][4], *rb[MAX_RANKS][4];
    uint64_t before[MAX_RANKS];
    for (int k = 0; k < lr->nlocal; k++) {
        int r = lr->first + k, to = (r + shift) % n;
        for (size_t b = 0; b < nbuf; b++) {
            sb[k][b] = malloc(count * sizeof(float) + 1);
            rb[k][b] = malloc(count * sizeof(float) + 1);
            int dst = b < (size_t)sends ? to : r;
            for (size_t i = 0; i < count; i++) {
                sb[k][b][i] = value_of(r, dst, i, tag + (int)b);
                rb[k][b][i] = -1.0f;
            }
        }
        before[k] = reads_of(lr, k);
    }
    ncclGroupStart();
    for (int k = 0; k < lr->nlocal; k++) {
        int r = lr->first + k, to = (r + shift) % n, from = (r - shift + n) % n;
        for (int b = 0; b < sends; b++) {
            ncclSend(sb[k][b], count, ncclFloat, to, lr->comms[k], NULL);
            ncclRecv(rb[k][b], count, ncclFloat, from, lr->comms[k], NULL);
        }
        if (self) {
            ncclSend(sb[k][sends], count, ncclFloat, r, lr->comms[k], NULL);
            ncclRecv(rb[k][sends], count, ncclFloat, r, lr->comms[k], NULL);
        }
    }
    ok &= group_end(lr->first, "ring shift");
    for (int k = 0; k < lr->nlocal && ok; k++) {
        int r = lr->first + k, from = (r - shift + n) % n;
        size_t wrong = 0;
        for (size_t b = 0; b < nbuf; b++) {
            int src = b < (size_t)sends ? from : r;
            for (size_t i = 0; i < count; i++)
                wrong += rb[k][b][i] != value_of(src, r, i, tag + (int)b);
        }
        EXPECT(wrong == 0, "rank %d: shift of %zu floats x %zu: %zu wrong elements", r, count,
               nbuf, wrong);
        uint64_t ran = reads_of(lr, k) - before[k];
        int big = g_direct_on && count * sizeof(float) >= THRESHOLD;
        int want = big && g_peer_direct;
        uint64_t self_reads = big && self ? 1 : 0;
        EXPECT(want ? ran >= (uint64_t)sends : ran <= self_reads,
               "rank %d: shift of %zu floats x %zu: %llu direct reads, expected %s", r, count,
               nbuf, (unsigned long long)ran,
               want ? "one per transfer from the peer" : self_reads ? "the one to self" : "none");
    }
    for (int k = 0; k < lr->nlocal; k++)
        for (size_t b = 0; b < nbuf; b++) {
            free(sb[k][b]);
            free(rb[k][b]);
        }
    return ok;
}

/* All-to-all of count floats per pair; in place or not. */
static int case_alltoall(struct local_ranks *lr, size_t count, int in_place, int tag)
{
    int n = g_nranks, ok = 1;
    float *sb[MAX_RANKS], *rb[MAX_RANKS];
    uint64_t before[MAX_RANKS];
    for (int k = 0; k < lr->nlocal; k++) {
        int r = lr->first + k;
        sb[k] = malloc((size_t)n * count * sizeof(float));
        rb[k] = in_place ? sb[k] : malloc((size_t)n * count * sizeof(float));
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < count; i++) {
                sb[k][(size_t)p * count + i] = value_of(r, p, i, tag);
                if (!in_place)
                    rb[k][(size_t)p * count + i] = -1.0f;
            }
        before[k] = reads_of(lr, k);
    }
    ncclGroupStart();
    for (int k = 0; k < lr->nlocal; k++)
        ncclAlltoAll(sb[k], rb[k], count, ncclFloat, lr->comms[k], NULL);
    ok &= group_end(lr->first, "all-to-all");
    for (int k = 0; k < lr->nlocal && ok; k++) {
        int r = lr->first + k;
        size_t wrong = 0;
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < count; i++)
                wrong += rb[k][(size_t)p * count + i] != value_of(p, r, i, tag);
        EXPECT(wrong == 0, "rank %d: all-to-all (%s) of %zu floats: %zu wrong elements", r,
               in_place ? "in place" : "out of place", count, wrong);
        uint64_t ran = reads_of(lr, k) - before[k];
        int big = g_direct_on && !in_place && count * sizeof(float) >= THRESHOLD;
        int want = big && g_peer_direct;
        EXPECT(want ? ran >= (uint64_t)(n - 1) : ran <= (uint64_t)big,
               "rank %d: all-to-all (%s) of %zu floats: %llu direct reads, expected %s", r,
               in_place ? "in place" : "out of place", count, (unsigned long long)ran,
               want ? "one per peer at least" : big ? "at most the block to self" : "none");
    }
    for (int k = 0; k < lr->nlocal; k++) {
        if (!in_place)
            free(rb[k]);
        free(sb[k]);
    }
    return ok;
}

/* Gather into root, then scatter from it, of count floats per rank. */
static int case_gather_scatter(struct local_ranks *lr, size_t count, int root, int tag)
{
    int n = g_nranks, ok = 1;
    float *in[MAX_RANKS], *all[MAX_RANKS], *out[MAX_RANKS];
    uint64_t before[MAX_RANKS];
    for (int k = 0; k < lr->nlocal; k++) {
        int r = lr->first + k;
        in[k] = malloc(count * sizeof(float));
        all[k] = malloc((size_t)n * count * sizeof(float));
        out[k] = malloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++) {
            in[k][i] = value_of(r, root, i, tag);
            out[k][i] = -1.0f;
        }
        for (size_t i = 0; i < (size_t)n * count; i++)
            all[k][i] = -1.0f;
        before[k] = reads_of(lr, k);
    }
    ncclGroupStart();
    for (int k = 0; k < lr->nlocal; k++)
        ncclGather(in[k], all[k], count, ncclFloat, root, lr->comms[k], NULL);
    ok &= group_end(lr->first, "gather");
    for (int k = 0; k < lr->nlocal && ok; k++) {
        int r = lr->first + k;
        if (r != root)
            continue;
        size_t wrong = 0;
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < count; i++)
                wrong += all[k][(size_t)p * count + i] != value_of(p, root, i, tag);
        EXPECT(wrong == 0, "root %d: gather of %zu floats: %zu wrong elements", r, count, wrong);
        uint64_t ran = reads_of(lr, k) - before[k];
        int big = g_direct_on && count * sizeof(float) >= THRESHOLD;
        int want = big && g_peer_direct;
        EXPECT(want ? ran >= (uint64_t)(n - 1) : ran <= (uint64_t)big,
               "root %d: gather of %zu floats: %llu direct reads", r, count,
               (unsigned long long)ran);
        /* the root scatters back what it gathered, each block to the rank it came from */
    }
    ncclGroupStart();
    for (int k = 0; k < lr->nlocal; k++)
        ncclScatter(all[k], out[k], count, ncclFloat, root, lr->comms[k], NULL);
    ok &= group_end(lr->first, "scatter");
    for (int k = 0; k < lr->nlocal && ok; k++) {
        int r = lr->first + k;
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++)
            wrong += out[k][i] != value_of(r, root, i, tag);
        EXPECT(wrong == 0, "rank %d: scatter of %zu floats from root %d: %zu wrong elements", r,
               count, root, wrong);
    }
    for (int k = 0; k < lr->nlocal; k++) {
        free(in[k]);
        free(all[k]);
        free(out[k]);
    }
    return ok;
}

static int run_cases(struct local_ranks *lr)
{
    const size_t t = THRESHOLD / sizeof(float);
    const size_t counts[] = {3, t - 1, t, (1 << 18) + 3, 3 * (1 << 18) + 5};
    int ok = 1, tag = 0;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && ok; c++)
        for (int shift = 1; shift < g_nranks && ok; shift++)
            ok &= case_shift(lr, counts[c], shift, 1, 0, tag++);
    ok &= ok && case_shift(lr, t + 7, 1, 3, 1, tag++);
    ok &= ok && case_shift(lr, 5, 1, 3, 1, tag++);
    ok &= ok && case_alltoall(lr, t + 5, 0, tag++);
    ok &= ok && case_alltoall(lr, t + 5, 1, tag++);
    ok &= ok && case_alltoall(lr, 100, 0, tag++);
    for (int root = 0; root < g_nranks && ok; root++)
        ok &= case_gather_scatter(lr, t + 9, root, tag++);
    return ok;
}

/* mismatch: rank 0 sends one element more than rank 1 receives; the others idle. Both must
 * fail (the signature check names both calls), long before the deadline. */
static int case_mismatch(struct local_ranks *lr)
{
    int r = lr->first;
    size_t count = (1 << 18) + (r == 0 ? 1 : 0);
    float *buf = calloc(count, sizeof(float));
    double t0 = now_s();
    ncclResult_t res = ncclSuccess;
    if (r == 0)
        res = ncclSend(buf, count, ncclFloat, 1, lr->comms[0], NULL);
    else if (r == 1)
        res = ncclRecv(buf, count, ncclFloat, 0, lr->comms[0], NULL);
    double took = now_s() - t0;
    if (r <= 1) {
        EXPECT(res != ncclSuccess, "rank %d: a mismatched send/recv succeeded", r);
        EXPECT(took < 15.0, "rank %d: the mismatch took %.1f s to fail", r, took);
        fprintf(stderr, "rank %d: mismatch: %s\n", r, ncclGetLastError(lr->comms[0]));
    }
    free(buf);
    return 1;
}

/* kill: WEFT_FAULT kills rank 1 at its first operation, a 1 MiB ring shift. */
static int case_kill(struct local_ranks *lr)
{
    int r = lr->first, n = g_nranks;
    size_t count = 1 << 18;
    float *sb = calloc(count, sizeof(float)), *rb = calloc(count, sizeof(float));
    double t0 = now_s();
    ncclGroupStart();
    ncclSend(sb, count, ncclFloat, (r + 1) % n, lr->comms[0], NULL);
    ncclRecv(rb, count, ncclFloat, (r - 1 + n) % n, lr->comms[0], NULL);
    ncclResult_t res = ncclGroupEnd();
    const char *msg = ncclGetLastError(lr->comms[0]);
    EXPECT(res != ncclSuccess, "rank %d: a ring shift with a dead peer succeeded", r);
    EXPECT(now_s() - t0 < 15.0, "rank %d: took %.1f s to see the dead peer", r, now_s() - t0);
    EXPECT(strstr(msg, "peer 1") != NULL || strstr(msg, "rank 1") != NULL,
           "rank %d: the error does not name rank 1: %s", r, msg);
    fprintf(stderr, "rank %d: kill: %s\n", r, msg);
    free(sb);
    free(rb);
    return 1;
}

static int run_local(struct local_ranks *lr)
{
    if (strcmp(g_case, "mismatch") == 0)
        return case_mismatch(lr);
    if (strcmp(g_case, "kill") == 0)
        return case_kill(lr);
    return run_cases(lr);
}

static int proc_rank(int r, void *arg)
{
    (void)arg;
    ncclUniqueId id;
    if (weft_test_id_pipe_recv(&g_ip, &id) != 0)
        return 1;
    struct local_ranks lr = {.nlocal = 1, .first = r};
    if (!check(ncclCommInitRank(&lr.comms[0], g_nranks, id, r), r, "ncclCommInitRank"))
        return 1;
    int ok = run_local(&lr);
    if (strcmp(g_case, "kill") == 0 || strcmp(g_case, "mismatch") == 0)
        ncclCommAbort(lr.comms[0]);
    else
        ok &= check(ncclCommDestroy(lr.comms[0]), r, "ncclCommDestroy");
    if (!ok || g_failed)
        __atomic_fetch_add(g_shared_failed, 1, __ATOMIC_RELAXED);
    return ok && !g_failed ? 0 : 1;
}

int main(int argc, char **argv)
{
    int timeout = 120, opt;
    g_nranks = 2;
    g_case = "procs";
    while ((opt = getopt(argc, argv, "n:c:t:")) != -1) {
        switch (opt) {
        case 'n': g_nranks = atoi(optarg); break;
        case 'c': g_case = optarg; break;
        case 't': timeout = atoi(optarg); break;
        default:
            fprintf(stderr, "usage: %s -n NRANKS -c CASE [-t SECONDS]\n", argv[0]);
            return 2;
        }
    }
    if (g_nranks < 2 || g_nranks > MAX_RANKS) {
        fprintf(stderr, "test_single_copy: -n must be in [2, %d]\n", MAX_RANKS);
        return 2;
    }
    if (strcmp(g_case, "off") == 0)
        setenv("WEFT_SINGLE_COPY_MIN_BYTES", "0", 1);
    else
        setenv("WEFT_SINGLE_COPY_MIN_BYTES", "65536", 1);
    g_direct_on = strcmp(g_case, "off") != 0;
    setenv("WEFT_CMA", "1", 0);
    g_peer_direct = strcmp(g_case, "threads") == 0 || strcmp(getenv("WEFT_CMA"), "0") != 0;
    setenv("WEFT_TIMEOUT", "30", 0);
    g_shared_failed = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                           -1, 0);
    if (g_shared_failed == MAP_FAILED)
        return 1;
    if (strcmp(g_case, "threads") == 0) {
        alarm(weft_test_scaled((unsigned)timeout));
        struct local_ranks lr = {.nlocal = g_nranks, .first = 0};
        if (!check(ncclCommInitAll(lr.comms, g_nranks, NULL), 0, "ncclCommInitAll"))
            return 1;
        int ok = run_cases(&lr);
        for (int k = 0; k < g_nranks; k++)
            ok &= check(ncclCommDestroy(lr.comms[k]), k, "ncclCommDestroy");
        return mp_result(NULL, !ok || g_failed);
    }
    if (strcmp(g_case, "kill") == 0)
        setenv("WEFT_FAULT", "kill:op=1:rank=1", 1);
    if (weft_test_id_pipe_open(&g_ip) != 0)
        return 1;
    pid_t pids[MAX_RANKS];
    int bad = mp_fork_ranks(g_nranks, weft_test_scaled((unsigned)timeout), proc_rank, NULL,
                            pids) != 0;
    ncclUniqueId id;
    if (!bad)
        weft_test_id_pipe_send(&g_ip, g_nranks, &id);
    for (int r = 0; r < g_nranks; r++)
        bad += !mp_wait_rank(pids[r], r, strcmp(g_case, "kill") == 0 && r == 1);
    return mp_result(NULL, bad || *g_shared_failed);
}
