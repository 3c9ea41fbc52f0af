/*
 * weft-train -- the reference trainer: a small GPT-style model trained with any mix of data
 * (DDP, ZeRO 1/2/3), tensor (+ sequence), pipeline (GPipe, 1F1B) and expert parallelism through
 * the training layer (train.h), checked against a single-rank run of the same model.
 *
 *   weftrun -n 8 weft-train --dp 2 --tp 2 --pp 2 --zero 3 --schedule 1f1b --check ref
 *
 * Checks (world rank 0 runs the single-rank model beside the distributed one):
 *   --check ref       free-running: both start from the same weights and see the same global
 *                     batches; per step the loss difference, the largest gradient and parameter
 *                     differences (tensor named) and PASS/FAIL against the tolerances.
 *   --check lockstep  the same, but the reference takes the distributed parameters and optimizer
 *                     state after every step, so each row measures one step's error.
 *   --golden-out F / --golden-in F   per-step loss, gradient norm and a hash of the canonical
 *                     parameters, written or compared bit for bit (ZeRO stages against each
 *                     other, GPipe against 1F1B, resume against an uninterrupted run).
 * Replicated tensors are always checked bitwise across their group (hash, MIN == MAX).
 *
 * Exit status: 0 all checks passed, 1 a check failed, 2 usage, 3 a communication error.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train.h"

#define EXIT_CHECK_FAILED 1
#define EXIT_USAGE 2
#define EXIT_COMM 3

struct options {
    struct wt_config cfg;
    int dp, tp, pp, sp, ep, zero, microbatches, overlap;
    enum wt_schedule schedule;
    int steps, batch; /* batch: global sequences per step (0: from micro_batch and the layout) */
    int micro_batch;  /* sequences per micro-batch per data-parallel rank (0: default) */
    struct wt_adamw opt;
    uint64_t seed;
    enum { CHECK_NONE, CHECK_REF, CHECK_LOCKSTEP } check;
    double tol_loss, tol_grad, tol_param; /* < 0: default for the check mode */
    const char *golden_out, *golden_in, *dump_dir, *log_path;
    const char *ckpt_dir;
    int ckpt_every, keep, resume;
    int fail_at_step, fail_rank;
    int quiet, memory_table;
};

static void usage(FILE *f)
{
    fprintf(f,
        "usage: weft-train [options]   (under weftrun, mpirun, srun or torchrun)\n"
        " model:      --preset micro|tiny  --layers L --channels C --heads NH --vocab V --seq T\n"
        "             --experts E (mixture of E experts per block, top-1)\n"
        " parallel:   --dp D --tp T --pp P --sp --ep E --zero 0..3 --microbatches M\n"
        "             --schedule gpipe|1f1b --overlap 0|1   (default dp = ranks / (tp*pp))\n"
        " training:   --steps S --micro-batch B (sequences per rank per micro-batch)\n"
        "             --batch G (global sequences per step; default B x dp x microbatches,\n"
        "             B = 8 / (dp x microbatches), at least 1) --lr --wd --clip\n"
        "             --beta1 --beta2 --eps --seed\n"
        " checks:     --check none|ref|lockstep --tol-loss X --tol-grad X --tol-param X\n"
        "             --golden-out FILE --golden-in FILE\n"
        " checkpoint: --ckpt-dir DIR --ckpt-every N --keep K --resume auto|none\n"
        "             --fail-at-step S --fail-rank R (SIGKILL rank R in step S, first attempt)\n"
        " output:     --log FILE.jsonl --dump DIR (PyTorch oracle input) --quiet\n"
        "             --memory-table (ZeRO memory of the 7B / 70B seeds, then exit)\n");
}

/*
 * The global batch follows the layout, as DeepSpeed's train_micro_batch_size_per_gpu does: a
 * micro-batch of B sequences per data-parallel rank, times dp, times the micro-batches. B defaults
 * to 8 / (dp x microbatches), at least 1, so the global batch stays 8 wherever the layout divides
 * it. --batch G is an explicit override and must be such a product. Returns 0, or -1 after a
 * message.
 */
static int resolve_batch(struct options *o)
{
    int per = o->dp * o->microbatches;
    if (o->micro_batch > 0) {
        if (o->batch > 0 && o->batch != o->micro_batch * per) {
            fprintf(stderr, "weft-train: --batch %d differs from --micro-batch %d x dp %d x "
                    "microbatches %d\n", o->batch, o->micro_batch, o->dp, o->microbatches);
            return -1;
        }
        o->batch = o->micro_batch * per;
    } else if (o->batch == 0) {
        o->batch = (8 / per > 0 ? 8 / per : 1) * per;
    }
    if (o->batch % per != 0) {
        fprintf(stderr, "weft-train: --batch %d must be a multiple of dp %d x microbatches %d "
                "(or leave it out: the default follows the layout)\n", o->batch, o->dp,
                o->microbatches);
        return -1;
    }
    o->micro_batch = o->batch / per;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, const char *name)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        fprintf(stderr, "weft-train: %s must be an integer in [%d, %d], got '%s'\n", name, lo, hi,
                s);
        exit(EXIT_USAGE);
    }
    return (int)v;
}

static double parse_double(const char *s, const char *name)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) {
        fprintf(stderr, "weft-train: %s must be a number, got '%s'\n", name, s);
        exit(EXIT_USAGE);
    }
    return v;
}

