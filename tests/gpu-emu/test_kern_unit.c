/*
 * Kernel unit tests of the CUDA executor, for the emulated GPU (WEFT_CUDA=emu:1, suite gpu-emu)
 * and a real one (tests/gpu/run.sh, stage kunit): ranks are threads of this process (on one
 * device where there is one; ncclCommInitAll's choice otherwise).
 * The protocol is NCCL_PROTO's (LL, Simple; unset: LL up to WEFT_CUDA_LL_MAX_BYTES).
 *
 * Usage: test_kern_unit CASE [-f] [-s]
 *   rules     the LL rules of kernels/dev_ll.h on the host (flags, cleanup, layout; the wrap
 *             simulation with 8-bit flags)
 *   redop     2 ranks: all-reduce of random bits, every type x {sum, prod, max, min, avg,
 *             PreMulSum}, 4099 and 65541 elements; the device result must be bit-equal to the
 *             host reduction (kernels/redop.h) of the same inputs (both NaN counts as equal: the
 *             GPU's NaN bits may differ from the host's)
 *   loopback  a rank sending to itself, and 2 ranks, int8 at 0, 1, 15, 16, 4095, 1 MiB + 7 and
 *             8 MiB + 3 bytes (-f: 64 MiB instead of 8 MiB + 3, as on a GPU; -s: up to 1 MiB + 7,
 *             for the sanitizers)
 *   wrap      the kernel built with 8-bit LL flags and late data lines (kern_unit_f8.cc), 64-byte
 *             LL slots: 2 ranks, send/recv both ways and all-reduce of varying sizes over > 1024
 *             LL steps of every connection, so the flags wrap several times and the cleanup
 *             runs; checked each time (without the cleanup, stale lines come through)
 *   abort     rank 0 of 2 receives alone (1 KiB and 1 MiB): ncclCommAbort ends its kernel within
 *             1 s and the error names peer 1
 *   deadline  the same with WEFT_TIMEOUT=2 and no abort: ncclRemoteError naming peer 1
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/elem.h"
#include "cuda/cuda_ops.h"
#include "emu_check.h"
#include "dev_ll.h"
#include "exec/cuda.h"
#include "kern_unit.h"
#include "nccl.h"
#include "redop.h"

static const struct weft_cuda_ops *cu;
static int g_full, g_small, g_passed, g_failed;

static void tally(int ok, const char *what)
{
    if (ok) {
        g_passed++;
    } else {
        g_failed++;
        fprintf(stderr, "FAIL %s\n", what);
    }
}

/* ---- communicators: n ranks on device 0, a stream each ----------------------------------- */

#define MAXR 2
static ncclComm_t g_comms[MAXR];
static cudaStream_t g_streams[MAXR];

static int comms_init(int n)
{
    CU(cu->set_device(0));
    for (int r = 0; r < n; r++)
        CU(cu->stream_create((weft_cuda_stream_t *)&g_streams[r]));
    return check(ncclCommInitAll(g_comms, n, NULL), "ncclCommInitAll");
}

static void comms_free(int n, int destroy)
{
    for (int r = 0; r < n; r++) {
        if (g_comms[r] != NULL) {
            if (destroy)
                check(ncclCommDestroy(g_comms[r]), "ncclCommDestroy");
            else
                ncclCommAbort(g_comms[r]);
        }
        g_comms[r] = NULL;
        CU(cu->stream_destroy(g_streams[r]));
    }
}

static int sync_all(int n)
{
    int ok = 1;
    for (int r = 0; r < n; r++) {
        CU(cu->stream_synchronize(g_streams[r]));
        ncclResult_t a = ncclSuccess;
        ok &= check(ncclCommGetAsyncError(g_comms[r], &a), "ncclCommGetAsyncError") &&
              check(a, "the kernel");
    }
    return ok;
}

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CU(cu->malloc(&p, bytes > 0 ? bytes : 1));
    return p;
}

static void to_dev(void *d, const void *h, size_t bytes)
{
    if (bytes == 0)
        return;
    CU(cu->memcpy_async(d, h, bytes, NULL));
    CU(cu->stream_synchronize(NULL));
}

static void from_dev(void *h, const void *d, size_t bytes)
{
    if (bytes == 0)
        return;
    CU(cu->memcpy_async(h, d, bytes, NULL));
    CU(cu->stream_synchronize(NULL));
}

