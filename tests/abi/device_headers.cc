/*
 * A C++ program of the kind the NCCL 2.28 device API serves: it includes <nccl.h> (Weft's, first
 * on the include path) and then <nccl_device.h> (NVIDIA's, from the CUDA toolkit). Building it
 * is half the test: Weft's nccl.h must declare exactly what NVIDIA's does, so the device headers'
 * own types (struct ncclTeam, ncclDevComm...) are not defined twice. Run on Weft's library, the
 * host functions of the device API fail cleanly until Weft's GPU path serves them:
 * ncclInvalidUsage with a message, a zeroed team, and the rest of the library still works.
 * Compiled by g++ and, where the toolkit has it, by nvcc (device_headers.cu is this file).
 */
#include <nccl.h>
#include <nccl_device.h>

#include <stdio.h>
#include <string.h>

#ifndef WEFT_NCCL_HEADER
#error "device_headers must include Weft's nccl.h"
#endif

static int failures = 0;

static void expect(int cond, const char *what)
{
    if (!cond) {
        printf("FAIL: %s\n", what);
        failures++;
    }
}

int main()
{
    int version = 0;
    expect(ncclGetVersion(&version) == ncclSuccess && version == NCCL_VERSION_CODE,
           "ncclGetVersion returns the header's version code");

    ncclDevComm_t *dev_comm = NULL; /* only a pointer: the struct is the device headers' */
    expect(ncclDevCommCreate(NULL, NULL, dev_comm) == ncclInvalidUsage,
           "ncclDevCommCreate fails with ncclInvalidUsage");
    const char *msg = ncclGetLastError(NULL);
    expect(msg != NULL && strstr(msg, "device API") != NULL,
           "ncclGetLastError explains that the device API is not supported");

    ncclTeam_t team = ncclTeamWorld((ncclComm_t)NULL);
    expect(team.nRanks == 0 && team.rank == 0 && team.stride == 0,
           "ncclTeamWorld returns a zeroed team");
    expect(ncclTeamRankToWorld((ncclComm_t)NULL, team, 0) == 0, "ncclTeamRankToWorld returns 0");
    expect(ncclLLA2ACalcSlots(16, 4) == 0, "ncclLLA2ACalcSlots returns 0");

    /* The host API beside it still works: a one-rank communicator all-reduces host memory. */
    ncclComm_t comm = NULL;
    int dev = 0;
    float in[3] = {1.0f, 2.0f, 3.0f}, out[3] = {0, 0, 0};
    expect(ncclCommInitAll(&comm, 1, &dev) == ncclSuccess, "ncclCommInitAll of one rank");
    if (comm != NULL) {
        expect(ncclAllReduce(in, out, 3, ncclFloat, ncclSum, comm, NULL) == ncclSuccess,
               "ncclAllReduce on host memory");
        expect(out[0] == 1.0f && out[1] == 2.0f && out[2] == 3.0f, "all-reduce of one rank");
        expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
    }
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
