/*
 * gloo_perf: Gloo's collectives on host memory, measured by the very driver the *_perf tools use
 * (perf/common.c built with -DPERF_NO_NCCL: same sweep, timing, bit-exact validation, table and -J
 * JSON lines, library "gloo"), over the collectives of colls.c (geometry, data, expected values,
 * busbw factors). This file is a Gloo backend (struct perf_backend) and the Gloo calls.
 *
 *   weftrun -n 4 gloo_perf all_reduce -b 8 -e 64M -f 4 -J out.json
 *   weftrun -n 4 gloo_perf all_reduce:ring_chunked,halving_doubling -b 1M -e 1M
 *
 * Launch: run N copies under a launcher. Rank and size come from WEFT_RANK/WEFT_NRANKS (weftrun),
 * OMPI_COMM_WORLD_RANK/_SIZE or PMI_RANK/PMI_SIZE. The ranks meet in a gloo::rendezvous::FileStore
 * in GLOO_PERF_STORE, by default /tmp/gloo-perf-<hash of WEFT_UNIQUE_ID> (rank 0 removes it at the
 * end); transport is gloo::transport::tcp on 127.0.0.1 (GLOO_PERF_HOST). GLOO_PERF_TIMEOUT (s,
 * default 600) bounds every Gloo wait.
 *
 * Collectives and algorithms (Debian's libgloo-dev, gloo 0.5.0 of 2022-05):
 *   all_reduce      ring, bcube (gloo::allreduce); ring_chunked, halving_doubling, bcube_legacy
 *                   (legacy in-place classes; bcube_legacy only on 2^k ranks: wrong sums on 3)
 *   all_gather      allgather (gloo::allgather)
 *   reduce_scatter  halving_doubling (ReduceScatterHalvingDoubling, the only one Gloo has)
 *   broadcast       broadcast (gloo::broadcast); one_to_all (BroadcastOneToAll)
 *   reduce          reduce (gloo::reduce)
 *   alltoall        alltoall (gloo::alltoall)
 *   sendrecv        ring: every rank sends to rank+1 and receives from rank-1 (unbound buffers)
 *   gather, scatter gather, scatter (gloo::gather, gloo::scatter)
 * With several algorithms, the first call of each measured size (the untimed synchronising op of
 * its out-of-place row) times each one (1 warm-up + k calls, k = 5/3/1 by size), takes the max
 * over ranks and keeps the fastest for the size (both halves of the row); rank 0 then appends
 * "algorithm":"<name>" to every -J line and prints the choices. "coll:a,b" restricts the
 * candidates (GLOO_PERF_ALGOS does too).
 *
 * Every algorithm runs on its own context (own TCP connections, same device), connected at its
 * first use; the driver's barriers and reductions use another. Sharing one was not safe in this
 * Gloo: after a legacy class had run on a context, gloo::allreduce's ring on it took ~3.7 s per
 * 4 MiB call at 4 ranks.
 *
 * Legacy classes bind to their buffers when built and work in place. They are built per buffer
 * set in that untimed first call, for every rotation slot the timed loop will use, and dropped at
 * the next row. Out of place, the call first copies send into recv (part of the measured time: it
 * is what a user of these classes pays). ReduceScatterHalvingDoubling leaves rank r's block at the
 * start of the buffer: in place it is moved to rank*count, out of place the input is copied to a
 * scratch buffer first. In-place alltoall and sendrecv copy the input to a scratch buffer, since
 * Gloo reads the input while it receives into the output.
 *
 * Types int8, uint8, int32, uint32, int64, uint64, float, double; ops sum, prod, max, min.
 */
#include <dirent.h>
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/config.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

extern "C" {
#include "common.h"
}

