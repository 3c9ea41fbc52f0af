/*
 * The collective kernel: one launch per communicator per group, one block per channel (see
 * dev_kernel.h for what each block runs, dev_fifo.h for the protocol).
 *
 * Thread 0 of a block is the block's conductor. It computes the steps of its operations on the
 * device, from the operation's parameters, with the host's own schedule code (algo/sched.c is
 * included below), into a window of the communicator's step scratch; it polls the connections
 * (acquire loads of tail and head), and when a slice of some operation can move it describes the
 * slice in shared memory. Every thread of the block then copies or reduces its part of it
 * (16-byte vectors where the pointers allow, elements otherwise, with the element ops of
 * redop_elem.h, so results equal the host reductions bit for bit), and after a barrier thread 0
 * publishes (release stores of tail and head) and moves on. While nothing can move it spins with
 * weft_spin_hint, reading the abort word and the clock: on abort, or after the deadline without
 * progress, it fills the stuck record and every block leaves.
 *
 * Compiled by g++ as C++ for the emulated GPU (always) and by nvcc for sm_80/sm_90 when the
 * toolkit is found; kernels/dialect.h maps the device primitives for each.
 *
 * Protocols, per operation (weft_dev_op.proto, chosen by exec/cuda.c from NCCL_PROTO and the
 * operation's size alike on every rank): Simple (dev_fifo.h: slots, tail and head counters) and
 * LL (dev_ll.h: 16-byte lines of data and flag halves, head counters only). An LL slice moves
 * when its incoming slot's header line shows the step's flag (thread 0 checks it, so a block
 * never waits inside a slice whose sender has not begun it); every thread then waits for the
 * flags of its own lines, 16 data bytes (two lines) at a time, reduces or copies them, and writes
 * its outgoing lines with one 16-byte volatile store each; a thread that waits past the abort
 * word or the deadline marks the slice failed and thread 0 writes the stuck record.
 * Compile with -DWEFT_LL_FLAG_BITS=8 (and another WEFT_COLL_KERNEL_SUFFIX) for a kernel whose LL
 * flags wrap every 256 steps, and -DWEFT_LL_TEST_SENDER_DELAY_NS=N to write the data lines of
 * every LL slice N ns after its header (the wrap cleanup test, tests/gpu-emu/kern_unit_f8.cc).
 */
#include <stddef.h>
#include <stdint.h>

#include "dialect.h"

#include "algo/sched.h"
#include "compat.h"
#include "dev_fifo.h"
#include "dev_kernel.h"
#include "dev_ll.h"
#include "redop.h"
#include "redop_elem.h"

#if defined(__CUDACC__)
#define WEFT_KFN __device__ __forceinline__
/* A called function, out of the kernel's body: the LL movement (inlined, sm_100's kernel spilled
 * 48 bytes; called, the kernel has none and the function 24 bytes on sm_100, none on sm_90). */
#define WEFT_KFN_CALLED __device__ __noinline__
#define WEFT_SCHED_FN __device__
#else
#define WEFT_KFN inline
#define WEFT_KFN_CALLED
#define WEFT_SCHED_FN
#endif
#define WEFT_SCHED_DEVICE 1

/* The schedules, compiled for the device: C++ names in a namespace (no clash with the host's C
 * functions), with internal linkage (no clash between the g++ and the nvcc objects). */
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* the kernel uses the windowed builder only */
#endif
namespace weft_ksched {
namespace {
#include "algo/sched.c"
}
}
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC diagnostic pop
#endif

