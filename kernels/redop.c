/*
 * Host reductions: weft_reduce() dispatches once per call on (dtype, op kind, flags) to a loop
 * specialised for that combination, built from the element ops of redop_elem.h.
 *
 * Performance notes (checked with -fopt-info-vec-optimized, gcc 12, x86-64 baseline):
 *   - every loop is compiled at -O3 whatever the build type (pragma below), so gcc vectorises
 *     the integer, fp32, fp64, fp16, bf16 and fp8 loops; the conversions in redop_elem.h are
 *     branch-free for that reason;
 *   - dst may equal a or b exactly. Each iteration touches only index i, so there is no
 *     loop-carried dependence; `#pragma GCC ivdep` tells gcc so and it vectorises without runtime
 *     alias checks (restrict would be wrong when dst == a);
 *   - element pointers go through 1-byte-aligned typedefs: callers may pass any address, and gcc
 *     must not assume natural alignment (it would peel to reach vector alignment and then use
 *     aligned loads on a pointer that can never be aligned);
 *   - -ffp-contract=off: a premultiplied input is rounded to the element type before it is added,
 *     as on the device; an FMA would skip that rounding on -march=native builds;
 *   - -fno-trapping-math: lets gcc if-convert the selects of the conversions (it otherwise sinks
 *     the float ops of the unused arm into branches and gives up). Values are unchanged; only FP
 *     exception flags, which nothing reads, may differ;
 *   - 8- and 16-bit float types run over 32-bit words (see WEFT_DEF_PACKED_BINARY);
 *   - two code paths: `generic` (the build's baseline target) and, on x86-64, `avx2` (the same
 *     loops compiled for AVX2, plus F16C conversions for fp16), chosen at the first call by
 *     CPUID. Both give the same bits; test_redop runs every case on each.
 *
 * Measured with bench_redop on this machine (AVX2 path; 1 MiB arrays, then 64 MiB): float sum
 * ~100 GB/s of memory traffic (memcpy ~120), memory-bound at 64 MiB like memcpy; fp16 and bf16
 * sums reach 65-75% of float's in cache and the memory bound at 64 MiB; fp8 sums ~1.2 GB/s of
 * input (compute-bound: decode, add, encode per element).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "fp-contract=off", "no-trapping-math")
#define WEFT_IVDEP _Pragma("GCC ivdep")
#define WEFT_UNROLL4 _Pragma("GCC unroll 4")
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#define WEFT_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#define WEFT_UNROLL4 _Pragma("unroll 4")
#else
#define WEFT_IVDEP
#define WEFT_UNROLL4
#endif

#include "redop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redop_elem.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WEFT_RED_X86 1
#include <immintrin.h>
#else
#define WEFT_RED_X86 0
#endif

/* Element storage types, and their unaligned, alias-anything versions for the loops. */
typedef int8_t weft_t_i8;
typedef uint8_t weft_t_u8;
typedef int32_t weft_t_i32;
typedef uint32_t weft_t_u32;
typedef int64_t weft_t_i64;
typedef uint64_t weft_t_u64;
typedef uint16_t weft_t_f16;
typedef float weft_t_f32;
typedef double weft_t_f64;
typedef uint16_t weft_t_bf16;
typedef uint8_t weft_t_e4m3;
typedef uint8_t weft_t_e5m2;

#define WEFT_UA(sfx) typedef weft_t_##sfx weft_ua_##sfx __attribute__((aligned(1), may_alias));
WEFT_UA(i8)
WEFT_UA(u8)
WEFT_UA(i32)
WEFT_UA(u32)
WEFT_UA(i64)
WEFT_UA(u64)
WEFT_UA(f16)
WEFT_UA(f32)
WEFT_UA(f64)
WEFT_UA(bf16)
WEFT_UA(e4m3)
WEFT_UA(e5m2)
#undef WEFT_UA

typedef void (*weft_red_binary_fn_t)(void *d, const void *a, const void *b, size_t n);
typedef void (*weft_red_premul_sum_fn_t)(void *d, const void *a, const void *b, const void *scalar,
                                         size_t n);
