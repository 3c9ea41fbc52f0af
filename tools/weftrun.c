/*
 * weftrun -- start N ranks of a program on this host.
 *
 *   weftrun -n N [--prefix|--no-prefix] [--timeout SEC] [--restarts K] [--] program [args...]
 *
 * weftrun makes the job's unique id with ncclGetUniqueId (which starts the bootstrap root listener
 * inside weftrun; it lives as long as weftrun does) and starts N children with WEFT_RANK,
 * WEFT_NRANKS, WEFT_LOCAL_RANK, WEFT_LOCAL_SIZE and WEFT_UNIQUE_ID in their environment
 * (see weftLaunchInfo in include/weft.h).
 *
 * Schedule of the parent: signals are blocked before anything else (so the bootstrap thread
 * inherits the mask) and read from a signalfd; one poll() loop then serves the signalfd and, in
 * prefix mode, two pipes per rank. A rank's output is cut into lines; complete lines are written to
 * weftrun's stdout or stderr as "[rank] line", one write per batch, so lines from different ranks
 * never mix. Partial lines are held until their newline, or flushed with a newline added at EOF;
 * a line longer than 64 KiB is cut into pieces.
 *
 * Children share one new process group (led by rank 0), so a terminal's Ctrl-C reaches only
 * weftrun, which forwards SIGINT/SIGTERM/SIGHUP to the group; a third such signal kills the ranks
 * with SIGKILL. Children get PR_SET_PDEATHSIG(SIGKILL), so they do not outlive a weftrun that is
 * killed. Their stdin is /dev/null.
 *
 * When a rank exits non-zero or dies by a signal, weftrun reports it, sends SIGTERM to the others
 * and SIGKILL after a 2 s grace period, and exits with that rank's status (128+signal for a
 * signal); with --linger SEC the others first get SEC seconds to notice the failure through the
 * library and exit on their own (fault-tolerance tests need that). --timeout SEC does the same to
 * all ranks after SEC seconds and exits 124. Exit 0 only
 * when every rank exits 0. Usage errors exit 2, a program that cannot be found 127, one that cannot
 * be executed 126, other failures of weftrun itself 1.
 *
 * --restarts K: when a rank fails, once the others are stopped as above, the whole job starts
 * again with a fresh unique id (a new ncclGetUniqueId, so a new bootstrap root), up to K times.
 * Every rank gets WEFT_RESTART=<attempt> (0 for the first run), so a program can resume from its
 * last checkpoint. One line on stderr per restart says why. No restart after --timeout (the limit
 * covers the whole run, restarts included), after a termination signal to weftrun, or when the
 * program cannot be started. The exit status is that of the last attempt.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#include "core/hexid.h"

#define WEFTRUN_MAX_RANKS 4096
#define WEFTRUN_GRACE_S 2.0       /* SIGTERM -> SIGKILL */
#define WEFTRUN_DRAIN_S 2.0       /* output of descendants after the last rank exited */
#define WEFTRUN_MAX_LINE 65536    /* a longer line is cut (and gets a newline) */
#define WEFTRUN_READ_CHUNK 65536

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

extern char **environ;

/* One of a rank's output pipes. */
struct out_stream {
    int fd;   /* read end, -1 once closed */
    int dest; /* STDOUT_FILENO or STDERR_FILENO */
    char *buf;
    size_t len, cap;
};

struct rank_proc {
    pid_t pid;
    int alive; /* started and not reaped yet */
    int status;
    struct out_stream out[2];
};