namespace {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

/* ---------------------------------------------------------------------------------------------
 * Process state
 * ------------------------------------------------------------------------------------------- */

struct GpState {
    std::shared_ptr<gloo::rendezvous::Context> ctx; /* the driver's own barriers and reductions */
    std::shared_ptr<gloo::rendezvous::Context> run_ctx; /* the algorithm being run (see exec) */
    std::shared_ptr<gloo::transport::Device> dev;
    std::unique_ptr<gloo::rendezvous::FileStore> store;
    std::string store_dir;
    Ms timeout{600000};
    int rank = 0, nranks = 1;
    char last_error[512] = "";
};
GpState g;

/* Reads rank and size from the launcher's environment; false when none is there. */
bool launcher_env(int *rank_p, int *size_p)
{
    static const char *const pairs[][2] = {
        {"WEFT_RANK", "WEFT_NRANKS"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"},
    };
    for (const auto &p : pairs) {
        const char *r = getenv(p[0]), *s = getenv(p[1]);
        if (r != nullptr && s != nullptr) {
            *rank_p = atoi(r);
            *size_p = atoi(s);
            return true;
        }
    }
    return false;
}

template <typename... A> ncclResult_t fail(const char *fmt, A... args)
{
    snprintf(g.last_error, sizeof(g.last_error), fmt, args...);
    return ncclSystemError;
}

/* Runs fn, turning a Gloo exception into ncclSystemError with its text. */
template <typename F> ncclResult_t guarded(const char *what, F fn)
{
    try {
        fn();
    } catch (const std::exception &e) {
        return fail("%s: %s", what, e.what());
    }
    return ncclSuccess;
}

/* ---------------------------------------------------------------------------------------------
 * Types and reduction functions
 * ------------------------------------------------------------------------------------------- */

using RedFn = void (*)(void *, const void *, const void *, size_t);

template <typename T> RedFn red_fn(int op)
{
    switch (op) {
    case PERF_OP_PROD:
        return static_cast<RedFn>(&gloo::product<T>);
    case PERF_OP_MAX:
        return static_cast<RedFn>(&gloo::max<T>);
    case PERF_OP_MIN:
        return static_cast<RedFn>(&gloo::min<T>);
    default:
        return static_cast<RedFn>(&gloo::sum<T>);
    }
}

template <typename T> const gloo::ReductionFunction<T> *legacy_fn(int op)
{
    switch (op) {
    case PERF_OP_PROD:
        return gloo::ReductionFunction<T>::product;
    case PERF_OP_MAX:
        return gloo::ReductionFunction<T>::max;
    case PERF_OP_MIN:
        return gloo::ReductionFunction<T>::min;
    default:
        return gloo::ReductionFunction<T>::sum;
    }
}

bool type_supported(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclInt32:
    case ncclUint32:
    case ncclInt64:
    case ncclUint64:
    case ncclFloat32:
    case ncclFloat64:
        return true;
    default:
        return false;
    }
}

/* Calls F<T>::call(args...) for the op's type. */
template <template <typename> class F, typename... A> auto by_type(ncclDataType_t t, A &&...args)
{
    switch (t) {
    case ncclInt8:
        return F<int8_t>::call(args...);
    case ncclUint8:
        return F<uint8_t>::call(args...);
    case ncclInt32:
        return F<int32_t>::call(args...);
    case ncclUint32:
        return F<uint32_t>::call(args...);
    case ncclInt64:
        return F<int64_t>::call(args...);
    case ncclUint64:
        return F<uint64_t>::call(args...);
    case ncclFloat64:
        return F<double>::call(args...);
    default:
        return F<float>::call(args...);
    }
}

/* A scratch buffer reused across calls (in-place alltoall/sendrecv, reduce_scatter input). */
std::vector<char> scratch;

char *scratch_get(size_t bytes)
{
    if (scratch.size() < bytes)
        scratch.resize(bytes);
    return scratch.data();
}

/* ---------------------------------------------------------------------------------------------
 * Algorithms. A direct one runs on any pointers; a bound one (legacy class) is built for one
 * (send, recv) pair and then run.
 * ------------------------------------------------------------------------------------------- */

struct Bound {
    virtual ~Bound() = default;
    virtual void run(const void *send, void *recv) = 0;
};

using DirectFn = void (*)(const perf_op *op, const void *send, void *recv);
using MakeFn = std::unique_ptr<Bound> (*)(const perf_op *op, const void *send, void *recv);

struct Algo {
    const char *name;
    DirectFn direct; /* exactly one of direct and make is set */
    MakeFn make;
    bool pow2_only; /* gives wrong results on other rank counts */
};

/* Legacy in-place class over recv; out of place, send is copied into recv first. */
template <typename A> struct InPlaceBound : Bound {
    std::unique_ptr<A> algo;
    size_t bytes;
    explicit InPlaceBound(std::unique_ptr<A> a, size_t b) : algo(std::move(a)), bytes(b)
    {
    }
    void run(const void *send, void *recv) override
    {
        if (send != recv)
            memcpy(recv, send, bytes);
        algo->run();
    }
};

/* ---- all_reduce ---- */

template <typename T> struct ArNew {
    static void call(const perf_op *op, const void *send, void *recv,
                     gloo::AllreduceOptions::Algorithm a)
    {
        gloo::AllreduceOptions o(g.run_ctx);
        o.setAlgorithm(a);
        if (send != recv)
            o.setInput<T>((T *)send, op->c.count);
        o.setOutput<T>((T *)recv, op->c.count);
        o.setReduceFunction(red_fn<T>(op->op));
        o.setTimeout(g.timeout);
        gloo::allreduce(o);
    }
};

void ar_ring(const perf_op *op, const void *send, void *recv)
{
    by_type<ArNew>(op->type->type, op, send, recv, gloo::AllreduceOptions::Algorithm::RING);
}

void ar_bcube(const perf_op *op, const void *send, void *recv)
{
    by_type<ArNew>(op->type->type, op, send, recv, gloo::AllreduceOptions::Algorithm::BCUBE);
}

template <template <typename> class A> struct ArLegacy {
    template <typename T> struct M {
        static std::unique_ptr<Bound> call(const perf_op *op, const void *, void *recv)
        {
            std::vector<T *> ptrs{(T *)recv};
            auto a =
                std::make_unique<A<T>>(g.run_ctx, ptrs, (int)op->c.count, legacy_fn<T>(op->op));
            return std::make_unique<InPlaceBound<A<T>>>(std::move(a), op->c.count * sizeof(T));
        }
    };
    static std::unique_ptr<Bound> make(const perf_op *op, const void *send, void *recv)
    {
        return by_type<M>(op->type->type, op, send, recv);
    }
};

const Algo all_reduce_algos[] = {
    {"ring", ar_ring, nullptr, false},
    {"bcube", ar_bcube, nullptr, false},
    {"ring_chunked", nullptr, ArLegacy<gloo::AllreduceRingChunked>::make, false},
    {"halving_doubling", nullptr, ArLegacy<gloo::AllreduceHalvingDoubling>::make, false},
    /* AllreduceBcube (legacy) returns wrong sums on 3 ranks: only offered on 2^k ranks. */
    {"bcube_legacy", nullptr, ArLegacy<gloo::AllreduceBcube>::make, true},
};

/* ---- reduce_scatter ---- */

template <typename T> struct RsBound : Bound {
    std::unique_ptr<gloo::ReduceScatterHalvingDoubling<T>> algo;
    std::vector<T> work; /* out of place: the input is copied here (the class reduces in place) */
    size_t count;
    RsBound(const perf_op *op, const void *send, void *recv) : count(op->c.count)
    {
        int n = g.nranks;
        std::vector<int> elems(n, (int)count);
        T *base;
        if (send == recv || (const char *)recv == (const char *)send + g.rank * count * sizeof(T)) {
            base = (T *)send; /* in place: the whole n*count buffer */
        } else {
            work.resize(count * n);
            base = work.data();
        }
        std::vector<T *> ptrs{base};
        algo = std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(
            g.run_ctx, ptrs, (int)(count * n), elems, legacy_fn<T>(op->op));
    }
    void run(const void *send, void *recv) override
    {
        size_t bytes = count * sizeof(T);
        if (!work.empty()) {
            memcpy(work.data(), send, bytes * g.nranks);
            algo->run();
            memcpy(recv, work.data(), bytes);
        } else {
            algo->run();
            if (recv != send)
                memmove(recv, send, bytes);
        }
    }
};

template <typename T> struct RsMake {
    static std::unique_ptr<Bound> call(const perf_op *op, const void *send, void *recv)
    {
        return std::make_unique<RsBound<T>>(op, send, recv);
    }
};

std::unique_ptr<Bound> rs_hd(const perf_op *op, const void *send, void *recv)
{
    return by_type<RsMake>(op->type->type, op, send, recv);
}

const Algo reduce_scatter_algos[] = {
    {"halving_doubling", nullptr, rs_hd, false},
};

/* ---- all_gather ---- */

template <typename T> struct AgNew {
    static void call(const perf_op *op, const void *send, void *recv)
    {
        gloo::AllgatherOptions o(g.run_ctx);
        /* No input: the block at rank*count of the output is the input (in place). */
        if ((const char *)send != (const char *)recv + g.rank * op->c.count * sizeof(T))
            o.setInput<T>((T *)send, op->c.count);
        o.setOutput<T>((T *)recv, op->c.count * g.nranks);
        o.setTimeout(g.timeout);
        gloo::allgather(o);
    }
};

void ag_new(const perf_op *op, const void *send, void *recv)
{
    by_type<AgNew>(op->type->type, op, send, recv);
}

/* AllgatherRing (legacy) is left out: it sends straight into the peers' output buffers with no
 * clear-to-send, so data lands before a slower peer's call and is lost if that peer writes its
 * output buffer in between (the validation's poison does; so would a user). */
const Algo all_gather_algos[] = {
    {"allgather", ag_new, nullptr, false},
};

/* ---- broadcast ---- */

template <typename T> struct BcNew {
    static void call(const perf_op *op, const void *send, void *recv)
    {
        gloo::BroadcastOptions o(g.run_ctx);
        if (g.rank == op->root && send != recv)
            o.setInput<T>((T *)send, op->c.count);
        o.setOutput<T>((T *)recv, op->c.count);
        o.setRoot(op->root);
        o.setTimeout(g.timeout);
        gloo::broadcast(o);
    }
};

void bc_new(const perf_op *op, const void *send, void *recv)
{
    by_type<BcNew>(op->type->type, op, send, recv);
}

template <typename T> struct BcOneMake {
    static std::unique_ptr<Bound> call(const perf_op *op, const void *, void *recv)
    {
        std::vector<T *> ptrs{(T *)recv};
        auto a = std::make_unique<gloo::BroadcastOneToAll<T>>(g.run_ctx, ptrs, op->c.count,
                                                              op->root);
        /* Only the root's recv must hold the data before the broadcast. */
        size_t bytes = g.rank == op->root ? op->c.count * sizeof(T) : 0;
        return std::make_unique<InPlaceBound<gloo::BroadcastOneToAll<T>>>(std::move(a), bytes);
    }
};

std::unique_ptr<Bound> bc_one(const perf_op *op, const void *send, void *recv)
{
    return by_type<BcOneMake>(op->type->type, op, send, recv);
}

const Algo broadcast_algos[] = {
    {"broadcast", bc_new, nullptr, false},
    {"one_to_all", nullptr, bc_one, false},
};

/* ---- reduce ---- */

template <typename T> struct RdNew {
    static void call(const perf_op *op, const void *send, void *recv)
    {
        gloo::ReduceOptions o(g.run_ctx);
        if (send != recv)
            o.setInput<T>((T *)send, op->c.count);
        o.setOutput<T>((T *)recv, op->c.count);
        o.setRoot(op->root);
        o.setReduceFunction(red_fn<T>(op->op));
        o.setTimeout(g.timeout);
        gloo::reduce(o);
    }
};

void rd_new(const perf_op *op, const void *send, void *recv)
{
    by_type<RdNew>(op->type->type, op, send, recv);
}

const Algo reduce_algos[] = {
    {"reduce", rd_new, nullptr, false},
};

/* ---- alltoall ---- */

template <typename T> struct A2aNew {
    static void call(const perf_op *op, const void *send, void *recv)
    {
        size_t n = op->c.count * g.nranks;
        gloo::AlltoallOptions o(g.run_ctx);
        if (send == recv) {
            char *s = scratch_get(n * sizeof(T));
            memcpy(s, send, n * sizeof(T));
            send = s;
        }
        o.setInput<T>((T *)send, n);
        o.setOutput<T>((T *)recv, n);
        o.setTimeout(g.timeout);
        gloo::alltoall(o);
    }
};

void a2a_new(const perf_op *op, const void *send, void *recv)
{
    by_type<A2aNew>(op->type->type, op, send, recv);
}

const Algo alltoall_algos[] = {
    {"alltoall", a2a_new, nullptr, false},
};

/* ---- sendrecv (ring) ---- */

constexpr uint64_t kSendrecvSlot = 0x5e0d;

void sr_ring(const perf_op *op, const void *send, void *recv)
{
    size_t bytes = op->c.count * op->type->size;
    int next = (g.rank + 1) % g.nranks, prev = (g.rank + g.nranks - 1) % g.nranks;

    if (send == recv) {
        char *s = scratch_get(bytes);
        memcpy(s, send, bytes);
        send = s;
    }
    if (g.nranks == 1) {
        memcpy(recv, send, bytes);
        return;
    }
    auto sb = g.run_ctx->createUnboundBuffer(const_cast<void *>(send), bytes);
    auto rb = g.run_ctx->createUnboundBuffer(recv, bytes);
    rb->recv(prev, kSendrecvSlot);
    sb->send(next, kSendrecvSlot);
    rb->waitRecv(g.timeout);
    sb->waitSend(g.timeout);
}

const Algo sendrecv_algos[] = {
    {"ring", sr_ring, nullptr, false},
};

/* ---- gather, scatter ---- */

template <typename T> struct GaNew {
    static void call(const perf_op *op, const void *send, void *recv)
    {
        gloo::GatherOptions o(g.run_ctx);
        o.setInput<T>((T *)send, op->c.count);
        if (g.rank == op->root)
            o.setOutput<T>((T *)recv, op->c.count * g.nranks);
        o.setRoot(op->root);
        o.setTimeout(g.timeout);
        gloo::gather(o);
    }
};

void ga_new(const perf_op *op, const void *send, void *recv)
{
    by_type<GaNew>(op->type->type, op, send, recv);
}

template <typename T> struct ScNew {
    static void call(const perf_op *op, const void *send, void *recv)
    {
        gloo::ScatterOptions o(g.run_ctx);
        if (g.rank == op->root) {
            std::vector<T *> ptrs(g.nranks);
            for (int r = 0; r < g.nranks; r++)
                ptrs[r] = (T *)send + (size_t)r * op->c.count;
            o.setInputs<T>(ptrs, op->c.count);
        }
        o.setOutput<T>((T *)recv, op->c.count);
        o.setRoot(op->root);
        o.setTimeout(g.timeout);
        gloo::scatter(o);
    }
};

void sc_new(const perf_op *op, const void *send, void *recv)
{
    by_type<ScNew>(op->type->type, op, send, recv);
}

const Algo gather_algos[] = {{"gather", ga_new, nullptr, false}};
const Algo scatter_algos[] = {{"scatter", sc_new, nullptr, false}};

/* ---------------------------------------------------------------------------------------------
 * The collectives: geometry, data and expected values from colls.c (as the Weft and MPI tools)
 * ------------------------------------------------------------------------------------------- */

ncclResult_t gp_run(const perf_ctx *ctx, const perf_op *op, const void *send, void *recv);

struct CollDef {
    const char *name; /* argument and JSON "collective" */
    const perf_coll *coll;
    const Algo *algos;
    size_t nalgos;
};

#define GP_COLL(nm, algos)                                                                         \
    {                                                                                              \
#nm, &perf_coll_##nm, algos, sizeof(algos) / sizeof(algos[0])                              \
    }

const CollDef colls[] = {
    GP_COLL(all_reduce, all_reduce_algos),
    GP_COLL(all_gather, all_gather_algos),
    GP_COLL(reduce_scatter, reduce_scatter_algos),
    GP_COLL(broadcast, broadcast_algos),
    GP_COLL(reduce, reduce_algos),
    GP_COLL(alltoall, alltoall_algos),
    GP_COLL(sendrecv, sendrecv_algos),
    GP_COLL(gather, gather_algos),
    GP_COLL(scatter, scatter_algos),
};

/* ---------------------------------------------------------------------------------------------
 * Algorithm choice per row and the bound-instance cache
 * ------------------------------------------------------------------------------------------- */

struct Sweep { /* what the driver will do, from the same flags (to know rows and rotation) */
    size_t min_bytes = 32u << 20, max_bytes = 32u << 20, step_bytes = 1u << 20;
    long factor = 1, iters = 20, agg = 1, warmup = 1;
};

using RowKey = std::tuple<size_t, int, int, int, int>; /* count, type, op, root, in_place */

struct Runner {
    const CollDef *def = nullptr;
    std::vector<const Algo *> algos; /* candidates */
    Sweep sweep;
    std::vector<size_t> measured_counts_bytes; /* sizes the sweep prints (bytes) */
    bool have_row = false;
    RowKey row;
    const Algo *cur = nullptr;
    std::map<std::pair<const void *, void *>, std::unique_ptr<Bound>> bound;
    std::map<RowKey, const Algo *> chosen;
    /* One context (own connections) per algorithm: after a legacy class has run on a context,
     * gloo::allreduce's ring on that context took ~3.7 s per 4 MiB call at 4 ranks. */
    std::map<const Algo *, std::shared_ptr<gloo::rendezvous::Context>> ctxs;
    bool timed_row = false; /* a measured row past its first call */
    long built_late = 0; /* bound instances built there (their cost lands in the timing) */
} R;

bool is_measured_size(const perf_op *op)
{
    for (size_t b : R.measured_counts_bytes) {
        perf_counts c;
        R.def->coll->get_counts(b, op->type->size, g.nranks, &c);
        if (c.count == op->c.count)
            return true;
    }
    return false;
}

std::shared_ptr<gloo::rendezvous::Context> connect(const std::string &name);

/* The algorithm's context, connected at its first use (the same call on every rank). */
void use_ctx(const Algo *a)
{
    auto &c = R.ctxs[a];
    if (!c)
        c = connect(a->name);
    g.run_ctx = c;
}

void exec(const Algo *a, const perf_op *op, const void *send, void *recv)
{
    use_ctx(a);
    if (a->direct != nullptr) {
        a->direct(op, send, recv);
        return;
    }
    auto key = std::make_pair(send, recv);
    auto it = R.bound.find(key);
    if (it == R.bound.end()) {
        if (R.timed_row)
            R.built_late++;
        it = R.bound.emplace(key, a->make(op, send, recv)).first;
    }
    it->second->run(send, recv);
}

/* Times every candidate on this row's buffers (collectively) and returns the fastest. */
const Algo *calibrate(const perf_op *op, const void *send, void *recv)
{
    size_t bytes = std::max(op->c.send_count, op->c.recv_count) * op->type->size;
    int k = bytes <= (256u << 10) ? 5 : bytes <= (4u << 20) ? 3 : 1;
    std::vector<double> t(R.algos.size());

    for (size_t i = 0; i < R.algos.size(); i++) {
        const Algo *a = R.algos[i];
        exec(a, op, send, recv); /* warm-up (builds a bound instance) */
        auto t0 = Clock::now();
        for (int j = 0; j < k; j++)
            exec(a, op, send, recv);
        t[i] = std::chrono::duration<double>(Clock::now() - t0).count() / k;
        R.bound.clear();
    }
    gloo::AllreduceOptions o(g.ctx);
    o.setOutput<double>(t.data(), t.size());
    o.setReduceFunction(static_cast<RedFn>(&gloo::max<double>));
    o.setTimeout(g.timeout);
    gloo::allreduce(o);
    return R.algos[std::min_element(t.begin(), t.end()) - t.begin()];
}

/* Builds the bound instances for every rotation slot the driver will use for this row. */
void prebuild(const Algo *a, const perf_op *op, const void *send, void *recv)
{
    size_t total = std::max(op->c.send_count, op->c.recv_count) * op->type->size;
    size_t steps = total ? R.sweep.max_bytes / total : 1;
    size_t slots = std::max<size_t>(
        1, std::min<size_t>(steps, std::max<long>(R.sweep.iters * R.sweep.agg, R.sweep.warmup)));
    use_ctx(a);
    for (size_t k = 0; k < slots; k++) {
        const void *s = (const char *)send + k * total;
        void *r = (char *)recv + k * total;
        auto key = std::make_pair(s, r);
        if (R.bound.find(key) == R.bound.end())
            R.bound.emplace(key, a->make(op, s, r));
    }
}

ncclResult_t gp_run(const perf_ctx *, const perf_op *op, const void *send, void *recv)
{
    if (op->c.count == 0)
        return ncclSuccess;
    return guarded(R.def->name, [&] {
        RowKey key{op->c.count, (int)op->type->type, op->op, op->root, op->in_place};
        if (!R.have_row || key != R.row) {
            /* First call of a row: a warm-up or the untimed synchronising op of the driver. */
            R.timed_row = false;
            R.have_row = true;
            R.row = key;
            R.bound.clear();
            /* The in-place row reuses the out-of-place row's choice (one calibration a size). */
            RowKey other{op->c.count, (int)op->type->type, op->op, op->root, !op->in_place};
            auto c = R.chosen.find(key);
            if (c == R.chosen.end())
                c = R.chosen.find(other);
            if (c != R.chosen.end()) {
                R.cur = c->second;
                if (is_measured_size(op))
                    R.chosen[key] = R.cur;
            } else if (R.algos.size() == 1 || !is_measured_size(op)) {
                R.cur = R.algos[0];
                if (is_measured_size(op))
                    R.chosen[key] = R.cur;
            } else {
                R.cur = calibrate(op, send, recv);
                R.chosen[key] = R.cur;
            }
            if (R.cur->make != nullptr && is_measured_size(op))
                prebuild(R.cur, op, send, recv);
            exec(R.cur, op, send, recv);
            R.timed_row = is_measured_size(op);
            return;
        }
        exec(R.cur, op, send, recv);
    });
}

/* ---------------------------------------------------------------------------------------------
 * Backend
 * ------------------------------------------------------------------------------------------- */

/* A new full mesh (own TCP connections) on the shared device. Collective. */
std::shared_ptr<gloo::rendezvous::Context> connect(const std::string &name)
{
    gloo::rendezvous::PrefixStore prefixed(name, *g.store);
    auto c = std::make_shared<gloo::rendezvous::Context>(g.rank, g.nranks);
    c->setTimeout(g.timeout);
    c->connectFullMesh(prefixed, g.dev);
    return c;
}

std::string default_store_dir()
{
    const char *env = getenv("GLOO_PERF_STORE");
    if (env != nullptr && env[0] != '\0')
        return env;
    const char *uid = getenv("WEFT_UNIQUE_ID");
    if (uid == nullptr)
        return "";
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = uid; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    char buf[64];
    snprintf(buf, sizeof(buf), "/tmp/gloo-perf-%016" PRIx64, h);
    return buf;
}

ncclResult_t be_init(perf_ctx *ctx, char *version_line, size_t len)
{
    int rank = 0, size = 1;
    char tmpl[] = "/tmp/gloo-perf-XXXXXX";

    launcher_env(&rank, &size);
    if (size < 1 || rank < 0 || rank >= size)
        return fail("bad rank %d of %d from the launcher environment", rank, size);
    g.rank = rank;
    g.nranks = size;
    if (const char *t = getenv("GLOO_PERF_TIMEOUT"))
        g.timeout = Ms((long)(atof(t) * 1000));
    g.store_dir = default_store_dir();
    if (g.store_dir.empty()) {
        if (size > 1)
            return fail("%d ranks need a shared rendezvous directory: run under weftrun or set "
                        "GLOO_PERF_STORE",
                        size);
        if (mkdtemp(tmpl) == nullptr)
            return fail("mkdtemp: %s", strerror(errno));
        g.store_dir = tmpl;
    }
    if (mkdir(g.store_dir.c_str(), 0700) != 0 && errno != EEXIST)
        return fail("mkdir %s: %s", g.store_dir.c_str(), strerror(errno));
    ncclResult_t res = guarded("rendezvous", [&] {
        gloo::transport::tcp::attr attr;
        const char *host = getenv("GLOO_PERF_HOST");
        attr.hostname = host ? host : "127.0.0.1";
        g.dev = gloo::transport::tcp::CreateDevice(attr);
        g.store = std::make_unique<gloo::rendezvous::FileStore>(g.store_dir);
        g.ctx = connect("driver");
    });
    if (res != ncclSuccess)
        return res;
    ctx->rank = rank;
    ctx->nranks = size;
    const char *lr = getenv("WEFT_LOCAL_RANK");
    ctx->local_rank = lr ? atoi(lr) : rank;
    ctx->library = "gloo";
    ctx->comm = nullptr;
    ctx->stream = nullptr;
    ctx->be_state = nullptr;
    snprintf(version_line, len,
             "# gloo perf (nccl-tests 2.19.6 compatible) gloo-library=\"Gloo %d.%d.%d tcp\"",
             GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH);
    return ncclSuccess;
}

int be_early_rank(void)
{
    int rank = 0, size = 1;
    launcher_env(&rank, &size);
    return rank;
}

/* One rank per process: the team is this process's rank. */
ncclResult_t be_comm_init(perf_team *)
{
    return ncclSuccess;
}

ncclResult_t be_comm_fini(perf_team *)
{
    return ncclSuccess;
}

ncclResult_t be_comm_device(const perf_ctx *, int *dev_p)
{
    *dev_p = -1;
    return ncclSuccess;
}

ncclResult_t be_barrier(const perf_team *)
{
    return guarded("barrier", [] {
        gloo::BarrierOptions o(g.ctx);
        o.setTimeout(g.timeout);
        gloo::barrier(o);
    });
}

void remove_store(const std::string &dir)
{
    DIR *d = opendir(dir.c_str());
    if (d == nullptr)
        return;
    while (struct dirent *e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlink((dir + "/" + e->d_name).c_str());
    }
    closedir(d);
    rmdir(dir.c_str());
}

ncclResult_t be_fini(perf_ctx *ctx)
{
    perf_team team{1, ctx};
    R.bound.clear();
    ncclResult_t res = be_barrier(&team);
    if (g.rank == 0)
        remove_store(g.store_dir);
    g.run_ctx.reset();
    R.ctxs.clear();
    g.ctx.reset();
    g.store.reset();
    return res;
}

ncclResult_t be_reduce_double(const perf_team *, double *v, int op)
{
    return guarded("allreduce", [&] {
        gloo::AllreduceOptions o(g.ctx);
        o.setOutput<double>(v, 1);
        o.setReduceFunction(red_fn<double>(op));
        o.setTimeout(g.timeout);
        gloo::allreduce(o);
    });
}

ncclResult_t be_sum_int64(const perf_team *, int64_t *v)
{
    return guarded("allreduce", [&] {
        gloo::AllreduceOptions o(g.ctx);
        o.setOutput<int64_t>(v, 1);
        o.setReduceFunction(red_fn<int64_t>(PERF_OP_SUM));
        o.setTimeout(g.timeout);
        gloo::allreduce(o);
    });
}

ncclResult_t be_allgather(const perf_team *, const void *in, void *out, size_t bytes)
{
    return guarded("allgather", [&] {
        gloo::AllgatherOptions o(g.ctx);
        o.setInput<char>((char *)in, bytes);
        o.setOutput<char>((char *)out, bytes * g.nranks);
        o.setTimeout(g.timeout);
        gloo::allgather(o);
    });
}

ncclResult_t be_group(void)
{
    return ncclSuccess;
}

ncclResult_t be_op_create(const perf_ctx *, perf_op *op)
{
    op->nccl_op = op->op >= 0 ? (ncclRedOp_t)op->op : ncclSum;
    return ncclSuccess;
}

ncclResult_t be_op_destroy(const perf_ctx *, perf_op *)
{
    return ncclSuccess;
}

int be_supports(const perf_type *t, int op)
{
    if (t != nullptr && !type_supported(t->type))
        return 0;
    return op == PERF_OP_NONE || op == PERF_OP_SUM || op == PERF_OP_PROD || op == PERF_OP_MAX ||
           op == PERF_OP_MIN;
}

const char *be_error_string(ncclResult_t res)
{
    return res == ncclSuccess           ? "no error"
           : res == ncclInvalidArgument ? "invalid argument"
                                        : "Gloo error";
}

const char *be_last_error(void)
{
    return g.last_error;
}

/* Gloo has no abort: the -T watchdog gives the blocked call 5 s, then exits the process. */
ncclResult_t be_abort(const perf_ctx *)
{
    return ncclSuccess;
}

perf_backend make_backend()
{
    perf_backend b{};
    b.name = "gloo";
    b.init = be_init;
    b.early_rank = be_early_rank;
    b.fini = be_fini;
    b.caps = 0;
    b.comm_init = be_comm_init;
    b.comm_fini = be_comm_fini;
    b.comm_device = be_comm_device;
    b.barrier = be_barrier;
    b.reduce_double = be_reduce_double;
    b.sum_int64 = be_sum_int64;
    b.allgather = be_allgather;
    b.group_start = be_group;
    b.group_end = be_group;
    b.op_create = be_op_create;
    b.op_destroy = be_op_destroy;
    b.supports = be_supports;
    b.error_string = be_error_string;
    b.last_error = be_last_error;
    b.abort = be_abort;
    return b;
}

const perf_backend gloo_backend = make_backend();

/* ---------------------------------------------------------------------------------------------
 * main: pick the collective, read the sweep flags, run the driver, label the JSON lines
 * ------------------------------------------------------------------------------------------- */

bool parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return false;
    switch (*end) {
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024.0 * 1024;
        break;
    case 'K':
    case 'k':
        v *= 1024.0;
        break;
    default:
        break;
    }
    *out = (size_t)v;
    return true;
}

