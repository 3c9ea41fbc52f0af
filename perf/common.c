/*
 * The *_perf driver: flags, sweep, timing, validation and nccl-tests output. See common.h.
 */
#include "common.h"
#include "devmem.h"

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

#define PERF_MAX_THREADS 64

struct perf_args {
    size_t min_bytes, max_bytes, step_bytes;
    long step_factor;
    int iters, warmup, agg, cycles, check, root, blocking, average, unalign, timeout_s;
    double time_target; /* -S: seconds each timed run of a size aims at (0: -n iterations) */
    int repeats;        /* -k: timed runs per row; the row shows their median */
    int report_cputime, parallel_init, stream_null;
    int nthreads, ngpus, graph_launches, host_buffers;
    int local_register; /* -R 1: buffers from the backend's reg_alloc (ncclMemAlloc, registered) */
    const char *json_path;
    int ntypes;
    const struct perf_type *types[PERF_MAX_TYPES];
    int nops;
    int ops[PERF_OP_COUNT];
};

/* One rank's buffers. On device buffers `stage` is the host copy that data is made and checked
 * in; on host buffers the driver works on the buffers themselves. */
struct perf_slot {
    struct perf_ctx *ctx;
    char *send_base, *recv_base; /* 64-byte aligned (device: as cudaMalloc returned) */
    void *send_alloc, *recv_alloc;
    void *send_reg, *recv_reg; /* -R 1: registration handles (send_alloc/recv_alloc: reg_alloc's) */
    char *stage, *expect;
    void *stage_alloc, *expect_alloc;
    ncclRedOp_t nccl_op; /* this communicator's op of the current test (mulsum: its PreMulSum) */
    perf_graph_t graph;
    /* expected-values cache */
    int exp_valid;
    uint64_t exp_seed;
    const struct perf_type *exp_type;
    int exp_op, exp_root;
    size_t exp_count, exp_n;
};

/* One driving thread (-t): its team of -g ranks. Thread 0 is the process's main thread. */
struct perf_state {
    const struct perf_coll *coll;
    perf_run_fn run;
    const char *prog; /* program name, for the header, footer and messages */
    const struct perf_backend *be;
    const struct perf_devmem *dm; /* device runtime when dev_bufs */
    struct perf_args a;
    struct perf_ctx proc;   /* what be->init said about this process */
    struct perf_team team;
    struct perf_slot *slots; /* [team.n] */
    int thread;
    int nteams;             /* teams in the job */
    int dev_bufs;
    int is_main;            /* global rank 0's thread: prints */
    int require_device;     /* WEFT_PERF_DEVICE: 1 device buffers and executor, 2 buffers */
    char host[256];
    size_t buf_bytes;    /* usable bytes of send/recv (rotation space) */
    size_t expect_bytes;
    uint64_t row_seed;   /* advances per table row, identically on every rank */
    /* results */
    double bw_sum;
    long bw_count;
    long local_errors; /* measurements where a rank of this team saw a wrong element */
    int rc;
    FILE *json;
    int verbose;
};

/* -T watchdog: aborts every rank of every team of the process. */
static _Atomic double watchdog_armed_at; /* 0: disarmed */
static int watchdog_timeout_s;
static const struct perf_backend *watchdog_be;
static struct perf_state *watchdog_states;
static int watchdog_nstates;
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

/* nccl-tests' CUDA failure line ("Cuda failure file:line 'text'"), then exit. */
static void perf_cuda_fail(const struct perf_state *st, const char *file, int line, int err)
{
    const char *base = strrchr(file, '/');

    printf("%s: Test CUDA failure %s:%d '%s'\n", st->host, base ? base + 1 : file, line,
           st->dm->error_string(err));
    fflush(stdout);
    exit(1);
}