static void preset(struct wt_config *c, const char *name)
{
    if (strcmp(name, "micro") == 0)
        *c = (struct wt_config){.layers = 4, .channels = 32, .heads = 4, .vocab = 256, .seq = 16};
    else if (strcmp(name, "tiny") == 0)
        *c = (struct wt_config){.layers = 4, .channels = 128, .heads = 4, .vocab = 256, .seq = 64};
    else {
        fprintf(stderr, "weft-train: unknown preset '%s' (micro, tiny)\n", name);
        exit(EXIT_USAGE);
    }
}

static void parse_args(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof(*o));
    preset(&o->cfg, "micro");
    o->dp = 0;
    o->tp = o->pp = o->ep = 1;
    o->microbatches = 1;
    o->overlap = 1;
    o->schedule = WT_SCHED_1F1B;
    o->steps = 20;
    o->batch = 0;
    o->micro_batch = 0;
    o->opt = (struct wt_adamw){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                               .weight_decay = 0.0f, .clip = 0.0f};
    o->seed = 1234;
    o->tol_loss = o->tol_grad = o->tol_param = -1;
    o->resume = 1;
    o->keep = 2;
    o->fail_at_step = o->fail_rank = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define ARG (i + 1 < argc ? argv[++i] : (fprintf(stderr, "weft-train: %s needs a value\n", a), \
                                          exit(EXIT_USAGE), ""))
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--preset")) preset(&o->cfg, ARG);
        else if (!strcmp(a, "--layers")) o->cfg.layers = parse_int(ARG, 1, 1024, a);
        else if (!strcmp(a, "--channels")) o->cfg.channels = parse_int(ARG, 1, 1 << 14, a);
        else if (!strcmp(a, "--heads")) o->cfg.heads = parse_int(ARG, 1, 1024, a);
        else if (!strcmp(a, "--vocab")) o->cfg.vocab = parse_int(ARG, 2, 256, a);
        else if (!strcmp(a, "--seq")) o->cfg.seq = parse_int(ARG, 1, 4096, a);
        else if (!strcmp(a, "--experts")) o->cfg.experts = parse_int(ARG, 0, 1024, a);
        else if (!strcmp(a, "--dp")) o->dp = parse_int(ARG, 1, 4096, a);
        else if (!strcmp(a, "--tp")) o->tp = parse_int(ARG, 1, 4096, a);
        else if (!strcmp(a, "--pp")) o->pp = parse_int(ARG, 1, 4096, a);
        else if (!strcmp(a, "--ep")) o->ep = parse_int(ARG, 1, 4096, a);
        else if (!strcmp(a, "--sp")) o->sp = 1;
        else if (!strcmp(a, "--zero")) o->zero = parse_int(ARG, 0, 3, a);
        else if (!strcmp(a, "--microbatches")) o->microbatches = parse_int(ARG, 1, 4096, a);
        else if (!strcmp(a, "--overlap")) o->overlap = parse_int(ARG, 0, 1, a);
        else if (!strcmp(a, "--schedule")) {
            const char *s = ARG;
            if (!strcmp(s, "gpipe")) o->schedule = WT_SCHED_GPIPE;
            else if (!strcmp(s, "1f1b")) o->schedule = WT_SCHED_1F1B;
            else {
                fprintf(stderr, "weft-train: --schedule gpipe or 1f1b, got '%s'\n", s);
                exit(EXIT_USAGE);
            }
        } else if (!strcmp(a, "--steps")) o->steps = parse_int(ARG, 0, 1 << 30, a);
        else if (!strcmp(a, "--batch")) o->batch = parse_int(ARG, 1, 1 << 20, a);
        else if (!strcmp(a, "--micro-batch")) o->micro_batch = parse_int(ARG, 1, 1 << 20, a);
        else if (!strcmp(a, "--lr")) o->opt.lr = (float)parse_double(ARG, a);
        else if (!strcmp(a, "--wd")) o->opt.weight_decay = (float)parse_double(ARG, a);
        else if (!strcmp(a, "--clip")) o->opt.clip = (float)parse_double(ARG, a);
        else if (!strcmp(a, "--beta1")) o->opt.beta1 = (float)parse_double(ARG, a);
        else if (!strcmp(a, "--beta2")) o->opt.beta2 = (float)parse_double(ARG, a);
        else if (!strcmp(a, "--eps")) o->opt.eps = (float)parse_double(ARG, a);
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)parse_int(ARG, 0, 1 << 30, a);
        else if (!strcmp(a, "--check")) {
            const char *s = ARG;
            if (!strcmp(s, "none")) o->check = CHECK_NONE;
            else if (!strcmp(s, "ref")) o->check = CHECK_REF;
            else if (!strcmp(s, "lockstep")) o->check = CHECK_LOCKSTEP;
            else {
                fprintf(stderr, "weft-train: --check none, ref or lockstep, got '%s'\n", s);
                exit(EXIT_USAGE);
            }
        } else if (!strcmp(a, "--tol-loss")) o->tol_loss = parse_double(ARG, a);
        else if (!strcmp(a, "--tol-grad")) o->tol_grad = parse_double(ARG, a);
        else if (!strcmp(a, "--tol-param")) o->tol_param = parse_double(ARG, a);
        else if (!strcmp(a, "--golden-out")) o->golden_out = ARG;
        else if (!strcmp(a, "--golden-in")) o->golden_in = ARG;
        else if (!strcmp(a, "--dump")) o->dump_dir = ARG;
        else if (!strcmp(a, "--log")) o->log_path = ARG;
        else if (!strcmp(a, "--ckpt-dir")) o->ckpt_dir = ARG;
        else if (!strcmp(a, "--ckpt-every")) o->ckpt_every = parse_int(ARG, 0, 1 << 30, a);
        else if (!strcmp(a, "--keep")) o->keep = parse_int(ARG, 1, 1 << 20, a);
        else if (!strcmp(a, "--resume")) {
            const char *s = ARG;
            if (!strcmp(s, "auto")) o->resume = 1;
            else if (!strcmp(s, "none")) o->resume = 0;
            else {
                fprintf(stderr, "weft-train: --resume auto or none, got '%s'\n", s);
                exit(EXIT_USAGE);
            }
        } else if (!strcmp(a, "--fail-at-step")) o->fail_at_step = parse_int(ARG, 0, 1 << 30, a);
        else if (!strcmp(a, "--fail-rank")) o->fail_rank = parse_int(ARG, 0, 1 << 20, a);
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (!strcmp(a, "--memory-table")) o->memory_table = 1;
        else {
            fprintf(stderr, "weft-train: unknown option '%s'\n", a);
            usage(stderr);
            exit(EXIT_USAGE);
        }
