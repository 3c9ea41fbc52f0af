/*
 * weftLaunchInfo: rank, size, local rank and unique id from the launcher's environment. The
 * contract (families, priority, rendezvous, errors) is documented in include/weft.h; the id
 * exchange itself is core/store.c.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "weft.h"

#include "api/export.h"
#include "bootstrap/socket.h"
#include "core/check.h"
#include "core/hexid.h"
#include "core/log.h"
#include "core/param.h"
#include "core/store.h"

WEFT_PARAM_STR(StoreAddr, "WEFT_STORE_ADDR", NULL,
               "host:port of the launch store that hands rank 0's unique id to the other ranks "
               "under mpirun/mpiexec/srun/torchrun (default: MASTER_ADDR:MASTER_PORT, else a "
               "local socket when all ranks share a host)");
WEFT_PARAM_DECL(BootstrapTimeout);

#define LAUNCH_KEY_LEN 200
#define LAUNCH_PROC_DEPTH 32

struct launch_family;
typedef void (*launch_job_fn_t)(char *key, size_t len);

struct launch_family {
    const char *name; /* for messages */
    const char *tag;  /* job key prefix */
    const char *rank;
    const char *size;
    const char *local_rank; /* optional in the environment */
    const char *local_size; /* optional; NULL: see launch_local_size */
    launch_job_fn_t job_id; /* writes a job identifier, or "" when the launcher gives none */
};

static void launch_job_none(char *key, size_t len);
static void launch_job_ompi(char *key, size_t len);
static void launch_job_pmi(char *key, size_t len);
static void launch_job_slurm(char *key, size_t len);
static void launch_job_torch(char *key, size_t len);

/* Priority order: the first family whose rank variable is set wins. */
static const struct launch_family launch_families[] = {
    {"weftrun", "weftrun", "WEFT_RANK", "WEFT_NRANKS", "WEFT_LOCAL_RANK", "WEFT_LOCAL_SIZE",
     launch_job_none},
    {"Open MPI", "ompi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", launch_job_ompi},
    {"PMI", "pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", launch_job_pmi},
    {"Slurm", "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, launch_job_slurm},
    {"torchrun", "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
     launch_job_torch},
};

/* Exchanges made by this process; part of the store key so rounds never mix. */
static uint32_t launch_seq;

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

/* ---- job identifiers ---- */

static void launch_job_none(char *key, size_t len)
{
    (void)len;
    key[0] = '\0';
}

static void launch_job_ompi(char *key, size_t len)
{
    const char *ns = getenv("PMIX_NAMESPACE"); /* Open MPI 5 (PRRTE), 4 too */
    const char *jobid = getenv("OMPI_MCA_ess_base_jobid"); /* Open MPI 4 (ORTE) */

    snprintf(key, len, "%s", ns != NULL ? ns : (jobid != NULL ? jobid : ""));
}

static void launch_job_slurm(char *key, size_t len)
{
    const char *job = getenv("SLURM_JOB_ID");
    const char *step = getenv("SLURM_STEP_ID");

    if (job == NULL)
        job = getenv("SLURM_JOBID");
    if (step == NULL)
        step = getenv("SLURM_STEPID");
    if (job != NULL)
        snprintf(key, len, "%s.%s", job, step != NULL ? step : "");
    else
        key[0] = '\0';
}

/* Reads comm, ppid and start time (clock ticks since boot) of pid from /proc; 0 on success. */
static int launch_proc_stat(long pid, char *comm, size_t comm_len, long *ppid_p,
                            unsigned long long *start_p)
{
    char path[64], buf[1024], *open_paren, *close_paren, *p;
    FILE *f;
    size_t n;
    int field;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    f = fopen(path, "re");
    if (f == NULL)
        return -1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) state ppid ..."; comm may hold spaces and parentheses: take the last ')'. */
    open_paren = strchr(buf, '(');
    close_paren = strrchr(buf, ')');
    if (open_paren == NULL || close_paren == NULL || close_paren < open_paren)
        return -1;
    snprintf(comm, comm_len, "%.*s", (int)(close_paren - open_paren - 1), open_paren + 1);
    p = close_paren + 2; /* field 3, state */
    for (field = 3; field < 22 && p != NULL; field++) {
        if (field == 4)
            *ppid_p = strtol(p, NULL, 10);
        p = strchr(p, ' ');
        if (p != NULL)
            p++;
    }
    if (p == NULL)
        return -1;
    *start_p = strtoull(p, NULL, 10);
    return 0;
}

