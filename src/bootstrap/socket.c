/* TCP helpers: interface choice, listen/connect/accept, deadline- and abort-bounded transfers. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "core/check.h"
#include "core/param.h"

WEFT_PARAM_STR(SocketIfname, "NCCL_SOCKET_IFNAME", NULL,
               "interfaces for out-of-band and socket traffic: comma list of name prefixes, "
               "^ excludes, = matches exactly (default: first up non-loopback, else lo)");
WEFT_PARAM_STR(
    SocketFamily, "NCCL_SOCKET_FAMILY", NULL,
    "address family for NCCL_SOCKET_IFNAME interfaces: AF_INET or AF_INET6 (default any)");
WEFT_PARAM(SocketConnectTimeout, "WEFT_SOCKET_CONNECT_TIMEOUT", 20,
           "seconds to keep retrying a refused or unreachable TCP connection before giving up");

WEFT_PARAM(SocketKeepalive, "WEFT_SOCKET_KEEPALIVE", 15,
           "seconds a TCP peer may leave sent data unacknowledged, or an idle connection's "
           "keepalive probes unanswered, before the connection fails (a host that died "
           "silently); 0: the kernel's defaults (minutes to hours)");

#define WEFT_SOCKET_SLICE_MS 100

uint64_t weft_socket_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t weft_socket_deadline(int64_t seconds)
{
    return seconds > 0 ? weft_socket_now_ns() + (uint64_t)seconds * 1000000000ull : 0;
}

socklen_t weft_socket_addr_len(const union weft_sockaddr *addr)
{
    switch (addr->sa.sa_family) {
    case AF_INET: return sizeof(struct sockaddr_in);
    case AF_INET6: return sizeof(struct sockaddr_in6);
    default: return 0;
    }
}

int weft_socket_addr_valid(const union weft_sockaddr *addr)
{
    if (addr->sa.sa_family == AF_INET)
        return addr->sin.sin_port != 0;
    if (addr->sa.sa_family == AF_INET6)
        return addr->sin6.sin6_port != 0;
    return 0;
}

const char *weft_socket_addr_str(const union weft_sockaddr *addr, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (addr->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &addr->sin.sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, ntohs(addr->sin.sin_port));
    } else if (addr->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &addr->sin6.sin6_addr, host, sizeof(host));
        snprintf(buf, len, "[%s]:%u", host, ntohs(addr->sin6.sin6_port));
    } else {
        snprintf(buf, len, "<family %d>", addr->sa.sa_family);
    }
    return buf;
}

ncclResult_t weft_socket_addr_parse(const char *str, union weft_sockaddr *addr_p)
{
    char host[256];
    const char *port_str;
    if (str[0] == '[') {
        const char *end = strchr(str, ']');
        if (end == NULL || end[1] != ':' || (size_t)(end - str - 1) >= sizeof(host))
            goto bad;
        memcpy(host, str + 1, end - str - 1);
        host[end - str - 1] = '\0';
        port_str = end + 2;
    } else {
        const char *colon = strrchr(str, ':');
        /* A bare IPv6 address is ambiguous: it must be written [addr]:port. */
        if (colon == NULL || memchr(str, ':', colon - str) != NULL ||
            (size_t)(colon - str) >= sizeof(host) || colon == str)
            goto bad;
        memcpy(host, str, colon - str);
        host[colon - str] = '\0';
        port_str = colon + 1;
    }
    char *end;
    long port = strtol(port_str, &end, 10);
    if (*port_str == '\0' || *end != '\0' || port <= 0 || port > 65535)
        goto bad;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *list = NULL;
    int err = getaddrinfo(host, NULL, &hints, &list);
    if (err != 0) {
        WEFT_WARN("cannot resolve host %s in address %s: %s", host, str, gai_strerror(err));
        return ncclInvalidArgument;
    }
    union weft_sockaddr addr;
    memset(&addr, 0, sizeof(addr));
    for (struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next) {
        if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
            ai->ai_addrlen <= sizeof(addr)) {
            memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
            break;
        }
    }
    freeaddrinfo(list);
    if (addr.sa.sa_family == AF_INET)
        addr.sin.sin_port = htons((uint16_t)port);
    else if (addr.sa.sa_family == AF_INET6)
        addr.sin6.sin6_port = htons((uint16_t)port);
    else
        goto bad;
    *addr_p = addr;
    return ncclSuccess;
bad:
    WEFT_WARN("invalid address %s: expected host:port or [ipv6]:port", str);
    return ncclInvalidArgument;
}

