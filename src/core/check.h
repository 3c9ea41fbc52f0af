/*
 * Error propagation. Every function that can fail returns ncclResult_t. The function that detects
 * an error logs it with WEFT_WARN; callers pass it on with WEFT_CHECK, which adds only an INFO
 * breadcrumb. ncclInProgress is not an error and passes through unchanged.
 */
#ifndef WEFT_CORE_CHECK_H
#define WEFT_CORE_CHECK_H

#include <errno.h>
#include <string.h>

#include "nccl.h"
#include "core/log.h"

#define WEFT_IS_ERROR(res) ((res) != ncclSuccess && (res) != ncclInProgress)

#define WEFT_CHECK(call)                                                                           \
    do {                                                                                           \
        ncclResult_t weft_res_ = (call);                                                           \
        if (WEFT_IS_ERROR(weft_res_)) {                                                            \
            WEFT_INFO(WEFT_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, weft_res_);                 \
            return weft_res_;                                                                      \
        }                                                                                          \
    } while (0)

/* Sets res and jumps to label on error. */
#define WEFT_CHECK_GOTO(call, res, label)                                                          \
    do {                                                                                           \
        (res) = (call);                                                                            \
        if (WEFT_IS_ERROR(res)) {                                                                  \
            WEFT_INFO(WEFT_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (res));                     \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* For cleanup paths: keep going, keep the first error in res. */
#define WEFT_CHECK_IGNORE(call, res)                                                               \
    do {                                                                                           \
        ncclResult_t weft_res_ = (call);                                                           \
        if (WEFT_IS_ERROR(weft_res_) && !WEFT_IS_ERROR(res))                                       \
            (res) = weft_res_;                                                                     \
    } while (0)

/* A system call returning -1 on error; retried on EINTR; reports strerror. */
#define WEFT_SYSCHECK(expr, name)                                                                  \
    do {                                                                                           \
        int weft_ret_;                                                                             \
        do {                                                                                       \
            weft_ret_ = (int)(expr);                                                               \
        } while (weft_ret_ == -1 && errno == EINTR);                                               \
        if (weft_ret_ == -1) {                                                                     \
            WEFT_WARN("call to %s failed: %s", (name), strerror(errno));                           \
            return ncclSystemError;                                                                \
        }                                                                                          \
    } while (0)

#define WEFT_SYSCHECK_GOTO(expr, name, res, label)                                                 \
    do {                                                                                           \
        int weft_ret_;                                                                             \
        do {                                                                                       \
            weft_ret_ = (int)(expr);                                                               \
        } while (weft_ret_ == -1 && errno == EINTR);                                               \
        if (weft_ret_ == -1) {                                                                     \
            WEFT_WARN("call to %s failed: %s", (name), strerror(errno));                           \
            (res) = ncclSystemError;                                                               \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define WEFT_PTHREADCHECK(call, name)                                                              \
    do {                                                                                           \
        int weft_err_ = (call);                                                                    \
        if (weft_err_ != 0) {                                                                      \
            WEFT_WARN("call to %s failed: %s", (name), strerror(weft_err_));                       \
            return ncclSystemError;                                                                \
        }                                                                                          \
    } while (0)

/* Allocation that reports its size on failure. */
#define WEFT_CALLOC(ptr, n)                                                                        \
    do {                                                                                           \
        (ptr) = calloc((n), sizeof(*(ptr)));                                                       \
        if ((ptr) == NULL) {                                                                       \
            WEFT_WARN("out of memory allocating %zu bytes", (size_t)(n) * sizeof(*(ptr)));         \
            return ncclSystemError;                                                                \
        }                                                                                          \
    } while (0)

/* Internal invariants only; never for user input. */
#define WEFT_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0)) {                                                        \
            WEFT_WARN("internal error: assertion %s failed", #cond);                               \
            return ncclInternalError;                                                              \
        }                                                                                          \
    } while (0)

#endif
