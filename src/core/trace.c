/* Chrome trace-event files per communicator rank (see trace.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algo/sched.h"
#include "core/comm.h"
#include "core/log.h"
#include "core/param.h"
#include "core/trace.h"
#include "redop.h"

WEFT_PARAM_STR(TraceFile, "WEFT_TRACE_FILE", "",
               "write a Chrome trace-event file (Perfetto, chrome://tracing) of every operation "
               "per rank, at communicator destroy: %r rank, %n ranks, %h host, %p pid, %c "
               "communicator hash (tools/weft-trace merges the ranks' files)");
WEFT_PARAM(TraceMaxOps, "WEFT_TRACE_MAX_OPS", 100000,
           "operations a communicator's trace keeps (later ones are counted, not recorded)");

struct weft_trace_rec {
    struct weft_trace_op op;
    uint32_t lane_first; /* index into lanes[] */
};

struct weft_trace {
    pthread_mutex_t lock;
    uint64_t mono_to_real; /* CLOCK_REALTIME - CLOCK_MONOTONIC when the trace was created */
    struct weft_trace_rec *recs;
    size_t nrecs, cap, dropped;
    uint64_t *lanes;
    size_t nlanes, lanes_cap;
};

int weft_trace_enabled(void)
{
    /* Asked on every operation: cached (-1: not read yet). */
    static int enabled = -1;
    int e = __atomic_load_n(&enabled, __ATOMIC_RELAXED);
    if (__builtin_expect(e < 0, 0)) {
        const char *f = weft_param_TraceFile();
        e = f != NULL && *f != '\0';
        __atomic_store_n(&enabled, e, __ATOMIC_RELAXED);
    }
    return e;
}

static uint64_t weft_trace_clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pthread_mutex_t weft_trace_create_lock = PTHREAD_MUTEX_INITIALIZER;

