/* The step engine: moves a lane's steps through FIFO connections one slot-sized slice at a time. */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "exec/lane.h"
#include "exec/wait.h"

/* How many slices one call may move before returning, so other lanes get their turn. */
#define WEFT_LANE_BUDGET 16
/* Bytes a fused reduce-then-copy step handles at a time (well inside L1 with its inputs). */
#define LANE_TILE_BYTES 4096

void weft_lane_init(struct weft_lane *lane)
{
    lane->cur = 0;
    lane->cur_done = 0;
    lane->bytes_sent = 0;
    lane->bytes_recv = 0;
    lane->error_peer = -1;
    lane->error_got_bytes = 0;
    lane->error_want_bytes = 0;
    lane->error_sig = 0;
    lane->mismatch_checks = 0;
    lane->error_errno = 0;
    lane->direct_pending = 0;
    lane->direct_scan = 0;
    lane->awaited = NULL;
}

static inline int step_recvs(int op)
{
    return op != WEFT_STEP_SEND && op != WEFT_STEP_COPY;
}

static inline int step_sends(int op)
{
    return op == WEFT_STEP_SEND || op == WEFT_STEP_RECV_REDUCE_SEND ||
           op == WEFT_STEP_RECV_REDUCE_COPY_SEND || op == WEFT_STEP_RECV_COPY_SEND;
}

static inline const char *lane_src(const struct weft_lane *lane, const struct weft_step *s)
{
    const char *base = s->src == WEFT_BUF_OUTPUT ? (const char *)lane->output : lane->input;
    return base + s->src_off * lane->elem_size;
}

static inline char *lane_dst(const struct weft_lane *lane, const struct weft_step *s)
{
    return (char *)lane->output + s->dst_off * lane->elem_size;
}

/* Flags for weft_reduce when this step combines data with its local src. */
static inline int lane_reduce_flags(const struct weft_step *s)
{
    return (s->src == WEFT_BUF_INPUT ? WEFT_REDUCE_PRE_B : 0) |
           (s->flags & WEFT_STEP_FINAL ? WEFT_REDUCE_POST : 0);
}

/* Copies local data, applying the operator's pre/post transforms when the step needs them. */
static void lane_copy(const struct weft_lane *lane, const struct weft_step *s, void *dst,
                      const void *src, uint64_t n)
{
    const struct weft_redop *op = lane->op;
    int flags = lane_reduce_flags(s);
    int transform = op != NULL && ((op->premul && (flags & WEFT_REDUCE_PRE_B)) ||
                                   (op->postdiv && (flags & WEFT_REDUCE_POST)));
    if (transform)
        weft_reduce(op, dst, NULL, src, n, flags);
    else if (dst != src)
        memcpy(dst, src, n * lane->elem_size);
}

/* The current slice of step s: its receive and send FIFOs (NULL where it has none) and size. */
struct lane_slice {
    struct weft_conn *rc, *sc;
    uint64_t n;      /* elements */
    uint32_t nbytes;
};

static void lane_slice(const struct weft_lane *lane, const struct weft_step *s,
                       struct lane_slice *sl)
{
    size_t es = lane->elem_size;
    sl->rc = step_recvs(s->op) ? lane->peers[s->recv_peer].recv : NULL;
    sl->sc = step_sends(s->op) ? lane->peers[s->send_peer].send : NULL;
    size_t slot_bytes = sl->rc != NULL ? sl->rc->slot_bytes : sl->sc->slot_bytes;
    /* Element sizes are powers of two: a shift, not a 64-bit division on every poll. */
    sl->n = weft_slot_payload(slot_bytes) >> __builtin_ctzll(es);
    if (sl->n > s->count - lane->cur_done)
        sl->n = s->count - lane->cur_done;
    sl->nbytes = (uint32_t)(sl->n * es);
    /* A step small enough for one LL slot takes the LL FIFOs where the connections have them
     * (the tail of a large step stays with the rest of it). */
    if (lane->ll && s->count * es <= WEFT_LL_PAYLOAD) {
        if (sl->rc != NULL && sl->rc->ll != NULL)
            sl->rc = sl->rc->ll;
        if (sl->sc != NULL && sl->sc->ll != NULL)
            sl->sc = sl->sc->ll;
    }
}

/* 1 when sc has a free slot (re-reading the receiver's head only when the cached one says no);
 * else 0, with the blocked peer set. */
static inline int lane_send_credit(struct weft_conn *sc, int peer, int *blocked_peer_p,
                                   int *blocked_send_p)
{
    if (weft_fifo_has_credit(sc->head_seen, sc->step, sc->nslots))
        return 1;
    sc->head_seen = __atomic_load_n(&sc->ctrl->head, __ATOMIC_ACQUIRE);
    if (weft_fifo_has_credit(sc->head_seen, sc->step, sc->nslots))
        return 1;
    if (blocked_peer_p != NULL) {
        *blocked_peer_p = peer;
        *blocked_send_p = 1;
    }
    return 0;
}

