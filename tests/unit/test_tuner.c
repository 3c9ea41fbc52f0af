/*
 * The cost model's layouts (src/algo/cost.h) and the tuner (src/algo/tuner.h):
 *   layout   ring and tree counts of one host, hosts of k consecutive ranks and round-robin hosts
 *            against a brute-force count; the tree's busiest rank sends 2, 3, then 4 halves
 *   shm      weft_cost_us keeps the single-host formulas the rule was measured with
 *   rule     one host, NCCL_ALGO unset: direct up to 8 KiB (32 KiB oversubscribed), ring above
 *            (all-to-all: direct at every size),
 *            never tree, for every collective and 2..8 ranks
 *   hosts    several hosts, NCCL_ALGO unset: the choice is the model's fastest of ring, tree and
 *            direct; tree at small sizes from 16 ranks on, ring at 64 MiB; the layout of a
 *            communicator whose ranks list their hosts in any order gives the same choices
 *   ring     (NCCL_ALGO=ring) ring everywhere, one host or several
 *   tree     (NCCL_ALGO=tree) all-reduce on tree everywhere; the others keep the default
 *   force    (WEFT_ALGO=direct) direct for every collective that has it
 *   pure     (NCCL_ALGO=ring, NCCL_PROTO=^LL, WEFT_ALGO=tree, WEFT_DIRECT_MAX_BYTES=0) the tuner
 *            ignores the environment: only the knobs passed in (weft_tune_cfg_parse) decide
 *   log      (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=TUNING, NCCL_DEBUG_FILE=$dir/tuner.%p) the choice
 *            and the predictions land in the log
 * Usage: test_tuner CASE [DIR].
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algo/cost.h"
#include "algo/sched.h"
#include "algo/tuner.h"
#include "core/comm.h"

static int nfail, npass;

/* weft_tune_comm_blocks with the knobs of this process's environment, as a communicator gets
 * them (core reads them: the tuner reads no environment). */
