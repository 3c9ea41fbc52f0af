/* Operation signatures, mismatch notes between ranks and the hang report (see exec/sig.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algo/sched.h"
#include "bootstrap/bootstrap.h"
#include "core/check.h"
#include "core/communicator.h"
#include "core/fault.h"
#include "exec/wait.h"
#include "core/group.h"
#include "core/param.h"
#include "exec/lane.h"
#include "exec/sig.h"
#include "exec/wait.h"

WEFT_PARAM(SigCheck, "WEFT_CHECK", 1,
           "check that every rank called the same operation (collective, count, datatype, op, "
           "root, peer, sequence) from a hash in each slice's header (0: off)");
WEFT_PARAM(HangReport, "WEFT_HANG_REPORT", 0,
           "seconds an operation may make no progress before each rank prints a hang report "
           "(the operation goes on waiting; 0: only at the WEFT_TIMEOUT deadline)");

WEFT_PARAM_DECL(Timeout);

/* Bootstrap tag of every note (outside the split tags, 0x5753xxxx). */
#define WEFT_SIG_TAG (0x57530000 - 0x100)
/* How long a rank that failed on a mismatch waits for the other side's signature: the wait ends
 * when it arrives (milliseconds on an idle machine); 1 s was too short for a rank descheduled on
 * a loaded machine (sig-root in CI, 2 cores running tests in parallel). */
#define WEFT_SIG_GATHER_NS 5000000000ull
/* How long one note may take to send. A new bootstrap link's handshake is answered by the
 * peer's admission thread (bootstrap.h), busy or asleep as its caller may be, as soon as that
 * thread is scheduled (200 ms was too short on a 2-core machine at load 16). The bound is for a
 * rank that left unnoticed: it refuses connections. */
#define WEFT_SIG_NOTE_SEND_MS 2000
/* Tries to tell a peer where a blocked operation waits: a note that failed (the peer busy, a
 * timeout under load) is sent again at the next check (100 ms later), up to this many times per
 * operation; every later note tries every live peer again. A peer known dead is never tried. */
#define WEFT_SIG_TELL_TRIES 3
/* sig_comm.tell[r]: rank r has the STATE note of the operation told_seq names. */
#define WEFT_SIG_TOLD 0xff
/* A MISMATCH note that failed is sent again this often while its sender waits for the answer. */
#define WEFT_SIG_RESEND_NS 100000000ull
/* A blocked operation tells every rank where it is after this long (or sooner, see below). */
#define WEFT_SIG_TELL_NS 1000000000ull

int weft_sig_enabled(void)
{
    return weft_param_SigCheck() != 0;
}

ncclResult_t weft_sig_init(struct ncclComm *comm)
{
    struct weft_sig_comm *s = calloc(1, sizeof(*s));
    uint64_t *seq = calloc(2 * (size_t)comm->nranks, sizeof(*seq));
    struct weft_sig_note *notes = calloc((size_t)comm->nranks, sizeof(*notes));
    uint8_t *tell = calloc((size_t)comm->nranks, 1);
    struct weft_op_rec *hist = calloc(WEFT_SIG_HISTORY, sizeof(*hist));
    if (s == NULL || seq == NULL || notes == NULL || tell == NULL || hist == NULL) {
        free(s);
        free(seq);
        free(notes);
        free(tell);
        free(hist);
        WEFT_WARN("out of memory for the operation records of %d ranks", comm->nranks);
        return ncclSystemError;
    }
    s->p2p_seq = seq;
    for (int k = 0; k < WEFT_SIG_PREFIX_KINDS; k++)
        s->prefix_of[k].coll = -1;
    s->notes = notes;
    s->tell = tell;
    s->hist = hist;
    s->cap = WEFT_SIG_HISTORY;
    comm->sig = s;
    return ncclSuccess;
}

void weft_sig_fini(struct ncclComm *comm)
{
    if (comm->sig == NULL)
        return;
    free(comm->sig->p2p_seq);
    free(comm->sig->notes);
    free(comm->sig->tell);
    free(comm->sig->hist);
    free(comm->sig);
    comm->sig = NULL;
}

