/*
 * Nobody without the secret joins a communicator or learns its id, and stray, silent, garbage or
 * wrongly authenticated connections change nothing (issue 14).
 *
 * This program defines listen(): every listener the library opens (bootstrap root, each rank's
 * bootstrap listener, the socket transport's, the launch store's) is attacked the moment it
 * listens, before any real peer can reach it, by four rogue connections queued ahead of the real
 * ones: stray (connect, close), silent (connect, say nothing), garbage (200 random bytes) and
 * wrong MAC (a child reads the challenge and answers with a well-formed message of the listener's
 * protocol, claiming rank 0 or 1, with a random MAC). Without the checks each breaks init: a
 * stray or garbage hello failed init, a silent one stalled it, a wrongly authenticated claim took
 * a rank first. The real ranks must then init and all-reduce exactly.
 *
 * Cases (each forks its ranks; a few seconds each):
 *   rogue-init      2 or 3 ranks from ncclGetUniqueId (socket transport with NCCL_SHM_DISABLE=1)
 *   rogue-commid    3 ranks from NCCL_COMM_ID with WEFT_SECRET; a process with another secret
 *                   tries to join as rank 1 first and fails
 *   wrong-secret    a process holding the id with its secret changed claims rank 0 first and
 *                   fails; the real ranks succeed
 *   store           2 torchrun-style ranks meet at the launch store with WEFT_SECRET; first, a
 *                   client with another secret and one with none try for the id and get nothing
 *   store-forged    a process with another secret holds the store address and serves a forged
 *                   id; the real client never takes it (fails at its deadline)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "weft.h"

#include "bootstrap/bootstrap.h"
#include "bootstrap/wire.h"
#include "core/auth.h"
#include "core/store.h"
#include "socket/wire.h"
#include "../common/id_pipe.h"
#include "../common/torchrun_env.h"

#define COUNT 4099
#define SECRET_A "secret-of-job-a-0123456789"
#define SECRET_B "secret-of-job-b-0123456789"

static int rogue_on;
static int rogue_fds[256];
static int rogue_nfds;

static void rogue_keep(int fd)
{
    if (rogue_nfds < (int)(sizeof(rogue_fds) / sizeof(rogue_fds[0])))
        rogue_fds[rogue_nfds++] = fd;
}

static int rogue_connect(const struct sockaddr_storage *ss, socklen_t len)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)ss, len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void fill_random(void *p, size_t n)
{
    if (weft_auth_random(p, n) != ncclSuccess)
        memset(p, 0x5a, n);
}

/* The wrong-MAC rogue, in a child: answer the challenge with a plausible message, random MAC. */
static void rogue_wrong_mac(int fd)
{
    unsigned char in[64], out[512];
    size_t got = 0, len = 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (got < 32 && poll(&pfd, 1, 5000) > 0) {
        ssize_t n = read(fd, in + got, sizeof(in) - got);
        if (n <= 0)
            _exit(0);
        got += (size_t)n;
    }
    uint32_t first;
    memcpy(&first, in, 4);
    fill_random(out, sizeof(out));
    if (first == WEFT_BS_VERSION && got >= sizeof(struct weft_bs_challenge)) {
        struct weft_bs_challenge ch;
        memcpy(&ch, in, sizeof(ch));
        if (ch.hdr.rank == -1) { /* the root: claim rank 0 of 2 with a useless address */
            struct weft_bs_hello h;
            fill_random(&h, sizeof(h));
            weft_bs_hdr_fill(&h.hdr, WEFT_BS_HELLO, ch.hdr.magic, 0, 0, sizeof(h) - sizeof(h.hdr));
            h.nranks = 2;
            memset(&h.addr, 0, sizeof(h.addr));
            h.addr.sin.sin_family = AF_INET;
            h.addr.sin.sin_port = htons(1);
            h.addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            memcpy(out, &h, sizeof(h));
            len = sizeof(h);
        } else { /* a rank's listener: claim to be rank 0 */
            struct weft_bs_connect c;
            fill_random(&c, sizeof(c));
            weft_bs_hdr_fill(&c.hdr, WEFT_BS_CONNECT, ch.hdr.magic, 0, 0,
                             sizeof(c) - sizeof(c.hdr));
            memcpy(out, &c, sizeof(c));
            len = sizeof(c);
        }
    } else if (first == WEFT_SOCK_VERSION && got >= sizeof(struct weft_sock_challenge)) {
        struct weft_sock_challenge ch;
        struct weft_sock_hello_auth m;
        memcpy(&ch, in, sizeof(ch));
        fill_random(&m, sizeof(m));
        memset(&m.hello, 0, sizeof(m.hello));
        m.hello.version = WEFT_SOCK_VERSION;
        m.hello.type = WEFT_SOCK_HELLO;
        m.hello.comm_hash = ch.comm_hash;
        m.hello.peer = 1;
        memcpy(out, &m, sizeof(m));
        len = sizeof(m);
    } else if (memcmp(in, "WFST", 4) == 0) { /* the store: claim rank 1 of 2, round 0 */
        const char *key = "torchrun:authtest.0";
        uint32_t klen = (uint32_t)strlen(key);
        uint32_t plen = 16 + klen + 16 + 32;
        uint32_t v[4] = {htonl(1), htonl(2), htonl(0), htonl(klen)};
        memcpy(out, in, 8); /* magic, version */
        out[6] = 0;
        out[7] = WEFT_STORE_HELLO;
        uint32_t be = htonl(plen);
        memcpy(out + 8, &be, 4);
        memcpy(out + 12, v, 16);
        memcpy(out + 28, key, klen);
        len = 12 + plen; /* nonce and MAC stay random */
    } else {
        _exit(0);
    }
    if (write(fd, out, len) < 0)
        _exit(0);
    /* Hold on until the peer closes or 3 s pass; a reply would be a leak: say so. */
    while (poll(&pfd, 1, 3000) > 0) {
        ssize_t n = read(fd, in, sizeof(in));
        if (n <= 0)
            _exit(0);
        fprintf(stderr, "rogue: a listener answered a wrong MAC with %zd bytes\n", n);
    }
    _exit(0);
}

