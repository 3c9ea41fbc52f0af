/*
 * Bootstrap root: one detached thread per communicator. It polls its listening socket and the
 * connections whose hello is still incomplete, so ranks are served in any order and never one at a
 * time. Once all nranks ranks said hello it sends each the table of listen addresses and exits. On
 * a mismatch (nranks, duplicate rank) or at its deadline it sends each rank the reason instead, and
 * keeps answering late ranks until as many as the largest nranks seen have been told.
 *
 * Every connection gets a CHALLENGE at once and counts as a rank only once its HELLO carries the
 * right MAC (wire.h). Anything else (EOF, garbage, another job's magic, a wrong MAC, silence for
 * WEFT_BS_ADMIT_MS) is closed and changes nothing: it is neither told anything nor counted.
 */
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/wire.h"
#include "core/check.h"

static int weft_bs_roots_running;

int weft_bootstrap_roots_active(void)
{
    return __atomic_load_n(&weft_bs_roots_running, __ATOMIC_ACQUIRE);
}

struct weft_bs_root_conn {
    int fd;
    size_t got;
    uint64_t since;
    struct weft_auth_nonces nonces;
    unsigned char msg[sizeof(struct weft_bs_hello)];
};

struct weft_bs_root {
    int listen_fd;
    uint64_t magic;
    uint8_t key[WEFT_AUTH_KEY_BYTES];
    int64_t timeout_s;
    uint64_t deadline;
    char name[WEFT_SOCKADDR_STRLEN];
    struct weft_bs_root_conn *conns; /* hello not complete yet */
    struct pollfd *pfds;
    int nconns, cap;
    uint64_t accept_after; /* out of descriptors: the listener rests until then */
    int nranks, first_rank, max_nranks; /* nranks from the first hello; 0 before */
    int arrived, answered, failed, finished;
    int *rank_fd;
    struct weft_auth_nonces *rank_nonces;
    union weft_sockaddr *addrs;
    char err[WEFT_BS_ERR_LEN];
};

/* Sends header, payload and their MAC; a rank that is gone cannot be told (logged). */
static void weft_bs_root_send(struct weft_bs_root *r, int fd, const struct weft_auth_nonces *n,
                              const struct weft_bs_hdr *hdr, const void *payload)
{
    uint8_t mac[WEFT_AUTH_MAC_BYTES];
    weft_bs_reply_mac(r->key, n, hdr, payload, mac);
    if (weft_socket_send_all(fd, hdr, sizeof(*hdr), r->deadline, NULL, "bootstrap root reply") ==
            ncclSuccess &&
        weft_socket_send_all(fd, payload, hdr->size, r->deadline, NULL, "bootstrap root reply") ==
            ncclSuccess)
        (void)weft_socket_send_all(fd, mac, sizeof(mac), r->deadline, NULL, "bootstrap root reply");
}

static void weft_bs_root_reply_err(struct weft_bs_root *r, int *fd,
                                   const struct weft_auth_nonces *n, int rank, ncclResult_t code)
{
    struct weft_bs_hdr hdr;
    weft_bs_hdr_fill(&hdr, WEFT_BS_REPLY_ERR, r->magic, rank, code, strlen(r->err) + 1);
    weft_bs_root_send(r, *fd, n, &hdr, r->err);
    weft_socket_close(fd);
    r->answered++;
}

/* After a failure: tells the rank on fd why, and stops once everyone expected has been told. */
static void weft_bs_root_refuse(struct weft_bs_root *r, int *fd, const struct weft_auth_nonces *n,
                                int rank)
{
    if (fd != NULL && *fd >= 0)
        weft_bs_root_reply_err(r, fd, n, rank, r->failed);
    if (r->answered >= r->max_nranks)
        r->finished = 1;
}

static void weft_bs_root_fail(struct weft_bs_root *r, int *fd, const struct weft_auth_nonces *n,
                              int rank, ncclResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void weft_bs_root_fail(struct weft_bs_root *r, int *fd, const struct weft_auth_nonces *n,
                              int rank, ncclResult_t code, const char *fmt, ...)
{
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, sizeof(r->err), fmt, ap);
        va_end(ap);
        WEFT_WARN("bootstrap root %s: %s", r->name, r->err);
        r->failed = code;
        for (int i = 0; i < r->nranks; i++)
            if (r->rank_fd[i] >= 0)
                weft_bs_root_reply_err(r, &r->rank_fd[i], &r->rank_nonces[i], i, code);
    }
    weft_bs_root_refuse(r, fd, n, rank);
}