/* ---- rules ----------------------------------------------------------------------------------- */

static int case_rules(void)
{
    /* The default width: flags 1 .. 2^31, cleanup in the last 8 steps of each 2^30. */
    tally(weft_ll_flag(0) == 1 && weft_ll_flag(0x7fffffffull) == 0x80000000u &&
              weft_ll_flag(0x80000000ull) == 1 && weft_ll_flag(0x180000005ull) == 6,
          "rules: flag values");
    tally(!weft_ll_cleanup(0) && !weft_ll_cleanup(0x3ffffff7ull) && weft_ll_cleanup(0x3ffffff8ull) &&
              weft_ll_cleanup(0x3fffffffull) && !weft_ll_cleanup(0x40000000ull) &&
              weft_ll_cleanup(0x7ffffffcull) && weft_ll_cleanup(0xbffffff8ull),
          "rules: cleanup steps");
    uint64_t h = weft_ll_half(0xdeadbeefu, 77);
    tally(weft_ll_half_ok(h, 77) && !weft_ll_half_ok(h, 78) && weft_ll_half_data(h) == 0xdeadbeefu,
          "rules: half encode/decode");
    tally(weft_ll_data_lines(0) == 0 && weft_ll_data_lines(1) == 1 && weft_ll_data_lines(8) == 1 &&
              weft_ll_data_lines(9) == 2 && weft_ll_slot_bytes(16384) == 16 * (1 + 2048),
          "rules: line counts");
    /* Layout: the LL blocks follow the Simple FIFOs, the LL heads follow them, nothing overlaps,
     * every line stays aligned. */
    int nranks = 3, nconn = 3;
    size_t sb = 65536, pl = 16384;
    int ok = weft_dev_ll_recv_off(0, 0, nranks, nconn, sb, pl) ==
             weft_dev_fifo_bytes(nranks, nconn, sb);
    ok &= weft_dev_ll_recv_off(1, 2, nranks, nconn, sb, pl) -
              weft_dev_ll_recv_off(1, 1, nranks, nconn, sb, pl) ==
          weft_dev_ll_block_bytes(pl);
    ok &= weft_dev_ll_head_off(0, 0, nranks, nconn, sb, pl) ==
          weft_dev_ll_recv_off(nconn - 1, nranks - 1, nranks, nconn, sb, pl) +
              weft_dev_ll_block_bytes(pl);
    ok &= weft_dev_all_fifo_bytes(nranks, nconn, sb, pl) ==
          weft_dev_ll_head_off(nconn - 1, nranks - 1, nranks, nconn, sb, pl) +
              sizeof(struct weft_dev_send_ctrl);
    ok &= weft_dev_ll_block_bytes(48) % WEFT_LL_LINE == 0; /* lines stay 16-byte aligned */
    tally(ok, "rules: layout");
    int bad = kern_unit_rules_f8();
    g_failed += bad;
    g_passed += bad == 0;
    return 0;
}

/* ---- redop: device all-reduce vs the host reduction -------------------------------------------- */

/* 1 when element i of type t is a NaN. */
static int is_nan(int t, const void *p, size_t i)
{
    switch (t) {
    case ncclFloat16: return (((const uint16_t *)p)[i] & 0x7fff) > 0x7c00;
    case ncclBfloat16: return (((const uint16_t *)p)[i] & 0x7fff) > 0x7f80;
    case ncclFloat8e4m3: return (((const uint8_t *)p)[i] & 0x7f) == 0x7f;
    case ncclFloat8e5m2: return (((const uint8_t *)p)[i] & 0x7f) > 0x7c;
    case ncclFloat32: return isnan(((const float *)p)[i]);
    case ncclFloat64: return isnan(((const double *)p)[i]);
    default: return 0;
    }
}

enum { R_SUM, R_PROD, R_MAX, R_MIN, R_AVG, R_PREMUL, R_COUNT };
static const char *const r_names[R_COUNT] = {"sum", "prod", "max", "min", "avg", "premulsum"};

