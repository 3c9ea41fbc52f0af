/* The calls every layer makes on a communicator's state (core/communicator.h). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/communicator.h"

int weft_host_oversubscribed;

void weft_comm_set_error(struct ncclComm *comm, ncclResult_t res)
{
    if (WEFT_IS_ERROR(res)) {
        ncclResult_t none = ncclSuccess;
        __atomic_compare_exchange_n(&comm->async_error, &none, res, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
    }
}

void weft_comm_set_net_error(struct ncclComm *comm, ncclResult_t res, const char *fmt, ...)
{
    if (__atomic_exchange_n(&comm->net_error_claimed, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(comm->net_error_msg, sizeof(comm->net_error_msg), fmt, ap);
    va_end(ap);
    __atomic_store_n(&comm->net_error, res, __ATOMIC_RELEASE);
}

/* 0 once the process is gone or a zombie (a dead child nobody has reaped yet). */
static int weft_pid_alive(int pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 1; /* no /proc: trust kill() */
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* the state follows the command name */
    return !(paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

int weft_comm_peer_departed(const struct ncclComm *comm, int p)
{
    int t = comm->peer_transport != NULL ? comm->peer_transport[p] : -1;
    return t >= 0 && comm->transports[t]->peer_departed(comm->transport_states[t], p);
}

int weft_comm_peer_alive(const struct ncclComm *comm, int p)
{
    const struct weft_peer_info *peer = &comm->peer_info[p], *self = &comm->peer_info[comm->rank];
    if (p == comm->rank || peer->host_hash != self->host_hash)
        return 1;
    int t = comm->peer_transport != NULL ? comm->peer_transport[p] : -1;
    int fd = t >= 0 ? comm->transports[t]->peer_lock_fd(comm->transport_states[t], p) : -1;
    /* A peer that destroyed the communicator dropped its lock with it: only its pid tells. */
    int departed = weft_comm_peer_departed(comm, p);
    if (fd >= 0 && !departed) {
        /* The peer's lock on its segment goes when its last descriptor does, at its exit. */
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        if (fcntl(fd, F_OFD_GETLK, &fl) == 0)
            return fl.l_type != F_UNLCK;
    }
    if (peer->pid_ns != self->pid_ns || peer->pid_ns == 0 || peer->pid == self->pid)
        return 1;
    return weft_pid_alive(peer->pid);
}

const char *weft_comm_peer_where(const struct ncclComm *comm, int p, char *buf, size_t len)
{
    if (p < 0 || p >= comm->nranks) {
        snprintf(buf, len, "unknown");
        return buf;
    }
    const struct weft_peer_info *peer = &comm->peer_info[p], *self = &comm->peer_info[comm->rank];
    int same_machine =
        peer->machine_hash == self->machine_hash && peer->host_hash == self->host_hash;
    if (same_machine && peer->pid_ns == self->pid_ns && peer->pid == self->pid)
        snprintf(buf, len, "in this process");
    else if (same_machine)
        snprintf(buf, len, "pid %d on this host", (int)peer->pid);
    else
        snprintf(buf, len, "pid %d on host %s", (int)peer->pid, peer->hostname);
    return buf;
}
