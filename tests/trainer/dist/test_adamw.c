/*
 * test_adamw.c -- wt_adamw_update against the AdamW formula evaluated in double precision, over
 * several steps, with a gradient scale (clipping) and a decay mask; plus the properties the
 * data-parallel engine relies on: updating a buffer in pieces (ZeRO shards) gives the same bits
 * as one call, and zero padding stays zero.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

int main(void)
{
    enum { N = 1003, STEPS = 6 };
    struct wt_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f, .clip = 1.0f};
    static float p[N], m[N], v[N], g[N], p2[N], m2[N], v2[N];
    static double pd[N], md[N], vd[N];
    static uint8_t mask[N];
    int failures = 0;

    for (int i = 0; i < N; i++) {
        p[i] = (float)(urand() * 2 - 1);
        pd[i] = p[i];
        mask[i] = (i % 3) != 0;
    }
    memcpy(p2, p, sizeof(p));
    double worst = 0;
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)((urand() * 2 - 1) * (i % 7 == 0 ? 1e-3 : 1.0));
        float scale = t % 2 ? 0.5f : 1.0f;
        wt_adamw_update(&opt, t, scale, p, g, m, v, mask, N);
        /* shards: the same update in three pieces */
        size_t cut1 = 331, cut2 = 700;
        wt_adamw_update(&opt, t, scale, p2, g, m2, v2, mask, cut1);
        wt_adamw_update(&opt, t, scale, p2 + cut1, g + cut1, m2 + cut1, v2 + cut1, mask + cut1,
                        cut2 - cut1);
        wt_adamw_update(&opt, t, scale, p2 + cut2, g + cut2, m2 + cut2, v2 + cut2, mask + cut2,
                        N - cut2);
        if (memcmp(p, p2, sizeof(p)) || memcmp(m, m2, sizeof(m)) || memcmp(v, v2, sizeof(v))) {
            fprintf(stderr, "step %d: piecewise update differs from one call\n", t);
            failures++;
        }
        double b1 = opt.beta1, b2 = opt.beta2;
        for (int i = 0; i < N; i++) {
            double gg = (double)scale * g[i];
            md[i] = b1 * md[i] + (1 - b1) * gg;
            vd[i] = b2 * vd[i] + (1 - b2) * gg * gg;
            double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
            double wd = mask[i] ? opt.weight_decay : 0.0;
            pd[i] -= opt.lr * (mh / (sqrt(vh) + opt.eps) + wd * pd[i]);
            double e = fabs(pd[i] - p[i]);
            double em = fabs(md[i] - m[i]) / (fabs(md[i]) + 1e-12);
            if (e > worst)
                worst = e;
            if (e > 2e-6 || em > 1e-4) {
                if (failures < 10)
                    fprintf(stderr, "step %d elem %d: param %.9g vs %.9g, m %.9g vs %.9g\n", t, i,
                            p[i], pd[i], m[i], md[i]);
                failures++;
            }
        }
    }
    /* NULL mask decays everything; zero padding (g = m = v = p = 0) stays zero */
    {
        float a[4] = {1, 1, 0, 0}, ga[4] = {0, 0, 0, 0}, ma[4] = {0}, va[4] = {0};
        float b[4] = {1, 1, 0, 0}, mb[4] = {0}, vb[4] = {0};
        uint8_t all[4] = {1, 1, 1, 1};
        wt_adamw_update(&opt, 1, 1.0f, a, ga, ma, va, NULL, 4);
        wt_adamw_update(&opt, 1, 1.0f, b, ga, mb, vb, all, 4);
        if (memcmp(a, b, sizeof(a)) != 0 || a[2] != 0.0f || a[3] != 0.0f ||
            !(a[0] < 1.0f)) {
            fprintf(stderr, "NULL mask / padding: %g %g %g %g vs %g\n", a[0], a[1], a[2], a[3],
                    b[0]);
            failures++;
        }
        float c[1] = {1}, gc[1] = {0}, mc[1] = {0}, vc[1] = {0};
        uint8_t none[1] = {0};
        wt_adamw_update(&opt, 1, 1.0f, c, gc, mc, vc, none, 1);
        if (c[0] != 1.0f) {
            fprintf(stderr, "masked element decayed: %g\n", c[0]);
            failures++;
        }
    }
    if (failures) {
        fprintf(stderr, "test_adamw: %d failures\n", failures);
        return 1;
    }
    printf("test_adamw: OK (%d elements, %d steps, max |param - double formula| %.3g)\n", N,
           STEPS, worst);
    return 0;
}