/* Publishes sc's current slot hdr (header field bytes; payload bytes for the statistics): the
 * data before the counter (release), then wakes whoever polls it. */
static inline void lane_post(struct weft_lane *lane, struct weft_conn *sc,
                             struct weft_slot_header *hdr, uint32_t bytes, uint64_t payload)
{
    hdr->bytes = bytes;
    hdr->sig = lane->sig;
    __atomic_store_n(&hdr->seq, sc->step + 1, __ATOMIC_RELEASE);
    sc->step++;
    weft_doorbell_ring(sc->peer_bell);
    lane->bytes_sent += payload;
}

/* Returns rc's current slot to the sender and wakes it. */
static inline void lane_free(struct weft_lane *lane, struct weft_conn *rc, uint64_t payload)
{
    __atomic_store_n(&rc->ctrl->head, rc->step + 1, __ATOMIC_RELEASE);
    rc->step++;
    weft_doorbell_ring(rc->peer_bell);
    lane->bytes_recv += payload;
}

/* The peer whose reads of the lane's direct sends are still due (-1: none, and the lane no
 * longer waits on any). Scans the peers once over the lane's end, not per poll. */
static int lane_direct_unread(struct weft_lane *lane)
{
    for (; lane->direct_scan < lane->nranks; lane->direct_scan++) {
        struct weft_conn *c = lane->peers[lane->direct_scan].send;
        if (c == NULL || c->head_seen >= c->direct_until)
            continue;
        c->head_seen = __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE);
        if (c->head_seen < c->direct_until)
            return lane->direct_scan;
    }
    lane->direct_pending = 0;
    return -1;
}

/* Posts SEND step s (none of it moved yet) as one direct slot on sc; 0: no credit. */
static int lane_direct_send(struct weft_lane *lane, const struct weft_step *s,
                            struct weft_conn *sc, int *blocked_peer_p, int *blocked_send_p)
{
    if (!lane_send_credit(sc, s->send_peer, blocked_peer_p, blocked_send_p))
        return 0;
    /* Point-to-point work: the step and every following one to the same peer that continues it
     * in memory go as one read (the receiver's steps of it are cut alike). */
    const char *src = lane_src(lane, s);
    uint64_t bytes = s->count * lane->elem_size, k = 1;
    while (lane->direct_coalesce && lane->cur + k < lane->nsteps) {
        const struct weft_step *t = &lane->steps[lane->cur + k];
        if (t->op != WEFT_STEP_SEND || t->send_peer != s->send_peer || t->src != s->src ||
            lane_src(lane, t) != src + bytes)
            break;
        bytes += t->count * lane->elem_size;
        k++;
    }
    struct weft_slot_header *hdr = weft_conn_slot(sc, sc->step);
    struct weft_direct_desc *d = (struct weft_direct_desc *)((char *)hdr + WEFT_SLOT_HEADER);
    d->addr = (uint64_t)(uintptr_t)src;
    d->bytes = bytes;
    d->revoked = 0;
    lane_post(lane, sc, hdr, WEFT_SLOT_DIRECT, bytes);
    sc->direct_until = sc->step;
    lane->direct_pending = 1;
    lane->direct_scan = 0;
    lane->cur += k;
    lane->cur_done = 0;
    return 1;
}

static int lane_direct_revoked(const struct weft_direct_desc *d)
{
    return __atomic_load_n(&d->revoked, __ATOMIC_ACQUIRE) != 0;
}

/* Reads a direct send described at d into dst: RECV step s and as many following steps from the
 * same peer, continuing it in memory, as the sender covered (*steps_p of them). 0: read; 1: the
 * sender revoked it (nothing to use: wait); -1 with error_* set: the peer described another size,
 * or its memory could not be read. */
