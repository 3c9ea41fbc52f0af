/*
 * Test helpers shared by the multi-process test programs: a 64-bit mixer for deterministic
 * inputs, and element access for every NCCL type through doubles (the values the tests use are
 * exactly representable; conversions round like the library, via kernels/redop.h).
 */
#ifndef WEFT_TESTS_COMMON_ELEM_H
#define WEFT_TESTS_COMMON_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "redop.h"

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Stores a double that is exactly representable into the element type. */
static inline void store(int t, void *p, size_t i, double v)
{
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)(int64_t)v; break;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)(int64_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)(int64_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)(int64_t)v; break;
    case ncclFloat16: ((uint16_t *)p)[i] = weft_float_to_half((float)v); break;
    case ncclBfloat16: ((uint16_t *)p)[i] = weft_float_to_bf16((float)v); break;
    case ncclFloat8e4m3: ((uint8_t *)p)[i] = weft_float_to_fp8e4m3((float)v); break;
    case ncclFloat8e5m2: ((uint8_t *)p)[i] = weft_float_to_fp8e5m2((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    }
}

static inline double load(int t, const void *p, size_t i)
{
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat16: return weft_half_to_float(((const uint16_t *)p)[i]);
    case ncclBfloat16: return weft_bf16_to_float(((const uint16_t *)p)[i]);
    case ncclFloat8e4m3: return weft_fp8e4m3_to_float(((const uint8_t *)p)[i]);
    case ncclFloat8e5m2: return weft_fp8e5m2_to_float(((const uint8_t *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    default: return ((const double *)p)[i];
    }
}

#endif
