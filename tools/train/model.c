/*
 * model.c -- one pipeline stage of the GPT-2 model on one rank: forward and hand-written backward
 * in plain C loops, with the tensor-, sequence- and expert-parallel collectives inside.
 *
 * Every loop has a fixed summation order (no threads, no reassociation: the layer is built with
 * -fno-fast-math -ffp-contract=off), so a run is bit-identical to the previous one.
 *
 * Shapes: B sequences of T tokens, N = B*T token rows. The residual stream of a rank holds Ns
 * rows: all N, or with sequence parallelism the contiguous shard [tp_rank*Ns, (tp_rank+1)*Ns).
 * Column-parallel regions (QKV, FC, the head) always see all N rows, gathered under SP.
 *
 * Tensor parallelism (Megatron):
 *   forward:  LN -> [SP: all-gather] -> QKV (column) -> attention (local heads) -> ATTPROJ (row)
 *             -> all-reduce [SP: reduce-scatter] -> + bias -> residual; the MLP likewise.
 *   backward: mirrored: the row-parallel input gradient needs the full output gradient
 *             ([SP: all-gather]), the column-parallel input gradient is a partial sum
 *             (all-reduce [SP: reduce-scatter]); under SP the LN input is gathered again for
 *             the weight gradient rather than kept.
 *   embedding: vocab-parallel lookup, all-reduce [SP: reduce-scatter], then + WPE.
 *   head: [SP: all-gather] -> logits of the local vocabulary -> cross-entropy with three
 *         all-reduces over TP (MAX of the maxima, SUM of the target logit, SUM of sum-exp).
 * Expert parallelism: top-1 routing; token rows travel to the EP rank owning their expert over
 * grouped send/recv (dispatch), come back as expert outputs (combine); backward reverses both.
 *
 * Hooks: in forward, unit_begin comes before each use of a unit, so on a single stage the wte
 * and outer units are begun twice (embedding, head) and the hook must leave a live unit as it
 * is. In backward each unit is begun exactly once (wte and outer at the head when this stage has
 * it) and stays live until its unit_grads_done. Tensor pointers are taken from param_units /
 * grad_units after the begin, never kept across calls.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#define LN_EPS 1e-5f
#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* Activations of one layer for one micro-batch. */
struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (Ns, C), (Ns), (Ns) */
    float *qkv;                       /* (N, 3 Cl): local Q | K | V */
    float *att;                       /* (B, NHl, T, T) softmax probabilities */
    float *atty;                      /* (N, Cl) attention output */
    float *res2;                      /* (Ns, C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fchg;                /* dense: (N, Fl); experts: (R, 4C) rows of the owner */
    float *rprob;                     /* experts: (N, E) router probabilities */
    float *eout;                      /* experts: (N, C) expert outputs before the gate */
    float *xr;                        /* experts: (R, C + 1) received rows, expert id bits last */
    int *choice;                      /* experts: (N) chosen expert */
    int *send_counts, *recv_counts;   /* experts: (ep) rows to / from each EP rank */
    int *nrecv;                       /* experts: rows received (R used) */
};

struct slot {
    float *f;
    int *i;
    int *tokens, *targets;            /* (N) copies */
    float *res;                       /* (nl + 1) x (Ns, C): input of each local layer, output */
    struct layer_acts *layers;        /* [nl] */
    float *lnf, *lnf_mean, *lnf_rstd; /* (Ns, C), (Ns), (Ns) */
    float *probs;                     /* (N, Vl) probabilities; backward turns them into dlogits */
};

struct priv {
    int B, T, C, N, Ns, nl, Cl, Fl, Vl, NHl, hs, E, El, ep, R, tp, sp;
    size_t slot_floats, slot_ints;
    struct slot *slots;
    int *tidx; /* [(nl + 1) * WT_KINDS]: tensor index of (kind, local layer); row nl: model-wide */
    float *scratch;
    size_t scratch_floats;
    float *g1, *p1, *d1, *d2, *datty, *dqkv, *dfch, *dfchg, *ce, *dgate, *dlog;
    float *sendx, *eo, *recvo, *dyr, *dxr;
    int *perm; /* (N) token of each packed position */
    int *ones; /* (ep) all 1: counts of the count exchange */
};

/* ------------------------------------------------------------------------------------------
 * Kernels. Each reduction runs in index order.
 * ---------------------------------------------------------------------------------------- */

static void layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int n, int C)
{
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * C;
        float *oi = out + (size_t)i * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++)
            m += xi[c];
        m /= (float)C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = xi[c] - m;
            v += d * d;
        }
        v /= (float)C;
        float s = 1.0f / sqrtf(v + LN_EPS);
        for (int c = 0; c < C; c++)
            oi[c] = (xi[c] - m) * s * w[c] + b[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

/* dx += d(LN)/dx . dout; dw, db accumulate. */
static void layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                          const float *w, const float *mean, const float *rstd, int n, int C)
{
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * C, *di = dout + (size_t)i * C;
        float *dxi = dx + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float dm = 0.0f, dnm = 0.0f;
        for (int c = 0; c < C; c++) {
            float norm = (xi[c] - m) * s;
            float dn = w[c] * di[c];
            dm += dn;
            dnm += dn * norm;
        }
        dm /= (float)C;
        dnm /= (float)C;
        for (int c = 0; c < C; c++) {
            float norm = (xi[c] - m) * s;
            float dn = w[c] * di[c];
            db[c] += di[c];
            dw[c] += norm * di[c];
            dxi[c] += (dn - dm - norm * dnm) * s;
        }
    }
}

/* out (n, O) = in (n, I) . w^T (w is (O, I)) + bias. */
static void matmul_fwd(float *out, const float *in, const float *w, const float *bias, int n,
                       int I, int O)
{
    for (int i = 0; i < n; i++) {
        const float *x = in + (size_t)i * I;
        float *o = out + (size_t)i * O;
        for (int j = 0; j < O; j++) {
            const float *wr = w + (size_t)j * I;
            float acc = 0.0f;
            for (int k = 0; k < I; k++)
                acc += x[k] * wr[k];
            o[j] = bias != NULL ? acc + bias[j] : acc;
        }
    }
}

