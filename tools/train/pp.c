/*
 * pp.c -- pipeline schedules (GPipe, 1F1B) and their executor.
 *
 * A schedule is a list of actions for one stage. Actions with the same nonzero group id are
 * issued together inside ncclGroupStart/ncclGroupEnd (Megatron's send_fwd_recv_bwd and
 * send_bwd_recv_fwd); compute actions always have group 0. Backward always runs in micro-batch
 * order 0..m-1, so GPipe and 1F1B accumulate gradients in the same order and give bit-identical
 * results.
 *
 * The executor runs on mesh->pp_comm (group rank == pp_rank; the previous stage is pp_rank-1, the
 * next pp_rank+1). Point-to-point calls are blocking (stream NULL), so a group has completed
 * when ncclGroupEnd returns and its buffers may be reused.
 */
#include <stdlib.h>
#include <string.h>

#include "train.h"

/* ---------------------------------------------------------------------------------------- */
/* Schedules                                                                                  */
/* wt_schedule_build with out == NULL returns the number of actions the schedule has (a size
 * query); otherwise the number written, at most max. */

struct builder {
    struct wt_action *out;
    int max, n, next_group;
};

static void emit(struct builder *b, enum wt_action_kind kind, int mb, int group)
{
    if (b->n < b->max && b->out != NULL) {
        b->out[b->n].kind = kind;
        b->out[b->n].mb = mb;
        b->out[b->n].group = group;
    }
    b->n++;
}

int wt_schedule_build(enum wt_schedule sched, int stage, int p, int m, struct wt_action *out,
                      int max)
{
    struct builder b = {out, max, 0, 1};
    if (p < 1 || m < 1 || stage < 0 || stage >= p)
        return 0;
    const int first = stage == 0, last = stage == p - 1;

    if (sched == WT_SCHED_GPIPE) {
        for (int mb = 0; mb < m; mb++) {
            if (!first)
                emit(&b, WT_ACT_RECV_FWD, mb, 0);
            emit(&b, WT_ACT_FORWARD, mb, 0);
            if (!last)
                emit(&b, WT_ACT_SEND_FWD, mb, 0);
        }
        for (int mb = 0; mb < m; mb++) {
            if (!last)
                emit(&b, WT_ACT_RECV_BWD, mb, 0);
            emit(&b, WT_ACT_BACKWARD, mb, 0);
            if (!first)
                emit(&b, WT_ACT_SEND_BWD, mb, 0);
        }
        return out == NULL ? b.n : b.n < max ? b.n : max;
    }

    /* 1F1B, Megatron's non-interleaved schedule. */
    const int w = (p - stage - 1) < m ? (p - stage - 1) : m;
    const int r = m - w;
    for (int k = 0; k < w; k++) {
        if (!first)
            emit(&b, WT_ACT_RECV_FWD, k, 0);
        emit(&b, WT_ACT_FORWARD, k, 0);
        if (!last)
            emit(&b, WT_ACT_SEND_FWD, k, 0);
    }
    if (r > 0 && !first)
        emit(&b, WT_ACT_RECV_FWD, w, 0);
    for (int j = 0; j < r; j++) {
        const int fmb = w + j, bmb = j;
        emit(&b, WT_ACT_FORWARD, fmb, 0);
        /* send_fwd_recv_bwd: both exist except on the last stage (neither). */
        if (!last) {
            int g = b.next_group++;
            emit(&b, WT_ACT_SEND_FWD, fmb, g);
            emit(&b, WT_ACT_RECV_BWD, bmb, g);
        }
        emit(&b, WT_ACT_BACKWARD, bmb, 0);
        if (j == r - 1) {
            if (!first)
                emit(&b, WT_ACT_SEND_BWD, bmb, 0);
        } else if (!first) {
            /* send_bwd_recv_fwd */
            int g = b.next_group++;
            emit(&b, WT_ACT_SEND_BWD, bmb, g);
            emit(&b, WT_ACT_RECV_FWD, fmb + 1, g);
        }
    }
    for (int k = r; k < m; k++) {
        if (!last)
            emit(&b, WT_ACT_RECV_BWD, k, 0);
        emit(&b, WT_ACT_BACKWARD, k, 0);
        if (!first)
            emit(&b, WT_ACT_SEND_BWD, k, 0);
    }
    return out == NULL ? b.n : b.n < max ? b.n : max;
}

int wt_schedule_slots(enum wt_schedule sched, int stage, int p, int m)
{
    if (p < 1 || m < 1 || stage < 0 || stage >= p)
        return 0;
    if (sched == WT_SCHED_GPIPE)
        return m;
    return (p - stage) < m ? (p - stage) : m;
}

/* ---------------------------------------------------------------------------------------- */
/* Executor                                                                                   */