/* NCCL_SOCKET_IFNAME syntax: "^" excludes, "=" matches exactly, otherwise prefixes. */
static int weft_socket_if_match(const char *name, const char *spec)
{
    int exclude = 0, exact = 0, match = 0;
    if (*spec == '^') {
        exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        exact = 1;
        spec++;
    }
    while (*spec != '\0' && !match) {
        size_t n = strcspn(spec, ",");
        if (n > 0)
            match = exact ? (strlen(name) == n && strncmp(name, spec, n) == 0)
                          : strncmp(name, spec, n) == 0;
        spec += n + (spec[n] == ',');
    }
    return exclude ? !match : match;
}

static int weft_socket_if_pick(struct ifaddrs *list, const char *spec, int family, char *ifname,
                               size_t ifname_len, union weft_sockaddr *addr)
{
    /* IPv4 first, then IPv6, each in the kernel's interface order. */
    static const int families[] = {AF_INET, AF_INET6};
    for (int f = 0; f < 2; f++) {
        if (family != AF_UNSPEC && family != families[f])
            continue;
        for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
            if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != families[f] ||
                !(ifa->ifa_flags & IFF_UP) || !weft_socket_if_match(ifa->ifa_name, spec))
                continue;
            if (families[f] == AF_INET6 &&
                IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr))
                continue;
            memset(addr, 0, sizeof(*addr));
            memcpy(addr, ifa->ifa_addr,
                   families[f] == AF_INET ? sizeof(struct sockaddr_in)
                                          : sizeof(struct sockaddr_in6));
            snprintf(ifname, ifname_len, "%s", ifa->ifa_name);
            return 1;
        }
    }
    return 0;
}

static pthread_mutex_t weft_socket_if_lock = PTHREAD_MUTEX_INITIALIZER;
static int weft_socket_if_cached;
static char weft_socket_if_name[WEFT_IFNAME_LEN];
static union weft_sockaddr weft_socket_if_addr;

ncclResult_t weft_socket_find_interface(char *ifname, size_t ifname_len,
                                        union weft_sockaddr *addr_p)
{
    ncclResult_t res = ncclSuccess;
    pthread_mutex_lock(&weft_socket_if_lock);
    if (!weft_socket_if_cached) {
        const char *spec = weft_param_SocketIfname();
        const char *fam = weft_param_SocketFamily();
        int family = AF_UNSPEC;
        if (fam != NULL && strcmp(fam, "AF_INET") == 0)
            family = AF_INET;
        else if (fam != NULL && strcmp(fam, "AF_INET6") == 0)
            family = AF_INET6;
        else if (fam != NULL && *fam != '\0')
            WEFT_WARN("NCCL_SOCKET_FAMILY %s is neither AF_INET nor AF_INET6; ignored", fam);

        struct ifaddrs *list = NULL;
        if (getifaddrs(&list) != 0) {
            WEFT_WARN("call to getifaddrs failed: %s", strerror(errno));
            res = ncclSystemError;
            goto out;
        }
        int found;
        if (spec != NULL && *spec != '\0')
            found = weft_socket_if_pick(list, spec, family, weft_socket_if_name, WEFT_IFNAME_LEN,
                                        &weft_socket_if_addr);
        else
            found = weft_socket_if_pick(list, "^docker,lo", family, weft_socket_if_name,
                                        WEFT_IFNAME_LEN, &weft_socket_if_addr) ||
                    weft_socket_if_pick(list, "lo", family, weft_socket_if_name, WEFT_IFNAME_LEN,
                                        &weft_socket_if_addr);
        freeifaddrs(list);
        if (!found) {
            WEFT_WARN("no usable network interface matches NCCL_SOCKET_IFNAME %s "
                      "NCCL_SOCKET_FAMILY %s",
                      spec ? spec : "(unset)", fam ? fam : "(unset)");
            res = ncclInvalidArgument;
            goto out;
        }
        char str[WEFT_SOCKADDR_STRLEN];
        weft_socket_addr_str(&weft_socket_if_addr, str, sizeof(str));
        *strrchr(str, ':') = '\0'; /* no port yet */
        WEFT_INFO(WEFT_LOG_BOOTSTRAP | WEFT_LOG_NET, "using interface %s address %s",
                  weft_socket_if_name, str);
        weft_socket_if_cached = 1;
    }
    snprintf(ifname, ifname_len, "%s", weft_socket_if_name);
    *addr_p = weft_socket_if_addr;
out:
    pthread_mutex_unlock(&weft_socket_if_lock);
    return res;
}

