/*
 * WeftTest: a small NCCL net plugin for Weft's tests, built in the tree (tests/net/plugin), never
 * part of the library. It moves data for real over IPv4 TCP, so the same .so works between network
 * namespaces (suite net) and on loopback.
 *
 * One source, five libraries: -DWEFT_TEST_NET_VERSION=11, 10, 9 or 8 exports exactly one table,
 * ncclNetPlugin_v11 .. ncclNetPlugin_v8; 0 exports none of those, only a dummy ncclNetPlugin_v5
 * that a loader must ignore. Every table is named "WeftTest".
 *
 * Wire: one TCP connection per send/recv comm. connect writes the listen comm's 8-byte nonce
 * first; then each message is an 8-byte big-endian size followed by the payload.
 *
 * Progress: isend/irecv only queue a request (up to NCCL_NET_MAX_REQUESTS per comm, else NULL:
 * the caller retries). test advances every pending request of the request's comm, oldest first,
 * with nonblocking socket calls, and never waits. connect/accept keep their progress in the
 * caller's handle buffer / the listen comm and return a NULL comm until done.
 *
 * Threads: a comm is used by one thread at a time; different comms may be used by different
 * threads at once. Globals are atomics, or under tnet_lock.
 *
 * Environment, read at every init (WEFT_TEST_NET_IFNAME only at the first successful one):
 *   WEFT_TEST_NET_IFNAME=PREFIX  listen on the first UP IPv4 interface whose name starts so
 *                                (default: the first UP non-loopback one, else 127.0.0.1)
 *   WEFT_TEST_NET_FAIL=init      init fails (ncclSystemError) after a WARN
 *   WEFT_TEST_NET_FAIL=devices0  devices reports 0 devices
 *   WEFT_TEST_NET_NULL_EVERY=K   every K-th isend and every K-th irecv (K >= 2) posts nothing and
 *                                sets *request NULL
 *   WEFT_TEST_NET_LOG=PATH       appends "<pid> <call>\n" for init, devices, listen, connect and
 *                                accept (when done), closeSend, closeRecv, closeListen, finalize
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "net_abi.h"

#ifndef WEFT_TEST_NET_VERSION
#error "compile with -DWEFT_TEST_NET_VERSION=11, 10, 9, 8 or 0"
#endif
#if WEFT_TEST_NET_VERSION != 11 && WEFT_TEST_NET_VERSION != 10 && WEFT_TEST_NET_VERSION != 9 &&    \
    WEFT_TEST_NET_VERSION != 8 && WEFT_TEST_NET_VERSION != 0
#error "WEFT_TEST_NET_VERSION must be 11, 10, 9, 8 or 0"
#endif

#define TNET_EXPORT __attribute__((visibility("default")))
#define TNET_NAME "WeftTest"

#if WEFT_TEST_NET_VERSION == 0

/* No accepted table: only a v5 symbol (NCCL 2.28 probes v11 .. v6), two pointers long. */
struct tnet_v5_dummy {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logger);
};

static ncclResult_t tnet_v5_init(ncclDebugLogger_t logger)
{
    (void)logger;
    return ncclInternalError;
}

TNET_EXPORT const struct tnet_v5_dummy ncclNetPlugin_v5 = {
    .name = TNET_NAME,
    .init = tnet_v5_init,
};

#else

#define TNET_FLAG_NET 0x10UL
#define TNET_FLAG_ALL (~0UL)
#define TNET_NONCE_BYTES 8
#define TNET_HDR_BYTES 8
#define TNET_MAX_REQS NCCL_NET_MAX_REQUESTS

#define TNET_HANDLE_MAGIC 0x57656674486e646cull /* "WeftHndl" */
#define TNET_LISTEN_MAGIC 0x576566744c69736eull
#define TNET_SEND_MAGIC 0x5765667453656e64ull
#define TNET_RECV_MAGIC 0x5765667452656376ull
#define TNET_MR_MAGIC 0x57656674214d5221ull
#define TNET_CTX_MAGIC 0x5765667443747821ull

/* ---- logging and the environment ----------------------------------------------------------- */

static ncclDebugLogger_t tnet_logger;  /* __atomic: the last non-NULL logger an init gave */
static int tnet_fail_devices;          /* __atomic */
static int tnet_null_every;            /* __atomic; < 2: off */
static unsigned long tnet_isend_calls; /* __atomic */
static unsigned long tnet_irecv_calls; /* __atomic */

static pthread_mutex_t tnet_lock = PTHREAD_MUTEX_INITIALIZER;
static char tnet_log_path[4096]; /* under tnet_lock; "" = no call log */
static int tnet_have_addr;       /* under tnet_lock */
static struct in_addr tnet_addr; /* set once, under tnet_lock, read after tnet_have_addr */
static char tnet_ifname[IF_NAMESIZE];

static char tnet_dev_name[] = "wefttest0";

