/*
 * The host executor: runs the tasks of one group to completion in the calling thread.
 *
 * Each task becomes one lane per channel (its schedule for this rank). Lanes that share a
 * communicator and channel use the same connections, so they run in issue order: a lane starts
 * when the previous lane with the same key is done. All other lanes progress together, which is
 * what lets one thread drive several communicators, or many peers, without deadlock.
 *
 * Waiting: after a round in which no lane moved, spin a little, then yield, then sleep on the
 * doorbell of the communicator we are blocked on (see fifo.h). While sleeping, every wake-up
 * checks the abort flag, a connection failure a transport's proxy recorded (comm->net_error), the
 * deadline (WEFT_TIMEOUT) and, for a peer on this host, whether its process still exists, so a
 * dead or stuck peer becomes an error naming it instead of a hang.
 *
 * This file is the run loop and its waits. The group's plan and the entry point weft_exec_tasks
 * are host_plan.c's, the caches and the building of lanes host_cache.c's, the checks of a blocked
 * run host_watch.c's; host_run.h holds what they share.
 */
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "core/check.h"
#include "core/communicator.h"
#include "core/param.h"
#include "exec/host_run.h"
#include "exec/lane.h"
#include "exec/sig.h"
#include "exec/wait.h"
#include "exec/zcopy.h"

WEFT_PARAM(SpinCount, "WEFT_SPIN_COUNT", -1,
           "idle polling rounds before a waiting rank starts yielding its core (-1: 100000, a few "
           "milliseconds, or 0 when the host runs more ranks than it has cores)");
WEFT_PARAM(YieldCount, "WEFT_YIELD_COUNT", -1,
           "sched_yield rounds before a waiting rank sleeps on its doorbell (-1: 1000, or 0 when "
           "a socket proxy thread of the process moves the data); 20 ms of them at most");

/*
 * The longest a waiting rank yields before it sleeps on its doorbell, whatever WEFT_YIELD_COUNT
 * says. 1000 yields take about a millisecond while the machine runs only our ranks, but one yield
 * can take a scheduler slice of every other runnable task on the core: with 24 busy loops on 2
 * cores, 1000 yields took 10-25 s. The stuck checks (notes, abort, deadline) run only once the
 * rank sleeps, so a mismatch that moves no data (sig-root) went unnoticed for that long. Asleep,
 * the doorbell wakes it as soon as a peer posts.
 */
#define WEFT_EXEC_YIELD_MAX_NS 20000000ull
/* Polls of one awaited word between two full rounds (exec/wait.h: weft_lane_watch). The rounds
 * in between check the other conditions (a mismatch seen on the other FIFO, errors). */
#define WEFT_EXEC_WATCH_POLLS 64

/* One round over every runnable lane. Returns 1 if anything moved, 0 if not, <0 on error. */
static int weft_exec_round(struct weft_exec_lane *lanes, int nlanes, int *ndone_p,
                           struct weft_exec_block *block)
{
    int moved = 0, ndone = 0;
    for (int i = 0; i < nlanes; i++) {
        struct weft_exec_lane *el = &lanes[i];
        if (weft_lane_done(&el->lane)) {
            ndone++;
            continue;
        }
        if (el->prev_same >= 0 && !weft_lane_done(&lanes[el->prev_same].lane))
            continue;
        if (__builtin_expect(el->zc != NULL, 0) && !el->zc_ctl &&
            weft_zcopy_gated(el->zc, &el->lane))
            continue;
        int peer = -1, send = 0;
        int r = weft_lane_progress(&el->lane, &peer, &send);
        if (r < 0) {
            block->lane = i;
            return -1;
        }
        moved |= r;
        /* A zero-copy controller's phase ended: the next one starts (exec/zcopy.h). */
        if (__builtin_expect(el->zc != NULL, 0) && el->zc_ctl && weft_lane_done(&el->lane) &&
            weft_zcopy_next(el->zc, &el->lane)) {
            moved = 1;
            continue;
        }
        if (weft_lane_done(&el->lane)) {
            ndone++;
            if (__builtin_expect(el->task->enq_ns != 0, 0))
                el->done_ns = weft_time_ns();
        }
        else if (r == 0 && peer >= 0) {
            block->lane = i;
            block->peer = peer;
            block->send = send;
        }
    }
    *ndone_p = ndone;
    return moved;
}

