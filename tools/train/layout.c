/*
 * layout.c -- the canonical (layout-independent) order of the model's tensors, the local tensor
 * table of one rank (pipeline stage, TP slice, local experts) grouped into padded units, the
 * copies between the two, and the canonical initialisation.
 *
 * Nothing here communicates, so a layout can be built for any rank of any mesh from its
 * coordinates alone (the tests fill struct wt_mesh by hand).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static const char *const kind_names[WT_KINDS] = {
    "wte",  "wpe",  "ln1w",  "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb", "ln2w",
    "ln2b", "routerw", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw",     "lnfb"};

int wt_kind_per_layer(enum wt_kind kind)
{
    return kind >= WT_LN1W && kind <= WT_FCPROJB;
}

const char *wt_kind_name(enum wt_kind kind)
{
    return (unsigned)kind < WT_KINDS ? kind_names[kind] : "?";
}

void wt_kind_shape(const struct wt_config *cfg, enum wt_kind kind, int *rows, int *cols)
{
    int C = cfg->channels, E = cfg->experts > 0 ? cfg->experts : 1;
    int r = C, c = 1;
    switch (kind) {
    case WT_WTE: r = cfg->vocab; c = C; break;
    case WT_WPE: r = cfg->seq; c = C; break;
    case WT_QKVW: r = 3 * C; c = C; break;
    case WT_QKVB: r = 3 * C; break;
    case WT_ATTPROJW: c = C; break;
    case WT_ROUTERW: r = cfg->experts > 0 ? cfg->experts : 0; c = C; break;
    case WT_FCW: r = E * 4 * C; c = C; break;
    case WT_FCB: r = E * 4 * C; break;
    case WT_FCPROJW: r = E * C; c = 4 * C; break;
    case WT_FCPROJB: r = E * C; break;
    default: break; /* LayerNorms and the C-sized biases */
    }
    *rows = r;
    *cols = c;
}

static size_t kind_elems(const struct wt_config *cfg, enum wt_kind kind)
{
    int r, c;
    wt_kind_shape(cfg, kind, &r, &c);
    return (size_t)r * (size_t)c;
}

static size_t layer_elems(const struct wt_config *cfg)
{
    size_t n = 0;
    for (int k = WT_LN1W; k <= WT_FCPROJB; k++)
        n += kind_elems(cfg, (enum wt_kind)k);
    return n;
}

size_t wt_canon_offset(const struct wt_config *cfg, enum wt_kind kind, int layer)
{
    size_t head = kind_elems(cfg, WT_WTE) + kind_elems(cfg, WT_WPE);
    switch (kind) {
    case WT_WTE: return 0;
    case WT_WPE: return kind_elems(cfg, WT_WTE);
    case WT_LNFW: return head + (size_t)cfg->layers * layer_elems(cfg);
    case WT_LNFB: return head + (size_t)cfg->layers * layer_elems(cfg) + (size_t)cfg->channels;
    default: break;
    }
    size_t off = head + (size_t)layer * layer_elems(cfg);
    for (int k = WT_LN1W; k < (int)kind; k++)
        off += kind_elems(cfg, (enum wt_kind)k);
    return off;
}

size_t wt_canon_size(const struct wt_config *cfg)
{
    return wt_canon_offset(cfg, WT_LNFB, 0) + (size_t)cfg->channels;
}

/* ---------------------------------------------------------------------------------------- */