struct weftrun {
    int nranks;
    int prefix;
    double timeout_s; /* 0: none */
    int restarts;     /* --restarts K */
    double linger_s;  /* --linger SEC */
    int attempt;      /* 0 for the first run, then 1..restarts */
    double deadline;  /* --timeout as an absolute time over all attempts; 0: none */
    char **argv;      /* program and its arguments */
    const char *path; /* resolved program */
    char id_hex[WEFT_HEXID_LEN + 1];
    char secret_hex[65]; /* WEFT_SECRET for the job's ranks; "" when the user set one */
    sigset_t old_mask;
    int sigfd;
    int devnull;
    pid_t pgid;
    struct rank_proc *ranks;
    int nalive;
    int nopen; /* open output pipes */
    int failed_rank; /* first rank that failed, -1 if none */
    int timed_out;
    int aborting;     /* weftrun itself failed: reap quietly */
    int nsignals;     /* termination signals received */
    double kill_at;   /* SIGKILL deadline after SIGTERM; 0: none */
    double term_at;   /* SIGTERM to the others after a failure (--linger); 0: none */
    double drain_at;  /* close pipes deadline once all ranks are gone; 0: none */
    int dest_broken[3];
};

static const char *prog_name = "weftrun";

static void msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n = snprintf(line, sizeof(line), "%s: ", prog_name);

    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    /* One write so that the line does not mix with rank output. */
    if (write(STDERR_FILENO, line, (size_t)n) < 0) {
        /* nothing better to do */
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s -n N [--prefix|--no-prefix] [--timeout SEC] [--restarts K] [--linger SEC]"
            " [--] program "
            "[args...]\n"
            "  -n, -np, --nranks N   number of ranks to start (1..%d)\n"
            "  --prefix              prefix each output line with [rank] (default)\n"
            "  --no-prefix           ranks write straight to weftrun's stdout/stderr\n"
            "  --timeout SEC         kill all ranks and exit 124 after SEC seconds (in all)\n"
            "  --restarts K          when a rank fails, start the whole job again, up to K\n"
            "                        times (WEFT_RESTART=attempt in each rank's environment)\n"
            "  --linger SEC          when a rank fails, give the others SEC seconds to notice\n"
            "                        and exit on their own before SIGTERM (default 0)\n"
            "  -h, --help            this text\n"
            "Ranks run in their own process group with stdin from /dev/null; weftrun forwards\n"
            "SIGINT/SIGTERM/SIGHUP to them (a third one kills them). When a rank fails, the\n"
            "others get SIGTERM, then SIGKILL 2 s later, and weftrun exits with its status.\n"
            "Each rank gets WEFT_RANK, WEFT_NRANKS, WEFT_LOCAL_RANK, WEFT_LOCAL_SIZE and\n"
            "WEFT_UNIQUE_ID in its environment (see weftLaunchInfo in weft.h), and\n"
            "WEFT_RESTART (0 on the first run).\n",
            prog_name, WEFTRUN_MAX_RANKS);
}

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: ", prog_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    usage(stderr);
    exit(2);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_nranks(const char *text)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0)
        usage_error("-n needs a number of ranks, got '%s'", text);
    if (v < 1 || v > WEFTRUN_MAX_RANKS)
        usage_error("-n %ld is out of range (1..%d)", v, WEFTRUN_MAX_RANKS);
    return (int)v;
}

static double parse_timeout(const char *text)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !(v > 0) || v > 1e9)
        usage_error("--timeout needs a positive number of seconds, got '%s'", text);
    return v;
}

static int parse_restarts(const char *text)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || v < 0 || v > 1000000)
        usage_error("--restarts needs a number from 0 to 1000000, got '%s'", text);
    return (int)v;
}