static void rogue_attack(int lfd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    unsigned char junk[200];
    int fd;
    if (getsockname(lfd, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET && ((struct sockaddr_in *)&ss)->sin_addr.s_addr == INADDR_ANY)
        ((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* stray */
    fd = rogue_connect(&ss, len);
    if (fd >= 0)
        close(fd);
    /* silent */
    fd = rogue_connect(&ss, len);
    if (fd >= 0)
        rogue_keep(fd);
    /* garbage */
    fd = rogue_connect(&ss, len);
    if (fd >= 0) {
        fill_random(junk, sizeof(junk));
        if (write(fd, junk, sizeof(junk)) < 0) {
        }
        rogue_keep(fd);
    }
    /* wrong MAC: connected now (queued ahead of the real peers), answered by a child */
    fd = rogue_connect(&ss, len);
    if (fd >= 0) {
        pid_t pid = fork();
        if (pid == 0) {
            /* Hold none of the rank's sockets: its peers must see them close when it does. */
            for (int i = 3; i < 4096; i++)
                if (i != fd)
                    close(i);
            rogue_wrong_mac(fd);
        }
        close(fd);
    }
}

/* Every listen() of the library passes here. */
int listen(int fd, int backlog)
{
    int rc = (int)syscall(SYS_listen, fd, backlog);
    if (rc == 0 && rogue_on)
        rogue_attack(fd);
    return rc;
}

/* ---- ranks ---- */

static int all_reduce_check(ncclComm_t comm, int rank, int n)
{
    float *buf = malloc(COUNT * sizeof(float));
    int wrong = 0;
    for (int i = 0; i < COUNT; i++)
        buf[i] = (float)(rank * 1000 + i % 1000);
    if (ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) {
        fprintf(stderr, "rank %d: all-reduce failed: %s\n", rank, ncclGetLastError(comm));
        free(buf);
        return 1;
    }
    for (int i = 0; i < COUNT; i++)
        wrong += buf[i] != (float)(1000 * n * (n - 1) / 2 + n * (i % 1000));
    free(buf);
    if (wrong != 0)
        fprintf(stderr, "rank %d: %d wrong elements\n", rank, wrong);
    return wrong != 0;
}

static int rank_main(const ncclUniqueId *id, int rank, int n)
{
    ncclComm_t comm;
    alarm(30);
    if (ncclCommInitRank(&comm, n, *id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    int bad = all_reduce_check(comm, rank, n);
    ncclCommDestroy(comm);
    return bad;
}

static int wait_all(pid_t *pids, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st;
        if (waitpid(pids[i], &st, 0) != pids[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "process %d failed (status 0x%x)\n", i, st);
            bad = 1;
        }
    }
    return bad;
}

static int run_ranks(const ncclUniqueId *id, int n)
{
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(id, r, n));
    }
    return wait_all(pids, n);
}

static int case_rogue_init(int n)
{
    ncclUniqueId id;
    struct weft_test_id_pipe ip; /* fork before the id's thread exists (ThreadSanitizer) */
    pid_t pids[8];
    rogue_on = 1; /* the root (here) and every rank's listeners */
    if (weft_test_id_pipe_open(&ip) != 0)
        return 1;
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(weft_test_id_pipe_recv(&ip, &id) != 0 ? 3 : rank_main(&id, r, n));
    }
    int bad = weft_test_id_pipe_send(&ip, n, &id) != 0;
    return wait_all(pids, n) || bad;
}

static int case_rogue_commid(void)
{
    char addr[64];
    pid_t pids[4];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", weft_test_free_port());
    setenv("NCCL_COMM_ID", addr, 1);
    /* Another job's process (another secret) tries to join as rank 1 before the real ranks. */
    pids[3] = fork();
    if (pids[3] == 0) {
        ncclUniqueId id;
        struct weft_bootstrap *bs;
        setenv("WEFT_SECRET", SECRET_B, 1);
        if (ncclGetUniqueId(&id) != ncclSuccess)
            _exit(1);
        setenv("WEFT_BOOTSTRAP_TIMEOUT", "10", 1);
        ncclResult_t res = weft_bootstrap_init(&id, 1, 3, NULL, &bs);
        if (res == ncclSuccess) {
            fprintf(stderr, "rogue: joined with the wrong secret\n");
            _exit(1);
        }
        _exit(0);
    }
    setenv("WEFT_SECRET", SECRET_A, 1);
    rogue_on = 1;
    for (int r = 0; r < 3; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            ncclUniqueId id;
            if (r != 0)
                usleep(300 * 1000); /* the rogue tries first */
            if (ncclGetUniqueId(&id) != ncclSuccess)
                _exit(1);
            _exit(rank_main(&id, r, 3));
        }
    }
    return wait_all(pids, 4);
}

