/*
 * The *_perf driver: sweep, timing, validation, the ranks' buffers and threads (perf_run); its
 * flags are args.c's, its data data.c's, its output report.c's (driver.h). See common.h.
 */
#include "driver.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Driver state and helpers
 * ------------------------------------------------------------------------------------------- */

/* -T watchdog: aborts every rank of every team of the process. */
static _Atomic double watchdog_armed_at; /* 0: disarmed */
static int watchdog_timeout_s;
static const struct perf_backend *watchdog_be;
static struct perf_state *watchdog_states;
static int watchdog_nstates;
static char watchdog_host[256];

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* nccl-tests' failure line, then exit: the other ranks are stopped by weftrun (or mpirun). */
void perf_fail(const struct perf_state *st, const char *file, int line, ncclResult_t res)
{
    const char *base = strrchr(file, '/');
    const char *last = st->be->last_error();

    printf("%s: Test %s failure %s:%d '%s / %s'\n", st->host, st->be->name,
           base ? base + 1 : file, line, st->be->error_string(res), last ? last : "");
    fflush(stdout);
    exit(1);
}

/* nccl-tests' CUDA failure line ("Cuda failure file:line 'text'"), then exit. */
void perf_cuda_fail(const struct perf_state *st, const char *file, int line, int err)
{
    const char *base = strrchr(file, '/');

    printf("%s: Test CUDA failure %s:%d '%s'\n", st->host, base ? base + 1 : file, line,
           st->dm->error_string(err));
    fflush(stdout);
    exit(1);
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    for (;;) {
        double armed = atomic_load(&watchdog_armed_at);
        struct timespec ts = {0, 50 * 1000 * 1000};

        if (armed != 0 && now_s() - armed > watchdog_timeout_s) {
            printf("%s: Test timeout (%ds) %s:%d\n", watchdog_host, watchdog_timeout_s, "common.c",
                   __LINE__);
            fflush(stdout);
            for (int t = 0; t < watchdog_nstates; t++)
                for (int i = 0; i < watchdog_states[t].team.n; i++)
                    watchdog_be->abort(&watchdog_states[t].team.ctx[i]);
            /* The blocked call should now fail and the main thread exit; make sure of it. */
            ts.tv_sec = 5;
            ts.tv_nsec = 0;
            nanosleep(&ts, NULL);
            fprintf(stderr, "%s: still blocked 5 s after the abort; exiting\n", watchdog_host);
            _exit(1);
        }
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* With several threads the latest arm wins: the watchdog measures the most recent wait. */
static void watchdog_arm(const struct perf_state *st)
{
    if (st->a.timeout_s > 0)
        atomic_store(&watchdog_armed_at, now_s());
}

static void watchdog_disarm(const struct perf_state *st)
{
    if (st->a.timeout_s > 0)
        atomic_store(&watchdog_armed_at, 0.0);
}

/* Waits for every rank's stream. On host buffers the calls were complete when they returned. */
static void team_sync(struct perf_state *st)
{
    if (!st->dev_bufs)
        return;
    for (int i = 0; i < st->team.n; i++)
        PERF_CUDACHECK(st, st->dm->stream_synchronize(st->team.ctx[i].stream));
}

static void barrier(struct perf_state *st)
{
    PERF_CHECK(st, st->be->barrier(&st->team));
}

/* Combines this thread's seconds per op over the job as -a says. */
static double combine_time(struct perf_state *st, double sec)
{
    double v = sec;
    int op = PERF_OP_SUM;

    switch (st->a.average) {
    case 0:
        v = st->team.ctx[0].rank == 0 ? sec : 0;
        break;
    case 2:
        op = PERF_OP_MIN;
        break;
    case 3:
        op = PERF_OP_MAX;
        break;
    default:
        break;
    }
    PERF_CHECK(st, st->be->reduce_double(&st->team, &v, op));
    return st->a.average == 1 ? v / st->nteams : v;
}

static int64_t sum_int64(struct perf_state *st, int64_t v)
{
    PERF_CHECK(st, st->be->sum_int64(&st->team, &v));
    return v;
}

static void *aligned_buffer(size_t bytes, void **alloc_p)
{
    void *p = NULL;

    if (posix_memalign(&p, PERF_ALIGN, bytes ? bytes : PERF_ALIGN) != 0) {
        fprintf(stderr, "perf: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes); /* fault the pages in before anything is timed */
    *alloc_p = p;
    return p;
}

/* A zeroed buffer of rank i's kind (device memory on its device, or host). */
static char *rank_buffer(struct perf_state *st, int i, size_t bytes, void **alloc_p)
{
    void *p = NULL;

    if (!st->dev_bufs)
        return aligned_buffer(bytes, alloc_p);
    perf_slot_use(st, i);
    PERF_CUDACHECK(st, st->dm->malloc(&p, bytes ? bytes : PERF_ALIGN));
    PERF_CUDACHECK(st, st->dm->memset(p, 0, bytes));
    *alloc_p = p;
    return p;
}

static void rank_buffer_free(struct perf_state *st, int i, void *alloc)
{
    if (alloc == NULL)
        return;
    if (!st->dev_bufs) {
        free(alloc);
        return;
    }
    perf_slot_use(st, i);
    PERF_CUDACHECK(st, st->dm->free(alloc));
}

static size_t next_size(const struct perf_args *a, size_t size)
{
    if (a->step_factor > 1) {
        if (size == 0)
            return 1;
        if (size > SIZE_MAX / (size_t)a->step_factor)
            return SIZE_MAX;
        return size * (size_t)a->step_factor;
    }
    if (size > SIZE_MAX - a->step_bytes)
        return SIZE_MAX;
    return size + a->step_bytes;
}

/* Pointers of one call of rank i. iter selects the rotation slot inside the buffers, as
 * nccl-tests does. */
static void call_buffers(const struct perf_state *st, int i, const struct perf_op *op,
                         size_t iter, char **send_p, char **recv_p)
{
    const struct perf_slot *sl = &st->slots[i];
    size_t ts = op->type->size;
    size_t total = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;
    size_t steps = total ? st->buf_bytes / total : 1;
    size_t shift = total * (iter % (steps ? steps : 1)) + (size_t)st->a.unalign * ts;
    size_t r = (size_t)sl->ctx->rank;

    if (op->in_place) {
        *send_p = sl->recv_base + shift + r * op->c.send_inplace_offset * ts;
        *recv_p = sl->recv_base + shift + r * op->c.recv_inplace_offset * ts;
    } else {
        *send_p = sl->send_base + shift;
        *recv_p = sl->recv_base + shift;
    }
}

/* One op on every rank of the team: grouped when the thread drives several (as nccl-tests),
 * one group per dependent step (perf_coll.phases). */
static void run_op(struct perf_state *st, const struct perf_op *op, size_t iter)
{
    int nphases = st->team.n > 1 ? st->coll->phases(st->team.ctx[0].nranks) : 1;
    char *send, *recv;

    for (int p = 0; p < nphases; p++) {
        if (st->team.n > 1)
            PERF_CHECK(st, st->be->group_start());
        for (int i = 0; i < st->team.n; i++) {
            struct perf_op mine = *op;

            mine.nccl_op = st->slots[i].nccl_op;
            mine.phase = p;
            mine.nphases = nphases;
            call_buffers(st, i, op, iter, &send, &recv);
            PERF_CHECK(st, st->run(&st->team.ctx[i], &mine, send, recv));
        }
        if (st->team.n > 1)
            PERF_CHECK(st, st->be->group_end());
    }
}

/* One validation round; returns wrong elements summed over ranks. */
static int64_t check_once(struct perf_state *st, const struct perf_op *op, uint64_t seed)
{
    size_t ts = op->type->size;
    size_t total = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;
    size_t poison = op->in_place ? total : op->c.recv_count * ts;
    char *send, *recv;
    int64_t wrong = 0;

    /* Poison what the op must overwrite, then lay the input (in place it lies inside recv). */
    for (int i = 0; i < st->team.n; i++) {
        char *at = st->slots[i].recv_base + (size_t)st->a.unalign * ts;
        if (st->dev_bufs) {
            perf_slot_use(st, i);
            PERF_CUDACHECK(st, st->dm->memset(at, 0xa5, poison));
        } else {
            memset(at, 0xa5, poison);
        }
        call_buffers(st, i, op, 0, &send, &recv);
        perf_fill_send(st, i, op, seed, send);
    }
    watchdog_arm(st);
    run_op(st, op, 0);
    team_sync(st);
    watchdog_disarm(st);

    for (int i = 0; i < st->team.n; i++) {
        int64_t w;
        call_buffers(st, i, op, 0, &send, &recv);
        w = perf_check_rank(st, i, op, seed, recv);
        if (w)
            st->local_errors++;
        wrong += w;
    }
    return sum_int64(st, wrong);
}

/* The driving threads of this process (pthread barrier; nothing with one thread). */
static pthread_barrier_t perf_threads_barrier;

static void threads_sync(const struct perf_state *st)
{
    if (st->a.nthreads > 1)
        pthread_barrier_wait(&perf_threads_barrier);
}

/*
 * -G: captures the iteration loop on every rank's stream (begin), or ends the capture into one
 * executable graph per rank (end). Weft's capture is global mode: while any thread captures, no
 * thread may synchronise (copies, the helper collectives), so the process's threads capture
 * together, between two thread barriers.
 */
static void graph_capture(struct perf_state *st, int end)
{
    if (!end)
        threads_sync(st);
    for (int i = 0; i < st->team.n; i++) {
        cudaStream_t s = st->team.ctx[i].stream;
        if (end)
            PERF_CUDACHECK(st, st->dm->capture_end(s, &st->slots[i].graph));
        else
            PERF_CUDACHECK(st, st->dm->capture_begin(s));
    }
    if (end)
        threads_sync(st);
}

/* One timed run of iters iterations (or -G graph launches): seconds per op, this rank's. */
static double timed_run(struct perf_state *st, struct perf_op *op, int iters)
{
    const struct perf_args *a = &st->a;
    double t0, excluded = 0, sec, cpu_sec;
    int graph = a->graph_launches > 0;

    if (graph)
        graph_capture(st, 0);
    t0 = now_s();
    for (int it = 0; it < iters; it++) {
        if (a->agg > 1)
            PERF_CHECK(st, st->be->group_start());
        for (int k = 0; k < a->agg; k++)
            run_op(st, op, (size_t)it * (size_t)a->agg + (size_t)k);
        if (a->agg > 1)
            PERF_CHECK(st, st->be->group_end());
        if (a->blocking > 0 && !graph)
            team_sync(st);
        if (a->blocking == 1 && !graph) {
            barrier(st);
        } else if (a->blocking == 3 && !graph) {
            double b0 = now_s();
            barrier(st);
            excluded += now_s() - b0;
        }
    }
    if (graph) {
        /* As nccl-tests: capture once, resynchronise, then time -G launches of the graph. */
        graph_capture(st, 1);
        barrier(st);
        t0 = now_s();
        for (int l = 0; l < a->graph_launches; l++)
            for (int i = 0; i < st->team.n; i++)
                PERF_CUDACHECK(st, st->dm->graph_launch(st->slots[i].graph,
                                                        st->team.ctx[i].stream));
    }
    cpu_sec = now_s() - t0 - excluded;
    team_sync(st);
    sec = now_s() - t0 - excluded;
    if (a->report_cputime)
        sec = cpu_sec;
    sec /= (double)iters * a->agg * (graph ? a->graph_launches : 1);
    if (graph) {
        for (int i = 0; i < st->team.n; i++) {
            PERF_CUDACHECK(st, st->dm->graph_destroy(st->slots[i].graph));
            st->slots[i].graph = NULL;
        }
    }
    return sec;
}

#define PERF_MAX_ITERS (1 << 24)

/*
 * -S: the iterations of one timed run of this size, so that it lasts about a->time_target
 * seconds. Runs batches of 1, 2, 4, ... iterations (a warm-up as well: a sub-microsecond call's
 * first hundreds of calls are not its steady state) until a batch takes an eighth of the target
 * and the time per iteration has stopped falling (doubling the batch cut it by less than 20%): a
 * fixed cost per batch (waking a peer that slept, a time slice lost on a shared machine) must not
 * pass for the cost of an iteration, or a 1 us call would get a handful of iterations. Then
 * scales the last batch's time per iteration (the longest batch, so the most typical: scaling the
 * fastest batch instead made a 0.02 s target run past 50 s on a loaded machine), giving up on
 * steadiness after four times the target. Every rank uses the slowest rank's times, so all run
 * the same count. Without -S (or with -G) the count is -n.
 */
static int size_iters(struct perf_state *st, struct perf_op *op)
{
    const struct perf_args *a = &st->a;
    if (a->time_target <= 0 || a->graph_launches > 0)
        return a->iters;
    double prev = 0, total = 0;
    for (int k = 1;; k *= 2) {
        double t0 = now_s();
        for (int it = 0; it < k; it++)
            run_op(st, op, (size_t)it);
        team_sync(st);
        double dt = now_s() - t0, per;
        PERF_CHECK(st, st->be->reduce_double(&st->team, &dt, PERF_OP_MAX));
        total += dt;
        per = dt / k;
        int steady = k > 1 && per >= 0.8 * prev;
        prev = per;
        if ((dt >= a->time_target / 8 && steady) || total >= 4 * a->time_target ||
            k >= PERF_MAX_ITERS) {
            double n = per > 0 ? ceil(a->time_target / per) : (double)PERF_MAX_ITERS;
            return n < 1 ? 1 : n > PERF_MAX_ITERS ? PERF_MAX_ITERS : (int)n;
        }
    }
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static void bench(struct perf_state *st, struct perf_op *op, uint64_t seed,
                  struct perf_result *res)
{
    const struct perf_args *a = &st->a;
    char *send, *recv;
    double sec, reps[64];
    int nrep = a->repeats < 1 ? 1 : a->repeats > 64 ? 64 : a->repeats;

    /* Sane data for timing (no NaN/denormal slow paths), one synchronising op, barrier. */
    if (a->check) {
        for (int i = 0; i < st->team.n; i++) {
            call_buffers(st, i, op, 0, &send, &recv);
            perf_fill_send(st, i, op, seed ^ 0x99, send);
        }
    }
    watchdog_arm(st);
    run_op(st, op, 0);
    team_sync(st);
    barrier(st);

    int iters = size_iters(st, op);
    for (int r = 0; r < nrep; r++) {
        barrier(st);
        /* -S: steady state: an eighth of the run untimed first, so that the run does not start
         * with ranks that slept through the barrier */
        for (int it = 0; a->time_target > 0 && it < (iters + 7) / 8; it++)
            run_op(st, op, (size_t)it);
        reps[r] = combine_time(st, timed_run(st, op, iters));
    }
    watchdog_disarm(st);
    qsort(reps, (size_t)nrep, sizeof(double), cmp_double);
    sec = nrep % 2 ? reps[nrep / 2] : (reps[nrep / 2 - 1] + reps[nrep / 2]) / 2;
    res->time_min_us = reps[0] * 1e6;
    res->time_max_us = reps[nrep - 1] * 1e6;
    res->iters = iters;

    res->time_us = sec * 1e6;
    res->algbw = sec > 0 ? op->c.alg_bytes / 1e9 / sec : 0;
    res->busbw = res->algbw * st->coll->bus_factor(st->team.ctx[0].nranks);
    res->wrong = -1;
    if (a->check && !(op->in_place && (st->coll->flags & PERF_COLL_INPLACE_UNCHECKED))) {
        res->wrong = 0;
        for (int c = 0; c < a->check; c++) {
            res->wrong = check_once(st, op, seed + (uint64_t)c);
            if (res->wrong)
                break;
        }
    }
    st->bw_sum += res->busbw;
    st->bw_count++;
}

/* Warm-up, then -N cycles of the size sweep, for one (type, op, root). */
static void time_test(struct perf_state *st, const struct perf_type *t, int op_kind, int root)
{
    const struct perf_args *a = &st->a;
    int nranks = st->team.ctx[0].nranks;
    struct perf_op op;
    long repeat = a->cycles;

    memset(&op, 0, sizeof(op));
    op.type = t;
    op.op = op_kind;
    op.root = root;
    perf_make_gen(&op.gen, t, op_kind, nranks);
    for (int i = 0; i < st->team.n; i++) {
        struct perf_op mine = op;
        PERF_CHECK(st, st->be->op_create(&st->team.ctx[i], &mine));
        st->slots[i].nccl_op = mine.nccl_op;
    }

    barrier(st);
    for (size_t size = a->min_bytes; size <= a->max_bytes;
         size = size ? (size > SIZE_MAX / 2 ? SIZE_MAX : size * 2) : 1) {
        st->coll->get_counts(size, t->size, nranks, &op.c);
        op.in_place = 0;
        watchdog_arm(st);
        for (int it = 0; it < a->warmup; it++)
            run_op(st, &op, (size_t)it);
        team_sync(st);
        watchdog_disarm(st);
        if (size == SIZE_MAX)
            break;
    }

    do {
        for (size_t size = a->min_bytes; size <= a->max_bytes; size = next_size(a, size)) {
            struct perf_counts c;
            struct perf_result res[2];
            char line[512];
            uint64_t seed = ++st->row_seed * 1024;

            st->coll->get_counts(size, t->size, nranks, &c);
            snprintf(line, sizeof(line), "%12li  %12li  %8s  %6s  %6i",
                     (long)((c.send_count > c.recv_count ? c.send_count : c.recv_count) * t->size),
                     (long)c.count, t->name, perf_op_name(op_kind), root);
            for (int ip = 0; ip < 2; ip++) {
                op.c = c;
                op.in_place = ip;
                bench(st, &op, seed, &res[ip]);
                perf_append_body(line, sizeof(line), &res[ip]);
                if (st->json)
                    perf_json_line(st, &op, &res[ip]);
            }
            if (perf_timing_columns(a)) /* (slowest - fastest repeat) / median, per half */
                for (int ip = 0; ip < 2; ip++) {
                    size_t len = strlen(line);
                    double sp = res[ip].time_us > 0 ? 100 * (res[ip].time_max_us -
                                                              res[ip].time_min_us) /
                                                             res[ip].time_us
                                                     : 0;
                    snprintf(line + len, sizeof(line) - len, "  %8d  %6.1f", res[ip].iters, sp);
                }
            if (st->is_main)
                printf("%s\n", line);
            if (size == SIZE_MAX)
                break;
        }
    } while (--repeat != 0);

    for (int i = 0; i < st->team.n; i++) {
        struct perf_op mine = op;
        mine.nccl_op = st->slots[i].nccl_op;
        PERF_CHECK(st, st->be->op_destroy(&st->team.ctx[i], &mine));
    }
}

ncclResult_t perf_copy(const struct perf_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    const struct perf_devmem *dm;
    int err;

    if (!ctx->dev_bufs) {
        memcpy(dst, src, bytes);
        return ncclSuccess;
    }
    dm = perf_devmem_get(NULL);
    /* The NULL stream is the current device's: make it the rank's (one thread, several). */
    err = ctx->stream == NULL ? dm->set_device(ctx->device) : 0;
    if (err == 0)
        err = dm->memcpy_async(dst, src, bytes, ctx->stream);
    if (err != 0) {
        fprintf(stderr, "perf: device copy of %zu bytes failed: %s\n", bytes,
                dm->error_string(err));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------------
 * Main
 * ------------------------------------------------------------------------------------------- */

static void allocate_buffers(struct perf_state *st)
{
    const struct perf_args *a = &st->a;
    size_t buf = a->max_bytes, expect = 0, slack;

    for (int i = 0; i < a->ntypes; i++) {
        struct perf_counts c;
        size_t ts = a->types[i]->size;
        st->coll->get_counts(a->max_bytes, ts, st->team.ctx[0].nranks, &c);
        size_t total = (c.send_count > c.recv_count ? c.send_count : c.recv_count) * ts;
        if (total > buf)
            buf = total;
        if (c.recv_count * ts > expect)
            expect = c.recv_count * ts;
    }
    slack = (size_t)a->unalign * 8 + PERF_ALIGN;
    st->buf_bytes = buf;
    st->expect_bytes = expect;
    /* 64-byte aligned; -u shifts each call's pointers by that many elements (call_buffers). */
    for (int i = 0; i < st->team.n; i++) {
        struct perf_slot *sl = &st->slots[i];
        if (a->local_register) {
            /* ncclMemAlloc is device memory on the current device wherever the process has a
             * CUDA device (NCCL's and Weft's); host memory only in Weft without one. */
            if (!st->dev_bufs && (strcmp(sl->ctx->library, "weft") != 0 ||
                                  (st->dm != NULL && st->dm->ndev > 0))) {
                fprintf(stderr, "perf: -R 1 -H 1: ncclMemAlloc gives host memory only in Weft "
                                "without a CUDA device (run with WEFT_CUDA=0)\n");
                exit(2);
            }
            perf_slot_use(st, i);
            PERF_CHECK(st, st->be->reg_alloc(sl->ctx, buf + slack, &sl->send_alloc,
                                             &sl->send_reg));
            PERF_CHECK(st, st->be->reg_alloc(sl->ctx, buf + slack, &sl->recv_alloc,
                                             &sl->recv_reg));
            /* Zeroed, so every page is touched before anything is timed. */
            if (st->dev_bufs) {
                PERF_CUDACHECK(st, st->dm->memset(sl->send_alloc, 0, buf + slack));
                PERF_CUDACHECK(st, st->dm->memset(sl->recv_alloc, 0, buf + slack));
            } else {
                memset(sl->send_alloc, 0, buf + slack);
                memset(sl->recv_alloc, 0, buf + slack);
            }
            sl->send_base = sl->send_alloc;
            sl->recv_base = sl->recv_alloc;
        } else {
            sl->send_base = rank_buffer(st, i, buf + slack, &sl->send_alloc);
            sl->recv_base = rank_buffer(st, i, buf + slack, &sl->recv_alloc);
        }
        if (a->check)
            sl->expect = aligned_buffer(expect + PERF_ALIGN, &sl->expect_alloc);
        if (st->dev_bufs)
            sl->stage = aligned_buffer(buf + slack, &sl->stage_alloc);
    }
}

static void free_buffers(struct perf_state *st)
{
    for (int i = 0; i < st->team.n; i++) {
        struct perf_slot *sl = &st->slots[i];
        if (st->a.local_register) {
            PERF_CHECK(st, st->be->reg_free(sl->ctx, sl->send_alloc, sl->send_reg));
            PERF_CHECK(st, st->be->reg_free(sl->ctx, sl->recv_alloc, sl->recv_reg));
        } else {
            rank_buffer_free(st, i, sl->send_alloc);
            rank_buffer_free(st, i, sl->recv_alloc);
        }
        free(sl->expect_alloc);
        free(sl->stage_alloc);
    }
}

/* Only the main rank prints a usage error; the others give it time to do so before they exit,
 * since weftrun stops every rank as soon as one fails. */
static int usage_exit(int is_main, int rc)
{
    struct timespec ts = {0, 500 * 1000 * 1000};

    fflush(stderr);
    if (!is_main)
        nanosleep(&ts, NULL);
    return rc;
}

/* The ranks of thread st->thread: global rank = (process * threads + thread) * gpus + i, as
 * nccl-tests; a rank's device is its host-local index mod the devices there. */
static void team_create(struct perf_state *st)
{
    const struct perf_args *a = &st->a;
    int per_proc = a->nthreads * a->ngpus;

    st->team.ctx = calloc((size_t)a->ngpus, sizeof(*st->team.ctx));
    st->slots = calloc((size_t)a->ngpus, sizeof(*st->slots));
    if (st->team.ctx == NULL || st->slots == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        exit(1);
    }
    st->team.n = a->ngpus; /* after ctx: the watchdog may read the team */
    for (int i = 0; i < a->ngpus; i++) {
        struct perf_ctx *ctx = &st->team.ctx[i];
        int local = st->thread * a->ngpus + i;

        *ctx = st->proc;
        ctx->rank = st->proc.rank * per_proc + local;
        ctx->nranks = st->proc.nranks * per_proc;
        ctx->local_rank = st->proc.local_rank * per_proc + local;
        ctx->device = st->dev_bufs ? ctx->local_rank % st->dm->ndev : -1;
        ctx->dev_bufs = st->dev_bufs;
        ctx->stream = NULL;
        st->slots[i].ctx = ctx;
        if (st->dev_bufs && !a->stream_null) {
            perf_slot_use(st, i);
            PERF_CUDACHECK(st, st->dm->stream_create(&ctx->stream));
        }
    }
}

static void team_destroy(struct perf_state *st)
{
    for (int i = 0; i < st->team.n; i++) {
        if (st->team.ctx[i].stream != NULL) {
            perf_slot_use(st, i);
            PERF_CUDACHECK(st, st->dm->stream_destroy(st->team.ctx[i].stream));
        }
    }
    free(st->team.ctx);
    free(st->slots);
}

/*
 * WEFT_PERF_DEVICE=1: whether the library lacks a CUDA executor, decided for the whole job. A
 * library that runs device buffers binds each communicator to the device current at its init (as
 * NCCL); one that does not (Weft with the emulated GPU but no executor yet) would run the device
 * tests on its host path, ignoring their streams, so they skip instead, saying so.
 */
static int device_unbound(struct perf_state *st)
{
    int64_t unbound = 0;
    int first = -1, first_dev = -1, first_got = -1;

    for (int i = 0; i < st->team.n; i++) {
        int dev = -1;
        PERF_CHECK(st, st->be->comm_device(&st->team.ctx[i], &dev));
        if (dev == st->team.ctx[i].device)
            continue;
        if (unbound++ == 0) {
            first = st->team.ctx[i].rank;
            first_dev = st->team.ctx[i].device;
            first_got = dev;
        }
    }
    if (st->is_main && unbound > 0)
        printf("# SKIP: WEFT_PERF_DEVICE=1 but the library has no CUDA executor: rank %d on device "
               "%d has a communicator bound to device %d (ncclCommCuDevice)\n", first, first_dev,
               first_got);
    unbound = sum_int64(st, unbound);
    if (st->is_main && unbound > 0)
        printf("# SKIP: %" PRId64 " of %d ranks are not bound to their device\n", unbound,
               st->team.ctx[0].nranks);
    return unbound > 0;
}

/* Everything one driving thread does, from its communicators to the footer. */
static void *thread_main(void *arg)
{
    struct perf_state *st = arg;
    const struct perf_coll *coll = st->coll;
    const struct perf_backend *be = st->be;
    long errors;
    double avg_bw, min_bw = -1;
    const char *env;

    team_create(st);
    PERF_CHECK(st, be->comm_init(&st->team));
    if (st->require_device == 1 && device_unbound(st)) {
        PERF_CHECK(st, be->comm_fini(&st->team));
        team_destroy(st);
        st->rc = 77;
        return NULL;
    }
    perf_print_devices(st);
    allocate_buffers(st);
    /* Allocations may wait for the device (cudaMalloc, cudaMemset), where a collective of another
     * thread's ranks could already wait for this thread: none starts before all are done. */
    threads_sync(st);
    if (st->is_main)
        perf_print_table_header(st);

    for (int ti = 0; ti < st->a.ntypes; ti++) {
        int nops = (coll->flags & PERF_COLL_REDUCE) ? st->a.nops : 1;
        for (int oi = 0; oi < nops; oi++) {
            int op = (coll->flags & PERF_COLL_REDUCE) ? st->a.ops[oi] : PERF_OP_NONE;
            if (!be->supports(st->a.types[ti], op))
                continue; /* a combination "all" brought in that this backend lacks */
            if (!(coll->flags & PERF_COLL_ROOTED)) {
                time_test(st, st->a.types[ti], op, -1);
            } else if (st->a.root >= 0) {
                time_test(st, st->a.types[ti], op, st->a.root);
            } else {
                for (int root = 0; root < st->team.ctx[0].nranks; root++)
                    time_test(st, st->a.types[ti], op, root);
            }
        }
    }

    errors = (long)sum_int64(st, st->local_errors);
    avg_bw = st->bw_count ? st->bw_sum / (double)st->bw_count : 0;
    env = getenv("NCCL_TESTS_MIN_BW");
    if (env != NULL)
        min_bw = atof(env);
    if (st->is_main) {
        const char *last = be->last_error();
        printf("# %-20s : %ld %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
        printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_bw,
               min_bw < 0 ? "" : (avg_bw < min_bw * 0.9 ? "FAILED" : "OK"));
        printf("#\n");
        printf("# Collective test concluded: %s\n", st->prog);
        if (last != NULL && last[0] != '\0')
            printf("# error: %s\n", last);
        else
            printf("\n");
    }
    /* Ranks that exit non-zero make weftrun stop the others: let rank 0 finish printing first. */
    fflush(stdout);
    barrier(st);

    watchdog_disarm(st);
    threads_sync(st); /* as for the allocations: no thread frees while one's collective runs */
    free_buffers(st);
    PERF_CHECK(st, be->comm_fini(&st->team));
    team_destroy(st);
    st->rc = (errors || (min_bw >= 0 && avg_bw < min_bw * 0.9)) ? 7 : 0;
    return NULL;
}

int perf_run(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run,
             const struct perf_backend *be)
{
    struct perf_state *sts, *st;
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    const char *why = "", *env;
    char version_line[256] = "";
    pthread_t threads[PERF_MAX_THREADS], wd;
    int rc, nranks, is_main;

    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return 1;
    setlinebuf(stdout);
    st->coll = coll;
    st->run = run;
    st->prog = prog;
    st->be = be;
    /* Only the main rank reports usage errors and prints the table. */
    is_main = be->early_rank() == 0;
    rc = perf_parse_args(&st->a, argc, argv, prog, is_main, be);
    if (rc != 0) {
        free(st);
        return rc < 0 ? 0 : usage_exit(is_main, rc);
    }
    if (gethostname(st->host, sizeof(st->host) - 1) != 0)
        snprintf(st->host, sizeof(st->host), "localhost");
    st->host[strcspn(st->host, ".")] = '\0';
    st->verbose = getenv("WEFT_PERF_VERBOSE") != NULL;
    /* Device buffers wherever a GPU backend is, unless -H 1 (see devmem.h). The MPI and Gloo
     * peers never look for one (no CUDA runtime loaded into them). */
    st->dm = (be->caps & PERF_BE_DEVICE) ? perf_devmem_get(&why) : NULL;
    st->dev_bufs = st->dm != NULL && !st->a.host_buffers && st->dm->ndev > 0;
    /* perf-smoke's device tests: they must not pass on host buffers, and skip (77) only where
     * the loaded library reports no device backend, saying so. */
    env = getenv("WEFT_PERF_DEVICE");
    st->require_device = env == NULL ? 0 : strcmp(env, "buffers") == 0 ? 2 : atoi(env) != 0;
    if (st->require_device && !st->dev_bufs) {
        if (is_main)
            printf("# SKIP: WEFT_PERF_DEVICE=%s but no device buffers: %s\n", env,
                   st->a.host_buffers ? "-H 1" : (why[0] ? why : "no GPU backend"));
        free(st);
        return usage_exit(is_main, 77);
    }
    /* On the NULL stream a thread's synchronous copy would queue behind a collective whose
     * ranks include another thread's, blocked the same way: refuse rather than hang. */
    if (st->dev_bufs && st->a.stream_null && st->a.nthreads > 1 &&
        st->a.nthreads * st->a.ngpus > st->dm->ndev) {
        if (is_main)
            fprintf(stderr, "%s: -y 1 with -t %d x -g %d ranks on %d devices: threads would share "
                    "a device's NULL stream (deadlock); use streams (-y 0) or fewer ranks\n",
                    prog, st->a.nthreads, st->a.ngpus, st->dm->ndev);
        free(st);
        return usage_exit(is_main, 2);
    }
    if (st->a.graph_launches > 0 && !st->dev_bufs) {
        if (is_main)
            fprintf(stderr, "%s: -G %d needs device buffers: %s\n", prog, st->a.graph_launches,
                    st->a.host_buffers ? "-H 1 asks for host buffers"
                                       : (why[0] ? why : "no GPU backend"));
        free(st);
        return usage_exit(is_main, 2);
    }

    PERF_CHECK(st, be->init(&st->proc, version_line, sizeof(version_line)));
    is_main = st->proc.rank == 0;
    nranks = st->proc.nranks * st->a.nthreads * st->a.ngpus;
    /* Checks that need the rank count; every rank takes the same branch, so all leave cleanly. */
    if ((coll->flags & PERF_COLL_ROOTED) && st->a.root >= nranks) {
        if (is_main)
            fprintf(stderr, "%s: invalid root %d for %d ranks\n", prog, st->a.root, nranks);
        rc = 2;
    } else if ((coll->flags & PERF_COLL_POW2) && (nranks & (nranks - 1)) != 0) {
        if (is_main)
            fprintf(stderr, "%s: %s needs a power-of-two number of ranks, got %d\n", prog,
                    coll->name, nranks);
        rc = 2;
    }
    if (rc != 0) {
        PERF_CHECK(st, be->fini(&st->proc));
        free(st);
        return usage_exit(is_main, rc);
    }

    if (is_main) {
        const struct perf_args *a = &st->a;
        printf("%s\n", version_line);
        printf("# Collective test starting: %s\n", prog);
        printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
               "iters: %d agg iters: %d validation: %d graph: %d unalign: %d\n",
               a->nthreads, a->ngpus, a->min_bytes, a->max_bytes,
               a->step_factor > 1 ? (size_t)a->step_factor : a->step_bytes,
               a->step_factor > 1 ? "factor" : "bytes", a->warmup, a->iters, a->agg, a->check,
               a->graph_launches, a->unalign);
        if (a->blocking == 1)
            printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
        if (a->blocking > 1)
            printf("# Blocking Enabled: wait for completion after each collective (no barrier) \n");
        if (a->json_path) {
            st->json = fopen(a->json_path, "w");
            if (st->json == NULL)
                printf("# skipping json output; %s not accessible: %s\n", a->json_path,
                       strerror(errno));
            else
                printf("# Writing JSON lines to %s\n", a->json_path);
        }
        printf("#\n");
    }

    /* One state per driving thread; thread 0 is this one and alone prints (on process 0). */
    sts = calloc((size_t)st->a.nthreads, sizeof(*sts));
    if (sts == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        return 1;
    }
    for (int t = 0; t < st->a.nthreads; t++) {
        sts[t] = *st;
        sts[t].thread = t;
        sts[t].nteams = nranks / st->a.ngpus;
        sts[t].is_main = is_main && t == 0;
        if (t > 0)
            sts[t].json = NULL;
    }
    free(st);
    st = &sts[0];

    if (st->a.timeout_s > 0) {
        watchdog_timeout_s = st->a.timeout_s;
        watchdog_be = be;
        watchdog_states = sts;
        watchdog_nstates = st->a.nthreads;
        snprintf(watchdog_host, sizeof(watchdog_host), "%s", st->host);
        if (pthread_create(&wd, NULL, watchdog_main, NULL) != 0) {
            fprintf(stderr, "%s: cannot start the -T watchdog thread\n", prog);
            return 1;
        }
        pthread_detach(wd);
    }

    if (st->a.nthreads > 1 &&
        pthread_barrier_init(&perf_threads_barrier, NULL, (unsigned)st->a.nthreads) != 0) {
        fprintf(stderr, "%s: cannot make a barrier of %d threads\n", prog, st->a.nthreads);
        return 1;
    }
    for (int t = 1; t < st->a.nthreads; t++) {
        if (pthread_create(&threads[t], NULL, thread_main, &sts[t]) != 0) {
            fprintf(stderr, "%s: cannot start thread %d of %d\n", prog, t, st->a.nthreads);
            exit(1);
        }
    }
    thread_main(st);
    rc = st->rc;
    for (int t = 1; t < st->a.nthreads; t++) {
        pthread_join(threads[t], NULL);
        if (sts[t].rc > rc)
            rc = sts[t].rc;
    }
    if (st->a.nthreads > 1)
        pthread_barrier_destroy(&perf_threads_barrier);
    if (st->json)
        fclose(st->json);
    PERF_CHECK(st, be->fini(&st->proc));
    free(sts);
    return rc;
}
