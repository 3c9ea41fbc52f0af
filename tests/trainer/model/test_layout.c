/*
 * test_layout -- the canonical order and the local layouts of tools/train/layout.c over fake
 * meshes (struct wt_mesh filled by hand, no communicators):
 *   - canonical offsets are back to back in the documented order and add up to P;
 *   - for every mesh (tp 1/2/4, pp 1/2/4, dp 1/2/3/4, ep 1/2 with experts, sp on/off) and every
 *     DP replica, the canon_owner tensors of its TP x PP ranks cover every canonical element
 *     exactly once; expert tensors likewise over the EP ranks of each EDP replica;
 *   - stage split, TP slices (strided QKV, vocabulary), local experts, flags (tp_replicated,
 *     sp_partial, canon_owner) as train.h states;
 *   - units: tensors back to back, padded to a multiple of the group size, units back to back;
 *   - export -> import round trips; import leaves the padding zero; export writes only owners;
 *   - bad configurations are refused with ncclInvalidArgument;
 *   - wt_init_canon is deterministic with the documented values.
 */
#include "common.h"

static int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            if (++failures > 20)                                                                   \
                exit(1);                                                                           \
        }                                                                                          \
    } while (0)

static struct wt_mesh fake_mesh(int dp, int tp, int pp, int ep, int sp, int dpr, int tpr,
                                int ppr)
{
    struct wt_mesh m;
    wt_mesh_coords(&m, dp, tp, pp, ep, sp, tpr + tp * (dpr + dp * ppr));
    return m;
}

static int is_sp_kind(enum wt_kind k)
{
    return k == WT_LN1W || k == WT_LN1B || k == WT_LN2W || k == WT_LN2B || k == WT_ATTPROJB ||
           k == WT_FCPROJB || k == WT_LNFW || k == WT_LNFB || k == WT_WPE;
}

static int is_expert_tensor(const struct wt_config *cfg, enum wt_kind k)
{
    return cfg->experts > 0 && (k == WT_FCW || k == WT_FCB || k == WT_FCPROJW || k == WT_FCPROJB);
}

static void check_canon_order(const struct wt_config *cfg)
{
    size_t off = 0;
    for (int l = -1; l <= cfg->layers; l++) {
        for (int k = 0; k < WT_KINDS; k++) {
            enum wt_kind kind = (enum wt_kind)k;
            int per = wt_kind_per_layer(kind);
            /* order: WTE, WPE (l == -1), layers, then LNFW, LNFB (l == layers) */
            if (l == -1 && !(kind == WT_WTE || kind == WT_WPE))
                continue;
            if (l >= 0 && l < cfg->layers && !per)
                continue;
            if (l == cfg->layers && !(kind == WT_LNFW || kind == WT_LNFB))
                continue;
            int r, c;
            wt_kind_shape(cfg, kind, &r, &c);
            size_t got = wt_canon_offset(cfg, kind, per ? l : 0);
            EXPECT(got == off, "canon offset of %s layer %d: %zu, expected %zu",
                   wt_kind_name(kind), l, got, off);
            off += (size_t)r * (size_t)c;
        }
    }
    EXPECT(off == wt_canon_size(cfg), "canon size %zu, expected %zu", wt_canon_size(cfg), off);
    size_t C = (size_t)cfg->channels, V = (size_t)cfg->vocab, T = (size_t)cfg->seq;
    size_t E = (size_t)cfg->experts, Em = E > 0 ? E : 1;
    size_t per_layer = 4 * C + 3 * C * C + 3 * C + C * C + C + E * C +
                       Em * (4 * C * C + 4 * C + 4 * C * C + C);
    size_t P = V * C + T * C + (size_t)cfg->layers * per_layer + 2 * C;
    EXPECT(wt_canon_size(cfg) == P, "P %zu, expected %zu", wt_canon_size(cfg), P);
    if (E == 0)
        EXPECT(P == V * C + T * C + (size_t)cfg->layers * (12 * C * C + 13 * C) + 2 * C,
               "P differs from the GPT-2 formula");
}

