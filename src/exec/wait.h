/*
 * The step engine's waits. The doorbell a rank sleeps on, and the clocks and pause every wait
 * uses, are the FIFO contract's (fifo.h), shared with the transports that ring it.
 */
#ifndef WEFT_EXEC_WAIT_H
#define WEFT_EXEC_WAIT_H

#include <stdint.h>

#include "exec/lane.h"
#include "fifo.h"

/*
 * For a lane that weft_lane_progress left blocked on data: polls only the word it waits on, at
 * most `polls` times with a pause between, and returns how many it made. A waiting rank's full
 * round over its lanes takes longer than the pause, so the data is seen sooner: a cache-line
 * exchange between the 2 vCPUs of the AMD machine takes ~50 ns, a round plus pause ~60.
 */
static inline int weft_lane_watch(const struct weft_lane *lane, int polls)
{
    int n = 0;
    while (n < polls && __atomic_load_n(lane->awaited, __ATOMIC_ACQUIRE) != lane->awaited_seq) {
        n++;
        weft_cpu_relax();
    }
    return n;
}

#endif
