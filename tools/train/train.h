/*
 * train.h -- Weft's training layer: a process mesh, a GPT-style model split by tensor, sequence,
 * pipeline and expert parallelism, data parallelism with DDP buckets and ZeRO stages 1-3, AdamW,
 * pipeline schedules, a canonical (layout-independent) view of the model for checks and
 * checkpoints, and the counters the reference trainer prints.
 *
 * It calls only include/nccl.h and include/weft.h (host streams), so the collectives it issues are
 * exactly what a user's training framework would issue. Everything is fp32 on the CPU.
 *
 * Names: functions wt_<object>_<verb>, types struct wt_<object>. Functions that can fail return
 * ncclResult_t and print the cause on stderr with the rank (the layer has no logger of its own).
 *
 * Conventions used throughout (see ../shared/reference/trainer.md for where they come from):
 *   - rank = tp_rank + tp * (dp_rank + dp * pp_rank): TP fastest, PP slowest.
 *   - EP is folded into DP: within a DP group, ep_rank = dp_rank % ep and the expert-data-parallel
 *     (EDP) index is dp_rank / ep. Experts are owned by an EP rank and replicated across EDP.
 *   - Every reduction is a SUM. The 1 / (tokens in the global batch) factor is folded into the
 *     loss seed, so after the data-parallel SUM the gradient is the gradient of the global mean
 *     loss and no collective ever averages.
 *   - Parameters live in units: contiguous, padded ranges of one flat buffer. A unit is what DDP
 *     all-reduces as one bucket and what ZeRO reduce-scatters / all-gathers as one call.
 */
#ifndef WT_TRAIN_H_
#define WT_TRAIN_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "weft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------
 * Errors: print "weft-train[rank]: file:line: message" on stderr and return the result.
 * ---------------------------------------------------------------------------------------- */