/*
 * Whether other processes crowd the machine: more runnable tasks (the kernel's instantaneous
 * count, /proc/loadavg's fourth field) than twice the online CPUs, sampled at most every 100 ms
 * by whichever rank asks. Then a waiting rank must not spin: the peer it waits for is likely not
 * running, and spinning holds a core the peer needs. 2 ranks on 2 cores with ~20 runnable tasks
 * of other jobs: 8 B all-reduce 5-13 ms per call spinning 100000 rounds first, 3.8 us yielding at
 * once; 1 MiB 2.1-86 ms against 0.33-0.58 ms. One CPU hog (3 runnable on 2 cores) is not
 * crowded: there the long spin keeps the core (0.17 us against 29 us, below).
 */
static int weft_exec_machine_crowded(void)
{
    static uint64_t checked_ns;
    static int crowded, ncpu;
    uint64_t now = weft_time_coarse_ns(); /* called on every wait: the cheap clock */
    if (now - __atomic_load_n(&checked_ns, __ATOMIC_RELAXED) < 100000000ull)
        return __atomic_load_n(&crowded, __ATOMIC_RELAXED);
    __atomic_store_n(&checked_ns, now, __ATOMIC_RELAXED);
    if (__atomic_load_n(&ncpu, __ATOMIC_RELAXED) == 0)
        __atomic_store_n(&ncpu, (int)sysconf(_SC_NPROCESSORS_ONLN), __ATOMIC_RELAXED);
    int c = 0, fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[128];
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        int running = 0;
        if (n > 0) {
            buf[n] = '\0';
            if (sscanf(buf, "%*f %*f %*f %d/", &running) == 1)
                c = ncpu > 0 && running > 2 * ncpu;
        }
    }
    __atomic_store_n(&crowded, c, __ATOMIC_RELAXED);
    return c;
}

/*
 * How long to poll before giving the core away. With a core per rank, polling answers a peer in
 * a fraction of a microsecond, and it must go on for milliseconds: a rank that yields or sleeps
 * sooner hands its core to any other process on the machine and pays ~30 us to get it back on
 * every operation (measured: 2 ranks and one CPU hog on 2 cores, 8 B all-reduce 29 us after 1000
 * polling rounds, 0.17 us after 100000, Open MPI 0.15 us). With more ranks than cores, the peer
 * we wait for may need our core to run at all: then yield at once (sched_yield hands the core to a
 * runnable rank; when none is runnable it returns in well under a microsecond), and sleep only
 * after a long idle stretch. "More ranks than cores" is the job's view, not the communicator's:
 * a 2-rank group split from an 8-rank job on 2 cores polled for milliseconds per wait while its
 * peer waited for a core (weft-train dp 4 x tp 2: 1,200 tok/s, 46,000 with dp 8 alone).
 */
static void weft_exec_wait_policy(const struct ncclComm *comm, int64_t *spins_p, int64_t *yields_p)
{
    int64_t spins = weft_param_SpinCount(), yields = weft_param_YieldCount();
    int crowded = comm->oversubscribed || __atomic_load_n(&weft_host_oversubscribed,
                                                          __ATOMIC_RELAXED);
    /* A proxied rank brings a proxy thread: count both against the machine's cores (2 namespaces
     * x 1 rank on 2 cores: 8 B all-reduce 90-118 us polling 1000 rounds, 25-28 us sleeping at
     * once). */
    int ncpu = comm->peer_info[comm->rank].ncpu;
    crowded |= comm->proxied && ncpu > 0 && 2 * comm->machine_ranks > ncpu;
    /* Over sockets the data moves on this process's proxy thread (and in the kernel's TCP
     * path), which needs the core the waiting rank holds: poll briefly, then sleep on the
     * doorbell the proxy rings. Yielding instead kept the rank runnable, and the scheduler gave
     * it half of a core the proxy needed: 2 namespaces x 1 rank on 2 cores, all-reduce 64 MiB,
     * busbw 0.55 GB/s polling for milliseconds, 1.07-1.3 with 1000 rounds then yields, 1.43-1.69
     * sleeping (iperf3 1.52-1.68 per direction); 2x2, 8 B 280-300 us instead of 440-630. */
    crowded |= weft_exec_machine_crowded(); /* other jobs can crowd the machine too */
    *spins_p = spins >= 0 ? spins : crowded ? 0 : comm->proxied ? 1000 : 100000;
    *yields_p = yields >= 0 ? yields : comm->proxied ? 0 : 1000;
}

/* Runs the lanes to completion; with `resuming`, returns ncclInProgress as soon as a task others
 * wait for is done (the caller adds them, weft_exec_resume, and calls again). */