/* One rank's layout: structure and slices. */
static void check_rank_layout(const struct wt_config *cfg, const struct wt_mesh *mesh,
                              const struct wt_layout *lay)
{
    int L = cfg->layers, pp = mesh->pp, s = mesh->pp_rank, tp = mesh->tp, tr = mesh->tp_rank;
    int C = cfg->channels;
    int base = L / pp, extra = L % pp;
    int l0 = s * base + (s < extra ? s : extra), n = base + (s < extra);
    EXPECT(lay->l0 == l0 && lay->l1 == l0 + n, "stage %d layers [%d, %d), expected [%d, %d)", s,
           lay->l0, lay->l1, l0, l0 + n);
    EXPECT(lay->has_embed == (s == 0) && lay->has_head == (s == pp - 1), "embed/head flags");
    EXPECT(lay->heads_local == cfg->heads / tp && lay->ffn_local == 4 * C / tp &&
               lay->vocab_local == cfg->vocab / tp && lay->vocab0 == tr * cfg->vocab / tp,
           "local sizes");
    int ends = lay->has_embed || lay->has_head;
    EXPECT((lay->wte_unit >= 0) == ends && (lay->outer_unit >= 0) == ends, "wte/outer units");
    int g_dp = mesh->dp, g_edp = mesh->dp / mesh->ep;

    /* Units back to back, tensors back to back inside, padding right. */
    size_t off = 0;
    for (int u = 0; u < lay->nunits; u++) {
        const struct wt_unit *un = &lay->units[u];
        size_t g = (size_t)(un->group == WT_GROUP_EDP ? g_edp : g_dp);
        EXPECT(un->offset == off, "unit %d offset %zu, expected %zu", u, un->offset, off);
        EXPECT(un->padded % g == 0 && un->padded >= un->count && un->padded - un->count < g,
               "unit %d count %zu padded %zu group %zu", u, un->count, un->padded, g);
        size_t toff = 0;
        for (int i = 0; i < un->ntensors; i++) {
            const struct wt_tensor *t = &lay->tensors[un->first_tensor + i];
            EXPECT(t->unit == u && t->offset == toff, "tensor %s in unit %d at %zu, expected %zu",
                   wt_kind_name(t->kind), u, t->offset, toff);
            size_t rows = 0;
            for (int bl = 0; bl < t->slice.nblocks; bl++)
                rows += (size_t)t->slice.nrows[bl];
            EXPECT(t->count == rows * (size_t)t->slice.ncols, "tensor count");
            EXPECT((un->group == WT_GROUP_EDP) == is_expert_tensor(cfg, t->kind),
                   "tensor %s in a unit of the wrong group", wt_kind_name(t->kind));
            toff += t->count;
        }
        EXPECT(toff == un->count, "unit %d count %zu, tensors %zu", u, un->count, toff);
        off += un->padded;
    }
    EXPECT(off == lay->total, "total %zu, expected %zu", lay->total, off);
    for (int k = 0; k < n; k++) {
        int du = lay->layer_unit[k], eu = lay->layer_expert_unit[k];
        EXPECT(du >= 0 && du < lay->nunits && lay->units[du].layer == l0 + k &&
                   lay->units[du].group == WT_GROUP_DP,
               "dense unit of layer %d", l0 + k);
        if (cfg->experts > 0)
            EXPECT(eu >= 0 && eu < lay->nunits && lay->units[eu].layer == l0 + k &&
                       lay->units[eu].group == WT_GROUP_EDP,
                   "expert unit of layer %d", l0 + k);
        else
            EXPECT(eu == -1, "expert unit without experts");
    }

    /* Slices and flags. */
    for (int i = 0; i < lay->ntensors; i++) {
        const struct wt_tensor *t = &lay->tensors[i];
        const struct wt_slice *sl = &t->slice;
        enum wt_kind k = t->kind;
        int rows, cols;
        wt_kind_shape(cfg, k, &rows, &cols);
        EXPECT(wt_layout_find(lay, k, t->layer) == t, "find %s layer %d", wt_kind_name(k),
               t->layer);
        EXPECT(wt_kind_per_layer(k) ? (t->layer >= lay->l0 && t->layer < lay->l1)
                                    : t->layer == -1,
               "layer of %s", wt_kind_name(k));
        int sliced = 0;
        if (k == WT_QKVW || k == WT_QKVB) {
            EXPECT(sl->nblocks == 3, "qkv blocks");
            for (int b = 0; b < 3; b++)
                EXPECT(sl->row0[b] == b * C + tr * C / tp && sl->nrows[b] == C / tp,
                       "qkv block %d", b);
            EXPECT(sl->col0 == 0 && sl->ncols == cols, "qkv columns");
            sliced = tp > 1;
        } else if (k == WT_ATTPROJW) {
            EXPECT(sl->nblocks == 1 && sl->row0[0] == 0 && sl->nrows[0] == C &&
                       sl->col0 == tr * C / tp && sl->ncols == C / tp,
                   "attprojw slice");
            sliced = tp > 1;
        } else if (is_expert_tensor(cfg, k)) {
            int per = rows / cfg->experts, el = cfg->experts / mesh->ep;
            EXPECT(sl->nblocks == 1 && sl->row0[0] == mesh->ep_rank * el * per &&
                       sl->nrows[0] == el * per && sl->col0 == 0 && sl->ncols == cols,
                   "expert slice of %s", wt_kind_name(k));
            EXPECT(lay->expert0 == mesh->ep_rank * el && lay->experts_local == el,
                   "local experts");
            sliced = 1;
        } else if (k == WT_FCW || k == WT_FCB) {
            EXPECT(sl->nblocks == 1 && sl->row0[0] == tr * 4 * C / tp &&
                       sl->nrows[0] == 4 * C / tp && sl->col0 == 0 && sl->ncols == cols,
                   "fc slice");
            sliced = tp > 1;
        } else if (k == WT_FCPROJW) {
            EXPECT(sl->nblocks == 1 && sl->row0[0] == 0 && sl->nrows[0] == C &&
                       sl->col0 == tr * 4 * C / tp && sl->ncols == 4 * C / tp,
                   "fcproj slice");
            sliced = tp > 1;
        } else if (k == WT_WTE) {
            EXPECT(sl->nblocks == 1 && sl->row0[0] == lay->vocab0 &&
                       sl->nrows[0] == lay->vocab_local && sl->ncols == C,
                   "wte slice");
            sliced = tp > 1;
        } else {
            EXPECT(sl->nblocks == 1 && sl->row0[0] == 0 && sl->nrows[0] == rows &&
                       sl->col0 == 0 && sl->ncols == cols,
                   "%s is whole", wt_kind_name(k));
        }
        if (!is_expert_tensor(cfg, k))
            EXPECT(t->tp_replicated == !sliced, "tp_replicated of %s", wt_kind_name(k));
        EXPECT(t->sp_partial == (mesh->sp && is_sp_kind(k)), "sp_partial of %s",
               wt_kind_name(k));
        int owner = (!t->tp_replicated || tr == 0) && (k != WT_WTE || lay->has_embed);
        EXPECT(t->canon_owner == owner, "canon_owner of %s", wt_kind_name(k));
    }
    if (cfg->experts > 0)
        EXPECT(wt_layout_find(lay, WT_ROUTERW, lay->l0) != NULL, "router present");
    else if (n > 0)
        EXPECT(wt_layout_find(lay, WT_ROUTERW, lay->l0) == NULL, "router absent");
    EXPECT((wt_layout_find(lay, WT_WPE, -1) != NULL) == lay->has_embed, "wpe on the first stage");
    EXPECT((wt_layout_find(lay, WT_LNFW, -1) != NULL) == lay->has_head, "lnf on the last stage");
    EXPECT(wt_layout_find(lay, WT_QKVW, lay->l1) == NULL, "no tensor for a layer elsewhere");
}

