/*
 * Another user of the host cannot fail a job's init by taking its shared-memory names first
 * (issue 30, item 3). Segments were named /weft-<communicator hash>-<rank>, and the hash is
 * public (every bootstrap challenge carries it): a squatter who created those names first, owned
 * by itself with mode 0600, made every rank of a job that is not root fail with "File exists",
 * since such a rank cannot unlink another user's name in /dev/shm (sticky).
 *
 * Needs root (exit 77, SKIP, otherwise): the squatter runs as nobody, the ranks as another user
 * that is not root either (uid WEFT_TEST_JOB_UID). The squatter takes every name the old scheme
 * gives the job before any rank starts; the ranks must init, all-reduce exactly, and leave the
 * squatter's files as they were.
 *
 *   test_squat N     N ranks (2..8) over shared memory
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl.h"

#include "bootstrap/bootstrap.h"
#include "../common/id_pipe.h"

#define COUNT 4099
#define WEFT_TEST_JOB_UID 4242

static void old_name(char *buf, size_t len, uint64_t hash, int rank)
{
    snprintf(buf, len, "/weft-%016llx-%d", (unsigned long long)hash, rank);
}

static int become(uid_t uid, gid_t gid)
{
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
        perror("dropping privileges");
        return -1;
    }
    prctl(PR_SET_DUMPABLE, 1); /* as a job started by that user would be */
    return 0;
}

/* As nobody: takes every name the old scheme gives the job's segments. */
static int squat(struct weft_test_id_pipe *ip, uid_t uid, gid_t gid, int n)
{
    ncclUniqueId id;
    char name[64];
    if (weft_test_id_pipe_recv(ip, &id) != 0 || become(uid, gid) != 0)
        return 3;
    uint64_t hash = weft_bootstrap_magic(&id);
    for (int r = 0; r < n; r++) {
        old_name(name, sizeof(name), hash, r);
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            fprintf(stderr, "squatter: shm_open %s: %s\n", name, strerror(errno));
            return 1;
        }
        close(fd);
    }
    return 0;
}

static int rank_main(struct weft_test_id_pipe *ip, int rank, int n, int go_fd)
{
    ncclUniqueId id;
    ncclComm_t comm;
    char go;
    if (weft_test_id_pipe_recv(ip, &id) != 0 || become(WEFT_TEST_JOB_UID, WEFT_TEST_JOB_UID) != 0)
        return 3;
    if (read(go_fd, &go, 1) != 1) /* the squatter is done */
        return 3;
    alarm(30);
    if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
        fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    float *buf = malloc(COUNT * sizeof(float));
    int wrong = 0;
    for (int i = 0; i < COUNT; i++)
        buf[i] = (float)(rank * 1000 + i % 1000);
    if (ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) {
        fprintf(stderr, "rank %d: all-reduce failed: %s\n", rank, ncclGetLastError(comm));
        wrong = 1;
    }
    for (int i = 0; i < COUNT; i++)
        wrong += buf[i] != (float)(1000 * n * (n - 1) / 2 + n * (i % 1000));
    if (wrong != 0)
        fprintf(stderr, "rank %d: %d wrong elements\n", rank, wrong);
    free(buf);
    ncclCommDestroy(comm);
    return wrong != 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    struct weft_test_id_pipe ip; /* fork before the id's thread exists (ThreadSanitizer) */
    int go[2];
    pid_t pids[9];
    ncclUniqueId id;
    char name[64];
    int bad = 0;
    if (n < 2 || n > 8) {
        fprintf(stderr, "usage: test_squat N (2..8)\n");
        return 2;
    }
    if (geteuid() != 0) {
        printf("SKIP: needs root to run the squatter and the job as two other users\n");
        return 77;
    }
    struct passwd *pw = getpwnam("nobody");
    uid_t nobody = pw != NULL ? pw->pw_uid : 65534;
    gid_t nogroup = pw != NULL ? pw->pw_gid : 65534;
    if (weft_test_id_pipe_open(&ip) != 0 || pipe(go) != 0)
        return 1;
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(go[1]);
            _exit(rank_main(&ip, r, n, go[0]));
        }
    }
    pids[n] = fork();
    if (pids[n] == 0)
        _exit(squat(&ip, nobody, nogroup, n));
    close(go[0]);
    bad = weft_test_id_pipe_send(&ip, n + 1, &id) != 0;
    int st;
    if (waitpid(pids[n], &st, 0) != pids[n] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "the squatter failed (status 0x%x)\n", st);
        bad = 1;
    }
    for (int r = 0; r < n; r++) /* the ranks start only now */
        if (write(go[1], "g", 1) != 1)
            bad = 1;
    close(go[1]);
    for (int r = 0; r < n; r++) {
        if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "rank %d failed (status 0x%x)\n", r, st);
            bad = 1;
        }
    }
    /* The squatter's files are untouched (still nobody's), then cleaned up. */
    uint64_t hash = weft_bootstrap_magic(&id);
    for (int r = 0; r < n; r++) {
        struct stat sb;
        char path[96];
        old_name(name, sizeof(name), hash, r);
        snprintf(path, sizeof(path), "/dev/shm%s", name);
        if (stat(path, &sb) != 0 || sb.st_uid != nobody) {
            fprintf(stderr, "the squatter's %s is gone or changed hands\n", path);
            bad = 1;
        }
        shm_unlink(name);
    }
    printf("squat-%d: %s\n", n, bad ? "FAILED" : "ok");
    return bad;
}