/* The flags of args.c that decide rows and buffer rotation (errors are left to the driver). */
void read_sweep(int argc, char **argv, Sweep *s)
{
    static const option longopts[] = {
        {"minbytes", required_argument, 0, 'b'},
        {"maxbytes", required_argument, 0, 'e'},
        {"stepbytes", required_argument, 0, 'i'},
        {"stepfactor", required_argument, 0, 'f'},
        {"iters", required_argument, 0, 'n'},
        {"agg_iters", required_argument, 0, 'm'},
        {"warmup_iters", required_argument, 0, 'w'},
        {"nthreads", required_argument, 0, 't'},
        {"ngpus", required_argument, 0, 'g'},
        {"run_cycles", required_argument, 0, 'N'},
        {"parallel_init", required_argument, 0, 'p'},
        {"check", required_argument, 0, 'c'},
        {"op", required_argument, 0, 'o'},
        {"datatype", required_argument, 0, 'd'},
        {"root", required_argument, 0, 'r'},
        {"blocking", required_argument, 0, 'z'},
        {"stream_null", required_argument, 0, 'y'},
        {"timeout", required_argument, 0, 'T'},
        {"cudagraph", required_argument, 0, 'G'},
        {"report_cputime", required_argument, 0, 'C'},
        {"average", required_argument, 0, 'a'},
        {"local_register", required_argument, 0, 'R'},
        {"cta_policy", required_argument, 0, 'x'},
        {"device_implementation", required_argument, 0, 'D'},
        {"output_file", required_argument, 0, 'J'},
        {"unalign", required_argument, 0, 'u'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    std::vector<char *> copy(argv, argv + argc);
    int c;
    copy.push_back(nullptr);
    opterr = 0;
    optind = 1;
    while (
        (c = getopt_long(argc, copy.data(), "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:R:x:D:J:u:h",
                         longopts, nullptr)) != -1) {
        switch (c) {
        case 'b':
            parse_size(optarg, &s->min_bytes);
            break;
        case 'e':
            parse_size(optarg, &s->max_bytes);
            break;
        case 'i':
            parse_size(optarg, &s->step_bytes);
            break;
        case 'f':
            s->factor = atol(optarg);
            break;
        case 'n':
            s->iters = atol(optarg);
            break;
        case 'm':
            s->agg = atol(optarg);
            break;
        case 'w':
            s->warmup = atol(optarg);
            break;
        default:
            break;
        }
    }
    optind = 1;
}

std::vector<size_t> measured_sizes(const Sweep &s)
{
    std::vector<size_t> v;
    for (size_t b = s.min_bytes; b <= s.max_bytes && v.size() < 4096;) {
        v.push_back(b);
        size_t nb = s.factor > 1 ? (b ? b * (size_t)s.factor : 1) : b + s.step_bytes;
        if (nb <= b)
            break;
        b = nb;
    }
    return v;
}

const char *gloo_json_path(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if ((strcmp(argv[i], "-J") == 0 || strcmp(argv[i], "--output_file") == 0) && i + 1 < argc)
            return argv[i + 1];
        if (strncmp(argv[i], "-J", 2) == 0 && argv[i][2] != '\0')
            return argv[i] + 2;
        if (strncmp(argv[i], "--output_file=", 14) == 0)
            return argv[i] + 14;
    }
    return nullptr;
}

/* Value of "key": in a JSON line, as text (strings without quotes). */
std::string json_field(const std::string &line, const char *key)
{
    std::string k = std::string("\"") + key + "\":";
    size_t p = line.find(k);
    if (p == std::string::npos)
        return "";
    p += k.size();
    if (line[p] == '"') {
        size_t e = line.find('"', p + 1);
        return line.substr(p + 1, e - p - 1);
    }
    size_t e = line.find_first_of(",}", p);
    return line.substr(p, e - p);
}

/* Adds "algorithm" (the last field) to every line of the -J file. */
void label_json(const char *path)
{
    std::ifstream in(path);
    if (!in)
        return;
    std::map<std::string, std::string> names;
    for (const auto &kv : R.chosen) {
        size_t count;
        int type, op, root, ip;
        std::tie(count, type, op, root, ip) = kv.first;
        const perf_type *t = perf_type_get((ncclDataType_t)type);
        std::ostringstream k;
        k << count << '|' << (t ? t->name : "?") << '|' << perf_op_name(op) << '|' << root << '|'
          << (ip ? "true" : "false");
        names[k.str()] = kv.second->name;
    }
    std::ostringstream out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] != '{') {
            out << line << '\n';
            continue;
        }
        std::string k = json_field(line, "count") + '|' + json_field(line, "type") + '|' +
                        json_field(line, "op") + '|' + json_field(line, "root") + '|' +
                        json_field(line, "inplace");
        auto it = names.find(k);
        size_t close = line.rfind('}');
        if (it == names.end() || close == std::string::npos ||
            line.find("\"algorithm\":") != std::string::npos) {
            out << line << '\n';
            continue;
        }
        out << line.substr(0, close) << ",\"algorithm\":\"" << it->second << "\""
            << line.substr(close) << '\n';
    }
    in.close();
    std::ofstream o(path, std::ios::trunc);
    o << out.str();
}