static void parse_args(struct weftrun *w, int argc, char **argv)
{
    int i;

    w->nranks = 0;
    w->prefix = 1;
    w->timeout_s = 0;
    w->restarts = 0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break; /* the program: everything from here on belongs to it */
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--prefix") == 0) {
            w->prefix = 1;
        } else if (strcmp(a, "--no-prefix") == 0) {
            w->prefix = 0;
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "-np") == 0 || strcmp(a, "--np") == 0 ||
                   strcmp(a, "--nranks") == 0) {
            if (i + 1 >= argc)
                usage_error("%s needs a value", a);
            w->nranks = parse_nranks(argv[++i]);
        } else if (strncmp(a, "--nranks=", 9) == 0) {
            w->nranks = parse_nranks(a + 9);
        } else if (strncmp(a, "-n", 2) == 0 && a[2] >= '0' && a[2] <= '9') {
            w->nranks = parse_nranks(a + 2);
        } else if (strcmp(a, "--timeout") == 0) {
            if (i + 1 >= argc)
                usage_error("--timeout needs a value");
            val = argv[++i];
            w->timeout_s = parse_timeout(val);
        } else if (strncmp(a, "--timeout=", 10) == 0) {
            w->timeout_s = parse_timeout(a + 10);
        } else if (strcmp(a, "--linger") == 0) {
            if (i + 1 >= argc)
                usage_error("--linger needs a value");
            w->linger_s = parse_timeout(argv[++i]);
        } else if (strcmp(a, "--restarts") == 0) {
            if (i + 1 >= argc)
                usage_error("--restarts needs a value");
            w->restarts = parse_restarts(argv[++i]);
        } else if (strncmp(a, "--restarts=", 11) == 0) {
            w->restarts = parse_restarts(a + 11);
        } else {
            usage_error("unknown option '%s'", a);
        }
    }
    if (w->nranks == 0)
        usage_error("the number of ranks (-n N) is required");
    if (i >= argc)
        usage_error("no program given");
    w->argv = argv + i;
}

/* PATH search done in the parent, so the child only calls execve. Returns 0 or an errno. */
static int resolve_program(const char *prog, char **path_p)
{
    const char *path_env, *p;
    int err = ENOENT;

    if (strchr(prog, '/') != NULL) {
        struct stat st;
        if (stat(prog, &st) != 0)
            return errno;
        if (S_ISDIR(st.st_mode) || access(prog, X_OK) != 0)
            return EACCES;
        *path_p = strdup(prog);
        return *path_p ? 0 : ENOMEM;
    }
    path_env = getenv("PATH");
    if (path_env == NULL)
        path_env = "/usr/local/bin:/usr/bin:/bin";
    for (p = path_env;;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        size_t need = dlen + 1 + strlen(prog) + 1;
        char *cand = malloc(need);
        struct stat st;

        if (cand == NULL)
            return ENOMEM;
        if (dlen == 0)
            snprintf(cand, need, "%s", prog); /* empty element: the current directory */
        else
            snprintf(cand, need, "%.*s/%s", (int)dlen, p, prog);
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode)) {
            if (access(cand, X_OK) == 0) {
                *path_p = cand;
                return 0;
            }
            err = EACCES;
        }
        free(cand);
        if (colon == NULL)
            break;
        p = colon + 1;
    }
    return err;
}

static int is_our_var(const char *entry)
{
    static const char *const names[] = {"WEFT_RANK=", "WEFT_NRANKS=", "WEFT_LOCAL_RANK=",
                                        "WEFT_LOCAL_SIZE=", "WEFT_UNIQUE_ID=", "WEFT_RESTART="};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strncmp(entry, names[i], strlen(names[i])) == 0)
            return 1;
    return 0;
}

