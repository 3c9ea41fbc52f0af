/*
 * Logging with NCCL's knobs: NCCL_DEBUG (VERSION, WARN, INFO, TRACE, ABORT), NCCL_DEBUG_SUBSYS
 * (comma list, ^ inverts; default INIT,BOOTSTRAP,ENV) and NCCL_DEBUG_FILE (%h host, %p pid).
 *
 * WEFT_WARN records file and line, and copies the text for ncclGetLastError() whatever the level.
 * WEFT_INFO tests the level and subsystem mask before formatting anything.
 * WEFT_TRACE is compiled out unless WEFT_TRACE_ENABLED is defined (-Dtrace=true).
 * Any thread may call these; lines are written with one write() each.
 */
#ifndef WEFT_CORE_LOG_H
#define WEFT_CORE_LOG_H

#include <stdint.h>

enum weft_log_level {
    WEFT_LOG_LEVEL_NONE = 0,
    WEFT_LOG_LEVEL_VERSION,
    WEFT_LOG_LEVEL_WARN,
    WEFT_LOG_LEVEL_INFO,
    WEFT_LOG_LEVEL_ABORT,
    WEFT_LOG_LEVEL_TRACE,
};

/* Subsystems, NCCL's names and order. */
enum weft_log_subsys {
    WEFT_LOG_INIT = 1u << 0,
    WEFT_LOG_COLL = 1u << 1,
    WEFT_LOG_P2P = 1u << 2,
    WEFT_LOG_SHM = 1u << 3,
    WEFT_LOG_NET = 1u << 4,
    WEFT_LOG_GRAPH = 1u << 5,
    WEFT_LOG_TUNING = 1u << 6,
    WEFT_LOG_ENV = 1u << 7,
    WEFT_LOG_ALLOC = 1u << 8,
    WEFT_LOG_CALL = 1u << 9,
    WEFT_LOG_PROXY = 1u << 10,
    WEFT_LOG_NVLS = 1u << 11,
    WEFT_LOG_BOOTSTRAP = 1u << 12,
    WEFT_LOG_REG = 1u << 13,
    WEFT_LOG_PROFILE = 1u << 14,
    WEFT_LOG_RAS = 1u << 15,
    WEFT_LOG_ALL = 0xffff,
};

/* Cached after the first call; -1 until initialised. */
extern int weft_log_level;
extern uint32_t weft_log_mask;

void weft_log_init(void);
/* The rank this thread logs for (the JSON format's "rank" where a line names none; -1: none). */
void weft_log_set_rank(int rank);
void weft_log(int level, uint32_t subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The text of the last WEFT_WARN (process-wide, never cleared), copied for the calling thread
 * (valid until its next call), for ncclGetLastError. */
const char *weft_log_last_error(void);
/* Records text for ncclGetLastError without printing (used for messages the caller reports). */
void weft_log_set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define WEFT_WARN(...) weft_log(WEFT_LOG_LEVEL_WARN, WEFT_LOG_ALL, __FILE__, __LINE__, __VA_ARGS__)

#define WEFT_INFO(subsys, ...)                                                                     \
    do {                                                                                           \
        if (__builtin_expect(weft_log_level < 0, 0))                                               \
            weft_log_init();                                                                       \
        if (weft_log_level >= WEFT_LOG_LEVEL_INFO && (weft_log_mask & (subsys)))                   \
            weft_log(WEFT_LOG_LEVEL_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__);              \
    } while (0)

#ifdef WEFT_TRACE_ENABLED
#define WEFT_TRACE(subsys, ...)                                                                    \
    do {                                                                                           \
        if (__builtin_expect(weft_log_level < 0, 0))                                               \
            weft_log_init();                                                                       \
        if (weft_log_level >= WEFT_LOG_LEVEL_TRACE && (weft_log_mask & (subsys)))                  \
            weft_log(WEFT_LOG_LEVEL_TRACE, (subsys), __FILE__, __LINE__, __VA_ARGS__);             \
    } while (0)
#else
#define WEFT_TRACE(subsys, ...)                                                                    \
    do {                                                                                           \
    } while (0)
#endif

#endif
