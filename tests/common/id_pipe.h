/*
 * Forking ranks before any thread exists: ncclGetUniqueId starts the bootstrap root thread, and a
 * process forked from a multi-threaded one breaks ThreadSanitizer (its threads reuse the parent's
 * thread ids: "dup thread with used id"). So the harness forks first, then takes the id and
 * hands every child a copy through a pipe (128 bytes: one atomic write each).
 */
#ifndef WEFT_TEST_ID_PIPE_H
#define WEFT_TEST_ID_PIPE_H

#include <stdio.h>
#include <unistd.h>

#include "nccl.h"

struct weft_test_id_pipe {
    int fd[2];
};

static inline int weft_test_id_pipe_open(struct weft_test_id_pipe *p)
{
    if (pipe(p->fd) != 0) {
        perror("pipe");
        return -1;
    }
    return 0;
}

/* In a child: waits for the id; -1 when the parent could not make one. */
static inline int weft_test_id_pipe_recv(struct weft_test_id_pipe *p, ncclUniqueId *id)
{
    close(p->fd[1]);
    size_t got = 0;
    while (got < sizeof(*id)) {
        ssize_t n = read(p->fd[0], (char *)id + got, sizeof(*id) - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    close(p->fd[0]);
    return 0;
}

/* In the parent, after every fork: takes the id and sends n copies; -1 on failure (the children
 * then read EOF and exit). */
static inline int weft_test_id_pipe_send(struct weft_test_id_pipe *p, int n, ncclUniqueId *id)
{
    close(p->fd[0]);
    int res = 0;
    if (ncclGetUniqueId(id) != ncclSuccess) {
        fprintf(stderr, "ncclGetUniqueId failed: %s\n", ncclGetLastError(NULL));
        res = -1;
    }
    for (int i = 0; i < n && res == 0; i++)
        if (write(p->fd[1], id, sizeof(*id)) != (ssize_t)sizeof(*id))
            res = -1;
    close(p->fd[1]);
    return res;
}

#endif