typedef void (*weft_red_scale_fn_t)(void *d, const void *b, const void *scalar, size_t n);
typedef void (*weft_red_div_fn_t)(void *d, uint64_t divisor, size_t n);

struct weft_red_fns {
    weft_red_binary_fn_t op[4];          /* by enum weft_red_kind: d = a OP b */
    weft_red_premul_sum_fn_t premul_sum; /* d = a + b * scalar */
    weft_red_scale_fn_t scale;           /* d = b * scalar */
    weft_red_div_fn_t div;               /* d = d / divisor */
};

/*
 * Loop generators. Every loop is instantiated once per code path (isa): `generic` for the
 * baseline target, and on x86-64 `avx2` (same C, compiled for AVX2 through a target attribute).
 */
#define WEFT_DEF_BINARY(isa, attr, op, sfx)                                                        \
    attr static void weft_red_##isa##_##op##_##sfx(void *dv, const void *av, const void *bv,       \
                                                   size_t n)                                       \
    {                                                                                              \
        weft_ua_##sfx *d = (weft_ua_##sfx *)dv;                                                    \
        const weft_ua_##sfx *a = (const weft_ua_##sfx *)av;                                        \
        const weft_ua_##sfx *b = (const weft_ua_##sfx *)bv;                                        \
        WEFT_IVDEP                                                                                 \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = weft_elem_##op##_##sfx(a[i], b[i]);                                             \
    }

/*
 * 8- and 16-bit floating types: the loop runs over 32-bit words holding 4 or 2 elements, each
 * taken out with shifts, so the vector code needs no widening or narrowing shuffles (about 3x
 * faster than the element loop for bf16 and fp8). Odd elements at the end use the element ops.
 */