static int case_wrong_secret(void)
{
    ncclUniqueId id, bad;
    struct weft_bs_id v;
    pid_t pids[3];
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return 1;
    bad = id;
    memcpy(&v, bad.internal, sizeof(v));
    v.secret[7] ^= 0x40;
    memcpy(bad.internal, &v, sizeof(v));
    /* A process with the id but not its secret claims rank 0 first: it must not get in. */
    pids[2] = fork();
    if (pids[2] == 0) {
        struct weft_bootstrap *bs;
        if (weft_bootstrap_init(&bad, 0, 2, NULL, &bs) == ncclSuccess) {
            fprintf(stderr, "rogue: joined with the wrong secret\n");
            _exit(1);
        }
        _exit(0);
    }
    if (wait_all(&pids[2], 1) != 0)
        return 1;
    return run_ranks(&id, 2);
}

/* A client of the store under `secret` (NULL: none): 0 when it got nothing, as it must. */
static int store_thief(int port, const char *secret)
{
    struct weft_store_addr addr;
    ncclUniqueId id;
    char hp[64];
    if (secret != NULL)
        setenv("WEFT_SECRET", secret, 1);
    else
        unsetenv("WEFT_SECRET");
    snprintf(hp, sizeof(hp), "127.0.0.1:%d", port);
    if (weft_store_addr_tcp("test", hp, &addr) != ncclSuccess)
        return 1;
    memset(&id, 0, sizeof(id));
    if (weft_store_exchange(&addr, "torchrun:authtest.0", 0, 1, 2, weft_socket_deadline(2),
                            &id) == ncclSuccess) {
        fprintf(stderr, "thief (secret %s) got an id from the store\n", secret ? secret : "none");
        return 1;
    }
    /* It reached the store and was turned away unanswered (not merely refused a connection). */
    if (strstr(ncclGetLastError(NULL), "closed before the id came") == NULL) {
        fprintf(stderr, "thief (secret %s) never reached the store: %s\n",
                secret ? secret : "none", ncclGetLastError(NULL));
        return 1;
    }
    return 0;
}