/* Every layout of one mesh: coverage and round trips. */
static void check_mesh(const struct wt_config *cfg, int dp, int tp, int pp, int ep, int sp)
{
    size_t P = wt_canon_size(cfg);
    int world = dp * tp * pp;
    struct wt_layout *lays = calloc((size_t)world, sizeof(*lays));
    struct wt_mesh *meshes = calloc((size_t)world, sizeof(*meshes));
    float **bufs = calloc((size_t)world, sizeof(float *));
    float ***units = calloc((size_t)world, sizeof(float **));
    for (int ppr = 0; ppr < pp; ppr++) {
        for (int dpr = 0; dpr < dp; dpr++) {
            for (int tpr = 0; tpr < tp; tpr++) {
                struct wt_mesh mm = fake_mesh(dp, tp, pp, ep, sp, dpr, tpr, ppr);
                meshes[mm.rank] = mm;
                CHECK_OK(wt_layout_init(&lays[mm.rank], cfg, &meshes[mm.rank]));
                check_rank_layout(cfg, &meshes[mm.rank], &lays[mm.rank]);
            }
        }
    }
    /* Coverage per DP replica (non-expert tensors) and per EDP replica (expert tensors). */
    unsigned char *cnt = calloc(P, 1);
    for (int rep = 0; rep < dp; rep++) {
        memset(cnt, 0, P);
        for (int r = 0; r < world; r++) {
            const struct wt_mesh *mm = &meshes[r];
            for (int i = 0; i < lays[r].ntensors; i++) {
                const struct wt_tensor *t = &lays[r].tensors[i];
                int mine = is_expert_tensor(cfg, t->kind) ? mm->edp_rank == rep / ep
                                                          : mm->dp_rank == rep;
                if (!t->canon_owner || !mine)
                    continue;
                int rows, cols;
                wt_kind_shape(cfg, t->kind, &rows, &cols);
                size_t base = wt_canon_offset(cfg, t->kind, t->layer < 0 ? 0 : t->layer);
                for (int b = 0; b < t->slice.nblocks; b++)
                    for (int rr = 0; rr < t->slice.nrows[b]; rr++)
                        for (int c = 0; c < t->slice.ncols; c++)
                            cnt[base + (size_t)(t->slice.row0[b] + rr) * cols + t->slice.col0 +
                                c]++;
            }
        }
        for (size_t i = 0; i < P; i++) {
            if (cnt[i] != 1) {
                EXPECT(0, "dp %d tp %d pp %d ep %d sp %d replica %d: canonical element %zu "
                          "owned %d times",
                       dp, tp, pp, ep, sp, rep, i, cnt[i]);
                break;
            }
        }
    }
    free(cnt);

    /* Round trip: import a random canon into every rank, export the owners of replica 0 (and of
     * the EDP replica 0 for experts) into a NaN-filled canon, which must come back exactly. */
    float *canon = tm_canon_params(cfg, 5, 1.0);
    float *back = malloc(P * sizeof(float));
    for (size_t i = 0; i < P; i++)
        back[i] = NAN;
    for (int r = 0; r < world; r++) {
        const struct wt_layout *lay = &lays[r];
        bufs[r] = calloc(lay->total + 1, sizeof(float));
        units[r] = calloc((size_t)lay->nunits + 1, sizeof(float *));
        for (int u = 0; u < lay->nunits; u++)
            units[r][u] = bufs[r] + lay->units[u].offset;
        wt_layout_import(lay, units[r], canon);
        for (int u = 0; u < lay->nunits; u++)
            for (size_t i = lay->units[u].count; i < lay->units[u].padded; i++)
                EXPECT(units[r][u][i] == 0.0f, "padding of unit %d written by import", u);
        /* Element by element against the slice description. */
        for (int i = 0; i < lay->ntensors; i++) {
            const struct wt_tensor *t = &lay->tensors[i];
            int rows, cols;
            wt_kind_shape(cfg, t->kind, &rows, &cols);
            size_t base = wt_canon_offset(cfg, t->kind, t->layer < 0 ? 0 : t->layer);
            const float *loc = units[r][t->unit] + t->offset;
            size_t j = 0;
            for (int b = 0; b < t->slice.nblocks; b++)
                for (int rr = 0; rr < t->slice.nrows[b]; rr++)
                    for (int c = 0; c < t->slice.ncols; c++, j++)
                        if (loc[j] != canon[base + (size_t)(t->slice.row0[b] + rr) * cols +
                                            t->slice.col0 + c]) {
                            EXPECT(0, "import of %s element %zu", wt_kind_name(t->kind), j);
                            b = t->slice.nblocks;
                            rr = t->slice.nrows[0];
                            break;
                        }
        }
        if (meshes[r].dp_rank == 0) {
            wt_layout_export(lay, units[r], back);
        } else if (meshes[r].edp_rank == 0 && cfg->experts > 0) {
            /* The other EP ranks of EDP replica 0 contribute their experts only. */
            float *tmp = malloc(P * sizeof(float));
            for (size_t i = 0; i < P; i++)
                tmp[i] = NAN;
            wt_layout_export(lay, units[r], tmp);
            /* Only canon_owner tensors are written: non-owned elements stay NaN. */
            for (int i = 0; i < lay->ntensors; i++) {
                const struct wt_tensor *t = &lay->tensors[i];
                if (!is_expert_tensor(cfg, t->kind))
                    continue;
                int rows, cols;
                wt_kind_shape(cfg, t->kind, &rows, &cols);
                size_t base = wt_canon_offset(cfg, t->kind, t->layer);
                size_t first = base + (size_t)t->slice.row0[0] * cols;
                memcpy(back + first, tmp + first, t->count * sizeof(float));
            }
            free(tmp);
        }
    }
    for (size_t i = 0; i < P; i++) {
        if (memcmp(&back[i], &canon[i], sizeof(float)) != 0) {
            EXPECT(0, "dp %d tp %d pp %d ep %d sp %d: round trip differs at %zu", dp, tp, pp, ep,
                   sp, i);
            break;
        }
    }
    /* Export writes owners only: a non-owner rank (tp_rank 1, or the last stage's WTE) leaves
     * the elements it does not own untouched. */
    for (int r = 0; r < world; r++) {
        const struct wt_layout *lay = &lays[r];
        for (size_t i = 0; i < P; i++)
            back[i] = NAN;
        wt_layout_export(lay, units[r], back);
        for (int i = 0; i < lay->ntensors; i++) {
            const struct wt_tensor *t = &lay->tensors[i];
            if (t->canon_owner)
                continue;
            int rows, cols;
            wt_kind_shape(cfg, t->kind, &rows, &cols);
            size_t base = wt_canon_offset(cfg, t->kind, t->layer < 0 ? 0 : t->layer);
            size_t idx = base + (size_t)t->slice.row0[0] * cols + t->slice.col0;
            EXPECT(isnan(back[idx]), "non-owner %s exported", wt_kind_name(t->kind));
        }
    }
    free(back);
    free(canon);
    for (int r = 0; r < world; r++) {
        free(bufs[r]);
        free(units[r]);
        wt_layout_fini(&lays[r]);
    }
    free(bufs);
    free(units);
    free(lays);
    free(meshes);
}