struct pp_run {
    struct wt_model *m;
    const struct wt_mesh *mesh;
    int nslots;
    size_t belems;       /* boundary elements */
    size_t tok_elems;    /* batch * T */
    int *slot_of;        /* [nmb]: slot of the micro-batch, -1 when none */
    int *slot_busy;      /* [nslots] */
    float **xin;         /* [nslots] received activations (not first stage) */
    int **tokens, **targets; /* [nslots] */
    float *xout, *dy, *dx;
    size_t comm_bytes;
};

static int slot_get(struct pp_run *r, int mb)
{
    if (r->slot_of[mb] >= 0)
        return r->slot_of[mb];
    for (int s = 0; s < r->nslots; s++) {
        if (!r->slot_busy[s]) {
            r->slot_busy[s] = 1;
            r->slot_of[mb] = s;
            return s;
        }
    }
    return -1;
}

static void slot_put(struct pp_run *r, int mb)
{
    int s = r->slot_of[mb];
    if (s >= 0)
        r->slot_busy[s] = 0;
    r->slot_of[mb] = -1;
}

/* One p2p action inside (or outside) a group. */
static ncclResult_t p2p(struct pp_run *r, const struct wt_action *a)
{
    const int me = r->mesh->pp_rank;
    const size_t bytes = r->belems * sizeof(float);
    switch (a->kind) {
    case WT_ACT_RECV_FWD: {
        int s = slot_get(r, a->mb);
        if (s < 0) {
            WT_ERR("pipeline: no free activation slot for micro-batch %d (nslots %d)", a->mb,
                   r->nslots);
            return ncclInternalError;
        }
        WT_CHECK(wt_recv(r->xin[s], bytes, me - 1, r->mesh->pp_comm));
        return ncclSuccess;
    }
    case WT_ACT_SEND_FWD:
        WT_CHECK(wt_send(r->xout, bytes, me + 1, r->mesh->pp_comm, WT_COLL_SENDRECV));
        return ncclSuccess;
    case WT_ACT_RECV_BWD:
        WT_CHECK(wt_recv(r->dy, bytes, me + 1, r->mesh->pp_comm));
        return ncclSuccess;
    case WT_ACT_SEND_BWD:
        WT_CHECK(wt_send(r->dx, bytes, me - 1, r->mesh->pp_comm, WT_COLL_SENDRECV));
        return ncclSuccess;
    default:
        return ncclInternalError;
    }
}

static int is_recv(enum wt_action_kind k)
{
    return k == WT_ACT_RECV_FWD || k == WT_ACT_RECV_BWD;
}

static void run_free(struct pp_run *r)
{
    if (r->xin != NULL) {
        for (int s = 0; s < r->nslots; s++)
            wt_free(WT_MEM_COMM, r->xin[s], r->belems * sizeof(float));
    }
    if (r->tokens != NULL) {
        for (int s = 0; s < r->nslots; s++) {
            wt_free(WT_MEM_COMM, r->tokens[s], r->tok_elems * sizeof(int));
            wt_free(WT_MEM_COMM, r->targets[s], r->tok_elems * sizeof(int));
        }
    }
    free(r->xin);
    free(r->tokens);
    free(r->targets);
    free(r->slot_of);
    free(r->slot_busy);
    wt_free(WT_MEM_COMM, r->xout, r->belems * sizeof(float));
    wt_free(WT_MEM_COMM, r->dy, r->belems * sizeof(float));
    wt_free(WT_MEM_COMM, r->dx, r->belems * sizeof(float));
}