static void weft_bs_root_succeed(struct weft_bs_root *r)
{
    struct weft_bs_hdr hdr;
    size_t len = (size_t)r->nranks * sizeof(union weft_sockaddr);
    weft_socket_close(&r->listen_fd); /* from now on a stale id is refused at once */
    WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap root %s: all %d ranks arrived", r->name, r->nranks);
    for (int i = 0; i < r->nranks; i++) {
        weft_bs_hdr_fill(&hdr, WEFT_BS_REPLY_OK, r->magic, i, 0, len);
        weft_bs_root_send(r, r->rank_fd[i], &r->rank_nonces[i], &hdr, r->addrs);
        weft_socket_close(&r->rank_fd[i]);
    }
    r->finished = 1;
}

static void weft_bs_root_hello(struct weft_bs_root *r, int fd, struct weft_bs_root_conn *c)
{
    struct weft_bs_hello msg, *m = &msg;
    const char *why = weft_bs_hello_parse(c->msg, sizeof(c->msg), r->magic, r->key, &c->nonces, m);
    if (why != NULL) {
        /* Nothing was admitted: a stray, another job, or someone without the secret. */
        WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap root %s: dropped a connection: %s", r->name, why);
        close(fd);
        return;
    }
    const struct weft_auth_nonces *n = &c->nonces;
    int rank = m->hdr.rank, nranks = m->nranks;
    if (nranks < 1 || nranks > WEFT_BS_MAX_RANKS || rank < 0 || rank >= nranks) {
        weft_bs_root_fail(r, &fd, n, rank, ncclInvalidUsage, "rank %d sent invalid nranks %d",
                          rank, nranks);
        return;
    }
    if (nranks > r->max_nranks)
        r->max_nranks = nranks;
    if (r->nranks == 0) {
        r->rank_fd = malloc(nranks * sizeof(int));
        r->rank_nonces = calloc(nranks, sizeof(*r->rank_nonces));
        r->addrs = calloc(nranks, sizeof(union weft_sockaddr));
        if (r->rank_fd == NULL || r->addrs == NULL || r->rank_nonces == NULL) {
            weft_bs_root_fail(r, &fd, n, rank, ncclSystemError, "out of memory for %d ranks",
                              nranks);
            return;
        }
        for (int i = 0; i < nranks; i++)
            r->rank_fd[i] = -1;
        r->nranks = nranks;
        r->first_rank = rank;
    }
    if (r->failed)
        weft_bs_root_refuse(r, &fd, n, rank);
    else if (nranks != r->nranks)
        weft_bs_root_fail(r, &fd, n, rank, ncclInvalidUsage,
                          "rank %d was started with nranks %d but rank %d with nranks %d", rank,
                          nranks, r->first_rank, r->nranks);
    else if (r->rank_fd[rank] >= 0)
        weft_bs_root_fail(r, &fd, n, rank, ncclInvalidUsage,
                          "rank %d joined twice (two processes were given rank %d of %d)", rank,
                          rank, nranks);
    else if (!weft_socket_addr_valid(&m->addr))
        weft_bs_root_fail(r, &fd, n, rank, ncclInvalidUsage, "rank %d sent an invalid address",
                          rank);
    else {
        r->rank_fd[rank] = fd;
        r->rank_nonces[rank] = *n;
        r->addrs[rank] = m->addr;
        if (++r->arrived == r->nranks)
            weft_bs_root_succeed(r);
    }
}

static void weft_bs_root_timeout(struct weft_bs_root *r)
{
    if (r->nranks == 0) {
        WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap root %s: no rank arrived within %lld s; exiting",
                  r->name, (long long)r->timeout_s);
        r->finished = 1;
        return;
    }
    char missing[160] = "";
    size_t n = 0;
    for (int i = 0; i < r->nranks && n + 16 < sizeof(missing); i++)
        if (r->rank_fd[i] < 0)
            n += snprintf(missing + n, sizeof(missing) - n, "%s%d", n ? " " : "", i);
    weft_bs_root_fail(r, NULL, NULL, -1, ncclSystemError,
                      "timed out after %lld s (WEFT_BOOTSTRAP_TIMEOUT): %d of %d ranks arrived; "
                      "missing: %s%s",
                      (long long)r->timeout_s, r->arrived, r->nranks, missing,
                      n + 16 >= sizeof(missing) ? " ..." : "");
    r->finished = 1;
}

