/*
 * Configuration knobs. Each is declared exactly once, in the .c file that owns it:
 *
 *     WEFT_PARAM(ShmDisable, "NCCL_SHM_DISABLE", 0, "disable the shared-memory transport");
 *
 * which defines `int64_t weft_param_ShmDisable(void)`. Other files use WEFT_PARAM_DECL(ShmDisable).
 * Values come from, in priority order: the environment, NCCL_CONF_FILE (or ~/.nccl.conf), then
 * /etc/nccl.conf (NAME=value lines). Integers are parsed with strtoll base 0 (hex ok). The value is
 * read once, cached, and logged under ENV when it differs from the default. Every knob lands in the
 * "weft_params" section so weft-info -e can list them all with their defaults and help.
 * Thread-safe: the first reads may race, but they compute the same value.
 */
#ifndef WEFT_CORE_PARAM_H
#define WEFT_CORE_PARAM_H

#include <stdint.h>

struct weft_param {
    const char *env;
    const char *help;
    int is_string;
    int64_t default_int;
    const char *default_str;
    /* cache */
    int loaded;
    int64_t value_int;
    const char *value_str;
};

int64_t weft_param_int(struct weft_param *p);
const char *weft_param_str(struct weft_param *p);
/* Raw lookup (environment, then config files); NULL when unset. */
const char *weft_param_lookup(const char *env);
/* Iterates over every declared knob in the linked module. */
void weft_param_foreach(void (*fn)(const struct weft_param *p, void *arg), void *arg);

#define WEFT_PARAM_SECTION __attribute__((used, section("weft_params"), aligned(sizeof(void *))))

#define WEFT_PARAM(name, env, def, help_text)                                                      \
    static struct weft_param weft_param_obj_##name = {(env), (help_text), 0, (def), 0, 0, 0, 0};   \
    static struct weft_param *weft_param_ptr_##name WEFT_PARAM_SECTION = &weft_param_obj_##name;   \
    int64_t weft_param_##name(void)                                                                \
    {                                                                                              \
        if (__atomic_load_n(&weft_param_obj_##name.loaded, __ATOMIC_ACQUIRE))                     \
            return weft_param_obj_##name.value_int; /* read once: no call on hot paths */         \
        return weft_param_int(&weft_param_obj_##name);                                             \
    }

#define WEFT_PARAM_STR(name, env, def, help_text)                                                  \
    static struct weft_param weft_param_obj_##name = {(env), (help_text), 1, 0, (def), 0, 0, 0};   \
    static struct weft_param *weft_param_ptr_##name WEFT_PARAM_SECTION = &weft_param_obj_##name;   \
    const char *weft_param_##name(void)                                                            \
    {                                                                                              \
        return weft_param_str(&weft_param_obj_##name);                                             \
    }

#define WEFT_PARAM_DECL(name) int64_t weft_param_##name(void)
#define WEFT_PARAM_STR_DECL(name) const char *weft_param_##name(void)

#endif
