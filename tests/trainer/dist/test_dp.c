/*
 * test_dp.c -- data parallelism (DDP, ZeRO 1-3) and the pipeline executor, run under weftrun.
 *
 *   weftrun -n N test_dp MODE
 *
 * Every mode trains a small GPT (wt_model) for a few steps under several settings of one mesh,
 * gathers the canonical state to world rank 0 with wt_dp_gather_canon, and compares there:
 *   - bit for bit between settings that must agree exactly (ZeRO stages at m == 1; zero 0 with
 *     zero 1 at DP 2; zero 2 with 3 at any m; overlap on/off at DP 2; GPipe with 1F1B);
 *   - within tolerance against a single-rank model (wt_mesh_single) on the same global batch:
 *     loss per step, the gradient of step 1, the gradient norm, the parameters after the steps.
 * Each run also checks, on every rank: the replicas of the parameters are identical across the
 * DP group (hash MIN == MAX), the memory categories show the sharding (params / grads / optim
 * bytes exactly as the ZeRO stage says right after wt_dp_create, bounded peaks while training),
 * and the bytes the data-parallel collectives moved per step.
 *
 * Modes (ranks): dp2 (2), dp3 (3), pp2 (2), dp2pp2 (4), dp2tp2sp (4), ep (2 or 4: dp = ranks,
 * ep 2, 4 experts).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "train.h"

#define STEPS 3

static int g_rank, g_fail;
static ncclComm_t g_world;

#define CHECK(call)                                                                                \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "rank %d: %s:%d: %s failed: %s\n", g_rank, __FILE__, __LINE__, #call, \
                    ncclGetErrorString(r_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: FAIL: ", g_rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    g_fail++;
}

/* ---------------------------------------------------------------------------------------- */
/* Data: sequence s of the global batch of a step, tokens in [0, V).                          */

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

struct data_ctx {
    int step, base, b, T, V;
};

static void data_fn(int mb, int *tokens, int *targets, void *vctx)
{
    const struct data_ctx *c = vctx;
    for (int j = 0; j < c->b; j++) {
        uint64_t s = (uint64_t)(c->base + mb * c->b + j);
        for (int t = 0; t <= c->T; t++) {
            /* a little structure (next token often follows the previous) so the loss moves */
            uint64_t h = mix((uint64_t)c->step * 1000003ULL + s * 7919ULL + (uint64_t)t);
            int x = (int)(h % (uint64_t)c->V);
            if (t > 0 && (h >> 32) % 3 != 0)
                x = (int)((mix(s * 31ULL + (uint64_t)t / 2) >> 7) % (uint64_t)c->V);
            if (t < c->T)
                tokens[j * c->T + t] = x;
            if (t > 0)
                targets[j * c->T + t - 1] = x;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */

struct setup {
    struct wt_config cfg;
    struct wt_mesh mesh;
    int b;          /* sequences per micro-batch per DP rank */
    struct wt_adamw opt;
    float *init;    /* canonical initial parameters */
    size_t P;
};

struct run_out {
    float *params;  /* canonical, after the last step (rank 0) */
    float *grads1;  /* canonical gradient of the first step (rank 0) */
    float *am, *av; /* canonical AdamW state after the last step (rank 0) */
    int nsteps;
    double loss[2 * STEPS], norm[2 * STEPS];
};

static void out_alloc(struct run_out *o, size_t P)
{
    memset(o, 0, sizeof(*o));
    o->params = calloc(P, sizeof(float));
    o->grads1 = calloc(P, sizeof(float));
    o->am = calloc(P, sizeof(float));
    o->av = calloc(P, sizeof(float));
    o->nsteps = STEPS;
}

static void out_free(struct run_out *o)
{
    free(o->params);
    free(o->grads1);
    free(o->am);
    free(o->av);
}

static uint64_t hash_floats(const float *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], 4);
        h = mix(h ^ u);
    }
    return h;
}

