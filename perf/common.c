/*
 * The *_perf driver: flags, sweep, timing, validation and nccl-tests output. See common.h.
 */
#include "common.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef PERF_NO_NCCL
#include "weft.h"
#endif

#define PERF_ALIGN 64
#define PERF_MAX_TYPES 16

/* ---------------------------------------------------------------------------------------------
 * Types and formats
 * ------------------------------------------------------------------------------------------- */

/* Indexed by ncclDataType_t. exp_lo/exp_hi keep every test value (and every partial result) a
 * normal number of the format, well below its largest finite value. */
static const struct perf_type perf_types[ncclNumTypes] = {
    [ncclInt8] = {ncclInt8, "int8", 1, 0, 1, 0, 0, 0, 0},
    [ncclUint8] = {ncclUint8, "uint8", 1, 0, 0, 0, 0, 0, 0},
    [ncclInt32] = {ncclInt32, "int32", 4, 0, 1, 0, 0, 0, 0},
    [ncclUint32] = {ncclUint32, "uint32", 4, 0, 0, 0, 0, 0, 0},
    [ncclInt64] = {ncclInt64, "int64", 8, 0, 1, 0, 0, 0, 0},
    [ncclUint64] = {ncclUint64, "uint64", 8, 0, 0, 0, 0, 0, 0},
    [ncclFloat16] = {ncclFloat16, "half", 2, 1, 1, 5, 10, -6, 4},
    [ncclFloat32] = {ncclFloat32, "float", 4, 1, 1, 8, 23, -20, 20},
    [ncclFloat64] = {ncclFloat64, "double", 8, 1, 1, 11, 52, -40, 40},
    [ncclBfloat16] = {ncclBfloat16, "bfloat16", 2, 1, 1, 8, 7, -10, 10},
    [ncclFloat8e4m3] = {ncclFloat8e4m3, "f8e4m3", 1, 1, 1, 4, 3, -3, 3},
    [ncclFloat8e5m2] = {ncclFloat8e5m2, "f8e5m2", 1, 1, 1, 5, 2, -3, 3},
};

static const char *const perf_op_names[PERF_OP_COUNT] = {"sum", "prod", "max", "min", "avg",
                                                         "mulsum"};

const struct perf_type *perf_type_get(ncclDataType_t type)
{
    return (int)type >= 0 && (int)type < ncclNumTypes ? &perf_types[type] : NULL;
}

const struct perf_type *perf_type_by_name(const char *name)
{
    static const struct {
        const char *alias;
        ncclDataType_t type;
    } aliases[] = {
        {"char", ncclInt8},         {"int", ncclInt32},          {"fp16", ncclFloat16},
        {"float16", ncclFloat16},   {"fp32", ncclFloat32},       {"float32", ncclFloat32},
        {"fp64", ncclFloat64},      {"float64", ncclFloat64},    {"bf16", ncclBfloat16},
        {"fp8_e4m3", ncclFloat8e4m3}, {"fp8_e5m2", ncclFloat8e5m2}, {"e4m3", ncclFloat8e4m3},
        {"e5m2", ncclFloat8e5m2},
    };

    for (int i = 0; i < ncclNumTypes; i++)
        if (strcmp(name, perf_types[i].name) == 0)
            return &perf_types[i];
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(name, aliases[i].alias) == 0)
            return &perf_types[aliases[i].type];
    return NULL;
}

const char *perf_op_name(int op)
{
    return op >= 0 && op < PERF_OP_COUNT ? perf_op_names[op] : "none";
}

/*
 * Small binary floats (half, bfloat16, fp8). `ieee`: the top exponent means inf/NaN (half, bf16,
 * e5m2); otherwise (e4m3, OCP "fn") only S.1111.111 is NaN and there is no infinity. Rounding is to
 * nearest even; overflow gives inf (half, bf16) or the largest finite value (fp8, as NCCL's
 * satfinite conversions).
 */
static uint32_t small_float_encode(double v, int ebits, int mbits, int ieee, int satfinite)
{
    uint32_t sign = signbit(v) ? 1u : 0u;
    uint32_t emax_field = (1u << ebits) - 1;
    int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias, e;
    double a = fabs(v), r;
    uint64_t m;
    uint32_t biased, maxfinite;

    maxfinite = ieee ? ((emax_field - 1) << mbits) | ((1u << mbits) - 1)
                     : (emax_field << mbits) | ((1u << mbits) - 2);
    if (isnan(v))
        return (sign << (ebits + mbits)) | (emax_field << mbits) | ((1u << mbits) - 1);
    if (a == 0)
        return sign << (ebits + mbits);
    if (isinf(v))
        goto overflow;
    e = ilogb(a);
    if (e < emin)
        e = emin;
    r = rint(ldexp(a, mbits - e)); /* exact scaling, then round to nearest even */
    m = (uint64_t)r;
    if (m >= (2ull << mbits)) { /* rounded up to the next binade */
        m >>= 1;
        e++;
    }
    if (m >= (1ull << mbits)) {
        if (e + bias > (int)emax_field)
            goto overflow;
        biased = (uint32_t)(e + bias);
        m -= 1ull << mbits;
    } else {
        biased = 0; /* subnormal */
    }
    if (((biased << mbits) | (uint32_t)m) > maxfinite)
        goto overflow;
    return (sign << (ebits + mbits)) | (biased << mbits) | (uint32_t)m;
overflow:
    if (ieee && !satfinite)
        return (sign << (ebits + mbits)) | (emax_field << mbits);
    return (sign << (ebits + mbits)) | maxfinite;
}

static double small_float_decode(uint32_t bits, int ebits, int mbits, int ieee)
{
    uint32_t emax_field = (1u << ebits) - 1;
    int bias = (1 << (ebits - 1)) - 1;
    uint32_t m = bits & ((1u << mbits) - 1);
    uint32_t biased = (bits >> mbits) & emax_field;
    double sign = (bits >> (ebits + mbits)) & 1 ? -1.0 : 1.0;

    if (ieee && biased == emax_field)
        return m ? NAN : sign * INFINITY;
    if (!ieee && biased == emax_field && m == (1u << mbits) - 1)
        return NAN;
    if (biased == 0)
        return sign * ldexp((double)m, 1 - bias - mbits);
    return sign * ldexp((double)(m | (1u << mbits)), (int)biased - bias - mbits);
}

void perf_store_double(const struct perf_type *t, void *buf, size_t idx, double v)
{
    switch (t->type) {
    case ncclFloat32:
        ((float *)buf)[idx] = (float)v;
        break;
    case ncclFloat64:
        ((double *)buf)[idx] = v;
        break;
    case ncclFloat16:
        ((uint16_t *)buf)[idx] = (uint16_t)small_float_encode(v, 5, 10, 1, 0);
        break;
    case ncclBfloat16:
        ((uint16_t *)buf)[idx] = (uint16_t)small_float_encode(v, 8, 7, 1, 0);
        break;
    case ncclFloat8e4m3:
        ((uint8_t *)buf)[idx] = (uint8_t)small_float_encode(v, 4, 3, 0, 1);
        break;
    case ncclFloat8e5m2:
        ((uint8_t *)buf)[idx] = (uint8_t)small_float_encode(v, 5, 2, 1, 1);
        break;
    default: /* integers: two's complement truncation */
        switch (t->size) {
        case 1:
            ((uint8_t *)buf)[idx] = (uint8_t)(int64_t)v;
            break;
        case 4:
            ((uint32_t *)buf)[idx] = (uint32_t)(int64_t)v;
            break;
        default:
            ((uint64_t *)buf)[idx] = t->is_signed ? (uint64_t)(int64_t)v : (uint64_t)v;
            break;
        }
    }
}

