/*
 * Defining the public entry points.
 *
 * NCCL's ABI has every API twice, like MPI's profiling interface: `pncclX` is the real, strong
 * definition and `ncclX` is a weak alias of it. A tool (tracer, profiler) linked before us can
 * define its own `ncclX` and reach ours through `pncclX`. Both must have default visibility: the
 * library is built with -fvisibility=hidden, and src/libnccl.map then keeps exactly `nccl*`,
 * `pnccl*` and `weft[A-Z]*` global.
 *
 * Use:
 *
 *     #include "api/export.h"
 *
 *     WEFT_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count)
 *     {
 *         ...
 *     }
 *
 * expands to a weak alias declaration `ncclCommCount` -> "pncclCommCount" followed by the head of
 * the definition of `pncclCommCount`, so the body written after the macro becomes pncclCommCount's.
 * The parameter list is the macro's variadic part; write `void` for functions without parameters:
 * `WEFT_API(ncclResult_t, ncclGroupStart, void) { ... }`. Include nccl.h first (api files get it
 * through core/check.h) so that the compiler checks each definition against its public prototype.
 *
 * Rules:
 *   - One WEFT_API per public function, in src/api/ only; the body validates arguments, logs with
 *     WEFT_WARN and calls the internal snake_case implementation.
 *   - Inside the library call the internal function (or pncclX), never ncclX: ncclX is weak and
 *     may resolve to a user's wrapper.
 *   - Symbols that are exported but have no twin (ncclResetDebugInitInternal, weftX extensions)
 *     are defined with WEFT_EXPORT directly.
 */
#ifndef WEFT_API_EXPORT_H
#define WEFT_API_EXPORT_H

/* Default visibility for a symbol the version script exports. */
#define WEFT_EXPORT __attribute__((visibility("default")))

/*
 * WEFT_API(ret, name, params...): declares `name` as a weak alias of `p##name` and opens the
 * definition of `p##name`. GCC resolves the alias at the end of the translation unit, so the alias
 * may come before its target.
 */
#define WEFT_API(ret, name, ...)                                                                   \
    WEFT_EXPORT ret name(__VA_ARGS__) __attribute__((weak, alias("p" #name)));                     \
    WEFT_EXPORT ret p##name(__VA_ARGS__)

#endif