#define PERF_CUDACHECK(st, call)                                                                   \
    do {                                                                                           \
        int perf_err_ = (call);                                                                    \
        if (perf_err_ != 0)                                                                        \
            perf_cuda_fail((st), __FILE__, __LINE__, perf_err_);                                   \
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
            for (int t = 0; t < watchdog_nstates; t++)
                for (int i = 0; i < watchdog_states[t].team.n; i++)
                    watchdog_be->abort(&watchdog_states[t].team.ctx[i]);
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

/* With several threads the latest arm wins: the watchdog measures the most recent wait. */
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

/* Makes rank i's device current on this thread (device buffers only). */
static void slot_use(struct perf_state *st, int i)
{
    if (st->dev_bufs)
        PERF_CUDACHECK(st, st->dm->set_device(st->team.ctx[i].device));
}

/* Waits for every rank's stream. On host buffers the calls were complete when they returned. */
static void team_sync(struct perf_state *st)
{
    if (!st->dev_bufs)
        return;
    for (int i = 0; i < st->team.n; i++)
        PERF_CUDACHECK(st, st->dm->stream_synchronize(st->team.ctx[i].stream));
}

static void barrier(struct perf_state *st)
{
    PERF_CHECK(st, st->be->barrier(&st->team));
}

/* Combines this thread's seconds per op over the job as -a says. */
static double combine_time(struct perf_state *st, double sec)
{
    double v = sec;
    int op = PERF_OP_SUM;

    switch (st->a.average) {
    case 0:
        v = st->team.ctx[0].rank == 0 ? sec : 0;
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
    PERF_CHECK(st, st->be->reduce_double(&st->team, &v, op));
    return st->a.average == 1 ? v / st->nteams : v;
}

static int64_t sum_int64(struct perf_state *st, int64_t v)
{
    PERF_CHECK(st, st->be->sum_int64(&st->team, &v));
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

/* A zeroed buffer of rank i's kind (device memory on its device, or host). */
static char *rank_buffer(struct perf_state *st, int i, size_t bytes, void **alloc_p)
{
    void *p = NULL;

    if (!st->dev_bufs)
        return aligned_buffer(bytes, alloc_p);
    slot_use(st, i);
    PERF_CUDACHECK(st, st->dm->malloc(&p, bytes ? bytes : PERF_ALIGN));
    PERF_CUDACHECK(st, st->dm->memset(p, 0, bytes));
    *alloc_p = p;
    return p;
}

static void rank_buffer_free(struct perf_state *st, int i, void *alloc)
{
    if (alloc == NULL)
        return;
    if (!st->dev_bufs) {
        free(alloc);
        return;
    }
    slot_use(st, i);
    PERF_CUDACHECK(st, st->dm->free(alloc));
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

/* Pointers of one call of rank i. iter selects the rotation slot inside the buffers, as
 * nccl-tests does. */
static void call_buffers(const struct perf_state *st, int i, const struct perf_op *op,
                         size_t iter, char **send_p, char **recv_p)
{
    const struct perf_slot *sl = &st->slots[i];
    size_t ts = op->type->size;
    size_t total = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;
    size_t steps = total ? st->buf_bytes / total : 1;
    size_t shift = total * (iter % (steps ? steps : 1)) + (size_t)st->a.unalign * ts;
    size_t r = (size_t)sl->ctx->rank;

    if (op->in_place) {
        *send_p = sl->recv_base + shift + r * op->c.send_inplace_offset * ts;
        *recv_p = sl->recv_base + shift + r * op->c.recv_inplace_offset * ts;
    } else {
        *send_p = sl->send_base + shift;
        *recv_p = sl->recv_base + shift;
    }
}

/* One op on every rank of the team: grouped when the thread drives several (as nccl-tests),
 * one group per dependent step (perf_coll.phases). */
static void run_op(struct perf_state *st, const struct perf_op *op, size_t iter)
{
    int nphases = st->team.n > 1 ? st->coll->phases(st->team.ctx[0].nranks) : 1;
    char *send, *recv;

    for (int p = 0; p < nphases; p++) {
        if (st->team.n > 1)
            PERF_CHECK(st, st->be->group_start());
        for (int i = 0; i < st->team.n; i++) {
            struct perf_op mine = *op;

            mine.nccl_op = st->slots[i].nccl_op;
            mine.phase = p;
            mine.nphases = nphases;
            call_buffers(st, i, op, iter, &send, &recv);
            PERF_CHECK(st, st->run(&st->team.ctx[i], &mine, send, recv));
        }
        if (st->team.n > 1)
            PERF_CHECK(st, st->be->group_end());
    }
}

/* Lays rank i's input at send: made on the host, copied in on device buffers. What init_data
 * leaves unwritten keeps the buffer's bytes, as on host memory. */
static void fill_send(struct perf_state *st, int i, const struct perf_op *op, uint64_t seed,
                      char *send)
{
    struct perf_slot *sl = &st->slots[i];
    size_t bytes = op->c.send_count * op->type->size;

    if (!st->dev_bufs) {
        st->coll->init_data(sl->ctx, op, seed, send);
        return;
    }
    slot_use(st, i);
    PERF_CUDACHECK(st, st->dm->memcpy(sl->stage, send, bytes));
    st->coll->init_data(sl->ctx, op, seed, sl->stage);
    PERF_CUDACHECK(st, st->dm->memcpy(send, sl->stage, bytes));
}

static int64_t count_wrong(struct perf_state *st, int i, const struct perf_op *op,
                           const char *got, const char *want, size_t n)
{
    size_t ts = op->type->size;
    int64_t wrong = 0;
    int shown = 0;

    if (memcmp(got, want, n * ts) == 0)
        return 0;
    for (size_t k = 0; k < n; k++) {
        if (memcmp(got + k * ts, want + k * ts, ts) == 0)
            continue;
        wrong++;
        if (st->verbose && shown < 4) {
            uint64_t gb = 0, wb = 0;
            memcpy(&gb, got + k * ts, ts);
            memcpy(&wb, want + k * ts, ts);
            fprintf(stderr,
                    "[rank %d] %s %s %s count %zu%s: element %zu is 0x%0*" PRIx64
                    " (%.17g), expected 0x%0*" PRIx64 " (%.17g)\n",
                    st->team.ctx[i].rank, st->prog, op->type->name, perf_op_name(op->op),
                    op->c.count, op->in_place ? " in-place" : "", k, (int)(2 * ts), gb,
                    perf_load_double(op->type, got, k), (int)(2 * ts), wb,
                    perf_load_double(op->type, want, k));
            shown++;
        }
    }
    return wrong;
}

/* Rank i's wrong elements after a validation op (copied out first on device buffers). */
static int64_t check_rank(struct perf_state *st, int i, const struct perf_op *op, uint64_t seed,
                          const char *recv)
{
    struct perf_slot *sl = &st->slots[i];
    size_t ts = op->type->size;

    if (!(sl->exp_valid && sl->exp_seed == seed && sl->exp_type == op->type &&
          sl->exp_op == op->op && sl->exp_root == op->root && sl->exp_count == op->c.count)) {
        sl->exp_n = st->coll->expected(sl->ctx, op, seed, sl->expect);
        sl->exp_valid = 1;
        sl->exp_seed = seed;
        sl->exp_type = op->type;
        sl->exp_op = op->op;
        sl->exp_root = op->root;
        sl->exp_count = op->c.count;
    }
    if (sl->exp_n == 0)
        return 0;
    if (st->dev_bufs) {
        slot_use(st, i);
        PERF_CUDACHECK(st, st->dm->memcpy(sl->stage, recv, sl->exp_n * ts));
        recv = sl->stage;
    }
    return count_wrong(st, i, op, recv, sl->expect, sl->exp_n);
}

/* One validation round; returns wrong elements summed over ranks. */
static int64_t check_once(struct perf_state *st, const struct perf_op *op, uint64_t seed)
{
    size_t ts = op->type->size;
    size_t total = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;
    size_t poison = op->in_place ? total : op->c.recv_count * ts;
    char *send, *recv;
    int64_t wrong = 0;

    /* Poison what the op must overwrite, then lay the input (in place it lies inside recv). */
    for (int i = 0; i < st->team.n; i++) {
        char *at = st->slots[i].recv_base + (size_t)st->a.unalign * ts;
        if (st->dev_bufs) {
            slot_use(st, i);
            PERF_CUDACHECK(st, st->dm->memset(at, 0xa5, poison));
        } else {
            memset(at, 0xa5, poison);
        }
        call_buffers(st, i, op, 0, &send, &recv);
        fill_send(st, i, op, seed, send);
    }
    watchdog_arm(st);
    run_op(st, op, 0);
    team_sync(st);
    watchdog_disarm(st);

    for (int i = 0; i < st->team.n; i++) {
        int64_t w;
        call_buffers(st, i, op, 0, &send, &recv);
        w = check_rank(st, i, op, seed, recv);
        if (w)
            st->local_errors++;
        wrong += w;
    }
    return sum_int64(st, wrong);
}

struct perf_result {
    double time_us, algbw, busbw; /* time_us: the median of the repeats */
    int64_t wrong; /* -1: not checked */
    double time_min_us, time_max_us; /* the fastest and slowest repeat */
    int iters;                       /* timed iterations per repeat */
};

/* The driving threads of this process (pthread barrier; nothing with one thread). */
static pthread_barrier_t perf_threads_barrier;

static void threads_sync(const struct perf_state *st)
{
    if (st->a.nthreads > 1)
        pthread_barrier_wait(&perf_threads_barrier);
}

/*
 * -G: captures the iteration loop on every rank's stream (begin), or ends the capture into one
 * executable graph per rank (end). Weft's capture is global mode: while any thread captures, no
 * thread may synchronise (copies, the helper collectives), so the process's threads capture
 * together, between two thread barriers.
 */
static void graph_capture(struct perf_state *st, int end)
{
    if (!end)
        threads_sync(st);
    for (int i = 0; i < st->team.n; i++) {
        cudaStream_t s = st->team.ctx[i].stream;
        if (end)
            PERF_CUDACHECK(st, st->dm->capture_end(s, &st->slots[i].graph));
        else
            PERF_CUDACHECK(st, st->dm->capture_begin(s));
    }
    if (end)
        threads_sync(st);
}

/* One timed run of iters iterations (or -G graph launches): seconds per op, this rank's. */
static double timed_run(struct perf_state *st, struct perf_op *op, int iters)
{
    const struct perf_args *a = &st->a;
    double t0, excluded = 0, sec, cpu_sec;
    int graph = a->graph_launches > 0;

    if (graph)
        graph_capture(st, 0);
    t0 = now_s();
    for (int it = 0; it < iters; it++) {
        if (a->agg > 1)
            PERF_CHECK(st, st->be->group_start());
        for (int k = 0; k < a->agg; k++)
            run_op(st, op, (size_t)it * (size_t)a->agg + (size_t)k);
        if (a->agg > 1)
            PERF_CHECK(st, st->be->group_end());
        if (a->blocking > 0 && !graph)
            team_sync(st);
        if (a->blocking == 1 && !graph) {
            barrier(st);
        } else if (a->blocking == 3 && !graph) {
            double b0 = now_s();
            barrier(st);
            excluded += now_s() - b0;
        }
    }
    if (graph) {
        /* As nccl-tests: capture once, resynchronise, then time -G launches of the graph. */
        graph_capture(st, 1);
        barrier(st);
        t0 = now_s();
        for (int l = 0; l < a->graph_launches; l++)
            for (int i = 0; i < st->team.n; i++)
                PERF_CUDACHECK(st, st->dm->graph_launch(st->slots[i].graph,
                                                        st->team.ctx[i].stream));
    }
    cpu_sec = now_s() - t0 - excluded;
    team_sync(st);
    sec = now_s() - t0 - excluded;
    if (a->report_cputime)
        sec = cpu_sec;
    sec /= (double)iters * a->agg * (graph ? a->graph_launches : 1);
    if (graph) {
        for (int i = 0; i < st->team.n; i++) {
            PERF_CUDACHECK(st, st->dm->graph_destroy(st->slots[i].graph));
            st->slots[i].graph = NULL;
        }
    }
    return sec;
}

#define PERF_MAX_ITERS (1 << 24)

/*
 * -S: the iterations of one timed run of this size, so that it lasts about a->time_target
 * seconds. Runs batches of 1, 2, 4, ... iterations (a warm-up as well: a sub-microsecond call's
 * first hundreds of calls are not its steady state) until a batch takes an eighth of the target
 * and the time per iteration has stopped falling (doubling the batch cut it by less than 20%): a
 * fixed cost per batch (waking a peer that slept, a time slice lost on a shared machine) must not
 * pass for the cost of an iteration, or a 1 us call would get a handful of iterations. Then
 * scales the last batch's time per iteration (the longest batch, so the most typical: scaling the
 * fastest batch instead made a 0.02 s target run past 50 s on a loaded machine), giving up on
 * steadiness after four times the target. Every rank uses the slowest rank's times, so all run
 * the same count. Without -S (or with -G) the count is -n.
 */
static int size_iters(struct perf_state *st, struct perf_op *op)
{
    const struct perf_args *a = &st->a;
    if (a->time_target <= 0 || a->graph_launches > 0)
        return a->iters;
    double prev = 0, total = 0;
    for (int k = 1;; k *= 2) {
        double t0 = now_s();
        for (int it = 0; it < k; it++)
            run_op(st, op, (size_t)it);
        team_sync(st);
        double dt = now_s() - t0, per;
        PERF_CHECK(st, st->be->reduce_double(&st->team, &dt, PERF_OP_MAX));
        total += dt;
        per = dt / k;
        int steady = k > 1 && per >= 0.8 * prev;
        prev = per;
        if ((dt >= a->time_target / 8 && steady) || total >= 4 * a->time_target ||
            k >= PERF_MAX_ITERS) {
            double n = per > 0 ? ceil(a->time_target / per) : (double)PERF_MAX_ITERS;
            return n < 1 ? 1 : n > PERF_MAX_ITERS ? PERF_MAX_ITERS : (int)n;
        }
    }
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static void bench(struct perf_state *st, struct perf_op *op, uint64_t seed,
                  struct perf_result *res)
{
    const struct perf_args *a = &st->a;
    char *send, *recv;
    double sec, reps[64];
    int nrep = a->repeats < 1 ? 1 : a->repeats > 64 ? 64 : a->repeats;

    /* Sane data for timing (no NaN/denormal slow paths), one synchronising op, barrier. */
    if (a->check) {
        for (int i = 0; i < st->team.n; i++) {
            call_buffers(st, i, op, 0, &send, &recv);
            fill_send(st, i, op, seed ^ 0x99, send);
        }
    }
    watchdog_arm(st);
    run_op(st, op, 0);
    team_sync(st);
    barrier(st);

    int iters = size_iters(st, op);
    for (int r = 0; r < nrep; r++) {
        barrier(st);
        /* -S: steady state: an eighth of the run untimed first, so that the run does not start
         * with ranks that slept through the barrier */
        for (int it = 0; a->time_target > 0 && it < (iters + 7) / 8; it++)
            run_op(st, op, (size_t)it);
        reps[r] = combine_time(st, timed_run(st, op, iters));
    }
    watchdog_disarm(st);
    qsort(reps, (size_t)nrep, sizeof(double), cmp_double);
    sec = nrep % 2 ? reps[nrep / 2] : (reps[nrep / 2 - 1] + reps[nrep / 2]) / 2;
    res->time_min_us = reps[0] * 1e6;
    res->time_max_us = reps[nrep - 1] * 1e6;
    res->iters = iters;

    res->time_us = sec * 1e6;
    res->algbw = sec > 0 ? op->c.alg_bytes / 1e9 / sec : 0;
    res->busbw = res->algbw * st->coll->bus_factor(st->team.ctx[0].nranks);
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
            st->team.ctx[0].library, st->coll->name, st->team.ctx[0].nranks, bytes, op->c.count);
    fprintf(f, ",\"type\":\"%s\",\"op\":\"%s\",\"root\":%d,\"inplace\":%s", op->type->name,
            perf_op_name(op->op), op->root, op->in_place ? "true" : "false");
    json_number(f, "time_us", r->time_us, "%.3f");
    json_number(f, "algbw", r->algbw, "%.6f");
    json_number(f, "busbw", r->busbw, "%.6f");
    if (r->wrong >= 0)
        fprintf(f, ",\"wrong\":%" PRId64, r->wrong);
    else
        fputs(",\"wrong\":null", f);
    fprintf(f, ",\"memory\":\"%s\"", st->dev_bufs ? "device" : "host");
    fprintf(f, ",\"iters\":%d,\"repeats\":%d", r->iters, st->a.repeats);
    json_number(f, "time_us_min", r->time_min_us, "%.3f");
    json_number(f, "time_us_max", r->time_max_us, "%.3f");
    fputs("}\n", f);
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

/* -S or -k: rows end with each half's iterations per repeat and spread of the repeats. */
static int perf_timing_columns(const struct perf_args *a)
{
    return a->time_target > 0 || a->repeats > 1;
}

/* Warm-up, then -N cycles of the size sweep, for one (type, op, root). */
static void time_test(struct perf_state *st, const struct perf_type *t, int op_kind, int root)
{
    const struct perf_args *a = &st->a;
    int nranks = st->team.ctx[0].nranks;
    struct perf_op op;
    long repeat = a->cycles;

    memset(&op, 0, sizeof(op));
    op.type = t;
    op.op = op_kind;
    op.root = root;
    make_gen(&op.gen, t, op_kind, nranks);
    for (int i = 0; i < st->team.n; i++) {
        struct perf_op mine = op;
        PERF_CHECK(st, st->be->op_create(&st->team.ctx[i], &mine));
        st->slots[i].nccl_op = mine.nccl_op;
    }

    barrier(st);
    for (size_t size = a->min_bytes; size <= a->max_bytes;
         size = size ? (size > SIZE_MAX / 2 ? SIZE_MAX : size * 2) : 1) {
        st->coll->get_counts(size, t->size, nranks, &op.c);
        op.in_place = 0;
        watchdog_arm(st);
        for (int it = 0; it < a->warmup; it++)
            run_op(st, &op, (size_t)it);
        team_sync(st);
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

            st->coll->get_counts(size, t->size, nranks, &c);
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
            if (perf_timing_columns(a)) /* (slowest - fastest repeat) / median, per half */
                for (int ip = 0; ip < 2; ip++) {
                    size_t len = strlen(line);
                    double sp = res[ip].time_us > 0 ? 100 * (res[ip].time_max_us -
                                                              res[ip].time_min_us) /
                                                             res[ip].time_us
                                                     : 0;
                    snprintf(line + len, sizeof(line) - len, "  %8d  %6.1f", res[ip].iters, sp);
                }
            if (st->is_main)
                printf("%s\n", line);
            if (size == SIZE_MAX)
                break;
        }
    } while (--repeat != 0);

    for (int i = 0; i < st->team.n; i++) {
        struct perf_op mine = op;
        mine.nccl_op = st->slots[i].nccl_op;
        PERF_CHECK(st, st->be->op_destroy(&st->team.ctx[i], &mine));
    }
}

ncclResult_t perf_copy(const struct perf_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    const struct perf_devmem *dm;
    int err;

    if (!ctx->dev_bufs) {
        memcpy(dst, src, bytes);
        return ncclSuccess;
    }
    dm = perf_devmem_get(NULL);
    /* The NULL stream is the current device's: make it the rank's (one thread, several). */
    err = ctx->stream == NULL ? dm->set_device(ctx->device) : 0;
    if (err == 0)
        err = dm->memcpy_async(dst, src, bytes, ctx->stream);
    if (err != 0) {
        fprintf(stderr, "perf: device copy of %zu bytes failed: %s\n", bytes,
                dm->error_string(err));
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------------
 * Arguments
 * ------------------------------------------------------------------------------------------- */

static void usage(const char *prog)
{
    printf("USAGE: %s \n\t"
           "[-t,--nthreads <num threads>] \n\t"
           "[-g,--ngpus <gpus per thread>] \n\t"
           "[-b,--minbytes <min size in bytes>] \n\t"
           "[-e,--maxbytes <max size in bytes>] \n\t"
           "[-i,--stepbytes <increment size>] \n\t"
           "[-f,--stepfactor <increment factor>] \n\t"
           "[-n,--iters <iteration count>] \n\t"
           "[-m,--agg_iters <aggregated iteration count>] \n\t"
           "[-w,--warmup_iters <warmup iteration count>] \n\t"
           "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
           "[-p,--parallel_init <0/1>] (no effect: each thread inits its own ranks)\n\t"
           "[-c,--check <check iteration count>] \n\t"
           "[-o,--op <sum/prod/min/max/avg/mulsum/all>] \n\t"
           "[-d,--datatype <nccltype/all>] \n\t"
           "[-r,--root <root>] \n\t"
           "[-z,--blocking <0/1/2/3>] \n\t"
           "[-y,--stream_null <0/1>] (device buffers; host buffers use the NULL stream)\n\t"
           "[-T,--timeout <time in seconds>] \n\t"
           "[-G,--cudagraph <num graph launches>] (device buffers)\n\t"
           "[-C,--report_cputime <0/1>] \n\t"
           "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
           "[-J,--output_file <file> JSON lines, one per measurement] \n\t"
           "[-u,--unalign <num elements>] \n\t"
           "[-H,--host_buffers <0/1> host memory even where a GPU is (default: 0)] \n\t"
           "[-R,--local_register <0/1> 1: buffers from ncclMemAlloc, registered with "
           "ncclCommRegister (device memory where a GPU is; -H 1: Weft with WEFT_CUDA=0; "
           "default: 0)] \n\t"
           "[-S,--time_target <seconds>] iterations per size for timed runs of about this long "
           "(replaces -n; default 0: -n)\n\t"
           "[-k,--repeats <1-64>] timed runs per row: the row shows their median time and "
           "their spread (default 1)\n\t"
           "[-h,--help]\n"
           "Run under weftrun: weftrun -n <processes> %s ...; ranks = processes x -t x -g, rank\n"
           "i of a process on GPU i mod (GPUs of the host), several ranks may share one.\n"
           "Buffers are device memory where a GPU backend is (Weft: WEFT_CUDA=emu:N or a GPU;\n"
           "another libnccl.so.2: the CUDA runtime), host memory otherwise or with -H 1.\n"
           "Not supported: -R 2 (symmetric registration), -D (device API).\n",
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
        {"host_buffers", required_argument, 0, 'H'},
        {"host-buffers", required_argument, 0, 'H'},
        {"time_target", required_argument, 0, 'S'},
        {"repeats", required_argument, 0, 'k'},
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
    a->repeats = 1;
    a->warmup = 1;
    a->agg = 1;
    a->cycles = 1;
    a->check = 1;
    a->average = 1;
    a->nthreads = 1;
    a->ngpus = 1;

    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv,
                            "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:R:x:D:J:u:H:S:k:h", longopts,
                            NULL)) != -1) {
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
        case 'S': {
            char *end;
            errno = 0;
            a->time_target = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || errno != 0 || !(a->time_target >= 0) ||
                a->time_target > 3600)
                PERF_ARG_ERROR("-S needs seconds in [0, 3600], got '%s'", optarg);
            continue;
        }
        default:
            break;
        }
        if (parse_long(optarg, &v) || v < INT32_MIN || v > INT32_MAX)
            PERF_ARG_ERROR("option -%c needs an integer, got '%s'", c, optarg);
        switch (c) {
        case 't':
        case 'g':
            if (v != 1 && !(be->caps & PERF_BE_DEVICE))
                PERF_ARG_ERROR("-%c %ld: %s runs one rank per process (threads and GPUs per "
                               "process must be 1)", c, v, be->name);
            if (c == 't' && (v < 1 || v > PERF_MAX_THREADS))
                PERF_ARG_ERROR("-t must be in [1, %d], got %ld", PERF_MAX_THREADS, v);
            if (c == 'g' && (v < 1 || v > 1024))
                PERF_ARG_ERROR("-g must be in [1, 1024], got %ld", v);
            if (c == 't')
                a->nthreads = (int)v;
            else
                a->ngpus = (int)v;
            break;
        case 'H':
            a->host_buffers = v != 0;
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
        case 'k':
            if (v < 1 || v > 64)
                PERF_ARG_ERROR("-k must be in [1, 64], got %ld", v);
            a->repeats = (int)v;
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
            if (v < 0)
                PERF_ARG_ERROR("-G must be >= 0, got %ld", v);
            if (v != 0 && !(be->caps & PERF_BE_DEVICE))
                PERF_ARG_ERROR("-G %ld: CUDA graphs need device buffers, which %s does not use",
                               v, be->name);
            a->graph_launches = (int)v;
            break;
        case 'R':
            if (v != 0 && v != 1)
                PERF_ARG_ERROR("-R %ld: only -R 0 and -R 1 (local registration) are supported",
                               v);
            if (v == 1 && be->reg_alloc == NULL)
                PERF_ARG_ERROR("-R 1: %s has no buffer registration in the perf tools",
                               be->name);
            a->local_register = (int)v;
            break;
        case 'D':
            if (v != 0)
                PERF_ARG_ERROR("-D %ld: device-API kernels are not supported by the perf tools",
                               v);
            break;
        default:
            PERF_ARG_ERROR("unexpected option -%c", c);
        }
    }
    if (optind < argc)
        PERF_ARG_ERROR("unexpected argument '%s' (see -h)", argv[optind]);
    /* A capture cannot hold the synchronisations -z asks for after each iteration. */
    if (a->graph_launches > 0 && a->blocking != 0)
        PERF_ARG_ERROR("-G %d cannot be combined with -z %d", a->graph_launches, a->blocking);
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
    char host[56];
    char desc[64];
};

static void print_devices(struct perf_state *st)
{
    size_t n = (size_t)st->team.ctx[0].nranks;
    struct perf_rank_info *in = calloc((size_t)st->team.n, sizeof(*in));
    struct perf_rank_info *out = calloc(n, sizeof(*out));

    if (in == NULL || out == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < st->team.n; i++) {
        const struct perf_ctx *ctx = &st->team.ctx[i];
        in[i].pid = (int32_t)getpid();
        in[i].device = st->dev_bufs ? ctx->device : ctx->local_rank;
        snprintf(in[i].host, sizeof(in[i].host), "%.55s", st->host);
        if (st->dev_bufs)
            st->dm->describe(ctx->device, in[i].desc, sizeof(in[i].desc));
        else
            snprintf(in[i].desc, sizeof(in[i].desc), "[host] host memory");
    }
    PERF_CHECK(st, st->be->allgather(&st->team, in, out, sizeof(*in)));
    if (st->is_main) {
        printf("# Using devices\n");
        for (size_t r = 0; r < n; r++) {
            out[r].host[sizeof(out[r].host) - 1] = '\0';
            out[r].desc[sizeof(out[r].desc) - 1] = '\0';
            printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d %s\n", (int)r, 0,
                   (int)out[r].pid, out[r].host, (int)out[r].device, out[r].desc);
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
        st->coll->get_counts(a->max_bytes, ts, st->team.ctx[0].nranks, &c);
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
    for (int i = 0; i < st->team.n; i++) {
        struct perf_slot *sl = &st->slots[i];
        if (a->local_register) {
            /* ncclMemAlloc is device memory on the current device wherever the process has a
             * CUDA device (NCCL's and Weft's); host memory only in Weft without one. */
            if (!st->dev_bufs && (strcmp(sl->ctx->library, "weft") != 0 ||
                                  (st->dm != NULL && st->dm->ndev > 0))) {
                fprintf(stderr, "perf: -R 1 -H 1: ncclMemAlloc gives host memory only in Weft "
                                "without a CUDA device (run with WEFT_CUDA=0)\n");
                exit(2);
            }
            slot_use(st, i);
            PERF_CHECK(st, st->be->reg_alloc(sl->ctx, buf + slack, &sl->send_alloc,
                                             &sl->send_reg));
            PERF_CHECK(st, st->be->reg_alloc(sl->ctx, buf + slack, &sl->recv_alloc,
                                             &sl->recv_reg));
            /* Zeroed, so every page is touched before anything is timed. */
            if (st->dev_bufs) {
                PERF_CUDACHECK(st, st->dm->memset(sl->send_alloc, 0, buf + slack));
                PERF_CUDACHECK(st, st->dm->memset(sl->recv_alloc, 0, buf + slack));
            } else {
                memset(sl->send_alloc, 0, buf + slack);
                memset(sl->recv_alloc, 0, buf + slack);
            }
            sl->send_base = sl->send_alloc;
            sl->recv_base = sl->recv_alloc;
        } else {
            sl->send_base = rank_buffer(st, i, buf + slack, &sl->send_alloc);
            sl->recv_base = rank_buffer(st, i, buf + slack, &sl->recv_alloc);
        }
        if (a->check)
            sl->expect = aligned_buffer(expect + PERF_ALIGN, &sl->expect_alloc);
        if (st->dev_bufs)
            sl->stage = aligned_buffer(buf + slack, &sl->stage_alloc);
    }
}

static void free_buffers(struct perf_state *st)
{
    for (int i = 0; i < st->team.n; i++) {
        struct perf_slot *sl = &st->slots[i];
        if (st->a.local_register) {
            PERF_CHECK(st, st->be->reg_free(sl->ctx, sl->send_alloc, sl->send_reg));
            PERF_CHECK(st, st->be->reg_free(sl->ctx, sl->recv_alloc, sl->recv_reg));
        } else {
            rank_buffer_free(st, i, sl->send_alloc);
            rank_buffer_free(st, i, sl->recv_alloc);
        }
        free(sl->expect_alloc);
        free(sl->stage_alloc);
    }
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

/* The ranks of thread st->thread: global rank = (process * threads + thread) * gpus + i, as
 * nccl-tests; a rank's device is its host-local index mod the devices there. */
static void team_create(struct perf_state *st)
{
    const struct perf_args *a = &st->a;
    int per_proc = a->nthreads * a->ngpus;

    st->team.ctx = calloc((size_t)a->ngpus, sizeof(*st->team.ctx));
    st->slots = calloc((size_t)a->ngpus, sizeof(*st->slots));
    if (st->team.ctx == NULL || st->slots == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        exit(1);
    }
    st->team.n = a->ngpus; /* after ctx: the watchdog may read the team */
    for (int i = 0; i < a->ngpus; i++) {
        struct perf_ctx *ctx = &st->team.ctx[i];
        int local = st->thread * a->ngpus + i;

        *ctx = st->proc;
        ctx->rank = st->proc.rank * per_proc + local;
        ctx->nranks = st->proc.nranks * per_proc;
        ctx->local_rank = st->proc.local_rank * per_proc + local;
        ctx->device = st->dev_bufs ? ctx->local_rank % st->dm->ndev : -1;
        ctx->dev_bufs = st->dev_bufs;
        ctx->stream = NULL;
        st->slots[i].ctx = ctx;
        if (st->dev_bufs && !a->stream_null) {
            slot_use(st, i);
            PERF_CUDACHECK(st, st->dm->stream_create(&ctx->stream));
        }
    }
}

static void team_destroy(struct perf_state *st)
{
    for (int i = 0; i < st->team.n; i++) {
        if (st->team.ctx[i].stream != NULL) {
            slot_use(st, i);
            PERF_CUDACHECK(st, st->dm->stream_destroy(st->team.ctx[i].stream));
        }
    }
    free(st->team.ctx);
    free(st->slots);
}

/* Prints the table header (main thread, once the device lines are out). */
static void print_table_header(const struct perf_state *st)
{
    const char *tname = st->a.report_cputime ? "cputime" : "time";

    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place  "
           "        \n",
           "", "", "", "", "");
    int tc = perf_timing_columns(&st->a);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n", "size",
           "count", "type", "redop", "root", tname, "algbw", "busbw", "#wrong", tname, "algbw",
           "busbw", "#wrong", tc ? "     iters  spread     iters  spread" : " ");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "", tc ? "    (oop)     (%)      (ip)     (%)" : " ");
    if (tc && st->a.time_target > 0)
        printf("# time: the median of %d timed run(s) per half, each of about %g s (iterations per "
               "size from a calibration, -S); spread: (slowest - fastest) / median\n",
               st->a.repeats, st->a.time_target);
    else if (tc)
        printf("# time: the median of %d timed runs of %d iterations per half; spread: (slowest "
               "- fastest) / median\n", st->a.repeats, st->a.iters);
}

/*
 * WEFT_PERF_DEVICE=1: whether the library lacks a CUDA executor, decided for the whole job. A
 * library that runs device buffers binds each communicator to the device current at its init (as
 * NCCL); one that does not (Weft with the emulated GPU but no executor yet) would run the device
 * tests on its host path, ignoring their streams, so they skip instead, saying so.
 */
static int device_unbound(struct perf_state *st)
{
    int64_t unbound = 0;
    int first = -1, first_dev = -1, first_got = -1;

    for (int i = 0; i < st->team.n; i++) {
        int dev = -1;
        PERF_CHECK(st, st->be->comm_device(&st->team.ctx[i], &dev));
        if (dev == st->team.ctx[i].device)
            continue;
        if (unbound++ == 0) {
            first = st->team.ctx[i].rank;
            first_dev = st->team.ctx[i].device;
            first_got = dev;
        }
    }
    if (st->is_main && unbound > 0)
        printf("# SKIP: WEFT_PERF_DEVICE=1 but the library has no CUDA executor: rank %d on device "
               "%d has a communicator bound to device %d (ncclCommCuDevice)\n", first, first_dev,
               first_got);
    unbound = sum_int64(st, unbound);
    if (st->is_main && unbound > 0)
        printf("# SKIP: %" PRId64 " of %d ranks are not bound to their device\n", unbound,
               st->team.ctx[0].nranks);
    return unbound > 0;
}

/* Everything one driving thread does, from its communicators to the footer. */
static void *thread_main(void *arg)
{
    struct perf_state *st = arg;
    const struct perf_coll *coll = st->coll;
    const struct perf_backend *be = st->be;
    long errors;
    double avg_bw, min_bw = -1;
    const char *env;

    team_create(st);
    PERF_CHECK(st, be->comm_init(&st->team));
    if (st->require_device == 1 && device_unbound(st)) {
        PERF_CHECK(st, be->comm_fini(&st->team));
        team_destroy(st);
        st->rc = 77;
        return NULL;
    }
    print_devices(st);
    allocate_buffers(st);
    /* Allocations may wait for the device (cudaMalloc, cudaMemset), where a collective of another
     * thread's ranks could already wait for this thread: none starts before all are done. */
    threads_sync(st);
    if (st->is_main)
        print_table_header(st);

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
                for (int root = 0; root < st->team.ctx[0].nranks; root++)
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
        printf("# Collective test concluded: %s\n", st->prog);
        if (last != NULL && last[0] != '\0')
            printf("# error: %s\n", last);
        else
            printf("\n");
    }
    /* Ranks that exit non-zero make weftrun stop the others: let rank 0 finish printing first. */
    fflush(stdout);
    barrier(st);

    watchdog_disarm(st);
    threads_sync(st); /* as for the allocations: no thread frees while one's collective runs */
    free_buffers(st);
    PERF_CHECK(st, be->comm_fini(&st->team));
    team_destroy(st);
    st->rc = (errors || (min_bw >= 0 && avg_bw < min_bw * 0.9)) ? 7 : 0;
    return NULL;
}