/* din += dout . w; dw += dout^T . in; db += column sums of dout. din/db may be NULL. */
static void matmul_bwd(float *din, float *dw, float *db, const float *dout, const float *in,
                       const float *w, int n, int I, int O)
{
    if (din != NULL) {
        for (int i = 0; i < n; i++) {
            const float *d = dout + (size_t)i * O;
            float *dx = din + (size_t)i * I;
            for (int j = 0; j < O; j++) {
                const float *wr = w + (size_t)j * I;
                float dj = d[j];
                for (int k = 0; k < I; k++)
                    dx[k] += dj * wr[k];
            }
        }
    }
    for (int j = 0; j < O; j++) {
        float *dwr = dw + (size_t)j * I;
        for (int i = 0; i < n; i++) {
            const float *x = in + (size_t)i * I;
            float dj = dout[(size_t)i * O + j];
            for (int k = 0; k < I; k++)
                dwr[k] += dj * x[k];
        }
    }
    if (db != NULL) {
        for (int i = 0; i < n; i++) {
            const float *d = dout + (size_t)i * O;
            for (int j = 0; j < O; j++)
                db[j] += d[j];
        }
    }
}

static void gelu_fwd(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float u = GELU_S * (v + GELU_A * v * v * v);
        out[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}

/* dx = dout * gelu'(x) (overwrites dx; dx may alias dout). */
static void gelu_bwd(float *dx, const float *dout, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float u = GELU_S * (v + GELU_A * v * v * v);
        float t = tanhf(u);
        float du = GELU_S * (1.0f + 3.0f * GELU_A * v * v);
        float g = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
        dx[i] = dout[i] * g;
    }
}

/* Causal attention over NHl local heads; qkv rows are [Q | K | V], head h at h*hs in each. */
static void attention_fwd(float *out, float *att, const float *qkv, int B, int T, int NHl,
                          int hs)
{
    int Cl = NHl * hs, row = 3 * Cl;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NHl; h++) {
                const float *q = qkv + (size_t)(b * T + t) * row + h * hs;
                float *a = att + ((size_t)(b * NHl + h) * T + t) * T;
                float mx = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (size_t)(b * T + t2) * row + Cl + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++)
                        s += q[i] * k[i];
                    s *= scale;
                    a[t2] = s;
                    if (s > mx)
                        mx = s;
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(a[t2] - mx);
                    a[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++)
                    a[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++)
                    a[t2] = 0.0f;
                float *o = out + (size_t)(b * T + t) * Cl + h * hs;
                for (int i = 0; i < hs; i++)
                    o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (size_t)(b * T + t2) * row + 2 * Cl + h * hs;
                    for (int i = 0; i < hs; i++)
                        o[i] += a[t2] * v[i];
                }
            }
        }
    }
}

/* dqkv += gradient of the attention output dout; datt is T floats of scratch. */
static void attention_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                          const float *att, int B, int T, int NHl, int hs)
{
    int Cl = NHl * hs, row = 3 * Cl;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NHl; h++) {
                const float *q = qkv + (size_t)(b * T + t) * row + h * hs;
                float *dq = dqkv + (size_t)(b * T + t) * row + h * hs;
                const float *a = att + ((size_t)(b * NHl + h) * T + t) * T;
                const float *d = dout + (size_t)(b * T + t) * Cl + h * hs;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (size_t)(b * T + t2) * row + 2 * Cl + h * hs;
                    float *dv = dqkv + (size_t)(b * T + t2) * row + 2 * Cl + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += d[i] * v[i];
                        dv[i] += a[t2] * d[i];
                    }
                    datt[t2] = s;
                }
                float dsum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++)
                    dsum += a[t2] * datt[t2];
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (size_t)(b * T + t2) * row + Cl + h * hs;
                    float *dk = dqkv + (size_t)(b * T + t2) * row + Cl + h * hs;
                    float dp = a[t2] * (datt[t2] - dsum) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dp * k[i];
                        dk[i] += dp * q[i];
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * Tensor-parallel mappings and the expert all-to-all.
 * ---------------------------------------------------------------------------------------- */

/* Row-parallel output: part (N, C) holds this rank's partial sums; dst (Ns, C) gets the sum of
 * this rank's rows (all-reduce, or reduce-scatter under SP). dst may be part without SP. */
static ncclResult_t tp_sum(const struct wt_model *m, float *part, float *dst)
{
    const struct priv *p = m->priv;
    size_t n = (size_t)p->N * p->C;
    if (p->tp == 1) {
        if (dst != part)
            memcpy(dst, part, n * sizeof(float));
        return ncclSuccess;
    }
    if (!p->sp)
        return wt_allreduce(part, dst, n, ncclSum, m->mesh->tp_comm, NULL);
    return wt_reducescatter(part, dst, (size_t)p->Ns * p->C, m->mesh->tp_comm, NULL);
}

/* The full (N, C) rows of a shard: gathered into buf under SP, the shard itself otherwise. */
static ncclResult_t tp_gather(const struct wt_model *m, const float *shard, float *buf,
                              const float **full_p)
{
    const struct priv *p = m->priv;
    if (!p->sp) {
        *full_p = shard;
        return ncclSuccess;
    }
    WT_CHECK(wt_allgather(shard, buf, (size_t)p->Ns * p->C, m->mesh->tp_comm, NULL));
    *full_p = buf;
    return ncclSuccess;
}

/* All-to-all with per-peer counts of `row` bytes each, over the EP group. Rows for peer q are at
 * send + soff(q) in peer order; rows from peer q land at recv + roff(q). */
static ncclResult_t ep_alltoallv(const struct wt_model *m, const void *send, const int *scounts,
                                 void *recv, const int *rcounts, size_t row)
{
    const struct wt_mesh *mesh = m->mesh;
    int ep = mesh->ep, me = mesh->ep_rank;
    size_t soff = 0, roff = 0;
    ncclResult_t res = ncclSuccess;
    if (ep > 1)
        WT_CHECK(ncclGroupStart());
    for (int q = 0; q < ep; q++) {
        const char *s = (const char *)send + soff * row;
        char *r = (char *)recv + roff * row;
        if (q == me) {
            memcpy(r, s, (size_t)scounts[q] * row);
        } else {
            if (res == ncclSuccess && scounts[q] > 0)
                res = wt_send(s, (size_t)scounts[q] * row, q, mesh->ep_comm, WT_COLL_ALLTOALL);
            if (res == ncclSuccess && rcounts[q] > 0)
                res = wt_recv(r, (size_t)rcounts[q] * row, q, mesh->ep_comm);
        }
        soff += (size_t)scounts[q];
        roff += (size_t)rcounts[q];
    }
    if (ep > 1) {
        ncclResult_t end = ncclGroupEnd();
        if (res == ncclSuccess && end != ncclSuccess) {
            WT_ERR("ncclGroupEnd of the expert all-to-all failed: %s",
                   ncclGetErrorString(end));
            res = end;
        }
    }
    return res;
}

