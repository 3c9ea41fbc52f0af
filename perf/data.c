/*
 * The perf driver's data (see common.h, "Data"): datatypes and their formats, test values, and
 * filling and checking a rank's buffers.
 */
#include "driver.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Types and formats
 * ------------------------------------------------------------------------------------------- */

/* Indexed by ncclDataType_t. exp_lo/exp_hi keep every test value (and every partial result) a
 * normal number of the format, well below its largest finite value. */
const struct perf_type perf_types[ncclNumTypes] = {
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

const char *const perf_op_names[PERF_OP_COUNT] = {"sum", "prod", "max", "min", "avg",
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

void perf_make_gen(struct perf_gen *g, const struct perf_type *t, int op, int nranks)
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
                acc += op->op == PERF_OP_MULSUM ? v * (uint64_t)perf_mulsum_scalar(r) : v;
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
                acc += op->op == PERF_OP_MULSUM ? s * perf_mulsum_scalar(r) : s;
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
 * A rank's buffers
 * ------------------------------------------------------------------------------------------- */

/* Lays rank i's input at send: made on the host, copied in on device buffers. What init_data
 * leaves unwritten keeps the buffer's bytes, as on host memory. */
void perf_fill_send(struct perf_state *st, int i, const struct perf_op *op, uint64_t seed,
                    char *send)
{
    struct perf_slot *sl = &st->slots[i];
    size_t bytes = op->c.send_count * op->type->size;

    if (!st->dev_bufs) {
        st->coll->init_data(sl->ctx, op, seed, send);
        return;
    }
    perf_slot_use(st, i);
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
int64_t perf_check_rank(struct perf_state *st, int i, const struct perf_op *op, uint64_t seed,
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
        perf_slot_use(st, i);
        PERF_CUDACHECK(st, st->dm->memcpy(sl->stage, recv, sl->exp_n * ts));
        recv = sl->stage;
    }
    return count_wrong(st, i, op, recv, sl->expect, sl->exp_n);
}
