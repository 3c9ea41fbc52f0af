/*
 * nvcc check for redop_elem.h, and the device half of the host/device equality check.
 *
 * 1. Compile check (meson test 'redop-nvcc', suite unit, sm_80 + sm_90): every element op of every
 *    type is instantiated in a __global__ kernel and in a host function, so both of nvcc's passes
 *    compile the header.
 * 2. With -DWEFT_REDOP_CHECK_MAIN the file is also a program (`nvcc -DWEFT_REDOP_CHECK_MAIN
 *    -gencode=arch=compute_90,code=sm_90 -Ikernels kernels/redop_check.cu -o redop_check`) that,
 *    on a GPU, compares the weft_elem_* results bit for bit with the expressions NCCL's
 *    reduce_kernel.h uses on sm_90 (__hadd/__hmul/__hmax/__hmin, fp8 through __half with the
 *    satfinite constructors, fmaxf/fminf): all fp8 pairs, all (or sampled) fp16/bf16 pairs,
 *    hashed fp32/fp64 pairs. Exit 0 when equal, 1 on a mismatch, 77 without a GPU.
 *    Differences in the sign of a zero from fmaxf/fminf and in NaN payloads of fp32/fp64
 *    sum/prod are counted apart and reported, not failed: the host defines them, the device
 *    documentation does not.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "redop_elem.h"

/* ---- 1. every op, every type, both passes ---------------------------------------------------- */

#define WEFT_CHECK_OPS(sfx, T)                                                                     \
    __host__ __device__ void weft_redop_check_ops_##sfx(T *d, const T *a, const T *b, T s,         \
                                                        uint64_t divisor, size_t i)                \
    {                                                                                              \
        T x = a[i], y = b[i];                                                                      \
        d[6 * i + 0] = weft_elem_sum_##sfx(x, y);                                                  \
        d[6 * i + 1] = weft_elem_prod_##sfx(x, y);                                                 \
        d[6 * i + 2] = weft_elem_max_##sfx(x, y);                                                  \
        d[6 * i + 3] = weft_elem_min_##sfx(x, y);                                                  \
        d[6 * i + 4] = weft_elem_sum_##sfx(x, weft_elem_premul_##sfx(y, s));                       \
        d[6 * i + 5] = weft_elem_div_##sfx(x, divisor);                                            \
    }                                                                                              \
    __global__ void weft_redop_check_kernel_##sfx(T *d, const T *a, const T *b, T s,               \
                                                  uint64_t divisor, size_t n)                      \
    {                                                                                              \
        size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                  \
        if (i < n)                                                                                 \
            weft_redop_check_ops_##sfx(d, a, b, s, divisor, i);                                    \
    }

WEFT_CHECK_OPS(i8, int8_t)
WEFT_CHECK_OPS(u8, uint8_t)
WEFT_CHECK_OPS(i32, int32_t)
WEFT_CHECK_OPS(u32, uint32_t)
WEFT_CHECK_OPS(i64, int64_t)
WEFT_CHECK_OPS(u64, uint64_t)
WEFT_CHECK_OPS(f16, uint16_t)
WEFT_CHECK_OPS(f32, float)
WEFT_CHECK_OPS(f64, double)
WEFT_CHECK_OPS(bf16, uint16_t)
WEFT_CHECK_OPS(e4m3, uint8_t)
WEFT_CHECK_OPS(e5m2, uint8_t)

__host__ __device__ void weft_redop_check_conversions(float *out, const float *in, size_t i)
{
    float f = in[i];
    out[8 * i + 0] = weft_elem_f16_to_f32(weft_elem_f32_to_f16(f));
    out[8 * i + 1] = weft_elem_bf16_to_f32(weft_elem_f32_to_bf16(f));
    out[8 * i + 2] = weft_elem_e4m3_to_f32(weft_elem_f32_to_e4m3(f));
    out[8 * i + 3] = weft_elem_e5m2_to_f32(weft_elem_f32_to_e5m2(f));
    out[8 * i + 4] = weft_elem_round_f16(f);
    out[8 * i + 5] = weft_elem_f32_from_bits(weft_elem_sel(f > 0.0f, 1u, 2u));
    out[8 * i + 6] = (float)weft_elem_f64_from_bits(weft_elem_f64_bits((double)f));
    out[8 * i + 7] = 0.0f;
}

__global__ void weft_redop_check_conversions_kernel(float *out, const float *in, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        weft_redop_check_conversions(out, in, i);
}

WEFT_STATIC_ASSERT(sizeof(uint16_t) == sizeof(__half), "fp16 storage");

#if defined(WEFT_REDOP_CHECK_MAIN)
/* ---- 2. device results against NVIDIA's intrinsics, as NCCL composes them ------------------- */

enum { T_F16, T_BF16, T_E4M3, T_E5M2, T_F32, T_F64, T_N };
enum { O_SUM, O_PROD, O_MAX, O_MIN, O_PREMUL, O_N };