static ncclResult_t check_config(const struct wt_config *cfg, const struct wt_mesh *mesh)
{
    int L = cfg->layers, C = cfg->channels, NH = cfg->heads, V = cfg->vocab, E = cfg->experts;
    int tp = mesh->tp, pp = mesh->pp, dp = mesh->dp, ep = mesh->ep;
    if (L < 1 || C < 1 || NH < 1 || V < 1 || cfg->seq < 1 || E < 0) {
        WT_ERR("bad model config: layers %d channels %d heads %d vocab %d seq %d experts %d", L,
               C, NH, V, cfg->seq, E);
        return ncclInvalidArgument;
    }
    if (tp < 1 || pp < 1 || dp < 1 || ep < 1 || dp % ep != 0) {
        WT_ERR("bad mesh: dp %d tp %d pp %d ep %d (ep must divide dp)", dp, tp, pp, ep);
        return ncclInvalidArgument;
    }
    if (C % NH != 0) {
        WT_ERR("channels %d must be a multiple of heads %d", C, NH);
        return ncclInvalidArgument;
    }
    if (NH % tp != 0 || V % tp != 0 || (4 * C) % tp != 0) {
        WT_ERR("tp %d must divide heads %d, vocab %d and 4*channels %d", tp, NH, V, 4 * C);
        return ncclInvalidArgument;
    }
    if (L < pp) {
        WT_ERR("%d layers cannot fill %d pipeline stages", L, pp);
        return ncclInvalidArgument;
    }
    if (E > 0 && tp > 1) {
        WT_ERR("experts (%d) with tensor parallelism (tp %d) are not supported", E, tp);
        return ncclInvalidArgument;
    }
    if (E > 0 && E % ep != 0) {
        WT_ERR("ep %d must divide the number of experts %d", ep, E);
        return ncclInvalidArgument;
    }
    int coords[] = {mesh->tp_rank, mesh->pp_rank, mesh->dp_rank};
    int sizes[] = {tp, pp, dp};
    for (int i = 0; i < 3; i++) {
        if (coords[i] < 0 || coords[i] >= sizes[i]) {
            WT_ERR("mesh coordinate %d out of range [0, %d)", coords[i], sizes[i]);
            return ncclInvalidArgument;
        }
    }
    return ncclSuccess;
}

/* Builder state: tensors are appended to the unit opened last. */
struct builder {
    struct wt_layout *lay;
    const struct wt_mesh *mesh;
    int max_tensors, max_units;
};

static void open_unit(struct builder *b, enum wt_group group, int layer)
{
    struct wt_layout *lay = b->lay;
    if (lay->nunits >= b->max_units)
        abort(); /* the table was sized for every case above */
    struct wt_unit *u = &lay->units[lay->nunits++];
    memset(u, 0, sizeof(*u));
    u->group = group;
    u->layer = layer;
    u->first_tensor = lay->ntensors;
}

/* Appends (kind, layer) with the slice to the open unit. repl: same values on every TP rank. */
static void add_tensor(struct builder *b, enum wt_kind kind, int layer, const struct wt_slice *s,
                       int repl, int sp_partial, int owner)
{
    struct wt_layout *lay = b->lay;
    int ui = lay->nunits - 1;
    if (lay->ntensors >= b->max_tensors)
        abort(); /* the table was sized for every case above */
    struct wt_unit *u = &lay->units[ui];
    struct wt_tensor *t = &lay->tensors[lay->ntensors++];
    size_t rows = 0;
    for (int i = 0; i < s->nblocks; i++)
        rows += (size_t)s->nrows[i];
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->layer = layer;
    t->unit = ui;
    t->offset = u->count;
    t->count = rows * (size_t)s->ncols;
    t->slice = *s;
    t->tp_replicated = repl;
    t->sp_partial = repl && sp_partial && b->mesh->sp;
    t->canon_owner = owner && (!repl || b->mesh->tp_rank == 0);
    u->count += t->count;
    u->ntensors++;
}

static struct wt_slice slice_rows(int row0, int nrows, int col0, int ncols)
{
    struct wt_slice s;
    memset(&s, 0, sizeof(s));
    s.nblocks = 1;
    s.row0[0] = row0;
    s.nrows[0] = nrows;
    s.col0 = col0;
    s.ncols = ncols;
    return s;
}