struct weft_trace *weft_trace_get(struct ncclComm *comm)
{
    struct weft_trace *t = __atomic_load_n(&comm->trace, __ATOMIC_ACQUIRE);
    if (t != NULL || !weft_trace_enabled())
        return t;
    pthread_mutex_lock(&weft_trace_create_lock);
    t = comm->trace;
    if (t == NULL) {
        t = calloc(1, sizeof(*t));
        if (t != NULL) {
            pthread_mutex_init(&t->lock, NULL);
            t->mono_to_real = weft_trace_clock_ns(CLOCK_REALTIME) -
                              weft_trace_clock_ns(CLOCK_MONOTONIC);
            __atomic_store_n(&comm->trace, t, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&weft_trace_create_lock);
    return t;
}

void weft_trace_record(struct ncclComm *comm, const struct weft_trace_op *op)
{
    struct weft_trace *t = weft_trace_get(comm);
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->lock);
    if (t->nrecs >= (size_t)weft_param_TraceMaxOps()) {
        t->dropped++;
        goto out;
    }
    if (t->nrecs == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        void *p = realloc(t->recs, cap * sizeof(*t->recs));
        if (p == NULL) {
            t->dropped++;
            goto out;
        }
        t->recs = p;
        t->cap = cap;
    }
    size_t nl = op->lane_end_ns != NULL && op->nch > 0 ? (size_t)op->nch : 0;
    if (t->nlanes + nl > t->lanes_cap) {
        size_t cap = t->lanes_cap ? 2 * t->lanes_cap : 1024;
        while (cap < t->nlanes + nl)
            cap *= 2;
        void *p = realloc(t->lanes, cap * sizeof(*t->lanes));
        if (p == NULL) {
            t->dropped++;
            goto out;
        }
        t->lanes = p;
        t->lanes_cap = cap;
    }
    struct weft_trace_rec *r = &t->recs[t->nrecs++];
    r->op = *op;
    r->op.nch = (int)nl;
    r->op.lane_end_ns = NULL;
    r->op.enq_ns += t->mono_to_real;
    r->op.start_ns += op->start_ns != 0 ? t->mono_to_real : 0;
    r->op.end_ns += op->end_ns != 0 ? t->mono_to_real : 0;
    r->lane_first = (uint32_t)t->nlanes;
    for (size_t i = 0; i < nl; i++) {
        uint64_t e = op->lane_end_ns[i];
        t->lanes[t->nlanes + i] = e != 0 ? e + t->mono_to_real : 0;
    }
    t->nlanes += nl;
out:
    pthread_mutex_unlock(&t->lock);
}

/* WEFT_TRACE_FILE with its % escapes expanded into path[size]. */
static void weft_trace_path(const struct ncclComm *comm, char *path, size_t size)
{
    const char *pat = weft_param_TraceFile();
    char host[64] = "unknown";
    gethostname(host, sizeof(host) - 1);
    size_t n = 0;
    for (const char *p = pat; *p != '\0' && n + 32 < size; p++) {
        int w = -1;
        if (p[0] == '%' && p[1] == 'r')
            w = snprintf(path + n, size - n, "%d", comm->rank);
        else if (p[0] == '%' && p[1] == 'n')
            w = snprintf(path + n, size - n, "%d", comm->nranks);
        else if (p[0] == '%' && p[1] == 'h')
            w = snprintf(path + n, size - n, "%s", host);
        else if (p[0] == '%' && p[1] == 'p')
            w = snprintf(path + n, size - n, "%d", (int)getpid());
        else if (p[0] == '%' && p[1] == 'c')
            w = snprintf(path + n, size - n, "%016llx", (unsigned long long)comm->comm_hash);
        if (w >= 0) {
            n += (size_t)w < size - n ? (size_t)w : size - n - 1;
            p++;
        } else {
            path[n++] = *p;
        }
    }
    path[n] = '\0';
}

/* Microseconds, as Chrome's "ts" and "dur" want them. Times are written from a base (the first
 * enqueue rounded down to 1000 s, in otherData.ts_base_ns): absolute microseconds since 1970 are
 * too big for a double to keep their nanoseconds, and JSON readers use doubles. */
static double weft_trace_us(uint64_t ns, uint64_t base)
{
    return (double)(int64_t)(ns - base) / 1000.0;
}

static double weft_trace_dur(uint64_t from, uint64_t to)
{
    return to > from ? (double)(to - from) / 1000.0 : 0.0;
}

static void weft_trace_args(FILE *f, const struct weft_trace_op *o, int ch)
{
    fprintf(f, ",\"args\":{\"seq\":%llu,\"collective\":\"%s\",\"count\":%llu,\"datatype\":\"%s\"",
            (unsigned long long)o->seq, weft_coll_name(o->coll), (unsigned long long)o->count,
            weft_dtype_name(o->dtype));
    if (o->algo >= 0)
        fprintf(f, ",\"algorithm\":\"%s\"", weft_algo_name(o->algo));
    if (o->coll == WEFT_COLL_BROADCAST || o->coll == WEFT_COLL_REDUCE ||
        o->coll == WEFT_COLL_GATHER || o->coll == WEFT_COLL_SCATTER)
        fprintf(f, ",\"root\":%d", o->root);
    else if (o->coll == WEFT_COLL_SEND || o->coll == WEFT_COLL_RECV)
        fprintf(f, ",\"peer\":%d", o->root);
    if (ch >= 0)
        fprintf(f, ",\"channel\":%d", ch);
    fprintf(f, ",\"memory\":\"%s\"}}", o->device ? "device" : "host");
}

void weft_trace_flush(struct ncclComm *comm)
{
    struct weft_trace *t = comm->trace;
    if (t == NULL)
        return;
    comm->trace = NULL;
    char path[4096];
    weft_trace_path(comm, path, sizeof(path));
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        WEFT_WARN("rank %d: cannot write the trace file %s: %s", comm->rank, path,
                  strerror(errno));
        goto out;
    }
    int pid = comm->rank; /* one track per rank: pid = rank, as in the merged file */
    uint64_t first = UINT64_MAX;
    for (size_t i = 0; i < t->nrecs; i++)
        first = t->recs[i].op.enq_ns < first ? t->recs[i].op.enq_ns : first;
    uint64_t base = first == UINT64_MAX ? 0 : first / 1000000000000ull * 1000000000000ull;
    char host[64] = "unknown";
    gethostname(host, sizeof(host) - 1);
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"rank\":%d,\"nranks\":%d,"
               "\"host\":\"%s\",\"pid\":%d,\"comm\":\"%016llx\",\"dropped_ops\":%zu,"
               "\"ts_base_ns\":%llu},\n\"traceEvents\":[\n",
            comm->rank, comm->nranks, host, (int)getpid(), (unsigned long long)comm->comm_hash,
            t->dropped, (unsigned long long)base);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"name\":\"rank %d (%s pid %d)\"}},\n",
            pid, comm->rank, host, (int)getpid());
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"sort_index\":%d}},\n", pid, comm->rank);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"name\":\"operations\"}},\n", pid);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":1,"
               "\"args\":{\"name\":\"queued (enqueue to start)\"}}", pid);
    int max_ch = 0;
    for (size_t i = 0; i < t->nrecs; i++)
        max_ch = t->recs[i].op.nch > max_ch ? t->recs[i].op.nch : max_ch;
    for (int c = 0; c < max_ch; c++)
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"channel %d\"}}", pid, 2 + c, c);
    for (size_t i = 0; i < t->nrecs; i++) {
        const struct weft_trace_op *o = &t->recs[i].op;
        /* enqueue: an instant; queued: enqueue to start; the operation: start to end (device:
         * the launch, an instant) */
        fprintf(f, ",\n{\"ph\":\"i\",\"s\":\"t\",\"name\":\"enqueue %s\",\"cat\":\"enqueue\","
                   "\"pid\":%d,\"tid\":1,\"ts\":%.3f", o->api, pid, weft_trace_us(o->enq_ns, base));
        weft_trace_args(f, o, -1);
        if (o->start_ns > o->enq_ns) {
            fprintf(f, ",\n{\"ph\":\"X\",\"name\":\"queued %s\",\"cat\":\"queued\",\"pid\":%d,"
                       "\"tid\":1,\"ts\":%.3f,\"dur\":%.3f", o->api, pid,
                    weft_trace_us(o->enq_ns, base), weft_trace_dur(o->enq_ns, o->start_ns));
            weft_trace_args(f, o, -1);
        }
        if (o->device) {
            fprintf(f, ",\n{\"ph\":\"i\",\"s\":\"t\",\"name\":\"launch %s\",\"cat\":\"launch\","
                       "\"pid\":%d,\"tid\":0,\"ts\":%.3f", o->api, pid,
                    weft_trace_us(o->start_ns, base));
            weft_trace_args(f, o, -1);
            continue;
        }
        fprintf(f, ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"op\",\"pid\":%d,\"tid\":0,"
                   "\"ts\":%.3f,\"dur\":%.3f", o->api, pid, weft_trace_us(o->start_ns, base),
                weft_trace_dur(o->start_ns, o->end_ns));
        weft_trace_args(f, o, -1);
        for (int c = 0; c < o->nch; c++) {
            uint64_t e = t->lanes[t->recs[i].lane_first + (uint32_t)c];
            fprintf(f, ",\n{\"ph\":\"X\",\"name\":\"%s ch%d\",\"cat\":\"channel\",\"pid\":%d,"
                       "\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f", o->api, c, pid, 2 + c,
                    weft_trace_us(o->start_ns, base),
                    weft_trace_dur(o->start_ns, e));
            weft_trace_args(f, o, c);
        }
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0)
        WEFT_WARN("rank %d: writing the trace file %s failed: %s", comm->rank, path,
                  strerror(errno));
    else
        WEFT_INFO(WEFT_LOG_INIT, "rank %d: trace of %zu operations written to %s", comm->rank,
                  t->nrecs, path);
out:
    pthread_mutex_destroy(&t->lock);
    free(t->recs);
    free(t->lanes);
    free(t);
}
