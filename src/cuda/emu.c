/*
 * The emulated GPU behind the CUDA ops table (WEFT_CUDA=emu:N). Design: reference/gpu-testing.md.
 *
 * Devices: N in this process (the ones CUDA_VISIBLE_DEVICES selects, below), numbered 0..n-1;
 * the current device is per thread (default 0).
 * can_access_peer is 1 between any two distinct devices; enable_peer_access is tracked (704 when
 * repeated) but not enforced: every emulated device sees every address, so a kernel touching a
 * peer's memory without enabling access works here and would fail on a GPU.
 *
 * Memory: one memfd per allocation, mapped shared, followed by a PROT_NONE guard page, so a kernel
 * running off the end faults. free replaces the whole range by a PROT_NONE mapping (the pages are
 * released; the addresses stay reserved, up to WEFT_EMU_QUARANTINE_MB of them and 16384 ranges,
 * oldest released first), so a use after free faults (SIGSEGV) instead of landing in a later allocation, and API
 * calls given a freed pointer (memcpy, memset, free, pointer_attr) return 1 with a warning. Pinned
 * host memory is allocated the same way and is its own device address (UVA). pointer_attr finds
 * any address inside a live allocation; other addresses are plain host.
 *
 * Visible devices: WEFT_CUDA=emu:N emulates N physical devices on the host; CUDA_VISIBLE_DEVICES
 * (read as CUDA reads it: indices or GPU-uuid prefixes, comma-separated, up to the first invalid
 * or repeated entry; empty: none) selects the process's devices and numbers them 0..n-1 in its
 * order. Physical device k has the same uuid and PCI bus id (0000:(0x10+k):00.0) in every
 * process, so processes that number one device differently can tell it is one device.
 *
 * Shared memory between processes (the memfd's name carries the physical device, so an importer
 * knows the memory's device whatever the exporter called it): mem_create makes a memfd
 * allocation whose export is a duplicate of the memfd; mem_import maps it at a new address,
 * registered as memory of the owner's device, and fails with 217 (as cuMemSetAccess) when the
 * current device is another one and this process does not see it or WEFT_EMU_PEER=0. A
 * legacy IPC handle names the exporter's pid, descriptor number and memfd inode (plus a check
 * word); ipc_open_handle fetches the descriptor with pidfd_open + pidfd_getfd, and fails as CUDA
 * does: 201 in the exporting process, 1 for a forged handle or freed memory. A cudaMalloc
 * allocation counts, in a page of its memfd past the data, the processes that have it open; a
 * cudaFree while that count is not 0 (an importer that has not called ipc_close_handle, which a
 * GPU would fault) is reported with a WARN and counted (weft_emu_ipc_busy_frees). WEFT_EMU_PEER=0
 * makes distinct devices unable to reach each other (can_access_peer 0, imports across devices
 * 217), so the host-memory FIFO path of the p2p transport is tested too.
 *
 * Streams: one in-order worker thread per stream running items (kernel, memcpy, memset, event
 * record, event wait, host function). NULL is the per-device legacy stream, made on first use and
 * never destroyed; it is an ordinary in-order stream: streams from stream_create are non-blocking,
 * so, as in CUDA, they never synchronise with it implicitly. stream_destroy waits for the queued
 * work (an event wait in that work is abandoned) and joins the worker; if that work is stuck (the
 * deadline below) it fails with 702 and leaves the worker detached, to free the stream if it ever
 * finishes (the handle is gone either way).
 *
 * Hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default, 1 to 32, as CUDA): each device
 * has that many in-order queues and streams are spread over them round robin as they are made.
 * A queue hands its items out in submission order, whatever their stream: an item leaves the head
 * of its queue only when its stream's earlier work is done and, for an event wait, when the event
 * was reached, for a host function, when it returned (a kernel, copy, memset or record leaves as
 * it starts). So work of one stream can hold up another stream's work behind it in the queue:
 * a kernel that spins for a kernel queued behind a wait for the first one never finishes, as on
 * a GPU. A turn not come within WEFT_TIMEOUT (counted while no kernel runs) fails the item with
 * 702 and lets it go out of turn.
 *
 * Events: a record count, the tickets of records not run yet and a count of records run, under
 * the event's own lock. Record takes ticket rec+1, notes it pending and enqueues an item that
 * clears it; a wait (stream or host) takes the current rec as target and waits until that ticket
 * is no longer pending; rec == 0 (never recorded) makes waits no-ops. As in CUDA, a wait is for
 * the record issued last before it, whatever records come after: an event recorded on stream A
 * and again on an idle stream B before A's record ran releases the waiters of A's record when A
 * gets there, not when B's ran (a done count raised to B's ticket released them early: the
 * CUDA executor's ev_in records every user stream of a group in turn).
 *
 * Deadlines: every host wait (synchronize of a stream, the device or an event, stream destroy)
 * and every event wait of a stream fails with 702 (cudaErrorLaunchTimeout) after WEFT_TIMEOUT
 * seconds in which what it waits for did not move and no kernel ran: a running kernel is bounded
 * by its own deadline and abort (the collective kernels) or is the program's (as on a GPU, where a kernel
 * that never ends hangs a synchronize); a host function that never returns, or a stream waiting
 * for one, would otherwise hang forever. A stream whose event wait failed keeps 702 as its
 * sticky error and runs its later work.
 *
 * Capture (mode WEFT_CUDA_CAPTURE_MODE, default CUDA's global mode): capture_begin puts a
 * non-legacy stream in capture; enqueued kernels, copies, memsets and host functions become graph
 * nodes, in issue order. An event recorded in a capturing stream marks the capture; a stream
 * waiting on it joins the capture, its nodes going to the same list (issue order is a valid order
 * of the captured DAG); capture_end on the origin stream ends it for every joined stream.
 * While a capture forbids them to the calling thread (global mode: a capture of any thread;
 * thread-local: one of this thread; relaxed: none), the calls CUDA calls unsafe fail with 900 and
 * invalidate that capture (its end returns 901): stream_query, stream_synchronize and
 * event_synchronize of ANY stream or event (CUDA's rule: a watchdog thread polling an unrelated
 * stream breaks a global-mode capture), synchronising the legacy stream (the synchronous
 * weftCudaMemcpy), device_synchronize, malloc, free, host_alloc, host_free (not mem_release,
 * which does not synchronise, as cuMemUnmap and cuMemRelease). Querying or synchronising a
 * capturing stream, or an event recorded in a capture, is illegal in every mode (900, that
 * capture invalidated). A capturing stream waiting on an event recorded outside the
 * capture is ignored (no node).
 * graph_launch enqueues copies of the nodes, in order, on a stream.
 *
 * Kernels: see src/cuda/emu_thread.h and contract section 4. grid x block pooled OS threads; idle
 * pool threads exit after 5 s. A launch item completes when every thread returned. Blocks run
 * concurrently, or, with WEFT_EMU_SERIALIZE=N, in waves of N blocks (1: one at a time) in a random
 * order (WEFT_EMU_SEED); kernels of different streams always run concurrently. Serialized, a
 * kernel whose blocks wait on each other, or on blocks of another rank's kernel that runs its
 * blocks in another order, hangs: that is what the mode exposes (a real GPU runs a small grid
 * co-resident, but CUDA does not promise it). A failed launch (trap, barrier misuse,
 * block deadlock) unwinds every thread of the kernel (longjmp: kernels must not rely on C++
 * destructors) and becomes the stream's sticky error (719 or 710), returned by synchronize/query.
 *
 * Module loading (CUDA_MODULE_LOADING, LAZY by default as in CUDA 12.2+): the first launch of a
 * kernel in the process (by its emulated function), or load_kernels on it, loads its module, and
 * that waits for every stream of the current device to be idle, as a lazy load may synchronise the
 * context: a launch while another kernel of the device spins for a peer that has not launched yet
 * waits until that kernel gives up. EAGER: every module is loaded at the first use of the device
 * (no wait).
 *
 * Waits: host waits (synchronize, event_synchronize, the worker waiting for a kernel) warn once
 * with every stream's state after WEFT_EMU_WATCHDOG seconds and go on waiting, as CUDA would hang.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/cond.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/param.h"
#include "cuda/cuda_ops.h"
#include "cuda/emu_thread.h"

WEFT_PARAM(EmuPeer, "WEFT_EMU_PEER", 1,
           "1: any two emulated devices may access each other's memory; 0: none may (peer access "
           "unsupported, as between GPUs without NVLink or a common PCIe switch)");
WEFT_PARAM(EmuDriver, "WEFT_EMU_DRIVER", 13000,
           "emulated GPU: the CUDA version its driver supports (cudaDriverGetVersion; 13000 is "
           "the 580 driver); below the emulated CUDA 13 runtime's 13000 the GPU is unusable "
           "(cudaErrorInsufficientDriver, 35) and the process runs without CUDA, as on a GPU");
WEFT_PARAM(EmuComputeMode, "WEFT_EMU_COMPUTE_MODE", 0,
           "emulated GPU: the compute mode every device reports (cudaComputeMode: 0 default, "
           "2 prohibited, 3 exclusive-process); reported only, not enforced");
WEFT_PARAM(EmuMig, "WEFT_EMU_MIG", 0,
           "emulated GPU: 1 makes every device report itself a MIG instance (reported only)");
WEFT_PARAM_STR(EmuVisible, "CUDA_VISIBLE_DEVICES", "all",
               "the emulated devices this process sees, in CUDA's syntax (indices of emu:N or "
               "GPU-uuid prefixes, comma-separated); all: every one");
WEFT_PARAM(EmuSerialize, "WEFT_EMU_SERIALIZE", 0,
           "emulated GPU: N > 0 runs the blocks of each kernel N at a time (waves), in random "
           "order; 0 runs them all at once");
WEFT_PARAM(EmuSeed, "WEFT_EMU_SEED", 0,
           "emulated GPU: seed of the serialized block order (0: from the clock, logged)");
WEFT_PARAM(EmuWatchdog, "WEFT_EMU_WATCHDOG", 60,
           "emulated GPU: seconds a host wait lasts before it warns with the streams' state "
           "(0: never)");
WEFT_PARAM(EmuStackKb, "WEFT_EMU_STACK_KB", 512,
           "emulated GPU: stack of each emulated thread, KiB");
WEFT_PARAM(EmuQuarantineMb, "WEFT_EMU_QUARANTINE_MB", 65536,
           "emulated GPU: address space of freed allocations kept unmapped-but-reserved so a use "
           "after free faults, MiB");

WEFT_PARAM_STR(EmuModuleLoading, "CUDA_MODULE_LOADING", "LAZY",
               "emulated GPU, as CUDA 12.2+: LAZY loads a kernel's module at its first launch (or "
               "load_kernels), waiting for every stream of the device to be idle; EAGER loads "
               "them all at the first use of the device (no such wait)");

WEFT_PARAM(EmuConnections, "CUDA_DEVICE_MAX_CONNECTIONS", 8,
           "emulated GPU, as CUDA: the in-order hardware queues of a device the streams are "
           "spread over (1 to 32); work queued behind a blocked item of another stream waits");

WEFT_PARAM_DECL(CudaCaptureMode);
WEFT_PARAM_DECL(Timeout); /* exec/host_watch.c: the deadline of the host waits below */

#define EMU_MAX_DEV 64
#define EMU_MAX_BLOCK 1024
#define EMU_MAX_SHARED (227u << 10)
#define EMU_MAX_PARAMS 32764
#define EMU_NBAR 16
#define EMU_MAX_QUARANTINED 16384
#define EMU_MAX_HWQ 32
#define EMU_HWQ_LATE 64

__thread struct weft_emu_tctx weft_emu_tls;
static __thread int emu_cur_dev;
static __thread jmp_buf emu_unwind_jmp;

static int emu_ndev;
static int emu_phys[EMU_MAX_DEV]; /* ordinal -> physical emulated device (CUDA_VISIBLE_DEVICES) */
static pthread_once_t emu_once = PTHREAD_ONCE_INIT;
static int emu_once_ndev;

/* emu_mu guards the registries (streams, events, graphs), captures and the peer matrix. Lock
 * order: emu_mu, then a stream's or an event's lock. */
static pthread_mutex_t emu_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char emu_peer[EMU_MAX_DEV][EMU_MAX_DEV];

static uint64_t emu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- memory registry ------------------------------------------------------------------------ */

/* How an allocation came to be, which decides the call that may release it. */
enum emu_origin {
    EMU_PLAIN = 0,  /* malloc / host_alloc: free / host_free */
    EMU_SHAREABLE,  /* mem_create: mem_release */
    EMU_IMPORTED,   /* mem_import: mem_release */
    EMU_IPC_OPENED, /* ipc_open_handle: ipc_close_handle (reference counted) */
};

struct emu_alloc {
    uintptr_t base;
    size_t size;     /* bytes asked for */
    size_t map_size; /* mapped bytes, guard page included */
    int kind;        /* WEFT_MEM_DEVICE or WEFT_MEM_HOST_PINNED */
    int device;
    int fd;
    uint64_t seq;
    int origin;      /* enum emu_origin */
    int refs;        /* EMU_IPC_OPENED: opens not yet closed */
    uint64_t ino;    /* the memfd's inode: names the memory in legacy IPC handles */
    int32_t ipc_pid; /* EMU_IPC_OPENED: the exporting process */
};

struct emu_table {
    struct emu_alloc *v;
    int n, cap;
};

static pthread_rwlock_t emu_mem_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct emu_table emu_live, emu_freed;
static size_t emu_freed_bytes;
static uint64_t emu_alloc_seq;

