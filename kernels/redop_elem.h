/*
 * Element operations for every NCCL data type, written once for gcc (C, host) and nvcc (C++,
 * host and device). redop.c builds its vectorised host loops from these; the CUDA executor's
 * kernels call the same functions, so both sides compute the same bits.
 *
 * Names: weft_elem_<op>_<type>, type in i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16 e4m3 e5m2.
 * fp16 and bf16 travel as uint16_t bits, fp8 as uint8_t bits. Ops: sum, prod, max, min,
 * premul (x times the op's scalar, same type), div (x divided by an integer divisor).
 *
 * Semantics, chosen to match what NCCL 2.28's device code (src/device/reduce_kernel.h) computes on
 * sm_80/sm_90:
 *   - integers: sum/prod wrap (computed unsigned); max/min in the type's own order; div truncates
 *     toward zero (C division, like NCCL's FuncSumPostDiv for ncclAvg).
 *   - fp32/fp64: IEEE operations rounded to nearest even. On the device the *_rn intrinsics are
 *     used so nvcc cannot contract premul + sum into an FMA (the host does not contract either:
 *     code including this header must be compiled with -ffp-contract=off, as redop.c is).
 *   - fp16, bf16: each binary op is computed in float and rounded once to nearest even. That equals
 *     NVIDIA's __hadd/__hmul: float holds the exact product, and for sums float's 24 bits are
 *     >= 2p+2, so rounding first to float and then to the 11-bit (or 8-bit) format cannot
 *     double-round.
 *   - fp8 (e4m3, e5m2): NCCL's sm_90 code converts both operands to __half, applies __hadd/__hmul/
 *     __hmax/__hmin, and converts back through the __nv_fp8_e4m3/__nv_fp8_e5m2 constructors, which
 *     use __NV_SATFINITE. So: exact op in float, round to fp16 (may overflow to inf), then to fp8
 *     with satfinite rounding: |x| beyond the largest finite value, infinities included, become
 *     +-448 (e4m3) or +-57344 (e5m2); NaN becomes 0x7f. Hence e5m2 inf + 1 = 57344 (and
 *     max(inf, x) = 57344), and e4m3 never produces NaN from finite inputs. The fp16 step cannot
 *     change the result of an op on two fp8 values (see WEFT_ELEM_FP8_OPS), so it is skipped.
 *   - max/min on floating types: NaN is treated as missing data, like fmaxf/fminf (NCCL uses
 *     fmaxf/fminf for fp32/fp64 and __hmax/__hmin for fp16/bf16/fp8): max(NaN, x) = x; both NaN
 *     give the canonical NaN. Zeros are ordered -0 < +0 (documented for __hmax/__hmin; the same
 *     rule is used for fp32/fp64 so results are deterministic).
 *   - NaN results of conversions are canonical: fp16/bf16 0x7fff, fp8 0x7f, fp32 0x7fffffff,
 *     fp64 0x7fffffffffffffff in max/min. fp32/fp64 sum/prod keep whatever NaN the FPU makes.
 *
 * Checked on the host against the host emulation in CUDA 13's cuda_fp16.h/cuda_bf16.h/cuda_fp8.h
 * (a one-off g++ program, not part of the build): the four float -> fp16/bf16/e4m3/e5m2
 * conversions for all 2^32 floats, all fp8 pairs of __hadd/__hmul/__hmax/__hmin through the
 * satfinite constructors, and 4M random fp16/bf16 pairs: no difference. redop_check.cu repeats
 * the comparison against the device intrinsics when a GPU is present.
 */
#ifndef WEFT_KERNELS_REDOP_ELEM_H
#define WEFT_KERNELS_REDOP_ELEM_H

#include <stdint.h>

#include "compat.h"

/* ---- bit casts ---------------------------------------------------------------------------- */

WEFT_HD uint32_t weft_elem_f32_bits(float f)
{
#if WEFT_DEVICE_PASS
    return __float_as_uint(f);
#else
    union {
        float f;
        uint32_t u;
    } v;
    v.f = f;
    return v.u;
#endif
}

WEFT_HD float weft_elem_f32_from_bits(uint32_t u)
{
#if WEFT_DEVICE_PASS
    return __uint_as_float(u);
#else
    union {
        float f;
        uint32_t u;
    } v;
    v.u = u;
    return v.f;
#endif
}

