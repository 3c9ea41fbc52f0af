/*
 * Portability macros for code that both gcc (C11, host) and nvcc (C++, host and device passes)
 * compile: the element ops of redop_elem.h, and later the protocol headers.
 *
 * Rules for shared code (what the other language would reject):
 *   - no designated initializers, no VLAs, no _Atomic, no compound literals, no C++ references;
 *   - cast void pointers explicitly; use the macros below for inline, alignment, static asserts;
 *   - no libc calls in device-reachable code (memcpy of a scalar is replaced by a union pun).
 */
#ifndef WEFT_KERNELS_COMPAT_H
#define WEFT_KERNELS_COMPAT_H

/* True during nvcc's device pass (nvcc compiles each .cu twice; the host pass takes host code). */
#if defined(__CUDA_ARCH__)
#define WEFT_DEVICE_PASS 1
#else
#define WEFT_DEVICE_PASS 0
#endif

/*
 * WEFT_HD marks a small function callable from host C, host C++ and device code.
 * In C it stays `static` so that C99 inline linkage never needs an external definition.
 */
#ifndef WEFT_HD
#if defined(__CUDACC__)
#define WEFT_HD static __host__ __device__ __forceinline__
#else
#define WEFT_HD static inline
#endif
#endif

/* Host-only and device-only variants, for completeness. */
#ifndef WEFT_DEV
#if defined(__CUDACC__)
#define WEFT_DEV static __device__ __forceinline__
#else
#define WEFT_DEV static inline
#endif
#endif

/*
 * Alignment of a type: written *after* the closing brace, `struct x {...} WEFT_ALIGNED_TYPE(16);`.
 * C11 _Alignas cannot be applied to a struct type; the attribute form works in gcc, g++ and nvcc.
 */
#ifndef WEFT_ALIGNED_TYPE
#define WEFT_ALIGNED_TYPE(n) __attribute__((aligned(n)))
#endif

/* Compile-time assertion at file or block scope. */
#ifndef WEFT_STATIC_ASSERT
#if defined(__cplusplus)
#define WEFT_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define WEFT_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#endif

/* `restrict` is spelled differently in C and C++. */
#ifndef WEFT_RESTRICT
#if defined(__cplusplus)
#define WEFT_RESTRICT __restrict__
#else
#define WEFT_RESTRICT restrict
#endif
#endif

#ifndef WEFT_LIKELY
#define WEFT_LIKELY(x) __builtin_expect(!!(x), 1)
#define WEFT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#endif

#endif