static int lane_direct_recv(struct weft_lane *lane, const struct weft_step *s,
                            const struct weft_conn *rc, const struct weft_direct_desc *d,
                            uint64_t *steps_p)
{
    char *dst = lane_dst(lane, s);
    uint64_t want = s->count * lane->elem_size, k = 1;
    while (want < d->bytes && lane->cur + k < lane->nsteps) {
        const struct weft_step *t = &lane->steps[lane->cur + k];
        if (t->op != WEFT_STEP_RECV || t->recv_peer != s->recv_peer || lane_dst(lane, t) != dst + want)
            break;
        want += t->count * lane->elem_size;
        k++;
    }
    *steps_p = k;
    if (s->op != WEFT_STEP_RECV || lane->cur_done != 0 || d->bytes != want ||
        rc->direct == WEFT_DIRECT_NONE) {
        lane->error_peer = s->recv_peer;
        lane->error_got_bytes = d->bytes < UINT32_MAX ? (uint32_t)d->bytes : UINT32_MAX - 1;
        lane->error_want_bytes = want < UINT32_MAX ? (uint32_t)want : UINT32_MAX - 1;
        return -1;
    }
    if (lane_direct_revoked(d))
        return 1;
    if (rc->direct == WEFT_DIRECT_MEMCPY) {
        memcpy(dst, (const void *)(uintptr_t)d->addr, want);
        return lane_direct_revoked(d);
    }
    for (uint64_t done = 0; done < want;) {
        struct iovec local = {dst + done, want - done};
        struct iovec remote = {(void *)(uintptr_t)(d->addr + done), want - done};
        ssize_t got = process_vm_readv(rc->direct_pid, &local, 1, &remote, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (lane_direct_revoked(d))
                return 1;
            lane->error_peer = s->recv_peer;
            lane->error_errno = got < 0 ? errno : EIO;
            return -1;
        }
        done += (uint64_t)got;
    }
    /* revoked while we read: the buffer may have changed under the copy */
    return lane_direct_revoked(d);
}

void weft_lane_revoke_direct(struct weft_lane *lane)
{
    for (int p = 0; lane->direct_pending && p < lane->nranks; p++) {
        struct weft_conn *c = lane->peers[p].send;
        if (c == NULL)
            continue;
        for (uint64_t st = __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE);
             st < c->direct_until; st++) {
            struct weft_slot_header *hdr = weft_conn_slot(c, st);
            if (hdr->bytes != WEFT_SLOT_DIRECT)
                continue;
            struct weft_direct_desc *d = (struct weft_direct_desc *)((char *)hdr + WEFT_SLOT_HEADER);
            __atomic_store_n(&d->revoked, 1, __ATOMIC_RELEASE);
        }
    }
    /* visible before the caller returns and its user may change the buffers */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    lane->direct_pending = 0;
}

int weft_lane_check_mismatch(struct weft_lane *lane, int checks)
{
    if (lane->cur >= lane->nsteps)
        return 0;
    const struct weft_step *s = &lane->steps[lane->cur];
    if (!step_recvs(s->op) || s->op == WEFT_STEP_COPY)
        return 0;
    struct lane_slice sl;
    lane_slice(lane, s, &sl);
    const struct weft_conn *main = lane->peers[s->recv_peer].recv;
    const struct weft_conn *other = sl.rc == main ? main->ll : main;
    if (other == NULL)
        return 0;
    struct weft_slot_header *hdr = weft_conn_slot(sl.rc, sl.rc->step), *o = weft_conn_slot(other, other->step);
    if (__atomic_load_n(&o->seq, __ATOMIC_ACQUIRE) != other->step + 1 ||
        /* The acquire above makes every earlier post of the peer visible: look once more. */
        __atomic_load_n(&hdr->seq, __ATOMIC_ACQUIRE) == sl.rc->step + 1) {
        lane->mismatch_checks = 0;
        return 0;
    }
    /* Through a proxy the other FIFO may legitimately run ahead for a while. */
    if (!main->ll_ordered && ++lane->mismatch_checks < checks)
        return 0;
    lane->error_peer = s->recv_peer;
    lane->error_got_bytes = o->bytes;
    lane->error_want_bytes = sl.nbytes;
    if (lane->sig != 0 && o->sig != 0 && o->sig != lane->sig)
        lane->error_sig = o->sig;
    return -1;
}