#define WEFT_DEF_PACKED_BINARY(isa, attr, op, sfx)                                                 \
    attr static void weft_red_##isa##_##op##_##sfx(void *dv, const void *av, const void *bv,       \
                                                   size_t n)                                       \
    {                                                                                              \
        enum { bits = 8 * sizeof(weft_t_##sfx), per = 32 / bits };                                 \
        weft_ua_u32 *d = (weft_ua_u32 *)dv;                                                        \
        const weft_ua_u32 *a = (const weft_ua_u32 *)av;                                            \
        const weft_ua_u32 *b = (const weft_ua_u32 *)bv;                                            \
        size_t words = n / per;                                                                    \
        WEFT_IVDEP                                                                                 \
        for (size_t i = 0; i < words; i++) {                                                       \
            uint32_t x = a[i], y = b[i], r = 0;                                                    \
            WEFT_UNROLL4                                                                           \
            for (int k = 0; k < per; k++)                                                          \
                r |= (uint32_t)weft_elem_##op##_##sfx((weft_t_##sfx)(x >> (bits * k)),             \
                                                      (weft_t_##sfx)(y >> (bits * k)))             \
                     << (bits * k);                                                                \
            d[i] = r;                                                                              \
        }                                                                                          \
        weft_ua_##sfx *dt = (weft_ua_##sfx *)(d + words);                                          \
        const weft_ua_##sfx *at = (const weft_ua_##sfx *)(a + words);                              \
        const weft_ua_##sfx *bt = (const weft_ua_##sfx *)(b + words);                              \
        for (size_t i = 0; i < n - words * per; i++)                                               \
            dt[i] = weft_elem_##op##_##sfx(at[i], bt[i]);                                          \
    }

#define WEFT_DEF_OPS_plain(isa, attr, sfx)                                                         \
    WEFT_DEF_BINARY(isa, attr, sum, sfx)                                                           \
    WEFT_DEF_BINARY(isa, attr, prod, sfx)                                                          \
    WEFT_DEF_BINARY(isa, attr, max, sfx)                                                           \
    WEFT_DEF_BINARY(isa, attr, min, sfx)

#define WEFT_DEF_OPS_packed(isa, attr, sfx)                                                        \
    WEFT_DEF_PACKED_BINARY(isa, attr, sum, sfx)                                                    \
    WEFT_DEF_PACKED_BINARY(isa, attr, prod, sfx)                                                   \
    WEFT_DEF_PACKED_BINARY(isa, attr, max, sfx)                                                    \
    WEFT_DEF_PACKED_BINARY(isa, attr, min, sfx)

#define WEFT_DEF_TYPE(isa, attr, sfx, layout)                                                      \
    WEFT_DEF_OPS_##layout(isa, attr, sfx)                                                          \
    attr static void weft_red_##isa##_premul_sum_##sfx(void *dv, const void *av, const void *bv,   \
                                                       const void *scalar, size_t n)               \
    {                                                                                              \
        weft_ua_##sfx *d = (weft_ua_##sfx *)dv;                                                    \
        const weft_ua_##sfx *a = (const weft_ua_##sfx *)av;                                        \
        const weft_ua_##sfx *b = (const weft_ua_##sfx *)bv;                                        \
        weft_t_##sfx s;                                                                            \
        memcpy(&s, scalar, sizeof(s));                                                             \
        WEFT_IVDEP                                                                                 \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = weft_elem_sum_##sfx(a[i], weft_elem_premul_##sfx(b[i], s));                     \
    }                                                                                              \
    attr static void weft_red_##isa##_scale_##sfx(void *dv, const void *bv, const void *scalar,    \
                                                  size_t n)                                        \
    {                                                                                              \
        weft_ua_##sfx *d = (weft_ua_##sfx *)dv;                                                    \
        const weft_ua_##sfx *b = (const weft_ua_##sfx *)bv;                                        \
        weft_t_##sfx s;                                                                            \
        memcpy(&s, scalar, sizeof(s));                                                             \
        WEFT_IVDEP                                                                                 \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = weft_elem_premul_##sfx(b[i], s);                                                \
    }                                                                                              \
    attr static void weft_red_##isa##_div_##sfx(void *dv, uint64_t divisor, size_t n)              \
    {                                                                                              \
        weft_ua_##sfx *d = (weft_ua_##sfx *)dv;                                                    \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = weft_elem_div_##sfx(d[i], divisor);                                             \
    }

#define WEFT_DEF_ALL_TYPES(isa, attr)                                                              \
    WEFT_DEF_TYPE(isa, attr, i8, plain)                                                            \
    WEFT_DEF_TYPE(isa, attr, u8, plain)                                                            \
    WEFT_DEF_TYPE(isa, attr, i32, plain)                                                           \
    WEFT_DEF_TYPE(isa, attr, u32, plain)                                                           \
    WEFT_DEF_TYPE(isa, attr, i64, plain)                                                           \
    WEFT_DEF_TYPE(isa, attr, u64, plain)                                                           \
    WEFT_DEF_TYPE(isa, attr, f16, packed)                                                          \
    WEFT_DEF_TYPE(isa, attr, f32, plain)                                                           \
    WEFT_DEF_TYPE(isa, attr, f64, plain)                                                           \
    WEFT_DEF_TYPE(isa, attr, bf16, packed)                                                         \
    WEFT_DEF_TYPE(isa, attr, e4m3, packed)                                                         \
    WEFT_DEF_TYPE(isa, attr, e5m2, packed)

#define WEFT_FNS(isa, sfx)                                                                         \
    {                                                                                              \
        .op = {weft_red_##isa##_sum_##sfx, weft_red_##isa##_prod_##sfx,                            \
               weft_red_##isa##_max_##sfx, weft_red_##isa##_min_##sfx},                            \
        .premul_sum = weft_red_##isa##_premul_sum_##sfx, .scale = weft_red_##isa##_scale_##sfx,    \
        .div = weft_red_##isa##_div_##sfx,                                                         \
    }

#define WEFT_TABLE(isa)                                                                            \
    {                                                                                              \
        [WEFT_INT8] = WEFT_FNS(isa, i8), [WEFT_UINT8] = WEFT_FNS(isa, u8),                         \
        [WEFT_INT32] = WEFT_FNS(isa, i32), [WEFT_UINT32] = WEFT_FNS(isa, u32),                     \
        [WEFT_INT64] = WEFT_FNS(isa, i64), [WEFT_UINT64] = WEFT_FNS(isa, u64),                     \
        [WEFT_FLOAT16] = WEFT_FNS(isa, f16), [WEFT_FLOAT32] = WEFT_FNS(isa, f32),                  \
        [WEFT_FLOAT64] = WEFT_FNS(isa, f64), [WEFT_BFLOAT16] = WEFT_FNS(isa, bf16),                \
        [WEFT_FP8E4M3] = WEFT_FNS(isa, e4m3), [WEFT_FP8E5M2] = WEFT_FNS(isa, e5m2),                \
    }

WEFT_DEF_ALL_TYPES(generic, )

static const struct weft_red_fns weft_red_table_generic[WEFT_NUM_DTYPES] = WEFT_TABLE(generic);

#if WEFT_RED_X86
/*
 * AVX2 + F16C. Not FMA: the target must not allow contraction of premul into the sum. The fp16
 * sum/prod/premul loops convert with F16C (vcvtph2ps is exact; vcvtps2ph with round-to-nearest-
 * even is the IEEE conversion, overflow to inf) and then canonicalise NaN to 0x7fff like
 * weft_elem_f32_to_f16, so results are bitwise those of the generic loops. Tails use the
 * element ops.
 */
#define WEFT_AVX2 __attribute__((target("avx2,f16c")))

/* (the plain AVX2 fp16 sum/prod/premul loops are superseded by the F16C ones below) */
WEFT_DEF_ALL_TYPES(avx2, WEFT_AVX2 __attribute__((unused)))

WEFT_AVX2 static inline __m256 weft_f16c_load(const char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

WEFT_AVX2 static inline __m128i weft_f16c_round(__m256 v)
{
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)),
                                  _mm_set1_epi16(0x7c00));
    return _mm_blendv_epi8(h, _mm_set1_epi16(0x7fff), nan);
}

