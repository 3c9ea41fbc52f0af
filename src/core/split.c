/* ncclCommSplit and ncclCommShrink: agree on the members over the parent's bootstrap, then init. */
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "core/check.h"
#include "core/comm.h"
#include "core/group.h"
#include "core/split.h"
#include "exec/cuda.h"

#define WEFT_SHRINK_MSG_VERSION 0x57534b01u /* "\1KSW" */

/* What each parent rank contributes to the split's first all-gather. */
struct weft_split_entry {
    int32_t color;
    int32_t key;
};

/* The shrink root's message to each survivor. */
struct weft_shrink_msg {
    uint32_t version;
    int32_t status;         /* ncclSuccess, or why the root has no id to give */
    uint32_t nsurvivors;    /* as the root counted them */
    uint32_t reserved;
    uint64_t exclude_print; /* fingerprint of the root's exclude set */
    ncclUniqueId id;
};

/* Parent-bootstrap work counts as an operation on the parent, so ncclCommAbort waits for it. */
static void weft_split_busy(struct ncclComm *comm, int delta)
{
    __atomic_fetch_add(&comm->busy, delta, __ATOMIC_SEQ_CST);
}

/*
 * A non-blocking parent must be idle (NCCL: using a communicator whose previous operation has not
 * returned ncclSuccess is an invalid argument); its init may still be using the bootstrap.
 */
static ncclResult_t weft_split_parent_ready(struct ncclComm *comm, const char *api)
{
    if (weft_comm_async_state(comm) == ncclInProgress || comm->bootstrap == NULL) {
        WEFT_WARN("%s: comm %p still has an operation in progress (poll ncclCommGetAsyncError "
                  "until it returns ncclSuccess first)",
                  api, (void *)comm);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/*
 * Creates the child the way ncclCommInitRankConfig does, so groups (the init runs at
 * ncclGroupEnd) and non-blocking configs (ncclInProgress, *child_p set at once) behave the same.
 * config NULL: the parent's resolved config. The child is on the parent's device (as in NCCL),
 * whatever the calling thread's current device is.
 */
static ncclResult_t weft_split_init_child(struct ncclComm *comm, int nranks, const ncclUniqueId *id,
                                          int rank, const ncclConfig_t *config,
                                          struct ncclComm **child_p)
{
    int prev = comm->cuda_bound ? weft_cuda_current_device() : -1;
    if (comm->cuda_bound)
        weft_cuda_set_device(comm->cuda_dev);
    ncclResult_t res = weft_group_enqueue_init(child_p, nranks, id, rank,
                                               config != NULL ? config : &comm->config);
    if (prev >= 0)
        weft_cuda_set_device(prev);
    return res;
}

/* ---------------------------------------------------------------------------------------------
 * Split
 * ------------------------------------------------------------------------------------------- */

/* A member of one color, as sorted: by key, then by parent rank. */
struct weft_split_member {
    int32_t key;
    int32_t rank;
};

static int weft_split_cmp(const void *a, const void *b)
{
    const struct weft_split_member *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* Fills members with the parent ranks of `color` in child order. Returns how many. */
static int weft_split_members(const struct weft_split_entry *tab, int n, int color,
                              struct weft_split_member *members)
{
    int m = 0;
    for (int r = 0; r < n; r++)
        if (tab[r].color == color)
            members[m++] = (struct weft_split_member){.key = tab[r].key, .rank = r};
    qsort(members, (size_t)m, sizeof(*members), weft_split_cmp);
    return m;
}

/*
 * Schedule (every parent rank):
 *   1. all-gather (color, key): everyone knows every color's members and their order;
 *   2. the first member of each color makes a unique id (its root thread serves the child's
 *      rendezvous); all-gather of ids, zero where a rank is no first member or failed. A second
 *      all-gather rather than tagged sends: it reuses the ring connections that already exist
 *      (sends would open a TCP connection from each first member to each member of its color),
 *      it costs one 128-byte block per rank, and every rank sees every id, so a failed or
 *      colliding id is seen by the whole color at once instead of leaving it to time out;
 *   3. members of each color init the child with their color's id (weft_split_init_child).
 */
ncclResult_t weft_comm_split(struct ncclComm *comm, int color, int key, const ncclConfig_t *config,
                             struct ncclComm **newcomm_p)
{
    ncclResult_t res = ncclSuccess, id_res = ncclSuccess;
    int n = comm->nranks, me = comm->rank;
    struct weft_split_entry *tab = NULL;
    ncclUniqueId *ids = NULL;
    struct weft_split_member *members = NULL;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
        WEFT_WARN("ncclCommSplit: color %d must be >= 0 or NCCL_SPLIT_NOCOLOR (%d)", color,
                  NCCL_SPLIT_NOCOLOR);
        return ncclInvalidArgument;
    }
    WEFT_CHECK(weft_split_parent_ready(comm, "ncclCommSplit"));
    tab = calloc((size_t)n, sizeof(*tab));
    ids = calloc((size_t)n, sizeof(*ids));
    members = calloc((size_t)n, sizeof(*members));
    if (tab == NULL || ids == NULL || members == NULL) {
        WEFT_WARN("ncclCommSplit: out of memory for %d ranks", n);
        res = ncclSystemError;
        goto out_free;
    }

    weft_split_busy(comm, 1);
    tab[me] = (struct weft_split_entry){.color = color, .key = key};
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bootstrap, tab, sizeof(*tab)), res, out_idle);
    for (int r = 0; r < n; r++) {
        if (tab[r].color < 0 && tab[r].color != NCCL_SPLIT_NOCOLOR) {
            WEFT_WARN("ncclCommSplit: rank %d sent color %d (mismatched library?)", r,
                      tab[r].color);
            res = ncclInternalError;
            goto out_idle;
        }
    }
    int nmembers = 0, newrank = -1;
    if (color != NCCL_SPLIT_NOCOLOR) {
        nmembers = weft_split_members(tab, n, color, members);
        for (int i = 0; i < nmembers; i++)
            if (members[i].rank == me)
                newrank = i;
        if (newrank < 0) {
            WEFT_WARN("ncclCommSplit: rank %d is missing from its own color %d", me, color);
            res = ncclInternalError;
            goto out_idle;
        }
        if (newrank == 0)
            id_res = weft_bootstrap_fresh_id(&ids[me]);
    }
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bootstrap, ids, sizeof(*ids)), res, out_idle);
    weft_split_busy(comm, -1);

    if (color == NCCL_SPLIT_NOCOLOR) {
        WEFT_INFO(WEFT_LOG_INIT, "comm %p rank %d split: no color, no new communicator",
                  (void *)comm, me);
        *newcomm_p = NULL;
        goto out_free;
    }
    if (WEFT_IS_ERROR(id_res)) {
        res = id_res;
        goto out_free;
    }
    int leader = members[0].rank;
    uint64_t magic = weft_bootstrap_magic(&ids[leader]);
    if (magic == 0) {
        WEFT_WARN("ncclCommSplit: rank %d, first of color %d, could not make a unique id", leader,
                  color);
        res = ncclSystemError;
        goto out_free;
    }
    for (int r = 0; r < n; r++) {
        if (r != leader && weft_bootstrap_magic(&ids[r]) == magic) {
            WEFT_WARN("ncclCommSplit: colors %d and %d got the same unique id (NCCL_COMM_ID is "
                      "set?); split needs fresh ids",
                      color, tab[r].color);
            res = ncclInvalidUsage;
            goto out_free;
        }
    }
    WEFT_INFO(WEFT_LOG_INIT, "comm %p rank %d split: color %d key %d -> rank %d of %d",
              (void *)comm, me, color, key, newrank, nmembers);
    /* splitShare is accepted and inherited, but a host child never shares (see split.h). */
    res = weft_split_init_child(comm, nmembers, &ids[leader], newrank, config, newcomm_p);
    goto out_free;