WEFT_HD uint64_t weft_elem_f64_bits(double f)
{
#if WEFT_DEVICE_PASS
    return (uint64_t)__double_as_longlong(f);
#else
    union {
        double f;
        uint64_t u;
    } v;
    v.f = f;
    return v.u;
#endif
}

WEFT_HD double weft_elem_f64_from_bits(uint64_t u)
{
#if WEFT_DEVICE_PASS
    return __longlong_as_double((long long)u);
#else
    union {
        double f;
        uint64_t u;
    } v;
    v.u = u;
    return v.f;
#endif
}

#define WEFT_ELEM_F32_NAN_BITS 0x7fffffffu
#define WEFT_ELEM_F64_NAN_BITS 0x7fffffffffffffffull
#define WEFT_ELEM_F16_NAN 0x7fffu
#define WEFT_ELEM_BF16_NAN 0x7fffu
#define WEFT_ELEM_FP8_NAN 0x7fu

/*
 * Select on 32-bit values, c being 0 or 1, written with masks: gcc's vectoriser rejects some
 * conditional expressions whose condition was computed at a narrower width (16-bit loads).
 */
WEFT_HD uint32_t weft_elem_sel(uint32_t c, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - c;
    return (a & m) | (b & ~m);
}

/* ---- conversions -------------------------------------------------------------------------- */
/*
 * All conversions are branch-free (selects only) so that gcc vectorises the loops that use them.
 * Rounding is to nearest, ties to even, done on the integer bits; below the normal range an add of
 * a power of two whose ulp is the target's subnormal step lets the FPU round (exact in the default
 * rounding mode).
 */

/* fp16 -> fp32, exact. NaN payloads are kept (quiet bit included). */
WEFT_HD float weft_elem_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t mag = (uint32_t)h & 0x7fffu;
    uint32_t nrm = (mag << 13) + (112u << 23);   /* exponent bias 15 -> 127 */
    uint32_t special = (mag << 13) | 0x7f800000u; /* inf, NaN */
    /* subnormal: mag * 2^-24 is exact in float */
    uint32_t sub = weft_elem_f32_bits((float)mag * 5.9604644775390625e-8f);
    uint32_t r = weft_elem_sel(mag >= 0x7c00u, special, nrm);
    r = weft_elem_sel(mag < 0x0400u, sub, r);
    return weft_elem_f32_from_bits(r | sign);
}

/* fp32 -> fp16, round to nearest even; overflow gives inf; NaN gives 0x7fff. */
WEFT_HD uint16_t weft_elem_f32_to_f16(float f)
{
    uint32_t x = weft_elem_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    /* normal: rebias 127 -> 15, round away the 13 low bits (carry may reach inf, correctly) */
    uint32_t nrm = (ax - (112u << 23) + 0x0fffu + ((ax >> 13) & 1u)) >> 13;
    /* subnormal (|f| < 2^-14): 0.5f has ulp 2^-24, the fp16 subnormal step */
    uint32_t sub = weft_elem_f32_bits(weft_elem_f32_from_bits(ax) + 0.5f) - 0x3f000000u;
    uint32_t r = weft_elem_sel(ax < 0x38800000u, sub, nrm);
    r = weft_elem_sel(ax >= 0x477ff000u, 0x7c00u, r); /* >= 65520 (max + half ulp): inf */
    r = weft_elem_sel(ax > 0x7f800000u, WEFT_ELEM_F16_NAN, r | sign);
    return (uint16_t)r;
}

