/*
 * optim.c -- AdamW on a flat range of parameters (a full buffer or a ZeRO shard).
 *
 * The update is llm.c's / PyTorch's AdamW written as one plain loop in a fixed order, so every
 * caller (DDP on full buffers, ZeRO on shards, the single-rank reference) computes each element
 * with exactly the same float operations:
 *
 *   g' = scale * g
 *   m  = b1 * m + (1 - b1) * g'
 *   v  = b2 * v + (1 - b2) * g'^2
 *   mhat = m / (1 - b1^t),  vhat = v / (1 - b2^t)
 *   p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)        (wd only where the mask allows)
 *
 * The bias corrections are computed once per call in double and rounded to float; everything
 * per element is float (the library is built with -fno-fast-math -ffp-contract=off).
 */
#include <math.h>

#include "train.h"

void wt_adamw_update(const struct wt_adamw *opt, int step, float scale, float *param,
                     const float *grad, float *m, float *v, const uint8_t *decay_mask, size_t n)
{
    const float b1 = opt->beta1, b2 = opt->beta2;
    const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)step));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)step));
    const float lr = opt->lr, eps = opt->eps, wd = opt->weight_decay;

    for (size_t i = 0; i < n; i++) {
        float g = scale * grad[i];
        float mi = b1 * m[i] + one_minus_b1 * g;
        float vi = b2 * v[i] + one_minus_b2 * (g * g);
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        float decay = (decay_mask == NULL || decay_mask[i]) ? wd : 0.0f;
        float p = param[i];
        param[i] = p - lr * (mhat / (sqrtf(vhat) + eps) + decay * p);
    }
}