int perf_run(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run,
             const struct perf_backend *be)
{
    struct perf_state *sts, *st;
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    const char *why = "", *env;
    char version_line[256] = "";
    pthread_t threads[PERF_MAX_THREADS], wd;
    int rc, nranks, is_main;

    st = calloc(1, sizeof(*st));
    if (st == NULL)
        return 1;
    setlinebuf(stdout);
    st->coll = coll;
    st->run = run;
    st->prog = prog;
    st->be = be;
    /* Only the main rank reports usage errors and prints the table. */
    is_main = be->early_rank() == 0;
    rc = parse_args(&st->a, argc, argv, prog, is_main, be);
    if (rc != 0) {
        free(st);
        return rc < 0 ? 0 : usage_exit(is_main, rc);
    }
    if (gethostname(st->host, sizeof(st->host) - 1) != 0)
        snprintf(st->host, sizeof(st->host), "localhost");
    st->host[strcspn(st->host, ".")] = '\0';
    st->verbose = getenv("WEFT_PERF_VERBOSE") != NULL;
    /* Device buffers wherever a GPU backend is, unless -H 1 (see devmem.h). The MPI and Gloo
     * peers never look for one (no CUDA runtime loaded into them). */
    st->dm = (be->caps & PERF_BE_DEVICE) ? perf_devmem_get(&why) : NULL;
    st->dev_bufs = st->dm != NULL && !st->a.host_buffers && st->dm->ndev > 0;
    /* perf-smoke's device tests: they must not pass on host buffers, and skip (77) only where
     * the loaded library reports no device backend, saying so. */
    env = getenv("WEFT_PERF_DEVICE");
    st->require_device = env == NULL ? 0 : strcmp(env, "buffers") == 0 ? 2 : atoi(env) != 0;
    if (st->require_device && !st->dev_bufs) {
        if (is_main)
            printf("# SKIP: WEFT_PERF_DEVICE=%s but no device buffers: %s\n", env,
                   st->a.host_buffers ? "-H 1" : (why[0] ? why : "no GPU backend"));
        free(st);
        return usage_exit(is_main, 77);
    }
    /* On the NULL stream a thread's synchronous copy would queue behind a collective whose
     * ranks include another thread's, blocked the same way: refuse rather than hang. */
    if (st->dev_bufs && st->a.stream_null && st->a.nthreads > 1 &&
        st->a.nthreads * st->a.ngpus > st->dm->ndev) {
        if (is_main)
            fprintf(stderr, "%s: -y 1 with -t %d x -g %d ranks on %d devices: threads would share "
                    "a device's NULL stream (deadlock); use streams (-y 0) or fewer ranks\n",
                    prog, st->a.nthreads, st->a.ngpus, st->dm->ndev);
        free(st);
        return usage_exit(is_main, 2);
    }
    if (st->a.graph_launches > 0 && !st->dev_bufs) {
        if (is_main)
            fprintf(stderr, "%s: -G %d needs device buffers: %s\n", prog, st->a.graph_launches,
                    st->a.host_buffers ? "-H 1 asks for host buffers"
                                       : (why[0] ? why : "no GPU backend"));
        free(st);
        return usage_exit(is_main, 2);
    }

    PERF_CHECK(st, be->init(&st->proc, version_line, sizeof(version_line)));
    is_main = st->proc.rank == 0;
    nranks = st->proc.nranks * st->a.nthreads * st->a.ngpus;
    /* Checks that need the rank count; every rank takes the same branch, so all leave cleanly. */
    if ((coll->flags & PERF_COLL_ROOTED) && st->a.root >= nranks) {
        if (is_main)
            fprintf(stderr, "%s: invalid root %d for %d ranks\n", prog, st->a.root, nranks);
        rc = 2;
    } else if ((coll->flags & PERF_COLL_POW2) && (nranks & (nranks - 1)) != 0) {
        if (is_main)
            fprintf(stderr, "%s: %s needs a power-of-two number of ranks, got %d\n", prog,
                    coll->name, nranks);
        rc = 2;
    }
    if (rc != 0) {
        PERF_CHECK(st, be->fini(&st->proc));
        free(st);
        return usage_exit(is_main, rc);
    }

    if (is_main) {
        const struct perf_args *a = &st->a;
        printf("%s\n", version_line);
        printf("# Collective test starting: %s\n", prog);
        printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
               "iters: %d agg iters: %d validation: %d graph: %d unalign: %d\n",
               a->nthreads, a->ngpus, a->min_bytes, a->max_bytes,
               a->step_factor > 1 ? (size_t)a->step_factor : a->step_bytes,
               a->step_factor > 1 ? "factor" : "bytes", a->warmup, a->iters, a->agg, a->check,
               a->graph_launches, a->unalign);
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

    /* One state per driving thread; thread 0 is this one and alone prints (on process 0). */
    sts = calloc((size_t)st->a.nthreads, sizeof(*sts));
    if (sts == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        return 1;
    }
    for (int t = 0; t < st->a.nthreads; t++) {
        sts[t] = *st;
        sts[t].thread = t;
        sts[t].nteams = nranks / st->a.ngpus;
        sts[t].is_main = is_main && t == 0;
        if (t > 0)
            sts[t].json = NULL;
    }
    free(st);
    st = &sts[0];

    if (st->a.timeout_s > 0) {
        watchdog_timeout_s = st->a.timeout_s;
        watchdog_be = be;
        watchdog_states = sts;
        watchdog_nstates = st->a.nthreads;
        snprintf(watchdog_host, sizeof(watchdog_host), "%s", st->host);
        if (pthread_create(&wd, NULL, watchdog_main, NULL) != 0) {
            fprintf(stderr, "%s: cannot start the -T watchdog thread\n", prog);
            return 1;
        }
        pthread_detach(wd);
    }

    if (st->a.nthreads > 1 &&
        pthread_barrier_init(&perf_threads_barrier, NULL, (unsigned)st->a.nthreads) != 0) {
        fprintf(stderr, "%s: cannot make a barrier of %d threads\n", prog, st->a.nthreads);
        return 1;
    }
    for (int t = 1; t < st->a.nthreads; t++) {
        if (pthread_create(&threads[t], NULL, thread_main, &sts[t]) != 0) {
            fprintf(stderr, "%s: cannot start thread %d of %d\n", prog, t, st->a.nthreads);
            exit(1);
        }
    }
    thread_main(st);
    rc = st->rc;
    for (int t = 1; t < st->a.nthreads; t++) {
        pthread_join(threads[t], NULL);
        if (sts[t].rc > rc)
            rc = sts[t].rc;
    }
    if (st->a.nthreads > 1)
        pthread_barrier_destroy(&perf_threads_barrier);
    if (st->json)
        fclose(st->json);
    PERF_CHECK(st, be->fini(&st->proc));
    free(sts);
    return rc;
}

