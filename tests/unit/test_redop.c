/*
 * Unit tests for kernels/redop.h: every type x op against an independent reference.
 *
 * The reference never uses redop_elem.h. Small floating formats are decoded with ldexp from their
 * fields, and rounded by searching the sorted table of all encodings for the nearest value (ties to
 * the even encoding), in double. fp8 ops follow NCCL's sm_90 path: exact result, rounded to fp16,
 * then to fp8 with satfinite. Integers use __int128 arithmetic and explicit truncation.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redop.h"

/* ---- harness ------------------------------------------------------------------------------ */

static unsigned long g_pass;
static unsigned long g_fail;
#define MAX_REPORTS 60

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            g_pass++;                                                                              \
        } else {                                                                                   \
            if (g_fail < MAX_REPORTS) {                                                            \
                printf("FAIL %s:%d: ", __FILE__, __LINE__);                                        \
                printf(__VA_ARGS__);                                                               \
                printf("\n");                                                                      \
            }                                                                                      \
            g_fail++;                                                                              \
        }                                                                                          \
    } while (0)

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static const char *const kind_names[] = {"sum", "prod", "max", "min"};

/* ---- small float formats, decoded from their fields ---------------------------------------- */

enum { FMT_F16, FMT_BF16, FMT_E4M3, FMT_E5M2, FMT_COUNT };

struct fmt {
    const char *name;
    int ebits, mbits, bias;
    int fn;        /* e4m3 style: no infinity, only all-ones is NaN */
    unsigned nenc; /* 2^(1+ebits+mbits) */
    unsigned maxenc; /* largest positive finite encoding */
    unsigned nan;    /* canonical NaN the library produces */
    double val[65536];
};

static struct fmt g_fmt[FMT_COUNT];

static double fmt_decode_fields(const struct fmt *f, unsigned enc)
{
    unsigned emask = (1u << f->ebits) - 1, mmask = (1u << f->mbits) - 1;
    unsigned sign = enc >> (f->ebits + f->mbits);
    unsigned e = (enc >> f->mbits) & emask, m = enc & mmask;
    double v;
    if (!f->fn && e == emask)
        v = m == 0 ? INFINITY : NAN;
    else if (f->fn && e == emask && m == mmask)
        v = NAN;
    else if (e == 0)
        v = ldexp((double)m, 1 - f->bias - f->mbits);
    else
        v = ldexp((double)(m + (1u << f->mbits)), (int)e - f->bias - f->mbits);
    return sign ? -v : v;
}

static void fmt_init(struct fmt *f, const char *name, int ebits, int mbits, int bias, int fn)
{
    f->name = name;
    f->ebits = ebits;
    f->mbits = mbits;
    f->bias = bias;
    f->fn = fn;
    f->nenc = 1u << (1 + ebits + mbits);
    unsigned emax = (1u << ebits) - 1;
    f->maxenc = fn ? ((emax << mbits) | ((1u << mbits) - 2)) : ((emax << mbits) - 1);
    f->nan = (f->nenc >> 1) - 1; /* 0x7fff / 0x7f */
    for (unsigned e = 0; e < f->nenc; e++)
        f->val[e] = fmt_decode_fields(f, e);
}

static int is_even_enc(unsigned e)
{
    return (e & 1u) == 0;
}

/*
 * Nearest encoding to x (ties to even). sat: beyond the largest finite value gives it (NVIDIA
 * satfinite, infinities too); otherwise IEEE overflow: |x| >= max + ulp/2 gives infinity.
 */
static unsigned fmt_round(const struct fmt *f, double x, int sat)
{
    if (isnan(x))
        return f->nan;
    unsigned sign = signbit(x) ? f->nenc >> 1 : 0;
    double ax = fabs(x);
    double maxv = f->val[f->maxenc];
    if (ax > maxv) {
        if (sat)
            return f->maxenc | sign;
        double thr = maxv + (maxv - f->val[f->maxenc - 1]) / 2;
        return (ax >= thr ? f->maxenc + 1 : f->maxenc) | sign; /* maxenc + 1 is infinity */
    }
    unsigned lo = 0, hi = f->maxenc; /* val[lo] <= ax <= val[hi] */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (f->val[mid] <= ax)
            lo = mid;
        else
            hi = mid;
    }
    if (f->val[lo] == ax)
        return lo | sign;
    if (f->val[hi] == ax)
        return hi | sign;
    double twice = 2 * ax, sum = f->val[lo] + f->val[hi];
    unsigned r = twice < sum ? lo : twice > sum ? hi : (is_even_enc(lo) ? lo : hi);
    return r | sign;
}

/* NCCL's fp8 result of an exact value: round to fp16, then to fp8 with satfinite. */
static unsigned fp8_from_exact(const struct fmt *f8, double x)
{
    const struct fmt *h = &g_fmt[FMT_F16];
    double hv = h->val[fmt_round(h, x, 0)];
    return fmt_round(f8, hv, 1); /* NaN -> 0x7f, +-inf -> +-max */
}

/* ---- generic element access ----------------------------------------------------------------- */

static int fmt_of(int dtype)
{
    switch (dtype) {
    case WEFT_FLOAT16:
        return FMT_F16;
    case WEFT_BFLOAT16:
        return FMT_BF16;
    case WEFT_FP8E4M3:
        return FMT_E4M3;
    case WEFT_FP8E5M2:
        return FMT_E5M2;
    default:
        return -1;
    }
}

static int is_int(int dtype)
{
    return dtype <= WEFT_UINT64;
}

static int is_signed_int(int dtype)
{
    return dtype == WEFT_INT8 || dtype == WEFT_INT32 || dtype == WEFT_INT64;
}

static size_t esize(int dtype)
{
    static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return s[dtype];
}

static uint64_t load_bits(int dtype, const void *p, size_t i)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)p + i * esize(dtype), esize(dtype));
    return v;
}

static void store_bits(int dtype, void *p, size_t i, uint64_t v)
{
    memcpy((char *)p + i * esize(dtype), &v, esize(dtype));
}

static uint64_t width_mask(int dtype)
{
    size_t s = esize(dtype);
    return s == 8 ? ~0ull : (1ull << (8 * s)) - 1;
}

static __int128 int_value(int dtype, uint64_t bits)
{
    bits &= width_mask(dtype);
    if (is_signed_int(dtype)) {
        unsigned w = (unsigned)(8 * esize(dtype));
        uint64_t top = 1ull << (w - 1);
        if (bits & top)
            return (__int128)bits - ((__int128)1 << w);
    }
    return (__int128)bits;
}