#undef ARG
    }
}

/* ------------------------------------------------------------------------------------------
 * Memory: the ZeRO paper's model-state formula (bytes per rank) for stage z, psi parameters,
 * n data-parallel ranks, w/g/o bytes per parameter of weights, gradients, optimizer state:
 *   z0 (w+g+o) psi;  z1 (w+g) psi + o psi/n;  z2 w psi + (g+o) psi/n;  z3 (w+g+o) psi/n
 * ---------------------------------------------------------------------------------------- */
static double zero_bytes(int z, double psi, int n, double w, double g, double o)
{
    switch (z) {
    case 0: return (w + g + o) * psi;
    case 1: return (w + g) * psi + o * psi / n;
    case 2: return w * psi + (g + o) * psi / n;
    default: return (w + g + o) * psi / n;
    }
}

static void print_memory_table(void)
{
    printf("# Model-state memory per rank (ZeRO paper), mixed-precision AdamW: 16-bit weights\n"
           "# (w = 2 B/param) and gradients (g = 2), fp32 master weights, m and v (o = K = 12);\n"
           "#   stage 0: (w+g+o) psi     stage 1: (w+g) psi + o psi/N\n"
           "#   stage 2: w psi + (g+o) psi/N     stage 3: (w+g+o) psi/N\n"
           "# N = 8 data-parallel ranks; decimal GB; activations, buffers and fragmentation "
           "excluded.\n");
    printf("%-6s %12s %12s %12s %12s\n", "model", "ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3");
    const double sizes[] = {7e9, 70e9};
    const char *names[] = {"7B", "70B"};
    for (int i = 0; i < 2; i++) {
        printf("%-6s", names[i]);
        for (int z = 0; z <= 3; z++)
            printf(" %12.1f", zero_bytes(z, sizes[i], 8, 2, 2, 12) / 1e9);
        printf("\n");
    }
    printf("# 7B alone: weights 14 GB, gradients 14 GB, AdamW state 84 GB (K = 12; 56 GB for "
           "fp32 m, v\n# without a master copy, 28 GB for bf16 m, v), 112 GB in all.\n");
}

/* ------------------------------------------------------------------------------------------
 * Data: micro-batch mb of this rank is sequences [mb*G/m + dp_rank*b, +b) of the step's global
 * batch, so the reference's micro-batch mb (all of [mb*G/m, (mb+1)*G/m)) is the union over DP.
 * ---------------------------------------------------------------------------------------- */
struct data_ctx {
    uint64_t seed;
    int step, global, microbatches, first, b, T;
    int fail; /* SIGKILL this rank when it reaches the last micro-batch */
};

static void data_fill(int mb, int *tokens, int *targets, void *arg)
{
    struct data_ctx *d = arg;
    if (d->fail && mb == d->microbatches - 1) {
        fprintf(stderr, "weft-train[%d]: fault injection: killing myself in step %d\n",
                wt_log_rank, d->step);
        fflush(stderr);
        raise(SIGKILL);
    }
    int base = mb * (d->global / d->microbatches) + d->first;
    for (int j = 0; j < d->b; j++)
        wt_data_sequence(d->seed, d->step, base + j, d->T, tokens + (size_t)j * d->T,
                         targets + (size_t)j * d->T);
}

/* ------------------------------------------------------------------------------------------
 * Comparisons of canonical tensors: the largest difference, the tensor it is in, and the largest
 * magnitude of the reference (for relative tolerances).
 * ---------------------------------------------------------------------------------------- */
struct diff {
    double max_abs, ref_max;
    char where[64];
};

static void canon_name(const struct wt_config *cfg, size_t idx, char *out, size_t len)
{
    for (int k = 0; k < WT_KINDS; k++) {
        int layers = wt_kind_per_layer((enum wt_kind)k) ? cfg->layers : 1;
        for (int l = 0; l < layers; l++) {
            int rows, cols;
            wt_kind_shape(cfg, (enum wt_kind)k, &rows, &cols);
            size_t off = wt_canon_offset(cfg, (enum wt_kind)k, wt_kind_per_layer(k) ? l : -1);
            size_t n = (size_t)rows * cols;
            if (n && idx >= off && idx < off + n) {
                if (wt_kind_per_layer((enum wt_kind)k))
                    snprintf(out, len, "h%d.%s[%zu]", l, wt_kind_name((enum wt_kind)k), idx - off);
                else
                    snprintf(out, len, "%s[%zu]", wt_kind_name((enum wt_kind)k), idx - off);
                return;
            }
        }
    }
    snprintf(out, len, "[%zu]", idx);
}

