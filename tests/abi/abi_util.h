/*
 * Helpers the ABI client programs share (abi_client.c, abi_api.c, abi_conform.c): a clock, group
 * ending, PyTorch-style polling of a non-blocking communicator and the check that the loaded
 * libnccl.so.2 is Weft's. Each program keeps its own check() and check_res() (their reporting
 * differs: threads, counters shared between rank processes); include this after nccl.h and after
 * both are declared. Needs <dlfcn.h> (with _GNU_SOURCE), <limits.h>, <stdio.h>, <stdlib.h>,
 * <string.h>, <time.h> and <unistd.h>.
 */
#ifndef WEFT_TESTS_ABI_UTIL_H
#define WEFT_TESTS_ABI_UTIL_H

#ifndef ABI_POLL_TIMEOUT_S
#define ABI_POLL_TIMEOUT_S 60 /* polling a non-blocking communicator */
#endif

#define ABI_UNUSED __attribute__((unused))

static ABI_UNUSED double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Ends a group, keeping the first error: that of a call inside it (res), else the end's. */
static ABI_UNUSED ncclResult_t group_end(ncclResult_t res)
{
    ncclResult_t end = ncclGroupEnd();
    return res != ncclSuccess ? res : end;
}

/* Polls a non-blocking communicator the way PyTorch does (ncclCommGetAsyncError until the state
 * leaves ncclInProgress), with a deadline. Returns the final state, the error of the call, or
 * ncclInProgress after ABI_POLL_TIMEOUT_S. */
static ABI_UNUSED ncclResult_t poll_async(ncclComm_t comm, ncclResult_t call_res)
{
    double deadline = now_s() + ABI_POLL_TIMEOUT_S;
    ncclResult_t state = ncclInProgress;

    if (call_res != ncclSuccess && call_res != ncclInProgress)
        return call_res;
    for (;;) {
        ncclResult_t res = ncclCommGetAsyncError(comm, &state);
        if (res != ncclSuccess)
            return res;
        if (state != ncclInProgress || now_s() > deadline)
            return state;
        usleep(100);
    }
}

/* The libnccl.so.2 this process loaded (found through pncclGetVersion) is the one in
 * WEFT_ABI_EXPECT_DIR, when that is set: the toolkit's own library would pass every test. */
static ABI_UNUSED void check_library_identity(void)
{
    const char *expect = getenv("WEFT_ABI_EXPECT_DIR");
    void *sym = dlsym(RTLD_DEFAULT, "pncclGetVersion");
    char got_dir[PATH_MAX], want_dir[PATH_MAX], path[PATH_MAX];
    Dl_info info;
    char *slash;

    if (sym == NULL || dladdr(sym, &info) == 0 || info.dli_fname == NULL) {
        check(0, "loaded library", "cannot locate pncclGetVersion with dlsym/dladdr");
        return;
    }
    printf("INFO: libnccl loaded from %s\n", info.dli_fname);
    if (expect == NULL || expect[0] == '\0')
        return;
    snprintf(path, sizeof(path), "%s", info.dli_fname);
    slash = strrchr(path, '/');
    if (slash != NULL)
        *slash = '\0';
    else
        snprintf(path, sizeof(path), ".");
    if (realpath(path, got_dir) == NULL || realpath(expect, want_dir) == NULL) {
        check(0, "loaded library is Weft's", "cannot resolve %s or %s", path, expect);
        return;
    }
    check(strcmp(got_dir, want_dir) == 0, "loaded library is Weft's",
          "libnccl.so.2 came from %s, expected %s", got_dir, want_dir);
}

#endif