/* The host redop of op r for rank `rank` of 2 (the scalar for PreMulSum: 1.5 and -0.75). */
static void host_op(struct weft_redop *o, int t, int r, int rank)
{
    memset(o, 0, sizeof(*o));
    o->dtype = t;
    o->kind = r == R_PROD ? WEFT_RED_PROD : r == R_MAX ? WEFT_RED_MAX : r == R_MIN ? WEFT_RED_MIN
                                                                                   : WEFT_RED_SUM;
    int fl = t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
             t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
    if (r == R_AVG && fl) {
        o->premul = 1;
        weft_dtype_from_double(t, 0.5, o->scalar.bytes);
    } else if (r == R_AVG) {
        o->postdiv = 1;
        o->divisor = 2;
    } else if (r == R_PREMUL) {
        o->premul = 1;
        weft_dtype_from_double(t, rank == 0 ? 1.5 : -0.75, o->scalar.bytes);
    }
}

static int case_redop(void)
{
    if (!comms_init(2))
        return 1;
    static const size_t counts[] = {4099, 65541};
    size_t maxb = 65541 * 8;
    char *din[2], *dout[2], *hin[2], *hout = malloc(maxb), *ref = malloc(maxb),
                                     *tmp = malloc(maxb);
    for (int r = 0; r < 2; r++) {
        din[r] = dmalloc(maxb);
        dout[r] = dmalloc(maxb);
        hin[r] = malloc(maxb);
    }
    uint64_t seed = 1;
    for (int t = 0; t < WEFT_NUM_DTYPES; t++) {
        size_t es = weft_dtype_size(t);
        for (int r = 0; r < R_COUNT; r++) {
            for (size_t ci = 0; ci < 2; ci++) {
                size_t n = counts[ci], bytes = n * es;
                for (int k = 0; k < 2; k++) {
                    for (size_t i = 0; i < bytes; i++)
                        hin[k][i] = (char)(mix(seed++) >> 24);
                    to_dev(din[k], hin[k], bytes);
                }
                ncclRedOp_t ops[2] = {ncclSum, ncclSum};
                for (int k = 0; k < 2; k++) {
                    if (r == R_PREMUL) {
                        struct weft_redop o;
                        host_op(&o, t, r, k);
                        check(ncclRedOpCreatePreMulSum(&ops[k], o.scalar.bytes,
                                                       (ncclDataType_t)t,
                                                       ncclScalarHostImmediate, g_comms[k]),
                              "ncclRedOpCreatePreMulSum");
                    } else {
                        ops[k] = r == R_SUM ? ncclSum : r == R_PROD ? ncclProd : r == R_MAX
                                     ? ncclMax : r == R_MIN ? ncclMin : ncclAvg;
                    }
                }
                check(ncclGroupStart(), "ncclGroupStart");
                for (int k = 0; k < 2; k++)
                    check(ncclAllReduce(din[k], dout[k], n, (ncclDataType_t)t, ops[k],
                                        g_comms[k], g_streams[k]), "ncclAllReduce");
                check(ncclGroupEnd(), "ncclGroupEnd");
                int ok = sync_all(2);
                if (r == R_PREMUL)
                    for (int k = 0; k < 2; k++)
                        ncclRedOpDestroy(ops[k], g_comms[k]);
                /* ref = pre0(in0) OP pre1(in1), then post */
                struct weft_redop o0, o1;
                host_op(&o0, t, r, 0);
                host_op(&o1, t, r, 1);
                weft_reduce(&o0, tmp, NULL, hin[0], n, WEFT_REDUCE_PRE_B);
                weft_reduce(&o1, ref, tmp, hin[1], n, WEFT_REDUCE_PRE_B | WEFT_REDUCE_POST);
                for (int k = 0; k < 2 && ok; k++) {
                    from_dev(hout, dout[k], bytes);
                    for (size_t i = 0; i < n; i++) {
                        if (memcmp(hout + i * es, ref + i * es, es) == 0 ||
                            (is_nan(t, hout, i) && is_nan(t, ref, i)))
                            continue;
                        uint64_t g = 0, w = 0;
                        memcpy(&g, hout + i * es, es);
                        memcpy(&w, ref + i * es, es);
                        fprintf(stderr, "FAIL redop %s %s n %zu rank %d index %zu: got 0x%llx "
                                "want 0x%llx\n", weft_dtype_name(t), r_names[r], n, k, i,
                                (unsigned long long)g, (unsigned long long)w);
                        ok = 0;
                        break;
                    }
                }
                if (ok)
                    g_passed++;
                else
                    g_failed++;
            }
        }
    }
    for (int r = 0; r < 2; r++) {
        CU(cu->free(din[r]));
        CU(cu->free(dout[r]));
        free(hin[r]);
    }
    free(hout);
    free(ref);
    free(tmp);
    comms_free(2, 1);
    return 0;
}

