/*
 * One host: ring/chain schedules for bandwidth, direct (one-hop) schedules where latency
 * dominates, the double binary tree where NCCL_ALGO allows it and the cost model predicts it
 * faster. Several hosts: whichever the socket fabric model predicts fastest.
 * The size compared with each threshold is the bytes one rank contributes (NCCL's count times the
 * element size; for all-gather and reduce-scatter the per-rank block).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "algo/cost.h"
#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/check.h"
#include "core/log.h"

#define TUNE_NCOLL WEFT_TUNE_NCOLL
#define TUNE_ALL 0xffffffffu

static const char *const tune_colls[TUNE_NCOLL] = {"allreduce", "allgather", "reducescatter",
                                                   "broadcast", "reduce"};
/* Bit i: algorithm i of enum weft_algo; NCCL's others take bits we never schedule. */
/* "" at WEFT_ALGO_DET: no name selects it (WEFT_DETERMINISTIC does), no token matches "". */
static const char *const tune_algos[] = {"ring",         "tree", "direct",   "hier", "",
                                         "collnetdirect", "collnetchain", "nvls", "nvlstree",
                                         "pat"};
static const char *const tune_protos[] = {"ll", "ll128", "simple"};

/* Parses one list ("a,b" or "^a,b") into *mask. Returns 0, or -1 with the bad token in bad. */
static int tune_parse_list(const char *s, size_t len, const char *const *names, int nnames,
                           unsigned *mask, char *bad, size_t badlen)
{
    int exclude = len > 0 && s[0] == '^';
    unsigned m = 0;
    size_t i = exclude ? 1 : 0;
    while (i <= len) {
        size_t j = i;
        while (j < len && s[j] != ',')
            j++;
        size_t a = i, b = j;
        while (a < b && (s[a] == ' ' || s[a] == '\t'))
            a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
            b--;
        if (b > a) {
            int k = 0;
            while (k < nnames && !(strlen(names[k]) == b - a && strncasecmp(names[k], s + a, b - a) == 0))
                k++;
            if (k == nnames) {
                size_t n = b - a < badlen - 1 ? b - a : badlen - 1;
                memcpy(bad, s + a, n);
                bad[n] = 0;
                return -1;
            }
            m |= 1u << k;
        }
        i = j + 1;
    }
    *mask = exclude ? ~m : m;
    return 0;
}

/* Parses a knob into masks[TUNE_NCOLL]. Returns 0, or -1 with the bad token. */
static int tune_parse(const char *s, const char *const *names, int nnames, unsigned *masks,
                      char *bad, size_t badlen)
{
    for (int c = 0; c < TUNE_NCOLL; c++)
        masks[c] = TUNE_ALL;
    if (s == NULL || s[0] == 0)
        return 0;
    if (strchr(s, ':') == NULL) {
        unsigned m;
        if (tune_parse_list(s, strlen(s), names, nnames, &m, bad, badlen) != 0)
            return -1;
        for (int c = 0; c < TUNE_NCOLL; c++)
            masks[c] = m;
        return 0;
    }
    for (const char *p = s; *p != 0;) {
        const char *end = strchr(p, ';'), *colon = strchr(p, ':');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len > 0) {
            if (colon == NULL || colon >= p + len) {
                size_t n = len < badlen - 1 ? len : badlen - 1;
                memcpy(bad, p, n);
                bad[n] = 0;
                return -1;
            }
            const char *a = p;
            while (*a == ' ')
                a++;
            int c = 0;
            while (c < TUNE_NCOLL && !(strlen(tune_colls[c]) == (size_t)(colon - a) &&
                                       strncasecmp(tune_colls[c], a, (size_t)(colon - a)) == 0))
                c++;
            if (c == TUNE_NCOLL) {
                size_t n = (size_t)(colon - a) < badlen - 1 ? (size_t)(colon - a) : badlen - 1;
                memcpy(bad, a, n);
                bad[n] = 0;
                return -1;
            }
            if (tune_parse_list(colon + 1, len - (size_t)(colon + 1 - p), names, nnames, &masks[c],
                                bad, badlen) != 0)
                return -1;
        }
        p += len + (end != NULL);
    }
    return 0;
}

/* Copies s (NULL: "") into buf, cut to fit. */
static void tune_copy_text(char *buf, size_t len, const char *s)
{
    snprintf(buf, len, "%s", s != NULL ? s : "");
}

