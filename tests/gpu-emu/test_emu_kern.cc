/*
 * Kernels of the gpu-emu tests, written in the dialect (kernels/dialect.h) and compiled by g++
 * for the emulated GPU. Built with -DWEFT_EMU_WARP_SIZE=1 so blocks of 1, 2 and 4 threads are
 * whole warps.
 */
#include <time.h>

#include "dialect.h"
#include "test_emu_kern.h"

/* Phase 1: every thread writes its global index + 1. Block barrier. Phase 2: each thread reads
 * its right neighbour's phase-1 value (only correct if the barrier ordered the phases). */
WEFT_DEVFN void index_body(const struct temu_index_params *p)
{
    int g = weft_bid() * weft_ntid() + weft_tid();
    int right = weft_bid() * weft_ntid() + (weft_tid() + 1) % weft_ntid();
    /* Delay low threads so that without a barrier the neighbour reads stale data. */
    if (weft_tid() == 0) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    weft_st_relaxed_u32(&p->phase1[g], (uint32_t)g + 1, WEFT_SCOPE_GPU);
    unsigned char *sh = (unsigned char *)weft_shared();
    if (sh != NULL)
        sh[weft_tid()] = (unsigned char)(weft_tid() + 1);
    weft_sync_block();
    uint32_t v = weft_ld_relaxed_u32(&p->phase1[right], WEFT_SCOPE_GPU);
    if (sh != NULL)
        v += 1000u * sh[(weft_tid() + 1) % weft_ntid()];
    p->phase2[g] = v;
    p->dims[g] = (uint32_t)(weft_ntid() << 16 | weft_nbid());
}
WEFT_KERNEL_ENTRY(temu_index, struct temu_index_params, index_body)

/* Producers (first half) fill shared memory and meet on barrier 2 (half the block); then the
 * whole block meets on barrier 1; consumers (second half) copy what their producer wrote. */
WEFT_DEVFN void named_body(const struct temu_index_params *p)
{
    int h = weft_ntid() / 2;
    uint32_t *sh = (uint32_t *)weft_shared();
    int g = weft_bid() * weft_ntid() + weft_tid();
    if (weft_tid() < h) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        sh[weft_tid()] = 7000u + (uint32_t)g;
        weft_bar_sync(2, h);
        /* Every producer is past its store: read another producer's slot. */
        p->phase1[g] = sh[(weft_tid() + 1) % h];
    }
    weft_bar_sync(1, weft_ntid());
    if (weft_tid() >= h)
        p->phase2[g] = sh[weft_tid() - h];
}
WEFT_KERNEL_ENTRY(temu_named, struct temu_index_params, named_body)

/* Named barrier misuse: thread 0 passes 2, thread 1 passes 3. */
WEFT_DEVFN void mismatch_body(const struct temu_index_params *p)
{
    (void)p;
    weft_bar_sync(1, weft_tid() == 0 ? 2 : 3);
}
WEFT_KERNEL_ENTRY(temu_mismatch, struct temu_index_params, mismatch_body)

/* Deadlock: thread 0 waits on the block barrier, thread 1 on a named barrier nobody else joins. */
WEFT_DEVFN void deadlock_body(const struct temu_index_params *p)
{
    (void)p;
    if (weft_tid() == 0)
        weft_sync_block();
    else
        weft_bar_sync(3, 2);
}
WEFT_KERNEL_ENTRY(temu_deadlock, struct temu_index_params, deadlock_body)

/* p[i] = p[i] * mul + add for every i, threads of all blocks striding. */
WEFT_DEVFN void axpb_body(const struct temu_axpb_params *p)
{
    int nt = weft_ntid() * weft_nbid();
    for (int i = weft_bid() * weft_ntid() + weft_tid(); i < p->n; i += nt)
        p->data[i] = p->data[i] * p->mul + p->add;
}
WEFT_KERNEL_ENTRY(temu_axpb, struct temu_axpb_params, axpb_body)

