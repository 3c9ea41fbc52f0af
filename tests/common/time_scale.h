/*
 * Hang guards of the test harnesses (alarm) scaled by WEFT_TEST_TIME_SCALE (default 1): the
 * sanitizer setups (meson test --setup asan|tsan) set 4, as they multiply meson's timeouts, so a
 * slow sanitized run is not taken for a hang. Bounds a test asserts (an error within N seconds)
 * are not scaled: they are what the test checks.
 */
#ifndef WEFT_TEST_TIME_SCALE_H
#define WEFT_TEST_TIME_SCALE_H

#include <stdlib.h>

static inline unsigned weft_test_scaled(unsigned seconds)
{
    const char *s = getenv("WEFT_TEST_TIME_SCALE");
    long k = s != NULL ? strtol(s, NULL, 10) : 1;
    return k > 1 && k < 100 ? seconds * (unsigned)k : seconds;
}

#endif