/* The parent's environment without stale WEFT_* launch variables, plus this rank's. */
static char **make_env(const struct weftrun *w, int rank, char vars[7][WEFT_HEXID_LEN + 32])
{
    size_t n = 0, k = 0;
    char **envp;

    while (environ[n] != NULL)
        n++;
    envp = malloc((n + 8) * sizeof(*envp));
    if (envp == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (!is_our_var(environ[i]))
            envp[k++] = environ[i];
    snprintf(vars[0], sizeof(vars[0]), "WEFT_RANK=%d", rank);
    snprintf(vars[1], sizeof(vars[1]), "WEFT_NRANKS=%d", w->nranks);
    snprintf(vars[2], sizeof(vars[2]), "WEFT_LOCAL_RANK=%d", rank);
    snprintf(vars[3], sizeof(vars[3]), "WEFT_LOCAL_SIZE=%d", w->nranks);
    snprintf(vars[4], sizeof(vars[4]), "WEFT_UNIQUE_ID=%s", w->id_hex);
    snprintf(vars[5], sizeof(vars[5]), "WEFT_RESTART=%d", w->attempt);
    for (int i = 0; i < 6; i++)
        envp[k++] = vars[i];
    if (w->secret_hex[0] != '\0') {
        snprintf(vars[6], sizeof(vars[6]), "WEFT_SECRET=%s", w->secret_hex);
        envp[k++] = vars[6];
    }
    envp[k] = NULL;
    return envp;
}

/* Child side of fork: async-signal-safe calls only (the parent has a bootstrap thread). */
static void __attribute__((noreturn))
child_exec(const struct weftrun *w, pid_t parent, pid_t pgid, const int out_fds[2], int errfd,
           char **envp)
{
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    int err;

    setpgid(0, pgid);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1); /* weftrun died before prctl took effect */
    if (dup2(w->devnull, STDIN_FILENO) < 0)
        goto fail;
    if (out_fds != NULL) {
        if (dup2(out_fds[0], STDOUT_FILENO) < 0 || dup2(out_fds[1], STDERR_FILENO) < 0)
            goto fail;
    }
    /* Whatever else is open (signalfd, other ranks' pipes, the bootstrap socket) must not leak
     * into the program. errfd is already close-on-exec. */
    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    sigaction(SIGPIPE, &dfl, NULL);
    sigprocmask(SIG_SETMASK, &w->old_mask, NULL);
    execve(w->path, w->argv, envp);
fail:
    err = errno;
    if (write(errfd, &err, sizeof(err)) < 0) {
        /* the parent sees EOF and a rank that exits 127 */
    }
    _exit(127);
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Sends sig to every rank still running (the group, plus any rank that left the group). */
static void signal_ranks(struct weftrun *w, int sig)
{
    if (w->nalive == 0)
        return;
    if (w->pgid > 0)
        kill(-w->pgid, sig);
    for (int r = 0; r < w->nranks; r++) {
        struct rank_proc *rp = &w->ranks[r];
        if (rp->alive && getpgid(rp->pid) != w->pgid)
            kill(rp->pid, sig);
    }
}

static void terminate_ranks(struct weftrun *w)
{
    if (w->kill_at != 0)
        return;
    signal_ranks(w, SIGTERM);
    w->kill_at = now_s() + WEFTRUN_GRACE_S;
}

static void write_all(struct weftrun *w, int fd, const char *p, size_t n)
{
    if (w->dest_broken[fd])
        return;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                poll(&pfd, 1, -1);
                continue;
            }
            w->dest_broken[fd] = 1; /* EPIPE & co: drop this destination, keep the job going */
            return;
        }
        p += k;
        n -= (size_t)k;
    }
}

/*
 * Emits every complete line held in s (all of them when flush_all) with the rank prefix, as one
 * write. A partial line longer than WEFTRUN_MAX_LINE is emitted as if it were complete.
 */
