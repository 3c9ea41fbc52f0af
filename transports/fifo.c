/* Doorbells' system calls: futexes across processes, eventfds, membarrier (fifo.h). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fifo.h"

void weft_futex_wake(uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void weft_futex_wait(uint32_t *addr, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}

void weft_eventfd_signal(int efd)
{
    uint64_t one = 1;
    ssize_t n;
    do {
        n = write(efd, &one, sizeof(one));
    } while (n < 0 && errno == EINTR);
}

int weft_bell_registered;

static pthread_once_t weft_bell_once = PTHREAD_ONCE_INIT;

static void weft_bell_register(void)
{
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) ||
        !(cmds & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED))
        return;
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0)
        __atomic_store_n(&weft_bell_registered, 1, __ATOMIC_RELEASE);
}

void weft_doorbell_init(struct weft_doorbell *bell, uint32_t kind, int efd)
{
    memset(bell, 0, sizeof(*bell));
    bell->kind = kind;
    bell->efd = efd;
    if (kind == WEFT_BELL_FUTEX) {
        pthread_once(&weft_bell_once, weft_bell_register);
        bell->light = (uint32_t)__atomic_load_n(&weft_bell_registered, __ATOMIC_ACQUIRE);
    }
}

int weft_doorbell_enter(struct weft_doorbell *bell)
{
    __atomic_fetch_add(&bell->sleepers, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&bell->light, __ATOMIC_RELAXED))
        return 0;
    return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0 ? 0 : -1;
}

void weft_doorbell_leave(struct weft_doorbell *bell)
{
    __atomic_fetch_sub(&bell->sleepers, 1, __ATOMIC_SEQ_CST);
}
