#!/bin/sh
# Builds every MPI peer tool (perf/mpi_*_perf.c) with an MPI compiler wrapper, outside meson, so
# the same tools can be built against several MPI libraries side by side:
#
#   perf/build-mpi-tools.sh mpicc.mpich   build/mpich-perf
#   perf/build-mpi-tools.sh mpicc.openmpi build/openmpi-perf
#
# OUTDIR gets mpi_all_reduce_perf ... mpi_hypercube_perf (run them with that MPI's mpirun). They
# need nothing from Weft but its public header (include/nccl.h, for types). CFLAGS (default
# -O2 -g) and LDFLAGS are honoured. Exit status: 0 when every tool was built, 1 on a compile
# error, 2 on a usage error.
set -eu

usage() {
    echo "usage: $0 MPICC OUTDIR   (e.g. $0 mpicc.mpich build/mpich-perf)" >&2
    exit 2
}
[ $# -eq 2 ] || usage
mpicc=$1
out=$2
if ! command -v "$mpicc" >/dev/null 2>&1; then
    echo "$0: MPI compiler wrapper '$mpicc' not found" >&2
    exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
inc="-I$here -I$here/../include"
flags="-std=gnu11 -D_GNU_SOURCE -DPERF_NO_NCCL ${CFLAGS:--O2 -g}"
mkdir -p "$out"
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT INT TERM

# The driver, the collectives and the MPI backend, compiled once for every tool.
objs=
for src in common data args report colls devmem mpi_common; do
    # shellcheck disable=SC2086 # flags are word lists
    "$mpicc" $flags $inc -c "$here/$src.c" -o "$obj/$src.o" || exit 1
    objs="$objs $obj/$src.o"
done

n=0
for src in "$here"/mpi_*_perf.c; do
    name=$(basename "$src" .c)
    # shellcheck disable=SC2086
    "$mpicc" $flags $inc "$src" $objs ${LDFLAGS:-} -lm -lpthread -ldl -o "$out/$name" || exit 1
    n=$((n + 1))
done
echo "built $n MPI perf tools with $mpicc in $out"
