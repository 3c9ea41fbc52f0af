/*
 * weft-info: what this Weft build is and how it can be configured.
 *   weft-info        version and build features
 *   weft-info -e     every environment knob: name, default, current value, help
 */
#include <stdio.h>
#include <string.h>

#include "core/param.h"
#include "nccl.h"

static void print_param(const struct weft_param *p, void *arg)
{
    (void)arg;
    const char *set = weft_param_lookup(p->env);
    if (set != NULL && strcmp(p->env, "WEFT_SECRET") == 0 && set[0] != '/')
        set = "(hidden)"; /* a secret is never printed; a file name is */
    if (p->is_string)
        printf("%-28s default %-10s%s%s\n    %s\n", p->env,
               p->default_str != NULL ? p->default_str : "(unset)", set ? " set to " : "",
               set ? set : "", p->help);
    else
        printf("%-28s default %-10lld%s%s\n    %s\n", p->env, (long long)p->default_int,
               set ? " set to " : "", set ? set : "", p->help);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "-e") == 0) {
        weft_param_foreach(print_param, NULL);
        printf("\nAlso read: NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE, NCCL_CONF_FILE"
               " (and /etc/nccl.conf, ~/.nccl.conf).\n");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [-e]\n", argv[0]);
        return 2;
    }
    int v = 0;
    ncclGetVersion(&v);
    printf("Weft %s, NCCL API %d.%d.%d (ncclGetVersion %d)\n", WEFT_VERSION_STRING, v / 10000,
           (v % 10000) / 100, v % 100, v);
    printf("transports: shm (host memory, same host)\n");
    printf("executors: host (threads), simulator (tests)\n");
    return 0;
}
