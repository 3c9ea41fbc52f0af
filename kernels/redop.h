/*
 * Reduction operators for every NCCL data type, shared by the host executor (C) and, later, the
 * CUDA executor (nvcc compiles the element ops in kernels/redop_elem.h).
 *
 * A reduction is described once per operation by struct weft_redop; the executor calls
 * weft_reduce() on contiguous runs of elements. Semantics match NCCL:
 *   - sum/prod wrap for integers; max/min use the type's ordering; NaN propagates through float
 *     sum/prod, while float max/min ignore NaN like fmaxf/fminf (max(NaN, x) = x; -0 < +0);
 *   - fp16, bf16 and fp8 (e4m3, e5m2) compute each binary op in float and round to nearest even,
 *     with NaN and infinity handled. fp8 results are converted like NCCL's __nv_fp8 constructors,
 *     with __NV_SATFINITE: overflow and infinities saturate to the largest finite value (e4m3
 *     +-448, e5m2 +-57344), NaN stays NaN (0x7f). See redop_elem.h for the exact rules;
 *   - ncclAvg on floats: every local input is pre-multiplied by (T)(1/nranks), then summed;
 *   - ncclAvg on integers: summed, then the final result divided by nranks (truncation);
 *   - PreMulSum: every local input is pre-multiplied by the op's scalar, then summed.
 */
#ifndef WEFT_KERNELS_REDOP_H
#define WEFT_KERNELS_REDOP_H

#include <stddef.h>
#include <stdint.h>

enum weft_red_kind {
    WEFT_RED_SUM = 0,
    WEFT_RED_PROD = 1,
    WEFT_RED_MAX = 2,
    WEFT_RED_MIN = 3,
};

/* ncclDataType_t values (same numbering as nccl.h, repeated so this header stands alone). */
enum weft_dtype {
    WEFT_INT8 = 0,
    WEFT_UINT8 = 1,
    WEFT_INT32 = 2,
    WEFT_UINT32 = 3,
    WEFT_INT64 = 4,
    WEFT_UINT64 = 5,
    WEFT_FLOAT16 = 6,
    WEFT_FLOAT32 = 7,
    WEFT_FLOAT64 = 8,
    WEFT_BFLOAT16 = 9,
    WEFT_FP8E4M3 = 10,
    WEFT_FP8E5M2 = 11,
    WEFT_NUM_DTYPES = 12,
};

struct weft_redop {
    int dtype;        /* enum weft_dtype */
    int kind;         /* enum weft_red_kind */
    int premul;       /* multiply each local input element by scalar (float avg, PreMulSum) */
    int postdiv;      /* divide each final result by divisor (integer avg) */
    uint64_t divisor; /* nranks for integer avg */
    /* Scalar for premul, stored as the element type's bytes (little-endian, sizeof(dtype)). */
    union {
        uint8_t bytes[8];
        uint64_t u64;
    } scalar;
    /* PreMulSum with a device-resident scalar (ncclScalarDevice in CUDA memory): its address. The
     * CUDA kernel reads it when it runs; for host buffers the executor copies it into scalar
     * first (exec/cuda.c). NULL: scalar holds the value. */
    const void *scalar_dev;
};

/* Flags for weft_reduce(). */
#define WEFT_REDUCE_PRE_B 0x1 /* b is a local input: apply premul (if op->premul) */
#define WEFT_REDUCE_POST 0x2  /* results are final: apply postdiv (if op->postdiv) */

extern const size_t weft_dtype_sizes[WEFT_NUM_DTYPES];

/* Size in bytes of one element; 0 for an invalid type. Inline: several calls on the path of
 * every operation. */
static inline size_t weft_dtype_size(int dtype)
{
    return dtype >= 0 && dtype < WEFT_NUM_DTYPES ? weft_dtype_sizes[dtype] : 0;
}
const char *weft_dtype_name(int dtype);

/*
 * dst[i] = a[i] OP b'[i] for i < count, where b' = premul(b) when (flags & PRE_B), and the result
 * is divided when (flags & POST). a == NULL means dst[i] = b'[i] (then post if POST).
 * dst may alias a or b exactly (same pointer); partial overlap is not allowed.
 * Non-blocking, thread-safe, no allocation. Pointers need no particular alignment.
 */
void weft_reduce(const struct weft_redop *op, void *dst, const void *a, const void *b,
                 size_t count, int flags);

/*
 * Host code path of weft_reduce. The first call picks the best one the CPU supports; tests force
 * each in turn to check they give the same bits. Returns 0, or -1 when the CPU lacks that path.
 * Call it while no weft_reduce() runs (it swaps a pointer; concurrent calls see old or new).
 */
enum weft_reduce_isa {
    WEFT_REDUCE_ISA_AUTO = -1,
    WEFT_REDUCE_ISA_GENERIC = 0, /* baseline target, auto-vectorised */
    WEFT_REDUCE_ISA_AVX2 = 1,    /* x86-64 AVX2 + F16C */
};
int weft_reduce_set_isa(int isa);
const char *weft_reduce_isa_name(void);

/*
 * Conversions used by tests and the perf tools' expected values (round to nearest even; fp8 with
 * NVIDIA's satfinite rule, as in reductions).
 */
float weft_half_to_float(uint16_t h);
uint16_t weft_float_to_half(float f);
float weft_bf16_to_float(uint16_t h);
uint16_t weft_float_to_bf16(float f);
float weft_fp8e4m3_to_float(uint8_t v);
uint8_t weft_float_to_fp8e4m3(float f);
float weft_fp8e5m2_to_float(uint8_t v);
uint8_t weft_float_to_fp8e5m2(float f);

/* Stores (T)value into *out as the element type (used to build avg scalars). */
void weft_dtype_from_double(int dtype, double value, void *out);

#endif