static struct diff compare(const struct wt_config *cfg, const float *a, const float *ref, size_t n)
{
    struct diff d = {0, 0, ""};
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)ref[i]);
        if (!(e <= d.max_abs)) { /* NaN counts as worst */
            d.max_abs = e;
            worst = i;
        }
        if (fabs(ref[i]) > d.ref_max)
            d.ref_max = fabs(ref[i]);
    }
    canon_name(cfg, worst, d.where, sizeof(d.where));
    return d;
}

static uint64_t hash_bytes(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ull; /* FNV-1a */
    return h;
}

/* ------------------------------------------------------------------------------------------
 * The trainer
 * ---------------------------------------------------------------------------------------- */
struct trainer {
    struct options o;
    int rank, nranks, restart;
    ncclComm_t world;
    struct wt_mesh mesh;
    struct wt_model model;
    struct wt_dp *dp;
    int b; /* sequences per micro-batch per rank */
    size_t P;
    /* single-rank reference (rank 0 with --check) */
    struct wt_mesh ref_mesh;
    struct wt_model ref_model;
    struct wt_dp *ref_dp;
    float *canon_a, *canon_b, *canon_m, *canon_v; /* rank 0 scratch, P each */
    FILE *log, *golden_out, *golden_in;
    int failed;
    double worst_loss, worst_grad, worst_param;
    double tok_s_sum, bubble_sum, step_sum;
    int timed_steps;
};

static void die_comm(struct trainer *t, const char *what)
{
    fprintf(stderr, "weft-train[%d]: %s failed: %s; aborting\n", t->rank, what,
            ncclGetLastError(t->world));
    fflush(stderr);
    if (t->world)
        ncclCommAbort(t->world);
    _exit(EXIT_COMM);
}

#define TRY(t, call)                                                                               \
    do {                                                                                           \
        if ((call) != ncclSuccess)                                                                 \
            die_comm(t, #call);                                                                    \
    } while (0)

static double default_tol(const struct options *o, int which)
{
    /* Gates from trainer.md 1.10, widened for TP / EP / DP >= 3 summation orders; see
     * docs/training.md. */
    int lock = o->check == CHECK_LOCKSTEP;
    switch (which) {
    case 0: return o->tol_loss >= 0 ? o->tol_loss : 5e-5;
    case 1: return o->tol_grad >= 0 ? o->tol_grad : (lock ? 1e-5 : 1e-4);
    default: return o->tol_param >= 0 ? o->tol_param : (lock ? 0.1 * o->opt.lr : 2.0 * o->opt.lr);
    }
}

static void setup_reference(struct trainer *t, const float *params, const float *m,
                            const float *v)
{
    const struct options *o = &t->o;
    wt_mem_mute = 1;
    wt_mesh_single(&t->ref_mesh);
    TRY(t, wt_model_init(&t->ref_model, &o->cfg, &t->ref_mesh, o->batch / o->microbatches, 1));
    t->ref_model.loss_scale = (float)(1.0 / ((double)o->batch * o->cfg.seq));
    TRY(t, wt_dp_create(&t->ref_model, 0, 0, &t->ref_dp));
    TRY(t, wt_dp_load(t->ref_dp, params, m, v));
    wt_mem_mute = 0;
}

/* One step of the reference; returns its loss, leaves canonical grads in canon_b's place given. */
static double reference_step(struct trainer *t, int step, float *grads_canon, float *params_canon)
{
    const struct options *o = &t->o;
    struct data_ctx d = {o->seed, step, o->batch, o->microbatches, 0, o->batch / o->microbatches,
                         o->cfg.seq, 0};
    double loss = 0, norm = 0;
    struct wt_pp_stats st;
    wt_mem_mute = 1;
    TRY(t, wt_dp_step_begin(t->ref_dp));
    TRY(t, wt_pp_run(&t->ref_model, t->ref_dp, WT_SCHED_1F1B, o->microbatches, data_fill, &d,
                     &loss, &st));
    TRY(t, wt_dp_reduce_finish(t->ref_dp));
    TRY(t, wt_dp_grad_norm(t->ref_dp, &norm));
    TRY(t, wt_dp_gather_canon(t->ref_dp, WT_STATE_GRADS, grads_canon));
    TRY(t, wt_dp_optimizer_step(t->ref_dp, &o->opt, step + 1, norm));
    TRY(t, wt_dp_gather_canon(t->ref_dp, WT_STATE_PARAMS, params_canon));
    wt_mem_mute = 0;
    return loss;
}

/* Replicated tensors must be bit-identical across their group: full parameters across DP (ZeRO
 * 0-2, whose parameters are whole after the step) and the TP-replicated tensors across TP. */
static int check_replicas(struct trainer *t)
{
    const struct wt_layout *lay = &t->model.lay;
    if (t->o.zero == 3)
        return 1; /* parameters are shards between steps */
    uint64_t h_dp = 1469598103934665603ull, h_tp = h_dp;
    for (int i = 0; i < lay->ntensors; i++) {
        const struct wt_tensor *ts = &lay->tensors[i];
        const float *p = t->model.param_units[ts->unit];
        p += ts->offset;
        if (lay->units[ts->unit].group == WT_GROUP_DP)
            h_dp = hash_bytes(p, ts->count * sizeof(float), h_dp);
        if (ts->tp_replicated)
            h_tp = hash_bytes(p, ts->count * sizeof(float), h_tp);
    }
    int ok = 1;
    struct { ncclComm_t comm; uint64_t h; const char *name; } groups[] = {
        {t->mesh.dp_comm, h_dp, "data-parallel replicas"},
        {t->mesh.tp_comm, h_tp, "TP-replicated tensors"}};
    for (int g = 0; g < 2; g++) {
        uint64_t lo, hi;
        TRY(t, ncclAllReduce(&groups[g].h, &lo, 1, ncclUint64, ncclMin, groups[g].comm, NULL));
        TRY(t, ncclAllReduce(&groups[g].h, &hi, 1, ncclUint64, ncclMax, groups[g].comm, NULL));
        if (lo != hi) {
            fprintf(stderr, "weft-train[%d]: FAIL %s differ (hash min %016" PRIx64 " max %016"
                    PRIx64 ")\n", t->rank, groups[g].name, lo, hi);
            ok = 0;
        }
    }
    return ok;
}

static void write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "weft-train: cannot write %s: %s\n", path, strerror(errno));
        exit(EXIT_USAGE);
    }
}

