/*
 * A slice of a longer wait on a condition variable: waiters that must also watch what nobody
 * signals (an abort flag, a deadline) sleep at most ms milliseconds at a time, then look again.
 */
#ifndef WEFT_CORE_COND_H
#define WEFT_CORE_COND_H

#include <pthread.h>
#include <time.h>

/* Waits on cv (mu held, as pthread_cond_wait) until signalled or ms milliseconds (< 1000) pass. */
static inline void weft_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)ms * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &until);
}

#endif
