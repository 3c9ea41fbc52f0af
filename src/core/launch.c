/*
 * weftLaunchInfo: rank, size, local rank and unique id from the launcher's environment. The
 * contract (families, priority, errors) is documented in include/weft.h.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "weft.h"

#include "api/export.h"
#include "core/hexid.h"
#include "core/log.h"

struct launch_family {
    const char *name; /* for messages */
    const char *rank;
    const char *size;
    const char *local_rank; /* optional in the environment */
};

/* Priority order: the first family whose rank variable is set wins. */
static const struct launch_family launch_families[] = {
    {"weftrun", "WEFT_RANK", "WEFT_NRANKS", "WEFT_LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

/* Strict decimal int: optional sign, digits, nothing else. */
static ncclResult_t launch_parse_int(const char *var, const char *text, int *value_p)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
        WEFT_WARN("%s is '%s', expected a decimal integer", var, text);
        return ncclInvalidArgument;
    }
    *value_p = (int)v;
    return ncclSuccess;
}

WEFT_EXPORT ncclResult_t weftLaunchInfo(int *rank, int *nranks, int *localRank, ncclUniqueId *id)
{
    const struct launch_family *fam = NULL;
    int my_rank = 0, my_nranks = 1, my_local = 0;
    ncclUniqueId my_id;
    const char *text, *hex;
    ncclResult_t res;

    for (size_t i = 0; i < sizeof(launch_families) / sizeof(launch_families[0]); i++) {
        if (getenv(launch_families[i].rank) != NULL) {
            fam = &launch_families[i];
            break;
        }
    }

    if (fam != NULL) {
        res = launch_parse_int(fam->rank, getenv(fam->rank), &my_rank);
        if (res != ncclSuccess)
            return res;
        text = getenv(fam->size);
        if (text == NULL) {
            WEFT_WARN("%s is set but %s is not (%s launch)", fam->rank, fam->size, fam->name);
            return ncclInvalidArgument;
        }
        res = launch_parse_int(fam->size, text, &my_nranks);
        if (res != ncclSuccess)
            return res;
        if (my_nranks < 1) {
            WEFT_WARN("%s is %d, expected at least 1", fam->size, my_nranks);
            return ncclInvalidArgument;
        }
        if (my_rank < 0 || my_rank >= my_nranks) {
            WEFT_WARN("%s is %d, outside [0, %d) given by %s", fam->rank, my_rank, my_nranks,
                      fam->size);
            return ncclInvalidArgument;
        }
        my_local = my_rank;
        text = getenv(fam->local_rank);
        if (text != NULL) {
            res = launch_parse_int(fam->local_rank, text, &my_local);
            if (res != ncclSuccess)
                return res;
            if (my_local < 0 || my_local >= my_nranks) {
                WEFT_WARN("%s is %d, outside [0, %d) given by %s", fam->local_rank, my_local,
                          my_nranks, fam->size);
                return ncclInvalidArgument;
            }
        }
    }

    hex = getenv("WEFT_UNIQUE_ID");
    if (hex != NULL) {
        res = weft_hexid_decode("WEFT_UNIQUE_ID", hex, &my_id);
        if (res != ncclSuccess)
            return res;
    } else if (id != NULL && my_nranks > 1) {
        WEFT_WARN("no unique id in the environment: launch with weftrun (mpirun/srun/torchrun "
                  "rendezvous is not supported yet)");
        return ncclInvalidUsage;
    } else if (id != NULL) {
        res = pncclGetUniqueId(&my_id);
        if (res != ncclSuccess) {
            WEFT_INFO(WEFT_LOG_INIT, "%s:%d -> %d", __FILE__, __LINE__, res);
            return res;
        }
    }

    WEFT_INFO(WEFT_LOG_INIT, "launch info from %s: rank %d nranks %d local rank %d, id %s",
              fam != NULL ? fam->name : "defaults", my_rank, my_nranks, my_local,
              hex != NULL ? "from WEFT_UNIQUE_ID" : (id != NULL ? "made here" : "not requested"));

    if (rank != NULL)
        *rank = my_rank;
    if (nranks != NULL)
        *nranks = my_nranks;
    if (localRank != NULL)
        *localRank = my_local;
    if (id != NULL)
        *id = my_id;
    return ncclSuccess;
}
