/*
 * Host reference for the collective conformance tests (tests/mp/test_colls.c on host buffers,
 * tests/gpu-emu/test_coll.c on device buffers): the input element every rank contributes for a
 * type and reduction op, and the reduced value a plain loop over all ranks expects. Nothing here
 * calls the library; the element conversions are those of elem.h.
 *
 * Inputs keep every intermediate result exact in the element type, so any reduction order gives
 * the same bits: small integers for sums, +-1/2 for products, and for float avg only two ranks
 * contribute to each element (a + b is commutative in IEEE arithmetic, adding zeros is exact).
 * Integer types wrap around like the element ops do.
 */
#ifndef WEFT_TESTS_COMMON_COLL_REF_H
#define WEFT_TESTS_COMMON_COLL_REF_H

#include <stddef.h>
#include <stdint.h>

#include "elem.h"
#include "nccl.h"

/* The reductions the tests run; OP_PREMUL is ncclRedOpCreatePreMulSum with premul_scalar(). */
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PREMUL, NOPS };

/* The op's name for messages; "none" for a collective that does not reduce (op < 0). */
static inline const char *op_name(int op)
{
    static const char *const names[NOPS] = {"sum", "prod", "max", "min", "avg", "premulsum"};
    return op >= 0 && op < NOPS ? names[op] : "none";
}

/* The built-in ncclRedOp_t of op; OP_PREMUL has none (the tests create it per rank). */
static inline ncclRedOp_t builtin_op(int op)
{
    switch (op) {
    case OP_PROD: return ncclProd;
    case OP_MAX: return ncclMax;
    case OP_MIN: return ncclMin;
    case OP_AVG: return ncclAvg;
    default: return ncclSum;
    }
}

static inline int is_float(int t)
{
    return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
           t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

static inline int is_unsigned(int t)
{
    return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}

/* Largest integer magnitude up to which every integer is exact in the type. */
static inline double exact_limit(int t)
{
    switch (t) {
    case ncclFloat8e4m3: return 16;
    case ncclFloat8e5m2: return 8;
    case ncclBfloat16: return 256;
    case ncclFloat16: return 2048;
    case ncclFloat32: return 16777216.0;
    default: return 9007199254740992.0;
    }
}

/*
 * Rounds v to the type, as an element op result would be: the nearest value for floating types,
 * the wrap-around for integer types (an integral v is taken modulo the type's width).
 */
static inline double round_to(int t, double v)
{
    unsigned char tmp[8] = {0};
    store(t, tmp, 0, v);
    return load(t, tmp, 0);
}

/* Input element i of rank r for this type and op among n ranks (exact in the type). */
static inline double input_value(int t, int op, int r, size_t i, int n)
{
    uint64_t h = mix(((uint64_t)r << 40) ^ (i * 0x9e37u) ^ ((uint64_t)op << 32) ^ (uint64_t)t);
    double lim = is_float(t) ? exact_limit(t) : 100.0;
    switch (op) {
    case OP_SUM:
    case OP_PREMUL: {
        double m = is_float(t) ? lim / n / (op == OP_PREMUL ? 2 : 1) : 100.0;
        if (m > 1000)
            m = 1000;
        return (double)(h % ((uint64_t)m + 1));
    }
    case OP_PROD: {
        double v = (h % 3 == 0) ? 2.0 : 1.0;
        if (is_float(t) && (h >> 8) % 5 == 0)
            v = -v;
        if (is_unsigned(t))
            v = (h % 3 == 0) ? 3.0 : 1.0;
        return v;
    }
    case OP_MAX:
    case OP_MIN: {
        double m = is_float(t) ? (lim > 64 ? 64 : lim) : 100;
        double v = (double)(h % ((uint64_t)m + 1));
        return (!is_unsigned(t) && v != 0 && (h >> 16) % 2) ? -v : v;
    }
    case OP_AVG:
        if (is_float(t)) {
            /* only ranks i%n and (i+1)%n contribute */
            if (r != (int)(i % n) && r != (int)((i + 1) % n))
                return 0;
            double m = lim > 64 ? 64 : lim;
            return (double)(h % ((uint64_t)m + 1));
        }
        return (double)(h % 200) - 100.0 * (t == ncclInt8 || t == ncclInt32 || t == ncclInt64);
    }
    return 0;
}

/* The PreMulSum scalar of rank r. */
static inline double premul_scalar(int r)
{
    return (r % 2) ? 2.0 : 1.0;
}

/* v wrapped to the integer type's width (64-bit types wrap in the int64_t/uint64_t arithmetic). */
static inline int64_t wrap_i(int t, int64_t v)
{
    switch (t) {
    case ncclInt8: return (int8_t)v;
    case ncclUint8: return (uint8_t)v;
    case ncclInt32: return (int32_t)v;
    case ncclUint32: return (uint32_t)v;
    default: return v;
    }
}

/* Expected reduced value of element i over all n ranks (compare after round_to). */
static inline double expected_reduce(int t, int op, size_t i, int n)
{
    if (!is_float(t)) {
        int64_t acc = 0;
        uint64_t uacc = 0;
        for (int r = 0; r < n; r++) {
            int64_t v = (int64_t)input_value(t, op, r, i, n);
            if (op == OP_PREMUL)
                v = wrap_i(t, v * (int64_t)premul_scalar(r));
            if (r == 0) {
                acc = v;
                uacc = (uint64_t)v;
                continue;
            }
            switch (op) {
            case OP_SUM:
            case OP_AVG:
            case OP_PREMUL: uacc += (uint64_t)v; acc = wrap_i(t, (int64_t)uacc); break;
            case OP_PROD: uacc *= (uint64_t)v; acc = wrap_i(t, (int64_t)uacc); break;
            case OP_MAX: acc = v > acc ? v : acc; break;
            case OP_MIN: acc = v < acc ? v : acc; break;
            }
        }
        if (t == ncclUint64 && (op == OP_SUM || op == OP_PROD || op == OP_PREMUL || op == OP_AVG))
            acc = (int64_t)uacc;
        if (op == OP_AVG) {
            if (t == ncclUint64)
                return (double)(uacc / (uint64_t)n);
            if (t == ncclUint8 || t == ncclUint32)
                return (double)((uint64_t)acc / (uint64_t)n);
            return (double)(acc / n);
        }
        return round_to(t, (double)acc);
    }
    if (op == OP_AVG) {
        double s = round_to(t, 1.0 / n);
        int a = (int)(i % n), b = (int)((i + 1) % n);
        double va = round_to(t, input_value(t, op, a, i, n) * s);
        if (a == b)
            return va;
        double vb = round_to(t, input_value(t, op, b, i, n) * s);
        return round_to(t, va + vb);
    }
    double acc = 0;
    for (int r = 0; r < n; r++) {
        double v = input_value(t, op, r, i, n);
        if (op == OP_PREMUL)
            v *= premul_scalar(r);
        if (r == 0) {
            acc = v;
            continue;
        }
        switch (op) {
        case OP_SUM:
        case OP_PREMUL: acc += v; break;
        case OP_PROD: acc *= v; break;
        case OP_MAX: acc = v > acc ? v : acc; break;
        case OP_MIN: acc = v < acc ? v : acc; break;
        }
    }
    return acc;
}

#endif
