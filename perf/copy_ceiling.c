/*
 * copy_ceiling: what two cores of this machine can move between them with no library at all, the
 * ceiling under any 2-rank host all-reduce (Weft's, Open MPI's, MPICH's).
 *
 *   build/perf/copy_ceiling [-b BYTES] [-s SLOT_BYTES] [-S SECONDS] [-k REPEATS]
 *
 * Two threads, pinned to the first two CPUs this process may use, pass data through rings of 8
 * slots in shared memory, as ranks of one host do through Weft's shm FIFOs:
 *   one-way     thread 0 copies BYTES from a private buffer into the ring, thread 1 copies them
 *               out into its own: GB/s of data delivered;
 *   both-ways   each thread does both at once, into and out of two rings: GB/s delivered in all;
 *   allreduce   a float-sum all-reduce of BYTES on the two threads with Weft's 2-rank ring
 *               schedule (per piece of two slots: send one, reduce the peer's into the output and
 *               forward the result, copy the peer's result) and nothing else (no headers, checks,
 *               doorbells or progress engine): busbw as nccl-tests reports it. The result is
 *               checked element by element; a wrong one makes the tool exit 1.
 * Each figure is the median of REPEATS timed runs of about SECONDS, iterations chosen from an
 * untimed calibration run; the spread is (slowest - fastest) / median.
 *
 * Every byte an all-reduce delivers crosses from one core's caches to the other's, so a 2-rank
 * all-reduce of BYTES moves at least BYTES each way: its busbw is bounded by about half the
 * both-ways figure, and the allreduce figure shows what the schedule reaches on this machine.
 * Machines differ widely here (cross-core transfers go through the host's mesh or sockets), so a
 * 2-rank comparison between libraries reads best next to these figures.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RING_SLOTS 8
#define SPINS_BEFORE_YIELD 4096 /* a shared core must not starve the thread we wait for */
#define RUN_DEADLINE_S 60.0     /* a wait this long means the other thread is gone */

struct ring {
    char *slots;
    size_t slot_bytes;
    _Alignas(64) uint64_t posted; /* slots written (producer) */
    _Alignas(64) uint64_t freed;  /* slots consumed (consumer) */
    _Alignas(64) uint64_t sent;   /* producer-private: next slot to write */
    uint64_t taken;               /* consumer-private: next slot to read */
};

struct ceiling {
    size_t bytes, slot_bytes;
    struct ring ring[2];          /* ring[r]: into thread r */
    float *in[2], *out[2];
    char *src[2], *dst[2];
    pthread_barrier_t barrier;
    int cpu[2];
    int test;                     /* which figure the threads run */
    uint64_t iters;
};

enum { FIG_ONE_WAY, FIG_BOTH_WAYS, FIG_ALLREDUCE, FIG_COUNT };
static const char *const fig_names[FIG_COUNT] = {"one-way", "both-ways", "allreduce"};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void wait_until(const uint64_t *word, uint64_t at_least, const char *what)
{
    double start = 0;
    for (unsigned spins = 0; __atomic_load_n(word, __ATOMIC_ACQUIRE) < at_least; spins++) {
        if (spins < SPINS_BEFORE_YIELD) {
            __builtin_ia32_pause();
            continue;
        }
        sched_yield();
        if (start == 0)
            start = now_s();
        else if (now_s() - start > RUN_DEADLINE_S) {
            fprintf(stderr, "copy_ceiling: no progress for %.0f s waiting for %s\n",
                    RUN_DEADLINE_S, what);
            exit(1);
        }
    }
}

static char *ring_send_slot(struct ring *q)
{
    if (q->sent >= RING_SLOTS)
        wait_until(&q->freed, q->sent - RING_SLOTS + 1, "a free slot");
    return q->slots + (q->sent % RING_SLOTS) * q->slot_bytes;
}

static void ring_post(struct ring *q)
{
    __atomic_store_n(&q->posted, ++q->sent, __ATOMIC_RELEASE);
}

static const char *ring_recv_slot(struct ring *q)
{
    wait_until(&q->posted, q->taken + 1, "the other thread's data");
    return q->slots + (q->taken % RING_SLOTS) * q->slot_bytes;
}

