/* Communicator lifecycle: init (bootstrap, peer exchange, transports), finalize, free. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/cma.h"
#include "core/cond.h"
#include "core/fault.h"
#include "core/cuda_peer.h"
#include "core/group.h"
#include "core/mem.h"
#include "core/param.h"
#include "core/trace.h"
#include "algo/sched.h"
#include "algo/tuner.h"
#include "cuda/cuda_ops.h"
#include "exec/cuda.h"
#include "exec/sig.h"
#include "exec/stream.h"
#include "exec/wait.h"
#include "exec/zcopy.h"
#include "net/net.h"
#include "transport.h"

WEFT_PARAM_DECL(Timeout); /* exec/host_watch.c */
WEFT_PARAM(HostNChannels, "WEFT_HOST_NCHANNELS", 1,
           "channels per collective on host memory (1..16); host ranks run one thread each");
WEFT_PARAM(CommBlocking, "NCCL_COMM_BLOCKING", -1,
           "1 or 0 overrides config.blocking of every communicator (-1: use the config)");
WEFT_PARAM_STR(HostId, "NCCL_HOSTID", NULL,
               "host identity override: ranks with equal ids share memory");
WEFT_PARAM(ShmDisable, "NCCL_SHM_DISABLE", 0,
           "1: no shared memory between this rank and any other (ranks of one host, even a rank "
           "and itself, then use the socket transport over TCP)");
/* The tuner's knobs: read here, passed in parsed (algo/tuner.h reads no environment). */
WEFT_PARAM(DirectMaxBytes, "WEFT_DIRECT_MAX_BYTES", -1,
           "all-reduce, reduce-scatter, all-gather, broadcast and reduce up to this many bytes "
           "per rank use the direct (one-hop) schedules (0: never; -1: 8 KiB, or 32 KiB when "
           "ranks outnumber cores and every hop of a ring costs a context switch)");
WEFT_PARAM(Deterministic, "WEFT_DETERMINISTIC", 0,
           "1: reductions give bitwise the same result whatever the algorithm, protocol and "
           "channels: every element is reduced in rank order (all-reduce: direct or rank-order "
           "two-shot; reduce and reduce-scatter: direct); every rank must set it alike");
WEFT_PARAM_STR(Algo, "WEFT_ALGO", "auto",
               "force the algorithm of every collective that has it: ring, direct, tree, hier "
               "(all-reduce across hosts of equal size) or auto");
WEFT_PARAM_STR(NcclAlgo, "NCCL_ALGO", "",
               "algorithms allowed, NCCL's syntax: Ring,Tree,Direct (and Weft's Hier); ^ excludes; "
               "per collective "
               "allreduce:tree,ring;allgather:ring (empty: the measured default)");
WEFT_PARAM_STR(NcclProto, "NCCL_PROTO", "",
               "protocols allowed, NCCL's syntax (LL, LL128, Simple): LL is the deep FIFO of "
               "small slots that steps of up to 1008 bytes take, LL128 and Simple the slot FIFO");

ncclResult_t weft_comm_tune_cfg(struct weft_tune_cfg *cfg)
{
    struct weft_tune_knobs k = {
        .nccl_algo = weft_param_NcclAlgo(),
        .nccl_proto = weft_param_NcclProto(),
        .weft_algo = weft_param_Algo(),
        .direct_max_bytes = weft_param_DirectMaxBytes(),
    };
    weft_tune_cfg_parse(&k, cfg);
    return weft_tune_check(cfg);
}

/* Transports in the order they are asked; the first that can connect a pair does. */
static const struct weft_transport *const weft_transports[] = {
    &weft_transport_shm,
    &weft_transport_net,
    &weft_transport_socket,
};
#define WEFT_NTRANSPORTS ((int)(sizeof(weft_transports) / sizeof(weft_transports[0])))
_Static_assert(WEFT_NTRANSPORTS <= WEFT_MAX_TRANSPORTS, "too many transports");

static uint64_t weft_hash_bytes(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull; /* FNV-1a */
    }
    return h;
}

/* Adds the boot id to h: one value per running kernel, shared by its namespaces. */
static uint64_t weft_hash_boot_id(uint64_t h)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        char boot[64] = "";
        if (fgets(boot, sizeof(boot), f) != NULL)
            h = weft_hash_bytes(h, boot, strlen(boot));
        fclose(f);
    }
    return h;
}

/* Ranks with the same value can share memory: hostname and boot id, unless NCCL_HOSTID says. */
static uint64_t weft_host_hash(void)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const char *id = weft_param_HostId();
    if (id != NULL)
        return weft_hash_bytes(h, id, strlen(id));
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    h = weft_hash_bytes(h, host, strlen(host));
    return weft_hash_boot_id(h);
}

/* Ranks with the same value share the cores of one machine: the boot id alone (hosts made of
 * network and UTS namespaces, or NCCL_HOSTID, still share it). */
static uint64_t weft_machine_hash(void)
{
    return weft_hash_boot_id(0x84222325cbf29ce4ull);
}