/* ---- loopback -------------------------------------------------------------------------------- */

/* n = 1: rank 0 sends to itself; n = 2: rank 0 sends to rank 1 and rank 1 to rank 0. */
static int loop_one(int n, size_t bytes, char *dsend[], char *drecv[], char *h, char *g)
{
    for (int r = 0; r < n; r++) {
        for (size_t i = 0; i < bytes; i++)
            h[i] = (char)(mix(i * 2 + (uint64_t)r + bytes) >> 40);
        to_dev(dsend[r], h, bytes);
        CU(cu->memset_async(drecv[r], 0x5a, bytes > 0 ? bytes : 1, NULL));
    }
    CU(cu->stream_synchronize(NULL));
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < n; r++) {
        int peer = (r + 1) % n;
        /* the receive first: the block must not wait inside it while its send is queued */
        check(ncclRecv(drecv[r], bytes, ncclInt8, peer, g_comms[r], g_streams[r]), "ncclRecv");
        check(ncclSend(dsend[r], bytes, ncclInt8, peer, g_comms[r], g_streams[r]), "ncclSend");
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    int ok = sync_all(n);
    for (int r = 0; r < n && ok; r++) {
        int from = (r + n - 1) % n;
        for (size_t i = 0; i < bytes; i++)
            h[i] = (char)(mix(i * 2 + (uint64_t)from + bytes) >> 40);
        from_dev(g, drecv[r], bytes);
        for (size_t i = 0; i < bytes; i++) {
            if (g[i] != h[i]) {
                fprintf(stderr, "FAIL loopback %d rank(s) %zu bytes: rank %d byte %zu got %d "
                        "want %d\n", n, bytes, r, i, g[i], h[i]);
                ok = 0;
                break;
            }
        }
    }
    return ok;
}

static int case_loopback(void)
{
    size_t sizes[] = {0, 1, 15, 16, 4095, (1u << 20) + 7, g_full ? (64u << 20) : (8u << 20) + 3};
    int ns = (int)(sizeof(sizes) / sizeof(sizes[0])) - g_small;
    size_t maxb = sizes[ns - 1];
    char *h = malloc(maxb), *g = malloc(maxb);
    for (int n = 1; n <= 2; n++) {
        if (!comms_init(n))
            return 1;
        char *ds[2], *dr[2];
        for (int r = 0; r < n; r++) {
            ds[r] = dmalloc(maxb);
            dr[r] = dmalloc(maxb);
        }
        for (int i = 0; i < ns; i++) {
            double t0 = now_s();
            int ok = loop_one(n, sizes[i], ds, dr, h, g);
            printf("loopback %d rank%s %zu bytes: %s in %.3f s\n", n, n > 1 ? "s" : "", sizes[i],
                   ok ? "ok" : "FAILED", now_s() - t0);
            tally(ok, "loopback");
        }
        for (int r = 0; r < n; r++) {
            CU(cu->free(ds[r]));
            CU(cu->free(dr[r]));
        }
        comms_free(n, 1);
    }
    free(h);
    free(g);
    return 0;
}

/* ---- wrap: 8-bit LL flags ---------------------------------------------------------------------- */