#ifndef PERF_NO_NCCL
/* ---------------------------------------------------------------------------------------------
 * NCCL backend
 *
 * Binds to whichever libnccl.so.2 is loaded. weftLaunchInfo is a weak reference: with Weft's
 * library it gives rank, size and unique id under any launcher; with another library (NVIDIA's,
 * through LD_LIBRARY_PATH) it is absent and the process must be the whole job (one process,
 * -t x -g ranks, id from ncclGetUniqueId). The helper collectives are small ncclAllReduce calls
 * on a scratch buffer of the ranks' kind: device memory on device buffers (NVIDIA's library
 * takes no plain host memory), the host otherwise.
 * ------------------------------------------------------------------------------------------- */

#pragma weak weftLaunchInfo

static ncclUniqueId nccl_job_id; /* this process's id, made or received by init */

/* Per rank (ctx->be_state): the helper collectives' buffer. A grown one keeps the old until
 * comm_fini: cudaFree waits for the whole device, where another thread's ranks may have a
 * collective in flight that waits for this thread. */
#define NCCL_SCRATCH_RETIRED 8
struct nccl_rank_state {
    void *scratch;
    size_t cap;
    void *retired[NCCL_SCRATCH_RETIRED];
    int nretired;
};

/* Sized at comm_init for every helper the driver calls (its all-gather of rank lines). */
#define NCCL_SCRATCH_PER_RANK 256