static void tnet_log(ncclDebugLogLevel level, unsigned long flags, const char *where, int line,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void tnet_log(ncclDebugLogLevel level, unsigned long flags, const char *where, int line,
                     const char *fmt, ...)
{
    ncclDebugLogger_t logger = __atomic_load_n(&tnet_logger, __ATOMIC_ACQUIRE);
    char msg[512];
    va_list ap;

    if (logger == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    logger(level, flags, where, line, "%s", msg);
}

/* As plugins do: WARN with every subsystem and the file, INFO with NET and the function. */
#define TNET_WARN(fmt, ...)                                                                        \
    tnet_log(NCCL_LOG_WARN, TNET_FLAG_ALL, __FILE__, __LINE__, "NET/WeftTest : " fmt, ##__VA_ARGS__)
#define TNET_INFO(fmt, ...)                                                                        \
    tnet_log(NCCL_LOG_INFO, TNET_FLAG_NET, __func__, __LINE__, "NET/WeftTest : " fmt, ##__VA_ARGS__)

/* One line per call in WEFT_TEST_NET_LOG: one write on an O_APPEND file, so that processes and
 * threads sharing the file never interleave inside a line. */
static void tnet_trace_call(const char *call)
{
    char line[128];
    int fd, n;

    pthread_mutex_lock(&tnet_lock);
    if (tnet_log_path[0] != '\0') {
        n = snprintf(line, sizeof(line), "%ld %s\n", (long)getpid(), call);
        fd = open(tnet_log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            if (write(fd, line, (size_t)n) != n)
                TNET_INFO("call log %s: short write", tnet_log_path);
            close(fd);
        } else {
            TNET_INFO("call log %s: %s", tnet_log_path, strerror(errno));
        }
    }
    pthread_mutex_unlock(&tnet_lock);
}

/* The address to listen on: the first UP IPv4 interface named WEFT_TEST_NET_IFNAME* if that is
 * set, else the first UP non-loopback one, else 127.0.0.1. Called under tnet_lock. */
static ncclResult_t tnet_pick_addr(void)
{
    const char *want = getenv("WEFT_TEST_NET_IFNAME");
    struct ifaddrs *ifs, *ifa;

    if (want != NULL && want[0] == '\0')
        want = NULL;
    if (getifaddrs(&ifs) != 0) {
        TNET_WARN("getifaddrs failed: %s", strerror(errno));
        return ncclSystemError;
    }
    for (ifa = ifs; ifa != NULL; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != AF_INET ||
            !(ifa->ifa_flags & IFF_UP))
            continue;
        if (want != NULL ? strncmp(ifa->ifa_name, want, strlen(want)) != 0
                         : (ifa->ifa_flags & IFF_LOOPBACK) != 0)
            continue;
        tnet_addr = ((struct sockaddr_in *)ifa->ifa_addr)->sin_addr;
        snprintf(tnet_ifname, sizeof(tnet_ifname), "%s", ifa->ifa_name);
        break;
    }
    freeifaddrs(ifs);
    if (ifa == NULL) {
        if (want != NULL) {
            TNET_WARN("no UP IPv4 interface matches WEFT_TEST_NET_IFNAME %s", want);
            return ncclSystemError;
        }
        tnet_addr.s_addr = htonl(INADDR_LOOPBACK);
        snprintf(tnet_ifname, sizeof(tnet_ifname), "lo");
    }
    return ncclSuccess;
}

/* What every version's init does: keep the logger, read the faults, pick the address once. */
static ncclResult_t tnet_init_common(ncclDebugLogger_t logger)
{
    const char *fail = getenv("WEFT_TEST_NET_FAIL");
    const char *every = getenv("WEFT_TEST_NET_NULL_EVERY");
    const char *log = getenv("WEFT_TEST_NET_LOG");
    char addr[INET_ADDRSTRLEN];
    ncclResult_t res = ncclSuccess;
    int fail_init = 0, fail_devices = 0;

    if (logger != NULL)
        __atomic_store_n(&tnet_logger, logger, __ATOMIC_RELEASE);
    pthread_mutex_lock(&tnet_lock);
    snprintf(tnet_log_path, sizeof(tnet_log_path), "%s", log != NULL ? log : "");
    pthread_mutex_unlock(&tnet_lock);
    tnet_trace_call("init");

    if (fail != NULL && strcmp(fail, "init") == 0) {
        fail_init = 1;
    } else if (fail != NULL && strcmp(fail, "devices0") == 0) {
        fail_devices = 1;
    } else if (fail != NULL && fail[0] != '\0') {
        TNET_WARN("WEFT_TEST_NET_FAIL %s unknown (init, devices0)", fail);
        return ncclInvalidArgument;
    }
    __atomic_store_n(&tnet_fail_devices, fail_devices, __ATOMIC_RELAXED);
    __atomic_store_n(&tnet_null_every, every != NULL ? atoi(every) : 0, __ATOMIC_RELAXED);
    if (fail_init) {
        TNET_WARN("init failing as asked");
        return ncclSystemError;
    }

    pthread_mutex_lock(&tnet_lock);
    if (!tnet_have_addr) {
        res = tnet_pick_addr();
        if (res == ncclSuccess) {
            tnet_have_addr = 1;
            inet_ntop(AF_INET, &tnet_addr, addr, sizeof(addr));
            TNET_INFO("using %s %s", tnet_ifname, addr);
        }
    }
    pthread_mutex_unlock(&tnet_lock);
    return res;
}

/* WEFT_TEST_NET_NULL_EVERY: is this call (counted by *calls) one that must post nothing? */
static int tnet_null_now(unsigned long *calls)
{
    int k = __atomic_load_n(&tnet_null_every, __ATOMIC_RELAXED);
    unsigned long n;

    if (k < 2)
        return 0;
    n = __atomic_add_fetch(calls, 1, __ATOMIC_RELAXED);
    return n % (unsigned long)k == 0;
}

/* ---- devices and properties ---------------------------------------------------------------- */

static ncclResult_t tnet_devices(int *ndev)
{
    tnet_trace_call("devices");
    *ndev = __atomic_load_n(&tnet_fail_devices, __ATOMIC_RELAXED) ? 0 : 1;
    return ncclSuccess;
}

static ncclResult_t tnet_props_fill(int dev, ncclNetProperties_v11_t *p)
{
    if (dev != 0) {
        TNET_WARN("getProperties: no device %d (there is one)", dev);
        return ncclInternalError;
    }
    memset(p, 0, sizeof(*p));
    p->name = tnet_dev_name;
    p->pciPath = NULL;
    p->guid = 0x57454654; /* "WEFT" */
    p->ptrSupport = NCCL_PTR_HOST;
    p->regIsGlobal = 0;
    p->forceFlush = 0;
    p->speed = 10000;
    p->port = 0;
    p->latency = 0;
    p->maxComms = 65536;
    p->maxRecvs = 1;
    p->netDeviceType = NCCL_NET_DEVICE_HOST;
    p->netDeviceVersion = 0;
    p->vProps.ndevs = 1;
    p->vProps.devs[0] = 0;
    p->maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
    p->maxCollBytes = 512ull << 20;
    p->maxMultiRequestSize = 1;
    return ncclSuccess;
}

/* ---- sockets ------------------------------------------------------------------------------- */

/* The listen side's address and nonce, and the connect side's progress across retries: NCCL hands
 * connect the same handle buffer on every call. listen leaves stage at TNET_CONNECT_START. */
enum tnet_connect_stage {
    TNET_CONNECT_START = 0,
    TNET_CONNECT_WAIT = 1,  /* nonblocking connect in progress */
    TNET_CONNECT_NONCE = 2, /* connected; writing the nonce */
};

/* (test_net_plugin_selftest.c reads magic, nonce and addr to play a stranger.) */
struct tnet_handle {
    uint64_t magic;
    uint64_t nonce;
    struct sockaddr_in addr;
    int32_t stage;
    int32_t fd;
    uint32_t sent;
};
_Static_assert(sizeof(struct tnet_handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too big");

struct tnet_listen {
    uint64_t magic;
    int fd;
    uint64_t nonce;
    int afd;      /* accepted, nonce not read in full yet; -1: none */
    unsigned got; /* nonce bytes read from afd */
    unsigned char buf[TNET_NONCE_BYTES];
};

enum tnet_req_state {
    TNET_REQ_FREE = 0,
    TNET_REQ_PENDING,
    TNET_REQ_DONE, /* moved; the slot is free once test has said so */
};

struct tnet_comm;

struct tnet_req {
    struct tnet_comm *comm;
    enum tnet_req_state state;
    char *data;
    size_t size;    /* send: the message; recv: the buffer, then the message once its header came */
    size_t off;     /* payload bytes moved */
    size_t hdr_off; /* header bytes moved */
    uint64_t hdr;   /* the size, big endian, as on the wire */
};

struct tnet_comm {
    uint64_t magic; /* TNET_SEND_MAGIC or TNET_RECV_MAGIC */
    int fd;
    ncclResult_t failed; /* the first error; every later test of a pending request returns it */
    int nused;           /* slots not FREE */
    int head, npending;  /* ring of the PENDING slots, in posting order */
    int ring[TNET_MAX_REQS];
    struct tnet_req reqs[TNET_MAX_REQS];
};

struct tnet_mr {
    uint64_t magic;
    char *base;
    size_t size;
};

static uint64_t tnet_nonce_new(void)
{
    static unsigned long counter; /* __atomic */
    uint64_t nonce;
    struct timespec ts;

    if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) == (ssize_t)sizeof(nonce))
        return nonce;
    clock_gettime(CLOCK_REALTIME, &ts);
    nonce = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 40 ^
            __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) << 20;
    return nonce * 0x9e3779b97f4a7c15ull;
}

/* "a.b.c.d:port", for messages. */
static const char *tnet_addr_str(const struct sockaddr_in *sa, char *buf, size_t len)
{
    char ip[INET_ADDRSTRLEN];

    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
    snprintf(buf, len, "%s:%d", ip, ntohs(sa->sin_port));
    return buf;
}

static void tnet_sock_nodelay(int fd)
{
    int one = 1;

    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        TNET_INFO("TCP_NODELAY on fd %d: %s", fd, strerror(errno));
}

static ncclResult_t tnet_listen(int dev, void *handle, void **listen_comm)
{
    struct tnet_listen *l;
    struct tnet_handle h;
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    char name[INET_ADDRSTRLEN + 8];
    ncclResult_t res;
    int fd;

    if (dev != 0) {
        TNET_WARN("listen: no device %d (there is one)", dev);
        return ncclInternalError;
    }
    pthread_mutex_lock(&tnet_lock);
    res = tnet_have_addr ? ncclSuccess : ncclInternalError;
    sa.sin_addr = tnet_addr;
    pthread_mutex_unlock(&tnet_lock);
    if (res != ncclSuccess) {
        TNET_WARN("listen before a successful init");
        return res;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        TNET_WARN("listen: socket failed: %s", strerror(errno));
        return ncclSystemError;
    }
    sa.sin_family = AF_INET;
    sa.sin_port = 0;
    memset(sa.sin_zero, 0, sizeof(sa.sin_zero));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        TNET_WARN("listen on %s: %s", tnet_addr_str(&sa, name, sizeof(name)), strerror(errno));
        res = ncclSystemError;
        goto err_close_fd;
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL) {
        TNET_WARN("listen: out of memory");
        res = ncclSystemError;
        goto err_close_fd;
    }
    l->magic = TNET_LISTEN_MAGIC;
    l->fd = fd;
    l->nonce = tnet_nonce_new();
    l->afd = -1;

    memset(&h, 0, sizeof(h));
    h.magic = TNET_HANDLE_MAGIC;
    h.nonce = l->nonce;
    h.addr = sa;
    h.stage = TNET_CONNECT_START;
    h.fd = -1;
    memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    memcpy(handle, &h, sizeof(h));
    tnet_trace_call("listen");
    *listen_comm = l;
    return ncclSuccess;

err_close_fd:
    close(fd);
    return res;
}

static ncclResult_t tnet_comm_new(int fd, uint64_t magic, void **comm_p)
{
    struct tnet_comm *c = calloc(1, sizeof(*c));
    int i;

    if (c == NULL) {
        TNET_WARN("out of memory for a comm");
        return ncclSystemError;
    }
    c->magic = magic;
    c->fd = fd;
    for (i = 0; i < TNET_MAX_REQS; i++)
        c->reqs[i].comm = c;
    *comm_p = c;
    return ncclSuccess;
}

/* Never blocks: each call moves the handle's stage on as far as the socket allows. */
static ncclResult_t tnet_connect(int dev, void *handle, void **send_comm)
{
    struct tnet_handle h;
    struct pollfd pfd;
    char name[INET_ADDRSTRLEN + 8];
    ncclResult_t res;
    socklen_t len;
    ssize_t k;
    int err;

    memcpy(&h, handle, sizeof(h));
    if (dev != 0 || h.magic != TNET_HANDLE_MAGIC) {
        TNET_WARN("connect: device %d, handle magic 0x%llx: not a WeftTest handle", dev,
                  (unsigned long long)h.magic);
        return ncclInternalError;
    }
    if (h.stage != TNET_CONNECT_START && h.stage != TNET_CONNECT_WAIT &&
        h.stage != TNET_CONNECT_NONCE) {
        TNET_WARN("connect: handle in stage %d: not one listen made or connect kept", h.stage);
        return ncclInternalError;
    }
    if (h.stage == TNET_CONNECT_START) {
        h.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (h.fd < 0) {
            TNET_WARN("connect: socket failed: %s", strerror(errno));
            return ncclSystemError;
        }
        tnet_sock_nodelay(h.fd);
        h.sent = 0;
        if (connect(h.fd, (struct sockaddr *)&h.addr, sizeof(h.addr)) == 0) {
            h.stage = TNET_CONNECT_NONCE;
        } else if (errno == EINPROGRESS || errno == EINTR) {
            h.stage = TNET_CONNECT_WAIT;
        } else {
            err = errno;
            goto err_connect;
        }
    }
    if (h.stage == TNET_CONNECT_WAIT) {
        pfd.fd = h.fd;
        pfd.events = POLLOUT;
        pfd.revents = 0;
        if (poll(&pfd, 1, 0) <= 0)
            goto not_yet; /* 0: not yet; < 0 (EINTR and the like): look again next call */
        len = sizeof(err);
        if (getsockopt(h.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err != 0)
            goto err_connect;
        h.stage = TNET_CONNECT_NONCE;
    }
    /* TNET_CONNECT_NONCE */
    while (h.sent < TNET_NONCE_BYTES) {
        k = send(h.fd, (char *)&h.nonce + h.sent, TNET_NONCE_BYTES - h.sent,
                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            goto not_yet;
        if (k < 0) {
            err = errno;
            goto err_connect;
        }
        h.sent += (uint32_t)k;
    }
    res = tnet_comm_new(h.fd, TNET_SEND_MAGIC, send_comm);
    if (res != ncclSuccess) {
        close(h.fd);
        h.stage = TNET_CONNECT_START;
        h.fd = -1;
        memcpy(handle, &h, sizeof(h));
        return res;
    }
    /* Ready for another connection through the same buffer. */
    h.stage = TNET_CONNECT_START;
    h.fd = -1;
    memcpy(handle, &h, sizeof(h));
    tnet_trace_call("connect");
    return ncclSuccess;

not_yet:
    memcpy(handle, &h, sizeof(h));
    *send_comm = NULL;
    return ncclSuccess;

err_connect:
    TNET_WARN("connect to %s failed: %s", tnet_addr_str(&h.addr, name, sizeof(name)),
              strerror(err));
    close(h.fd);
    h.stage = TNET_CONNECT_START;
    h.fd = -1;
    memcpy(handle, &h, sizeof(h));
    return ncclSystemError;
}

static void tnet_listen_drop(struct tnet_listen *l)
{
    close(l->afd);
    l->afd = -1;
}

/* Never blocks: accepts at most what is queued, and reads each newcomer's nonce as it comes. A
 * connection with a wrong nonce, or closed before sending one, is dropped and the wait goes on.
 * Newcomers are read one at a time: one that connects and stays silent holds up those behind it
 * (NCCL makes one listen comm per connection, so only a stranger can do that). */
static ncclResult_t tnet_accept(void *listen_comm, void **recv_comm)
{
    struct tnet_listen *l = listen_comm;
    ncclResult_t res;
    ssize_t k;
    int fd;

    if (l == NULL || l->magic != TNET_LISTEN_MAGIC) {
        TNET_WARN("accept: %p is not a listen comm", listen_comm);
        return ncclInternalError;
    }
    for (;;) {
        if (l->afd < 0) {
            fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    break;
                TNET_WARN("accept failed: %s", strerror(errno));
                return ncclSystemError;
            }
            l->afd = fd;
            l->got = 0;
        }
        k = recv(l->afd, l->buf + l->got, TNET_NONCE_BYTES - l->got, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (k <= 0) {
            TNET_INFO("accept: dropping a connection closed before its nonce (%s)",
                      k == 0 ? "EOF" : strerror(errno));
            tnet_listen_drop(l);
            continue;
        }
        l->got += (unsigned)k;
        if (l->got < TNET_NONCE_BYTES)
            continue;
        if (memcmp(l->buf, &l->nonce, TNET_NONCE_BYTES) != 0) {
            TNET_INFO("accept: dropping a connection with a wrong nonce");
            tnet_listen_drop(l);
            continue;
        }
        tnet_sock_nodelay(l->afd);
        res = tnet_comm_new(l->afd, TNET_RECV_MAGIC, recv_comm);
        if (res != ncclSuccess) {
            tnet_listen_drop(l);
            return res;
        }
        l->afd = -1;
        tnet_trace_call("accept");
        return ncclSuccess;
    }
    *recv_comm = NULL;
    return ncclSuccess;
}

static ncclResult_t tnet_close_listen(void *listen_comm)
{
    struct tnet_listen *l = listen_comm;

    if (l == NULL)
        return ncclSuccess;
    if (l->magic != TNET_LISTEN_MAGIC) {
        TNET_WARN("closeListen: %p is not a listen comm", listen_comm);
        return ncclInternalError;
    }
    tnet_trace_call("closeListen");
    if (l->afd >= 0)
        close(l->afd);
    close(l->fd);
    l->magic = 0;
    free(l);
    return ncclSuccess;
}

static ncclResult_t tnet_close_comm(void *comm, uint64_t magic, const char *call)
{
    struct tnet_comm *c = comm;

    if (c == NULL)
        return ncclSuccess;
    if (c->magic != magic) {
        TNET_WARN("%s: %p is not a %s comm", call, comm,
                  magic == TNET_SEND_MAGIC ? "send" : "recv");
        return ncclInternalError;
    }
    tnet_trace_call(call);
    close(c->fd);
    c->magic = 0;
    free(c);
    return ncclSuccess;
}

static ncclResult_t tnet_close_send(void *send_comm)
{
    return tnet_close_comm(send_comm, TNET_SEND_MAGIC, "closeSend");
}

static ncclResult_t tnet_close_recv(void *recv_comm)
{
    return tnet_close_comm(recv_comm, TNET_RECV_MAGIC, "closeRecv");
}

/* ---- memory registration ------------------------------------------------------------------- */

static ncclResult_t tnet_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    struct tnet_mr *mr;

    (void)comm;
    if (type != NCCL_PTR_HOST) {
        TNET_WARN("regMr of type %d: only host memory (NCCL_PTR_HOST) is supported", type);
        return ncclInternalError;
    }
    mr = malloc(sizeof(*mr));
    if (mr == NULL) {
        TNET_WARN("regMr: out of memory");
        return ncclSystemError;
    }
    mr->magic = TNET_MR_MAGIC;
    mr->base = data;
    mr->size = size;
    *mhandle = mr;
    return ncclSuccess;
}

static ncclResult_t tnet_dereg_mr(void *comm, void *mhandle)
{
    struct tnet_mr *mr = mhandle;

    (void)comm;
    if (mr == NULL)
        return ncclSuccess;
    if (mr->magic != TNET_MR_MAGIC) {
        TNET_WARN("deregMr: %p is not a registration", mhandle);
        return ncclInternalError;
    }
    mr->magic = 0;
    free(mr);
    return ncclSuccess;
}

/* A registration, when given, must be ours and cover the buffer. */
static ncclResult_t tnet_mr_check(void *mhandle, const char *data, size_t size, const char *call)
{
    const struct tnet_mr *mr = mhandle;

    if (mr == NULL)
        return ncclSuccess;
    if (mr->magic != TNET_MR_MAGIC) {
        TNET_WARN("%s: mhandle %p is not a registration", call, mhandle);
        return ncclInternalError;
    }
    if (size > 0 &&
        (data < mr->base || size > mr->size || (size_t)(data - mr->base) > mr->size - size)) {
        TNET_WARN("%s: %zu bytes at %p lie outside the registration %p + %zu", call, size,
                  (const void *)data, (void *)mr->base, mr->size);
        return ncclInternalError;
    }
    return ncclSuccess;
}

/* ---- requests and progress ----------------------------------------------------------------- */

static ncclResult_t tnet_comm_check(struct tnet_comm *c, uint64_t magic, const char *call)
{
    if (c == NULL || c->magic != magic) {
        TNET_WARN("%s: %p is not a %s comm", call, (void *)c,
                  magic == TNET_SEND_MAGIC ? "send" : "recv");
        return ncclInternalError;
    }
    return ncclSuccess;
}

/* Queues a request in a free slot (the caller made sure there is one). */
static struct tnet_req *tnet_req_post(struct tnet_comm *c, void *data, size_t size)
{
    struct tnet_req *r = NULL;
    int i;

    for (i = 0; i < TNET_MAX_REQS; i++) {
        if (c->reqs[i].state == TNET_REQ_FREE) {
            r = &c->reqs[i];
            break;
        }
    }
    r->state = TNET_REQ_PENDING;
    r->data = data;
    r->size = size;
    r->off = 0;
    r->hdr_off = 0;
    r->hdr = htobe64((uint64_t)size);
    c->ring[(c->head + c->npending) % TNET_MAX_REQS] = i;
    c->npending++;
    c->nused++;
    return r;
}

static ncclResult_t tnet_isend(void *send_comm, void *data, size_t size, void *mhandle,
                               void **request)
{
    struct tnet_comm *c = send_comm;
    ncclResult_t res;

    res = tnet_comm_check(c, TNET_SEND_MAGIC, "isend");
    if (res == ncclSuccess)
        res = tnet_mr_check(mhandle, data, size, "isend");
    if (res != ncclSuccess)
        return res;
    if (c->failed != ncclSuccess)
        return c->failed;
    if (c->nused == TNET_MAX_REQS || tnet_null_now(&tnet_isend_calls)) {
        *request = NULL;
        return ncclSuccess;
    }
    *request = tnet_req_post(c, data, size);
    return ncclSuccess;
}

static ncclResult_t tnet_irecv(void *recv_comm, int n, void **data, size_t *sizes, void **mhandles,
                               void **request)
{
    struct tnet_comm *c = recv_comm;
    ncclResult_t res;

    res = tnet_comm_check(c, TNET_RECV_MAGIC, "irecv");
    if (res != ncclSuccess)
        return res;
    if (n != 1) {
        TNET_WARN("irecv of %d buffers: maxRecvs is 1", n);
        return ncclInternalError;
    }
    res = tnet_mr_check(mhandles != NULL ? mhandles[0] : NULL, data[0], sizes[0], "irecv");
    if (res != ncclSuccess)
        return res;
    if (c->failed != ncclSuccess)
        return c->failed;
    if (c->nused == TNET_MAX_REQS || tnet_null_now(&tnet_irecv_calls)) {
        *request = NULL;
        return ncclSuccess;
    }
    *request = tnet_req_post(c, data[0], sizes[0]);
    return ncclSuccess;
}

static ncclResult_t tnet_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                                void **request)
{
    (void)recv_comm;
    (void)n;
    (void)data;
    (void)sizes;
    (void)mhandles;
    *request = NULL; /* host memory: nothing to flush */
    return ncclSuccess;
}

static ncclResult_t tnet_sock_error(struct tnet_comm *c, struct tnet_req *r, const char *call,
                                    int err)
{
    ncclResult_t res =
        err == ECONNRESET || err == EPIPE || err == 0 ? ncclRemoteError : ncclSystemError;

    /* A peer may close between messages when it is done (Weft's net transport says goodbye
     * first): the caller decides whether that is an error, so it is no warning here. */
    if (err == 0 && r->off == 0)
        TNET_INFO("%s on fd %d, a %zu-byte %s pending: connection closed by peer (EOF)", call,
                  c->fd, r->size, call[0] == 's' ? "send" : "receive");
    else
        TNET_WARN("%s on fd %d, a %zu-byte %s pending (%zu bytes moved): %s", call, c->fd,
                  r->size, call[0] == 's' ? "send" : "receive", r->off,
                  err == 0 ? "connection closed by peer (EOF)" : strerror(err));
    return res;
}

/* Moves as much of r as the socket takes now; *done_p: all of it went. */
static ncclResult_t tnet_req_send(struct tnet_comm *c, struct tnet_req *r, int *done_p)
{
    struct iovec iov[2];
    struct msghdr mh;
    size_t hdr_part;
    ssize_t k;
    int n;

    while (r->hdr_off < TNET_HDR_BYTES || r->off < r->size) {
        n = 0;
        if (r->hdr_off < TNET_HDR_BYTES) {
            iov[n].iov_base = (char *)&r->hdr + r->hdr_off;
            iov[n++].iov_len = TNET_HDR_BYTES - r->hdr_off;
        }
        if (r->off < r->size) {
            iov[n].iov_base = r->data + r->off;
            iov[n++].iov_len = r->size - r->off;
        }
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *done_p = 0;
            return ncclSuccess;
        }
        if (k < 0)
            return tnet_sock_error(c, r, "send", errno);
        hdr_part = TNET_HDR_BYTES - r->hdr_off;
        if ((size_t)k < hdr_part)
            hdr_part = (size_t)k;
        r->hdr_off += hdr_part;
        r->off += (size_t)k - hdr_part;
    }
    *done_p = 1;
    return ncclSuccess;
}