/*
 * MPICH's Hydra exports no job identifier (only PMI_RANK, PMI_SIZE, PMI_FD, MPI_LOCALRANKID,
 * MPI_LOCALNRANKS). Every rank on a host descends from the job's one hydra_pmi_proxy (Intel MPI:
 * pmi_proxy) on that host, so the proxy's pid and start time name the job there.
 */
static void launch_job_pmi(char *key, size_t len)
{
    const char *port = getenv("PMI_PORT");
    const char *jobid = getenv("PMI_JOBID");
    long pid = (long)getppid();

    for (int depth = 0; depth < LAUNCH_PROC_DEPTH && pid > 1; depth++) {
        char comm[64];
        unsigned long long start;
        long ppid = 0;

        if (launch_proc_stat(pid, comm, sizeof(comm), &ppid, &start) != 0)
            break;
        if (strcmp(comm, "hydra_pmi_proxy") == 0 || strcmp(comm, "pmi_proxy") == 0) {
            snprintf(key, len, "%s-%ld-%llu", comm, pid, start);
            return;
        }
        pid = ppid;
    }
    if (jobid != NULL)
        snprintf(key, len, "jobid-%s", jobid);
    else if (getenv("SLURM_JOB_ID") != NULL || getenv("SLURM_JOBID") != NULL)
        launch_job_slurm(key, len); /* srun --mpi=pmi2 */
    else if (port != NULL)
        snprintf(key, len, "port-%s", port);
    else
        key[0] = '\0';
}

static void launch_job_torch(char *key, size_t len)
{
    const char *run = getenv("TORCHELASTIC_RUN_ID");
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");

    /* Restarts of an elastic job are new rounds: never take an id from the previous one. */
    if (run != NULL)
        snprintf(key, len, "%s.%s", run, restart != NULL ? restart : "0");
    else
        key[0] = '\0';
}

/* ---- rendezvous address ---- */

/* Ranks on this host: the family's local-size variable; Slurm: all when the step has one node,
 * else -1. 0 when unknown. */
static ncclResult_t launch_local_size(const struct launch_family *fam, int nranks, int *local_p)
{
    const char *text;
    int v = 0;

    if (fam->local_size != NULL) {
        text = getenv(fam->local_size);
        if (text != NULL)
            WEFT_CHECK(launch_parse_int(fam->local_size, text, &v));
    } else {
        text = getenv("SLURM_STEP_NUM_NODES");
        if (text == NULL)
            text = getenv("SLURM_NNODES");
        if (text != NULL) {
            WEFT_CHECK(launch_parse_int("SLURM_STEP_NUM_NODES", text, &v));
            v = v == 1 ? nranks : -1; /* -1: several hosts */
        }
    }
    *local_p = v;
    return ncclSuccess;
}

static int launch_is_true(const char *text)
{
    return text != NULL && (strcmp(text, "1") == 0 || strcasecmp(text, "true") == 0 ||
                            strcasecmp(text, "yes") == 0);
}

/*
 * Picks the store address: WEFT_STORE_ADDR; else MASTER_ADDR:MASTER_PORT (plus one under torchrun's
 * agent store, which holds MASTER_PORT itself); else, with every rank on this host and a job
 * identifier, an abstract Unix socket named after the job key.
 */
static ncclResult_t launch_store_addr(const struct launch_family *fam, int nranks,
                                      const char *job, const char *key,
                                      struct weft_store_addr *addr_p)
{
    const char *explicit_addr = weft_param_StoreAddr();
    const char *master = getenv("MASTER_ADDR"), *port_text = getenv("MASTER_PORT");
    int local_size = 0;