/* One multiply per word (a byte-wise FNV cost ~50 ns per operation on the 8 B fast path). */
static uint64_t sig_mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static int sig_is_p2p(int coll)
{
    return coll == WEFT_COLL_SEND || coll == WEFT_COLL_RECV;
}

/* A send is hashed as the matching receive hashes it: (sender, receiver, their pair's count).
 * Everything but the sequence number (mixed in last, by sig_hash_one). */
static uint64_t sig_hash_prefix(const struct ncclComm *comm, const struct weft_op_sig *g)
{
    uint64_t h = 0x6a09e667f3bcc909ull;
    if (sig_is_p2p(g->coll)) {
        int src = g->coll == WEFT_COLL_SEND ? comm->rank : g->root;
        int dst = g->coll == WEFT_COLL_SEND ? g->root : comm->rank;
        h = sig_mix(h, 0x7032700000000000ull ^ ((uint64_t)(uint32_t)src << 24) ^ (uint32_t)dst);
    } else {
        h = sig_mix(h, (uint64_t)(uint32_t)g->coll | ((uint64_t)(uint32_t)g->root << 32));
    }
    h = sig_mix(h, (uint64_t)(uint32_t)g->dtype | ((uint64_t)(uint32_t)g->redop << 32));
    return sig_mix(h, g->count);
}

static uint64_t sig_hash_one(const struct ncclComm *comm, const struct weft_op_sig *g)
{
    return sig_mix(sig_hash_prefix(comm, g), g->seq);
}

/* sig_hash_one through the communicator's cache of prefixes, one per kind (collectives, sends,
 * receives): ~10 ns less per operation when the call repeats, the 8 B path's case. */
static uint64_t sig_hash_cached(const struct ncclComm *comm, struct weft_sig_comm *s,
                                const struct weft_op_sig *g)
{
    int kind = g->coll == WEFT_COLL_SEND ? 1 : g->coll == WEFT_COLL_RECV ? 2 : 0;
    struct weft_op_sig *k = &s->prefix_of[kind];
    if (k->coll != g->coll || k->root != g->root || k->dtype != g->dtype ||
        k->redop != g->redop || k->count != g->count) {
        *k = *g;
        s->prefix[kind] = sig_hash_prefix(comm, g);
    }
    return sig_mix(s->prefix[kind], g->seq);
}

/* Record i of the ring (cap is a power of two). */
static inline struct weft_op_rec *sig_slot(const struct weft_sig_comm *s, uint64_t i)
{
    return &s->hist[i & (s->cap - 1)];
}

/* The next sequence number of g's kind: collectives, sends to a peer, receives from one. */
static uint64_t sig_next_seq(struct weft_sig_comm *s, const struct weft_op_sig *g)
{
    return sig_is_p2p(g->coll) ? ++s->p2p_seq[2 * g->root + (g->coll == WEFT_COLL_RECV)]
                               : ++s->coll_seq;
}

static void sig_from_task(const struct weft_task *t, struct weft_op_sig *g)
{
    g->seq = 0;
    g->hash = 0;
    g->coll = t->coll;
    g->count = t->count;
    g->dtype = t->dtype;
    g->redop = t->has_redop ? t->redop.kind | (t->redop.premul ? 0x10 : 0) |
                                  (t->redop.postdiv ? 0x20 : 0)
                            : -1;
    g->root = t->root;
    g->nfused = 1;
}

/*
 * Makes room for record s->nhist: the ring doubles when the slot it would take holds a record
 * still in flight (begun, not ended: a group of more operations than the ring holds), whose
 * lanes and messages read it. Without memory the old record is overwritten (its name may then
 * be wrong in messages; nothing else depends on it).
 */
static void sig_hist_room(struct weft_sig_comm *s)
{
    if (s->nhist < s->cap || sig_slot(s, s->nhist)->end_ns != 0)
        return;
    uint64_t cap = 2 * s->cap;
    struct weft_op_rec *hist = malloc(cap * sizeof(*hist));
    if (hist == NULL) {
        WEFT_WARN("out of memory for %llu operation records: an operation in flight loses its "
                  "name in messages", (unsigned long long)cap);
        return;
    }
    for (uint64_t i = s->nhist - s->cap; i < s->nhist; i++)
        hist[i & (cap - 1)] = *sig_slot(s, i);
    free(s->hist);
    s->hist = hist;
    s->cap = cap;
}