/* ------------------------------------------------------------------------------------------
 * Tensors and hooks
 * ---------------------------------------------------------------------------------------- */

static const struct wt_tensor *tensor(const struct wt_model *m, enum wt_kind kind, int k)
{
    const struct priv *p = m->priv;
    int row = wt_kind_per_layer(kind) ? k : p->nl;
    int i = p->tidx[row * WT_KINDS + kind];
    return i >= 0 ? &m->lay.tensors[i] : NULL;
}

static float *param(const struct wt_model *m, enum wt_kind kind, int k)
{
    const struct wt_tensor *t = tensor(m, kind, k);
    return m->param_units[t->unit] + t->offset;
}

static float *grad(const struct wt_model *m, enum wt_kind kind, int k)
{
    const struct wt_tensor *t = tensor(m, kind, k);
    return m->grad_units[t->unit] + t->offset;
}

static ncclResult_t unit_begin(struct wt_model *m, int u, enum wt_phase phase)
{
    if (m->hooks.unit_begin != NULL) {
        ncclResult_t res = m->hooks.unit_begin(m->hooks.ctx, u, phase);
        if (res != ncclSuccess) {
            WT_ERR("unit_begin hook failed on unit %d (%s)", u, ncclGetErrorString(res));
            return res;
        }
    }
    if (m->param_units[u] == NULL || (phase == WT_BACKWARD && m->grad_units[u] == NULL)) {
        WT_ERR("unit %d has no %s buffer", u, m->param_units[u] == NULL ? "parameter"
                                                                        : "gradient");
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

static ncclResult_t unit_done(struct wt_model *m, int u)
{
    if (m->hooks.unit_grads_done != NULL) {
        ncclResult_t res = m->hooks.unit_grads_done(m->hooks.ctx, u);
        if (res != ncclSuccess) {
            WT_ERR("unit_grads_done hook failed on unit %d (%s)", u, ncclGetErrorString(res));
            return res;
        }
    }
    return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Embedding and head
 * ---------------------------------------------------------------------------------------- */

/* Position of row i of this rank's residual shard. */
static int row_pos(const struct priv *p, const struct wt_mesh *mesh, int i)
{
    int n = p->sp ? mesh->tp_rank * p->Ns + i : i;
    return n % p->T;
}

static ncclResult_t embed_forward(struct wt_model *m, struct slot *s)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    int C = p->C;
    WT_CHECK(unit_begin(m, lay->wte_unit, WT_FORWARD));
    WT_CHECK(unit_begin(m, lay->outer_unit, WT_FORWARD));
    const float *wte = param(m, WT_WTE, 0), *wpe = param(m, WT_WPE, 0);
    /* Vocab-parallel lookup: rows of other ranks' vocabulary are zero until the sum. */
    for (int n = 0; n < p->N; n++) {
        int v = s->tokens[n] - lay->vocab0;
        float *o = p->p1 + (size_t)n * C;
        if (v >= 0 && v < p->Vl)
            memcpy(o, wte + (size_t)v * C, (size_t)C * sizeof(float));
        else
            memset(o, 0, (size_t)C * sizeof(float));
    }
    float *x = s->res;
    WT_CHECK(tp_sum(m, p->p1, x));
    for (int i = 0; i < p->Ns; i++) {
        const float *w = wpe + (size_t)row_pos(p, m->mesh, i) * C;
        for (int c = 0; c < C; c++)
            x[(size_t)i * C + c] += w[c];
    }
    return ncclSuccess;
}

/* d: (Ns, C) gradient of the embedding output. */
static ncclResult_t embed_backward(struct wt_model *m, struct slot *s, const float *d)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    int C = p->C;
    if (!lay->has_head) {
        /* On a single stage the head already began both units in this backward. */
        WT_CHECK(unit_begin(m, lay->outer_unit, WT_BACKWARD));
        WT_CHECK(unit_begin(m, lay->wte_unit, WT_BACKWARD));
    }
    float *dwpe = grad(m, WT_WPE, 0), *dwte = grad(m, WT_WTE, 0);
    for (int i = 0; i < p->Ns; i++) {
        float *g = dwpe + (size_t)row_pos(p, m->mesh, i) * C;
        for (int c = 0; c < C; c++)
            g[c] += d[(size_t)i * C + c];
    }
    const float *df;
    WT_CHECK(tp_gather(m, d, p->g1, &df));
    for (int n = 0; n < p->N; n++) {
        int v = s->tokens[n] - lay->vocab0;
        if (v < 0 || v >= p->Vl)
            continue;
        float *g = dwte + (size_t)v * C;
        for (int c = 0; c < C; c++)
            g[c] += df[(size_t)n * C + c];
    }
    WT_CHECK(unit_done(m, lay->outer_unit));
    WT_CHECK(unit_done(m, lay->wte_unit));
    return ncclSuccess;
}

static ncclResult_t head_forward(struct wt_model *m, struct slot *s, double *loss_p)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    int C = p->C, N = p->N, Vl = p->Vl, v0 = lay->vocab0;
    WT_CHECK(unit_begin(m, lay->outer_unit, WT_FORWARD));
    WT_CHECK(unit_begin(m, lay->wte_unit, WT_FORWARD));
    layernorm_fwd(s->lnf, s->lnf_mean, s->lnf_rstd, s->res + (size_t)p->nl * p->Ns * C,
                  param(m, WT_LNFW, 0), param(m, WT_LNFB, 0), p->Ns, C);
    const float *x;
    WT_CHECK(tp_gather(m, s->lnf, p->g1, &x));
    matmul_fwd(s->probs, x, param(m, WT_WTE, 0), NULL, N, C, Vl);

    /* Vocab-parallel cross-entropy; without TP the three sums are over one rank. */
    float *mx = p->ce, *tl = p->ce + N, *se = p->ce + 2 * N;
    for (int n = 0; n < N; n++) {
        const float *l = s->probs + (size_t)n * Vl;
        float v = -INFINITY;
        for (int j = 0; j < Vl; j++)
            if (l[j] > v)
                v = l[j];
        mx[n] = v;
        int t = s->targets[n] - v0;
        tl[n] = t >= 0 && t < Vl ? l[t] : 0.0f;
    }
    if (p->tp > 1) {
        WT_CHECK(wt_allreduce(mx, mx, (size_t)N, ncclMax, m->mesh->tp_comm, NULL));
        WT_CHECK(wt_allreduce(tl, tl, (size_t)N, ncclSum, m->mesh->tp_comm, NULL));
    }
    for (int n = 0; n < N; n++) {
        float *l = s->probs + (size_t)n * Vl;
        float sum = 0.0f;
        for (int j = 0; j < Vl; j++) {
            l[j] = expf(l[j] - mx[n]);
            sum += l[j];
        }
        se[n] = sum;
    }
    if (p->tp > 1)
        WT_CHECK(wt_allreduce(se, se, (size_t)N, ncclSum, m->mesh->tp_comm, NULL));
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        float *l = s->probs + (size_t)n * Vl;
        float inv = 1.0f / se[n];
        for (int j = 0; j < Vl; j++)
            l[j] *= inv;
        float tok_loss = logf(se[n]) + mx[n] - tl[n];
        loss += (double)tok_loss * (double)m->loss_scale;
    }
    if (loss_p != NULL)
        *loss_p = loss;
    return ncclSuccess;
}