    if (explicit_addr != NULL && explicit_addr[0] != '\0')
        return weft_store_addr_tcp("WEFT_STORE_ADDR", explicit_addr, addr_p);
    if (master != NULL || port_text != NULL) {
        char hostport[256];
        int port;

        if (master == NULL || port_text == NULL) {
            WEFT_WARN("%s is set but %s is not: set both (or WEFT_STORE_ADDR=host:port)",
                      master != NULL ? "MASTER_ADDR" : "MASTER_PORT",
                      master != NULL ? "MASTER_PORT" : "MASTER_ADDR");
            return ncclInvalidUsage;
        }
        WEFT_CHECK(launch_parse_int("MASTER_PORT", port_text, &port));
        if (launch_is_true(getenv("TORCHELASTIC_USE_AGENT_STORE")))
            port++;
        if (port < 1 || port > 65535) {
            WEFT_WARN("MASTER_PORT %s gives store port %d, outside 1..65535", port_text, port);
            return ncclInvalidArgument;
        }
        if (strchr(master, ':') != NULL && master[0] != '[')
            snprintf(hostport, sizeof(hostport), "[%s]:%d", master, port);
        else
            snprintf(hostport, sizeof(hostport), "%s:%d", master, port);
        return weft_store_addr_tcp("MASTER_ADDR:MASTER_PORT", hostport, addr_p);
    }
    WEFT_CHECK(launch_local_size(fam, nranks, &local_size));
    if (local_size == nranks && job[0] != '\0')
        return weft_store_addr_local(key, addr_p);
    if (local_size == nranks)
        WEFT_WARN("%s launch of %d ranks: the launcher exports no job identifier to meet at; set "
                  "WEFT_STORE_ADDR=host:port (rank 0's host and a free port) or "
                  "MASTER_ADDR/MASTER_PORT, or launch with weftrun",
                  fam->name, nranks);
    else
        WEFT_WARN("%s launch of %d ranks%s: no rendezvous address for the unique id; set "
                  "WEFT_STORE_ADDR=host:port (rank 0's host and a free port) or "
                  "MASTER_ADDR/MASTER_PORT in every rank's environment",
                  fam->name, nranks,
                  local_size != 0 ? " across hosts" : " (ranks per host unknown)");
    return ncclInvalidUsage;
}

/* The id of a multi-rank job without WEFT_UNIQUE_ID: rank 0 makes it, the store hands it out. */
static ncclResult_t launch_store_id(const struct launch_family *fam, int rank, int nranks,
                                    ncclUniqueId *id_p, char *desc, size_t desc_len)
{
    struct weft_store_addr addr;
    char job[LAUNCH_KEY_LEN], key[WEFT_STORE_KEY_MAX + 1];
    ncclUniqueId id;
    uint32_t seq;

    fam->job_id(job, sizeof(job));
    snprintf(key, sizeof(key), "%s:%s", fam->tag, job);
    WEFT_CHECK(launch_store_addr(fam, nranks, job, key, &addr));
    memset(&id, 0, sizeof(id));
    if (rank == 0)
        WEFT_CHECK(pncclGetUniqueId(&id));
    seq = __atomic_fetch_add(&launch_seq, 1, __ATOMIC_RELAXED);
    WEFT_CHECK(weft_store_exchange(&addr, key, seq, rank, nranks,
                                   weft_socket_deadline(weft_param_BootstrapTimeout()), &id));
    snprintf(desc, desc_len, "from the launch store at %s", addr.desc);
    *id_p = id;
    return ncclSuccess;
}

WEFT_EXPORT ncclResult_t weftLaunchInfo(int *rank, int *nranks, int *localRank, ncclUniqueId *id)
{
    const struct launch_family *fam = NULL;
    int my_rank = 0, my_nranks = 1, my_local = 0;
    ncclUniqueId my_id;
    char id_desc[WEFT_STORE_DESC_LEN + 32] = "not requested";
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
        snprintf(id_desc, sizeof(id_desc), "from WEFT_UNIQUE_ID");
    } else if (id != NULL && my_nranks > 1) {
        res = launch_store_id(fam, my_rank, my_nranks, &my_id, id_desc, sizeof(id_desc));
        if (res != ncclSuccess) {
            WEFT_INFO(WEFT_LOG_INIT, "%s:%d -> %d", __FILE__, __LINE__, res);
            return res;
        }
    } else if (id != NULL) {
        res = pncclGetUniqueId(&my_id);
        if (res != ncclSuccess) {
            WEFT_INFO(WEFT_LOG_INIT, "%s:%d -> %d", __FILE__, __LINE__, res);
            return res;
        }
        snprintf(id_desc, sizeof(id_desc), "made here");
    }

    WEFT_INFO(WEFT_LOG_INIT, "launch info from %s: rank %d nranks %d local rank %d, id %s",
              fam != NULL ? fam->name : "defaults", my_rank, my_nranks, my_local, id_desc);

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