static void dump_begin(struct trainer *t, const float *params)
{
    const struct options *o = &t->o;
    mkdir(o->dump_dir, 0777);
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.txt", o->dump_dir);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "weft-train: cannot write %s: %s\n", path, strerror(errno));
        exit(EXIT_USAGE);
    }
    fprintf(f, "layers=%d\nchannels=%d\nheads=%d\nvocab=%d\nseq=%d\nexperts=%d\nbatch=%d\n"
            "steps=%d\nlr=%.9g\nbeta1=%.9g\nbeta2=%.9g\neps=%.9g\nweight_decay=%.9g\n",
            o->cfg.layers, o->cfg.channels, o->cfg.heads, o->cfg.vocab, o->cfg.seq,
            o->cfg.experts, o->batch, o->steps, o->opt.lr, o->opt.beta1, o->opt.beta2, o->opt.eps,
            o->opt.weight_decay);
    fclose(f);
    write_file(o->dump_dir, "params0.bin", params, t->P * sizeof(float));
    size_t n = (size_t)o->batch * o->cfg.seq;
    int *tok = malloc(2 * n * sizeof(int) * (size_t)(o->steps ? o->steps : 1));
    for (int s = 0; s < o->steps; s++) {
        int *tk = tok + (size_t)s * 2 * n, *tg = tk + n;
        for (int j = 0; j < o->batch; j++)
            wt_data_sequence(o->seed, s, j, o->cfg.seq, tk + (size_t)j * o->cfg.seq,
                             tg + (size_t)j * o->cfg.seq);
    }
    write_file(o->dump_dir, "tokens.bin", tok, 2 * n * sizeof(int) * (size_t)o->steps);
    free(tok);
    snprintf(path, sizeof(path), "%s/losses.txt", o->dump_dir);
    f = fopen(path, "w"); /* truncate; lines appended per step */
    if (f)
        fclose(f);
}

static void dump_loss(struct trainer *t, int step, double loss)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/losses.txt", t->o.dump_dir);
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%d %.9g\n", step, loss);
        fclose(f);
    }
}

static void checkpoint(struct trainer *t, int step_done)
{
    const struct options *o = &t->o;
    float *p = t->canon_a, *m = t->canon_m, *v = t->canon_v;
    TRY(t, wt_dp_gather_canon(t->dp, WT_STATE_PARAMS, p));
    TRY(t, wt_dp_gather_canon(t->dp, WT_STATE_ADAM_M, m));
    TRY(t, wt_dp_gather_canon(t->dp, WT_STATE_ADAM_V, v));
    ncclResult_t res = ncclSuccess;
    if (t->rank == 0) {
        char desc[128];
        snprintf(desc, sizeof(desc), "dp=%d tp=%d pp=%d ep=%d sp=%d zero=%d microbatches=%d",
                 t->mesh.dp, o->tp, o->pp, o->ep, o->sp, o->zero, o->microbatches);
        res = wt_ckpt_write(o->ckpt_dir, step_done, &o->cfg, desc, p, m, v);
        if (res == ncclSuccess)
            wt_ckpt_prune(o->ckpt_dir, o->keep);
    }
    /* Everyone learns whether rank 0 managed; a failed write is fatal for the job. */
    int bad = res != ncclSuccess, any = 0;
    TRY(t, ncclAllReduce(&bad, &any, 1, ncclInt32, ncclMax, t->world, NULL));
    if (any) {
        fprintf(stderr, "weft-train[%d]: checkpoint of step %d failed\n", t->rank, step_done);
        exit(EXIT_COMM);
    }
    if (t->rank == 0 && !o->quiet)
        printf("checkpoint step %d written to %s\n", step_done, o->ckpt_dir);
}

