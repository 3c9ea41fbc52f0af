/*
 * What communicator init says about the CUDA preconditions (weft_cuda_report): NPROC processes
 * (one rank each, forked here) init one communicator and destroy it, their log lines (NCCL_DEBUG,
 * to stdout) collected in one file; every '|'-separated string of WEFT_TEST_WANT must appear in
 * it, none of WEFT_TEST_NOT. The emulated GPU's knobs (WEFT_EMU_DRIVER, WEFT_EMU_COMPUTE_MODE,
 * WEFT_EMU_MIG) set what there is to report.
 *
 * Usage: test_facts NPROC
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../common/id_pipe.h"
#include "nccl.h"

static int rank_main(int rank, int n, ncclUniqueId id)
{
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclCommInitRank failed: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    return ncclCommDestroy(comm) == ncclSuccess ? 0 : 1;
}

/* 1 when every '|'-separated piece of list is (want) or is not (!want) in text. */
static int check_list(const char *text, const char *list, int want)
{
    int ok = 1;
    char *copy = strdup(list != NULL ? list : ""), *save = NULL;
    for (char *s = strtok_r(copy, "|", &save); s != NULL; s = strtok_r(NULL, "|", &save)) {
        if ((strstr(text, s) != NULL) != want) {
            fprintf(stderr, "FAIL: the log %s \"%s\"\n", want ? "lacks" : "holds", s);
            ok = 0;
        }
    }
    free(copy);
    return ok;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    if (n < 1 || n > 8) {
        fprintf(stderr, "usage: %s NPROC (1..8)\n", argv[0]);
        return 2;
    }
    char path[] = "/tmp/weft-facts-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    unlink(path);
    struct weft_test_id_pipe ip;
    if (weft_test_id_pipe_open(&ip) != 0)
        return 1;
    fflush(NULL);
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(60);
            /* One file for every process's lines, appended (O_APPEND: whole lines). */
            char self[64];
            snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
            int app = open(self, O_WRONLY | O_APPEND);
            if (app < 0 || dup2(app, 1) < 0 || dup2(app, 2) < 0)
                _exit(4);
            ncclUniqueId id;
            _exit(weft_test_id_pipe_recv(&ip, &id) != 0 ? 3 : rank_main(r, n, id));
        }
    }
    ncclUniqueId id;
    int bad = weft_test_id_pipe_send(&ip, n, &id) != 0;
    for (int r = 0; r < n; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "FAIL: rank %d ended with status 0x%x\n", r, status);
            bad = 1;
        }
    }
    off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)size + 1);
    if (text == NULL || pread(fd, text, (size_t)size, 0) != size) {
        fprintf(stderr, "FAIL: cannot read the log back\n");
        return 1;
    }
    close(fd);
    int ok = !bad && check_list(text, getenv("WEFT_TEST_WANT"), 1) &&
             check_list(text, getenv("WEFT_TEST_NOT"), 0);
    if (!ok)
        fprintf(stderr, "---- the log ----\n%s---- end ----\n", text);
    printf("facts: %s (%d processes)\n", ok ? "ok" : "FAIL", n);
    free(text);
    return ok ? 0 : 1;
}