/* dx: (Ns, C) receives (=) the gradient of the head's input. */
static ncclResult_t head_backward(struct wt_model *m, struct slot *s, float *dx)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    int C = p->C, N = p->N, Vl = p->Vl, v0 = lay->vocab0;
    WT_CHECK(unit_begin(m, lay->wte_unit, WT_BACKWARD));
    WT_CHECK(unit_begin(m, lay->outer_unit, WT_BACKWARD));
    float scale = m->loss_scale;
    for (int n = 0; n < N; n++) {
        float *l = s->probs + (size_t)n * Vl;
        int t = s->targets[n] - v0;
        for (int j = 0; j < Vl; j++)
            l[j] = (l[j] - (j == t ? 1.0f : 0.0f)) * scale;
    }
    const float *x;
    WT_CHECK(tp_gather(m, s->lnf, p->g1, &x));
    memset(p->p1, 0, (size_t)N * C * sizeof(float));
    matmul_bwd(p->p1, grad(m, WT_WTE, 0), NULL, s->probs, x, param(m, WT_WTE, 0), N, C, Vl);
    WT_CHECK(tp_sum(m, p->p1, p->d2));
    memset(dx, 0, (size_t)p->Ns * C * sizeof(float));
    layernorm_bwd(dx, grad(m, WT_LNFW, 0), grad(m, WT_LNFB, 0), p->d2,
                  s->res + (size_t)p->nl * p->Ns * C, param(m, WT_LNFW, 0), s->lnf_mean,
                  s->lnf_rstd, p->Ns, C);
    if (!lay->has_embed) {
        WT_CHECK(unit_done(m, lay->wte_unit));
        WT_CHECK(unit_done(m, lay->outer_unit));
    }
    return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Transformer blocks
 * ---------------------------------------------------------------------------------------- */

/* y[i] = base[i] + (y[i] + bias): the bias of a row-parallel layer goes after the reduction. */
static void add_bias_residual(float *y, const float *base, const float *bias, int n, int C)
{
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            y[(size_t)i * C + c] = base[(size_t)i * C + c] + (y[(size_t)i * C + c] + bias[c]);
}

static void column_sums(float *db, const float *d, int n, int C)
{
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            db[c] += d[(size_t)i * C + c];
}

static void expert_id_set(float *row, int C, int id)
{
    memcpy(row + C, &id, sizeof(int));
}

static int expert_id_get(const float *row, int C)
{
    int id;
    memcpy(&id, row + C, sizeof(int));
    return id;
}

/* Router, dispatch, local experts, combine: y = res2 + gate * expert(ln2). */
static ncclResult_t moe_forward(struct wt_model *m, int k, struct layer_acts *la, float *y)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    int C = p->C, N = p->N, E = p->E, El = p->El, ep = p->ep, F = 4 * C;
    float *pr = la->rprob;
    matmul_fwd(pr, la->ln2, param(m, WT_ROUTERW, k), NULL, N, C, E);
    for (int q = 0; q < ep; q++)
        la->send_counts[q] = 0;
    for (int n = 0; n < N; n++) {
        float *r = pr + (size_t)n * E;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++)
            if (r[e] > mx)
                mx = r[e];
        for (int e = 0; e < E; e++) {
            r[e] = expf(r[e] - mx);
            sum += r[e];
        }
        float inv = 1.0f / sum;
        int best = 0;
        for (int e = 0; e < E; e++) {
            r[e] *= inv;
            if (r[e] > r[best])
                best = e; /* strict: ties go to the lowest index */
        }
        la->choice[n] = best;
        la->send_counts[best / El]++;
    }
    /* Pack rows by destination (token order within one), the expert id after the C values. */
    int pos = 0;
    for (int q = 0; q < ep; q++) {
        for (int n = 0; n < N; n++) {
            if (la->choice[n] / El != q)
                continue;
            float *row = p->sendx + (size_t)pos * (C + 1);
            memcpy(row, la->ln2 + (size_t)n * C, (size_t)C * sizeof(float));
            expert_id_set(row, C, la->choice[n]);
            p->perm[pos++] = n;
        }
    }
    WT_CHECK(ep_alltoallv(m, la->send_counts, p->ones, la->recv_counts, p->ones, sizeof(int)));
    int R = 0;
    for (int q = 0; q < ep; q++)
        R += la->recv_counts[q];
    if (R > p->R) {
        WT_ERR("expert dispatch: %d rows received, room for %d", R, p->R);
        return ncclInternalError;
    }
    *la->nrecv = R;
    WT_CHECK(ep_alltoallv(m, p->sendx, la->send_counts, la->xr, la->recv_counts,
                          (size_t)(C + 1) * sizeof(float)));

    int eu = lay->layer_expert_unit[k];
    WT_CHECK(unit_begin(m, eu, WT_FORWARD));
    const float *fcw = param(m, WT_FCW, k), *fcb = param(m, WT_FCB, k);
    const float *pw = param(m, WT_FCPROJW, k), *pb = param(m, WT_FCPROJB, k);
    for (int r = 0; r < R; r++) {
        const float *x = la->xr + (size_t)r * (C + 1);
        int e = expert_id_get(x, C) - lay->expert0;
        if (e < 0 || e >= El) {
            WT_ERR("expert dispatch: row for expert %d, this rank owns [%d, %d)", e + lay->expert0,
                   lay->expert0, lay->expert0 + El);
            return ncclInternalError;
        }
        float *h = la->fch + (size_t)r * F, *g = la->fchg + (size_t)r * F;
        matmul_fwd(h, x, fcw + (size_t)e * F * C, fcb + (size_t)e * F, 1, C, F);
        gelu_fwd(g, h, (size_t)F);
        matmul_fwd(p->eo + (size_t)r * C, g, pw + (size_t)e * C * F, pb + (size_t)e * C, 1, F,
                   C);
    }
    WT_CHECK(ep_alltoallv(m, p->eo, la->recv_counts, p->recvo, la->send_counts,
                          (size_t)C * sizeof(float)));
    for (int j = 0; j < N; j++)
        memcpy(la->eout + (size_t)p->perm[j] * C, p->recvo + (size_t)j * C,
               (size_t)C * sizeof(float));
    for (int n = 0; n < N; n++) {
        float gate = pr[(size_t)n * E + la->choice[n]];
        for (int c = 0; c < C; c++)
            y[(size_t)n * C + c] =
                la->res2[(size_t)n * C + c] + gate * la->eout[(size_t)n * C + c];
    }
    return ncclSuccess;
}