static void emit_lines(struct weftrun *w, int rank, struct out_stream *s, int flush_all)
{
    char prefix[24];
    int plen = snprintf(prefix, sizeof(prefix), "[%d] ", rank);
    size_t start = 0, out_len = 0, nlines = 0;
    char *out;

    /* Count what goes out first, to size one output buffer. */
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n')
            nlines++;
    if (nlines == 0 && !flush_all && s->len < WEFTRUN_MAX_LINE)
        return;
    out = malloc(s->len + (nlines + 1) * ((size_t)plen + 1));
    if (out == NULL) {
        write_all(w, s->dest, s->buf, s->len); /* degrade: unprefixed */
        s->len = 0;
        return;
    }
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] != '\n')
            continue;
        memcpy(out + out_len, prefix, (size_t)plen);
        out_len += (size_t)plen;
        memcpy(out + out_len, s->buf + start, i + 1 - start);
        out_len += i + 1 - start;
        start = i + 1;
    }
    if (start < s->len && (flush_all || s->len - start >= WEFTRUN_MAX_LINE)) {
        memcpy(out + out_len, prefix, (size_t)plen);
        out_len += (size_t)plen;
        memcpy(out + out_len, s->buf + start, s->len - start);
        out_len += s->len - start;
        out[out_len++] = '\n';
        start = s->len;
    }
    write_all(w, s->dest, out, out_len);
    free(out);
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void close_stream(struct weftrun *w, int rank, struct out_stream *s)
{
    if (s->fd < 0)
        return;
    emit_lines(w, rank, s, 1);
    close(s->fd);
    s->fd = -1;
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
    w->nopen--;
}

/* Reads what is available now (until EAGAIN, at most a few chunks), closing on EOF or error. */
static void drain_stream(struct weftrun *w, int rank, struct out_stream *s)
{
    for (int rounds = 0; s->fd >= 0 && rounds < 16; rounds++) {
        ssize_t k;

        if (s->cap - s->len < WEFTRUN_READ_CHUNK) {
            size_t cap = s->cap ? s->cap * 2 : 2 * WEFTRUN_READ_CHUNK;
            char *b;
            while (cap - s->len < WEFTRUN_READ_CHUNK)
                cap *= 2;
            b = realloc(s->buf, cap);
            if (b == NULL) {
                emit_lines(w, rank, s, 1);
                continue;
            }
            s->buf = b;
            s->cap = cap;
        }
        k = read(s->fd, s->buf + s->len, WEFTRUN_READ_CHUNK);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            return;
        if (k <= 0) {
            close_stream(w, rank, s);
            return;
        }
        s->len += (size_t)k;
        emit_lines(w, rank, s, 0);
    }
}

static void describe_status(int status, char *buf, size_t n)
{
    if (WIFEXITED(status))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)%s", WTERMSIG(status),
                 strsignal(WTERMSIG(status)), WCOREDUMP(status) ? ", core dumped" : "");
    else
        snprintf(buf, n, "ended with wait status 0x%x", status);
}

static void reap_children(struct weftrun *w)
{
    for (;;) {
        int status, r;
        pid_t pid = waitpid(-1, &status, WNOHANG);

        if (pid <= 0)
            return;
        for (r = 0; r < w->nranks; r++)
            if (w->ranks[r].alive && w->ranks[r].pid == pid)
                break;
        if (r == w->nranks)
            continue; /* not ours (cannot happen: weftrun has no other children) */
        w->ranks[r].alive = 0;
        w->ranks[r].status = status;
        w->nalive--;
        /* Print what the rank wrote before it ended ahead of the failure report. */
        for (int k = 0; k < 2; k++)
            drain_stream(w, r, &w->ranks[r].out[k]);
        if ((!WIFEXITED(status) || WEXITSTATUS(status) != 0) && w->failed_rank < 0 &&
            !w->timed_out && !w->aborting) {
            char how[128];
            describe_status(status, how, sizeof(how));
            w->failed_rank = r;
            if (w->nalive > 0) {
                if (w->linger_s > 0) {
                    msg("rank %d (pid %d) %s; the other %d rank%s get %g s to exit", r, (int)pid,
                        how, w->nalive, w->nalive == 1 ? "" : "s", w->linger_s);
                    w->term_at = now_s() + w->linger_s;
                } else {
                    msg("rank %d (pid %d) %s; terminating the other %d rank%s", r, (int)pid, how,
                        w->nalive, w->nalive == 1 ? "" : "s");
                    terminate_ranks(w);
                }
            } else {
                msg("rank %d (pid %d) %s", r, (int)pid, how);
            }
        }
        if (w->nalive == 0)
            w->drain_at = now_s() + WEFTRUN_DRAIN_S;
    }
}

