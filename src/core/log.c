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

/* Declared for weft-info -e; weft_log_init reads it raw (weft_param_lookup), as it reads
 * NCCL_DEBUG: a parameter's first read logs, and logging cannot wait for itself. */
WEFT_PARAM_STR(LogFormat, "WEFT_LOG_FORMAT", "text",
               "text: NCCL's log lines; json: each line one JSON object (time, host, pid, tid, "
               "rank, subsystem, level, message, and peer, operation, seq, file, line where the "
               "line has them)");

static int weft_log_fd = 1;
static int weft_log_json;
static __thread int weft_log_rank = -1;
static int weft_log_launch_rank = -1; /* the launcher's rank for this process, if it said */
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
    const char *format = weft_param_lookup("WEFT_LOG_FORMAT");
    weft_log_json = format != NULL && strcasecmp(format, "json") == 0;
    /* JSON lines logged before any communicator exists still name the process's rank */
    static const char *const launch_rank[] = {"WEFT_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                              "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof(launch_rank) / sizeof(*launch_rank); i++) {
        const char *v = getenv(launch_rank[i]);
        if (v != NULL && *v >= '0' && *v <= '9') {
            weft_log_launch_rank = atoi(v);
            break;
        }
    }
    const char *file = weft_param_lookup("NCCL_DEBUG_FILE");
    if (file != NULL && level > WEFT_LOG_LEVEL_NONE)
        weft_log_open_file(file);
    __atomic_store_n(&weft_log_level, level, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&weft_log_lock);
}

void weft_log_set_rank(int rank)
{
    weft_log_rank = rank;
}

/* Appends s to out[size] at *n as JSON string content: quote, backslash and control characters
 * escaped, and bytes above 0x7f as \u00XX (always valid JSON, whatever the bytes were). */
static void weft_log_json_str(char *out, size_t size, size_t *n, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0' && *n + 8 < size; p++) {
        if (*p == '"' || *p == '\\') {
            out[(*n)++] = '\\';
            out[(*n)++] = (char)*p;
        } else if (*p == '\n' || *p == '\t') {
            out[(*n)++] = '\\';
            out[(*n)++] = *p == '\n' ? 'n' : 't';
        } else if (*p < 0x20 || *p > 0x7e) {
            *n += (size_t)snprintf(out + *n, size - *n, "\\u00%c%c", hex[*p >> 4], hex[*p & 15]);
        } else {
            out[(*n)++] = (char)*p;
        }
    }
}

/* The integer after the first "key " in msg (key at a word start), or -1. */
static long long weft_log_field(const char *msg, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = strstr(msg, key); p != NULL; p = strstr(p + 1, key)) {
        const char *v = p + kl;
        if ((p == msg || p[-1] == ' ' || p[-1] == '(') && *v == ' ' && v[1] >= '0' && v[1] <= '9')
            return strtoll(v + 1, NULL, 10);
    }
    return -1;
}

static const char *const weft_log_colls[] = {
    "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
    "AllToAll",  "Gather",    "Scatter",       "Send",      "Recv",
};

/* The operation a message names: its first ncclXxx word, or a collective as its first word. */
static void weft_log_operation(const char *msg, char *op, size_t size)
{
    op[0] = '\0';
    for (const char *p = strstr(msg, "nccl"); p != NULL; p = strstr(p + 1, "nccl")) {
        if ((p == msg || p[-1] == ' ' || p[-1] == '(') && p[4] >= 'A' && p[4] <= 'Z') {
            size_t l = 4;
            while (l + 1 < size && ((p[l] >= 'A' && p[l] <= 'Z') || (p[l] >= 'a' && p[l] <= 'z')))
                l++;
            memcpy(op, p, l);
            op[l] = '\0';
            return;
        }
    }
    for (size_t i = 0; i < sizeof(weft_log_colls) / sizeof(*weft_log_colls); i++) {
        size_t l = strlen(weft_log_colls[i]);
        if (strncmp(msg, weft_log_colls[i], l) == 0 && (msg[l] == ' ' || msg[l] == ':')) {
            snprintf(op, size, "%s", weft_log_colls[i]);
            return;
        }
    }
}

/* One JSON object for a log line (WEFT_LOG_FORMAT=json), newline-terminated, into out[size]. */
static int weft_log_format_json(char *out, size_t size, int level, uint32_t subsys,
                                const char *file, int line, long tid, const char *msg)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = (size_t)snprintf(out, size,
                                "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ\",\"host\":\"",
                                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                                tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000);
    weft_log_json_str(out, size, &n, weft_log_host);
    long long rank = weft_log_field(msg, "rank");
    if (rank < 0)
        rank = weft_log_rank >= 0 ? weft_log_rank : weft_log_launch_rank;
    n += (size_t)snprintf(out + n, size - n, "\",\"pid\":%d,\"tid\":%ld,\"rank\":", (int)getpid(),
                          tid);
    n += (size_t)(rank >= 0 ? snprintf(out + n, size - n, "%lld", rank)
                            : snprintf(out + n, size - n, "null"));
    n += (size_t)snprintf(out + n, size - n, ",\"subsystem\":");
    if (level == WEFT_LOG_LEVEL_WARN || subsys == WEFT_LOG_ALL) {
        n += (size_t)snprintf(out + n, size - n, "null");
    } else {
        int first = 1;
        out[n++] = '"';
        for (unsigned i = 0; i < sizeof(weft_subsys_names) / sizeof(*weft_subsys_names); i++)
            if (subsys & (1u << i)) {
                n += (size_t)snprintf(out + n, size - n, "%s%s", first ? "" : ",",
                                      weft_subsys_names[i]);
                first = 0;
            }
        out[n++] = '"';
    }
    n += (size_t)snprintf(out + n, size - n, ",\"level\":\"%s\",\"message\":\"",
                          level == WEFT_LOG_LEVEL_WARN    ? "WARN"
                          : level == WEFT_LOG_LEVEL_TRACE ? "TRACE"
                                                          : "INFO");
    weft_log_json_str(out, size, &n, msg);
    out[n++] = '"';
    long long peer = weft_log_field(msg, "peer"), seq = weft_log_field(msg, "operation");
    char op[64];
    weft_log_operation(msg, op, sizeof(op));
    if (peer >= 0)
        n += (size_t)snprintf(out + n, size - n, ",\"peer\":%lld", peer);
    if (op[0] != '\0')
        n += (size_t)snprintf(out + n, size - n, ",\"operation\":\"%s\"", op);
    if (seq >= 0)
        n += (size_t)snprintf(out + n, size - n, ",\"seq\":%lld", seq);
    if (level == WEFT_LOG_LEVEL_WARN) {
        const char *base = strrchr(file, '/');
        n += (size_t)snprintf(out + n, size - n, ",\"file\":\"");
        weft_log_json_str(out, size, &n, base ? base + 1 : file);
        n += (size_t)snprintf(out + n, size - n, "\",\"line\":%d", line);
    }
    n += (size_t)snprintf(out + n, size - n, "}\n");
    return (int)n;
}

void weft_log(int level, uint32_t subsys, const char *file, int line, const char *fmt, ...)
{
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
    char out[8192];
    long tid = syscall(SYS_gettid);
    int n;
    if (weft_log_json) {
        n = weft_log_format_json(out, sizeof(out), level, subsys, file, line, tid, msg);
    } else if (level == WEFT_LOG_LEVEL_WARN) {
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
