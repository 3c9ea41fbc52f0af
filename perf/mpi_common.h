/*
 * The MPI peers of the *_perf tools (mpi_<collective>_perf): the same driver, data, validation and
 * output (common.h), with the communication done by MPI on MPI_COMM_WORLD.
 *
 *   mpirun -np 4 ./mpi_all_gather_perf -b 8 -e 64M -f 2 [-J out.jsonl]
 *
 * A peer tool is one small file: the MPI call for its collective and
 *
 *     int main(int argc, char **argv) { return perf_mpi_main(argc, argv, &perf_coll_x, run); }
 *
 * Built with the driver (common.c, data.c, args.c, report.c) under -DPERF_NO_NCCL (meson when
 * an MPI dependency is found, or build-mpi-tools.sh with any mpicc wrapper). MPI has no avg,
 * PreMulSum, half, bfloat16 or fp8: naming one with -o/-d is a usage error (exit 2), and "all"
 * leaves them out. In place is MPI_IN_PLACE where MPI has it. MPI errors return
 * (MPI_ERRORS_RETURN) and are reported with MPI's text in nccl-tests' failure line ("Test MPI
 * failure ...").
 */
#ifndef WEFT_PERF_MPI_COMMON_H
#define WEFT_PERF_MPI_COMMON_H

#ifndef PERF_NO_NCCL
#define PERF_NO_NCCL 1
#endif

#include <mpi.h>

#include "common.h"

extern const struct perf_backend perf_mpi_backend;

/* perf_run over perf_mpi_backend. */
int perf_mpi_main(int argc, char **argv, const struct perf_coll *coll, perf_run_fn run);

/* MPI's datatype for an NCCL one; MPI_DATATYPE_NULL where MPI has none. */
MPI_Datatype perf_mpi_type(ncclDataType_t type);
/* MPI's op for PERF_OP_SUM/PROD/MAX/MIN; MPI_OP_NULL otherwise. */
MPI_Op perf_mpi_op(int op);

/* ncclSuccess for MPI_SUCCESS; else keeps "what: <MPI's text>" as the last error and returns
 * ncclSystemError. */
ncclResult_t perf_mpi_check(int rc, const char *what);

/* *n_p = count when it fits MPI's int; else sets the last error and returns ncclInvalidArgument. */
ncclResult_t perf_mpi_count(size_t count, int *n_p);

#endif
