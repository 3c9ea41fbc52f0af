/* Logging: level and subsystem filters read once; one write() per line; last warning kept. */
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/param.h"

int weft_log_level = -1;
uint32_t weft_log_mask = WEFT_LOG_INIT | WEFT_LOG_BOOTSTRAP | WEFT_LOG_ENV;

static int weft_log_fd = 1;
static char weft_log_host[64] = "unknown";
static pthread_mutex_t weft_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char weft_last_error[1024];

static const char *const weft_subsys_names[] = {
    "INIT", "COLL",      "P2P", "SHM",     "NET", "GRAPH", "TUNING", "ENV",
    "ALLOC", "CALL", "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS",
};

static uint32_t weft_log_parse_mask(const char *s)
{
    int invert = 0;
    uint32_t mask = 0;
    if (*s == '^') {
        invert = 1;
        s++;
    }
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (strcasecmp(tok, "ALL") == 0) {
            mask = WEFT_LOG_ALL;
            continue;
        }
        for (unsigned i = 0; i < sizeof(weft_subsys_names) / sizeof(weft_subsys_names[0]); i++)
            if (strcasecmp(tok, weft_subsys_names[i]) == 0)
                mask |= 1u << i;
    }
    return invert ? ~mask : mask;
}

/* Expands %h (host) and %p (pid) in NCCL_DEBUG_FILE. */
static void weft_log_open_file(const char *pattern)
{
    char path[4096];
    size_t n = 0;
    for (const char *p = pattern; *p != '\0' && n + 64 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            n += snprintf(path + n, sizeof(path) - n, "%s", weft_log_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            n += snprintf(path + n, sizeof(path) - n, "%d", (int)getpid());
            p++;
        } else {
            path[n++] = *p;
        }
    }
    path[n] = '\0';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0)
        weft_log_fd = fd;
}

void weft_log_init(void)
{
    pthread_mutex_lock(&weft_log_lock);
    if (weft_log_level >= 0) {
        pthread_mutex_unlock(&weft_log_lock);
        return;
    }
    gethostname(weft_log_host, sizeof(weft_log_host) - 1);
    char *dot = strchr(weft_log_host, '.');
    if (dot != NULL)
        *dot = '\0';
    int level = WEFT_LOG_LEVEL_NONE;
    const char *env = weft_param_lookup("NCCL_DEBUG");
    if (env != NULL) {
        if (strcasecmp(env, "VERSION") == 0)
            level = WEFT_LOG_LEVEL_VERSION;
        else if (strcasecmp(env, "WARN") == 0)
            level = WEFT_LOG_LEVEL_WARN;
        else if (strcasecmp(env, "INFO") == 0)
            level = WEFT_LOG_LEVEL_INFO;
        else if (strcasecmp(env, "ABORT") == 0)
            level = WEFT_LOG_LEVEL_ABORT;
        else if (strcasecmp(env, "TRACE") == 0)
            level = WEFT_LOG_LEVEL_TRACE;
    }
    const char *subsys = weft_param_lookup("NCCL_DEBUG_SUBSYS");
    if (subsys != NULL)
        weft_log_mask = weft_log_parse_mask(subsys);
    const char *file = weft_param_lookup("NCCL_DEBUG_FILE");
    if (file != NULL && level > WEFT_LOG_LEVEL_NONE)
        weft_log_open_file(file);
    __atomic_store_n(&weft_log_level, level, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&weft_log_lock);
}

void weft_log(int level, uint32_t subsys, const char *file, int line, const char *fmt, ...)
{
    (void)subsys;
    if (__builtin_expect(weft_log_level < 0, 0))
        weft_log_init();
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (level == WEFT_LOG_LEVEL_WARN) {
        pthread_mutex_lock(&weft_log_lock);
        snprintf(weft_last_error, sizeof(weft_last_error), "%s", msg);
        pthread_mutex_unlock(&weft_log_lock);
    }
    if (level > weft_log_level && !(level == WEFT_LOG_LEVEL_WARN &&
                                     weft_log_level >= WEFT_LOG_LEVEL_WARN))
        return;
    char out[1280];
    long tid = syscall(SYS_gettid);
    int n;
    if (level == WEFT_LOG_LEVEL_WARN) {
        const char *base = strrchr(file, '/');
        n = snprintf(out, sizeof(out), "%s:%d:%ld [0] %s:%d NCCL WARN %s\n", weft_log_host,
                     (int)getpid(), tid, base ? base + 1 : file, line, msg);
    } else {
        n = snprintf(out, sizeof(out), "%s:%d:%ld [0] NCCL %s %s\n", weft_log_host,
                     (int)getpid(), tid, level == WEFT_LOG_LEVEL_TRACE ? "TRACE" : "INFO", msg);
    }
    if (n > (int)sizeof(out))
        n = sizeof(out);
    ssize_t w = write(weft_log_fd, out, (size_t)n);
    (void)w;
    if (level == WEFT_LOG_LEVEL_WARN && weft_log_level == WEFT_LOG_LEVEL_ABORT)
        abort();
}

/* A copy per calling thread, taken under the lock: reading the shared text while a proxy thread
 * logged a new one was a data race (ThreadSanitizer). Valid until the thread's next call. */
const char *weft_log_last_error(void)
{
    static __thread char copy[sizeof(weft_last_error)];
    pthread_mutex_lock(&weft_log_lock);
    memcpy(copy, weft_last_error, sizeof(copy));
    pthread_mutex_unlock(&weft_log_lock);
    return copy;
}

void weft_log_set_last_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&weft_log_lock);
    vsnprintf(weft_last_error, sizeof(weft_last_error), fmt, ap);
    pthread_mutex_unlock(&weft_log_lock);
    va_end(ap);
}