void weft_socket_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/*
 * Options of every connected socket. TCP_NODELAY: small frames go at once. Keepalive probes and
 * TCP_USER_TIMEOUT: a peer host that dies or drops off the network without a FIN or RST fails the
 * connection (ETIMEDOUT) within WEFT_SOCKET_KEEPALIVE seconds, idle or not, instead of waiting
 * for WEFT_TIMEOUT or, on an idle connection, forever. Best effort: without them a socket is
 * slower to fail, not wrong.
 */
static void weft_socket_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int64_t t = weft_param_SocketKeepalive();
    if (t <= 0)
        return;
    if (t > 3600)
        t = 3600;
    int idle = t >= 4 ? (int)(t / 2) : 1, intvl = t >= 6 ? (int)(t / 6) : 1, cnt = 3;
    unsigned int user_ms = (unsigned int)t * 1000u;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

ncclResult_t weft_socket_listen(union weft_sockaddr *addr, int *fd_p)
{
    ncclResult_t res = ncclSuccess;
    char str[WEFT_SOCKADDR_STRLEN];
    socklen_t len = weft_socket_addr_len(addr);
    if (len == 0) {
        WEFT_WARN("cannot listen on address family %d", addr->sa.sa_family);
        return ncclInvalidArgument;
    }
    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    WEFT_SYSCHECK(fd, "socket");
    int one = 1;
    WEFT_SYSCHECK_GOTO(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), "setsockopt",
                       res, err_close);
    if (bind(fd, &addr->sa, len) != 0) {
        WEFT_WARN("cannot bind to %s: %s", weft_socket_addr_str(addr, str, sizeof(str)),
                  strerror(errno));
        res = ncclSystemError;
        goto err_close;
    }
    WEFT_SYSCHECK_GOTO(listen(fd, SOMAXCONN), "listen", res, err_close);
    WEFT_SYSCHECK_GOTO(getsockname(fd, &addr->sa, &len), "getsockname", res, err_close);
    *fd_p = fd;
    return ncclSuccess;
err_close:
    close(fd);
    return res;
}

static int weft_socket_retriable(int err)
{
    return err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT || err == EHOSTUNREACH ||
           err == ENETUNREACH || err == ECONNABORTED || err == EAGAIN;
}

/* One attempt; returns 0 when connected, else the errno of the failure. */
static int weft_socket_try_connect(int fd, const union weft_sockaddr *addr, uint64_t deadline,
                                   volatile uint32_t *abort_flag, const char *what,
                                   ncclResult_t *res)
{
    if (connect(fd, &addr->sa, weft_socket_addr_len(addr)) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR)
        return errno;
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    *res = weft_socket_poll(&pfd, 1, deadline, abort_flag, what);
    if (*res != ncclSuccess)
        return -1;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

ncclResult_t weft_socket_connect(const union weft_sockaddr *addr, uint64_t deadline,
                                 volatile uint32_t *abort_flag, const char *what, int *fd_p)
{
    ncclResult_t res = ncclSuccess;
    char str[WEFT_SOCKADDR_STRLEN];
    uint64_t retry_deadline = weft_socket_deadline(weft_param_SocketConnectTimeout());
    if (deadline != 0 && (retry_deadline == 0 || deadline < retry_deadline))
        retry_deadline = deadline;
    if (weft_socket_addr_len(addr) == 0) {
        WEFT_WARN("%s: cannot connect to address family %d", what, addr->sa.sa_family);
        return ncclInvalidArgument;
    }
    char desc[256];
    snprintf(desc, sizeof(desc), "%s, connecting to %s", what,
             weft_socket_addr_str(addr, str, sizeof(str)));
    int backoff_ms = 10, attempt, err;
    for (attempt = 1;; attempt++) {
        int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        WEFT_SYSCHECK(fd, "socket");
        err = weft_socket_try_connect(fd, addr, retry_deadline, abort_flag, desc, &res);
        if (err == 0) {
            weft_socket_nodelay(fd);
            *fd_p = fd;
            return ncclSuccess;
        }
        close(fd);
        if (err < 0)
            return res; /* timed out or aborted while the attempt was in progress */
        if (!weft_socket_retriable(err))
            break;
        WEFT_CHECK(weft_socket_sleep(backoff_ms, retry_deadline, abort_flag, desc));
        if (retry_deadline != 0 && weft_socket_now_ns() >= retry_deadline)
            break;
        backoff_ms = backoff_ms * 2 > 200 ? 200 : backoff_ms * 2;
    }
    WEFT_WARN("%s: failed after %d attempts: %s", desc, attempt, strerror(err));
    return ncclSystemError;
}

ncclResult_t weft_socket_accept(int listen_fd, int *fd_p)
{
    int fd;
    do {
        fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        /* Nothing pending, or the client gave up before we accepted it: not an error. */
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) {
            *fd_p = -1;
            return ncclSuccess;
        }
        WEFT_WARN("call to accept failed: %s", strerror(errno));
        return ncclSystemError;
    }
    weft_socket_nodelay(fd);
    *fd_p = fd;
    return ncclSuccess;
}