static void check_refused(struct wt_config cfg, int dp, int tp, int pp, int ep, const char *why)
{
    struct wt_mesh mm = fake_mesh(dp, tp, pp, ep, 0, 0, 0, 0);
    struct wt_layout lay;
    memset(&lay, 0, sizeof(lay));
    ncclResult_t r = wt_layout_init(&lay, &cfg, &mm);
    EXPECT(r == ncclInvalidArgument, "%s: got %d, expected ncclInvalidArgument", why, (int)r);
    if (r == ncclSuccess)
        wt_layout_fini(&lay);
}

static void check_init_canon(const struct wt_config *cfg)
{
    size_t P = wt_canon_size(cfg);
    float *a = malloc(P * sizeof(float)), *b = malloc(P * sizeof(float));
    wt_init_canon(cfg, 42, a);
    wt_init_canon(cfg, 42, b);
    EXPECT(memcmp(a, b, P * sizeof(float)) == 0, "wt_init_canon is not deterministic");
    wt_init_canon(cfg, 43, b);
    EXPECT(memcmp(a, b, P * sizeof(float)) != 0, "wt_init_canon ignores the seed");
    for (int l = 0; l < cfg->layers; l++) {
        for (int k = 0; k < WT_KINDS; k++) {
            enum wt_kind kind = (enum wt_kind)k;
            if (!wt_kind_per_layer(kind) && l > 0)
                continue;
            int rows, cols;
            wt_kind_shape(cfg, kind, &rows, &cols);
            size_t n = (size_t)rows * cols;
            const float *p = a + wt_canon_offset(cfg, kind, l);
            int ln = kind == WT_LN1W || kind == WT_LN2W || kind == WT_LNFW;
            int bias = kind == WT_LN1B || kind == WT_LN2B || kind == WT_LNFB ||
                       kind == WT_QKVB || kind == WT_ATTPROJB || kind == WT_FCB ||
                       kind == WT_FCPROJB;
            if (ln || bias) {
                for (size_t i = 0; i < n; i++)
                    EXPECT(p[i] == (ln ? 1.0f : 0.0f), "%s element %zu = %g",
                           wt_kind_name(kind), i, p[i]);
                continue;
            }
            if (n < 256)
                continue;
            double s2 = 0, s1 = 0;
            for (size_t i = 0; i < n; i++) {
                s1 += p[i];
                s2 += (double)p[i] * p[i];
            }
            double sd = sqrt(s2 / n - (s1 / n) * (s1 / n));
            double want = 0.02;
            if (kind == WT_ATTPROJW || kind == WT_FCPROJW)
                want /= sqrt(2.0 * cfg->layers);
            EXPECT(fabs(sd - want) < 0.15 * want, "%s std %.5f, expected %.5f",
                   wt_kind_name(kind), sd, want);
            EXPECT(fabs(s1 / n) < 4.0 * want / sqrt((double)n), "%s mean %.5f",
                   wt_kind_name(kind), s1 / n);
        }
    }
    free(a);
    free(b);
}