void weft_sig_begin(struct ncclComm *comm, const struct weft_task *tasks, int n,
                    const struct weft_task *merged, uint64_t *rec_p)
{
    struct weft_sig_comm *s = comm->sig;
    sig_hist_room(s);
    uint64_t rec = s->nhist++;
    struct weft_op_rec *r = sig_slot(s, rec);
    sig_from_task(merged, &r->sig);
    uint64_t h = 0;
    if (n == 1) { /* the common case: the prefix cache's */
        r->sig.seq = sig_next_seq(s, &r->sig);
        h = sig_hash_cached(comm, s, &r->sig);
    } else { /* fused all-reduces: every member's signature, in order */
        for (int k = 0; k < n; k++) {
            struct weft_op_sig g;
            sig_from_task(&tasks[k], &g);
            g.seq = sig_next_seq(s, &g);
            if (k == 0)
                r->sig.seq = g.seq;
            h = k == 0 ? sig_hash_one(comm, &g) : sig_mix(h, sig_hash_one(comm, &g));
        }
    }
    r->sig.nfused = n;
    uint32_t h32 = (uint32_t)(h ^ (h >> 32));
    r->sig.hash = h32 != 0 ? h32 : 1;
    r->precise = merged->enq_ns != 0;
    r->start_ns = r->precise ? weft_time_ns() : weft_time_coarse_ns();
    r->end_ns = 0;
    r->op_seq = comm->op_seq;
    r->failed = 0;
    *rec_p = rec;
}

void weft_sig_end(struct ncclComm *comm, uint64_t rec, int failed)
{
    struct weft_sig_comm *s = comm->sig;
    struct weft_op_rec *r = sig_slot(s, rec);
    r->end_ns = r->precise ? weft_time_ns() : weft_time_coarse_ns();
    r->failed = failed;
    if (!failed && !sig_is_p2p(r->sig.coll))
        s->last_coll = r->sig;
}

int weft_sig_find(const struct ncclComm *comm, uint32_t hash, uint64_t *rec_p)
{
    const struct weft_sig_comm *s = comm->sig;
    uint64_t first = s->nhist > s->cap ? s->nhist - s->cap : 0;
    for (uint64_t i = s->nhist; i > first; i--)
        if (sig_slot(s, i - 1)->sig.hash == hash) {
            *rec_p = i - 1;
            return 1;
        }
    return 0;
}

int weft_sig_find_op(const struct ncclComm *comm, uint64_t op_seq, uint64_t *rec_p)
{
    const struct weft_sig_comm *s = comm->sig;
    uint64_t first = s->nhist > s->cap ? s->nhist - s->cap : 0;
    for (uint64_t i = s->nhist; i > first; i--)
        if (sig_slot(s, i - 1)->op_seq == op_seq) {
            *rec_p = i - 1;
            return 1;
        }
    return 0;
}

const struct weft_op_sig *weft_sig_of(const struct ncclComm *comm, uint64_t rec)
{
    return &sig_slot(comm->sig, rec)->sig;
}

const struct weft_op_rec *weft_sig_rec(const struct ncclComm *comm, uint64_t rec)
{
    return sig_slot(comm->sig, rec);
}

static const char *sig_coll_api(int coll)
{
    static const char *const names[WEFT_COLL_COUNT] = {
        "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
        "ncclAlltoAll",  "ncclGather",    "ncclScatter",       "ncclSend",      "ncclRecv",
    };
    return coll >= 0 && coll < WEFT_COLL_COUNT ? names[coll] : "an unknown operation";
}

static const char *sig_dtype_name(int dtype)
{
    static const char *const names[WEFT_NUM_DTYPES] = {
        "int8", "uint8", "int32", "uint32", "int64", "uint64",
        "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2",
    };
    return dtype >= 0 && dtype < WEFT_NUM_DTYPES ? names[dtype] : "unknown type";
}