/* The replicas of this rank's parameters are bit-identical across its DP group. */
static void check_replicas(const struct setup *S, struct wt_model *m, const char *what)
{
    if (S->mesh.dp_comm == NULL || S->mesh.dp == 1)
        return;
    uint64_t h = 1;
    for (int u = 0; u < m->lay.nunits; u++) {
        if (m->lay.units[u].group != WT_GROUP_DP)
            continue;
        if (m->param_units[u] == NULL)
            return; /* zero 3: only shards */
        h = hash_floats(m->param_units[u], m->lay.units[u].padded, h);
    }
    uint64_t lo, hi;
    CHECK(ncclAllReduce(&h, &lo, 1, ncclUint64, ncclMin, S->mesh.dp_comm, NULL));
    CHECK(ncclAllReduce(&h, &hi, 1, ncclUint64, ncclMax, S->mesh.dp_comm, NULL));
    if (lo != hi)
        failf("%s: parameter replicas differ across the DP group", what);
}

struct shape {
    size_t full, shard, kept, maxlayer;
    int per_layer;
};

static struct shape layout_shape(const struct setup *S, const struct wt_layout *lay)
{
    struct shape s = {0, 0, 0, 0, 1};
    for (int u = 0; u < lay->nunits; u++) {
        const struct wt_unit *lu = &lay->units[u];
        int n = lu->group == WT_GROUP_EDP ? S->mesh.edp : S->mesh.dp;
        s.full += lu->padded;
        s.shard += lu->padded / (size_t)n;
        if (u == lay->wte_unit || u == lay->outer_unit)
            s.kept += lu->padded;
        else if (lu->padded > s.maxlayer)
            s.maxlayer = lu->padded;
        if (lu->group == WT_GROUP_EDP)
            s.per_layer = 2;
    }
    return s;
}

/* Steps first..first+nsteps-1 from the initial parameters, or from `from`'s final parameters
 * and AdamW state (a resume; `from` must be readable on every rank). */