static void handle_signals(struct weftrun *w)
{
    struct signalfd_siginfo si;

    for (;;) {
        ssize_t k = read(w->sigfd, &si, sizeof(si));
        if (k != (ssize_t)sizeof(si))
            return; /* EAGAIN: all read */
        if (si.ssi_signo == SIGCHLD) {
            reap_children(w);
            continue;
        }
        w->nsignals++;
        if (w->nsignals >= 3) {
            if (w->nsignals == 3)
                msg("signal %d (%s) received a third time: killing all ranks", (int)si.ssi_signo,
                    strsignal((int)si.ssi_signo));
            signal_ranks(w, SIGKILL);
        } else {
            signal_ranks(w, (int)si.ssi_signo);
        }
    }
}

/* Starts every rank. Returns 0, or the exit code to leave with after cleaning up. */
static int spawn_ranks(struct weftrun *w)
{
    pid_t parent = getpid();

    for (int r = 0; r < w->nranks; r++) {
        struct rank_proc *rp = &w->ranks[r];
        int outp[2][2] = {{-1, -1}, {-1, -1}}, errp[2], child_fds[2], err = 0;
        char vars[7][WEFT_HEXID_LEN + 32];
        char **envp;
        pid_t pid;
        ssize_t k;

        if (w->prefix) {
            for (int s = 0; s < 2; s++) {
                if (pipe2(outp[s], O_CLOEXEC) != 0) {
                    msg("pipe: %s", strerror(errno));
                    return 1;
                }
                child_fds[s] = outp[s][1];
            }
        }
        if (pipe2(errp, O_CLOEXEC) != 0) {
            msg("pipe: %s", strerror(errno));
            return 1;
        }
        envp = make_env(w, r, vars);
        if (envp == NULL) {
            msg("out of memory");
            return 1;
        }
        pid = fork();
        if (pid == 0)
            child_exec(w, parent, w->pgid, w->prefix ? child_fds : NULL, errp[1], envp);
        free(envp);
        close(errp[1]);
        if (w->prefix) {
            close(outp[0][1]);
            close(outp[1][1]);
        }
        if (pid < 0) {
            msg("fork: %s", strerror(errno));
            close(errp[0]);
            if (w->prefix) {
                close(outp[0][0]);
                close(outp[1][0]);
            }
            return 1;
        }
        if (w->pgid == 0)
            w->pgid = pid;
        setpgid(pid, w->pgid); /* also here: no race with the child's own setpgid */
        rp->pid = pid;
        rp->alive = 1;
        w->nalive++;
        if (w->prefix) {
            for (int s = 0; s < 2; s++) {
                rp->out[s].fd = outp[s][0];
                rp->out[s].dest = s == 0 ? STDOUT_FILENO : STDERR_FILENO;
                set_nonblock(rp->out[s].fd);
                w->nopen++;
            }
        }
        /* EOF: execve succeeded. An int: it failed with that errno. */
        do {
            k = read(errp[0], &err, sizeof(err));
        } while (k < 0 && errno == EINTR);
        close(errp[0]);
        if (k == (ssize_t)sizeof(err)) {
            msg("cannot execute '%s' for rank %d: %s", w->path, r, strerror(err));
            return err == ENOENT ? 127 : 126;
        }
    }
    return 0;
}

/* Per-attempt state back to "nothing started" (the ranks of the last attempt are all reaped and
 * their pipes closed when run_loop returns). Signals received and broken destinations carry
 * over. */
static void start_attempt(struct weftrun *w)
{
    memset(w->ranks, 0, (size_t)w->nranks * sizeof(*w->ranks));
    for (int r = 0; r < w->nranks; r++)
        w->ranks[r].out[0].fd = w->ranks[r].out[1].fd = -1;
    w->nalive = 0;
    w->nopen = 0;
    w->failed_rank = -1;
    w->timed_out = 0;
    w->kill_at = 0;
    w->term_at = 0;
    w->drain_at = 0;
    w->pgid = 0;
}