/* Index of the entry whose range [base, base + span) holds a, or -1. */
static int emu_table_find(const struct emu_table *t, uintptr_t a, int use_map_size)
{
    int lo = 0, hi = t->n - 1, hit = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (t->v[mid].base <= a) {
            hit = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (hit < 0)
        return -1;
    size_t span = use_map_size ? t->v[hit].map_size : t->v[hit].size;
    return a - t->v[hit].base < span ? hit : -1;
}

static int emu_table_insert(struct emu_table *t, const struct emu_alloc *a)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        struct emu_alloc *v = realloc(t->v, (size_t)cap * sizeof(*v));
        if (v == NULL)
            return -1;
        t->v = v;
        t->cap = cap;
    }
    int i = t->n;
    while (i > 0 && t->v[i - 1].base > a->base)
        i--;
    memmove(&t->v[i + 1], &t->v[i], (size_t)(t->n - i) * sizeof(*a));
    t->v[i] = *a;
    t->n++;
    return 0;
}

static void emu_table_remove(struct emu_table *t, int i)
{
    memmove(&t->v[i], &t->v[i + 1], (size_t)(t->n - i - 1) * sizeof(t->v[0]));
    t->n--;
}

/*
 * Maps `data` bytes of the memfd fd (page-rounded) at a new address followed by a guard page and
 * registers the range; the registry owns fd from here (closed at release), also on failure.
 */
static int emu_alloc_map(void **p_p, int fd, size_t bytes, size_t data, struct emu_alloc tmpl)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t map = data + page;
    int kind = tmpl.kind, device = tmpl.device;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        WEFT_WARN("emulated allocation of %zu bytes: fstat failed: %s", bytes, strerror(errno));
        goto err_close;
    }
    void *r = mmap(NULL, map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
        WEFT_WARN("emulated allocation of %zu bytes: mmap failed: %s", bytes, strerror(errno));
        goto err_close;
    }
    if (mmap(r, data, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        WEFT_WARN("emulated allocation of %zu bytes: mmap of the memfd failed: %s", bytes,
                  strerror(errno));
        goto err_unmap;
    }
    struct emu_alloc a = tmpl;
    a.base = (uintptr_t)r;
    a.size = bytes;
    a.map_size = map;
    a.fd = fd;
    a.ino = (uint64_t)sb.st_ino;
    pthread_rwlock_wrlock(&emu_mem_lock);
    a.seq = ++emu_alloc_seq;
    /* The kernel may hand out an address that was quarantined and then released. */
    int old = emu_table_find(&emu_freed, a.base, 1);
    if (old >= 0)
        emu_table_remove(&emu_freed, old);
    int ins = emu_table_insert(&emu_live, &a);
    pthread_rwlock_unlock(&emu_mem_lock);
    if (ins != 0) {
        WEFT_WARN("emulated allocation of %zu bytes: out of memory for the registry", bytes);
        goto err_unmap;
    }
    WEFT_INFO(WEFT_LOG_ALLOC, "emu: %s %p size %zu dev %d origin %d",
              kind == WEFT_MEM_DEVICE ? "malloc" : "host_alloc", r, bytes, device, tmpl.origin);
    *p_p = r;
    return WEFT_CUDA_SUCCESS;
err_unmap:
    munmap(r, map);
err_close:
    close(fd);
    return WEFT_CUDA_ERR_OUT_OF_MEMORY;
}

#define EMU_MEMFD_DEV "weft-emu-dev"

static int emu_alloc_new(void **p_p, size_t bytes, int kind, int device, int origin)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX / 2) {
        WEFT_WARN("emulated %s of %zu bytes: too large", kind == WEFT_MEM_DEVICE ? "cudaMalloc" :
                  "cudaHostAlloc", bytes);
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    }
    size_t data = (bytes + page - 1) / page * page;
    char name[32];
    if (kind == WEFT_MEM_DEVICE)
        snprintf(name, sizeof(name), EMU_MEMFD_DEV "%d", emu_phys[device]);
    else
        snprintf(name, sizeof(name), "weft-emu-host");
    /* cudaMalloc memory may get a legacy IPC handle: one more page past the data (never mapped
     * as the allocation) counts the processes that have it open (emu_ipc_opens). */
    size_t extra = kind == WEFT_MEM_DEVICE && origin == EMU_PLAIN ? page : 0;
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) {
        WEFT_WARN("emulated allocation of %zu bytes: memfd_create failed: %s", bytes,
                  strerror(errno));
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    }
    if (ftruncate(fd, (off_t)(data + extra)) != 0) {
        WEFT_WARN("emulated allocation of %zu bytes: ftruncate failed: %s", bytes, strerror(errno));
        close(fd);
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    }
    struct emu_alloc t;
    memset(&t, 0, sizeof(t));
    t.kind = kind;
    t.device = device;
    t.origin = origin;
    return emu_alloc_map(p_p, fd, bytes, data, t);
}

/* Removes p's allocation (which must be of kind); the range becomes a PROT_NONE reservation. */
/* Origins a call may release: free/host_free plain ones, mem_release shared and imported ones,
 * ipc_close_handle opened ones (kind < 0: either kind). */
static int emu_origin_ok(int origin, int want)
{
    if (want == EMU_SHAREABLE)
        return origin == EMU_SHAREABLE || origin == EMU_IMPORTED;
    return origin == want;
}

static int emu_ipc_opens(int fd, size_t data_bytes, int delta);

static int emu_alloc_release(void *p, int kind, int origin, const char *api)
{
    pthread_rwlock_wrlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    if (i < 0 || emu_live.v[i].base != (uintptr_t)p ||
        (kind >= 0 && emu_live.v[i].kind != kind) || !emu_origin_ok(emu_live.v[i].origin, origin)) {
        int freed = emu_table_find(&emu_freed, (uintptr_t)p, 1) >= 0;
        int other_kind = i >= 0 && kind >= 0 && emu_live.v[i].kind != kind;
        int other_origin = i >= 0 && !emu_origin_ok(emu_live.v[i].origin, origin);
        pthread_rwlock_unlock(&emu_mem_lock);
        WEFT_WARN("emulated %s(%p): %s", api, p,
                  freed ? "already freed" :
                  other_kind ? "memory of the other kind (device vs pinned host)" :
                  other_origin ? "memory made by another call (cudaMalloc, cuMemCreate, "
                                 "an import or an IPC open)" :
                  i >= 0 ? "not the start of an allocation" : "not an emulated allocation");
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    if (origin == EMU_IPC_OPENED && --emu_live.v[i].refs > 0) {
        pthread_rwlock_unlock(&emu_mem_lock);
        return WEFT_CUDA_SUCCESS;
    }
    struct emu_alloc a = emu_live.v[i];
    emu_table_remove(&emu_live, i);
    if (origin == EMU_IPC_OPENED) /* this process no longer has it open */
        emu_ipc_opens(a.fd, a.map_size - (size_t)sysconf(_SC_PAGESIZE), -1);
    /* One mmap replaces the data and keeps the range reserved: no window where another thread's
     * mmap could take the addresses. */
    void *r = mmap(p, a.map_size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        munmap(p, a.map_size);
    close(a.fd);
    a.fd = -1;
    if (r != MAP_FAILED && emu_table_insert(&emu_freed, &a) == 0)
        emu_freed_bytes += a.map_size;
    else if (r != MAP_FAILED)
        munmap(p, a.map_size);
    /* Bounded in bytes and in count: each reservation is a mapping, and vm.max_map_count
     * (65530 by default) caps those. */
    size_t limit = (size_t)weft_param_EmuQuarantineMb() << 20;
    while ((emu_freed_bytes > limit || emu_freed.n > EMU_MAX_QUARANTINED) && emu_freed.n > 0) {
        int oldest = 0;
        for (int j = 1; j < emu_freed.n; j++)
            if (emu_freed.v[j].seq < emu_freed.v[oldest].seq)
                oldest = j;
        munmap((void *)emu_freed.v[oldest].base, emu_freed.v[oldest].map_size);
        emu_freed_bytes -= emu_freed.v[oldest].map_size;
        emu_table_remove(&emu_freed, oldest);
    }
    pthread_rwlock_unlock(&emu_mem_lock);
    WEFT_INFO(WEFT_LOG_ALLOC, "emu: %s %p size %zu", api, p, a.size);
    return WEFT_CUDA_SUCCESS;
}

/* A range an API call is about to touch: inside one live allocation, or plain host. */
static int emu_check_range(const void *p, size_t bytes, const char *api, const char *what)
{
    if (bytes == 0)
        return WEFT_CUDA_SUCCESS;
    int res = WEFT_CUDA_SUCCESS;
    pthread_rwlock_rdlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    if (i >= 0) {
        const struct emu_alloc *a = &emu_live.v[i];
        if ((uintptr_t)p - a->base + bytes > a->size) {
            WEFT_WARN("emulated %s: %s %p + %zu bytes runs past the end of its allocation "
                      "(%p, %zu bytes)", api, what, p, bytes, (void *)a->base, a->size);
            res = WEFT_CUDA_ERR_INVALID_VALUE;
        }
    } else if (emu_table_find(&emu_freed, (uintptr_t)p, 1) >= 0) {
        WEFT_WARN("emulated %s: %s %p is in freed emulated memory", api, what, p);
        res = WEFT_CUDA_ERR_INVALID_VALUE;
    }
    pthread_rwlock_unlock(&emu_mem_lock);
    return res;
}

/* ---- objects: streams, events, captures, graphs ---------------------------------------------- */

enum emu_item_kind { EMU_KERNEL, EMU_MEMCPY, EMU_MEMSET, EMU_RECORD, EMU_WAIT, EMU_HOSTFN };

struct emu_event;

struct emu_item {
    struct emu_item *next;
    int kind;
    /* kernel */
    const struct weft_kernel *k;
    int grid, block;
    size_t shared;
    void *params; /* owned copy */
    size_t params_bytes;
    /* memcpy / memset */
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    /* record / wait (the item holds a reference on ev) */
    struct emu_event *ev;
    uint64_t ticket;
    /* host function */
    void (*fn)(void *arg);
    void *arg;
    uint64_t qticket; /* its place in its stream's hardware queue */
};

/* One in-order hardware queue of a device (see Hardware queues above). */
struct emu_hwq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next; /* tickets given (atomic: taken under the submitting stream's lock) */
    uint64_t head; /* the ticket at the head: every earlier one has left */
    uint64_t late[EMU_HWQ_LATE]; /* tickets that left out of turn (their wait failed) */
    int nlate;
};

struct emu_capture {
    uint64_t id;
    struct emu_stream *origin;
    int mode;         /* cudaStreamCaptureMode: 0 global, 1 thread-local, 2 relaxed */
    pthread_t thread; /* the thread that began it */
    int invalid;
    struct emu_item *head, *tail;
    int nnodes;
    struct emu_capture *next; /* active list */
};

struct emu_stream {
    int device;
    int legacy;
    struct emu_hwq *hwq; /* the device's hardware queue it feeds */
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct emu_item *head, *tail;
    uint64_t enq, done;       /* items queued / finished */
    int err;                  /* first error of the stream's work, sticky */
    int stop;                 /* destroy asked: drain, abandon event waits, exit */
    int exited;               /* under mu: the worker left its loop (destroy may join it) */
    int orphaned;             /* under mu: destroy gave up waiting (702); the worker, detached,
                               * drops the handle's reference when it exits */
    const char *running;      /* kernel name now running, for the watchdog */
    struct emu_capture *cap;  /* under emu_mu */
    struct emu_stream *next;  /* live list, under emu_mu */
    int refs;                 /* under emu_mu: the handle, plus each emu_device_wait using it */
};

struct emu_event {
    int device;      /* current at cudaEventCreate: it is recorded only on that device's streams */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t rec;      /* records issued (the last record's ticket) */
    uint64_t done;     /* records run (progress, for the deadline) */
    uint64_t *pending; /* [npending] tickets recorded and not run yet */
    int npending, pending_cap;
    uint64_t cap_id; /* capture it was last recorded in (0: recorded outside capture); emu_mu */
    int refs;        /* the user's handle plus queued items */
    struct emu_event *next;
};

struct emu_graph {
    struct emu_item *head;
    int nnodes;
    struct emu_graph *next;
};

static struct emu_stream *emu_streams;
static struct emu_stream *emu_legacy[EMU_MAX_DEV];
static struct emu_hwq emu_hwqs[EMU_MAX_DEV][EMU_MAX_HWQ];
static int emu_nhwq = 1;                  /* queues per device (set once at init) */
static unsigned emu_hwq_made[EMU_MAX_DEV]; /* streams made per device: the round robin */
static struct emu_event *emu_events;
static struct emu_graph *emu_graphs;
static struct emu_capture *emu_captures;
static uint64_t emu_capture_ids;

static void emu_item_free(struct emu_item *it);

static void emu_event_unref(struct emu_event *e)
{
    if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e->pending);
    free(e);
}

/* Whether ticket t of e was recorded and did not run yet. Under e->mu. */
static int emu_event_pending(const struct emu_event *e, uint64_t t)
{
    for (int i = 0; i < e->npending; i++)
        if (e->pending[i] == t)
            return 1;
    return 0;
}

/* Record ticket t ran, or will never run (dropped into a capture, freed unrun): its waiters go. */
static void emu_event_reached(struct emu_event *e, uint64_t t)
{
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->npending; i++)
        if (e->pending[i] == t) {
            e->pending[i] = e->pending[--e->npending];
            e->done++;
            break;
        }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void emu_item_free(struct emu_item *it)
{
    if (it->ev != NULL && it->kind == EMU_RECORD)
        emu_event_reached(it->ev, it->ticket);
    if (it->ev != NULL)
        emu_event_unref(it->ev);
    free(it->params);
    free(it);
}

static struct emu_item *emu_item_clone(const struct emu_item *src)
{
    struct emu_item *it = malloc(sizeof(*it));
    if (it == NULL)
        return NULL;
    *it = *src;
    it->next = NULL;
    it->ev = NULL;
    it->params = NULL;
    if (src->params_bytes > 0) {
        it->params = malloc(src->params_bytes);
        if (it->params == NULL) {
            free(it);
            return NULL;
        }
        memcpy(it->params, src->params, src->params_bytes);
    }
    return it;
}

/* Kernels running now, on every stream: while one runs, no host wait's deadline runs. */
static int emu_kernels_running;