static const char *sig_redop_name(int redop)
{
    if (redop & 0x10)
        return "premulsum";
    if (redop & 0x20)
        return "avg";
    static const char *const names[4] = {"sum", "prod", "max", "min"};
    return redop >= 0 && redop < 4 ? names[redop] : "unknown op";
}

void weft_sig_format(const struct weft_op_sig *g, char *buf, size_t len)
{
    char extra[48] = "";
    if (g->redop >= 0)
        snprintf(extra, sizeof(extra), ", %s", sig_redop_name(g->redop));
    else if (sig_is_p2p(g->coll))
        snprintf(extra, sizeof(extra), ", peer %d", g->root);
    else if (g->coll == WEFT_COLL_BROADCAST || g->coll == WEFT_COLL_REDUCE ||
             g->coll == WEFT_COLL_GATHER || g->coll == WEFT_COLL_SCATTER)
        snprintf(extra, sizeof(extra), ", root %d", g->root);
    if (g->coll == WEFT_COLL_REDUCE)
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), ", root %d", g->root);
    char fused[24] = "";
    if (g->nfused > 1)
        snprintf(fused, sizeof(fused), "; %d fused", g->nfused);
    snprintf(buf, len, "%s(count %llu, %s%s%s) #%llu", sig_coll_api(g->coll),
             (unsigned long long)g->count, sig_dtype_name(g->dtype), extra, fused,
             (unsigned long long)g->seq);
}

/* ---------------------------------------------------------------------------------------------
 * Notes
 * ------------------------------------------------------------------------------------------- */

static void sig_note_fill(struct ncclComm *comm, uint32_t kind, const struct weft_op_sig *cur,
                          int waits_on, int waits_send, int about, struct weft_sig_note *n)
{
    memset(n, 0, sizeof(*n));
    n->version = WEFT_SIG_NOTE_VERSION;
    n->kind = kind;
    n->rank = comm->rank;
    n->waits_on = waits_on;
    n->waits_send = waits_send;
    n->about = about;
    n->cur = *cur;
    n->last = comm->sig->last_coll;
}

/*
 * To rank r unless its process is known dead; 1 when sent. A failure (the peer busy, a timeout
 * under load) silences nothing: the next note tries r again.
 */
static int sig_note_send(struct ncclComm *comm, int r, const struct weft_sig_note *n)
{
    if (comm->bootstrap == NULL || r == comm->rank || !weft_comm_peer_alive(comm, r))
        return 0;
    ncclResult_t res = WEFT_FAULT_ARMED() && weft_fault_note(comm->rank, r)
                           ? ncclSystemError
                           : weft_bootstrap_send_brief(comm->bootstrap, r, WEFT_SIG_TAG, n,
                                                       sizeof(*n), WEFT_SIG_NOTE_SEND_MS);
    if (res != ncclSuccess)
        WEFT_INFO(WEFT_LOG_COLL, "rank %d: could not tell rank %d about operation #%llu",
                  comm->rank, r, (unsigned long long)n->cur.seq);
    return res == ncclSuccess;
}

/* Same kind of sequence (collectives count together; point-to-point per peer). */
static int sig_same_stream(const struct weft_op_sig *a, const struct weft_op_sig *b)
{
    return !sig_is_p2p(a->coll) && !sig_is_p2p(b->coll);
}

/* Reads every note that arrived into comm->sig->notes. */
static void sig_note_drain(struct ncclComm *comm)
{
    struct weft_sig_comm *s = comm->sig;
    if (comm->bootstrap == NULL)
        return;
    for (;;) {
        struct weft_sig_note n;
        int peer = -1, got = 0;
        if (weft_bootstrap_try_recv(comm->bootstrap, WEFT_SIG_TAG, &n, sizeof(n), &peer, &got) !=
                ncclSuccess ||
            !got)
            return;
        if (n.version == WEFT_SIG_NOTE_VERSION && n.rank == peer)
            s->notes[peer] = n;
    }
}