static ncclResult_t tnet_req_recv(struct tnet_comm *c, struct tnet_req *r, int *done_p)
{
    uint64_t size;
    ssize_t k;

    while (r->hdr_off < TNET_HDR_BYTES) {
        k = recv(c->fd, (char *)&r->hdr + r->hdr_off, TNET_HDR_BYTES - r->hdr_off, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            goto not_yet;
        if (k <= 0)
            return tnet_sock_error(c, r, "recv", k == 0 ? 0 : errno);
        r->hdr_off += (size_t)k;
        if (r->hdr_off < TNET_HDR_BYTES)
            continue;
        size = be64toh(r->hdr);
        if (size > r->size) {
            TNET_WARN("message truncated: %llu bytes into a %zu-byte receive",
                      (unsigned long long)size, r->size);
            return ncclInvalidUsage;
        }
        r->size = (size_t)size;
    }
    while (r->off < r->size) {
        k = recv(c->fd, r->data + r->off, r->size - r->off, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            goto not_yet;
        if (k <= 0)
            return tnet_sock_error(c, r, "recv", k == 0 ? 0 : errno);
        r->off += (size_t)k;
    }
    *done_p = 1;
    return ncclSuccess;

not_yet:
    *done_p = 0;
    return ncclSuccess;
}

/* Advances the comm's pending requests in posting order until the socket would block. */
static ncclResult_t tnet_comm_progress(struct tnet_comm *c)
{
    struct tnet_req *r;
    ncclResult_t res;
    int done;

    while (c->failed == ncclSuccess && c->npending > 0) {
        r = &c->reqs[c->ring[c->head]];
        if (c->magic == TNET_SEND_MAGIC)
            res = tnet_req_send(c, r, &done);
        else
            res = tnet_req_recv(c, r, &done);
        if (res != ncclSuccess) {
            c->failed = res;
            break;
        }
        if (!done)
            break;
        r->state = TNET_REQ_DONE;
        c->head = (c->head + 1) % TNET_MAX_REQS;
        c->npending--;
    }
    return c->failed;
}

static ncclResult_t tnet_test(void *request, int *done, int *sizes)
{
    struct tnet_req *r = request;
    struct tnet_comm *c;
    ncclResult_t res;

    if (r == NULL || r->comm == NULL || r->state == TNET_REQ_FREE ||
        (r->comm->magic != TNET_SEND_MAGIC && r->comm->magic != TNET_RECV_MAGIC)) {
        TNET_WARN("test of %p: not a live request", request);
        return ncclInternalError;
    }
    c = r->comm;
    if (r->state == TNET_REQ_PENDING) {
        res = tnet_comm_progress(c);
        if (r->state == TNET_REQ_PENDING) {
            if (res != ncclSuccess)
                return res;
            *done = 0;
            return ncclSuccess;
        }
    }
    *done = 1;
    if (sizes != NULL)
        *sizes = (int)r->size;
    r->state = TNET_REQ_FREE;
    c->nused--;
    return ncclSuccess;
}

/* ---- the tables ---------------------------------------------------------------------------- */

#if WEFT_TEST_NET_VERSION == 11

static int tnet_live_ctx; /* __atomic: contexts not finalized yet */

struct tnet_ctx {
    uint64_t magic;
    uint64_t comm_id;
    int traffic_class;
};

static ncclResult_t tnet_ctx_check(void *ctx, const char *call)
{
    const struct tnet_ctx *c = ctx;

    if (c == NULL || c->magic != TNET_CTX_MAGIC) {
        TNET_WARN("%s: context %p is not one init returned", call, ctx);
        return ncclInternalError;
    }
    return ncclSuccess;
}

static ncclResult_t tnet_v11_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
                                  ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    struct tnet_ctx *c;
    ncclResult_t res;
    int live;

    (void)prof;
    res = tnet_init_common(logger);
    if (res != ncclSuccess)
        return res;
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        TNET_WARN("init: out of memory");
        return ncclSystemError;
    }
    c->magic = TNET_CTX_MAGIC;
    c->comm_id = comm_id;
    c->traffic_class = config != NULL ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
    live = __atomic_add_fetch(&tnet_live_ctx, 1, __ATOMIC_RELAXED);
    TNET_INFO("context for comm 0x%llx, %d live", (unsigned long long)comm_id, live);
    *ctx = c;
    return ncclSuccess;
}

