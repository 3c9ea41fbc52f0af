/*
 * Per-thread scratch memory for the executor. Everything one weft_exec_tasks call allocates
 * (lanes, step lists, fusion buffers) comes from the calling thread's arena and is released at
 * once by weft_arena_reset; up to 4 MiB stays with the thread, so a small operation issued in a
 * loop allocates nothing after the first call. Freed when the thread exits.
 */
#ifndef WEFT_EXEC_ARENA_H
#define WEFT_EXEC_ARENA_H

#include <stddef.h>

/* 64-byte aligned, uninitialised; NULL when out of memory. Calling thread's arena only. */
void *weft_arena_alloc(size_t bytes);
/* Releases everything allocated since the last reset; up to 4 MiB is kept for reuse, the rest
 * goes back to the system. */
void weft_arena_reset(void);
/* Bytes the calling thread's arena holds (for tests). */
size_t weft_arena_held(void);

#endif
