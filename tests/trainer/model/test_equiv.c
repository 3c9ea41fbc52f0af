/*
 * test_equiv -- the distributed model (TP, TP+SP, EP, PP) against the single-rank model on the
 * same global micro-batch. Run under weftrun:
 *
 *   weftrun -n N test_equiv [--dp D] [--tp T] [--pp P] [--ep E] [--sp] [--experts X]
 *
 * Every rank runs one forward + backward of its part (pipeline stages in turn, boundary tensors
 * over ncclSend/ncclRecv on the PP group), then finishes the gradients the way the data-parallel
 * engine would: SP-partial tensors all-reduced over TP, the tied WTE over {first, last} stage,
 * units over DP (expert units over EDP). Canonical gradients are gathered exactly: each owner
 * exports into a zeroed buffer and the int32 bit patterns are summed to rank 0 (one owner per
 * element, so the sum is a copy). Rank 0 runs the single-rank model and compares the loss and
 * every gradient element (|diff| <= 1e-5 |ref| + 1e-6 max|ref of the tensor|, with the
 * worst tensor printed).
 */
#include "common.h"

struct opts {
    int dp, tp, pp, ep, sp, experts;
};

static void parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){1, 1, 1, 1, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int *dst = NULL;
        if (strcmp(a, "--sp") == 0) {
            o->sp = 1;
            continue;
        }
        if (strcmp(a, "--dp") == 0)
            dst = &o->dp;
        else if (strcmp(a, "--tp") == 0)
            dst = &o->tp;
        else if (strcmp(a, "--pp") == 0)
            dst = &o->pp;
        else if (strcmp(a, "--ep") == 0)
            dst = &o->ep;
        else if (strcmp(a, "--experts") == 0)
            dst = &o->experts;
        if (dst == NULL || i + 1 >= argc) {
            fprintf(stderr, "usage: %s [--dp D] [--tp T] [--pp P] [--ep E] [--sp] "
                            "[--experts X]\n",
                    argv[0]);
            exit(2);
        }
        *dst = atoi(argv[++i]);
    }
}

/* All-reduces (SUM) the gradients of the tensors selected by `pick` over comm. */
static void allreduce_tensors(const struct wt_model *m, ncclComm_t comm,
                              int (*pick)(const struct wt_tensor *))
{
    for (int i = 0; i < m->lay.ntensors; i++) {
        const struct wt_tensor *t = &m->lay.tensors[i];
        if (!pick(t))
            continue;
        float *g = m->grad_units[t->unit] + t->offset;
        CHECK_OK(wt_allreduce(g, g, t->count, ncclSum, comm, NULL));
    }
}

static int pick_sp(const struct wt_tensor *t)
{
    return t->sp_partial;
}

static int pick_wte(const struct wt_tensor *t)
{
    return t->kind == WT_WTE;
}

