/*
 * WEFT_DETERMINISTIC=1: all-reduce, reduce and reduce-scatter of random floating-point data (where
 * the order of a sum changes its bits) give bitwise the same result under every NCCL_ALGO,
 * NCCL_PROTO and channel count, on the host path and on the emulated GPU (WEFT_CUDA=emu), and that
 * result is the rank-order fold ((x0 + x1) + x2) + ... computed here with the library's
 * two-operand element ops (kernels/redop_elem.h, unit-tested against references of their own).
 *
 * Usage: test_det [-n NRANKS]
 * The parent forks one child per configuration (knobs are read once per process), sets the
 * configuration's environment there, runs every case with ranks as threads of the child
 * (ncclCommInitAll, one group per call) and compares each result bit for bit with the reference;
 * the child reports a hash of every output, and the parent requires all hashes to be equal. A
 * control run without WEFT_DETERMINISTIC (ring schedules) must differ from the reference on this
 * data, which shows the data is order-sensitive enough for the check to mean something.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/elem.h"
#include "cuda/cuda_ops.h"
#include "nccl.h"
#include "redop_elem.h"

#define MAXR 8

static int g_n = 4;

static const int g_types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                              ncclFloat8e4m3, ncclFloat8e5m2};
#define NTYPES (int)(sizeof(g_types) / sizeof(g_types[0]))
/* 1: one element; 7 and 1001: uneven chunks; 40000: several pieces of 4 KiB slots. */
static const size_t g_counts[] = {1, 7, 1001, 40000};
#define NCOUNTS (int)(sizeof(g_counts) / sizeof(g_counts[0]))
enum { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, NCOLLS };
static const char *const g_coll_names[NCOLLS] = {"allreduce", "reduce", "reducescatter"};

/* Element i of rank r's input: a random sign, mantissa and binary exponent in [-6, 3], so sums
 * round differently in different orders; prod: factors in [0.5, 2). */
static double input(int t, int prod, int r, size_t i)
{
    uint64_t h = mix(((uint64_t)(r + 1) << 40) ^ (uint64_t)i ^ ((uint64_t)t << 56));
    double m = (double)(h & 0xffffff) / (double)0x1000000; /* [0, 1) */
    if (prod)
        return 0.5 + 1.5 * m;
    int e = (int)((h >> 24) % 10) - 6;
    double v = (1.0 + m) * (double)(1ll << (e + 6)) / 64.0;
    return (h >> 40) & 1 ? -v : v;
}

/* a op b on the bits of type t, as the library reduces two elements. */
static void reduce2(int t, int prod, void *acc, const void *x)
{
    switch (t) {
    case ncclFloat32: {
        float *a = acc, b = *(const float *)x;
        *a = prod ? weft_elem_prod_f32(b, *a) : weft_elem_sum_f32(b, *a);
        break;
    }
    case ncclFloat64: {
        double *a = acc, b = *(const double *)x;
        *a = prod ? weft_elem_prod_f64(b, *a) : weft_elem_sum_f64(b, *a);
        break;
    }
    case ncclFloat16: {
        uint16_t *a = acc, b = *(const uint16_t *)x;
        *a = prod ? weft_elem_prod_f16(b, *a) : weft_elem_sum_f16(b, *a);
        break;
    }
    case ncclBfloat16: {
        uint16_t *a = acc, b = *(const uint16_t *)x;
        *a = prod ? weft_elem_prod_bf16(b, *a) : weft_elem_sum_bf16(b, *a);
        break;
    }
    case ncclFloat8e4m3: {
        uint8_t *a = acc, b = *(const uint8_t *)x;
        *a = prod ? weft_elem_prod_e4m3(b, *a) : weft_elem_sum_e4m3(b, *a);
        break;
    }
    default: {
        uint8_t *a = acc, b = *(const uint8_t *)x;
        *a = prod ? weft_elem_prod_e5m2(b, *a) : weft_elem_sum_e5m2(b, *a);
        break;
    }
    }
}