static ncclResult_t tnet_v11_finalize(void *ctx)
{
    struct tnet_ctx *c = ctx;
    ncclResult_t res;
    int live;

    tnet_trace_call("finalize");
    if (c == NULL)
        return ncclSuccess; /* after a failed init */
    res = tnet_ctx_check(ctx, "finalize");
    if (res != ncclSuccess)
        return res;
    live = __atomic_sub_fetch(&tnet_live_ctx, 1, __ATOMIC_RELAXED);
    TNET_INFO("finalize comm 0x%llx, %d live", (unsigned long long)c->comm_id, live);
    c->magic = 0;
    free(c);
    return ncclSuccess;
}

static ncclResult_t tnet_v11_props(int dev, ncclNetProperties_v11_t *props)
{
    return tnet_props_fill(dev, props);
}

static ncclResult_t tnet_v11_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
    ncclResult_t res = tnet_ctx_check(ctx, "listen");

    return res != ncclSuccess ? res : tnet_listen(dev, handle, listen_comm);
}

static ncclResult_t tnet_v11_connect(void *ctx, int dev, void *handle, void **send_comm,
                                     ncclNetDeviceHandle_v11_t **send_dev_comm)
{
    ncclResult_t res = tnet_ctx_check(ctx, "connect");

    (void)send_dev_comm;
    return res != ncclSuccess ? res : tnet_connect(dev, handle, send_comm);
}