struct weft_check_result {
    unsigned long long mismatches[T_N][O_N];
    unsigned long long soft[T_N][O_N]; /* zero sign from fmax/fmin, NaN payloads */
    unsigned long long first_a[T_N][O_N], first_b[T_N][O_N], first_got[T_N][O_N],
        first_want[T_N][O_N];
};

__device__ static void weft_note(weft_check_result *r, int t, int o, uint64_t a, uint64_t b,
                                 uint64_t got, uint64_t want, int soft)
{
    if (got == want)
        return;
    if (soft) {
        atomicAdd(&r->soft[t][o], 1ull);
        return;
    }
    if (atomicAdd(&r->mismatches[t][o], 1ull) == 0) {
        r->first_a[t][o] = a;
        r->first_b[t][o] = b;
        r->first_got[t][o] = got;
        r->first_want[t][o] = want;
    }
}

__device__ static uint16_t weft_h_bits(__half h)
{
    return __half_as_ushort(h);
}

__device__ static uint16_t weft_b_bits(__nv_bfloat16 h)
{
    return __bfloat16_as_ushort(h);
}

template <typename Fp8, __nv_fp8_interpretation_t Interp>
__device__ static void weft_check_fp8(weft_check_result *r, int t, uint8_t x, uint8_t y)
{
    Fp8 fx, fy;
    fx.__x = x;
    fy.__x = y;
    __half hx = __half(fx), hy = __half(fy);
    Fp8 want[O_N] = {Fp8(__hadd(hx, hy)), Fp8(__hmul(hx, hy)), Fp8(__hmax(hx, hy)),
                     Fp8(__hmin(hx, hy)), Fp8(__hmul(hx, hy))};
    uint8_t got[O_N];
    if (Interp == __NV_E4M3) {
        got[O_SUM] = weft_elem_sum_e4m3(x, y);
        got[O_PROD] = weft_elem_prod_e4m3(x, y);
        got[O_MAX] = weft_elem_max_e4m3(x, y);
        got[O_MIN] = weft_elem_min_e4m3(x, y);
        got[O_PREMUL] = weft_elem_premul_e4m3(x, y);
    } else {
        got[O_SUM] = weft_elem_sum_e5m2(x, y);
        got[O_PROD] = weft_elem_prod_e5m2(x, y);
        got[O_MAX] = weft_elem_max_e5m2(x, y);
        got[O_MIN] = weft_elem_min_e5m2(x, y);
        got[O_PREMUL] = weft_elem_premul_e5m2(x, y);
    }
    for (int o = 0; o < O_N; o++)
        weft_note(r, t, o, x, y, got[o], want[o].__x, 0);
}

/* Every fp8 pair (65536 threads). */
__global__ void weft_check_fp8_kernel(weft_check_result *r)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 65536)
        return;
    uint8_t x = (uint8_t)(i >> 8), y = (uint8_t)i;
    weft_check_fp8<__nv_fp8_e4m3, __NV_E4M3>(r, T_E4M3, x, y);
    weft_check_fp8<__nv_fp8_e5m2, __NV_E5M2>(r, T_E5M2, x, y);
}

/* fp16 and bf16 pairs i, i + stride, ... of the 2^32 (stride 1: exhaustive). */
__global__ void weft_check_half_kernel(weft_check_result *r, unsigned long long stride)
{
    unsigned long long start = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long k = start; k * stride < (1ull << 32); k += step) {
        unsigned long long p = k * stride;
        uint16_t x = (uint16_t)(p >> 16), y = (uint16_t)p;
        __half hx = __ushort_as_half(x), hy = __ushort_as_half(y);
        weft_note(r, T_F16, O_SUM, x, y, weft_elem_sum_f16(x, y), weft_h_bits(__hadd(hx, hy)), 0);
        weft_note(r, T_F16, O_PROD, x, y, weft_elem_prod_f16(x, y), weft_h_bits(__hmul(hx, hy)),
                  0);
        weft_note(r, T_F16, O_MAX, x, y, weft_elem_max_f16(x, y), weft_h_bits(__hmax(hx, hy)), 0);
        weft_note(r, T_F16, O_MIN, x, y, weft_elem_min_f16(x, y), weft_h_bits(__hmin(hx, hy)), 0);
        __nv_bfloat16 bx = __ushort_as_bfloat16(x), by = __ushort_as_bfloat16(y);
        weft_note(r, T_BF16, O_SUM, x, y, weft_elem_sum_bf16(x, y), weft_b_bits(__hadd(bx, by)),
                  0);
        weft_note(r, T_BF16, O_PROD, x, y, weft_elem_prod_bf16(x, y), weft_b_bits(__hmul(bx, by)),
                  0);
        weft_note(r, T_BF16, O_MAX, x, y, weft_elem_max_bf16(x, y), weft_b_bits(__hmax(bx, by)),
                  0);
        weft_note(r, T_BF16, O_MIN, x, y, weft_elem_min_bf16(x, y), weft_b_bits(__hmin(bx, by)),
                  0);
    }
}