static void raise_fd_limit(int nranks)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)nranks * 2 + 64;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

static int poll_timeout_ms(const struct weftrun *w, double deadline_timeout)
{
    double next = 0, t = now_s();
    double cands[4] = {deadline_timeout, w->kill_at, w->drain_at, w->term_at};
    int ms;

    for (int i = 0; i < 4; i++)
        if (cands[i] != 0 && (next == 0 || cands[i] < next))
            next = cands[i];
    if (next == 0)
        return -1;
    if (next <= t)
        return 0;
    ms = (int)((next - t) * 1000.0) + 1;
    return ms;
}

static int run_loop(struct weftrun *w)
{
    double deadline_timeout = w->deadline;
    struct pollfd *pfds = calloc((size_t)w->nranks * 2 + 1, sizeof(*pfds));
    int *map = calloc((size_t)w->nranks * 2 + 1, sizeof(*map));

    if (pfds == NULL || map == NULL) {
        msg("out of memory");
        signal_ranks(w, SIGKILL);
        free(pfds);
        free(map);
        return 1;
    }
    while (w->nalive > 0 || w->nopen > 0) {
        int n = 0, ready;
        double t;

        pfds[n].fd = w->sigfd;
        pfds[n].events = POLLIN;
        map[n++] = -1;
        for (int r = 0; r < w->nranks; r++) {
            for (int s = 0; s < 2; s++) {
                if (w->ranks[r].out[s].fd < 0)
                    continue;
                pfds[n].fd = w->ranks[r].out[s].fd;
                pfds[n].events = POLLIN;
                map[n++] = r * 2 + s;
            }
        }
        ready = poll(pfds, (nfds_t)n, poll_timeout_ms(w, deadline_timeout));
        if (ready < 0 && errno != EINTR) {
            msg("poll: %s", strerror(errno));
            signal_ranks(w, SIGKILL);
            free(pfds);
            free(map);
            return 1;
        }
        for (int i = 1; ready > 0 && i < n; i++) {
            if (pfds[i].revents == 0)
                continue;
            drain_stream(w, map[i] / 2, &w->ranks[map[i] / 2].out[map[i] % 2]);
        }
        if (ready > 0 && pfds[0].revents != 0)
            handle_signals(w);

        t = now_s();
        if (deadline_timeout != 0 && t >= deadline_timeout && !w->timed_out) {
            w->timed_out = 1;
            deadline_timeout = 0;
            if (w->nalive > 0) {
                msg("timeout after %g s: terminating %d rank%s", w->timeout_s, w->nalive,
                    w->nalive == 1 ? "" : "s");
                terminate_ranks(w);
            }
        }
        if (w->term_at != 0 && t >= w->term_at) {
            w->term_at = 0;
            if (w->nalive > 0) {
                msg("%d rank%s still running %g s after the failure: terminating", w->nalive,
                    w->nalive == 1 ? "" : "s", w->linger_s);
                terminate_ranks(w);
            }
        }
        if (w->kill_at != 0 && t >= w->kill_at) {
            w->kill_at = 0;
            if (w->nalive > 0) {
                msg("%d rank%s still running after %g s: sending SIGKILL", w->nalive,
                    w->nalive == 1 ? "" : "s", WEFTRUN_GRACE_S);
                signal_ranks(w, SIGKILL);
            }
        }
        if (w->drain_at != 0 && t >= w->drain_at) {
            /* Descendants of the ranks still hold the pipes: stop them and their output. */
            w->drain_at = 0;
            msg("all ranks exited but processes they started still hold their output; killing "
                "process group %d", (int)w->pgid);
            kill(-w->pgid, SIGKILL);
            for (int r = 0; r < w->nranks; r++)
                for (int s = 0; s < 2; s++)
                    close_stream(w, r, &w->ranks[r].out[s]);
        }
    }
    free(pfds);
    free(map);
    if (w->timed_out)
        return 124;
    if (w->failed_rank >= 0) {
        int st = w->ranks[w->failed_rank].status;
        if (WIFEXITED(st))
            return WEXITSTATUS(st);
        if (WIFSIGNALED(st))
            return 128 + WTERMSIG(st);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct weftrun w;
    sigset_t mask;
    ncclUniqueId id;
    ncclResult_t res;
    char *path = NULL;
    int err, rc;

    memset(&w, 0, sizeof(w));
    w.failed_rank = -1;
    parse_args(&w, argc, argv);

    /* Before any thread exists (ncclGetUniqueId starts one): they all inherit this mask. */
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, &w.old_mask) != 0) {
        msg("sigprocmask: %s", strerror(errno));
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    w.sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (w.sigfd < 0) {
        msg("signalfd: %s", strerror(errno));
        return 1;
    }
    w.devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (w.devnull < 0) {
        msg("/dev/null: %s", strerror(errno));
        return 1;
    }

    err = resolve_program(w.argv[0], &path);
    if (err != 0) {
        if (err == ENOENT)
            msg("%s: command not found", w.argv[0]);
        else
            msg("%s: %s", w.argv[0], strerror(err));
        return err == ENOENT ? 127 : 126;
    }
    w.path = path;

    raise_fd_limit(w.nranks);
    w.ranks = calloc((size_t)w.nranks, sizeof(*w.ranks));
    if (w.ranks == NULL) {
        msg("out of memory");
        return 1;
    }
    if (w.timeout_s > 0)
        w.deadline = now_s() + w.timeout_s;

    for (w.attempt = 0;; w.attempt++) {
        char how[128];

        /* A fresh id per attempt: the failed attempt's root may still hold state (or be gone
         * with the rank that ran it, under NCCL_COMM_ID), and stale ranks must not join. */
        res = ncclGetUniqueId(&id);
        if (res != ncclSuccess) {
            const char *last = ncclGetLastError(NULL);
            msg("ncclGetUniqueId failed: %s%s%s", ncclGetErrorString(res),
                last && *last ? ": " : "", last ? last : "");
            return 1;
        }
        weft_hexid_encode(&id, w.id_hex);
        /* A job secret of its own (unless the user gave one), so that communicators the ranks
         * make from NCCL_COMM_ID or the launch store are authenticated too (core/auth.h). */
        w.secret_hex[0] = '\0';
        if (getenv("WEFT_SECRET") == NULL) {
            unsigned char raw[32];
            if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
                msg("getrandom failed: %s", strerror(errno));
                return 1;
            }
            for (int i = 0; i < 32; i++)
                snprintf(w.secret_hex + 2 * i, 3, "%02x", raw[i]);
        }
        start_attempt(&w);

        fflush(stdout);
        fflush(stderr);
        rc = spawn_ranks(&w);
        if (rc != 0) {
            /* Some ranks may be running: stop them and still collect their output. */
            w.aborting = 1;
            signal_ranks(&w, SIGKILL);
            run_loop(&w);
            return rc;
        }
        rc = run_loop(&w);
        if (rc == 0 || w.timed_out || w.failed_rank < 0 || w.attempt >= w.restarts)
            break;
        handle_signals(&w); /* a Ctrl-C that came in as the last rank ended */
        if (w.nsignals > 0)
            break; /* being stopped from outside: do not start again */
        describe_status(w.ranks[w.failed_rank].status, how, sizeof(how));
        msg("job failed (rank %d %s), restart %d of %d", w.failed_rank, how, w.attempt + 1,
            w.restarts);
    }
    free(path);
    free(w.ranks);
    return rc;
}