ncclResult_t weft_host_run(struct weft_exec_lane *lanes, int nlanes, int resuming)
{
    /* The wait policy and the lanes' communicators are looked at only once a round finds
     * nothing to do: a lane that never waits skips them, and a rank that waits for its peer
     * spends that time anyway (a clock read and four knob reads off the 8 B path). */
    int64_t spins = -1, yields = 0;
    int64_t idle = 0;
    uint64_t idle_since = 0, last_check = 0;
    int multi_comm = 0;
    for (;;) {
        struct weft_exec_block block = {-1, -1, 0};
        int ndone = 0;
        int r = weft_exec_round(lanes, nlanes, &ndone, &block);
        if (r < 0)
            return weft_host_lane_error(&lanes[block.lane]);
        if (resuming && weft_host_resume_lane(lanes, nlanes) >= 0)
            return ncclInProgress;
        if (ndone == nlanes)
            return ncclSuccess;
        if (r > 0) {
            idle = 0;
            idle_since = 0;
            continue;
        }
        if (__builtin_expect(spins < 0, 0)) {
            weft_exec_wait_policy(lanes[0].task->comm, &spins, &yields);
            for (int i = 1; i < nlanes; i++)
                multi_comm |= lanes[i].task->comm != lanes[0].task->comm;
        }
        if (idle < spins) {
            /* The one lane left waits for a slice: watch that word alone until it comes. */
            const struct weft_lane *last = block.lane >= 0 ? &lanes[block.lane].lane : NULL;
            if (ndone == nlanes - 1 && last != NULL && !block.send && last->awaited != NULL) {
                idle += 1 + weft_lane_watch(last, WEFT_EXEC_WATCH_POLLS);
            } else {
                idle++;
                weft_cpu_relax();
            }
            continue;
        }
        idle++;
        uint64_t now = weft_time_ns();
        if (idle_since == 0)
            idle_since = now;
        if (idle <= spins + yields && now - idle_since < WEFT_EXEC_YIELD_MAX_NS) {
            sched_yield();
            continue;
        }
        /* Sleep on the doorbell of the communicator we are blocked on. */
        struct ncclComm *comm = lanes[block.lane >= 0 ? block.lane : 0].task->comm;
        struct weft_doorbell *bell = comm->bell;
        if (bell != NULL) {
            uint32_t seq = __atomic_load_n(&bell->seq, __ATOMIC_ACQUIRE);
            int deaf = weft_doorbell_enter(bell) != 0;
            r = weft_exec_round(lanes, nlanes, &ndone, &block);
            /* One comm: its doorbell hears every post; several (or one that may not hear a post):
             * poll at 100 us. */
            if (r == 0)
                weft_futex_wait(&bell->seq, seq, multi_comm || deaf ? 100000 : 50000000);
            weft_doorbell_leave(bell);
            if (r < 0)
                return weft_host_lane_error(&lanes[block.lane]);
            if (r > 0) {
                idle = 0;
                idle_since = 0;
                continue;
            }
        }
        now = weft_time_ns();
        if (now - last_check > 100000000ull) {
            last_check = now;
            /* Only lanes at the head of their connections' order: a later one's FIFO positions
             * are still its predecessor's. Every 100 ms: through a proxy, 100 checks are 10 s. */
            for (int i = 0; i < nlanes; i++)
                if ((lanes[i].prev_same < 0 || weft_lane_done(&lanes[lanes[i].prev_same].lane)) &&
                    weft_lane_check_mismatch(&lanes[i].lane, 100) < 0)
                    return weft_host_lane_error(&lanes[i]);
            /* Notes from other ranks (mismatches, where they wait) and the hang report. */
            int head = block.lane;
            for (int i = 0; head < 0 && i < nlanes; i++)
                if (!weft_lane_done(&lanes[i].lane))
                    head = i;
            if (head >= 0) {
                struct weft_exec_block b = block.lane >= 0 ? block
                                                           : (struct weft_exec_block){head, -1, 0};
                struct weft_sig_wait w;
                weft_host_sig_wait(&lanes[head], &b, &w);
                WEFT_CHECK(weft_sig_poll(lanes[head].task->comm, &w, now - idle_since));
            }
            ncclResult_t res = weft_host_check_stuck(lanes, nlanes, &block, now - idle_since);
            /* A peer may post its last data and exit between our round and the check: look
             * once more before calling it dead. */
            if (res != ncclSuccess && weft_exec_round(lanes, nlanes, &ndone, &block) != 0)
                continue;
            WEFT_CHECK(res);
        }
    }
}