__device__ static uint64_t weft_hash(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

__device__ static int weft_both_zero(double a, double b)
{
    return a == 0 && b == 0;
}

/* Hashed fp32/fp64 pairs; the low bits are sometimes cleared so sums and products are exact. */
__global__ void weft_check_float_kernel(weft_check_result *r, unsigned long long n)
{
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    uint64_t h = weft_hash(i), g = weft_hash(i ^ 0x5555555555555555ull);
    uint32_t ua = (uint32_t)h, ub = (uint32_t)g;
    if (i & 1) {
        ua &= 0xfff00000u;
        ub &= 0xfff00000u;
    }
    float a = __uint_as_float(ua), b = __uint_as_float(ub);
    float got, want;
    got = weft_elem_sum_f32(a, b);
    want = a + b;
    weft_note(r, T_F32, O_SUM, ua, ub, __float_as_uint(got), __float_as_uint(want),
              got != got && want != want);
    got = weft_elem_prod_f32(a, b);
    want = a * b;
    weft_note(r, T_F32, O_PROD, ua, ub, __float_as_uint(got), __float_as_uint(want),
              got != got && want != want);
    got = weft_elem_max_f32(a, b);
    want = fmaxf(a, b);
    weft_note(r, T_F32, O_MAX, ua, ub, __float_as_uint(got), __float_as_uint(want),
              weft_both_zero(got, want));
    got = weft_elem_min_f32(a, b);
    want = fminf(a, b);
    weft_note(r, T_F32, O_MIN, ua, ub, __float_as_uint(got), __float_as_uint(want),
              weft_both_zero(got, want));

    double da = __longlong_as_double((long long)h), db = __longlong_as_double((long long)g);
    double dgot, dwant;
    dgot = weft_elem_sum_f64(da, db);
    dwant = da + db;
    weft_note(r, T_F64, O_SUM, h, g, (uint64_t)__double_as_longlong(dgot),
              (uint64_t)__double_as_longlong(dwant), dgot != dgot && dwant != dwant);
    dgot = weft_elem_max_f64(da, db);
    dwant = fmax(da, db);
    weft_note(r, T_F64, O_MAX, h, g, (uint64_t)__double_as_longlong(dgot),
              (uint64_t)__double_as_longlong(dwant), weft_both_zero(dgot, dwant));
    dgot = weft_elem_min_f64(da, db);
    dwant = fmin(da, db);
    weft_note(r, T_F64, O_MIN, h, g, (uint64_t)__double_as_longlong(dgot),
              (uint64_t)__double_as_longlong(dwant), weft_both_zero(dgot, dwant));
}

int main(int argc, char **argv)
{
    static const char *const tname[T_N] = {"half", "bfloat16", "f8e4m3", "f8e5m2", "float",
                                           "double"};
    static const char *const oname[O_N] = {"sum", "prod", "max", "min", "premul"};
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("redop_check: no CUDA device, skipped\n");
        return 77;
    }
    /* argument: fp16/bf16 pair stride (1 = all 2^32 pairs) */
    unsigned long long stride = argc > 1 ? strtoull(argv[1], NULL, 0) : 1;
    if (stride == 0)
        stride = 1;
    weft_check_result *r;
    if (cudaMallocManaged(&r, sizeof(*r)) != cudaSuccess) {
        printf("redop_check: cudaMallocManaged failed\n");
        return 1;
    }
    memset(r, 0, sizeof(*r));
    weft_check_fp8_kernel<<<256, 256>>>(r);
    weft_check_half_kernel<<<4096, 256>>>(r, stride);
    weft_check_float_kernel<<<(1u << 24) / 256, 256>>>(r, 1ull << 24);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        printf("redop_check: %s\n", cudaGetErrorString(err));
        return 1;
    }
    int bad = 0;
    for (int t = 0; t < T_N; t++)
        for (int o = 0; o < O_N; o++) {
            if (r->mismatches[t][o] != 0) {
                bad = 1;
                printf("MISMATCH %s %s: %llu (first a 0x%llx b 0x%llx weft 0x%llx nvidia 0x%llx)\n",
                       tname[t], oname[o], r->mismatches[t][o], r->first_a[t][o], r->first_b[t][o],
                       r->first_got[t][o], r->first_want[t][o]);
            }
            if (r->soft[t][o] != 0)
                printf("note %s %s: %llu zero-sign or NaN-payload differences\n", tname[t],
                       oname[o], r->soft[t][o]);
        }
    printf("redop_check: %s\n", bad ? "FAILED" : "device results equal weft_elem_*");
    return bad;
}
#endif