static size_t type_size(int t)
{
    if (t == ncclFloat64 || t == ncclFloat32)
        return t == ncclFloat64 ? 8 : 4;
    return t == ncclFloat8e4m3 || t == ncclFloat8e5m2 ? 1 : 2;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

struct run {
    const struct weft_cuda_ops *cu; /* NULL: host buffers */
    ncclComm_t comms[MAXR];
    cudaStream_t streams[MAXR];
    long wrong;
    uint64_t hash;
};

static void *dev_alloc(struct run *R, int r, size_t bytes)
{
    void *p = NULL;
    if (R->cu == NULL)
        return malloc(bytes);
    R->cu->set_device(r % 2);
    if (R->cu->malloc(&p, bytes) != 0)
        return NULL;
    return p;
}

static void dev_free(struct run *R, int r, void *p)
{
    if (R->cu == NULL) {
        free(p);
        return;
    }
    R->cu->set_device(r % 2);
    R->cu->free(p);
}

static void copy(struct run *R, int r, void *dst, const void *src, size_t bytes)
{
    if (R->cu == NULL) {
        memcpy(dst, src, bytes);
        return;
    }
    R->cu->set_device(r % 2);
    R->cu->memcpy_async(dst, src, bytes, NULL);
    R->cu->stream_synchronize(NULL);
}

/* One collective over every rank; returns 0 on a call failure. */
static int run_case(struct run *R, int coll, int t, int prod, size_t count)
{
    int n = g_n, root = n > 1 ? 1 : 0;
    size_t es = type_size(t), in_elems = coll == C_REDUCESCATTER ? count * (size_t)n : count;
    size_t out_elems = count;
    char *host_in[MAXR], *host_out = malloc(out_elems * es), *ref = malloc(out_elems * es);
    void *din[MAXR], *dout[MAXR];
    for (int r = 0; r < n; r++) {
        host_in[r] = malloc(in_elems * es);
        for (size_t i = 0; i < in_elems; i++)
            store(t, host_in[r], i, input(t, prod, r, i));
        din[r] = dev_alloc(R, r, in_elems * es);
        dout[r] = dev_alloc(R, r, out_elems * es);
        copy(R, r, din[r], host_in[r], in_elems * es);
    }
    int ok = ncclGroupStart() == ncclSuccess;
    for (int r = 0; r < n && ok; r++) {
        ncclRedOp_t op = prod ? ncclProd : ncclSum;
        ncclResult_t res;
        if (R->cu != NULL)
            R->cu->set_device(r % 2);
        if (coll == C_ALLREDUCE)
            res = ncclAllReduce(din[r], dout[r], count, t, op, R->comms[r], R->streams[r]);
        else if (coll == C_REDUCE)
            res = ncclReduce(din[r], dout[r], count, t, op, root, R->comms[r], R->streams[r]);
        else
            res = ncclReduceScatter(din[r], dout[r], count, t, op, R->comms[r], R->streams[r]);
        ok = res == ncclSuccess;
    }
    ok &= ncclGroupEnd() == ncclSuccess;
    if (!ok)
        fprintf(stderr, "FAIL %s: %s\n", g_coll_names[coll], ncclGetLastError(NULL));
    for (int r = 0; r < n && ok && R->cu != NULL; r++) {
        R->cu->set_device(r % 2);
        R->cu->stream_synchronize(R->streams[r]);
    }
    for (int r = 0; ok && r < n; r++) {
        if (coll == C_REDUCE && r != root)
            continue;
        copy(R, r, host_out, dout[r], out_elems * es);
        size_t base = coll == C_REDUCESCATTER ? (size_t)r * count : 0;
        long bad = 0;
        for (size_t i = 0; i < out_elems; i++) {
            memcpy(ref + i * es, host_in[0] + (base + i) * es, es);
            for (int p = 1; p < n; p++)
                reduce2(t, prod, ref + i * es, host_in[p] + (base + i) * es);
            if (memcmp(ref + i * es, host_out + i * es, es) != 0 && bad++ < 3 &&
                getenv("DET_QUIET") == NULL)
                fprintf(stderr, "  %s type %d %s count %zu rank %d [%zu]: got %.9g want %.9g\n",
                        g_coll_names[coll], t, prod ? "prod" : "sum", count, r, i,
                        load(t, host_out, i), load(t, ref, i));
        }
        R->wrong += bad;
        R->hash = fnv(R->hash, host_out, out_elems * es);
    }
    for (int r = 0; r < n; r++) {
        dev_free(R, r, din[r]);
        dev_free(R, r, dout[r]);
        free(host_in[r]);
    }
    free(host_out);
    free(ref);
    return ok;
}

/* The child: every case under the environment it was given. Writes "wrong hash" to fd. */
static int child_main(int fd, int device)
{
    struct run R = {0};
    R.hash = 1469598103934665603ull;
    if (device) {
        R.cu = weft_cuda();
        int ndev = 0;
        if (R.cu->get_device_count(&ndev) != 0 || ndev < 2) {
            fprintf(stderr, "FAIL: no emulated GPU (WEFT_CUDA=emu:2)\n");
            return 1;
        }
    }
    if (ncclCommInitAll(R.comms, g_n, NULL) != ncclSuccess) {
        fprintf(stderr, "FAIL ncclCommInitAll: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    for (int r = 0; r < g_n && device; r++) {
        R.cu->set_device(r % 2);
        R.cu->stream_create((weft_cuda_stream_t *)&R.streams[r]);
    }
    int ok = 1;
    for (int coll = 0; coll < NCOLLS && ok; coll++)
        for (int t = 0; t < NTYPES && ok; t++)
            for (int c = 0; c < NCOUNTS && ok; c++)
                for (int prod = 0; prod < 2 && ok; prod++)
                    ok = run_case(&R, coll, g_types[t], prod, g_counts[c]);
    for (int r = 0; r < g_n; r++) {
        if (device) {
            R.cu->set_device(r % 2);
            R.cu->stream_destroy((weft_cuda_stream_t)R.streams[r]);
        }
        ncclCommDestroy(R.comms[r]);
    }
    char line[64];
    int len = snprintf(line, sizeof(line), "%ld %016llx\n", R.wrong, (unsigned long long)R.hash);
    if (write(fd, line, (size_t)len) != len)
        return 1;
    return ok ? 0 : 1;
}

struct config {
    const char *name;
    int device;
    const char *env[6]; /* NAME=value, NULL-terminated */
};

/* 4 KiB shm slots (chunks of 4 slots), so that 40000 elements take several pieces per channel. */
#define SLOTS "WEFT_SHM_SLOT_BYTES=4096"
static const struct config g_configs[] = {
    {"control: not deterministic, ring", 0,
     {"WEFT_DETERMINISTIC=0", "NCCL_ALGO=Ring", "WEFT_DIRECT_MAX_BYTES=0",
      SLOTS, NULL}},
    {"host ring simple 1ch", 0,
     {"NCCL_ALGO=Ring", "NCCL_PROTO=Simple", "WEFT_HOST_NCHANNELS=1", SLOTS, NULL}},
    {"host ring LL 2ch", 0,
     {"NCCL_ALGO=Ring", "NCCL_PROTO=LL", "WEFT_HOST_NCHANNELS=2", SLOTS, NULL}},
    {"host tree simple 4ch", 0,
     {"NCCL_ALGO=Tree", "NCCL_PROTO=Simple", "WEFT_HOST_NCHANNELS=4", SLOTS, NULL}},
    {"host tree LL 1ch", 0,
     {"NCCL_ALGO=Tree", "NCCL_PROTO=LL", "WEFT_HOST_NCHANNELS=1", SLOTS, NULL}},
    {"host direct 2ch", 0,
     {"WEFT_ALGO=direct", "WEFT_HOST_NCHANNELS=2", SLOTS, NULL}},
    {"host default 4ch default slots", 0, {"WEFT_HOST_NCHANNELS=4", NULL}},
    {"emu ring 1ch", 1, {"WEFT_CUDA=emu:2", "NCCL_ALGO=Ring", "WEFT_CUDA_CHANNELS=1", NULL}},
    {"emu tree LL 4ch", 1,
     {"WEFT_CUDA=emu:2", "NCCL_ALGO=Tree", "NCCL_PROTO=LL", "WEFT_CUDA_CHANNELS=4", NULL}},
    {"emu default 2ch", 1, {"WEFT_CUDA=emu:2", "WEFT_CUDA_CHANNELS=2", NULL}},
};
#define NCONFIGS (int)(sizeof(g_configs) / sizeof(g_configs[0]))

int main(int argc, char **argv)
{
    int opt;
    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt == 'n')
            g_n = atoi(optarg);
    }
    if (g_n < 1 || g_n > MAXR) {
        fprintf(stderr, "usage: test_det [-n 1..%d]\n", MAXR);
        return 2;
    }
    int failed = 0;
    char ref_hash[32] = "";
    for (int c = 0; c < NCONFIGS; c++) {
        const struct config *cfg = &g_configs[c];
        int fds[2];
        if (pipe(fds) != 0)
            return 1;
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            setenv("WEFT_DETERMINISTIC", "1", 1);
            setenv("NCCL_DEBUG", "WARN", 0);
            if (!cfg->device)
                setenv("WEFT_CUDA", "none", 1);
            if (cfg == &g_configs[0])
                setenv("DET_QUIET", "1", 1);
            for (int e = 0; cfg->env[e] != NULL; e++)
                putenv((char *)cfg->env[e]);
            _exit(child_main(fds[1], cfg->device));
        }
        close(fds[1]);
        char buf[64] = "";
        ssize_t got = read(fds[0], buf, sizeof(buf) - 1);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        long wrong = -1;
        char hash[32] = "";
        if (got <= 0 || sscanf(buf, "%ld %31s", &wrong, hash) != 2 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            printf("FAIL %s: the run failed (status %d)\n", cfg->name, status);
            failed++;
            continue;
        }
        if (c == 0) { /* the control must differ from the rank-order reference (n >= 3: two
                       * operands give the same bits in either order) */
            int bad = g_n >= 3 && wrong == 0;
            printf("%s %s: %ld elements differ from the rank-order reference (hash %s)\n",
                   bad ? "FAIL" : "ok  ", cfg->name, wrong, hash);
            failed += bad;
            continue;
        }
        int same = ref_hash[0] == '\0' || strcmp(ref_hash, hash) == 0;
        if (ref_hash[0] == '\0')
            snprintf(ref_hash, sizeof(ref_hash), "%s", hash);
        printf("%s %s: %ld wrong, hash %s%s\n", wrong == 0 && same ? "ok  " : "FAIL", cfg->name,
               wrong, hash, same ? "" : " (differs from the first run)");
        failed += wrong != 0 || !same;
    }
    printf("%s: %d ranks, %d configurations, %d failed\n", failed ? "FAIL" : "PASS", g_n,
           NCONFIGS, failed);
    return failed ? 1 : 0;
}