static void ring_free(struct ring *q)
{
    __atomic_store_n(&q->freed, ++q->taken, __ATOMIC_RELEASE);
}

static void reduce_sum(float *dst, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = a[i] + b[i];
}

/* One iteration of the figure c->test on thread r. */
static void ceiling_iteration(struct ceiling *c, int r)
{
    size_t slot = c->slot_bytes, nslots = c->bytes / slot;
    struct ring *mine = &c->ring[r], *theirs = &c->ring[1 - r];
    switch (c->test) {
    case FIG_ONE_WAY:
        for (size_t k = 0; k < nslots; k++) {
            if (r == 0) {
                memcpy(ring_send_slot(&c->ring[1]), c->src[0] + k * slot, slot);
                ring_post(&c->ring[1]);
            } else {
                memcpy(c->dst[1] + k * slot, ring_recv_slot(mine), slot);
                ring_free(mine);
            }
        }
        break;
    case FIG_BOTH_WAYS:
        for (size_t k = 0; k < nslots; k++) {
            memcpy(ring_send_slot(theirs), c->src[r] + k * slot, slot);
            ring_post(theirs);
            memcpy(c->dst[r] + k * slot, ring_recv_slot(mine), slot);
            ring_free(mine);
        }
        break;
    case FIG_ALLREDUCE: {
        /* Pieces of two slots: thread r owns the reduction of half r of each piece. */
        size_t chunk = slot / sizeof(float), piece = 2 * chunk;
        const float *in = c->in[r];
        float *out = c->out[r];
        for (size_t base = 0; base + piece <= c->bytes / sizeof(float); base += piece) {
            size_t own = base + (size_t)r * chunk, other = base + (size_t)(1 - r) * chunk;
            memcpy(ring_send_slot(theirs), in + other, slot);
            ring_post(theirs);
            const float *got = (const float *)ring_recv_slot(mine);
            float *fwd = (float *)ring_send_slot(theirs);
            reduce_sum(out + own, got, in + own, chunk);
            memcpy(fwd, out + own, slot);
            ring_free(mine);
            ring_post(theirs);
            memcpy(out + other, ring_recv_slot(mine), slot);
            ring_free(mine);
        }
        break;
    }
    }
}

static void pin_to(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    if (err != 0)
        fprintf(stderr, "copy_ceiling: pinning to CPU %d failed: %s\n", cpu, strerror(err));
}

/* Thread 1 runs whatever figure main (thread 0) set, between two barriers; test < 0 ends it. */
static void *ceiling_thread(void *p)
{
    struct ceiling *c = p;
    pin_to(c->cpu[1]);
    for (;;) {
        pthread_barrier_wait(&c->barrier); /* main has set test and iters */
        if (c->test < 0)
            return NULL;
        for (uint64_t i = 0; i < c->iters; i++)
            ceiling_iteration(c, 1);
        pthread_barrier_wait(&c->barrier);
    }
}