/* bf16 -> fp32, exact. */
WEFT_HD float weft_elem_bf16_to_f32(uint16_t h)
{
    return weft_elem_f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> bf16, round to nearest even; overflow gives inf; NaN gives 0x7fff. */
WEFT_HD uint16_t weft_elem_f32_to_bf16(float f)
{
    uint32_t x = weft_elem_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r = ((ax + 0x7fffu + ((ax >> 16) & 1u)) >> 16) | sign;
    r = weft_elem_sel(ax > 0x7f800000u, WEFT_ELEM_BF16_NAN, r);
    return (uint16_t)r;
}

/* fp8 e4m3 (bias 7, no infinity, 0x7f/0xff NaN, max 448) -> fp32, exact; NaN gives 0x7fffffff. */
WEFT_HD float weft_elem_e4m3_to_f32(uint8_t v)
{
    uint32_t sign = ((uint32_t)v & 0x80u) << 24;
    uint32_t mag = (uint32_t)v & 0x7fu;
    uint32_t nrm = (mag << 20) + (120u << 23); /* exponent bias 7 -> 127 */
    uint32_t sub = weft_elem_f32_bits((float)mag * 0.001953125f); /* mag * 2^-9 */
    uint32_t r = weft_elem_sel(mag < 8u, sub, nrm) | sign;
    r = weft_elem_sel(mag == 0x7fu, WEFT_ELEM_F32_NAN_BITS, r);
    return weft_elem_f32_from_bits(r);
}

/*
 * fp32 -> fp8 e4m3 with NVIDIA's __NV_SATFINITE rule (what the __nv_fp8_e4m3 constructors and
 * cvt.rn.satfinite do): round to nearest even; anything that would round beyond 448, infinities
 * included, becomes +-448 (0x7e/0xfe); NaN becomes 0x7f.
 */
WEFT_HD uint8_t weft_elem_f32_to_e4m3(float f)
{
    uint32_t x = weft_elem_f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t nrm = (ax - (120u << 23) + 0x7ffffu + ((ax >> 20) & 1u)) >> 20;
    nrm = weft_elem_sel(nrm > 0x7eu, 0x7eu, nrm);
    /* subnormal (|f| < 2^-6): 16384.0f has ulp 2^-9, the e4m3 subnormal step */
    uint32_t sub = weft_elem_f32_bits(weft_elem_f32_from_bits(ax) + 16384.0f) - 0x46800000u;
    uint32_t r = weft_elem_sel(ax < 0x3c800000u, sub, nrm) | sign;
    r = weft_elem_sel(ax > 0x7f800000u, WEFT_ELEM_FP8_NAN, r);
    return (uint8_t)r;
}

/* fp8 e5m2 (the top byte of an fp16) -> fp32, exact. */
WEFT_HD float weft_elem_e5m2_to_f32(uint8_t v)
{
    return weft_elem_f16_to_f32((uint16_t)((uint32_t)v << 8));
}

/*
 * fp32 -> fp8 e5m2 with __NV_SATFINITE: round to nearest even; beyond 57344, infinities
 * included, becomes +-57344 (0x7b/0xfb); NaN becomes 0x7f.
 */
WEFT_HD uint8_t weft_elem_f32_to_e5m2(float f)
{
    uint32_t x = weft_elem_f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t nrm = (ax - (112u << 23) + 0xfffffu + ((ax >> 21) & 1u)) >> 21;
    nrm = weft_elem_sel(nrm > 0x7bu, 0x7bu, nrm);
    /* subnormal (|f| < 2^-14): 128.0f has ulp 2^-16, the e5m2 subnormal step */
    uint32_t sub = weft_elem_f32_bits(weft_elem_f32_from_bits(ax) + 128.0f) - 0x43000000u;
    uint32_t r = weft_elem_sel(ax < 0x38800000u, sub, nrm) | sign;
    r = weft_elem_sel(ax > 0x7f800000u, WEFT_ELEM_FP8_NAN, r);
    return (uint8_t)r;
}

/* Rounds a float to the nearest fp16 value (inf on overflow), staying in float. */
WEFT_HD float weft_elem_round_f16(float f)
{
    return weft_elem_f16_to_f32(weft_elem_f32_to_f16(f));
}

/* ---- integer ops -------------------------------------------------------------------------- */
/* Sum and product are done in the unsigned type of at least 32 bits (wrap, no signed overflow). */

#define WEFT_ELEM_INT_OPS(sfx, T, UT, DT)                                                          \
    WEFT_HD T weft_elem_sum_##sfx(T a, T b)                                                        \
    {                                                                                              \
        return (T)((UT)a + (UT)b);                                                                 \
    }                                                                                              \
    WEFT_HD T weft_elem_prod_##sfx(T a, T b)                                                       \
    {                                                                                              \
        return (T)((UT)a * (UT)b);                                                                 \
    }                                                                                              \
    WEFT_HD T weft_elem_max_##sfx(T a, T b)                                                        \
    {                                                                                              \
        return a > b ? a : b;                                                                      \
    }                                                                                              \
    WEFT_HD T weft_elem_min_##sfx(T a, T b)                                                        \
    {                                                                                              \
        return a < b ? a : b;                                                                      \
    }                                                                                              \
    WEFT_HD T weft_elem_premul_##sfx(T a, T scalar)                                                \
    {                                                                                              \
        return weft_elem_prod_##sfx(a, scalar);                                                    \
    }                                                                                              \
    /* divisor >= 1; truncates toward zero */                                                      \
    WEFT_HD T weft_elem_div_##sfx(T a, uint64_t divisor)                                           \
    {                                                                                              \
        return (T)((DT)a / (DT)divisor);                                                           \
    }

/* Signed types divide as int64 (the divisor, nranks, is far below INT64_MAX). */
WEFT_ELEM_INT_OPS(i8, int8_t, uint32_t, int64_t)
WEFT_ELEM_INT_OPS(u8, uint8_t, uint32_t, uint64_t)
WEFT_ELEM_INT_OPS(i32, int32_t, uint32_t, int64_t)
WEFT_ELEM_INT_OPS(u32, uint32_t, uint32_t, uint64_t)
WEFT_ELEM_INT_OPS(i64, int64_t, uint64_t, int64_t)
WEFT_ELEM_INT_OPS(u64, uint64_t, uint64_t, uint64_t)

#undef WEFT_ELEM_INT_OPS

/* ---- fp32 / fp64 -------------------------------------------------------------------------- */

WEFT_HD float weft_elem_sum_f32(float a, float b)
{
#if WEFT_DEVICE_PASS
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

WEFT_HD float weft_elem_prod_f32(float a, float b)
{
#if WEFT_DEVICE_PASS
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* NaN-ignoring max (fmaxf), with -0 < +0 and a canonical NaN when both are NaN. */
WEFT_HD float weft_elem_max_f32(float a, float b)
{
    float r = a > b ? a : b; /* b when either is NaN */
    r = a == b ? weft_elem_f32_from_bits(weft_elem_f32_bits(a) & weft_elem_f32_bits(b)) : r;
    r = b != b ? a : r;
    return r != r ? weft_elem_f32_from_bits(WEFT_ELEM_F32_NAN_BITS) : r;
}

WEFT_HD float weft_elem_min_f32(float a, float b)
{
    float r = a < b ? a : b;
    r = a == b ? weft_elem_f32_from_bits(weft_elem_f32_bits(a) | weft_elem_f32_bits(b)) : r;
    r = b != b ? a : r;
    return r != r ? weft_elem_f32_from_bits(WEFT_ELEM_F32_NAN_BITS) : r;
}

WEFT_HD float weft_elem_premul_f32(float a, float scalar)
{
    return weft_elem_prod_f32(a, scalar);
}

WEFT_HD float weft_elem_div_f32(float a, uint64_t divisor)
{
#if WEFT_DEVICE_PASS
    return __fdiv_rn(a, (float)divisor);
#else
    return a / (float)divisor;
#endif
}

WEFT_HD double weft_elem_sum_f64(double a, double b)
{
#if WEFT_DEVICE_PASS
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

WEFT_HD double weft_elem_prod_f64(double a, double b)
{
#if WEFT_DEVICE_PASS
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

WEFT_HD double weft_elem_max_f64(double a, double b)
{
    double r = a > b ? a : b;
    r = a == b ? weft_elem_f64_from_bits(weft_elem_f64_bits(a) & weft_elem_f64_bits(b)) : r;
    r = b != b ? a : r;
    return r != r ? weft_elem_f64_from_bits(WEFT_ELEM_F64_NAN_BITS) : r;
}

WEFT_HD double weft_elem_min_f64(double a, double b)
{
    double r = a < b ? a : b;
    r = a == b ? weft_elem_f64_from_bits(weft_elem_f64_bits(a) | weft_elem_f64_bits(b)) : r;
    r = b != b ? a : r;
    return r != r ? weft_elem_f64_from_bits(WEFT_ELEM_F64_NAN_BITS) : r;
}

WEFT_HD double weft_elem_premul_f64(double a, double scalar)
{
    return weft_elem_prod_f64(a, scalar);
}

WEFT_HD double weft_elem_div_f64(double a, uint64_t divisor)
{
#if WEFT_DEVICE_PASS
    return __ddiv_rn(a, (double)divisor);
#else
    return a / (double)divisor;
#endif
}

/* ---- fp16 / bf16: op in float, one rounding ------------------------------------------------- */

#define WEFT_ELEM_HALF_OPS(sfx)                                                                    \
    WEFT_HD uint16_t weft_elem_sum_##sfx(uint16_t a, uint16_t b)                                   \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_sum_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));          \
    }                                                                                              \
    WEFT_HD uint16_t weft_elem_prod_##sfx(uint16_t a, uint16_t b)                                  \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_prod_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));         \
    }                                                                                              \
    WEFT_HD uint16_t weft_elem_max_##sfx(uint16_t a, uint16_t b)                                   \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_max_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));          \
    }                                                                                              \
    WEFT_HD uint16_t weft_elem_min_##sfx(uint16_t a, uint16_t b)                                   \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_min_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));          \
    }                                                                                              \
    WEFT_HD uint16_t weft_elem_premul_##sfx(uint16_t a, uint16_t scalar)                           \
    {                                                                                              \
        return weft_elem_prod_##sfx(a, scalar);                                                    \
    }                                                                                              \
    WEFT_HD uint16_t weft_elem_div_##sfx(uint16_t a, uint64_t divisor)                             \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(weft_elem_div_f32(weft_elem_##sfx##_to_f32(a), divisor));    \
    }