/* A host wait: for the watchdog and the deadline (see Deadlines above). */
struct emu_wait {
    uint64_t start_ns; /* when it began (the watchdog) */
    uint64_t still_ns; /* since when nothing it waits for moved and no kernel ran */
    uint64_t seen;     /* the counter it waits on, then */
    int warned;
    const char *what;
};

static void emu_wait_begin(struct emu_wait *w, const char *what, uint64_t counter)
{
    w->start_ns = w->still_ns = emu_now_ns();
    w->seen = counter;
    w->warned = 0;
    w->what = what;
}

/* Whether the wait passed its deadline, given the counter it waits on; warns once if so. */
static int emu_wait_expired(struct emu_wait *w, uint64_t counter)
{
    uint64_t now = emu_now_ns();
    if (counter != w->seen || __atomic_load_n(&emu_kernels_running, __ATOMIC_ACQUIRE) > 0) {
        w->seen = counter;
        w->still_ns = now;
        return 0;
    }
    uint64_t limit = (uint64_t)weft_param_Timeout() * 1000000000ull;
    if (now - w->still_ns <= limit)
        return 0;
    WEFT_WARN("emulated GPU: %s: nothing moved for %llu s and no kernel runs (WEFT_TIMEOUT): "
              "a host function that never returns, or a wait on work behind one; fails with %d",
              w->what, (unsigned long long)((now - w->still_ns) / 1000000000ull),
              WEFT_CUDA_ERR_LAUNCH_TIMEOUT);
    return 1;
}

/* Timed wait in 200 ms slices; warns once when the wait passed the watchdog. */
static void emu_cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t start_ns, int *warned,
                          const char *what)
{
    weft_cond_wait_ms(cv, mu, 200);
    int64_t wd = weft_param_EmuWatchdog();
    if (wd > 0 && !*warned && emu_now_ns() - start_ns > (uint64_t)wd * 1000000000ull) {
        *warned = 1;
        WEFT_WARN("emulated GPU: %s has waited more than %lld s (WEFT_EMU_WATCHDOG)", what,
                  (long long)wd);
        /* Approximate (no stream locks taken): enough to see which stream is stuck where. The
         * caller may hold a stream's or an event's lock, so emu_mu is only tried. */
        if (pthread_mutex_trylock(&emu_mu) != 0)
            return;
        for (struct emu_stream *s = emu_streams; s != NULL; s = s->next) {
            const char *run = __atomic_load_n(&s->running, __ATOMIC_RELAXED);
            WEFT_WARN("emulated GPU: stream %p dev %d%s queued %llu done %llu%s%s", (void *)s,
                      s->device, s->legacy ? " (legacy)" : "",
                      (unsigned long long)__atomic_load_n(&s->enq, __ATOMIC_RELAXED),
                      (unsigned long long)__atomic_load_n(&s->done, __ATOMIC_RELAXED),
                      run ? " running kernel " : "", run ? run : "");
        }
        pthread_mutex_unlock(&emu_mu);
    }
}

static void emu_capture_invalidate(struct emu_capture *c, const char *why)
{
    if (!c->invalid)
        WEFT_WARN("emulated GPU: capture on stream %p invalidated: %s", (void *)c->origin, why);
    c->invalid = 1;
}

/*
 * A call CUDA calls unsafe during capture: 900 when a capture forbids it to the calling thread
 * (a global-mode capture of any thread, a thread-local one of this thread; relaxed never), and
 * those captures are invalidated.
 */
static int emu_forbid_in_capture(const char *api)
{
    int res = WEFT_CUDA_SUCCESS;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&emu_mu);
    for (struct emu_capture *c = emu_captures; c != NULL; c = c->next) {
        if (c->mode == 0 || (c->mode == 1 && pthread_equal(c->thread, self))) {
            emu_capture_invalidate(c, api);
            res = WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&emu_mu);
    if (res != WEFT_CUDA_SUCCESS)
        WEFT_WARN("emulated %s: not permitted while a stream is capturing (900)", api);
    return res;
}

static void *emu_stream_main(void *arg);
static void emu_stream_unref(struct emu_stream *s);

static int emu_stream_new(int device, int legacy, struct emu_stream **s_p)
{
    struct emu_stream *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        WEFT_WARN("emulated cudaStreamCreate: out of memory");
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    }
    s->device = device;
    s->legacy = legacy;
    s->hwq = &emu_hwqs[device][__atomic_fetch_add(&emu_hwq_made[device], 1, __ATOMIC_RELAXED) %
                               (unsigned)emu_nhwq];
    s->refs = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int rc = pthread_create(&s->worker, NULL, emu_stream_main, s);
    if (rc != 0) {
        WEFT_WARN("emulated cudaStreamCreate: pthread_create failed: %s", strerror(rc));
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    }
    *s_p = s;
    return WEFT_CUDA_SUCCESS;
}

/* The stream behind a handle: NULL is the current device's legacy stream (made on first use). */
static int emu_stream_get(weft_cuda_stream_t h, const char *api, struct emu_stream **s_p)
{
    int res = WEFT_CUDA_SUCCESS;
    pthread_mutex_lock(&emu_mu);
    if (h == NULL) {
        int dev = emu_cur_dev;
        if (emu_legacy[dev] == NULL) {
            struct emu_stream *s;
            res = emu_stream_new(dev, 1, &s);
            if (res == WEFT_CUDA_SUCCESS) {
                s->next = emu_streams;
                emu_streams = s;
                emu_legacy[dev] = s;
            }
        }
        *s_p = emu_legacy[dev];
    } else {
        struct emu_stream *s = emu_streams;
        while (s != NULL && s != (struct emu_stream *)h)
            s = s->next;
        if (s == NULL) {
            WEFT_WARN("emulated %s: %p is not a live emulated stream", api, h);
            res = WEFT_CUDA_ERR_INVALID_HANDLE;
        }
        *s_p = s;
    }
    pthread_mutex_unlock(&emu_mu);
    return res;
}

static int emu_event_get(weft_cuda_event_t h, const char *api, struct emu_event **e_p)
{
    pthread_mutex_lock(&emu_mu);
    struct emu_event *e = emu_events;
    while (e != NULL && e != (struct emu_event *)h)
        e = e->next;
    pthread_mutex_unlock(&emu_mu);
    if (e == NULL) {
        WEFT_WARN("emulated %s: %p is not a live emulated event", api, h);
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    *e_p = e;
    return WEFT_CUDA_SUCCESS;
}

/* Queues an item, or records it as a node when the stream captures. Takes ownership. */
static int emu_submit(struct emu_stream *s, struct emu_item *it)
{
    pthread_mutex_lock(&emu_mu);
    struct emu_capture *c = s->cap;
    if (c != NULL) {
        int res = WEFT_CUDA_SUCCESS;
        if (c->invalid) {
            res = WEFT_CUDA_ERR_CAPTURE_INVALIDATED;
            emu_item_free(it);
        } else if (it->kind == EMU_RECORD || it->kind == EMU_WAIT) {
            emu_item_free(it); /* dependencies only; issue order already implies them */
        } else {
            it->next = NULL;
            if (c->tail != NULL)
                c->tail->next = it;
            else
                c->head = it;
            c->tail = it;
            c->nnodes++;
        }
        pthread_mutex_unlock(&emu_mu);
        return res;
    }
    pthread_mutex_unlock(&emu_mu);
    it->next = NULL;
    pthread_mutex_lock(&s->mu);
    /* Under the stream's lock: a stream's tickets rise in its own order. */
    it->qticket = __atomic_fetch_add(&s->hwq->next, 1, __ATOMIC_RELAXED);
    if (s->tail != NULL)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    __atomic_store_n(&s->enq, s->enq + 1, __ATOMIC_RELEASE); /* read unlocked: emu_module_load */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return WEFT_CUDA_SUCCESS;
}

static struct emu_item *emu_item_new(int kind, const char *api)
{
    struct emu_item *it = calloc(1, sizeof(*it));
    if (it == NULL)
        WEFT_WARN("emulated %s: out of memory", api);
    else
        it->kind = kind;
    return it;
}

/* ---- kernels --------------------------------------------------------------------------------- */

struct emu_bar {
    int expected, arrived;
    uint64_t gen;
};

struct emu_block {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int index, ntid;
    int exited;  /* threads that returned from the kernel */
    int waiting; /* threads blocked in a barrier generation not yet complete */
    int trapped; /* the launch failed: waiters unwind */
    struct emu_bar bar[EMU_NBAR];
    void *shared;
};

struct emu_launch {
    const struct weft_kernel *k;
    void *params;
    int grid, block, device;
    struct emu_block *blocks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int remaining; /* threads of the current wave still running */
    int failed;    /* atomic */
    int err;       /* under mu */
};

static void emu_unwind(void) __attribute__((noreturn));
static void emu_unwind(void) { longjmp(emu_unwind_jmp, 1); }

/* Marks the launch failed and wakes every barrier waiter of it. Call with no block lock held. */
static void emu_launch_fail(struct emu_launch *L, int err)
{
    pthread_mutex_lock(&L->mu);
    if (L->err == 0)
        L->err = err;
    pthread_mutex_unlock(&L->mu);
    __atomic_store_n(&L->failed, 1, __ATOMIC_RELEASE);
    for (int b = 0; b < L->grid; b++) {
        struct emu_block *B = &L->blocks[b];
        pthread_mutex_lock(&B->mu);
        B->trapped = 1;
        pthread_cond_broadcast(&B->cv);
        pthread_mutex_unlock(&B->mu);
    }
}

static void emu_block_deadlock_locked(struct emu_launch *L, struct emu_block *B, char *msg,
                                      size_t len)
{
    int off = snprintf(msg, len, "kernel %s block %d: every live thread waits in a barrier that "
                       "cannot complete (%d of %d threads exited):", L->k->name, B->index,
                       B->exited, B->ntid);
    for (int i = 0; i < EMU_NBAR && off > 0 && (size_t)off < len; i++)
        if (B->bar[i].arrived > 0)
            off += snprintf(msg + off, len - (size_t)off, " barrier %d has %d of %d", i,
                            B->bar[i].arrived, i == 0 ? B->ntid - B->exited : B->bar[i].expected);
}

static void emu_bar_arrive(int id, int nthreads)
{
    struct emu_block *B = weft_emu_tls.block;
    struct emu_launch *L = weft_emu_tls.launch;
    char msg[512];
    if (B == NULL) {
        WEFT_WARN("emulated GPU: barrier called outside a kernel");
        abort();
    }
    if (id < 0 || id >= EMU_NBAR) {
        WEFT_WARN("emulated GPU: kernel %s block %d thread %d: barrier id %d out of 0..15",
                  L->k->name, B->index, weft_emu_tls.tid, id);
        emu_launch_fail(L, WEFT_CUDA_ERR_LAUNCH_FAILURE);
        emu_unwind();
    }
    pthread_mutex_lock(&B->mu);
    if (B->trapped) {
        pthread_mutex_unlock(&B->mu);
        emu_unwind();
    }
    struct emu_bar *bar = &B->bar[id];
    int need;
    if (id == 0) {
        need = B->ntid - B->exited;
    } else {
        if (nthreads < 1 || nthreads > B->ntid ||
            (bar->arrived > 0 && bar->expected != nthreads)) {
            snprintf(msg, sizeof(msg), "kernel %s block %d thread %d: named barrier %d with "
                     "%d threads, but %s", L->k->name, B->index, weft_emu_tls.tid, id, nthreads,
                     bar->arrived > 0 ? "earlier arrivals of this generation passed another count"
                                      : "the block has fewer threads");
            pthread_mutex_unlock(&B->mu);
            WEFT_WARN("emulated GPU: %s (barrier 1..15 takes one count per generation)", msg);
            emu_launch_fail(L, WEFT_CUDA_ERR_LAUNCH_FAILURE);
            emu_unwind();
        }
        if (bar->arrived == 0)
            bar->expected = nthreads;
        need = bar->expected;
    }
    bar->arrived++;
    if (bar->arrived >= need) {
        B->waiting -= bar->arrived - 1;
        bar->arrived = 0;
        bar->gen++;
        pthread_cond_broadcast(&B->cv);
        pthread_mutex_unlock(&B->mu);
        return;
    }
    uint64_t gen = bar->gen;
    B->waiting++;
    if (B->waiting + B->exited == B->ntid) {
        emu_block_deadlock_locked(L, B, msg, sizeof(msg));
        pthread_mutex_unlock(&B->mu);
        WEFT_WARN("emulated GPU: %s", msg);
        emu_launch_fail(L, WEFT_CUDA_ERR_LAUNCH_FAILURE);
        emu_unwind();
    }
    while (bar->gen == gen && !B->trapped)
        pthread_cond_wait(&B->cv, &B->mu);
    int released = bar->gen != gen;
    pthread_mutex_unlock(&B->mu);
    if (!released)
        emu_unwind();
}

void weft_emu_sync_block(void) { emu_bar_arrive(0, 0); }
void weft_emu_bar_sync(int id, int nthreads) { emu_bar_arrive(id, nthreads); }

void weft_emu_spin_hint(void)
{
    static __thread unsigned spins;
    struct emu_launch *L = weft_emu_tls.launch;
    if (L != NULL && __atomic_load_n(&L->failed, __ATOMIC_ACQUIRE))
        emu_unwind();
    /* Mostly yield; now and then sleep, so hundreds of spinning threads leave 2 cores usable. */
    if ((++spins & 255) == 0) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    } else {
        sched_yield();
    }
}

void weft_emu_trap(const char *why)
{
    struct emu_launch *L = weft_emu_tls.launch;
    if (L == NULL) {
        WEFT_WARN("emulated GPU: trap outside a kernel: %s", why ? why : "");
        abort();
    }
    WEFT_WARN("emulated GPU: kernel %s block %d thread %d: trap: %s", L->k->name,
              weft_emu_tls.bid, weft_emu_tls.tid, why ? why : "");
    emu_launch_fail(L, WEFT_CUDA_ERR_ASSERT);
    emu_unwind();
}

