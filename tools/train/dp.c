/*
 * dp.c -- data parallelism: DDP (zero 0) and ZeRO stages 1, 2 and 3, and the optimizer step.
 *
 * Buffers (units are the model layout's padded units; a unit's group is DP or, for expert units,
 * EDP; N is the group size, r this rank's index in it; shard = padded / N, this rank owns
 * elements [r*shard, (r+1)*shard) of every unit):
 *
 *   zero   params              grads                               m, v
 *   0      full                full                                full
 *   1      full                full (its shard reduced in place)   shard
 *   2      full                shard + live unit buffers           shard
 *   3      shard + gathered    shard + live unit buffers           shard
 *
 * Collectives of the data-parallel side run on one host stream (overlap on) or with stream NULL
 * (overlap off) at the same points. Only DP/EDP collectives are issued inside the model's hooks:
 * every rank of those groups sits on the same pipeline stage and runs the same sequence of
 * calls, so blocking there cannot deadlock. The SP all-reduces over TP and the tied-embedding
 * all-reduce over {first, last} stage are issued in wt_dp_reduce_finish only.
 *
 * Completion of asynchronous work: the stream executes in issue order, so "the stream is idle"
 * (weftStreamQuery, or after wt_stream_sync) means every reduce-scatter and gather issued so far
 * is done. Pending reduce-scatters (ZeRO-2/3) are completed then: the staged result is added to
 * the gradient shard and the unit's full gradient buffer is freed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

enum { GRAD_NONE, GRAD_LIVE, GRAD_PENDING };
enum { PARAM_NONE, PARAM_INFLIGHT, PARAM_READY };

struct dp_unit {
    int n;              /* group size */
    int r;              /* rank in the group */
    ncclComm_t comm;    /* NULL when n == 1 */
    size_t padded;      /* unit length */
    size_t shard;       /* padded / n */
    size_t off;         /* offset in full flat buffers */
    size_t soff;        /* offset in shard flat buffers */
    int layer;          /* -1: wte / outer */
    int kept;           /* wte or outer unit: stays gathered (zero 3) */
    /* zero 2/3 gradients */
    float *gbuf;        /* full unit gradient while live */
    int gstate;
    float *stage;       /* reduce-scatter output to add into the shard (micro-batch > 0) */
    int nreduced;       /* reductions into the shard this step */
    /* zero 3 parameters */
    float *pbuf;
    int pstate;
};

struct wt_dp {
    struct wt_model *model;
    const struct wt_mesh *mesh;
    const struct wt_layout *lay;
    int zero, overlap;
    weftStream_t stream;       /* NULL when overlap is off */
    int last_mb;
    int own_unit_arrays;       /* we allocated model->param_units / grad_units */

    struct dp_unit *u;
    int nunits;
    size_t full_total, shard_total;

    float *params;             /* full (zero 0-2) */
    float *pshard;             /* zero 3 */
    float *grads;              /* full (zero 0-1) */
    float *gshard;             /* zero 2-3 */
    float *adam_m, *adam_v;    /* full (zero 0) or shards */

    int *pending;              /* units with a reduce-scatter in flight (zero 2/3) */
    int npending;

    /* zero 3 prefetch order over the layer units */
    int *fwd, *bwd, nlayer_units;
    int *pos_fwd, *pos_bwd;    /* [nunits] position in fwd / bwd, -1 for wte/outer */
    int last_phase, last_pos;  /* most recent layer-unit begin */
};

/* ---------------------------------------------------------------------------------------- */

static weftStream_t dp_stream(struct wt_dp *dp)
{
    return dp->overlap ? dp->stream : NULL;
}

/* This rank's reduced gradient shard of a unit. ZeRO-1 reduce-scatters in place (NCCL's
 * recvbuff == sendbuff + rank * recvcount), so its shard is part of the full gradient buffer and
 * model states stay at the formula's (w + g) psi + o psi / N. */
static float *grad_shard(const struct wt_dp *dp, const struct dp_unit *u)
{
    if (dp->zero == 1)
        return dp->grads + u->off + (size_t)u->r * u->shard;
    return dp->gshard + u->soff;
}

