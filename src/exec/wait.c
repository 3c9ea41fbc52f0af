/* Cross-process futex wrappers for doorbells. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "exec/wait.h"

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