/* Job sizes other launchers announce: a job of several processes cannot run without Weft's
 * launch helper (nothing here could hand them one unique id). */
static int nccl_env_job_size(void)
{
    static const char *const vars[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                       "SLURM_NTASKS", "WORLD_SIZE"};

    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v != NULL && atoi(v) > 1)
            return atoi(v);
    }
    return 1;
}

static char nccl_be_error[256];

static ncclResult_t nccl_be_init(struct perf_ctx *ctx, char *version_line, size_t len)
{
    int libver = 0;
    ncclResult_t res;

    ctx->local_rank = 0;
    if (weftLaunchInfo != NULL) {
        res = weftLaunchInfo(&ctx->rank, &ctx->nranks, &ctx->local_rank, &nccl_job_id);
        if (res != ncclSuccess)
            return res;
    } else {
        if (nccl_env_job_size() > 1) {
            snprintf(nccl_be_error, sizeof(nccl_be_error),
                     "this libnccl.so.2 is not Weft's (no weftLaunchInfo): run one process and "
                     "-t/-g ranks in it, a %d-process job needs Weft", nccl_env_job_size());
            return ncclInvalidUsage;
        }
        ctx->rank = 0;
        ctx->nranks = 1;
        res = ncclGetUniqueId(&nccl_job_id);
        if (res != ncclSuccess)
            return res;
    }
    res = ncclGetVersion(&libver);
    if (res != ncclSuccess)
        return res;
    snprintf(version_line, len,
             "# weft perf (nccl-tests 2.19.6 compatible) nccl-headers=%d nccl-library=%d",
             NCCL_VERSION_CODE, libver);
    ctx->comm = NULL;
    ctx->stream = NULL;
    ctx->library = weftLaunchInfo != NULL ? "weft" : "nccl";
    return ncclSuccess;
}