static ncclResult_t tune_comm_blocks(struct weft_tune_comm *tc, int nranks, int ranks_per_host,
                                     int oversubscribed, double chunk_bytes)
{
    ncclResult_t res = weft_tune_comm_blocks(tc, nranks, ranks_per_host, oversubscribed,
                                             chunk_bytes);
    return res == ncclSuccess ? weft_comm_tune_cfg(&tc->cfg) : res;
}

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (cond) {                                                                                \
            npass++;                                                                               \
        } else if (nfail++ < 40) {                                                                 \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static const size_t sizes[] = {8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2u << 20,
                               8u << 20, 32u << 20, 64u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define SOCK_CHUNK (4.0 * (524288 - 16))
#define SHM_CHUNK (4.0 * (32768 - 16))

/* Brute force: the counts of cost.h from the trees and the host map. */
static void check_layout(int n, const int *host, const char *what)
{
    struct weft_cost_layout l;
    EXPECT(weft_cost_layout_init(&l, n, host) == ncclSuccess, "%s: layout", what);
    int nh = 0, cross = 0, halves = 0, path = 0, depth = 0;
    int *per = calloc((size_t)n, sizeof(int)), *exits = calloc((size_t)n, sizeof(int));
    int *up = calloc((size_t)n, sizeof(int)), *dn = calloc((size_t)n, sizeof(int));
    /* The ring runs in host order: count its exits hop by hop along that order. */
    int *ring = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int r = 0; r < n; r++)
        ring[r] = r;
    if (host != NULL)
        weft_sched_ring_order(n, host, ring, NULL);
    for (int i = 0; i < n; i++) {
        int a = ring[i], b = ring[(i + 1) % n];
        if (n > 1 && host != NULL && host[a] != host[b]) {
            cross++;
            exits[host[a]]++;
        }
    }
    free(ring);
    for (int r = 0; r < n; r++) {
        int h = host ? host[r] : 0;
        nh = h + 1 > nh ? h + 1 : nh;
        per[h]++;
        int mine = 0;
        for (int t = 0; t < 2 && n > 1; t++) {
            int p, c0, c1, d = 0, x = 0;
            weft_sched_tree(n, t, r, &p, &c0, &c1);
            mine += (p >= 0) + (c0 >= 0) + (c1 >= 0);
            int nb[3] = {p, c0, c1};
            for (int i = 0; i < 3; i++)
                if (nb[i] >= 0 && (host ? host[nb[i]] : 0) != h)
                    (i == 0 ? up : dn)[h]++;
            for (int q = r, pq = p; pq >= 0; d++) {
                int a, b, pp;
                x += (host ? host[pq] != host[q] : 0);
                weft_sched_tree(n, t, pq, &pp, &a, &b);
                q = pq;
                pq = pp;
            }
            depth = d > depth ? d : depth;
            path = x > path ? x : path;
        }
        halves = mine > halves ? mine : halves;
    }
    int most = 0, ex = 0, u = 0, dd = 0, hk = nh > 0 ? n / nh : 0;
    for (int h = 0; h < nh; h++) {
        hk = per[h] == hk ? hk : 0;
        most = per[h] > most ? per[h] : most;
        ex = exits[h] > ex ? exits[h] : ex;
        u = up[h] > u ? up[h] : u;
        dd = dn[h] > dd ? dn[h] : dd;
    }
    EXPECT(l.nranks == n && l.nhosts == nh && l.ranks_per_host == most && l.ring_cross == cross &&
               l.ring_nic == ex && l.tree_depth == depth && l.tree_path_inter == path &&
               l.tree_rank_halves == halves && l.tree_nic_halves[0] == u &&
               l.tree_nic_halves[1] == dd && l.hier_k == hk && (nh < 2 || (cross == nh && ex == 1)),
           "%s n %d: layout %d hosts %d/host ring %d/%d tree depth %d path %d halves %d nic %d+%d; "
           "want %d %d %d/%d %d %d %d %d+%d",
           what, n, l.nhosts, l.ranks_per_host, l.ring_cross, l.ring_nic, l.tree_depth,
           l.tree_path_inter, l.tree_rank_halves, l.tree_nic_halves[0], l.tree_nic_halves[1], nh,
           most, cross, ex, depth, path, halves, u, dd);
    free(per);
    free(exits);
    free(up);
    free(dn);
}

static void case_layout(void)
{
    for (int n = 1; n <= 300; n += n < 20 ? 1 : 37) {
        int *host = malloc((size_t)n * sizeof(int));
        check_layout(n, NULL, "one host");
        for (int k = 1; k <= 8; k *= 2) {
            for (int r = 0; r < n; r++)
                host[r] = r / k;
            check_layout(n, host, "blocks");
            struct weft_cost_layout a, b;
            EXPECT(weft_cost_layout_init(&a, n, host) == ncclSuccess &&
                       weft_cost_layout_blocks(&b, n, k) == ncclSuccess &&
                       memcmp(&a, &b, sizeof(a)) == 0,
                   "blocks n %d k %d: weft_cost_layout_blocks differs", n, k);
            int nh = (n + k - 1) / k;
            for (int r = 0; r < n; r++)
                host[r] = r % nh;
            check_layout(n, host, "round robin");
        }
        free(host);
    }
    /* The busiest rank of the double binary tree: 2 halves at 2 ranks, 3 at 3, 4 from 4 on. */
    for (int n = 2; n <= 64; n++) {
        struct weft_cost_layout l;
        weft_cost_layout_init(&l, n, NULL);
        EXPECT(l.tree_rank_halves == (n < 4 ? n : 4), "n %d: busiest rank sends %d halves", n,
               l.tree_rank_halves);
    }
}

static void case_shm(void)
{
    /* Single-host formulas: alpha 1 us, 4000 bytes per us. */
    EXPECT(weft_cost_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 4000, 4) == 6 + 1.5,
           "ring 4 ranks 4000 B: %f", weft_cost_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 4000, 4));
    EXPECT(weft_cost_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE, 4000, 5) == 6 + 2,
           "tree 5 ranks 4000 B: %f", weft_cost_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE, 4000, 5));
    EXPECT(weft_cost_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_DIRECT, 4000, 4) == 1 + 4,
           "direct 4 ranks 4000 B");
    EXPECT(weft_cost_us(WEFT_COLL_BROADCAST, WEFT_ALGO_DIRECT, 4000, 4) == 1 + 3,
           "direct bcast 4 ranks 4000 B");
    EXPECT(weft_cost_us(WEFT_COLL_ALLGATHER, WEFT_ALGO_RING, 4000, 4) == 3 + 3, "ring ag");
    /* The layout model on one host with streaming steps: the same ring, the tree's true depth
     * (floor(log2 5) = 2: 2 * 2 alphas), then 2 bytes per phase for the busiest rank. */
    struct weft_cost_fabric f;
    struct weft_cost_layout l;
    weft_cost_fabric_shm(&f);
    weft_cost_layout_init(&l, 4, NULL);
    EXPECT(weft_cost_layout_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_RING, 4000, &l, &f) == 7.5,
           "layout ring 4 ranks");
    weft_cost_layout_init(&l, 5, NULL);
    EXPECT(weft_cost_layout_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE, 40000, &l, &f) == 4 + 20,
           "layout tree 5 ranks: %f", weft_cost_layout_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE,
                                                          40000, &l, &f));
    /* Up to 1024 4-byte elements ride one tree: steps of all 4000 bytes, 2 per phase. */
    EXPECT(weft_cost_layout_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE, 4000, &l, &f) == 4 + 4,
           "layout tree 5 ranks, one tree: %f",
           weft_cost_layout_us(WEFT_COLL_ALLREDUCE, WEFT_ALGO_TREE, 4000, &l, &f));
}

