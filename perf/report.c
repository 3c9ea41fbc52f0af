/*
 * The perf driver's report: the numbers of the nccl-tests table, its device lines and header, and
 * the -J JSON lines (see common.h, "Output").
 */
#include "driver.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* nccl-tests' number layout: 2, 1 or 0 decimals by the number of integer digits, else exponent. */
static void format_num(double v, int width, char *out, size_t n)
{
    int digits = 0;

    if (!isfinite(v) || v < 0) {
        snprintf(out, n, "%*.2f", width, v);
        return;
    }
    for (double p = 1; v >= p && digits < 40; p *= 10)
        digits++;
    if (digits < width - 2)
        snprintf(out, n, "%*.2f", width, v);
    else if (digits < width - 1)
        snprintf(out, n, "%*.1f", width, v);
    else if (digits < width + 1)
        snprintf(out, n, "%*.0f", width, v);
    else if (width >= 7)
        snprintf(out, n, "%*.1e", width, v);
    else
        snprintf(out, n, "%*.0e", width, v);
}

static void json_number(FILE *f, const char *key, double v, const char *fmt)
{
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f);
}

void perf_json_line(struct perf_state *st, const struct perf_op *op, const struct perf_result *r)
{
    FILE *f = st->json;
    size_t ts = op->type->size;
    size_t bytes = (op->c.send_count > op->c.recv_count ? op->c.send_count : op->c.recv_count) * ts;

    /* The fields and their order are documented in common.h: keep them stable. */
    fprintf(f, "{\"library\":\"%s\",\"collective\":\"%s\",\"nranks\":%d,\"bytes\":%zu,"
               "\"count\":%zu",
            st->team.ctx[0].library, st->coll->name, st->team.ctx[0].nranks, bytes, op->c.count);
    fprintf(f, ",\"type\":\"%s\",\"op\":\"%s\",\"root\":%d,\"inplace\":%s", op->type->name,
            perf_op_name(op->op), op->root, op->in_place ? "true" : "false");
    json_number(f, "time_us", r->time_us, "%.3f");
    json_number(f, "algbw", r->algbw, "%.6f");
    json_number(f, "busbw", r->busbw, "%.6f");
    if (r->wrong >= 0)
        fprintf(f, ",\"wrong\":%" PRId64, r->wrong);
    else
        fputs(",\"wrong\":null", f);
    fprintf(f, ",\"memory\":\"%s\"", st->dev_bufs ? "device" : "host");
    fprintf(f, ",\"iters\":%d,\"repeats\":%d", r->iters, st->a.repeats);
    json_number(f, "time_us_min", r->time_min_us, "%.3f");
    json_number(f, "time_us_max", r->time_max_us, "%.3f");
    fputs("}\n", f);
    fflush(f);
}

void perf_append_body(char *line, size_t n, const struct perf_result *r)
{
    char t[32], ab[32], bb[32];
    size_t len = strlen(line);

    format_num(r->time_us, 7, t, sizeof(t));
    format_num(r->algbw, 6, ab, sizeof(ab));
    format_num(r->busbw, 6, bb, sizeof(bb));
    if (r->wrong >= 0)
        snprintf(line + len, n - len, "  %7s  %6s  %6s  %6g", t, ab, bb, (double)r->wrong);
    else
        snprintf(line + len, n - len, "  %7s  %6s  %6s  %6s", t, ab, bb, "N/A");
}

/* -S or -k: rows end with each half's iterations per repeat and spread of the repeats. */
int perf_timing_columns(const struct perf_args *a)
{
    return a->time_target > 0 || a->repeats > 1;
}

struct perf_rank_info {
    int32_t pid;
    int32_t device;
    char host[56];
    char desc[64];
};

void perf_print_devices(struct perf_state *st)
{
    size_t n = (size_t)st->team.ctx[0].nranks;
    struct perf_rank_info *in = calloc((size_t)st->team.n, sizeof(*in));
    struct perf_rank_info *out = calloc(n, sizeof(*out));

    if (in == NULL || out == NULL) {
        fprintf(stderr, "perf: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < st->team.n; i++) {
        const struct perf_ctx *ctx = &st->team.ctx[i];
        in[i].pid = (int32_t)getpid();
        in[i].device = st->dev_bufs ? ctx->device : ctx->local_rank;
        snprintf(in[i].host, sizeof(in[i].host), "%.55s", st->host);
        if (st->dev_bufs)
            st->dm->describe(ctx->device, in[i].desc, sizeof(in[i].desc));
        else
            snprintf(in[i].desc, sizeof(in[i].desc), "[host] host memory");
    }
    PERF_CHECK(st, st->be->allgather(&st->team, in, out, sizeof(*in)));
    if (st->is_main) {
        printf("# Using devices\n");
        for (size_t r = 0; r < n; r++) {
            out[r].host[sizeof(out[r].host) - 1] = '\0';
            out[r].desc[sizeof(out[r].desc) - 1] = '\0';
            printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d %s\n", (int)r, 0,
                   (int)out[r].pid, out[r].host, (int)out[r].device, out[r].desc);
        }
    }
    free(in);
    free(out);
}

/* Prints the table header (main thread, once the device lines are out). */
void perf_print_table_header(const struct perf_state *st)
{
    const char *tname = st->a.report_cputime ? "cputime" : "time";

    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place  "
           "        \n",
           "", "", "", "", "");
    int tc = perf_timing_columns(&st->a);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n", "size",
           "count", "type", "redop", "root", tname, "algbw", "busbw", "#wrong", tname, "algbw",
           "busbw", "#wrong", tc ? "     iters  spread     iters  spread" : " ");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "", tc ? "    (oop)     (%)      (ip)     (%)" : " ");
    if (tc && st->a.time_target > 0)
        printf("# time: the median of %d timed run(s) per half, each of about %g s (iterations per "
               "size from a calibration, -S); spread: (slowest - fastest) / median\n",
               st->a.repeats, st->a.time_target);
    else if (tc)
        printf("# time: the median of %d timed runs of %d iterations per half; spread: (slowest "
               "- fastest) / median\n", st->a.repeats, st->a.iters);
}
