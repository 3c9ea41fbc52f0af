/* Knob lookup: environment first, then NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/param.h"

#define WEFT_CONF_MAX 256

struct weft_conf_entry {
    char *name;
    char *value;
};

static struct weft_conf_entry weft_conf[WEFT_CONF_MAX];
static int weft_conf_count;
static pthread_once_t weft_conf_once = PTHREAD_ONCE_INIT;

/* Earlier files win, so load the highest-priority file first and skip names already present. */
static void weft_conf_load_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[1024];
    while (fgets(line, sizeof(line), f) != NULL && weft_conf_count < WEFT_CONF_MAX) {
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s == '#' || *s == '\n' || *s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        char *value = eq + 1;
        value[strcspn(value, "\r\n")] = '\0';
        char *end = eq;
        while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        int dup = 0;
        for (int i = 0; i < weft_conf_count; i++)
            dup |= strcmp(weft_conf[i].name, s) == 0;
        if (dup)
            continue;
        weft_conf[weft_conf_count].name = strdup(s);
        weft_conf[weft_conf_count].value = strdup(value);
        if (weft_conf[weft_conf_count].name && weft_conf[weft_conf_count].value)
            weft_conf_count++;
    }
    fclose(f);
}

static void weft_conf_load(void)
{
    const char *user = getenv("NCCL_CONF_FILE");
    if (user != NULL) {
        weft_conf_load_file(user);
    } else {
        const char *home = getenv("HOME");
        if (home != NULL) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/.nccl.conf", home);
            weft_conf_load_file(path);
        }
    }
    weft_conf_load_file("/etc/nccl.conf");
}

const char *weft_param_lookup(const char *env)
{
    const char *v = getenv(env);
    if (v != NULL)
        return v;
    pthread_once(&weft_conf_once, weft_conf_load);
    for (int i = 0; i < weft_conf_count; i++)
        if (strcmp(weft_conf[i].name, env) == 0)
            return weft_conf[i].value;
    return NULL;
}

/* The first reads of a knob may come from several threads at once (ranks as threads): one loads
 * it under this lock, the others find it loaded; readers after that see `loaded` (acquire) and
 * never write. */
static pthread_mutex_t weft_param_lock = PTHREAD_MUTEX_INITIALIZER;

static void weft_param_load_locked(struct weft_param *p);

static void weft_param_load(struct weft_param *p)
{
    pthread_mutex_lock(&weft_param_lock);
    if (!__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE))
        weft_param_load_locked(p);
    pthread_mutex_unlock(&weft_param_lock);
}

static void weft_param_load_locked(struct weft_param *p)
{
    const char *raw = weft_param_lookup(p->env);
    if (p->is_string) {
        p->value_str = raw != NULL ? raw : p->default_str;
        if (raw != NULL)
            WEFT_INFO(WEFT_LOG_ENV, "%s set by environment to %s", p->env, raw);
    } else {
        p->value_int = p->default_int;
        if (raw != NULL && *raw != '\0') {
            char *end;
            errno = 0;
            long long v = strtoll(raw, &end, 0);
            if (errno != 0 || *end != '\0') {
                WEFT_WARN("invalid value %s for %s, using default %lld", raw, p->env,
                          (long long)p->default_int);
            } else {
                p->value_int = v;
                WEFT_INFO(WEFT_LOG_ENV, "%s set by environment to %lld", p->env, v);
            }
        }
    }
    __atomic_store_n(&p->loaded, 1, __ATOMIC_RELEASE);
}

int64_t weft_param_int(struct weft_param *p)
{
    if (!__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE))
        weft_param_load(p);
    return p->value_int;
}

const char *weft_param_str(struct weft_param *p)
{
    if (!__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE))
        weft_param_load(p);
    return p->value_str;
}

/* The linker provides the bounds of the section holding every knob's pointer. */
extern struct weft_param *__start_weft_params[] __attribute__((weak, visibility("hidden")));
extern struct weft_param *__stop_weft_params[] __attribute__((weak, visibility("hidden")));

void weft_param_foreach(void (*fn)(const struct weft_param *p, void *arg), void *arg)
{
    if (__start_weft_params == NULL)
        return;
    for (struct weft_param **it = __start_weft_params; it < __stop_weft_params; it++)
        fn(*it, arg);
}