static uint64_t int_bits(int dtype, __int128 v)
{
    return (uint64_t)v & width_mask(dtype); /* two's complement wrap */
}

static double f32_val(uint64_t bits)
{
    uint32_t u = (uint32_t)bits;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t f32_bits(double d)
{
    float f = (float)d;
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static double f64_val(uint64_t bits)
{
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

static uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* Value of a floating element as a double (exact). */
static double fval(int dtype, uint64_t bits)
{
    int fi = fmt_of(dtype);
    if (fi >= 0)
        return g_fmt[fi].val[bits & (g_fmt[fi].nenc - 1)];
    return dtype == WEFT_FLOAT32 ? f32_val(bits) : f64_val(bits);
}

/* Rounds an exact (or double-rounded harmlessly) result to the element type, as the device does. */
static uint64_t fround(int dtype, double x)
{
    switch (dtype) {
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16:
        return fmt_round(&g_fmt[fmt_of(dtype)], x, 0);
    case WEFT_FP8E4M3:
    case WEFT_FP8E5M2:
        return fp8_from_exact(&g_fmt[fmt_of(dtype)], x);
    case WEFT_FLOAT32:
        return isnan(x) ? 0x7fffffffu : f32_bits(x);
    default:
        return isnan(x) ? 0x7fffffffffffffffull : f64_bits(x);
    }
}

static uint64_t canonical_nan(int dtype)
{
    int fi = fmt_of(dtype);
    if (fi >= 0)
        return g_fmt[fi].nan;
    return dtype == WEFT_FLOAT32 ? 0x7fffffffu : 0x7fffffffffffffffull;
}

/*
 * Reference of one binary op. For fp32/fp64 sum and prod the NaN payload is the FPU's choice,
 * so *any_nan_p is set and the caller accepts any NaN.
 */
static uint64_t ref_binary(int dtype, int kind, uint64_t a, uint64_t b, int *any_nan_p)
{
    *any_nan_p = 0;
    if (is_int(dtype)) {
        __int128 x = int_value(dtype, a), y = int_value(dtype, b);
        switch (kind) {
        case WEFT_RED_SUM:
            return int_bits(dtype, x + y);
        case WEFT_RED_PROD:
            if (is_signed_int(dtype))
                return int_bits(dtype, x * y);
            return (uint64_t)((unsigned __int128)x * (unsigned __int128)y) & width_mask(dtype);
        case WEFT_RED_MAX:
            return int_bits(dtype, x > y ? x : y);
        default:
            return int_bits(dtype, x < y ? x : y);
        }
    }
    double x = fval(dtype, a), y = fval(dtype, b);
    if (kind == WEFT_RED_MAX || kind == WEFT_RED_MIN) {
        uint64_t r;
        if (isnan(x) && isnan(y))
            r = canonical_nan(dtype);
        else if (isnan(x))
            r = b;
        else if (isnan(y))
            r = a;
        else if (x == y && x == 0) /* -0 < +0 */
            r = (!!signbit(x) == (kind == WEFT_RED_MAX)) ? b : a;
        else if (kind == WEFT_RED_MAX)
            r = x > y ? a : b;
        else
            r = x < y ? a : b;
        /* fp8: NCCL converts the fp16 max back with satfinite, so e5m2 inf becomes 57344 */
        if (dtype == WEFT_FP8E4M3 || dtype == WEFT_FP8E5M2)
            r = fp8_from_exact(&g_fmt[fmt_of(dtype)], fval(dtype, r));
        return r;
    }
    double r = kind == WEFT_RED_SUM ? x + y : x * y;
    if ((dtype == WEFT_FLOAT32 || dtype == WEFT_FLOAT64) && isnan(r))
        *any_nan_p = 1;
    return fround(dtype, r);
}

/* Integer division truncating toward zero, written without C's signed division. */
static uint64_t ref_div(int dtype, uint64_t a, uint64_t divisor)
{
    if (is_int(dtype)) {
        __int128 x = int_value(dtype, a);
        int neg = x < 0;
        unsigned __int128 q = (unsigned __int128)(neg ? -x : x) / divisor;
        return int_bits(dtype, neg ? -(__int128)q : (__int128)q);
    }
    return fround(dtype, fval(dtype, a) / (double)divisor);
}

static int bits_match(int dtype, uint64_t got, uint64_t want, int any_nan)
{
    if (any_nan && isnan(fval(dtype, got)))
        return 1;
    return (got & width_mask(dtype)) == (want & width_mask(dtype));
}

static void report_values(char *buf, size_t len, int dtype, uint64_t v)
{
    if (is_int(dtype))
        snprintf(buf, len, "%lld/0x%llx", (long long)int_value(dtype, v), (unsigned long long)v);
    else
        snprintf(buf, len, "%.9g/0x%llx", fval(dtype, v), (unsigned long long)v);
}

/* ---- conversions ---------------------------------------------------------------------------- */

typedef float (*to_f32_fn)(uint64_t);
typedef uint64_t (*from_f32_fn)(float);

static float c_h2f(uint64_t v)
{
    return weft_half_to_float((uint16_t)v);
}
static uint64_t c_f2h(float f)
{
    return weft_float_to_half(f);
}
static float c_b2f(uint64_t v)
{
    return weft_bf16_to_float((uint16_t)v);
}
static uint64_t c_f2b(float f)
{
    return weft_float_to_bf16(f);
}
static float c_e4_2f(uint64_t v)
{
    return weft_fp8e4m3_to_float((uint8_t)v);
}
static uint64_t c_f2e4(float f)
{
    return weft_float_to_fp8e4m3(f);
}
static float c_e5_2f(uint64_t v)
{
    return weft_fp8e5m2_to_float((uint8_t)v);
}
static uint64_t c_f2e5(float f)
{
    return weft_float_to_fp8e5m2(f);
}

static void check_conversion_one(const struct fmt *f, from_f32_fn conv, int sat, float x)
{
    unsigned got = (unsigned)conv(x);
    unsigned want = fmt_round(f, (double)x, sat);
    CHECK(got == want, "%s from float %.9g (0x%08x): got 0x%x want 0x%x", f->name, (double)x,
          (unsigned)f32_bits(x), got, want);
}

static void test_conversions(int fi, to_f32_fn to, from_f32_fn from, int sat)
{
    const struct fmt *f = &g_fmt[fi];
    /* every encoding decodes exactly and round-trips */
    for (unsigned e = 0; e < f->nenc; e++) {
        double want = f->val[e];
        float got = to(e);
        if (isnan(want)) {
            CHECK(isnan(got), "%s 0x%x: to float got %g want NaN", f->name, e, (double)got);
            CHECK(from(got) == f->nan, "%s NaN 0x%x: back got 0x%x want 0x%x", f->name, e,
                  (unsigned)from(got), f->nan);
            continue;
        }
        CHECK((double)got == want && !signbit(got) == !signbit(want),
              "%s 0x%x: to float got %.9g want %.9g", f->name, e, (double)got, want);
        unsigned back = (unsigned)from(got);
        unsigned want_back = e;
        if (isinf(want) && sat) /* satfinite: infinities become the largest finite value */
            want_back = f->maxenc | (e & (f->nenc >> 1));
        CHECK(back == want_back, "%s 0x%x: round trip got 0x%x want 0x%x", f->name, e, back,
              want_back);
    }
    /* midpoints between neighbours, and one float ulp either side, both signs */
    for (unsigned e = 0; e < f->maxenc; e++) {
        double lo = f->val[e], hi = f->val[e + 1];
        float mid = (float)((lo + hi) / 2); /* exact: one bit more than the format */
        float pts[3] = {mid, nextafterf(mid, -INFINITY), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++) {
            check_conversion_one(f, from, sat, pts[k]);
            check_conversion_one(f, from, sat, -pts[k]);
        }
    }
    /* around the largest finite value and overflow */
    double maxv = f->val[f->maxenc], ulp = maxv - f->val[f->maxenc - 1];
    float edge[] = {(float)maxv, (float)(maxv + ulp / 2), nextafterf((float)(maxv + ulp / 2), 0),
                    nextafterf((float)(maxv + ulp / 2), INFINITY), (float)(maxv + ulp),
                    (float)(maxv * 4), INFINITY, FLT_MAX, 0.0f, -0.0f, 1e-45f, 1e-40f, 1.0f,
                    NAN, -NAN};
    for (size_t k = 0; k < sizeof(edge) / sizeof(edge[0]); k++) {
        check_conversion_one(f, from, sat, edge[k]);
        check_conversion_one(f, from, sat, -edge[k]);
    }
    /* random float bit patterns over the whole range, and near the format's range */
    for (int k = 0; k < 200000; k++) {
        uint32_t u = (uint32_t)rnd();
        float x;
        memcpy(&x, &u, 4);
        check_conversion_one(f, from, sat, x);
        float y = (float)(f->val[rnd() % (f->maxenc + 1)] * (0.75 + (double)(rnd() % 1000) / 2000));
        check_conversion_one(f, from, sat, y);
    }
}

static void test_conversion_points(void)
{
    /* a few hand-checked values, independent of the tables */
    CHECK(weft_float_to_half(1.0f) == 0x3c00, "half(1)");
    CHECK(weft_float_to_half(65504.0f) == 0x7bff, "half(65504)");
    CHECK(weft_float_to_half(65519.0f) == 0x7bff, "half(65519)");
    CHECK(weft_float_to_half(65520.0f) == 0x7c00, "half(65520) -> inf");
    CHECK(weft_float_to_half(-65520.0f) == 0xfc00, "half(-65520) -> -inf");
    CHECK(weft_float_to_half(5.9604645e-8f) == 0x0001, "half(2^-24)");
    CHECK(weft_float_to_half(2.9802322e-8f) == 0x0000, "half(2^-25) ties to 0");
    CHECK(weft_float_to_half(-2.9802322e-8f) == 0x8000, "half(-2^-25) -> -0");
    CHECK(weft_float_to_half(NAN) == 0x7fff, "half(NaN) canonical");
    CHECK(weft_float_to_half(1.0f + 1.0f / 2048) == 0x3c00, "half tie to even down");
    CHECK(weft_float_to_half(1.0f + 3.0f / 2048) == 0x3c02, "half tie to even up");
    CHECK(weft_float_to_bf16(1.0f + 1.0f / 256) == 0x3f80, "bf16 tie to even down");
    CHECK(weft_float_to_bf16(1.0f + 3.0f / 256) == 0x3f82, "bf16 tie to even up");
    CHECK(weft_float_to_bf16(FLT_MAX) == 0x7f80, "bf16(FLT_MAX) -> inf");
    CHECK(weft_float_to_bf16(-NAN) == 0x7fff, "bf16(NaN) canonical");
    CHECK(weft_float_to_fp8e4m3(448.0f) == 0x7e, "e4m3(448)");
    CHECK(weft_float_to_fp8e4m3(464.0f) == 0x7e, "e4m3(464) ties to 448");
    CHECK(weft_float_to_fp8e4m3(500.0f) == 0x7e, "e4m3(500) satfinite");
    CHECK(weft_float_to_fp8e4m3(-INFINITY) == 0xfe, "e4m3(-inf) satfinite");
    CHECK(weft_float_to_fp8e4m3(NAN) == 0x7f, "e4m3(NaN)");
    CHECK(weft_float_to_fp8e4m3(0.001953125f) == 0x01, "e4m3(2^-9)");
    CHECK(weft_float_to_fp8e4m3(0.0009765625f) == 0x00, "e4m3(2^-10) ties to 0");
    CHECK(weft_float_to_fp8e5m2(57344.0f) == 0x7b, "e5m2(57344)");
    CHECK(weft_float_to_fp8e5m2(61440.0f) == 0x7b, "e5m2(61440) satfinite");
    CHECK(weft_float_to_fp8e5m2(INFINITY) == 0x7b, "e5m2(inf) satfinite");
    CHECK(weft_float_to_fp8e5m2(-NAN) == 0x7f, "e5m2(NaN)");
    CHECK(weft_fp8e4m3_to_float(0x7e) == 448.0f, "e4m3 0x7e");
    CHECK(isnan(weft_fp8e4m3_to_float(0xff)), "e4m3 0xff NaN");
    CHECK(weft_fp8e4m3_to_float(0x78) == 256.0f, "e4m3 0x78 is 256, not inf");
    CHECK(isinf(weft_fp8e5m2_to_float(0xfc)) && weft_fp8e5m2_to_float(0xfc) < 0, "e5m2 -inf");
}

/* ---- binary ops through weft_reduce --------------------------------------------------------- */

static void make_op(struct weft_redop *op, int dtype, int kind)
{
    memset(op, 0, sizeof(*op));
    op->dtype = dtype;
    op->kind = kind;
}

/* Runs a OP b over arrays of bit patterns, checks every element. */
static void check_binary_arrays(int dtype, int kind, const uint64_t *av, const uint64_t *bv,
                                size_t n)
{
    size_t es = esize(dtype);
    char *a = calloc(n + 1, es), *b = calloc(n + 1, es), *d = calloc(n + 1, es);
    for (size_t i = 0; i < n; i++) {
        store_bits(dtype, a, i, av[i]);
        store_bits(dtype, b, i, bv[i]);
    }
    struct weft_redop op;
    make_op(&op, dtype, kind);
    weft_reduce(&op, d, a, b, n, 0);
    for (size_t i = 0; i < n; i++) {
        int any_nan;
        uint64_t want = ref_binary(dtype, kind, av[i], bv[i], &any_nan);
        uint64_t got = load_bits(dtype, d, i);
        if (!bits_match(dtype, got, want, any_nan)) {
            char sa[64], sb[64], sg[64], sw[64];
            report_values(sa, sizeof(sa), dtype, av[i]);
            report_values(sb, sizeof(sb), dtype, bv[i]);
            report_values(sg, sizeof(sg), dtype, got);
            report_values(sw, sizeof(sw), dtype, want);
            CHECK(0, "%s %s [%zu]: %s , %s -> got %s want %s", weft_dtype_name(dtype),
                  kind_names[kind], i, sa, sb, sg, sw);
        } else {
            g_pass++;
        }
    }
    free(a);
    free(b);
    free(d);
}

/* Interesting bit patterns per floating type: zeros, extremes, subnormals, ties, NaN, inf. */
static size_t special_values(int dtype, uint64_t *out)
{
    size_t n = 0;
    int fi = fmt_of(dtype);
    if (fi >= 0) {
        const struct fmt *f = &g_fmt[fi];
        unsigned s = f->nenc >> 1;
        unsigned base[] = {0,
                           1,
                           2,
                           3,
                           (1u << f->mbits) - 1,
                           1u << f->mbits,
                           (1u << f->mbits) + 1,
                           f->maxenc,
                           f->maxenc - 1,
                           f->maxenc + 1, /* inf, or (e4m3) NaN */
                           f->nan,
                           (unsigned)fmt_round(f, 1.0, 0),
                           (unsigned)fmt_round(f, 1.0, 0) + 1,
                           (unsigned)fmt_round(f, 0.5, 0),
                           (unsigned)fmt_round(f, 3.0, 0),
                           (unsigned)fmt_round(f, 1.0 / 3, 0)};
        for (size_t k = 0; k < sizeof(base) / sizeof(base[0]); k++) {
            out[n++] = base[k];
            out[n++] = base[k] | s;
        }
        return n;
    }
    const double vals[] = {0.0, 1.0, 1.5, 3.0, 1.0 / 3, 1e-40, 1e-310, 1e38, 3.4e38, 1.7e308,
                           INFINITY, NAN, 5e-324, 1.401298464324817e-45, 16777217.0};
    for (size_t k = 0; k < sizeof(vals) / sizeof(vals[0]); k++) {
        uint64_t p = dtype == WEFT_FLOAT32 ? f32_bits(vals[k]) : f64_bits(vals[k]);
        uint64_t m = dtype == WEFT_FLOAT32 ? f32_bits(-vals[k]) : f64_bits(-vals[k]);
        out[n++] = p;
        out[n++] = m;
    }
    return n;
}

static uint64_t random_elem(int dtype)
{
    uint64_t r = rnd() & width_mask(dtype);
    /* bias floats toward moderate magnitudes so sums/products round instead of overflowing */
    if (dtype == WEFT_FLOAT32 && (rnd() & 1))
        r = f32_bits((double)(int64_t)(rnd() % 2000001 - 1000000) / (double)(1 + rnd() % 977));
    if (dtype == WEFT_FLOAT64 && (rnd() & 1))
        r = f64_bits((double)(int64_t)(rnd() % 2000001 - 1000000) / (double)(1 + rnd() % 977));
    return r;
}

static void test_binary_ops(void)
{
    static uint64_t av[1 << 16], bv[1 << 16];
    for (int dtype = 0; dtype < WEFT_NUM_DTYPES; dtype++) {
        for (int kind = 0; kind < 4; kind++) {
            size_t n = 0;
            if (dtype == WEFT_FP8E4M3 || dtype == WEFT_FP8E5M2) {
                for (unsigned x = 0; x < 256; x++) /* every pair */
                    for (unsigned y = 0; y < 256; y++, n++) {
                        av[n] = x;
                        bv[n] = y;
                    }
            } else if (dtype == WEFT_INT8 || dtype == WEFT_UINT8) {
                for (unsigned x = 0; x < 256; x++)
                    for (unsigned y = 0; y < 256; y++, n++) {
                        av[n] = x;
                        bv[n] = y;
                    }
            } else {
                uint64_t sp[64];
                size_t ns = 0;
                if (!is_int(dtype)) {
                    ns = special_values(dtype, sp);
                } else {
                    uint64_t m = width_mask(dtype);
                    uint64_t iv[] = {0, 1, 2, m, m - 1, m >> 1, (m >> 1) + 1, 0x10000, 0xffff,
                                     0x100000000ull & m, 12345, 0 - 12345ull};
                    for (size_t k = 0; k < sizeof(iv) / sizeof(iv[0]); k++)
                        sp[ns++] = iv[k] & m;
                }
                for (size_t x = 0; x < ns; x++)
                    for (size_t y = 0; y < ns; y++, n++) {
                        av[n] = sp[x];
                        bv[n] = sp[y];
                    }
                while (n < 40000) {
                    av[n] = random_elem(dtype);
                    bv[n] = random_elem(dtype);
                    n++;
                }
            }
            check_binary_arrays(dtype, kind, av, bv, n);
        }
    }
}

/* Sums chosen so the result needs careful rounding in the small formats. */
static void test_rounding_sums(void)
{
    static uint64_t av[1 << 16], bv[1 << 16];
    for (int fi = FMT_F16; fi <= FMT_BF16; fi++) {
        int dtype = fi == FMT_F16 ? WEFT_FLOAT16 : WEFT_BFLOAT16;
        const struct fmt *f = &g_fmt[fi];
        size_t n = 0;
        /* x + tiny, for x near ties: covers double-rounding hazards, subnormals, overflow */
        for (unsigned e = 0; e + 1 < f->maxenc && n < 60000; e += 1 + (unsigned)(rnd() % 7)) {
            av[n] = e;
            bv[n] = rnd() % (f->maxenc + 1) | (rnd() & 1 ? f->nenc >> 1 : 0);
            n++;
        }
        check_binary_arrays(dtype, WEFT_RED_SUM, av, bv, n);
        check_binary_arrays(dtype, WEFT_RED_PROD, av, bv, n);
    }
}

/* ---- premul, avg, aliasing, alignment ------------------------------------------------------- */

/* Reference for a + premul(b): premul rounded to the type, then the sum. */
static uint64_t ref_premul(int dtype, uint64_t b, uint64_t s, int *any_nan_p)
{
    return ref_binary(dtype, WEFT_RED_PROD, b, s, any_nan_p);
}

static uint64_t ref_premul_sum(int dtype, uint64_t a, uint64_t b, uint64_t s, int *any_nan_p)
{
    int n1;
    uint64_t p = ref_premul(dtype, b, s, &n1);
    uint64_t r = ref_binary(dtype, WEFT_RED_SUM, a, p, any_nan_p);
    *any_nan_p |= n1;
    return r;
}

static void test_premul_all_fp8(void)
{
    /* every value x every scalar, for the scale (a == NULL) and the premul-sum paths */
    for (int dtype = WEFT_FP8E4M3; dtype <= WEFT_FP8E5M2; dtype++) {
        uint8_t b[256], a[256], d[256], d2[256];
        for (unsigned x = 0; x < 256; x++) {
            b[x] = (uint8_t)x;
            a[x] = (uint8_t)rnd();
        }
        for (unsigned s = 0; s < 256; s++) {
            struct weft_redop op;
            make_op(&op, dtype, WEFT_RED_SUM);
            op.premul = 1;
            op.scalar.bytes[0] = (uint8_t)s;
            weft_reduce(&op, d, NULL, b, 256, WEFT_REDUCE_PRE_B);
            weft_reduce(&op, d2, a, b, 256, WEFT_REDUCE_PRE_B);
            for (unsigned x = 0; x < 256; x++) {
                int an;
                uint64_t w = ref_premul(dtype, x, s, &an);
                CHECK(d[x] == w, "%s premul 0x%02x * scalar 0x%02x: got 0x%02x want 0x%02x",
                      weft_dtype_name(dtype), x, s, d[x], (unsigned)w);
                w = ref_premul_sum(dtype, a[x], x, s, &an);
                CHECK(d2[x] == w, "%s 0x%02x + 0x%02x * scalar 0x%02x: got 0x%02x want 0x%02x",
                      weft_dtype_name(dtype), a[x], x, s, d2[x], (unsigned)w);
            }
        }
    }
}

/* PreMulSum with a scalar for every type (integers wrap). */
static void test_premul_sum(void)
{
    for (int dtype = 0; dtype < WEFT_NUM_DTYPES; dtype++) {
        size_t n = 4099, es = esize(dtype);
        char *a = malloc(n * es), *b = malloc(n * es), *d = malloc(n * es);
        uint64_t s = random_elem(dtype);
        if (!is_int(dtype)) /* a finite scalar, like a user's */
            s = fround(dtype, 0.3 + (double)(rnd() % 100) / 10);
        for (size_t i = 0; i < n; i++) {
            store_bits(dtype, a, i, random_elem(dtype));
            store_bits(dtype, b, i, random_elem(dtype));
        }
        struct weft_redop op;
        make_op(&op, dtype, WEFT_RED_SUM);
        op.premul = 1;
        memcpy(op.scalar.bytes, &s, es);
        weft_reduce(&op, d, a, b, n, WEFT_REDUCE_PRE_B);
        for (size_t i = 0; i < n; i++) {
            int an;
            uint64_t w = ref_premul_sum(dtype, load_bits(dtype, a, i), load_bits(dtype, b, i), s,
                                        &an);
            uint64_t g = load_bits(dtype, d, i);
            CHECK(bits_match(dtype, g, w, an),
                  "%s premulsum [%zu] scalar 0x%llx: got 0x%llx want 0x%llx",
                  weft_dtype_name(dtype), i, (unsigned long long)s, (unsigned long long)g,
                  (unsigned long long)w);
        }
        /* without PRE_B the scalar is not applied */
        weft_reduce(&op, d, a, b, n, 0);
        for (size_t i = 0; i < n; i++) {
            int an;
            uint64_t w = ref_binary(dtype, WEFT_RED_SUM, load_bits(dtype, a, i),
                                    load_bits(dtype, b, i), &an);
            CHECK(bits_match(dtype, load_bits(dtype, d, i), w, an), "%s premul flag off [%zu]",
                  weft_dtype_name(dtype), i);
        }
        /* premul with a kind other than sum goes through the chunked path */
        for (int kind = 1; kind < 4; kind++) {
            op.kind = kind;
            weft_reduce(&op, d, a, b, n, WEFT_REDUCE_PRE_B);
            for (size_t i = 0; i < n; i++) {
                int an, an2;
                uint64_t p = ref_premul(dtype, load_bits(dtype, b, i), s, &an);
                uint64_t w = ref_binary(dtype, kind, load_bits(dtype, a, i), p, &an2);
                uint64_t g = load_bits(dtype, d, i);
                /* max/min of fp32/fp64 keep the NaN the premul made */
                CHECK(bits_match(dtype, g, w, an || an2),
                      "%s premul %s [%zu]: got 0x%llx want 0x%llx",
                      weft_dtype_name(dtype), kind_names[kind], i, (unsigned long long)g,
                      (unsigned long long)w);
            }
        }
        free(a);
        free(b);
        free(d);
    }
}

/* ncclAvg as the executors apply it: floats premultiply every input by (T)(1/n), ints divide. */
static void test_avg(void)
{
    static const int nranks_list[] = {1, 2, 3, 5, 8};
    for (int dtype = 0; dtype < WEFT_NUM_DTYPES; dtype++) {
        for (size_t t = 0; t < sizeof(nranks_list) / sizeof(nranks_list[0]); t++) {
            int nr = nranks_list[t];
            size_t n = 1023, es = esize(dtype);
            char *in[8], *acc = malloc(n * es);
            for (int r = 0; r < nr; r++) {
                in[r] = malloc(n * es);
                for (size_t i = 0; i < n; i++) {
                    uint64_t v = random_elem(dtype);
                    if (!is_int(dtype)) /* finite, moderate values */
                        v = fround(dtype, (double)((int)(rnd() % 201) - 100) / 8);
                    store_bits(dtype, in[r], i, v);
                }
            }
            struct weft_redop op;
            make_op(&op, dtype, WEFT_RED_SUM);
            uint64_t s = 0;
            if (is_int(dtype)) {
                op.postdiv = 1;
                op.divisor = (uint64_t)nr;
            } else {
                op.premul = 1;
                weft_dtype_from_double(dtype, 1.0 / nr, op.scalar.bytes);
                memcpy(&s, op.scalar.bytes, es);
                /* (T)(1/n), through float for the small formats */
                int fi = fmt_of(dtype);
                double inv = (double)(float)(1.0 / nr);
                uint64_t want;
                if (dtype == WEFT_FLOAT64)
                    want = f64_bits(1.0 / nr);
                else if (dtype == WEFT_FLOAT32)
                    want = f32_bits(inv);
                else
                    want = fmt_round(&g_fmt[fi], inv, fi >= FMT_E4M3);
                CHECK(s == want,
                      "%s avg scalar for %d ranks: 0x%llx", weft_dtype_name(dtype), nr,
                      (unsigned long long)s);
            }
            /* ring order: first input copied (scaled), then each one reduced into acc */
            weft_reduce(&op, acc, NULL, in[0], n,
                        WEFT_REDUCE_PRE_B | (nr == 1 ? WEFT_REDUCE_POST : 0));
            for (int r = 1; r < nr; r++)
                weft_reduce(&op, acc, acc, in[r], n,
                            WEFT_REDUCE_PRE_B | (r == nr - 1 ? WEFT_REDUCE_POST : 0));
            for (size_t i = 0; i < n; i++) {
                uint64_t w;
                int an = 0, an2;
                if (is_int(dtype)) {
                    __int128 sum = 0;
                    for (int r = 0; r < nr; r++)
                        sum += int_value(dtype, load_bits(dtype, in[r], i));
                    w = ref_div(dtype, int_bits(dtype, sum), (uint64_t)nr);
                } else {
                    w = ref_premul(dtype, load_bits(dtype, in[0], i), s, &an);
                    for (int r = 1; r < nr; r++)
                        w = ref_premul_sum(dtype, w, load_bits(dtype, in[r], i), s, &an2);
                }
                uint64_t g = load_bits(dtype, acc, i);
                CHECK(bits_match(dtype, g, w, 0),
                      "%s avg over %d ranks [%zu]: got 0x%llx want 0x%llx",
                      weft_dtype_name(dtype), nr, i, (unsigned long long)g, (unsigned long long)w);
            }
            for (int r = 0; r < nr; r++)
                free(in[r]);
            free(acc);
        }
    }
}

/* postdiv on floating types (not what NCCL's avg uses, but defined): x / divisor, one rounding */
static void test_postdiv_float(void)
{
    for (int dtype = WEFT_FLOAT16; dtype < WEFT_NUM_DTYPES; dtype++) {
        size_t es = esize(dtype), n = 4096;
        char *x = malloc(n * es), *d = malloc(n * es);
        for (size_t i = 0; i < n; i++)
            store_bits(dtype, x, i, es <= 2 && i < (1u << (8 * es)) ? i : random_elem(dtype));
        for (uint64_t div = 2; div <= 7; div++) {
            struct weft_redop op;
            make_op(&op, dtype, WEFT_RED_SUM);
            op.postdiv = 1;
            op.divisor = div;
            weft_reduce(&op, d, NULL, x, n, WEFT_REDUCE_POST);
            for (size_t i = 0; i < n; i++) {
                uint64_t w = ref_div(dtype, load_bits(dtype, x, i), div);
                uint64_t g = load_bits(dtype, d, i);
                /* fp32/fp64 keep the input NaN's payload */
                int any_nan =
                    (dtype == WEFT_FLOAT32 || dtype == WEFT_FLOAT64) && isnan(fval(dtype, w));
                CHECK(bits_match(dtype, g, w, any_nan),
                      "%s postdiv %llu [%zu]: got 0x%llx want 0x%llx",
                      weft_dtype_name(dtype), (unsigned long long)div, i, (unsigned long long)g,
                      (unsigned long long)w);
            }
        }
        free(x);
        free(d);
    }
}

static void test_int_specifics(void)
{
    struct weft_redop op;
    int8_t a8[4] = {127, -128, -7, 100}, b8[4] = {1, -1, 0, 100}, d8[4];
    make_op(&op, WEFT_INT8, WEFT_RED_SUM);
    weft_reduce(&op, d8, a8, b8, 4, 0);
    CHECK(d8[0] == -128 && d8[1] == 127 && d8[3] == -56, "int8 wrap: %d %d %d", d8[0], d8[1],
          d8[3]);
    op.postdiv = 1;
    op.divisor = 2;
    weft_reduce(&op, d8, a8, b8, 4, WEFT_REDUCE_POST);
    CHECK(d8[0] == -64 && d8[1] == 63 && d8[2] == -3 && d8[3] == -28,
          "int8 avg truncates toward zero: %d %d %d %d", d8[0], d8[1], d8[2], d8[3]);
    /* post without POST flag: no division */
    weft_reduce(&op, d8, a8, b8, 4, 0);
    CHECK(d8[2] == -7, "int8 no POST flag: %d", d8[2]);
    /* a == NULL with POST: copy then divide (one-rank avg path of lane_copy) */
    op.divisor = 3;
    weft_reduce(&op, d8, NULL, a8, 4, WEFT_REDUCE_POST);
    CHECK(d8[0] == 42 && d8[1] == -42 && d8[2] == -2 && d8[3] == 33, "int8 copy+div: %d %d %d %d",
          d8[0], d8[1], d8[2], d8[3]);

    uint8_t ua[2] = {255, 200}, ub[2] = {1, 100}, ud[2];
    make_op(&op, WEFT_UINT8, WEFT_RED_SUM);
    weft_reduce(&op, ud, ua, ub, 2, 0);
    CHECK(ud[0] == 0 && ud[1] == 44, "uint8 wrap: %u %u", ud[0], ud[1]);
    op.kind = WEFT_RED_MAX;
    weft_reduce(&op, ud, ua, ub, 2, 0);
    CHECK(ud[0] == 255 && ud[1] == 200, "uint8 max unsigned order");
    int8_t sa[2] = {-1, -128}, sb[2] = {1, 127}, sd[2];
    make_op(&op, WEFT_INT8, WEFT_RED_MAX);
    weft_reduce(&op, sd, sa, sb, 2, 0);
    CHECK(sd[0] == 1 && sd[1] == 127, "int8 max signed order");
    op.kind = WEFT_RED_MIN;
    weft_reduce(&op, sd, sa, sb, 2, 0);
    CHECK(sd[0] == -1 && sd[1] == -128, "int8 min signed order");

    uint64_t qa[2] = {UINT64_MAX, 1ull << 63}, qb[2] = {1, 1ull << 63}, qd[2];
    make_op(&op, WEFT_UINT64, WEFT_RED_SUM);
    weft_reduce(&op, qd, qa, qb, 2, 0);
    CHECK(qd[0] == 0 && qd[1] == 0, "uint64 wrap");
    op.kind = WEFT_RED_MIN;
    weft_reduce(&op, qd, qa, qb, 2, 0);
    CHECK(qd[0] == 1 && qd[1] == 1ull << 63, "uint64 min unsigned order");
    int64_t la[2] = {INT64_MIN, INT64_MAX}, lb[2] = {-1, 1}, ld[2];
    make_op(&op, WEFT_INT64, WEFT_RED_PROD);
    weft_reduce(&op, ld, la, lb, 2, 0);
    CHECK(ld[0] == INT64_MIN && ld[1] == INT64_MAX, "int64 prod wrap");
    op.kind = WEFT_RED_SUM;
    weft_reduce(&op, ld, la, lb, 2, 0);
    CHECK(ld[0] == INT64_MAX && ld[1] == INT64_MIN, "int64 sum wrap");
    op.postdiv = 1;
    op.divisor = 7;
    int64_t na[1] = {-20}, nb[1] = {-2}, nd[1];
    weft_reduce(&op, nd, na, nb, 1, WEFT_REDUCE_POST);
    CHECK(nd[0] == -3, "int64 avg -22/7 = %lld", (long long)nd[0]);
    int32_t ia[1] = {INT32_MAX}, ib[1] = {1}, id[1];
    make_op(&op, WEFT_INT32, WEFT_RED_SUM);
    weft_reduce(&op, id, ia, ib, 1, 0);
    CHECK(id[0] == INT32_MIN, "int32 wrap");
    uint32_t xa[1] = {65536}, xb[1] = {65536}, xd[1];
    make_op(&op, WEFT_UINT32, WEFT_RED_PROD);
    weft_reduce(&op, xd, xa, xb, 1, 0);
    CHECK(xd[0] == 0, "uint32 prod wrap");
}

static void test_float_specifics(void)
{
    struct weft_redop op;
    float fa[4] = {NAN, 1.0f, 0.0f, -0.0f}, fb[4] = {2.0f, NAN, -0.0f, 0.0f}, fd[4];
    make_op(&op, WEFT_FLOAT32, WEFT_RED_MAX);
    weft_reduce(&op, fd, fa, fb, 4, 0);
    CHECK(fd[0] == 2.0f && fd[1] == 1.0f, "fp32 max ignores NaN: %g %g", (double)fd[0],
          (double)fd[1]);
    CHECK(fd[2] == 0 && !signbit(fd[2]) && !signbit(fd[3]), "fp32 max(+0,-0) = +0");
    op.kind = WEFT_RED_MIN;
    weft_reduce(&op, fd, fa, fb, 4, 0);
    CHECK(signbit(fd[2]) && signbit(fd[3]), "fp32 min(+0,-0) = -0");
    uint16_t ha[3] = {0x7c00, 0x7bff, 0x7e00}, hb[3] = {0xfc00, 0x7bff, 0x3c00}, hd[3];
    make_op(&op, WEFT_FLOAT16, WEFT_RED_SUM);
    weft_reduce(&op, hd, ha, hb, 3, 0);
    CHECK(hd[0] == 0x7fff && hd[1] == 0x7c00 && hd[2] == 0x7fff,
          "fp16 inf-inf=NaN, max+max=inf, NaN+1=NaN: 0x%x 0x%x 0x%x", hd[0], hd[1], hd[2]);
    uint8_t e4a[3] = {0x7e, 0x7f, 0x7e}, e4b[3] = {0x7e, 0x38, 0xfe}, e4d[3];
    make_op(&op, WEFT_FP8E4M3, WEFT_RED_SUM);
    weft_reduce(&op, e4d, e4a, e4b, 3, 0);
    CHECK(e4d[0] == 0x7e && e4d[1] == 0x7f && e4d[2] == 0x00,
          "e4m3 448+448 saturates to 448, NaN+1 = NaN, 448-448 = 0: 0x%x 0x%x 0x%x", e4d[0],
          e4d[1], e4d[2]);
    uint8_t e5a[3] = {0x7c, 0x7b, 0x7c}, e5b[3] = {0x3c, 0x7b, 0xfc}, e5d[3];
    make_op(&op, WEFT_FP8E5M2, WEFT_RED_SUM);
    weft_reduce(&op, e5d, e5a, e5b, 3, 0);
    CHECK(e5d[0] == 0x7b && e5d[1] == 0x7b && e5d[2] == 0x7f,
          "e5m2 inf+1 and max+max saturate, inf-inf = NaN: 0x%x 0x%x 0x%x", e5d[0], e5d[1],
          e5d[2]);
}

/* Aliasing and alignment: dst == a, dst == b, a == b == dst; offsets 0..7; odd counts. */
static void test_alias_align(void)
{
    static const size_t counts[] = {0, 1, 7, 1023};
    for (int dtype = 0; dtype < WEFT_NUM_DTYPES; dtype++) {
        size_t es = esize(dtype);
        for (int kind = 0; kind < 5; kind++) { /* 4 = premul sum */
            for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                size_t n = counts[ci];
                for (int alias = 0; alias < 4; alias++) {
                    size_t off = (size_t)(rnd() % 8);
                    size_t bytes = n * es;
                    unsigned char *abuf = malloc(bytes + 16), *bbuf = malloc(bytes + 16);
                    unsigned char *dbuf = malloc(bytes + 16);
                    uint64_t *av = malloc((n + 1) * 8), *bv = malloc((n + 1) * 8);
                    memset(dbuf, 0xa5, bytes + 16);
                    unsigned char *a = abuf + off, *b = bbuf + ((off + 3) % 8);
                    unsigned char *d = dbuf + ((off + 5) % 8);
                    for (size_t i = 0; i < n; i++) {
                        av[i] = random_elem(dtype);
                        bv[i] = alias == 3 ? av[i] : random_elem(dtype);
                        store_bits(dtype, a, i, av[i]);
                        store_bits(dtype, b, i, bv[i]);
                    }
                    struct weft_redop op;
                    make_op(&op, dtype, kind == 4 ? WEFT_RED_SUM : kind);
                    uint64_t s = is_int(dtype) ? 3 : fround(dtype, 0.75);
                    if (kind == 4) {
                        op.premul = 1;
                        memcpy(op.scalar.bytes, &s, es);
                    }
                    int flags = kind == 4 ? WEFT_REDUCE_PRE_B : 0;
                    void *dst = d;
                    const void *pa = a, *pb = b;
                    if (alias == 1)
                        dst = a; /* dst == a */
                    else if (alias == 2)
                        dst = b; /* dst == b */
                    else if (alias == 3) { /* all three */
                        dst = a;
                        pa = pb = a;
                    }
                    weft_reduce(&op, dst, pa, pb, n, flags);
                    for (size_t i = 0; i < n; i++) {
                        int an;
                        uint64_t w = kind == 4 ? ref_premul_sum(dtype, av[i], bv[i], s, &an)
                                               : ref_binary(dtype, kind, av[i], bv[i], &an);
                        uint64_t g = load_bits(dtype, dst, i);
                        CHECK(bits_match(dtype, g, w, an),
                              "%s %s alias %d n %zu off %zu [%zu]: got 0x%llx want 0x%llx",
                              weft_dtype_name(dtype), kind == 4 ? "premulsum" : kind_names[kind],
                              alias, n, off, i, (unsigned long long)g, (unsigned long long)w);
                    }
                    if (alias == 0) { /* nothing written outside dst */
                        int clean = 1;
                        for (unsigned char *p = dbuf; p < d; p++)
                            clean &= *p == 0xa5;
                        for (unsigned char *p = d + bytes; p < dbuf + bytes + 16 - 8; p++)
                            clean &= *p == 0xa5;
                        CHECK(clean, "%s %s n %zu: bytes written outside dst",
                              weft_dtype_name(dtype), kind < 4 ? kind_names[kind] : "premulsum",
                              n);
                    }
                    free(abuf);
                    free(bbuf);
                    free(dbuf);
                    free(av);
                    free(bv);
                }
            }
        }
    }
}

static void test_misc(void)
{
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    for (int t = 0; t < WEFT_NUM_DTYPES; t++)
        CHECK(weft_dtype_size(t) == sizes[t], "size of %d", t);
    CHECK(weft_dtype_size(-1) == 0 && weft_dtype_size(WEFT_NUM_DTYPES) == 0, "invalid size");
    CHECK(strcmp(weft_dtype_name(WEFT_BFLOAT16), "bfloat16") == 0, "bf16 name");
    CHECK(strcmp(weft_dtype_name(WEFT_FP8E4M3), "f8e4m3") == 0, "e4m3 name");
    unsigned char buf[8];
    weft_dtype_from_double(WEFT_INT8, 300.0, buf);
    CHECK((int8_t)buf[0] == 127, "int8 from 300 saturates");
    weft_dtype_from_double(WEFT_INT32, -2.7, buf);
    int32_t i32;
    memcpy(&i32, buf, 4);
    CHECK(i32 == -2, "int32 from -2.7 truncates");
    weft_dtype_from_double(WEFT_FLOAT16, 1.0 / 3, buf);
    CHECK(buf[0] == 0x55 && buf[1] == 0x35, "half(1/3) = 0x3555");
    weft_dtype_from_double(WEFT_FP8E4M3, 1.0 / 3, buf);
    CHECK(buf[0] == 0x2b, "e4m3(1/3) = 0x2b: 0x%x", buf[0]);
    /* a == NULL and no transform: plain copy, also onto itself */
    struct weft_redop op;
    make_op(&op, WEFT_FLOAT32, WEFT_RED_SUM);
    float src[3] = {1, 2, 3}, dst[3] = {0, 0, 0};
    weft_reduce(&op, dst, NULL, src, 3, WEFT_REDUCE_PRE_B | WEFT_REDUCE_POST);
    CHECK(dst[0] == 1 && dst[2] == 3, "copy");
    weft_reduce(&op, src, NULL, src, 3, 0);
    CHECK(src[1] == 2, "copy onto itself");
}

int main(void)
{
    fmt_init(&g_fmt[FMT_F16], "half", 5, 10, 15, 0);
    fmt_init(&g_fmt[FMT_BF16], "bfloat16", 8, 7, 127, 0);
    fmt_init(&g_fmt[FMT_E4M3], "f8e4m3", 4, 3, 7, 1);
    fmt_init(&g_fmt[FMT_E5M2], "f8e5m2", 5, 2, 15, 0);

    test_conversion_points();
    test_conversions(FMT_F16, c_h2f, c_f2h, 0);
    test_conversions(FMT_BF16, c_b2f, c_f2b, 0);
    test_conversions(FMT_E4M3, c_e4_2f, c_f2e4, 1);
    test_conversions(FMT_E5M2, c_e5_2f, c_f2e5, 1);
    /* every weft_reduce test runs on each host code path this CPU has */
    static const int isas[] = {WEFT_REDUCE_ISA_GENERIC, WEFT_REDUCE_ISA_AVX2};
    for (size_t k = 0; k < sizeof(isas) / sizeof(isas[0]); k++) {
        if (weft_reduce_set_isa(isas[k]) != 0) {
            printf("isa %d: not available in this build or on this CPU, skipped\n", isas[k]);
            continue;
        }
        unsigned long failed_before = g_fail;
        test_binary_ops();
        test_rounding_sums();
        test_premul_all_fp8();
        test_premul_sum();
        test_avg();
        test_postdiv_float();
        test_int_specifics();
        test_float_specifics();
        test_alias_align();
        test_misc();
        printf("isa %s: %lu failures\n", weft_reduce_isa_name(), g_fail - failed_before);
    }
    CHECK(weft_reduce_set_isa(WEFT_REDUCE_ISA_AUTO) == 0, "auto isa");
    CHECK(weft_reduce_set_isa(99) == -1, "unknown isa refused");

    printf("%lu passed, %lu failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
}