WEFT_AVX2 static inline void weft_f16c_store(char *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)p, weft_f16c_round(v));
}

WEFT_AVX2 static void weft_red_f16c_sum_f16(void *dv, const void *av, const void *bv, size_t n)
{
    char *d = (char *)dv;
    const char *a = (const char *)av, *b = (const char *)bv;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = weft_f16c_load(a + 2 * i), y0 = weft_f16c_load(b + 2 * i);
        __m256 x1 = weft_f16c_load(a + 2 * i + 16), y1 = weft_f16c_load(b + 2 * i + 16);
        weft_f16c_store(d + 2 * i, _mm256_add_ps(x0, y0));
        weft_f16c_store(d + 2 * i + 16, _mm256_add_ps(x1, y1));
    }
    weft_red_generic_sum_f16(d + 2 * i, a + 2 * i, b + 2 * i, n - i);
}

WEFT_AVX2 static void weft_red_f16c_prod_f16(void *dv, const void *av, const void *bv, size_t n)
{
    char *d = (char *)dv;
    const char *a = (const char *)av, *b = (const char *)bv;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 x0 = weft_f16c_load(a + 2 * i), y0 = weft_f16c_load(b + 2 * i);
        __m256 x1 = weft_f16c_load(a + 2 * i + 16), y1 = weft_f16c_load(b + 2 * i + 16);
        weft_f16c_store(d + 2 * i, _mm256_mul_ps(x0, y0));
        weft_f16c_store(d + 2 * i + 16, _mm256_mul_ps(x1, y1));
    }
    weft_red_generic_prod_f16(d + 2 * i, a + 2 * i, b + 2 * i, n - i);
}

/* b * scalar rounded to fp16 (and back to float), as weft_elem_premul_f16 does */
WEFT_AVX2 static inline __m256 weft_f16c_premul(const char *p, __m256 s)
{
    return _mm256_cvtph_ps(weft_f16c_round(_mm256_mul_ps(weft_f16c_load(p), s)));
}