void weft_tune_cfg_parse(const struct weft_tune_knobs *k, struct weft_tune_cfg *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    const char *a = k->nccl_algo, *p = k->nccl_proto;
    tune_copy_text(cfg->algo_text, sizeof(cfg->algo_text), a);
    tune_copy_text(cfg->proto_text, sizeof(cfg->proto_text), p);
    cfg->algo_set = a != NULL && a[0] != 0;
    cfg->algo_ok = tune_parse(a, tune_algos, (int)(sizeof(tune_algos) / sizeof(*tune_algos)),
                              cfg->algo, cfg->algo_bad, sizeof(cfg->algo_bad)) == 0;
    cfg->proto_ok = tune_parse(p, tune_protos, (int)(sizeof(tune_protos) / sizeof(*tune_protos)),
                               cfg->proto, cfg->proto_bad, sizeof(cfg->proto_bad)) == 0;
    if (!cfg->algo_ok) {
        cfg->algo_set = 0;
        for (int c = 0; c < TUNE_NCOLL; c++)
            cfg->algo[c] = TUNE_ALL;
    }
    static const struct {
        const char *name;
        int algo;
    } forced[] = {{"ring", WEFT_ALGO_RING}, {"direct", WEFT_ALGO_DIRECT},
                  {"tree", WEFT_ALGO_TREE}, {"hier", WEFT_ALGO_HIER}};
    const char *f = k->weft_algo;
    cfg->force = -1;
    for (size_t i = 0; f != NULL && i < sizeof(forced) / sizeof(*forced); i++)
        if (strcasecmp(f, forced[i].name) == 0)
            cfg->force = forced[i].algo;
    cfg->direct_max_bytes = k->direct_max_bytes;
}

ncclResult_t weft_tune_check(const struct weft_tune_cfg *cfg)
{
    if (!cfg->algo_ok) {
        WEFT_WARN("NCCL_ALGO %s: unknown algorithm or collective '%s' (Ring, Tree, Direct, Hier, "
                  "CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT; per collective "
                  "allreduce:tree,ring;allgather:ring)",
                  cfg->algo_text, cfg->algo_bad);
        return ncclInvalidUsage;
    }
    if (!cfg->proto_ok) {
        WEFT_WARN("NCCL_PROTO %s: unknown protocol or collective '%s' (LL, LL128, Simple)",
                  cfg->proto_text, cfg->proto_bad);
        return ncclInvalidUsage;
    }
    static int logged;
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_ACQ_REL)) {
        for (int c = 0; c < TUNE_NCOLL; c++) {
            unsigned m = cfg->algo[c];
            WEFT_INFO(WEFT_LOG_TUNING, "%s: algorithms allowed%s%s%s%s%s", weft_coll_name(c),
                      m & (1u << WEFT_ALGO_RING) ? " ring" : "",
                      m & (1u << WEFT_ALGO_TREE) ? " tree" : "",
                      m & (1u << WEFT_ALGO_DIRECT) ? " direct" : "",
                      m & (1u << WEFT_ALGO_HIER) ? " hier" : "",
                      cfg->algo_set ? " (NCCL_ALGO)" : " (default: tree across hosts only)");
            if (cfg->proto[c] != TUNE_ALL)
                WEFT_INFO(WEFT_LOG_TUNING,
                          "%s: NCCL_PROTO: LL %s (LL128 %d Simple %d: both are the slot FIFO)",
                          weft_coll_name(c), cfg->proto[c] & 1 ? "on" : "off",
                          !!(cfg->proto[c] & 2),
                          !!(cfg->proto[c] & 4));
        }
    }
    return ncclSuccess;
}

unsigned weft_tune_allowed(const struct weft_tune_cfg *cfg, int coll)
{
    return coll >= 0 && coll < TUNE_NCOLL ? cfg->algo[coll] : TUNE_ALL;
}

/* Bit 0 of a protocol mask is LL (tune_protos). Collectives NCCL's per-collective form cannot
 * name (point-to-point, all-to-all, gather, scatter) use LL when every named one may. */
int weft_tune_ll(const struct weft_tune_cfg *cfg, int coll)
{
    if (coll >= 0 && coll < TUNE_NCOLL)
        return cfg->proto[coll] & 1u;
    for (int c = 0; c < TUNE_NCOLL; c++)
        if (!(cfg->proto[c] & 1u))
            return 0;
    return 1;
}

/* Bits 1 and 2: LL128 and Simple. */
int weft_tune_slots(const struct weft_tune_cfg *cfg, int coll)
{
    if (coll >= 0 && coll < TUNE_NCOLL)
        return (cfg->proto[coll] & 6u) != 0;
    for (int c = 0; c < TUNE_NCOLL; c++)
        if (!(cfg->proto[c] & 6u))
            return 0;
    return 1;
}

