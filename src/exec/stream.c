/* Host streams: one worker thread each, a FIFO of jobs, and a registry of live handles. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "core/param.h"
#include "exec/stream.h"
#include "exec/wait.h"

WEFT_PARAM_DECL(Timeout); /* exec/host_watch.c */

#define WEFT_STREAM_MAGIC 0x7765667473747265ull /* "weftstre" */
#define WEFT_MAX_STREAMS 4096

static pthread_mutex_t weft_streams_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weft_stream *weft_streams[WEFT_MAX_STREAMS];
static int weft_streams_live; /* read without the lock for the common no-stream case */

static ncclResult_t weft_stream_register(struct weft_stream *s)
{
    pthread_mutex_lock(&weft_streams_lock);
    for (int i = 0; i < WEFT_MAX_STREAMS; i++) {
        if (weft_streams[i] == NULL) {
            weft_streams[i] = s;
            __atomic_fetch_add(&weft_streams_live, 1, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&weft_streams_lock);
            return ncclSuccess;
        }
    }
    pthread_mutex_unlock(&weft_streams_lock);
    WEFT_WARN("too many host streams (%d live)", WEFT_MAX_STREAMS);
    return ncclInvalidUsage;
}

static void weft_stream_unregister(struct weft_stream *s)
{
    pthread_mutex_lock(&weft_streams_lock);
    for (int i = 0; i < WEFT_MAX_STREAMS; i++) {
        if (weft_streams[i] == s) {
            weft_streams[i] = NULL;
            __atomic_fetch_sub(&weft_streams_live, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&weft_streams_lock);
}

struct weft_stream *weft_stream_lookup(const void *handle)
{
    if (handle == NULL || __atomic_load_n(&weft_streams_live, __ATOMIC_ACQUIRE) == 0)
        return NULL;
    struct weft_stream *found = NULL;
    pthread_mutex_lock(&weft_streams_lock);
    for (int i = 0; i < WEFT_MAX_STREAMS && found == NULL; i++)
        if (weft_streams[i] == handle)
            found = weft_streams[i];
    pthread_mutex_unlock(&weft_streams_lock);
    return found;
}

static void *weft_stream_main(void *arg)
{
    struct weft_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->head == NULL && s->stop)
            break;
        struct weft_job *job = s->head;
        s->head = job->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->running = 1;
        pthread_mutex_unlock(&s->lock);
        ncclResult_t res = job->run(job);
        pthread_mutex_lock(&s->lock);
        s->running = 0;
        if (WEFT_IS_ERROR(res) && s->error == ncclSuccess)
            s->error = res;
        s->completed++;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        job->finish(job, res);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

ncclResult_t weft_stream_create(struct weft_stream **stream_p)
{
    struct weft_stream *s;
    WEFT_CALLOC(s, 1);
    s->magic = WEFT_STREAM_MAGIC;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    int err = pthread_create(&s->thread, NULL, weft_stream_main, s);
    if (err != 0) {
        WEFT_WARN("cannot start a host stream thread: %s", strerror(err));
        free(s);
        return ncclSystemError;
    }
    ncclResult_t res = weft_stream_register(s);
    if (res != ncclSuccess) {
        weft_stream_destroy(s);
        return res;
    }
    *stream_p = s;
    return ncclSuccess;
}

void weft_stream_enqueue(struct weft_stream *s, struct weft_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail != NULL)
        s->tail->next = job;
    else
        s->head = job;
    s->tail = job;
    s->enqueued++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

ncclResult_t weft_stream_synchronize(struct weft_stream *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->enqueued;
    uint64_t timeout_ns = (uint64_t)weft_param_Timeout() * 1000000000ull;
    uint64_t seen = UINT64_MAX, idle_since = 0;
    while (s->completed < target) {
        uint64_t now = weft_time_ns();
        if (s->completed != seen || s->running) {
            seen = s->completed;
            idle_since = now;
        } else if (now - idle_since > timeout_ns) {
            pthread_mutex_unlock(&s->lock);
            WEFT_WARN("host stream %p: %llu jobs pending and none ran for %llu s (WEFT_TIMEOUT)",
                      (void *)s, (unsigned long long)(target - seen),
                      (unsigned long long)((now - idle_since) / 1000000000ull));
            return ncclSystemError;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->cond, &s->lock, &ts);
    }
    ncclResult_t res = s->error;
    s->error = ncclSuccess;
    pthread_mutex_unlock(&s->lock);
    return res;
}

ncclResult_t weft_stream_query(struct weft_stream *s)
{
    pthread_mutex_lock(&s->lock);
    ncclResult_t res = s->error != ncclSuccess          ? s->error
                       : s->completed < s->enqueued ? ncclInProgress
                                                    : ncclSuccess;
    pthread_mutex_unlock(&s->lock);
    return res;
}

ncclResult_t weft_stream_destroy(struct weft_stream *s)
{
    weft_stream_unregister(s);
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    ncclResult_t res = s->error;
    s->magic = 0;
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    return res;
}