/* Reads what is there of connection i's hello; handles it once complete. */
static void weft_bs_root_read(struct weft_bs_root *r, int i)
{
    struct weft_bs_root_conn *c = &r->conns[i];
    ncclResult_t res = weft_socket_recv_some(c->fd, c->msg, sizeof(c->msg), &c->got,
                                             NULL);
    if (res == ncclSuccess && c->got < sizeof(c->msg))
        return;
    struct weft_bs_root_conn done = *c;
    *c = r->conns[--r->nconns];
    if (res != ncclSuccess)
        close(done.fd);
    else
        weft_bs_root_hello(r, done.fd, &done);
}

/* Connections that did not complete their hello within WEFT_BS_ADMIT_MS are dropped. */
static void weft_bs_root_expire(struct weft_bs_root *r)
{
    uint64_t now = weft_socket_now_ns();
    for (int i = r->nconns - 1; i >= 0; i--) {
        if (now - r->conns[i].since < WEFT_BS_ADMIT_MS * 1000000ull)
            continue;
        WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap root %s: dropped a connection silent for %d ms",
                  r->name, WEFT_BS_ADMIT_MS);
        close(r->conns[i].fd);
        r->conns[i] = r->conns[--r->nconns];
    }
}

/* The challenge goes out at once; a fresh socket always has room for it. */
static int weft_bs_root_challenge(struct weft_bs_root *r, int fd, struct weft_bs_root_conn *c)
{
    struct weft_bs_challenge ch;
    size_t done = 0;
    memset(&ch, 0, sizeof(ch));
    weft_bs_hdr_fill(&ch.hdr, WEFT_BS_CHALLENGE, r->magic, -1, 0, sizeof(ch.nonce));
    if (weft_auth_random(c->nonces.server, sizeof(c->nonces.server)) != ncclSuccess)
        return 0;
    memcpy(ch.nonce, c->nonces.server, sizeof(ch.nonce));
    return weft_socket_send_some(fd, &ch, sizeof(ch), &done, NULL) ==
               ncclSuccess &&
           done == sizeof(ch);
}

/* The connection whose hello has waited longest (a stranger's, when one holds many). */
static int weft_bs_root_oldest(const struct weft_bs_root *r)
{
    int oldest = 0;
    for (int i = 1; i < r->nconns; i++)
        if (r->conns[i].since < r->conns[oldest].since)
            oldest = i;
    return oldest;
}

static void weft_bs_root_evict(struct weft_bs_root *r, int oldest)
{
    if (r->nconns == 0)
        return;
    WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap root %s: dropped the oldest pending connection for "
              "a new one", r->name);
    close(r->conns[oldest].fd);
    r->conns[oldest] = r->conns[--r->nconns];
}

/* Within the limits of weft_socket_accept_pending(); out of descriptors with nothing to drop, the
 * listener rests until accept_after. */
static void weft_bs_root_accept(struct weft_bs_root *r)
{
    char who[80];
    snprintf(who, sizeof(who), "bootstrap root %s", r->name);
    for (;;) {
        int fd;
        enum weft_accept_act act;
        int oldest = weft_bs_root_oldest(r);
        uint64_t since = r->nconns > 0 ? r->conns[oldest].since : 0;
        int expect = r->nranks > r->max_nranks ? r->nranks : r->max_nranks;
        if (weft_socket_accept_pending(r->listen_fd, r->nconns, since, expect, who, &fd, &act) !=
                ncclSuccess ||
            act == WEFT_ACCEPT_LATER) {
            r->accept_after = weft_socket_now_ns() + WEFT_ACCEPT_LATER_MS * 1000000ull;
            return;
        }
        if (act == WEFT_ACCEPT_NONE)
            return;
        if (act == WEFT_ACCEPT_EVICT)
            weft_bs_root_evict(r, oldest);
        if (fd < 0)
            continue;
        if (r->nconns == r->cap) {
            int cap = r->cap ? 2 * r->cap : 64;
            struct weft_bs_root_conn *conns = realloc(r->conns, cap * sizeof(*conns));
            if (conns != NULL)
                r->conns = conns;
            struct pollfd *pfds = realloc(r->pfds, (cap + 1) * sizeof(*pfds));
            if (pfds != NULL)
                r->pfds = pfds;
            if (conns == NULL || pfds == NULL) {
                close(fd);
                return;
            }
            r->cap = cap;
        }
        struct weft_bs_root_conn *c = &r->conns[r->nconns];
        *c = (struct weft_bs_root_conn){.fd = fd, .since = weft_socket_now_ns()};
        if (!weft_bs_root_challenge(r, fd, c)) {
            close(fd);
            continue;
        }
        r->nconns++;
    }
}