static ncclResult_t tnet_v11_accept(void *listen_comm, void **recv_comm,
                                    ncclNetDeviceHandle_v11_t **recv_dev_comm)
{
    (void)recv_dev_comm;
    return tnet_accept(listen_comm, recv_comm);
}

static ncclResult_t tnet_v11_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                                   void *phandle, void **request)
{
    (void)tag;
    (void)phandle;
    return tnet_isend(send_comm, data, size, mhandle, request);
}

static ncclResult_t tnet_v11_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                   void **mhandles, void **phandles, void **request)
{
    (void)tags;
    (void)phandles;
    return tnet_irecv(recv_comm, n, data, sizes, mhandles, request);
}

TNET_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = TNET_NAME,
    .init = tnet_v11_init,
    .devices = tnet_devices,
    .getProperties = tnet_v11_props,
    .listen = tnet_v11_listen,
    .connect = tnet_v11_connect,
    .accept = tnet_v11_accept,
    .regMr = tnet_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = tnet_dereg_mr,
    .isend = tnet_v11_isend,
    .irecv = tnet_v11_irecv,
    .iflush = tnet_iflush,
    .test = tnet_test,
    .closeSend = tnet_close_send,
    .closeRecv = tnet_close_recv,
    .closeListen = tnet_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
    .finalize = tnet_v11_finalize,
    .setNetAttr = NULL,
};