/* A thread left the kernel: it no longer counts for sync_block. */
static void emu_block_exit(struct emu_launch *L, struct emu_block *B)
{
    char msg[512];
    int deadlock = 0;
    pthread_mutex_lock(&B->mu);
    B->exited++;
    struct emu_bar *bar0 = &B->bar[0];
    if (bar0->arrived > 0 && bar0->arrived >= B->ntid - B->exited) {
        B->waiting -= bar0->arrived;
        bar0->arrived = 0;
        bar0->gen++;
        pthread_cond_broadcast(&B->cv);
    }
    if (!B->trapped && B->waiting > 0 && B->waiting + B->exited == B->ntid) {
        emu_block_deadlock_locked(L, B, msg, sizeof(msg));
        deadlock = 1;
    }
    pthread_mutex_unlock(&B->mu);
    if (deadlock) {
        WEFT_WARN("emulated GPU: %s", msg);
        emu_launch_fail(L, WEFT_CUDA_ERR_LAUNCH_FAILURE);
    }
}

static void emu_thread_run(struct emu_launch *L, int b, int t)
{
    struct emu_block *B = &L->blocks[b];
    weft_emu_tls.tid = t;
    weft_emu_tls.ntid = L->block;
    weft_emu_tls.bid = b;
    weft_emu_tls.nbid = L->grid;
    weft_emu_tls.device = L->device;
    weft_emu_tls.shared = B->shared;
    weft_emu_tls.block = B;
    weft_emu_tls.launch = L;
    emu_cur_dev = L->device;
    if (!__atomic_load_n(&L->failed, __ATOMIC_ACQUIRE)) {
        if (setjmp(emu_unwind_jmp) == 0)
            L->k->emu_fn(L->params);
    }
    memset(&weft_emu_tls, 0, sizeof(weft_emu_tls));
    emu_block_exit(L, B);
    pthread_mutex_lock(&L->mu);
    if (--L->remaining == 0)
        pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

/* The pool of OS threads that play emulated GPU threads. */
struct emu_worker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int has_job;
    struct emu_launch *L;
    int b, t;
    struct emu_worker *next;
};

static pthread_mutex_t emu_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct emu_worker *emu_pool_idle;

static int emu_pool_remove(struct emu_worker *w)
{
    for (struct emu_worker **pp = &emu_pool_idle; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            return 1;
        }
    }
    return 0;
}

static void *emu_worker_main(void *arg)
{
    struct emu_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->has_job) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 5;
            if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT && !w->has_job) {
                /* Idle too long: leave, unless a dispatcher took us off the list meanwhile. */
                pthread_mutex_unlock(&w->mu);
                pthread_mutex_lock(&emu_pool_mu);
                int removed = emu_pool_remove(w);
                pthread_mutex_unlock(&emu_pool_mu);
                if (removed) {
                    pthread_mutex_destroy(&w->mu);
                    pthread_cond_destroy(&w->cv);
                    free(w);
                    return NULL;
                }
                pthread_mutex_lock(&w->mu);
            }
        }
        struct emu_launch *L = w->L;
        int b = w->b, t = w->t;
        w->has_job = 0;
        pthread_mutex_unlock(&w->mu);
        emu_thread_run(L, b, t);
        pthread_mutex_lock(&emu_pool_mu);
        w->next = emu_pool_idle;
        emu_pool_idle = w;
        pthread_mutex_unlock(&emu_pool_mu);
        pthread_mutex_lock(&w->mu);
    }
}

static int emu_dispatch(struct emu_launch *L, int b, int t)
{
    pthread_mutex_lock(&emu_pool_mu);
    struct emu_worker *w = emu_pool_idle;
    if (w != NULL)
        emu_pool_idle = w->next;
    pthread_mutex_unlock(&emu_pool_mu);
    if (w != NULL) {
        pthread_mutex_lock(&w->mu);
        w->L = L;
        w->b = b;
        w->t = t;
        w->has_job = 1;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return ENOMEM;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->L = L;
    w->b = b;
    w->t = t;
    w->has_job = 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    size_t stack = (size_t)weft_param_EmuStackKb() << 10;
    if (stack < (size_t)PTHREAD_STACK_MIN)
        stack = (size_t)PTHREAD_STACK_MIN;
    pthread_attr_setstacksize(&attr, stack);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int rc = pthread_create(&th, &attr, emu_worker_main, w);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
    }
    return rc;
}

static pthread_mutex_t emu_rng_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t emu_rng_state;

static uint64_t emu_rng_next(void)
{
    pthread_mutex_lock(&emu_rng_mu);
    if (emu_rng_state == 0) {
        uint64_t seed = (uint64_t)weft_param_EmuSeed();
        if (seed == 0) {
            seed = emu_now_ns() | 1;
            WEFT_INFO(WEFT_LOG_INIT, "emu: serialized block order seed %llu (WEFT_EMU_SEED)",
                      (unsigned long long)seed);
        }
        emu_rng_state = seed;
    }
    uint64_t x = emu_rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    emu_rng_state = x;
    pthread_mutex_unlock(&emu_rng_mu);
    return x;
}

/* Starts the threads of blocks [first, first + nblocks) of order, then waits for them. */
static void emu_run_wave(struct emu_launch *L, const int *order, int first, int nblocks,
                         struct emu_stream *s)
{
    pthread_mutex_lock(&L->mu);
    L->remaining = nblocks * L->block;
    pthread_mutex_unlock(&L->mu);
    for (int i = first; i < first + nblocks; i++) {
        int b = order[i];
        for (int t = 0; t < L->block; t++) {
            int rc = emu_dispatch(L, b, t);
            if (rc != 0) {
                WEFT_WARN("emulated GPU: kernel %s: cannot start thread %d of block %d: %s",
                          L->k->name, t, b, strerror(rc));
                emu_launch_fail(L, WEFT_CUDA_ERR_LAUNCH_RESOURCES);
                emu_block_exit(L, &L->blocks[b]);
                pthread_mutex_lock(&L->mu);
                L->remaining--;
                pthread_mutex_unlock(&L->mu);
            }
        }
    }
    uint64_t start = emu_now_ns();
    int warned = 0;
    char what[256];
    snprintf(what, sizeof(what), "stream %p running kernel %s", (void *)s, L->k->name);
    pthread_mutex_lock(&L->mu);
    while (L->remaining > 0)
        emu_cond_wait(&L->cv, &L->mu, start, &warned, what);
    pthread_mutex_unlock(&L->mu);
}