/*
 * The rank whose note reveals a mismatch with `mine`, or -1: a MISMATCH note about this operation
 * or an earlier one this rank has not failed already (one about a later operation waits until
 * this rank gets there: this one may still complete), or a STATE note for the same collective
 * with another hash.
 */
static int sig_note_mismatch(const struct ncclComm *comm, const struct weft_op_sig *mine)
{
    const struct weft_sig_comm *s = comm->sig;
    for (int r = 0; r < comm->nranks; r++) {
        const struct weft_sig_note *n = &s->notes[r];
        if (r == comm->rank || n->version == 0 ||
            sig_is_p2p(n->cur.coll) != sig_is_p2p(mine->coll))
            continue;
        if (n->kind == WEFT_SIG_NOTE_MISMATCH &&
            (sig_is_p2p(mine->coll) || (n->cur.seq <= mine->seq && n->cur.seq >= s->mismatch_seq)))
            return r;
        if (n->kind == WEFT_SIG_NOTE_STATE && !sig_is_p2p(mine->coll) && n->cur.seq == mine->seq &&
            n->cur.hash != mine->hash)
            return r;
    }
    return -1;
}

/* Whether rank r's latest note shows another call than `mine`. */
static int sig_differs(const struct ncclComm *comm, int r, const struct weft_op_sig *mine)
{
    const struct weft_sig_note *n = &comm->sig->notes[r];
    return r != comm->rank && n->version != 0 && n->cur.seq != 0 &&
           (n->cur.hash != mine->hash || n->cur.seq != mine->seq);
}

/* The rank whose latest note shows another call than `mine` (`peer` first), or -1. */
static int sig_other(const struct ncclComm *comm, const struct weft_op_sig *mine, int peer)
{
    if (peer >= 0 && sig_differs(comm, peer, mine))
        return peer;
    if (sig_is_p2p(mine->coll))
        return -1; /* only the pair is involved */
    for (int r = 0; r < comm->nranks; r++)
        if (sig_differs(comm, r, mine))
            return r;
    return -1;
}

