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
 * The ring's fence orders the poster's publish before its look at `sleepers` (the store-load
 * order x86 does not give for free). It stalls until the publish reaches the peer's cache: a
 * post's line is the one the peer polls, so that is a cache-line round trip on every post (perf,
 * 2-rank 8 B all-reduce: the fence after the post was 12% of the laggard rank's time). A futex
 * doorbell whose owner can run membarrier (light, set by weft_doorbell_init) takes the fence off
 * the posters: the owner, after announcing itself and before its re-check, calls
 * membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), which runs a full barrier on every CPU that runs a
 * thread of a registered process at that moment (and a thread not running has passed one at its
 * context switch). A poster of a registered process then needs only a compiler barrier: either
 * its publish came before that barrier and the owner's re-check sees it, or its look at
 * `sleepers` came after it and sees the owner. A poster whose process could not register (a
 * seccomp filter, an old kernel) keeps the fence, and so does every ring of a bell not light.
 * Sleeping is the slow path (after the spins and yields): the system call costs ~1 us there.
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
    uint32_t kind;  /* WEFT_BELL_FUTEX or WEFT_BELL_EVENTFD; never changes while in use */
    int32_t efd;    /* WEFT_BELL_EVENTFD: the eventfd to write */
    uint32_t light; /* 1: the owner runs membarrier before it sleeps (posters need no fence) */
    char pad[WEFT_CACHELINE - 5 * sizeof(uint32_t)];
};

/* 1 once this process is registered for expedited global membarrier (weft_doorbell_init). */
extern int weft_bell_registered;

/* Sets up a doorbell its owner is about to share (before anyone rings it): a futex one is light
 * where this process can run membarrier; efd is the eventfd of WEFT_BELL_EVENTFD. */
void weft_doorbell_init(struct weft_doorbell *bell, uint32_t kind, int efd);

/* The owner announces it is about to sleep on bell, then must look at what it waits for once
 * more before sleeping. Returns 0, or -1 when the membarrier failed (it does not once registered):
 * then a post may go unheard, and the owner sleeps only briefly. */
int weft_doorbell_enter(struct weft_doorbell *bell);
void weft_doorbell_leave(struct weft_doorbell *bell);

void weft_futex_wake(uint32_t *addr);
/* Adds 1 to an eventfd (never blocks: the counter cannot overflow in practice). */
void weft_eventfd_signal(int efd);
/* Sleeps while *addr == expected, at most timeout_ns; returns early on a wake or signal. */
void weft_futex_wait(uint32_t *addr, uint32_t expected, uint64_t timeout_ns);

static inline void weft_doorbell_ring(struct weft_doorbell *bell)
{
    if (bell == 0)
        return;
    if (weft_bell_registered && __atomic_load_n(&bell->light, __ATOMIC_RELAXED))
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the owner's membarrier fences this CPU */
    else
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

/*
 * For a lane that weft_lane_progress left blocked on data: polls only the word it waits on, at
 * most `polls` times with a pause between, and returns how many it made. A waiting rank's full
 * round over its lanes takes longer than the pause, so the data is seen sooner: a cache-line
 * exchange between the 2 vCPUs of the AMD machine takes ~50 ns, a round plus pause ~60.
 */
static inline int weft_lane_watch(const struct weft_lane *lane, int polls)
{
    int n = 0;
    while (n < polls && __atomic_load_n(lane->awaited, __ATOMIC_ACQUIRE) != lane->awaited_seq) {
        n++;
        weft_cpu_relax();
    }
    return n;
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
