/*
 * The socket transport checks every frame: a peer that breaks the wire format (socket/wire.h)
 * fails the operation with ncclRemoteError and a message naming the peer, its host and the fault,
 * instead of corrupting memory or hanging.
 *
 * Rank 0 is the library (ncclCommInitRank, then an all-reduce it cannot finish alone). Rank 1 is
 * this file playing a peer by hand on loopback: bootstrap, peer info (another "host"), socket
 * info, accepting rank 0's connection; then it sends one faulty frame and keeps the connection
 * open, so the error must come from the check and not from EOF (except in the EOF cases, where it
 * half-closes, and the reset case, where it closes with SO_LINGER 0).
 *
 * Case "left": the peer says goodbye (BYE, then EOF) as ncclCommDestroy does, and rank 0 then
 * starts an all-reduce that needs it: the data it posts for a departed peer is an error at once.
 *
 * Usage: test_socket_wire CASE   (version, check, type, channel, step, bytes, credit, eof,
 *                                 eof-mid-frame, reset, left)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"
#include "../common/id_pipe.h"
#include "../common/time_scale.h"

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/comm.h"
#include "socket/wire.h"

#define SLOT_BYTES 65536

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct wire_case {
    const char *name;
    const char *want;  /* in the error message */
    const char *want2; /* or this one (NULL: none) */
};

static const struct wire_case cases[] = {
    {"version", "bad frame: version", NULL},
    {"check", "check word", NULL},
    {"type", "unknown type", NULL},
    {"channel", "bad frame: channel 7", NULL},
    {"step", "expected step 0", NULL},
    {"bytes", "a slot holds", NULL},
    {"credit", "bad credit frame", NULL},
    {"eof", "(EOF)", NULL},
    {"eof-mid-frame", "in the middle of a frame", NULL},
    /* A reset right after connect can reach the receiver as a plain EOF (the kernel drops the
     * queued RST when the socket has already seen the close); either is a clean failure. */
    {"reset", "reset", "(EOF)"},
    {"left", "closed its communicator while this rank still had data for it", NULL},
};

static void env_common(void)
{
    setenv("NCCL_SHM_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    setenv("NCCL_SOCKET_FAMILY", "AF_INET", 1);
    setenv("NCCL_SOCKET_NTHREADS", "1", 1);
    setenv("NCCL_NSOCKS_PERTHREAD", "1", 1);
    setenv("WEFT_HOST_NCHANNELS", "1", 1);
    setenv("WEFT_SOCKET_SLOT_BYTES", "65536", 1);
    setenv("WEFT_TIMEOUT", "30", 1);
}

static int real_rank(const struct wire_case *c, ncclUniqueId id)
{
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 2, id, 0) != ncclSuccess) {
        fprintf(stderr, "rank 0: init failed: %s\n", ncclGetLastError(NULL));
        return 1;
    }
    size_t count = 1 << 18;
    float *buf = calloc(count, sizeof(float));
    if (strcmp(c->name, "left") == 0)
        sleep(1); /* the goodbye is in before the operation starts */
    double t0 = now_s();
    ncclResult_t res = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
    double dt = now_s() - t0;
    const char *msg = ncclGetLastError(NULL);
    int ok = res == ncclRemoteError && strstr(msg, "peer 1 (host fakehost") != NULL &&
             (strstr(msg, c->want) != NULL || (c->want2 != NULL && strstr(msg, c->want2) != NULL)) &&
             dt < 10;
    fprintf(stderr, "%s %s: %s after %.2f s: %s\n", ok ? "ok" : "FAIL", c->name,
            ncclGetErrorString(res), dt, msg);
    ncclCommAbort(comm);
    free(buf);
    return !ok;
}

static int fake_send(int fd, const void *p, size_t n)
{
    return weft_socket_send_all(fd, p, n, weft_socket_deadline(10), NULL, "fake frame") ==
           ncclSuccess;
}