ncclResult_t weft_sig_mismatch(struct ncclComm *comm, uint64_t rec, int peer, uint32_t got)
{
    struct weft_sig_comm *s = comm->sig;
    const struct weft_op_sig *mine = weft_sig_of(comm, rec);
    /* Notes about other operations (a stall long ago) must not be named as the other call. */
    for (int r = 0; r < comm->nranks; r++)
        if (s->notes[r].cur.seq != mine->seq ||
            sig_is_p2p(s->notes[r].cur.coll) != sig_is_p2p(mine->coll))
            memset(&s->notes[r], 0, sizeof(s->notes[r]));
    struct weft_sig_note n;
    sig_note_fill(comm, WEFT_SIG_NOTE_MISMATCH, mine, -1, 0, peer, &n);
    /* Only the pair is involved in point-to-point: the other ranks' operations go on. */
    int everyone = !sig_is_p2p(mine->coll);
    /* unsent[r]: 1 + the tries again of a note to r that failed (the peer busy, a timeout under
     * load); sent again while this rank waits for the answer, which r can give only once it has
     * heard, WEFT_SIG_TELL_TRIES times at most. */
    uint8_t *unsent = calloc((size_t)comm->nranks, 1);
    for (int r = 0; r < comm->nranks; r++)
        if ((everyone || r == peer) && r != comm->rank && !sig_note_send(comm, r, &n) &&
            unsent != NULL)
            unsent[r] = 1;
    s->mismatch_seq = mine->seq + 1;
    /* Wait for the other side's signature: it answers once it hears ours (or finds it too). */
    uint64_t t0 = weft_time_ns(), resent = t0;
    int other = -1;
    for (;;) {
        sig_note_drain(comm);
        other = sig_other(comm, mine, peer);
        uint64_t now = weft_time_ns();
        int pending = 0; /* ranks that still wait for this note, though this rank has its answer */
        if (unsent != NULL && now - resent > WEFT_SIG_RESEND_NS) {
            resent = now;
            for (int r = 0; r < comm->nranks; r++)
                if (unsent[r] && (sig_note_send(comm, r, &n) || ++unsent[r] > WEFT_SIG_TELL_TRIES))
                    unsent[r] = 0; /* sent, or given up: r may have left (refusing connections) */
        }
        for (int r = 0; unsent != NULL && r < comm->nranks; r++)
            pending |= unsent[r];
        if ((other >= 0 && !pending) || now - t0 > WEFT_SIG_GATHER_NS ||
            __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
            break;
        usleep(2000);
    }
    free(unsent);
    char a[160], b[160];
    weft_sig_format(mine, a, sizeof(a));
    if (other >= 0) {
        weft_sig_format(&s->notes[other].cur, b, sizeof(b));
        int lo = comm->rank < other ? comm->rank : other;
        WEFT_WARN("rank %d: operations differ between ranks: rank %d called %s, rank %d called %s",
                  comm->rank, lo, lo == comm->rank ? a : b, lo == comm->rank ? other : comm->rank,
                  lo == comm->rank ? b : a);
    } else {
        /* No word from a rank with another call: name the one the detector named. */
        int odd = peer;
        if (peer >= 0 && s->notes[peer].version != 0 && s->notes[peer].about >= 0 &&
            s->notes[peer].cur.hash == mine->hash)
            odd = s->notes[peer].about;
        WEFT_WARN("rank %d: operations differ between ranks: rank %d called %s, rank %d called "
                  "another operation (signature 0x%08x; it did not say which)",
                  comm->rank, comm->rank, a, odd, odd == peer ? got : 0u);
    }
    /* Heard: a point-to-point note must not fail the next send or receive too. */
    for (int r = 0; r < comm->nranks; r++)
        if (s->notes[r].kind == WEFT_SIG_NOTE_MISMATCH && sig_is_p2p(s->notes[r].cur.coll))
            s->notes[r].kind = WEFT_SIG_NOTE_STATE;
    return ncclInvalidUsage;
}

/* ---------------------------------------------------------------------------------------------
 * Report
 * ------------------------------------------------------------------------------------------- */

struct sig_text {
    char buf[8192];
    size_t len;
};

static void sig_text_add(struct sig_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sig_text_add(struct sig_text *t, const char *fmt, ...)
{
    if (t->len >= sizeof(t->buf) - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, sizeof(t->buf) - t->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len += (size_t)n < sizeof(t->buf) - t->len ? (size_t)n : sizeof(t->buf) - 1 - t->len;
}

/* Whether rank r's latest note says it entered (or finished) collective `mine`. */
static int sig_entered(const struct weft_sig_note *n, const struct weft_op_sig *mine)
{
    if (n->version == 0)
        return 0;
    if (n->last.seq >= mine->seq)
        return 1;
    return sig_same_stream(&n->cur, mine) && n->cur.seq >= mine->seq;
}

/* Ranks that never said they entered collective `mine`, as "3, 5" into buf; their number. */
static int sig_missing(const struct ncclComm *comm, const struct weft_op_sig *mine, char *buf,
                       size_t len)
{
    int nmiss = 0;
    size_t off = 0;
    buf[0] = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank || sig_entered(&comm->sig->notes[r], mine))
            continue;
        if (off < len)
            off += (size_t)snprintf(buf + off, len - off, "%s%d", nmiss ? ", " : "", r);
        nmiss++;
    }
    return nmiss;
}

static void sig_report_print(struct ncclComm *comm, const struct weft_sig_wait *w, uint64_t idle_ns,
                             const char *why)
{
    struct weft_sig_comm *s = comm->sig;
    struct sig_text *t = malloc(sizeof(*t));
    if (t == NULL)
        return;
    t->len = 0;
    uint64_t now = weft_time_ns(); /* not before any record's time, coarse or precise */
    const struct weft_peer_info *self = &comm->peer_info[comm->rank];
    char a[160];
    sig_text_add(t, "weft hang report (%s): rank %d of %d (host %s, pid %d), communicator 0x%llx\n",
                 why, comm->rank, comm->nranks, self->hostname, self->pid,
                 (unsigned long long)comm->comm_hash);
    const struct weft_op_sig *mine = NULL;
    if (w != NULL) {
        const struct weft_op_rec *r = sig_slot(s, w->rec);
        mine = &r->sig;
        weft_sig_format(mine, a, sizeof(a));
        sig_text_add(t, "  stuck: %s, started %.3f s ago, no progress for %.3f s\n", a,
                     (now - r->start_ns) * 1e-9, idle_ns * 1e-9);
        if (w->peer >= 0) {
            sig_text_add(t, "  waits for %s from peer %d (host %s)",
                         w->send ? "buffer space" : "data", w->peer,
                         comm->peer_info[w->peer].hostname);
            if (w->send_conn != NULL)
                sig_text_add(t, "; to it: %llu steps posted, %llu freed by it",
                             (unsigned long long)w->send_conn->step,
                             (unsigned long long)__atomic_load_n(&w->send_conn->ctrl->head,
                                                                 __ATOMIC_ACQUIRE));
            if (w->recv_conn != NULL)
                sig_text_add(t, "; from it: %llu steps received", 
                             (unsigned long long)w->recv_conn->step);
            sig_text_add(t, "\n");
        }
    } else {
        sig_text_add(t, "  no operation in flight\n");
    }
    for (int p = 0; p < comm->nranks; p++) {
        if (p == comm->rank)
            continue;
        const struct weft_sig_note *n = &s->notes[p];
        if (n->version == 0) {
            sig_text_add(t, "  peer %d: no word from it\n", p);
            continue;
        }
        char c[160], l[160] = "none";
        weft_sig_format(&n->cur, c, sizeof(c));
        if (n->last.seq != 0)
            weft_sig_format(&n->last, l, sizeof(l));
        sig_text_add(t, "  peer %d: %s %s", p,
                     n->kind == WEFT_SIG_NOTE_MISMATCH ? "failed in" : "was in", c);
        if (n->waits_on >= 0)
            sig_text_add(t, ", waiting for %s from peer %d", n->waits_send ? "buffer space" : "data",
                         n->waits_on);
        sig_text_add(t, "; last completed %s\n", l);
    }
    uint64_t first = s->nhist > 8 ? s->nhist - 8 : 0;
    sig_text_add(t, "  recent operations:\n");
    for (uint64_t i = first; i < s->nhist; i++) {
        const struct weft_op_rec *r = sig_slot(s, i);
        weft_sig_format(&r->sig, a, sizeof(a));
        if (r->end_ns != 0)
            sig_text_add(t, "    %s: %s in %.3f s, %.3f s ago\n", a, r->failed ? "failed" : "done",
                         (r->end_ns - r->start_ns) * 1e-9, (now - r->end_ns) * 1e-9);
        else
            sig_text_add(t, "    %s: running for %.3f s\n", a, (now - r->start_ns) * 1e-9);
    }
    if (mine != NULL && !sig_is_p2p(mine->coll)) {
        char miss[256];
        int nmiss = sig_missing(comm, mine, miss, sizeof(miss));
        weft_sig_format(mine, a, sizeof(a));
        if (nmiss > 0)
            sig_text_add(t, "  %s: rank%s %s did not say %s entered %s\n",
                         comm->rank == 0 ? "job summary" : "not entered", nmiss > 1 ? "s" : "",
                         miss, nmiss > 1 ? "they" : "it", a);
        else if (comm->rank == 0)
            sig_text_add(t, "  job summary: every rank entered %s\n", a);
    }
    ssize_t wr = write(STDERR_FILENO, t->buf, t->len);
    (void)wr;
    free(t);
}

/* Sends the STATE note of the blocked operation to every rank that does not have it yet (each
 * rank WEFT_SIG_TELL_TRIES times at most). */
static void sig_tell(struct ncclComm *comm, const struct weft_sig_wait *w)
{
    struct weft_sig_comm *s = comm->sig;
    if (s->told_seq != w->rec + 1) {
        s->told_seq = w->rec + 1;
        memset(s->tell, 0, (size_t)comm->nranks);
    }
    struct weft_sig_note n;
    int filled = 0;
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank || s->tell[r] == WEFT_SIG_TOLD || s->tell[r] >= WEFT_SIG_TELL_TRIES)
            continue;
        if (!filled) {
            sig_note_fill(comm, WEFT_SIG_NOTE_STATE, weft_sig_of(comm, w->rec), w->peer, w->send,
                          -1, &n);
            filled = 1;
        }
        s->tell[r] = sig_note_send(comm, r, &n) ? WEFT_SIG_TOLD : s->tell[r] + 1;
    }
}