int weft_tune_ll_any(const struct weft_tune_cfg *cfg)
{
    for (int c = 0; c < TUNE_NCOLL; c++)
        if (cfg->proto[c] & 1u)
            return 1;
    return 0;
}

uint64_t weft_tune_knobs_hash(const struct weft_tune_cfg *cfg, int proto)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the masks */
    for (int c = 0; c < TUNE_NCOLL; c++) {
        h = (h ^ (proto ? cfg->proto[c] : cfg->algo[c])) * 1099511628211ull;
    }
    if (!proto)
        h = (h ^ (uint64_t)(int64_t)cfg->force) * 1099511628211ull;
    return h;
}

/* The algorithms with a schedule of their own for coll. */
static unsigned tune_available(int coll)
{
    if (coll == WEFT_COLL_ALLREDUCE)
        return 1u << WEFT_ALGO_RING | 1u << WEFT_ALGO_TREE | 1u << WEFT_ALGO_DIRECT |
               1u << WEFT_ALGO_HIER;
    if (coll < TUNE_NCOLL || coll == WEFT_COLL_ALLTOALL)
        return 1u << WEFT_ALGO_RING | 1u << WEFT_ALGO_DIRECT;
    return 1u << WEFT_ALGO_RING;
}

/* The measured single-host rule, among ring and direct as far as mask allows them. All-to-all
 * posts every block at once at any size: one host, 4 / 8 ranks on 2 cores, 64 B to 4 MiB, direct
 * took 0.47-0.92 / 0.33-0.92 of the pairwise order's time (2 ranks: equal). */
static int tune_rule(int coll, size_t bytes, int nranks, int oversubscribed, unsigned mask,
                     int64_t limit)
{
    int ring = !!(mask & (1u << WEFT_ALGO_RING)), direct = !!(mask & (1u << WEFT_ALGO_DIRECT));
    if (!ring || !direct)
        return ring ? WEFT_ALGO_RING : direct ? WEFT_ALGO_DIRECT : -1;
    if (coll == WEFT_COLL_ALLTOALL)
        return WEFT_ALGO_DIRECT;
    if (limit < 0)
        limit = oversubscribed ? 32768 : 8192;
    if (nranks > 1 && bytes <= (size_t)limit)
        return WEFT_ALGO_DIRECT;
    return WEFT_ALGO_RING;
}

/* The choice and, where us is not NULL, every prediction; *why names what decided it. */
static int tune_choose_any(int coll, size_t bytes, const struct weft_tune_comm *tc, double *us,
                       const char **why)
{
    int nranks = tc->layout.nranks, multi = tc->layout.nhosts > 1;
    unsigned avail = tune_available(coll);
    if (!multi || tc->layout.hier_k < 2) /* hier needs hosts of k > 1 ranks each */
        avail &= ~(1u << WEFT_ALGO_HIER);
    if (us != NULL) {
        for (int a = 0; a < WEFT_ALGO_COUNT; a++)
            us[a] = !(avail & (1u << a)) ? -1
                    : multi ? weft_cost_layout_us(coll, a, bytes, &tc->layout, &tc->fabric)
                                        : weft_cost_us(coll, a, bytes, nranks);
    }
    *why = "";
    if (avail == 1u << WEFT_ALGO_RING)
        return WEFT_ALGO_RING; /* the pairwise schedules are the same under both names */
    const struct weft_tune_cfg *cfg = &tc->cfg;
    *why = " (WEFT_ALGO)";
    /* ring and direct exist for every collective that gets here; tree and hier only where
     * avail says so (elsewhere the forced name is ignored, as before). */
    int force = cfg->force;
    if (force == WEFT_ALGO_RING || force == WEFT_ALGO_DIRECT ||
        (force >= 0 && (avail & (1u << force))))
        return force;

    unsigned mask = avail;
    *why = cfg->algo_set ? " (NCCL_ALGO)" : "";
    if (cfg->algo_set) {
        mask &= weft_tune_allowed(cfg, coll);
        if (mask == 0) {
            static int warned;
            if (!__atomic_exchange_n(&warned, 1, __ATOMIC_ACQ_REL))
                WEFT_INFO(WEFT_LOG_TUNING,
                          "NCCL_ALGO %s allows no algorithm %s has; using the default choice",
                          cfg->algo_text, weft_coll_name(coll));
            mask = avail;
            *why = "";
        }
    } else if (!multi) {
        mask &= ~(1u << WEFT_ALGO_TREE);
    }
    if (multi && nranks > 1) {
        /* Every allowed algorithm on the socket fabric; the fastest wins (ties: lower enum). */
        int best = -1;
        double tbest = 0;
        for (int a = 0; a < WEFT_ALGO_COUNT; a++) {
            if (!(mask & (1u << a)))
                continue;
            double t = weft_cost_layout_us(coll, a, bytes, &tc->layout, &tc->fabric);
            if (best < 0 || t < tbest) {
                best = a;
                tbest = t;
            }
        }
        return best;
    }
    int algo = tune_rule(coll, bytes, nranks, tc->oversubscribed, mask, cfg->direct_max_bytes);
    if ((mask & (1u << WEFT_ALGO_TREE)) && nranks > 1) {
        double t_tree = weft_cost_us(coll, WEFT_ALGO_TREE, bytes, nranks);
        double t_other = algo < 0 ? 0 : weft_cost_us(coll, algo, bytes, nranks);
        if (algo < 0 || t_tree < t_other)
            return WEFT_ALGO_TREE;
    }
    return algo < 0 ? WEFT_ALGO_RING : algo;
}