static int rule_want(int coll, size_t bytes, int oversub)
{
    if (coll == WEFT_COLL_ALLTOALL) /* every block posted at once, at any size */
        return WEFT_ALGO_DIRECT;
    if (coll > WEFT_COLL_REDUCE)
        return WEFT_ALGO_RING;
    return bytes <= (oversub ? 32768u : 8192u) ? WEFT_ALGO_DIRECT : WEFT_ALGO_RING;
}

static void case_rule(void)
{
    for (int n = 2; n <= 8; n++)
        for (int o = 0; o < 2; o++) {
            struct weft_tune_comm tc;
            EXPECT(tune_comm_blocks(&tc, n, n, o, SHM_CHUNK) == ncclSuccess, "tune comm");
            for (int c = 0; c < WEFT_COLL_COUNT; c++)
                for (size_t i = 0; i < NSIZES; i++) {
                    int a = weft_tune_algo(c, sizes[i], &tc);
                    EXPECT(a == rule_want(c, sizes[i], o),
                           "one host %d ranks%s %s %zu B: %s", n, o ? " oversubscribed" : "",
                           weft_coll_name(c), sizes[i], weft_algo_name(a));
                }
        }
}

/* The choice on tc is the fastest prediction among the algorithms coll has. */
static int check_fastest(int coll, size_t bytes, const struct weft_tune_comm *tc)
{
    double us[WEFT_ALGO_COUNT];
    int a = weft_tune_algo_quiet(coll, bytes, tc, us);
    EXPECT(a == weft_tune_algo(coll, bytes, tc), "quiet and logged choices differ");
    for (int b = 0; b < WEFT_ALGO_COUNT; b++)
        EXPECT(us[b] < 0 || us[a] <= us[b], "%s %zu B %d ranks %d hosts: %s (%.1f us) over %s "
               "(%.1f us)", weft_coll_name(coll), bytes, tc->layout.nranks, tc->layout.nhosts,
               weft_algo_name(a), us[a], weft_algo_name(b), us[b]);
    return a;
}

