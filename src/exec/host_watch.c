/*
 * The host executor's watch (see host.c): while a run is blocked, the checks that turn an abort,
 * a connection failure, a peer that exited or a run past WEFT_TIMEOUT into an error naming the
 * peer and the operation; and the messages of a lane that failed.
 */
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/communicator.h"
#include "core/param.h"
#include "exec/host_run.h"
#include "exec/sig.h"

WEFT_PARAM(Timeout, "WEFT_TIMEOUT", 300,
           "seconds an operation may wait for a peer without any progress before it fails");

ncclResult_t weft_host_lane_error(struct weft_exec_lane *el)
{
    struct ncclComm *comm = el->task->comm;
    if (el->lane.error_errno != 0) {
        int p = el->lane.error_peer;
        WEFT_WARN("rank %d: cannot read the data peer %d (pid %d) sent in %s (operation %llu) "
                  "with process_vm_readv: %s", comm->rank, p, comm->peer_info[p].pid,
                  el->task->api, (unsigned long long)el->seq, strerror(el->lane.error_errno));
        return ncclSystemError;
    }
    if (el->lane.error_sig != 0)
        return weft_sig_mismatch(comm, el->rec, el->lane.error_peer, el->lane.error_sig);
    WEFT_WARN("rank %d: peer %d sent a %u-byte slice where %u bytes were expected in %s "
              "(operation %llu): count or datatype differ between ranks",
              comm->rank, el->lane.error_peer, el->lane.error_got_bytes,
              el->lane.error_want_bytes, el->task->api, (unsigned long long)el->seq);
    return ncclInvalidUsage;
}

/* Checks abort, the peer's process and the deadline while blocked. */
ncclResult_t weft_host_check_stuck(struct weft_exec_lane *lanes, int nlanes,
                                   const struct weft_exec_block *block, uint64_t idle_ns)
{
    for (int i = 0; i < nlanes; i++) {
        struct ncclComm *comm = lanes[i].task->comm;
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)) {
            /* Name what this rank waited for when the wait was this communicator's. */
            char awaited[WEFT_HOSTNAME_LEN + 96] = "", where[WEFT_HOSTNAME_LEN + 48];
            if (block->lane >= 0 && block->peer >= 0 && lanes[block->lane].task->comm == comm)
                snprintf(awaited, sizeof(awaited), " while it waited for %s from peer %d (%s)",
                         block->send ? "buffer space" : "data", block->peer,
                         weft_comm_peer_where(comm, block->peer, where, sizeof(where)));
            WEFT_WARN("rank %d: communicator %s during %s (operation %llu)%s", comm->rank,
                      comm->revoked ? "revoked" : "aborted", lanes[i].task->api,
                      (unsigned long long)lanes[i].seq, awaited);
            return ncclInvalidUsage;
        }
        ncclResult_t net = __atomic_load_n(&comm->net_error, __ATOMIC_ACQUIRE);
        if (net != ncclSuccess) {
            WEFT_WARN("rank %d: %s; %s (operation %llu) fails", comm->rank, comm->net_error_msg,
                      lanes[i].task->api, (unsigned long long)lanes[i].seq);
            return net;
        }
    }
    if (block->lane < 0)
        return ncclSuccess;
    struct weft_exec_lane *el = &lanes[block->lane];
    struct ncclComm *comm = el->task->comm;
    const struct weft_peer_info *peer = &comm->peer_info[block->peer];
    const struct weft_peer_info *self = &comm->peer_info[comm->rank];
    int pid = peer->pid;
    if (!weft_comm_peer_alive(comm, block->peer)) {
        WEFT_WARN("rank %d: peer %d (pid %d, host %s) exited while this rank waited for %s in %s "
                  "(operation %llu)",
                  comm->rank, block->peer, pid, peer->hostname,
                  block->send ? "buffer space" : "data", el->task->api,
                  (unsigned long long)el->seq);
        return ncclRemoteError;
    }
    /* Another local rank died: the ranks we wait for may be stuck behind it, or failed over the
     * network and wait themselves. Name it now rather than a live peer at the deadline. */
    for (int p = 0; p < comm->nranks; p++) {
        const struct weft_peer_info *other = &comm->peer_info[p];
        if (p == block->peer || other->host_hash != self->host_hash || other->pid == self->pid ||
            weft_comm_peer_alive(comm, p))
            continue;
        /* It destroyed the communicator before exiting: its part is done, not a crash. */
        if (weft_comm_peer_departed(comm, p))
            continue;
        WEFT_WARN("rank %d: peer %d (pid %d, host %s) exited while this rank waited for %s from "
                  "peer %d in %s (operation %llu)",
                  comm->rank, p, other->pid, other->hostname,
                  block->send ? "buffer space" : "data", block->peer, el->task->api,
                  (unsigned long long)el->seq);
        return ncclRemoteError;
    }
    uint64_t timeout_ns = (uint64_t)weft_param_Timeout() * 1000000000ull;
    if (idle_ns > timeout_ns) {
        char msg[1024], where[WEFT_HOSTNAME_LEN + 48];
        snprintf(msg, sizeof(msg),
                 "rank %d: no progress for %llu s waiting for %s from peer %d (%s) in %s "
                 "(operation %llu); the peer is stuck or issued different operations",
                 comm->rank, (unsigned long long)(idle_ns / 1000000000ull),
                 block->send ? "buffer space" : "data", block->peer,
                 weft_comm_peer_where(comm, block->peer, where, sizeof(where)), el->task->api,
                 (unsigned long long)el->seq);
        struct weft_sig_wait w;
        weft_host_sig_wait(el, block, &w);
        WEFT_CHECK(weft_sig_deadline(comm, &w, idle_ns, msg, sizeof(msg)));
        WEFT_WARN("%s", msg);
        return ncclRemoteError;
    }
    return ncclSuccess;
}