static int run_step(struct trainer *t, int step)
{
    const struct options *o = &t->o;
    const struct wt_mesh *ms = &t->mesh;
    struct data_ctx d = {o->seed, step, o->batch, o->microbatches, ms->dp_rank * t->b, t->b,
                         o->cfg.seq,
                         step == o->fail_at_step && t->rank == o->fail_rank && t->restart == 0};
    struct wt_comm_stats c0 = wt_comm;
    double t0 = wt_now(), loss_local = 0, loss = 0, norm = 0;
    struct wt_pp_stats st = {0, 0};

    TRY(t, wt_dp_step_begin(t->dp));
    TRY(t, wt_pp_run(&t->model, t->dp, o->schedule, o->microbatches, data_fill, &d, &loss_local,
                     &st));
    TRY(t, wt_dp_reduce_finish(t->dp));
    TRY(t, wt_dp_grad_norm(t->dp, &norm));
    if (ms->tp_rank != 0)
        loss_local = 0; /* every TP rank computed the same loss */
    TRY(t, ncclAllReduce(&loss_local, &loss, 1, ncclFloat64, ncclSum, t->world, NULL));

    int checking = o->check != CHECK_NONE;
    int want_grads = checking || (o->dump_dir && step == 0);
    if (want_grads)
        TRY(t, wt_dp_gather_canon(t->dp, WT_STATE_GRADS, t->canon_a));
    TRY(t, wt_dp_optimizer_step(t->dp, &o->opt, step + 1, norm));
    double dt = wt_now() - t0;
    int ok = check_replicas(t);

    int need_params = checking || o->golden_in || o->golden_out;
    if (need_params)
        TRY(t, wt_dp_gather_canon(t->dp, WT_STATE_PARAMS, t->canon_b));
    if (o->check == CHECK_LOCKSTEP) {
        TRY(t, wt_dp_gather_canon(t->dp, WT_STATE_ADAM_M, t->canon_m));
        TRY(t, wt_dp_gather_canon(t->dp, WT_STATE_ADAM_V, t->canon_v));
    }

    double tok_s = (double)o->batch * o->cfg.seq / dt;
    if (step > 0 || o->steps == 1) {
        t->tok_s_sum += tok_s;
        t->bubble_sum += st.wait_seconds;
        t->step_sum += st.step_seconds;
        t->timed_steps++;
    }
    double comm_s = 0;
    uint64_t comm_bytes = 0;
    for (int k = 0; k < WT_COLL_KINDS; k++) {
        comm_s += wt_comm.seconds[k] - c0.seconds[k];
        comm_bytes += wt_comm.bytes[k] - c0.bytes[k];
    }
    comm_s += wt_comm.sync_seconds - c0.sync_seconds;

    if (t->rank == 0) {
        char check_txt[256] = "";
        if (checking) {
            float *ref_grads = malloc(t->P * sizeof(float));
            float *ref_params = malloc(t->P * sizeof(float));
            double ref_loss = reference_step(t, step, ref_grads, ref_params);
            struct diff dg = compare(&o->cfg, t->canon_a, ref_grads, t->P);
            struct diff dp = compare(&o->cfg, t->canon_b, ref_params, t->P);
            double dl = fabs(loss - ref_loss);
            double tol_l = default_tol(o, 0), tol_g = default_tol(o, 1) * (1 + dg.ref_max),
                   tol_p = default_tol(o, 2);
            int pass = dl <= tol_l && dg.max_abs <= tol_g && dp.max_abs <= tol_p;
            snprintf(check_txt, sizeof(check_txt),
                     " | ref %.6f dloss %.2e grad %.2e (%s) param %.2e (%s) %s", ref_loss, dl,
                     dg.max_abs, dg.where, dp.max_abs, dp.where, pass ? "PASS" : "FAIL");
            if (dl > t->worst_loss) t->worst_loss = dl;
            if (dg.max_abs > t->worst_grad) t->worst_grad = dg.max_abs;
            if (dp.max_abs > t->worst_param) t->worst_param = dp.max_abs;
            ok &= pass;
            if (o->check == CHECK_LOCKSTEP) {
                wt_mem_mute = 1;
                TRY(t, wt_dp_load(t->ref_dp, t->canon_b, t->canon_m, t->canon_v));
                wt_mem_mute = 0;
            }
            free(ref_grads);
            free(ref_params);
        }
        uint64_t phash = need_params ? hash_bytes(t->canon_b, t->P * sizeof(float), 1469598103934665603ull) : 0;
        if (o->golden_out)
            fprintf(t->golden_out, "%d %a %a %016" PRIx64 "\n", step, loss, norm, phash);
        if (o->golden_in) {
            int gs;
            double gl, gn;
            uint64_t gh;
            if (fscanf(t->golden_in, "%d %la %la %" SCNx64, &gs, &gl, &gn, &gh) != 4 ||
                gs != step) {
                fprintf(stderr, "weft-train: golden file has no line for step %d\n", step);
                ok = 0;
            } else if (gl != loss || gn != norm || gh != phash) {
                snprintf(check_txt + strlen(check_txt), sizeof(check_txt) - strlen(check_txt),
                         " | golden FAIL (loss %s, norm %s, params %s)",
                         gl == loss ? "same" : "differs", gn == norm ? "same" : "differs",
                         gh == phash ? "same" : "differ");
                ok = 0;
            } else {
                snprintf(check_txt + strlen(check_txt), sizeof(check_txt) - strlen(check_txt),
                         " | golden bitwise PASS");
            }
        }
        if (!o->quiet)
            printf("step %4d loss %.6f norm %.4f %.1f ms %.0f tok/s comm %.1f ms %.2f MB%s\n",
                   step, loss, norm, dt * 1e3, tok_s, comm_s * 1e3, comm_bytes / 1e6, check_txt);
        if (t->log)
            fprintf(t->log, "{\"step\":%d,\"loss\":%.9g,\"grad_norm\":%.9g,\"ms\":%.3f,"
                    "\"tok_s\":%.1f,\"comm_ms\":%.3f,\"comm_bytes\":%" PRIu64
                    ",\"bubble_s\":%.6f,\"pass\":%s}\n", step, loss, norm, dt * 1e3, tok_s,
                    comm_s * 1e3, comm_bytes, st.wait_seconds, ok ? "true" : "false");
        if (o->dump_dir) {
            dump_loss(t, step, loss);
            if (step == 0)
                write_file(o->dump_dir, "grads0.bin", t->canon_a, t->P * sizeof(float));
        }
    }
    return ok;
}