double perf_load_double(const struct perf_type *t, const void *buf, size_t idx)
{
    switch (t->type) {
    case ncclInt8:
        return ((const int8_t *)buf)[idx];
    case ncclUint8:
        return ((const uint8_t *)buf)[idx];
    case ncclInt32:
        return ((const int32_t *)buf)[idx];
    case ncclUint32:
        return ((const uint32_t *)buf)[idx];
    case ncclInt64:
        return (double)((const int64_t *)buf)[idx];
    case ncclUint64:
        return (double)((const uint64_t *)buf)[idx];
    case ncclFloat32:
        return ((const float *)buf)[idx];
    case ncclFloat64:
        return ((const double *)buf)[idx];
    case ncclFloat16:
        return small_float_decode(((const uint16_t *)buf)[idx], 5, 10, 1);
    case ncclBfloat16:
        return small_float_decode(((const uint16_t *)buf)[idx], 8, 7, 1);
    case ncclFloat8e4m3:
        return small_float_decode(((const uint8_t *)buf)[idx], 4, 3, 0);
    case ncclFloat8e5m2:
        return small_float_decode(((const uint8_t *)buf)[idx], 5, 2, 1);
    default:
        return NAN;
    }
}

static void store_int(const struct perf_type *t, void *buf, size_t idx, uint64_t v)
{
    switch (t->size) {
    case 1:
        ((uint8_t *)buf)[idx] = (uint8_t)v;
        break;
    case 4:
        ((uint32_t *)buf)[idx] = (uint32_t)v;
        break;
    default:
        ((uint64_t *)buf)[idx] = v;
        break;
    }
}