static int fake_frame(int fd, int type, int channel, uint64_t step, uint32_t bytes, int bad_check)
{
    struct weft_sock_frame f = {.version = WEFT_SOCK_VERSION, .type = (uint16_t)type,
                                .channel = (uint16_t)channel, .step = step, .bytes = bytes};
    f.check = weft_sock_check(&f) ^ (bad_check ? 1u : 0u);
    return fake_send(fd, &f, sizeof(f));
}

/* Plays rank 1 up to the point where rank 0 runs its all-reduce, then breaks the protocol. */
static int fake_rank(const struct wire_case *c, ncclUniqueId id)
{
    struct weft_bootstrap *bs;
    if (weft_bootstrap_init(&id, 1, 2, NULL, &bs) != ncclSuccess)
        return 1;
    struct weft_peer_info pi[2];
    memset(pi, 0, sizeof(pi));
    pi[1] = (struct weft_peer_info){.version = WEFT_PEER_INFO_VERSION, .rank = 1,
                                    .pid = (int32_t)getpid(), .host_hash = 0x12345,
                                    .comm_hash = weft_bootstrap_magic(&id),
                                    .flags = WEFT_PEER_NO_SHM};
    snprintf(pi[1].hostname, sizeof(pi[1].hostname), "fakehost");
    weft_comm_settings(1, 0, pi[1].settings); /* the real rank 0 runs with the default channels */
    if (weft_bootstrap_allgather(bs, pi, sizeof(pi[0])) != ncclSuccess)
        return 1;

    struct weft_sock_info si[2];
    memset(si, 0, sizeof(si));
    si[1].version = WEFT_SOCK_INFO_VERSION;
    si[1].listening = 1;
    si[1].nthreads = 1;
    si[1].nsocks = 1;
    si[1].slot_bytes = SLOT_BYTES;
    int lfd;
    if (weft_socket_addr_parse("127.0.0.1:1", &si[1].addr) != ncclSuccess)
        return 1;
    si[1].addr.sin.sin_port = 0;
    if (weft_socket_listen(&si[1].addr, &lfd) != ncclSuccess ||
        weft_bootstrap_allgather(bs, si, sizeof(si[0])) != ncclSuccess)
        return 1;
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int fd = -1;
    while (fd < 0) {
        if (weft_socket_poll(&pfd, 1, weft_socket_deadline(10), NULL, "rank 0's connection") !=
                ncclSuccess ||
            weft_socket_accept(lfd, &fd) != ncclSuccess)
            return 1;
    }
    /* The acceptor's side of the handshake (socket/wire.h), with the id's secret. */
    struct weft_sock_challenge ch = {.version = WEFT_SOCK_VERSION, .type = WEFT_SOCK_CHALLENGE,
                                     .comm_hash = weft_bootstrap_magic(&id)};
    struct weft_auth_nonces nonces;
    struct weft_sock_hello_auth m;
    struct weft_sock_hello h;
    struct weft_sock_accept acc = {.version = WEFT_SOCK_VERSION, .type = WEFT_SOCK_ACCEPT};
    weft_auth_random(ch.nonce, sizeof(ch.nonce));
    memcpy(nonces.server, ch.nonce, sizeof(ch.nonce));
    if (weft_socket_send_all(fd, &ch, sizeof(ch), weft_socket_deadline(10), NULL, "challenge") !=
            ncclSuccess ||
        weft_socket_recv_all(fd, &m, sizeof(m), weft_socket_deadline(10), NULL, "hello") !=
            ncclSuccess ||
        weft_sock_hello_parse(&m, sizeof(m), weft_bootstrap_key(bs), &nonces, &h) != NULL) {
        fprintf(stderr, "fake: no authenticated hello\n");
        return 1;
    }
    weft_auth_mac(weft_bootstrap_key(bs), "sock-accept", nonces.server, nonces.client, &h,
                  sizeof(h), acc.mac);
    if (weft_socket_send_all(fd, &acc, sizeof(acc), weft_socket_deadline(10), NULL, "accept") !=
            ncclSuccess ||
        h.version != WEFT_SOCK_VERSION || h.type != WEFT_SOCK_HELLO || h.rank != 0 || h.peer != 1 ||
        h.nchannels != 2 || h.slot_bytes != SLOT_BYTES) {
        fprintf(stderr, "fake: unexpected hello\n");
        return 1;
    }
    if (weft_bootstrap_barrier(bs) != ncclSuccess) /* the end of rank 0's init */
        return 1;

    const char *n = c->name;
    int sent = 1;
    if (strcmp(n, "version") == 0) {
        struct weft_sock_frame f = {.version = 0xdeadbeef, .type = WEFT_SOCK_DATA};
        f.check = weft_sock_check(&f);
        sent = fake_send(fd, &f, sizeof(f));
    } else if (strcmp(n, "check") == 0) {
        sent = fake_frame(fd, WEFT_SOCK_DATA, 0, 0, 16, 1);
    } else if (strcmp(n, "type") == 0) {
        sent = fake_frame(fd, 99, 0, 0, 0, 0);
    } else if (strcmp(n, "channel") == 0) {
        sent = fake_frame(fd, WEFT_SOCK_DATA, 7, 0, 16, 0);
    } else if (strcmp(n, "step") == 0) {
        sent = fake_frame(fd, WEFT_SOCK_DATA, 0, 5, 16, 0);
    } else if (strcmp(n, "bytes") == 0) {
        sent = fake_frame(fd, WEFT_SOCK_DATA, 0, 0, SLOT_BYTES, 0);
    } else if (strcmp(n, "credit") == 0) {
        sent = fake_frame(fd, WEFT_SOCK_CREDIT, 0, 100, 0, 0);
    } else if (strcmp(n, "eof") == 0) {
        shutdown(fd, SHUT_WR); /* FIN; a close() with unread data would reset instead */
    } else if (strcmp(n, "eof-mid-frame") == 0) {
        struct weft_sock_frame f = {.version = WEFT_SOCK_VERSION};
        sent = fake_send(fd, &f, 10);
        shutdown(fd, SHUT_WR);
    } else if (strcmp(n, "left") == 0) {
        sent = fake_frame(fd, WEFT_SOCK_BYE, 0, 0, 0, 0);
        shutdown(fd, SHUT_WR);
    } else if (strcmp(n, "reset") == 0) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(fd);
        fd = -1;
    }
    /* Stay connected: the error must come from the check, not from our going away. */
    sleep(8);
    if (fd >= 0)
        close(fd);
    close(lfd);
    weft_bootstrap_close(bs);
    return !sent;
}

int main(int argc, char **argv)
{
    const struct wire_case *c = NULL;
    for (size_t i = 0; argc == 2 && i < sizeof(cases) / sizeof(cases[0]); i++)
        if (strcmp(argv[1], cases[i].name) == 0)
            c = &cases[i];
    if (c == NULL) {
        fprintf(stderr, "usage: %s CASE (version, check, type, channel, step, bytes, credit, eof, "
                        "eof-mid-frame, reset, left)\n",
                argv[0]);
        return 2;
    }
    env_common();
    ncclUniqueId id;
    struct weft_test_id_pipe ip;
    if (weft_test_id_pipe_open(&ip) != 0)
        return 1;
    fflush(NULL);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(weft_test_scaled(40));
            if (weft_test_id_pipe_recv(&ip, &id) != 0)
                _exit(3);
            _exit(r == 0 ? real_rank(c, id) : fake_rank(c, id));
        }
    }
    weft_test_id_pipe_send(&ip, 2, &id);
    int status, bad = 0;
    waitpid(pids[0], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        bad = 1;
    kill(pids[1], SIGKILL); /* its job is done once rank 0 has judged it */
    waitpid(pids[1], &status, 0);
    return bad;
}