static int nccl_be_early_rank(void)
{
    int rank = 0;

    if (weftLaunchInfo == NULL)
        return 0;
    return weftLaunchInfo(&rank, NULL, NULL, NULL) == ncclSuccess ? rank : 0;
}

static ncclResult_t nccl_be_fini(struct perf_ctx *ctx)
{
    (void)ctx;
    return ncclSuccess;
}

static ncclResult_t nccl_be_cuda_error(const char *what, int err)
{
    snprintf(nccl_be_error, sizeof(nccl_be_error), "%s: %s", what,
             perf_devmem_get(NULL)->error_string(err));
    return ncclUnhandledCudaError;
}

static ncclResult_t nccl_scratch(struct perf_ctx *ctx, size_t bytes, void **p_p);

/* One group of ncclCommInitRank, each on its rank's device (current at the call, as NCCL binds
 * it), as nccl-tests' ncclGroupStart + ncclCommInitRank per GPU. */
static ncclResult_t nccl_be_comm_init(struct perf_team *team)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);
    ncclResult_t res = ncclSuccess, end = ncclSuccess;

    for (int i = 0; i < team->n; i++) {
        void *p;
        team->ctx[i].be_state = calloc(1, sizeof(struct nccl_rank_state));
        if (team->ctx[i].be_state == NULL)
            return ncclSystemError;
        res = nccl_scratch(&team->ctx[i],
                           (size_t)team->ctx[i].nranks * NCCL_SCRATCH_PER_RANK + 64, &p);
        if (res != ncclSuccess)
            return res;
    }
    if (team->n > 1)
        res = ncclGroupStart();
    for (int i = 0; i < team->n && res == ncclSuccess; i++) {
        struct perf_ctx *ctx = &team->ctx[i];
        int err = ctx->dev_bufs ? dm->set_device(ctx->device) : 0;
        if (err != 0)
            res = nccl_be_cuda_error("cudaSetDevice", err);
        else
            res = ncclCommInitRank(&ctx->comm, ctx->nranks, nccl_job_id, ctx->rank);
    }
    if (team->n > 1)
        end = ncclGroupEnd(); /* always closed, so that a failure leaves no group open */
    return res != ncclSuccess ? res : end;
}