void usage(const char *prog)
{
    fprintf(stderr, "usage: %s <collective>[:algo,...] [nccl-tests flags]   (under weftrun -n N)\n",
            prog);
    for (const auto &d : colls) {
        fprintf(stderr, "  %-15s", d.name);
        for (size_t i = 0; i < d.nalgos; i++)
            fprintf(stderr, " %s", d.algos[i].name);
        fputc('\n', stderr);
    }
}

} // namespace

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-') {
        usage(argv[0]);
        return 2;
    }
    std::string spec = argv[1];
    std::string name = spec.substr(0, spec.find(':'));
    std::string want = spec.find(':') != std::string::npos ? spec.substr(spec.find(':') + 1) : "";
    if (want.empty() && getenv("GLOO_PERF_ALGOS") != nullptr)
        want = getenv("GLOO_PERF_ALGOS");
    for (const auto &d : colls) {
        if (name == d.name)
            R.def = &d;
    }
    if (R.def == nullptr) {
        usage(argv[0]);
        return 2;
    }
    int rank = 0, nranks = 1;
    launcher_env(&rank, &nranks);
    for (size_t i = 0; i < R.def->nalgos; i++) {
        std::string a = std::string(",") + R.def->algos[i].name + ",";
        bool pow2 = nranks > 0 && (nranks & (nranks - 1)) == 0;
        if (want.empty() && R.def->algos[i].pow2_only && !pow2)
            continue;
        if (want.empty() || ("," + want + ",").find(a) != std::string::npos)
            R.algos.push_back(&R.def->algos[i]);
    }
    if (R.algos.empty()) {
        fprintf(stderr, "%s: no algorithm of %s matches '%s'\n", argv[0], R.def->name,
                want.c_str());
        usage(argv[0]);
        return 2;
    }

    /* The driver sees "<coll>_perf [flags]". */
    std::vector<char *> args;
    std::string prog = std::string("gloo_") + R.def->name + "_perf";
    args.push_back(const_cast<char *>(prog.c_str()));
    for (int i = 2; i < argc; i++)
        args.push_back(argv[i]);
    args.push_back(nullptr);
    int nargs = (int)args.size() - 1;

    read_sweep(nargs, args.data(), &R.sweep);
    R.measured_counts_bytes = measured_sizes(R.sweep);
    const char *jpath = gloo_json_path(nargs, args.data());

    int rc = perf_run(nargs, args.data(), R.def->coll, gp_run, &gloo_backend);

    if (g.rank == 0 && !R.chosen.empty() && (rc == 0 || rc == 7)) {
        printf("# gloo algorithm per row (size = count elements):");
        std::string last;
        for (const auto &kv : R.chosen) {
            std::ostringstream s;
            s << " " << std::get<0>(kv.first) << (std::get<4>(kv.first) ? "/ip" : "") << ":"
              << kv.second->name;
            printf("%s", s.str().c_str());
        }
        printf("\n");
        if (R.built_late > 0)
            printf("# note: %ld legacy instances were built inside calls\n", R.built_late);
        if (jpath != nullptr)
            label_json(jpath);
    }
    return rc;
}