int weft_lane_progress(struct weft_lane *lane, int *blocked_peer_p, int *blocked_send_p)
{
    int moved = 0;
    for (int budget = 0; budget < WEFT_LANE_BUDGET && lane->cur < lane->nsteps; budget++) {
        const struct weft_step *s = &lane->steps[lane->cur];
        size_t es = lane->elem_size;

        if (s->op == WEFT_STEP_COPY) {
            lane_copy(lane, s, lane_dst(lane, s), lane_src(lane, s), s->count);
            lane->cur++;
            lane->cur_done = 0;
            moved = 1;
            continue;
        }

        if (s->op == WEFT_STEP_SEND && lane->direct_min_bytes != 0 && lane->cur_done == 0 &&
            s->count * es >= lane->direct_min_bytes &&
            lane->peers[s->send_peer].send->direct != WEFT_DIRECT_NONE) {
            if (!lane_direct_send(lane, s, lane->peers[s->send_peer].send, blocked_peer_p,
                                  blocked_send_p))
                break;
            moved = 1;
            continue;
        }

        struct lane_slice sl;
        lane_slice(lane, s, &sl);
        struct weft_conn *rc = sl.rc, *sc = sl.sc;
        uint64_t n = sl.n;
        uint32_t nbytes = sl.nbytes;

        /* Wait for data and credit without blocking. */
        struct weft_slot_header *in_hdr = NULL;
        if (rc != NULL) {
            in_hdr = weft_conn_slot(rc, rc->step);
            if (__atomic_load_n(&in_hdr->seq, __ATOMIC_ACQUIRE) != rc->step + 1) {
                lane->awaited = &in_hdr->seq;
                lane->awaited_seq = rc->step + 1;
                if (blocked_peer_p != NULL) {
                    *blocked_peer_p = s->recv_peer;
                    *blocked_send_p = 0;
                }
                break;
            }
        }
        if (sc != NULL && !lane_send_credit(sc, s->send_peer, blocked_peer_p, blocked_send_p))
            break;

        const char *in = NULL;
        if (rc != NULL) {
            /* Another operation's slice (sig 0: the sender does not check). */
            uint32_t sig = in_hdr->sig;
            if (__builtin_expect(sig != lane->sig, 0) && sig != 0 && lane->sig != 0) {
                lane->error_peer = s->recv_peer;
                lane->error_got_bytes = in_hdr->bytes;
                lane->error_want_bytes = nbytes;
                lane->error_sig = sig;
                return -1;
            }
            if (__builtin_expect(in_hdr->bytes == WEFT_SLOT_DIRECT, 0)) {
                const struct weft_direct_desc *d =
                    (const struct weft_direct_desc *)((const char *)in_hdr + WEFT_SLOT_HEADER);
                uint64_t k = 1;
                int got = lane_direct_recv(lane, s, rc, d, &k);
                if (got < 0)
                    return -1;
                if (got > 0) {
                    lane->awaited = NULL; /* waits for the peer's failure, not a slice */
                    if (blocked_peer_p != NULL) {
                        *blocked_peer_p = s->recv_peer;
                        *blocked_send_p = 0;
                    }
                    break;
                }
                rc->direct_reads++;
                lane_free(lane, rc, d->bytes);
                lane->cur += k;
                lane->cur_done = 0;
                moved = 1;
                continue;
            }
            if (in_hdr->bytes != nbytes) {
                lane->error_peer = s->recv_peer;
                lane->error_got_bytes = in_hdr->bytes;
                lane->error_want_bytes = nbytes;
                return -1;
            }
            in = (const char *)in_hdr + WEFT_SLOT_HEADER;
        }
        char *out = NULL;
        struct weft_slot_header *out_hdr = NULL;
        if (sc != NULL) {
            out_hdr = weft_conn_slot(sc, sc->step);
            out = (char *)out_hdr + WEFT_SLOT_HEADER;
        }
        const char *src = lane_src(lane, s) + lane->cur_done * es;
        char *dst = lane_dst(lane, s) + lane->cur_done * es;

        switch (s->op) {
        case WEFT_STEP_SEND:
            lane_copy(lane, s, out, src, n);
            break;
        case WEFT_STEP_RECV:
            memcpy(dst, in, nbytes);
            break;
        case WEFT_STEP_RECV_REDUCE_SEND:
            weft_reduce(lane->op, out, in, src, n, lane_reduce_flags(s));
            break;
        case WEFT_STEP_RECV_REDUCE_COPY:
            weft_reduce(lane->op, dst, in, src, n, lane_reduce_flags(s));
            break;
        case WEFT_STEP_RECV_REDUCE_COPY_SEND:
            /* Tile by tile, so that the copy into the FIFO reads the result from L1 rather than
             * reading the whole slot's output back from L2 or beyond. */
            for (uint64_t t = 0, tile = LANE_TILE_BYTES / es; t < n; t += tile) {
                uint64_t m = n - t < tile ? n - t : tile;
                weft_reduce(lane->op, dst + t * es, in + t * es, src + t * es, m,
                            lane_reduce_flags(s));
                memcpy(out + t * es, dst + t * es, m * es);
            }
            break;
        case WEFT_STEP_RECV_COPY_SEND:
            memcpy(dst, in, nbytes);
            memcpy(out, in, nbytes);
            break;
        default:
            break;
        }

        if (sc != NULL)
            lane_post(lane, sc, out_hdr, nbytes, nbytes);
        if (rc != NULL)
            lane_free(lane, rc, nbytes);
        moved = 1;
        lane->cur_done += n;
        if (lane->cur_done == s->count) {
            lane->cur++;
            lane->cur_done = 0;
        }
    }
    /* Every step ran: the lane ends once the peers have read its direct sends. */
    if (__builtin_expect(lane->direct_pending, 0) && lane->cur >= lane->nsteps) {
        int p = lane_direct_unread(lane);
        if (p < 0)
            moved = 1;
        else if (blocked_peer_p != NULL) {
            *blocked_peer_p = p;
            *blocked_send_p = 1;
        }
    }
    return moved;
}
