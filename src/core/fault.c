/* Fault injection: the WEFT_FAULT parser and the hooks' slow path (core/fault.h). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/fault.h"
#include "core/log.h"
#include "core/param.h"

WEFT_PARAM_STR(Fault, "WEFT_FAULT", NULL,
               "faults to inject, for tests: SPEC[,SPEC...], SPEC one of kill:op=N, alloc:op=N, "
               "stall:sec=S, drop, corrupt (each with optional :rank=R; the last three with "
               ":peer=P:frame=K, socket data frames), note[:rank=R][:peer=P][:n=K] (a mismatch or "
               "hang note fails), devalloc:n=N, launch:n=N (emulated GPU); "
               "docs/robustness.md \"Fault injection\"");

int weft_fault_state; /* 0 unread, 1 none, 2 armed */
static struct weft_fault weft_faults[WEFT_FAULT_MAX];
static int weft_nfaults;
static int weft_fault_valid = 1;
static char weft_fault_error[256];
static pthread_once_t weft_fault_once = PTHREAD_ONCE_INIT;
static int weft_fault_alloc_pending;

static const struct {
    const char *name;
    int kind;
    const char *required; /* the key that must be given */
} weft_fault_kinds[] = {
    {"kill", WEFT_FAULT_KILL, "op"},       {"alloc", WEFT_FAULT_ALLOC, "op"},
    {"stall", WEFT_FAULT_STALL, "sec"},    {"drop", WEFT_FAULT_DROP, NULL},
    {"corrupt", WEFT_FAULT_CORRUPT, NULL}, {"devalloc", WEFT_FAULT_DEVALLOC, "n"},
    {"launch", WEFT_FAULT_LAUNCH, "n"},    {"note", WEFT_FAULT_NOTE, NULL},
};

static int weft_fault_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int weft_fault_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (errlen > 0)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Which keys each kind takes. */
static int weft_fault_key_ok(int kind, const char *key)
{
    int frame_kind = kind == WEFT_FAULT_STALL || kind == WEFT_FAULT_DROP ||
                     kind == WEFT_FAULT_CORRUPT;
    if (strcmp(key, "rank") == 0)
        return kind != WEFT_FAULT_DEVALLOC && kind != WEFT_FAULT_LAUNCH;
    if (strcmp(key, "op") == 0)
        return kind == WEFT_FAULT_KILL || kind == WEFT_FAULT_ALLOC;
    if (strcmp(key, "peer") == 0)
        return frame_kind || kind == WEFT_FAULT_NOTE;
    if (strcmp(key, "frame") == 0)
        return frame_kind;
    if (strcmp(key, "sec") == 0)
        return kind == WEFT_FAULT_STALL;
    if (strcmp(key, "n") == 0)
        return kind == WEFT_FAULT_DEVALLOC || kind == WEFT_FAULT_LAUNCH ||
               kind == WEFT_FAULT_NOTE;
    return 0;
}

int weft_fault_parse(const char *spec, struct weft_fault *faults, int max, char *err,
                     size_t errlen)
{
    int n = 0;
    const char *p = spec != NULL ? spec : "";
    if (*p == '\0')
        return 0;
    for (;;) {
        size_t len = strcspn(p, ",");
        char item[128];
        if (len == 0)
            return weft_fault_fail(err, errlen, "WEFT_FAULT: empty fault in \"%s\"", spec);
        if (len >= sizeof(item))
            return weft_fault_fail(err, errlen, "WEFT_FAULT: fault \"%.*s\" is too long",
                                   (int)len, p);
        if (n == max)
            return weft_fault_fail(err, errlen, "WEFT_FAULT: more than %d faults", max);
        memcpy(item, p, len);
        item[len] = '\0';
        struct weft_fault f = {.rank = -1, .peer = -1, .n = 1};
        char *save = NULL;
        char *tok = strtok_r(item, ":", &save);
        const char *required = NULL;
        for (size_t k = 0; tok != NULL && k < sizeof(weft_fault_kinds) / sizeof(*weft_fault_kinds);
             k++) {
            if (strcmp(tok, weft_fault_kinds[k].name) == 0) {
                f.kind = weft_fault_kinds[k].kind;
                required = weft_fault_kinds[k].required;
            }
        }
        if (f.kind == 0)
            return weft_fault_fail(err, errlen,
                                   "WEFT_FAULT: unknown fault \"%s\" (kill, alloc, stall, drop, "
                                   "corrupt, note, devalloc, launch)",
                                   tok != NULL ? tok : "");
        const char *kind_name = tok;
        int have_required = required == NULL;
        while ((tok = strtok_r(NULL, ":", &save)) != NULL) {
            char *eq = strchr(tok, '=');
            if (eq == NULL)
                return weft_fault_fail(err, errlen, "WEFT_FAULT: %s: \"%s\" is not KEY=VALUE",
                                       kind_name, tok);
            *eq = '\0';
            const char *key = tok, *val = eq + 1;
            if (!weft_fault_key_ok(f.kind, key))
                return weft_fault_fail(err, errlen, "WEFT_FAULT: %s takes no key \"%s\"",
                                       kind_name, key);
            char *end;
            errno = 0;
            long long v = strtoll(val, &end, 10);
            int is_rank = strcmp(key, "rank") == 0 || strcmp(key, "peer") == 0;
            long long lo = is_rank || strcmp(key, "sec") == 0 ? 0 : 1;
            long long hi = is_rank ? 0x7fffffffLL : 0x7fffffffffffffffLL;
            if (*val == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi)
                return weft_fault_fail(err, errlen,
                                       "WEFT_FAULT: %s: %s \"%s\" is not a number from %lld",
                                       kind_name, key, val, lo);
            if (strcmp(key, "rank") == 0)
                f.rank = (int)v;
            else if (strcmp(key, "peer") == 0)
                f.peer = (int)v;
            else if (strcmp(key, "sec") == 0)
                f.sec = v;
            else
                f.n = v; /* op, frame or n */
            if (required != NULL && strcmp(key, required) == 0)
                have_required = 1;
        }
        if (!have_required)
            return weft_fault_fail(err, errlen, "WEFT_FAULT: %s needs %s=", kind_name, required);
        faults[n++] = f;
        p += len;
        if (*p == '\0')
            return n;
        p++; /* the comma */
    }
}