static int emu_kernel_run(struct emu_stream *s, struct emu_item *it)
{
    struct emu_launch L;
    memset(&L, 0, sizeof(L));
    L.k = it->k;
    L.params = it->params;
    L.grid = it->grid;
    L.block = it->block;
    L.device = s->device;
    pthread_mutex_init(&L.mu, NULL);
    pthread_cond_init(&L.cv, NULL);
    int res = WEFT_CUDA_SUCCESS;
    int *order = malloc((size_t)L.grid * sizeof(int));
    L.blocks = calloc((size_t)L.grid, sizeof(struct emu_block));
    if (order == NULL || L.blocks == NULL) {
        WEFT_WARN("emulated GPU: kernel %s: out of memory for %d blocks", L.k->name, L.grid);
        res = WEFT_CUDA_ERR_LAUNCH_RESOURCES;
        goto out;
    }
    int nready = 0;
    for (int b = 0; b < L.grid; b++, nready++) {
        struct emu_block *B = &L.blocks[b];
        pthread_mutex_init(&B->mu, NULL);
        pthread_cond_init(&B->cv, NULL);
        B->index = b;
        B->ntid = L.block;
        if (it->shared > 0) {
            B->shared = aligned_alloc(64, (it->shared + 63) / 64 * 64);
            if (B->shared == NULL) {
                WEFT_WARN("emulated GPU: kernel %s: out of memory for shared memory", L.k->name);
                res = WEFT_CUDA_ERR_LAUNCH_RESOURCES;
                pthread_mutex_destroy(&B->mu);
                pthread_cond_destroy(&B->cv);
                goto out_blocks;
            }
            /* Shared memory starts undefined on a GPU: garbage, so reliance on zeros shows. */
            memset(B->shared, 0xa5, it->shared);
        }
        order[b] = b;
    }
    __atomic_store_n(&s->running, L.k->name, __ATOMIC_RELAXED);
    __atomic_add_fetch(&emu_kernels_running, 1, __ATOMIC_ACQ_REL);
    int64_t wave = weft_param_EmuSerialize();
    if (wave > 0) {
        for (int i = L.grid - 1; i > 0; i--) {
            int j = (int)(emu_rng_next() % (uint64_t)(i + 1));
            int tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
        for (int i = 0; i < L.grid; i += (int)wave)
            emu_run_wave(&L, order, i, L.grid - i < wave ? L.grid - i : (int)wave, s);
    } else {
        emu_run_wave(&L, order, 0, L.grid, s);
    }
    __atomic_sub_fetch(&emu_kernels_running, 1, __ATOMIC_ACQ_REL);
    __atomic_store_n(&s->running, NULL, __ATOMIC_RELAXED);
    res = L.err;
out_blocks:
    for (int b = 0; b < nready; b++) {
        free(L.blocks[b].shared);
        pthread_mutex_destroy(&L.blocks[b].mu);
        pthread_cond_destroy(&L.blocks[b].cv);
    }
out:
    free(L.blocks);
    free(order);
    pthread_mutex_destroy(&L.mu);
    pthread_cond_destroy(&L.cv);
    return res;
}

/* ---- stream worker --------------------------------------------------------------------------- */

static int emu_item_run(struct emu_stream *s, struct emu_item *it)
{
    switch (it->kind) {
    case EMU_KERNEL:
        return emu_kernel_run(s, it);
    case EMU_MEMCPY:
        memmove(it->dst, it->src, it->bytes);
        return WEFT_CUDA_SUCCESS;
    case EMU_MEMSET:
        memset(it->dst, it->value, it->bytes);
        return WEFT_CUDA_SUCCESS;
    case EMU_RECORD:
        emu_event_reached(it->ev, it->ticket);
        return WEFT_CUDA_SUCCESS;
    case EMU_WAIT: {
        struct emu_event *e = it->ev;
        struct emu_wait w;
        char what[128];
        int res = WEFT_CUDA_SUCCESS;
        snprintf(what, sizeof(what), "stream %p waiting for event %p", (void *)s, (void *)e);
        pthread_mutex_lock(&e->mu);
        emu_wait_begin(&w, what, e->done);
        while (emu_event_pending(e, it->ticket)) {
            if (__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
                WEFT_INFO(WEFT_LOG_INIT, "emu: stream %p destroyed: event wait abandoned",
                          (void *)s);
                break;
            }
            emu_cond_wait(&e->cv, &e->mu, w.start_ns, &w.warned, what);
            if (emu_event_pending(e, it->ticket) && emu_wait_expired(&w, e->done)) {
                res = WEFT_CUDA_ERR_LAUNCH_TIMEOUT;
                break;
            }
        }
        pthread_mutex_unlock(&e->mu);
        return res;
    }
    case EMU_HOSTFN:
        it->fn(it->arg);
        return WEFT_CUDA_SUCCESS;
    }
    return WEFT_CUDA_ERR_UNKNOWN;
}

/* Waits until it is at the head of its stream's hardware queue; 702 if its turn did not come
 * within the deadline (it then goes out of turn). */
static int emu_hwq_turn(struct emu_stream *s, const struct emu_item *it)
{
    struct emu_hwq *q = s->hwq;
    int res = WEFT_CUDA_SUCCESS;
    pthread_mutex_lock(&q->mu);
    if (q->head != it->qticket) {
        struct emu_wait w;
        char what[128];
        snprintf(what, sizeof(what), "stream %p waiting for its turn in hardware queue %d of "
                 "device %d (CUDA_DEVICE_MAX_CONNECTIONS %d)", (void *)s,
                 (int)(q - emu_hwqs[s->device]), s->device, emu_nhwq);
        emu_wait_begin(&w, what, q->head);
        while (q->head != it->qticket) {
            emu_cond_wait(&q->cv, &q->mu, w.start_ns, &w.warned, what);
            if (q->head != it->qticket && emu_wait_expired(&w, q->head)) {
                res = WEFT_CUDA_ERR_LAUNCH_TIMEOUT;
                break;
            }
        }
    }
    pthread_mutex_unlock(&q->mu);
    return res;
}

/* The item left the head of its queue: the next in turn may go. */
static void emu_hwq_leave(struct emu_stream *s, const struct emu_item *it)
{
    struct emu_hwq *q = s->hwq;
    pthread_mutex_lock(&q->mu);
    if (it->qticket != q->head) {
        if (q->nlate < EMU_HWQ_LATE) /* else the queue stays stuck: later turns fail too */
            q->late[q->nlate++] = it->qticket;
    } else {
        q->head++;
        for (int i = 0; i < q->nlate; i++)
            if (q->late[i] == q->head) {
                q->late[i] = q->late[--q->nlate];
                q->head++;
                i = -1;
            }
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void *emu_stream_main(void *arg)
{
    struct emu_stream *s = arg;
    emu_cur_dev = s->device;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == NULL)
            break;
        struct emu_item *it = s->head;
        s->head = it->next;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        /* An event wait or a host function holds its queue until it is over; other items leave
         * the head as they start (a kernel runs beside the work queued after it). */
        int err = emu_hwq_turn(s, it);
        int holds = it->kind == EMU_WAIT || it->kind == EMU_HOSTFN;
        if (!holds)
            emu_hwq_leave(s, it);
        int run_err = emu_item_run(s, it);
        if (holds)
            emu_hwq_leave(s, it);
        if (err == WEFT_CUDA_SUCCESS)
            err = run_err;
        emu_item_free(it);
        pthread_mutex_lock(&s->mu);
        if (err != WEFT_CUDA_SUCCESS && s->err == WEFT_CUDA_SUCCESS)
            s->err = err;
        __atomic_store_n(&s->done, s->done + 1, __ATOMIC_RELAXED);
        pthread_cond_broadcast(&s->cv);
    }
    s->exited = 1;
    pthread_cond_broadcast(&s->cv);
    int orphaned = s->orphaned;
    pthread_mutex_unlock(&s->mu);
    if (orphaned)
        emu_stream_unref(s); /* destroy returned long ago: the handle's reference is ours */
    return NULL;
}

static int emu_stream_wait_idle(struct emu_stream *s)
{
    struct emu_wait w;
    char what[96];
    snprintf(what, sizeof(what), "synchronize of stream %p", (void *)s);
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->enq;
    int err = WEFT_CUDA_SUCCESS;
    emu_wait_begin(&w, what, s->done);
    while (s->done < target && err == WEFT_CUDA_SUCCESS) {
        emu_cond_wait(&s->cv, &s->mu, w.start_ns, &w.warned, what);
        if (s->done < target && emu_wait_expired(&w, s->done))
            err = WEFT_CUDA_ERR_LAUNCH_TIMEOUT;
    }
    if (err == WEFT_CUDA_SUCCESS)
        err = s->err;
    pthread_mutex_unlock(&s->mu);
    return err;
}

/* Drops a reference; the last one frees the stream (its worker has exited: joined by destroy,
 * or detached and dropping the last reference itself). */
static void emu_stream_unref(struct emu_stream *s)
{
    pthread_mutex_lock(&emu_mu);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&emu_mu);
    if (!last)
        return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Waits for the queued work of every stream of dev (cudaDeviceSynchronize, cudaFree). */
static int emu_device_wait(int dev)
{
    struct emu_stream *list[256];
    int n = 0, res = WEFT_CUDA_SUCCESS;
    /*
     * Each listed stream is held by a reference: another thread may destroy one while we wait on
     * an earlier one (ranks sharing a device: one frees a buffer while another destroys its
     * stream). Without the reference, destroy freed the stream under us and we then locked or
     * slept on freed memory: a use-after-free that hung cudaFree forever (seen as a hang of
     * coll-initrank-nonblocking-3x2 under MALLOC_PERTURB_). A destroyed stream's worker drained
     * its queue before exiting, so the wait on it ends at once.
     */
    pthread_mutex_lock(&emu_mu);
    for (struct emu_stream *s = emu_streams; s != NULL && n < 256; s = s->next) {
        if (s->device == dev) {
            s->refs++;
            list[n++] = s;
        }
    }
    pthread_mutex_unlock(&emu_mu);
    for (int i = 0; i < n; i++) {
        int err = emu_stream_wait_idle(list[i]);
        if (res == WEFT_CUDA_SUCCESS || err == WEFT_CUDA_ERR_LAUNCH_TIMEOUT)
            res = err; /* a timeout first: cudaFree must not free under stuck work */
        emu_stream_unref(list[i]);
    }
    return res;
}

/* ---- the table's slots ----------------------------------------------------------------------- */

static int emu_get_device_count(int *n_p)
{
    if (n_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    *n_p = emu_ndev;
    return WEFT_CUDA_SUCCESS;
}

static int emu_get_device(int *dev_p)
{
    if (dev_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    *dev_p = emu_cur_dev;
    return WEFT_CUDA_SUCCESS;
}

static int emu_set_device(int dev)
{
    if (dev < 0 || dev >= emu_ndev) {
        WEFT_WARN("emulated cudaSetDevice(%d): %d devices", dev, emu_ndev);
        return WEFT_CUDA_ERR_INVALID_DEVICE;
    }
    emu_cur_dev = dev;
    return WEFT_CUDA_SUCCESS;
}

static int emu_can_access_peer(int *can_p, int dev, int peer)
{
    if (can_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    if (dev < 0 || dev >= emu_ndev || peer < 0 || peer >= emu_ndev)
        return WEFT_CUDA_ERR_INVALID_DEVICE;
    *can_p = dev != peer && weft_param_EmuPeer() != 0;
    return WEFT_CUDA_SUCCESS;
}

static int emu_enable_peer_access(int peer)
{
    int dev = emu_cur_dev;
    if (peer < 0 || peer >= emu_ndev || peer == dev) {
        WEFT_WARN("emulated cudaDeviceEnablePeerAccess(%d) from device %d: invalid peer", peer,
                  dev);
        return WEFT_CUDA_ERR_INVALID_DEVICE;
    }
    if (weft_param_EmuPeer() == 0) {
        WEFT_WARN("emulated cudaDeviceEnablePeerAccess(%d) from device %d: peer access "
                  "unsupported (WEFT_EMU_PEER=0)", peer, dev);
        return WEFT_CUDA_ERR_PEER_UNSUPPORTED;
    }
    pthread_mutex_lock(&emu_mu);
    int was = emu_peer[dev][peer];
    emu_peer[dev][peer] = 1;
    pthread_mutex_unlock(&emu_mu);
    return was ? WEFT_CUDA_ERR_PEER_ALREADY_ENABLED : WEFT_CUDA_SUCCESS;
}

static uint64_t emu_malloc_count, emu_launch_count;

static int emu_malloc(void **p_p, size_t bytes)
{
    if (p_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    int res = emu_forbid_in_capture("cudaMalloc");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    uint64_t n = __atomic_add_fetch(&emu_malloc_count, 1, __ATOMIC_RELAXED);
    if (WEFT_FAULT_ARMED() && weft_fault_call(WEFT_FAULT_DEVALLOC)) {
        WEFT_WARN("emulated cudaMalloc of %zu bytes: call %llu fails (WEFT_FAULT devalloc)",
                  bytes, (unsigned long long)n);
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    }
    if (bytes == 0) {
        *p_p = NULL;
        return WEFT_CUDA_SUCCESS;
    }
    return emu_alloc_new(p_p, bytes, WEFT_MEM_DEVICE, emu_cur_dev, EMU_PLAIN);
}

/* ---- legacy IPC: opens by other processes, counted in the memory itself ---------------------- */

static uint64_t emu_ipc_busy_frees; /* cudaFree of memory another process had open */

uint64_t weft_emu_ipc_busy_frees(void)
{
    return __atomic_load_n(&emu_ipc_busy_frees, __ATOMIC_ACQUIRE);
}

/*
 * Adds delta to the count of processes that have cudaMalloc memory fd open through a legacy IPC
 * handle (the word in the page at data_bytes, past the allocation's data) and returns the new
 * count, or -1 when the page cannot be mapped (then nothing is counted).
 */
static int emu_ipc_opens(int fd, size_t data_bytes, int delta)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < data_bytes + page)
        return -1;
    int *w = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)data_bytes);
    if (w == MAP_FAILED)
        return -1;
    int n = __atomic_add_fetch(w, delta, __ATOMIC_ACQ_REL);
    munmap(w, page);
    return n;
}

/* cudaFree of p: memory that another process still has open (cudaIpcOpenMemHandle without
 * cudaIpcCloseMemHandle) is freed under it, which CUDA lets fault the importer: reported. */
static void emu_ipc_check_free(void *p)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int fd = -1;
    size_t data = 0;
    pthread_rwlock_rdlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    if (i >= 0 && emu_live.v[i].base == (uintptr_t)p && emu_live.v[i].origin == EMU_PLAIN &&
        emu_live.v[i].kind == WEFT_MEM_DEVICE) {
        fd = fcntl(emu_live.v[i].fd, F_DUPFD_CLOEXEC, 0);
        data = emu_live.v[i].map_size - page;
    }
    pthread_rwlock_unlock(&emu_mem_lock);
    if (fd < 0)
        return;
    int opens = emu_ipc_opens(fd, data, 0);
    close(fd);
    if (opens > 0) {
        __atomic_add_fetch(&emu_ipc_busy_frees, 1, __ATOMIC_ACQ_REL);
        WEFT_WARN("emulated cudaFree(%p): %d other process%s still ha%s this memory open "
                  "(cudaIpcOpenMemHandle without cudaIpcCloseMemHandle): freed under %s, an "
                  "access there faults on a GPU", p, opens, opens == 1 ? "" : "es",
                  opens == 1 ? "s" : "ve", opens == 1 ? "it" : "them");
    }
}

static int emu_free(void *p)
{
    if (p == NULL)
        return WEFT_CUDA_SUCCESS;
    int res = emu_forbid_in_capture("cudaFree");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    struct weft_ptr_attr a;
    pthread_rwlock_rdlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    a.device = i >= 0 ? emu_live.v[i].device : -1;
    pthread_rwlock_unlock(&emu_mem_lock);
    /* cudaFree waits for the device's work: a kernel still running must not fault. Work stuck
     * past the deadline may still touch the buffer: it stays (and the error says so). */
    if (a.device >= 0 && emu_device_wait(a.device) == WEFT_CUDA_ERR_LAUNCH_TIMEOUT)
        return WEFT_CUDA_ERR_LAUNCH_TIMEOUT;
    emu_ipc_check_free(p);
    return emu_alloc_release(p, WEFT_MEM_DEVICE, EMU_PLAIN, "cudaFree");
}

static int emu_host_alloc(void **p_p, size_t bytes)
{
    if (p_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    int res = emu_forbid_in_capture("cudaHostAlloc");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    if (bytes == 0) {
        *p_p = NULL;
        return WEFT_CUDA_SUCCESS;
    }
    return emu_alloc_new(p_p, bytes, WEFT_MEM_HOST_PINNED, -1, EMU_PLAIN);
}

static int emu_host_free(void *p)
{
    if (p == NULL)
        return WEFT_CUDA_SUCCESS;
    int res = emu_forbid_in_capture("cudaFreeHost");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    return emu_alloc_release(p, WEFT_MEM_HOST_PINNED, EMU_PLAIN, "cudaFreeHost");
}

/* ---- shareable memory: cuMem-style (a file descriptor) and legacy IPC (a 64-byte handle) ---- */

/* The ordinal of physical device phys in this process, -1 when it does not see it. */
static int emu_ordinal_of(int phys)
{
    for (int d = 0; d < emu_ndev; d++)
        if (emu_phys[d] == phys)
            return d;
    return -1;
}

/* The physical device of the memory behind memfd fd (its name says), -1 for none. */
static int emu_fd_phys(int fd)
{
    char path[64], link[128];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n <= 0)
        return -1;
    link[n] = '\0';
    const char *at = strstr(link, EMU_MEMFD_DEV);
    if (at == NULL)
        return -1;
    at += strlen(EMU_MEMFD_DEV);
    return *at >= '0' && *at <= '9' ? atoi(at) : -1;
}

/*
 * Whether the current device may map memory of physical device phys (its own always may; another
 * only if this process sees it and peer access is possible), as cuMemSetAccess or
 * cudaIpcOpenMemHandle decide. *owner_p: phys's ordinal here. owner_dev, when >= 0, is the
 * caller's claim of that ordinal: a wrong claim is the caller's bug (an ordinal of another
 * process taken for one of this process).
 */