#elif WEFT_TEST_NET_VERSION == 10 || WEFT_TEST_NET_VERSION == 9

#if WEFT_TEST_NET_VERSION == 10
static ncclResult_t tnet_v10_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    (void)prof;
    return tnet_init_common(logger);
}

static ncclResult_t tnet_v10_connect(int dev, ncclNetCommConfig_v10_t *config, void *handle,
                                     void **send_comm, ncclNetDeviceHandle_v10_t **send_dev_comm)
{
    (void)config;
    (void)send_dev_comm;
    return tnet_connect(dev, handle, send_comm);
}

static ncclResult_t tnet_v10_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                                   void *phandle, void **request)
{
    (void)tag;
    (void)phandle;
    return tnet_isend(send_comm, data, size, mhandle, request);
}

static ncclResult_t tnet_v10_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                   void **mhandles, void **phandles, void **request)
{
    (void)tags;
    (void)phandles;
    return tnet_irecv(recv_comm, n, data, sizes, mhandles, request);
}
#else
static ncclResult_t tnet_v9_init(ncclDebugLogger_t logger)
{
    return tnet_init_common(logger);
}

static ncclResult_t tnet_v9_connect(int dev, void *handle, void **send_comm,
                                    ncclNetDeviceHandle_v9_t **send_dev_comm)
{
    (void)send_dev_comm;
    return tnet_connect(dev, handle, send_comm);
}

