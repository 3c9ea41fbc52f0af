/*
 * The LL wrap rule of kernels/dev_ll.h with 8-bit flags (this file's own build of the header):
 * a simulated slot over many steps, slices of random sizes, checks that no line of the slot
 * ever holds the flag of the step about to be written (a receiver could take such a line for
 * fresh data), and that it would without the cleanup (so the check can fail).
 */
#define WEFT_LL_FLAG_BITS 8
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dev_ll.h"

#include "kern_unit.h"

#define LINES 9 /* 1 header + 8 data lines */

/* Returns the steps at which a stale line carried the current flag: 0 with cleanup. */
static int simulate(int cleanup, uint64_t first, uint64_t nsteps)
{
    uint32_t lines[WEFT_STEPS][LINES];
    memset(lines, 0, sizeof(lines));
    uint64_t x = 12345;
    int aliased = 0;
    for (uint64_t s = first; s < first + nsteps; s++) {
        uint32_t *slot = lines[weft_fifo_slot(s, WEFT_STEPS)];
        uint32_t f = weft_ll_flag(s);
        if (f == 0)
            return -1;
        for (int l = 0; l < LINES; l++)
            if (slot[l] == f)
                aliased++;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int used = 1 + (int)((x >> 33) % (LINES - 1)) * ((x >> 20) % 4 == 0); /* mostly short */
        int upto = cleanup && weft_ll_cleanup(s) ? LINES : used;
        for (int l = 0; l < upto; l++)
            slot[l] = f;
    }
    return aliased;
}

int kern_unit_rules_f8(void)
{
    int bad = 0;
    if (weft_ll_flag(0) != 1 || weft_ll_flag(255) != 256 || weft_ll_flag(256) != 1) {
        fprintf(stderr, "FAIL rules-f8: flags 0/255/256 = %u %u %u\n", weft_ll_flag(0),
                weft_ll_flag(255), weft_ll_flag(256));
        bad++;
    }
    /* Cleanup: the last 8 steps of each half period (128 steps), nowhere else. */
    for (uint64_t s = 0; s < 1024; s++) {
        int want = (s % 128) >= 120;
        if (weft_ll_cleanup(s) != want) {
            fprintf(stderr, "FAIL rules-f8: cleanup(%llu) = %d\n", (unsigned long long)s,
                    weft_ll_cleanup(s));
            bad++;
            break;
        }
    }
    int with = simulate(1, 0, 100000), with_late = simulate(1, 1000003, 50000);
    int without = simulate(0, 0, 100000);
    printf("rules-f8: 100000 steps of 8 slots: %d stale lines with the current flag with "
           "cleanup (%d from step 1000003), %d without\n", with, with_late, without);
    if (with != 0 || with_late != 0) {
        fprintf(stderr, "FAIL rules-f8: the cleanup rule leaves lines that alias\n");
        bad++;
    }
    if (without <= 0) {
        fprintf(stderr, "FAIL rules-f8: the simulation cannot see aliasing\n");
        bad++;
    }
    return bad;
}