/* The whole canonical tensor. */
static void add_full(struct builder *b, enum wt_kind kind, int layer, int sp_partial)
{
    int r, c;
    wt_kind_shape(&b->lay->cfg, kind, &r, &c);
    struct wt_slice s = slice_rows(0, r, 0, c);
    add_tensor(b, kind, layer, &s, 1, sp_partial, 1);
}

static void close_unit(struct builder *b, int group_size)
{
    struct wt_layout *lay = b->lay;
    struct wt_unit *u = &lay->units[lay->nunits - 1];
    size_t g = (size_t)group_size;
    u->padded = (u->count + g - 1) / g * g;
    u->offset = lay->total;
    lay->total += u->padded;
}

static void add_dense_layer(struct builder *b, int l)
{
    const struct wt_config *cfg = &b->lay->cfg;
    const struct wt_mesh *mesh = b->mesh;
    int C = cfg->channels, tp = mesh->tp, tr = mesh->tp_rank;
    int cl = C / tp, fl = 4 * C / tp;
    struct wt_slice s;

    open_unit(b, WT_GROUP_DP, l);
    add_full(b, WT_LN1W, l, 1);
    add_full(b, WT_LN1B, l, 1);
    /* Column-parallel QKV: this rank's heads in each of the Q, K and V blocks. */
    memset(&s, 0, sizeof(s));
    s.nblocks = 3;
    for (int k = 0; k < 3; k++) {
        s.row0[k] = k * C + tr * cl;
        s.nrows[k] = cl;
    }
    s.ncols = C;
    add_tensor(b, WT_QKVW, l, &s, tp == 1, 0, 1);
    s.ncols = 1;
    add_tensor(b, WT_QKVB, l, &s, tp == 1, 0, 1);
    /* Row-parallel projection: the input columns of this rank's heads. */
    s = slice_rows(0, C, tr * cl, cl);
    add_tensor(b, WT_ATTPROJW, l, &s, tp == 1, 0, 1);
    add_full(b, WT_ATTPROJB, l, 1);
    add_full(b, WT_LN2W, l, 1);
    add_full(b, WT_LN2B, l, 1);
    if (cfg->experts > 0) {
        add_full(b, WT_ROUTERW, l, 0);
    } else {
        s = slice_rows(tr * fl, fl, 0, C);
        add_tensor(b, WT_FCW, l, &s, tp == 1, 0, 1);
        s = slice_rows(tr * fl, fl, 0, 1);
        add_tensor(b, WT_FCB, l, &s, tp == 1, 0, 1);
        s = slice_rows(0, C, tr * fl, fl);
        add_tensor(b, WT_FCPROJW, l, &s, tp == 1, 0, 1);
        add_full(b, WT_FCPROJB, l, 1);
    }
    close_unit(b, mesh->dp);

    if (cfg->experts > 0) {
        /* tp == 1 here (checked), so experts are sliced only by EP. */
        int e0 = b->lay->expert0, el = b->lay->experts_local;
        open_unit(b, WT_GROUP_EDP, l);
        s = slice_rows(e0 * 4 * C, el * 4 * C, 0, C);
        add_tensor(b, WT_FCW, l, &s, 0, 0, 1);
        s = slice_rows(e0 * 4 * C, el * 4 * C, 0, 1);
        add_tensor(b, WT_FCB, l, &s, 0, 0, 1);
        s = slice_rows(e0 * C, el * C, 0, 4 * C);
        add_tensor(b, WT_FCPROJW, l, &s, 0, 0, 1);
        s = slice_rows(e0 * C, el * C, 0, 1);
        add_tensor(b, WT_FCPROJB, l, &s, 0, 0, 1);
        close_unit(b, mesh->dp / mesh->ep);
    }
}