static void complete_unit(struct wt_dp *dp, int ui)
{
    struct dp_unit *u = &dp->u[ui];
    if (u->stage != NULL) {
        float *dst = dp->gshard + u->soff;
        for (size_t i = 0; i < u->shard; i++)
            dst[i] += u->stage[i];
        wt_free(WT_MEM_COMM, u->stage, u->shard * sizeof(float));
        u->stage = NULL;
    }
    wt_free(WT_MEM_GRADS, u->gbuf, u->padded * sizeof(float));
    u->gbuf = NULL;
    u->gstate = GRAD_NONE;
    dp->model->grad_units[ui] = NULL;
}

/* The stream is idle: everything issued so far is done. */
static void stream_done(struct wt_dp *dp)
{
    for (int i = 0; i < dp->npending; i++)
        complete_unit(dp, dp->pending[i]);
    dp->npending = 0;
    for (int i = 0; i < dp->nunits; i++)
        if (dp->u[i].pstate == PARAM_INFLIGHT)
            dp->u[i].pstate = PARAM_READY;
}

static ncclResult_t drain(struct wt_dp *dp)
{
    if (dp->stream != NULL)
        WT_CHECK(wt_stream_sync(dp->stream));
    stream_done(dp);
    return ncclSuccess;
}

/* Completes what finished without waiting. */
static ncclResult_t poll(struct wt_dp *dp)
{
    if (dp->stream == NULL)
        return ncclSuccess;
    int busy = dp->npending > 0;
    for (int i = 0; i < dp->nunits && !busy; i++)
        busy = dp->u[i].pstate == PARAM_INFLIGHT;
    if (!busy)
        return ncclSuccess;
    ncclResult_t res = weftStreamQuery(dp->stream);
    if (res == ncclSuccess)
        stream_done(dp);
    else if (res != ncclInProgress) {
        WT_ERR("data-parallel stream failed: %s", ncclGetErrorString(res));
        return res;
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------- */
/* ZeRO-3 parameter gathers                                                                   */

static ncclResult_t gather_issue(struct wt_dp *dp, int ui)
{
    struct dp_unit *u = &dp->u[ui];
    if (u->pstate != PARAM_NONE)
        return ncclSuccess;
    u->pbuf = wt_alloc(WT_MEM_PARAMS, u->padded * sizeof(float));
    if (u->comm == NULL) {
        memcpy(u->pbuf, dp->pshard + u->soff, u->padded * sizeof(float));
        u->pstate = PARAM_READY;
        return ncclSuccess;
    }
    weftStream_t s = dp_stream(dp);
    WT_CHECK(wt_allgather(dp->pshard + u->soff, u->pbuf, u->shard, u->comm, s));
    u->pstate = s != NULL ? PARAM_INFLIGHT : PARAM_READY;
    return ncclSuccess;
}

static ncclResult_t gather_release(struct wt_dp *dp, int ui)
{
    struct dp_unit *u = &dp->u[ui];
    if (u->pstate == PARAM_NONE)
        return ncclSuccess;
    if (u->pstate == PARAM_INFLIGHT)
        WT_CHECK(drain(dp));
    wt_free(WT_MEM_PARAMS, u->pbuf, u->padded * sizeof(float));
    u->pbuf = NULL;
    u->pstate = PARAM_NONE;
    dp->model->param_units[ui] = NULL;
    return ncclSuccess;
}

static ncclResult_t gather_release_all(struct wt_dp *dp)
{
    if (dp->zero != 3)
        return ncclSuccess;
    for (int i = 0; i < dp->nunits; i++)
        WT_CHECK(gather_release(dp, i));
    return ncclSuccess;
}

/* The unit to prefetch after beginning unit ui in phase ph, or -1. */
static int prefetch_target(struct wt_dp *dp, int ui, enum wt_phase ph)
{
    const struct wt_layout *lay = dp->lay;
    if (dp->nlayer_units == 0)
        return -1;
    if (ph == WT_FORWARD) {
        int pos = dp->pos_fwd[ui];
        if (pos >= 0)
            return pos + 1 < dp->nlayer_units ? dp->fwd[pos + 1] : -1;
        /* wte / outer: the embedding at the start of the forward, or the head at its end */
        if (!lay->has_embed)
            return -1;
        if (lay->has_head && dp->last_phase == WT_FORWARD && dp->last_pos == dp->nlayer_units - 1)
            return -1;
        return dp->fwd[0];
    }
    int pos = dp->pos_bwd[ui];
    if (pos >= 0)
        return pos + 1 < dp->nlayer_units ? dp->bwd[pos + 1] : -1;
    /* wte / outer: the head at the start of the backward, or the embedding at its end */
    if (!lay->has_head)
        return -1;
    if (lay->has_embed && dp->last_phase == WT_BACKWARD && dp->last_pos == dp->nlayer_units - 1)
        return -1;
    return dp->bwd[0];
}

static ncclResult_t zero3_begin(struct wt_dp *dp, int ui, enum wt_phase ph)
{
    struct dp_unit *u = &dp->u[ui];
    int next = prefetch_target(dp, ui, ph);
    int pos = ph == WT_FORWARD ? dp->pos_fwd[ui] : dp->pos_bwd[ui];
    if (pos >= 0) {
        dp->last_phase = ph;
        dp->last_pos = pos;
    }
    /* Units no longer needed: not kept, not in the current layer, not the prefetched one. */
    for (int i = 0; i < dp->nunits; i++) {
        struct dp_unit *x = &dp->u[i];
        if (x->pstate == PARAM_NONE || x->kept || i == ui || i == next)
            continue;
        if (!u->kept && x->layer == u->layer)
            continue;
        WT_CHECK(gather_release(dp, i));
    }
    /* This unit: gathered and waited for. */
    WT_CHECK(gather_issue(dp, ui));
    if (u->pstate == PARAM_INFLIGHT)
        WT_CHECK(drain(dp));
    dp->model->param_units[ui] = u->pbuf;
    /* Prefetch the next unit so its gather overlaps this unit's compute. */
    if (next >= 0)
        WT_CHECK(gather_issue(dp, next));
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------- */
/* Hooks                                                                                      */

static ncclResult_t hook_unit_begin(void *ctx, int ui, enum wt_phase ph)
{
    struct wt_dp *dp = ctx;
    if (ui < 0 || ui >= dp->nunits) {
        WT_ERR("unit_begin: unit %d out of range (%d units)", ui, dp->nunits);
        return ncclInternalError;
    }
    WT_CHECK(poll(dp));
    if (dp->zero == 3)
        WT_CHECK(zero3_begin(dp, ui, ph));
    if (ph == WT_BACKWARD && dp->zero >= 2) {
        struct dp_unit *u = &dp->u[ui];
        if (u->gstate == GRAD_PENDING)
            WT_CHECK(drain(dp)); /* its previous micro-batch's reduction is still running */
        if (u->gstate == GRAD_NONE) {
            u->gbuf = wt_alloc(WT_MEM_GRADS, u->padded * sizeof(float));
            u->gstate = GRAD_LIVE;
        }
        dp->model->grad_units[ui] = u->gbuf;
    }
    return ncclSuccess;
}

static ncclResult_t hook_grads_done(void *ctx, int ui)
{
    struct wt_dp *dp = ctx;
    if (ui < 0 || ui >= dp->nunits) {
        WT_ERR("unit_grads_done: unit %d out of range (%d units)", ui, dp->nunits);
        return ncclInternalError;
    }
    struct dp_unit *u = &dp->u[ui];
    weftStream_t s = dp_stream(dp);
    WT_CHECK(poll(dp));

    if (dp->zero == 0) {
        if (dp->last_mb && u->comm != NULL) {
            float *g = dp->grads + u->off;
            WT_CHECK(wt_allreduce(g, g, u->padded, ncclSum, u->comm, s));
        }
        return ncclSuccess;
    }
    if (dp->zero == 1) {
        if (!dp->last_mb)
            return ncclSuccess;
        if (u->comm != NULL) /* alone, the shard is the whole unit already */
            WT_CHECK(wt_reducescatter(dp->grads + u->off, grad_shard(dp, u), u->shard, u->comm,
                                      s));
        return ncclSuccess;
    }

    /* zero 2/3: every micro-batch, into the shard (copy for the first, add afterwards). At
     * most one reduction stays in flight (it overlaps the next unit's backward), so at most two
     * full unit gradients (plus the wte/outer units) are alive at once. */
    if (u->gstate == GRAD_PENDING || dp->npending > 0)
        WT_CHECK(drain(dp));
    if (u->gstate == GRAD_NONE) {
        /* Never begun in this backward: its gradient is zero. */
        u->gbuf = wt_alloc(WT_MEM_GRADS, u->padded * sizeof(float));
        u->gstate = GRAD_LIVE;
    }
    float *dst = dp->gshard + u->soff;
    if (u->nreduced > 0) {
        u->stage = wt_alloc(WT_MEM_COMM, u->shard * sizeof(float));
        dst = u->stage;
    }
    u->nreduced++;
    if (u->comm == NULL) {
        memcpy(dst, u->gbuf, u->shard * sizeof(float));
        complete_unit(dp, ui);
        return ncclSuccess;
    }
    WT_CHECK(wt_reducescatter(u->gbuf, dst, u->shard, u->comm, s));
    if (s == NULL) {
        complete_unit(dp, ui);
    } else {
        u->gstate = GRAD_PENDING;
        dp->model->grad_units[ui] = NULL;
        dp->pending[dp->npending++] = ui;
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------- */
/* Create / destroy                                                                           */

ncclResult_t wt_dp_create(struct wt_model *m, int zero, int overlap, struct wt_dp **dp_p)
{
    *dp_p = NULL;
    if (zero < 0 || zero > 3) {
        WT_ERR("zero stage %d: must be 0, 1, 2 or 3", zero);
        return ncclInvalidArgument;
    }
    const struct wt_mesh *mesh = m->mesh;
    const struct wt_layout *lay = &m->lay;
    struct wt_dp *dp = calloc(1, sizeof(*dp));
    if (dp == NULL) {
        WT_ERR("out of memory");
        return ncclSystemError;
    }
    dp->model = m;
    dp->mesh = mesh;
    dp->lay = lay;
    dp->zero = zero;
    dp->overlap = overlap != 0;
    dp->nunits = lay->nunits;
    dp->last_phase = -1;
    dp->last_pos = -1;
    int nu = lay->nunits;
    dp->u = calloc((size_t)(nu > 0 ? nu : 1), sizeof(*dp->u));
    dp->pending = calloc((size_t)(nu > 0 ? nu : 1), sizeof(int));
    dp->fwd = calloc((size_t)(nu > 0 ? nu : 1), sizeof(int));
    dp->bwd = calloc((size_t)(nu > 0 ? nu : 1), sizeof(int));
    dp->pos_fwd = calloc((size_t)(nu > 0 ? nu : 1), sizeof(int));
    dp->pos_bwd = calloc((size_t)(nu > 0 ? nu : 1), sizeof(int));
    if (dp->u == NULL || dp->pending == NULL || dp->fwd == NULL || dp->bwd == NULL ||
        dp->pos_fwd == NULL || dp->pos_bwd == NULL) {
        WT_ERR("out of memory");
        wt_dp_destroy(dp);
        return ncclSystemError;
    }

    size_t soff = 0;
    for (int i = 0; i < nu; i++) {
        const struct wt_unit *lu = &lay->units[i];
        struct dp_unit *u = &dp->u[i];
        if (lu->group == WT_GROUP_EDP) {
            u->n = mesh->edp > 0 ? mesh->edp : 1;
            u->r = mesh->edp_rank;
            u->comm = mesh->edp_comm;
        } else {
            u->n = mesh->dp > 0 ? mesh->dp : 1;
            u->r = mesh->dp_rank;
            u->comm = mesh->dp_comm;
        }
        if (u->n <= 1 || u->comm == NULL) {
            u->n = 1;
            u->r = 0;
            u->comm = NULL;
        }
        if (lu->padded % (size_t)u->n != 0) {
            WT_ERR("unit %d: padded length %zu is not a multiple of its group size %d", i,
                   lu->padded, u->n);
            wt_dp_destroy(dp);
            return ncclInternalError;
        }
        u->padded = lu->padded;
        u->shard = lu->padded / (size_t)u->n;
        u->off = lu->offset;
        u->soff = soff;
        soff += u->shard;
        u->layer = lu->layer;
        u->kept = (i == lay->wte_unit || i == lay->outer_unit);
        if (u->kept)
            u->layer = -1;
        dp->pos_fwd[i] = dp->pos_bwd[i] = -1;
    }
    dp->full_total = lay->total;
    dp->shard_total = soff;

    /* Layer-unit orders: forward l0..l1-1 (dense, then expert); backward the reverse. */
    int k = 0;
    for (int l = lay->l0; l < lay->l1; l++) {
        int d = lay->layer_unit != NULL ? lay->layer_unit[l - lay->l0] : -1;
        int e = lay->layer_expert_unit != NULL ? lay->layer_expert_unit[l - lay->l0] : -1;
        if (d >= 0 && d < nu && !dp->u[d].kept)
            dp->fwd[k++] = d;
        if (e >= 0 && e < nu && !dp->u[e].kept)
            dp->fwd[k++] = e;
    }
    dp->nlayer_units = k;
    for (int i = 0; i < k; i++) {
        dp->bwd[i] = dp->fwd[k - 1 - i];
        dp->pos_fwd[dp->fwd[i]] = i;
        dp->pos_bwd[dp->bwd[i]] = i;
    }

    size_t fb = dp->full_total * sizeof(float), sb = dp->shard_total * sizeof(float);
    if (zero < 3)
        dp->params = wt_alloc(WT_MEM_PARAMS, fb);
    else
        dp->pshard = wt_alloc(WT_MEM_PARAMS, sb);
    if (zero < 2)
        dp->grads = wt_alloc(WT_MEM_GRADS, fb);
    if (zero >= 2)
        dp->gshard = wt_alloc(WT_MEM_GRADS, sb);
    dp->adam_m = wt_alloc(WT_MEM_OPTIM, zero == 0 ? fb : sb);
    dp->adam_v = wt_alloc(WT_MEM_OPTIM, zero == 0 ? fb : sb);

    if (m->param_units == NULL || m->grad_units == NULL) {
        free(m->param_units);
        free(m->grad_units);
        m->param_units = calloc((size_t)(nu > 0 ? nu : 1), sizeof(float *));
        m->grad_units = calloc((size_t)(nu > 0 ? nu : 1), sizeof(float *));
        dp->own_unit_arrays = 1;
        if (m->param_units == NULL || m->grad_units == NULL) {
            WT_ERR("out of memory");
            wt_dp_destroy(dp);
            return ncclSystemError;
        }
    }
    for (int i = 0; i < nu; i++) {
        m->param_units[i] = dp->params != NULL ? dp->params + dp->u[i].off : NULL;
        m->grad_units[i] = dp->grads != NULL ? dp->grads + dp->u[i].off : NULL;
    }
    if (dp->overlap) {
        ncclResult_t res = weftStreamCreate(&dp->stream);
        if (res != ncclSuccess) {
            WT_ERR("weftStreamCreate failed: %s", ncclGetErrorString(res));
            dp->stream = NULL;
            wt_dp_destroy(dp);
            return res;
        }
    }
    m->hooks.ctx = dp;
    m->hooks.unit_begin = hook_unit_begin;
    m->hooks.unit_grads_done = hook_grads_done;
    *dp_p = dp;
    return ncclSuccess;
}

void wt_dp_destroy(struct wt_dp *dp)
{
    if (dp == NULL)
        return;
    struct wt_model *m = dp->model;
    if (dp->stream != NULL) {
        weftStreamSynchronize(dp->stream);
        stream_done(dp);
        weftStreamDestroy(dp->stream);
        dp->stream = NULL;
    }
    if (dp->u != NULL) {
        for (int i = 0; i < dp->nunits; i++) {
            struct dp_unit *u = &dp->u[i];
            wt_free(WT_MEM_GRADS, u->gbuf, u->padded * sizeof(float));
            wt_free(WT_MEM_COMM, u->stage, u->shard * sizeof(float));
            wt_free(WT_MEM_PARAMS, u->pbuf, u->padded * sizeof(float));
        }
    }
    size_t fb = dp->full_total * sizeof(float), sb = dp->shard_total * sizeof(float);
    wt_free(WT_MEM_PARAMS, dp->params, fb);
    wt_free(WT_MEM_PARAMS, dp->pshard, sb);
    wt_free(WT_MEM_GRADS, dp->grads, fb);
    wt_free(WT_MEM_GRADS, dp->gshard, sb);
    wt_free(WT_MEM_OPTIM, dp->adam_m, dp->zero == 0 ? fb : sb);
    wt_free(WT_MEM_OPTIM, dp->adam_v, dp->zero == 0 ? fb : sb);
    if (m != NULL) {
        if (dp->own_unit_arrays) {
            free(m->param_units);
            free(m->grad_units);
            m->param_units = NULL;
            m->grad_units = NULL;
        } else if (m->param_units != NULL && m->grad_units != NULL) {
            for (int i = 0; i < dp->nunits; i++)
                m->param_units[i] = m->grad_units[i] = NULL;
        }
        if (m->hooks.ctx == dp)
            memset(&m->hooks, 0, sizeof(m->hooks));
    }
    free(dp->u);
    free(dp->pending);
    free(dp->fwd);
    free(dp->bwd);
    free(dp->pos_fwd);
    free(dp->pos_bwd);
    free(dp);
}

/* ---------------------------------------------------------------------------------------- */
/* Load                                                                                       */

/* Imports canon into a zeroed full scratch buffer, then copies it (full) or this rank's shards
 * into dst. */
static void load_state(struct wt_dp *dp, float *scratch, float **uptr, const float *canon,
                       float *dst, int sharded)
{
    memset(scratch, 0, dp->full_total * sizeof(float));
    if (canon != NULL)
        wt_layout_import(dp->lay, uptr, canon);
    if (!sharded) {
        memcpy(dst, scratch, dp->full_total * sizeof(float));
        return;
    }
    for (int i = 0; i < dp->nunits; i++) {
        const struct dp_unit *u = &dp->u[i];
        memcpy(dst + u->soff, scratch + u->off + (size_t)u->r * u->shard,
               u->shard * sizeof(float));
    }
}

ncclResult_t wt_dp_load(struct wt_dp *dp, const float *params_canon, const float *m_canon,
                        const float *v_canon)
{
    WT_CHECK(drain(dp));
    WT_CHECK(gather_release_all(dp));
    float *scratch = wt_alloc(WT_MEM_COMM, dp->full_total * sizeof(float));
    float **uptr = calloc((size_t)(dp->nunits > 0 ? dp->nunits : 1), sizeof(float *));
    if (uptr == NULL) {
        wt_free(WT_MEM_COMM, scratch, dp->full_total * sizeof(float));
        WT_ERR("out of memory");
        return ncclSystemError;
    }
    for (int i = 0; i < dp->nunits; i++)
        uptr[i] = scratch + dp->u[i].off;
    if (params_canon != NULL) {
        if (dp->zero < 3)
            load_state(dp, scratch, uptr, params_canon, dp->params, 0);
        else
            load_state(dp, scratch, uptr, params_canon, dp->pshard, 1);
    }
    load_state(dp, scratch, uptr, m_canon, dp->adam_m, dp->zero > 0);
    load_state(dp, scratch, uptr, v_canon, dp->adam_v, dp->zero > 0);
    free(uptr);
    wt_free(WT_MEM_COMM, scratch, dp->full_total * sizeof(float));
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------- */
/* Step                                                                                       */

ncclResult_t wt_dp_step_begin(struct wt_dp *dp)
{
    WT_CHECK(drain(dp));
    WT_CHECK(gather_release_all(dp));
    for (int i = 0; i < dp->nunits; i++) {
        struct dp_unit *u = &dp->u[i];
        if (u->gbuf != NULL) {
            wt_free(WT_MEM_GRADS, u->gbuf, u->padded * sizeof(float));
            u->gbuf = NULL;
            u->gstate = GRAD_NONE;
            dp->model->grad_units[i] = NULL;
        }
        u->nreduced = 0;
    }
    if (dp->grads != NULL)
        memset(dp->grads, 0, dp->full_total * sizeof(float));
    if (dp->gshard != NULL)
        memset(dp->gshard, 0, dp->shard_total * sizeof(float));
    dp->last_mb = 0;
    dp->last_phase = -1;
    dp->last_pos = -1;
    return ncclSuccess;
}

void wt_dp_set_last_microbatch(struct wt_dp *dp, int last)
{
    dp->last_mb = last != 0;
}

/* Where this rank's final gradient of unit ui lives, and which element range of the unit it
 * covers: [*lo, *hi). */
static float *final_grad(struct wt_dp *dp, int ui, size_t *lo, size_t *hi)
{
    const struct dp_unit *u = &dp->u[ui];
    if (dp->zero == 0) {
        *lo = 0;
        *hi = u->padded;
        return dp->grads + u->off;
    }
    *lo = (size_t)u->r * u->shard;
    *hi = *lo + u->shard;
    return grad_shard(dp, u);
}

ncclResult_t wt_dp_reduce_finish(struct wt_dp *dp)
{
    const struct wt_mesh *mesh = dp->mesh;
    const struct wt_layout *lay = dp->lay;
    WT_CHECK(drain(dp));
    for (int i = 0; i < dp->nunits; i++) {
        if (dp->u[i].gstate != GRAD_NONE) {
            WT_ERR("unit %d: gradients begun but never reported done", i);
            return ncclInternalError;
        }
    }
    /* ZeRO-3: the backward is over; nothing stays gathered. */
    WT_CHECK(gather_release_all(dp));

    /* Sequence parallelism: partial sums over this TP rank's tokens. */
    if (mesh->sp && mesh->tp > 1 && mesh->tp_comm != NULL) {
        for (int t = 0; t < lay->ntensors; t++) {
            const struct wt_tensor *tt = &lay->tensors[t];
            if (!tt->sp_partial)
                continue;
            size_t lo, hi;
            float *g = final_grad(dp, tt->unit, &lo, &hi);
            size_t a = tt->offset > lo ? tt->offset : lo;
            size_t b = tt->offset + tt->count < hi ? tt->offset + tt->count : hi;
            if (a >= b)
                continue;
            WT_CHECK(wt_allreduce(g + (a - lo), g + (a - lo), b - a, ncclSum, mesh->tp_comm,
                                  NULL));
        }
    }
    /* Tied embedding: the head's and the embedding's parts of the WTE gradient. */
    if (mesh->tie_comm != NULL && lay->wte_unit >= 0) {
        size_t lo, hi;
        float *g = final_grad(dp, lay->wte_unit, &lo, &hi);
        WT_CHECK(wt_allreduce(g, g, hi - lo, ncclSum, mesh->tie_comm, NULL));
    }
    return ncclSuccess;
}

static ncclResult_t world_sum_double(const struct wt_mesh *mesh, double *x)
{
    if (mesh->world_comm == NULL || mesh->world <= 1)
        return ncclSuccess;
    double in = *x, t0 = wt_now();
    WT_CHECK(ncclAllReduce(&in, x, 1, ncclFloat64, ncclSum, mesh->world_comm, NULL));
    wt_comm.calls[WT_COLL_ALLREDUCE]++;
    wt_comm.bytes[WT_COLL_ALLREDUCE] += sizeof(double);
    wt_comm.seconds[WT_COLL_ALLREDUCE] += wt_now() - t0;
    return ncclSuccess;
}

/* Every element is counted once: canon_owner tensors (one TP rank, the first stage for WTE), and
 * on the data-parallel side each rank counts its shard range of every unit -- for zero 0 too
 * (the replicas are identical), so the per-rank partial sums, and hence the norm, are bitwise
 * the same for every zero stage. */
ncclResult_t wt_dp_grad_norm(struct wt_dp *dp, double *norm_p)
{
    const struct wt_layout *lay = dp->lay;
    double acc = 0.0;
    for (int ui = 0; ui < dp->nunits; ui++) {
        const struct dp_unit *u = &dp->u[ui];
        const struct wt_unit *lu = &lay->units[ui];
        size_t lo = (size_t)u->r * u->shard, hi = lo + u->shard;
        const float *g;
        if (dp->zero == 0)
            g = dp->grads + u->off + lo;
        else
            g = grad_shard(dp, u);
        for (int t = lu->first_tensor; t < lu->first_tensor + lu->ntensors; t++) {
            const struct wt_tensor *tt = &lay->tensors[t];
            if (!tt->canon_owner)
                continue;
            size_t a = tt->offset > lo ? tt->offset : lo;
            size_t b = tt->offset + tt->count < hi ? tt->offset + tt->count : hi;
            for (size_t i = a; i < b; i++) {
                double x = (double)g[i - lo];
                acc += x * x;
            }
        }
    }
    WT_CHECK(world_sum_double(dp->mesh, &acc));
    *norm_p = sqrt(acc);
    return ncclSuccess;
}

ncclResult_t wt_dp_optimizer_step(struct wt_dp *dp, const struct wt_adamw *opt, int step,
                                  double grad_norm)
{
    WT_CHECK(drain(dp));
    WT_CHECK(gather_release_all(dp));
    float scale = 1.0f;
    if (opt->clip > 0.0f && grad_norm > (double)opt->clip)
        scale = (float)((double)opt->clip / grad_norm);

    if (dp->zero == 0) {
        wt_adamw_update(opt, step, scale, dp->params, dp->grads, dp->adam_m, dp->adam_v, NULL,
                        dp->full_total);
        return ncclSuccess;
    }
    for (int i = 0; i < dp->nunits; i++) {
        const struct dp_unit *u = &dp->u[i];
        float *p = dp->zero == 3 ? dp->pshard + u->soff
                                 : dp->params + u->off + (size_t)u->r * u->shard;
        wt_adamw_update(opt, step, scale, p, grad_shard(dp, u), dp->adam_m + u->soff,
                        dp->adam_v + u->soff, NULL, u->shard);
    }
    if (dp->zero == 3)
        return ncclSuccess;
    /* ZeRO-1/2: parameters whole again (in-place all-gather). */
    weftStream_t s = dp_stream(dp);
    for (int i = 0; i < dp->nunits; i++) {
        const struct dp_unit *u = &dp->u[i];
        if (u->comm == NULL)
            continue;
        float *full = dp->params + u->off;
        WT_CHECK(wt_allgather(full + (size_t)u->r * u->shard, full, u->shard, u->comm, s));
    }
    WT_CHECK(drain(dp));
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------- */
/* Canonical gather                                                                           */

ncclResult_t wt_dp_gather_canon(struct wt_dp *dp, enum wt_state which, float *canon)
{
    const struct wt_mesh *mesh = dp->mesh;
    const struct wt_layout *lay = dp->lay;
    WT_CHECK(drain(dp));

    const float *full = NULL, *shard = NULL;
    switch (which) {
    case WT_STATE_PARAMS:
        if (dp->zero < 3)
            full = dp->params;
        else
            shard = dp->pshard;
        break;
    case WT_STATE_GRADS:
        if (dp->zero == 0)
            full = dp->grads;
        else
            shard = dp->gshard;
        break;
    case WT_STATE_ADAM_M:
        if (dp->zero == 0)
            full = dp->adam_m;
        else
            shard = dp->adam_m;
        break;
    case WT_STATE_ADAM_V:
        if (dp->zero == 0)
            full = dp->adam_v;
        else
            shard = dp->adam_v;
        break;
    default:
        WT_ERR("gather_canon: unknown state %d", (int)which);
        return ncclInvalidArgument;
    }

    int nu = dp->nunits > 0 ? dp->nunits : 1;
    float **uptr = calloc((size_t)nu, sizeof(float *));
    struct wt_tensor *tens = calloc((size_t)(lay->ntensors > 0 ? lay->ntensors : 1),
                                    sizeof(*tens));
    if (uptr == NULL || tens == NULL) {
        free(uptr);
        free(tens);
        WT_ERR("out of memory");
        return ncclSystemError;
    }
    float *scratch = NULL;
    ncclResult_t res = ncclSuccess;
    if (full != NULL) {
        for (int i = 0; i < dp->nunits; i++)
            uptr[i] = (float *)full + dp->u[i].off;
    } else {
        scratch = wt_alloc(WT_MEM_COMM, dp->full_total * sizeof(float));
        for (int i = 0; i < dp->nunits && res == ncclSuccess; i++) {
            const struct dp_unit *u = &dp->u[i];
            uptr[i] = scratch + u->off;
            const float *mine = which == WT_STATE_GRADS ? grad_shard(dp, u) : shard + u->soff;
            if (u->comm == NULL)
                memcpy(uptr[i], mine, u->padded * sizeof(float));
            else
                res = wt_allgather(mine, uptr[i], u->shard, u->comm, NULL);
        }
    }

    /* Export only what this rank owns on the data-parallel side too. */
    size_t P = wt_canon_size(&lay->cfg);
    float *mine = wt_alloc(WT_MEM_COMM, P * sizeof(float));
    if (res == ncclSuccess) {
        struct wt_layout view = *lay;
        memcpy(tens, lay->tensors, (size_t)lay->ntensors * sizeof(*tens));
        for (int t = 0; t < lay->ntensors; t++) {
            const struct wt_unit *lu = &lay->units[tens[t].unit];
            int dp_owner = lu->group == WT_GROUP_EDP ? mesh->edp_rank == 0 : mesh->dp_rank == 0;
            tens[t].canon_owner = tens[t].canon_owner && dp_owner;
        }
        view.tensors = tens;
        wt_layout_export(&view, uptr, mine);
        if (mesh->world_comm != NULL && mesh->world > 1) {
            /* Every element is exported by exactly one rank, the rest contribute +0 bits: an
             * integer sum of the bit patterns is exact. */
            res = wt_reduce(mine, mesh->rank == 0 ? (void *)canon : (void *)mine, P, ncclInt32,
                            ncclSum, 0, mesh->world_comm, NULL);
        } else if (canon != NULL) {
            memcpy(canon, mine, P * sizeof(float));
        }
    }
    wt_free(WT_MEM_COMM, mine, P * sizeof(float));
    if (scratch != NULL)
        wt_free(WT_MEM_COMM, scratch, dp->full_total * sizeof(float));
    free(uptr);
    free(tens);
    if (res != ncclSuccess)
        WT_ERR("gather_canon: collective failed: %s", ncclGetErrorString(res));
    return res;
}
