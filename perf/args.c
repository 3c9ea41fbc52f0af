/*
 * The perf driver's arguments: nccl-tests' flags (see common.h).
 */
#include "driver.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Arguments
 * ------------------------------------------------------------------------------------------- */

static void perf_usage(const char *prog)
{
    printf("USAGE: %s \n\t"
           "[-t,--nthreads <num threads>] \n\t"
           "[-g,--ngpus <gpus per thread>] \n\t"
           "[-b,--minbytes <min size in bytes>] \n\t"
           "[-e,--maxbytes <max size in bytes>] \n\t"
           "[-i,--stepbytes <increment size>] \n\t"
           "[-f,--stepfactor <increment factor>] \n\t"
           "[-n,--iters <iteration count>] \n\t"
           "[-m,--agg_iters <aggregated iteration count>] \n\t"
           "[-w,--warmup_iters <warmup iteration count>] \n\t"
           "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
           "[-p,--parallel_init <0/1>] (no effect: each thread inits its own ranks)\n\t"
           "[-c,--check <check iteration count>] \n\t"
           "[-o,--op <sum/prod/min/max/avg/mulsum/all>] \n\t"
           "[-d,--datatype <nccltype/all>] \n\t"
           "[-r,--root <root>] \n\t"
           "[-z,--blocking <0/1/2/3>] \n\t"
           "[-y,--stream_null <0/1>] (device buffers; host buffers use the NULL stream)\n\t"
           "[-T,--timeout <time in seconds>] \n\t"
           "[-G,--cudagraph <num graph launches>] (device buffers)\n\t"
           "[-C,--report_cputime <0/1>] \n\t"
           "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
           "[-J,--output_file <file> JSON lines, one per measurement] \n\t"
           "[-u,--unalign <num elements>] \n\t"
           "[-H,--host_buffers <0/1> host memory even where a GPU is (default: 0)] \n\t"
           "[-R,--local_register <0/1> 1: buffers from ncclMemAlloc, registered with "
           "ncclCommRegister (device memory where a GPU is; -H 1: Weft with WEFT_CUDA=0; "
           "default: 0)] \n\t"
           "[-S,--time_target <seconds>] iterations per size for timed runs of about this long "
           "(replaces -n; default 0: -n)\n\t"
           "[-k,--repeats <1-64>] timed runs per row: the row shows their median time and "
           "their spread (default 1)\n\t"
           "[-h,--help]\n"
           "Run under weftrun: weftrun -n <processes> %s ...; ranks = processes x -t x -g, rank\n"
           "i of a process on GPU i mod (GPUs of the host), several ranks may share one.\n"
           "Buffers are device memory where a GPU backend is (Weft: WEFT_CUDA=emu:N or a GPU;\n"
           "another libnccl.so.2: the CUDA runtime), host memory otherwise or with -H 1.\n"
           "Not supported: -R 2 (symmetric registration), -D (device API).\n",
           prog, prog);
}

static int perf_parse_size(const char *text, size_t *out)
{
    char *end;
    double v;
    double unit = 1;

    errno = 0;
    v = strtod(text, &end);
    if (end == text || errno != 0 || v < 0)
        return -1;
    while (*end == ' ')
        end++;
    switch (*end) {
    case 'G':
    case 'g':
        unit = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 'M':
    case 'm':
        unit = 1024.0 * 1024;
        end++;
        break;
    case 'K':
    case 'k':
        unit = 1024.0;
        end++;
        break;
    case '\0':
        break;
    default:
        return -1;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v * unit > 9.0e18)
        return -1;
    *out = (size_t)(v * unit);
    return 0;
}

static int parse_long(const char *text, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 0);
    if (end == text || *end != '\0' || errno != 0)
        return -1;
    *out = v;
    return 0;
}