WEFT_ELEM_HALF_OPS(f16)
WEFT_ELEM_HALF_OPS(bf16)

#undef WEFT_ELEM_HALF_OPS

/* ---- fp8: op in float (exact), then to fp8 with satfinite --------------------------------- */

/*
 * NCCL rounds the fp16 result of __hadd/__hmul to fp8. For two fp8 operands the exact sum or
 * product has so few significant bits that rounding it to fp16 first never changes the fp8 result
 * (no false ties, and fp16 over/underflow lands on the same satfinite/zero result), so sum and
 * prod round once, straight from float. test_redop checks this exhaustively: all 65536 operand
 * pairs of both formats against a reference that does go through fp16.
 */
#define WEFT_ELEM_FP8_OPS(sfx)                                                                     \
    WEFT_HD uint8_t weft_elem_sum_##sfx(uint8_t a, uint8_t b)                                      \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_sum_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));          \
    }                                                                                              \
    WEFT_HD uint8_t weft_elem_prod_##sfx(uint8_t a, uint8_t b)                                     \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_prod_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));         \
    }                                                                                              \
    /* operands are exact in fp16, so max/min need no rounding */                                  \
    WEFT_HD uint8_t weft_elem_max_##sfx(uint8_t a, uint8_t b)                                      \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_max_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));          \
    }                                                                                              \
    WEFT_HD uint8_t weft_elem_min_##sfx(uint8_t a, uint8_t b)                                      \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_min_f32(weft_elem_##sfx##_to_f32(a), weft_elem_##sfx##_to_f32(b)));          \
    }                                                                                              \
    WEFT_HD uint8_t weft_elem_premul_##sfx(uint8_t a, uint8_t scalar)                              \
    {                                                                                              \
        return weft_elem_prod_##sfx(a, scalar);                                                    \
    }                                                                                              \
    /* not used by NCCL (fp8 avg premultiplies); an fp16 quotient, like the other fp8 ops */      \
    WEFT_HD uint8_t weft_elem_div_##sfx(uint8_t a, uint64_t divisor)                               \
    {                                                                                              \
        return weft_elem_f32_to_##sfx(                                                             \
            weft_elem_round_f16(weft_elem_div_f32(weft_elem_##sfx##_to_f32(a), divisor)));         \
    }

WEFT_ELEM_FP8_OPS(e4m3)
WEFT_ELEM_FP8_OPS(e5m2)

#undef WEFT_ELEM_FP8_OPS

#endif