ncclResult_t wt_pp_run(struct wt_model *m, struct wt_dp *dp, enum wt_schedule sched, int nmb,
                       wt_data_fn data, void *data_ctx, double *loss_p, struct wt_pp_stats *st)
{
    const struct wt_mesh *mesh = m->mesh;
    const int p = mesh->pp, stage = mesh->pp_rank;
    const int first = stage == 0, last = stage == p - 1;
    double t_start = wt_now(), wait = 0.0, loss = 0.0;
    ncclResult_t res = ncclSuccess;

    if (nmb < 1) {
        WT_ERR("pipeline: %d micro-batches", nmb);
        return ncclInvalidArgument;
    }
    if (p > 1 && mesh->pp_comm == NULL) {
        WT_ERR("pipeline: pp %d but no pipeline communicator", p);
        return ncclInvalidArgument;
    }
    /* One stage: forward then backward per micro-batch (1F1B with p = 1), one slot. */
    if (p == 1)
        sched = WT_SCHED_1F1B;
    int need = wt_schedule_slots(sched, stage, p, nmb);
    if (m->nslots < need) {
        WT_ERR("pipeline: the model has %d activation slots, the %s schedule needs %d on stage %d",
               m->nslots, sched == WT_SCHED_GPIPE ? "gpipe" : "1f1b", need, stage);
        return ncclInvalidArgument;
    }

    int nact = wt_schedule_build(sched, stage, p, nmb, NULL, 0);
    struct wt_action *acts = calloc((size_t)nact, sizeof(*acts));
    struct pp_run r;
    memset(&r, 0, sizeof(r));
    r.m = m;
    r.mesh = mesh;
    r.nslots = m->nslots;
    r.belems = wt_model_boundary_elems(m);
    r.tok_elems = (size_t)m->batch * (size_t)m->lay.cfg.seq;
    r.slot_of = malloc((size_t)nmb * sizeof(int));
    r.slot_busy = calloc((size_t)r.nslots, sizeof(int));
    r.xin = calloc((size_t)r.nslots, sizeof(float *));
    r.tokens = calloc((size_t)r.nslots, sizeof(int *));
    r.targets = calloc((size_t)r.nslots, sizeof(int *));
    if (acts == NULL || r.slot_of == NULL || r.slot_busy == NULL || r.xin == NULL ||
        r.tokens == NULL || r.targets == NULL) {
        WT_ERR("pipeline: out of memory");
        free(acts);
        run_free(&r);
        return ncclSystemError;
    }
    wt_schedule_build(sched, stage, p, nmb, acts, nact);
    for (int i = 0; i < nmb; i++)
        r.slot_of[i] = -1;
    for (int s = 0; s < r.nslots; s++) {
        if (!first)
            r.xin[s] = wt_alloc(WT_MEM_COMM, r.belems * sizeof(float));
        r.tokens[s] = wt_alloc(WT_MEM_COMM, r.tok_elems * sizeof(int));
        r.targets[s] = wt_alloc(WT_MEM_COMM, r.tok_elems * sizeof(int));
    }
    if (!last)
        r.xout = wt_alloc(WT_MEM_COMM, r.belems * sizeof(float));
    if (!last)
        r.dy = wt_alloc(WT_MEM_COMM, r.belems * sizeof(float));
    if (!first)
        r.dx = wt_alloc(WT_MEM_COMM, r.belems * sizeof(float));

    if (dp != NULL)
        wt_dp_set_last_microbatch(dp, 0);

    for (int i = 0; i < nact && res == ncclSuccess;) {
        const struct wt_action *a = &acts[i];
        if (a->kind == WT_ACT_FORWARD) {
            int s = slot_get(&r, a->mb);
            if (s < 0) {
                WT_ERR("pipeline: no free activation slot for micro-batch %d", a->mb);
                res = ncclInternalError;
                break;
            }
            data(a->mb, r.tokens[s], r.targets[s], data_ctx);
            double l = 0.0;
            res = wt_model_forward(m, s, r.tokens[s], r.targets[s], first ? NULL : r.xin[s],
                                   last ? NULL : r.xout, last ? &l : NULL);
            if (res != ncclSuccess) {
                WT_ERR("pipeline: forward of micro-batch %d failed", a->mb);
                break;
            }
            if (last)
                loss += l;
            i++;
        } else if (a->kind == WT_ACT_BACKWARD) {
            int s = r.slot_of[a->mb];
            if (s < 0) {
                WT_ERR("pipeline: backward of micro-batch %d before its forward", a->mb);
                res = ncclInternalError;
                break;
            }
            if (dp != NULL && a->mb == nmb - 1)
                wt_dp_set_last_microbatch(dp, 1);
            res = wt_model_backward(m, s, last ? NULL : r.dy, first ? NULL : r.dx);
            if (res != ncclSuccess) {
                WT_ERR("pipeline: backward of micro-batch %d failed", a->mb);
                break;
            }
            slot_put(&r, a->mb);
            i++;
        } else {
            /* A p2p action alone, or the whole group it starts. */
            int j = i + 1;
            if (a->group != 0)
                while (j < nact && acts[j].group == a->group)
                    j++;
            int has_recv = 0;
            for (int k = i; k < j; k++)
                has_recv |= is_recv(acts[k].kind);
            double t0 = wt_now();
            if (j - i > 1) {
                res = ncclGroupStart();
                for (int k = i; k < j && res == ncclSuccess; k++)
                    res = p2p(&r, &acts[k]);
                ncclResult_t e = ncclGroupEnd();
                if (res == ncclSuccess)
                    res = e;
            } else {
                res = p2p(&r, a);
            }
            if (res != ncclSuccess) {
                WT_ERR("pipeline: point-to-point on stage %d (micro-batch %d) failed: %s", stage,
                       a->mb, ncclGetErrorString(res));
                break;
            }
            if (has_recv)
                wait += wt_now() - t0;
            i = j;
        }
    }

    free(acts);
    run_free(&r);
    if (loss_p != NULL)
        *loss_p = last ? loss : 0.0;
    if (st != NULL) {
        st->step_seconds = wt_now() - t_start;
        st->wait_seconds = wait;
    }
    return res;
}