static void *weft_bs_root_main(void *arg)
{
    struct weft_bs_root *r = arg;
    while (!r->finished) {
        if (r->deadline != 0 && weft_socket_now_ns() >= r->deadline) {
            weft_bs_root_timeout(r);
            break;
        }
        weft_bs_root_expire(r);
        int n = r->nconns;
        int resting = weft_socket_now_ns() < r->accept_after;
        r->pfds[0] = (struct pollfd){.fd = resting ? -1 : r->listen_fd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            r->pfds[i + 1] = (struct pollfd){.fd = r->conns[i].fd, .events = POLLIN};
        if (poll(r->pfds, n + 1, resting ? WEFT_ACCEPT_LATER_MS : 100) <= 0)
            continue;
        /* Backwards: weft_bs_root_read moves the last connection into the slot it frees. */
        for (int i = n - 1; i >= 0 && !r->finished; i--)
            if (r->pfds[i + 1].revents != 0)
                weft_bs_root_read(r, i);
        if (!r->finished && r->pfds[0].revents != 0)
            weft_bs_root_accept(r);
    }
    for (int i = 0; i < r->nconns; i++)
        close(r->conns[i].fd);
    for (int i = 0; i < r->nranks; i++)
        weft_socket_close(&r->rank_fd[i]);
    weft_socket_close(&r->listen_fd);
    free(r->conns);
    free(r->pfds);
    free(r->rank_fd);
    free(r->rank_nonces);
    free(r->addrs);
    free(r);
    __atomic_sub_fetch(&weft_bs_roots_running, 1, __ATOMIC_RELEASE);
    return NULL;
}

ncclResult_t weft_bs_root_start(union weft_sockaddr *addr, uint64_t magic,
                                const uint8_t key[WEFT_AUTH_KEY_BYTES], int64_t timeout_s)
{
    ncclResult_t res = ncclSuccess;
    struct weft_bs_root *r;
    pthread_attr_t attr;
    pthread_t thread;
    WEFT_CALLOC(r, 1);
    r->listen_fd = -1;
    r->magic = magic;
    memcpy(r->key, key, sizeof(r->key));
    r->timeout_s = timeout_s;
    r->deadline = weft_socket_deadline(r->timeout_s);
    r->pfds = malloc(sizeof(*r->pfds)); /* grows with conns; slot 0 is the listening socket */
    if (r->pfds == NULL) {
        WEFT_WARN("out of memory allocating the bootstrap root");
        res = ncclSystemError;
        goto err_free;
    }
    WEFT_CHECK_GOTO(weft_socket_listen(addr, &r->listen_fd), res, err_free);
    weft_socket_addr_str(addr, r->name, sizeof(r->name));
    __atomic_add_fetch(&weft_bs_roots_running, 1, __ATOMIC_ACQ_REL);
    /* The detached thread may finish and free r before we log (ThreadSanitizer saw it). */
    char name[sizeof(r->name)];
    memcpy(name, r->name, sizeof(name));
    int err = pthread_attr_init(&attr);
    if (err == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        err = pthread_create(&thread, &attr, weft_bs_root_main, r);
        pthread_attr_destroy(&attr);
    }
    if (err != 0) {
        __atomic_sub_fetch(&weft_bs_roots_running, 1, __ATOMIC_ACQ_REL);
        WEFT_WARN("call to pthread_create failed for the bootstrap root: %s", strerror(err));
        res = ncclSystemError;
        goto err_close;
    }
    WEFT_INFO(WEFT_LOG_BOOTSTRAP, "bootstrap root listening on %s", name);
    return ncclSuccess;
err_close:
    close(r->listen_fd);
err_free:
    free(r->pfds);
    free(r);
    return res;
}