static ncclResult_t nccl_be_comm_device(const struct perf_ctx *ctx, int *dev_p)
{
    return ncclCommCuDevice(ctx->comm, dev_p);
}

static void nccl_scratch_free(const struct perf_ctx *ctx, void *p)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);

    if (p == NULL)
        return;
    if (!ctx->dev_bufs) {
        free(p);
        return;
    }
    dm->set_device(ctx->device);
    dm->free(p);
}

static ncclResult_t nccl_be_comm_fini(struct perf_team *team)
{
    ncclResult_t res = ncclSuccess;

    for (int i = 0; i < team->n; i++) {
        struct perf_ctx *ctx = &team->ctx[i];
        struct nccl_rank_state *rs = ctx->be_state;
        ncclResult_t r = ncclCommDestroy(ctx->comm);

        if (res == ncclSuccess)
            res = r;
        if (rs != NULL) {
            nccl_scratch_free(ctx, rs->scratch);
            for (int k = 0; k < rs->nretired; k++)
                nccl_scratch_free(ctx, rs->retired[k]);
        }
        free(rs);
        ctx->be_state = NULL;
    }
    return res;
}

/* Rank i's scratch of at least bytes, of the rank's memory kind. */
static ncclResult_t nccl_scratch(struct perf_ctx *ctx, size_t bytes, void **p_p)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);
    struct nccl_rank_state *rs = ctx->be_state;
    void *p = NULL;
    int err;

    if (rs->cap >= bytes) {
        *p_p = rs->scratch;
        return ncclSuccess;
    }
    if (rs->scratch != NULL && rs->nretired == NCCL_SCRATCH_RETIRED) {
        snprintf(nccl_be_error, sizeof(nccl_be_error), "helper scratch grown too often");
        return ncclInternalError;
    }
    if (!ctx->dev_bufs) {
        p = malloc(bytes);
        if (p == NULL)
            return ncclSystemError;
    } else {
        err = dm->set_device(ctx->device);
        if (err == 0)
            err = dm->malloc(&p, bytes);
        if (err != 0)
            return nccl_be_cuda_error("cudaMalloc", err);
    }
    if (rs->scratch != NULL)
        rs->retired[rs->nretired++] = rs->scratch;
    rs->scratch = p;
    rs->cap = bytes;
    *p_p = p;
    return ncclSuccess;
}

