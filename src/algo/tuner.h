/*
 * Algorithm choice. Depends only on values every rank shares (collective, bytes, rank count and
 * the knobs, which every rank of a job is expected to set alike), so all ranks choose the same.
 * The tuner reads no environment: core reads the knobs when it sets a communicator up
 * (weft_comm_tune_cfg, core/comm.h) and they come in parsed, in weft_tune_comm.cfg.
 *
 * NCCL_ALGO and NCCL_PROTO use NCCL's syntax: a comma list of names (case-insensitive), `^` first
 * to exclude them instead, or per collective `allreduce:tree,ring;allgather:ring` (Broadcast,
 * Reduce, AllGather, ReduceScatter, AllReduce; collectives not named keep every algorithm).
 * Algorithms: Ring, Tree, Direct (ours), and NCCL's CollNetDirect, CollNetChain, NVLS, NVLSTree and
 * PAT, which are accepted and never chosen (we have none of them). Protocols: LL, LL128, Simple;
 * LL is the LL FIFO of every connection (fifo.h), which steps of up to 1008 bytes
 * take; LL128 and Simple are the slot FIFO, which every other slice takes. An unknown name is
 * ncclInvalidUsage at communicator creation (weft_tune_check), as in NCCL.
 */
#ifndef WEFT_ALGO_TUNER_H
#define WEFT_ALGO_TUNER_H

#include <stddef.h>
#include <stdint.h>

#include "algo/cost.h"
#include "nccl.h"

#define WEFT_TUNE_NCOLL 5 /* the collectives NCCL's per-collective form names: AllReduce .. Reduce */

/* The tuner's knobs as the environment gives them (core reads them: weft_comm_tune_cfg). */
struct weft_tune_knobs {
    const char *nccl_algo;    /* NCCL_ALGO; NULL or "": unset */
    const char *nccl_proto;   /* NCCL_PROTO; NULL or "": unset */
    const char *weft_algo;    /* WEFT_ALGO; NULL or "auto": nothing forced */
    int64_t direct_max_bytes; /* WEFT_DIRECT_MAX_BYTES; -1: the default */
};

/* The knobs parsed (weft_tune_cfg_parse): what they allow. */
struct weft_tune_cfg {
    int algo_ok, proto_ok; /* 0: a token did not parse (*_bad names it; the masks allow all) */
    int algo_set;          /* NCCL_ALGO set (and valid) */
    int force;             /* WEFT_ALGO as enum weft_algo, -1 when unset */
    unsigned algo[WEFT_TUNE_NCOLL], proto[WEFT_TUNE_NCOLL]; /* bit masks per collective */
    int64_t direct_max_bytes;
    char algo_bad[64], proto_bad[64];
    char algo_text[128], proto_text[128]; /* the knobs' text (cut), for messages */
};

/* Pure: parses the knobs into *cfg (never fails: weft_tune_check reports a bad token). */
void weft_tune_cfg_parse(const struct weft_tune_knobs *knobs, struct weft_tune_cfg *cfg);

/*
 * Validates NCCL_ALGO and NCCL_PROTO as parsed (WEFT_WARN naming the bad token,
 * ncclInvalidUsage) and logs what they allow under TUNING (once per process). Called at
 * communicator creation, from any thread.
 */
ncclResult_t weft_tune_check(const struct weft_tune_cfg *cfg);

/*
 * Bit (1 << enum weft_algo) set of the algorithms NCCL_ALGO allows for coll; every bit when
 * NCCL_ALGO is unset or invalid.
 */
unsigned weft_tune_allowed(const struct weft_tune_cfg *cfg, int coll);

/* 1 when NCCL_PROTO lets coll (enum weft_coll) use LL; point-to-point, all-to-all, gather and
 * scatter, which its per-collective form cannot name, when every collective it names may. */
int weft_tune_ll(const struct weft_tune_cfg *cfg, int coll);