WEFT_AVX2 static void weft_red_f16c_premul_sum_f16(void *dv, const void *av, const void *bv,
                                                   const void *scalar, size_t n)
{
    char *d = (char *)dv;
    const char *a = (const char *)av, *b = (const char *)bv;
    uint16_t sh;
    memcpy(&sh, scalar, sizeof(sh));
    __m256 s = _mm256_set1_ps(weft_elem_f16_to_f32(sh));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 p0 = weft_f16c_premul(b + 2 * i, s), p1 = weft_f16c_premul(b + 2 * i + 16, s);
        __m256 x0 = weft_f16c_load(a + 2 * i), x1 = weft_f16c_load(a + 2 * i + 16);
        weft_f16c_store(d + 2 * i, _mm256_add_ps(x0, p0));
        weft_f16c_store(d + 2 * i + 16, _mm256_add_ps(x1, p1));
    }
    weft_red_generic_premul_sum_f16(d + 2 * i, a + 2 * i, b + 2 * i, scalar, n - i);
}

WEFT_AVX2 static void weft_red_f16c_scale_f16(void *dv, const void *bv, const void *scalar,
                                              size_t n)
{
    char *d = (char *)dv;
    const char *b = (const char *)bv;
    uint16_t sh;
    memcpy(&sh, scalar, sizeof(sh));
    __m256 s = _mm256_set1_ps(weft_elem_f16_to_f32(sh));
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        weft_f16c_store(d + 2 * i, _mm256_mul_ps(weft_f16c_load(b + 2 * i), s));
    weft_red_generic_scale_f16(d + 2 * i, b + 2 * i, scalar, n - i);
}

/* The AVX2 table, with the F16C loops for fp16 sum, prod and premul. */
static const struct weft_red_fns weft_red_table_avx2[WEFT_NUM_DTYPES] = {
    [WEFT_INT8] = WEFT_FNS(avx2, i8),
    [WEFT_UINT8] = WEFT_FNS(avx2, u8),
    [WEFT_INT32] = WEFT_FNS(avx2, i32),
    [WEFT_UINT32] = WEFT_FNS(avx2, u32),
    [WEFT_INT64] = WEFT_FNS(avx2, i64),
    [WEFT_UINT64] = WEFT_FNS(avx2, u64),
    [WEFT_FLOAT16] =
        {
            .op = {weft_red_f16c_sum_f16, weft_red_f16c_prod_f16, weft_red_avx2_max_f16,
                   weft_red_avx2_min_f16},
            .premul_sum = weft_red_f16c_premul_sum_f16,
            .scale = weft_red_f16c_scale_f16,
            .div = weft_red_avx2_div_f16,
        },
    [WEFT_FLOAT32] = WEFT_FNS(avx2, f32),
    [WEFT_FLOAT64] = WEFT_FNS(avx2, f64),
    [WEFT_BFLOAT16] = WEFT_FNS(avx2, bf16),
    [WEFT_FP8E4M3] = WEFT_FNS(avx2, e4m3),
    [WEFT_FP8E5M2] = WEFT_FNS(avx2, e5m2),
};
#endif

/* The table in use: NULL until the first call picks the best path for this CPU. */
static const struct weft_red_fns *weft_red_table;
static int weft_red_isa = -1;