static int case_wrap(void)
{
    const char *proto = getenv("NCCL_PROTO");
    if (proto != NULL && strcmp(proto, "LL") != 0) {
        printf("SKIP wrap: NCCL_PROTO=%s (the case needs LL)\n", proto);
        return 77;
    }
    /* 64-byte LL slots: a few hundred bytes are several steps. Before the first communicator,
     * which loads the knob. */
    setenv("WEFT_CUDA_LL_SLOT_BYTES", "64", 0);
    setenv("WEFT_CUDA_CHANNELS", "1", 0);
    const void *dev_fn = weft_coll_kernel_device_fn_f8 != NULL ? weft_coll_kernel_device_fn_f8()
                                                               : NULL;
    if (strcmp(cu->name, "emu") != 0 && dev_fn == NULL) {
        printf("SKIP wrap: no GPU build of the 8-bit-flag kernel in this binary\n");
        return 77;
    }
    weft_cuda_test_kernel(weft_coll_kernel_emu_f8, dev_fn);
    int ok = comms_init(2);
    weft_cuda_test_kernel(NULL, NULL);
    if (!ok)
        return 1;
    /* Every send is one LL step (at most 64 bytes), so send i is step i of its connection. Sends
     * 5, 261, 517, ... fill their slot; the others use at most one data line. So lines 2 .. 8 of
     * that slot hold the flag of step 5 when step 261 (the same flag) arrives: without the
     * cleanup, a receiver reading them before the (late) data lines takes them as fresh. */
    enum { MAXB = 64, PAIRS = 12, ITERS = 100 };
    char *ds[2], *dr[2];
    float *da[2];
    char *h = malloc(MAXB * PAIRS), *g = malloc(MAXB * PAIRS);
    float *ha = malloc(256 * sizeof(float)), *ga = malloc(256 * sizeof(float));
    for (int r = 0; r < 2; r++) {
        ds[r] = dmalloc(MAXB * PAIRS);
        dr[r] = dmalloc(MAXB * PAIRS);
        da[r] = dmalloc(256 * sizeof(float));
    }
    uint64_t steps = 0; /* LL steps of the connection 0 -> 1 (point-to-point channel) */
    for (int it = 0; it < ITERS && ok; it++) {
        size_t sz[PAIRS];
        for (int p = 0; p < PAIRS; p++) {
            int i = it * PAIRS + p;
            sz[p] = i % 256 == 5 ? 64 : 1 + (size_t)(i % 8);
            steps++;
        }
        for (int r = 0; r < 2; r++) {
            for (int p = 0; p < PAIRS; p++)
                for (size_t i = 0; i < sz[p]; i++)
                    h[p * MAXB + i] = (char)(mix(((uint64_t)it << 32) + (uint64_t)(p * MAXB) + i +
                                                 (uint64_t)r * 7777) >> 40);
            to_dev(ds[r], h, MAXB * PAIRS);
            for (int i = 0; i < 256; i++)
                ha[i] = (float)(r + 1) * (float)(i + it);
            to_dev(da[r], ha, 256 * sizeof(float));
        }
        size_t acount = (size_t)(it % 7) * 37;
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < 2; r++) {
            for (int p = 0; p < PAIRS; p++) {
                check(ncclRecv(dr[r] + p * MAXB, sz[p], ncclInt8, 1 - r, g_comms[r], g_streams[r]),
                      "ncclRecv");
                check(ncclSend(ds[r] + p * MAXB, sz[p], ncclInt8, 1 - r, g_comms[r], g_streams[r]),
                      "ncclSend");
            }
            check(ncclAllReduce(da[r], da[r], acount, ncclFloat32, ncclSum, g_comms[r],
                                g_streams[r]), "ncclAllReduce");
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        ok = sync_all(2);
        for (int r = 0; r < 2 && ok; r++) {
            int from = 1 - r;
            from_dev(g, dr[r], MAXB * PAIRS);
            for (int p = 0; p < PAIRS && ok; p++)
                for (size_t i = 0; i < sz[p]; i++) {
                    char want = (char)(mix(((uint64_t)it << 32) + (uint64_t)(p * MAXB) + i +
                                           (uint64_t)from * 7777) >> 40);
                    if (g[p * MAXB + i] != want) {
                        fprintf(stderr, "FAIL wrap: iteration %d pair %d rank %d byte %zu of "
                                "%zu: got %d want %d\n", it, p, r, i, sz[p], g[p * MAXB + i],
                                want);
                        ok = 0;
                        break;
                    }
                }
            from_dev(ga, da[r], 256 * sizeof(float));
            for (size_t i = 0; i < acount && ok; i++)
                if (ga[i] != 3.0f * (float)((int)i + it)) {
                    fprintf(stderr, "FAIL wrap: iteration %d all-reduce rank %d [%zu] = %g, "
                            "want %g\n", it, r, i, ga[i], 3.0f * (float)((int)i + it));
                    ok = 0;
                }
        }
    }
    printf("wrap: %llu LL steps on each point-to-point connection (flags wrap every 256): %s\n",
           (unsigned long long)steps, ok ? "ok" : "FAILED");
    tally(ok && steps > 1024, "wrap");
    for (int r = 0; r < 2; r++) {
        CU(cu->free(ds[r]));
        CU(cu->free(dr[r]));
        CU(cu->free(da[r]));
    }
    free(h);
    free(g);
    free(ha);
    free(ga);
    comms_free(2, 1);
    return 0;
}