ncclResult_t wt_layout_init(struct wt_layout *lay, const struct wt_config *cfg,
                            const struct wt_mesh *mesh)
{
    ncclResult_t res = check_config(cfg, mesh);
    if (res != ncclSuccess)
        return res;

    struct wt_layout l;
    memset(&l, 0, sizeof(l));
    l.cfg = *cfg;
    int L = cfg->layers, pp = mesh->pp, s = mesh->pp_rank, tp = mesh->tp;
    /* Layers as even as possible; the first L % pp stages get one more. */
    int base = L / pp, extra = L % pp;
    l.l0 = s * base + (s < extra ? s : extra);
    l.l1 = l.l0 + base + (s < extra ? 1 : 0);
    l.has_embed = s == 0;
    l.has_head = s == pp - 1;
    l.heads_local = cfg->heads / tp;
    l.ffn_local = 4 * cfg->channels / tp;
    l.vocab_local = cfg->vocab / tp;
    l.vocab0 = mesh->tp_rank * l.vocab_local;
    l.experts_local = cfg->experts > 0 ? cfg->experts / mesh->ep : 0;
    l.expert0 = cfg->experts > 0 ? mesh->ep_rank * l.experts_local : 0;
    if (cfg->experts > 0 && (mesh->ep_rank < 0 || mesh->ep_rank >= mesh->ep)) {
        WT_ERR("ep rank %d out of range [0, %d)", mesh->ep_rank, mesh->ep);
        return ncclInvalidArgument;
    }
    l.wte_unit = l.outer_unit = -1;

    int nl = l.l1 - l.l0;
    struct builder b = {&l, mesh, 4 + 13 * nl, 2 + 2 * nl};
    l.tensors = calloc((size_t)b.max_tensors, sizeof(*l.tensors));
    l.units = calloc((size_t)b.max_units, sizeof(*l.units));
    l.layer_unit = calloc((size_t)nl, sizeof(int));
    l.layer_expert_unit = calloc((size_t)nl, sizeof(int));
    if (l.tensors == NULL || l.units == NULL || l.layer_unit == NULL ||
        l.layer_expert_unit == NULL) {
        WT_ERR("out of memory for the layout table");
        wt_layout_fini(&l);
        return ncclSystemError;
    }

    if (l.has_embed || l.has_head) {
        /* WTE is exported from the first stage; the last stage holds the tied copy. */
        struct wt_slice ws = slice_rows(l.vocab0, l.vocab_local, 0, cfg->channels);
        l.wte_unit = l.nunits;
        open_unit(&b, WT_GROUP_DP, -1);
        add_tensor(&b, WT_WTE, -1, &ws, tp == 1, 0, l.has_embed);
        close_unit(&b, mesh->dp);

        l.outer_unit = l.nunits;
        open_unit(&b, WT_GROUP_DP, -1);
        if (l.has_embed)
            add_full(&b, WT_WPE, -1, 1);
        if (l.has_head) {
            add_full(&b, WT_LNFW, -1, 1);
            add_full(&b, WT_LNFB, -1, 1);
        }
        close_unit(&b, mesh->dp);
    }
    for (int k = 0; k < nl; k++) {
        l.layer_unit[k] = l.nunits;
        l.layer_expert_unit[k] = cfg->experts > 0 ? l.nunits + 1 : -1;
        add_dense_layer(&b, l.l0 + k);
    }
    *lay = l;
    return ncclSuccess;
}

void wt_layout_fini(struct wt_layout *lay)
{
    free(lay->tensors);
    free(lay->units);
    free(lay->layer_unit);
    free(lay->layer_expert_unit);
    lay->tensors = NULL;
    lay->units = NULL;
    lay->layer_unit = lay->layer_expert_unit = NULL;
    lay->ntensors = lay->nunits = 0;
}