ncclResult_t weft_sig_poll(struct ncclComm *comm, const struct weft_sig_wait *w, uint64_t idle_ns)
{
    struct weft_sig_comm *s = comm->sig;
    const struct weft_op_sig *mine = weft_sig_of(comm, w->rec);
    sig_note_drain(comm);
    int bad = weft_sig_enabled() ? sig_note_mismatch(comm, mine) : -1;
    if (bad >= 0) {
        const struct weft_sig_note *n = &s->notes[bad];
        /* It found a mismatch, or its state shows one: our side fails the same way. */
        return weft_sig_mismatch(comm, w->rec, bad, n->cur.hash);
    }
    uint64_t report_ns = (uint64_t)weft_param_HangReport() * 1000000000ull;
    uint64_t tell_ns = WEFT_SIG_TELL_NS;
    if (report_ns != 0 && report_ns / 2 < tell_ns)
        tell_ns = report_ns / 2; /* the others' notes are in when the report prints */
    if (idle_ns >= tell_ns)
        sig_tell(comm, w);
    int req = __atomic_exchange_n(&s->report_req, 0, __ATOMIC_ACQ_REL);
    if (req || (report_ns != 0 && idle_ns >= report_ns && s->reported != w->rec + 1)) {
        s->reported = w->rec + 1;
        sig_report_print(comm, w, idle_ns, req ? "requested" : "WEFT_HANG_REPORT");
    }
    return ncclSuccess;
}