static void run_steps(const struct setup *S, int zero, int overlap, int m,
                      enum wt_schedule sched, struct run_out *o, const char *name, int first,
                      int nsteps, const struct run_out *from)
{
    const struct wt_mesh *mesh = &S->mesh;
    const int T = S->cfg.seq;
    struct wt_model model;
    int nslots = wt_schedule_slots(sched, mesh->pp_rank, mesh->pp, m);
    CHECK(wt_model_init(&model, &S->cfg, mesh, S->b, nslots));
    int G = mesh->dp * S->b * m;
    model.loss_scale = 1.0f / (float)(G * T);
    struct shape sh = layout_shape(S, &model.lay);

    size_t base[WT_MEM_KINDS];
    for (int k = 0; k < WT_MEM_KINDS; k++)
        base[k] = wt_mem.now[k];
    struct wt_dp *dp;
    CHECK(wt_dp_create(&model, zero, overlap, &dp));
    if (from != NULL)
        CHECK(wt_dp_load(dp, from->params, from->am, from->av));
    else
        CHECK(wt_dp_load(dp, S->init, NULL, NULL));
    o->nsteps = nsteps;

    /* Memory right after creation: what the ZeRO stage holds. */
    size_t F = sh.full * 4, Sh = sh.shard * 4;
    size_t want_p = zero == 3 ? Sh : F;
    size_t want_g = zero <= 1 ? F : Sh; /* ZeRO-1 reduce-scatters in place */
    size_t want_o = 2 * (zero == 0 ? F : Sh);
    size_t got_p = wt_mem.now[WT_MEM_PARAMS] - base[WT_MEM_PARAMS];
    size_t got_g = wt_mem.now[WT_MEM_GRADS] - base[WT_MEM_GRADS];
    size_t got_o = wt_mem.now[WT_MEM_OPTIM] - base[WT_MEM_OPTIM];
    if (got_p != want_p || got_g != want_g || got_o != want_o)
        failf("%s: memory params/grads/optim %zu/%zu/%zu bytes, expected %zu/%zu/%zu", name,
              got_p, got_g, got_o, want_p, want_g, want_o);
    if (wt_mem.now[WT_MEM_COMM] != base[WT_MEM_COMM])
        failf("%s: %zu comm bytes left allocated after load", name,
              wt_mem.now[WT_MEM_COMM] - base[WT_MEM_COMM]);
    for (int k = 0; k < WT_MEM_KINDS; k++)
        wt_mem.peak[k] = wt_mem.now[k];

    struct data_ctx dc = {0, mesh->dp_rank * S->b * m, S->b, T, S->cfg.vocab};
    for (int step = first; step < first + nsteps; step++) {
        struct wt_comm_stats c0 = wt_comm;
        dc.step = step;
        double loss = 0, norm = 0;
        struct wt_pp_stats st;
        CHECK(wt_dp_step_begin(dp));
        CHECK(wt_pp_run(&model, dp, sched, m, data_fn, &dc, &loss, &st));
        CHECK(wt_dp_reduce_finish(dp));
        CHECK(wt_dp_grad_norm(dp, &norm));
        struct wt_comm_stats c1 = wt_comm;
        if (step == first)
            CHECK(wt_dp_gather_canon(dp, WT_STATE_GRADS, o->grads1));
        struct wt_comm_stats c2 = wt_comm;
        CHECK(wt_dp_optimizer_step(dp, &S->opt, step, norm));
        struct wt_comm_stats c3 = wt_comm;

        if (st.wait_seconds < 0 || st.step_seconds < st.wait_seconds)
            failf("%s: pipeline stats wait %g step %g", name, st.wait_seconds, st.step_seconds);
        /* Data-parallel bytes of the step (backward + optimizer, not the canonical gather). */
        uint64_t rs = (c1.bytes[WT_COLL_REDUCESCATTER] - c0.bytes[WT_COLL_REDUCESCATTER]) +
                      (c3.bytes[WT_COLL_REDUCESCATTER] - c2.bytes[WT_COLL_REDUCESCATTER]);
        uint64_t ag = (c1.bytes[WT_COLL_ALLGATHER] - c0.bytes[WT_COLL_ALLGATHER]) +
                      (c3.bytes[WT_COLL_ALLGATHER] - c2.bytes[WT_COLL_ALLGATHER]);
        if (mesh->dp > 1 && mesh->edp > 1 && !mesh->sp) { /* SP: the model's own RS/AG over TP */
            uint64_t want_rs = zero == 0 ? 0 : zero == 1 ? F : (uint64_t)m * F;
            uint64_t want_ag = zero == 0 ? 0 : zero < 3 ? F
                                       : sh.kept * 4 + 2 * (uint64_t)m * (F - sh.kept * 4);
            /* ZeRO-3 gathers every layer unit in forward and in backward; a unit still gathered
             * when the next phase needs it first is reused, so with m > 1 or pp > 1 fewer. */
            int exact = zero < 3 || (mesh->pp == 1 && m == 1);
            uint64_t min_ag = zero < 3 ? want_ag : sh.kept * 4 + (uint64_t)m * (F - sh.kept * 4);
            if (rs != want_rs || (exact ? ag != want_ag : (ag > want_ag || ag < min_ag)))
                failf("%s step %d: reduce-scatter %llu bytes (expected %llu), all-gather %llu "
                      "(expected %s%llu)", name, step, (unsigned long long)rs,
                      (unsigned long long)want_rs, (unsigned long long)ag, exact ? "" : "<= ",
                      (unsigned long long)want_ag);
        }
        /* global loss: sum over the last stage's TP rank 0 of every DP replica */
        double mine = (mesh->pp_rank == mesh->pp - 1 && mesh->tp_rank == 0) ? loss : 0.0, tot;
        CHECK(ncclAllReduce(&mine, &tot, 1, ncclFloat64, ncclSum, g_world, NULL));
        o->loss[step - first] = tot;
        o->norm[step - first] = norm;
        check_replicas(S, &model, name);
    }
    /* Peaks while training: ZeRO-3 holds the shards plus the outer/wte units and at most the
     * current layer's units and the prefetched one; ZeRO-2/3 gradients likewise (plus one unit
     * whose reduction may still be in flight). */
    size_t pk_p = wt_mem.peak[WT_MEM_PARAMS] - base[WT_MEM_PARAMS];
    size_t pk_g = wt_mem.peak[WT_MEM_GRADS] - base[WT_MEM_GRADS];
    size_t live = sh.maxlayer * 4;
    if (zero == 3 && pk_p > Sh + sh.kept * 4 + (size_t)(sh.per_layer + 1) * live)
        failf("%s: peak params %zu > shard %zu + kept %zu + %d units of %zu", name, pk_p, Sh,
              sh.kept * 4, sh.per_layer + 1, live);
    if (zero == 3 && pk_p <= Sh)
        failf("%s: peak params %zu: no unit was ever gathered", name, pk_p);
    if (zero >= 2 && pk_g > Sh + sh.kept * 4 + (size_t)(sh.per_layer + 2) * live)
        failf("%s: peak grads %zu > shard %zu + kept %zu + %d units of %zu", name, pk_g, Sh,
              sh.kept * 4, sh.per_layer + 2, live);
    if (zero < 3 && pk_p != F)
        failf("%s: peak params %zu != full %zu", name, pk_p, F);

    CHECK(wt_dp_gather_canon(dp, WT_STATE_PARAMS, o->params));
    CHECK(wt_dp_gather_canon(dp, WT_STATE_ADAM_M, o->am));
    CHECK(wt_dp_gather_canon(dp, WT_STATE_ADAM_V, o->av));
    wt_dp_destroy(dp);
    wt_model_fini(&model);
    for (int k = WT_MEM_PARAMS; k <= WT_MEM_OPTIM; k++)
        if (wt_mem.now[k] != base[k])
            failf("%s: %s: %zd bytes not freed", name, wt_mem_name((enum wt_mem_kind)k),
                  (ssize_t)(wt_mem.now[k] - base[k]));
}

