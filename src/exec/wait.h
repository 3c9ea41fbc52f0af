/*
 * Doorbells: how a rank sleeps until a peer posts, without busy-waiting forever.
 *
 * Every rank owns one doorbell in memory its peers map. After a peer publishes a counter the rank
 * polls (a slot header of a FIFO into the rank, the head of a FIFO out of it), the peer calls
 * weft_doorbell_ring(). Ringing costs one fence and one load unless the owner is asleep; only
 * then does it bump `seq` and FUTEX_WAKE. The owner announces itself in `sleepers` (a full
 * barrier), re-checks its connections, and only then sleeps on `seq` with a timeout: a post that
 * lands after the re-check sees sleepers != 0 and changes seq, so no wakeup is lost.
 * Futexes are not private: doorbells live in shared memory between processes.
 *
 * A doorbell may instead carry an eventfd (kind WEFT_BELL_EVENTFD, set up by its owner before
 * anyone rings it): the owner is then a proxy thread that sleeps in epoll_wait on its sockets and
 * the eventfd together, and a ring writes the eventfd instead of FUTEX_WAKE. Zeroed memory is a
 * futex doorbell, so shared segments need no initialisation; the fast path (owner awake) costs
 * the same for both kinds.
 */
#ifndef WEFT_EXEC_WAIT_H
#define WEFT_EXEC_WAIT_H

#include <stdint.h>

#include "exec/lane.h"

#define WEFT_BELL_FUTEX 0u
#define WEFT_BELL_EVENTFD 1u

struct weft_doorbell {
    uint32_t seq;
    uint32_t sleepers;
    uint32_t kind; /* WEFT_BELL_FUTEX or WEFT_BELL_EVENTFD; never changes while in use */
    int32_t efd;   /* WEFT_BELL_EVENTFD: the eventfd to write */
    char pad[WEFT_CACHELINE - 4 * sizeof(uint32_t)];
};

void weft_futex_wake(uint32_t *addr);
/* Adds 1 to an eventfd (never blocks: the counter cannot overflow in practice). */
void weft_eventfd_signal(int efd);
/* Sleeps while *addr == expected, at most timeout_ns; returns early on a wake or signal. */
void weft_futex_wait(uint32_t *addr, uint32_t expected, uint64_t timeout_ns);

static inline void weft_doorbell_ring(struct weft_doorbell *bell)
{
    if (bell == 0)
        return;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&bell->sleepers, __ATOMIC_RELAXED) != 0) {
        __atomic_fetch_add(&bell->seq, 1, __ATOMIC_SEQ_CST);
        if (bell->kind == WEFT_BELL_EVENTFD)
            weft_eventfd_signal(bell->efd);
        else
            weft_futex_wake(&bell->seq);
    }
}

static inline void weft_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t weft_time_ns(void);

#include <time.h>
static inline uint64_t weft_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The same clock at the kernel's tick (a few ms): for per-operation records and rate limits,
 * where it costs a few ns against ~20 for the precise one (8 B all-reduce takes ~350 ns). */
static inline uint64_t weft_time_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
