/*
 * What the launch tests need to pose as torchrun: a loopback TCP port for the store, and the
 * environment torchrun gives each rank.
 */
#ifndef WEFT_TEST_TORCHRUN_ENV_H
#define WEFT_TEST_TORCHRUN_ENV_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* A loopback TCP port nobody listens on now, or 0. */
static inline int weft_test_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* torchrun's environment for rank `rank` of n ranks on this host, the store at
 * 127.0.0.1:port, under run id run_id. */
static inline void weft_test_torchrun_env(int rank, int n, int port, const char *run_id)
{
    char v[32];
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", n);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof(v), "%d", port);
    setenv("MASTER_PORT", v, 1);
    setenv("TORCHELASTIC_RUN_ID", run_id, 1);
}

#endif