#define PERF_ARG_ERROR(...)                                                                        \
    do {                                                                                           \
        if (is_main) {                                                                             \
            fprintf(stderr, "%s: ", prog);                                                         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
        return 2;                                                                                  \
    } while (0)

/* Returns 0 to run, 2 for a usage error (printed on the main rank), -1 after --help. */
int perf_parse_args(struct perf_args *a, int argc, char **argv, const char *prog, int is_main,
                    const struct perf_backend *be)
{
    static const struct option longopts[] = {
        {"nthreads", required_argument, 0, 't'},
        {"ngpus", required_argument, 0, 'g'},
        {"minbytes", required_argument, 0, 'b'},
        {"maxbytes", required_argument, 0, 'e'},
        {"stepbytes", required_argument, 0, 'i'},
        {"stepfactor", required_argument, 0, 'f'},
        {"iters", required_argument, 0, 'n'},
        {"agg_iters", required_argument, 0, 'm'},
        {"warmup_iters", required_argument, 0, 'w'},
        {"run_cycles", required_argument, 0, 'N'},
        {"parallel_init", required_argument, 0, 'p'},
        {"check", required_argument, 0, 'c'},
        {"op", required_argument, 0, 'o'},
        {"datatype", required_argument, 0, 'd'},
        {"root", required_argument, 0, 'r'},
        {"blocking", required_argument, 0, 'z'},
        {"stream_null", required_argument, 0, 'y'},
        {"timeout", required_argument, 0, 'T'},
        {"cudagraph", required_argument, 0, 'G'},
        {"report_cputime", required_argument, 0, 'C'},
        {"average", required_argument, 0, 'a'},
        {"local_register", required_argument, 0, 'R'},
        {"cta_policy", required_argument, 0, 'x'},
        {"device_implementation", required_argument, 0, 'D'},
        {"output_file", required_argument, 0, 'J'},
        {"unalign", required_argument, 0, 'u'},
        {"host_buffers", required_argument, 0, 'H'},
        {"host-buffers", required_argument, 0, 'H'},
        {"time_target", required_argument, 0, 'S'},
        {"repeats", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *type_arg = "float", *op_arg = "sum";
    long v;
    int c;

    memset(a, 0, sizeof(*a));
    a->min_bytes = a->max_bytes = 32u << 20;
    a->step_bytes = 1u << 20;
    a->step_factor = 1;
    a->iters = 20;
    a->repeats = 1;
    a->warmup = 1;
    a->agg = 1;
    a->cycles = 1;
    a->check = 1;
    a->average = 1;
    a->nthreads = 1;
    a->ngpus = 1;

    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv,
                            "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:R:x:D:J:u:H:S:k:h", longopts,
                            NULL)) != -1) {
        if (c == 'h') {
            if (is_main)
                perf_usage(prog);
            return -1;
        }
        if (c == '?' || c == ':') {
            if (optopt)
                PERF_ARG_ERROR("invalid or incomplete option '-%c' (see -h)", optopt);
            PERF_ARG_ERROR("invalid option '%s' (see -h)", argv[optind - 1]);
        }
        switch (c) {
        case 'b':
            if (perf_parse_size(optarg, &a->min_bytes))
                PERF_ARG_ERROR("invalid size specified for 'minbytes': '%s'", optarg);
            continue;
        case 'e':
            if (perf_parse_size(optarg, &a->max_bytes))
                PERF_ARG_ERROR("invalid size specified for 'maxbytes': '%s'", optarg);
            continue;
        case 'i':
            if (perf_parse_size(optarg, &a->step_bytes))
                PERF_ARG_ERROR("invalid size specified for 'stepbytes': '%s'", optarg);
            continue;
        case 'o':
            op_arg = optarg;
            continue;
        case 'd':
            type_arg = optarg;
            continue;
        case 'J':
            a->json_path = optarg;
            continue;
        case 'S': {
            char *end;
            errno = 0;
            a->time_target = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || errno != 0 || !(a->time_target >= 0) ||
                a->time_target > 3600)
                PERF_ARG_ERROR("-S needs seconds in [0, 3600], got '%s'", optarg);
            continue;
        }
        default:
            break;
        }
        if (parse_long(optarg, &v) || v < INT32_MIN || v > INT32_MAX)
            PERF_ARG_ERROR("option -%c needs an integer, got '%s'", c, optarg);
        switch (c) {
        case 't':
        case 'g':
            if (v != 1 && !(be->caps & PERF_BE_DEVICE))
                PERF_ARG_ERROR("-%c %ld: %s runs one rank per process (threads and GPUs per "
                               "process must be 1)", c, v, be->name);
            if (c == 't' && (v < 1 || v > PERF_MAX_THREADS))
                PERF_ARG_ERROR("-t must be in [1, %d], got %ld", PERF_MAX_THREADS, v);
            if (c == 'g' && (v < 1 || v > 1024))
                PERF_ARG_ERROR("-g must be in [1, 1024], got %ld", v);
            if (c == 't')
                a->nthreads = (int)v;
            else
                a->ngpus = (int)v;
            break;
        case 'H':
            a->host_buffers = v != 0;
            break;
        case 'f':
            if (v < 1)
                PERF_ARG_ERROR("-f must be >= 1, got %ld", v);
            a->step_factor = v;
            break;
        case 'n':
            if (v < 1)
                PERF_ARG_ERROR("-n must be >= 1, got %ld", v);
            a->iters = (int)v;
            break;
        case 'm':
            if (v < 1)
                PERF_ARG_ERROR("-m must be >= 1, got %ld", v);
            a->agg = (int)v;
            break;
        case 'w':
            if (v < 0)
                PERF_ARG_ERROR("-w must be >= 0, got %ld", v);
            a->warmup = (int)v;
            break;
        case 'k':
            if (v < 1 || v > 64)
                PERF_ARG_ERROR("-k must be in [1, 64], got %ld", v);
            a->repeats = (int)v;
            break;
        case 'N':
            if (v < 0)
                PERF_ARG_ERROR("-N must be >= 0, got %ld", v);
            a->cycles = (int)v;
            break;
        case 'p':
            a->parallel_init = (int)v;
            break;
        case 'c':
            if (v < 0)
                PERF_ARG_ERROR("-c must be >= 0, got %ld", v);
            a->check = (int)v;
            break;
        case 'r':
            if (v < -1)
                PERF_ARG_ERROR("-r must be a rank or -1 (all roots), got %ld", v);
            a->root = (int)v;
            break;
        case 'z':
            if (v < 0 || v > 3)
                PERF_ARG_ERROR("-z must be 0, 1, 2 or 3, got %ld", v);
            a->blocking = (int)v;
            break;
        case 'y':
            a->stream_null = (int)v;
            break;
        case 'T':
            if (v < 0)
                PERF_ARG_ERROR("-T must be >= 0, got %ld", v);
            a->timeout_s = (int)v;
            break;
        case 'C':
            a->report_cputime = v != 0;
            break;
        case 'a':
            if (v < 0 || v > 3)
                PERF_ARG_ERROR("-a must be 0 (rank 0), 1 (avg), 2 (min) or 3 (max), got %ld", v);
            a->average = (int)v;
            break;
        case 'u':
            if (v < 0 || v > 4096)
                PERF_ARG_ERROR("-u must be in [0, 4096] elements, got %ld", v);
            a->unalign = (int)v;
            break;
        case 'x':
            break; /* CTA policy: no meaning on host memory */
        case 'G':
            if (v < 0)
                PERF_ARG_ERROR("-G must be >= 0, got %ld", v);
            if (v != 0 && !(be->caps & PERF_BE_DEVICE))
                PERF_ARG_ERROR("-G %ld: CUDA graphs need device buffers, which %s does not use",
                               v, be->name);
            a->graph_launches = (int)v;
            break;
        case 'R':
            if (v != 0 && v != 1)
                PERF_ARG_ERROR("-R %ld: only -R 0 and -R 1 (local registration) are supported",
                               v);
            if (v == 1 && be->reg_alloc == NULL)
                PERF_ARG_ERROR("-R 1: %s has no buffer registration in the perf tools",
                               be->name);
            a->local_register = (int)v;
            break;
        case 'D':
            if (v != 0)
                PERF_ARG_ERROR("-D %ld: device-API kernels are not supported by the perf tools",
                               v);
            break;
        default:
            PERF_ARG_ERROR("unexpected option -%c", c);
        }
    }
    if (optind < argc)
        PERF_ARG_ERROR("unexpected argument '%s' (see -h)", argv[optind]);
    /* A capture cannot hold the synchronisations -z asks for after each iteration. */
    if (a->graph_launches > 0 && a->blocking != 0)
        PERF_ARG_ERROR("-G %d cannot be combined with -z %d", a->graph_launches, a->blocking);
    if (a->min_bytes > a->max_bytes)
        PERF_ARG_ERROR("invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu", a->min_bytes,
                       a->max_bytes);
    if (a->step_factor <= 1 && a->step_bytes == 0 && a->min_bytes < a->max_bytes)
        PERF_ARG_ERROR("-i 0 with -f 1 would never reach maxbytes");

    /* "all" takes what the backend can run; a type or op named alone must be supported. */
    if (strcmp(type_arg, "all") == 0) {
        for (int i = 0; i < ncclNumTypes; i++)
            if (be->supports(&perf_types[i], PERF_OP_NONE))
                a->types[a->ntypes++] = &perf_types[i];
    } else {
        const struct perf_type *t = perf_type_by_name(type_arg);
        if (t == NULL)
            PERF_ARG_ERROR("invalid type '%s' (int8 uint8 int32 uint32 int64 uint64 half float "
                           "double bfloat16 f8e4m3 f8e5m2 all)", type_arg);
        if (!be->supports(t, PERF_OP_NONE))
            PERF_ARG_ERROR("type '%s' is not supported by %s", type_arg, be->name);
        a->types[a->ntypes++] = t;
    }
    if (strcmp(op_arg, "all") == 0) {
        for (int i = 0; i < PERF_OP_COUNT; i++)
            if (be->supports(NULL, i))
                a->ops[a->nops++] = i;
    } else {
        int found = -1;
        for (int i = 0; i < PERF_OP_COUNT; i++)
            if (strcmp(op_arg, perf_op_names[i]) == 0)
                found = i;
        if (found < 0)
            PERF_ARG_ERROR("invalid op '%s' (sum prod max min avg mulsum all)", op_arg);
        if (!be->supports(NULL, found))
            PERF_ARG_ERROR("op '%s' is not supported by %s", op_arg, be->name);
        a->ops[a->nops++] = found;
    }
    return 0;
}