static ncclResult_t tnet_v9_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                                  void **request)
{
    (void)tag;
    return tnet_isend(send_comm, data, size, mhandle, request);
}

static ncclResult_t tnet_v9_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                  void **mhandles, void **request)
{
    (void)tags;
    return tnet_irecv(recv_comm, n, data, sizes, mhandles, request);
}
#endif

/* v9 and v10 share the properties struct. */
static ncclResult_t tnet_v10_props(int dev, ncclNetProperties_v10_t *props)
{
    ncclNetProperties_v11_t p;
    ncclResult_t res = tnet_props_fill(dev, &p);

    if (res != ncclSuccess)
        return res;
    memset(props, 0, sizeof(*props));
    props->name = p.name;
    props->pciPath = p.pciPath;
    props->guid = p.guid;
    props->ptrSupport = p.ptrSupport;
    props->regIsGlobal = p.regIsGlobal;
    props->forceFlush = p.forceFlush;
    props->speed = p.speed;
    props->port = p.port;
    props->latency = p.latency;
    props->maxComms = p.maxComms;
    props->maxRecvs = p.maxRecvs;
    props->netDeviceType = p.netDeviceType;
    props->netDeviceVersion = p.netDeviceVersion;
    props->vProps = p.vProps;
    props->maxP2pBytes = p.maxP2pBytes;
    props->maxCollBytes = p.maxCollBytes;
    return ncclSuccess;
}