/*
 * In place over all ranks: buf holds team->n blocks of `bytes` (the team's ranks in order), each
 * replaced by the all-reduce of count elements. One group over the team, then each stream waited
 * for, so it is blocking on device buffers as on host ones.
 */
static ncclResult_t nccl_team_allreduce(const struct perf_team *team, void *buf, size_t count,
                                        ncclDataType_t type, ncclRedOp_t op)
{
    const struct perf_devmem *dm = perf_devmem_get(NULL);
    size_t bytes = count * perf_type_get(type)->size;
    ncclResult_t res = ncclSuccess, end = ncclSuccess;
    void **at = calloc((size_t)team->n, sizeof(*at));
    int err = 0;

    if (at == NULL)
        return ncclSystemError;
    for (int i = 0; i < team->n && res == ncclSuccess; i++) {
        struct perf_ctx *ctx = &team->ctx[i];
        res = nccl_scratch(ctx, bytes ? bytes : 1, &at[i]);
        if (res == ncclSuccess && ctx->dev_bufs)
            err = dm->memcpy(at[i], (char *)buf + (size_t)i * bytes, bytes);
        else if (res == ncclSuccess)
            memcpy(at[i], (char *)buf + (size_t)i * bytes, bytes);
        if (err != 0)
            res = nccl_be_cuda_error("cudaMemcpy", err);
    }
    if (res != ncclSuccess)
        goto out;
    if (team->n > 1)
        res = ncclGroupStart();
    for (int i = 0; i < team->n && res == ncclSuccess; i++)
        res = ncclAllReduce(at[i], at[i], count, type, op, team->ctx[i].comm, team->ctx[i].stream);
    if (team->n > 1)
        end = ncclGroupEnd();
    if (res == ncclSuccess)
        res = end;
    for (int i = 0; i < team->n && res == ncclSuccess; i++) {
        const struct perf_ctx *ctx = &team->ctx[i];
        if (!ctx->dev_bufs) {
            memcpy((char *)buf + (size_t)i * bytes, at[i], bytes);
            continue;
        }
        err = dm->stream_synchronize(ctx->stream);
        if (err == 0)
            err = dm->memcpy((char *)buf + (size_t)i * bytes, at[i], bytes);
        if (err != 0)
            res = nccl_be_cuda_error("cudaStreamSynchronize/cudaMemcpy", err);
    }
out:
    free(at);
    return res;
}

static ncclResult_t nccl_be_barrier(const struct perf_team *team)
{
    int32_t v[team->n];

    /* Every rank's contribution is needed before anyone's result: a barrier. */
    for (int i = 0; i < team->n; i++)
        v[i] = 1;
    return nccl_team_allreduce(team, v, 1, ncclInt32, ncclSum);
}

/* A team's value counts once in a sum (its first rank gives it, the others the identity); min
 * and max are the same whichever ranks repeat it. */
static ncclResult_t nccl_be_reduce_double(const struct perf_team *team, double *v, int op)
{
    double in[team->n];
    ncclResult_t res;

    for (int i = 0; i < team->n; i++)
        in[i] = op == PERF_OP_SUM && i > 0 ? 0.0 : *v;
    res = nccl_team_allreduce(team, in, 1, ncclFloat64, (ncclRedOp_t)op);
    if (res == ncclSuccess)
        *v = in[0];
    return res;
}

static ncclResult_t nccl_be_sum_int64(const struct perf_team *team, int64_t *v)
{
    int64_t in[team->n];
    ncclResult_t res;

    for (int i = 0; i < team->n; i++)
        in[i] = i == 0 ? *v : 0;
    res = nccl_team_allreduce(team, in, 1, ncclInt64, ncclSum);
    if (res == ncclSuccess)
        *v = in[0];
    return res;
}

/* Through all-reduce, so that it needs nothing but ncclAllReduce: every rank fills its own
 * slot and zeros the others; a byte sum puts each slot together. */
static ncclResult_t nccl_be_allgather(const struct perf_team *team, const void *in, void *out,
                                      size_t bytes)
{
    size_t total = bytes * (size_t)team->ctx[0].nranks;
    char *tmp = calloc((size_t)team->n, total ? total : 1);
    ncclResult_t res;

    if (tmp == NULL)
        return ncclSystemError;
    for (int i = 0; i < team->n; i++)
        memcpy(tmp + (size_t)i * total + bytes * (size_t)team->ctx[i].rank,
               (const char *)in + (size_t)i * bytes, bytes);
    res = nccl_team_allreduce(team, tmp, total, ncclUint8, ncclSum);
    if (res == ncclSuccess)
        memcpy(out, tmp, total);
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
    const char *last = ncclGetLastError(NULL);

    return nccl_be_error[0] != '\0' && (last == NULL || last[0] == '\0') ? nccl_be_error : last;
}

static ncclResult_t nccl_be_abort(const struct perf_ctx *ctx)
{
    return ctx->comm != NULL ? ncclCommAbort(ctx->comm) : ncclSuccess;
}

/* -R 1 (nccl-tests' --local_register): ncclMemAlloc'd (on the calling thread's current device
 * where there is one), registered on the rank's communicator. */
static ncclResult_t nccl_be_reg_alloc(const struct perf_ctx *ctx, size_t bytes, void **p_p,
                                      void **handle_p)
{
    ncclResult_t res = ncclMemAlloc(p_p, bytes);
    if (res != ncclSuccess)
        return res;
    res = ncclCommRegister(ctx->comm, *p_p, bytes, handle_p);
    if (res != ncclSuccess)
        ncclMemFree(*p_p);
    return res;
}

static ncclResult_t nccl_be_reg_free(const struct perf_ctx *ctx, void *p, void *handle)
{
    ncclResult_t res = ncclCommDeregister(ctx->comm, handle);
    ncclResult_t res2 = ncclMemFree(p);
    return res != ncclSuccess ? res : res2;
}

const struct perf_backend perf_nccl_backend = {
    .name = "NCCL",
    .caps = PERF_BE_DEVICE,
    .init = nccl_be_init,
    .early_rank = nccl_be_early_rank,
    .fini = nccl_be_fini,
    .comm_init = nccl_be_comm_init,
    .comm_fini = nccl_be_comm_fini,
    .reg_alloc = nccl_be_reg_alloc,
    .reg_free = nccl_be_reg_free,
    .comm_device = nccl_be_comm_device,
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