/* Thread 0 sleeps sleep_ms, then stores value with release. */
WEFT_DEVFN void sleep_store_body(const struct temu_flag_params *p)
{
    if (weft_tid() == 0 && weft_bid() == 0) {
        struct timespec ts = {p->sleep_ms / 1000, (long)(p->sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        weft_st_release_u64(p->flag, p->value, WEFT_SCOPE_SYS);
    }
}
WEFT_KERNEL_ENTRY(temu_sleep_store, struct temu_flag_params, sleep_store_body)

/* Every thread spins until *flag == value (acquire), then thread 0 writes *out = value + 1. */
WEFT_DEVFN void spin_body(const struct temu_flag_params *p)
{
    while (weft_ld_acquire_u64(p->flag, WEFT_SCOPE_SYS) != p->value)
        weft_spin_hint();
    if (weft_tid() == 0 && weft_bid() == 0)
        weft_st_relaxed_u64(p->out, p->value + 1, WEFT_SCOPE_SYS);
}
WEFT_KERNEL_ENTRY(temu_spin, struct temu_flag_params, spin_body)

/* Thread 0 of block 0 traps; the others spin forever on a flag nobody sets. */
WEFT_DEVFN void trap_body(const struct temu_flag_params *p)
{
    if (weft_tid() == 0 && weft_bid() == 0) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
        weft_trap("test trap");
    }
    while (weft_ld_acquire_u64(p->flag, WEFT_SCOPE_SYS) != p->value)
        weft_spin_hint();
}
WEFT_KERNEL_ENTRY(temu_trap, struct temu_flag_params, trap_body)

/* Thread 0 of each block: counts blocks running at once and the order blocks started in. */
WEFT_DEVFN void order_body(const struct temu_order_params *p)
{
    if (weft_tid() == 0) {
        uint32_t now = __atomic_add_fetch(p->active, 1, __ATOMIC_ACQ_REL);
        uint32_t seen = __atomic_load_n(p->max_active, __ATOMIC_RELAXED);
        while (now > seen &&
               !__atomic_compare_exchange_n(p->max_active, &seen, now, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
            ;
        p->order[weft_bid()] = __atomic_fetch_add(p->next, 1, __ATOMIC_ACQ_REL);
        struct timespec ts = {0, 3000000};
        nanosleep(&ts, NULL);
        __atomic_sub_fetch(p->active, 1, __ATOMIC_ACQ_REL);
    }
    weft_sync_block();
}
WEFT_KERNEL_ENTRY(temu_order, struct temu_order_params, order_body)

/* v16 and u32 order primitives: out[i] = in[i] (16 bytes each) for i < n, then a fence. */
WEFT_DEVFN void v16_body(const struct temu_v16_params *p)
{
    for (int i = weft_bid() * weft_ntid() + weft_tid(); i < p->n; i += weft_ntid() * weft_nbid()) {
        struct weft_u128 v = weft_ld_volatile_v16((const char *)p->in + 16 * i);
        v.lo += (uint64_t)weft_lane() * 0; /* lane exists on every build */
        weft_st_v16((char *)p->out + 16 * i, weft_ld_v16((const char *)p->in + 16 * i));
        weft_st_release_u32(&p->done[i], (uint32_t)(v.hi == v.lo + 1), WEFT_SCOPE_GPU);
    }
    weft_fence(WEFT_SCOPE_SYS);
    (void)weft_globaltimer_ns();
}
WEFT_KERNEL_ENTRY(temu_v16, struct temu_v16_params, v16_body)

/*
 * Ranks' kernels talking through memory, as collective kernels do: thread 0 of each block sends
 * to the same block of the right rank through a one-slot mailbox with a credit (ack), and
 * receives from the left; the other threads meet it at a block barrier every iteration.
 */
WEFT_DEVFN void ring_body(const struct temu_ring_params *p)
{
    int nb = weft_nbid(), b = weft_bid();
    int right = (p->rank + 1) % p->nranks;
    uint64_t sum = 0;
    for (int i = 1; i <= p->iters; i++) {
        if (weft_tid() == 0) {
            int to = right * nb + b, me = p->rank * nb + b;
            while (weft_ld_acquire_u64(&p->ack[to], WEFT_SCOPE_SYS) != (uint64_t)(i - 1))
                weft_spin_hint();
            weft_st_relaxed_u64(&p->mail[to], (uint64_t)(p->rank * 1000 + i * 10 + b),
                                WEFT_SCOPE_SYS);
            weft_st_release_u64(&p->flag[to], (uint64_t)i, WEFT_SCOPE_SYS);
            while (weft_ld_acquire_u64(&p->flag[me], WEFT_SCOPE_SYS) < (uint64_t)i)
                weft_spin_hint();
            sum += weft_ld_relaxed_u64(&p->mail[me], WEFT_SCOPE_SYS);
            weft_st_release_u64(&p->ack[me], (uint64_t)i, WEFT_SCOPE_SYS);
        }
        weft_sync_block();
    }
    if (weft_tid() == 0)
        p->out[p->rank * nb + b] = sum;
}
WEFT_KERNEL_ENTRY(temu_ring, struct temu_ring_params, ring_body)

extern "C" {
const struct weft_kernel temu_ring_kernel = {"temu_ring", NULL, temu_ring_emu};
const struct weft_kernel temu_index_kernel = {"temu_index", NULL, temu_index_emu};
const struct weft_kernel temu_named_kernel = {"temu_named", NULL, temu_named_emu};
const struct weft_kernel temu_mismatch_kernel = {"temu_mismatch", NULL, temu_mismatch_emu};
const struct weft_kernel temu_deadlock_kernel = {"temu_deadlock", NULL, temu_deadlock_emu};
const struct weft_kernel temu_axpb_kernel = {"temu_axpb", NULL, temu_axpb_emu};
const struct weft_kernel temu_sleep_store_kernel = {"temu_sleep_store", NULL, temu_sleep_store_emu};
const struct weft_kernel temu_spin_kernel = {"temu_spin", NULL, temu_spin_emu};
const struct weft_kernel temu_trap_kernel = {"temu_trap", NULL, temu_trap_emu};
const struct weft_kernel temu_order_kernel = {"temu_order", NULL, temu_order_emu};
const struct weft_kernel temu_v16_kernel = {"temu_v16", NULL, temu_v16_emu};
}
