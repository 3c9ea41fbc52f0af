/*
 * The WeftTest net plugin (test_net_plugin.c) checked on its own, in one process over loopback,
 * through dlopen as a loader would: the symbol it exports, its properties, connect/accept retries,
 * 200 messages (0 B .. 3 MiB, 8 in flight) checked byte by byte against an independent pattern,
 * 32 requests per comm, truncation (ncclInvalidUsage), a peer that closes under a pending receive
 * (ncclRemoteError), and the call log. Faults come from the environment the meson test sets.
 *
 * Usage: test_net_plugin_selftest VERSION PLUGIN.so [CASE]
 *   VERSION 11, 10, 9 or 8; CASE data (default), fail-init or devices0
 *   VERSION 0 (the "nosym" build): no accepted table may be exported
 */
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "net_abi.h"
#include "../../common/time_scale.h"

#define DEADLINE_S 10.0
#define NMSG 200
#define WINDOW 8
#define SLACK 64 /* each receive buffer is this much larger than the message */
#define SENTINEL 0x5a
#define PRESET ((void *)0x1) /* NCCL may leave this in *request: the plugin must overwrite it */

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            FAIL(__VA_ARGS__);                                                                     \
    } while (0)
#define NETCHECK(call)                                                                             \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        CHECK(r_ == ncclSuccess, "%s returned %d", #call, (int)r_);                                \
    } while (0)

/* ---- a loader in miniature: one call per slot, whatever the version ------------------------ */

static int ver;
static void *table;
#define T11 ((ncclNet_v11_t *)table)
#define T10 ((ncclNet_v10_t *)table)
#define T9 ((ncclNet_v9_t *)table)
#define T8 ((ncclNet_v8_t *)table)
/* Slots with the same arguments in every version. */
#define SAME(slot, ...)                                                                            \
    (ver == 11   ? T11->slot(__VA_ARGS__)                                                          \
     : ver == 10 ? T10->slot(__VA_ARGS__)                                                          \
     : ver == 9  ? T9->slot(__VA_ARGS__)                                                           \
                 : T8->slot(__VA_ARGS__))

static void *ctx; /* v11 */
static ncclNetCommConfig_v11_t comm_config = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
static int warn_count;
static char last_warn[1024];
static int strangers_dropped; /* INFO lines of accept dropping a connection */
static int eof_logged;        /* a line (INFO at a message boundary) named the peer's EOF */

/* The start of the plugin's handle (struct tnet_handle in test_net_plugin.c), to play strangers
 * that connect to a listen comm without the nonce. */
struct handle_head {
    uint64_t magic;
    uint64_t nonce;
    struct sockaddr_in addr;
};

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                   const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "[plugin %s 0x%lx %s:%d] %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", flags,
            file, line, msg);
    if (strstr(msg, "accept: dropping a connection") != NULL)
        strangers_dropped++;
    if (strstr(msg, "connection closed by peer (EOF)") != NULL)
        eof_logged = 1;
    if (level == NCCL_LOG_WARN) {
        warn_count++;
        snprintf(last_warn, sizeof(last_warn), "%s", msg);
    }
}

static ncclResult_t profiler(void **ehandle, int type, void *phandle, int64_t id, void *ext)
{
    (void)ehandle, (void)type, (void)phandle, (void)id, (void)ext;
    return ncclSuccess;
}

static ncclResult_t net_init(void)
{
    switch (ver) {
    case 11: return T11->init(&ctx, 0x5745465443303031ull, &comm_config, logger, profiler);
    case 10: return T10->init(logger, profiler);
    case 9: return T9->init(logger);
    default: return T8->init(logger);
    }
}

static ncclResult_t net_listen(void *handle, void **lc)
{
    switch (ver) {
    case 11: return T11->listen(ctx, 0, handle, lc);
    case 10: return T10->listen(0, handle, lc);
    case 9: return T9->listen(0, handle, lc);
    default: return T8->listen(0, handle, lc);
    }
}

static ncclResult_t net_connect(void *handle, void **sc, void **dev_handle)
{
    switch (ver) {
    case 11: return T11->connect(ctx, 0, handle, sc, (ncclNetDeviceHandle_v11_t **)dev_handle);
    case 10:
        return T10->connect(0, &comm_config, handle, sc, (ncclNetDeviceHandle_v10_t **)dev_handle);
    case 9: return T9->connect(0, handle, sc, (ncclNetDeviceHandle_v9_t **)dev_handle);
    default: return T8->connect(0, handle, sc, (ncclNetDeviceHandle_v8_t **)dev_handle);
    }
}