extern int wt_log_rank; /* set by wt_mesh_init; -1 before */
void wt_errorf(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define WT_ERR(...) wt_errorf(__FILE__, __LINE__, __VA_ARGS__)
#define WT_CHECK(call)                                                                             \
    do {                                                                                           \
        ncclResult_t wt_res_ = (call);                                                             \
        if (wt_res_ != ncclSuccess) {                                                              \
            WT_ERR("%s failed: %s (%s)", #call, ncclGetErrorString(wt_res_),                     \
                   ncclGetLastError(NULL));                                                        \
            return wt_res_;                                                                        \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------------------------------------
 * Memory accounting: every buffer the layer allocates is counted in one category, so the
 * trainer can print bytes per rank next to the ZeRO formula. Peak is tracked per category.
 * ---------------------------------------------------------------------------------------- */
enum wt_mem_kind {
    WT_MEM_PARAMS,  /* parameters held by this rank (full, or shard + gathered units) */
    WT_MEM_GRADS,   /* gradients (full, or shard + live unit buffers) */
    WT_MEM_OPTIM,   /* AdamW m and v */
    WT_MEM_ACTS,    /* activations kept for backward, all slots */
    WT_MEM_COMM,    /* staging for collectives and p2p */
    WT_MEM_KINDS
};
struct wt_mem_stats {
    size_t now[WT_MEM_KINDS];
    size_t peak[WT_MEM_KINDS];
};
extern struct wt_mem_stats wt_mem;
/* While nonzero, wt_alloc/wt_free do not count (the trainer mutes the single-rank reference). */
extern int wt_mem_mute;
/* Zeroed memory, counted; never returns NULL (aborts the process when out of memory). */
void *wt_alloc(enum wt_mem_kind kind, size_t bytes);
void wt_free(enum wt_mem_kind kind, void *p, size_t bytes);
const char *wt_mem_name(enum wt_mem_kind kind);

/* ------------------------------------------------------------------------------------------
 * Communication counters. Every collective the layer issues goes through these wrappers, which
 * count calls, bytes (of the full buffer, nccl-tests style) and the time the caller spent in the
 * call (for calls on a stream, the time to enqueue; the stream wait is counted in
 * wt_comm_sync).
 * ---------------------------------------------------------------------------------------- */
enum wt_coll {
    WT_COLL_ALLREDUCE,
    WT_COLL_REDUCESCATTER,
    WT_COLL_ALLGATHER,
    WT_COLL_BROADCAST,
    WT_COLL_REDUCE,
    WT_COLL_SENDRECV,   /* bytes sent */
    WT_COLL_ALLTOALL,   /* bytes sent, dispatch + combine */
    WT_COLL_KINDS
};
struct wt_comm_stats {
    uint64_t calls[WT_COLL_KINDS];
    uint64_t bytes[WT_COLL_KINDS];
    double seconds[WT_COLL_KINDS];
    double sync_seconds; /* time spent waiting for the data-parallel stream */
};
extern struct wt_comm_stats wt_comm;
const char *wt_coll_name(enum wt_coll coll);

/* Thin wrappers: same arguments as the NCCL call (float buffers, ncclSum unless op is given),
 * counted. stream NULL = complete on return. */
ncclResult_t wt_allreduce(const float *send, float *recv, size_t count, ncclRedOp_t op,
                          ncclComm_t comm, weftStream_t stream);
ncclResult_t wt_reducescatter(const float *send, float *recv, size_t recvcount, ncclComm_t comm,
                              weftStream_t stream);
ncclResult_t wt_allgather(const float *send, float *recv, size_t sendcount, ncclComm_t comm,
                          weftStream_t stream);
ncclResult_t wt_broadcast(const void *send, void *recv, size_t count, ncclDataType_t type,
                          int root, ncclComm_t comm, weftStream_t stream);
ncclResult_t wt_reduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                       ncclRedOp_t op, int root, ncclComm_t comm, weftStream_t stream);
/* Grouped point-to-point: call between ncclGroupStart/ncclGroupEnd (or alone). */
ncclResult_t wt_send(const void *buf, size_t bytes, int peer, ncclComm_t comm, enum wt_coll kind);
ncclResult_t wt_recv(void *buf, size_t bytes, int peer, ncclComm_t comm);
ncclResult_t wt_stream_sync(weftStream_t stream); /* counted in sync_seconds */
double wt_now(void); /* monotonic seconds */

/* ------------------------------------------------------------------------------------------
 * Process mesh
 * ---------------------------------------------------------------------------------------- */
struct wt_mesh {
    int world, rank;
    int dp, tp, pp, ep;             /* ep divides dp; world = dp * tp * pp */
    int dp_rank, tp_rank, pp_rank, ep_rank, edp_rank;
    int edp;                        /* dp / ep */
    int sp;                         /* sequence parallelism inside the TP group */
    ncclComm_t world_comm;          /* owned by the caller */
    ncclComm_t tp_comm, dp_comm, pp_comm, ep_comm, edp_comm;
    ncclComm_t tie_comm;            /* {first, last} pipeline stage; NULL when pp == 1 or this
                                     * rank is on a middle stage */
};
/* Splits world into the groups (collective over world). dp*tp*pp must equal the world size and
 * ep must divide dp: otherwise ncclInvalidArgument with a message. */
ncclResult_t wt_mesh_init(struct wt_mesh *mesh, ncclComm_t world, int dp, int tp, int pp, int ep,
                          int sp);
void wt_mesh_fini(struct wt_mesh *mesh);
/* A mesh of one rank with no communicators (the single-rank reference model). */
void wt_mesh_single(struct wt_mesh *mesh);
/* Sizes and coordinates of world rank `rank` in a dp x tp x pp mesh (ep, sp as above), with no
 * communicators: what wt_mesh_init computes before it splits (tests build layouts from it). */
void wt_mesh_coords(struct wt_mesh *mesh, int dp, int tp, int pp, int ep, int sp, int rank);

/* ------------------------------------------------------------------------------------------
 * Model configuration and canonical layout
 *
 * GPT-2 in llm.c's layout, written fresh: tied token embedding wte (V, C), position embedding
 * wpe (T, C), L blocks of (ln1, causal self-attention with fused qkv, ln2, MLP with tanh-GeLU),
 * final LayerNorm, logits = x . wte^T. Linear weights are stored (out, in).
 * With experts E > 0 every block's MLP is a mixture of E experts with a top-1 router
 * (router (E, C); gate = softmax probability of the chosen expert; ties go to the lowest index;
 * no capacity limit, no dropped tokens); expert e's fc / fcproj weights are rows
 * [e*4C, (e+1)*4C) of FCW / FCB and rows [e*C, (e+1)*C) of FCPROJW / FCPROJB.
 * ---------------------------------------------------------------------------------------- */
struct wt_config {
    int layers;   /* L */
    int channels; /* C */
    int heads;    /* NH; C % NH == 0 */
    int vocab;    /* V (256: bytes) */
    int seq;      /* T */
    int experts;  /* 0: dense MLP; else E experts per block */
};

/* Canonical tensor kinds. Per-layer kinds exist once per block; the rest once per model. */
enum wt_kind {
    WT_WTE,      /* (V, C)              */
    WT_WPE,      /* (T, C)              */
    WT_LN1W,     /* (C)        per layer */
    WT_LN1B,     /* (C)                  */
    WT_QKVW,     /* (3C, C)              */
    WT_QKVB,     /* (3C)                 */
    WT_ATTPROJW, /* (C, C)               */
    WT_ATTPROJB, /* (C)                  */
    WT_LN2W,     /* (C)                  */
    WT_LN2B,     /* (C)                  */
    WT_ROUTERW,  /* (E, C), only with experts */
    WT_FCW,      /* (max(E,1)*4C, C)     */
    WT_FCB,      /* (max(E,1)*4C)        */
    WT_FCPROJW,  /* (max(E,1)*C, 4C)     */
    WT_FCPROJB,  /* (max(E,1)*C)         */
    WT_LNFW,     /* (C)                  */
    WT_LNFB,     /* (C)                  */
    WT_KINDS
};
int wt_kind_per_layer(enum wt_kind kind);
const char *wt_kind_name(enum wt_kind kind);
/* Canonical shape of a kind: rows x cols (1-D tensors have cols 1). 0 rows: absent (ROUTERW
 * without experts). */
void wt_kind_shape(const struct wt_config *cfg, enum wt_kind kind, int *rows, int *cols);
/* Canonical order: WTE, WPE, then for each layer the per-layer kinds in enum order, then LNFW,
 * LNFB. wt_canon_offset gives the first element of (kind, layer) in that order; wt_canon_size the
 * total element count P. */
size_t wt_canon_offset(const struct wt_config *cfg, enum wt_kind kind, int layer);
size_t wt_canon_size(const struct wt_config *cfg);

/* ------------------------------------------------------------------------------------------
 * Local tensors and units
 *
 * A rank holds, for its pipeline stage, slices of the canonical tensors. A slice is up to three
 * blocks of canonical rows (the strided Q/K/V split) times one range of columns; elements are
 * stored row-major in block order. Units group tensors that are communicated together:
 *   - the "wte" unit (first and last stage): WTE alone (vocab-sliced under TP), so that its
 *     layout, and so its ZeRO shards, are the same on both stages for the tied all-reduce;
 *   - the "outer" unit (first and last stage): WPE on the first stage, LNFW/LNFB on the last
 *     stage; with pp == 1 all three;
 *   - one dense unit per local layer (LN1W .. LN2B, ROUTERW, and the MLP when dense);
 *   - with experts, one expert unit per local layer (FCW .. FCPROJB of the local experts),
 *     reduced over the EDP group instead of DP.
 * A unit's length is padded to a multiple of its group size (dp, or edp for expert units) so
 * reduce-scatter and all-gather apply to it directly; the padding stays zero.
 * ---------------------------------------------------------------------------------------- */
struct wt_slice {
    int nblocks;
    int row0[3], nrows[3];
    int col0, ncols;
};
struct wt_tensor {
    enum wt_kind kind;
    int layer;               /* -1 for model-wide kinds */
    int unit;                /* index into wt_layout.units */
    size_t offset;           /* first element inside its unit */
    size_t count;            /* elements */
    struct wt_slice slice;   /* where they sit in the canonical tensor */
    int canon_owner;         /* 1 if this rank is the one rank of its DP (EDP for experts) group
                              * whose copy of these elements is exported: tp_rank 0 for
                              * TP-replicated tensors, the first stage for WTE; the DP side
                              * (dp_rank 0, or the shard owner under ZeRO) is wt_dp's business */
    int tp_replicated;       /* same values on every TP rank */
    int sp_partial;          /* with SP: grad is a partial sum over this rank's tokens and needs
                              * an all-reduce over TP (LayerNorms, row-parallel biases, WPE) */
};
enum wt_group { WT_GROUP_DP, WT_GROUP_EDP };
struct wt_unit {
    enum wt_group group;     /* communicator that DDP / ZeRO use for this unit */
    int layer;               /* -1 for the outer unit */
    size_t count;            /* elements in use */
    size_t padded;           /* count rounded up to a multiple of the group size */
    size_t offset;           /* first element in the flat buffers (units are back to back) */
    int first_tensor, ntensors;
};
struct wt_layout {
    struct wt_config cfg;
    int l0, l1;              /* local layers [l0, l1) */
    int has_embed, has_head; /* first / last pipeline stage */
    int heads_local, ffn_local, vocab0, vocab_local, experts_local, expert0;
    int ntensors, nunits;
    struct wt_tensor *tensors;
    struct wt_unit *units;
    size_t total;            /* sum of padded unit lengths = flat buffer length */
    int wte_unit;            /* -1 on middle stages */
    int outer_unit;          /* -1 on middle stages */
    int *layer_unit;         /* [l - l0]: dense unit of local layer l */
    int *layer_expert_unit;  /* [l - l0]: expert unit, -1 without experts */
};
ncclResult_t wt_layout_init(struct wt_layout *lay, const struct wt_config *cfg,
                            const struct wt_mesh *mesh);
void wt_layout_fini(struct wt_layout *lay);
/* The local tensor of (kind, layer), or NULL when this rank holds none. */
const struct wt_tensor *wt_layout_find(const struct wt_layout *lay, enum wt_kind kind, int layer);

/* Canonical <-> local copies. `units` are per-unit base pointers (full unit buffers). Export
 * writes this rank's canon_owner tensors into canon (length wt_canon_size) and leaves the rest
 * untouched; import fills every local tensor from canon. */
void wt_layout_export(const struct wt_layout *lay, float *const *units, float *canon);
void wt_layout_import(const struct wt_layout *lay, float *const *units, const float *canon);

/* Canonical initial parameters from a seed: normal(0, 0.02) weights, residual projections
 * (ATTPROJW, FCPROJW) scaled by 1/sqrt(2L), LayerNorm weights 1, biases 0, router normal(0,
 * 0.02). The same values on every rank and for every layout. */
void wt_init_canon(const struct wt_config *cfg, uint64_t seed, float *canon);

/* ------------------------------------------------------------------------------------------
 * Model (one pipeline stage of one rank)
 *
 * Parameters and gradients are reached through per-unit base pointers (param_units[u],
 * grad_units[u]) so ZeRO-3 can map a unit to a gathered buffer only while it is live. The model
 * resolves tensor pointers from them each time it starts on a unit, after calling the hook.
 * ---------------------------------------------------------------------------------------- */
enum wt_phase { WT_FORWARD, WT_BACKWARD };
struct wt_hooks {
    void *ctx;
    /* Before the model reads unit u's parameters in a phase (ZeRO-3: gather, prefetch the next;
     * backward: also make grad_units[u] a zeroed or accumulating buffer). */
    ncclResult_t (*unit_begin)(void *ctx, int unit, enum wt_phase phase);
    /* After unit u's gradients for this micro-batch are complete (DDP / ZeRO reduce). Called
     * once per unit per backward, in completion order: on a last stage with pp > 1 the wte and
     * outer units right after the head; then layers l1-1 .. l0 (expert unit, then dense unit);
     * then, on the first stage, the outer and wte units after the embedding. */
    ncclResult_t (*unit_grads_done)(void *ctx, int unit);
};
struct wt_model {
    struct wt_layout lay;
    const struct wt_mesh *mesh;
    int batch;               /* sequences per micro-batch on this rank (b) */
    int nslots;              /* activation slots (micro-batches in flight) */
    float **param_units;     /* [nunits] */
    float **grad_units;      /* [nunits]; gradients accumulate with += */
    struct wt_hooks hooks;   /* NULL function pointers: nothing to do */
    float loss_scale;        /* seed of d(loss)/d(token loss): 1 / tokens in the global batch */
    void *priv;              /* activations and scratch, owned by model.c */
};
/* Allocates activations for nslots micro-batches of `batch` sequences; param/grad unit pointers
 * start NULL (the data-parallel engine sets them). */
ncclResult_t wt_model_init(struct wt_model *m, const struct wt_config *cfg,
                           const struct wt_mesh *mesh, int batch, int nslots);
void wt_model_fini(struct wt_model *m);
/*
 * Forward of one micro-batch through this stage, keeping activations in `slot`.
 *   tokens, targets: (batch, T) byte ids; read on the first / last stage respectively.
 *   x_in:  (batch*T, C) residual stream from the previous stage (NULL on the first stage);
 *          with SP the stage boundary carries this TP rank's (batch*T/tp, C) token shard.
 *   x_out: same shape, for the next stage (NULL on the last stage).
 *   loss_p: on the last stage, sum over the micro-batch's tokens of the token losses times
 *          loss_scale (so summing over micro-batches and DP ranks gives the global mean loss).
 */
ncclResult_t wt_model_forward(struct wt_model *m, int slot, const int *tokens, const int *targets,
                              const float *x_in, float *x_out, double *loss_p);
/* Backward of the micro-batch in `slot`: dx_out is d(loss)/d(x_out) from the next stage (NULL on
 * the last stage), dx_in receives d(loss)/d(x_in) (NULL on the first stage). Accumulates into
 * grad_units. Includes the TP/SP/EP collectives; not the DP or tied-embedding reductions. */
ncclResult_t wt_model_backward(struct wt_model *m, int slot, const float *dx_out, float *dx_in);
/* Elements of the activation tensor passed between stages. */
size_t wt_model_boundary_elems(const struct wt_model *m);
/* Bytes of activations per slot (for the memory table). */
size_t wt_model_act_bytes_per_slot(const struct wt_model *m);

/* ------------------------------------------------------------------------------------------
 * Data parallelism and the optimizer
 *
 * zero 0 (DDP): full params, full grads and full m/v on every rank; on the last micro-batch each
 *   unit is all-reduced on the DP stream as soon as its gradients are done (reverse layer order,
 *   overlapping the rest of backward).
 * zero 1: full params and grads; m/v only for this rank's shard of each unit; after the last
 *   micro-batch each unit is reduce-scattered; AdamW on the shard; units all-gathered.
 * zero 2: like 1, but full gradients live only per unit: each unit is reduce-scattered as soon
 *   as it is done in every micro-batch and accumulated into the gradient shard.
 * zero 3: like 2, and parameters are shards too; a unit is all-gathered before use in forward
 *   and in backward (prefetching the next unit on the DP stream) and freed after use; the outer
 *   unit stays gathered from the first forward to the end of backward.
 * zero 1, 2 and 3 issue identical reduce-scatters on identical padded units and so give
 * bit-identical results at m == 1; zero 2 and 3 reduce every micro-batch when m > 1.
 * ---------------------------------------------------------------------------------------- */
struct wt_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float clip; /* global gradient norm clip; 0: off */
};
struct wt_dp;
ncclResult_t wt_dp_create(struct wt_model *m, int zero, int overlap, struct wt_dp **dp_p);
void wt_dp_destroy(struct wt_dp *dp);
/* Loads canonical parameters (and, when m_canon/v_canon are not NULL, optimizer state) into
 * this rank's buffers: full or shard. */
ncclResult_t wt_dp_load(struct wt_dp *dp, const float *params_canon, const float *m_canon,
                        const float *v_canon);
/* Before the first micro-batch of a step: zero gradients and accumulators. `last_microbatch`
 * tells the hooks whether the coming backward is the last of the step (DDP/ZeRO-1 reduce only
 * then). */
ncclResult_t wt_dp_step_begin(struct wt_dp *dp);
void wt_dp_set_last_microbatch(struct wt_dp *dp, int last);
/* After the last backward: finishes the DP reductions (waits for the DP stream), then
 * all-reduces (SUM) the SP-partial tensors over TP and the WTE unit over {first, last} stage, on
 * whatever this rank holds of them (full tensors, or the intersection with its ZeRO shard: the
 * layouts are identical across TP ranks and, for the WTE unit, across the two stages).
 * Afterwards the gradients are final (full, or shards). */
ncclResult_t wt_dp_reduce_finish(struct wt_dp *dp);
/* Global gradient norm (collective over world; every rank gets the same value). */
ncclResult_t wt_dp_grad_norm(struct wt_dp *dp, double *norm_p);
/* AdamW step number `step` (1-based for bias correction) on what this rank owns, with clip
 * scale from the norm; then parameters made whole again (ZeRO-1/2 all-gather; ZeRO-3 keeps
 * shards). */
ncclResult_t wt_dp_optimizer_step(struct wt_dp *dp, const struct wt_adamw *opt, int step,
                                  double grad_norm);
/* Canonical state, gathered to world rank 0 (collective over world; canon is read only on rank
 * 0, and must be wt_canon_size long there). which: 0 params, 1 grads, 2 adam m, 3 adam v. */
enum wt_state { WT_STATE_PARAMS, WT_STATE_GRADS, WT_STATE_ADAM_M, WT_STATE_ADAM_V };
ncclResult_t wt_dp_gather_canon(struct wt_dp *dp, enum wt_state which, float *canon);

/* ------------------------------------------------------------------------------------------
 * Optimizer primitives (shared by wt_dp and the single-rank reference)
 * ---------------------------------------------------------------------------------------- */
/* In place on n elements; decay_mask NULL: decay everything; else decay where mask[i] != 0.
 * scale multiplies the gradient first (clipping). */
void wt_adamw_update(const struct wt_adamw *opt, int step, float scale, float *param,
                     const float *grad, float *m, float *v, const uint8_t *decay_mask, size_t n);

/* ------------------------------------------------------------------------------------------
 * Pipeline schedules
 *
 * A stage's step is a list of actions. GPipe: m forwards then m backwards (backward in order
 * 0..m-1). 1F1B (Megatron's non-interleaved): warmup w = min(p-i-1, m) forwards, then m-w
 * steady (forward, backward of the oldest), then w cooldown backwards. Sends and receives of the
 * same step that face the same direction in steady state are issued in one group.
 * ---------------------------------------------------------------------------------------- */
enum wt_action_kind {
    WT_ACT_RECV_FWD, /* receive activations of micro-batch mb from stage i-1 */
    WT_ACT_FORWARD,
    WT_ACT_SEND_FWD,
    WT_ACT_RECV_BWD, /* receive activation gradients of mb from stage i+1 */
    WT_ACT_BACKWARD,
    WT_ACT_SEND_BWD,
};
struct wt_action {
    enum wt_action_kind kind;
    int mb;
    int group; /* actions with the same nonzero group id run in one ncclGroupStart/End */
};
enum wt_schedule { WT_SCHED_GPIPE, WT_SCHED_1F1B };
/* Fills at most max actions for stage `stage` of p with m micro-batches; returns the count. */
int wt_schedule_build(enum wt_schedule sched, int stage, int p, int m, struct wt_action *out,
                      int max);
/* Largest number of micro-batches whose activations are alive at once on the stage. */
int wt_schedule_slots(enum wt_schedule sched, int stage, int p, int m);

struct wt_pp_stats {
    double step_seconds;  /* wall time of the last wt_pp_run */
    double wait_seconds;  /* time blocked in pipeline receives (the bubble) */
};
/* Runs one step's forward and backward of all micro-batches of this stage with the schedule,
 * calling wt_dp_set_last_microbatch before the last backward. data(mb, tokens, targets, ctx)
 * fills micro-batch mb's (batch, T) inputs for this rank. loss_p: sum of the stage's losses (last
 * stage; 0 elsewhere). */
typedef void (*wt_data_fn)(int mb, int *tokens, int *targets, void *ctx);
ncclResult_t wt_pp_run(struct wt_model *m, struct wt_dp *dp, enum wt_schedule sched, int nmb,
                       wt_data_fn data, void *data_ctx, double *loss_p, struct wt_pp_stats *st);

/* ------------------------------------------------------------------------------------------
 * Data: deterministic byte-level batches from a built-in corpus. Sequence j of the global batch
 * of step s is the window of T+1 bytes at an offset that is a function of (seed, s, j) only.
 * ---------------------------------------------------------------------------------------- */
void wt_data_sequence(uint64_t seed, int step, int seq_index, int T, int *tokens, int *targets);

/* ------------------------------------------------------------------------------------------
 * Checkpoints: directory <dir>/step_<8 digits>/ with model.bin (params), optim.bin (m, v, step)
 * in canonical order, meta.txt (config, the layout that wrote it, CRC32 of each file), and DONE,
 * written last after the files are fsynced and renamed into place. Written by world rank 0.
 * ---------------------------------------------------------------------------------------- */
ncclResult_t wt_ckpt_write(const char *dir, int step, const struct wt_config *cfg,
                           const char *layout_desc, const float *params, const float *m,
                           const float *v);
/* Highest step with a DONE marker and valid CRCs (-1 if none). */
int wt_ckpt_latest(const char *dir);
ncclResult_t wt_ckpt_read(const char *dir, int step, const struct wt_config *cfg, float *params,
                          float *m, float *v);
/* Deletes complete checkpoints older than the newest `keep`. */
void wt_ckpt_prune(const char *dir, int keep);

#ifdef __cplusplus
}
#endif

#endif /* WT_TRAIN_H_ */