WEFT_PARAM(HandshakeMax, "WEFT_HANDSHAKE_MAX", 64,
           "incoming connections one listener holds while their handshake is pending (accepted, "
           "not authenticated yet); past it the oldest is dropped for each new one");
WEFT_PARAM(FdReserve, "WEFT_FD_RESERVE", 128,
           "descriptors under RLIMIT_NOFILE kept for the job's own connections (at most a "
           "quarter of the limit): past them a listener holds only a few pending handshakes");

/* Pending handshakes a listener keeps once descriptors run short: enough for ranks that connect
 * at once to finish theirs, too few for a stranger to take what the job needs. */
#define WEFT_ACCEPT_SHORT_MAX 8
/* A pending handshake younger than this is not dropped for the cap alone. */
#define WEFT_ACCEPT_GRACE_MS 500

static void weft_socket_limit_warn(const char *who, const char *limit)
{
    static int warned;
    struct rlimit rl;
    if (__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        return;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        rl.rlim_cur = 0;
    WEFT_WARN("%s: %s (RLIMIT_NOFILE %llu, WEFT_HANDSHAKE_MAX %lld, WEFT_FD_RESERVE %lld): "
              "dropping the oldest unauthenticated connections from now on; if they are this "
              "job's own peers, raise the descriptor limit (ulimit -n)",
              who, limit, (unsigned long long)rl.rlim_cur, (long long)weft_param_HandshakeMax(),
              (long long)weft_param_FdReserve());
}

ncclResult_t weft_socket_accept_pending(int listen_fd, int npending, uint64_t oldest_ns, int expect,
                                        const char *who, int *fd_p, enum weft_accept_act *act_p)
{
    int fd;
    do {
        fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        int err = errno;
        *fd_p = -1;
        if (err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED) {
            *act_p = WEFT_ACCEPT_NONE;
            return ncclSuccess;
        }
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
            weft_socket_limit_warn(who, err == ENFILE ? "the system is out of descriptors"
                                                      : "this process is out of descriptors");
            *act_p = npending > 0 ? WEFT_ACCEPT_EVICT : WEFT_ACCEPT_LATER;
            return ncclSuccess;
        }
        WEFT_WARN("%s: accept failed: %s", who, strerror(err));
        return ncclSystemError;
    }
    weft_socket_nodelay(fd);
    int64_t cap = weft_param_HandshakeMax();
    uint64_t hard = UINT64_MAX;
    int evict = 0;
    struct rlimit rl;
    if (cap < expect)
        cap = expect; /* never below the real peers that may be pending at once */
    if (cap < 1)
        cap = 1;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        uint64_t reserve = (uint64_t)weft_param_FdReserve();
        if (reserve > rl.rlim_cur / 4)
            reserve = rl.rlim_cur / 4;
        /* Past the cap, young handshakes may go on up to an eighth of the limit per listener */
        hard = rl.rlim_cur / 8 > (uint64_t)cap ? rl.rlim_cur / 8 : (uint64_t)cap;
        /* Descriptors are handed out lowest first: fd is past every one in use below it. */
        if ((uint64_t)fd + reserve >= rl.rlim_cur && npending >= WEFT_ACCEPT_SHORT_MAX) {
            evict = 1;
            weft_socket_limit_warn(who, "fewer descriptors are left than WEFT_FD_RESERVE");
        }
    }
    /* Past the cap, the oldest goes once it is older than any real peer's handshake takes, so
     * ranks arriving all at once (a root serving hundreds) are not dropped for each other. */
    if (!evict && npending >= cap &&
        ((uint64_t)npending >= hard ||
         weft_socket_now_ns() - oldest_ns >= WEFT_ACCEPT_GRACE_MS * 1000000ull)) {
        evict = 1;
        weft_socket_limit_warn(who, "WEFT_HANDSHAKE_MAX connections are pending their handshake");
    }
    *fd_p = fd;
    *act_p = evict ? WEFT_ACCEPT_EVICT : WEFT_ACCEPT_NEW;
    return ncclSuccess;
}