/* Memory per rank (peaks per category) next to the ZeRO formula for this rank's stage. */
static void report_memory(struct trainer *t)
{
    const struct options *o = &t->o;
    size_t psi = 0;
    for (int i = 0; i < t->model.lay.ntensors; i++)
        psi += t->model.lay.tensors[i].count;
    double row[8] = {
        (double)wt_mem.peak[WT_MEM_PARAMS], (double)wt_mem.peak[WT_MEM_GRADS],
        (double)wt_mem.peak[WT_MEM_OPTIM], (double)wt_mem.peak[WT_MEM_ACTS],
        (double)wt_mem.peak[WT_MEM_COMM],
        zero_bytes(o->zero, (double)psi, t->mesh.dp, 4, 4, 8), (double)psi, 0};
    double *all = t->rank == 0 ? malloc(sizeof(row) * (size_t)t->nranks) : NULL;
    double *tmp = malloc(sizeof(row) * (size_t)t->nranks);
    TRY(t, ncclAllGather(row, tmp, 8, ncclFloat64, t->world, NULL));
    if (t->rank == 0) {
        memcpy(all, tmp, sizeof(row) * (size_t)t->nranks);
        printf("# memory per rank, peak KiB (fp32: formula w=4 g=4 o=8 B/param over this "
               "rank's psi, ZeRO-%d, N=%d)\n", o->zero, t->mesh.dp);
        printf("%5s %9s %9s %9s %9s %9s %9s | %9s %9s %6s\n", "rank", "psi", "params", "grads",
               "optim", "acts", "comm", "states", "formula", "ratio");
        for (int r = 0; r < t->nranks; r++) {
            double *x = all + 8 * r;
            double states = x[0] + x[1] + x[2];
            printf("%5d %9.0f %9.1f %9.1f %9.1f %9.1f %9.1f | %9.1f %9.1f %6.3f\n", r, x[6],
                   x[0] / 1024, x[1] / 1024, x[2] / 1024, x[3] / 1024, x[4] / 1024,
                   states / 1024, x[5] / 1024, states / x[5]);
        }
        free(all);
    }
    free(tmp);
}

static void report_comm(struct trainer *t)
{
    if (t->rank != 0)
        return;
    printf("# communication of rank 0 (all steps): calls, MB, seconds in the call\n");
    for (int k = 0; k < WT_COLL_KINDS; k++)
        if (wt_comm.calls[k])
            printf("#   %-14s %8" PRIu64 " %10.3f %8.3f\n", wt_coll_name(k), wt_comm.calls[k],
                   wt_comm.bytes[k] / 1e6, wt_comm.seconds[k]);
    printf("#   %-14s %8s %10s %8.3f\n", "stream wait", "", "", wt_comm.sync_seconds);
}