ncclResult_t weft_comm_check(const struct ncclComm *comm, const char *api)
{
    if (comm == NULL) {
        WEFT_WARN("%s: comm is NULL", api);
        return ncclInvalidArgument;
    }
    if (__atomic_load_n(&comm->magic, __ATOMIC_RELAXED) != WEFT_COMM_MAGIC) {
        WEFT_WARN("%s: comm %p is not a valid communicator (destroyed or corrupted)", api,
                  (const void *)comm);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

ncclResult_t weft_comm_refuse_closing(const struct ncclComm *comm, const char *api)
{
    int aborted = __atomic_load_n(&comm->closing, __ATOMIC_ACQUIRE) == WEFT_COMM_CLOSING_ABORT;
    WEFT_WARN("%s: comm %p is being %s by another thread", api, (const void *)comm,
              aborted ? "aborted (ncclCommAbort)" : "destroyed (ncclCommDestroy)");
    return ncclInvalidUsage;
}

int weft_comm_claim_close(struct ncclComm *comm, uint32_t how)
{
    uint32_t open = WEFT_COMM_OPEN;
    return __atomic_compare_exchange_n(&comm->closing, &open, how, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

int weft_comm_drain(struct ncclComm *comm, int own, int max_ms)
{
    if (comm->bell != NULL) {
        __atomic_fetch_add(&comm->bell->seq, 1, __ATOMIC_SEQ_CST);
        weft_futex_wake(&comm->bell->seq);
    }
    for (int i = 0; i < max_ms && __atomic_load_n(&comm->busy, __ATOMIC_SEQ_CST) > own; i++)
        usleep(1000);
    return __atomic_load_n(&comm->busy, __ATOMIC_SEQ_CST) <= own;
}

ncclResult_t weft_comm_drain_calls(struct ncclComm *comm, const char *api)
{
    int waited = weft_comm_drain(comm, 0, 1000 * (int)weft_param_Timeout());
    if (!waited) {
        __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_SEQ_CST);
        waited = weft_comm_drain(comm, 0, 1000);
    }
    if (waited)
        return ncclSuccess;
    WEFT_WARN("%s: a call on rank %d still runs on another thread after %lld s; the "
              "communicator is left allocated",
              api, comm->rank, (long long)weft_param_Timeout());
    return ncclInternalError;
}

/*
 * Freed communicators' memory, kept: a thread that took the handle before the free (a call just
 * starting while a watchdog aborts) reads the dead magic in weft_comm_enter instead of freed
 * memory. The oldest shell is freed when a newer one needs its place: no call takes that long
 * between reading the handle and its first check. ~10 KB each.
 */
enum { WEFT_COMM_SHELLS = 32 };
static struct ncclComm *weft_comm_shells[WEFT_COMM_SHELLS];
static unsigned weft_comm_shells_next;
static pthread_mutex_t weft_comm_shells_lock = PTHREAD_MUTEX_INITIALIZER;

static void weft_comm_bury(struct ncclComm *comm)
{
    pthread_mutex_lock(&weft_comm_shells_lock);
    struct ncclComm **slot = &weft_comm_shells[weft_comm_shells_next++ % WEFT_COMM_SHELLS];
    struct ncclComm *oldest = *slot;
    *slot = comm;
    pthread_mutex_unlock(&weft_comm_shells_lock);
    free(oldest);
}


/*
 * Reads a user config the way NCCL does: size first, copy what both sides know, check the magic,
 * then validate and fill defaults.
 */
static ncclResult_t weft_config_parse(const ncclConfig_t *user, ncclConfig_t *out)
{
    ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
    *out = def;
    if (user != NULL) {
        if (user->magic != 0xcafebeef) {
            WEFT_WARN("config was not initialized with NCCL_CONFIG_INITIALIZER (magic 0x%x)",
                      user->magic);
            return ncclInvalidArgument;
        }
        size_t n = user->size < sizeof(*out) ? user->size : sizeof(*out);
        if (n < offsetof(ncclConfig_t, blocking)) {
            WEFT_WARN("config size %zu is too small", user->size);
            return ncclInvalidArgument;
        }
        memcpy(out, user, n);
        out->size = sizeof(*out);
    }
    if (weft_param_CommBlocking() >= 0)
        out->blocking = (int)weft_param_CommBlocking();
    if (out->blocking == NCCL_CONFIG_UNDEF_INT)
        out->blocking = 1;
    if (out->blocking != 0 && out->blocking != 1) {
        WEFT_WARN("config.blocking %d must be 0 or 1", out->blocking);
        return ncclInvalidArgument;
    }
    if (out->minCTAs == NCCL_CONFIG_UNDEF_INT)
        out->minCTAs = 1;
    if (out->maxCTAs == NCCL_CONFIG_UNDEF_INT)
        out->maxCTAs = 64;
    if (out->minCTAs <= 0 || out->maxCTAs <= 0 || out->minCTAs > out->maxCTAs) {
        WEFT_WARN("config.minCTAs %d / maxCTAs %d must be positive with min <= max",
                  out->minCTAs, out->maxCTAs);
        return ncclInvalidArgument;
    }
    if (out->cgaClusterSize == NCCL_CONFIG_UNDEF_INT)
        out->cgaClusterSize = 4;
    if (out->cgaClusterSize < 0 || out->cgaClusterSize > 8) {
        WEFT_WARN("config.cgaClusterSize %d must be between 0 and 8", out->cgaClusterSize);
        return ncclInvalidArgument;
    }
    int *flags01[] = {&out->splitShare, &out->collnetEnable, &out->shrinkShare,
                      &out->nvlinkCentricSched};
    const char *names01[] = {"splitShare", "collnetEnable", "shrinkShare", "nvlinkCentricSched"};
    for (int i = 0; i < 4; i++) {
        if (*flags01[i] == NCCL_CONFIG_UNDEF_INT)
            *flags01[i] = 0;
        if (*flags01[i] != 0 && *flags01[i] != 1) {
            WEFT_WARN("config.%s %d must be 0 or 1", names01[i], *flags01[i]);
            return ncclInvalidArgument;
        }
    }
    if (out->CTAPolicy == NCCL_CONFIG_UNDEF_INT)
        out->CTAPolicy = 0;
    if (out->CTAPolicy < 0 || out->CTAPolicy > 2) {
        WEFT_WARN("config.CTAPolicy %d must be 0, 1 or 2", out->CTAPolicy);
        return ncclInvalidArgument;
    }
    if (out->nvlsCTAs != NCCL_CONFIG_UNDEF_INT && out->nvlsCTAs <= 0) {
        WEFT_WARN("config.nvlsCTAs %d must be positive", out->nvlsCTAs);
        return ncclInvalidArgument;
    }
    if (out->nChannelsPerNetPeer != NCCL_CONFIG_UNDEF_INT &&
        (out->nChannelsPerNetPeer <= 0 || out->nChannelsPerNetPeer > 64)) {
        WEFT_WARN("config.nChannelsPerNetPeer %d must be between 1 and 64",
                  out->nChannelsPerNetPeer);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}


/* Closes every transport that was set up, last first. */
static ncclResult_t weft_comm_disconnect(struct ncclComm *comm)
{
    ncclResult_t res = ncclSuccess;
    /* nobody asks a closed transport about its peers, or sleeps on its doorbell */
    free(comm->peer_transport);
    comm->peer_transport = NULL;
    comm->bell = NULL;
    for (int t = comm->ntransports - 1; t >= 0; t--) {
        WEFT_CHECK_IGNORE(comm->transports[t]->close(&comm->tctx, comm->transport_states[t]), res);
        comm->transports[t] = NULL;
        comm->transport_states[t] = NULL;
    }
    comm->ntransports = 0;
    for (int c = 0; c <= WEFT_MAX_CHANNELS; c++)
        comm->chan_peers[c] = NULL;
    free(comm->peers_mem);
    comm->peers_mem = NULL;
    return res;
}

ncclResult_t weft_comm_free(struct ncclComm *comm)
{
    ncclResult_t res = ncclSuccess;
    weft_trace_flush(comm);
    WEFT_CHECK_IGNORE(weft_cuda_comm_free(comm), res);
    if (comm->async_stream != NULL) {
        WEFT_CHECK_IGNORE(weft_stream_destroy(comm->async_stream), res);
        comm->async_stream = NULL;
    }
    WEFT_CHECK_IGNORE(weft_comm_disconnect(comm), res);
    weft_net_close(comm->net);
    comm->net = NULL;
    if (comm->bootstrap != NULL)
        WEFT_CHECK_IGNORE(weft_bootstrap_close(comm->bootstrap), res);
    free(comm->peer_info);
    free(comm->ring);
    free(comm->ring_pos);
    weft_sig_fini(comm);
    weft_exec_cache_free(comm);
    weft_zcopy_fini(comm);
    weft_mem_reg_drop(comm);
    pthread_mutex_destroy(&comm->reg_lock);
    pthread_mutex_destroy(&comm->ticket_lock);
    pthread_cond_destroy(&comm->ticket_cond);
    __atomic_store_n(&comm->magic, WEFT_COMM_DEAD, __ATOMIC_RELEASE);
    weft_comm_bury(comm);
    return res;
}

/*
 * Chooses a transport for every pair of ranks: the first in weft_transports whose can_connect says
 * yes (so shm inside a host, socket across hosts). choice[p] is this rank's choice for peer p.
 * used[t] is 1 when any pair of the communicator uses transport t: every rank computes the same
 * value from the same peer info, so every rank joins each used transport's collective setup.
 */
static ncclResult_t weft_comm_choose(struct ncclComm *comm, int *choice, int *used)
{
    int nranks = comm->nranks, me = comm->rank;
    for (int t = 0; t < WEFT_NTRANSPORTS; t++)
        used[t] = 0;
    for (int a = 0; a < nranks; a++) {
        for (int b = a; b < nranks; b++) {
            int t = 0;
            while (t < WEFT_NTRANSPORTS && !weft_transports[t]->can_connect(&comm->tctx, a, b))
                t++;
            if (t == WEFT_NTRANSPORTS) {
                WEFT_WARN("rank %d: no transport connects rank %d (host %s) with rank %d "
                          "(host %s)",
                          me, a, comm->peer_info[a].hostname, b, comm->peer_info[b].hostname);
                return ncclSystemError;
            }
            used[t] = 1;
            if (a == me)
                choice[b] = t;
            if (b == me)
                choice[a] = t;
        }
    }
    return ncclSuccess;
}

/*
 * Groups the ranks by host_hash (hosts numbered in order of their first rank) and fills what the
 * tuner reads. Only values every rank has (the peer info, the slot size), so every rank gets the
 * same and chooses the same algorithms.
 */
static ncclResult_t weft_comm_hosts(struct ncclComm *comm, const struct weft_transport *xhost)
{
    int nranks = comm->nranks, nhosts = 0, most = 0;
    int *host = malloc((size_t)nranks * sizeof(int));
    if (host == NULL) {
        WEFT_WARN("out of memory grouping %d ranks by host", nranks);
        return ncclSystemError;
    }
    int over = 0, mine = 0;
    const struct weft_peer_info *pi = comm->peer_info;
    for (int p = 0; p < nranks; p++)
        mine += pi[p].machine_hash == pi[comm->rank].machine_hash;
    for (int p = 0; p < nranks; p++) {
        int q = 0, local = 0, on_machine = 0, ncpu = pi[p].ncpu;
        while (pi[q].host_hash != pi[p].host_hash)
            q++;
        host[p] = q == p ? nhosts++ : host[q];
        for (q = 0; q <= p; q++)
            local += host[q] == host[p];
        most = local > most ? local : most;
        for (q = 0; q < nranks; q++) {
            if (pi[q].machine_hash != pi[p].machine_hash)
                continue;
            on_machine++;
            ncpu = pi[q].ncpu > 0 && pi[q].ncpu < ncpu ? pi[q].ncpu : ncpu;
        }
        over |= ncpu > 0 && on_machine > ncpu;
    }
    /* Whether a machine runs more ranks than cores, from the exchanged core counts (the fewest
     * any rank of the machine may use): every rank must choose alike, so not from this rank's
     * own affinity (which decides only how its own waits behave, comm->oversubscribed). */
    struct weft_tune_comm tc = {.deterministic = weft_param_Deterministic() != 0,
                                .oversubscribed = over,
                                .chunk_bytes = (double)weft_slot_payload(comm->slot_bytes) *
                                               WEFT_CHUNK_SLOTS};
    ncclResult_t res = weft_cost_layout_init(&tc.layout, nranks, host);
    if (res == ncclSuccess)
        res = weft_comm_tune_cfg(&tc.cfg); /* agreed: the settings' knob fingerprints */
    int *ring = malloc((size_t)nranks * sizeof(int));
    int *ring_pos = malloc((size_t)nranks * sizeof(int));
    if (res == ncclSuccess && (ring == NULL || ring_pos == NULL)) {
        WEFT_WARN("out of memory for the ring order of %d ranks", nranks);
        res = ncclSystemError;
    }
    if (res != ncclSuccess) {
        free(ring_pos);
        free(ring);
        free(host);
        return res;
    }
    weft_sched_ring_order(nranks, host, ring, ring_pos);
    free(host);
    int identity = 1;
    for (int i = 0; i < nranks; i++)
        identity &= ring[i] == i;
    if (identity) { /* hosts of consecutive ranks: the schedules' rank order, no lookups */
        free(ring);
        free(ring_pos);
        ring = ring_pos = NULL;
    }
    comm->ring = ring;
    comm->ring_pos = ring_pos;
    comm->hier_k = tc.layout.hier_k;
    comm->nhosts = nhosts;
    comm->ranks_per_host = most;
    comm->machines_oversubscribed = over;
    comm->machine_ranks = mine;
    if (xhost != NULL) { /* the fabric between hosts is the transport's that carries it */
        xhost->cost(&tc.fabric, tc.chunk_bytes, tc.oversubscribed);
        tc.fabric_name = xhost->name;
    }
    comm->tune = tc;
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_TUNING,
              "rank %d: %d ranks on %d hosts (at most %d per host)%s; tree depth %d, %d "
              "inter-host edges on its longest path, a NIC sends at most %d+%d halves per piece; "
              "ring leaves hosts %d times%s", comm->rank, nranks, nhosts, most,
              over ? ", a machine with more ranks than cores" : "", tc.layout.tree_depth,
              tc.layout.tree_path_inter, tc.layout.tree_nic_halves[0],
              tc.layout.tree_nic_halves[1], tc.layout.ring_cross,
              comm->ring != NULL ? " (ring in host order, not rank order)" : "");
    return ncclSuccess;
}

WEFT_PARAM_DECL(FuseBytes);       /* exec/host_plan.c */
WEFT_PARAM_DECL(ZcopyMinBytes);   /* exec/zcopy.c */

/* The core's settings, first in weft_peer_info.settings (the transports' follow, in the order of
 * weft_transports). Indices 1, 2 and the network are fingerprints: no value to print. */
static const char *const weft_core_setting_names[WEFT_SETTING_NCORE] = {
    "WEFT_HOST_NCHANNELS",  "NCCL_ALGO/WEFT_ALGO", "NCCL_PROTO",           "WEFT_DIRECT_MAX_BYTES",
    "WEFT_FUSE_BYTES",      "WEFT_DETERMINISTIC",  "WEFT_ZCOPY_MIN_BYTES",
    "NCCL_NET/NCCL_NET_PLUGIN (the network)",
};
#define WEFT_SETTING_HASHED(i) ((i) == 1 || (i) == 2 || (i) == WEFT_SETTING_NET)

/* The names (NULL: unused) and this process's values of every setting; the layout is the same in
 * every process of one build. */
static void weft_settings_collect(int nchannels, int64_t net_id, const char **names, int64_t *v)
{
    memset(v, 0, WEFT_NSETTINGS * sizeof(*v));
    for (int i = 0; i < WEFT_NSETTINGS; i++)
        names[i] = i < WEFT_SETTING_NCORE ? weft_core_setting_names[i] : NULL;
    v[0] = nchannels;
    struct weft_tune_cfg cfg;
    weft_comm_tune_cfg(&cfg); /* valid: init checked it */
    v[1] = (int64_t)weft_tune_knobs_hash(&cfg, 0);
    v[2] = (int64_t)weft_tune_knobs_hash(&cfg, 1);
    v[3] = weft_param_DirectMaxBytes();
    v[4] = weft_param_FuseBytes();
    v[5] = weft_param_Deterministic();
    v[WEFT_SETTING_ZCOPY_MIN_BYTES] = weft_param_ZcopyMinBytes();
    v[WEFT_SETTING_NET] = net_id;
    int n = WEFT_SETTING_NCORE;
    for (int t = 0; t < WEFT_NTRANSPORTS; t++) {
        const char *tn[WEFT_TRANSPORT_MAX_SETTINGS];
        int64_t tv[WEFT_TRANSPORT_MAX_SETTINGS];
        int k = weft_transports[t]->settings(tn, tv);
        for (int i = 0; i < k && n < WEFT_NSETTINGS; i++, n++) {
            names[n] = tn[i];
            v[n] = tv[i];
        }
    }
}

void weft_comm_settings(int nchannels, int64_t net_id, int64_t *v)
{
    const char *names[WEFT_NSETTINGS];
    weft_settings_collect(nchannels, net_id, names, v);
}

/*
 * Every rank must hold the same settings (weft_settings_collect): a rank with other channels would
 * map its peers' segments with the wrong size, other algorithm restrictions would pair a tree
 * step with a ring step. One message names every setting that differs and which ranks hold which
 * value; every rank reaches the same verdict from the same exchanged values.
 */
/* Appends to msg[size] at *len, stopping at the end (the text is cut, never overrun). */
static void weft_msg_append(char *msg, size_t size, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void weft_msg_append(char *msg, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg + *len, size - *len, fmt, ap);
    va_end(ap);
    *len = n < 0 ? size : *len + (size_t)n;
}

static ncclResult_t weft_comm_agree(struct ncclComm *comm)
{
    char msg[1024];
    size_t len = 0;
    int nranks = comm->nranks, bad = 0;
    const struct weft_peer_info *pi = comm->peer_info;
    const char *names[WEFT_NSETTINGS];
    int64_t mine[WEFT_NSETTINGS];
    weft_settings_collect(comm->nchannels, 0, names, mine);
    for (int i = 0; i < WEFT_NSETTINGS; i++) {
        int p = 1;
        while (p < nranks && pi[p].settings[i] == pi[0].settings[i])
            p++;
        if (p == nranks)
            continue;
        bad++;
        weft_msg_append(msg, sizeof(msg), &len, "%s%s:", bad > 1 ? ";" : "",
                        names[i] != NULL ? names[i] : "(unnamed)");
        /* one group per distinct value, in order of its first rank (at most 4 shown) */
        int groups = 0;
        for (int a = 0; a < nranks; a++) {
            int first = 1;
            for (int q = 0; q < a && first; q++)
                first = pi[q].settings[i] != pi[a].settings[i];
            if (!first)
                continue;
            if (++groups > 4) {
                weft_msg_append(msg, sizeof(msg), &len, " ...");
                break;
            }
            if (WEFT_SETTING_HASHED(i))
                weft_msg_append(msg, sizeof(msg), &len, "%s one value on ranks",
                                groups > 1 ? "," : "");
            else
                weft_msg_append(msg, sizeof(msg), &len, "%s %lld on ranks",
                                groups > 1 ? "," : "", (long long)pi[a].settings[i]);
            int shown = 0;
            for (int q = a; q < nranks; q++) {
                if (pi[q].settings[i] != pi[a].settings[i])
                    continue;
                if (++shown > 8) {
                    weft_msg_append(msg, sizeof(msg), &len, " ...");
                    break;
                }
                weft_msg_append(msg, sizeof(msg), &len, "%s%d", shown > 1 ? "," : " ", q);
            }
        }
    }
    if (bad == 0)
        return ncclSuccess;
    WEFT_WARN("rank %d: settings that must be the same on every rank differ: %s", comm->rank, msg);
    return ncclInvalidUsage;
}

/* The inode of this process's PID namespace, 0 when /proc cannot tell. */
static uint64_t weft_pid_ns(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}




/* weft_transport_ctx.fail: a proxy's connection failure, for the rank's waits. */
static void weft_comm_transport_fail(void *arg, ncclResult_t res, const char *msg)
{
    weft_comm_set_net_error(arg, res, "%s", msg);
}

/* What the transports get (transport.h): copied from the communicator once peers are known. */
static void weft_comm_transport_ctx(struct ncclComm *comm)
{
    comm->tctx = (struct weft_transport_ctx){
        .rank = comm->rank,
        .nranks = comm->nranks,
        .comm_hash = comm->comm_hash,
        .peers = comm->peer_info,
        .bootstrap = comm->bootstrap,
        .abort_flag = &comm->abort_flag,
        .async_error = &comm->async_error,
        .nchannels = comm->nchannels,
        .oversubscribed = comm->oversubscribed,
        .net = comm->net,
        .cuda_dev = comm->cuda_bound ? comm->cuda_dev : -1,
        .fail = weft_comm_transport_fail,
        .fail_arg = comm,
    };
}

/* Exchanges peer info and connects every peer with the first transport that reaches it. */
static ncclResult_t weft_comm_connect(struct ncclComm *comm)
{
    ncclResult_t res = ncclSuccess;
    int nranks = comm->nranks;
    WEFT_CALLOC(comm->peer_info, nranks);
    struct weft_peer_info *me = &comm->peer_info[comm->rank];
    me->version = WEFT_PEER_INFO_VERSION;
    me->rank = comm->rank;
    me->pid = (int32_t)getpid();
    me->cuda_dev = comm->cuda_bound ? comm->cuda_dev : -1;
    if (me->cuda_dev >= 0)
        WEFT_CHECK(weft_cuda_peer_identity(me->cuda_dev, me));
    me->host_hash = weft_host_hash();
    me->comm_hash = comm->comm_hash;
    me->flags = weft_param_ShmDisable() ? WEFT_PEER_NO_SHM : 0;
    me->machine_hash = weft_machine_hash();
    cpu_set_t cpus;
    me->ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus)
                                                              : (int)sysconf(_SC_NPROCESSORS_ONLN);
    gethostname(me->hostname, sizeof(me->hostname) - 1);
    WEFT_CHECK(weft_net_open(comm->comm_hash, comm->config.trafficClass == NCCL_CONFIG_UNDEF_INT
                                                  ? NCCL_NET_TRAFFIC_CLASS_UNDEF
                                                  : comm->config.trafficClass,
                             comm->config.netName, &comm->net));
    comm->dev_transport = &weft_dev_transport_p2p;
    comm->dev_bridge = comm->net != NULL ? &weft_dev_bridge_net : &weft_dev_bridge_socket;
    weft_comm_settings(comm->nchannels, weft_net_id(comm->net), me->settings);
    me->pid_ns = weft_pid_ns();
    /* Whether process_vm_readv pays here (core/cma.h) is measured now, once per process, before
     * the first exchange: later peers may busy-wait beside this rank, which halved memcpy's
     * figure on a VM whose two vCPUs share a core. */
    (void)weft_cma_pays();
    WEFT_CHECK(weft_bootstrap_allgather(comm->bootstrap, comm->peer_info, sizeof(*me)));
    for (int p = 0; p < nranks; p++) {
        struct weft_peer_info *pi = &comm->peer_info[p];
        if (pi->version != WEFT_PEER_INFO_VERSION || pi->rank != p ||
            pi->comm_hash != comm->comm_hash) {
            WEFT_WARN("rank %d: peer %d sent inconsistent init info (version %u, rank %d)",
                      comm->rank, p, pi->version, pi->rank);
            return ncclInternalError;
        }
        pi->hostname[sizeof(pi->hostname) - 1] = '\0';
    }
    WEFT_CHECK(weft_comm_agree(comm));
    weft_zcopy_setup(comm);
    /* More local ranks than usable cores: waits must give the core away (exec/host.c). */
    int local = 0;
    for (int p = 0; p < nranks; p++)
        local += comm->peer_info[p].host_hash == me->host_hash;
    int ncpu = me->ncpu;
    comm->oversubscribed = local > ncpu;
    if (comm->oversubscribed)
        __atomic_store_n(&weft_host_oversubscribed, 1, __ATOMIC_RELAXED);
    WEFT_INFO(WEFT_LOG_INIT, "rank %d: %d local ranks on %d cores%s", comm->rank, local, ncpu,
              comm->oversubscribed ? " (oversubscribed: waits yield at once)"
              : __atomic_load_n(&weft_host_oversubscribed, __ATOMIC_RELAXED)
                  ? " (another communicator of this process is oversubscribed: waits yield at once)"
                  : "");

    int *choice = calloc((size_t)nranks, sizeof(int));
    uint8_t *mask = calloc((size_t)nranks, 1);
    int nch = comm->nchannels + 1;
    comm->peers_mem = calloc((size_t)nch * nranks, sizeof(struct weft_peer_conns));
    if (choice == NULL || mask == NULL || comm->peers_mem == NULL) {
        WEFT_WARN("out of memory for the connections of %d ranks", nranks);
        res = ncclSystemError;
        goto out;
    }
    for (int c = 0; c < nch; c++)
        comm->chan_peers[c] = &comm->peers_mem[(size_t)c * nranks];
    weft_comm_transport_ctx(comm);
    int used[WEFT_NTRANSPORTS];
    WEFT_CHECK_GOTO(weft_comm_choose(comm, choice, used), res, out);
    /* One slot size for every connection: both ends of each must slice steps alike. */
    comm->slot_bytes = 0;
    for (int t = 0; t < WEFT_NTRANSPORTS; t++) {
        size_t bytes;
        if (!used[t])
            continue;
        WEFT_CHECK_GOTO(weft_transports[t]->slot_bytes(&comm->tctx, &bytes), res, out);
        if (bytes > comm->slot_bytes)
            comm->slot_bytes = bytes;
    }
    comm->tctx.slot_bytes = comm->slot_bytes;
    /* The transport between two hosts: the first that connects such a pair (every rank finds
     * the same, from exchanged values); NULL on one host. */
    const struct weft_transport *xhost = NULL;
    for (int b = 1; b < nranks && xhost == NULL; b++) {
        if (comm->peer_info[b].host_hash == comm->peer_info[0].host_hash)
            continue;
        for (int t = 0; t < WEFT_NTRANSPORTS && xhost == NULL; t++)
            if (weft_transports[t]->can_connect(&comm->tctx, 0, b))
                xhost = weft_transports[t];
    }
    WEFT_CHECK_GOTO(weft_comm_hosts(comm, xhost), res, out);
    comm->tctx.ll = weft_tune_ll_any(&comm->tune.cfg); /* the tuner's knobs, agreed */
    comm->peer_transport = malloc((size_t)nranks * sizeof(int));
    if (comm->peer_transport == NULL) {
        WEFT_WARN("out of memory for the transports of %d ranks", nranks);
        res = ncclSystemError;
        goto out;
    }
    for (int p = 0; p < nranks; p++)
        comm->peer_transport[p] = -1;
    for (int t = 0; t < WEFT_NTRANSPORTS; t++) {
        if (!used[t])
            continue;
        int npeers = 0;
        for (int p = 0; p < nranks; p++) {
            mask[p] = choice[p] == t;
            npeers += mask[p];
        }
        const struct weft_transport *tl = weft_transports[t];
        struct weft_transport_out made = {.chan_peers = comm->chan_peers};
        void *state = NULL;
        WEFT_CHECK_GOTO(tl->setup(&comm->tctx, mask, &made, &state), res, out);
        int k = comm->ntransports++;
        comm->transports[k] = tl;
        comm->transport_states[k] = state;
        for (int p = 0; p < nranks; p++)
            if (mask[p])
                comm->peer_transport[p] = k;
        if (comm->bell == NULL && made.bell != NULL)
            comm->bell = comm->tctx.bell = made.bell;
        comm->proxied |= made.proxied;
        WEFT_INFO(WEFT_LOG_INIT, "rank %d: transport %s connects %d of %d ranks (slot %zu bytes)",
                  comm->rank, tl->name, npeers, nranks, comm->slot_bytes);
    }
out:
    free(mask);
    free(choice);
    if (res != ncclSuccess)
        weft_comm_disconnect(comm);
    return res;
}

ncclResult_t weft_comm_alloc(struct ncclComm **comm_p, int nranks, int rank,
                             const ncclConfig_t *config)
{
    if (comm_p == NULL) {
        WEFT_WARN("ncclCommInitRank: comm pointer is NULL");
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_fault_check());
    if (nranks < 1) {
        WEFT_WARN("ncclCommInitRank: nranks %d must be at least 1", nranks);
        return ncclInvalidArgument;
    }
    if (rank < 0 || rank >= nranks) {
        WEFT_WARN("ncclCommInitRank: rank %d is out of range for nranks %d", rank, nranks);
        return ncclInvalidArgument;
    }
    ncclConfig_t cfg;
    WEFT_CHECK(weft_config_parse(config, &cfg));
    struct weft_tune_cfg tune_cfg;
    WEFT_CHECK(weft_comm_tune_cfg(&tune_cfg)); /* NCCL_ALGO / NCCL_PROTO: a bad token fails init */
    if (weft_param_Timeout() < 1) {
        WEFT_WARN("WEFT_TIMEOUT %lld: the deadline must be at least 1 second",
                  (long long)weft_param_Timeout());
        return ncclInvalidArgument;
    }

    struct ncclComm *comm;
    WEFT_CALLOC(comm, 1);
    comm->magic = WEFT_COMM_MAGIC;
    comm->rank = rank;
    comm->nranks = nranks;
    comm->cuda_dev = 0;
    comm->config = cfg;
    comm->blocking = cfg.blocking;
    int64_t nch = weft_param_HostNChannels();
    comm->nchannels = nch < 1 ? 1 : nch > WEFT_MAX_CHANNELS ? WEFT_MAX_CHANNELS : (int)nch;
    ncclResult_t res = weft_cuda_comm_bind(comm, -1); /* the calling thread's device */
    if (res != ncclSuccess) {
        free(comm);
        return res;
    }
    res = weft_sig_init(comm);
    if (res != ncclSuccess) {
        free(comm);
        return res;
    }
    pthread_mutex_init(&comm->ticket_lock, NULL);
    pthread_mutex_init(&comm->reg_lock, NULL);
    pthread_cond_init(&comm->ticket_cond, NULL);
    *comm_p = comm;
    return ncclSuccess;
}

/* The CUDA preconditions of this rank (cuda/cuda_ops.h, weft_cuda_report): the ranks of other
 * processes on this host count for exclusive-process devices and MIG instances. */
static void weft_comm_report_cuda(const struct ncclComm *comm)
{
    const struct weft_peer_info *me = &comm->peer_info[comm->rank];
    int others = 0;
    for (int p = 0; p < comm->nranks; p++) {
        const struct weft_peer_info *q = &comm->peer_info[p];
        others += q->host_hash == me->host_hash && (q->pid != me->pid || q->pid_ns != me->pid_ns);
    }
    weft_cuda_report(comm->rank, comm->cuda_bound ? comm->cuda_dev : -1, others);
}

ncclResult_t weft_comm_setup(struct ncclComm *comm, const ncclUniqueId *id)
{
    if (id == NULL) {
        WEFT_WARN("ncclCommInitRank: unique id is NULL");
        return ncclInvalidArgument;
    }
    comm->comm_hash = weft_bootstrap_magic(id);
    weft_log_set_rank(comm->rank); /* init's lines belong to this rank (JSON logs) */
    ncclResult_t res = weft_bootstrap_init(id, comm->rank, comm->nranks, &comm->abort_flag,
                                           &comm->bootstrap);
    if (res == ncclSuccess)
        res = weft_comm_connect(comm);
    if (res == ncclSuccess)
        weft_comm_report_cuda(comm);
    if (res == ncclSuccess)
        res = weft_cuda_comm_setup(comm);
    if (res == ncclSuccess)
        res = weft_bootstrap_barrier(comm->bootstrap);
    if (res == ncclSuccess) {
        __atomic_store_n(&comm->ready, 1, __ATOMIC_RELEASE);
        WEFT_INFO(WEFT_LOG_INIT, "comm %p rank %d nranks %d hash %016llx - init done",
                  (void *)comm, comm->rank, comm->nranks, (unsigned long long)comm->comm_hash);
    }
    weft_log_set_rank(-1);
    return res;
}

ncclResult_t weft_comm_init(struct ncclComm **comm_p, int nranks, const ncclUniqueId *id, int rank,
                            const ncclConfig_t *config)
{
    struct ncclComm *comm;
    WEFT_CHECK(weft_comm_alloc(&comm, nranks, rank, config));
    ncclResult_t res = weft_comm_setup(comm, id);
    if (res != ncclSuccess) {
        weft_comm_free(comm);
        return res;
    }
    *comm_p = comm;
    return ncclSuccess;
}

uint64_t weft_comm_ticket_take(struct ncclComm *comm)
{
    return __atomic_fetch_add(&comm->issued, 1, __ATOMIC_ACQ_REL);
}

ncclResult_t weft_comm_ticket_wait(struct ncclComm *comm, uint64_t ticket)
{
    /* Its turn already came (the inline path's common case): no lock. completed is written only
     * by the holder of the running ticket, so it cannot move past ticket meanwhile. */
    if (__atomic_load_n(&comm->completed, __ATOMIC_ACQUIRE) == ticket) {
        __atomic_store_n(&comm->ticket_running, 1, __ATOMIC_RELAXED);
        return ncclSuccess;
    }
    uint64_t timeout_ns = (uint64_t)weft_param_Timeout() * 1000000000ull;
    uint64_t seen = UINT64_MAX, idle_since = 0;
    pthread_mutex_lock(&comm->ticket_lock);
    /* Counted before completed is read again (both sequentially consistent): the finishing
     * thread either sees this waiter and wakes it, or this read sees its ticket done. */
    __atomic_fetch_add(&comm->ticket_waiters, 1, __ATOMIC_SEQ_CST);
    ncclResult_t res = ncclSuccess;
    uint64_t done;
    while ((done = __atomic_load_n(&comm->completed, __ATOMIC_SEQ_CST)) < ticket) {
        if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
            WEFT_WARN("rank %d: communicator aborted while work waited for its turn", comm->rank);
            res = ncclInvalidUsage;
            break;
        }
        /* Running work has deadlines of its own; the clock runs only while none runs. */
        uint64_t now = weft_time_ns();
        if (done != seen || __atomic_load_n(&comm->ticket_running, __ATOMIC_RELAXED)) {
            seen = done;
            idle_since = now;
        } else if (now - idle_since > timeout_ns) {
            WEFT_WARN("rank %d: work %llu waited %llu s for work %llu of this communicator, "
                      "which never started (WEFT_TIMEOUT)",
                      comm->rank, (unsigned long long)ticket,
                      (unsigned long long)((now - idle_since) / 1000000000ull),
                      (unsigned long long)seen);
            res = ncclSystemError;
            break;
        }
        weft_cond_wait_ms(&comm->ticket_cond, &comm->ticket_lock, 100);
    }
    __atomic_fetch_sub(&comm->ticket_waiters, 1, __ATOMIC_SEQ_CST);
    if (res == ncclSuccess)
        __atomic_store_n(&comm->ticket_running, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&comm->ticket_lock);
    return res;
}

void weft_comm_ticket_done(struct ncclComm *comm)
{
    __atomic_store_n(&comm->ticket_running, 0, __ATOMIC_RELAXED);
    __atomic_fetch_add(&comm->completed, 1, __ATOMIC_SEQ_CST);
    /* The broadcast takes the lock, so a waiter between its check and its sleep still hears it. */
    if (__atomic_load_n(&comm->ticket_waiters, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&comm->ticket_lock);
        pthread_cond_broadcast(&comm->ticket_cond);
        pthread_mutex_unlock(&comm->ticket_lock);
    }
}

ncclResult_t weft_comm_async_state(struct ncclComm *comm)
{
    weft_cuda_comm_check(comm); /* a kernel that gave up records its error here */
    ncclResult_t err = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    if (err != ncclSuccess)
        return err;
    /* A connection that failed between operations is reported before the next one fails. */
    err = __atomic_load_n(&comm->net_error, __ATOMIC_ACQUIRE);
    if (err != ncclSuccess)
        return err;
    if (comm->blocking)
        return ncclSuccess;
    int busy = __atomic_load_n(&comm->completed, __ATOMIC_ACQUIRE) <
               __atomic_load_n(&comm->issued, __ATOMIC_ACQUIRE);
    return busy ? ncclInProgress : ncclSuccess;
}

ncclResult_t weft_comm_ensure_ready(struct ncclComm *comm, const char *api)
{
    ncclResult_t state = weft_comm_async_state(comm);
    if (state == ncclInProgress) {
        WEFT_WARN("%s: comm %p used before its previous operation returned ncclSuccess (poll "
                  "ncclCommGetAsyncError until it does)",
                  api, (void *)comm);
        return ncclInvalidArgument;
    }
    return state;
}

uint64_t weft_zcopy_count(struct ncclComm *comm)
{
    return __atomic_load_n(&comm->zcopy_ops, __ATOMIC_RELAXED) + weft_cuda_zcopy_count(comm);
}
