/*
 * Host reduction throughput: weft_reduce() against memcpy, for 1 MiB (cache-resident) and 64 MiB
 * (memory-bound) arrays. Run with `meson test -C build --benchmark redop` or directly;
 * --float runs only the float sums, --generic forces the baseline (non-AVX2) code path.
 *
 * Columns: "in GB/s" is bytes of one input array per second (what a collective's algbw sees);
 * "mem GB/s" counts every byte read and written (reduce: 2 reads + 1 write; memcpy: 1 + 1).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redop.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct bench_case {
    const char *label;
    int dtype;
    int kind;
    int premul;
    int inplace;
};

static void *alloc_filled(size_t bytes, unsigned seed)
{
    unsigned char *p = aligned_alloc(64, bytes);
    if (p == NULL) {
        fprintf(stderr, "bench_redop: out of memory\n");
        exit(1);
    }
    /* small values, so float-like types stay finite through repeated in-place sums */
    for (size_t i = 0; i < bytes; i++)
        p[i] = (unsigned char)(((i * 2654435761u) >> 13) + seed) & 0x3b;
    return p;
}

/* Seconds per call, repeating until about 0.25 s has passed (at least 3 calls). */
static double time_calls(const struct bench_case *c, void *d, const void *a, const void *b,
                         size_t count, size_t bytes)
{
    struct weft_redop op;
    memset(&op, 0, sizeof(op));
    if (c != NULL) {
        op.dtype = c->dtype;
        op.kind = c->kind;
        op.premul = c->premul;
        weft_dtype_from_double(c->dtype, 0.5, op.scalar.bytes);
    }
    int iters = 0;
    double t0 = now(), t;
    do {
        if (c == NULL)
            memcpy(d, b, bytes);
        else
            weft_reduce(&op, d, c->inplace ? d : a, b, count,
                        c->premul ? WEFT_REDUCE_PRE_B : 0);
        iters++;
        t = now() - t0;
    } while (t < 0.25 || iters < 3);
    return t / iters;
}

int main(int argc, char **argv)
{
    static const struct bench_case cases[] = {
        {"float sum", WEFT_FLOAT32, WEFT_RED_SUM, 0, 0},
        {"float sum in-place", WEFT_FLOAT32, WEFT_RED_SUM, 0, 1},
        {"float max", WEFT_FLOAT32, WEFT_RED_MAX, 0, 0},
        {"float premulsum", WEFT_FLOAT32, WEFT_RED_SUM, 1, 0},
        {"double sum", WEFT_FLOAT64, WEFT_RED_SUM, 0, 0},
        {"int32 sum", WEFT_INT32, WEFT_RED_SUM, 0, 0},
        {"int8 sum", WEFT_INT8, WEFT_RED_SUM, 0, 0},
        {"half sum", WEFT_FLOAT16, WEFT_RED_SUM, 0, 0},
        {"half premulsum", WEFT_FLOAT16, WEFT_RED_SUM, 1, 0},
        {"bfloat16 sum", WEFT_BFLOAT16, WEFT_RED_SUM, 0, 0},
        {"f8e4m3 sum", WEFT_FP8E4M3, WEFT_RED_SUM, 0, 0},
        {"f8e5m2 sum", WEFT_FP8E5M2, WEFT_RED_SUM, 0, 0},
    };
    static const size_t sizes[] = {1u << 20, 64u << 20};
    int only_float = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--float") == 0) {
            only_float = 1;
        } else if (strcmp(argv[i], "--generic") == 0) {
            weft_reduce_set_isa(WEFT_REDUCE_ISA_GENERIC);
        } else {
            fprintf(stderr, "usage: %s [--float] [--generic]\n", argv[0]);
            return 2;
        }
    }

    printf("code path: %s\n", weft_reduce_isa_name());
    printf("%-22s %10s %12s %10s %10s\n", "case", "bytes", "us/call", "in GB/s", "mem GB/s");
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        size_t bytes = sizes[si];
        void *a = alloc_filled(bytes, 1), *b = alloc_filled(bytes, 2), *d = alloc_filled(bytes, 3);
        double t = time_calls(NULL, d, a, b, 0, bytes);
        printf("%-22s %10zu %12.1f %10.2f %10.2f\n", "memcpy", bytes, t * 1e6, bytes / t / 1e9,
               2.0 * bytes / t / 1e9);
        size_t ncases = only_float ? 2 : sizeof(cases) / sizeof(cases[0]);
        for (size_t ci = 0; ci < ncases; ci++) {
            const struct bench_case *c = &cases[ci];
            size_t count = bytes / weft_dtype_size(c->dtype);
            memcpy(d, a, bytes);
            t = time_calls(c, d, a, b, count, bytes);
            printf("%-22s %10zu %12.1f %10.2f %10.2f\n", c->label, bytes, t * 1e6, bytes / t / 1e9,
                   3.0 * bytes / t / 1e9);
        }
        free(a);
        free(b);
        free(d);
    }
    return 0;
}
