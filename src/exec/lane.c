/* The step engine: moves a lane's steps through FIFO connections one slot-sized slice at a time. */
#include <string.h>

#include "exec/lane.h"
#include "exec/wait.h"

/* How many slices one call may move before returning, so other lanes get their turn. */
#define WEFT_LANE_BUDGET 16

void weft_lane_init(struct weft_lane *lane)
{
    lane->cur = 0;
    lane->cur_done = 0;
    lane->bytes_sent = 0;
    lane->bytes_recv = 0;
    lane->error_peer = -1;
    lane->error_got_bytes = 0;
    lane->error_want_bytes = 0;
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

        struct weft_conn *rc = step_recvs(s->op) ? lane->peers[s->recv_peer].recv : NULL;
        struct weft_conn *sc = step_sends(s->op) ? lane->peers[s->send_peer].send : NULL;
        size_t slot_bytes = rc != NULL ? rc->slot_bytes : sc->slot_bytes;
        uint64_t n = weft_slot_payload(slot_bytes) / es;
        if (n > s->count - lane->cur_done)
            n = s->count - lane->cur_done;
        uint32_t nbytes = (uint32_t)(n * es);

        /* Wait for data and credit without blocking. */
        struct weft_slot_header *in_hdr = NULL;
        if (rc != NULL) {
            in_hdr = (struct weft_slot_header *)(rc->slots +
                                                 (size_t)(rc->step % WEFT_STEPS) * rc->slot_bytes);
            if (__atomic_load_n(&in_hdr->seq, __ATOMIC_ACQUIRE) != rc->step + 1) {
                if (blocked_peer_p != NULL) {
                    *blocked_peer_p = s->recv_peer;
                    *blocked_send_p = 0;
                }
                break;
            }
        }
        if (sc != NULL && sc->head_seen + WEFT_STEPS <= sc->step) {
            sc->head_seen = __atomic_load_n(&sc->ctrl->head, __ATOMIC_ACQUIRE);
            if (sc->head_seen + WEFT_STEPS <= sc->step) {
                if (blocked_peer_p != NULL) {
                    *blocked_peer_p = s->send_peer;
                    *blocked_send_p = 1;
                }
                break;
            }
        }

        const char *in = NULL;
        if (rc != NULL) {
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
            out_hdr = (struct weft_slot_header *)(sc->slots +
                                                  (size_t)(sc->step % WEFT_STEPS) * sc->slot_bytes);
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
            weft_reduce(lane->op, dst, in, src, n, lane_reduce_flags(s));
            memcpy(out, dst, nbytes);
            break;
        case WEFT_STEP_RECV_COPY_SEND:
            memcpy(dst, in, nbytes);
            memcpy(out, in, nbytes);
            break;
        default:
            break;
        }

        /* Publish: the data before the counter (release), then wake whoever polls it. */
        if (sc != NULL) {
            out_hdr->bytes = nbytes;
            __atomic_store_n(&out_hdr->seq, sc->step + 1, __ATOMIC_RELEASE);
            sc->step++;
            weft_doorbell_ring(sc->peer_bell);
            lane->bytes_sent += nbytes;
        }
        if (rc != NULL) {
            __atomic_store_n(&rc->ctrl->head, rc->step + 1, __ATOMIC_RELEASE);
            rc->step++;
            weft_doorbell_ring(rc->peer_bell);
            lane->bytes_recv += nbytes;
        }
        moved = 1;
        lane->cur_done += n;
        if (lane->cur_done == s->count) {
            lane->cur++;
            lane->cur_done = 0;
        }
    }
    return moved;
}