static void case_hosts(void)
{
    static const int shapes[][2] = {{2, 1}, {2, 2}, {2, 4}, {4, 4}, {8, 8}, {16, 4}, {128, 8}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int h = shapes[s][0], k = shapes[s][1], n = h * k;
        struct weft_tune_comm tc;
        EXPECT(tune_comm_blocks(&tc, n, k, 0, SOCK_CHUNK) == ncclSuccess, "tune comm");
        int tree_small = 0;
        for (int c = 0; c < WEFT_COLL_COUNT; c++)
            for (size_t i = 0; i < NSIZES; i++) {
                int a = check_fastest(c, sizes[i], &tc);
                if (c == WEFT_COLL_ALLREDUCE && sizes[i] <= 512)
                    tree_small += a == WEFT_ALGO_TREE;
                if (c == WEFT_COLL_ALLREDUCE && sizes[i] == 64u << 20)
                    EXPECT(a == WEFT_ALGO_RING || (a == WEFT_ALGO_HIER && k > 1),
                           "%dx%d 64 MiB: %s", h, k, weft_algo_name(a));
            }
        if (n >= 16)
            EXPECT(tree_small == 4, "%dx%d: tree for %d of the 4 sizes up to 512 B", h, k,
                   tree_small);
        /* The same hosts listed in another order (ranks of a host not adjacent): a layout of its
         * own, and every rank that builds it from the same list chooses alike. */
        int *host = malloc((size_t)n * sizeof(int));
        for (int r = 0; r < n; r++)
            host[r] = r % h;
        struct weft_tune_comm t1 = tc, t2 = tc;
        weft_cost_layout_init(&t1.layout, n, host);
        weft_cost_layout_init(&t2.layout, n, host);
        for (size_t i = 0; i < NSIZES; i++)
            EXPECT(weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, sizes[i], &t1, NULL) ==
                       weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, sizes[i], &t2, NULL),
                   "round robin %dx%d: two ranks choose differently", h, k);
        free(host);
    }
}

static void case_forced(int want_allreduce, int want_other)
{
    static const int shapes[][2] = {{1, 4}, {2, 2}, {16, 4}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int h = shapes[s][0], k = shapes[s][1], n = h * k;
        struct weft_tune_comm tc;
        tune_comm_blocks(&tc, n, k, 0, h > 1 ? SOCK_CHUNK : SHM_CHUNK);
        for (int c = 0; c < WEFT_COLL_COUNT; c++)
            for (size_t i = 0; i < NSIZES; i++) {
                int a = weft_tune_algo(c, sizes[i], &tc), want;
                if (c == WEFT_COLL_ALLTOALL) /* NCCL_ALGO does not name it; WEFT_ALGO does */
                    want = want_other == WEFT_ALGO_DIRECT || h == 1 ? WEFT_ALGO_DIRECT
                                                                    : WEFT_ALGO_RING;
                else if (c > WEFT_COLL_REDUCE)
                    want = WEFT_ALGO_RING;
                else if (c == WEFT_COLL_ALLREDUCE && want_allreduce >= 0)
                    want = want_allreduce;
                else if (want_other >= 0)
                    want = want_other;
                else if (h == 1)
                    want = rule_want(c, sizes[i], 0);
                else
                    want = weft_tune_algo_quiet(c, sizes[i], &tc, NULL); /* itself: no check */
                EXPECT(a == want, "%dx%d %s %zu B: %s, want %s", h, k, weft_coll_name(c),
                       sizes[i], weft_algo_name(a), weft_algo_name(want));
            }
    }
}

/*
 * The tuner reads no environment (run with NCCL_ALGO=ring, NCCL_PROTO=^LL, WEFT_ALGO=tree and
 * WEFT_DIRECT_MAX_BYTES=0 set): a weft_tune_comm made without the knobs keeps the default rule
 * and every protocol, and knobs passed in explicitly decide alone, as the environment would.
 */