static ncclResult_t net_isend(void *sc, void *data, size_t size, void *mh, void **req)
{
    switch (ver) {
    case 11: return T11->isend(sc, data, size, 0, mh, NULL, req);
    case 10: return T10->isend(sc, data, size, 0, mh, NULL, req);
    case 9: return T9->isend(sc, data, size, 0, mh, req);
    default: return T8->isend(sc, data, (int)size, 0, mh, req);
    }
}

static ncclResult_t net_irecv_n(void *rc, int n, void **data, size_t *sizes, void **mh, void **req)
{
    int tags[2] = {0, 0}, isizes[2] = {(int)sizes[0], n > 1 ? (int)sizes[1] : 0};
    void *ph[2] = {NULL, NULL};

    switch (ver) {
    case 11: return T11->irecv(rc, n, data, sizes, tags, mh, ph, req);
    case 10: return T10->irecv(rc, n, data, sizes, tags, mh, ph, req);
    case 9: return T9->irecv(rc, n, data, sizes, tags, mh, req);
    default: return T8->irecv(rc, n, data, isizes, tags, mh, req);
    }
}

static ncclResult_t net_irecv(void *rc, void *data, size_t size, void *mh, void **req)
{
    return net_irecv_n(rc, 1, &data, &size, &mh, req);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void nap(void)
{
    struct timespec ts = {0, 50 * 1000};

    nanosleep(&ts, NULL);
}

/* ---- cases --------------------------------------------------------------------------------- */

static unsigned char pattern(int msg, size_t i)
{
    return (unsigned char)((msg * 131 + i * 7) & 0xff);
}

static void check_props(void)
{
    unsigned char buf[256];
    size_t want_size = ver == 11  ? sizeof(ncclNetProperties_v11_t)
                       : ver >= 9 ? sizeof(ncclNetProperties_v10_t)
                                  : sizeof(ncclNetProperties_v8_t);
    size_t i;

    memset(buf, 0xa5, sizeof(buf));
    NETCHECK(SAME(getProperties, 0, (void *)buf));
    for (i = want_size; i < sizeof(buf); i++)
        CHECK(buf[i] == 0xa5, "getProperties wrote byte %zu, past the %zu-byte v%d struct", i,
              want_size, ver);
    if (ver >= 9) {
        ncclNetProperties_v11_t p;

        memset(&p, 0, sizeof(p));
        memcpy(&p, buf, want_size);
        CHECK(p.name != NULL && strcmp(p.name, "wefttest0") == 0, "name %s", p.name);
        CHECK(p.pciPath == NULL && p.guid == 0x57454654, "pciPath %p guid 0x%llx",
              (void *)p.pciPath, (unsigned long long)p.guid);
        CHECK(p.ptrSupport == NCCL_PTR_HOST && p.regIsGlobal == 0 && p.forceFlush == 0,
              "ptrSupport %d regIsGlobal %d forceFlush %d", p.ptrSupport, p.regIsGlobal,
              p.forceFlush);
        CHECK(p.speed == 10000 && p.port == 0 && p.latency == 0.0f && p.maxComms == 65536 &&
                  p.maxRecvs == 1,
              "speed %d port %d latency %f maxComms %d maxRecvs %d", p.speed, p.port,
              (double)p.latency, p.maxComms, p.maxRecvs);
        CHECK(p.netDeviceType == NCCL_NET_DEVICE_HOST && p.netDeviceVersion == 0,
              "device type %d version %d", (int)p.netDeviceType, p.netDeviceVersion);
        CHECK(p.vProps.ndevs == 1 && p.vProps.devs[0] == 0 && p.vProps.devs[1] == 0,
              "vProps %d {%d, %d}", p.vProps.ndevs, p.vProps.devs[0], p.vProps.devs[1]);
        CHECK(p.maxP2pBytes == NCCL_MAX_NET_SIZE_BYTES && p.maxCollBytes == 512ull << 20,
              "maxP2pBytes %zu maxCollBytes %zu", p.maxP2pBytes, p.maxCollBytes);
        CHECK(ver < 11 || p.maxMultiRequestSize == 1, "maxMultiRequestSize %d",
              p.maxMultiRequestSize);
    } else {
        ncclNetProperties_v8_t p;

        memcpy(&p, buf, sizeof(p));
        CHECK(p.name != NULL && strcmp(p.name, "wefttest0") == 0, "name %s", p.name);
        CHECK(p.pciPath == NULL && p.guid == 0x57454654 && p.ptrSupport == NCCL_PTR_HOST &&
                  p.regIsGlobal == 0,
              "pciPath %p guid 0x%llx ptrSupport %d regIsGlobal %d", (void *)p.pciPath,
              (unsigned long long)p.guid, p.ptrSupport, p.regIsGlobal);
        CHECK(p.speed == 10000 && p.port == 0 && p.latency == 0.0f && p.maxComms == 65536 &&
                  p.maxRecvs == 1 && p.netDeviceType == NCCL_NET_DEVICE_HOST &&
                  p.netDeviceVersion == 0,
              "speed %d port %d maxComms %d maxRecvs %d device type %d version %d", p.speed, p.port,
              p.maxComms, p.maxRecvs, (int)p.netDeviceType, p.netDeviceVersion);
    }
    CHECK(SAME(getProperties, 1, (void *)buf) != ncclSuccess, "getProperties(1) succeeded");
}

/* Two strangers connect to the listen comm first: one sends a wrong nonce, one closes at once.
 * accept must drop both and go on waiting. */
static void strangers_connect(const unsigned char *handle)
{
    struct handle_head h;
    uint64_t wrong;
    int i, fd;

    memcpy(&h, handle, sizeof(h));
    wrong = ~h.nonce;
    for (i = 0; i < 2; i++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        CHECK(fd >= 0, "socket failed");
        CHECK(connect(fd, (struct sockaddr *)&h.addr, sizeof(h.addr)) == 0,
              "a plain connect to the listen comm failed");
        if (i == 0)
            CHECK(send(fd, &wrong, sizeof(wrong), 0) == (ssize_t)sizeof(wrong), "send failed");
        close(fd);
    }
}

/* listen, then connect and accept until both give a comm (the handle travels as a copy, as
 * through bootstrap), then closeListen, as NCCL's net transport does. */
static void connect_pair(void **sc, void **rc, int strangers)
{
    unsigned char handle[NCCL_NET_HANDLE_MAXSIZE], wire[NCCL_NET_HANDLE_MAXSIZE];
    void *lc = NULL, *sdev = NULL, *rdev = NULL;
    double deadline = now_s() + DEADLINE_S;
    int tries = 0;

    memset(handle, 0, sizeof(handle));
    NETCHECK(net_listen(handle, &lc));
    CHECK(lc != NULL, "listen gave no listen comm");
    memcpy(wire, handle, sizeof(wire));
    *sc = NULL;
    *rc = NULL;
    strangers_dropped = 0;
    if (strangers) {
        strangers_connect(handle);
        /* Let accept see (and drop) both before the real peer connects. */
        while (strangers_dropped < 2) {
            CHECK(now_s() < deadline, "strangers: %d of 2 dropped after %.0f s", strangers_dropped,
                  DEADLINE_S);
            NETCHECK(SAME(accept, lc, rc, (void *)&rdev));
            CHECK(*rc == NULL, "accept gave a comm for a connection without the nonce");
            nap();
        }
    }
    while (*sc == NULL || *rc == NULL) {
        CHECK(now_s() < deadline, "no connection after %.0f s (%d tries; send comm %p recv %p)",
              DEADLINE_S, tries, *sc, *rc);
        if (*sc == NULL)
            NETCHECK(net_connect(wire, sc, &sdev));
        if (*rc == NULL)
            NETCHECK(SAME(accept, lc, rc, (void *)&rdev));
        tries++;
        if (*sc == NULL || *rc == NULL)
            nap();
    }
    CHECK(sdev == NULL && rdev == NULL, "a host net set a device handle (%p, %p)", sdev, rdev);
    NETCHECK(SAME(closeListen, lc));
}

/* Tests req until done or an error; returns the result, the size in *size_p. */
static ncclResult_t wait_req(void *req, int *size_p, const char *what)
{
    double deadline = now_s() + DEADLINE_S;
    ncclResult_t res;
    int done = 0, size = -1;

    for (;;) {
        res = SAME(test, req, &done, &size);
        if (res != ncclSuccess || done)
            break;
        CHECK(now_s() < deadline, "%s not done after %.0f s", what, DEADLINE_S);
        nap();
    }
    if (size_p != NULL)
        *size_p = size;
    return res;
}

static size_t msg_size(int m)
{
    static const size_t sizes[] = {0,         1,      4096, (1 << 20) + 3,  7, 1023,
                                   65536 + 5, 123457, 100,  (2 << 20) + 11, 8, (3 << 20) + 1};

    return sizes[m % (int)(sizeof(sizes) / sizeof(sizes[0]))];
}
#define MAX_MSG ((3 << 20) + 1)
#define SLOT_BYTES (MAX_MSG + SLACK + 63)

/* 200 messages, up to WINDOW in flight each way; every byte and size checked. Returns how many
 * isend/irecv calls posted nothing. */
static long data_phase(void *sc, void *rc, unsigned char *sbuf, unsigned char *rbuf, void *smh,
                       void *rmh)
{
    void *sreq[WINDOW], *rreq[WINDOW];
    int sdone[WINDOW], rdone[WINDOW];
    int lo = 0, ns = 0, nr = 0, m, slot, done, size;
    double deadline = now_s() + 4 * DEADLINE_S;
    long nulls = 0;
    size_t i, n;

    while (lo < NMSG) {
        CHECK(now_s() < deadline, "messages stuck: %d done, %d sends and %d receives posted", lo,
              ns, nr);
        while (ns < NMSG && ns < lo + WINDOW) {
            slot = ns % WINDOW;
            n = msg_size(ns);
            for (i = 0; i < n; i++)
                sbuf[(size_t)slot * SLOT_BYTES + i] = pattern(ns, i);
            sreq[slot] = PRESET;
            NETCHECK(net_isend(sc, sbuf + (size_t)slot * SLOT_BYTES, n, smh, &sreq[slot]));
            CHECK(sreq[slot] != PRESET, "isend left *request untouched");
            if (sreq[slot] == NULL) {
                nulls++;
                break;
            }
            sdone[slot] = 0;
            ns++;
        }
        while (nr < NMSG && nr < lo + WINDOW) {
            slot = nr % WINDOW;
            n = msg_size(nr);
            memset(rbuf + (size_t)slot * SLOT_BYTES, SENTINEL, n + SLACK);
            rreq[slot] = PRESET;
            NETCHECK(net_irecv(rc, rbuf + (size_t)slot * SLOT_BYTES, n + SLACK, rmh, &rreq[slot]));
            CHECK(rreq[slot] != PRESET, "irecv left *request untouched");
            if (rreq[slot] == NULL) {
                nulls++;
                break;
            }
            rdone[slot] = 0;
            nr++;
        }
        /* Test in a scrambled order: completion must not depend on which request is tested. */
        for (m = (ns > nr ? ns : nr) - 1; m >= lo; m--) {
            slot = m % WINDOW;
            n = msg_size(m);
            if (m < ns && !sdone[slot]) {
                size = -1;
                NETCHECK(SAME(test, sreq[slot], &done, &size));
                if (done) {
                    CHECK((size_t)size == n, "send %d: test says %d bytes, sent %zu", m, size, n);
                    sdone[slot] = 1;
                }
            }
            if (m < nr && !rdone[slot]) {
                size = -1;
                NETCHECK(SAME(test, rreq[slot], &done, (m & 1) ? &size : NULL));
                if (done) {
                    const unsigned char *p = rbuf + (size_t)slot * SLOT_BYTES;

                    CHECK(!(m & 1) || (size_t)size == n,
                          "receive %d: test says %d bytes, the message had %zu", m, size, n);
                    for (i = 0; i < n; i++)
                        CHECK(p[i] == pattern(m, i), "message %d (%zu B) byte %zu: %u, want %u", m,
                              n, i, p[i], pattern(m, i));
                    for (i = n; i < n + SLACK; i++)
                        CHECK(p[i] == SENTINEL, "message %d (%zu B): byte %zu written past it", m,
                              n, i);
                    rdone[slot] = 1;
                }
            }
        }
        while (lo < ns && lo < nr && sdone[lo % WINDOW] && rdone[lo % WINDOW])
            lo++;
    }
    return nulls;
}

/* 32 requests per comm: the 33rd posts nothing; then all 32 match in order. */
static void limit_phase(void *sc, void *rc, unsigned char *sbuf, unsigned char *rbuf, void *smh,
                        void *rmh)
{
    void *sreq[NCCL_NET_MAX_REQUESTS], *rreq[NCCL_NET_MAX_REQUESTS], *extra;
    int sdone[NCCL_NET_MAX_REQUESTS], rdone[NCCL_NET_MAX_REQUESTS];
    double deadline = now_s() + DEADLINE_S;
    int i, j, left, size;

    for (i = 0; i < NCCL_NET_MAX_REQUESTS; i++) {
        sbuf[i] = (unsigned char)(i + 1);
        rbuf[i * 8] = 0;
        for (j = 0, sreq[i] = NULL; sreq[i] == NULL; j++) {
            CHECK(j < 100, "isend %d: still NULL after 100 tries", i);
            NETCHECK(net_isend(sc, sbuf + i, 1, smh, &sreq[i]));
        }
        for (j = 0, rreq[i] = NULL; rreq[i] == NULL; j++) {
            CHECK(j < 100, "irecv %d: still NULL after 100 tries", i);
            NETCHECK(net_irecv(rc, rbuf + i * 8, 8, rmh, &rreq[i]));
        }
    }
    for (j = 0; j < 5; j++) {
        extra = PRESET;
        NETCHECK(net_isend(sc, sbuf, 1, smh, &extra));
        CHECK(extra == NULL, "isend number %d on a comm gave a request", NCCL_NET_MAX_REQUESTS + 1);
        extra = PRESET;
        NETCHECK(net_irecv(rc, rbuf, 8, rmh, &extra));
        CHECK(extra == NULL, "irecv number %d on a comm gave a request", NCCL_NET_MAX_REQUESTS + 1);
    }
    /* Newest first: each test must still move the older ones. Progress only happens in test, so
     * the sends are tested too (this one process is both peers). */
    memset(sdone, 0, sizeof(sdone));
    memset(rdone, 0, sizeof(rdone));
    for (left = 2 * NCCL_NET_MAX_REQUESTS; left > 0;) {
        CHECK(now_s() < deadline, "32 requests: %d not done after %.0f s", left, DEADLINE_S);
        for (i = NCCL_NET_MAX_REQUESTS - 1; i >= 0; i--) {
            if (!rdone[i]) {
                size = -1;
                NETCHECK(SAME(test, rreq[i], &rdone[i], &size));
                CHECK(!rdone[i] || (size == 1 && rbuf[i * 8] == i + 1),
                      "receive %d of 32: %d bytes, value %d", i, size, rbuf[i * 8]);
                left -= rdone[i];
            }
            if (!sdone[i]) {
                size = -1;
                NETCHECK(SAME(test, sreq[i], &sdone[i], &size));
                CHECK(!sdone[i] || size == 1, "send %d of 32: %d bytes", i, size);
                left -= sdone[i];
            }
        }
    }
}

/* A receive smaller than the message: ncclInvalidUsage and a WARN that says so. */
static void truncation_case(void)
{
    static unsigned char sbuf[100], rbuf[50];
    void *sc, *rc, *sreq = NULL, *rreq = NULL, *smh, *rmh;
    ncclResult_t res;

    connect_pair(&sc, &rc, 0);
    NETCHECK(SAME(regMr, sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh));
    NETCHECK(SAME(regMr, rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh));
    while (sreq == NULL)
        NETCHECK(net_isend(sc, sbuf, sizeof(sbuf), smh, &sreq));
    while (rreq == NULL)
        NETCHECK(net_irecv(rc, rbuf, sizeof(rbuf), rmh, &rreq));
    NETCHECK(wait_req(sreq, NULL, "send (truncation)"));
    warn_count = 0;
    res = wait_req(rreq, NULL, "receive (truncation)");
    CHECK(res == ncclInvalidUsage, "100 bytes into a 50-byte receive: test returned %d, want %d",
          (int)res, (int)ncclInvalidUsage);
    CHECK(warn_count > 0 &&
              strstr(last_warn, "message truncated: 100 bytes into a 50-byte receive"),
          "no truncation WARN (last: %s)", last_warn);
    NETCHECK(SAME(deregMr, sc, smh));
    NETCHECK(SAME(deregMr, rc, rmh));
    NETCHECK(SAME(closeSend, sc));
    NETCHECK(SAME(closeRecv, rc));
}

/* The sender closes while a receive is pending: ncclRemoteError within the deadline. */
static void peer_close_case(void)
{
    static unsigned char rbuf[4096];
    void *sc, *rc, *rreq = NULL, *rmh, *bufs[2] = {rbuf, rbuf + 64};
    size_t sizes[2] = {64, 64};
    ncclResult_t res;
    int done = 1, size;

    connect_pair(&sc, &rc, 0);
    NETCHECK(SAME(regMr, rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh));
    res = net_irecv_n(rc, 2, bufs, sizes, (void *[]){rmh, rmh}, &rreq);
    CHECK(res == ncclInternalError, "irecv of 2 buffers (maxRecvs 1): %d, want %d", (int)res,
          (int)ncclInternalError);
    rreq = NULL;
    while (rreq == NULL)
        NETCHECK(net_irecv(rc, rbuf, sizeof(rbuf), rmh, &rreq));
    NETCHECK(SAME(test, rreq, &done, &size));
    CHECK(!done, "a receive completed with nothing sent");
    NETCHECK(SAME(closeSend, sc));
    eof_logged = 0;
    res = wait_req(rreq, &size, "receive (peer closed)");
    CHECK(res == ncclRemoteError, "peer closed under a pending receive: test returned %d, want %d",
          (int)res, (int)ncclRemoteError);
    CHECK(eof_logged, "the peer's EOF was not logged");
    NETCHECK(SAME(deregMr, rc, rmh));
    NETCHECK(SAME(closeRecv, rc));
}

/* The call log holds n lines "<our pid> call". */
static void check_log(const char *path, const char *call, int want)
{
    char line[256], expect[256];
    FILE *f = fopen(path, "r");
    int n = 0;

    CHECK(f != NULL, "call log %s missing", path);
    snprintf(expect, sizeof(expect), "%ld %s\n", (long)getpid(), call);
    while (fgets(line, sizeof(line), f) != NULL)
        n += strcmp(line, expect) == 0;
    fclose(f);
    CHECK(n == want, "call log: %d lines \"%ld %s\", want %d", n, (long)getpid(), call, want);
}

static void run_data(const char *log_file)
{
    unsigned char *sbuf, *rbuf, *other;
    void *sc, *rc, *smh, *rmh, *mh, *req;
    const char *every = getenv("WEFT_TEST_NET_NULL_EVERY");
    long nulls;
    int ndev = -1;

    NETCHECK(SAME(devices, &ndev));
    CHECK(ndev == 1, "devices: %d, want 1", ndev);
    check_props();

    connect_pair(&sc, &rc, 1);
    sbuf = malloc((size_t)WINDOW * SLOT_BYTES);
    rbuf = malloc((size_t)WINDOW * SLOT_BYTES);
    CHECK(sbuf != NULL && rbuf != NULL, "out of memory");
    NETCHECK(SAME(regMr, sc, sbuf, (size_t)WINDOW * SLOT_BYTES, NCCL_PTR_HOST, &smh));
    NETCHECK(SAME(regMr, rc, rbuf, (size_t)WINDOW * SLOT_BYTES, NCCL_PTR_HOST, &rmh));
    CHECK(SAME(regMr, sc, sbuf, 64, NCCL_PTR_CUDA, &mh) == ncclInternalError,
          "regMr of CUDA memory did not fail with ncclInternalError");
    req = PRESET;
    NETCHECK(SAME(iflush, rc, 1, (void **)&rbuf, (int[]){1}, &rmh, &req));
    CHECK(req == NULL, "iflush gave a request");

    /* A registration that does not cover the buffer is refused. */
    other = malloc(64);
    CHECK(other != NULL, "out of memory");
    CHECK(net_isend(sc, other, 64, smh, &req) == ncclInternalError,
          "isend outside its registration did not fail");
    free(other);

    nulls = data_phase(sc, rc, sbuf, rbuf, smh, rmh);
    limit_phase(sc, rc, sbuf, rbuf, smh, rmh);
    if (every != NULL && atoi(every) >= 2)
        CHECK(nulls > 0, "WEFT_TEST_NET_NULL_EVERY %s: no isend/irecv came back NULL", every);
    else
        CHECK(nulls == 0, "%ld isend/irecv came back NULL with a window of %d", nulls, WINDOW);
    fprintf(stderr, "%d messages checked, %ld NULL requests retried\n", NMSG, nulls);

    NETCHECK(SAME(deregMr, sc, smh));
    NETCHECK(SAME(deregMr, rc, rmh));
    NETCHECK(SAME(closeSend, sc));
    NETCHECK(SAME(closeRecv, rc));
    free(sbuf);
    free(rbuf);

    truncation_case();
    peer_close_case();

    if (ver == 11) {
        NETCHECK(T11->finalize(ctx));
        check_log(log_file, "finalize", 1);
    }
    check_log(log_file, "init", 1);
    check_log(log_file, "devices", 1);
    check_log(log_file, "listen", 3);
    check_log(log_file, "connect", 3);
    check_log(log_file, "accept", 3);
    check_log(log_file, "closeListen", 3);
    check_log(log_file, "closeSend", 3);
    check_log(log_file, "closeRecv", 3);
}

static void check_symbols(void *lib, int want)
{
    char name[32];
    int v;

    for (v = 6; v <= 12; v++) {
        snprintf(name, sizeof(name), "ncclNetPlugin_v%d", v);
        if (v == want)
            CHECK(dlsym(lib, name) != NULL, "%s not exported", name);
        else
            CHECK(dlsym(lib, name) == NULL, "%s exported (only v%d should be)", name, want);
    }
    CHECK(dlsym(lib, "tnet_test") == NULL && dlsym(lib, "tnet_init_common") == NULL,
          "internal functions exported");
}

static char log_path[] = "/tmp/weft-net-plugin-log-XXXXXX";

static void remove_log(void)
{
    unlink(log_path);
}

int main(int argc, char **argv)
{
    const char *tcase = argc > 3 ? argv[3] : "data";
    ncclResult_t res;
    void *lib;
    int fd, ndev = -1;

    if (argc < 3) {
        fprintf(stderr, "usage: %s VERSION PLUGIN.so [data|fail-init|devices0]\n", argv[0]);
        return 2;
    }
    alarm(weft_test_scaled(60));
    ver = atoi(argv[1]);
    lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "dlopen %s: %s", argv[2], dlerror());
    if (ver == 0) {
        check_symbols(lib, 0);
        CHECK(dlsym(lib, "ncclNetPlugin_v5") != NULL, "the dummy ncclNetPlugin_v5 is missing");
        dlclose(lib);
        printf("ok: %s exports no ncclNetPlugin_v6..v12\n", argv[2]);
        return 0;
    }
    CHECK(ver >= 8 && ver <= 11, "version %d: want 8 .. 11", ver);
    check_symbols(lib, ver);
    CHECK(dlsym(lib, "ncclNetPlugin_v5") == NULL, "ncclNetPlugin_v5 exported by a v%d build", ver);
    {
        char name[32];

        snprintf(name, sizeof(name), "ncclNetPlugin_v%d", ver);
        table = dlsym(lib, name);
    }
    CHECK(strcmp(*(const char *const *)table, "WeftTest") == 0, "table name %s",
          *(const char *const *)table);

    fd = mkstemp(log_path);
    CHECK(fd >= 0, "mkstemp failed");
    close(fd);
    atexit(remove_log); /* also when a check fails */
    setenv("WEFT_TEST_NET_LOG", log_path, 1);

    res = net_init();
    if (strcmp(tcase, "fail-init") == 0) {
        CHECK(res == ncclSystemError, "WEFT_TEST_NET_FAIL=init: init returned %d, want %d",
              (int)res, (int)ncclSystemError);
        CHECK(strstr(last_warn, "NET/WeftTest : init failing as asked") != NULL,
              "no WARN from the failing init (last: %s)", last_warn);
        if (ver == 11) {
            NETCHECK(T11->finalize(NULL)); /* what NCCL does after a failed init */
            check_log(log_path, "finalize", 1);
        }
        check_log(log_path, "init", 1);
    } else if (strcmp(tcase, "devices0") == 0) {
        NETCHECK(res);
        NETCHECK(SAME(devices, &ndev));
        CHECK(ndev == 0, "WEFT_TEST_NET_FAIL=devices0: devices gave %d", ndev);
        if (ver == 11)
            NETCHECK(T11->finalize(ctx));
        check_log(log_path, "devices", 1);
    } else {
        CHECK(strcmp(tcase, "data") == 0, "unknown case %s", tcase);
        NETCHECK(res);
        CHECK(warn_count == 0, "init warned: %s", last_warn);
        run_data(log_path);
    }
    dlclose(lib);
    printf("ok: v%d %s %s\n", ver, tcase, argv[2]);
    return 0;
}