static int emu_reaches(int phys, int owner_dev, int *owner_p, const char *api)
{
    int owner = emu_ordinal_of(phys);
    if (owner == emu_cur_dev) {
        *owner_p = owner;
        return WEFT_CUDA_SUCCESS;
    }
    if (owner < 0) {
        WEFT_WARN("emulated %s: device %d (emulated device %d) cannot access memory of emulated "
                  "device %d: not visible in this process (CUDA_VISIBLE_DEVICES)", api,
                  emu_cur_dev, emu_phys[emu_cur_dev], phys);
        return WEFT_CUDA_ERR_PEER_UNSUPPORTED;
    }
    if (weft_param_EmuPeer() == 0) {
        WEFT_WARN("emulated %s: device %d cannot access memory of device %d (WEFT_EMU_PEER=0)",
                  api, emu_cur_dev, owner);
        return WEFT_CUDA_ERR_PEER_UNSUPPORTED;
    }
    if (owner_dev >= 0 && owner_dev != owner) {
        WEFT_WARN("emulated %s: the memory is of device %d here, not of device %d", api, owner,
                  owner_dev);
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    *owner_p = owner;
    return WEFT_CUDA_SUCCESS;
}

static int emu_mem_create(void **p_p, size_t bytes, int kind)
{
    if (p_p == NULL || bytes == 0 || (kind != WEFT_MEM_DEVICE && kind != WEFT_MEM_HOST_PINNED))
        return WEFT_CUDA_ERR_INVALID_VALUE;
    int res = emu_forbid_in_capture("cuMemCreate");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    return emu_alloc_new(p_p, bytes, kind, kind == WEFT_MEM_DEVICE ? emu_cur_dev : -1,
                         EMU_SHAREABLE);
}

static int emu_mem_export(int *fd_p, void *p)
{
    if (fd_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    int fd = -1;
    pthread_rwlock_rdlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    if (i >= 0 && emu_live.v[i].base == (uintptr_t)p && emu_live.v[i].origin == EMU_SHAREABLE)
        fd = fcntl(emu_live.v[i].fd, F_DUPFD_CLOEXEC, 0);
    pthread_rwlock_unlock(&emu_mem_lock);
    if (fd < 0) {
        WEFT_WARN("emulated cuMemExportToShareableHandle(%p): %s", p,
                  i < 0 ? "not an emulated allocation" : "not the start of a cuMemCreate allocation");
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    *fd_p = fd;
    return WEFT_CUDA_SUCCESS;
}

/* Maps memfd `fd` (borrowed: duplicated here) of at least `bytes` bytes as kind/device. */
static int emu_map_foreign(void **p_p, int fd, size_t bytes, int kind, int device, int origin,
                           const char *api)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t data = (bytes + page - 1) / page * page;
    struct stat sb;
    /* Only a memfd (an emulated allocation) carries seals; anything else is not CUDA memory. */
    if (fstat(fd, &sb) != 0 || fcntl(fd, F_GET_SEALS) < 0 || (size_t)sb.st_size < data) {
        WEFT_WARN("emulated %s: descriptor %d is not an emulated allocation of %zu bytes", api, fd,
                  bytes);
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (mine < 0) {
        WEFT_WARN("emulated %s: dup failed: %s", api, strerror(errno));
        return WEFT_CUDA_ERR_MAP_FAILED;
    }
    struct emu_alloc t;
    memset(&t, 0, sizeof(t));
    t.kind = kind;
    t.device = device;
    t.origin = origin;
    t.refs = 1;
    int res = emu_alloc_map(p_p, mine, bytes, data, t);
    return res == WEFT_CUDA_SUCCESS ? res : WEFT_CUDA_ERR_MAP_FAILED;
}

static int emu_mem_import(void **p_p, int fd, size_t bytes, int kind, int owner_dev)
{
    if (p_p == NULL || fd < 0 || bytes == 0 ||
        (kind != WEFT_MEM_DEVICE && kind != WEFT_MEM_HOST_PINNED))
        return WEFT_CUDA_ERR_INVALID_VALUE;
    int owner = -1;
    if (kind == WEFT_MEM_DEVICE) {
        int phys = emu_fd_phys(fd);
        if (phys < 0) {
            WEFT_WARN("emulated cuMemImportFromShareableHandle: descriptor %d is not emulated "
                      "device memory", fd);
            return WEFT_CUDA_ERR_INVALID_VALUE;
        }
        int res = emu_reaches(phys, owner_dev, &owner, "cuMemImportFromShareableHandle");
        if (res != WEFT_CUDA_SUCCESS)
            return res;
    }
    return emu_map_foreign(p_p, fd, bytes, kind, owner, EMU_IMPORTED,
                           "cuMemImportFromShareableHandle");
}

static int emu_mem_release(void *p)
{
    if (p == NULL)
        return WEFT_CUDA_SUCCESS;
    /* As the real backend (cuMemUnmap, cuMemRelease): no wait for queued work, and allowed
     * during a capture (no synchronisation). A kernel still using the memory faults on the
     * quarantined range: the caller's bug shows. */
    return emu_alloc_release(p, -1, EMU_SHAREABLE, "cuMemRelease");
}

/* The emulator's cudaIpcMemHandle_t: the exporter's pid and descriptor name the memfd; the
 * inode and a check word tell a stale or forged handle from a live one. */
#define EMU_IPC_MAGIC 0x3163706974666577ull /* "weftipc1" */
struct emu_ipc_handle {
    uint64_t magic;
    int32_t pid;
    int32_t fd;
    uint64_t ino;
    uint64_t size;
    int32_t device;
    int32_t pad;
    uint64_t check;
    char unused[WEFT_CUDA_IPC_HANDLE_BYTES - 48];
};
_Static_assert(sizeof(struct emu_ipc_handle) == WEFT_CUDA_IPC_HANDLE_BYTES, "IPC handle size");

static uint64_t emu_ipc_check(const struct emu_ipc_handle *h)
{
    uint64_t x = h->magic ^ ((uint64_t)(uint32_t)h->pid << 32) ^ (uint32_t)h->fd;
    x ^= h->ino * 0x9e3779b97f4a7c15ull ^ h->size * 0xc2b2ae3d27d4eb4full ^ (uint64_t)h->device;
    x ^= x >> 29;
    return x * 0xbf58476d1ce4e5b9ull;
}

static int emu_ipc_get_handle(struct weft_cuda_ipc_handle *h_p, void *p)
{
    if (h_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct emu_ipc_handle h;
    memset(&h, 0, sizeof(h));
    pthread_rwlock_rdlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    int ok = i >= 0 && emu_live.v[i].kind == WEFT_MEM_DEVICE && emu_live.v[i].origin == EMU_PLAIN;
    if (ok) {
        h.magic = EMU_IPC_MAGIC;
        h.pid = (int32_t)getpid();
        h.fd = emu_live.v[i].fd;
        h.ino = emu_live.v[i].ino;
        h.size = emu_live.v[i].size;
        h.device = emu_phys[emu_live.v[i].device]; /* what every process calls it */
        h.check = emu_ipc_check(&h);
    }
    pthread_rwlock_unlock(&emu_mem_lock);
    if (!ok) {
        WEFT_WARN("emulated cudaIpcGetMemHandle(%p): not device memory from cudaMalloc", p);
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    memcpy(h_p->bytes, &h, sizeof(h));
    return WEFT_CUDA_SUCCESS;
}

static int emu_ipc_open_handle(void **p_p, const struct weft_cuda_ipc_handle *hp)
{
    if (p_p == NULL || hp == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct emu_ipc_handle h;
    memcpy(&h, hp->bytes, sizeof(h));
    if (h.magic != EMU_IPC_MAGIC || h.check != emu_ipc_check(&h)) {
        WEFT_WARN("emulated cudaIpcOpenMemHandle: not an IPC memory handle");
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    if (h.pid == (int32_t)getpid()) {
        WEFT_WARN("emulated cudaIpcOpenMemHandle: the handle was made in this process (CUDA "
                  "cannot open it here)");
        return WEFT_CUDA_ERR_INVALID_CONTEXT;
    }
    int owner = -1;
    int res = emu_reaches(h.device, -1, &owner, "cudaIpcOpenMemHandle");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    /* Opened already in this process: the same mapping, one more reference. */
    void *found = NULL;
    pthread_rwlock_wrlock(&emu_mem_lock);
    for (int i = 0; i < emu_live.n && found == NULL; i++) {
        struct emu_alloc *a = &emu_live.v[i];
        if (a->origin == EMU_IPC_OPENED && a->ipc_pid == h.pid && a->ino == h.ino) {
            a->refs++;
            found = (void *)a->base;
        }
    }
    pthread_rwlock_unlock(&emu_mem_lock);
    if (found != NULL) {
        *p_p = found;
        return WEFT_CUDA_SUCCESS;
    }
    /* The driver's part: fetch the exporter's descriptor (pidfd_getfd needs ptrace permission
     * over it, which a job's own processes have here). */
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)h.pid, 0);
    int fd = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, h.fd, 0);
    int err = errno;
    if (pidfd >= 0)
        close(pidfd);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || (uint64_t)sb.st_ino != h.ino) {
        WEFT_WARN("emulated cudaIpcOpenMemHandle: the memory of process %d is gone (%s)", h.pid,
                  fd < 0 ? strerror(err) : "freed");
        if (fd >= 0)
            close(fd);
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    void *p = NULL;
    res = emu_map_foreign(&p, fd, (size_t)h.size, WEFT_MEM_DEVICE, owner, EMU_IPC_OPENED,
                          "cudaIpcOpenMemHandle");
    if (res == WEFT_CUDA_SUCCESS) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        emu_ipc_opens(fd, ((size_t)h.size + page - 1) / page * page, 1);
    }
    close(fd);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_rwlock_wrlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    if (i >= 0)
        emu_live.v[i].ipc_pid = h.pid;
    pthread_rwlock_unlock(&emu_mem_lock);
    *p_p = p;
    return WEFT_CUDA_SUCCESS;
}

static int emu_ipc_close_handle(void *p)
{
    pthread_rwlock_rdlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    int device = i >= 0 ? emu_live.v[i].device : -1;
    pthread_rwlock_unlock(&emu_mem_lock);
    if (device >= 0 && emu_device_wait(device) == WEFT_CUDA_ERR_LAUNCH_TIMEOUT)
        return WEFT_CUDA_ERR_LAUNCH_TIMEOUT; /* as cudaFree */
    return emu_alloc_release(p, WEFT_MEM_DEVICE, EMU_IPC_OPENED, "cudaIpcCloseMemHandle");
}

static int emu_pointer_attr(struct weft_ptr_attr *attr_p, const void *p)
{
    if (attr_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct weft_ptr_attr a = {WEFT_MEM_HOST, -1, NULL, NULL, 0};
    int res = WEFT_CUDA_SUCCESS;
    pthread_rwlock_rdlock(&emu_mem_lock);
    int i = emu_table_find(&emu_live, (uintptr_t)p, 0);
    if (i >= 0) {
        a.kind = emu_live.v[i].kind;
        a.device = emu_live.v[i].device;
        a.dev_ptr = (void *)p;
        a.base = (void *)emu_live.v[i].base;
        a.size = emu_live.v[i].size;
    } else if (emu_table_find(&emu_freed, (uintptr_t)p, 1) >= 0) {
        res = WEFT_CUDA_ERR_INVALID_VALUE;
    }
    pthread_rwlock_unlock(&emu_mem_lock);
    if (res != WEFT_CUDA_SUCCESS) {
        WEFT_WARN("emulated cudaPointerGetAttributes(%p): freed emulated memory", p);
        return res;
    }
    *attr_p = a;
    return WEFT_CUDA_SUCCESS;
}

static int emu_memcpy_async(void *dst, const void *src, size_t bytes, weft_cuda_stream_t h)
{
    if (bytes > 0 && (dst == NULL || src == NULL)) {
        WEFT_WARN("emulated cudaMemcpyAsync: NULL %s with %zu bytes", dst ? "src" : "dst", bytes);
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    int res = emu_check_range(dst, bytes, "cudaMemcpyAsync", "dst");
    if (res == WEFT_CUDA_SUCCESS)
        res = emu_check_range(src, bytes, "cudaMemcpyAsync", "src");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    struct emu_stream *s;
    res = emu_stream_get(h, "cudaMemcpyAsync", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    if (bytes == 0)
        return WEFT_CUDA_SUCCESS;
    struct emu_item *it = emu_item_new(EMU_MEMCPY, "cudaMemcpyAsync");
    if (it == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    it->dst = dst;
    it->src = src;
    it->bytes = bytes;
    return emu_submit(s, it);
}

static int emu_memset_async(void *dst, int value, size_t bytes, weft_cuda_stream_t h)
{
    if (bytes > 0 && dst == NULL) {
        WEFT_WARN("emulated cudaMemsetAsync: NULL dst with %zu bytes", bytes);
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    int res = emu_check_range(dst, bytes, "cudaMemsetAsync", "dst");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    struct emu_stream *s;
    res = emu_stream_get(h, "cudaMemsetAsync", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    if (bytes == 0)
        return WEFT_CUDA_SUCCESS;
    struct emu_item *it = emu_item_new(EMU_MEMSET, "cudaMemsetAsync");
    if (it == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    it->dst = dst;
    it->value = value;
    it->bytes = bytes;
    return emu_submit(s, it);
}

static int emu_stream_create(weft_cuda_stream_t *s_p)
{
    if (s_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct emu_stream *s;
    int res = emu_stream_new(emu_cur_dev, 0, &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&emu_mu);
    s->next = emu_streams;
    emu_streams = s;
    pthread_mutex_unlock(&emu_mu);
    *s_p = s;
    return WEFT_CUDA_SUCCESS;
}

static int emu_stream_destroy(weft_cuda_stream_t h)
{
    if (h == NULL) {
        WEFT_WARN("emulated cudaStreamDestroy: the legacy stream cannot be destroyed");
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&emu_mu);
    struct emu_stream **pp = &emu_streams;
    while (*pp != NULL && *pp != (struct emu_stream *)h)
        pp = &(*pp)->next;
    struct emu_stream *s = *pp;
    if (s != NULL && s->cap != NULL) {
        emu_capture_invalidate(s->cap, "a capturing stream was destroyed");
        s = NULL;
    } else if (s != NULL) {
        *pp = s->next;
    }
    pthread_mutex_unlock(&emu_mu);
    if (s == NULL) {
        WEFT_WARN("emulated cudaStreamDestroy: %p is not a live emulated stream (or captures)", h);
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    /* The worker drains the queue and exits; a host function that never returns would hold
     * the join forever, so the wait has the deadline of the other host waits. */
    struct emu_wait w;
    char what[96];
    snprintf(what, sizeof(what), "destroy of stream %p", (void *)s);
    int res = WEFT_CUDA_SUCCESS;
    pthread_mutex_lock(&s->mu);
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&s->cv);
    emu_wait_begin(&w, what, s->done);
    while (!s->exited) {
        emu_cond_wait(&s->cv, &s->mu, w.start_ns, &w.warned, what);
        if (!s->exited && emu_wait_expired(&w, s->done)) {
            /* Left to finish on its own: it frees the stream when (if ever) it gets there. */
            s->orphaned = 1;
            pthread_detach(s->worker);
            res = WEFT_CUDA_ERR_LAUNCH_TIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_join(s->worker, NULL);
    emu_stream_unref(s); /* freed now, or by the last emu_device_wait still using it */
    return WEFT_CUDA_SUCCESS;
}

static int emu_stream_synchronize(weft_cuda_stream_t h)
{
    struct emu_stream *s;
    int res = emu_stream_get(h, "cudaStreamSynchronize", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&emu_mu);
    if (s->cap != NULL) {
        emu_capture_invalidate(s->cap, "cudaStreamSynchronize of the capturing stream");
        res = WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED;
    }
    pthread_mutex_unlock(&emu_mu);
    if (res == WEFT_CUDA_SUCCESS)
        res = emu_forbid_in_capture(s->legacy ? "synchronize of the legacy stream (synchronous "
                                                "memcpy)"
                                              : "cudaStreamSynchronize");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    return emu_stream_wait_idle(s);
}

static int emu_stream_query(weft_cuda_stream_t h)
{
    struct emu_stream *s;
    int res = emu_stream_get(h, "cudaStreamQuery", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&emu_mu);
    if (s->cap != NULL) {
        emu_capture_invalidate(s->cap, "cudaStreamQuery of the capturing stream");
        res = WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED;
    }
    pthread_mutex_unlock(&emu_mu);
    if (res == WEFT_CUDA_SUCCESS)
        res = emu_forbid_in_capture("cudaStreamQuery");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&s->mu);
    res = s->err != WEFT_CUDA_SUCCESS ? s->err :
          s->done < s->enq ? WEFT_CUDA_ERR_NOT_READY : WEFT_CUDA_SUCCESS;
    pthread_mutex_unlock(&s->mu);
    return res;
}

static int emu_stream_capturing(weft_cuda_stream_t h, int *capturing_p)
{
    if (capturing_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct emu_stream *s;
    int res = emu_stream_get(h, "cudaStreamIsCapturing", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&emu_mu);
    *capturing_p = s->cap != NULL;
    pthread_mutex_unlock(&emu_mu);
    return WEFT_CUDA_SUCCESS;
}

static int emu_event_create(weft_cuda_event_t *e_p)
{
    if (e_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct emu_event *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        WEFT_WARN("emulated cudaEventCreate: out of memory");
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->refs = 1;
    e->device = emu_cur_dev;
    pthread_mutex_lock(&emu_mu);
    e->next = emu_events;
    emu_events = e;
    pthread_mutex_unlock(&emu_mu);
    *e_p = e;
    return WEFT_CUDA_SUCCESS;
}

static int emu_event_destroy(weft_cuda_event_t h)
{
    pthread_mutex_lock(&emu_mu);
    struct emu_event **pp = &emu_events;
    while (*pp != NULL && *pp != (struct emu_event *)h)
        pp = &(*pp)->next;
    struct emu_event *e = *pp;
    if (e != NULL)
        *pp = e->next;
    pthread_mutex_unlock(&emu_mu);
    if (e == NULL) {
        WEFT_WARN("emulated cudaEventDestroy: %p is not a live emulated event", h);
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    emu_event_unref(e); /* queued records and waits keep it alive until they ran */
    return WEFT_CUDA_SUCCESS;
}

static int emu_event_record(weft_cuda_event_t eh, weft_cuda_stream_t sh)
{
    struct emu_event *e;
    struct emu_stream *s;
    int res = emu_event_get(eh, "cudaEventRecord", &e);
    if (res == WEFT_CUDA_SUCCESS)
        res = emu_stream_get(sh, "cudaEventRecord", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    /* CUDA: recording fails when the event and the stream belong to different devices (waiting
     * on an event of another device is allowed). */
    if (e->device != s->device) {
        WEFT_WARN("emulated cudaEventRecord: event of device %d on a stream of device %d",
                  e->device, s->device);
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&emu_mu);
    if (s->cap != NULL) {
        res = s->cap->invalid ? WEFT_CUDA_ERR_CAPTURE_INVALIDATED : WEFT_CUDA_SUCCESS;
        e->cap_id = s->cap->id;
        pthread_mutex_unlock(&emu_mu);
        return res;
    }
    e->cap_id = 0;
    pthread_mutex_unlock(&emu_mu);
    struct emu_item *it = emu_item_new(EMU_RECORD, "cudaEventRecord");
    if (it == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&e->mu);
    if (e->npending == e->pending_cap) {
        int cap = e->pending_cap ? 2 * e->pending_cap : 4;
        uint64_t *p = realloc(e->pending, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            pthread_mutex_unlock(&e->mu);
            free(it);
            WEFT_WARN("emulated cudaEventRecord: out of memory");
            return WEFT_CUDA_ERR_OUT_OF_MEMORY;
        }
        e->pending = p;
        e->pending_cap = cap;
    }
    it->ticket = ++e->rec;
    e->pending[e->npending++] = it->ticket;
    pthread_mutex_unlock(&e->mu);
    __atomic_add_fetch(&e->refs, 1, __ATOMIC_ACQ_REL);
    it->ev = e;
    return emu_submit(s, it);
}

static int emu_stream_wait_event(weft_cuda_stream_t sh, weft_cuda_event_t eh)
{
    struct emu_event *e;
    struct emu_stream *s;
    int res = emu_event_get(eh, "cudaStreamWaitEvent", &e);
    if (res == WEFT_CUDA_SUCCESS)
        res = emu_stream_get(sh, "cudaStreamWaitEvent", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&emu_mu);
    struct emu_capture *c = NULL;
    if (e->cap_id != 0)
        for (c = emu_captures; c != NULL && c->id != e->cap_id; c = c->next)
            ;
    if (c != NULL) {
        /* The event marks a point of an active capture: s joins it (fork), or already is in it. */
        if (s->cap == NULL && s->legacy) {
            res = WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED;
            emu_capture_invalidate(c, "the legacy stream waited on a captured event");
        } else if (s->cap == NULL) {
            s->cap = c;
        } else if (s->cap != c) {
            res = WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED;
            emu_capture_invalidate(c, "a stream of another capture waited on its event");
        }
        pthread_mutex_unlock(&emu_mu);
        return res;
    }
    if (s->cap != NULL) {
        /* Outside dependency of a captured stream: graphs have none; ignored. */
        res = s->cap->invalid ? WEFT_CUDA_ERR_CAPTURE_INVALIDATED : WEFT_CUDA_SUCCESS;
        pthread_mutex_unlock(&emu_mu);
        return res;
    }
    pthread_mutex_unlock(&emu_mu);
    pthread_mutex_lock(&e->mu);
    uint64_t target = e->rec;
    pthread_mutex_unlock(&e->mu);
    if (target == 0)
        return WEFT_CUDA_SUCCESS; /* never recorded: no-op, as in CUDA */
    struct emu_item *it = emu_item_new(EMU_WAIT, "cudaStreamWaitEvent");
    if (it == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    it->ticket = target;
    __atomic_add_fetch(&e->refs, 1, __ATOMIC_ACQ_REL);
    it->ev = e;
    return emu_submit(s, it);
}

static int emu_event_synchronize(weft_cuda_event_t eh)
{
    struct emu_event *e;
    int res = emu_event_get(eh, "cudaEventSynchronize", &e);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    /* An event recorded in a capture marks no executed work: always illegal (as in CUDA). */
    pthread_mutex_lock(&emu_mu);
    for (struct emu_capture *c = emu_captures; c != NULL && e->cap_id != 0; c = c->next) {
        if (c->id == e->cap_id) {
            emu_capture_invalidate(c, "cudaEventSynchronize of an event recorded in it");
            res = WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&emu_mu);
    if (res == WEFT_CUDA_SUCCESS)
        res = emu_forbid_in_capture("cudaEventSynchronize");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    struct emu_wait w;
    char what[96];
    snprintf(what, sizeof(what), "cudaEventSynchronize of event %p", (void *)e);
    pthread_mutex_lock(&e->mu);
    uint64_t target = e->rec;
    int err = WEFT_CUDA_SUCCESS;
    emu_wait_begin(&w, what, e->done);
    while (emu_event_pending(e, target) && err == WEFT_CUDA_SUCCESS) {
        emu_cond_wait(&e->cv, &e->mu, w.start_ns, &w.warned, what);
        if (emu_event_pending(e, target) && emu_wait_expired(&w, e->done))
            err = WEFT_CUDA_ERR_LAUNCH_TIMEOUT;
    }
    pthread_mutex_unlock(&e->mu);
    return err;
}

/* ---- lazy module loading -------------------------------------------------------------------- */

/* The kernels (by their emulated function) whose module this process has loaded. */
#define EMU_MAX_MODULES 256
static void (*emu_modules[EMU_MAX_MODULES])(void *);
static int emu_nmodules;
static uint64_t emu_module_waits; /* loads that found the device busy (weft_emu_module_waits) */

uint64_t weft_emu_module_waits(void)
{
    return __atomic_load_n(&emu_module_waits, __ATOMIC_ACQUIRE);
}

static int emu_module_loaded(void (*fn)(void *))
{
    int hit = 0;
    pthread_mutex_lock(&emu_mu);
    for (int i = 0; i < emu_nmodules && !hit; i++)
        hit = emu_modules[i] == fn;
    pthread_mutex_unlock(&emu_mu);
    return hit;
}

/*
 * Loads k's module unless loaded (or CUDA_MODULE_LOADING=EAGER loaded everything at the first
 * use of the device). As CUDA's lazy loading may, the load waits for every stream of the current
 * device to be idle: a kernel there spinning for a peer that has not launched yet holds it up
 * until that kernel gives up (its WEFT_TIMEOUT).
 */
static int emu_module_load(const struct weft_kernel *k, const char *api)
{
    const char *mode = weft_param_EmuModuleLoading();
    if (mode != NULL && strcmp(mode, "EAGER") == 0)
        return WEFT_CUDA_SUCCESS;
    if (emu_module_loaded(k->emu_fn))
        return WEFT_CUDA_SUCCESS;
    int dev = emu_cur_dev;
    pthread_mutex_lock(&emu_mu);
    int busy = 0;
    for (struct emu_stream *s = emu_streams; s != NULL && !busy; s = s->next)
        busy = s->device == dev && __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) <
                                       __atomic_load_n(&s->enq, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&emu_mu);
    if (busy) {
        __atomic_add_fetch(&emu_module_waits, 1, __ATOMIC_ACQ_REL);
        WEFT_INFO(WEFT_LOG_INIT, "emu: %s: kernel %s loads its module (lazy loading) while device "
                  "%d has work queued: waiting for the device to be idle", api, k->name, dev);
    }
    int err = emu_device_wait(dev);
    if (err != WEFT_CUDA_SUCCESS && err != WEFT_CUDA_ERR_LAUNCH_TIMEOUT)
        err = WEFT_CUDA_SUCCESS; /* a stream's sticky error is not the load's */
    if (err != WEFT_CUDA_SUCCESS) {
        WEFT_WARN("emulated %s: loading kernel %s's module waited for device %d to be idle past "
                  "the deadline (lazy loading; load kernels first or set "
                  "CUDA_MODULE_LOADING=EAGER)", api, k->name, dev);
        return err;
    }
    pthread_mutex_lock(&emu_mu);
    int hit = 0;
    for (int i = 0; i < emu_nmodules && !hit; i++)
        hit = emu_modules[i] == k->emu_fn;
    if (!hit && emu_nmodules < EMU_MAX_MODULES)
        emu_modules[emu_nmodules++] = k->emu_fn;
    pthread_mutex_unlock(&emu_mu);
    return WEFT_CUDA_SUCCESS;
}

static int emu_load_kernels(const struct weft_kernel *k, int n)
{
    if (n < 0 || (n > 0 && k == NULL))
        return WEFT_CUDA_ERR_INVALID_VALUE;
    for (int i = 0; i < n; i++) {
        if (k[i].emu_fn == NULL)
            continue;
        int err = emu_module_load(&k[i], "cudaFuncGetAttributes");
        if (err != WEFT_CUDA_SUCCESS)
            return err;
    }
    return WEFT_CUDA_SUCCESS;
}

static int emu_launch(const struct weft_kernel *k, int grid, int block, size_t shared_bytes,
                      const void *params, size_t params_bytes, weft_cuda_stream_t h)
{
    if (k == NULL || k->emu_fn == NULL) {
        WEFT_WARN("emulated cudaLaunchKernel: kernel %s has no emulated build",
                  k && k->name ? k->name : "(null)");
        return WEFT_CUDA_ERR_INVALID_DEVICE_FN;
    }
    if (grid < 1 || block < 1 || block > EMU_MAX_BLOCK || shared_bytes > EMU_MAX_SHARED) {
        WEFT_WARN("emulated cudaLaunchKernel %s: invalid configuration grid %d block %d shared "
                  "%zu (block 1..%d, shared <= %u)", k->name, grid, block, shared_bytes,
                  EMU_MAX_BLOCK, EMU_MAX_SHARED);
        return WEFT_CUDA_ERR_INVALID_CONFIG;
    }
    if (params_bytes > EMU_MAX_PARAMS || (params_bytes > 0 && params == NULL)) {
        WEFT_WARN("emulated cudaLaunchKernel %s: %zu bytes of params (at most %d, non-NULL)",
                  k->name, params_bytes, EMU_MAX_PARAMS);
        return WEFT_CUDA_ERR_INVALID_VALUE;
    }
    uint64_t n = __atomic_add_fetch(&emu_launch_count, 1, __ATOMIC_RELAXED);
    if (WEFT_FAULT_ARMED() && weft_fault_call(WEFT_FAULT_LAUNCH)) {
        WEFT_WARN("emulated cudaLaunchKernel %s: launch %llu fails (WEFT_FAULT launch)",
                  k->name, (unsigned long long)n);
        return WEFT_CUDA_ERR_LAUNCH_RESOURCES;
    }
    struct emu_stream *s;
    int res = emu_stream_get(h, "cudaLaunchKernel", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    /* CUDA: a kernel launch fails on a stream not of the current device. */
    if (s->device != emu_cur_dev) {
        WEFT_WARN("emulated cudaLaunchKernel %s: stream of device %d, current device %d", k->name,
                  s->device, emu_cur_dev);
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    res = emu_module_load(k, "cudaLaunchKernel");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    struct emu_item *it = emu_item_new(EMU_KERNEL, "cudaLaunchKernel");
    if (it == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    it->k = k;
    it->grid = grid;
    it->block = block;
    it->shared = shared_bytes;
    it->params_bytes = params_bytes;
    if (params_bytes > 0) {
        it->params = malloc(params_bytes);
        if (it->params == NULL) {
            free(it);
            WEFT_WARN("emulated cudaLaunchKernel %s: out of memory", k->name);
            return WEFT_CUDA_ERR_OUT_OF_MEMORY;
        }
        memcpy(it->params, params, params_bytes);
    }
    return emu_submit(s, it);
}

static int emu_capture_begin(weft_cuda_stream_t h)
{
    struct emu_stream *s;
    int res = emu_stream_get(h, "cudaStreamBeginCapture", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    if (s->legacy) {
        WEFT_WARN("emulated cudaStreamBeginCapture: the legacy stream cannot be captured");
        return WEFT_CUDA_ERR_CAPTURE_UNSUPPORTED;
    }
    struct emu_capture *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&emu_mu);
    if (s->cap != NULL) {
        pthread_mutex_unlock(&emu_mu);
        free(c);
        WEFT_WARN("emulated cudaStreamBeginCapture: stream %p already captures", h);
        return WEFT_CUDA_ERR_ILLEGAL_STATE;
    }
    c->id = ++emu_capture_ids;
    c->origin = s;
    c->mode = (int)weft_param_CudaCaptureMode();
    c->thread = pthread_self();
    c->next = emu_captures;
    emu_captures = c;
    s->cap = c;
    pthread_mutex_unlock(&emu_mu);
    return WEFT_CUDA_SUCCESS;
}

static void emu_nodes_free(struct emu_item *it)
{
    while (it != NULL) {
        struct emu_item *next = it->next;
        emu_item_free(it);
        it = next;
    }
}

static int emu_capture_end(weft_cuda_stream_t h, weft_cuda_graph_t *g_p)
{
    struct emu_stream *s;
    int res = emu_stream_get(h, "cudaStreamEndCapture", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    if (g_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct emu_graph *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&emu_mu);
    struct emu_capture *c = s->cap;
    if (c == NULL || c->origin != s) {
        pthread_mutex_unlock(&emu_mu);
        free(g);
        WEFT_WARN("emulated cudaStreamEndCapture: stream %p %s", h,
                  c == NULL ? "is not capturing" : "joined a capture it did not begin");
        return c == NULL ? WEFT_CUDA_ERR_ILLEGAL_STATE : WEFT_CUDA_ERR_CAPTURE_UNMATCHED;
    }
    for (struct emu_stream *t = emu_streams; t != NULL; t = t->next)
        if (t->cap == c)
            t->cap = NULL;
    for (struct emu_capture **pp = &emu_captures; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    if (c->invalid) {
        pthread_mutex_unlock(&emu_mu);
        emu_nodes_free(c->head);
        free(c);
        free(g);
        WEFT_WARN("emulated cudaStreamEndCapture: the capture was invalidated (901)");
        return WEFT_CUDA_ERR_CAPTURE_INVALIDATED;
    }
    g->head = c->head;
    g->nnodes = c->nnodes;
    g->next = emu_graphs;
    emu_graphs = g;
    pthread_mutex_unlock(&emu_mu);
    free(c);
    *g_p = g;
    return WEFT_CUDA_SUCCESS;
}

static struct emu_graph *emu_graph_find_locked(weft_cuda_graph_t h)
{
    struct emu_graph *g = emu_graphs;
    while (g != NULL && g != (struct emu_graph *)h)
        g = g->next;
    return g;
}

static int emu_graph_launch(weft_cuda_graph_t gh, weft_cuda_stream_t sh)
{
    struct emu_stream *s;
    int res = emu_stream_get(sh, "cudaGraphLaunch", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    pthread_mutex_lock(&emu_mu);
    struct emu_graph *g = emu_graph_find_locked(gh);
    pthread_mutex_unlock(&emu_mu);
    if (g == NULL) {
        WEFT_WARN("emulated cudaGraphLaunch: %p is not a live emulated graph", gh);
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    /* The nodes are only read here; graph_destroy during a launch is the caller's bug. */
    for (struct emu_item *n = g->head; n != NULL; n = n->next) {
        struct emu_item *it = emu_item_clone(n);
        if (it == NULL) {
            WEFT_WARN("emulated cudaGraphLaunch: out of memory");
            return WEFT_CUDA_ERR_OUT_OF_MEMORY;
        }
        res = emu_submit(s, it);
        if (res != WEFT_CUDA_SUCCESS)
            return res;
    }
    return WEFT_CUDA_SUCCESS;
}

static int emu_graph_destroy(weft_cuda_graph_t gh)
{
    pthread_mutex_lock(&emu_mu);
    struct emu_graph **pp = &emu_graphs;
    while (*pp != NULL && *pp != (struct emu_graph *)gh)
        pp = &(*pp)->next;
    struct emu_graph *g = *pp;
    if (g != NULL)
        *pp = g->next;
    pthread_mutex_unlock(&emu_mu);
    if (g == NULL) {
        WEFT_WARN("emulated cudaGraphExecDestroy: %p is not a live emulated graph", gh);
        return WEFT_CUDA_ERR_INVALID_HANDLE;
    }
    emu_nodes_free(g->head);
    free(g);
    return WEFT_CUDA_SUCCESS;
}

static int emu_launch_host_func(weft_cuda_stream_t h, void (*fn)(void *arg), void *arg)
{
    if (fn == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    struct emu_stream *s;
    int res = emu_stream_get(h, "cudaLaunchHostFunc", &s);
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    struct emu_item *it = emu_item_new(EMU_HOSTFN, "cudaLaunchHostFunc");
    if (it == NULL)
        return WEFT_CUDA_ERR_OUT_OF_MEMORY;
    it->fn = fn;
    it->arg = arg;
    return emu_submit(s, it);
}

static int emu_device_synchronize(void)
{
    int res = emu_forbid_in_capture("cudaDeviceSynchronize");
    if (res != WEFT_CUDA_SUCCESS)
        return res;
    return emu_device_wait(emu_cur_dev);
}

/* Device memory exists here: every buffer is classified. */
/* ---- device identity (CUDA_VISIBLE_DEVICES) ----------------------------------------------- */

/* Physical device k's uuid: the same in every process of the host. */
static void emu_uuid(int k, unsigned char uuid[16])
{
    static const unsigned char base[16] = {'w', 'e', 'f', 't', '-', 'e', 'm', 'u', 0x40, 0x80};
    memcpy(uuid, base, 16);
    uuid[15] = (unsigned char)k;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it. */
static void emu_uuid_text(int k, char *buf, size_t len)
{
    unsigned char u[16];
    emu_uuid(k, u);
    size_t o = (size_t)snprintf(buf, len, "GPU-");
    for (int i = 0; i < 16 && o + 3 < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%02x",
                              i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "", u[i]);
}

/*
 * Fills emu_phys from CUDA_VISIBLE_DEVICES as CUDA reads it: comma-separated indices or uuid
 * prefixes ("GPU-..." matching one device); the first invalid, out-of-range, ambiguous or repeated
 * entry ends the list. Returns the number of devices the process sees.
 */
static int emu_visible_parse(const char *list, int nphys)
{
    if (list == NULL || strcmp(list, "all") == 0) {
        for (int k = 0; k < nphys; k++)
            emu_phys[k] = k;
        return nphys;
    }
    int n = 0;
    const char *at = list;
    while (*at != '\0' && n < EMU_MAX_DEV) {
        while (*at == ' ')
            at++;
        size_t len = strcspn(at, ",");
        char entry[64];
        if (len == 0 || len >= sizeof(entry))
            break;
        memcpy(entry, at, len);
        entry[len] = '\0';
        while (len > 0 && entry[len - 1] == ' ')
            entry[--len] = '\0';
        int k = -1;
        if (strncmp(entry, "GPU-", 4) == 0) {
            for (int j = 0, hits = 0; j < nphys; j++) {
                char text[64];
                emu_uuid_text(j, text, sizeof(text));
                if (strncmp(text, entry, len) == 0 && ++hits == 1)
                    k = j;
                else if (strncmp(text, entry, len) == 0)
                    k = -1; /* ambiguous */
            }
        } else {
            char *end = NULL;
            long v = strtol(entry, &end, 10);
            k = end != entry && *end == '\0' && v >= 0 && v < nphys ? (int)v : -1;
        }
        for (int d = 0; d < n && k >= 0; d++)
            k = emu_phys[d] == k ? -1 : k;
        if (k < 0)
            break;
        emu_phys[n++] = k;
        at += strcspn(at, ",");
        if (*at == ',')
            at++;
    }
    return n;
}

static int emu_device_id(int dev, struct weft_cuda_dev_id *id_p)
{
    if (id_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    if (dev < 0 || dev >= emu_ndev)
        return WEFT_CUDA_ERR_INVALID_DEVICE;
    memset(id_p, 0, sizeof(*id_p));
    emu_uuid(emu_phys[dev], id_p->uuid);
    snprintf(id_p->bus_id, sizeof(id_p->bus_id), "0000:%02x:00.0", 0x10 + emu_phys[dev]);
    return WEFT_CUDA_SUCCESS;
}

static int emu_device_by_bus_id(int *dev_p, const char *bus_id)
{
    unsigned dom = 0, bus = 0, slot = 0, fn = 0;
    if (dev_p == NULL || bus_id == NULL ||
        sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    int d = dom == 0 && slot == 0 && fn == 0 && bus >= 0x10 ? emu_ordinal_of((int)bus - 0x10) : -1;
    if (d < 0)
        return WEFT_CUDA_ERR_INVALID_DEVICE;
    *dev_p = d;
    return WEFT_CUDA_SUCCESS;
}

static int emu_host_only(void)
{
    return 0;
}

static int emu_facts(int dev, struct weft_cuda_facts *f_p);

static const struct weft_cuda_ops emu_ops = {
    .version = WEFT_CUDA_OPS_VERSION,
    .name = "emu",
    .get_device_count = emu_get_device_count,
    .get_device = emu_get_device,
    .set_device = emu_set_device,
    .can_access_peer = emu_can_access_peer,
    .enable_peer_access = emu_enable_peer_access,
    .malloc = emu_malloc,
    .free = emu_free,
    .host_alloc = emu_host_alloc,
    .host_free = emu_host_free,
    .pointer_attr = emu_pointer_attr,
    .memcpy_async = emu_memcpy_async,
    .memset_async = emu_memset_async,
    .stream_create = emu_stream_create,
    .stream_destroy = emu_stream_destroy,
    .stream_synchronize = emu_stream_synchronize,
    .stream_query = emu_stream_query,
    .stream_capturing = emu_stream_capturing,
    .event_create = emu_event_create,
    .event_destroy = emu_event_destroy,
    .event_record = emu_event_record,
    .stream_wait_event = emu_stream_wait_event,
    .event_synchronize = emu_event_synchronize,
    .launch = emu_launch,
    .capture_begin = emu_capture_begin,
    .capture_end = emu_capture_end,
    .graph_launch = emu_graph_launch,
    .graph_destroy = emu_graph_destroy,
    .error_string = weft_cuda_error_text,
    .launch_host_func = emu_launch_host_func,
    .device_synchronize = emu_device_synchronize,
    .kernel_threads = 4,
    .mem_create = emu_mem_create,
    .mem_export = emu_mem_export,
    .mem_import = emu_mem_import,
    .mem_release = emu_mem_release,
    .ipc_get_handle = emu_ipc_get_handle,
    .ipc_open_handle = emu_ipc_open_handle,
    .ipc_close_handle = emu_ipc_close_handle,
    .host_only = emu_host_only,
    .facts = emu_facts,
    .device_id = emu_device_id,
    .device_by_bus_id = emu_device_by_bus_id,
    .load_kernels = emu_load_kernels,
};

static void emu_init_once(void)
{
    int n = emu_once_ndev;
    if (n < 1)
        n = 1;
    if (n > EMU_MAX_DEV) {
        WEFT_WARN("emulated GPU: %d devices asked, %d at most", n, EMU_MAX_DEV);
        n = EMU_MAX_DEV;
    }
    const char *visible = weft_param_EmuVisible();
    emu_ndev = emu_visible_parse(visible, n);
    int64_t nq = weft_param_EmuConnections();
    emu_nhwq = nq < 1 ? 1 : nq > EMU_MAX_HWQ ? EMU_MAX_HWQ : (int)nq;
    for (int d = 0; d < EMU_MAX_DEV; d++)
        for (int q = 0; q < EMU_MAX_HWQ; q++) {
            pthread_mutex_init(&emu_hwqs[d][q].mu, NULL);
            pthread_cond_init(&emu_hwqs[d][q].cv, NULL);
        }
    WEFT_INFO(WEFT_LOG_INIT, "emu: emulated GPU with %d device%s%s", n, n == 1 ? "" : "s",
              weft_param_EmuSerialize() ? ", serialized blocks" : "");
    if (strcmp(visible, "all") != 0) {
        char seen[4 * EMU_MAX_DEV + 1] = "";
        for (int d = 0, o = 0; d < emu_ndev; d++)
            o += snprintf(seen + o, sizeof(seen) - (size_t)o, "%s%d", d ? "," : "", emu_phys[d]);
        WEFT_INFO(WEFT_LOG_INIT, "emu: CUDA_VISIBLE_DEVICES %s: this process sees %d device%s "
                  "(emulated devices %s)", visible, emu_ndev, emu_ndev == 1 ? "" : "s", seen);
    }
}

/* The CUDA runtime the emulated GPU stands for: Weft's static CUDA 13 runtime. */
#define EMU_RUNTIME_VERSION 13000

static int emu_facts(int dev, struct weft_cuda_facts *f_p)
{
    if (f_p == NULL)
        return WEFT_CUDA_ERR_INVALID_VALUE;
    if (dev < 0 || dev >= emu_ndev)
        return WEFT_CUDA_ERR_INVALID_DEVICE;
    struct weft_cuda_facts f = {(int)weft_param_EmuDriver(), EMU_RUNTIME_VERSION,
                                (int)weft_param_EmuComputeMode(), weft_param_EmuMig() != 0, ""};
    snprintf(f.name, sizeof(f.name), "Weft emulated GPU%s", f.mig ? " MIG 1g.10gb" : "");
    *f_p = f;
    return WEFT_CUDA_SUCCESS;
}

const struct weft_cuda_ops *weft_cuda_emu_init(int ndev)
{
    /* As cudaGetDeviceCount on a driver older than the runtime: 35, no CUDA in the process. */
    int driver = (int)weft_param_EmuDriver();
    if (driver / 1000 < EMU_RUNTIME_VERSION / 1000) {
        char why[256];
        snprintf(why, sizeof(why), "the emulated driver supports CUDA %d.%d (WEFT_EMU_DRIVER), "
                 "older than the CUDA %d.%d runtime needs (cudaGetDeviceCount: "
                 "cudaErrorInsufficientDriver (%d), \"%s\"): install driver 580 or newer",
                 driver / 1000, driver % 1000 / 10, EMU_RUNTIME_VERSION / 1000,
                 EMU_RUNTIME_VERSION % 1000 / 10, WEFT_CUDA_ERR_NO_DRIVER,
                 weft_cuda_error_text(WEFT_CUDA_ERR_NO_DRIVER));
        weft_cuda_set_unusable(driver, EMU_RUNTIME_VERSION, why);
        return NULL;
    }
    pthread_mutex_lock(&emu_mu);
    if (emu_once_ndev == 0)
        emu_once_ndev = ndev;
    pthread_mutex_unlock(&emu_mu);
    pthread_once(&emu_once, emu_init_once);
    return &emu_ops;
}