/* 1 when NCCL_PROTO lets coll use LL128 or Simple (the slot FIFO), alike for the collectives
 * it cannot name. */
int weft_tune_slots(const struct weft_tune_cfg *cfg, int coll);

/* 1 when NCCL_PROTO lets some collective use LL: connections then get LL FIFOs. */
int weft_tune_ll_any(const struct weft_tune_cfg *cfg);

/*
 * A fingerprint of what NCCL_ALGO, NCCL_PROTO and WEFT_ALGO allow (the parsed masks, not the
 * text: "ring" and "Ring" agree), for the init check that every rank restricts alike.
 */
uint64_t weft_tune_knobs_hash(const struct weft_tune_cfg *cfg, int proto);

/* What the tuner knows of a communicator: values every rank computes alike at setup. */
struct weft_tune_comm {
    struct weft_cost_layout layout; /* ranks, hosts (from the peers' host_hash), ranks per host */
    int oversubscribed;             /* one host: it runs more ranks than it has cores; several:
                                     * some machine does (namespaces of one machine count as one) */
    double chunk_bytes;             /* the executor's bytes per step (4 slots) */
    int deterministic;              /* WEFT_DETERMINISTIC (agreed at init): rank-order reductions
                                     * only (tuner.c); 0 from weft_tune_comm_blocks */
    struct weft_tune_cfg cfg;       /* the knobs (agreed at init: weft_comm_agree) */
    struct weft_cost_fabric fabric; /* several hosts: the fabric between them, as the transport
                                     * that carries that traffic declares it (transport.h cost) */
    const char *fabric_name;        /* for the log line: that transport's name */
};

/*
 * enum weft_algo for coll (enum weft_coll) moving `bytes` (NCCL's count x element size) on tc.
 * One host: unset NCCL_ALGO keeps the measured single-host rule (direct up to
 * WEFT_DIRECT_MAX_BYTES, ring above); tree is a candidate only where NCCL_ALGO allows it
 * explicitly (its single-host constants are not measured yet), and is chosen when the
 * shared-memory model (weft_cost_us) predicts it faster than the rule's choice among what is
 * allowed. Several hosts: every algorithm coll has that NCCL_ALGO allows (all by default) is
 * predicted on tc->fabric (the layout's counts) and the fastest wins. When nothing allowed has a schedule for coll, the unset choice applies (logged once).
 * WEFT_ALGO (ring, direct, tree) forces the algorithm of every collective that has it. The choice
 * is logged under TUNING unless quiet.
 */
int weft_tune_algo(int coll, size_t bytes, const struct weft_tune_comm *tc);

/* The algorithm an operation runs, on every executor: an in-place all-to-all takes the direct
 * order, which sends every block of a piece before it receives into any (the pairwise order would
 * overwrite blocks before sending them; algo/sched.c, DIRECT ALLTOALL); the rest weft_tune_algo. */
int weft_tune_algo_of(int coll, int a2a_in_place, size_t bytes, const struct weft_tune_comm *tc);

/* weft_tune_algo without the log line, and the predicted microseconds of each algorithm on tc's
 * fabric (-1 where coll has no schedule of that algorithm) in us_p[WEFT_ALGO_COUNT] if not NULL. */
int weft_tune_algo_quiet(int coll, size_t bytes, const struct weft_tune_comm *tc, double *us_p);

/* Fills tc for nranks on hosts of ranks_per_host consecutive ranks, steps of chunk_bytes (what
 * weft-scale --tuner prints; a communicator fills it from its peers in weft_comm_connect), the
 * knobs unset (tc->cfg: the caller may set it, from weft_comm_tune_cfg), the socket fabric
 * between hosts (weft_cost_fabric_socket; a communicator takes its transport's). */
ncclResult_t weft_tune_comm_blocks(struct weft_tune_comm *tc, int nranks, int ranks_per_host,
                                   int oversubscribed, double chunk_bytes);

#endif
