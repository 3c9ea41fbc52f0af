/*
 * test_gradcheck -- the single-rank model's hand-written backward against central finite
 * differences of its forward, for a sample of elements of every local tensor (each tensor's
 * largest-gradient element plus random ones), dense and with experts.
 *
 * Also checked on the way: forward + backward twice give bit-identical losses and gradients,
 * and the hooks run in the order train.h documents (each unit begun before use; each unit's
 * gradients done once, layers last to first with the expert unit before the dense one, then the
 * outer and wte units).
 *
 * Parameters are randomised (LayerNorm weights and biases included) so that a wrong factor in any
 * formula shows up. The loss is the sum of token losses (loss_scale 1) and the step is 1e-2 with
 * fp32 forwards: the finite-difference noise is ~1e-4 against gradients of ~1e-1.
 *
 * usage: test_gradcheck dense|experts
 */
#include "common.h"

static double loss_of(struct wt_model *m, const int *tok, const int *tgt)
{
    double l = 0.0;
    CHECK_OK(wt_model_forward(m, 0, tok, tgt, NULL, NULL, &l));
    return l;
}

static int run(const char *name, const struct wt_config *cfg, int batch, double amp,
               uint64_t seed)
{
    struct wt_mesh mesh;
    struct wt_model m;
    struct tm_bufs b;
    struct hook_log hl;
    wt_mesh_single(&mesh);
    CHECK_OK(wt_model_init(&m, cfg, &mesh, batch, 1));
    tm_bufs_init(&b, &m);
    float *canon = tm_canon_params(cfg, seed, amp);
    wt_layout_import(&m.lay, m.param_units, canon);
    int N = batch * cfg->seq;
    int *tok = malloc((size_t)N * sizeof(int)), *tgt = malloc((size_t)N * sizeof(int));
    tm_tokens(seed, N, cfg->vocab, tok, tgt);
    m.loss_scale = 1.0f;

    tm_hooks_install(&m, &hl);
    double loss0, loss1;
    CHECK_OK(wt_model_forward(&m, 0, tok, tgt, NULL, NULL, &loss0));
    CHECK_OK(wt_model_backward(&m, 0, NULL, NULL));
    tm_check_hook_order(&m, &hl);
    memset(&m.hooks, 0, sizeof(m.hooks));

    size_t total = m.lay.total;
    float *g0 = malloc(total * sizeof(float));
    memcpy(g0, b.grads, total * sizeof(float));
    memset(b.grads, 0, total * sizeof(float));
    CHECK_OK(wt_model_forward(&m, 0, tok, tgt, NULL, NULL, &loss1));
    CHECK_OK(wt_model_backward(&m, 0, NULL, NULL));
    if (loss0 != loss1 || memcmp(g0, b.grads, total * sizeof(float)) != 0)
        FAIL("%s: two identical runs differ (loss %.17g vs %.17g)", name, loss0, loss1);
    /* Accumulation: a second backward adds the same gradient again. */
    CHECK_OK(wt_model_forward(&m, 0, tok, tgt, NULL, NULL, &loss1));
    CHECK_OK(wt_model_backward(&m, 0, NULL, NULL));
    float gmax = 0.0f;
    for (size_t i = 0; i < total; i++)
        gmax = fmaxf(gmax, fabsf(g0[i]));
    /* Not bitwise: WTE gets two contributions (head, embedding) added in turn. */
    for (size_t i = 0; i < total; i++)
        if (fabsf(b.grads[i] - 2.0f * g0[i]) > 1e-5f * fabsf(g0[i]) + 1e-6f * gmax)
            FAIL("%s: gradients do not accumulate at element %zu", name, i);
    printf("%s: loss %.6f (%d tokens, mean %.4f)\n", name, loss0, N, loss0 / N);

    const float eps = 1e-2f;
    const double rtol = 1e-2, atol = 5e-4;
    uint64_t rs = seed + 99;
    int bad = 0;
    double worst = 0.0;
    for (int ti = 0; ti < m.lay.ntensors; ti++) {
        const struct wt_tensor *t = &m.lay.tensors[ti];
        float *p = m.param_units[t->unit] + t->offset;
        const float *g = g0 + m.lay.units[t->unit].offset + t->offset;
        size_t imax = 0;
        for (size_t i = 1; i < t->count; i++)
            if (fabsf(g[i]) > fabsf(g[imax]))
                imax = i;
        double tworst = 0.0;
        for (int s = 0; s < 10; s++) {
            size_t i = s == 0 ? imax : (size_t)(tm_next(&rs) % t->count);
            float orig = p[i];
            p[i] = orig + eps;
            double lp = loss_of(&m, tok, tgt);
            p[i] = orig - eps;
            double lm = loss_of(&m, tok, tgt);
            p[i] = orig;
            double fd = (lp - lm) / (2.0 * (double)eps);
            double ga = g[i];
            double err = fabs(fd - ga), lim = rtol * fmax(fabs(fd), fabs(ga)) + atol;
            if (err / lim > tworst)
                tworst = err / lim;
            if (err > lim) {
                fprintf(stderr, "%s: %s[layer %d] element %zu: backward %.6e, finite "
                                "difference %.6e\n",
                        name, wt_kind_name(t->kind), t->layer, i, ga, fd);
                bad++;
            }
        }
        printf("  %-9s layer %2d: max |g| %.3e, worst err/limit %.3f\n", wt_kind_name(t->kind),
               t->layer, fabsf(g[imax]), tworst);
        if (tworst > worst)
            worst = tworst;
    }
    printf("%s: worst err/limit %.3f, %d bad\n", name, worst, bad);
    free(g0);
    free(tok);
    free(tgt);
    free(canon);
    tm_bufs_fini(&b);
    wt_model_fini(&m);
    return bad;
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "dense";
    struct wt_config cfg = {.layers = 2, .channels = 16, .heads = 2, .vocab = 32, .seq = 8,
                            .experts = 0};
    int bad;
    if (strcmp(which, "dense") == 0) {
        bad = run("dense", &cfg, 2, 0.2, 11);
    } else if (strcmp(which, "experts") == 0) {
        cfg.experts = 2;
        bad = run("experts", &cfg, 2, 0.2, 12);
    } else {
        fprintf(stderr, "usage: %s dense|experts\n", argv[0]);
        return 2;
    }
    if (bad) {
        fprintf(stderr, "FAIL: %d elements off\n", bad);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
