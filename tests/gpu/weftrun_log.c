/*
 * weft_log for tests/gpu's weftrun: the launcher tools/weftrun.c linked to libnccl.so.2 instead
 * of the static library, for the build carried to the GPU machine (the static one holds the
 * kernels' fat binary, 10 MB that a launcher never loads). Its only internal dependency,
 * src/core/hexid.c, logs through weft_log, which libnccl.so.2 keeps local: this prints the same
 * message, as a WARN, to stderr.
 */
#include <stdarg.h>
#include <stdio.h>

#include "core/log.h"

void weft_log(int level, uint32_t subsys, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    (void)subsys;
    fprintf(stderr, "weftrun %s %s:%d ", level <= WEFT_LOG_LEVEL_WARN ? "WARN" : "INFO", file,
            line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