static ncclResult_t layer_forward(struct wt_model *m, struct slot *s, int k)
{
    struct priv *p = m->priv;
    int C = p->C, N = p->N, Ns = p->Ns;
    struct layer_acts *la = &s->layers[k];
    const float *x = s->res + (size_t)k * Ns * C;
    float *y = s->res + (size_t)(k + 1) * Ns * C;
    const float *in;

    WT_CHECK(unit_begin(m, m->lay.layer_unit[k], WT_FORWARD));
    layernorm_fwd(la->ln1, la->ln1_mean, la->ln1_rstd, x, param(m, WT_LN1W, k),
                  param(m, WT_LN1B, k), Ns, C);
    WT_CHECK(tp_gather(m, la->ln1, p->g1, &in));
    matmul_fwd(la->qkv, in, param(m, WT_QKVW, k), param(m, WT_QKVB, k), N, C, 3 * p->Cl);
    attention_fwd(la->atty, la->att, la->qkv, p->B, p->T, p->NHl, p->hs);
    matmul_fwd(p->p1, la->atty, param(m, WT_ATTPROJW, k), NULL, N, p->Cl, C);
    WT_CHECK(tp_sum(m, p->p1, la->res2));
    add_bias_residual(la->res2, x, param(m, WT_ATTPROJB, k), Ns, C);

    layernorm_fwd(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, param(m, WT_LN2W, k),
                  param(m, WT_LN2B, k), Ns, C);
    if (p->E > 0)
        return moe_forward(m, k, la, y);
    WT_CHECK(tp_gather(m, la->ln2, p->g1, &in));
    matmul_fwd(la->fch, in, param(m, WT_FCW, k), param(m, WT_FCB, k), N, C, p->Fl);
    gelu_fwd(la->fchg, la->fch, (size_t)N * p->Fl);
    matmul_fwd(p->p1, la->fchg, param(m, WT_FCPROJW, k), NULL, N, p->Fl, C);
    WT_CHECK(tp_sum(m, p->p1, y));
    add_bias_residual(y, la->res2, param(m, WT_FCPROJB, k), Ns, C);
    return ncclSuccess;
}

/* Expert half of the MoE backward (before the dense unit begins): d (N, C) is the gradient of
 * the block output; p->d2 receives (=) the expert path's gradient of ln2, p->dgate the gate's. */
static ncclResult_t moe_backward_experts(struct wt_model *m, int k, struct layer_acts *la,
                                         const float *d)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    int C = p->C, N = p->N, E = p->E, F = 4 * C;
    for (int n = 0; n < N; n++) {
        const float *dn = d + (size_t)n * C, *en = la->eout + (size_t)n * C;
        float s = 0.0f;
        for (int c = 0; c < C; c++)
            s += dn[c] * en[c];
        p->dgate[n] = s;
    }
    /* Same packing as the dispatch: gate * d to the expert's owner. */
    int pos = 0;
    for (int q = 0; q < p->ep; q++) {
        for (int n = 0; n < N; n++) {
            if (la->choice[n] / p->El != q)
                continue;
            float gate = la->rprob[(size_t)n * E + la->choice[n]];
            float *row = p->sendx + (size_t)pos * C;
            for (int c = 0; c < C; c++)
                row[c] = gate * d[(size_t)n * C + c];
            p->perm[pos++] = n;
        }
    }
    int R = *la->nrecv;
    WT_CHECK(ep_alltoallv(m, p->sendx, la->send_counts, p->dyr, la->recv_counts,
                          (size_t)C * sizeof(float)));
    int eu = lay->layer_expert_unit[k];
    WT_CHECK(unit_begin(m, eu, WT_BACKWARD));
    const float *fcw = param(m, WT_FCW, k), *pw = param(m, WT_FCPROJW, k);
    float *dfcw = grad(m, WT_FCW, k), *dfcb = grad(m, WT_FCB, k);
    float *dpw = grad(m, WT_FCPROJW, k), *dpb = grad(m, WT_FCPROJB, k);
    memset(p->dxr, 0, (size_t)R * C * sizeof(float));
    for (int r = 0; r < R; r++) {
        const float *x = la->xr + (size_t)r * (C + 1);
        int e = expert_id_get(x, C) - lay->expert0;
        const float *h = la->fch + (size_t)r * F, *g = la->fchg + (size_t)r * F;
        const float *dy = p->dyr + (size_t)r * C;
        memset(p->dfchg, 0, (size_t)F * sizeof(float));
        matmul_bwd(p->dfchg, dpw + (size_t)e * C * F, dpb + (size_t)e * C, dy, g,
                   pw + (size_t)e * C * F, 1, F, C);
        gelu_bwd(p->dfch, p->dfchg, h, (size_t)F);
        matmul_bwd(p->dxr + (size_t)r * C, dfcw + (size_t)e * F * C, dfcb + (size_t)e * F,
                   p->dfch, x, fcw + (size_t)e * F * C, 1, C, F);
    }
    WT_CHECK(ep_alltoallv(m, p->dxr, la->recv_counts, p->recvo, la->send_counts,
                          (size_t)C * sizeof(float)));
    WT_CHECK(unit_done(m, eu));
    for (int j = 0; j < N; j++)
        memcpy(p->d2 + (size_t)p->perm[j] * C, p->recvo + (size_t)j * C,
               (size_t)C * sizeof(float));
    return ncclSuccess;
}