static ncclResult_t tnet_v10_accept(void *listen_comm, void **recv_comm,
                                    ncclNetDeviceHandle_v10_t **recv_dev_comm)
{
    (void)recv_dev_comm;
    return tnet_accept(listen_comm, recv_comm);
}

#if WEFT_TEST_NET_VERSION == 10
TNET_EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = TNET_NAME,
    .init = tnet_v10_init,
    .connect = tnet_v10_connect,
    .isend = tnet_v10_isend,
    .irecv = tnet_v10_irecv,
#else
TNET_EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = TNET_NAME,
    .init = tnet_v9_init,
    .connect = tnet_v9_connect,
    .isend = tnet_v9_isend,
    .irecv = tnet_v9_irecv,
#endif
    .devices = tnet_devices,
    .getProperties = tnet_v10_props,
    .listen = tnet_listen,
    .accept = tnet_v10_accept,
    .regMr = tnet_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = tnet_dereg_mr,
    .iflush = tnet_iflush,
    .test = tnet_test,
    .closeSend = tnet_close_send,
    .closeRecv = tnet_close_recv,
    .closeListen = tnet_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};

#else /* WEFT_TEST_NET_VERSION == 8 */

static ncclResult_t tnet_v8_init(ncclDebugLogger_t logger)
{
    return tnet_init_common(logger);
}

static ncclResult_t tnet_v8_props(int dev, ncclNetProperties_v8_t *props)
{
    ncclNetProperties_v11_t p;
    ncclResult_t res = tnet_props_fill(dev, &p);

    if (res != ncclSuccess)
        return res;
    memset(props, 0, sizeof(*props));
    props->name = p.name;
    props->pciPath = p.pciPath;
    props->guid = p.guid;
    props->ptrSupport = p.ptrSupport;
    props->regIsGlobal = p.regIsGlobal;
    props->speed = p.speed;
    props->port = p.port;
    props->latency = p.latency;
    props->maxComms = p.maxComms;
    props->maxRecvs = p.maxRecvs;
    props->netDeviceType = p.netDeviceType;
    props->netDeviceVersion = p.netDeviceVersion;
    return ncclSuccess;
}

static ncclResult_t tnet_v8_connect(int dev, void *handle, void **send_comm,
                                    ncclNetDeviceHandle_v8_t **send_dev_comm)
{
    (void)send_dev_comm;
    return tnet_connect(dev, handle, send_comm);
}

static ncclResult_t tnet_v8_accept(void *listen_comm, void **recv_comm,
                                   ncclNetDeviceHandle_v8_t **recv_dev_comm)
{
    (void)recv_dev_comm;
    return tnet_accept(listen_comm, recv_comm);
}

/* v8 sizes are int. */
static ncclResult_t tnet_v8_isend(void *send_comm, void *data, int size, int tag, void *mhandle,
                                  void **request)
{
    (void)tag;
    if (size < 0) {
        TNET_WARN("isend of %d bytes", size);
        return ncclInternalError;
    }
    return tnet_isend(send_comm, data, (size_t)size, mhandle, request);
}

static ncclResult_t tnet_v8_irecv(void *recv_comm, int n, void **data, int *sizes, int *tags,
                                  void **mhandles, void **request)
{
    size_t size;

    (void)tags;
    if (n != 1) {
        TNET_WARN("irecv of %d buffers: maxRecvs is 1", n);
        return ncclInternalError;
    }
    if (sizes[0] < 0) {
        TNET_WARN("irecv of %d bytes", sizes[0]);
        return ncclInternalError;
    }
    size = (size_t)sizes[0];
    return tnet_irecv(recv_comm, n, data, &size, mhandles, request);
}

TNET_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = TNET_NAME,
    .init = tnet_v8_init,
    .devices = tnet_devices,
    .getProperties = tnet_v8_props,
    .listen = tnet_listen,
    .connect = tnet_v8_connect,
    .accept = tnet_v8_accept,
    .regMr = tnet_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = tnet_dereg_mr,
    .isend = tnet_v8_isend,
    .irecv = tnet_v8_irecv,
    .iflush = tnet_iflush,
    .test = tnet_test,
    .closeSend = tnet_close_send,
    .closeRecv = tnet_close_recv,
    .closeListen = tnet_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};

#endif /* WEFT_TEST_NET_VERSION */
#endif /* WEFT_TEST_NET_VERSION != 0 */