ncclResult_t weft_socket_send_some(int fd, const void *buf, size_t len, size_t *done,
                                   const char *what)
{
    while (*done < len) {
        ssize_t n = send(fd, (const char *)buf + *done, len - *done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            *done += (size_t)n;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return ncclSuccess;
        } else if (errno != EINTR) {
            if (what != NULL) /* NULL: quiet (socket.h) */
                WEFT_WARN("%s: send failed: %s", what, strerror(errno));
            return errno == EPIPE || errno == ECONNRESET ? ncclRemoteError : ncclSystemError;
        }
    }
    return ncclSuccess;
}

ncclResult_t weft_socket_recv_some(int fd, void *buf, size_t len, size_t *done, const char *what)
{
    while (*done < len) {
        ssize_t n = recv(fd, (char *)buf + *done, len - *done, MSG_DONTWAIT);
        if (n > 0) {
            *done += (size_t)n;
        } else if (n == 0) {
            if (what != NULL)
                WEFT_WARN("%s: connection closed by the peer after %zu of %zu bytes", what, *done,
                          len);
            return ncclRemoteError;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return ncclSuccess;
        } else if (errno != EINTR) {
            if (what != NULL) /* NULL: quiet (socket.h) */
                WEFT_WARN("%s: recv failed: %s", what, strerror(errno));
            return errno == ECONNRESET ? ncclRemoteError : ncclSystemError;
        }
    }
    return ncclSuccess;
}

ncclResult_t weft_socket_send_all(int fd, const void *buf, size_t len, uint64_t deadline,
                                  volatile uint32_t *abort_flag, const char *what)
{
    size_t done = 0;
    for (;;) {
        WEFT_CHECK(weft_socket_send_some(fd, buf, len, &done, what));
        if (done == len)
            return ncclSuccess;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        WEFT_CHECK(weft_socket_poll(&pfd, 1, deadline, abort_flag, what));
    }
}

ncclResult_t weft_socket_recv_all(int fd, void *buf, size_t len, uint64_t deadline,
                                  volatile uint32_t *abort_flag, const char *what)
{
    size_t done = 0;
    for (;;) {
        WEFT_CHECK(weft_socket_recv_some(fd, buf, len, &done, what));
        if (done == len)
            return ncclSuccess;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        WEFT_CHECK(weft_socket_poll(&pfd, 1, deadline, abort_flag, what));
    }
}

ncclResult_t weft_socket_poll(struct pollfd *fds, nfds_t nfds, uint64_t deadline,
                              volatile uint32_t *abort_flag, const char *what)
{
    for (;;) {
        if (abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE) != 0) {
            WEFT_INFO(WEFT_LOG_BOOTSTRAP | WEFT_LOG_NET, "aborted while waiting for %s", what);
            return ncclSystemError;
        }
        int slice = WEFT_SOCKET_SLICE_MS;
        if (deadline != 0) {
            uint64_t now = weft_socket_now_ns();
            if (now >= deadline) {
                WEFT_WARN("timed out waiting for %s", what);
                return ncclSystemError;
            }
            if (deadline - now < (uint64_t)slice * 1000000ull)
                slice = (int)((deadline - now) / 1000000ull) + 1;
        }
        int n = poll(fds, nfds, slice);
        if (n > 0)
            return ncclSuccess;
        if (n < 0 && errno != EINTR) {
            WEFT_WARN("call to poll failed while waiting for %s: %s", what, strerror(errno));
            return ncclSystemError;
        }
    }
}

ncclResult_t weft_socket_sleep(int ms, uint64_t deadline, volatile uint32_t *abort_flag,
                               const char *what)
{
    uint64_t end = weft_socket_now_ns() + (uint64_t)ms * 1000000ull;
    if (deadline != 0 && deadline < end)
        end = deadline;
    for (;;) {
        if (abort_flag != NULL && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE) != 0) {
            WEFT_INFO(WEFT_LOG_BOOTSTRAP | WEFT_LOG_NET, "aborted while waiting for %s", what);
            return ncclSystemError;
        }
        uint64_t now = weft_socket_now_ns();
        if (now >= end)
            return ncclSuccess;
        uint64_t left_ms = (end - now) / 1000000ull + 1;
        poll(NULL, 0, left_ms < WEFT_SOCKET_SLICE_MS ? (int)left_ms : WEFT_SOCKET_SLICE_MS);
    }
}
