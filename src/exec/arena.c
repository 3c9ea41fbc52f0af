/* Grow-only per-thread arenas: one block, or a chain while a call outgrows it. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "exec/arena.h"

struct weft_arena_block {
    struct weft_arena_block *next;
    size_t cap;
    size_t used;
    char *data;
};

static __thread struct weft_arena_block *weft_arena_head;
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

void weft_arena_reset(void)
{
    struct weft_arena_block *b = weft_arena_head;
    if (b == NULL)
        return;
    if (b->next != NULL) {
        /* This call outgrew the arena: keep one block as large as all of them together. */
        size_t total = 0;
        for (struct weft_arena_block *it = b; it != NULL; it = it->next)
            total += it->cap;
        weft_arena_free_chain(b);
        weft_arena_head = NULL;
        pthread_setspecific(weft_arena_key, NULL);
        weft_arena_head = weft_arena_block_new(total, NULL);
        return;
    }
    b->used = 0;
}