/* Router half (dense unit begun): p->d2 += router path's gradient of ln2. */
static void moe_backward_router(struct wt_model *m, int k, struct layer_acts *la)
{
    struct priv *p = m->priv;
    int N = p->N, E = p->E;
    for (int n = 0; n < N; n++) {
        const float *pr = la->rprob + (size_t)n * E;
        float *dl = p->dlog + (size_t)n * E;
        int ch = la->choice[n];
        float dg = p->dgate[n], pk = pr[ch];
        /* d gate / d logit_e = p_e * (delta_e,ch - p_ch) */
        for (int e = 0; e < E; e++)
            dl[e] = pr[e] * ((e == ch ? dg : 0.0f) - pk * dg);
    }
    matmul_bwd(p->d2, grad(m, WT_ROUTERW, k), NULL, p->dlog, la->ln2, param(m, WT_ROUTERW, k),
               N, p->C, E);
}

/* d (Ns, C): gradient of the block output in, of the block input out. */
static ncclResult_t layer_backward(struct wt_model *m, struct slot *s, int k, float *d)
{
    struct priv *p = m->priv;
    int C = p->C, N = p->N, Ns = p->Ns, Cl = p->Cl, Fl = p->Fl;
    struct layer_acts *la = &s->layers[k];
    const float *x = s->res + (size_t)k * Ns * C;
    const float *in;
    int du = m->lay.layer_unit[k];

    if (p->E > 0) {
        WT_CHECK(moe_backward_experts(m, k, la, d));
        WT_CHECK(unit_begin(m, du, WT_BACKWARD));
        moe_backward_router(m, k, la);
    } else {
        WT_CHECK(unit_begin(m, du, WT_BACKWARD));
        column_sums(grad(m, WT_FCPROJB, k), d, Ns, C);
        WT_CHECK(tp_gather(m, d, p->g1, &in));
        memset(p->dfchg, 0, (size_t)N * Fl * sizeof(float));
        matmul_bwd(p->dfchg, grad(m, WT_FCPROJW, k), NULL, in, la->fchg,
                   param(m, WT_FCPROJW, k), N, Fl, C);
        gelu_bwd(p->dfch, p->dfchg, la->fch, (size_t)N * Fl);
        WT_CHECK(tp_gather(m, la->ln2, p->g1, &in));
        memset(p->p1, 0, (size_t)N * C * sizeof(float));
        matmul_bwd(p->p1, grad(m, WT_FCW, k), grad(m, WT_FCB, k), p->dfch, in,
                   param(m, WT_FCW, k), N, C, Fl);
        WT_CHECK(tp_sum(m, p->p1, p->d2));
    }
    /* d becomes the gradient of res2: the residual path plus LN2's. */
    layernorm_bwd(d, grad(m, WT_LN2W, k), grad(m, WT_LN2B, k), p->d2, la->res2,
                  param(m, WT_LN2W, k), la->ln2_mean, la->ln2_rstd, Ns, C);

    column_sums(grad(m, WT_ATTPROJB, k), d, Ns, C);
    WT_CHECK(tp_gather(m, d, p->g1, &in));
    memset(p->datty, 0, (size_t)N * Cl * sizeof(float));
    matmul_bwd(p->datty, grad(m, WT_ATTPROJW, k), NULL, in, la->atty, param(m, WT_ATTPROJW, k),
               N, Cl, C);
    memset(p->dqkv, 0, (size_t)N * 3 * Cl * sizeof(float));
    attention_bwd(p->dqkv, p->ce, p->datty, la->qkv, la->att, p->B, p->T, p->NHl, p->hs);
    WT_CHECK(tp_gather(m, la->ln1, p->g1, &in));
    memset(p->p1, 0, (size_t)N * C * sizeof(float));
    matmul_bwd(p->p1, grad(m, WT_QKVW, k), grad(m, WT_QKVB, k), p->dqkv, in,
               param(m, WT_QKVW, k), N, C, 3 * Cl);
    WT_CHECK(tp_sum(m, p->p1, p->d2));
    layernorm_bwd(d, grad(m, WT_LN1W, k), grad(m, WT_LN1B, k), p->d2, x, param(m, WT_LN1W, k),
                  la->ln1_mean, la->ln1_rstd, Ns, C);
    WT_CHECK(unit_done(m, du));
    return ncclSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Slots and the public entry points
 * ---------------------------------------------------------------------------------------- */

static float *take_f(float *base, size_t *off, size_t n)
{
    float *r = base != NULL ? base + *off : NULL;
    *off += n;
    return r;
}

static int *take_i(int *base, size_t *off, size_t n)
{
    int *r = base != NULL ? base + *off : NULL;
    *off += n;
    return r;
}

/* Carves a slot's pointers from fb / ib (or only counts with NULL bases). */
static void slot_carve(const struct wt_model *m, const struct priv *p, struct slot *s, float *fb,
                       int *ib, size_t *nf, size_t *ni)
{
    size_t f = 0, i = 0, N = (size_t)p->N, Ns = (size_t)p->Ns, C = (size_t)p->C;
    size_t R = (size_t)p->R, E = (size_t)p->E;
    s->tokens = take_i(ib, &i, N);
    s->targets = take_i(ib, &i, N);
    s->res = take_f(fb, &f, (size_t)(p->nl + 1) * Ns * C);
    for (int k = 0; k < p->nl; k++) {
        struct layer_acts la;
        memset(&la, 0, sizeof(la));
        la.ln1 = take_f(fb, &f, Ns * C);
        la.ln1_mean = take_f(fb, &f, Ns);
        la.ln1_rstd = take_f(fb, &f, Ns);
        la.qkv = take_f(fb, &f, N * 3 * (size_t)p->Cl);
        la.att = take_f(fb, &f, (size_t)p->B * p->NHl * p->T * p->T);
        la.atty = take_f(fb, &f, N * (size_t)p->Cl);
        la.res2 = take_f(fb, &f, Ns * C);
        la.ln2 = take_f(fb, &f, Ns * C);
        la.ln2_mean = take_f(fb, &f, Ns);
        la.ln2_rstd = take_f(fb, &f, Ns);
        if (p->E == 0) {
            la.fch = take_f(fb, &f, N * (size_t)p->Fl);
            la.fchg = take_f(fb, &f, N * (size_t)p->Fl);
        } else {
            la.rprob = take_f(fb, &f, N * E);
            la.eout = take_f(fb, &f, N * C);
            la.xr = take_f(fb, &f, R * (C + 1));
            la.fch = take_f(fb, &f, R * 4 * C);
            la.fchg = take_f(fb, &f, R * 4 * C);
            la.choice = take_i(ib, &i, N);
            la.send_counts = take_i(ib, &i, (size_t)p->ep);
            la.recv_counts = take_i(ib, &i, (size_t)p->ep);
            la.nrecv = take_i(ib, &i, 1);
        }
        if (s->layers != NULL)
            s->layers[k] = la;
    }
    if (m->lay.has_head) {
        s->lnf = take_f(fb, &f, Ns * C);
        s->lnf_mean = take_f(fb, &f, Ns);
        s->lnf_rstd = take_f(fb, &f, Ns);
        s->probs = take_f(fb, &f, N * (size_t)p->Vl);
    }
    *nf = f;
    *ni = i;
}

static void carve_scratch(struct priv *p, float *b, size_t *nf)
{
    size_t f = 0, N = (size_t)p->N, C = (size_t)p->C, R = (size_t)p->R;
    size_t fw = p->E > 0 ? 4 * C : (size_t)p->Fl;
    size_t rows = p->E > 0 ? 1 : N; /* experts run one row at a time */
    p->g1 = take_f(b, &f, N * C);
    p->p1 = take_f(b, &f, N * C);
    p->d1 = take_f(b, &f, N * C);
    p->d2 = take_f(b, &f, N * C);
    p->datty = take_f(b, &f, N * (size_t)p->Cl);
    p->dqkv = take_f(b, &f, N * 3 * (size_t)p->Cl);
    p->dfch = take_f(b, &f, rows * fw);
    p->dfchg = take_f(b, &f, rows * fw);
    /* Cross-entropy sums (3N); attention backward borrows T of them. */
    p->ce = take_f(b, &f, 3 * N > (size_t)p->T ? 3 * N : (size_t)p->T);
    if (p->E > 0) {
        p->dgate = take_f(b, &f, N);
        p->dlog = take_f(b, &f, N * (size_t)p->E);
        p->sendx = take_f(b, &f, N * (C + 1));
        p->eo = take_f(b, &f, R * C);
        p->recvo = take_f(b, &f, N * C);
        p->dyr = take_f(b, &f, R * C);
        p->dxr = take_f(b, &f, R * C);
    }
    *nf = f;
}

static void free_priv(struct wt_model *m)
{
    struct priv *p = m->priv;
    if (p == NULL)
        return;
    for (int j = 0; p->slots != NULL && j < m->nslots; j++) {
        wt_free(WT_MEM_ACTS, p->slots[j].f, p->slot_floats * sizeof(float));
        wt_free(WT_MEM_ACTS, p->slots[j].i, p->slot_ints * sizeof(int));
        free(p->slots[j].layers);
    }
    free(p->slots);
    free(p->tidx);
    free(p->perm);
    free(p->ones);
    wt_free(WT_MEM_COMM, p->scratch, p->scratch_floats * sizeof(float));
    free(p);
    m->priv = NULL;
}

ncclResult_t wt_model_init(struct wt_model *m, const struct wt_config *cfg,
                           const struct wt_mesh *mesh, int batch, int nslots)
{
    if (batch < 1 || nslots < 1) {
        WT_ERR("model needs batch >= 1 and nslots >= 1 (got %d, %d)", batch, nslots);
        return ncclInvalidArgument;
    }
    struct wt_model mm;
    memset(&mm, 0, sizeof(mm));
    ncclResult_t res = wt_layout_init(&mm.lay, cfg, mesh);
    if (res != ncclSuccess)
        return res;
    mm.mesh = mesh;
    mm.batch = batch;
    mm.nslots = nslots;
    mm.loss_scale = 1.0f / (float)(batch * cfg->seq);

    const struct wt_layout *lay = &mm.lay;
    int sp = mesh->sp && mesh->tp > 1;
    long ntok = (long)batch * cfg->seq;
    if (sp && ntok % mesh->tp != 0) {
        WT_ERR("sequence parallelism needs batch*T (%ld) divisible by tp %d", ntok, mesh->tp);
        res = ncclInvalidArgument;
        goto err_layout;
    }
    if ((mesh->tp > 1 && mesh->tp_comm == NULL) ||
        (cfg->experts > 0 && mesh->ep > 1 && mesh->ep_comm == NULL)) {
        WT_ERR("model on a mesh without its tp / ep communicators");
        res = ncclInvalidArgument;
        goto err_layout;
    }

    struct priv *p = calloc(1, sizeof(*p));
    mm.param_units = calloc((size_t)lay->nunits + 1, sizeof(float *));
    mm.grad_units = calloc((size_t)lay->nunits + 1, sizeof(float *));
    mm.priv = p;
    if (p == NULL || mm.param_units == NULL || mm.grad_units == NULL) {
        WT_ERR("out of memory for the model");
        res = ncclSystemError;
        goto err_priv;
    }
    p->B = batch;
    p->T = cfg->seq;
    p->C = cfg->channels;
    p->N = (int)ntok;
    p->tp = mesh->tp;
    p->sp = sp;
    p->Ns = sp ? p->N / mesh->tp : p->N;
    p->nl = lay->l1 - lay->l0;
    p->NHl = lay->heads_local;
    p->hs = cfg->channels / cfg->heads;
    p->Cl = p->NHl * p->hs;
    p->Fl = lay->ffn_local;
    p->Vl = lay->vocab_local;
    p->E = cfg->experts;
    p->El = lay->experts_local;
    p->ep = cfg->experts > 0 ? mesh->ep : 1;
    p->R = cfg->experts > 0 ? p->ep * p->N : 0;

    p->tidx = malloc((size_t)(p->nl + 1) * WT_KINDS * sizeof(int));
    p->perm = calloc((size_t)p->N, sizeof(int));
    p->ones = calloc((size_t)p->ep, sizeof(int));
    p->slots = calloc((size_t)nslots, sizeof(struct slot));
    if (p->tidx == NULL || p->perm == NULL || p->ones == NULL || p->slots == NULL) {
        WT_ERR("out of memory for the model");
        res = ncclSystemError;
        goto err_priv;
    }
    for (int j = 0; j < p->ep; j++)
        p->ones[j] = 1;
    for (int j = 0; j < (p->nl + 1) * WT_KINDS; j++)
        p->tidx[j] = -1;
    for (int j = 0; j < lay->ntensors; j++) {
        const struct wt_tensor *t = &lay->tensors[j];
        int row = t->layer < 0 ? p->nl : t->layer - lay->l0;
        p->tidx[row * WT_KINDS + t->kind] = j;
    }

    struct slot probe;
    memset(&probe, 0, sizeof(probe));
    slot_carve(&mm, p, &probe, NULL, NULL, &p->slot_floats, &p->slot_ints);
    for (int j = 0; j < nslots; j++) {
        struct slot *s = &p->slots[j];
        size_t nf, ni;
        s->layers = calloc((size_t)p->nl + 1, sizeof(struct layer_acts));
        if (s->layers == NULL) {
            WT_ERR("out of memory for the model");
            res = ncclSystemError;
            goto err_priv;
        }
        s->f = wt_alloc(WT_MEM_ACTS, p->slot_floats * sizeof(float));
        s->i = wt_alloc(WT_MEM_ACTS, p->slot_ints * sizeof(int));
        slot_carve(&mm, p, s, s->f, s->i, &nf, &ni);
    }
    carve_scratch(p, NULL, &p->scratch_floats);
    p->scratch = wt_alloc(WT_MEM_COMM, p->scratch_floats * sizeof(float));
    size_t nf;
    carve_scratch(p, p->scratch, &nf);
    *m = mm;
    return ncclSuccess;

err_priv:
    free_priv(&mm);
    free(mm.param_units);
    free(mm.grad_units);
err_layout:
    wt_layout_fini(&mm.lay);
    return res;
}

void wt_model_fini(struct wt_model *m)
{
    free_priv(m);
    free(m->param_units);
    free(m->grad_units);
    m->param_units = m->grad_units = NULL;
    wt_layout_fini(&m->lay);
}

static ncclResult_t check_ids(const int *ids, int n, int V, const char *what)
{
    if (ids == NULL) {
        WT_ERR("%s missing", what);
        return ncclInvalidArgument;
    }
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            WT_ERR("%s[%d] = %d outside the vocabulary [0, %d)", what, i, ids[i], V);
            return ncclInvalidArgument;
        }
    }
    return ncclSuccess;
}