int main(int argc, char **argv)
{
    struct trainer tr;
    memset(&tr, 0, sizeof(tr));
    struct trainer *t = &tr;
    struct options *o = &t->o;
    parse_args(argc, argv, o);
    if (o->memory_table) {
        print_memory_table();
        return 0;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *rs = getenv("WEFT_RESTART");
    t->restart = rs ? atoi(rs) : 0;

    ncclUniqueId id;
    int local;
    TRY(t, weftLaunchInfo(&t->rank, &t->nranks, &local, &id));
    wt_log_rank = t->rank;
    if (o->dp == 0)
        o->dp = t->nranks / (o->tp * o->pp);
    if (o->dp < 1 || o->dp * o->tp * o->pp != t->nranks) {
        fprintf(stderr, "weft-train: dp %d x tp %d x pp %d must equal the %d ranks\n", o->dp,
                o->tp, o->pp, t->nranks);
        return EXIT_USAGE;
    }
    if (resolve_batch(o) != 0)
        return EXIT_USAGE;
    t->b = o->batch / (o->dp * o->microbatches);
    TRY(t, ncclCommInitRank(&t->world, t->nranks, id, t->rank));
    if (wt_mesh_init(&t->mesh, t->world, o->dp, o->tp, o->pp, o->ep, o->sp) != ncclSuccess)
        return EXIT_USAGE;
    int slots = wt_schedule_slots(o->schedule, t->mesh.pp_rank, o->pp, o->microbatches);
    if (wt_model_init(&t->model, &o->cfg, &t->mesh, t->b, slots) != ncclSuccess)
        return EXIT_USAGE;
    t->model.loss_scale = (float)(1.0 / ((double)o->batch * o->cfg.seq));
    TRY(t, wt_dp_create(&t->model, o->zero, o->overlap, &t->dp));

    t->P = wt_canon_size(&o->cfg);
    t->canon_a = malloc(t->P * sizeof(float));
    t->canon_b = malloc(t->P * sizeof(float));
    t->canon_m = calloc(t->P, sizeof(float));
    t->canon_v = calloc(t->P, sizeof(float));
    if (!t->canon_a || !t->canon_b || !t->canon_m || !t->canon_v) {
        fprintf(stderr, "weft-train: out of memory\n");
        return EXIT_COMM;
    }

    /* Start: a checkpoint (any layout wrote it) or the canonical initial weights. */
    int start = 0, have_state = 0;
    if (o->ckpt_dir && o->resume) {
        mkdir(o->ckpt_dir, 0777);
        int latest = wt_ckpt_latest(o->ckpt_dir);
        if (latest >= 0) {
            TRY(t, wt_ckpt_read(o->ckpt_dir, latest, &o->cfg, t->canon_a, t->canon_m,
                                t->canon_v));
            start = latest;
            have_state = 1;
            if (t->rank == 0)
                printf("resuming from checkpoint step %d in %s (restart %d)\n", latest,
                       o->ckpt_dir, t->restart);
        }
    }
    if (!have_state)
        wt_init_canon(&o->cfg, o->seed, t->canon_a);
    TRY(t, wt_dp_load(t->dp, t->canon_a, have_state ? t->canon_m : NULL,
                      have_state ? t->canon_v : NULL));
    if (t->rank == 0) {
        if (o->check != CHECK_NONE)
            setup_reference(t, t->canon_a, have_state ? t->canon_m : NULL,
                            have_state ? t->canon_v : NULL);
        if (o->dump_dir)
            dump_begin(t, t->canon_a);
        if (o->log_path && !(t->log = fopen(o->log_path, "a")))
            fprintf(stderr, "weft-train: cannot open %s: %s\n", o->log_path, strerror(errno));
        if (o->golden_out && !(t->golden_out = fopen(o->golden_out, start ? "a" : "w"))) {
            fprintf(stderr, "weft-train: cannot write %s: %s\n", o->golden_out, strerror(errno));
            return EXIT_USAGE;
        }
        if (o->golden_in) {
            if (!(t->golden_in = fopen(o->golden_in, "r"))) {
                fprintf(stderr, "weft-train: cannot read %s: %s\n", o->golden_in,
                        strerror(errno));
                return EXIT_USAGE;
            }
            for (int s = 0; s < start; s++) /* skip the steps before the resume point */
                if (fscanf(t->golden_in, "%*d %*s %*s %*s") == EOF)
                    break;
        }
        size_t psi = wt_canon_size(&o->cfg);
        printf("weft-train: %d ranks dp %d tp %d pp %d ep %d sp %d zero %d microbatches %d "
               "schedule %s | L %d C %d NH %d V %d T %d E %d: %zu params | batch %d (micro-batch %d x "
               "dp %d x microbatches %d) x %d tokens"
               " | check %s\n", t->nranks, t->mesh.dp, o->tp, o->pp, o->ep, o->sp, o->zero,
               o->microbatches, o->schedule == WT_SCHED_GPIPE ? "gpipe" : "1f1b", o->cfg.layers,
               o->cfg.channels, o->cfg.heads, o->cfg.vocab, o->cfg.seq, o->cfg.experts, psi,
               o->batch, o->micro_batch, t->mesh.dp, o->microbatches, o->cfg.seq,
               o->check == CHECK_REF ? "ref" : o->check == CHECK_LOCKSTEP ? "lockstep" : "none");
    }

    int ok = 1;
    for (int s = start; s < o->steps; s++) {
        ok &= run_step(t, s);
        if (o->ckpt_dir && o->ckpt_every > 0 && (s + 1) % o->ckpt_every == 0)
            checkpoint(t, s + 1);
    }

    report_memory(t);
    report_comm(t);
    if (t->rank == 0) {
        if (t->timed_steps) {
            double bubble = t->step_sum > 0 ? t->bubble_sum / t->step_sum : 0;
            printf("# throughput %.0f tok/s (mean over %d steps, first excluded)",
                   t->tok_s_sum / t->timed_steps, t->timed_steps);
            if (o->pp > 1)
                printf("; rank 0 pipeline wait %.3f of step time, (p-1)/(m+p-1) = %.3f, "
                       "wait/busy %.3f vs (p-1)/m = %.3f", bubble,
                       (double)(o->pp - 1) / (o->microbatches + o->pp - 1),
                       bubble < 1 ? bubble / (1 - bubble) : 0,
                       (double)(o->pp - 1) / o->microbatches);
            printf("\n");
        }
        if (o->check != CHECK_NONE)
            printf("# worst: dloss %.3e grad %.3e param %.3e (tolerances loss %.1e grad %.1e x "
                   "(1+max|g|) param %.1e)\n", t->worst_loss, t->worst_grad, t->worst_param,
                   default_tol(o, 0), default_tol(o, 1), default_tol(o, 2));
    }
    /* Everybody agrees on the verdict. */
    int bad = !ok, any = 0;
    TRY(t, ncclAllReduce(&bad, &any, 1, ncclInt32, ncclMax, t->world, NULL));
    if (t->rank == 0)
        printf("%s\n", any ? "FAIL" : "PASS");
    if (t->log)
        fclose(t->log);
    if (t->golden_out)
        fclose(t->golden_out);
    if (t->golden_in)
        fclose(t->golden_in);
    wt_dp_destroy(t->dp);
    wt_model_fini(&t->model);
    if (t->ref_dp) {
        wt_mem_mute = 1;
        wt_dp_destroy(t->ref_dp);
        wt_model_fini(&t->ref_model);
    }
    wt_mesh_fini(&t->mesh);
    ncclCommDestroy(t->world);
    free(t->canon_a);
    free(t->canon_b);
    free(t->canon_m);
    free(t->canon_v);
    return any ? EXIT_CHECK_FAILED : 0;
}