static void run(const struct setup *S, int zero, int overlap, int m, enum wt_schedule sched,
                struct run_out *o, const char *name)
{
    run_steps(S, zero, overlap, m, sched, o, name, 1, STEPS, NULL);
}

/* The final state of a run, on every rank (for a resume). */
static void share(const struct setup *S, struct run_out *o)
{
    CHECK(ncclBroadcast(o->params, o->params, S->P, ncclFloat32, 0, g_world, NULL));
    CHECK(ncclBroadcast(o->am, o->am, S->P, ncclFloat32, 0, g_world, NULL));
    CHECK(ncclBroadcast(o->av, o->av, S->P, ncclFloat32, 0, g_world, NULL));
}

/* The single-rank model on the same global batch (one micro-batch of G sequences). */
static void run_ref(const struct setup *S, int G, struct run_out *o)
{
    struct wt_mesh one;
    wt_mesh_single(&one);
    struct wt_model model;
    wt_mem_mute = 1;
    CHECK(wt_model_init(&model, &S->cfg, &one, G, 1));
    model.loss_scale = 1.0f / (float)(G * S->cfg.seq);
    struct wt_dp *dp;
    CHECK(wt_dp_create(&model, 0, 0, &dp));
    CHECK(wt_dp_load(dp, S->init, NULL, NULL));
    struct data_ctx dc = {0, 0, G, S->cfg.seq, S->cfg.vocab};
    for (int step = 1; step <= STEPS; step++) {
        dc.step = step;
        double loss = 0, norm = 0;
        CHECK(wt_dp_step_begin(dp));
        CHECK(wt_pp_run(&model, dp, WT_SCHED_1F1B, 1, data_fn, &dc, &loss, NULL));
        CHECK(wt_dp_reduce_finish(dp));
        CHECK(wt_dp_grad_norm(dp, &norm));
        if (step == 1)
            CHECK(wt_dp_gather_canon(dp, WT_STATE_GRADS, o->grads1));
        CHECK(wt_dp_optimizer_step(dp, &S->opt, step, norm));
        o->loss[step - 1] = loss;
        o->norm[step - 1] = norm;
    }
    CHECK(wt_dp_gather_canon(dp, WT_STATE_PARAMS, o->params));
    wt_dp_destroy(dp);
    wt_model_fini(&model);
    wt_mem_mute = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Comparisons on rank 0                                                                      */

static void same_bits(const struct setup *S, const struct run_out *a, const char *an,
                      const struct run_out *b, const char *bn)
{
    if (g_rank != 0)
        return;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < S->P; i++) {
        if (memcmp(&a->params[i], &b->params[i], 4) != 0 && bad++ == 0)
            first = i;
    }
    if (bad)
        failf("%s vs %s: %zu parameters differ (first at %zu: %.9g vs %.9g)", an, bn, bad, first,
              a->params[first], b->params[first]);
    if (memcmp(a->grads1, b->grads1, S->P * 4) != 0)
        failf("%s vs %s: first-step gradients differ", an, bn);
    if (memcmp(a->am, b->am, S->P * 4) != 0 || memcmp(a->av, b->av, S->P * 4) != 0)
        failf("%s vs %s: AdamW state differs", an, bn);
    if (a->nsteps != b->nsteps)
        failf("%s vs %s: %d vs %d steps", an, bn, a->nsteps, b->nsteps);
    for (int s = 0; s < a->nsteps && s < b->nsteps; s++) {
        if (memcmp(&a->loss[s], &b->loss[s], 8) != 0 || memcmp(&a->norm[s], &b->norm[s], 8) != 0)
            failf("%s vs %s step %d: loss %.17g / %.17g, norm %.17g / %.17g", an, bn, s + 1,
                  a->loss[s], b->loss[s], a->norm[s], b->norm[s]);
    }
    if (!bad)
        printf("  %-22s == %-22s bit for bit\n", an, bn);
}

