/*
 * The FIFO contract between the transports and the host step engine (exec/lane.h): the layout of
 * a connection, which the transports lay out in memory and the engine reads and writes, and the
 * doorbell a rank sleeps on, which peers and proxies ring. Transports include this, never
 * src/exec.
 *
 * A connection is a FIFO of nslots slots in memory both ends can address (shared memory for
 * shm, local memory for the simulator; a proxy thread bridges it for the socket transport).
 * Step s of a connection uses slot s % nslots. Each slot begins with a header that the sender
 * writes last, with a release store of `seq = s + 1`: the flag travels with the data, so a small
 * message costs the receiver one cache line (header and payload share the slot's first line).
 * The receiver returns slots by publishing `head` (steps freed) in the control block; the sender
 * re-reads it only when its cached copy says the FIFO is full. After publishing, each side rings
 * the other's doorbell (below) so a sleeping peer wakes up.
 *
 * LL (NCCL's name for its low-latency protocol): a connection may carry a second FIFO (conn->ll)
 * of WEFT_LL_SLOTS small slots (1 KiB, up to WEFT_LL_PAYLOAD bytes each), for the steps that fit
 * one such slot (exec/lane.h says which take it). The LL FIFO is deep: on a host with more ranks
 * than cores, a rank posts many small operations before it gives its core away and its peers
 * drain them in one turn each (8 ranks on 2 cores: broadcast and reduce of 32 B - 512 B
 * 1.5-3x faster; 4 ranks: 1.3-2x). Large slices keep to WEFT_STEPS slots: letting them run 32
 * deep made all-reduce of 32 KiB on 8 ranks 1.7x slower (their data left the caches). 4 KiB LL
 * slots sped up 2 KiB steps too, but cost 128 KiB of mapped memory per connection, 4x this.
 *
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
#ifndef WEFT_FIFO_H
#define WEFT_FIFO_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "dev_fifo.h" /* WEFT_STEPS, WEFT_CHUNK_SLOTS, WEFT_CACHELINE and the credit rules */

/* ---- the connection ------------------------------------------------------------------------ */

#define WEFT_SLOT_HEADER 16
/* The LL FIFO (slots: a power of two, as WEFT_STEPS). */
#define WEFT_LL_SLOTS 32
#define WEFT_LL_SLOT_BYTES 1024
#define WEFT_LL_PAYLOAD (WEFT_LL_SLOT_BYTES - WEFT_SLOT_HEADER)

/* The first bytes of every slot. */
struct weft_slot_header {
    uint64_t seq;   /* step + 1 once the slot holds that step's data; written last (release) */
    uint32_t bytes; /* payload bytes of the slice */
    uint32_t sig;   /* the operation's signature hash (exec/sig.h); 0: the sender does not check */
};

/* hdr->bytes of a slot whose payload is a weft_direct_desc (no slice is ever this large; direct
 * sends: exec/lane.h). */
#define WEFT_SLOT_DIRECT 0xffffffffu

/* How a receiver reads its sender's memory (conn->direct). */
enum {
    WEFT_DIRECT_NONE = 0, /* it does not: every slice travels in the FIFO */
    WEFT_DIRECT_MEMCPY,   /* one address space (ranks as threads of one process, or self) */
    WEFT_DIRECT_CMA,      /* another process: process_vm_readv (cross memory attach) */
};

/* Payload bytes one slot carries. */
static inline size_t weft_slot_payload(size_t slot_bytes)
{
    return slot_bytes - WEFT_SLOT_HEADER;
}

/* Lives in memory both ends map (the receiver's); written by the receiver only. */
struct weft_fifo_ctrl {
    uint64_t head;   /* steps the receiver has freed */
    uint32_t direct; /* WEFT_DIRECT_*: set once at setup, before the ranks agree it is done */
    char pad0[WEFT_CACHELINE - sizeof(uint64_t) - sizeof(uint32_t)];
};

struct weft_doorbell;

/* One end of one connection (each side has its own struct; they share ctrl and slots). */
struct weft_conn {
    struct weft_fifo_ctrl *ctrl;
    char *slots;                    /* nslots * slot_bytes, zeroed, in the receiver's memory */
    size_t slot_bytes;              /* multiple of 64, header included */
    uint32_t nslots;                /* WEFT_STEPS, or WEFT_LL_SLOTS for an LL FIFO: powers of two */
    uint64_t step;                  /* next step this end posts (send) or frees (recv) */
    struct weft_doorbell *peer_bell; /* rung after posting; NULL: nobody to wake */
    uint64_t head_seen;             /* sender: last value of ctrl->head it read */
    struct weft_conn *ll;           /* the LL FIFO beside this one, same direction; NULL: none */
    int ll_ordered;                 /* the peer's posts to the two become visible here in the
                                     * order it made them (shm; not through a socket proxy,
                                     * which bridges each FIFO on its own) */
    int direct;                     /* WEFT_DIRECT_*: how the receiver reads direct sends (both
                                     * ends; NONE: the sender never makes one) */
    int direct_pid;                 /* receiver, WEFT_DIRECT_CMA: the sender's process */
    uint64_t direct_until;          /* sender: the step after its last direct send */
    uint64_t direct_reads;          /* receiver: direct sends it has read (statistics, tests) */
};

/* The slot of `step` in conn's FIFO (nslots is a power of two: a mask, not a division, which
 * cost 20 ns a slice on 2-rank 8 B all-reduce). */
static inline struct weft_slot_header *weft_conn_slot(const struct weft_conn *conn, uint64_t step)
{
    size_t slot = weft_fifo_slot(step, conn->nslots);
    return (struct weft_slot_header *)(conn->slots + slot * conn->slot_bytes);
}

/* The connections a lane may use, indexed by peer rank. */
struct weft_peer_conns {
    struct weft_conn *send; /* to this peer; NULL if not connected */
    struct weft_conn *recv; /* from this peer; NULL if not connected */
};

/* ---- the doorbell -------------------------------------------------------------------------- */

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

/* ---- polling and clocks, for everyone who waits on a FIFO or a doorbell -------------------- */

static inline void weft_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

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