static void case_pure(void)
{
    struct weft_tune_comm tc;
    EXPECT(weft_tune_comm_blocks(&tc, 4, 4, 0, SHM_CHUNK) == ncclSuccess, "tune comm");
    EXPECT(weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, 64, &tc, NULL) == WEFT_ALGO_DIRECT,
           "no knobs passed: 64 B all-reduce is not direct");
    EXPECT(weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, 1 << 20, &tc, NULL) == WEFT_ALGO_RING,
           "no knobs passed: 1 MiB all-reduce is not ring");
    EXPECT(weft_tune_ll(&tc.cfg, WEFT_COLL_ALLREDUCE) && weft_tune_ll_any(&tc.cfg),
           "no knobs passed: LL is not allowed");
    struct weft_tune_knobs k = {"ring", "^LL", NULL, -1};
    weft_tune_cfg_parse(&k, &tc.cfg);
    EXPECT(weft_tune_check(&tc.cfg) == ncclSuccess, "ring, ^LL do not parse");
    EXPECT(weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, 64, &tc, NULL) == WEFT_ALGO_RING,
           "NCCL_ALGO=ring passed: 64 B all-reduce is not ring");
    EXPECT(!weft_tune_ll(&tc.cfg, WEFT_COLL_ALLREDUCE) && !weft_tune_ll_any(&tc.cfg) &&
               weft_tune_slots(&tc.cfg, WEFT_COLL_ALLREDUCE),
           "NCCL_PROTO=^LL passed: LL is still allowed");
    k = (struct weft_tune_knobs){NULL, NULL, "tree", -1};
    weft_tune_cfg_parse(&k, &tc.cfg);
    EXPECT(weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, 64, &tc, NULL) == WEFT_ALGO_TREE,
           "WEFT_ALGO=tree passed: 64 B all-reduce is not tree");
    k = (struct weft_tune_knobs){NULL, NULL, NULL, 0};
    weft_tune_cfg_parse(&k, &tc.cfg);
    EXPECT(weft_tune_algo_quiet(WEFT_COLL_ALLREDUCE, 64, &tc, NULL) == WEFT_ALGO_RING,
           "WEFT_DIRECT_MAX_BYTES=0 passed: 64 B all-reduce is not ring");
    k = (struct weft_tune_knobs){"bogus", NULL, NULL, -1};
    weft_tune_cfg_parse(&k, &tc.cfg);
    EXPECT(weft_tune_check(&tc.cfg) == ncclInvalidUsage, "NCCL_ALGO=bogus passed the check");
}

static void case_log(const char *dir)
{
    struct weft_tune_comm tc;
    tune_comm_blocks(&tc, 4, 2, 0, SOCK_CHUNK);
    int a = weft_tune_algo(WEFT_COLL_ALLREDUCE, 8, &tc);
    char path[4096], line[1024];
    snprintf(path, sizeof(path), "%s/tuner.%d", dir, (int)getpid());
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "no log file %s", path);
    int found = 0;
    char want[128];
    snprintf(want, sizeof(want), "AllReduce 8 bytes, 4 ranks on 2 hosts: %s (predicted us: ring",
             weft_algo_name(a));
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        found |= strstr(line, want) != NULL;
    EXPECT(found, "no line '%s' in %s", want, path);
    if (f != NULL) {
        fclose(f);
        unlink(path);
    }
}

int main(int argc, char **argv)
{
    const char *c = argc > 1 ? argv[1] : "";
    if (strcmp(c, "layout") == 0)
        case_layout();
    else if (strcmp(c, "shm") == 0)
        case_shm();
    else if (strcmp(c, "rule") == 0)
        case_rule();
    else if (strcmp(c, "hosts") == 0)
        case_hosts();
    else if (strcmp(c, "ring") == 0)
        case_forced(WEFT_ALGO_RING, WEFT_ALGO_RING);
    else if (strcmp(c, "tree") == 0)
        case_forced(WEFT_ALGO_TREE, -1);
    else if (strcmp(c, "force") == 0)
        case_forced(WEFT_ALGO_DIRECT, WEFT_ALGO_DIRECT);
    else if (strcmp(c, "pure") == 0)
        case_pure();
    else if (strcmp(c, "log") == 0 && argc > 2)
        case_log(argv[2]);
    else {
        fprintf(stderr, "usage: test_tuner layout|shm|rule|hosts|ring|tree|force|log DIR\n");
        return 2;
    }
    printf("%s: %d passed, %d failed\n", c, npass, nfail);
    return nfail != 0;
}