/* An integer of type t from raw bits: sign- or zero-extended to 64 bits. */
static uint64_t int_extend(const struct perf_type *t, uint64_t v)
{
    switch (t->size) {
    case 1:
        return t->is_signed ? (uint64_t)(int64_t)(int8_t)v : (uint64_t)(uint8_t)v;
    case 4:
        return t->is_signed ? (uint64_t)(int64_t)(int32_t)v : (uint64_t)(uint32_t)v;
    default:
        return v;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Test values
 *
 * Exactness argument, per op (n ranks, p = significand bits of a float type incl. the implicit one,
 * so every integer of magnitude <= 2^p is exact):
 *   sum, mulsum, int avg: values s (ints) or s * 2^e(i) (floats, e shared by all ranks at index i)
 *     with |s| <= k; at most `active` ranks contribute s != 0 at an index, and active * k * scalar
 *     <= 2^p (floats) or the type's max (ints), so every partial sum in any order is exact (floats)
 *     or never overflows (ints). int avg = exact sum / n, truncated (NCCL's integer avg).
 *   prod: +-1, or +-2 on at most `active` ranks: every partial product is a power of two in range.
 *   max, min: any exact values (ints: raw bits); the result is one of the inputs.
 *   float avg: NCCL computes sum_r x_r * c with c = (T)(1/n) (fp16/bf16/fp8 via float). Exactly two
 *     ranks (one when n == 1) contribute x = +-1 or +-2 times 2^e, e >= 0, the others 0. Each
 *     product x * c is c shifted (exact); adding zeros is exact; so every order rounds the same
 *     one sum x1*c + x2*c once. The reference forms that sum exactly in double and rounds it once.
 * ------------------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

#define PERF_GOLDEN 0x9e3779b97f4a7c15ull

/* Key of one rank's stream for one seed; rank -1 is the stream shared by all ranks. */
static inline uint64_t stream_key(uint64_t seed, int rank)
{
    return mix64(seed * 0xd1b54a32d192ed03ull + (uint64_t)(int64_t)(rank + 1));
}

static inline uint64_t elem_hash(uint64_t key, size_t i)
{
    return mix64(key + (uint64_t)i * PERF_GOLDEN);
}

/* Uniform in [0, m) from the top 32 bits of h (m < 2^32). */
static inline uint64_t pick(uint64_t h, uint64_t m)
{
    return ((h >> 32) * m) >> 32;
}

static int64_t float_type_max_int(const struct perf_type *t)
{
    return (int64_t)1 << (t->mant_bits + 1);
}

static void make_gen(struct perf_gen *g, const struct perf_type *t, int op, int nranks)
{
    int64_t budget; /* largest |partial result| allowed, in units of one value step */
    int64_t n = nranks;

    memset(g, 0, sizeof(*g));
    g->modulus = 1;
    g->k = 1;
    if (t->is_float) {
        g->e_lo = t->exp_lo;
        g->e_span = t->exp_hi - t->exp_lo + 1;
    }
    switch (op) {
    case PERF_OP_SUM:
    case PERF_OP_MULSUM:
    case PERF_OP_AVG:
        if (op == PERF_OP_AVG && t->is_float) {
            g->e_lo = 0; /* x * c stays normal and exact */
            g->e_span = t->exp_hi + 1;
            g->k = 2;
            break;
        }
        if (t->is_float)
            budget = float_type_max_int(t);
        else if (t->size == 8)
            budget = INT64_MAX; /* uint64 too: the reference sums in 64 bits */
        else
            budget = t->is_signed ? (int64_t)((1ull << (8 * t->size - 1)) - 1)
                                  : (int64_t)((1ull << (8 * t->size)) - 1);
        if (op == PERF_OP_MULSUM)
            budget /= 2;
        if (budget / n >= 1) {
            g->k = budget / n < 100 ? budget / n : 100;
        } else {
            g->k = 1;
            g->modulus = (uint32_t)((n + budget - 1) / budget);
        }
        break;
    case PERF_OP_PROD: {
        int64_t doublings;
        if (t->is_float)
            doublings = t->type == ncclFloat8e4m3 ? 8 : (t->exp_bits == 5 ? 15 : 100);
        else
            doublings = 8 * (int64_t)t->size - (t->is_signed ? 2 : 1);
        if (n > doublings)
            g->modulus = (uint32_t)((n + doublings - 1) / doublings);
        break;
    }
    default: /* max, min, none */
        if (t->is_float) {
            int64_t lim = float_type_max_int(t) - 1;
            g->k = lim < 1000 ? lim : 1000;
        } else {
            g->raw = 1;
        }
        break;
    }
}

static inline int gen_active(const struct perf_gen *g, int rank, size_t i)
{
    return g->modulus == 1 || ((size_t)rank + i) % g->modulus == 0;
}

/* The two contributors of a float avg at index i (shared hash he). */
static inline void avg_pair(int nranks, size_t i, uint64_t he, int *a1, int *a2)
{
    *a1 = (int)(i % (size_t)nranks);
    if (nranks == 1) {
        *a2 = -1;
        return;
    }
    *a2 = (int)((*a1 + 1 + (int)(((he & 0xffffffffull) * (uint64_t)(nranks - 1)) >> 32)) %
                nranks);
}

/* Integer-valued part s of a value (floats: times 2^e); h is the rank's hash at i. */
static inline int64_t gen_s(const struct perf_gen *g, const struct perf_type *t, int op, int rank,
                            size_t i, uint64_t h)
{
    switch (op) {
    case PERF_OP_SUM:
    case PERF_OP_MULSUM:
    case PERF_OP_AVG:
        if (!gen_active(g, rank, i))
            return 0;
        if (t->is_signed)
            return (int64_t)pick(h, 2 * (uint64_t)g->k + 1) - g->k;
        return (int64_t)pick(h, (uint64_t)g->k + 1);
    case PERF_OP_PROD: {
        int64_t mag = gen_active(g, rank, i) ? 2 : 1;
        return t->is_signed && (h & 1) ? -mag : mag;
    }
    default:
        if (g->raw)
            return (int64_t)h;
        return (int64_t)pick(h, 2 * (uint64_t)g->k + 1) - g->k;
    }
}

static inline int64_t mulsum_scalar(int rank)
{
    return rank % 2 ? 2 : 1;
}

/* (T)(1/n) for float avg, via float as NCCL does, as a double. */
static double avg_scalar(const struct perf_type *t, int nranks)
{
    unsigned char tmp[8];

    if (t->type == ncclFloat64)
        return 1.0 / nranks;
    perf_store_double(t, tmp, 0, (double)(float)(1.0 / nranks));
    return perf_load_double(t, tmp, 0);
}

void perf_fill(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed, int rank,
               size_t first, size_t n, void *buf)
{
    const struct perf_type *t = op->type;
    const struct perf_gen *g = &op->gen;
    uint64_t key = stream_key(seed, rank), keye = stream_key(seed, -1);
    double pow2[128];

    if (!t->is_float) {
        for (size_t k = 0; k < n; k++) {
            size_t i = first + k;
            store_int(t, buf, k, (uint64_t)gen_s(g, t, op->op, rank, i, elem_hash(key, i)));
        }
        return;
    }
    for (int e = 0; e < g->e_span && e < 128; e++)
        pow2[e] = ldexp(1.0, g->e_lo + e);
    for (size_t k = 0; k < n; k++) {
        size_t i = first + k;
        uint64_t h = elem_hash(key, i);
        double v;

        if (op->op == PERF_OP_PROD) {
            v = (double)gen_s(g, t, op->op, rank, i, h);
        } else {
            uint64_t he = elem_hash(keye, i);
            int64_t s;
            if (op->op == PERF_OP_AVG) {
                int a1, a2;
                avg_pair(ctx->nranks, i, he, &a1, &a2);
                s = 0;
                if (rank == a1 || rank == a2) {
                    s = (h & 2) ? 2 : 1;
                    if (h & 1)
                        s = -s;
                }
            } else {
                s = gen_s(g, t, op->op, rank, i, h);
            }
            v = (double)s * pow2[pick(he, (uint64_t)g->e_span)];
        }
        perf_store_double(t, buf, k, v);
    }
}

static void fill_reduced_int(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                             size_t first, size_t n, void *buf)
{
    const struct perf_type *t = op->type;
    const struct perf_gen *g = &op->gen;
    int nr = ctx->nranks;
    uint64_t *keys = malloc((size_t)nr * sizeof(*keys));

    if (keys == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < nr; r++)
        keys[r] = stream_key(seed, r);
    for (size_t k = 0; k < n; k++) {
        size_t i = first + k;
        uint64_t acc = 0;

        switch (op->op) {
        case PERF_OP_SUM:
        case PERF_OP_AVG:
        case PERF_OP_MULSUM:
            for (int r = 0; r < nr; r++) {
                uint64_t v = (uint64_t)gen_s(g, t, op->op, r, i, elem_hash(keys[r], i));
                acc += op->op == PERF_OP_MULSUM ? v * (uint64_t)mulsum_scalar(r) : v;
            }
            if (op->op == PERF_OP_AVG)
                acc = t->is_signed ? (uint64_t)((int64_t)acc / nr) : acc / (uint64_t)nr;
            break;
        case PERF_OP_PROD:
            acc = 1;
            for (int r = 0; r < nr; r++)
                acc *= (uint64_t)gen_s(g, t, op->op, r, i, elem_hash(keys[r], i));
            break;
        case PERF_OP_MAX:
        case PERF_OP_MIN:
            for (int r = 0; r < nr; r++) {
                uint64_t v = int_extend(t, (uint64_t)gen_s(g, t, op->op, r, i,
                                                           elem_hash(keys[r], i)));
                int better;
                if (r == 0) {
                    acc = v;
                    continue;
                }
                if (t->is_signed)
                    better = op->op == PERF_OP_MAX ? (int64_t)v > (int64_t)acc
                                                   : (int64_t)v < (int64_t)acc;
                else
                    better = op->op == PERF_OP_MAX ? v > acc : v < acc;
                if (better)
                    acc = v;
            }
            break;
        default: /* none: rank 0's value (not used by collectives) */
            acc = (uint64_t)gen_s(g, t, op->op, 0, i, elem_hash(keys[0], i));
            break;
        }
        store_int(t, buf, k, acc);
    }
    free(keys);
}

static void fill_reduced_float(const struct perf_ctx *ctx, const struct perf_op *op,
                               uint64_t seed, size_t first, size_t n, void *buf)
{
    const struct perf_type *t = op->type;
    const struct perf_gen *g = &op->gen;
    int nr = ctx->nranks;
    uint64_t keye = stream_key(seed, -1);
    uint64_t *keys = malloc((size_t)nr * sizeof(*keys));
    double c = op->op == PERF_OP_AVG ? avg_scalar(t, nr) : 0;

    if (keys == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < nr; r++)
        keys[r] = stream_key(seed, r);
    for (size_t k = 0; k < n; k++) {
        size_t i = first + k;
        uint64_t he = elem_hash(keye, i);
        double scale = ldexp(1.0, g->e_lo + (int)pick(he, (uint64_t)g->e_span));
        double v = 0;
        int64_t acc = 0;

        switch (op->op) {
        case PERF_OP_SUM:
        case PERF_OP_MULSUM:
            for (int r = 0; r < nr; r++) {
                int64_t s = gen_s(g, t, op->op, r, i, elem_hash(keys[r], i));
                acc += op->op == PERF_OP_MULSUM ? s * mulsum_scalar(r) : s;
            }
            v = (double)acc * scale; /* exact: |acc| <= 2^p */
            break;
        case PERF_OP_AVG: {
            int a[2];
            avg_pair(nr, i, he, &a[0], &a[1]);
            for (int j = 0; j < 2; j++) {
                uint64_t h;
                double s;
                if (a[j] < 0)
                    continue;
                h = elem_hash(keys[a[j]], i);
                s = (h & 2) ? 2 : 1;
                if (h & 1)
                    s = -s;
                v += s * scale * c; /* both products exact; the sum rounds once, as T's would */
            }
            break;
        }
        case PERF_OP_PROD:
            v = 1;
            for (int r = 0; r < nr; r++)
                v *= (double)gen_s(g, t, op->op, r, i, elem_hash(keys[r], i));
            break;
        case PERF_OP_MAX:
        case PERF_OP_MIN:
            for (int r = 0; r < nr; r++) {
                int64_t s = gen_s(g, t, op->op, r, i, elem_hash(keys[r], i));
                if (r == 0 || (op->op == PERF_OP_MAX ? s > acc : s < acc))
                    acc = s;
            }
            v = (double)acc * scale;
            break;
        default:
            v = (double)gen_s(g, t, op->op, 0, i, elem_hash(keys[0], i)) * scale;
            break;
        }
        perf_store_double(t, buf, k, v);
    }
    free(keys);
}

void perf_fill_reduced(const struct perf_ctx *ctx, const struct perf_op *op, uint64_t seed,
                       size_t first, size_t n, void *buf)
{
    if (op->type->is_float)
        fill_reduced_float(ctx, op, seed, first, n, buf);
    else
        fill_reduced_int(ctx, op, seed, first, n, buf);
}

/* ---------------------------------------------------------------------------------------------
 * Driver state and helpers
 * ------------------------------------------------------------------------------------------- */

struct perf_args {
    size_t min_bytes, max_bytes, step_bytes;
    long step_factor;
    int iters, warmup, agg, cycles, check, root, blocking, average, unalign, timeout_s;
    int report_cputime, parallel_init, stream_null;
    const char *json_path;
    int ntypes;
    const struct perf_type *types[PERF_MAX_TYPES];
    int nops;
    int ops[PERF_OP_COUNT];
};

struct perf_state {
    const struct perf_coll *coll;
    perf_run_fn run;
    const char *prog; /* program name, for the header, footer and messages */
    const struct perf_backend *be;
    struct perf_args a;
    struct perf_ctx ctx;
    int is_main;
    char host[256];
    char *send_base, *recv_base, *expect; /* 64-byte aligned */
    void *send_alloc, *recv_alloc, *expect_alloc;
    size_t buf_bytes;    /* usable bytes of send/recv (rotation space) */
    size_t expect_bytes;
    uint64_t row_seed;   /* advances per table row, identically on every rank */
    /* expected-values cache */
    int exp_valid;
    uint64_t exp_seed;
    const struct perf_type *exp_type;
    int exp_op, exp_root;
    size_t exp_count, exp_n;
    /* results */
    double bw_sum;
    long bw_count;
    long local_errors; /* measurements where this rank saw a wrong element */
    FILE *json;
    int verbose;
};

/* -T watchdog */
static _Atomic double watchdog_armed_at; /* 0: disarmed */
static int watchdog_timeout_s;
static const struct perf_backend *watchdog_be;
static const struct perf_ctx *watchdog_ctx;
static char watchdog_host[256];

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* nccl-tests' failure line, then exit: the other ranks are stopped by weftrun (or mpirun). */
static void perf_fail(const struct perf_state *st, const char *file, int line, ncclResult_t res)
{
    const char *base = strrchr(file, '/');
    const char *last = st->be->last_error();

    printf("%s: Test %s failure %s:%d '%s / %s'\n", st->host, st->be->name,
           base ? base + 1 : file, line, st->be->error_string(res), last ? last : "");
    fflush(stdout);
    exit(1);
}

#define PERF_CHECK(st, call)                                                                       \
    do {                                                                                           \
        ncclResult_t perf_res_ = (call);                                                           \
        if (perf_res_ != ncclSuccess && perf_res_ != ncclInProgress)                               \
            perf_fail((st), __FILE__, __LINE__, perf_res_);                                        \
    } while (0)

static void *watchdog_main(void *arg)
{
    (void)arg;
    for (;;) {
        double armed = atomic_load(&watchdog_armed_at);
        struct timespec ts = {0, 50 * 1000 * 1000};

        if (armed != 0 && now_s() - armed > watchdog_timeout_s) {
            printf("%s: Test timeout (%ds) %s:%d\n", watchdog_host, watchdog_timeout_s, "common.c",
                   __LINE__);
            fflush(stdout);
            watchdog_be->abort(watchdog_ctx);
            /* The blocked call should now fail and the main thread exit; make sure of it. */
            ts.tv_sec = 5;
            ts.tv_nsec = 0;
            nanosleep(&ts, NULL);
            fprintf(stderr, "%s: still blocked 5 s after the abort; exiting\n", watchdog_host);
            _exit(1);
        }
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void watchdog_arm(const struct perf_state *st)
{
    if (st->a.timeout_s > 0)
        atomic_store(&watchdog_armed_at, now_s());
}

static void watchdog_disarm(const struct perf_state *st)
{
    if (st->a.timeout_s > 0)
        atomic_store(&watchdog_armed_at, 0.0);
}

/* nccl-tests' number layout: 2, 1 or 0 decimals by the number of integer digits, else exponent. */
static void format_num(double v, int width, char *out, size_t n)
{
    int digits = 0;

    if (!isfinite(v) || v < 0) {
        snprintf(out, n, "%*.2f", width, v);
        return;
    }
    for (double p = 1; v >= p && digits < 40; p *= 10)
        digits++;
    if (digits < width - 2)
        snprintf(out, n, "%*.2f", width, v);
    else if (digits < width - 1)
        snprintf(out, n, "%*.1f", width, v);
    else if (digits < width + 1)
        snprintf(out, n, "%*.0f", width, v);
    else if (width >= 7)
        snprintf(out, n, "%*.1e", width, v);
    else
        snprintf(out, n, "%*.0e", width, v);
}

static void barrier(struct perf_state *st)
{
    PERF_CHECK(st, st->be->barrier(&st->ctx));
}

/* Combines this rank's seconds per op over the communicator as -a says. */
static double combine_time(struct perf_state *st, double sec)
{
    double v = sec;
    int op = PERF_OP_SUM;

    switch (st->a.average) {
    case 0:
        v = st->ctx.rank == 0 ? sec : 0;
        break;
    case 2:
        op = PERF_OP_MIN;
        break;
    case 3:
        op = PERF_OP_MAX;
        break;
    default:
        break;
    }
    PERF_CHECK(st, st->be->reduce_double(&st->ctx, &v, op));
    return st->a.average == 1 ? v / st->ctx.nranks : v;
}

static int64_t sum_int64(struct perf_state *st, int64_t v)
{
    PERF_CHECK(st, st->be->sum_int64(&st->ctx, &v));
    return v;
}

static void *aligned_buffer(size_t bytes, void **alloc_p)
{
    void *p = NULL;

    if (posix_memalign(&p, PERF_ALIGN, bytes ? bytes : PERF_ALIGN) != 0) {
        fprintf(stderr, "perf: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes); /* fault the pages in before anything is timed */
    *alloc_p = p;
    return p;
}

static size_t next_size(const struct perf_args *a, size_t size)
{
    if (a->step_factor > 1) {
        if (size == 0)
            return 1;
        if (size > SIZE_MAX / (size_t)a->step_factor)
            return SIZE_MAX;
        return size * (size_t)a->step_factor;
    }
    if (size > SIZE_MAX - a->step_bytes)
        return SIZE_MAX;
    return size + a->step_bytes;
}

/* Pointers of one call. iter selects the rotation slot inside the buffers, as nccl-tests does. */
static void call_buffers(const struct perf_state *st, const struct perf_op *op, size_t iter,
                         char **send_p, char **recv_p)
{
    size_t ts = op->type->size;
    size_t total = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;
    size_t steps = total ? st->buf_bytes / total : 1;
    size_t shift = total * (iter % (steps ? steps : 1)) + (size_t)st->a.unalign * ts;
    size_t r = (size_t)st->ctx.rank;

    if (op->in_place) {
        *send_p = st->recv_base + shift + r * op->c.send_inplace_offset * ts;
        *recv_p = st->recv_base + shift + r * op->c.recv_inplace_offset * ts;
    } else {
        *send_p = st->send_base + shift;
        *recv_p = st->recv_base + shift;
    }
}

static void run_op(struct perf_state *st, const struct perf_op *op, size_t iter)
{
    char *send, *recv;

    call_buffers(st, op, iter, &send, &recv);
    PERF_CHECK(st, st->run(&st->ctx, op, send, recv));
}

static int64_t count_wrong(struct perf_state *st, const struct perf_op *op, const char *got,
                           const char *want, size_t n)
{
    size_t ts = op->type->size;
    int64_t wrong = 0;
    int shown = 0;

    if (memcmp(got, want, n * ts) == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(got + i * ts, want + i * ts, ts) == 0)
            continue;
        wrong++;
        if (st->verbose && shown < 4) {
            uint64_t gb = 0, wb = 0;
            memcpy(&gb, got + i * ts, ts);
            memcpy(&wb, want + i * ts, ts);
            fprintf(stderr,
                    "[rank %d] %s %s %s count %zu%s: element %zu is 0x%0*" PRIx64
                    " (%.17g), expected 0x%0*" PRIx64 " (%.17g)\n",
                    st->ctx.rank, st->prog, op->type->name, perf_op_name(op->op), op->c.count,
                    op->in_place ? " in-place" : "", i, (int)(2 * ts), gb,
                    perf_load_double(op->type, got, i), (int)(2 * ts), wb,
                    perf_load_double(op->type, want, i));
            shown++;
        }
    }
    return wrong;
}

/* One validation round; returns wrong elements summed over ranks. */
static int64_t check_once(struct perf_state *st, const struct perf_op *op, uint64_t seed)
{
    size_t ts = op->type->size;
    size_t total = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;
    char *send, *recv;
    size_t nexp;
    int64_t wrong = 0;

    /* Poison what the op must overwrite, then lay the input (in place it lies inside recv). */
    memset(st->recv_base + (size_t)st->a.unalign * ts, 0xa5,
           op->in_place ? total : op->c.recv_count * ts);
    call_buffers(st, op, 0, &send, &recv);
    st->coll->init_data(&st->ctx, op, seed, send);
    watchdog_arm(st);
    PERF_CHECK(st, st->run(&st->ctx, op, send, recv));
    watchdog_disarm(st);

    if (!(st->exp_valid && st->exp_seed == seed && st->exp_type == op->type &&
          st->exp_op == op->op && st->exp_root == op->root && st->exp_count == op->c.count)) {
        st->exp_n = st->coll->expected(&st->ctx, op, seed, st->expect);
        st->exp_valid = 1;
        st->exp_seed = seed;
        st->exp_type = op->type;
        st->exp_op = op->op;
        st->exp_root = op->root;
        st->exp_count = op->c.count;
    }
    nexp = st->exp_n;
    if (nexp > 0)
        wrong = count_wrong(st, op, recv, st->expect, nexp);
    if (wrong)
        st->local_errors++;
    return sum_int64(st, wrong);
}

struct perf_result {
    double time_us, algbw, busbw;
    int64_t wrong; /* -1: not checked */
};

static void bench(struct perf_state *st, struct perf_op *op, uint64_t seed,
                  struct perf_result *res)
{
    const struct perf_args *a = &st->a;
    char *send, *recv;
    double t0, excluded = 0, sec;

    /* Sane data for timing (no NaN/denormal slow paths), one synchronising op, barrier. */
    if (a->check) {
        call_buffers(st, op, 0, &send, &recv);
        st->coll->init_data(&st->ctx, op, seed ^ 0x99, send);
    }
    watchdog_arm(st);
    run_op(st, op, 0);
    barrier(st);

    t0 = now_s();
    for (int it = 0; it < a->iters; it++) {
        if (a->agg > 1)
            PERF_CHECK(st, st->be->group_start());
        for (int k = 0; k < a->agg; k++)
            run_op(st, op, (size_t)it * (size_t)a->agg + (size_t)k);
        if (a->agg > 1)
            PERF_CHECK(st, st->be->group_end());
        if (a->blocking == 1) {
            barrier(st);
        } else if (a->blocking == 3) {
            double b0 = now_s();
            barrier(st);
            excluded += now_s() - b0;
        }
    }
    sec = (now_s() - t0 - excluded) / ((double)a->iters * a->agg);
    watchdog_disarm(st);
    sec = combine_time(st, sec);

    res->time_us = sec * 1e6;
    res->algbw = sec > 0 ? op->c.alg_bytes / 1e9 / sec : 0;
    res->busbw = res->algbw * st->coll->bus_factor(st->ctx.nranks);
    res->wrong = -1;
    if (a->check && !(op->in_place && (st->coll->flags & PERF_COLL_INPLACE_UNCHECKED))) {
        res->wrong = 0;
        for (int c = 0; c < a->check; c++) {
            res->wrong = check_once(st, op, seed + (uint64_t)c);
            if (res->wrong)
                break;
        }
    }
    st->bw_sum += res->busbw;
    st->bw_count++;
}

static void json_number(FILE *f, const char *key, double v, const char *fmt)
{
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f);
}

static void json_line(struct perf_state *st, const struct perf_op *op, const struct perf_result *r)
{
    FILE *f = st->json;
    size_t ts = op->type->size;
    size_t bytes = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;

    /* The fields and their order are documented in common.h: keep them stable. */
    fprintf(f, "{\"library\":\"%s\",\"collective\":\"%s\",\"nranks\":%d,\"bytes\":%zu,"
               "\"count\":%zu",
            st->ctx.library, st->coll->name, st->ctx.nranks, bytes, op->c.count);
    fprintf(f, ",\"type\":\"%s\",\"op\":\"%s\",\"root\":%d,\"inplace\":%s", op->type->name,
            perf_op_name(op->op), op->root, op->in_place ? "true" : "false");
    json_number(f, "time_us", r->time_us, "%.3f");
    json_number(f, "algbw", r->algbw, "%.6f");
    json_number(f, "busbw", r->busbw, "%.6f");
    if (r->wrong >= 0)
        fprintf(f, ",\"wrong\":%" PRId64 "}\n", r->wrong);
    else
        fputs(",\"wrong\":null}\n", f);
    fflush(f);
}

static void append_body(char *line, size_t n, const struct perf_result *r)
{
    char t[32], ab[32], bb[32];
    size_t len = strlen(line);

    format_num(r->time_us, 7, t, sizeof(t));
    format_num(r->algbw, 6, ab, sizeof(ab));
    format_num(r->busbw, 6, bb, sizeof(bb));
    if (r->wrong >= 0)
        snprintf(line + len, n - len, "  %7s  %6s  %6s  %6g", t, ab, bb, (double)r->wrong);
    else
        snprintf(line + len, n - len, "  %7s  %6s  %6s  %6s", t, ab, bb, "N/A");
}

/* Warm-up, then -N cycles of the size sweep, for one (type, op, root). */
static void time_test(struct perf_state *st, const struct perf_type *t, int op_kind, int root)
{
    const struct perf_args *a = &st->a;
    struct perf_op op;
    long repeat = a->cycles;

    memset(&op, 0, sizeof(op));
    op.type = t;
    op.op = op_kind;
    op.root = root;
    make_gen(&op.gen, t, op_kind, st->ctx.nranks);
    PERF_CHECK(st, st->be->op_create(&st->ctx, &op));

    barrier(st);
    for (size_t size = a->min_bytes; size <= a->max_bytes;
         size = size ? (size > SIZE_MAX / 2 ? SIZE_MAX : size * 2) : 1) {
        st->coll->get_counts(size, t->size, st->ctx.nranks, &op.c);
        op.in_place = 0;
        watchdog_arm(st);
        for (int it = 0; it < a->warmup; it++)
            run_op(st, &op, (size_t)it);
        watchdog_disarm(st);
        if (size == SIZE_MAX)
            break;
    }

    do {
        for (size_t size = a->min_bytes; size <= a->max_bytes; size = next_size(a, size)) {
            struct perf_counts c;
            struct perf_result res[2];
            char line[512];
            uint64_t seed = ++st->row_seed * 1024;

            st->coll->get_counts(size, t->size, st->ctx.nranks, &c);
            snprintf(line, sizeof(line), "%12li  %12li  %8s  %6s  %6i",
                     (long)((c.send_count > c.recv_count ? c.send_count : c.recv_count) * t->size),
                     (long)c.count, t->name, perf_op_name(op_kind), root);
            for (int ip = 0; ip < 2; ip++) {
                op.c = c;
                op.in_place = ip;
                bench(st, &op, seed, &res[ip]);
                append_body(line, sizeof(line), &res[ip]);
                if (st->json)
                    json_line(st, &op, &res[ip]);
            }
            if (st->is_main)
                printf("%s\n", line);
            if (size == SIZE_MAX)
                break;
        }
    } while (--repeat != 0);

    PERF_CHECK(st, st->be->op_destroy(&st->ctx, &op));
}

/* ---------------------------------------------------------------------------------------------
 * Arguments
 * ------------------------------------------------------------------------------------------- */

static void usage(const char *prog)
{
    printf("USAGE: %s \n\t"
           "[-t,--nthreads <num threads>] (must be 1)\n\t"
           "[-g,--ngpus <gpus per thread>] (must be 1)\n\t"
           "[-b,--minbytes <min size in bytes>] \n\t"
           "[-e,--maxbytes <max size in bytes>] \n\t"
           "[-i,--stepbytes <increment size>] \n\t"
           "[-f,--stepfactor <increment factor>] \n\t"
           "[-n,--iters <iteration count>] \n\t"
           "[-m,--agg_iters <aggregated iteration count>] \n\t"
           "[-w,--warmup_iters <warmup iteration count>] \n\t"
           "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
           "[-p,--parallel_init <0/1>] (no effect)\n\t"
           "[-c,--check <check iteration count>] \n\t"
           "[-o,--op <sum/prod/min/max/avg/mulsum/all>] \n\t"
           "[-d,--datatype <nccltype/all>] \n\t"
           "[-r,--root <root>] \n\t"
           "[-z,--blocking <0/1/2/3>] \n\t"
           "[-y,--stream_null <0/1>] (no effect: host calls use the NULL stream)\n\t"
           "[-T,--timeout <time in seconds>] \n\t"
           "[-C,--report_cputime <0/1>] \n\t"
           "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
           "[-J,--output_file <file> JSON lines, one per measurement] \n\t"
           "[-u,--unalign <num elements>] \n\t"
           "[-h,--help]\n"
           "Run under weftrun: weftrun -n <ranks> %s ...\n"
           "Not on host memory: -G (CUDA graphs), -R (registration), -D (device API).\n",
           prog, prog);
}

static int parse_size(const char *text, size_t *out)
{
    char *end;
    double v;
    double unit = 1;

    errno = 0;
    v = strtod(text, &end);
    if (end == text || errno != 0 || v < 0)
        return -1;
    while (*end == ' ')
        end++;
    switch (*end) {
    case 'G':
    case 'g':
        unit = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 'M':
    case 'm':
        unit = 1024.0 * 1024;
        end++;
        break;
    case 'K':
    case 'k':
        unit = 1024.0;
        end++;
        break;
    case '\0':
        break;
    default:
        return -1;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v * unit > 9.0e18)
        return -1;
    *out = (size_t)(v * unit);
    return 0;
}

static int parse_long(const char *text, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 0);
    if (end == text || *end != '\0' || errno != 0)
        return -1;
    *out = v;
    return 0;
}

#define PERF_ARG_ERROR(...)                                                                        \
    do {                                                                                           \
        if (is_main) {                                                                             \
            fprintf(stderr, "%s: ", prog);                                                         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
        return 2;                                                                                  \
    } while (0)

/* Returns 0 to run, 2 for a usage error (printed on the main rank), -1 after --help. */
static int parse_args(struct perf_args *a, int argc, char **argv, const char *prog, int is_main,
                      const struct perf_backend *be)
{
    static const struct option longopts[] = {
        {"nthreads", required_argument, 0, 't'},
        {"ngpus", required_argument, 0, 'g'},
        {"minbytes", required_argument, 0, 'b'},
        {"maxbytes", required_argument, 0, 'e'},
        {"stepbytes", required_argument, 0, 'i'},
        {"stepfactor", required_argument, 0, 'f'},
        {"iters", required_argument, 0, 'n'},
        {"agg_iters", required_argument, 0, 'm'},
        {"warmup_iters", required_argument, 0, 'w'},
        {"run_cycles", required_argument, 0, 'N'},
        {"parallel_init", required_argument, 0, 'p'},
        {"check", required_argument, 0, 'c'},
        {"op", required_argument, 0, 'o'},
        {"datatype", required_argument, 0, 'd'},
        {"root", required_argument, 0, 'r'},
        {"blocking", required_argument, 0, 'z'},
        {"stream_null", required_argument, 0, 'y'},
        {"timeout", required_argument, 0, 'T'},
        {"cudagraph", required_argument, 0, 'G'},
        {"report_cputime", required_argument, 0, 'C'},
        {"average", required_argument, 0, 'a'},
        {"local_register", required_argument, 0, 'R'},
        {"cta_policy", required_argument, 0, 'x'},
        {"device_implementation", required_argument, 0, 'D'},
        {"output_file", required_argument, 0, 'J'},
        {"unalign", required_argument, 0, 'u'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *type_arg = "float", *op_arg = "sum";
    long v;
    int c;

    memset(a, 0, sizeof(*a));
    a->min_bytes = a->max_bytes = 32u << 20;
    a->step_bytes = 1u << 20;
    a->step_factor = 1;
    a->iters = 20;
    a->warmup = 1;
    a->agg = 1;
    a->cycles = 1;
    a->check = 1;
    a->average = 1;

    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:R:x:D:J:u:h",
                            longopts, NULL)) != -1) {
        if (c == 'h') {
            if (is_main)
                usage(prog);
            return -1;
        }
        if (c == '?' || c == ':') {
            if (optopt)
                PERF_ARG_ERROR("invalid or incomplete option '-%c' (see -h)", optopt);
            PERF_ARG_ERROR("invalid option '%s' (see -h)", argv[optind - 1]);
        }
        switch (c) {
        case 'b':
            if (parse_size(optarg, &a->min_bytes))
                PERF_ARG_ERROR("invalid size specified for 'minbytes': '%s'", optarg);
            continue;
        case 'e':
            if (parse_size(optarg, &a->max_bytes))
                PERF_ARG_ERROR("invalid size specified for 'maxbytes': '%s'", optarg);
            continue;
        case 'i':
            if (parse_size(optarg, &a->step_bytes))
                PERF_ARG_ERROR("invalid size specified for 'stepbytes': '%s'", optarg);
            continue;
        case 'o':
            op_arg = optarg;
            continue;
        case 'd':
            type_arg = optarg;
            continue;
        case 'J':
            a->json_path = optarg;
            continue;
        default:
            break;
        }
        if (parse_long(optarg, &v) || v < INT32_MIN || v > INT32_MAX)
            PERF_ARG_ERROR("option -%c needs an integer, got '%s'", c, optarg);
        switch (c) {
        case 't':
        case 'g':
            if (v != 1)
                PERF_ARG_ERROR("-%c %ld: Weft runs one rank per process on host memory (threads "
                               "and GPUs per process must be 1); start ranks with weftrun -n N",
                               c, v);
            break;
        case 'f':
            if (v < 1)
                PERF_ARG_ERROR("-f must be >= 1, got %ld", v);
            a->step_factor = v;
            break;
        case 'n':
            if (v < 1)
                PERF_ARG_ERROR("-n must be >= 1, got %ld", v);
            a->iters = (int)v;
            break;
        case 'm':
            if (v < 1)
                PERF_ARG_ERROR("-m must be >= 1, got %ld", v);
            a->agg = (int)v;
            break;
        case 'w':
            if (v < 0)
                PERF_ARG_ERROR("-w must be >= 0, got %ld", v);
            a->warmup = (int)v;
            break;
        case 'N':
            if (v < 0)
                PERF_ARG_ERROR("-N must be >= 0, got %ld", v);
            a->cycles = (int)v;
            break;
        case 'p':
            a->parallel_init = (int)v;
            break;
        case 'c':
            if (v < 0)
                PERF_ARG_ERROR("-c must be >= 0, got %ld", v);
            a->check = (int)v;
            break;
        case 'r':
            if (v < -1)
                PERF_ARG_ERROR("-r must be a rank or -1 (all roots), got %ld", v);
            a->root = (int)v;
            break;
        case 'z':
            if (v < 0 || v > 3)
                PERF_ARG_ERROR("-z must be 0, 1, 2 or 3, got %ld", v);
            a->blocking = (int)v;
            break;
        case 'y':
            a->stream_null = (int)v;
            break;
        case 'T':
            if (v < 0)
                PERF_ARG_ERROR("-T must be >= 0, got %ld", v);
            a->timeout_s = (int)v;
            break;
        case 'C':
            a->report_cputime = v != 0;
            break;
        case 'a':
            if (v < 0 || v > 3)
                PERF_ARG_ERROR("-a must be 0 (rank 0), 1 (avg), 2 (min) or 3 (max), got %ld", v);
            a->average = (int)v;
            break;
        case 'u':
            if (v < 0 || v > 4096)
                PERF_ARG_ERROR("-u must be in [0, 4096] elements, got %ld", v);
            a->unalign = (int)v;
            break;
        case 'x':
            break; /* CTA policy: no meaning on host memory */
        case 'G':
            if (v != 0)
                PERF_ARG_ERROR("-G %ld: CUDA graphs are not supported on host memory", v);
            break;
        case 'R':
            if (v != 0)
                PERF_ARG_ERROR("-R %ld: buffer registration is not supported by the host-memory "
                               "perf tools", v);
            break;
        case 'D':
            if (v != 0)
                PERF_ARG_ERROR("-D %ld: device-API kernels are not supported on host memory", v);
            break;
        default:
            PERF_ARG_ERROR("unexpected option -%c", c);
        }
    }
    if (optind < argc)
        PERF_ARG_ERROR("unexpected argument '%s' (see -h)", argv[optind]);
    if (a->min_bytes > a->max_bytes)
        PERF_ARG_ERROR("invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu", a->min_bytes,
                       a->max_bytes);
    if (a->step_factor <= 1 && a->step_bytes == 0 && a->min_bytes < a->max_bytes)
        PERF_ARG_ERROR("-i 0 with -f 1 would never reach maxbytes");

    /* "all" takes what the backend can run; a type or op named alone must be supported. */
    if (strcmp(type_arg, "all") == 0) {
        for (int i = 0; i < ncclNumTypes; i++)
            if (be->supports(&perf_types[i], PERF_OP_NONE))
                a->types[a->ntypes++] = &perf_types[i];
    } else {
        const struct perf_type *t = perf_type_by_name(type_arg);
        if (t == NULL)
            PERF_ARG_ERROR("invalid type '%s' (int8 uint8 int32 uint32 int64 uint64 half float "
                           "double bfloat16 f8e4m3 f8e5m2 all)", type_arg);
        if (!be->supports(t, PERF_OP_NONE))
            PERF_ARG_ERROR("type '%s' is not supported by %s", type_arg, be->name);
        a->types[a->ntypes++] = t;
    }
    if (strcmp(op_arg, "all") == 0) {
        for (int i = 0; i < PERF_OP_COUNT; i++)
            if (be->supports(NULL, i))
                a->ops[a->nops++] = i;
    } else {
        int found = -1;
        for (int i = 0; i < PERF_OP_COUNT; i++)
            if (strcmp(op_arg, perf_op_names[i]) == 0)
                found = i;
        if (found < 0)
            PERF_ARG_ERROR("invalid op '%s' (sum prod max min avg mulsum all)", op_arg);
        if (!be->supports(NULL, found))
            PERF_ARG_ERROR("op '%s' is not supported by %s", op_arg, be->name);
        a->ops[a->nops++] = found;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Main
 * ------------------------------------------------------------------------------------------- */

struct perf_rank_info {
    int32_t pid;
    int32_t device;
    char host[120];
};

static void print_devices(struct perf_state *st)
{
    size_t n = (size_t)st->ctx.nranks;
    struct perf_rank_info *in = calloc(n, sizeof(*in)), *out = calloc(n, sizeof(*out));

    if (in == NULL || out == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        exit(1);
    }
    in[st->ctx.rank].pid = (int32_t)getpid();
    in[st->ctx.rank].device = st->ctx.local_rank;
    snprintf(in[st->ctx.rank].host, sizeof(in[0].host), "%.119s", st->host);
    PERF_CHECK(st, st->be->allgather(&st->ctx, &in[st->ctx.rank], out, sizeof(*in)));
    if (st->is_main) {
        printf("# Using devices\n");
        for (size_t r = 0; r < n; r++) {
            out[r].host[sizeof(out[r].host) - 1] = '\0';
            printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [host] host memory\n", (int)r,
                   0, (int)out[r].pid, out[r].host, (int)out[r].device);
        }
    }
    free(in);
    free(out);
}

static void allocate_buffers(struct perf_state *st)
{
    const struct perf_args *a = &st->a;
    size_t buf = a->max_bytes, expect = 0, slack;

    for (int i = 0; i < a->ntypes; i++) {
        struct perf_counts c;
        size_t ts = a->types[i]->size;
        st->coll->get_counts(a->max_bytes, ts, st->ctx.nranks, &c);
        size_t total = (c.send_count > c.recv_count ? c.send_count : c.recv_count) * ts;
        if (total > buf)
            buf = total;
        if (c.recv_count * ts > expect)
            expect = c.recv_count * ts;
    }
    slack = (size_t)a->unalign * 8 + PERF_ALIGN;
    st->buf_bytes = buf;
    st->expect_bytes = expect;
    /* 64-byte aligned; -u shifts each call's pointers by that many elements (call_buffers). */
    st->send_base = aligned_buffer(buf + slack, &st->send_alloc);
    st->recv_base = aligned_buffer(buf + slack, &st->recv_alloc);
    if (a->check)
        st->expect = aligned_buffer(expect + PERF_ALIGN, &st->expect_alloc);
}

/* Only the main rank prints a usage error; the others give it time to do so before they exit,
 * since weftrun stops every rank as soon as one fails. */
static int usage_exit(int is_main, int rc)
{
    struct timespec ts = {0, 500 * 1000 * 1000};

    fflush(stderr);
    if (!is_main)
        nanosleep(&ts, NULL);
    return rc;
}

int perf_run(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run,
             const struct perf_backend *be)
{
    struct perf_state *st = calloc(1, sizeof(*st));
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    char version_line[256] = "";
    int rc;
    long errors;
    double avg_bw, min_bw = -1;
    const char *env;
    pthread_t wd;

    if (st == NULL)
        return 1;
    setlinebuf(stdout);
    st->coll = coll;
    st->run = run;
    st->prog = prog;
    st->be = be;
    /* Only the main rank reports usage errors and prints the table. */
    st->is_main = be->early_rank() == 0;
    rc = parse_args(&st->a, argc, argv, prog, st->is_main, be);
    if (rc != 0)
        return rc < 0 ? 0 : usage_exit(st->is_main, rc);
    if (gethostname(st->host, sizeof(st->host) - 1) != 0)
        snprintf(st->host, sizeof(st->host), "localhost");
    st->host[strcspn(st->host, ".")] = '\0';
    st->verbose = getenv("WEFT_PERF_VERBOSE") != NULL;

    PERF_CHECK(st, be->init(&st->ctx, version_line, sizeof(version_line)));
    st->is_main = st->ctx.rank == 0;
    /* Checks that need the rank count; every rank takes the same branch, so all leave cleanly. */
    if ((coll->flags & PERF_COLL_ROOTED) && st->a.root >= st->ctx.nranks) {
        if (st->is_main)
            fprintf(stderr, "%s: invalid root %d for %d ranks\n", prog, st->a.root,
                    st->ctx.nranks);
        rc = 2;
    } else if ((coll->flags & PERF_COLL_POW2) && (st->ctx.nranks & (st->ctx.nranks - 1)) != 0) {
        if (st->is_main)
            fprintf(stderr, "%s: %s needs a power-of-two number of ranks, got %d\n", prog,
                    coll->name, st->ctx.nranks);
        rc = 2;
    }
    if (rc != 0) {
        PERF_CHECK(st, be->fini(&st->ctx));
        return usage_exit(st->is_main, rc);
    }

    if (st->is_main) {
        const struct perf_args *a = &st->a;
        printf("%s\n", version_line);
        printf("# Collective test starting: %s\n", prog);
        printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
               "iters: %d agg iters: %d validation: %d graph: %d unalign: %d\n",
               1, 1, a->min_bytes, a->max_bytes,
               a->step_factor > 1 ? (size_t)a->step_factor : a->step_bytes,
               a->step_factor > 1 ? "factor" : "bytes", a->warmup, a->iters, a->agg, a->check, 0,
               a->unalign);
        if (a->blocking == 1)
            printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
        if (a->blocking > 1)
            printf("# Blocking Enabled: wait for completion after each collective (no barrier) \n");
        if (a->json_path) {
            st->json = fopen(a->json_path, "w");
            if (st->json == NULL)
                printf("# skipping json output; %s not accessible: %s\n", a->json_path,
                       strerror(errno));
            else
                printf("# Writing JSON lines to %s\n", a->json_path);
        }
        printf("#\n");
    }
    print_devices(st);
    allocate_buffers(st);

    if (st->a.timeout_s > 0) {
        watchdog_timeout_s = st->a.timeout_s;
        watchdog_be = be;
        watchdog_ctx = &st->ctx;
        snprintf(watchdog_host, sizeof(watchdog_host), "%s", st->host);
        if (pthread_create(&wd, NULL, watchdog_main, NULL) != 0) {
            fprintf(stderr, "%s: cannot start the -T watchdog thread\n", prog);
            return 1;
        }
        pthread_detach(wd);
    }

    if (st->is_main) {
        const char *tname = st->a.report_cputime ? "cputime" : "time";
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place  "
               "        \n",
               "", "", "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size",
               "count", "type", "redop", "root", tname, "algbw", "busbw", "#wrong", tname, "algbw",
               "busbw", "#wrong", 0, "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)",
               "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
               "", 0, "");
    }

    for (int ti = 0; ti < st->a.ntypes; ti++) {
        int nops = (coll->flags & PERF_COLL_REDUCE) ? st->a.nops : 1;
        for (int oi = 0; oi < nops; oi++) {
            int op = (coll->flags & PERF_COLL_REDUCE) ? st->a.ops[oi] : PERF_OP_NONE;
            if (!be->supports(st->a.types[ti], op))
                continue; /* a combination "all" brought in that this backend lacks */
            if (!(coll->flags & PERF_COLL_ROOTED)) {
                time_test(st, st->a.types[ti], op, -1);
            } else if (st->a.root >= 0) {
                time_test(st, st->a.types[ti], op, st->a.root);
            } else {
                for (int root = 0; root < st->ctx.nranks; root++)
                    time_test(st, st->a.types[ti], op, root);
            }
        }
    }

    errors = (long)sum_int64(st, st->local_errors);
    avg_bw = st->bw_count ? st->bw_sum / (double)st->bw_count : 0;
    env = getenv("NCCL_TESTS_MIN_BW");
    if (env != NULL)
        min_bw = atof(env);
    if (st->is_main) {
        const char *last = be->last_error();
        printf("# %-20s : %ld %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
        printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_bw,
               min_bw < 0 ? "" : (avg_bw < min_bw * 0.9 ? "FAILED" : "OK"));
        printf("#\n");
        printf("# Collective test concluded: %s\n", prog);
        if (last != NULL && last[0] != '\0')
            printf("# error: %s\n", last);
        else
            printf("\n");
    }
    if (st->json)
        fclose(st->json);
    /* Ranks that exit non-zero make weftrun stop the others: let rank 0 finish printing first. */
    fflush(stdout);
    barrier(st);

    watchdog_disarm(st);
    PERF_CHECK(st, be->fini(&st->ctx));
    free(st->send_alloc);
    free(st->recv_alloc);
    free(st->expect_alloc);
    rc = (errors || (min_bw >= 0 && avg_bw < min_bw * 0.9)) ? 7 : 0;
    free(st);
    return rc;
}

#ifndef PERF_NO_NCCL
/* ---------------------------------------------------------------------------------------------
 * NCCL backend
 * ------------------------------------------------------------------------------------------- */

static ncclResult_t nccl_be_init(struct perf_ctx *ctx, char *version_line, size_t len)
{
    ncclUniqueId id;
    int libver = 0;
    ncclResult_t res;

    res = weftLaunchInfo(&ctx->rank, &ctx->nranks, &ctx->local_rank, &id);
    if (res != ncclSuccess)
        return res;
    res = ncclGetVersion(&libver);
    if (res != ncclSuccess)
        return res;
    snprintf(version_line, len,
             "# weft perf (nccl-tests 2.19.6 compatible) nccl-headers=%d nccl-library=%d",
             NCCL_VERSION_CODE, libver);
    ctx->stream = NULL;
    ctx->library = "weft";
    return ncclCommInitRank(&ctx->comm, ctx->nranks, id, ctx->rank);
}

static int nccl_be_early_rank(void)
{
    int rank = 0;

    return weftLaunchInfo(&rank, NULL, NULL, NULL) == ncclSuccess ? rank : 0;
}

static ncclResult_t nccl_be_fini(struct perf_ctx *ctx)
{
    return ncclCommDestroy(ctx->comm);
}

static ncclResult_t nccl_be_barrier(const struct perf_ctx *ctx)
{
    int32_t in = 1, out = 0;

    /* Every rank's contribution is needed before anyone's result: a barrier. */
    return ncclAllReduce(&in, &out, 1, ncclInt32, ncclSum, ctx->comm, ctx->stream);
}

static ncclResult_t nccl_be_reduce_double(const struct perf_ctx *ctx, double *v, int op)
{
    double in = *v, out = 0;
    ncclResult_t res = ncclAllReduce(&in, &out, 1, ncclFloat64, (ncclRedOp_t)op, ctx->comm,
                                     ctx->stream);

    if (res == ncclSuccess)
        *v = out;
    return res;
}

static ncclResult_t nccl_be_sum_int64(const struct perf_ctx *ctx, int64_t *v)
{
    int64_t in = *v, out = 0;
    ncclResult_t res = ncclAllReduce(&in, &out, 1, ncclInt64, ncclSum, ctx->comm, ctx->stream);

    if (res == ncclSuccess)
        *v = out;
    return res;
}

/* Through all-reduce, so that it needs nothing but ncclAllReduce: every rank fills its own
 * slot and zeros the others; a byte sum puts each slot together. */
static ncclResult_t nccl_be_allgather(const struct perf_ctx *ctx, const void *in, void *out,
                                      size_t bytes)
{
    size_t total = bytes * (size_t)ctx->nranks;
    char *tmp = calloc(total ? total : 1, 1);
    ncclResult_t res;

    if (tmp == NULL)
        return ncclSystemError;
    memcpy(tmp + bytes * (size_t)ctx->rank, in, bytes);
    res = ncclAllReduce(tmp, out, total, ncclUint8, ncclSum, ctx->comm, ctx->stream);
    free(tmp);
    return res;
}

static ncclResult_t nccl_be_group_start(void)
{
    return ncclGroupStart();
}

static ncclResult_t nccl_be_group_end(void)
{
    return ncclGroupEnd();
}

static ncclResult_t nccl_be_op_create(const struct perf_ctx *ctx, struct perf_op *op)
{
    uint64_t scalar = 0;

    if (op->op != PERF_OP_MULSUM) {
        op->nccl_op = op->op >= 0 ? (ncclRedOp_t)op->op : ncclSum;
        return ncclSuccess;
    }
    /* nccl-tests' PreMulSum scalars: 1 on even ranks, 2 on odd ranks, read at creation. */
    perf_store_double(op->type, &scalar, 0, (double)mulsum_scalar(ctx->rank));
    return ncclRedOpCreatePreMulSum(&op->nccl_op, &scalar, op->type->type,
                                    ncclScalarHostImmediate, ctx->comm);
}

static ncclResult_t nccl_be_op_destroy(const struct perf_ctx *ctx, struct perf_op *op)
{
    if (op->op != PERF_OP_MULSUM)
        return ncclSuccess;
    return ncclRedOpDestroy(op->nccl_op, ctx->comm);
}

static int nccl_be_supports(const struct perf_type *t, int op)
{
    (void)t;
    (void)op;
    return 1;
}

static const char *nccl_be_last_error(void)
{
    return ncclGetLastError(NULL);
}

static ncclResult_t nccl_be_abort(const struct perf_ctx *ctx)
{
    return ncclCommAbort(ctx->comm);
}

const struct perf_backend perf_nccl_backend = {
    .name = "NCCL",
    .init = nccl_be_init,
    .early_rank = nccl_be_early_rank,
    .fini = nccl_be_fini,
    .barrier = nccl_be_barrier,
    .reduce_double = nccl_be_reduce_double,
    .sum_int64 = nccl_be_sum_int64,
    .allgather = nccl_be_allgather,
    .group_start = nccl_be_group_start,
    .group_end = nccl_be_group_end,
    .op_create = nccl_be_op_create,
    .op_destroy = nccl_be_op_destroy,
    .supports = nccl_be_supports,
    .error_string = ncclGetErrorString,
    .last_error = nccl_be_last_error,
    .abort = nccl_be_abort,
};

int perf_main(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run)
{
    return perf_run(argc, argv, coll, run, &perf_nccl_backend);
}
#endif /* PERF_NO_NCCL */