int main(int argc, char **argv)
{
    struct opts o;
    parse(argc, argv, &o);
    int rank, nranks;
    ncclUniqueId id;
    ncclComm_t world;
    CHECK_OK(weftLaunchInfo(&rank, &nranks, NULL, &id));
    CHECK_OK(ncclCommInitRank(&world, nranks, id, rank));
    struct wt_mesh mesh;
    CHECK_OK(wt_mesh_init(&mesh, world, o.dp, o.tp, o.pp, o.ep, o.sp));

    struct wt_config cfg = {.layers = 3, .channels = 16, .heads = 4, .vocab = 32, .seq = 8,
                            .experts = o.experts};
    const int b = 3, Bg = b * o.dp, T = cfg.seq; /* 3: SP shards straddle sequences */
    const uint64_t seed = 2024;
    size_t P = wt_canon_size(&cfg);
    float *canon = tm_canon_params(&cfg, seed, 0.1);
    int *tok = malloc((size_t)Bg * T * sizeof(int)), *tgt = malloc((size_t)Bg * T * sizeof(int));
    tm_tokens(seed, Bg * T, cfg.vocab, tok, tgt);
    const float loss_scale = 1.0f / (float)(Bg * T);

    /* Distributed run. */
    struct wt_model m;
    struct tm_bufs bufs;
    CHECK_OK(wt_model_init(&m, &cfg, &mesh, b, 1));
    tm_bufs_init(&bufs, &m);
    wt_layout_import(&m.lay, m.param_units, canon);
    m.loss_scale = loss_scale;
    struct hook_log hl;
    tm_hooks_install(&m, &hl);
    size_t bel = wt_model_boundary_elems(&m);
    float *xin = calloc(bel, sizeof(float)), *xout = calloc(bel, sizeof(float));
    int first = mesh.pp_rank == 0, last = mesh.pp_rank == mesh.pp - 1;
    const int *mytok = tok + (size_t)mesh.dp_rank * b * T;
    const int *mytgt = tgt + (size_t)mesh.dp_rank * b * T;
    double loss = 0.0;
    if (!first)
        CHECK_OK(wt_recv(xin, bel * sizeof(float), mesh.pp_rank - 1, mesh.pp_comm));
    CHECK_OK(wt_model_forward(&m, 0, mytok, mytgt, first ? NULL : xin, last ? NULL : xout,
                              &loss));
    if (!last)
        CHECK_OK(wt_send(xout, bel * sizeof(float), mesh.pp_rank + 1, mesh.pp_comm,
                         WT_COLL_SENDRECV));
    if (!last)
        CHECK_OK(wt_recv(xout, bel * sizeof(float), mesh.pp_rank + 1, mesh.pp_comm));
    CHECK_OK(wt_model_backward(&m, 0, last ? NULL : xout, first ? NULL : xin));
    if (!first)
        CHECK_OK(wt_send(xin, bel * sizeof(float), mesh.pp_rank - 1, mesh.pp_comm,
                         WT_COLL_SENDRECV));

    tm_check_hook_order(&m, &hl);
    struct wt_comm_stats model_comm = wt_comm;
    /* What the data-parallel engine adds. */
    if (mesh.sp)
        allreduce_tensors(&m, mesh.tp_comm, pick_sp);
    if (mesh.tie_comm != NULL)
        allreduce_tensors(&m, mesh.tie_comm, pick_wte);
    for (int u = 0; u < m.lay.nunits; u++) {
        const struct wt_unit *un = &m.lay.units[u];
        int edp = un->group == WT_GROUP_EDP;
        ncclComm_t c = edp ? mesh.edp_comm : mesh.dp_comm;
        if ((edp ? mesh.edp : mesh.dp) > 1)
            CHECK_OK(wt_allreduce(m.grad_units[u], m.grad_units[u], un->padded, ncclSum, c,
                                  NULL));
        /* One replica exports: zero the others (+0.0 has the bit pattern 0). */
        if ((edp ? mesh.edp_rank : mesh.dp_rank) != 0)
            memset(m.grad_units[u], 0, un->padded * sizeof(float));
    }
    /* The model's own traffic (before the engine's reductions above), for the log. */
    char traffic[256];
    int tl = 0;
    for (int k = 0; k < WT_COLL_KINDS; k++)
        if (model_comm.calls[k] > 0)
            tl += snprintf(traffic + tl, sizeof(traffic) - (size_t)tl, " %s %llu/%llu B",
                           wt_coll_name((enum wt_coll)k), (unsigned long long)model_comm.calls[k],
                           (unsigned long long)model_comm.bytes[k]);
    if (tl == 0)
        snprintf(traffic, sizeof(traffic), " none");
    printf("rank %d model traffic:%s\n", rank, traffic);
    float *gcanon = calloc(P, sizeof(float)), *gsum = calloc(P, sizeof(float));
    wt_layout_export(&m.lay, m.grad_units, gcanon);
    CHECK_OK(wt_reduce(gcanon, gsum, P, ncclInt32, ncclSum, 0, world, NULL));
    double lsend = last && mesh.tp_rank == 0 ? loss : 0.0, lsum = 0.0;
    CHECK_OK(wt_reduce(&lsend, &lsum, 1, ncclFloat64, ncclSum, 0, world, NULL));

    int fail = 0;
    if (rank == 0) {
        struct wt_mesh single;
        struct wt_model r;
        struct tm_bufs rb;
        wt_mesh_single(&single);
        CHECK_OK(wt_model_init(&r, &cfg, &single, Bg, 1));
        tm_bufs_init(&rb, &r);
        wt_layout_import(&r.lay, r.param_units, canon);
        r.loss_scale = loss_scale;
        double rloss;
        CHECK_OK(wt_model_forward(&r, 0, tok, tgt, NULL, NULL, &rloss));
        CHECK_OK(wt_model_backward(&r, 0, NULL, NULL));
        float *gref = calloc(P, sizeof(float));
        wt_layout_export(&r.lay, r.grad_units, gref);

        double dl = fabs(lsum - rloss);
        if (dl > 1e-5 * fabs(rloss) + 1e-6) {
            fprintf(stderr, "FAIL: loss %.9f, single-rank %.9f\n", lsum, rloss);
            fail = 1;
        }
        /* Per (kind, layer): worst |diff| against its limit. */
        double worst = 0.0, worst_diff = 0.0;
        const char *worst_name = "-";
        int worst_layer = -1;
        size_t nbad = 0;
        for (int l = 0; l < cfg.layers; l++) {
            for (int k = 0; k < WT_KINDS; k++) {
                enum wt_kind kind = (enum wt_kind)k;
                if (!wt_kind_per_layer(kind) && l > 0)
                    continue;
                int rows, cols;
                wt_kind_shape(&cfg, kind, &rows, &cols);
                size_t n = (size_t)rows * cols, off = wt_canon_offset(&cfg, kind, l);
                float gmax = 0.0f;
                for (size_t i = 0; i < n; i++)
                    gmax = fmaxf(gmax, fabsf(gref[off + i]));
                for (size_t i = 0; i < n; i++) {
                    double d = fabs((double)gsum[off + i] - gref[off + i]);
                    double lim = 1e-5 * fabs(gref[off + i]) + 1e-6 * gmax + 1e-12;
                    if (!(d <= lim)) {
                        if (nbad < 5)
                            fprintf(stderr, "%s layer %d element %zu: %.9g, single-rank %.9g\n",
                                    wt_kind_name(kind), wt_kind_per_layer(kind) ? l : -1, i,
                                    gsum[off + i], gref[off + i]);
                        nbad++;
                    }
                    if (d / lim > worst || isnan(d)) {
                        worst = isnan(d) ? INFINITY : d / lim;
                        worst_diff = d;
                        worst_name = wt_kind_name(kind);
                        worst_layer = wt_kind_per_layer(kind) ? l : -1;
                    }
                }
            }
        }
        printf("dp %d tp %d pp %d ep %d sp %d experts %d: loss %.9f (single-rank %.9f, diff "
               "%.2e); worst gradient %s layer %d: diff %.3e = %.3f of its limit; %zu bad "
               "elements of %zu\n",
               o.dp, o.tp, o.pp, o.ep, mesh.sp, o.experts, lsum, rloss, dl, worst_name,
               worst_layer, worst_diff, worst, nbad, P);
        if (nbad)
            fail = 1;
        printf("%s\n", fail ? "FAIL" : "PASS");
        free(gref);
        tm_bufs_fini(&rb);
        wt_model_fini(&r);
    }
    free(gcanon);
    free(gsum);
    free(xin);
    free(xout);
    free(tok);
    free(tgt);
    free(canon);
    tm_bufs_fini(&bufs);
    wt_model_fini(&m);
    wt_mesh_fini(&mesh);
    ncclCommDestroy(world);
    return fail;
}
