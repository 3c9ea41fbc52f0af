/*
 * kernels/dialect.h through nvcc: every primitive in one kernel, compiled to PTX; check_ptx.sh
 * then checks that each memory-order primitive became the instruction the dialect promises
 * (ld.acquire / st.release / ld.relaxed / st.relaxed with .gpu and .sys, fence.acq_rel, bar.sync,
 * v2.u64 vectors, %globaltimer, nanosleep).
 */
#include "dialect.h"

struct dialect_check_params {
    uint64_t *p64;
    uint32_t *p32;
    void *v;
};

WEFT_DEVFN void dialect_check_body(const struct dialect_check_params *p)
{
    uint64_t a = weft_ld_acquire_u64(p->p64, WEFT_SCOPE_GPU);
    a += weft_ld_acquire_u64(p->p64 + 1, WEFT_SCOPE_SYS);
    a += weft_ld_relaxed_u64(p->p64 + 2, WEFT_SCOPE_GPU);
    a += weft_ld_relaxed_u64(p->p64 + 3, WEFT_SCOPE_SYS);
    weft_st_release_u64(p->p64 + 4, a, WEFT_SCOPE_GPU);
    weft_st_release_u64(p->p64 + 5, a, WEFT_SCOPE_SYS);
    weft_st_relaxed_u64(p->p64 + 6, a, WEFT_SCOPE_GPU);
    weft_st_relaxed_u64(p->p64 + 7, a, WEFT_SCOPE_SYS);
    uint32_t b = weft_ld_acquire_u32(p->p32, WEFT_SCOPE_GPU);
    b += weft_ld_acquire_u32(p->p32 + 1, WEFT_SCOPE_SYS);
    b += weft_ld_relaxed_u32(p->p32 + 2, WEFT_SCOPE_SYS);
    weft_st_release_u32(p->p32 + 3, b, WEFT_SCOPE_SYS);
    weft_st_relaxed_u32(p->p32 + 4, b, WEFT_SCOPE_GPU);
    weft_fence(WEFT_SCOPE_GPU);
    weft_fence(WEFT_SCOPE_SYS);
    struct weft_u128 v = weft_ld_v16(p->v);
    struct weft_u128 w = weft_ld_volatile_v16((char *)p->v + 16);
    v.lo += w.hi + (uint64_t)weft_lane() + (uint64_t)weft_warp();
    weft_st_v16((char *)p->v + 32, v);
    weft_st_volatile_v16((char *)p->v + 48, w);
    ((uint32_t *)weft_shared())[weft_tid()] = (uint32_t)weft_globaltimer_ns();
    weft_sync_block();
    weft_bar_sync(1, weft_ntid());
    if (weft_bid() == weft_nbid())
        weft_trap("unreachable");
    weft_spin_hint();
}
WEFT_KERNEL_ENTRY(dialect_check, struct dialect_check_params, dialect_check_body)