out_idle:
    weft_split_busy(comm, -1);
out_free:
    free(members);
    free(ids);
    free(tab);
    return res;
}

/* ---------------------------------------------------------------------------------------------
 * Shrink
 * ------------------------------------------------------------------------------------------- */

/* Checks the exclude list against comm; fills excluded[nranks] (1 = excluded). */
static ncclResult_t weft_shrink_check(const struct ncclComm *comm, const int *exclude,
                                      int nexclude, int flags, uint8_t *excluded)
{
    if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT) {
        WEFT_WARN("ncclCommShrink: shrinkFlags 0x%x must be NCCL_SHRINK_DEFAULT or "
                  "NCCL_SHRINK_ABORT",
                  (unsigned)flags);
        return ncclInvalidArgument;
    }
    if (nexclude <= 0 || exclude == NULL) {
        WEFT_WARN("ncclCommShrink: excludeRanksList %p with excludeRanksCount %d: at least one "
                  "rank must be excluded",
                  (const void *)exclude, nexclude);
        return ncclInvalidArgument;
    }
    for (int i = 0; i < nexclude; i++) {
        int r = exclude[i];
        if (r < 0 || r >= comm->nranks) {
            WEFT_WARN("ncclCommShrink: excludeRanksList[%d] = %d is out of range for nranks %d", i,
                      r, comm->nranks);
            return ncclInvalidArgument;
        }
        if (excluded[r]) {
            WEFT_WARN("ncclCommShrink: excludeRanksList[%d] = %d appears twice", i, r);
            return ncclInvalidArgument;
        }
        excluded[r] = 1;
    }
    if (excluded[comm->rank]) {
        WEFT_WARN("ncclCommShrink: rank %d is in excludeRanksList; only the ranks that remain may "
                  "call ncclCommShrink",
                  comm->rank);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* FNV-1a over the excluded rank numbers in increasing order: equal sets, equal prints. */
static uint64_t weft_shrink_print(const uint8_t *excluded, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int r = 0; r < n; r++) {
        if (!excluded[r])
            continue;
        for (int b = 0; b < 4; b++)
            h = (h ^ (((uint32_t)r >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
    }
    return h;
}

/* Root side: make the id, send it to every other survivor (all of them, even after a failure). */
static ncclResult_t weft_shrink_send_ids(struct ncclComm *comm, const uint8_t *excluded,
                                         struct weft_shrink_msg *msg)
{
    ncclResult_t res = weft_bootstrap_fresh_id(&msg->id);
    msg->status = (int32_t)res;
    for (int r = comm->rank + 1; r < comm->nranks; r++)
        if (!excluded[r])
            WEFT_CHECK_IGNORE(weft_bootstrap_send(comm->bootstrap, r, WEFT_SPLIT_TAG_SHRINK_ID, msg,
                                                  sizeof(*msg)),
                              res);
    return res;
}

/* Survivor side: receive the root's message and check that it is for this very shrink. */
static ncclResult_t weft_shrink_recv_id(struct ncclComm *comm, int root,
                                        struct weft_shrink_msg *mine, struct weft_shrink_msg *msg)
{
    WEFT_CHECK(weft_bootstrap_recv(comm->bootstrap, root, WEFT_SPLIT_TAG_SHRINK_ID, msg,
                                   sizeof(*msg)));
    if (msg->version != WEFT_SHRINK_MSG_VERSION) {
        WEFT_WARN("ncclCommShrink: rank %d got a malformed message from rank %d (version 0x%x)",
                  comm->rank, root, msg->version);
        return ncclInternalError;
    }
    if (msg->nsurvivors != mine->nsurvivors || msg->exclude_print != mine->exclude_print) {
        WEFT_WARN("ncclCommShrink: rank %d and rank %d passed different exclude lists (%u and %u "
                  "ranks remain)",
                  comm->rank, root, mine->nsurvivors, msg->nsurvivors);
        return ncclInvalidUsage;
    }
    if (msg->status != ncclSuccess) {
        WEFT_WARN("ncclCommShrink: rank %d, the lowest remaining rank, failed to make the new "
                  "communicator's unique id (error %d)",
                  root, msg->status);
        return ncclSystemError;
    }
    return ncclSuccess;
}

/*
 * Schedule (survivors only): the lowest survivor makes the child's unique id and sends it to each
 * other survivor, one tagged message each; then every survivor inits the child. Only survivors
 * exchange messages, so dead excluded ranks are never waited for.
 */
ncclResult_t weft_comm_shrink(struct ncclComm *comm, const int *exclude, int nexclude,
                              const ncclConfig_t *config, int flags, struct ncclComm **newcomm_p)
{
    ncclResult_t res = ncclSuccess;
    int n = comm->nranks, me = comm->rank;
    uint8_t *excluded;
    WEFT_CALLOC(excluded, n);
    WEFT_CHECK_GOTO(weft_shrink_check(comm, exclude, nexclude, flags, excluded), res, out_free);
    WEFT_CHECK_GOTO(weft_split_parent_ready(comm, "ncclCommShrink"), res, out_free);

    int root = -1, newrank = 0, nsurvivors = 0;
    for (int r = 0; r < n; r++) {
        if (excluded[r])
            continue;
        if (root < 0)
            root = r;
        if (r < me)
            newrank++;
        nsurvivors++;
    }
    struct weft_shrink_msg mine = {.version = WEFT_SHRINK_MSG_VERSION,
                                   .nsurvivors = (uint32_t)nsurvivors,
                                   .exclude_print = weft_shrink_print(excluded, n)};
    struct weft_shrink_msg msg = mine;
    /* NCCL_SHRINK_ABORT: nothing of the parent is outstanding on the host path (see split.h). */
    weft_split_busy(comm, 1);
    if (me == root)
        res = weft_shrink_send_ids(comm, excluded, &msg);
    else
        res = weft_shrink_recv_id(comm, root, &mine, &msg);
    weft_split_busy(comm, -1);
    if (WEFT_IS_ERROR(res))
        goto out_free;

    WEFT_INFO(WEFT_LOG_INIT, "comm %p rank %d shrink: %d excluded%s -> rank %d of %d",
              (void *)comm, me, nexclude, flags == NCCL_SHRINK_ABORT ? " (abort)" : "", newrank,
              nsurvivors);
    /* shrinkShare is accepted and inherited, but a host child never shares (see split.h). */
    res = weft_split_init_child(comm, nsurvivors, &msg.id, newrank, config, newcomm_p);
out_free:
    free(excluded);
    return res;
}