ncclResult_t weft_sig_deadline(struct ncclComm *comm, const struct weft_sig_wait *w,
                               uint64_t idle_ns, char *msg, size_t len)
{
    struct weft_sig_comm *s = comm->sig;
    const struct weft_op_sig *mine = weft_sig_of(comm, w->rec);
    sig_tell(comm, w);
    /* The others reach their deadlines about now too: give their notes a moment. */
    uint64_t t0 = weft_time_ns();
    char miss[256];
    for (;;) {
        sig_note_drain(comm);
        int bad = weft_sig_enabled() ? sig_note_mismatch(comm, mine) : -1;
        if (bad >= 0)
            return weft_sig_mismatch(comm, w->rec, bad, s->notes[bad].cur.hash);
        if (sig_is_p2p(mine->coll) || sig_missing(comm, mine, miss, sizeof(miss)) == 0 ||
            weft_time_ns() - t0 > 500000000ull)
            break;
        usleep(5000);
    }
    s->reported = w->rec + 1;
    sig_report_print(comm, w, idle_ns, "deadline");
    if (sig_is_p2p(mine->coll))
        return ncclSuccess;
    int nmiss = sig_missing(comm, mine, miss, sizeof(miss));
    size_t off = strlen(msg);
    if (nmiss > 0 && off < len) {
        char a[160];
        weft_sig_format(mine, a, sizeof(a));
        snprintf(msg + off, len - off, "; rank%s %s did not enter %s", nmiss > 1 ? "s" : "", miss,
                 a);
    }
    return ncclSuccess;
}

ncclResult_t weft_sig_request_report(struct ncclComm *comm)
{
    if (comm->sig == NULL)
        return ncclSuccess;
    /* 1: the caller's own hold (weft_comm_enter); more: an operation runs, and reports at its
     * next check. */
    if (__atomic_load_n(&comm->busy, __ATOMIC_ACQUIRE) <= 1) {
        sig_report_print(comm, NULL, 0, "requested");
        return ncclSuccess;
    }
    __atomic_store_n(&comm->sig->report_req, 1, __ATOMIC_RELEASE);
    return ncclSuccess;
}
