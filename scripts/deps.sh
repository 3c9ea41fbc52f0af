#!/usr/bin/env bash
# Installs the Debian packages Weft needs to build and test (idempotent; apt-get only when missing).
# Extra package names given as arguments are installed too.
set -euo pipefail
# Every package the default test suites use, so that none of them skips on a fresh machine:
#   openmpi-bin, mpich       the launch suite runs the perf tools under mpirun and mpiexec
#   libopenmpi-dev           mpi.h and libmpi for the MPI peer tools (perf/mpi_*_perf)
#   iproute2, util-linux     the net suite's namespaces and veth pairs (ip, unshare)
#   g++                      C++ header checks, the emulated GPU's kernels
#   iperf3                   the net benchmarks' TCP ceiling (net-allreduce-vs-iperf3)
pkgs=(meson ninja-build gcc g++ pkg-config binutils python3 openmpi-bin mpich libopenmpi-dev
      iproute2 util-linux iperf3 "$@")
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