namespace {

/* ---- counters, at the connection's scope -------------------------------------------------- */

WEFT_KFN uint64_t ld_acq(const uint64_t *p, int scope)
{
    return scope == WEFT_DEV_SCOPE_GPU ? weft_ld_acquire_u64(p, WEFT_SCOPE_GPU)
                                       : weft_ld_acquire_u64(p, WEFT_SCOPE_SYS);
}

WEFT_KFN void st_rel(uint64_t *p, uint64_t v, int scope)
{
    if (scope == WEFT_DEV_SCOPE_GPU)
        weft_st_release_u64(p, v, WEFT_SCOPE_GPU);
    else
        weft_st_release_u64(p, v, WEFT_SCOPE_SYS);
}

WEFT_KFN uint32_t ld_rlx32(const uint32_t *p, int scope)
{
    return scope == WEFT_DEV_SCOPE_GPU ? weft_ld_relaxed_u32(p, WEFT_SCOPE_GPU)
                                       : weft_ld_relaxed_u32(p, WEFT_SCOPE_SYS);
}

WEFT_KFN void st_rlx32(uint32_t *p, uint32_t v, int scope)
{
    if (scope == WEFT_DEV_SCOPE_GPU)
        weft_st_relaxed_u32(p, v, WEFT_SCOPE_GPU);
    else
        weft_st_relaxed_u32(p, v, WEFT_SCOPE_SYS);
}

/* ---- the slice every thread works on --------------------------------------------------------- */

enum { WORK_NONE = 0, WORK_EXIT = 1, WORK_MOVE = 2 };

struct work {
    int32_t what;    /* WORK_* */
    int32_t dtype;
    int32_t kind;    /* enum weft_red_kind, or -1: copy */
    int32_t pre;     /* apply premul to b */
    int32_t post;    /* apply postdiv to the result */
    int32_t b_fifo;  /* b is a FIFO slot (volatile loads) */
    const char *a;   /* received data (a FIFO slot), or NULL */
    const char *b;   /* the other operand, or the data to copy */
    char *dst;
    char *dst2;      /* a second destination (the outgoing slot), or NULL */
    uint64_t n;      /* elements */
    uint64_t es;     /* element size */
    uint64_t scalar;
    uint64_t divisor;
    /* LL slices (dev_ll.h): the operands come from and go to lines instead of a and dst2 */
    int32_t ll;           /* 1: an LL slice */
    int32_t in_is_b;      /* the incoming lines are b (a copy); otherwise a (a reduction) */
    const char *ll_in;    /* the incoming LL slot (its header line), or NULL */
    char *ll_out;         /* the outgoing LL slot (its header line), or NULL */
    uint32_t in_flag, out_flag;
    uint64_t clean_lines; /* lines of the outgoing slot to write in all (wrap cleanup), or 0 */
    const weft_dev_comm *comm;
    uint32_t failed;      /* set by a thread that gave up waiting for its lines (LL_FAIL_*) */
    uint32_t out_sig;     /* the outgoing header's second word: the operation's signature */
};

/* work.failed: the abort word or the deadline (a stuck record to write), or another block gave
 * up (leave quietly). */
enum { LL_FAIL_NONE = 0, LL_FAIL_ABORT = 1, LL_FAIL_TIMEOUT = 2, LL_FAIL_QUIET = 3 };

template <class T> WEFT_KFN T from_bits(uint64_t b)
{
    union {
        uint64_t u;
        T t;
    } v;
    v.u = b;
    return v.t;
}

template <class T> WEFT_KFN T ld_elem(const char *p, int vol)
{
    return vol ? *(const volatile T *)p : *(const T *)p;
}

#define WEFT_DEV_TRAITS(sfx, T)                                                                    \
    struct tr_##sfx {                                                                              \
        typedef T t;                                                                               \
        template <int K> static WEFT_KFN T red(T a, T b)                                           \
        {                                                                                          \
            return K == WEFT_RED_SUM    ? weft_elem_sum_##sfx(a, b)                                \
                   : K == WEFT_RED_PROD ? weft_elem_prod_##sfx(a, b)                               \
                   : K == WEFT_RED_MAX  ? weft_elem_max_##sfx(a, b)                                \
                                        : weft_elem_min_##sfx(a, b);                               \
        }                                                                                          \
        static WEFT_KFN T premul(T a, T s) { return weft_elem_premul_##sfx(a, s); }                \
        static WEFT_KFN T div(T a, uint64_t d) { return weft_elem_div_##sfx(a, d); }               \
    };
WEFT_DEV_TRAITS(i8, int8_t)
WEFT_DEV_TRAITS(u8, uint8_t)
WEFT_DEV_TRAITS(i32, int32_t)
WEFT_DEV_TRAITS(u32, uint32_t)
WEFT_DEV_TRAITS(i64, int64_t)
WEFT_DEV_TRAITS(u64, uint64_t)
WEFT_DEV_TRAITS(f16, uint16_t)
WEFT_DEV_TRAITS(f32, float)
WEFT_DEV_TRAITS(f64, double)
WEFT_DEV_TRAITS(bf16, uint16_t)
WEFT_DEV_TRAITS(e4m3, uint8_t)
WEFT_DEV_TRAITS(e5m2, uint8_t)
#undef WEFT_DEV_TRAITS

/* One element: r = a OP pre(b), then post; without a: r = pre(b), then post. */
template <class Tr, int K>
WEFT_KFN typename Tr::t elem(typename Tr::t a, typename Tr::t b, int has_a, int pre, int post,
                             typename Tr::t s, uint64_t divisor)
{
    typename Tr::t r = pre ? Tr::premul(b, s) : b;
    if (has_a)
        r = Tr::template red<K>(a, r);
    if (post)
        r = Tr::div(r, divisor);
    return r;
}

/* Reduces (or transforms) w's slice; thread tid of nt. */
template <class Tr, int K> WEFT_KFN void apply(const work *w, int tid, int nt)
{
    typedef typename Tr::t T;
    enum { per = 16 / sizeof(T) };
    const T s = from_bits<T>(w->scalar);
    const int has_a = w->a != NULL, pre = w->pre, post = w->post, bvol = w->b_fifo;
    uintptr_t al = (uintptr_t)w->b | (uintptr_t)w->dst | (uintptr_t)w->a | (uintptr_t)w->dst2;
    uint64_t nv = (al & 15) == 0 ? w->n / per : 0;
    const weft_u128 *av = (const weft_u128 *)w->a, *bv = (const weft_u128 *)w->b;
    weft_u128 *dv = (weft_u128 *)w->dst, *d2v = (weft_u128 *)w->dst2;
    for (uint64_t v = (uint64_t)tid; v < nv; v += (uint64_t)nt) {
        union {
            weft_u128 v;
            T e[per];
        } A, B, R;
        B.v = bvol ? weft_ld_volatile_v16(bv + v) : weft_ld_v16(bv + v);
        if (has_a)
            A.v = weft_ld_volatile_v16(av + v);
        else
            A.v = B.v;
        for (int k = 0; k < per; k++)
            R.e[k] = elem<Tr, K>(A.e[k], B.e[k], has_a, pre, post, s, w->divisor);
        weft_st_v16(dv + v, R.v);
        if (d2v != NULL)
            weft_st_v16(d2v + v, R.v);
    }
    for (uint64_t i = nv * per + (uint64_t)tid; i < w->n; i += (uint64_t)nt) {
        T b = ld_elem<T>(w->b + i * sizeof(T), bvol);
        T a = has_a ? ld_elem<T>(w->a + i * sizeof(T), 1) : b;
        T r = elem<Tr, K>(a, b, has_a, pre, post, s, w->divisor);
        *(T *)(w->dst + i * sizeof(T)) = r;
        if (w->dst2 != NULL)
            *(T *)(w->dst2 + i * sizeof(T)) = r;
    }
}

/* A plain copy of w's slice to one or two destinations. */
WEFT_KFN void copy(const work *w, int tid, int nt)
{
    uint64_t bytes = w->n * w->es;
    uintptr_t al = (uintptr_t)w->b | (uintptr_t)w->dst | (uintptr_t)w->dst2;
    uint64_t nv = (al & 15) == 0 ? bytes / 16 : 0;
    const weft_u128 *bv = (const weft_u128 *)w->b;
    weft_u128 *dv = (weft_u128 *)w->dst, *d2v = (weft_u128 *)w->dst2;
    for (uint64_t v = (uint64_t)tid; v < nv; v += (uint64_t)nt) {
        weft_u128 x = w->b_fifo ? weft_ld_volatile_v16(bv + v) : weft_ld_v16(bv + v);
        weft_st_v16(dv + v, x);
        if (d2v != NULL)
            weft_st_v16(d2v + v, x);
    }
    for (uint64_t i = nv * 16 + (uint64_t)tid; i < bytes; i += (uint64_t)nt) {
        char x = ld_elem<char>(w->b + i, w->b_fifo);
        w->dst[i] = x;
        if (w->dst2 != NULL)
            w->dst2[i] = x;
    }
}

template <class Tr> WEFT_KFN void apply_kind(const work *w, int tid, int nt)
{
    switch (w->kind) {
    case WEFT_RED_SUM:
        apply<Tr, WEFT_RED_SUM>(w, tid, nt);
        break;
    case WEFT_RED_PROD:
        apply<Tr, WEFT_RED_PROD>(w, tid, nt);
        break;
    case WEFT_RED_MAX:
        apply<Tr, WEFT_RED_MAX>(w, tid, nt);
        break;
    default:
        apply<Tr, WEFT_RED_MIN>(w, tid, nt);
        break;
    }
}

/* ---- LL slices ----------------------------------------------------------------------------- */

WEFT_KFN int any_stuck(const weft_dev_comm *comm);

WEFT_KFN weft_u128 ll_line(uint64_t data, uint32_t flag)
{
    weft_u128 v;
    v.lo = weft_ll_half((uint32_t)data, flag);
    v.hi = weft_ll_half((uint32_t)(data >> 32), flag);
    return v;
}

/* Why a thread waiting for its lines must leave (LL_FAIL_*), or LL_FAIL_NONE. */
WEFT_KFN uint32_t ll_should_leave(const work *w, uint64_t since)
{
    const weft_dev_comm *comm = w->comm;
    if (weft_ld_relaxed_u32(&w->failed, WEFT_SCOPE_GPU) != LL_FAIL_NONE || any_stuck(comm))
        return LL_FAIL_QUIET;
    if (weft_ld_relaxed_u32(comm->abort, WEFT_SCOPE_SYS) != 0)
        return LL_FAIL_ABORT;
    if (comm->timeout_ns != 0 && weft_globaltimer_ns() - since > comm->timeout_ns)
        return LL_FAIL_TIMEOUT;
    return LL_FAIL_NONE;
}

/* The 8 data bytes of an LL line once both its flags equal `flag`; 0 (w->failed set) when the
 * block must leave instead. The line's sender has begun the slice (its header was seen), so
 * the wait is short unless the peer is aborted. */
WEFT_KFN int ll_wait_line(work *w, const char *line, uint32_t flag, uint64_t *data)
{
    uint32_t spins = 0;
    uint64_t since = 0;
    for (;;) {
        weft_u128 v = weft_ld_volatile_v16(line);
        if (weft_ll_half_ok(v.lo, flag) && weft_ll_half_ok(v.hi, flag)) {
            *data = (uint64_t)weft_ll_half_data(v.lo) | (uint64_t)weft_ll_half_data(v.hi) << 32;
            return 1;
        }
        if (++spins < 64)
            continue;
        weft_spin_hint();
        if ((spins & 255) != 0)
            continue;
        if (since == 0)
            since = weft_globaltimer_ns();
        uint32_t why = ll_should_leave(w, since);
        if (why != LL_FAIL_NONE) {
            weft_st_relaxed_u32(&w->failed, why, WEFT_SCOPE_GPU);
            return 0;
        }
    }
}

/* 16 bytes of user memory (len <= 16 of them; the rest zero). */
WEFT_KFN weft_u128 ld_pack(const char *p, uint64_t len)
{
    if (len == 16 && ((uintptr_t)p & 15) == 0)
        return weft_ld_v16(p);
    union {
        weft_u128 v;
        uint64_t q[2];
        unsigned char c[16];
    } u;
    u.v.lo = u.v.hi = 0;
    if (len == 16 && ((uintptr_t)p & 7) == 0) {
        u.q[0] = *(const uint64_t *)p;
        u.q[1] = *(const uint64_t *)(p + 8);
        return u.v;
    }
    for (uint64_t i = 0; i < len; i++)
        u.c[i] = (unsigned char)p[i];
    return u.v;
}

WEFT_KFN void st_pack(char *p, weft_u128 v, uint64_t len)
{
    if (len == 16 && ((uintptr_t)p & 15) == 0) {
        weft_st_v16(p, v);
        return;
    }
    union {
        weft_u128 v;
        uint64_t q[2];
        unsigned char c[16];
    } u;
    u.v = v;
    if (len == 16 && ((uintptr_t)p & 7) == 0) {
        *(uint64_t *)p = u.q[0];
        *(uint64_t *)(p + 8) = u.q[1];
        return;
    }
    for (uint64_t i = 0; i < len; i++)
        p[i] = (char)u.c[i];
}

/*
 * Moves w's LL slice: pack k (16 data bytes) is lines 1 + 2k and 2 + 2k of a slot. Thread 0
 * writes the outgoing header first, so the receiver may start while the data lines follow.
 * K < 0: a copy. Returns early (w->failed set) when a wait must end.
 */
template <class Tr, int K> WEFT_KFN void ll_move(work *w, int tid, int nt)
{
    typedef typename Tr::t T;
    enum { per = 16 / sizeof(T) };
    const T s = from_bits<T>(w->scalar);
    const uint64_t bytes = w->n * w->es, npacks = (bytes + 15) / 16;
    const int has_a = w->ll_in != NULL && !w->in_is_b, b_user = w->ll_in == NULL || !w->in_is_b;
    const int pre = w->pre, post = w->post;
    if (tid == 0 && w->ll_out != NULL)
        weft_st_volatile_v16(w->ll_out,
                             ll_line(bytes | (uint64_t)w->out_sig << 32, w->out_flag));
#ifdef WEFT_LL_TEST_SENDER_DELAY_NS
    /* Test builds: the data lines follow the header late, so a receiver that could take a stale
     * line for a fresh one (a missing wrap cleanup) does. */
    if (w->ll_out != NULL) {
        uint64_t t0 = weft_globaltimer_ns();
        while (weft_globaltimer_ns() - t0 < WEFT_LL_TEST_SENDER_DELAY_NS)
            weft_spin_hint();
    }
#endif
    for (uint64_t pk = (uint64_t)tid; pk < npacks; pk += (uint64_t)nt) {
        const uint64_t off = pk * 16, len = bytes - off < 16 ? bytes - off : 16;
        union {
            weft_u128 v;
            T e[per];
        } A, B, R;
        A.v.lo = A.v.hi = 0;
        B.v = A.v;
        if (b_user)
            B.v = ld_pack(w->b + off, len);
        if (w->ll_in != NULL) {
            const char *line = w->ll_in + WEFT_LL_LINE * (1 + 2 * pk);
            weft_u128 x;
            x.hi = 0;
            if (!ll_wait_line(w, line, w->in_flag, &x.lo) ||
                (len > 8 && !ll_wait_line(w, line + WEFT_LL_LINE, w->in_flag, &x.hi)))
                return;
            if (w->in_is_b)
                B.v = x;
            else
                A.v = x;
        }
        if (K < 0) {
            R.v = B.v;
        } else {
            for (int k = 0; k < per; k++)
                R.e[k] = elem<Tr, (K < 0 ? 0 : K)>(A.e[k], B.e[k], has_a, pre, post, s,
                                                   w->divisor);
        }
        if (w->dst != NULL)
            st_pack(w->dst + off, R.v, len);
        if (w->ll_out != NULL) {
            char *line = w->ll_out + WEFT_LL_LINE * (1 + 2 * pk);
            weft_st_volatile_v16(line, ll_line(R.v.lo, w->out_flag));
            if (len > 8)
                weft_st_volatile_v16(line + WEFT_LL_LINE, ll_line(R.v.hi, w->out_flag));
        }
    }
    if (w->ll_out != NULL && w->clean_lines > 0) /* the wrap rule: every other line too */
        for (uint64_t ln = 1 + weft_ll_data_lines(bytes) + (uint64_t)tid; ln < w->clean_lines;
             ln += (uint64_t)nt)
            weft_st_volatile_v16(w->ll_out + WEFT_LL_LINE * ln, ll_line(0, w->out_flag));
}

template <class Tr> WEFT_KFN void ll_kind(work *w, int tid, int nt)
{
    switch (w->kind) {
    case WEFT_RED_SUM:
        ll_move<Tr, WEFT_RED_SUM>(w, tid, nt);
        break;
    case WEFT_RED_PROD:
        ll_move<Tr, WEFT_RED_PROD>(w, tid, nt);
        break;
    case WEFT_RED_MAX:
        ll_move<Tr, WEFT_RED_MAX>(w, tid, nt);
        break;
    default:
        ll_move<Tr, WEFT_RED_MIN>(w, tid, nt);
        break;
    }
}

WEFT_KFN_CALLED void ll_work(work *w, int tid, int nt)
{
    if (w->kind < 0) {
        ll_move<tr_u8, -1>(w, tid, nt);
        return;
    }
    switch (w->dtype) {
    case WEFT_INT8: ll_kind<tr_i8>(w, tid, nt); break;
    case WEFT_UINT8: ll_kind<tr_u8>(w, tid, nt); break;
    case WEFT_INT32: ll_kind<tr_i32>(w, tid, nt); break;
    case WEFT_UINT32: ll_kind<tr_u32>(w, tid, nt); break;
    case WEFT_INT64: ll_kind<tr_i64>(w, tid, nt); break;
    case WEFT_UINT64: ll_kind<tr_u64>(w, tid, nt); break;
    case WEFT_FLOAT16: ll_kind<tr_f16>(w, tid, nt); break;
    case WEFT_FLOAT32: ll_kind<tr_f32>(w, tid, nt); break;
    case WEFT_FLOAT64: ll_kind<tr_f64>(w, tid, nt); break;
    case WEFT_BFLOAT16: ll_kind<tr_bf16>(w, tid, nt); break;
    case WEFT_FP8E4M3: ll_kind<tr_e4m3>(w, tid, nt); break;
    default: ll_kind<tr_e5m2>(w, tid, nt); break;
    }
}

WEFT_KFN void do_work(work *w, int tid, int nt)
{
    if (w->ll) {
        ll_work(w, tid, nt);
        return;
    }
    if (w->kind < 0) {
        copy(w, tid, nt);
        return;
    }
    switch (w->dtype) {
    case WEFT_INT8: apply_kind<tr_i8>(w, tid, nt); break;
    case WEFT_UINT8: apply_kind<tr_u8>(w, tid, nt); break;
    case WEFT_INT32: apply_kind<tr_i32>(w, tid, nt); break;
    case WEFT_UINT32: apply_kind<tr_u32>(w, tid, nt); break;
    case WEFT_INT64: apply_kind<tr_i64>(w, tid, nt); break;
    case WEFT_UINT64: apply_kind<tr_u64>(w, tid, nt); break;
    case WEFT_FLOAT16: apply_kind<tr_f16>(w, tid, nt); break;
    case WEFT_FLOAT32: apply_kind<tr_f32>(w, tid, nt); break;
    case WEFT_FLOAT64: apply_kind<tr_f64>(w, tid, nt); break;
    case WEFT_BFLOAT16: apply_kind<tr_bf16>(w, tid, nt); break;
    case WEFT_FP8E4M3: apply_kind<tr_e4m3>(w, tid, nt); break;
    default: apply_kind<tr_e5m2>(w, tid, nt); break;
    }
}

WEFT_KFN uint64_t dtype_size(int dtype)
{
    switch (dtype) {
    case WEFT_INT8: case WEFT_UINT8: case WEFT_FP8E4M3: case WEFT_FP8E5M2: return 1;
    case WEFT_FLOAT16: case WEFT_BFLOAT16: return 2;
    case WEFT_INT32: case WEFT_UINT32: case WEFT_FLOAT32: return 4;
    default: return 8;
    }
}

/* ---- thread 0: the conductor --------------------------------------------------------------- */

struct lane {
    int op;           /* index in params->ops */
    int key;          /* connection key (dev_kernel.h); lanes with one key run in order */
    int chan;         /* connection channel */
    int finished;
    uint64_t cur;     /* current step */
    uint64_t done;    /* elements of it moved */
    uint64_t total;   /* steps */
    uint64_t win_first, win_n;
    struct weft_sched_args args;
};

struct conductor {
    const weft_dev_params *p;
    weft_dev_comm *comm;
    int b;
    int nlanes;
    lane lanes[WEFT_DEV_MAX_OPS];
    /* the slice being moved */
    int cur_lane;
    weft_dev_conn *rc, *sc; /* connections the slice receives on / sends on, or NULL */
    uint64_t n;
    int ll;                 /* the slice takes the connections' LL FIFOs */
    const weft_step *step;
    /* what blocks us, for the stuck record */
    int blk_lane, blk_peer, blk_send;
    uint64_t blk_expected, blk_seen;
};

WEFT_KFN int step_recvs(int op)
{
    return op != WEFT_STEP_SEND && op != WEFT_STEP_COPY;
}

WEFT_KFN int step_sends(int op)
{
    return op == WEFT_STEP_SEND || op == WEFT_STEP_RECV_REDUCE_SEND ||
           op == WEFT_STEP_RECV_REDUCE_COPY_SEND || op == WEFT_STEP_RECV_COPY_SEND;
}

WEFT_KFN weft_step *lane_window(conductor *c, const lane *l)
{
    return c->comm->steps + weft_dev_win_index(c->b, c->comm->nwin, l->key);
}

/* Builds the lanes of block b: every collective's channel b, and the p2p ops given to b. */
WEFT_KFN void lanes_init(conductor *c)
{
    const weft_dev_comm *comm = c->comm;
    c->nlanes = 0;
    for (int i = 0; i < c->p->nops; i++) {
        const weft_dev_op *op = &c->p->ops[i];
        int p2p = op->coll == WEFT_COLL_SEND || op->coll == WEFT_COLL_RECV;
        if (p2p && op->block != c->b)
            continue;
        lane *l = &c->lanes[c->nlanes++];
        l->op = i;
        l->key = p2p ? 1 + 2 * op->root + (op->coll == WEFT_COLL_RECV) : 0;
        l->chan = p2p ? comm->nchannels : c->b;
        l->finished = 0;
        l->cur = 0;
        l->done = 0;
        l->total = 0;
        l->win_first = 0;
        l->win_n = 0;
        weft_sched_args *a = &l->args;
        a->coll = op->coll;
        a->algo = op->algo;
        a->count = op->count;
        a->nranks = comm->nranks;
        a->rank = comm->rank;
        a->root = op->root;
        a->channel = p2p ? 0 : c->b;
        a->nchannels = p2p ? 1 : comm->nchannels;
        a->chunk = weft_fifo_chunk(op->proto == WEFT_DEV_PROTO_LL ? comm->ll_payload
                                                                  : comm->slot_bytes,
                                   dtype_size(op->dtype));
        a->ring = comm->ring;
        a->ring_pos = comm->ring_pos;
        a->local_ranks = comm->local_ranks;
    }
}

/* The lane's current step, refilling its window when needed; NULL when the lane is done.
 * Returns (weft_step *)1 (never a valid pointer) when the schedule refused the arguments. */
WEFT_KFN const weft_step *lane_step(conductor *c, lane *l)
{
    if (l->finished)
        return NULL;
    if (l->cur < l->win_first || l->cur >= l->win_first + l->win_n) {
        uint64_t total = 0;
        uint64_t got = weft_ksched::weft_sched_build_window(&l->args, l->cur, lane_window(c, l),
                                                            WEFT_DEV_WINDOW, &total);
        if (got == UINT64_MAX)
            return (const weft_step *)1;
        l->total = total;
        l->win_first = l->cur;
        l->win_n = got;
        if (l->cur >= total) {
            l->finished = 1;
            return NULL;
        }
    }
    return lane_window(c, l) + (l->cur - l->win_first);
}

/* 1 when an earlier lane of the block with the same key is not finished. */
WEFT_KFN int lane_waits_turn(const conductor *c, int i)
{
    for (int j = 0; j < i; j++)
        if (c->lanes[j].key == c->lanes[i].key && !c->lanes[j].finished)
            return 1;
    return 0;
}

WEFT_KFN void stuck_report(conductor *c, uint32_t state, const weft_dev_op *op, int peer, int send,
                           uint64_t step, uint64_t expected, uint64_t seen)
{
    weft_dev_stuck *st = &c->comm->stuck[c->b];
    if (weft_ld_relaxed_u32(&st->state, WEFT_SCOPE_SYS) != WEFT_DEV_OK)
        return; /* this block reported already */
    st->channel = c->b;
    st->peer = peer;
    st->send = send;
    st->coll = op != NULL ? op->coll : -1;
    st->op_index = op != NULL ? (int32_t)(op - c->p->ops) : -1;
    st->wait = WEFT_DEV_WAIT_FIFO;
    st->seq = op != NULL ? op->seq : 0;
    st->step = step;
    st->expected = expected;
    st->seen = seen;
    weft_st_release_u32(&st->state, state, WEFT_SCOPE_SYS);
}

/*
 * The LL slice of lane i's step s, when it can move: the incoming slot's header carries the flag
 * of the step (and the slice's size, checked), and the outgoing slot is free. Fills w and the
 * conductor's slice and returns WORK_MOVE; WORK_NONE when blocked (c->blk_* say on what);
 * WORK_EXIT after a stuck record.
 */
WEFT_KFN int ll_slice(conductor *c, int i, const weft_dev_op *op, const weft_step *s,
                      weft_dev_conn *rc, weft_dev_conn *sc, const char *src, char *dst, work *w)
{
    const weft_dev_comm *comm = c->comm;
    lane *l = &c->lanes[i];
    const uint64_t es = w->es, slot_bytes = weft_ll_slot_bytes(comm->ll_payload);
    const uint64_t n = weft_fifo_slice(comm->ll_payload, es, s->count, l->done);
    const char *inslot = NULL;
    char *outslot = NULL;
    if (rc != NULL) {
        inslot = rc->ll_recv_slots + weft_fifo_slot(rc->ll_recv_step, WEFT_STEPS) * slot_bytes;
        uint32_t flag = weft_ll_flag(rc->ll_recv_step);
        weft_u128 h = weft_ld_volatile_v16(inslot);
        if (!weft_ll_half_ok(h.lo, flag) || !weft_ll_half_ok(h.hi, flag)) {
            c->blk_lane = i;
            c->blk_peer = s->recv_peer;
            c->blk_send = 0;
            c->blk_expected = rc->ll_recv_step + 1;
            c->blk_seen = weft_ld_relaxed_u64(&rc->ll_recv_rc->tail, WEFT_SCOPE_SYS);
            return WORK_NONE;
        }
        uint32_t sig = weft_ll_half_data(h.hi); /* the header's second word (signature) */
        if (sig != op->sig && sig != 0 && op->sig != 0) {
            stuck_report(c, WEFT_DEV_SIG_MISMATCH, op, s->recv_peer, 0, l->cur, op->sig, sig);
            return WORK_EXIT;
        }
        if ((uint64_t)weft_ll_half_data(h.lo) != n * es) {
            stuck_report(c, WEFT_DEV_MISMATCH, op, s->recv_peer, 0, l->cur, n * es,
                         weft_ll_half_data(h.lo));
            return WORK_EXIT;
        }
    }
    if (sc != NULL) {
        uint64_t head = ld_acq(&sc->ll_send_sc->head, sc->scope);
        if (!weft_fifo_has_credit(head, sc->ll_send_step, WEFT_STEPS)) {
            c->blk_lane = i;
            c->blk_peer = s->send_peer;
            c->blk_send = 1;
            c->blk_expected = sc->ll_send_step + 1 - WEFT_STEPS;
            c->blk_seen = head;
            return WORK_NONE;
        }
        outslot = sc->ll_send_slots + weft_fifo_slot(sc->ll_send_step, WEFT_STEPS) * slot_bytes;
    }
    w->ll = 1;
    w->n = n;
    w->kind = (int)op->kind;
    w->in_is_b = 0;
    w->ll_in = inslot;
    w->ll_out = outslot;
    w->in_flag = rc != NULL ? weft_ll_flag(rc->ll_recv_step) : 0;
    w->out_flag = sc != NULL ? weft_ll_flag(sc->ll_send_step) : 0;
    w->out_sig = op->sig;
    w->clean_lines = sc != NULL && weft_ll_cleanup(sc->ll_send_step) ? slot_bytes / WEFT_LL_LINE
                                                                     : 0;
    w->b = src;
    w->dst = NULL;
    switch (s->op) {
    case WEFT_STEP_SEND:
        w->kind = w->pre || w->post ? (int)op->kind : -1;
        break;
    case WEFT_STEP_RECV:
        w->in_is_b = 1;
        w->dst = dst;
        w->kind = -1;
        break;
    case WEFT_STEP_RECV_REDUCE_SEND:
        break;
    case WEFT_STEP_RECV_REDUCE_COPY:
    case WEFT_STEP_RECV_REDUCE_COPY_SEND:
        w->dst = dst;
        break;
    default: /* WEFT_STEP_RECV_COPY_SEND */
        w->in_is_b = 1;
        w->dst = dst;
        w->kind = -1;
        break;
    }
    c->rc = rc;
    c->sc = sc;
    c->ll = 1;
    c->n = n;
    c->cur_lane = i;
    c->step = s;
    w->what = WORK_MOVE;
    return WORK_MOVE;
}

/*
 * Looks for a slice that can move now and fills w. Returns WORK_MOVE, WORK_NONE (everything
 * blocked), or WORK_EXIT (all done, or an error was recorded).
 */
WEFT_KFN int find_slice(conductor *c, work *w)
{
    weft_dev_comm *comm = c->comm;
    int unfinished = 0;
    c->blk_lane = -1;
    for (int i = 0; i < c->nlanes; i++) {
        lane *l = &c->lanes[i];
        if (l->finished)
            continue;
        unfinished = 1;
        if (lane_waits_turn(c, i))
            continue;
        const weft_dev_op *op = &c->p->ops[l->op];
        const weft_step *s = lane_step(c, l);
        if (s == (const weft_step *)1) {
            stuck_report(c, WEFT_DEV_BAD_SCHED, op, -1, 0, 0, 0, 0);
            return WORK_EXIT;
        }
        if (s == NULL) {
            i = -1; /* a finished lane may let a later one of its key start: rescan */
            unfinished = 0;
            continue;
        }
        uint64_t es = dtype_size(op->dtype);
        const char *in = (const char *)op->sendbuf, *out_user = (const char *)op->recvbuf;
        const char *src = (s->src == WEFT_BUF_OUTPUT ? out_user : in) + s->src_off * es;
        char *dst = (char *)op->recvbuf + s->dst_off * es;
        int flags_pre = s->src == WEFT_BUF_INPUT, flags_post = (s->flags & WEFT_STEP_FINAL) != 0;
        int pre = op->has_redop && op->premul && flags_pre;
        int post = op->has_redop && op->postdiv && flags_post;
        w->dtype = op->dtype;
        w->es = es;
        w->scalar = op->scalar;
        if (op->scalar_dev != NULL) { /* ncclScalarDevice: the value when the kernel runs */
            w->scalar = 0;
            for (uint64_t k = 0; k < es; k++)
                w->scalar |= (uint64_t)((const uint8_t *)op->scalar_dev)[k] << (8 * k);
        }
        w->divisor = op->divisor;
        w->pre = pre;
        w->post = post;
        w->a = NULL;
        w->dst2 = NULL;
        w->b_fifo = 0;
        w->ll = 0;
        if (s->op == WEFT_STEP_COPY) {
            c->rc = c->sc = NULL;
            c->ll = 0;
            c->n = s->count;
            c->cur_lane = i;
            c->step = s;
            w->b = src + l->done * es;
            w->dst = dst + l->done * es;
            w->n = s->count - l->done;
            w->kind = pre || post ? (int)op->kind : -1;
            if (w->kind < 0 && w->b == w->dst)
                w->n = 0; /* in place: nothing to copy */
            w->what = WORK_MOVE;
            return WORK_MOVE;
        }
        weft_dev_conn *rc = step_recvs(s->op) ? &comm->conns[l->chan * comm->nranks + s->recv_peer]
                                              : NULL;
        weft_dev_conn *sc = step_sends(s->op) ? &comm->conns[l->chan * comm->nranks + s->send_peer]
                                              : NULL;
        if (op->proto == WEFT_DEV_PROTO_LL) {
            int r = ll_slice(c, i, op, s, rc, sc, src + l->done * es, dst + l->done * es, w);
            if (r == WORK_NONE)
                continue;
            return r;
        }
        uint64_t n = weft_fifo_slice(comm->slot_bytes, es, s->count, l->done);
        if (rc != NULL) {
            uint64_t tail = ld_acq(&rc->recv_rc->tail, rc->scope);
            if (!weft_fifo_has_data(tail, rc->recv_step)) {
                c->blk_lane = i;
                c->blk_peer = s->recv_peer;
                c->blk_send = 0;
                c->blk_expected = rc->recv_step + 1;
                c->blk_seen = tail;
                continue;
            }
        }
        if (sc != NULL) {
            uint64_t head = ld_acq(&sc->send_sc->head, sc->scope);
            if (!weft_fifo_has_credit(head, sc->send_step, WEFT_STEPS)) {
                c->blk_lane = i;
                c->blk_peer = s->send_peer;
                c->blk_send = 1;
                c->blk_expected = sc->send_step + 1 - WEFT_STEPS;
                c->blk_seen = head;
                continue;
            }
        }
        const char *inslot = NULL;
        if (rc != NULL) {
            uint32_t slot = weft_fifo_slot(rc->recv_step, WEFT_STEPS);
            uint32_t sig = ld_rlx32(&rc->recv_rc->sig[slot], rc->scope);
            if (sig != op->sig && sig != 0 && op->sig != 0) {
                stuck_report(c, WEFT_DEV_SIG_MISMATCH, op, s->recv_peer, 0, l->cur, op->sig, sig);
                return WORK_EXIT;
            }
            uint32_t got = ld_rlx32(&rc->recv_rc->bytes[slot], rc->scope);
            if ((uint64_t)got != n * es) {
                stuck_report(c, WEFT_DEV_MISMATCH, op, s->recv_peer, 0, l->cur, n * es, got);
                return WORK_EXIT;
            }
            inslot = rc->recv_slots + (uint64_t)slot * comm->slot_bytes;
        }
        char *outslot = NULL;
        if (sc != NULL)
            outslot = sc->send_slots +
                      (uint64_t)weft_fifo_slot(sc->send_step, WEFT_STEPS) * comm->slot_bytes;
        src += l->done * es;
        dst += l->done * es;
        w->n = n;
        w->kind = (int)op->kind;
        switch (s->op) {
        case WEFT_STEP_SEND:
            w->b = src;
            w->dst = outslot;
            w->kind = pre || post ? (int)op->kind : -1;
            break;
        case WEFT_STEP_RECV:
            w->b = inslot;
            w->b_fifo = 1;
            w->dst = dst;
            w->kind = -1;
            break;
        case WEFT_STEP_RECV_REDUCE_SEND:
            w->a = inslot;
            w->b = src;
            w->dst = outslot;
            break;
        case WEFT_STEP_RECV_REDUCE_COPY:
            w->a = inslot;
            w->b = src;
            w->dst = dst;
            break;
        case WEFT_STEP_RECV_REDUCE_COPY_SEND:
            w->a = inslot;
            w->b = src;
            w->dst = dst;
            w->dst2 = outslot;
            break;
        default: /* WEFT_STEP_RECV_COPY_SEND */
            w->b = inslot;
            w->b_fifo = 1;
            w->dst = dst;
            w->dst2 = outslot;
            w->kind = -1;
            break;
        }
        c->rc = rc;
        c->sc = sc;
        c->ll = 0;
        c->n = n;
        c->cur_lane = i;
        c->step = s;
        w->what = WORK_MOVE;
        return WORK_MOVE;
    }
    return unfinished ? WORK_NONE : WORK_EXIT;
}

/* After every thread finished the slice: publish it and advance. */
WEFT_KFN void post_slice(conductor *c)
{
    lane *l = &c->lanes[c->cur_lane];
    const weft_dev_op *op = &c->p->ops[l->op];
    uint64_t es = dtype_size(op->dtype);
    if (c->ll) {
        /* No tail to publish (the flags carry the data): bytes and tail only record progress. */
        if (c->sc != NULL) {
            weft_dev_conn *sc = c->sc;
            uint32_t slot = weft_fifo_slot(sc->ll_send_step, WEFT_STEPS);
            st_rlx32(&sc->ll_send_rc->bytes[slot], (uint32_t)(c->n * es), sc->scope);
            sc->ll_send_step++;
            weft_st_relaxed_u64(&sc->ll_send_rc->tail, sc->ll_send_step, WEFT_SCOPE_SYS);
        }
        if (c->rc != NULL) {
            weft_dev_conn *rc = c->rc;
            rc->ll_recv_step++;
            st_rel(&rc->ll_recv_sc->head, rc->ll_recv_step, rc->scope);
        }
    } else if (c->sc != NULL) {
        weft_dev_conn *sc = c->sc;
        uint32_t slot = weft_fifo_slot(sc->send_step, WEFT_STEPS);
        st_rlx32(&sc->send_rc->bytes[slot], (uint32_t)(c->n * es), sc->scope);
        st_rlx32(&sc->send_rc->sig[slot], op->sig, sc->scope);
        sc->send_step++;
        st_rel(&sc->send_rc->tail, sc->send_step, sc->scope);
    }
    if (!c->ll && c->rc != NULL) {
        weft_dev_conn *rc = c->rc;
        rc->recv_step++;
        st_rel(&rc->recv_sc->head, rc->recv_step, rc->scope);
    }
    l->done += c->n;
    if (l->done >= c->step->count) {
        l->cur++;
        l->done = 0;
    }
}

/* 1 when a block of the communicator gave up (this kernel or an earlier one). */
WEFT_KFN int any_stuck(const weft_dev_comm *comm)
{
    for (int b = 0; b < comm->nchannels; b++)
        if (weft_ld_relaxed_u32(&comm->stuck[b].state, WEFT_SCOPE_SYS) != WEFT_DEV_OK)
            return 1;
    return 0;
}

/* 1 when the block must leave: abort word set, another block gave up, or the deadline passed. */
WEFT_KFN int check_leave(conductor *c, uint64_t idle_since)
{
    weft_dev_comm *comm = c->comm;
    if (any_stuck(comm))
        return 1;
    const weft_dev_op *op = NULL;
    int peer = -1, send = 0;
    uint64_t step = 0;
    if (c->blk_lane >= 0) {
        op = &c->p->ops[c->lanes[c->blk_lane].op];
        peer = c->blk_peer;
        send = c->blk_send;
        step = c->lanes[c->blk_lane].cur;
    }
    if (weft_ld_relaxed_u32(comm->abort, WEFT_SCOPE_SYS) != 0) {
        stuck_report(c, WEFT_DEV_ABORTED, op, peer, send, step, c->blk_expected, c->blk_seen);
        return 1;
    }
    if (comm->timeout_ns != 0 && weft_globaltimer_ns() - idle_since > comm->timeout_ns) {
        stuck_report(c, WEFT_DEV_TIMEOUT, op, peer, send, step, c->blk_expected, c->blk_seen);
        return 1;
    }
    return 0;
}

/* After a thread of the block gave up waiting for the lines of the current LL slice: the stuck
 * record names the peer it waited for (unless another block gave up first). */
WEFT_KFN int ll_failed(conductor *c, const work *w)
{
    uint32_t why = weft_ld_relaxed_u32(&w->failed, WEFT_SCOPE_GPU);
    const lane *l = &c->lanes[c->cur_lane];
    const weft_dev_conn *rc = c->rc;
    if (why != LL_FAIL_QUIET && rc != NULL)
        stuck_report(c, why == LL_FAIL_ABORT ? WEFT_DEV_ABORTED : WEFT_DEV_TIMEOUT,
                     &c->p->ops[l->op], c->step->recv_peer, 0, l->cur, rc->ll_recv_step + 1,
                     weft_ld_relaxed_u64(&rc->ll_recv_rc->tail, WEFT_SCOPE_SYS));
    return WORK_EXIT;
}

/* The block's dynamic shared memory: the slice, and thread 0's state (in shared memory rather
 * than on every thread's stack: 6 KiB of local memory per thread otherwise). */
struct block_shared {
    work w;
    conductor c;
};
WEFT_STATIC_ASSERT(sizeof(block_shared) <= WEFT_DEV_SHARED_BYTES,
                   "the block's state must fit its shared memory");

WEFT_KFN void coll_body(const weft_dev_params *p)
{
    block_shared *sh = (block_shared *)weft_shared();
    work *w = &sh->w;
    conductor *c = &sh->c;
    int tid = weft_tid(), nt = weft_ntid();
    /* The direct kernel before this launch did its operation (weft_dev_params.skip). */
    if (p->skip != NULL && weft_ld_relaxed_u32(p->skip, WEFT_SCOPE_GPU) != 0)
        return;
    if (p->zc_mine != NULL && tid == 0) {
        /* No direct kernel here: say so (weft_dev_params.zc_mine); fields before seq. */
        weft_zc_slot *mine = p->zc_mine + weft_bid();
        uint64_t e = mine->seq + 1;
        mine->call = WEFT_ZC_NOT_DIRECT;
        mine->reg = 0;
        weft_st_release_u64(&mine->seq, e, WEFT_SCOPE_SYS);
        weft_st_release_u64(&mine->vote, 2 * e, WEFT_SCOPE_SYS);
        weft_st_release_u64(&mine->done, e, WEFT_SCOPE_SYS);
    }
    if (tid == 0) {
        if (p->comm->busy != NULL)
            weft_st_relaxed_u32(&p->comm->busy[weft_bid()], 1, WEFT_SCOPE_SYS);
        c->p = p;
        c->comm = p->comm;
        c->b = weft_bid();
        c->blk_lane = -1;
        c->blk_expected = c->blk_seen = 0;
        lanes_init(c);
        w->comm = c->comm;
        w->failed = LL_FAIL_NONE;
    }
    /* Every thread reads the slice after the first barrier and is done with it before the
     * second, so thread 0 writes the next one only after the second. */
    uint64_t idle_since = 0;
    int first = 1;
    for (;;) {
        if (tid == 0) {
            uint32_t spins = 0;
            idle_since = weft_globaltimer_ns();
            /* A communicator whose earlier kernel gave up has inconsistent FIFOs: do nothing. */
            if (first && any_stuck(c->comm))
                w->what = WORK_EXIT;
            else if (!first && weft_ld_relaxed_u32(&w->failed, WEFT_SCOPE_GPU) != LL_FAIL_NONE)
                w->what = ll_failed(c, w); /* a thread gave up waiting for LL lines */
            else
                for (;;) {
                    int r = find_slice(c, w);
                    if (r != WORK_NONE) {
                        w->what = r;
                        break;
                    }
                    weft_spin_hint();
                    if ((++spins & 15) == 0 && check_leave(c, idle_since)) {
                        w->what = WORK_EXIT;
                        break;
                    }
                }
            first = 0;
        }
        weft_sync_block();
        if (w->what == WORK_EXIT) {
            if (tid == 0 && c->comm->busy != NULL)
                weft_st_relaxed_u32(&c->comm->busy[c->b], 0, WEFT_SCOPE_SYS);
            return;
        }
        if (w->n > 0 || w->ll) /* an LL slice of 0 bytes still sends its header */
            do_work(w, tid, nt);
        weft_sync_block();
        if (tid == 0 && weft_ld_relaxed_u32(&w->failed, WEFT_SCOPE_GPU) == LL_FAIL_NONE)
            post_slice(c);
    }
}


/* ---- the direct kernel: registered buffers read and written in place (weft_zc_params) ------ */

/* Shared state of a direct kernel's block. */
struct zc_shared {
    work w;
    int32_t what; /* 0: fall back, 1: direct, 2: leave (stuck record written) */
    uint64_t lo, len; /* this block's elements: [lo, lo + len) */
};
WEFT_STATIC_ASSERT(sizeof(zc_shared) <= WEFT_DEV_SHARED_BYTES, "fits the shared memory");

/* Rank k's slot of block b. */
WEFT_KFN weft_zc_slot *zc_slot(const weft_zc_params *p, int k, int b)
{
    return (weft_zc_slot *)(uintptr_t)p->peers[k].slots + b;
}

/* Thread 0: waits until every rank's slot `word` (0 seq, 1 done, 2 vote) of block b reaches e.
 * 1 on success; 0 after the abort word or the deadline (stuck record written). */
WEFT_KFN_CALLED int zc_wait(const weft_zc_params *p, int b, int word, uint64_t e)
{
    const weft_dev_comm *comm = p->comm;
    int n = comm->nranks;
    uint64_t since = weft_globaltimer_ns();
    uint32_t spins = 0;
    for (int k = 0; k < n; k++) {
        const weft_zc_slot *sl = zc_slot(p, k, b);
        const uint64_t *w = word == 0 ? &sl->seq : word == 1 ? &sl->done : &sl->vote;
        while (weft_ld_acquire_u64(w, WEFT_SCOPE_SYS) < e) {
            weft_spin_hint();
            if ((++spins & 15) != 0)
                continue;
            uint32_t why = 0;
            if (weft_ld_relaxed_u32(comm->abort, WEFT_SCOPE_SYS) != 0)
                why = WEFT_DEV_ABORTED;
            else if (comm->timeout_ns != 0 && weft_globaltimer_ns() - since > comm->timeout_ns)
                why = WEFT_DEV_TIMEOUT;
            else if (any_stuck(comm))
                return 0;
            if (why != 0) {
                weft_dev_stuck *st = &comm->stuck[b];
                if (weft_ld_relaxed_u32(&st->state, WEFT_SCOPE_SYS) == WEFT_DEV_OK) {
                    st->channel = b;
                    st->peer = k;
                    st->send = 0;
                    st->coll = p->op.coll;
                    st->op_index = 0;
                    st->wait = word == 0 ? WEFT_DEV_WAIT_JOIN : WEFT_DEV_WAIT_DONE;
                    st->seq = p->op.seq;
                    st->step = (uint64_t)word;
                    st->expected = e;
                    st->seen = weft_ld_relaxed_u64(w, WEFT_SCOPE_SYS);
                    weft_st_release_u32(&st->state, why, WEFT_SCOPE_SYS);
                }
                return 0;
            }
        }
    }
    return 1;
}

/* Thread 0: rank k's send (which 0) or recv (1) buffer as this rank addresses it, bytes long
 * from its start; NULL where k is in another process and its buffer is not mapped here. */
WEFT_KFN char *zc_buf(const weft_zc_params *p, int b, int k, int which, uint64_t bytes)
{
    const weft_zc_slot *sl = zc_slot(p, k, b);
    const weft_zc_peer *pe = &p->peers[k];
    if (pe->local)
        return (char *)(uintptr_t)(which ? sl->recv : sl->send);
    uint64_t id = which ? sl->recv_id : sl->send_id, off = which ? sl->recv_off : sl->send_off;
    for (int i = 0; id != 0 && i < WEFT_ZC_MAX_IMPORTS; i++) {
        const weft_zc_import *im = &pe->imp[i];
        if (weft_ld_acquire_u64(&im->id, WEFT_SCOPE_SYS) == id)
            return off <= im->size && bytes <= im->size - off ? (char *)(uintptr_t)im->base + off
                                                                : NULL;
    }
    return NULL;
}

/* All threads: w (filled by thread 0) done, between two barriers. Not inlined: one copy of the
 * whole type and operator dispatch for the kernel's three call sites (inlined thrice, ptxas
 * took 5 minutes and the entry spilled 32 bytes on sm_100). */
WEFT_KFN_CALLED void zc_step(zc_shared *sh, int tid, int nt)
{
    weft_sync_block();
    if (sh->w.n > 0)
        do_work(&sh->w, tid, nt);
    weft_sync_block();
}

/* Thread 0: the slice [lo, lo + n) of this block among nb blocks, 16-byte aligned pieces. */
WEFT_KFN void zc_split(uint64_t count, uint64_t es, int b, int nb, uint64_t *lo, uint64_t *n)
{
    uint64_t al = 64 / es, per = (count + (uint64_t)nb - 1) / (uint64_t)nb;
    per = (per + al - 1) / al * al;
    uint64_t a = (uint64_t)b * per;
    *lo = a < count ? a : count;
    uint64_t e = a + per < count ? a + per : count;
    *n = e - *lo;
}

WEFT_KFN void zc_body(const weft_zc_params *p)
{
    zc_shared *sh = (zc_shared *)weft_shared();
    work *w = &sh->w;
    const weft_dev_comm *comm = p->comm;
    const weft_dev_op *op = &p->op;
    int tid = weft_tid(), nt = weft_ntid(), b = weft_bid(), nb = weft_nbid();
    int n = comm->nranks, me = comm->rank;
    uint64_t es = dtype_size(op->dtype), e = 0;
    if (tid == 0) {
        if (comm->busy != NULL)
            weft_st_relaxed_u32(&comm->busy[b], 1, WEFT_SCOPE_SYS);
        weft_zc_slot *mine = zc_slot(p, me, b);
        e = mine->seq + 1; /* only this rank writes its slot */
        uint64_t scalar = op->scalar;
        if (op->premul && op->scalar_dev != NULL) {
            scalar = 0;
            for (uint64_t i = 0; i < es; i++)
                scalar |= (uint64_t)((const uint8_t *)op->scalar_dev)[i] << (8 * i);
        }
        mine->call = (uint64_t)op->coll | (uint64_t)op->dtype << 8 | (uint64_t)op->kind << 16 |
                     (uint64_t)op->has_redop << 24 | (uint64_t)op->premul << 25;
        mine->count = op->count;
        mine->scalar = scalar;
        mine->reg = (uint64_t)p->reg;
        mine->send = (uint64_t)(uintptr_t)op->sendbuf;
        mine->recv = (uint64_t)(uintptr_t)op->recvbuf;
        mine->send_id = p->send_id;
        mine->send_off = p->send_off;
        mine->recv_id = p->recv_id;
        mine->recv_off = p->recv_off;
        weft_st_release_u64(&mine->seq, e, WEFT_SCOPE_SYS);
        if (!zc_wait(p, b, 0, e)) {
            sh->what = 2;
        } else {
            /* The same answer on every rank: it depends only on the slots. A call or count
             * that differs falls back, and the normal path reports the mismatch. */
            int direct = 1;
            for (int k = 0; k < n; k++) {
                const weft_zc_slot *sk = zc_slot(p, k, b);
                direct &= sk->reg == 1 && sk->call == mine->call && sk->count == mine->count;
            }
            if (p->vote2) {
                /* Whether this rank reaches every peer's buffers may differ between ranks (a
                 * share not received or mapped yet): each votes, all take the AND. */
                uint64_t in = op->count * es, out = in;
                if (op->coll == WEFT_COLL_REDUCESCATTER)
                    in *= (uint64_t)n;
                if (op->coll == WEFT_COLL_ALLGATHER)
                    out *= (uint64_t)n;
                for (int k = 0; k < n && direct; k++)
                    direct &= zc_buf(p, b, k, 0, in) != NULL &&
                              (op->coll != WEFT_COLL_ALLREDUCE || zc_buf(p, b, k, 1, out) != NULL);
                weft_st_release_u64(&mine->vote, 2 * e + (uint64_t)direct, WEFT_SCOPE_SYS);
                if (!zc_wait(p, b, 2, 2 * e)) {
                    direct = 2;
                } else {
                    for (int k = 0; k < n; k++)
                        direct &= (int)(weft_ld_relaxed_u64(&zc_slot(p, k, b)->vote,
                                                            WEFT_SCOPE_SYS) & 1);
                }
            }
            sh->what = direct;
        }
        w->dtype = op->dtype;
        w->es = es;
        w->b_fifo = 0;
        w->ll = 0;
        w->dst2 = NULL;
        w->divisor = op->divisor;
        w->comm = comm;
        w->failed = 0;
        if (op->coll == WEFT_COLL_ALLREDUCE) {
            /* rank me reduces its share of the elements, then writes it to every output */
            uint64_t rlo, rn;
            zc_split(op->count, es, me, n, &rlo, &rn);
            zc_split(rn, es, b, nb, &sh->lo, &sh->len);
            sh->lo += rlo;
        } else {
            zc_split(op->count, es, b, nb, &sh->lo, &sh->len);
        }
    }
    weft_sync_block();
    if (sh->what == 1) {
        /* Every thread runs the same loop over pieces; thread 0 fills w for each step. A piece
         * is large: each step costs two block barriers (expensive on the emulated GPU). */
        const uint64_t count = op->count, lo = sh->lo, len = sh->len, piece = 1 << 20;
        for (uint64_t off = 0, m = 0; off < len; off += m) {
            m = (len - off) * es < piece ? len - off : piece / es;
            uint64_t at = (lo + off) * es;
            if (op->coll == WEFT_COLL_ALLGATHER) {
                for (int k = 0; k < n; k++) {
                    if (tid == 0) {
                        w->kind = -1;
                        w->a = NULL;
                        w->b = zc_buf(p, b, k, 0, 0) + at;
                        w->dst = zc_buf(p, b, me, 1, 0) + (uint64_t)k * count * es + at;
                        w->n = m;
                    }
                    zc_step(sh, tid, nt);
                }
            } else {
                /* Reduce into the destination, then copy it out (all-reduce). All-reduce: in
                 * rank order into rank 0's output. Reduce-scatter: into this rank's output,
                 * starting from this rank's input, which in place is that output itself. */
                int rs = op->coll == WEFT_COLL_REDUCESCATTER;
                char *acc = tid == 0 ? zc_buf(p, b, rs ? me : 0, 1, 0) + at : NULL;
                for (int j = 0; j < n; j++) {
                    int k = rs ? (me + j) % n : j;
                    if (tid == 0) {
                        w->kind = op->kind;
                        w->a = j == 0 ? NULL : acc;
                        w->b = zc_buf(p, b, k, 0, 0) + at + (rs ? (uint64_t)me * count * es : 0);
                        w->dst = acc;
                        w->pre = op->has_redop && op->premul;
                        w->scalar = zc_slot(p, k, b)->scalar;
                        w->post = op->has_redop && op->postdiv && j == n - 1;
                        w->n = m;
                    }
                    zc_step(sh, tid, nt);
                }
                for (int k = 1; k < n && !rs; k++) {
                    if (tid == 0) {
                        w->kind = -1;
                        w->a = NULL;
                        w->b = acc;
                        w->dst = zc_buf(p, b, k, 1, 0) + at;
                        w->pre = w->post = 0;
                        w->n = m;
                    }
                    zc_step(sh, tid, nt);
                }
            }
        }
    }
    if (tid == 0 && sh->what != 2) {
        /* every rank's writes into the others' buffers are done before anyone leaves, and
         * no slot is rewritten while a peer still reads it */
        weft_fence(WEFT_SCOPE_SYS);
        weft_st_release_u64(&zc_slot(p, me, b)->done, e, WEFT_SCOPE_SYS);
        if (zc_wait(p, b, 1, e) && b == 0) {
            weft_st_relaxed_u32(p->skip, (uint32_t)sh->what, WEFT_SCOPE_SYS);
            if (sh->what == 1)
                weft_st_relaxed_u64(p->runs, weft_ld_relaxed_u64(p->runs, WEFT_SCOPE_SYS) + 1,
                                    WEFT_SCOPE_SYS);
        }
    }
    if (tid == 0 && comm->busy != NULL)
        weft_st_relaxed_u32(&comm->busy[b], 0, WEFT_SCOPE_SYS);
}

} /* namespace */

/* The entry points' names end in WEFT_COLL_KERNEL_SUFFIX (empty: the library's kernel; a test
 * build of other flags names its own). */
#ifndef WEFT_COLL_KERNEL_SUFFIX
#define WEFT_COLL_KERNEL_SUFFIX
#endif
#define WEFT_KCAT2_(a, b) a##b
#define WEFT_KCAT_(a, b) WEFT_KCAT2_(a, b)
#define WEFT_KNAME_(n) WEFT_KCAT_(n, WEFT_COLL_KERNEL_SUFFIX)

#if defined(__CUDACC__)
/* At least one block per SM (512 threads: 128 registers a thread); with the LL code and the
 * thread bound alone, ptxas chose 64 registers and spilled 388 bytes. */
__global__ void __launch_bounds__(WEFT_COLL_KERNEL_MAX_THREADS, 1)
    WEFT_KNAME_(weft_coll_kernel)(const __grid_constant__ weft_dev_params p)
{
    coll_body(&p);
}

extern "C" const void *WEFT_KNAME_(weft_coll_kernel_device_fn)(void)
{
    return (const void *)WEFT_KNAME_(weft_coll_kernel);
}

/* The direct kernel: small, apart from the collective kernel so that one keeps its registers. */
__global__ void __launch_bounds__(WEFT_COLL_KERNEL_MAX_THREADS, 1)
    WEFT_KNAME_(weft_zc_kernel)(const __grid_constant__ weft_zc_params p)
{
    zc_body(&p);
}

extern "C" const void *WEFT_KNAME_(weft_zc_kernel_device_fn)(void)
{
    return (const void *)WEFT_KNAME_(weft_zc_kernel);
}
#else
/* The emulated GPU calls this once per emulated thread with a copy of the parameters. */
extern "C" void WEFT_KNAME_(weft_coll_kernel_emu)(void *params)
{
    coll_body((const weft_dev_params *)params);
}

extern "C" void WEFT_KNAME_(weft_zc_kernel_emu)(void *params)
{
    zc_body((const weft_zc_params *)params);
}
#endif