const struct wt_tensor *wt_layout_find(const struct wt_layout *lay, enum wt_kind kind, int layer)
{
    if (!wt_kind_per_layer(kind))
        layer = -1;
    for (int i = 0; i < lay->ntensors; i++) {
        const struct wt_tensor *t = &lay->tensors[i];
        if (t->kind == kind && t->layer == layer)
            return t;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */

/* Copies one tensor between its local elements and the canonical buffer (dir 0: to canon). */
static void copy_tensor(const struct wt_config *cfg, const struct wt_tensor *t, float *local,
                        float *canon, int to_local)
{
    int rows, cols;
    wt_kind_shape(cfg, t->kind, &rows, &cols);
    float *base = canon + wt_canon_offset(cfg, t->kind, t->layer < 0 ? 0 : t->layer);
    const struct wt_slice *s = &t->slice;
    size_t n = (size_t)s->ncols;
    for (int bl = 0; bl < s->nblocks; bl++) {
        for (int r = 0; r < s->nrows[bl]; r++) {
            float *c = base + (size_t)(s->row0[bl] + r) * (size_t)cols + (size_t)s->col0;
            if (to_local)
                memcpy(local, c, n * sizeof(float));
            else
                memcpy(c, local, n * sizeof(float));
            local += n;
        }
    }
}

void wt_layout_export(const struct wt_layout *lay, float *const *units, float *canon)
{
    for (int i = 0; i < lay->ntensors; i++) {
        const struct wt_tensor *t = &lay->tensors[i];
        if (t->canon_owner)
            copy_tensor(&lay->cfg, t, units[t->unit] + t->offset, canon, 0);
    }
}

void wt_layout_import(const struct wt_layout *lay, float *const *units, const float *canon)
{
    for (int i = 0; i < lay->ntensors; i++) {
        const struct wt_tensor *t = &lay->tensors[i];
        copy_tensor(&lay->cfg, t, units[t->unit] + t->offset, (float *)canon, 1);
    }
}

/* ---------------------------------------------------------------------------------------- */

/* splitmix64: a portable generator whose output depends only on the seed. */
static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1], 53 bits. */
static double uniform01(uint64_t *state)
{
    return ((double)(splitmix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

void wt_init_canon(const struct wt_config *cfg, uint64_t seed, float *canon)
{
    const double two_pi = 6.283185307179586476925286766559;
    double resid_scale = 1.0 / sqrt(2.0 * (double)cfg->layers);
    for (int layer = 0; layer < cfg->layers; layer++) {
        for (int k = 0; k < WT_KINDS; k++) {
            enum wt_kind kind = (enum wt_kind)k;
            if (!wt_kind_per_layer(kind) && layer > 0)
                continue; /* model-wide kinds once */
            int lay = wt_kind_per_layer(kind) ? layer : -1;
            size_t n = kind_elems(cfg, kind);
            float *p = canon + wt_canon_offset(cfg, kind, lay < 0 ? 0 : lay);
            int is_ln = kind == WT_LN1W || kind == WT_LN2W || kind == WT_LNFW;
            int is_bias = kind == WT_LN1B || kind == WT_LN2B || kind == WT_LNFB ||
                          kind == WT_QKVB || kind == WT_ATTPROJB || kind == WT_FCB ||
                          kind == WT_FCPROJB;
            if (is_ln || is_bias) {
                for (size_t i = 0; i < n; i++)
                    p[i] = is_ln ? 1.0f : 0.0f;
                continue;
            }
            double std = 0.02;
            if (kind == WT_ATTPROJW || kind == WT_FCPROJW)
                std *= resid_scale;
            /* One stream per (kind, layer), so a tensor's values depend on the seed, its
             * name and its shape only. */
            uint64_t st = seed ^ (0x5851f42d4c957f2dULL * (uint64_t)(k + 1)) ^
                          (0x14057b7ef767814fULL * (uint64_t)(lay + 2));
            splitmix64(&st);
            for (size_t i = 0; i < n; i += 2) {
                double u1 = uniform01(&st), u2 = uniform01(&st);
                double r = sqrt(-2.0 * log(u1));
                p[i] = (float)(std * r * cos(two_pi * u2));
                if (i + 1 < n)
                    p[i + 1] = (float)(std * r * sin(two_pi * u2));
            }
        }
    }
}