static int weft_red_isa_supported(int isa)
{
    if (isa == WEFT_REDUCE_ISA_GENERIC)
        return 1;
#if WEFT_RED_X86
    if (isa == WEFT_REDUCE_ISA_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    return 0;
}

int weft_reduce_set_isa(int isa)
{
    if (isa == WEFT_REDUCE_ISA_AUTO)
        isa = weft_red_isa_supported(WEFT_REDUCE_ISA_AVX2) ? WEFT_REDUCE_ISA_AVX2
                                                           : WEFT_REDUCE_ISA_GENERIC;
    if (!weft_red_isa_supported(isa))
        return -1;
    const struct weft_red_fns *t = weft_red_table_generic;
#if WEFT_RED_X86
    if (isa == WEFT_REDUCE_ISA_AVX2)
        t = weft_red_table_avx2;
#endif
    __atomic_store_n(&weft_red_isa, isa, __ATOMIC_RELAXED);
    __atomic_store_n(&weft_red_table, t, __ATOMIC_RELEASE);
    return 0;
}

const char *weft_reduce_isa_name(void)
{
    if (__atomic_load_n(&weft_red_table, __ATOMIC_ACQUIRE) == NULL)
        weft_reduce_set_isa(WEFT_REDUCE_ISA_AUTO);
    return __atomic_load_n(&weft_red_isa, __ATOMIC_RELAXED) == WEFT_REDUCE_ISA_AVX2 ? "avx2+f16c"
                                                                                     : "generic";
}

const size_t weft_dtype_sizes[WEFT_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

/* nccl-tests spellings */
static const char *const weft_dtype_names[WEFT_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2",
};

const char *weft_dtype_name(int dtype)
{
    return dtype >= 0 && dtype < WEFT_NUM_DTYPES ? weft_dtype_names[dtype] : "invalid";
}

/* Bytes of the stack buffer used when a premultiplied input meets a kind other than sum. */
#define WEFT_RED_TMP_BYTES 4096

/* Everything else; apart, so that the common call sets up no frame (noinline). */
static __attribute__((noinline)) void weft_reduce_general(const struct weft_redop *op, void *dst,
                                                          const void *a, const void *b,
                                                          size_t count, int flags);

/* Premultiplied input with prod/max/min: scale a chunk of b, then combine. Apart from
 * weft_reduce, so that its common calls set up no 4 KiB frame (with its stack probe). */
static __attribute__((noinline)) void weft_reduce_premul_other(const struct weft_redop *op,
                                                               const struct weft_red_fns *f,
                                                               void *dst, const void *a,
                                                               const void *b, size_t count)
{
    _Alignas(64) unsigned char tmp[WEFT_RED_TMP_BYTES];
    size_t es = weft_dtype_sizes[op->dtype];
    size_t chunk = WEFT_RED_TMP_BYTES / es;
    for (size_t off = 0; off < count; off += chunk) {
        size_t m = count - off < chunk ? count - off : chunk;
        f->scale(tmp, (const char *)b + off * es, op->scalar.bytes, m);
        f->op[op->kind]((char *)dst + off * es, (const char *)a + off * es, tmp, m);
    }
}

void weft_reduce(const struct weft_redop *op, void *dst, const void *a, const void *b,
                 size_t count, int flags)
{
    const struct weft_red_fns *table = __atomic_load_n(&weft_red_table, __ATOMIC_ACQUIRE);
    /* The common call, two inputs and no transform: straight to the kernel, without this
     * function's frame (8 B all-reduce: 51 -> 25 instructions here). */
    if (WEFT_LIKELY(table != NULL && a != NULL && !op->premul && !op->postdiv && count != 0 &&
                    (unsigned)op->dtype < WEFT_NUM_DTYPES && (unsigned)op->kind <= WEFT_RED_MIN)) {
        table[op->dtype].op[op->kind](dst, a, b, count);
        return;
    }
    weft_reduce_general(op, dst, a, b, count, flags);
}

static __attribute__((noinline)) void weft_reduce_general(const struct weft_redop *op, void *dst,
                                                          const void *a, const void *b,
                                                          size_t count, int flags)
{
    if (op->dtype < 0 || op->dtype >= WEFT_NUM_DTYPES || op->kind < WEFT_RED_SUM ||
        op->kind > WEFT_RED_MIN) {
        /* Internal invariant: weft_redop_build validates user input before any reduction. */
        fprintf(stderr, "weft: weft_reduce: invalid dtype %d or op kind %d\n", op->dtype, op->kind);
        abort();
    }
    if (count == 0)
        return;
    const struct weft_red_fns *table = __atomic_load_n(&weft_red_table, __ATOMIC_ACQUIRE);
    if (WEFT_UNLIKELY(table == NULL)) {
        weft_reduce_set_isa(WEFT_REDUCE_ISA_AUTO);
        table = __atomic_load_n(&weft_red_table, __ATOMIC_ACQUIRE);
    }
    const struct weft_red_fns *f = &table[op->dtype];
    int pre = (flags & WEFT_REDUCE_PRE_B) && op->premul;
    int post = (flags & WEFT_REDUCE_POST) && op->postdiv && op->divisor > 1;

    if (a == NULL) {
        if (pre)
            f->scale(dst, b, op->scalar.bytes, count);
        else if (dst != b)
            memcpy(dst, b, count * weft_dtype_sizes[op->dtype]);
    } else if (!pre) {
        f->op[op->kind](dst, a, b, count);
    } else if (op->kind == WEFT_RED_SUM) {
        f->premul_sum(dst, a, b, op->scalar.bytes, count);
    } else {
        weft_reduce_premul_other(op, f, dst, a, b, count);
    }
    if (post)
        f->div(dst, op->divisor, count);
}

float weft_half_to_float(uint16_t h)
{
    return weft_elem_f16_to_f32(h);
}

uint16_t weft_float_to_half(float f)
{
    return weft_elem_f32_to_f16(f);
}

float weft_bf16_to_float(uint16_t h)
{
    return weft_elem_bf16_to_f32(h);
}

uint16_t weft_float_to_bf16(float f)
{
    return weft_elem_f32_to_bf16(f);
}

float weft_fp8e4m3_to_float(uint8_t v)
{
    return weft_elem_e4m3_to_f32(v);
}

uint8_t weft_float_to_fp8e4m3(float f)
{
    return weft_elem_f32_to_e4m3(f);
}

float weft_fp8e5m2_to_float(uint8_t v)
{
    return weft_elem_e5m2_to_f32(v);
}

uint8_t weft_float_to_fp8e5m2(float f)
{
    return weft_elem_f32_to_e5m2(f);
}

/* Saturating double -> integer conversions (C leaves out-of-range conversions undefined). */
static int64_t weft_double_to_i64(double v, int64_t lo, int64_t hi)
{
    if (v != v)
        return 0;
    if (v <= (double)lo)
        return lo;
    if (v >= (double)hi)
        return hi;
    return (int64_t)v;
}

static uint64_t weft_double_to_u64(double v, uint64_t hi)
{
    if (!(v > 0.0))
        return 0;
    if (v >= (double)hi)
        return hi;
    return (uint64_t)v;
}

void weft_dtype_from_double(int dtype, double value, void *out)
{
    union {
        int8_t i8;
        uint8_t u8;
        int32_t i32;
        uint32_t u32;
        int64_t i64;
        uint64_t u64;
        uint16_t h;
        float f;
        double d;
    } v;
    memset(&v, 0, sizeof(v));
    switch (dtype) {
    case WEFT_INT8:
        v.i8 = (int8_t)weft_double_to_i64(value, INT8_MIN, INT8_MAX);
        break;
    case WEFT_UINT8:
        v.u8 = (uint8_t)weft_double_to_u64(value, UINT8_MAX);
        break;
    case WEFT_INT32:
        v.i32 = (int32_t)weft_double_to_i64(value, INT32_MIN, INT32_MAX);
        break;
    case WEFT_UINT32:
        v.u32 = (uint32_t)weft_double_to_u64(value, UINT32_MAX);
        break;
    case WEFT_INT64:
        v.i64 = weft_double_to_i64(value, INT64_MIN, INT64_MAX);
        break;
    case WEFT_UINT64:
        v.u64 = weft_double_to_u64(value, UINT64_MAX);
        break;
    case WEFT_FLOAT16:
        v.h = weft_elem_f32_to_f16((float)value);
        break;
    case WEFT_FLOAT32:
        v.f = (float)value;
        break;
    case WEFT_FLOAT64:
        v.d = value;
        break;
    case WEFT_BFLOAT16:
        v.h = weft_elem_f32_to_bf16((float)value);
        break;
    case WEFT_FP8E4M3:
        v.u8 = weft_elem_f32_to_e4m3((float)value);
        break;
    case WEFT_FP8E5M2:
        v.u8 = weft_elem_f32_to_e5m2((float)value);
        break;
    default:
        return;
    }
    memcpy(out, &v, weft_dtype_size(dtype));
}
