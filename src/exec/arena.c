/* Per-thread arenas: one block, or a chain while a call outgrows it; at most 4 MiB kept. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/fault.h"
#include "exec/arena.h"

struct weft_arena_block {
    struct weft_arena_block *next;
    size_t cap;
    size_t used;
    char *data;
};

/* initial-exec: a fixed offset from the thread pointer, not a __tls_get_addr call on each of an
 * operation's several allocations (~3% of a 1-rank 8 B all-reduce); one pointer of the static
 * TLS surplus glibc keeps for libraries loaded with dlopen. */
static __thread struct weft_arena_block *weft_arena_head __attribute__((tls_model("initial-exec")));
static pthread_key_t weft_arena_key;
static pthread_once_t weft_arena_once = PTHREAD_ONCE_INIT;

static void weft_arena_free_chain(struct weft_arena_block *b)
{
    while (b != NULL) {
        struct weft_arena_block *next = b->next;
        free(b->data);
        free(b);
        b = next;
    }
}

static void weft_arena_thread_exit(void *arg)
{
    weft_arena_free_chain(arg);
}

static void weft_arena_key_init(void)
{
    pthread_key_create(&weft_arena_key, weft_arena_thread_exit);
}

static struct weft_arena_block *weft_arena_block_new(size_t cap, struct weft_arena_block *next)
{
    struct weft_arena_block *b = malloc(sizeof(*b));
    if (b == NULL)
        return NULL;
    if (posix_memalign((void **)&b->data, 64, cap) != 0) {
        free(b);
        return NULL;
    }
    b->cap = cap;
    b->used = 0;
    b->next = next;
    pthread_once(&weft_arena_once, weft_arena_key_init);
    pthread_setspecific(weft_arena_key, b);
    return b;
}

void *weft_arena_alloc(size_t bytes)
{
    if (WEFT_FAULT_ARMED() && weft_fault_alloc())
        return NULL; /* WEFT_FAULT alloc: as if memory ran out */
    bytes = (bytes + 63) & ~(size_t)63;
    struct weft_arena_block *b = weft_arena_head;
    if (b == NULL || b->cap - b->used < bytes) {
        size_t cap = b != NULL ? 2 * b->cap : 64 * 1024;
        while (cap < bytes)
            cap *= 2;
        b = weft_arena_block_new(cap, b);
        if (b == NULL)
            return NULL;
        weft_arena_head = b;
    }
    void *p = b->data + b->used;
    b->used += bytes;
    return p;
}

/*
 * What a thread keeps between calls. More would stay resident for the thread's life after one
 * large call (a fused group of many all-reduces stages them here); a call that needs more
 * allocates it again (malloc maps large blocks, so that costs page faults, not a copy).
 */
#define WEFT_ARENA_KEEP (4u << 20)

void weft_arena_reset(void)
{
    struct weft_arena_block *b = weft_arena_head;
    if (b == NULL)
        return;
    if (b->next == NULL && b->cap <= WEFT_ARENA_KEEP) {
        b->used = 0;
        return;
    }
    /* This call outgrew the arena: keep one block as large as all of them together, if small. */
    size_t total = 0;
    for (struct weft_arena_block *it = b; it != NULL; it = it->next)
        total += it->cap;
    weft_arena_free_chain(b);
    weft_arena_head = NULL;
    pthread_setspecific(weft_arena_key, NULL);
    if (total <= WEFT_ARENA_KEEP)
        weft_arena_head = weft_arena_block_new(total, NULL);
}

size_t weft_arena_held(void)
{
    size_t total = 0;
    for (struct weft_arena_block *it = weft_arena_head; it != NULL; it = it->next)
        total += it->cap;
    return total;
}
