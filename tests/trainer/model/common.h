/*
 * common.h -- helpers shared by the model tests: a seeded generator, randomised canonical
 * parameters (LayerNorm weights away from 1, biases away from 0, so every backward formula is
 * exercised) and flat parameter / gradient buffers for a layout.
 */
#ifndef WT_TEST_MODEL_COMMON_H_
#define WT_TEST_MODEL_COMMON_H_

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            FAIL("%s -> %d (%s)", #call, (int)r_, ncclGetErrorString(r_));                        \
    } while (0)

static inline uint64_t tm_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline double tm_uniform(uint64_t *s)
{
    return ((double)(tm_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static inline double tm_normal(uint64_t *s)
{
    double u1 = tm_uniform(s), u2 = tm_uniform(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Canonical parameters from wt_init_canon plus noise of `amp` on every element. */
static inline float *tm_canon_params(const struct wt_config *cfg, uint64_t seed, double amp)
{
    size_t P = wt_canon_size(cfg);
    float *c = calloc(P, sizeof(float));
    uint64_t s = seed * 7919 + 1;
    wt_init_canon(cfg, seed, c);
    for (size_t i = 0; i < P; i++)
        c[i] += (float)(amp * tm_normal(&s));
    return c;
}

/* Flat buffers for every unit of a layout, wired into the model. */
struct tm_bufs {
    float *params, *grads;
};

static inline void tm_bufs_init(struct tm_bufs *b, struct wt_model *m)
{
    const struct wt_layout *lay = &m->lay;
    b->params = calloc(lay->total + 1, sizeof(float));
    b->grads = calloc(lay->total + 1, sizeof(float));
    for (int u = 0; u < lay->nunits; u++) {
        m->param_units[u] = b->params + lay->units[u].offset;
        m->grad_units[u] = b->grads + lay->units[u].offset;
    }
}

static inline void tm_bufs_fini(struct tm_bufs *b)
{
    free(b->params);
    free(b->grads);
}

static inline void tm_tokens(uint64_t seed, int n, int V, int *tokens, int *targets)
{
    uint64_t s = seed * 104729 + 3;
    for (int i = 0; i < n; i++) {
        tokens[i] = (int)(tm_next(&s) % (uint64_t)V);
        targets[i] = (int)(tm_next(&s) % (uint64_t)V);
    }
}

/* Hooks that log their calls, and the order train.h documents for one forward + backward. */
#define TM_MAX_EVENTS 512

struct hook_log {
    int n;
    int ev[TM_MAX_EVENTS][3]; /* begin: {0, unit, phase}; done: {1, unit, -1} */
};

static inline ncclResult_t tm_log_begin(void *ctx, int u, enum wt_phase ph)
{
    struct hook_log *h = ctx;
    if (h->n < TM_MAX_EVENTS) {
        h->ev[h->n][0] = 0;
        h->ev[h->n][1] = u;
        h->ev[h->n][2] = (int)ph;
    }
    h->n++;
    return ncclSuccess;
}

static inline ncclResult_t tm_log_done(void *ctx, int u)
{
    struct hook_log *h = ctx;
    if (h->n < TM_MAX_EVENTS) {
        h->ev[h->n][0] = 1;
        h->ev[h->n][1] = u;
        h->ev[h->n][2] = -1;
    }
    h->n++;
    return ncclSuccess;
}

static inline void tm_hooks_install(struct wt_model *m, struct hook_log *h)
{
    memset(h, 0, sizeof(*h));
    m->hooks.ctx = h;
    m->hooks.unit_begin = tm_log_begin;
    m->hooks.unit_grads_done = tm_log_done;
}

/* Every unit begun in forward before the backward starts, begun once in backward before its
 * gradients are done, done once; completion order: (last stage, pp > 1) wte, outer; layers
 * l1-1 .. l0 (expert unit, then dense unit); (first stage) outer, wte. */
static inline void tm_check_hook_order(const struct wt_model *m, const struct hook_log *h)
{
    const struct wt_layout *lay = &m->lay;
    int nl = lay->l1 - lay->l0;
    int done[TM_MAX_EVENTS], nd = 0, begun_bwd[256], begun_fwd[256], in_bwd = 0;
    if (h->n > TM_MAX_EVENTS || lay->nunits > 256)
        FAIL("too many hook events (%d) or units (%d)", h->n, lay->nunits);
    memset(begun_bwd, 0, sizeof(begun_bwd));
    memset(begun_fwd, 0, sizeof(begun_fwd));
    for (int i = 0; i < h->n; i++) {
        int u = h->ev[i][1];
        if (u < 0 || u >= lay->nunits)
            FAIL("hook event on unit %d of %d", u, lay->nunits);
        if (h->ev[i][0] == 1) {
            if (!begun_bwd[u])
                FAIL("unit %d done before its backward began", u);
            done[nd++] = u;
        } else if (h->ev[i][2] == WT_BACKWARD) {
            begun_bwd[u]++;
            in_bwd = 1;
        } else {
            if (in_bwd)
                FAIL("forward begin of unit %d during the backward", u);
            begun_fwd[u]++;
        }
    }
    int want[TM_MAX_EVENTS], nw = 0;
    if (lay->has_head && !lay->has_embed) {
        want[nw++] = lay->wte_unit;
        want[nw++] = lay->outer_unit;
    }
    for (int k = nl - 1; k >= 0; k--) {
        if (lay->layer_expert_unit[k] >= 0)
            want[nw++] = lay->layer_expert_unit[k];
        want[nw++] = lay->layer_unit[k];
    }
    if (lay->has_embed) {
        want[nw++] = lay->outer_unit;
        want[nw++] = lay->wte_unit;
    }
    if (nd != nw || nw != lay->nunits)
        FAIL("%d units done, expected %d (units %d)", nd, nw, lay->nunits);
    for (int i = 0; i < nw; i++)
        if (done[i] != want[i])
            FAIL("done #%d is unit %d, expected %d", i, done[i], want[i]);
    for (int u = 0; u < lay->nunits; u++) {
        if (begun_bwd[u] != 1)
            FAIL("unit %d begun %d times in backward, expected once", u, begun_bwd[u]);
        if (begun_fwd[u] < 1)
            FAIL("unit %d never begun in forward", u);
    }
}

#endif /* WT_TEST_MODEL_COMMON_H_ */