static void weft_fault_load(void)
{
    const char *spec = weft_param_Fault();
    int n = weft_fault_parse(spec, weft_faults, WEFT_FAULT_MAX, weft_fault_error,
                             sizeof(weft_fault_error));
    if (n < 0) {
        weft_fault_valid = 0;
        n = 0;
    }
    weft_nfaults = n;
    if (n > 0)
        WEFT_INFO(WEFT_LOG_ENV, "WEFT_FAULT: %d faults armed (%s)", n, spec);
    __atomic_store_n(&weft_fault_state, n > 0 ? 2 : 1, __ATOMIC_RELEASE);
}

/* The armed faults, or none (the hooks call this on their slow path). */
static int weft_fault_list(struct weft_fault **faults_p)
{
    pthread_once(&weft_fault_once, weft_fault_load);
    *faults_p = weft_faults;
    return weft_nfaults;
}

ncclResult_t weft_fault_check(void)
{
    pthread_once(&weft_fault_once, weft_fault_load);
    if (!weft_fault_valid) {
        WEFT_WARN("%s", weft_fault_error);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* Counts one event for f; 1 exactly once, at the n-th. */
static int weft_fault_due(struct weft_fault *f)
{
    if (__atomic_load_n(&f->fired, __ATOMIC_RELAXED))
        return 0;
    if (__atomic_add_fetch(&f->seen, 1, __ATOMIC_RELAXED) != f->n)
        return 0;
    __atomic_store_n(&f->fired, 1, __ATOMIC_RELAXED);
    return 1;
}

void weft_fault_op(int rank)
{
    struct weft_fault *faults;
    int n = weft_fault_list(&faults);
    for (int i = 0; i < n; i++) {
        struct weft_fault *f = &faults[i];
        if ((f->kind != WEFT_FAULT_KILL && f->kind != WEFT_FAULT_ALLOC) ||
            (f->rank >= 0 && f->rank != rank) || !weft_fault_due(f))
            continue;
        if (f->kind == WEFT_FAULT_KILL) {
            WEFT_WARN("WEFT_FAULT: rank %d killed at its operation %lld", rank, (long long)f->n);
            raise(SIGKILL);
        }
        WEFT_INFO(WEFT_LOG_ENV, "WEFT_FAULT: rank %d: an allocation of operation %lld fails", rank,
                  (long long)f->n);
        __atomic_store_n(&weft_fault_alloc_pending, 1, __ATOMIC_RELAXED);
    }
}

int weft_fault_alloc(void)
{
    struct weft_fault *faults;
    weft_fault_list(&faults);
    return __atomic_exchange_n(&weft_fault_alloc_pending, 0, __ATOMIC_RELAXED);
}

int weft_fault_frame(int rank, int peer)
{
    struct weft_fault *faults;
    int n = weft_fault_list(&faults);
    int action = 0;
    for (int i = 0; i < n; i++) {
        struct weft_fault *f = &faults[i];
        if ((f->kind != WEFT_FAULT_STALL && f->kind != WEFT_FAULT_DROP &&
             f->kind != WEFT_FAULT_CORRUPT) ||
            (f->rank >= 0 && f->rank != rank) || (f->peer >= 0 && f->peer != peer) ||
            !weft_fault_due(f))
            continue;
        if (f->kind == WEFT_FAULT_STALL) {
            WEFT_INFO(WEFT_LOG_ENV, "WEFT_FAULT: rank %d stalls %lld s before data frame %lld to "
                      "peer %d", rank, (long long)f->sec, (long long)f->n, peer);
            struct timespec ts = {(time_t)f->sec, 0};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        } else {
            WEFT_INFO(WEFT_LOG_ENV, "WEFT_FAULT: rank %d %s data frame %lld to peer %d", rank,
                      f->kind == WEFT_FAULT_DROP ? "drops" : "corrupts", (long long)f->n, peer);
            action = f->kind;
        }
    }
    return action;
}

int weft_fault_note(int rank, int peer)
{
    struct weft_fault *faults;
    int n = weft_fault_list(&faults);
    int hit = 0;
    for (int i = 0; i < n; i++) {
        struct weft_fault *f = &faults[i];
        if (f->kind != WEFT_FAULT_NOTE || (f->rank >= 0 && f->rank != rank) ||
            (f->peer >= 0 && f->peer != peer) || !weft_fault_due(f))
            continue;
        WEFT_INFO(WEFT_LOG_ENV, "WEFT_FAULT: rank %d's note %lld to peer %d fails", rank,
                  (long long)f->n, peer);
        hit = 1;
    }
    return hit;
}

int weft_fault_call(int kind)
{
    struct weft_fault *faults;
    int n = weft_fault_list(&faults);
    int hit = 0;
    for (int i = 0; i < n; i++)
        if (faults[i].kind == kind && weft_fault_due(&faults[i]))
            hit = 1;
    return hit;
}