ncclResult_t wt_model_forward(struct wt_model *m, int slot, const int *tokens, const int *targets,
                              const float *x_in, float *x_out, double *loss_p)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    if (slot < 0 || slot >= m->nslots) {
        WT_ERR("activation slot %d outside [0, %d)", slot, m->nslots);
        return ncclInvalidArgument;
    }
    struct slot *s = &p->slots[slot];
    size_t bel = (size_t)p->Ns * p->C;
    if (loss_p != NULL)
        *loss_p = 0.0;
    if (lay->has_embed) {
        WT_CHECK(check_ids(tokens, p->N, lay->cfg.vocab, "tokens"));
        memcpy(s->tokens, tokens, (size_t)p->N * sizeof(int));
        WT_CHECK(embed_forward(m, s));
    } else {
        if (x_in == NULL) {
            WT_ERR("stage input missing on pipeline stage %d", m->mesh->pp_rank);
            return ncclInvalidArgument;
        }
        memcpy(s->res, x_in, bel * sizeof(float));
    }
    for (int k = 0; k < p->nl; k++)
        WT_CHECK(layer_forward(m, s, k));
    if (lay->has_head) {
        WT_CHECK(check_ids(targets, p->N, lay->cfg.vocab, "targets"));
        memcpy(s->targets, targets, (size_t)p->N * sizeof(int));
        WT_CHECK(head_forward(m, s, loss_p));
    } else {
        if (x_out == NULL) {
            WT_ERR("stage output missing on pipeline stage %d", m->mesh->pp_rank);
            return ncclInvalidArgument;
        }
        memcpy(x_out, s->res + (size_t)p->nl * bel, bel * sizeof(float));
    }
    return ncclSuccess;
}