static int case_store(void)
{
    int port = weft_test_free_port();
    pid_t pids[4];
    rogue_on = 1;
    for (int p = 0; p < 4; p++) {
        pids[p] = fork();
        if (pids[p] != 0)
            continue;
        if (p >= 2) /* thieves first, while rank 0's store is up and waiting for rank 1 */
            _exit(store_thief(port, p == 2 ? SECRET_B : NULL));
        setenv("WEFT_SECRET", SECRET_A, 1);
        weft_test_torchrun_env(p, 2, port, "authtest");
        if (p == 1)
            usleep(2500 * 1000); /* after the thieves gave up */
        int rank, nranks, local;
        ncclUniqueId id;
        alarm(30);
        if (weftLaunchInfo(&rank, &nranks, &local, &id) != ncclSuccess) {
            fprintf(stderr, "rank %d: weftLaunchInfo failed: %s\n", p, ncclGetLastError(NULL));
            _exit(1);
        }
        _exit(rank_main(&id, rank, nranks));
    }
    return wait_all(pids, 4);
}

/* A forger holding the store address: challenges, reads the hello, answers with a forged ID. */
static void store_forger(int lfd)
{
    for (;;) {
        unsigned char out[WEFT_STORE_HDR_BYTES + NCCL_UNIQUE_ID_BYTES + 32], in[512];
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            _exit(0);
        uint32_t magic = htonl(WEFT_STORE_MAGIC), len = htonl(16);
        uint16_t ver = htons(WEFT_STORE_VERSION), type = htons(WEFT_STORE_CHALLENGE);
        memcpy(out, &magic, 4);
        memcpy(out + 4, &ver, 2);
        memcpy(out + 6, &type, 2);
        memcpy(out + 8, &len, 4);
        fill_random(out + 12, 16);
        if (write(fd, out, 28) != 28 || read(fd, in, sizeof(in)) <= 0) {
            close(fd);
            continue;
        }
        type = htons(WEFT_STORE_ID);
        len = htonl(NCCL_UNIQUE_ID_BYTES + 32);
        memcpy(out + 6, &type, 2);
        memcpy(out + 8, &len, 4);
        fill_random(out + 12, sizeof(out) - 12);
        if (write(fd, out, sizeof(out)) < 0) {
        }
        close(fd);
    }
}

static int case_store_forged(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    struct weft_store_addr addr;
    char hp[64];
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 16) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) != 0)
        return 1;
    snprintf(hp, sizeof(hp), "127.0.0.1:%d", ntohs(a.sin_port));
    if (weft_store_addr_tcp("test", hp, &addr) != ncclSuccess)
        return 1;
    pid_t forger = fork();
    if (forger == 0)
        store_forger(lfd);
    close(lfd);
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    setenv("WEFT_SECRET", SECRET_A, 1);
    ncclResult_t res = weft_store_exchange(&addr, "torchrun:authtest.0", 0, 1, 2,
                                           weft_socket_deadline(2), &id);
    kill(forger, SIGKILL);
    waitpid(forger, NULL, 0);
    const char *err = ncclGetLastError(NULL);
    if (res == ncclSuccess) {
        fprintf(stderr, "the client took a forged id\n");
        return 1;
    }
    if (strstr(err, "failed authentication") == NULL) {
        fprintf(stderr, "the client failed without naming the forgery: %s\n", err);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    int rc;
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(c, "rogue-init") == 0)
        rc = case_rogue_init(argc > 2 ? atoi(argv[2]) : 2);
    else if (strcmp(c, "rogue-commid") == 0)
        rc = case_rogue_commid();
    else if (strcmp(c, "wrong-secret") == 0)
        rc = case_wrong_secret();
    else if (strcmp(c, "store") == 0)
        rc = case_store();
    else if (strcmp(c, "store-forged") == 0)
        rc = case_store_forged();
    else {
        fprintf(stderr, "usage: test_auth rogue-init [N] | rogue-commid | wrong-secret | store | "
                        "store-forged\n");
        return 2;
    }
    for (int i = 0; i < rogue_nfds; i++)
        close(rogue_fds[i]);
    printf("%s: %s\n", c, rc == 0 ? "ok" : "FAILED");
    return rc;
}
