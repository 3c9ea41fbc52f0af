/* The CMA policy: see cma.h. */
#include "core/cma.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/log.h"
#include "core/param.h"
#include "exec/wait.h"

WEFT_PARAM(Cma, "WEFT_CMA", -1,
           "1: read the memory of peer processes of this host with process_vm_readv (single-copy "
           "sends, zero-copy collectives of unregistered buffers) wherever the kernel allows it; "
           "0: never; -1: where it pays, measured once per process (the kernel's copy at least "
           "half as fast as memcpy)");

/* Large enough for the kernel's per-call cost (pinning, page walks) to show as it does for the
 * 64 KiB .. MiB transfers that use it, small enough to stay in cache for both copies. */
#define WEFT_CMA_PROBE_BYTES (512u << 10)
#define WEFT_CMA_PROBE_RUNS 6

static int weft_cma_decision;
static pthread_once_t weft_cma_once = PTHREAD_ONCE_INIT;

/* 1 when process_vm_readv copies at least half as fast as memcpy here. The best of several
 * interleaved runs: a rank descheduled in one (8 ranks on 2 cores) is not what the copies cost. */
static int weft_cma_probe(void)
{
    size_t bytes = WEFT_CMA_PROBE_BYTES;
    char *src = malloc(bytes), *dst = malloc(bytes);
    int pays = 0;
    if (src == NULL || dst == NULL)
        goto out;
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    uint64_t best_cma = UINT64_MAX, best_copy = UINT64_MAX;
    pid_t self = getpid();
    for (int run = 0; run < WEFT_CMA_PROBE_RUNS; run++) {
        struct iovec local = {dst, bytes}, remote = {src, bytes};
        uint64_t t0 = weft_time_ns();
        ssize_t got = process_vm_readv(self, &local, 1, &remote, 1, 0);
        uint64_t t1 = weft_time_ns();
        if (got != (ssize_t)bytes) {
            WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_SHM,
                      "process_vm_readv: %s: no single-copy reads between processes",
                      got < 0 ? strerror(errno) : "short read");
            goto out;
        }
        memcpy(dst, src, bytes);
        __asm__ volatile("" ::: "memory"); /* the copy is done before the clock is read */
        uint64_t t2 = weft_time_ns();
        if (t1 - t0 < best_cma)
            best_cma = t1 - t0;
        if (t2 - t1 < best_copy)
            best_copy = t2 - t1;
    }
    /* One kernel copy replaces two user copies (into the FIFO and out of it). */
    pays = best_cma <= 2 * best_copy;
    WEFT_INFO(WEFT_LOG_INIT | WEFT_LOG_SHM,
              "process_vm_readv %.1f GB/s, memcpy %.1f GB/s (%u KiB, best of %d): %s",
              (double)bytes / (double)best_cma, (double)bytes / (double)best_copy,
              WEFT_CMA_PROBE_BYTES >> 10, WEFT_CMA_PROBE_RUNS,
              pays ? "single-copy reads between processes"
                   : "two copies through the FIFOs (WEFT_CMA=1 forces single copies)");
out:
    free(src);
    free(dst);
    return pays;
}

static void weft_cma_decide(void)
{
    int64_t v = weft_param_Cma();
    weft_cma_decision = v >= 0 ? v != 0 : weft_cma_probe();
}

int weft_cma_pays(void)
{
    pthread_once(&weft_cma_once, weft_cma_decide);
    return weft_cma_decision;
}