/*
 * Deterministic mode keeps only the schedules that reduce every element in rank order 0 .. n-1
 * (direct one-shot, DET two-shot): whatever was chosen among the others (ring, tree, hier for its
 * bandwidth) becomes the two-shot, which moves about as many bytes as the ring; reduce and
 * reduce-scatter become direct (ring chains reduce in an order that starts at the root).
 */
static int tune_choose(int coll, size_t bytes, const struct weft_tune_comm *tc, double *us,
                       const char **why)
{
    int algo = tune_choose_any(coll, bytes, tc, us, why);
    if (!tc->deterministic)
        return algo;
    if (coll == WEFT_COLL_ALLREDUCE && algo != WEFT_ALGO_DIRECT)
        algo = WEFT_ALGO_DET;
    else if (coll == WEFT_COLL_REDUCE || coll == WEFT_COLL_REDUCESCATTER)
        algo = WEFT_ALGO_DIRECT;
    *why = " (WEFT_DETERMINISTIC)";
    return algo;
}

int weft_tune_algo_quiet(int coll, size_t bytes, const struct weft_tune_comm *tc, double *us_p)
{
    const char *why;
    return tune_choose(coll, bytes, tc, us_p, &why);
}

int weft_tune_algo_of(int coll, int a2a_in_place, size_t bytes, const struct weft_tune_comm *tc)
{
    return a2a_in_place ? WEFT_ALGO_DIRECT : weft_tune_algo(coll, bytes, tc);
}

int weft_tune_algo(int coll, size_t bytes, const struct weft_tune_comm *tc)
{
    if (__builtin_expect(weft_log_level < 0, 0))
        weft_log_init();
    if (weft_log_level < WEFT_LOG_LEVEL_INFO || !(weft_log_mask & WEFT_LOG_TUNING)) {
        const char *why;
        return tune_choose(coll, bytes, tc, NULL, &why);
    }
    double us[WEFT_ALGO_COUNT];
    const char *why;
    int algo = tune_choose(coll, bytes, tc, us, &why);
    WEFT_INFO(WEFT_LOG_TUNING,
              "%s %zu bytes, %d ranks on %d hosts: %s%s (predicted us: ring %.1f tree %.1f "
              "direct %.1f hier %.1f; %s model)",
              weft_coll_name(coll), bytes, tc->layout.nranks, tc->layout.nhosts,
              weft_algo_name(algo), why, us[WEFT_ALGO_RING], us[WEFT_ALGO_TREE],
              us[WEFT_ALGO_DIRECT], us[WEFT_ALGO_HIER],
              tc->layout.nhosts > 1 ? tc->fabric_name : "shared-memory");
    return algo;
}

ncclResult_t weft_tune_comm_blocks(struct weft_tune_comm *tc, int nranks, int ranks_per_host,
                                   int oversubscribed, double chunk_bytes)
{
    struct weft_tune_comm t;
    WEFT_CHECK(weft_cost_layout_blocks(&t.layout, nranks, ranks_per_host));
    t.oversubscribed = oversubscribed;
    t.chunk_bytes = chunk_bytes;
    t.deterministic = 0;
    weft_tune_cfg_parse(&(struct weft_tune_knobs){NULL, NULL, NULL, -1}, &t.cfg);
    weft_cost_fabric_socket(&t.fabric, chunk_bytes, oversubscribed);
    t.fabric_name = "socket";
    *tc = t;
    return ncclSuccess;
}