int main(void)
{
    struct wt_config dense = {.layers = 4, .channels = 16, .heads = 4, .vocab = 32, .seq = 8};
    struct wt_config odd = {.layers = 5, .channels = 12, .heads = 4, .vocab = 36, .seq = 5};
    struct wt_config moe = dense;
    moe.experts = 4;
    /* Expert units of 318 elements: padding differs between dp 4 and edp 2. */
    struct wt_config moe_odd = {.layers = 3, .channels = 6, .heads = 2, .vocab = 10, .seq = 3,
                                .experts = 2};
    check_canon_order(&dense);
    check_canon_order(&odd);
    check_canon_order(&moe);
    check_canon_order(&moe_odd);
    check_init_canon(&dense);
    check_init_canon(&moe);

    int meshes = 0;
    const int tps[] = {1, 2, 4}, pps[] = {1, 2, 4}, dps[] = {1, 2, 3, 4};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++)
                for (int sp = 0; sp < 2; sp++) {
                    check_mesh(&dense, dps[c], tps[a], pps[b], 1, sp && tps[a] > 1);
                    check_mesh(&odd, dps[c], tps[a], pps[b], 1, sp && tps[a] > 1);
                    meshes += 2;
                }
    for (int b = 0; b < 3; b++)
        for (int c = 0; c < 4; c++)
            for (int ep = 1; ep <= 2; ep++) {
                if (dps[c] % ep != 0)
                    continue;
                check_mesh(&moe, dps[c], 1, pps[b], ep, 0);
                meshes++;
                if (pps[b] <= moe_odd.layers) {
                    check_mesh(&moe_odd, dps[c], 1, pps[b], ep, 0);
                    meshes++;
                }
            }
    /* Uneven stages: 5 layers over 2 and 4 stages (checked inside check_rank_layout). */

    struct wt_config bad = dense;
    bad.heads = 3;
    check_refused(bad, 1, 1, 1, 1, "C % NH");
    check_refused(dense, 1, 8, 1, 1, "NH % tp");
    bad = dense;
    bad.vocab = 30;
    check_refused(bad, 1, 4, 1, 1, "V % tp");
    check_refused(dense, 1, 1, 8, 1, "L < pp");
    check_refused(moe, 1, 2, 1, 1, "experts with tp");
    bad = moe;
    bad.experts = 3;
    check_refused(bad, 2, 1, 1, 2, "E % ep");
    check_refused(dense, 3, 1, 1, 2, "ep does not divide dp");
    bad = dense;
    bad.layers = 0;
    check_refused(bad, 1, 1, 1, 1, "no layers");

    if (failures) {
        fprintf(stderr, "FAIL: %d checks\n", failures);
        return 1;
    }
    printf("PASS: %d meshes\n", meshes);
    return 0;
}