/* A run resumed at step STEPS+1 against an uninterrupted run of 2*STEPS steps. */
static void same_final(const struct setup *S, const struct run_out *whole, const char *wn,
                       const struct run_out *resumed, const char *rn)
{
    if (g_rank != 0)
        return;
    int bad = 0;
    if (memcmp(whole->params, resumed->params, S->P * 4) != 0 ||
        memcmp(whole->am, resumed->am, S->P * 4) != 0 ||
        memcmp(whole->av, resumed->av, S->P * 4) != 0) {
        failf("%s vs %s: final parameters or AdamW state differ", wn, rn);
        bad = 1;
    }
    for (int s = 0; s < resumed->nsteps; s++) {
        if (memcmp(&whole->loss[STEPS + s], &resumed->loss[s], 8) != 0 ||
            memcmp(&whole->norm[STEPS + s], &resumed->norm[s], 8) != 0) {
            failf("%s vs %s step %d: loss %.17g / %.17g", wn, rn, STEPS + s + 1,
                  whole->loss[STEPS + s], resumed->loss[s]);
            bad = 1;
        }
    }
    if (!bad)
        printf("  %-22s == %-22s bit for bit (steps %d-%d)\n", wn, rn, STEPS + 1, 2 * STEPS);
}

static void close_to(const struct setup *S, const struct run_out *a, const char *an,
                     const struct run_out *ref, const char *rn)
{
    if (g_rank != 0)
        return;
    double gmax = 0, dg = 0, dpar = 0, moved = 0;
    size_t ig = 0, ip = 0;
    for (size_t i = 0; i < S->P; i++) {
        double g = fabs((double)ref->grads1[i]);
        if (g > gmax)
            gmax = g;
        double d = fabs((double)a->grads1[i] - (double)ref->grads1[i]);
        if (d > dg || isnan(d)) {
            dg = d;
            ig = i;
        }
        d = fabs((double)a->params[i] - (double)ref->params[i]);
        if (d > dpar || isnan(d)) {
            dpar = d;
            ip = i;
        }
        d = fabs((double)ref->params[i] - (double)S->init[i]);
        if (d > moved)
            moved = d;
    }
    double tol_g = 1e-6 + 1e-5 * gmax, tol_p = 0.1 * S->opt.lr * STEPS;
    if (!(dg <= tol_g))
        failf("%s vs %s: step-1 gradient differs by %.3g at %zu (%.9g vs %.9g; tol %.3g)", an, rn,
              dg, ig, a->grads1[ig], ref->grads1[ig], tol_g);
    if (!(dpar <= tol_p))
        failf("%s vs %s: parameters differ by %.3g at %zu (tol %.3g)", an, rn, dpar, ip, tol_p);
    if (gmax == 0 || moved == 0)
        failf("%s: nothing was learned (max |g| %g, max param move %g)", rn, gmax, moved);
    double dl = 0;
    for (int s = 0; s < STEPS; s++) {
        double d = fabs(a->loss[s] - ref->loss[s]);
        if (d > dl || isnan(d))
            dl = d;
        if (!(fabs(a->norm[s] - ref->norm[s]) <= 1e-5 * ref->norm[s] + 1e-9))
            failf("%s vs %s step %d: grad norm %.9g vs %.9g", an, rn, s + 1, a->norm[s],
                  ref->norm[s]);
        if (!(ref->loss[s] > 0.5 && ref->loss[s] < 10))
            failf("%s step %d: implausible loss %g", rn, s + 1, ref->loss[s]);
    }
    if (!(dl <= 1e-5))
        failf("%s vs %s: loss differs by %.3g", an, rn, dl);
    printf("  %-22s ~= %-22s |dloss| %.2g, |dgrad| %.2g (max |g| %.2g), |dparam| %.2g\n", an, rn,
           dl, dg, gmax, dpar);
}

/* ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_dp dp2|dp3|pp2|dp2pp2|dp2tp2sp|ep\n");
        return 2;
    }
    const char *mode = argv[1];
    int nranks, local;
    ncclUniqueId id;
    CHECK(weftLaunchInfo(&g_rank, &nranks, &local, &id));
    CHECK(ncclCommInitRank(&g_world, nranks, id, g_rank));

    struct setup S;
    memset(&S, 0, sizeof(S));
    S.cfg = (struct wt_config){.layers = 4, .channels = 32, .heads = 2, .vocab = 64, .seq = 16,
                               .experts = 0};
    S.b = 2;
    S.opt = (struct wt_adamw){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .clip = 1.0f};
    int dp = nranks, tp = 1, pp = 1, ep = 1, sp = 0;
    if (strcmp(mode, "pp2") == 0) {
        dp = 1;
        pp = 2;
    } else if (strcmp(mode, "dp2pp2") == 0) {
        dp = 2;
        pp = 2;
    } else if (strcmp(mode, "dp2tp2sp") == 0) {
        dp = 2;
        tp = 2;
        sp = 1;
    } else if (strcmp(mode, "ep") == 0) {
        dp = nranks;
        ep = 2;
        S.cfg.experts = 4;
        S.cfg.layers = 2;
    } else if (strcmp(mode, "dp2") != 0 && strcmp(mode, "dp3") != 0) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    if (dp * tp * pp != nranks) {
        fprintf(stderr, "mode %s needs %d ranks, got %d\n", mode, dp * tp * pp, nranks);
        return 2;
    }
    CHECK(wt_mesh_init(&S.mesh, g_world, dp, tp, pp, ep, sp));
    S.P = wt_canon_size(&S.cfg);
    S.init = calloc(S.P, sizeof(float));
    wt_init_canon(&S.cfg, 1234, S.init);
    if (g_rank == 0)
        printf("test_dp %s: dp %d tp %d pp %d ep %d sp %d, %zu parameters\n", mode, dp, tp, pp,
               ep, sp, S.P);

    struct run_out ref;
    out_alloc(&ref, S.P);
    const enum wt_schedule F1B = WT_SCHED_1F1B, GP = WT_SCHED_GPIPE;

    if (strcmp(mode, "dp2") == 0 || strcmp(mode, "dp3") == 0 || strcmp(mode, "dp2tp2sp") == 0 ||
        strcmp(mode, "ep") == 0) {
        struct run_out z[4], z2ov, m2[4];
        char nm[4][32], nm2[4][32];
        for (int k = 0; k < 4; k++) {
            out_alloc(&z[k], S.P);
            snprintf(nm[k], sizeof(nm[k]), "zero%d", k);
            run(&S, k, 1, 1, F1B, &z[k], nm[k]);
        }
        if (g_rank == 0)
            run_ref(&S, dp * S.b, &ref);
        /* ZeRO 1, 2, 3: the same reduce-scatters of the same padded units at m == 1 */
        same_bits(&S, &z[1], "zero1", &z[2], "zero2");
        same_bits(&S, &z[1], "zero1", &z[3], "zero3");
        /* at DP 2 an all-reduce and a reduce-scatter both compute a + b */
        if (dp == 2 && ep == 1)
            same_bits(&S, &z[0], "zero0", &z[1], "zero1");
        else
            close_to(&S, &z[1], "zero1", &z[0], "zero0");
        for (int k = 0; k < 4; k++)
            close_to(&S, &z[k], nm[k], &ref, "single-rank");
        if (strcmp(mode, "dp2") == 0 || strcmp(mode, "dp3") == 0) {
            /* resume: zero 1's state after STEPS steps loaded into zero 2 / zero 3 */
            struct run_out whole, res;
            out_alloc(&whole, S.P);
            out_alloc(&res, S.P);
            int into = dp == 2 ? 2 : 3;
            run_steps(&S, 1, 1, 1, F1B, &whole, "zero1-whole", 1, 2 * STEPS, NULL);
            share(&S, &z[1]);
            run_steps(&S, into, 1, 1, F1B, &res, into == 2 ? "zero1+zero2" : "zero1+zero3",
                      STEPS + 1, STEPS, &z[1]);
            same_final(&S, &whole, "zero1-whole", &res, into == 2 ? "zero1+zero2" : "zero1+zero3");
            out_free(&whole);
            out_free(&res);
        }
        if (dp == 2) {
            out_alloc(&z2ov, S.P);
            run(&S, 2, 0, 1, F1B, &z2ov, "zero2-no-overlap");
            same_bits(&S, &z[2], "zero2", &z2ov, "zero2-no-overlap");
            out_free(&z2ov);
        }
        /* two micro-batches: ZeRO 2 and 3 reduce every micro-batch, 0 and 1 once */
        if (strcmp(mode, "dp2tp2sp") != 0) {
            struct run_out refm;
            out_alloc(&refm, S.P);
            if (g_rank == 0)
                run_ref(&S, dp * S.b * 2, &refm);
            for (int k = 0; k < 4; k++) {
                out_alloc(&m2[k], S.P);
                snprintf(nm2[k], sizeof(nm2[k]), "zero%d-m2", k);
                run(&S, k, 1, 2, F1B, &m2[k], nm2[k]);
                close_to(&S, &m2[k], nm2[k], &refm, "single-rank");
            }
            same_bits(&S, &m2[2], "zero2-m2", &m2[3], "zero3-m2");
            if (dp == 2 && ep == 1)
                same_bits(&S, &m2[0], "zero0-m2", &m2[1], "zero1-m2");
            for (int k = 0; k < 4; k++)
                out_free(&m2[k]);
            out_free(&refm);
        }
        for (int k = 0; k < 4; k++)
            out_free(&z[k]);
    } else if (strcmp(mode, "pp2") == 0) {
        const int m = 4;
        struct run_out g, f;
        out_alloc(&g, S.P);
        out_alloc(&f, S.P);
        run(&S, 0, 1, m, GP, &g, "pp2-gpipe");
        run(&S, 0, 1, m, F1B, &f, "pp2-1f1b");
        if (g_rank == 0)
            run_ref(&S, S.b * m, &ref);
        same_bits(&S, &g, "pp2-gpipe", &f, "pp2-1f1b");
        close_to(&S, &f, "pp2-1f1b", &ref, "single-rank");
        out_free(&g);
        out_free(&f);
    } else if (strcmp(mode, "dp2pp2") == 0) {
        const int m = 2;
        struct run_out z[4], g3;
        char nm[4][32];
        for (int k = 0; k < 4; k++) {
            out_alloc(&z[k], S.P);
            snprintf(nm[k], sizeof(nm[k]), "dp2pp2-zero%d", k);
            run(&S, k, 1, m, F1B, &z[k], nm[k]);
        }
        out_alloc(&g3, S.P);
        run(&S, 3, 1, m, GP, &g3, "dp2pp2-zero3-gpipe");
        if (g_rank == 0)
            run_ref(&S, dp * S.b * m, &ref);
        same_bits(&S, &z[0], nm[0], &z[1], nm[1]);
        same_bits(&S, &z[2], nm[2], &z[3], nm[3]);
        same_bits(&S, &z[3], nm[3], &g3, "dp2pp2-zero3-gpipe");
        for (int k = 0; k < 4; k++) {
            close_to(&S, &z[k], nm[k], &ref, "single-rank");
            out_free(&z[k]);
        }
        out_free(&g3);
    }
    out_free(&ref);

    int fails = g_fail, total;
    CHECK(ncclAllReduce(&fails, &total, 1, ncclInt32, ncclSum, g_world, NULL));
    wt_mesh_fini(&S.mesh);
    ncclCommDestroy(g_world);
    free(S.init);
    if (g_rank == 0)
        printf("test_dp %s: %s\n", mode, total ? "FAIL" : "OK");
    return total ? 1 : 0;
}