ncclResult_t wt_model_backward(struct wt_model *m, int slot, const float *dx_out, float *dx_in)
{
    struct priv *p = m->priv;
    const struct wt_layout *lay = &m->lay;
    if (slot < 0 || slot >= m->nslots) {
        WT_ERR("activation slot %d outside [0, %d)", slot, m->nslots);
        return ncclInvalidArgument;
    }
    struct slot *s = &p->slots[slot];
    size_t bel = (size_t)p->Ns * p->C;
    float *d = p->d1;
    if (lay->has_head) {
        WT_CHECK(head_backward(m, s, d));
    } else {
        if (dx_out == NULL) {
            WT_ERR("output gradient missing on pipeline stage %d", m->mesh->pp_rank);
            return ncclInvalidArgument;
        }
        memcpy(d, dx_out, bel * sizeof(float));
    }
    for (int k = p->nl - 1; k >= 0; k--)
        WT_CHECK(layer_backward(m, s, k, d));
    if (lay->has_embed) {
        WT_CHECK(embed_backward(m, s, d));
    } else {
        if (dx_in == NULL) {
            WT_ERR("input gradient missing on pipeline stage %d", m->mesh->pp_rank);
            return ncclInvalidArgument;
        }
        memcpy(dx_in, d, bel * sizeof(float));
    }
    return ncclSuccess;
}

size_t wt_model_boundary_elems(const struct wt_model *m)
{
    const struct priv *p = m->priv;
    return (size_t)p->Ns * p->C;
}

size_t wt_model_act_bytes_per_slot(const struct wt_model *m)
{
    const struct priv *p = m->priv;
    return p->slot_floats * sizeof(float) + p->slot_ints * sizeof(int);
}