/* Seconds thread 0 took for iters iterations of the figure test, thread 1 doing its part. */
static double ceiling_run(struct ceiling *c, int test, uint64_t iters)
{
    c->test = test;
    c->iters = iters;
    pthread_barrier_wait(&c->barrier);
    double t0 = now_s();
    for (uint64_t i = 0; i < iters; i++)
        ceiling_iteration(c, 0);
    pthread_barrier_wait(&c->barrier);
    return now_s() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *page_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes) != 0) {
        fprintf(stderr, "copy_ceiling: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

static long check_allreduce(const struct ceiling *c)
{
    long wrong = 0;
    size_t n = c->bytes / sizeof(float);
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < n; i++)
            if (c->out[r][i] != c->in[0][i] + c->in[1][i])
                wrong++;
    return wrong;
}

static void usage(void)
{
    fprintf(stderr, "usage: copy_ceiling [-b BYTES] [-s SLOT_BYTES] [-S SECONDS] [-k REPEATS]\n"
                    "  BYTES a multiple of 2 x SLOT_BYTES (default 1048576, 32768); -S 0.2, "
                    "-k 5\n");
    exit(2);
}

static int first_two_cpus(int cpu[2])
{
    cpu_set_t set;
    cpu[0] = cpu[1] = -1;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return 0;
    int found = 0;
    for (int i = 0; i < CPU_SETSIZE && found < 2; i++)
        if (CPU_ISSET(i, &set))
            cpu[found++] = i;
    if (found < 2)
        cpu[0] = cpu[1] = -1;
    return found;
}

int main(int argc, char **argv)
{
    size_t bytes = 1 << 20, slot = 32768;
    double target = 0.2;
    int repeats = 5, opt;
    while ((opt = getopt(argc, argv, "b:s:S:k:h")) != -1) {
        switch (opt) {
        case 'b': bytes = strtoull(optarg, NULL, 0); break;
        case 's': slot = strtoull(optarg, NULL, 0); break;
        case 'S': target = atof(optarg); break;
        case 'k': repeats = atoi(optarg); break;
        default: usage();
        }
    }
    if (slot < 64 || slot % 64 != 0 || bytes < 2 * slot || bytes % (2 * slot) != 0 ||
        repeats < 1 || repeats > 99 || !(target > 0))
        usage();

    struct ceiling c = {.bytes = bytes, .slot_bytes = slot};
    int cpus = first_two_cpus(c.cpu);
    for (int r = 0; r < 2; r++) {
        c.ring[r].slots = page_alloc(RING_SLOTS * slot);
        c.ring[r].slot_bytes = slot;
        c.in[r] = page_alloc(bytes);
        c.out[r] = page_alloc(bytes);
        c.src[r] = page_alloc(bytes);
        c.dst[r] = page_alloc(bytes);
        memset(c.src[r], 1 + r, bytes);
        /* small integers: every sum is exact in float, so the check is an equality */
        for (size_t i = 0; i < bytes / sizeof(float); i++)
            c.in[r][i] = (float)((i * 7 + (size_t)r * 13) % 251);
    }
    pthread_barrier_init(&c.barrier, NULL, 2);
    pthread_t peer;
    int err = pthread_create(&peer, NULL, ceiling_thread, &c);
    if (err != 0) {
        fprintf(stderr, "copy_ceiling: pthread_create: %s\n", strerror(err));
        return 1;
    }
    pin_to(c.cpu[0]);

    printf("# copy_ceiling: 2 threads %s, %zu bytes, rings of %d slots of %zu bytes\n",
           cpus >= 2 ? "pinned to the first two CPUs allowed" : "unpinned (fewer than 2 CPUs)",
           bytes, RING_SLOTS, slot);
    printf("# %-10s %9s %7s %11s %9s\n", "figure", "GB/s", "spread", "us per iter", "iters");
    long wrong = 0;
    for (int test = 0; test < FIG_COUNT; test++) {
        /* calibrate (and warm the caches) with runs that double until one takes 10 ms */
        uint64_t iters = 1;
        double t = ceiling_run(&c, test, iters);
        while (t < 0.01 && iters < (1ull << 40)) {
            iters *= 2;
            t = ceiling_run(&c, test, iters);
        }
        uint64_t timed = (uint64_t)((double)iters * target / t);
        if (timed < 1)
            timed = 1;
        double per[100];
        for (int k = 0; k < repeats; k++)
            per[k] = ceiling_run(&c, test, timed) / (double)timed;
        qsort(per, (size_t)repeats, sizeof(per[0]), cmp_double);
        double med = per[repeats / 2];
        /* one-way delivers BYTES per iteration, both-ways 2 x BYTES; all-reduce busbw of 2 ranks
         * is its algbw */
        double moved = test == FIG_BOTH_WAYS ? 2.0 * (double)bytes : (double)bytes;
        printf("  %-10s %9.2f %6.0f%% %11.1f %9llu\n", fig_names[test], moved / med / 1e9,
               100.0 * (per[repeats - 1] - per[0]) / med, med * 1e6, (unsigned long long)timed);
        if (test == FIG_ALLREDUCE)
            wrong = check_allreduce(&c);
    }
    c.test = -1;
    pthread_barrier_wait(&c.barrier);
    pthread_join(peer, NULL);
    if (wrong != 0) {
        printf("# allreduce: %ld wrong elements\n", wrong);
        return 1;
    }
    printf("# allreduce: every element checked, 0 wrong\n");
    return 0;
}