/* ---- abort and deadline ---------------------------------------------------------------------- */

/* Rank 0 of 2 receives `bytes` from rank 1, which never sends. */
static char *lonely_recv(size_t bytes)
{
    if (!comms_init(2))
        return NULL;
    char *d = dmalloc(bytes);
    if (!check(ncclRecv(d, bytes, ncclInt8, 1, g_comms[0], g_streams[0]), "ncclRecv"))
        return NULL;
    return d;
}

static int case_abort(void)
{
    size_t sizes[] = {1024, 1 << 20};
    for (int i = 0; i < 2; i++) {
        char *d = lonely_recv(sizes[i]);
        if (d == NULL)
            return 1;
        usleep(200000);
        int ok = cu->stream_query(g_streams[0]) == 600; /* still waiting */
        double t0 = now_s();
        ncclResult_t res = ncclCommAbort(g_comms[0]);
        g_comms[0] = NULL;
        CU(cu->stream_synchronize(g_streams[0]));
        double dt = now_s() - t0;
        const char *msg = ncclGetLastError(NULL);
        ok &= res == ncclSuccess && dt < 1.0 && strstr(msg, "peer 1") != NULL;
        printf("abort (%zu bytes): kernel left %.3f s after ncclCommAbort: %s\n", sizes[i], dt,
               msg);
        tally(ok, "abort");
        CU(cu->free(d));
        comms_free(2, 0);
    }
    return 0;
}

static int case_deadline(void)
{
    size_t sizes[] = {1024, 1 << 20};
    for (int i = 0; i < 2; i++) {
        char *d = lonely_recv(sizes[i]);
        if (d == NULL)
            return 1;
        double t0 = now_s();
        CU(cu->stream_synchronize(g_streams[0]));
        double dt = now_s() - t0;
        ncclResult_t a = ncclSuccess;
        check(ncclCommGetAsyncError(g_comms[0], &a), "ncclCommGetAsyncError");
        const char *msg = ncclGetLastError(NULL);
        int ok = a == ncclRemoteError && strstr(msg, "peer 1") != NULL &&
                 strstr(msg, "ncclRecv") != NULL && dt > 1.0 && dt < 10.0;
        printf("deadline (%zu bytes): kernel left after %.3f s, error %d: %s\n", sizes[i], dt, a,
               msg);
        tally(ok, "deadline");
        CU(cu->free(d));
        comms_free(2, 0);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s rules|redop|loopback|wrap|abort|deadline [-f] [-s]\n",
                argv[0]);
        return 2;
    }
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "-f") == 0)
            g_full = 1;
        else if (strcmp(argv[i], "-s") == 0)
            g_small = 1;
    const char *c = argv[1];
    double t0 = now_s();
    int rc;
    if (strcmp(c, "rules") == 0) {
        rc = case_rules();
    } else {
        cu = weft_cuda();
        int ndev = 0;
        if (cu->get_device_count(&ndev) != 0 || ndev < 1) {
            fprintf(stderr, "SKIP: no device (%s backend); set WEFT_CUDA=emu:1\n", cu->name);
            return 77;
        }
        if (strcmp(c, "redop") == 0)
            rc = case_redop();
        else if (strcmp(c, "loopback") == 0)
            rc = case_loopback();
        else if (strcmp(c, "wrap") == 0)
            rc = case_wrap();
        else if (strcmp(c, "abort") == 0)
            rc = case_abort();
        else if (strcmp(c, "deadline") == 0)
            rc = case_deadline();
        else {
            fprintf(stderr, "unknown case %s\n", c);
            return 2;
        }
    }
    if (rc == 77)
        return 77;
    const char *proto = getenv("NCCL_PROTO");
    printf("%s (NCCL_PROTO %s): %d passed, %d failed in %.2f s\n", c, proto ? proto : "unset",
           g_passed, g_failed, now_s() - t0);
    return rc != 0 || g_failed > 0 || g_passed == 0;
}
